-- node_liveness (0061) answers for one node without counting the fleet.
--
-- It computed every present node's liveness in a CTE, and each region's disruption from that, before
-- any filter: the portal's GET /api/v1/allocations/{id} (allocation_lifecycle joins node_liveness)
-- read all 10,000 nodes of a fleet for one allocation, about 20 ms, and ten times that at 100,000.
-- Now the view is a plain join that a filter on the node reaches (an index lookup), and the regions in
-- a disruption (gpuaas_disrupted_regions) are counted once per query, and only when a row asks: a
-- silent node's liveness, or region_disrupted. The same columns, types and answers.
\ir functions/gpuaas_disrupted_regions.sql

CREATE OR REPLACE VIEW node_liveness AS
SELECT n.name AS node_name, h.reported_at,
       coalesce((SELECT host_liveness_ttl_s FROM fleet_settings), 90) AS ttl_s,
       CASE WHEN h.node_name IS NULL THEN NULL
            ELSE round(extract(epoch FROM now() - h.reported_at)::numeric, 1) END AS silent_s,
       CASE WHEN h.node_name IS NULL THEN 'unknown'
            WHEN h.reported_at < now() - make_interval(secs => coalesce((SELECT host_liveness_ttl_s FROM fleet_settings), 90))
                 AND n.region = ANY ((SELECT gpuaas_disrupted_regions())::text[]) THEN 'disrupted'
            WHEN h.reported_at < now() - make_interval(secs => coalesce((SELECT host_liveness_ttl_s FROM fleet_settings), 90))
                 THEN 'unavailable'
            ELSE 'live' END AS liveness,
       n.region,
       -- (SELECT ...)::text[]: one evaluation per query (an init plan), run at the first row that needs it.
       n.region = ANY ((SELECT gpuaas_disrupted_regions())::text[]) AS region_disrupted
FROM nodes n
LEFT JOIN host_status h ON h.node_name = n.name
WHERE n.present;
