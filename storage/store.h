/*
 * storage/store.h - everything capd keeps, in one SQLite database.
 *
 * A struct store is one SQLite connection and must only be used by the
 * thread that opened it: the daemon loop owns one (scheduler and ingest
 * writer), and every HTTP worker thread opens its own on first use. The
 * database runs in WAL mode so readers never block the ingest writer.
 *
 * Functions return 0 or a negative errno-style code:
 *   -ENOENT  the named thing does not exist
 *   -EEXIST  a conflicting thing exists (duplicate name, idempotency clash)
 *   -EBUSY   the database stayed locked past the busy timeout
 *   -EPROTO  the database is newer than this binary
 *   -ENOSPC  storage refused a write: disk full (SQLITE_FULL, ENOSPC,
 *            EDQUOT), read-only (SQLITE_READONLY, EROFS) or an I/O error
 *            (SQLITE_IOERR, EIO); the transaction was rolled back and the
 *            same call may succeed once room is made (HTTP 503
 *            storage_unavailable)
 *   -EIO     anything else SQLite reported (store_errmsg() says what)
 * Results meant for HTTP replies come back as jansson objects the caller
 * owns (json_decref when done).
 */
#ifndef CAPD_STORE_H
#define CAPD_STORE_H

#include <jansson.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include "storage/options.h"

struct store;

/* The schema version this binary writes (the number of migrations). */
int store_schema_version(void);

/*
 * Opens (creating when needed) DIR/capd.db. With migrate set, pending
 * migrations run first; without it the schema must already be current.
 * On failure *err_out (when non-NULL) gets a malloc'd message.
 */
int store_open(const char *data_dir, bool migrate, struct store **out, char **err_out);
void store_close(struct store *s);

/*
 * Moves WAL checkpoints of this connection's commits to a thread of their
 * own (with its own connection), so the thread that commits ingest
 * batches never copies the WAL into the database itself. Once the WAL
 * holds STORE_CHECKPOINT_PAGES pages after a commit, that thread runs a
 * passive checkpoint; the writer goes on meanwhile. Stopped by
 * store_close. On failure the connection keeps checkpointing inline.
 */
int store_checkpoint_in_background(struct store *s);
const char *store_errmsg(const struct store *s);

/* Writes a random opaque id: PREFIX followed by 12 hex digits. */
void store_new_id(char prefix, char out[16]);

/* ---- builds ---- */

/* BUILD is the validated request body; replace selects PUT semantics. */
int store_build_put(struct store *s, const char *name, json_t *build, bool replace, json_t **out);
int store_build_get(struct store *s, const char *name, json_t **out);
/* The build's revision: its updated_at in ms, what a claimed cell's build
 * carries as "rev" (a zygote serves one revision). -ENOENT when unknown. */
int store_build_rev(struct store *s, const char *name, int64_t *rev);
int store_build_list(struct store *s, json_t **out);
/*
 * Build templates (docs/history.md, "Bisection"): a build whose python or
 * env values contain STORE_BUILD_COMMIT is a template, expanded per job to
 * the job's commit (7 to 64 hex digits, so safe inside a path).
 * store_build_expand rewrites BUILD (a build object: python, env) in place;
 * a build that is no template is left as it is. The scheduler's claim
 * expands the build of every cell it hands out, so nothing downstream sees
 * a template. -ENOMEM for want of memory.
 */
#define STORE_BUILD_COMMIT "{commit}"
bool store_build_is_template(json_t *build);
int store_build_expand(json_t *build, const char *commit);
/* Stores a prefork verification outcome (STATE 'verified' or 'refused' with
 * REASON) for revision REV (updated_at, ms) of build NAME; a newer revision
 * is left alone (storage/prefork.c, docs/prefork.md). */
int store_build_prefork_set(struct store *s, const char *name, int64_t rev, const char *state,
                            const char *reason);

/* ---- jobs ---- */

struct store_job_new {
    json_t *request;       /* the validated, normalized request body */
    const char *idem_key;  /* Idempotency-Key header or NULL */
    const char *body_hash; /* hash of the raw body, for idempotency */
    int max_queued_jobs;   /* 0 = unlimited */
    /* The creating token, stored on the job (NULL for none), and how many
     * queued+running jobs it may have (0 = unlimited). */
    const char *token_id;
    int max_queued_per_token;
};

/* Creates the job and its cells; *existed is set when an idempotent retry
 * returned an earlier job instead. -EAGAIN past max_queued_jobs, -EDQUOT
 * past max_queued_per_token. */
int store_job_create(struct store *s, const struct store_job_new *n, json_t **job_out,
                     bool *existed);
int store_job_get(struct store *s, const char *id, json_t **out);

struct store_job_filter {
    const char *commit, *branch, *build, *state, *project;
    int limit;
    int64_t before_seq; /* from the cursor; 0 = from the newest */
};
int store_job_list(struct store *s, const struct store_job_filter *f, json_t **out);

/* Marks the job cancelled and every queued cell cancelled. Running cells
 * are the daemon loop's to stop. -EALREADY when the job already ended. */
int store_job_cancel(struct store *s, const char *id);

/* ---- cells, for the scheduler (daemon loop only) ---- */

struct store_cell_run {
    int64_t cell_seq, job_seq, attempt_id;
    int attempt;
    char job_id[16], cell_id[16];
    json_t *spec;             /* model, width, pass, mode, options, device... */
    json_t *build;            /* name, python, env, model_roots, prefork, prefork_state, rev */
    struct cell_options opts; /* spec's options, typed (storage/options.h) */
    bool gpu_moved;           /* a device error sent it to another device once already */
};
void store_cell_run_clear(struct store_cell_run *r);

/* The one GPU cell a claim may take (store_cell_claim_filtered's GPU_SEQ):
 * none, so that CPU cells pass the GPU cells that wait for a device. */
#define STORE_GPU_NONE 0

/* Takes the first queued cell in job order, marks it running and opens a
 * new attempt; -ENOENT when nothing is queued. Of the cells of GPU jobs
 * (options.device "gpu") only the one whose seq is GPU_SEQ may be taken
 * (STORE_GPU_NONE: none): the scheduler names the GPU cell a device can
 * take now (store_next_gpu_cell), and the others are passed over, so CPU
 * cells may run meanwhile. */
int store_cell_claim_filtered(struct store *s, int64_t gpu_seq, struct store_cell_run *r);
/* Whether the first queued cell (in claim order) is numerics-only: a CPU
 * cell of a job with options.iterations 0, which may run beside others;
 * and, whatever its device, whether it times nothing (UNTIMED: it may
 * share CPUs; NULL when not wanted). */
int store_next_cell_numerics(struct store *s, bool *numerics, bool *untimed);

/* What the scheduler needs to place a GPU cell (daemon/host/devices.h). */
struct store_gpu_cell {
    int64_t cell_seq;   /* 0 when no GPU cell is queued */
    bool alone;         /* it times (options.iterations > 0) or was queued again to run
                         * alone (store_outcome's alone) */
    int64_t peak_bytes; /* the largest device_peak_bytes recorded by a committed
                         * cell of the same build, model, width, pass and mode; -1 */
};
/* The first queued GPU cell in claim order (cell_seq 0: none). */
int store_next_gpu_cell(struct store *s, struct store_gpu_cell *out);
/* The same facts of the claimed cell RUN. */
int store_gpu_cell_of(struct store *s, const struct store_cell_run *run,
                      struct store_gpu_cell *out);

/* Ingest: records of an open attempt. Writes are batched in one transaction
 * that store_flush() (or a finishing cell) commits. HASH_ALG names the
 * algorithm of a tensor record's hash ("blake2b-128", "xxh3-128"; NULL for
 * other kinds). A payload is stored once, keyed by its SHA-256. */
int store_record_add(struct store *s, int64_t attempt_id, int64_t seq, const char *kind,
                     const char *key, const char *hash_alg, const char *header, size_t header_len,
                     const void *payload, size_t nbytes);
int store_flush(struct store *s);
/*
 * How many ingest transactions were lost so far: a record or a commit that
 * failed (typically -ENOSPC) rolls the whole batch back, and the records of
 * every attempt written since the last commit go with it. An attempt that
 * was running when this count moved has a hole and must not be committed
 * as complete (daemon/attempt/sup.c fails it).
 */
uint64_t store_batch_losses(const struct store *s);

struct store_outcome {
    const char *state; /* a final state's name (util/cellstate.h): ok, failed, ... */
    int exit_code;     /* -1 when none */
    const char *signal;
    const char *reason;
    const char *effective_width;
    const char *host_missing; /* unsupported by this host's CPU: what it lacks */
    int64_t duration_ms, peak_rss_bytes;
    int64_t cpu_time_ms;        /* user + system of the cell's processes */
    int64_t memory_limit_bytes; /* the limit that applied; 0 when none did */
    bool partial;
    bool requeue; /* interrupted: put the cell back in the queue */
    bool alone;   /* with requeue: the GPU cell runs again holding its device alone */
    bool moved;   /* with requeue: the GPU cell runs again on another device, once */
};

/* Commits the attempt's records and the cell's outcome atomically, and
 * moves the job to done when no cell is left to run. */
int store_cell_finish(struct store *s, const struct store_cell_run *r,
                      const struct store_outcome *o);
/*
 * store_cell_finish and then, in the same transaction, the claim
 * store_cell_claim_filtered(GPU_SEQ) would make: one commit per cell where
 * there were two, with the same rows and events in the same order. NEXT gets
 * the claimed cell, or a zeroed NEXT (cell_seq 0) when nothing is queued. A
 * failure rolls both back.
 */
int store_cell_finish_claim(struct store *s, const struct store_cell_run *r,
                            const struct store_outcome *o, int64_t gpu_seq,
                            struct store_cell_run *next);

/*
 * Start-up recovery after a crash or kill -9: open attempts are discarded
 * with their records, running cells become interrupted and are re-queued
 * while they have attempts left. Reports how many cells it touched. With
 * KEEP_REMOTE (a remote executor), an open attempt whose attempt token is
 * still good stays open and its cell running, its records deleted: capd
 * takes it up again (store_remote_reattach) and reads its spool anew.
 */
int store_recover(struct store *s, int max_attempts, bool keep_remote, int *requeued,
                  int *interrupted);

/* ---- reads for the API ---- */
int store_cell_get(struct store *s, const char *job_id, const char *cell_id, json_t **out);
int store_records_list(struct store *s, const char *job_id, const char *cell_id, const char *kind,
                       int64_t after, int limit, json_t **out);
/* Fetches and decompresses a payload blob; *data is malloc'd. */
int store_blob_get(struct store *s, const char *hash, void **data, size_t *len);

/* ---- branches and commits ---- */
int store_branch_put(struct store *s, const char *name, const char *control_commit, json_t **out);
int store_branch_get(struct store *s, const char *name, json_t **out);
/* The newest job of COMMIT (any state unless finished_only); a replay job
 * (labels.replay_of) is never one. */
extern const char store_sql_job_for_commit_done[]; /* exposed for the query-plan test */
int store_job_for_commit(struct store *s, const char *commit, bool finished_only, char id_out[16]);
int store_commit_jobs(struct store *s, const char *commit, json_t **out);
/* The newest replay job of OF ("<job>/<cell>") for SIDE ("control" or
 * "head"), by its labels (api/api_replay.c); -ENOENT when none. */
int store_job_replay(struct store *s, const char *of, const char *side, char id_out[16]);
/* At most 16 ids of a replay's finished control jobs (labels replay_side
 * "control") whose isolated pair the replay step has not prepared (no
 * label replay_isolated), oldest first, into the array *IDS. */
int store_replays_pending(struct store *s, json_t **ids);
/* At most 64 ids of finished jobs, option replay not
 * off, not replay jobs, that the automatic replay has not looked at (no
 * label replay_auto), oldest first (daemon/replay/auto.h). */
int store_replays_auto_pending(struct store *s, json_t **ids);
/* At most 64 ids of finished jobs, option compiler_bisect auto, that the
 * compiler bisection step has not looked at (no label
 * compiler_bisect_auto), oldest first (daemon/replay/compiler.h). */
int store_compiler_bisect_pending(struct store *s, json_t **ids);
/* The newest compiler bisection job of OF ("<job>/<cell>", label
 * compiler_bisect_of); -ENOENT when none. */
int store_job_compiler_bisect(struct store *s, const char *of, char id_out[16]);
/* Sets job ID's label KEY to VALUE (a word of capd's own, never a user's). */
int store_job_label(struct store *s, const char *id, const char *key, const char *value);
/* The request job ID was created from, as stored (validated, normalized). */
int store_job_request(struct store *s, const char *id, json_t **out);

/* ---- comparisons ---- */
struct cmp_side;
struct store_payloads; /* decompressed payloads the engine borrows */
struct store_cell_filter {
    const char *model, *width, *pass; /* fnmatch patterns; NULL = all */
};
/*
 * Adds every cell of JOB_ID (matching F) to SIDE with the records of its
 * visible attempt. Payloads are appended to *PL (created when NULL), which
 * must outlive every cmp_compare() on SIDE; free with store_payloads_free.
 */
int store_load_side(struct store *s, const char *job_id, const struct store_cell_filter *f,
                    struct cmp_side *side, struct store_payloads **pl);
void store_payloads_free(struct store_payloads *pl);
/*
 * The distinct models, widths and passes of JOB_ID's cells, for checking a
 * comparison's filters before it runs: {"model":[..],"width":[..],
 * "pass":[..]}, each sorted. At most STORE_MAX_CELL_VALUES per list;
 * -E2BIG past that (a job's matrix is far smaller). -ENOENT for no job.
 */
#define STORE_MAX_CELL_VALUES 1024
int store_job_cell_values(struct store *s, const char *job_id, json_t **out);

/* ---- database care (storage/maint.c, backup.c, prune.c; docs/operations.md) ---- */

struct store_backup_info {
    int schema_version;
    int64_t db_bytes;                         /* size of the copied database */
    int64_t blobs, blobs_copied;              /* payload files named; copied this time */
    int64_t blob_bytes_copied, blobs_missing; /* missing: named but not in DATA/blobs */
    int64_t logs, logs_copied;                /* cell logs in the backup; copied this time */
    int64_t log_bytes_copied;
    char path[4096]; /* the backup directory, resolved */
};

/*
 * Backs DATA_DIR up into the directory DEST (created when needed), which
 * becomes a data dir capd can start on: DEST/capd.db, DEST/blobs/ and
 * DEST/logs/<job>/<cell>.log (the finished log of every cell the copy names).
 * The database is copied with SQLite's online backup API (one consistent
 * snapshot, taken while capd keeps writing, made a self-contained
 * rollback-journal file and quick_check'ed), then every payload file it
 * names and every cell log; retention cannot delete one meanwhile (shared
 * locks on DATA/blobs and DATA/logs). DEST/capd.db is renamed into place
 * last. Backing up into an earlier backup copies only new payloads and
 * changed logs, and drops those no longer named. Opens its own connection and never migrates, so it
 * works on a database of any schema version. Refuses a DEST inside DATA_DIR, and a non-empty DEST
 * without a capd.db.
 */
int store_backup(const char *data_dir, const char *dest, struct store_backup_info *info,
                 char **err);

struct store_size {
    int64_t page_size, pages, free_pages; /* free: reusable, returned by vacuum */
    int64_t file_bytes, wal_bytes;        /* capd.db and capd.db-wal on disk */
};
int store_size(struct store *s, struct store_size *out);

/* Cells in state running (a capd is probably working on the database). */
int store_running_cells(struct store *s, int64_t *n);

/* VACUUM, then a truncating WAL checkpoint so the file really shrinks;
 * *checkpoint_busy when a reader kept the checkpoint from completing. */
int store_vacuum(struct store *s, bool *checkpoint_busy);

/*
 * Retention. Kept whole: every job of a commit that is a control (some
 * job's control_commit or a branch's), of the newest KEEP_HEADS_PER_BRANCH
 * commits of each (project, branch), or that has a job not finished. Every
 * other job keeps its records (statistics, hashes, timings) but loses its
 * payload references; a payload blob is deleted when no record references
 * it any more (blobs are shared between jobs), and its cell logs
 * (DATA/logs/<job>/) are deleted. Then payload files that no blob row
 * names (left by a crash) are swept. Works in short write
 * transactions, safe while capd runs; STOP (optional) is checked between
 * them (-ECANCELED). A dry run writes nothing and reports what would go.
 */
struct store_prune_opts {
    int keep_heads_per_branch; /* >= 1; 0 means retention is off: -EINVAL */
    bool dry_run;
    const int *stop;
};
struct store_prune_report {
    int64_t jobs, jobs_kept;    /* all jobs; jobs of kept commits */
    int64_t jobs_pruned;        /* jobs whose payload references were dropped */
    int64_t records_detached;   /* records that lost their payload reference */
    int64_t blobs_deleted;      /* payload files (and rows) deleted */
    int64_t orphans_deleted;    /* payload files no row named (crash leftovers) */
    int64_t bytes_freed;        /* stored (compressed) bytes of both */
    int64_t logs_deleted;       /* cell log files of jobs not kept */
    int64_t log_bytes_freed;    /* their bytes */
    int64_t replays_deleted;    /* replay folders (<data_dir>/replays/<job>/) of jobs not kept */
    int64_t replay_bytes_freed; /* their bytes */
    char error[256];            /* what failed, when store_prune does not return 0 */
};
int store_prune(struct store *s, const struct store_prune_opts *o, struct store_prune_report *r);

/* ---- API tokens (storage/tokens.c) ----
 * A token is "capd_<id>_<64 hex digits>": the id finds the row, the 256
 * random bits after it are the secret. Only SHA-256(token) is stored, and
 * it is compared in constant time. */

enum store_scope { STORE_SCOPE_NONE, STORE_SCOPE_READ, STORE_SCOPE_SUBMIT, STORE_SCOPE_ADMIN };
#define STORE_TOKEN_LEN 83 /* strlen("capd_") + 13 + 1 + 64 */

/* "read", "submit", "admin" (and "none"); parse gives -EINVAL otherwise. */
const char *store_scope_name(int scope);
int store_scope_parse(const char *s);

void store_sha256(const void *data, size_t n, unsigned char out[32]);

/* A payload blob's name ("blob" of a record): 's' and the 64 hex digits of
 * the SHA-256 of its bytes (older blobs: 'x' and 32, XXH3-128), with its
 * NUL. */
#define STORE_BLOB_NAME_MAX 66

/* Creates a token; TOKEN_OUT gets the only copy of its secret. EXPIRES_AT
 * is in ms since the epoch, 0 for never. *info (optional) describes it as
 * store_token_list does. -EIO when no randomness is available. */
int store_token_create(struct store *s, int scope, const char *name, int64_t expires_at,
                       char token_out[STORE_TOKEN_LEN + 1], json_t **info);

/* Checks a presented token: 0 and its id and scope when valid; -ENOENT when
 * malformed, unknown or wrong; -EKEYEXPIRED, -EKEYREVOKED for a right secret
 * that no longer counts. */
int store_token_check(struct store *s, const char *token, char id_out[16], int *scope_out);

/*
 * Attempt tokens: the capability of one remote attempt (docs/scale.md,
 * "Remote attempts"), "capd_at_<attempt id>_<64 hex digits>", only its
 * SHA-256 stored. Create makes (or replaces) the attempt's token, valid
 * until EXPIRES_AT (ms since the epoch); TOKEN_OUT gets the only copy.
 */
#define STORE_ATTEMPT_TOKEN_MAX 96
int store_attempt_token_create(struct store *s, int64_t attempt_id, int64_t expires_at,
                               char token_out[STORE_ATTEMPT_TOKEN_MAX]);
/* Whether TOKEN has an attempt token's shape (nothing is looked up). */
bool store_attempt_token_shaped(const char *token);
/* The attempt a presented token is for. 0: valid, the attempt open and
 * running; -ENOENT malformed, unknown or a wrong secret; -ESTALE the right
 * secret of an attempt that has ended (OUT filled, cell_state says how
 * the cell stands); -EKEYEXPIRED past its expiry (OUT filled). */
struct store_attempt_ref {
    int64_t attempt_id;
    int attempt;
    char job_id[16], cell_id[16], cell_state[24];
};
int store_attempt_token_check(struct store *s, const char *token, struct store_attempt_ref *out);
/* The Slurm job that runs a remote attempt's worker (executor slurm):
 * job 0 is none; task is the attempt's index in the job array, -1 when
 * the job is no array. */
struct store_slurm_job {
    uint32_t job;
    int32_t task;
};
/* Records the Slurm job (and array task) of the attempt's worker. */
int store_attempt_slurm_job(struct store *s, int64_t attempt_id, struct store_slurm_job job);
/*
 * The remote attempts start-up recovery kept open (store_recover with
 * KEEP_REMOTE): each handed to FN with its cell (RUN, whose ownership moves
 * to FN) and its Slurm job (job 0: none), in attempt order. FN's non-zero
 * return stops the walk and is returned.
 */
typedef int (*store_reattach_fn)(void *ctx, struct store_cell_run *run,
                                 struct store_slurm_job slurm);
int store_remote_reattach(struct store *s, store_reattach_fn fn, void *ctx);

/* {"tokens":[{id,name,scope,created_at,expires_at,revoked_at}]}, newest first. */
int store_token_list(struct store *s, json_t **out);

/* Revokes at once; -ENOENT unknown, -EALREADY already revoked. */
int store_token_revoke(struct store *s, const char *id);

/* The id of the token that created job JOB_ID ("" when none). -ENOENT when
 * the job does not exist. */
int store_job_token(struct store *s, const char *job_id, char id_out[16]);

/* ---- change feed, versions, counts (storage/events.c) ----
 * Triggers (schema/003_events.sql) write one event per job creation, job
 * state change and cell state change, in the transaction that makes the
 * change, and keep the last STORE_EVENTS_WINDOW of them. Event ids are
 * monotonic and never reused. */

#define STORE_EVENTS_WINDOW 10000

/* FN runs on whichever thread committed a transaction that wrote events,
 * right after the commit; it must be quick and must not block. One
 * listener per process (the HTTP notifier); NULL removes it. */
void store_events_listen(void (*fn)(void *ud), void *ud);

struct store_event_filter {
    const char *job, *project, *branch; /* exact matches; NULL = any */
};
/* Called per event; a non-zero return stops the read and is returned. */
typedef int (*store_event_cb)(void *ud, int64_t id, const char *type, const char *job_id,
                              const char *project, const char *branch, const char *data);
/* Events with AFTER < id <= UPTO (UPTO 0: no bound) matching F (NULL: all),
 * in id order, at most LIMIT; *n_out gets how many were passed to FN. */
int store_events_read(struct store *s, int64_t after, int64_t upto,
                      const struct store_event_filter *f, int limit, store_event_cb fn, void *ud,
                      int *n_out);
/* The oldest id still in the window and the newest id ever written (0 when
 * there is none). */
int store_events_bounds(struct store *s, int64_t *oldest, int64_t *newest);

/* A number that grows with every change to the job or any of its cells
 * (-ENOENT for no such job); *finished when it can change no more: done,
 * or cancelled with no cell left queued or running. */
int store_job_version(struct store *s, const char *job_id, int64_t *version, bool *finished);
/* Collection versions: "jobs" (any job or cell change, insert or delete),
 * "builds", "payloads" (payload references dropped by retention). */
int store_counter(struct store *s, const char *name, int64_t *value);

/* {"jobs":{state:n,...},"cells":{state:n,...}} for /metrics. */
int store_state_counts(struct store *s, json_t **out);

/* SQLite failures seen by any connection of this process, by class.
 * CONFLICT counts UNIQUE and PRIMARY KEY violations apart: a write that
 * names something that already exists (a duplicate build is a client's
 * 409), not a storage fault; CONSTRAINT is every other constraint. */
struct store_errors {
    uint64_t busy, constraint, nomem, io, other, conflict;
};
void store_errors_get(struct store_errors *out);

/* ---- history along a branch (storage/history*.c, docs/history.md) ----
 * Finished jobs of a branch are queued by a trigger; draining the queue
 * makes one point per cell and re-analyses each series it touched (change
 * points of perf and memory, numerics and outcome events), so the reads
 * below never scan records. */

#define STORE_HISTORY_ANALYSE    500   /* newest points of a series each analysis reads */
#define STORE_HISTORY_DRAIN_JOBS 64    /* jobs one store_history_drain call takes */
#define STORE_HISTORY_MAX_LIMIT  10000 /* points (and alerts) one history query returns */
#define STORE_ALERTS_MAX_LIMIT   1000  /* alerts one list returns */

/* Makes the points of up to STORE_HISTORY_DRAIN_JOBS queued jobs, one
 * transaction each; *jobs_out (optional) gets how many. Commits an open
 * ingest batch first. */
int store_history_drain(struct store *s, int *jobs_out);

struct store_history_query {
    const char *project, *branch, *model, *width, *pass; /* exact; all required */
    int limit; /* newest points returned, 1..STORE_HISTORY_MAX_LIMIT */
};
/* {"series","status","points","change_points","events"}; -ENOENT when the
 * series has no point. */
int store_history_get(struct store *s, const struct store_history_query *q, json_t **out);

struct store_alert_filter {
    const char *status, *project, *branch, *kind; /* exact; NULL = any */
    int limit;                                    /* 1..STORE_ALERTS_MAX_LIMIT */
};
/* {"alerts":[...]}, newest first; only alerts the latest analysis found. */
int store_alerts_list(struct store *s, const struct store_alert_filter *f, json_t **out);
/* Feedback: STATUS is open, acknowledged, false_positive or expected; NOTE
 * NULL keeps the note. *out gets the alert. -ENOENT for no such alert. */
int store_alert_set(struct store *s, const char *id, const char *status, const char *note,
                    json_t **out);
/* {"open":n,"acknowledged":n,...} over every alert, for /metrics. */
int store_alert_counts(struct store *s, json_t **out);

/* ---- bisection (storage/bisect.c, daemon/bisect.c, docs/history.md) ----
 * A bisection is a list of commits, oldest first (the first good, the last
 * bad), a job template (the normalized job request of the good commit) and
 * a predicate; its probes are the commits it looked at. */

#define STORE_BISECT_MAX_COMMITS 4096 /* commits of one bisection, both ends included */
#define STORE_BISECT_MAX_RUNNING 16   /* bisections running at once */

struct store_bisect_new {
    const char *project, *build, *branch; /* branch may be NULL */
    const char *predicate;                /* numerics, outcome, perf */
    double threshold;                     /* perf: the slowdown that counts (0.05 = 5%) */
    json_t *commits;                      /* array of commits, oldest first */
    json_t *job;                          /* the job template */
    const char *token_id;                 /* the creating token, or NULL */
};
/* -EAGAIN when STORE_BISECT_MAX_RUNNING bisections are running. *out gets
 * the bisection as store_bisect_get gives it. */
int store_bisect_create(struct store *s, const struct store_bisect_new *n, json_t **out);
/* {id, project, build, branch, predicate, threshold, state, round, good,
 * bad, commit_count, commits, matrix, options, job, reason, result, probes,
 * created_at, updated_at, finished_at}; -ENOENT for no such bisection. */
int store_bisect_get(struct store *s, const char *id, json_t **out);
/* {"bisections":[...]} without commits, job, result and probes, newest
 * first; STATE NULL for any. */
int store_bisect_list(struct store *s, const char *state, int limit, json_t **out);
/* The ids of up to MAX running bisections, oldest first. */
int store_bisect_running(struct store *s, char (*ids)[16], int max, int *n);

struct store_bisect_probe {
    const char *bisect_id, *commit;
    int index, round;
    const char *job_id;  /* NULL while pending */
    bool reused;         /* a finished job that was already there */
    const char *state;   /* pending, running, good, bad, skipped */
    const char *reason;  /* why it was skipped; NULL otherwise */
    const char *verdict; /* JSON text, or NULL */
};
/* Creates or updates the probe of (bisection, index). */
int store_bisect_probe_put(struct store *s, const struct store_bisect_probe *p);
/* Sets a running bisection's STATE, ROUND, REASON and RESULT (NULL keeps
 * the stored one); a bisection that is no longer running is left alone. */
int store_bisect_set(struct store *s, const char *id, const char *state, int round,
                     const char *reason, json_t *result);
/* Cancels a running bisection and the unfinished jobs it submitted;
 * *jobs_out (optional) gets their ids, for the daemon to stop their cells.
 * -EALREADY when it already ended, -ENOENT when there is none. */
int store_bisect_cancel(struct store *s, const char *id, json_t **jobs_out);
/* The token that started bisection ID ("" for none); -ENOENT for none. */
int store_bisect_owner(struct store *s, const char *id, char out[16]);
/* The commits of BRANCH's history in PROJECT (every series), oldest first;
 * -E2BIG past STORE_BRANCH_MAX_COMMITS. */
#define STORE_BRANCH_MAX_COMMITS 100000
int store_branch_commits(struct store *s, const char *project, const char *branch, json_t **out);
/* The newest finished (done) job of COMMIT in PROJECT on BUILD, with
 * CONTROL_COMMIT when that is not NULL; -ENOENT when there is none. */
int store_job_reusable(struct store *s, const char *project, const char *build, const char *commit,
                       const char *control_commit, char id_out[16]);
/* Whether any cell of the finished job JOB_ID started: false when every
 * one failed before its runner said anything (its interpreter missing, its
 * set-up failed). WHY gets the first failed cell's reason. */
int store_job_started(struct store *s, const char *job_id, bool *started, char *why, size_t wlen);

#endif
