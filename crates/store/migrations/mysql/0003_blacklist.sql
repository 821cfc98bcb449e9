-- Gateway state (same logical schema as migrations/sqlite/0003_blacklist.sql): blocked users and
-- client addresses, and sales that require a purchase token. The Redis deployment keeps these
-- in Redis (`<prefix>:blacklist`, `<prefix>:blacklist:ip`, `<prefix>:token_sales`); the tables
-- exist so that a deployment may keep them in the database instead.

CREATE TABLE blacklist (
    kind          VARCHAR(8) NOT NULL,
    value         VARCHAR(64) CHARACTER SET ascii COLLATE ascii_bin NOT NULL,
    created_at_ms BIGINT NOT NULL,
    PRIMARY KEY (kind, value),
    CONSTRAINT blacklist_kind CHECK (kind IN ('user', 'ip'))
) ENGINE=InnoDB;

CREATE TABLE sale_guards (
    sku_id         BIGINT UNSIGNED NOT NULL PRIMARY KEY,
    purchase_token TINYINT NOT NULL DEFAULT 0,
    CONSTRAINT sale_guards_token CHECK (purchase_token IN (0, 1))
) ENGINE=InnoDB;
