-- Gateway state (same logical schema as migrations/mysql/0003_blacklist.sql): blocked users and
-- client addresses, and sales that require a purchase token. The Redis deployment keeps these
-- in Redis; the tables exist so that a deployment may keep them in the database instead.

CREATE TABLE blacklist (
    kind          VARCHAR(8) NOT NULL,
    value         VARCHAR(64) NOT NULL,
    created_at_ms BIGINT NOT NULL,
    PRIMARY KEY (kind, value),
    CONSTRAINT blacklist_kind CHECK (kind IN ('user', 'ip'))
);

CREATE TABLE sale_guards (
    sku_id         BIGINT NOT NULL PRIMARY KEY CHECK (sku_id >= 0),
    purchase_token SMALLINT NOT NULL DEFAULT 0,
    CONSTRAINT sale_guards_token CHECK (purchase_token IN (0, 1))
);
