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
--     lane marks, carried over with its locks (same virtual transaction id, no pid), are final. It holds only its lanes, and is named by
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
DROP FUNCTION IF EXISTS {{fn}}_writers();
DO $create_writers$
BEGIN
  EXECUTE pg_catalog.format($body$
    CREATE FUNCTION {{fn}}_writers()
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
        SELECT k.pid, k.virtualtransaction AS vx, k.locktype, k.classid::int8 AS ns, k.objid::int8 AS key,
               k.transactionid AS xid
          FROM pg_locks AS k
         WHERE k.granted AND k.pid IS DISTINCT FROM pg_backend_pid()
           AND ((k.locktype = 'relation' AND k.database = v_db AND k.relation = %2$L::regclass
                 AND k.mode = 'RowExclusiveLock')
             OR (k.locktype = 'advisory' AND k.database = v_db AND k.objsubid = 2
                 AND k.classid::int8 IN ({{mark_ns}}, {{statement_ns}}))
             -- A prepared transaction's locks keep its virtual transaction id but belong to no
             -- backend (pid NULL); its own xid lock names it in pg_prepared_xacts.
             OR (k.locktype = 'transactionid' AND k.pid IS NULL))),
      h AS (
        SELECT l.vx, max(l.pid) AS pid, bool_or(l.locktype = 'relation') AS holder,
               max(l.xid::text) FILTER (WHERE l.locktype = 'transactionid') AS xid,
               coalesce(bit_or(1::bigint << l.key::integer) FILTER (WHERE l.locktype = 'advisory' AND l.ns = {{mark_ns}}),
                        0) AS lanes,
               coalesce(array_agg(l.key::integer) FILTER (WHERE l.locktype = 'advisory' AND l.ns = {{statement_ns}}),
                        '{}') AS statements
          FROM l GROUP BY l.vx),
      p AS (
        SELECT x.transaction::text AS xid, x.gid, x.owner::text AS owner, x.database::text AS database,
               extract(epoch FROM clock_timestamp() - x.prepared)::double precision AS age
          FROM pg_prepared_xacts AS x WHERE x.database = current_database())
      SELECT v_last, NULL::text, NULL::integer, NULL::boolean, NULL::bigint, NULL::text, NULL::double precision,
             NULL::text, NULL::text, NULL::text, NULL::text, NULL::text, NULL::text, NULL::text, v_cache
      UNION ALL
      SELECT v_last, h.vx, h.pid,
             CASE WHEN h.pid IS NULL AND p.xid IS NOT NULL THEN true  -- prepared: its marks are final
                  WHEN a.client IS DISTINCT FROM true THEN false     -- not a client backend, or not visible
                  WHEN a.state IN ('idle', 'idle in transaction', 'idle in transaction (aborted)') THEN true
                  WHEN a.state = 'active' THEN a.bucket IS NOT NULL AND NOT (a.bucket = ANY(h.statements))
                  ELSE false END,                                    -- a fastpath call, 'disabled', ...
             h.lanes, CASE WHEN p.xid IS NOT NULL THEN 'prepared' ELSE a.state END, coalesce(a.age, p.age),
             a.app, a.addr, a.query, a.wait, p.gid, p.owner, p.database, NULL::bigint
        FROM h LEFT JOIN unnest(v_pid, v_state, v_client, v_bucket, v_age, v_app, v_addr, v_query, v_wait)
                         AS a(pid, state, client, bucket, age, app, addr, query, wait) ON a.pid = h.pid
               LEFT JOIN p ON h.pid IS NULL AND p.xid = h.xid
       WHERE h.holder;
    END
    $fn$ $body$, pg_catalog.pg_get_serial_sequence('{{table}}', 'id'),
    -- Schema-qualified: the function runs with a search_path of pg_catalog only.
    (SELECT pg_catalog.format('%I.%I', n.nspname, c.relname)
       FROM pg_catalog.pg_class AS c JOIN pg_catalog.pg_namespace AS n ON n.oid = c.relnamespace
      WHERE c.oid = '{{table}}'::regclass));
END
$create_writers$;

REVOKE ALL ON FUNCTION {{fn}}_writers() FROM PUBLIC;
GRANT EXECUTE ON FUNCTION {{fn}}_writers() TO {{relay_role}};

-- 5. The claim publishes nothing when the sequence was set back below what the relay knew.
DO $sequence_set_back$
DECLARE
  v_fn     regprocedure := to_regprocedure(
             '{{fn}}_claim(text, bigint, smallint[], integer, bigint, boolean, bigint[], jsonb, boolean, bigint, bigint[], bigint[])');
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

-- 6. The claim, with one more argument: p_created_upto, the latest created_at of the events whose
--    outcomes it writes. An outcome only touches a row created no later than that: after the
--    sequence was set back, a new row may carry the id of an event delivered before, whose mark
--    (written up to 50 ms after delivery, or after a reconnect) must not fall on it.
--    And a pending row that another transaction has locked (SELECT ... FOR SHARE, FOR UPDATE, an
--    operator's UPDATE) holds its lane from there on: the claim locks what it chose with SKIP
--    LOCKED as before, and when it could not lock a row, it returns nothing of that row's lane
--    above it, and that lane's bound stops below it. The next claim looks from there again, so
--    the row goes out as soon as the lock goes, before its key's later events (schema 5's bounds:
--    a poll looks above the bound per lane). The lock is FOR NO KEY UPDATE: a foreign key's check
--    (FOR KEY SHARE, a row referring to the event) does not conflict with it and holds nothing.
--    The 12-argument function stays for a relay of schema 9 while it runs (patched above).
DO $create_claim$
BEGIN
  EXECUTE pg_catalog.format($body$
    CREATE OR REPLACE FUNCTION {{fn}}_claim(p_owner text, p_lease_ms bigint, p_lanes smallint[],
                                                p_limit integer, p_resolved bigint, p_probe boolean,
                                                p_done bigint[], p_failed jsonb, p_delete boolean,
                                                p_floor bigint, p_known bigint[], p_covered bigint[],
                                                p_created_upto timestamptz)
    RETURNS TABLE (id bigint, topic text, aggregate_id text, payload text, headers text, created_at text,
                   created_at_us bigint, attempts integer, sinks_done text[], bound bigint, last_id bigint,
                   lane_bounds bigint[])
    -- Plans as schema 3's: generic, index scans only, no sorts, and never compiled by JIT (a
    -- disabled plan's cost is above jit_above_cost: 0.6 s of compiling for a call of 1 ms).
    -- Names resolve in pg_catalog only.
    LANGUAGE plpgsql VOLATILE SET search_path = pg_catalog, pg_temp SET plan_cache_mode = force_generic_plan
      SET enable_seqscan = off SET enable_sort = off SET jit = off AS $fn$
    DECLARE
      v_last     bigint;
      v_waiting  boolean;
      v_async    boolean;
      v_new      boolean;
      v_frontier bigint;
      v_from     bigint;
      v_walk     bigint;
      v_bound    bigint;        -- the walk from p_resolved: every lane
      v_fbound   bigint;        -- the walk from the frontier: the lanes at the frontier
      v_hi       bigint[];
      v_low      bigint;
      v_high     bigint;
      v_floor    bigint := -1;  -- no floor: c.id > -1
    BEGIN
      IF cardinality(p_done) > 0 THEN
        IF p_delete THEN
          DELETE FROM %2$s AS d WHERE d.id = ANY(p_done) AND d.created_at <= p_created_upto;
        ELSE
          UPDATE %2$s AS d SET processed_at = now(), lease_owner = NULL, lease_until = NULL
           WHERE d.id = ANY(p_done) AND d.processed_at IS NULL AND d.created_at <= p_created_upto;
        END IF;
      END IF;
      IF jsonb_array_length(p_failed) > 0 THEN
        UPDATE %2$s AS e SET
          attempts = e.attempts + CASE WHEN r.kind = 'release' THEN 0 ELSE 1 END,
          next_attempt_at = CASE WHEN r.kind = 'retry' THEN now() + r.delay_ms * interval '1 millisecond'
                                 ELSE e.next_attempt_at END,
          last_error = COALESCE(r.error, e.last_error),
          dead_lettered_at = CASE WHEN r.kind = 'dead' THEN now() ELSE NULL END,
          sinks_done = r.sinks_done, lease_owner = NULL, lease_until = NULL
        FROM jsonb_to_recordset(p_failed) AS r(id bigint, kind text, delay_ms bigint, error text, sinks_done text[])
        WHERE e.id = r.id AND e.processed_at IS NULL AND e.created_at <= p_created_upto
          AND e.id = ANY(ARRAY(SELECT (f->>'id')::bigint FROM jsonb_array_elements(p_failed) AS f));
      END IF;
      -- One statement: the last id drawn; the frontier; whether anything was committed above it;
      -- whether an event waits for a retry (a poll: any earlier failed event of the key, due or
      -- not, schema 7); no WAL flush wait.
      SELECT v.last, f.frontier,
             (SELECT n.id FROM %2$s AS n WHERE n.id > f.frontier ORDER BY n.id LIMIT 1) IS NOT NULL,
             (SELECT w.id FROM %2$s AS w
               WHERE w.processed_at IS NULL AND w.dead_lettered_at IS NULL
                 AND w.attempts > 0 AND (p_probe OR w.next_attempt_at > now())
               ORDER BY w.aggregate_id, w.id LIMIT 1) IS NOT NULL,
             set_config('synchronous_commit', 'off', true) = 'off'
        INTO v_last, v_frontier, v_new, v_waiting, v_async
        FROM (SELECT coalesce(pg_sequence_last_value(%1$L::regclass), 0) AS last) AS v,
             (SELECT CASE WHEN p_known IS NULL THEN p_resolved
                          ELSE greatest(p_resolved, (SELECT max(p_known[l + 1]) FROM unnest(p_lanes) AS l)) END
                       AS frontier) AS f;
      -- The sequence was set back below what the relay knew: it starts over from this last id.
      IF v_last < v_frontier THEN
        bound := -1;
        last_id := v_last;
        RETURN NEXT;
        RETURN;
      END IF;
      -- A poll returns at once when nothing was committed above the frontier and every lane's
      -- claims covered the frontier already.
      IF p_probe AND NOT v_new THEN
        IF p_covered IS NULL OR (SELECT min(p_covered[l + 1]) FROM unnest(p_lanes) AS l) >= v_frontier THEN
          bound := p_resolved;
          last_id := v_last;
          RETURN NEXT;
          RETURN;
        END IF;
      END IF;
      -- The walks: from v_from (everything up to it is committed or gone), the highest id up to
      -- v_last before the first one that is not visible.
      FOR i IN 1..2 LOOP
        v_from := CASE i WHEN 1 THEN p_resolved ELSE v_frontier END;
        IF i = 2 AND v_from <= v_bound THEN
          v_fbound := v_bound;
          EXIT;
        END IF;
        IF v_from < 0 THEN
          v_walk := -1;
        ELSIF v_from >= v_last THEN
          v_walk := v_from;
        ELSE
          SELECT CASE
                   WHEN NOT EXISTS (SELECT 1 FROM %2$s AS f WHERE f.id = v_from + 1) THEN v_from
                   ELSE coalesce((SELECT g.id FROM %2$s AS g
                                   WHERE g.id > v_from AND g.id < v_last
                                     AND NOT EXISTS (SELECT 1 FROM %2$s AS h WHERE h.id = g.id + 1)
                                   ORDER BY g.id LIMIT 1), v_last)
                 END
            INTO v_walk;
        END IF;
        IF i = 1 THEN
          v_bound := v_walk;
        ELSE
          v_fbound := v_walk;
        END IF;
      END LOOP;
      IF p_known IS NULL THEN
        v_hi := ARRAY[v_bound];
        v_high := v_bound;
        v_low := 0;
        IF p_probe THEN
          v_low := greatest(p_resolved, 0);
          IF v_bound <= p_resolved THEN
            v_high := NULL;
          END IF;
        ELSIF p_floor > 0 THEN
          IF (SELECT r.id FROM %2$s AS r
               WHERE r.processed_at IS NULL AND r.dead_lettered_at IS NULL AND r.attempts > 0 AND r.id < p_floor
               ORDER BY r.aggregate_id, r.id LIMIT 1) IS NULL THEN
            v_low := p_floor;
          END IF;
        END IF;
      ELSE
        v_hi := ARRAY(SELECT greatest(v_bound, CASE WHEN k.v >= v_frontier THEN v_fbound ELSE k.v END)
                        FROM unnest(p_known) WITH ORDINALITY AS k(v, n) ORDER BY k.n);
        IF p_probe THEN
          SELECT min(p_covered[l + 1]), max(v_hi[l + 1]) INTO v_low, v_high
            FROM unnest(p_lanes) AS l WHERE v_hi[l + 1] > p_covered[l + 1];
        ELSE
          SELECT 0, max(v_hi[l + 1]) INTO v_low, v_high FROM unnest(p_lanes) AS l;
          IF p_floor > 0 AND (SELECT r.id FROM %2$s AS r
                               WHERE r.processed_at IS NULL AND r.dead_lettered_at IS NULL AND r.attempts > 0
                                 AND r.id < p_floor
                               ORDER BY r.aggregate_id, r.id LIMIT 1) IS NULL THEN
            v_floor := p_floor;
            SELECT least(p_floor, min(p_covered[l + 1])) INTO v_low FROM unnest(p_lanes) AS l;
          END IF;
        END IF;
      END IF;
      IF v_high IS NULL OR v_high < 0 THEN
        bound := v_bound;
        last_id := v_last;
        lane_bounds := v_hi;
        RETURN NEXT;
        RETURN;
      END IF;
      v_low := greatest(coalesce(v_low, 0), 0);
      -- The rows chosen (no lock), then locked (SKIP LOCKED); a row that could not be locked
      -- stops its lane: nothing of the lane above it is returned, and the lane's bound is below
      -- it. With a full choice and a row skipped, every lane's bound is the last row chosen.
      RETURN QUERY
      WITH chosen AS MATERIALIZED (
        SELECT c.id, c.lane::smallint AS lane
          FROM %2$s AS c
         WHERE c.processed_at IS NULL AND c.dead_lettered_at IS NULL
           AND c.next_attempt_at <= now()
           AND (c.lease_until IS NULL OR (c.lease_until < now() AND c.lease_owner IS DISTINCT FROM p_owner))
           AND c.lane::smallint = ANY(p_lanes)
           AND c.id > v_low AND c.id <= v_high
           AND (p_known IS NULL OR (c.id <= v_hi[c.lane::smallint + 1]
                                    AND (NOT p_probe OR c.id > p_covered[c.lane::smallint + 1])
                                    AND c.id > least(v_floor, p_covered[c.lane::smallint + 1])))
           AND (NOT v_waiting OR
                (SELECT b.id FROM %2$s AS b
                  WHERE (b.aggregate_id, b.id) >= (c.aggregate_id, 0) AND (b.aggregate_id, b.id) < (c.aggregate_id, c.id)
                    AND b.processed_at IS NULL AND b.dead_lettered_at IS NULL
                    AND b.attempts > 0 AND (p_probe OR b.next_attempt_at > now())
                  ORDER BY b.aggregate_id, b.id LIMIT 1) IS NULL)
         ORDER BY c.id LIMIT p_limit),
      locked AS MATERIALIZED (
        SELECT c.id, c.lane::smallint AS lane, c.topic, c.aggregate_id, c.payload, c.headers, c.created_at,
               c.attempts, c.sinks_done
          FROM %2$s AS c
         WHERE c.id = ANY(ARRAY(SELECT ch.id FROM chosen AS ch))
           AND c.processed_at IS NULL AND c.dead_lettered_at IS NULL
           AND (c.lease_until IS NULL OR (c.lease_until < now() AND c.lease_owner IS DISTINCT FROM p_owner))
         FOR NO KEY UPDATE OF c SKIP LOCKED),
      -- Counted first: the usual claim locks every row it chose and looks no further (the per-row
      -- look is an array search, run only when a row was skipped).
      stop AS (
        SELECT ch.lane, min(ch.id) AS first
          FROM chosen AS ch
         WHERE (SELECT count(*) FROM locked) < (SELECT count(*) FROM chosen)
           AND NOT (ch.id = ANY(ARRAY(SELECT k.id FROM locked AS k)))
         GROUP BY ch.lane),
      s AS MATERIALIZED (
        SELECT k.* FROM locked AS k
         WHERE NOT EXISTS (SELECT 1 FROM stop AS x WHERE x.lane = k.lane AND x.first < k.id)),
      leased AS (
        UPDATE %2$s AS e SET lease_owner = p_owner, lease_until = now() + p_lease_ms * interval '1 millisecond'
         WHERE e.id = ANY(ARRAY(SELECT s.id FROM s)) AND NOT p_probe)
      SELECT s.id, s.topic, s.aggregate_id, s.payload::text, s.headers::text, NULL::text,
             (extract(epoch FROM s.created_at) * 1000000)::int8, s.attempts, s.sinks_done,
             NULL::bigint, NULL::bigint, NULL::bigint[]
        FROM s
      UNION ALL
      SELECT NULL::bigint, NULL::text, NULL::text, NULL::text, NULL::text, NULL::text, NULL::bigint, NULL::integer,
             NULL::text[], v_bound, v_last,
             CASE WHEN NOT EXISTS (SELECT 1 FROM stop) THEN v_hi
                  ELSE (SELECT array_agg(least(v_hi[CASE WHEN cardinality(v_hi) = 1 THEN 1 ELSE g.n + 1 END],
                                               coalesce((SELECT x.first - 1 FROM stop AS x WHERE x.lane = g.n),
                                                        9223372036854775807),
                                               CASE WHEN (SELECT count(*) FROM chosen) >= p_limit
                                                    THEN (SELECT max(ch.id) FROM chosen AS ch)
                                                    ELSE 9223372036854775807 END) ORDER BY g.n)
                          FROM generate_series(0, 63) AS g(n)) END;
    END
    $fn$ $body$, pg_catalog.pg_get_serial_sequence('{{table}}', 'id'),
    (SELECT pg_catalog.format('%I.%I', n.nspname, c.relname)
       FROM pg_catalog.pg_class AS c JOIN pg_catalog.pg_namespace AS n ON n.oid = c.relnamespace
      WHERE c.oid = '{{table}}'::regclass));
END
$create_claim$;

REVOKE ALL ON FUNCTION {{fn}}_claim(text, bigint, smallint[], integer, bigint, boolean, bigint[], jsonb, boolean,
                                         bigint, bigint[], bigint[], timestamptz) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION {{fn}}_claim(text, bigint, smallint[], integer, bigint, boolean, bigint[], jsonb, boolean,
                                            bigint, bigint[], bigint[], timestamptz) TO {{relay_role}};
