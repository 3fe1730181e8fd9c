//! One node of the set: a lazily opened multiplexed connection, requests bounded by a
//! deadline, errors mapped to [`StoreError`]s with the password scrubbed.

use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};

use leasehold_core::{Refusal, StoreError, StoreErrorKind};
use redis::aio::MultiplexedConnection;
use redis::{AsyncConnectionConfig, Client, ErrorKind, RedisError, ServerErrorKind, Value};
use tokio::time::{Instant, timeout_at};

use crate::BACKEND;
use crate::config::{Node, RedlockConfig};
use crate::scripts::{
    Armed, CORRUPT_CODE, FORMAT_CODE, Lua, ReplyError, eval, eval_cmd, scan_step,
};

/// A connection to one node and what is needed to open it again.
pub(crate) struct NodeConn {
    /// `host:port`, for messages.
    pub(crate) name: String,
    /// The host, as the URL names it (what a server certificate must name).
    host: String,
    /// TLS without a client certificate: a connection the node closes while connecting
    /// may be its refusal of a client without one.
    no_client_cert: bool,
    client: Client,
    secret: Option<String>,
    connect_bound: std::time::Duration,
    /// The open connection and its generation.
    slot: Mutex<Option<(u64, MultiplexedConnection)>>,
    /// Held while connecting, so that concurrent callers wait for one attempt.
    connecting: tokio::sync::Mutex<()>,
    next_gen: AtomicU64,
    next_id: AtomicU64,
}

impl std::fmt::Debug for NodeConn {
    /// The node's address only: the client's own `Debug` would show the password.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("NodeConn")
            .field("name", &self.name)
            .finish_non_exhaustive()
    }
}

/// What a refused password means.
const AUTH_FAILED: &str = "authentication failed; check the user name and password";

/// What a permission error says the store needs.
const ACL_NEEDS: &str = "permission denied by the node's ACL (the store needs PING, INFO, \
    EVALSHA, SCRIPT LOAD, SCAN and, inside its scripts, GET, SET, PEXPIRE, PTTL, DEL and TIME, \
    on keys under its prefix)";

impl NodeConn {
    pub(crate) fn new(cfg: &RedlockConfig, node: &Node) -> Result<Self, StoreError> {
        // The Redis store's client: plain TCP, or TLS with the `rediss://` parameters.
        let client = leasehold_redis::tls::client(
            node.host(),
            node.port(),
            cfg.tls_settings(),
            0,
            cfg.user(),
            cfg.password(),
        )
        .map_err(|e| {
            // Kept as the source: a TLS file that cannot be read is a typed `TlsFailure`.
            StoreError::new(e.kind(), BACKEND, format!("Redlock node {node}")).with_source(e)
        })?;
        let seed = u64::from_le_bytes(
            leasehold_core::OwnerToken::random().as_bytes()[..8]
                .try_into()
                .unwrap_or([0; 8]),
        );
        Ok(Self {
            name: node.to_string(),
            host: node.host().to_owned(),
            no_client_cert: cfg.tls_settings().is_some_and(|t| t.client_cert.is_none()),
            client,
            secret: cfg.password().map(str::to_owned),
            connect_bound: cfg.connect_bound(),
            slot: Mutex::new(None),
            connecting: tokio::sync::Mutex::new(()),
            next_gen: AtomicU64::new(1),
            next_id: AtomicU64::new(seed >> 12),
        })
    }

    fn slot(&self) -> std::sync::MutexGuard<'_, Option<(u64, MultiplexedConnection)>> {
        self.slot.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn invalidate(&self, generation: u64) {
        let mut slot = self.slot();
        if slot.as_ref().is_some_and(|(g, _)| *g == generation) {
            *slot = None;
        }
    }

    /// The open connection, or a new one, by `deadline`. Failing to connect means nothing
    /// was sent: `Unavailable` (or `Config` for a refused password).
    pub(crate) async fn conn(
        &self,
        op: &str,
        deadline: Instant,
    ) -> Result<(u64, MultiplexedConnection), StoreError> {
        if let Some(c) = self.slot().clone() {
            return Ok(c);
        }
        let unavailable = |what: &str| {
            StoreError::new(
                StoreErrorKind::Unavailable,
                BACKEND,
                format!("{op}: node {}: {what}", self.name),
            )
        };
        let _connecting = timeout_at(deadline, self.connecting.lock())
            .await
            .map_err(|_| unavailable("no connection in time (another caller is connecting)"))?;
        if let Some(c) = self.slot().clone() {
            return Ok(c);
        }
        let deadline = deadline.min(Instant::now() + self.connect_bound);
        let config = AsyncConnectionConfig::new()
            .set_connection_timeout(Some(deadline.saturating_duration_since(Instant::now())))
            .set_response_timeout(None);
        let conn = match timeout_at(
            deadline,
            self.client
                .get_multiplexed_async_connection_with_config(&config),
        )
        .await
        {
            Err(_) => return Err(unavailable("could not connect in time")),
            Ok(Err(e)) => return Err(self.map(op, &e, true)),
            Ok(Ok(c)) => c,
        };
        let generation = self.next_gen.fetch_add(1, Ordering::Relaxed);
        *self.slot() = Some((generation, conn.clone()));
        Ok((generation, conn))
    }

    /// Connects (if need be) and sends `PING`, so that a refused password shows now.
    pub(crate) async fn ping(&self, deadline: Instant) -> Result<(), StoreError> {
        let op = "connecting";
        let (generation, mut conn) = self.conn(op, deadline).await?;
        match timeout_at(deadline, redis::cmd("PING").query_async::<Value>(&mut conn)).await {
            Err(_) => {
                self.invalidate(generation);
                Err(StoreError::new(
                    StoreErrorKind::Unavailable,
                    BACKEND,
                    format!("{op}: node {} did not answer PING in time", self.name),
                ))
            }
            Ok(Err(e)) => {
                self.invalidate(generation);
                Err(self.map(op, &e, true))
            }
            Ok(Ok(_)) => Ok(()),
        }
    }

    /// The node's `maxmemory-policy` (from `INFO memory`), `None` if it does not say.
    pub(crate) async fn eviction_policy(
        &self,
        deadline: Instant,
    ) -> Result<Option<String>, StoreError> {
        let text = self
            .info("reading the eviction policy", deadline, &["memory"])
            .await?;
        Ok(leasehold_redis::wire::info_field(&text, "maxmemory_policy").map(str::to_owned))
    }

    /// The node's `INFO` of `sections`, by `deadline`.
    pub(crate) async fn info(
        &self,
        op: &str,
        deadline: Instant,
        sections: &[&str],
    ) -> Result<String, StoreError> {
        let (generation, mut conn) = self.conn(op, deadline).await?;
        let mut info = redis::cmd("INFO");
        for s in sections {
            info.arg(*s);
        }
        match timeout_at(deadline, info.query_async::<String>(&mut conn)).await {
            Err(_) => {
                self.invalidate(generation);
                Err(StoreError::new(
                    StoreErrorKind::Unavailable,
                    BACKEND,
                    format!("{op}: node {} did not answer INFO in time", self.name),
                ))
            }
            Ok(Err(e)) => {
                self.invalidate(generation);
                Err(self.map(op, &e, true))
            }
            Ok(Ok(text)) => Ok(text),
        }
    }

    /// The keys of the node matching `pattern` (`SCAN MATCH`, cursor to the end), each
    /// round trip bounded by `bound`; keys that are not UTF-8 are left out. A failure drops
    /// the connection (a reply still on its way would be taken for the next request's).
    pub(crate) async fn scan(
        &self,
        op: &str,
        pattern: &str,
        bound: std::time::Duration,
    ) -> Result<Vec<String>, StoreError> {
        let mut cursor = 0u64;
        let mut keys = Vec::new();
        loop {
            let deadline = Instant::now() + bound;
            let (generation, mut conn) = self.conn(op, deadline).await?;
            let cmd = scan_step(cursor, pattern);
            let in_flight = Armed::new(|| self.invalidate(generation));
            let res = timeout_at(deadline, cmd.query_async::<(u64, Vec<Vec<u8>>)>(&mut conn)).await;
            in_flight.disarm();
            match res {
                Err(_) => {
                    self.invalidate(generation);
                    return Err(StoreError::new(
                        StoreErrorKind::Timeout,
                        BACKEND,
                        format!("{op}: node {} did not answer SCAN in time", self.name),
                    ));
                }
                Ok(Err(e)) => {
                    self.invalidate(generation);
                    return Err(self.map(op, &e, false));
                }
                Ok(Ok((next, found))) => {
                    keys.extend(found.into_iter().filter_map(|k| String::from_utf8(k).ok()));
                    if next == 0 {
                        return Ok(keys);
                    }
                    cursor = next;
                }
            }
        }
    }

    /// The node's name (`host:port`).
    pub(crate) fn name(&self) -> &str {
        &self.name
    }

    /// Runs `lua` with `keys` and `[request id] + args` (text, or a record's value: any
    /// bytes) by `deadline` and parses the reply. A timeout, a broken connection or a reply
    /// to another request drops the connection (the next call opens a new one).
    pub(crate) async fn run<T, A: AsRef<[u8]>>(
        &self,
        op: &str,
        deadline: Instant,
        lua: &Lua<T>,
        keys: &[&str],
        args: &[A],
    ) -> Result<T, StoreError> {
        let (generation, mut conn) = self.conn(op, deadline).await?;
        let id = self.next_id.fetch_add(1, Ordering::Relaxed).to_string();
        let cmd = eval_cmd(&lua.script, keys, &id, args);
        let in_flight = Armed::new(|| self.invalidate(generation));
        let res = timeout_at(deadline, eval(&lua.script, &cmd, &mut conn)).await;
        in_flight.disarm();
        let value = match res {
            Err(_) => {
                self.invalidate(generation);
                return Err(StoreError::new(
                    StoreErrorKind::Timeout,
                    BACKEND,
                    format!(
                        "{op}: node {} did not answer in time; it may have applied the request",
                        self.name
                    ),
                ));
            }
            Ok(Err(e)) => {
                if e.is_io_error() || e.is_unrecoverable_error() || e.is_connection_dropped() {
                    self.invalidate(generation);
                }
                return Err(self.map(op, &e, false));
            }
            Ok(Ok(v)) => v,
        };
        (lua.parse)(&value, &id).map_err(|e| match e {
            // Every script answers an array that starts with the request's id: a reply that
            // is no array carries no id, so it is another request's reply as surely as one
            // with another id (a connection that lost bytes answers out of step).
            ReplyError::WrongId | ReplyError::Shape("not an array") => {
                self.invalidate(generation);
                StoreError::new(
                    StoreErrorKind::Ambiguous,
                    BACKEND,
                    format!(
                        "{op}: node {}: the reply belongs to another request (the connection \
                         lost bytes); the connection was dropped and the request may have been applied",
                        self.name
                    ),
                )
            }
            ReplyError::Shape(what) => StoreError::new(
                StoreErrorKind::Corrupt,
                BACKEND,
                format!("{op}: node {}: unexpected reply ({what})", self.name),
            ),
        })
    }

    /// Maps a `redis` error; `connecting`: nothing was sent yet.
    fn map(&self, op: &str, e: &RedisError, connecting: bool) -> StoreError {
        use StoreErrorKind as K;
        // A failed TLS handshake: the URL, the certificates or the node must change.
        if connecting && let Some(tls) = leasehold_redis::tls::failure_of(e, &self.host) {
            return StoreError::new(K::Config, BACKEND, format!("{op}: node {}", self.name))
                .with_source(tls);
        }
        let mut detail = e.to_string();
        if let Some(s) = self.secret.as_deref().filter(|s| !s.is_empty()) {
            detail = detail.replace(s, "<redacted>");
        }
        // A command refused by the ACL inside a script comes back as a plain error.
        let refused_in_script = detail.contains("can't run this command")
            || detail.contains("No permissions to access a key");
        let (kind, what) = match (e.code(), e.kind()) {
            (Some(CORRUPT_CODE), _) => (
                K::Corrupt,
                "the node holds data that is not leasehold's (a lease, fence or record) at this key",
            ),
            (Some(FORMAT_CODE), _) => (
                K::Config,
                "the key was written in a newer leasehold store format: upgrade this client",
            ),
            (Some("WRONGTYPE"), _) => (K::Corrupt, "a key of the wrong type is in the way"),
            (Some("NOAUTH" | "WRONGPASS"), _) | (_, ErrorKind::AuthenticationFailed) => {
                (K::Config, AUTH_FAILED)
            }
            (Some("NOPERM"), _) | (_, ErrorKind::Server(ServerErrorKind::NoPerm)) => {
                (K::Config, ACL_NEEDS)
            }
            _ if refused_in_script => (K::Config, ACL_NEEDS),
            (Some("BUSY" | "LOADING" | "TRYAGAIN" | "MASTERDOWN" | "OOM"), _) => {
                (K::Busy, "the node refused the request for now")
            }
            (Some("READONLY"), _) => (
                K::Config,
                "the node is a read-only replica: a Redlock node must be an independent primary",
            ),
            _ if connecting
                && self.no_client_cert
                && e.is_connection_dropped()
                && !e.is_connection_refusal()
                && !e.is_timeout() =>
            {
                (
                    K::Unavailable,
                    "the node closed the TLS connection while connecting (does it require a client certificate? give tls_cert= and tls_key=)",
                )
            }
            _ if connecting => (K::Unavailable, "could not connect"),
            _ if e.is_io_error() || e.is_connection_dropped() => (
                K::Ambiguous,
                "the connection broke; the request may have been applied",
            ),
            _ => (K::Other, "the request failed"),
        };
        let error = StoreError::new(
            kind,
            BACKEND,
            format!("{op}: node {}: {what} ({detail})", self.name),
        );
        if what == AUTH_FAILED {
            error.refused(Refusal::Credentials)
        } else if what == ACL_NEEDS {
            error.refused(Refusal::Permission)
        } else {
            error
        }
    }
}
