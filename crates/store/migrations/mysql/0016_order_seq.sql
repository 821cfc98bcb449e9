-- One row per purchase, expand step: an order row carries the seq, bucket and epoch of the
-- `deducted` event that created it, so that after the contract step (`flashsale migrate
-- --contract`, docs/DEPLOY.md "Rolling upgrades") the order row is that event and
-- `stock_events` keeps only the other transitions. Until then every binary keeps writing the
-- event row too (binaries of schema 15 and older read only `stock_events`), and readers of
-- this schema read a deduction from its order row only when no event row holds its seq.
-- An expand migration: nullable and defaulted columns and an index; an older binary never
-- writes them (its orders have a NULL seq, and their events are rows of `stock_events`).
-- Same logical schema as migrations/sqlite and postgres.
ALTER TABLE orders
    ADD COLUMN bucket INT UNSIGNED NOT NULL DEFAULT 0,
    ADD COLUMN seq    BIGINT UNSIGNED NULL,
    ADD COLUMN epoch  BIGINT UNSIGNED NULL,
    ADD UNIQUE KEY orders_seq (sku_id, bucket, seq);
