//! Shared test helpers: a private PostgreSQL (optionally behind a fault proxy) and the
//! stores on it.
#![allow(dead_code, unreachable_pub)]

use std::time::Duration;

use leasehold_postgres::sqlx::{self, PgPool, postgres::PgPoolOptions};
use leasehold_postgres::{PgConfig, PgLeaseStore};
use leasehold_testkit::{FaultProxy, Postgres, PostgresOptions};

/// A private server, started off the async runtime (initdb takes about a second).
pub async fn start_pg(opts: PostgresOptions) -> Postgres {
    tokio::task::spawn_blocking(move || Postgres::start_with(opts))
        .await
        .expect("postgres start")
}

/// `postgres://postgres@127.0.0.1:PORT/postgres` for `addr`'s port.
pub fn url_for(addr: std::net::SocketAddr) -> String {
    format!("postgres://postgres@127.0.0.1:{}/postgres", addr.port())
}

/// A small admin pool straight to the server (not through any proxy).
pub async fn admin_pool(pg: &Postgres) -> PgPool {
    PgPoolOptions::new()
        .max_connections(4)
        .connect(&pg.url())
        .await
        .expect("admin pool")
}

/// A lease-table store on `url`, migrated.
pub async fn table_store(url: &str) -> PgLeaseStore {
    let store = PgLeaseStore::connect(&PgConfig::from_url(url).unwrap())
        .await
        .expect("connect lease-table store");
    store.migrate().await.expect("migrate");
    store
}

/// Runs `sql` as the superuser through psql, off the runtime.
pub async fn psql(pg: &std::sync::Arc<Postgres>, sql: &str) -> String {
    let pg = pg.clone();
    let sql = sql.to_owned();
    tokio::task::spawn_blocking(move || pg.psql(&sql))
        .await
        .unwrap()
}

/// Keeps everything a fixture needs alive.
pub struct Servers {
    pub pg: std::sync::Arc<Postgres>,
    pub proxy: Option<FaultProxy>,
}

/// Polls `f` every 20 ms until it returns `Some`, for at most `within`.
pub async fn eventually<T, F, Fut>(within: Duration, mut f: F) -> Option<T>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Option<T>>,
{
    let deadline = tokio::time::Instant::now() + within;
    loop {
        if let Some(v) = f().await {
            return Some(v);
        }
        if tokio::time::Instant::now() >= deadline {
            return None;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

pub fn unused(_: &sqlx::Error) {}
