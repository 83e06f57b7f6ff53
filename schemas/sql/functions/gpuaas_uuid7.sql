-- An id that sorts by when it was made (UUID version 7, RFC 9562): 48 bits of Unix time in
-- milliseconds, then gen_random_uuid()'s random bits, with the version nibble set to 7. Rows a COPY
-- loads get ids in load order, ids a millisecond apart sort apart (within one they are random).
-- See migration 0088 for why.
CREATE OR REPLACE FUNCTION gpuaas_uuid7() RETURNS uuid
LANGUAGE sql VOLATILE PARALLEL SAFE AS $$
    SELECT encode(
        set_bit(set_bit(
            overlay(uuid_send(gen_random_uuid())
                    PLACING substring(int8send(floor(extract(epoch FROM clock_timestamp()) * 1000)::bigint) FROM 3)
                    FROM 1 FOR 6),
            52, 1), 53, 1),
        'hex')::uuid
$$;
