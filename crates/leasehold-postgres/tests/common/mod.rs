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

/// The conformance suite's stale-writer case writes through the PostgreSQL guard: the
/// guard check and an upsert of `conformance_data`, in one transaction.
pub struct PgWrites {
    pool: PgPool,
}

impl PgWrites {
    /// Creates the guard tables and the data table on `pool`.
    pub async fn new(pool: PgPool) -> Self {
        leasehold_postgres::guard::migrate(&pool)
            .await
            .expect("guard tables");
        sqlx::raw_sql(
            "CREATE TABLE IF NOT EXISTS conformance_data (resource text PRIMARY KEY, value text NOT NULL)",
        )
        .execute(&pool)
        .await
        .expect("data table");
        Self { pool }
    }
}

#[async_trait::async_trait]
impl leasehold_conformance::FencedWrites for PgWrites {
    async fn write(
        &self,
        resource: &str,
        fence: leasehold_core::Fence,
        value: &str,
    ) -> Result<bool, leasehold_core::StoreError> {
        use leasehold_postgres::store_error;
        let name =
            leasehold_core::ResourceName::new(resource).expect("the suite's names are valid");
        let mut tx = self.pool.begin().await.map_err(store_error)?;
        if !leasehold_postgres::guard::check_and_advance(&mut tx, &name, fence)
            .await?
            .is_accepted()
        {
            tx.rollback().await.map_err(store_error)?;
            return Ok(false);
        }
        sqlx::query(
            "INSERT INTO conformance_data (resource, value) VALUES ($1, $2) \
             ON CONFLICT (resource) DO UPDATE SET value = EXCLUDED.value",
        )
        .bind(resource)
        .bind(value)
        .execute(&mut *tx)
        .await
        .map_err(store_error)?;
        tx.commit().await.map_err(store_error)?;
        Ok(true)
    }

    async fn read(&self, resource: &str) -> Result<Option<String>, leasehold_core::StoreError> {
        sqlx::query_scalar("SELECT value FROM conformance_data WHERE resource = $1")
            .bind(resource)
            .fetch_optional(&self.pool)
            .await
            .map_err(leasehold_postgres::store_error)
    }
}

/// A store's queue of waiters as the server holds it: each waiter is a session in the
/// server's advisory-lock queue (one key is waited on at a time in the tests that read it).
/// In the advisory store the queue waits for the lease's lock itself: the sessions whose
/// advisory lock is not granted. In the lease-table store it waits for a turnstile whose
/// head holds it (a session-level lock, on a session idle outside any transaction, unlike
/// the transaction-scoped try of an acquire) while the others wait for it.
pub struct PgQueue {
    pub pool: PgPool,
    pub table: bool,
}

#[async_trait::async_trait]
impl leasehold_conformance::Queue for PgQueue {
    async fn waiting(&self, _: &leasehold_core::Key) -> usize {
        let sql = if self.table {
            "SELECT count(DISTINCT l.pid) FROM pg_locks l JOIN pg_stat_activity a ON a.pid = l.pid \
             WHERE l.locktype = 'advisory' AND (NOT l.granted OR a.state = 'idle')"
        } else {
            "SELECT count(DISTINCT pid) FROM pg_locks WHERE locktype = 'advisory' AND NOT granted"
        };
        let n: i64 = sqlx::query_scalar(sql)
            .fetch_one(&self.pool)
            .await
            .expect("read the lock queue");
        usize::try_from(n).expect("a count")
    }
}

/// [`PgQueue`] of the lease-table store on `pg`, for the waiting suite.
pub async fn table_queue(pg: &Postgres) -> Box<dyn leasehold_conformance::Queue> {
    Box::new(PgQueue {
        pool: admin_pool(pg).await,
        table: true,
    })
}

/// [`PgQueue`] of the advisory store on `pg`, for the waiting suite.
pub async fn advisory_queue(pg: &Postgres) -> Box<dyn leasehold_conformance::Queue> {
    Box::new(PgQueue {
        pool: admin_pool(pg).await,
        table: false,
    })
}
