-- The write side of apply, one round trip each (reconciler.store.applying calls them).
--
-- gpuaas_place: one placement in one transaction. Locks the allocation, then
-- the node row (FOR UPDATE for a baremetal lease, FOR SHARE for slices) and
-- the chosen slot rows with SKIP LOCKED, re-checks them, inserts the claims
-- with their resource snapshot, marks the slots reserved, records the
-- placement on the allocation and writes a provisioning.requested outbox
-- event. It never waits for another placement: a locked or taken row is a
-- lost race ('lost_race'), and the caller tries the planner's next candidate.
-- Outcomes: placed | lost_race | refused | busy | not_pending | unknown.

CREATE FUNCTION gpuaas_place(
    p_allocation   text,
    p_node         text,
    p_slot_indexes integer[],
    p_claim_kind   text,
    p_profile      jsonb,
    p_image        text,
    p_revision     text
) RETURNS TABLE (outcome text, detail text, claim_ids uuid[])
LANGUAGE plpgsql
-- Every statement below is keyed by ids: generic plans are as good as custom
-- ones, and re-planning eight statements per call would double its cost.
SET plan_cache_mode = force_generic_plan
AS $$
DECLARE
    a        record;
    n        record;
    common   jsonb;
    want     integer := coalesce(cardinality(p_slot_indexes), 0);
    got      integer;
    taken    text;
    unfit    text;
    ids      uuid[];
BEGIN
    -- The allocation, its SKU and its image, with the allocation row locked.
    SELECT al.id, al.status, al.desired_state, al.present, al.tenant, al.sku, al.gpu_count, al.region,
           al.ssh_keys, coalesce(p_image, al.image) AS image_slug,
           k.capacity_shape, k.gpu_count AS sku_gpus, k.gpu_hourly_price_minor, k.currency,
           CASE WHEN i.slug IS NOT NULL THEN jsonb_build_object(
               'slug', i.slug, 'version', i.version, 'source_ref', i.source_ref,
               'digest_sha256', i.digest_sha256, 'image_format', i.image_format,
               'default_username', i.default_username) END AS image
    INTO a
    FROM allocations al
    LEFT JOIN sku_catalog k ON k.sku = al.sku
    LEFT JOIN os_images i ON i.slug = coalesce(p_image, al.image) AND i.present AND i.active
    WHERE al.id = p_allocation
    FOR UPDATE OF al SKIP LOCKED;
    IF NOT FOUND THEN
        IF EXISTS (SELECT 1 FROM allocations WHERE id = p_allocation) THEN
            RETURN QUERY SELECT 'busy', 'another reconciler holds this allocation', NULL::uuid[];
        ELSE
            RETURN QUERY SELECT 'unknown', 'no such allocation in the store', NULL::uuid[];
        END IF;
        RETURN;
    END IF;
    IF a.status <> 'pending' OR a.desired_state <> 'present' OR NOT a.present THEN
        RETURN QUERY SELECT 'not_pending', format('allocation is %s (desired %s)', a.status, a.desired_state),
                            NULL::uuid[];
        RETURN;
    END IF;
    IF a.capacity_shape IS NULL OR (a.capacity_shape = 'baremetal') <> (p_claim_kind = 'node_exclusive') THEN
        RETURN QUERY SELECT 'refused', format('SKU %s does not take %s claims', a.sku, p_claim_kind), NULL::uuid[];
        RETURN;
    END IF;
    IF a.image_slug IS NOT NULL AND a.image IS NULL THEN
        RETURN QUERY SELECT 'refused', format('image %s is not an active catalog image', a.image_slug),
                            NULL::uuid[];
        RETURN;
    END IF;

    common := jsonb_build_object(
        'allocation_id', a.id, 'tenant', a.tenant, 'sku', a.sku, 'capacity_shape', a.capacity_shape,
        'allocation_gpu_count', a.gpu_count, 'region', a.region, 'node', p_node,
        'profile', p_profile, 'image', a.image, 'ssh_keys', to_jsonb(a.ssh_keys),
        'price', jsonb_build_object('gpu_hourly_price_minor', a.gpu_hourly_price_minor, 'currency', a.currency),
        'revision', p_revision, 'claimed_at', now());

    IF p_claim_kind = 'node_exclusive' THEN
        -- A whole-node lease: the node row FOR UPDATE, and no live claim on it at all.
        SELECT nd.id, nd.present, nd.admin_state INTO n FROM nodes nd WHERE nd.name = p_node
            FOR UPDATE SKIP LOCKED;
        IF NOT FOUND THEN
            IF EXISTS (SELECT 1 FROM nodes WHERE name = p_node) THEN
                RETURN QUERY SELECT 'lost_race', format('node %s is locked by another placement', p_node),
                                    NULL::uuid[];
            ELSE
                RETURN QUERY SELECT 'refused', format('node %s is not in the store', p_node), NULL::uuid[];
            END IF;
            RETURN;
        END IF;
        IF NOT n.present OR n.admin_state <> 'active' THEN
            RETURN QUERY SELECT 'refused', format('node %s is %s', p_node,
                                CASE WHEN n.present THEN n.admin_state ELSE 'removed' END), NULL::uuid[];
            RETURN;
        END IF;
        IF EXISTS (SELECT 1 FROM allocation_resource_claims c
                   WHERE c.node_id = n.id AND c.status IN ('reserved', 'provisioning', 'active', 'releasing')) THEN
            RETURN QUERY SELECT 'lost_race', format('node %s already holds live claims', p_node), NULL::uuid[];
            RETURN;
        END IF;
        INSERT INTO allocation_resource_claims (allocation_id, node_id, claim_kind, status, resource_snapshot)
        VALUES (a.id, n.id, 'node_exclusive', 'reserved',
                common || jsonb_build_object('gpus', coalesce(a.sku_gpus, a.gpu_count),
                                             'slot_indexes', to_jsonb(coalesce(p_slot_indexes, '{}'))))
        RETURNING ARRAY[id] INTO ids;
    ELSE
        IF want <> a.gpu_count OR want <> (SELECT count(DISTINCT x) FROM unnest(p_slot_indexes) x) THEN
            RETURN QUERY SELECT 'refused', format('%s distinct slots asked for a %s-GPU allocation', want, a.gpu_count),
                                NULL::uuid[];
            RETURN;
        END IF;
        -- Slices: the node row FOR SHARE (a baremetal lease in flight makes us skip it)
        -- and the chosen slot rows FOR UPDATE, never waiting for another placement.
        SELECT min(l.node_id::text)::uuid AS id, bool_and(l.n_present) AS present, min(l.admin_state) AS admin_state,
               count(*) AS got,
               string_agg(format('%s is %s', l.slot_index, l.status), ', ') FILTER (WHERE l.status <> 'available')
                   AS taken,
               string_agg(format('%s is not eligible', l.slot_index), ', ') FILTER (WHERE NOT (l.present AND l.eligible))
                   AS unfit
        INTO n
        FROM (SELECT nd.id AS node_id, nd.present AS n_present, nd.admin_state,
                     s.slot_index, s.status, s.present, s.eligible
              FROM nodes nd JOIN node_resource_slots s ON s.node_id = nd.id
              WHERE nd.name = p_node AND s.slot_index = ANY (p_slot_indexes)
              FOR SHARE OF nd SKIP LOCKED FOR UPDATE OF s SKIP LOCKED) l;
        IF n.got = 0 AND NOT EXISTS (SELECT 1 FROM nodes WHERE name = p_node) THEN
            RETURN QUERY SELECT 'refused', format('node %s is not in the store', p_node), NULL::uuid[];
            RETURN;
        END IF;
        IF n.got > 0 AND (NOT n.present OR n.admin_state <> 'active') THEN
            RETURN QUERY SELECT 'refused', format('node %s is %s', p_node,
                                CASE WHEN n.present THEN n.admin_state ELSE 'removed' END), NULL::uuid[];
            RETURN;
        END IF;
        IF n.unfit IS NOT NULL THEN
            RETURN QUERY SELECT 'refused', format('node %s: slot %s', p_node, n.unfit), NULL::uuid[];
            RETURN;
        END IF;
        IF n.got < want OR n.taken IS NOT NULL THEN
            RETURN QUERY SELECT 'lost_race',
                format('node %s: %s of %s slots free to lock%s', p_node, n.got, want,
                       coalesce('; slot ' || n.taken, '')), NULL::uuid[];
            RETURN;
        END IF;
        WITH ins AS (
            INSERT INTO allocation_resource_claims
                (allocation_id, node_id, slot_id, slot_index, claim_kind, status, resource_snapshot)
            SELECT a.id, n.id, s.id, s.slot_index, 'slot', 'reserved',
                   common || jsonb_build_object('gpus', s.gpu_count, 'slot', jsonb_build_object(
                       'slot_index', s.slot_index, 'gpu_pci_address', s.gpu_pci_address,
                       'gpu_uuid', s.gpu_uuid, 'gpu_model', s.gpu_model,
                       'fabric_vf_pci_address', s.fabric_vf_pci_address,
                       'network_fabric', s.network_fabric, 'nvme_device', s.nvme_device,
                       'mac_address', s.mac_address, 'private_ip', host(s.private_ip),
                       'numa_node', s.numa_node, 'slot_group', s.slot_group))
            FROM node_resource_slots s
            WHERE s.node_id = n.id AND s.slot_index = ANY (p_slot_indexes)
            ORDER BY s.slot_index
            RETURNING id
        )
        SELECT array_agg(id) INTO ids FROM ins;
        UPDATE node_resource_slots SET status = 'reserved', updated_at = now()
        WHERE node_id = n.id AND slot_index = ANY (p_slot_indexes);
    END IF;

    WITH placed AS (
        UPDATE allocations SET
            status = 'reserved', capacity_shape = a.capacity_shape, node_id = n.id,
            placement = jsonb_build_object('node', p_node, 'slot_indexes', to_jsonb(coalesce(p_slot_indexes, '{}')),
                                           'claim_kind', p_claim_kind, 'profile', p_profile -> 'name',
                                           'image', a.image -> 'slug'),
            placed_at = now(), placed_revision = p_revision,
            pending_code = NULL, pending_message = NULL, pending_details = NULL, pending_since = NULL,
            updated_at = now(), status_changed_at = now()
        WHERE id = a.id
        RETURNING id
    )
    INSERT INTO outbox (event_type, aggregate_type, aggregate_id, payload)
    SELECT 'provisioning.requested', 'allocation', placed.id, jsonb_build_object(
        'allocation_id', placed.id, 'node', p_node, 'capacity_shape', a.capacity_shape,
        'claim_kind', p_claim_kind, 'claim_ids', to_jsonb(ids),
        'slot_indexes', to_jsonb(coalesce(p_slot_indexes, '{}')), 'revision', p_revision)
    FROM placed;
    RETURN QUERY SELECT 'placed', NULL::text, ids;
END
$$;


-- gpuaas_release: desired state says released. Live claims -> releasing,
-- slots -> cleanup, allocation -> releasing (usage stops now), outbox
-- release.requested. Only cleanup proof (gpuaas_free_cleaned) frees them.
-- An allocation that was never placed is simply released.
-- Outcomes: releasing | cancelled | unchanged | unknown.
CREATE FUNCTION gpuaas_release(p_allocation text, p_revision text)
RETURNS TABLE (outcome text, node text, slot_indexes integer[])
LANGUAGE plpgsql AS $$
DECLARE
    a     allocations%ROWTYPE;
    nname text;
    idx   integer[];
BEGIN
    SELECT * INTO a FROM allocations WHERE id = p_allocation FOR UPDATE;
    IF NOT FOUND THEN
        RETURN QUERY SELECT 'unknown', NULL::text, NULL::integer[];
        RETURN;
    END IF;
    IF a.status = 'pending' THEN
        UPDATE allocations SET status = 'released', released_at = now(), pending_code = NULL,
               pending_message = NULL, pending_details = NULL, pending_since = NULL,
               updated_at = now(), status_changed_at = now()
        WHERE id = a.id;
        RETURN QUERY SELECT 'cancelled', NULL::text, NULL::integer[];
        RETURN;
    END IF;
    IF a.status NOT IN ('reserved', 'provisioning', 'active', 'failed') THEN
        RETURN QUERY SELECT 'unchanged', NULL::text, NULL::integer[];
        RETURN;
    END IF;
    WITH rel AS (
        UPDATE allocation_resource_claims SET status = 'releasing'
        WHERE allocation_id = a.id AND status IN ('reserved', 'provisioning', 'active')
        RETURNING slot_id, slot_index
    ), slots AS (
        UPDATE node_resource_slots s SET status = 'cleanup', updated_at = now()
        FROM rel WHERE s.id = rel.slot_id
        RETURNING s.slot_index
    )
    SELECT array_agg(slot_index ORDER BY slot_index) INTO idx FROM slots;
    SELECT name INTO nname FROM nodes WHERE id = a.node_id;
    UPDATE allocations SET status = 'releasing', release_requested_at = now(),
           updated_at = now(), status_changed_at = now()
    WHERE id = a.id;
    INSERT INTO outbox (event_type, aggregate_type, aggregate_id, payload)
    VALUES ('release.requested', 'allocation', a.id, jsonb_build_object(
        'allocation_id', a.id, 'node', nname, 'slot_indexes', to_jsonb(coalesce(idx, '{}')),
        'revision', p_revision));
    RETURN QUERY SELECT 'releasing', nname, coalesce(idx, '{}');
END
$$;


-- gpuaas_free_cleaned: the only way a released slot returns to service.
-- For each releasing claim (on one node, or everywhere when p_node is NULL):
-- verified cleanup proof -> claim released, slot available (or disabled when
-- git no longer declares it); a failed wipe -> slot cleanup_blocked (that slot
-- only). Allocations whose last claim is released become released.
-- Outcomes per row: freed | blocked | released (allocation).
CREATE FUNCTION gpuaas_free_cleaned(p_node text DEFAULT NULL)
RETURNS TABLE (node text, slot_index integer, allocation_id text, outcome text)
LANGUAGE plpgsql AS $$
DECLARE
    c  allocation_resource_claims%ROWTYPE;
    nm text;
BEGIN
    FOR c IN
        SELECT cl.* FROM allocation_resource_claims cl JOIN nodes n ON n.id = cl.node_id
        WHERE cl.status = 'releasing' AND (p_node IS NULL OR n.name = p_node)
        ORDER BY cl.node_id, cl.slot_index NULLS FIRST
        FOR UPDATE OF cl
    LOOP
        SELECT name INTO nm FROM nodes WHERE id = c.node_id;
        IF claim_cleanup_proven(c) THEN
            UPDATE allocation_resource_claims SET status = 'released' WHERE id = c.id;
            IF c.slot_id IS NOT NULL THEN
                UPDATE node_resource_slots SET
                    status = CASE WHEN present AND enabled THEN 'available' ELSE 'disabled' END,
                    updated_at = now()
                WHERE id = c.slot_id;
            END IF;
            RETURN QUERY SELECT nm, c.slot_index, c.allocation_id, 'freed';
        ELSIF c.slot_id IS NOT NULL AND claim_cleanup_failed(c) THEN
            UPDATE node_resource_slots SET status = 'cleanup_blocked', updated_at = now()
            WHERE id = c.slot_id AND status <> 'cleanup_blocked';
            IF FOUND THEN
                RETURN QUERY SELECT nm, c.slot_index, c.allocation_id, 'blocked';
            END IF;
        END IF;
    END LOOP;
    RETURN QUERY
    WITH done AS (
        UPDATE allocations a SET status = 'released', released_at = now(),
               updated_at = now(), status_changed_at = now()
        WHERE a.status = 'releasing'
          AND NOT EXISTS (SELECT 1 FROM allocation_resource_claims cl
                          WHERE cl.allocation_id = a.id
                            AND cl.status IN ('reserved', 'provisioning', 'active', 'releasing'))
        RETURNING a.id, a.node_id
    ), ev AS (
        INSERT INTO outbox (event_type, aggregate_type, aggregate_id, payload)
        SELECT 'allocation.released', 'allocation', d.id, jsonb_build_object('allocation_id', d.id)
        FROM done d
    )
    SELECT n.name, NULL::integer, d.id, 'released' FROM done d LEFT JOIN nodes n ON n.id = d.node_id;
END
$$;


-- gpuaas_absorb_vm_states: host reports move claims forward. A VM the host
-- reports for the claim's allocation on that slot as provisioning or ready
-- moves the claim (and slot) to provisioning or active; usage starts at the
-- host's ready time. Allocations follow their claims. Returns rows changed.
CREATE FUNCTION gpuaas_absorb_vm_states(p_node text DEFAULT NULL)
RETURNS integer
LANGUAGE plpgsql AS $$
DECLARE
    changed integer := 0;
    k       integer;
BEGIN
    WITH moved AS (
        UPDATE allocation_resource_claims c SET
            status = CASE WHEN h.vm_state = 'ready' THEN 'active' ELSE 'provisioning' END,
            active_at = CASE WHEN h.vm_state = 'ready' THEN coalesce(h.vm_ready_at, now()) END
        FROM host_slot_status h JOIN nodes n ON n.name = h.node_name
        WHERE c.node_id = n.id AND c.slot_index = h.slot_index AND c.allocation_id = h.allocation_id
          AND (p_node IS NULL OR n.name = p_node)
          AND ((c.status = 'reserved' AND h.vm_state IN ('provisioning', 'ready'))
               OR (c.status = 'provisioning' AND h.vm_state = 'ready'))
        RETURNING c.slot_id, c.status
    )
    UPDATE node_resource_slots s SET status = m.status, updated_at = now()
    FROM moved m WHERE s.id = m.slot_id;
    GET DIAGNOSTICS k = ROW_COUNT;
    changed := changed + k;

    UPDATE allocation_resource_claims c SET
        status = CASE WHEN h.lease_state = 'ready' THEN 'active' ELSE 'provisioning' END,
        active_at = CASE WHEN h.lease_state = 'ready' THEN coalesce(h.lease_ready_at, now()) END
    FROM host_status h JOIN nodes n ON n.name = h.node_name
    WHERE c.node_id = n.id AND c.claim_kind = 'node_exclusive' AND c.allocation_id = h.lease_allocation_id
      AND (p_node IS NULL OR n.name = p_node)
      AND ((c.status = 'reserved' AND h.lease_state IN ('provisioning', 'ready'))
           OR (c.status = 'provisioning' AND h.lease_state = 'ready'));
    GET DIAGNOSTICS k = ROW_COUNT;
    changed := changed + k;

    WITH agg AS (
        SELECT cl.allocation_id,
               bool_and(cl.status = 'active') AS all_active,
               bool_or(cl.status IN ('provisioning', 'active')) AS started,
               max(cl.active_at) AS active_at
        FROM allocation_resource_claims cl
        WHERE cl.status IN ('reserved', 'provisioning', 'active')
        GROUP BY cl.allocation_id
    )
    UPDATE allocations a SET
        status = CASE WHEN agg.all_active THEN 'active' ELSE 'provisioning' END,
        active_at = CASE WHEN agg.all_active THEN agg.active_at END,
        updated_at = now(), status_changed_at = now()
    FROM agg
    WHERE a.id = agg.allocation_id AND a.status IN ('reserved', 'provisioning')
      AND (agg.all_active OR (agg.started AND a.status = 'reserved'));
    GET DIAGNOSTICS k = ROW_COUNT;
    RETURN changed + k;
END
$$;
