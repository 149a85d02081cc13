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
