-- Attempts counted once, verdicts named as the gateway answers them, and
-- purgeable finished jobs.
--
-- Each admitted attempt carries a nonce chosen by the gateway (`attempt`).
-- While it is set, the attempt is counted in its lease row's `inflight` (the
-- drain barrier). Ending the attempt clears it in the same statement that
-- decrements the count, so a finish that is retried (its first try committed
-- but the answer was lost) finds nothing and cannot open the barrier early.
--
-- The functions of 0001 stay, unchanged, for gateways older than this schema
-- during a rolling upgrade (docs/operations.md); new gateways call the ones
-- below (same names, other arguments).

ALTER TABLE fencegate_effects ADD COLUMN attempt bigint;

-- Attempts the gateway gave up on before it learnt whether their admission
-- committed (its answer was lost): freed by nonce, and remembered here so an
-- admission whose packets arrive even later is refused rather than left in
-- flight for nobody. Kept a day (the gateway's purge), far past any delay a
-- statement survives in a connection.
CREATE TABLE fencegate_abandoned_attempts (
    attempt    bigint      PRIMARY KEY,
    created_at timestamptz NOT NULL DEFAULT clock_timestamp()
);

-- verdicts: admitted | replay | the problem code of every refusal
--           (stale_fence, lease_expired, no_lease, invalid_fence,
--            idempotency_key_reused, effect_in_progress, effect_outcome_unknown)
--           | abandoned (the gateway gave this attempt up: nobody will send it)
--
-- p_deadline_seconds: how long, from now by this database's clock, an
-- attempt may still reach the provider. The gateway derives it from its own
-- local deadline (taken before this call was sent) plus a grace, so this
-- barrier always outlasts the gateway's.
-- p_retry_window_seconds: the provider dedupes our key this long after it
-- first sees it (0: it dedupes nothing). A resend is admitted only while the
-- whole attempt, deadline and p_resend_margin_seconds included, still ends
-- inside the window counted from the first admission.
CREATE FUNCTION fencegate_admit_effect(
    p_client text, p_key text, p_fingerprint bytea, p_resource text,
    p_fence bigint, p_provider text, p_attempt bigint,
    p_deadline_seconds double precision, p_retry_window_seconds double precision,
    p_resend_margin_seconds double precision
) RETURNS TABLE (
    verdict text, current_fence bigint, effect_id bigint, retry_after double precision,
    response_status integer, response_headers jsonb, response_body bytea
)
LANGUAGE plpgsql AS $$
DECLARE
    l   fencegate_leases%ROWTYPE;
    e   fencegate_effects%ROWTYPE;
    now_ timestamptz;
    deadline_ timestamptz;
BEGIN
    -- The lock serialises this admission with claims of the same resource,
    -- and with the free of an abandoned attempt (which takes it too).
    SELECT * INTO l FROM fencegate_leases WHERE resource = p_resource FOR NO KEY UPDATE;
    IF NOT FOUND THEN
        RETURN QUERY SELECT 'no_lease', NULL::bigint, NULL::bigint, NULL::float8,
                            NULL::int, NULL::jsonb, NULL::bytea;
        RETURN;
    END IF;
    IF EXISTS (SELECT 1 FROM fencegate_abandoned_attempts WHERE attempt = p_attempt) THEN
        RETURN QUERY SELECT 'abandoned', NULL::bigint, NULL::bigint, NULL::float8,
                            NULL::int, NULL::jsonb, NULL::bytea;
        RETURN;
    END IF;
    now_ := clock_timestamp();  -- read after the lock was granted
    IF p_fence < l.fence THEN
        RETURN QUERY SELECT 'stale_fence', l.fence, NULL::bigint, NULL::float8,
                            NULL::int, NULL::jsonb, NULL::bytea;
        RETURN;
    ELSIF p_fence > l.fence THEN
        RETURN QUERY SELECT 'invalid_fence', l.fence, NULL::bigint, NULL::float8,
                            NULL::int, NULL::jsonb, NULL::bytea;
        RETURN;
    ELSIF l.expires_at <= now_ THEN
        RETURN QUERY SELECT 'lease_expired', l.fence, NULL::bigint, NULL::float8,
                            NULL::int, NULL::jsonb, NULL::bytea;
        RETURN;
    END IF;

    deadline_ := now_ + make_interval(secs => p_deadline_seconds);
    LOOP
        INSERT INTO fencegate_effects AS fx (client, idempotency_key, fingerprint, resource,
                                             fence, provider, state, deadline, retry_until,
                                             attempt, created_at, updated_at)
        VALUES (p_client, p_key, p_fingerprint, p_resource, p_fence, p_provider,
                'in_flight', deadline_,
                CASE WHEN p_retry_window_seconds > 0
                     THEN now_ + make_interval(secs => p_retry_window_seconds) END,
                p_attempt, now_, now_)
        ON CONFLICT (client, idempotency_key) DO NOTHING
        RETURNING * INTO e;
        IF FOUND THEN
            EXIT;
        END IF;
        SELECT * INTO e FROM fencegate_effects
         WHERE client = p_client AND idempotency_key = p_key FOR UPDATE;
        IF NOT FOUND THEN
            CONTINUE;  -- freed between our insert and our look: try again
        END IF;
        IF e.fingerprint <> p_fingerprint THEN
            RETURN QUERY SELECT 'idempotency_key_reused', l.fence, e.id, NULL::float8,
                                NULL::int, NULL::jsonb, NULL::bytea;
            RETURN;
        ELSIF e.state IN ('succeeded', 'failed') THEN
            RETURN QUERY SELECT 'replay', l.fence, e.id, NULL::float8,
                                e.response_status, e.response_headers, e.response_body;
            RETURN;
        ELSIF e.state = 'in_flight' AND e.deadline > now_ THEN
            RETURN QUERY SELECT 'effect_in_progress', l.fence, e.id,
                                extract(epoch FROM e.deadline - now_)::float8,
                                NULL::int, NULL::jsonb, NULL::bytea;
            RETURN;
        END IF;
        -- unknown, or in flight past its deadline (the gateway that sent it died).
        -- Sending again is safe only if the provider will still dedupe our key
        -- when this whole attempt could land.
        IF e.retry_until IS NULL
           OR deadline_ + make_interval(secs => p_resend_margin_seconds) > e.retry_until THEN
            UPDATE fencegate_effects SET state = 'unknown', updated_at = now_
             WHERE id = e.id AND state = 'in_flight';
            RETURN QUERY SELECT 'effect_outcome_unknown', l.fence, e.id, NULL::float8,
                                NULL::int, NULL::jsonb, NULL::bytea;
            RETURN;
        END IF;
        UPDATE fencegate_effects
           SET state = 'in_flight', resource = p_resource, fence = p_fence,
               attempts = attempts + 1, attempt = p_attempt, deadline = deadline_,
               updated_at = now_
         WHERE id = e.id
        RETURNING * INTO e;
        EXIT;
    END LOOP;

    UPDATE fencegate_leases
       SET inflight = inflight + 1, drain_until = greatest(drain_until, deadline_)
     WHERE resource = p_resource;
    RETURN QUERY SELECT 'admitted', l.fence, e.id, NULL::float8,
                        NULL::int, NULL::jsonb, NULL::bytea;
END
$$;

-- The end of one attempt, found by its nonce. Answers what it did:
--   recorded  the outcome is stored (succeeded or failed)
--   freed     the provider certainly did not act: the key is free again
--   unknown   the outcome is unknown (or a resend was not made: the first
--             attempt may have landed, so the key is not free)
--   gone      nothing matched: already ended (a retry of this call), or
--             replaced by a later attempt, or (for a free) never admitted:
--             then the nonce is remembered as abandoned, so an admission
--             arriving later still is refused
-- Only a definite end releases the attempt's place in the drain barrier; an
-- unknown one may still be landing and holds it until its deadline. The lease
-- row is locked first, in the same order as admission, so the two cannot
-- deadlock.
CREATE FUNCTION fencegate_finish_effect(
    p_client text, p_key text, p_attempt bigint, p_resource text, p_state text,
    p_status integer, p_headers jsonb, p_body bytea, p_summary text
) RETURNS text
LANGUAGE plpgsql AS $$
DECLARE
    r_resource text;
    r_fence bigint;
    answer text;
BEGIN
    -- This commit need not wait for the WAL flush: if a crash loses it, the
    -- effect reads as in flight, then unknown, and is never sent again. (The
    -- admission's commit, which makes a send possible, does wait.)
    PERFORM set_config('synchronous_commit', 'off', true);
    PERFORM 1 FROM fencegate_leases WHERE resource = p_resource FOR NO KEY UPDATE;
    IF p_state = 'unknown' THEN
        UPDATE fencegate_effects
           SET state = 'unknown', summary = p_summary, updated_at = clock_timestamp()
         WHERE client = p_client AND idempotency_key = p_key AND attempt = p_attempt
           AND state = 'in_flight';
        RETURN CASE WHEN FOUND THEN 'unknown' ELSE 'gone' END;
    ELSIF p_state = 'free' THEN
        DELETE FROM fencegate_effects
         WHERE client = p_client AND idempotency_key = p_key AND attempt = p_attempt
           AND attempts = 1
        RETURNING resource, fence INTO r_resource, r_fence;
        answer := 'freed';
        IF NOT FOUND THEN
            UPDATE fencegate_effects
               SET state = 'unknown', attempt = NULL, updated_at = clock_timestamp()
             WHERE client = p_client AND idempotency_key = p_key AND attempt = p_attempt
            RETURNING resource, fence INTO r_resource, r_fence;
            answer := 'unknown';
        END IF;
    ELSE
        -- also from `unknown`: an attempt marked unknown when its deadline
        -- passed may still learn its outcome, which beats not knowing
        UPDATE fencegate_effects
           SET state = p_state, response_status = p_status, response_headers = p_headers,
               response_body = p_body, summary = p_summary, attempt = NULL,
               updated_at = clock_timestamp()
         WHERE client = p_client AND idempotency_key = p_key AND attempt = p_attempt
        RETURNING resource, fence INTO r_resource, r_fence;
        answer := 'recorded';
    END IF;
    IF NOT FOUND THEN
        IF p_state = 'free' THEN
            INSERT INTO fencegate_abandoned_attempts (attempt) VALUES (p_attempt)
            ON CONFLICT DO NOTHING;
        END IF;
        RETURN 'gone';
    END IF;
    UPDATE fencegate_leases SET inflight = inflight - 1
     WHERE resource = r_resource AND fence = r_fence AND inflight > 0;
    RETURN answer;
END
$$;

-- The lease upsert, in one place: a claim of a resource (claim_lease) and of
-- a job's lease (claim_jobs). It wins when the resource has no live lease, or
-- (p_same_owner) its live lease is the caller's, and no effect of the
-- previous fence is still in flight (the drain barrier). The new fence is one
-- more than the last, and never below the database clock in microseconds.
CREATE FUNCTION fencegate_claim_lease(
    p_resource text, p_owner text, p_ttl double precision, p_same_owner boolean
) RETURNS SETOF fencegate_leases
LANGUAGE sql VOLATILE AS $$
    INSERT INTO fencegate_leases AS l (resource, owner, fence, claimed_at, expires_at)
    VALUES (p_resource, p_owner, fencegate_next_fence(0), clock_timestamp(),
            clock_timestamp() + make_interval(secs => p_ttl))
    ON CONFLICT (resource) DO UPDATE
       SET owner = excluded.owner,
           fence = fencegate_next_fence(l.fence),
           claimed_at = clock_timestamp(),
           expires_at = clock_timestamp() + make_interval(secs => p_ttl),
           inflight = 0,
           drain_until = NULL
     WHERE (l.expires_at <= clock_timestamp() OR (p_same_owner AND l.owner = excluded.owner))
       AND (l.inflight = 0 OR l.drain_until <= clock_timestamp())
    RETURNING *
$$;

-- finished jobs past retention are purged oldest first
CREATE INDEX fencegate_jobs_finished ON fencegate_jobs (finished_at)
    WHERE state IN ('completed', 'dead');
