-- outbox-relay schema, version 3: the claim function's plans no longer depend on the table's
-- statistics, and a drain's claims start where its previous batch ended (p_floor). Placeholders
-- as in 001. Runs in one transaction; writers keep running (no lock on
-- the table: CREATE FUNCTION only; the 11-argument function of schema 2 stays, for older relays).
--
-- Why. {{fn}}_claim runs with generic plans (schema 2 explains why), made once per relay
-- session, from the statistics of that moment. A relay that connects while the table is new,
-- truncated or not yet analyzed keeps plans made for an empty table until an autoanalyze
-- invalidates them, and three of schema 2's statements then had a plan whose cost grows with
-- the table (bench/soak.sh, bench/RESULTS.md "Scale over time"):
--  - "does an event wait for a retry" read the pending index to its end (the retry index has
--    the same predicate and is not preferred without statistics): O(pending events) per claim.
--    A backlog of 600,000 events that writers committed while the relay was down drained at
--    ~8,000 events/s instead of ~100,000/s;
--  - the head-of-line look per candidate row (run only while an event waits for a retry) did the
--    same, from the start of the pending index to the candidate;
--  - the lease joined the claimed rows to a walk of the whole primary key: O(table rows) per
--    full claim. With writers at 40,000 events/s a claim took 4 s, then 25 s, then 89 s, and the
--    relay fell further behind with each one.
-- Now every one of them has one good plan with or without statistics: the retry index read in its
-- own order (aggregate_id, id) with LIMIT 1, with sorts off so that no other index can compete by
-- sorting (the head-of-line look as a range of (aggregate_id, id), same key, lower id), and the
-- lease and the failure outcomes by id = ANY(array) (primary-key lookups). Same arguments, same
-- results.

DO $create_claim$
BEGIN
  EXECUTE format($body$
    CREATE OR REPLACE FUNCTION {{fn}}_claim(p_owner text, p_lease_ms bigint, p_lanes smallint[],
                                                p_limit integer, p_resolved bigint, p_probe boolean,
                                                p_done bigint[], p_failed jsonb, p_delete boolean,
                                                p_reading_last bigint, p_reading_holders text[],
                                                p_floor bigint)
    RETURNS TABLE (id bigint, topic text, aggregate_id text, payload text, headers text, created_at text,
                   created_at_us bigint, attempts integer, sinks_done text[], bound bigint, last_id bigint,
                   reading_last bigint, reading_holders text[])
    -- Generic plans: with custom plans, the plan cache would re-plan the claim on every call
    -- (about a third of the call's cost at a steady stream, measured), and the generic plan of a
    -- range scan on the pending index is the right one for every bound. Index scans only: every
    -- statement here reads a narrow id range or a partial index, but a new or truncated table has
    -- no statistics, and the plans made then (sequential scans) would be kept until an analyze.
    -- No sorts either (schema 3): every ORDER BY here is an index's order, and a plan that sorts is
    -- one that picked the wrong index (see the top of this file).
    LANGUAGE plpgsql VOLATILE SET plan_cache_mode = force_generic_plan SET enable_seqscan = off
      SET enable_sort = off AS $fn$
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
        WHERE e.id = r.id AND e.processed_at IS NULL
          AND e.id = ANY(ARRAY(SELECT (f->>'id')::bigint FROM jsonb_array_elements(p_failed) AS f));
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
             (SELECT w.id FROM {{table}} AS w
               WHERE w.processed_at IS NULL AND w.dead_lettered_at IS NULL
                 AND w.attempts > 0 AND w.next_attempt_at > now()
               ORDER BY w.aggregate_id, w.id LIMIT 1) IS NOT NULL,
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
        ELSIF NOT p_probe AND p_floor > 0 THEN
          -- p_floor (schema 3): a claim made while the relay's previous batch, which ended at
          -- p_floor, is still in its sinks, in a drain in which every earlier batch was delivered
          -- (relay/src/core/loop.cpp): nothing below p_floor in these lanes is claimable but rows
          -- waiting for a retry, which may fall due meanwhile and must then go before the later
          -- events of their key; with one of those below p_floor the claim looks from the start.
          -- Without p_floor a drain walked the pending index from its start at every claim,
          -- through the entries of every row delivered since the last vacuum: a drain of
          -- 2,000,000 events ran at 0.62 x the events/s of a drain of 200,000.
          IF (SELECT r.id FROM {{table}} AS r
               WHERE r.processed_at IS NULL AND r.dead_lettered_at IS NULL AND r.attempts > 0 AND r.id < p_floor
               ORDER BY r.aggregate_id, r.id LIMIT 1) IS NULL THEN
            v_low := p_floor;
          END IF;
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
                  -- The same key, a lower id: as a range of the retry index's (aggregate_id, id),
                  -- which the pending index cannot serve (with aggregate_id = ... it can, and an
                  -- empty table's plan took it: a walk of the pending index per candidate row).
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

-- The claim as schema 2 called it (11 arguments, no floor), for a relay binary older than this
-- schema: the same function, from the start of the pending index.
CREATE OR REPLACE FUNCTION {{fn}}_claim(p_owner text, p_lease_ms bigint, p_lanes smallint[],
                                            p_limit integer, p_resolved bigint, p_probe boolean,
                                            p_done bigint[], p_failed jsonb, p_delete boolean,
                                            p_reading_last bigint, p_reading_holders text[])
RETURNS TABLE (id bigint, topic text, aggregate_id text, payload text, headers text, created_at text,
               created_at_us bigint, attempts integer, sinks_done text[], bound bigint, last_id bigint,
               reading_last bigint, reading_holders text[])
LANGUAGE sql VOLATILE AS $fn$
  SELECT * FROM {{fn}}_claim(p_owner, p_lease_ms, p_lanes, p_limit, p_resolved, p_probe, p_done, p_failed,
                                 p_delete, p_reading_last, p_reading_holders, 0::bigint)
$fn$;

REVOKE ALL ON FUNCTION {{fn}}_claim(text, bigint, smallint[], integer, bigint, boolean, bigint[], jsonb, boolean,
                                         bigint, text[], bigint) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION {{fn}}_claim(text, bigint, smallint[], integer, bigint, boolean, bigint[], jsonb, boolean,
                                            bigint, text[], bigint) TO {{relay_role}};
REVOKE ALL ON FUNCTION {{fn}}_claim(text, bigint, smallint[], integer, bigint, boolean, bigint[], jsonb, boolean,
                                         bigint, text[]) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION {{fn}}_claim(text, bigint, smallint[], integer, bigint, boolean, bigint[], jsonb, boolean,
                                            bigint, text[]) TO {{relay_role}};
