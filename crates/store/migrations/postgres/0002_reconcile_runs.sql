-- Every reconciler run and repair, per sale. Same logical schema as
-- migrations/mysql/0002_reconcile_runs.sql.
CREATE TABLE reconcile_runs (
    id          BIGINT GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    sku_id      BIGINT NOT NULL CHECK (sku_id >= 0),
    at_ms       BIGINT NOT NULL,
    "trigger"   VARCHAR(32) NOT NULL,
    repair      BOOLEAN NOT NULL DEFAULT FALSE,
    ok          BOOLEAN NOT NULL,
    violations  BIGINT NOT NULL DEFAULT 0 CHECK (violations >= 0),
    repairs     TEXT NOT NULL,
    lost_orders TEXT NOT NULL,
    report      TEXT NOT NULL
);
CREATE INDEX reconcile_runs_sku ON reconcile_runs (sku_id, id);
