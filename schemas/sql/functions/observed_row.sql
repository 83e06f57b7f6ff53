-- A trigger of the observed-state change log (defined by 0086; see that migration).
CREATE OR REPLACE FUNCTION observed_row() RETURNS trigger
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, public AS $$
BEGIN
    INSERT INTO public.observed_changes (kind, key)
    VALUES (TG_ARGV[0], to_jsonb(CASE WHEN TG_OP = 'DELETE' THEN OLD ELSE NEW END) ->> TG_ARGV[1]);
    RETURN NULL;
END
$$;
