-- Claims abandoned for good. A claim of the lease API under an owner made up
-- for it, whose answer never came, is abandoned by the client: nobody knows
-- its fence, so nobody could renew or release it. Ending the lease is not
-- enough: the claim's statement may still be on its way (the driver drops a
-- connection whose cancel request goes unanswered, and the database may yet
-- run what it had been sent), and land after the abandon found nothing to
-- end. So the abandon remembers the owner here, and a claim of the lease API
-- under a remembered owner is refused as it lands, however late. Kept a day
-- (each abandon purges older ones), far past any delay a statement survives
-- in a connection. Additive: new objects, and the lease API's two claim
-- statements call the checked claim (the queue's claims do not: their
-- owners are never abandoned).

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
