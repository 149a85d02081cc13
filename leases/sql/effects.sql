-- Statements on fencegate_effects: the gateway's effect ledger. Admission and
-- the end of an attempt are functions (schema.sql), which take the lease
-- row's lock first.
-- All times come from clock_timestamp(): now() is frozen at transaction start.

-- name: admit_effect
-- ($1 client, $2 key, $3 fingerprint, $4 resource, $5 fence, $6 provider,
--  $7 attempt nonce, $8 deadline seconds, $9 retry window seconds,
--  $10 resend margin seconds, $11 the request in brief: stored only when the
--  key is first admitted)
SELECT verdict, current_fence, effect_id, retry_after,
       response_status, response_headers, response_body
  FROM fencegate_admit_effect($1, $2, $3, $4, $5, $6, $7::bigint, $8::float8, $9::float8,
                              $10::float8, $11::jsonb);

-- name: finish_effect
-- ($1 client, $2 key, $3 attempt nonce, $4 resource, $5 state, $6 status,
--  $7 headers, $8 body, $9 summary, $10 the request never left this host
--  whole): succeeded | failed | free | unknown | gone (see fencegate_end_attempt)
SELECT fencegate_finish_effect($1, $2, $3::bigint, $4, $5, $6::int, $7::jsonb, $8::bytea,
                               $9::text, $10::boolean);

-- name: extend_effect
-- ($1 client, $2 key, $3 attempt nonce, $4 resource, $5 fence, $6 deadline
--  seconds, $7 resend margin seconds): extended | stale_fence | lease_expired |
--  no_lease | not_in_flight | outside_window (see fencegate_extend_effect)
SELECT fencegate_extend_effect($1, $2, $3::bigint, $4, $5::bigint, $6::float8, $7::float8);

-- name: admit_effects
-- admit_effect for a batch, one array per argument ($10: the resend margin,
-- one for all; $11: the requests in brief);
-- one row per entry, by its position (ord); 'busy' for an entry whose lease
-- row another transaction holds (send it alone)
SELECT ord, verdict, current_fence, effect_id, retry_after,
       response_status, response_headers, response_body
  FROM fencegate_admit_effects($1::text[], $2::text[], $3::bytea[], $4::text[],
                               $5::bigint[], $6::text[], $7::bigint[], $8::float8[],
                               $9::float8[], $10::float8, $11::jsonb[]);

-- name: finish_effects
-- finish_effect for a batch: (ord, done), 'busy' as above (retry it)
SELECT ord, done
  FROM fencegate_finish_effects($1::text[], $2::text[], $3::bigint[], $4::text[],
                                $5::text[], $6::int[], $7::jsonb[], $8::bytea[], $9::text[],
                                $10::boolean[]);

-- name: show_effect
-- $3: the grace after an attempt's deadline before it may be resolved; $4: the
-- time more before "not sent" where the whole request may sit at the provider
SELECT idempotency_key, client, resource, fence, provider,
       fencegate_shown_state(state, deadline) AS state,
       attempts, created_at, updated_at, deadline, retry_until, response_status, summary,
       request_summary,
       fencegate_resolvable_in(state, deadline, $3::float8)
           AS resolvable_in_seconds,
       -- resolve not_sent: $4 more where the whole request may sit at the provider
       fencegate_resolvable_in(state, deadline,
                               $3::float8 + CASE WHEN request_whole THEN $4::float8 ELSE 0 END)
           AS not_sent_in_seconds
  FROM fencegate_effects
 WHERE client = $1 AND idempotency_key = $2;

-- name: list_effects
-- $2: a state to filter on, or NULL for all; $4 as $3 of show_effect
SELECT idempotency_key, client, resource, fence, provider,
       fencegate_shown_state(state, deadline) AS state,
       attempts, created_at, updated_at, deadline, retry_until, response_status, summary,
       fencegate_resolvable_in(state, deadline, $4::float8)
           AS resolvable_in_seconds
  FROM fencegate_effects
 WHERE ($1::text IS NULL OR client = $1)
   AND ($2::text IS NULL OR state = $2
        OR ($2 = 'unknown' AND state = 'in_flight' AND deadline <= clock_timestamp()))
 ORDER BY created_at DESC
 LIMIT $3;

-- name: resolve_effect_sent
-- An operator settles an effect whose outcome was unknown: it was delivered.
-- Only once its last attempt's deadline (plus $3 seconds) has passed: before
-- that, a gateway may still be sending it. Recorded in fencegate_resolutions
-- with $4, the resolving operator's client name (or NULL), and the summary the
-- effect had before.
WITH old AS (
    SELECT id, summary FROM fencegate_effects
     WHERE client = $1 AND idempotency_key = $2 AND state IN ('unknown', 'in_flight')
       AND deadline + make_interval(secs => $3::float8) <= clock_timestamp()
       FOR UPDATE
), done AS (
    UPDATE fencegate_effects e
       SET state = 'succeeded', response_status = coalesce(response_status, 200),
           summary = 'resolved by an operator: sent', attempt = NULL,
           updated_at = clock_timestamp()
      FROM old
     WHERE e.id = old.id
    RETURNING e.client, e.idempotency_key, e.resource, e.fence, e.provider, e.attempts,
              e.created_at, old.summary
)
INSERT INTO fencegate_resolutions (client, idempotency_key, resource, fence, provider,
                                   outcome, operator, attempts, effect_created_at, summary)
SELECT client, idempotency_key, resource, fence, provider, 'sent', $4::text, attempts,
       created_at, summary
  FROM done
RETURNING idempotency_key;

-- name: resolve_effect_not_sent
-- ... or it was not: the key is free again (same condition, same record). An
-- attempt whose whole request may have reached the provider's host waits $5
-- seconds more: the provider may still read it from its receive queue and act.
WITH done AS (
    DELETE FROM fencegate_effects
     WHERE client = $1 AND idempotency_key = $2 AND state IN ('unknown', 'in_flight')
       AND deadline + make_interval(secs => $3::float8
                                    + CASE WHEN request_whole THEN $5::float8 ELSE 0 END)
           <= clock_timestamp()
    RETURNING client, idempotency_key, resource, fence, provider, attempts, created_at,
              summary
)
INSERT INTO fencegate_resolutions (client, idempotency_key, resource, fence, provider,
                                   outcome, operator, attempts, effect_created_at, summary)
SELECT client, idempotency_key, resource, fence, provider, 'not_sent', $4::text, attempts,
       created_at, summary
  FROM done
RETURNING idempotency_key;

-- name: purge_effects
-- Up to $2 finished effects past the retention window ($1 seconds), oldest
-- first; in-flight and unknown ones stay. The caller repeats until fewer
-- than $2 go. It takes many keys in no order of theirs, so it skips those
-- another statement holds (a replay of the key) rather than wait for them:
-- waiting, it could close a cycle with a batch that holds one of its keys
-- and waits for another (schema.sql, the lock order). They go next time.
DELETE FROM fencegate_effects
 WHERE id IN (SELECT id FROM fencegate_effects
               WHERE state IN ('succeeded', 'failed')
                 AND updated_at < clock_timestamp() - make_interval(secs => $1::float8)
               ORDER BY updated_at
               LIMIT $2
               FOR UPDATE SKIP LOCKED);

-- name: purge_abandoned_attempts
-- Nonces of abandoned attempts older than $1 seconds: no statement lives that long.
DELETE FROM fencegate_abandoned_attempts
 WHERE created_at < clock_timestamp() - make_interval(secs => $1::float8);

-- name: effects_awaiting_purge
SELECT count(*) FROM fencegate_effects
 WHERE state IN ('succeeded', 'failed')
   AND updated_at < clock_timestamp() - make_interval(secs => $1::float8);

-- name: effect_counts
-- For the operators' console: effects by state, finished in the last $1
-- seconds, and every one still open; each part reads a partial index.
SELECT state, count(*) AS effects FROM fencegate_effects
 WHERE state IN ('succeeded', 'failed')
   AND updated_at > clock_timestamp() - make_interval(secs => $1::float8)
 GROUP BY state
UNION ALL
SELECT 'unknown', count(*) FROM fencegate_effects
 WHERE state = 'unknown' OR (state = 'in_flight' AND deadline <= clock_timestamp())
UNION ALL
SELECT 'in_flight', count(*) FROM fencegate_effects
 WHERE state = 'in_flight' AND deadline > clock_timestamp();

-- name: recent_effects
-- The $1 latest finished effects (the purge index, read backwards).
SELECT idempotency_key, client, resource, fence, provider, state, attempts, created_at,
       updated_at, response_status, summary
  FROM fencegate_effects
 WHERE state IN ('succeeded', 'failed')
 ORDER BY updated_at DESC
 LIMIT $1;

-- name: open_effects
-- Effects awaiting an operator (unknown, or in flight past their deadline)
-- and effects in flight (holding their lease's drain barrier), at most $1;
-- $2 as $3 of show_effect.
SELECT idempotency_key, client, resource, fence, provider,
       fencegate_shown_state(state, deadline) AS state,
       attempts, created_at, updated_at, deadline, response_status, summary,
       fencegate_resolvable_in(state, deadline, $2::float8) AS resolvable_in_seconds
  FROM fencegate_effects
 WHERE state = 'unknown' OR state = 'in_flight'
 ORDER BY updated_at DESC
 LIMIT $1;

-- name: effect_clients
-- The clients that hold an effect under this key (the CLI's `effects show KEY`
-- without --client: one is the answer, several must be told apart).
SELECT client FROM fencegate_effects WHERE idempotency_key = $1 ORDER BY client LIMIT 10;

-- name: effect_detail
-- One effect as the console's effect page shows it: show_effect's columns and
-- what else the ledger keeps (the request's fingerprint and its summary, the
-- provider's answer); $3 as in show_effect.
SELECT idempotency_key, client, resource, fence, provider,
       fencegate_shown_state(state, deadline) AS state,
       attempts, created_at, updated_at, deadline, retry_until, response_status,
       response_headers, response_body, summary, encode(fingerprint, 'hex') AS fingerprint,
       request_summary,
       fencegate_resolvable_in(state, deadline, $3::float8)
           AS resolvable_in_seconds
  FROM fencegate_effects
 WHERE client = $1 AND idempotency_key = $2;

-- name: effect_resolutions
-- Every resolution of one client's key, the latest first.
SELECT resolved_at, client, idempotency_key, resource, fence, provider, outcome, operator,
       attempts, effect_created_at, summary
  FROM fencegate_resolutions
 WHERE client = $1 AND idempotency_key = $2
 ORDER BY resolved_at DESC, id DESC;

-- name: recent_resolutions
-- The $1 latest resolutions of every client.
SELECT resolved_at, client, idempotency_key, resource, fence, provider, outcome, operator,
       attempts, effect_created_at, summary
  FROM fencegate_resolutions
 ORDER BY resolved_at DESC, id DESC
 LIMIT $1;

-- name: search_effects
-- For the console's search: effects whose key starts with $1, resource starts
-- with $2, in state $3 ('unknown' includes in_flight past its deadline), of
-- provider $4, first admitted at or after $5 and before $6 (each NULL: any),
-- the newest first, $7 from the $8th; $9 as $3 of show_effect. Bounded by
-- its LIMIT; a filter that matches little may scan much of the table.
SELECT idempotency_key, client, resource, fence, provider,
       fencegate_shown_state(state, deadline) AS state,
       attempts, created_at, updated_at, deadline, response_status, summary,
       fencegate_resolvable_in(state, deadline, $9::float8)
           AS resolvable_in_seconds
  FROM fencegate_effects
 WHERE ($1::text IS NULL OR starts_with(idempotency_key, $1))
   AND ($2::text IS NULL OR starts_with(resource, $2))
   AND ($3::text IS NULL
        OR ($3 = 'unknown' AND (state = 'unknown'
                                OR (state = 'in_flight' AND deadline <= clock_timestamp())))
        OR ($3 = 'in_flight' AND state = 'in_flight' AND deadline > clock_timestamp())
        OR ($3 NOT IN ('unknown', 'in_flight') AND state = $3))
   AND ($4::text IS NULL OR provider = $4)
   AND ($5::timestamptz IS NULL OR created_at >= $5)
   AND ($6::timestamptz IS NULL OR created_at < $6)
 ORDER BY id DESC
 LIMIT $7 OFFSET $8;
