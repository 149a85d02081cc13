-- Statements on fencegate_rejections: the gateways' record of effects refused
-- at the fence check, for the operators' console (gateway/effects/rejections.py
-- writes and purges it, gateway/console/ reads it).
-- All times come from clock_timestamp(); a rejection's time is the database's
-- clock at the write, less how long (by the gateway's monotonic clock) the
-- rejection waited in the gateway's buffer: no two clocks are compared.

-- name: record_rejections
-- ($1 seconds since each rejection, $2 clients, $3 providers, $4 reasons,
--  $5 resources, $6 fences, $7 current fences, $8 idempotency keys)
INSERT INTO fencegate_rejections (at, client, provider, reason, resource, fence,
                                  current_fence, idempotency_key)
SELECT clock_timestamp() - make_interval(secs => age), c, p, r, res, f, cf, k
  FROM unnest($1::float8[], $2::text[], $3::text[], $4::text[], $5::text[], $6::bigint[],
              $7::bigint[], $8::text[]) AS t(age, c, p, r, res, f, cf, k);

-- name: purge_rejections
-- Up to $2 rejections older than $1 seconds; the caller repeats until fewer go.
DELETE FROM fencegate_rejections
 WHERE id IN (SELECT id FROM fencegate_rejections
               WHERE at < clock_timestamp() - make_interval(secs => $1::float8)
               ORDER BY at
               LIMIT $2);

-- name: rejections_by_minute
-- The last $1 seconds, counted by minute, reason and provider.
SELECT date_bin('1 minute', at, timestamptz '2000-01-01') AS minute, reason, provider,
       count(*) AS rejections
  FROM fencegate_rejections
 WHERE at > clock_timestamp() - make_interval(secs => $1::float8)
 GROUP BY 1, 2, 3
 ORDER BY 1, 2, 3;

-- name: rejected_resources
-- Which resources were refused in the last $1 seconds for one of the reasons
-- $3 (the zombies': stale_fence, lease_expired; or the others), the latest
-- first (at most $2): how often, why, by which clients, the key of the latest
-- refused request, the highest fence refused and the current fence then.
SELECT resource, count(*) AS rejections, max(at) AS last_at,
       array_agg(DISTINCT reason ORDER BY reason) AS reasons,
       array_agg(DISTINCT client ORDER BY client) AS clients,
       (array_agg(idempotency_key ORDER BY at DESC))[1] AS last_key,
       max(fence) AS fence, max(current_fence) AS current_fence
  FROM fencegate_rejections
 WHERE at > clock_timestamp() - make_interval(secs => $1::float8)
   AND reason = ANY($3::text[])
 GROUP BY resource
 ORDER BY last_at DESC
 LIMIT $2;

-- name: resource_rejections
-- The $2 latest rejections recorded on resource $1 (the effect page).
SELECT at, client, provider, reason, fence, current_fence, idempotency_key
  FROM fencegate_rejections
 WHERE resource = $1
 ORDER BY at DESC
 LIMIT $2;
