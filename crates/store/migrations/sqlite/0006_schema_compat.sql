-- Rolling upgrades: the lowest binary schema version that can still run against this
-- database (see migrations/mysql/0006_schema_compat.sql, the same logical schema, for the
-- rules an expand and a contract migration follow).
CREATE TABLE schema_compat (
    id                 INTEGER NOT NULL PRIMARY KEY CHECK (id = 1),
    min_binary_version INTEGER NOT NULL
);

INSERT INTO schema_compat (id, min_binary_version) VALUES (1, 6);
