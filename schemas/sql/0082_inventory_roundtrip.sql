-- Every field of the desired state is stored, so the store rebuilds it exactly
-- (reconciler.store.views.desired_state, tested as the inverse of the inventory rows).
-- NULL in the Fleet's new columns: a row synced before this migration; the next sync fills them.

ALTER TABLE fleet_settings
    ADD COLUMN regions jsonb
        CONSTRAINT fleet_regions_shape CHECK (regions IS NULL OR jsonb_typeof(regions) = 'array'),
    ADD COLUMN ingress jsonb
        CONSTRAINT fleet_ingress_shape CHECK (ingress IS NULL OR jsonb_typeof(ingress) = 'object'),
    ADD COLUMN machine_providers jsonb
        CONSTRAINT fleet_machine_providers_shape CHECK (
            machine_providers IS NULL OR jsonb_typeof(machine_providers) = 'array');

ALTER TABLE sku_catalog
    ADD COLUMN same_node_required boolean NOT NULL DEFAULT true,
    ADD COLUMN readiness_timeout_seconds integer
        CONSTRAINT sku_readiness_timeout CHECK (readiness_timeout_seconds BETWEEN 30 AND 900);

ALTER TABLE nodes
    ADD COLUMN machine jsonb
        CONSTRAINT nodes_machine_shape CHECK (machine IS NULL OR jsonb_typeof(machine) = 'object');
