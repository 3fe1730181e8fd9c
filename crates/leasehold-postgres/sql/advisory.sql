-- leasehold advisory-lock store: the session-level advisory lock lock_id is the lease;
-- this row keeps the fence counter (advanced while the lock is held) and who holds it.
CREATE TABLE IF NOT EXISTS "leasehold_advisory" (
    key        text COLLATE "C" PRIMARY KEY,
    lock_id    bigint NOT NULL,
    owner      bytea CHECK (octet_length(owner) = 16),
    fence      bigint NOT NULL CHECK (fence > 0),
    holder_pid integer,
    expires_at timestamptz NOT NULL
);
