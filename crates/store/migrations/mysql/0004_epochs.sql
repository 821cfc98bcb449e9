-- Fenced epochs: every event names the epoch of the hot copy that wrote it; the database
-- refuses events of an epoch older than the last one it handed out (sales.epoch) and keeps
-- them in fenced_events for the reconciler's loss report. A sale's epoch is 0 until its first
-- hot copy is loaded. Same logical schema as migrations/sqlite/0004_epochs.sql.
ALTER TABLE stock_events ADD COLUMN epoch BIGINT UNSIGNED NOT NULL DEFAULT 0 AFTER sku_id;
ALTER TABLE sales ALTER COLUMN epoch SET DEFAULT 0;
ALTER TABLE sales ADD COLUMN epoch_at_ms BIGINT NOT NULL DEFAULT 0 AFTER epoch;
ALTER TABLE reconcile_runs ADD COLUMN lost_resolutions TEXT NOT NULL DEFAULT '' AFTER lost_orders;

CREATE TABLE fenced_events (
    sku_id      BIGINT UNSIGNED NOT NULL,
    epoch       BIGINT UNSIGNED NOT NULL,
    seq         BIGINT UNSIGNED NOT NULL,
    kind        VARCHAR(16) NOT NULL,
    order_no    VARCHAR(64) CHARACTER SET ascii COLLATE ascii_bin NOT NULL,
    request_id  VARCHAR(64) CHARACTER SET ascii COLLATE ascii_bin NOT NULL,
    user_id     BIGINT UNSIGNED NOT NULL,
    quantity    INT UNSIGNED NOT NULL,
    at_ms       BIGINT NOT NULL,
    deadline_ms BIGINT NOT NULL DEFAULT 0,
    reported    BOOLEAN NOT NULL DEFAULT FALSE,
    PRIMARY KEY (sku_id, epoch, seq)
) ENGINE = InnoDB DEFAULT CHARSET = utf8mb4;
