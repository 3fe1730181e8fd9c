//! Certificates made at test time for servers started with TLS: a private CA, a server
//! certificate for `localhost` and `127.0.0.1`, a client certificate, and the two wrong
//! ones the refusal tests need (a CA nobody signed with, a server certificate for another
//! host). Made with `rcgen` (ECDSA P-256 keys), written as PEM files.

use std::fs;
use std::path::{Path, PathBuf};

use rcgen::{
    BasicConstraints, CertificateParams, DnType, ExtendedKeyUsagePurpose, IsCa, Issuer, KeyPair,
    KeyUsagePurpose,
};

/// The host the [wrong-host](TlsFiles::wrong_host_cert) server certificate names (and
/// nothing else): a name in the reserved `.invalid` domain.
pub const WRONG_HOST: &str = "db.other-host.invalid";

/// The user name (common name) in the [client certificate](TlsFiles::client_cert): a
/// PostgreSQL `cert` / `clientcert=verify-full` login checks it against the role.
pub const CLIENT_CERT_USER: &str = "leasehold_cert";

/// PEM files for one TLS test setup, all in one directory.
///
/// | file | what |
/// | --- | --- |
/// | `ca.crt` | the private CA that signed the server and client certificates |
/// | `wrong-ca.crt` | another CA, unrelated: a client trusting only it must refuse the server |
/// | `server.crt`, `server.key` | the server's certificate (SAN `localhost`, `127.0.0.1`) and key |
/// | `wrong-host.crt`, `wrong-host.key` | a server certificate from the same CA naming only [`WRONG_HOST`] |
/// | `client.crt`, `client.key` | a client certificate (CN [`CLIENT_CERT_USER`]) and key |
///
/// The key files are mode 0600.
#[derive(Debug, Clone)]
pub struct TlsFiles {
    dir: PathBuf,
}

fn write(dir: &Path, name: &str, pem: &str, mode: u32) {
    use std::os::unix::fs::PermissionsExt;
    let path = dir.join(name);
    fs::write(&path, pem).unwrap_or_else(|e| panic!("cannot write {}: {e}", path.display()));
    fs::set_permissions(&path, fs::Permissions::from_mode(mode))
        .unwrap_or_else(|e| panic!("cannot chmod {}: {e}", path.display()));
}

fn ca(name: &str) -> (CertificateParams, KeyPair, String) {
    let key = KeyPair::generate().expect("generate a CA key");
    let mut params = CertificateParams::new(Vec::<String>::new()).expect("CA parameters");
    params.distinguished_name.push(DnType::CommonName, name);
    params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    params.key_usages = vec![KeyUsagePurpose::KeyCertSign, KeyUsagePurpose::CrlSign];
    let cert = params.self_signed(&key).expect("self-sign the CA");
    (params, key, cert.pem())
}

fn leaf(
    issuer: &Issuer<'_, &KeyPair>,
    names: &[&str],
    common_name: &str,
    usage: ExtendedKeyUsagePurpose,
) -> (String, String) {
    let key = KeyPair::generate().expect("generate a key");
    let names: Vec<String> = names.iter().map(|s| (*s).to_owned()).collect();
    let mut params = CertificateParams::new(names).expect("certificate parameters");
    params
        .distinguished_name
        .push(DnType::CommonName, common_name);
    params.key_usages = vec![
        KeyUsagePurpose::DigitalSignature,
        KeyUsagePurpose::KeyEncipherment,
    ];
    params.extended_key_usages = vec![usage];
    let cert = params.signed_by(&key, issuer).expect("sign a certificate");
    (cert.pem(), key.serialize_pem())
}

impl TlsFiles {
    /// Makes fresh keys and certificates and writes them into `dir` (which must exist).
    ///
    /// # Panics
    ///
    /// Panics if a key cannot be made or a file cannot be written.
    pub fn create(dir: &Path) -> Self {
        let (ca_params, ca_key, ca_pem) = ca("leasehold test CA");
        let (_, _, wrong_ca_pem) = ca("leasehold unrelated test CA");
        let issuer = Issuer::from_params(&ca_params, &ca_key);
        let server = leaf(
            &issuer,
            &["localhost", "127.0.0.1"],
            "localhost",
            ExtendedKeyUsagePurpose::ServerAuth,
        );
        let wrong_host = leaf(
            &issuer,
            &[WRONG_HOST],
            WRONG_HOST,
            ExtendedKeyUsagePurpose::ServerAuth,
        );
        let client = leaf(
            &issuer,
            &[],
            CLIENT_CERT_USER,
            ExtendedKeyUsagePurpose::ClientAuth,
        );
        write(dir, "ca.crt", &ca_pem, 0o644);
        write(dir, "wrong-ca.crt", &wrong_ca_pem, 0o644);
        write(dir, "server.crt", &server.0, 0o644);
        write(dir, "server.key", &server.1, 0o600);
        write(dir, "wrong-host.crt", &wrong_host.0, 0o644);
        write(dir, "wrong-host.key", &wrong_host.1, 0o600);
        write(dir, "client.crt", &client.0, 0o644);
        write(dir, "client.key", &client.1, 0o600);
        Self {
            dir: dir.to_path_buf(),
        }
    }

    /// The directory holding the files.
    pub fn dir(&self) -> &Path {
        &self.dir
    }
    /// `ca.crt`: the CA that signed the server and client certificates.
    pub fn ca_cert(&self) -> PathBuf {
        self.dir.join("ca.crt")
    }
    /// `wrong-ca.crt`: a CA that signed nothing here.
    pub fn wrong_ca_cert(&self) -> PathBuf {
        self.dir.join("wrong-ca.crt")
    }
    /// `server.crt`: for `localhost` and `127.0.0.1`.
    pub fn server_cert(&self) -> PathBuf {
        self.dir.join("server.crt")
    }
    /// `server.key`.
    pub fn server_key(&self) -> PathBuf {
        self.dir.join("server.key")
    }
    /// `wrong-host.crt`: signed by the CA, naming only [`WRONG_HOST`].
    pub fn wrong_host_cert(&self) -> PathBuf {
        self.dir.join("wrong-host.crt")
    }
    /// `wrong-host.key`.
    pub fn wrong_host_key(&self) -> PathBuf {
        self.dir.join("wrong-host.key")
    }
    /// `client.crt`: CN [`CLIENT_CERT_USER`].
    pub fn client_cert(&self) -> PathBuf {
        self.dir.join("client.crt")
    }
    /// `client.key`.
    pub fn client_key(&self) -> PathBuf {
        self.dir.join("client.key")
    }
}

/// Which certificate a TLS server presents.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum ServerCert {
    /// `server.crt`: names `localhost` and `127.0.0.1`.
    #[default]
    Localhost,
    /// `wrong-host.crt`: names only [`WRONG_HOST`].
    WrongHost,
}

impl ServerCert {
    /// The certificate and key files of this choice.
    pub fn files(self, tls: &TlsFiles) -> (PathBuf, PathBuf) {
        match self {
            Self::Localhost => (tls.server_cert(), tls.server_key()),
            Self::WrongHost => (tls.wrong_host_cert(), tls.wrong_host_key()),
        }
    }
}
