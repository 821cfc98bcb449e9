-- Rolling upgrades (docs/DEPLOY.md): the lowest binary schema version (the highest migration
-- a binary embeds) that can still run against this database. A binary older than the
-- database's schema starts only when its version is at least this one, and then runs with
-- the newer migrations it does not know ignored. An expand migration (a table, a nullable or
-- defaulted column, an index) leaves the row alone; a contract migration (dropping or
-- changing what an older binary reads or writes) raises it to the first schema version that
-- no longer needs what it removes. 6: binaries before this table refuse any newer schema.
-- Same change as migrations/sqlite/0006_schema_compat.sql.
CREATE TABLE schema_compat (
    id                 TINYINT UNSIGNED NOT NULL PRIMARY KEY,
    min_binary_version BIGINT NOT NULL,
    CONSTRAINT schema_compat_one_row CHECK (id = 1)
) ENGINE=InnoDB;

INSERT INTO schema_compat (id, min_binary_version) VALUES (1, 6);
