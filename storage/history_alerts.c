/*
 * storage/history_alerts.c - the analysis of a series and its alerts.
 *
 * After a job's points are written (storage/history.c), each series it
 * touched is analysed again over its newest STORE_HISTORY_ANALYSE points:
 * change points of the perf observation and of peak memory (cells that
 * ended ok only), and exact events where the numerics diverged from the
 * previous commit or the outcome changed. Every finding is an alert keyed
 * by (series, kind, first bad commit), so analysing again updates it in
 * place and keeps its id and feedback; an alert the analysis no longer
 * finds stays, with detected 0, and is not listed.
 */
#include <errno.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "compare/changepoint.h"
#include "storage/store_int.h"
#include "util/cellstate.h"
#include "util/clock.h"

struct apoint {
    char commit[65], outcome[32], numerics[16];
    char *key; /* first divergent key */
    int64_t order_ms, order_seq;
    double perf, rss;
    bool has_perf, has_rss;
};

struct window {
    struct apoint *p;
    size_t n;
};

static void window_free(struct window *w)
{
    for (size_t i = 0; i < w->n; i++)
        free(w->p[i].key);
    free(w->p);
}

static int window_row(sqlite3_stmt *st, void *ctx)
{
    struct window *w = ctx;
    if (w->n == STORE_HISTORY_ANALYSE)
        return 0;
    struct apoint *p = &w->p[w->n++];
    snprintf(p->commit, sizeof p->commit, "%s", sqlite3_column_text(st, 0));
    snprintf(p->outcome, sizeof p->outcome, "%s", sqlite3_column_text(st, 1));
    snprintf(p->numerics, sizeof p->numerics, "%s", sqlite3_column_text(st, 2));
    const char *k = (const char *)sqlite3_column_text(st, 3);
    p->key = k ? strdup(k) : NULL;
    p->order_ms = sqlite3_column_int64(st, 4);
    p->order_seq = sqlite3_column_int64(st, 5);
    p->has_perf = sqlite3_column_type(st, 6) != SQLITE_NULL;
    p->perf = sqlite3_column_double(st, 6);
    p->has_rss = sqlite3_column_type(st, 7) != SQLITE_NULL;
    p->rss = sqlite3_column_double(st, 7);
    return 0;
}

static int window_load(struct store *s, int64_t series, struct window *w)
{
    w->n = 0;
    w->p = calloc(STORE_HISTORY_ANALYSE, sizeof *w->p);
    if (!w->p)
        return -ENOMEM;
    return store_each(
        s,
        "SELECT commit_sha, outcome, numerics, first_divergent_key, order_ms, order_seq, perf_ns, "
        "peak_rss_bytes FROM (SELECT * FROM history_points WHERE series_id = ?1 ORDER BY "
        "order_ms DESC, order_seq DESC LIMIT ?2) ORDER BY order_ms, order_seq",
        window_row, w, "Ii", series, STORE_HISTORY_ANALYSE);
}

struct alert_new {
    const char *kind, *label;
    const struct apoint *bad;
    const char *last_good;
    json_t *detail; /* stolen */
};

static int alert_put(struct store *s, int64_t series, struct alert_new *a)
{
    char id[16], *detail = json_dumps(a->detail, JSON_COMPACT | JSON_SORT_KEYS);
    json_decref(a->detail);
    if (!detail)
        return -ENOMEM;
    store_new_id('a', id);
    int rc = store_run(
        s,
        "INSERT INTO alerts(id, series_id, kind, commit_sha, last_good, label, detail_json, "
        "order_ms, order_seq, detected, created_at, updated_at) VALUES "
        "(?,?,?,?,?,?,?,?,?,1,?10,?10) "
        "ON CONFLICT(series_id, kind, commit_sha) DO UPDATE SET last_good = excluded.last_good, "
        "label = excluded.label, detail_json = excluded.detail_json, order_ms = "
        "excluded.order_ms, order_seq = excluded.order_seq, detected = 1, updated_at = CASE WHEN "
        "detected = 0 OR label IS NOT excluded.label OR detail_json IS NOT excluded.detail_json "
        "THEN excluded.updated_at ELSE updated_at END",
        "tItttttIII", id, series, a->kind, a->bad->commit, a->last_good, a->label, detail,
        a->bad->order_ms, a->bad->order_seq, util_wall_ms());
    free(detail);
    return rc;
}

static json_t *real(double v)
{
    return isfinite(v) ? json_real(v) : json_null();
}

static json_t *cp_detail(const struct cmp_cp *c, const char *unit)
{
    return json_pack("{s:o,s:o,s:[o,o],s:o,s:{s:I,s:o,s:o},s:{s:I,s:o,s:o},s:s}", "magnitude",
                     real(c->magnitude), "p_value", real(c->p_value), "magnitude_ci",
                     real(c->mag_lo), real(c->mag_hi), "ci_level", json_real(0.99), "before", "n",
                     (json_int_t)c->before_n, "mean", real(c->before_mean), "sd",
                     real(c->before_sd), "after", "n", (json_int_t)c->after_n, "mean",
                     real(c->after_mean), "sd", real(c->after_sd), "unit", unit);
}

/* Change points of one metric (perf or memory) over the ok points. */
static int metric_alerts(struct store *s, int64_t series, const struct window *w, bool memory)
{
    double *x = malloc((w->n ? w->n : 1) * sizeof *x);
    size_t *at = malloc((w->n ? w->n : 1) * sizeof *at);
    struct cmp_cp *cps = malloc(CMP_CP_MAX_CHANGES * sizeof *cps);
    size_t n = 0, ncp = 0;
    int rc = -ENOMEM;
    if (!x || !at || !cps)
        goto out;
    for (size_t i = 0; i < w->n; i++) {
        bool has = memory ? w->p[i].has_rss : w->p[i].has_perf;
        if (has && cell_state_is(w->p[i].outcome, CELL_OK)) {
            x[n] = memory ? w->p[i].rss : w->p[i].perf;
            at[n++] = i;
        }
    }
    struct cmp_cp_options o;
    cmp_cp_options_init(&o);
    /* Peak RSS moves by pages from run to run; a change below 5% is noise. */
    o.min_magnitude = memory ? 0.05 : 0;
    rc = cmp_changepoints(x, n, &o, cps, CMP_CP_MAX_CHANGES, &ncp);
    if (rc == -E2BIG)
        rc = 0; /* the CMP_CP_MAX_CHANGES newest... the first ones: still reported */
    for (size_t i = 0; rc == 0 && i < ncp; i++) {
        struct alert_new a = {memory ? "memory" : "perf", cmp_cp_label_name(cps[i].label),
                              &w->p[at[cps[i].index]], w->p[at[cps[i].last_good]].commit,
                              cp_detail(&cps[i], memory ? "bytes" : "ns")};
        rc = alert_put(s, series, &a);
    }
out:
    free(x);
    free(at);
    free(cps);
    return rc;
}

/* Numerics and outcome changes: exact, one alert per commit where they
 * happen. An outcome that stops being ok is a regression, one that
 * becomes ok an improvement, any other change "changed". */
static int event_alerts(struct store *s, int64_t series, const struct window *w)
{
    int rc = 0;
    for (size_t i = 0; rc == 0 && i < w->n; i++) {
        const struct apoint *p = &w->p[i];
        if (strcmp(p->numerics, "diverged") == 0) {
            struct alert_new a = {"numerics", "changed", p, i ? w->p[i - 1].commit : NULL,
                                  json_pack("{s:o}", "first_divergent_key",
                                            p->key ? json_string(p->key) : json_null())};
            rc = alert_put(s, series, &a);
        }
        if (rc || i == 0 || strcmp(p->outcome, w->p[i - 1].outcome) == 0)
            continue;
        bool was_ok = cell_state_is(w->p[i - 1].outcome, CELL_OK),
             ok = cell_state_is(p->outcome, CELL_OK);
        struct alert_new a = {
            "outcome",
            was_ok ? "regression"
            : ok   ? "improvement"
                   : "changed",
            p, w->p[i - 1].commit,
            json_pack("{s:s,s:s}", "before", w->p[i - 1].outcome, "after", p->outcome)};
        rc = alert_put(s, series, &a);
    }
    return rc;
}

int store__history_analyse(struct store *s, int64_t series)
{
    struct window w = {0};
    int rc = window_load(s, series, &w);
    if (rc || w.n == 0)
        goto out;
    /* What the window covers is found again from scratch. */
    if ((rc = store_run(s,
                        "UPDATE alerts SET detected = 0 WHERE series_id = ? AND detected = 1 "
                        "AND (order_ms, order_seq) >= (?, ?)",
                        "III", series, w.p[0].order_ms, w.p[0].order_seq)) != 0)
        goto out;
    if ((rc = metric_alerts(s, series, &w, false)) == 0 &&
        (rc = metric_alerts(s, series, &w, true)) == 0)
        rc = event_alerts(s, series, &w);
out:
    window_free(&w);
    return rc;
}
