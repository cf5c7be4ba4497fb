/*
 * cli/cmd_jobs.c - capctl submit, status and wait: capture jobs
 * (/v1/jobs) from submission to their last cell.
 */
#include <errno.h>
#include <limits.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <time.h>
#include <unistd.h>

#include "cli/capctl.h"
#include "cli/provenance.h"

/* How long polling tolerates an unreachable or overloaded server before it
 * gives up: a capd restart takes a few seconds. */
#define CTL_POLL_GRACE_S            60.0
#define CTL_MAX_PROVENANCE_WARNINGS 10

static const struct ctl_opt submit_opts[] = {
    {"project", CTL_VALUE, "P", "project name (required)"},
    {"commit", CTL_VALUE, "SHA", "commit under test, 7 to 64 hex digits (required)"},
    {"build", CTL_VALUE, "B", "registered build to run (required)"},
    {"branch", CTL_VALUE, "BR", "branch of the commit"},
    {"control-commit", CTL_VALUE, "SHA", "commit to compare against (capctl diff --commit)"},
    {"models", CTL_VALUE, "a,b", "models, comma-separated (required; GET /v1/models)"},
    {"widths", CTL_VALUE, "x,y", "SIMD widths, comma-separated (required; GET /v1/widths)"},
    {"passes", CTL_VALUE, "forward,backward", "passes, comma-separated (required)"},
    {"iterations", CTL_VALUE, "N", "timed iterations per cell (server default 20)"},
    {"warmup", CTL_VALUE, "N", "warm-up iterations (default 3)"},
    {"timing-processes", CTL_VALUE, "N", "separate timing processes per cell (default 5)"},
    {"timing-pairs", CTL_VALUE, "N", "control/head pairs a round when paired (default 8)"},
    {"max-timing-rounds", CTL_VALUE, "N", "rounds of pairs at most while unknown (default 3)"},
    {"threads", CTL_VALUE, "N", "intra-op threads (default 1)"},
    {"timeout", CTL_VALUE, "S", "per-cell timeout in seconds (default 600)"},
    {"capture", CTL_VALUE, "stats|sample|full", "what is stored per tensor (default stats)"},
    {"seed", CTL_VALUE, "N", "random seed (default 0)"},
    {"batch", CTL_VALUE, "N", "batch size (default 2)"},
    {"sample-size", CTL_VALUE, "N", "elements kept per tensor with --capture sample (256)"},
    {"dtype", CTL_VALUE, "T", "float32, float64, float16 or bfloat16 (default float32)"},
    {"label", CTL_MULTI, "k=v", "label stored with the job"},
    {"idempotency-key", CTL_VALUE, "K", "resubmitting with the same key returns the same job"},
    {"source-tree", CTL_VALUE, "DIR", "check the build's git source tree and send its provenance"},
    {"wait", CTL_FLAG, NULL, "wait for the job; exit 0 all cells ok, 3 some not ok, 2 error"},
    {"wait-timeout", CTL_VALUE, "S", "with --wait: give up (exit 2) after S seconds"},
    {"json", CTL_FLAG, NULL, "print the job as JSON (the final job with --wait)"},
    {NULL, CTL_FLAG, NULL, NULL},
};

static int submit_check(const struct ctl_args *a, void *ctx);
static int submit_run(struct ctl_client *c, const struct ctl_args *a, void *ctx);
static int status_run(struct ctl_client *c, const struct ctl_args *a, void *ctx);
static int wait_check(const struct ctl_args *a, void *ctx);
static int wait_run(struct ctl_client *c, const struct ctl_args *a, void *ctx);

static const struct ctl_cmd cmd_submit = {
    .name = "submit",
    .usage = "--project P --commit SHA --build B --models a,b --widths x,y --passes "
             "forward,backward [options]",
    .summary = "Submit a capture job: one cell per model x width x pass. Prints the job id.",
    .details =
        "--source-tree DIR runs 'git status' and 'git submodule status' in DIR and sends what\n"
        "they show as the job's provenance, with findings (generated dispatch sources such as\n"
        "Activation.cpp.DEFAULT.cpp, stale Config.h/CUDAConfig.h, dirty submodules) that every\n"
        "comparison involving the job shows as warnings. It also sends the commit's committer\n"
        "time and parents (git log), which order the branch's history (docs/history.md).\n"
        "See docs/capctl.md.\n\n"
        "example:\n"
        "  capctl submit --project pytorch --commit $SHA --branch $BRANCH --build torch-pr \\\n"
        "      --models mlp,cnn --widths default,avx2 --passes forward,backward \\\n"
        "      --source-tree ~/src/pytorch --wait",
    .opts = submit_opts,
    .check = submit_check,
    .run = submit_run,
};

static const struct ctl_cmd cmd_status = {
    .name = "status",
    .usage = "JOB [--json]",
    .summary = "Show a job: its request, state, findings and a table of cells.",
    .opts = ctl_json_opts,
    .min_pos = 1,
    .max_pos = 1,
    .run = status_run,
};

static const struct ctl_opt wait_opts[] = {
    {"wait-timeout", CTL_VALUE, "S", "give up (exit 2) after S seconds"},
    {"json", CTL_FLAG, NULL, "print the finished job as JSON"},
    {NULL, CTL_FLAG, NULL, NULL},
};

static const struct ctl_cmd cmd_wait = {
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
};

static const struct ctl_field_flag submit_fields[] = {
    {"project", "--project"},
    {"commit", "--commit"},
    {"branch", "--branch"},
    {"build", "--build"},
    {"control_commit", "--control-commit"},
    {"matrix.models", "--models"},
    {"matrix.widths", "--widths"},
    {"matrix.passes", "--passes"},
    {"matrix", "--models, --widths and --passes"},
    {"options.iterations", "--iterations"},
    {"options.warmup", "--warmup"},
    {"options.timing_processes", "--timing-processes"},
    {"options.timing_pairs", "--timing-pairs"},
    {"options.max_timing_rounds", "--max-timing-rounds"},
    {"options.threads", "--threads"},
    {"options.timeout_s", "--timeout"},
    {"options.capture", "--capture"},
    {"options.seed", "--seed"},
    {"options.batch", "--batch"},
    {"options.sample_size", "--sample-size"},
    {"options.dtype", "--dtype"},
    {"labels", "--label"},
    {"provenance", "--source-tree"},
    {"Idempotency-Key", "--idempotency-key"},
    {NULL, NULL},
};

/* "a,b" to ["a","b"]; an empty item is a usage error naming FLAG. */
static int split_list(const char *flag, const char *s, json_t **out)
{
    json_t *arr = json_array();
    const char *p = s;
    if (!arr)
        return CTL_EXIT_ERROR;
    for (;;) {
        const char *e = strchr(p, ',');
        size_t n = e ? (size_t)(e - p) : strlen(p);
        while (n && (*p == ' ' || *p == '\t')) {
            p++;
            n--;
        }
        while (n && (p[n - 1] == ' ' || p[n - 1] == '\t'))
            n--;
        if (n == 0) {
            json_decref(arr);
            return ctl_usage_error(&cmd_submit, "--%s has an empty item in '%s'", flag, s);
        }
        json_t *v = json_stringn(p, n);
        if (!v) {
            json_decref(arr);
            return ctl_usage_error(&cmd_submit, "--%s is not valid UTF-8", flag);
        }
        json_array_append_new(arr, v);
        if (!e)
            break;
        p = e + 1;
    }
    *out = arr;
    return 0;
}

static const char *const terminal_order[] = {"ok",        "failed",      "crashed",
                                             "timeout",   "unsupported", "protocol_error",
                                             "cancelled", "interrupted", NULL};

static bool is_done_state(const char *st)
{
    return st && strcmp(st, "queued") != 0 && strcmp(st, "running") != 0;
}

/* The one-line progress of a job:
 * "job j... running: 5/12 cells done (ok 4, failed 1), 1 running". */
static void progress_line(json_t *job, char *buf, size_t cap)
{
    json_t *cells = json_object_get(job, "cells");
    size_t total = json_array_size(cells), done = 0, running = 0, i;
    json_t *cell;
    char ib[64], sb[64];
    json_array_foreach(cells, i, cell)
    {
        const char *st = json_string_value(json_object_get(cell, "state"));
        if (st && strcmp(st, "running") == 0)
            running++;
        else if (is_done_state(st))
            done++;
    }
    int n = snprintf(buf, cap, "job %s %s: %zu/%zu cells done",
                     ctl_jtext(json_object_get(job, "id"), ib, sizeof ib),
                     ctl_jtext(json_object_get(job, "state"), sb, sizeof sb), done, total);
    if (done > 0 && n > 0 && (size_t)n < cap) {
        bool first = true;
        n += snprintf(buf + n, cap - (size_t)n, " (");
        /* Known states first, in a fixed order; anything newer after. */
        for (int k = 0; terminal_order[k]; k++) {
            size_t c = 0;
            json_array_foreach(cells, i, cell)
            {
                const char *st = json_string_value(json_object_get(cell, "state"));
                c += st && strcmp(st, terminal_order[k]) == 0;
            }
            if (c && (size_t)n < cap) {
                n += snprintf(buf + n, cap - (size_t)n, "%s%s %zu", first ? "" : ", ",
                              terminal_order[k], c);
                first = false;
            }
        }
        size_t other = 0;
        json_array_foreach(cells, i, cell)
        {
            const char *st = json_string_value(json_object_get(cell, "state"));
            bool known = false;
            for (int k = 0; terminal_order[k]; k++)
                known |= st && strcmp(st, terminal_order[k]) == 0;
            other += is_done_state(st) && !known;
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
    return st && strcmp(st, "unsupported") == 0 &&
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
        bad += !(st && strcmp(st, "ok") == 0) && !not_run_here(cell);
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
        if (!(st && strcmp(st, "ok") == 0) && !not_run_here(cell))
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

/* Prints the findings of a collected provenance, and what was cut. */
static void warn_provenance(json_t *prov, const char *commit)
{
    json_t *fs = json_object_get(prov, "findings"), *f;
    size_t i;
    char b[8400];
    json_array_foreach(fs, i, f)
    {
        if (i == CTL_MAX_PROVENANCE_WARNINGS) {
            fprintf(stderr,
                    "capctl: warning: provenance: %zu more findings (see 'capctl status')\n",
                    json_array_size(fs) - i);
            break;
        }
        fprintf(stderr, "capctl: warning: provenance: %s\n",
                ctl_jtext(json_object_get(f, "message"), b, sizeof b));
    }
    if (json_is_true(json_object_get(prov, "git_status_truncated")))
        fprintf(stderr,
                "capctl: warning: --source-tree: git status printed %lld lines; only the first "
                "%zu are sent (limit %d lines, %u KiB); findings cover all of them\n",
                (long long)json_integer_value(json_object_get(prov, "git_status_total")),
                json_array_size(json_object_get(prov, "git_status")), PROV_MAX_STATUS_LINES,
                PROV_MAX_STATUS_BYTES / 1024);
    if (json_is_true(json_object_get(prov, "submodules_truncated")))
        fprintf(stderr, "capctl: warning: --source-tree: submodule list truncated to %zu lines\n",
                json_array_size(json_object_get(prov, "submodules")));
    const char *head = json_string_value(json_object_get(prov, "head"));
    if (head && commit && strncasecmp(head, commit, strlen(commit)) != 0)
        fprintf(stderr,
                "capctl: warning: --source-tree is checked out at %.12s, not at --commit %s\n",
                head, commit);
}

/* What submit's check builds for its run: the request, before the
 * network is touched. */
struct submit {
    json_t *body;
    char *idem_hdr; /* "Idempotency-Key: K", or NULL */
    double wait_timeout;
};

static int submit_required(const struct ctl_args *a)
{
    static const char *const required[] = {"project", "commit", "build", "models",
                                           "widths",  "passes", NULL};
    for (int i = 0; required[i]; i++) {
        const char *v = ctl_arg(a, required[i]);
        if (!v || !*v)
            return ctl_usage_error(a->cmd, "--%s is required", required[i]);
    }
    return 0;
}

static int submit_matrix(const struct ctl_args *a, json_t *matrix)
{
    static const char *const axes[] = {"models", "widths", "passes"};
    for (int i = 0; i < 3; i++) {
        json_t *l = NULL;
        int rc = split_list(axes[i], ctl_arg(a, axes[i]), &l);
        if (rc != 0)
            return rc;
        json_object_set_new(matrix, axes[i], l);
    }
    return 0;
}

/* The string flags of MAP ({flag, field}) that were given, into OBJ. */
static int set_strings(const struct ctl_args *a, const char *const (*map)[2], size_t n, json_t *obj)
{
    for (size_t i = 0; i < n; i++) {
        const char *v = ctl_arg(a, map[i][0]);
        if (!v)
            continue;
        json_t *s = json_string(v);
        if (!s)
            return ctl_usage_error(a->cmd, "--%s is not valid UTF-8", map[i][0]);
        json_object_set_new(obj, map[i][1], s);
    }
    return 0;
}

/* Integer options: syntax is checked here, ranges by the server (its
 * error names the field; the hint names the flag). */
static int submit_options(const struct ctl_args *a, json_t *opts)
{
    static const char *const ints[][2] = {
        {"iterations", "iterations"},
        {"warmup", "warmup"},
        {"threads", "threads"},
        {"timeout", "timeout_s"},
        {"seed", "seed"},
        {"batch", "batch"},
        {"sample-size", "sample_size"},
        {"timing-processes", "timing_processes"},
        {"timing-pairs", "timing_pairs"},
        {"max-timing-rounds", "max_timing_rounds"},
    };
    static const char *const strs[][2] = {{"capture", "capture"}, {"dtype", "dtype"}};
    for (size_t i = 0; i < sizeof ints / sizeof ints[0]; i++) {
        const char *v = ctl_arg(a, ints[i][0]);
        long long n;
        if (!v)
            continue;
        int rc = ctl_int_arg(a->cmd, ints[i][0], v, 0, LLONG_MAX, &n);
        if (rc != 0)
            return rc;
        json_object_set_new(opts, ints[i][1], json_integer((json_int_t)n));
    }
    return set_strings(a, strs, 2, opts);
}

/* --label k=v, repeated: each key once, each value UTF-8. */
static int submit_labels(const struct ctl_args *a, json_t *labels)
{
    int it = 0;
    const char *lv;
    while ((lv = ctl_arg_next(a, "label", &it)) != NULL) {
        const char *eq = strchr(lv, '=');
        char key[128];
        if (!eq || eq == lv || (size_t)(eq - lv) >= sizeof key)
            return ctl_usage_error(a->cmd, "--label expects key=value, got '%s'", lv);
        memcpy(key, lv, (size_t)(eq - lv));
        key[eq - lv] = 0;
        if (json_object_get(labels, key))
            return ctl_usage_error(a->cmd, "--label %s given more than once", key);
        json_t *s = json_string(eq + 1);
        if (!s)
            return ctl_usage_error(a->cmd, "--label %s: the value is not valid UTF-8", key);
        json_object_set_new(labels, key, s);
    }
    return 0;
}

/* The Idempotency-Key header: an HTTP header value, printable ASCII only
 * (capd also echoes the key in its conflict message, which must be valid
 * UTF-8). */
static int submit_idempotency(const struct ctl_args *a, char **hdr)
{
    const char *idem = ctl_arg(a, "idempotency-key");
    if (!idem)
        return 0;
    for (const char *p = idem; *p; p++)
        if ((unsigned char)*p < 0x20 || (unsigned char)*p > 0x7e)
            return ctl_usage_error(a->cmd, "--idempotency-key must be printable ASCII");
    if (!*idem || asprintf(hdr, "Idempotency-Key: %s", idem) < 0) {
        *hdr = NULL;
        return ctl_usage_error(a->cmd, "--idempotency-key must not be empty");
    }
    return 0;
}

/* The request body from its parts: the required strings, then the
 * optional ones. */
static int submit_body(const struct ctl_args *a, json_t *matrix, json_t *opts, json_t *labels,
                       json_t **body)
{
    static const char *const opt_strs[][2] = {{"branch", "branch"},
                                              {"control-commit", "control_commit"}};
    *body = json_pack("{s:s?,s:s?,s:s?,s:O,s:O,s:O}", "project", ctl_arg(a, "project"), "commit",
                      ctl_arg(a, "commit"), "build", ctl_arg(a, "build"), "matrix", matrix,
                      "options", opts, "labels", labels);
    if (!*body)
        return ctl_usage_error(a->cmd, "--project, --commit and --build must be valid UTF-8");
    return set_strings(a, opt_strs, 2, *body);
}

/* Flags are all checked before git runs or the network is touched. */
static int submit_check(const struct ctl_args *a, void *ctx)
{
    struct submit *s = ctx;
    json_t *matrix = json_object(), *opts = json_object(), *labels = json_object();
    int rc = submit_required(a);
    if (rc != 0)
        goto out;
    rc = CTL_EXIT_ERROR;
    if (!matrix || !opts || !labels)
        goto out;
    if ((rc = submit_matrix(a, matrix)) != 0 || (rc = submit_options(a, opts)) != 0 ||
        (rc = submit_labels(a, labels)) != 0)
        goto out;
    const char *wt = ctl_arg(a, "wait-timeout");
    if (wt && !ctl_has(a, "wait")) {
        rc = ctl_usage_error(a->cmd, "--wait-timeout needs --wait");
        goto out;
    }
    if (wt && (rc = ctl_seconds_arg(a->cmd, "wait-timeout", wt, &s->wait_timeout)) != 0)
        goto out;
    if ((rc = submit_body(a, matrix, opts, labels, &s->body)) == 0)
        rc = submit_idempotency(a, &s->idem_hdr);
out:
    json_decref(matrix);
    json_decref(opts);
    json_decref(labels);
    return rc;
}

/* --source-tree: the tree's provenance and the commit's place in its
 * branch's history go with the job; findings are warnings, never errors. */
static int submit_provenance(const struct ctl_args *a, json_t *body)
{
    const char *tree = ctl_arg(a, "source-tree"), *commit = ctl_arg(a, "commit");
    json_t *prov = NULL;
    char *err = NULL;
    if (!tree)
        return 0;
    if (prov_collect(tree, &prov, &err) != 0) {
        fprintf(stderr, "capctl: %s\n", err ? err : "--source-tree: cannot collect provenance");
        free(err);
        return CTL_EXIT_ERROR;
    }
    warn_provenance(prov, commit);
    json_object_set_new(body, "provenance", prov);
    if (prov_commit_order(tree, commit, body) != 0)
        fprintf(stderr,
                "capctl: warning: --source-tree does not have commit %s; the job "
                "goes into its branch's history by submission time\n",
                commit);
    return 0;
}

/* POST /v1/jobs: the job (*JOB, owned) and its id, or NULL after saying
 * why. A 200 is a job that already existed for the idempotency key. */
static const char *submit_post(struct ctl_client *c, const struct submit *s, json_t **job)
{
    struct ctl_resp r = {0};
    const char *hdrs[] = {s->idem_hdr, NULL};
    const char *id = NULL;
    char ib[64];
    if (ctl_request(c, "POST", "/v1/jobs", s->body, s->idem_hdr ? hdrs : NULL, &r) != 0 ||
        (r.status != 200 && r.status != 201)) {
        ctl_report_fields(c, &r, submit_fields);
        goto out;
    }
    *job = ctl_resp_json(&r);
    id = json_string_value(json_object_get(*job, "id"));
    if (!id) {
        fprintf(stderr, "capctl: unexpected reply from POST /v1/jobs (no job id)\n");
        goto out;
    }
    if (r.status == 200)
        fprintf(stderr,
                "capctl: job %s already existed for this --idempotency-key; not resubmitted\n",
                ctl_clean(id, ib, sizeof ib));
out:
    ctl_resp_free(&r);
    return id;
}

/* The id alone on stdout (JOB=$(capctl submit ...)), or the job with
 * --json; with --wait the id comes first and --json prints the final job. */
static int submit_run(struct ctl_client *c, const struct ctl_args *a, void *ctx)
{
    struct submit *s = ctx;
    json_t *job = NULL, *final = NULL;
    char ib[64];
    bool json_out = ctl_has(a, "json");
    int rc = submit_provenance(a, s->body);
    if (rc != 0)
        return rc;
    rc = CTL_EXIT_ERROR;
    const char *id = submit_post(c, s, &job);
    if (!id)
        goto out;
    if (!ctl_has(a, "wait")) {
        if (json_out)
            ctl_print_json(stdout, job);
        else
            printf("%s\n", ctl_clean(id, ib, sizeof ib));
        rc = 0;
        goto out;
    }
    if (!json_out) {
        printf("%s\n", ctl_clean(id, ib, sizeof ib));
        fflush(stdout);
    }
    rc = ctl_wait_job(c, id, s->wait_timeout, &final);
    if (json_out && final)
        ctl_print_json(stdout, final);
out:
    json_decref(final);
    json_decref(job);
    return rc;
}

int ctl_cmd_submit(int argc, char **argv)
{
    struct submit s = {0};
    int rc = ctl_main(&cmd_submit, argc, argv, &s);
    json_decref(s.body);
    free(s.idem_hdr);
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

static int status_run(struct ctl_client *c, const struct ctl_args *a, void *ctx)
{
    (void)ctx;
    return ctl_show_object(c, a, "/v1/jobs", "job id", print_job);
}

int ctl_cmd_status(int argc, char **argv)
{
    return ctl_main(&cmd_status, argc, argv, NULL);
}

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

int ctl_cmd_wait(int argc, char **argv)
{
    double timeout = 0;
    return ctl_main(&cmd_wait, argc, argv, &timeout);
}
