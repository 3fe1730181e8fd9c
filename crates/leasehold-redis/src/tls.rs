//! TLS for the Redis stores: handshake failures as the core's [`TlsFailure`] (one type for
//! every store, with the Redis URL's parameters as the hint), and the client TLS settings
//! made from the PEM files a URL names.

use leasehold_core::{StoreError, StoreErrorKind};
#[cfg(feature = "tls")]
use redis::RedisError;

use crate::BACKEND;
use crate::config::TlsSettings;

pub use leasehold_core::tls::{TlsFailure, TlsProblem};

/// The error for `e`, the failure of a first connection: when the URL is plaintext and
/// the failure is an unreachable server, a server (standalone, cluster seed or sentinel)
/// that speaks only TLS makes it a [`TlsProblem::PlaintextRefused`] error naming the
/// scheme to use; otherwise `e` itself. Asked within the connect timeout, at most a second.
pub(crate) async fn plaintext_refused(config: &crate::RedisConfig, e: StoreError) -> StoreError {
    #[cfg(feature = "tls")]
    if config.tls().is_none() {
        use crate::config::Topology;
        let (nodes, hint): (&[_], _) = match config.topology() {
            Topology::Standalone { node } => (std::slice::from_ref(node), "rediss://"),
            Topology::Cluster { seeds } => (seeds, "rediss+cluster://"),
            Topology::Sentinel { sentinels, .. } => (sentinels, "rediss+sentinel://"),
        };
        let hosts: Vec<(String, u16)> = nodes
            .iter()
            .map(|n| {
                let n = config.map_addr(n);
                (n.host, n.port)
            })
            .collect();
        let within = config.connect_timeout();
        return leasehold_core::tls_session::plaintext_refused(BACKEND, e, &hosts, hint, within)
            .await;
    }
    #[cfg(not(feature = "tls"))]
    let _ = config;
    e
}

/// The Redis URL parameters (or the way out) that fix `problem`.
#[cfg_attr(not(feature = "tls"), allow(dead_code))]
fn hint(problem: TlsProblem) -> &'static str {
    match problem {
        TlsProblem::UntrustedCertificate => "tls_ca=",
        TlsProblem::WrongHost => "for Sentinel: the address the sentinels announce",
        TlsProblem::Other => {
            "does the server require a client certificate, tls_cert= and tls_key=, signed by \
             a CA it trusts?"
        }
        _ => "",
    }
}

/// A failure of `problem` with the Redis URL's hint.
#[cfg_attr(not(feature = "tls"), allow(dead_code))]
fn new_failure(problem: TlsProblem, host: Option<&str>, detail: impl Into<String>) -> TlsFailure {
    TlsFailure::new(problem, host, detail).with_hint(hint(problem))
}

/// The same failure, for `host` (if given) when it named none.
#[cfg(feature = "tls")]
fn or_host(failure: TlsFailure, host: Option<&str>) -> TlsFailure {
    match host {
        Some(h) => failure.or_host(h),
        None => failure,
    }
}

/// The TLS failure `e` is, if it is one, for `host` (the server connected to) unless the
/// error names the host itself. The Cluster client reports a failed first connection as a
/// generic error holding the last node's error as text: its rustls text is recognised too.
#[cfg(feature = "tls")]
pub(crate) fn failure(e: &RedisError, host: Option<&str>) -> Option<TlsFailure> {
    if let Some(found) = TlsFailure::find_rustls(e) {
        let problem = found.problem();
        return Some(or_host(found.with_hint(hint(problem)), host));
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
    Some(new_failure(problem, host, detail))
}

#[cfg(not(feature = "tls"))]
pub(crate) fn failure(_: &redis::RedisError, _: Option<&str>) -> Option<TlsFailure> {
    None
}

/// A `Config` error for a TLS file, with its [`TlsFailure`] as the source.
#[cfg(feature = "tls")]
fn file_error(what: &str, path: &std::path::Path, problem: &str) -> StoreError {
    let failure = new_failure(
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
