-- capd schema, migration 1: builds, jobs, cells, attempts, records, blobs.
-- Public identifiers are opaque strings; integer rowids stay internal.

CREATE TABLE builds (
    id          INTEGER PRIMARY KEY,
    name        TEXT NOT NULL UNIQUE,
    python      TEXT NOT NULL,
    env_json    TEXT NOT NULL DEFAULT '{}',
    model_roots TEXT NOT NULL DEFAULT '[]',
    description TEXT NOT NULL DEFAULT '',
    created_at  INTEGER NOT NULL,
    updated_at  INTEGER NOT NULL
);

CREATE TABLE jobs (
    seq             INTEGER PRIMARY KEY,
    id              TEXT NOT NULL UNIQUE,
    project         TEXT NOT NULL,
    commit_sha      TEXT NOT NULL,
    branch          TEXT,
    build           TEXT NOT NULL,
    control_commit  TEXT,
    request_json    TEXT NOT NULL,
    options_json    TEXT NOT NULL,
    labels_json     TEXT NOT NULL DEFAULT '{}',
    provenance_json TEXT,
    state           TEXT NOT NULL DEFAULT 'queued'
                    CHECK (state IN ('queued','running','done','cancelled')),
    idem_key        TEXT UNIQUE,
    idem_hash       TEXT,
    created_at      INTEGER NOT NULL,
    updated_at      INTEGER NOT NULL,
    finished_at     INTEGER
);
CREATE INDEX jobs_commit ON jobs(commit_sha, seq);
CREATE INDEX jobs_branch ON jobs(branch, seq);
CREATE INDEX jobs_state ON jobs(state, seq);

CREATE TABLE cells (
    seq             INTEGER PRIMARY KEY,
    id              TEXT NOT NULL UNIQUE,
    job_seq         INTEGER NOT NULL REFERENCES jobs(seq) ON DELETE CASCADE,
    ord             INTEGER NOT NULL,
    model           TEXT NOT NULL,
    width           TEXT NOT NULL,
    pass            TEXT NOT NULL,
    state           TEXT NOT NULL DEFAULT 'queued'
                    CHECK (state IN ('queued','running','ok','failed','crashed','timeout',
                                     'cancelled','unsupported','protocol_error','interrupted')),
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
    UNIQUE (job_seq, model, width, pass)
);
CREATE INDEX cells_state ON cells(state, job_seq, ord);

-- One row per run of a cell. Records reference their attempt; an attempt
-- becomes visible by being named in cells.committed_attempt, so readers
-- never see a half-written attempt.
CREATE TABLE attempts (
    id          INTEGER PRIMARY KEY,
    cell_seq    INTEGER NOT NULL REFERENCES cells(seq) ON DELETE CASCADE,
    n           INTEGER NOT NULL,
    state       TEXT NOT NULL DEFAULT 'open' CHECK (state IN ('open','committed','discarded')),
    partial     INTEGER NOT NULL DEFAULT 0,
    started_at  INTEGER NOT NULL,
    UNIQUE (cell_seq, n)
);

-- Payloads are content-addressed files under DATA/blobs/<2 hex>/<hash>
-- (written once, renamed into place); this table says which exist and how
-- they are encoded. Keeping megabyte payloads out of the WAL is what lets
-- ingest run near pipe speed.
CREATE TABLE blobs (
    hash        TEXT PRIMARY KEY,
    codec       TEXT NOT NULL CHECK (codec IN ('raw','zstd')),
    raw_size    INTEGER NOT NULL,
    stored_size INTEGER NOT NULL
) WITHOUT ROWID;

-- One row per frame of an attempt, keyed by (attempt, frame order): the
-- primary key is the only index the hot ingest path maintains.
CREATE TABLE records (
    attempt_id  INTEGER NOT NULL REFERENCES attempts(id) ON DELETE CASCADE,
    seq         INTEGER NOT NULL,
    kind        TEXT NOT NULL,
    key         TEXT,
    header      TEXT NOT NULL,
    blob_hash   TEXT,
    PRIMARY KEY (attempt_id, seq)
) WITHOUT ROWID;
CREATE INDEX records_blob ON records(blob_hash) WHERE blob_hash IS NOT NULL;

CREATE TABLE branches (
    name           TEXT PRIMARY KEY,
    control_commit TEXT,
    updated_at     INTEGER NOT NULL
);
