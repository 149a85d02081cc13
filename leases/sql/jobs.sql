-- Statements on fencegate_jobs: the work queue. A claimed job is a lease on
-- job:<queue>:<id> in fencegate_leases (fencegate_claim_lease, schema.sql).
-- All times come from clock_timestamp(): now() is frozen at transaction start.

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
    SELECT j.id, j.resource
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
    -- the lease upsert of claim_lease, without the same-owner rule: a job is
    -- claimed again only once its previous lease has expired
    SELECT picked.id, c.fence, c.expires_at
      FROM picked
     CROSS JOIN LATERAL fencegate_claim_lease(picked.resource, $2,
                                              $4::float8, false) AS c
), claimed AS (
    UPDATE fencegate_jobs j
       SET state = 'claimed', attempts = j.attempts + 1, fence = leased.fence,
           claimed_by = $2, claimed_at = clock_timestamp()
      FROM leased
     WHERE j.id = leased.id  -- by primary key: joining on the resource text scanned the table
    RETURNING j.id, j.queue, j.payload, j.attempts, j.max_attempts, j.fence, j.dedupe_key,
              j.ordering_key, j.priority, j.run_at, leased.expires_at
)
SELECT * FROM claimed ORDER BY priority DESC, run_at, id;

-- name: jobs_claimed_by
-- The live claims of owner $2 on queue $1, as claim_jobs answers them, with
-- the seconds left on each lease by this database's clock: a worker whose
-- claim got no answer (it may have committed) takes up what it claimed.
SELECT j.id, j.queue, j.payload, j.attempts, j.max_attempts, j.fence, j.dedupe_key,
       j.ordering_key, j.priority, j.run_at, l.expires_at,
       extract(epoch FROM l.expires_at - clock_timestamp())::float8 AS remaining
  FROM fencegate_jobs j
  JOIN fencegate_leases l ON l.resource = j.resource
                         AND l.fence = j.fence AND l.owner = j.claimed_by
 WHERE j.queue = $1 AND j.state = 'claimed' AND j.claimed_by = $2
   AND l.expires_at > clock_timestamp()
 ORDER BY j.priority DESC, j.run_at, j.id;

-- name: complete_job
-- Counts only while the job's fence is current and its lease live (lease rule
-- 4: a lapsed lease's fence records nothing, whether or not recovery has
-- looked yet); ends the job's lease too. (fencegate_complete_jobs, alone.)
SELECT done AS id FROM fencegate_complete_jobs(ARRAY[$1::bigint], ARRAY[$2::bigint],
                                               ARRAY[$3::text]) AS done;

-- name: fail_job
-- A failed attempt: retried after $4 seconds, or dead after its last attempt.
-- Counts only while the fence is current and the lease live, as complete_job.
-- (One job: its row, then its lease row, the one order.)
WITH failed AS (
    UPDATE fencegate_jobs j
       SET state = CASE WHEN j.attempts >= j.max_attempts THEN 'dead' ELSE 'queued' END,
           run_at = CASE WHEN j.attempts >= j.max_attempts THEN j.run_at
                         ELSE clock_timestamp() + make_interval(secs => $4::float8) END,
           finished_at = CASE WHEN j.attempts >= j.max_attempts THEN clock_timestamp() END,
           last_error = $3
      FROM fencegate_leases l
     WHERE j.id = $1 AND j.state = 'claimed' AND j.fence = $2
       AND l.resource = j.resource AND l.fence = $2
       AND l.expires_at > clock_timestamp()
    RETURNING j.id, j.resource, j.state
), ended AS (
    UPDATE fencegate_leases SET expires_at = clock_timestamp()
     WHERE resource = (SELECT resource FROM failed)
       AND fence = $2 AND expires_at > clock_timestamp()
)
SELECT state FROM failed;

-- name: recover_jobs
-- Claimed jobs whose claim is over go back to the queue, or die if that was
-- their last attempt: the job's lease expired (the worker died or stalled),
-- or the lease row moved on to another fence (someone claimed job:<queue>:<id>
-- outside the queue), or it is gone. The next claim issues a new fence, so the
-- old holder is refused at the gateway.
-- Read committed, step by step: `over` locks the candidate jobs and yields
-- their latest version (a job recovered and claimed again meanwhile comes back
-- with its new fence); `locked` then locks each one's lease row and reads its
-- latest version too, so it compares the newest job fence with the newest
-- lease: a lease renewed, or a job claimed again, an instant before is left
-- alone. The UPDATE repeats the fence, in case.
WITH over AS (
    SELECT j.id, j.resource, j.fence
      FROM fencegate_jobs j
      LEFT JOIN fencegate_leases l ON l.resource = j.resource
     WHERE j.state = 'claimed' AND ($1::text IS NULL OR j.queue = $1)
       AND (l.resource IS NULL OR l.fence <> j.fence OR l.expires_at <= clock_timestamp())
     -- the lease rows are locked one by one in this order: resource order, the
     -- one order of every statement that locks several (no deadlock with them)
     ORDER BY j.resource
       FOR UPDATE OF j SKIP LOCKED
), locked AS (
    SELECT o.id, o.fence
      FROM over o
      LEFT JOIN LATERAL (
          SELECT fence, expires_at FROM fencegate_leases
           WHERE resource = o.resource
             FOR NO KEY UPDATE) l ON true
     WHERE l.fence IS NULL OR l.fence <> o.fence OR l.expires_at <= clock_timestamp()
)
UPDATE fencegate_jobs j
   SET state = CASE WHEN j.attempts >= j.max_attempts THEN 'dead' ELSE 'queued' END,
       finished_at = CASE WHEN j.attempts >= j.max_attempts THEN clock_timestamp() END,
       run_at = clock_timestamp(),
       last_error = 'lease expired: the worker stopped renewing (crashed, killed or stalled)'
  FROM locked
 WHERE j.id = locked.id AND j.state = 'claimed' AND j.fence = locked.fence
RETURNING j.id, j.queue, j.state, j.fence, j.claimed_by;

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
-- ids that counted (fence current, lease live). The locks are taken
-- in the one order of every statement (fencegate_complete_jobs, schema.sql).
SELECT done AS id FROM fencegate_complete_jobs($1::bigint[], $2::bigint[], $3::text[]) AS done;

-- name: purge_jobs
-- Up to $2 jobs of queue $3 completed or dead for longer than $1 seconds,
-- oldest first, with their leases. Deleting job:<queue>:<id> cannot let a
-- fence go back: a job id is never reused (an identity column), so the queue
-- never claims that resource again, and any claim of it from elsewhere gets a
-- fence floored at the database clock, above every fence issued before.
-- A lease still live or holding an effect in flight is left alone, and so is
-- its job, until a later pass. The DELETE of the lease states that condition
-- itself: it is checked again on the row's newest version after any lock it
-- waited for (a claim of the resource committing during the purge).
WITH old AS (
    SELECT id, resource FROM fencegate_jobs
     WHERE state IN ('completed', 'dead') AND queue = $3
       AND finished_at < clock_timestamp() - make_interval(secs => $1::float8)
     ORDER BY finished_at
     LIMIT $2
       FOR UPDATE SKIP LOCKED
), leases_gone AS (
    DELETE FROM fencegate_leases l
     USING old o
     WHERE l.resource = o.resource
       AND l.expires_at <= clock_timestamp()
       AND (l.inflight = 0 OR l.drain_until <= clock_timestamp())
    RETURNING l.resource
)
DELETE FROM fencegate_jobs j
 USING old o
 WHERE j.id = o.id
   AND (o.resource IN (SELECT resource FROM leases_gone)
        OR NOT EXISTS (SELECT 1 FROM fencegate_leases l WHERE l.resource = o.resource));

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

-- name: oldest_runnable_jobs
-- For the operators' console: each queue's oldest due job.
SELECT DISTINCT ON (queue) queue, id, run_at,
       extract(epoch FROM clock_timestamp() - run_at)::float8 AS waiting_seconds
  FROM fencegate_jobs
 WHERE state = 'queued' AND run_at <= clock_timestamp()
 ORDER BY queue, run_at, id;

-- name: complete_job_in_transaction
-- Completes the job in the caller's transaction ($1 queue, $2 id, $3 fence,
-- $4 result ref): true, or SQLSTATE FG412 with the reason, so the caller's
-- writes roll back with it (fencegate_complete_job, schema.sql)
SELECT fencegate_complete_job($1, $2, $3, $4);
