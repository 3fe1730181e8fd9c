//! The storage-side guard (docs/design.md §6) and idempotency records, inside the caller's own
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
//! use leasehold_core::{Idempotency, ResourceName};
//! use leasehold_postgres::guard;
//!
//! guard::migrate(&pool).await?; // once, at deployment
//! // Names are validated once (1..=512 bytes, no NUL); `ResourceName::from(lease.key())`
//! // uses the lease's key.
//! let ledger = ResourceName::new("ledger:invoices")?;
//! let job = ResourceName::new("invoice-run-2024-06")?;
//! let mut tx = pool.begin().await?;
//! if guard::record_once(&mut tx, &job).await? == Idempotency::AlreadyDone {
//!     return Ok(()); // a committed transaction already did this job
//! }
//! // Rejected → Error::FenceRejected (action: OwnershipLost); dropping `tx` rolls back.
//! guard::check_and_advance(&mut tx, &ledger, lease.fence())
//!     .await?
//!     .into_result(&ledger, lease.fence())?;
//! sqlx::query("INSERT INTO invoices (run, total) VALUES ($1, $2)")
//!     .bind("2024-06")
//!     .bind(1234_i64)
//!     .execute(&mut *tx)
//!     .await?;
//! tx.commit().await?; // a Busy error here (serialization failure) means: retry the job
//! # Ok(()) }
//! ```
//!
//! The check and the record take the transaction itself: on a bare connection (or the
//! pool) the check would commit on its own and protect nothing written after it, so such
//! a call does not compile:
//!
//! ```compile_fail,E0308
//! # async fn demo(conn: &mut sqlx::PgConnection, ledger: &leasehold_core::ResourceName, fence: leasehold_core::Fence) {
//! let _ = leasehold_postgres::guard::check_and_advance(conn, ledger, fence).await;
//! # }
//! ```
//!
//! ```compile_fail,E0308
//! # async fn demo(conn: &mut sqlx::PgConnection, job: &leasehold_core::ResourceName) {
//! let _ = leasehold_postgres::PgGuard::new().record_once(conn, job).await;
//! # }
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
//! ## From SQL, in any language
//! [`migrate`] also installs a function `leasehold_guard(resource text, fence bigint)` in
//! the guard table's schema that runs the same statement on the same table, so SQL callers
//! (psql, another language's driver) and Rust callers share one fence per resource. Call it
//! inside the transaction of the protected write; a stale fence raises SQLSTATE
//! [`FENCE_REJECTED_SQLSTATE`] (`LH001`), which aborts the transaction:
//!
//! ```sql
//! BEGIN;
//! SELECT leasehold_guard('ledger:invoices', 42);  -- raises LH001 if 42 is stale
//! UPDATE ledger SET total = total + 10 WHERE id = 1;
//! COMMIT;
//! ```
//!
//! `docs/shell.md` in the repository shows it from a `psql` script under `leasehold run`.
//!
//! A write that affects no row was rejected: treat it as
//! [`Error::FenceRejected`](leasehold_core::Error::FenceRejected) and count it with
//! [`leasehold_core::metrics::fence_rejected`].

use std::fmt;
use std::sync::{Arc, LazyLock};

use leasehold_core::{Fence, GuardDecision, Idempotency, ResourceName, StoreError, StoreErrorKind};
use leasehold_sql::guard::{fence_from_i64, fence_to_i64, idempotency, rejected};
use sqlx::postgres::{PgConnection, PgPool};
use sqlx::{AssertSqlSafe, Postgres, Row, Transaction};

use crate::config::{DEFAULT_GUARD_TABLE, DEFAULT_IDEMPOTENCY_TABLE, TableName};
use crate::{GUARD_BACKEND, error, schema};

const BACKEND: &str = GUARD_BACKEND;

/// The SQLSTATE the SQL function `leasehold_guard(resource, fence)` raises when it
/// rejects a stale fence (see the module docs).
pub const FENCE_REJECTED_SQLSTATE: &str = error::FENCE_REJECTED_SQLSTATE;

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

impl PgGuard {
    /// The default tables (`leasehold_guard`, `leasehold_idempotency`).
    pub fn new() -> Self {
        Self::default()
    }

    /// The default table names in `schema`.
    ///
    /// # Errors
    /// [`StoreErrorKind::Config`] for an invalid schema name.
    ///
    /// # Examples
    ///
    /// ```
    /// use leasehold_postgres::PgGuard;
    ///
    /// let guard = PgGuard::in_schema("billing")?;
    /// assert!(guard.schema_sql().contains(r#""billing"."leasehold_guard""#));
    /// // guard.migrate(&pool).await?; guard.check_and_advance(&mut tx, &resource, fence).await?; …
    /// # Ok::<(), leasehold_core::StoreError>(())
    /// ```
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

    /// The SQL guard function's name as it appears in SQL: `leasehold_guard`, qualified
    /// by the guard table's schema when it has one (e.g. `"locks".leasehold_guard`).
    pub fn function_name(&self) -> String {
        schema::guard_function_name(&self.guard)
    }

    /// The DDL that [`migrate`](Self::migrate) runs: the guard and idempotency tables and
    /// the SQL guard function [`function_name`](Self::function_name).
    pub fn schema_sql(&self) -> String {
        schema::guard_tables_sql(&self.guard, &self.idempotency)
    }

    /// Creates the guard and idempotency tables and the SQL guard function
    /// `leasehold_guard(text, bigint)` if any is missing (idempotent, safe to run
    /// concurrently; needs `CREATE` only when something is missing).
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
            &[schema::guard_function_regprocedure(&self.guard)],
            self.schema_sql(),
        )
        .await
    }

    /// The guard check, in the caller's transaction: accepts `fence` if it is at least the
    /// highest fence accepted for `resource` (recording it), or rejects it with the
    /// current one. On rejection it increments `leasehold_fence_rejected_total`; the
    /// transaction stays usable, but the caller must roll back its write.
    ///
    /// It takes the caller's open transaction, so it cannot be called outside one (run on
    /// its own, the check would commit by itself and protect nothing written later).
    ///
    /// # Cancel safety
    /// Not cancel safe in the sense that a dropped call may have advanced the guard inside
    /// the caller's transaction; dropping the transaction too (rolling it back) undoes it.
    ///
    /// # Errors
    /// [`StoreErrorKind::InvalidInput`] for a fence above `i64::MAX`;
    /// [`StoreErrorKind::Busy`] for a serialization failure or deadlock (retry the
    /// transaction); [`StoreErrorKind::Config`] when the table is missing (run
    /// [`migrate`](Self::migrate)) or not accessible; connection errors.
    pub async fn check_and_advance(
        &self,
        tx: &mut Transaction<'_, Postgres>,
        resource: &ResourceName,
        fence: Fence,
    ) -> Result<GuardDecision, StoreError> {
        let f = fence_to_i64(BACKEND, fence)?;
        let conn: &mut PgConnection = tx;
        let map = |e| error::map(BACKEND, "guard check", e);
        // Unnamed statements (`persistent(false)`): they live only as long as the
        // transaction, so the guard also works through a transaction-pooling proxy.
        let accepted = sqlx::query(AssertSqlSafe(self.check.clone()))
            .persistent(false)
            .bind(resource.as_str())
            .bind(f)
            .fetch_optional(&mut *conn)
            .await
            .map_err(map)?;
        if let Some(row) = accepted {
            let previous: Option<i64> = row.try_get(0).map_err(map)?;
            return Ok(GuardDecision::Accepted {
                previous: previous.map(fence_from_i64),
            });
        }
        // Rejected: the row is locked by this transaction, so this read is the value that
        // refused the write.
        let current: Option<i64> = sqlx::query_scalar(AssertSqlSafe(self.current.clone()))
            .persistent(false)
            .bind(resource.as_str())
            .fetch_optional(conn)
            .await
            .map_err(map)?;
        let current = current.ok_or_else(|| {
            StoreError::new(
                StoreErrorKind::Corrupt,
                BACKEND,
                "the guard row refused the fence but cannot be read back",
            )
        })?;
        Ok(rejected(BACKEND, resource, fence, fence_from_i64(current)))
    }

    /// The highest fence accepted for `resource`, if any: a plain read on any connection —
    /// a pooled one, a plain one, or a transaction (`&mut tx` derefs to its connection; it
    /// then sees the transaction's own uncommitted advance). It writes nothing, so it
    /// needs no transaction.
    ///
    /// # Cancel safety
    /// Cancel safe.
    ///
    /// # Errors
    /// As [`check_and_advance`](Self::check_and_advance).
    pub async fn current(
        &self,
        conn: &mut PgConnection,
        resource: &ResourceName,
    ) -> Result<Option<Fence>, StoreError> {
        let v: Option<i64> = sqlx::query_scalar(AssertSqlSafe(self.current.clone()))
            .persistent(false)
            .bind(resource.as_str())
            .fetch_optional(conn)
            .await
            .map_err(|e| error::map(BACKEND, "guard read", e))?;
        Ok(v.map(fence_from_i64))
    }

    /// Records `job_id` as done, in the caller's transaction (which it takes, so it cannot
    /// be called outside one): [`Idempotency::FirstTime`] (do the work in this
    /// transaction) or [`Idempotency::AlreadyDone`] (a committed transaction recorded it:
    /// skip the work). A concurrent, uncommitted recording of the same id makes this call
    /// wait for it: if it commits the answer is `AlreadyDone`, if it rolls back,
    /// `FirstTime`. Under `REPEATABLE READ`/`SERIALIZABLE` a concurrent recording surfaces
    /// as [`StoreErrorKind::Busy`].
    ///
    /// A job id follows the rules of a resource name (1 to 512 bytes, no NUL; it is stored in
    /// a column of the same kind), so it is a [`ResourceName`] too.
    ///
    /// # Cancel safety
    /// As [`check_and_advance`](Self::check_and_advance): roll the transaction back.
    ///
    /// # Errors
    /// As [`check_and_advance`](Self::check_and_advance).
    pub async fn record_once(
        &self,
        tx: &mut Transaction<'_, Postgres>,
        job_id: &ResourceName,
    ) -> Result<Idempotency, StoreError> {
        let done = sqlx::query(AssertSqlSafe(self.record.clone()))
            .persistent(false)
            .bind(job_id.as_str())
            .execute(&mut **tx)
            .await
            .map_err(|e| error::map(BACKEND, "idempotency record", e))?;
        Ok(idempotency(done.rows_affected() == 1))
    }
}

/// [`PgGuard::check_and_advance`] on the default tables.
///
/// # Cancel safety
/// As [`PgGuard::check_and_advance`].
///
/// # Errors
/// As [`PgGuard::check_and_advance`].
///
/// # Examples
///
/// ```no_run
/// use leasehold_core::ResourceName;
/// use leasehold_postgres::{guard, sqlx};
///
/// # async fn demo(pool: sqlx::PgPool, lease: leasehold_core::Lease) -> Result<(), Box<dyn std::error::Error>> {
/// let ledger = ResourceName::from(lease.key()); // the lease's key names the resource
/// let mut tx = pool.begin().await?;
/// guard::check_and_advance(&mut tx, &ledger, lease.fence())
///     .await? // Busy: a serialization failure; retry the whole transaction
///     .into_result(&ledger, lease.fence())?; // FenceRejected: the lease was lost; stop
/// sqlx::query("UPDATE ledger SET total = total + $1").bind(10_i64).execute(&mut *tx).await?;
/// tx.commit().await.map_err(leasehold_postgres::store_error)?;
/// # Ok(()) }
/// ```
pub async fn check_and_advance(
    tx: &mut Transaction<'_, Postgres>,
    resource: &ResourceName,
    fence: Fence,
) -> Result<GuardDecision, StoreError> {
    DEFAULT_GUARD.check_and_advance(tx, resource, fence).await
}

/// [`PgGuard::record_once`] on the default tables.
///
/// # Cancel safety
/// As [`PgGuard::record_once`].
///
/// # Errors
/// As [`PgGuard::record_once`].
///
/// # Examples
///
/// ```no_run
/// use leasehold_core::{Idempotency, ResourceName};
/// use leasehold_postgres::{guard, sqlx};
///
/// # async fn demo(pool: sqlx::PgPool) -> Result<(), Box<dyn std::error::Error>> {
/// let job = ResourceName::new("invoice-run-2024-06")?; // e.g. the message id
/// let mut tx = pool.begin().await?;
/// match guard::record_once(&mut tx, &job).await? {
///     Idempotency::AlreadyDone => return Ok(()), // delivered again after a commit: skip
///     Idempotency::FirstTime => { /* do the job's writes in `tx` */ }
/// }
/// tx.commit().await?;
/// # Ok(()) }
/// ```
pub async fn record_once(
    tx: &mut Transaction<'_, Postgres>,
    job_id: &ResourceName,
) -> Result<Idempotency, StoreError> {
    DEFAULT_GUARD.record_once(tx, job_id).await
}

/// [`PgGuard::migrate`] for the default tables (and the function `leasehold_guard` on the
/// `search_path`).
///
/// # Cancel safety
/// Cancel safe: one transaction.
///
/// # Errors
/// As [`PgGuard::migrate`].
///
/// # Examples
///
/// ```no_run
/// # async fn demo() -> Result<(), Box<dyn std::error::Error>> {
/// use leasehold_postgres::{guard, sqlx};
///
/// let pool = sqlx::PgPool::connect("postgres://app@db.internal/app").await?;
/// guard::migrate(&pool).await?; // creates leasehold_guard and leasehold_idempotency if missing
/// # Ok(()) }
/// ```
pub async fn migrate(pool: &PgPool) -> Result<(), StoreError> {
    DEFAULT_GUARD.migrate(pool).await
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names() {
        // The rules the guard's names used to be checked against at run time now hold by
        // construction of a `ResourceName`.
        let name = |s: &str| ResourceName::new(s);
        assert_eq!(name("ledger:invoices").unwrap().resource_type(), "ledger");
        assert_eq!(name("plain").unwrap().resource_type(), "none");
        assert!(name("").is_err());
        assert!(name("a\0").is_err());
        assert!(name(&"x".repeat(leasehold_core::guard::MAX_RESOURCE_LEN + 1)).is_err());
        assert!(name("ledger:x").is_ok());
    }
}
