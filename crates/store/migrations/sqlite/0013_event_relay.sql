-- Order events: each sink's lease, pause and last error, and its delivered position per
-- stream of the event log. Same logical schema as migrations/mysql/0013_event_relay.sql,
-- which says why; an expand migration (schema_compat unchanged).
CREATE TABLE event_sinks (
    sink             TEXT NOT NULL PRIMARY KEY,
    holder           TEXT NOT NULL DEFAULT '',
    lease_until_ms   INTEGER NOT NULL DEFAULT 0,
    paused           INTEGER NOT NULL DEFAULT 0,
    failures         INTEGER NOT NULL DEFAULT 0,
    last_error       TEXT NOT NULL DEFAULT '',
    last_error_at_ms INTEGER NOT NULL DEFAULT 0
);

CREATE TABLE event_positions (
    sink          TEXT NOT NULL,
    sku_id        INTEGER NOT NULL,
    bucket        INTEGER NOT NULL CHECK (bucket BETWEEN 0 AND 63),
    seq           INTEGER NOT NULL DEFAULT 0,
    updated_at_ms INTEGER NOT NULL DEFAULT 0,
    PRIMARY KEY (sink, sku_id, bucket)
) WITHOUT ROWID;
