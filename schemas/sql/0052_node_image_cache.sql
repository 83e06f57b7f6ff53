-- The image cache of every node (issue 11; seed 002's data model: node_image_cache).
--
-- Each host reconciler pass replaces its node's rows with what its cache holds
-- (host_reconciler/store.py, write_status, in the status transaction): one row
-- per verified image, addressed by its sha256, with its size and when a
-- provision last used it. The central reconciler reads the table into the
-- planner's observed state (reconciler/store/observing.py), where placement
-- may prefer, among equally packed candidates, a node that already caches the
-- allocation's image.
--
-- A node role writes only its own node's rows (row-level security, as 0050),
-- and a report is untrusted input (as 0008): the digest must be a sha256 in
-- lowercase hex, sizes are not negative, and one node keeps at most 4096 rows.

CREATE TABLE node_image_cache (
    node_name     text NOT NULL REFERENCES nodes (name),
    digest_sha256 text NOT NULL CHECK (digest_sha256 ~ '^[0-9a-f]{64}$'),
    size_bytes    bigint NOT NULL CHECK (size_bytes >= 0),
    last_used_at  timestamptz NOT NULL,
    reported_at   timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (node_name, digest_sha256)
);

-- "Which nodes cache this image?" (placement's tie-break).
CREATE INDEX node_image_cache_digest ON node_image_cache (digest_sha256);

CREATE FUNCTION gpuaas_node_image_cache_cap() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    IF (SELECT count(*) FROM node_image_cache WHERE node_name = NEW.node_name) >= 4096 THEN
        RAISE EXCEPTION 'node % reports more than 4096 cached images', NEW.node_name
            USING ERRCODE = 'check_violation';
    END IF;
    RETURN NEW;
END
$$;

CREATE TRIGGER node_image_cache_cap BEFORE INSERT ON node_image_cache
    FOR EACH ROW EXECUTE FUNCTION gpuaas_node_image_cache_cap();

ALTER TABLE node_image_cache ENABLE ROW LEVEL SECURITY;

CREATE POLICY node_image_cache_own_node ON node_image_cache
    FOR ALL TO gpuaas_host
    USING (node_name = gpuaas_current_node())
    WITH CHECK (node_name = gpuaas_current_node());

GRANT SELECT, INSERT, UPDATE, DELETE ON node_image_cache TO gpuaas_host;
