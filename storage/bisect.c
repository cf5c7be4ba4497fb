/*
 * storage/bisect.c - bisections and their probes (schema/008_bisect.sql):
 * creating, reading, listing and cancelling them for the API, and the
 * small writes the daemon loop makes as it advances one (daemon/bisect.c).
 * Every write is its own IMMEDIATE transaction, so the event stream hears
 * of it (the triggers write the events) as soon as it commits.
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "storage/store_int.h"
#include "util/clock.h"

/* Steps ST, prepared and bound (RC its store_query's result), in an
 * IMMEDIATE transaction of its own and finalizes it; *CHANGES, when
 * asked, is how many rows it changed. */
static int write1(struct store *s, sqlite3_stmt *st, int rc, int *changes)
{
    if (rc == 0 && (rc = store_begin(s)) == 0) {
        rc = store_rc(s, sqlite3_step(st));
        if (changes)
            *changes = sqlite3_changes(s->db);
        sqlite3_finalize(st);
        return store_end(s, rc);
    }
    sqlite3_finalize(st);
    return rc;
}

int store_bisect_create(struct store *s, const struct store_bisect_new *n, json_t **out)
{
    char id[16];
    store_new_id('b', id);
    char *commits = json_dumps(n->commits, JSON_COMPACT);
    char *job = json_dumps(n->job, JSON_COMPACT | JSON_SORT_KEYS);
    sqlite3_stmt *st = NULL;
    int changes = 0, rc = -ENOMEM;
    if (commits && job) {
        rc = store_query(s, &st,
                         "INSERT INTO bisections(id, project, build, branch, predicate, threshold, "
                         "commits_json, job_json, token_id, created_at, updated_at) "
                         "SELECT ?1,?2,?3,?4,?5,?11,?6,?7,?8,?9,?9 WHERE (SELECT count(*) FROM "
                         "bisections WHERE state = 'running') < ?10",
                         "ttttttttIi", id, n->project, n->build, n->branch, n->predicate, commits,
                         job, n->token_id, util_wall_ms(), STORE_BISECT_MAX_RUNNING);
        if (rc == 0)
            sqlite3_bind_double(st, 11, n->threshold);
        rc = write1(s, st, rc, &changes);
    }
    free(commits);
    free(job);
    if (rc == 0 && changes == 0)
        rc = -EAGAIN;
    if (rc == 0)
        rc = store_bisect_get(s, id, out);
    return rc;
}

static json_t *probe_row(sqlite3_stmt *st)
{
    json_t *p = json_pack("{s:I,s:o,s:I,s:o,s:b,s:o,s:o,s:o,s:o}", "index",
                          (json_int_t)sqlite3_column_int64(st, 0), "commit", store_col_str(st, 1),
                          "round", (json_int_t)sqlite3_column_int64(st, 2), "job",
                          store_col_str(st, 3), "reused", sqlite3_column_int(st, 4) != 0, "state",
                          store_col_str(st, 5), "skipped_reason", json_null(), "verdict",
                          store_col_json(st, 7), "updated_at", store_col_time(st, 8));
    if (p && sqlite3_column_type(st, 6) != SQLITE_NULL)
        json_object_set_new(p,
                            strcmp((const char *)sqlite3_column_text(st, 5), "skipped") == 0
                                ? "skipped_reason"
                                : "reason",
                            store_col_str(st, 6));
    return p;
}

static int probe_add(sqlite3_stmt *st, void *arr)
{
    json_array_append_new(arr, probe_row(st));
    return 0;
}

/* The probes of bisection SEQ, in commit order, into B's "probes". */
static int add_probes(struct store *s, int64_t seq, json_t *b)
{
    json_t *arr = json_array();
    int rc = store_each(s,
                        "SELECT idx, commit_sha, round, job_id, reused, state, reason, "
                        "verdict_json, updated_at FROM bisect_probes WHERE bisect_seq = ? "
                        "ORDER BY idx",
                        probe_add, arr, "I", seq);
    if (rc == 0)
        json_object_set(b, "probes", arr);
    json_decref(arr);
    return rc;
}

#define BISECT_COLS                                                                                \
    "seq, id, project, build, branch, predicate, threshold, commits_json, job_json, state, "       \
    "round, reason, result_json, created_at, updated_at, finished_at"

/* One bisection row; FULL adds the commits, the job and the result. */
static json_t *bisect_row(sqlite3_stmt *st, bool full)
{
    json_t *commits = store_col_json(st, 7);
    json_t *b = json_pack("{s:o,s:o,s:o,s:o,s:o,s:f,s:o,s:I,s:I,s:o,s:o,s:o,s:o}", "id",
                          store_col_str(st, 1), "project", store_col_str(st, 2), "build",
                          store_col_str(st, 3), "branch", store_col_str(st, 4), "predicate",
                          store_col_str(st, 5), "threshold", sqlite3_column_double(st, 6), "state",
                          store_col_str(st, 9), "round", (json_int_t)sqlite3_column_int64(st, 10),
                          "commit_count", (json_int_t)json_array_size(commits), "reason",
                          store_col_str(st, 11), "created_at", store_col_time(st, 13), "updated_at",
                          store_col_time(st, 14), "finished_at", store_col_time(st, 15));
    if (b) {
        json_object_set(b, "good", json_array_get(commits, 0));
        json_object_set(b, "bad", json_array_get(commits, json_array_size(commits) - 1));
    }
    if (b && full) {
        json_t *job = store_col_json(st, 8);
        json_object_set(b, "commits", commits);
        json_object_set(b, "matrix", json_object_get(job, "matrix"));
        json_object_set(b, "options", json_object_get(job, "options"));
        json_object_set_new(b, "job", job);
        json_object_set_new(b, "result", store_col_json(st, 12));
    }
    json_decref(commits);
    return b;
}

int store_bisect_get(struct store *s, const char *id, json_t **out)
{
    sqlite3_stmt *st = NULL;
    json_t *b = NULL;
    int rc = store_query(s, &st, "SELECT " BISECT_COLS " FROM bisections WHERE id = ?", "t", id);
    if (rc == 0 && (rc = store_step(s, st)) == 0) {
        b = bisect_row(st, true);
        rc = b ? add_probes(s, sqlite3_column_int64(st, 0), b) : -ENOMEM;
    }
    if (rc == 0) {
        *out = b;
        b = NULL;
    }
    json_decref(b);
    sqlite3_finalize(st);
    return rc;
}

static int brief_add(sqlite3_stmt *st, void *arr)
{
    json_array_append_new(arr, bisect_row(st, false));
    return 0;
}

int store_bisect_list(struct store *s, const char *state, int limit, json_t **out)
{
    json_t *arr = json_array();
    int rc = store_each(s,
                        "SELECT " BISECT_COLS " FROM bisections WHERE ?1 IS NULL OR state = ?1 "
                        "ORDER BY seq DESC LIMIT ?2",
                        brief_add, arr, "ti", state, limit);
    if (rc == 0)
        *out = json_pack("{s:O}", "bisections", arr);
    json_decref(arr);
    return rc;
}

struct ids {
    char (*v)[16];
    int max, n;
};

/* 1 once V is full, which ends the rows. */
static int id_add(sqlite3_stmt *st, void *ctx)
{
    struct ids *ids = ctx;
    if (ids->n == ids->max)
        return 1;
    snprintf(ids->v[ids->n++], 16, "%s", (const char *)sqlite3_column_text(st, 0));
    return 0;
}

int store_bisect_running(struct store *s, char (*ids)[16], int max, int *n)
{
    struct ids r = {ids, max, 0};
    int rc = store_each(s, "SELECT id FROM bisections WHERE state = 'running' ORDER BY seq", id_add,
                        &r, "");
    *n = r.n;
    return rc == 1 ? 0 : rc;
}

int store_bisect_probe_put(struct store *s, const struct store_bisect_probe *p)
{
    sqlite3_stmt *st = NULL;
    int rc =
        store_query(s, &st,
                    "INSERT INTO bisect_probes(bisect_seq, idx, commit_sha, round, job_id, reused, "
                    "state, reason, verdict_json, updated_at) "
                    "SELECT seq, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10 FROM bisections WHERE id = ?1 "
                    "ON CONFLICT(bisect_seq, idx) DO UPDATE SET job_id = excluded.job_id, "
                    "reused = excluded.reused, state = excluded.state, reason = excluded.reason, "
                    "verdict_json = excluded.verdict_json, updated_at = excluded.updated_at",
                    "titititttI", p->bisect_id, p->index, p->commit, p->round,
                    p->job_id && p->job_id[0] ? p->job_id : NULL, (int)p->reused, p->state,
                    p->reason, p->verdict, util_wall_ms());
    return write1(s, st, rc, NULL);
}

int store_bisect_set(struct store *s, const char *id, const char *state, int round,
                     const char *reason, json_t *result)
{
    char *res = result ? json_dumps(result, JSON_COMPACT | JSON_SORT_KEYS) : NULL;
    if (result && !res)
        return -ENOMEM;
    sqlite3_stmt *st = NULL;
    int rc = store_query(s, &st,
                         "UPDATE bisections SET state = ?2, round = ?3, reason = coalesce(?4, "
                         "reason), result_json = coalesce(?5, result_json), updated_at = ?6, "
                         "finished_at = CASE WHEN ?2 = 'running' THEN NULL ELSE ?6 END "
                         "WHERE id = ?1 AND state = 'running'",
                         "ttittI", id, state, round, reason, res, util_wall_ms());
    rc = write1(s, st, rc, NULL);
    free(res);
    return rc;
}

int store_bisect_cancel(struct store *s, const char *id, json_t **jobs_out)
{
    json_t *b = NULL;
    int changes = 0;
    int rc = store_bisect_get(s, id, &b);
    if (rc)
        return rc;
    if (strcmp(json_string_value(json_object_get(b, "state")), "running") != 0) {
        json_decref(b);
        return -EALREADY;
    }
    sqlite3_stmt *st = NULL;
    rc = store_query(s, &st,
                     "UPDATE bisections SET state = 'cancelled', reason = 'cancelled', "
                     "updated_at = ?2, finished_at = ?2 WHERE id = ?1 AND state = 'running'",
                     "tI", id, util_wall_ms());
    rc = write1(s, st, rc, &changes);
    if (rc == 0 && changes == 0)
        rc = -EALREADY;
    json_t *jobs = json_array();
    size_t i;
    json_t *p;
    /* The jobs it submitted itself and that are still running go with it;
     * reused ones belong to someone else. */
    json_array_foreach(rc == 0 ? json_object_get(b, "probes") : NULL, i, p)
    {
        const char *job = json_string_value(json_object_get(p, "job"));
        if (job && !json_is_true(json_object_get(p, "reused")) &&
            strcmp(json_string_value(json_object_get(p, "state")), "running") == 0 &&
            store_job_cancel(s, job) == 0)
            json_array_append_new(jobs, json_string(job));
    }
    json_decref(b);
    if (rc == 0 && jobs_out)
        *jobs_out = json_incref(jobs);
    json_decref(jobs);
    return rc;
}

int store_job_reusable(struct store *s, const char *project, const char *build, const char *commit,
                       const char *control_commit, char id_out[16])
{
    sqlite3_stmt *st = NULL;
    int rc = store_query(s, &st,
                         "SELECT id FROM jobs WHERE commit_sha = ?1 AND project = ?2 AND "
                         "build = ?3 AND state = 'done' AND (?4 IS NULL OR control_commit = ?4) "
                         "AND json_extract(labels_json, '$.replay_of') IS NULL "
                         "ORDER BY seq DESC LIMIT 1",
                         "tttt", commit, project, build, control_commit);
    return store_first_id(s, st, rc, id_out);
}

int store_job_started(struct store *s, const char *job_id, bool *started, char *why, size_t wlen)
{
    sqlite3_stmt *st = NULL;
    /* A cell did not start when it failed before its runner said anything:
     * its set-up failed (no exit code), or the exec did (126, 127), and its
     * attempt holds no record. */
    int rc = store_query(
        s, &st,
        "SELECT count(*), sum(c.state = 'failed' AND coalesce(c.exit_code, -1) IN (-1, 126, 127) "
        "AND NOT EXISTS (SELECT 1 FROM records r WHERE r.attempt_id = c.committed_attempt)), "
        "(SELECT c2.reason FROM cells c2 WHERE c2.job_seq = j.seq AND c2.state = 'failed' "
        "ORDER BY c2.ord LIMIT 1) FROM jobs j JOIN cells c ON c.job_seq = j.seq WHERE j.id = ?",
        "t", job_id);
    if (rc == 0 && (rc = store_step(s, st)) == 0) {
        int64_t cells = sqlite3_column_int64(st, 0), dead = sqlite3_column_int64(st, 1);
        *started = cells == 0 || dead < cells;
        snprintf(why, wlen, "%s",
                 sqlite3_column_text(st, 2) ? (const char *)sqlite3_column_text(st, 2) : "");
    }
    sqlite3_finalize(st);
    return rc == -ENOENT ? 0 : rc;
}

int store_bisect_owner(struct store *s, const char *id, char out[16])
{
    sqlite3_stmt *st = NULL;
    int rc =
        store_query(s, &st, "SELECT coalesce(token_id, '') FROM bisections WHERE id = ?", "t", id);
    return store_first_id(s, st, rc, out);
}

static int commit_add(sqlite3_stmt *st, void *arr)
{
    json_array_append_new(arr, store_col_str(st, 0));
    return 0;
}

int store_branch_commits(struct store *s, const char *project, const char *branch, json_t **out)
{
    json_t *arr = json_array();
    int rc = store_each(s,
                        "SELECT p.commit_sha FROM history_points p JOIN history_series h ON "
                        "h.id = p.series_id WHERE h.project = ? AND h.branch = ? "
                        "GROUP BY p.commit_sha ORDER BY min(p.order_ms), min(p.order_seq) "
                        "LIMIT ?",
                        commit_add, arr, "tti", project, branch, STORE_BRANCH_MAX_COMMITS + 1);
    if (rc == 0 && json_array_size(arr) > STORE_BRANCH_MAX_COMMITS)
        rc = -E2BIG;
    if (rc == 0)
        *out = json_incref(arr);
    json_decref(arr);
    return rc;
}
