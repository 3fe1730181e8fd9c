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

/// The DDL of the records table (both stores' [`Store::put_record`]), in the schema of
/// the store's table.
///
/// [`Store::put_record`]: leasehold_core::Store::put_record
pub(crate) fn records_table_sql(t: &TableName) -> String {
    let name = t.sql();
    format!(
        r#"-- leasehold records (Store::put_record), shared by both stores: one row per record key
-- (an election or semaphore name), replaced only by a higher fence, never expired.
CREATE TABLE IF NOT EXISTS {name} (
    key   text COLLATE "C" PRIMARY KEY,
    fence bigint NOT NULL CHECK (fence >= 0),
    value bytea NOT NULL CHECK (octet_length(value) <= 4096)
);
"#
    )
}

/// The statement that deletes the rows of `table` whose lease ended more than `older_than`
/// ago (their `expires_at`, on the database's clock): what [`prune`] runs, for DBAs who
/// run it themselves (`DELETE FROM "leasehold_leases" WHERE expires_at < clock_timestamp()
/// - 604800000000 * interval '1 microsecond'` for a week).
pub(crate) fn prune_sql(t: &TableName, older_than: std::time::Duration) -> String {
    let us = leasehold_sql::prune_age_us(older_than);
    format!(
        "DELETE FROM {} WHERE expires_at < clock_timestamp() - {us} * interval '1 microsecond'",
        t.sql()
    )
}

/// Runs [`prune_sql`] and returns the number of rows deleted.
///
/// Safe at any time: a held lease's row has `expires_at` in the future and is kept, and a
/// key whose row is gone gets its next fence from the database clock in µs, above every
/// fence issued before unless the clock went back by more than `older_than`.
pub(crate) async fn prune(
    pool: &PgPool,
    backend: &'static str,
    t: &TableName,
    older_than: std::time::Duration,
) -> Result<u64, StoreError> {
    sqlx::raw_sql(AssertSqlSafe(prune_sql(t, older_than)))
        .execute(pool)
        .await
        .map(|r| r.rows_affected())
        .map_err(|e| error::map(backend, "prune", e))
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
{function}"#,
        function = guard_function_sql(guard)
    )
}

/// The SQL guard function's name, in the guard table's schema.
pub(crate) fn guard_function_name(guard: &TableName) -> String {
    match guard.schema() {
        Some(s) => format!("{}.leasehold_guard", quote_ident(s)),
        None => "leasehold_guard".to_owned(),
    }
}

/// `regprocedure` literal of the SQL guard function, for `to_regprocedure`.
pub(crate) fn guard_function_regprocedure(guard: &TableName) -> String {
    format!(
        "'{}(text,bigint)'",
        guard_function_name(guard).replace('\'', "''")
    )
}

/// The SQL guard: `leasehold_guard(resource, fence)` runs the Rust guard's statement in
/// the caller's transaction, so SQL and Rust callers share one fence per resource.
fn guard_function_sql(guard: &TableName) -> String {
    let g = guard.sql();
    let f = guard_function_name(guard);
    let state = error::FENCE_REJECTED_SQLSTATE;
    format!(
        r#"-- leasehold SQL guard: call it in the transaction of the protected write, e.g.
--   BEGIN; SELECT leasehold_guard('ledger:invoices', 42); UPDATE ...; COMMIT;
-- It accepts a fence at least as high as the highest accepted for the resource (the
-- same statement and comparison as the Rust guard: equal fences pass) and records it;
-- a lower fence raises SQLSTATE {state}, which aborts the transaction. It returns the
-- previous fence (NULL for a resource's first write). The guard row stays locked until
-- the transaction ends, so concurrent writers of one resource pass one at a time.
CREATE OR REPLACE FUNCTION {f}(resource text, fence bigint) RETURNS bigint
LANGUAGE plpgsql VOLATILE AS $leasehold$
#variable_conflict use_column
DECLARE
    accepted boolean := false;
    previous bigint;
    current_fence bigint;
BEGIN
    IF $1 IS NULL OR $1 = '' OR octet_length($1) > 512 THEN
        RAISE EXCEPTION 'leasehold_guard: the resource must be 1 to 512 bytes, got %', quote_nullable($1)
            USING ERRCODE = '22023';
    END IF;
    IF $2 IS NULL OR $2 < 0 THEN
        RAISE EXCEPTION 'leasehold_guard: the fence must be a non-negative number, got %', quote_nullable($2)
            USING ERRCODE = '22023';
    END IF;
    INSERT INTO {g} AS g (resource, fence, previous_fence, updated_at)
    VALUES ($1, $2, NULL, clock_timestamp())
    ON CONFLICT (resource) DO UPDATE SET fence = EXCLUDED.fence,
        previous_fence = g.fence, updated_at = EXCLUDED.updated_at
    WHERE g.fence <= EXCLUDED.fence
    RETURNING true, g.previous_fence INTO accepted, previous;
    IF accepted THEN
        RETURN previous;
    END IF;
    -- Rejected: the row is locked by this transaction, so this is the fence that refused.
    SELECT g.fence INTO current_fence FROM {g} AS g WHERE g.resource = $1;
    RAISE EXCEPTION 'leasehold_guard: fence % rejected for resource %: the current fence is % (the lease was lost: roll back)',
        $2, quote_literal($1), current_fence
        USING ERRCODE = '{state}',
              HINT = 'A newer holder of the lease has written; do not retry with this fence.';
END
$leasehold$;
"#
    )
}

/// The advisory lock (transaction-scoped) that serialises concurrent migrations:
/// the first 8 bytes of SHA-256("leasehold-migrate").
fn migrate_lock_id() -> i64 {
    crate::sql::advisory_lock_id("leasehold-migrate")
}

/// Applies `ddl` for `tables` and `functions` (`regprocedure` literals) in one
/// transaction under a migration lock, when any of them is missing. When they all exist
/// nothing is sent (and no CREATE privilege is needed); a missing schema is created.
pub(crate) async fn migrate(
    pool: &PgPool,
    backend: &'static str,
    tables: &[&TableName],
    functions: &[String],
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
    for f in functions {
        let exists: bool = sqlx::query_scalar(AssertSqlSafe(format!(
            "SELECT to_regprocedure({f}) IS NOT NULL"
        )))
        .persistent(false)
        .fetch_one(&mut *tx)
        .await
        .map_err(map)?;
        missing |= !exists;
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
        DEFAULT_ADVISORY_TABLE, DEFAULT_GUARD_TABLE, DEFAULT_IDEMPOTENCY_TABLE,
        DEFAULT_LEASE_TABLE, DEFAULT_RECORD_TABLE,
    };

    /// The SQL files for DBAs are exactly what `migrate` runs with the default names.
    /// `LEASEHOLD_BLESS=1` rewrites them.
    #[test]
    fn sql_files_match_the_migrations() {
        let t = |n| TableName::new(None, n).unwrap();
        let files = [
            ("lease_table.sql", lease_table_sql(&t(DEFAULT_LEASE_TABLE))),
            ("records.sql", records_table_sql(&t(DEFAULT_RECORD_TABLE))),
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
