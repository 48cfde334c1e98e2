-- outbox-relay schema, version 4: autovacuum settings for a queue table. Placeholders as in 001.
-- Runs in one transaction; writers keep running: ALTER TABLE ... SET (storage parameters) takes
-- SHARE UPDATE EXCLUSIVE, which no INSERT, UPDATE or DELETE conflicts with (it waits only for a
-- VACUUM in progress on the table; migrate's lock_timeout makes it try again meanwhile).
--
-- Why (bench/soak.sh, bench/RESULTS.md "Scale over time"). Every event leaves dead row versions
-- behind (the lease, the mark, the delete, retention), so at a steady stream autovacuum visits the
-- table once a minute and finds up to a million dead rows there. Two of PostgreSQL's defaults then
-- hurt a queue table:
--  - Truncation. When the last pages of the heap are empty (a drained backlog, the rows deleted
--    since the previous pass), VACUUM gives them back to the file system, under an ACCESS EXCLUSIVE
--    lock on the table: every writer's INSERT and the relay's claim wait behind it (for up to 20 ms
--    per attempt, several attempts a pass). The pages are needed again a minute later, so the table
--    only went up and down (a saw-tooth of 510-735 MiB in a 30-minute soak at 16,600 events/s)
--    while the relay's latency had a spike at each pass. Off: the heap keeps its pages and reuses
--    their free space. An operator who wants the space back after an exceptional backlog runs
--    `VACUUM (TRUNCATE) <table>` once (README, "Long runs").
--  - The scale factor. By default a table is vacuumed once 20 % of its rows are dead: a table that
--    keeps a long history (on_success: mark without retention, 10 million rows) waits for 2 million
--    dead rows, and the claim walks their dead index entries meanwhile. A fixed number of rows
--    instead, whatever the table's size: vacuumed when 10,000 rows are dead (at most once per
--    autovacuum_naptime, 1 minute by default, whatever the rate).
ALTER TABLE {{table}} SET (
  vacuum_truncate = false,
  toast.vacuum_truncate = false,
  autovacuum_vacuum_scale_factor = 0,
  autovacuum_vacuum_threshold = 10000
);
