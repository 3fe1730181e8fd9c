-- leasehold records (Store::put_record), shared by both stores: one row per record key
-- (an election or semaphore name), replaced only by a higher fence, never expired.
CREATE TABLE IF NOT EXISTS "leasehold_records" (
    key   text COLLATE "C" PRIMARY KEY,
    fence bigint NOT NULL CHECK (fence >= 0),
    value bytea NOT NULL CHECK (octet_length(value) <= 4096)
);
