-- outbox-relay schema, version 5: writers announce the lanes they write, so that an open writer
-- holds back only the events of its own lanes (README, "Writers that commit out of order";
-- docs in the README's "An event stream stalled: find the writer"). Placeholders as in 001, and
-- {{mark_ns}}, {{statement_ns}}: two 31-bit advisory-lock namespaces derived from the table name
-- (relay/src/postgres/pg_store.cpp, writer_mark_keys). Runs in one transaction; writers keep
-- running: ADD CONSTRAINT ... NOT VALID and CREATE TRIGGER take the table lock for a moment (no
-- scan of existing rows); migrate waits at most 100 ms for it and tries again.
--
-- (Schema 9 moves the lane mark of point 1 from the CHECK into the lane column's type; the
-- argument below holds for it as written, "its CHECK" being the computation of its lane.)
--
-- The argument. Ids are drawn when a row is inserted but become visible at commit, so the relay
-- must not publish an id of lane L while a transaction that may still commit a lower id of lane L
-- is open. Until schema 4 the relay could not tell which lanes an open writer holds, so one open
-- writer held back every lane. Now every writer says so, at no cost a writer can measure
-- (bench/RESULTS.md, "Writer lanes"):
--
--  1. A lane mark per row. A CHECK constraint takes a shared transaction-level advisory lock
--     ({{mark_ns}}, lane) for each row it checks; a second row of the same lane in the same
--     transaction finds the lock already held (a local lookup). Held until the transaction ends;
--     released with a subtransaction that rolls back, together with its rows. The relay's own
--     marks (processed_at set) skip it: those rows are never published again.
--  2. A statement mark. A row's id is drawn (the identity default) before its CHECK runs, so
--     between the two the row is in no lane's mark. A statement-level trigger fires before the
--     statement draws its first id; its WHEN clause takes a shared transaction-level advisory lock
--     ({{statement_ns}}, the statement's start time in microseconds mod 1024) and is always false,
--     so the trigger's function never runs (its WHEN clause is evaluated by the executor; no
--     PL/pgSQL call).
--  3. The reading ({{fn}}_writers), in this order, each step in a statement after the one
--     before: (a) v = the last id drawn; (b) every session's activity (pg_stat_activity: state,
--     query_start); (c) the locks: the transactions holding ROW EXCLUSIVE on the table (every
--     INSERT takes it before it draws an id and keeps it to its end), their lane marks and their
--     statement marks. A holder whose activity in (b) is idle (in a transaction or not), or whose
--     current statement's start time matches none of its statement marks in (c), had no row
--     between its id and its CHECK at (b): every id up to v it drew is in its lane marks in (c)
--     ("complete"). (A statement that drew an id up to v and was still running at (b) took its
--     statement mark before that id, so the mark is in (c) and matches; one that ended before (b)
--     checked its rows before it ended.) Any other holder (a statement that inserts and is still
--     running, activity not visible, a prepared transaction) may hold an id up to v in any lane.
--  4. The relay (relay/src/core/lane_bounds.hpp): when every holder of a reading is complete, every
--     id up to v in a lane that none of them marked is committed or gone for good: that lane is
--     resolved up to v. A reading with a holder that is not complete applies once those holders
--     have ended. A lane marked by an open holder waits for the first id that is not visible, as
--     before. Between readings each lane moves on by the ids committed without a gap above it.
--
-- What a writer costs: one shared lock per transaction and lane it writes, one per statement that
-- inserts (two buckets of one transaction may share a key; more than 1024 inserting statements in
-- one transaction share keys, so it holds at most 1024 + 64 of these locks: keep
-- max_locks_per_transaction in mind for huge transactions). Nothing ever takes these keys in
-- exclusive mode; if something did, the INSERT fails with the trigger's or the check's error
-- instead of writing an unannounced row.

-- 1. Lane marks. NOT VALID: existing rows are not checked (that would lock and scan the table).
DO $lane_mark$
BEGIN
  IF NOT EXISTS (SELECT 1 FROM pg_constraint WHERE conrelid = '{{table}}'::regclass
                  AND conname = '{{name}}_lane_mark') THEN
    ALTER TABLE {{table}} ADD CONSTRAINT {{name}}_lane_mark
      CHECK (processed_at IS NOT NULL OR pg_try_advisory_xact_lock_shared({{mark_ns}}, lane)) NOT VALID;
  END IF;
END
$lane_mark$;

-- 2. Statement marks.
CREATE OR REPLACE FUNCTION {{fn}}_statement_mark_taken() RETURNS trigger LANGUAGE plpgsql AS $fn$
BEGIN
  RAISE EXCEPTION 'outbox-relay: the writer statement mark ({{statement_ns}}) is held in exclusive mode by another session'
    USING HINT = 'nothing may take the advisory locks of this namespace in exclusive mode (schema/005)';
END
$fn$;

DROP TRIGGER IF EXISTS {{prefix}}_statement_mark ON {{table}};
CREATE TRIGGER {{prefix}}_statement_mark BEFORE INSERT ON {{table}} FOR EACH STATEMENT
  WHEN (NOT pg_try_advisory_xact_lock_shared({{statement_ns}},
          ((date_part('epoch', statement_timestamp()) * 1000000)::bigint & 1023)::integer))
  EXECUTE FUNCTION {{fn}}_statement_mark_taken();
-- Also under session_replication_role = replica (a restore, a logical replication apply): a
-- writer without its statement mark would be read as complete while a drawn id is not yet in any
-- lane. Disabling this trigger (ALTER TABLE ... DISABLE TRIGGER) breaks per-key order.
ALTER TABLE {{table}} ENABLE ALWAYS TRIGGER {{prefix}}_statement_mark;

-- 3. The reading. SECURITY DEFINER: it reads the activity of the table's writers with the rights
-- of the role that ran migrate (which needs pg_read_all_stats, or superuser, to see other roles'
-- sessions; see the warning below), so the relay's role needs no right to see other sessions.
-- It returns one row whose vxid is NULL (the last id drawn), then one row per transaction holding
-- ROW EXCLUSIVE on the table, other than the caller's: its lane marks as a 64-bit mask, whether it
-- is complete (above), and what an operator needs to find it.
DO $create_writers$
BEGIN
  EXECUTE format($body$
    CREATE OR REPLACE FUNCTION {{fn}}_writers()
    RETURNS TABLE (last_id bigint, vxid text, pid integer, complete boolean, lanes bigint, state text,
                   xact_age_seconds double precision, application_name text, client_addr text, query text,
                   wait_event text)
    LANGUAGE plpgsql VOLATILE SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $fn$
    DECLARE
      v_last    bigint;
      v_db      oid := (SELECT d.oid FROM pg_database AS d WHERE d.datname = current_database());
      v_pid     integer[];
      v_state   text[];
      v_bucket  integer[];
      v_age     double precision[];
      v_app     text[];
      v_addr    text[];
      v_query   text[];
      v_wait    text[];
    BEGIN
      -- (a) the last id drawn.
      v_last := coalesce(pg_sequence_last_value(%1$L::regclass), 0);
      -- (b) the activity, read now: a transaction keeps its first look at pg_stat_activity, and
      -- this one must come after (a).
      PERFORM pg_stat_clear_snapshot();
      SELECT array_agg(a.pid), array_agg(a.state),
             array_agg(((date_part('epoch', a.query_start) * 1000000)::bigint & 1023)::integer),
             array_agg(extract(epoch FROM clock_timestamp() - a.xact_start)::double precision),
             array_agg(a.application_name), array_agg(host(a.client_addr)), array_agg(left(a.query, 200)),
             array_agg(a.wait_event_type || ':' || a.wait_event)
        INTO v_pid, v_state, v_bucket, v_age, v_app, v_addr, v_query, v_wait
        FROM pg_stat_activity AS a
       WHERE a.datid = v_db AND a.pid <> pg_backend_pid();
      -- (c) the locks, in a statement after (b).
      RETURN QUERY
      WITH l AS (
        SELECT k.pid, k.virtualtransaction AS vx, k.locktype, k.classid::int8 AS ns, k.objid::int8 AS key
          FROM pg_locks AS k
         WHERE k.granted AND k.pid IS DISTINCT FROM pg_backend_pid()
           AND ((k.locktype = 'relation' AND k.relation = %2$L::regclass AND k.mode = 'RowExclusiveLock')
             OR (k.locktype = 'advisory' AND k.objsubid = 2 AND k.database = v_db
                 AND k.classid::int8 IN ({{mark_ns}}, {{statement_ns}})))),
      h AS (
        SELECT l.vx, max(l.pid) AS pid, bool_or(l.locktype = 'relation') AS holder,
               coalesce(bit_or(1::bigint << l.key::integer) FILTER (WHERE l.locktype = 'advisory' AND l.ns = {{mark_ns}}),
                        0) AS lanes,
               coalesce(array_agg(l.key::integer) FILTER (WHERE l.locktype = 'advisory' AND l.ns = {{statement_ns}}),
                        '{}') AS statements
          FROM l GROUP BY l.vx)
      SELECT v_last, NULL::text, NULL::integer, NULL::boolean, NULL::bigint, NULL::text, NULL::double precision,
             NULL::text, NULL::text, NULL::text, NULL::text
      UNION ALL
      SELECT v_last, h.vx, h.pid,
             CASE WHEN a.state IN ('idle', 'idle in transaction', 'idle in transaction (aborted)') THEN true
                  WHEN a.state IN ('active', 'fastpath function call') THEN
                    a.bucket IS NOT NULL AND NOT (a.bucket = ANY(h.statements))
                  ELSE false END,
             h.lanes, a.state, a.age, a.app, a.addr, a.query, a.wait
        FROM h LEFT JOIN unnest(v_pid, v_state, v_bucket, v_age, v_app, v_addr, v_query, v_wait)
                         AS a(pid, state, bucket, age, app, addr, query, wait) ON a.pid = h.pid
       WHERE h.holder;
    END
    $fn$ $body$, pg_get_serial_sequence('{{table}}', 'id'),
    -- Schema-qualified: the function runs with a search_path of pg_catalog only.
    (SELECT format('%I.%I', n.nspname, c.relname) FROM pg_class AS c JOIN pg_namespace AS n ON n.oid = c.relnamespace
      WHERE c.oid = '{{table}}'::regclass));
END
$create_writers$;

REVOKE ALL ON FUNCTION {{fn}}_writers() FROM PUBLIC;
GRANT EXECUTE ON FUNCTION {{fn}}_writers() TO {{relay_role}};

DO $visibility$
BEGIN
  IF NOT (SELECT r.rolsuper FROM pg_roles AS r WHERE r.rolname = current_user)
     AND NOT pg_has_role(current_user, 'pg_read_all_stats', 'USAGE') THEN
    RAISE WARNING 'outbox-relay: % cannot see other roles'' sessions, so the relay cannot tell which lanes an open writer holds (every open writer then holds back every lane, as before schema 5)', current_user
      USING HINT = format('GRANT pg_read_all_stats TO %I; (the owner of {{fn}}_writers())', current_user);
  END IF;
END
$visibility$;

-- 4. The claim (schema 3's, with lanes resolved one by one). Instead of the reading of schema 2
--    (p_reading_last, p_reading_holders), the relay reads the writers itself ({{fn}}_writers)
--    and passes, per lane, what it knows:
--  p_known[lane + 1]: every id up to it in that lane is committed or gone (>= p_resolved);
--  p_covered[lane + 1]: what the relay's previous claim covered in that lane (its lane bound):
--    a poll looks above it only (it writes no lease; schema 2 explains why that is safe).
--  Both NULL: every lane of the relay is known and covered up to p_resolved (no writer holds a
--    lane back): the claim is schema 3's, and lane_bounds has one element, every lane's bound.
--  The function walks the primary key from p_resolved and from the frontier (the highest p_known of
--  the relay's lanes) to the first id that is not visible, and returns each lane's bound: the
--  frontier's walk for the lanes at the frontier, p_known for the others, and never less than the
--  walk from p_resolved (every lane). Returns the claimed rows in id order, then one row whose id is
--  NULL: the bound of every lane (bound), the last id drawn, and the lanes' bounds (lane_bounds).
DO $create_claim$
BEGIN
  EXECUTE format($body$
    CREATE OR REPLACE FUNCTION {{fn}}_claim(p_owner text, p_lease_ms bigint, p_lanes smallint[],
                                                p_limit integer, p_resolved bigint, p_probe boolean,
                                                p_done bigint[], p_failed jsonb, p_delete boolean,
                                                p_floor bigint, p_known bigint[], p_covered bigint[])
    RETURNS TABLE (id bigint, topic text, aggregate_id text, payload text, headers text, created_at text,
                   created_at_us bigint, attempts integer, sinks_done text[], bound bigint, last_id bigint,
                   lane_bounds bigint[])
    -- Plans as schema 3's: generic, index scans only, no sorts.
    LANGUAGE plpgsql VOLATILE SET plan_cache_mode = force_generic_plan SET enable_seqscan = off
      SET enable_sort = off AS $fn$
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
          DELETE FROM {{table}} AS d WHERE d.id = ANY(p_done);
        ELSE
          UPDATE {{table}} AS d SET processed_at = now(), lease_owner = NULL, lease_until = NULL
           WHERE d.id = ANY(p_done) AND d.processed_at IS NULL;
        END IF;
      END IF;
      IF jsonb_array_length(p_failed) > 0 THEN
        UPDATE {{table}} AS e SET
          attempts = e.attempts + CASE WHEN r.kind = 'release' THEN 0 ELSE 1 END,
          next_attempt_at = CASE WHEN r.kind = 'retry' THEN now() + r.delay_ms * interval '1 millisecond'
                                 ELSE e.next_attempt_at END,
          last_error = COALESCE(r.error, e.last_error),
          dead_lettered_at = CASE WHEN r.kind = 'dead' THEN now() ELSE NULL END,
          sinks_done = r.sinks_done, lease_owner = NULL, lease_until = NULL
        FROM jsonb_to_recordset(p_failed) AS r(id bigint, kind text, delay_ms bigint, error text, sinks_done text[])
        WHERE e.id = r.id AND e.processed_at IS NULL
          AND e.id = ANY(ARRAY(SELECT (f->>'id')::bigint FROM jsonb_array_elements(p_failed) AS f));
      END IF;
      -- One statement (each one costs an executor start-up): the last id drawn; the frontier
      -- (p_known and p_covered NULL: every lane of the relay is at p_resolved, known and covered,
      -- the usual case with no writer holding a lane back, and then no per-lane work is done);
      -- whether anything was committed above it; whether an event waits for a retry; no WAL flush
      -- wait (schema 2, 3).
      SELECT v.last, f.frontier,
             (SELECT n.id FROM {{table}} AS n WHERE n.id > f.frontier ORDER BY n.id LIMIT 1) IS NOT NULL,
             (SELECT w.id FROM {{table}} AS w
               WHERE w.processed_at IS NULL AND w.dead_lettered_at IS NULL
                 AND w.attempts > 0 AND w.next_attempt_at > now()
               ORDER BY w.aggregate_id, w.id LIMIT 1) IS NOT NULL,
             set_config('synchronous_commit', 'off', true) = 'off'
        INTO v_last, v_frontier, v_new, v_waiting, v_async
        FROM (SELECT coalesce(pg_sequence_last_value(%1$L::regclass), 0) AS last) AS v,
             (SELECT CASE WHEN p_known IS NULL THEN p_resolved
                          ELSE greatest(p_resolved, (SELECT max(p_known[l + 1]) FROM unnest(p_lanes) AS l)) END
                       AS frontier) AS f;
      -- A poll returns at once when nothing was committed above the frontier and every lane's
      -- claims covered the frontier already (a lane behind it waits for an open writer, or for what
      -- a reading resolved since). It reports the last id drawn: an id drawn and not visible keeps
      -- the relay polling until a reading or a commit resolves it (its writer may roll back, which
      -- nothing announces).
      IF p_probe AND NOT v_new THEN
        IF p_covered IS NULL OR (SELECT min(p_covered[l + 1]) FROM unnest(p_lanes) AS l) >= v_frontier THEN
          bound := p_resolved;
          last_id := v_last;
          RETURN NEXT;
          RETURN;
        END IF;
      END IF;
      -- The walks: from v_from (everything up to it is committed or gone), the highest id up to
      -- v_last before the first one that is not visible. Each costs about the ids committed since
      -- the previous call.
      FOR i IN 1..2 LOOP
        v_from := CASE i WHEN 1 THEN p_resolved ELSE v_frontier END;
        IF i = 2 AND v_from <= v_bound THEN
          v_fbound := v_bound;  -- the frontier is at or below the first walk's end
          EXIT;
        END IF;
        IF v_from < 0 THEN
          v_walk := -1;
        ELSIF v_from >= v_last THEN
          v_walk := v_from;
        ELSE
          SELECT CASE
                   WHEN NOT EXISTS (SELECT 1 FROM {{table}} AS f WHERE f.id = v_from + 1) THEN v_from
                   ELSE coalesce((SELECT g.id FROM {{table}} AS g
                                   WHERE g.id > v_from AND g.id < v_last
                                     AND NOT EXISTS (SELECT 1 FROM {{table}} AS h WHERE h.id = g.id + 1)
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
        -- Every lane alike: schema 3's claim, its bound the walk's.
        v_hi := ARRAY[v_bound];
        v_high := v_bound;
        v_low := 0;
        IF p_probe THEN
          v_low := greatest(p_resolved, 0);
          IF v_bound <= p_resolved THEN
            v_high := NULL;  -- nothing new below the bound
          END IF;
        ELSIF p_floor > 0 THEN
          IF (SELECT r.id FROM {{table}} AS r
               WHERE r.processed_at IS NULL AND r.dead_lettered_at IS NULL AND r.attempts > 0 AND r.id < p_floor
               ORDER BY r.aggregate_id, r.id LIMIT 1) IS NULL THEN
            v_low := p_floor;  -- schema 3's floor
          END IF;
        END IF;
      ELSE
        v_hi := ARRAY(SELECT greatest(v_bound, CASE WHEN k.v >= v_frontier THEN v_fbound ELSE k.v END)
                        FROM unnest(p_known) WITH ORDINALITY AS k(v, n) ORDER BY k.n);
      END IF;
      -- The range to scan: below the lowest bound of a lane that may have something to claim.
      IF p_known IS NULL THEN
        NULL;  -- above
      ELSIF p_probe THEN
        -- A poll looks above what the previous claim covered, per lane (schema 2: no lease).
        SELECT min(p_covered[l + 1]), max(v_hi[l + 1]) INTO v_low, v_high
          FROM unnest(p_lanes) AS l WHERE v_hi[l + 1] > p_covered[l + 1];
      ELSE
        SELECT 0, max(v_hi[l + 1]) INTO v_low, v_high FROM unnest(p_lanes) AS l;
        IF p_floor > 0 AND (SELECT r.id FROM {{table}} AS r
                             WHERE r.processed_at IS NULL AND r.dead_lettered_at IS NULL AND r.attempts > 0
                               AND r.id < p_floor
                             ORDER BY r.aggregate_id, r.id LIMIT 1) IS NULL THEN
          -- Schema 3's floor, per lane: a lane held back at the previous claim (covered below the
          -- floor) may have events between its bound and the floor, which go first.
          v_floor := p_floor;
          SELECT least(p_floor, min(p_covered[l + 1])) INTO v_low FROM unnest(p_lanes) AS l;
        END IF;
      END IF;
      IF v_high IS NOT NULL AND v_high >= 0 THEN
        v_low := greatest(coalesce(v_low, 0), 0);
        RETURN QUERY
        WITH s AS (
          SELECT c.id, c.topic, c.aggregate_id, c.payload, c.headers, c.created_at, c.attempts, c.sinks_done
            FROM {{table}} AS c
           WHERE c.processed_at IS NULL AND c.dead_lettered_at IS NULL
             AND c.next_attempt_at <= now()
             AND (c.lease_until IS NULL OR (c.lease_until < now() AND c.lease_owner IS DISTINCT FROM p_owner))
             AND c.lane = ANY(p_lanes)
             AND c.id > v_low AND c.id <= v_high
             AND (p_known IS NULL OR (c.id <= v_hi[c.lane + 1]
                                      AND (NOT p_probe OR c.id > p_covered[c.lane + 1])
                                      AND c.id > least(v_floor, p_covered[c.lane + 1])))
             AND (NOT v_waiting OR
                  (SELECT b.id FROM {{table}} AS b
                    WHERE (b.aggregate_id, b.id) >= (c.aggregate_id, 0) AND (b.aggregate_id, b.id) < (c.aggregate_id, c.id)
                      AND b.processed_at IS NULL AND b.dead_lettered_at IS NULL
                      AND b.attempts > 0 AND b.next_attempt_at > now()
                    ORDER BY b.aggregate_id, b.id LIMIT 1) IS NULL)
           ORDER BY c.id LIMIT p_limit FOR UPDATE OF c SKIP LOCKED),
        leased AS (
          UPDATE {{table}} AS e SET lease_owner = p_owner, lease_until = now() + p_lease_ms * interval '1 millisecond'
           WHERE e.id = ANY(ARRAY(SELECT s.id FROM s)) AND NOT p_probe)
        SELECT s.id, s.topic, s.aggregate_id, s.payload::text, s.headers::text, NULL::text,
               (extract(epoch FROM s.created_at) * 1000000)::int8, s.attempts, s.sinks_done,
               NULL::bigint, NULL::bigint, NULL::bigint[]
          FROM s;
      END IF;
      bound := v_bound;
      last_id := v_last;
      lane_bounds := v_hi;
      RETURN NEXT;
    END
    $fn$ $body$, pg_get_serial_sequence('{{table}}', 'id'), '{{table}}');
END
$create_claim$;

REVOKE ALL ON FUNCTION {{fn}}_claim(text, bigint, smallint[], integer, bigint, boolean, bigint[], jsonb, boolean,
                                         bigint, bigint[], bigint[]) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION {{fn}}_claim(text, bigint, smallint[], integer, bigint, boolean, bigint[], jsonb, boolean,
                                            bigint, bigint[], bigint[]) TO {{relay_role}};
