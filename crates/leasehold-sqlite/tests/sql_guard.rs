//! The SQL guard of SQLite (the view `leasehold_guard_check` and its trigger, created with
//! the guard tables): it rejects exactly what the Rust guard rejects, failing the
//! insert so that the caller rolls back, shares the fence with the Rust guard, refuses a stale snapshot, and
//! is created by opening the store.

use std::time::Duration;

use leasehold_core::{Fence, GuardDecision, ResourceName, StoreErrorKind};
use leasehold_sqlite::{SqliteStore, guard, store_error};
use sqlx::sqlite::{SqliteConnectOptions, SqliteJournalMode, SqlitePoolOptions};
use sqlx::{Connection, SqlitePool};

async fn pool(dir: &tempfile::TempDir) -> SqlitePool {
    let options = SqliteConnectOptions::new()
        .filename(dir.path().join("app.db"))
        .create_if_missing(true)
        .journal_mode(SqliteJournalMode::Wal)
        .busy_timeout(Duration::from_secs(5));
    let pool = SqlitePoolOptions::new()
        .max_connections(4)
        .connect_with(options)
        .await
        .unwrap();
    guard::migrate(&pool).await.unwrap();
    guard::migrate(&pool).await.expect("idempotent");
    sqlx::raw_sql("CREATE TABLE log (resource TEXT, fence INTEGER)")
        .execute(&pool)
        .await
        .unwrap();
    pool
}

/// A write of `log` after the SQL guard, in one `BEGIN IMMEDIATE` transaction.
async fn sql_write(pool: &SqlitePool, resource: &str, fence: i64) -> Result<(), sqlx::Error> {
    let mut tx = pool.begin_with("BEGIN IMMEDIATE").await?;
    sqlx::query("INSERT INTO leasehold_guard_check (resource, fence) VALUES (?1, ?2)")
        .bind(resource)
        .bind(fence)
        .execute(&mut *tx)
        .await?;
    sqlx::query("INSERT INTO log (resource, fence) VALUES (?1, ?2)")
        .bind(resource)
        .bind(fence)
        .execute(&mut *tx)
        .await?;
    tx.commit().await
}

async fn current(pool: &SqlitePool, resource: &str) -> Option<i64> {
    sqlx::query_scalar("SELECT fence FROM leasehold_guard WHERE resource = ?1")
        .bind(resource)
        .fetch_optional(pool)
        .await
        .unwrap()
}

async fn logged(pool: &SqlitePool) -> Vec<i64> {
    sqlx::query_scalar("SELECT fence FROM log ORDER BY rowid")
        .fetch_all(pool)
        .await
        .unwrap()
}

#[tokio::test]
async fn stale_fence_is_rejected_and_rolled_back_equal_and_greater_accepted() {
    let dir = tempfile::tempdir().unwrap();
    let pool = pool(&dir).await;
    sql_write(&pool, "ledger:a", 5).await.expect("first");
    sql_write(&pool, "ledger:a", 5).await.expect("equal");
    sql_write(&pool, "ledger:a", 7).await.expect("greater");
    // A write before the check is rolled back with it.
    let mut tx = pool.begin_with("BEGIN IMMEDIATE").await.unwrap();
    sqlx::query("INSERT INTO log (resource, fence) VALUES ('before', 6)")
        .execute(&mut *tx)
        .await
        .unwrap();
    let err = sqlx::query("INSERT INTO leasehold_guard_check VALUES ('ledger:a', 6)")
        .execute(&mut *tx)
        .await
        .unwrap_err();
    drop(tx);
    assert!(
        err.to_string().contains(guard::FENCE_REJECTED_MESSAGE),
        "{err}"
    );
    let mapped = store_error(err);
    assert_eq!(mapped.kind(), StoreErrorKind::Other);
    assert!(mapped.to_string().contains("stale fence"), "{mapped}");
    assert_eq!(
        logged(&pool).await,
        vec![5, 5, 7],
        "nothing of the stale one"
    );
    assert_eq!(current(&pool, "ledger:a").await, Some(7));
    // Bad input is refused, never accepted.
    for bad in [
        "INSERT INTO leasehold_guard_check VALUES ('', 1)",
        "INSERT INTO leasehold_guard_check VALUES (NULL, 1)",
        "INSERT INTO leasehold_guard_check VALUES ('x', '8')",
        "INSERT INTO leasehold_guard_check VALUES ('x', 1.5)",
        "INSERT INTO leasehold_guard_check VALUES ('x', -1)",
        "INSERT INTO leasehold_guard_check VALUES ('x', NULL)",
        "INSERT INTO leasehold_guard_check VALUES (char(120, 0), 1)",
    ] {
        let err = sqlx::query(bad).execute(&pool).await.unwrap_err();
        assert!(err.to_string().contains("leasehold_guard:"), "{bad}: {err}");
    }
    let long = "x".repeat(513);
    assert!(
        sqlx::query("INSERT INTO leasehold_guard_check VALUES (?1, 1)")
            .bind(&long)
            .execute(&pool)
            .await
            .is_err()
    );
    assert_eq!(current(&pool, "x").await, None);
}

#[tokio::test]
async fn rust_and_sql_callers_share_one_fence_per_resource() {
    let dir = tempfile::tempdir().unwrap();
    let pool = pool(&dir).await;
    let ledger = ResourceName::new("ledger:shared").unwrap();
    let mut tx = pool.begin_with("BEGIN IMMEDIATE").await.unwrap();
    assert!(
        guard::check_and_advance(&mut tx, &ledger, Fence(10))
            .await
            .unwrap()
            .is_accepted()
    );
    tx.commit().await.unwrap();
    assert!(sql_write(&pool, "ledger:shared", 9).await.is_err());
    sql_write(&pool, "ledger:shared", 11).await.unwrap();
    let mut tx = pool.begin_with("BEGIN IMMEDIATE").await.unwrap();
    let d = guard::check_and_advance(&mut tx, &ledger, Fence(10))
        .await
        .unwrap();
    assert_eq!(d, GuardDecision::Rejected { current: Fence(11) });
}

#[tokio::test]
async fn a_stale_snapshot_cannot_pass_the_sql_guard() {
    let dir = tempfile::tempdir().unwrap();
    let pool = pool(&dir).await;
    sql_write(&pool, "ledger:race", 1).await.unwrap();
    // B reads in a deferred transaction (its snapshot sees 1), then A commits 5; B's check
    // with 3 must not pass on its old snapshot.
    let mut b = pool.acquire().await.unwrap();
    let mut b_tx = b.begin().await.unwrap();
    let seen: i64 =
        sqlx::query_scalar("SELECT fence FROM leasehold_guard WHERE resource = 'ledger:race'")
            .fetch_one(&mut *b_tx)
            .await
            .unwrap();
    assert_eq!(seen, 1);
    sql_write(&pool, "ledger:race", 5).await.unwrap();
    let r = sqlx::query("INSERT INTO leasehold_guard_check VALUES ('ledger:race', 3)")
        .execute(&mut *b_tx)
        .await;
    assert!(
        r.is_err(),
        "a stale snapshot is refused (SQLITE_BUSY_SNAPSHOT)"
    );
    drop(b_tx);
    assert_eq!(current(&pool, "ledger:race").await, Some(5));
}

#[tokio::test]
async fn opening_the_store_creates_the_sql_guard() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("leases.db");
    let store = SqliteStore::open(&format!("sqlite://{}", path.display()))
        .await
        .unwrap();
    sqlx::query("INSERT INTO leasehold_guard_check VALUES ('r', 2)")
        .execute(store.pool())
        .await
        .unwrap();
    assert!(
        sqlx::query("INSERT INTO leasehold_guard_check VALUES ('r', 1)")
            .execute(store.pool())
            .await
            .is_err()
    );
}
