//! The SQL schema, as plain statements a DBA can read and run by hand.

/// The lease table: one row per lease key ever used, never deleted (its fence must
/// survive). `owner` and `expires_at_us` are `NULL` while the key is free.
pub const LEASES_SCHEMA: &str = "\
CREATE TABLE IF NOT EXISTS leasehold_leases (
    lease_key     TEXT    NOT NULL PRIMARY KEY,  -- the lease key (UTF-8, at most 512 bytes)
    owner         TEXT,                          -- 32 lowercase hex digits; NULL when free
    fence         INTEGER NOT NULL,              -- the last fence issued; never lowered
    expires_at_us INTEGER                        -- host clock, unix time in microseconds; NULL when free
) STRICT";

/// The guard table (one row per protected resource: the highest fence accepted) and the
/// idempotency record (one row per job id done).
pub const GUARD_SCHEMA: &str = "\
CREATE TABLE IF NOT EXISTS leasehold_guard (
    resource       TEXT    NOT NULL PRIMARY KEY, -- the protected resource (UTF-8, at most 512 bytes)
    fence          INTEGER NOT NULL,             -- the highest fence accepted
    accepted_at_us INTEGER NOT NULL              -- host clock, unix time in microseconds
) STRICT;
CREATE TABLE IF NOT EXISTS leasehold_idempotency (
    job_id         TEXT    NOT NULL PRIMARY KEY, -- the job id (UTF-8, at most 512 bytes)
    recorded_at_us INTEGER NOT NULL              -- host clock, unix time in microseconds
) STRICT";

/// The current host clock in microseconds since the Unix epoch (`CLOCK_REALTIME`, the clock
/// SQLite's own `'now'` reads). 0 before 1970.
pub(crate) fn now_us() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| i64::try_from(d.as_micros()).unwrap_or(i64::MAX))
        .unwrap_or(0)
}
