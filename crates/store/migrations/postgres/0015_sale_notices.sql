-- Sale notices (an order reported lost, a sale sold out) as an ordered log per sale, its
-- head `sales.notice_seq`, and each sink's delivered position per sale. Same logical schema
-- as migrations/mysql/0015_sale_notices.sql, which says why; an expand migration
-- (schema_compat unchanged).
ALTER TABLE sales ADD COLUMN notice_seq BIGINT NOT NULL DEFAULT 0 CHECK (notice_seq >= 0);

CREATE TABLE sale_notices (
    sku_id      BIGINT NOT NULL CHECK (sku_id >= 0),
    seq         BIGINT NOT NULL CHECK (seq > 0),
    kind        VARCHAR(8) NOT NULL CHECK (kind IN ('lost', 'sold_out')),
    order_no    VARCHAR(64) NOT NULL DEFAULT '',
    total_stock BIGINT NOT NULL DEFAULT 0 CHECK (total_stock >= 0),
    run_id      BIGINT NOT NULL DEFAULT 0 CHECK (run_id >= 0),
    at_ms       BIGINT NOT NULL,
    PRIMARY KEY (sku_id, seq),
    CONSTRAINT sale_notices_once UNIQUE (sku_id, kind, order_no, total_stock)
);

CREATE TABLE notice_positions (
    sink          VARCHAR(32) NOT NULL,
    sku_id        BIGINT NOT NULL CHECK (sku_id >= 0),
    seq           BIGINT NOT NULL DEFAULT 0 CHECK (seq >= 0),
    updated_at_ms BIGINT NOT NULL DEFAULT 0,
    PRIMARY KEY (sink, sku_id)
);
