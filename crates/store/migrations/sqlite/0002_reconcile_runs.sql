-- Every reconciler run and repair, per sale (issue 4). Same logical schema as
-- migrations/mysql/0002_reconcile_runs.sql.
CREATE TABLE reconcile_runs (
    id          INTEGER PRIMARY KEY AUTOINCREMENT,
    sku_id      INTEGER NOT NULL,
    at_ms       INTEGER NOT NULL,
    "trigger"   TEXT NOT NULL,
    repair      INTEGER NOT NULL DEFAULT 0,
    ok          INTEGER NOT NULL,
    violations  INTEGER NOT NULL DEFAULT 0,
    repairs     TEXT NOT NULL,
    lost_orders TEXT NOT NULL,
    report      TEXT NOT NULL
);
CREATE INDEX reconcile_runs_sku ON reconcile_runs (sku_id, id);
