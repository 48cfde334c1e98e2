-- outbox-relay schema, version 2: writers' commits carry no NOTIFY, and the relay finds new
-- events with one cheap statement that also claims them (README, "How wakeups work").
-- Placeholders as in 001. Runs in one transaction; writers keep running: the only table lock
-- (DROP/CREATE TRIGGER) is held for the few milliseconds of this transaction. Waiting for it
-- (behind a writer's open transaction) queues new writers, so `migrate` waits at most 100 ms,
-- lets them through, and tries again (relay/src/postgres/migrations.hpp).

-- 1. No bell on the write path. A transaction that issued NOTIFY takes a database-wide lock in its
--    pre-commit phase and holds it through the WAL flush, so every notifying commit is serialised
--    (measured: 32 writers at 0.26-0.40x of the same INSERT without triggers; bench/RESULTS.md).
--    The relay polls {{prefix}}_claim instead. The function stays, for an operator who prefers
--    push wakeups and accepts that cost:
--      CREATE TRIGGER {{prefix}}_notify AFTER INSERT ON {{table}}
--        FOR EACH STATEMENT EXECUTE FUNCTION {{prefix}}_notify();
DROP TRIGGER IF EXISTS {{prefix}}_notify ON {{table}};

-- 2. The fence (see 001) is unchanged in meaning, and cheaper on every writer's commit:
--    - its trigger runs only for the first inserting statement of a transaction (the WHEN clause is
--      checked by the executor, without calling PL/pgSQL, for the later ones);
--    - the function runs one statement instead of three (each costs an executor start-up);
--    - no SET search_path (a GUC save and restore on every call): instead every function and
--      operator in it is schema-qualified, so a caller's search_path cannot substitute its own
--      objects in this SECURITY DEFINER function.
DO $create_fence$
BEGIN
  EXECUTE format($body$
    CREATE OR REPLACE FUNCTION {{prefix}}_fence() RETURNS trigger LANGUAGE plpgsql
    SECURITY DEFINER AS $fn$
    BEGIN
      PERFORM pg_catalog.pg_advisory_xact_lock_shared(
                ({{fence_tag}}::pg_catalog.int8 OPERATOR(pg_catalog.<<) 40) OPERATOR(pg_catalog.|)
                (COALESCE(pg_catalog.pg_sequence_last_value(%L::pg_catalog.regclass), 0)
                 OPERATOR(pg_catalog.&) 1099511627775::pg_catalog.int8)),
              pg_catalog.set_config('outbox_relay.fence_{{name}}', 'on', true);
      RETURN NULL;
    END
    $fn$ $body$, pg_get_serial_sequence('{{table}}', 'id'));
END
$create_fence$;

DROP TRIGGER IF EXISTS {{prefix}}_fence ON {{table}};
CREATE TRIGGER {{prefix}}_fence BEFORE INSERT ON {{table}}
  FOR EACH STATEMENT
  WHEN (pg_catalog.current_setting('outbox_relay.fence_{{name}}', true) IS DISTINCT FROM 'on')
  EXECUTE FUNCTION {{prefix}}_fence();

-- 3. The relay's claim, in one round trip. Two reasons for a function:
--    - the claim bound must be read in a statement that runs before the claim's snapshot is taken
--      (pg_store.cpp explains why); in READ COMMITTED every statement of a VOLATILE function takes
--      a fresh snapshot, so the bound and the claim still run in that order, without a second
--      round trip;
--    - the relay calls it every few milliseconds while a stream is flowing (that is how it
--      learns of new events now): with nothing new it costs one index probe and returns at once.
--
--  p_done, p_failed, p_delete: the outcomes of the batch the relay published since its previous
--  call, written first, in this transaction (the relay's complete statement, pg_store.cpp: p_done
--  the delivered ids, marked, or deleted when p_delete; p_failed the other outcomes as JSON).
--  p_resolved: every id up to it is known to be committed or gone (the bound the relay got from
--  its previous call), or -1 when unknown. p_probe: the relay polls; then the function returns
--  early when no event was committed above p_resolved, or when nothing new is resolved.
--
--  The bound, without scanning pg_locks when it can: if every id in (p_resolved, last drawn id]
--  is visible, no open writer can hold an id at or below that last id (each id belongs to one
--  transaction, and those are all committed), so the bound is the last drawn id. Otherwise
--  (a writer is open, rolled back, or rows were deleted) the writers' fences decide, as in 001.
--
--  Returns the claimed rows in id order, then one row whose id is NULL carrying the bound and the
--  last id drawn (last_id > bound: held back by an open writer's fence).
DO $create_claim$
BEGIN
  EXECUTE format($body$
    CREATE OR REPLACE FUNCTION {{prefix}}_claim(p_owner text, p_lease_ms bigint, p_lanes smallint[],
                                                p_limit integer, p_resolved bigint, p_probe boolean,
                                                p_done bigint[], p_failed jsonb, p_delete boolean)
    RETURNS TABLE (id bigint, topic text, aggregate_id text, payload text, headers text, created_at text,
                   created_at_us bigint, attempts integer, sinks_done text[], bound bigint, last_id bigint)
    -- Generic plans: with custom plans, the plan cache would re-plan the claim on every call
    -- (about a third of the call's cost at a steady stream, measured), and the generic plan of a
    -- range scan on the pending index is the right one for every bound.
    LANGUAGE plpgsql VOLATILE SET plan_cache_mode = force_generic_plan AS $fn$
    DECLARE
      v_last     bigint;
      v_fence    bigint;
      v_bound    bigint;
      v_low      bigint := 0;
      v_new      boolean;
      v_gapless  boolean;
      v_waiting  boolean;
      v_async    boolean;
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
      -- One statement (each one costs an executor start-up): the last id drawn; whether anything
      -- was committed above p_resolved; whether every id in (p_resolved, last] is visible, hence
      -- committed (the count may only come out short, never wrongly full); whether an event waits
      -- for a retry (head-of-line per key, below). Lease, mark and failure updates alike need not
      -- wait for the WAL flush: a lost lease makes a row claimable again, a lost mark makes it
      -- delivered again (at least once, as always), and only a crash of Postgres itself loses
      -- them (README, "Failure model").
      SELECT v.last,
             -- (ORDER BY + LIMIT, not EXISTS: the generic plan of EXISTS is a sequential scan.)
             p_resolved < 0 OR (SELECT n.id FROM {{table}} AS n WHERE n.id > p_resolved ORDER BY n.id LIMIT 1) IS NOT NULL,
             CASE WHEN p_resolved >= 0 AND v.last - p_resolved <= 10000
                  THEN (SELECT count(*) FROM {{table}} AS g WHERE g.id > p_resolved AND g.id <= v.last)
                       = v.last - p_resolved
                  ELSE false END,
             EXISTS (SELECT 1 FROM {{table}} AS w
                      WHERE w.processed_at IS NULL AND w.dead_lettered_at IS NULL
                        AND w.attempts > 0 AND w.next_attempt_at > now()),
             set_config('synchronous_commit', 'off', true) = 'off'
        INTO v_last, v_new, v_gapless, v_waiting, v_async
        FROM (SELECT coalesce(pg_sequence_last_value(%1$L::regclass), 0) AS last) AS v;
      IF p_probe AND NOT v_new THEN
        bound := p_resolved;
        last_id := p_resolved;
        RETURN NEXT;
        RETURN;
      END IF;
      IF v_gapless THEN
        -- No open writer can hold an id at or below v_last: each id belongs to one transaction,
        -- and those are all committed.
        v_bound := v_last;
      ELSE
        -- A writer is open, rolled back, or rows were deleted: the writers' fences decide, read in
        -- this later statement. The order matters: every id up to v_last was drawn before v_last
        -- was read, by a writer that had taken its fence before drawing it; so that writer is in
        -- the locks read now if it is still open, and otherwise committed (visible to the claim
        -- below, whose snapshot comes later) or rolled back. (Reading the last id after the locks
        -- would miss a writer that took its fence and drew an id in between, and the poll, which
        -- never looks below the bound again, would leave that id to the sweep.)
        SELECT COALESCE(min((l.classid::int8 << 32 | l.objid::int8) & 1099511627775), 9223372036854775807)
          INTO v_fence
          FROM pg_locks AS l
         WHERE l.locktype = 'advisory' AND l.objsubid = 1
           AND l.database = (SELECT d.oid FROM pg_database AS d WHERE d.datname = current_database())
           AND (l.classid::int8 << 32 | l.objid::int8) >> 40 = {{fence_tag}};
        v_bound := least(v_last, v_fence);
      END IF;
      IF NOT (p_probe AND v_bound <= p_resolved) THEN
        -- A poll looks only above p_resolved: what is pending below it waits for a retry, was
        -- released or belongs to lanes just gained, and the relay claims those with p_probe off.
        -- So a poll's scan never walks the pending index's dead entries left by delivered rows.
        IF p_probe AND p_resolved > 0 THEN
          v_low := p_resolved;
        END IF;
        RETURN QUERY
        UPDATE {{table}} AS e SET lease_owner = p_owner, lease_until = now() + p_lease_ms * interval '1 millisecond'
          FROM (SELECT c.id FROM {{table}} AS c
                 WHERE c.processed_at IS NULL AND c.dead_lettered_at IS NULL
                   AND c.next_attempt_at <= now()
                   AND (c.lease_until IS NULL OR c.lease_until < now())
                   AND c.lane = ANY(p_lanes)
                   AND c.id > v_low AND c.id <= v_bound
                   -- The OR keeps the retry-index look a per-row subplan, run only while some
                   -- event waits for a retry.
                   AND (NOT v_waiting OR
                        NOT EXISTS (SELECT 1 FROM {{table}} AS b
                                     WHERE b.aggregate_id = c.aggregate_id AND b.id < c.id
                                       AND b.processed_at IS NULL AND b.dead_lettered_at IS NULL
                                       AND b.attempts > 0 AND b.next_attempt_at > now()))
                 ORDER BY c.id LIMIT p_limit FOR UPDATE SKIP LOCKED) AS s
         WHERE e.id = s.id
        RETURNING e.id, e.topic, e.aggregate_id, e.payload::text, e.headers::text,
                  to_char(e.created_at AT TIME ZONE 'UTC', 'YYYY-MM-DD"T"HH24:MI:SS.US"Z"'),
                  (extract(epoch FROM e.created_at) * 1000000)::int8, e.attempts, e.sinks_done,
                  NULL::bigint, NULL::bigint;
      END IF;
      bound := v_bound;
      last_id := v_last;
      RETURN NEXT;
    END
    $fn$ $body$, pg_get_serial_sequence('{{table}}', 'id'));
END
$create_claim$;

REVOKE ALL ON FUNCTION {{prefix}}_claim(text, bigint, smallint[], integer, bigint, boolean, bigint[], jsonb, boolean)
  FROM PUBLIC;
GRANT EXECUTE ON FUNCTION {{prefix}}_claim(text, bigint, smallint[], integer, bigint, boolean, bigint[], jsonb, boolean)
  TO outbox_relay;
