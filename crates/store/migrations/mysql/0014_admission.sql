-- Admission: who may buy a sale. `admission` is `open` (anyone; the default, every sale
-- before this column), `queue` (a waiting room that admits in waves) or `draw` (entries in a
-- window, winners drawn at `draw_at_ms`); `admission_opens_at_ms` is when the queue or the
-- entry window opens. The admission_* tables hold that state where it lives in the database
-- (the embedded ledger; a Redis ledger keeps it in the sale's Redis slot instead). Same
-- logical schema as migrations/sqlite/0014_admission.sql and migrations/postgres.
--
-- An expand migration (schema_compat unchanged): an older binary writes open sales (the
-- defaults) and never reads the new tables.
ALTER TABLE sales ADD COLUMN admission VARCHAR(5) NOT NULL DEFAULT 'open',
    ADD COLUMN admission_opens_at_ms BIGINT NOT NULL DEFAULT 0,
    ADD COLUMN draw_at_ms BIGINT NOT NULL DEFAULT 0,
    ADD CONSTRAINT sales_admission CHECK (admission IN ('open', 'queue', 'draw')),
    ADD CONSTRAINT sales_admission_times CHECK (admission_opens_at_ms >= 0 AND draw_at_ms >= 0);

-- The seed (hex) is committed once, when the queue or the window opens; its SHA-256 is
-- published then and the seed itself once the order is fixed.
CREATE TABLE admission_state (
    sku_id       BIGINT UNSIGNED NOT NULL PRIMARY KEY,
    seed         CHAR(64) CHARACTER SET ascii NOT NULL,
    sealed       BOOLEAN NOT NULL DEFAULT FALSE,
    prequeue     BIGINT UNSIGNED NOT NULL DEFAULT 0,
    joined_after BIGINT UNSIGNED NOT NULL DEFAULT 0,
    admitted     BIGINT UNSIGNED NOT NULL DEFAULT 0,
    bought       BIGINT UNSIGNED NOT NULL DEFAULT 0,
    entries      BIGINT UNSIGNED NOT NULL DEFAULT 0,
    draw_pos     BIGINT UNSIGNED NOT NULL DEFAULT 0
) ENGINE = InnoDB DEFAULT CHARSET = utf8mb4;

-- One row per buyer of a queue: joined before the start (`pre`, placed by the shuffle) or
-- the n-th after it; `bought_place`: the place of an admitted buyer who bought.
CREATE TABLE admission_joins (
    sku_id       BIGINT UNSIGNED NOT NULL,
    user_id      BIGINT UNSIGNED NOT NULL,
    pre          BOOLEAN NOT NULL,
    n            BIGINT UNSIGNED NOT NULL,
    bought_place BIGINT UNSIGNED NULL,
    PRIMARY KEY (sku_id, user_id),
    KEY admission_joins_bought (sku_id, bought_place)
) ENGINE = InnoDB DEFAULT CHARSET = utf8mb4;

-- Each wave: places up to `to_place` admitted at `at_ms` (the pass expires a fixed time later).
CREATE TABLE admission_waves (
    sku_id   BIGINT UNSIGNED NOT NULL,
    to_place BIGINT UNSIGNED NOT NULL,
    at_ms    BIGINT NOT NULL,
    PRIMARY KEY (sku_id, to_place),
    KEY admission_waves_at (sku_id, at_ms)
) ENGINE = InnoDB DEFAULT CHARSET = utf8mb4;

-- One draw entry per user.
CREATE TABLE admission_entries (
    sku_id   BIGINT UNSIGNED NOT NULL,
    user_id  BIGINT UNSIGNED NOT NULL,
    quantity INT UNSIGNED NOT NULL,
    n        BIGINT UNSIGNED NOT NULL,
    PRIMARY KEY (sku_id, user_id),
    CONSTRAINT admission_entries_quantity CHECK (quantity >= 1)
) ENGINE = InnoDB DEFAULT CHARSET = utf8mb4;
