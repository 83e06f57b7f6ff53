-- Tenant ingress (issue 32), the desired side: Node.public_addresses, Node.ingress
-- ({"address", "port_first", "port_last"}) and Allocation.extra_ports, mirrored for the sync
-- and read back by status and plan. The endpoints themselves: 0058.

ALTER TABLE nodes
    ADD COLUMN public_addresses text[] NOT NULL DEFAULT '{}',
    ADD COLUMN ingress jsonb
        CONSTRAINT nodes_ingress_shape CHECK (ingress IS NULL OR (jsonb_typeof(ingress) = 'object'
            AND (ingress ->> 'port_first')::integer BETWEEN 1024 AND 65535
            AND (ingress ->> 'port_last')::integer BETWEEN (ingress ->> 'port_first')::integer AND 65535));

ALTER TABLE allocations
    ADD COLUMN extra_ports integer[] NOT NULL DEFAULT '{}';
