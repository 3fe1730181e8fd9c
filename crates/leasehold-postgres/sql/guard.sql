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
-- leasehold SQL guard: call it in the transaction of the protected write, e.g.
--   BEGIN; SELECT leasehold_guard('ledger:invoices', 42); UPDATE ...; COMMIT;
-- It accepts a fence at least as high as the highest accepted for the resource (the
-- same statement and comparison as the Rust guard: equal fences pass) and records it;
-- a lower fence raises SQLSTATE LH001, which aborts the transaction. It returns the
-- previous fence (NULL for a resource's first write). The guard row stays locked until
-- the transaction ends, so concurrent writers of one resource pass one at a time.
CREATE OR REPLACE FUNCTION leasehold_guard(resource text, fence bigint) RETURNS bigint
LANGUAGE plpgsql VOLATILE AS $leasehold$
#variable_conflict use_column
DECLARE
    accepted boolean := false;
    previous bigint;
    current_fence bigint;
BEGIN
    IF $1 IS NULL OR $1 = '' OR octet_length($1) > 512 THEN
        RAISE EXCEPTION 'leasehold_guard: the resource must be 1 to 512 bytes, got %', quote_nullable($1)
            USING ERRCODE = '22023';
    END IF;
    IF $2 IS NULL OR $2 < 0 THEN
        RAISE EXCEPTION 'leasehold_guard: the fence must be a non-negative number, got %', quote_nullable($2)
            USING ERRCODE = '22023';
    END IF;
    INSERT INTO "leasehold_guard" AS g (resource, fence, previous_fence, updated_at)
    VALUES ($1, $2, NULL, clock_timestamp())
    ON CONFLICT (resource) DO UPDATE SET fence = EXCLUDED.fence,
        previous_fence = g.fence, updated_at = EXCLUDED.updated_at
    WHERE g.fence <= EXCLUDED.fence
    RETURNING true, g.previous_fence INTO accepted, previous;
    IF accepted THEN
        RETURN previous;
    END IF;
    -- Rejected: the row is locked by this transaction, so this is the fence that refused.
    SELECT g.fence INTO current_fence FROM "leasehold_guard" AS g WHERE g.resource = $1;
    RAISE EXCEPTION 'leasehold_guard: fence % rejected for resource %: the current fence is % (the lease was lost: roll back)',
        $2, quote_literal($1), current_fence
        USING ERRCODE = 'LH001',
              HINT = 'A newer holder of the lease has written; do not retry with this fence.';
END
$leasehold$;
