//! [`TlsFailure`]: why a TLS connection to a store's server failed, as a type, the same for
//! every store. A store puts it as the [source](std::error::Error::source) of its
//! [`StoreError`] (of kind [`Config`](crate::StoreErrorKind::Config): fix the URL, the
//! certificates or the server; retrying cannot help), so that a program — and the
//! `leasehold` command's exit statuses — tell the cases apart by type with
//! [`TlsFailure::of`], never by the message.
//!
//! With the feature `rustls`, [`TlsFailure::from_rustls`] and [`TlsFailure::find_rustls`]
//! classify rustls's own handshake errors, which every store's client uses.

use std::fmt;

use crate::error::StoreError;

/// What went wrong with TLS.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum TlsProblem {
    /// The server refused a connection without TLS (PostgreSQL: a `hostnossl … reject`
    /// line in `pg_hba.conf`; MariaDB/MySQL: `require_secure_transport=ON` or an account
    /// with `REQUIRE SSL`; a server with only a TLS port): turn TLS on in the URL.
    PlaintextRefused,
    /// The URL requires TLS, but the server does not offer it.
    NotOffered,
    /// The server's certificate is not signed by a CA the client trusts (or is expired,
    /// or otherwise invalid): name the CA that signed it in the URL.
    UntrustedCertificate,
    /// The server's certificate is valid but does not name the host the URL connects to.
    WrongHost,
    /// A CA, certificate or key file named in the URL cannot be read or holds no PEM of
    /// the right kind.
    Files,
    /// Any other TLS failure: a handshake the server aborted (a client certificate it
    /// requires and did not get, or one it does not trust), a protocol error.
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
            Self::Files => "files",
            Self::Other => "other",
        }
    }

    /// What to do, in words that fit every store.
    fn advice(self) -> &'static str {
        match self {
            Self::PlaintextRefused => {
                "the server refused a connection without TLS: turn TLS on in the URL"
            }
            Self::NotOffered => {
                "the URL requires TLS but the server does not offer it: turn TLS on in the \
                 server"
            }
            Self::UntrustedCertificate => {
                "the server's certificate is not signed by a trusted CA: name the CA that \
                 signed it in the URL"
            }
            Self::WrongHost => {
                "the server's certificate does not name the host: connect by a name the \
                 certificate holds, or reissue the certificate for this host"
            }
            Self::Files => "a CA, certificate or key file of the URL cannot be used",
            Self::Other => "the TLS connection failed",
        }
    }
}

/// A TLS failure while connecting: [what](TlsProblem) went wrong, and the host it was for.
///
/// Its text never holds key material or a password: it is made of the problem, the
/// store's hint (which URL parameter to set), the host, and a detail the store vouches
/// holds no secret (rustls's description of a certificate error, a file's path).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TlsFailure {
    problem: TlsProblem,
    host: Option<String>,
    hint: &'static str,
    detail: String,
}

impl TlsFailure {
    /// A failure of `problem`, connecting to `host` (if known), with a detail text that
    /// must hold no secret.
    pub fn new(problem: TlsProblem, host: Option<&str>, detail: impl Into<String>) -> Self {
        Self {
            problem,
            host: host.map(str::to_owned),
            hint: "",
            detail: detail.into(),
        }
    }

    /// The same failure with the store's hint after the advice: the URL parameters that
    /// fix it, e.g. `sslrootcert for postgres://, ssl-ca for mysql://`.
    #[must_use]
    pub fn with_hint(mut self, hint: &'static str) -> Self {
        self.hint = hint;
        self
    }

    /// What went wrong.
    pub fn problem(&self) -> TlsProblem {
        self.problem
    }

    /// The host connected to (the one the certificate was checked against), when known.
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

    /// rustls's handshake error as a failure: a certificate for another host (naming the
    /// host it was checked against when rustls says it), an untrusted or invalid
    /// certificate, or another TLS error.
    #[cfg(feature = "rustls")]
    pub fn from_rustls(e: &rustls::Error) -> Self {
        use rustls::CertificateError as C;
        match e {
            rustls::Error::InvalidCertificate(C::NotValidForNameContext { expected, .. }) => {
                let host = expected.to_str();
                Self::new(TlsProblem::WrongHost, Some(&host), e.to_string())
            }
            rustls::Error::InvalidCertificate(C::NotValidForName) => {
                Self::new(TlsProblem::WrongHost, None, e.to_string())
            }
            rustls::Error::InvalidCertificate(_) => {
                Self::new(TlsProblem::UntrustedCertificate, None, e.to_string())
            }
            _ => Self::new(TlsProblem::Other, None, e.to_string()),
        }
    }

    /// The rustls error among the sources of `e` (looking inside `io::Error`s too, whose
    /// `source` skips the error they wrap, and inside the `Arc<dyn Error + Send + Sync>`
    /// in which some clients, the redis crate's among them, share an I/O error),
    /// [classified](Self::from_rustls); `None` when there is none.
    #[cfg(feature = "rustls")]
    pub fn find_rustls(e: &(dyn std::error::Error + 'static)) -> Option<Self> {
        type Shared = std::sync::Arc<dyn std::error::Error + Send + Sync>;
        let mut next = Some(e);
        while let Some(e) = next {
            if let Some(r) = e.downcast_ref::<rustls::Error>() {
                return Some(Self::from_rustls(r));
            }
            if let Some(r) = e
                .downcast_ref::<std::io::Error>()
                .and_then(std::io::Error::get_ref)
                .and_then(|inner| inner.downcast_ref::<rustls::Error>())
            {
                return Some(Self::from_rustls(r));
            }
            if let Some(found) = e
                .downcast_ref::<Shared>()
                .and_then(|shared| Self::find_rustls(&**shared))
            {
                return Some(found);
            }
            next = e.source();
        }
        None
    }
}

impl fmt::Display for TlsFailure {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("TLS: ")?;
        f.write_str(self.problem.advice())?;
        if !self.hint.is_empty() {
            write!(f, " ({})", self.hint)?;
        }
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
    use super::*;
    use crate::error::StoreErrorKind;

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
        let other = StoreError::new(StoreErrorKind::Config, "test", "connecting")
            .with_source(std::io::Error::other("not TLS"));
        assert_eq!(TlsFailure::of(&other), None);
    }

    #[test]
    fn the_text_says_what_to_do_names_the_host_and_keeps_the_hint() {
        let t = TlsFailure::new(TlsProblem::UntrustedCertificate, None, "UnknownIssuer")
            .with_hint("cacert")
            .or_host("db");
        assert_eq!(
            t.to_string(),
            "TLS: the server's certificate is not signed by a trusted CA: name the CA that \
             signed it in the URL (cacert) (host `db`): UnknownIssuer"
        );
        assert_eq!(t.host(), Some("db"));
        assert_eq!(
            t.clone().or_host("other").host(),
            Some("db"),
            "keeps its own"
        );
        let bare = TlsFailure::new(TlsProblem::Other, None, "");
        assert_eq!(bare.to_string(), "TLS: the TLS connection failed");
        assert_eq!(bare.host(), None);
        for (p, words, name) in [
            (
                TlsProblem::PlaintextRefused,
                "without TLS",
                "plaintext_refused",
            ),
            (TlsProblem::NotOffered, "does not offer it", "not_offered"),
            (
                TlsProblem::WrongHost,
                "does not name the host",
                "wrong_host",
            ),
            (TlsProblem::Files, "cannot be used", "files"),
            (
                TlsProblem::UntrustedCertificate,
                "trusted CA",
                "untrusted_certificate",
            ),
            (TlsProblem::Other, "failed", "other"),
        ] {
            let t = TlsFailure::new(p, None, "");
            assert!(t.to_string().contains(words), "{t}");
            assert_eq!((t.problem(), p.as_str()), (p, name));
        }
    }

    #[cfg(feature = "rustls")]
    #[test]
    fn rustls_errors_are_told_apart_wherever_they_sit() {
        let wrong =
            rustls::Error::InvalidCertificate(rustls::CertificateError::NotValidForNameContext {
                expected: rustls::pki_types::ServerName::try_from("db.example")
                    .unwrap()
                    .to_owned(),
                presented: vec!["other.example".into()],
            });
        let t = TlsFailure::from_rustls(&wrong);
        assert_eq!(
            (t.problem(), t.host()),
            (TlsProblem::WrongHost, Some("db.example"))
        );
        let bare = rustls::Error::InvalidCertificate(rustls::CertificateError::NotValidForName);
        assert_eq!(TlsFailure::from_rustls(&bare).host(), None);
        assert_eq!(
            TlsFailure::from_rustls(&bare).problem(),
            TlsProblem::WrongHost
        );
        let untrusted = rustls::Error::InvalidCertificate(rustls::CertificateError::UnknownIssuer);
        assert_eq!(
            TlsFailure::from_rustls(&untrusted).problem(),
            TlsProblem::UntrustedCertificate
        );
        let other = rustls::Error::DecryptError;
        assert_eq!(TlsFailure::from_rustls(&other).problem(), TlsProblem::Other);
        // Inside an io::Error, itself the source of another error.
        #[derive(Debug)]
        struct Outer(std::io::Error);
        impl fmt::Display for Outer {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("outer")
            }
        }
        impl std::error::Error for Outer {
            fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
                Some(&self.0)
            }
        }
        let wrapped = Outer(std::io::Error::new(
            std::io::ErrorKind::InvalidData,
            untrusted,
        ));
        assert_eq!(
            TlsFailure::find_rustls(&wrapped).map(|t| t.problem()),
            Some(TlsProblem::UntrustedCertificate)
        );
        let direct: &(dyn std::error::Error + 'static) = &rustls::Error::DecryptError;
        assert_eq!(
            TlsFailure::find_rustls(direct).map(|t| t.problem()),
            Some(TlsProblem::Other)
        );
        let none = Outer(std::io::Error::other("reset"));
        assert_eq!(TlsFailure::find_rustls(&none), None);
        // Shared in an Arc, as the redis crate keeps its I/O errors, behind a source.
        #[derive(Debug)]
        struct Holder(std::sync::Arc<dyn std::error::Error + Send + Sync>);
        impl fmt::Display for Holder {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("holder")
            }
        }
        impl std::error::Error for Holder {
            fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
                Some(&self.0)
            }
        }
        let shared = Holder(std::sync::Arc::new(std::io::Error::new(
            std::io::ErrorKind::InvalidData,
            rustls::Error::InvalidCertificate(rustls::CertificateError::UnknownIssuer),
        )));
        assert_eq!(
            TlsFailure::find_rustls(&shared).map(|t| t.problem()),
            Some(TlsProblem::UntrustedCertificate)
        );
        let shared_none = Holder(std::sync::Arc::new(std::io::Error::other("reset")));
        assert_eq!(TlsFailure::find_rustls(&shared_none), None);
    }
}
