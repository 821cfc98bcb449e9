-- flashsale system of record, PostgreSQL 13+. Same logical schema as
-- migrations/mysql/0001_schema.sql. PostgreSQL has no unsigned integers: every integer is a
-- BIGINT (the store refuses an id or count above i64::MAX when it binds it) and the ones
-- that are unsigned elsewhere are checked non-negative here. order_no and request_id are
-- case-sensitive (the default collation compares them deterministically).

CREATE TABLE sales (
    sku_id             BIGINT NOT NULL PRIMARY KEY CHECK (sku_id >= 0),
    name               VARCHAR(200) NOT NULL,
    total_stock        BIGINT NOT NULL,
    available          BIGINT NOT NULL,
    reserved           BIGINT NOT NULL DEFAULT 0,
    sold               BIGINT NOT NULL DEFAULT 0,
    applied_seq        BIGINT NOT NULL DEFAULT 0 CHECK (applied_seq >= 0),
    epoch              BIGINT NOT NULL DEFAULT 1 CHECK (epoch >= 0),
    per_user_limit     BIGINT NOT NULL CHECK (per_user_limit >= 0),
    mode               VARCHAR(16) NOT NULL,
    payment_timeout_ms BIGINT NOT NULL CHECK (payment_timeout_ms >= 0),
    starts_at_ms       BIGINT NOT NULL,
    ends_at_ms         BIGINT NOT NULL,
    state              VARCHAR(16) NOT NULL DEFAULT 'scheduled',
    stream_paused      BOOLEAN NOT NULL DEFAULT FALSE,
    created_at         TIMESTAMPTZ(3) NOT NULL DEFAULT CURRENT_TIMESTAMP,
    updated_at         TIMESTAMPTZ(3) NOT NULL DEFAULT CURRENT_TIMESTAMP,
    CONSTRAINT sales_total_positive CHECK (total_stock > 0),
    CONSTRAINT sales_available_nonneg CHECK (available >= 0),
    CONSTRAINT sales_reserved_nonneg CHECK (reserved >= 0),
    CONSTRAINT sales_sold_nonneg CHECK (sold >= 0),
    CONSTRAINT sales_conserved CHECK (available + reserved + sold = total_stock),
    CONSTRAINT sales_mode CHECK (mode IN ('direct', 'reserve')),
    CONSTRAINT sales_state CHECK (state IN ('scheduled', 'live', 'paused', 'ended'))
);

CREATE TABLE orders (
    id             BIGINT GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    order_no       VARCHAR(64) NOT NULL,
    sku_id         BIGINT NOT NULL CHECK (sku_id >= 0),
    user_id        BIGINT NOT NULL CHECK (user_id >= 0),
    request_id     VARCHAR(64) NOT NULL,
    quantity       BIGINT NOT NULL,
    status         VARCHAR(16) NOT NULL,
    deadline_ms    BIGINT NOT NULL DEFAULT 0,
    created_at_ms  BIGINT NOT NULL,
    updated_at_ms  BIGINT NOT NULL,
    CONSTRAINT orders_quantity_positive CHECK (quantity > 0),
    CONSTRAINT orders_status CHECK (status IN
        ('PENDING', 'CREATED', 'RESERVED', 'PAID', 'CANCELLED', 'EXPIRED', 'REJECTED')),
    CONSTRAINT orders_order_no UNIQUE (order_no),
    CONSTRAINT orders_request UNIQUE (sku_id, user_id, request_id)
);
CREATE INDEX orders_sku_status ON orders (sku_id, status);

-- The audit log: one row per event, gap-free seq per sale. `rejected` marks an event the
-- guard refused (stored, but it moved no counter).
CREATE TABLE stock_events (
    sku_id      BIGINT NOT NULL CHECK (sku_id >= 0),
    seq         BIGINT NOT NULL CHECK (seq >= 0),
    kind        VARCHAR(16) NOT NULL,
    order_no    VARCHAR(64) NOT NULL,
    request_id  VARCHAR(64) NOT NULL,
    user_id     BIGINT NOT NULL CHECK (user_id >= 0),
    quantity    BIGINT NOT NULL,
    at_ms       BIGINT NOT NULL,
    deadline_ms BIGINT NOT NULL DEFAULT 0,
    rejected    BOOLEAN NOT NULL DEFAULT FALSE,
    PRIMARY KEY (sku_id, seq),
    CONSTRAINT stock_events_kind CHECK (kind IN ('deducted', 'paid', 'cancelled', 'expired')),
    CONSTRAINT stock_events_quantity_positive CHECK (quantity > 0)
);

CREATE TABLE dead_letters (
    id         BIGINT GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    sku_id     BIGINT NOT NULL CHECK (sku_id >= 0),
    entry_id   VARCHAR(128) NOT NULL,
    seq        BIGINT NULL CHECK (seq >= 0),
    payload    TEXT NOT NULL,
    error      TEXT NOT NULL,
    attempts   BIGINT NOT NULL CHECK (attempts >= 0),
    created_at TIMESTAMPTZ(3) NOT NULL DEFAULT CURRENT_TIMESTAMP,
    CONSTRAINT dead_letters_entry UNIQUE (sku_id, entry_id)
);
