/*
 * cli/cmd_builds.c - capctl builds [list|register|show]: the registered
 * ways of running the framework under test (/v1/builds).
 */
#include <stdlib.h>
#include <string.h>

#include "cli/capctl.h"

/* NAME, PYTHON, DESCRIPTION: one row a build; an empty list is no error,
 * it says how to register a build. */
static int print_builds(struct ctl_client *c, const struct ctl_args *a, json_t *arr)
{
    (void)c;
    (void)a;
    if (json_array_size(arr) == 0) {
        fprintf(stderr, "no builds registered (see 'capctl builds register --help')\n");
        return 0;
    }
    static const char *const hdr[] = {"NAME", "PYTHON", "DESCRIPTION"};
    struct ctl_table *t = ctl_table_new(3, hdr);
    size_t i;
    json_t *b;
    json_array_foreach(arr, i, b)
    {
        const char *desc = json_string_value(json_object_get(b, "description"));
        const char *row[] = {json_string_value(json_object_get(b, "name")),
                             json_string_value(json_object_get(b, "python")),
                             desc && *desc ? desc : "-"};
        ctl_table_row(t, row);
    }
    return ctl_table_emit(t, stdout);
}

/* --model-root DIR, repeated, into ROOTS: absolute paths only (the server
 * checks that the cell user can list them). */
static int register_roots(const struct ctl_args *a, json_t *roots)
{
    const char *v;
    int it = 0;
    while ((v = ctl_arg_next(a, "model-root", &it)) != NULL) {
        json_t *s = json_string(v);
        if (!s || v[0] != '/') {
            json_decref(s);
            return ctl_usage_error(a->cmd, "--model-root must be an absolute directory, got '%s'",
                                   v);
        }
        json_array_append_new(roots, s);
    }
    return 0;
}

/* The optional parts of the body: --allow-env names (the server checks
 * them; capctl only passes them on) and --description. */
static int register_extras(const struct ctl_args *a, json_t *body)
{
    const char *v;
    int it = 0;
    while ((v = ctl_arg_next(a, "allow-env", &it)) != NULL) {
        json_t *arr = json_object_get(body, "allow_env");
        if (!arr)
            json_object_set_new(body, "allow_env", arr = json_array());
        json_array_append_new(arr, json_string(v));
    }
    const char *desc = ctl_arg(a, "description");
    if (desc) {
        json_t *s = json_string(desc);
        if (!s)
            return ctl_usage_error(a->cmd, "--description is not valid UTF-8");
        json_object_set_new(body, "description", s);
    }
    return 0;
}

/* The request body, built from the flags before the network is touched;
 * CTX is the json_t * it goes into. */
static int register_check(const struct ctl_args *a, void *ctx)
{
    json_t **body = ctx;
    const char *name = ctl_arg(a, "name"), *python = ctl_arg(a, "python");
    int rc = ctl_required(a, true);
    if (rc)
        return rc;
    json_t *env = json_object(), *roots = json_array();
    rc = CTL_EXIT_ERROR;
    if (!env || !roots)
        goto out;
    if ((rc = ctl_pairs_arg(a, "env", "NAME=VALUE", 256, true, env)) != 0 ||
        (rc = register_roots(a, roots)) != 0)
        goto out;
    *body = json_pack("{s:s?,s:s?,s:O,s:O}", "name", name, "python", python, "env", env,
                      "model_roots", roots);
    if (!*body)
        rc = ctl_usage_error(a->cmd, "--name and --python must be valid UTF-8");
    else
        rc = register_extras(a, *body);
out:
    json_decref(env);
    json_decref(roots);
    return rc;
}

/* POST /v1/builds, or PUT /v1/builds/NAME with --replace; a 409 without
 * --replace says how to replace the build. */
static int register_run(struct ctl_client *c, const struct ctl_args *a, void *ctx)
{
    json_t *body = *(json_t **)ctx, *j = NULL;
    struct ctl_resp r = {0};
    const char *name = ctl_arg(a, "name");
    bool replace = ctl_has(a, "replace");
    struct ctl_url u;
    ctl_url_init(&u, "/v1/builds");
    if (replace)
        ctl_url_seg(c, &u, name);
    if (u.overflow)
        return ctl_usage_error(a->cmd, "--name is too long");
    int rc = CTL_EXIT_ERROR;
    if (ctl_request(c, replace ? "PUT" : "POST", u.buf, body, NULL, &r) != 0 ||
        (r.status != 200 && r.status != 201)) {
        ctl_report_fields(c, &r, a->cmd);
        if (r.status == 409 && !replace)
            fprintf(stderr, "capctl: build '%s' already exists (add --replace to replace it)\n",
                    name);
        goto out;
    }
    j = ctl_resp_json(&r);
    if (ctl_has(a, "json")) {
        ctl_print_json(stdout, j);
    } else {
        char b1[256], b2[4200];
        printf("%s build %s (python %s)\n", replace ? "replaced" : "registered",
               ctl_jtext(json_object_get(j, "name"), b1, sizeof b1),
               ctl_jtext(json_object_get(j, "python"), b2, sizeof b2));
    }
    rc = 0;
out:
    json_decref(j);
    ctl_resp_free(&r);
    return rc;
}

/* "NAME value" lines; a list (an object's entries, an array's items)
 * takes one line per entry, continued under the first, and "-" when empty. */
static void print_build(json_t *j)
{
    char b[8400];
    printf("name         %s\n", ctl_jtext(json_object_get(j, "name"), b, sizeof b));
    printf("python       %s\n", ctl_jtext(json_object_get(j, "python"), b, sizeof b));
    const char *desc = json_string_value(json_object_get(j, "description"));
    printf("description  %s\n", desc && *desc ? ctl_clean(desc, b, sizeof b) : "-");
    const char *k;
    json_t *v;
    bool first = true;
    json_object_foreach(json_object_get(j, "env"), k, v)
    {
        char kb[300];
        printf("%s%s=%s\n", first ? "env          " : "             ", ctl_clean(k, kb, sizeof kb),
               ctl_jtext(v, b, sizeof b));
        first = false;
    }
    if (first)
        printf("env          -\n");
    size_t i;
    first = true;
    json_array_foreach(json_object_get(j, "model_roots"), i, v)
    {
        printf("%s%s\n", first ? "model roots  " : "             ", ctl_jtext(v, b, sizeof b));
        first = false;
    }
    if (first)
        printf("model roots  -\n");
    printf("created      %s\n", ctl_jtext(json_object_get(j, "created_at"), b, sizeof b));
    printf("updated      %s\n", ctl_jtext(json_object_get(j, "updated_at"), b, sizeof b));
}

static const struct ctl_cmd cmd_list = {
    .name = "builds list",
    .usage = "[--json]",
    .summary = "List the registered builds: name, interpreter and description.",
    .opts = ctl_json_opts,
    .list = {"/v1/builds", "builds", print_builds},
};

static const struct ctl_opt register_opts[] = {
    {"name", CTL_REQUIRED, "N", "build name, [A-Za-z0-9._-]{1,64} (required)"},
    {"python", CTL_REQUIRED, "PATH", "absolute path of the interpreter (required)"},
    {"env", CTL_MULTI, "K=V", "environment variable for every cell of this build"},
    {"model-root", CTL_MULTI, "DIR", "directory user models may be imported from"},
    {"allow-env", CTL_MULTI, "NAME",
     "let --env set this loader/interpreter hook (LD_PRELOAD, PYTHONHOME, ...) on purpose"},
    {"description", CTL_VALUE, "D", "free text shown in 'capctl builds'"},
    {"replace", CTL_FLAG, NULL, "replace the build if it exists (PUT instead of POST)"},
    CTL_OPT_JSON_HELP("print the stored build as JSON"),
    CTL_OPT_END,
};

static const struct ctl_field_flag register_fields[] = {
    {"model_roots", "--model-root"},
    {NULL, NULL},
};

static void register_done(void *ctx)
{
    json_decref(*(json_t **)ctx);
}

static const struct ctl_cmd cmd_register = {
    .name = "builds register",
    .usage =
        "--name N --python PATH [--env K=V]... [--model-root DIR]... [--description D] [--replace]",
    .summary = "Register a build: the interpreter that runs cells and its environment.",
    .details =
        "Without --replace an existing build of that name is an error (409); with it the build\n"
        "is replaced. The interpreter must exist and be executable on the capd host.\n\n"
        "example:\n"
        "  capctl builds register --name torch-main --python /opt/torch-main/bin/python \\\n"
        "      --env PYTHONPATH=/src/pytorch/build/lib --description 'main, gcc 12'",
    .opts = register_opts,
    .fields = register_fields,
    .check = register_check,
    .run = register_run,
    .ctx_size = sizeof(json_t *),
    .done = register_done,
};

static const struct ctl_cmd cmd_show = {
    .name = "builds show",
    .usage = "NAME [--json]",
    .summary = "Show one build: interpreter, environment, model roots.",
    .show = {"/v1/builds", "build name", print_build},
};

/* The group's help names every subcommand; each has its own --help. */
const struct ctl_cmd ctl_cmd_builds = {
    .name = "builds",
    .usage =
        "usage: capctl builds [list] [--json]\n"
        "       capctl builds register --name N --python PATH [--env K=V]... "
        "[--model-root DIR]...\n"
        "                              [--description D] [--replace]\n"
        "       capctl builds show NAME [--json]\n\n"
        "A build is a registered way to run the framework under test: an interpreter and\n"
        "its environment. Jobs name builds; a job can never name an executable.\n\n"
        "'capctl builds SUBCOMMAND --help' shows the flags of each.\n\n" CTL_GROUP_GLOBAL_OPTIONS,
    .subs = (const struct ctl_cmd *const[]){&cmd_list, &cmd_register, &cmd_show, NULL},
};
