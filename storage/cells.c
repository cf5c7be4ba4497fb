/*
 * storage/cells.c - the scheduler's side of cells (daemon loop only):
 * claiming the next queued cell with a new attempt, storing an attempt's
 * outcome, both in one transaction, and start-up recovery of the attempts
 * a stopped daemon left open.
 */
#include <errno.h>
#include <stdio.h>
#include <string.h>

#include "storage/options.h"
#include "storage/store_int.h"
#include "util/cellstate.h"
#include "util/clock.h"

void store_cell_run_clear(struct store_cell_run *r)
{
    json_decref(r->spec);
    json_decref(r->build);
    memset(r, 0, sizeof *r);
}

static int run_from_row(sqlite3_stmt *st, struct store_cell_run *r);

/* The first queued cell in claim order, read into R (spec and build
 * included); -ENOENT when there is none. Runs inside the caller's
 * transaction. */
static int claim_select(struct store *s, int64_t gpu_seq, struct store_cell_run *r)
{
    sqlite3_stmt *st = NULL;
    int rc = store_cached(
        s, SC_CELL_NEXT,
        "SELECT c.seq, c.job_seq, c.id, j.id, c.model, c.width, c.pass, "
        "j.options_json, b.python, b.env_json, b.model_roots, c.attempts, b.name, "
        "b.prefork, b.prefork_state, b.updated_at, j.commit_sha, c.mode, "
        "c.gpu_moved FROM cells c JOIN jobs j ON j.seq = c.job_seq "
        "LEFT JOIN builds b ON b.name = j.build "
        "WHERE c.state = 'queued' AND j.state IN ('queued','running') "
        "AND (coalesce(json_extract(j.options_json, '$.device'), '" CAPD_OPTION_DEFAULT_device
        "') <> 'gpu' "
        "OR c.seq = ?1) "
        "ORDER BY c.job_seq, c.ord LIMIT 1",
        &st);
    if (rc)
        return rc;
    sqlite3_bind_int64(st, 1, gpu_seq);
    if ((rc = store_step(s, st)) != 0) {
        sqlite3_reset(st);
        return rc;
    }
    r->attempt = sqlite3_column_int(st, 11) + 1;
    rc = run_from_row(st, r);
    r->gpu_moved = sqlite3_column_int(st, 18) != 0;
    sqlite3_reset(st);
    return rc;
}

/* The cell of row ST (the columns of claim_select) into R. */
static int run_from_row(sqlite3_stmt *st, struct store_cell_run *r)
{
    r->cell_seq = sqlite3_column_int64(st, 0);
    r->job_seq = sqlite3_column_int64(st, 1);
    snprintf(r->cell_id, sizeof r->cell_id, "%s", (const char *)sqlite3_column_text(st, 2));
    snprintf(r->job_id, sizeof r->job_id, "%s", (const char *)sqlite3_column_text(st, 3));
    r->spec = json_pack("{s:o,s:o,s:o,s:o,s:o}", "model", store_col_str(st, 4), "width",
                        store_col_str(st, 5), "pass", store_col_str(st, 6), "mode",
                        store_col_str(st, 17), "options", store_col_json(st, 7));
    r->build = json_pack("{s:o,s:o,s:o,s:o,s:b,s:o,s:I}", "name", store_col_str(st, 12), "python",
                         store_col_str(st, 8), "env", store_col_json(st, 9), "model_roots",
                         store_col_json(st, 10), "prefork", sqlite3_column_int(st, 13) != 0,
                         "prefork_state", store_col_str(st, 14), "rev",
                         (json_int_t)sqlite3_column_int64(st, 15));
    cell_options_read(json_object_get(r->spec, "options"), &r->opts);
    /* A template build runs as the job's commit's build. */
    return store_build_expand(r->build, (const char *)sqlite3_column_text(st, 16));
}

/* Marks the cell claim_select found running, opens its attempt and
 * recomputes its job's state. Runs inside the caller's transaction. */
static int claim_start(struct store *s, struct store_cell_run *r)
{
    int64_t now = util_wall_ms();
    int rc = store_run_cached(s, SC_CELL_START,
                              "UPDATE cells SET state='running', attempts=?2, started_at=?3, "
                              "finished_at=NULL, exit_code=NULL, signal=NULL, reason=NULL "
                              "WHERE seq=?1",
                              "IiI", r->cell_seq, r->attempt, now);
    if (rc)
        return rc;
    if ((rc = store_run_cached(s, SC_ATTEMPT_INSERT,
                               "INSERT INTO attempts(cell_seq, n, started_at) VALUES (?,?,?)",
                               "IiI", r->cell_seq, r->attempt, now)) != 0)
        return rc;
    r->attempt_id = sqlite3_last_insert_rowid(s->db);
    return store_job_refresh_state(s, r->job_seq);
}

int store_cell_claim_filtered(struct store *s, int64_t gpu_seq, struct store_cell_run *r)
{
    memset(r, 0, sizeof *r);
    int rc = store_begin_flushed(s);
    if (rc)
        return rc;
    if ((rc = claim_select(s, gpu_seq, r)) == 0)
        rc = claim_start(s, r);
    if ((rc = store_end(s, rc)) != 0)
        store_cell_run_clear(r);
    return rc;
}

/* Stores an attempt's outcome (store_cell_finish) without the job's state:
 * runs inside the caller's transaction. */
static int finish_cell(struct store *s, const struct store_cell_run *r,
                       const struct store_outcome *o)
{
    int rc;
    /* A requeued (interrupted) attempt is discarded, never made visible:
     * the next attempt will produce the records again. */
    if (o->requeue) {
        char sql[160];
        snprintf(sql, sizeof sql,
                 "DELETE FROM records WHERE attempt_id=%lld;"
                 "UPDATE attempts SET state='discarded' WHERE id=%lld;",
                 (long long)r->attempt_id, (long long)r->attempt_id);
        if ((rc = store_exec(s, sql)) != 0)
            return rc;
    } else {
        if ((rc = store_run_cached(s, SC_ATTEMPT_COMMIT,
                                   "UPDATE attempts SET state='committed', partial=? WHERE id=?",
                                   "iI", o->partial ? 1 : 0, r->attempt_id)) != 0)
            return rc;
    }
    /* The NULLs the outcome stands for: no exit code (-1), no finish time
     * while requeued, no memory limit (0) and then no CPU time unless
     * measured. */
    return store_run_cached(
        s, SC_CELL_FINISH,
        "UPDATE cells SET state=?2, exit_code=CASE WHEN ?3 >= 0 THEN ?3 END, signal=?4, "
        "reason=?5, effective_width=coalesce(?6, effective_width), duration_ms=?7, "
        "peak_rss_bytes=?8, finished_at=CASE WHEN ?10 THEN NULL ELSE ?9 END, "
        "committed_attempt=CASE WHEN ?10 THEN committed_attempt ELSE ?11 END, "
        "host_missing=?12, memory_limit_bytes=CASE WHEN ?13 > 0 THEN ?13 END, "
        "cpu_time_ms=CASE WHEN ?13 > 0 OR ?14 > 0 THEN ?14 END, "
        "gpu_alone=CASE WHEN ?15 THEN 1 ELSE gpu_alone END, "
        "gpu_moved=CASE WHEN ?16 THEN 1 ELSE gpu_moved END WHERE seq=?1",
        "ItitttIIIiItIIii", r->cell_seq, o->requeue ? cell_state_name(CELL_QUEUED) : o->state,
        o->exit_code, o->signal, o->reason, o->effective_width, o->duration_ms, o->peak_rss_bytes,
        util_wall_ms(), o->requeue ? 1 : 0, r->attempt_id, o->host_missing, o->memory_limit_bytes,
        o->cpu_time_ms, o->requeue && o->alone ? 1 : 0, o->requeue && o->moved ? 1 : 0);
}

int store_cell_finish(struct store *s, const struct store_cell_run *r,
                      const struct store_outcome *o)
{
    int rc = store_begin_flushed(s);
    if (rc)
        return rc;
    if ((rc = finish_cell(s, r, o)) == 0)
        rc = store_job_refresh_state(s, r->job_seq);
    return store_end(s, rc);
}

/*
 * One transaction where a finish and a claim would commit two: the
 * statements, triggers and events are those of store_cell_finish followed
 * by store_cell_claim_filtered, in that order. The one refresh left out is
 * the finished cell's job when the next cell is of the same job: that job
 * still has a queued cell, so its state stays running either way and the
 * claim's refresh sets updated_at again.
 */
int store_cell_finish_claim(struct store *s, const struct store_cell_run *r,
                            const struct store_outcome *o, int64_t gpu_seq,
                            struct store_cell_run *next)
{
    memset(next, 0, sizeof *next);
    int rc = store_begin_flushed(s);
    if (rc)
        return rc;
    if ((rc = finish_cell(s, r, o)) != 0)
        goto out;
    rc = claim_select(s, gpu_seq, next);
    if (rc && rc != -ENOENT)
        goto out;
    bool claimed = rc == 0;
    if (!claimed || next->job_seq != r->job_seq)
        if ((rc = store_job_refresh_state(s, r->job_seq)) != 0)
            goto out;
    if (claimed)
        rc = claim_start(s, next);
out:
    if ((rc = store_end(s, rc)) != 0)
        store_cell_run_clear(next);
    return rc;
}

/* A cell running an attempt that start-up recovery keeps open. */
#define KEPT_OPEN                                                                                  \
    "EXISTS (SELECT 1 FROM attempts a WHERE a.cell_seq = cells.seq AND a.state = 'open')"

int store_recover(struct store *s, int max_attempts, bool keep_remote, int *requeued,
                  int *interrupted)
{
    char sql[1600];
    int rc = store_begin(s);
    *requeued = *interrupted = 0;
    if (rc)
        return rc;
    int64_t now = util_wall_ms();
    /* Records of attempts that never finished are invisible (no cell names
     * them); deleting them here keeps a retried attempt from duplicating
     * anything. A remote attempt whose token is still good stays open when
     * KEEP_REMOTE: its worker may still run, and capd reads its whole spool
     * again (store_remote_reattach). */
    snprintf(sql, sizeof sql,
             "DELETE FROM records WHERE attempt_id IN (SELECT id FROM attempts WHERE "
             "state='open');"
             "UPDATE attempts SET state='discarded' WHERE state='open' AND (%d = 0 OR id NOT IN "
             "(SELECT t.attempt_id FROM attempt_tokens t JOIN attempts a ON a.id = t.attempt_id "
             "JOIN cells c ON c.seq = a.cell_seq JOIN jobs j ON j.seq = c.job_seq "
             "WHERE t.expires_at > %lld AND j.state IN ('queued','running')));",
             keep_remote ? 1 : 0, (long long)now);
    if ((rc = store_exec(s, sql)) != 0)
        goto out;
    snprintf(sql, sizeof sql,
             "UPDATE cells SET state='interrupted', finished_at=%lld, "
             "reason='daemon stopped while the cell ran; attempts exhausted' "
             "WHERE state='running' AND attempts >= %d AND NOT " KEPT_OPEN,
             (long long)now, max_attempts);
    if ((rc = store_exec(s, sql)) != 0)
        goto out;
    *interrupted = sqlite3_changes(s->db);
    snprintf(sql, sizeof sql,
             "UPDATE cells SET state='queued', reason='interrupted: daemon stopped while the "
             "cell ran; re-queued' WHERE state='running' AND NOT " KEPT_OPEN);
    if ((rc = store_exec(s, sql)) != 0)
        goto out;
    *requeued = sqlite3_changes(s->db);
    snprintf(sql, sizeof sql,
             "UPDATE jobs SET state = CASE WHEN EXISTS (SELECT 1 FROM cells c WHERE "
             "c.job_seq = jobs.seq AND c.state='queued') THEN 'running' ELSE 'done' END, "
             "updated_at=%lld, finished_at=coalesce(finished_at, %lld) WHERE state='running' "
             "AND NOT EXISTS (SELECT 1 FROM cells c WHERE c.job_seq = jobs.seq AND "
             "c.state='running')",
             (long long)now, (long long)now);
    rc = store_exec(s, sql);
out:
    return store_end(s, rc);
}

int store_remote_reattach(struct store *s, store_reattach_fn fn, void *ctx)
{
    sqlite3_stmt *st = NULL;
    int rc = store_query(s, &st,
                         "SELECT c.seq, c.job_seq, c.id, j.id, c.model, c.width, c.pass, "
                         "j.options_json, b.python, b.env_json, b.model_roots, c.attempts, b.name, "
                         "b.prefork, b.prefork_state, b.updated_at, j.commit_sha, c.mode, a.id, "
                         "a.n, t.slurm_job, coalesce(t.slurm_task, -1) FROM attempts a JOIN "
                         "attempt_tokens t ON t.attempt_id = a.id "
                         "JOIN cells c ON c.seq = a.cell_seq JOIN jobs j ON j.seq = c.job_seq "
                         "LEFT JOIN builds b ON b.name = j.build "
                         "WHERE a.state = 'open' AND c.state = 'running' AND c.attempts = a.n "
                         "AND j.state IN ('queued','running') "
                         "ORDER BY a.id",
                         "");
    while (rc == 0 && (rc = store_step(s, st)) == 0) {
        struct store_cell_run r;
        memset(&r, 0, sizeof r);
        if ((rc = run_from_row(st, &r)) != 0) {
            store_cell_run_clear(&r);
            break;
        }
        r.attempt_id = sqlite3_column_int64(st, 18);
        r.attempt = sqlite3_column_int(st, 19);
        struct store_slurm_job sj = {(uint32_t)sqlite3_column_int64(st, 20),
                                     (int32_t)sqlite3_column_int64(st, 21)};
        rc = fn(ctx, &r, sj);
    }
    sqlite3_finalize(st);
    return rc == -ENOENT ? 0 : rc;
}
