//! The SQL schema, as plain statements a DBA can read and run by hand.

/// The lease table: one row per lease key ever used, never deleted (its fence must
/// survive). `owner`, `boot_id` and `expires_boot_us` are `NULL` while the key is free.
///
/// Expiry is on the host's `CLOCK_BOOTTIME` (microseconds since boot, suspended time
/// included), valid only under the boot it was written in: a row whose `boot_id` is not
/// the host's current boot id has expired. (Format 2; format 1 had `expires_at_us` on the
/// wall clock and is converted by [`SqliteStore::migrate`](crate::SqliteStore::migrate).)
pub const LEASES_SCHEMA: &str = "\
CREATE TABLE IF NOT EXISTS leasehold_leases (
    lease_key       TEXT    NOT NULL PRIMARY KEY, -- the lease key (UTF-8, at most 512 bytes)
    owner           TEXT,                         -- 32 lowercase hex digits; NULL when free
    fence           INTEGER NOT NULL,             -- the last fence issued; never lowered
    boot_id         TEXT,                         -- the host's boot id when the expiry was set; NULL when free
    expires_boot_us INTEGER                       -- CLOCK_BOOTTIME of that boot, in microseconds; NULL when free
) STRICT";

/// The records table of [`Store::put_record`](leasehold_core::Store::put_record): one row
/// per record key ever written (an election or semaphore name), never deleted (records do
/// not expire). A row is replaced only by a write with a higher fence. Added beside the
/// lease table of format 2 by [`SqliteStore::migrate`](crate::SqliteStore::migrate); older
/// versions never read it, so processes of both can share a file.
pub const RECORDS_SCHEMA: &str = "\
CREATE TABLE IF NOT EXISTS leasehold_records (
    record_key TEXT    NOT NULL PRIMARY KEY,                   -- the record key (UTF-8, at most 512 bytes)
    fence      INTEGER NOT NULL CHECK (fence >= 0),            -- the fence it was written at
    value      BLOB    NOT NULL CHECK (length(value) <= 4096)  -- any bytes, at most 4096
) STRICT";

/// Format 1 to format 2, in one write transaction with the table of format 1 in place
/// (parameters: `?1` the wall clock in µs, `?2` the boot id, `?3` `CLOCK_BOOTTIME` in µs,
/// `?4` the longest TTL in µs). A held row keeps the time it had left on the wall clock,
/// at most the longest TTL, from now on the boot clock; a row whose time had run out gets
/// an expiry of now (expired). Owners and fences are copied as they are, so a row that
/// was not a lease stays one that is reported as corrupt.
pub(crate) const CONVERT_FROM_FORMAT_1: [&str; 4] = [
    "CREATE TABLE leasehold_leases_format2 (
    lease_key       TEXT    NOT NULL PRIMARY KEY, -- the lease key (UTF-8, at most 512 bytes)
    owner           TEXT,                         -- 32 lowercase hex digits; NULL when free
    fence           INTEGER NOT NULL,             -- the last fence issued; never lowered
    boot_id         TEXT,                         -- the host's boot id when the expiry was set; NULL when free
    expires_boot_us INTEGER                       -- CLOCK_BOOTTIME of that boot, in microseconds; NULL when free
) STRICT",
    "INSERT INTO leasehold_leases_format2 (lease_key, owner, fence, boot_id, expires_boot_us)
    SELECT lease_key, owner, fence,
        CASE WHEN owner IS NOT NULL AND expires_at_us IS NOT NULL THEN ?2 END,
        CASE WHEN owner IS NOT NULL AND expires_at_us IS NOT NULL
            THEN ?3 + max(0, min(expires_at_us - ?1, ?4)) END
    FROM leasehold_leases",
    "DROP TABLE leasehold_leases",
    "ALTER TABLE leasehold_leases_format2 RENAME TO leasehold_leases",
];

/// The guard table (one row per protected resource: the highest fence accepted), the
/// idempotency record (one row per job id done), and the SQL guard for clients without
/// Rust: the view `leasehold_guard_check (resource, fence)`, whose `INSTEAD OF INSERT`
/// trigger does what [`guard::check_and_advance`](crate::guard::check_and_advance) does on
/// the same table (a fence at least the highest accepted passes, equal ones too, and is
/// recorded) and fails the insert of a lower fence with `RAISE(ABORT, …)`, whose message
/// starts with [`FENCE_REJECTED_MESSAGE`]. In the transaction of the protected write
/// (begun with `BEGIN IMMEDIATE`), before the write:
///
/// ```sql
/// INSERT INTO leasehold_guard_check (resource, fence) VALUES ('ledger:invoices', 42);
/// ```
///
/// The fence must be an integer (not text) and the resource text of 1 to 512 bytes
/// without NUL; anything else is refused the same way. Like a stored procedure's error in
/// other databases, the error fails the statement, not the transaction: the caller must
/// roll back. A `sqlite3` script must stop at the error (`sqlite3 -bail`): the shell then
/// exits without committing, and SQLite rolls the open transaction back. (`ABORT` rather
/// than `ROLLBACK` keeps drivers that track their transaction, such as sqlx, in step.)
pub const GUARD_SCHEMA: &str = "\
CREATE TABLE IF NOT EXISTS leasehold_guard (
    resource       TEXT    NOT NULL PRIMARY KEY, -- the protected resource (UTF-8, at most 512 bytes)
    fence          INTEGER NOT NULL,             -- the highest fence accepted
    accepted_at_us INTEGER NOT NULL              -- wall clock, unix time in microseconds (informational)
) STRICT;
CREATE TABLE IF NOT EXISTS leasehold_idempotency (
    job_id         TEXT    NOT NULL PRIMARY KEY, -- the job id (UTF-8, at most 512 bytes)
    recorded_at_us INTEGER NOT NULL              -- wall clock, unix time in microseconds (informational)
) STRICT;
-- The SQL guard: INSERT INTO leasehold_guard_check (resource, fence) VALUES (...) in the
-- transaction of the protected write; a stale fence fails it: roll back.
CREATE VIEW IF NOT EXISTS leasehold_guard_check (resource, fence) AS
    SELECT resource, fence FROM leasehold_guard WHERE 0;
CREATE TRIGGER IF NOT EXISTS leasehold_guard_check_insert
INSTEAD OF INSERT ON leasehold_guard_check
BEGIN
    SELECT RAISE(ABORT, 'leasehold_guard: the resource must be text of 1 to 512 bytes without NUL')
     WHERE typeof(NEW.resource) <> 'text' OR length(CAST(NEW.resource AS BLOB)) NOT BETWEEN 1 AND 512
        OR instr(NEW.resource, char(0)) > 0;
    SELECT RAISE(ABORT, 'leasehold_guard: the fence must be a non-negative integer')
     WHERE typeof(NEW.fence) <> 'integer' OR NEW.fence < 0;
    SELECT RAISE(ABORT, 'leasehold_guard: stale fence rejected: a newer lease holder has written this resource; roll back')
     WHERE EXISTS (SELECT 1 FROM leasehold_guard WHERE resource = NEW.resource AND fence > NEW.fence);
    INSERT INTO leasehold_guard (resource, fence, accepted_at_us)
    VALUES (NEW.resource, NEW.fence, CAST((julianday('now') - 2440587.5) * 86400000000.0 AS INTEGER))
    ON CONFLICT (resource) DO UPDATE SET fence = excluded.fence, accepted_at_us = excluded.accepted_at_us;
END";

/// How the message of the SQL guard's rejection of a stale fence starts (see
/// [`GUARD_SCHEMA`]). SQLite reports it as a constraint error (`SQLITE_CONSTRAINT_TRIGGER`).
pub const FENCE_REJECTED_MESSAGE: &str = "leasehold_guard: stale fence rejected";
