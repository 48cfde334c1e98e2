-- outbox-relay schema, version 9: the lane mark moves from a CHECK constraint into the lane
-- column's type. Placeholders as in 005. Runs in one transaction; writers keep running: the lane
-- column changes to a domain over smallint that has no constraint yet, which needs no rewrite and
-- no scan (the table lock for a moment; migrate waits at most 100 ms for it and tries again), and
-- the domain's constraint is added NOT VALID (no stored value is checked).
--
-- Why. Schema 5's CHECK is read from its stored text and planned again at every start of an
-- INSERT statement (PostgreSQL builds a table's CHECK expressions once per executor start, so a
-- prepared single-row INSERT pays it per row), while a domain's CHECK is planned once per session
-- and kept in the type cache. On one backend (30,000 single-row transactions from a procedure,
-- synchronous_commit off, median of 16 rounds; bench/RESULTS.md, "The lane mark in the lane's
-- type"): 40.3 us per transaction without marks, 48.3 with schema 8's, 46.7 with this one.
--
-- Schema 5's argument holds as it stands. The lane mark is the same lock ({{mark_ns}}, lane),
-- taken for each row when its lane is computed: the stored generated column, after the row's
-- BEFORE triggers and before its constraints, so after its id is drawn, as the CHECK was. The
-- statement mark (schema 6, in the id's default) still covers a row between its id and its mark.
-- Two things differ, neither about an id that may still commit:
--  - An UPDATE that leaves aggregate_id alone does not compute the lane again and takes no mark:
--    the relay's own marks, leases and retries, or an operator's UPDATE. It draws no id. (Schema
--    5's CHECK took the mark for every UPDATE of a pending row.)
--  - An INSERT of a row that is already processed takes the mark too (the CHECK skipped it).
--
-- If a view, a rule or a policy uses the lane column, its type cannot change: the CHECK stays,
-- writers pay what they paid with schema 8, and migrate says so with a warning.

DO $lane_type$
DECLARE
  v_table  regclass := '{{table}}'::regclass;
  v_domain text := format('%I.%I', (SELECT n.nspname FROM pg_class AS c JOIN pg_namespace AS n ON n.oid = c.relnamespace
                                      WHERE c.oid = '{{table}}'::regclass), '{{name}}_lane');
BEGIN
  BEGIN
    EXECUTE format('CREATE DOMAIN %s AS smallint', v_domain);
    EXECUTE format('ALTER TABLE {{table}} ALTER COLUMN lane TYPE %s', v_domain);
    EXECUTE format('ALTER DOMAIN %s ADD CONSTRAINT %I CHECK (pg_try_advisory_xact_lock_shared({{mark_ns}}, VALUE)) NOT VALID',
                   v_domain, '{{name}}_lane_mark');
    ALTER TABLE {{table}} DROP CONSTRAINT IF EXISTS {{name}}_lane_mark;
  EXCEPTION WHEN feature_not_supported THEN
    -- "cannot alter type of a column used by a view or rule" (or a policy, a trigger's WHEN).
    RAISE WARNING 'outbox-relay: the lane mark stays a CHECK constraint on %: %', v_table, SQLERRM
      USING HINT = format('writers pay more for a CHECK (schema/009); to move it: drop what uses %s.lane, then run '
                          'CREATE DOMAIN %s AS smallint; ALTER TABLE %s ALTER COLUMN lane TYPE %s; ALTER DOMAIN %s '
                          'ADD CONSTRAINT %I CHECK (pg_try_advisory_xact_lock_shared({{mark_ns}}, VALUE)) NOT VALID; '
                          'ALTER TABLE %s DROP CONSTRAINT %I; in one transaction, and create it again',
                          v_table, v_domain, v_table, v_domain, v_domain, '{{name}}_lane_mark', v_table,
                          '{{name}}_lane_mark');
  END;
END
$lane_type$;
