-- One row per purchase, expand step: an order row carries the seq, bucket and epoch of the
-- `deducted` event that created it. Same logical schema as migrations/mysql/0016_order_seq.sql,
-- which says why; an expand migration (schema_compat unchanged).
ALTER TABLE orders
    ADD COLUMN bucket BIGINT NOT NULL DEFAULT 0,
    ADD COLUMN seq    BIGINT NULL,
    ADD COLUMN epoch  BIGINT NULL;
CREATE UNIQUE INDEX orders_seq ON orders (sku_id, bucket, seq);
