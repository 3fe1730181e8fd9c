//! The storage-side guard (DESIGN §6) and idempotency records, inside the caller's own
//! transaction.
//!
//! A lease cannot stop a paused holder from writing; the database that receives the write
//! can. For each protected resource the guard table keeps the highest fence accepted.
//! [`check_and_advance`] runs **in the same transaction as the protected write**: it
//! accepts a fence at least as high as the recorded one (equal fences too: one holder
//! writes many times) and records it, or rejects a lower one, reporting the current
//! fence. A rejected writer has lost its lease: roll back, stop, never retry with the same
//! fence. Every rejection increments `leasehold_fence_rejected_total{resource_type}`.
//!
//! ```no_run
//! # async fn demo(pool: sqlx::PgPool, lease: leasehold_core::Lease) -> Result<(), Box<dyn std::error::Error>> {
//! use leasehold_postgres::guard;
//!
//! guard::migrate(&pool).await?; // once, at deployment
//! let mut tx = pool.begin().await?;
//! if guard::record_once(&mut tx, "invoice-run-2024-06").await? == leasehold_core::Idempotency::AlreadyDone {
//!     return Ok(()); // a committed transaction already did this job
//! }
//! // Rejected → Error::FenceRejected (action: OwnershipLost); dropping `tx` rolls back.
//! guard::check_and_advance(&mut tx, "ledger:invoices", lease.fence())
//!     .await?
//!     .into_result(&"ledger:invoices".parse()?, lease.fence())?;
//! sqlx::query("INSERT INTO invoices (run, total) VALUES ($1, $2)")
//!     .bind("2024-06")
//!     .bind(1234_i64)
//!     .execute(&mut *tx)
//!     .await?;
//! tx.commit().await?; // a Busy error here (serialization failure) means: retry the job
//! # Ok(()) }
//! ```
//!
//! ## Concurrency
//! The check is one `INSERT … ON CONFLICT (resource) DO UPDATE SET fence = EXCLUDED.fence
//! WHERE guard.fence <= EXCLUDED.fence RETURNING …`. The conflicting row is locked until
//! the caller's transaction ends, so under `READ COMMITTED` concurrent writers of one
//! resource serialise on it and each sees the latest committed fence: accepted fences
//! never decrease in commit order. Under `REPEATABLE READ` and `SERIALIZABLE`, a
//! concurrent update surfaces as SQLSTATE 40001, mapped to
//! [`StoreErrorKind::Busy`] (retryable): retry the whole transaction; it is never
//! reported as accepted. The same holds for the caller's `COMMIT`: map its error with
//! [`store_error`](crate::store_error).
//!
//! ## A single statement on your own table
//! When the protected data is one row, the guard can live in the row itself, in a
//! `last_fence bigint NOT NULL DEFAULT 0` column, and the write is one conditional
//! statement (no separate guard row, no extra round trip):
//!
//! ```sql
//! UPDATE accounts SET balance = $1, last_fence = $2
//!  WHERE id = $3 AND last_fence <= $2;      -- 0 rows: rejected (or no such account)
//!
//! INSERT INTO accounts AS a (id, balance, last_fence) VALUES ($3, $1, $2)
//! ON CONFLICT (id) DO UPDATE SET balance = EXCLUDED.balance, last_fence = EXCLUDED.last_fence
//!  WHERE a.last_fence <= EXCLUDED.last_fence;  -- 0 rows affected: rejected
//! ```
//!
//! A write that affects no row was rejected: treat it as
//! [`Error::FenceRejected`](leasehold_core::Error::FenceRejected) and count it with
//! [`leasehold_core::metrics::fence_rejected`].

use std::fmt;
use std::sync::{Arc, LazyLock};

use leasehold_core::{Fence, GuardDecision, Idempotency, StoreError, StoreErrorKind};
use sqlx::postgres::{PgConnection, PgPool};
use sqlx::{AssertSqlSafe, Row};

use crate::config::{DEFAULT_GUARD_TABLE, DEFAULT_IDEMPOTENCY_TABLE, TableName};
use crate::{GUARD_BACKEND, error, schema};

const BACKEND: &str = GUARD_BACKEND;

/// The longest resource name or job id accepted, in bytes.
pub const MAX_NAME_LEN: usize = 1024;

/// The guard and idempotency tables, with their statements rendered once.
///
/// [`PgGuard::default()`] uses `leasehold_guard` and `leasehold_idempotency` on the
/// `search_path`; the free functions of this module use that default.
#[derive(Clone)]
pub struct PgGuard {
    guard: TableName,
    idempotency: TableName,
    check: Arc<str>,
    current: Arc<str>,
    record: Arc<str>,
}

impl fmt::Debug for PgGuard {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("PgGuard")
            .field("guard", &self.guard)
            .field("idempotency", &self.idempotency)
            .finish()
    }
}

impl Default for PgGuard {
    fn default() -> Self {
        Self::with_tables(
            TableName::new(None, DEFAULT_GUARD_TABLE).expect("valid default name"),
            TableName::new(None, DEFAULT_IDEMPOTENCY_TABLE).expect("valid default name"),
        )
    }
}

static DEFAULT_GUARD: LazyLock<PgGuard> = LazyLock::new(PgGuard::default);

fn check_name(what: &str, s: &str) -> Result<(), StoreError> {
    if s.is_empty() || s.len() > MAX_NAME_LEN || s.contains('\0') {
        return Err(StoreError::new(
            StoreErrorKind::InvalidInput,
            BACKEND,
            format!("{what} must be 1..={MAX_NAME_LEN} bytes without NUL"),
        ));
    }
    Ok(())
}

/// The part of `resource` before its first `:` (`"none"` without one): the only part used
/// as a metric label, as for lease keys.
fn resource_type(resource: &str) -> &str {
    match resource.split_once(':') {
        Some((prefix, _)) if !prefix.is_empty() => prefix,
        _ => "none",
    }
}

impl PgGuard {
    /// The default tables (`leasehold_guard`, `leasehold_idempotency`).
    pub fn new() -> Self {
        Self::default()
    }

    /// The default table names in `schema`.
    ///
    /// # Errors
    /// [`StoreErrorKind::Config`] for an invalid schema name.
    pub fn in_schema(schema: &str) -> Result<Self, StoreError> {
        Ok(Self::with_tables(
            TableName::new(Some(schema), DEFAULT_GUARD_TABLE)?,
            TableName::new(Some(schema), DEFAULT_IDEMPOTENCY_TABLE)?,
        ))
    }

    /// Explicit guard and idempotency tables.
    pub fn with_tables(guard: TableName, idempotency: TableName) -> Self {
        let g = guard.sql();
        let i = idempotency.sql();
        let check = format!(
            "INSERT INTO {g} AS g (resource, fence, previous_fence, updated_at) \
             VALUES ($1, $2, NULL, clock_timestamp()) \
             ON CONFLICT (resource) DO UPDATE SET fence = EXCLUDED.fence, \
               previous_fence = g.fence, updated_at = EXCLUDED.updated_at \
             WHERE g.fence <= EXCLUDED.fence \
             RETURNING g.previous_fence"
        );
        let current = format!("SELECT fence FROM {g} WHERE resource = $1");
        let record = format!(
            "INSERT INTO {i} (job_id, done_at) VALUES ($1, clock_timestamp()) \
             ON CONFLICT (job_id) DO NOTHING"
        );
        Self {
            guard,
            idempotency,
            check: check.into(),
            current: current.into(),
            record: record.into(),
        }
    }

    /// The guard table.
    pub fn guard_table(&self) -> &TableName {
        &self.guard
    }

    /// The idempotency table.
    pub fn idempotency_table(&self) -> &TableName {
        &self.idempotency
    }

    /// The DDL that [`migrate`](Self::migrate) runs.
    pub fn schema_sql(&self) -> String {
        schema::guard_tables_sql(&self.guard, &self.idempotency)
    }

    /// Creates the guard and idempotency tables if they do not exist (idempotent, safe to
    /// run concurrently; needs `CREATE` only when something is missing).
    ///
    /// # Cancel safety
    /// Cancel safe: one transaction.
    ///
    /// # Errors
    /// [`StoreErrorKind::Config`] when the role may not create the tables.
    pub async fn migrate(&self, pool: &PgPool) -> Result<(), StoreError> {
        schema::migrate(
            pool,
            BACKEND,
            &[&self.guard, &self.idempotency],
            self.schema_sql(),
        )
        .await
    }

    /// The guard check, in the caller's transaction: accepts `fence` if it is at least the
    /// highest fence accepted for `resource` (recording it), or rejects it with the
    /// current one. On rejection it increments `leasehold_fence_rejected_total`; the
    /// transaction stays usable, but the caller must roll back its write.
    ///
    /// `conn` is the caller's open transaction (`&mut tx` derefs to it). Run outside a
    /// transaction, the check commits by itself and protects nothing written later.
    ///
    /// # Cancel safety
    /// Not cancel safe in the sense that a dropped call may have advanced the guard inside
    /// the caller's transaction; dropping the transaction too (rolling it back) undoes it.
    ///
    /// # Errors
    /// [`StoreErrorKind::InvalidInput`] for an empty, over-long or NUL-containing resource
    /// or a fence above `i64::MAX`; [`StoreErrorKind::Busy`] for a serialization failure
    /// or deadlock (retry the transaction); [`StoreErrorKind::Config`] when the table is
    /// missing (run [`migrate`](Self::migrate)) or not accessible; connection errors.
    pub async fn check_and_advance(
        &self,
        conn: &mut PgConnection,
        resource: &str,
        fence: Fence,
    ) -> Result<GuardDecision, StoreError> {
        check_name("resource", resource)?;
        let f = i64::try_from(fence.get()).map_err(|_| {
            StoreError::new(
                StoreErrorKind::InvalidInput,
                BACKEND,
                format!("fence {fence} is above the largest PostgreSQL bigint"),
            )
        })?;
        let map = |e| error::map(BACKEND, "guard check", e);
        // Unnamed statements (`persistent(false)`): they live only as long as the
        // transaction, so the guard also works through a transaction-pooling proxy.
        let accepted = sqlx::query(AssertSqlSafe(self.check.clone()))
            .persistent(false)
            .bind(resource)
            .bind(f)
            .fetch_optional(&mut *conn)
            .await
            .map_err(map)?;
        if let Some(row) = accepted {
            let previous: Option<i64> = row.try_get(0).map_err(map)?;
            return Ok(GuardDecision::Accepted {
                previous: previous.map(|p| Fence(u64::try_from(p).unwrap_or(0))),
            });
        }
        // Rejected: the row is locked by this transaction, so this read is the value that
        // refused the write.
        let current: Option<i64> = sqlx::query_scalar(AssertSqlSafe(self.current.clone()))
            .persistent(false)
            .bind(resource)
            .fetch_optional(&mut *conn)
            .await
            .map_err(map)?;
        let current = current.ok_or_else(|| {
            StoreError::new(
                StoreErrorKind::Corrupt,
                BACKEND,
                "the guard row refused the fence but cannot be read back",
            )
        })?;
        let current = Fence(u64::try_from(current).unwrap_or(0));
        leasehold_core::metrics::fence_rejected(resource_type(resource));
        tracing::info!(
            resource,
            fence = fence.get(),
            current = current.get(),
            "fence rejected by the guard"
        );
        Ok(GuardDecision::Rejected { current })
    }

    /// The highest fence accepted for `resource`, if any (a plain read).
    ///
    /// # Cancel safety
    /// Cancel safe.
    ///
    /// # Errors
    /// As [`check_and_advance`](Self::check_and_advance).
    pub async fn current(
        &self,
        conn: &mut PgConnection,
        resource: &str,
    ) -> Result<Option<Fence>, StoreError> {
        check_name("resource", resource)?;
        let v: Option<i64> = sqlx::query_scalar(AssertSqlSafe(self.current.clone()))
            .persistent(false)
            .bind(resource)
            .fetch_optional(conn)
            .await
            .map_err(|e| error::map(BACKEND, "guard read", e))?;
        Ok(v.map(|v| Fence(u64::try_from(v).unwrap_or(0))))
    }

    /// Records `job_id` as done, in the caller's transaction: [`Idempotency::FirstTime`]
    /// (do the work in this transaction) or [`Idempotency::AlreadyDone`] (a committed
    /// transaction recorded it: skip the work). A concurrent, uncommitted recording of the
    /// same id makes this call wait for it: if it commits the answer is `AlreadyDone`, if
    /// it rolls back, `FirstTime`. Under `REPEATABLE READ`/`SERIALIZABLE` a concurrent
    /// recording surfaces as [`StoreErrorKind::Busy`].
    ///
    /// # Cancel safety
    /// As [`check_and_advance`](Self::check_and_advance): roll the transaction back.
    ///
    /// # Errors
    /// [`StoreErrorKind::InvalidInput`] for an empty, over-long or NUL-containing id;
    /// otherwise as [`check_and_advance`](Self::check_and_advance).
    pub async fn record_once(
        &self,
        conn: &mut PgConnection,
        job_id: &str,
    ) -> Result<Idempotency, StoreError> {
        check_name("job id", job_id)?;
        let done = sqlx::query(AssertSqlSafe(self.record.clone()))
            .persistent(false)
            .bind(job_id)
            .execute(conn)
            .await
            .map_err(|e| error::map(BACKEND, "idempotency record", e))?;
        Ok(if done.rows_affected() == 1 {
            Idempotency::FirstTime
        } else {
            Idempotency::AlreadyDone
        })
    }
}

/// [`PgGuard::check_and_advance`] on the default tables.
///
/// # Cancel safety
/// As [`PgGuard::check_and_advance`].
///
/// # Errors
/// As [`PgGuard::check_and_advance`].
pub async fn check_and_advance(
    conn: &mut PgConnection,
    resource: &str,
    fence: Fence,
) -> Result<GuardDecision, StoreError> {
    DEFAULT_GUARD.check_and_advance(conn, resource, fence).await
}

/// [`PgGuard::record_once`] on the default tables.
///
/// # Cancel safety
/// As [`PgGuard::record_once`].
///
/// # Errors
/// As [`PgGuard::record_once`].
pub async fn record_once(conn: &mut PgConnection, job_id: &str) -> Result<Idempotency, StoreError> {
    DEFAULT_GUARD.record_once(conn, job_id).await
}

/// [`PgGuard::migrate`] for the default tables.
///
/// # Cancel safety
/// Cancel safe: one transaction.
///
/// # Errors
/// As [`PgGuard::migrate`].
pub async fn migrate(pool: &PgPool) -> Result<(), StoreError> {
    DEFAULT_GUARD.migrate(pool).await
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names() {
        assert_eq!(resource_type("ledger:invoices"), "ledger");
        assert_eq!(resource_type("plain"), "none");
        assert!(check_name("resource", "").is_err());
        assert!(check_name("resource", "a\0").is_err());
        assert!(check_name("resource", &"x".repeat(MAX_NAME_LEN + 1)).is_err());
        assert!(check_name("resource", "ledger:x").is_ok());
    }
}
