-- What the operators' console reads (gateway/console/): a bounded record of
-- fence rejections, and an index to find the effects awaiting an operator.
-- Additive: older gateways never touch either.

-- Every effect refused at the fence check, as the gateway saw it: when, which
-- client, provider and reason, on which resource, under which fence (the
-- zombie's) and what the current one was. Written in batches by each gateway,
-- at most once a second, and purged after a retention (7 days by default) by
-- each gateway: the console shows the last hours.
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

-- Effects whose outcome is unknown: what an operator must resolve. Partial, so
-- it holds only those; `state` is already in the other partial indexes'
-- predicates, so this costs no HOT update on the effect path.
CREATE INDEX fencegate_effects_unknown ON fencegate_effects (updated_at)
    WHERE state = 'unknown';
