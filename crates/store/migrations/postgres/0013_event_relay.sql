-- Order events: each sink's lease, pause and last error, and its delivered position per
-- stream of the event log. Same logical schema as migrations/mysql/0013_event_relay.sql,
-- which says why; an expand migration (schema_compat unchanged).
CREATE TABLE event_sinks (
    sink             VARCHAR(32) NOT NULL PRIMARY KEY,
    holder           VARCHAR(128) NOT NULL DEFAULT '',
    lease_until_ms   BIGINT NOT NULL DEFAULT 0,
    paused           BOOLEAN NOT NULL DEFAULT FALSE,
    failures         BIGINT NOT NULL DEFAULT 0 CHECK (failures >= 0),
    last_error       TEXT NOT NULL DEFAULT '',
    last_error_at_ms BIGINT NOT NULL DEFAULT 0
);

CREATE TABLE event_positions (
    sink          VARCHAR(32) NOT NULL,
    sku_id        BIGINT NOT NULL CHECK (sku_id >= 0),
    bucket        BIGINT NOT NULL CHECK (bucket BETWEEN 0 AND 63),
    seq           BIGINT NOT NULL DEFAULT 0 CHECK (seq >= 0),
    updated_at_ms BIGINT NOT NULL DEFAULT 0,
    PRIMARY KEY (sink, sku_id, bucket)
);
