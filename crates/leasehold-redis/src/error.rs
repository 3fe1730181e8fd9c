//! Mapping `redis` errors into [`StoreError`]s, with credentials scrubbed.

use std::fmt;
use std::time::Duration;

use leasehold_core::{Refusal, StoreError, StoreErrorKind};
use redis::{ErrorKind, RedisError, ServerErrorKind};

use crate::BACKEND;
use crate::scripts::{CORRUPT_CODE, FORMAT_CODE};

/// Where in an operation an error happened: it decides whether the request may have
/// been applied.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Phase {
    /// Establishing the connection (TCP, TLS, AUTH, SELECT): nothing was sent.
    Connect,
    /// Sending the request or waiting for its reply.
    Request,
}

/// The text of an underlying error, already scrubbed of credentials. Used as the
/// [`source`](std::error::Error::source) of a [`StoreError`].
#[derive(Debug, Clone)]
pub struct Cause(String);

impl fmt::Display for Cause {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for Cause {}

impl Cause {
    /// The text of `e`, scrubbed of `secret`.
    pub(crate) fn scrubbed(e: &RedisError, secret: Option<&str>) -> Self {
        Self(scrub(&e.to_string(), secret))
    }

    /// The text of `e`, scrubbed of every one of `secrets`.
    pub(crate) fn scrubbed_all(e: &RedisError, secrets: &[&str]) -> Self {
        Self(scrub_all(&e.to_string(), secrets))
    }
}

/// Whether the server's ACL refused the command.
pub(crate) fn is_noperm(e: &RedisError) -> bool {
    e.code() == Some("NOPERM") || matches!(e.kind(), ErrorKind::Server(ServerErrorKind::NoPerm))
}

/// The source of the [`StoreError`] (kind [`StoreErrorKind::Config`]) by which the store
/// refuses a server whose `maxmemory-policy` may evict keys: which server, which policy.
///
/// ```no_run
/// # async fn f() {
/// # let url = "";
/// if let Err(e) = leasehold_redis::RedisStore::open(url).await {
///     let evicting = std::error::Error::source(&e)
///         .and_then(|s| s.downcast_ref::<leasehold_redis::EvictingPolicy>());
///     if let Some(p) = evicting {
///         eprintln!("{} evicts keys ({})", p.node(), p.policy());
///     }
/// }
/// # }
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EvictingPolicy {
    node: String,
    policy: String,
}

impl EvictingPolicy {
    pub(crate) fn new(node: impl Into<String>, policy: impl Into<String>) -> Self {
        Self {
            node: node.into(),
            policy: policy.into(),
        }
    }

    /// The server (`host:port`, as the configuration or the Cluster names it).
    pub fn node(&self) -> &str {
        &self.node
    }

    /// The `maxmemory-policy` it reported (`allkeys-lru`, `volatile-ttl`, ...).
    pub fn policy(&self) -> &str {
        &self.policy
    }
}

impl fmt::Display for EvictingPolicy {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "maxmemory-policy {} on {}", self.policy, self.node)
    }
}

impl std::error::Error for EvictingPolicy {}

/// The source of the [`StoreError`] (kind [`StoreErrorKind::Config`]) by which a
/// Sentinel store refuses to grant while a replica's clock is ahead of the primary's by
/// more than `max_clock_offset` (see the crate docs, "Replica clocks"): which replica,
/// which primary, by how much (an upper bound), and the limit.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ClockOffset {
    replica: String,
    primary: String,
    offset: Duration,
    limit: Duration,
}

impl ClockOffset {
    pub(crate) fn new(replica: String, primary: String, offset: Duration, limit: Duration) -> Self {
        Self {
            replica,
            primary,
            offset,
            limit,
        }
    }

    /// The replica (`host:port`, as the primary's `ROLE` names it).
    pub fn replica(&self) -> &str {
        &self.replica
    }

    /// The primary it was measured against.
    pub fn primary(&self) -> &str {
        &self.primary
    }

    /// How far the replica's clock is ahead of the primary's, at most (the measured
    /// difference plus the round trip).
    pub fn offset(&self) -> Duration {
        self.offset
    }

    /// The largest offset the store accepts (`max_clock_offset`).
    pub fn limit(&self) -> Duration {
        self.limit
    }
}

impl fmt::Display for ClockOffset {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "the clock of replica {} is up to {:?} ahead of primary {}'s (max_clock_offset {:?})",
            self.replica, self.offset, self.primary, self.limit
        )
    }
}

impl std::error::Error for ClockOffset {}

/// The refusal of a replica whose clock is too far ahead of the primary's.
pub(crate) fn clock_offset(op: &str, c: ClockOffset) -> StoreError {
    StoreError::new(
        StoreErrorKind::Config,
        BACKEND,
        format!(
            "{op}: {c}. Redis gives replicas each key's expiry as an absolute time, so once \
             promoted by a fail-over that replica ends every lease up to that much early, \
             while its holder still believes; refusing to grant. Synchronise the servers' \
             clocks (NTP), or raise the URL parameter max_clock_offset (every lease's \
             validity is then shortened by the offset)"
        ),
    )
    .with_source(c)
}

/// What to do about a server that may evict: the two ways out.
const EVICTION_WAYS_OUT: &str = "set `maxmemory-policy noeviction` on the server (on every \
     primary of a Cluster), or accept eviction explicitly with the URL parameter \
     allow_eviction=true, knowing that exclusion can then break and only the fence, checked \
     by the storage that receives the writes, protects the data";

/// The refusal of a server whose `maxmemory-policy` may evict a held lease key.
pub(crate) fn evicting(op: &str, node: &str, policy: &str) -> StoreError {
    StoreError::new(
        StoreErrorKind::Config,
        BACKEND,
        format!(
            "{op}: Redis at {node} has maxmemory-policy {policy}, which can evict a held lease \
             key before its TTL and let a second holder in; refusing to use it: \
             {EVICTION_WAYS_OUT}"
        ),
    )
    .with_source(EvictingPolicy::new(node, policy))
}

/// The refusal of a server whose `maxmemory-policy` cannot be read.
pub(crate) fn policy_unknown(op: &str, node: &str, why: &str) -> StoreError {
    StoreError::new(
        StoreErrorKind::Config,
        BACKEND,
        format!(
            "{op}: cannot tell whether Redis at {node} may evict lease keys \
             (maxmemory-policy): {why}; refusing to use it: {EVICTION_WAYS_OUT}"
        ),
    )
}

/// Removes every occurrence of `secret` (raw and percent-encoded) from `text`.
pub(crate) fn scrub(text: &str, secret: Option<&str>) -> String {
    let Some(secret) = secret.filter(|s| !s.is_empty()) else {
        return text.to_owned();
    };
    let mut out = text.replace(secret, "<redacted>");
    let encoded: String = secret
        .bytes()
        .map(|b| {
            if b.is_ascii_alphanumeric() || b"-._~".contains(&b) {
                (b as char).to_string()
            } else {
                format!("%{b:02X}")
            }
        })
        .collect();
    if encoded != secret {
        out = out.replace(&encoded, "<redacted>");
    }
    out
}

/// `text` scrubbed of every one of `secrets` (see [`scrub`]).
pub(crate) fn scrub_all(text: &str, secrets: &[&str]) -> String {
    secrets
        .iter()
        .fold(text.to_owned(), |t, s| scrub(&t, Some(s)))
}

/// Maps a `redis` error from `op` in `phase` to a [`StoreError`].
pub(crate) fn map(op: &str, phase: Phase, e: &RedisError, secret: Option<&str>) -> StoreError {
    let secrets: Vec<&str> = secret.into_iter().collect();
    map_at(op, phase, e, &secrets, None, false)
}

/// [`map`], for a connection to `host` (named by a TLS failure whose error does not name
/// it), scrubbing every one of `secrets`. A failed TLS handshake is a
/// [`StoreErrorKind::Config`] error with a [`TlsFailure`](crate::TlsFailure) source.
/// `no_client_cert`: the connection is TLS without a client certificate, so a connection
/// the server closes while connecting may be its refusal of a client without one (TLS
/// 1.3 tells the client only after the handshake): the message says so.
pub(crate) fn map_at(
    op: &str,
    phase: Phase,
    e: &RedisError,
    secrets: &[&str],
    host: Option<&str>,
    no_client_cert: bool,
) -> StoreError {
    if phase == Phase::Connect
        && let Some(tls) = crate::tls::failure(e, host)
    {
        // The message is the operation; the failure, shown after it, says what and what
        // to do (its text is the TLS library's, which never holds a password).
        return StoreError::new(StoreErrorKind::Config, BACKEND, op.to_owned()).with_source(tls);
    }
    let (kind, what) = classify(phase, e);
    // Closed by the server (broken pipe, reset, end of stream), not refused or timed out.
    let closed = || e.is_connection_dropped() && !e.is_connection_refusal() && !e.is_timeout();
    let what = if no_client_cert
        && phase == Phase::Connect
        && kind == StoreErrorKind::Unavailable
        && closed()
    {
        CLOSED_WITHOUT_CLIENT_CERT
    } else {
        what
    };
    let error = StoreError::new(kind, BACKEND, format!("{op}: {what}"));
    let error = match what {
        AUTH_FAILED => error.refused(Refusal::Credentials),
        ACL_REFUSED => error.refused(Refusal::Permission),
        _ => error,
    };
    error.with_source(Cause::scrubbed_all(e, secrets))
}

/// Whether `e` is a refused password or user (`WRONGPASS`, `NOAUTH`, a failed `AUTH`).
pub(crate) fn is_auth_failure(e: &RedisError) -> bool {
    classify(Phase::Connect, e).1 == AUTH_FAILED
}

/// What a TLS connection without a client certificate, closed by the server while
/// connecting, may mean.
const CLOSED_WITHOUT_CLIENT_CERT: &str = "the server closed the TLS connection while connecting; nothing was sent (does it require a client certificate? give tls_cert= and tls_key=)";

/// What a refused password means.
const AUTH_FAILED: &str = "authentication failed; check the user name and password";

/// What a refusal by the ACL means.
const ACL_REFUSED: &str =
    "permission denied by the server's ACL; see the README for the ACL leasehold needs";

/// What a failed TLS handshake means.
const TLS_FAILED: &str =
    "the TLS handshake failed (certificate not trusted or invalid for the host; see tls_ca)";

/// Whether a TLS handshake failed (an untrusted or invalid certificate, a protocol
/// mismatch): a configuration problem, not a transient one.
fn is_tls_failure(e: &RedisError) -> bool {
    crate::tls::failure(e, None).is_some()
}

/// The cluster client reports a failed initial connection as a generic I/O error whose
/// detail is the text of the last node's error: look for the markers of a configuration
/// problem in it.
fn flattened_config_failure(e: &RedisError) -> Option<&'static str> {
    let detail = e.detail()?;
    if ["AuthenticationFailed", "WRONGPASS", "NOAUTH"]
        .iter()
        .any(|m| detail.contains(m))
    {
        return Some(AUTH_FAILED);
    }
    if detail.contains("NOPERM") {
        return Some(ACL_REFUSED);
    }
    if detail.contains("invalid peer certificate") {
        return Some(TLS_FAILED);
    }
    None
}

fn classify(phase: Phase, e: &RedisError) -> (StoreErrorKind, &'static str) {
    use StoreErrorKind as K;
    if phase == Phase::Connect && is_tls_failure(e) {
        return (K::Config, TLS_FAILED);
    }
    if phase == Phase::Connect
        && let Some(what) = flattened_config_failure(e)
    {
        return (K::Config, what);
    }
    // Codes first: script errors and server refusals.
    match e.code() {
        Some(CORRUPT_CODE) => {
            return (
                K::Corrupt,
                "the store holds data that is not leasehold's (a lease, fence or record) at this key",
            );
        }
        Some(FORMAT_CODE) => {
            return (
                K::Config,
                "the key was written in a newer leasehold store format: upgrade this client (older and newer clients cannot share keys)",
            );
        }
        Some("WRONGTYPE") => {
            return (K::Corrupt, "a key of the wrong type is in the way");
        }
        Some("NOAUTH" | "WRONGPASS") => return (K::Config, AUTH_FAILED),
        Some("NOPERM") => return (K::Config, ACL_REFUSED),
        Some("BUSY") => return (K::Busy, "the server is busy running a script"),
        Some("OOM") => return (K::Busy, "the server is out of memory"),
        Some("MISCONF") => return (K::Busy, "the server refuses writes (MISCONF)"),
        _ => {}
    }
    match e.kind() {
        ErrorKind::AuthenticationFailed => (K::Config, AUTH_FAILED),
        ErrorKind::InvalidClientConfig => (K::Config, "invalid client configuration"),
        ErrorKind::Server(ServerErrorKind::NoPerm) => (K::Config, ACL_REFUSED),
        ErrorKind::Server(
            ServerErrorKind::BusyLoading
            | ServerErrorKind::TryAgain
            | ServerErrorKind::ClusterDown
            | ServerErrorKind::MasterDown
            | ServerErrorKind::ReadOnly
            | ServerErrorKind::Moved
            | ServerErrorKind::Ask,
        ) => (
            K::Busy,
            "the server refused for now (loading, cluster reconfiguring or read-only)",
        ),
        ErrorKind::Server(ServerErrorKind::CrossSlot) => (
            K::Other,
            "CROSSSLOT: the keys of one operation hash to different slots (a bug)",
        ),
        ErrorKind::Server(_) | ErrorKind::Extension => (K::Other, "the server refused the request"),
        ErrorKind::ClusterConnectionNotFound => {
            (K::Unavailable, "no connection to the cluster node")
        }
        ErrorKind::Client if phase == Phase::Connect => (
            K::Config,
            "the connection could not be set up (TLS or client settings)",
        ),
        ErrorKind::Io | ErrorKind::Parse | ErrorKind::Client => {
            if e.is_connection_refusal() {
                (K::Unavailable, "connection refused; nothing was sent")
            } else if phase == Phase::Connect {
                if e.is_timeout() {
                    (K::Unavailable, "connecting timed out; nothing was sent")
                } else {
                    (K::Unavailable, "could not connect; nothing was sent")
                }
            } else if e.is_timeout() {
                (
                    K::Timeout,
                    "no reply in time; the request may have been applied",
                )
            } else {
                (
                    K::Ambiguous,
                    "the connection broke after the request was sent; it may have been applied",
                )
            }
        }
        _ => (K::Other, "unexpected client error"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn scrub_removes_raw_and_encoded_secrets() {
        let s = "a s3ntinel-PASSWORD-x b s3ntinel%2DPASSWORD c p%40ss p@ss";
        assert_eq!(
            scrub(s, Some("s3ntinel-PASSWORD-x")),
            "a <redacted> b s3ntinel%2DPASSWORD c p%40ss p@ss"
        );
        assert_eq!(
            scrub("x p%40ss y p@ss", Some("p@ss")),
            "x <redacted> y <redacted>"
        );
        assert_eq!(scrub("x", None), "x");
        assert_eq!(scrub("x", Some("")), "x");
    }

    #[test]
    fn kinds() {
        let io = |k: std::io::ErrorKind| RedisError::from(std::io::Error::from(k));
        let m = |p, e: &RedisError| map("acquire", p, e, None).kind();
        use StoreErrorKind as K;
        use std::io::ErrorKind as Io;
        for (phase, io_kind, want) in [
            (Phase::Connect, Io::ConnectionRefused, K::Unavailable),
            (Phase::Connect, Io::TimedOut, K::Unavailable),
            (Phase::Request, Io::TimedOut, K::Timeout),
            (Phase::Request, Io::ConnectionReset, K::Ambiguous),
            (Phase::Request, Io::BrokenPipe, K::Ambiguous),
        ] {
            assert_eq!(m(phase, &io(io_kind)), want, "{phase:?} {io_kind:?}");
        }
        let auth = RedisError::from((
            ErrorKind::AuthenticationFailed,
            "Password authentication failed",
        ));
        assert_eq!(m(Phase::Connect, &auth), K::Config);
        let ext = |code: &str| redis::make_extension_error(code.to_owned(), Some("x".to_owned()));
        assert_eq!(m(Phase::Request, &ext("WRONGPASS")), K::Config);
        assert_eq!(m(Phase::Request, &ext("NOAUTH")), K::Config);
        assert_eq!(m(Phase::Request, &ext(CORRUPT_CODE)), K::Corrupt);
        assert_eq!(m(Phase::Request, &ext(FORMAT_CODE)), K::Config);
        assert_eq!(m(Phase::Request, &ext("WRONGTYPE")), K::Corrupt);
        assert_eq!(m(Phase::Request, &ext("BUSY")), K::Busy);
    }
}
