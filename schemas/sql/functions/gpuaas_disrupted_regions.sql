-- The regions in a zone disruption now (migration 0061's rule): more than 2 of the region's present
-- nodes silent (reported once, nothing within the fleet's host_liveness_ttl_s) and more than
-- zone_disruption_fraction of those that ever reported. Sorted; '{}' when none. A whole-fleet count,
-- so node_liveness asks for it only when a node it returns is silent (see migration 0089).
CREATE OR REPLACE FUNCTION gpuaas_disrupted_regions() RETURNS text[]
LANGUAGE sql STABLE AS $$
    WITH f AS (
        SELECT coalesce((SELECT host_liveness_ttl_s FROM fleet_settings), 90) AS ttl,
               coalesce((SELECT zone_disruption_fraction FROM fleet_settings), 0.55) AS fraction
    ), base AS (
        SELECT n.region, h.node_name IS NOT NULL AS reported,
               (h.node_name IS NOT NULL AND h.reported_at < now() - make_interval(secs => f.ttl)) AS silent
        FROM nodes n
        LEFT JOIN host_status h ON h.node_name = n.name
        CROSS JOIN f
        WHERE n.present
    )
    SELECT coalesce(array_agg(d.region ORDER BY d.region), '{}') FROM (
        SELECT b.region FROM base b CROSS JOIN f
        GROUP BY b.region, f.fraction
        HAVING count(*) FILTER (WHERE b.silent) > 2
           AND count(*) FILTER (WHERE b.silent) > f.fraction * count(*) FILTER (WHERE b.reported)
    ) d
$$;
