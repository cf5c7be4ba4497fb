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

/* The form of the comparison and the flags that shape its outcome,
 * checked once before the network is touched. */
struct diff {
    bool commit, cross; /* --commit SHA; --job J --control-width W --head-width W */
    const char *format, *fail_on;
    double wait_timeout; /* < 0: no --wait-timeout */
};

static void add_filters(struct ctl_client *c, struct ctl_url *u, const struct ctl_args *a)
{
    static const char *const keys[] = {"model", "width", "pass", "reference", NULL};
    ctl_url_query_args(c, u, a, keys);
    /* --fail-on numerics: the server's verdict leaves perf out of the gate */
    const char *f = ctl_arg(a, "fail-on");
    if (f && strcmp(f, "numerics") == 0)
        ctl_url_query(c, u, "overrides", "{\"perf_gate\":false}");
}

/* Exactly one form, each complete; --width is not a filter of the
 * cross-width form, whose widths are its own flags. */
static int diff_form(const struct ctl_args *a, struct diff *d)
{
    bool pair = ctl_has(a, "control") || ctl_has(a, "head");
    d->commit = ctl_has(a, "commit");
    d->cross = ctl_has(a, "job") || ctl_has(a, "control-width") || ctl_has(a, "head-width");
    if (pair + d->commit + d->cross != 1)
        return ctl_usage_error(a->cmd, "give exactly one of: --control X --head Y; --commit SHA; "
                                       "--job J --control-width W --head-width W");
    if (pair && (!ctl_has(a, "control") || !ctl_has(a, "head")))
        return ctl_usage_error(a->cmd, "%s needs %s too",
                               ctl_has(a, "control") ? "--control" : "--head",
                               ctl_has(a, "control") ? "--head" : "--control");
    if (!d->cross)
        return 0;
    static const char *const need[] = {"job", "control-width", "head-width", NULL};
    for (int i = 0; need[i]; i++)
        if (!ctl_has(a, need[i]))
            return ctl_usage_error(a->cmd,
                                   "a cross-width comparison needs --job, --control-width and "
                                   "--head-width (--%s is missing)",
                                   need[i]);
    if (ctl_has(a, "width"))
        return ctl_usage_error(a->cmd, "--width does not apply to a cross-width comparison "
                                       "(--job); the widths are --control-width and "
                                       "--head-width");
    return 0;
}

static int diff_check(const struct ctl_args *a, void *ctx)
{
    struct diff *d = ctx;
    d->wait_timeout = -1;
    int rc = diff_form(a, d);
    if (rc != 0)
        return rc;
    d->format = ctl_arg(a, "format");
    if (!d->format)
        d->format = "text";
    if (strcmp(d->format, "md") && strcmp(d->format, "json") && strcmp(d->format, "text"))
        return ctl_usage_error(a->cmd, "--format must be md, json or text, got '%s'", d->format);
    d->fail_on = ctl_arg(a, "fail-on");
    if (!d->fail_on)
        d->fail_on = "regression";
    if (strcmp(d->fail_on, "regression") && strcmp(d->fail_on, "unknown") &&
        strcmp(d->fail_on, "numerics") && strcmp(d->fail_on, "never"))
        return ctl_usage_error(a->cmd,
                               "--fail-on must be regression, unknown, numerics or never, got '%s'",
                               d->fail_on);
    const char *wt = ctl_arg(a, "wait-timeout");
    return wt ? ctl_seconds_arg(a->cmd, "wait-timeout", wt, &d->wait_timeout) : 0;
}

/* GET /v1/compare of CONTROL and HEAD (for the cross-width form HEAD is
 * the job and the widths are the flags'), filtered, in FORMAT. */
static void compare_url(struct ctl_client *c, const struct ctl_args *a, const struct diff *d,
                        const char *control, const char *head, const char *format,
                        struct ctl_url *u)
{
    ctl_url_init(u, "/v1/compare");
    if (d->cross) {
        ctl_url_query(c, u, "job", head);
        ctl_url_query(c, u, "control_width", ctl_arg(a, "control-width"));
        ctl_url_query(c, u, "head_width", ctl_arg(a, "head-width"));
    } else {
        ctl_url_query(c, u, "control", control);
        ctl_url_query(c, u, "head", head);
    }
    add_filters(c, u, a);
    ctl_url_query(c, u, "format", format);
}

/* The JSON result of the form the flags name. */
static void result_url(struct ctl_client *c, const struct ctl_args *a, const struct diff *d,
                       struct ctl_url *u)
{
    if (!d->commit) {
        compare_url(c, a, d, ctl_arg(a, "control"), ctl_arg(a, d->cross ? "job" : "head"), "json",
                    u);
        return;
    }
    ctl_url_init(u, "/v1/commits");
    ctl_url_seg(c, u, ctl_arg(a, "commit"));
    ctl_url_lit(u, "/diff");
    add_filters(c, u, a);
    ctl_url_query(c, u, "format", "json");
}

/* A result a gate can trust: a verdict, and at least one cell compared (a
 * server that predates the no_cells refusal still answers 200 for zero
 * cells; a gate never passes on nothing). */
static const char *result_verdict(json_t *result)
{
    const char *verdict = json_string_value(json_object_get(result, "verdict"));
    if (!verdict || (strcmp(verdict, "pass") && strcmp(verdict, "regression"))) {
        fprintf(stderr, "capctl: the comparison has no verdict (pass or regression)\n");
        return NULL;
    }
    json_t *ncells = json_object_get(json_object_get(result, "counts"), "cells");
    if (!json_is_integer(ncells) || json_integer_value(ncells) == 0) {
        fprintf(stderr, "capctl: the comparison compared no cell; check --model, --width and "
                        "--pass against the job's cells (capctl status JOB)\n");
        return NULL;
    }
    return verdict;
}

/* The md or text rendering, pinned to the two jobs RESULT names. */
static int print_rendering(struct ctl_client *c, const struct ctl_args *a, const struct diff *d,
                           json_t *result)
{
    struct ctl_url u;
    const char *cj = json_string_value(json_object_get(json_object_get(result, "control"), "job"));
    const char *hj = json_string_value(json_object_get(json_object_get(result, "head"), "job"));
    if (!cj || !hj) {
        fprintf(stderr, "capctl: the comparison does not name its jobs\n");
        return CTL_EXIT_ERROR;
    }
    compare_url(c, a, d, cj, hj, d->format, &u);
    return ctl_print_url(c, u.buf, u.overflow);
}

/* 1 for a regression unless --fail-on never; --fail-on unknown also fails
 * on perf the comparison could not decide. */
static int verdict_exit(const struct diff *d, const char *verdict, json_t *result)
{
    json_t *counts = json_object_get(result, "counts");
    if (strcmp(d->fail_on, "unknown") == 0 &&
        json_integer_value(json_object_get(counts, "perf_unknown")) +
                json_integer_value(json_object_get(counts, "perf_unstable")) >
            0)
        return CTL_EXIT_REGRESSION;
    return strcmp(verdict, "regression") == 0 && strcmp(d->fail_on, "never") != 0
               ? CTL_EXIT_REGRESSION
               : CTL_EXIT_OK;
}

static int diff_run(struct ctl_client *c, const struct ctl_args *a, void *ctx)
{
    const struct diff *d = ctx;
    struct ctl_resp r = {0};
    struct ctl_url u;
    json_t *result = NULL;
    const char *verdict;
    int rc = CTL_EXIT_ERROR;
    result_url(c, a, d, &u);
    if (u.overflow)
        return ctl_usage_error(a->cmd, "the arguments are too long for a URL");
    if (ctl_fetch_settled(c, a->cmd, u.buf, d->wait_timeout, &r) != 0)
        goto out;
    result = ctl_resp_json(&r);
    ctl_resp_free(&r);
    if (!(verdict = result_verdict(result)))
        goto out;
    if (strcmp(d->format, "json") == 0)
        ctl_print_json(stdout, result);
    else if (print_rendering(c, a, d, result) != 0)
        goto out;
    fflush(stdout);
    rc = verdict_exit(d, verdict, result);
out:
    json_decref(result);
    ctl_resp_free(&r);
    return rc;
}

static const struct ctl_opt diff_opts[] = {
    {"control", CTL_VALUE, "X", "control side: a job id or a commit (its newest finished job)"},
    {"head", CTL_VALUE, "Y", "head side: a job id or a commit"},
    {"commit", CTL_VALUE, "SHA", "a head commit against its control (see below)"},
    {"job", CTL_VALUE, "J", "cross-width: compare two widths of one job (id or commit)"},
    {"control-width", CTL_VALUE, "W", "cross-width: the reference width (e.g. default)"},
    {"head-width", CTL_VALUE, "W", "cross-width: the width under test (e.g. avx512)"},
    CTL_OPTS_CELL(CTL_VALUE, "only cells of this model",
                  "only cells of this width (not with --job)", "only cells of this pass"),
    CTL_OPT_REFERENCE(
        CTL_VALUE,
        "judge tensors out of tolerance against this reference (default: the head job's option)"),
    {"format", CTL_VALUE, "md|json|text", "output (default text); the verdict is the same"},
    {"fail-on", CTL_VALUE, "regression|unknown|numerics|never",
     "exit 1 on a regression (default; perf only on a perf `regression`); unknown: also when a "
     "cell's perf is unknown or unstable; numerics: only on outcome or numeric ones, perf "
     "reported but not gating; never"},
    {"wait-timeout", CTL_VALUE, "S", "while a job is unfinished (409 pending), retry for S s"},
    CTL_OPT_END,
};

static const struct ctl_field_flag diff_fields[] = {
    {"control_commit", "--commit (the head job's control commit)"},
    {"sha", "--commit"},
    {NULL, NULL},
};

const struct ctl_cmd ctl_cmd_diff = {
    .name = "diff",
    .usage = "(--control X --head Y | --commit SHA | --job J --control-width W --head-width W)\n"
             "                   [--model M] [--width W] [--pass P] [--reference R]\n"
             "                   [--format md|json|text]\n"
             "                   [--fail-on regression|unknown|numerics|never] [--wait-timeout S]",
    .summary = "Compare a control and a head and exit with the verdict.",
    .details = "--commit SHA compares the newest job of SHA with the control its job names\n"
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
    .opts = diff_opts,
    .fields = diff_fields,
    .check = diff_check,
    .run = diff_run,
    .ctx_size = sizeof(struct diff),
};
