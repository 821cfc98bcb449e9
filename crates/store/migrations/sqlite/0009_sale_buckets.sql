-- Stock buckets in the system of record: a row per bucket of a sale of more than one bucket
-- (its fencing epoch, applied_seq and counters), the transfer sides, and events keyed by
-- bucket. Same logical schema as migrations/mysql/0009_sale_buckets.sql, which says why; an
-- expand migration (schema_compat unchanged).

-- A bucket's total may reach 0: transfers move stock between buckets.
CREATE TABLE sale_buckets (
    sku_id      INTEGER NOT NULL,
    bucket      INTEGER NOT NULL,
    epoch       INTEGER NOT NULL DEFAULT 0,
    -- When the epoch was taken (ms, the taker's clock): what the loss report compares with.
    epoch_at_ms INTEGER NOT NULL DEFAULT 0,
    applied_seq INTEGER NOT NULL DEFAULT 0,
    total_stock INTEGER NOT NULL,
    available   INTEGER NOT NULL,
    reserved    INTEGER NOT NULL DEFAULT 0,
    sold        INTEGER NOT NULL DEFAULT 0,
    -- The hash tag's salt of the bucket's hot copy, written once when the sale is first
    -- loaded (NULL until then): a bucket lost with its Redis is rebuilt under the same tag.
    salt        INTEGER NULL,
    PRIMARY KEY (sku_id, bucket),
    CONSTRAINT sale_buckets_bucket CHECK (bucket BETWEEN 0 AND 63),
    CONSTRAINT sale_buckets_total_nonneg CHECK (total_stock >= 0),
    CONSTRAINT sale_buckets_available_nonneg CHECK (available >= 0),
    CONSTRAINT sale_buckets_reserved_nonneg CHECK (reserved >= 0),
    CONSTRAINT sale_buckets_sold_nonneg CHECK (sold >= 0),
    CONSTRAINT sale_buckets_conserved CHECK (available + reserved + sold = total_stock)
) WITHOUT ROWID;

-- One row per transfer side, applied exactly once by (sku_id, transfer_id, side); `fenced`:
-- of another epoch than its bucket's, kept, never applied.
CREATE TABLE stock_transfers (
    sku_id      INTEGER NOT NULL,
    transfer_id TEXT NOT NULL CHECK (length(transfer_id) BETWEEN 1 AND 40),
    side        TEXT NOT NULL,
    epoch       INTEGER NOT NULL,
    from_bucket INTEGER NOT NULL,
    to_bucket   INTEGER NOT NULL,
    units       INTEGER NOT NULL CHECK (units >= 0),
    at_ms       INTEGER NOT NULL,
    fenced      INTEGER NOT NULL DEFAULT 0 CHECK (fenced IN (0, 1)),
    PRIMARY KEY (sku_id, transfer_id, side),
    CONSTRAINT stock_transfers_side CHECK (side IN ('out', 'in')),
    CONSTRAINT stock_transfers_buckets CHECK (from_bucket BETWEEN 0 AND 63
        AND to_bucket BETWEEN 0 AND 63 AND from_bucket <> to_bucket)
) WITHOUT ROWID;

-- Each bucket numbers its events from 1: the key becomes (sku_id, bucket, seq). SQLite cannot
-- change a primary key, so the table is rebuilt with every column (0001's and 0004's epoch)
-- and constraint; stock_events has no other index. Rows keep bucket 0.
CREATE TABLE stock_events_0009 (
    sku_id      INTEGER NOT NULL,
    bucket      INTEGER NOT NULL DEFAULT 0 CHECK (bucket BETWEEN 0 AND 63),
    seq         INTEGER NOT NULL,
    kind        TEXT NOT NULL,
    order_no    TEXT NOT NULL,
    request_id  TEXT NOT NULL,
    user_id     INTEGER NOT NULL,
    quantity    INTEGER NOT NULL,
    at_ms       INTEGER NOT NULL,
    deadline_ms INTEGER NOT NULL DEFAULT 0,
    rejected    INTEGER NOT NULL DEFAULT 0,
    epoch       INTEGER NOT NULL DEFAULT 0,
    PRIMARY KEY (sku_id, bucket, seq),
    CONSTRAINT stock_events_kind CHECK (kind IN ('deducted', 'paid', 'cancelled', 'expired')),
    CONSTRAINT stock_events_quantity_positive CHECK (quantity > 0)
) WITHOUT ROWID;

INSERT INTO stock_events_0009 (sku_id, bucket, seq, kind, order_no, request_id, user_id,
    quantity, at_ms, deadline_ms, rejected, epoch)
SELECT sku_id, 0, seq, kind, order_no, request_id, user_id, quantity, at_ms, deadline_ms,
    rejected, epoch
FROM stock_events;

DROP TABLE stock_events;
ALTER TABLE stock_events_0009 RENAME TO stock_events;
