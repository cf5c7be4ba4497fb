-- capd schema, migration 4: prefork runners (docs/prefork.md).
--
-- prefork is the build's opt-in: its cells are forked from a zygote process
-- that imported the framework once. The zygote proves, the first time it
-- serves the build, that a forked child captures hash for hash what a fresh
-- exec captures; the outcome is kept here so the check runs once per
-- registration (replacing the build resets it to 'unverified'). A 'refused'
-- build runs every cell by fresh exec, and prefork_reason says why.
ALTER TABLE builds ADD COLUMN prefork INTEGER NOT NULL DEFAULT 0 CHECK (prefork IN (0, 1));
ALTER TABLE builds ADD COLUMN prefork_state TEXT NOT NULL DEFAULT 'unverified'
    CHECK (prefork_state IN ('unverified', 'verified', 'refused'));
ALTER TABLE builds ADD COLUMN prefork_reason TEXT;
ALTER TABLE builds ADD COLUMN prefork_checked_at INTEGER;
