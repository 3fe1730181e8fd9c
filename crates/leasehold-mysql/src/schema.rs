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

/// The records table of both stores' [`Store::put_record`](leasehold_core::Store::put_record):
/// one row per record key ever written (an election or semaphore name), never deleted
/// (records do not expire); a row is replaced only by a write with a higher fence. Created
/// next to the store's own table (`migrate=true`, [`MySqlLeaseStore::migrate`],
/// [`MySqlGetLockStore::migrate`]); earlier versions never read it.
///
/// [`MySqlLeaseStore::migrate`]: crate::MySqlLeaseStore::migrate
/// [`MySqlGetLockStore::migrate`]: crate::MySqlGetLockStore::migrate
pub const RECORDS_SCHEMA: &str = "\
CREATE TABLE IF NOT EXISTS leasehold_records (
    record_key VARBINARY(512)  NOT NULL,  -- the record key, UTF-8 bytes
    fence      BIGINT UNSIGNED NOT NULL,  -- the fence it was written at
    value      VARBINARY(4096) NOT NULL,  -- any bytes, at most 4096
    PRIMARY KEY (record_key)
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

/// The SQL guard, a stored procedure any client can `CALL` inside the transaction of its
/// protected write: `CALL leasehold_guard(resource, fence)` runs the same check as
/// [`guard::check_and_advance`](crate::guard::check_and_advance) on the same table (a
/// fence at least as high as the highest accepted passes, equal ones too, and is recorded;
/// the row stays locked until the transaction ends) and SIGNALs SQLSTATE
/// [`FENCE_REJECTED_SQLSTATE`] (`LH001`) for a lower one. A procedure's error fails the
/// `CALL`, not the transaction: the caller must roll back (the `mariadb` client in batch
/// mode stops at the error and its session's open transaction rolls back when it exits).
///
/// This is the statement the server gets (no client `DELIMITER`); [`guard::schema_sql`]
/// wraps it for the `mariadb`/`mysql` client.
///
/// [`guard::schema_sql`]: crate::guard::schema_sql
pub const GUARD_PROCEDURE: &str = "\
CREATE PROCEDURE leasehold_guard(IN p_resource VARBINARY(512), IN p_fence BIGINT UNSIGNED)
    MODIFIES SQL DATA
    COMMENT 'leasehold: check and advance a resource fence in the caller transaction'
BEGIN
    DECLARE v_current BIGINT UNSIGNED;
    DECLARE v_message VARCHAR(128);
    IF p_resource IS NULL OR LENGTH(p_resource) = 0 THEN
        SIGNAL SQLSTATE '22023'
            SET MESSAGE_TEXT = 'leasehold_guard: the resource must be 1 to 512 bytes';
    END IF;
    IF p_fence IS NULL THEN
        SIGNAL SQLSTATE '22023' SET MESSAGE_TEXT = 'leasehold_guard: the fence must be a number';
    END IF;
    -- Creates the resource's row, or locks the existing one until the transaction ends.
    INSERT INTO leasehold_guard (resource, fence) VALUES (p_resource, p_fence)
        ON DUPLICATE KEY UPDATE resource = resource;
    -- A locking read sees the latest committed fence at any isolation level.
    SELECT fence INTO v_current FROM leasehold_guard WHERE resource = p_resource FOR UPDATE;
    IF p_fence < v_current THEN
        SET v_message = CONCAT('leasehold_guard: fence ', p_fence,
            ' rejected for ', CONVERT(LEFT(p_resource, 32) USING utf8mb4),
            ': current fence ', v_current);
        SIGNAL SQLSTATE 'LH001' SET MESSAGE_TEXT = v_message;
    END IF;
    UPDATE leasehold_guard SET fence = p_fence, accepted_at = CURRENT_TIMESTAMP(6)
        WHERE resource = p_resource;
END";

/// The SQLSTATE of [`GUARD_PROCEDURE`]'s rejection of a stale fence.
pub const FENCE_REJECTED_SQLSTATE: &str = "LH001";
