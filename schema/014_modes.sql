-- capd schema, migration 14: the compile axis. A cell is model x width x
-- pass x mode (eager, aot_eager, inductor: docs/api.md, "Compiled
-- cells"); every cell stored before it is eager.
--
-- The mode joins the cell's unique key, which SQLite cannot alter: cells
-- is rebuilt, the documented way (https://sqlite.org/lang_altertable.html,
-- "Making Other Kinds Of Table Schema Changes"). capd runs every migration
-- with foreign keys off and checks them before it commits
-- (storage/store.c), so dropping the old table cascades into no attempt.
-- Its index and triggers go with it and are made again; the cell event
-- also says the mode.

CREATE TABLE cells_new (
    seq             INTEGER PRIMARY KEY,
    id              TEXT NOT NULL UNIQUE,
    job_seq         INTEGER NOT NULL REFERENCES jobs(seq) ON DELETE CASCADE,
    ord             INTEGER NOT NULL,
    model           TEXT NOT NULL,
    width           TEXT NOT NULL,
    pass            TEXT NOT NULL,
    state           TEXT NOT NULL DEFAULT 'queued'
                    CHECK (state IN ('queued','running','ok','failed','crashed','timeout',
                                     'cancelled','unsupported','protocol_error','interrupted','oom')),
    attempts        INTEGER NOT NULL DEFAULT 0,
    committed_attempt INTEGER,
    exit_code       INTEGER,
    signal          TEXT,
    reason          TEXT,
    effective_width TEXT,
    duration_ms     INTEGER,
    peak_rss_bytes  INTEGER,
    started_at      INTEGER,
    finished_at     INTEGER,
    host_missing    TEXT,
    memory_limit_bytes INTEGER,
    cpu_time_ms     INTEGER,
    mode            TEXT NOT NULL DEFAULT 'eager',
    UNIQUE (job_seq, model, width, pass, mode)
);

INSERT INTO cells_new (seq, id, job_seq, ord, model, width, pass, state, attempts,
                       committed_attempt, exit_code, signal, reason, effective_width,
                       duration_ms, peak_rss_bytes, started_at, finished_at, host_missing,
                       memory_limit_bytes, cpu_time_ms)
    SELECT seq, id, job_seq, ord, model, width, pass, state, attempts, committed_attempt,
           exit_code, signal, reason, effective_width, duration_ms, peak_rss_bytes, started_at,
           finished_at, host_missing, memory_limit_bytes, cpu_time_ms
      FROM cells;

-- Other tables' triggers name cells (jobs_event_state counts its rows):
-- the legacy rename leaves them alone instead of failing on the table
-- that is, for this moment, not there.
DROP TABLE cells;
PRAGMA legacy_alter_table = ON;
ALTER TABLE cells_new RENAME TO cells;
PRAGMA legacy_alter_table = OFF;

CREATE INDEX cells_state ON cells(state, job_seq, ord);

CREATE TRIGGER jobs_version_cell AFTER UPDATE ON cells
BEGIN
    UPDATE jobs SET version = version + 1 WHERE seq = NEW.job_seq;
END;

CREATE TRIGGER cells_event_state AFTER UPDATE OF state ON cells
WHEN OLD.state IS NOT NEW.state
BEGIN
    INSERT INTO events(ts, type, job_id, project, branch, data)
    SELECT CAST((julianday('now') - 2440587.5) * 86400000 AS INTEGER), 'cell', j.id, j.project,
           j.branch,
           json_object('change', 'state',
               'job', json_object('id', j.id, 'state', j.state,
                   'counts', json(coalesce((SELECT json_group_object(state, n) FROM
                       (SELECT state, count(*) AS n FROM cells WHERE job_seq = NEW.job_seq
                        GROUP BY state)), '{}'))),
               'cell', json_object(
                   'id', NEW.id, 'model', NEW.model, 'width', NEW.width, 'pass', NEW.pass,
                   'mode', NEW.mode,
                   'state', NEW.state, 'previous_state', OLD.state, 'attempts', NEW.attempts,
                   'exit_code', NEW.exit_code, 'signal', NEW.signal, 'reason', NEW.reason,
                   'effective_width', NEW.effective_width, 'duration_ms', NEW.duration_ms,
                   'peak_rss_bytes', NEW.peak_rss_bytes,
                   'started_at', strftime('%Y-%m-%dT%H:%M:%fZ', NEW.started_at / 1000.0, 'unixepoch'),
                   'finished_at', strftime('%Y-%m-%dT%H:%M:%fZ', NEW.finished_at / 1000.0, 'unixepoch')))
    FROM jobs j WHERE j.seq = NEW.job_seq;
END;
