-- flashsale system of record, MySQL / MariaDB 10.11+ (CHECK constraints enforced).
-- Same logical schema as migrations/sqlite/0001_schema.sql.
-- order_no and request_id are ASCII and case-sensitive (ascii_bin): "abc" and "ABC" are two ids.

CREATE TABLE sales (
    sku_id             BIGINT UNSIGNED NOT NULL PRIMARY KEY,
    name               VARCHAR(200) NOT NULL,
    total_stock        BIGINT NOT NULL,
    available          BIGINT NOT NULL,
    reserved           BIGINT NOT NULL DEFAULT 0,
    sold               BIGINT NOT NULL DEFAULT 0,
    applied_seq        BIGINT UNSIGNED NOT NULL DEFAULT 0,
    epoch              BIGINT UNSIGNED NOT NULL DEFAULT 1,
    per_user_limit     INT UNSIGNED NOT NULL,
    mode               VARCHAR(16) NOT NULL,
    payment_timeout_ms BIGINT UNSIGNED NOT NULL,
    starts_at_ms       BIGINT NOT NULL,
    ends_at_ms         BIGINT NOT NULL,
    state              VARCHAR(16) NOT NULL DEFAULT 'scheduled',
    stream_paused      BOOLEAN NOT NULL DEFAULT FALSE,
    created_at         TIMESTAMP(3) NOT NULL DEFAULT CURRENT_TIMESTAMP(3),
    updated_at         TIMESTAMP(3) NOT NULL DEFAULT CURRENT_TIMESTAMP(3) ON UPDATE CURRENT_TIMESTAMP(3),
    CONSTRAINT sales_total_positive CHECK (total_stock > 0),
    CONSTRAINT sales_available_nonneg CHECK (available >= 0),
    CONSTRAINT sales_reserved_nonneg CHECK (reserved >= 0),
    CONSTRAINT sales_sold_nonneg CHECK (sold >= 0),
    CONSTRAINT sales_conserved CHECK (available + reserved + sold = total_stock),
    CONSTRAINT sales_mode CHECK (mode IN ('direct', 'reserve')),
    CONSTRAINT sales_state CHECK (state IN ('scheduled', 'live', 'paused', 'ended'))
) ENGINE = InnoDB DEFAULT CHARSET = utf8mb4;

CREATE TABLE orders (
    id             BIGINT UNSIGNED NOT NULL AUTO_INCREMENT PRIMARY KEY,
    order_no       VARCHAR(64) CHARACTER SET ascii COLLATE ascii_bin NOT NULL,
    sku_id         BIGINT UNSIGNED NOT NULL,
    user_id        BIGINT UNSIGNED NOT NULL,
    request_id     VARCHAR(64) CHARACTER SET ascii COLLATE ascii_bin NOT NULL,
    quantity       INT UNSIGNED NOT NULL,
    status         VARCHAR(16) NOT NULL,
    deadline_ms    BIGINT NOT NULL DEFAULT 0,
    created_at_ms  BIGINT NOT NULL,
    updated_at_ms  BIGINT NOT NULL,
    CONSTRAINT orders_quantity_positive CHECK (quantity > 0),
    CONSTRAINT orders_status CHECK (status IN
        ('PENDING', 'CREATED', 'RESERVED', 'PAID', 'CANCELLED', 'EXPIRED', 'REJECTED')),
    UNIQUE KEY orders_order_no (order_no),
    UNIQUE KEY orders_request (sku_id, user_id, request_id),
    KEY orders_sku_status (sku_id, status)
) ENGINE = InnoDB DEFAULT CHARSET = utf8mb4;

-- The audit log: one row per event, gap-free seq per sale. `rejected` marks an event the
-- guard refused (stored, but it moved no counter).
CREATE TABLE stock_events (
    sku_id      BIGINT UNSIGNED NOT NULL,
    seq         BIGINT UNSIGNED NOT NULL,
    kind        VARCHAR(16) NOT NULL,
    order_no    VARCHAR(64) CHARACTER SET ascii COLLATE ascii_bin NOT NULL,
    request_id  VARCHAR(64) CHARACTER SET ascii COLLATE ascii_bin NOT NULL,
    user_id     BIGINT UNSIGNED NOT NULL,
    quantity    INT UNSIGNED NOT NULL,
    at_ms       BIGINT NOT NULL,
    deadline_ms BIGINT NOT NULL DEFAULT 0,
    rejected    BOOLEAN NOT NULL DEFAULT FALSE,
    PRIMARY KEY (sku_id, seq),
    CONSTRAINT stock_events_kind CHECK (kind IN ('deducted', 'paid', 'cancelled', 'expired')),
    CONSTRAINT stock_events_quantity_positive CHECK (quantity > 0)
) ENGINE = InnoDB DEFAULT CHARSET = utf8mb4;

CREATE TABLE dead_letters (
    id         BIGINT UNSIGNED NOT NULL AUTO_INCREMENT PRIMARY KEY,
    sku_id     BIGINT UNSIGNED NOT NULL,
    entry_id   VARCHAR(128) CHARACTER SET ascii COLLATE ascii_bin NOT NULL,
    seq        BIGINT UNSIGNED NULL,
    payload    TEXT NOT NULL,
    error      TEXT NOT NULL,
    attempts   INT UNSIGNED NOT NULL,
    created_at TIMESTAMP(3) NOT NULL DEFAULT CURRENT_TIMESTAMP(3),
    UNIQUE KEY dead_letters_entry (sku_id, entry_id)
) ENGINE = InnoDB DEFAULT CHARSET = utf8mb4;
