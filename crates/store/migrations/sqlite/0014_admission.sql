-- Admission: who may buy a sale (open, a queue, a draw) and, for a sale whose admission state
-- lives in this database (the embedded ledger), that state. Same logical schema as
-- migrations/mysql/0014_admission.sql, which says why; an expand migration (schema_compat
-- unchanged): an older binary writes open sales, the default.
ALTER TABLE sales ADD COLUMN admission TEXT NOT NULL DEFAULT 'open'
    CHECK (admission IN ('open', 'queue', 'draw'));
ALTER TABLE sales ADD COLUMN admission_opens_at_ms INTEGER NOT NULL DEFAULT 0
    CHECK (admission_opens_at_ms >= 0);
ALTER TABLE sales ADD COLUMN draw_at_ms INTEGER NOT NULL DEFAULT 0 CHECK (draw_at_ms >= 0);

CREATE TABLE admission_state (
    sku_id       INTEGER NOT NULL PRIMARY KEY,
    seed         TEXT NOT NULL CHECK (length(seed) = 64),
    sealed       INTEGER NOT NULL DEFAULT 0 CHECK (sealed IN (0, 1)),
    prequeue     INTEGER NOT NULL DEFAULT 0 CHECK (prequeue >= 0),
    joined_after INTEGER NOT NULL DEFAULT 0 CHECK (joined_after >= 0),
    admitted     INTEGER NOT NULL DEFAULT 0 CHECK (admitted >= 0),
    bought       INTEGER NOT NULL DEFAULT 0 CHECK (bought >= 0),
    entries      INTEGER NOT NULL DEFAULT 0 CHECK (entries >= 0),
    draw_pos     INTEGER NOT NULL DEFAULT 0 CHECK (draw_pos >= 0)
) WITHOUT ROWID;

CREATE TABLE admission_joins (
    sku_id       INTEGER NOT NULL,
    user_id      INTEGER NOT NULL,
    pre          INTEGER NOT NULL CHECK (pre IN (0, 1)),
    n            INTEGER NOT NULL CHECK (n >= 1),
    bought_place INTEGER NULL,
    PRIMARY KEY (sku_id, user_id)
) WITHOUT ROWID;
CREATE INDEX admission_joins_bought ON admission_joins (sku_id, bought_place);

CREATE TABLE admission_waves (
    sku_id   INTEGER NOT NULL,
    to_place INTEGER NOT NULL,
    at_ms    INTEGER NOT NULL,
    PRIMARY KEY (sku_id, to_place)
) WITHOUT ROWID;
CREATE INDEX admission_waves_at ON admission_waves (sku_id, at_ms);

CREATE TABLE admission_entries (
    sku_id   INTEGER NOT NULL,
    user_id  INTEGER NOT NULL,
    quantity INTEGER NOT NULL CHECK (quantity >= 1),
    n        INTEGER NOT NULL CHECK (n >= 1),
    PRIMARY KEY (sku_id, user_id)
) WITHOUT ROWID;
