//! `leasehold-pg-bench`: the hotspot benchmark of the PostgreSQL stores.
//!
//! 64 contenders (by default) fight over one key, beside the raw throughput of the same
//! SQL statement in the same run, to answer one question: does a table-based lock
//! collapse under contention?
//!
//! ```text
//! cargo run --release -p leasehold-bench --bin leasehold-pg-bench [-- --json]
//!     [--url postgres://…]     use this server instead of starting a private one
//!     [--contenders 64] [--seconds 5] [--pool 16] [--fsync on|off] [--hold-ms 0]
//! ```
//!
//! Without `--url` it starts a private PostgreSQL (initdb into a temporary directory, own
//! port; `fsync` on by default, so commits are real) through the test kit.
//!
//! Phases, each `--seconds` long, all on one pool of `--pool` connections:
//! 1. `raw_distinct`: every contender runs the acquire statement on its own key (the
//!    same-owner extend path: one row write per statement, no shared row).
//! 2. `raw_hot_spin`: every contender runs the acquire statement on one key with a new
//!    owner each time, releasing at once when granted, with no backoff at all: the
//!    thundering herd the claim is about.
//! 3. `raw_spin_upsert`: the same herd with the textbook single-statement acquire,
//!    `INSERT … ON CONFLICT (key) DO UPDATE … WHERE free`, which locks and dirties the row
//!    even when the lease is held (for comparison; the store does not use it).
//! 4. `lease_hot`: every contender is a `LeaseClient` calling `acquire(key, wait)` and
//!    releasing (after `--hold-ms`): full-jitter backoff, bounded by the holder's
//!    remaining TTL.
//! 5. `advisory_hot`: the same on the advisory-lock store.
#![forbid(unsafe_code)]

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use async_trait::async_trait;
use leasehold_core::{
    AcquireOutcome, Backoff, Capabilities, Fence, Key, LeaseClient, LeaseConfig, LeaseInfo,
    OwnerToken, ReleaseOutcome, RenewOutcome, Store, StoreError,
};
use leasehold_postgres::sqlx::{self, AssertSqlSafe};
use leasehold_postgres::{PgAdvisoryStore, PgConfig, PgLeaseStore};

struct Args {
    url: Option<String>,
    contenders: usize,
    seconds: u64,
    pool: u32,
    fsync: bool,
    hold: Duration,
    json: bool,
}

fn usage() -> ! {
    eprintln!(
        "usage: leasehold-pg-bench [--json] [--url URL] [--contenders N] [--seconds S] [--pool N] [--fsync on|off] [--hold-ms MS]"
    );
    std::process::exit(2)
}

fn parse_args() -> Args {
    let mut a = Args {
        url: None,
        contenders: 64,
        seconds: 5,
        pool: 16,
        fsync: true,
        hold: Duration::ZERO,
        json: false,
    };
    let mut it = std::env::args().skip(1);
    while let Some(arg) = it.next() {
        let mut val = || it.next().unwrap_or_else(|| usage());
        match arg.as_str() {
            "--json" => a.json = true,
            "--url" => a.url = Some(val()),
            "--contenders" => a.contenders = val().parse().unwrap_or_else(|_| usage()),
            "--seconds" => a.seconds = val().parse().unwrap_or_else(|_| usage()),
            "--pool" => a.pool = val().parse().unwrap_or_else(|_| usage()),
            "--fsync" => {
                a.fsync = match val().as_str() {
                    "on" => true,
                    "off" => false,
                    _ => usage(),
                }
            }
            "--hold-ms" => {
                a.hold = Duration::from_millis(val().parse().unwrap_or_else(|_| usage()))
            }
            "-h" | "--help" => usage(),
            _ => usage(),
        }
    }
    if a.contenders == 0 || a.seconds == 0 || a.pool == 0 {
        usage()
    }
    a
}

/// Latencies and counters of one phase.
#[derive(Default)]
struct Tally {
    latencies: Vec<Duration>,
    statements: u64,
    grants: u64,
    errors: u64,
}

impl Tally {
    fn merge(&mut self, other: Tally) {
        self.latencies.extend(other.latencies);
        self.statements += other.statements;
        self.grants += other.grants;
        self.errors += other.errors;
    }
}

struct PhaseResult {
    name: &'static str,
    what: &'static str,
    seconds: f64,
    statements_per_s: f64,
    grants_per_s: f64,
    p50_ms: f64,
    p99_ms: f64,
    errors: u64,
}

fn percentile(sorted: &[Duration], p: f64) -> f64 {
    if sorted.is_empty() {
        return f64::NAN;
    }
    let i = ((sorted.len() as f64 - 1.0) * p).round() as usize;
    sorted[i].as_secs_f64() * 1000.0
}

fn result(name: &'static str, what: &'static str, elapsed: Duration, mut t: Tally) -> PhaseResult {
    t.latencies.sort();
    let s = elapsed.as_secs_f64();
    PhaseResult {
        name,
        what,
        seconds: s,
        statements_per_s: t.statements as f64 / s,
        grants_per_s: t.grants as f64 / s,
        p50_ms: percentile(&t.latencies, 0.50),
        p99_ms: percentile(&t.latencies, 0.99),
        errors: t.errors,
    }
}

/// Runs `task(i, stop)` in `n` spawned contenders for `dur`, then raises `stop` and
/// merges what they tallied; returns the tally and the phase's length.
async fn contend<F, Fut>(n: usize, dur: Duration, task: F) -> (Tally, Duration)
where
    F: Fn(usize, Arc<AtomicBool>) -> Fut,
    Fut: Future<Output = Tally> + Send + 'static,
{
    let stop = Arc::new(AtomicBool::new(false));
    let start = Instant::now();
    let tasks: Vec<_> = (0..n)
        .map(|i| tokio::spawn(task(i, stop.clone())))
        .collect();
    tokio::time::sleep(dur).await;
    stop.store(true, Ordering::Relaxed);
    let mut all = Tally::default();
    for t in tasks {
        all.merge(t.await.expect("task"));
    }
    (all, start.elapsed())
}

/// Counts store calls (statements) made by the lease clients.
#[derive(Debug)]
struct Counting {
    inner: Arc<dyn Store>,
    calls: AtomicU64,
}

#[async_trait]
impl Store for Counting {
    fn backend(&self) -> &'static str {
        self.inner.backend()
    }
    fn capabilities(&self) -> Capabilities {
        self.inner.capabilities()
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
    async fn inspect(&self, key: &Key) -> Result<Option<LeaseInfo>, StoreError> {
        self.inner.inspect(key).await
    }
    async fn break_lease(&self, key: &Key) -> Result<Fence, StoreError> {
        self.inner.break_lease(key).await
    }
}

async fn raw_distinct(store: &PgLeaseStore, n: usize, dur: Duration) -> PhaseResult {
    let sql: Arc<str> = store.acquire_sql().into();
    let (all, elapsed) = contend(n, dur, |i, stop| {
        let (pool, sql) = (store.pool().clone(), sql.clone());
        async move {
            let key = format!("bench:distinct:{i}");
            let owner = OwnerToken::random();
            let mut t = Tally::default();
            while !stop.load(Ordering::Relaxed) {
                let sent = Instant::now();
                let r = sqlx::query(AssertSqlSafe(sql.clone()))
                    .bind(&key)
                    .bind(&owner.as_bytes()[..])
                    .bind(10_000_000_i64)
                    .fetch_optional(&pool)
                    .await;
                t.latencies.push(sent.elapsed());
                t.statements += 1;
                match r {
                    Ok(_) => t.grants += 1,
                    Err(_) => t.errors += 1,
                }
            }
            t
        }
    })
    .await;
    result(
        "raw_distinct",
        "acquire SQL, one key per contender (no shared row)",
        elapsed,
        all,
    )
}

/// The textbook single upsert: `INSERT … ON CONFLICT DO UPDATE … WHERE free`. Same
/// semantics as the store's acquire, but a failed attempt locks and dirties the row.
fn naive_upsert_sql(table: &str) -> String {
    format!(
        "WITH n AS MATERIALIZED (SELECT clock_timestamp() AS t), up AS ( \
           INSERT INTO {table} AS l (key, owner, fence, expires_at) \
           SELECT $1, $2, GREATEST(1, (extract(epoch FROM n.t) * 1000000)::bigint), \
                  n.t + $3::bigint * interval '1 microsecond' FROM n \
           ON CONFLICT (key) DO UPDATE SET owner = EXCLUDED.owner, \
             fence = CASE WHEN l.owner = EXCLUDED.owner AND l.expires_at > (SELECT t FROM n) \
                          THEN l.fence ELSE GREATEST(l.fence + 1, EXCLUDED.fence) END, \
             expires_at = EXCLUDED.expires_at \
           WHERE l.owner IS NULL OR l.expires_at <= (SELECT t FROM n) OR l.owner = EXCLUDED.owner \
           RETURNING l.fence) \
         SELECT fence FROM up"
    )
}

/// The spin phase with the naive upsert instead of the store's acquire statement.
async fn raw_hot_spin_upsert(store: &PgLeaseStore, n: usize, dur: Duration) -> PhaseResult {
    let key = Key::new("bench:hot-spin-upsert").expect("key");
    let sql: Arc<str> = naive_upsert_sql(&store.table().sql()).into();
    let (all, elapsed) = contend(n, dur, |_, stop| {
        let (store, key, sql) = (store.clone(), key.clone(), sql.clone());
        async move {
            let mut t = Tally::default();
            while !stop.load(Ordering::Relaxed) {
                let owner = OwnerToken::random();
                let sent = Instant::now();
                let r = sqlx::query_scalar::<_, i64>(AssertSqlSafe(sql.clone()))
                    .bind(key.as_str())
                    .bind(&owner.as_bytes()[..])
                    .bind(10_000_000_i64)
                    .fetch_optional(store.pool())
                    .await;
                t.latencies.push(sent.elapsed());
                t.statements += 1;
                match r {
                    Ok(Some(_)) => {
                        t.grants += 1;
                        t.statements += 1;
                        if store.release(&key, &owner).await.is_err() {
                            t.errors += 1;
                        }
                    }
                    Ok(None) => {}
                    Err(_) => t.errors += 1,
                }
            }
            t
        }
    })
    .await;
    result(
        "raw_spin_upsert",
        "as raw_hot_spin, with a naive INSERT … ON CONFLICT DO UPDATE … WHERE acquire",
        elapsed,
        all,
    )
}

async fn raw_hot_spin(store: &PgLeaseStore, n: usize, dur: Duration) -> PhaseResult {
    let key = Key::new("bench:hot-spin").expect("key");
    let (all, elapsed) = contend(n, dur, |_, stop| {
        let (store, key) = (store.clone(), key.clone());
        async move {
            let mut t = Tally::default();
            while !stop.load(Ordering::Relaxed) {
                let owner = OwnerToken::random();
                let sent = Instant::now();
                let r = store.acquire(&key, &owner, Duration::from_secs(10)).await;
                t.latencies.push(sent.elapsed());
                t.statements += 1;
                match r {
                    Ok(AcquireOutcome::Acquired { .. }) => {
                        t.grants += 1;
                        t.statements += 1;
                        if store.release(&key, &owner).await.is_err() {
                            t.errors += 1;
                        }
                    }
                    Ok(AcquireOutcome::Held { .. }) => {}
                    Err(_) => t.errors += 1,
                }
            }
            t
        }
    })
    .await;
    result(
        "raw_hot_spin",
        "acquire SQL on one key, new owner each time, release when granted, no backoff",
        elapsed,
        all,
    )
}

async fn lease_hot(
    name: &'static str,
    what: &'static str,
    store: Arc<dyn Store>,
    n: usize,
    dur: Duration,
    hold: Duration,
) -> PhaseResult {
    let counting = Arc::new(Counting {
        inner: store,
        calls: AtomicU64::new(0),
    });
    let config = LeaseConfig::builder(Duration::from_secs(5))
        .backoff(
            Backoff::new(Duration::from_millis(1), Duration::from_millis(100)).expect("backoff"),
        )
        .build()
        .expect("config");
    let (mut all, elapsed) = contend(n, dur, |_, stop| {
        let client = LeaseClient::new(counting.clone() as Arc<dyn Store>, config.clone());
        async move {
            let mut t = Tally::default();
            while !stop.load(Ordering::Relaxed) {
                let sent = Instant::now();
                match client.acquire("bench:hot", Duration::from_secs(30)).await {
                    Ok(lease) => {
                        t.latencies.push(sent.elapsed());
                        t.grants += 1;
                        if !hold.is_zero() {
                            tokio::time::sleep(hold).await;
                        }
                        if !matches!(lease.release().await, Ok(true)) {
                            t.errors += 1;
                        }
                    }
                    Err(_) => t.errors += 1,
                }
            }
            t
        }
    })
    .await;
    all.statements = counting.calls.load(Ordering::Relaxed);
    result(name, what, elapsed, all)
}

async fn run(args: Args, url: String) -> Vec<PhaseResult> {
    let config = PgConfig::from_url(&url)
        .unwrap_or_else(|e| panic!("{e}"))
        .pool_size(args.pool)
        .application_name("leasehold-bench");
    let store = PgLeaseStore::connect(&config)
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    store.migrate().await.unwrap_or_else(|e| panic!("{e}"));
    let adv = PgAdvisoryStore::connect(&config)
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    adv.migrate().await.unwrap_or_else(|e| panic!("{e}"));
    let dur = Duration::from_secs(args.seconds);
    let n = args.contenders;
    let mut out = vec![raw_distinct(&store, n, dur).await];
    out.push(raw_hot_spin(&store, n, dur).await);
    out.push(raw_hot_spin_upsert(&store, n, dur).await);
    out.push(
        lease_hot(
            "lease_hot",
            "LeaseClient.acquire(wait) on one key, release at once; lease-table store",
            Arc::new(store.clone()),
            n,
            dur,
            args.hold,
        )
        .await,
    );
    out.push(
        lease_hot(
            "advisory_hot",
            "LeaseClient.acquire(wait) on one key, release at once; advisory-lock store",
            Arc::new(adv.clone()),
            n,
            dur,
            args.hold,
        )
        .await,
    );
    out
}

fn main() {
    let args = parse_args();
    let server = match &args.url {
        Some(_) => None,
        None => {
            eprintln!(
                "starting a private PostgreSQL (fsync {})…",
                if args.fsync { "on" } else { "off" }
            );
            Some(leasehold_testkit::Postgres::start_with(
                leasehold_testkit::PostgresOptions::new()
                    .fsync(args.fsync)
                    .setting("max_connections", "200"),
            ))
        }
    };
    let url = args
        .url
        .clone()
        .or_else(|| server.as_ref().map(|s| s.url()))
        .expect("a url");
    let (json, contenders, pool, fsync, seconds, hold) = (
        args.json,
        args.contenders,
        args.pool,
        args.fsync,
        args.seconds,
        args.hold,
    );
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .expect("runtime");
    let results = rt.block_on(run(args, url));
    drop(rt);
    drop(server);
    if json {
        let phases: Vec<String> = results
            .iter()
            .map(|r| {
                format!(
                    "{{\"phase\":\"{}\",\"seconds\":{:.3},\"statements_per_s\":{:.1},\"grants_per_s\":{:.1},\"p50_ms\":{:.3},\"p99_ms\":{:.3},\"errors\":{}}}",
                    r.name, r.seconds, r.statements_per_s, r.grants_per_s, r.p50_ms, r.p99_ms, r.errors
                )
            })
            .collect();
        println!(
            "{{\"contenders\":{contenders},\"pool\":{pool},\"fsync\":{fsync},\"seconds_per_phase\":{seconds},\"hold_ms\":{},\"phases\":[{}]}}",
            hold.as_millis(),
            phases.join(",")
        );
    } else {
        println!(
            "{contenders} contenders, pool {pool}, fsync {}, {seconds} s per phase, hold {} ms",
            if fsync { "on" } else { "off" },
            hold.as_millis()
        );
        println!(
            "{:<14} {:>12} {:>10} {:>9} {:>9} {:>7}  what",
            "phase", "statements/s", "grants/s", "p50 ms", "p99 ms", "errors"
        );
        for r in &results {
            println!(
                "{:<14} {:>12.0} {:>10.0} {:>9.2} {:>9.2} {:>7}  {}",
                r.name, r.statements_per_s, r.grants_per_s, r.p50_ms, r.p99_ms, r.errors, r.what
            );
        }
        println!(
            "(raw phases: latency of one statement; lease phases: latency of acquire() including waiting)"
        );
    }
}
