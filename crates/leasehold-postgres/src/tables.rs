//! What both stores have alike: the pool and how statements run on it, the store's table
//! and the records table, and the operations both run on them the same way.

use std::sync::Arc;
use std::time::Duration;

use leasehold_core::{Fence, Key, LeaseInfo, StoreError, StoreErrorKind};
use sqlx::AssertSqlSafe;
use sqlx::postgres::{PgPool, PgRow};

use crate::config::{DEFAULT_RECORD_TABLE, TableName};
use crate::records::Records;
use crate::sql::{Arg, bound, col, fence_of, info_of, inline, like_prefix};
use crate::{error, schema};

pub(crate) struct Tables {
    pub(crate) backend: &'static str,
    pub(crate) pool: PgPool,
    /// Behind a transaction-pooling proxy: simple-protocol statements only.
    pub(crate) simple: bool,
    pub(crate) table: TableName,
    /// Where the pool connects (for `Debug`).
    pub(crate) target: String,
    /// The records table (in the store table's schema) and its statements.
    pub(crate) records: Records,
}

impl Tables {
    pub(crate) fn new(
        backend: &'static str,
        pool: PgPool,
        simple: bool,
        table: TableName,
        target: String,
    ) -> Self {
        let records = Records::new(table.sibling(DEFAULT_RECORD_TABLE));
        Self {
            backend,
            pool,
            simple,
            table,
            target,
            records,
        }
    }

    fn map<'a>(&self, op: &'a str) -> impl Fn(sqlx::Error) -> StoreError + 'a {
        let backend = self.backend;
        move |e| error::map(backend, op, e)
    }

    /// Runs `sql` with `args` on the pool and returns its rows: a prepared statement, or
    /// behind a transaction pooler one simple-protocol statement with the values inlined.
    pub(crate) async fn rows(
        &self,
        op: &str,
        sql: &Arc<str>,
        args: &[Arg<'_>],
    ) -> Result<Vec<PgRow>, StoreError> {
        if self.simple {
            let text = inline(sql, args)?;
            return sqlx::raw_sql(AssertSqlSafe(text))
                .fetch_all(&self.pool)
                .await
                .map_err(self.map(op));
        }
        bound(sql, args)
            .fetch_all(&self.pool)
            .await
            .map_err(self.map(op))
    }

    /// Runs `sql` with `args` as [`rows`](Self::rows); the number of rows it changed.
    pub(crate) async fn execute(
        &self,
        op: &str,
        sql: &Arc<str>,
        args: &[Arg<'_>],
    ) -> Result<u64, StoreError> {
        if self.simple {
            let text = inline(sql, args)?;
            return sqlx::raw_sql(AssertSqlSafe(text))
                .execute(&self.pool)
                .await
                .map(|r| r.rows_affected())
                .map_err(self.map(op));
        }
        bound(sql, args)
            .execute(&self.pool)
            .await
            .map(|r| r.rows_affected())
            .map_err(self.map(op))
    }

    /// `inspect`: `sql` gives the row of `key`'s live lease, if any, for [`info_of`].
    pub(crate) async fn inspect(
        &self,
        sql: &Arc<str>,
        key: &Key,
    ) -> Result<Option<LeaseInfo>, StoreError> {
        let rows = self
            .rows("inspect", sql, &[Arg::Text(key.as_str())])
            .await?;
        rows.first().map(|r| info_of(self.backend, r)).transpose()
    }

    /// `list`: `sql` gives the rows of the live leases whose key is `LIKE` its parameter.
    pub(crate) async fn list(
        &self,
        sql: &Arc<str>,
        prefix: &str,
    ) -> Result<Vec<LeaseInfo>, StoreError> {
        let pattern = like_prefix(prefix);
        let rows = self.rows("list", sql, &[Arg::Text(&pattern)]).await?;
        rows.iter().map(|r| info_of(self.backend, r)).collect()
    }

    /// `break_lease`: `sql` gives one row, with the advanced fence.
    pub(crate) async fn break_lease(
        &self,
        sql: &Arc<str>,
        args: &[Arg<'_>],
    ) -> Result<Fence, StoreError> {
        let rows = self.rows("break", sql, args).await?;
        let row = rows.first().ok_or_else(|| {
            StoreError::new(
                StoreErrorKind::Corrupt,
                self.backend,
                "break returned no row",
            )
        })?;
        fence_of(self.backend, col(self.backend, row, "fence")?)
    }

    /// Creates the store's table and the records table with `ddl` ([`schema::migrate`]).
    pub(crate) async fn migrate(&self, ddl: String) -> Result<(), StoreError> {
        let tables = [&self.table, self.records.table()];
        schema::migrate(&self.pool, self.backend, &tables, &[], ddl).await
    }

    /// [`schema::prune`] on the store's table.
    pub(crate) async fn prune(&self, older_than: Duration) -> Result<u64, StoreError> {
        schema::prune(&self.pool, self.backend, &self.table, older_than).await
    }
}

/// The methods both stores offer on their [`Tables`] (`self.inner.base`), written once:
/// `migrate`, `prune`, `schema_sql`, `schema_sql_for` (`$ddl` renders the DDL of the
/// store's own table), `table`, `records_table` and `pool`.
macro_rules! table_methods {
    ($ddl:path) => {
        /// Creates the store's table and the records table (`leasehold_records` in the same
        /// schema, shared by both stores) if they do not exist (and their schema if missing).
        /// Idempotent and safe to run concurrently (a transaction-scoped advisory lock
        /// serialises migrations). Needs `CREATE` on the schema only when something is
        /// missing (a database migrated by a version without records gets the records
        /// table). The SQL is [`schema_sql`](Self::schema_sql).
        ///
        /// # Cancel safety
        /// Cancel safe: the migration is one transaction; a dropped call rolls it back.
        ///
        /// # Errors
        /// [`StoreErrorKind::Config`](leasehold_core::StoreErrorKind::Config) when the role
        /// may not create the table; connection errors as for any operation.
        pub async fn migrate(&self) -> Result<(), leasehold_core::StoreError> {
            self.inner.base.migrate(self.schema_sql()).await
        }

        /// Deletes the rows of leases that ended more than `older_than` ago, so that a store
        /// with one key per entity does not keep a row for every entity ever locked. Rows are
        /// kept after release on purpose (they carry the fence); deleting an old one is safe
        /// because a key without a row gets its next fence from the database clock in µs,
        /// above every fence issued before unless that clock went back by more than
        /// `older_than`. A held lease's row is never deleted. Needs `DELETE` on the table.
        /// Returns the number of rows deleted. The statement is
        /// `DELETE FROM <table> WHERE expires_at < clock_timestamp() - <older_than>`.
        ///
        /// # Cancel safety
        /// Cancel safe: one statement.
        ///
        /// # Errors
        /// As any operation; [`StoreErrorKind::Config`](leasehold_core::StoreErrorKind::Config)
        /// without `DELETE` privilege.
        pub async fn prune(
            &self,
            older_than: std::time::Duration,
        ) -> Result<u64, leasehold_core::StoreError> {
            self.inner.base.prune(older_than).await
        }

        /// The DDL that [`migrate`](Self::migrate) runs, for DBAs who apply it themselves.
        pub fn schema_sql(&self) -> String {
            Self::schema_sql_for(&self.inner.base.table)
        }

        /// The DDL of the store's table `table` and of the records table in its schema,
        /// without a store (e.g. for `leasehold migrate --print`, which connects to nothing).
        pub fn schema_sql_for(table: &$crate::TableName) -> String {
            let records = table.sibling($crate::DEFAULT_RECORD_TABLE);
            $ddl(table) + &$crate::schema::records_table_sql(&records)
        }

        /// The table in use.
        pub fn table(&self) -> &$crate::TableName {
            &self.inner.base.table
        }

        /// The records table in use: [`DEFAULT_RECORD_TABLE`](crate::DEFAULT_RECORD_TABLE)
        /// in the store table's schema.
        pub fn records_table(&self) -> &$crate::TableName {
            self.inner.base.records.table()
        }

        /// The connection pool (the advisory-lock store's serves all but its lock sessions).
        pub fn pool(&self) -> &sqlx::PgPool {
            &self.inner.base.pool
        }
    };
}
pub(crate) use table_methods;
