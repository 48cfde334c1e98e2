-- outbox-relay schema, version 2: writers' transactions carry no trigger at all, and the relay
-- finds new events with one cheap statement that also claims them (README, "How wakeups work").
-- Placeholders as in 001. Runs in one transaction; writers keep running: the only table lock
-- (DROP TRIGGER) is held for the few milliseconds of this transaction. Waiting for it (behind a
-- writer's open transaction) queues new writers, so `migrate` waits at most 100 ms, lets them
-- through, and tries again (relay/src/postgres/migrations.hpp).

-- 1. No bell on the write path. A transaction that issued NOTIFY takes a database-wide lock in its
--    pre-commit phase and holds it through the WAL flush, so every notifying commit is serialised
--    (measured: 32 writers at 0.25-0.40x of the same INSERT without triggers; bench/RESULTS.md).
--    The relay polls {{fn}}_claim instead. The function stays, for an operator who prefers
--    push wakeups and accepts that cost:
--      CREATE TRIGGER {{prefix}}_notify AFTER INSERT ON {{table}}
--        FOR EACH STATEMENT EXECUTE FUNCTION {{fn}}_notify();
DROP TRIGGER IF EXISTS {{prefix}}_notify ON {{table}};

-- 2. No fence trigger either. Schema 1 made every event-writing transaction announce, in a
--    statement trigger, an advisory lock carrying the sequence's last value, so that the relay
--    would not publish past an open writer. Even an empty PL/pgSQL statement trigger costs 32
--    writers 10-20 % of their commit rate here; with the sequence read (an exclusive lock on the
--    sequence's page, which every nextval also takes) it cost 16-19 % (bench/RESULTS.md).
--    Writers already announce themselves for free: an INSERT takes ROW EXCLUSIVE on the table
--    when the statement starts, before it draws an id, and holds it to the end of its
--    transaction. {{fn}}_claim reads those locks instead (see below). A relay of schema 1
--    must not run against this schema (it would see no fences): upgrade the binary first.
DROP TRIGGER IF EXISTS {{prefix}}_fence ON {{table}};
DROP FUNCTION IF EXISTS {{fn}}_fence();

-- 3. The relay's claim, in one round trip. Two reasons for a function:
--    - the claim bound must be read in statements that run before the claim's snapshot is taken;
--      in READ COMMITTED every statement of a VOLATILE function takes a fresh snapshot, so they
--      still run in that order, without more round trips;
--    - the relay calls it every few milliseconds while a stream is flowing (that is how it
--      learns of new events now): with nothing new it costs one index probe and returns at once.
--
--  p_done, p_failed, p_delete: the outcomes of the batch the relay published since its previous
--  call, written first, in this transaction (the relay's complete statement, pg_store.cpp: p_done
--  the delivered ids, marked, or deleted when p_delete; p_failed the other outcomes as JSON).
--  p_probe: the relay polls; then the function returns early when no event was committed above
--  p_resolved, and claims only above p_resolved.
--
--  The bound (per-key order with writers that commit out of id order: an id must not be published
--  while an open transaction may still commit a lower one). p_resolved: every id up to it is
--  committed or will never be (the bound of the previous call), or -1 when unknown. Above it:
--  - every id up to the first one that is not visible is committed (ids are unique to their
--    transaction), so the bound is that id - 1, or the last id drawn when none is missing;
--  - a missing id is either in an open transaction or gone (rolled back, deleted). A "reading"
--    tells them apart: the last id drawn, read first, then the transactions holding ROW
--    EXCLUSIVE on the table (pg_locks). Every id up to that last id was drawn by a transaction
--    that had taken the lock before (at the start of its INSERT) and holds it to its end; so
--    once none of the reading's holders is still open, every id up to the reading's last id is
--    committed or gone. The relay keeps one reading (p_reading_last, p_reading_holders) from
--    call to call; this function checks it, and takes a new one when it has none.
--  So pg_locks is read only while an id is missing; and a writer that stays open holds back only
--  the ids above its own, and only until it ends (keep event-writing transactions short).
--
--  Returns the claimed rows in id order, then one row whose id is NULL carrying the bound, the
--  last id drawn (last_id > bound: held back by an open writer) and the reading to keep.
DO $create_claim$
BEGIN
  EXECUTE format($body$
    CREATE OR REPLACE FUNCTION {{fn}}_claim(p_owner text, p_lease_ms bigint, p_lanes smallint[],
                                                p_limit integer, p_resolved bigint, p_probe boolean,
                                                p_done bigint[], p_failed jsonb, p_delete boolean,
                                                p_reading_last bigint, p_reading_holders text[])
    RETURNS TABLE (id bigint, topic text, aggregate_id text, payload text, headers text, created_at text,
                   created_at_us bigint, attempts integer, sinks_done text[], bound bigint, last_id bigint,
                   reading_last bigint, reading_holders text[])
    -- Generic plans: with custom plans, the plan cache would re-plan the claim on every call
    -- (about a third of the call's cost at a steady stream, measured), and the generic plan of a
    -- range scan on the pending index is the right one for every bound. Index scans only: every
    -- statement here reads a narrow id range or a partial index, but a new or truncated table has
    -- no statistics, and the plans made then (sequential scans) would be kept until an analyze.
    LANGUAGE plpgsql VOLATILE SET plan_cache_mode = force_generic_plan SET enable_seqscan = off AS $fn$
    DECLARE
      v_last     bigint;
      v_resolved bigint := p_resolved;
      v_bound    bigint;
      v_low      bigint := 0;
      v_new      boolean;
      v_waiting  boolean;
      v_async    boolean;
      v_holders  text[];
      v_from     bigint;
      v_moved    bigint;
      v_looked   boolean := false;
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
        WHERE e.id = r.id AND e.processed_at IS NULL;
      END IF;
      reading_last := p_reading_last;
      reading_holders := p_reading_holders;
      -- One statement (each one costs an executor start-up): the last id drawn; whether anything
      -- was committed above p_resolved (ORDER BY + LIMIT, not EXISTS: the generic plan of EXISTS
      -- is a sequential scan); whether an event waits for a retry (head-of-line per key, below).
      -- Lease, mark and failure updates alike need not wait for the WAL flush: a lost lease makes
      -- a row claimable again, a lost mark makes it delivered again (at least once, as always),
      -- and only a crash of Postgres itself loses them (README, "Failure model").
      SELECT v.last,
             p_resolved < 0 OR (SELECT n.id FROM {{table}} AS n WHERE n.id > p_resolved ORDER BY n.id LIMIT 1) IS NOT NULL,
             EXISTS (SELECT 1 FROM {{table}} AS w
                      WHERE w.processed_at IS NULL AND w.dead_lettered_at IS NULL
                        AND w.attempts > 0 AND w.next_attempt_at > now()),
             set_config('synchronous_commit', 'off', true) = 'off'
        INTO v_last, v_new, v_waiting, v_async
        FROM (SELECT coalesce(pg_sequence_last_value(%1$L::regclass), 0) AS last) AS v;
      IF p_probe AND NOT v_new THEN
        bound := p_resolved;
        last_id := p_resolved;
        RETURN NEXT;
        RETURN;
      END IF;
      -- The bound: from v_from (everything up to it is committed or gone), the highest id up to
      -- v_last before the first one that is not visible. The primary key is walked from v_from and
      -- the walk stops at the first id whose successor is missing: it costs about the ids
      -- committed since the previous call. At most twice: again when a reading lets v_from move.
      v_from := v_resolved;
      LOOP
        IF v_from < 0 THEN
          v_bound := -1;
        ELSIF v_from >= v_last THEN
          v_bound := v_from;
        ELSE
          SELECT CASE
                   WHEN NOT EXISTS (SELECT 1 FROM {{table}} AS f WHERE f.id = v_from + 1) THEN v_from
                   ELSE coalesce((SELECT g.id FROM {{table}} AS g
                                   WHERE g.id > v_from AND g.id < v_last
                                     AND NOT EXISTS (SELECT 1 FROM {{table}} AS h WHERE h.id = g.id + 1)
                                   ORDER BY g.id LIMIT 1), v_last)
                 END
            INTO v_bound;
        END IF;
        IF v_bound >= v_last THEN
          reading_last := -1;  -- everything up to v_last is committed: the kept reading says no more
          EXIT;
        END IF;
        EXIT WHEN v_looked;
        -- Most gaps are a writer between its INSERT and its commit, gone by the next poll: read
        -- the locks only when the bound made no progress since the previous call (or is unknown),
        -- or to check a reading kept from before.
        EXIT WHEN p_resolved >= 0 AND v_bound > p_resolved AND reading_last < 0;
        v_looked := true;
        -- An id is missing: look at the writers, in a later statement than the one that read
        -- v_last (the order the argument above needs).
        SELECT coalesce(array_agg(l.virtualtransaction), '{}') INTO v_holders
          FROM pg_locks AS l
         WHERE l.locktype = 'relation' AND l.relation = %2$L::regclass AND l.mode = 'RowExclusiveLock'
           AND l.granted AND l.pid IS DISTINCT FROM pg_backend_pid();
        v_moved := v_resolved;
        IF reading_last >= 0 AND NOT (reading_holders && v_holders) THEN
          v_moved := greatest(v_moved, reading_last);  -- the kept reading has cleared
          reading_last := -1;
        END IF;
        IF cardinality(v_holders) = 0 THEN
          v_moved := greatest(v_moved, v_last);  -- no writer is open at all
          reading_last := -1;
        ELSIF reading_last < 0 THEN
          reading_last := v_last;  -- a new reading, checked by the next call
          reading_holders := v_holders;
        END IF;
        EXIT WHEN v_moved <= v_bound;
        v_from := v_moved;
      END LOOP;
      IF NOT (p_probe AND v_bound <= p_resolved) AND v_bound >= 0 THEN
        -- A poll looks only above p_resolved: what is pending below it waits for a retry, was
        -- released or belongs to lanes just gained, and the relay claims those with p_probe off.
        -- So a poll's scan never walks the pending index's dead entries left by delivered rows.
        IF p_probe AND p_resolved > 0 THEN
          v_low := p_resolved;
        END IF;
        -- A poll writes no lease: it claims only above p_resolved, which every earlier claim of
        -- the relay's lanes (its own, as no other instance claims in them) is below, and the
        -- relay writes the poll's outcomes before it claims without p_probe or hands lanes over
        -- (relay/src/core/store.hpp, probe_claim). FOR UPDATE SKIP LOCKED still keeps out any
        -- session that might claim the same rows at the same moment (an operator's tool). That
        -- leaves one row version per event to the relay, the mark, instead of two.
        -- created_at as text is left NULL: the relay formats it from the microseconds.
        RETURN QUERY
        WITH s AS (
          SELECT c.id, c.topic, c.aggregate_id, c.payload, c.headers, c.created_at, c.attempts, c.sinks_done
            FROM {{table}} AS c
           WHERE c.processed_at IS NULL AND c.dead_lettered_at IS NULL
             AND c.next_attempt_at <= now()
             -- Never a row this relay leased itself: it is in flight here (in the sinks, or its
             -- outcome not yet written), however long that takes. Another instance's lease is
             -- honoured until it expires (and is cleared when this one gains its lanes).
             AND (c.lease_until IS NULL OR (c.lease_until < now() AND c.lease_owner IS DISTINCT FROM p_owner))
             AND c.lane = ANY(p_lanes)
             AND c.id > v_low AND c.id <= v_bound
             -- The OR keeps the retry-index look a per-row subplan, run only while some event
             -- waits for a retry.
             AND (NOT v_waiting OR
                  NOT EXISTS (SELECT 1 FROM {{table}} AS b
                               WHERE b.aggregate_id = c.aggregate_id AND b.id < c.id
                                 AND b.processed_at IS NULL AND b.dead_lettered_at IS NULL
                                 AND b.attempts > 0 AND b.next_attempt_at > now()))
           ORDER BY c.id LIMIT p_limit FOR UPDATE OF c SKIP LOCKED),
        leased AS (
          UPDATE {{table}} AS e SET lease_owner = p_owner, lease_until = now() + p_lease_ms * interval '1 millisecond'
            FROM s WHERE e.id = s.id AND NOT p_probe)
        SELECT s.id, s.topic, s.aggregate_id, s.payload::text, s.headers::text, NULL::text,
               (extract(epoch FROM s.created_at) * 1000000)::int8, s.attempts, s.sinks_done,
               NULL::bigint, NULL::bigint, NULL::bigint, NULL::text[]
          FROM s;
      END IF;
      bound := v_bound;
      last_id := v_last;
      RETURN NEXT;
    END
    $fn$ $body$, pg_get_serial_sequence('{{table}}', 'id'), '{{table}}');
END
$create_claim$;

REVOKE ALL ON FUNCTION {{fn}}_claim(text, bigint, smallint[], integer, bigint, boolean, bigint[], jsonb, boolean,
                                         bigint, text[]) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION {{fn}}_claim(text, bigint, smallint[], integer, bigint, boolean, bigint[], jsonb, boolean,
                                            bigint, text[]) TO {{relay_role}};
