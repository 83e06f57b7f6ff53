-- Host plan specs are a few KB of JSON each: every one is TOAST-compressed when written and
-- decompressed when compared (the upsert) or read (a host's long poll). lz4 does both several times
-- faster than the default pglz; a cold apply of 10,000 nodes spent a sixth of its host plan
-- server time compressing. Rows already stored keep pglz until rewritten (both read alike).
-- A server built without lz4 keeps pglz.
DO $$
BEGIN
    ALTER TABLE host_plans ALTER COLUMN spec SET COMPRESSION lz4;
EXCEPTION WHEN feature_not_supported THEN
    RAISE NOTICE 'host_plans.spec stays pglz: this server has no lz4';
END
$$;
