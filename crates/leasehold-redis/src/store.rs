//! [`RedisStore`]: the [`Store`] implementation.

use std::collections::VecDeque;
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use leasehold_core::{
    AcquireAnyOutcome, AcquireOutcome, BatchStore, Capabilities, Changes, CheckedAcquire, Fence,
    FenceDurability, HandedGrant, Key, LeaseInfo, OwnerToken, RENEW_BATCH, Record, RecordCheck,
    ReleaseOutcome, RenewOutcome, Store, StoreError, StoreErrorKind, WaitOutcome, WaitStore,
    WatchStore,
};
use redis::Value;
use redis::cluster_routing::{RoutingInfo, SingleNodeRoutingInfo};
use tokio::time::Instant;

use crate::BACKEND;
use crate::batch::{Answer, Batcher, Op};
use crate::config::RedisConfig;
use crate::conn::Conn;
use crate::keys::{KeyNames, Layout};
use crate::notify::{Notifier, WatchRegistration};
use crate::scripts::{self, Acquired, Renewed, SCRIPTS, Turn};

/// A leasehold [`Store`] on Redis (one server) or Redis Cluster.
///
/// Each operation is one Lua script (`EVALSHA`, loaded on `NOSCRIPT`) touching the lease
/// key and the fence key of one lease, which share a hash tag (one Cluster slot). See the
/// crate docs for the key layout, the URL forms and the failure model.
///
/// [`backend`](Store::backend) is `"redis"` for both a single server and a Cluster
/// ([`is_cluster`](Self::is_cluster) tells them apart), so metrics and errors carry one
/// label per product.
///
/// Cheap to share: wrap it in an `Arc` (it is `Send + Sync`); all clones of the `Arc` use
/// one multiplexed connection (or one cluster connection) and, once someone waits for a
/// release, one pub/sub connection.
pub struct RedisStore {
    config: RedisConfig,
    layout: Layout,
    conn: Arc<Conn>,
    batcher: Arc<Batcher>,
    notifier: Option<Arc<Notifier>>,
}

impl std::fmt::Debug for RedisStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RedisStore")
            .field("config", &self.config.to_string())
            .finish_non_exhaustive()
    }
}

/// How long after a reservation's grace the next waiter re-checks (the reservation has
/// lapsed on the server by then, up to clock rate differences).
const LAPSE_MARGIN: Duration = Duration::from_millis(50);

/// How long a watch's mark (`p{e}:w`) lives without being refreshed: how long after the
/// last watcher went away (or died) the scripts still publish the key's changes.
pub const WATCH_MARK_TTL: Duration = Duration::from_secs(20);

/// How often a watch refreshes its mark and checks, by its heartbeat, that its
/// subscription still hears the key.
pub const WATCH_REFRESH: Duration = Duration::from_secs(5);

/// The TTL in whole milliseconds, after [`StoreError::check_ttl`] (10 ms ..= 24 h), so no
/// zero, negative or overflowing expiry is ever sent.
fn ttl_ms(ttl: Duration) -> Result<u64, StoreError> {
    StoreError::check_ttl(BACKEND, ttl)?;
    Ok(u64::try_from(ttl.as_millis()).unwrap_or(u64::MAX))
}

impl RedisStore {
    /// A store for `config`, without connecting: the first operation connects.
    ///
    /// # Errors
    /// [`StoreErrorKind::Config`] when the TLS files cannot be read or the client cannot be
    /// configured.
    pub fn new(config: RedisConfig) -> Result<Self, StoreError> {
        let layout = Layout::new(config.prefix())?;
        let conn = Arc::new(Conn::new(&config)?);
        let batcher = Arc::new(Batcher::new(conn.clone(), config.batch()));
        let notifier = if config.notifications() {
            Some(Arc::new(Notifier::new(
                conn.pubsub_transport()?,
                conn.connect_timeout(),
                conn.op_timeout(),
                conn.secret().map(str::to_owned),
            )))
        } else {
            None
        };
        Ok(Self {
            config,
            layout,
            conn,
            batcher,
            notifier,
        })
    }

    /// A store for `config`, connected (and authenticated) now, within the connect timeout.
    ///
    /// # Cancel safety
    /// Cancel safe: a dropped call leaves no connection behind.
    ///
    /// # Errors
    /// As [`new`](Self::new); [`StoreErrorKind::Config`] for a wrong password or a TLS
    /// failure (a `redis://` URL to a server that speaks only TLS included: a
    /// [`TlsFailure`](crate::TlsFailure) of problem `PlaintextRefused`);
    /// [`StoreErrorKind::Unavailable`] when the server cannot be reached.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// use leasehold_redis::{RedisConfig, RedisStore};
    ///
    /// # async fn demo() -> Result<(), Box<dyn std::error::Error>> {
    /// let config = RedisConfig::from_url("redis+cluster://10.0.0.1:7000,10.0.0.2:7000/?prefix=billing:")?;
    /// let store = RedisStore::connect(config).await?; // fails here if no seed answers
    /// assert!(store.is_cluster());
    /// # Ok(()) }
    /// ```
    pub async fn connect(config: RedisConfig) -> Result<Self, StoreError> {
        let store = Self::new(config)?;
        if let Err(e) = store.conn.connect().await {
            return Err(crate::tls::plaintext_refused(&store.config, e).await);
        }
        tracing::debug!(config = %store.config, "redis store connected");
        Ok(store)
    }

    /// Parses `url` (see the crate docs) and connects.
    ///
    /// # Cancel safety
    /// Cancel safe, as [`connect`](Self::connect).
    ///
    /// # Errors
    /// As [`RedisConfig::from_url`] and [`connect`](Self::connect).
    ///
    /// # Examples
    ///
    /// ```no_run
    /// use std::{sync::Arc, time::Duration};
    /// use leasehold_core::{LeaseClient, LeaseConfig};
    /// use leasehold_redis::RedisStore;
    ///
    /// # async fn demo() -> Result<(), Box<dyn std::error::Error>> {
    /// let store = RedisStore::open("redis://leasehold:s3cret@redis.internal:6379/?prefix=billing:&timeout=1s").await?;
    /// let client = LeaseClient::new(Arc::new(store), LeaseConfig::new(Duration::from_secs(10))?);
    /// let lease = client.acquire("job:invoices", Duration::from_secs(30)).await?;
    /// lease.release().await?;
    /// # Ok(()) }
    /// ```
    pub async fn open(url: &str) -> Result<Self, StoreError> {
        Self::connect(RedisConfig::from_url(url)?).await
    }

    /// The configuration.
    pub fn config(&self) -> &RedisConfig {
        &self.config
    }

    /// Whether this store talks to a Redis Cluster.
    pub fn is_cluster(&self) -> bool {
        self.conn.is_cluster()
    }

    /// The Redis key of the lease for `key` (`<prefix>{<escaped key>}`), e.g. for an
    /// operator's `redis-cli`. The fence key is this plus `:fence`.
    pub fn lease_key(&self, key: &Key) -> String {
        self.layout.lease_name(key)
    }

    /// The Redis key of the fence counter for `key` (`<prefix>{<escaped key>}:fence`).
    pub fn fence_key(&self, key: &Key) -> String {
        self.layout.names(key).fence
    }

    /// The Redis key of the record named `key` (`<prefix>{<escaped key>}:record`, see
    /// [`put_record`](Store::put_record)): `<fence>:<value>`, never expires.
    pub fn record_key(&self, key: &Key) -> String {
        self.layout.record_name(key)
    }

    /// The Redis key that marks `key` watched (`<prefix>{<escaped key>}:w`, see
    /// [`watch`](WatchStore::watch)): it exists, with a TTL of at most [`WATCH_MARK_TTL`],
    /// while some store watches the key or lately did.
    pub fn watch_key(&self, key: &Key) -> String {
        self.layout.names(key).watch
    }

    /// The channel argument of the scripts: `''` without notifications; `S <channel>`
    /// for sharded pub/sub (`SPUBLISH`); the channel itself otherwise.
    fn channel(&self, names: &KeyNames) -> String {
        if self.notifier.is_none() {
            String::new()
        } else if self.config.sharded_pubsub() {
            format!("S {}", names.channel)
        } else {
            names.channel.clone()
        }
    }

    /// An acquire (`a`, with its TTL in ms) or a release (`r`, no TTL) of `key` as
    /// `owner`, as the batch script takes it; `keep` is the fence record's expiry in ms
    /// (`None`: `''`, no expiry). The same parts as `names`, `channel`, `grace` and
    /// `fence_expiry` give, written into the operation's one buffer.
    fn op(
        &self,
        key: &Key,
        kind: &str,
        owner: &OwnerToken,
        ms: Option<u64>,
        keep: Option<u64>,
    ) -> Op {
        use std::fmt::Write as _;
        let lease_len = self.layout.lease_name_len(key);
        // 5 keys (suffixes `:fence`, `:q`, `:qd`, `:w`), the kind, 32 hex digits, three
        // numbers of about 20 digits at most (a longer grace only reallocates), the
        // channel (`S ` and `:released`).
        let mut op = Op::with_capacity(6 * lease_len + 13 + 1 + 32 + 3 * 20 + 11);
        for suffix in ["", ":fence", ":q", ":qd", ":w"] {
            self.layout.push_lease_name(op.buf(), key);
            op.buf().push_str(suffix);
            op.end_part();
        }
        op.push(kind);
        let _ = write!(op.buf(), "{owner}");
        op.end_part();
        for n in [ms.map(u128::from), keep.map(u128::from), self.grace_ms()] {
            if let Some(n) = n {
                let _ = write!(op.buf(), "{n}");
            }
            op.end_part();
        }
        if self.notifier.is_some() {
            if self.config.sharded_pubsub() {
                op.buf().push_str("S ");
            }
            self.layout.push_lease_name(op.buf(), key);
            op.buf().push_str(":released");
        }
        op.end_part();
        op
    }

    /// The Cluster slot of `key` (0 on a single server): operations batch per slot.
    fn slot(&self, key: &Key) -> u16 {
        if self.conn.is_cluster() {
            self.layout.slot(key)
        } else {
            0
        }
    }

    /// The TTL to report for a grant of `ttl`: less the largest amount by which a
    /// replica's clock is ahead of the primary's (Sentinel; see the crate docs, "Replica
    /// clocks"), as measured before the request was sent (`before`) or since, whichever is
    /// larger. The holder's deadline, counted from this TTL, then comes before the lease's
    /// end on any replica a fail-over may promote.
    fn granted(&self, ttl: Duration, before: Duration) -> Duration {
        ttl.saturating_sub(before.max(self.conn.clock_allowance_now()))
    }

    /// [`granted`](Self::granted) for an answer of `acquire_any`.
    fn granted_any(&self, got: AcquireAnyOutcome, before: Duration) -> AcquireAnyOutcome {
        match got {
            AcquireAnyOutcome::Acquired { index, fence, ttl } => AcquireAnyOutcome::Acquired {
                index,
                fence,
                ttl: self.granted(ttl, before),
            },
            other => other,
        }
    }

    /// The reservation grace in ms, or `""` when there is no queue (notifications off).
    fn grace(&self) -> String {
        self.grace_ms().map(|ms| ms.to_string()).unwrap_or_default()
    }

    /// The notifier waits go through, or `Unsupported` with notifications off.
    fn waiting_notifier(&self) -> Result<&Arc<Notifier>, StoreError> {
        self.notifier.as_ref().ok_or_else(|| {
            StoreError::unsupported(
                BACKEND,
                "waiting for release (notifications are off: notify=false)",
            )
        })
    }

    /// The reservation grace in ms, or `None` when there is no queue (notifications off).
    fn grace_ms(&self) -> Option<u128> {
        self.notifier
            .as_ref()
            .map(|_| self.config.queue_grace().as_millis())
    }

    async fn inspect_names(
        &self,
        key: &Key,
        names: &KeyNames,
    ) -> Result<Option<LeaseInfo>, StoreError> {
        let got = self
            .conn
            .run_read(
                "inspect",
                &SCRIPTS.inspect,
                &[&names.lease],
                &[],
                scripts::parse_inspect,
            )
            .await?;
        Ok(got.map(|(owner, fence, remaining)| LeaseInfo {
            key: key.clone(),
            owner,
            fence,
            remaining: Some(remaining),
        }))
    }

    /// The expiry in ms of a fence record written by a grant of `ttl_ms` (the lease's TTL
    /// plus the retention), or `""` to keep it forever.
    fn fence_expiry(&self, ttl_ms: u64) -> String {
        self.fence_expiry_ms(ttl_ms)
            .map(|ms| ms.to_string())
            .unwrap_or_default()
    }

    /// [`fence_expiry`](Self::fence_expiry) as a number: `None` for `""`.
    fn fence_expiry_ms(&self, ttl_ms: u64) -> Option<u64> {
        self.config.fence_retention().map(|r| {
            let keep = u64::try_from(r.as_millis()).unwrap_or(u64::MAX);
            ttl_ms.saturating_add(keep)
        })
    }

    /// The primaries of the cluster (from `CLUSTER SLOTS`), as routable addresses.
    async fn primaries(&self) -> Result<Vec<(String, u16)>, StoreError> {
        let v = self
            .conn
            .command(
                "list",
                redis::cmd("CLUSTER").arg("SLOTS"),
                Some(RoutingInfo::SingleNode(SingleNodeRoutingInfo::Random)),
            )
            .await?;
        let primaries = crate::policy::cluster_primaries(&v).ok_or_else(|| {
            StoreError::new(
                StoreErrorKind::Other,
                BACKEND,
                "list: unexpected CLUSTER SLOTS reply",
            )
        })?;
        Ok(primaries.into_iter().map(|n| (n.host, n.port)).collect())
    }

    /// `SCAN` one node (or the server) for lease keys matching `pattern`.
    async fn scan(
        &self,
        pattern: &str,
        node: Option<(String, u16)>,
    ) -> Result<Vec<Key>, StoreError> {
        let mut cursor = 0u64;
        let mut keys = Vec::new();
        loop {
            let cmd = scripts::scan_step(cursor, pattern);
            let routing = node.as_ref().map(|(host, port)| {
                RoutingInfo::SingleNode(SingleNodeRoutingInfo::ByAddress {
                    host: host.clone(),
                    port: *port,
                })
            });
            let v = self.conn.command("list", &cmd, routing).await?;
            let (next, found) = match v {
                Value::Array(mut parts) if parts.len() == 2 => {
                    let found = parts.pop().expect("2");
                    let next = parts.pop().expect("1");
                    (next, found)
                }
                _ => {
                    return Err(StoreError::new(
                        StoreErrorKind::Other,
                        BACKEND,
                        "list: unexpected SCAN reply",
                    ));
                }
            };
            cursor = match next {
                Value::BulkString(b) => std::str::from_utf8(&b)
                    .ok()
                    .and_then(|s| s.parse().ok())
                    .unwrap_or(0),
                Value::Int(i) => u64::try_from(i).unwrap_or(0),
                _ => 0,
            };
            if let Value::Array(found) = found {
                for k in found {
                    if let Value::BulkString(b) = k
                        && let Ok(s) = std::str::from_utf8(&b)
                        && let Some(key) = self.layout.parse_lease_name(s)
                    {
                        keys.push(key);
                    }
                }
            }
            if cursor == 0 {
                return Ok(keys);
            }
        }
    }
}

#[async_trait]
impl Store for RedisStore {
    fn backend(&self) -> &'static str {
        BACKEND
    }

    fn capabilities(&self) -> Capabilities {
        let mut c = Capabilities::minimal();
        c.fifo_wait = self.notifier.is_some();
        c.hands_off = self.notifier.is_some();
        c.reports_remaining = true;
        c.session_bound = false;
        // A renewal is `PEXPIRE` of the TTL asked. Not through Sentinel: a replica whose
        // clock runs ahead, once promoted, ends it sooner, and a renewal answers the TTL
        // asked less that allowance ("Replica clocks" in the crate docs).
        c.sets_expiry = !self.conn.is_sentinel();
        c.fence_durability = FenceDurability::ClockFloored;
        // Refused at every (re)connection and policy check unless accepted explicitly.
        c.may_evict = self.config.allow_eviction();
        c
    }

    /// Always: batches of renewals are one pipeline per server (per Cluster node), and
    /// `acquire_any` one script on a single server or a Sentinel set.
    fn batch(&self) -> Option<&dyn BatchStore> {
        Some(self)
    }

    /// With notifications on (the default; `notify=false` turns them off).
    fn watcher(&self) -> Option<&dyn WatchStore> {
        self.notifier.as_ref().map(|_| self as &dyn WatchStore)
    }

    /// With notifications on (the default; `notify=false` turns them off).
    fn waiter(&self) -> Option<&dyn WaitStore> {
        self.notifier.as_ref().map(|_| self as &dyn WaitStore)
    }

    /// # Cancel safety
    /// Cancel safe in the sense of the trait: a dropped call may still be applied by the
    /// server (a retry with the same owner then returns the same fence).
    async fn acquire(
        &self,
        key: &Key,
        owner: &OwnerToken,
        ttl: Duration,
    ) -> Result<AcquireOutcome, StoreError> {
        let ttl_ms = ttl_ms(ttl)?;
        let before = self.conn.clock_allowance("acquire")?;
        let keep = self.fence_expiry_ms(ttl_ms);
        let op = self.op(key, "a", owner, Some(ttl_ms), keep);
        let Answer::Acquired(got) = self.batcher.submit(self.slot(key), op).await? else {
            return Err(StoreError::new(
                StoreErrorKind::Corrupt,
                BACKEND,
                "acquire: a release's answer came back",
            ));
        };
        Ok(match got {
            Acquired::Granted { fence, ttl } => AcquireOutcome::Acquired {
                fence,
                ttl: self.granted(ttl, before),
            },
            Acquired::Held { remaining } => AcquireOutcome::Held {
                remaining: Some(remaining),
            },
        })
    }

    /// # Cancel safety
    /// As [`acquire`](Self::acquire).
    async fn renew(
        &self,
        key: &Key,
        owner: &OwnerToken,
        ttl: Duration,
    ) -> Result<RenewOutcome, StoreError> {
        let ms_value = ttl_ms(ttl)?;
        let before = self.conn.clock_allowance("renew")?;
        let ms = ms_value.to_string();
        let lease = self.layout.lease_name(key);
        let owner = owner.to_hex();
        let renewed = self
            .conn
            .run(
                "renew",
                &SCRIPTS.renew,
                &[&lease],
                &[&owner, &ms],
                scripts::parse_flag,
            )
            .await?;
        Ok(if renewed {
            RenewOutcome::Renewed {
                ttl: self.granted(Duration::from_millis(ms_value), before),
            }
        } else {
            RenewOutcome::NotOwner
        })
    }

    /// # Cancel safety
    /// As [`acquire`](Self::acquire).
    async fn release(&self, key: &Key, owner: &OwnerToken) -> Result<ReleaseOutcome, StoreError> {
        let op = self.op(key, "r", owner, None, self.fence_expiry_ms(0));
        let Answer::Released(released) = self.batcher.submit(self.slot(key), op).await? else {
            return Err(StoreError::new(
                StoreErrorKind::Corrupt,
                BACKEND,
                "release: an acquire's answer came back",
            ));
        };
        Ok(if released {
            ReleaseOutcome::Released
        } else {
            ReleaseOutcome::NotOwner
        })
    }

    /// # Cancel safety
    /// Cancel safe (read only).
    async fn inspect(&self, key: &Key) -> Result<Option<LeaseInfo>, StoreError> {
        let names = self.layout.names(key);
        self.inspect_names(key, &names).await
    }

    /// `SCAN MATCH` over the namespace (on every primary of a Cluster), then one inspect
    /// per lease found. Not a snapshot: leases taken or released meanwhile may or may not
    /// be listed. Each command is bounded by the operation timeout.
    ///
    /// # Cancel safety
    /// Cancel safe (read only).
    async fn list(&self, prefix: &str) -> Result<Vec<LeaseInfo>, StoreError> {
        let pattern = self.layout.scan_pattern(prefix);
        let mut keys = if self.conn.is_cluster() {
            let mut keys = Vec::new();
            for node in self.primaries().await? {
                keys.extend(self.scan(&pattern, Some(node)).await?);
            }
            keys
        } else {
            self.scan(&pattern, None).await?
        };
        keys.sort();
        keys.dedup();
        let mut out = Vec::with_capacity(keys.len());
        for key in keys {
            if !key.as_str().starts_with(prefix) {
                continue;
            }
            if let Some(info) = self.inspect(&key).await? {
                out.push(info);
            }
        }
        Ok(out)
    }

    /// Deletes whatever lease holds `key` and advances its fence to
    /// `max(last + 1, server TIME in µs)`. A value that is not a leasehold lease is
    /// reported as [`StoreErrorKind::Corrupt`] and left in place.
    ///
    /// # Cancel safety
    /// As [`acquire`](Self::acquire); a retry advances the fence once more.
    async fn break_lease(&self, key: &Key) -> Result<Fence, StoreError> {
        let names = self.layout.names(key);
        let channel = self.channel(&names);
        self.conn
            .run(
                "break",
                &SCRIPTS.break_lease,
                &[&names.lease, &names.fence],
                &[&channel, &self.fence_expiry(0)],
                scripts::parse_break,
            )
            .await
    }

    /// One script on the record key (`p{e}:record`, one Cluster slot): reads the stored
    /// `<fence>:<value>`, writes ours if none is stored or the stored fence is lower
    /// (fences compared as decimal strings, exact over the whole u64 range), and returns
    /// what is stored after it. With `min_replicas`, `WAIT`s for the replicas as every
    /// write does (too few in time: `Ambiguous`).
    ///
    /// # Errors
    /// [`StoreErrorKind::InvalidInput`] for a value over [`MAX_RECORD_LEN`](leasehold_core::MAX_RECORD_LEN) (nothing is
    /// sent); [`StoreErrorKind::Corrupt`] when the record key holds something that is not
    /// a record (left untouched); the errors of every script call.
    ///
    /// # Cancel safety
    /// As [`acquire`](Self::acquire): a dropped call may have written the record (a
    /// retry with the same fence and value returns it).
    async fn put_record(
        &self,
        key: &Key,
        fence: Fence,
        value: &[u8],
    ) -> Result<Record, StoreError> {
        StoreError::check_record_value(BACKEND, value)?;
        let name = self.layout.record_name(key);
        let fence = crate::records::fence_arg(fence);
        // With notifications on, the key's watch mark and channel: a write is told to
        // the key's watchers.
        let names = self.layout.names(key);
        let channel = self.channel(&names);
        let (keys, args): (Vec<&str>, Vec<&[u8]>) = if self.notifier.is_some() {
            (
                vec![&name, &names.watch],
                vec![fence.as_bytes(), value, channel.as_bytes()],
            )
        } else {
            (vec![&name], vec![fence.as_bytes(), value])
        };
        self.conn
            .run("put record", &SCRIPTS.put_record, &keys, &args, |v, id| {
                crate::records::parse_put_reply(v, id)
            })
            .await
    }

    /// One read-only script on the record key.
    ///
    /// # Cancel safety
    /// Cancel safe (read only).
    async fn get_record(&self, key: &Key) -> Result<Option<Record>, StoreError> {
        let name = self.layout.record_name(key);
        self.conn
            .run_read("get record", &SCRIPTS.get_record, &[&name], &[], |v, id| {
                crate::records::parse_reply(v, id)
            })
            .await
    }

    async fn diagnose(&self) -> Result<leasehold_core::Diagnosis, StoreError> {
        crate::doctor::diagnose(&self.conn, &self.config).await
    }
}

#[async_trait]
impl BatchStore for RedisStore {
    /// One script spans the slots' keys on one server (or a Sentinel set); a Cluster
    /// spreads them over hash slots, so there each slot is acquired on its own.
    fn atomic_acquire_any(&self) -> bool {
        !self.is_cluster()
    }

    /// One script call per Cluster slot (a single server: one call), each renewing up to
    /// [`RENEW_BATCH`] leases; the calls for different slots run concurrently. A call that
    /// fails fails for each of its leases (ambiguous as a single renewal would be).
    ///
    /// # Cancel safety
    /// As [`acquire`](Self::acquire): a dropped call may have renewed any of the leases.
    async fn renew_many(
        &self,
        leases: &[(Key, OwnerToken)],
        ttl: Duration,
    ) -> Result<Vec<Result<RenewOutcome, StoreError>>, StoreError> {
        let ms_value = ttl_ms(ttl)?;
        let before = self.conn.clock_allowance("renew")?;
        let ms = ms_value.to_string();
        // Positions of the leases, by slot (one group on a single server).
        let mut groups: std::collections::BTreeMap<u16, Vec<usize>> = Default::default();
        let cluster = self.conn.is_cluster();
        for (i, (key, _)) in leases.iter().enumerate() {
            let slot = if cluster { self.layout.slot(key) } else { 0 };
            groups.entry(slot).or_default().push(i);
        }
        let calls = groups
            .values()
            .flat_map(|positions| positions.chunks(RENEW_BATCH))
            .map(|positions| {
                let names: Vec<String> = positions
                    .iter()
                    .map(|&i| self.layout.lease_name(&leases[i].0))
                    .collect();
                let mut args: Vec<String> = Vec::with_capacity(positions.len() + 1);
                args.push(ms.clone());
                args.extend(positions.iter().map(|&i| leases[i].1.to_hex()));
                async move {
                    let keys: Vec<&str> = names.iter().map(String::as_str).collect();
                    let args: Vec<&str> = args.iter().map(String::as_str).collect();
                    let n = positions.len();
                    let got = self
                        .conn
                        .run("renew", &SCRIPTS.renew_many, &keys, &args, |v, id| {
                            scripts::parse_renew_many(v, id, n)
                        })
                        .await;
                    (positions, got)
                }
            });
        let mut answers = futures::future::join_all(calls).await;
        let granted = self.granted(Duration::from_millis(ms_value), before);
        if answers.len() == 1 && answers[0].1.is_err() {
            // One call, failed: the batch as a whole failed.
            if let Some((_, Err(e))) = answers.pop() {
                return Err(e);
            }
        }
        let mut out: Vec<Option<Result<RenewOutcome, StoreError>>> =
            std::iter::repeat_with(|| None).take(leases.len()).collect();
        for (positions, got) in answers {
            match got {
                Ok(results) => {
                    for (&i, r) in positions.iter().zip(results) {
                        out[i] = Some(match r {
                            Renewed::Yes => Ok(RenewOutcome::Renewed { ttl: granted }),
                            Renewed::NotOwner => Ok(RenewOutcome::NotOwner),
                            Renewed::Failed(text) => Err(scripts::item_error("renew", &text)),
                        });
                    }
                }
                Err(e) => {
                    for &i in positions {
                        out[i] = Some(Err(StoreError::new(e.kind(), BACKEND, e.message())));
                    }
                }
            }
        }
        Ok(out.into_iter().flatten().collect())
    }

    /// One Lua script over every key's lease, fence and queue keys on a single server or
    /// a Sentinel set: each key is acquired as [`acquire`](Self::acquire) would (fence
    /// floored at the server's clock, queue and reservations), the owner's key first,
    /// else the first granted in order. On a Cluster the keys hash to different slots,
    /// which no script can span: there it is the default,
    /// [`acquire_any_one_by_one`](leasehold_core::acquire_any_one_by_one) (see
    /// [`atomic_acquire_any`](BatchStore::atomic_acquire_any)).
    ///
    /// # Cancel safety
    /// As [`acquire`](Self::acquire).
    async fn acquire_any(
        &self,
        keys: &[Key],
        owner: &OwnerToken,
        ttl: Duration,
    ) -> Result<AcquireAnyOutcome, StoreError> {
        if self.is_cluster() || keys.is_empty() {
            return leasehold_core::acquire_any_one_by_one(self, keys, owner, ttl).await;
        }
        let call = AnyCall::new(self, keys, owner, ttl)?;
        let before = self.conn.clock_allowance("acquire")?;
        let (key_args, args) = call.args(&[]);
        let n = keys.len();
        let got = self
            .conn
            .run(
                "acquire",
                &SCRIPTS.acquire_any,
                &key_args,
                &args,
                |v, id| scripts::parse_acquire_any(v, id, n),
            )
            .await?;
        Ok(self.granted_any(got, before))
    }

    /// One Lua script where [`acquire_any`](Self::acquire_any) is one (a single server, a
    /// Sentinel set): the record check (written at fence 0 if absent, telling its
    /// watchers, as [`put_record`](Self::put_record) would) and the acquire together, so
    /// that a semaphore's permit is one script call. On a Cluster (the record and the
    /// slots hash to different slots) and for no keys: the default, `put_record` then
    /// `acquire_any`.
    ///
    /// # Errors
    /// As [`put_record`](Self::put_record) and [`acquire_any`](Self::acquire_any).
    ///
    /// # Cancel safety
    /// As [`acquire`](Self::acquire): a dropped call may have written the record and
    /// granted a key.
    async fn acquire_any_checked(
        &self,
        keys: &[Key],
        owner: &OwnerToken,
        ttl: Duration,
        check: RecordCheck<'_>,
    ) -> Result<CheckedAcquire, StoreError> {
        if self.is_cluster() || keys.is_empty() {
            return leasehold_core::acquire_any_checked_in_two_calls(self, keys, owner, ttl, check)
                .await;
        }
        StoreError::check_record_value(BACKEND, check.value)?;
        let call = AnyCall::new(self, keys, owner, ttl)?;
        let before = self.conn.clock_allowance("acquire")?;
        let record = self.layout.record_name(check.key);
        let record_names = self.layout.names(check.key);
        let record_channel = self.channel(&record_names);
        let front = [record.as_str(), record_names.watch.as_str()];
        let (key_args, args) = call.args(&front);
        let mut bytes: Vec<&[u8]> = args.iter().map(|a| a.as_bytes()).collect();
        // After owner, ttl, fence expiry and grace: the value and the record's channel.
        bytes.splice(4..4, [check.value, record_channel.as_bytes()]);
        let n = keys.len();
        let got = self
            .conn
            .run(
                "acquire",
                &SCRIPTS.acquire_any_checked,
                &key_args,
                &bytes,
                |v, id| scripts::parse_acquire_any_checked(v, id, n),
            )
            .await?;
        Ok(match got {
            CheckedAcquire::Passed(any) => CheckedAcquire::Passed(self.granted_any(any, before)),
            other => other,
        })
    }
}

#[async_trait]
impl WatchStore for RedisStore {
    /// Subscribes to the key's channel (the one its waiters use), then marks the key
    /// watched (`p{e}:w`, for [`WATCH_MARK_TTL`]) with one script that also publishes
    /// this watch's heartbeat, and returns once the heartbeat came back: the subscription
    /// is known to hear the key. From then on the scripts publish the key's changes:
    /// a grant, a release, a break, a record write (see the crate docs, "Watching").
    /// A task of the watch refreshes the mark every [`WATCH_REFRESH`] and checks the
    /// heartbeat each time; a refresh that fails, a heartbeat that does not come back
    /// within the operation timeout, or a lost pub/sub connection ends the stream with an
    /// `Err` item. Dropping the stream stops the task and unsubscribes once nobody else
    /// in this store waits on or watches the key; the mark lapses by itself (other
    /// processes may be watching the key too).
    ///
    /// # Errors
    /// `Unsupported` with notifications off (`notify=false`: the store then offers no
    /// watcher, [`Store::watcher`] is `None`); the errors of subscribing
    /// and of the script; `Unavailable` when the heartbeat does not come back in time.
    ///
    /// # Cancel safety
    /// Cancel safe: a dropped call leaves at most the mark behind, which lapses.
    async fn watch(&self, key: &Key) -> Result<Changes, StoreError> {
        let Some(notifier) = &self.notifier else {
            return Err(StoreError::unsupported(
                BACKEND,
                "watching (notifications are off: notify=false)",
            ));
        };
        let names = self.layout.names(key);
        let beat = format!("~{}", OwnerToken::random().to_hex());
        let reg = notifier.watch(&names.channel, &beat);
        notifier.subscribe_watcher(&reg).await?;
        let watch = Watching {
            conn: self.conn.clone(),
            mark: names.watch.clone(),
            channel: self.channel(&names),
            beat,
            reg,
        };
        watch.refresh().await?;
        let (tx, rx) = tokio::sync::mpsc::channel(1);
        let task = tokio::spawn(watch.run(tx)).abort_handle();
        Ok(Box::pin(WatchStream { rx, task }))
    }
}

#[async_trait]
impl WaitStore for RedisStore {
    /// Waits in the key's queue. Subscribes to the key's channel, then (one script) joins
    /// the queue as `owner` — or returns at once when the lease is free with nobody ahead,
    /// or already reserved for `owner` — and waits until the lease is reserved for
    /// `owner` (a release, or a lease found free, hands it to the first live waiter and
    /// publishes that waiter's owner), the holder's expiry, or `timeout`, whichever comes
    /// first. The caller then acquires as `owner`, which confirms a reservation; a
    /// reservation not confirmed within the queue grace lapses, and the lease passes on.
    ///
    /// The queue entry lives until the end of this wait plus the queue grace, so a waiter
    /// that goes away holds nobody up for longer; a waiter that waits again (after a
    /// `Held` answer) keeps its place.
    ///
    /// # Cancel safety
    /// Cancel safe: the subscription is dropped (in the background) when the last waiter
    /// on a key leaves; the queue entry lapses on its own (see above).
    async fn wait_released(
        &self,
        key: &Key,
        owner: &OwnerToken,
        timeout: Duration,
    ) -> Result<(), StoreError> {
        let notifier = self.waiting_notifier()?;
        let deadline = wait_deadline(timeout);
        let names = self.layout.names(key);
        let owner = owner.to_hex();
        let reg = notifier.register(&names.channel, &owner);
        let go = reg.wake().go.notified();
        tokio::pin!(go);
        go.as_mut().enable();
        notifier.subscribe(&reg).await?;
        let longest = u64::try_from(timeout.as_millis())
            .unwrap_or(u64::MAX)
            .clamp(1, 24 * 3600 * 1000)
            .to_string();
        let wait = self
            .conn
            .run(
                "wait for release",
                &SCRIPTS.wait,
                &[
                    &names.lease,
                    &names.fence,
                    &names.queue,
                    &names.queue_deadlines,
                ],
                &[
                    &owner,
                    &longest,
                    &self.grace(),
                    &self.fence_expiry(0),
                    &self.channel(&names),
                ],
                scripts::parse_wait,
            )
            .await?;
        let Some(remaining) = wait else {
            return Ok(());
        };
        let mut wake = deadline.min(Instant::now() + remaining);
        loop {
            // Told it is next: the reservation of the waiter ahead lapses after the
            // grace if that waiter went away; re-check then at the latest.
            let next = reg.wake().next.notified();
            tokio::select! {
                _ = &mut go => return Ok(()),
                _ = tokio::time::sleep_until(wake) => return Ok(()),
                _ = next => {
                    let lapse = Instant::now() + self.config.queue_grace() + LAPSE_MARGIN;
                    wake = wake.min(lapse);
                }
            }
        }
    }

    /// Waits in the key's queue, keeping its place by heartbeats (docs/design.md section
    /// 11): subscribes to the key's channel, then sends the heartbeat script at once and
    /// every twentieth of `ttl` (within 10 ms ..= 1 s). Each heartbeat joins (or stays in) the queue
    /// with the TTL this waiter asks for, its entry living two periods; it answers "go"
    /// (the lease is free with nobody ahead: [`WaitOutcome::Retry`]), "still waiting"
    /// (with the key's last fence), or "yours" (a grant made before it was processed,
    /// whose notice was missed: `Retry`, and the acquire confirms it). A release (or a
    /// lease found free) grants the lease to the first live waiter for its TTL and
    /// publishes `<owner>:<fence>:<ttl>`; on that notice this answers
    /// [`WaitOutcome::Granted`], valid from the send of the latest heartbeat answered
    /// "still waiting" whose fence is below the grant's (so processed before it); with
    /// none, `Retry`. Any other notice for this owner (a reservation made by a version of
    /// leasehold that does not hand over, a break) answers `Retry`, as does the end of
    /// `timeout`.
    ///
    /// # Cancel safety
    /// Cancel safe: the subscription is dropped (in the background) when the last waiter
    /// on a key leaves; the queue entry lapses two heartbeat periods after the last
    /// heartbeat; a grant made for this owner stays until its TTL or this owner's next
    /// acquire (which confirms it) or release.
    async fn wait_turn(
        &self,
        key: &Key,
        owner: &OwnerToken,
        ttl: Duration,
        timeout: Duration,
    ) -> Result<WaitOutcome, StoreError> {
        let notifier = self.waiting_notifier()?;
        let ttl_arg = ttl_ms(ttl)?.to_string();
        let period = heartbeat_period(ttl);
        let life = (period * 2).as_millis().to_string();
        let deadline = wait_deadline(timeout);
        let names = self.layout.names(key);
        let owner = owner.to_hex();
        let reg = notifier.register(&names.channel, &owner);
        notifier.subscribe(&reg).await?;
        let (grace, keep, channel) = (self.grace(), self.fence_expiry(0), self.channel(&names));
        let mut heard: VecDeque<(Instant, Fence)> = VecDeque::with_capacity(HEARD);
        loop {
            let go = reg.wake().go.notified();
            tokio::pin!(go);
            go.as_mut().enable();
            if let Some((fence, granted)) = reg.wake().take_granted() {
                return Ok(handed(&heard, fence, granted));
            }
            let sent = Instant::now();
            let turn = self
                .conn
                .run(
                    "wait for release",
                    &SCRIPTS.wait_turn,
                    &[
                        &names.lease,
                        &names.fence,
                        &names.queue,
                        &names.queue_deadlines,
                    ],
                    &[&owner, &ttl_arg, &life, &grace, &keep, &channel],
                    scripts::parse_turn,
                )
                .await?;
            match turn {
                Turn::Go | Turn::Mine => return Ok(WaitOutcome::Retry),
                Turn::Waiting { last } => {
                    if heard.len() == HEARD {
                        heard.pop_front();
                    }
                    heard.push_back((sent, last));
                }
            }
            if Instant::now() >= deadline {
                return Ok(WaitOutcome::Retry);
            }
            tokio::select! {
                _ = &mut go => {
                    return Ok(match reg.wake().take_granted() {
                        Some((fence, granted)) => handed(&heard, fence, granted),
                        None => WaitOutcome::Retry,
                    });
                }
                _ = tokio::time::sleep_until(deadline.min(Instant::now() + period)) => {}
            }
        }
    }
}

/// How often a waiter that asks for `ttl` sends its heartbeat ([`WaitStore::wait_turn`]):
/// a twentieth of the TTL, within 10 ms ..= 1 s. Its queue entry lives two of these after
/// each heartbeat, so the store hands the lease only to a waiter it heard from within
/// that interval (a tenth of the TTL, for TTLs up to 20 s).
pub(crate) fn heartbeat_period(ttl: Duration) -> Duration {
    (ttl / 20).clamp(Duration::from_millis(10), Duration::from_secs(1))
}

/// When a wait of `timeout` from now ends (a year from now at the latest).
fn wait_deadline(timeout: Duration) -> Instant {
    let now = Instant::now();
    now.checked_add(timeout)
        .unwrap_or_else(|| now + Duration::from_secs(365 * 24 * 3600))
}

/// The most heartbeats answered "still waiting" a wait remembers (the latest ones).
const HEARD: usize = 16;

/// The grant `fence` (TTL `ttl`) a notice told of, against the heartbeats answered "still
/// waiting" (`heard`: send instant and the key's last fence when the store processed it,
/// oldest first): valid from the send of the latest one processed before the grant — the
/// latest whose last fence is below `fence` (a grant after a heartbeat has a higher fence
/// than any issued before it). With none, the grant is confirmed by an acquire.
fn handed(heard: &VecDeque<(Instant, Fence)>, fence: Fence, ttl: Duration) -> WaitOutcome {
    match heard.iter().rev().find(|(_, last)| *last < fence) {
        Some((sent, _)) => WaitOutcome::Granted(HandedGrant {
            fence,
            ttl,
            waiting_sent_at: *sent,
        }),
        None => WaitOutcome::Retry,
    }
}

/// The keys and arguments of an acquire of any of several leases, as the `ACQUIRE_ANY`
/// script (and the checked one, after its own) takes them.
struct AnyCall {
    names: Vec<String>,
    channels: Vec<String>,
    fixed: [String; 4],
}

impl AnyCall {
    fn new(
        store: &RedisStore,
        keys: &[Key],
        owner: &OwnerToken,
        ttl: Duration,
    ) -> Result<Self, StoreError> {
        let ttl_ms = ttl_ms(ttl)?;
        let mut names = Vec::with_capacity(keys.len() * 5);
        let mut channels = Vec::with_capacity(keys.len());
        for key in keys {
            let n = store.layout.names(key);
            channels.push(store.channel(&n));
            names.extend([n.lease, n.fence, n.queue, n.queue_deadlines, n.watch]);
        }
        Ok(Self {
            names,
            channels,
            fixed: [
                owner.to_hex(),
                ttl_ms.to_string(),
                store.fence_expiry(ttl_ms),
                store.grace(),
            ],
        })
    }

    /// `front` keys, then five per lease; owner, ttl, fence expiry, grace, then one
    /// channel per lease (the request id goes in front of these when the call is sent).
    fn args<'a>(&'a self, front: &[&'a str]) -> (Vec<&'a str>, Vec<&'a str>) {
        let mut keys: Vec<&str> = front.to_vec();
        keys.extend(self.names.iter().map(String::as_str));
        let mut args: Vec<&str> = self.fixed.iter().map(String::as_str).collect();
        args.extend(self.channels.iter().map(String::as_str));
        (keys, args)
    }
}

/// A running watch (see [`RedisStore::watch`]).
struct Watching {
    conn: Arc<Conn>,
    /// The key's watch mark.
    mark: String,
    /// The channel argument of the scripts.
    channel: String,
    /// This watch's heartbeat message.
    beat: String,
    reg: WatchRegistration,
}

impl Watching {
    /// Refreshes the mark, publishing the heartbeat, and waits for the heartbeat to come
    /// back, all within the operation timeout.
    async fn refresh(&self) -> Result<(), StoreError> {
        let limit = self.conn.op_timeout();
        let deadline = Instant::now() + limit;
        let heard = self.reg.watcher().heard.notified();
        tokio::pin!(heard);
        heard.as_mut().enable();
        let ttl = WATCH_MARK_TTL.as_millis().to_string();
        // A read-only run: no `WAIT` for replicas, which a mark refreshed every few
        // seconds does not need.
        self.conn
            .run_read(
                "watch",
                &SCRIPTS.watch,
                &[&self.mark],
                &[&ttl, &self.channel, &self.beat],
                scripts::parse_watch,
            )
            .await?;
        if self.reg.watcher().is_lost() {
            return Err(lost());
        }
        if tokio::time::timeout_at(deadline, heard).await.is_err() {
            // The subscription does not hear the key: the next one connects afresh.
            self.reg.notifier().reset();
            return Err(StoreError::new(
                StoreErrorKind::Unavailable,
                BACKEND,
                format!(
                    "watch: the heartbeat did not come back over pub/sub within {limit:?}; \
                     the subscription does not hear the key (the next watch connects afresh)"
                ),
            ));
        }
        Ok(())
    }

    /// Forwards change notices (coalesced: at most one waits to be taken) until the
    /// stream is dropped or the watch fails (then its error is the last item).
    async fn run(self, tx: tokio::sync::mpsc::Sender<Result<(), StoreError>>) {
        let watcher = self.reg.watcher();
        let mut next_refresh = Instant::now() + WATCH_REFRESH;
        loop {
            tokio::select! {
                () = watcher.changed.notified() => {
                    if watcher.is_lost() {
                        let _ = tx.send(Err(lost())).await;
                        return;
                    }
                    if let Err(tokio::sync::mpsc::error::TrySendError::Closed(_)) =
                        tx.try_send(Ok(()))
                    {
                        return;
                    }
                }
                () = tokio::time::sleep_until(next_refresh) => {
                    if let Err(e) = self.refresh().await {
                        let _ = tx.send(Err(e)).await;
                        return;
                    }
                    next_refresh = Instant::now() + WATCH_REFRESH;
                }
                () = tx.closed() => return,
            }
        }
    }
}

/// The error of a watch whose pub/sub connection was lost.
fn lost() -> StoreError {
    StoreError::new(
        StoreErrorKind::Unavailable,
        BACKEND,
        "watch: the pub/sub connection was lost; changes may have been missed (watch again)",
    )
}

/// The stream of a watch: its task's notices; dropping it stops the task.
struct WatchStream {
    rx: tokio::sync::mpsc::Receiver<Result<(), StoreError>>,
    task: tokio::task::AbortHandle,
}

impl futures::Stream for WatchStream {
    type Item = Result<(), StoreError>;

    fn poll_next(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Option<Self::Item>> {
        self.rx.poll_recv(cx)
    }
}

impl Drop for WatchStream {
    fn drop(&mut self) {
        self.task.abort();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use leasehold_core::config::MAX_TTL;

    #[test]
    fn ttl_rules() {
        assert_eq!(ttl_ms(Duration::from_secs(1)).unwrap(), 1000);
        assert_eq!(ttl_ms(Duration::from_micros(10_500)).unwrap(), 10);
        assert_eq!(
            ttl_ms(Duration::ZERO).unwrap_err().kind(),
            StoreErrorKind::InvalidInput
        );
        assert!(ttl_ms(Duration::from_micros(999)).is_err());
        assert!(ttl_ms(MAX_TTL + Duration::from_millis(1)).is_err());
        assert!(ttl_ms(Duration::MAX).is_err());
        assert!(ttl_ms(MAX_TTL).is_ok());
    }

    #[test]
    fn heartbeats_come_every_twentieth_of_the_ttl_within_bounds() {
        assert_eq!(
            heartbeat_period(Duration::from_secs(5)),
            Duration::from_millis(250)
        );
        assert_eq!(
            heartbeat_period(Duration::from_millis(100)),
            Duration::from_millis(10)
        );
        assert_eq!(
            heartbeat_period(Duration::from_secs(60)),
            Duration::from_secs(1)
        );
    }

    /// A notice's grant is matched with the latest heartbeat answered "still waiting"
    /// before it (a fence issued before the grant's), never a later one: a heartbeat that
    /// saw the grant's fence, or a higher one, was processed after the grant.
    #[test]
    fn a_notice_is_valid_from_the_latest_heartbeat_processed_before_its_grant() {
        let t0 = Instant::now();
        let (t1, t2) = (
            t0 + Duration::from_millis(100),
            t0 + Duration::from_millis(200),
        );
        let heard: VecDeque<_> = [(t0, Fence(5)), (t1, Fence(7)), (t2, Fence(7))].into();
        let ttl = Duration::from_secs(3);
        let at = |o: WaitOutcome| match o {
            WaitOutcome::Granted(g) => {
                assert_eq!(g.ttl, ttl);
                Some((g.waiting_sent_at, g.fence))
            }
            WaitOutcome::Retry => None,
        };
        assert_eq!(at(handed(&heard, Fence(8), ttl)), Some((t2, Fence(8))));
        assert_eq!(at(handed(&heard, Fence(6), ttl)), Some((t0, Fence(6))));
        assert_eq!(at(handed(&heard, Fence(7), ttl)), Some((t0, Fence(7))));
        assert_eq!(at(handed(&heard, Fence(5), ttl)), None);
        assert_eq!(at(handed(&VecDeque::new(), Fence(9), ttl)), None);
    }
}
