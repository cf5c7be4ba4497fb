/*
 * cli/cmd_builds.c - capctl builds [list|register|show]: the registered
 * ways of running the framework under test (/v1/builds).
 */
#include <stdlib.h>
#include <string.h>

#include "cli/capctl.h"

static const struct ctl_opt list_opts[] = {
    {"json", CTL_FLAG, NULL, "print the server's JSON"},
    {NULL, CTL_FLAG, NULL, NULL},
};

static const struct ctl_cmd cmd_list = {
    "builds list",
    "[--json]",
    "List the registered builds: name, interpreter and description.",
    NULL,
    list_opts,
    0,
    0,
};

static const struct ctl_opt register_opts[] = {
    {"name", CTL_VALUE, "N", "build name, [A-Za-z0-9._-]{1,64} (required)"},
    {"python", CTL_VALUE, "PATH", "absolute path of the interpreter (required)"},
    {"env", CTL_MULTI, "K=V", "environment variable for every cell of this build"},
    {"model-root", CTL_MULTI, "DIR", "directory user models may be imported from"},
    {"allow-env", CTL_MULTI, "NAME",
     "let --env set this loader/interpreter hook (LD_PRELOAD, PYTHONHOME, ...) on purpose"},
    {"description", CTL_VALUE, "D", "free text shown in 'capctl builds'"},
    {"replace", CTL_FLAG, NULL, "replace the build if it exists (PUT instead of POST)"},
    {"json", CTL_FLAG, NULL, "print the stored build as JSON"},
    {NULL, CTL_FLAG, NULL, NULL},
};

static const struct ctl_cmd cmd_register = {
    "builds register",
    "--name N --python PATH [--env K=V]... [--model-root DIR]... [--description D] [--replace]",
    "Register a build: the interpreter that runs cells and its environment.",
    "Without --replace an existing build of that name is an error (409); with it the build\n"
    "is replaced. The interpreter must exist and be executable on the capd host.\n\n"
    "example:\n"
    "  capctl builds register --name torch-main --python /opt/torch-main/bin/python \\\n"
    "      --env PYTHONPATH=/src/pytorch/build/lib --description 'main, gcc 12'",
    register_opts,
    0,
    0,
};

static const struct ctl_opt show_opts[] = {
    {"json", CTL_FLAG, NULL, "print the server's JSON"},
    {NULL, CTL_FLAG, NULL, NULL},
};

static const struct ctl_cmd cmd_show = {
    "builds show",
    "NAME [--json]",
    "Show one build: interpreter, environment, model roots.",
    NULL,
    show_opts,
    1,
    1,
};

static const struct ctl_field_flag build_fields[] = {
    {"name", "--name"},
    {"python", "--python"},
    {"env", "--env"},
    {"model_roots", "--model-root"},
    {"allow_env", "--allow-env"},
    {"description", "--description"},
    {NULL, NULL},
};

static void builds_help(FILE *f)
{
    fprintf(f,
            "usage: capctl builds [list] [--json]\n"
            "       capctl builds register --name N --python PATH [--env K=V]... "
            "[--model-root DIR]...\n"
            "                              [--description D] [--replace]\n"
            "       capctl builds show NAME [--json]\n\n"
            "A build is a registered way to run the framework under test: an interpreter and\n"
            "its environment. Jobs name builds; a job can never name an executable.\n\n"
            "'capctl builds SUBCOMMAND --help' shows the flags of each.\n\n"
            "global options:\n"
            "  --server URL  capd to talk to (default: $CAPD_SERVER, else %s)\n"
            "  --token T     bearer token (default: $CAPD_TOKEN)\n"
            "  --cacert FILE CA certificate(s) for an https:// server (default: $CAPD_CACERT)\n",
            CTL_DEFAULT_SERVER);
}

static int builds_list(int argc, char **argv)
{
    struct ctl_args a;
    struct ctl_client c = {0};
    struct ctl_resp r = {0};
    struct ctl_table *t = NULL;
    json_t *j = NULL;
    int rc = ctl_parse(&cmd_list, argc, argv, &a);
    if (rc) {
        rc = rc == 1 ? 0 : rc; /* 1: --help was printed */
        goto out;
    }
    if ((rc = ctl_client_open(&c, &a)) != 0)
        goto out;
    json_t *arr;
    if ((rc = ctl_get_list(&c, "/v1/builds", "builds", &r, &j, &arr)) != 0)
        goto out;
    rc = CTL_EXIT_ERROR;
    if (ctl_has(&a, "json")) {
        ctl_print_json(stdout, j);
        rc = 0;
        goto out;
    }
    if (json_array_size(arr) == 0) {
        fprintf(stderr, "no builds registered (see 'capctl builds register --help')\n");
        rc = 0;
        goto out;
    }
    static const char *const hdr[] = {"NAME", "PYTHON", "DESCRIPTION"};
    t = ctl_table_new(3, hdr);
    size_t i;
    json_t *b;
    json_array_foreach(arr, i, b)
    {
        const char *desc = json_string_value(json_object_get(b, "description"));
        const char *row[] = {json_string_value(json_object_get(b, "name")),
                             json_string_value(json_object_get(b, "python")),
                             desc && *desc ? desc : "-"};
        if (!t || ctl_table_row(t, row) != 0) {
            fprintf(stderr, "capctl: out of memory\n");
            goto out;
        }
    }
    ctl_table_print(t, stdout);
    rc = 0;
out:
    ctl_table_free(t);
    json_decref(j);
    ctl_resp_free(&r);
    ctl_client_close(&c);
    ctl_args_free(&a);
    return rc;
}

static int builds_register(int argc, char **argv)
{
    struct ctl_args a;
    struct ctl_client c = {0};
    struct ctl_resp r = {0};
    json_t *body = NULL, *env = NULL, *roots = NULL, *j = NULL;
    const char *v;
    int it = 0;
    int rc = ctl_parse(&cmd_register, argc, argv, &a);
    if (rc) {
        rc = rc == 1 ? 0 : rc; /* 1: --help was printed */
        goto out;
    }
    const char *name = ctl_arg(&a, "name"), *python = ctl_arg(&a, "python");
    rc = CTL_EXIT_ERROR;
    if (!name || !*name) {
        rc = ctl_usage_error(&cmd_register, "--name is required");
        goto out;
    }
    if (!python || !*python) {
        rc = ctl_usage_error(&cmd_register, "--python is required");
        goto out;
    }
    env = json_object();
    roots = json_array();
    if (!env || !roots)
        goto out;
    while ((v = ctl_arg_next(&a, "env", &it)) != NULL) {
        const char *eq = strchr(v, '=');
        if (!eq || eq == v) {
            rc = ctl_usage_error(&cmd_register, "--env expects NAME=VALUE, got '%s'", v);
            goto out;
        }
        char key[256];
        size_t n = (size_t)(eq - v);
        if (n >= sizeof key) {
            rc = ctl_usage_error(&cmd_register, "--env name is too long in '%.40s...'", v);
            goto out;
        }
        memcpy(key, v, n);
        key[n] = 0;
        if (json_object_get(env, key)) {
            rc = ctl_usage_error(&cmd_register, "--env %s given more than once", key);
            goto out;
        }
        json_t *s = json_string(eq + 1);
        if (!s) {
            rc = ctl_usage_error(&cmd_register, "--env %s: the value is not valid UTF-8", key);
            goto out;
        }
        json_object_set_new(env, key, s);
    }
    it = 0;
    while ((v = ctl_arg_next(&a, "model-root", &it)) != NULL) {
        json_t *s = json_string(v);
        if (!s || v[0] != '/') {
            json_decref(s);
            rc = ctl_usage_error(&cmd_register,
                                 "--model-root must be an absolute directory, got "
                                 "'%s'",
                                 v);
            goto out;
        }
        json_array_append_new(roots, s);
    }
    body = json_pack("{s:s?,s:s?,s:O,s:O}", "name", name, "python", python, "env", env,
                     "model_roots", roots);
    if (!body) {
        rc = ctl_usage_error(&cmd_register, "--name and --python must be valid UTF-8");
        goto out;
    }
    /* The server checks the names; capctl only passes them on. */
    it = 0;
    while ((v = ctl_arg_next(&a, "allow-env", &it)) != NULL) {
        json_t *arr = json_object_get(body, "allow_env");
        if (!arr)
            json_object_set_new(body, "allow_env", arr = json_array());
        json_array_append_new(arr, json_string(v));
    }
    const char *desc = ctl_arg(&a, "description");
    if (desc) {
        json_t *s = json_string(desc);
        if (!s) {
            rc = ctl_usage_error(&cmd_register, "--description is not valid UTF-8");
            goto out;
        }
        json_object_set_new(body, "description", s);
    }
    if ((rc = ctl_client_open(&c, &a)) != 0)
        goto out;
    rc = CTL_EXIT_ERROR;
    bool replace = ctl_has(&a, "replace");
    struct ctl_url u;
    ctl_url_init(&u, "/v1/builds");
    if (replace)
        ctl_url_seg(&c, &u, name);
    if (u.overflow) {
        rc = ctl_usage_error(&cmd_register, "--name is too long");
        goto out;
    }
    if (ctl_request(&c, replace ? "PUT" : "POST", u.buf, body, NULL, &r) != 0 ||
        (r.status != 200 && r.status != 201)) {
        ctl_report_fields(&c, &r, build_fields);
        if (r.status == 409 && !replace)
            fprintf(stderr, "capctl: build '%s' already exists (add --replace to replace it)\n",
                    name);
        goto out;
    }
    j = ctl_resp_json(&r);
    if (ctl_has(&a, "json")) {
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
    json_decref(body);
    json_decref(env);
    json_decref(roots);
    ctl_resp_free(&r);
    ctl_client_close(&c);
    ctl_args_free(&a);
    return rc;
}

static int builds_show(int argc, char **argv)
{
    struct ctl_args a;
    struct ctl_client c = {0};
    struct ctl_resp r = {0};
    json_t *j = NULL;
    char b[8400];
    int rc = ctl_parse(&cmd_show, argc, argv, &a);
    if (rc) {
        rc = rc == 1 ? 0 : rc; /* 1: --help was printed */
        goto out;
    }
    if ((rc = ctl_client_open(&c, &a)) != 0)
        goto out;
    rc = CTL_EXIT_ERROR;
    if ((rc = ctl_get_object(&c, &cmd_show, "/v1/builds", a.pos[0], "build name", &r, &j)) != 0)
        goto out;
    rc = CTL_EXIT_ERROR;
    if (ctl_has(&a, "json")) {
        ctl_print_json(stdout, j);
        rc = 0;
        goto out;
    }
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
    rc = 0;
out:
    json_decref(j);
    ctl_resp_free(&r);
    ctl_client_close(&c);
    ctl_args_free(&a);
    return rc;
}

int ctl_cmd_builds(int argc, char **argv)
{
    if (argc == 0 || argv[0][0] == '-') {
        if (argc > 0 && (strcmp(argv[0], "--help") == 0 || strcmp(argv[0], "-h") == 0)) {
            builds_help(stdout);
            return 0;
        }
        return builds_list(argc, argv);
    }
    if (strcmp(argv[0], "list") == 0)
        return builds_list(argc - 1, argv + 1);
    if (strcmp(argv[0], "register") == 0)
        return builds_register(argc - 1, argv + 1);
    if (strcmp(argv[0], "show") == 0)
        return builds_show(argc - 1, argv + 1);
    fprintf(stderr,
            "capctl builds: unknown subcommand '%s' (list, register or show; see 'capctl builds "
            "--help')\n",
            argv[0]);
    return CTL_EXIT_ERROR;
}
