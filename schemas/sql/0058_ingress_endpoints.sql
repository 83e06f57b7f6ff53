-- Tenant ingress (issue 32): each slice allocation gets a public SSH endpoint
-- (public address:port -> its VM's private address:22), plus one public port
-- per extra guest port it asked for (Allocation.extra_ports).
--
--   * nodes.public_addresses / nodes.ingress mirror Node.public_addresses and
--     Node.ingress ({"address", "port_first", "port_last"}); allocations.extra_ports
--     mirrors Allocation.extra_ports.
--   * allocation_endpoints: one row per (allocation, node, guest port). Written
--     by the trigger below in the placement's own transaction (gpuaas_place sets
--     the allocation `reserved`), so an endpoint is durable with the claims or
--     not at all.
--   * endpoints_one_live_per_port: a public address:port belongs to at most one
--     live endpoint, whatever Python does (partial unique index). Two placements
--     on one address are serialised by an advisory lock on the address; the index
--     is the guard behind it, and its refusal is a lost race (next candidate).
--   * an endpoint is freed only when no claim of its allocation on its node is
--     live any more: the claims leave the live set only with cleanup proof
--     (gpuaas_free_cleaned), and the host removes the DNAT rules before it wipes
--     a disk, so a freed port has no rule left on the host.
--
-- Port choice: the lowest free ports of the node's range, in the order of the
-- guest ports (22 first, then extra_ports as declared). A node whose range is
-- full refuses the placement (endpoints_ports_exhausted), also a lost race: the
-- planner's next candidate (another node) is tried.

CREATE TABLE allocation_endpoints (
    id             bigserial PRIMARY KEY,
    allocation_id  text NOT NULL REFERENCES allocations (id),
    node_id        uuid NOT NULL REFERENCES nodes (id),
    public_address inet NOT NULL,
    public_port    integer NOT NULL CHECK (public_port BETWEEN 1024 AND 65535),
    guest_port     integer NOT NULL CHECK (guest_port BETWEEN 1 AND 65535),
    private_ip     inet NOT NULL,
    created_at     timestamptz NOT NULL DEFAULT now(),
    freed_at       timestamptz
);

CREATE UNIQUE INDEX endpoints_one_live_per_port ON allocation_endpoints (public_address, public_port)
    WHERE freed_at IS NULL;
CREATE UNIQUE INDEX endpoints_one_live_per_guest_port ON allocation_endpoints (allocation_id, node_id, guest_port)
    WHERE freed_at IS NULL;
CREATE INDEX endpoints_allocation ON allocation_endpoints (allocation_id);
CREATE INDEX endpoints_live_node ON allocation_endpoints (node_id) WHERE freed_at IS NULL;


-- Placement opens the endpoints: pending -> reserved of a slice allocation on a node with ingress.
CREATE FUNCTION gpuaas_open_endpoints() RETURNS trigger LANGUAGE plpgsql AS $$
DECLARE
    ing     jsonb;
    v_addr  inet;
    v_boot  inet;
    want    integer[];
    got     integer[];
BEGIN
    IF NOT (OLD.status = 'pending' AND NEW.status = 'reserved' AND NEW.capacity_shape = 'gpu_slice'
            AND NEW.node_id IS NOT NULL) THEN
        RETURN NULL;
    END IF;
    SELECT n.ingress INTO ing FROM nodes n WHERE n.id = NEW.node_id;
    IF ing IS NULL THEN
        RETURN NULL;  -- a node without ingress: its slices have no public endpoint
    END IF;
    v_addr := (ing ->> 'address')::inet;
    -- The VM's address: its boot slot's private IP (the lowest slot index, as the host boots it).
    SELECT s.private_ip INTO v_boot
    FROM allocation_resource_claims c JOIN node_resource_slots s ON s.id = c.slot_id
    WHERE c.allocation_id = NEW.id AND c.node_id = NEW.node_id
      AND c.status IN ('reserved', 'provisioning', 'active', 'releasing')
    ORDER BY c.slot_index LIMIT 1;
    IF v_boot IS NULL THEN
        RETURN NULL;
    END IF;
    want := ARRAY[22] || coalesce(NEW.extra_ports, '{}');
    -- Placements on one address take turns choosing (each statement below sees the last one's commit).
    PERFORM pg_advisory_xact_lock(hashtext('gpuaas.ingress'), hashtext(host(v_addr)));
    SELECT array_agg(p ORDER BY p) INTO got
    FROM (SELECT p FROM generate_series((ing ->> 'port_first')::integer, (ing ->> 'port_last')::integer) p
          WHERE NOT EXISTS (SELECT 1 FROM allocation_endpoints e
                            WHERE e.public_address = v_addr AND e.public_port = p AND e.freed_at IS NULL)
          ORDER BY p LIMIT cardinality(want)) free;
    IF coalesce(cardinality(got), 0) < cardinality(want) THEN
        RAISE EXCEPTION 'node ingress %:%-% has fewer than % free port(s)', host(v_addr), ing ->> 'port_first',
            ing ->> 'port_last', cardinality(want)
            USING ERRCODE = 'check_violation', CONSTRAINT = 'endpoints_ports_exhausted';
    END IF;
    INSERT INTO allocation_endpoints (allocation_id, node_id, public_address, public_port, guest_port, private_ip)
    SELECT NEW.id, NEW.node_id, v_addr, got[i], want[i], v_boot FROM generate_subscripts(want, 1) i;
    RETURN NULL;
END
$$;

-- The conditions live in the function bodies, not in WHEN or UPDATE OF: a trigger definition that names
-- a column pins its type, and older stores retype these columns (0006) after later files ran.
CREATE TRIGGER allocations_open_endpoints AFTER UPDATE ON allocations
    FOR EACH ROW EXECUTE FUNCTION gpuaas_open_endpoints();


-- Cleanup proven closes them: the last live claim of the allocation on that node is released.
CREATE FUNCTION gpuaas_free_endpoints() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF NEW.status <> 'released' OR OLD.status = 'released' THEN
        RETURN NULL;
    END IF;
    UPDATE allocation_endpoints e SET freed_at = now()
    WHERE e.allocation_id = NEW.allocation_id AND e.node_id = NEW.node_id AND e.freed_at IS NULL
      AND NOT EXISTS (SELECT 1 FROM allocation_resource_claims c
                      WHERE c.allocation_id = NEW.allocation_id AND c.node_id = NEW.node_id
                        AND c.status IN ('reserved', 'provisioning', 'active', 'releasing'));
    RETURN NULL;
END
$$;

CREATE TRIGGER claims_free_endpoints AFTER UPDATE ON allocation_resource_claims
    FOR EACH ROW EXECUTE FUNCTION gpuaas_free_endpoints();


-- Endpoints are history (who had which port when): never deleted.
CREATE FUNCTION endpoints_no_delete() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    RAISE EXCEPTION 'allocation endpoints are never deleted (freed_at marks a freed one)'
        USING ERRCODE = 'check_violation', CONSTRAINT = 'endpoints_no_delete';
END
$$;
CREATE TRIGGER endpoints_no_delete BEFORE DELETE ON allocation_endpoints
    FOR EACH ROW EXECUTE FUNCTION endpoints_no_delete();
