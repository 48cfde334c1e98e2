-- Runs once, when the compose Postgres volume is created: login roles for the demo, members of
-- the group roles that `outbox-relay migrate` grants to (created here first; migrate keeps them).
CREATE ROLE outbox_relay NOLOGIN;
CREATE ROLE outbox_writer NOLOGIN;
CREATE ROLE relay LOGIN PASSWORD 'relay' IN ROLE outbox_relay;
CREATE ROLE writer LOGIN PASSWORD 'writer' IN ROLE outbox_writer;
