//! Connections: the pool, dedicated connections, bounds and cleanup.

use std::future::Future;
use std::time::Duration;

use leasehold_core::{Refusal, StoreError, StoreErrorKind};
use leasehold_sql::tls::TlsProblem;
use leasehold_sql::{ErrorModel, Failure, Phase, with_conn};
use sqlx::AssertSqlSafe;
use sqlx::mysql::{MySqlConnectOptions, MySqlPool, MySqlPoolOptions};
use sqlx::{ConnectOptions, Connection, Executor, MySqlConnection};

use crate::config::MySqlConfig;
use crate::error::{breaks_connection, error_number, map_sqlx};
use crate::schema::RECORDS_SCHEMA;

/// Pooled connections idle for longer than this are pinged before use.
const IDLE_PING_AFTER: Duration = Duration::from_secs(2);

/// The pool and the settings every connection gets, shared by both stores.
pub(crate) struct Db {
    pub(crate) config: MySqlConfig,
    pub(crate) backend: &'static str,
    pub(crate) pool: MySqlPool,
    options: MySqlConnectOptions,
}

/// The table a store keeps its rows in, created by [`Db::migrate`].
#[derive(Debug, Clone, Copy)]
pub(crate) struct StoreTable {
    /// Its name.
    pub(crate) name: &'static str,
    /// Its `CREATE TABLE IF NOT EXISTS` statement.
    pub(crate) schema: &'static str,
}

/// The records table both stores share.
pub(crate) const RECORDS_TABLE: StoreTable = StoreTable {
    name: "leasehold_records",
    schema: RECORDS_SCHEMA,
};

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
        leasehold_sql::tls::install_provider();
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
        f.into_store(self, op, phase)
    }

    /// [`StoreError::bounded`] by this store's operation timeout.
    pub(crate) async fn bounded<T>(
        &self,
        op: &str,
        fut: impl Future<Output = Result<T, StoreError>>,
    ) -> Result<T, StoreError> {
        StoreError::bounded(self.backend, op, self.config.get_timeout(), fut).await
    }

    /// Runs `body` on a pooled connection, bounded by the operation timeout; the connection
    /// is closed rather than pooled if the body is cancelled, times out or breaks it.
    pub(crate) async fn run<T>(
        &self,
        op: &str,
        body: impl AsyncFnOnce(&mut MySqlConnection) -> Result<T, Failure>,
    ) -> Result<T, StoreError> {
        self.bounded(op, with_conn(&self.pool, self, op, body))
            .await
    }

    /// Gets a store ready when it connects: with `migrate` on (the default) creates its
    /// table if missing, otherwise checks that the table is there.
    pub(crate) async fn prepare(&self, table: StoreTable) -> Result<(), StoreError> {
        match self.prepare_tables(table).await {
            Err(e) if e.refusal() == Some(Refusal::Credentials) => {
                Err(self.diagnose_plaintext(e).await)
            }
            other => other,
        }
    }

    /// A plaintext connection refused as "access denied" (1045): MariaDB answers so under
    /// `require_secure_transport=ON`, and for an account that `REQUIRE`s SSL, just as for a
    /// wrong password. With `ssl-mode=DISABLED`, one more connection is tried with TLS
    /// (not verified: no more trust than the plaintext one asked for); if the server
    /// admits it, the refusal was for the plaintext and `e` becomes that TLS failure.
    async fn diagnose_plaintext(&self, e: StoreError) -> StoreError {
        if self.config.get_ssl_mode() != crate::SslMode::Disabled {
            return e;
        }
        let with_tls = self
            .options
            .clone()
            .ssl_mode(sqlx::mysql::MySqlSslMode::Required);
        let probe = tokio::time::timeout(self.config.get_connect_timeout(), with_tls.connect());
        match probe.await {
            Ok(Ok(conn)) => {
                let _ = conn.close().await;
                let tls = leasehold_sql::tls::failure(
                    TlsProblem::PlaintextRefused,
                    Some(self.config.get_host()),
                    "the server denies this account without TLS and admits it with TLS \
                     (require_secure_transport, or an account that REQUIREs SSL)",
                );
                crate::error::tls_error(self.backend, "connecting", tls)
            }
            _ => e,
        }
    }

    async fn prepare_tables(&self, table: StoreTable) -> Result<(), StoreError> {
        if self.config.get_migrate() {
            self.migrate(table).await?;
            // The records table is not required to open a store: a database set up before
            // records existed (by an account that may not create tables, or with
            // `migrate=false`, where it is not probed) keeps working for leases, and a
            // record call then answers `Config` ("run migrate").
            if let Err(e) = self.migrate(RECORDS_TABLE).await {
                if e.kind() != StoreErrorKind::Config {
                    return Err(e);
                }
                tracing::warn!(backend = self.backend, error = %e, "the records table leasehold_records is missing and cannot be created: records are unavailable until it is (leasehold migrate)");
            }
        } else {
            let probe = AssertSqlSafe(format!("SELECT 1 FROM {} LIMIT 0", table.name));
            self.run("connect", async |conn| {
                conn.execute(probe).await?;
                Ok(())
            })
            .await?;
        }
        tracing::debug!(config = %self.config, backend = self.backend, "mysql store connected");
        Ok(())
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

    /// Runs a store's `prune` statement, `sql`, whose one parameter is `older_than` in µs
    /// (see [`leasehold_sql::prune_age_us`]); the number of rows deleted.
    pub(crate) async fn prune(
        &self,
        sql: &'static str,
        older_than: Duration,
    ) -> Result<u64, StoreError> {
        let us = leasehold_sql::prune_age_us(older_than);
        self.run("prune", async move |conn| {
            Ok(sqlx::query(sql)
                .bind(us)
                .execute(conn)
                .await?
                .rows_affected())
        })
        .await
    }

    /// Creates `table` unless it exists (no DDL is sent when it does). A user without the
    /// CREATE privilege works as long as the table was created for it.
    pub(crate) async fn migrate(&self, table: StoreTable) -> Result<(), StoreError> {
        let probe = AssertSqlSafe(format!("SELECT 1 FROM {} LIMIT 0", table.name));
        self.run("migrate", async |conn| match conn.execute(probe).await {
            Ok(_) => Ok(()),
            Err(e) if error_number(&e) == Some(1146) => {
                sqlx::raw_sql(table.schema).execute(conn).await?;
                Ok(())
            }
            Err(e) => Err(e.into()),
        })
        .await
    }
}

impl ErrorModel for Db {
    fn breaks_connection(&self, err: &sqlx::Error) -> bool {
        breaks_connection(err)
    }

    fn store_error(&self, err: sqlx::Error, op: &str, phase: Phase) -> StoreError {
        if let Some(tls) = crate::error::tls_failure(&err, self.config.has_client_key()) {
            let host = self.config.get_host();
            return crate::error::scrub(
                crate::error::tls_error(self.backend, op, tls.or_host(host)),
                self.secret(),
            );
        }
        map_sqlx(err, self.backend, op, phase, self.secret())
    }
}

/// Ends the session `id` from another session (`KILL CONNECTION`), then drops `conn`:
/// a session blocked in `GET_LOCK` leaves the server's queue at once, and a lock it holds
/// is freed at once. Dropping `conn` alone would leave a queued request in the server until
/// it is granted. Does nothing outside a Tokio runtime (the socket is closed then, which
/// ends the session once the server notices).
pub(crate) fn kill_session(
    db: &std::sync::Arc<Db>,
    conn: MySqlConnection,
    id: u64,
    op: &'static str,
) {
    let db = db.clone();
    if tokio::runtime::Handle::try_current().is_err() {
        return;
    }
    tokio::spawn(async move {
        let kill = AssertSqlSafe(format!("KILL CONNECTION {id}"));
        let r = db
            .run(op, async |c| {
                c.execute(kill).await?;
                Ok(())
            })
            .await;
        if let Err(e) = r {
            tracing::debug!(error = %e, "killing a session failed; it is dropped");
        }
        drop(conn);
    });
}

/// The methods both stores offer on their [`Db`] (`self.db`), written once: `migrate`
/// (`$table`, the store's own table, and the records table), `config` and `pool`.
macro_rules! db_methods {
    ($table:expr) => {
        /// Creates the store's table ([`LEASES_SCHEMA`](crate::LEASES_SCHEMA) or
        /// [`LOCKS_SCHEMA`](crate::LOCKS_SCHEMA)) and the records table
        /// ([`RECORDS_SCHEMA`](crate::RECORDS_SCHEMA), shared by both stores) unless they
        /// exist (idempotent; no DDL is sent for a table that exists).
        ///
        /// # Cancel safety
        /// Cancel safe: each table is created by one statement, or not.
        ///
        /// # Errors
        /// [`StoreErrorKind::Config`](leasehold_core::StoreErrorKind::Config) without the
        /// privilege to create it.
        pub async fn migrate(&self) -> Result<(), leasehold_core::StoreError> {
            self.db.migrate($table).await?;
            self.db.migrate($crate::conn::RECORDS_TABLE).await
        }

        /// The configuration (its `Display` hides the password).
        pub fn config(&self) -> &$crate::MySqlConfig {
            &self.db.config
        }

        /// The connection pool (the GET_LOCK store's serves all but its lock sessions), e.g.
        /// to run the [`guard`](crate::guard) on the same database.
        pub fn pool(&self) -> &sqlx::MySqlPool {
            &self.db.pool
        }
    };
}
pub(crate) use db_methods;
