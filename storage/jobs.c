/*
 * storage/jobs.c - jobs with their cells as the API shows them: creation
 * (idempotency and queue quotas included), reads, lists, cancellation and
 * the job state recomputed from its cells; then branches and the jobs of a
 * commit.
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "storage/options.h"
#include "storage/store_int.h"
#include "util/clock.h"

#define JOB_COLS                                                                                   \
    "j.seq, j.id, j.project, j.commit_sha, j.branch, j.build, j.control_commit, j.state, "         \
    "j.request_json, j.options_json, j.labels_json, j.created_at, j.updated_at, j.finished_at, "   \
    "j.provenance_json"

static json_t *job_row(sqlite3_stmt *st)
{
    json_t *req = store_col_json(st, 8);
    json_t *j = json_pack("{s:o,s:o,s:o,s:o,s:o,s:o,s:o,s:O,s:o,s:o,s:o,s:o,s:o}", "id",
                          store_col_str(st, 1), "project", store_col_str(st, 2), "commit",
                          store_col_str(st, 3), "branch", store_col_str(st, 4), "build",
                          store_col_str(st, 5), "control_commit", store_col_str(st, 6), "state",
                          store_col_str(st, 7), "matrix", json_object_get(req, "matrix"), "options",
                          store_col_json(st, 9), "labels", store_col_json(st, 10), "created_at",
                          store_col_time(st, 11), "updated_at", store_col_time(st, 12),
                          "finished_at", store_col_time(st, 13));
    json_t *prov = store_col_json(st, 14);
    if (!json_is_null(prov))
        json_object_set(j, "provenance", prov);
    json_decref(prov);
    json_decref(req);
    return j;
}

json_t *store_cell_row(sqlite3_stmt *st, int c0)
{
    return json_pack("{s:o,s:o,s:o,s:o,s:o,s:o,s:o,s:o,s:o,s:o,s:o,s:o,s:o,s:o,s:o,s:o,s:o,s:o}",
                     "id", store_col_str(st, c0 + 0), "model", store_col_str(st, c0 + 1), "width",
                     store_col_str(st, c0 + 2), "pass", store_col_str(st, c0 + 3), "state",
                     store_col_str(st, c0 + 4), "attempts", store_col_int(st, c0 + 5), "exit_code",
                     store_col_int(st, c0 + 6), "signal", store_col_str(st, c0 + 7), "reason",
                     store_col_str(st, c0 + 8), "effective_width", store_col_str(st, c0 + 9),
                     "duration_ms", store_col_int(st, c0 + 10), "peak_rss_bytes",
                     store_col_int(st, c0 + 11), "started_at", store_col_time(st, c0 + 12),
                     "finished_at", store_col_time(st, c0 + 13), "host_missing",
                     store_col_str(st, c0 + 15), "memory_limit_bytes", store_col_int(st, c0 + 16),
                     "cpu_time_ms", store_col_int(st, c0 + 17), "mode", store_col_str(st, c0 + 18));
}

/* Adds "cells" and "counts" (cells per state) to a job object. */
static int job_add_cells(struct store *s, int64_t job_seq, json_t *job)
{
    sqlite3_stmt *st = NULL;
    json_t *cells = json_array(), *counts = json_object();
    int rc = store_prepare(
        s, "SELECT " CELL_COLS " FROM cells c WHERE c.job_seq = ? ORDER BY c.ord", &st);
    if (rc)
        goto out;
    sqlite3_bind_int64(st, 1, job_seq);
    int src;
    while ((src = sqlite3_step(st)) == SQLITE_ROW) {
        json_t *c = store_cell_row(st, 0);
        const char *state = json_string_value(json_object_get(c, "state"));
        json_object_set_new(counts, state,
                            json_integer(json_integer_value(json_object_get(counts, state)) + 1));
        json_array_append_new(cells, c);
    }
    rc = store_rc(s, src);
    json_object_set(job, "cells", cells);
    json_object_set(job, "counts", counts);
out:
    json_decref(cells);
    json_decref(counts);
    sqlite3_finalize(st);
    return rc;
}

static int job_get_by(struct store *s, const char *where, const char *arg, int64_t iarg,
                      json_t **out)
{
    sqlite3_stmt *st = NULL;
    char sql[512];
    snprintf(sql, sizeof sql, "SELECT " JOB_COLS " FROM jobs j WHERE %s", where);
    int rc = arg ? store_query(s, &st, sql, "t", arg) : store_query(s, &st, sql, "I", iarg);
    if (rc || (rc = store_step(s, st)) != 0)
        goto out;
    json_t *job = job_row(st);
    if ((rc = job_add_cells(s, sqlite3_column_int64(st, 0), job)) != 0) {
        json_decref(job);
        goto out;
    }
    *out = job;
out:
    sqlite3_finalize(st);
    return rc;
}

int store_job_get(struct store *s, const char *id, json_t **out)
{
    return job_get_by(s, "j.id = ?", id, 0, out);
}

static int insert_cells(struct store *s, int64_t job_seq, json_t *matrix)
{
    sqlite3_stmt *st = NULL;
    int rc = store_prepare(s,
                           "INSERT INTO cells(id, job_seq, ord, model, width, pass, mode) "
                           "VALUES (?,?,?,?,?,?,?)",
                           &st);
    if (rc)
        return rc;
    size_t im, iw, ip, ix;
    json_t *m, *w, *p, *x, *eager = json_pack("[s]", "eager");
    json_t *modes =
        json_is_array(json_object_get(matrix, "modes")) ? json_object_get(matrix, "modes") : eager;
    int ord = 0;
    /* Order matters: cells run in this order, so all widths, passes and
     * modes of a model run together and a broken model shows up early. */
    json_array_foreach(json_object_get(matrix, "models"), im, m)
    {
        json_array_foreach(json_object_get(matrix, "widths"), iw, w)
        {
            json_array_foreach(json_object_get(matrix, "passes"), ip, p)
            {
                json_array_foreach(modes, ix, x)
                {
                    char id[16];
                    store_new_id('c', id);
                    sqlite3_reset(st);
                    store_bind_text(st, 1, id);
                    sqlite3_bind_int64(st, 2, job_seq);
                    sqlite3_bind_int(st, 3, ord++);
                    store_bind_text(st, 4, json_string_value(m));
                    store_bind_text(st, 5, json_string_value(w));
                    store_bind_text(st, 6, json_string_value(p));
                    store_bind_text(st, 7, json_string_value(x));
                    if ((rc = store_rc(s, sqlite3_step(st))) != 0)
                        goto out;
                }
            }
        }
    }
out:
    json_decref(eager);
    sqlite3_finalize(st);
    return rc;
}

/* Queued+running jobs, all of them or only TOKEN_ID's. */
static int count_queued_jobs(struct store *s, const char *token_id, int64_t *n)
{
    sqlite3_stmt *st = NULL;
    int rc = store_query(s, &st,
                         "SELECT count(*) FROM jobs WHERE state IN ('queued','running') AND "
                         "(?1 IS NULL OR token_id = ?1)",
                         "t", token_id);
    if (rc == 0 && sqlite3_step(st) == SQLITE_ROW)
        *n = sqlite3_column_int64(st, 0);
    sqlite3_finalize(st);
    return rc;
}

/* The job an earlier request with idempotency key N->idem_key created:
 * 0 with its id, and *same when it came with the same body; -ENOENT when
 * the key names no job. Runs inside the caller's transaction. */
static int job_idem_find(struct store *s, const struct store_job_new *n, char id_out[16],
                         bool *same)
{
    sqlite3_stmt *st = NULL;
    int rc =
        store_query(s, &st, "SELECT id, idem_hash FROM jobs WHERE idem_key = ?", "t", n->idem_key);
    if (rc)
        return rc;
    rc = -ENOENT;
    if (sqlite3_step(st) == SQLITE_ROW) {
        snprintf(id_out, 16, "%s", (const char *)sqlite3_column_text(st, 0));
        const char *h = (const char *)sqlite3_column_text(st, 1);
        *same = h && n->body_hash && strcmp(h, n->body_hash) == 0;
        rc = 0;
    }
    sqlite3_finalize(st);
    return rc;
}

/* -EAGAIN past max_queued_jobs, -EDQUOT past the token's
 * max_queued_per_token. Counted in the same IMMEDIATE transaction as the
 * insert, so two concurrent posts of one token cannot both pass the check. */
static int job_check_quotas(struct store *s, const struct store_job_new *n)
{
    int64_t q = 0;
    int rc;
    if (n->max_queued_jobs > 0) {
        if ((rc = count_queued_jobs(s, NULL, &q)) != 0)
            return rc;
        if (q >= n->max_queued_jobs)
            return -EAGAIN;
    }
    if (n->token_id && n->max_queued_per_token > 0) {
        q = 0;
        if ((rc = count_queued_jobs(s, n->token_id, &q)) != 0)
            return rc;
        if (q >= n->max_queued_per_token)
            return -EDQUOT;
    }
    return 0;
}

/* Inserts the jobs row of request N as job ID; *seq_out gets its seq.
 * Runs inside the caller's transaction. */
static int job_insert(struct store *s, const struct store_job_new *n, const char *id,
                      int64_t *seq_out)
{
    json_t *req = n->request;
    json_t *prov = json_object_get(req, "provenance");
    char *req_s = json_dumps(req, JSON_COMPACT);
    char *opt_s = json_dumps(json_object_get(req, "options"), JSON_COMPACT);
    char *lab_s = json_dumps(json_object_get(req, "labels"), JSON_COMPACT);
    char *prov_s = prov ? json_dumps(prov, JSON_COMPACT) : NULL;
    int64_t now = util_wall_ms();
    int rc = store_run(s,
                       "INSERT INTO jobs(id, project, commit_sha, branch, build, "
                       "control_commit, request_json, options_json, labels_json, "
                       "provenance_json, idem_key, idem_hash, created_at, updated_at, "
                       "token_id) VALUES (?,?,?,?,?,?,?,?,?,?,?,?,?,?,?)",
                       "ttttttttttttIIt", id, json_string_value(json_object_get(req, "project")),
                       json_string_value(json_object_get(req, "commit")),
                       json_string_value(json_object_get(req, "branch")),
                       json_string_value(json_object_get(req, "build")),
                       json_string_value(json_object_get(req, "control_commit")), req_s,
                       opt_s ? opt_s : "{}", lab_s ? lab_s : "{}", prov_s, n->idem_key,
                       n->body_hash, now, now, n->token_id);
    if (rc == 0)
        *seq_out = sqlite3_last_insert_rowid(s->db);
    free(req_s);
    free(opt_s);
    free(lab_s);
    free(prov_s);
    return rc;
}

/* An idempotent retry returns the earlier job (-EEXIST when its body
 * differs); otherwise the quotas are checked and the job and its cells are
 * inserted, all in one IMMEDIATE transaction. */
int store_job_create(struct store *s, const struct store_job_new *n, json_t **out, bool *existed)
{
    char id[16];
    int64_t seq = 0;
    int rc = store_begin(s);
    *existed = false;
    *out = NULL;
    if (rc)
        return rc;
    if (n->idem_key) {
        bool same = false;
        rc = job_idem_find(s, n, id, &same);
        if (rc == 0) {
            store_rollback(s);
            if (!same)
                return -EEXIST;
            *existed = true;
            return store_job_get(s, id, out);
        }
        if (rc != -ENOENT)
            goto out;
    }
    if ((rc = job_check_quotas(s, n)) != 0)
        goto out;
    store_new_id('j', id);
    if ((rc = job_insert(s, n, id, &seq)) == 0)
        rc = insert_cells(s, seq, json_object_get(n->request, "matrix"));
    /* Read back inside the transaction: the answer is the job as created,
     * not whatever the scheduler (woken by anything) made of it since. */
    if (rc == 0)
        rc = store_job_get(s, id, out);
out:
    if ((rc = store_end(s, rc)) != 0) {
        json_decref(*out);
        *out = NULL;
    }
    return rc;
}

/* A job of the list: its row and its cell counts, without the cells. */
static int job_list_row(struct store *s, sqlite3_stmt *st, json_t **item, int64_t *cursor)
{
    json_t *job = job_row(st);
    int rc;

    *cursor = sqlite3_column_int64(st, 0);
    if ((rc = job_add_cells(s, *cursor, job)) != 0) {
        json_decref(job);
        return rc;
    }
    json_object_del(job, "cells");
    *item = job;
    return 0;
}

int store_job_list(struct store *s, const struct store_job_filter *f, json_t **out)
{
    sqlite3_stmt *st = NULL;
    char sql[1024];
    int rc;
    /* Keyset pagination on the internal sequence: stable under inserts,
     * unlike OFFSET. NULL filters match everything. */
    snprintf(sql, sizeof sql,
             "SELECT " JOB_COLS " FROM jobs j WHERE (?1 IS NULL OR j.commit_sha = ?1) AND "
             "(?2 IS NULL OR j.branch = ?2) AND (?3 IS NULL OR j.build = ?3) AND "
             "(?4 IS NULL OR j.state = ?4) AND (?5 IS NULL OR j.project = ?5) AND "
             "(?6 = 0 OR j.seq < ?6) ORDER BY j.seq DESC LIMIT ?7");
    if ((rc = store_query(s, &st, sql, "tttttIi", f->commit, f->branch, f->build, f->state,
                          f->project, f->before_seq, f->limit + 1)) == 0)
        rc = store_page(s, st, f->limit, job_list_row, "jobs", 's', out);
    sqlite3_finalize(st);
    return rc;
}

/* Recomputes a job's state from its cells: running while any cell runs or
 * waits, done when none does, cancelled stays cancelled. */
int store_job_refresh_state(struct store *s, int64_t job_seq)
{
    static const char sql[] =
        "UPDATE jobs SET state = CASE "
        " WHEN state = 'cancelled' THEN 'cancelled'"
        " WHEN EXISTS (SELECT 1 FROM cells WHERE job_seq = ?1 AND state = 'running') THEN 'running'"
        " WHEN EXISTS (SELECT 1 FROM cells WHERE job_seq = ?1 AND state = 'queued') THEN"
        "   CASE WHEN EXISTS (SELECT 1 FROM cells WHERE job_seq = ?1 AND state <> 'queued')"
        "   THEN 'running' ELSE 'queued' END"
        " ELSE 'done' END,"
        " updated_at = ?2,"
        " finished_at = CASE WHEN finished_at IS NULL AND NOT EXISTS (SELECT 1 FROM cells WHERE"
        "   job_seq = ?1 AND state IN ('queued','running')) THEN ?2 ELSE finished_at END"
        " WHERE seq = ?1";
    return store_run_cached(s, SC_JOB_REFRESH, sql, "II", job_seq, util_wall_ms());
}

int store_job_cancel(struct store *s, const char *id)
{
    sqlite3_stmt *st = NULL;
    int rc = store_begin(s);
    if (rc)
        return rc;
    if ((rc = store_query(s, &st, "SELECT seq, state FROM jobs WHERE id = ?", "t", id)) != 0)
        goto out;
    if (sqlite3_step(st) != SQLITE_ROW) {
        rc = -ENOENT;
        goto out;
    }
    int64_t seq = sqlite3_column_int64(st, 0);
    const char *state = (const char *)sqlite3_column_text(st, 1);
    if (strcmp(state, "done") == 0 || strcmp(state, "cancelled") == 0) {
        rc = -EALREADY;
        goto out;
    }
    sqlite3_finalize(st);
    st = NULL;
    char sql[256];
    int64_t now = util_wall_ms();
    snprintf(sql, sizeof sql,
             "UPDATE cells SET state='cancelled', reason='job cancelled', finished_at=%lld "
             "WHERE job_seq=%lld AND state='queued';"
             "UPDATE jobs SET state='cancelled', updated_at=%lld WHERE seq=%lld;",
             (long long)now, (long long)seq, (long long)now, (long long)seq);
    /* Sets finished_at when no cell of the job is left running. */
    if ((rc = store_exec(s, sql)) == 0)
        rc = store_job_refresh_state(s, seq);
out:
    sqlite3_finalize(st);
    return store_end(s, rc);
}

/* ---- branches and commits ---- */

int store_branch_put(struct store *s, const char *name, const char *control, json_t **out)
{
    int rc = store_run(s,
                       "INSERT INTO branches(name, control_commit, updated_at) VALUES (?,?,?) "
                       "ON CONFLICT(name) DO UPDATE SET control_commit=excluded.control_commit,"
                       " updated_at=excluded.updated_at",
                       "ttI", name, control, util_wall_ms());
    return rc ? rc : store_branch_get(s, name, out);
}

static json_t *branch_row(sqlite3_stmt *st)
{
    return json_pack("{s:o,s:o,s:o}", "name", store_col_str(st, 0), "control_commit",
                     store_col_str(st, 1), "updated_at", store_col_time(st, 2));
}

int store_branch_get(struct store *s, const char *name, json_t **out)
{
    return store_get_row(s, "SELECT name, control_commit, updated_at FROM branches WHERE name=?",
                         branch_row, out, "t", name);
}

/* "+state": the unary plus keeps SQLite off the jobs_state index, which
 * walks every finished job newest first until the commit matches (12.6 ms
 * at 10,000 jobs, growing with the table); jobs_commit finds the commit's
 * few jobs directly (0.01 ms). bench/bench_compare_scale.py found it. */
/* A follow-up job (labels.replay_of: a replay's, api/api_replay.c, or a
 * compiler bisection's, daemon/replay/compiler.h) stands for no commit. */
#define NOT_REPLAY " AND json_extract(labels_json, '$.replay_of') IS NULL"

const char store_sql_job_for_commit_done[] =
    "SELECT id FROM jobs WHERE commit_sha = ? AND +state = 'done'" NOT_REPLAY
    " ORDER BY seq DESC LIMIT 1";

int store_job_for_commit(struct store *s, const char *commit, bool finished_only, char id_out[16])
{
    sqlite3_stmt *st = NULL;
    int rc = store_prepare(s,
                           finished_only ? store_sql_job_for_commit_done
                                         : "SELECT id FROM jobs WHERE commit_sha = ?" NOT_REPLAY
                                           " ORDER BY seq DESC LIMIT 1",
                           &st);
    if (!rc)
        store_bind_text(st, 1, commit);
    return store_first_id(s, st, rc, id_out);
}

int store_job_replay(struct store *s, const char *of, const char *side, char id_out[16])
{
    sqlite3_stmt *st = NULL;
    int rc = store_query(s, &st,
                         "SELECT id FROM jobs WHERE json_extract(labels_json, '$.replay_of') = ?1 "
                         "AND json_extract(labels_json, '$.replay_side') = ?2 "
                         "ORDER BY seq DESC LIMIT 1",
                         "tt", of, side);
    return store_first_id(s, st, rc, id_out);
}

/* The ids the query SQL selects (its first column), into the array *IDS. */
static int ids_of(struct store *s, const char *sql, json_t **ids)
{
    sqlite3_stmt *st = NULL;
    int rc = store_query(s, &st, sql, "");
    *ids = rc ? NULL : json_array();
    while (!rc && sqlite3_step(st) == SQLITE_ROW)
        json_array_append_new(*ids, json_string((const char *)sqlite3_column_text(st, 0)));
    sqlite3_finalize(st);
    return rc;
}

/* The partial indexes of schema/012_replay.sql and 013_replay_modules.sql
 * serve these queries: their WHEREs repeat the indexes'. */
int store_replays_pending(struct store *s, json_t **ids)
{
    return ids_of(s,
                  "SELECT id FROM jobs WHERE json_extract(labels_json, '$.replay_side') = "
                  "'control' AND json_extract(labels_json, '$.replay_isolated') IS NULL "
                  "AND state IN ('done', 'cancelled') ORDER BY seq LIMIT 16",
                  ids);
}

int store_replays_auto_pending(struct store *s, json_t **ids)
{
    return ids_of(s,
                  "SELECT id FROM jobs WHERE json_extract(labels_json, '$.replay_auto') IS NULL "
                  "AND json_extract(labels_json, '$.replay_of') IS NULL AND "
                  "coalesce(json_extract(options_json, '$.replay'), '" CAPD_OPTION_DEFAULT_replay
                  "') != 'off' AND "
                  "state = 'done' "
                  "ORDER BY seq LIMIT 64",
                  ids);
}

int store_compiler_bisect_pending(struct store *s, json_t **ids)
{
    return ids_of(s,
                  "SELECT id FROM jobs WHERE json_extract(labels_json, '$.compiler_bisect_auto') "
                  "IS NULL AND json_extract(options_json, '$.compiler_bisect') = 'auto' AND "
                  "state = 'done' ORDER BY seq LIMIT 64",
                  ids);
}

int store_job_compiler_bisect(struct store *s, const char *of, char id_out[16])
{
    sqlite3_stmt *st = NULL;
    int rc = store_query(s, &st,
                         "SELECT id FROM jobs WHERE json_extract(labels_json, "
                         "'$.compiler_bisect_of') = ?1 ORDER BY seq DESC LIMIT 1",
                         "t", of);
    return store_first_id(s, st, rc, id_out);
}

int store_job_label(struct store *s, const char *id, const char *key, const char *value)
{
    char path[80];
    if ((size_t)snprintf(path, sizeof path, "$.%s", key) >= sizeof path)
        return -ENAMETOOLONG;
    return store_run(s, "UPDATE jobs SET labels_json = json_set(labels_json, ?2, ?3) WHERE id = ?1",
                     "ttt", id, path, value);
}

int store_job_request(struct store *s, const char *id, json_t **out)
{
    sqlite3_stmt *st = NULL;
    int rc = store_query(s, &st, "SELECT request_json FROM jobs WHERE id = ?", "t", id);
    *out = NULL;
    if (!rc && (rc = store_step(s, st)) == 0)
        *out = store_col_json(st, 0);
    sqlite3_finalize(st);
    return rc ? rc : *out ? 0 : -EIO;
}

int store_first_id(struct store *s, sqlite3_stmt *st, int rc, char out[16])
{
    if (rc == 0 && (rc = store_step(s, st)) == 0)
        snprintf(out, 16, "%s", (const char *)sqlite3_column_text(st, 0));
    sqlite3_finalize(st);
    return rc;
}

int store_commit_jobs(struct store *s, const char *commit, json_t **out)
{
    struct store_job_filter f = {.commit = commit, .limit = 200};
    return store_job_list(s, &f, out);
}
