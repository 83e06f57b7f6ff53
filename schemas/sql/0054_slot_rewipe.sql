-- `gpuaas slot rewipe NODE SLOT` (issue 35): an operator asks a host to run a
-- cleanup-blocked slot's cleanup again (wipe, verify, health, then free).
--
-- The request is a row the operator's command inserts (with who asked and why;
-- an outbox event records it too) and the node's host agent reads and answers
-- under row-level security: it sees and updates only its own node's requests.
-- One open request per slot. The agent answers `accepted` (it cleared the
-- slot's block; the next steps run in that pass) or `refused` (with the reason:
-- the slot is not blocked on this host).

CREATE TABLE slot_rewipe_requests (
    id           bigserial PRIMARY KEY,
    node_name    text NOT NULL REFERENCES nodes (name),
    slot_index   integer NOT NULL CHECK (slot_index >= 0),
    requested_by text NOT NULL,
    reason       text NOT NULL DEFAULT '' CHECK (length(reason) <= 500),
    requested_at timestamptz NOT NULL DEFAULT now(),
    state        text NOT NULL DEFAULT 'pending' CHECK (state IN ('pending', 'accepted', 'refused')),
    answered_at  timestamptz,
    answer       jsonb NOT NULL DEFAULT '{}'
);
CREATE UNIQUE INDEX slot_rewipe_one_open ON slot_rewipe_requests (node_name, slot_index) WHERE state = 'pending';

ALTER TABLE slot_rewipe_requests ENABLE ROW LEVEL SECURITY;
CREATE POLICY slot_rewipe_own_node ON slot_rewipe_requests
    FOR ALL TO gpuaas_host
    USING (node_name = gpuaas_current_node())
    WITH CHECK (node_name = gpuaas_current_node());
GRANT SELECT, UPDATE (state, answered_at, answer) ON slot_rewipe_requests TO gpuaas_host;
