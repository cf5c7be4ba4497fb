-- capd schema, migration 2: API tokens, and which token created each job.
-- A token's secret is never stored: only the SHA-256 of the whole token
-- string, compared in constant time after the row is found by its id.

CREATE TABLE tokens (
    id          TEXT PRIMARY KEY,
    name        TEXT NOT NULL DEFAULT '',
    scope       TEXT NOT NULL CHECK (scope IN ('read','submit','admin')),
    hash        TEXT NOT NULL,
    created_at  INTEGER NOT NULL,
    expires_at  INTEGER,
    revoked_at  INTEGER
) WITHOUT ROWID;

-- NULL for jobs posted while authentication was disabled (and for every
-- job that existed before this migration).
ALTER TABLE jobs ADD COLUMN token_id TEXT;
CREATE INDEX jobs_token ON jobs(token_id, state) WHERE token_id IS NOT NULL;
