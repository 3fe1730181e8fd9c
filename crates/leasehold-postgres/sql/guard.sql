-- leasehold guard: the highest fence accepted per protected resource.
CREATE TABLE IF NOT EXISTS "leasehold_guard" (
    resource       text COLLATE "C" PRIMARY KEY,
    fence          bigint NOT NULL,
    previous_fence bigint,
    updated_at     timestamptz NOT NULL DEFAULT clock_timestamp()
);
-- leasehold idempotency records: one row per job done, written in the job's transaction.
CREATE TABLE IF NOT EXISTS "leasehold_idempotency" (
    job_id  text COLLATE "C" PRIMARY KEY,
    done_at timestamptz NOT NULL DEFAULT clock_timestamp()
);
