/*
 * cli/cmd_diff.c - capctl diff: a comparison's verdict as an exit code.
 *
 * A gate (cli/gate.c): the verdict always comes from the JSON result, and
 * for --format md/text the rendering is fetched afterwards pinned to the
 * two job ids the JSON named. What is diff's own: the three forms of a
 * comparison (two sides, a commit against its control, two widths of one
 * job), the cell filters, and --fail-on's words.
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
    struct ctl_gate gate;
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
    static const char *const fail_on[] = {"regression", "unknown", "numerics", "never", NULL};
    struct diff *d = ctx;
    int rc = diff_form(a, d);
    return rc != 0 ? rc : ctl_gate_check(a, fail_on, &d->gate);
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

/* The cells a comparison compared. */
static json_int_t compared_cells(json_t *result)
{
    return json_integer_value(json_object_get(json_object_get(result, "counts"), "cells"));
}

/* The md or text rendering, pinned to the two jobs RESULT names. */
static int report_url(struct ctl_client *c, const struct ctl_args *a, const void *ctx,
                      json_t *result, const char *format, struct ctl_url *u)
{
    const char *cj = json_string_value(json_object_get(json_object_get(result, "control"), "job"));
    const char *hj = json_string_value(json_object_get(json_object_get(result, "head"), "job"));
    if (!cj || !hj) {
        fprintf(stderr, "capctl: the comparison does not name its jobs\n");
        return CTL_EXIT_ERROR;
    }
    compare_url(c, a, ctx, cj, hj, format, u);
    return 0;
}

/* 1 for a regression unless --fail-on never; --fail-on unknown also fails
 * on perf the comparison could not decide. */
static int verdict_exit(const struct ctl_gate *g, const char *verdict, json_t *result)
{
    json_t *counts = json_object_get(result, "counts");
    if (strcmp(g->fail_on, "unknown") == 0 &&
        json_integer_value(json_object_get(counts, "perf_unknown")) +
                json_integer_value(json_object_get(counts, "perf_unstable")) >
            0)
        return CTL_EXIT_REGRESSION;
    return strcmp(verdict, "regression") == 0 && strcmp(g->fail_on, "never") != 0
               ? CTL_EXIT_REGRESSION
               : CTL_EXIT_OK;
}

static const struct ctl_gate_kind diff_gate = {
    .what = "comparison",
    .verdicts = (const char *const[]){"pass", "regression", NULL},
    .compared = compared_cells,
    .none_hint = "; check --model, --width and --pass against the job's cells (capctl status JOB)",
    .report_url = report_url,
    .exit_code = verdict_exit,
};

static int diff_run(struct ctl_client *c, const struct ctl_args *a, void *ctx)
{
    const struct diff *d = ctx;
    struct ctl_url u;
    result_url(c, a, d, &u);
    return ctl_gate_run(c, a, &d->gate, &u, &diff_gate, d);
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
    CTL_OPTS_GATE("regression|unknown|numerics|never",
                  "exit 1 on a regression (default; perf only on a perf `regression`); unknown: "
                  "also when a cell's perf is unknown or unstable; numerics: only on outcome or "
                  "numeric ones, perf reported but not gating; never"),
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
