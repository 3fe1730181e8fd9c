//! The guard and the idempotency record against a private PostgreSQL, including docs/faults.md
//! row 17 (guard races under READ COMMITTED and SERIALIZABLE) with a negative control.

mod common;

use std::collections::BTreeSet;
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;

use leasehold_core::{Action, Fence, GuardDecision, Idempotency, ResourceName, StoreErrorKind};
use leasehold_postgres::sqlx::{self, Connection, PgPool, postgres::PgPoolOptions};
use leasehold_postgres::{PgGuard, guard, store_error};
use leasehold_testkit::PostgresOptions;
use metrics_util::debugging::{DebugValue, DebuggingRecorder, Snapshotter};
use rand::Rng;
use rand::seq::SliceRandom;

fn name(s: &str) -> ResourceName {
    ResourceName::new(s).unwrap()
}

fn snapshotter() -> &'static Snapshotter {
    static S: OnceLock<Snapshotter> = OnceLock::new();
    S.get_or_init(|| {
        let recorder = DebuggingRecorder::new();
        let s = recorder.snapshotter();
        metrics::set_global_recorder(recorder).expect("one recorder per test process");
        s
    })
}

fn rejected_count(resource_type: &str) -> u64 {
    snapshotter()
        .snapshot()
        .into_vec()
        .into_iter()
        .filter(|(k, _, _, _)| {
            k.key().name() == "leasehold_fence_rejected_total"
                && k.key()
                    .labels()
                    .any(|l| l.key() == "resource_type" && l.value() == resource_type)
        })
        .map(|(_, _, _, v)| match v {
            DebugValue::Counter(c) => c,
            _ => 0,
        })
        .sum()
}

async fn setup() -> (leasehold_testkit::Postgres, PgPool) {
    let pg = common::start_pg(PostgresOptions::new()).await;
    let pool = PgPoolOptions::new()
        .max_connections(12)
        .connect(&pg.url())
        .await
        .unwrap();
    guard::migrate(&pool).await.unwrap();
    guard::migrate(&pool).await.expect("migrate is idempotent");
    (pg, pool)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn equal_accepted_lower_rejected_and_counted() {
    let snap = snapshotter();
    let _ = snap;
    let (_pg, pool) = setup().await;
    let r = "ledger:basic";
    let check = |f: u64| {
        let pool = pool.clone();
        async move {
            let mut tx = pool.begin().await.unwrap();
            let d = guard::check_and_advance(&mut tx, &name(r), Fence(f))
                .await
                .unwrap();
            tx.commit().await.unwrap();
            d
        }
    };
    assert_eq!(check(5).await, GuardDecision::Accepted { previous: None });
    assert_eq!(
        check(5).await,
        GuardDecision::Accepted {
            previous: Some(Fence(5))
        },
        "equal fences (one holder writing again) are accepted"
    );
    assert_eq!(
        check(9).await,
        GuardDecision::Accepted {
            previous: Some(Fence(5))
        }
    );
    let before = rejected_count("ledger");
    let d = check(7).await;
    assert_eq!(d, GuardDecision::Rejected { current: Fence(9) });
    assert_eq!(rejected_count("ledger"), before + 1, "rejection is counted");
    let e = d.into_result(&r.parse().unwrap(), Fence(7)).unwrap_err();
    assert_eq!(e.action(), Action::OwnershipLost);
    assert!(e.to_string().contains("ownership lost"), "{e}");

    // A rejected check leaves the guard and the transaction as they were.
    let mut tx = pool.begin().await.unwrap();
    assert!(
        !guard::check_and_advance(&mut tx, &name(r), Fence(1))
            .await
            .unwrap()
            .is_accepted()
    );
    sqlx::query("SELECT 1")
        .execute(&mut *tx)
        .await
        .expect("tx still usable");
    tx.rollback().await.unwrap();
    let mut c = pool.acquire().await.unwrap();
    assert_eq!(
        PgGuard::new().current(&mut c, &name(r)).await.unwrap(),
        Some(Fence(9))
    );

    // A write rolled back does not advance the guard.
    let mut tx = pool.begin().await.unwrap();
    assert!(
        guard::check_and_advance(&mut tx, &name(r), Fence(100))
            .await
            .unwrap()
            .is_accepted()
    );
    tx.rollback().await.unwrap();
    assert_eq!(
        PgGuard::new().current(&mut c, &name(r)).await.unwrap(),
        Some(Fence(9))
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_input_and_missing_tables() {
    let (_pg, pool) = setup().await;
    // Bad names never reach the guard: making the name refuses them (for the check and
    // the idempotency record alike), as an error of the caller's configuration. A call
    // outside a transaction does not compile (the compile_fail examples of `guard`).
    for bad in ["", "a\0b"] {
        assert!(ResourceName::new(bad).is_err(), "{bad:?}");
    }
    let mut tx = pool.begin().await.unwrap();
    let e = guard::check_and_advance(&mut tx, &name("ledger:x"), Fence(u64::MAX))
        .await
        .unwrap_err();
    assert_eq!(e.kind(), StoreErrorKind::InvalidInput, "{e}");
    tx.rollback().await.unwrap();
    let g = PgGuard::in_schema("nowhere").unwrap();
    let mut tx = pool.begin().await.unwrap();
    let e = g
        .check_and_advance(&mut tx, &name("x"), Fence(1))
        .await
        .unwrap_err();
    assert_eq!(e.kind(), StoreErrorKind::Config, "{e}");
    assert!(e.to_string().contains("migrate"), "{e}");
    tx.rollback().await.unwrap();
    // The same guard, migrated into its own schema, works.
    g.migrate(&pool).await.unwrap();
    let mut tx = pool.begin().await.unwrap();
    assert!(
        g.check_and_advance(&mut tx, &name("x"), Fence(1))
            .await
            .unwrap()
            .is_accepted()
    );
    tx.commit().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn idempotency_record_once() {
    let (_pg, pool) = setup().await;
    // Rolled back: not recorded.
    let mut tx = pool.begin().await.unwrap();
    assert_eq!(
        guard::record_once(&mut tx, &name("job-1")).await.unwrap(),
        Idempotency::FirstTime
    );
    tx.rollback().await.unwrap();
    let mut tx = pool.begin().await.unwrap();
    assert_eq!(
        guard::record_once(&mut tx, &name("job-1")).await.unwrap(),
        Idempotency::FirstTime
    );
    tx.commit().await.unwrap();
    let mut tx = pool.begin().await.unwrap();
    assert_eq!(
        guard::record_once(&mut tx, &name("job-1")).await.unwrap(),
        Idempotency::AlreadyDone
    );
    tx.rollback().await.unwrap();

    // Concurrent: the second waits for the first, then sees it done.
    let mut t1 = pool.begin().await.unwrap();
    assert_eq!(
        guard::record_once(&mut t1, &name("job-2")).await.unwrap(),
        Idempotency::FirstTime
    );
    let second = {
        let pool = pool.clone();
        tokio::spawn(async move {
            let mut t2 = pool.begin().await.unwrap();
            let r = guard::record_once(&mut t2, &name("job-2")).await.unwrap();
            t2.commit().await.unwrap();
            r
        })
    };
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(
        !second.is_finished(),
        "the second recording waits for the first"
    );
    t1.commit().await.unwrap();
    assert_eq!(second.await.unwrap(), Idempotency::AlreadyDone);
}

/// The documented single-statement pattern on a user table with a `last_fence` column.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn last_fence_column_pattern() {
    let (_pg, pool) = setup().await;
    sqlx::raw_sql(
        "CREATE TABLE accounts (id int PRIMARY KEY, balance bigint NOT NULL, last_fence bigint NOT NULL DEFAULT 0)",
    )
    .execute(&pool)
    .await
    .unwrap();
    let upsert = |id: i32, balance: i64, fence: i64| {
        let pool = pool.clone();
        async move {
            sqlx::query(
                "INSERT INTO accounts AS a (id, balance, last_fence) VALUES ($3, $1, $2) \
                 ON CONFLICT (id) DO UPDATE SET balance = EXCLUDED.balance, last_fence = EXCLUDED.last_fence \
                 WHERE a.last_fence <= EXCLUDED.last_fence",
            )
            .bind(balance)
            .bind(fence)
            .bind(id)
            .execute(&pool)
            .await
            .unwrap()
            .rows_affected()
        }
    };
    let update = |id: i32, balance: i64, fence: i64| {
        let pool = pool.clone();
        async move {
            sqlx::query(
                "UPDATE accounts SET balance = $1, last_fence = $2 WHERE id = $3 AND last_fence <= $2",
            )
            .bind(balance)
            .bind(fence)
            .bind(id)
            .execute(&pool)
            .await
            .unwrap()
            .rows_affected()
        }
    };
    assert_eq!(upsert(1, 100, 10).await, 1);
    assert_eq!(update(1, 150, 10).await, 1, "equal fence accepted");
    assert_eq!(update(1, 200, 12).await, 1);
    assert_eq!(update(1, 666, 11).await, 0, "stale fence rejected");
    assert_eq!(upsert(1, 666, 3).await, 0, "stale fence rejected");
    let (balance, fence): (i64, i64) =
        sqlx::query_as("SELECT balance, last_fence FROM accounts WHERE id = 1")
            .fetch_one(&pool)
            .await
            .unwrap();
    assert_eq!((balance, fence), (200, 12));
}

#[derive(Default)]
struct RaceLog {
    accepted: Vec<i64>,
    rejected: usize,
    busy: usize,
}

/// docs/faults.md row 17: `writers` tasks write shuffled fences with random pauses at `isolation`.
/// Returns the fences of the audit rows in commit order (the audit's sequence is drawn
/// after the guard check, while the guard row is locked) and the client-side log.
async fn race(
    pool: &PgPool,
    isolation: &'static str,
    with_guard: bool,
    tag: &str,
) -> (Vec<i64>, RaceLog) {
    const WRITERS: usize = 6;
    const FENCES: i64 = 90;
    let resource = format!("ledger:f17-{tag}");
    let table = format!("audit_{tag}");
    sqlx::raw_sql(sqlx::AssertSqlSafe(format!(
        "CREATE TABLE {table} (seq bigserial PRIMARY KEY, fence bigint NOT NULL)"
    )))
    .execute(pool)
    .await
    .unwrap();
    // Fences grow over time, as successive lease grants do, but shuffled within windows
    // and dealt round-robin, so writers race with close, out-of-order fences.
    let mut fences: Vec<i64> = (1..=FENCES).collect();
    for window in fences.chunks_mut(2 * WRITERS) {
        window.shuffle(&mut rand::rng());
    }
    let chunks: Vec<Vec<i64>> = (0..WRITERS)
        .map(|w| fences.iter().copied().skip(w).step_by(WRITERS).collect())
        .collect();
    let log = Arc::new(Mutex::new(RaceLog::default()));
    let mut tasks = Vec::new();
    for chunk in chunks {
        let (pool, log, chunk, resource, table) = (
            pool.clone(),
            log.clone(),
            chunk.to_vec(),
            resource.clone(),
            table.clone(),
        );
        tasks.push(tokio::spawn(async move {
            let mut conn = pool.acquire().await.unwrap();
            for fence in chunk {
                loop {
                    let mut tx = conn.begin().await.unwrap();
                    sqlx::raw_sql(sqlx::AssertSqlSafe(format!(
                        "SET TRANSACTION ISOLATION LEVEL {isolation}"
                    )))
                    .execute(&mut *tx)
                    .await
                    .unwrap();
                    let pause = rand::rng().random_range(0..4);
                    tokio::time::sleep(Duration::from_millis(pause)).await;
                    if with_guard {
                        match guard::check_and_advance(
                            &mut tx,
                            &name(&resource),
                            Fence(fence as u64),
                        )
                        .await
                        {
                            Err(e) => {
                                assert_eq!(
                                    e.kind(),
                                    StoreErrorKind::Busy,
                                    "only serialization failures: {e}"
                                );
                                assert!(e.is_retryable());
                                log.lock().unwrap().busy += 1;
                                drop(tx);
                                continue;
                            }
                            Ok(GuardDecision::Rejected { current }) => {
                                assert!(current.get() > fence as u64);
                                log.lock().unwrap().rejected += 1;
                                tx.rollback().await.unwrap();
                                break;
                            }
                            Ok(GuardDecision::Accepted { previous }) => {
                                assert!(previous.is_none_or(|p| p.get() <= fence as u64));
                            }
                        }
                    }
                    let pause = rand::rng().random_range(0..4);
                    tokio::time::sleep(Duration::from_millis(pause)).await;
                    let insert = sqlx::query(sqlx::AssertSqlSafe(format!(
                        "INSERT INTO {table} (fence) VALUES ($1)"
                    )))
                    .bind(fence)
                    .execute(&mut *tx)
                    .await;
                    if let Err(e) = insert {
                        let e = store_error(e);
                        assert_eq!(e.kind(), StoreErrorKind::Busy, "{e}");
                        log.lock().unwrap().busy += 1;
                        continue;
                    }
                    match tx.commit().await {
                        Ok(()) => {
                            log.lock().unwrap().accepted.push(fence);
                            break;
                        }
                        Err(e) => {
                            // A failed commit is never an acceptance: retryable, and retried.
                            let e = store_error(e);
                            assert_eq!(e.kind(), StoreErrorKind::Busy, "{e}");
                            log.lock().unwrap().busy += 1;
                        }
                    }
                }
            }
        }));
    }
    for t in tasks {
        t.await.unwrap();
    }
    let committed: Vec<i64> = sqlx::query_scalar(sqlx::AssertSqlSafe(format!(
        "SELECT fence FROM {table} ORDER BY seq"
    )))
    .fetch_all(pool)
    .await
    .unwrap();
    let log = Arc::try_unwrap(log).ok().unwrap().into_inner().unwrap();
    (committed, log)
}

/// The first place where a fence is below an earlier one, in commit order.
fn first_decrease(fences: &[i64]) -> Option<(usize, i64, i64)> {
    let mut max = i64::MIN;
    for (i, &f) in fences.iter().enumerate() {
        if f < max {
            return Some((i, max, f));
        }
        max = max.max(f);
    }
    None
}

async fn guard_race(isolation: &'static str, tag: &str) {
    let (_pg, pool) = setup().await;
    let (committed, log) = race(&pool, isolation, true, tag).await;
    assert_eq!(
        first_decrease(&committed),
        None,
        "{isolation}: accepted fences decreased in commit order: {committed:?}"
    );
    // Exactly the acknowledged writes are in the table: nothing failed was accepted.
    let acked: BTreeSet<i64> = log.accepted.iter().copied().collect();
    let stored: BTreeSet<i64> = committed.iter().copied().collect();
    assert_eq!(acked, stored);
    assert_eq!(acked.len() + log.rejected, 90);
    let mut c = pool.acquire().await.unwrap();
    let current = PgGuard::new()
        .current(&mut c, &name(&format!("ledger:f17-{tag}")))
        .await
        .unwrap();
    assert_eq!(
        current.map(|f| f.get() as i64),
        committed.iter().copied().max()
    );
    eprintln!(
        "{isolation}: {} accepted, {} rejected, {} serialization failures retried",
        log.accepted.len(),
        log.rejected,
        log.busy
    );

    // Negative control: the same workload without the guard breaks the invariant, so the
    // check above can fail.
    let (unguarded, _) = race(&pool, isolation, false, &format!("{tag}_unguarded")).await;
    assert!(
        first_decrease(&unguarded).is_some(),
        "without the guard, shuffled fences must commit out of order: {unguarded:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn f17_guard_race_read_committed() {
    guard_race("READ COMMITTED", "rc").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn f17_guard_race_serializable() {
    guard_race("SERIALIZABLE", "ser").await;
}
