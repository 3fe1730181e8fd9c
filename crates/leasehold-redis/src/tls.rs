//! [`TlsFailure`]: why a TLS connection to a Redis server or sentinel failed, as a type;
//! and the client TLS settings made from the PEM files a URL names.

use std::fmt;

use leasehold_core::{StoreError, StoreErrorKind};
#[cfg(feature = "tls")]
use redis::RedisError;

use crate::BACKEND;
use crate::config::TlsSettings;

/// What went wrong with TLS.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum TlsProblem {
    /// The server's certificate is not signed by a CA the client trusts (or is expired,
    /// or otherwise invalid): name the CA that signed it with `tls_ca`.
    UntrustedCertificate,
    /// The server's certificate is valid but does not name the host the client connected
    /// to (a URL's host, or the address a sentinel named).
    WrongHost,
    /// A CA, certificate or key file named in the URL cannot be read.
    Files,
    /// Any other TLS failure: a handshake the server aborted (a client certificate it
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

/// A TLS failure while connecting to a Redis server or sentinel: [what](TlsProblem) went
/// wrong, and the host it was for. The store puts it as the
/// [source](std::error::Error::source) of a [`StoreErrorKind::Config`] error (fix the URL,
/// the certificates or the server; retrying cannot help); [`TlsFailure::of`] finds it.
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
    #[cfg_attr(not(feature = "tls"), allow(dead_code))]
    pub(crate) fn new(problem: TlsProblem, host: Option<&str>, detail: impl Into<String>) -> Self {
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

    /// The host the certificate was checked against (or the server connected to), when
    /// known.
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

    /// The same failure, for `host` when it named none.
    #[cfg_attr(not(feature = "tls"), allow(dead_code))]
    pub(crate) fn or_host(mut self, host: Option<&str>) -> Self {
        if self.host.is_none() {
            self.host = host.map(str::to_owned);
        }
        self
    }

    fn advice(&self) -> &'static str {
        match self.problem {
            TlsProblem::UntrustedCertificate => {
                "the server's certificate is not signed by a trusted CA: name the CA that \
                 signed it with tls_ca="
            }
            TlsProblem::WrongHost => {
                "the server's certificate does not name the host: connect by a name the \
                 certificate holds (for Sentinel: the address the sentinels announce), or \
                 reissue the certificate for this host"
            }
            TlsProblem::Files => "a TLS file named in the URL cannot be used",
            TlsProblem::Other => {
                "the TLS connection failed (does the server require a client certificate, \
                 tls_cert= and tls_key=, signed by a CA it trusts?)"
            }
        }
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

#[cfg(feature = "tls")]
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

/// The rustls error behind `e`, if any.
#[cfg(feature = "tls")]
fn rustls_error(e: &RedisError) -> Option<&rustls::Error> {
    type Shared = std::sync::Arc<dyn std::error::Error + Send + Sync>;
    fn find<'a>(err: &'a (dyn std::error::Error + 'static)) -> Option<&'a rustls::Error> {
        if let Some(r) = err.downcast_ref::<rustls::Error>() {
            return Some(r);
        }
        // The redis crate keeps I/O errors in an `Arc<dyn Error>`; tokio-rustls puts the
        // rustls error inside an `io::Error`, whose `source()` skips it.
        if let Some(shared) = err.downcast_ref::<Shared>() {
            return find(&**shared);
        }
        err.downcast_ref::<std::io::Error>()
            .and_then(std::io::Error::get_ref)
            .and_then(|inner| inner.downcast_ref::<rustls::Error>())
    }
    let mut cur: Option<&(dyn std::error::Error + 'static)> = std::error::Error::source(e);
    while let Some(err) = cur {
        if let Some(r) = find(err) {
            return Some(r);
        }
        cur = err.source();
    }
    None
}

/// The TLS failure `e` is, if it is one, for `host` (the server connected to) unless the
/// error names the host itself. The Cluster client reports a failed first connection as a
/// generic error holding the last node's error as text: its rustls text is recognised too.
#[cfg(feature = "tls")]
pub(crate) fn failure(e: &RedisError, host: Option<&str>) -> Option<TlsFailure> {
    if let Some(r) = rustls_error(e) {
        return Some(from_rustls(r).or_host(host));
    }
    let detail = e.detail()?;
    if !detail.contains("invalid peer certificate") {
        return None;
    }
    let problem = if detail.contains("not valid for name") || detail.contains("NotValidForName") {
        TlsProblem::WrongHost
    } else {
        TlsProblem::UntrustedCertificate
    };
    Some(TlsFailure::new(problem, host, detail))
}

#[cfg(not(feature = "tls"))]
pub(crate) fn failure(_: &redis::RedisError, _: Option<&str>) -> Option<TlsFailure> {
    None
}

/// A `Config` error for a TLS file, with its [`TlsFailure`] as the source.
#[cfg(feature = "tls")]
fn file_error(what: &str, path: &std::path::Path, problem: &str) -> StoreError {
    let failure = TlsFailure::new(
        TlsProblem::Files,
        None,
        format!("the TLS {what} file {} {problem}", path.display()),
    );
    StoreError::new(StoreErrorKind::Config, BACKEND, "configuring TLS").with_source(failure)
}

#[cfg(feature = "tls")]
fn read_pem(path: &std::path::Path, what: &str) -> Result<Vec<u8>, StoreError> {
    std::fs::read(path).map_err(|e| file_error(what, path, &format!("cannot be read ({e})")))
}

/// The client's certificates from `tls`: the CA to trust, the client certificate and key.
/// The files are read now, so that a missing one is reported at once.
#[cfg(feature = "tls")]
pub(crate) fn certificates(tls: &TlsSettings) -> Result<redis::TlsCertificates, StoreError> {
    // Pick ring as rustls' provider unless the application installed one.
    let _ = rustls::crypto::ring::default_provider().install_default();
    let root_cert = match &tls.ca_file {
        Some(p) => Some(read_pem(p, "CA")?),
        None => None,
    };
    let client_tls = match &tls.client_cert {
        Some((cert, key)) => Some(redis::ClientTlsConfig {
            client_cert: read_pem(cert, "client certificate")?,
            client_key: read_pem(key, "client key")?,
        }),
        None => None,
    };
    Ok(redis::TlsCertificates {
        client_tls,
        root_cert,
    })
}

/// A client for `host:port` with the credentials given, over verified TLS with `tls`
/// (`None`: plain TCP). Used by the Redis store for every server and sentinel, and by the
/// Redlock store for its nodes, so that both read the same URL parameters the same way.
///
/// # Errors
/// [`StoreErrorKind::Config`] when a TLS file cannot be read (with a [`TlsFailure`] of
/// [`TlsProblem::Files`] as the source), when TLS is asked for but this crate was built
/// without its `tls` feature, or the address is not valid. Never holds the password.
#[doc(hidden)]
pub fn client(
    host: &str,
    port: u16,
    tls: Option<&TlsSettings>,
    db: i64,
    username: Option<&str>,
    password: Option<&str>,
) -> Result<redis::Client, StoreError> {
    use redis::{ConnectionAddr, IntoConnectionInfo, RedisConnectionInfo};
    let config = |what: &str| StoreError::new(StoreErrorKind::Config, BACKEND, what.to_owned());
    let addr = match tls {
        Some(_) if !cfg!(feature = "tls") => {
            return Err(config(
                "TLS (rediss) needs leasehold-redis built with its `tls` feature",
            ));
        }
        Some(_) => ConnectionAddr::TcpTls {
            host: host.to_owned(),
            port,
            insecure: false,
            tls_params: None,
        },
        None => ConnectionAddr::Tcp(host.to_owned(), port),
    };
    let mut settings = RedisConnectionInfo::default()
        .set_db(db)
        .set_skip_set_lib_name();
    if let Some(u) = username {
        settings = settings.set_username(u);
    }
    if let Some(p) = password {
        settings = settings.set_password(p);
    }
    let info = addr
        .into_connection_info()
        .map_err(|_| config(&format!("{host}:{port} is not a valid address")))?
        .set_redis_settings(settings);
    #[cfg(feature = "tls")]
    if let Some(tls) = tls {
        let certs = certificates(tls)?;
        return redis::Client::build_with_tls(info, certs).map_err(|e| {
            let what = match failure(&e, Some(host)) {
                Some(t) => t.to_string(),
                None => {
                    "the TLS settings cannot be used (are the CA, certificate and key PEM files?)"
                        .to_owned()
                }
            };
            config(&format!("configuring TLS for {host}:{port}: {what}"))
        });
    }
    redis::Client::open(info).map_err(|_| config(&format!("{host}:{port}: a bad address")))
}

/// The TLS failure behind a Redis client error, for `host` unless the error names it:
/// `None` when `e` is not about TLS. For the Redlock store's error mapping.
#[doc(hidden)]
pub fn failure_of(e: &redis::RedisError, host: &str) -> Option<TlsFailure> {
    failure(e, Some(host))
}
