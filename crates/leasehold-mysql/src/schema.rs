//! The SQL schema, as plain statements a DBA can read and run by hand.

/// The lease table of [`MySqlLeaseStore`](crate::MySqlLeaseStore): one row per lease key
/// ever used, never deleted (its fence must survive). `owner` and `expires_at_us` are
/// `NULL` while the key is free. Keys are compared as bytes (`VARBINARY`): no collation
/// folds `A` into `a` or ignores trailing spaces.
pub const LEASES_SCHEMA: &str = "\
CREATE TABLE IF NOT EXISTS leasehold_leases (
    lease_key     VARBINARY(512)  NOT NULL,  -- the lease key, UTF-8 bytes
    owner         CHAR(32) CHARACTER SET ascii COLLATE ascii_bin NULL,  -- 32 lowercase hex digits; NULL when free
    fence         BIGINT UNSIGNED NOT NULL,  -- the last fence issued; never lowered
    expires_at_us BIGINT          NULL,      -- server clock, unix time in microseconds; NULL when free
    PRIMARY KEY (lease_key)
) ENGINE=InnoDB";

/// The fence and holder table of [`MySqlGetLockStore`](crate::MySqlGetLockStore): one row
/// per `GET_LOCK` name ever used, never deleted. The lock itself lives in the server's
/// session; `connection_id` tells which session recorded itself as the holder.
pub const LOCKS_SCHEMA: &str = "\
CREATE TABLE IF NOT EXISTS leasehold_locks (
    lock_name     VARCHAR(64) CHARACTER SET ascii COLLATE ascii_bin NOT NULL,  -- the GET_LOCK name
    lease_key     VARBINARY(512)  NOT NULL,  -- the lease key, UTF-8 bytes
    fence         BIGINT UNSIGNED NOT NULL,  -- the last fence issued; never lowered
    owner         CHAR(32) CHARACTER SET ascii COLLATE ascii_bin NULL,  -- the last holder's token
    connection_id BIGINT UNSIGNED NULL,      -- CONNECTION_ID() of the last holder's session
    PRIMARY KEY (lock_name),
    KEY leasehold_locks_key (lease_key)
) ENGINE=InnoDB";

/// The guard table (one row per protected resource: the highest fence accepted) and the
/// idempotency record (one row per job id done), for [`guard`](crate::guard).
pub const GUARD_SCHEMA: &str = "\
CREATE TABLE IF NOT EXISTS leasehold_guard (
    resource    VARBINARY(512)  NOT NULL,  -- the protected resource, UTF-8 bytes
    fence       BIGINT UNSIGNED NOT NULL,  -- the highest fence accepted
    accepted_at TIMESTAMP(6)    NOT NULL DEFAULT CURRENT_TIMESTAMP(6),
    PRIMARY KEY (resource)
) ENGINE=InnoDB;
CREATE TABLE IF NOT EXISTS leasehold_idempotency (
    job_id      VARBINARY(512)  NOT NULL,  -- the job id, UTF-8 bytes
    recorded_at TIMESTAMP(6)    NOT NULL DEFAULT CURRENT_TIMESTAMP(6),
    PRIMARY KEY (job_id)
) ENGINE=InnoDB";

/// The server clock in microseconds since the Unix epoch, constant within one statement.
/// (`UNIX_TIMESTAMP(NOW(6))` with the session time zone at UTC, which the stores set.)
macro_rules! now_us {
    () => {
        "CAST(UNIX_TIMESTAMP(NOW(6)) * 1000000 AS SIGNED)"
    };
}
pub(crate) use now_us;
