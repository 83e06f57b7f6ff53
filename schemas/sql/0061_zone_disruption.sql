-- Mass silence is not mass death (issue 29): the Kubernetes node-lifecycle
-- controller's zone-disruption rule, per region.
--
-- When the hosts of a region go silent together, the likelier cause is the
-- control plane or the network (a `serve` restart, a cut link), not every
-- host dying at once. Marking them all `unavailable` would flag every
-- allocation there `host_unreachable` and steer placement away from a whole
-- region that is, in fact, running. So a region is *disrupted* when more than
-- `zone_disruption_fraction` (default 0.55, the controller's
-- unhealthyZoneThreshold) of its reporting nodes are silent past the TTL and
-- more than two are (the controller's "more than 2 NotReady" guard, so one
-- silent node of a three-node region is still just a silent node). In a
-- disrupted region a silent node's liveness is `disrupted`, not
-- `unavailable`: nothing is marked, nothing moves; `gpuaas status`, the
-- dashboard and /metrics say that the region is disrupted. When enough hosts
-- report again the region is normal and the rule applies node by node.

ALTER TABLE fleet_settings
    ADD COLUMN zone_disruption_fraction real NOT NULL DEFAULT 0.55
        CONSTRAINT fleet_zone_disruption_fraction CHECK (zone_disruption_fraction > 0 AND zone_disruption_fraction <= 1);

CREATE OR REPLACE VIEW node_liveness AS
WITH f AS (
    SELECT coalesce((SELECT host_liveness_ttl_s FROM fleet_settings), 90) AS ttl,
           coalesce((SELECT zone_disruption_fraction FROM fleet_settings), 0.55) AS fraction
), base AS (
    SELECT n.name AS node_name, n.region, h.reported_at, h.node_name IS NOT NULL AS reported, f.ttl,
           (h.node_name IS NOT NULL AND h.reported_at < now() - make_interval(secs => f.ttl)) AS silent
    FROM nodes n
    LEFT JOIN host_status h ON h.node_name = n.name
    CROSS JOIN f
    WHERE n.present
), regions AS (
    SELECT b.region,
           (count(*) FILTER (WHERE b.silent) > 2
            AND count(*) FILTER (WHERE b.silent) > f.fraction * count(*) FILTER (WHERE b.reported)) AS disrupted
    FROM base b CROSS JOIN f
    GROUP BY b.region, f.fraction
)
SELECT b.node_name, b.reported_at, b.ttl AS ttl_s,
       CASE WHEN NOT b.reported THEN NULL
            ELSE round(extract(epoch FROM now() - b.reported_at)::numeric, 1) END AS silent_s,
       CASE WHEN NOT b.reported THEN 'unknown'
            WHEN b.silent AND r.disrupted THEN 'disrupted'
            WHEN b.silent THEN 'unavailable'
            ELSE 'live' END AS liveness,
       b.region,
       r.disrupted AS region_disrupted
FROM base b JOIN regions r ON r.region = b.region;

-- One row per region: for status, the dashboard and /metrics.
CREATE VIEW region_disruption AS
SELECT region, count(*) AS nodes,
       count(*) FILTER (WHERE liveness IN ('unavailable', 'disrupted')) AS silent,
       bool_or(region_disrupted) AS disrupted,
       (SELECT zone_disruption_fraction FROM fleet_settings) AS fraction
FROM node_liveness
GROUP BY region;
