//! Fenced records ([`Store::put_record`](leasehold_core::Store::put_record)) in the
//! records table both stores share (one per schema, default `leasehold_records`).

use std::sync::Arc;

use leasehold_core::{Fence, Key, Record, StoreError};
use leasehold_sql::guard::fence_to_i64;
use leasehold_sql::record;
use sqlx::postgres::PgPool;
use sqlx::{AssertSqlSafe, Row};

use crate::config::TableName;
use crate::error;
use crate::sql::{Arg, bound, inline};

/// The records statements, rendered once for the configured table.
pub(crate) struct Records {
    table: TableName,
    /// Stores `$3` at fence `$2` under key `$1` unless the stored fence is as high.
    put: Arc<str>,
    /// The row of key `$1`.
    get: Arc<str>,
    /// `put` then `get`, one simple-protocol query (behind a transaction pooler).
    put_then_get: Arc<str>,
}

impl Records {
    pub(crate) fn new(table: TableName) -> Self {
        let t = table.sql();
        // `ON CONFLICT DO UPDATE` locks the conflicting row even when its WHERE is false,
        // so the read that follows in the same transaction (a new snapshot under READ
        // COMMITTED) sees the record that stays until the transaction ends. A CTE could
        // not: its snapshot may predate a conflicting row committed meanwhile.
        // (The upsert as a CTE locks and writes the same way.) A write notifies the key's
        // watchers, if it has any (`watch`); one row, `watched`.
        let watched = crate::watch::notify_sql(&table, "$1", "w.n > 0");
        let put = format!(
            "WITH u AS ( \
               INSERT INTO {t} AS r (key, fence, value) VALUES ($1, $2, $3) \
               ON CONFLICT (key) DO UPDATE SET fence = EXCLUDED.fence, value = EXCLUDED.value \
               WHERE r.fence < EXCLUDED.fence RETURNING 1 \
             ) \
             SELECT {watched} AS watched FROM (SELECT count(*) AS n FROM u) w"
        );
        let get = format!("SELECT fence, value FROM {t} WHERE key = $1");
        // Several statements in one simple query run in one implicit transaction, each
        // with its own snapshot; the record is the row with a `value` column.
        let put_then_get = format!("{put}; {get}");
        Self {
            table,
            put: put.into(),
            get: get.into(),
            put_then_get: put_then_get.into(),
        }
    }

    /// The table.
    pub(crate) fn table(&self) -> &TableName {
        &self.table
    }

    /// [`Store::put_record`](leasehold_core::Store::put_record): one transaction, the
    /// conditional upsert then the read of the row. `simple`: one simple-protocol query
    /// with the values inlined (behind a transaction-pooling proxy).
    pub(crate) async fn put(
        &self,
        pool: &PgPool,
        backend: &'static str,
        simple: bool,
        key: &Key,
        fence: Fence,
        value: &[u8],
    ) -> Result<Record, StoreError> {
        record::check_value(backend, value)?;
        let fence = fence_to_i64(backend, fence)?;
        let map = |e| error::map(backend, "put record", e);
        let args = [Arg::Text(key.as_str()), Arg::Int(fence), Arg::Bytes(value)];
        let row = if simple {
            let text = inline(&self.put_then_get, &args)?;
            sqlx::raw_sql(AssertSqlSafe(text))
                .fetch_all(pool)
                .await
                .map_err(map)?
                .into_iter()
                .find(|r| r.try_column("value").is_ok())
        } else {
            let mut tx = pool.begin().await.map_err(map)?;
            bound(&self.put, &args)
                .execute(&mut *tx)
                .await
                .map_err(map)?;
            let row = bound(&self.get, &args[..1])
                .fetch_optional(&mut *tx)
                .await
                .map_err(map)?;
            tx.commit().await.map_err(map)?;
            row
        };
        let row = row.ok_or_else(|| {
            StoreError::new(
                leasehold_core::StoreErrorKind::Other,
                backend,
                format!("the record `{key}` was not there right after it was written"),
            )
        })?;
        read(backend, key, &row)
    }

    /// [`Store::get_record`](leasehold_core::Store::get_record): one read.
    pub(crate) async fn get(
        &self,
        pool: &PgPool,
        backend: &'static str,
        simple: bool,
        key: &Key,
    ) -> Result<Option<Record>, StoreError> {
        let map = |e| error::map(backend, "get record", e);
        let args = [Arg::Text(key.as_str())];
        let row = if simple {
            let text = inline(&self.get, &args)?;
            sqlx::raw_sql(AssertSqlSafe(text))
                .fetch_optional(pool)
                .await
        } else {
            bound(&self.get, &args).fetch_optional(pool).await
        }
        .map_err(map)?;
        row.map(|r| read(backend, key, &r)).transpose()
    }
}

fn read(
    backend: &'static str,
    key: &Key,
    row: &sqlx::postgres::PgRow,
) -> Result<Record, StoreError> {
    let decode = |e| error::map(backend, "decoding a record", e);
    let fence: i64 = row.try_get("fence").map_err(decode)?;
    let value: Vec<u8> = row.try_get("value").map_err(decode)?;
    record::from_i64(backend, key, fence, value)
}
