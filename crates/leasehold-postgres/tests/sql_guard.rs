//! The SQL guard function `leasehold_guard(resource, fence)` that `guard::migrate` installs,
//! against a private PostgreSQL: it rejects exactly what the Rust guard rejects, raises
//! SQLSTATE LH001 (aborting the transaction), serialises concurrent callers, shares the
//! fence with the Rust guard, and is created by a migration of tables that already exist.

mod common;

use std::sync::Arc;
use std::time::Duration;

use leasehold_core::{Fence, GuardDecision, ResourceName, StoreErrorKind};
use leasehold_postgres::sqlx::{self, Connection, PgPool, postgres::PgPoolOptions};
use leasehold_postgres::{PgConfig, PgGuard, guard, store_error};
use leasehold_testkit::PostgresOptions;

async fn setup() -> (leasehold_testkit::Postgres, PgPool) {
    let pg = common::start_pg(PostgresOptions::new()).await;
    let pool = PgPoolOptions::new()
        .max_connections(8)
        .connect(&pg.url())
        .await
        .unwrap();
    guard::migrate(&pool).await.unwrap();
    guard::migrate(&pool).await.expect("idempotent");
    (pg, pool)
}

/// Calls the SQL guard in a transaction that then writes a row of `log` and commits.
async fn sql_write(pool: &PgPool, resource: &str, fence: i64) -> Result<(), sqlx::Error> {
    let mut tx = pool.begin().await?;
    sqlx::query("SELECT leasehold_guard($1, $2)")
        .bind(resource)
        .bind(fence)
        .execute(&mut *tx)
        .await?;
    sqlx::query("INSERT INTO log (resource, fence) VALUES ($1, $2)")
        .bind(resource)
        .bind(fence)
        .execute(&mut *tx)
        .await?;
    tx.commit().await
}

fn sqlstate(e: &sqlx::Error) -> String {
    e.as_database_error()
        .and_then(|d| d.code())
        .map(|c| c.into_owned())
        .unwrap_or_default()
}

async fn current(pool: &PgPool, resource: &str) -> Option<i64> {
    sqlx::query_scalar("SELECT fence FROM leasehold_guard WHERE resource = $1")
        .bind(resource)
        .fetch_optional(pool)
        .await
        .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stale_fence_is_rejected_equal_and_greater_accepted() {
    let (_pg, pool) = setup().await;
    sqlx::raw_sql("CREATE TABLE log (resource text, fence bigint)")
        .execute(&pool)
        .await
        .unwrap();
    // First write of a resource: accepted, previous fence NULL.
    let prev: Option<i64> = sqlx::query_scalar("SELECT leasehold_guard('ledger:a', 5)")
        .fetch_one(&pool)
        .await
        .unwrap();
    assert_eq!(prev, None);
    // Equal (one holder writing twice) and greater: accepted, returning the previous fence.
    let prev: Option<i64> = sqlx::query_scalar("SELECT leasehold_guard('ledger:a', 5)")
        .fetch_one(&pool)
        .await
        .unwrap();
    assert_eq!(prev, Some(5));
    sql_write(&pool, "ledger:a", 7).await.expect("greater");
    assert_eq!(current(&pool, "ledger:a").await, Some(7));
    // Lower: LH001, the transaction aborted, its write not committed.
    let err = sql_write(&pool, "ledger:a", 6).await.unwrap_err();
    assert_eq!(sqlstate(&err), "LH001", "{err}");
    assert_eq!(sqlstate(&err), guard::FENCE_REJECTED_SQLSTATE);
    let text = err.to_string();
    for part in ["fence 6", "'ledger:a'", "current fence is 7"] {
        assert!(text.contains(part), "{part:?} in {text}");
    }
    let mapped = store_error(err);
    assert_eq!(mapped.kind(), StoreErrorKind::Other);
    assert!(mapped.to_string().contains("stale fence"), "{mapped}");
    let logged: Vec<i64> = sqlx::query_scalar("SELECT fence FROM log ORDER BY fence")
        .fetch_all(&pool)
        .await
        .unwrap();
    assert_eq!(logged, vec![7], "the rejected transaction wrote nothing");
    assert_eq!(current(&pool, "ledger:a").await, Some(7));
    // Bad input is refused with 22023, not silently accepted.
    for bad in [
        "SELECT leasehold_guard('', 1)",
        "SELECT leasehold_guard(NULL, 1)",
        "SELECT leasehold_guard('x', NULL)",
        "SELECT leasehold_guard('x', -1)",
    ] {
        let err = sqlx::query(bad).execute(&pool).await.unwrap_err();
        assert_eq!(sqlstate(&err), "22023", "{bad}: {err}");
    }
    let long = "x".repeat(513);
    let err = sqlx::query("SELECT leasehold_guard($1, 1)")
        .bind(&long)
        .execute(&pool)
        .await
        .unwrap_err();
    assert_eq!(sqlstate(&err), "22023");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rust_and_sql_callers_share_one_fence_per_resource() {
    let (_pg, pool) = setup().await;
    let ledger = ResourceName::new("ledger:shared").unwrap();
    // Rust accepts 10; SQL with 9 is refused, with 10 and 11 accepted.
    let mut tx = pool.begin().await.unwrap();
    let d = guard::check_and_advance(&mut tx, &ledger, Fence(10))
        .await
        .unwrap();
    assert!(d.is_accepted());
    tx.commit().await.unwrap();
    let err = sqlx::query("SELECT leasehold_guard('ledger:shared', 9)")
        .execute(&pool)
        .await
        .unwrap_err();
    assert_eq!(sqlstate(&err), "LH001");
    sqlx::query("SELECT leasehold_guard('ledger:shared', 10)")
        .execute(&pool)
        .await
        .unwrap();
    sqlx::query("SELECT leasehold_guard('ledger:shared', 11)")
        .execute(&pool)
        .await
        .unwrap();
    // The Rust guard now sees SQL's 11: 10 is rejected with current 11, 11 accepted.
    let mut tx = pool.begin().await.unwrap();
    let d = guard::check_and_advance(&mut tx, &ledger, Fence(10))
        .await
        .unwrap();
    assert_eq!(d, GuardDecision::Rejected { current: Fence(11) });
    tx.rollback().await.unwrap();
    let mut tx = pool.begin().await.unwrap();
    let d = guard::check_and_advance(&mut tx, &ledger, Fence(11))
        .await
        .unwrap();
    assert_eq!(
        d,
        GuardDecision::Accepted {
            previous: Some(Fence(11))
        }
    );
    tx.commit().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_sql_callers_serialise_on_the_guard_row() {
    let (pg, pool) = setup().await;
    sqlx::query("SELECT leasehold_guard('ledger:race', 1)")
        .execute(&pool)
        .await
        .unwrap();
    // A holds the row with fence 5 in an open transaction; B's call with 3 must wait for A,
    // then see 5 and be rejected (it must not read the old 1 and pass).
    let mut a = sqlx::PgConnection::connect(&pg.url()).await.unwrap();
    let mut a_tx = a.begin().await.unwrap();
    sqlx::query("SELECT leasehold_guard('ledger:race', 5)")
        .execute(&mut *a_tx)
        .await
        .unwrap();
    let b_pool = pool.clone();
    let b = tokio::spawn(async move {
        let mut tx = b_pool.begin().await.unwrap();
        let r = sqlx::query("SELECT leasehold_guard('ledger:race', 3)")
            .execute(&mut *tx)
            .await;
        (r.map(|_| ()), tokio::time::Instant::now())
    });
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert!(!b.is_finished(), "B waits on the row A locked");
    let committed_at = tokio::time::Instant::now();
    a_tx.commit().await.unwrap();
    let (r, finished_at) = b.await.unwrap();
    assert!(finished_at >= committed_at);
    let err = r.unwrap_err();
    assert_eq!(sqlstate(&err), "LH001", "{err}");
    assert!(err.to_string().contains("current fence is 5"), "{err}");

    // Many concurrent callers with random fences on one resource: the fences accepted, in
    // commit order, never go down, and the guard ends at the highest.
    sqlx::raw_sql("CREATE TABLE accepted (n bigserial PRIMARY KEY, fence bigint)")
        .execute(&pool)
        .await
        .unwrap();
    let pool = Arc::new(pool);
    let tasks: Vec<_> = (0..16_i64)
        .map(|i| {
            let pool = pool.clone();
            tokio::spawn(async move {
                let fence = 100 + (i * 7919) % 23;
                let mut tx = pool.begin().await.unwrap();
                let r = sqlx::query("SELECT leasehold_guard('ledger:many', $1)")
                    .bind(fence)
                    .execute(&mut *tx)
                    .await;
                match r {
                    Ok(_) => {
                        sqlx::query("INSERT INTO accepted (fence) VALUES ($1)")
                            .bind(fence)
                            .execute(&mut *tx)
                            .await
                            .unwrap();
                        tx.commit().await.unwrap();
                        true
                    }
                    Err(e) => {
                        assert_eq!(sqlstate(&e), "LH001", "{e}");
                        false
                    }
                }
            })
        })
        .collect();
    for t in tasks {
        t.await.unwrap();
    }
    // The serial number is taken inside the row lock, so it orders the accepted writes.
    let fences: Vec<i64> = sqlx::query_scalar("SELECT fence FROM accepted ORDER BY n")
        .fetch_all(&*pool)
        .await
        .unwrap();
    assert!(!fences.is_empty());
    assert!(fences.windows(2).all(|w| w[0] <= w[1]), "{fences:?}");
    let max = (0..16_i64).map(|i| 100 + (i * 7919) % 23).max().unwrap();
    assert_eq!(current(&pool, "ledger:many").await, Some(max));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn migrating_existing_tables_adds_the_function_and_a_schema_gets_its_own() {
    let pg = common::start_pg(PostgresOptions::new()).await;
    let pool = PgPoolOptions::new()
        .max_connections(2)
        .connect(&pg.url())
        .await
        .unwrap();
    // Tables from before the function existed: the migration must still install it.
    sqlx::raw_sql(
        "CREATE TABLE leasehold_guard (resource text COLLATE \"C\" PRIMARY KEY, \
         fence bigint NOT NULL, previous_fence bigint, \
         updated_at timestamptz NOT NULL DEFAULT clock_timestamp()); \
         CREATE TABLE leasehold_idempotency (job_id text COLLATE \"C\" PRIMARY KEY, \
         done_at timestamptz NOT NULL DEFAULT clock_timestamp())",
    )
    .execute(&pool)
    .await
    .unwrap();
    guard::migrate(&pool).await.unwrap();
    sqlx::query("SELECT leasehold_guard('r', 1)")
        .execute(&pool)
        .await
        .unwrap();
    // With leasehold_schema=locks the guard and its function live in "locks".
    let config = PgConfig::from_url(&format!("{}?leasehold_schema=locks", pg.url())).unwrap();
    let g: PgGuard = config.guard();
    assert_eq!(g.function_name(), "\"locks\".leasehold_guard");
    g.migrate(&pool).await.unwrap();
    sqlx::query("SELECT locks.leasehold_guard('r', 3)")
        .execute(&pool)
        .await
        .unwrap();
    let in_locks: i64 =
        sqlx::query_scalar("SELECT fence FROM locks.leasehold_guard WHERE resource = 'r'")
            .fetch_one(&pool)
            .await
            .unwrap();
    assert_eq!(in_locks, 3);
    assert_eq!(current(&pool, "r").await, Some(1), "public is separate");
    assert!(
        g.schema_sql()
            .contains("CREATE OR REPLACE FUNCTION \"locks\".leasehold_guard")
    );
}
