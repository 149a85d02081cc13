-- Statements on fencegate_leases: claim, renew, release, show.
-- Loaded by leases.sql with effects.sql and jobs.sql; `-- name: X` starts a block.
-- All times come from clock_timestamp(): now() is frozen at transaction start.

-- name: claim_lease
-- Wins when the resource has no live lease, or its live lease is the caller's,
-- and no effect of the previous fence is still in flight (drain barrier).
-- Zero rows: lost, a normal answer. (The upsert itself is
-- fencegate_claim_lease, in schema.sql: the queue's claim uses it too.)
SELECT resource, owner, fence, expires_at
  FROM fencegate_claim_lease($1, $2, $3::float8, true);

-- name: renew_lease
-- $5: the holder's safety margin. A renewal that arrives within it of the
-- expiry comes too late for a holder that gives up that long before the
-- expiry (the lease client does): it has already let go, so the renewal is
-- refused rather than keep a lease nobody holds. (0 over HTTP: the expiry.)
UPDATE fencegate_leases
   SET expires_at = clock_timestamp() + make_interval(secs => $4::float8)
 WHERE resource = $1 AND owner = $2 AND fence = $3
   AND expires_at - make_interval(secs => $5::float8) > clock_timestamp()
RETURNING resource, owner, fence, expires_at;

-- name: release_lease
-- Ends the lease at once; the fence stays, so the next claim issues a higher one.
UPDATE fencegate_leases
   SET expires_at = clock_timestamp()
 WHERE resource = $1 AND owner = $2 AND fence = $3 AND expires_at > clock_timestamp()
RETURNING fence;

-- name: abandon_claim
-- Ends the lease of an owner made up for one claim whose answer was lost
-- (nobody knows its fence). Only for such owners: they hold nothing else.
UPDATE fencegate_leases
   SET expires_at = clock_timestamp()
 WHERE resource = $1 AND owner = $2 AND expires_at > clock_timestamp()
RETURNING fence;

-- name: show_lease
SELECT resource, owner, fence, expires_at, expires_at > clock_timestamp() AS live,
       inflight
  FROM fencegate_leases
 WHERE resource = $1;

-- name: recent_leases
-- For the operators' console: live leases, leases holding the drain barrier,
-- and those that ended in the last $2 seconds; the latest claims first, at
-- most $1. (No index on the times: one would cost every renewal its HOT
-- update. The console asks at most once a second per gateway process.)
SELECT resource, owner, fence, claimed_at, expires_at,
       expires_at > clock_timestamp() AS live, inflight, drain_until,
       inflight > 0 AND drain_until > clock_timestamp() AS draining
  FROM fencegate_leases
 WHERE expires_at > clock_timestamp() - make_interval(secs => $2::float8)
    OR (inflight > 0 AND drain_until > clock_timestamp())
 ORDER BY claimed_at DESC
 LIMIT $1;
