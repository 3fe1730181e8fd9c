//! Growth: `prune` deletes the rows of leases that ended long enough ago, never a held
//! lease's row, and fences keep rising on a key whose row was deleted (issue 14.5).

mod common;

use std::time::Duration;

use leasehold_core::{AcquireOutcome, Fence, Key, OwnerToken, Store};
use leasehold_postgres::sqlx;
use leasehold_postgres::{PgAdvisoryStore, PgConfig, PgLeaseStore};
use leasehold_testkit::PostgresOptions;
use tokio::time::sleep;

const TTL: Duration = Duration::from_secs(30);

async fn grant(store: &dyn Store, k: &Key, owner: &OwnerToken) -> Fence {
    match store.acquire(k, owner, TTL).await.unwrap() {
        AcquireOutcome::Acquired { fence, .. } => fence,
        other => panic!("{other:?}"),
    }
}

/// The rows of `table`, by key.
async fn keys(pool: &sqlx::PgPool, table: &str) -> Vec<String> {
    sqlx::query_scalar::<_, String>(sqlx::AssertSqlSafe(format!(
        "SELECT key FROM {table} ORDER BY key"
    )))
    .fetch_all(pool)
    .await
    .unwrap()
}

/// For one store: a released lease's row goes once it is older than the bound, a held
/// lease's row and a recently released one stay, and the next grant on the pruned key
/// has a higher fence than any before.
async fn prunes(
    store: &dyn Store,
    prune: impl AsyncFn(Duration) -> u64,
    pool: &sqlx::PgPool,
    table: &str,
) {
    let (old, recent, held) = (
        Key::new("prune:old").unwrap(),
        Key::new("prune:recent").unwrap(),
        Key::new("prune:held").unwrap(),
    );
    let (a, b, c) = (
        OwnerToken::random(),
        OwnerToken::random(),
        OwnerToken::random(),
    );
    let f_old = grant(store, &old, &a).await;
    store.release(&old, &a).await.unwrap();
    let f_held = grant(store, &held, &c).await;
    sleep(Duration::from_millis(1500)).await;
    grant(store, &recent, &b).await;
    store.release(&recent, &b).await.unwrap();
    // Ended more than a second ago: only `old`.
    assert_eq!(prune(Duration::from_secs(1)).await, 1);
    assert_eq!(keys(pool, table).await, vec!["prune:held", "prune:recent"]);
    // Everything that ended: `recent` too; the held lease stays, whatever the bound.
    assert_eq!(prune(Duration::ZERO).await, 1);
    assert_eq!(keys(pool, table).await, vec!["prune:held"]);
    let info = store.inspect(&held).await.unwrap().expect("still held");
    assert_eq!((info.owner, info.fence), (c, f_held));
    // Fences keep rising on the pruned key (the database clock floor).
    let f_again = grant(store, &old, &OwnerToken::random()).await;
    assert!(f_again > f_old, "{f_old:?} then {f_again:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn prune_deletes_only_ended_leases_and_fences_still_rise() {
    let pg = common::start_pg(PostgresOptions::new()).await;
    let config = PgConfig::from_url(&pg.url()).unwrap().pool_size(2);
    let pool = common::admin_pool(&pg).await;

    let table = PgLeaseStore::connect(&config).await.unwrap();
    table.migrate().await.unwrap();
    prunes(
        &table,
        async |d| table.prune(d).await.unwrap(),
        &pool,
        "leasehold_leases",
    )
    .await;

    let advisory = PgAdvisoryStore::connect(&config).await.unwrap();
    advisory.migrate().await.unwrap();
    prunes(
        &advisory,
        async |d| advisory.prune(d).await.unwrap(),
        &pool,
        "leasehold_advisory",
    )
    .await;
}
