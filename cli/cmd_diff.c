/*
 * cli/cmd_diff.c - capctl diff: a comparison's verdict as an exit code.
 *
 * The verdict always comes from the JSON result. For --format md/text the
 * rendering is fetched afterwards pinned to the two job ids the JSON named,
 * so a commit that gains a newer job between the two requests cannot make
 * the printed report and the exit code disagree.
 */
#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "cli/capctl.h"

#define CTL_DIFF_POLL_S 1.0

static const struct ctl_opt diff_opts[] = {
    {"control", CTL_VALUE, "X", "control side: a job id or a commit (its newest finished job)"},
    {"head", CTL_VALUE, "Y", "head side: a job id or a commit"},
    {"commit", CTL_VALUE, "SHA", "a head commit against its control (see below)"},
    {"job", CTL_VALUE, "J", "cross-width: compare two widths of one job (id or commit)"},
    {"control-width", CTL_VALUE, "W", "cross-width: the reference width (e.g. default)"},
    {"head-width", CTL_VALUE, "W", "cross-width: the width under test (e.g. avx512)"},
    {"model", CTL_VALUE, "M", "only cells of this model"},
    {"width", CTL_VALUE, "W", "only cells of this width (not with --job)"},
    {"pass", CTL_VALUE, "P", "only cells of this pass"},
    {"format", CTL_VALUE, "md|json|text", "output (default text); the verdict is the same"},
    {"fail-on", CTL_VALUE, "regression|unknown|numerics|never",
     "exit 1 on a regression (default; perf only on a perf `regression`); unknown: also when a "
     "cell's perf is unknown or unstable; numerics: only on outcome or numeric ones, perf "
     "reported but not gating; never"},
    {"wait-timeout", CTL_VALUE, "S", "while a job is unfinished (409 pending), retry for S s"},
    {NULL, CTL_FLAG, NULL, NULL},
};

static const struct ctl_cmd cmd_diff = {
    "diff",
    "(--control X --head Y | --commit SHA | --job J --control-width W --head-width W)\n"
    "                   [--model M] [--width W] [--pass P] [--format md|json|text]\n"
    "                   [--fail-on regression|unknown|numerics|never] [--wait-timeout S]",
    "Compare a control and a head and exit with the verdict.",
    "--commit SHA compares the newest job of SHA with the control its job names\n"
    "(submit --control-commit), else the control set for its branch.\n\n"
    "exit codes: 0 pass, 1 regression (with --fail-on regression, the default, or\n"
    "numerics: perf regressions do not fail, for CI machines shared with other work;\n"
    "--fail-on unknown also fails when a cell's perf verdict is unknown or unstable),\n"
    "2 error (bad flags, network, a server error, still pending, a --model,\n"
    "--width or --pass that matches no cell, or no cell compared at all).\n\n"
    "examples:\n"
    "  capctl diff --commit $SHA --format md > report.md\n"
    "  capctl diff --control main-sha --head pr-sha --wait-timeout 1800\n"
    "  capctl diff --job j7c1f3a9e2b4d --control-width default --head-width avx512",
    diff_opts,
    0,
    0,
};

static const struct ctl_field_flag diff_fields[] = {
    {"control", "--control"},
    {"head", "--head"},
    {"job", "--job"},
    {"control_width", "--control-width"},
    {"head_width", "--head-width"},
    {"control_commit", "--commit (the head job's control commit)"},
    {"sha", "--commit"},
    {"format", "--format"},
    {NULL, NULL},
};

static double now_s(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + (double)t.tv_nsec / 1e9;
}

static void sleep_s(double s)
{
    struct timespec t = {(time_t)s, (long)((s - (double)(time_t)s) * 1e9)};
    while (nanosleep(&t, &t) != 0 && errno == EINTR)
        ;
}

static void add_filters(struct ctl_client *c, struct ctl_url *u, const struct ctl_args *a)
{
    static const char *const keys[] = {"model", "width", "pass", NULL};
    for (int i = 0; keys[i]; i++) {
        const char *v = ctl_arg(a, keys[i]);
        if (v)
            ctl_url_query(c, u, keys[i], v);
    }
    /* --fail-on numerics: the server's verdict leaves perf out of the gate */
    const char *f = ctl_arg(a, "fail-on");
    if (f && strcmp(f, "numerics") == 0)
        ctl_url_query(c, u, "overrides", "{\"perf_gate\":false}");
}

/* "control job j.. (running), head job j.. (queued)" from a pending body. */
static void pending_text(const struct ctl_resp *r, char *buf, size_t cap)
{
    json_t *j = ctl_resp_json(r);
    json_t *ctl = json_object_get(j, "control"), *head = json_object_get(j, "head");
    char b1[64], b2[64], b3[64], b4[64];
    if (json_is_object(ctl) && json_is_object(head)) {
        snprintf(buf, cap, "waiting: control job %s (%s), head job %s (%s)",
                 ctl_jtext(json_object_get(ctl, "job"), b1, sizeof b1),
                 ctl_jtext(json_object_get(ctl, "state"), b2, sizeof b2),
                 ctl_jtext(json_object_get(head, "job"), b3, sizeof b3),
                 ctl_jtext(json_object_get(head, "state"), b4, sizeof b4));
    } else {
        char m[512];
        const char *msg =
            json_string_value(json_object_get(json_object_get(j, "error"), "message"));
        snprintf(buf, cap, "waiting: %s",
                 ctl_clean(msg ? msg : "a job has not finished", m, sizeof m));
    }
    json_decref(j);
}

/* Writes a rendered report, keeping newlines and tabs but no other control
 * characters. */
static void print_report(const char *s, size_t n)
{
    for (size_t i = 0; i < n; i++) {
        unsigned char ch = (unsigned char)s[i];
        putchar((ch < 0x20 && ch != '\n' && ch != '\t') || ch == 0x7f ? '?' : ch);
    }
    if (n && s[n - 1] != '\n')
        putchar('\n');
}

int ctl_cmd_diff(int argc, char **argv)
{
    struct ctl_args a;
    struct ctl_client c = {0};
    struct ctl_resp r = {0};
    json_t *result = NULL;
    double wait_timeout = -1;
    int rc = ctl_parse(&cmd_diff, argc, argv, &a);
    if (rc) {
        rc = rc == 1 ? 0 : rc; /* 1: --help was printed */
        goto out;
    }
    bool pair = ctl_has(&a, "control") || ctl_has(&a, "head");
    bool commit = ctl_has(&a, "commit");
    bool cross = ctl_has(&a, "job") || ctl_has(&a, "control-width") || ctl_has(&a, "head-width");
    if (pair + commit + cross != 1) {
        rc = ctl_usage_error(&cmd_diff, "give exactly one of: --control X --head Y; --commit SHA; "
                                        "--job J --control-width W --head-width W");
        goto out;
    }
    if (pair && (!ctl_has(&a, "control") || !ctl_has(&a, "head"))) {
        rc = ctl_usage_error(&cmd_diff, "%s needs %s too",
                             ctl_has(&a, "control") ? "--control" : "--head",
                             ctl_has(&a, "control") ? "--head" : "--control");
        goto out;
    }
    if (cross) {
        static const char *const need[] = {"job", "control-width", "head-width", NULL};
        for (int i = 0; need[i]; i++)
            if (!ctl_has(&a, need[i])) {
                rc = ctl_usage_error(&cmd_diff,
                                     "a cross-width comparison needs --job, --control-width and "
                                     "--head-width (--%s is missing)",
                                     need[i]);
                goto out;
            }
        if (ctl_has(&a, "width")) {
            rc = ctl_usage_error(&cmd_diff, "--width does not apply to a cross-width comparison "
                                            "(--job); the widths are --control-width and "
                                            "--head-width");
            goto out;
        }
    }
    const char *format = ctl_arg(&a, "format");
    if (!format)
        format = "text";
    if (strcmp(format, "md") && strcmp(format, "json") && strcmp(format, "text")) {
        rc = ctl_usage_error(&cmd_diff, "--format must be md, json or text, got '%s'", format);
        goto out;
    }
    const char *fail_on = ctl_arg(&a, "fail-on");
    if (!fail_on)
        fail_on = "regression";
    if (strcmp(fail_on, "regression") && strcmp(fail_on, "unknown") &&
        strcmp(fail_on, "numerics") && strcmp(fail_on, "never")) {
        rc = ctl_usage_error(&cmd_diff,
                             "--fail-on must be regression, unknown, numerics or never, got '%s'",
                             fail_on);
        goto out;
    }
    const char *wt = ctl_arg(&a, "wait-timeout");
    if (wt && (rc = ctl_seconds_arg(&cmd_diff, "wait-timeout", wt, &wait_timeout)) != 0)
        goto out;
    if ((rc = ctl_client_open(&c, &a)) != 0)
        goto out;
    rc = CTL_EXIT_ERROR;

    struct ctl_url u;
    if (commit) {
        ctl_url_init(&u, "/v1/commits");
        ctl_url_seg(&c, &u, ctl_arg(&a, "commit"));
        ctl_url_lit(&u, "/diff");
    } else if (cross) {
        ctl_url_init(&u, "/v1/compare");
        ctl_url_query(&c, &u, "job", ctl_arg(&a, "job"));
        ctl_url_query(&c, &u, "control_width", ctl_arg(&a, "control-width"));
        ctl_url_query(&c, &u, "head_width", ctl_arg(&a, "head-width"));
    } else {
        ctl_url_init(&u, "/v1/compare");
        ctl_url_query(&c, &u, "control", ctl_arg(&a, "control"));
        ctl_url_query(&c, &u, "head", ctl_arg(&a, "head"));
    }
    add_filters(&c, &u, &a);
    ctl_url_query(&c, &u, "format", "json");
    if (u.overflow) {
        rc = ctl_usage_error(&cmd_diff, "the arguments are too long for a URL");
        goto out;
    }

    bool tty = isatty(STDERR_FILENO);
    char line[512], last[512] = "";
    double t0 = now_s();
    for (;;) {
        if (ctl_request(&c, "GET", u.buf, NULL, NULL, &r) != 0) {
            if (tty && last[0])
                fputc('\n', stderr);
            ctl_report(&c, &r);
            goto out;
        }
        if (r.status == 200)
            break;
        char code[64];
        ctl_resp_error_code(&r, code, sizeof code);
        bool pending = r.status == 409 && strcmp(code, "pending") == 0;
        if (!pending || wait_timeout < 0 || now_s() - t0 >= wait_timeout) {
            if (tty && last[0])
                fputc('\n', stderr);
            ctl_report_fields(&c, &r, diff_fields);
            if (pending && wait_timeout < 0)
                fprintf(stderr, "capctl: add --wait-timeout SECONDS to wait for the jobs\n");
            else if (pending)
                fprintf(stderr, "capctl: still pending after %g s (--wait-timeout)\n",
                        wait_timeout);
            goto out;
        }
        pending_text(&r, line, sizeof line);
        if (tty) {
            fprintf(stderr, "\r%s\033[K", line);
        } else if (strcmp(line, last) != 0) {
            fprintf(stderr, "%s\n", line);
        }
        fflush(stderr);
        snprintf(last, sizeof last, "%s", line);
        ctl_resp_free(&r);
        double left = wait_timeout - (now_s() - t0);
        sleep_s(left < CTL_DIFF_POLL_S ? (left > 0 ? left : 0) : CTL_DIFF_POLL_S);
    }
    if (tty && last[0])
        fputc('\n', stderr);

    result = ctl_resp_json(&r);
    const char *verdict = json_string_value(json_object_get(result, "verdict"));
    if (!verdict || (strcmp(verdict, "pass") && strcmp(verdict, "regression"))) {
        fprintf(stderr, "capctl: the comparison has no verdict (pass or regression)\n");
        goto out;
    }
    /* A server that predates the no_cells refusal still answers 200 for
     * zero cells compared: a gate never passes on nothing. */
    json_t *ncells = json_object_get(json_object_get(result, "counts"), "cells");
    if (!json_is_integer(ncells) || json_integer_value(ncells) == 0) {
        fprintf(stderr, "capctl: the comparison compared no cell; check --model, --width and "
                        "--pass against the job's cells (capctl status JOB)\n");
        goto out;
    }
    if (strcmp(format, "json") == 0) {
        ctl_print_json(stdout, result);
    } else {
        const char *cj =
            json_string_value(json_object_get(json_object_get(result, "control"), "job"));
        const char *hj = json_string_value(json_object_get(json_object_get(result, "head"), "job"));
        if (!cj || !hj) {
            fprintf(stderr, "capctl: the comparison does not name its jobs\n");
            goto out;
        }
        ctl_url_init(&u, "/v1/compare");
        if (cross) {
            ctl_url_query(&c, &u, "job", hj);
            ctl_url_query(&c, &u, "control_width", ctl_arg(&a, "control-width"));
            ctl_url_query(&c, &u, "head_width", ctl_arg(&a, "head-width"));
        } else {
            ctl_url_query(&c, &u, "control", cj);
            ctl_url_query(&c, &u, "head", hj);
        }
        add_filters(&c, &u, &a);
        ctl_url_query(&c, &u, "format", format);
        ctl_resp_free(&r);
        if (u.overflow || ctl_request(&c, "GET", u.buf, NULL, NULL, &r) != 0 || r.status != 200) {
            ctl_report(&c, &r);
            goto out;
        }
        print_report(r.body, r.len);
    }
    fflush(stdout);
    rc = strcmp(verdict, "regression") == 0 && strcmp(fail_on, "never") != 0 ? CTL_EXIT_REGRESSION
                                                                             : CTL_EXIT_OK;
    /* --fail-on unknown: perf the comparison could not decide fails too */
    json_t *counts = json_object_get(result, "counts");
    if (strcmp(fail_on, "unknown") == 0 &&
        json_integer_value(json_object_get(counts, "perf_unknown")) +
                json_integer_value(json_object_get(counts, "perf_unstable")) >
            0)
        rc = CTL_EXIT_REGRESSION;
out:
    json_decref(result);
    ctl_resp_free(&r);
    ctl_client_close(&c);
    ctl_args_free(&a);
    return rc;
}
