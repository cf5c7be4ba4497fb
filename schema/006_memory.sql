-- capd schema, migration 6: what a cell cost, and 'oom' as its outcome
-- (docs/configuration.md, "Memory").
--
-- A cell killed for memory (its cgroup's OOM kill, or capd's watchdog), or
-- whose runner saw the framework fail to allocate, ends 'oom'. SQLite
-- cannot alter a CHECK constraint, and rebuilding cells would cascade into
-- its attempts and records under foreign keys, so the constraint's text is
-- widened in place: every existing row satisfies the wider list, which is
-- the case in which SQLite documents editing the schema this way.
-- writable_schema = RESET makes this connection parse the edited schema
-- again before the columns below are added (ALTER TABLE edits the text at
-- offsets taken from the parsed schema).
PRAGMA writable_schema = ON;
UPDATE sqlite_schema
   SET sql = replace(sql, '''protocol_error'',''interrupted'')',
                          '''protocol_error'',''interrupted'',''oom'')')
 WHERE type = 'table' AND name = 'cells';
PRAGMA writable_schema = RESET;
PRAGMA writable_schema = OFF;

-- The memory limit that applied (bytes) and the CPU time the cell's
-- processes used (user + system, milliseconds). NULL for cells that ended
-- before a process started.
ALTER TABLE cells ADD COLUMN memory_limit_bytes INTEGER;
ALTER TABLE cells ADD COLUMN cpu_time_ms INTEGER;
