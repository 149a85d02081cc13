-- Safe resends inside a provider's idempotency window: an attempt whose
-- outcome is unknown is extended in place (same nonce, a later deadline, the
-- drain barrier moved with it) before the gateway sends it again.
-- Additive: a new function; older gateways never call it.

-- The extension of an attempt whose outcome is unknown, so that it may be
-- sent again, with the same provider key, inside the provider's window
-- (gateway/resend.py). Answers:
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
