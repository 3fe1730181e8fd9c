//! What both stores have alike: the pool and how statements run on it (prepared, or
//! inlined behind a transaction pooler), the store's table and the records table beside
//! it, and the operations both run the same way on them (inspect, list, break, records,
//! migrate, prune).

use std::sync::Arc;
use std::time::Duration;

use leasehold_core::{Fence, Key, LeaseInfo, Record, StoreError, StoreErrorKind};
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
    /// The store's table.
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
        Self {
            backend,
            pool,
            simple,
            records: Records::new(table.sibling(DEFAULT_RECORD_TABLE)),
            table,
            target,
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

    /// Runs `sql` with `args` as [`rows`](Self::rows) does and returns the number of rows
    /// it changed.
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

    /// [`Store::inspect`](leasehold_core::Store::inspect): `sql` takes the key and gives
    /// the live lease's row (key, owner, fence, remaining_us), if any.
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

    /// [`Store::list`](leasehold_core::Store::list): `sql` takes a `LIKE` pattern and gives
    /// the live leases' rows as [`inspect`](Self::inspect)'s.
    pub(crate) async fn list(
        &self,
        sql: &Arc<str>,
        prefix: &str,
    ) -> Result<Vec<LeaseInfo>, StoreError> {
        let pattern = like_prefix(prefix);
        let rows = self.rows("list", sql, &[Arg::Text(&pattern)]).await?;
        rows.iter().map(|r| info_of(self.backend, r)).collect()
    }

    /// [`Store::break_lease`](leasehold_core::Store::break_lease): `sql` gives one row, with
    /// the advanced fence.
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
        let fence: i64 = col(self.backend, row, "fence")?;
        fence_of(self.backend, fence)
    }

    /// [`Store::put_record`](leasehold_core::Store::put_record), see [`Records::put`].
    pub(crate) async fn put_record(
        &self,
        key: &Key,
        fence: Fence,
        value: &[u8],
    ) -> Result<Record, StoreError> {
        self.records
            .put(&self.pool, self.backend, self.simple, key, fence, value)
            .await
    }

    /// [`Store::get_record`](leasehold_core::Store::get_record), see [`Records::get`].
    pub(crate) async fn get_record(&self, key: &Key) -> Result<Option<Record>, StoreError> {
        self.records
            .get(&self.pool, self.backend, self.simple, key)
            .await
    }

    /// Creates the store's table and the records table with `ddl` (see
    /// [`schema::migrate`]).
    pub(crate) async fn migrate(&self, ddl: String) -> Result<(), StoreError> {
        let tables = [&self.table, self.records.table()];
        schema::migrate(&self.pool, self.backend, &tables, &[], ddl).await
    }

    /// Deletes the store table's rows of leases that ended more than `older_than` ago
    /// (see [`schema::prune`]).
    pub(crate) async fn prune(&self, older_than: Duration) -> Result<u64, StoreError> {
        schema::prune(&self.pool, self.backend, &self.table, older_than).await
    }
}
