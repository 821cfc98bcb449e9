-- Gateway state kept by the embedded deployment (the Redis deployment keeps it in Redis):
-- blocked users and client addresses, and sales that require a purchase token.

CREATE TABLE blacklist (
    kind          TEXT NOT NULL,
    value         TEXT NOT NULL,
    created_at_ms INTEGER NOT NULL,
    PRIMARY KEY (kind, value),
    CONSTRAINT blacklist_kind CHECK (kind IN ('user', 'ip'))
);

CREATE TABLE sale_guards (
    sku_id         INTEGER NOT NULL PRIMARY KEY,
    purchase_token INTEGER NOT NULL DEFAULT 0,
    CONSTRAINT sale_guards_token CHECK (purchase_token IN (0, 1))
);
