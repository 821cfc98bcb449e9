-- Stock buckets in the system of record: each bucket of a sale of more than one bucket is a
-- hot copy of its own, with its own stream, epoch and gap-free seq from 1, so it gets a row of
-- its own (its fencing epoch, applied_seq and counters) whose guarded update replaces the sale
-- row's for that sale; the sale row's available, reserved and sold stay the sum over its
-- buckets, written in the same transaction. A sale of one bucket has no bucket rows and is
-- stored exactly as before. Same logical schema as migrations/sqlite/0009_sale_buckets.sql.
--
-- An expand migration (schema_compat unchanged): an older binary writes events without a
-- bucket (0, the default, which is every event of a sale of one bucket), and it never runs a
-- sale of more than one bucket on a ledger that has buckets (0008's service refuses them on
-- Redis; the embedded ledger runs such a sale as one book, on its sale row).

-- A bucket's total may reach 0: transfers move stock between buckets, so only the sale's
-- total must stay positive.
CREATE TABLE sale_buckets (
    sku_id      BIGINT UNSIGNED NOT NULL,
    bucket      INT UNSIGNED NOT NULL,
    epoch       BIGINT UNSIGNED NOT NULL DEFAULT 0,
    -- When the epoch was taken (ms, the taker's clock): what the loss report compares with.
    epoch_at_ms BIGINT NOT NULL DEFAULT 0,
    applied_seq BIGINT UNSIGNED NOT NULL DEFAULT 0,
    total_stock BIGINT NOT NULL,
    available   BIGINT NOT NULL,
    reserved    BIGINT NOT NULL DEFAULT 0,
    sold        BIGINT NOT NULL DEFAULT 0,
    -- The hash tag's salt of the bucket's hot copy, written once when the sale is first
    -- loaded (NULL until then): a bucket lost with its Redis is rebuilt under the same tag.
    salt        INT UNSIGNED NULL,
    PRIMARY KEY (sku_id, bucket),
    CONSTRAINT sale_buckets_bucket CHECK (bucket < 64),
    CONSTRAINT sale_buckets_total_nonneg CHECK (total_stock >= 0),
    CONSTRAINT sale_buckets_available_nonneg CHECK (available >= 0),
    CONSTRAINT sale_buckets_reserved_nonneg CHECK (reserved >= 0),
    CONSTRAINT sale_buckets_sold_nonneg CHECK (sold >= 0),
    CONSTRAINT sale_buckets_conserved CHECK (available + reserved + sold = total_stock)
) ENGINE = InnoDB DEFAULT CHARSET = utf8mb4;

-- One row per transfer side as its bucket's stream records it, applied exactly once by the
-- key (sku_id, transfer_id, side). `fenced`: written by a copy of another epoch than its
-- bucket's, kept for the loss report, never applied. transfer_id is `<source epoch>.<n>`.
CREATE TABLE stock_transfers (
    sku_id      BIGINT UNSIGNED NOT NULL,
    transfer_id VARCHAR(40) CHARACTER SET ascii COLLATE ascii_bin NOT NULL,
    side        VARCHAR(3) NOT NULL,
    epoch       BIGINT UNSIGNED NOT NULL,
    from_bucket INT UNSIGNED NOT NULL,
    to_bucket   INT UNSIGNED NOT NULL,
    units       BIGINT UNSIGNED NOT NULL,
    at_ms       BIGINT NOT NULL,
    fenced      BOOLEAN NOT NULL DEFAULT FALSE,
    PRIMARY KEY (sku_id, transfer_id, side),
    CONSTRAINT stock_transfers_side CHECK (side IN ('out', 'in')),
    CONSTRAINT stock_transfers_buckets CHECK (from_bucket < 64 AND to_bucket < 64 AND from_bucket <> to_bucket)
) ENGINE = InnoDB DEFAULT CHARSET = utf8mb4;

-- Each bucket numbers its events from 1: the key becomes (sku_id, bucket, seq).
ALTER TABLE stock_events ADD COLUMN bucket INT UNSIGNED NOT NULL DEFAULT 0 AFTER sku_id,
    DROP PRIMARY KEY,
    ADD PRIMARY KEY (sku_id, bucket, seq),
    ADD CONSTRAINT stock_events_bucket CHECK (bucket < 64);
