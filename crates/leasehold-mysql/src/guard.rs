//! The storage-side fence guard and the idempotency record, in MariaDB/MySQL (docs/design.md §6).
//!
//! Both work inside **your** transaction on **your** database, so that checking the fence,
//! writing the data and advancing the guard commit or roll back together:
//!
//! ```no_run
//! # use leasehold_core::{Fence, Idempotency, ResourceName};
//! # use sqlx::Connection;
//! # async fn write(conn: &mut sqlx::MySqlConnection, fence: Fence) -> Result<(), Box<dyn std::error::Error>> {
//! // Names are validated once (1..=512 bytes, no NUL); a lease's key converts as it is.
//! let invoices = ResourceName::new("invoices")?;
//! let job = ResourceName::new("invoice-2024-06")?;
//! let mut tx = conn.begin().await?;
//! match leasehold_mysql::guard::record_once(&mut tx, &job).await? {
//!     Idempotency::AlreadyDone => return Ok(()), // committed before: skip the work
//!     Idempotency::FirstTime => {}
//! }
//! leasehold_mysql::guard::check_and_advance(&mut tx, &invoices, fence)
//!     .await?
//!     .into_result(&invoices, fence)?; // Err(FenceRejected): ownership lost, stop
//! sqlx::query("INSERT INTO invoices (month) VALUES ('2024-06')").execute(&mut *tx).await?;
//! tx.commit().await?;
//! # Ok(()) }
//! ```
//!
//! [`check_and_advance`] and [`record_once`] take the transaction itself: on a bare
//! connection (autocommit) the check would commit on its own and protect nothing written
//! after it, so such a call does not compile:
//!
//! ```compile_fail,E0308
//! # async fn write(conn: &mut sqlx::MySqlConnection, invoices: &leasehold_core::ResourceName, fence: leasehold_core::Fence) {
//! let _ = leasehold_mysql::guard::check_and_advance(conn, invoices, fence).await;
//! # }
//! ```
//!
//! ```compile_fail,E0308
//! # async fn write(conn: &mut sqlx::MySqlConnection, job: &leasehold_core::ResourceName) {
//! let _ = leasehold_mysql::guard::record_once(conn, job).await;
//! # }
//! ```
//!
//! The check reads the guard row with `SELECT … FOR UPDATE`, which locks it until your
//! transaction ends: writers of one resource pass the guard one at a time, in commit
//! order, at any isolation level (READ COMMITTED, REPEATABLE READ, SERIALIZABLE). A
//! deadlock or a lock wait timeout — likely when many writers race to create the row of a
//! new resource under REPEATABLE READ or SERIALIZABLE, whose gap locks conflict — comes
//! back as [`StoreErrorKind::Busy`]: roll back and retry the whole transaction. It is
//! never an acceptance.
//!
//! ## From SQL, in any language
//! [`migrate`] also creates the stored procedure [`GUARD_PROCEDURE`],
//! `leasehold_guard(resource, fence)`: the same check on the same table, so SQL callers
//! and Rust callers share one fence per resource. A stale fence SIGNALs SQLSTATE
//! [`FENCE_REJECTED_SQLSTATE`] (`LH001`). A procedure's error fails the `CALL`, **not the
//! transaction**: roll back (a client that stops at the error and disconnects, like the
//! `mariadb` client in batch mode, rolls back by closing the session):
//!
//! ```sql
//! START TRANSACTION;
//! CALL leasehold_guard('ledger:invoices', 42);  -- LH001 if 42 is stale: stop, ROLLBACK
//! UPDATE ledger SET total = total + 10 WHERE id = 1;
//! COMMIT;
//! ```
//!
//! `docs/shell.md` in the repository shows it from a `mariadb` script under
//! `leasehold run`.
//!
//! Create the tables and the procedure with [`migrate`] (or by hand from
//! [`schema_sql`]).

use leasehold_core::{Fence, GuardDecision, Idempotency, ResourceName, StoreError, StoreErrorKind};
use leasehold_sql::guard::{idempotency, rejected};
use sqlx::{MySql, MySqlConnection, MySqlPool, Transaction};

use crate::error::{Phase, is_duplicate, map_sqlx};
use crate::schema::GUARD_SCHEMA;
pub use crate::schema::{FENCE_REJECTED_SQLSTATE, GUARD_PROCEDURE};

/// The backend name in the guard's errors.
const BACKEND: &str = crate::BACKEND_TABLE;

fn sql_error(e: sqlx::Error, op: &str) -> StoreError {
    map_sqlx(e, BACKEND, op, Phase::Statement, None)
}

/// Creates the guard table `leasehold_guard`, the idempotency table
/// `leasehold_idempotency` and the stored procedure `leasehold_guard` ([`GUARD_PROCEDURE`])
/// in the database of `pool` if they do not exist (idempotent; safe to run concurrently).
///
/// # Cancel safety
/// Cancel safe: each table and the procedure is created by one statement, or not.
///
/// # Errors
/// [`StoreErrorKind::Config`] without the privilege to create tables (or, for the
/// procedure, `CREATE ROUTINE`).
///
/// # Examples
///
/// ```no_run
/// # async fn demo() -> Result<(), Box<dyn std::error::Error>> {
/// use leasehold_mysql::{guard, sqlx};
///
/// let pool = sqlx::MySqlPool::connect("mysql://app:secret@db:3306/app").await?;
/// guard::migrate(&pool).await?; // creates the guard tables and the leasehold_guard procedure if missing
/// # Ok(()) }
/// ```
pub async fn migrate(pool: &MySqlPool) -> Result<(), StoreError> {
    let map = |e| sql_error(e, "migrate guard");
    sqlx::raw_sql(GUARD_SCHEMA)
        .execute(pool)
        .await
        .map_err(map)?;
    let exists: i64 = sqlx::query_scalar(
        "SELECT COUNT(*) FROM information_schema.ROUTINES WHERE ROUTINE_SCHEMA = DATABASE() \
         AND ROUTINE_NAME = 'leasehold_guard' AND ROUTINE_TYPE = 'PROCEDURE'",
    )
    .fetch_one(pool)
    .await
    .map_err(map)?;
    if exists == 0 {
        match sqlx::raw_sql(GUARD_PROCEDURE).execute(pool).await {
            Ok(_) => {}
            // 1304: created by a concurrent migration meanwhile.
            Err(e) if crate::error::error_number(&e) == Some(1304) => {}
            Err(e) => return Err(map(e)),
        }
    }
    Ok(())
}

/// What [`migrate`] creates, as a script for the `mariadb` (or `mysql`) command-line
/// client: the guard tables, then the procedure between `DELIMITER` lines. It drops and
/// re-creates the procedure, so running it again installs the current version (a `CALL`
/// in that instant fails and its transaction must roll back: safe, not silent).
pub fn schema_sql() -> String {
    format!(
        "{GUARD_SCHEMA};\nDROP PROCEDURE IF EXISTS leasehold_guard;\nDELIMITER //\n{GUARD_PROCEDURE}\n//\nDELIMITER ;\n"
    )
}

async fn locked_fence(
    conn: &mut MySqlConnection,
    resource: &ResourceName,
) -> Result<Option<u64>, StoreError> {
    sqlx::query_scalar("SELECT fence FROM leasehold_guard WHERE resource = ? FOR UPDATE")
        .bind(resource.as_str())
        .fetch_optional(conn)
        .await
        .map_err(|e| sql_error(e, "guard check"))
}

/// Checks `fence` against the highest fence accepted for `resource` and, if it is not
/// lower, records it: [`GuardDecision::Accepted`] — go on with the write in this
/// transaction. A lower fence is [`GuardDecision::Rejected`] (the writer lost its lease;
/// roll back, do not retry with this fence) and is counted in
/// `leasehold_fence_rejected_total`. Equal fences (several writes by one holder) are
/// accepted.
///
/// The guard row stays locked until your transaction ends. It takes the transaction of
/// the protected write (see the module docs), so it cannot be called outside one; the
/// decision holds only if that transaction commits.
///
/// # Cancel safety
/// Cancel safe as far as the data goes: a dropped call leaves the transaction open with or
/// without the guard row advanced; roll it back (dropping an sqlx transaction does).
///
/// # Errors
/// [`StoreErrorKind::Busy`] for a deadlock or a lock wait timeout (roll back, retry the
/// whole transaction); [`StoreErrorKind::Config`] when the table is missing or not
/// accessible.
///
/// # Examples
///
/// ```no_run
/// use leasehold_core::ResourceName;
/// use leasehold_mysql::{guard, sqlx};
///
/// # async fn demo(pool: sqlx::MySqlPool, lease: leasehold_core::Lease) -> Result<(), Box<dyn std::error::Error>> {
/// let ledger = ResourceName::from(lease.key()); // the lease's key names the resource
/// let mut tx = pool.begin().await?;
/// guard::check_and_advance(&mut tx, &ledger, lease.fence())
///     .await? // Busy (deadlock, lock wait timeout): retry the whole transaction
///     .into_result(&ledger, lease.fence())?; // FenceRejected: the lease was lost; stop
/// sqlx::query("UPDATE ledger SET total = total + ?").bind(10_i64).execute(&mut *tx).await?;
/// tx.commit().await.map_err(leasehold_mysql::store_error)?;
/// # Ok(()) }
/// ```
pub async fn check_and_advance(
    tx: &mut Transaction<'_, MySql>,
    resource: &ResourceName,
    fence: Fence,
) -> Result<GuardDecision, StoreError> {
    let conn: &mut MySqlConnection = tx;
    let f = fence.get();
    let mut current = locked_fence(conn, resource).await?;
    if current.is_none() {
        // First write to this resource: create its row. A concurrent first writer may win
        // the insert; its row is then there to lock.
        match sqlx::query("INSERT INTO leasehold_guard (resource, fence) VALUES (?, ?)")
            .bind(resource.as_str())
            .bind(f)
            .execute(&mut *conn)
            .await
        {
            Ok(_) => return Ok(GuardDecision::Accepted { previous: None }),
            Err(e) if is_duplicate(&e) => {
                current = locked_fence(conn, resource).await?;
            }
            Err(e) => return Err(sql_error(e, "guard advance")),
        }
    }
    let Some(current) = current.map(Fence) else {
        return Err(StoreError::new(
            StoreErrorKind::Busy,
            BACKEND,
            "the guard row was created and removed concurrently; retry the transaction",
        ));
    };
    if fence < current {
        return Ok(rejected(BACKEND, resource, fence, current));
    }
    sqlx::query(
        "UPDATE leasehold_guard SET fence = ?, accepted_at = CURRENT_TIMESTAMP(6) WHERE resource = ?",
    )
    .bind(f)
    .bind(resource.as_str())
    .execute(conn)
    .await
    .map_err(|e| sql_error(e, "guard advance"))?;
    Ok(GuardDecision::Accepted {
        previous: Some(current),
    })
}

/// The highest fence accepted for `resource`, if any: a plain, non-locking read on any
/// connection — a pooled one, a plain one, or a transaction (`&mut tx` derefs to its
/// connection). It writes nothing, so it needs no transaction.
///
/// # Cancel safety
/// Cancel safe: it only reads.
///
/// # Errors
/// Database errors as in [`check_and_advance`].
pub async fn current(
    conn: &mut MySqlConnection,
    resource: &ResourceName,
) -> Result<Option<Fence>, StoreError> {
    let f: Option<u64> = sqlx::query_scalar("SELECT fence FROM leasehold_guard WHERE resource = ?")
        .bind(resource.as_str())
        .fetch_optional(conn)
        .await
        .map_err(|e| sql_error(e, "guard read"))?;
    Ok(f.map(Fence))
}

/// Records `job_id` in the idempotency table: [`Idempotency::FirstTime`] — do the work in
/// this transaction; [`Idempotency::AlreadyDone`] — a committed transaction recorded it
/// before, skip the work. The record commits or rolls back with your transaction, which it
/// takes (so it cannot be called outside one); a concurrent transaction recording the
/// same id waits for yours to end.
///
/// A job id follows the rules of a resource name (1 to 512 bytes, no NUL; it is stored in
/// a column of the same kind), so it is a [`ResourceName`] too.
///
/// # Cancel safety
/// Cancel safe as far as the data goes, as [`check_and_advance`].
///
/// # Errors
/// [`StoreErrorKind::Busy`] for a lock wait timeout behind another transaction recording
/// the same id.
///
/// # Examples
///
/// ```no_run
/// use leasehold_core::{Idempotency, ResourceName};
/// use leasehold_mysql::{guard, sqlx};
///
/// # async fn demo(pool: sqlx::MySqlPool) -> Result<(), Box<dyn std::error::Error>> {
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
    tx: &mut Transaction<'_, MySql>,
    job_id: &ResourceName,
) -> Result<Idempotency, StoreError> {
    match sqlx::query("INSERT INTO leasehold_idempotency (job_id) VALUES (?)")
        .bind(job_id.as_str())
        .execute(&mut **tx)
        .await
    {
        Ok(_) => Ok(idempotency(true)),
        Err(e) if is_duplicate(&e) => Ok(idempotency(false)),
        Err(e) => Err(sql_error(e, "idempotency record")),
    }
}
