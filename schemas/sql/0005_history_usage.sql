-- Reconciliation history and usage read models.

-- One row per reconciliation run (`gpuaas apply`, and the watch loop later):
-- which revision, when, how it ended, what it changed.
CREATE TABLE reconciliations (
    id          bigserial PRIMARY KEY,
    revision    text,
    source      text NOT NULL DEFAULT '',
    reconciler  text NOT NULL,               -- host:pid of the process that ran it
    started_at  timestamptz NOT NULL DEFAULT now(),
    finished_at timestamptz,
    result      text NOT NULL DEFAULT 'running' CHECK (result IN ('running', 'changed', 'unchanged', 'error')),
    counts      jsonb NOT NULL DEFAULT '{}',
    errors      jsonb NOT NULL DEFAULT '[]'
);
CREATE INDEX reconciliations_started ON reconciliations (started_at DESC);

-- Usage per claim, from the claim's own times and immutable snapshot: usage
-- starts when the claim became active and stops when its release was requested.
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

-- One usage record per allocation (billing stays allocation-based).
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
