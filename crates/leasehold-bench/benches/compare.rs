//! The comparison benchmark: what leasehold costs against what a user would pick instead,
//! side by side in one process, on private servers it starts itself.
//!
//! ```text
//! cargo bench -p leasehold-bench --bench compare -- [--json] [--quick] [--only redis|postgres|mysql|sqlite|etcd|zookeeper|tls[,…]] [--pg-fsync on|off] [--slices N]
//! ```
//!
//! Every figure is measured in the same run as what it is compared with, in interleaved
//! slices (the harness in `src/lib.rs`), so background load hits all sides alike.
//!
//! * Redis: `LeaseClient` (leasehold-redis) and rslock against a plain lock written with
//!   the `redis` crate alone (`SET key token NX PX` + compare-and-delete script), and
//!   against a fenced lock written as Redisson's `RFencedLock` is (a lock hash, a token
//!   counter, one script each way, waiters woken over pub/sub).
//! * PostgreSQL (fsync on; `--pg-fsync off` to see what the disk costs): the lease-table
//!   and the advisory-lock stores, through `LeaseClient` and through the `Store` alone,
//!   against `pgbench`'s simple-update transactions (16 clients) and against sqlx's
//!   `PgAdvisoryLock`.
//! * MariaDB: both leasehold-mysql stores against a plain `GET_LOCK` / `RELEASE_LOCK` pair
//!   and a plain InnoDB lock table written with sqlx alone.
//! * SQLite (a temporary file, `synchronous=FULL`): leasehold-sqlite against a plain lock
//!   table written with sqlx alone.
//! * etcd (a private single-member server): leasehold-etcd against etcd's own lock service
//!   (`Lock` / `Unlock` on a lease) and a plain lock (a lease and a transaction), both
//!   written with `etcd-client` alone.
//! * ZooKeeper (a private standalone server): leasehold-zookeeper against a plain lock
//!   written with `zookeeper-client` alone (create an ephemeral node, delete it) and a
//!   Curator-style queue lock (`InterProcessMutex`'s recipe, on the same client alone).
//! * TLS (`--only tls`): every network store (PostgreSQL, MariaDB, etcd, Redis, Redlock,
//!   ZooKeeper) on plaintext servers and on servers that require TLS, side by side;
//!   ZooKeeper's TLS server also beside a plaintext one on the same Netty connection
//!   factory, since its default plaintext server runs NIO.
//!
//! Then, per store, a contended comparison: 16 tasks take turns on one key, each holding
//! it for 1 ms, with each contender's own way of waiting.
#![forbid(unsafe_code)]

use std::collections::HashMap;
use std::io::Write as _;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use async_trait::async_trait;
use leasehold_bench::parse::{Backend, Cli, USAGE, commandstats_calls, parse_args, pgbench_tps};
use leasehold_bench::{
    Contender, Counter, Plan, Ratio, Res, Section, Side, contended, json, release,
};
use leasehold_core::{
    AcquireOutcome, Key, LeaseClient, LeaseConfig, OwnerToken, ReleaseOutcome, RenewOutcome, Store,
    StoreError, WaitStore,
};
use rand::Rng as _;

/// Every lock's TTL.
const TTL: Duration = Duration::from_secs(10);
/// A contended acquisition's wait (never reached: a turn comes much sooner).
const WAIT: Duration = Duration::from_secs(60);
/// Concurrent tasks of the uncontended levels.
const LEVELS: [usize; 3] = [1, 16, 64];
/// Connections of every pool (leasehold's and the contenders'), as pgbench's clients.
const POOL: u32 = 16;
/// The plain locks' retry loop sleeps a random time up to this between attempts.
const PLAIN_RETRY: Duration = Duration::from_millis(2);

fn err(e: impl std::fmt::Display) -> String {
    e.to_string()
}

/// Runs a test-kit call (which panics on failure) off the runtime, as a `Result`.
async fn blocking<T: Send + 'static>(f: impl FnOnce() -> T + Send + 'static) -> Res<T> {
    tokio::task::spawn_blocking(f).await.map_err(|e| {
        if e.is_panic() {
            let p = e.into_panic();
            p.downcast_ref::<String>()
                .cloned()
                .or_else(|| p.downcast_ref::<&str>().map(|s| (*s).to_owned()))
                .unwrap_or_else(|| "a panic".into())
        } else {
            e.to_string()
        }
    })
}

fn lease_config() -> Res<LeaseConfig> {
    LeaseConfig::new(TTL).map_err(err)
}

/// `try_acquire` + `release` on a client: leasehold's uncontended pair.
fn leasehold_pair(name: &'static str, client: LeaseClient) -> Side {
    Side::pairs(name, move |key| {
        let client = client.clone();
        async move {
            let lease = client.try_acquire(&*key).await.map_err(err)?;
            match lease.release().await.map_err(err)? {
                true => Ok(()),
                false => Err("release: the lease was no longer held".into()),
            }
        }
    })
}

/// `acquire(key, wait)` + `release` on a client: leasehold's contender.
fn leasehold_contender(name: &'static str, client: LeaseClient, calls: Counter) -> Contender {
    Contender::new(name, calls, move |key| {
        let client = client.clone();
        async move {
            let lease = client.acquire(&*key, WAIT).await.map_err(err)?;
            Ok(release(move || async move {
                match lease.release().await.map_err(err)? {
                    true => Ok(()),
                    false => Err("the lease was no longer held".into()),
                }
            }))
        }
    })
}

/// A random sleep of up to [`PLAIN_RETRY`]: the plain locks' retry loop.
async fn plain_retry_sleep() {
    let us = rand::rng().random_range(0..=PLAIN_RETRY.as_micros() as u64);
    tokio::time::sleep(Duration::from_micros(us)).await;
}

/// A hand-written lock whose holder is named by a random token (the plain lock tables of
/// PostgreSQL, MariaDB and SQLite): what their sides and contenders share.
trait TokenLock: Clone + Send + Sync + 'static {
    /// Takes `key` for `token` if it is free (or expired); whether it did.
    fn try_lock(&self, key: &str, token: &[u8]) -> impl Future<Output = Res<bool>> + Send;
    /// Frees `key` if `token` holds it.
    fn unlock(&self, key: &str, token: &[u8]) -> impl Future<Output = Res<()>> + Send;
}

/// [`TokenLock`] for a plain lock whose inherent `try_lock` and `unlock` have its shape.
macro_rules! token_lock {
    ($($t:ty),*) => {$(
        impl TokenLock for $t {
            fn try_lock(&self, key: &str, token: &[u8]) -> impl Future<Output = Res<bool>> + Send {
                <$t>::try_lock(self, key, token)
            }
            fn unlock(&self, key: &str, token: &[u8]) -> impl Future<Output = Res<()>> + Send {
                <$t>::unlock(self, key, token)
            }
        }
    )*};
}
token_lock!(PlainPg, PlainMy, PlainSqlite);

/// The uncontended pair of a [`TokenLock`]: take the key with a fresh token (it must be
/// free), free it.
fn token_lock_pair<L: TokenLock>(name: &'static str, lock: L) -> Side {
    Side::pairs(name, move |key| {
        let p = lock.clone();
        async move {
            let token = OwnerToken::random();
            if !p.try_lock(&key, token.as_bytes()).await? {
                return Err("the plain lock was held".into());
            }
            p.unlock(&key, token.as_bytes()).await
        }
    })
}

/// The contender of a [`TokenLock`]: tries until it takes the key ([`plain_retry_sleep`]
/// apart), then frees it on release.
fn token_lock_contender<L: TokenLock>(name: &'static str, calls: Counter, lock: L) -> Contender {
    Contender::new(name, calls, move |key| {
        let p = lock.clone();
        async move {
            let token = OwnerToken::random();
            while !p.try_lock(&key, token.as_bytes()).await? {
                plain_retry_sleep().await;
            }
            Ok(release(move || async move {
                p.unlock(&key, token.as_bytes()).await
            }))
        }
    })
}

fn plain_retry_legend() -> String {
    format!(
        "retries after a random sleep of 0–{} ms",
        PLAIN_RETRY.as_millis()
    )
}

fn leasehold_wait_legend() -> String {
    let b = leasehold_core::Backoff::default();
    format!(
        "LeaseClient::acquire(key, wait) with the default LeaseConfig (TTL {} s, full-jitter backoff {} ms–{} s, capped by the holder's remaining TTL, woken by the store's notification where it has one; on Redis, queued in the store and handed the lease by the release)",
        TTL.as_secs(),
        b.base().as_millis(),
        b.cap().as_secs_f64()
    )
}

fn uncontended_about(plan: &Plan, what: &str) -> Vec<String> {
    vec![
        format!(
            "uncontended: {what}; each task acquires and releases its own key in a loop, at {} tasks.",
            LEVELS.map(|n| n.to_string()).join(", ")
        ),
        format!(
            "Interleaved: {} slices of {} ms per side and level, the order rotated each slice; pairs/s = median over slices; each ratio = median over slices of the two sides' pairs/s in the same slice.",
            plan.slices,
            plan.slice.as_millis()
        ),
    ]
}

fn contended_about(plan: &Plan, what: &str) -> Vec<String> {
    vec![
        format!(
            "contended: {} tasks take turns on one key{what}, each holding it {} ms (a thread's sleep on the blocking pool, not a tokio sleep, whose timer rounds up) before releasing; {} slices of {} ms per contender, interleaved, a fresh key per slice.",
            plan.contenders,
            plan.hold.as_millis(),
            plan.slices,
            plan.contended_slice.as_millis()
        ),
        "hold = the mean measured hold (the sleep plus a hand-over to the blocking pool and back); util = fraction of wall time the key is held (acquire returned → release called); hand-off = one task calling release → another task's acquire returning; wait = acquire called → returned; turns/task = acquisitions of the least and the most lucky task; calls/acq = the store's own count of calls over the slices ÷ acquisitions.".into(),
    ]
}

async fn run_levels(sides: &[Side], plan: &Plan) -> Vec<leasehold_bench::Level> {
    run_levels_with_server(sides, plan, None).await
}

/// [`run_levels`], with the server's CPU time read around each side's slice.
async fn run_levels_with_server(
    sides: &[Side],
    plan: &Plan,
    server: Option<&leasehold_bench::ServerCpuFn>,
) -> Vec<leasehold_bench::Level> {
    let mut levels = Vec::new();
    for tasks in LEVELS {
        progress(format_args!("  {tasks} task(s)"));
        levels.push(leasehold_bench::uncontended_with_server(sides, tasks, plan, server).await);
    }
    levels
}

/// The Redis server's CPU time so far (`INFO cpu`: `used_cpu_user` + `used_cpu_sys`, in
/// seconds with µs resolution).
fn redis_server_cpu(conn: redis::aio::MultiplexedConnection) -> leasehold_bench::ServerCpuFn {
    Arc::new(move || {
        let conn = conn.clone();
        Box::pin(async move {
            let info = redis_info(&conn, "cpu").await?;
            let field = |name: &str| {
                info.lines()
                    .find_map(|l| l.strip_prefix(name))
                    .and_then(|v| v.trim().parse::<f64>().ok())
            };
            match (field("used_cpu_user:"), field("used_cpu_sys:")) {
                (Some(u), Some(s)) => Ok(Duration::from_secs_f64(u + s)),
                _ => Err("INFO cpu: no used_cpu_user/used_cpu_sys".into()),
            }
        })
    })
}

/// A progress line on stderr, with the time since the run started.
fn progress(msg: std::fmt::Arguments<'_>) {
    static START: std::sync::OnceLock<std::time::Instant> = std::sync::OnceLock::new();
    let t = START.get_or_init(std::time::Instant::now).elapsed();
    let mut e = std::io::stderr().lock();
    let _ = writeln!(e, "[{:6.1} s] {msg}", t.as_secs_f64());
}

// ---------------------------------------------------------------------------------------
// Redis

/// The Redis section's Redisson-style fenced lock (its side and contender).
const FENCED: &str = "fenced (Redisson-style)";

const COMPARE_AND_DELETE: &str = "if redis.call('GET', KEYS[1]) == ARGV[1] then \
     return redis.call('DEL', KEYS[1]) else return 0 end";

/// The plain lock: the `redis` crate alone, one multiplexed connection.
#[derive(Clone)]
struct PlainRedis {
    conn: redis::aio::MultiplexedConnection,
    release: Arc<redis::Script>,
}

impl PlainRedis {
    async fn try_lock(&self, key: &str, token: &str) -> Res<bool> {
        let set: Option<String> = redis::cmd("SET")
            .arg(key)
            .arg(token)
            .arg("NX")
            .arg("PX")
            .arg(TTL.as_millis() as u64)
            .query_async(&mut self.conn.clone())
            .await
            .map_err(err)?;
        Ok(set.is_some())
    }

    async fn unlock(&self, key: &str, token: &str) -> Res<()> {
        let deleted: i64 = self
            .release
            .key(key)
            .arg(token)
            .invoke_async(&mut self.conn.clone())
            .await
            .map_err(err)?;
        match deleted {
            1 => Ok(()),
            _ => Err("compare-and-delete found another token".into()),
        }
    }
}

/// The fenced lock's acquire (Redisson's `RFencedLock` recipe). `KEYS[1]` = the lock hash,
/// `KEYS[2]` = its token counter; `ARGV[1]` = the owner's field, `ARGV[2]` = the TTL in ms.
/// Taken when the hash is missing or already has this owner's field (a re-entry): the
/// field counts up, the hash's TTL restarts and the counter gives the next fencing token,
/// `{1, token}`. Otherwise `{0, the hash's PTTL}`.
const FENCED_ACQUIRE: &str = "if redis.call('EXISTS', KEYS[1]) == 0 \
     or redis.call('HEXISTS', KEYS[1], ARGV[1]) == 1 then \
       redis.call('HINCRBY', KEYS[1], ARGV[1], 1) \
       redis.call('PEXPIRE', KEYS[1], ARGV[2]) \
       return {1, redis.call('INCR', KEYS[2])} \
     end \
     return {0, redis.call('PTTL', KEYS[1])}";

/// The fenced lock's release. `KEYS[1]` = the lock hash; `ARGV[1]` = the owner's field,
/// `ARGV[2]` = the key's channel. Not the owner: nil. Otherwise the field counts down; at 0
/// the hash is deleted and the channel told (1), else it is still held by a re-entry (0).
const FENCED_RELEASE: &str = "if redis.call('HEXISTS', KEYS[1], ARGV[1]) == 0 then \
       return nil \
     end \
     if redis.call('HINCRBY', KEYS[1], ARGV[1], -1) > 0 then \
       return 0 \
     end \
     redis.call('DEL', KEYS[1]) \
     redis.call('PUBLISH', ARGV[2], 'released') \
     return 1";

/// What the fenced lock's acquire script answered.
enum FencedTry {
    /// Taken (the script's fencing token, which a user would hand on to the resource, is
    /// not needed here).
    Acquired,
    /// Held by another owner for this long yet.
    Held(Duration),
}

/// A fenced lock written the way Redisson's `RFencedLock` is, with the `redis` crate
/// alone: a hash whose field is the owner (a re-entry count), a separate counter key for
/// the fencing token, one script each to acquire and release, and waiters woken by the
/// release's message on the key's channel ([`ReleaseNotices`]).
#[derive(Clone)]
struct FencedRedis {
    conn: redis::aio::MultiplexedConnection,
    acquire: Arc<redis::Script>,
    release: Arc<redis::Script>,
    notices: Arc<ReleaseNotices>,
}

impl FencedRedis {
    /// The lock hash, its token counter and its channel, in one hash slot.
    fn names(key: &str) -> (String, String, String) {
        (
            format!("fenced:{{{key}}}"),
            format!("fenced:{{{key}}}:token"),
            format!("fenced:{{{key}}}:released"),
        )
    }

    async fn try_lock(&self, key: &str, owner: &str) -> Res<FencedTry> {
        let (hash, token, _) = Self::names(key);
        let answer: (i64, i64) = self
            .acquire
            .key(hash)
            .key(token)
            .arg(owner)
            .arg(TTL.as_millis() as u64)
            .invoke_async(&mut self.conn.clone())
            .await
            .map_err(err)?;
        Ok(match answer {
            (1, _token) => FencedTry::Acquired,
            // No expiry (-1) cannot happen here; wait the TTL then.
            (_, pttl) => FencedTry::Held(u64::try_from(pttl).map_or(TTL, Duration::from_millis)),
        })
    }

    /// Acquires `key`, waiting as Redisson does: one try; then, subscribed to the key's
    /// channel, try again and wait for a release's message (at most the holder's remaining
    /// TTL) until a try succeeds.
    async fn lock(&self, key: &str, owner: &str) -> Res<()> {
        if let FencedTry::Acquired = self.try_lock(key, owner).await? {
            return Ok(());
        }
        let (_, _, channel) = Self::names(key);
        let latch = self.notices.join(&channel).await?;
        let got: Res<()> = async {
            loop {
                match self.try_lock(key, owner).await? {
                    FencedTry::Acquired => return Ok(()),
                    FencedTry::Held(pttl) => {
                        if let Ok(Ok(permit)) = tokio::time::timeout(pttl, latch.acquire()).await {
                            permit.forget();
                        }
                    }
                }
            }
        }
        .await;
        // As Redisson's, the unsubscription does not hold up the acquisition.
        let notices = self.notices.clone();
        tokio::spawn(async move { notices.leave(&channel).await });
        got
    }

    async fn unlock(&self, key: &str, owner: &str) -> Res<()> {
        let (hash, _, channel) = Self::names(key);
        let answer: Option<i64> = self
            .release
            .key(hash)
            .arg(owner)
            .arg(channel)
            .invoke_async(&mut self.conn.clone())
            .await
            .map_err(err)?;
        match answer {
            Some(1) => Ok(()),
            Some(_) => Err("the fenced lock is still held by a re-entry".into()),
            None => Err("the fenced lock has another owner".into()),
        }
    }
}

/// The key channels' latches: one release permit per message, and how many waiters share
/// each.
type Latches = Arc<Mutex<HashMap<String, (Arc<tokio::sync::Semaphore>, usize)>>>;

/// The fenced lock's waiters share one pub/sub connection, as Redisson's do: a key's
/// channel is subscribed while some task waits for that key, and each release message
/// adds a permit to the key's latch, which wakes one waiter (or lets the next one through
/// at once, so that a message between a failed try and the wait is not lost).
struct ReleaseNotices {
    /// Subscribes and unsubscribes one at a time; the waiter counts change under it too,
    /// so that a channel is subscribed exactly while it has waiters.
    sink: tokio::sync::Mutex<redis::aio::PubSubSink>,
    latches: Latches,
    /// The task that reads the messages.
    reader: tokio::task::AbortHandle,
}

impl Drop for ReleaseNotices {
    fn drop(&mut self) {
        self.reader.abort();
    }
}

impl ReleaseNotices {
    async fn connect(client: &redis::Client) -> Res<Self> {
        use futures::StreamExt as _;
        let (sink, mut messages) = client.get_async_pubsub().await.map_err(err)?.split();
        let latches = Latches::default();
        let reader = tokio::spawn({
            let latches = latches.clone();
            async move {
                while let Some(msg) = messages.next().await {
                    let latches = latches.lock().unwrap_or_else(PoisonError::into_inner);
                    if let Some((latch, _)) = latches.get(msg.get_channel_name()) {
                        latch.add_permits(1);
                    }
                }
            }
        })
        .abort_handle();
        Ok(Self {
            sink: tokio::sync::Mutex::new(sink),
            latches,
            reader,
        })
    }

    /// A new waiter on `channel`: its latch, once the channel is subscribed.
    async fn join(&self, channel: &str) -> Res<Arc<tokio::sync::Semaphore>> {
        let mut sink = self.sink.lock().await;
        let latch = {
            let mut latches = self.latches.lock().unwrap_or_else(PoisonError::into_inner);
            if let Some((latch, waiters)) = latches.get_mut(channel) {
                *waiters += 1;
                return Ok(latch.clone());
            }
            let latch = Arc::new(tokio::sync::Semaphore::new(0));
            latches.insert(channel.to_owned(), (latch.clone(), 1));
            latch
        };
        if let Err(e) = sink.subscribe(channel).await {
            let mut latches = self.latches.lock().unwrap_or_else(PoisonError::into_inner);
            latches.remove(channel);
            return Err(err(e));
        }
        Ok(latch)
    }

    /// A waiter on `channel` is done: the last one unsubscribes.
    async fn leave(&self, channel: &str) {
        let mut sink = self.sink.lock().await;
        let last = {
            let mut latches = self.latches.lock().unwrap_or_else(PoisonError::into_inner);
            match latches.get_mut(channel) {
                Some((_, waiters)) if *waiters > 1 => {
                    *waiters -= 1;
                    false
                }
                Some(_) => latches.remove(channel).is_some(),
                None => false,
            }
        };
        if last {
            // A failure leaves the channel subscribed: its messages then find no latch.
            let _ = sink.unsubscribe(channel).await;
        }
    }
}

async fn redis_info(conn: &redis::aio::MultiplexedConnection, section: &str) -> Res<String> {
    redis::cmd("INFO")
        .arg(section)
        .query_async(&mut conn.clone())
        .await
        .map_err(err)
}

/// leasehold's Redis store with `batch=false`.
const UNBATCHED: &str = "leasehold batch=false";

async fn redis_section(plan: Plan) -> Res<Section> {
    progress(format_args!("redis: starting redis-server"));
    let server = blocking(leasehold_testkit::RedisServer::start).await?;
    let url = server.url();
    let cfg = leasehold_redis::RedisConfigBuilder::standalone("127.0.0.1", server.port())
        .prefix("bench:")
        .build()
        .map_err(err)?;
    let store = Arc::new(
        leasehold_redis::RedisStore::connect(cfg)
            .await
            .map_err(err)?,
    );
    let client = LeaseClient::new(store, lease_config()?);
    // The same store with its batching off (issue 29: batching is kept only where it wins
    // in the same run).
    let unbatched = LeaseClient::new(
        Arc::new(
            leasehold_redis::RedisStore::connect(
                leasehold_redis::RedisConfigBuilder::standalone("127.0.0.1", server.port())
                    .prefix("bench:")
                    .batch(false)
                    .build()
                    .map_err(err)?,
            )
            .await
            .map_err(err)?,
        ),
        lease_config()?,
    );
    let redis_client = redis::Client::open(url.as_str()).map_err(err)?;
    let plain = PlainRedis {
        conn: redis_client
            .get_multiplexed_async_connection()
            .await
            .map_err(err)?,
        release: Arc::new(redis::Script::new(COMPARE_AND_DELETE)),
    };
    let fenced = FencedRedis {
        conn: redis_client
            .get_multiplexed_async_connection()
            .await
            .map_err(err)?,
        acquire: Arc::new(redis::Script::new(FENCED_ACQUIRE)),
        release: Arc::new(redis::Script::new(FENCED_RELEASE)),
        notices: Arc::new(ReleaseNotices::connect(&redis_client).await?),
    };
    let rslock = rslock::LockManager::new(vec![url.clone()]);
    let info = redis_info(&plain.conn, "server").await?;
    let version = info
        .lines()
        .find_map(|l| l.strip_prefix("redis_version:"))
        .unwrap_or("?")
        .trim()
        .to_owned();
    let counter = {
        let conn = plain.conn.clone();
        Counter::by_part("server commands", move || {
            let conn = conn.clone();
            async move {
                let info = redis_info(&conn, "commandstats").await?;
                // The readings' own INFO is left out.
                Ok(commandstats_calls(&info)
                    .into_iter()
                    .filter(|(cmd, _)| cmd != "info")
                    .collect())
            }
        })
    };

    let sides = vec![
        leasehold_pair("leasehold", client.clone()),
        leasehold_pair(UNBATCHED, unbatched.clone()),
        Side::pairs("rslock", {
            let m = rslock.clone();
            move |key| {
                let m = m.clone();
                async move {
                    let lock = m.lock(key.as_bytes(), TTL).await.map_err(err)?;
                    lock.release().await;
                    Ok(())
                }
            }
        }),
        Side::pairs("plain", {
            let p = plain.clone();
            move |key| {
                let p = p.clone();
                async move {
                    let token = OwnerToken::random().to_hex();
                    if !p.try_lock(&key, &token).await? {
                        return Err("SET NX found the key held".into());
                    }
                    p.unlock(&key, &token).await
                }
            }
        }),
        Side::pairs(FENCED, {
            let f = fenced.clone();
            move |key| {
                let f = f.clone();
                async move {
                    let owner = OwnerToken::random().to_hex();
                    if let FencedTry::Held(_) = f.try_lock(&key, &owner).await? {
                        return Err("the fenced lock found the key held".into());
                    }
                    f.unlock(&key, &owner).await
                }
            }
        }),
    ];
    progress(format_args!("redis: uncontended"));
    let server_cpu = redis_server_cpu(plain.conn.clone());
    let levels = run_levels_with_server(&sides, &plan, Some(&server_cpu)).await;

    let contenders = vec![
        leasehold_contender("leasehold", client.clone(), counter.clone()),
        leasehold_contender(UNBATCHED, unbatched.clone(), counter.clone()),
        Contender::new("rslock", counter.clone(), {
            let m = rslock.clone();
            move |key| {
                let m = m.clone();
                async move {
                    let guard = m.acquire(key.as_bytes(), TTL).await.map_err(err)?;
                    Ok(release(move || async move {
                        guard.release().await;
                        Ok(())
                    }))
                }
            }
        }),
        Contender::new("plain", counter.clone(), {
            let p = plain.clone();
            move |key| {
                let p = p.clone();
                async move {
                    let token = OwnerToken::random().to_hex();
                    while !p.try_lock(&key, &token).await? {
                        plain_retry_sleep().await;
                    }
                    Ok(release(move || async move { p.unlock(&key, &token).await }))
                }
            }
        }),
        Contender::new(FENCED, counter.clone(), {
            let f = fenced.clone();
            move |key| {
                let f = f.clone();
                async move {
                    let owner = OwnerToken::random().to_hex();
                    f.lock(&key, &owner).await?;
                    Ok(release(move || async move { f.unlock(&key, &owner).await }))
                }
            }
        }),
    ];
    progress(format_args!("redis: contended"));
    let contended = contended(&contenders, &plan).await;
    // The clients go before the server they talk to.
    drop((
        contenders,
        sides,
        client,
        unbatched,
        plain,
        fenced,
        rslock,
        redis_client,
    ));
    drop(server);
    Ok(Section {
        name: "redis",
        title: format!("Redis {version}: a private redis-server on 127.0.0.1, no persistence"),
        about: uncontended_about(&plan, "leasehold and rslock against a plain lock and a fenced lock written as Redisson's, all on the same server"),
        legend: vec![
            ("leasehold", "LeaseClient::try_acquire + Lease::release (leasehold-redis: fence, owner token, heartbeat scheduler, watchdog, waiting queue; concurrent operations batched per slot), default LeaseConfig".into()),
            (UNBATCHED, "the same with batch=false: every acquire and release a script call of its own, sent at once".into()),
            ("rslock", "rslock 0.10 LockManager::lock + Lock::release on one server (SET NX PX + compare-and-delete script; its retry loop); default settings".into()),
            ("plain", "the redis crate alone on one multiplexed connection: SET key token NX PX, then a compare-and-delete script (no fence, no heartbeat)".into()),
            (FENCED, "the redis crate alone, Redisson's RFencedLock recipe: an acquire script (if the lock hash is missing or has this owner's field: HINCRBY, PEXPIRE, INCR of a separate token key, the token returned; else the hash's PTTL), a release script (HINCRBY -1; at 0, DEL and PUBLISH on the key's channel); no heartbeat".into()),
        ],
        levels,
        ratios: vec![
            Ratio { num: "leasehold", den: "plain", meaning: "the share of a plain lock's throughput that leasehold keeps".into() },
            Ratio { num: "rslock", den: "plain", meaning: "the same for rslock".into() },
            Ratio { num: "leasehold", den: "rslock", meaning: "leasehold against rslock directly".into() },
            Ratio { num: "leasehold", den: FENCED, meaning: "leasehold against another fenced lock, written as Redisson writes one".into() },
            Ratio { num: "leasehold", den: UNBATCHED, meaning: "what the batching gives (above 1: it wins)".into() },
        ],
        contended_about: {
            let mut a = contended_about(&plan, "");
            a.push(format!("leasehold: {}; rslock: LockManager::acquire (its default retry: up to 3 tries 0–200 ms apart, then again); plain: SET NX PX, {}.", leasehold_wait_legend(), plain_retry_legend()));
            a.push(format!("{FENCED}: as Redisson waits: one try; then subscribed to the key's channel (one pub/sub connection shared by every waiter, a channel subscribed while it has waiters, a per-key latch that each release message adds one permit to), try again and wait for a permit at most the holder's PTTL, until a try succeeds; the last waiter unsubscribes after its acquire returns."));
            a.push("calls = INFO commandstats (every command the server ran, those inside Lua scripts included).".into());
            a
        },
        contended,
        failed: None,
    })
}

// ---------------------------------------------------------------------------------------
// PostgreSQL

/// The plain PostgreSQL lock: a lock table written with sqlx alone, the textbook
/// single-statement acquire (`INSERT … ON CONFLICT DO UPDATE … WHERE expired`).
#[derive(Clone)]
struct PlainPg {
    pool: sqlx::PgPool,
}

impl PlainPg {
    const SCHEMA: &str = "CREATE TABLE IF NOT EXISTS plain_locks \
        (name text PRIMARY KEY, owner bytea NOT NULL, expires_at timestamptz NOT NULL)";

    async fn try_lock(&self, key: &str, token: &[u8]) -> Res<bool> {
        let done = sqlx::query(
            "INSERT INTO plain_locks AS l (name, owner, expires_at) \
             VALUES ($1, $2, clock_timestamp() + $3 * interval '1 millisecond') \
             ON CONFLICT (name) DO UPDATE SET owner = EXCLUDED.owner, expires_at = EXCLUDED.expires_at \
             WHERE l.expires_at <= clock_timestamp()",
        )
        .bind(key)
        .bind(token)
        .bind(TTL.as_millis() as f64)
        .execute(&self.pool)
        .await
        .map_err(err)?;
        Ok(done.rows_affected() == 1)
    }

    async fn unlock(&self, key: &str, token: &[u8]) -> Res<()> {
        let done = sqlx::query("DELETE FROM plain_locks WHERE name = $1 AND owner = $2")
            .bind(key)
            .bind(token)
            .execute(&self.pool)
            .await
            .map_err(err)?;
        match done.rows_affected() {
            1 => Ok(()),
            _ => Err("compare-and-delete found another owner".into()),
        }
    }
}

/// Runs `pgbench` against the private server; returns its stdout.
async fn pgbench(pg: &leasehold_testkit::Postgres, args: &[&str]) -> Res<String> {
    let port = pg.port().to_string();
    let out = tokio::process::Command::new(pg.bin_dir().join("pgbench"))
        .args(["-h", "127.0.0.1", "-p", &port, "-U", "postgres"])
        .args(args)
        .arg("postgres")
        .kill_on_drop(true)
        .output()
        .await
        .map_err(|e| format!("pgbench: {e}"))?;
    if !out.status.success() {
        return Err(format!(
            "pgbench {}: {}",
            args.join(" "),
            String::from_utf8_lossy(&out.stderr).trim()
        ));
    }
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

/// `Store::acquire` + `Store::release` called directly, a fresh owner each time: the store's
/// own cost, without the holder side's (heartbeat scheduler, watchdog, lost signal).
fn store_pair(name: &'static str, store: Arc<dyn Store>) -> Side {
    Side::pairs(name, move |key| {
        let store = store.clone();
        async move {
            let key = Key::new(&*key).map_err(err)?;
            let owner = OwnerToken::random();
            match store.acquire(&key, &owner, TTL).await.map_err(err)? {
                AcquireOutcome::Acquired { .. } => {}
                held => return Err(format!("acquire of a free key: {held:?}")),
            }
            match store.release(&key, &owner).await.map_err(err)? {
                ReleaseOutcome::Released => Ok(()),
                other => Err(format!("release: {other:?}")),
            }
        }
    })
}

async fn postgres_section(plan: Plan, fsync: bool) -> Res<Section> {
    use leasehold_postgres::{PgAdvisoryStore, PgConfig, PgLeaseStore};
    use sqlx::postgres::{PgAdvisoryLock, PgPoolOptions};

    progress(format_args!("postgres: starting a private server"));
    let pg = Arc::new(
        blocking(move || {
            leasehold_testkit::Postgres::start_with(
                leasehold_testkit::PostgresOptions::new()
                    .fsync(fsync)
                    .setting("max_connections", "300")
                    .setting("shared_preload_libraries", "pg_stat_statements"),
            )
        })
        .await?,
    );
    let url = pg.url();
    let pool = PgPoolOptions::new()
        .max_connections(POOL)
        .connect(&url)
        .await
        .map_err(err)?;
    sqlx::query("CREATE EXTENSION IF NOT EXISTS pg_stat_statements")
        .execute(&pool)
        .await
        .map_err(err)?;
    let (version, fsync, sync_commit): (String, String, String) = sqlx::query_as(
        "SELECT current_setting('server_version'), current_setting('fsync'), \
         current_setting('synchronous_commit')",
    )
    .fetch_one(&pool)
    .await
    .map_err(err)?;
    let config = PgConfig::from_url(&url)
        .map_err(err)?
        .pool_size(POOL)
        .application_name("leasehold-bench");
    let table = PgLeaseStore::connect(&config).await.map_err(err)?;
    table.migrate().await.map_err(err)?;
    let adv = PgAdvisoryStore::connect(&config).await.map_err(err)?;
    adv.migrate().await.map_err(err)?;
    let (table_store, adv_store): (Arc<dyn Store>, Arc<dyn Store>) =
        (Arc::new(table), Arc::new(adv));
    let table = LeaseClient::new(table_store.clone(), lease_config()?);
    let adv = LeaseClient::new(adv_store.clone(), lease_config()?);
    sqlx::query(PlainPg::SCHEMA)
        .execute(&pool)
        .await
        .map_err(err)?;
    let plain = PlainPg { pool: pool.clone() };
    progress(format_args!("postgres: pgbench -i"));
    pgbench(&pg, &["-i", "-q", "-s", "1"]).await?;

    let sqlx_pair = {
        let pool = pool.clone();
        move |key: Arc<str>| {
            let pool = pool.clone();
            async move {
                let conn = pool.acquire().await.map_err(err)?;
                let guard = PgAdvisoryLock::new(&*key)
                    .acquire(conn)
                    .await
                    .map_err(err)?;
                guard.release_now().await.map_err(err)?;
                Ok(())
            }
        }
    };
    let sides = vec![
        leasehold_pair("lease-table", table.clone()),
        leasehold_pair("advisory", adv.clone()),
        store_pair("lease-table-store", table_store),
        store_pair("advisory-store", adv_store),
        Side::pairs("sqlx-advisory", sqlx_pair),
        token_lock_pair("plain-table", plain.clone()),
        Side::rate("pgbench", {
            let pg = pg.clone();
            move |d| {
                let pg = pg.clone();
                async move {
                    let secs = d.as_secs_f64().round().max(1.0).to_string();
                    let out =
                        pgbench(&pg, &["-n", "-N", "-c", "16", "-j", "2", "-T", &secs]).await?;
                    pgbench_tps(&out).ok_or_else(|| format!("no tps in pgbench's output: {out}"))
                }
            }
        }),
    ];
    progress(format_args!("postgres: uncontended"));
    let levels = run_levels(&sides, &plan).await;

    let counter = {
        let pool = pool.clone();
        Counter::new("statements", 1, move || {
            let pool = pool.clone();
            async move {
                sqlx::query_scalar::<_, i64>(
                    "SELECT coalesce(sum(calls), 0)::bigint FROM pg_stat_statements",
                )
                .fetch_one(&pool)
                .await
                .map(|n| n as u64)
                .map_err(err)
            }
        })
    };
    let contenders = vec![
        leasehold_contender("lease-table", table.clone(), counter.clone()),
        leasehold_contender("advisory", adv.clone(), counter.clone()),
        token_lock_contender("plain-table", counter.clone(), plain.clone()),
        Contender::new("sqlx-advisory", counter.clone(), {
            let pool = pool.clone();
            move |key| {
                let pool = pool.clone();
                async move {
                    let conn = pool.acquire().await.map_err(err)?;
                    let guard = PgAdvisoryLock::new(&*key)
                        .acquire(conn)
                        .await
                        .map_err(err)?;
                    Ok(release(move || async move {
                        guard.release_now().await.map_err(err)?;
                        Ok(())
                    }))
                }
            }
        }),
    ];
    progress(format_args!("postgres: contended"));
    let contended = contended(&contenders, &plan).await;
    drop((contenders, sides, table, adv, plain));
    pool.close().await;
    drop(pg);
    let slice_secs = plan.slice.as_secs_f64().round().max(1.0);
    Ok(Section {
        name: "postgres",
        title: format!("PostgreSQL {version}: a private server on 127.0.0.1, fsync {fsync}, synchronous_commit {sync_commit}"),
        about: uncontended_about(&plan, &format!("leasehold's two stores against pgbench's simple-update transactions, sqlx's PgAdvisoryLock and a plain lock table; every pool has {POOL} connections")),
        legend: vec![
            ("lease-table", "leasehold-postgres PgLeaseStore: LeaseClient::try_acquire + Lease::release (one statement each, a durable fence in the row)".into()),
            ("advisory", "leasehold-postgres PgAdvisoryStore: the same on session advisory locks (a dedicated connection per holder, a durable fence counter row)".into()),
            ("lease-table-store", "the same PgLeaseStore, Store::acquire + Store::release called directly (no LeaseClient: no heartbeat scheduler, watchdog or lost signal)".into()),
            ("advisory-store", "the same for PgAdvisoryStore".into()),
            ("sqlx-advisory", "sqlx 0.9 PgAdvisoryLock::acquire (pg_advisory_lock) + release_now on a pooled connection (no fence, nothing written)".into()),
            ("plain-table", "sqlx alone: a lock table, INSERT … ON CONFLICT DO UPDATE … WHERE expired, then DELETE … WHERE owner = token (no fence)".into()),
            ("pgbench", format!("pgbench -N -c 16 -j 2 -T {slice_secs:.0} (simple-update transactions/s, 16 clients, scale 1), a fresh run in every slice; the same figure at every level")),
        ],
        levels,
        ratios: vec![
            Ratio { num: "lease-table", den: "pgbench", meaning: "acquire+release pairs per simple-update transaction of pgbench at 16 clients (each pair commits one durable write: a release is not flushed)".into() },
            Ratio { num: "advisory", den: "pgbench", meaning: "the same for the advisory store".into() },
            Ratio { num: "lease-table", den: "plain-table", meaning: "the lease-table store against a hand-written lock table on the same server".into() },
            Ratio { num: "advisory", den: "sqlx-advisory", meaning: "the advisory store against the bare advisory lock it is built on (the price of the fence and the TTL)".into() },
            Ratio { num: "lease-table", den: "lease-table-store", meaning: "what the holder side (LeaseClient) keeps of the lease-table store's own rate".into() },
            Ratio { num: "advisory", den: "advisory-store", meaning: "the same for the advisory store".into() },
            Ratio { num: "sqlx-advisory", den: "pgbench", meaning: "for scale: the bare advisory lock writes nothing".into() },
        ],
        contended_about: {
            let mut a = contended_about(&plan, "");
            a.push(format!("lease-table, advisory: {}; sqlx-advisory: pg_advisory_lock, which waits in the server's lock queue, one pooled connection per waiting task; plain-table: {}.", leasehold_wait_legend(), plain_retry_legend()));
            a.push("calls = statements counted by pg_stat_statements (top level).".into());
            a
        },
        contended,
        failed: None,
    })
}

// ---------------------------------------------------------------------------------------
// MariaDB

/// The plain MariaDB lock: a lock table written with sqlx alone, InnoDB like the lease
/// table (each statement its own transaction, as durable as the server's
/// `innodb_flush_log_at_trx_commit` makes any commit).
#[derive(Clone)]
struct PlainMy {
    pool: leasehold_mysql::sqlx::MySqlPool,
}

impl PlainMy {
    const SCHEMA: &str = "CREATE TABLE IF NOT EXISTS plain_locks \
        (name VARCHAR(255) NOT NULL PRIMARY KEY, owner BINARY(16) NOT NULL, \
         expires_at DATETIME(6) NOT NULL) ENGINE=InnoDB";

    /// `INSERT … ON DUPLICATE KEY UPDATE` that takes the row only if it expired (the
    /// expiry assigned last, so that both conditions read the old one). sqlx connects with
    /// `CLIENT_FOUND_ROWS`, so one affected row is an insert or a row left as it was: then
    /// the owner is read back on the same connection; two are a taken-over row.
    async fn try_lock(&self, key: &str, token: &[u8]) -> Res<bool> {
        use leasehold_mysql::sqlx;
        let mut conn = self.pool.acquire().await.map_err(err)?;
        let done = sqlx::query(
            "INSERT INTO plain_locks (name, owner, expires_at) \
             VALUES (?, ?, NOW(6) + INTERVAL ? MICROSECOND) \
             ON DUPLICATE KEY UPDATE \
             owner = IF(expires_at <= NOW(6), VALUES(owner), owner), \
             expires_at = IF(expires_at <= NOW(6), VALUES(expires_at), expires_at)",
        )
        .bind(key)
        .bind(token)
        .bind(TTL.as_micros() as i64)
        .execute(&mut *conn)
        .await
        .map_err(err)?;
        if done.rows_affected() == 2 {
            return Ok(true);
        }
        let owner: Option<Vec<u8>> =
            sqlx::query_scalar("SELECT owner FROM plain_locks WHERE name = ?")
                .bind(key)
                .fetch_optional(&mut *conn)
                .await
                .map_err(err)?;
        Ok(owner.as_deref() == Some(token))
    }

    async fn unlock(&self, key: &str, token: &[u8]) -> Res<()> {
        let done =
            leasehold_mysql::sqlx::query("DELETE FROM plain_locks WHERE name = ? AND owner = ?")
                .bind(key)
                .bind(token)
                .execute(&self.pool)
                .await
                .map_err(err)?;
        match done.rows_affected() {
            1 => Ok(()),
            _ => Err("compare-and-delete found another owner".into()),
        }
    }
}

async fn mysql_section(plan: Plan) -> Res<Section> {
    use leasehold_mysql::sqlx::mysql::MySqlPoolOptions;
    use leasehold_mysql::{MySqlConfig, MySqlGetLockStore, MySqlLeaseStore};

    progress(format_args!("mysql: starting a private mariadbd"));
    let db = blocking(leasehold_testkit::MariaDb::start).await?;
    let url = db.url();
    let pool = MySqlPoolOptions::new()
        .max_connections(POOL)
        .connect(&url)
        .await
        .map_err(err)?;
    let (version, flush): (String, String) = leasehold_mysql::sqlx::query_as(
        "SELECT VERSION(), CAST(@@innodb_flush_log_at_trx_commit AS CHAR)",
    )
    .fetch_one(&pool)
    .await
    .map_err(err)?;
    let config = MySqlConfig::from_url(&url)
        .map_err(err)?
        .max_connections(POOL);
    let table = MySqlLeaseStore::connect(config.clone())
        .await
        .map_err(err)?;
    table.migrate().await.map_err(err)?;
    let getlock = MySqlGetLockStore::connect(config).await.map_err(err)?;
    getlock.migrate().await.map_err(err)?;
    let table = LeaseClient::new(Arc::new(table), lease_config()?);
    let getlock = LeaseClient::new(Arc::new(getlock), lease_config()?);
    leasehold_mysql::sqlx::query(PlainMy::SCHEMA)
        .execute(&pool)
        .await
        .map_err(err)?;
    let plain = PlainMy { pool: pool.clone() };

    let plain_pair = {
        let pool = pool.clone();
        move |key: Arc<str>| {
            let pool = pool.clone();
            async move {
                let mut conn = pool.acquire().await.map_err(err)?;
                let got: Option<i64> = leasehold_mysql::sqlx::query_scalar("SELECT GET_LOCK(?, 0)")
                    .bind(&*key)
                    .fetch_one(&mut *conn)
                    .await
                    .map_err(err)?;
                if got != Some(1) {
                    return Err("GET_LOCK found the lock held".into());
                }
                let freed: Option<i64> =
                    leasehold_mysql::sqlx::query_scalar("SELECT RELEASE_LOCK(?)")
                        .bind(&*key)
                        .fetch_one(&mut *conn)
                        .await
                        .map_err(err)?;
                match freed {
                    Some(1) => Ok(()),
                    _ => Err("RELEASE_LOCK: not held".into()),
                }
            }
        }
    };
    let sides = vec![
        leasehold_pair("lease-table", table.clone()),
        leasehold_pair("getlock", getlock.clone()),
        Side::pairs("plain-getlock", plain_pair),
        token_lock_pair("plain-table", plain.clone()),
    ];
    progress(format_args!("mysql: uncontended"));
    let levels = run_levels(&sides, &plan).await;

    let counter = {
        let pool = pool.clone();
        Counter::new("statements (Questions)", 1, move || {
            let pool = pool.clone();
            async move {
                let (_, v): (String, String) =
                    leasehold_mysql::sqlx::query_as("SHOW GLOBAL STATUS LIKE 'Questions'")
                        .fetch_one(&pool)
                        .await
                        .map_err(err)?;
                v.parse().map_err(err)
            }
        })
    };
    let contenders = vec![
        leasehold_contender("lease-table", table.clone(), counter.clone()),
        leasehold_contender("getlock", getlock.clone(), counter.clone()),
        Contender::new("plain-getlock", counter.clone(), {
            let pool = pool.clone();
            move |key| {
                let pool = pool.clone();
                async move {
                    let mut conn = pool.acquire().await.map_err(err)?;
                    let got: Option<i64> =
                        leasehold_mysql::sqlx::query_scalar("SELECT GET_LOCK(?, ?)")
                            .bind(&*key)
                            .bind(WAIT.as_secs() as i64)
                            .fetch_one(&mut *conn)
                            .await
                            .map_err(err)?;
                    if got != Some(1) {
                        return Err("GET_LOCK timed out".into());
                    }
                    Ok(release(move || async move {
                        let _: Option<i64> =
                            leasehold_mysql::sqlx::query_scalar("SELECT RELEASE_LOCK(?)")
                                .bind(&*key)
                                .fetch_one(&mut *conn)
                                .await
                                .map_err(err)?;
                        Ok(())
                    }))
                }
            }
        }),
        token_lock_contender("plain-table", counter.clone(), plain.clone()),
    ];
    progress(format_args!("mysql: contended"));
    let contended = contended(&contenders, &plan).await;
    drop((contenders, sides, table, getlock, plain));
    pool.close().await;
    drop(db);
    Ok(Section {
        name: "mysql",
        title: format!("MariaDB {version}: a private mariadbd on 127.0.0.1, innodb_flush_log_at_trx_commit={flush}"),
        about: uncontended_about(&plan, &format!("leasehold's two stores against a plain GET_LOCK lock and a plain lock table; every pool has {POOL} connections")),
        legend: vec![
            ("lease-table", "leasehold-mysql MySqlLeaseStore: LeaseClient::try_acquire + Lease::release (a durable fence in the row)".into()),
            ("getlock", "leasehold-mysql MySqlGetLockStore: the same on GET_LOCK (a dedicated session per holder, a durable fence row)".into()),
            ("plain-getlock", "sqlx alone: SELECT GET_LOCK(name, 0), then SELECT RELEASE_LOCK(name) on one pooled connection (no fence, nothing written)".into()),
            ("plain-table", "sqlx alone: an InnoDB lock table (key, owner, expiry), INSERT … ON DUPLICATE KEY UPDATE taking the row only if expired (and, when one row is reported affected, SELECT owner to tell an insert from a row left as it was), then DELETE … WHERE owner = token (no fence)".into()),
        ],
        levels,
        ratios: vec![
            Ratio { num: "lease-table", den: "plain-getlock", meaning: "the share of a bare GET_LOCK pair's throughput the lease-table store keeps".into() },
            Ratio { num: "getlock", den: "plain-getlock", meaning: "the same for leasehold's GET_LOCK store (the price of the fence and the TTL)".into() },
            Ratio { num: "lease-table", den: "plain-table", meaning: "the lease-table store against a hand-written lock table with the same durability on the same server".into() },
        ],
        contended_about: {
            let mut a = contended_about(&plan, "");
            a.push(format!("lease-table, getlock: {}; plain-getlock: GET_LOCK(name, 60), which waits in the server, one pooled connection per waiting task; plain-table: {}.", leasehold_wait_legend(), plain_retry_legend()));
            a.push("calls = the server's Questions counter (statements sent by clients).".into());
            a
        },
        contended,
        failed: None,
    })
}

// ---------------------------------------------------------------------------------------
// SQLite

/// Counts the transactions a store runs (acquire, renew, release: one SQLite write
/// transaction each); forwards everything else untouched. It has no batch, so the
/// client's batch renewals and `acquire_any` fall back to `renew` and `acquire` here, and
/// each of their transactions is counted too; its waiter is the inner store's.
#[derive(Debug)]
struct Counting {
    inner: Arc<dyn Store>,
    calls: Arc<AtomicU64>,
}

#[async_trait]
impl leasehold_core::wrap::Forward for Counting {
    fn inner(&self) -> &dyn Store {
        &*self.inner
    }
    async fn acquire(
        &self,
        key: &Key,
        owner: &OwnerToken,
        ttl: Duration,
    ) -> Result<AcquireOutcome, StoreError> {
        self.calls.fetch_add(1, Ordering::Relaxed);
        self.inner.acquire(key, owner, ttl).await
    }
    async fn renew(
        &self,
        key: &Key,
        owner: &OwnerToken,
        ttl: Duration,
    ) -> Result<RenewOutcome, StoreError> {
        self.calls.fetch_add(1, Ordering::Relaxed);
        self.inner.renew(key, owner, ttl).await
    }
    async fn release(&self, key: &Key, owner: &OwnerToken) -> Result<ReleaseOutcome, StoreError> {
        self.calls.fetch_add(1, Ordering::Relaxed);
        self.inner.release(key, owner).await
    }
    fn waiter(&self) -> Option<&dyn WaitStore> {
        self.inner.waiter()
    }
}

fn atomic_counter(unit: &'static str, calls: &Arc<AtomicU64>) -> Counter {
    let calls = calls.clone();
    Counter::new(unit, 0, move || {
        let calls = calls.clone();
        async move { Ok(calls.load(Ordering::Relaxed)) }
    })
}

/// The plain SQLite lock: a table written with sqlx alone.
#[derive(Clone)]
struct PlainSqlite {
    pool: leasehold_sqlite::sqlx::SqlitePool,
    statements: Arc<AtomicU64>,
}

impl PlainSqlite {
    async fn try_lock(&self, key: &str, token: &[u8]) -> Res<bool> {
        self.statements.fetch_add(1, Ordering::Relaxed);
        // Expiry on SQLite's clock (the wall clock, in ms), as a user would write it.
        let done = leasehold_sqlite::sqlx::query(
            "INSERT INTO plain_locks (name, owner, expires_ms) \
             VALUES (?1, ?2, CAST((julianday('now') - 2440587.5) * 86400000 AS INTEGER) + ?3) \
             ON CONFLICT (name) DO UPDATE SET owner = excluded.owner, expires_ms = excluded.expires_ms \
             WHERE plain_locks.expires_ms <= CAST((julianday('now') - 2440587.5) * 86400000 AS INTEGER)",
        )
        .bind(key)
        .bind(token)
        .bind(TTL.as_millis() as i64)
        .execute(&self.pool)
        .await
        .map_err(err)?;
        Ok(done.rows_affected() == 1)
    }

    async fn unlock(&self, key: &str, token: &[u8]) -> Res<()> {
        self.statements.fetch_add(1, Ordering::Relaxed);
        let done =
            leasehold_sqlite::sqlx::query("DELETE FROM plain_locks WHERE name = ?1 AND owner = ?2")
                .bind(key)
                .bind(token)
                .execute(&self.pool)
                .await
                .map_err(err)?;
        match done.rows_affected() {
            1 => Ok(()),
            _ => Err("compare-and-delete found another owner".into()),
        }
    }
}

async fn sqlite_section(plan: Plan) -> Res<Section> {
    use leasehold_sqlite::sqlx::sqlite::{
        SqliteConnectOptions, SqliteJournalMode, SqlitePoolOptions, SqliteSynchronous,
    };
    use leasehold_sqlite::{
        DEFAULT_BUSY_TIMEOUT, DEFAULT_MAX_CONNECTIONS, SqliteConfig, SqliteStore,
    };

    progress(format_args!("sqlite: opening a temporary file"));
    let dir = tempfile::Builder::new()
        .prefix("leasehold-bench-")
        .tempdir()
        .map_err(err)?;
    let store = SqliteStore::connect(SqliteConfig::new(dir.path().join("leases.db")))
        .await
        .map_err(err)?;
    store.migrate().await.map_err(err)?;
    let store: Arc<dyn Store> = Arc::new(store);
    let client = LeaseClient::new(store.clone(), lease_config()?);
    let calls = Arc::new(AtomicU64::new(0));
    let counted = LeaseClient::new(
        Arc::new(Counting {
            inner: store,
            calls: calls.clone(),
        }),
        lease_config()?,
    );
    let plain = PlainSqlite {
        pool: SqlitePoolOptions::new()
            .max_connections(DEFAULT_MAX_CONNECTIONS)
            .connect_with(
                SqliteConnectOptions::new()
                    .filename(dir.path().join("plain.db"))
                    .create_if_missing(true)
                    .journal_mode(SqliteJournalMode::Wal)
                    .synchronous(SqliteSynchronous::Full)
                    .busy_timeout(DEFAULT_BUSY_TIMEOUT),
            )
            .await
            .map_err(err)?,
        statements: Arc::new(AtomicU64::new(0)),
    };
    leasehold_sqlite::sqlx::query(
        "CREATE TABLE IF NOT EXISTS plain_locks \
         (name TEXT PRIMARY KEY, owner BLOB NOT NULL, expires_ms INTEGER NOT NULL)",
    )
    .execute(&plain.pool)
    .await
    .map_err(err)?;
    let version: String = leasehold_sqlite::sqlx::query_scalar("SELECT sqlite_version()")
        .fetch_one(&plain.pool)
        .await
        .map_err(err)?;

    let sides = vec![
        leasehold_pair("leasehold", client.clone()),
        token_lock_pair("plain", plain.clone()),
    ];
    progress(format_args!("sqlite: uncontended"));
    let levels = run_levels(&sides, &plan).await;

    let contenders = vec![
        leasehold_contender(
            "leasehold",
            counted,
            atomic_counter("write transactions", &calls),
        ),
        token_lock_contender(
            "plain",
            atomic_counter("write transactions", &plain.statements),
            plain.clone(),
        ),
    ];
    progress(format_args!("sqlite: contended"));
    let contended = contended(&contenders, &plan).await;
    drop((contenders, sides, client));
    plain.pool.close().await;
    Ok(Section {
        name: "sqlite",
        title: format!("SQLite {version}: a temporary file, WAL, synchronous=FULL, {DEFAULT_MAX_CONNECTIONS} connections per pool"),
        about: uncontended_about(&plan, "leasehold-sqlite against a plain lock table in a second file with the same settings"),
        legend: vec![
            ("leasehold", "leasehold-sqlite SqliteStore: LeaseClient::try_acquire + Lease::release (BEGIN IMMEDIATE transactions, durable fence, boot-time clock)".into()),
            ("plain", "sqlx alone: INSERT … ON CONFLICT DO UPDATE … WHERE expired (wall-clock expiry), then DELETE … WHERE owner = token (no fence)".into()),
        ],
        levels,
        ratios: vec![Ratio { num: "leasehold", den: "plain", meaning: "the share of a plain lock table's throughput that leasehold keeps".into() }],
        contended_about: {
            let mut a = contended_about(&plan, "");
            a.push(format!("leasehold: {}; plain: {}.", leasehold_wait_legend(), plain_retry_legend()));
            a.push("calls = write transactions (leasehold: Store calls counted by a forwarding wrapper; plain: its statements, each its own transaction).".into());
            a
        },
        contended,
        failed: None,
    })
}

// ---------------------------------------------------------------------------------------
// etcd

/// etcd-client alone, counting its requests: etcd's own lock service (the `Lock` and
/// `Unlock` RPCs on a lease) and a plain lock written with a lease and a transaction.
#[derive(Clone)]
struct RawEtcd {
    client: etcd_client::Client,
    requests: Arc<AtomicU64>,
}

impl RawEtcd {
    /// The client for one request, counted.
    fn call(&self) -> etcd_client::Client {
        self.requests.fetch_add(1, Ordering::Relaxed);
        self.client.clone()
    }

    async fn grant(&self) -> Res<i64> {
        let ttl = TTL.as_secs() as i64;
        Ok(self.call().lease_grant(ttl, None).await.map_err(err)?.id())
    }

    async fn revoke(&self, lease: i64) -> Res<()> {
        self.call().lease_revoke(lease).await.map_err(err)?;
        Ok(())
    }

    /// etcd's lock service: `Lock(name, lease)`, which waits in the server until the lock
    /// is free; returns the key that holds it.
    async fn lock(&self, name: &str, lease: i64) -> Res<Vec<u8>> {
        let options = etcd_client::LockOptions::new().with_lease(lease);
        let held = self
            .call()
            .lock(format!("etcd-lock/{name}"), Some(options))
            .await
            .map_err(err)?;
        Ok(held.key().to_vec())
    }

    async fn unlock(&self, key: Vec<u8>) -> Res<()> {
        self.call().unlock(key).await.map_err(err)?;
        Ok(())
    }

    /// `Lock` on a fresh lease (revoked again if the lock fails): the lock's key.
    async fn lock_on_lease(&self, name: &str) -> Res<(i64, Vec<u8>)> {
        let lease = self.grant().await?;
        match self.lock(name, lease).await {
            Ok(key) => Ok((lease, key)),
            Err(e) => {
                let _ = self.revoke(lease).await;
                Err(e)
            }
        }
    }

    async fn unlock_and_revoke(&self, lease: i64, key: Vec<u8>) -> Res<()> {
        self.unlock(key).await?;
        self.revoke(lease).await
    }

    fn plain_key(name: &str) -> String {
        format!("plain/{name}")
    }

    /// The plain lock's try: one transaction, put the key on the lease if it does not
    /// exist (`create_revision == 0`).
    async fn try_put(&self, name: &str, owner: &str, lease: i64) -> Res<bool> {
        use etcd_client::{Compare, CompareOp, PutOptions, Txn, TxnOp};
        let key = Self::plain_key(name);
        let txn = Txn::new()
            .when([Compare::create_revision(key.clone(), CompareOp::Equal, 0)])
            .and_then([TxnOp::put(
                key,
                owner,
                Some(PutOptions::new().with_lease(lease)),
            )]);
        Ok(self.call().txn(txn).await.map_err(err)?.succeeded())
    }

    /// The plain lock's release: delete the key if it still has this owner, then revoke
    /// the lease.
    async fn delete_and_revoke(&self, name: &str, owner: &str, lease: i64) -> Res<()> {
        use etcd_client::{Compare, CompareOp, Txn, TxnOp};
        let key = Self::plain_key(name);
        let txn = Txn::new()
            .when([Compare::value(key.clone(), CompareOp::Equal, owner)])
            .and_then([TxnOp::delete(key, None)]);
        let deleted = self.call().txn(txn).await.map_err(err)?.succeeded();
        self.revoke(lease).await?;
        match deleted {
            true => Ok(()),
            false => Err("the plain lock's key had another owner".into()),
        }
    }
}

async fn etcd_section(plan: Plan) -> Res<Section> {
    progress(format_args!("etcd: starting a private server"));
    let etcd = blocking(leasehold_testkit::EtcdServer::start).await?;
    let store: Arc<dyn Store> = Arc::new(
        leasehold_etcd::EtcdStore::open(&etcd.url())
            .await
            .map_err(err)?,
    );
    let client = LeaseClient::new(store.clone(), lease_config()?);
    let calls = Arc::new(AtomicU64::new(0));
    let counted = LeaseClient::new(
        Arc::new(Counting {
            inner: store,
            calls: calls.clone(),
        }),
        lease_config()?,
    );
    let raw = etcd_client::Client::connect([format!("127.0.0.1:{}", etcd.port())], None)
        .await
        .map_err(err)?;
    let service = RawEtcd {
        client: raw.clone(),
        requests: Arc::new(AtomicU64::new(0)),
    };
    let plain = RawEtcd {
        client: raw,
        requests: Arc::new(AtomicU64::new(0)),
    };
    let sides = vec![
        leasehold_pair("leasehold", client.clone()),
        Side::pairs("etcd-lock", {
            let e = service.clone();
            move |key| {
                let e = e.clone();
                async move {
                    let (lease, held) = e.lock_on_lease(&key).await?;
                    e.unlock_and_revoke(lease, held).await
                }
            }
        }),
        Side::pairs("plain", {
            let p = plain.clone();
            move |key| {
                let p = p.clone();
                async move {
                    let owner = OwnerToken::random().to_hex();
                    let lease = p.grant().await?;
                    if !p.try_put(&key, &owner, lease).await? {
                        let _ = p.revoke(lease).await;
                        return Err("the plain lock's key existed".into());
                    }
                    p.delete_and_revoke(&key, &owner, lease).await
                }
            }
        }),
    ];
    progress(format_args!("etcd: uncontended"));
    let levels = run_levels(&sides, &plan).await;
    let contenders = vec![
        leasehold_contender("leasehold", counted, atomic_counter("store calls", &calls)),
        Contender::new(
            "etcd-lock",
            atomic_counter("requests", &service.requests),
            {
                let e = service.clone();
                move |key| {
                    let e = e.clone();
                    async move {
                        let (lease, held) = e.lock_on_lease(&key).await?;
                        Ok(release(move || async move {
                            e.unlock_and_revoke(lease, held).await
                        }))
                    }
                }
            },
        ),
        Contender::new("plain", atomic_counter("requests", &plain.requests), {
            let p = plain.clone();
            move |key| {
                let p = p.clone();
                async move {
                    let owner = OwnerToken::random().to_hex();
                    let lease = p.grant().await?;
                    loop {
                        match p.try_put(&key, &owner, lease).await {
                            Ok(true) => break,
                            Ok(false) => plain_retry_sleep().await,
                            Err(e) => {
                                let _ = p.revoke(lease).await;
                                return Err(e);
                            }
                        }
                    }
                    Ok(release(move || async move {
                        p.delete_and_revoke(&key, &owner, lease).await
                    }))
                }
            }
        }),
    ];
    progress(format_args!("etcd: contended"));
    let contended = contended(&contenders, &plan).await;
    drop((contenders, sides, client, service, plain, etcd));
    Ok(Section {
        name: "etcd",
        title: "etcd 3.4: a private single member (50 ms heartbeat, 500 ms election timeout)".into(),
        about: uncontended_about(&plan, "leasehold-etcd against etcd's own lock service and a plain lock, both written with etcd-client 0.21 alone on one gRPC channel"),
        legend: vec![
            ("leasehold", "leasehold-etcd EtcdStore: LeaseClient::try_acquire + Lease::release (a lease grant and a transaction; a transaction and a revoke, with a keep-alive first past half the TTL)".into()),
            ("etcd-lock", format!("etcd's lock service: a lease grant (TTL {} s), Lock(name, lease) (the key name/lease, held while older ones exist; its create revision would serve as a fence), then Unlock(key) and a lease revoke", TTL.as_secs())),
            ("plain", "a lease grant, a transaction (if create_revision(key) == 0: put key with the lease), then a transaction (if value(key) == owner: delete) and a lease revoke (no fence, no keep-alive)".into()),
        ],
        levels,
        ratios: vec![
            Ratio { num: "leasehold", den: "etcd-lock", meaning: "the share of etcd's own lock service's throughput that leasehold keeps".into() },
            Ratio { num: "leasehold", den: "plain", meaning: "the share of a plain lease-and-transaction lock's throughput that leasehold keeps".into() },
        ],
        contended_about: {
            let mut a = contended_about(&plan, "");
            a.push(format!("leasehold: {}; on etcd, waiters queue under the key in arrival order (each woken by its predecessor's deletion, seen through one watch of the key's line) and the first is woken by the release, then takes the key on the etcd lease its wait granted.", leasehold_wait_legend()));
            a.push(format!("etcd-lock: a lease grant, then Lock, which waits in the server (its queue: the keys under the name, in create-revision order); plain: a lease grant, then the transaction, {}.", plain_retry_legend()));
            a.push("calls = leasehold: acquire, renew and release calls counted by a forwarding wrapper (the waits' own requests are not counted; each call one to four requests); etcd-lock, plain: their gRPC requests (grants, Lock calls, transactions, revokes).".into());
            a
        },
        contended,
        failed: None,
    })
}

// ---------------------------------------------------------------------------------------
// TLS

/// What TLS costs a user: the same store on private servers started alike, one set
/// requiring TLS (verified in full: CA and host), one plaintext, measured side by side:
/// PostgreSQL, MariaDB, etcd, Redis, Redlock (three servers each) and ZooKeeper. ZooKeeper
/// serves TLS only through Netty's connection factory, so its TLS server is compared with
/// a plaintext server on Netty too (only the encryption differs), and also with the
/// default plaintext server on NIO (what a user switching to TLS sees).
async fn tls_section(plan: Plan) -> Res<Section> {
    use leasehold_mysql::{MySqlConfig, MySqlLeaseStore};
    use leasehold_postgres::{PgConfig, PgLeaseStore};
    use leasehold_testkit::{
        EtcdOptions, MariaDbOptions, PostgresOptions, RedisOptions, RedisServer, ServerCert,
    };

    progress(format_args!(
        "tls: starting private servers, each with and without TLS"
    ));
    let pg_plain =
        blocking(|| leasehold_testkit::Postgres::start_with(PostgresOptions::new())).await?;
    let pg_tls = blocking(|| {
        leasehold_testkit::Postgres::start_with(PostgresOptions::new().tls(ServerCert::Localhost))
    })
    .await?;
    let db_plain =
        blocking(|| leasehold_testkit::MariaDb::start_with(MariaDbOptions::new())).await?;
    let db_tls = blocking(|| {
        leasehold_testkit::MariaDb::start_with(MariaDbOptions::new().tls(ServerCert::Localhost))
    })
    .await?;
    let etcd_plain = blocking(leasehold_testkit::EtcdServer::start).await?;
    let etcd_tls = blocking(|| {
        leasehold_testkit::EtcdServer::start_with(EtcdOptions::new().tls(ServerCert::Localhost))
    })
    .await?;
    let files = |tls: Option<&leasehold_testkit::TlsFiles>| tls.cloned().ok_or("no TLS files");

    let pg = |url: String| async move {
        let config = PgConfig::from_url(&url).map_err(err)?.pool_size(POOL);
        let store = PgLeaseStore::connect(&config).await.map_err(err)?;
        store.migrate().await.map_err(err)?;
        Res::Ok(LeaseClient::new(Arc::new(store), lease_config()?))
    };
    let pg_files = files(pg_tls.tls())?;
    let pg_plain_client = pg(format!("{}?sslmode=disable", pg_plain.url())).await?;
    let pg_tls_client = pg(format!(
        "{}?sslmode=verify-full&sslrootcert={}",
        pg_tls.url(),
        pg_files.ca_cert().display()
    ))
    .await?;
    let my = |url: String| async move {
        let config = MySqlConfig::from_url(&url)
            .map_err(err)?
            .max_connections(POOL);
        let store = MySqlLeaseStore::connect(config).await.map_err(err)?;
        store.migrate().await.map_err(err)?;
        Res::Ok(LeaseClient::new(Arc::new(store), lease_config()?))
    };
    let db_files = files(db_tls.tls())?;
    let my_plain_client = my(format!("{}?ssl-mode=DISABLED", db_plain.url())).await?;
    let my_tls_client = my(format!(
        "{}?ssl-mode=VERIFY_IDENTITY&ssl-ca={}",
        db_tls.url(),
        db_files.ca_cert().display()
    ))
    .await?;
    let etcd_files = files(etcd_tls.tls())?;
    let etcd = |url: String| async move {
        let store = leasehold_etcd::EtcdStore::open(&url).await.map_err(err)?;
        Res::Ok(LeaseClient::new(Arc::new(store), lease_config()?))
    };
    let etcd_plain_client = etcd(etcd_plain.url()).await?;
    // The test kit's TLS members also ask for a client certificate (etcd's
    // --client-cert-auth), as a production cluster does.
    let etcd_tls_client = etcd(format!(
        "{}?tls=true&cacert={}&cert={}&key={}",
        etcd_tls.url(),
        etcd_files.ca_cert().display(),
        etcd_files.client_cert().display(),
        etcd_files.client_key().display()
    ))
    .await?;
    // Redis and Redlock: plaintext servers and TLS-only servers (no plaintext port, the
    // client certificate optional and not presented), one private CA for all of them.
    let redis_tls_files = blocking(|| {
        let dir = tempfile::tempdir().map_err(err)?;
        let files = leasehold_testkit::TlsFiles::create(dir.path());
        Res::Ok((dir, files))
    })
    .await??;
    let redis_tls_options =
        RedisOptions::new().tls(redis_tls_files.1.clone(), ServerCert::Localhost);
    let redis_plain = blocking(RedisServer::start).await?;
    let redis_tls = {
        let o = redis_tls_options.clone();
        blocking(move || RedisServer::start_with(o)).await?
    };
    let redlock_plain =
        blocking(|| (0..3).map(|_| RedisServer::start()).collect::<Vec<_>>()).await?;
    let redlock_tls = {
        let o = redis_tls_options.clone();
        blocking(move || {
            (0..3)
                .map(|_| RedisServer::start_with(o.clone()))
                .collect::<Vec<_>>()
        })
        .await?
    };
    let zk_plain = blocking(leasehold_testkit::ZkServer::start).await?;
    let zk_netty = blocking(leasehold_testkit::ZkServer::start_netty).await?;
    let zk_tls =
        blocking(|| leasehold_testkit::ZkServer::start_tls(ServerCert::Localhost, false)).await?;

    let redis = |url: String| async move {
        let store = leasehold_redis::RedisStore::open(&url).await.map_err(err)?;
        Res::Ok(LeaseClient::new(Arc::new(store), lease_config()?))
    };
    // The kit's URLs: `redis://127.0.0.1:PORT/`, `rediss://127.0.0.1:PORT/?tls_ca=CA`.
    let redis_plain_client = redis(format!("{}?prefix=bench:", redis_plain.url())).await?;
    let redis_tls_client = redis(format!("{}&prefix=bench:", redis_tls.url())).await?;
    let redlock = |servers: &[RedisServer], params: String| {
        let hosts = servers
            .iter()
            .map(|s| format!("127.0.0.1:{}", s.port()))
            .collect::<Vec<_>>()
            .join(",");
        let url = format!("redlock://{hosts}/?prefix=bench:{params}");
        async move {
            let store = leasehold_redlock::RedlockStore::open(&url)
                .await
                .map_err(err)?;
            Res::Ok(LeaseClient::new(Arc::new(store), lease_config()?))
        }
    };
    let redlock_plain_client = redlock(&redlock_plain, String::new()).await?;
    let redlock_tls_client = redlock(
        &redlock_tls,
        format!("&tls=true&tls_ca={}", redis_tls_files.1.ca_cert().display()),
    )
    .await?;
    // The session timeout backs every grant's TTL (as in the ZooKeeper section); a TLS
    // session's first handshake may take the JVM a while.
    let zk = |port: u16, params: String| {
        let url = format!(
            "zookeeper://127.0.0.1:{port}/bench?session_timeout={}ms&connect_timeout=20s{params}",
            TTL.as_millis()
        );
        async move {
            let store = leasehold_zookeeper::ZkStore::open(&url)
                .await
                .map_err(err)?;
            Res::Ok(LeaseClient::new(Arc::new(store), lease_config()?))
        }
    };
    let zk_files = files(zk_tls.tls())?;
    let zk_plain_client = zk(zk_plain.port(), String::new()).await?;
    let zk_netty_client = zk(zk_netty.port(), String::new()).await?;
    let zk_tls_client = zk(
        zk_tls.port(),
        format!("&tls=true&cacert={}", zk_files.ca_cert().display()),
    )
    .await?;

    // Each store's two sides are neighbours, so that within a slice they run one after
    // the other.
    let sides = vec![
        leasehold_pair("pg-plain", pg_plain_client),
        leasehold_pair("pg-tls", pg_tls_client),
        leasehold_pair("mariadb-plain", my_plain_client),
        leasehold_pair("mariadb-tls", my_tls_client),
        leasehold_pair("etcd-plain", etcd_plain_client),
        leasehold_pair("etcd-tls", etcd_tls_client),
        leasehold_pair("redis-plain", redis_plain_client),
        leasehold_pair("redis-tls", redis_tls_client),
        leasehold_pair("redlock-plain", redlock_plain_client),
        leasehold_pair("redlock-tls", redlock_tls_client),
        leasehold_pair("zk-plain", zk_plain_client),
        leasehold_pair("zk-netty", zk_netty_client),
        leasehold_pair("zk-tls", zk_tls_client),
    ];
    progress(format_args!("tls: uncontended"));
    let levels = run_levels(&sides, &plan).await;
    // The clients go before the servers they talk to.
    drop(sides);
    drop((pg_plain, pg_tls, db_plain, db_tls, etcd_plain, etcd_tls));
    drop((redis_plain, redis_tls, redlock_plain, redlock_tls));
    drop((zk_plain, zk_netty, zk_tls, redis_tls_files));
    Ok(Section {
        name: "tls",
        title: "TLS: each store on private servers started alike, one set requiring TLS".into(),
        about: uncontended_about(
            &plan,
            "every network store of leasehold, with and without TLS; the TLS servers use a \
             private CA's certificate for 127.0.0.1, the clients verify it in full (CA and host)",
        ),
        legend: vec![
            ("pg-plain", "PgLeaseStore (LeaseClient::try_acquire + Lease::release), sslmode=disable".into()),
            ("pg-tls", "the same, sslmode=verify-full against a server with ssl=on that rejects plaintext".into()),
            ("mariadb-plain", "MySqlLeaseStore, ssl-mode=DISABLED".into()),
            ("mariadb-tls", "the same, ssl-mode=VERIFY_IDENTITY against a server with require_secure_transport=ON".into()),
            ("etcd-plain", "EtcdStore, plaintext".into()),
            ("etcd-tls", "the same, https with a client certificate (--client-cert-auth)".into()),
            ("redis-plain", "RedisStore, redis:// (one server)".into()),
            ("redis-tls", "the same, rediss://…?tls_ca=CA against a server listening with TLS only (--port 0 --tls-port)".into()),
            ("redlock-plain", "RedlockStore on three servers, plain TCP".into()),
            ("redlock-tls", "the same, tls=true&tls_ca=CA against three TLS-only servers".into()),
            ("zk-plain", "ZkStore, plaintext clientPort (standalone server, default NIO connection factory)".into()),
            ("zk-netty", "the same on a server with NettyServerCnxnFactory (plaintext clientPort)".into()),
            ("zk-tls", "the same, tls=true&cacert=CA against a server with only a secureClientPort (NettyServerCnxnFactory, as TLS requires)".into()),
        ],
        levels,
        ratios: vec![
            Ratio { num: "pg-tls", den: "pg-plain", meaning: "what TLS (verify-full) keeps of PostgreSQL's plaintext rate".into() },
            Ratio { num: "mariadb-tls", den: "mariadb-plain", meaning: "what TLS (VERIFY_IDENTITY) keeps of MariaDB's plaintext rate".into() },
            Ratio { num: "etcd-tls", den: "etcd-plain", meaning: "what TLS with a client certificate keeps of etcd's plaintext rate".into() },
            Ratio { num: "redis-tls", den: "redis-plain", meaning: "what rediss:// keeps of Redis's plaintext rate".into() },
            Ratio { num: "redlock-tls", den: "redlock-plain", meaning: "what TLS to every node keeps of Redlock's plaintext rate".into() },
            Ratio { num: "zk-tls", den: "zk-netty", meaning: "what TLS keeps of ZooKeeper's plaintext rate, both on the Netty connection factory".into() },
            Ratio { num: "zk-tls", den: "zk-plain", meaning: "what a switch from the default plaintext server (NIO) to TLS (Netty) keeps: factory and TLS together".into() },
            Ratio { num: "zk-netty", den: "zk-plain", meaning: "what the Netty connection factory alone keeps of the NIO factory's plaintext rate".into() },
        ],
        contended_about: vec![],
        contended: vec![],
        failed: None,
    })
}

// ---------------------------------------------------------------------------------------
// ZooKeeper

/// The plain lock: `zookeeper-client` alone on its own session. The lock is an ephemeral
/// node `/plain/<key>` (no fence, no queue: a taken lock is retried).
#[derive(Clone)]
struct PlainZk {
    client: zookeeper_client::Client,
    requests: Arc<AtomicU64>,
}

impl PlainZk {
    fn path(key: &str) -> String {
        format!("/plain/{}", key.replace('/', "%2F"))
    }

    async fn try_lock(&self, key: &str) -> Res<bool> {
        use zookeeper_client::{Acls, CreateMode, Error};
        self.requests.fetch_add(1, Ordering::Relaxed);
        let options = CreateMode::Ephemeral.with_acls(Acls::anyone_all());
        match self.client.create(&Self::path(key), b"", &options).await {
            Ok(_) => Ok(true),
            Err(Error::NodeExists) => Ok(false),
            Err(e) => Err(err(e)),
        }
    }

    async fn unlock(&self, key: &str) -> Res<()> {
        self.requests.fetch_add(1, Ordering::Relaxed);
        self.client
            .delete(&Self::path(key), None)
            .await
            .map_err(err)
    }
}

/// A lock written as Curator's `InterProcessMutex` works, with `zookeeper-client` alone on
/// its own session: each acquisition creates an ephemeral sequential node
/// `/curator/<key>/lock-N` (the parent a container node, made when missing); the lowest
/// holds the lock; any other watches the node just below its own and checks again when
/// that one is gone. Release = delete the node.
#[derive(Clone)]
struct CuratorZk {
    client: zookeeper_client::Client,
    requests: Arc<AtomicU64>,
}

impl CuratorZk {
    fn dir(key: &str) -> String {
        format!("/curator/{}", key.replace('/', "%2F"))
    }

    fn count(&self) {
        self.requests.fetch_add(1, Ordering::Relaxed);
    }

    /// Creates this acquisition's node under `dir` (and `dir`, if missing); returns its
    /// path.
    async fn enqueue(&self, dir: &str) -> Res<String> {
        use zookeeper_client::{Acls, CreateMode, Error};
        let node = CreateMode::EphemeralSequential.with_acls(Acls::anyone_all());
        let prefix = format!("{dir}/lock-");
        loop {
            self.count();
            match self.client.create(&prefix, b"", &node).await {
                Ok((_, seq)) => return Ok(format!("{prefix}{seq}")),
                Err(Error::NoNode) => {
                    // One create: `/curator` itself is made up front.
                    self.count();
                    let parent = CreateMode::Container.with_acls(Acls::anyone_all());
                    self.client.mkdir(dir, &parent).await.map_err(err)?;
                }
                Err(e) => return Err(err(e)),
            }
        }
    }

    /// The node just below `path` in `dir`'s queue, or `None` when `path` is the lowest
    /// (the lock is held).
    async fn predecessor(&self, dir: &str, path: &str) -> Res<Option<String>> {
        self.count();
        let mut children = self.client.list_children(dir).await.map_err(err)?;
        let seq = |name: &str| {
            name.strip_prefix("lock-")
                .and_then(|n| n.parse::<i64>().ok())
        };
        children.sort_by_key(|name| (seq(name), name.clone()));
        let mine = path.rsplit('/').next().unwrap_or_default();
        match children.iter().position(|name| name == mine) {
            Some(0) => Ok(None),
            Some(i) => Ok(Some(format!("{dir}/{}", children[i - 1]))),
            None => Err(format!("{path} is gone (the session expired?)")),
        }
    }

    /// Waits until `path` is the lowest node of `dir`.
    async fn wait_turn(&self, dir: &str, path: &str) -> Res<()> {
        while let Some(below) = self.predecessor(dir, path).await? {
            self.count();
            let (stat, watch) = self
                .client
                .check_and_watch_stat(&below)
                .await
                .map_err(err)?;
            if stat.is_some() {
                // Deleted (the release), or the session's end.
                watch.changed().await;
            }
        }
        Ok(())
    }

    /// Acquires `key`, waiting as long as it takes: the node's path.
    async fn lock(&self, key: &str) -> Res<String> {
        let dir = Self::dir(key);
        let path = self.enqueue(&dir).await?;
        match self.wait_turn(&dir, &path).await {
            Ok(()) => Ok(path),
            Err(e) => {
                let _ = self.unlock(&path).await;
                Err(e)
            }
        }
    }

    /// One try without waiting: the node's path if it is the lowest, else `None` (its node
    /// deleted again).
    async fn try_lock(&self, key: &str) -> Res<Option<String>> {
        let dir = Self::dir(key);
        let path = self.enqueue(&dir).await?;
        match self.predecessor(&dir, &path).await {
            Ok(None) => Ok(Some(path)),
            other => {
                self.unlock(&path).await?;
                other.map(|_| None)
            }
        }
    }

    async fn unlock(&self, path: &str) -> Res<()> {
        self.count();
        self.client.delete(path, None).await.map_err(err)
    }
}

async fn zookeeper_section(plan: Plan) -> Res<Section> {
    use leasehold_zookeeper::ZkStore;
    use zookeeper_client::{Acls, CreateMode};

    progress(format_args!("zookeeper: starting a server"));
    let server = blocking(leasehold_testkit::ZkServer::start).await?;
    // The session timeout backs every grant's TTL: ask for the TTL.
    let url = format!(
        "zookeeper://127.0.0.1:{}/bench?session_timeout={}ms",
        server.port(),
        TTL.as_millis()
    );
    let store: Arc<dyn Store> = Arc::new(ZkStore::open(&url).await.map_err(err)?);
    let client = LeaseClient::new(store.clone(), lease_config()?);
    let calls = Arc::new(AtomicU64::new(0));
    let counted = LeaseClient::new(
        Arc::new(Counting {
            inner: store,
            calls: calls.clone(),
        }),
        lease_config()?,
    );
    let raw = zookeeper_client::Client::connector()
        .with_session_timeout(TTL)
        .connect(&server.connect_string())
        .await
        .map_err(err)?;
    raw.mkdir(
        "/plain",
        &CreateMode::Persistent.with_acls(Acls::anyone_all()),
    )
    .await
    .map_err(err)?;
    let plain = PlainZk {
        client: raw,
        requests: Arc::new(AtomicU64::new(0)),
    };
    let curator = CuratorZk {
        client: zookeeper_client::Client::connector()
            .with_session_timeout(TTL)
            .connect(&server.connect_string())
            .await
            .map_err(err)?,
        requests: Arc::new(AtomicU64::new(0)),
    };
    curator
        .client
        .mkdir(
            "/curator",
            &CreateMode::Persistent.with_acls(Acls::anyone_all()),
        )
        .await
        .map_err(err)?;

    let sides = vec![
        leasehold_pair("leasehold", client.clone()),
        Side::pairs("plain", {
            let p = plain.clone();
            move |key| {
                let p = p.clone();
                async move {
                    if !p.try_lock(&key).await? {
                        return Err("the plain lock was held".into());
                    }
                    p.unlock(&key).await
                }
            }
        }),
        Side::pairs("curator", {
            let c = curator.clone();
            move |key| {
                let c = c.clone();
                async move {
                    match c.try_lock(&key).await? {
                        Some(path) => c.unlock(&path).await,
                        None => Err("the Curator-style lock was held".into()),
                    }
                }
            }
        }),
    ];
    progress(format_args!("zookeeper: uncontended"));
    let levels = run_levels(&sides, &plan).await;

    let contenders = vec![
        leasehold_contender("leasehold", counted, atomic_counter("store calls", &calls)),
        Contender::new("plain", atomic_counter("requests", &plain.requests), {
            let p = plain.clone();
            move |key| {
                let p = p.clone();
                async move {
                    while !p.try_lock(&key).await? {
                        plain_retry_sleep().await;
                    }
                    Ok(release(move || async move { p.unlock(&key).await }))
                }
            }
        }),
        Contender::new("curator", atomic_counter("requests", &curator.requests), {
            let c = curator.clone();
            move |key| {
                let c = c.clone();
                async move {
                    let path = c.lock(&key).await?;
                    Ok(release(move || async move { c.unlock(&path).await }))
                }
            }
        }),
    ];
    progress(format_args!("zookeeper: contended"));
    let contended = contended(&contenders, &plan).await;
    drop((contenders, sides, client, plain, curator));
    Ok(Section {
        name: "zookeeper",
        title: "ZooKeeper 3.8: a private standalone server on 127.0.0.1 (tick 250 ms)".into(),
        about: uncontended_about(&plan, "leasehold-zookeeper against a plain ephemeral-node lock and a Curator-style lock"),
        legend: vec![
            ("leasehold", "leasehold-zookeeper ZkStore: LeaseClient::try_acquire + Lease::release (a try creates an owner-named ephemeral sequential node first, then lists, as Curator does; czxid fence; one session per store)".into()),
            ("plain", "zookeeper-client alone: create an ephemeral node /plain/<key>, then delete it (no fence, no queue)".into()),
            ("curator", "zookeeper-client alone on its own session, Curator's InterProcessMutex recipe: create an ephemeral sequential node /curator/<key>/lock- (its parent a container node), list the children (held when lowest), then delete the node (no fence)".into()),
        ],
        levels,
        ratios: vec![
            Ratio { num: "leasehold", den: "plain", meaning: "the share of a plain ephemeral-node lock's throughput that leasehold keeps".into() },
            Ratio { num: "leasehold", den: "curator", meaning: "the same against a Curator-style queue lock".into() },
        ],
        contended_about: {
            let mut a = contended_about(&plan, "");
            a.push(format!("leasehold: {}; plain: {}; curator: queued, as InterProcessMutex waits: an exists watch on the node just below its own, a fresh list of the children when it fires.", leasehold_wait_legend(), plain_retry_legend()));
            a.push("calls = leasehold: Store calls counted by a forwarding wrapper (each one to four ZooKeeper requests); plain, curator: their ZooKeeper requests.".into());
            a
        },
        contended,
        failed: None,
    })
}

// ---------------------------------------------------------------------------------------

fn loadavg() -> String {
    std::fs::read_to_string("/proc/loadavg")
        .map(|s| s.split_whitespace().take(3).collect::<Vec<_>>().join(" "))
        .unwrap_or_else(|_| "?".into())
}

fn now_utc() -> String {
    std::process::Command::new("date")
        .args(["-u", "+%Y-%m-%dT%H:%M:%SZ"])
        .output()
        .ok()
        .filter(|o| o.status.success())
        .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_owned())
        .unwrap_or_else(|| "?".into())
}

fn main() {
    let opts = match parse_args(std::env::args().skip(1)) {
        Ok(Cli::Run(o)) => o,
        Ok(Cli::Help) => {
            println!("{USAGE}");
            return;
        }
        Err(e) => {
            eprintln!("compare: {e}\n{USAGE}");
            std::process::exit(2);
        }
    };
    let mut plan = if opts.quick {
        Plan::quick()
    } else {
        Plan::full()
    };
    if let Some(n) = opts.slices {
        plan.slices = n;
    }
    progress(format_args!(
        "compare: {}{}",
        opts.only
            .iter()
            .map(|b| b.name())
            .collect::<Vec<_>>()
            .join(", "),
        if opts.quick { " (--quick)" } else { "" }
    ));
    let started = now_utc();
    let load_before = loadavg();
    let cores = std::thread::available_parallelism().map_or(0, |n| n.get());
    let rt = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("compare: cannot start the runtime: {e}");
            std::process::exit(1);
        }
    };
    if !opts.json {
        println!(
            "leasehold comparison benchmark, {started}, {cores} cores, load average {load_before}{}",
            if opts.quick { ", --quick" } else { "" }
        );
        println!();
    }
    let mut sections = Vec::new();
    for store in &opts.only {
        let result = rt.block_on(async {
            match store {
                Backend::Redis => redis_section(plan).await,
                Backend::Postgres => postgres_section(plan, opts.pg_fsync).await,
                Backend::Mysql => mysql_section(plan).await,
                Backend::Sqlite => sqlite_section(plan).await,
                Backend::Etcd => etcd_section(plan).await,
                Backend::Zookeeper => zookeeper_section(plan).await,
                Backend::Tls => tls_section(plan).await,
            }
        });
        let section = result.unwrap_or_else(|e| Section {
            name: store.name(),
            title: store.name().into(),
            failed: Some(e),
            ..Section::default()
        });
        if !opts.json {
            println!("{}", section.print());
        }
        sections.push(section);
    }
    drop(rt);
    let load_after = loadavg();
    let failed = sections.iter().any(|s| s.failed.is_some());
    if opts.json {
        let command: String = std::env::args()
            .skip(1)
            .filter(|a| a != "--bench")
            .map(|a| format!(" {a}"))
            .collect();
        let doc = json!({
            "benchmark": "leasehold compare",
            "command": format!("cargo bench -p leasehold-bench --bench compare --{command}"),
            "started": started,
            "quick": opts.quick,
            "cores": cores,
            "load_before": load_before,
            "load_after": load_after,
            "plan": {
                "levels": LEVELS,
                "slices": plan.slices,
                "slice_ms": plan.slice.as_millis(),
                "contended_slice_ms": plan.contended_slice.as_millis(),
                "contenders": plan.contenders,
                "hold_ms": plan.hold.as_millis(),
                "pool": POOL,
            },
            "sections": sections.iter().map(Section::to_json).collect::<Vec<_>>(),
        });
        println!("{doc}");
    } else {
        println!("load average at the end: {load_after}");
    }
    if failed {
        std::process::exit(1);
    }
}
