//! The schema: DDL for every table, and the idempotent migration that applies it.
//!
//! The same text, rendered with the default names, is in the crate's `sql/` directory for
//! DBAs (a test keeps the two identical).

use leasehold_core::StoreError;
use sqlx::{AssertSqlSafe, PgPool};

use crate::config::{TableName, quote_ident};
use crate::error;

/// The DDL of the lease-table store's table.
pub(crate) fn lease_table_sql(t: &TableName) -> String {
    let name = t.sql();
    format!(
        r#"-- leasehold lease table: one row per key, kept after release so the fence survives.
-- owner is NULL when the lease is free; expires_at is on the database's clock.
CREATE TABLE IF NOT EXISTS {name} (
    key        text COLLATE "C" PRIMARY KEY,
    owner      bytea CHECK (octet_length(owner) = 16),
    fence      bigint NOT NULL CHECK (fence > 0),
    expires_at timestamptz NOT NULL
);
"#
    )
}

/// The DDL of the advisory-lock store's table.
pub(crate) fn advisory_table_sql(t: &TableName) -> String {
    let name = t.sql();
    format!(
        r#"-- leasehold advisory-lock store: the session-level advisory lock lock_id is the lease;
-- this row keeps the fence counter (advanced while the lock is held) and who holds it.
CREATE TABLE IF NOT EXISTS {name} (
    key        text COLLATE "C" PRIMARY KEY,
    lock_id    bigint NOT NULL,
    owner      bytea CHECK (octet_length(owner) = 16),
    fence      bigint NOT NULL CHECK (fence > 0),
    holder_pid integer,
    expires_at timestamptz NOT NULL
);
"#
    )
}

/// The DDL of the guard and idempotency tables.
pub(crate) fn guard_tables_sql(guard: &TableName, idempotency: &TableName) -> String {
    let g = guard.sql();
    let i = idempotency.sql();
    format!(
        r#"-- leasehold guard: the highest fence accepted per protected resource.
CREATE TABLE IF NOT EXISTS {g} (
    resource       text COLLATE "C" PRIMARY KEY,
    fence          bigint NOT NULL,
    previous_fence bigint,
    updated_at     timestamptz NOT NULL DEFAULT clock_timestamp()
);
-- leasehold idempotency records: one row per job done, written in the job's transaction.
CREATE TABLE IF NOT EXISTS {i} (
    job_id  text COLLATE "C" PRIMARY KEY,
    done_at timestamptz NOT NULL DEFAULT clock_timestamp()
);
"#
    )
}

/// The advisory lock (transaction-scoped) that serialises concurrent migrations:
/// the first 8 bytes of SHA-256("leasehold-migrate").
fn migrate_lock_id() -> i64 {
    crate::advisory::advisory_lock_id("leasehold-migrate")
}

/// Applies `ddl` for `tables` in one transaction under a migration lock. Tables that
/// already exist are left alone (and need no CREATE privilege); a missing schema is
/// created.
pub(crate) async fn migrate(
    pool: &PgPool,
    backend: &'static str,
    tables: &[&TableName],
    ddl: String,
) -> Result<(), StoreError> {
    let map = |e| error::map(backend, "migrate", e);
    let mut tx = pool.begin().await.map_err(map)?;
    // Unnamed statements (`persistent(false)`) inside one transaction: the migration also
    // works through a transaction-pooling proxy.
    sqlx::query("SELECT pg_advisory_xact_lock($1)")
        .persistent(false)
        .bind(migrate_lock_id())
        .execute(&mut *tx)
        .await
        .map_err(map)?;
    let mut missing = false;
    for t in tables {
        let exists: bool = sqlx::query_scalar(AssertSqlSafe(format!(
            "SELECT to_regclass({}) IS NOT NULL",
            t.regclass_literal()
        )))
        .persistent(false)
        .fetch_one(&mut *tx)
        .await
        .map_err(map)?;
        missing |= !exists;
        if let Some(schema) = t.schema() {
            let has_schema: bool = sqlx::query_scalar(
                "SELECT EXISTS (SELECT 1 FROM pg_catalog.pg_namespace WHERE nspname = $1)",
            )
            .persistent(false)
            .bind(schema)
            .fetch_one(&mut *tx)
            .await
            .map_err(map)?;
            if !has_schema {
                sqlx::raw_sql(AssertSqlSafe(format!(
                    "CREATE SCHEMA IF NOT EXISTS {}",
                    quote_ident(schema)
                )))
                .execute(&mut *tx)
                .await
                .map_err(map)?;
            }
        }
    }
    if missing {
        sqlx::raw_sql(AssertSqlSafe(ddl))
            .execute(&mut *tx)
            .await
            .map_err(map)?;
    }
    tx.commit().await.map_err(map)?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::{
        DEFAULT_ADVISORY_TABLE, DEFAULT_GUARD_TABLE, DEFAULT_IDEMPOTENCY_TABLE, DEFAULT_LEASE_TABLE,
    };

    /// The SQL files for DBAs are exactly what `migrate` runs with the default names.
    /// `LEASEHOLD_BLESS=1` rewrites them.
    #[test]
    fn sql_files_match_the_migrations() {
        let t = |n| TableName::new(None, n).unwrap();
        let files = [
            ("lease_table.sql", lease_table_sql(&t(DEFAULT_LEASE_TABLE))),
            (
                "advisory.sql",
                advisory_table_sql(&t(DEFAULT_ADVISORY_TABLE)),
            ),
            (
                "guard.sql",
                guard_tables_sql(&t(DEFAULT_GUARD_TABLE), &t(DEFAULT_IDEMPOTENCY_TABLE)),
            ),
        ];
        let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("sql");
        for (name, sql) in files {
            let path = dir.join(name);
            if std::env::var_os("LEASEHOLD_BLESS").is_some() {
                std::fs::write(&path, &sql).unwrap();
            }
            let on_disk = std::fs::read_to_string(&path).unwrap();
            assert_eq!(on_disk, sql, "{name} is stale: run with LEASEHOLD_BLESS=1");
        }
    }
}
