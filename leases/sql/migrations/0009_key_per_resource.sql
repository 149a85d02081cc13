-- An idempotency key belongs to the resource it was first admitted under.
-- The request's fingerprint covers provider, method, path and body, not the
-- resource: the same key and body under another Fence-Resource matched, and
-- was answered with the first resource's stored answer (or sent again as a
-- resend under the other resource's fence). The admission now refuses it as
-- idempotency_key_reused; under the same resource a newer fence still gets
-- the stored answer. Same arguments and result: a CREATE OR REPLACE.

CREATE OR REPLACE FUNCTION fencegate_admit_effect(
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
        -- a key belongs to the resource it was first admitted under: the
        -- fingerprint does not cover the resource, so it is compared here
        IF e.fingerprint <> p_fingerprint OR e.resource <> p_resource THEN
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
