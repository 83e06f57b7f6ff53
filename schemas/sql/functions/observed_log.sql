-- A trigger of the observed-state change log (defined by 0086; see that migration).
CREATE OR REPLACE FUNCTION observed_log() RETURNS trigger
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, public AS $$
BEGIN
    EXECUTE format('INSERT INTO public.observed_changes (kind, key) SELECT DISTINCT %L, %I FROM %I',
                   TG_ARGV[0], TG_ARGV[1], CASE WHEN TG_OP = 'DELETE' THEN 'old_rows' ELSE 'new_rows' END);
    RETURN NULL;
END
$$;
