-- Every statement fencegate runs, one named block per operation.
-- Loaded once by leases.sql; `-- name: X` starts a block.
-- All times come from clock_timestamp(): now() is frozen at transaction start.

-- name: claim_lease
-- Wins when the resource has no live lease, or its live lease is the caller's,
-- and no effect of the previous fence is still in flight (drain barrier).
-- Zero rows: lost, a normal answer.
INSERT INTO fencegate_leases AS l (resource, owner, fence, claimed_at, expires_at)
VALUES ($1, $2, fencegate_next_fence(0), clock_timestamp(),
        clock_timestamp() + make_interval(secs => $3::float8))
ON CONFLICT (resource) DO UPDATE
   SET owner = excluded.owner,
       fence = fencegate_next_fence(l.fence),
       claimed_at = clock_timestamp(),
       expires_at = clock_timestamp() + make_interval(secs => $3::float8),
       inflight = 0,
       drain_until = NULL
 WHERE (l.expires_at <= clock_timestamp() OR l.owner = excluded.owner)
   AND (l.inflight = 0 OR l.drain_until <= clock_timestamp())
RETURNING resource, owner, fence, expires_at;

-- name: renew_lease
UPDATE fencegate_leases
   SET expires_at = clock_timestamp() + make_interval(secs => $4::float8)
 WHERE resource = $1 AND owner = $2 AND fence = $3 AND expires_at > clock_timestamp()
RETURNING resource, owner, fence, expires_at;

-- name: release_lease
-- Ends the lease at once; the fence stays, so the next claim issues a higher one.
UPDATE fencegate_leases
   SET expires_at = clock_timestamp()
 WHERE resource = $1 AND owner = $2 AND fence = $3 AND expires_at > clock_timestamp()
RETURNING fence;

-- name: show_lease
SELECT resource, owner, fence, expires_at, expires_at > clock_timestamp() AS live,
       inflight
  FROM fencegate_leases
 WHERE resource = $1;

-- name: admit_effect
-- ($1 client, $2 key, $3 fingerprint, $4 resource, $5 fence, $6 provider,
--  $7 attempt nonce, $8 deadline seconds, $9 retry window seconds,
--  $10 resend margin seconds)
SELECT verdict, current_fence, effect_id, retry_after,
       response_status, response_headers, response_body
  FROM fencegate_admit_effect($1, $2, $3, $4, $5, $6, $7::bigint, $8::float8, $9::float8,
                              $10::float8);

-- name: finish_effect
-- ($1 client, $2 key, $3 attempt nonce, $4 resource, $5 state, $6 status,
--  $7 headers, $8 body, $9 summary): recorded | freed | unknown | gone
SELECT fencegate_finish_effect($1, $2, $3::bigint, $4, $5, $6::int, $7::jsonb, $8::bytea,
                               $9::text);

-- name: show_effect
-- $3: the grace after an attempt's deadline before it may be resolved
SELECT idempotency_key, client, resource, fence, provider,
       CASE WHEN state = 'in_flight' AND deadline <= clock_timestamp()
            THEN 'unknown' ELSE state END AS state,
       attempts, created_at, updated_at, deadline, retry_until, response_status, summary,
       CASE WHEN state IN ('in_flight', 'unknown')
            THEN greatest(0, extract(epoch FROM deadline + make_interval(secs => $3::float8)
                                                 - clock_timestamp()))::float8
       END AS resolvable_in_seconds
  FROM fencegate_effects
 WHERE client = $1 AND idempotency_key = $2;

-- name: list_effects
-- $2: a state to filter on, or NULL for all; $4 as $3 of show_effect
SELECT idempotency_key, client, resource, fence, provider,
       CASE WHEN state = 'in_flight' AND deadline <= clock_timestamp()
            THEN 'unknown' ELSE state END AS state,
       attempts, created_at, updated_at, deadline, retry_until, response_status, summary,
       CASE WHEN state IN ('in_flight', 'unknown')
            THEN greatest(0, extract(epoch FROM deadline + make_interval(secs => $4::float8)
                                                 - clock_timestamp()))::float8
       END AS resolvable_in_seconds
  FROM fencegate_effects
 WHERE ($1::text IS NULL OR client = $1)
   AND ($2::text IS NULL OR state = $2
        OR ($2 = 'unknown' AND state = 'in_flight' AND deadline <= clock_timestamp()))
 ORDER BY created_at DESC
 LIMIT $3;

-- name: resolve_effect_sent
-- An operator settles an effect whose outcome was unknown: it was delivered.
-- Only once its last attempt's deadline (plus $3 seconds) has passed: before
-- that, a gateway may still be sending it.
UPDATE fencegate_effects
   SET state = 'succeeded', response_status = coalesce(response_status, 200),
       summary = 'resolved by an operator: sent', attempt = NULL,
       updated_at = clock_timestamp()
 WHERE client = $1 AND idempotency_key = $2 AND state IN ('unknown', 'in_flight')
   AND deadline + make_interval(secs => $3::float8) <= clock_timestamp()
RETURNING idempotency_key;

-- name: resolve_effect_not_sent
-- ... or it was not: the key is free again (same condition).
DELETE FROM fencegate_effects
 WHERE client = $1 AND idempotency_key = $2 AND state IN ('unknown', 'in_flight')
   AND deadline + make_interval(secs => $3::float8) <= clock_timestamp()
RETURNING idempotency_key;

-- name: purge_effects
-- Up to $2 finished effects past the retention window ($1 seconds), oldest
-- first; in-flight and unknown ones stay. The caller repeats until fewer
-- than $2 go.
DELETE FROM fencegate_effects
 WHERE id IN (SELECT id FROM fencegate_effects
               WHERE state IN ('succeeded', 'failed')
                 AND updated_at < clock_timestamp() - make_interval(secs => $1::float8)
               ORDER BY updated_at
               LIMIT $2);

-- name: effects_awaiting_purge
SELECT count(*) FROM fencegate_effects
 WHERE state IN ('succeeded', 'failed')
   AND updated_at < clock_timestamp() - make_interval(secs => $1::float8);

-- name: enqueue_jobs
-- Batch enqueue; rows whose (queue, dedupe_key) exists already are skipped
-- (the caller looks their ids up with find_deduplicated, in a new snapshot).
INSERT INTO fencegate_jobs (queue, payload, dedupe_key, ordering_key, run_at, max_attempts,
                            priority)
SELECT $1, p, d, o, coalesce(r, clock_timestamp()), m, pr
  FROM unnest($2::jsonb[], $3::text[], $4::text[], $5::timestamptz[], $6::int[], $7::int[])
       AS t(p, d, o, r, m, pr)
ON CONFLICT (queue, dedupe_key) WHERE dedupe_key IS NOT NULL DO NOTHING
RETURNING id, dedupe_key;

-- name: find_deduplicated
SELECT id, dedupe_key FROM fencegate_jobs WHERE queue = $1 AND dedupe_key = ANY($2::text[]);

-- name: claim_jobs
-- Up to $3 runnable jobs, each leased as job:<queue>:<id> with a new fence.
-- A job is runnable when queued, due, and first in line for its ordering key
-- (no earlier job of that key is queued or claimed). SKIP LOCKED lets
-- claimers pass each other; the lease upsert repeats the lease rules (and the
-- drain barrier), so a job whose previous holder still has an effect in
-- flight stays queued.
WITH picked AS (
    SELECT j.id
      FROM fencegate_jobs j
     WHERE j.queue = $1 AND j.state = 'queued' AND j.run_at <= clock_timestamp()
       AND (j.ordering_key IS NULL OR NOT EXISTS (
               SELECT 1 FROM fencegate_jobs o
                WHERE o.queue = j.queue AND o.ordering_key = j.ordering_key
                  AND o.state IN ('queued', 'claimed') AND o.id < j.id))
     ORDER BY j.priority DESC, j.run_at, j.id
     LIMIT $3
       FOR UPDATE SKIP LOCKED
), leased AS (
    INSERT INTO fencegate_leases AS l (resource, owner, fence, claimed_at, expires_at)
    SELECT 'job:' || $1 || ':' || id, $2, fencegate_next_fence(0), clock_timestamp(),
           clock_timestamp() + make_interval(secs => $4::float8)
      FROM picked
    ON CONFLICT (resource) DO UPDATE
       SET owner = excluded.owner,
           fence = fencegate_next_fence(l.fence),
           claimed_at = clock_timestamp(),
           expires_at = excluded.expires_at,
           inflight = 0,
           drain_until = NULL
     WHERE l.expires_at <= clock_timestamp()
       AND (l.inflight = 0 OR l.drain_until <= clock_timestamp())
    RETURNING resource, fence, expires_at
), claimed AS (
    UPDATE fencegate_jobs j
       SET state = 'claimed', attempts = j.attempts + 1, fence = leased.fence,
           claimed_by = $2, claimed_at = clock_timestamp()
      FROM picked JOIN leased ON leased.resource = 'job:' || $1 || ':' || picked.id
     WHERE j.id = picked.id  -- by primary key: joining on the resource text scanned the table
    RETURNING j.id, j.queue, j.payload, j.attempts, j.max_attempts, j.fence, j.dedupe_key,
              j.ordering_key, j.priority, j.run_at, leased.expires_at
)
SELECT * FROM claimed ORDER BY priority DESC, run_at, id;

-- name: complete_job
-- Counts only while the job's fence is current; ends the job's lease too.
WITH done AS (
    UPDATE fencegate_jobs
       SET state = 'completed', finished_at = clock_timestamp(), result_ref = $3
     WHERE id = $1 AND state = 'claimed' AND fence = $2
    RETURNING id, queue
), ended AS (
    UPDATE fencegate_leases SET expires_at = clock_timestamp()
     WHERE resource = (SELECT 'job:' || queue || ':' || id FROM done)
       AND fence = $2 AND expires_at > clock_timestamp()
)
SELECT id FROM done;

-- name: fail_job
-- A failed attempt: retried after $4 seconds, or dead after its last attempt.
WITH failed AS (
    UPDATE fencegate_jobs
       SET state = CASE WHEN attempts >= max_attempts THEN 'dead' ELSE 'queued' END,
           run_at = CASE WHEN attempts >= max_attempts THEN run_at
                         ELSE clock_timestamp() + make_interval(secs => $4::float8) END,
           finished_at = CASE WHEN attempts >= max_attempts THEN clock_timestamp() END,
           last_error = $3
     WHERE id = $1 AND state = 'claimed' AND fence = $2
    RETURNING id, queue, state
), ended AS (
    UPDATE fencegate_leases SET expires_at = clock_timestamp()
     WHERE resource = (SELECT 'job:' || queue || ':' || id FROM failed)
       AND fence = $2 AND expires_at > clock_timestamp()
)
SELECT state FROM failed;

-- name: recover_jobs
-- Claimed jobs whose claim is over go back to the queue, or die if that was
-- their last attempt: the job's lease expired (the worker died or stalled),
-- or the lease row moved on to another fence (someone claimed job:<queue>:<id>
-- outside the queue), or it is gone. The next claim issues a new fence, so the
-- old holder is refused at the gateway.
-- The candidates' lease rows are then locked and read again (their latest
-- version, after any renewal that held the lock), so a lease renewed an
-- instant before is not recovered.
WITH over AS (
    SELECT j.id
      FROM fencegate_jobs j
      LEFT JOIN fencegate_leases l ON l.resource = 'job:' || j.queue || ':' || j.id
     WHERE j.state = 'claimed' AND ($1::text IS NULL OR j.queue = $1)
       AND (l.resource IS NULL OR l.fence <> j.fence OR l.expires_at <= clock_timestamp())
       FOR UPDATE OF j SKIP LOCKED
), locked AS (
    SELECT o.id
      FROM over o
      JOIN fencegate_jobs j ON j.id = o.id
      LEFT JOIN LATERAL (
          SELECT fence, expires_at FROM fencegate_leases
           WHERE resource = 'job:' || j.queue || ':' || j.id
             FOR NO KEY UPDATE) l ON true
     WHERE l.fence IS NULL OR l.fence <> j.fence OR l.expires_at <= clock_timestamp()
)
UPDATE fencegate_jobs j
   SET state = CASE WHEN j.attempts >= j.max_attempts THEN 'dead' ELSE 'queued' END,
       finished_at = CASE WHEN j.attempts >= j.max_attempts THEN clock_timestamp() END,
       run_at = clock_timestamp(),
       last_error = 'lease expired: the worker stopped renewing (crashed, killed or stalled)'
  FROM locked
 WHERE j.id = locked.id AND j.state = 'claimed'
RETURNING j.id, j.queue, j.state;

-- name: replay_jobs
-- Dead jobs back to the queue with their attempts reset.
UPDATE fencegate_jobs
   SET state = 'queued', attempts = 0, run_at = clock_timestamp(), finished_at = NULL
 WHERE queue = $1 AND state = 'dead' AND ($2::bigint[] IS NULL OR id = ANY($2))
   AND id IN (SELECT id FROM fencegate_jobs
               WHERE queue = $1 AND state = 'dead' AND ($2::bigint[] IS NULL OR id = ANY($2))
               ORDER BY id LIMIT $3)
RETURNING id;

-- name: show_job
SELECT id, queue, payload, state, priority, run_at, dedupe_key, ordering_key, attempts,
       max_attempts, fence, claimed_by, claimed_at, finished_at, result_ref, last_error,
       created_at
  FROM fencegate_jobs WHERE id = $1;

-- name: list_jobs
SELECT id, queue, payload, state, priority, run_at, dedupe_key, ordering_key, attempts,
       max_attempts, fence, claimed_by, claimed_at, finished_at, result_ref, last_error,
       created_at
  FROM fencegate_jobs
 WHERE queue = $1 AND ($2::text IS NULL OR state = $2)
 ORDER BY id
 LIMIT $3;

-- name: queue_stats
-- Depth by state; queued jobs not yet due count as `scheduled`.
SELECT queue,
       CASE WHEN state = 'queued' AND run_at > clock_timestamp() THEN 'scheduled'
            ELSE state END AS state,
       count(*) AS jobs
  FROM fencegate_jobs
 WHERE $1::text IS NULL OR queue = $1
 GROUP BY 1, 2
 ORDER BY 1, 2;

-- name: complete_jobs
-- complete_job for a batch: ($1 ids, $2 fences, $3 result refs); answers the
-- ids that counted (those whose fence was still current).
WITH done AS (
    UPDATE fencegate_jobs j
       SET state = 'completed', finished_at = clock_timestamp(), result_ref = t.ref
      FROM unnest($1::bigint[], $2::bigint[], $3::text[]) AS t(id, fence, ref)
     WHERE j.id = t.id AND j.state = 'claimed' AND j.fence = t.fence
    RETURNING j.id, j.queue, j.fence
), ended AS (
    UPDATE fencegate_leases l SET expires_at = clock_timestamp()
      FROM done
     WHERE l.resource = 'job:' || done.queue || ':' || done.id
       AND l.fence = done.fence AND l.expires_at > clock_timestamp()
)
SELECT id FROM done;

-- name: purge_jobs
-- Up to $2 jobs of queue $3 completed or dead for longer than $1 seconds,
-- oldest first, with their leases. Deleting job:<queue>:<id> cannot let a
-- fence go back: a job id is never reused (an identity column), so the queue
-- never claims that resource again, and any claim of it from elsewhere gets a
-- fence floored at the database clock, above every fence issued before. A lease still live or
-- holding an effect in flight is left alone (and so is its job, until then).
WITH old AS (
    SELECT id, queue FROM fencegate_jobs
     WHERE state IN ('completed', 'dead') AND queue = $3
       AND finished_at < clock_timestamp() - make_interval(secs => $1::float8)
     ORDER BY finished_at
     LIMIT $2
       FOR UPDATE SKIP LOCKED
), busy AS (
    SELECT o.id FROM old o
      JOIN fencegate_leases l ON l.resource = 'job:' || o.queue || ':' || o.id
     WHERE l.expires_at > clock_timestamp()
        OR (l.inflight > 0 AND l.drain_until > clock_timestamp())
), leases_gone AS (
    DELETE FROM fencegate_leases l
     USING old o
     WHERE l.resource = 'job:' || o.queue || ':' || o.id
       AND o.id NOT IN (SELECT id FROM busy)
)
DELETE FROM fencegate_jobs j
 USING old o
 WHERE j.id = o.id AND o.id NOT IN (SELECT id FROM busy);

-- name: jobs_awaiting_purge
-- every queue's: what the fencegate_rows_awaiting_purge gauge shows
SELECT count(*) FROM fencegate_jobs
 WHERE state IN ('completed', 'dead')
   AND finished_at < clock_timestamp() - make_interval(secs => $1::float8);

-- name: queue_depths
-- Every queue's depth by state, for the metrics collector (leases/observe.py):
-- one statement per scrape, over the partial indexes on the open states.
-- Completed jobs are left out (they only grow). For `queued` (due now),
-- oldest_seconds is how long the oldest due job has waited.
SELECT queue,
       CASE WHEN state = 'queued' AND run_at > clock_timestamp() THEN 'scheduled'
            ELSE state END AS state,
       count(*) AS jobs,
       extract(epoch FROM clock_timestamp() - min(run_at))::float8 AS oldest_seconds
  FROM fencegate_jobs
 WHERE state IN ('queued', 'claimed', 'dead')
 GROUP BY 1, 2;
