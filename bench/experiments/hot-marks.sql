-- An experiment for bench/soak.sh --table-sql (issue 11), not a schema: what would marks cost
-- if they were HOT updates? A mark sets processed_at, and processed_at is in the predicates of
-- the pending and retry indexes and is the key of the processed index, so every mark writes a
-- new row version with new entries in the primary key and the processed index, and leaves a dead
-- version that vacuum must remove from three indexes. With no index naming processed_at (and
-- fillfactor 50 leaving room on the page), the mark is a heap-only update: no index entry, and
-- the old version is pruned on its page without vacuum's index passes.
--
-- On outbox_events only (point 2's tables keep the schema). It drops what such a schema would
-- have to replace: the processed index (retention walks it: run with --retention off), and
-- processed_at in the pending index's predicate. The claim's scans then pass delivered rows,
-- filtered in the heap: a poll starts at the last id it saw and passes none, but the sweep, a
-- drain's first claim and the metrics' pending count walk every delivered row from the table's
-- start (run with sweep_interval: 1h; the rest stays). A real schema needs a low-water mark for
-- those: measured, a drain that claims from the start brings the relay down within minutes.
-- bench/RESULTS.md, "HOT marks, an experiment", has the figures.
DROP INDEX outbox_events_processed_idx;
DROP INDEX outbox_events_pending_idx;
CREATE INDEX outbox_events_pending_idx ON outbox_events (id) WHERE dead_lettered_at IS NULL;
DROP INDEX outbox_events_retry_idx;
CREATE INDEX outbox_events_retry_idx ON outbox_events (aggregate_id, id)
  WHERE dead_lettered_at IS NULL AND attempts > 0;
