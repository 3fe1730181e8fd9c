//! The MySQL guard and idempotency record (docs/faults.md row 17 on MariaDB).

mod common;

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use leasehold_core::{Fence, GuardDecision, Idempotency, ResourceName, StoreErrorKind};
use leasehold_mysql::guard;
use rand::Rng;
use rand::seq::SliceRandom;
use sqlx::mysql::MySqlPoolOptions;
use sqlx::{AssertSqlSafe, Connection, Executor, MySqlPool};

fn name(s: &str) -> ResourceName {
    ResourceName::new(s).unwrap()
}

async fn pool(db: &common::Server) -> MySqlPool {
    MySqlPoolOptions::new()
        .max_connections(20)
        .connect(&db.url())
        .await
        .unwrap()
}

fn refusal(e: &sqlx::Error) -> bool {
    e.as_database_error()
        .and_then(|d| d.try_downcast_ref::<sqlx::mysql::MySqlDatabaseError>())
        .is_some_and(|d| matches!(d.number(), 1205 | 1213))
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Outcome {
    Committed,
    Rejected,
}

/// One writer at `isolation`: its own transaction, a read first (so SERIALIZABLE takes its
/// shared locks), random pauses around the check and the write; the whole transaction is
/// retried when the server refuses it (deadlock, lock wait timeout).
async fn writer(
    pool: MySqlPool,
    isolation: &'static str,
    resource: String,
    fence: u64,
    id: i64,
) -> (Outcome, u32) {
    let mut refused: u32 = 0;
    loop {
        if refused > 0 {
            // Full-jitter backoff before retrying a refused transaction, as a real writer
            // would: immediate retries under SERIALIZABLE only deadlock again.
            let cap = 5u64 << refused.min(6);
            let backoff = Duration::from_millis(rand::rng().random_range(0..=cap));
            tokio::time::sleep(backoff).await;
        }
        let pause = || Duration::from_millis(rand::rng().random_range(0..15));
        let mut conn = pool.acquire().await.unwrap();
        conn.execute("SET SESSION innodb_lock_wait_timeout = 10")
            .await
            .unwrap();
        conn.execute(AssertSqlSafe(format!(
            "SET TRANSACTION ISOLATION LEVEL {isolation}"
        )))
        .await
        .unwrap();
        let mut tx = conn.begin().await.unwrap();
        let read: Result<i64, _> =
            sqlx::query_scalar("SELECT count(*) FROM g17_data WHERE resource = ?")
                .bind(&resource)
                .fetch_one(&mut *tx)
                .await;
        if let Err(e) = read {
            assert!(refusal(&e), "{e}");
            refused += 1;
            continue;
        }
        tokio::time::sleep(pause()).await;
        match guard::check_and_advance(&mut tx, &name(&resource), Fence(fence)).await {
            Err(e) => {
                assert_eq!(e.kind(), StoreErrorKind::Busy, "{e}");
                assert!(e.is_retryable());
                refused += 1;
                continue;
            }
            Ok(GuardDecision::Rejected { current }) => {
                assert!(current > Fence(fence));
                tx.rollback().await.unwrap();
                return (Outcome::Rejected, refused);
            }
            Ok(GuardDecision::Accepted { previous }) => {
                assert!(previous.is_none_or(|p| p <= Fence(fence)));
            }
        }
        tokio::time::sleep(pause()).await;
        let insert = sqlx::query("INSERT INTO g17_data (resource, fence, writer) VALUES (?, ?, ?)")
            .bind(&resource)
            .bind(fence)
            .bind(id)
            .execute(&mut *tx)
            .await;
        if let Err(e) = insert {
            // A deadlock victim is rolled back whole, guard advance included.
            assert!(refusal(&e), "{e}");
            refused += 1;
            continue;
        }
        tokio::time::sleep(pause()).await;
        tx.commit().await.unwrap();
        return (Outcome::Committed, refused);
    }
}

/// docs/faults.md row 17 at READ COMMITTED, REPEATABLE READ and SERIALIZABLE: writers with shuffled
/// fences (some equal) and random pauses. Accepted fences never decrease in commit order
/// (the AUTO_INCREMENT sequence of the data row written under the guard's row lock);
/// refusals are Busy and retryable, never acceptances; rejected writes leave no row.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn guard_races_accepted_fences_never_decrease_in_commit_order() {
    let db = common::start_db();
    let pool = pool(&db).await;
    guard::migrate(&pool).await.unwrap();
    sqlx::raw_sql(
        "CREATE TABLE g17_data (seq BIGINT AUTO_INCREMENT PRIMARY KEY, resource VARCHAR(64) NOT NULL, \
         fence BIGINT UNSIGNED NOT NULL, writer BIGINT NOT NULL, KEY (resource)) ENGINE=InnoDB",
    )
    .execute(&pool)
    .await
    .unwrap();
    let mut refusals = Vec::new();
    for (round, isolation) in ["READ COMMITTED", "REPEATABLE READ", "SERIALIZABLE"]
        .into_iter()
        .enumerate()
    {
        let resource = format!("g17:{round}");
        let mut fences: Vec<u64> = (1..=12).collect();
        fences.extend([6, 6, 11]);
        fences.shuffle(&mut rand::rng());
        let tasks: Vec<_> = fences
            .iter()
            .enumerate()
            .map(|(i, &f)| {
                tokio::spawn(writer(
                    pool.clone(),
                    isolation,
                    resource.clone(),
                    f,
                    i as i64,
                ))
            })
            .collect();
        let (mut committed, mut rejected, mut refused) = (0, 0, 0);
        for t in tasks {
            let (outcome, r) = t.await.unwrap();
            refused += r;
            match outcome {
                Outcome::Committed => committed += 1,
                Outcome::Rejected => rejected += 1,
            }
        }
        refusals.push((isolation, refused));
        assert!(rejected > 0, "{isolation}: no stale writer: {fences:?}");
        let in_commit_order: Vec<u64> =
            sqlx::query_scalar("SELECT fence FROM g17_data WHERE resource = ? ORDER BY seq")
                .bind(&resource)
                .fetch_all(&pool)
                .await
                .unwrap();
        assert!(
            in_commit_order.windows(2).all(|w| w[0] <= w[1]),
            "{isolation}: accepted fences decreased in commit order: {in_commit_order:?}"
        );
        assert_eq!(
            in_commit_order.len(),
            committed,
            "{isolation}: a rejected write left a row"
        );
        assert_eq!(in_commit_order.last(), Some(&12));
        let mut conn = pool.acquire().await.unwrap();
        assert_eq!(
            guard::current(&mut conn, &name(&resource)).await.unwrap(),
            Some(Fence(12))
        );
    }
    eprintln!("refused (retried) transactions: {refusals:?}");
}

/// A writer stuck behind another's guard row lock gets Busy after the lock wait timeout,
/// never an acceptance; it succeeds on retry once the holder commits.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn guard_semantics_lock_wait_and_idempotency() {
    let db = common::start_db();
    let pool = pool(&db).await;
    let mut c1 = pool.acquire().await.unwrap();
    let mut c2 = pool.acquire().await.unwrap();

    // Tables missing: a configuration error.
    let mut tx = c1.begin().await.unwrap();
    let e = guard::check_and_advance(&mut tx, &name("r"), Fence(1))
        .await
        .unwrap_err();
    assert_eq!(e.kind(), StoreErrorKind::Config, "{e}");
    tx.rollback().await.unwrap();
    guard::migrate(&pool).await.unwrap();
    guard::migrate(&pool).await.expect("idempotent");

    // Misuse. Outside a transaction: does not compile (the compile_fail examples of
    // `guard`). Bad names never reach the guard: making the name refuses them (NUL
    // included, which MySQL's VARBINARY would have stored), as an error of the caller's
    // configuration.
    for bad in [String::new(), "x".repeat(513), "a\0b".into()] {
        assert!(ResourceName::new(&bad).is_err(), "{bad:?}");
    }
    let mut tx = c1.begin().await.unwrap();
    // Equal accepted, lower rejected, other resources independent, bytes compared exactly.
    assert_eq!(
        guard::check_and_advance(&mut tx, &name("r:1"), Fence(u64::MAX - 1))
            .await
            .unwrap(),
        GuardDecision::Accepted { previous: None }
    );
    assert_eq!(
        guard::check_and_advance(&mut tx, &name("r:1"), Fence(u64::MAX - 1))
            .await
            .unwrap(),
        GuardDecision::Accepted {
            previous: Some(Fence(u64::MAX - 1))
        }
    );
    assert_eq!(
        guard::check_and_advance(&mut tx, &name("r:1"), Fence(4))
            .await
            .unwrap(),
        GuardDecision::Rejected {
            current: Fence(u64::MAX - 1)
        }
    );
    assert!(
        guard::check_and_advance(&mut tx, &name("R:1"), Fence(1))
            .await
            .unwrap()
            .is_accepted()
    );
    tx.rollback().await.unwrap();
    assert_eq!(guard::current(&mut c1, &name("r:1")).await.unwrap(), None);

    // Lock wait timeout: Busy, retryable, not accepted.
    let mut tx1 = c1.begin().await.unwrap();
    assert!(
        guard::check_and_advance(&mut tx1, &name("lw"), Fence(5))
            .await
            .unwrap()
            .is_accepted()
    );
    tx1.commit().await.unwrap();
    let mut tx1 = c1.begin().await.unwrap();
    assert!(
        guard::check_and_advance(&mut tx1, &name("lw"), Fence(6))
            .await
            .unwrap()
            .is_accepted()
    );
    c2.execute("SET SESSION innodb_lock_wait_timeout = 1")
        .await
        .unwrap();
    let mut tx2 = c2.begin().await.unwrap();
    let e = guard::check_and_advance(&mut tx2, &name("lw"), Fence(7))
        .await
        .unwrap_err();
    assert_eq!(e.kind(), StoreErrorKind::Busy, "{e}");
    assert!(e.is_retryable());
    tx2.rollback().await.unwrap();
    tx1.commit().await.unwrap();
    let mut tx2 = c2.begin().await.unwrap();
    assert_eq!(
        guard::check_and_advance(&mut tx2, &name("lw"), Fence(7))
            .await
            .unwrap(),
        GuardDecision::Accepted {
            previous: Some(Fence(6))
        }
    );
    tx2.commit().await.unwrap();

    // Idempotency: recorded only by a committed transaction.
    let mut tx = c1.begin().await.unwrap();
    assert_eq!(
        guard::record_once(&mut tx, &name("job-1")).await.unwrap(),
        Idempotency::FirstTime
    );
    tx.rollback().await.unwrap();
    let mut tx = c1.begin().await.unwrap();
    assert_eq!(
        guard::record_once(&mut tx, &name("job-1")).await.unwrap(),
        Idempotency::FirstTime
    );
    tx.commit().await.unwrap();
    let mut tx = c1.begin().await.unwrap();
    assert_eq!(
        guard::record_once(&mut tx, &name("job-1")).await.unwrap(),
        Idempotency::AlreadyDone
    );
    assert_eq!(
        guard::record_once(&mut tx, &name("JOB-1")).await.unwrap(),
        Idempotency::FirstTime,
        "job ids are compared as bytes"
    );
    tx.commit().await.unwrap();
    drop((c1, c2));

    // Concurrent transactions with one job id: exactly one does the work.
    let done = Arc::new(AtomicUsize::new(0));
    let tasks: Vec<_> = (0..8)
        .map(|_| {
            let (pool, done) = (pool.clone(), done.clone());
            tokio::spawn(async move {
                let mut conn = pool.acquire().await.unwrap();
                let mut tx = conn.begin().await.unwrap();
                if guard::record_once(&mut tx, &name("job-many"))
                    .await
                    .unwrap()
                    == Idempotency::FirstTime
                {
                    done.fetch_add(1, Ordering::SeqCst);
                }
                tokio::time::sleep(Duration::from_millis(20)).await;
                tx.commit().await.unwrap();
            })
        })
        .collect();
    for t in tasks {
        t.await.unwrap();
    }
    assert_eq!(done.load(Ordering::SeqCst), 1);
}
