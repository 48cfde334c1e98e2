-- outbox-relay schema, version 10: the reading of open writers stays exact whatever a writer
-- does (docs/design.md, "What a writer may do"). Placeholders as in 005. Runs in one transaction;
-- writers keep running (ALTER SEQUENCE takes the sequence's lock for a moment; the rest replaces
-- functions).
--
-- Four holes of schema 5's argument (its point 3), found by hostile review (issue 42):
--  1. A sequence that hands out blocks of ids (CACHE > 1). pg_sequence_last_value() is then the
--     top of the last block, and ids below it are drawn later, from a session's cache, by sessions
--     that hold no lock on the table at the reading: "every id up to v was drawn by a holder of
--     ROW EXCLUSIVE" is false. The sequence draws one id at a time again (CACHE 1), and the
--     reading reports the cache: a relay that sees more than 1 applies no reading (each lane moves
--     on only through ids committed without a gap), and says so (an error log naming the ALTER
--     SEQUENCE that fixes it, /readyz, a metric).
--  2. A writer inside a fastpath function call (protocol message F): Postgres sets the statement's
--     start time for the call, which the statement mark takes, but not pg_stat_activity's
--     query_start, so a call that drew an id before its lane mark matched no statement mark and
--     was read as complete. Only a client backend that is idle, or active in a statement whose
--     start time query_start shows, can be complete; a fastpath call, a background worker, a
--     logical replication apply worker, pg_cron's jobs and anything else that is not a client
--     backend holds every lane until its transaction ends.
--  3. A transaction of another database: a database made from this one as a template has the
--     outbox table under the same OID. Relation locks are matched with their database too.
--  4. A prepared transaction (PREPARE TRANSACTION; an XA branch in doubt) draws no more ids: its
--     lane marks, carried over with its locks, are final. It holds only its lanes, and is named by
--     its gid, owner, database and age (pid NULL: no backend).
-- And the claim function publishes nothing past an id the sequence was set back below
-- (TRUNCATE ... RESTART IDENTITY, ALTER SEQUENCE ... RESTART, setval): what the relay resolved
-- before no longer says anything about the new ids, and the relay starts over (the next claim
-- returns the last id, which is below what it knew).

-- 1. One id at a time.
DO $sequence_cache$
DECLARE
  v_seq regclass := pg_catalog.pg_get_serial_sequence('{{table}}', 'id')::regclass;
BEGIN
  IF (SELECT s.seqcache FROM pg_catalog.pg_sequence AS s WHERE s.seqrelid = v_seq) <> 1 THEN
    EXECUTE pg_catalog.format('ALTER SEQUENCE %s CACHE 1', v_seq);
    RAISE WARNING 'outbox-relay: % cached more than one id per session; it now draws one at a time (CACHE 1)', v_seq
      USING HINT = 'sessions that are connected now may still draw ids from blocks they cached; restart them (their '
                   'pool) so that no id below the last one drawn comes later (schema/010)';
  END IF;
END
$sequence_cache$;

-- 2-4. The reading. Its result gains columns, so it is made anew (DROP, CREATE, its grant).
DROP FUNCTION IF EXISTS {{prefix}}_writers();
DO $create_writers$
BEGIN
  EXECUTE pg_catalog.format($body$
    CREATE FUNCTION {{prefix}}_writers()
    RETURNS TABLE (last_id bigint, vxid text, pid integer, complete boolean, lanes bigint, state text,
                   xact_age_seconds double precision, application_name text, client_addr text, query text,
                   wait_event text, gid text, owner text, database text, sequence_cache bigint)
    LANGUAGE plpgsql VOLATILE SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $fn$
    DECLARE
      v_last    bigint;
      v_cache   bigint;
      v_db      oid := (SELECT d.oid FROM pg_database AS d WHERE d.datname = current_database());
      v_pid     integer[];
      v_state   text[];
      v_client  boolean[];
      v_bucket  integer[];
      v_age     double precision[];
      v_app     text[];
      v_addr    text[];
      v_query   text[];
      v_wait    text[];
    BEGIN
      -- (a) the last id drawn, and how many ids a session may cache (1 since this schema).
      v_last := coalesce(pg_sequence_last_value(%1$L::regclass), 0);
      SELECT s.seqcache INTO v_cache FROM pg_sequence AS s WHERE s.seqrelid = %1$L::regclass;
      -- (b) the activity, read now: a transaction keeps its first look at pg_stat_activity, and
      -- this one must come after (a).
      PERFORM pg_stat_clear_snapshot();
      SELECT array_agg(a.pid), array_agg(a.state), array_agg(a.backend_type = 'client backend'),
             array_agg(((date_part('epoch', a.query_start) * 1000000)::bigint & 1023)::integer),
             array_agg(extract(epoch FROM clock_timestamp() - a.xact_start)::double precision),
             array_agg(a.application_name), array_agg(host(a.client_addr)), array_agg(left(a.query, 200)),
             array_agg(a.wait_event_type || ':' || a.wait_event)
        INTO v_pid, v_state, v_client, v_bucket, v_age, v_app, v_addr, v_query, v_wait
        FROM pg_stat_activity AS a
       WHERE a.datid = v_db AND a.pid <> pg_backend_pid();
      -- (c) the locks of this database, in a statement after (b).
      RETURN QUERY
      WITH l AS (
        SELECT k.pid, k.virtualtransaction AS vx, k.locktype, k.classid::int8 AS ns, k.objid::int8 AS key
          FROM pg_locks AS k
         WHERE k.granted AND k.pid IS DISTINCT FROM pg_backend_pid() AND k.database = v_db
           AND ((k.locktype = 'relation' AND k.relation = %2$L::regclass AND k.mode = 'RowExclusiveLock')
             OR (k.locktype = 'advisory' AND k.objsubid = 2
                 AND k.classid::int8 IN ({{mark_ns}}, {{statement_ns}})))),
      h AS (
        SELECT l.vx, max(l.pid) AS pid, bool_or(l.locktype = 'relation') AS holder,
               coalesce(bit_or(1::bigint << l.key::integer) FILTER (WHERE l.locktype = 'advisory' AND l.ns = {{mark_ns}}),
                        0) AS lanes,
               coalesce(array_agg(l.key::integer) FILTER (WHERE l.locktype = 'advisory' AND l.ns = {{statement_ns}}),
                        '{}') AS statements
          FROM l GROUP BY l.vx),
      -- A prepared transaction's locks belong to no backend (pid NULL) and to the virtual
      -- transaction -1/<its xid>.
      p AS (
        SELECT '-1/' || x.transaction::text AS vx, x.gid, x.owner::text AS owner, x.database::text AS database,
               extract(epoch FROM clock_timestamp() - x.prepared)::double precision AS age
          FROM pg_prepared_xacts AS x WHERE x.database = current_database())
      SELECT v_last, NULL::text, NULL::integer, NULL::boolean, NULL::bigint, NULL::text, NULL::double precision,
             NULL::text, NULL::text, NULL::text, NULL::text, NULL::text, NULL::text, NULL::text, v_cache
      UNION ALL
      SELECT v_last, h.vx, h.pid,
             CASE WHEN h.pid IS NULL AND p.vx IS NOT NULL THEN true  -- prepared: its marks are final
                  WHEN a.client IS DISTINCT FROM true THEN false     -- not a client backend, or not visible
                  WHEN a.state IN ('idle', 'idle in transaction', 'idle in transaction (aborted)') THEN true
                  WHEN a.state = 'active' THEN a.bucket IS NOT NULL AND NOT (a.bucket = ANY(h.statements))
                  ELSE false END,                                    -- a fastpath call, 'disabled', ...
             h.lanes, CASE WHEN p.vx IS NOT NULL THEN 'prepared' ELSE a.state END, coalesce(a.age, p.age),
             a.app, a.addr, a.query, a.wait, p.gid, p.owner, p.database, NULL::bigint
        FROM h LEFT JOIN unnest(v_pid, v_state, v_client, v_bucket, v_age, v_app, v_addr, v_query, v_wait)
                         AS a(pid, state, client, bucket, age, app, addr, query, wait) ON a.pid = h.pid
               LEFT JOIN p ON h.pid IS NULL AND p.vx = h.vx
       WHERE h.holder;
    END
    $fn$ $body$, pg_catalog.pg_get_serial_sequence('{{table}}', 'id'),
    -- Schema-qualified: the function runs with a search_path of pg_catalog only.
    (SELECT pg_catalog.format('%I.%I', n.nspname, c.relname)
       FROM pg_catalog.pg_class AS c JOIN pg_catalog.pg_namespace AS n ON n.oid = c.relnamespace
      WHERE c.oid = '{{table}}'::regclass));
END
$create_writers$;

REVOKE ALL ON FUNCTION {{prefix}}_writers() FROM PUBLIC;
GRANT EXECUTE ON FUNCTION {{prefix}}_writers() TO outbox_relay;

-- 5. The claim publishes nothing when the sequence was set back below what the relay knew.
DO $sequence_set_back$
DECLARE
  v_fn     regprocedure := to_regprocedure(
             '{{prefix}}_claim(text, bigint, smallint[], integer, bigint, boolean, bigint[], jsonb, boolean, bigint, bigint[], bigint[])');
  v_def    text;
  v_anchor constant text := E'      IF p_probe AND NOT v_new THEN\n';
  v_guard  constant text := $guard$      -- Schema 10: the sequence was set back (TRUNCATE ... RESTART IDENTITY, ALTER SEQUENCE
      -- ... RESTART): what the relay knew is void; it starts over from this answer's last id.
      IF v_last < v_frontier THEN
        bound := -1;
        last_id := v_last;
        RETURN NEXT;
        RETURN;
      END IF;
$guard$;
BEGIN
  IF v_fn IS NULL THEN
    RETURN;  -- no schema 5 claim for this table: nothing calls one
  END IF;
  v_def := pg_get_functiondef(v_fn);
  IF position('-- Schema 10:' IN v_def) > 0 THEN
    RETURN;
  END IF;
  IF (length(v_def) - length(replace(v_def, v_anchor, ''))) / length(v_anchor) <> 1 THEN
    RAISE EXCEPTION 'outbox-relay: % does not hold the statement schema 10 patches', v_fn
      USING HINT = 'the function was changed by hand; restore it from schema/ (005, 007, 008) and migrate again';
  END IF;
  EXECUTE replace(v_def, v_anchor, v_guard || v_anchor);  -- CREATE OR REPLACE: same owner, same grants
END
$sequence_set_back$;
