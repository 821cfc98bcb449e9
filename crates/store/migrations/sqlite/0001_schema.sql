-- flashsale system of record, SQLite (embedded). Same logical schema as
-- migrations/mysql/0001_schema.sql. Integers are 64-bit signed; ids above i64::MAX are stored
-- bit-for-bit (two's complement) by the store.

CREATE TABLE sales (
    sku_id             INTEGER NOT NULL PRIMARY KEY,
    name               TEXT NOT NULL,
    total_stock        INTEGER NOT NULL,
    available          INTEGER NOT NULL,
    reserved           INTEGER NOT NULL DEFAULT 0,
    sold               INTEGER NOT NULL DEFAULT 0,
    applied_seq        INTEGER NOT NULL DEFAULT 0,
    epoch              INTEGER NOT NULL DEFAULT 1,
    per_user_limit     INTEGER NOT NULL,
    mode               TEXT NOT NULL,
    payment_timeout_ms INTEGER NOT NULL,
    starts_at_ms       INTEGER NOT NULL,
    ends_at_ms         INTEGER NOT NULL,
    state              TEXT NOT NULL DEFAULT 'scheduled',
    stream_paused      INTEGER NOT NULL DEFAULT 0,
    created_at         TEXT NOT NULL DEFAULT (strftime('%Y-%m-%dT%H:%M:%fZ', 'now')),
    updated_at         TEXT NOT NULL DEFAULT (strftime('%Y-%m-%dT%H:%M:%fZ', 'now')),
    CONSTRAINT sales_total_positive CHECK (total_stock > 0),
    CONSTRAINT sales_available_nonneg CHECK (available >= 0),
    CONSTRAINT sales_reserved_nonneg CHECK (reserved >= 0),
    CONSTRAINT sales_sold_nonneg CHECK (sold >= 0),
    CONSTRAINT sales_conserved CHECK (available + reserved + sold = total_stock),
    CONSTRAINT sales_mode CHECK (mode IN ('direct', 'reserve')),
    CONSTRAINT sales_state CHECK (state IN ('scheduled', 'live', 'paused', 'ended')),
    CONSTRAINT sales_stream_paused CHECK (stream_paused IN (0, 1))
);

CREATE TABLE orders (
    id             INTEGER PRIMARY KEY,
    order_no       TEXT NOT NULL,
    sku_id         INTEGER NOT NULL,
    user_id        INTEGER NOT NULL,
    request_id     TEXT NOT NULL,
    quantity       INTEGER NOT NULL,
    status         TEXT NOT NULL,
    deadline_ms    INTEGER NOT NULL DEFAULT 0,
    created_at_ms  INTEGER NOT NULL,
    updated_at_ms  INTEGER NOT NULL,
    CONSTRAINT orders_quantity_positive CHECK (quantity > 0),
    CONSTRAINT orders_status CHECK (status IN
        ('PENDING', 'CREATED', 'RESERVED', 'PAID', 'CANCELLED', 'EXPIRED', 'REJECTED'))
);
CREATE UNIQUE INDEX orders_order_no ON orders (order_no);
CREATE UNIQUE INDEX orders_request ON orders (sku_id, user_id, request_id);
CREATE INDEX orders_sku_status ON orders (sku_id, status);

CREATE TABLE stock_events (
    sku_id      INTEGER NOT NULL,
    seq         INTEGER NOT NULL,
    kind        TEXT NOT NULL,
    order_no    TEXT NOT NULL,
    request_id  TEXT NOT NULL,
    user_id     INTEGER NOT NULL,
    quantity    INTEGER NOT NULL,
    at_ms       INTEGER NOT NULL,
    deadline_ms INTEGER NOT NULL DEFAULT 0,
    rejected    INTEGER NOT NULL DEFAULT 0,
    PRIMARY KEY (sku_id, seq),
    CONSTRAINT stock_events_kind CHECK (kind IN ('deducted', 'paid', 'cancelled', 'expired')),
    CONSTRAINT stock_events_quantity_positive CHECK (quantity > 0)
) WITHOUT ROWID;

CREATE TABLE dead_letters (
    id         INTEGER PRIMARY KEY,
    sku_id     INTEGER NOT NULL,
    entry_id   TEXT NOT NULL,
    seq        INTEGER NULL,
    payload    TEXT NOT NULL,
    error      TEXT NOT NULL,
    attempts   INTEGER NOT NULL,
    created_at TEXT NOT NULL DEFAULT (strftime('%Y-%m-%dT%H:%M:%fZ', 'now'))
);
CREATE UNIQUE INDEX dead_letters_entry ON dead_letters (sku_id, entry_id);
