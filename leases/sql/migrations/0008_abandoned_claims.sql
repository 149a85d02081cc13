-- Claims abandoned for good. A claim of the lease API under an owner made up
-- for it, whose answer never came, is abandoned by the client: nobody knows
-- its fence, so nobody could renew or release it. Ending the lease is not
-- enough: the claim's statement may still be on its way (the driver drops a
-- connection whose cancel request goes unanswered, and the database may yet
-- run what it had been sent), and land after the abandon found nothing to
-- end. So the abandon remembers the owner here, and a claim of the lease API
-- under a remembered owner is undone as it lands, however late. Kept a day
-- (each abandon purges older ones), far past any delay a statement survives
-- in a connection. Additive: new objects, and the lease API's two claim
-- statements call the checked claim (the queue's claims do not: a worker's
-- owner is never abandoned).

CREATE TABLE fencegate_abandoned_owners (
    owner      text        PRIMARY KEY,
    created_at timestamptz NOT NULL DEFAULT clock_timestamp()
);

-- fencegate_claim_lease, undone if its owner was abandoned. The look at the
-- abandoned owners is a statement of its own, so it sees every abandon that
-- committed before this claim held the lease row: an abandon that comes
-- later waits for that lock and then ends the lease itself.
CREATE FUNCTION fencegate_claim_lease_unless_abandoned(
    p_resource text, p_owner text, p_ttl double precision, p_same_owner boolean
) RETURNS SETOF fencegate_leases
LANGUAGE plpgsql VOLATILE ROWS 1 AS $$
DECLARE
    won fencegate_leases;
BEGIN
    SELECT * INTO won FROM fencegate_claim_lease(p_resource, p_owner, p_ttl, p_same_owner);
    IF NOT FOUND THEN
        RETURN;
    END IF;
    IF EXISTS (SELECT 1 FROM fencegate_abandoned_owners WHERE owner = p_owner) THEN
        UPDATE fencegate_leases SET expires_at = clock_timestamp()
         WHERE resource = p_resource;
        RETURN;
    END IF;
    RETURN NEXT won;
END
$$;

CREATE OR REPLACE FUNCTION fencegate_claim_leases(
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

-- Abandon the claim of p_owner on p_resource: remember the owner, and end its
-- lease if it holds one; the fence it ended, or NULL. The lease row is
-- written in every case (an expired row is made if there is none), so a
-- claim under way on the same row is waited for and then ended, and a claim
-- still to come waits for this one and then finds the owner remembered.
CREATE FUNCTION fencegate_abandon_claim(p_resource text, p_owner text)
RETURNS bigint
LANGUAGE plpgsql AS $$
DECLARE
    t timestamptz := clock_timestamp();
    ended bigint;
BEGIN
    DELETE FROM fencegate_abandoned_owners WHERE created_at < t - interval '1 day';
    INSERT INTO fencegate_abandoned_owners (owner) VALUES (p_owner) ON CONFLICT DO NOTHING;
    INSERT INTO fencegate_leases AS l (resource, owner, fence, claimed_at, expires_at)
    VALUES (p_resource, p_owner, fencegate_next_fence(0), t, t)
    ON CONFLICT (resource) DO UPDATE
       SET expires_at = clock_timestamp()
     WHERE l.owner = excluded.owner AND l.expires_at > clock_timestamp()
    RETURNING CASE WHEN l.claimed_at < t THEN l.fence END INTO ended;
    RETURN ended;
END
$$;
