-- Statements on fencegate_jobs: the work queue. A claimed job is a lease on
-- job:<queue>:<id> in fencegate_leases (fencegate_claim_lease, schema.sql).
-- All times come from clock_timestamp(): now() is frozen at transaction start.

-- name: enqueue_jobs
-- Batch enqueue; rows whose (queue, dedupe_key) exists already, or whose
-- unique slot is held ($8 keys, $9 periods: fencegate_jobs_unique), are
-- skipped in this same statement, racing enqueuers included (the caller looks
-- their ids up with find_deduplicated and find_unique, in a new snapshot).
INSERT INTO fencegate_jobs (queue, payload, dedupe_key, ordering_key, run_at, max_attempts,
                            priority, unique_key, unique_for, unique_slot)
SELECT $1, p, d, o, coalesce(r, clock_timestamp()), m, pr, uk, uf,
       fencegate_unique_slot(uk, uf)
  FROM unnest($2::jsonb[], $3::text[], $4::text[], $5::timestamptz[], $6::int[], $7::int[],
              $8::text[], $9::float8[])
       AS t(p, d, o, r, m, pr, uk, uf)
ON CONFLICT DO NOTHING
RETURNING id, dedupe_key, unique_key;

-- name: bound_idle_transaction
-- Ends this session if it sits idle in its transaction for more than $1
-- milliseconds (the transaction only: SET LOCAL), rolling it back: a
-- process that stalls holding uncommitted rows others wait for (a periodic
-- pass's new ticks) holds them that long at most.
SELECT set_config('idle_in_transaction_session_timeout', $1::text, true);

-- name: drop_late_ticks
-- Periodic ticks just enqueued, in the enqueue's own transaction ($1 their
-- job ids, $2 their ticks), that are older than the retention ($3 seconds)
-- by the database clock read now, after the insert: deleted again before
-- anyone could see them. A tick's finished job keeps its dedupe key for the
-- retention (purge_jobs), so a tick older than that may have lost its job's
-- row to a purge while the scheduler stalled, and the insert made it twice.
-- Read after the insert, the clock is past any purge the insert saw or
-- waited for (its ON CONFLICT waits for a delete of the key in progress).
DELETE FROM fencegate_jobs j
 USING unnest($1::bigint[], $2::timestamptz[]) AS t(id, tick)
 WHERE j.id = t.id
   AND t.tick < clock_timestamp() - make_interval(secs => $3::float8)
RETURNING j.id;

-- name: find_deduplicated
SELECT id, dedupe_key FROM fencegate_jobs WHERE queue = $1 AND dedupe_key = ANY($2::text[]);

-- name: find_unique
-- The jobs holding the unique slots of keys $2 for periods $3 (as an
-- enqueue now would compute them): (id, unique_key). The slots are computed
-- first (the function is volatile: in the join it would rule out the index).
WITH s AS MATERIALIZED (
    SELECT fencegate_unique_slot(k, f) AS slot FROM unnest($2::text[], $3::float8[]) AS t(k, f)
)
SELECT j.id, j.unique_key
  FROM s
  JOIN fencegate_jobs j ON j.queue = $1 AND j.unique_slot = s.slot
 WHERE j.state <> 'cancelled' AND (j.unique_for IS NOT NULL OR j.state <> 'completed');

-- name: claim_jobs
-- Up to $3 runnable jobs, each leased as job:<queue>:<id> with a new fence.
-- A job is runnable when queued, due, and first in line for its ordering key
-- (no earlier job of that key is queued or claimed). SKIP LOCKED lets
-- claimers pass each other; the lease upsert repeats the lease rules (and the
-- drain barrier), so a job whose previous holder still has an effect in
-- flight stays queued. A paused queue claims nothing: its row in
-- fencegate_queues is locked FOR SHARE, which a pause waits for and a claim
-- behind a pause rechecks (fencegate_queues, schema.sql). Before the row, a
-- shared advisory lock on the queue (key: its name hashed with seed 413): a
-- pause's exclusive one queues the claims that start after it, which a row
-- share lock would not (share locks join share locks past a waiting update).
WITH gate AS MATERIALIZED (
    SELECT pg_advisory_xact_lock_shared(hashtextextended($1, 413))
), open AS (
    SELECT q.queue FROM fencegate_queues q, gate
     WHERE q.queue = $1 AND q.paused_at IS NULL
       FOR SHARE OF q
), picked AS (
    SELECT j.id, j.resource
      FROM fencegate_jobs j
     -- EXISTS: a one-time gate, locked and checked before any job is read
     WHERE EXISTS (SELECT 1 FROM open)
       AND j.queue = $1 AND j.state = 'queued' AND j.run_at <= clock_timestamp()
       AND (j.ordering_key IS NULL OR NOT EXISTS (
               SELECT 1 FROM fencegate_jobs o
                WHERE o.queue = j.queue AND o.ordering_key = j.ordering_key
                  AND o.state IN ('queued', 'claimed') AND o.id < j.id))
     ORDER BY j.priority DESC, j.run_at, j.id
     LIMIT $3
       FOR UPDATE OF j SKIP LOCKED
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
              j.ordering_key, j.priority, j.run_at, j.snoozes, leased.expires_at
)
SELECT * FROM claimed ORDER BY priority DESC, run_at, id;

-- name: jobs_claimed_by
-- The live claims of owner $2 on queue $1, as claim_jobs answers them, with
-- the seconds left on each lease by this database's clock: a worker whose
-- claim got no answer (it may have committed) takes up what it claimed.
SELECT j.id, j.queue, j.payload, j.attempts, j.max_attempts, j.fence, j.dedupe_key,
       j.ordering_key, j.priority, j.run_at, j.snoozes, l.expires_at,
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

-- name: snooze_job
-- Put a claimed job off for $3 seconds from inside its handler, without
-- spending the attempt its claim counted ($1 id, $2 fence). Fenced as
-- complete_job: only while the fence is current and the lease live; ends the
-- lease. A snoozed job keeps its place in its ordering key. (One job: its
-- row, then its lease row, the one order.)
WITH snoozed AS (
    UPDATE fencegate_jobs j
       SET state = 'queued', attempts = j.attempts - 1, snoozes = j.snoozes + 1,
           run_at = clock_timestamp() + make_interval(secs => $3::float8)
      FROM fencegate_leases l
     WHERE j.id = $1 AND j.state = 'claimed' AND j.fence = $2
       AND l.resource = j.resource AND l.fence = $2
       AND l.expires_at > clock_timestamp()
    RETURNING j.id, j.resource, j.run_at
), ended AS (
    UPDATE fencegate_leases SET expires_at = clock_timestamp()
     WHERE resource = (SELECT resource FROM snoozed)
       AND fence = $2 AND expires_at > clock_timestamp()
)
SELECT run_at FROM snoozed;

-- name: cancel_jobs
-- (job_id, was) of each job of queue $1 among $2 that was cancelled
-- (fencegate_cancel_jobs, schema.sql)
SELECT job_id AS id, was FROM fencegate_cancel_jobs($1, $2::bigint[]);

-- name: job_states
-- (id, queue, state) of the jobs $1, for what a cancel left alone
SELECT id, queue, state FROM fencegate_jobs WHERE id = ANY($1::bigint[]);

-- name: pause_queue
-- Pause queue $1: no claim of it commits once this has (fencegate_queues).
-- Answers since when it is paused (a queue paused already stays as it was).
-- The exclusive advisory lock (claim_jobs' gate) first: claims that start
-- while this waits for the ones in flight wait behind it.
WITH gate AS MATERIALIZED (
    SELECT pg_advisory_xact_lock(hashtextextended($1, 413))
)
INSERT INTO fencegate_queues AS q (queue, paused_at) SELECT $1, clock_timestamp() FROM gate
ON CONFLICT (queue) DO UPDATE SET paused_at = coalesce(q.paused_at, clock_timestamp())
RETURNING paused_at;

-- name: resume_queue
-- Resume queue $1 and wake its idle workers: true if it was paused.
WITH resumed AS (
    UPDATE fencegate_queues SET paused_at = NULL
     WHERE queue = $1 AND paused_at IS NOT NULL
    RETURNING queue
)
SELECT count(pg_notify('fencegate_jobs', queue)) > 0 FROM resumed;

-- name: list_queues
-- Every queue known (one with jobs, or paused), with since when it is paused
SELECT queue, paused_at, created_at FROM fencegate_queues
 WHERE $1::text IS NULL OR queue = $1
 ORDER BY queue;

-- name: replay_jobs
-- Dead jobs back to the queue with their attempts reset. (Cancelled jobs are
-- not dead: a cancel is final, and is never replayed.)
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
       created_at, snoozes, unique_key, unique_for
  FROM fencegate_jobs WHERE id = $1;

-- name: list_jobs
SELECT id, queue, payload, state, priority, run_at, dedupe_key, ordering_key, attempts,
       max_attempts, fence, claimed_by, claimed_at, finished_at, result_ref, last_error,
       created_at, snoozes, unique_key, unique_for
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
-- Up to $2 jobs of queue $3 completed, dead or cancelled for longer than $1 seconds,
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
     WHERE state IN ('completed', 'dead', 'cancelled') AND queue = $3
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
 WHERE state IN ('completed', 'dead', 'cancelled')
   AND finished_at < clock_timestamp() - make_interval(secs => $1::float8);

-- name: queue_depths
-- Every queue's depth by state, for the metrics collector (leases/observe.py):
-- one statement per scrape, over the partial indexes on the open states.
-- Completed and cancelled jobs are left out (they only grow). For `queued` (due now),
-- oldest_seconds is how long the oldest due job has waited.
SELECT queue,
       CASE WHEN state = 'queued' AND run_at > clock_timestamp() THEN 'scheduled'
            ELSE state END AS state,
       count(*) AS jobs,
       extract(epoch FROM clock_timestamp() - min(run_at))::float8 AS oldest_seconds
  FROM fencegate_jobs
 WHERE state IN ('queued', 'claimed', 'dead')
 GROUP BY 1, 2
 UNION ALL
-- and a row in state `paused` for each paused queue (fencegate_queue_paused)
SELECT queue, 'paused', 1, 0 FROM fencegate_queues WHERE paused_at IS NOT NULL;

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
