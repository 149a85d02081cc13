-- The work queue. A claimed job is a lease on `job:<queue>:<id>` in
-- fencegate_leases; `fence` here is the fence of the job's current (or last)
-- claim, so complete and fail can be conditioned on it.
CREATE TABLE fencegate_jobs (
    id            bigint      GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    queue         text        NOT NULL CHECK (queue ~ '^[A-Za-z0-9._-]{1,100}$'),
    payload       jsonb       NOT NULL,
    state         text        NOT NULL DEFAULT 'queued'
                  CHECK (state IN ('queued', 'claimed', 'completed', 'dead')),
    priority      integer     NOT NULL DEFAULT 0,
    run_at        timestamptz NOT NULL DEFAULT clock_timestamp(),
    dedupe_key    text        CHECK (length(dedupe_key) BETWEEN 1 AND 255),
    ordering_key  text        CHECK (length(ordering_key) BETWEEN 1 AND 255),
    attempts      integer     NOT NULL DEFAULT 0 CHECK (attempts >= 0),
    max_attempts  integer     NOT NULL CHECK (max_attempts >= 1),
    fence         bigint,
    claimed_by    text,
    claimed_at    timestamptz,
    finished_at   timestamptz,
    result_ref    text,
    last_error    text,
    created_at    timestamptz NOT NULL DEFAULT clock_timestamp(),
    CONSTRAINT claimed_has_fence CHECK (state <> 'claimed' OR (fence IS NOT NULL
                                                               AND claimed_by IS NOT NULL)),
    CONSTRAINT finished_at_iff_finished
        CHECK ((state IN ('completed', 'dead')) = (finished_at IS NOT NULL))
);

-- one job per (queue, dedupe_key), whatever its state: enqueue is idempotent
CREATE UNIQUE INDEX fencegate_jobs_dedupe ON fencegate_jobs (queue, dedupe_key)
    WHERE dedupe_key IS NOT NULL;
-- what claimers scan
CREATE INDEX fencegate_jobs_runnable ON fencegate_jobs (queue, priority DESC, run_at, id)
    WHERE state = 'queued';
-- the head of each ordering key
CREATE INDEX fencegate_jobs_ordering ON fencegate_jobs (queue, ordering_key, id)
    WHERE ordering_key IS NOT NULL AND state IN ('queued', 'claimed');
-- what recovery scans
CREATE INDEX fencegate_jobs_claimed ON fencegate_jobs (queue) WHERE state = 'claimed';
CREATE INDEX fencegate_jobs_dead ON fencegate_jobs (queue, id) WHERE state = 'dead';
