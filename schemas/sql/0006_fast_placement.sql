-- Faster placements, same guards (measured in docs/claims.md, "Throughput").
--
-- 1. Value checks on the columns a placement writes become domains. PostgreSQL
--    re-reads every table CHECK constraint from its stored node tree at each
--    INSERT/UPDATE statement (ExecRelCheck -> stringToNode), so the nine checks
--    on claims, slots and allocations cost 15% of a placement; a domain's check
--    is parsed once per session (typcache) and evaluated only when the column
--    is assigned. Seven of them become domains: same values allowed, same
--    SQLSTATE (23514, check_violation).
--    Reading a column gives its base type (text, integer); only an array built
--    from one (array_agg(status)) has the domain's array type, which clients
--    do not know: cast first (array_agg(status::text)). claims_kind_shape spans
--    columns and slot_index is a key (foreign keys, aggregated by readers), so
--    both stay table constraints. The claims' unique index and exclusion
--    constraint are rebuilt in their 0003 order (the unique index answers first).
-- 2. gpuaas_place returns one row (OUT parameters, not SETOF), so PL/pgSQL can
--    call it as a plain expression; it runs four statements instead of eight
--    on the way to 'placed'. The slot lock keeps only claimable slots and
--    counts them; the detailed query of 0004 (why a slot or node is refused)
--    and the distinct-slots query run only when fewer were locked than asked
--    for. The slots, allocation and outbox writes are one statement. Claim
--    snapshots are built from composite types (to_jsonb of a row costs a third
--    less than jsonb_build_object: no per-key type lookups); the JSON is the
--    same. Locks, checks, outcomes and messages are unchanged.
-- 3. allocations get fillfactor 50: a placement makes the row ~200 bytes longer,
--    and at 85 four in ten placement updates found no room on their page (no
--    HOT update: a second heap page and a primary-key entry per placement).
-- 4. gpuaas_place_batch: many placements in one round trip, still one
--    transaction per placement. A procedure, so it can COMMIT: each attempt
--    calls gpuaas_place, then commits (placed) or rolls back (anything else),
--    and a lost race moves on to the placement's next candidate. A database
--    refusal (integrity, serialization, deadlock, lock not available) stops
--    the batch with what it knows, so the caller decides, as for one call.

DROP VIEW allocation_usage;
DROP VIEW claim_usage;
DROP TRIGGER slots_guard_status ON node_resource_slots;

CREATE DOMAIN gpuaas_claim_kind AS text
    CHECK (VALUE IN ('node_exclusive', 'slot'));
CREATE DOMAIN gpuaas_claim_status AS text
    CHECK (VALUE IN ('reserved', 'provisioning', 'active', 'releasing', 'released', 'failed'));
CREATE DOMAIN gpuaas_slot_status AS text
    CHECK (VALUE IN ('available', 'reserved', 'provisioning', 'active', 'releasing',
                     'cleanup', 'cleanup_blocked', 'failed', 'disabled'));
CREATE DOMAIN gpuaas_gpu_count AS integer
    CHECK (VALUE BETWEEN 1 AND 8);
CREATE DOMAIN gpuaas_desired_state AS text
    CHECK (VALUE IN ('present', 'released'));
CREATE DOMAIN gpuaas_allocation_status AS text
    CHECK (VALUE IN ('pending', 'reserved', 'provisioning', 'active', 'releasing', 'released', 'failed'));
CREATE DOMAIN gpuaas_capacity_shape AS text
    CHECK (VALUE IN ('baremetal', 'gpu_slice'));

DROP INDEX claims_one_live_per_slot;
ALTER TABLE allocation_resource_claims
    DROP CONSTRAINT claims_node_exclusive,
    DROP CONSTRAINT allocation_resource_claims_claim_kind_check,
    DROP CONSTRAINT allocation_resource_claims_status_check,
    ALTER COLUMN claim_kind TYPE gpuaas_claim_kind,
    ALTER COLUMN status TYPE gpuaas_claim_status;
CREATE UNIQUE INDEX claims_one_live_per_slot ON allocation_resource_claims (slot_id)
    WHERE slot_id IS NOT NULL AND status IN ('reserved', 'provisioning', 'active', 'releasing');
ALTER TABLE allocation_resource_claims ADD CONSTRAINT claims_node_exclusive
    EXCLUDE USING gist (node_id WITH =, claim_span WITH &&)
    WHERE (status IN ('reserved', 'provisioning', 'active', 'releasing'));

ALTER TABLE node_resource_slots
    DROP CONSTRAINT node_resource_slots_status_check,
    ALTER COLUMN status TYPE gpuaas_slot_status;

ALTER TABLE allocations
    DROP CONSTRAINT allocations_gpu_count_check,
    DROP CONSTRAINT allocations_desired_state_check,
    DROP CONSTRAINT allocations_status_check,
    DROP CONSTRAINT allocations_capacity_shape_check,
    ALTER COLUMN gpu_count TYPE gpuaas_gpu_count,
    ALTER COLUMN desired_state TYPE gpuaas_desired_state,
    ALTER COLUMN status TYPE gpuaas_allocation_status,
    ALTER COLUMN capacity_shape TYPE gpuaas_capacity_shape;

CREATE TRIGGER slots_guard_status BEFORE UPDATE OF status ON node_resource_slots
    FOR EACH ROW EXECUTE FUNCTION slots_guard_status();

-- A session that ran these PL/pgSQL functions before the retyping keeps their
-- compiled form, prepared for text: "type of parameter ... does not match that
-- when preparing the plan". Rewriting their pg_proc rows (same settings) makes
-- every session compile them again on next use.
ALTER FUNCTION claims_guard_insert() COST 100;
ALTER FUNCTION claims_guard_update() COST 100;
ALTER FUNCTION slots_guard_status() COST 100;
ALTER FUNCTION gpuaas_release(text, text) COST 100;
ALTER FUNCTION gpuaas_free_cleaned(text) COST 100;
ALTER FUNCTION gpuaas_absorb_vm_states(text) COST 100;

ALTER TABLE allocations SET (fillfactor = 50);

-- The shape of a slot claim's resource_snapshot (to_jsonb of these rows).
CREATE TYPE gpuaas_snapshot_image AS (
    slug text, version text, source_ref text, digest_sha256 text, image_format text, default_username text);
CREATE TYPE gpuaas_snapshot_price AS (gpu_hourly_price_minor integer, currency text);
CREATE TYPE gpuaas_snapshot_slot AS (
    slot_index integer, gpu_pci_address text, gpu_uuid text, gpu_model text, fabric_vf_pci_address text,
    network_fabric text, nvme_device text, mac_address text, private_ip text, numa_node integer, slot_group text);
CREATE TYPE gpuaas_slot_claim_snapshot AS (
    allocation_id text, tenant text, sku text, capacity_shape text, allocation_gpu_count integer, region text,
    node text, profile jsonb, image jsonb, ssh_keys text[], price gpuaas_snapshot_price, revision text,
    claimed_at timestamptz, gpus integer, slot gpuaas_snapshot_slot);

-- The usage views of 0005, unchanged (they depend on retyped columns).
CREATE VIEW claim_usage AS
SELECT c.id AS claim_id,
       c.allocation_id,
       n.name AS node,
       c.slot_index,
       c.claim_kind,
       (c.resource_snapshot ->> 'gpus')::integer AS gpus,
       c.active_at AS usage_started_at,
       c.release_requested_at AS usage_ended_at,
       ((c.resource_snapshot ->> 'gpus')::integer
        * extract(epoch FROM (coalesce(c.release_requested_at, now()) - c.active_at)) / 3600.0)::numeric(14, 4)
           AS gpu_hours,
       (c.resource_snapshot -> 'price' ->> 'gpu_hourly_price_minor')::integer AS gpu_hourly_price_minor,
       c.resource_snapshot -> 'price' ->> 'currency' AS currency
FROM allocation_resource_claims c
JOIN nodes n ON n.id = c.node_id
WHERE c.active_at IS NOT NULL;

CREATE VIEW allocation_usage AS
SELECT u.allocation_id,
       a.tenant,
       a.sku,
       a.capacity_shape,
       min(u.node) AS node,
       sum(u.gpus)::integer AS gpus,
       count(*)::integer AS claims,
       min(u.usage_started_at) AS usage_started_at,
       CASE WHEN bool_and(u.usage_ended_at IS NOT NULL) THEN max(u.usage_ended_at) END AS usage_ended_at,
       sum(u.gpu_hours)::numeric(14, 4) AS gpu_hours,
       max(u.gpu_hourly_price_minor) AS gpu_hourly_price_minor,
       max(u.currency) AS currency,
       round(sum(u.gpu_hours * u.gpu_hourly_price_minor))::bigint AS amount_minor
FROM claim_usage u
JOIN allocations a ON a.id = u.allocation_id
GROUP BY u.allocation_id, a.tenant, a.sku, a.capacity_shape;


-- gpuaas_place: as in 0004 (see there), one row out.
DROP FUNCTION gpuaas_place(text, text, integer[], text, jsonb, text, text);

CREATE FUNCTION gpuaas_place(
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


-- gpuaas_place_batch: placement i is p_allocations[i] (claim kind, profile and
-- image alike), with candidates p_counts[i] consecutive entries of p_nodes /
-- p_slots (p_slots holds int[] literals such as '{0,1}'). Every attempt is its
-- own transaction. Out: one entry per attempt made, in order: the placement
-- (1-based), its candidate (1-based), the outcome and detail, the claim ids.
-- A placement stops at 'placed', 'busy', 'not_pending' or 'unknown', or when
-- its candidates run out. A refusal raised by the database (outcome 'error',
-- detail the message, plus r_sqlstate and r_constraint) ends the batch: what
-- follows it was not attempted.
CREATE PROCEDURE gpuaas_place_batch(
    p_allocations  text[],
    p_claim_kinds  text[],
    p_profiles     jsonb[],
    p_images       text[],
    p_counts       integer[],
    p_nodes        text[],
    p_slots        text[],
    p_revision     text,
    INOUT r_placement  integer[] DEFAULT NULL,
    INOUT r_candidate  integer[] DEFAULT NULL,
    INOUT r_outcome    text[] DEFAULT NULL,
    INOUT r_detail     text[] DEFAULT NULL,
    INOUT r_claim_ids  text[] DEFAULT NULL,
    INOUT r_sqlstate   text DEFAULT NULL,
    INOUT r_constraint text DEFAULT NULL
)
LANGUAGE plpgsql AS $$
DECLARE
    first   integer := 1;
    res     record;
    failed  text;
BEGIN
    r_placement := '{}'; r_candidate := '{}'; r_outcome := '{}'; r_detail := '{}'; r_claim_ids := '{}';
    r_sqlstate := NULL; r_constraint := NULL;
    FOR i IN 1 .. coalesce(cardinality(p_allocations), 0) LOOP
        FOR j IN 1 .. p_counts[i] LOOP
            BEGIN
                res := gpuaas_place(p_allocations[i], p_nodes[first + j - 1], p_slots[first + j - 1]::integer[],
                                    p_claim_kinds[i], p_profiles[i], p_images[i], p_revision);
            EXCEPTION WHEN integrity_constraint_violation OR serialization_failure OR deadlock_detected
                           OR lock_not_available THEN
                GET STACKED DIAGNOSTICS r_sqlstate = RETURNED_SQLSTATE, r_constraint = CONSTRAINT_NAME,
                                        failed = MESSAGE_TEXT;
            END;
            r_placement := r_placement || i;
            r_candidate := r_candidate || j;
            IF r_sqlstate IS NOT NULL THEN
                r_outcome := r_outcome || 'error'::text;
                r_detail := r_detail || failed;
                r_claim_ids := r_claim_ids || NULL::text;
                ROLLBACK;
                RETURN;
            END IF;
            r_outcome := r_outcome || res.outcome;
            r_detail := r_detail || res.detail;
            r_claim_ids := r_claim_ids || array_to_string(res.claim_ids, ',');
            IF res.outcome = 'placed' THEN
                COMMIT;
            ELSE
                ROLLBACK;
            END IF;
            EXIT WHEN res.outcome NOT IN ('lost_race', 'refused');
        END LOOP;
        first := first + p_counts[i];
    END LOOP;
END
$$;
