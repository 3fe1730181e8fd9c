//! The seeds' story end to end, with real worker processes (docs/faults.md row 1, with the guard):
//! worker A acquires, is frozen with SIGSTOP past its TTL; B acquires and writes through
//! the guard; A resumes and writes: rejected and reported as ownership lost; the data
//! holds only B's write, and B's lease is intact. Twice: lease and guard in PostgreSQL,
//! and lease in Redis with the guard in PostgreSQL.
//!
//! The workers are this test binary run again, each its own OS process: the story test
//! that starts them runs itself with `LEASEHOLD_WORKER` set, and at its top runs the
//! worker instead of its body (`run_worker_if_child`). No test exists only to be a worker.

mod common;

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use leasehold_core::{Key, LeaseClient, LeaseConfig, Registry};
use leasehold_postgres::sqlx::{self, PgPool};
use leasehold_postgres::{PgFactory, guard};
use leasehold_testkit::proof::{Backend, Fault, proves};
use leasehold_testkit::{PostgresOptions, RedisServer, WorkerProcess};

const TTL: Duration = Duration::from_secs(2);
const KEY: &str = "job:nightly-invoices";
const RESOURCE: &str = "ledger:invoices";
const LINE_WAIT: Duration = Duration::from_secs(60);

fn registry() -> Registry {
    let mut r = Registry::new();
    r.register(Arc::new(PgFactory));
    r.register(Arc::new(leasehold_redis::RedisFactory));
    r
}

fn env(name: &str) -> String {
    std::env::var(name).unwrap_or_else(|_| panic!("worker needs {name}"))
}

async fn wait_for_file(path: &Path) {
    while !path.exists() {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// The worker: acquire, (wait for the go file), write through the guard, (wait for the
/// done file), release. Each step prints one line for the parent.
async fn worker(name: String) {
    let store = registry()
        .open(&env("LEASEHOLD_STORE_URL"))
        .await
        .expect("open store");
    let pool = PgPool::connect(&env("LEASEHOLD_GUARD_URL"))
        .await
        .expect("guard db");
    let client = LeaseClient::new(store, LeaseConfig::new(TTL).unwrap());
    let lease = client
        .acquire(KEY, Duration::from_secs(30))
        .await
        .expect("acquire");
    println!("ACQUIRED fence={}", lease.fence());
    if let Ok(go) = std::env::var("LEASEHOLD_GO_FILE") {
        wait_for_file(Path::new(&go)).await;
        // After a freeze, the lost signal fires as soon as the process runs again.
        let lost = tokio::time::timeout(Duration::from_secs(1), lease.lost())
            .await
            .ok();
        println!(
            "RESUMED valid={} lost={}",
            lease.is_valid(),
            lost.map_or("none".to_owned(), |r| r.as_str().to_owned())
        );
    }
    // Write through the guard, carelessly: even a worker whose lease is lost (or one that
    // was mid-write when it froze) attempts the write. The guard must stop it.
    let mut tx = pool.begin().await.expect("begin");
    let decision = guard::check_and_advance(&mut tx, &RESOURCE.parse().unwrap(), lease.fence())
        .await
        .expect("guard check");
    match decision.into_result(&RESOURCE.parse().unwrap(), lease.fence()) {
        Ok(()) => {
            sqlx::query("INSERT INTO story_data (writer, fence) VALUES ($1, $2)")
                .bind(&name)
                .bind(lease.fence().get() as i64)
                .execute(&mut *tx)
                .await
                .expect("insert");
            tx.commit().await.expect("commit");
            println!("WROTE fence={}", lease.fence());
        }
        Err(e) => {
            tx.rollback().await.expect("rollback");
            let leasehold_core::Error::FenceRejected { current, .. } = &e else {
                panic!("unexpected {e}")
            };
            println!("REJECTED current={current} action={:?}", e.action());
        }
    }
    if let Ok(done) = std::env::var("LEASEHOLD_DONE_FILE") {
        wait_for_file(Path::new(&done)).await;
    }
    let held = lease.release().await.unwrap_or(false);
    println!("RELEASED held={held}");
}

/// In a worker process (`LEASEHOLD_WORKER` set): runs the worker and returns `true`, so
/// that the test returns at once. In the test process: `false`.
async fn run_worker_if_child() -> bool {
    let Ok(name) = std::env::var("LEASEHOLD_WORKER") else {
        return false;
    };
    worker(name).await;
    true
}

/// Starts this test binary again running only the test `test` (the caller, which begins
/// with `run_worker_if_child`), as worker `name`.
fn spawn_worker(
    test: &str,
    name: &str,
    store_url: &str,
    guard_url: &str,
    extra: &[(&str, &Path)],
) -> WorkerProcess {
    let mut cmd = WorkerProcess::test_command(test);
    cmd.env("LEASEHOLD_WORKER", name)
        .env("LEASEHOLD_STORE_URL", store_url)
        .env("LEASEHOLD_GUARD_URL", guard_url);
    for (k, v) in extra {
        cmd.env(k, v);
    }
    WorkerProcess::spawn(cmd)
}

fn wait_line(w: &WorkerProcess, prefix: &str) -> String {
    w.wait_for_line(
        |l| l.split_whitespace().any(|word| word == prefix),
        LINE_WAIT,
    )
    .unwrap_or_else(|| panic!("worker never printed {prefix}…; lines: {:?}", w.lines()))
}

fn field(line: &str, name: &str) -> String {
    line.split_whitespace()
        .find_map(|kv| kv.strip_prefix(&format!("{name}=")))
        .unwrap_or_else(|| panic!("no {name}= in {line:?}"))
        .to_owned()
}

async fn blocking<T: Send + 'static>(f: impl FnOnce() -> T + Send + 'static) -> T {
    tokio::task::spawn_blocking(f).await.unwrap()
}

async fn story(test: &str, store_url: String, pg_url: String, files: PathBuf) {
    let admin = PgPool::connect(&pg_url).await.unwrap();
    guard::migrate(&admin).await.unwrap();
    sqlx::raw_sql(
        "CREATE TABLE story_data (id bigserial PRIMARY KEY, writer text NOT NULL, fence bigint NOT NULL)",
    )
    .execute(&admin)
    .await
    .unwrap();
    // Opening with leasehold_migrate=true (PostgreSQL) creates the lease table.
    let store = registry().open(&store_url).await.unwrap();

    let go = files.join("go");
    let done = files.join("done");
    let a = spawn_worker(
        test,
        "A",
        &store_url,
        &pg_url,
        &[("LEASEHOLD_GO_FILE", &go)],
    );
    let (a, fa) = blocking(move || {
        let l = wait_line(&a, "ACQUIRED");
        (a, field(&l, "fence").parse::<u64>().unwrap())
    })
    .await;
    // A freezes (a GC pause, a VM suspension) for 1.5 × TTL.
    a.pause();
    tokio::time::sleep(TTL * 3 / 2).await;

    let b = spawn_worker(
        test,
        "B",
        &store_url,
        &pg_url,
        &[("LEASEHOLD_DONE_FILE", &done)],
    );
    let (b, fb) = blocking(move || {
        let acquired = wait_line(&b, "ACQUIRED");
        let wrote = wait_line(&b, "WROTE");
        assert_eq!(field(&acquired, "fence"), field(&wrote, "fence"));
        (b, field(&wrote, "fence").parse::<u64>().unwrap())
    })
    .await;
    assert!(fb > fa, "B's fence {fb} must be above A's {fa}");

    // A wakes up and writes anyway.
    std::fs::write(&go, b"").unwrap();
    a.resume();
    let a = blocking(move || {
        let resumed = wait_line(&a, "RESUMED");
        assert_eq!(field(&resumed, "valid"), "false", "{resumed}");
        assert_ne!(
            field(&resumed, "lost"),
            "none",
            "lost signal fires on resume: {resumed}"
        );
        let rejected = wait_line(&a, "REJECTED");
        assert_eq!(field(&rejected, "current"), fb.to_string(), "{rejected}");
        assert_eq!(field(&rejected, "action"), "OwnershipLost", "{rejected}");
        let released = wait_line(&a, "RELEASED");
        assert_eq!(
            field(&released, "held"),
            "false",
            "A's late release reports lost"
        );
        a
    })
    .await;

    // B's lease is intact, and the data holds only B's write.
    let info = store
        .inspect(&Key::new(KEY).unwrap())
        .await
        .unwrap()
        .expect("B still holds the lease");
    assert_eq!(info.fence.get(), fb);
    let rows: Vec<(String, i64)> =
        sqlx::query_as("SELECT writer, fence FROM story_data ORDER BY id")
            .fetch_all(&admin)
            .await
            .unwrap();
    assert_eq!(rows, vec![("B".to_owned(), fb as i64)]);
    let current = guard::PgGuard::new()
        .current(
            &mut admin.acquire().await.unwrap(),
            &RESOURCE.parse().unwrap(),
        )
        .await
        .unwrap();
    assert_eq!(current.map(|f| f.get()), Some(fb));

    std::fs::write(&done, b"").unwrap();
    blocking(move || {
        let released = wait_line(&b, "RELEASED");
        assert_eq!(field(&released, "held"), "true");
        assert!(a.wait_timeout(LINE_WAIT).is_some_and(|s| s.success()));
        assert!(b.wait_timeout(LINE_WAIT).is_some_and(|s| s.success()));
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn story_lease_and_guard_in_postgres() {
    if run_worker_if_child().await {
        return;
    }
    let _proof = proves(Backend::Postgres, Fault::ProcessPause);
    let pg = common::start_pg(PostgresOptions::new()).await;
    let files = tempfile::tempdir().unwrap();
    let store_url = format!("{}?leasehold_migrate=true", pg.url());
    story(
        "story_lease_and_guard_in_postgres",
        store_url,
        pg.url(),
        files.path().to_owned(),
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn story_lease_in_redis_guard_in_postgres() {
    if run_worker_if_child().await {
        return;
    }
    let _proof = proves(Backend::Redis, Fault::ProcessPause);
    let pg = common::start_pg(PostgresOptions::new()).await;
    let redis = blocking(RedisServer::start).await;
    let files = tempfile::tempdir().unwrap();
    story(
        "story_lease_in_redis_guard_in_postgres",
        redis.url(),
        pg.url(),
        files.path().to_owned(),
    )
    .await;
}
