-- Statements on fencegate_leases: claim, renew, release, show.
-- Loaded by leases.sql with effects.sql and jobs.sql; `-- name: X` starts a block.
-- All times come from clock_timestamp(): now() is frozen at transaction start.

-- name: claim_lease
-- Wins when the resource has no live lease, or its live lease is the caller's,
-- and no effect of the previous fence is still in flight (drain barrier).
-- Zero rows: lost, a normal answer. (The upsert itself is
-- fencegate_claim_lease, in schema.sql: the queue's claim uses it too; this
-- one is refused if its owner was abandoned, see abandon_claim.)
SELECT resource, owner, fence, expires_at
  FROM fencegate_claim_lease_unless_abandoned($1, $2, $3::float8, true);

-- name: renew_lease
-- ($1 resource, $2 owner, $3 fence, $4 ttl, $5 margin): see fencegate_renew_lease;
-- waiting for a locked row at most $6 seconds (then refused: lock_not_available,
-- see fencegate_renew_lease_waiting)
SELECT resource, owner, fence, expires_at
  FROM fencegate_renew_lease_waiting($1, $2, $3, $4::float8, $5::float8, $6::float8);

-- name: release_lease
-- Ends the lease at once; the fence stays, so the next claim issues a higher one.
-- Waits for a locked row at most $4 seconds (then refused: lock_not_available).
SELECT fence FROM fencegate_release_leases_waiting(ARRAY[$1::text], ARRAY[$2::text],
                                                   ARRAY[$3::bigint], $4::float8);

-- name: claim_leases
-- claim_lease for a batch ($1 resources, $2 owners, $3 ttls): the rows that won
SELECT ord, resource, owner, fence, expires_at
  FROM fencegate_claim_leases($1::text[], $2::text[], $3::float8[], true);

-- name: renew_leases
-- renew_lease for a batch: (ord, expires_at) of the renewals that counted,
-- and (ord, NULL, true) of those whose row another transaction held locked
SELECT ord, expires_at, locked
  FROM fencegate_renew_leases($1::text[], $2::text[], $3::bigint[], $4::float8[],
                              $5::float8[]);

-- name: release_leases
-- release_lease for a batch; waits for each locked row at most $4 seconds
SELECT ord, fence FROM fencegate_release_leases_waiting($1::text[], $2::text[], $3::bigint[],
                                                        $4::float8);

-- name: abandon_claim
-- Ends the lease of an owner made up for one claim whose answer was lost
-- (nobody knows its fence), and remembers the owner, so that claim is refused
-- should it land later still. Only for such owners: they hold nothing else.
-- The fence it ended, or NULL.
SELECT fencegate_abandon_claim($1, $2);

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

-- name: search_leases
-- For the console's search: lease rows whose resource starts with $1 (NULL:
-- any), $2 'live' or 'ended' (NULL: both), however long ago they ended, the
-- latest claims first, $3 from the $4th.
SELECT resource, owner, fence, claimed_at, expires_at,
       expires_at > clock_timestamp() AS live, inflight, drain_until,
       inflight > 0 AND drain_until > clock_timestamp() AS draining
  FROM fencegate_leases
 WHERE ($1::text IS NULL OR starts_with(resource, $1))
   AND ($2::text IS NULL OR ($2 = 'live') = (expires_at > clock_timestamp()))
 ORDER BY claimed_at DESC, resource
 LIMIT $3 OFFSET $4;

-- name: check_fence
-- Inside the caller's transaction: passes only for the current fence of a live
-- lease, else SQLSTATE FG412 (the reason as its message); passed, no newer
-- fence is granted until the transaction ends (fencegate_check_fence, schema.sql)
SELECT fencegate_check_fence($1, $2);
