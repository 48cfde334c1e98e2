-- outbox-relay schema, version 1.
-- Placeholders filled by `outbox-relay migrate`: {{table}} (possibly schema-qualified),
-- {{name}} (the bare table name, for index names), {{prefix}} (the bare name without a
-- trailing "_events": outbox_events gives outbox_publish), {{channel}} (NOTIFY channel).
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
);

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

-- The bell, not the parcel: one empty notification per inserting statement. Postgres folds
-- identical notifications of one transaction into one.
CREATE OR REPLACE FUNCTION {{prefix}}_notify() RETURNS trigger LANGUAGE plpgsql AS $fn$
BEGIN
  PERFORM pg_notify('{{channel}}', '');
  RETURN NULL;
END
$fn$;

DROP TRIGGER IF EXISTS {{prefix}}_notify ON {{table}};
CREATE TRIGGER {{prefix}}_notify AFTER INSERT ON {{table}}
  FOR EACH STATEMENT EXECUTE FUNCTION {{prefix}}_notify();

-- Convenience for writers: returns the new event id.
CREATE OR REPLACE FUNCTION {{prefix}}_publish(p_topic text, p_aggregate_id text, p_payload jsonb,
                                            p_headers jsonb DEFAULT '{}')
RETURNS bigint LANGUAGE sql AS $fn$
  INSERT INTO {{table}} (topic, aggregate_id, payload, headers)
  VALUES (p_topic, p_aggregate_id, p_payload, COALESCE(p_headers, '{}'))
  RETURNING id
$fn$;

-- Least-privilege roles (NOLOGIN groups: grant them to your login roles).
DO $roles$
BEGIN
  IF NOT EXISTS (SELECT 1 FROM pg_roles WHERE rolname = 'outbox_writer') THEN
    CREATE ROLE outbox_writer NOLOGIN;
  END IF;
  IF NOT EXISTS (SELECT 1 FROM pg_roles WHERE rolname = 'outbox_relay') THEN
    CREATE ROLE outbox_relay NOLOGIN;
  END IF;
END
$roles$;

-- Writers may only add events, directly or through the function.
GRANT INSERT (topic, aggregate_id, payload, headers) ON {{table}} TO outbox_writer;
-- RETURNING id needs SELECT on id, nothing more.
GRANT SELECT (id) ON {{table}} TO outbox_writer;
GRANT EXECUTE ON FUNCTION {{prefix}}_publish(text, text, jsonb, jsonb) TO outbox_writer;
-- The relay reads, claims, completes and (on_success: delete, retention) deletes.
GRANT SELECT, UPDATE, DELETE ON {{table}} TO outbox_relay;
