//! The SQL guard procedure `leasehold_guard(resource, fence)` that `guard::migrate`
//! creates, against a private MariaDB: it rejects exactly what the Rust guard rejects
//! (SQLSTATE LH001), serialises concurrent callers even under REPEATABLE READ, shares the
//! fence with the Rust guard, and `guard::schema_sql()` applies with the `mariadb` client.

mod common;

use std::time::Duration;

use leasehold_core::{Fence, GuardDecision, ResourceName, StoreErrorKind};
use leasehold_mysql::{guard, store_error};
use sqlx::mysql::MySqlPoolOptions;
use sqlx::{Connection, MySqlPool};

async fn pool(db: &common::Server) -> MySqlPool {
    let pool = MySqlPoolOptions::new()
        .max_connections(20)
        .connect(&db.url())
        .await
        .unwrap();
    guard::migrate(&pool).await.unwrap();
    guard::migrate(&pool).await.expect("idempotent");
    pool
}

fn sqlstate(e: &sqlx::Error) -> String {
    e.as_database_error()
        .and_then(|d| d.code())
        .map(|c| c.into_owned())
        .unwrap_or_default()
}

async fn current(pool: &MySqlPool, resource: &str) -> Option<u64> {
    sqlx::query_scalar("SELECT fence FROM leasehold_guard WHERE resource = ?")
        .bind(resource)
        .fetch_optional(pool)
        .await
        .unwrap()
}

/// The guard then a write of `log`, in one transaction; rolled back if the guard refuses.
async fn sql_write(pool: &MySqlPool, resource: &str, fence: u64) -> Result<(), sqlx::Error> {
    let mut tx = pool.begin().await?;
    sqlx::query("CALL leasehold_guard(?, ?)")
        .bind(resource)
        .bind(fence)
        .execute(&mut *tx)
        .await?;
    sqlx::query("INSERT INTO log (resource, fence) VALUES (?, ?)")
        .bind(resource)
        .bind(fence)
        .execute(&mut *tx)
        .await?;
    tx.commit().await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stale_fence_is_rejected_equal_and_greater_accepted() {
    let db = common::start_db();
    let pool = pool(&db).await;
    sqlx::raw_sql("CREATE TABLE log (resource VARCHAR(64), fence BIGINT UNSIGNED)")
        .execute(&pool)
        .await
        .unwrap();
    sql_write(&pool, "ledger:a", 5).await.expect("first");
    sql_write(&pool, "ledger:a", 5).await.expect("equal");
    sql_write(&pool, "ledger:a", 7).await.expect("greater");
    let err = sql_write(&pool, "ledger:a", 6).await.unwrap_err();
    assert_eq!(sqlstate(&err), "LH001", "{err}");
    assert_eq!(sqlstate(&err), guard::FENCE_REJECTED_SQLSTATE);
    let text = err.to_string();
    for part in ["fence 6", "ledger:a", "current fence 7"] {
        assert!(text.contains(part), "{part:?} in {text}");
    }
    let mapped = store_error(err);
    assert_eq!(mapped.kind(), StoreErrorKind::Other);
    assert!(mapped.to_string().contains("stale fence"), "{mapped}");
    let logged: Vec<u64> = sqlx::query_scalar("SELECT fence FROM log ORDER BY fence")
        .fetch_all(&pool)
        .await
        .unwrap();
    assert_eq!(
        logged,
        vec![5, 5, 7],
        "the rejected transaction wrote nothing"
    );
    assert_eq!(current(&pool, "ledger:a").await, Some(7));
    for bad in [
        "CALL leasehold_guard('', 1)",
        "CALL leasehold_guard(NULL, 1)",
        "CALL leasehold_guard('x', NULL)",
    ] {
        let err = sqlx::query(bad).execute(&pool).await.unwrap_err();
        assert_eq!(sqlstate(&err), "22023", "{bad}: {err}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rust_and_sql_callers_share_one_fence_per_resource() {
    let db = common::start_db();
    let pool = pool(&db).await;
    let ledger = ResourceName::new("ledger:shared").unwrap();
    let mut tx = pool.begin().await.unwrap();
    assert!(
        guard::check_and_advance(&mut tx, &ledger, Fence(10))
            .await
            .unwrap()
            .is_accepted()
    );
    tx.commit().await.unwrap();
    let err = sqlx::query("CALL leasehold_guard('ledger:shared', 9)")
        .execute(&pool)
        .await
        .unwrap_err();
    assert_eq!(sqlstate(&err), "LH001");
    sqlx::query("CALL leasehold_guard('ledger:shared', 11)")
        .execute(&pool)
        .await
        .unwrap();
    let mut tx = pool.begin().await.unwrap();
    let d = guard::check_and_advance(&mut tx, &ledger, Fence(10))
        .await
        .unwrap();
    assert_eq!(d, GuardDecision::Rejected { current: Fence(11) });
    tx.rollback().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_callers_serialise_even_under_repeatable_read() {
    let db = common::start_db();
    let pool = pool(&db).await;
    sqlx::query("CALL leasehold_guard('ledger:race', 1)")
        .execute(&pool)
        .await
        .unwrap();
    // B opens a REPEATABLE READ snapshot that sees fence 1 before A commits 5; B's call
    // with 3 must wait for A's row lock and then refuse (a snapshot read would pass it).
    let mut b = sqlx::MySqlConnection::connect(&db.url()).await.unwrap();
    sqlx::raw_sql("SET SESSION TRANSACTION ISOLATION LEVEL REPEATABLE READ")
        .execute(&mut b)
        .await
        .unwrap();
    sqlx::raw_sql("START TRANSACTION")
        .execute(&mut b)
        .await
        .unwrap();
    let seen: u64 =
        sqlx::query_scalar("SELECT fence FROM leasehold_guard WHERE resource = 'ledger:race'")
            .fetch_one(&mut b)
            .await
            .unwrap();
    assert_eq!(seen, 1);
    let mut a = sqlx::MySqlConnection::connect(&db.url()).await.unwrap();
    let mut a_tx = a.begin().await.unwrap();
    sqlx::query("CALL leasehold_guard('ledger:race', 5)")
        .execute(&mut *a_tx)
        .await
        .unwrap();
    let b_call = tokio::spawn(async move {
        let r = sqlx::query("CALL leasehold_guard('ledger:race', 3)")
            .execute(&mut b)
            .await
            .map(|_| ());
        (r, tokio::time::Instant::now(), b)
    });
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert!(!b_call.is_finished(), "B waits on the row A locked");
    let committed_at = tokio::time::Instant::now();
    a_tx.commit().await.unwrap();
    let (r, finished_at, mut b) = b_call.await.unwrap();
    assert!(finished_at >= committed_at);
    let err = r.unwrap_err();
    assert_eq!(sqlstate(&err), "LH001", "{err}");
    assert!(err.to_string().contains("current fence 5"), "{err}");
    sqlx::raw_sql("ROLLBACK").execute(&mut b).await.unwrap();
    assert_eq!(current(&pool, "ledger:race").await, Some(5));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_printed_script_applies_with_the_mariadb_client_twice() {
    let db = common::start_db();
    let script = guard::schema_sql();
    for _ in 0..2 {
        let mut cmd = db.client_command();
        cmd.arg("test").stdin(std::process::Stdio::piped());
        let mut child = cmd
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .unwrap();
        use std::io::Write;
        child
            .stdin
            .take()
            .unwrap()
            .write_all(script.as_bytes())
            .unwrap();
        let out = child.wait_with_output().unwrap();
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
    db.sql("CALL leasehold_guard('r', 4)");
    let err = db.try_sql("CALL leasehold_guard('r', 3)").unwrap_err();
    assert!(err.contains("current fence 4"), "{err}");
}
