-- outbox-relay schema, version 6: the statement mark of schema 5 (its point 2) moves from a
-- statement-level trigger into the id's default. Placeholders as in 005. Runs in one transaction
-- while writers keep running: it waits for the table lock (every open writer transaction ends
-- first; migrate waits at most 100 ms for it and tries again), holds it for a moment (no scan of
-- the table) and leaves the ids where they were.
--
-- Why. Any trigger on the table costs every INSERT statement a copy of the trigger descriptor and
-- a parse and compile of the trigger's WHEN clause: ~9.5 us per statement, most of what schema 5
-- cost a single-row writer transaction (~14 us over ~22 us), enough to take 32 writers on 2 cores
-- below 0.9 of a table without it (bench/RESULTS.md, "Writer lanes"). The same shared advisory
-- lock taken in the id's default costs ~1-2 us for a statement's first row and a local lookup for
-- each further row.
--
-- The argument of schema 5 holds unchanged: the mark is the same lock ({{statement_ns}}, the
-- statement's start time in microseconds mod 1024: statement_timestamp(), pg_stat_activity's
-- query_start of the top-level statement), and it is taken before the statement's first id is
-- drawn: the default is one CASE whose condition takes the lock and whose branch then draws the id
-- (a CASE evaluates its condition first). A statement that has drawn no id yet holds no mark of
-- its own start time, as before; one that drew an id holds it from before that id.
--
-- What changes for writers:
--  - The id is no longer an identity column but a default on the same sequence (same name, same
--    last value, owned by the column): `TRUNCATE ... RESTART IDENTITY` still restarts it.
--  - nextval needs USAGE on the sequence. This migration grants it to outbox_writer and to every
--    role (or PUBLIC) holding INSERT on the table or one of its columns. A role given INSERT later
--    needs `GRANT USAGE ON SEQUENCE <table>_id_seq` too (README, "Writers").
--  - An INSERT that names the id gets no error from an identity any more; outbox_writer has no
--    INSERT right on the column. An id that does not come from the sequence is not covered by any
--    argument here: writers must never set it.
--  - If anything took the statement mark's lock in exclusive mode, the INSERT fails with the error
--    of {{fn}}_statement_mark_refused() instead of drawing an id without its mark.

-- 1. The sequence: from identity to a plain sequence of the same name and state.
DO $id_sequence$
DECLARE
  v_table  regclass := '{{table}}'::regclass;
  v_seq    regclass := pg_get_serial_sequence('{{table}}', 'id')::regclass;
  v_schema text;
  v_name   text;
  v_owner  text;
  v_tmp    text;
  v_last   bigint;
  v_called boolean;
  s        pg_sequence%ROWTYPE;
  g        record;
BEGIN
  IF (SELECT a.attidentity FROM pg_attribute AS a WHERE a.attrelid = v_table AND a.attname = 'id') <> '' THEN
    -- Every writer that drew an id has ended; none draws another until this transaction ends.
    LOCK TABLE {{table}} IN ACCESS EXCLUSIVE MODE;
    SELECT n.nspname, c.relname INTO v_schema, v_name
      FROM pg_class AS c JOIN pg_namespace AS n ON n.oid = c.relnamespace WHERE c.oid = v_seq;
    SELECT r.rolname INTO v_owner FROM pg_class AS c JOIN pg_roles AS r ON r.oid = c.relowner WHERE c.oid = v_table;
    SELECT * INTO s FROM pg_sequence AS q WHERE q.seqrelid = v_seq;
    EXECUTE format('SELECT last_value, is_called FROM %s', v_seq) INTO v_last, v_called;
    v_tmp := format('%I.%I', v_schema, left(v_name, 50) || '_schema6');
    EXECUTE format('CREATE SEQUENCE %s AS bigint INCREMENT %s MINVALUE %s MAXVALUE %s START %s CACHE %s %s',
                   v_tmp, s.seqincrement, s.seqmin, s.seqmax, s.seqstart, s.seqcache,
                   CASE WHEN s.seqcycle THEN 'CYCLE' ELSE 'NO CYCLE' END);
    PERFORM setval(v_tmp::regclass, v_last, v_called);
    ALTER TABLE {{table}} ALTER COLUMN id DROP IDENTITY;  -- drops the identity's sequence
    EXECUTE format('ALTER SEQUENCE %s RENAME TO %I', v_tmp, v_name);
    IF v_owner <> current_user THEN
      EXECUTE format('ALTER SEQUENCE %I.%I OWNER TO %I', v_schema, v_name, v_owner);
    END IF;
    EXECUTE format('ALTER SEQUENCE %I.%I OWNED BY {{table}}.id', v_schema, v_name);
    v_seq := format('%I.%I', v_schema, v_name)::regclass;
    -- Whoever may insert may draw an id; the relay reads the last one.
    EXECUTE format('GRANT USAGE ON SEQUENCE %s TO {{writer_role}}', v_seq);
    EXECUTE format('GRANT SELECT ON SEQUENCE %s TO {{relay_role}}', v_seq);
    FOR g IN
      SELECT DISTINCT x.grantee
        FROM (SELECT (aclexplode(c.relacl)).* FROM pg_class AS c WHERE c.oid = v_table AND c.relacl IS NOT NULL
              UNION ALL
              SELECT (aclexplode(a.attacl)).* FROM pg_attribute AS a
               WHERE a.attrelid = v_table AND a.attnum > 0 AND a.attacl IS NOT NULL) AS x
       WHERE x.privilege_type = 'INSERT'
    LOOP
      EXECUTE format('GRANT USAGE ON SEQUENCE %s TO %s', v_seq,
                     CASE WHEN g.grantee = 0 THEN 'PUBLIC' ELSE quote_ident(g.grantee::regrole::text) END);
    END LOOP;
  END IF;
END
$id_sequence$;

-- 2. The statement mark in the id's default.
CREATE OR REPLACE FUNCTION {{fn}}_statement_mark_refused() RETURNS bigint LANGUAGE plpgsql AS $fn$
BEGIN
  RAISE EXCEPTION 'outbox-relay: the writer statement mark ({{statement_ns}}) is held in exclusive mode by another session'
    USING HINT = 'nothing may take the advisory locks of this namespace in exclusive mode (schema/006)';
END
$fn$;

DO $id_default$
BEGIN
  EXECUTE format($ddl$
    ALTER TABLE {{table}} ALTER COLUMN id SET DEFAULT
      CASE WHEN pg_try_advisory_xact_lock_shared({{statement_ns}},
                  ((date_part('epoch', statement_timestamp()) * 1000000)::bigint & 1023)::integer)
           THEN nextval(%L::regclass)
           ELSE {{fn}}_statement_mark_refused() END
    $ddl$, pg_get_serial_sequence('{{table}}', 'id'));
END
$id_default$;

-- 3. Schema 5's statement trigger goes (in the same transaction: no statement draws an id without
--    its mark in between).
DROP TRIGGER IF EXISTS {{prefix}}_statement_mark ON {{table}};
DROP FUNCTION IF EXISTS {{fn}}_statement_mark_taken();
