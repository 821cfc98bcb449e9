-- Every reconciler run and repair, per sale (issue 4). `report` is the whole JSON report;
-- `repairs` and `lost_orders` are newline-separated lines, for an operator's SELECT.
CREATE TABLE reconcile_runs (
    id          BIGINT UNSIGNED NOT NULL AUTO_INCREMENT PRIMARY KEY,
    sku_id      BIGINT UNSIGNED NOT NULL,
    at_ms       BIGINT NOT NULL,
    `trigger`   VARCHAR(32) NOT NULL,
    repair      BOOLEAN NOT NULL DEFAULT FALSE,
    ok          BOOLEAN NOT NULL,
    violations  INT UNSIGNED NOT NULL DEFAULT 0,
    repairs     MEDIUMTEXT NOT NULL,
    lost_orders MEDIUMTEXT NOT NULL,
    report      MEDIUMTEXT NOT NULL,
    KEY reconcile_runs_sku (sku_id, id)
) ENGINE = InnoDB DEFAULT CHARSET = utf8mb4;
