//! docs/faults.md row 14 on the server stores, for real: a lease-holding client process whose wall
//! clock jumps (an hour forward, an hour back, a month forward) keeps its lease exactly as
//! if nothing happened — no loss, no early expiry, and a normal client is kept out the
//! whole time. The server (Redis, PostgreSQL) is not touched: its clock decides expiry,
//! and the client's deadlines run on `CLOCK_BOOTTIME`.
//!
//! The client is this test binary run again under libfaketime (package `faketime`,
//! [`FakeWallClock`]), with only `CLOCK_REALTIME` faked; the test that starts it, at its
//! top, runs the worker instead of its body when `LEASEHOLD_WALL_WORKER` is set. The
//! worker prints its wall clock, so the test checks that the jumps did reach it.
//! The servers run on the real clock: a server's own clock offset is another fault
//! (the Sentinel replica clock tests in `leasehold-redis/tests/sentinel.rs`).

mod common;

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use leasehold_core::{AcquireOutcome, Key, LeaseClient, LeaseConfig, OwnerToken, Registry};
use leasehold_postgres::PgFactory;
use leasehold_testkit::{FakeWallClock, PostgresOptions, RedisServer, WorkerProcess};
use tokio::time::{Instant, sleep};

const WORKER_ENV: &str = "LEASEHOLD_WALL_WORKER";
const TTL: Duration = Duration::from_secs(2);
const KEY: &str = "job:wall-clock";
const LONG: Duration = Duration::from_secs(60);

fn registry() -> Registry {
    let mut r = Registry::new();
    r.register(Arc::new(PgFactory));
    r.register(Arc::new(leasehold_redis::RedisFactory));
    r
}

#[allow(clippy::disallowed_methods)] // shows that the fake wall clock reached the worker
fn wall_secs() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .expect("after 1970")
        .as_secs() as i64
}

/// In a child process: holds the lease on the store at `$LEASEHOLD_WALL_WORKER` (a URL),
/// printing `@tick <wall s> <valid> <lost>` every 100 ms, until the file
/// `$LEASEHOLD_WALL_STOP` exists; then `@end <valid> <lost reason|none>` and
/// `@released <held>`. Returns `true` there; `false` in the test process.
async fn run_worker_if_child() -> bool {
    let Ok(url) = std::env::var(WORKER_ENV) else {
        return false;
    };
    let stop = PathBuf::from(std::env::var("LEASEHOLD_WALL_STOP").expect("stop file"));
    let store = registry().open(&url).await.expect("open the store");
    let client = LeaseClient::new(store, LeaseConfig::new(TTL).unwrap());
    let lease = client.try_acquire(KEY).await.expect("acquire");
    println!("@acquired {} {}", lease.fence().get(), lease.owner());
    while !stop.exists() {
        println!(
            "@tick {} {} {}",
            wall_secs(),
            lease.is_valid(),
            lease.lost().is_lost()
        );
        sleep(Duration::from_millis(100)).await;
    }
    println!(
        "@end {} {}",
        lease.is_valid(),
        lease.lost_reason().map_or("none", |r| r.as_str())
    );
    let held = lease.release().await.expect("release");
    println!("@released {held}");
    true
}

fn spawn_worker(test: &str, url: &str, stop: &Path, clock: &FakeWallClock) -> WorkerProcess {
    let mut cmd = WorkerProcess::test_command(test);
    cmd.env(WORKER_ENV, url).env("LEASEHOLD_WALL_STOP", stop);
    clock.apply(&mut cmd);
    WorkerProcess::spawn(cmd)
}

fn field<T: std::str::FromStr>(line: &str, i: usize) -> T {
    line.split_whitespace()
        .nth(i)
        .and_then(|w| w.parse().ok())
        .unwrap_or_else(|| panic!("field {i} of `{line}`"))
}

fn ticks(w: &WorkerProcess) -> Vec<(i64, bool, bool)> {
    w.lines()
        .iter()
        .filter(|l| l.starts_with("@tick "))
        .map(|l| (field(l, 1), field(l, 2), field(l, 3)))
        .collect()
}

/// Holds a lease in a worker whose wall clock jumps, on the store at `url`, while this
/// process (normal clock) keeps trying to take it.
async fn holder_ignores_its_wall_clock(test: &str, url: &str) {
    let files = tempfile::tempdir().unwrap();
    let stop = files.path().join("stop");
    let clock = FakeWallClock::new();
    let worker = spawn_worker(test, url, &stop, &clock);
    let acquired =
        tokio::task::block_in_place(|| worker.wait_for_line(|l| l.starts_with("@acquired "), LONG))
            .unwrap_or_else(|| panic!("the worker did not acquire: {:?}", worker.lines()));
    let fence: u64 = field(&acquired, 1);
    let holder: OwnerToken = field(&acquired, 2);

    let store = registry().open(url).await.unwrap();
    let key = Key::new(KEY).unwrap();
    let other = OwnerToken::random();
    let mut refused = 0;
    for (offset, secs) in [
        ("+1h", 3600),
        ("-1h", -3600),
        ("+30d", 30 * 86_400),
        ("+0", 0),
    ] {
        clock.set(offset);
        // Wait until the worker's wall clock shows the jump.
        let seen = Instant::now();
        loop {
            let now = wall_secs();
            let last = ticks(&worker).last().map(|t| t.0);
            if last.is_some_and(|w| (w - now - secs).abs() < 60) {
                break;
            }
            assert!(
                seen.elapsed() < LONG,
                "the worker's wall clock never moved to {offset}: last tick {last:?}, now {now}"
            );
            sleep(Duration::from_millis(50)).await;
        }
        // Two TTLs after the jump (several renewals): still held by the worker, same fence.
        let until = Instant::now() + TTL * 2;
        while Instant::now() < until {
            match store.acquire(&key, &other, TTL).await.unwrap() {
                AcquireOutcome::Held { .. } => refused += 1,
                got => panic!("a normal client got the lease after a jump to {offset}: {got:?}"),
            }
            let info = store.inspect(&key).await.unwrap().expect("held");
            assert_eq!((info.owner, info.fence.get()), (holder, fence), "{offset}");
            sleep(Duration::from_millis(200)).await;
        }
    }
    assert!(refused > 20, "the normal client asked {refused} times");

    std::fs::write(&stop, b"").unwrap();
    let (end, released) = tokio::task::block_in_place(|| {
        let end = worker.wait_for_line(|l| l.starts_with("@end "), LONG);
        let released = worker.wait_for_line(|l| l.starts_with("@released "), LONG);
        assert!(worker.wait_timeout(LONG).expect("exits").success());
        (end, released)
    });
    let t = ticks(&worker);
    assert!(
        t.iter().all(|&(_, valid, lost)| valid && !lost),
        "the lease was lost or invalid at a tick: {:?}",
        t.iter().find(|t| !t.1 || t.2)
    );
    assert_eq!(end.as_deref(), Some("@end true none"));
    assert_eq!(released.as_deref(), Some("@released true"));
    // Free at once after the release, with a higher fence.
    match store.acquire(&key, &other, TTL).await.unwrap() {
        AcquireOutcome::Acquired { fence: f, .. } => assert!(f.get() > fence),
        held => panic!("not released: {held:?}"),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_holder_ignores_a_jumping_wall_clock() {
    if run_worker_if_child().await {
        return;
    }
    let redis = tokio::task::spawn_blocking(RedisServer::start)
        .await
        .unwrap();
    holder_ignores_its_wall_clock("redis_holder_ignores_a_jumping_wall_clock", &redis.url()).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_table_holder_ignores_a_jumping_wall_clock() {
    if run_worker_if_child().await {
        return;
    }
    let pg = common::start_pg(PostgresOptions::new()).await;
    let url = format!("{}?leasehold_migrate=true", pg.url());
    holder_ignores_its_wall_clock("postgres_table_holder_ignores_a_jumping_wall_clock", &url).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_advisory_holder_ignores_a_jumping_wall_clock() {
    if run_worker_if_child().await {
        return;
    }
    let pg = common::start_pg(PostgresOptions::new()).await;
    let url = format!(
        "{}?leasehold_migrate=true",
        pg.url().replacen("postgres://", "postgres+advisory://", 1)
    );
    holder_ignores_its_wall_clock(
        "postgres_advisory_holder_ignores_a_jumping_wall_clock",
        &url,
    )
    .await;
}
