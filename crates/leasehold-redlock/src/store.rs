//! [`RedlockStore`]: the store contract over N independent Redis servers.

use std::collections::{BTreeSet, HashMap};
use std::time::Duration;

use async_trait::async_trait;
use futures::future::join_all;
use leasehold_core::{
    AcquireOutcome, Capabilities, Fence, FenceDurability, Key, LeaseInfo, OwnerToken, Record,
    ReleaseOutcome, RenewOutcome, Store, StoreError, StoreErrorKind,
};
use leasehold_redis::wire::{lease_key, parse_lease_key, scan_pattern};
use tokio::time::Instant;

use crate::BACKEND;
use crate::config::RedlockConfig;
use crate::node::NodeConn;
use crate::scripts::{Lua, NodeGrant, NodeView, SCRIPTS};

/// A lease store over the independent Redis servers of a Redlock set (see the crate
/// docs for the algorithm, the fence design and the failure model).
///
/// Every operation sends one request to every node at once, each bounded by its own
/// timeout, and decides by majority. `Debug` never shows the password.
#[derive(Debug)]
pub struct RedlockStore {
    config: RedlockConfig,
    nodes: Vec<NodeConn>,
}

/// No arguments after the request id.
const NONE: [&str; 0] = [];

/// What the nodes answered to one round.
struct Tally<T> {
    ok: Vec<(usize, T)>,
    errors: Vec<StoreError>,
}

impl<T> Tally<T> {
    /// The answers of the nodes, by node index.
    fn of(replies: impl IntoIterator<Item = (usize, Result<T, StoreError>)>) -> Self {
        let mut ok = Vec::new();
        let mut errors = Vec::new();
        for (i, r) in replies {
            match r {
                Ok(v) => ok.push((i, v)),
                Err(e) => errors.push(e),
            }
        }
        Self { ok, errors }
    }

    /// The first error that retrying will not cure (configuration, corrupt data), taken
    /// out.
    fn take_fatal(&mut self) -> Option<StoreError> {
        let i = self.errors.iter().position(|e| !e.kind().is_retryable())?;
        Some(self.errors.swap_remove(i))
    }

    /// The tally if at least `q` nodes answered; else the first fatal error, or a
    /// retryable one ([`short`](Self::short)) saying `what` of the number that answered.
    fn majority(
        mut self,
        q: usize,
        op: &str,
        what: impl FnOnce(usize) -> String,
    ) -> Result<Self, StoreError> {
        if let Some(e) = self.take_fatal() {
            return Err(e);
        }
        if self.ok.len() < q {
            let what = what(self.ok.len());
            return Err(self.short(op, what));
        }
        Ok(self)
    }

    /// A retryable error saying that `what` reached too few nodes, of the kind of the
    /// nodes' errors (`Timeout` if any request may have been applied).
    fn short(&self, op: &str, what: String) -> StoreError {
        let kind = if self.errors.iter().any(|e| e.kind().is_ambiguous()) {
            StoreErrorKind::Timeout
        } else {
            self.errors
                .first()
                .map_or(StoreErrorKind::Unavailable, StoreError::kind)
        };
        let detail = self
            .errors
            .first()
            .map(|e| format!("; first node error: {e}"))
            .unwrap_or_default();
        StoreError::new(kind, BACKEND, format!("{op}: {what}{detail}"))
    }
}

/// The record among the nodes' replies: the highest fence; among different values at that
/// fence (only concurrent puts at one fence with different values, see the crate docs),
/// the value most nodes replied with, then the smallest bytes. Deterministic for a given
/// set of replies.
fn pick<'a>(replies: impl IntoIterator<Item = &'a Record>) -> Option<Record> {
    let replies: Vec<&Record> = replies.into_iter().collect();
    let top = replies.iter().map(|r| r.fence).max()?;
    let mut counts: Vec<(&[u8], usize)> = Vec::new();
    for r in replies.iter().filter(|r| r.fence == top) {
        match counts.iter_mut().find(|(v, _)| *v == r.value.as_slice()) {
            Some((_, n)) => *n += 1,
            None => counts.push((&r.value, 1)),
        }
    }
    counts
        .into_iter()
        .max_by(|(va, na), (vb, nb)| na.cmp(nb).then_with(|| vb.cmp(va)))
        .map(|(value, _)| Record {
            fence: top,
            value: value.to_vec(),
        })
}

impl RedlockStore {
    /// A store for `config`. Does not connect: each node is connected on first use (and
    /// again after a failure).
    ///
    /// # Errors
    /// [`StoreErrorKind::Config`] when a node's address cannot be used.
    pub fn new(config: RedlockConfig) -> Result<Self, StoreError> {
        let nodes = config
            .nodes()
            .iter()
            .map(|n| NodeConn::new(&config, n))
            .collect::<Result<Vec<_>, _>>()?;
        Ok(Self { config, nodes })
    }

    /// Parses `url` (see [`RedlockConfig::from_url`]) and [connects](Self::connect).
    ///
    /// # Errors
    /// As [`RedlockConfig::from_url`] and [`connect`](Self::connect).
    ///
    /// # Cancel safety
    /// Cancel safe: dropping it only drops connections being opened.
    pub async fn open(url: &str) -> Result<Self, StoreError> {
        Self::connect(RedlockConfig::from_url(url)?).await
    }

    /// The error for `e`, a failed first connection: with plaintext connections, a node
    /// that speaks only TLS makes it a [`TlsProblem::PlaintextRefused`] error naming
    /// `tls=true`; otherwise `e` itself. Asked within the connect timeout, at most 1 s.
    ///
    /// [`TlsProblem::PlaintextRefused`]: leasehold_core::TlsProblem::PlaintextRefused
    async fn plaintext_refused(&self, e: StoreError) -> StoreError {
        #[cfg(feature = "tls")]
        if self.config.tls_settings().is_none() {
            let hosts: Vec<(String, u16)> = self
                .config
                .nodes()
                .iter()
                .map(|n| (n.host().to_owned(), n.port()))
                .collect();
            let within = self.config.connect_bound();
            return leasehold_core::tls_session::plaintext_refused(
                crate::BACKEND,
                e,
                &hosts,
                "tls=true",
                within,
            )
            .await;
        }
        e
    }

    /// A store for `config`, connected to every node it can reach within the connect
    /// timeout, so that a wrong password is reported now rather than by the first lease;
    /// each node reached must have `maxmemory-policy noeviction` unless the configuration
    /// allows eviction.
    ///
    /// # Errors
    /// [`StoreErrorKind::Config`] when a node refuses the credentials or its address is
    /// unusable; [`StoreErrorKind::Unavailable`] when fewer than a majority of the nodes
    /// could be reached (a minority down is fine: those are connected on later use);
    /// `Config` with a [`TlsFailure`](leasehold_core::TlsFailure) of problem
    /// `PlaintextRefused` when the URL has no `tls=true` and the nodes speak only TLS.
    ///
    /// # Cancel safety
    /// Cancel safe: dropping it only drops connections being opened.
    pub async fn connect(config: RedlockConfig) -> Result<Self, StoreError> {
        let store = Self::new(config)?;
        let bound = store.config.connect_bound();
        let deadline = Instant::now() + bound;
        let (n, q) = (store.nodes.len(), store.config.quorum());
        let pings = store.nodes.iter().map(|n| n.ping(deadline));
        let tally = match Tally::of(join_all(pings).await.into_iter().enumerate()).majority(
            q,
            "connecting",
            |answered| {
                format!("reached {answered} of {n} Redlock nodes, a majority ({q}) is needed")
            },
        ) {
            Ok(tally) => tally,
            Err(e) => return Err(store.plaintext_refused(e).await),
        };
        if !store.config.eviction_allowed() {
            // A node that may evict keys forgets leases early (docs/faults.md row 25): refused
            // unless accepted explicitly. Checked on every node reached now.
            let reached: Vec<usize> = tally.ok.iter().map(|(i, _)| *i).collect();
            let policies = join_all(
                reached
                    .iter()
                    .map(|i| store.nodes[*i].eviction_policy(deadline)),
            )
            .await;
            for (i, policy) in reached.iter().zip(policies) {
                let node = store.nodes[*i].name();
                match policy? {
                    Some(p) if p == "noeviction" => {}
                    Some(p) => {
                        return Err(StoreError::new(
                            StoreErrorKind::Config,
                            BACKEND,
                            format!(
                                "Redlock node {node} has maxmemory-policy {p}, which may evict held lease keys: set it to noeviction, or accept eviction with allow_eviction=true (exclusion can then break; only fences protect the data)"
                            ),
                        ));
                    }
                    None => {
                        return Err(StoreError::new(
                            StoreErrorKind::Config,
                            BACKEND,
                            format!(
                                "Redlock node {node} does not report its maxmemory-policy; accept that with allow_eviction=true"
                            ),
                        ));
                    }
                }
            }
        }
        Ok(store)
    }

    /// The configuration.
    pub fn config(&self) -> &RedlockConfig {
        &self.config
    }

    /// The Redis key holding `key`'s lease on every node (`owner:fence`, with the TTL as
    /// its expiry): `<prefix>{<key>}` with `%`, `{`, `}` percent-encoded.
    pub fn lease_key(&self, key: &Key) -> String {
        lease_key(self.config.key_prefix(), key)
    }

    /// The Redis key holding the last fence a node issued or recorded for `key` (never
    /// expires).
    pub fn fence_key(&self, key: &Key) -> String {
        format!("{}:fence", self.lease_key(key))
    }

    /// The Redis key holding the record named `key` on every node (`<fence>:<value>`, never
    /// expires; see [`put_record`](Store::put_record)): [`lease_key`](Self::lease_key)
    /// plus `:record`, the layout and the scripts of `leasehold-redis`.
    pub fn record_key(&self, key: &Key) -> String {
        format!("{}:record", self.lease_key(key))
    }

    /// Writes `record` back to the nodes `behind` (they answered a read with no record or
    /// a lower fence), at once, bounded by the node timeout; best effort (a node that
    /// fails is repaired by a later read).
    async fn repair(&self, name: &str, record: &Record, behind: &[usize]) {
        let deadline = Instant::now() + self.config.node_bound();
        let fence = leasehold_redis::records::fence_arg(record.fence);
        let args: [&[u8]; 2] = [fence.as_bytes(), &record.value];
        let op = "get record (repairing a node)";
        let failed = self
            .run_on(behind, op, deadline, &SCRIPTS.put_record, &[name], &args)
            .await
            .errors
            .len();
        tracing::debug!(
            repaired = behind.len() - failed,
            failed,
            "redlock: record written back to nodes that were behind"
        );
    }

    /// The bound on each node's request in an acquire or renewal of `ttl`: the node
    /// timeout, but at most a third of the TTL.
    fn step_bound(&self, ttl: Duration) -> Duration {
        self.config.node_bound().min(ttl / 3)
    }

    /// Runs `lua` with `keys` and `args` on the nodes `on` at once, each request by
    /// `deadline`; their answers, by node.
    async fn run_on<T, A: AsRef<[u8]>>(
        &self,
        on: &[usize],
        op: &str,
        deadline: Instant,
        lua: &Lua<T>,
        keys: &[&str],
        args: &[A],
    ) -> Tally<T> {
        let runs = on
            .iter()
            .map(|&i| self.nodes[i].run(op, deadline, lua, keys, args));
        Tally::of(on.iter().copied().zip(join_all(runs).await))
    }

    /// [`run_on`](Self::run_on) every node.
    async fn run_all<T, A: AsRef<[u8]>>(
        &self,
        op: &str,
        deadline: Instant,
        lua: &Lua<T>,
        keys: &[&str],
        args: &[A],
    ) -> Tally<T> {
        let all: Vec<usize> = (0..self.nodes.len()).collect();
        self.run_on(&all, op, deadline, lua, keys, args).await
    }

    /// Best-effort release of `owner`'s lease on the nodes `granted` (after a refused
    /// acquire). Nodes whose reply did not come keep their partial lock until its TTL:
    /// the caller, told the outcome is unknown, retries with the same owner and finds it.
    async fn release_on(&self, granted: &[usize], lease: &str, owner: &str, bound: Duration) {
        let deadline = Instant::now() + bound;
        let op = "release after a refused acquire";
        let failed = self
            .run_on(granted, op, deadline, &SCRIPTS.release, &[lease], &[owner])
            .await
            .errors
            .len();
        if failed > 0 {
            tracing::debug!(
                failed,
                "redlock: partial locks of a refused acquire left to expire with their TTL"
            );
        }
    }

    /// `ttl − elapsed − drift`, if positive.
    fn validity(&self, ttl: Duration, started: Instant) -> Option<Duration> {
        ttl.checked_sub(started.elapsed())
            .and_then(|v| v.checked_sub(self.config.drift(ttl)))
            .filter(|v| !v.is_zero())
    }
}

#[async_trait]
impl Store for RedlockStore {
    fn backend(&self) -> &'static str {
        BACKEND
    }

    fn capabilities(&self) -> Capabilities {
        let mut caps = Capabilities::minimal();
        caps.reports_remaining = true;
        caps.fence_durability = FenceDurability::ClockFloored;
        caps
    }

    /// Round one on every node at once (set if free, or extend if this owner's, each
    /// node returning its fence candidate), then, with a majority granted, round two
    /// writes the highest candidate to those nodes. Granted when a majority recorded it
    /// and `ttl − elapsed − drift` is still positive; the reported TTL is that validity,
    /// so the holder's deadline counts from the request's send. Otherwise the lease is
    /// released (best effort) on every node that granted it, and the answer is `Held`
    /// (other owners hold too many nodes for a majority) or a retryable error.
    ///
    /// # Cancel safety
    /// A dropped call may leave partial locks; they expire with their TTL, and a retry
    /// with the same owner reuses them.
    async fn acquire(
        &self,
        key: &Key,
        owner: &OwnerToken,
        ttl: Duration,
    ) -> Result<AcquireOutcome, StoreError> {
        StoreError::check_ttl(BACKEND, ttl)?;
        let started = Instant::now();
        let bound = self.step_bound(ttl);
        let (lease, fence_key) = (self.lease_key(key), self.fence_key(key));
        let owner_hex = owner.to_hex();
        let ttl_ms = ttl.as_millis().to_string();
        let (n, q) = (self.nodes.len(), self.config.quorum());
        let deadline = started + bound;
        let keys = [lease.as_str(), fence_key.as_str()];
        let args = [owner_hex.as_str(), ttl_ms.as_str()];
        let mut tally = self
            .run_all("acquire", deadline, &SCRIPTS.acquire, &keys, &args)
            .await;
        let fatal = tally.take_fatal();
        let granted: Vec<(usize, Fence)> = tally
            .ok
            .iter()
            .filter_map(|(i, g)| match g {
                NodeGrant::Granted(f) => Some((*i, *f)),
                NodeGrant::Held(_) => None,
            })
            .collect();
        let mut held: Vec<Duration> = tally
            .ok
            .iter()
            .filter_map(|(_, g)| match g {
                NodeGrant::Held(d) => Some(*d),
                NodeGrant::Granted(_) => None,
            })
            .collect();
        let granted_nodes: Vec<usize> = granted.iter().map(|(i, _)| *i).collect();
        if fatal.is_none() && granted.len() >= q {
            // Round two: the fence is the highest candidate, recorded on the granting
            // nodes (see the crate docs, "Fences").
            let fence = granted.iter().map(|(_, f)| *f).max().unwrap_or(Fence(1));
            let fs = fence.0.to_string();
            let deadline = Instant::now() + bound;
            let args = [owner_hex.as_str(), fs.as_str()];
            let op = "acquire (recording the fence)";
            let commits = self
                .run_on(&granted_nodes, op, deadline, &SCRIPTS.commit, &keys, &args)
                .await;
            let recorded = commits.ok.iter().filter(|(_, yes)| *yes).count();
            let validity = self.validity(ttl, started);
            if recorded >= q
                && let Some(validity) = validity
            {
                return Ok(AcquireOutcome::Acquired {
                    fence,
                    ttl: validity,
                });
            }
            self.release_on(&granted_nodes, &lease, &owner_hex, bound)
                .await;
            if recorded < q {
                let mut commits = commits;
                if let Some(e) = commits.take_fatal() {
                    return Err(e);
                }
                return Err(commits.short(
                    "acquire",
                    format!(
                        "the fence was recorded on {recorded} of {n} nodes, {q} needed; the \
                         partial locks were released"
                    ),
                ));
            }
            return Err(StoreError::new(
                StoreErrorKind::Timeout,
                BACKEND,
                format!(
                    "acquire: the nodes granted the lease but it took {:?}, leaving no validity \
                     of the {ttl:?} TTL after the drift allowance; the locks were released \
                     (retry, or use a longer TTL)",
                    started.elapsed()
                ),
            ));
        }
        self.release_on(&granted_nodes, &lease, &owner_hex, bound)
            .await;
        if let Some(e) = fatal {
            return Err(e);
        }
        if held.len() > n - q {
            // Free once enough held nodes expire to leave a majority free: the nodes
            // that granted us are free.
            held.sort_unstable();
            let need = q.saturating_sub(granted.len()).max(1);
            let remaining = held.get(need - 1).or(held.last()).copied();
            return Ok(AcquireOutcome::Held { remaining });
        }
        Err(tally.short(
            "acquire",
            format!(
                "granted on {} of {n} nodes, {q} needed; the partial locks were released",
                granted.len()
            ),
        ))
    }

    /// Extends the lease on every node where `owner` still holds it, all at once.
    /// `Renewed` when a majority extended it within the validity time (reported as the
    /// TTL, as for an acquire); `NotOwner` when too many nodes answered that the owner
    /// does not hold it for a majority to remain.
    ///
    /// # Cancel safety
    /// A dropped call may have extended the lease on some nodes.
    async fn renew(
        &self,
        key: &Key,
        owner: &OwnerToken,
        ttl: Duration,
    ) -> Result<RenewOutcome, StoreError> {
        StoreError::check_ttl(BACKEND, ttl)?;
        let started = Instant::now();
        let bound = self.step_bound(ttl);
        let lease = self.lease_key(key);
        let owner_hex = owner.to_hex();
        let ttl_ms = ttl.as_millis().to_string();
        let (n, q) = (self.nodes.len(), self.config.quorum());
        let deadline = started + bound;
        let keys = [lease.as_str()];
        let args = [owner_hex.as_str(), ttl_ms.as_str()];
        let mut tally = self
            .run_all("renew", deadline, &SCRIPTS.renew, &keys, &args)
            .await;
        let renewed = tally.ok.iter().filter(|(_, yes)| *yes).count();
        let not_owner = tally.ok.len() - renewed;
        if renewed >= q
            && let Some(validity) = self.validity(ttl, started)
        {
            return Ok(RenewOutcome::Renewed { ttl: validity });
        }
        if let Some(e) = tally.take_fatal() {
            return Err(e);
        }
        if not_owner > n - q {
            return Ok(RenewOutcome::NotOwner);
        }
        Err(tally.short(
            "renew",
            format!(
                "extended on {renewed} of {n} nodes ({q} needed) within the validity time of {ttl:?}"
            ),
        ))
    }

    /// Compare-and-delete on every node at once. `Released` when a majority deleted the
    /// owner's lease, `NotOwner` when the owner cannot have held it on a majority.
    ///
    /// # Cancel safety
    /// A dropped call may have deleted the lease on some nodes.
    async fn release(&self, key: &Key, owner: &OwnerToken) -> Result<ReleaseOutcome, StoreError> {
        let deadline = Instant::now() + self.config.node_bound();
        let lease = self.lease_key(key);
        let owner_hex = owner.to_hex();
        let (n, q) = (self.nodes.len(), self.config.quorum());
        let keys = [lease.as_str()];
        let args = [owner_hex.as_str()];
        let mut tally = self
            .run_all("release", deadline, &SCRIPTS.release, &keys, &args)
            .await;
        let released = tally.ok.iter().filter(|(_, yes)| *yes).count();
        if released >= q {
            return Ok(ReleaseOutcome::Released);
        }
        if let Some(e) = tally.take_fatal() {
            return Err(e);
        }
        if released + tally.errors.len() < q {
            return Ok(ReleaseOutcome::NotOwner);
        }
        Err(tally.short(
            "release",
            format!("deleted on {released} of {n} nodes, {q} needed"),
        ))
    }

    /// The majority view: the owner holding the lease on a majority of the nodes, with
    /// the highest fence its nodes record and the time until fewer than a majority hold
    /// it; `None` when no owner can hold a majority.
    ///
    /// # Errors
    /// A retryable error when too few nodes answered to tell.
    ///
    /// # Cancel safety
    /// Cancel safe: it changes nothing.
    async fn inspect(&self, key: &Key) -> Result<Option<LeaseInfo>, StoreError> {
        let deadline = Instant::now() + self.config.node_bound();
        let lease = self.lease_key(key);
        let q = self.config.quorum();
        let keys = [lease.as_str()];
        let mut tally = self
            .run_all("inspect", deadline, &SCRIPTS.inspect, &keys, &NONE)
            .await;
        if let Some(e) = tally.take_fatal() {
            return Err(e);
        }
        let mut owners: HashMap<OwnerToken, (Fence, Vec<Duration>)> = HashMap::new();
        for (_, view) in &tally.ok {
            let view: &NodeView = view;
            if let Some((owner, fence, remaining)) = view {
                let e = owners.entry(*owner).or_insert((*fence, Vec::new()));
                e.0 = e.0.max(*fence);
                e.1.push(*remaining);
            }
        }
        if let Some((owner, (fence, mut left))) = owners
            .iter()
            .find(|(_, (_, left))| left.len() >= q)
            .map(|(o, v)| (*o, v.clone()))
        {
            left.sort_unstable_by(|a, b| b.cmp(a));
            return Ok(Some(LeaseInfo {
                key: key.clone(),
                owner,
                fence,
                remaining: left.get(q - 1).copied(),
            }));
        }
        let unknown = tally.errors.len();
        if owners.values().any(|(_, left)| left.len() + unknown >= q) || tally.ok.len() < q {
            return Err(tally.short(
                "inspect",
                format!(
                    "{unknown} of {} nodes did not answer: the majority view is unknown",
                    self.nodes.len()
                ),
            ));
        }
        Ok(None)
    }

    /// The candidates first: every node's lease keys under `prefix` (`SCAN MATCH`, each
    /// round trip bounded by the node timeout), which needs a majority of the nodes to
    /// answer, so that every lease a majority holds is on at least one node scanned. Then
    /// one [`inspect`](Self::inspect) per candidate, in key order: a lease is listed as
    /// the majority view reports it, and a partial lock (an acquire that reached a
    /// minority) is not listed.
    ///
    /// # Errors
    /// A retryable error when fewer than a majority of the nodes answered the scan, or
    /// when an inspect cannot tell; a non-retryable node error as it is.
    ///
    /// # Cancel safety
    /// Cancel safe: it changes nothing.
    async fn list(&self, prefix: &str) -> Result<Vec<LeaseInfo>, StoreError> {
        let bound = self.config.node_bound();
        let pattern = scan_pattern(self.config.key_prefix(), prefix);
        let (n, q) = (self.nodes.len(), self.config.quorum());
        let scans = self.nodes.iter().map(|n| n.scan("list", &pattern, bound));
        let tally = Tally::of(join_all(scans).await.into_iter().enumerate()).majority(
            q,
            "list",
            |answered| format!("scanned {answered} of {n} nodes, {q} needed"),
        )?;
        let candidates: BTreeSet<Key> = tally
            .ok
            .iter()
            .flat_map(|(_, keys)| keys)
            .filter_map(|k| parse_lease_key(self.config.key_prefix(), k))
            .filter(|k| k.as_str().starts_with(prefix))
            .collect();
        let mut out = Vec::with_capacity(candidates.len());
        for key in candidates {
            if let Some(info) = self.inspect(&key).await? {
                out.push(info);
            }
        }
        Ok(out)
    }

    /// Deletes whatever lease holds `key` on every node and advances each node's fence
    /// past it (floored at the node's clock); then records the highest of those fences
    /// on every node. Needs a majority in both rounds, so the next grant's fence is
    /// above the returned one (see the crate docs).
    ///
    /// # Cancel safety
    /// A dropped call may have broken the lease on some nodes without recording the
    /// fence everywhere; break again.
    async fn break_lease(&self, key: &Key) -> Result<Fence, StoreError> {
        let bound = self.config.node_bound();
        let (lease, fence_key) = (self.lease_key(key), self.fence_key(key));
        let (n, q) = (self.nodes.len(), self.config.quorum());
        let deadline = Instant::now() + bound;
        let keys = [lease.as_str(), fence_key.as_str()];
        let tally = self
            .run_all("break", deadline, &SCRIPTS.break_lease, &keys, &NONE)
            .await
            .majority(q, "break", |answered| {
                format!("broken on {answered} of {n} nodes, {q} needed; break again")
            })?;
        let fence = tally.ok.iter().map(|(_, f)| *f).max().unwrap_or(Fence(1));
        let fs = fence.0.to_string();
        let deadline = Instant::now() + bound;
        let (raise_keys, raise_args) = ([fence_key.as_str()], [fs.as_str()]);
        let op = "break (recording the fence)";
        self.run_all(op, deadline, &SCRIPTS.raise, &raise_keys, &raise_args)
            .await
            .majority(q, "break", |answered| {
                format!(
                    "the new fence was recorded on {answered} of {n} nodes, {q} needed; break again"
                )
            })?;
        Ok(fence)
    }

    /// The put script of `leasehold-redis` on every node at once (each node keeps the
    /// higher of its record and ours, and answers with what it stores). Needs a majority
    /// of answers; returns the highest-fence record among them (equal fences with
    /// different values: the value most nodes answered, then the smallest bytes). Written
    /// on a majority, it is seen by every later majority read (see the crate docs,
    /// "Records").
    ///
    /// # Errors
    /// [`StoreErrorKind::InvalidInput`] for a value over [`MAX_RECORD_LEN`](leasehold_core::MAX_RECORD_LEN) (nothing is
    /// sent); `Corrupt` when a node holds something else at the record key; with fewer
    /// than a majority of answers, `Ambiguous` when some node stored it (a later read may
    /// or may not see it), else the nodes' retryable error.
    ///
    /// # Cancel safety
    /// A dropped call may have written the record on some nodes; put it again.
    async fn put_record(
        &self,
        key: &Key,
        fence: Fence,
        value: &[u8],
    ) -> Result<Record, StoreError> {
        StoreError::check_record_value(BACKEND, value)?;
        let deadline = Instant::now() + self.config.node_bound();
        let name = self.record_key(key);
        let (n, q) = (self.nodes.len(), self.config.quorum());
        let fs = leasehold_redis::records::fence_arg(fence);
        let keys = [name.as_str()];
        let args: [&[u8]; 2] = [fs.as_bytes(), value];
        let mut tally = self
            .run_all("put record", deadline, &SCRIPTS.put_record, &keys, &args)
            .await;
        if let Some(e) = tally.take_fatal() {
            return Err(e);
        }
        if tally.ok.len() < q {
            let what = format!("answered by {} of {n} nodes, {q} needed", tally.ok.len());
            if tally.ok.is_empty() {
                return Err(tally.short("put record", what));
            }
            let first = tally
                .errors
                .first()
                .map(|e| format!("; first node error: {e}"))
                .unwrap_or_default();
            return Err(StoreError::new(
                StoreErrorKind::Ambiguous,
                BACKEND,
                format!(
                    "put record: {what}; stored on those, so a later read may or may not see \
                     it: put it again{first}"
                ),
            ));
        }
        pick(tally.ok.iter().map(|(_, r)| r))
            .ok_or_else(|| StoreError::new(StoreErrorKind::Other, BACKEND, "put record: no answer"))
    }

    /// The get script of `leasehold-redis` on every node at once. Needs a majority of
    /// answers; returns the highest-fence record among them (ties as for
    /// [`put_record`](Self::put_record)), then writes it back to the answering nodes that
    /// had none or a lower fence (read repair: a node restarted empty gets its records
    /// back), best effort.
    ///
    /// # Errors
    /// `Corrupt` when a node holds something else at the record key; a retryable error
    /// when fewer than a majority answered.
    ///
    /// # Cancel safety
    /// Cancel safe: a dropped repair only leaves nodes behind, as they were.
    async fn get_record(&self, key: &Key) -> Result<Option<Record>, StoreError> {
        let deadline = Instant::now() + self.config.node_bound();
        let name = self.record_key(key);
        let (n, q) = (self.nodes.len(), self.config.quorum());
        let keys = [name.as_str()];
        let tally = self
            .run_all("get record", deadline, &SCRIPTS.get_record, &keys, &NONE)
            .await
            .majority(q, "get record", |answered| {
                format!("answered by {answered} of {n} nodes, {q} needed")
            })?;
        let Some(best) = pick(tally.ok.iter().filter_map(|(_, r)| r.as_ref())) else {
            return Ok(None);
        };
        let behind: Vec<usize> = tally
            .ok
            .iter()
            .filter(|(_, r)| r.as_ref().is_none_or(|r| r.fence < best.fence))
            .map(|(i, _)| *i)
            .collect();
        if !behind.is_empty() {
            self.repair(&name, &best, &behind).await;
        }
        Ok(Some(best))
    }

    async fn diagnose(&self) -> Result<leasehold_core::Diagnosis, StoreError> {
        crate::doctor::diagnose(&self.nodes, &self.config).await
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use leasehold_redis::wire::{decode_key as decode, encode_key as encode, glob_escape};

    fn rec(fence: u64, value: &[u8]) -> Record {
        Record {
            fence: Fence(fence),
            value: value.to_vec(),
        }
    }

    /// A scan's Redis keys name their lease keys back: a lease key of any user key
    /// (braces and percent signs included) decodes to that key; the fence and record keys
    /// beside it, and keys of another prefix, name none; glob characters are escaped.
    #[test]
    fn scanned_keys_name_their_lease_keys() {
        let config = RedlockConfig::new(["127.0.0.1:1", "127.0.0.1:2", "127.0.0.1:3"])
            .unwrap()
            .prefix("app:")
            .unwrap();
        let store = RedlockStore::new(config).unwrap();
        let parse = |redis_key: &str| parse_lease_key(store.config.key_prefix(), redis_key);
        for k in ["job:x", "{a}x", "}", "{}", "a}{b}", "100%", "%7B", "*?[]\\"] {
            let key = Key::new(k).unwrap();
            assert_eq!(parse(&store.lease_key(&key)), Some(key.clone()), "{k}");
            assert_eq!(parse(&store.fence_key(&key)), None, "{k}");
            assert_eq!(parse(&store.record_key(&key)), None, "{k}");
            assert_eq!(decode(&encode(k)).as_deref(), Some(k));
        }
        assert_eq!(parse("other:{job:x}"), None);
        assert_eq!(parse("app:{job%zz}"), None, "not an encoding");
        assert_eq!(glob_escape("a*b?c[d]e\\f"), "a\\*b\\?c\\[d\\]e\\\\f");
    }

    #[test]
    fn the_highest_fence_wins_and_ties_are_deterministic() {
        assert_eq!(pick([]), None);
        let a = [rec(3, b"a"), rec(9, b"z"), rec(5, b"b")];
        assert_eq!(pick(&a), Some(rec(9, b"z")));
        // Equal fences: most replies, then the smallest bytes, whatever the order.
        let b = [rec(0, b"4"), rec(0, b"3"), rec(0, b"4")];
        assert_eq!(pick(&b), Some(rec(0, b"4")));
        let c = [rec(0, b"4"), rec(0, b"3")];
        assert_eq!(pick(&c), Some(rec(0, b"3")));
        let d = [rec(0, b"3"), rec(0, b"4")];
        assert_eq!(pick(&d), Some(rec(0, b"3")));
        let e = [rec(1, b""), rec(1, b"\0")];
        assert_eq!(pick(&e), Some(rec(1, b"")));
    }
}
