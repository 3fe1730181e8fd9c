//! [`TlsFailure`]: why a TLS connection to a PostgreSQL or MariaDB/MySQL server failed, as
//! a type. The stores put it as the [source](std::error::Error::source) of their
//! [`StoreError`] ([`StoreErrorKind::Config`](leasehold_core::StoreErrorKind::Config):
//! fix the URL, the certificates or the server; retrying cannot help), so that a program
//! tells the cases apart by type with [`TlsFailure::of`], never by the message.

use std::fmt;

use leasehold_core::StoreError;

/// What went wrong with TLS.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum TlsProblem {
    /// The server refused a connection without TLS (PostgreSQL: a `hostnossl … reject`
    /// line or no `host` line for it in `pg_hba.conf`; MariaDB/MySQL:
    /// `require_secure_transport=ON` or an account with `REQUIRE SSL`/`X509`): turn TLS on
    /// in the URL.
    PlaintextRefused,
    /// The URL requires TLS, but the server does not offer it.
    NotOffered,
    /// The server's certificate is not signed by a CA the client trusts (or is expired,
    /// or otherwise invalid): name the right CA file in the URL.
    UntrustedCertificate,
    /// The server's certificate is valid but does not name the host the URL connects to.
    WrongHost,
    /// Any other TLS failure: a client certificate or key that cannot be read, a handshake
    /// the server aborted, a protocol error.
    Other,
}

impl TlsProblem {
    /// A short stable name, for logs and `--json` output.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::PlaintextRefused => "plaintext_refused",
            Self::NotOffered => "not_offered",
            Self::UntrustedCertificate => "untrusted_certificate",
            Self::WrongHost => "wrong_host",
            Self::Other => "other",
        }
    }
}

/// A TLS failure while connecting: [what](TlsProblem) went wrong, and the host it was for.
///
/// Its text never holds key material or a password: it is made of the problem, the host
/// and, for handshake errors, the TLS library's own description of the certificate error.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TlsFailure {
    problem: TlsProblem,
    host: Option<String>,
    detail: String,
}

impl TlsFailure {
    /// A failure of `problem`, connecting to `host` (if known), with a detail text that
    /// must hold no secret.
    pub fn new(problem: TlsProblem, host: Option<&str>, detail: impl Into<String>) -> Self {
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

    /// The host connected to, when known.
    pub fn host(&self) -> Option<&str> {
        self.host.as_deref()
    }

    /// The same failure, for `host` when it named none.
    #[must_use]
    pub fn or_host(mut self, host: &str) -> Self {
        if self.host.is_none() {
            self.host = Some(host.to_owned());
        }
        self
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

    /// The handshake failure `err` is, if it is one: an untrusted certificate, a
    /// certificate for another host, a server without TLS, or another TLS error. The
    /// host is the one the certificate was checked against when the error says it.
    /// `None` for errors that are not about TLS (a refused plaintext connection is a
    /// server error each backend recognises itself).
    ///
    /// A driver configuration error while a client key is configured (`client_key`) is
    /// taken for an unreadable client certificate or key, and its text is dropped: the
    /// PEM parser's message may quote a line of the key file.
    pub fn from_sqlx(err: &sqlx::Error, client_key: bool) -> Option<Self> {
        match err {
            sqlx::Error::Io(io) => io
                .get_ref()
                .and_then(|inner| inner.downcast_ref::<rustls::Error>())
                .map(from_rustls),
            sqlx::Error::Tls(inner) => Some(match inner.downcast_ref::<rustls::Error>() {
                Some(e) => from_rustls(e),
                None => {
                    let text = inner.to_string();
                    if text.contains("does not support TLS") {
                        Self::new(TlsProblem::NotOffered, None, text)
                    } else {
                        // sqlx's own texts: a CA or certificate file that does not parse
                        // (named by path), never a key's content.
                        Self::new(TlsProblem::Other, None, text)
                    }
                }
            }),
            sqlx::Error::Configuration(_) if client_key => Some(Self::new(
                TlsProblem::Other,
                None,
                "the client certificate or key cannot be read or is not PEM (the key's \
                 parse error is not shown: it may quote the file)",
            )),
            _ => None,
        }
    }

    /// What to do, in words.
    fn advice(&self) -> &'static str {
        match self.problem {
            TlsProblem::PlaintextRefused => {
                "the server refused a connection without TLS: turn TLS on in the URL \
                 (PostgreSQL sslmode=verify-full, MariaDB/MySQL ssl-mode=VERIFY_IDENTITY)"
            }
            TlsProblem::NotOffered => {
                "the URL requires TLS but the server does not offer it: turn TLS on in the \
                 server"
            }
            TlsProblem::UntrustedCertificate => {
                "the server's certificate is not signed by a trusted CA: name the CA that \
                 signed it in the URL (sslrootcert / ssl-ca)"
            }
            TlsProblem::WrongHost => {
                "the server's certificate does not name the host: connect by a name the \
                 certificate holds, or reissue the certificate for this host"
            }
            TlsProblem::Other => "the TLS connection failed",
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

#[cfg(test)]
mod tests {
    use std::io;

    use leasehold_core::StoreErrorKind;

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
        let t = TlsFailure::from_sqlx(&wrong, false).unwrap();
        assert_eq!(t.problem(), TlsProblem::WrongHost);
        assert_eq!(t.host(), Some("db.example"));
        assert!(t.to_string().contains("db.example"), "{t}");
        let untrusted = handshake(rustls::Error::InvalidCertificate(
            rustls::CertificateError::UnknownIssuer,
        ));
        let t = TlsFailure::from_sqlx(&untrusted, false).unwrap();
        assert_eq!(t.problem(), TlsProblem::UntrustedCertificate);
        assert_eq!(t.clone().or_host("h").host(), Some("h"));
        let none = sqlx::Error::Tls("server does not support TLS".into());
        assert_eq!(
            TlsFailure::from_sqlx(&none, false).unwrap().problem(),
            TlsProblem::NotOffered
        );
        let reset = sqlx::Error::Io(io::Error::from(io::ErrorKind::ConnectionReset));
        assert_eq!(TlsFailure::from_sqlx(&reset, true), None);
    }

    #[test]
    fn a_key_parse_error_is_not_repeated() {
        let e = sqlx::Error::Configuration("bad line: MIIEsecretkeybytes".into());
        assert_eq!(TlsFailure::from_sqlx(&e, false), None);
        let t = TlsFailure::from_sqlx(&e, true).unwrap();
        assert!(!t.to_string().contains("MIIE"), "{t}");
    }

    #[test]
    fn found_among_the_sources() {
        let t = TlsFailure::new(TlsProblem::PlaintextRefused, Some("h"), "");
        let e = StoreError::new(StoreErrorKind::Config, "test", "connecting").with_source(t);
        assert_eq!(
            TlsFailure::of(&e).map(TlsFailure::problem),
            Some(TlsProblem::PlaintextRefused)
        );
        let plain = StoreError::new(StoreErrorKind::Config, "test", "connecting");
        assert_eq!(TlsFailure::of(&plain), None);
    }
}
