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
SELECT verdict, current_fence, effect_id, retry_after,
       response_status, response_headers, response_body
  FROM fencegate_admit_effect($1, $2, $3, $4, $5, $6, $7, $8);

-- name: finish_effect
SELECT fencegate_finish_effect($1, $2, $3, $4, $5, $6, $7, $8);

-- name: show_effect
SELECT idempotency_key, client, resource, fence, provider,
       CASE WHEN state = 'in_flight' AND deadline <= clock_timestamp()
            THEN 'unknown' ELSE state END AS state,
       attempts, created_at, updated_at, deadline, retry_until, response_status, summary
  FROM fencegate_effects
 WHERE client = $1 AND idempotency_key = $2;

-- name: list_effects
-- $2: a state to filter on, or NULL for all
SELECT idempotency_key, client, resource, fence, provider,
       CASE WHEN state = 'in_flight' AND deadline <= clock_timestamp()
            THEN 'unknown' ELSE state END AS state,
       attempts, created_at, updated_at, deadline, retry_until, response_status, summary
  FROM fencegate_effects
 WHERE ($1::text IS NULL OR client = $1)
   AND ($2::text IS NULL OR state = $2
        OR ($2 = 'unknown' AND state = 'in_flight' AND deadline <= clock_timestamp()))
 ORDER BY created_at DESC
 LIMIT $3;

-- name: resolve_effect_sent
-- An operator settles an effect whose outcome was unknown: it was delivered.
UPDATE fencegate_effects
   SET state = 'succeeded', response_status = coalesce(response_status, 200),
       summary = 'resolved by an operator: sent', updated_at = clock_timestamp()
 WHERE client = $1 AND idempotency_key = $2
   AND (state = 'unknown' OR (state = 'in_flight' AND deadline <= clock_timestamp()))
RETURNING idempotency_key;

-- name: resolve_effect_not_sent
-- ... or it was not: the key is free again.
DELETE FROM fencegate_effects
 WHERE client = $1 AND idempotency_key = $2
   AND (state = 'unknown' OR (state = 'in_flight' AND deadline <= clock_timestamp()))
RETURNING idempotency_key;

-- name: purge_effects
-- Finished effects past the retention window; in-flight and unknown ones stay.
DELETE FROM fencegate_effects
 WHERE id IN (SELECT id FROM fencegate_effects
               WHERE state IN ('succeeded', 'failed')
                 AND updated_at < clock_timestamp() - make_interval(secs => $1::float8)
               LIMIT $2);
