//! Measures the figures of issue 14, item 3 ("PostgreSQL without polling") on a private
//! PostgreSQL with `fsync` on: a measuring aid for this crate's README, not a test (it
//! asserts nothing) and not the benchmark (`leasehold-pg-bench` in `leasehold-bench`).
//!
//! ```text
//! cargo run --release -p leasehold-postgres --example pg_contention [-- --seconds 5]
//!     [--fsync off] [--only contended|pairs]
//! ```
//!
//! * uncontended: acquire + release pairs per second, each task on a key of its own, at 1, 16
//!   and 64 tasks, on both stores, through `LeaseClient` (`try_acquire` + `release`) and
//!   through the `Store` alone; each figure is the median over 3 slices of the ratio to
//!   `pgbench -N` (simple-update) at 16 clients run just before it on the same server, so
//!   that the machine's other load weighs on both alike;
//! * `contended`: 16 tasks on one key, each `acquire(key, 30 s)`, hold 1 ms, release, on
//!   both stores and with sqlx's `PgAdvisoryLock` (the server's lock queue, no fence):
//!   utilisation (time held ÷ wall time), hand-off (a release returning → the next
//!   acquire returning) p50, wait (an `acquire` call) p50/p99, turns per task min–max.
#![allow(clippy::print_stdout, clippy::print_stderr)]

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use leasehold_core::{Backoff, LeaseClient, LeaseConfig, Store};
use leasehold_postgres::sqlx::postgres::{PgAdvisoryLock, PgPoolOptions};
use leasehold_postgres::{PgAdvisoryStore, PgConfig, PgLeaseStore};
use leasehold_testkit::{Postgres, PostgresOptions};

fn arg(name: &str) -> Option<String> {
    let args: Vec<String> = std::env::args().collect();
    args.iter()
        .position(|a| a == name)
        .and_then(|i| args.get(i + 1))
        .cloned()
}

fn pct(sorted: &[Duration], p: f64) -> f64 {
    if sorted.is_empty() {
        return f64::NAN;
    }
    let i = ((sorted.len() as f64 - 1.0) * p).round() as usize;
    sorted[i].as_secs_f64() * 1000.0
}

fn pgbench_command(pg: &Postgres) -> std::process::Command {
    let mut cmd = std::process::Command::new(pg.bin_dir().join("pgbench"));
    cmd.args([
        "-h",
        "127.0.0.1",
        "-p",
        &pg.port().to_string(),
        "-U",
        "postgres",
    ]);
    cmd
}

fn pgbench_init(pg: &Postgres) {
    let out = pgbench_command(pg)
        .args(["-i", "-s", "1", "-q", "postgres"])
        .output()
        .expect("pgbench -i");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// `pgbench -N` (simple-update) at 16 clients for `seconds`: transactions per second.
fn pgbench(pg: &Postgres, seconds: u64) -> f64 {
    let out = pgbench_command(pg)
        .args([
            "-N",
            "-n",
            "-c",
            "16",
            "-j",
            "2",
            "-T",
            &seconds.to_string(),
            "postgres",
        ])
        .output()
        .expect("pgbench");
    let text = String::from_utf8_lossy(&out.stdout);
    text.lines()
        .find_map(|l| {
            l.strip_prefix("tps = ")
                .and_then(|r| r.split_whitespace().next())
                .and_then(|v| v.parse().ok())
        })
        .unwrap_or_else(|| panic!("no tps in pgbench output: {text}"))
}

fn config() -> LeaseConfig {
    LeaseConfig::builder(Duration::from_secs(5))
        .backoff(Backoff::new(Duration::from_millis(1), Duration::from_millis(100)).unwrap())
        .build()
        .unwrap()
}

async fn pairs(store: Arc<dyn Store>, tasks: usize, dur: Duration) -> f64 {
    let client = LeaseClient::new(store, config());
    let stop = Arc::new(AtomicBool::new(false));
    let start = Instant::now();
    let handles: Vec<_> = (0..tasks)
        .map(|i| {
            let (client, stop) = (client.clone(), stop.clone());
            tokio::spawn(async move {
                let key = format!("pairs:{i}");
                let mut n = 0u64;
                while !stop.load(Ordering::Relaxed) {
                    let lease = client.try_acquire(key.as_str()).await.expect("acquire");
                    assert!(lease.release().await.expect("release"));
                    n += 1;
                }
                n
            })
        })
        .collect();
    tokio::time::sleep(dur).await;
    stop.store(true, Ordering::Relaxed);
    let mut total = 0;
    for h in handles {
        total += h.await.unwrap();
    }
    total as f64 / start.elapsed().as_secs_f64()
}

/// `Store::acquire` + `Store::release` called directly (no `LeaseClient`): the store's own
/// cost, apart from the holder side's.
async fn store_pairs(store: Arc<dyn Store>, tasks: usize, dur: Duration) -> f64 {
    let stop = Arc::new(AtomicBool::new(false));
    let start = Instant::now();
    let handles: Vec<_> = (0..tasks)
        .map(|i| {
            let (store, stop) = (store.clone(), stop.clone());
            tokio::spawn(async move {
                let key = leasehold_core::Key::new(format!("store-pairs:{i}")).unwrap();
                let mut n = 0u64;
                while !stop.load(Ordering::Relaxed) {
                    let owner = leasehold_core::OwnerToken::random();
                    let r = store.acquire(&key, &owner, Duration::from_secs(5)).await;
                    assert!(
                        matches!(r, Ok(leasehold_core::AcquireOutcome::Acquired { .. })),
                        "{r:?}"
                    );
                    store.release(&key, &owner).await.expect("release");
                    n += 1;
                }
                n
            })
        })
        .collect();
    tokio::time::sleep(dur).await;
    stop.store(true, Ordering::Relaxed);
    let mut total = 0;
    for h in handles {
        total += h.await.unwrap();
    }
    total as f64 / start.elapsed().as_secs_f64()
}

/// One grant: when its acquire was called, returned, and when its release returned.
struct Turn {
    called: Instant,
    acquired: Instant,
    released: Instant,
}

struct Contended {
    utilisation: f64,
    handoff_p50: f64,
    wait_p50: f64,
    wait_p99: f64,
    turns_min: usize,
    turns_max: usize,
    grants: usize,
}

fn summarise(per_task: Vec<Vec<Turn>>, start: Instant, end: Instant) -> Contended {
    let turns_min = per_task.iter().map(Vec::len).min().unwrap_or(0);
    let turns_max = per_task.iter().map(Vec::len).max().unwrap_or(0);
    let mut all: Vec<Turn> = per_task.into_iter().flatten().collect();
    all.sort_by_key(|t| t.acquired);
    let held: Duration = all
        .iter()
        .map(|t| t.released.min(end) - t.acquired.min(end))
        .sum();
    let mut handoffs: Vec<Duration> = all
        .windows(2)
        .map(|w| w[1].acquired.saturating_duration_since(w[0].released))
        .collect();
    handoffs.sort();
    let mut waits: Vec<Duration> = all.iter().map(|t| t.acquired - t.called).collect();
    waits.sort();
    Contended {
        utilisation: held.as_secs_f64() / (end - start).as_secs_f64(),
        handoff_p50: pct(&handoffs, 0.5),
        wait_p50: pct(&waits, 0.5),
        wait_p99: pct(&waits, 0.99),
        turns_min,
        turns_max,
        grants: all.len(),
    }
}

const HOLD: Duration = Duration::from_millis(1);
const CONTENDERS: usize = 16;

async fn contended_lease(store: Arc<dyn Store>, dur: Duration) -> Contended {
    let client = LeaseClient::new(store, config());
    let stop = Arc::new(AtomicBool::new(false));
    let start = Instant::now();
    let handles: Vec<_> = (0..CONTENDERS)
        .map(|_| {
            let (client, stop) = (client.clone(), stop.clone());
            tokio::spawn(async move {
                let mut turns = Vec::new();
                while !stop.load(Ordering::Relaxed) {
                    let called = Instant::now();
                    let lease = client
                        .acquire("contended:hot", Duration::from_secs(30))
                        .await
                        .expect("acquire");
                    let acquired = Instant::now();
                    tokio::time::sleep(HOLD).await;
                    assert!(lease.release().await.expect("release"));
                    turns.push(Turn {
                        called,
                        acquired,
                        released: Instant::now(),
                    });
                }
                turns
            })
        })
        .collect();
    tokio::time::sleep(dur).await;
    stop.store(true, Ordering::Relaxed);
    let end = Instant::now();
    let mut per_task = Vec::new();
    for h in handles {
        per_task.push(h.await.unwrap());
    }
    summarise(per_task, start, end)
}

async fn contended_sqlx(url: &str, dur: Duration) -> Contended {
    let pool = PgPoolOptions::new()
        .max_connections(CONTENDERS as u32)
        .connect(url)
        .await
        .unwrap();
    let stop = Arc::new(AtomicBool::new(false));
    let start = Instant::now();
    let handles: Vec<_> = (0..CONTENDERS)
        .map(|_| {
            let (pool, stop) = (pool.clone(), stop.clone());
            tokio::spawn(async move {
                let lock = PgAdvisoryLock::new("contended:hot");
                let mut turns = Vec::new();
                while !stop.load(Ordering::Relaxed) {
                    let called = Instant::now();
                    let conn = pool.acquire().await.unwrap();
                    let guard = lock.acquire(conn).await.unwrap();
                    let acquired = Instant::now();
                    tokio::time::sleep(HOLD).await;
                    drop(guard.release_now().await.unwrap());
                    turns.push(Turn {
                        called,
                        acquired,
                        released: Instant::now(),
                    });
                }
                turns
            })
        })
        .collect();
    tokio::time::sleep(dur).await;
    stop.store(true, Ordering::Relaxed);
    let end = Instant::now();
    let mut per_task = Vec::new();
    for h in handles {
        per_task.push(h.await.unwrap());
    }
    summarise(per_task, start, end)
}

fn print_contended(name: &str, c: &Contended) {
    println!(
        "contended {name:<9} utilisation {:.2}  hand-off p50 {:.2} ms  wait p50 {:.2} ms p99 {:.2} ms  turns/task {}–{}  grants {}",
        c.utilisation, c.handoff_p50, c.wait_p50, c.wait_p99, c.turns_min, c.turns_max, c.grants
    );
}

fn main() {
    let seconds = arg("--seconds").and_then(|s| s.parse().ok()).unwrap_or(5);
    let fsync = arg("--fsync").is_none_or(|v| v != "off");
    let only = arg("--only");
    let dur = Duration::from_secs(seconds);
    eprintln!(
        "starting a private PostgreSQL (fsync {})…",
        if fsync { "on" } else { "off" }
    );
    let pg = Postgres::start_with(
        PostgresOptions::new()
            .fsync(fsync)
            .setting("max_connections", "300"),
    );
    let uncontended = only.as_deref() != Some("contended");
    if uncontended {
        pgbench_init(&pg);
    }
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .unwrap();
    let pg = &pg;
    rt.block_on(async {
        let config = PgConfig::from_url(&pg.url()).unwrap().pool_size(16);
        let table = PgLeaseStore::connect(&config).await.unwrap();
        table.migrate().await.unwrap();
        let adv = PgAdvisoryStore::connect(&config).await.unwrap();
        adv.migrate().await.unwrap();
        // Each figure is the median over `SLICES` slices of (pairs/s ÷ the pgbench rate
        // measured just before it), so that the load of the machine hits both alike.
        const SLICES: usize = 3;
        if uncontended {
            println!(
                "uncontended: pairs/s (÷ pgbench -N at 16 clients in the slice before), median of {SLICES} slices of {seconds} s"
            );
        }
        for (name, store) in [
            ("table", Arc::new(table.clone()) as Arc<dyn Store>),
            ("advisory", Arc::new(adv.clone())),
        ]
        .into_iter()
        .filter(|_| uncontended)
        {
            for client in [true, false] {
                let mut line = format!(
                    "{:<9} {:<13}",
                    name,
                    if client { "LeaseClient" } else { "Store directly" }
                );
                for tasks in [1, 16, 64] {
                    let mut slices = Vec::new();
                    for _ in 0..SLICES {
                        let tps = tokio::task::block_in_place(|| pgbench(pg, seconds));
                        let r = if client {
                            pairs(store.clone(), tasks, dur).await
                        } else {
                            store_pairs(store.clone(), tasks, dur).await
                        };
                        slices.push((r / tps, r, tps));
                    }
                    slices.sort_by(|a, b| a.0.total_cmp(&b.0));
                    let (ratio, r, tps) = slices[SLICES / 2];
                    line += &format!("  {tasks:>2} tasks {r:>5.0} ({ratio:.2}× of {tps:.0})");
                }
                println!("{line}");
            }
        }
        if only.as_deref() == Some("pairs") {
            return;
        }
        print_contended("table", &contended_lease(Arc::new(table), dur).await);
        print_contended("advisory", &contended_lease(Arc::new(adv), dur).await);
        print_contended("sqlx-lock", &contended_sqlx(&pg.url(), dur).await);
    });
}
