//! Connections: one multiplexed connection (standalone) or one cluster connection, replaced
//! after any I/O error or timeout.
//!
//! Why not `redis::aio::ConnectionManager`: it reconnects after a *broken* connection but
//! keeps using a connection whose request timed out. A connection on which a request got
//! no reply is suspect (a half-open TCP connection to a vanished host answers nothing
//! until the kernel gives up, minutes later; a middlebox that lost bytes shifts every
//! later reply by one), so this holder drops it and connects afresh on the next call.
//! Connecting is lazy, serialised (one attempt at a time) and bounded by the connect
//! timeout; there is no background retry loop.
//!
//! A new connection is used only after the server's `maxmemory-policy` has been read
//! (`INFO memory`; on a Cluster, on every primary) and found not to evict keys, or the
//! configuration accepts eviction (docs/faults.md row 25). The policy is read again, before the
//! next operation, once the last check is older than the configured `policy_check`: it
//! finds a policy changed on a running server, and Cluster nodes that the cluster client
//! reconnected (or discovered) by itself, which this holder cannot see.

use std::future::Future;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use redis::aio::MultiplexedConnection;
use redis::cluster_async::ClusterConnection;
use redis::{AsyncConnectionConfig, Client, RedisError, RedisResult, Script, Value};
use tokio::time::{Instant, timeout, timeout_at};

use leasehold_core::{StoreError, StoreErrorKind};

use crate::BACKEND;
use crate::clocks::{self, ReplicaClocks};
use crate::config::{NodeAddr, RedisConfig, Topology};
#[cfg(feature = "tls")]
use crate::discovery::tls_certificates;
use crate::discovery::{Discovery, client_for, is_primary, node_info};
use crate::error::{self, Phase};
use crate::policy;
use crate::scripts::{Armed, Reply, ReplyError};
use crate::wire::{eval, eval_cmd};

/// How long a refusal for an evicting policy is remembered: calls within it fail at once
/// instead of each connecting and asking again (a burst of heartbeats would otherwise
/// open one connection after the other). Shorter when `policy_check` is.
const REFUSAL_HOLD: Duration = Duration::from_secs(1);

/// The current connection, its generation, and when its server's eviction policy was
/// last found acceptable.
struct Slot<C> {
    generation: u64,
    conn: C,
    checked: Instant,
}

/// The current connection and its generation.
struct Holder<C> {
    current: Mutex<Option<Slot<C>>>,
    connecting: tokio::sync::Mutex<()>,
    generation: AtomicU64,
}

impl<C: Clone> Holder<C> {
    fn new() -> Self {
        Self {
            current: Mutex::new(None),
            connecting: tokio::sync::Mutex::new(()),
            generation: AtomicU64::new(0),
        }
    }

    /// The current connection, if any, and whether its check is older than `max_age`
    /// (`None`: never re-checked).
    fn peek(&self, max_age: Option<Duration>) -> Option<(u64, C, bool)> {
        self.current
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .as_ref()
            .map(|s| {
                let due = max_age.is_some_and(|age| s.checked.elapsed() >= age);
                (s.generation, s.conn.clone(), due)
            })
    }

    /// The current connection, if its check is not due (no older than `max_age`).
    fn ready(&self, max_age: Option<Duration>) -> Option<(u64, C)> {
        match self.peek(max_age) {
            Some((g, c, false)) => Some((g, c)),
            _ => None,
        }
    }

    /// The current connection, checked again with `check` when its last check is older
    /// than `max_age`; or a new one from `connect`, used only once `check` accepts it.
    /// A connection that fails its check is dropped, so the next call connects and checks
    /// afresh. Cancel safe: a dropped call leaves no connection half set up, and a
    /// connection whose check was cancelled in flight is dropped.
    async fn get<F, Fut, K, KFut>(
        &self,
        max_age: Option<Duration>,
        connect: F,
        check: K,
    ) -> Result<(u64, C), StoreError>
    where
        F: FnOnce() -> Fut,
        Fut: Future<Output = Result<C, StoreError>>,
        K: FnOnce(C) -> KFut,
        KFut: Future<Output = Result<(), StoreError>>,
    {
        if let Some(ready) = self.ready(max_age) {
            return Ok(ready);
        }
        let _one_at_a_time = self.connecting.lock().await;
        match self.peek(max_age) {
            Some((g, c, false)) => return Ok((g, c)),
            Some((g, c, true)) => {
                // Dropped unless checked: the check failed or was cancelled in flight.
                let dropped_unless_checked = Armed::new(|| self.invalidate(g));
                check(c.clone()).await?;
                dropped_unless_checked.disarm();
                if let Some(s) = self
                    .current
                    .lock()
                    .unwrap_or_else(|e| e.into_inner())
                    .as_mut()
                    .filter(|s| s.generation == g)
                {
                    s.checked = Instant::now();
                }
                return Ok((g, c));
            }
            None => {}
        }
        let conn = connect().await?;
        check(conn.clone()).await?;
        let generation = self.generation.fetch_add(1, Ordering::Relaxed) + 1;
        *self.current.lock().unwrap_or_else(|e| e.into_inner()) = Some(Slot {
            generation,
            conn: conn.clone(),
            checked: Instant::now(),
        });
        Ok((generation, conn))
    }

    /// Drops the current connection, whatever its generation.
    fn invalidate_current(&self) {
        if self
            .current
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .take()
            .is_some()
        {
            tracing::info!("redis primary changed (Sentinel); the next call reconnects");
        }
    }

    /// Drops the connection of `generation` if it is still the current one.
    fn invalidate(&self, generation: u64) {
        let mut cur = self.current.lock().unwrap_or_else(|e| e.into_inner());
        if cur.as_ref().is_some_and(|s| s.generation == generation) {
            *cur = None;
            tracing::debug!(
                generation,
                "redis connection dropped; the next call reconnects"
            );
        }
    }
}

enum Kind {
    Standalone {
        client: Client,
        config: AsyncConnectionConfig,
        holder: Holder<MultiplexedConnection>,
    },
    Cluster {
        client: redis::cluster::ClusterClient,
        holder: Holder<ClusterConnection>,
    },
    /// A primary found through Sentinel: the connection is a standalone one.
    Sentinel {
        discovery: Arc<Discovery>,
        config: AsyncConnectionConfig,
        holder: Arc<Holder<MultiplexedConnection>>,
        /// The primary the current connection reached.
        primary: Arc<Mutex<Option<NodeAddr>>>,
        /// The task that listens for the sentinels' `+switch-master` (started with the
        /// first connection).
        watcher: Mutex<Option<tokio::task::AbortHandle>>,
        /// The replicas' clock offsets (measured on every new connection and by
        /// `clock_task`).
        clocks: Arc<ReplicaClocks>,
        /// The task that measures the replicas' clocks every `clock_check` (started with
        /// the first connection).
        clock_task: Mutex<Option<tokio::task::AbortHandle>>,
    },
}

impl Drop for Conn {
    fn drop(&mut self) {
        if let Kind::Sentinel {
            watcher,
            clock_task,
            ..
        } = &self.kind
        {
            for task in [watcher, clock_task] {
                if let Some(task) = task.lock().unwrap_or_else(|e| e.into_inner()).take() {
                    task.abort();
                }
            }
        }
    }
}

/// Listens on the sentinels (each in turn) for `+switch-master` of our primary and drops
/// the store's connection when it comes, so that no call goes to a demoted primary in the
/// moment before it is reconfigured as a replica (a write it took then would be lost).
/// A (re)subscription drops it too: a switch may have been missed meanwhile. Ends when the
/// store is gone.
async fn watch_switches(
    discovery: Arc<Discovery>,
    holder: std::sync::Weak<Holder<MultiplexedConnection>>,
) {
    use futures::StreamExt;
    let mut i = 0usize;
    loop {
        let (addr, client) = &discovery.sentinels[i % discovery.sentinels.len()];
        i = i.wrapping_add(1);
        let subscribed = async {
            let mut pubsub = client.get_async_pubsub().await?;
            pubsub.subscribe("+switch-master").await?;
            Ok::<_, RedisError>(pubsub)
        };
        match timeout(discovery.cfg.connect_timeout(), subscribed).await {
            Ok(Ok(mut pubsub)) => {
                let Some(h) = holder.upgrade() else { return };
                h.invalidate_current();
                drop(h);
                let mut messages = pubsub.on_message();
                while let Some(msg) = messages.next().await {
                    let Some(h) = holder.upgrade() else { return };
                    let payload: String = msg.get_payload().unwrap_or_default();
                    if payload.split(' ').next() == Some(discovery.master.as_str()) {
                        h.invalidate_current();
                    }
                }
                tracing::debug!(sentinel = %addr, "sentinel subscription ended; trying the next");
            }
            Ok(Err(e)) => {
                let e = error::scrub_all(&e.to_string(), &discovery.cfg.secrets());
                tracing::debug!(sentinel = %addr, error = %e, "cannot subscribe to the sentinel's +switch-master");
            }
            Err(_) => tracing::debug!(sentinel = %addr, "sentinel did not answer in time"),
        }
        if holder.strong_count() == 0 {
            return;
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
}

/// The store's connection to Redis.
pub(crate) struct Conn {
    kind: Kind,
    /// For the dedicated connections that check each Cluster primary's policy.
    config: RedisConfig,
    op_timeout: Duration,
    connect_timeout: Duration,
    /// Whether an evicting `maxmemory-policy` is accepted (with a warning).
    allow_eviction: bool,
    /// Re-check interval of the policy (`None` when eviction is accepted).
    policy_check: Option<Duration>,
    /// Whether a policy check has succeeded once: until then every Cluster primary must
    /// answer it; afterwards, one that cannot be reached is skipped (it cannot grant while
    /// unreachable) and checked again at the next check.
    checked_once: AtomicBool,
    /// The last refusal for an evicting policy, and when.
    refused: Mutex<Option<(Instant, crate::EvictingPolicy)>>,
    secret: Option<String>,
    next_id: AtomicU64,
    /// A `redis::Client` for a dedicated pub/sub connection (standalone: the server;
    /// cluster: each seed in turn — classic pub/sub messages reach every node).
    pubsub_clients: Vec<Client>,
}

impl std::fmt::Debug for Conn {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Conn")
            .field(
                "kind",
                &match self.kind {
                    Kind::Standalone { .. } => "standalone",
                    Kind::Cluster { .. } => "cluster",
                    Kind::Sentinel { .. } => "sentinel",
                },
            )
            .field("op_timeout", &self.op_timeout)
            .finish_non_exhaustive()
    }
}

/// The Cluster client's settings for `seeds` (the store's client and the sharded pub/sub
/// client share them).
fn cluster_builder(
    cfg: &RedisConfig,
    seeds: &[crate::config::NodeAddr],
) -> Result<redis::cluster::ClusterClientBuilder, StoreError> {
    let infos = seeds
        .iter()
        .map(|s| node_info(cfg, s))
        .collect::<Result<Vec<_>, _>>()?;
    let mut b = redis::cluster::ClusterClientBuilder::new(infos)
        .connection_timeout(cfg.connect_timeout())
        .response_timeout(cfg.op_timeout())
        .overall_response_timeout(Some(cfg.op_timeout()))
        .retries(cfg.cluster_retries())
        .min_retry_wait(10)
        .max_retry_wait(200);
    if !cfg.address_map().is_empty() {
        b = b.node_address_map(
            cfg.address_map()
                .iter()
                .map(|(from, to)| {
                    (
                        redis::cluster::NodeAddress::new(from.host.as_str(), from.port),
                        redis::cluster::NodeAddress::new(to.host.as_str(), to.port),
                    )
                })
                .collect(),
        );
    }
    #[cfg(feature = "tls")]
    if let Some(certs) = tls_certificates(cfg)? {
        b = b.certs(certs);
    }
    Ok(b)
}

/// `fut` within `limit`; running out of time is an I/O error (timed out), as a failure
/// to connect is.
async fn within<T>(limit: Duration, fut: impl Future<Output = RedisResult<T>>) -> RedisResult<T> {
    timeout(limit, fut)
        .await
        .unwrap_or_else(|e| Err(RedisError::from(std::io::Error::from(e))))
}

impl Conn {
    /// Prepares the connection (does not connect yet).
    pub(crate) fn new(cfg: &RedisConfig) -> Result<Self, StoreError> {
        let secret = cfg.password().map(|p| p.expose().to_owned());
        let (kind, pubsub_clients) = match cfg.topology() {
            Topology::Sentinel { sentinels, master } => (
                Kind::Sentinel {
                    discovery: Arc::new(Discovery::new(cfg, sentinels, master)?),
                    config: AsyncConnectionConfig::new()
                        .set_connection_timeout(Some(cfg.connect_timeout()))
                        .set_response_timeout(None),
                    holder: Arc::new(Holder::new()),
                    primary: Arc::new(Mutex::new(None)),
                    watcher: Mutex::new(None),
                    clocks: Arc::new(ReplicaClocks::new(cfg.max_clock_offset())),
                    clock_task: Mutex::new(None),
                },
                Vec::new(),
            ),
            Topology::Standalone { node } => {
                let client = client_for(cfg, node)?;
                // No per-command response timeout inside the connection: every operation
                // runs under one deadline of its own (see `run`), which also covers the
                // NOSCRIPT reload, and a request that misses it drops the connection.
                let config = AsyncConnectionConfig::new()
                    .set_connection_timeout(Some(cfg.connect_timeout()))
                    .set_response_timeout(None);
                (
                    Kind::Standalone {
                        client: client.clone(),
                        config,
                        holder: Holder::new(),
                    },
                    vec![client],
                )
            }
            Topology::Cluster { seeds } => {
                let client = cluster_builder(cfg, seeds)?.build().map_err(|e| {
                    error::map(
                        "configuring the cluster client",
                        Phase::Connect,
                        &e,
                        secret.as_deref(),
                    )
                })?;
                let pubsub = seeds
                    .iter()
                    .map(|s| client_for(cfg, s))
                    .collect::<Result<Vec<_>, _>>()?;
                (
                    Kind::Cluster {
                        client,
                        holder: Holder::new(),
                    },
                    pubsub,
                )
            }
        };
        let seed = u64::from_le_bytes(
            leasehold_core::OwnerToken::random().as_bytes()[..8]
                .try_into()
                .expect("8 bytes"),
        );
        Ok(Self {
            kind,
            config: cfg.clone(),
            op_timeout: cfg.op_timeout(),
            connect_timeout: cfg.connect_timeout(),
            allow_eviction: cfg.allow_eviction(),
            policy_check: (!cfg.allow_eviction()).then(|| cfg.policy_check()),
            checked_once: AtomicBool::new(false),
            refused: Mutex::new(None),
            secret,
            next_id: AtomicU64::new(seed >> 12),
            pubsub_clients,
        })
    }

    pub(crate) fn op_timeout(&self) -> Duration {
        self.op_timeout
    }

    pub(crate) fn connect_timeout(&self) -> Duration {
        self.connect_timeout
    }

    pub(crate) fn secret(&self) -> Option<&str> {
        self.secret.as_deref()
    }

    /// How the store's waiters hear releases: classic pub/sub on a dedicated connection
    /// (a single server; a Cluster with `sharded_pubsub=false`), or sharded pub/sub on a
    /// Cluster connection of its own (RESP3), whose pushes arrive on the returned channel.
    pub(crate) fn pubsub_transport(&self) -> Result<crate::notify::Transport, StoreError> {
        match self.config.topology() {
            Topology::Cluster { seeds } if self.config.sharded_pubsub() => {
                let (tx, rx) = tokio::sync::mpsc::unbounded_channel();
                let client = cluster_builder(&self.config, seeds)?
                    .use_protocol(redis::ProtocolVersion::RESP3)
                    .push_sender(tx)
                    .build()
                    .map_err(|e| {
                        error::map(
                            "configuring the sharded pub/sub client",
                            Phase::Connect,
                            &e,
                            self.secret(),
                        )
                    })?;
                Ok(crate::notify::Transport::Sharded {
                    client: Box::new(client),
                    pushes: Mutex::new(Some(rx)),
                })
            }
            _ => match &self.kind {
                Kind::Sentinel { discovery, .. } => {
                    Ok(crate::notify::Transport::Sentinel(discovery.clone()))
                }
                _ => Ok(crate::notify::Transport::Classic(
                    self.pubsub_clients.clone(),
                )),
            },
        }
    }

    /// Whether the primary is found through Sentinel.
    pub(crate) fn is_sentinel(&self) -> bool {
        matches!(self.kind, Kind::Sentinel { .. })
    }

    pub(crate) fn is_cluster(&self) -> bool {
        matches!(self.kind, Kind::Cluster { .. })
    }

    fn map(&self, op: &str, phase: Phase, e: &RedisError) -> StoreError {
        // The host a TLS failure is for, when the error does not name it.
        let host = match self.config.topology() {
            Topology::Standalone { node } => Some(self.config.map_addr(node).host),
            // The cluster client's error for its first connection does not say which seed
            // failed: when every seed is on one host, the failure is that host's.
            Topology::Cluster { seeds } => {
                let mut hosts = seeds.iter().map(|s| self.config.map_addr(s).host);
                let first = hosts.next();
                first.filter(|h| hosts.all(|o| o == *h))
            }
            Topology::Sentinel { .. } => None,
        };
        error::map_at(
            op,
            phase,
            e,
            &self.config.secrets(),
            host.as_deref(),
            self.config.tls_without_client_cert(),
        )
    }

    /// Connects now (used by `open` so that a bad address or password is reported at once).
    pub(crate) async fn connect(&self) -> Result<(), StoreError> {
        let deadline = Instant::now() + self.connect_timeout;
        self.handle(deadline, "connecting").await.map(|_| ())
    }

    async fn handle(&self, deadline: Instant, op: &str) -> Result<Handle, StoreError> {
        if let Some(h) = self.ready() {
            return Ok(h);
        }
        // Boxed: connecting (and, under Sentinel, discovery and the replicas' clocks) is
        // several KB of state that every call's future would otherwise carry and copy, for
        // a path few calls take.
        Box::pin(self.connect_handle(deadline, op)).await
    }

    /// The current connection, when there is one whose check is not due: what
    /// [`handle`](Self::handle) returns without connecting or checking.
    fn ready(&self) -> Option<Handle> {
        let age = self.policy_check;
        match &self.kind {
            Kind::Standalone { holder, .. } => {
                holder.ready(age).map(|(g, c)| Handle::Standalone(g, c))
            }
            Kind::Sentinel { holder, .. } => {
                holder.ready(age).map(|(g, c)| Handle::Standalone(g, c))
            }
            Kind::Cluster { holder, .. } => holder.ready(age).map(|(g, c)| Handle::Cluster(g, c)),
        }
    }

    /// [`handle`](Self::handle)'s way when no checked connection is ready: connects (one
    /// caller at a time) or checks the current connection again.
    async fn connect_handle(&self, deadline: Instant, op: &str) -> Result<Handle, StoreError> {
        let ct = self.connect_timeout;
        let connect_failed = |e: RedisError| self.map(op, Phase::Connect, &e);
        // Called under the holder's connect lock, so that callers queued behind a refusal
        // see it.
        let refused_recently = || self.refused_recently(op);
        let got = timeout_at(deadline, async {
            match &self.kind {
                Kind::Standalone {
                    client,
                    config,
                    holder,
                } => holder
                    .get(
                        self.policy_check,
                        || async {
                            refused_recently()?;
                            within(
                                ct,
                                client.get_multiplexed_async_connection_with_config(config),
                            )
                            .await
                            .map_err(connect_failed)
                        },
                        |c| self.check_standalone(op, c),
                    )
                    .await
                    .map(|(g, c)| Handle::Standalone(g, c)),
                Kind::Cluster { client, holder } => holder
                    .get(
                        self.policy_check,
                        || async {
                            refused_recently()?;
                            within(ct, client.get_async_connection())
                                .await
                                .map_err(connect_failed)
                        },
                        |c| self.check_cluster(op, c),
                    )
                    .await
                    .map(|(g, c)| Handle::Cluster(g, c)),
                Kind::Sentinel {
                    discovery,
                    config,
                    holder,
                    primary,
                    watcher,
                    clocks,
                    clock_task,
                } => holder
                    .get(
                        self.policy_check,
                        || async {
                            refused_recently()?;
                            let (node, conn) = discovery.connect_primary(config).await?;
                            *primary.lock().unwrap_or_else(|e| e.into_inner()) = Some(node);
                            {
                                let mut w = watcher.lock().unwrap_or_else(|e| e.into_inner());
                                if w.is_none() {
                                    let task = tokio::spawn(watch_switches(
                                        discovery.clone(),
                                        Arc::downgrade(holder),
                                    ));
                                    *w = Some(task.abort_handle());
                                }
                            }
                            {
                                let mut t = clock_task.lock().unwrap_or_else(|e| e.into_inner());
                                if t.is_none() {
                                    let task = tokio::spawn(clocks::watch(
                                        Arc::downgrade(clocks),
                                        self.config.clone(),
                                        primary.clone(),
                                        self.config.clock_check(),
                                    ));
                                    *t = Some(task.abort_handle());
                                }
                            }
                            // The replicas' clocks, before the connection is used (refused
                            // when one is too far ahead).
                            self.measure_clocks(op, &conn, primary, clocks).await?;
                            Ok(conn)
                        },
                        |c| self.check_primary(op, c, primary),
                    )
                    .await
                    .map(|(g, c)| Handle::Standalone(g, c)),
            }
        })
        .await;
        match got {
            Err(_) => Err(StoreError::new(
                StoreErrorKind::Unavailable,
                BACKEND,
                format!(
                    "{op}: could not connect and check the server's eviction policy in time; \
                     nothing was sent"
                ),
            )),
            Ok(r) => r,
        }
    }

    /// The refusal of the last check, again, if it is recent (see [`REFUSAL_HOLD`]).
    fn refused_recently(&self, op: &str) -> Result<(), StoreError> {
        let hold = self
            .policy_check
            .map_or(REFUSAL_HOLD, |p| p.min(REFUSAL_HOLD));
        match &*self.refused.lock().unwrap_or_else(|e| e.into_inner()) {
            Some((at, p)) if at.elapsed() < hold => Err(error::evicting(op, p.node(), p.policy())),
            _ => Ok(()),
        }
    }

    /// Reads `maxmemory-policy` on the server's own connection.
    async fn check_standalone(
        &self,
        op: &str,
        mut c: MultiplexedConnection,
    ) -> Result<(), StoreError> {
        let Topology::Standalone { node } = self.config.topology() else {
            unreachable!("a standalone connection has a standalone topology");
        };
        let reply = policy::info_memory().query_async::<Value>(&mut c).await;
        self.judge(op, &node.to_string(), reply)?;
        self.checked_once.store(true, Ordering::Relaxed);
        Ok(())
    }

    /// Measures the clocks of the replicas of the primary on `conn` (from its `ROLE`) and
    /// refuses the connection when one is too far ahead (see `clocks`).
    async fn measure_clocks(
        &self,
        op: &str,
        conn: &MultiplexedConnection,
        primary: &Mutex<Option<NodeAddr>>,
        clocks: &ReplicaClocks,
    ) -> Result<(), StoreError> {
        let Some(node) = primary.lock().unwrap_or_else(|e| e.into_inner()).clone() else {
            return Ok(());
        };
        let role = redis::cmd("ROLE")
            .query_async::<Value>(&mut conn.clone())
            .await
            .map_err(|e| self.map(op, Phase::Connect, &e))?;
        if !is_primary(&role) {
            // `check_primary` refuses it.
            return Ok(());
        }
        clocks
            .measure(&self.config, &node, conn, clocks::replicas_in_role(&role))
            .await;
        clocks.allowance(op).map(|_| ())
    }

    /// The server the store's data connection reaches: the standalone server, the
    /// primary Sentinel named last (`None` before the first connection), or a Cluster's
    /// first seed.
    pub(crate) fn data_node(&self) -> Option<NodeAddr> {
        match (&self.kind, self.config.topology()) {
            (Kind::Sentinel { primary, .. }, _) => {
                primary.lock().unwrap_or_else(|e| e.into_inner()).clone()
            }
            (_, Topology::Standalone { node }) => Some(node.clone()),
            (_, Topology::Cluster { seeds }) => seeds.first().cloned(),
            (_, Topology::Sentinel { .. }) => None,
        }
    }

    /// How much to take off a TTL the primary is about to grant: the largest amount by
    /// which one of its replicas' clocks is ahead of its own (Sentinel; zero otherwise).
    /// Refused while that is above `max_clock_offset`.
    pub(crate) fn clock_allowance(&self, op: &str) -> Result<Duration, StoreError> {
        match &self.kind {
            Kind::Sentinel { clocks, .. } => clocks.allowance(op),
            _ => Ok(Duration::ZERO),
        }
    }

    /// [`clock_allowance`](Self::clock_allowance) without the limit, for a grant made.
    pub(crate) fn clock_allowance_now(&self) -> Duration {
        match &self.kind {
            Kind::Sentinel { clocks, .. } => clocks.current(),
            _ => Duration::ZERO,
        }
    }

    /// Checks that the server Sentinel named is a primary (`ROLE`; a server demoted by a
    /// fail-over is dropped, and the next call asks the sentinels again), then reads its
    /// `maxmemory-policy`.
    async fn check_primary(
        &self,
        op: &str,
        mut c: MultiplexedConnection,
        primary: &Mutex<Option<NodeAddr>>,
    ) -> Result<(), StoreError> {
        let node = primary
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .as_ref()
            .map_or_else(|| "the primary".to_owned(), NodeAddr::to_string);
        let role = redis::cmd("ROLE")
            .query_async::<Value>(&mut c)
            .await
            .map_err(|e| self.map(op, Phase::Connect, &e))?;
        if !is_primary(&role) {
            return Err(StoreError::new(
                StoreErrorKind::Unavailable,
                BACKEND,
                format!(
                    "{op}: {node}, named primary by Sentinel, is not a primary (a fail-over is under way); ask again"
                ),
            ));
        }
        let reply = policy::info_memory().query_async::<Value>(&mut c).await;
        self.judge(op, &node, reply)?;
        self.checked_once.store(true, Ordering::Relaxed);
        Ok(())
    }

    /// Reads `maxmemory-policy` on every primary that `CLUSTER SLOTS` lists, each on a
    /// dedicated short-lived connection (so that a primary that does not answer leaves no
    /// suspect request on the cluster connection), all at once, each within the connect
    /// timeout.
    async fn check_cluster(&self, op: &str, mut c: ClusterConnection) -> Result<(), StoreError> {
        let slots = c
            .route_command(
                redis::cmd("CLUSTER").arg("SLOTS").clone(),
                redis::cluster_routing::RoutingInfo::SingleNode(
                    redis::cluster_routing::SingleNodeRoutingInfo::Random,
                ),
            )
            .await
            .map_err(|e| self.map(op, Phase::Connect, &e))?;
        let primaries = policy::cluster_primaries(&slots).ok_or_else(|| {
            StoreError::new(
                StoreErrorKind::Other,
                BACKEND,
                format!("{op}: unexpected CLUSTER SLOTS reply"),
            )
        })?;
        let config = AsyncConnectionConfig::new()
            .set_connection_timeout(Some(self.connect_timeout))
            .set_response_timeout(None);
        let replies = futures::future::join_all(primaries.iter().map(|node| {
            let config = &config;
            async move {
                let client = client_for(&self.config, node)?;
                let asked = async {
                    let mut conn = client
                        .get_multiplexed_async_connection_with_config(config)
                        .await?;
                    policy::info_memory().query_async::<Value>(&mut conn).await
                };
                Ok::<_, StoreError>(within(self.connect_timeout, asked).await)
            }
        }))
        .await;
        let first = !self.checked_once.load(Ordering::Relaxed);
        for (node, reply) in primaries.iter().zip(replies) {
            let node = node.to_string();
            let reply = reply?;
            if let Err(e) = &reply
                && !first
                && !error::is_noperm(e)
                && self.map(op, Phase::Connect, e).is_retryable()
            {
                // It cannot grant a lease while we cannot reach it either; checked again
                // at the next check.
                tracing::warn!(node = %node, error = %error::scrub(&e.to_string(), self.secret()), "redis cluster primary not reachable to check its maxmemory-policy; checked again at the next check");
                continue;
            }
            self.judge(op, &node, reply)?;
        }
        self.checked_once.store(true, Ordering::Relaxed);
        Ok(())
    }

    /// Accepts or refuses a server from its `INFO memory` reply.
    fn judge(&self, op: &str, node: &str, reply: RedisResult<Value>) -> Result<(), StoreError> {
        let policy = match reply {
            Ok(v) => policy::policy_from_info(&v),
            Err(e) if error::is_noperm(&e) => {
                if self.allow_eviction {
                    tracing::warn!(node = %node, "redis maxmemory-policy not readable (INFO is not allowed for this user); eviction accepted by allow_eviction=true: exclusion can break, only fences protect the data");
                    return Ok(());
                }
                return Err(StoreError::new(
                    StoreErrorKind::Config,
                    BACKEND,
                    format!(
                        "{op}: cannot read maxmemory-policy on {node}: the server's ACL does not \
                         allow INFO for this user; grant it `+info` (see the README's ACL \
                         line), or accept eviction explicitly with the URL parameter \
                         allow_eviction=true, knowing that exclusion can then break and only \
                         the fence protects the data"
                    ),
                )
                .with_source(error::Cause::scrubbed(&e, self.secret())));
            }
            Err(e) => return Err(self.map(op, Phase::Connect, &e)),
        };
        match policy {
            Some(p) if policy::is_safe(&p) => {
                tracing::debug!(node = %node, policy = %p, "redis maxmemory-policy does not evict");
                *self.refused.lock().unwrap_or_else(|e| e.into_inner()) = None;
                Ok(())
            }
            Some(p) if self.allow_eviction => {
                tracing::warn!(node = %node, policy = %p, "redis maxmemory-policy may evict held lease keys; accepted by allow_eviction=true: exclusion can break, only fences protect the data");
                Ok(())
            }
            Some(p) => {
                tracing::warn!(node = %node, policy = %p, "redis maxmemory-policy may evict held lease keys; refusing the server (see allow_eviction)");
                *self.refused.lock().unwrap_or_else(|e| e.into_inner()) =
                    Some((Instant::now(), crate::EvictingPolicy::new(node, &p)));
                Err(error::evicting(op, node, &p))
            }
            None if self.allow_eviction => {
                tracing::warn!(node = %node, "redis maxmemory-policy unknown (INFO memory does not report it); eviction accepted by allow_eviction=true");
                Ok(())
            }
            None => Err(error::policy_unknown(
                op,
                node,
                "`INFO memory` does not report maxmemory_policy",
            )),
        }
    }

    fn invalidate(&self, h: &Handle) {
        match (&self.kind, h) {
            (Kind::Standalone { holder, .. }, Handle::Standalone(g, _)) => holder.invalidate(*g),
            (Kind::Cluster { holder, .. }, Handle::Cluster(g, _)) => holder.invalidate(*g),
            (Kind::Sentinel { holder, .. }, Handle::Standalone(g, _)) => holder.invalidate(*g),
            _ => {}
        }
    }

    /// The guard of a request on `h`: drops the connection if the request future is
    /// dropped (cancelled by the caller) between sending and receiving its reply, as a
    /// reply that never arrived leaves the connection suspect, exactly like a timeout.
    fn in_flight(&self, h: &Handle) -> Armed<impl FnOnce() + '_> {
        let generation = h.generation();
        Armed::new(move || match &self.kind {
            Kind::Standalone { holder, .. } => holder.invalidate(generation),
            Kind::Sentinel { holder, .. } => holder.invalidate(generation),
            Kind::Cluster { holder, .. } => holder.invalidate(generation),
        })
    }

    /// A fresh request id (echoed by every script), in decimal, written into `buf` (a
    /// `u64` has at most 20 digits) rather than a string of its own.
    fn request_id<'b>(&self, buf: &'b mut [u8; 20]) -> &'b str {
        use std::io::Write as _;
        let n = self.next_id.fetch_add(1, Ordering::Relaxed);
        let mut rest = &mut buf[..];
        let _ = write!(rest, "{n}");
        let len = 20 - rest.len();
        std::str::from_utf8(&buf[..len]).unwrap_or_default()
    }

    /// Runs `script` with `keys` and `[request id] + args` (text, or a record's value: any
    /// bytes) and parses the reply, all within the operation timeout. Connection-level
    /// failures drop the connection.
    pub(crate) async fn run<T, A: AsRef<[u8]>>(
        &self,
        op: &'static str,
        script: &Script,
        keys: &[&str],
        args: &[A],
        parse: impl FnOnce(&Value, &str) -> Reply<T>,
    ) -> Result<T, StoreError> {
        let deadline = Instant::now() + self.op_timeout;
        self.run_until(deadline, true, op, script, keys, args, parse)
            .await
    }

    /// [`run`](Self::run) for a script that writes nothing (no `WAIT` for replicas).
    pub(crate) async fn run_read<T>(
        &self,
        op: &'static str,
        script: &Script,
        keys: &[&str],
        args: &[&str],
        parse: impl FnOnce(&Value, &str) -> Reply<T>,
    ) -> Result<T, StoreError> {
        let deadline = Instant::now() + self.op_timeout;
        self.run_until(deadline, false, op, script, keys, args, parse)
            .await
    }

    /// [`run`](Self::run) (a script that `writes`) or [`run_read`](Self::run_read), ending
    /// at `deadline` instead of one operation timeout from now (a batch ends when the first
    /// of its operations' callers stops waiting). With `writes` and `min_replicas`, waits
    /// for the replicas after the script.
    #[allow(clippy::too_many_arguments)]
    pub(crate) async fn run_until<T, A: AsRef<[u8]>>(
        &self,
        deadline: Instant,
        writes: bool,
        op: &'static str,
        script: &Script,
        keys: &[&str],
        args: &[A],
        parse: impl FnOnce(&Value, &str) -> Reply<T>,
    ) -> Result<T, StoreError> {
        let mut h = self.handle(deadline, op).await?;
        let mut id = [0; 20];
        let id = self.request_id(&mut id);
        let cmd = eval_cmd(script, keys, id, args);
        let in_flight = self.in_flight(&h);
        let res = match &mut h {
            Handle::Standalone(_, c) => timeout_at(deadline, eval(script, &cmd, c)).await,
            Handle::Cluster(_, c) => timeout_at(deadline, eval(script, &cmd, c)).await,
        };
        in_flight.disarm();
        let value = match res {
            Err(_) => {
                self.invalidate(&h);
                return Err(StoreError::timeout(BACKEND, op, self.op_timeout));
            }
            Ok(Err(e)) => return Err(self.failed(&h, op, &e)),
            Ok(Ok(v)) => v,
        };
        let parsed = parse(&value, id);
        if writes && parsed.is_ok() && self.config.min_replicas() > 0 {
            self.wait_for_replicas(&mut h, deadline, op).await?;
        }
        match parsed {
            Ok(t) => Ok(t),
            Err(ReplyError::WrongId) => {
                self.invalidate(&h);
                Err(StoreError::new(
                    StoreErrorKind::Ambiguous,
                    BACKEND,
                    format!(
                        "{op}: the reply belongs to another request (the connection lost bytes); \
                         the connection was dropped and the request may have been applied"
                    ),
                ))
            }
            Err(ReplyError::Shape(what)) => Err(StoreError::new(
                StoreErrorKind::Corrupt,
                BACKEND,
                format!("{op}: unexpected reply from the script ({what})"),
            )),
        }
    }

    /// Runs a plain command (no script) within the operation timeout, on the node that
    /// `routing` names (cluster) or the server.
    pub(crate) async fn command(
        &self,
        op: &'static str,
        cmd: &redis::Cmd,
        routing: Option<redis::cluster_routing::RoutingInfo>,
    ) -> Result<Value, StoreError> {
        let deadline = Instant::now() + self.op_timeout;
        let mut h = self.handle(deadline, op).await?;
        let in_flight = self.in_flight(&h);
        let res = match (&mut h, routing) {
            (Handle::Standalone(_, c), _) => {
                timeout_at(deadline, cmd.query_async::<Value>(c)).await
            }
            (Handle::Cluster(_, c), Some(r)) => {
                timeout_at(deadline, c.route_command(cmd.clone(), r)).await
            }
            (Handle::Cluster(_, c), None) => {
                timeout_at(deadline, cmd.query_async::<Value>(c)).await
            }
        };
        in_flight.disarm();
        match res {
            Err(_) => {
                self.invalidate(&h);
                Err(StoreError::timeout(BACKEND, op, self.op_timeout))
            }
            Ok(Err(e)) => Err(self.failed(&h, op, &e)),
            Ok(Ok(v)) => Ok(v),
        }
    }

    /// A request's error: connection-level failures drop the connection; `READONLY` (the
    /// server was demoted by a fail-over) drops it too, so that the next call asks
    /// Sentinel again, and is retryable (a replica applied nothing).
    fn failed(&self, h: &Handle, op: &str, e: &RedisError) -> StoreError {
        if e.code() == Some("READONLY") {
            self.invalidate(h);
            return StoreError::new(
                StoreErrorKind::Unavailable,
                BACKEND,
                format!(
                    "{op}: the server is a replica now (a fail-over); nothing was applied, and the next call connects to the current primary"
                ),
            );
        }
        if e.is_io_error() || e.is_unrecoverable_error() {
            self.invalidate(h);
        }
        self.map(op, Phase::Request, e)
    }

    /// `WAIT min_replicas` on the connection that just wrote, bounded by what is left until
    /// `deadline`. Fewer acknowledgements than asked (or no answer) fail closed, as an
    /// ambiguous outcome: the write stands on the primary and may or may not survive a
    /// fail-over.
    async fn wait_for_replicas(
        &self,
        h: &mut Handle,
        deadline: Instant,
        op: &str,
    ) -> Result<(), StoreError> {
        let want = self.config.min_replicas();
        let left_ms = deadline
            .saturating_duration_since(Instant::now())
            .as_millis()
            .clamp(1, u128::from(u32::MAX)) as u64;
        let mut wait = redis::cmd("WAIT");
        wait.arg(want).arg(left_ms);
        let in_flight = self.in_flight(h);
        let res = match h {
            Handle::Standalone(_, c) => timeout_at(deadline, wait.query_async::<i64>(c)).await,
            Handle::Cluster(_, c) => timeout_at(deadline, wait.query_async::<i64>(c)).await,
        };
        in_flight.disarm();
        let acked = match res {
            Ok(Ok(n)) => n,
            Ok(Err(e)) => {
                let e = self.failed(h, op, &e);
                return Err(StoreError::new(
                    StoreErrorKind::Ambiguous,
                    BACKEND,
                    format!(
                        "{op}: applied on the primary, but waiting for its replicas failed: {e}"
                    ),
                ));
            }
            Err(_) => {
                self.invalidate(h);
                -1
            }
        };
        if acked >= i64::from(want) {
            return Ok(());
        }
        Err(StoreError::new(
            StoreErrorKind::Ambiguous,
            BACKEND,
            format!(
                "{op}: applied on the primary, but only {} of the {want} replicas asked for (min_replicas) acknowledged it in time; it may be lost in a fail-over — retry as the same owner",
                acked.max(0)
            ),
        ))
    }
}

enum Handle {
    Standalone(u64, MultiplexedConnection),
    Cluster(u64, ClusterConnection),
}

impl Handle {
    fn generation(&self) -> u64 {
        match self {
            Handle::Standalone(g, _) | Handle::Cluster(g, _) => *g,
        }
    }
}
