//! The storage-side fence guard and the idempotency record, in SQLite (DESIGN §6).
//!
//! Both work inside **your** transaction on **your** SQLite database (which may or may not
//! be the file that holds the leases), so that checking the fence, writing the data and
//! advancing the guard commit or roll back together:
//!
//! ```no_run
//! # use leasehold_core::{Fence, GuardDecision, Idempotency};
//! # use sqlx::Connection;
//! # async fn write(conn: &mut sqlx::SqliteConnection, fence: Fence) -> Result<(), Box<dyn std::error::Error>> {
//! // BEGIN IMMEDIATE takes the write lock first, so the guard row cannot change between
//! // the check and the commit.
//! let mut tx = conn.begin_with("BEGIN IMMEDIATE").await?;
//! match leasehold_sqlite::guard::record_once(&mut tx, "invoice-2024-06").await? {
//!     Idempotency::AlreadyDone => return Ok(()), // committed before: skip the work
//!     Idempotency::FirstTime => {}
//! }
//! leasehold_sqlite::guard::check_and_advance(&mut tx, "invoices", fence)
//!     .await?
//!     .into_result(&"invoices".parse()?, fence)?; // Err(FenceRejected): ownership lost, stop
//! sqlx::query("INSERT INTO invoices (month) VALUES ('2024-06')").execute(&mut *tx).await?;
//! tx.commit().await?;
//! # Ok(()) }
//! ```
//!
//! SQLite runs one writer at a time, so write transactions are serializable. Begin them
//! with `BEGIN IMMEDIATE`: a plain (deferred) `BEGIN` reads first and may find when it
//! writes that another connection committed meanwhile; SQLite then refuses the write
//! (`SQLITE_BUSY_SNAPSHOT`), reported as [`StoreErrorKind::Busy`] — roll back and retry the
//! whole transaction; never is such a write accepted.
//!
//! Create the tables with [`migrate`] (or by hand from
//! [`GUARD_SCHEMA`]).

use leasehold_core::{Fence, GuardDecision, Idempotency, StoreError, StoreErrorKind};
use sqlx::{Connection, SqliteConnection, SqlitePool};

use crate::BACKEND;
use crate::clock::wall_us;
use crate::error::{Failure, map_sqlx};
use crate::schema::GUARD_SCHEMA;

/// The longest resource name or job id accepted, in bytes.
pub const MAX_NAME_LEN: usize = 512;

fn invalid(msg: impl Into<String>) -> StoreError {
    StoreError::new(StoreErrorKind::InvalidInput, BACKEND, msg)
}

fn check_name(what: &str, name: &str) -> Result<(), StoreError> {
    if name.is_empty() {
        return Err(invalid(format!("the {what} is empty")));
    }
    if name.len() > MAX_NAME_LEN {
        return Err(invalid(format!(
            "the {what} is {} bytes long; the maximum is {MAX_NAME_LEN}",
            name.len()
        )));
    }
    if name.contains('\0') {
        return Err(invalid(format!("the {what} contains a NUL character")));
    }
    Ok(())
}

fn check_in_transaction(conn: &SqliteConnection, what: &str) -> Result<(), StoreError> {
    if conn.is_in_transaction() {
        Ok(())
    } else {
        Err(invalid(format!(
            "{what} must run inside a transaction begun with sqlx (`begin_with(\"BEGIN IMMEDIATE\")`), \
             together with the write it protects"
        )))
    }
}

/// The resource type of a resource name, as [`leasehold_core::Key::resource_type`] computes it:
/// the part before the first `:`, or `none`.
fn resource_type(resource: &str) -> &str {
    match resource.split_once(':') {
        Some((prefix, _)) if !prefix.is_empty() => prefix,
        _ => "none",
    }
}

pub(crate) async fn migrate_in(conn: &mut SqliteConnection) -> Result<(), Failure> {
    sqlx::raw_sql(GUARD_SCHEMA).execute(conn).await?;
    Ok(())
}

/// Creates the guard table `leasehold_guard` and the idempotency table
/// `leasehold_idempotency` in the database of `pool` if they do not exist (idempotent;
/// [`SqliteStore::connect`](crate::SqliteStore::connect) creates them in the lease file).
///
/// # Cancel safety
/// Cancel safe: each table is created by one statement, or not.
///
/// # Errors
/// [`StoreErrorKind::Config`] when the database cannot be written,
/// [`StoreErrorKind::Busy`] when it stays locked past the busy timeout.
pub async fn migrate(pool: &SqlitePool) -> Result<(), StoreError> {
    let mut conn = pool
        .acquire()
        .await
        .map_err(|e| map_sqlx(e, "migrate guard"))?;
    migrate_in(&mut conn)
        .await
        .map_err(|f| f.into_store("migrate guard"))
}

/// Checks `fence` against the highest fence accepted for `resource` and, if it is not
/// lower, records it: [`GuardDecision::Accepted`] — go on with the write in this
/// transaction. A lower fence is [`GuardDecision::Rejected`] (the writer lost its lease;
/// roll back, do not retry with this fence) and is counted in
/// `leasehold_fence_rejected_total`. Equal fences (several writes by one holder) are
/// accepted.
///
/// Call it inside the transaction of the protected write (see the module docs); the
/// decision holds only if that transaction commits.
///
/// # Cancel safety
/// Cancel safe as far as the data goes: a dropped call leaves the transaction open with or
/// without the guard row advanced; roll it back (dropping an sqlx transaction does).
///
/// # Errors
/// [`StoreErrorKind::InvalidInput`] for an empty, oversized (> 512 bytes) or NUL-carrying
/// resource name, a fence above `i64::MAX`, or a connection not inside a transaction;
/// [`StoreErrorKind::Busy`] when SQLite refuses the write (lock timeout, stale snapshot):
/// roll back and retry the whole transaction; [`StoreErrorKind::Config`] when the table is
/// missing.
pub async fn check_and_advance(
    conn: &mut SqliteConnection,
    resource: &str,
    fence: Fence,
) -> Result<GuardDecision, StoreError> {
    check_name("resource name", resource)?;
    check_in_transaction(conn, "the fence guard")?;
    let f = i64::try_from(fence.get())
        .map_err(|_| invalid(format!("fence {fence} does not fit SQLite's INTEGER")))?;
    let current: Option<i64> =
        sqlx::query_scalar("SELECT fence FROM leasehold_guard WHERE resource = ?1")
            .bind(resource)
            .fetch_optional(&mut *conn)
            .await
            .map_err(|e| map_sqlx(e, "guard check"))?;
    if let Some(current) = current
        && f < current
    {
        leasehold_core::metrics::fence_rejected(resource_type(resource));
        tracing::warn!(resource, %fence, current, "stale fence rejected by the sqlite guard");
        return Ok(GuardDecision::Rejected {
            current: Fence(u64::try_from(current).unwrap_or(0)),
        });
    }
    sqlx::query(
        "INSERT INTO leasehold_guard (resource, fence, accepted_at_us) VALUES (?1, ?2, ?3) \
         ON CONFLICT (resource) DO UPDATE SET fence = excluded.fence, accepted_at_us = excluded.accepted_at_us",
    )
    .bind(resource)
    .bind(f)
    .bind(wall_us())
    .execute(&mut *conn)
    .await
    .map_err(|e| map_sqlx(e, "guard advance"))?;
    Ok(GuardDecision::Accepted {
        previous: current.map(|c| Fence(u64::try_from(c).unwrap_or(0))),
    })
}

/// The highest fence accepted for `resource`, if any (a plain read).
///
/// # Cancel safety
/// Cancel safe: it only reads.
///
/// # Errors
/// [`StoreErrorKind::InvalidInput`] for a bad resource name; database errors as in
/// [`check_and_advance`].
pub async fn current(
    conn: &mut SqliteConnection,
    resource: &str,
) -> Result<Option<Fence>, StoreError> {
    check_name("resource name", resource)?;
    let current: Option<i64> =
        sqlx::query_scalar("SELECT fence FROM leasehold_guard WHERE resource = ?1")
            .bind(resource)
            .fetch_optional(conn)
            .await
            .map_err(|e| map_sqlx(e, "guard read"))?;
    Ok(current.map(|c| Fence(u64::try_from(c).unwrap_or(0))))
}

/// Records `job_id` in the idempotency table: [`Idempotency::FirstTime`] — do the work in
/// this transaction; [`Idempotency::AlreadyDone`] — a committed transaction recorded it
/// before, skip the work. The record commits or rolls back with your transaction.
///
/// # Cancel safety
/// Cancel safe as far as the data goes, as [`check_and_advance`].
///
/// # Errors
/// [`StoreErrorKind::InvalidInput`] for an empty, oversized (> 512 bytes) or NUL-carrying
/// job id or a connection not inside a transaction; [`StoreErrorKind::Busy`] when SQLite
/// refuses the write (retry the whole transaction).
pub async fn record_once(
    conn: &mut SqliteConnection,
    job_id: &str,
) -> Result<Idempotency, StoreError> {
    check_name("job id", job_id)?;
    check_in_transaction(conn, "the idempotency record")?;
    let inserted = sqlx::query(
        "INSERT INTO leasehold_idempotency (job_id, recorded_at_us) VALUES (?1, ?2) \
         ON CONFLICT (job_id) DO NOTHING",
    )
    .bind(job_id)
    .bind(wall_us())
    .execute(conn)
    .await
    .map_err(|e| map_sqlx(e, "idempotency record"))?
    .rows_affected();
    Ok(if inserted == 1 {
        Idempotency::FirstTime
    } else {
        Idempotency::AlreadyDone
    })
}
