-- capd schema, migration 8: bisection over per-commit builds, and the
-- event types that report it and new alerts (docs/history.md).
--
-- A bisection is a list of commits, oldest first, whose first is good and
-- last is bad; its probes are the commits it ran (or reused) a job for.
-- The daemon loop advances it from what these rows and the probes' jobs
-- say (daemon/bisect.c), so a restarted capd takes it up where it stood.

CREATE TABLE bisections (
    seq          INTEGER PRIMARY KEY,
    id           TEXT NOT NULL UNIQUE,
    project      TEXT NOT NULL,
    build        TEXT NOT NULL,
    branch       TEXT,
    predicate    TEXT NOT NULL CHECK (predicate IN ('numerics', 'outcome', 'perf')),
    threshold    REAL NOT NULL,
    commits_json TEXT NOT NULL,
    job_json     TEXT NOT NULL,
    state        TEXT NOT NULL DEFAULT 'running'
                 CHECK (state IN ('running', 'done', 'failed', 'cancelled')),
    round        INTEGER NOT NULL DEFAULT 0,
    reason       TEXT,
    result_json  TEXT,
    token_id     TEXT,
    created_at   INTEGER NOT NULL,
    updated_at   INTEGER NOT NULL,
    finished_at  INTEGER
);
CREATE INDEX bisections_state ON bisections(state, seq);

-- One row per commit a bisection looked at. state: pending (no job yet:
-- the queue was full), running (its job is not finished), good, bad, or
-- skipped (its build did not start, or its verdict could not be decided).
CREATE TABLE bisect_probes (
    bisect_seq   INTEGER NOT NULL REFERENCES bisections(seq) ON DELETE CASCADE,
    idx          INTEGER NOT NULL,
    commit_sha   TEXT NOT NULL,
    round        INTEGER NOT NULL,
    job_id       TEXT,
    reused       INTEGER NOT NULL DEFAULT 0,
    state        TEXT NOT NULL DEFAULT 'pending'
                 CHECK (state IN ('pending', 'running', 'good', 'bad', 'skipped')),
    reason       TEXT,
    verdict_json TEXT,
    updated_at   INTEGER NOT NULL,
    PRIMARY KEY (bisect_seq, idx)
) WITHOUT ROWID;

-- ---- the event stream gets two types: bisect and alert ----
-- SQLite cannot change a CHECK constraint, so the table is rebuilt. With
-- legacy_alter_table on, the rename leaves the triggers of jobs and cells
-- (which insert into "events" by name) as they are, and they find the new
-- table under the old name. The AUTOINCREMENT counter moves with it, so no
-- event id is ever reused.
PRAGMA legacy_alter_table = ON;
CREATE TABLE events_v8 (
    id      INTEGER PRIMARY KEY AUTOINCREMENT,
    ts      INTEGER NOT NULL,
    type    TEXT NOT NULL CHECK (type IN ('job', 'cell', 'bisect', 'alert')),
    job_id  TEXT NOT NULL,
    project TEXT NOT NULL,
    branch  TEXT,
    data    TEXT NOT NULL
);
INSERT INTO events_v8(id, ts, type, job_id, project, branch, data)
    SELECT id, ts, type, job_id, project, branch, data FROM events;
INSERT INTO sqlite_sequence(name, seq)
    SELECT 'events_v8', seq FROM sqlite_sequence WHERE name = 'events'
    AND NOT EXISTS (SELECT 1 FROM sqlite_sequence WHERE name = 'events_v8');
UPDATE sqlite_sequence SET seq = max(seq, coalesce((SELECT seq FROM sqlite_sequence
    WHERE name = 'events'), 0)) WHERE name = 'events_v8';
DROP TABLE events;
ALTER TABLE events_v8 RENAME TO events;
PRAGMA legacy_alter_table = OFF;
CREATE INDEX events_job ON events(job_id, id);
CREATE TRIGGER events_prune AFTER INSERT ON events
BEGIN
    DELETE FROM events WHERE id <= NEW.id - 10000;
END;

-- A bisection's events carry its id in job_id (the stream's job filter
-- follows one bisection) and a summary of it: state, round, result.
CREATE TRIGGER bisections_event_insert AFTER INSERT ON bisections
BEGIN
    INSERT INTO events(ts, type, job_id, project, branch, data)
    VALUES (CAST((julianday('now') - 2440587.5) * 86400000 AS INTEGER), 'bisect', NEW.id,
            NEW.project, NEW.branch,
            json_object('change', 'created', 'bisect', json_object(
                'id', NEW.id, 'state', NEW.state, 'round', NEW.round,
                'predicate', NEW.predicate, 'commits', json_array_length(NEW.commits_json))));
END;

CREATE TRIGGER bisections_event_update AFTER UPDATE OF state, round ON bisections
WHEN OLD.state IS NOT NEW.state OR OLD.round IS NOT NEW.round
BEGIN
    INSERT INTO events(ts, type, job_id, project, branch, data)
    VALUES (CAST((julianday('now') - 2440587.5) * 86400000 AS INTEGER), 'bisect', NEW.id,
            NEW.project, NEW.branch,
            json_object('change', CASE WHEN OLD.state IS NOT NEW.state THEN 'state'
                                       ELSE 'round' END,
                'bisect', json_object(
                'id', NEW.id, 'state', NEW.state, 'round', NEW.round, 'reason', NEW.reason,
                'result', json(NEW.result_json))));
END;

CREATE TRIGGER bisect_probes_event_insert AFTER INSERT ON bisect_probes
BEGIN
    INSERT INTO events(ts, type, job_id, project, branch, data)
    SELECT CAST((julianday('now') - 2440587.5) * 86400000 AS INTEGER), 'bisect', b.id,
           b.project, b.branch,
           json_object('change', 'probe', 'bisect', json_object('id', b.id, 'state', b.state,
               'round', b.round),
               'probe', json_object('index', NEW.idx, 'commit', NEW.commit_sha,
                   'round', NEW.round, 'job', NEW.job_id, 'reused', NEW.reused = 1,
                   'state', NEW.state, 'reason', NEW.reason))
    FROM bisections b WHERE b.seq = NEW.bisect_seq;
END;

CREATE TRIGGER bisect_probes_event_update AFTER UPDATE OF state, job_id ON bisect_probes
WHEN OLD.state IS NOT NEW.state OR OLD.job_id IS NOT NEW.job_id
BEGIN
    INSERT INTO events(ts, type, job_id, project, branch, data)
    SELECT CAST((julianday('now') - 2440587.5) * 86400000 AS INTEGER), 'bisect', b.id,
           b.project, b.branch,
           json_object('change', 'probe', 'bisect', json_object('id', b.id, 'state', b.state,
               'round', b.round),
               'probe', json_object('index', NEW.idx, 'commit', NEW.commit_sha,
                   'round', NEW.round, 'job', NEW.job_id, 'reused', NEW.reused = 1,
                   'state', NEW.state, 'reason', NEW.reason,
                   'verdict', json(NEW.verdict_json)))
    FROM bisections b WHERE b.seq = NEW.bisect_seq;
END;

-- An alert opens when an analysis first finds it, or finds it again after
-- it had gone; its event carries the alert's id in job_id. Both triggers
-- write the same event, made by this view.
CREATE VIEW alert_opened_events AS
    SELECT a.id AS alert_id, s.project AS project, s.branch AS branch,
           json_object('change', 'opened', 'alert', json_object(
               'id', a.id, 'kind', a.kind, 'label', a.label, 'first_bad', a.commit_sha,
               'last_good', a.last_good, 'status', a.status, 'project', s.project,
               'branch', s.branch, 'model', s.model, 'width', s.width, 'pass', s.pass,
               'detail', json(a.detail_json))) AS data
    FROM alerts a JOIN history_series s ON s.id = a.series_id;

CREATE TRIGGER alerts_event_insert AFTER INSERT ON alerts
WHEN NEW.detected = 1 AND NEW.status = 'open'
BEGIN
    INSERT INTO events(ts, type, job_id, project, branch, data)
    SELECT CAST((julianday('now') - 2440587.5) * 86400000 AS INTEGER), 'alert', alert_id,
           project, branch, data
    FROM alert_opened_events WHERE alert_id = NEW.id;
END;

CREATE TRIGGER alerts_event_redetected AFTER UPDATE OF detected ON alerts
WHEN OLD.detected = 0 AND NEW.detected = 1 AND NEW.status = 'open'
BEGIN
    INSERT INTO events(ts, type, job_id, project, branch, data)
    SELECT CAST((julianday('now') - 2440587.5) * 86400000 AS INTEGER), 'alert', alert_id,
           project, branch, data
    FROM alert_opened_events WHERE alert_id = NEW.id;
END;
