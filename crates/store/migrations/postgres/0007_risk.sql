-- The shop's risk check (same logical schema as migrations/mysql/0007_risk.sql): users the
-- fallback rule `allowlist` admits while the risk service gives no answer, and a sale's own
-- fallback rule. The Redis deployment keeps these in Redis; the tables exist so that a
-- deployment may keep them here instead.

CREATE TABLE risk_allowlist (
    user_id       BIGINT NOT NULL PRIMARY KEY CHECK (user_id >= 0),
    created_at_ms BIGINT NOT NULL
);

ALTER TABLE sale_guards ADD COLUMN risk_fallback VARCHAR(9) NULL,
    ADD CONSTRAINT sale_guards_risk_fallback CHECK (risk_fallback IN ('allow', 'deny', 'allowlist'));
