/*
 * storage/history_read.c - what the history endpoints read: one series with
 * its points and alerts, the alert list, and alert feedback. Points and
 * alerts are precomputed (storage/history.c), so each query is an indexed
 * range read whose cost grows with what it returns, not with the history.
 */
#include <errno.h>
#include <string.h>

#include "compare/changepoint.h"
#include "storage/store_int.h"
#include "util/cellstate.h"
#include "util/clock.h"

#define ALERT_COLS                                                                                 \
    "a.id, a.kind, a.label, a.status, a.commit_sha, a.last_good, a.detail_json, a.note, "          \
    "a.created_at, a.updated_at, s.project, s.branch, s.model, s.width, s.pass"

static json_t *alert_row(sqlite3_stmt *st)
{
    json_t *a = json_pack(
        "{s:o,s:o,s:o,s:o,s:o,s:o,s:o,s:o,s:o,s:o,s:o,s:o,s:o,s:o,s:o}", "id", store_col_str(st, 0),
        "kind", store_col_str(st, 1), "label", store_col_str(st, 2), "status", store_col_str(st, 3),
        "first_bad", store_col_str(st, 4), "last_good", store_col_str(st, 5), "note",
        store_col_str(st, 7), "created_at", store_col_time(st, 8), "updated_at",
        store_col_time(st, 9), "project", store_col_str(st, 10), "branch", store_col_str(st, 11),
        "model", store_col_str(st, 12), "width", store_col_str(st, 13), "pass",
        store_col_str(st, 14), "detail", store_col_json(st, 6));
    return a;
}

static int alert_add(sqlite3_stmt *st, void *arr)
{
    json_array_append_new(arr, alert_row(st));
    return 0;
}

int store_alerts_list(struct store *s, const struct store_alert_filter *f, json_t **out)
{
    json_t *arr = json_array();
    int rc =
        store_each(s,
                   "SELECT " ALERT_COLS " FROM alerts a JOIN history_series s ON s.id = "
                   "a.series_id WHERE a.detected = 1 AND (?1 IS NULL OR a.status = ?1) "
                   "AND (?2 IS NULL OR s.project = ?2) AND (?3 IS NULL OR s.branch = ?3) "
                   "AND (?4 IS NULL OR a.kind = ?4) ORDER BY a.order_ms DESC, "
                   "a.order_seq DESC, a.kind LIMIT ?5",
                   alert_add, arr, "tttti", f->status, f->project, f->branch, f->kind, f->limit);
    if (rc == 0)
        *out = json_pack("{s:O}", "alerts", arr);
    json_decref(arr);
    return rc;
}

int store_alert_set(struct store *s, const char *id, const char *status, const char *note,
                    json_t **out)
{
    int rc = store_run(s,
                       "UPDATE alerts SET status = ?, note = coalesce(?, note), updated_at = ? "
                       "WHERE id = ?",
                       "ttIt", status, note, util_wall_ms(), id);
    if (rc == 0 && sqlite3_changes(s->db) == 0)
        rc = -ENOENT;
    return rc ? rc
              : store_get_row(s,
                              "SELECT " ALERT_COLS " FROM alerts a JOIN history_series s ON "
                              "s.id = a.series_id WHERE a.id = ?",
                              alert_row, out, "t", id);
}

static int count_row(sqlite3_stmt *st, void *o)
{
    json_object_set_new(o, (const char *)sqlite3_column_text(st, 0),
                        json_integer(sqlite3_column_int64(st, 1)));
    return 0;
}

int store_alert_counts(struct store *s, json_t **out)
{
    json_t *o = json_object();
    int rc = store_each(s, "SELECT status, count(*) FROM alerts GROUP BY status", count_row, o, "");
    if (rc)
        json_decref(o);
    else
        *out = o;
    return rc;
}

/* ---- one series ---- */

static int series_find(struct store *s, const struct store_history_query *q, int64_t *id)
{
    sqlite3_stmt *st = NULL;
    int rc = store_query(s, &st,
                         "SELECT id FROM history_series WHERE project = ? AND branch = ? AND "
                         "model = ? AND width = ? AND pass = ?",
                         "ttttt", q->project, q->branch, q->model, q->width, q->pass);
    if (rc == 0 && (rc = store_step(s, st)) == 0)
        *id = sqlite3_column_int64(st, 0);
    sqlite3_finalize(st);
    return rc;
}

static json_t *point_row(sqlite3_stmt *st)
{
    return json_pack(
        "{s:o,s:o,s:o,s:o,s:o,s:o,s:o,s:o,s:o,s:o,s:o}", "commit", store_col_str(st, 0),
        "ordered_by", store_col_str(st, 1), "commit_time", store_col_str(st, 2), "job",
        store_col_str(st, 3), "cell", store_col_str(st, 4), "outcome", store_col_str(st, 5),
        "perf_ns",
        sqlite3_column_type(st, 6) == SQLITE_NULL ? json_null()
                                                  : json_real(sqlite3_column_double(st, 6)),
        "perf_samples", store_col_int(st, 7), "peak_rss_bytes", store_col_int(st, 8), "numerics",
        store_col_str(st, 9), "first_divergent_key", store_col_str(st, 10));
}

struct points {
    json_t *arr;
    size_t n_perf;
};

static int point_add(sqlite3_stmt *st, void *ctx)
{
    struct points *ps = ctx;
    json_t *p = point_row(st);
    ps->n_perf += json_is_real(json_object_get(p, "perf_ns")) &&
                  cell_state_is(json_string_value(json_object_get(p, "outcome")), CELL_OK);
    json_array_append_new(ps->arr, p);
    return 0;
}

/* The newest LIMIT points of SERIES, oldest first, and how many are ok
 * with a perf observation. */
static int points_get(struct store *s, int64_t series, int limit, json_t **out, size_t *n_perf)
{
    struct points ps = {json_array(), 0};
    int rc = store_each(
        s,
        "SELECT commit_sha, ordered_by, commit_time, job_id, cell_id, outcome, perf_ns, "
        "perf_samples, peak_rss_bytes, numerics, first_divergent_key FROM (SELECT * FROM "
        "history_points WHERE series_id = ?1 ORDER BY order_ms DESC, order_seq DESC LIMIT ?2) "
        "ORDER BY order_ms, order_seq",
        point_add, &ps, "Ii", series, limit);
    *n_perf = ps.n_perf;
    if (rc)
        json_decref(ps.arr);
    else
        *out = ps.arr;
    return rc;
}

/* Alerts of SERIES of the kinds KIND_A and KIND_B, oldest first. */
static int series_alerts(struct store *s, int64_t series, const char *kind_a, const char *kind_b,
                         int limit, json_t **out)
{
    json_t *arr = json_array();
    int rc = store_each(s,
                        "SELECT * FROM (SELECT " ALERT_COLS ", a.order_ms, a.order_seq FROM "
                        "alerts a JOIN history_series s ON s.id = a.series_id WHERE "
                        "a.series_id = ?1 AND a.detected = 1 AND a.kind IN (?2, ?3) ORDER BY "
                        "a.order_ms DESC, a.order_seq DESC LIMIT ?4) ORDER BY order_ms, "
                        "order_seq",
                        alert_add, arr, "Itti", series, kind_a, kind_b, limit);
    if (rc)
        json_decref(arr);
    else
        *out = arr;
    return rc;
}

int store_history_get(struct store *s, const struct store_history_query *q, json_t **out)
{
    int64_t series = 0;
    size_t n_perf = 0;
    json_t *points = NULL, *cps = NULL, *events = NULL;
    int rc = series_find(s, q, &series);
    if (rc == 0)
        rc = points_get(s, series, q->limit, &points, &n_perf);
    if (rc == 0)
        rc = series_alerts(s, series, "perf", "memory", q->limit, &cps);
    if (rc == 0)
        rc = series_alerts(s, series, "numerics", "outcome", q->limit, &events);
    if (rc == 0) {
        bool few = cmp_cp_series_label(n_perf, NULL) == CMP_CP_INSUFFICIENT_DATA;
        *out = json_pack("{s:{s:s,s:s,s:s,s:s,s:s},s:s,s:O,s:O,s:O}", "series", "project",
                         q->project, "branch", q->branch, "model", q->model, "width", q->width,
                         "pass", q->pass, "status", few ? "insufficient_data" : "ok", "points",
                         points, "change_points", cps, "events", events);
        rc = *out ? 0 : -ENOMEM;
    }
    json_decref(points);
    json_decref(cps);
    json_decref(events);
    return rc;
}
