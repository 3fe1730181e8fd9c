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
