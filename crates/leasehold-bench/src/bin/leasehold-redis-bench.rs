//! Benchmark of the Redis store.
//!
//! ```text
//! cargo run --release -p leasehold-bench --bin leasehold-redis-bench [-- --json] [--url URL]
//!     [--ops N] [--handoffs N] [--slices N] [--no-watchdog-thread]
//! ```
//!
//! `--no-watchdog-thread` runs the leasehold path with `LeaseConfig::watchdog_thread(false)`
//! (a diagnostic: the share of the watchdog thread's wake-ups in the client's cost).
//!
//! Without `--url` it starts a private `redis-server` (no persistence) on a free port and
//! stops it at the end.
//!
//! * Uncontended: acquire + release on distinct keys at 1, 16 and 64 concurrent tasks,
//!   through leasehold (`LeaseClient::try_acquire` + `Lease::release`, i.e. everything a
//!   user pays for: owner token, scheduler, watchdog, metrics, store, scripts), against
//!   what a user would write instead: a **plain lock** with the `redis` crate alone
//!   (`SET key token NX PX ttl`, then a compare-and-delete script — what rslock does; no
//!   fence, no heartbeat); and, as a diagnostic, the store's own calls
//!   (`RedisStore::acquire` + `release`). All use one multiplexed connection. Each level
//!   runs in slices that interleave the three (in rotating order), so background load
//!   hits them alike; throughput is the median of the slices' throughputs, and the ratio
//!   the median over slices of leasehold ÷ plain lock in the same slice.
//! * Contended: 16 tasks loop on one key (`LeaseClient::acquire` with a long wait, release
//!   at once): acquisitions per second and the hand-off latency from a release returning to
//!   the next holder's acquire returning.
#![forbid(unsafe_code)]

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use leasehold_core::{LeaseClient, LeaseConfig, OwnerToken};
use leasehold_redis::{RedisConfigBuilder, RedisStore};

const TTL: Duration = Duration::from_secs(10);
const CONCURRENCY: [usize; 3] = [1, 16, 64];
const WAITERS: usize = 16;

struct Args {
    json: bool,
    url: Option<String>,
    ops: usize,
    handoffs: usize,
    slices: usize,
    watchdog_thread: bool,
}

fn usage() -> ! {
    eprintln!(
        "usage: leasehold-redis-bench [--json] [--url redis://HOST:PORT/] [--ops N] [--handoffs N] [--slices N] [--no-watchdog-thread]"
    );
    std::process::exit(2)
}

fn parse_args() -> Args {
    let mut a = Args {
        json: false,
        url: None,
        ops: 20_000,
        handoffs: 2_000,
        slices: 10,
        watchdog_thread: true,
    };
    let mut it = std::env::args().skip(1);
    while let Some(arg) = it.next() {
        let num = |it: &mut dyn Iterator<Item = String>| -> usize {
            it.next()
                .and_then(|v| v.parse().ok())
                .filter(|n| *n > 0)
                .unwrap_or_else(|| usage())
        };
        match arg.as_str() {
            "--json" => a.json = true,
            "--url" => a.url = Some(it.next().unwrap_or_else(|| usage())),
            "--ops" => a.ops = num(&mut it),
            "--handoffs" => a.handoffs = num(&mut it),
            "--slices" => a.slices = num(&mut it),
            "--no-watchdog-thread" => a.watchdog_thread = false,
            "-h" | "--help" => usage(),
            _ => usage(),
        }
    }
    a
}

#[derive(Debug, Clone, Copy)]
struct Measured {
    ops_per_sec: f64,
    p50: Duration,
    p99: Duration,
}

/// Latencies and wall time of one batch.
struct Sample {
    lat: Vec<Duration>,
    elapsed: Duration,
}

impl Sample {
    fn ops_per_sec(&self) -> f64 {
        self.lat.len() as f64 / self.elapsed.as_secs_f64()
    }
}

/// Slices of one kind: the throughput is the median over slices (robust to a slice that
/// a burst of background load stalled), the latencies are over every call.
#[derive(Default)]
struct Slices {
    throughput: Vec<f64>,
    lat: Vec<Duration>,
}

impl Slices {
    fn add(&mut self, s: Sample) {
        self.throughput.push(s.ops_per_sec());
        self.lat.extend(s.lat);
    }
    fn measured(mut self) -> Measured {
        let mut m = summarize(std::mem::take(&mut self.lat), Duration::from_secs(1));
        m.ops_per_sec = median(&mut self.throughput);
        m
    }
}

fn median(v: &mut [f64]) -> f64 {
    v.sort_by(f64::total_cmp);
    match v.len() {
        0 => f64::NAN,
        n if n % 2 == 1 => v[n / 2],
        n => (v[n / 2 - 1] + v[n / 2]) / 2.0,
    }
}

fn summarize(mut lat: Vec<Duration>, elapsed: Duration) -> Measured {
    lat.sort_unstable();
    let pct = |p: f64| lat[((lat.len() as f64 * p) as usize).min(lat.len() - 1)];
    Measured {
        ops_per_sec: lat.len() as f64 / elapsed.as_secs_f64(),
        p50: pct(0.50),
        p99: pct(0.99),
    }
}

/// Runs `per_task` iterations of `op` in each of `tasks` tasks; returns the latencies.
async fn run_tasks<F, Fut>(tasks: usize, per_task: usize, op: F) -> Sample
where
    F: Fn(usize, usize) -> Fut + Send + Sync + 'static,
    Fut: std::future::Future<Output = ()> + Send,
{
    let op = Arc::new(op);
    let started = Instant::now();
    let handles: Vec<_> = (0..tasks)
        .map(|t| {
            let op = op.clone();
            tokio::spawn(async move {
                let mut lat = Vec::with_capacity(per_task);
                for i in 0..per_task {
                    let t0 = Instant::now();
                    op(t, i).await;
                    lat.push(t0.elapsed());
                }
                lat
            })
        })
        .collect();
    let mut all = Vec::with_capacity(tasks * per_task);
    for h in handles {
        all.extend(h.await.expect("task"));
    }
    Sample {
        lat: all,
        elapsed: started.elapsed(),
    }
}

async fn leasehold_round(
    client: &LeaseClient,
    tasks: usize,
    per_task: usize,
    round: usize,
) -> Sample {
    let client = client.clone();
    run_tasks(tasks, per_task, move |t, i| {
        let client = client.clone();
        async move {
            let lease = client
                .try_acquire(format!("bench:lh:{round}:{t}:{i}"))
                .await
                .expect("uncontended acquire");
            assert!(lease.release().await.expect("release"));
        }
    })
    .await
}

async fn store_round(
    store: &Arc<RedisStore>,
    tasks: usize,
    per_task: usize,
    round: usize,
) -> Sample {
    use leasehold_core::Store;
    let store = store.clone();
    run_tasks(tasks, per_task, move |t, i| {
        let store = store.clone();
        async move {
            let key = leasehold_core::Key::new(format!("bench:st:{round}:{t}:{i}")).expect("key");
            let owner = OwnerToken::random();
            let got = store
                .acquire(&key, &owner, TTL)
                .await
                .expect("store acquire");
            assert!(matches!(
                got,
                leasehold_core::AcquireOutcome::Acquired { .. }
            ));
            assert_eq!(
                store.release(&key, &owner).await.expect("store release"),
                leasehold_core::ReleaseOutcome::Released
            );
        }
    })
    .await
}

/// What a user would write instead of leasehold: the `redis` crate alone, `SET key token
/// NX PX ttl` to acquire and a compare-and-delete script to release (what rslock does),
/// on one multiplexed connection. No fence, no heartbeat.
struct PlainLock {
    conn: redis::aio::MultiplexedConnection,
    release: redis::Script,
}

const COMPARE_AND_DELETE: &str = "if redis.call('GET', KEYS[1]) == ARGV[1] then \
     return redis.call('DEL', KEYS[1]) else return 0 end";

async fn plain_round(
    plain: &Arc<PlainLock>,
    tasks: usize,
    per_task: usize,
    round: usize,
) -> Sample {
    let plain = plain.clone();
    run_tasks(tasks, per_task, move |t, i| {
        let plain = plain.clone();
        async move {
            let mut conn = plain.conn.clone();
            let key = format!("bench:plain:{round}:{t}:{i}");
            let token = OwnerToken::random().to_hex();
            let set: Option<String> = redis::cmd("SET")
                .arg(&key)
                .arg(&token)
                .arg("NX")
                .arg("PX")
                .arg(TTL.as_millis() as u64)
                .query_async(&mut conn)
                .await
                .expect("plain acquire");
            assert!(set.is_some(), "uncontended plain acquire");
            let deleted: i64 = plain
                .release
                .key(&key)
                .arg(&token)
                .invoke_async(&mut conn)
                .await
                .expect("plain release");
            assert_eq!(deleted, 1);
        }
    })
    .await
}

struct Uncontended {
    tasks: usize,
    leasehold: Measured,
    store: Measured,
    plain: Measured,
    /// Median over slices of leasehold ÷ plain-lock throughput in the same slice.
    ratio: f64,
    /// Median over slices of store ÷ plain-lock throughput in the same slice.
    store_ratio: f64,
}

struct Contended {
    acquisitions_per_sec: f64,
    p50: Duration,
    p99: Duration,
    count: usize,
}

async fn contended(client: &LeaseClient, handoffs: usize) -> Contended {
    let epoch = Instant::now();
    let released_at = Arc::new(AtomicU64::new(u64::MAX));
    let done = Arc::new(AtomicU64::new(0));
    let started = Instant::now();
    let handles: Vec<_> = (0..WAITERS)
        .map(|_| {
            let (client, released_at, done) = (client.clone(), released_at.clone(), done.clone());
            tokio::spawn(async move {
                let mut lat = Vec::new();
                while done.load(Ordering::Relaxed) < handoffs as u64 {
                    let lease = match client
                        .acquire("bench:contended", Duration::from_secs(30))
                        .await
                    {
                        Ok(l) => l,
                        Err(e) => panic!("contended acquire: {e}"),
                    };
                    let now = epoch.elapsed().as_nanos() as u64;
                    let prev = released_at.load(Ordering::Acquire);
                    if prev != u64::MAX && now >= prev {
                        lat.push(Duration::from_nanos(now - prev));
                    }
                    done.fetch_add(1, Ordering::Relaxed);
                    lease.release().await.expect("release");
                    released_at.store(epoch.elapsed().as_nanos() as u64, Ordering::Release);
                }
                lat
            })
        })
        .collect();
    let mut all = Vec::new();
    for h in handles {
        all.extend(h.await.expect("waiter"));
    }
    let elapsed = started.elapsed();
    let count = done.load(Ordering::Relaxed) as usize;
    let m = summarize(all, elapsed);
    Contended {
        acquisitions_per_sec: count as f64 / elapsed.as_secs_f64(),
        p50: m.p50,
        p99: m.p99,
        count,
    }
}

fn us(d: Duration) -> f64 {
    d.as_secs_f64() * 1e6
}

#[tokio::main(flavor = "multi_thread")]
async fn main() {
    let args = parse_args();
    let server = args
        .url
        .is_none()
        .then(leasehold_testkit::RedisServer::start);
    let prefix = "bench:";
    let cfg = match (&args.url, &server) {
        (Some(url), _) => leasehold_redis::RedisConfig::from_url(url)
            .unwrap_or_else(|e| {
                eprintln!("{e}");
                std::process::exit(2)
            })
            .into_builder()
            .prefix(prefix)
            .build()
            .expect("config"),
        (None, Some(s)) => RedisConfigBuilder::standalone("127.0.0.1", s.port())
            .prefix(prefix)
            .build()
            .expect("config"),
        _ => unreachable!(),
    };
    if cfg.is_cluster() {
        eprintln!("the benchmark needs a standalone server (redis:// or rediss://)");
        std::process::exit(2);
    }
    let target = cfg.to_string();
    let store = Arc::new(RedisStore::connect(cfg.clone()).await.unwrap_or_else(|e| {
        eprintln!("cannot connect: {e}");
        std::process::exit(1)
    }));
    let lease_config = LeaseConfig::builder(TTL)
        .watchdog_thread(args.watchdog_thread)
        .build()
        .expect("lease config");
    let client = LeaseClient::new(store.clone(), lease_config);

    // The plain lock: the redis crate alone, one multiplexed connection.
    let plain_url = match (&args.url, &server) {
        (Some(url), _) => url.split('?').next().unwrap_or(url).to_owned(),
        (None, Some(s)) => s.url(),
        _ => unreachable!(),
    };
    let plain_client = redis::Client::open(plain_url.as_str()).expect("plain client");
    let plain = Arc::new(PlainLock {
        conn: plain_client
            .get_multiplexed_async_connection()
            .await
            .expect("plain connection"),
        release: redis::Script::new(COMPARE_AND_DELETE),
    });

    let version = {
        let mut c = plain.conn.clone();
        let info: String = redis::cmd("INFO")
            .arg("server")
            .query_async(&mut c)
            .await
            .unwrap_or_default();
        info.lines()
            .find_map(|l| l.strip_prefix("redis_version:"))
            .unwrap_or("?")
            .trim()
            .to_owned()
    };

    // Warm up both paths (connections, scripts loaded, allocator).
    leasehold_round(&client, 16, 200, 0).await;
    store_round(&store, 16, 200, 0).await;
    plain_round(&plain, 16, 200, 0).await;

    let mut results = Vec::new();
    for &tasks in &CONCURRENCY {
        let per_task = (args.ops / tasks / args.slices).max(1);
        let mut acc: [Slices; 3] = Default::default();
        let (mut ratios, mut store_ratios) = (Vec::new(), Vec::new());
        for slice in 1..=args.slices {
            let mut tp = [0.0; 3];
            // Rotate the order so that no side always runs on a warmer server.
            for j in 0..3 {
                let which = (j + slice) % 3;
                let m = match which {
                    0 => leasehold_round(&client, tasks, per_task, slice).await,
                    1 => store_round(&store, tasks, per_task, slice).await,
                    _ => plain_round(&plain, tasks, per_task, slice).await,
                };
                tp[which] = m.ops_per_sec();
                acc[which].add(m);
            }
            // Paired: the three kinds of one slice ran under the same background load.
            ratios.push(tp[0] / tp[2]);
            store_ratios.push(tp[1] / tp[2]);
            // Keep the server's keyspace small.
            let mut c = plain.conn.clone();
            let _: redis::RedisResult<()> = redis::cmd("FLUSHDB").query_async(&mut c).await;
        }
        let [lh, st, pl] = acc;
        results.push(Uncontended {
            tasks,
            leasehold: lh.measured(),
            store: st.measured(),
            plain: pl.measured(),
            ratio: median(&mut ratios),
            store_ratio: median(&mut store_ratios),
        });
    }
    let handoff = contended(&client, args.handoffs).await;

    if args.json {
        let mut out = String::from("{");
        out += &format!(
            "\"redis_version\":\"{version}\",\"target\":\"{}\",\"ops_per_level\":{},\"slices\":{},\"uncontended\":[",
            target.replace('"', "'"),
            args.ops,
            args.slices
        );
        for (i, r) in results.iter().enumerate() {
            if i > 0 {
                out.push(',');
            }
            let m = |m: &Measured| {
                format!(
                    "{{\"ops_per_sec\":{:.0},\"p50_us\":{:.1},\"p99_us\":{:.1}}}",
                    m.ops_per_sec,
                    us(m.p50),
                    us(m.p99)
                )
            };
            out += &format!(
                "{{\"tasks\":{},\"leasehold\":{},\"store\":{},\"plain_lock\":{},\"ratio\":{:.3},\"store_ratio\":{:.3}}}",
                r.tasks,
                m(&r.leasehold),
                m(&r.store),
                m(&r.plain),
                r.ratio,
                r.store_ratio
            );
        }
        out += &format!(
            "],\"contended\":{{\"waiters\":{WAITERS},\"acquisitions\":{},\"acquisitions_per_sec\":{:.0},\"handoff_p50_us\":{:.1},\"handoff_p99_us\":{:.1}}}}}",
            handoff.count,
            handoff.acquisitions_per_sec,
            us(handoff.p50),
            us(handoff.p99)
        );
        println!("{out}");
    } else {
        println!("leasehold-redis benchmark: redis {version} at {target}");
        println!(
            "uncontended acquire+release on distinct keys ({} pairs per level and kind, in {} interleaved slices)",
            args.ops, args.slices
        );
        println!(
            "{:>5} | {:>15} {:>8} {:>8} | {:>11} {:>8} {:>8} | {:>9} {:>8} {:>8} | {:>5} {:>5}",
            "tasks",
            "leasehold ops/s",
            "p50 µs",
            "p99 µs",
            "store ops/s",
            "p50 µs",
            "p99 µs",
            "plain ops/s",
            "p50 µs",
            "p99 µs",
            "ratio",
            "store"
        );
        for r in &results {
            println!(
                "{:>5} | {:>15.0} {:>8.1} {:>8.1} | {:>11.0} {:>8.1} {:>8.1} | {:>9.0} {:>8.1} {:>8.1} | {:>5.2} {:>5.2}",
                r.tasks,
                r.leasehold.ops_per_sec,
                us(r.leasehold.p50),
                us(r.leasehold.p99),
                r.store.ops_per_sec,
                us(r.store.p50),
                us(r.store.p99),
                r.plain.ops_per_sec,
                us(r.plain.p50),
                us(r.plain.p99),
                r.ratio,
                r.store_ratio
            );
        }
        println!(
            "(leasehold = LeaseClient::try_acquire + Lease::release; store = RedisStore::acquire + release; plain = a plain lock with the redis crate alone, SET NX PX + compare-and-delete; ops/s = median over slices; ratio = median over slices of leasehold / plain, store = of store / plain)"
        );
        println!(
            "contended hand-off: {WAITERS} tasks on one key, {} acquisitions: {:.0} acquisitions/s, hand-off p50 {:.1} µs, p99 {:.1} µs",
            handoff.count,
            handoff.acquisitions_per_sec,
            us(handoff.p50),
            us(handoff.p99)
        );
    }
    drop(server);
}
