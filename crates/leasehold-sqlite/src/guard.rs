//! The storage-side fence guard and the idempotency record, in SQLite (docs/design.md §6).
//!
//! Both work inside **your** transaction on **your** SQLite database (which may or may not
//! be the file that holds the leases), so that checking the fence, writing the data and
//! advancing the guard commit or roll back together:
//!
//! ```
//! # use leasehold_core::{Fence, Idempotency, ResourceName};
//! # use leasehold_sqlite::sqlx::{self, Connection};
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() -> Result<(), Box<dyn std::error::Error>> {
//! #     let dir = tempfile::tempdir()?;
//! #     let pool = sqlx::SqlitePool::connect(&format!("sqlite://{}/app.db?mode=rwc", dir.path().display())).await?;
//! #     leasehold_sqlite::guard::migrate(&pool).await?;
//! #     sqlx::query("CREATE TABLE invoices (month TEXT NOT NULL)").execute(&pool).await?;
//! #     let mut conn = pool.acquire().await?;
//! #     write(&mut conn, Fence(7)).await?;
//! #     write(&mut conn, Fence(7)).await?; // the second time, the job is already done
//! #     let rows: i64 = sqlx::query_scalar("SELECT count(*) FROM invoices").fetch_one(&mut *conn).await?;
//! #     assert_eq!(rows, 1);
//! #     Ok(())
//! # }
//! # async fn write(conn: &mut sqlx::SqliteConnection, fence: Fence) -> Result<(), Box<dyn std::error::Error>> {
//! // Names are validated once (1..=512 bytes, no NUL); a lease's key converts as it is.
//! let invoices = ResourceName::new("invoices")?;
//! let job = ResourceName::new("invoice-2024-06")?;
//! // BEGIN IMMEDIATE takes the write lock first, so the guard row cannot change between
//! // the check and the commit.
//! let mut tx = conn.begin_with("BEGIN IMMEDIATE").await?;
//! match leasehold_sqlite::guard::record_once(&mut tx, &job).await? {
//!     Idempotency::AlreadyDone => return Ok(()), // committed before: skip the work
//!     Idempotency::FirstTime => {}
//! }
//! leasehold_sqlite::guard::check_and_advance(&mut tx, &invoices, fence)
//!     .await?
//!     .into_result(&invoices, fence)?; // Err(FenceRejected): ownership lost, stop
//! sqlx::query("INSERT INTO invoices (month) VALUES ('2024-06')").execute(&mut *tx).await?;
//! tx.commit().await?;
//! # Ok(()) }
//! ```
//!
//! [`check_and_advance`] and [`record_once`] take the transaction itself: on a bare
//! connection the check would commit on its own and protect nothing written after it, so
//! such a call does not compile:
//!
//! ```compile_fail,E0308
//! # async fn write(conn: &mut sqlx::SqliteConnection, invoices: &leasehold_core::ResourceName, fence: leasehold_core::Fence) {
//! let _ = leasehold_sqlite::guard::check_and_advance(conn, invoices, fence).await;
//! # }
//! ```
//!
//! ```compile_fail,E0308
//! # async fn write(conn: &mut sqlx::SqliteConnection, job: &leasehold_core::ResourceName) {
//! let _ = leasehold_sqlite::guard::record_once(conn, job).await;
//! # }
//! ```
//!
//! SQLite runs one writer at a time, so write transactions are serializable. Begin them
//! with `BEGIN IMMEDIATE`: a plain (deferred) `BEGIN` reads first and may find when it
//! writes that another connection committed meanwhile; SQLite then refuses the write
//! (`SQLITE_BUSY_SNAPSHOT`), reported as [`StoreErrorKind::Busy`] — roll back and retry the
//! whole transaction; never is such a write accepted.
//!
//! ## From SQL, in any language
//! SQLite has no stored procedures: the SQL guard is a view and its trigger (in
//! [`GUARD_SCHEMA`]). Insert the fence into `leasehold_guard_check` in the transaction of
//! the protected write; a stale fence fails the insert with `RAISE(ABORT, …)` (message
//! starting with [`FENCE_REJECTED_MESSAGE`]): roll back. It checks and advances the same
//! row as [`check_and_advance`], so SQL and Rust callers share one fence per resource:
//!
//! ```sql
//! BEGIN IMMEDIATE;
//! INSERT INTO leasehold_guard_check (resource, fence) VALUES ('ledger:invoices', 42);
//! UPDATE ledger SET total = total + 10 WHERE id = 1;
//! COMMIT;
//! ```
//!
//! Run such a script with `sqlite3 -bail`: it stops at the error without committing, and
//! the open transaction rolls back. `docs/shell.md` in
//! the repository shows it under `leasehold run`.
//!
//! Create the tables with [`migrate`] (or by hand from
//! [`GUARD_SCHEMA`]).

#[cfg(doc)]
use leasehold_core::StoreErrorKind;
use leasehold_core::{Fence, GuardDecision, Idempotency, ResourceName, StoreError};
use leasehold_sql::guard::{fence_from_i64, fence_to_i64, idempotency, rejected};
use leasehold_sql::{Failure, with_conn};
use sqlx::{Connection, Sqlite, SqliteConnection, SqlitePool, Transaction};

use crate::BACKEND;
use crate::clock::wall_us;
use crate::error::{SqliteErrors, map_sqlx};
pub use crate::schema::FENCE_REJECTED_MESSAGE;
use crate::schema::GUARD_SCHEMA;

pub(crate) async fn migrate_in(conn: &mut SqliteConnection) -> Result<(), Failure> {
    sqlx::raw_sql(GUARD_SCHEMA).execute(conn).await?;
    Ok(())
}

/// Creates the guard table `leasehold_guard` and the idempotency table
/// `leasehold_idempotency` in the database of `pool` if they do not exist (idempotent;
/// [`SqliteStore::connect`](crate::SqliteStore::connect) creates them in the lease file).
///
/// # Cancel safety
/// Cancel safe: the tables are created by one transaction, or not.
///
/// # Errors
/// [`StoreErrorKind::Config`] when the database cannot be written,
/// [`StoreErrorKind::Busy`] when it stays locked past the busy timeout.
///
/// # Examples
///
/// ```
/// use leasehold_sqlite::{guard, sqlx};
///
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
/// # let dir = tempfile::tempdir()?;
/// # let pool = &sqlx::SqlitePool::connect(&format!("sqlite://{}/app.db?mode=rwc", dir.path().display())).await?;
/// // `pool`: your application's own database.
/// guard::migrate(pool).await?;
/// guard::migrate(pool).await?; // idempotent: run it at every start
/// # Ok(()) }
/// ```
pub async fn migrate(pool: &SqlitePool) -> Result<(), StoreError> {
    with_conn(pool, &SqliteErrors, "migrate guard", async |conn| {
        // The write lock first, so that processes migrating at once wait for each other
        // (the busy timeout) instead of one failing at once on a stale read of the schema.
        let mut tx = conn.begin_with("BEGIN IMMEDIATE").await?;
        migrate_in(&mut tx).await?;
        tx.commit().await?;
        Ok(())
    })
    .await
}

async fn read_fence(
    conn: &mut SqliteConnection,
    resource: &ResourceName,
    op: &str,
) -> Result<Option<Fence>, StoreError> {
    let fence: Option<i64> =
        sqlx::query_scalar("SELECT fence FROM leasehold_guard WHERE resource = ?1")
            .bind(resource.as_str())
            .fetch_optional(conn)
            .await
            .map_err(|e| map_sqlx(e, op))?;
    Ok(fence.map(fence_from_i64))
}

/// Checks `fence` against the highest fence accepted for `resource` and, if it is not
/// lower, records it: [`GuardDecision::Accepted`] — go on with the write in this
/// transaction. A lower fence is [`GuardDecision::Rejected`] (the writer lost its lease;
/// roll back, do not retry with this fence) and is counted in
/// `leasehold_fence_rejected_total`. Equal fences (several writes by one holder) are
/// accepted.
///
/// It takes the transaction of the protected write (see the module docs), so it cannot be
/// called outside one; the decision holds only if that transaction commits.
///
/// # Cancel safety
/// Cancel safe as far as the data goes: a dropped call leaves the transaction open with or
/// without the guard row advanced; roll it back (dropping an sqlx transaction does).
///
/// # Errors
/// [`StoreErrorKind::InvalidInput`] for a fence above `i64::MAX`;
/// [`StoreErrorKind::Busy`] when SQLite refuses the write (lock timeout, stale snapshot):
/// roll back and retry the whole transaction; [`StoreErrorKind::Config`] when the table is
/// missing.
///
/// # Examples
///
/// ```
/// use leasehold_core::{Error, Fence, GuardDecision, ResourceName};
/// use leasehold_sqlite::{guard, sqlx::{self, Connection}};
///
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
/// # let dir = tempfile::tempdir()?;
/// # let pool = &sqlx::SqlitePool::connect(&format!("sqlite://{}/app.db?mode=rwc", dir.path().display())).await?;
/// # guard::migrate(pool).await?;
/// let ledger = ResourceName::new("ledger:invoices")?;
/// let mut conn = pool.acquire().await?;
///
/// // The holder with fence 8 writes (equal fences pass: it may write many times).
/// let mut tx = conn.begin_with("BEGIN IMMEDIATE").await?;
/// let decision = guard::check_and_advance(&mut tx, &ledger, Fence(8)).await?;
/// assert_eq!(decision, GuardDecision::Accepted { previous: None });
/// // ... the protected writes, in `tx` ...
/// tx.commit().await?;
///
/// // A holder that lost its lease (fence 7) wakes up and tries to write: refused.
/// let mut tx = conn.begin_with("BEGIN IMMEDIATE").await?;
/// let decision = guard::check_and_advance(&mut tx, &ledger, Fence(7)).await?;
/// assert_eq!(decision, GuardDecision::Rejected { current: Fence(8) });
/// let err = decision.into_result(&ledger, Fence(7)).unwrap_err();
/// assert!(matches!(err, Error::FenceRejected { .. }));
/// tx.rollback().await?;
/// # Ok(()) }
/// ```
pub async fn check_and_advance(
    tx: &mut Transaction<'_, Sqlite>,
    resource: &ResourceName,
    fence: Fence,
) -> Result<GuardDecision, StoreError> {
    let f = fence_to_i64(BACKEND, fence)?;
    let conn: &mut SqliteConnection = tx;
    let current = read_fence(conn, resource, "guard check").await?;
    if let Some(current) = current
        && fence < current
    {
        return Ok(rejected(BACKEND, resource, fence, current));
    }
    sqlx::query(
        "INSERT INTO leasehold_guard (resource, fence, accepted_at_us) VALUES (?1, ?2, ?3) \
         ON CONFLICT (resource) DO UPDATE SET fence = excluded.fence, accepted_at_us = excluded.accepted_at_us",
    )
    .bind(resource.as_str())
    .bind(f)
    .bind(wall_us())
    .execute(conn)
    .await
    .map_err(|e| map_sqlx(e, "guard advance"))?;
    Ok(GuardDecision::Accepted { previous: current })
}

/// The highest fence accepted for `resource`, if any: a plain read on any connection — a
/// pooled one, a plain one, or a transaction (`&mut tx` derefs to its connection; it then
/// sees the transaction's own uncommitted advance). It writes nothing, so it needs no
/// transaction.
///
/// # Cancel safety
/// Cancel safe: it only reads.
///
/// # Errors
/// Database errors as in [`check_and_advance`].
///
/// # Examples
///
/// ```
/// use leasehold_core::{Fence, ResourceName};
/// use leasehold_sqlite::{guard, sqlx::{self, Connection}};
///
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
/// # let dir = tempfile::tempdir()?;
/// # let pool = &sqlx::SqlitePool::connect(&format!("sqlite://{}/app.db?mode=rwc", dir.path().display())).await?;
/// # guard::migrate(pool).await?;
/// let ledger = ResourceName::new("ledger:invoices")?;
/// let mut conn = pool.acquire().await?;
/// assert_eq!(guard::current(&mut conn, &ledger).await?, None); // never written
/// let mut tx = conn.begin_with("BEGIN IMMEDIATE").await?;
/// guard::check_and_advance(&mut tx, &ledger, Fence(3)).await?;
/// tx.commit().await?;
/// assert_eq!(guard::current(&mut conn, &ledger).await?, Some(Fence(3)));
/// # Ok(()) }
/// ```
pub async fn current(
    conn: &mut SqliteConnection,
    resource: &ResourceName,
) -> Result<Option<Fence>, StoreError> {
    read_fence(conn, resource, "guard read").await
}

/// Records `job_id` in the idempotency table: [`Idempotency::FirstTime`] — do the work in
/// this transaction; [`Idempotency::AlreadyDone`] — a committed transaction recorded it
/// before, skip the work. The record commits or rolls back with your transaction, which
/// it takes (so it cannot be called outside one).
///
/// A job id follows the rules of a resource name (1 to 512 bytes, no NUL; it is stored in
/// a column of the same kind), so it is a [`ResourceName`] too.
///
/// # Cancel safety
/// Cancel safe as far as the data goes, as [`check_and_advance`].
///
/// # Errors
/// [`StoreErrorKind::Busy`] when SQLite refuses the write (retry the whole transaction);
/// [`StoreErrorKind::Config`] when the table is missing.
///
/// # Examples
///
/// ```
/// use leasehold_core::{Idempotency, ResourceName};
/// use leasehold_sqlite::{guard, sqlx::{self, Connection}};
///
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
/// # let dir = tempfile::tempdir()?;
/// # let pool = &sqlx::SqlitePool::connect(&format!("sqlite://{}/app.db?mode=rwc", dir.path().display())).await?;
/// # guard::migrate(pool).await?;
/// let job = ResourceName::new("invoice-run-2024-06")?;
/// let mut conn = pool.acquire().await?;
///
/// let mut tx = conn.begin_with("BEGIN IMMEDIATE").await?;
/// assert_eq!(guard::record_once(&mut tx, &job).await?, Idempotency::FirstTime);
/// // ... do the job's writes in `tx` ...
/// tx.commit().await?;
///
/// // Redelivered after the commit (a retry, a crash before the ack): skip it.
/// let mut tx = conn.begin_with("BEGIN IMMEDIATE").await?;
/// assert_eq!(guard::record_once(&mut tx, &job).await?, Idempotency::AlreadyDone);
/// tx.rollback().await?;
/// # Ok(()) }
/// ```
pub async fn record_once(
    tx: &mut Transaction<'_, Sqlite>,
    job_id: &ResourceName,
) -> Result<Idempotency, StoreError> {
    let inserted = sqlx::query(
        "INSERT INTO leasehold_idempotency (job_id, recorded_at_us) VALUES (?1, ?2) \
         ON CONFLICT (job_id) DO NOTHING",
    )
    .bind(job_id.as_str())
    .bind(wall_us())
    .execute(&mut **tx)
    .await
    .map_err(|e| map_sqlx(e, "idempotency record"))?
    .rows_affected();
    Ok(idempotency(inserted == 1))
}
