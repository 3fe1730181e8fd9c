//! The SQLite guard and idempotency record (docs/faults.md row 17 on SQLite).

use std::sync::Arc;
use std::time::Duration;

use leasehold_core::{Fence, GuardDecision, Idempotency, ResourceName, StoreErrorKind};
use leasehold_sqlite::guard;
use rand::Rng;
use rand::seq::SliceRandom;
use sqlx::sqlite::{SqliteConnectOptions, SqliteJournalMode, SqlitePoolOptions};
use sqlx::{Connection, SqlitePool};

fn name(s: &str) -> ResourceName {
    ResourceName::new(s).unwrap()
}

async fn pool(dir: &tempfile::TempDir, migrate: bool) -> SqlitePool {
    let options = SqliteConnectOptions::new()
        .filename(dir.path().join("app.db"))
        .create_if_missing(true)
        .journal_mode(SqliteJournalMode::Wal)
        .busy_timeout(Duration::from_secs(5));
    let pool = SqlitePoolOptions::new()
        .max_connections(16)
        .connect_with(options)
        .await
        .unwrap();
    if migrate {
        guard::migrate(&pool).await.unwrap();
        guard::migrate(&pool).await.expect("migrate is idempotent");
    }
    pool
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Outcome {
    Committed,
    Rejected,
}

/// One writer: its own transaction, random pauses around the check and the write; retries
/// the whole transaction when SQLite refuses it (Busy). Returns the outcome and how many
/// attempts were refused.
async fn writer(pool: SqlitePool, id: i64, fence: u64, immediate: bool) -> (Outcome, u32) {
    let mut refused = 0;
    loop {
        let pause = || Duration::from_millis(rand::rng().random_range(0..15));
        let mut conn = pool.acquire().await.unwrap();
        let begin = if immediate {
            "BEGIN IMMEDIATE"
        } else {
            "BEGIN"
        };
        let mut tx = match conn.begin_with(begin).await {
            Ok(tx) => tx,
            Err(e) => panic!("begin: {e}"),
        };
        // A deferred transaction reads first: make it take its snapshot before the pause.
        let _: i64 = sqlx::query_scalar("SELECT count(*) FROM g17_data")
            .fetch_one(&mut *tx)
            .await
            .unwrap();
        tokio::time::sleep(pause()).await;
        let decision =
            match guard::check_and_advance(&mut tx, &name("g17:resource"), Fence(fence)).await {
                Ok(d) => d,
                Err(e) => {
                    assert_eq!(e.kind(), StoreErrorKind::Busy, "{e}");
                    assert!(e.is_retryable());
                    refused += 1;
                    drop(tx);
                    continue;
                }
            };
        match decision {
            GuardDecision::Rejected { current } => {
                assert!(current > Fence(fence));
                tx.rollback().await.unwrap();
                return (Outcome::Rejected, refused);
            }
            GuardDecision::Accepted { previous } => {
                assert!(previous.is_none_or(|p| p <= Fence(fence)));
            }
        }
        tokio::time::sleep(pause()).await;
        sqlx::query("INSERT INTO g17_data (fence, writer) VALUES (?1, ?2)")
            .bind(fence as i64)
            .bind(id)
            .execute(&mut *tx)
            .await
            .expect("the guard holds the write lock: the write cannot be refused");
        tokio::time::sleep(pause()).await;
        tx.commit().await.expect("commit");
        return (Outcome::Committed, refused);
    }
}

/// docs/faults.md row 17: writers with shuffled fences (some equal), random pauses, deferred and
/// immediate transactions. Accepted fences never decrease in commit order (the
/// AUTOINCREMENT sequence of the data row written in the same transaction); refusals are
/// `Busy` and retryable, never accepted; rejected writes leave no row.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn guard_races_accepted_fences_never_decrease_in_commit_order() {
    let dir = tempfile::tempdir().unwrap();
    let pool = pool(&dir, true).await;
    sqlx::raw_sql(
        "CREATE TABLE g17_data (seq INTEGER PRIMARY KEY AUTOINCREMENT, fence INTEGER NOT NULL, writer INTEGER NOT NULL)",
    )
    .execute(&pool)
    .await
    .unwrap();
    let mut refusals = 0;
    for round in 0..3 {
        let base = round * 100;
        let mut fences: Vec<u64> = (1..=12).map(|f| base + f).collect();
        fences.extend([base + 6, base + 6, base + 11]);
        fences.shuffle(&mut rand::rng());
        let tasks: Vec<_> = fences
            .iter()
            .enumerate()
            .map(|(i, &f)| {
                tokio::spawn(writer(
                    pool.clone(),
                    (round * 100) as i64 + i as i64,
                    f,
                    i % 2 == 0,
                ))
            })
            .collect();
        let mut committed = Vec::new();
        let mut rejected = 0;
        for (t, &f) in tasks.into_iter().zip(&fences) {
            let (outcome, refused) = t.await.unwrap();
            refusals += refused;
            match outcome {
                Outcome::Committed => committed.push(f),
                Outcome::Rejected => rejected += 1,
            }
        }
        assert!(rejected > 0, "no stale writer in round {round}: {fences:?}");
        let rows: Vec<(i64, i64)> =
            sqlx::query_as("SELECT fence, writer FROM g17_data WHERE writer >= ?1 ORDER BY seq")
                .bind((round * 100) as i64)
                .fetch_all(&pool)
                .await
                .unwrap();
        let in_commit_order: Vec<i64> = rows.iter().map(|r| r.0).collect();
        assert!(
            in_commit_order.windows(2).all(|w| w[0] <= w[1]),
            "accepted fences decreased in commit order: {in_commit_order:?}"
        );
        assert_eq!(rows.len(), committed.len(), "a rejected write left a row");
        let max = *fences.iter().max().unwrap();
        assert_eq!(*in_commit_order.last().unwrap(), max as i64);
        let mut conn = pool.acquire().await.unwrap();
        assert_eq!(
            guard::current(&mut conn, &name("g17:resource"))
                .await
                .unwrap(),
            Some(Fence(max))
        );
    }
    // Deferred transactions that read before another committed were refused (and retried).
    assert!(
        refusals > 0,
        "no transaction was refused: the race was not exercised"
    );
}

#[tokio::test]
async fn equal_fences_accepted_lower_rejected() {
    let dir = tempfile::tempdir().unwrap();
    let pool = pool(&dir, true).await;
    let mut conn = pool.acquire().await.unwrap();
    let mut tx = conn.begin_with("BEGIN IMMEDIATE").await.unwrap();
    assert_eq!(
        guard::check_and_advance(&mut tx, &name("r:1"), Fence(5))
            .await
            .unwrap(),
        GuardDecision::Accepted { previous: None }
    );
    assert_eq!(
        guard::check_and_advance(&mut tx, &name("r:1"), Fence(5))
            .await
            .unwrap(),
        GuardDecision::Accepted {
            previous: Some(Fence(5))
        }
    );
    let d = guard::check_and_advance(&mut tx, &name("r:1"), Fence(4))
        .await
        .unwrap();
    assert_eq!(d, GuardDecision::Rejected { current: Fence(5) });
    assert!(matches!(
        d.into_result(&"r:1".parse().unwrap(), Fence(4)),
        Err(leasehold_core::Error::FenceRejected { .. })
    ));
    // Another resource is independent.
    assert!(
        guard::check_and_advance(&mut tx, &name("r:2"), Fence(1))
            .await
            .unwrap()
            .is_accepted()
    );
    tx.rollback().await.unwrap();
    // Rolled back: the guard advanced nothing.
    assert_eq!(guard::current(&mut conn, &name("r:1")).await.unwrap(), None);
}

#[tokio::test]
async fn misuse_gets_typed_errors() {
    let dir = tempfile::tempdir().unwrap();
    let pool = pool(&dir, false).await;
    let mut conn = pool.acquire().await.unwrap();
    // Tables missing: a configuration error, not a crash or a silent accept.
    let mut tx = conn.begin_with("BEGIN IMMEDIATE").await.unwrap();
    let e = guard::check_and_advance(&mut tx, &name("r"), Fence(1))
        .await
        .unwrap_err();
    assert_eq!(e.kind(), StoreErrorKind::Config, "{e}");
    tx.rollback().await.unwrap();
    guard::migrate(&pool).await.unwrap();
    // Outside a transaction: does not compile (the compile_fail examples of `guard`).
    // Bad names never reach the guard: making the name refuses them, as an error of the
    // caller's configuration.
    for bad in [String::new(), "x".repeat(513), "a\0b".into()] {
        assert!(ResourceName::new(&bad).is_err(), "{bad:?}");
    }
    let mut tx = conn.begin_with("BEGIN IMMEDIATE").await.unwrap();
    let e = guard::check_and_advance(&mut tx, &name("r"), Fence(u64::MAX))
        .await
        .unwrap_err();
    assert_eq!(e.kind(), StoreErrorKind::InvalidInput, "{e}");
    assert!(
        guard::check_and_advance(&mut tx, &name(&"x".repeat(512)), Fence(1))
            .await
            .unwrap()
            .is_accepted()
    );
    tx.rollback().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn idempotency_record_once_per_committed_job() {
    let dir = tempfile::tempdir().unwrap();
    let pool = pool(&dir, true).await;
    let mut conn = pool.acquire().await.unwrap();
    // Rolled back: not recorded.
    let mut tx = conn.begin_with("BEGIN IMMEDIATE").await.unwrap();
    assert_eq!(
        guard::record_once(&mut tx, &name("job-1")).await.unwrap(),
        Idempotency::FirstTime
    );
    tx.rollback().await.unwrap();
    let mut tx = conn.begin_with("BEGIN IMMEDIATE").await.unwrap();
    assert_eq!(
        guard::record_once(&mut tx, &name("job-1")).await.unwrap(),
        Idempotency::FirstTime
    );
    tx.commit().await.unwrap();
    let mut tx = conn.begin_with("BEGIN IMMEDIATE").await.unwrap();
    assert_eq!(
        guard::record_once(&mut tx, &name("job-1")).await.unwrap(),
        Idempotency::AlreadyDone
    );
    assert_eq!(
        guard::record_once(&mut tx, &name("job-2")).await.unwrap(),
        Idempotency::FirstTime
    );
    tx.commit().await.unwrap();
    drop(conn);

    // Many concurrent transactions with one job id: exactly one does the work.
    let done = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let tasks: Vec<_> = (0..8)
        .map(|_| {
            let (pool, done) = (pool.clone(), done.clone());
            tokio::spawn(async move {
                let mut conn = pool.acquire().await.unwrap();
                let mut tx = conn.begin_with("BEGIN IMMEDIATE").await.unwrap();
                if guard::record_once(&mut tx, &name("job-many"))
                    .await
                    .unwrap()
                    == Idempotency::FirstTime
                {
                    done.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                }
                tokio::time::sleep(Duration::from_millis(5)).await;
                tx.commit().await.unwrap();
            })
        })
        .collect();
    for t in tasks {
        t.await.unwrap();
    }
    assert_eq!(done.load(std::sync::atomic::Ordering::SeqCst), 1);
}
