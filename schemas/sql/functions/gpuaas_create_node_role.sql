-- Create (or re-key) the login role of one node and map it; returns the role name.
-- Defined by 0050; 0051 added the lock-down and granted nothing but gpuaas_host and CONNECT.
CREATE OR REPLACE FUNCTION gpuaas_create_node_role(node text, password text) RETURNS name
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
        EXECUTE format('CREATE ROLE %I WITH LOGIN PASSWORD %L', r, password);  -- every NO* attribute by default
    END IF;
    EXECUTE format('GRANT gpuaas_host TO %I', r);
    PERFORM gpuaas_restrict_database_access();
    EXECUTE format('GRANT CONNECT ON DATABASE %I TO %I', current_database(), r);
    INSERT INTO host_node_roles (role_name, node_name) VALUES (r, node)
        ON CONFLICT (role_name) DO UPDATE SET node_name = EXCLUDED.node_name;
    RETURN r;
END
$$;
REVOKE ALL ON FUNCTION gpuaas_create_node_role(text, text) FROM PUBLIC;
