-- Rolling upgrades: the lowest binary schema version that can still run against this
-- database (see migrations/mysql/0006_schema_compat.sql, the same logical schema, for the
-- rules an expand and a contract migration follow). 6: binaries before this table refuse
-- any newer schema.
CREATE TABLE schema_compat (
    id                 SMALLINT NOT NULL PRIMARY KEY,
    min_binary_version BIGINT NOT NULL,
    CONSTRAINT schema_compat_one_row CHECK (id = 1)
);

INSERT INTO schema_compat (id, min_binary_version) VALUES (1, 6);
