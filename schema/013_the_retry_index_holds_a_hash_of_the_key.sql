-- outbox-relay schema, version 13: the retry index holds a hash of the key, not the key. Placeholders
-- as in 005. Writers and relays keep running: migrate builds the new index first with CREATE INDEX
-- CONCURRENTLY, outside its transaction, when the table exists (an index of a pending migration
-- is always built so; migrations.cpp), so the CREATE INDEX below finds it and does nothing; then,
-- in its transaction, it rewrites the claim functions and drops the old index (the table lock for
-- a moment; migrate waits at most 100 ms for it and tries again).
--
-- Why. The retry index (schema 1) held (aggregate_id, id), and a B-tree entry holds at most 2,704
-- bytes: a failed attempt at an event whose key is longer (the contract sets no limit) could not
-- be recorded (SQLSTATE 54000), so the relay dead-lettered it at its first failure, however
-- transient (issue 42's seventh hole, closed so that the other keys flowed on). Now the entry is
-- (hashtextextended(aggregate_id, 0), id): 16 bytes whatever the key, and such an event is retried
-- as any other.
--
-- What reads it: the head-of-line rule (schema 7) of the claim functions and of the relay's lean
-- poll. "An earlier failed event of the same key waits" becomes a range of the new index (the
-- key's hash, ids below the event's) whose rows are then compared by key, so a hash shared by two
-- keys costs a row read, never a wrong answer. "Does any event wait for a retry" reads the new
-- index in its order.

-- Built here, in the transaction, only when migrate could not build it first: a table this same
-- run creates, or a build that failed (migrate says so).
CREATE INDEX IF NOT EXISTS {{name}}_retry_hash_idx ON {{table}} (pg_catalog.hashtextextended(aggregate_id, 0), id)
  WHERE processed_at IS NULL AND dead_lettered_at IS NULL AND attempts > 0;

DO $retry_by_key_hash$
DECLARE
  v_fn    regprocedure;
  v_def   text;
  v_index regclass := to_regclass('{{schema}}.{{name}}_retry_hash_idx');
  -- Each old text, how many times each function holds it, and its new text.
  v_pairs constant text[][] := ARRAY[
    ARRAY['ORDER BY w.aggregate_id, w.id LIMIT 1', '1',
          'ORDER BY pg_catalog.hashtextextended(w.aggregate_id, 0), w.id LIMIT 1'],
    ARRAY['ORDER BY r.aggregate_id, r.id LIMIT 1', '2',
          'ORDER BY pg_catalog.hashtextextended(r.aggregate_id, 0), r.id LIMIT 1'],
    ARRAY['WHERE (b.aggregate_id, b.id) >= (c.aggregate_id, 0) AND (b.aggregate_id, b.id) < (c.aggregate_id, c.id)', '1',
          'WHERE pg_catalog.hashtextextended(b.aggregate_id, 0) = pg_catalog.hashtextextended(c.aggregate_id, 0) '
          'AND b.id < c.id AND b.aggregate_id = c.aggregate_id'],
    ARRAY['ORDER BY b.aggregate_id, b.id LIMIT 1', '1',
          'ORDER BY pg_catalog.hashtextextended(b.aggregate_id, 0), b.id LIMIT 1']];
BEGIN
  -- Another migrate's build still running (CREATE INDEX IF NOT EXISTS found its entry): try again.
  IF NOT (SELECT i.indisvalid AND i.indisready FROM pg_index AS i WHERE i.indexrelid = v_index) THEN
    RAISE EXCEPTION 'outbox-relay: the index %_retry_hash_idx is being built by another session', '{{name}}'
      USING ERRCODE = '55P03', HINT = 'run migrate again when that build ends; an index left invalid is built again';
  END IF;
  -- The claim function of schemas 10-11 (for a relay of that release while it runs) and of 12.
  FOR v_fn IN
    SELECT f FROM unnest(ARRAY[
      to_regprocedure('{{fn}}_claim(text, bigint, smallint[], integer, bigint, boolean, bigint[], jsonb, boolean, '
                      'bigint, bigint[], bigint[], timestamptz)'),
      to_regprocedure('{{fn}}_claim(text, bigint, smallint[], integer, bigint, boolean, bigint[], jsonb, boolean, '
                      'bigint, bigint[], bigint[], timestamptz, bigint)')]) AS f
     WHERE f IS NOT NULL
  LOOP
    v_def := pg_get_functiondef(v_fn);
    CONTINUE WHEN position('hashtextextended' IN v_def) > 0;
    FOR i IN 1..array_length(v_pairs, 1) LOOP
      IF (length(v_def) - length(replace(v_def, v_pairs[i][1], ''))) / length(v_pairs[i][1]) <> v_pairs[i][2]::int THEN
        RAISE EXCEPTION 'outbox-relay: % does not hold the text schema 13 changes: %', v_fn, v_pairs[i][1]
          USING HINT = 'the function was changed by hand; restore it from schema/ (010-012) and migrate again';
      END IF;
      v_def := replace(v_def, v_pairs[i][1], v_pairs[i][3]);
    END LOOP;
    EXECUTE v_def;
  END LOOP;
END
$retry_by_key_hash$;

DROP INDEX IF EXISTS {{schema}}.{{name}}_retry_idx;
