-- Guest telemetry (0056) and slot rewipe requests (0054) through the agent API.
--
-- Both tables came with policies for a node's own login role only (the lab's
-- direct-database mode). A host agent that talks to `gpuaas serve` writes as
-- gpuaas_agent with gpuaas.agent_node set (0060): without these policies its
-- status report carrying telemetry was refused whole (permission denied) and
-- its rewipe requests were never seen. As 0060's, each keys on the node the
-- service authenticated, so the database fences a node to its own rows.

CREATE POLICY allocation_telemetry_agent ON allocation_telemetry
    FOR ALL TO gpuaas_agent
    USING (node_name = gpuaas_agent_node())
    WITH CHECK (node_name = gpuaas_agent_node());
GRANT SELECT, INSERT, UPDATE ON allocation_telemetry TO gpuaas_agent;

-- A node sees its own requests and answers them: only the answer columns are
-- writable (never the slot, the node, who asked or why).
CREATE POLICY slot_rewipe_agent ON slot_rewipe_requests
    FOR ALL TO gpuaas_agent
    USING (node_name = gpuaas_agent_node())
    WITH CHECK (node_name = gpuaas_agent_node());
GRANT SELECT, UPDATE (state, answered_at, answer) ON slot_rewipe_requests TO gpuaas_agent;
