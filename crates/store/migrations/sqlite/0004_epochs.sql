-- Fenced epochs: every event names the epoch of the hot copy that wrote it; the database
-- refuses events of an epoch older than the last one it handed out (sales.epoch) and keeps
-- them in fenced_events for the reconciler's loss report. Same logical schema as
-- migrations/mysql/0004_epochs.sql (SQLite cannot change a column default: create_sale
-- writes epoch 0 itself).
ALTER TABLE stock_events ADD COLUMN epoch INTEGER NOT NULL DEFAULT 0;
ALTER TABLE sales ADD COLUMN epoch_at_ms INTEGER NOT NULL DEFAULT 0;
ALTER TABLE reconcile_runs ADD COLUMN lost_resolutions TEXT NOT NULL DEFAULT '';

CREATE TABLE fenced_events (
    sku_id      INTEGER NOT NULL,
    epoch       INTEGER NOT NULL,
    seq         INTEGER NOT NULL,
    kind        TEXT NOT NULL,
    order_no    TEXT NOT NULL,
    request_id  TEXT NOT NULL,
    user_id     INTEGER NOT NULL,
    quantity    INTEGER NOT NULL,
    at_ms       INTEGER NOT NULL,
    deadline_ms INTEGER NOT NULL DEFAULT 0,
    reported    INTEGER NOT NULL DEFAULT 0,
    PRIMARY KEY (sku_id, epoch, seq)
) WITHOUT ROWID;
