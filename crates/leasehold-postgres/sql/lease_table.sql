-- leasehold lease table: one row per key, kept after release so the fence survives.
-- owner is NULL when the lease is free; expires_at is on the database's clock.
CREATE TABLE IF NOT EXISTS "leasehold_leases" (
    key        text COLLATE "C" PRIMARY KEY,
    owner      bytea CHECK (octet_length(owner) = 16),
    fence      bigint NOT NULL CHECK (fence > 0),
    expires_at timestamptz NOT NULL
);
