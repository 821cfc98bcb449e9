-- Sale notices: the transitions of a sale that are not an order's own stored event, kept as
-- an ordered log the order-event relay reads like `stock_events`: an accepted order the
-- reconciler reports lost (`lost`, written in the transaction that stores the run) and a sale
-- sold out (`sold_out`, written in the transaction whose guarded update made `sold` reach
-- `total_stock`). `sales.notice_seq` is each sale's head: a writer raises it under the sale
-- row's lock and inserts the notice at the new value in the same transaction, so a sale's
-- notices commit in seq order without a gap. A notice is stored once per transition (the
-- unique key: a loss reported by two runs is one row; sold out once per total), and
-- `notice_positions` keeps each sink's delivered position per sale, as `event_positions`
-- does per stream. An expand migration (schema_compat unchanged): an older binary never
-- reads the new column or tables. Same logical schema as migrations/sqlite and postgres.
ALTER TABLE sales ADD COLUMN notice_seq BIGINT UNSIGNED NOT NULL DEFAULT 0;

CREATE TABLE sale_notices (
    sku_id      BIGINT UNSIGNED NOT NULL,
    seq         BIGINT UNSIGNED NOT NULL,
    kind        VARCHAR(8) CHARACTER SET ascii COLLATE ascii_bin NOT NULL,
    -- The lost order's number; '' for sold out.
    order_no    VARCHAR(64) CHARACTER SET ascii COLLATE ascii_bin NOT NULL DEFAULT '',
    -- The sale's total when it sold out; 0 for a loss.
    total_stock BIGINT UNSIGNED NOT NULL DEFAULT 0,
    -- The reconciler run that reported the loss; 0 for sold out.
    run_id      BIGINT UNSIGNED NOT NULL DEFAULT 0,
    at_ms       BIGINT NOT NULL,
    PRIMARY KEY (sku_id, seq),
    UNIQUE KEY sale_notices_once (sku_id, kind, order_no, total_stock),
    CONSTRAINT sale_notices_kind CHECK (kind IN ('lost', 'sold_out'))
) ENGINE = InnoDB DEFAULT CHARSET = utf8mb4;

CREATE TABLE notice_positions (
    sink          VARCHAR(32) CHARACTER SET ascii COLLATE ascii_bin NOT NULL,
    sku_id        BIGINT UNSIGNED NOT NULL,
    seq           BIGINT UNSIGNED NOT NULL DEFAULT 0,
    updated_at_ms BIGINT NOT NULL DEFAULT 0,
    PRIMARY KEY (sink, sku_id)
) ENGINE = InnoDB DEFAULT CHARSET = utf8mb4;
