-- Leases, and the in-flight effect ledger the gateway's drain barrier needs.
--
-- A lease row is never deleted: its fence is the high-water mark of every
-- fence ever issued for the resource.

-- The next fence for a resource: one more than the last, and never less than
-- the database clock in microseconds since the epoch. The clock floor is what
-- keeps fences rising after a restore of this cluster from its own history
-- (a restored row holds an old fence, but time has moved on).
CREATE FUNCTION fencegate_next_fence(previous bigint) RETURNS bigint
LANGUAGE sql VOLATILE AS $$
    SELECT greatest(
        previous + 1,
        (extract(epoch FROM clock_timestamp()) * 1000000)::bigint
    )
$$;

CREATE TABLE fencegate_leases (
    resource    text        PRIMARY KEY
                CHECK (resource ~ '^[A-Za-z0-9._:/@-]{1,200}$'),
    owner       text        NOT NULL CHECK (length(owner) BETWEEN 1 AND 200),
    fence       bigint      NOT NULL CHECK (fence > 0),
    claimed_at  timestamptz NOT NULL,
    expires_at  timestamptz NOT NULL,
    -- Drain barrier (contract rule 5): effects admitted under `fence` and not
    -- yet finished, and the latest deadline among them. A claim waits while
    -- inflight > 0, but never past drain_until (a gateway that died mid-send
    -- cannot block the resource forever).
    inflight    integer     NOT NULL DEFAULT 0 CHECK (inflight >= 0),
    drain_until timestamptz,
    CONSTRAINT drain_until_set_when_inflight
        CHECK (inflight = 0 OR drain_until IS NOT NULL)
);

CREATE TABLE fencegate_effects (
    id               bigint      GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    client           text        NOT NULL,
    idempotency_key  text        NOT NULL,
    fingerprint      bytea       NOT NULL,
    resource         text        NOT NULL,
    fence            bigint      NOT NULL,
    provider         text        NOT NULL,
    state            text        NOT NULL
                     CHECK (state IN ('in_flight', 'succeeded', 'failed', 'unknown')),
    attempts         integer     NOT NULL DEFAULT 1,
    created_at       timestamptz NOT NULL DEFAULT clock_timestamp(),
    updated_at       timestamptz NOT NULL DEFAULT clock_timestamp(),
    deadline         timestamptz NOT NULL,
    -- while set and in the future, the provider dedupes on our key, so an
    -- `unknown` effect may be sent again
    retry_until      timestamptz,
    response_status  integer,
    response_headers jsonb,
    response_body    bytea,
    summary          text,
    UNIQUE (client, idempotency_key),
    CONSTRAINT finished_has_response
        CHECK (state NOT IN ('succeeded', 'failed') OR response_status IS NOT NULL)
);

CREATE INDEX fencegate_effects_purge ON fencegate_effects (updated_at)
    WHERE state IN ('succeeded', 'failed');
CREATE INDEX fencegate_effects_open ON fencegate_effects (deadline)
    WHERE state = 'in_flight';

-- Admission of one effect, in one round trip: the fence verdict (by the
-- database clock, under the lease row's lock, so no claim can slip between the
-- check and the reservation) and the reservation of the idempotency key.
--
-- verdicts: admitted | stale_fence | lease_expired | no_lease | invalid_fence
--           | key_reused | replay | in_progress | outcome_unknown
CREATE FUNCTION fencegate_admit_effect(
    p_client text, p_key text, p_fingerprint bytea, p_resource text,
    p_fence bigint, p_provider text, p_deadline_seconds double precision,
    p_retry_window_seconds double precision
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
    -- The lock serialises this admission with claims of the same resource.
    SELECT * INTO l FROM fencegate_leases WHERE resource = p_resource FOR NO KEY UPDATE;
    IF NOT FOUND THEN
        RETURN QUERY SELECT 'no_lease', NULL::bigint, NULL::bigint, NULL::float8,
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
                                             created_at, updated_at)
        VALUES (p_client, p_key, p_fingerprint, p_resource, p_fence, p_provider,
                'in_flight', deadline_,
                CASE WHEN p_retry_window_seconds > 0
                     THEN now_ + make_interval(secs => p_retry_window_seconds) END,
                now_, now_)
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
            RETURN QUERY SELECT 'key_reused', l.fence, e.id, NULL::float8,
                                NULL::int, NULL::jsonb, NULL::bytea;
            RETURN;
        ELSIF e.state IN ('succeeded', 'failed') THEN
            RETURN QUERY SELECT 'replay', l.fence, e.id, NULL::float8,
                                e.response_status, e.response_headers, e.response_body;
            RETURN;
        ELSIF e.state = 'in_flight' AND e.deadline > now_ THEN
            RETURN QUERY SELECT 'in_progress', l.fence, e.id,
                                extract(epoch FROM e.deadline - now_)::float8,
                                NULL::int, NULL::jsonb, NULL::bytea;
            RETURN;
        END IF;
        -- unknown, or in flight past its deadline (the gateway that sent it died)
        IF e.retry_until IS NULL OR e.retry_until <= now_ THEN
            UPDATE fencegate_effects SET state = 'unknown', updated_at = now_
             WHERE id = e.id AND state = 'in_flight';
            RETURN QUERY SELECT 'outcome_unknown', l.fence, e.id, NULL::float8,
                                NULL::int, NULL::jsonb, NULL::bytea;
            RETURN;
        END IF;
        -- The provider still dedupes on our key: sending again is safe.
        UPDATE fencegate_effects
           SET state = 'in_flight', resource = p_resource, fence = p_fence,
               attempts = attempts + 1, deadline = deadline_, updated_at = now_
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

-- The end of one admitted attempt. p_state 'free' deletes the record (the
-- provider certainly did not act, so the key may be used again). The lease row
-- is locked first, in the same order as admission, so the two cannot deadlock.
CREATE FUNCTION fencegate_finish_effect(
    p_effect_id bigint, p_resource text, p_fence bigint, p_state text,
    p_status integer, p_headers jsonb, p_body bytea, p_summary text
) RETURNS boolean
LANGUAGE plpgsql AS $$
DECLARE
    n integer;
BEGIN
    -- This commit need not wait for the WAL flush: if a crash loses it, the
    -- effect reads as in flight, then unknown, and is never sent again. (The
    -- admission's commit, which makes a send possible, does wait.)
    PERFORM set_config('synchronous_commit', 'off', true);
    -- An attempt whose outcome is unknown may still be landing (bytes already
    -- on their way when the gateway gave up): it keeps holding the drain
    -- barrier until its deadline. Every other ending releases it now.
    IF p_state <> 'unknown' THEN
        UPDATE fencegate_leases SET inflight = inflight - 1
         WHERE resource = p_resource AND fence = p_fence AND inflight > 0;
    END IF;
    IF p_state = 'free' THEN
        DELETE FROM fencegate_effects
         WHERE id = p_effect_id AND state = 'in_flight' AND fence = p_fence AND attempts = 1;
        GET DIAGNOSTICS n = ROW_COUNT;
        IF n = 1 THEN
            RETURN true;
        END IF;
        -- a resend after an unanswered attempt: that first attempt may have
        -- landed, so the key is not free; it stays unknown (resendable while
        -- the provider still dedupes)
        UPDATE fencegate_effects SET state = 'unknown', updated_at = clock_timestamp()
         WHERE id = p_effect_id AND state = 'in_flight' AND fence = p_fence;
    ELSE
        UPDATE fencegate_effects
           SET state = p_state, response_status = p_status, response_headers = p_headers,
               response_body = p_body, summary = p_summary, updated_at = clock_timestamp()
         -- an attempt that outlived its deadline was marked unknown meanwhile;
         -- what it learnt late is still better than not knowing
         WHERE id = p_effect_id AND state IN ('in_flight', 'unknown') AND fence = p_fence;
    END IF;
    GET DIAGNOSTICS n = ROW_COUNT;
    RETURN n = 1;
END
$$;
