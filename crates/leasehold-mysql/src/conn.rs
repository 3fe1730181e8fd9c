//! Connections: the pool, dedicated connections, bounds and cleanup.

use std::future::Future;
use std::time::Duration;

use leasehold_core::{StoreError, StoreErrorKind};
use sqlx::AssertSqlSafe;
use sqlx::mysql::{MySqlConnectOptions, MySqlPool, MySqlPoolOptions};
use sqlx::pool::PoolConnection;
use sqlx::{ConnectOptions, Connection, Executor, MySql, MySqlConnection};

use crate::config::MySqlConfig;
use crate::error::{Failure, Phase, error_number};

/// Pooled connections idle for longer than this are pinged before use.
const IDLE_PING_AFTER: Duration = Duration::from_secs(2);

/// The pool and the settings every connection gets, shared by both stores.
pub(crate) struct Db {
    pub(crate) config: MySqlConfig,
    pub(crate) backend: &'static str,
    pub(crate) pool: MySqlPool,
    options: MySqlConnectOptions,
}

/// A pooled connection that is closed instead of returned to the pool unless the
/// operation using it ran to its end without breaking it.
pub(crate) struct Checkout {
    pub(crate) conn: PoolConnection<MySql>,
    pub(crate) keep: bool,
}

impl Drop for Checkout {
    fn drop(&mut self) {
        if !self.keep {
            self.conn.close_on_drop();
        }
    }
}

/// Per-session settings: READ COMMITTED (no gap locks in the stores' own transactions) and
/// a lock wait bounded by the operation timeout.
pub(crate) async fn setup_session(
    conn: &mut MySqlConnection,
    lock_wait_secs: u64,
) -> Result<(), sqlx::Error> {
    conn.execute("SET SESSION TRANSACTION ISOLATION LEVEL READ COMMITTED")
        .await?;
    conn.execute(AssertSqlSafe(format!(
        "SET SESSION innodb_lock_wait_timeout = {lock_wait_secs}"
    )))
    .await?;
    Ok(())
}

impl Db {
    pub(crate) fn new(config: MySqlConfig, backend: &'static str) -> Result<Self, StoreError> {
        config.validate()?;
        let options = config.connect_options();
        let lock_wait = config.lock_wait_secs();
        let pool = MySqlPoolOptions::new()
            .max_connections(config.get_max_connections())
            .min_connections(0)
            .acquire_timeout(config.get_connect_timeout())
            .idle_timeout(Duration::from_secs(300))
            // A ping per checkout would add a round trip to every operation; connections
            // that sat idle for a while are pinged (a server restart is found there), and
            // a connection that breaks in use is closed, not pooled again.
            .test_before_acquire(false)
            .before_acquire(|conn, meta| {
                Box::pin(async move {
                    if meta.idle_for > IDLE_PING_AFTER {
                        conn.ping().await?;
                    }
                    Ok(true)
                })
            })
            .after_connect(move |conn, _meta| Box::pin(setup_session(conn, lock_wait)))
            .connect_lazy_with(options.clone());
        Ok(Self {
            config,
            backend,
            pool,
            options,
        })
    }

    pub(crate) fn secret(&self) -> Option<&str> {
        self.config.secret()
    }

    pub(crate) fn error(&self, f: Failure, op: &str, phase: Phase) -> StoreError {
        f.into_store(self.backend, op, phase, self.secret())
    }

    /// Bounds `fut` by the operation timeout.
    pub(crate) async fn bounded<T>(
        &self,
        op: &str,
        fut: impl Future<Output = Result<T, StoreError>>,
    ) -> Result<T, StoreError> {
        let bound = self.config.get_timeout();
        tokio::time::timeout(bound, fut)
            .await
            .unwrap_or_else(|_| Err(StoreError::timeout(self.backend, op, bound)))
    }

    pub(crate) async fn checkout(&self, op: &str) -> Result<Checkout, StoreError> {
        let conn = self
            .pool
            .acquire()
            .await
            .map_err(|e| self.error(e.into(), op, Phase::Connect))?;
        Ok(Checkout { conn, keep: false })
    }

    /// A connection outside the pool (the GET_LOCK store's lock sessions), bounded by the
    /// connect timeout.
    pub(crate) async fn dedicated(&self, op: &str) -> Result<MySqlConnection, StoreError> {
        let bound = self.config.get_connect_timeout();
        let connect = async {
            let mut conn = self.options.connect().await?;
            setup_session(&mut conn, self.config.lock_wait_secs()).await?;
            Ok::<_, sqlx::Error>(conn)
        };
        match tokio::time::timeout(bound, connect).await {
            Ok(Ok(conn)) => Ok(conn),
            Ok(Err(e)) => Err(self.error(e.into(), op, Phase::Connect)),
            Err(_) => Err(StoreError::new(
                StoreErrorKind::Unavailable,
                self.backend,
                format!("{op}: no connection within {bound:?}"),
            )),
        }
    }

    /// Creates the tables of `schema` unless `probe` (a table name) exists. A user without
    /// the CREATE privilege works as long as the tables were created for it.
    pub(crate) async fn ensure_tables(
        &self,
        probe: &'static str,
        schema: &'static str,
    ) -> Result<(), StoreError> {
        let mut c = self.checkout("migrate").await?;
        let probe_sql = AssertSqlSafe(format!("SELECT 1 FROM {probe} LIMIT 0"));
        let result = match c.conn.execute(probe_sql).await {
            Ok(_) => Ok(()),
            Err(e) if error_number(&e) == Some(1146) => sqlx::raw_sql(schema)
                .execute(&mut *c.conn)
                .await
                .map(|_| ()),
            Err(e) => Err(e),
        };
        c.keep = result.is_ok();
        result.map_err(|e| self.error(e.into(), "migrate", Phase::Statement))
    }
}

/// Runs `$body` (which yields `Result<T, Failure>`) with `$conn: &mut MySqlConnection`
/// from the pool, bounded by the operation timeout; the connection is closed rather than
/// pooled if the body is cancelled, times out or breaks it.
macro_rules! with_conn {
    ($db:expr, $op:expr, |$conn:ident| $body:expr) => {{
        let db: &$crate::conn::Db = &$db;
        let op: &str = $op;
        db.bounded(op, async {
            let mut checkout = db.checkout(op).await?;
            let result: Result<_, $crate::error::Failure> = {
                let $conn: &mut ::sqlx::MySqlConnection = &mut checkout.conn;
                $body.await
            };
            checkout.keep = match &result {
                Ok(_) => true,
                Err(f) => !f.poisons_connection(),
            };
            result.map_err(|f| db.error(f, op, $crate::error::Phase::Statement))
        })
        .await
    }};
}
pub(crate) use with_conn;
