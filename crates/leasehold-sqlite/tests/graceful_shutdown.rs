//! Issue 10.12 / docs/faults.md row 27: the example worker (`examples/graceful_worker.rs`)
//! receives SIGTERM in the middle of a guarded transaction. Its transaction rolls back,
//! nothing is half written, and its lease is released as soon as its work has stopped:
//! the next holder gets it at once, not after the 10 s TTL.

use std::io::{BufRead, BufReader};
use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use leasehold_core::{Key, Store};
use leasehold_sqlite::SqliteStore;
use nix::sys::signal::{Signal, kill};
use nix::unistd::Pid;

/// The example binary, built beside this test by `cargo test` / `cargo nextest` (which
/// build a package's examples with its tests).
fn example() -> PathBuf {
    let exe = std::env::current_exe().unwrap();
    let dir = exe.parent().and_then(|d| d.parent()).unwrap();
    let path = dir.join("examples").join("graceful_worker");
    assert!(
        path.exists(),
        "{} not built: run the tests with cargo test or cargo nextest, which build examples",
        path.display()
    );
    path
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigterm_mid_transaction_rolls_back_and_releases_at_once() {
    let dir = tempfile::tempdir().unwrap();
    let leases = dir.path().join("leases.db");
    let data = dir.path().join("data.db");
    let mut child = Command::new(example())
        .args([&leases, &data])
        .arg("job:batches")
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let pid = Pid::from_raw(child.id() as i32);
    let (tx, rx) = mpsc::channel();
    let stdout = child.stdout.take().unwrap();
    std::thread::spawn(move || {
        for line in BufReader::new(stdout).lines().map_while(Result::ok) {
            let _ = tx.send(line);
        }
    });
    let next = |what: &str| -> String {
        loop {
            let line = rx
                .recv_timeout(Duration::from_secs(30))
                .unwrap_or_else(|_| panic!("no `{what}` line from the worker"));
            if line.starts_with(what) {
                return line;
            }
        }
    };
    next("acquired");
    next("committed 1");
    // Batch 2's transaction is open (part 1 written, part 2 not yet): SIGTERM now.
    next("in-transaction 2");
    kill(pid, Signal::SIGTERM).unwrap();
    let sent = Instant::now();
    assert_eq!(next("rolled-back"), "rolled-back");
    assert_eq!(next("released"), "released true");
    assert_eq!(next("shutdown"), "shutdown held=1 still_held=0");
    let status = child.wait().unwrap();
    assert!(status.success(), "{status}");
    assert!(sent.elapsed() < Duration::from_secs(5));

    // The lease is gone from the store: the next holder gets it at once.
    let store = SqliteStore::open(&format!("sqlite://{}", leases.display()))
        .await
        .unwrap();
    let key = Key::new("job:batches").unwrap();
    assert_eq!(store.inspect(&key).await.unwrap(), None);
    // Nothing half written: batch 1 whole, batch 2 not at all.
    let pool = sqlx::SqlitePool::connect(&format!("sqlite://{}", data.display()))
        .await
        .unwrap();
    let rows: Vec<(i64, i64)> = sqlx::query_as("SELECT batch, part FROM batches ORDER BY 1, 2")
        .fetch_all(&pool)
        .await
        .unwrap();
    assert_eq!(rows, vec![(1, 1), (1, 2)]);
}
