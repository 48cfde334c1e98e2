-- outbox-relay schema, version 12: a claim is bounded by bytes as well as by rows. Placeholders as
-- in 005. Runs in one transaction; writers and relays keep running (it adds a function).
--
-- A claim returned up to batch_size rows whatever their size, and the relay held about twice what
-- it claimed (the result, then the events): 30 pending events of 20 MiB took it to 1,249 MiB of
-- memory (bench/RESULTS.md, "What a claim of large events costs in memory"), so a writer of a few
-- hundred large events could run it out of memory at every start, and every key stalled.
--
-- {{fn}}_claim gets a 14th argument, p_max_bytes: the chosen rows are cut where their bytes reach
-- it, in id order (the first row always goes, so a claim holds at most p_max_bytes plus its last
-- event). A cut claim bounds every lane at its last row, as a full choice with a row skipped does,
-- so that the next claim or poll looks from there. NULL: no bound (the 13-argument function stays
-- for a relay of schema 11 while it runs; migrate keeps it).
--
-- An event's bytes: its topic's and key's (their lengths, read without fetching them), and its
-- headers' and payload's as stored, where a value stored compressed counts as the most its method
-- can stand for: 88 times its stored size for pglz (a 3-byte tag for 273 bytes), 255 for lz4. So
-- the bound holds whatever the payload, at no cost (nothing is fetched or decompressed: measuring
-- a compressed payload as text cost Postgres ~5 ms per MB, and took a drain of 30 pending events
-- of 20 MiB from 9.4 s to 14.4 s); claims of compressed events are smaller than they need be (a
-- 100 kB JSON payload that compresses 4 times counts as 2.2 MB: ~30 to a claim of 64 MiB).
DO $bounded_by_bytes$
DECLARE
  v_old_fn regprocedure := to_regprocedure(
             '{{fn}}_claim(text, bigint, smallint[], integer, bigint, boolean, bigint[], jsonb, boolean, bigint, '
             'bigint[], bigint[], timestamptz)');
  v_def    text;
  v_pairs  constant text[][] := ARRAY[
    ARRAY['-- it. With a full choice and a row skipped, every lane''s bound is the last row chosen.',
          '-- it. With a full choice and a row skipped, or a choice cut by bytes (schema 12), every lane''s bound is the last row chosen.'],
    -- The signature: one argument more (a new function beside the 13-argument one).
    ARRAY['p_created_upto timestamp with time zone)', 'p_created_upto timestamp with time zone, p_max_bytes bigint)'],
    -- The candidates as before, with their bytes; chosen: those before the cut.
    ARRAY[E'WITH chosen AS MATERIALIZED (\n        SELECT c.id, c.lane::smallint AS lane\n',
          E'WITH candidates AS MATERIALIZED (\n        SELECT c.id, c.lane::smallint AS lane,\n'
          '               (octet_length(c.topic) + octet_length(c.aggregate_id)\n'
          '                + pg_column_size(c.headers)::int8 * CASE pg_column_compression(c.headers)\n'
          '                                                      WHEN ''pglz'' THEN 88 WHEN ''lz4'' THEN 255 ELSE 1 END\n'
          '                + pg_column_size(c.payload)::int8 * CASE pg_column_compression(c.payload)\n'
          '                                                WHEN ''pglz'' THEN 88 WHEN ''lz4'' THEN 255 ELSE 1 END)::int8 AS bytes\n'],
    ARRAY[E'         ORDER BY c.id LIMIT p_limit),\n      locked AS MATERIALIZED (\n',
          E'         ORDER BY c.id LIMIT p_limit),\n'
          '      chosen AS MATERIALIZED (\n'
          '        SELECT r.id, r.lane\n'
          '          FROM (SELECT f.id, f.lane, sum(f.bytes) OVER (ORDER BY f.id) - f.bytes AS before\n'
          '                  FROM candidates AS f) AS r\n'
          '         WHERE p_max_bytes IS NULL OR r.before < p_max_bytes),\n'
          '      locked AS MATERIALIZED (\n'],
    -- The bounds: a cut claim's are at its last row chosen, in every lane.
    ARRAY['CASE WHEN NOT EXISTS (SELECT 1 FROM stop) THEN v_hi',
          'CASE WHEN NOT EXISTS (SELECT 1 FROM stop) AND (SELECT count(*) FROM candidates) = (SELECT count(*) FROM chosen) THEN v_hi'],
    ARRAY['CASE WHEN (SELECT count(*) FROM chosen) >= p_limit',
          'CASE WHEN (SELECT count(*) FROM chosen) >= p_limit OR (SELECT count(*) FROM candidates) > (SELECT count(*) FROM chosen)']];
BEGIN
  IF to_regprocedure('{{fn}}_claim(text, bigint, smallint[], integer, bigint, boolean, bigint[], jsonb, boolean, '
                     'bigint, bigint[], bigint[], timestamptz, bigint)') IS NOT NULL THEN
    RETURN;
  END IF;
  IF v_old_fn IS NULL THEN
    RAISE EXCEPTION 'outbox-relay: {{fn}}_claim (schema 10) is missing'
      USING HINT = 'schema 10 creates it; restore it from schema/ and migrate again';
  END IF;
  v_def := pg_get_functiondef(v_old_fn);
  FOR i IN 1..array_length(v_pairs, 1) LOOP
    IF (length(v_def) - length(replace(v_def, v_pairs[i][1], ''))) / length(v_pairs[i][1]) <> 1 THEN
      RAISE EXCEPTION 'outbox-relay: % does not hold the text schema 12 changes: %', v_old_fn, v_pairs[i][1]
        USING HINT = 'the function was changed by hand; restore it from schema/ (010, 011) and migrate again';
    END IF;
    v_def := replace(v_def, v_pairs[i][1], v_pairs[i][2]);
  END LOOP;
  EXECUTE v_def;
END
$bounded_by_bytes$;

REVOKE ALL ON FUNCTION {{fn}}_claim(text, bigint, smallint[], integer, bigint, boolean, bigint[], jsonb, boolean,
                                         bigint, bigint[], bigint[], timestamptz, bigint) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION {{fn}}_claim(text, bigint, smallint[], integer, bigint, boolean, bigint[], jsonb, boolean,
                                            bigint, bigint[], bigint[], timestamptz, bigint) TO {{relay_role}};
