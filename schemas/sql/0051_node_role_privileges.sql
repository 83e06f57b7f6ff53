-- Node roles get least privilege (issue 13): a host's login role can connect
-- to this database only, and can create nothing anywhere (no table, no
-- schema, no temporary table: nothing to shadow a function or an operator
-- with, nothing to fill the disk with).
--
-- PostgreSQL grants CONNECT and TEMPORARY on every database to PUBLIC, and (up
-- to 14) CREATE on schema public, and no grant can be taken from one role
-- alone while PUBLIC holds it. So PUBLIC loses them, on this database and on
-- every other database of the server this role owns: the embedded server's
-- `postgres`, `template1` and test databases. On a shared server that is the
-- databases this role owns only; on the others the server's administrator
-- revokes CONNECT from PUBLIC, or rejects +gpuaas_host in pg_hba.conf.
--
-- Every login role that could connect when a database is first locked down
-- keeps connecting (an explicit CONNECT grant), except node roles: a
-- dashboard or backup role made by an operator goes on working, and a role
-- made later needs GRANT CONNECT. The owner keeps everything (its privileges
-- are its own, not PUBLIC's).
--
-- gpuaas_create_node_role runs the lock-down again, so a database made later
-- (a clone of a migrated template, a restore) is locked down before the first
-- node role can use it.

CREATE FUNCTION gpuaas_restrict_database_access() RETURNS void
LANGUAGE plpgsql AS $$
DECLARE
    me oid := (SELECT oid FROM pg_roles WHERE rolname = current_user);
    super boolean := (SELECT rolsuper FROM pg_roles WHERE rolname = current_user);
    d record;
    r record;
BEGIN
    FOR d IN
        SELECT datname, datdba FROM pg_database
        WHERE datallowconn
          AND (datdba = me OR (datname = current_database() AND (super OR pg_has_role(me, datdba, 'MEMBER'))))
          -- still granted to PUBLIC (an absent ACL is the default: PUBLIC may connect)
          AND (datacl IS NULL OR EXISTS (
                SELECT 1 FROM aclexplode(datacl) a
                WHERE a.grantee = 0 AND a.privilege_type IN ('CONNECT', 'TEMPORARY')))
    LOOP
        FOR r IN
            SELECT rolname FROM pg_roles
            WHERE rolcanlogin AND NOT rolsuper AND oid <> d.datdba
              AND NOT pg_has_role(oid, 'gpuaas_host', 'MEMBER')
        LOOP
            EXECUTE format('GRANT CONNECT ON DATABASE %I TO %I', d.datname, r.rolname);
        END LOOP;
        EXECUTE format('REVOKE CONNECT, TEMPORARY ON DATABASE %I FROM PUBLIC', d.datname);
    END LOOP;
    -- PostgreSQL 15 and later already leave CREATE on schema public to its owner.
    IF has_schema_privilege('public', 'public', 'CREATE')
       AND (super OR pg_has_role(me, (SELECT nspowner FROM pg_namespace WHERE nspname = 'public'), 'MEMBER')) THEN
        REVOKE CREATE ON SCHEMA public FROM PUBLIC;
    END IF;
END
$$;
REVOKE ALL ON FUNCTION gpuaas_restrict_database_access() FROM PUBLIC;

SELECT gpuaas_restrict_database_access();

-- As in 0050, plus: the lock-down above, and nothing granted to a node role but
-- its group (gpuaas_host) and CONNECT on this database.
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
