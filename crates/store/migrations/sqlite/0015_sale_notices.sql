-- Sale notices (an order reported lost, a sale sold out) as an ordered log per sale, its
-- head `sales.notice_seq`, and each sink's delivered position per sale. Same logical schema
-- as migrations/mysql/0015_sale_notices.sql, which says why; an expand migration
-- (schema_compat unchanged).
ALTER TABLE sales ADD COLUMN notice_seq INTEGER NOT NULL DEFAULT 0 CHECK (notice_seq >= 0);

CREATE TABLE sale_notices (
    sku_id      INTEGER NOT NULL,
    seq         INTEGER NOT NULL CHECK (seq > 0),
    kind        TEXT NOT NULL CHECK (kind IN ('lost', 'sold_out')),
    order_no    TEXT NOT NULL DEFAULT '',
    total_stock INTEGER NOT NULL DEFAULT 0,
    run_id      INTEGER NOT NULL DEFAULT 0,
    at_ms       INTEGER NOT NULL,
    PRIMARY KEY (sku_id, seq),
    UNIQUE (sku_id, kind, order_no, total_stock)
) WITHOUT ROWID;

CREATE TABLE notice_positions (
    sink          TEXT NOT NULL,
    sku_id        INTEGER NOT NULL,
    seq           INTEGER NOT NULL DEFAULT 0,
    updated_at_ms INTEGER NOT NULL DEFAULT 0,
    PRIMARY KEY (sink, sku_id)
) WITHOUT ROWID;
