-- Host agents talk to the service, never to PostgreSQL (issue 29).
--
-- node_agent_tokens: one credential per node, issued and rotated by an operator
-- (`gpuaas host token issue|rotate NODE`); only its sha256 is stored. Only the
-- owner (the service's and the reconciler's role) reads it.
--
-- gpuaas_agent: the identity the service takes for one agent request
-- (`SET LOCAL ROLE gpuaas_agent` and `SET LOCAL gpuaas.agent_node = NODE` in the
-- request's transaction). Its policies show and accept only that node's rows,
-- as 0050's do for a node's own login role, so the database still fences a node
-- to its rows whatever the service's code asks. Only the role that ran this
-- migration (the owner) is made a member: a node role that logs in directly
-- cannot SET ROLE gpuaas_agent, so setting the GUC gains it nothing (its own
-- policies key on its login role).
--
-- Notifications: every plan write says `node:generation` on channel
-- gpuaas_host_plan, every token change says the node on gpuaas_agent_token, so
-- each `serve` replica (one listening connection each) wakes its waiting
-- agents and drops cached credentials without polling.

CREATE TABLE node_agent_tokens (
    node_name    text PRIMARY KEY REFERENCES nodes (name),
    token_sha256 text NOT NULL UNIQUE CHECK (token_sha256 ~ '^[0-9a-f]{64}$'),
    issued_at    timestamptz NOT NULL DEFAULT now(),
    rotated_at   timestamptz
);

DO $$
BEGIN
    CREATE ROLE gpuaas_agent NOLOGIN;
EXCEPTION WHEN duplicate_object THEN
    NULL;
END
$$;

DO $$
BEGIN
    IF NOT (SELECT rolsuper FROM pg_roles WHERE rolname = current_user) THEN
        EXECUTE format('GRANT gpuaas_agent TO %I', current_user);
    END IF;
END
$$;

CREATE FUNCTION gpuaas_agent_node() RETURNS text
LANGUAGE sql STABLE AS $$
    SELECT nullif(current_setting('gpuaas.agent_node', true), '')
$$;

CREATE POLICY host_plans_agent ON host_plans
    FOR SELECT TO gpuaas_agent
    USING (node_name = gpuaas_agent_node());

CREATE POLICY host_status_agent ON host_status
    FOR ALL TO gpuaas_agent
    USING (node_name = gpuaas_agent_node())
    WITH CHECK (node_name = gpuaas_agent_node());

CREATE POLICY host_slot_status_agent ON host_slot_status
    FOR ALL TO gpuaas_agent
    USING (node_name = gpuaas_agent_node())
    WITH CHECK (node_name = gpuaas_agent_node());

CREATE POLICY node_image_cache_agent ON node_image_cache
    FOR ALL TO gpuaas_agent
    USING (node_name = gpuaas_agent_node())
    WITH CHECK (node_name = gpuaas_agent_node());

GRANT SELECT ON host_plans TO gpuaas_agent;
GRANT SELECT, INSERT, UPDATE ON host_status, host_slot_status TO gpuaas_agent;
GRANT SELECT, INSERT, UPDATE, DELETE ON node_image_cache TO gpuaas_agent;

CREATE FUNCTION gpuaas_notify_host_plan() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    PERFORM pg_notify('gpuaas_host_plan', NEW.node_name || ':' || NEW.generation);
    RETURN NULL;
END
$$;

CREATE TRIGGER host_plans_notify AFTER INSERT OR UPDATE OF generation, spec ON host_plans
    FOR EACH ROW EXECUTE FUNCTION gpuaas_notify_host_plan();

CREATE FUNCTION gpuaas_notify_agent_token() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    PERFORM pg_notify('gpuaas_agent_token', COALESCE(NEW.node_name, OLD.node_name));
    RETURN NULL;
END
$$;

CREATE TRIGGER node_agent_tokens_notify AFTER INSERT OR UPDATE OR DELETE ON node_agent_tokens
    FOR EACH ROW EXECUTE FUNCTION gpuaas_notify_agent_token();
