/* daemon/bisect.c - advancing bisections from the daemon loop (bisect.h). */
#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "compare/cmp.h"
#include "daemon/bisect.h"
#include "util/log.h"

/* Passes over one bisection per step: reused jobs are judged at once, so
 * one step may go through several rounds; this bounds it. */
#define BISECT_MAX_PASSES 64

/* One running bisection, as read from the store. */
struct bs {
    json_t *b;
    const char *id, *project, *build, *predicate;
    double threshold;
    json_t *commits, *job;
    size_t n;
    int round;
    json_t **probe; /* by commit index; NULL where there is none */
    bool created;   /* a job was created (the scheduler should run) */
    bool ended;     /* failed or done: nothing more to do */
};

static const char *pstate(json_t *p)
{
    return p ? json_string_value(json_object_get(p, "state")) : NULL;
}

static bool pis(json_t *p, const char *state)
{
    const char *s = pstate(p);
    return s && strcmp(s, state) == 0;
}

static const char *commit_at(struct bs *x, size_t i)
{
    return json_string_value(json_array_get(x->commits, i));
}

static int bs_load(struct store *st, const char *id, struct bs *x)
{
    memset(x, 0, sizeof *x);
    int rc = store_bisect_get(st, id, &x->b);
    if (rc)
        return rc;
    x->id = json_string_value(json_object_get(x->b, "id"));
    x->project = json_string_value(json_object_get(x->b, "project"));
    x->build = json_string_value(json_object_get(x->b, "build"));
    x->predicate = json_string_value(json_object_get(x->b, "predicate"));
    x->threshold = json_number_value(json_object_get(x->b, "threshold"));
    x->commits = json_object_get(x->b, "commits");
    x->job = json_object_get(x->b, "job");
    x->n = json_array_size(x->commits);
    x->round = (int)json_integer_value(json_object_get(x->b, "round"));
    if (!(x->probe = calloc(x->n ? x->n : 1, sizeof *x->probe)))
        return -ENOMEM;
    size_t i;
    json_t *p;
    json_array_foreach(json_object_get(x->b, "probes"), i, p)
    {
        json_int_t k = json_integer_value(json_object_get(p, "index"));
        if (k >= 0 && (size_t)k < x->n)
            x->probe[k] = p;
    }
    return 0;
}

static void bs_free(struct bs *x)
{
    free(x->probe);
    json_decref(x->b);
    memset(x, 0, sizeof *x);
}

/* Writes probe I; X's copy is updated in place rather than read again. */
static int probe_put(struct store *st, struct bs *x, size_t i, int round, const char *job,
                     bool reused, const char *state, const char *reason, json_t *verdict)
{
    char *v = verdict ? json_dumps(verdict, JSON_COMPACT | JSON_SORT_KEYS) : NULL;
    struct store_bisect_probe p = {.bisect_id = x->id,
                                   .commit = commit_at(x, i),
                                   .index = (int)i,
                                   .round = round,
                                   .job_id = job,
                                   .reused = reused,
                                   .state = state,
                                   .reason = reason,
                                   .verdict = v};
    int rc = store_bisect_probe_put(st, &p);
    free(v);
    if (rc)
        return rc;
    if (!x->probe[i]) {
        x->probe[i] = json_object();
        json_array_append_new(json_object_get(x->b, "probes"), x->probe[i]);
    }
    json_object_set_new(x->probe[i], "round", json_integer(round));
    json_object_set_new(x->probe[i], "job", job ? json_string(job) : json_null());
    json_object_set_new(x->probe[i], "reused", json_boolean(reused));
    json_object_set_new(x->probe[i], "state", json_string(state));
    json_object_set_new(x->probe[i], strcmp(state, "skipped") == 0 ? "skipped_reason" : "reason",
                        reason ? json_string(reason) : json_null());
    return 0;
}

static void bs_fail(struct store *st, struct bs *x, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

/* Ends the bisection as failed with a reason a person can act on. */
static void bs_fail(struct store *st, struct bs *x, const char *fmt, ...)
{
    char why[600];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(why, sizeof why, fmt, ap);
    va_end(ap);
    log_warn("bisect_failed", "bisect=%s reason=%s", x->id, log_q(why));
    store_bisect_set(st, x->id, "failed", x->round, why, NULL);
    x->ended = true;
}

/* The job a probe of commit I runs: the template with its commit, paired
 * against the good end for perf, and no branch, so probes never enter the
 * branch's history out of order. */
static json_t *probe_request(struct bs *x, size_t i)
{
    json_t *req = json_deep_copy(x->job);
    if (!req)
        return NULL;
    json_object_set_new(req, "commit", json_string(commit_at(x, i)));
    json_object_set_new(req, "branch", json_null());
    json_object_del(req, "commit_time");
    json_object_del(req, "parents");
    bool paired = strcmp(x->predicate, "perf") == 0 && i != 0;
    json_object_set_new(req, "control_commit", paired ? json_string(commit_at(x, 0)) : json_null());
    json_t *labels = json_object_get(req, "labels");
    if (json_is_object(labels))
        json_object_set_new(labels, "bisect", json_string(x->id));
    return req;
}

/* Starts the probe of commit I in ROUND: a finished job of the commit when
 * one is there, else a new one; pending while the queue is full. */
static int probe_start(struct store *st, const struct capd_config *cfg, struct bs *x, size_t i,
                       int round)
{
    char id[16];
    bool paired = strcmp(x->predicate, "perf") == 0 && i != 0;
    int rc = store_job_reusable(st, x->project, x->build, commit_at(x, i),
                                paired ? commit_at(x, 0) : NULL, id);
    if (rc == 0)
        return probe_put(st, x, i, round, id, true, "running", NULL, NULL);
    if (rc != -ENOENT)
        return rc;
    json_t *req = probe_request(x, i), *job = NULL;
    if (!req)
        return -ENOMEM;
    struct store_job_new jn = {.request = req, .max_queued_jobs = cfg->max_queued_jobs};
    bool existed = false;
    rc = store_job_create(st, &jn, &job, &existed);
    json_decref(req);
    if (rc == -EAGAIN)
        return probe_put(st, x, i, round, NULL, false, "pending", NULL, NULL);
    if (rc)
        return rc;
    rc = probe_put(st, x, i, round, json_string_value(json_object_get(job, "id")), false, "running",
                   NULL, NULL);
    log_info("bisect_probe", "bisect=%s commit=%s round=%d job=%s", x->id, commit_at(x, i), round,
             json_string_value(json_object_get(job, "id")));
    json_decref(job);
    x->created = true;
    return rc;
}

/* Runs the engine on two finished jobs, as GET /v1/compare does with no
 * filter, at the bisection's perf threshold. *OUT gets the result. */
static int compare_jobs(struct store *st, struct bs *x, const char *control, const char *head,
                        json_t **out)
{
    struct cmp_side *cs = NULL, *hs = NULL;
    struct store_payloads *pl = NULL;
    struct store_cell_filter f = {NULL, NULL, NULL};
    struct cmp_options o;
    cmp_options_init(&o);
    if (x->threshold > 0)
        o.perf_threshold = x->threshold;
    int rc = cmp_side_new(&cs);
    if (!rc)
        rc = cmp_side_new(&hs);
    if (!rc)
        rc = store_load_side(st, control, &f, cs, &pl);
    if (!rc)
        rc = store_load_side(st, head, &f, hs, &pl);
    if (!rc)
        rc = cmp_compare(cs, hs, &o, out);
    if (!rc)
        json_object_set_new(*out, "control", json_pack("{s:s}", "job", control));
    if (!rc)
        json_object_set_new(*out, "head", json_pack("{s:s}", "job", head));
    cmp_side_free(cs);
    cmp_side_free(hs);
    store_payloads_free(pl);
    return rc;
}

static json_int_t count(json_t *result, const char *name)
{
    return json_integer_value(json_object_get(json_object_get(result, "counts"), name));
}

/* "bad", "good" or "undecided" for a comparison against the good end. */
static const char *judge(struct bs *x, json_t *result)
{
    size_t i;
    json_t *c;
    if (strcmp(x->predicate, "numerics") == 0)
        return count(result, "diverged") > 0 ? "bad" : "good";
    if (strcmp(x->predicate, "outcome") == 0) {
        bool changed = count(result, "outcome_regressions") > 0;
        json_array_foreach(json_object_get(result, "cells"), i, c)
        {
            const char *oc = json_string_value(json_object_get(c, "outcome_change"));
            changed = changed || (oc && strcmp(oc, "changed") == 0);
        }
        return changed ? "bad" : "good";
    }
    if (count(result, "perf_regressions") > 0)
        return "bad";
    json_array_foreach(json_object_get(result, "cells"), i, c)
    {
        const char *v = json_string_value(json_object_get(json_object_get(c, "perf"), "verdict"));
        if (!v || (strcmp(v, "same") != 0 && strcmp(v, "improvement") != 0))
            return "undecided";
    }
    return "good";
}

/* What a probe's verdict keeps of the comparison: the overall verdict, the
 * counts, and per cell its status, outcome change and perf verdict. */
static json_t *verdict_summary(const char *judged, json_t *result)
{
    json_t *cells = json_array(), *c;
    size_t i;
    json_array_foreach(json_object_get(result, "cells"), i, c)
    {
        json_t *perf = json_object_get(c, "perf");
        json_array_append_new(cells, json_pack("{s:O,s:O,s:O,s:O,s:O,s:O?,s:O?}", "model",
                                               json_object_get(c, "model"), "width",
                                               json_object_get(c, "width"), "pass",
                                               json_object_get(c, "pass"), "status",
                                               json_object_get(c, "status"), "outcome_change",
                                               json_object_get(c, "outcome_change"), "perf_verdict",
                                               json_object_get(perf, "verdict"), "perf_ratio",
                                               json_object_get(perf, "ratio")));
    }
    return json_pack("{s:s,s:O,s:O,s:o}", "judged", judged, "verdict",
                     json_object_get(result, "verdict"), "counts",
                     json_object_get(result, "counts"), "cells", cells);
}

/* Judges the finished probe of commit I (its job JOB, in state JSTATE). */
static int probe_judge(struct store *st, struct bs *x, size_t i, const char *job,
                       const char *jstate)
{
    int round = (int)json_integer_value(json_object_get(x->probe[i], "round"));
    bool reused = json_is_true(json_object_get(x->probe[i], "reused"));
    char why[512] = "", reason[600];
    bool started = true;
    if (strcmp(jstate, "cancelled") == 0)
        return probe_put(st, x, i, round, job, reused, "skipped", "its job was cancelled", NULL);
    int rc = store_job_started(st, job, &started, why, sizeof why);
    if (rc)
        return rc;
    if (!started) {
        snprintf(reason, sizeof reason, "the build did not start: %s", why);
        return probe_put(st, x, i, round, job, reused, "skipped", reason, NULL);
    }
    if (i == 0)
        return probe_put(st, x, i, round, job, reused, "good", NULL, NULL);
    if (!pis(x->probe[0], "good"))
        return 0; /* judged once the good end is */
    json_t *result = NULL;
    const char *good = json_string_value(json_object_get(x->probe[0], "job"));
    if ((rc = compare_jobs(st, x, good, job, &result)) != 0)
        return rc;
    const char *j = judge(x, result);
    json_t *v = verdict_summary(j, result);
    json_decref(result);
    bool undecided = strcmp(j, "undecided") == 0;
    rc = probe_put(st, x, i, round, job, reused, undecided ? "skipped" : j,
                   undecided ? "the perf verdict against the good commit was not decided "
                               "(unknown, unstable or insufficient_data)"
                             : NULL,
                   v);
    json_decref(v);
    return rc;
}

/* Moves every pending and running probe on. *WAITING is set while one is
 * not judged yet. */
static int probes_advance(struct store *st, const struct capd_config *cfg, struct bs *x,
                          bool *waiting)
{
    *waiting = false;
    for (size_t i = 0; i < x->n; i++) {
        json_t *p = x->probe[i];
        int rc = 0;
        if (pis(p, "pending")) {
            rc = probe_start(st, cfg, x, i, (int)json_integer_value(json_object_get(p, "round")));
        } else if (pis(p, "running")) {
            const char *job = json_string_value(json_object_get(p, "job"));
            json_t *j = NULL;
            rc = store_job_get(st, job, &j);
            const char *js = rc == 0 ? json_string_value(json_object_get(j, "state")) : NULL;
            if (rc == -ENOENT)
                rc = probe_put(st, x, i, (int)json_integer_value(json_object_get(p, "round")), job,
                               false, "skipped", "its job was deleted", NULL);
            else if (js && (strcmp(js, "done") == 0 || strcmp(js, "cancelled") == 0))
                rc = probe_judge(st, x, i, job, js);
            json_decref(j);
        }
        if (rc)
            return rc;
        *waiting = *waiting || pis(x->probe[i], "pending") || pis(x->probe[i], "running");
    }
    return 0;
}

/* The ends must hold: the good one started, the bad one is bad. True when
 * they do; otherwise the bisection has failed. */
static bool ends_hold(struct store *st, struct bs *x)
{
    json_t *g = x->probe[0], *b = x->probe[x->n - 1];
    const char *pred = x->predicate;
    if (pis(g, "skipped"))
        bs_fail(st, x, "the good commit %s was skipped: %s", commit_at(x, 0),
                json_string_value(json_object_get(g, "skipped_reason")));
    else if (pis(b, "skipped"))
        bs_fail(st, x, "the bad commit %s was skipped: %s", commit_at(x, x->n - 1),
                json_string_value(json_object_get(b, "skipped_reason")));
    else if (pis(b, "good"))
        bs_fail(st, x, "the bad commit %s is not bad by the %s predicate against %s",
                commit_at(x, x->n - 1), pred, commit_at(x, 0));
    return !x->ended;
}

/* Ends the bisection: LO is the last good commit, HI the first bad one. */
static int bs_finish(struct store *st, struct bs *x, size_t lo, size_t hi)
{
    json_t *cand = json_array(), *ev = NULL;
    size_t parent = lo;
    for (size_t i = lo + 1; i < hi; i++)
        json_array_append_new(cand, json_string(commit_at(x, i)));
    if (json_array_size(cand) > 0)
        json_array_append_new(cand, json_string(commit_at(x, hi)));
    int rc = compare_jobs(st, x, json_string_value(json_object_get(x->probe[parent], "job")),
                          json_string_value(json_object_get(x->probe[hi], "job")), &ev);
    if (rc) {
        json_decref(cand);
        return rc;
    }
    json_t *res = json_pack("{s:s,s:s,s:b,s:o,s:i,s:o}", "first_bad", commit_at(x, hi), "last_good",
                            commit_at(x, lo), "exact", json_array_size(cand) == 0, "candidates",
                            cand, "rounds", x->round, "evidence", ev);
    log_info("bisect_done", "bisect=%s first_bad=%s rounds=%d", x->id, commit_at(x, hi), x->round);
    rc = res ? store_bisect_set(st, x->id, "done", x->round, NULL, res) : -ENOMEM;
    json_decref(res);
    x->ended = true;
    return rc;
}

/* The next round, or the end: HI is the first bad probe, LO the last good
 * one before it; the commits between them that no probe looked at are
 * still in question, and the two at their quartiles are probed next. */
static int bs_next_round(struct store *st, const struct capd_config *cfg, struct bs *x)
{
    size_t hi = x->n - 1, lo = 0;
    for (size_t i = 1; i < x->n; i++)
        if (pis(x->probe[i], "bad")) {
            hi = i;
            break;
        }
    for (size_t i = 0; i < hi; i++)
        if (pis(x->probe[i], "good"))
            lo = i;
    size_t *open = malloc(sizeof *open * (hi - lo + 1)), m = 0;
    if (!open)
        return -ENOMEM;
    for (size_t i = lo + 1; i < hi; i++)
        if (!x->probe[i])
            open[m++] = i;
    int rc = 0;
    if (m == 0) {
        rc = bs_finish(st, x, lo, hi);
    } else {
        size_t a = m <= 2 ? 0 : m / 4, b = m <= 2 ? m - 1 : (3 * m) / 4;
        x->round++;
        if ((rc = store_bisect_set(st, x->id, "running", x->round, NULL, NULL)) == 0)
            rc = probe_start(st, cfg, x, open[a], x->round);
        if (rc == 0 && b != a)
            rc = probe_start(st, cfg, x, open[b], x->round);
    }
    free(open);
    return rc;
}

/* One bisection, as far as it goes now. */
static int bs_advance(struct store *st, const struct capd_config *cfg, struct bs *x)
{
    int rc = 0;
    for (size_t e = 0; e < 2 && !rc; e++) {
        size_t i = e ? x->n - 1 : 0;
        if (!x->probe[i])
            rc = probe_start(st, cfg, x, i, 0);
    }
    for (int pass = 0; pass < BISECT_MAX_PASSES && !rc && !x->ended; pass++) {
        bool waiting = false;
        if ((rc = probes_advance(st, cfg, x, &waiting)) != 0 || waiting)
            break;
        if (!ends_hold(st, x))
            break;
        rc = bs_next_round(st, cfg, x);
    }
    return rc;
}

bool bisect_step(struct store *st, const struct capd_config *cfg)
{
    char ids[STORE_BISECT_MAX_RUNNING][16];
    int n = 0;
    bool created = false;
    if (store_flush(st) != 0 || store_bisect_running(st, ids, STORE_BISECT_MAX_RUNNING, &n) != 0)
        return false;
    for (int k = 0; k < n; k++) {
        struct bs x;
        int rc = bs_load(st, ids[k], &x);
        if (rc == 0)
            rc = bs_advance(st, cfg, &x);
        if (rc && rc != -ENOSPC && rc != -EBUSY && x.id)
            bs_fail(st, &x, "capd could not advance it (error %d: %s)", rc, store_errmsg(st));
        else if (rc)
            log_warn("bisect_step_failed", "bisect=%s rc=%d", ids[k], rc);
        created = created || x.created;
        bs_free(&x);
    }
    return created;
}
