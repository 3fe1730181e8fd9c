//! Several OS processes on one SQLite file.
//!
//! The child processes are this test binary run again with the spawning test selected and
//! `LEASEHOLD_SQLITE_WORKER` set: that test, at its top, runs the worker named by the
//! variable instead of its own body (see `worker` and `run_worker_if_child`). No test
//! exists only to be a worker.
//!
//! - `processes_contend_exclusive_and_fences_increase`: four processes contend for one key
//!   and write through the guard; their hold windows (stamped with `CLOCK_MONOTONIC`,
//!   shared by every process of the host) never overlap and fences grow in time order.
//! - `holder_paused_past_ttl_is_fenced_off` (docs/faults.md row 1 on SQLite): a holder process frozen
//!   with `SIGSTOP` past its TTL loses the lease to the test, and when it runs again its
//!   lost signal fires and the guard rejects its write.
//! - `holder_killed_is_taken_over_within_ttl` (docs/faults.md row 3).
//! - `writer_paused_mid_transaction_gives_bounded_busy` and
//!   `writer_killed_mid_transaction_leaves_no_half_written_row` (docs/faults.md row 20).
//! - `a_wall_clock_jump_in_another_process_changes_nothing` (docs/faults.md row 14): processes whose
//!   wall clock is an hour ahead / behind (libfaketime) neither take a held lease nor wait
//!   an hour for an abandoned one.
//! - `a_holder_and_a_waiter_in_two_processes_agree_on_the_clock`: the remaining time one
//!   process sees is the one another process's clock set, to the microsecond.
//! - `a_release_in_another_process_is_seen_within_the_poll_interval`: a waiter whose holder
//!   is another process (which cannot ring this process's release bell) sees its release
//!   within the cross-process poll interval, not at the holder's expiry.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::Arc;
use std::time::Duration;

use leasehold_core::WaitStore;
use leasehold_core::{
    AcquireOutcome, Backoff, Error, GuardDecision, Key, LeaseClient, LeaseConfig, OwnerToken,
    Store, StoreErrorKind,
};
use leasehold_sqlite::{SqliteConfig, SqliteStore, guard};
use leasehold_testkit::WorkerProcess;
use leasehold_testkit::proof::{Backend, Fault, proves};
use sqlx::sqlite::SqliteConnectOptions;
use sqlx::{ConnectOptions, Connection};
use tokio::time::{Instant, sleep, timeout};

const WORKER_ENV: &str = "LEASEHOLD_SQLITE_WORKER";
const LONG: Duration = Duration::from_secs(60);
const TTL: Duration = Duration::from_secs(2);

/// `CLOCK_BOOTTIME` in µs: the clock every process of the host shares (unless it runs in
/// a time namespace of its own).
fn boottime_us() -> u64 {
    let t = nix::time::clock_gettime(nix::time::ClockId::CLOCK_BOOTTIME).expect("clock");
    t.tv_sec() as u64 * 1_000_000 + t.tv_nsec() as u64 / 1_000
}

/// This process's wall clock, in seconds since the Unix epoch.
#[allow(clippy::disallowed_methods)] // to check that libfaketime moved a worker's wall clock
fn wall_secs() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .expect("after 1970")
        .as_secs()
}

fn mono_ns() -> u128 {
    let t = nix::time::clock_gettime(nix::time::ClockId::CLOCK_MONOTONIC).expect("clock");
    t.tv_sec() as u128 * 1_000_000_000 + t.tv_nsec() as u128
}

/// Starts this test binary again, running only the test `test` (the caller), as the worker
/// `mode`: `test` must begin with `if run_worker_if_child().await { return; }`.
fn worker(test: &str, mode: &str, args: &[&str]) -> WorkerProcess {
    WorkerProcess::spawn(worker_command(test, mode, args))
}

fn worker_command(test: &str, mode: &str, args: &[&str]) -> Command {
    let mut cmd = WorkerProcess::test_command(test);
    cmd.env(WORKER_ENV, mode)
        .env("LEASEHOLD_SQLITE_ARGS", args.join("\u{1f}"));
    cmd
}

fn out(line: impl std::fmt::Display) {
    println!("@{line}");
}

fn field<T: std::str::FromStr>(line: &str, i: usize) -> T {
    line.split_whitespace()
        .nth(i)
        .and_then(|w| w.parse().ok())
        .unwrap_or_else(|| panic!("field {i} of `{line}`"))
}

async fn open(path: &Path) -> SqliteStore {
    SqliteStore::connect(SqliteConfig::new(path).busy_timeout(Duration::from_secs(1)))
        .await
        .expect("open the store")
}

const DATA_SCHEMA: &str = "CREATE TABLE IF NOT EXISTS mp_writes (
    seq INTEGER PRIMARY KEY AUTOINCREMENT, fence INTEGER NOT NULL, pid INTEGER NOT NULL)";

/// In a child process started by [`worker`]: runs the worker named by `WORKER_ENV` (on the
/// caller's runtime) and returns `true`, so that the test returns at once. In the test
/// process itself: `false`.
async fn run_worker_if_child() -> bool {
    let Ok(mode) = std::env::var(WORKER_ENV) else {
        return false;
    };
    let args: Vec<String> = std::env::var("LEASEHOLD_SQLITE_ARGS")
        .unwrap_or_default()
        .split('\u{1f}')
        .map(str::to_owned)
        .collect();
    match mode.as_str() {
        "contend" => contend(&args).await,
        "hold" => hold(&args).await,
        "hold-tx" => hold_tx(&args).await,
        "probe" => probe(&args).await,
        "grant" => grant(&args).await,
        "hold-until" => hold_until(&args).await,
        other => panic!("unknown worker mode {other}"),
    }
    true
}

fn client_config() -> LeaseConfig {
    LeaseConfig::builder(TTL)
        .backoff(Backoff::new(Duration::from_millis(5), Duration::from_millis(100)).unwrap())
        .build()
        .unwrap()
}

/// Contends `rounds` times for `mp:shared`; in each hold, one guarded write to `mp_writes`.
async fn contend(args: &[String]) {
    let path = PathBuf::from(&args[0]);
    let rounds: usize = args[1].parse().unwrap();
    let store = Arc::new(open(&path).await);
    let client = LeaseClient::new(store.clone(), client_config());
    let key = Key::new("mp:shared").unwrap();
    let pid = std::process::id();
    for _ in 0..rounds {
        let lease = client.acquire(&key, LONG).await.expect("acquire");
        let t1 = mono_ns();
        let fence = lease.fence();
        let mut conn = store.pool().acquire().await.unwrap();
        let mut tx = conn.begin_with("BEGIN IMMEDIATE").await.unwrap();
        let decision = guard::check_and_advance(&mut tx, &"mp:data".parse().unwrap(), fence)
            .await
            .unwrap();
        assert!(decision.is_accepted(), "{decision:?}");
        sqlx::query("INSERT INTO mp_writes (fence, pid) VALUES (?1, ?2)")
            .bind(fence.get() as i64)
            .bind(pid as i64)
            .execute(&mut *tx)
            .await
            .unwrap();
        tx.commit().await.unwrap();
        drop(conn);
        sleep(Duration::from_millis(15)).await;
        let valid = lease.is_valid();
        let t2 = mono_ns();
        out(format_args!(
            "grant {} {t1} {t2} {valid} {pid}",
            fence.get()
        ));
        assert!(lease.release().await.expect("release"), "still held");
    }
    out("done");
}

/// Holds `fa:held` until its lost signal fires, then tries a guarded write with its fence.
async fn hold(args: &[String]) {
    let path = PathBuf::from(&args[0]);
    let store = Arc::new(open(&path).await);
    let client = LeaseClient::new(store.clone(), client_config());
    let lease = client.try_acquire("fa:held").await.expect("acquire");
    out(format_args!("held {}", lease.fence().get()));
    let reason = lease.lost().await;
    out(format_args!("lost {}", reason.as_str()));
    let mut conn = store.pool().acquire().await.unwrap();
    let mut tx = conn.begin_with("BEGIN IMMEDIATE").await.unwrap();
    match guard::check_and_advance(&mut tx, &"fa:data".parse().unwrap(), lease.fence())
        .await
        .unwrap()
    {
        GuardDecision::Accepted { .. } => {
            tx.commit().await.unwrap();
            out("write accepted");
        }
        GuardDecision::Rejected { current } => {
            tx.rollback().await.unwrap();
            out(format_args!("write rejected {}", current.get()));
        }
    }
    let held = lease.release().await.expect("release");
    out(format_args!("release {held}"));
}

/// Prints its wall clock (`@wall <s>`); asks once for the key `args[1]` (`@first held` or
/// `@first acquired`, and then releases it); waits for it up to `args[2]` ms through the
/// lease client: `@acquired <fence> <CLOCK_BOOTTIME µs after the reply>` or `@timeout`.
async fn probe(args: &[String]) {
    out(format_args!("wall {}", wall_secs()));
    let store = Arc::new(open(Path::new(&args[0])).await);
    let key = Key::new(&args[1]).unwrap();
    let wait = Duration::from_millis(args[2].parse().unwrap());
    let owner = OwnerToken::random();
    match store.acquire(&key, &owner, TTL).await.expect("acquire") {
        AcquireOutcome::Held { .. } => out("first held"),
        AcquireOutcome::Acquired { .. } => {
            out("first acquired");
            store.release(&key, &owner).await.expect("release");
            return;
        }
    }
    let client = LeaseClient::new(store.clone(), client_config());
    match client.acquire(&key, wait).await {
        Ok(lease) => {
            let at = boottime_us();
            out(format_args!("acquired {} {at}", lease.fence().get()));
            lease.release().await.expect("release");
        }
        Err(Error::WaitTimeout { .. }) => out("timeout"),
        Err(e) => panic!("acquire: {e}"),
    }
}

/// Acquires the key `args[1]` once for `args[2]` ms and never renews nor releases it:
/// `@granted <fence> <CLOCK_BOOTTIME µs before sending> <… after the reply>`.
async fn grant(args: &[String]) {
    let store = open(Path::new(&args[0])).await;
    let key = Key::new(&args[1]).unwrap();
    let ttl = Duration::from_millis(args[2].parse().unwrap());
    let sent = boottime_us();
    let outcome = store.acquire(&key, &OwnerToken::random(), ttl).await;
    let replied = boottime_us();
    let AcquireOutcome::Acquired { fence, .. } = outcome.expect("acquire") else {
        panic!("the key is held")
    };
    out(format_args!("granted {} {sent} {replied}", fence.get()));
    sleep(LONG).await;
}

/// Acquires the key `args[1]` for a minute (`@held`), releases it once the file `args[2]`
/// exists (`@released`), then sleeps.
async fn hold_until(args: &[String]) {
    let store = open(Path::new(&args[0])).await;
    let key = Key::new(&args[1]).unwrap();
    let owner = OwnerToken::random();
    let AcquireOutcome::Acquired { .. } = store.acquire(&key, &owner, LONG).await.unwrap() else {
        panic!("the key is held")
    };
    out("held");
    while !Path::new(&args[2]).exists() {
        sleep(Duration::from_millis(5)).await;
    }
    assert!(matches!(
        store.release(&key, &owner).await.unwrap(),
        leasehold_core::ReleaseOutcome::Released
    ));
    out("released");
    sleep(LONG).await;
}

/// Opens a write transaction, writes a lease row and enough filler to spill pages into the
/// WAL, then waits (without committing) until the file `args[1]` exists, and rolls back.
async fn hold_tx(args: &[String]) {
    let path = PathBuf::from(&args[0]);
    let go = PathBuf::from(&args[1]);
    let mut conn = SqliteConnectOptions::new()
        .filename(&path)
        .busy_timeout(Duration::from_secs(10))
        .connect()
        .await
        .expect("connect");
    let mut tx = conn.begin_with("BEGIN IMMEDIATE").await.unwrap();
    sqlx::query(
        "INSERT INTO leasehold_leases (lease_key, owner, fence, boot_id, expires_boot_us) \
         VALUES ('f20:half-written', ?1, 999, 'x', 9000000000000000)",
    )
    .bind(OwnerToken::random().to_hex())
    .execute(&mut *tx)
    .await
    .unwrap();
    sqlx::raw_sql("CREATE TABLE filler (b BLOB)")
        .execute(&mut *tx)
        .await
        .unwrap();
    // 6 MB, above SQLite's default 2 MB page cache: pages spill into the WAL uncommitted.
    for _ in 0..6 {
        sqlx::query(
            "WITH RECURSIVE n(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM n WHERE i < 1000) \
             INSERT INTO filler SELECT randomblob(1024) FROM n",
        )
        .execute(&mut *tx)
        .await
        .unwrap();
    }
    out("in-tx");
    while !go.exists() {
        sleep(Duration::from_millis(20)).await;
    }
    tx.rollback().await.unwrap();
    out("rolled-back");
}

/// Runs blocking test-kit calls (waiting for a worker's line) without stalling the runtime.
fn blocking<T>(f: impl FnOnce() -> T) -> T {
    tokio::task::block_in_place(f)
}

fn wait_line(w: &WorkerProcess, prefix: &str) -> String {
    let prefixed = format!("@{prefix}");
    w.wait_for_line(|l| l.starts_with(&prefixed), LONG)
        .unwrap_or_else(|| panic!("no `{prefix}` line from the worker: {:?}", w.lines()))
        .trim_start_matches('@')
        .to_owned()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn processes_contend_exclusive_and_fences_increase() {
    if run_worker_if_child().await {
        return;
    }
    const PROCS: usize = 4;
    const ROUNDS: usize = 8;
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("mp.db");
    let store = open(&path).await;
    sqlx::raw_sql(DATA_SCHEMA)
        .execute(store.pool())
        .await
        .unwrap();
    let path_s = path.to_str().unwrap().to_owned();
    let rounds = ROUNDS.to_string();
    let workers: Vec<_> = (0..PROCS)
        .map(|_| {
            worker(
                "processes_contend_exclusive_and_fences_increase",
                "contend",
                &[&path_s, &rounds],
            )
        })
        .collect();
    blocking(|| {
        for w in &workers {
            wait_line(w, "done");
            let status = w.wait_timeout(LONG).expect("worker exits");
            assert!(status.success(), "worker failed: {status:?}");
        }
    });

    let mut grants: Vec<(u64, u128, u128)> = Vec::new();
    let mut pids = std::collections::BTreeSet::new();
    for w in &workers {
        for line in w.lines().iter().filter(|l| l.starts_with("@grant ")) {
            let line = &line[1..];
            assert_eq!(
                field::<String>(line, 4),
                "true",
                "lease lost while held: {line}"
            );
            grants.push((field(line, 1), field(line, 2), field(line, 3)));
            pids.insert(field::<u32>(line, 5));
        }
    }
    assert_eq!(grants.len(), PROCS * ROUNDS);
    assert_eq!(pids.len(), PROCS, "every process held the lease");
    grants.sort_by_key(|g| g.1);
    for w in grants.windows(2) {
        let ((f1, _, end1), (f2, start2, _)) = (w[0], w[1]);
        assert!(end1 < start2, "hold windows overlap: {grants:?}");
        assert!(f1 < f2, "fences must grow in time order: {grants:?}");
    }
    // The guarded writes, in commit order, carry growing fences too.
    let written: Vec<i64> = sqlx::query_scalar("SELECT fence FROM mp_writes ORDER BY seq")
        .fetch_all(store.pool())
        .await
        .unwrap();
    let expected: Vec<i64> = grants.iter().map(|g| g.0 as i64).collect();
    assert_eq!(written, expected);
}

/// Freezes `w` with SIGSTOP, but never in the middle of one of its write transactions
/// (a renewal): that would be docs/faults.md row 20, tested on its own below.
async fn pause_outside_transaction(w: &WorkerProcess, path: &Path) {
    let options = SqliteConnectOptions::new()
        .filename(path)
        .busy_timeout(Duration::from_millis(200));
    for _ in 0..20 {
        w.pause();
        let mut conn = options.connect().await.unwrap();
        let free = sqlx::raw_sql("BEGIN IMMEDIATE; ROLLBACK")
            .execute(&mut conn)
            .await
            .is_ok();
        conn.close().await.ok();
        if free {
            return;
        }
        w.resume();
        sleep(Duration::from_millis(30)).await;
    }
    panic!("the worker always held the write lock");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn holder_paused_past_ttl_is_fenced_off() {
    if run_worker_if_child().await {
        return;
    }
    let _proof = proves(Backend::Sqlite, Fault::ProcessPause);
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("fa.db");
    let store = Arc::new(open(&path).await);
    let holder = worker(
        "holder_paused_past_ttl_is_fenced_off",
        "hold",
        &[path.to_str().unwrap()],
    );
    let held: u64 = field(&blocking(|| wait_line(&holder, "held")), 1);

    pause_outside_transaction(&holder, &path).await;
    sleep(TTL * 3 / 2).await;
    let client = LeaseClient::new(store.clone(), client_config());
    let lease = client
        .acquire("fa:held", TTL * 2)
        .await
        .expect("the frozen holder's lease expired");
    assert!(lease.fence().get() > held);
    let mut conn = store.pool().acquire().await.unwrap();
    let mut tx = conn.begin_with("BEGIN IMMEDIATE").await.unwrap();
    assert!(
        guard::check_and_advance(&mut tx, &"fa:data".parse().unwrap(), lease.fence())
            .await
            .unwrap()
            .is_accepted()
    );
    tx.commit().await.unwrap();
    drop(conn);

    holder.resume();
    let (lost, write, release) = blocking(|| {
        (
            wait_line(&holder, "lost"),
            wait_line(&holder, "write"),
            wait_line(&holder, "release"),
        )
    });
    assert!(
        ["lost expired", "lost not_owner", "lost renew_failed"].contains(&lost.as_str()),
        "{lost}"
    );
    assert_eq!(write, format!("write rejected {}", lease.fence().get()));
    assert_eq!(release, "release false");
    let info = store.inspect(lease.key()).await.unwrap().expect("B holds");
    assert_eq!(
        (info.owner, info.fence),
        (*lease.owner(), lease.fence()),
        "the stale holder touched the new lease"
    );
    assert!(lease.release().await.unwrap());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn holder_killed_is_taken_over_within_ttl() {
    if run_worker_if_child().await {
        return;
    }
    let _proof = proves(Backend::Sqlite, Fault::HolderCrash);
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("kill.db");
    let store = Arc::new(open(&path).await);
    let holder = worker(
        "holder_killed_is_taken_over_within_ttl",
        "hold",
        &[path.to_str().unwrap()],
    );
    let held: u64 = field(&blocking(|| wait_line(&holder, "held")), 1);
    holder.kill();
    let killed_at = Instant::now();
    let client = LeaseClient::new(store.clone(), client_config());
    let lease = client
        .acquire("fa:held", TTL * 5)
        .await
        .expect("taken over after the holder died");
    assert!(lease.fence().get() > held);
    assert!(
        killed_at.elapsed() < TTL * 3,
        "takeover took {:?}",
        killed_at.elapsed()
    );
    assert!(lease.release().await.unwrap());
}

/// docs/faults.md row 20, paused: a process frozen inside a write transaction makes every write of the
/// store fail with `Busy` after the busy timeout (never hang); reads still work and do not
/// see its uncommitted row; once it rolls back the store works again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn writer_paused_mid_transaction_gives_bounded_busy() {
    if run_worker_if_child().await {
        return;
    }
    let _proof = proves(Backend::Sqlite, Fault::ServerPaused);
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("f20.db");
    let go = dir.path().join("go");
    let store = Arc::new(open(&path).await);
    let child = worker(
        "writer_paused_mid_transaction_gives_bounded_busy",
        "hold-tx",
        &[path.to_str().unwrap(), go.to_str().unwrap()],
    );
    blocking(|| wait_line(&child, "in-tx"));
    child.pause();

    let k = Key::new("f20:other").unwrap();
    let owner = OwnerToken::random();
    let bound = store.config().get_busy_timeout() + Duration::from_secs(15);
    for op in ["acquire", "renew", "release", "break"] {
        let r = timeout(bound, async {
            match op {
                "acquire" => store.acquire(&k, &owner, TTL).await.map(|_| ()),
                "renew" => store.renew(&k, &owner, TTL).await.map(|_| ()),
                "release" => store.release(&k, &owner).await.map(|_| ()),
                _ => store.break_lease(&k).await.map(|_| ()),
            }
        })
        .await
        .unwrap_or_else(|_| panic!("{op} hung behind a paused writer"));
        let e = r.expect_err("a write cannot succeed while another process holds the lock");
        assert_eq!(e.kind(), StoreErrorKind::Busy, "{op}: {e}");
        assert!(e.is_retryable());
    }
    // Through the lease client: a retryable store error, not Contended, not a hang (its
    // operation timeout, TTL / 6, is below the busy timeout here, so it reports Timeout).
    let client = LeaseClient::new(store.clone(), client_config());
    match timeout(bound, client.try_acquire(&k))
        .await
        .expect("no hang")
    {
        Err(Error::Store(e)) => assert!(
            matches!(e.kind(), StoreErrorKind::Busy | StoreErrorKind::Timeout),
            "{e}"
        ),
        other => panic!("expected a retryable store error, got {other:?}"),
    }
    // Readers are not blocked and do not see the uncommitted row.
    let half = Key::new("f20:half-written").unwrap();
    assert_eq!(store.inspect(&half).await.unwrap(), None);
    assert!(store.list("f20:").await.unwrap().is_empty());

    std::fs::write(&go, b"go").unwrap();
    child.resume();
    blocking(|| {
        wait_line(&child, "rolled-back");
        assert!(child.wait_timeout(LONG).expect("exits").success());
    });
    assert!(matches!(
        store.acquire(&k, &owner, TTL).await.unwrap(),
        AcquireOutcome::Acquired { .. }
    ));
    assert_eq!(store.inspect(&half).await.unwrap(), None);
}

/// docs/faults.md row 20, killed: `kill -9` of a process in the middle of a write transaction (with
/// uncommitted pages already in the WAL) leaves no trace of it, and the lock is free at once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn writer_killed_mid_transaction_leaves_no_half_written_row() {
    if run_worker_if_child().await {
        return;
    }
    let _proof = proves(Backend::Sqlite, Fault::HolderCrash);
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("f20k.db");
    let go = dir.path().join("never");
    let store = Arc::new(open(&path).await);
    let child = worker(
        "writer_killed_mid_transaction_leaves_no_half_written_row",
        "hold-tx",
        &[path.to_str().unwrap(), go.to_str().unwrap()],
    );
    blocking(|| wait_line(&child, "in-tx"));
    let wal = std::fs::metadata(dir.path().join("f20k.db-wal"))
        .map(|m| m.len())
        .unwrap_or(0);
    assert!(
        wal > 1_000_000,
        "uncommitted pages spilled into the WAL: {wal}"
    );

    let k = Key::new("f20:other").unwrap();
    let owner = OwnerToken::random();
    let e = timeout(LONG, store.acquire(&k, &owner, TTL))
        .await
        .expect("no hang")
        .expect_err("busy while the writer lives");
    assert_eq!(e.kind(), StoreErrorKind::Busy, "{e}");

    child.kill();
    let r = timeout(LONG, store.acquire(&k, &owner, TTL))
        .await
        .expect("no hang")
        .expect("the lock died with its process");
    assert!(matches!(r, AcquireOutcome::Acquired { .. }), "{r:?}");
    let half = Key::new("f20:half-written").unwrap();
    assert_eq!(store.inspect(&half).await.unwrap(), None);
    let rows: i64 =
        sqlx::query_scalar("SELECT count(*) FROM leasehold_leases WHERE lease_key = ?1")
            .bind(half.as_str())
            .fetch_one(store.pool())
            .await
            .unwrap();
    assert_eq!(rows, 0, "half-written row present");
    let filler: i64 =
        sqlx::query_scalar("SELECT count(*) FROM sqlite_schema WHERE name = 'filler'")
            .fetch_one(store.pool())
            .await
            .unwrap();
    assert_eq!(filler, 0, "the uncommitted table is visible");
    let check: String = sqlx::query_scalar("PRAGMA integrity_check")
        .fetch_one(store.pool())
        .await
        .unwrap();
    assert_eq!(check, "ok");
    // A new process opening the file afterwards sees the same.
    let again = open(&path).await;
    assert_eq!(again.inspect(&half).await.unwrap(), None);
    assert!(store.release(&k, &owner).await.is_ok());
}

/// docs/faults.md row 14 on SQLite: a process whose wall clock is an hour ahead still sees the lease of
/// a process with a normal clock as held, and a process whose wall clock is an hour behind
/// takes over an abandoned lease when its TTL has run out, not an hour later. Expiry is on
/// `CLOCK_BOOTTIME`, which libfaketime leaves alone here (`DONT_FAKE_MONOTONIC=1`).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_wall_clock_jump_in_another_process_changes_nothing() {
    const TEST: &str = "a_wall_clock_jump_in_another_process_changes_nothing";
    if run_worker_if_child().await {
        return;
    }
    let _proof = proves(Backend::Sqlite, Fault::ClockJump);
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("jump.db");
    let path_s = path.to_str().unwrap();
    let store = open(&path).await;
    let held = Key::new("fj:held").unwrap();
    let abandoned = Key::new("fj:abandoned").unwrap();
    let short = Duration::from_secs(2);
    // This process holds one key for a minute and abandons another one with a short TTL
    // (neither is renewed).
    let acquired = |o: AcquireOutcome| matches!(o, AcquireOutcome::Acquired { .. });
    assert!(acquired(
        store
            .acquire(&held, &OwnerToken::random(), LONG)
            .await
            .unwrap()
    ));
    let sent = boottime_us();
    assert!(acquired(
        store
            .acquire(&abandoned, &OwnerToken::random(), short)
            .await
            .unwrap()
    ));

    let ahead_clock = leasehold_testkit::FakeWallClock::new();
    ahead_clock.set("+1h");
    let mut cmd = worker_command(TEST, "probe", &[path_s, held.as_str(), "1500"]);
    ahead_clock.apply(&mut cmd);
    let ahead = WorkerProcess::spawn(cmd);
    let behind_clock = leasehold_testkit::FakeWallClock::new();
    behind_clock.set("-1h");
    let mut cmd = worker_command(TEST, "probe", &[path_s, abandoned.as_str(), "30000"]);
    behind_clock.apply(&mut cmd);
    let behind = WorkerProcess::spawn(cmd);

    let (ahead_lines, behind_lines) = blocking(|| {
        let read = |w: &WorkerProcess, last: &str| {
            let wall: u64 = field(&wait_line(w, "wall"), 1);
            let first = wait_line(w, "first");
            let end = if first == "first held" {
                w.wait_for_line(|l| l.starts_with(last) || l.starts_with("@timeout"), LONG)
                    .unwrap_or_else(|| panic!("no outcome: {:?}", w.lines()))
                    .trim_start_matches('@')
                    .to_owned()
            } else {
                first.clone()
            };
            assert!(w.wait_timeout(LONG).expect("exits").success());
            (wall, first, end)
        };
        (read(&ahead, "@acquired"), read(&behind, "@acquired"))
    });
    let now = wall_secs();
    // The fake clocks took effect: the workers' wall clocks are an hour off.
    assert!(
        ahead_lines.0 > now + 3000,
        "ahead: {ahead_lines:?} (now {now})"
    );
    assert!(
        behind_lines.0 + 3000 < now,
        "behind: {behind_lines:?} (now {now})"
    );
    // An hour ahead: the held lease is still held, and stays so for as long as it waited.
    assert_eq!(ahead_lines.1, "first held", "{ahead_lines:?}");
    assert_eq!(ahead_lines.2, "timeout", "{ahead_lines:?}");
    // An hour behind: the abandoned lease is taken over once its TTL has run out.
    assert_eq!(behind_lines.1, "first held", "{behind_lines:?}");
    assert!(
        behind_lines.2.starts_with("acquired "),
        "the abandoned lease was not taken over: {behind_lines:?}"
    );
    let taken_at: u64 = field(&behind_lines.2, 2);
    assert!(
        taken_at >= sent + short.as_micros() as u64,
        "taken over before the TTL ran out: {taken_at} < {sent} + {short:?}"
    );
    let info = store.inspect(&held).await.unwrap().expect("still held");
    assert!(info.remaining.unwrap() > Duration::ZERO);
}

/// The store's clock is one clock for every process of the host: a waiter reads the
/// remaining time of a lease another process granted itself exactly as that process's
/// clock set it, and takes the lease over only once it has run out on that clock.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_holder_and_a_waiter_in_two_processes_agree_on_the_clock() {
    const TEST: &str = "a_holder_and_a_waiter_in_two_processes_agree_on_the_clock";
    if run_worker_if_child().await {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("agree.db");
    let store = Arc::new(open(&path).await);
    let key = Key::new("agree:one").unwrap();
    let ttl = Duration::from_secs(3);
    let ttl_us = ttl.as_micros() as u64;
    let holder = worker(
        TEST,
        "grant",
        &[path.to_str().unwrap(), key.as_str(), "3000"],
    );
    let granted = blocking(|| wait_line(&holder, "granted"));
    let (fence, h_sent, h_replied): (u64, u64, u64) =
        (field(&granted, 1), field(&granted, 2), field(&granted, 3));
    // The holder set the expiry at some instant in [h_sent, h_replied]; this process reads
    // the clock at some instant in [w_sent, w_replied]: the remaining time it sees lies in
    // [h_sent + ttl - w_replied, h_replied + ttl - w_sent] (to the µs), on one clock.
    let w_sent = boottime_us();
    let info = store.inspect(&key).await.unwrap().expect("held");
    let w_replied = boottime_us();
    assert_eq!(info.fence.get(), fence);
    let seen = info.remaining.unwrap().as_micros() as u64;
    let (low, high) = (
        (h_sent + ttl_us).saturating_sub(w_replied),
        h_replied + ttl_us - w_sent,
    );
    assert!(
        (low..=high + 1).contains(&seen),
        "remaining {seen} µs outside [{low}, {high}]: the processes disagree on the clock"
    );
    // The waiter gets the lease only after it ran out on the holder's clock.
    let client = LeaseClient::new(store.clone(), client_config());
    let lease = client.acquire(&key, LONG).await.expect("taken over");
    let taken = boottime_us();
    assert!(lease.fence().get() > fence);
    assert!(
        taken >= h_sent + ttl_us,
        "taken at {taken}, before the holder's expiry ({h_sent} + {ttl_us})"
    );
    assert!(holder.is_running(), "the holder neither died nor released");
    assert!(lease.release().await.unwrap());
}

/// A holder in another process cannot ring this process's release bell: the waiter re-reads
/// the row every `CROSS_PROCESS_POLL` (100 ms) and sees the release within it (here: within
/// 3 s), not at the holder's expiry a minute later. It does not return while the lease is
/// held.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_release_in_another_process_is_seen_within_the_poll_interval() {
    if run_worker_if_child().await {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("xp.db");
    let flag = dir.path().join("release-now");
    let store = Arc::new(open(&path).await);
    let holder = worker(
        "a_release_in_another_process_is_seen_within_the_poll_interval",
        "hold-until",
        &[path.to_str().unwrap(), "xp:held", flag.to_str().unwrap()],
    );
    blocking(|| wait_line(&holder, "held"));
    let k = Key::new("xp:held").unwrap();
    let wait = {
        let (store, k) = (store.clone(), k.clone());
        tokio::spawn(async move { store.wait_released(&k, &OwnerToken::random(), LONG).await })
    };
    sleep(Duration::from_secs(1)).await;
    assert!(!wait.is_finished(), "wait_released returned while held");
    std::fs::write(&flag, b"").unwrap();
    blocking(|| wait_line(&holder, "released"));
    let released = Instant::now();
    timeout(Duration::from_secs(3), wait)
        .await
        .expect("the release is seen within the poll interval, not at the expiry")
        .unwrap()
        .expect("wait_released is supported");
    assert!(released.elapsed() < Duration::from_secs(3));
    assert_eq!(
        leasehold_sqlite::CROSS_PROCESS_POLL,
        Duration::from_millis(100)
    );
}
