-- Admission: who may buy a sale (open, a queue, a draw) and the admission state where it
-- lives in the database. Same logical schema as migrations/mysql/0014_admission.sql, which
-- says why; an expand migration (schema_compat unchanged).
ALTER TABLE sales ADD COLUMN admission VARCHAR(5) NOT NULL DEFAULT 'open'
        CONSTRAINT sales_admission CHECK (admission IN ('open', 'queue', 'draw')),
    ADD COLUMN admission_opens_at_ms BIGINT NOT NULL DEFAULT 0
        CHECK (admission_opens_at_ms >= 0),
    ADD COLUMN draw_at_ms BIGINT NOT NULL DEFAULT 0 CHECK (draw_at_ms >= 0);

CREATE TABLE admission_state (
    sku_id       BIGINT NOT NULL PRIMARY KEY CHECK (sku_id >= 0),
    seed         CHAR(64) NOT NULL,
    sealed       BOOLEAN NOT NULL DEFAULT FALSE,
    prequeue     BIGINT NOT NULL DEFAULT 0 CHECK (prequeue >= 0),
    joined_after BIGINT NOT NULL DEFAULT 0 CHECK (joined_after >= 0),
    admitted     BIGINT NOT NULL DEFAULT 0 CHECK (admitted >= 0),
    bought       BIGINT NOT NULL DEFAULT 0 CHECK (bought >= 0),
    entries      BIGINT NOT NULL DEFAULT 0 CHECK (entries >= 0),
    draw_pos     BIGINT NOT NULL DEFAULT 0 CHECK (draw_pos >= 0)
);

CREATE TABLE admission_joins (
    sku_id       BIGINT NOT NULL CHECK (sku_id >= 0),
    user_id      BIGINT NOT NULL CHECK (user_id >= 0),
    pre          BOOLEAN NOT NULL,
    n            BIGINT NOT NULL CHECK (n >= 1),
    bought_place BIGINT NULL,
    PRIMARY KEY (sku_id, user_id)
);
CREATE INDEX admission_joins_bought ON admission_joins (sku_id, bought_place);

CREATE TABLE admission_waves (
    sku_id   BIGINT NOT NULL CHECK (sku_id >= 0),
    to_place BIGINT NOT NULL CHECK (to_place >= 0),
    at_ms    BIGINT NOT NULL,
    PRIMARY KEY (sku_id, to_place)
);
CREATE INDEX admission_waves_at ON admission_waves (sku_id, at_ms);

CREATE TABLE admission_entries (
    sku_id   BIGINT NOT NULL CHECK (sku_id >= 0),
    user_id  BIGINT NOT NULL CHECK (user_id >= 0),
    quantity BIGINT NOT NULL CHECK (quantity >= 1),
    n        BIGINT NOT NULL CHECK (n >= 1),
    PRIMARY KEY (sku_id, user_id)
);
