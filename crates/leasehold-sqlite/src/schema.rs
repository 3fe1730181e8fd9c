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

/// The guard table (one row per protected resource: the highest fence accepted) and the
/// idempotency record (one row per job id done).
pub const GUARD_SCHEMA: &str = "\
CREATE TABLE IF NOT EXISTS leasehold_guard (
    resource       TEXT    NOT NULL PRIMARY KEY, -- the protected resource (UTF-8, at most 512 bytes)
    fence          INTEGER NOT NULL,             -- the highest fence accepted
    accepted_at_us INTEGER NOT NULL              -- wall clock, unix time in microseconds (informational)
) STRICT;
CREATE TABLE IF NOT EXISTS leasehold_idempotency (
    job_id         TEXT    NOT NULL PRIMARY KEY, -- the job id (UTF-8, at most 512 bytes)
    recorded_at_us INTEGER NOT NULL              -- wall clock, unix time in microseconds (informational)
) STRICT";
