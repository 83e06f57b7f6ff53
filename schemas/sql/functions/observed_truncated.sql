-- A trigger of the observed-state change log (defined by 0086; see that migration).
CREATE OR REPLACE FUNCTION observed_truncated() RETURNS trigger
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, public AS $$
BEGIN
    UPDATE public.observed_horizon SET xid = pg_current_xact_id();
    RETURN NULL;
END
$$;
