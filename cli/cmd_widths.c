/*
 * cli/cmd_widths.c - capctl widths: the width table and what this capd's
 * host can run (GET /v1/widths, GET /v1/host), and the self-checks of one
 * job, each with an exit code for a gate (cli/gate.c runs it): capctl
 * widths check (GET /v1/jobs/{id}/widths: each width against the job's own
 * default cells) and capctl modes check (GET /v1/jobs/{id}/modes: each
 * compiled mode against the job's own eager cells at the same width).
 */
#include <stdlib.h>
#include <string.h>

#include "cli/capctl.h"
#include "util/str.h"

/* "avx512f,avx512bw" from a JSON array of names, as many whole names as
 * fit; "-" when empty. */
static void join(json_t *arr, char *buf, size_t cap)
{
    size_t i, used = 0;
    json_t *v;
    buf[0] = 0;
    json_array_foreach(arr, i, v)
    {
        if (util_join(buf, cap, &used, ",", json_string_value(v)) != 0)
            break;
    }
    if (!buf[0])
        snprintf(buf, cap, "-");
}

static int print_host(struct ctl_client *c)
{
    json_t *h;
    if (ctl_call(c, "GET", "/v1/host", NULL, 200, &h) != 0)
        return CTL_EXIT_ERROR;
    char hidden[256], model[128];
    join(json_object_get(h, "hidden"), hidden, sizeof hidden);
    printf("host: %s, %s, %lld cores usable; hidden features: %s\n\n",
           json_string_value(json_object_get(h, "arch")),
           ctl_clean(json_string_value(json_object_get(h, "model")), model, sizeof model),
           (long long)json_integer_value(json_object_get(h, "cores_usable")), hidden);
    json_decref(h);
    return 0;
}

static int print_table(json_t *arr)
{
    static const char *const hdr[] = {"WIDTH", "ARCH", "REQUIRES", "HERE", "MISSING"};
    struct ctl_table *t = ctl_table_new(5, hdr);
    size_t i;
    json_t *w;
    json_array_foreach(arr, i, w)
    {
        char req[256];
        const char *missing = json_string_value(json_object_get(w, "missing"));
        join(json_object_get(w, "requires"), req, sizeof req);
        const char *row[] = {json_string_value(json_object_get(w, "name")),
                             json_string_value(json_object_get(w, "arch")), req,
                             json_is_true(json_object_get(w, "runnable_here")) ? "yes" : "no",
                             missing ? missing : "-"};
        ctl_table_row(t, row);
    }
    return ctl_table_emit(t, stdout);
}

/* --runnable: the names of the widths this host runs, for scripts; else
 * the host line and the table. */
static int print_widths(struct ctl_client *c, const struct ctl_args *a, json_t *arr)
{
    int rc = 0;
    if (ctl_has(a, "runnable")) {
        size_t i;
        json_t *w;
        json_array_foreach(arr, i, w)
        {
            if (json_is_true(json_object_get(w, "runnable_here")))
                printf("%s\n", json_string_value(json_object_get(w, "name")));
        }
    } else if ((rc = print_host(c)) == 0) {
        rc = print_table(arr);
    }
    return rc;
}

static const struct ctl_opt list_opts[] = {
    CTL_OPT_JSON_HELP("print the server's JSON (GET /v1/widths)"),
    {"runnable", CTL_FLAG, NULL, "print only the names of the widths this host runs, one a line"},
    CTL_OPT_END,
};

static const struct ctl_cmd cmd_list = {
    .name = "widths list",
    .usage = "[--json | --runnable]",
    .summary = "List the CPU dispatch widths: arch, the host CPU features each needs, and whether\n"
               "capd's host can run it (a width it cannot run ends its cells 'unsupported').",
    .details = "The host line names the CPU capd read at start and the features hidden by its\n"
               "cpu_features_hide setting (docs/widths.md).",
    .opts = list_opts,
    .list = {"/v1/widths", "widths", print_widths},
};

/* ---- widths check, modes check ---- */

/* The axis a self-check walks: its path under the job ("/widths",
 * "/modes"), its list in the result, and the hint when it compared no
 * cell. */
struct selfcheck {
    const char *path, *list, *none_hint;
};
static const struct selfcheck WIDTHS = {
    "/widths", "widths",
    ": no width's cells could be judged against default (capctl status JOB says why)"};
static const struct selfcheck MODES = {
    "/modes", "modes",
    ": no compiled cell could be judged against eager (capctl status JOB says why)"};

/* CTX is the struct ctl_gate. */
static int check_check(const struct ctl_args *a, void *ctx)
{
    static const char *const fail_on[] = {"diverged", "incomplete", "never", NULL};
    return ctl_gate_check(a, fail_on, ctx);
}

/* GET /v1/jobs/JOB/<X's path>, filtered, in FORMAT. */
static void check_url(struct ctl_client *c, const struct ctl_args *a, const struct selfcheck *x,
                      const char *job, const char *format, struct ctl_url *u)
{
    static const char *const keys[] = {"model", "pass", NULL};
    ctl_url_init(u, "/v1/jobs");
    ctl_url_seg(c, u, job);
    ctl_url_lit(u, x->path);
    ctl_url_query_args(c, u, a, keys);
    ctl_url_query(c, u, "format", format);
}

/* The cells the self-check compared, over all its widths (or modes: a
 * result has one of the lists). */
static json_int_t compared_cells(json_t *result)
{
    json_int_t compared = 0;
    size_t i;
    json_t *w;
    json_t *list = json_object_get(result, WIDTHS.list);
    json_array_foreach(list ? list : json_object_get(result, MODES.list), i, w)
    {
        compared += json_integer_value(json_object_get(json_object_get(w, "counts"), "compared"));
    }
    return compared;
}

/* The md or text rendering, pinned to the job the JSON named (JOB may be
 * a commit that gains a newer job meanwhile); CTX is the struct selfcheck. */
static int check_report_url(struct ctl_client *c, const struct ctl_args *a, const void *ctx,
                            json_t *result, const char *format, struct ctl_url *u)
{
    const char *job = json_string_value(json_object_get(result, "job"));
    if (!job) {
        fprintf(stderr, "capctl: the self-check does not name its job\n");
        return CTL_EXIT_ERROR;
    }
    check_url(c, a, ctx, job, format, u);
    return 0;
}

/* 1 for a diverged width unless --fail-on never; --fail-on incomplete
 * also fails on widths that could not all be judged. */
static int check_exit(const struct ctl_gate *g, const char *verdict, json_t *result)
{
    (void)result;
    if (strcmp(g->fail_on, "never") != 0 &&
        (strcmp(verdict, "diverged") == 0 ||
         (strcmp(verdict, "incomplete") == 0 && strcmp(g->fail_on, "incomplete") == 0)))
        return CTL_EXIT_REGRESSION;
    return CTL_EXIT_OK;
}

/* The self-check of axis X as a gate; CTX is the struct ctl_gate. */
static int selfcheck_run(struct ctl_client *c, const struct ctl_args *a, void *ctx,
                         const struct selfcheck *x)
{
    static const char *const verdicts[] = {"pass", "diverged", "incomplete", NULL};
    const struct ctl_gate_kind gate = {
        .what = "self-check",
        .verdicts = verdicts,
        .compared = compared_cells,
        .none_hint = x->none_hint,
        .report_url = check_report_url,
        .exit_code = check_exit,
    };
    struct ctl_url u;
    check_url(c, a, x, a->pos[0], "json", &u);
    return ctl_gate_run(c, a, ctx, &u, &gate, x);
}

static int check_run(struct ctl_client *c, const struct ctl_args *a, void *ctx)
{
    return selfcheck_run(c, a, ctx, &WIDTHS);
}

static int modes_run(struct ctl_client *c, const struct ctl_args *a, void *ctx)
{
    return selfcheck_run(c, a, ctx, &MODES);
}

static const struct ctl_opt check_opts[] = {
    {"model", CTL_VALUE, "M", "only cells of this model (an fnmatch pattern)"},
    {"pass", CTL_VALUE, "P", "only cells of this pass"},
    CTL_OPTS_GATE("diverged|incomplete|never",
                  "exit 1 when a width diverged (default); incomplete: also when a width's cells "
                  "could not all be judged; never"),
    CTL_OPT_END,
};

static const struct ctl_field_flag check_fields[] = {
    {"id", "JOB"},
    {NULL, NULL},
};

static const struct ctl_cmd cmd_check = {
    .name = "widths check",
    .usage = "JOB [--model M] [--pass P] [--format md|json|text]\n"
             "                   [--fail-on diverged|incomplete|never] [--wait-timeout S]",
    .summary = "Check each width of one job against its own default (scalar) cells, judged by\n"
               "the float64 reference when the job captured it, and exit with the verdict.",
    .details = "JOB is a job id or a commit (its newest finished job); it must have cells at\n"
               "width default. Submit it with --reference float64 (and --capture sample) so each\n"
               "width is judged by its error against float64, not by tolerance against default.\n\n"
               "exit codes: 0 every width passed (or incomplete, unless --fail-on incomplete),\n"
               "1 a width diverged (or, with --fail-on incomplete, could not be judged in full),\n"
               "2 error (bad flags, network, a server error, still pending, a job without a\n"
               "default cell, a --model or --pass that matches no cell, or no cell compared).\n\n"
               "example:\n"
               "  capctl widths check $JOB --format md > widths.md",
    .opts = check_opts,
    .min_pos = 1,
    .max_pos = 1,
    .fields = check_fields,
    .check = check_check,
    .run = check_run,
    .ctx_size = sizeof(struct ctl_gate),
};

/* The group's help names both subcommands; each has its own --help. */
const struct ctl_cmd ctl_cmd_widths = {
    .name = "widths",
    .usage =
        "usage: capctl widths [list] [--json | --runnable]\n"
        "       capctl widths check JOB [--model M] [--pass P] [--format md|json|text]\n"
        "                           [--fail-on diverged|incomplete|never] [--wait-timeout S]\n\n"
        "list: the CPU dispatch widths, the host CPU features each needs, and whether capd's\n"
        "host runs it (a width it cannot run ends its cells 'unsupported').\n"
        "check: each width of one job against its own default (scalar) cells; exit 1 when a\n"
        "width diverged.\n\n"
        "'capctl widths SUBCOMMAND --help' shows the flags of each.\n\n" CTL_GROUP_GLOBAL_OPTIONS,
    .subs = (const struct ctl_cmd *const[]){&cmd_list, &cmd_check, NULL},
};

static const struct ctl_opt modes_opts[] = {
    {"model", CTL_VALUE, "M", "only cells of this model (an fnmatch pattern)"},
    {"pass", CTL_VALUE, "P", "only cells of this pass"},
    CTL_OPTS_GATE("diverged|incomplete|never",
                  "exit 1 when a compiled mode diverged (default); incomplete: also when its "
                  "cells could not all be judged; never"),
    CTL_OPT_END,
};

static const struct ctl_cmd cmd_modes_check = {
    .name = "modes check",
    .usage = "JOB [--model M] [--pass P] [--format md|json|text]\n"
             "                  [--fail-on diverged|incomplete|never] [--wait-timeout S]",
    .summary = "Check each compiled mode of one job against its own eager cells at the same\n"
               "width, judged by the float64 reference when the job captured it, and exit with\n"
               "the verdict.",
    .details = "JOB is a job id or a commit (its newest finished job); its matrix.modes must\n"
               "hold eager and a compiled mode (aot_eager, inductor). Submit it with --reference\n"
               "float64 (and --capture sample) so a compiled cell is judged by its error against\n"
               "float64 beside the eager cell's, not by tolerance against eager.\n\n"
               "exit codes: 0 every mode passed (or incomplete, unless --fail-on incomplete),\n"
               "1 a mode diverged (or, with --fail-on incomplete, could not be judged in full),\n"
               "2 error (bad flags, network, a server error, still pending, a job without an\n"
               "eager cell or a compiled mode, a --model or --pass that matches no cell, or no\n"
               "cell compared).\n\n"
               "example:\n"
               "  capctl modes check $JOB --format md > modes.md",
    .opts = modes_opts,
    .min_pos = 1,
    .max_pos = 1,
    .fields = check_fields,
    .check = check_check,
    .run = modes_run,
    .ctx_size = sizeof(struct ctl_gate),
};

/* capctl modes: one subcommand, check. */
const struct ctl_cmd ctl_cmd_modes = {
    .name = "modes",
    .usage =
        "usage: capctl modes check JOB [--model M] [--pass P] [--format md|json|text]\n"
        "                          [--fail-on diverged|incomplete|never] [--wait-timeout S]\n\n"
        "check: each compiled mode of one job (aot_eager, inductor) against its own eager\n"
        "cells at the same width; exit 1 when a mode diverged.\n\n"
        "'capctl modes check --help' shows its flags.\n\n" CTL_GROUP_GLOBAL_OPTIONS,
    .subs = (const struct ctl_cmd *const[]){&cmd_modes_check, NULL},
};
