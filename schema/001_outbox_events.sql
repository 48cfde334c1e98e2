-- outbox-relay schema, version 1.
-- Placeholders filled by `outbox-relay migrate`: {{table}} (schema-qualified and quoted),
-- {{name}} (the bare table name, for index names), {{fence_tag}} (a 22-bit number
-- derived from the table, see the fence below), {{prefix}} (the bare name without a
-- trailing "_events", for trigger names), {{schema}} and {{function_schema}} (quoted: the table's,
-- and its functions'), {{fn}} (the prefix qualified by the functions' schema: "app".outbox gives
-- "app".outbox_publish, so that two outbox tables in two schemas have functions of their own),
-- {{writer_role}} and {{relay_role}} (database.roles), {{channel}} (NOTIFY channel).
-- The whole file runs in one transaction; the migrate command records the version afterwards.

CREATE TABLE IF NOT EXISTS {{table}} (
  -- Writer columns (the writer contract, DESIGN section 2).
  id               bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
  topic            text        NOT NULL,
  aggregate_id     text        NOT NULL,
  payload          jsonb       NOT NULL,
  headers          jsonb       NOT NULL DEFAULT '{}',
  created_at       timestamptz NOT NULL DEFAULT clock_timestamp(),
  processed_at     timestamptz,                     -- NULL = not yet delivered
  -- Relay bookkeeping. Writers leave these alone.
  attempts         integer     NOT NULL DEFAULT 0,  -- failed delivery attempts so far
  next_attempt_at  timestamptz NOT NULL DEFAULT '-infinity', -- not claimed before this time
  lease_owner      text,                            -- relay instance holding the row
  lease_until      timestamptz,                     -- lease expiry: claimable again after it
  last_error       text,                            -- why the last attempt failed
  dead_lettered_at timestamptz,                     -- set: given up, kept for `failed ...`
  sinks_done       text[]      NOT NULL DEFAULT '{}', -- sinks that acknowledged (multi-sink routes)
  -- Ordering lane: events of one aggregate_id share a lane; a relay publishes a lane only while
  -- it holds that lane's advisory lock. 64 lanes, fixed.
  lane             smallint    GENERATED ALWAYS AS ((hashtext(aggregate_id) & 63)::smallint) STORED,
  CONSTRAINT {{name}}_headers_is_object CHECK (jsonb_typeof(headers) = 'object')
)
-- Half of each page stays free when rows are inserted, so the claim's lease update can put the
-- new row version on the same page without touching any index (a HOT update: the lease columns
-- are not indexed). Measured: the relay's claim+complete drain rate goes from ~15k to ~25k rows/s
-- on the 2-core dev machine (bench/RESULTS.md). Costs disk space for rows not yet cleaned up.
WITH (fillfactor = 50);

-- The claim walks pending rows in id order; it never touches delivered or dead-lettered rows.
CREATE INDEX IF NOT EXISTS {{name}}_pending_idx ON {{table}} (id)
  WHERE processed_at IS NULL AND dead_lettered_at IS NULL;
-- Head-of-line per key: finds an earlier failed event of the same key that still waits.
CREATE INDEX IF NOT EXISTS {{name}}_retry_idx ON {{table}} (aggregate_id, id)
  WHERE processed_at IS NULL AND dead_lettered_at IS NULL AND attempts > 0;
-- Operator views and retention.
CREATE INDEX IF NOT EXISTS {{name}}_dead_idx ON {{table}} (dead_lettered_at)
  WHERE dead_lettered_at IS NOT NULL;
CREATE INDEX IF NOT EXISTS {{name}}_processed_idx ON {{table}} (processed_at)
  WHERE processed_at IS NOT NULL;

-- The fence: per-key id order needs to know which ids may still appear. Ids come from a
-- sequence when a row is inserted, but become visible at commit, so a committed id 447 may be
-- followed by a commit of id 343 from a transaction that started earlier. Every transaction that
-- inserts events therefore takes, before its first row gets an id, a shared transaction-level
-- advisory lock whose key carries the sequence's last value L (all its ids will be > L). The relay
-- reads those locks and publishes no id above the smallest such L while that writer is open, so
-- no later-committing writer can slip an older id of a key behind a newer one. Shared locks never
-- block writers; one lock per transaction (remembered in a transaction-local setting). The relay
-- also bounds each claim by the sequence's last value read together with the fences, so that a
-- writer opening between that reading and the claim cannot be overtaken (relay/src/postgres/
-- pg_store.cpp explains the argument).
-- Lock key: ({{fence_tag}} << 40) | L, for L < 2^40.
-- The sequence's schema-qualified name is fixed into the function when it is created, because the
-- function runs with a safe search_path (it is SECURITY DEFINER, so writers need no sequence grant).
DO $create_fence$
BEGIN
  EXECUTE format($body$
    CREATE OR REPLACE FUNCTION {{fn}}_fence() RETURNS trigger LANGUAGE plpgsql
    SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $fn$
    BEGIN
      IF current_setting('outbox_relay.fence_{{name}}', true) IS DISTINCT FROM 'on' THEN
        PERFORM pg_advisory_xact_lock_shared(({{fence_tag}}::bigint << 40) |
          (coalesce(pg_sequence_last_value(%L::regclass), 0) & 1099511627775));
        PERFORM set_config('outbox_relay.fence_{{name}}', 'on', true);
      END IF;
      RETURN NULL;
    END
    $fn$ $body$, pg_get_serial_sequence('{{table}}', 'id'));
END
$create_fence$;

DROP TRIGGER IF EXISTS {{prefix}}_fence ON {{table}};
CREATE TRIGGER {{prefix}}_fence BEFORE INSERT ON {{table}}
  FOR EACH STATEMENT EXECUTE FUNCTION {{fn}}_fence();

-- The bell, not the parcel: one empty notification per inserting statement. Postgres folds
-- identical notifications of one transaction into one.
CREATE OR REPLACE FUNCTION {{fn}}_notify() RETURNS trigger LANGUAGE plpgsql AS $fn$
BEGIN
  PERFORM pg_notify('{{channel}}', '');
  RETURN NULL;
END
$fn$;

DROP TRIGGER IF EXISTS {{prefix}}_notify ON {{table}};
CREATE TRIGGER {{prefix}}_notify AFTER INSERT ON {{table}}
  FOR EACH STATEMENT EXECUTE FUNCTION {{fn}}_notify();

-- Convenience for writers: returns the new event id.
CREATE OR REPLACE FUNCTION {{fn}}_publish(p_topic text, p_aggregate_id text, p_payload jsonb,
                                            p_headers jsonb DEFAULT '{}')
RETURNS bigint LANGUAGE sql AS $fn$
  INSERT INTO {{table}} (topic, aggregate_id, payload, headers)
  VALUES (p_topic, p_aggregate_id, p_payload, COALESCE(p_headers, '{}'))
  RETURNING id
$fn$;

-- Least-privilege roles (NOLOGIN groups: grant them to your login roles).
DO $roles$
BEGIN
  IF NOT EXISTS (SELECT 1 FROM pg_roles WHERE rolname = '{{writer_role}}') THEN
    CREATE ROLE {{writer_role}} NOLOGIN;
  END IF;
  IF NOT EXISTS (SELECT 1 FROM pg_roles WHERE rolname = '{{relay_role}}') THEN
    CREATE ROLE {{relay_role}} NOLOGIN;
  END IF;
END
$roles$;

-- Both reach the table's schema (and the functions' where it is another): nothing else of it.
GRANT USAGE ON SCHEMA {{schema}} TO {{writer_role}}, {{relay_role}};
GRANT USAGE ON SCHEMA {{function_schema}} TO {{writer_role}}, {{relay_role}};
-- Writers may only add events, directly or through the function.
GRANT INSERT (topic, aggregate_id, payload, headers) ON {{table}} TO {{writer_role}};
-- RETURNING id needs SELECT on id, nothing more.
GRANT SELECT (id) ON {{table}} TO {{writer_role}};
GRANT EXECUTE ON FUNCTION {{fn}}_publish(text, text, jsonb, jsonb) TO {{writer_role}};
-- The relay reads, claims, completes and (on_success: delete, retention) deletes.
GRANT SELECT, UPDATE, DELETE ON {{table}} TO {{relay_role}};
-- The claim reads the id sequence's last value (see the fence above).
DO $grant_sequence$
BEGIN
  EXECUTE format('GRANT SELECT ON SEQUENCE %s TO {{relay_role}}', pg_get_serial_sequence('{{table}}', 'id'));
END
$grant_sequence$;
