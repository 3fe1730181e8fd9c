//! TLS for the etcd store: the client's TLS options made from the PEM files the URL
//! names, and [`TlsFailure`], why a TLS connection to a member failed, as a type.

use std::fmt;
use std::path::Path;

use etcd_client::{Certificate, Identity, TlsOptions};
use leasehold_core::{StoreError, StoreErrorKind};
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};

use crate::config::TlsSettings;
use crate::error::err;

/// What went wrong with TLS.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum TlsProblem {
    /// The member's certificate is not signed by a CA the client trusts (or is expired,
    /// or otherwise invalid): name the CA that signed it with `cacert`.
    UntrustedCertificate,
    /// The member's certificate is valid but does not name the host of the endpoint.
    WrongHost,
    /// A CA, certificate or key file named in the URL cannot be read or holds no PEM of
    /// the right kind.
    Files,
    /// Any other TLS failure: a handshake the member aborted (a client certificate it
    /// requires and did not get, or one it does not trust), a protocol error.
    Other,
}

impl TlsProblem {
    /// A short stable name, for logs and `--json` output.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::UntrustedCertificate => "untrusted_certificate",
            Self::WrongHost => "wrong_host",
            Self::Files => "files",
            Self::Other => "other",
        }
    }
}

/// A TLS failure while connecting to an etcd member: [what](TlsProblem) went wrong, and
/// the host it was for. The store puts it as the [source](std::error::Error::source) of a
/// [`StoreErrorKind::Config`] error (fix the URL, the certificates or the member; retrying
/// cannot help); [`TlsFailure::of`] finds it.
///
/// Its text never holds key material or a password: it is made of the problem, the host,
/// a file's path and, for handshake errors, rustls's description of the certificate error.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TlsFailure {
    problem: TlsProblem,
    host: Option<String>,
    detail: String,
}

impl TlsFailure {
    fn new(problem: TlsProblem, host: Option<&str>, detail: impl Into<String>) -> Self {
        Self {
            problem,
            host: host.map(str::to_owned),
            detail: detail.into(),
        }
    }

    /// What went wrong.
    pub fn problem(&self) -> TlsProblem {
        self.problem
    }

    /// The host the certificate was checked against, when known.
    pub fn host(&self) -> Option<&str> {
        self.host.as_deref()
    }

    /// The TLS failure behind `error`, if one is among its sources.
    pub fn of(error: &StoreError) -> Option<&Self> {
        let mut next: Option<&(dyn std::error::Error + 'static)> = Some(error);
        while let Some(e) = next {
            if let Some(tls) = e.downcast_ref::<Self>() {
                return Some(tls);
            }
            next = e.source();
        }
        None
    }

    /// The rustls error among the sources of `e`, typed; `None` when there is none.
    pub(crate) fn find(e: &(dyn std::error::Error + 'static)) -> Option<Self> {
        let mut next = Some(e);
        while let Some(e) = next {
            if let Some(r) = e.downcast_ref::<rustls::Error>() {
                return Some(from_rustls(r));
            }
            // An `io::Error`'s `source` skips the error it wraps (rustls's, here).
            if let Some(r) = e
                .downcast_ref::<std::io::Error>()
                .and_then(std::io::Error::get_ref)
                .and_then(|inner| inner.downcast_ref::<rustls::Error>())
            {
                return Some(from_rustls(r));
            }
            next = e.source();
        }
        None
    }

    fn advice(&self) -> &'static str {
        match self.problem {
            TlsProblem::UntrustedCertificate => {
                "the etcd member's certificate is not signed by a trusted CA: name the CA \
                 that signed it with cacert="
            }
            TlsProblem::WrongHost => {
                "the etcd member's certificate does not name the host: connect by a name \
                 the certificate holds, or reissue the certificate for this host"
            }
            TlsProblem::Files => "a TLS file named in the etcd URL cannot be used",
            TlsProblem::Other => {
                "the TLS connection to the etcd member failed (does it require a client \
                 certificate, cert= and key=, signed by a CA it trusts?)"
            }
        }
    }
}

fn from_rustls(e: &rustls::Error) -> TlsFailure {
    use rustls::CertificateError as C;
    match e {
        rustls::Error::InvalidCertificate(C::NotValidForNameContext { expected, .. }) => {
            let host = expected.to_str();
            TlsFailure::new(TlsProblem::WrongHost, Some(&host), e.to_string())
        }
        rustls::Error::InvalidCertificate(C::NotValidForName) => {
            TlsFailure::new(TlsProblem::WrongHost, None, e.to_string())
        }
        rustls::Error::InvalidCertificate(_) => {
            TlsFailure::new(TlsProblem::UntrustedCertificate, None, e.to_string())
        }
        _ => TlsFailure::new(TlsProblem::Other, None, e.to_string()),
    }
}

impl fmt::Display for TlsFailure {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("TLS: ")?;
        f.write_str(self.advice())?;
        if let Some(host) = &self.host {
            write!(f, " (host `{host}`)")?;
        }
        if !self.detail.is_empty() {
            write!(f, ": {}", self.detail)?;
        }
        Ok(())
    }
}

impl std::error::Error for TlsFailure {}

/// A `Config` error for a TLS file, with its [`TlsFailure`] as the source.
fn file_error(what: &str, path: &Path, problem: &str) -> StoreError {
    let failure = TlsFailure::new(
        TlsProblem::Files,
        None,
        format!("the {what} {} {problem}", path.display()),
    );
    err(StoreErrorKind::Config, failure.to_string()).with_source(failure)
}

fn read(what: &str, path: &Path) -> Result<Vec<u8>, StoreError> {
    std::fs::read(path).map_err(|e| file_error(what, path, &format!("cannot be read ({e})")))
}

/// The client's TLS options from `settings`, every file read and checked now, so that a
/// wrong file is reported by `connect` as what it is (the TLS library would report it
/// later, and its parse errors may quote a line of the file). The server name checked is
/// each endpoint's host.
pub(crate) fn options(settings: &TlsSettings) -> Result<TlsOptions, StoreError> {
    let mut tls = TlsOptions::new();
    match &settings.ca_file {
        Some(path) => {
            let pem = read("CA file (cacert)", path)?;
            let certs = CertificateDer::pem_slice_iter(&pem).collect::<Result<Vec<_>, _>>();
            if !certs.is_ok_and(|c| !c.is_empty()) {
                return Err(file_error(
                    "CA file (cacert)",
                    path,
                    "holds no PEM certificate",
                ));
            }
            tls = tls.ca_certificate(Certificate::from_pem(pem));
        }
        None => tls = tls.with_native_roots(),
    }
    if let Some((cert_path, key_path)) = &settings.client {
        let cert = read("client certificate (cert)", cert_path)?;
        let certs = CertificateDer::pem_slice_iter(&cert).collect::<Result<Vec<_>, _>>();
        if !certs.is_ok_and(|c| !c.is_empty()) {
            return Err(file_error(
                "client certificate (cert)",
                cert_path,
                "holds no PEM certificate",
            ));
        }
        let key = read("client key (key)", key_path)?;
        // The parser's error is dropped: it may quote the file.
        if PrivateKeyDer::from_pem_slice(&key).is_err() {
            return Err(file_error(
                "client key (key)",
                key_path,
                "holds no PEM private key",
            ));
        }
        tls = tls.identity(Identity::from_pem(cert, key));
    }
    Ok(tls)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_key_file_that_is_not_a_key_is_named_and_never_quoted() {
        let dir = std::env::temp_dir().join(format!("leasehold-etcd-tls-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let key = dir.join("bad.key");
        std::fs::write(
            &key,
            "-----BEGIN PRIVATE KEY-----\nsentinel-key-bytes\n-----END PRIVATE KEY-----\n",
        )
        .unwrap();
        let cert = dir.join("c.crt");
        std::fs::write(&cert, "not pem\n").unwrap();
        let settings = TlsSettings {
            ca_file: None,
            client: Some((cert.clone(), key.clone())),
        };
        let e = options(&settings).unwrap_err();
        assert_eq!(e.kind(), StoreErrorKind::Config);
        assert!(e.to_string().contains("c.crt"), "{e}");
        std::fs::write(&cert, CERT).unwrap();
        let e = options(&settings).unwrap_err();
        let shown = format!("{e} {e:?}");
        assert!(shown.contains("bad.key"), "{shown}");
        assert!(!shown.contains("sentinel-key-bytes"), "{shown}");
        assert_eq!(
            TlsFailure::of(&e).map(TlsFailure::problem),
            Some(TlsProblem::Files)
        );
        let missing = TlsSettings {
            ca_file: Some(dir.join("none.crt")),
            client: None,
        };
        let e = options(&missing).unwrap_err();
        assert!(e.to_string().contains("none.crt"), "{e}");
        std::fs::remove_dir_all(&dir).unwrap();
    }

    /// A certificate (its content does not matter to these checks, only that it is PEM).
    const CERT: &str =
        "-----BEGIN CERTIFICATE-----\nMIIBszCCAVmgAwIBAgIUQ2j0\n-----END CERTIFICATE-----\n";
}
