-- Hosts read only their own plan and write only their own status ([host] issue).
--
-- One PostgreSQL login role per node, a member of the group role gpuaas_host,
-- mapped to its node in host_node_roles. Row-level security on host_plans,
-- host_status and host_slot_status lets a member of gpuaas_host see and
-- touch only the rows of the node its role maps to. The central reconciler
-- (table owner) is not subject to these policies.
--
-- Roles are cluster-wide while this schema is per database, so the group
-- role is created only if missing, and a node role is created by
-- gpuaas_create_node_role() (run by the central reconciler's role).

DO $$
BEGIN
    CREATE ROLE gpuaas_host NOLOGIN;
EXCEPTION WHEN duplicate_object THEN
    NULL;
END
$$;

CREATE TABLE host_node_roles (
    role_name  name PRIMARY KEY,
    node_name  text NOT NULL UNIQUE REFERENCES nodes (name),
    created_at timestamptz NOT NULL DEFAULT now()
);

-- The node of the session's login role (NULL for any other role). SECURITY DEFINER,
-- so session_user (current_user is the owner here): a host role cannot read host_node_roles.
CREATE FUNCTION gpuaas_current_node() RETURNS text
LANGUAGE sql STABLE SECURITY DEFINER SET search_path = pg_catalog, public AS $$
    SELECT node_name FROM public.host_node_roles WHERE role_name = session_user
$$;
REVOKE ALL ON FUNCTION gpuaas_current_node() FROM PUBLIC;
GRANT EXECUTE ON FUNCTION gpuaas_current_node() TO gpuaas_host;

ALTER TABLE host_plans ENABLE ROW LEVEL SECURITY;
ALTER TABLE host_status ENABLE ROW LEVEL SECURITY;
ALTER TABLE host_slot_status ENABLE ROW LEVEL SECURITY;

CREATE POLICY host_plans_own_node ON host_plans
    FOR SELECT TO gpuaas_host
    USING (node_name = gpuaas_current_node());

CREATE POLICY host_status_own_node ON host_status
    FOR ALL TO gpuaas_host
    USING (node_name = gpuaas_current_node())
    WITH CHECK (node_name = gpuaas_current_node());

CREATE POLICY host_slot_status_own_node ON host_slot_status
    FOR ALL TO gpuaas_host
    USING (node_name = gpuaas_current_node())
    WITH CHECK (node_name = gpuaas_current_node());

GRANT SELECT ON host_plans TO gpuaas_host;
GRANT SELECT, INSERT, UPDATE ON host_status, host_slot_status TO gpuaas_host;

-- Create (or re-key) the login role of one node and map it. Returns the role name.
-- The role name is derived from the node name (lower case, [a-z0-9_], prefixed)
-- plus a short hash, so two node names never collide on one role.
CREATE FUNCTION gpuaas_create_node_role(node text, password text) RETURNS name
LANGUAGE plpgsql AS $$
DECLARE
    r name := left('gpuaas_node_' || regexp_replace(lower(node), '[^a-z0-9]+', '_', 'g'), 50)
              || '_' || left(md5(node), 8);
BEGIN
    IF NOT EXISTS (SELECT 1 FROM nodes WHERE name = node) THEN
        RAISE EXCEPTION 'no node %', node USING ERRCODE = 'foreign_key_violation';
    END IF;
    IF EXISTS (SELECT 1 FROM pg_roles WHERE rolname = r) THEN
        EXECUTE format('ALTER ROLE %I WITH LOGIN PASSWORD %L', r, password);
    ELSE
        EXECUTE format('CREATE ROLE %I WITH LOGIN PASSWORD %L', r, password);
    END IF;
    EXECUTE format('GRANT gpuaas_host TO %I', r);
    EXECUTE format('GRANT CONNECT ON DATABASE %I TO %I', current_database(), r);
    INSERT INTO host_node_roles (role_name, node_name) VALUES (r, node)
        ON CONFLICT (role_name) DO UPDATE SET node_name = EXCLUDED.node_name;
    RETURN r;
END
$$;
REVOKE ALL ON FUNCTION gpuaas_create_node_role(text, text) FROM PUBLIC;
