-- The portal intake's own rows (reconciler/service/intake.py): the first answer to each
-- principal's Idempotency-Key, and an audit line for every write the API made or refused.
-- The service writes only these two tables (through its intake connection); claims stay read-only to it.

CREATE TABLE portal_idempotency (
    principal   text NOT NULL,          -- 'operator' or 'tenant:<name>': keys are per caller
    key         text NOT NULL CHECK (length(key) BETWEEN 1 AND 255),
    fingerprint text NOT NULL,          -- sha256 of the request: the same key with another body is refused
    status      integer NOT NULL,
    response    jsonb NOT NULL,
    created_at  timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (principal, key)
);

CREATE TABLE portal_audit (
    id              bigserial PRIMARY KEY,
    at              timestamptz NOT NULL DEFAULT now(),
    principal       text NOT NULL,
    action          text NOT NULL CHECK (action IN ('create', 'release')),
    allocation_id   text,
    idempotency_key text,
    status          integer NOT NULL,
    code            text,               -- the error code of a refusal
    commit_sha      text                -- the bot's commit of an accepted write
);
CREATE INDEX portal_audit_allocation ON portal_audit (allocation_id);
