-- Guest GPU telemetry (seed 002 section 8, issue 35): the newest sample per
-- allocation, as the slice guest reported it to its host agent (per-allocation
-- token, the VM's own address) and the agent wrote it with its status. One row
-- per allocation and node, replaced at each report (readers take the newest); `sample` holds one object per GPU
-- whose fields are numbers or null ("unavailable", never 0). A node writes
-- only its own rows (RLS, as 0050); the service reads them for the API and
-- /metrics, and calls a sample older than its freshness window stale.

CREATE TABLE allocation_telemetry (
    allocation_id text NOT NULL,
    node_name     text NOT NULL REFERENCES nodes (name),
    received_at   timestamptz NOT NULL,   -- when the host agent received the guest's sample
    reported_at   timestamptz NOT NULL DEFAULT now(),
    sample        jsonb NOT NULL CHECK (jsonb_typeof(sample) = 'object' AND octet_length(sample::text) <= 16384),
    -- keyed by node too: a rescheduled allocation's new host never touches the old host's row (RLS)
    PRIMARY KEY (allocation_id, node_name)
);
CREATE INDEX allocation_telemetry_node ON allocation_telemetry (node_name);

ALTER TABLE allocation_telemetry ENABLE ROW LEVEL SECURITY;
CREATE POLICY allocation_telemetry_own_node ON allocation_telemetry
    FOR ALL TO gpuaas_host
    USING (node_name = gpuaas_current_node())
    WITH CHECK (node_name = gpuaas_current_node());
GRANT SELECT, INSERT, UPDATE ON allocation_telemetry TO gpuaas_host;
