/*
 * cli/cmd_wait.c - capctl status and wait: a job's state and its cells, and
 * following a job to its last cell with progress on stderr (ctl_wait_job,
 * which capctl submit --wait and diff --wait-timeout use too).
 */
#include <errno.h>
#include <limits.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <time.h>
#include <unistd.h>

#include "cli/capctl.h"
#include "util/cellstate.h"

/* How long polling tolerates an unreachable or overloaded server before it
 * gives up: a capd restart takes a few seconds. */
#define CTL_POLL_GRACE_S 60.0

/* The one-line progress of a job:
 * "job j... running: 5/12 cells done (ok 4, failed 1), 1 running".
 * Done cells are counted by final state in util/cellstate.h's order; a
 * state this capctl does not know (a newer capd's) is done, as "other". */
static void progress_line(json_t *job, char *buf, size_t cap)
{
    json_t *cells = json_object_get(job, "cells");
    size_t total = json_array_size(cells), done = 0, running = 0, other = 0, i;
    size_t by[CELL_STATE_N] = {0};
    json_t *cell;
    char ib[64], sb[64];
    json_array_foreach(cells, i, cell)
    {
        const char *st = json_string_value(json_object_get(cell, "state"));
        enum cell_state cs;
        if (!st)
            continue;
        if (cell_state_parse(st, &cs) != 0) {
            other++;
            done++;
        } else if (cs == CELL_RUNNING) {
            running++;
        } else if (cell_state_final(cs)) {
            by[cs]++;
            done++;
        }
    }
    int n = snprintf(buf, cap, "job %s %s: %zu/%zu cells done",
                     ctl_jtext(json_object_get(job, "id"), ib, sizeof ib),
                     ctl_jtext(json_object_get(job, "state"), sb, sizeof sb), done, total);
    if (done > 0 && n > 0 && (size_t)n < cap) {
        bool first = true;
        n += snprintf(buf + n, cap - (size_t)n, " (");
        for (unsigned k = 0; k < CELL_STATE_N; k++) {
            if (by[k] && (size_t)n < cap) {
                n += snprintf(buf + n, cap - (size_t)n, "%s%s %zu", first ? "" : ", ",
                              cell_state_name((enum cell_state)k), by[k]);
                first = false;
            }
        }
        if (other && (size_t)n < cap)
            n += snprintf(buf + n, cap - (size_t)n, "%sother %zu", first ? "" : ", ", other);
        if ((size_t)n < cap)
            n += snprintf(buf + n, cap - (size_t)n, ")");
    }
    if (n > 0 && (size_t)n < cap)
        snprintf(buf + n, cap - (size_t)n, ", %zu running", running);
}

static bool finished_state(const char *st)
{
    return st && (strcmp(st, "done") == 0 || strcmp(st, "cancelled") == 0);
}

/* A cell capd ended unsupported because its host's CPU lacks the width:
 * not run here, which is not a failure of the build under test. */
static bool not_run_here(json_t *cell)
{
    const char *st = json_string_value(json_object_get(cell, "state"));
    return cell_state_is(st, CELL_UNSUPPORTED) &&
           json_is_string(json_object_get(cell, "host_missing"));
}

static void report_cell(FILE *f, json_t *cell)
{
    char b1[200], b2[64], b3[64], b4[64], b5[1024];
    json_t *reason = json_object_get(cell, "reason");
    fprintf(f, "  %s/%s/%s: %s%s%s%s\n", ctl_jtext(json_object_get(cell, "model"), b1, sizeof b1),
            ctl_jtext(json_object_get(cell, "width"), b2, sizeof b2),
            ctl_jtext(json_object_get(cell, "pass"), b3, sizeof b3),
            ctl_jtext(json_object_get(cell, "state"), b4, sizeof b4),
            json_is_string(reason) ? " (" : "",
            json_is_string(reason) ? ctl_clean(json_string_value(reason), b5, sizeof b5) : "",
            json_is_string(reason) ? ")" : "");
}

/* Lists the cells that did not end ok, and apart from them the cells not
 * run on this host; returns how many are not ok. */
static size_t report_not_ok(json_t *job, FILE *f)
{
    json_t *cells = json_object_get(job, "cells"), *cell;
    size_t i, bad = 0, not_run = 0;
    json_array_foreach(cells, i, cell)
    {
        const char *st = json_string_value(json_object_get(cell, "state"));
        not_run += not_run_here(cell);
        bad += !cell_state_is(st, CELL_OK) && !not_run_here(cell);
    }
    if (!f)
        return bad;
    char ib[64];
    ctl_jtext(json_object_get(job, "id"), ib, sizeof ib);
    if (not_run) {
        fprintf(f, "capctl: job %s: %zu of %zu cells not run (capd's host cannot run the width):\n",
                ib, not_run, json_array_size(cells));
        json_array_foreach(cells, i, cell)
        {
            if (not_run_here(cell))
                report_cell(f, cell);
        }
    }
    if (!bad)
        return bad;
    fprintf(f, "capctl: job %s finished with %zu of %zu cells not ok:\n", ib, bad,
            json_array_size(cells));
    json_array_foreach(cells, i, cell)
    {
        const char *st = json_string_value(json_object_get(cell, "state"));
        if (!cell_state_is(st, CELL_OK) && !not_run_here(cell))
            report_cell(f, cell);
    }
    return bad;
}

/* One wait for a job: what polling keeps from one request to the next. */
struct wait {
    struct ctl_client *c;
    const char *id;
    struct ctl_url u;
    struct ctl_progress p;
    double t0, last_ok, timeout_s;
    json_t *job; /* the newest job object */
};

/* One GET of the job: 1 with w->job set; 0 when the server was unreachable
 * or overloaded (5xx, 429) for less than CTL_POLL_GRACE_S, so a capd
 * restart is ridden out; CTL_EXIT_ERROR after saying why. */
static int wait_fetch(struct wait *w)
{
    struct ctl_resp r = {0};
    int rc = CTL_EXIT_ERROR;
    int q = ctl_request(w->c, "GET", w->u.buf, NULL, NULL, &r);
    if (q != 0 || r.status >= 500 || r.status == 429) {
        if (ctl_now_s() - w->last_ok <= CTL_POLL_GRACE_S) {
            rc = 0;
            goto out;
        }
        ctl_progress_end(&w->p);
        ctl_report(w->c, &r);
        fprintf(stderr, "capctl: gave up waiting for job %s after %.0f s of errors\n", w->id,
                CTL_POLL_GRACE_S);
        goto out;
    }
    if (r.status != 200) {
        ctl_progress_end(&w->p);
        ctl_report(w->c, &r);
        goto out;
    }
    w->last_ok = ctl_now_s();
    json_decref(w->job);
    w->job = ctl_resp_json(&r);
    if (!json_is_object(w->job) || !json_is_array(json_object_get(w->job, "cells"))) {
        fprintf(stderr, "capctl: unexpected reply from GET /v1/jobs/%s\n", w->id);
        goto out;
    }
    rc = 1;
out:
    ctl_resp_free(&r);
    return rc;
}

/* The end of a finished job: the cells not ok listed, or that all are. */
static int wait_finished(struct wait *w, const char *st)
{
    ctl_progress_end(&w->p);
    size_t bad = report_not_ok(w->job, stderr);
    if (!bad)
        fprintf(stderr, "job %s %s: all %zu cells ok\n", w->id, st,
                json_array_size(json_object_get(w->job, "cells")));
    return bad ? CTL_EXIT_NOT_OK : CTL_EXIT_OK;
}

/* Polls every 0.25 s for the first 2 s (short jobs finish fast), then
 * every 0.5 s, until the job is done or cancelled or the timeout passes. */
int ctl_wait_job(struct ctl_client *c, const char *id, double timeout_s, json_t **final)
{
    struct wait w = {.c = c, .id = id, .timeout_s = timeout_s};
    char line[512];
    int rc = CTL_EXIT_ERROR;

    if (final)
        *final = NULL;
    ctl_progress_init(&w.p);
    w.t0 = w.last_ok = ctl_now_s();
    ctl_url_init(&w.u, "/v1/jobs");
    ctl_url_seg(c, &w.u, id);
    if (w.u.overflow) {
        fprintf(stderr, "capctl: the job id is too long\n");
        return CTL_EXIT_ERROR;
    }
    for (;;) {
        int got = wait_fetch(&w);
        if (got == 0) {
            ctl_sleep_s(1.0);
            continue;
        }
        if (got != 1)
            break;
        progress_line(w.job, line, sizeof line);
        ctl_progress_show(&w.p, line);
        const char *st = json_string_value(json_object_get(w.job, "state"));
        if (finished_state(st)) {
            rc = wait_finished(&w, st);
            break;
        }
        double el = ctl_now_s() - w.t0;
        if (timeout_s > 0 && el >= timeout_s) {
            ctl_progress_end(&w.p);
            fprintf(stderr, "capctl: job %s is still %s after %g s (--wait-timeout)\n", id,
                    st ? st : "unfinished", timeout_s);
            break;
        }
        double step = el < 2.0 ? 0.25 : 0.5;
        if (timeout_s > 0 && el + step > timeout_s)
            step = timeout_s - el;
        ctl_sleep_s(step);
    }
    if (final)
        *final = w.job;
    else
        json_decref(w.job);
    return rc;
}

static void counts_text(json_t *job, char *buf, size_t cap)
{
    json_t *counts = json_object_get(job, "counts");
    size_t n = 0;
    const char *k;
    json_t *v;
    buf[0] = 0;
    json_object_foreach(counts, k, v)
    {
        char kb[64];
        int w = snprintf(buf + n, cap - n, "%s%s %lld", n ? ", " : "", ctl_clean(k, kb, sizeof kb),
                         (long long)json_integer_value(v));
        if (w < 0 || (size_t)w >= cap - n)
            break;
        n += (size_t)w;
    }
    if (!n)
        snprintf(buf, cap, "-");
}

static void print_job(json_t *j)
{
    char b[4200], b2[4200], b3[4200];
    json_t *m = json_object_get(j, "matrix");
    json_t *o = json_object_get(j, "options");
    printf("job         %s (%s)\n", ctl_jtext(json_object_get(j, "id"), b, sizeof b),
           ctl_jtext(json_object_get(j, "state"), b2, sizeof b2));
    printf("project     %s\n", ctl_jtext(json_object_get(j, "project"), b, sizeof b));
    printf("commit      %s   branch %s   control %s\n",
           ctl_jtext(json_object_get(j, "commit"), b, sizeof b),
           ctl_jtext(json_object_get(j, "branch"), b2, sizeof b2),
           ctl_jtext(json_object_get(j, "control_commit"), b3, sizeof b3));
    printf("build       %s\n", ctl_jtext(json_object_get(j, "build"), b, sizeof b));
    size_t nm = json_array_size(json_object_get(m, "models")),
           nw = json_array_size(json_object_get(m, "widths")),
           np = json_array_size(json_object_get(m, "passes"));
    printf("matrix      %zu model%s x %zu width%s x %zu pass%s = %zu cells\n", nm,
           nm == 1 ? "" : "s", nw, nw == 1 ? "" : "s", np, np == 1 ? "" : "es", nm * nw * np);
    if (json_is_object(o)) {
        printf("options     capture %s, dtype %s, iterations %s",
               ctl_jtext(json_object_get(o, "capture"), b, sizeof b),
               ctl_jtext(json_object_get(o, "dtype"), b2, sizeof b2),
               ctl_jtext(json_object_get(o, "iterations"), b3, sizeof b3));
        printf(", warmup %s", ctl_jtext(json_object_get(o, "warmup"), b, sizeof b));
        printf(", threads %s", ctl_jtext(json_object_get(o, "threads"), b, sizeof b));
        printf(", batch %s", ctl_jtext(json_object_get(o, "batch"), b, sizeof b));
        printf(", seed %s", ctl_jtext(json_object_get(o, "seed"), b, sizeof b));
        printf(", timeout %s s\n", ctl_jtext(json_object_get(o, "timeout_s"), b, sizeof b));
    }
    const char *k;
    json_t *v;
    bool first = true;
    json_object_foreach(json_object_get(j, "labels"), k, v)
    {
        printf("%s%s=%s\n", first ? "labels      " : "            ", ctl_clean(k, b2, sizeof b2),
               ctl_jtext(v, b, sizeof b));
        first = false;
    }
    printf("created     %s   finished %s\n",
           ctl_jtext(json_object_get(j, "created_at"), b, sizeof b),
           ctl_jtext(json_object_get(j, "finished_at"), b2, sizeof b2));
    counts_text(j, b, sizeof b);
    printf("cells       %s\n", b);
    json_t *prov = json_object_get(j, "provenance");
    if (json_is_object(prov)) {
        json_t *fs = json_object_get(prov, "findings"), *f;
        size_t i;
        printf("provenance  %s: %zu finding%s\n",
               ctl_jtext(json_object_get(prov, "source_tree"), b, sizeof b), json_array_size(fs),
               json_array_size(fs) == 1 ? "" : "s");
        json_array_foreach(fs, i, f)
            printf("  ! %s\n", ctl_jtext(json_object_get(f, "message"), b, sizeof b));
    }
    printf("\n");
    /* A row that cannot be added (out of memory) is left out: the job
     * above is what status is for. */
    static const char *const hdr[] = {"MODEL", "WIDTH", "PASS", "STATE", "DURATION", "REASON"};
    struct ctl_table *t = ctl_table_new(6, hdr);
    json_t *cell;
    size_t i;
    json_array_foreach(json_object_get(j, "cells"), i, cell)
    {
        char d[64];
        ctl_duration(json_object_get(cell, "duration_ms"), d, sizeof d);
        const char *row[] = {json_string_value(json_object_get(cell, "model")),
                             json_string_value(json_object_get(cell, "width")),
                             json_string_value(json_object_get(cell, "pass")),
                             json_string_value(json_object_get(cell, "state")),
                             d,
                             json_string_value(json_object_get(cell, "reason"))};
        ctl_table_row(t, row);
    }
    ctl_table_print(t, stdout);
    ctl_table_free(t);
}

const struct ctl_cmd ctl_cmd_status = {
    .name = "status",
    .usage = "JOB [--json]",
    .summary = "Show a job: its request, state, findings and a table of cells.",
    .show = {"/v1/jobs", "job id", print_job},
};

/* CTX is the double the timeout goes into (0: none). */
static int wait_check(const struct ctl_args *a, void *ctx)
{
    const char *wt = ctl_arg(a, "wait-timeout");
    return wt ? ctl_seconds_arg(a->cmd, "wait-timeout", wt, ctx) : 0;
}

static int wait_run(struct ctl_client *c, const struct ctl_args *a, void *ctx)
{
    json_t *final = NULL;
    int rc = ctl_wait_job(c, a->pos[0], *(double *)ctx, &final);
    if (ctl_has(a, "json") && final && rc != CTL_EXIT_ERROR)
        ctl_print_json(stdout, final);
    json_decref(final);
    return rc;
}

static const struct ctl_opt wait_opts[] = {
    CTL_OPT_WAIT_TIMEOUT(""),
    CTL_OPT_JSON_HELP("print the finished job as JSON"),
    CTL_OPT_END,
};

const struct ctl_cmd ctl_cmd_wait = {
    .name = "wait",
    .usage = "JOB [--wait-timeout S] [--json]",
    .summary = "Wait for a job to finish, showing progress on stderr.",
    .details =
        "exit codes: 0 every cell ok, 3 the job finished with some cell not ok (they are listed),\n"
        "2 error (unknown job, server unreachable, --wait-timeout passed). Cells at a width\n"
        "capd's host cannot run (unsupported, with host_missing) are listed apart as not run\n"
        "and do not make the exit code 3.",
    .opts = wait_opts,
    .min_pos = 1,
    .max_pos = 1,
    .check = wait_check,
    .run = wait_run,
    .ctx_size = sizeof(double),
};
