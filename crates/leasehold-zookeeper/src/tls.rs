//! TLS for the ZooKeeper store: the client's TLS options made from the PEM files the URL
//! names, and its handshake failures as the core's [`TlsFailure`] (one type for every
//! store, with the ZooKeeper URL's parameters as the hint).
//!
//! `zookeeper-client` reports a failed handshake only as a lost connection (it logs the
//! cause at debug level and tries the next server). When no TLS session can be
//! established, the store handshakes once itself with each server, with the same CA and
//! client certificate, to tell the caller why: an untrusted certificate, one for another
//! host, or a refusal by the server.

use std::fmt;
use std::io::Read;
use std::net::{TcpStream, ToSocketAddrs};
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use base64::Engine;
use leasehold_core::{StoreError, StoreErrorKind};
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName};
use rustls::{ClientConfig, ClientConnection, RootCertStore};
use zookeeper_client as zk;

use crate::config::TlsSettings;
use crate::error::err;

pub use leasehold_core::tls::{TlsFailure, TlsProblem};

/// The error for `e`, the failure of a first connection: when the URL is plaintext and
/// the failure is an unreachable server, a host of the URL that speaks only TLS makes it a
/// [`TlsProblem::PlaintextRefused`] error (`tls=true`); otherwise `e` itself. Asked within
/// the connect timeout, at most a second.
pub(crate) async fn plaintext_refused(config: &crate::ZkConfig, e: StoreError) -> StoreError {
    leasehold_core::tls_session::plaintext_refused_tls_param(
        crate::BACKEND,
        e,
        config.uses_tls(),
        config.hosts(),
        config.connect_bound(),
    )
    .await
}

/// The ZooKeeper URL parameters that fix `problem`.
fn hint(problem: TlsProblem) -> &'static str {
    leasehold_core::tls_session::tls_param_hint(
        problem,
        "does the server require a client certificate, cert= and key=, signed by a CA it trusts?",
    )
}

/// A failure of `problem` with the ZooKeeper URL's hint.
fn failure(problem: TlsProblem, host: Option<&str>, detail: impl Into<String>) -> TlsFailure {
    TlsFailure::new(problem, host, detail).with_hint(hint(problem))
}

/// The rustls error among the sources of `e`, typed, for a handshake with `host`; `None`
/// when there is none.
fn find(e: &(dyn std::error::Error + 'static), host: &str) -> Option<TlsFailure> {
    let found = TlsFailure::find_rustls(e)?.or_host(host);
    let problem = found.problem();
    Some(found.with_hint(hint(problem)))
}

/// The `Config` error `failure` makes of `what` (`connect failed`), with it as the source
/// (which the error's text ends with).
pub(crate) fn into_error(failure: TlsFailure, what: &str) -> StoreError {
    err(StoreErrorKind::Config, format!("zookeeper {what}")).with_source(failure)
}

/// A `Config` error for a TLS file, with its [`TlsFailure`] as the source.
fn file_error(what: &str, path: &Path, problem: &str) -> StoreError {
    into_error(
        failure(
            TlsProblem::Files,
            None,
            format!("the {what} {} {problem}", path.display()),
        ),
        "TLS settings",
    )
}

fn read(what: &str, path: &Path) -> Result<String, StoreError> {
    let bytes = std::fs::read(path)
        .map_err(|e| file_error(what, path, &format!("cannot be read ({e})")))?;
    String::from_utf8(bytes).map_err(|_| file_error(what, path, "is not PEM text"))
}

fn pem_certs(
    what: &str,
    path: &Path,
    pem: &str,
) -> Result<Vec<CertificateDer<'static>>, StoreError> {
    match CertificateDer::pem_slice_iter(pem.as_bytes()).collect::<Result<Vec<_>, _>>() {
        Ok(certs) if !certs.is_empty() => Ok(certs),
        _ => Err(file_error(what, path, "holds no PEM certificate")),
    }
}

/// The CA and client certificate of a TLS connection, read and checked.
pub(crate) struct Material {
    /// The CA certificates as PEM, for `zookeeper-client`.
    ca_pem: String,
    /// The client certificate and key as PEM, for `zookeeper-client`.
    identity: Option<(String, String)>,
    /// The same, for the store's own diagnostic handshake.
    probe: Arc<ClientConfig>,
}

impl fmt::Debug for Material {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Material").finish_non_exhaustive()
    }
}

/// Makes ring rustls's process-wide provider unless one is installed: `zookeeper-client`
/// builds its TLS configuration with the process default, and the crate features of the
/// rustls in this build (`zookeeper-client` turns on aws-lc-rs, the other stores ring)
/// name no single one.
fn install_provider() {
    let _ = rustls::crypto::ring::default_provider().install_default();
}

impl Material {
    /// Reads every file now, so that a wrong file is reported by `connect` as what it is
    /// (the TLS library would report it later, and its parse errors may quote the file).
    /// Without `cacert`, the system's CA store.
    pub(crate) fn load(settings: &TlsSettings) -> Result<Self, StoreError> {
        install_provider();
        let mut roots = RootCertStore::empty();
        let ca_pem = match &settings.ca_file {
            Some(path) => {
                let pem = read("CA file (cacert)", path)?;
                for cert in pem_certs("CA file (cacert)", path, &pem)? {
                    if roots.add(cert).is_err() {
                        return Err(file_error(
                            "CA file (cacert)",
                            path,
                            "holds a certificate that is no CA certificate",
                        ));
                    }
                }
                pem
            }
            None => {
                let native = rustls_native_certs::load_native_certs();
                let mut pem = String::new();
                for cert in native.certs {
                    let b64 = base64::engine::general_purpose::STANDARD.encode(cert.as_ref());
                    pem.push_str("-----BEGIN CERTIFICATE-----\n");
                    for line in b64.as_bytes().chunks(64) {
                        pem.push_str(&String::from_utf8_lossy(line));
                        pem.push('\n');
                    }
                    pem.push_str("-----END CERTIFICATE-----\n");
                    let _ = roots.add(cert);
                }
                if roots.is_empty() {
                    return Err(err(
                        StoreErrorKind::Config,
                        "zookeeper TLS: the system's CA store holds no certificate: name the \
                         CA that signed the servers' certificates with cacert=",
                    ));
                }
                pem
            }
        };
        let builder =
            ClientConfig::builder_with_provider(Arc::new(rustls::crypto::ring::default_provider()))
                .with_safe_default_protocol_versions()
                .map_err(|e| err(StoreErrorKind::Other, format!("zookeeper TLS: {e}")))?
                .with_root_certificates(roots);
        let (identity, probe) = match &settings.client {
            Some((cert_path, key_path)) => {
                let cert = read("client certificate (cert)", cert_path)?;
                let certs = pem_certs("client certificate (cert)", cert_path, &cert)?;
                let key = read("client key (key)", key_path)?;
                // The parser's error is dropped: it may quote the file.
                let Ok(parsed) = PrivateKeyDer::from_pem_slice(key.as_bytes()) else {
                    return Err(file_error(
                        "client key (key)",
                        key_path,
                        "holds no PEM private key",
                    ));
                };
                let Ok(config) = builder.with_client_auth_cert(certs, parsed) else {
                    return Err(file_error(
                        "client key (key)",
                        key_path,
                        "does not match the client certificate (cert), or is of a kind \
                         not supported",
                    ));
                };
                (Some((cert, key)), config)
            }
            None => (None, builder.with_no_client_auth()),
        };
        Ok(Self {
            ca_pem,
            identity,
            probe: Arc::new(probe),
        })
    }

    /// `zookeeper-client`'s TLS options: the CA, the client certificate, host-name
    /// verification on. Its errors are not passed on (they may quote a file).
    pub(crate) fn client_options(&self) -> Result<zk::TlsOptions, StoreError> {
        let refused = |what: &str| {
            err(
                StoreErrorKind::Config,
                format!("zookeeper TLS: the client library refused the {what}"),
            )
        };
        let mut options = zk::TlsOptions::new()
            .with_pem_ca(&self.ca_pem)
            .map_err(|_| refused("CA certificates (cacert)"))?;
        if let Some((cert, key)) = &self.identity {
            options = options
                .with_pem_identity(cert, key)
                .map_err(|_| refused("client certificate and key (cert, key)"))?;
        }
        Ok(options)
    }

    /// Handshakes with each of `hosts` (`host:port`) in turn, each step bounded by
    /// `timeout`, and reads what the server sends first (a TLS 1.3 server refuses a client
    /// certificate after the handshake): the first TLS failure found, if any. Blocking.
    fn probe_blocking(&self, hosts: &[String], timeout: Duration) -> Option<TlsFailure> {
        hosts.iter().find_map(|hostport| {
            let (host, port) = hostport.rsplit_once(':')?;
            let host = host
                .strip_prefix('[')
                .and_then(|h| h.strip_suffix(']'))
                .unwrap_or(host);
            let port: u16 = port.parse().ok()?;
            let name = ServerName::try_from(host.to_owned()).ok()?;
            let addr = (host, port).to_socket_addrs().ok()?.next()?;
            let mut sock = TcpStream::connect_timeout(&addr, timeout).ok()?;
            sock.set_read_timeout(Some(timeout)).ok()?;
            sock.set_write_timeout(Some(timeout)).ok()?;
            let mut conn = ClientConnection::new(self.probe.clone(), name).ok()?;
            while conn.is_handshaking() {
                if let Err(e) = conn.complete_io(&mut sock) {
                    return find(&e, host);
                }
            }
            let mut byte = [0u8; 1];
            // A refusal comes at once; a server that accepted waits for the connect
            // request, so do not wait for it long.
            sock.set_read_timeout(Some(timeout.min(Duration::from_secs(1))))
                .ok()?;
            // Whatever was read is dropped: only a refusal matters here.
            let read = rustls::Stream::new(&mut conn, &mut sock).read(&mut byte);
            read.err().and_then(|e| find(&e, host))
        })
    }

    /// [`probe_blocking`](Self::probe_blocking) on the blocking pool.
    pub(crate) async fn probe(
        self: &Arc<Self>,
        hosts: &[String],
        timeout: Duration,
    ) -> Option<TlsFailure> {
        let me = self.clone();
        let hosts = hosts.to_vec();
        tokio::task::spawn_blocking(move || me.probe_blocking(&hosts, timeout))
            .await
            .ok()
            .flatten()
    }
}

#[cfg(test)]
mod tests {
    use leasehold_testkit::TlsFiles;

    use super::*;

    /// A CA file that is no PEM, a missing file, a key file that is no key: each a `Files`
    /// failure naming the path, never quoting the key.
    #[test]
    fn a_file_that_cannot_be_used_is_named_and_a_key_never_quoted() {
        let dir = std::env::temp_dir().join(format!("leasehold-zk-tls-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let files = TlsFiles::create(&dir);
        let key = dir.join("bad.key");
        std::fs::write(
            &key,
            "-----BEGIN PRIVATE KEY-----\nsentinel-key-bytes\n-----END PRIVATE KEY-----\n",
        )
        .unwrap();
        let not_pem = dir.join("not-pem.crt");
        std::fs::write(&not_pem, "not pem\n").unwrap();
        for (settings, named) in [
            (
                TlsSettings {
                    ca_file: Some(not_pem.clone()),
                    client: None,
                },
                "not-pem.crt",
            ),
            (
                TlsSettings {
                    ca_file: Some(dir.join("none.crt")),
                    client: None,
                },
                "none.crt",
            ),
            (
                TlsSettings {
                    ca_file: Some(files.ca_cert()),
                    client: Some((not_pem.clone(), files.client_key())),
                },
                "not-pem.crt",
            ),
            (
                TlsSettings {
                    ca_file: Some(files.ca_cert()),
                    client: Some((files.client_cert(), key.clone())),
                },
                "bad.key",
            ),
            (
                TlsSettings {
                    ca_file: Some(files.ca_cert()),
                    client: Some((files.client_cert(), files.server_key())),
                },
                "server.key",
            ),
        ] {
            let e = Material::load(&settings).unwrap_err();
            assert_eq!(e.kind(), StoreErrorKind::Config, "{e}");
            let shown = format!("{e} {e:?}");
            assert!(shown.contains(named), "{shown}");
            assert!(!shown.contains("sentinel-key-bytes"), "{shown}");
            let server_key = std::fs::read_to_string(files.server_key()).unwrap();
            for line in server_key.lines().filter(|l| !l.starts_with("-----")) {
                assert!(!shown.contains(line), "the key in: {shown}");
            }
            assert_eq!(
                TlsFailure::of(&e).map(TlsFailure::problem),
                Some(TlsProblem::Files),
                "{e}"
            );
        }
        let good = TlsSettings {
            ca_file: Some(files.ca_cert()),
            client: Some((files.client_cert(), files.client_key())),
        };
        let material = Material::load(&good).unwrap();
        assert!(material.client_options().is_ok());
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
