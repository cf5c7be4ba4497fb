-- capd schema, migration 7: history along a branch (docs/history.md).
--
-- A series is one (project, branch, model, width, pass); its points are the
-- cells of the branch's finished jobs, one per commit, in commit order.
-- Points and alerts are written when a job finishes (storage/history.c
-- drains history_pending), so a history query reads them and never the
-- records.

CREATE TABLE history_series (
    id         INTEGER PRIMARY KEY,
    project    TEXT NOT NULL,
    branch     TEXT NOT NULL,
    model      TEXT NOT NULL,
    width      TEXT NOT NULL,
    pass       TEXT NOT NULL,
    updated_at INTEGER NOT NULL,
    UNIQUE (project, branch, model, width, pass)
);

-- order_ms is the commit time (moved to just after the first parent when
-- the parent is a point of the series and is not older) or, for a job
-- without commit_time, its submission time (ordered_by 'submission');
-- order_seq, the job's sequence, breaks ties.
CREATE TABLE history_points (
    series_id      INTEGER NOT NULL REFERENCES history_series(id) ON DELETE CASCADE,
    commit_sha     TEXT NOT NULL,
    order_ms       INTEGER NOT NULL,
    order_seq      INTEGER NOT NULL,
    ordered_by     TEXT NOT NULL CHECK (ordered_by IN ('commit', 'submission')),
    commit_time    TEXT,
    job_id         TEXT NOT NULL,
    cell_id        TEXT NOT NULL,
    attempt_id     INTEGER,
    outcome        TEXT NOT NULL,
    perf_ns        REAL,
    perf_samples   INTEGER NOT NULL DEFAULT 0,
    peak_rss_bytes INTEGER,
    digest         TEXT,
    n_tensors      INTEGER NOT NULL DEFAULT 0,
    numerics       TEXT NOT NULL DEFAULT 'unknown'
                   CHECK (numerics IN ('first', 'identical', 'diverged', 'unknown')),
    first_divergent_key TEXT,
    created_at     INTEGER NOT NULL,
    PRIMARY KEY (series_id, commit_sha)
) WITHOUT ROWID;
CREATE INDEX history_points_order ON history_points(series_id, order_ms, order_seq);

-- Change points (kind perf, memory) and exact events (numerics, outcome).
-- detected is 0 once the latest analysis no longer finds the alert; its
-- status (the feedback) is kept either way.
CREATE TABLE alerts (
    id          TEXT PRIMARY KEY,
    series_id   INTEGER NOT NULL REFERENCES history_series(id) ON DELETE CASCADE,
    kind        TEXT NOT NULL CHECK (kind IN ('perf', 'memory', 'numerics', 'outcome')),
    commit_sha  TEXT NOT NULL,
    last_good   TEXT,
    label       TEXT NOT NULL,
    detail_json TEXT NOT NULL,
    order_ms    INTEGER NOT NULL,
    order_seq   INTEGER NOT NULL,
    detected    INTEGER NOT NULL DEFAULT 1,
    status      TEXT NOT NULL DEFAULT 'open'
                CHECK (status IN ('open', 'acknowledged', 'false_positive', 'expected')),
    note        TEXT,
    created_at  INTEGER NOT NULL,
    updated_at  INTEGER NOT NULL,
    UNIQUE (series_id, kind, commit_sha)
);
CREATE INDEX alerts_list ON alerts(detected, status, order_ms);

-- Jobs of a branch that finished and are not yet in the history: the
-- trigger fills it in the transaction that finishes the job, so no
-- finished job is missed across a crash.
CREATE TABLE history_pending (
    job_seq INTEGER PRIMARY KEY
);

CREATE TRIGGER history_job_done AFTER UPDATE OF state ON jobs
WHEN NEW.state = 'done' AND OLD.state IS NOT 'done' AND NEW.branch IS NOT NULL
BEGIN
    INSERT OR IGNORE INTO history_pending(job_seq) VALUES (NEW.seq);
END;
