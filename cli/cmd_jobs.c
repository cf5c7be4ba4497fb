/*
 * cli/cmd_jobs.c - capctl submit: a capture job (POST /v1/jobs) from the
 * command line, with the build's provenance; --wait follows it with
 * ctl_wait_job (cli/cmd_wait.c).
 */
#include <errno.h>
#include <limits.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <time.h>
#include <unistd.h>

#include "cli/capctl.h"
#include "options_gen.h"
#include "cli/provenance.h"

#define CTL_MAX_PROVENANCE_WARNINGS 10

/* "a,b" to ["a","b"]; an empty item is a usage error naming FLAG. */
static int split_list(const struct ctl_cmd *cmd, const char *flag, const char *s, json_t **out)
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
            return ctl_usage_error(cmd, "--%s has an empty item in '%s'", flag, s);
        }
        json_t *v = json_stringn(p, n);
        if (!v) {
            json_decref(arr);
            return ctl_usage_error(cmd, "--%s is not valid UTF-8", flag);
        }
        json_array_append_new(arr, v);
        if (!e)
            break;
        p = e + 1;
    }
    *out = arr;
    return 0;
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

static int submit_matrix(const struct ctl_args *a, json_t *matrix)
{
    static const char *const axes[] = {"models", "widths", "passes", "modes"};
    for (int i = 0; i < 4; i++) {
        json_t *l = NULL;
        if (i == 3 && !ctl_arg(a, axes[i])) /* optional: eager */
            break;
        int rc = split_list(a->cmd, axes[i], ctl_arg(a, axes[i]), &l);
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

/* The field "options.FIELD" of the cell option --NAME sets: the one the
 * command's FIELDS pairs with it, else NAME with '_' for '-'. */
static void option_field(const struct ctl_cmd *cmd, const char *name, char *buf, size_t cap)
{
    char flag[64];
    snprintf(flag, sizeof flag, "--%s", name);
    for (const struct ctl_field_flag *m = cmd->fields; m && m->field; m++)
        if (strncmp(m->field, "options.", 8) == 0 && strcmp(m->flag, flag) == 0) {
            snprintf(buf, cap, "%s", m->field + 8);
            return;
        }
    snprintf(buf, cap, "%s", name);
    for (char *p = buf; *p; p++)
        *p = *p == '-' ? '_' : *p;
}

/* The cell options of the table's CTL_OPTION_* rows that were given:
 * integers' syntax is checked here, ranges by the server (its error names
 * the field; the hint names the flag). */
static int submit_options(const struct ctl_args *a, json_t *opts)
{
    for (const struct ctl_opt *o = ctl_opts_of(a->cmd); o->name; o++) {
        const char *v = ctl_arg(a, o->name);
        char field[64];
        long long n;
        json_t *j;
        if (!v || (o->kind != CTL_OPTION_INT && o->kind != CTL_OPTION_STR))
            continue;
        if (o->kind == CTL_OPTION_INT) {
            int rc = ctl_int_arg(a->cmd, o->name, v, 0, LLONG_MAX, &n);
            if (rc != 0)
                return rc;
            j = json_integer((json_int_t)n);
        } else if (!(j = json_string(v))) {
            return ctl_usage_error(a->cmd, "--%s is not valid UTF-8", o->name);
        }
        option_field(a->cmd, o->name, field, sizeof field);
        json_object_set_new(opts, field, j);
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
    int rc = ctl_required(a, true);
    if (rc != 0)
        goto out;
    rc = CTL_EXIT_ERROR;
    if (!matrix || !opts || !labels)
        goto out;
    if ((rc = submit_matrix(a, matrix)) != 0 || (rc = submit_options(a, opts)) != 0 ||
        (rc = ctl_pairs_arg(a, "label", "key=value", 128, false, labels)) != 0)
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
static const char *submit_post(struct ctl_client *c, const struct ctl_cmd *cmd,
                               const struct submit *s, json_t **job)
{
    struct ctl_resp r = {0};
    const char *hdrs[] = {s->idem_hdr, NULL};
    const char *id = NULL;
    char ib[64];
    if (ctl_request(c, "POST", "/v1/jobs", s->body, s->idem_hdr ? hdrs : NULL, &r) != 0 ||
        (r.status != 200 && r.status != 201)) {
        ctl_report_fields(c, &r, cmd);
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
    const char *id = submit_post(c, a->cmd, s, &job);
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

static const struct ctl_opt submit_opts[] = {
    CTL_OPT_PROJECT(CTL_REQUIRED, "project name (required)"),
    {"commit", CTL_REQUIRED, "SHA", "commit under test, 7 to 64 hex digits (required)"},
    CTL_OPT_BUILD("registered build to run (required)"),
    {"branch", CTL_VALUE, "BR", "branch of the commit"},
    {"control-commit", CTL_VALUE, "SHA", "commit to compare against (capctl diff --commit)"},
    CTL_OPTS_MATRIX("; GET /v1/models", "SIMD ", "; GET /v1/widths", "forward,backward"),
    {"modes", CTL_VALUE, "a,b",
     "compile modes: eager, aot_eager, inductor (default eager; docs/api.md, Compiled cells)"},
    {"iterations", CTL_OPTION_INT, "N",
     "timed iterations per cell (default " CAPD_OPTION_DEFAULT_iterations ")"},
    {"warmup", CTL_OPTION_INT, "N", "warm-up iterations (default " CAPD_OPTION_DEFAULT_warmup ")"},
    {"timing-min-ms", CTL_OPTION_INT, "MS",
     "least milliseconds a timing process's samples add up to (" CAPD_OPTION_DEFAULT_timing_min_ms
     ")"},
    {"timing-processes", CTL_OPTION_INT, "N",
     "separate timing processes per cell (default " CAPD_OPTION_DEFAULT_timing_processes ")"},
    {"timing-pairs", CTL_OPTION_INT, "N",
     "control/head pairs of the first round when paired (default " CAPD_OPTION_DEFAULT_timing_pairs
     ")"},
    {"max-timing-rounds", CTL_OPTION_INT, "N",
     "rounds of pairs at most while unknown (default " CAPD_OPTION_DEFAULT_max_timing_rounds ")"},
    {"threads", CTL_OPTION_INT, "N", "intra-op threads (default " CAPD_OPTION_DEFAULT_threads ")"},
    {"timeout", CTL_OPTION_INT, "S",
     "per-cell timeout in seconds (default " CAPD_OPTION_DEFAULT_timeout_s ")"},
    {"capture", CTL_OPTION_STR, CAPD_OPTION_VALUES_capture,
     "what is stored per tensor (default " CAPD_OPTION_DEFAULT_capture ")"},
    {"seed", CTL_OPTION_INT, "N", "random seed (default " CAPD_OPTION_DEFAULT_seed ")"},
    {"batch", CTL_OPTION_INT, "N", "batch size (default " CAPD_OPTION_DEFAULT_batch ")"},
    {"sample-size", CTL_OPTION_INT, "N",
     "elements kept per tensor with --capture sample (" CAPD_OPTION_DEFAULT_sample_size ")"},
    {"dtype", CTL_OPTION_STR, CAPD_OPTION_VALUES_dtype,
     "dtype of the model and its input (default " CAPD_OPTION_DEFAULT_dtype ")"},
    {"granularity", CTL_OPTION_STR, CAPD_OPTION_VALUES_granularity,
     "records per module, or per ATen op too (" CAPD_OPTION_DEFAULT_granularity ")"},
    {"replay", CTL_OPTION_STR, CAPD_OPTION_VALUES_replay,
     "replay where the error came in (the op, or at granularity module the layer): the first "
     "4 cells (auto), every one, none (default " CAPD_OPTION_DEFAULT_replay ")"},
    {"compiler-bisect", CTL_OPTION_STR, CAPD_OPTION_VALUES_compiler_bisect,
     "follow compiled cells that depart from eager with a compiler bisection: the first 4 "
     "(auto), none (off), or bisect instead of capturing (run; "
     "default " CAPD_OPTION_DEFAULT_compiler_bisect ")"},
    {"profile", CTL_OPTION_STR, CAPD_OPTION_VALUES_profile,
     "profiled pair after a paired cell's timing: when slower (auto), always, never "
     "(default " CAPD_OPTION_DEFAULT_profile ")"},
    CTL_OPT_REFERENCE(
        CTL_OPTION_STR,
        "the reference a tensor out of tolerance is judged against (" CAPD_OPTION_DEFAULT_reference
        ")"),
    {"label", CTL_MULTI, "k=v", "label stored with the job"},
    {"idempotency-key", CTL_VALUE, "K", "resubmitting with the same key returns the same job"},
    {"source-tree", CTL_VALUE, "DIR", "check the build's git source tree and send its provenance"},
    CTL_OPT_WAIT("wait for the job; exit 0 all cells ok, 3 some not ok, 2 error"),
    CTL_OPT_WAIT_TIMEOUT("with --wait: "),
    CTL_OPT_JSON_HELP("print the job as JSON (the final job with --wait)"),
    CTL_OPT_END,
};

/* The fields whose flag is not named like them: the rest (matrix.models,
 * options.seed, control_commit) are set by the option of their last part. */
static const struct ctl_field_flag submit_fields[] = {
    {"matrix", "--models, --widths, --passes and --modes"},
    {"options.timeout_s", "--timeout"},
    {"labels", "--label"},
    {"provenance", "--source-tree"},
    {"Idempotency-Key", "--idempotency-key"},
    {NULL, NULL},
};

static void submit_done(void *ctx)
{
    struct submit *s = ctx;
    json_decref(s->body);
    free(s->idem_hdr);
}

const struct ctl_cmd ctl_cmd_submit = {
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
    .fields = submit_fields,
    .check = submit_check,
    .run = submit_run,
    .ctx_size = sizeof(struct submit),
    .done = submit_done,
};
