-- Stock buckets in the system of record: a row per bucket of a sale of more than one bucket
-- (its fencing epoch, applied_seq and counters), the transfer sides, and events keyed by
-- bucket. Same logical schema as migrations/mysql/0009_sale_buckets.sql, which says why; an
-- expand migration (schema_compat unchanged).

-- A bucket's total may reach 0: transfers move stock between buckets.
CREATE TABLE sale_buckets (
    sku_id      BIGINT NOT NULL CHECK (sku_id >= 0),
    bucket      BIGINT NOT NULL,
    epoch       BIGINT NOT NULL DEFAULT 0 CHECK (epoch >= 0),
    -- When the epoch was taken (ms, the taker's clock): what the loss report compares with.
    epoch_at_ms BIGINT NOT NULL DEFAULT 0,
    applied_seq BIGINT NOT NULL DEFAULT 0 CHECK (applied_seq >= 0),
    total_stock BIGINT NOT NULL,
    available   BIGINT NOT NULL,
    reserved    BIGINT NOT NULL DEFAULT 0,
    sold        BIGINT NOT NULL DEFAULT 0,
    -- The hash tag's salt of the bucket's hot copy, written once when the sale is first
    -- loaded (NULL until then): a bucket lost with its Redis is rebuilt under the same tag.
    salt        BIGINT NULL CHECK (salt >= 0),
    PRIMARY KEY (sku_id, bucket),
    CONSTRAINT sale_buckets_bucket CHECK (bucket BETWEEN 0 AND 63),
    CONSTRAINT sale_buckets_total_nonneg CHECK (total_stock >= 0),
    CONSTRAINT sale_buckets_available_nonneg CHECK (available >= 0),
    CONSTRAINT sale_buckets_reserved_nonneg CHECK (reserved >= 0),
    CONSTRAINT sale_buckets_sold_nonneg CHECK (sold >= 0),
    CONSTRAINT sale_buckets_conserved CHECK (available + reserved + sold = total_stock)
);

-- One row per transfer side, applied exactly once by (sku_id, transfer_id, side); `fenced`:
-- of another epoch than its bucket's, kept, never applied.
CREATE TABLE stock_transfers (
    sku_id      BIGINT NOT NULL CHECK (sku_id >= 0),
    transfer_id VARCHAR(40) NOT NULL,
    side        VARCHAR(3) NOT NULL,
    epoch       BIGINT NOT NULL CHECK (epoch >= 0),
    from_bucket BIGINT NOT NULL,
    to_bucket   BIGINT NOT NULL,
    units       BIGINT NOT NULL CHECK (units >= 0),
    at_ms       BIGINT NOT NULL,
    fenced      BOOLEAN NOT NULL DEFAULT FALSE,
    PRIMARY KEY (sku_id, transfer_id, side),
    CONSTRAINT stock_transfers_side CHECK (side IN ('out', 'in')),
    CONSTRAINT stock_transfers_buckets CHECK (from_bucket BETWEEN 0 AND 63
        AND to_bucket BETWEEN 0 AND 63 AND from_bucket <> to_bucket)
);

-- Each bucket numbers its events from 1: the key becomes (sku_id, bucket, seq).
ALTER TABLE stock_events ADD COLUMN bucket BIGINT NOT NULL DEFAULT 0
    CONSTRAINT stock_events_bucket CHECK (bucket BETWEEN 0 AND 63);
ALTER TABLE stock_events DROP CONSTRAINT stock_events_pkey,
    ADD PRIMARY KEY (sku_id, bucket, seq);
