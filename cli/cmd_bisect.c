/*
 * cli/cmd_bisect.c - capctl bisect: start a bisection (POST /v1/bisect),
 * show one (GET /v1/bisect/{id}), wait for it, or cancel it. The commits
 * come from --commits, from git (--commits-from-git DIR runs
 * `git rev-list --first-parent --reverse GOOD..BAD` there) or from the
 * branch's history in capd (--branch alone). docs/history.md.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli/capctl.h"
#include "cli/provenance.h"

#define BISECT_POLL_S 0.5

static int bisect_check(const struct ctl_args *a, void *ctx)
{
    (void)ctx;
    if (a->npos == 1) {
        if (ctl_has(a, "cancel") && ctl_has(a, "wait"))
            return ctl_usage_error(a->cmd, "--cancel and --wait do not go together");
        return 0;
    }
    if (ctl_has(a, "cancel"))
        return ctl_usage_error(a->cmd, "--cancel needs a bisection ID");
    int rc = ctl_required(a, false);
    if (rc)
        return rc;
    if (ctl_has(a, "commits") && ctl_has(a, "commits-from-git"))
        return ctl_usage_error(a->cmd, "--commits and --commits-from-git do not go together");
    if (!ctl_has(a, "commits") && !ctl_has(a, "commits-from-git") && !ctl_has(a, "branch"))
        return ctl_usage_error(a->cmd,
                               "name the commits: --commits, --commits-from-git DIR or --branch");
    return 0;
}

/* "a,b" to ["a","b"]; an empty item is a usage error naming FLAG. */
static int split(const struct ctl_args *a, const char *flag, json_t **out)
{
    const char *s = ctl_arg(a, flag), *p = s;
    json_t *arr = json_array();
    for (;;) {
        const char *e = strchr(p, ',');
        size_t n = e ? (size_t)(e - p) : strlen(p);
        json_t *v = n ? json_stringn(p, n) : NULL;
        if (!v) {
            json_decref(arr);
            return ctl_usage_error(a->cmd, "--%s has an empty or non-UTF-8 item in '%s'", flag, s);
        }
        json_array_append_new(arr, v);
        if (!e)
            break;
        p = e + 1;
    }
    *out = arr;
    return 0;
}

/* The commits of the request, when the flags name them. */
static int commits_of(const struct ctl_args *a, json_t *body)
{
    json_t *list = NULL;
    const char *dir = ctl_arg(a, "commits-from-git");
    if (ctl_has(a, "commits")) {
        int rc = split(a, "commits", &list);
        if (rc)
            return rc;
    } else if (dir) {
        char *err = NULL;
        if (prov_rev_list(dir, ctl_arg(a, "good"), ctl_arg(a, "bad"), &list, &err) != 0) {
            fprintf(stderr, "capctl bisect: %s\n", err ? err : "git rev-list failed");
            free(err);
            return CTL_EXIT_ERROR;
        }
    }
    if (list)
        json_object_set_new(body, "commits", list);
    return 0;
}

static int bisect_body(const struct ctl_args *a, json_t **out)
{
    static const char *const strs[] = {"project", "build", "good", "bad", "branch", NULL};
    static const char *const axes[] = {"models", "widths", "passes"};
    json_t *body = json_object(), *matrix = json_object(), *opts = json_object();
    int rc = 0;
    for (size_t i = 0; strs[i]; i++)
        if (ctl_arg(a, strs[i]))
            json_object_set_new(body, strs[i], json_string(ctl_arg(a, strs[i])));
    for (size_t i = 0; i < 3 && !rc; i++) {
        json_t *l = NULL;
        if ((rc = split(a, axes[i], &l)) == 0)
            json_object_set_new(matrix, axes[i], l);
    }
    json_object_set_new(
        body, "predicate",
        json_string(ctl_arg(a, "predicate") ? ctl_arg(a, "predicate") : "numerics"));
    if (!rc && ctl_arg(a, "threshold")) {
        char *end = NULL;
        double t = strtod(ctl_arg(a, "threshold"), &end);
        if (!*ctl_arg(a, "threshold") || *end)
            rc = ctl_usage_error(a->cmd, "--threshold must be a number");
        json_object_set_new(body, "threshold", json_real(t));
    }
    long long it = 0;
    if (!rc && ctl_arg(a, "iterations") &&
        (rc = ctl_int_arg(a->cmd, "iterations", ctl_arg(a, "iterations"), 0, 1000000, &it)) == 0)
        json_object_set_new(opts, "iterations", json_integer((json_int_t)it));
    json_object_set(body, "matrix", matrix);
    json_object_set(body, "options", opts);
    if (!rc)
        rc = commits_of(a, body);
    json_decref(matrix);
    json_decref(opts);
    if (rc)
        json_decref(body);
    else
        *out = body;
    return rc;
}

/* A person's summary: state, rounds, each probe, the result. */
static int print_bisect(json_t *b)
{
    static const char *const hdr[] = {"ROUND", "COMMIT", "STATE", "JOB", "NOTE"};
    printf("bisection %s: %s, round %lld, %s over %lld commits (%.12s..%.12s)\n", ctl_jstr(b, "id"),
           ctl_jstr(b, "state"), (long long)json_integer_value(json_object_get(b, "round")),
           ctl_jstr(b, "predicate"),
           (long long)json_integer_value(json_object_get(b, "commit_count")), ctl_jstr(b, "good"),
           ctl_jstr(b, "bad"));
    struct ctl_table *t = ctl_table_new(5, hdr);
    size_t i;
    json_t *p;
    json_array_foreach(json_object_get(b, "probes"), i, p)
    {
        char round[16], c[16];
        snprintf(round, sizeof round, "%lld",
                 (long long)json_integer_value(json_object_get(p, "round")));
        snprintf(c, sizeof c, "%.12s", ctl_jstr(p, "commit"));
        const char *note = json_is_true(json_object_get(p, "reused")) ? "reused" : "";
        if (json_is_string(json_object_get(p, "skipped_reason")))
            note = ctl_jstr(p, "skipped_reason");
        const char *row[] = {round, c, ctl_jstr(p, "state"), ctl_jstr(p, "job"), note};
        ctl_table_row(t, row);
    }
    int rc = ctl_table_emit(t, stdout);
    json_t *res = json_object_get(b, "result");
    if (json_is_object(res))
        printf("first bad commit: %s (last good %s)%s\nevidence: verdict %s\n",
               ctl_jstr(res, "first_bad"), ctl_jstr(res, "last_good"),
               json_is_true(json_object_get(res, "exact")) ? "" : ", or a skipped one before it",
               ctl_jstr(json_object_get(res, "evidence"), "verdict"));
    if (json_is_string(json_object_get(b, "reason")))
        printf("reason: %s\n", ctl_jstr(b, "reason"));
    return rc;
}

/* Polls bisection ID until it is no longer running. */
static int wait_bisect(struct ctl_client *c, const struct ctl_args *a, const char *id, json_t **out)
{
    double timeout = 0, t0 = ctl_now_s();
    int rc = ctl_arg(a, "timeout")
                 ? ctl_seconds_arg(a->cmd, "timeout", ctl_arg(a, "timeout"), &timeout)
                 : 0;
    struct ctl_progress pg;
    ctl_progress_init(&pg);
    while (rc == 0) {
        json_t *b = NULL;
        if ((rc = ctl_get_object(c, a->cmd, "/v1/bisect", id, "bisection", &b)) != 0)
            break;
        char line[200];
        snprintf(line, sizeof line, "bisection %s: %s, round %lld", id, ctl_jstr(b, "state"),
                 (long long)json_integer_value(json_object_get(b, "round")));
        ctl_progress_show(&pg, line);
        if (strcmp(ctl_jstr(b, "state"), "running") != 0) {
            *out = b;
            break;
        }
        json_decref(b);
        if (timeout > 0 && ctl_now_s() - t0 > timeout) {
            fprintf(stderr, "capctl bisect: still running after %g s\n", timeout);
            rc = CTL_EXIT_ERROR;
            break;
        }
        ctl_sleep_s(BISECT_POLL_S);
    }
    ctl_progress_end(&pg);
    return rc;
}

static int finish(const struct ctl_args *a, json_t *b)
{
    int rc = ctl_has(a, "json") ? (ctl_print_json(stdout, b), 0) : print_bisect(b);
    if (rc == 0 && ctl_has(a, "wait") && strcmp(ctl_jstr(b, "state"), "done") != 0)
        rc = CTL_EXIT_NOT_OK;
    json_decref(b);
    return rc;
}

/* A POST whose reply must be the bisection: one that is not JSON is an
 * error too. */
static int post(struct ctl_client *c, const char *path, json_t *body, long want, json_t **out)
{
    int rc = ctl_call(c, "POST", path, body, want, out);
    return rc ? rc : *out ? 0 : CTL_EXIT_ERROR;
}

static int bisect_run(struct ctl_client *c, const struct ctl_args *a, void *ctx)
{
    (void)ctx;
    json_t *b = NULL, *body = NULL;
    char id[64];
    int rc;
    if (a->npos == 1 && ctl_has(a, "cancel")) {
        char path[128];
        snprintf(path, sizeof path, "/v1/bisect/%.40s/cancel", a->pos[0]);
        return (rc = post(c, path, NULL, 202, &b)) != 0 ? rc : finish(a, b);
    }
    if (a->npos == 1) {
        if ((rc = ctl_get_object(c, a->cmd, "/v1/bisect", a->pos[0], "bisection", &b)) != 0)
            return rc;
    } else {
        if ((rc = bisect_body(a, &body)) != 0)
            return rc;
        rc = post(c, "/v1/bisect", body, 201, &b);
        json_decref(body);
        if (rc)
            return rc;
    }
    snprintf(id, sizeof id, "%s", ctl_jstr(b, "id"));
    if (ctl_has(a, "wait")) {
        json_decref(b);
        b = NULL;
        if ((rc = wait_bisect(c, a, id, &b)) != 0)
            return rc;
    }
    return finish(a, b);
}

static const struct ctl_opt bisect_opts[] = {
    CTL_OPT_PROJECT(CTL_REQUIRED, "the project (required to start one)"),
    CTL_OPT_BUILD("the build, usually a template with {commit} (required)"),
    {"good", CTL_REQUIRED, "SHA", "a commit that is good (required)"},
    {"bad", CTL_REQUIRED, "SHA", "a later commit that is bad (required)"},
    {"commits", CTL_VALUE, "a,b,c", "the commits between them, oldest first"},
    {"commits-from-git", CTL_VALUE, "DIR",
     "take the commits from git: the first-parent line GOOD..BAD in DIR"},
    {"branch", CTL_VALUE, "B", "without commits: the commits of this branch's history"},
    CTL_OPTS_MATRIX("", "", "", "p,q"),
    {"predicate", CTL_VALUE, "P", "numerics (default), outcome or perf"},
    {"threshold", CTL_VALUE, "F", "perf: the slowdown that counts (default 0.05 = 5%)"},
    {"iterations", CTL_VALUE, "N", "timing iterations per process (0: numerics only)"},
    CTL_OPT_WAIT("wait until it ends and print the result"),
    {"timeout", CTL_VALUE, "S", "with --wait: give up after S seconds"},
    {"cancel", CTL_FLAG, NULL, "with an ID: cancel it"},
    CTL_OPT_JSON,
    CTL_OPT_END,
};

const struct ctl_cmd ctl_cmd_bisect = {
    .name = "bisect",
    .usage = "--project P --build B --good X --bad Y [--commits a,b,c | --commits-from-git DIR "
             "| --branch B] --models m --widths w --passes p [--predicate P] [--threshold F] "
             "[--wait [--timeout S]] [--json] | ID [--wait | --cancel] [--json]",
    .summary = "Find the first commit between a good and a bad one whose cells are bad by a\n"
               "predicate: numerics (diverged from good), outcome, or perf (slower than good by\n"
               "the threshold, paired). capd runs two commits a round and skips commits whose\n"
               "build does not start.",
    .details = "Exit status with --wait: 0 when it found the first bad commit, 3 when it failed\n"
               "or was cancelled, 2 on errors.",
    .opts = bisect_opts,
    .max_pos = 1,
    .check = bisect_check,
    .run = bisect_run,
};
