/* test_capctl.c: capctl, the command-line client (cli/).
 *
 * The provenance classifiers are unit-tested directly (cli/provenance.c is
 * compiled into this test: the test target does not link cli/). Everything
 * else runs the built capctl binary as a real process against a real capd
 * on an ephemeral port, capturing its stdout/stderr into files, and checks
 * what the server stored or answered through HTTP independently of capctl.
 */
#include <criterion/criterion.h>

#include <errno.h>
#include <fcntl.h>
#include <libgen.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "cli/kernelmap.c"
#include "cli/provenance.c"
#include "storage/store.h"
#include "tests/helpers/common/testutil.h"

/* ======================================================================
 * Unit tests: provenance classifiers
 * ==================================================================== */

Test(provenance, generated_source_each_capability)
{
    static const char *const caps[] = {"DEFAULT", "AVX2",   "AVX512",      "VSX",
                                       "ZVECTOR", "SVE256", "AVX512_BF16", NULL};
    for (int i = 0; caps[i]; i++) {
        char name[128];
        int depth = -1;
        snprintf(name, sizeof name, "Activation.cpp.%s.cpp", caps[i]);
        cr_assert(prov_is_generated_source(name, &depth), "%s should match", name);
        cr_assert_eq(depth, 1, "%s: depth %d", name, depth);
    }
}

Test(provenance, generated_source_stacked)
{
    int depth = 0;
    cr_assert(prov_is_generated_source("X.cpp.DEFAULT.cpp.DEFAULT.cpp", &depth));
    cr_assert_eq(depth, 2);
    cr_assert(
        prov_is_generated_source("UpSampleKernel.cpp.AVX2.cpp.DEFAULT.cpp.AVX512.cpp", &depth));
    cr_assert_eq(depth, 3);
    cr_assert(
        prov_is_generated_source("a.cpp.DEFAULT.cpp.DEFAULT.cpp.DEFAULT.cpp.DEFAULT.cpp", &depth));
    cr_assert_eq(depth, 4);
}

Test(provenance, generated_source_non_matching)
{
    static const char *const names[] = {
        "Activation.cpp",          /* the tracked source itself */
        "Activation.cpp.avx2.cpp", /* capability not upper case */
        ".cpp.AVX2.cpp",           /* no stem */
        "Activation.h.AVX2.cpp",   /* wraps a header, not a .cpp */
        "Activation.cpp.AVX2.cpp.orig",
        "Activation.AVX2.cpp", /* not wrapping a .cpp */
        "Activation.cpp.AVX2.h",
        "Activation.cpp.2AVX.cpp", /* a capability starts with a letter */
        "Activation.cpp..cpp",     /* empty capability */
        "Activation.cpp.Avx2.cpp", /* mixed case */
        "AVX2.cpp",
        "",
        NULL,
    };
    for (int i = 0; names[i]; i++) {
        int depth = -1;
        cr_assert_not(prov_is_generated_source(names[i], &depth), "'%s' should not match",
                      names[i]);
        cr_assert_eq(depth, 0);
    }
}

Test(provenance, stale_header_paths)
{
    cr_assert(prov_is_stale_header("aten/src/ATen/Config.h"));
    cr_assert(prov_is_stale_header("aten/src/ATen/cuda/CUDAConfig.h"));
    cr_assert(prov_is_stale_header("aten/src/ATen/CUDAConfig.h"));
    cr_assert(prov_is_stale_header("fork/aten/src/ATen/Config.h"));
    cr_assert_not(prov_is_stale_header("aten/src/ATen/Config.h.in"));
    cr_assert_not(prov_is_stale_header("aten/src/ATen/MyConfig.h"));
    cr_assert_not(prov_is_stale_header("caffe2/Config.h"));
    cr_assert_not(prov_is_stale_header("Config.h"));
    cr_assert_not(prov_is_stale_header("xaten/src/ATen/Config.h"));
    cr_assert_not(prov_is_stale_header("aten/src/ATenX/Config.h"));
}

static int classify(const char *line, struct prov_finding *f)
{
    static const char *const subs[] = {"third_party/gloo", "third_party/protobuf"};
    return prov_classify_status_line(line, subs, 2, f);
}

/* Classifies LINE, which must be a finding: of KIND (PROV_NONE: any), at
 * PATH (NULL: any), whose message says SAYS (NULL: anything). */
static struct prov_finding finding(const char *line, enum prov_kind kind, const char *path,
                                   const char *says)
{
    struct prov_finding f;
    cr_assert_eq(classify(line, &f), 1, "'%s' should be a finding", line);
    if (kind != PROV_NONE)
        cr_assert_eq(f.kind, kind, "'%s': kind %s", line, prov_kind_name(f.kind));
    if (path)
        cr_assert_str_eq(f.path, path, "'%s'", line);
    if (says)
        cr_assert(strstr(f.message, says), "'%s': %s", line, f.message);
    return f;
}

Test(provenance, status_untracked_generated_source)
{
    struct prov_finding f =
        finding("?? aten/src/ATen/native/cpu/Activation.cpp.DEFAULT.cpp", PROV_GENERATED_SOURCE,
                "aten/src/ATen/native/cpu/Activation.cpp.DEFAULT.cpp", "untracked");
    cr_assert_str_eq(prov_kind_name(f.kind), "generated_source");
    cr_assert(strstr(f.message, "aten/src/ATen/native/cpu/Activation.cpp.DEFAULT.cpp"), "%s",
              f.message);

    finding("!! aten/src/ATen/native/cpu/Activation.cpp.AVX512.cpp", PROV_GENERATED_SOURCE, NULL,
            "ignored");
    finding("?? aten/src/ATen/native/cpu/X.cpp.DEFAULT.cpp.DEFAULT.cpp", PROV_NONE, NULL,
            "wrapped 2 times");

    /* Anywhere in the tree, not only native/cpu. */
    cr_assert_eq(classify("?? other/dir/K.cpp.VSX.cpp", &f), 1);
}

Test(provenance, status_lines_that_are_not_findings)
{
    struct prov_finding f;
    /* Tracked (modified, added, deleted) generated names are the project's own. */
    cr_assert_eq(classify(" M aten/src/ATen/native/cpu/Activation.cpp.DEFAULT.cpp", &f), 0);
    cr_assert_eq(classify("A  aten/src/ATen/native/cpu/Activation.cpp.AVX2.cpp", &f), 0);
    cr_assert_eq(classify("?? aten/src/ATen/native/cpu/Activation.cpp", &f), 0);
    cr_assert_eq(classify("?? build/", &f), 0);
    cr_assert_eq(classify("!! build/", &f), 0);
    cr_assert_eq(classify("?? aten/src/ATen/Config.h.in", &f), 0);
    cr_assert_eq(classify(" M aten/src/ATen/Config.h", &f), 0);
    cr_assert_eq(classify(" M third_party/gloo2", &f), 0);
    cr_assert_eq(classify(" M third_party/gloo/file.c", &f), 0);
    cr_assert_eq(f.kind, PROV_NONE);
}

Test(provenance, status_stale_headers)
{
    struct prov_finding f = finding("!! aten/src/ATen/Config.h", PROV_STALE_HEADER,
                                    "aten/src/ATen/Config.h", "ignored");
    cr_assert_str_eq(prov_kind_name(f.kind), "stale_header");
    finding("?? aten/src/ATen/cuda/CUDAConfig.h", PROV_STALE_HEADER, NULL, "untracked");
    cr_assert_eq(classify("?? caffe2/core/Config.h", &f), 0);
}

Test(provenance, status_dirty_submodule)
{
    struct prov_finding f = finding(" M third_party/gloo", PROV_DIRTY_SUBMODULE, "third_party/gloo",
                                    "third_party/gloo");
    cr_assert_str_eq(prov_kind_name(f.kind), "dirty_submodule");
    finding("M  third_party/protobuf", PROV_DIRTY_SUBMODULE, NULL, NULL);
    /* Without the list of submodules the same line is nothing. */
    cr_assert_eq(prov_classify_status_line(" M third_party/gloo", NULL, 0, &f), 0);
}

Test(provenance, status_quoted_and_renamed_paths)
{
    finding("?? \"aten/src/ATen/native/cpu/we ird\\t.cpp.AVX2.cpp\"", PROV_NONE,
            "aten/src/ATen/native/cpu/we ird\t.cpp.AVX2.cpp", NULL);
    /* Octal escapes of UTF-8 bytes (core.quotePath). */
    finding("?? \"d/\\303\\251.cpp.DEFAULT.cpp\"", PROV_NONE, "d/\xc3\xa9.cpp.DEFAULT.cpp", NULL);
    /* A rename onto a submodule path: the new path counts. */
    finding("R  old/name -> third_party/gloo", PROV_NONE, "third_party/gloo", NULL);
    finding("R  \"old x\" -> \"third_party/protobuf\"", PROV_NONE, "third_party/protobuf", NULL);

    char out[64];
    const char *end;
    cr_assert_eq(prov_unquote_path("a b -> c", " -> ", out, sizeof out, &end), 0);
    cr_assert_str_eq(out, "a b");
    cr_assert_str_eq(end, " -> c");
    cr_assert_eq(prov_unquote_path("\"unterminated", NULL, out, sizeof out, &end), -EINVAL);
    cr_assert_eq(prov_unquote_path("\"bad \\q\"", NULL, out, sizeof out, &end), -EINVAL);
    cr_assert_eq(prov_unquote_path("\"nul \\000\"", NULL, out, sizeof out, &end), -EINVAL);
    cr_assert_eq(prov_unquote_path("0123456789", NULL, out, 5, &end), -ENAMETOOLONG);
}

Test(provenance, status_malformed_lines)
{
    struct prov_finding f;
    static const char *const bad[] = {
        "", "??", "?? ", "??x path", "ZZ path", "?\tpath", "?? \"open", "R  a-without-arrow", NULL};
    for (int i = 0; bad[i]; i++)
        cr_assert_eq(classify(bad[i], &f), -EINVAL, "'%s' should be malformed", bad[i]);
}

Test(provenance, submodule_lines)
{
    struct prov_finding f;
    char path[256];
    const char *sha = "b77ef64ebf02a9c86b7cdabc58ba37df40f74c93";
    char line[512];

    snprintf(line, sizeof line, " %s third_party/gloo (heads/main)", sha);
    cr_assert_eq(prov_classify_submodule_line(line, &f, path, sizeof path), 0);
    cr_assert_str_eq(path, "third_party/gloo");
    cr_assert_eq(f.kind, PROV_NONE);

    snprintf(line, sizeof line, "+%s third_party/ideep (v2.7-3-gabcdef1)", sha);
    cr_assert_eq(prov_classify_submodule_line(line, &f, path, sizeof path), 1);
    cr_assert_eq(f.kind, PROV_DIRTY_SUBMODULE);
    cr_assert_str_eq(f.path, "third_party/ideep");
    cr_assert(strstr(f.message, "b77ef64ebf02"), "%s", f.message);

    snprintf(line, sizeof line, "-%s third_party/fbgemm", sha);
    cr_assert_eq(prov_classify_submodule_line(line, &f, path, sizeof path), 1);
    cr_assert_str_eq(path, "third_party/fbgemm");
    cr_assert(strstr(f.message, "not initialized"), "%s", f.message);

    cr_assert_eq(prov_classify_submodule_line(
                     "U0000000000000000000000000000000000000000 third_party/protobuf", &f, path,
                     sizeof path),
                 1);
    cr_assert_str_eq(f.path, "third_party/protobuf");
    cr_assert(strstr(f.message, "conflict"), "%s", f.message);

    /* A path with parentheses of its own keeps them. */
    snprintf(line, sizeof line, " %s third_party/odd (x) (heads/main)", sha);
    cr_assert_eq(prov_classify_submodule_line(line, &f, path, sizeof path), 0);
    cr_assert_str_eq(path, "third_party/odd (x)");

    static const char *const bad[] = {
        "", "x1234567 path", "+zzzzzzz path", "+abcdef1", "+abc path", "+abcdef1 ", NULL};
    for (int i = 0; bad[i]; i++)
        cr_assert_eq(prov_classify_submodule_line(bad[i], &f, path, sizeof path), -EINVAL,
                     "'%s' should be malformed", bad[i]);
}

/* ======================================================================
 * Integration: the capctl binary against a real capd
 * ==================================================================== */

extern char **environ;

struct run {
    int code;
    char *out;
    char *err;
};

static void run_free(struct run *r)
{
    free(r->out);
    free(r->err);
    memset(r, 0, sizeof *r);
}

static char *capctl_path(void)
{
    char *bin = strdup(tu_bin("CAPD_BIN"));
    char *p = NULL;
    cr_assert(bin && *bin, "CAPD_BIN is not set");
    if (asprintf(&p, "%s/capctl", dirname(bin)) < 0)
        p = NULL;
    free(bin);
    cr_assert_not_null(p);
    cr_assert_eq(access(p, X_OK), 0, "capctl is not built at %s (build the capctl target)", p);
    return p;
}

static char *slurp(const char *path)
{
    FILE *f = fopen(path, "rb");
    cr_assert_not_null(f, "cannot open %s", path);
    fseek(f, 0, SEEK_END);
    long n = ftell(f);
    rewind(f);
    char *b = malloc((size_t)n + 1);
    cr_assert_not_null(b);
    cr_assert_eq(fread(b, 1, (size_t)n, f), (size_t)n);
    b[n] = 0;
    fclose(f);
    return b;
}

/* Runs capctl ARGV (NULL-terminated, after the program name) with the
 * environment minus CAPD_SERVER/CAPD_TOKEN/CAPD_DATA_DIR, plus
 * CAPD_DATA_DIR=DIR/data (so capctl finds the admin token capd wrote
 * there, as a local user's would) and ENV (may be NULL; a later entry
 * wins); output goes to files in DIR. */
static void run_capctl(struct run *r, const char *dir, const char *const *env,
                       const char *const *args)
{
    static int seq;
    char out[512], err[512];
    const char *argv[64];
    const char *envp[512];
    int a = 0, e = 0;
    char *prog = capctl_path();
    memset(r, 0, sizeof *r);
    seq++;
    snprintf(out, sizeof out, "%s/capctl-%d.out", dir, seq);
    snprintf(err, sizeof err, "%s/capctl-%d.err", dir, seq);
    argv[a++] = prog;
    for (int i = 0; args[i] && a < 63; i++)
        argv[a++] = args[i];
    argv[a] = NULL;
    char data_dir[600];
    snprintf(data_dir, sizeof data_dir, "CAPD_DATA_DIR=%s/data", dir);
    for (int i = 0; environ[i] && e < 500; i++)
        if (strncmp(environ[i], "CAPD_SERVER=", 12) && strncmp(environ[i], "CAPD_TOKEN=", 11) &&
            strncmp(environ[i], "CAPD_DATA_DIR=", 14))
            envp[e++] = environ[i];
    bool own_dir = false;
    for (int i = 0; env && env[i]; i++)
        own_dir = own_dir || strncmp(env[i], "CAPD_DATA_DIR=", 14) == 0;
    if (!own_dir)
        envp[e++] = data_dir;
    for (int i = 0; env && env[i] && e < 510; i++)
        envp[e++] = env[i];
    envp[e] = NULL;
    pid_t pid;
    int rc = tu_spawn_to_files(&pid, argv, envp, out, err);
    cr_assert_eq(rc, 0, "cannot spawn %s: %s", prog, strerror(rc));
    int st = 0;
    while (waitpid(pid, &st, 0) < 0 && errno == EINTR)
        ;
    r->code = WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
    r->out = slurp(out);
    r->err = slurp(err);
    free(prog);
}

/* capctl --server BASE and the NULL-terminated ARGS in AP. */
static void vctl(struct run *r, const struct tu_capd *c, va_list ap)
{
    const char *args[60];
    int n = 0;
    args[n++] = "--server";
    args[n++] = c->base;
    const char *s;
    while ((s = va_arg(ap, const char *)) != NULL && n < 59)
        args[n++] = s;
    args[n] = NULL;
    run_capctl(r, c->dir, NULL, args);
}

/* capctl --server BASE ARGS... (NULL-terminated varargs). */
static void ctl(struct run *r, const struct tu_capd *c, ...)
{
    va_list ap;
    va_start(ap, c);
    vctl(r, c, ap);
    va_end(ap);
}

/* A run shown in a failed assertion. */
#define SHOW(r) "exit %d\n--- stdout\n%s\n--- stderr\n%s", (r).code, (r).out, (r).err

/* Checks that run R exited CODE with each of the strings after TEXT (R's
 * stdout or stderr; the list ended by NULL) in TEXT, then frees R. */
static void expect_says(struct run *r, int code, const char *text, ...) __attribute__((sentinel));
static void expect_says(struct run *r, int code, const char *text, ...)
{
    cr_assert_eq(r->code, code, SHOW(*r));
    va_list ap;
    va_start(ap, text);
    for (const char *s = va_arg(ap, const char *); s; s = va_arg(ap, const char *))
        cr_assert(strstr(text, s), "lacks \"%s\": " SHOW(*r), s);
    va_end(ap);
    run_free(r);
}

/* Runs capctl against C with the ARGS in AP and checks it exits CODE
 * with SAYS in its stdout (ON_STDOUT) or its stderr. */
static void vexpect(const struct tu_capd *c, int code, bool on_stdout, const char *says, va_list ap)
{
    struct run r;
    vctl(&r, c, ap);
    expect_says(&r, code, on_stdout ? r.out : r.err, says, NULL);
}

/* Runs capctl with ARGS exactly (no --server added) and ENV (may be NULL)
 * and checks it exits CODE with SAYS (NULL: anything) in its stderr. */
static void expect_argv(const struct tu_capd *c, const char *const *env, const char *const *args,
                        int code, const char *says)
{
    struct run r;
    run_capctl(&r, c->dir, env, args);
    expect_says(&r, code, r.err, says, NULL);
}

/* Runs capctl against C with the NULL-terminated ARGS after SAYS and
 * checks it exits 2 (refused before anything is done) with SAYS in its
 * stderr. */
static void expect_exit2(const struct tu_capd *c, const char *says, ...)
{
    va_list ap;
    va_start(ap, says);
    vexpect(c, 2, false, says, ap);
    va_end(ap);
}

/* Runs capctl against C with the NULL-terminated ARGS after SAYS and
 * checks it exits CODE with SAYS in its stdout. */
static void expect_stdout(const struct tu_capd *c, int code, const char *says, ...)
{
    va_list ap;
    va_start(ap, says);
    vexpect(c, code, true, says, ap);
    va_end(ap);
}

/* The arguments of a valid one-cell submit of build "t". */
#define SUBMIT_BASE                                                                                \
    "submit", "--project", "p", "--commit", "abcdef1", "--build", "t", "--models", "mlp",          \
        "--widths", "default", "--passes", "forward"

static void start(struct tu_capd *c)
{
    cr_assert_eq(tu_capd_start(c, NULL, NULL), 0, "capd did not start");
}

/* A runner script in the test's directory: an executable the build can
 * name as its interpreter. */
static char *write_script(const struct tu_capd *c, const char *name, const char *body)
{
    char *p = NULL;
    cr_assert(asprintf(&p, "%s/%s", c->dir, name) > 0);
    FILE *f = fopen(p, "w");
    cr_assert_not_null(f);
    fprintf(f, "#!/bin/sh\n%s\n", body);
    fclose(f);
    cr_assert_eq(chmod(p, 0755), 0);
    return p;
}

static void register_build(const struct tu_capd *c, const char *name, const char *python)
{
    struct run r;
    ctl(&r, c, "builds", "register", "--name", name, "--python", python, NULL);
    cr_assert_eq(r.code, 0, SHOW(r));
    run_free(&r);
}

/* capd started in C with build "t", whose cells exit at once (/bin/true):
 * jobs are accepted and end without a frame. */
static void start_true(struct tu_capd *c)
{
    start(c);
    register_build(c, "t", "/bin/true");
}

/* Registers build "slow" on C, whose runner is a shell script of BODY (its
 * cells take as long as BODY says and end as it says). */
static void slow_build(const struct tu_capd *c, const char *body)
{
    char *slow = write_script(c, "slow.sh", body);
    register_build(c, "slow", slow);
    free(slow);
}

/* Submits through capctl and returns the job id printed on stdout. */
static char *submit(const struct tu_capd *c, const char *build, const char *commit,
                    const char *models, const char *widths)
{
    struct run r;
    ctl(&r, c, "submit", "--project", "p", "--commit", commit, "--build", build, "--models", models,
        "--widths", widths, "--passes", "forward", NULL);
    cr_assert_eq(r.code, 0, SHOW(r));
    r.out[strcspn(r.out, "\n")] = 0;
    cr_assert_eq(r.out[0], 'j', SHOW(r));
    char *id = strdup(r.out);
    run_free(&r);
    return id;
}

/* capd started in C with build "slow" of BODY (slow_build) and a job of
 * model mlp on it at COMMIT over WIDTHS; returns the job's id. */
static char *slow_job(struct tu_capd *c, const char *body, const char *commit, const char *widths)
{
    start(c);
    slow_build(c, body);
    return submit(c, "slow", commit, "mlp", widths);
}

static json_t *get_job(const struct tu_capd *c, const char *id)
{
    char path[128];
    long st = 0;
    snprintf(path, sizeof path, "/v1/jobs/%s", id);
    json_t *j = tu_json(c, "GET", path, NULL, &st);
    cr_assert_eq(st, 200, "GET %s: %ld", path, st);
    return j;
}

static void wait_done(const struct tu_capd *c, const char *id)
{
    json_t *j = tu_wait_job(c, id, 60);
    cr_assert_not_null(j, "job %s did not finish", id);
    json_decref(j);
}

static const char *jget(json_t *o, const char *k)
{
    return json_string_value(json_object_get(o, k));
}

/* ---- global behaviour ---- */

Test(capctl, version_help_and_bad_commands, .timeout = 60)
{
    struct tu_capd c;
    start(&c);
    struct run r;
    ctl(&r, &c, "--version", NULL);
    cr_assert_eq(r.code, 0, SHOW(r));
    cr_assert(strncmp(r.out, "capctl ", 7) == 0, SHOW(r));
    run_free(&r);

    static const char *const cmds[][3] = {
        {"builds", "--help", NULL},   {"builds", "register", "--help"},
        {"builds", "list", "--help"}, {"builds", "show", "--help"},
        {"submit", "--help", NULL},   {"status", "--help", NULL},
        {"wait", "--help", NULL},     {"diff", "--help", NULL},
        {"cancel", "--help", NULL},
    };
    for (size_t i = 0; i < sizeof cmds / sizeof cmds[0]; i++) {
        ctl(&r, &c, cmds[i][0], cmds[i][1], cmds[i][2], NULL);
        expect_says(&r, 0, r.out, "usage: capctl", "--server", NULL);
    }
    ctl(&r, &c, "submit", "--help", NULL);
    cr_assert(strstr(r.out, "--source-tree"), SHOW(r));
    cr_assert(strstr(r.out, "--idempotency-key"), SHOW(r));
    run_free(&r);

    expect_exit2(&c, "unknown command 'frobnicate'", "frobnicate", NULL);

    const char *const noargs[] = {NULL};
    expect_argv(&c, NULL, noargs, 2, "usage:");
    tu_capd_stop(&c);
}

Test(capctl, server_from_env_flag_after_command_and_unreachable, .timeout = 60)
{
    struct tu_capd c;
    start(&c);
    char env[300], tok[200];
    snprintf(env, sizeof env, "CAPD_SERVER=%s", c.base);
    snprintf(tok, sizeof tok, "CAPD_TOKEN=%s", c.token);
    const char *const envs[] = {env, tok, "CAPD_DATA_DIR=/nonexistent", NULL};
    const char *const list[] = {"builds", NULL};
    expect_argv(&c, envs, list, 0, NULL);

    /* --server after the command; a server nothing listens on. */
    const char *const dead[] = {"builds",  "list",         "--server", "http://127.0.0.1:1",
                                "--token", "s3cr3t-token", NULL};
    struct run r;
    run_capctl(&r, c.dir, NULL, dead);
    cr_assert_eq(r.code, 2, SHOW(r));
    cr_assert(strstr(r.err, "cannot reach capd at http://127.0.0.1:1"), SHOW(r));
    cr_assert_null(strstr(r.err, "s3cr3t"), "the token was printed: " SHOW(r));
    cr_assert_null(strstr(r.out, "s3cr3t"), "the token was printed: " SHOW(r));
    run_free(&r);

    const char *const badurl[] = {"--server", "ftp://x", "builds", NULL};
    expect_argv(&c, NULL, badurl, 2, "--server must be an http:// or https:// URL");
    tu_capd_stop(&c);
}

/* Where capctl finds its token: --token, then CAPD_TOKEN, then
 * DATA/admin.token (--data-dir, CAPD_DATA_DIR); a wrong earlier one is not
 * replaced by a later one, and without any the server's 401 is shown. */
Test(capctl, token_from_flag_env_then_the_data_dirs_file, .timeout = 60)
{
    struct tu_capd c;
    start(&c);
    struct run r;
    char data[400], dd[420], tok[200];
    snprintf(data, sizeof data, "%s/data", c.dir);
    snprintf(dd, sizeof dd, "--data-dir=%s", data);
    snprintf(tok, sizeof tok, "CAPD_TOKEN=%s", c.token);
    cr_assert_eq(strlen(c.token), STORE_TOKEN_LEN, "capd wrote DATA/admin.token");
    const char *const nodir[] = {"CAPD_DATA_DIR=/nonexistent", NULL};
    const char *const list[] = {"--server", c.base, "builds", NULL};
    run_capctl(&r, c.dir, NULL, list); /* CAPD_DATA_DIR=DATA */
    cr_assert_eq(r.code, 0, SHOW(r));
    run_free(&r);
    run_capctl(&r, c.dir, nodir, list);
    cr_assert_eq(r.code, 2, "no token anywhere: " SHOW(r));
    cr_assert(strstr(r.err, "unauthorized"), SHOW(r));
    run_free(&r);
    const char *const flag_dir[] = {"--server", c.base, dd, "builds", NULL};
    run_capctl(&r, c.dir, nodir, flag_dir);
    cr_assert_eq(r.code, 0, "--data-dir wins over CAPD_DATA_DIR: " SHOW(r));
    run_free(&r);
    const char *const wrong[] = {"--server", c.base, "--token", "capd_t000000000000_00",
                                 "builds",   NULL};
    run_capctl(&r, c.dir, NULL, wrong);
    cr_assert_eq(r.code, 2, "--token wins over the file: " SHOW(r));
    run_free(&r);
    const char *const env_tok[] = {tok, "CAPD_DATA_DIR=/nonexistent", NULL};
    run_capctl(&r, c.dir, env_tok, list);
    cr_assert_eq(r.code, 0, "CAPD_TOKEN: " SHOW(r));
    cr_assert_null(strstr(r.out, c.token + 19), "the token was printed: " SHOW(r));
    cr_assert_null(strstr(r.err, c.token + 19), "the token was printed: " SHOW(r));
    run_free(&r);

    /* A loader hook in a build's env needs --allow-env. */
    const char *const hook[] = {"--server", c.base,     "builds",    "register", "--name",
                                "h",        "--python", "/bin/true", "--env",    "LD_PRELOAD=/x.so",
                                NULL};
    run_capctl(&r, c.dir, NULL, hook);
    cr_assert_eq(r.code, 2, SHOW(r));
    cr_assert(strstr(r.err, "forbidden_env") && strstr(r.err, "LD_PRELOAD"), SHOW(r));
    run_free(&r);
    const char *const allowed[] = {
        "--server",  c.base,  "builds",           "register",    "--name",     "h", "--python",
        "/bin/true", "--env", "LD_PRELOAD=/x.so", "--allow-env", "LD_PRELOAD", NULL};
    run_capctl(&r, c.dir, NULL, allowed);
    cr_assert_eq(r.code, 0, SHOW(r));
    run_free(&r);
    tu_capd_stop(&c);
}

/* ---- builds ---- */

Test(capctl, builds_register_list_show_replace, .timeout = 60)
{
    struct tu_capd c;
    start(&c);
    struct run r;
    expect_stdout(&c, 0, "registered build torch-main", "builds", "register", "--name",
                  "torch-main", "--python", "/bin/true", "--env", "PYTHONPATH=/src/build/lib",
                  "--env", "EXTRA=a=b", "--model-root", "/usr/lib", "--description", "main, gcc 12",
                  NULL);

    long st;
    json_t *b = tu_json(&c, "GET", "/v1/builds/torch-main", NULL, &st);
    cr_assert_eq(st, 200);
    cr_assert_str_eq(jget(b, "python"), "/bin/true");
    cr_assert_str_eq(jget(b, "description"), "main, gcc 12");
    cr_assert_str_eq(jget(json_object_get(b, "env"), "PYTHONPATH"), "/src/build/lib");
    cr_assert_str_eq(jget(json_object_get(b, "env"), "EXTRA"), "a=b");
    cr_assert_str_eq(json_string_value(json_array_get(json_object_get(b, "model_roots"), 0)),
                     "/usr/lib");
    json_decref(b);

    ctl(&r, &c, "builds", NULL);
    expect_says(&r, 0, r.out, "NAME", "DESCRIPTION", "torch-main", "main, gcc 12", NULL);

    ctl(&r, &c, "builds", "show", "torch-main", NULL);
    expect_says(&r, 0, r.out, "PYTHONPATH=/src/build/lib", "/usr/lib", NULL);

    ctl(&r, &c, "builds", "list", "--json", NULL);
    cr_assert_eq(r.code, 0, SHOW(r));
    json_t *j = json_loads(r.out, 0, NULL);
    cr_assert_str_eq(jget(json_array_get(json_object_get(j, "builds"), 0), "name"), "torch-main");
    json_decref(j);
    run_free(&r);

    /* Registering again without --replace is refused, with the way out. */
    expect_exit2(&c, "--replace", "builds", "register", "--name", "torch-main", "--python",
                 "/bin/false", NULL);
    ctl(&r, &c, "builds", "register", "--name", "torch-main", "--python", "/bin/false", "--replace",
        "--description", "now false", NULL);
    cr_assert_eq(r.code, 0, SHOW(r));
    run_free(&r);
    b = tu_json(&c, "GET", "/v1/builds/torch-main", NULL, &st);
    cr_assert_str_eq(jget(b, "python"), "/bin/false");
    cr_assert_str_eq(jget(b, "description"), "now false");
    json_decref(b);

    /* Errors: the server's, with its field; ours, naming the flag. */
    ctl(&r, &c, "builds", "register", "--name", "x", "--python", "relative/python", NULL);
    cr_assert_eq(r.code, 2, SHOW(r));
    cr_assert(strstr(r.err, "capctl: python must be an absolute path to an interpreter "
                            "(invalid_field, field python)"),
              SHOW(r));
    cr_assert_null(strstr(r.err, "is set by"), SHOW(r));
    run_free(&r);
    ctl(&r, &c, "builds", "register", "--name", "x", "--python", "/bin/true", "--model-root",
        "/usr/../lib", NULL);
    expect_says(&r, 2, r.err, "(invalid_field, field model_roots)",
                "capctl: model_roots is set by --model-root\n", NULL);
    expect_exit2(&c, "--env expects NAME=VALUE", "builds", "register", "--name", "x", "--python",
                 "/bin/true", "--env", "NOEQUALS", NULL);
    /* --env's limits: a name past 255 bytes, a name given twice, a value
     * that is not UTF-8; each refused before the request, naming the flag. */
    char long_name[300];
    memset(long_name, 'K', 256);
    snprintf(long_name + 256, sizeof long_name - 256, "=v");
    const char *const env_bad[][3] = {
        {long_name, NULL, "--env name is too long in 'KKKK"},
        {"A=1", "A=2", "--env A given more than once"},
        {"A=\xff", NULL, "--env A: the value is not valid UTF-8"},
    };
    for (size_t i = 0; i < sizeof env_bad / sizeof env_bad[0]; i++) {
        ctl(&r, &c, "builds", "register", "--name", "x", "--python", "/bin/true", "--env",
            env_bad[i][0], env_bad[i][1] ? "--env" : NULL, env_bad[i][1], NULL);
        cr_assert_eq(r.code, 2, SHOW(r));
        cr_assert(strstr(r.err, env_bad[i][2]), SHOW(r));
        run_free(&r);
    }
    expect_exit2(&c, "--name is required", "builds", "register", "--python", "/bin/true", NULL);
    expect_exit2(&c, "capctl: build not found (/v1/builds/nope) (not_found)", "builds", "show",
                 "nope", NULL);
    expect_exit2(&c, "unknown subcommand 'remove'", "builds", "remove", NULL);
    tu_capd_stop(&c);
}

/* ---- submit and status ---- */

Test(capctl, submit_with_every_flag_and_status, .timeout = 120)
{
    struct tu_capd c;
    start_true(&c);
    struct run r;
    const char *const args[] = {"--server",
                                c.base,
                                "submit",
                                "--project",
                                "proj",
                                "--commit",
                                "abcdef1234",
                                "--build",
                                "t",
                                "--branch",
                                "feature/x",
                                "--control-commit",
                                "1234567abc",
                                "--models",
                                "mlp,cnn",
                                "--widths",
                                "default,avx2",
                                "--passes",
                                "forward,backward",
                                "--iterations",
                                "5",
                                "--warmup",
                                "1",
                                "--threads",
                                "2",
                                "--timeout",
                                "30",
                                "--capture",
                                "sample",
                                "--seed",
                                "7",
                                "--batch",
                                "3",
                                "--dtype",
                                "float64",
                                "--sample-size",
                                "64",
                                "--granularity",
                                "op",
                                "--reference",
                                "float64",
                                "--label",
                                "ci=yes",
                                "--label",
                                "pr=42",
                                "--idempotency-key",
                                "key-1",
                                NULL};
    run_capctl(&r, c.dir, NULL, args);
    cr_assert_eq(r.code, 0, SHOW(r));
    char id[64];
    snprintf(id, sizeof id, "%.*s", (int)strcspn(r.out, "\n"), r.out);
    cr_assert_eq(id[0], 'j', SHOW(r));
    cr_assert_eq(strlen(r.out), strlen(id) + 1, "stdout should be the id alone: " SHOW(r));
    run_free(&r);

    json_t *j = get_job(&c, id);
    cr_assert_str_eq(jget(j, "project"), "proj");
    cr_assert_str_eq(jget(j, "commit"), "abcdef1234");
    cr_assert_str_eq(jget(j, "build"), "t");
    cr_assert_str_eq(jget(j, "branch"), "feature/x");
    cr_assert_str_eq(jget(j, "control_commit"), "1234567abc");
    json_t *m = json_object_get(j, "matrix");
    cr_assert_eq(json_array_size(json_object_get(m, "models")), 2);
    cr_assert_str_eq(json_string_value(json_array_get(json_object_get(m, "models"), 1)), "cnn");
    cr_assert_str_eq(json_string_value(json_array_get(json_object_get(m, "widths"), 1)), "avx2");
    cr_assert_str_eq(json_string_value(json_array_get(json_object_get(m, "passes"), 1)),
                     "backward");
    cr_assert_eq(json_array_size(json_object_get(j, "cells")), 8);
    json_t *o = json_object_get(j, "options");
    cr_assert_eq(json_integer_value(json_object_get(o, "iterations")), 5);
    cr_assert_eq(json_integer_value(json_object_get(o, "warmup")), 1);
    cr_assert_eq(json_integer_value(json_object_get(o, "threads")), 2);
    cr_assert_eq(json_integer_value(json_object_get(o, "timeout_s")), 30);
    cr_assert_eq(json_integer_value(json_object_get(o, "seed")), 7);
    cr_assert_eq(json_integer_value(json_object_get(o, "batch")), 3);
    cr_assert_eq(json_integer_value(json_object_get(o, "sample_size")), 64);
    cr_assert_str_eq(jget(o, "capture"), "sample");
    cr_assert_str_eq(jget(o, "dtype"), "float64");
    cr_assert_str_eq(jget(o, "granularity"), "op");
    cr_assert_str_eq(jget(o, "reference"), "float64");
    cr_assert_str_eq(jget(json_object_get(j, "labels"), "ci"), "yes");
    cr_assert_str_eq(jget(json_object_get(j, "labels"), "pr"), "42");
    json_decref(j);

    /* The same idempotency key gives the same job back, and says so. */
    run_capctl(&r, c.dir, NULL, args);
    cr_assert_eq(r.code, 0, SHOW(r));
    cr_assert(strncmp(r.out, id, strlen(id)) == 0, SHOW(r));
    cr_assert(strstr(r.err, "already existed"), SHOW(r));
    run_free(&r);

    /* The same key with another request is a conflict, named by flag. */
    ctl(&r, &c, "submit", "--project", "proj", "--commit", "abcdef9999", "--build", "t", "--models",
        "mlp", "--widths", "default", "--passes", "forward", "--idempotency-key", "key-1", NULL);
    expect_says(&r, 2, r.err, "(idempotency_conflict, field Idempotency-Key)",
                "set by --idempotency-key", NULL);

    /* --json prints the job. */
    ctl(&r, &c, "submit", "--project", "p", "--commit", "abcdef2", "--build", "t", "--models",
        "mlp", "--widths", "default", "--passes", "forward", "--json", NULL);
    cr_assert_eq(r.code, 0, SHOW(r));
    j = json_loads(r.out, 0, NULL);
    cr_assert_not_null(j, SHOW(r));
    cr_assert_str_eq(jget(j, "commit"), "abcdef2");
    cr_assert_eq(jget(j, "id")[0], 'j');
    json_decref(j);
    run_free(&r);

    wait_done(&c, id);
    ctl(&r, &c, "status", id, NULL);
    expect_says(&r, 0, r.out, id, "(done)", "feature/x", "ci=yes", "MODEL", "DURATION", "REASON",
                "cnn", "backward", "failed", "without an end frame", NULL);

    ctl(&r, &c, "status", id, "--json", NULL);
    cr_assert_eq(r.code, 0, SHOW(r));
    j = json_loads(r.out, 0, NULL);
    cr_assert_str_eq(jget(j, "id"), id);
    cr_assert_eq(json_array_size(json_object_get(j, "cells")), 8);
    json_decref(j);
    run_free(&r);
    tu_capd_stop(&c);
}

Test(capctl, bad_flags_name_the_flag, .timeout = 60)
{
    struct tu_capd c;
    start_true(&c);
    struct run r;

    expect_exit2(&c, "unknown flag '--bogus'", SUBMIT_BASE, "--bogus", "1", NULL);

    expect_exit2(&c, "--project is required", "submit", "--commit", "abcdef1", "--build", "t",
                 NULL);

    expect_exit2(&c, "--iterations expects an integer, got 'lots'", SUBMIT_BASE, "--iterations",
                 "lots", NULL);

    /* A range only the server knows: its error, then the flag behind it. */
    ctl(&r, &c, SUBMIT_BASE, "--iterations", "99999999", NULL);
    expect_says(&r, 2, r.err, "(invalid_field, field options.iterations)", "set by --iterations",
                NULL);

    ctl(&r, &c, SUBMIT_BASE, "--timeout", "0", NULL);
    expect_says(&r, 2, r.err, "field options.timeout_s", "set by --timeout", NULL);

    expect_exit2(&c, "--models has an empty item", "submit", "--project", "p", "--commit",
                 "abcdef1", "--build", "t", "--models", "mlp,,cnn", "--widths", "default",
                 "--passes", "forward", NULL);

    ctl(&r, &c, "submit", "--project", "p", "--commit", "abcdef1", "--build", "t", "--models",
        "mlp", "--widths", "avx9", "--passes", "forward", NULL);
    expect_says(&r, 2, r.err, "field matrix.widths", "--widths",
                "capctl: matrix.widths is set by --widths\n", NULL);

    expect_exit2(&c, "--label expects key=value", SUBMIT_BASE, "--label", "novalue", NULL);
    expect_exit2(&c, "capctl: options.reference is set by --reference\n", SUBMIT_BASE,
                 "--reference", "float32", NULL);
    expect_exit2(&c, "capctl: options.granularity is set by --granularity\n", SUBMIT_BASE,
                 "--granularity", "kernel", NULL);
    char long_key[200];
    memset(long_key, 'k', 128);
    snprintf(long_key + 128, sizeof long_key - 128, "=v");
    expect_exit2(&c, "--label expects key=value, got 'kkkk", SUBMIT_BASE, "--label", long_key,
                 NULL);
    expect_exit2(&c, "--label k given more than once", SUBMIT_BASE, "--label", "k=1", "--label",
                 "k=2", NULL);

    expect_exit2(&c, "--models given more than once", SUBMIT_BASE, "--models", "cnn", NULL);

    expect_exit2(&c, "--project needs a value", "submit", "--project", NULL);

    expect_exit2(&c, "--format must be md, json or text", "diff", "--control", "a", "--head", "b",
                 "--format", "xml", NULL);

    expect_exit2(&c, "--head", "diff", "--control", "a", NULL);

    expect_exit2(&c, "exactly one of", "diff", "--commit", "abcdef1", "--job", "j1", NULL);

    expect_exit2(&c, "--head-width is missing", "diff", "--job", "j1", "--control-width", "default",
                 NULL);

    expect_exit2(&c, "--fail-on must be regression, unknown, numerics or never", "diff", "--commit",
                 "abcdef1", "--fail-on", "sometimes", NULL);

    expect_exit2(&c, "missing argument", "wait", NULL);

    /* Nothing reached the server. */
    long st;
    json_t *jobs = tu_json(&c, "GET", "/v1/jobs", NULL, &st);
    cr_assert_eq(json_array_size(json_object_get(jobs, "jobs")), 0);
    json_decref(jobs);
    tu_capd_stop(&c);
}

Test(capctl, unknown_job_prints_the_server_message, .timeout = 60)
{
    struct tu_capd c;
    start(&c);
    struct run r;
    ctl(&r, &c, "status", "jdoesnotexist", NULL);
    cr_assert_eq(r.code, 2, SHOW(r));
    cr_assert(strstr(r.err, "capctl: job not found (/v1/jobs/jdoesnotexist) (not_found)"), SHOW(r));
    cr_assert_str_eq(r.out, "");
    run_free(&r);
    expect_exit2(&c, "capctl: job not found (/v1/jobs/jdoesnotexist) (not_found)", "wait",
                 "jdoesnotexist", NULL);
    /* A path-like id stays one path segment. */
    expect_exit2(&c, "not_found", "status", "../builds", NULL);
    ctl(&r, &c, "diff", "--control", "jnope", "--head", "jnope2", NULL);
    cr_assert_eq(r.code, 2, SHOW(r));
    cr_assert(strstr(r.err, "capctl: no job or commit 'jnope' (not_found, field control)"),
              SHOW(r));
    cr_assert_null(strstr(r.err, "is set by"), SHOW(r));
    run_free(&r);
    tu_capd_stop(&c);
}

/* ---- waiting ---- */

/* Lines of S that contain NEEDLE; also checks no two consecutive lines
 * are equal (one line per change when stderr is not a terminal). */
static int progress_lines(const char *s, const char *needle)
{
    int n = 0;
    char prev[512] = "";
    for (const char *p = s; *p;) {
        size_t l = strcspn(p, "\n");
        char line[512];
        snprintf(line, sizeof line, "%.*s", (int)l, p);
        if (strstr(line, needle)) {
            cr_assert_str_neq(line, prev, "a progress line was repeated:\n%s", s);
            n++;
        }
        snprintf(prev, sizeof prev, "%s", line);
        p += l + (p[l] == '\n');
    }
    return n;
}

Test(capctl, submit_wait_exit_3_with_progress, .timeout = 120)
{
    struct tu_capd c;
    start(&c);
    slow_build(&c, "/bin/sleep 0.6\nexit 1");
    struct run r;
    ctl(&r, &c, "submit", "--project", "p", "--commit", "abcdef1", "--build", "slow", "--models",
        "mlp,cnn", "--widths", "default", "--passes", "forward", "--wait", NULL);
    cr_assert_eq(r.code, 3, SHOW(r));
    char id[64];
    snprintf(id, sizeof id, "%.*s", (int)strcspn(r.out, "\n"), r.out);
    cr_assert_eq(id[0], 'j', SHOW(r));
    char needle[128];
    snprintf(needle, sizeof needle, "job %s ", id);
    /* At least the first state and the last; one line per change. */
    cr_assert_geq(progress_lines(r.err, needle), 2, SHOW(r));
    cr_assert(strstr(r.err, "cells done"), SHOW(r));
    cr_assert(strstr(r.err, "running: 1/2 cells done (failed 1), 1 running"), SHOW(r));
    cr_assert(strstr(r.err, "done: 2/2 cells done (failed 2), 0 running"), SHOW(r));
    cr_assert(strstr(r.err, "2 of 2 cells not ok"), SHOW(r));
    cr_assert(strstr(r.err, "mlp/default/forward: failed (exit code 1)"), SHOW(r));
    cr_assert(strstr(r.err, "cnn/default/forward: failed"), SHOW(r));
    run_free(&r);

    /* capctl wait on the finished job: the same verdict, JSON on request. */
    ctl(&r, &c, "wait", id, "--json", NULL);
    cr_assert_eq(r.code, 3, SHOW(r));
    json_t *j = json_loads(r.out, 0, NULL);
    cr_assert_str_eq(jget(j, "state"), "done", SHOW(r));
    json_decref(j);
    run_free(&r);
    tu_capd_stop(&c);
}

Test(capctl, wait_exit_0_when_every_cell_is_ok, .timeout = 120)
{
    struct tu_capd c;
    start(&c);
    /* A minimal runner speaking the protocol: hello, env, end ok. */
    char *ok =
        write_script(&c, "ok.sh",
                     "printf '{\"kind\":\"hello\",\"protocol\":1,\"runner\":\"sh\"}\\n"
                     "{\"kind\":\"env\",\"fingerprint\":{},\"effective_width\":\"default\"}\\n"
                     "{\"kind\":\"end\",\"status\":\"ok\"}\\n' >&3");
    register_build(&c, "ok", ok);
    free(ok);
    char *id = submit(&c, "ok", "abcdef1", "mlp,cnn", "default");
    struct run r;
    ctl(&r, &c, "wait", id, NULL);
    json_t *j = get_job(&c, id);
    cr_assert_eq(json_integer_value(json_object_get(json_object_get(j, "counts"), "ok")), 2,
                 "the ok runner did not give ok cells; " SHOW(r));
    json_decref(j);
    expect_says(&r, 0, r.err, "all 2 cells ok", NULL);
    free(id);
    tu_capd_stop(&c);
}

Test(capctl, wait_timeout_is_an_error, .timeout = 120)
{
    struct tu_capd c;
    char *id = slow_job(&c, "/bin/sleep 3\nexit 1", "abcdef1", "default");
    expect_exit2(&c, "--wait-timeout", "wait", id, "--wait-timeout", "0.5", NULL);
    free(id);
    tu_capd_stop(&c);
}

/* ---- provenance ---- */

/*
 * Starts capd in C with build "t" (start_true), makes git work tree
 * C->dir/NAME, runs the shell line FMT... inside it, and submits a job with
 * --source-tree pointing at it: capctl must exit 0 with each of WARNS (a
 * NULL-terminated list) in its stderr. ID gets the job's id.
 */
static void submit_with_tree(struct tu_capd *c, const char *name, char id[64],
                             const char *const *warns, const char *fmt, ...)
    __attribute__((format(printf, 5, 6)));
static void submit_with_tree(struct tu_capd *c, const char *name, char id[64],
                             const char *const *warns, const char *fmt, ...)
{
    start_true(c);
    char tree[400];
    snprintf(tree, sizeof tree, "%s/%s", c->dir, name);
    va_list ap;
    va_start(ap, fmt);
    char *script = tu_vfmt(fmt, ap);
    va_end(ap);
    cr_assert_not_null(script);
    cr_assert_eq(tu_sh("git init -q '%s' && cd '%s' && %s", tree, tree, script), 0, "%s", script);
    free(script);
    struct run r;
    ctl(&r, c, SUBMIT_BASE, "--source-tree", tree, NULL);
    cr_assert_eq(r.code, 0, SHOW(r));
    snprintf(id, 64, "%.*s", (int)strcspn(r.out, "\n"), r.out);
    for (int i = 0; warns[i]; i++)
        cr_assert(strstr(r.err, warns[i]), SHOW(r));
    run_free(&r);
}

Test(capctl, source_tree_findings_reach_the_job_and_comparisons, .timeout = 120)
{
    struct tu_capd c;
    char id[64];
    static const char *const warns[] = {"warning: provenance: untracked generated dispatch source "
                                        "aten/src/ATen/native/cpu/Activation.cpp.DEFAULT.cpp",
                                        /* The tree's HEAD is not --commit: said, not fatal. */
                                        "not at --commit abcdef1", NULL};
    submit_with_tree(&c, "pytorch", id, warns,
                     "mkdir -p aten/src/ATen/native/cpu && "
                     "echo x > aten/src/ATen/native/cpu/Activation.cpp && "
                     "git add . && git -c user.email=t@t -c user.name=t commit -qm init && "
                     "touch aten/src/ATen/native/cpu/Activation.cpp.DEFAULT.cpp");

    json_t *j = get_job(&c, id);
    json_t *prov = json_object_get(j, "provenance");
    cr_assert(json_is_object(prov), "the job has no provenance");
    cr_assert(strstr(jget(prov, "source_tree"), "/pytorch"));
    json_t *status = json_object_get(prov, "git_status");
    bool seen = false;
    size_t i;
    json_t *v;
    json_array_foreach(status, i, v) seen |=
        strcmp(json_string_value(v), "?? aten/src/ATen/native/cpu/Activation.cpp.DEFAULT.cpp") == 0;
    cr_assert(seen, "git_status lacks the untracked file");
    cr_assert(json_is_array(json_object_get(prov, "submodules")));
    json_t *fs = json_object_get(prov, "findings");
    cr_assert_eq(json_array_size(fs), 1, "%zu findings", json_array_size(fs));
    json_t *f = json_array_get(fs, 0);
    cr_assert_str_eq(jget(f, "kind"), "generated_source");
    cr_assert_str_eq(jget(f, "path"), "aten/src/ATen/native/cpu/Activation.cpp.DEFAULT.cpp");
    cr_assert(strstr(jget(f, "message"), "Activation.cpp.DEFAULT.cpp"));
    json_decref(j);
    wait_done(&c, id);

    /* status shows the finding; a comparison involving the job warns. */
    struct run r;
    ctl(&r, &c, "status", id, NULL);
    expect_says(&r, 0, r.out, "1 finding", "Activation.cpp.DEFAULT.cpp", NULL);
    ctl(&r, &c, "diff", "--control", id, "--head", id, "--format", "text", NULL);
    cr_assert(r.code == 0 || r.code == 1, SHOW(r));
    cr_assert(strstr(r.out, "Activation.cpp.DEFAULT.cpp"), SHOW(r));
    run_free(&r);

    /* Not a repository, not a directory: exit 2 naming the flag. */
    ctl(&r, &c, SUBMIT_BASE, "--source-tree", c.dir, NULL);
    expect_says(&r, 2, r.err, "--source-tree", "not a git work tree", NULL);
    expect_exit2(&c, "--source-tree /nonexistent/dir", SUBMIT_BASE, "--source-tree",
                 "/nonexistent/dir", NULL);
    tu_capd_stop(&c);
}

/* Crosses the status line limit and the per-kind findings limit: the
 * request still fits, truncation is said, and findings cover every line. */
Test(capctl, source_tree_limits, .timeout = 180)
{
    struct tu_capd c;
    char id[64];
    static const char *const warns[] = {"only the first", NULL};
    submit_with_tree(&c, "big", id, warns,
                     "mkdir -p a z && (cd a && seq -f 'f%%05g' 1 %d | xargs touch) && "
                     "(cd z && seq -f 'K%%02g.cpp.AVX2.cpp' 1 30 | xargs touch)",
                     PROV_MAX_STATUS_LINES + 50);
    json_t *j = get_job(&c, id);
    json_t *prov = json_object_get(j, "provenance");
    cr_assert_eq(json_array_size(json_object_get(prov, "git_status")), PROV_MAX_STATUS_LINES);
    cr_assert(json_is_true(json_object_get(prov, "git_status_truncated")));
    cr_assert_eq(json_integer_value(json_object_get(prov, "git_status_total")),
                 PROV_MAX_STATUS_LINES + 50 + 30);
    /* The generated files sort after the cut and are still found. */
    json_t *fs = json_object_get(prov, "findings");
    cr_assert_eq(json_array_size(fs), PROV_MAX_FINDINGS_PER_KIND + 1);
    cr_assert_eq(json_integer_value(
                     json_object_get(json_object_get(prov, "finding_counts"), "generated_source")),
                 30);
    json_t *last = json_array_get(fs, PROV_MAX_FINDINGS_PER_KIND);
    cr_assert_str_eq(jget(last, "kind"), "generated_source");
    cr_assert(strstr(jget(last, "message"), "5 more"), "%s", jget(last, "message"));
    json_decref(j);
    tu_capd_stop(&c);
}

/* ---- diff ---- */

/* capctl's exit code must be what the JSON verdict the server gives for
 * the same comparison says. Returns the verdict (owned by J). */
static const char *check_diff(const struct tu_capd *c, const char *query, json_t **jout,
                              const char *const *diff_args)
{
    long st = 0;
    json_t *j = tu_json(c, "GET", query, NULL, &st);
    cr_assert_eq(st, 200, "GET %s: %ld", query, st);
    const char *verdict = jget(j, "verdict");
    cr_assert(verdict && (!strcmp(verdict, "pass") || !strcmp(verdict, "regression")),
              "verdict '%s'", verdict ? verdict : "(none)");
    static const char *const formats[] = {"text", "md", "json", NULL};
    for (int f = 0; formats[f]; f++) {
        const char *args[40];
        int n = 0;
        args[n++] = "--server";
        args[n++] = c->base;
        args[n++] = "diff";
        for (int i = 0; diff_args[i]; i++)
            args[n++] = diff_args[i];
        args[n++] = "--format";
        args[n++] = formats[f];
        args[n] = NULL;
        struct run r;
        run_capctl(&r, c->dir, NULL, args);
        int want = strcmp(verdict, "regression") == 0 ? 1 : 0;
        cr_assert_eq(r.code, want, "verdict %s, format %s: " SHOW(r), verdict, formats[f]);
        if (strcmp(formats[f], "json") == 0) {
            json_t *o = json_loads(r.out, 0, NULL);
            cr_assert_not_null(o, SHOW(r));
            cr_assert_str_eq(jget(o, "verdict"), verdict);
            json_decref(o);
        } else if (strcmp(formats[f], "md") == 0) {
            cr_assert(strstr(r.out, "## capd comparison"), SHOW(r));
        } else {
            cr_assert(strstr(r.out, "capd comparison"), SHOW(r));
        }
        run_free(&r);

        args[n++] = "--fail-on";
        args[n++] = "never";
        args[n] = NULL;
        run_capctl(&r, c->dir, NULL, args);
        cr_assert_eq(r.code, 0, "--fail-on never: " SHOW(r));
        run_free(&r);
    }
    *jout = j;
    return verdict;
}

Test(capctl, diff_exit_codes_follow_the_verdict, .timeout = 180)
{
    struct tu_capd c;
    start_true(&c);
    /* Control: two widths. Head A: the same matrix. Head B: one width
     * fewer (a missing cell). All cells fail quickly on /bin/true. */
    char *ctl_id = submit(&c, "t", "aaaaaaa1", "mlp", "default,avx2");
    char *a_id = submit(&c, "t", "bbbbbbb2", "mlp", "default,avx2");
    char *b_id = submit(&c, "t", "ccccccc3", "mlp", "default");
    wait_done(&c, ctl_id);
    wait_done(&c, a_id);
    wait_done(&c, b_id);
    char q[512];
    json_t *ja, *jb, *jc, *jx;

    snprintf(q, sizeof q, "/v1/compare?control=%s&head=%s&format=json", ctl_id, a_id);
    const char *const args_a[] = {"--control", ctl_id, "--head", a_id, NULL};
    const char *va = check_diff(&c, q, &ja, args_a);

    /* Commits work as sides too. */
    snprintf(q, sizeof q, "/v1/compare?control=aaaaaaa1&head=ccccccc3&format=json");
    const char *const args_b[] = {"--control", "aaaaaaa1", "--head", "ccccccc3", NULL};
    const char *vb = check_diff(&c, q, &jb, args_b);

    /* Filters narrow the comparison on both requests. */
    snprintf(q, sizeof q, "/v1/compare?control=aaaaaaa1&head=ccccccc3&width=default&format=json");
    const char *const args_f[] = {"--control", "aaaaaaa1", "--head",  "ccccccc3",
                                  "--width",   "default",  "--model", "mlp",
                                  "--pass",    "forward",  NULL};
    check_diff(&c, q, &jx, args_f);
    json_decref(jx);

    /* Both exit codes were exercised: the server calls a missing cell a
     * regression and identical outcomes a pass. */
    cr_assert(strcmp(va, vb) != 0, "expected one pass and one regression, got %s and %s", va, vb);
    json_decref(ja);
    json_decref(jb);

    /* --commit: the head job's control commit. */
    struct run r;
    ctl(&r, &c, "submit", "--project", "p", "--commit", "ddddddd4", "--build", "t", "--models",
        "mlp", "--widths", "default", "--passes", "forward", "--control-commit", "aaaaaaa1", NULL);
    cr_assert_eq(r.code, 0, SHOW(r));
    char d_id[64];
    snprintf(d_id, sizeof d_id, "%.*s", (int)strcspn(r.out, "\n"), r.out);
    run_free(&r);
    wait_done(&c, d_id);
    const char *const args_c[] = {"--commit", "ddddddd4", NULL};
    check_diff(&c, "/v1/commits/ddddddd4/diff?format=json", &jc, args_c);
    cr_assert_str_eq(jget(jc, "control_commit"), "aaaaaaa1");
    json_decref(jc);

    /* Cross-width inside one job. */
    snprintf(q, sizeof q, "/v1/compare?job=%s&control_width=default&head_width=avx2&format=json",
             ctl_id);
    const char *const args_x[] = {"--job", ctl_id, "--control-width", "default", "--head-width",
                                  "avx2",  NULL};
    check_diff(&c, q, &jx, args_x);
    cr_assert_str_eq(jget(jx, "mode"), "cross_width");
    json_decref(jx);

    free(ctl_id);
    free(a_id);
    free(b_id);
    tu_capd_stop(&c);
}

/* A typo in a gate's filter is an error (exit 2) that names the filter and
 * the values that exist, never "pass, 0 cells compared" (exit 0). */
Test(capctl, diff_filter_typos_exit_2, .timeout = 120)
{
    struct tu_capd c;
    start_true(&c);
    char *ctl_id = submit(&c, "t", "aaaaaaa1", "mlp", "default,avx2");
    char *head_id = submit(&c, "t", "bbbbbbb2", "mlp", "default,avx2");
    wait_done(&c, ctl_id);
    wait_done(&c, head_id);
    static const struct {
        const char *flag, *value, *says;
    } typo[] = {
        {"--width", "avx-2", "did you mean avx2?"},
        {"--width", "avx512", "widths: avx2, default"},
        {"--model", "MLP", "did you mean mlp?"},
        {"--pass", "Forward", "did you mean forward?"},
    };
    struct run r;
    for (size_t i = 0; i < sizeof typo / sizeof typo[0]; i++) {
        ctl(&r, &c, "diff", "--control", "aaaaaaa1", "--head", "bbbbbbb2", "--fail-on",
            "regression", typo[i].flag, typo[i].value, NULL);
        cr_assert_eq(r.code, 2, "%s %s: " SHOW(r), typo[i].flag, typo[i].value);
        cr_assert(strstr(r.err, typo[i].says) && strstr(r.err, typo[i].value), SHOW(r));
        run_free(&r);
    }
    /* The same flags spelled right still gate. */
    ctl(&r, &c, "diff", "--control", "aaaaaaa1", "--head", "bbbbbbb2", "--width", "avx2", "--model",
        "mlp", NULL);
    cr_assert(r.code == 0 || r.code == 1, SHOW(r));
    run_free(&r);
    /* --reference is the query's reference: a bad one is the server's 400,
     * a good one is the comparison's arbiter. */
    expect_exit2(&c, "reference must be one of", "diff", "--control", "aaaaaaa1", "--head",
                 "bbbbbbb2", "--reference", "float32", NULL);
    ctl(&r, &c, "diff", "--control", "aaaaaaa1", "--head", "bbbbbbb2", "--reference", "float64",
        "--format", "json", NULL);
    cr_assert(r.code == 0 || r.code == 1, SHOW(r));
    json_t *res = json_loads(r.out, 0, NULL);
    cr_assert_str_eq(jget(json_object_get(res, "thresholds"), "reference"), "float64", SHOW(r));
    json_decref(res);
    run_free(&r);
    free(ctl_id);
    free(head_id);
    tu_capd_stop(&c);
}

/* capctl cancel: a running job ends cancelled; cancelling it again, or an
 * unknown job, is an error naming why. */
Test(capctl, cancel_a_running_job, .timeout = 120)
{
    struct tu_capd c;
    char *id = slow_job(&c, "exec /bin/sleep 30", "aaaaaaa1", "default,avx2");
    struct run r;
    expect_stdout(&c, 0, "cancelled", "cancel", id, "--wait", NULL);
    long st;
    char path[128];
    snprintf(path, sizeof path, "/v1/jobs/%s", id);
    json_t *j = tu_json(&c, "GET", path, NULL, &st);
    cr_assert_str_eq(jget(j, "state"), "cancelled");
    json_decref(j);
    expect_exit2(&c, "already ended", "cancel", id, NULL);
    ctl(&r, &c, "cancel", "jnope", NULL);
    cr_assert_eq(r.code, 2, SHOW(r));
    run_free(&r);
    ctl(&r, &c, "cancel", NULL);
    cr_assert_eq(r.code, 2, "a job id is required: " SHOW(r));
    run_free(&r);
    free(id);
    tu_capd_stop(&c);
}

Test(capctl, diff_pending_and_wait_timeout, .timeout = 180)
{
    struct tu_capd c;
    start_true(&c);
    slow_build(&c, "/bin/sleep 1.5\nexit 1");
    char *ctl_id = submit(&c, "t", "aaaaaaa1", "mlp", "default");
    wait_done(&c, ctl_id);
    char *head_id = submit(&c, "slow", "bbbbbbb2", "mlp", "default");

    struct run r;
    ctl(&r, &c, "diff", "--control", ctl_id, "--head", head_id, NULL);
    expect_says(&r, 2, r.err, "(pending)", "--wait-timeout", NULL);

    ctl(&r, &c, "diff", "--control", ctl_id, "--head", head_id, "--wait-timeout", "60", "--format",
        "json", NULL);
    cr_assert(r.code == 0 || r.code == 1, SHOW(r));
    cr_assert(strstr(r.err, "waiting: control job"), SHOW(r));
    json_t *j = json_loads(r.out, 0, NULL);
    cr_assert_not_null(j, SHOW(r));
    cr_assert_eq(r.code, strcmp(jget(j, "verdict"), "regression") == 0 ? 1 : 0, SHOW(r));
    json_decref(j);
    run_free(&r);

    /* A wait that runs out is an error. */
    char *late = submit(&c, "slow", "ccccccc3", "mlp", "default");
    expect_exit2(&c, "still pending", "diff", "--control", ctl_id, "--head", late, "--wait-timeout",
                 "0.3", NULL);
    free(late);
    free(ctl_id);
    free(head_id);
    tu_capd_stop(&c);
}

/* With the fake runner (tests/helpers/fake_runner): real records, and a
 * head build that perturbs one tensor, so the verdict is a regression for
 * a reason in the data, not in the matrix. */
Test(capctl, diff_fake_runner_divergence_is_a_regression, .timeout = 180)
{
    struct tu_capd c;
    start(&c);
    char *fake = tu_helper("fake_runner");
    cr_assert_eq(access(fake, X_OK), 0, "no fake runner at %s", fake);
    struct run r;
    ctl(&r, &c, "builds", "register", "--name", "control-build", "--python", fake, "--model-root",
        c.dir, NULL);
    cr_assert_eq(r.code, 0, SHOW(r));
    run_free(&r);
    ctl(&r, &c, "builds", "register", "--name", "head-build", "--python", fake, "--model-root",
        c.dir, "--env", "FAKE_PERTURB_KEY=layer1.0.forward.output.0", NULL);
    cr_assert_eq(r.code, 0, SHOW(r));
    run_free(&r);
    free(fake);

    ctl(&r, &c, "submit", "--project", "p", "--commit", "aaaaaaa1", "--build", "control-build",
        "--models", "fake:ok", "--widths", "default,avx2", "--passes", "forward", "--wait", NULL);
    cr_assert_eq(r.code, 0, "every cell should be ok: " SHOW(r));
    cr_assert(strstr(r.err, "all 2 cells ok"), SHOW(r));
    run_free(&r);
    ctl(&r, &c, "submit", "--project", "p", "--commit", "bbbbbbb2", "--build", "head-build",
        "--control-commit", "aaaaaaa1", "--models", "fake:ok", "--widths", "default,avx2",
        "--passes", "forward", "--wait", NULL);
    cr_assert_eq(r.code, 0, SHOW(r));
    run_free(&r);

    json_t *j;
    const char *const same[] = {"--control", "aaaaaaa1", "--head", "aaaaaaa1", NULL};
    cr_assert_str_eq(
        check_diff(&c, "/v1/compare?control=aaaaaaa1&head=aaaaaaa1&format=json", &j, same), "pass");
    json_decref(j);
    const char *const perturbed[] = {"--commit", "bbbbbbb2", NULL};
    cr_assert_str_eq(check_diff(&c, "/v1/commits/bbbbbbb2/diff?format=json", &j, perturbed),
                     "regression");
    json_decref(j);

    expect_stdout(&c, 1, "layer1.0.forward.output.0", "diff", "--commit", "bbbbbbb2", "--format",
                  "text", NULL);
    tu_capd_stop(&c);
}

/* A head whose timings are 1.6x the control's (the fake runner scales its
 * samples) and whose numerics are identical: --fail-on regression fails on
 * perf, --fail-on numerics passes and says perf did not gate. */
Test(capctl, diff_fail_on_numerics_leaves_perf_out_of_the_gate, .timeout = 180)
{
    struct tu_capd c;
    start(&c);
    char *fake = tu_helper("fake_runner");
    struct run r;
    ctl(&r, &c, "builds", "register", "--name", "fast", "--python", fake, "--model-root", c.dir,
        NULL);
    cr_assert_eq(r.code, 0, SHOW(r));
    run_free(&r);
    ctl(&r, &c, "builds", "register", "--name", "slow", "--python", fake, "--model-root", c.dir,
        "--env", "FAKE_TIMING_SCALE=1.6", NULL);
    cr_assert_eq(r.code, 0, SHOW(r));
    run_free(&r);
    free(fake);
    const char *commits[] = {"aaaaaaa1", "bbbbbbb2"}, *builds[] = {"fast", "slow"};
    for (int i = 0; i < 2; i++) {
        ctl(&r, &c, "submit", "--project", "p", "--commit", commits[i], "--build", builds[i],
            "--models", "fake:ok", "--widths", "default", "--passes", "forward", "--iterations",
            "20", "--wait", NULL);
        cr_assert_eq(r.code, 0, SHOW(r));
        run_free(&r);
    }

    ctl(&r, &c, "diff", "--control", "aaaaaaa1", "--head", "bbbbbbb2", NULL);
    cr_assert_eq(r.code, 1, "perf gates by default: " SHOW(r));
    cr_assert(strstr(r.out, "capd comparison: REGRESSION\n"), SHOW(r));
    cr_assert(strstr(r.out, "PERF REGRESSION fake:ok/default/forward"), SHOW(r));
    run_free(&r);

    ctl(&r, &c, "diff", "--control", "aaaaaaa1", "--head", "bbbbbbb2", "--fail-on", "numerics",
        NULL);
    cr_assert_eq(r.code, 0, SHOW(r));
    cr_assert(strstr(r.out, "capd comparison: pass (perf not gating)\n"), SHOW(r));
    cr_assert(strstr(r.out, "PERF REGRESSION fake:ok/default/forward"), "still reported: " SHOW(r));
    run_free(&r);

    ctl(&r, &c, "diff", "--control", "aaaaaaa1", "--head", "bbbbbbb2", "--fail-on", "numerics",
        "--format", "json", NULL);
    cr_assert_eq(r.code, 0, SHOW(r));
    json_t *j = json_loads(r.out, 0, NULL);
    cr_assert_not_null(j, SHOW(r));
    cr_assert_str_eq(jget(j, "verdict"), "pass");
    cr_assert(json_is_false(json_object_get(json_object_get(j, "thresholds"), "perf_gate")));
    cr_assert_eq(
        json_integer_value(json_object_get(json_object_get(j, "counts"), "perf_regressions")), 1);
    json_decref(j);
    run_free(&r);

    ctl(&r, &c, "diff", "--control", "aaaaaaa1", "--head", "bbbbbbb2", "--fail-on", "perf", NULL);
    expect_says(&r, 2, r.err,
                "--fail-on must be regression, unknown, numerics or never, got 'perf'", NULL);

    /* 5% slower, exactly at the threshold: the interval straddles 1.05, so
     * perf is unknown; that fails only with --fail-on unknown. */
    fake = tu_helper("fake_runner");
    ctl(&r, &c, "builds", "register", "--name", "edge", "--python", fake, "--model-root", c.dir,
        "--env", "FAKE_TIMING_SCALE=1.05", NULL);
    cr_assert_eq(r.code, 0, SHOW(r));
    run_free(&r);
    free(fake);
    ctl(&r, &c, "submit", "--project", "p", "--commit", "ccccccc3", "--build", "edge", "--models",
        "fake:ok", "--widths", "default", "--passes", "forward", "--iterations", "20", "--wait",
        NULL);
    cr_assert_eq(r.code, 0, SHOW(r));
    run_free(&r);
    ctl(&r, &c, "diff", "--control", "aaaaaaa1", "--head", "ccccccc3", "--format", "json", NULL);
    cr_assert_eq(r.code, 0, "unknown does not gate by default: " SHOW(r));
    j = json_loads(r.out, 0, NULL);
    cr_assert_not_null(j, SHOW(r));
    json_t *perf = json_object_get(json_array_get(json_object_get(j, "cells"), 0), "perf");
    cr_assert_str_eq(jget(perf, "verdict"), "unknown", SHOW(r));
    json_decref(j);
    run_free(&r);
    ctl(&r, &c, "diff", "--control", "aaaaaaa1", "--head", "ccccccc3", "--fail-on", "unknown",
        NULL);
    cr_assert_eq(r.code, 1, SHOW(r));
    run_free(&r);
    tu_capd_stop(&c);
}
