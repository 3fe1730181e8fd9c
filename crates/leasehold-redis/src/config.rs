//! [`RedisConfig`]: where the store connects and how, parsed from a URL or built.

use std::fmt;
use std::path::PathBuf;
use std::time::Duration;

use leasehold_core::url::{Secret, percent_decode as pct_decode};
use leasehold_core::{StoreError, StoreErrorKind};

use crate::BACKEND;
use crate::keys::{DEFAULT_PREFIX, validate_prefix};

/// Default per-operation timeout.
pub const DEFAULT_OP_TIMEOUT: Duration = Duration::from_secs(5);
/// Default connect timeout.
pub const DEFAULT_CONNECT_TIMEOUT: Duration = Duration::from_secs(2);
/// Default number of retries the cluster client makes on redirections and transient
/// errors within one operation (the caller's wait is bounded by the operation timeout;
/// the client's own retries may go on after it).
pub const DEFAULT_CLUSTER_RETRIES: u32 = 6;
/// Default time a key's fence record is kept after its last grant (see
/// [`RedisConfigBuilder::fence_retention`]).
pub const DEFAULT_FENCE_RETENTION: Duration = Duration::from_secs(7 * 24 * 3600);

/// Default time a released lease stays reserved for the first waiter in its queue, who
/// must confirm it with an acquire of its own within it (see
/// [`RedisConfigBuilder::queue_grace`]).
pub const DEFAULT_QUEUE_GRACE: Duration = Duration::from_secs(1);

/// The longest fence retention accepted (ten years).
pub const MAX_FENCE_RETENTION: Duration = Duration::from_secs(3650 * 24 * 3600);

/// Default interval at which the store reads `maxmemory-policy` again on a connection it
/// already checked (see [`RedisConfigBuilder::policy_check`]).
pub const DEFAULT_POLICY_CHECK: Duration = Duration::from_secs(10);

/// Default largest amount by which a Sentinel replica's clock may be ahead of the
/// primary's (see [`RedisConfigBuilder::max_clock_offset`]).
pub const DEFAULT_MAX_CLOCK_OFFSET: Duration = Duration::from_millis(500);

/// The largest `max_clock_offset` accepted (one hour).
pub const MAX_CLOCK_OFFSET: Duration = Duration::from_secs(3600);

/// Default interval at which a Sentinel store measures its replicas' clocks again (see
/// [`RedisConfigBuilder::clock_check`]).
pub const DEFAULT_CLOCK_CHECK: Duration = Duration::from_secs(10);

const DEFAULT_PORT: u16 = 6379;

fn config_error(msg: impl Into<String>) -> StoreError {
    StoreError::new(StoreErrorKind::Config, BACKEND, msg)
}

/// A `host:port` pair.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct NodeAddr {
    /// Host name or IP address (IPv6 without brackets).
    pub host: String,
    /// TCP port.
    pub port: u16,
}

impl NodeAddr {
    /// A node address.
    pub fn new(host: impl Into<String>, port: u16) -> Self {
        Self {
            host: host.into(),
            port,
        }
    }
}

impl fmt::Display for NodeAddr {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.host.contains(':') {
            write!(f, "[{}]:{}", self.host, self.port)
        } else {
            write!(f, "{}:{}", self.host, self.port)
        }
    }
}

/// Standalone server or Cluster.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Topology {
    /// One server (a primary).
    Standalone {
        /// The server.
        node: NodeAddr,
    },
    /// A Redis Cluster reached through one or more seed nodes; the client discovers the
    /// rest with `CLUSTER SLOTS` and follows `MOVED`/`ASK` redirections.
    Cluster {
        /// The seed nodes.
        seeds: Vec<NodeAddr>,
    },
    /// A primary (with replicas) found through Redis Sentinel: the store asks the
    /// sentinels for the primary named `master` on every (re)connection, checks that the
    /// server it reaches answers `ROLE` as a primary, and connects again (asking again) on
    /// `READONLY` or a lost connection.
    Sentinel {
        /// The sentinels, asked in turn.
        sentinels: Vec<NodeAddr>,
        /// The name the sentinels monitor the primary under.
        master: String,
    },
}

/// The longest primary name a Sentinel URL may give.
pub const MAX_MASTER_NAME_LEN: usize = 128;

/// The most replicas [`RedisConfigBuilder::min_replicas`] may ask for.
pub const MAX_MIN_REPLICAS: u32 = 16;

/// TLS settings (`rediss://`, `rediss+cluster://`, `rediss+sentinel://`).
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct TlsSettings {
    /// PEM file with the CA certificate(s) to trust instead of the system roots.
    pub ca_file: Option<PathBuf>,
    /// PEM files with a client certificate chain and its private key (mutual TLS).
    pub client_cert: Option<(PathBuf, PathBuf)>,
}

/// How a Sentinel store authenticates to the sentinels themselves (the URL's user and
/// password are the data servers'): see [`RedisConfigBuilder::sentinel_credentials`].
/// `Debug` never shows the password.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub enum SentinelAuth {
    /// No `AUTH` to the sentinels (the default).
    #[default]
    None,
    /// The data servers' user name and password (`sentinel_auth=same`): one secret for
    /// every server of the set, e.g. from the CLI's `--store-password-file`.
    Same,
    /// Credentials of their own (`sentinel_password=…`, `sentinel_username=…`).
    Own {
        /// The sentinels' ACL user, if any (else the `default` user).
        username: Option<String>,
        /// The sentinels' password (`requirepass` or the ACL user's).
        password: Secret,
    },
}

/// Where and how a [`RedisStore`](crate::RedisStore) connects.
///
/// Parse one from a URL with [`RedisConfig::from_url`] (see the crate docs for the URL
/// forms) or build one with [`RedisConfigBuilder`]. The password never appears in `Debug`
/// or `Display` (which prints the URL with the password replaced by `<redacted>`).
#[derive(Clone, PartialEq, Eq)]
pub struct RedisConfig {
    topology: Topology,
    tls: Option<TlsSettings>,
    db: u32,
    username: Option<String>,
    password: Option<Secret>,
    sentinel_auth: SentinelAuth,
    prefix: String,
    op_timeout: Duration,
    connect_timeout: Duration,
    notifications: bool,
    cluster_retries: u32,
    address_map: Vec<(NodeAddr, NodeAddr)>,
    allow_eviction: bool,
    policy_check: Duration,
    fence_retention: Option<Duration>,
    queue_grace: Duration,
    sharded_pubsub: bool,
    batch: bool,
    min_replicas: u32,
    max_clock_offset: Duration,
    clock_check: Duration,
}

impl fmt::Debug for RedisConfig {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RedisConfig")
            .field("topology", &self.topology)
            .field("tls", &self.tls)
            .field("db", &self.db)
            .field("username", &self.username)
            .field("password", &self.password)
            .field("sentinel_auth", &self.sentinel_auth)
            .field("prefix", &self.prefix)
            .field("op_timeout", &self.op_timeout)
            .field("connect_timeout", &self.connect_timeout)
            .field("notifications", &self.notifications)
            .field("cluster_retries", &self.cluster_retries)
            .field("address_map", &self.address_map)
            .field("allow_eviction", &self.allow_eviction)
            .field("policy_check", &self.policy_check)
            .field("fence_retention", &self.fence_retention)
            .field("queue_grace", &self.queue_grace)
            .field("sharded_pubsub", &self.sharded_pubsub)
            .field("batch", &self.batch)
            .field("min_replicas", &self.min_replicas)
            .field("max_clock_offset", &self.max_clock_offset)
            .field("clock_check", &self.clock_check)
            .finish()
    }
}

impl fmt::Display for RedisConfig {
    /// The configuration as a URL, with the password replaced by `<redacted>`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let scheme = match (&self.topology, self.tls.is_some()) {
            (Topology::Standalone { .. }, false) => "redis",
            (Topology::Standalone { .. }, true) => "rediss",
            (Topology::Cluster { .. }, false) => "redis+cluster",
            (Topology::Cluster { .. }, true) => "rediss+cluster",
            (Topology::Sentinel { .. }, false) => "redis+sentinel",
            (Topology::Sentinel { .. }, true) => "rediss+sentinel",
        };
        write!(f, "{scheme}://")?;
        match (&self.username, &self.password) {
            (Some(u), Some(_)) => write!(f, "{}:<redacted>@", pct_encode(u))?,
            (Some(u), None) => write!(f, "{}@", pct_encode(u))?,
            (None, Some(_)) => f.write_str(":<redacted>@")?,
            (None, None) => {}
        }
        match &self.topology {
            Topology::Standalone { node } => write!(f, "{node}/{}", self.db)?,
            Topology::Cluster { seeds } => {
                for (i, s) in seeds.iter().enumerate() {
                    if i > 0 {
                        f.write_str(",")?;
                    }
                    write!(f, "{s}")?;
                }
                f.write_str("/")?;
            }
            Topology::Sentinel { sentinels, master } => {
                for (i, s) in sentinels.iter().enumerate() {
                    if i > 0 {
                        f.write_str(",")?;
                    }
                    write!(f, "{s}")?;
                }
                write!(f, "/{}", pct_encode(master))?;
            }
        }
        write!(
            f,
            "?prefix={}&timeout={}ms&connect_timeout={}ms",
            pct_encode(&self.prefix),
            self.op_timeout.as_millis(),
            self.connect_timeout.as_millis()
        )?;
        if !self.notifications {
            f.write_str("&notify=false")?;
        }
        if self.allow_eviction {
            f.write_str("&allow_eviction=true")?;
        } else {
            write!(f, "&policy_check={}ms", self.policy_check.as_millis())?;
        }
        match self.fence_retention {
            Some(d) if d == DEFAULT_FENCE_RETENTION => {}
            Some(d) => write!(f, "&fence_retention={}ms", d.as_millis())?,
            None => f.write_str("&fence_retention=forever")?,
        }
        if self.queue_grace != DEFAULT_QUEUE_GRACE {
            write!(f, "&queue_grace={}ms", self.queue_grace.as_millis())?;
        }
        if !self.sharded_pubsub && matches!(self.topology, Topology::Cluster { .. }) {
            f.write_str("&sharded_pubsub=false")?;
        }
        if !self.batch {
            f.write_str("&batch=false")?;
        }
        if self.min_replicas > 0 {
            write!(f, "&min_replicas={}", self.min_replicas)?;
        }
        if self.db != 0 && matches!(self.topology, Topology::Sentinel { .. }) {
            write!(f, "&db={}", self.db)?;
        }
        if self.max_clock_offset != DEFAULT_MAX_CLOCK_OFFSET {
            write!(
                f,
                "&max_clock_offset={}ms",
                self.max_clock_offset.as_millis()
            )?;
        }
        if self.clock_check != DEFAULT_CLOCK_CHECK {
            write!(f, "&clock_check={}ms", self.clock_check.as_millis())?;
        }
        match &self.sentinel_auth {
            SentinelAuth::None => {}
            SentinelAuth::Same => f.write_str("&sentinel_auth=same")?,
            SentinelAuth::Own { username, .. } => {
                if let Some(u) = username {
                    write!(f, "&sentinel_username={}", pct_encode(u))?;
                }
                f.write_str("&sentinel_password=<redacted>")?;
            }
        }
        if let Some(tls) = &self.tls {
            if let Some(ca) = &tls.ca_file {
                write!(f, "&tls_ca={}", pct_encode(&ca.to_string_lossy()))?;
            }
            if let Some((cert, key)) = &tls.client_cert {
                write!(
                    f,
                    "&tls_cert={}&tls_key={}",
                    pct_encode(&cert.to_string_lossy()),
                    pct_encode(&key.to_string_lossy())
                )?;
            }
        }
        Ok(())
    }
}

impl RedisConfig {
    /// Parses a store URL (see the crate docs for the forms and parameters).
    ///
    /// Schemes: `redis` (one server), `rediss` (one server over TLS), `redis+cluster`,
    /// `rediss+cluster` (a Cluster, over TLS), `redis+sentinel`, `rediss+sentinel` (a
    /// primary found through Sentinel; with TLS to the sentinels, the primary and the
    /// replicas). `tls_ca`, `tls_cert` and `tls_key` need a TLS scheme;
    /// `sentinel_password`, `sentinel_username` and `sentinel_auth` a Sentinel one.
    ///
    /// # Errors
    /// [`StoreErrorKind::Config`] for a malformed URL, an unknown scheme or parameter, a bad
    /// port, database index, duration or prefix, a TLS or Sentinel parameter on a scheme
    /// without TLS or Sentinel, `tls_cert` without `tls_key` (or the reverse),
    /// `sentinel_username` without `sentinel_password`, or `sentinel_auth=same` with either
    /// or without a password. The message never contains a password.
    ///
    /// # Examples
    ///
    /// ```
    /// use std::time::Duration;
    /// use leasehold_core::StoreErrorKind;
    /// use leasehold_redis::RedisConfig;
    ///
    /// let config = RedisConfig::from_url("redis://leasehold:s3cret@redis.internal:6379/2?prefix=billing:&timeout=1s")?;
    /// assert_eq!(config.prefix(), "billing:");
    /// assert_eq!(config.op_timeout(), Duration::from_secs(1));
    /// assert!(!config.to_string().contains("s3cret")); // Display shows <redacted>
    ///
    /// // A typo must not fall back to a default silently.
    /// let err = RedisConfig::from_url("redis://127.0.0.1/?timout=1s").unwrap_err();
    /// assert_eq!(err.kind(), StoreErrorKind::Config);
    /// # Ok::<(), leasehold_core::StoreError>(())
    /// ```
    pub fn from_url(url: &str) -> Result<Self, StoreError> {
        RedisConfigBuilder::from_url(url)?.build()
    }

    /// A builder holding this configuration, to change some of it.
    pub fn into_builder(self) -> RedisConfigBuilder {
        RedisConfigBuilder { cfg: self }
    }

    /// Standalone or Cluster, and the addresses.
    pub fn topology(&self) -> &Topology {
        &self.topology
    }
    /// Whether this is a Cluster configuration.
    pub fn is_cluster(&self) -> bool {
        matches!(self.topology, Topology::Cluster { .. })
    }
    /// The logical database (`SELECT`); always 0 for a Cluster.
    pub fn db(&self) -> u32 {
        self.db
    }
    /// TLS settings, when TLS is on (`rediss`).
    pub fn tls(&self) -> Option<&TlsSettings> {
        self.tls.as_ref()
    }
    /// The ACL user name, if any.
    pub fn username(&self) -> Option<&str> {
        self.username.as_deref()
    }
    /// Whether a password is set (the password itself is not readable).
    pub fn has_password(&self) -> bool {
        self.password.is_some()
    }
    pub(crate) fn password(&self) -> Option<&Secret> {
        self.password.as_ref()
    }
    /// How the store authenticates to the sentinels (Sentinel only).
    pub fn sentinel_auth(&self) -> &SentinelAuth {
        &self.sentinel_auth
    }
    /// The user name and password the store sends to the sentinels, if any.
    pub(crate) fn sentinel_credentials(&self) -> (Option<&str>, Option<&Secret>) {
        match &self.sentinel_auth {
            SentinelAuth::None => (None, None),
            SentinelAuth::Same => (self.username.as_deref(), self.password.as_ref()),
            SentinelAuth::Own { username, password } => (username.as_deref(), Some(password)),
        }
    }
    /// Whether connections are TLS without a client certificate.
    pub(crate) fn tls_without_client_cert(&self) -> bool {
        self.tls.as_ref().is_some_and(|t| t.client_cert.is_none())
    }
    /// Every secret of the configuration (the data servers' password, the sentinels'),
    /// to scrub from any text shown.
    pub(crate) fn secrets(&self) -> Vec<&str> {
        let mut out: Vec<&str> = self.password.iter().map(Secret::expose).collect();
        if let SentinelAuth::Own { password, .. } = &self.sentinel_auth {
            out.push(password.expose());
        }
        out
    }
    /// The namespace prefix of every Redis key and channel the store uses.
    pub fn prefix(&self) -> &str {
        &self.prefix
    }
    /// The bound on each store operation (connecting included).
    pub fn op_timeout(&self) -> Duration {
        self.op_timeout
    }
    /// The bound on establishing a connection.
    pub fn connect_timeout(&self) -> Duration {
        self.connect_timeout
    }
    /// Whether releases are published and [`wait_released`](leasehold_core::WaitStore::wait_released)
    /// listens for them (pub/sub).
    pub fn notifications(&self) -> bool {
        self.notifications
    }
    /// Retries of the cluster client within one operation.
    pub fn cluster_retries(&self) -> u32 {
        self.cluster_retries
    }
    /// Node address remapping: connect to the second address when the first is named (by
    /// the URL or by the Cluster's `CLUSTER SLOTS`).
    pub fn address_map(&self) -> &[(NodeAddr, NodeAddr)] {
        &self.address_map
    }
    /// Whether an evicting `maxmemory-policy` is accepted (`allow_eviction=true`): see
    /// [`RedisConfigBuilder::allow_eviction`].
    pub fn allow_eviction(&self) -> bool {
        self.allow_eviction
    }
    /// How often the policy is read again on a connection already checked.
    pub fn policy_check(&self) -> Duration {
        self.policy_check
    }

    /// How long a key's fence record is kept after its last grant (`None`: forever). See
    /// [`RedisConfigBuilder::fence_retention`].
    pub fn fence_retention(&self) -> Option<Duration> {
        self.fence_retention
    }

    /// How long a released lease stays reserved for the first waiter in its queue. See
    /// [`RedisConfigBuilder::queue_grace`].
    pub fn queue_grace(&self) -> Duration {
        self.queue_grace
    }
    /// How many replicas must acknowledge every write before it counts
    /// ([`RedisConfigBuilder::min_replicas`]; 0 = the primary's word is enough).
    pub fn min_replicas(&self) -> u32 {
        self.min_replicas
    }
    /// Whether concurrent acquires and releases share script calls
    /// ([`RedisConfigBuilder::batch`]).
    pub fn batch(&self) -> bool {
        self.batch
    }
    /// Whether release notifications use sharded pub/sub (a Cluster only;
    /// [`RedisConfigBuilder::sharded_pubsub`]).
    pub fn sharded_pubsub(&self) -> bool {
        self.sharded_pubsub && matches!(self.topology, Topology::Cluster { .. })
    }
    /// The largest amount by which a Sentinel replica's clock may be ahead of the
    /// primary's ([`RedisConfigBuilder::max_clock_offset`]).
    pub fn max_clock_offset(&self) -> Duration {
        self.max_clock_offset
    }
    /// How often a Sentinel store measures its replicas' clocks again
    /// ([`RedisConfigBuilder::clock_check`]).
    pub fn clock_check(&self) -> Duration {
        self.clock_check
    }

    pub(crate) fn map_addr(&self, addr: &NodeAddr) -> NodeAddr {
        self.address_map
            .iter()
            .find(|(from, _)| from == addr)
            .map(|(_, to)| to.clone())
            .unwrap_or_else(|| addr.clone())
    }
}

/// Builds a [`RedisConfig`]: consuming setters, validated by [`build`](Self::build).
///
/// ```
/// # use std::time::Duration;
/// # use leasehold_redis::RedisConfigBuilder;
/// let cfg = RedisConfigBuilder::standalone("127.0.0.1", 6379)
///     .prefix("billing:leases:")
///     .op_timeout(Duration::from_secs(1))
///     .build()?;
/// assert_eq!(cfg.prefix(), "billing:leases:");
/// # Ok::<(), leasehold_core::StoreError>(())
/// ```
#[derive(Debug, Clone)]
pub struct RedisConfigBuilder {
    cfg: RedisConfig,
}

impl RedisConfigBuilder {
    fn with_topology(topology: Topology) -> Self {
        Self {
            cfg: RedisConfig {
                topology,
                tls: None,
                db: 0,
                username: None,
                password: None,
                sentinel_auth: SentinelAuth::None,
                prefix: DEFAULT_PREFIX.to_owned(),
                op_timeout: DEFAULT_OP_TIMEOUT,
                connect_timeout: DEFAULT_CONNECT_TIMEOUT,
                notifications: true,
                cluster_retries: DEFAULT_CLUSTER_RETRIES,
                address_map: Vec::new(),
                allow_eviction: false,
                policy_check: DEFAULT_POLICY_CHECK,
                fence_retention: Some(DEFAULT_FENCE_RETENTION),
                queue_grace: DEFAULT_QUEUE_GRACE,
                sharded_pubsub: true,
                batch: true,
                min_replicas: 0,
                max_clock_offset: DEFAULT_MAX_CLOCK_OFFSET,
                clock_check: DEFAULT_CLOCK_CHECK,
            },
        }
    }

    /// A standalone server at `host:port`, database 0.
    pub fn standalone(host: impl Into<String>, port: u16) -> Self {
        Self::with_topology(Topology::Standalone {
            node: NodeAddr::new(host, port),
        })
    }

    /// A Cluster reached through `seeds`.
    pub fn cluster(seeds: impl IntoIterator<Item = NodeAddr>) -> Self {
        Self::with_topology(Topology::Cluster {
            seeds: seeds.into_iter().collect(),
        })
    }

    /// A primary named `master`, found through `sentinels`.
    pub fn sentinel(
        sentinels: impl IntoIterator<Item = NodeAddr>,
        master: impl Into<String>,
    ) -> Self {
        Self::with_topology(Topology::Sentinel {
            sentinels: sentinels.into_iter().collect(),
            master: master.into(),
        })
    }

    /// Parses a store URL into a builder.
    ///
    /// # Errors
    /// As [`RedisConfig::from_url`].
    pub fn from_url(url: &str) -> Result<Self, StoreError> {
        parse_url(url)
    }

    /// The logical database (standalone only; `build` rejects it for a Cluster).
    pub fn db(mut self, db: u32) -> Self {
        self.cfg.db = db;
        self
    }
    /// Turns TLS on with these settings (`rediss`).
    pub fn tls(mut self, tls: TlsSettings) -> Self {
        self.cfg.tls = Some(tls);
        self
    }
    /// Turns TLS off.
    pub fn no_tls(mut self) -> Self {
        self.cfg.tls = None;
        self
    }
    /// The ACL user name.
    pub fn username(mut self, user: impl Into<String>) -> Self {
        self.cfg.username = Some(user.into());
        self
    }
    /// The password (`AUTH`).
    pub fn password(mut self, password: impl Into<String>) -> Self {
        self.cfg.password = Some(Secret(password.into()));
        self
    }
    /// Sentinel only: how the store authenticates to the sentinels (default: it does not).
    ///
    /// The URL's user name and password are the data servers' (primary and replicas). A
    /// sentinel with `requirepass` (or an ACL user) needs credentials of its own:
    /// [`SentinelAuth::Own`] (URL parameters `sentinel_password=…` and, for an ACL user,
    /// `sentinel_username=…`), or [`SentinelAuth::Same`] (`sentinel_auth=same`: the data
    /// servers' user name and password, so that one secret, e.g. from a password file,
    /// serves both).
    pub fn sentinel_credentials(mut self, auth: SentinelAuth) -> Self {
        self.cfg.sentinel_auth = auth;
        self
    }
    /// The namespace prefix (default `leasehold:`): no braces, glob characters, whitespace
    /// or control characters, at most 128 bytes.
    pub fn prefix(mut self, prefix: impl Into<String>) -> Self {
        self.cfg.prefix = prefix.into();
        self
    }
    /// The bound on each operation (default 5 s).
    pub fn op_timeout(mut self, d: Duration) -> Self {
        self.cfg.op_timeout = d;
        self
    }
    /// The bound on connecting (default 2 s; an operation that must connect first is still
    /// bounded by the operation timeout).
    pub fn connect_timeout(mut self, d: Duration) -> Self {
        self.cfg.connect_timeout = d;
        self
    }
    /// Whether to publish releases and wait for them with pub/sub (default on).
    pub fn notifications(mut self, on: bool) -> Self {
        self.cfg.notifications = on;
        self
    }
    /// Retries of the cluster client within one operation (default 6).
    ///
    /// The cluster client retries in the background, so a request whose call already
    /// ended with a `Timeout` may still be applied later (a late grant lives one TTL).
    pub fn cluster_retries(mut self, n: u32) -> Self {
        self.cfg.cluster_retries = n;
        self
    }
    /// Accepts a server whose `maxmemory-policy` may evict keys (default off).
    ///
    /// Every policy except `noeviction` may evict a held lease key before its TTL
    /// (`volatile-*` evict keys with a TTL, which every lease has; `allkeys-*` evict any
    /// key), and a second holder is then let in while the first still believes it holds
    /// the lease. Off, the store reads the policy with `INFO memory` on every new
    /// connection, on every primary of a Cluster, and again every
    /// [`policy_check`](Self::policy_check), and refuses to work
    /// ([`StoreErrorKind::Config`], with an [`EvictingPolicy`](crate::EvictingPolicy) as
    /// its source) while any of them evicts. On, it logs a warning instead and reports
    /// [`Capabilities::may_evict`](leasehold_core::Capabilities::may_evict): exclusion is then
    /// not guaranteed and only the fence, checked by the storage that receives the
    /// writes, protects the data.
    pub fn allow_eviction(mut self, allow: bool) -> Self {
        self.cfg.allow_eviction = allow;
        self
    }
    /// How often the store reads `maxmemory-policy` again on a connection it already
    /// checked (default 10 s), to find a policy changed on a running server or a Cluster
    /// node the cluster client reconnected by itself. Each check is one `INFO memory` per
    /// server (per primary of a Cluster), made before the operation that finds it due. Not
    /// used with [`allow_eviction`](Self::allow_eviction).
    pub fn policy_check(mut self, d: Duration) -> Self {
        self.cfg.policy_check = d;
        self
    }
    /// How long a key's fence record (`…:fence`) is kept after the last grant or break on
    /// that key (default 7 days; `None`: forever). Without it, a store with one key per entity grows by one
    /// record per key ever used.
    ///
    /// Safe because fences are floored at the server's clock in µs: once a record is gone,
    /// the next grant's fence is the clock, above every fence issued before unless the
    /// server's clock went back by more than the retention. A lease held for longer than
    /// its retention keeps its fence (it is in the lease's own value). 1 s ..= 10 years.
    pub fn fence_retention(mut self, d: Option<Duration>) -> Self {
        self.cfg.fence_retention = d;
        self
    }
    /// How long a released lease stays reserved for the first live waiter in the key's
    /// queue (default 1 s, 10 ms ..= 60 s). The waiter is told on the key's channel and
    /// confirms with an acquire of its own; its validity counts from that request. A
    /// waiter that died (or gave up) holds the lease up for at most this long, and a
    /// waiter's queue entry lives for the time it said it would wait plus this long.
    /// With notifications off (`notify=false`) there is no queue.
    pub fn queue_grace(mut self, d: Duration) -> Self {
        self.cfg.queue_grace = d;
        self
    }
    /// On a Cluster, whether release notifications go over sharded pub/sub (default on):
    /// the scripts `SPUBLISH` on the key's channel, which shares the key's hash tag, so a
    /// message goes only to the shard that owns the key, and waiters `SSUBSCRIBE` there
    /// (Redis 7.0 or later). Off: classic `PUBLISH`, which every node of the Cluster
    /// forwards to every other (needed for Redis 6 Clusters). Ignored on a single server.
    pub fn sharded_pubsub(mut self, on: bool) -> Self {
        self.cfg.sharded_pubsub = on;
        self
    }
    /// Whether the concurrent acquires and releases of this store's tasks share script
    /// calls (default on): while two calls for a slot are on the wire, further operations
    /// on it wait and go out together, as one `MANY` script call (see the crate's README,
    /// "Batches"). Off: every operation is a script call of its own, sent at once.
    pub fn batch(mut self, on: bool) -> Self {
        self.cfg.batch = on;
        self
    }
    /// Replica-acknowledged writes (default 0: off; at most [`MAX_MIN_REPLICAS`]). Every
    /// acquire, renewal, release, wait and break is followed on the same connection by
    /// `WAIT n` bounded by what is left of the operation's timeout; fewer acknowledgements
    /// in time make the call fail closed with an *ambiguous* error (the write may stand on
    /// the primary; the same owner may retry, and a grant the replicas did not take is never
    /// reported). A single server or Sentinel only (a Cluster is refused). `WAIT` does not
    /// roll back, and a fail-over may still promote a replica that missed a write: see the
    /// crate docs, "Replicas and fail-over", for exactly what holds.
    pub fn min_replicas(mut self, n: u32) -> Self {
        self.cfg.min_replicas = n;
        self
    }
    /// Sentinel only: the largest amount by which a replica's clock may be ahead of the
    /// primary's (default 500 ms, 1 ms ..= 1 h).
    ///
    /// Redis gives replicas each key's expiry as an absolute time of the primary's clock,
    /// and a promoted replica expires keys by its own: a replica `d` ahead ends every
    /// lease `d` early after a fail-over. The store measures each replica's offset (its
    /// `TIME` against the primary's, bounded by the round trip) on every connection to a
    /// primary and every [`clock_check`](Self::clock_check), takes the largest positive
    /// one off every TTL it reports as granted (so the holder's deadline comes first), and
    /// refuses to grant ([`StoreErrorKind::Config`] with a
    /// [`ClockOffset`](crate::ClockOffset) source) while it is above this limit. See the
    /// crate docs, "Replica clocks".
    pub fn max_clock_offset(mut self, d: Duration) -> Self {
        self.cfg.max_clock_offset = d;
        self
    }
    /// Sentinel only: how often the replicas' clocks are measured again (default 10 s),
    /// besides every new connection to a primary. One `ROLE` and a few `TIME`s per
    /// replica, on connections of their own, off the operations' path.
    pub fn clock_check(mut self, d: Duration) -> Self {
        self.cfg.clock_check = d;
        self
    }
    /// Connect to `to` whenever `from` is named, by the configuration or by the Cluster
    /// topology (NAT, port forwarding, test proxies).
    pub fn map_address(mut self, from: NodeAddr, to: NodeAddr) -> Self {
        self.cfg.address_map.retain(|(f, _)| *f != from);
        self.cfg.address_map.push((from, to));
        self
    }

    /// Validates and builds.
    ///
    /// # Errors
    /// [`StoreErrorKind::Config`] when: the prefix is invalid; a timeout, the policy
    /// check interval or the clock check interval is zero or above 24 h;
    /// `max_clock_offset` is below 1 ms or above 1 h, or either clock setting is changed
    /// on a topology other than Sentinel; a Cluster
    /// has no seed or a database other than 0; a host is empty or a port is 0.
    pub fn build(self) -> Result<RedisConfig, StoreError> {
        let cfg = self.cfg;
        validate_prefix(&cfg.prefix)?;
        const DAY: Duration = Duration::from_secs(24 * 3600);
        for (d, what) in [
            (cfg.op_timeout, "the operation timeout"),
            (cfg.connect_timeout, "the connect timeout"),
            (cfg.policy_check, "the policy check interval"),
        ] {
            if d.is_zero() || d > DAY {
                return Err(config_error(format!(
                    "{what} must be above zero and at most 24h"
                )));
            }
        }
        if cfg
            .fence_retention
            .is_some_and(|d| d < Duration::from_secs(1) || d > MAX_FENCE_RETENTION)
        {
            return Err(config_error(
                "the fence retention must be at least 1s and at most 10 years (or `forever`)",
            ));
        }
        if cfg.queue_grace < Duration::from_millis(10) || cfg.queue_grace > Duration::from_secs(60)
        {
            return Err(config_error(
                "the queue grace must be at least 10ms and at most 60s",
            ));
        }
        if cfg.min_replicas > MAX_MIN_REPLICAS {
            return Err(config_error(format!(
                "min_replicas must be at most {MAX_MIN_REPLICAS}"
            )));
        }
        if cfg.max_clock_offset < Duration::from_millis(1)
            || cfg.max_clock_offset > MAX_CLOCK_OFFSET
        {
            return Err(config_error(
                "max_clock_offset must be at least 1ms and at most 1h",
            ));
        }
        if cfg.clock_check.is_zero() || cfg.clock_check > DAY {
            return Err(config_error(
                "the clock check interval must be above zero and at most 24h",
            ));
        }
        let sentinel = matches!(cfg.topology, Topology::Sentinel { .. });
        if !sentinel
            && (cfg.max_clock_offset != DEFAULT_MAX_CLOCK_OFFSET
                || cfg.clock_check != DEFAULT_CLOCK_CHECK)
        {
            return Err(config_error(
                "max_clock_offset and clock_check are for Sentinel (the replicas' clocks); a single server or a Cluster does not measure them",
            ));
        }
        if cfg.min_replicas > 0 && matches!(cfg.topology, Topology::Cluster { .. }) {
            return Err(config_error(
                "min_replicas is for a single server or Sentinel; a Cluster routes WAIT to no particular shard",
            ));
        }
        if !sentinel && cfg.sentinel_auth != SentinelAuth::None {
            return Err(config_error(
                "sentinel_auth, sentinel_username and sentinel_password are for Sentinel (redis+sentinel:// or rediss+sentinel://)",
            ));
        }
        let nodes: Vec<&NodeAddr> = match &cfg.topology {
            Topology::Standalone { node, .. } => vec![node],
            Topology::Sentinel { sentinels, master } => {
                if sentinels.is_empty() {
                    return Err(config_error("a Sentinel URL needs at least one sentinel"));
                }
                if master.is_empty()
                    || master.len() > MAX_MASTER_NAME_LEN
                    || master.chars().any(|c| c.is_control() || c.is_whitespace())
                {
                    return Err(config_error(format!(
                        "the primary's name (the URL path of redis+sentinel://s1:p1,s2:p2/NAME) must be 1 to {MAX_MASTER_NAME_LEN} bytes without spaces or control characters"
                    )));
                }
                if cfg.sentinel_auth == SentinelAuth::Same && cfg.password.is_none() {
                    return Err(config_error(
                        "sentinel_auth=same sends the URL's password to the sentinels, but the URL has none: give one, or use sentinel_password=",
                    ));
                }
                if let SentinelAuth::Own { password, .. } = &cfg.sentinel_auth
                    && password.expose().is_empty()
                {
                    return Err(config_error("the sentinels' password is empty"));
                }
                sentinels.iter().collect()
            }
            Topology::Cluster { seeds } => {
                if seeds.is_empty() {
                    return Err(config_error("a cluster needs at least one seed node"));
                }
                if cfg.db != 0 {
                    return Err(config_error(
                        "Redis Cluster has database 0 only; remove the database index",
                    ));
                }
                seeds.iter().collect()
            }
        };
        for n in nodes
            .into_iter()
            .chain(cfg.address_map.iter().map(|(_, to)| to))
        {
            if n.host.is_empty() {
                return Err(config_error("a node address has an empty host"));
            }
            if n.port == 0 {
                return Err(config_error("a node address has port 0"));
            }
        }
        Ok(cfg)
    }
}

// ----------------------------------------------------------------------------------------
// URL parsing. Never echo the URL (it may carry a password) in an error.

fn parse_url(url: &str) -> Result<RedisConfigBuilder, StoreError> {
    let (scheme, rest) = url
        .split_once("://")
        .ok_or_else(|| config_error("a Redis store URL looks like redis://host:port/"))?;
    let (cluster, tls) = match scheme {
        "redis" => (false, false),
        "rediss" => (false, true),
        "redis+cluster" => (true, false),
        "rediss+cluster" => (true, true),
        "redis+sentinel" => (false, false),
        "rediss+sentinel" => (false, true),
        other => {
            let shown: String = other.chars().take(32).collect();
            return Err(config_error(format!(
                "unsupported URL scheme `{shown}`; use redis, rediss, redis+cluster, rediss+cluster, redis+sentinel or rediss+sentinel"
            )));
        }
    };
    let sentinel = scheme.ends_with("+sentinel");
    // Split off the fragment and the query.
    let (rest, fragment) = match rest.split_once('#') {
        Some((r, f)) => (r, Some(f)),
        None => (rest, None),
    };
    if fragment.is_some() {
        return Err(config_error(
            "URL fragments (such as #insecure) are not supported; TLS is always verified (use tls_ca=)",
        ));
    }
    let (rest, query) = match rest.split_once('?') {
        Some((r, q)) => (r, Some(q)),
        None => (rest, None),
    };
    let (authority, path) = match rest.find('/') {
        Some(i) => (&rest[..i], &rest[i + 1..]),
        None => (rest, ""),
    };
    // The userinfo ends at the last '@' (a password may contain '@' only percent-encoded,
    // but be lenient and split at the last one).
    let (userinfo, hosts) = match authority.rfind('@') {
        Some(i) => (Some(&authority[..i]), &authority[i + 1..]),
        None => (None, authority),
    };
    let (username, password) = match userinfo {
        None => (None, None),
        Some(ui) => {
            let (u, p) = match ui.split_once(':') {
                Some((u, p)) => (u, Some(p)),
                None => (ui, None),
            };
            let u = pct_decode(u).ok_or_else(|| {
                config_error("the user name in the URL is not valid percent-encoded UTF-8")
            })?;
            let p = match p {
                Some(p) => Some(pct_decode(p).ok_or_else(|| {
                    config_error("the password in the URL is not valid percent-encoded UTF-8")
                })?),
                None => None,
            };
            ((!u.is_empty()).then_some(u), p.filter(|p| !p.is_empty()))
        }
    };
    let mut nodes = Vec::new();
    for h in hosts.split(',') {
        nodes.push(parse_host_port(h)?);
    }
    if nodes.is_empty() || hosts.is_empty() {
        return Err(config_error("the URL names no host"));
    }
    let path = path.trim_end_matches('/');
    let mut b = if sentinel {
        let master = pct_decode(path).ok_or_else(|| {
            config_error("the primary's name in the URL is not valid percent-encoded UTF-8")
        })?;
        RedisConfigBuilder::sentinel(nodes, master)
    } else if cluster {
        if !path.is_empty() && path != "0" {
            return Err(config_error(
                "Redis Cluster has database 0 only; remove the database index from the URL",
            ));
        }
        RedisConfigBuilder::cluster(nodes)
    } else {
        if nodes.len() > 1 {
            return Err(config_error(
                "several hosts need the cluster scheme (redis+cluster:// or rediss+cluster://)",
            ));
        }
        let db = if path.is_empty() {
            0
        } else {
            path.parse::<u32>().map_err(|_| {
                config_error("the database index in the URL path must be a number (e.g. /0)")
            })?
        };
        let node = nodes.pop().expect("one node");
        RedisConfigBuilder::standalone(node.host, node.port).db(db)
    };
    if let Some(u) = username {
        b = b.username(u);
    }
    if let Some(p) = password {
        b = b.password(p);
    }
    let mut tls_settings = TlsSettings::default();
    let mut tls_cert: Option<PathBuf> = None;
    let mut tls_key: Option<PathBuf> = None;
    let mut sentinel_same: Option<bool> = None;
    let mut sentinel_username: Option<String> = None;
    let mut sentinel_password: Option<String> = None;
    for pair in query.unwrap_or("").split('&').filter(|s| !s.is_empty()) {
        let (name, value) = pair.split_once('=').unwrap_or((pair, ""));
        let name = pct_decode(name).ok_or_else(|| {
            config_error("a URL parameter name is not valid percent-encoded UTF-8")
        })?;
        let value = pct_decode(value).ok_or_else(|| {
            config_error(format!(
                "the value of URL parameter `{name}` is not valid percent-encoded UTF-8"
            ))
        })?;
        match name.as_str() {
            "prefix" => b = b.prefix(value),
            "timeout" => b = b.op_timeout(parse_duration(&name, &value)?),
            "connect_timeout" => b = b.connect_timeout(parse_duration(&name, &value)?),
            "notify" => b = b.notifications(parse_bool(&name, &value)?),
            "allow_eviction" => b = b.allow_eviction(parse_bool(&name, &value)?),
            "policy_check" => b = b.policy_check(parse_duration(&name, &value)?),
            "fence_retention" if value == "forever" => b = b.fence_retention(None),
            "fence_retention" => {
                let d = leasehold_core::url::parse_duration(&value).ok_or_else(|| {
                    config_error(
                        "URL parameter `fence_retention` must be a duration such as 1h or 7d, or `forever`",
                    )
                })?;
                b = b.fence_retention(Some(d));
            }
            "queue_grace" => b = b.queue_grace(parse_duration(&name, &value)?),
            "batch" => b = b.batch(parse_bool(&name, &value)?),
            "min_replicas" => b = b.min_replicas(parse_number(&name, &value)?),
            "max_clock_offset" if sentinel => {
                b = b.max_clock_offset(parse_duration(&name, &value)?)
            }
            "clock_check" if sentinel => b = b.clock_check(parse_duration(&name, &value)?),
            "db" if sentinel => b = b.db(parse_number(&name, &value)?),
            "sharded_pubsub" if cluster => b = b.sharded_pubsub(parse_bool(&name, &value)?),
            "cluster_retries" if cluster => b = b.cluster_retries(parse_number(&name, &value)?),
            "sentinel_auth" if sentinel => {
                sentinel_same = Some(match value.as_str() {
                    "same" => true,
                    "none" => false,
                    _ => {
                        return Err(config_error(
                            "URL parameter `sentinel_auth` must be `same` (the URL's user and password go to the sentinels too) or `none`",
                        ));
                    }
                });
            }
            "sentinel_username" if sentinel => sentinel_username = Some(value),
            "sentinel_password" if sentinel => sentinel_password = Some(value),
            "sentinel_auth" | "sentinel_username" | "sentinel_password" => {
                return Err(config_error(format!(
                    "URL parameter `{name}` is for Sentinel: use redis+sentinel:// or rediss+sentinel://"
                )));
            }
            "tls_ca" | "tls_cert" | "tls_key" if !tls => {
                return Err(config_error(format!(
                    "URL parameter `{name}` needs TLS: use rediss://, rediss+cluster:// or rediss+sentinel://"
                )));
            }
            "tls_ca" => tls_settings.ca_file = Some(PathBuf::from(value)),
            "tls_cert" => tls_cert = Some(PathBuf::from(value)),
            "tls_key" => tls_key = Some(PathBuf::from(value)),
            other => {
                let shown: String = other.chars().take(32).collect();
                return Err(config_error(format!(
                    "unknown URL parameter `{shown}`; known: prefix, timeout, connect_timeout, notify, allow_eviction, policy_check, fence_retention, queue_grace, batch, min_replicas, cluster_retries, sharded_pubsub, db, max_clock_offset, clock_check, sentinel_auth, sentinel_username, sentinel_password (Sentinel), tls_ca, tls_cert, tls_key"
                )));
            }
        }
    }
    match (tls_cert, tls_key) {
        (Some(c), Some(k)) => tls_settings.client_cert = Some((c, k)),
        (None, None) => {}
        _ => {
            return Err(config_error(
                "URL parameters `tls_cert` and `tls_key` go together",
            ));
        }
    }
    if tls {
        b = b.tls(tls_settings);
    }
    match (sentinel_same, sentinel_username, sentinel_password) {
        (None | Some(false), None, None) => {}
        (Some(true), None, None) => b = b.sentinel_credentials(SentinelAuth::Same),
        (Some(true), _, _) => {
            return Err(config_error(
                "sentinel_auth=same takes the URL's user and password for the sentinels: give either it or sentinel_username/sentinel_password, not both",
            ));
        }
        (_, _, None) => {
            return Err(config_error(
                "URL parameter `sentinel_username` needs `sentinel_password` (the sentinels' password for that user)",
            ));
        }
        (_, username, Some(password)) => {
            b = b.sentinel_credentials(SentinelAuth::Own {
                username: username.filter(|u| !u.is_empty()),
                password: Secret(password),
            });
        }
    }
    Ok(b)
}

fn parse_host_port(s: &str) -> Result<NodeAddr, StoreError> {
    let (host, port) = if let Some(rest) = s.strip_prefix('[') {
        let (h, after) = rest
            .split_once(']')
            .ok_or_else(|| config_error("an IPv6 host in the URL lacks its closing `]`"))?;
        let port = match after {
            "" => None,
            p => Some(
                p.strip_prefix(':')
                    .ok_or_else(|| config_error("unexpected text after an IPv6 host in the URL"))?,
            ),
        };
        (h, port)
    } else {
        match s.rsplit_once(':') {
            Some((h, p)) => (h, Some(p)),
            None => (s, None),
        }
    };
    if host.is_empty() {
        return Err(config_error("a host in the URL is empty"));
    }
    if host
        .chars()
        .any(|c| c.is_whitespace() || c.is_control() || matches!(c, '@' | '/' | '?' | '#'))
    {
        return Err(config_error(
            "a host in the URL contains invalid characters",
        ));
    }
    let port = match port {
        None => DEFAULT_PORT,
        Some(p) => match p.parse::<u16>() {
            Ok(p) if p > 0 => p,
            _ => {
                return Err(config_error(
                    "a port in the URL is not a number between 1 and 65535",
                ));
            }
        },
    };
    Ok(NodeAddr::new(host, port))
}

fn parse_bool(name: &str, v: &str) -> Result<bool, StoreError> {
    match v {
        "true" | "1" | "yes" | "on" => Ok(true),
        "false" | "0" | "no" | "off" => Ok(false),
        _ => Err(config_error(format!(
            "URL parameter `{name}` must be true or false"
        ))),
    }
}

fn parse_number<N: std::str::FromStr>(name: &str, v: &str) -> Result<N, StoreError> {
    v.parse()
        .map_err(|_| config_error(format!("URL parameter `{name}` must be a whole number")))
}

/// `250ms`, `2s`, `1m`, or a bare number of milliseconds.
pub(crate) fn parse_duration(name: &str, v: &str) -> Result<Duration, StoreError> {
    let bad = || {
        config_error(format!(
            "URL parameter `{name}` must be a duration such as 500ms, 2s or 1m"
        ))
    };
    let d = leasehold_core::url::parse_duration(v).ok_or_else(bad)?;
    let ms = u64::try_from(d.as_millis()).map_err(|_| bad())?;
    if ms == 0 || ms > 24 * 3600 * 1000 {
        return Err(config_error(format!(
            "URL parameter `{name}` must be above zero and at most 24h"
        )));
    }
    Ok(Duration::from_millis(ms))
}

fn pct_encode(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for b in s.bytes() {
        if b.is_ascii_alphanumeric() || b"-._~:/".contains(&b) {
            out.push(b as char);
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::path::Path;

    const PW: &str = "s3ntinel-PASSWORD-x";

    #[test]
    fn standalone_forms() {
        let c = RedisConfig::from_url("redis://127.0.0.1:7000/").unwrap();
        assert_eq!(
            c.topology(),
            &Topology::Standalone {
                node: NodeAddr::new("127.0.0.1", 7000),
            }
        );
        assert_eq!(c.prefix(), "leasehold:");
        assert_eq!(c.op_timeout(), DEFAULT_OP_TIMEOUT);
        let c = RedisConfig::from_url(
            "redis://app:pa%40ss@host/3?prefix=billing%3Aleases%3A&timeout=250ms&connect_timeout=1s&notify=false",
        )
        .unwrap();
        assert_eq!(
            c.topology(),
            &Topology::Standalone {
                node: NodeAddr::new("host", 6379),
            }
        );
        assert_eq!(c.db(), 3);
        assert_eq!(c.username(), Some("app"));
        assert_eq!(c.password().unwrap().expose(), "pa@ss");
        assert_eq!(c.prefix(), "billing:leases:");
        assert_eq!(c.op_timeout(), Duration::from_millis(250));
        assert_eq!(c.connect_timeout(), Duration::from_secs(1));
        assert!(!c.notifications());
        let c = RedisConfig::from_url("redis://[::1]:7001").unwrap();
        assert_eq!(
            c.topology(),
            &Topology::Standalone {
                node: NodeAddr::new("::1", 7001),
            }
        );
        let c = RedisConfig::from_url("rediss://h:1/?tls_ca=/etc/ca.pem").unwrap();
        assert_eq!(
            c.tls().unwrap().ca_file.as_deref(),
            Some(Path::new("/etc/ca.pem"))
        );
    }

    #[test]
    fn cluster_forms() {
        let c = RedisConfig::from_url("redis+cluster://:pw@a:1,b:2,[::1]:3/?prefix=x:").unwrap();
        assert_eq!(
            c.topology(),
            &Topology::Cluster {
                seeds: vec![
                    NodeAddr::new("a", 1),
                    NodeAddr::new("b", 2),
                    NodeAddr::new("::1", 3)
                ]
            }
        );
        assert!(c.has_password());
        assert!(c.tls().is_none());
        assert!(
            RedisConfig::from_url("rediss+cluster://a:1")
                .unwrap()
                .tls()
                .is_some()
        );
        assert!(RedisConfig::from_url("redis+cluster://a:1/2").is_err());
        assert!(RedisConfig::from_url("redis://a:1,b:2").is_err());
    }

    #[test]
    fn bad_urls_are_config_errors_without_secrets() {
        for url in [
            format!("redis://u:{PW}@h:notaport/"),
            format!("redis://u:{PW}@h:0/"),
            format!("redis://u:{PW}@h:70000/"),
            format!("redis://u:{PW}@h/x"),
            format!("redis://u:{PW}@h/?prefix={{a}}"),
            format!("redis://u:{PW}@h/?timeout=0"),
            format!("redis://u:{PW}@h/?timeout=abc"),
            format!("redis://u:{PW}@h/?what=1"),
            format!("redis://u:{PW}@h/?tls_ca=/x"),
            format!("redis://u:{PW}@h/#insecure"),
            format!("nope://u:{PW}@h/"),
            format!("u:{PW}@h"),
            format!("redis://u:{PW}@/"),
            format!("redis://u:{PW}%zz@h/"),
        ] {
            let e = RedisConfig::from_url(&url).unwrap_err();
            assert_eq!(e.kind(), StoreErrorKind::Config, "{url}");
            assert!(!e.to_string().contains(PW), "{e}");
            assert!(!format!("{e:?}").contains(PW), "{e:?}");
        }
    }

    #[test]
    fn display_and_debug_redact_the_password() {
        let c = RedisConfig::from_url(&format!("redis://app:{PW}@h:1/2?prefix=p:")).unwrap();
        let shown = c.to_string();
        assert!(!shown.contains(PW), "{shown}");
        assert!(
            shown.starts_with("redis://app:<redacted>@h:1/2?prefix=p:"),
            "{shown}"
        );
        assert!(!format!("{c:?}").contains(PW));
        // Display round-trips (apart from the password).
        let again = RedisConfig::from_url(&shown).unwrap();
        assert_eq!(again.topology(), c.topology());
        assert_eq!(again.prefix(), c.prefix());
        let c = RedisConfig::from_url(&format!("redis+cluster://:{PW}@a:1,b:2")).unwrap();
        assert!(!c.to_string().contains(PW));
        assert!(!format!("{c:?}").contains(PW));
    }

    #[test]
    fn batching_can_be_turned_off() {
        assert!(RedisConfig::from_url("redis://a:1/").unwrap().batch());
        let c = RedisConfig::from_url("redis://a:1/?batch=false").unwrap();
        assert!(!c.batch());
        assert!(c.to_string().contains("batch=false"));
        assert!(
            !RedisConfig::from_url("redis://a:1/")
                .unwrap()
                .to_string()
                .contains("batch")
        );
        assert!(RedisConfig::from_url("redis://a:1/?batch=maybe").is_err());
    }

    #[test]
    fn sharded_pubsub_is_a_cluster_setting() {
        let c = RedisConfig::from_url("redis+cluster://a:1,b:2/").unwrap();
        assert!(c.sharded_pubsub());
        let c = RedisConfig::from_url("redis+cluster://a:1/?sharded_pubsub=false").unwrap();
        assert!(!c.sharded_pubsub());
        assert!(c.to_string().contains("sharded_pubsub=false"));
        assert_eq!(RedisConfig::from_url(&c.to_string()).unwrap(), c);
        // A single server has no shards: the parameter is refused, the setting is off.
        assert!(RedisConfig::from_url("redis://a:1/?sharded_pubsub=true").is_err());
        assert!(
            !RedisConfig::from_url("redis://a:1/")
                .unwrap()
                .sharded_pubsub()
        );
        assert!(RedisConfig::from_url("redis+cluster://a:1/?sharded_pubsub=maybe").is_err());
    }

    #[test]
    fn eviction_parameters() {
        let c = RedisConfig::from_url("redis://h/").unwrap();
        assert!(!c.allow_eviction());
        assert_eq!(c.policy_check(), DEFAULT_POLICY_CHECK);
        for (v, want) in [
            ("true", true),
            ("1", true),
            ("false", false),
            ("off", false),
        ] {
            let c = RedisConfig::from_url(&format!("redis://h/?allow_eviction={v}")).unwrap();
            assert_eq!(c.allow_eviction(), want, "{v}");
        }
        let c = RedisConfig::from_url("redis+cluster://a:1/?policy_check=250ms").unwrap();
        assert_eq!(c.policy_check(), Duration::from_millis(250));
        for bad in [
            "allow_eviction=maybe",
            "allow_eviction=",
            "allow_eviction",
            "allow_eviction=TRUE%00",
            "policy_check=0",
            "policy_check=-1s",
            "policy_check=25h",
            "policy_check=soon",
        ] {
            let e = RedisConfig::from_url(&format!("redis://u:{PW}@h/?{bad}")).unwrap_err();
            assert_eq!(e.kind(), StoreErrorKind::Config, "{bad}");
            let name = bad.split('=').next().unwrap();
            assert!(e.to_string().contains(name), "{bad}: {e}");
            assert!(!e.to_string().contains(PW));
        }
        // Display round-trips both.
        let c = RedisConfig::from_url("redis://h/?allow_eviction=yes").unwrap();
        assert!(c.to_string().contains("allow_eviction=true"), "{c}");
        assert_eq!(RedisConfig::from_url(&c.to_string()).unwrap(), c);
        let c = RedisConfig::from_url("redis://h/?policy_check=2s").unwrap();
        assert!(c.to_string().contains("policy_check=2000ms"), "{c}");
        assert_eq!(RedisConfig::from_url(&c.to_string()).unwrap(), c);
        assert_eq!(
            RedisConfigBuilder::standalone("h", 1)
                .policy_check(Duration::ZERO)
                .build()
                .unwrap_err()
                .kind(),
            StoreErrorKind::Config
        );
    }

    #[test]
    fn clock_parameters_are_sentinels() {
        let c = RedisConfig::from_url("redis+sentinel://a:1/m").unwrap();
        assert_eq!(c.max_clock_offset(), DEFAULT_MAX_CLOCK_OFFSET);
        assert_eq!(c.clock_check(), DEFAULT_CLOCK_CHECK);
        assert!(!c.to_string().contains("clock"), "{c}");
        let c =
            RedisConfig::from_url("redis+sentinel://a:1/m?max_clock_offset=2s&clock_check=250ms")
                .unwrap();
        assert_eq!(c.max_clock_offset(), Duration::from_secs(2));
        assert_eq!(c.clock_check(), Duration::from_millis(250));
        let shown = c.to_string();
        assert!(
            shown.contains("max_clock_offset=2000ms") && shown.contains("clock_check=250ms"),
            "{shown}"
        );
        assert_eq!(RedisConfig::from_url(&shown).unwrap(), c);
        for bad in [
            "redis+sentinel://a:1/m?max_clock_offset=0",
            "redis+sentinel://a:1/m?max_clock_offset=2h",
            "redis+sentinel://a:1/m?max_clock_offset=soon",
            "redis+sentinel://a:1/m?clock_check=0",
            "redis://a:1/?max_clock_offset=1s",
            "redis+cluster://a:1/?clock_check=1s",
        ] {
            let e = RedisConfig::from_url(bad).unwrap_err();
            assert_eq!(e.kind(), StoreErrorKind::Config, "{bad}");
        }
        for b in [
            RedisConfigBuilder::standalone("h", 1).max_clock_offset(Duration::from_secs(1)),
            RedisConfigBuilder::cluster([NodeAddr::new("h", 1)])
                .clock_check(Duration::from_secs(1)),
            RedisConfigBuilder::sentinel([NodeAddr::new("h", 1)], "m")
                .max_clock_offset(Duration::from_micros(10)),
            RedisConfigBuilder::sentinel([NodeAddr::new("h", 1)], "m").clock_check(Duration::ZERO),
        ] {
            assert_eq!(b.build().unwrap_err().kind(), StoreErrorKind::Config);
        }
    }

    #[test]
    fn sentinel_over_tls_and_sentinel_credentials() {
        let c = RedisConfig::from_url(
            "rediss+sentinel://:data@a:1,b:2/m?tls_ca=/ca.pem&tls_cert=/c.pem&tls_key=/k.pem",
        )
        .unwrap();
        assert!(matches!(c.topology(), Topology::Sentinel { .. }));
        let tls = c.tls().unwrap();
        assert_eq!(tls.ca_file.as_deref(), Some(Path::new("/ca.pem")));
        assert!(tls.client_cert.is_some());
        assert_eq!(c.sentinel_auth(), &SentinelAuth::None);
        assert_eq!(c.sentinel_credentials(), (None, None));
        let shown = c.to_string();
        assert!(
            shown.starts_with("rediss+sentinel://:<redacted>@a:1,b:2/m?"),
            "{shown}"
        );
        let again = RedisConfig::from_url(&shown).unwrap();
        assert_eq!(again.tls(), c.tls());

        // Own credentials for the sentinels, kept apart from the data servers'.
        let c = RedisConfig::from_url(&format!(
            "redis+sentinel://app:data@a:1/m?sentinel_username=watch&sentinel_password={PW}"
        ))
        .unwrap();
        let (user, pw) = c.sentinel_credentials();
        assert_eq!((user, pw.map(Secret::expose)), (Some("watch"), Some(PW)));
        assert_eq!(c.password().unwrap().expose(), "data");
        for shown in [c.to_string(), format!("{c:?}")] {
            assert!(!shown.contains(PW), "{shown}");
        }
        assert!(
            c.to_string()
                .contains("&sentinel_username=watch&sentinel_password=<redacted>"),
            "{c}"
        );
        // The same credentials for both.
        let c = RedisConfig::from_url(&format!(
            "redis+sentinel://app:{PW}@a:1/m?sentinel_auth=same"
        ))
        .unwrap();
        let (user, pw) = c.sentinel_credentials();
        assert_eq!((user, pw.map(Secret::expose)), (Some("app"), Some(PW)));
        assert!(c.to_string().contains("sentinel_auth=same"), "{c}");
        assert_eq!(
            RedisConfig::from_url(&c.to_string())
                .unwrap()
                .sentinel_auth(),
            &SentinelAuth::Same
        );

        for bad in [
            format!("redis://u:{PW}@h/?sentinel_password={PW}"),
            format!("rediss://u:{PW}@h/?sentinel_auth=same"),
            format!("redis+cluster://u:{PW}@h/?sentinel_username=x"),
            format!("redis+sentinel://u:{PW}@h/m?sentinel_auth=maybe"),
            format!("redis+sentinel://u:{PW}@h/m?sentinel_auth=same&sentinel_password={PW}"),
            format!("redis+sentinel://u:{PW}@h/m?sentinel_username=x"),
            "redis+sentinel://h/m?sentinel_auth=same".to_owned(),
            format!("redis+sentinel://u:{PW}@h/m?sentinel_password="),
            format!("redis+sentinel://u:{PW}@h/m?tls_ca=/ca.pem"),
            format!("rediss+sentinel://u:{PW}@h/m#insecure"),
        ] {
            let e = RedisConfig::from_url(&bad).unwrap_err();
            assert_eq!(e.kind(), StoreErrorKind::Config, "{bad}");
            assert!(!e.to_string().contains(PW), "{e}");
            assert!(!format!("{e:?}").contains(PW), "{e:?}");
        }
        assert_eq!(
            RedisConfigBuilder::standalone("h", 1)
                .sentinel_credentials(SentinelAuth::Same)
                .password("x")
                .build()
                .unwrap_err()
                .kind(),
            StoreErrorKind::Config
        );
    }

    #[test]
    fn builder_rules() {
        let ok = || RedisConfigBuilder::standalone("h", 1);
        assert!(ok().build().is_ok());
        for b in [
            ok().op_timeout(Duration::ZERO),
            ok().op_timeout(Duration::MAX),
            ok().connect_timeout(Duration::ZERO),
            ok().prefix("{"),
            RedisConfigBuilder::standalone("", 1),
            RedisConfigBuilder::standalone("h", 0),
            RedisConfigBuilder::cluster([]),
            RedisConfigBuilder::cluster([NodeAddr::new("h", 1)]).db(1),
            ok().map_address(NodeAddr::new("a", 1), NodeAddr::new("b", 0)),
        ] {
            assert_eq!(b.build().unwrap_err().kind(), StoreErrorKind::Config);
        }
    }

    #[test]
    fn durations() {
        assert_eq!(parse_duration("t", "2s").unwrap(), Duration::from_secs(2));
        assert_eq!(parse_duration("t", "1m").unwrap(), Duration::from_secs(60));
        assert_eq!(
            parse_duration("t", "750").unwrap(),
            Duration::from_millis(750)
        );
        assert!(parse_duration("t", "-1s").is_err());
        assert!(parse_duration("t", "99999999999999999999s").is_err());
        assert!(parse_duration("t", "25h").is_err());
    }
}
