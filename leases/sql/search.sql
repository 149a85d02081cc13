-- Reads of fencegate_jobs for finding jobs (leases/search.py: `fencegate jobs
-- find`, the console's queues screen) and for periodic ticks
-- (leases/periodic.py). Every value is a parameter: a filter never becomes SQL.

-- name: database_now
-- The database's clock: periodic ticks are computed on it, never a process's.
SELECT clock_timestamp();

-- name: schema_job_states
-- The states a job may be in, as the schema's CHECK on fencegate_jobs.state
-- lists them (so a filter naming a state the schema does not know is refused
-- by name, and a state added to the schema is found without a code change).
SELECT pg_get_constraintdef(c.oid) AS definition
  FROM pg_constraint c
 WHERE c.conrelid = 'fencegate_jobs'::regclass AND c.contype = 'c'
   AND pg_get_constraintdef(c.oid) LIKE '%(state = ANY%';

-- name: find_jobs
-- Jobs matching every filter given (each NULL: any), newest first, keyset
-- paged: $10 is the last id of the page before (the next page has smaller
-- ids only), so a page never repeats or skips a job however many are added
-- meanwhile. $1 states (`scheduled` is a queued job not yet due), $2 queue,
-- $3 dedupe key, $4 ordering key, $5 a key that is either, $6 payload
-- conditions [{"path": [...], "value": v}] (payload #> path = v, each), $7
-- and $8 the time range [since, until) on the time $9 names (created,
-- run_at, finished), $11 the most rows.
SELECT id, queue, payload, state, priority, run_at, dedupe_key, ordering_key, attempts,
       max_attempts, fence, claimed_by, claimed_at, finished_at, result_ref, last_error,
       created_at
  FROM fencegate_jobs j
 WHERE ($1::text[] IS NULL
        OR j.state = ANY($1)
        OR ('scheduled' = ANY($1) AND j.state = 'queued' AND j.run_at > clock_timestamp()))
   AND ($2::text IS NULL OR j.queue = $2)
   AND ($3::text IS NULL OR j.dedupe_key = $3)
   AND ($4::text IS NULL OR j.ordering_key = $4)
   AND ($5::text IS NULL OR j.dedupe_key = $5 OR j.ordering_key = $5)
   AND ($6::jsonb IS NULL OR NOT EXISTS (
          SELECT 1 FROM jsonb_array_elements($6) AS c(cond)
           WHERE j.payload #> ARRAY(SELECT jsonb_array_elements_text(c.cond -> 'path'))
                 IS DISTINCT FROM c.cond -> 'value'))
   AND ($7::timestamptz IS NULL OR CASE $9::text WHEN 'run_at' THEN j.run_at
                                                 WHEN 'finished' THEN j.finished_at
                                                 ELSE j.created_at END >= $7)
   AND ($8::timestamptz IS NULL OR CASE $9::text WHEN 'run_at' THEN j.run_at
                                                 WHEN 'finished' THEN j.finished_at
                                                 ELSE j.created_at END < $8)
   AND ($10::bigint IS NULL OR j.id < $10)
 ORDER BY j.id DESC
 LIMIT $11;
