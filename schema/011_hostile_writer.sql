-- outbox-relay schema, version 11: what a writer cannot make the relay do (issue 43). Placeholders
-- as in 005. Runs in one transaction; writers and relays keep running (it replaces two functions).
--
-- 1. Read another session's query text.
-- {{fn}}_writers() is SECURITY DEFINER (it reads pg_locks and pg_stat_activity as their owner,
-- so that a relay role without pg_read_all_stats sees every writer's locks and state). Through it
-- the relay's role read the current query of any session writing to the outbox, literals and all
-- (a writer's `... card = '4111...'`), where pg_stat_activity shows it `<insufficient privilege>`.
-- Now the text follows Postgres's own rule, judged for the role the relay logged in as
-- (session_user; current_user is the function's owner here): the role of the writer's session, or
-- a role that has pg_read_all_stats. An operator who wants the query text in the writer-hold
-- report opts in with `GRANT pg_read_all_stats TO <the relay's role>`; nothing else changes.
DO $query_text$
DECLARE
  v_fn  regprocedure := to_regprocedure('{{fn}}_writers()');
  v_def text;
  v_old constant text := 'array_agg(left(a.query, 200))';
  v_new constant text := $new$array_agg(CASE WHEN pg_has_role(session_user, a.usesysid, 'USAGE')
                                        OR pg_has_role(session_user, 'pg_read_all_stats', 'USAGE')
                                   THEN left(a.query, 200) ELSE '<insufficient privilege>' END)$new$;
BEGIN
  IF v_fn IS NULL THEN
    RAISE EXCEPTION 'outbox-relay: {{fn}}_writers() is missing'
      USING HINT = 'schema 10 creates it; restore it from schema/ and migrate again';
  END IF;
  v_def := pg_get_functiondef(v_fn);
  IF position('pg_read_all_stats' IN v_def) > 0 THEN
    RETURN;
  END IF;
  IF position(v_old IN v_def) = 0 THEN
    RAISE EXCEPTION 'outbox-relay: % does not hold the expression schema 11 patches', v_fn
      USING HINT = 'the function was changed by hand; restore it from schema/010 and migrate again';
  END IF;
  EXECUTE replace(v_def, v_old, v_new);  -- CREATE OR REPLACE: same owner, same grants
END
$query_text$;

-- 2. Stall every key with one row. created_at is the writer's to set (its default is now()); a row
--    with created_at = 'infinity' failed the claim's cast of its epoch microseconds to int8
--    (bigint out of range), so no claim returned anything until the row was gone. The claim now
--    returns NULL for a time the relay cannot carry (RFC 3339 has the years 0001 to 9999), and the
--    relay dead-letters that row with the reason (its lean poll's statements do the same).
DO $created_at$
DECLARE
  v_fn  regprocedure := to_regprocedure(
          '{{fn}}_claim(text, bigint, smallint[], integer, bigint, boolean, bigint[], jsonb, boolean, bigint, '
          'bigint[], bigint[], timestamptz)');
  v_def text;
  v_old constant text := '(extract(epoch FROM s.created_at) * 1000000)::int8';
  v_new constant text := 'CASE WHEN extract(epoch FROM s.created_at) BETWEEN -62135596800 AND 253402300799.999999 '
                         'THEN (extract(epoch FROM s.created_at) * 1000000)::int8 END';
BEGIN
  IF v_fn IS NULL THEN
    RAISE EXCEPTION 'outbox-relay: {{fn}}_claim (schema 10) is missing'
      USING HINT = 'schema 10 creates it; restore it from schema/ and migrate again';
  END IF;
  v_def := pg_get_functiondef(v_fn);
  IF position('253402300799.999999' IN v_def) > 0 THEN
    RETURN;
  END IF;
  IF (length(v_def) - length(replace(v_def, v_old, ''))) / length(v_old) <> 1 THEN
    RAISE EXCEPTION 'outbox-relay: % does not hold the expression schema 11 patches', v_fn
      USING HINT = 'the function was changed by hand; restore it from schema/010 and migrate again';
  END IF;
  EXECUTE replace(v_def, v_old, v_new);  -- CREATE OR REPLACE: same owner, same grants
END
$created_at$;
