-- Console sessions (issue 32): every attempt to open a slice VM's serial console
-- through `gpuaas serve`, refused ones included, with who, when, which
-- allocation, how long and how many bytes each way. Written by the gateway
-- (reconciler/service/console.py) when the attempt is decided and again when
-- the session ends; never deleted.

CREATE TABLE console_sessions (
    id            bigserial PRIMARY KEY,
    allocation_id text NOT NULL,            -- as asked: a refused attempt may name no allocation
    principal     text,                     -- NULL: no (or an unknown) credential
    role          text CHECK (role IN ('tenant', 'operator')),
    tenant        text,                     -- the credential's tenant (tenant role)
    node          text,
    remote        text,                     -- the client's address as the gateway saw it
    opened_at     timestamptz NOT NULL DEFAULT now(),
    closed_at     timestamptz,
    duration_ms   bigint CHECK (duration_ms IS NULL OR duration_ms >= 0),
    bytes_in      bigint NOT NULL DEFAULT 0 CHECK (bytes_in >= 0),   -- client -> console
    bytes_out     bigint NOT NULL DEFAULT 0 CHECK (bytes_out >= 0),  -- console -> client
    outcome       text NOT NULL CHECK (outcome IN ('open', 'closed', 'cut', 'refused', 'failed')),
    reason        text,
    CONSTRAINT console_sessions_closed CHECK ((outcome = 'open') = (closed_at IS NULL))
);

CREATE INDEX console_sessions_allocation ON console_sessions (allocation_id, opened_at);
CREATE INDEX console_sessions_open ON console_sessions (id) WHERE outcome = 'open';

CREATE FUNCTION console_sessions_no_delete() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    RAISE EXCEPTION 'console sessions are an audit trail: never deleted'
        USING ERRCODE = 'check_violation', CONSTRAINT = 'console_sessions_no_delete';
END
$$;
CREATE TRIGGER console_sessions_no_delete BEFORE DELETE ON console_sessions
    FOR EACH ROW EXECUTE FUNCTION console_sessions_no_delete();
