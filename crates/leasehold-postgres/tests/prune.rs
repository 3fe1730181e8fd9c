//! Growth: `prune` deletes the rows of leases that ended long enough ago, never a held
//! lease's row, and fences keep rising on a key whose row was deleted (issue 14.5).

mod common;

use leasehold_conformance::growth::prune_deletes_only_ended_leases_and_fences_still_rise as check;
use leasehold_postgres::sqlx;
use leasehold_postgres::{PgAdvisoryStore, PgConfig, PgLeaseStore};
use leasehold_testkit::PostgresOptions;

/// The keys with a row in `table`.
async fn keys(pool: &sqlx::PgPool, table: &str) -> Vec<String> {
    sqlx::query_scalar::<_, String>(sqlx::AssertSqlSafe(format!(
        "SELECT key FROM {table} ORDER BY key"
    )))
    .fetch_all(pool)
    .await
    .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn prune_deletes_only_ended_leases_and_fences_still_rise() {
    let pg = common::start_pg(PostgresOptions::new()).await;
    let config = PgConfig::from_url(&pg.url()).unwrap().pool_size(2);
    let pool = common::admin_pool(&pg).await;

    let table = PgLeaseStore::connect(&config).await.unwrap();
    table.migrate().await.unwrap();
    check(
        &table,
        async |d| table.prune(d).await.unwrap(),
        async || keys(&pool, "leasehold_leases").await,
    )
    .await;

    let advisory = PgAdvisoryStore::connect(&config).await.unwrap();
    advisory.migrate().await.unwrap();
    check(
        &advisory,
        async |d| advisory.prune(d).await.unwrap(),
        async || keys(&pool, "leasehold_advisory").await,
    )
    .await;
}
