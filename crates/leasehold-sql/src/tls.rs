//! TLS failures of the PostgreSQL and MariaDB/MySQL stores: sqlx's errors classified as
//! the core's [`TlsFailure`] (the same type every store uses, so that a program and the
//! `leasehold` command tell the cases apart by type), with the SQL stores' URL parameters
//! as the hint.

pub use leasehold_core::tls::{TlsFailure, TlsProblem};

/// Makes ring rustls's process-wide crypto provider unless one is installed already.
///
/// sqlx's rustls verifier takes the process default provider, which rustls picks by itself
/// only when exactly one of its `ring` and `aws-lc-rs` features is on. Another crate of
/// the program (the ZooKeeper client, reqwest's defaults) turning on `aws-lc-rs` beside
/// the `ring` sqlx asks for would make every TLS connection panic; the stores call this
/// before they connect. An application that installed its own provider keeps it.
pub fn install_provider() {
    let _ = rustls::crypto::ring::default_provider().install_default();
}

/// The URL parameters that fix `problem` on the SQL stores.
fn hint(problem: TlsProblem) -> &'static str {
    match problem {
        TlsProblem::PlaintextRefused => {
            "PostgreSQL sslmode=verify-full, MariaDB/MySQL ssl-mode=VERIFY_IDENTITY"
        }
        TlsProblem::UntrustedCertificate => "sslrootcert / ssl-ca",
        _ => "",
    }
}

/// A failure of `problem` connecting to `host`, with the SQL stores' hint; `detail` must
/// hold no secret.
pub fn failure(problem: TlsProblem, host: Option<&str>, detail: impl Into<String>) -> TlsFailure {
    TlsFailure::new(problem, host, detail).with_hint(hint(problem))
}

/// The handshake failure `err` is, if it is one: an untrusted certificate, a certificate
/// for another host, a server without TLS, or another TLS error. The host is the one the
/// certificate was checked against when the error says it. `None` for errors that are not
/// about TLS (a refused plaintext connection is a server error each backend recognises
/// itself).
///
/// A driver configuration error while a client key is configured (`client_key`) is taken
/// for an unreadable client certificate or key, and its text is dropped: the PEM parser's
/// message may quote a line of the key file.
pub fn from_sqlx(err: &sqlx::Error, client_key: bool) -> Option<TlsFailure> {
    let found = match err {
        sqlx::Error::Io(io) => io
            .get_ref()
            .and_then(|inner| inner.downcast_ref::<rustls::Error>())
            .map(TlsFailure::from_rustls),
        sqlx::Error::Tls(inner) => Some(match inner.downcast_ref::<rustls::Error>() {
            Some(e) => TlsFailure::from_rustls(e),
            None => {
                let text = inner.to_string();
                if text.contains("does not support TLS") {
                    TlsFailure::new(TlsProblem::NotOffered, None, text)
                } else {
                    // sqlx's own texts: a CA or certificate file that does not parse
                    // (named by path), never a key's content.
                    TlsFailure::new(TlsProblem::Other, None, text)
                }
            }
        }),
        sqlx::Error::Configuration(_) if client_key => Some(TlsFailure::new(
            TlsProblem::Files,
            None,
            "the client certificate or key cannot be read or is not PEM (the key's parse \
             error is not shown: it may quote the file)",
        )),
        _ => None,
    }?;
    let problem = found.problem();
    Some(found.with_hint(hint(problem)))
}

#[cfg(test)]
mod tests {
    use std::io;

    use super::*;

    fn handshake(e: rustls::Error) -> sqlx::Error {
        sqlx::Error::Io(io::Error::new(io::ErrorKind::InvalidData, e))
    }

    #[test]
    fn handshake_errors_are_told_apart() {
        let wrong = handshake(rustls::Error::InvalidCertificate(
            rustls::CertificateError::NotValidForNameContext {
                expected: rustls::pki_types::ServerName::try_from("db.example")
                    .unwrap()
                    .to_owned(),
                presented: vec!["other.example".into()],
            },
        ));
        let t = from_sqlx(&wrong, false).unwrap();
        assert_eq!(t.problem(), TlsProblem::WrongHost);
        assert_eq!(t.host(), Some("db.example"));
        assert!(t.to_string().contains("db.example"), "{t}");
        let untrusted = handshake(rustls::Error::InvalidCertificate(
            rustls::CertificateError::UnknownIssuer,
        ));
        let t = from_sqlx(&untrusted, false).unwrap();
        assert_eq!(t.problem(), TlsProblem::UntrustedCertificate);
        assert!(t.to_string().contains("(sslrootcert / ssl-ca)"), "{t}");
        assert_eq!(t.clone().or_host("h").host(), Some("h"));
        let none = sqlx::Error::Tls("server does not support TLS".into());
        assert_eq!(
            from_sqlx(&none, false).unwrap().problem(),
            TlsProblem::NotOffered
        );
        let reset = sqlx::Error::Io(io::Error::from(io::ErrorKind::ConnectionReset));
        assert_eq!(from_sqlx(&reset, true), None);
    }

    #[test]
    fn a_key_parse_error_is_not_repeated() {
        let e = sqlx::Error::Configuration("bad line: MIIEsecretkeybytes".into());
        assert_eq!(from_sqlx(&e, false), None);
        let t = from_sqlx(&e, true).unwrap();
        assert!(!t.to_string().contains("MIIE"), "{t}");
    }
}
