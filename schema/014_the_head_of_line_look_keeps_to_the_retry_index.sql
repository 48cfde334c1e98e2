-- outbox-relay schema, version 14: the head-of-line look of the claim functions keeps to the retry
-- index, whatever the statistics. Placeholders as in 005. Writers and relays keep running: it only
-- rewrites the claim functions, in migrate's transaction.
--
-- Why. Schema 13 wrote the look as `hash(b.key) = hash(c.key) AND b.id < c.id AND b.key = c.key
-- ORDER BY hash(b.key), b.id LIMIT 1`. The key's equality makes the ORDER BY's hash a constant, so
-- the pending index (on id) gives the same order as the retry index, and a plan made while the
-- table is empty (a relay started on a new table: the plan is generic and kept for the session)
-- costs both alike and took the pending index, `id < c.id` as its bound. While an event then
-- waited for its retry, every event a claim chose walked the pending index from its start,
-- through every entry of the rows delivered since the last vacuum: a drain of 100,000 events
-- beside one waiting retry took 22.9 s against 1.3 s for schema 12 (bench/RESULTS.md, "The
-- head-of-line look after a start on an empty table"). Schema 12's form, a range of
-- (key, id) pairs, could only be read from its index: so is this one, on (hash of the key, id),
-- the key's equality kept as a filter (two keys may share a hash).
DO $head_of_line_by_range$
DECLARE
  v_fn  regprocedure;
  v_def text;
  v_old constant text := 'WHERE pg_catalog.hashtextextended(b.aggregate_id, 0) = '
                         'pg_catalog.hashtextextended(c.aggregate_id, 0) AND b.id < c.id AND b.aggregate_id = c.aggregate_id';
  v_new constant text := 'WHERE (pg_catalog.hashtextextended(b.aggregate_id, 0), b.id) >= '
                         '(pg_catalog.hashtextextended(c.aggregate_id, 0), 0) '
                         'AND (pg_catalog.hashtextextended(b.aggregate_id, 0), b.id) < '
                         '(pg_catalog.hashtextextended(c.aggregate_id, 0), c.id) AND b.aggregate_id = c.aggregate_id';
BEGIN
  -- The claim function of schemas 10-11 (for a relay of that release while it runs) and of 12-13.
  FOR v_fn IN
    SELECT f FROM unnest(ARRAY[
      to_regprocedure('{{fn}}_claim(text, bigint, smallint[], integer, bigint, boolean, bigint[], jsonb, boolean, '
                      'bigint, bigint[], bigint[], timestamptz)'),
      to_regprocedure('{{fn}}_claim(text, bigint, smallint[], integer, bigint, boolean, bigint[], jsonb, boolean, '
                      'bigint, bigint[], bigint[], timestamptz, bigint)')]) AS f
     WHERE f IS NOT NULL
  LOOP
    v_def := pg_get_functiondef(v_fn);
    CONTINUE WHEN position(v_new IN v_def) > 0;
    IF (length(v_def) - length(replace(v_def, v_old, ''))) / length(v_old) <> 1 THEN
      RAISE EXCEPTION 'outbox-relay: % does not hold the text schema 14 changes: %', v_fn, v_old
        USING HINT = 'the function was changed by hand; restore it from schema/ (010-013) and migrate again';
    END IF;
    EXECUTE replace(v_def, v_old, v_new);
  END LOOP;
END
$head_of_line_by_range$;
