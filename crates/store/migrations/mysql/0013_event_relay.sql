-- Order events: the relay reads the ordered event log (stock_events, by sku_id, bucket, seq)
-- and keeps here, per sink, its lease (one relay per sink at a time), whether it is paused
-- (an endpoint that kept failing waits for an operator) and its last error; and per sink and
-- stream the last seq the sink acknowledged. No row per purchase: one row per sink and one
-- per sink and stream. An expand migration (schema_compat unchanged).
-- Same logical schema as migrations/sqlite/0013_event_relay.sql.
CREATE TABLE event_sinks (
    sink             VARCHAR(32) CHARACTER SET ascii COLLATE ascii_bin NOT NULL PRIMARY KEY,
    holder           VARCHAR(128) NOT NULL DEFAULT '',
    lease_until_ms   BIGINT NOT NULL DEFAULT 0,
    paused           BOOLEAN NOT NULL DEFAULT FALSE,
    failures         INT UNSIGNED NOT NULL DEFAULT 0,
    last_error       TEXT NOT NULL DEFAULT '',
    last_error_at_ms BIGINT NOT NULL DEFAULT 0
) ENGINE = InnoDB DEFAULT CHARSET = utf8mb4;

CREATE TABLE event_positions (
    sink          VARCHAR(32) CHARACTER SET ascii COLLATE ascii_bin NOT NULL,
    sku_id        BIGINT UNSIGNED NOT NULL,
    bucket        INT UNSIGNED NOT NULL,
    seq           BIGINT UNSIGNED NOT NULL DEFAULT 0,
    updated_at_ms BIGINT NOT NULL DEFAULT 0,
    PRIMARY KEY (sink, sku_id, bucket),
    CONSTRAINT event_positions_bucket CHECK (bucket < 64)
) ENGINE = InnoDB DEFAULT CHARSET = utf8mb4;
