-- The shop's risk check (embedded deployment; the Redis deployment keeps these in Redis):
-- users the fallback rule `allowlist` admits while the risk service gives no answer, and a
-- sale's own fallback rule, overriding the instance's (NULL: the instance's).

CREATE TABLE risk_allowlist (
    user_id       INTEGER NOT NULL PRIMARY KEY,
    created_at_ms INTEGER NOT NULL
);

ALTER TABLE sale_guards ADD COLUMN risk_fallback TEXT NULL
    CONSTRAINT sale_guards_risk_fallback CHECK (risk_fallback IN ('allow', 'deny', 'allowlist'));
