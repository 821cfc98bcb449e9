-- Fenced epochs: every event names the epoch of the hot copy that wrote it; the database
-- refuses events of an epoch older than the last one it handed out (sales.epoch) and keeps
-- them in fenced_events for the reconciler's loss report. A sale's epoch is 0 until its first
-- hot copy is loaded. Same logical schema as migrations/mysql/0004_epochs.sql.
ALTER TABLE stock_events ADD COLUMN epoch BIGINT NOT NULL DEFAULT 0 CHECK (epoch >= 0);
ALTER TABLE sales ALTER COLUMN epoch SET DEFAULT 0;
ALTER TABLE sales ADD COLUMN epoch_at_ms BIGINT NOT NULL DEFAULT 0;
ALTER TABLE reconcile_runs ADD COLUMN lost_resolutions TEXT NOT NULL DEFAULT '';

CREATE TABLE fenced_events (
    sku_id      BIGINT NOT NULL CHECK (sku_id >= 0),
    epoch       BIGINT NOT NULL CHECK (epoch >= 0),
    seq         BIGINT NOT NULL CHECK (seq >= 0),
    kind        VARCHAR(16) NOT NULL,
    order_no    VARCHAR(64) NOT NULL,
    request_id  VARCHAR(64) NOT NULL,
    user_id     BIGINT NOT NULL CHECK (user_id >= 0),
    quantity    BIGINT NOT NULL CHECK (quantity >= 0),
    at_ms       BIGINT NOT NULL,
    deadline_ms BIGINT NOT NULL DEFAULT 0,
    reported    BOOLEAN NOT NULL DEFAULT FALSE,
    PRIMARY KEY (sku_id, epoch, seq)
);
