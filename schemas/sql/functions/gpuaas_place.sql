-- One placement attempt: lock the allocation, the node and the chosen slots (SKIP LOCKED),
-- re-check them and write the claims with their snapshot, the slot and allocation status and a
-- provisioning.requested outbox event; or write nothing and say why (one row out).
-- Defined by 0004 (its contract is described there); 0006 rewrote it (snapshot types, one row out).
CREATE OR REPLACE FUNCTION gpuaas_place(
    p_allocation   text,
    p_node         text,
    p_slot_indexes integer[],
    p_claim_kind   text,
    p_profile      jsonb,
    p_image        text,
    p_revision     text,
    OUT outcome    text,
    OUT detail     text,
    OUT claim_ids  uuid[]
)
LANGUAGE plpgsql
-- Every statement below is keyed by ids: generic plans are as good as custom
-- ones, and re-planning them per call would double its cost.
SET plan_cache_mode = force_generic_plan
AS $$
DECLARE
    a       record;
    n       record;
    d       record;
    v_node  uuid;
    want    integer := coalesce(cardinality(p_slot_indexes), 0);
BEGIN
    -- The allocation, its SKU and its image, with the allocation row locked.
    SELECT al.id, al.status, al.desired_state, al.present, al.tenant, al.sku, al.gpu_count, al.region,
           al.ssh_keys, coalesce(p_image, al.image) AS image_slug,
           k.capacity_shape, k.gpu_count AS sku_gpus, k.gpu_hourly_price_minor, k.currency,
           CASE WHEN i.slug IS NOT NULL THEN to_jsonb(ROW(
               i.slug, i.version, i.source_ref, i.digest_sha256, i.image_format, i.default_username
           )::gpuaas_snapshot_image) END AS image
    INTO a
    FROM allocations al
    LEFT JOIN sku_catalog k ON k.sku = al.sku
    LEFT JOIN os_images i ON i.slug = coalesce(p_image, al.image) AND i.present AND i.active
    WHERE al.id = p_allocation
    FOR UPDATE OF al SKIP LOCKED;
    IF NOT FOUND THEN
        IF EXISTS (SELECT 1 FROM allocations WHERE id = p_allocation) THEN
            outcome := 'busy'; detail := 'another reconciler holds this allocation';
        ELSE
            outcome := 'unknown'; detail := 'no such allocation in the store';
        END IF;
        RETURN;
    END IF;
    IF a.status <> 'pending' OR a.desired_state <> 'present' OR NOT a.present THEN
        outcome := 'not_pending'; detail := format('allocation is %s (desired %s)', a.status, a.desired_state);
        RETURN;
    END IF;
    IF a.capacity_shape IS NULL OR (a.capacity_shape = 'baremetal') <> (p_claim_kind = 'node_exclusive') THEN
        outcome := 'refused'; detail := format('SKU %s does not take %s claims', a.sku, p_claim_kind);
        RETURN;
    END IF;
    IF a.image_slug IS NOT NULL AND a.image IS NULL THEN
        outcome := 'refused'; detail := format('image %s is not an active catalog image', a.image_slug);
        RETURN;
    END IF;

    IF p_claim_kind = 'node_exclusive' THEN
        -- A whole-node lease: the node row FOR UPDATE, and no live claim on it at all.
        SELECT nd.id, nd.present, nd.admin_state INTO n FROM nodes nd WHERE nd.name = p_node
            FOR UPDATE SKIP LOCKED;
        IF NOT FOUND THEN
            IF EXISTS (SELECT 1 FROM nodes WHERE name = p_node) THEN
                outcome := 'lost_race'; detail := format('node %s is locked by another placement', p_node);
            ELSE
                outcome := 'refused'; detail := format('node %s is not in the store', p_node);
            END IF;
            RETURN;
        END IF;
        IF NOT n.present OR n.admin_state <> 'active' THEN
            outcome := 'refused';
            detail := format('node %s is %s', p_node, CASE WHEN n.present THEN n.admin_state ELSE 'removed' END);
            RETURN;
        END IF;
        v_node := n.id;
        IF EXISTS (SELECT 1 FROM allocation_resource_claims c
                   WHERE c.node_id = v_node AND c.status IN ('reserved', 'provisioning', 'active', 'releasing')) THEN
            outcome := 'lost_race'; detail := format('node %s already holds live claims', p_node);
            RETURN;
        END IF;
        INSERT INTO allocation_resource_claims (allocation_id, node_id, claim_kind, status, resource_snapshot)
        VALUES (a.id, v_node, 'node_exclusive', 'reserved', jsonb_build_object(
            'allocation_id', a.id, 'tenant', a.tenant, 'sku', a.sku, 'capacity_shape', a.capacity_shape,
            'allocation_gpu_count', a.gpu_count, 'region', a.region, 'node', p_node,
            'profile', p_profile, 'image', a.image, 'ssh_keys', to_jsonb(a.ssh_keys),
            'price', jsonb_build_object('gpu_hourly_price_minor', a.gpu_hourly_price_minor, 'currency', a.currency),
            'revision', p_revision, 'claimed_at', now(),
            'gpus', coalesce(a.sku_gpus, a.gpu_count), 'slot_indexes', to_jsonb(coalesce(p_slot_indexes, '{}'))))
        RETURNING ARRAY[id] INTO claim_ids;
    ELSE
        IF want <> a.gpu_count THEN
            outcome := 'refused';
            detail := format('%s distinct slots asked for a %s-GPU allocation', want, a.gpu_count);
            RETURN;
        END IF;
        -- Slices: the node row FOR SHARE (a baremetal lease in flight makes us skip it)
        -- and the chosen slot rows FOR UPDATE, never waiting for another placement;
        -- only slots a claim may take (and an active node) are locked and counted.
        SELECT min(l.node_id::text)::uuid AS id, count(*) AS got
        INTO n
        FROM (SELECT nd.id AS node_id
              FROM nodes nd JOIN node_resource_slots s ON s.node_id = nd.id
              WHERE nd.name = p_node AND s.slot_index = ANY (p_slot_indexes)
                AND nd.present AND nd.admin_state = 'active'
                AND s.status = 'available' AND s.present AND s.eligible
              FOR SHARE OF nd SKIP LOCKED FOR UPDATE OF s SKIP LOCKED) l;
        v_node := n.id;
        IF n.got < want THEN
            -- Short: lock what can be locked of the request (our own locks are re-entrant) and say why.
            SELECT min(l.node_id::text)::uuid AS id, bool_and(l.n_present) AS present,
                   min(l.admin_state) AS admin_state, count(*) AS got,
                   string_agg(format('%s is %s', l.slot_index, l.status), ', ') FILTER (WHERE l.status <> 'available')
                       AS taken,
                   string_agg(format('%s is not eligible', l.slot_index), ', ')
                       FILTER (WHERE NOT (l.present AND l.eligible)) AS unfit
            INTO d
            FROM (SELECT nd.id AS node_id, nd.present AS n_present, nd.admin_state,
                         s.slot_index, s.status, s.present, s.eligible
                  FROM nodes nd JOIN node_resource_slots s ON s.node_id = nd.id
                  WHERE nd.name = p_node AND s.slot_index = ANY (p_slot_indexes)
                  FOR SHARE OF nd SKIP LOCKED FOR UPDATE OF s SKIP LOCKED) l;
            IF d.got = 0 THEN
                IF NOT EXISTS (SELECT 1 FROM nodes WHERE name = p_node) THEN
                    outcome := 'refused'; detail := format('node %s is not in the store', p_node);
                    RETURN;
                END IF;
            ELSIF NOT d.present OR d.admin_state <> 'active' THEN
                outcome := 'refused';
                detail := format('node %s is %s', p_node, CASE WHEN d.present THEN d.admin_state ELSE 'removed' END);
                RETURN;
            END IF;
            IF d.unfit IS NOT NULL THEN
                outcome := 'refused'; detail := format('node %s: slot %s', p_node, d.unfit);
                RETURN;
            END IF;
            IF d.got < want OR d.taken IS NOT NULL THEN
                -- got counts distinct slots, so only a short lock set can hide a repeated index.
                IF want <> (SELECT count(DISTINCT x) FROM unnest(p_slot_indexes) x) THEN
                    outcome := 'refused';
                    detail := format('%s distinct slots asked for a %s-GPU allocation', want, a.gpu_count);
                ELSE
                    outcome := 'lost_race';
                    detail := format('node %s: %s of %s slots free to lock%s', p_node, d.got, want,
                                     coalesce('; slot ' || d.taken, ''));
                END IF;
                RETURN;
            END IF;
            -- Freed between the two queries: every slot is locked and claimable now.
            v_node := d.id;
        END IF;
        WITH ins AS (
            INSERT INTO allocation_resource_claims
                (allocation_id, node_id, slot_id, slot_index, claim_kind, status, resource_snapshot)
            SELECT a.id, v_node, s.id, s.slot_index, 'slot', 'reserved', to_jsonb(ROW(
                       a.id, a.tenant, a.sku, a.capacity_shape, a.gpu_count, a.region, p_node, p_profile, a.image,
                       a.ssh_keys, ROW(a.gpu_hourly_price_minor, a.currency)::gpuaas_snapshot_price, p_revision, now(),
                       s.gpu_count, ROW(s.slot_index, s.gpu_pci_address, s.gpu_uuid, s.gpu_model,
                                        s.fabric_vf_pci_address, s.network_fabric, s.nvme_device, s.mac_address,
                                        host(s.private_ip), s.numa_node, s.slot_group)::gpuaas_snapshot_slot
                   )::gpuaas_slot_claim_snapshot)
            FROM node_resource_slots s
            WHERE s.node_id = v_node AND s.slot_index = ANY (p_slot_indexes)
            ORDER BY s.slot_index
            RETURNING id
        )
        SELECT array_agg(id) INTO claim_ids FROM ins;
    END IF;

    -- Slots reserved (their guard sees the claims above), allocation placed, event written.
    WITH slots AS (
        UPDATE node_resource_slots s SET status = 'reserved', updated_at = now()
        WHERE p_claim_kind = 'slot' AND s.node_id = v_node AND s.slot_index = ANY (p_slot_indexes)
    ), placed AS (
        UPDATE allocations SET
            status = 'reserved', capacity_shape = a.capacity_shape, node_id = v_node,
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
        'claim_kind', p_claim_kind, 'claim_ids', to_jsonb(claim_ids),
        'slot_indexes', to_jsonb(coalesce(p_slot_indexes, '{}')), 'revision', p_revision)
    FROM placed;
    outcome := 'placed';
END
$$;
