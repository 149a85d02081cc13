-- The baseline: fencegate's schema, whole. Until the first release it is
-- changed in place; from the release on it is never edited (its checksum is
-- kept in fencegate_migrations, and a database refuses a migration that
-- changed) and every change is a new migration, one step from here.
-- leases/sql/schema.sql is where the current schema is read.
--
-- Where is a fence checked? fencegate_admit_effect. Where is one issued?
-- fencegate_claim_lease (both the lease API's claims and the queue's).

-- ---- leases -------------------------------------------------------------------

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
    -- the length apart from the pattern: a bounded repetition ({1,200})
    -- makes PostgreSQL's regex engine build a state per character counted,
    -- about 75 µs a check, and the check runs on every update of the row
    -- (two per effect); `+` and length() cost about 1 µs (bench/NOTES.md)
    resource    text        PRIMARY KEY
                CHECK (resource ~ '^[A-Za-z0-9._:/@-]+$' AND length(resource) <= 200),
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

-- The fenced transactions (fencegate_check_fence) open on p_resource, ended:
-- their sessions are terminated, each waited for at most 250 ms. Called by a
-- claim of an expired lease that such a transaction held back 250 ms: its
-- worker is a zombie stalled with it open, idle or mid-statement (blocked
-- writing a result to a stopped process, or reading its COPY), where no
-- timeout of PostgreSQL's own ends it. They are found by the advisory lock
-- each check takes (key: the resource hashed with seed 412). True if any was
-- ended. Terminating needs the same role or pg_signal_backend; without it,
-- nothing is ended and the claim is answered as held.
CREATE FUNCTION fencegate_end_fenced(p_resource text) RETURNS boolean
LANGUAGE plpgsql AS $$
DECLARE
    key bigint := hashtextextended(p_resource, 412);
    holder integer;
    ended boolean := false;
BEGIN
    FOR holder IN
        SELECT k.pid FROM pg_locks k
         WHERE k.locktype = 'advisory' AND k.granted AND k.objsubid = 1
           AND k.database = (SELECT oid FROM pg_database WHERE datname = current_database())
           AND k.classid = ((key >> 32) & 4294967295)::oid
           AND k.objid = (key & 4294967295)::oid
           AND k.pid <> pg_backend_pid()
    LOOP
        BEGIN
            ended := pg_terminate_backend(holder, 250) OR ended;
        EXCEPTION WHEN insufficient_privilege THEN
            NULL;
        END;
    END LOOP;
    RETURN ended;
END
$$;

-- The lease upsert, in one place: a claim of a resource (claim_lease) and of
-- a job's lease (claim_jobs). It wins when the resource has no live lease, or
-- (p_same_owner) its live lease is the caller's, and no effect of the
-- previous fence is still in flight (the drain barrier). The new fence is one
-- more than the last, and never below the database clock in microseconds.
-- The row is locked FOR UPDATE first, so a claim is never granted while a
-- fenced transaction (fencegate_check_fence) is open on the resource: it is
-- answered as held. ROWS 1: what it returns, for the planner (a job claim
-- joins it to the jobs by primary key rather than scanning them all).
CREATE FUNCTION fencegate_claim_lease(
    p_resource text, p_owner text, p_ttl double precision, p_same_owner boolean
) RETURNS SETOF fencegate_leases
LANGUAGE plpgsql VOLATILE ROWS 1 AS $$
DECLARE
    l fencegate_leases%ROWTYPE;
    waited text;
    locked boolean;
    ended boolean := false;
BEGIN
    LOOP
        -- FOR UPDATE: the one lock that a fenced transaction's FOR KEY SHARE
        -- (fencegate_check_fence) holds back. Renewals and admissions take
        -- FOR NO KEY UPDATE, which it does not.
        SELECT * INTO l FROM fencegate_leases WHERE resource = p_resource
           FOR UPDATE SKIP LOCKED;
        IF NOT FOUND THEN
            SELECT * INTO l FROM fencegate_leases WHERE resource = p_resource;
            IF NOT FOUND THEN
                INSERT INTO fencegate_leases (resource, owner, fence, claimed_at, expires_at)
                VALUES (p_resource, p_owner, fencegate_next_fence(0), clock_timestamp(),
                        clock_timestamp() + make_interval(secs => p_ttl))
                ON CONFLICT (resource) DO NOTHING
                RETURNING * INTO l;
                IF FOUND THEN
                    RETURN NEXT l;
                    RETURN;
                END IF;
                CONTINUE;  -- another claim made the row meanwhile: look again
            END IF;
            -- Another transaction holds the row. A claim that loses anyway
            -- does not wait; one that could win waits for the row, at most
            -- 250 ms, then is answered as held: a fenced transaction still
            -- open (or any other lock held that long) keeps the resource.
            IF NOT ((l.expires_at <= clock_timestamp()
                     OR (p_same_owner AND l.owner = p_owner))
                    AND (l.inflight = 0 OR l.drain_until <= clock_timestamp())) THEN
                RETURN;
            END IF;
            waited := current_setting('lock_timeout');
            BEGIN
                IF waited = '0' OR waited::interval > interval '250 ms' THEN
                    PERFORM set_config('lock_timeout', '250ms', true);
                END IF;
                SELECT * INTO l FROM fencegate_leases WHERE resource = p_resource FOR UPDATE;
                locked := FOUND;  -- before PERFORM, which sets FOUND again
                PERFORM set_config('lock_timeout', waited, true);
            EXCEPTION WHEN lock_not_available THEN
                -- held that long. A fenced transaction of an expired lease
                -- is ended (fencegate_end_fenced) and the row waited for once
                -- more; anything else keeps the resource: held.
                IF ended OR l.expires_at > clock_timestamp() THEN
                    RETURN;
                END IF;
                ended := fencegate_end_fenced(p_resource);
                IF NOT ended THEN
                    RETURN;
                END IF;
                CONTINUE;
            END;
            IF NOT locked THEN
                CONTINUE;  -- purged meanwhile: make the row anew
            END IF;
        END IF;
        -- the lease rules, on the row's newest version, locked
        IF (l.expires_at <= clock_timestamp() OR (p_same_owner AND l.owner = p_owner))
           AND (l.inflight = 0 OR l.drain_until <= clock_timestamp()) THEN
            UPDATE fencegate_leases
               SET owner = p_owner,
                   fence = fencegate_next_fence(l.fence),
                   claimed_at = clock_timestamp(),
                   expires_at = clock_timestamp() + make_interval(secs => p_ttl),
                   inflight = 0,
                   drain_until = NULL
             WHERE resource = p_resource
            RETURNING * INTO l;
            RETURN NEXT l;
        END IF;
        RETURN;
    END LOOP;
END
$$;

-- Claims abandoned for good: a claim of the lease API under an owner made up
-- for it, whose answer never came, is abandoned by the client (nobody knows
-- its fence). Its statement may still be on its way and land after the
-- abandon, so the owner is remembered here, and a claim of the lease API
-- under a remembered owner is refused as it lands. Kept a day (each abandon
-- purges older ones). The queue's claims do not look: a worker's owner is
-- never abandoned.
CREATE TABLE fencegate_abandoned_owners (
    owner      text        PRIMARY KEY,
    created_at timestamptz NOT NULL DEFAULT clock_timestamp()
);

-- fencegate_claim_lease, refused if its owner was abandoned. A claim and the
-- abandon of its owner take the same transaction-level advisory lock of the
-- resource first, so one waits for the other: a claim that comes second
-- sees the owner recorded (each statement of a plpgsql function takes a new
-- snapshot), an abandon that comes second sees the lease the claim made.
CREATE FUNCTION fencegate_claim_lease_unless_abandoned(
    p_resource text, p_owner text, p_ttl double precision, p_same_owner boolean
) RETURNS SETOF fencegate_leases
LANGUAGE plpgsql VOLATILE ROWS 1 AS $$
BEGIN
    PERFORM pg_advisory_xact_lock(hashtextextended(p_resource, 0));
    IF EXISTS (SELECT 1 FROM fencegate_abandoned_owners WHERE owner = p_owner) THEN
        RETURN;
    END IF;
    RETURN QUERY SELECT * FROM fencegate_claim_lease(p_resource, p_owner, p_ttl, p_same_owner);
END
$$;

-- Renewal and release, one definition each (the single statements and the
-- batches below call them).
-- p_margin: the holder's safety margin. A renewal that arrives within it of
-- the expiry comes too late for a holder that gives up that long before the
-- expiry (the lease client does): it has already let go, so the renewal is
-- refused rather than keep a lease nobody holds. (0 over HTTP: the expiry.)
CREATE FUNCTION fencegate_renew_lease(
    p_resource text, p_owner text, p_fence bigint, p_ttl double precision,
    p_margin double precision
) RETURNS SETOF fencegate_leases
LANGUAGE sql VOLATILE AS $$
    UPDATE fencegate_leases
       SET expires_at = clock_timestamp() + make_interval(secs => p_ttl)
     WHERE resource = p_resource AND owner = p_owner AND fence = p_fence
       AND expires_at - make_interval(secs => p_margin) > clock_timestamp()
    RETURNING *
$$;

-- Ends the lease at once; the fence stays, so the next claim issues a higher one.
CREATE FUNCTION fencegate_release_lease(p_resource text, p_owner text, p_fence bigint)
RETURNS SETOF fencegate_leases
LANGUAGE sql VOLATILE AS $$
    UPDATE fencegate_leases
       SET expires_at = clock_timestamp()
     WHERE resource = p_resource AND owner = p_owner AND fence = p_fence
       AND expires_at > clock_timestamp()
    RETURNING *
$$;

-- Batches: what one process asked for in the same turn of its event loop, in
-- one statement and one commit (group commit). Each answers one row per
-- entry that won, by its position (ord, from 1). Lease rows are locked in
-- the order of their resource, so two batches cannot deadlock.
CREATE FUNCTION fencegate_claim_leases(
    p_resource text[], p_owner text[], p_ttl double precision[], p_same_owner boolean
) RETURNS TABLE (ord integer, resource text, owner text, fence bigint,
                 expires_at timestamptz)
LANGUAGE plpgsql AS $$
DECLARE
    i integer;
BEGIN
    FOR i IN SELECT t.i FROM unnest(p_resource) WITH ORDINALITY AS t(r, i) ORDER BY t.r, t.i
    LOOP
        RETURN QUERY SELECT i, c.resource, c.owner, c.fence, c.expires_at
                       FROM fencegate_claim_lease_unless_abandoned(
                                p_resource[i], p_owner[i], p_ttl[i], p_same_owner) AS c;
    END LOOP;
END
$$;

-- A batch of renewals never waits on a row lock: a lease row another
-- transaction holds locked (an admission, a claim, an operator) is skipped
-- and answered `locked`, and the client renews that one alone, so one locked
-- row never holds back the renewals of the other leases. (Never waiting, a
-- batch of renewals cannot be part of a deadlock either.)
CREATE FUNCTION fencegate_renew_leases(
    p_resource text[], p_owner text[], p_fence bigint[], p_ttl double precision[],
    p_margin double precision[]
) RETURNS TABLE (ord integer, expires_at timestamptz, locked boolean)
LANGUAGE plpgsql AS $$
DECLARE
    i integer;
BEGIN
    FOR i IN SELECT t.i FROM unnest(p_resource) WITH ORDINALITY AS t(r, i) ORDER BY t.r, t.i
    LOOP
        PERFORM 1 FROM fencegate_leases l
          WHERE l.resource = p_resource[i] AND l.owner = p_owner[i] AND l.fence = p_fence[i]
            FOR NO KEY UPDATE SKIP LOCKED;
        IF NOT FOUND THEN
            IF EXISTS (SELECT 1 FROM fencegate_leases l
                        WHERE l.resource = p_resource[i] AND l.owner = p_owner[i]
                          AND l.fence = p_fence[i]) THEN
                RETURN QUERY SELECT i, NULL::timestamptz, true;
            END IF;
            CONTINUE;  -- not this owner's, or not this fence: refused
        END IF;
        RETURN QUERY SELECT i, r.expires_at, false
                       FROM fencegate_renew_lease(p_resource[i], p_owner[i], p_fence[i],
                                                  p_ttl[i], p_margin[i]) AS r;
    END LOOP;
END
$$;

CREATE FUNCTION fencegate_release_leases(
    p_resource text[], p_owner text[], p_fence bigint[]
) RETURNS TABLE (ord integer, fence bigint)
LANGUAGE plpgsql AS $$
DECLARE
    i integer;
BEGIN
    FOR i IN SELECT t.i FROM unnest(p_resource) WITH ORDINALITY AS t(r, i) ORDER BY t.r, t.i
    LOOP
        RETURN QUERY SELECT i, r.fence
                       FROM fencegate_release_lease(p_resource[i], p_owner[i],
                                                    p_fence[i]) AS r;
    END LOOP;
END
$$;

-- A renewal and a release that wait for their row at most p_lock_wait
-- seconds (lock_timeout, set for this statement's own transaction only):
-- past it the statement is refused with lock_not_available (55P03) and has
-- changed nothing. The lease client keeps only a few connections for
-- renewals and releases; one held for as long as another transaction keeps
-- a row locked (an operator's open transaction) would starve the renewals of
-- every other lease of the process. It tries again on a connection taken
-- anew, so other renewals get their turn in between.
CREATE FUNCTION fencegate_renew_lease_waiting(
    p_resource text, p_owner text, p_fence bigint, p_ttl double precision,
    p_margin double precision, p_lock_wait double precision
) RETURNS SETOF fencegate_leases
LANGUAGE plpgsql AS $$
BEGIN
    PERFORM set_config('lock_timeout',
                       greatest(1, ceil(p_lock_wait * 1000))::bigint || 'ms', true);
    RETURN QUERY SELECT * FROM fencegate_renew_lease(p_resource, p_owner, p_fence, p_ttl,
                                                     p_margin);
END
$$;

CREATE FUNCTION fencegate_release_leases_waiting(
    p_resource text[], p_owner text[], p_fence bigint[], p_lock_wait double precision
) RETURNS TABLE (ord integer, fence bigint)
LANGUAGE plpgsql AS $$
BEGIN
    PERFORM set_config('lock_timeout',
                       greatest(1, ceil(p_lock_wait * 1000))::bigint || 'ms', true);
    RETURN QUERY SELECT * FROM fencegate_release_leases(p_resource, p_owner, p_fence);
END
$$;

-- Abandon the claim of p_owner on p_resource: remember the owner, and end its
-- lease if it holds one; the fence it ended, or NULL. A resource without a
-- lease row is left without one (it was never granted).
CREATE FUNCTION fencegate_abandon_claim(p_resource text, p_owner text)
RETURNS bigint
LANGUAGE plpgsql AS $$
DECLARE
    ended bigint;
BEGIN
    DELETE FROM fencegate_abandoned_owners
     WHERE created_at < clock_timestamp() - interval '1 day';
    INSERT INTO fencegate_abandoned_owners (owner) VALUES (p_owner) ON CONFLICT DO NOTHING;
    PERFORM pg_advisory_xact_lock(hashtextextended(p_resource, 0));
    UPDATE fencegate_leases
       SET expires_at = clock_timestamp()
     WHERE resource = p_resource AND owner = p_owner AND expires_at > clock_timestamp()
    RETURNING fence INTO ended;
    RETURN ended;
END
$$;

-- ---- fenced writes in the caller's own transaction ------------------------------

-- Passes only if `fence` is the current fence of a live lease on `resource`,
-- by the database clock; otherwise raises SQLSTATE FG412 whose message is the
-- reason, so the caller's writes roll back with it. Called inside the caller's
-- own transaction (any driver), it holds the lease row FOR KEY SHARE until
-- that transaction ends: the FOR UPDATE of a claim (fencegate_claim_lease)
-- waits for it, so no newer fence is granted while the transaction is open,
-- and a write it commits can never overlap the next holder. The holder's own
-- renewals and admissions take FOR NO KEY UPDATE, which it does not hold
-- back. (Taken in a savepoint that is rolled back to, the lock goes with it.)
-- A stalled caller cannot keep the resource forever: once its lease has
-- expired, a claim held back 250 ms ends its session (fencegate_end_fenced,
-- found by the advisory lock taken here) and the transaction rolls back.
CREATE FUNCTION fencegate_check_fence(resource text, fence bigint) RETURNS void
LANGUAGE plpgsql AS $$
DECLARE
    l fencegate_leases%ROWTYPE;
    left_ms bigint;
BEGIN
    IF current_setting('transaction_isolation') = 'read committed' THEN
        SELECT * INTO l FROM fencegate_leases
         WHERE fencegate_leases.resource = fencegate_check_fence.resource
           FOR KEY SHARE;
    ELSE
        -- REPEATABLE READ, SERIALIZABLE: the snapshot's row may be an older
        -- version than the newest. A renewal's or an admission's update does
        -- not stop a KEY SHARE lock; a claim's (FOR UPDATE) and a purge's
        -- DELETE do, with a serialization failure: that is a fence no longer
        -- current, refused as every other one is.
        BEGIN
            SELECT * INTO l FROM fencegate_leases
             WHERE fencegate_leases.resource = fencegate_check_fence.resource
               FOR KEY SHARE;
        EXCEPTION WHEN serialization_failure THEN
            RAISE EXCEPTION USING ERRCODE = 'FG412', MESSAGE = 'stale_fence',
                  DETAIL = format('%s was claimed again (or purged) after this '
                                  'transaction''s snapshot', fencegate_check_fence.resource);
        END;
    END IF;
    IF NOT FOUND THEN
        RAISE EXCEPTION USING ERRCODE = 'FG412', MESSAGE = 'no_lease';
    ELSIF fencegate_check_fence.fence IS NULL
          OR fencegate_check_fence.fence > l.fence THEN
        RAISE EXCEPTION USING ERRCODE = 'FG412', MESSAGE = 'invalid_fence';
    ELSIF fencegate_check_fence.fence < l.fence THEN
        RAISE EXCEPTION USING ERRCODE = 'FG412', MESSAGE = 'stale_fence',
              DETAIL = format('the current fence of %s is %s', l.resource, l.fence);
    END IF;
    left_ms := ceil(extract(epoch FROM l.expires_at - clock_timestamp()) * 1000);
    IF left_ms <= 0 THEN
        RAISE EXCEPTION USING ERRCODE = 'FG412', MESSAGE = 'lease_expired';
    END IF;
    -- found by a claim of the lease once expired, should this transaction
    -- still be open then (fencegate_end_fenced)
    PERFORM pg_advisory_xact_lock_shared(hashtextextended(fencegate_check_fence.resource, 412));
END
$$;

-- ---- effects: the gateway's ledger ---------------------------------------------

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
    -- the nonce of the current attempt while it is counted in its lease row's
    -- inflight (NULL once its end is recorded)
    attempt          bigint,
    -- false once the key's only attempt is known never to have left this host
    -- whole (its tail was dropped before it reached the kernel; true again
    -- when the key is admitted for another attempt): only then is
    -- "not sent" safe as soon as the attempt is over. A whole request may sit
    -- unread in the provider host's receive queue, where no reset recalls it.
    request_whole    boolean     NOT NULL DEFAULT true,
    -- the request as sent, in brief, for an operator who must check with the
    -- provider (gateway/effects/summary.py): addresses, subject, attachment
    -- names and sizes, or method, path and header names; never a body or a
    -- header's value, every caller's string through leases.redact. Bounded by
    -- its builder (20 entries a list, 200 characters a string). Written by
    -- the admission that inserts the row only; NULL for a row admitted
    -- without one.
    request_summary  jsonb,
    UNIQUE (client, idempotency_key),
    CONSTRAINT finished_has_response
        CHECK (state NOT IN ('succeeded', 'failed') OR response_status IS NOT NULL)
);

CREATE INDEX fencegate_effects_purge ON fencegate_effects (updated_at)
    WHERE state IN ('succeeded', 'failed');
CREATE INDEX fencegate_effects_open ON fencegate_effects (deadline)
    WHERE state = 'in_flight';

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
-- p_request_summary: the request in brief, stored only when this call
-- inserts the effect (a repeat of the key keeps the first one's).
CREATE FUNCTION fencegate_admit_effect(
    p_client text, p_key text, p_fingerprint bytea, p_resource text,
    p_fence bigint, p_provider text, p_attempt bigint,
    p_deadline_seconds double precision, p_retry_window_seconds double precision,
    p_resend_margin_seconds double precision, p_request_summary jsonb DEFAULT NULL
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
                                             attempt, created_at, updated_at,
                                             request_summary)
        VALUES (p_client, p_key, p_fingerprint, p_resource, p_fence, p_provider,
                'in_flight', deadline_,
                CASE WHEN p_retry_window_seconds > 0
                     THEN now_ + make_interval(secs => p_retry_window_seconds) END,
                p_attempt, now_, now_, p_request_summary)
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
               updated_at = now_,
               -- this attempt sends the request again: it may leave whole,
               -- whatever an earlier attempt's end said of that one
               request_whole = true
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

-- The end of one attempt, found by its nonce; p_state is what the attempt
-- came to (gateway.wire.AttemptEnd). Answers what it made of it
-- (gateway.wire.Finished):
--   succeeded, failed  as given: the provider's answer is stored
--   free      the provider certainly did not act: the key is free again
--   unknown   the outcome is unknown (or, for a free, a resend was made: the
--             first attempt may have landed, so the key is not free)
--   gone      nothing matched: already ended (a retry of this call), or
--             replaced by a later attempt, or (for a free) never admitted:
--             then the nonce is remembered as abandoned, so an admission
--             arriving later still is refused
-- Only a definite end releases the attempt's place in the drain barrier; an
-- unknown one may still be landing and holds it until its deadline. The lease
-- row is locked first, in the same order as admission, so the two cannot
-- deadlock.
-- (fencegate_finish_effect and fencegate_finish_effects call it, and choose
-- how their commit is made.)
CREATE FUNCTION fencegate_end_attempt(
    p_client text, p_key text, p_attempt bigint, p_resource text, p_state text,
    p_status integer, p_headers jsonb, p_body bytea, p_summary text,
    p_never_whole boolean
) RETURNS text
LANGUAGE plpgsql AS $$
DECLARE
    r_resource text;
    r_fence bigint;
    answer text;
BEGIN
    PERFORM 1 FROM fencegate_leases WHERE resource = p_resource FOR NO KEY UPDATE;
    IF p_state = 'unknown' THEN
        UPDATE fencegate_effects
           SET state = 'unknown', summary = p_summary, updated_at = clock_timestamp(),
               request_whole = request_whole AND NOT (p_never_whole AND attempts = 1)
         WHERE client = p_client AND idempotency_key = p_key AND attempt = p_attempt
           AND state = 'in_flight';
        RETURN CASE WHEN FOUND THEN 'unknown' ELSE 'gone' END;
    ELSIF p_state = 'free' THEN
        DELETE FROM fencegate_effects
         WHERE client = p_client AND idempotency_key = p_key AND attempt = p_attempt
           AND attempts = 1
        RETURNING resource, fence INTO r_resource, r_fence;
        answer := 'free';
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
        answer := p_state;
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

-- One attempt's end, as one statement. Only a free commits as durably as the
-- admission did (the session's synchronous_commit): it is awaited before its
-- answer ("the key is free again"), and lost in a crash it would bring back
-- an in-flight row, then unknown, for a key its caller was told is free.
-- Every other end is written behind its answer and need not wait for the WAL
-- flush: lost in a crash, it leaves the in-flight row its admission
-- committed, which reads unknown after its deadline and is never sent again,
-- as when the gateway dies before writing it. A later durable commit that
-- acted on it (a claim the end let through the drain barrier) flushes it too:
-- the WAL is one sequence.
CREATE FUNCTION fencegate_finish_effect(
    p_client text, p_key text, p_attempt bigint, p_resource text, p_state text,
    p_status integer, p_headers jsonb, p_body bytea, p_summary text,
    p_never_whole boolean DEFAULT false
) RETURNS text
LANGUAGE plpgsql AS $$
BEGIN
    IF p_state <> 'free' THEN
        PERFORM set_config('synchronous_commit', 'off', true);
    END IF;
    RETURN fencegate_end_attempt(p_client, p_key, p_attempt, p_resource, p_state, p_status,
                                 p_headers, p_body, p_summary, p_never_whole);
END
$$;

-- The extension of an attempt whose outcome is unknown, so that it may be
-- sent again, with the same provider key, inside the provider's window
-- (gateway/effects/resend.py). Answers:
--   extended        the attempt's deadline, and its lease's drain barrier,
--                   now reach p_deadline_seconds from now: send again
--   stale_fence     a newer fence was granted (the barrier had lapsed)
--   lease_expired   the lease expired or was released
--   no_lease        no lease row (never: an admitted attempt had one)
--   not_in_flight   the effect is no longer in flight under this attempt's
--                   nonce (resolved, or taken over by a repeat of the key)
--   outside_window  the new attempt, p_resend_margin_seconds included, could
--                   land past the provider's window counted from the first
--                   admission (the rule of fencegate_admit_effect)
-- Anything but `extended` changes nothing: the gateway records the attempt
-- unknown, and it stays counted in the barrier until its old deadline. The lease row is locked first, as
-- admission and claims take it, so no claim slips between this check and
-- the barrier's extension; the attempt stays counted in `inflight` (it was
-- never finished), so a claim after this waits for the new deadline.
CREATE FUNCTION fencegate_extend_effect(
    p_client text, p_key text, p_attempt bigint, p_resource text, p_fence bigint,
    p_deadline_seconds double precision, p_resend_margin_seconds double precision
) RETURNS text
LANGUAGE plpgsql AS $$
DECLARE
    l fencegate_leases%ROWTYPE;
    e fencegate_effects%ROWTYPE;
    now_ timestamptz;
    deadline_ timestamptz;
BEGIN
    SELECT * INTO l FROM fencegate_leases WHERE resource = p_resource FOR NO KEY UPDATE;
    IF NOT FOUND THEN
        RETURN 'no_lease';
    END IF;
    now_ := clock_timestamp();  -- read after the lock was granted
    IF l.fence <> p_fence THEN
        RETURN 'stale_fence';
    ELSIF l.expires_at <= now_ THEN
        RETURN 'lease_expired';
    END IF;
    SELECT * INTO e FROM fencegate_effects
     WHERE client = p_client AND idempotency_key = p_key AND attempt = p_attempt
       AND state = 'in_flight' AND fence = p_fence
       FOR UPDATE;
    IF NOT FOUND THEN
        RETURN 'not_in_flight';
    END IF;
    deadline_ := now_ + make_interval(secs => p_deadline_seconds);
    IF e.retry_until IS NULL
       OR deadline_ + make_interval(secs => p_resend_margin_seconds) > e.retry_until THEN
        RETURN 'outside_window';
    END IF;
    UPDATE fencegate_effects
       SET deadline = greatest(deadline, deadline_), attempts = attempts + 1,
           updated_at = now_
     WHERE id = e.id;
    UPDATE fencegate_leases SET drain_until = greatest(drain_until, deadline_)
     WHERE resource = p_resource;
    RETURN 'extended';
END
$$;

-- Admissions and attempt ends in batches. A lease row another transaction
-- holds is skipped, not waited for: its entries answer 'busy', and the
-- gateway sends them alone, so one slow or locked resource never holds the
-- rest of a batch. Otherwise each entry is answered as the single call
-- answers it: the common batches (new keys; successes and failures) by a few
-- set-based statements, any other by a loop of single calls.
-- The lock order, everywhere: lease rows before effect rows (keys), and no
-- statement waits for a lease row while it holds a key; lease rows, where a
-- statement waits for several (claims, renewals, releases), in the order of
-- their resource; keys in the order of (client, key). A batch never waits for
-- a lease row, so it takes its entries in key order: it may wait for a key
-- another statement holds (the same key under another resource, a purge),
-- but two batches never wait for each other's keys, so they cannot deadlock.
CREATE FUNCTION fencegate_admit_effects(
    p_client text[], p_key text[], p_fingerprint bytea[], p_resource text[],
    p_fence bigint[], p_provider text[], p_attempt bigint[],
    p_deadline_seconds double precision[], p_retry_window_seconds double precision[],
    p_resend_margin_seconds double precision, p_request_summary jsonb[] DEFAULT NULL
) RETURNS TABLE (
    ord integer, verdict text, current_fence bigint, effect_id bigint,
    retry_after double precision, response_status integer, response_headers jsonb,
    response_body bytea
)
LANGUAGE plpgsql AS $$
DECLARE
    i integer;
    now_ timestamptz;
    locked text[];
    busy text[];
    pre text[];      -- each entry's refusal before its key is looked at, or NULL
    fences bigint[];
    ids bigint[];
BEGIN
    -- The common batch, keys of their own and not yet in the ledger: the same
    -- work in a few statements for the whole batch rather than eight an entry
    -- (bench/NOTES.md). Its keys are inserted in key order, as the loop below
    -- takes them. Should one be there already (a repeat), the inserts are
    -- undone (the subtransaction: their key locks go with them) and the whole
    -- batch takes the loop; the lease rows it locked stay locked, as the
    -- loop would lock them.
    IF (SELECT count(DISTINCT (c, k)) FROM unnest(p_client, p_key) AS t(c, k))
       = cardinality(p_client) THEN
        SELECT coalesce(array_agg(resource), '{}') INTO locked FROM (
            SELECT resource FROM fencegate_leases WHERE resource = ANY (p_resource)
             ORDER BY resource FOR NO KEY UPDATE SKIP LOCKED) AS l;
        SELECT coalesce(array_agg(resource), '{}') INTO busy FROM fencegate_leases
         WHERE resource = ANY (p_resource) AND NOT resource = ANY (locked);
        now_ := clock_timestamp();  -- read after the locks were granted
        -- fencegate_admit_effect's refusals, in its order
        SELECT array_agg(CASE
                   WHEN t.r = ANY (busy) THEN 'busy'
                   WHEN l.resource IS NULL THEN 'no_lease'
                   WHEN EXISTS (SELECT 1 FROM fencegate_abandoned_attempts x
                                 WHERE x.attempt = t.a) THEN 'abandoned'
                   WHEN t.f < l.fence THEN 'stale_fence'
                   WHEN t.f > l.fence THEN 'invalid_fence'
                   WHEN l.expires_at <= now_ THEN 'lease_expired'
               END ORDER BY t.i),
               array_agg(l.fence ORDER BY t.i)
          INTO pre, fences
          FROM unnest(p_resource, p_fence, p_attempt) WITH ORDINALITY AS t(r, f, a, i)
          LEFT JOIN fencegate_leases l ON l.resource = t.r AND t.r = ANY (locked);
        BEGIN
            WITH t AS (
                SELECT * FROM unnest(p_client, p_key, p_fingerprint, p_resource, p_fence,
                                     p_provider, p_attempt, p_deadline_seconds,
                                     p_retry_window_seconds)
                       WITH ORDINALITY AS t(c, k, fp, r, f, p, a, d, w, i)
            ), ins AS (
                INSERT INTO fencegate_effects AS fx (client, idempotency_key, fingerprint,
                                                     resource, fence, provider, state,
                                                     deadline, retry_until, attempt,
                                                     created_at, updated_at, request_summary)
                SELECT t.c, t.k, t.fp, t.r, t.f, t.p, 'in_flight',
                       now_ + make_interval(secs => t.d),
                       CASE WHEN t.w > 0 THEN now_ + make_interval(secs => t.w) END,
                       t.a, now_, now_, p_request_summary[t.i::integer]
                  FROM t
                 WHERE pre[t.i::integer] IS NULL
                 ORDER BY t.c COLLATE "C", t.k COLLATE "C"
                ON CONFLICT (client, idempotency_key) DO NOTHING
                RETURNING fx.client, fx.idempotency_key, fx.id
            )
            SELECT array_agg(ins.id ORDER BY t.i) INTO ids
              FROM t LEFT JOIN ins ON ins.client = t.c AND ins.idempotency_key = t.k;
            IF EXISTS (SELECT 1 FROM generate_subscripts(pre, 1) AS s(n)
                        WHERE pre[n] IS NULL AND ids[n] IS NULL) THEN
                RAISE EXCEPTION USING ERRCODE = 'FGKEY';  -- a key was there: the loop
            END IF;
            UPDATE fencegate_leases l
               SET inflight = l.inflight + d.n,
                   drain_until = greatest(l.drain_until, d.until)
              FROM (SELECT t.r, count(*)::integer AS n,
                           max(now_ + make_interval(secs => t.d)) AS until
                      FROM unnest(p_resource, p_deadline_seconds) WITH ORDINALITY AS t(r, d, i)
                     WHERE ids[t.i::integer] IS NOT NULL
                     GROUP BY t.r) AS d
             WHERE l.resource = d.r;
            RETURN QUERY
            SELECT t.i::integer, coalesce(pre[t.i::integer], 'admitted'),
                   CASE WHEN pre[t.i::integer] IN ('busy', 'no_lease', 'abandoned') THEN NULL
                        ELSE fences[t.i::integer] END,
                   ids[t.i::integer], NULL::float8, NULL::int, NULL::jsonb, NULL::bytea
              FROM unnest(p_client, p_key) WITH ORDINALITY AS t(c, k, i)
             ORDER BY t.c COLLATE "C", t.k COLLATE "C", t.i;
            RETURN;
        EXCEPTION WHEN SQLSTATE 'FGKEY' THEN
            NULL;
        END;
    END IF;
    FOR i IN SELECT t.i FROM unnest(p_client, p_key) WITH ORDINALITY AS t(c, k, i)
              ORDER BY t.c COLLATE "C", t.k COLLATE "C", t.i
    LOOP
        PERFORM 1 FROM fencegate_leases WHERE resource = p_resource[i]
            FOR NO KEY UPDATE SKIP LOCKED;
        IF NOT FOUND AND EXISTS (SELECT 1 FROM fencegate_leases
                                  WHERE resource = p_resource[i]) THEN
            RETURN QUERY SELECT i, 'busy'::text, NULL::bigint, NULL::bigint, NULL::float8,
                                NULL::int, NULL::jsonb, NULL::bytea;
            CONTINUE;
        END IF;
        RETURN QUERY SELECT i, a.*
                       FROM fencegate_admit_effect(
                           p_client[i], p_key[i], p_fingerprint[i], p_resource[i],
                           p_fence[i], p_provider[i], p_attempt[i], p_deadline_seconds[i],
                           p_retry_window_seconds[i], p_resend_margin_seconds,
                           p_request_summary[i]) AS a;
    END LOOP;
END
$$;

CREATE FUNCTION fencegate_finish_effects(
    p_client text[], p_key text[], p_attempt bigint[], p_resource text[], p_state text[],
    p_status integer[], p_headers jsonb[], p_body bytea[], p_summary text[],
    p_never_whole boolean[] DEFAULT NULL
) RETURNS TABLE (ord integer, done text)
LANGUAGE plpgsql AS $$
DECLARE
    i integer;
    locked text[];
    busy text[];
BEGIN
    -- durable if it holds a free, else no wait for the WAL flush: see
    -- fencegate_finish_effect
    IF NOT 'free' = ANY (p_state) THEN
        PERFORM set_config('synchronous_commit', 'off', true);
    END IF;
    -- The common batch, every entry a success or a failure of its own key:
    -- the same work in four statements for the whole batch rather than five
    -- an entry (bench/NOTES.md), with the same locks in the same order.
    IF p_state <@ ARRAY['succeeded', 'failed']
       AND (SELECT count(DISTINCT (c, k)) FROM unnest(p_client, p_key) AS t(c, k))
           = cardinality(p_client) THEN
        SELECT coalesce(array_agg(resource), '{}') INTO locked FROM (
            SELECT resource FROM fencegate_leases WHERE resource = ANY (p_resource)
             ORDER BY resource FOR NO KEY UPDATE SKIP LOCKED) AS l;
        SELECT coalesce(array_agg(resource), '{}') INTO busy FROM fencegate_leases
         WHERE resource = ANY (p_resource) AND NOT resource = ANY (locked);
        -- the keys, in key order, as the loop below takes them
        PERFORM 1 FROM fencegate_effects f
          JOIN unnest(p_client, p_key, p_attempt, p_resource) AS t(c, k, a, r)
            ON f.client = t.c AND f.idempotency_key = t.k AND f.attempt = t.a
         WHERE t.r IS NULL OR NOT t.r = ANY (busy)  -- a NULL one is no busy one
         ORDER BY t.c COLLATE "C", t.k COLLATE "C"
           FOR NO KEY UPDATE OF f;
        RETURN QUERY
        WITH t AS (
            SELECT * FROM unnest(p_client, p_key, p_attempt, p_resource, p_state, p_status,
                                 p_headers, p_body, p_summary)
                   WITH ORDINALITY AS t(c, k, a, r, s, st, h, b, sm, i)
        ), ended AS (
            UPDATE fencegate_effects f
               SET state = t.s, response_status = t.st, response_headers = t.h,
                   response_body = t.b, summary = t.sm, attempt = NULL,
                   updated_at = clock_timestamp()
              FROM t
             WHERE f.client = t.c AND f.idempotency_key = t.k AND f.attempt = t.a
               AND (t.r IS NULL OR NOT t.r = ANY (busy))
            RETURNING t.i, f.resource, f.fence
        ), released AS (
            -- as many decrements as ends, each only while inflight > 0
            UPDATE fencegate_leases l
               SET inflight = greatest(l.inflight - d.n, 0)
              FROM (SELECT resource, fence, count(*)::integer AS n FROM ended
                     GROUP BY resource, fence) AS d
             WHERE l.resource = d.resource AND l.fence = d.fence AND l.inflight > 0
        )
        SELECT t.i::integer,
               CASE WHEN t.r = ANY (busy) THEN 'busy'
                    WHEN ended.i IS NOT NULL THEN t.s ELSE 'gone' END
          FROM t LEFT JOIN ended ON ended.i = t.i
         ORDER BY t.c COLLATE "C", t.k COLLATE "C", t.i;
        RETURN;
    END IF;
    FOR i IN SELECT t.i FROM unnest(p_client, p_key) WITH ORDINALITY AS t(c, k, i)
              ORDER BY t.c COLLATE "C", t.k COLLATE "C", t.i
    LOOP
        PERFORM 1 FROM fencegate_leases WHERE resource = p_resource[i]
            FOR NO KEY UPDATE SKIP LOCKED;
        IF NOT FOUND AND EXISTS (SELECT 1 FROM fencegate_leases
                                  WHERE resource = p_resource[i]) THEN
            RETURN QUERY SELECT i, 'busy'::text;
            CONTINUE;
        END IF;
        RETURN QUERY SELECT i, fencegate_end_attempt(
            p_client[i], p_key[i], p_attempt[i], p_resource[i], p_state[i], p_status[i],
            p_headers[i], p_body[i], p_summary[i], coalesce(p_never_whole[i], false));
    END LOOP;
END
$$;

-- Effects whose outcome is unknown: what an operator must resolve. Partial, so it holds only those; `state` is already in the other
-- partial indexes' predicates, so this costs no HOT update on the effect path.
CREATE INDEX fencegate_effects_unknown ON fencegate_effects (updated_at)
    WHERE state = 'unknown';

-- What operators are shown of an effect, in one place (effects.sql's
-- show, list, search and console statements): an attempt in flight past its
-- deadline reads `unknown` (its gateway died, or its end was never
-- recorded); and how long until it may be resolved, `grace` seconds after
-- its deadline (NULL once it is neither in flight nor unknown).
CREATE FUNCTION fencegate_shown_state(p_state text, p_deadline timestamptz) RETURNS text
LANGUAGE sql VOLATILE AS $$
    SELECT CASE WHEN p_state = 'in_flight' AND p_deadline <= clock_timestamp()
                THEN 'unknown' ELSE p_state END
$$;

CREATE FUNCTION fencegate_resolvable_in(p_state text, p_deadline timestamptz,
                                        p_grace double precision)
RETURNS double precision
LANGUAGE sql VOLATILE AS $$
    SELECT CASE WHEN p_state IN ('in_flight', 'unknown')
                THEN greatest(0, extract(epoch FROM p_deadline + make_interval(secs => p_grace)
                                                     - clock_timestamp()))::float8
           END
$$;

-- ---- rejections: what the console shows of zombies ---------------------------

-- Every effect refused at the fence check, as the gateway saw it: when, which
-- client, provider and reason, on which resource, under which fence (the
-- zombie's) and what the current one was. Written in batches by each gateway,
-- at most once a second, and purged after a retention (7 days by default) by
-- each gateway (gateway/effects/rejections.py): the console shows the last hours.
CREATE TABLE fencegate_rejections (
    id              bigint      GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    at              timestamptz NOT NULL DEFAULT clock_timestamp(),
    client          text        NOT NULL,
    provider        text        NOT NULL,
    reason          text        NOT NULL
                    CHECK (reason IN ('stale_fence', 'lease_expired', 'no_lease',
                                      'invalid_fence')),
    resource        text        NOT NULL,
    fence           bigint      NOT NULL,
    current_fence   bigint,
    idempotency_key text        NOT NULL
);

CREATE INDEX fencegate_rejections_at ON fencegate_rejections (at);

-- ---- jobs: the work queue ------------------------------------------------------

-- The work queue. A claimed job is a lease on `job:<queue>:<id>` in
-- fencegate_leases; `fence` here is the fence of the job's current (or last)
-- claim, so complete and fail can be conditioned on it. States
-- (docs/leases.md): queued (`scheduled` while not yet due), claimed, and the
-- final ones completed, dead (replayable) and cancelled (an operator's final
-- word: never run, never retried, never replayed).
CREATE TABLE fencegate_jobs (
    id            bigint      GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    queue         text        NOT NULL CHECK (queue ~ '^[A-Za-z0-9._-]{1,100}$'),
    payload       jsonb       NOT NULL,
    state         text        NOT NULL DEFAULT 'queued'
                  CHECK (state IN ('queued', 'claimed', 'completed', 'dead', 'cancelled')),
    priority      integer     NOT NULL DEFAULT 0,
    run_at        timestamptz NOT NULL DEFAULT clock_timestamp(),
    dedupe_key    text        CHECK (length(dedupe_key) BETWEEN 1 AND 255),
    ordering_key  text        CHECK (length(ordering_key) BETWEEN 1 AND 255),
    attempts      integer     NOT NULL DEFAULT 0 CHECK (attempts >= 0),
    max_attempts  integer     NOT NULL CHECK (max_attempts >= 1),
    fence         bigint,
    claimed_by    text,
    claimed_at    timestamptz,
    finished_at   timestamptz,
    result_ref    text,
    last_error    text,
    created_at    timestamptz NOT NULL DEFAULT clock_timestamp(),
    -- runs put off from inside the handler (snooze): each gave its attempt back
    snoozes       integer     NOT NULL DEFAULT 0 CHECK (snoozes >= 0),
    -- uniqueness for a window (fencegate_unique_slot): the caller's key, the
    -- period in seconds (NULL: while the job is not finished), and the slot
    -- the unique index holds
    unique_key    text        CHECK (length(unique_key) BETWEEN 1 AND 255),
    unique_for    double precision CHECK (unique_for > 0),
    unique_slot   text,
    -- the resource of the job's lease in fencegate_leases
    resource      text        NOT NULL
                  GENERATED ALWAYS AS ('job:' || queue || ':' || id::text) STORED,
    CONSTRAINT claimed_has_fence CHECK (state <> 'claimed' OR (fence IS NOT NULL
                                                               AND claimed_by IS NOT NULL)),
    CONSTRAINT finished_at_iff_finished
        CHECK ((state IN ('completed', 'dead', 'cancelled')) = (finished_at IS NOT NULL)),
    CONSTRAINT unique_slot_iff_key CHECK ((unique_key IS NULL) = (unique_slot IS NULL))
);

-- one job per (queue, dedupe_key), whatever its state: enqueue is idempotent
CREATE UNIQUE INDEX fencegate_jobs_dedupe ON fencegate_jobs (queue, dedupe_key)
    WHERE dedupe_key IS NOT NULL;
-- one job per (queue, unique slot) among the jobs that hold it: for a period,
-- every job of the slot but a cancelled one; while not finished, the queued,
-- claimed and dead ones (a dead job awaits its replay). No change of state
-- ever enters this set (replay goes dead -> queued, both in it); leaving it
-- (completed, cancelled) frees the key. So only an insert can collide, and
-- the insert's ON CONFLICT takes that as "already there".
CREATE UNIQUE INDEX fencegate_jobs_unique ON fencegate_jobs (queue, unique_slot)
    WHERE unique_slot IS NOT NULL AND state <> 'cancelled'
      AND (unique_for IS NOT NULL OR state <> 'completed');
-- what claimers scan
CREATE INDEX fencegate_jobs_runnable ON fencegate_jobs (queue, priority DESC, run_at, id)
    WHERE state = 'queued';
-- the head of each ordering key
CREATE INDEX fencegate_jobs_ordering ON fencegate_jobs (queue, ordering_key, id)
    WHERE ordering_key IS NOT NULL AND state IN ('queued', 'claimed');
-- what recovery scans
CREATE INDEX fencegate_jobs_claimed ON fencegate_jobs (queue) WHERE state = 'claimed';
CREATE INDEX fencegate_jobs_dead ON fencegate_jobs (queue, id) WHERE state = 'dead';

-- finished jobs past retention are purged oldest first
CREATE INDEX fencegate_jobs_finished ON fencegate_jobs (finished_at)
    WHERE state IN ('completed', 'dead', 'cancelled');

-- One row per queue that has had a job (fencegate_jobs_notify makes it) or
-- was paused. A claim locks its queue's row FOR SHARE and claims only while
-- paused_at is NULL; pausing updates the row, so it waits for the claims in
-- flight to commit, and a claim that waited for the pause reads the newest
-- row (READ COMMITTED rechecks a locked row): once a pause has committed, no
-- claim of that queue commits. Claims also take a shared advisory lock on the
-- queue (its name hashed with seed 413) and a pause an exclusive one, first:
-- the claims that start while a pause waits queue behind it (a row's share
-- locks would let them in beside the ones it waits for, and a stream of
-- overlapping claims would hold the pause off).
CREATE TABLE fencegate_queues (
    queue       text        PRIMARY KEY CHECK (queue ~ '^[A-Za-z0-9._-]{1,100}$'),
    paused_at   timestamptz,
    created_at  timestamptz NOT NULL DEFAULT clock_timestamp()
);

-- The unique slot of a job enqueued now with key p_key for p_for seconds:
-- the key and the period's window, aligned on the epoch by the database
-- clock (as River's ByPeriod), or for p_for NULL the key alone (held while
-- the job is not finished). NULL without a key.
CREATE FUNCTION fencegate_unique_slot(p_key text, p_for double precision) RETURNS text
LANGUAGE sql VOLATILE AS $$
    SELECT CASE WHEN p_key IS NULL THEN NULL
                WHEN p_for IS NULL THEN 'u:' || p_key
                ELSE 'p:' || p_for::text || ':'
                     || floor(extract(epoch FROM clock_timestamp()) / p_for)::bigint::text
                     || ':' || p_key END
$$;

-- The locks of a batch of completions (fencegate_complete_jobs), in the one
-- order: job rows by id, then their lease rows by resource. Generic plans,
-- kept: for each call's array PostgreSQL would plan these anew (its custom
-- plan for a few ids beats its generic estimate), and planning them cost
-- three times what running them did (bench/NOTES.md). Neither joins, so
-- no plan of theirs grows with the ids or the claimed jobs. Both functions
-- look rows up by key only (enable_seqscan off): a plan made while the
-- tables were small, kept on a pooled connection, or statistics that
-- undercount the claimed jobs, would otherwise read every claimed job and
-- its lease per completion (135 ms for 8 ids at 60,000 claimed jobs).
CREATE FUNCTION fencegate_lock_completions(p_id bigint[]) RETURNS void
LANGUAGE plpgsql SET plan_cache_mode = force_generic_plan SET enable_seqscan = off AS $$
BEGIN
    PERFORM 1 FROM fencegate_jobs j WHERE j.id = ANY(p_id) ORDER BY j.id FOR UPDATE;
    PERFORM 1 FROM fencegate_leases l
      WHERE l.resource = ANY(ARRAY(SELECT j.resource FROM fencegate_jobs j
                                    WHERE j.id = ANY(p_id)))
      ORDER BY l.resource
        FOR NO KEY UPDATE;
END
$$;

-- Complete a batch of jobs ($1 ids, $2 fences, $3 result refs), each only
-- while its fence is current and its lease live (a lapsed lease's fence
-- records nothing, as at the gateway), ending each one's lease: the ids that
-- counted.
-- One lock order everywhere: job rows before lease rows, job rows by id and
-- lease rows by resource (as every batch of lease statements locks them), so
-- a completion never deadlocks with another completion (a zombie's and the
-- new holder's), a recovery, or a batch on the same leases.
-- One job (a worker's at concurrency 1, complete_job) runs statements by key
-- with scalar parameters, whose plans are kept for the session whatever the
-- statistics: the set-based UPDATE over arrays of one was planned anew on
-- every call, 150 us of a job's 0.7 ms (bench/NOTES.md, seventh round). A
-- batch of several runs the set-based UPDATE, whose planning its jobs share.
-- For an id given twice, the entry whose fence is current counts, once.
CREATE FUNCTION fencegate_complete_jobs(p_id bigint[], p_fence bigint[], p_ref text[])
RETURNS SETOF bigint
LANGUAGE plpgsql SET enable_seqscan = off AS $$
DECLARE
    v_id bigint;
    v_fence bigint;
    v_ref text;
    v_resource text;
    v_entries jsonb;
    v_refs text[];
BEGIN
    PERFORM fencegate_lock_completions(p_id);
    IF cardinality(p_id) = 1 THEN
        -- its rows are locked (above): nothing changes them between statements.
        -- unnest, as below: an array of any bounds or dimensions (from SQL)
        SELECT t.id, t.fence, t.ref INTO v_id, v_fence, v_ref
          FROM unnest(p_id, p_fence, p_ref) AS t(id, fence, ref) LIMIT 1;
        UPDATE fencegate_jobs j
           SET state = 'completed', finished_at = clock_timestamp(), result_ref = v_ref
         WHERE j.id = v_id AND j.fence = v_fence
           AND j.state = (SELECT 'claimed'::text)  -- as below
           AND EXISTS (SELECT 1 FROM fencegate_leases l
                        WHERE l.resource = j.resource AND l.fence = v_fence
                          AND l.expires_at > clock_timestamp())
        RETURNING j.resource INTO v_resource;
        IF FOUND THEN
            UPDATE fencegate_leases l SET expires_at = clock_timestamp()
             WHERE l.resource = v_resource AND l.fence = v_fence
               AND l.expires_at > clock_timestamp();
            RETURN NEXT v_id;
        END IF;
        RETURN;
    END IF;
    -- nothing joined: the jobs found by id, each entry's place looked up by
    -- its job's id:fence in a jsonb object (no key for a stale entry) and its
    -- result read from the refs at that place (a jsonb object holds 256 MB at
    -- most; the refs, up to 1 MiB each, stay in an array), each lease by key
    -- in a subquery (run per job) and those to end by = ANY (their rows locked
    -- above, each one's fence that of its job in done). Joined, the leases
    -- were read whole under statistics of one lease row, and the entries were
    -- scanned once per job (a nested loop: 0.5 million comparisons for 1,000).
    SELECT jsonb_object_agg(t.id::text || ':' || t.fence::text, t.n)
             FILTER (WHERE t.id IS NOT NULL AND t.fence IS NOT NULL),
           array_agg(t.ref ORDER BY t.n)
      INTO v_entries, v_refs
      FROM unnest(p_id, p_fence, p_ref) WITH ORDINALITY AS t(id, fence, ref, n);
    RETURN QUERY
    WITH done AS (
        UPDATE fencegate_jobs j
           SET state = 'completed', finished_at = clock_timestamp(),
               result_ref = v_refs[(v_entries ->> (j.id::text || ':' || j.fence::text))::int]
         WHERE j.id = ANY(p_id) AND v_entries ? (j.id::text || ':' || j.fence::text)
           -- not the claimed-jobs index: a subquery it cannot prove to be it
           AND j.state = (SELECT 'claimed'::text)
           AND j.fence = (SELECT l.fence FROM fencegate_leases l
                           WHERE l.resource = j.resource
                             AND l.expires_at > clock_timestamp())
        RETURNING j.id, j.resource
    ), ended AS (
        UPDATE fencegate_leases l SET expires_at = clock_timestamp()
         WHERE l.resource = ANY(ARRAY(SELECT done.resource FROM done))
           AND l.expires_at > clock_timestamp()
    )
    SELECT done.id FROM done;
END
$$;

-- ---- the queue inside the caller's transaction ----------------------------------

-- Enqueue one job in the caller's transaction (the outbox: the business row
-- and its job commit together, or neither); the job's id, or for a dedupe
-- key seen before the first job's id; for a unique key whose slot is held
-- (fencegate_jobs_unique) the holder's id. max_attempts NULL: the default of
-- leases.RetryPolicy (5).
CREATE FUNCTION fencegate_enqueue_job(
    queue text, payload jsonb, dedupe_key text DEFAULT NULL,
    ordering_key text DEFAULT NULL, run_at timestamptz DEFAULT NULL,
    max_attempts int DEFAULT NULL, priority int DEFAULT 0,
    unique_key text DEFAULT NULL, unique_for double precision DEFAULT NULL
) RETURNS bigint
LANGUAGE plpgsql AS $$
#variable_conflict use_column
DECLARE
    made bigint;
    slot text;
BEGIN
    -- as enqueue checks them (leases/enqueue.py): a window fits a bigint
    -- count of windows since the epoch at 0.001 s and more
    IF $9 IS NOT NULL AND $8 IS NULL THEN
        RAISE EXCEPTION USING ERRCODE = '22023', MESSAGE = 'unique_for needs a unique_key';
    END IF;
    IF NOT ($9 >= 0.001 AND $9 < 'Infinity') THEN
        RAISE EXCEPTION USING ERRCODE = '22023',
            MESSAGE = 'unique_for must be a finite number of seconds, at least 0.001';
    END IF;
    LOOP
        slot := fencegate_unique_slot($8, $9);
        INSERT INTO fencegate_jobs AS j (queue, payload, dedupe_key, ordering_key, run_at,
                                         max_attempts, priority, unique_key, unique_for,
                                         unique_slot)
        VALUES ($1, $2, $3, $4, coalesce($5, clock_timestamp()), coalesce($6, 5),
                coalesce($7, 0), $8, $9, slot)
        ON CONFLICT DO NOTHING  -- the dedupe key's index or the unique slot's
        RETURNING j.id INTO made;
        IF made IS NOT NULL THEN
            RETURN made;
        END IF;
        SELECT j.id INTO made FROM fencegate_jobs j
         WHERE j.queue = $1 AND j.dedupe_key = $3;
        IF made IS NULL THEN
            SELECT j.id INTO made FROM fencegate_jobs j
             WHERE j.queue = $1 AND j.unique_slot = slot AND j.state <> 'cancelled'
               AND (j.unique_for IS NOT NULL OR j.state <> 'completed');
        END IF;
        IF made IS NOT NULL OR ($3 IS NULL AND $8 IS NULL) THEN
            RETURN made;
        END IF;
        -- purged, or its holder finished, between the insert and the look:
        -- insert again
    END LOOP;
END
$$;

-- Complete a claimed job in the caller's transaction, so the handler's writes
-- and the completion commit together: true, or SQLSTATE FG412 with the reason
-- (stale_fence: a newer claim holds the job; lease_expired: its lease lapsed,
-- or the job is finished already, a repeat of a completion that committed
-- included, whose writes must not commit twice; no_lease: no such job in this
-- queue; invalid_fence: a fence the job never had), so a zombie handler's
-- writes roll back with it. The job row is locked before the lease row, the
-- one order (fencegate_complete_jobs).
CREATE FUNCTION fencegate_complete_job(
    queue text, job_id bigint, fence bigint, result_ref text DEFAULT NULL
) RETURNS boolean
LANGUAGE plpgsql AS $$
#variable_conflict use_column
DECLARE
    j fencegate_jobs%ROWTYPE;
    current_fence bigint;
BEGIN
    SELECT * INTO j FROM fencegate_jobs t WHERE t.id = $2 AND t.queue = $1 FOR UPDATE;
    IF NOT FOUND THEN
        RAISE EXCEPTION USING ERRCODE = 'FG412', MESSAGE = 'no_lease',
              DETAIL = format('queue %s has no job %s', $1, $2);
    END IF;
    IF EXISTS (SELECT 1 FROM fencegate_complete_jobs(ARRAY[$2], ARRAY[$3], ARRAY[$4])) THEN
        RETURN true;
    END IF;
    SELECT l.fence INTO current_fence FROM fencegate_leases l WHERE l.resource = j.resource;
    current_fence := greatest(current_fence, j.fence);
    IF $3 IS NULL OR current_fence IS NULL OR $3 > current_fence THEN
        RAISE EXCEPTION USING ERRCODE = 'FG412', MESSAGE = 'invalid_fence';
    ELSIF $3 < current_fence THEN
        RAISE EXCEPTION USING ERRCODE = 'FG412', MESSAGE = 'stale_fence',
              DETAIL = format('job %s is claimed under fence %s', $2, current_fence);
    END IF;
    RAISE EXCEPTION USING ERRCODE = 'FG412', MESSAGE = 'lease_expired',
          DETAIL = format('job %s is %s', $2, j.state);
END
$$;

-- Cancel jobs of queue p_queue (p_id): a queued or scheduled one never runs,
-- a claimed one's lease ends at once (its fence is refused at the gateway,
-- its renewal and its completion are refused, so its holder enters
-- lost-ownership mode), and each stays `cancelled`. Answers each job
-- cancelled and what it was (queued, scheduled, claimed); a job finished
-- already is left as it is. Job rows are locked before lease rows, in the
-- one order (fencegate_complete_jobs): a completion in flight either commits
-- first (the job is then completed, not cancelled) or is refused. Workers
-- LISTEN on fencegate_jobs_cancelled (the job's resource) to notice at once.
CREATE FUNCTION fencegate_cancel_jobs(p_queue text, p_id bigint[])
RETURNS TABLE (job_id bigint, was text)
LANGUAGE plpgsql AS $$
BEGIN
    PERFORM 1 FROM fencegate_jobs j WHERE j.queue = p_queue AND j.id = ANY(p_id)
      ORDER BY j.id FOR UPDATE;
    PERFORM 1 FROM fencegate_leases l
      WHERE l.resource IN (SELECT j.resource FROM fencegate_jobs j
                            WHERE j.queue = p_queue AND j.id = ANY(p_id)
                              AND j.state = 'claimed')
      ORDER BY l.resource
        FOR NO KEY UPDATE;
    RETURN QUERY
    WITH open AS (
        SELECT j.id, j.resource, j.fence,
               CASE WHEN j.state = 'queued' AND j.run_at > clock_timestamp()
                    THEN 'scheduled' ELSE j.state END AS was
          FROM fencegate_jobs j
         WHERE j.queue = p_queue AND j.id = ANY(p_id) AND j.state IN ('queued', 'claimed')
    ), gone AS (
        UPDATE fencegate_jobs j SET state = 'cancelled', finished_at = clock_timestamp()
          FROM open
         WHERE j.id = open.id
        RETURNING j.id, open.resource, open.fence, open.was
    ), ended AS (
        UPDATE fencegate_leases l SET expires_at = clock_timestamp()
          FROM gone
         WHERE gone.was = 'claimed' AND l.resource = gone.resource
           AND l.fence = gone.fence AND l.expires_at > clock_timestamp()
    )
    SELECT gone.id, gone.was FROM gone ORDER BY gone.id;
    PERFORM pg_notify('fencegate_jobs_cancelled', j.resource)
       FROM fencegate_jobs j
      WHERE j.queue = p_queue AND j.id = ANY(p_id) AND j.state = 'cancelled'
        AND j.fence IS NOT NULL;
END
$$;

-- Wake idle workers when jobs arrive. Polling alone stays correct (behind
-- PgBouncer in transaction mode LISTEN does not work); this only cuts the wait.
CREATE FUNCTION fencegate_jobs_notify() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    -- every queue with jobs has its row, which claims lock (fencegate_queues)
    INSERT INTO fencegate_queues (queue) SELECT DISTINCT queue FROM new_jobs
    ON CONFLICT (queue) DO NOTHING;
    PERFORM pg_notify('fencegate_jobs', q.queue)
       FROM (SELECT DISTINCT queue FROM new_jobs) AS q;
    RETURN NULL;
END
$$;

CREATE TRIGGER fencegate_jobs_notify
    AFTER INSERT ON fencegate_jobs
    REFERENCING NEW TABLE AS new_jobs
    FOR EACH STATEMENT EXECUTE FUNCTION fencegate_jobs_notify();

-- ---- resolutions ---------------------------------------------------------------

-- Who resolved an effect whose outcome was unknown, and when. Resolving it
-- not_sent deletes its row (the key is free again), so the record is kept
-- here, apart from the ledger: the console lists and finds resolutions by key
-- after the effect is gone. One row per resolution; `operator` is the
-- resolving client's name (NULL: resolved by a caller that named none).
-- Also an index for the effect page's rejections on one resource.

CREATE TABLE fencegate_resolutions (
    id               bigint      GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    resolved_at      timestamptz NOT NULL DEFAULT clock_timestamp(),
    client           text        NOT NULL,
    idempotency_key  text        NOT NULL,
    resource         text        NOT NULL,
    fence            bigint      NOT NULL,
    provider         text        NOT NULL,
    outcome          text        NOT NULL CHECK (outcome IN ('sent', 'not_sent')),
    operator         text,
    attempts         integer     NOT NULL,
    effect_created_at timestamptz NOT NULL,
    summary          text
);

CREATE INDEX fencegate_resolutions_key
    ON fencegate_resolutions (client, idempotency_key, resolved_at);
CREATE INDEX fencegate_resolutions_at ON fencegate_resolutions (resolved_at);
CREATE INDEX fencegate_rejections_resource ON fencegate_rejections (resource, at);
