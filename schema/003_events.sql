-- capd schema, migration 3: the change feed behind GET /v1/events, long-polls
-- and ETags (docs/dashboard.md).
--
-- Everything here is driven by triggers, so every path that changes a job or
-- a cell (submission, the scheduler's claim, a cell's end, cancellation,
-- start-up recovery, and any later code) publishes its change in the same
-- transaction as the change itself: a reader can never see a new state
-- without its event, nor an event without its state.

-- A job's version grows with every change to the job or one of its cells;
-- GET /v1/jobs/{id} answers If-None-Match from it without building the body.
ALTER TABLE jobs ADD COLUMN version INTEGER NOT NULL DEFAULT 0;

-- Versions of whole collections, for the ETags of list endpoints.
CREATE TABLE counters (
    name  TEXT PRIMARY KEY,
    value INTEGER NOT NULL
) WITHOUT ROWID;
INSERT INTO counters(name, value) VALUES ('jobs', 0), ('builds', 0), ('payloads', 0);

-- The replay window of the event stream. AUTOINCREMENT keeps ids monotonic
-- across pruning and restarts, so a Last-Event-ID is never reused.
CREATE TABLE events (
    id      INTEGER PRIMARY KEY AUTOINCREMENT,
    ts      INTEGER NOT NULL,
    type    TEXT NOT NULL CHECK (type IN ('job', 'cell')),
    job_id  TEXT NOT NULL,
    project TEXT NOT NULL,
    branch  TEXT,
    data    TEXT NOT NULL
);
CREATE INDEX events_job ON events(job_id, id);

-- Bounded window: the last 10,000 events (STORE_EVENTS_WINDOW).
CREATE TRIGGER events_prune AFTER INSERT ON events
BEGIN
    DELETE FROM events WHERE id <= NEW.id - 10000;
END;

-- ---- versions ----

CREATE TRIGGER jobs_version_job AFTER UPDATE OF state, updated_at, finished_at, request_json,
    options_json, labels_json, provenance_json, branch, control_commit ON jobs
BEGIN
    UPDATE jobs SET version = version + 1 WHERE seq = NEW.seq;
END;

CREATE TRIGGER jobs_version_cell AFTER UPDATE ON cells
BEGIN
    UPDATE jobs SET version = version + 1 WHERE seq = NEW.job_seq;
END;

CREATE TRIGGER jobs_count_insert AFTER INSERT ON jobs
BEGIN
    UPDATE counters SET value = value + 1 WHERE name = 'jobs';
END;

CREATE TRIGGER jobs_count_update AFTER UPDATE ON jobs
BEGIN
    UPDATE counters SET value = value + 1 WHERE name = 'jobs';
END;

CREATE TRIGGER jobs_count_delete AFTER DELETE ON jobs
BEGIN
    UPDATE counters SET value = value + 1 WHERE name = 'jobs';
END;

CREATE TRIGGER builds_count_insert AFTER INSERT ON builds
BEGIN
    UPDATE counters SET value = value + 1 WHERE name = 'builds';
END;

CREATE TRIGGER builds_count_update AFTER UPDATE ON builds
BEGIN
    UPDATE counters SET value = value + 1 WHERE name = 'builds';
END;

CREATE TRIGGER builds_count_delete AFTER DELETE ON builds
BEGIN
    UPDATE counters SET value = value + 1 WHERE name = 'builds';
END;

-- Retention detaching payloads changes what a comparison can compute
-- (samples become statistics), so comparison ETags include this counter.
CREATE TRIGGER payloads_count_detach AFTER UPDATE OF blob_hash ON records
BEGIN
    UPDATE counters SET value = value + 1 WHERE name = 'payloads';
END;

-- ---- events ----
-- Payloads use the API's own field names and RFC 3339 times, so a client
-- can apply them to what it fetched.

-- A new job: all of its cells are queued.
CREATE TRIGGER jobs_event_insert AFTER INSERT ON jobs
BEGIN
    INSERT INTO events(ts, type, job_id, project, branch, data)
    VALUES (CAST((julianday('now') - 2440587.5) * 86400000 AS INTEGER), 'job', NEW.id,
            NEW.project, NEW.branch,
            json_object('change', 'created', 'job', json_object(
                'id', NEW.id, 'project', NEW.project, 'commit', NEW.commit_sha,
                'branch', NEW.branch, 'build', NEW.build,
                'control_commit', NEW.control_commit, 'state', NEW.state,
                'created_at', strftime('%Y-%m-%dT%H:%M:%fZ', NEW.created_at / 1000.0, 'unixepoch'),
                'updated_at', strftime('%Y-%m-%dT%H:%M:%fZ', NEW.updated_at / 1000.0, 'unixepoch'),
                'finished_at', NULL,
                'counts', json_object('queued',
                    json_array_length(NEW.request_json, '$.matrix.models') *
                    json_array_length(NEW.request_json, '$.matrix.widths') *
                    json_array_length(NEW.request_json, '$.matrix.passes')))));
END;

CREATE TRIGGER jobs_event_state AFTER UPDATE OF state ON jobs
WHEN OLD.state IS NOT NEW.state
BEGIN
    INSERT INTO events(ts, type, job_id, project, branch, data)
    VALUES (CAST((julianday('now') - 2440587.5) * 86400000 AS INTEGER), 'job', NEW.id,
            NEW.project, NEW.branch,
            json_object('change', 'state', 'job', json_object(
                'id', NEW.id, 'project', NEW.project, 'commit', NEW.commit_sha,
                'branch', NEW.branch, 'build', NEW.build,
                'control_commit', NEW.control_commit, 'state', NEW.state,
                'created_at', strftime('%Y-%m-%dT%H:%M:%fZ', NEW.created_at / 1000.0, 'unixepoch'),
                'updated_at', strftime('%Y-%m-%dT%H:%M:%fZ', NEW.updated_at / 1000.0, 'unixepoch'),
                'finished_at', strftime('%Y-%m-%dT%H:%M:%fZ', NEW.finished_at / 1000.0, 'unixepoch'),
                'counts', json(coalesce((SELECT json_group_object(state, n) FROM
                    (SELECT state, count(*) AS n FROM cells WHERE job_seq = NEW.seq
                     GROUP BY state)), '{}')))));
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
                   'state', NEW.state, 'previous_state', OLD.state, 'attempts', NEW.attempts,
                   'exit_code', NEW.exit_code, 'signal', NEW.signal, 'reason', NEW.reason,
                   'effective_width', NEW.effective_width, 'duration_ms', NEW.duration_ms,
                   'peak_rss_bytes', NEW.peak_rss_bytes,
                   'started_at', strftime('%Y-%m-%dT%H:%M:%fZ', NEW.started_at / 1000.0, 'unixepoch'),
                   'finished_at', strftime('%Y-%m-%dT%H:%M:%fZ', NEW.finished_at / 1000.0, 'unixepoch')))
    FROM jobs j WHERE j.seq = NEW.job_seq;
END;
