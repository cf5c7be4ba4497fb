/*
 * tests/test_prefork.c - prefork runners (docs/prefork.md) with the real
 * capd, the real runner and Debian's torch.
 *
 * The promises: a prefork build captures, cell for cell, hash for hash,
 * what a fresh-exec build captures over the whole model x width x pass
 * matrix; each cell is still its own process (a crash kills only that
 * child, a timeout kills it, a dead zygote is replaced); and a build for
 * which prefork cannot be shown equivalent is refused, its cells running
 * by fresh exec.
 */
#include <criterion/criterion.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "tests/helpers/common/api_fixtures.h"
#include "tests/helpers/common/testutil.h"

#define FORKED "capd prefork: cell pid "

static void register_build(struct tu_capd *c, const char *name, bool prefork, const char *extra)
{
    long st = 0;
    json_t *j = tu_jsonf(
        c, "POST", "/v1/builds", &st, "{\"name\":\"%s\",\"python\":\"%s\",\"prefork\":%s%s%s}",
        name, tu_python(), prefork ? "true" : "false", extra ? "," : "", extra ? extra : "");
    cr_assert_eq(st, 201, "register %s: %ld", name, st);
    json_decref(j);
}

/* How long one job of real PyTorch cells may take. */
#define JOB_S 1200

static char *submit(struct tu_capd *c, const char *build, const char *commit, const char *control,
                    const char *models, const char *widths, const char *passes, const char *options)
{
    struct af_job job = {"pytorch", commit, control, build, models, widths, passes, options};
    return af_submit_job(c, &job);
}

/* The build field that makes the test models (pfmodels:*) importable. */
static const char *pf_model_roots(void)
{
    static char roots[512];
    snprintf(roots, sizeof roots, "\"model_roots\":[\"%s/tests/helpers/prefork/models\"]",
             tu_bin("CAPD_SOURCE_DIR"));
    return roots;
}

/* "key hash" lines of every tensor record of a cell, in order. */
static char *tensor_hashes(struct tu_capd *c, const char *job, const char *cell, size_t *n)
{
    json_t *records = af_cell_records(c, job, cell, "tensor");
    size_t cap = 1 << 16, len = 0;
    char *out = malloc(cap);
    out[0] = 0;
    *n = 0;
    size_t i;
    json_t *r;
    json_array_foreach(records, i, r)
    {
        const char *k = tu_str(r, "key"), *h = tu_str(r, "hash");
        size_t need = strlen(k) + strlen(h) + 3;
        if (len + need >= cap) {
            cap = cap * 2 + need;
            out = realloc(out, cap);
        }
        len += (size_t)snprintf(out + len, cap - len, "%s %s\n", k, h);
        (*n)++;
    }
    json_decref(records);
    return out;
}

static char *cell_log(struct tu_capd *c, const char *job, const char *cell)
{
    char path[256];
    snprintf(path, sizeof path, "/v1/jobs/%s/cells/%s/log", job, cell);
    struct tu_resp r;
    cr_assert_eq(tu_http(c, "GET", path, NULL, 0, NULL, &r), 0);
    cr_assert_eq(r.status, 200, "GET %s: %ld", path, r.status);
    char *body = strdup(r.body ? r.body : "");
    tu_resp_free(&r);
    return body;
}

/* The pids in a prefork cell's log line, or false when it was not forked. */
static bool forked_pids(const char *log, long *cell_pid, long *zygote_pid)
{
    const char *p = strstr(log, FORKED);
    if (!p)
        return false;
    return sscanf(p, FORKED "%ld forked from zygote pid %ld", cell_pid, zygote_pid) == 2;
}

static json_t *get_build(struct tu_capd *c, const char *name)
{
    char path[128];
    long st = 0;
    snprintf(path, sizeof path, "/v1/builds/%s", name);
    json_t *b = tu_json(c, "GET", path, NULL, &st);
    cr_assert_eq(st, 200);
    return b;
}

static json_t *only_cell(json_t *job, size_t i)
{
    json_t *cell = json_array_get(json_object_get(job, "cells"), i);
    cr_assert_not_null(cell);
    return cell;
}

/* A live process (a zombie waiting for its reaper counts as gone). */
static bool alive(long pid)
{
    char path[64], buf[512];
    snprintf(path, sizeof path, "/proc/%ld/stat", pid);
    FILE *f = fopen(path, "r");
    if (!f)
        return false;
    size_t n = fread(buf, 1, sizeof buf - 1, f);
    fclose(f);
    buf[n] = 0;
    const char *rp = strrchr(buf, ')');
    return rp && rp[1] == ' ' && rp[2] != 'Z' && rp[2] != 'X';
}

/* Gives process PID up to five seconds to go; true when it has gone. */
static bool gone_soon(long pid)
{
    for (int i = 0; i < 50 && alive(pid); i++)
        usleep(100000);
    return !alive(pid);
}

/* Asserts that CELL of JOB was forked from a zygote, naming the cell by WHAT
 * (with its log) when it was not; its pid and the zygote's land in CELL_PID
 * and ZYGOTE_PID. */
static void assert_forked(struct tu_capd *c, const char *job, json_t *cell, const char *what,
                          long *cell_pid, long *zygote_pid)
{
    char *log = cell_log(c, job, tu_str(cell, "id"));
    cr_assert(forked_pids(log, cell_pid, zygote_pid), "%s was forked; log:\n%s", what, log);
    free(log);
}

/* Submits one pfmodels MODEL of build pf at COMMIT with OPTIONS, waits for
 * the job and asserts that its only cell ended in state WANT; returns the
 * job (its id in *ID). */
static json_t *run_one(struct tu_capd *c, const char *commit, const char *model,
                       const char *options, const char *want, char **id)
{
    *id = submit(c, "pf", commit, NULL, model, "\"avx2\"", "\"forward\"", options);
    json_t *job = af_wait_job(c, *id, JOB_S);
    json_t *cell = only_cell(job, 0);
    cr_assert_str_eq(tu_str(cell, "state"), want, "%s", tu_str(cell, "reason"));
    return job;
}

/* The build field: a boolean, shown with its verification state. */
Test(prefork, build_field)
{
    struct tu_capd c;
    cr_assert_eq(tu_capd_start(&c, NULL, NULL), 0);
    long st = 0;
    json_t *j = tu_jsonf(&c, "POST", "/v1/builds", &st,
                         "{\"name\":\"x\",\"python\":\"%s\",\"prefork\":\"yes\"}", tu_python());
    cr_assert_eq(st, 400);
    cr_assert_str_eq(tu_str(json_object_get(j, "error"), "field"), "prefork");
    json_decref(j);
    register_build(&c, "plain", false, NULL);
    json_t *b = get_build(&c, "plain");
    cr_assert(json_is_false(json_object_get(b, "prefork")));
    cr_assert_null(json_object_get(b, "prefork_state"));
    json_decref(b);
    register_build(&c, "pf", true, NULL);
    b = get_build(&c, "pf");
    cr_assert(json_is_true(json_object_get(b, "prefork")));
    cr_assert_str_eq(tu_str(b, "prefork_state"), "unverified");
    json_decref(b);
    /* Replacing a build drops the flag unless it is given again. */
    j = tu_jsonf(&c, "PUT", "/v1/builds/pf", &st, "{\"python\":\"%s\"}", tu_python());
    cr_assert_eq(st, 200);
    cr_assert(json_is_false(json_object_get(j, "prefork")));
    json_decref(j);
    tu_capd_stop(&c);
}

/*
 * The headline promise, on the end-to-end job: mlp,cnn,transformer,lstm x
 * default,avx2,avx512 x forward,backward through a fresh-exec build and a
 * prefork build of the same interpreter. Every prefork cell was forked
 * (its log says so) and its tensor records equal the fresh cell's, key for
 * key and hash for hash; the comparison of the prefork head against the
 * fresh control finds all 24 cells identical; the build is now verified.
 * A width this host's CPU cannot run is unsupported on both, never started.
 */
Test(prefork, matrix_bit_identical_to_fresh_exec, .timeout = 2400)
{
    struct tu_capd c;
    cr_assert_eq(tu_capd_start(&c, NULL, NULL), 0);
    register_build(&c, "fresh", false, NULL);
    register_build(&c, "pf", true, NULL);
    const char *models = "\"mlp\",\"cnn\",\"transformer\",\"lstm\"";
    const char *widths = "\"default\",\"avx2\",\"avx512\"";
    const char *passes = "\"forward\",\"backward\"";
    const char *opts = "{\"iterations\":2,\"warmup\":0}";
    char *jf = submit(&c, "fresh", "f000000", NULL, models, widths, passes, opts);
    char *jp = submit(&c, "pf", "e000000", "f000000", models, widths, passes, opts);
    json_t *fresh = af_wait_job(&c, jf, JOB_S);
    json_t *pf = af_wait_job(&c, jp, JOB_S);
    cr_assert_eq(json_array_size(json_object_get(fresh, "cells")), 24);
    cr_assert_eq(json_array_size(json_object_get(pf, "cells")), 24);
    size_t total = 0;
    long zygote = 0;
    int nrun = 0;
    for (size_t i = 0; i < 24; i++) {
        json_t *a = only_cell(fresh, i), *b = only_cell(pf, i);
        char name[96];
        snprintf(name, sizeof name, "%s/%s/%s", tu_str(b, "model"), tu_str(b, "width"),
                 tu_str(b, "pass"));
        cr_assert_str_eq(tu_str(a, "model"), tu_str(b, "model"));
        cr_assert_str_eq(tu_str(a, "width"), tu_str(b, "width"));
        cr_assert_str_eq(tu_str(a, "pass"), tu_str(b, "pass"));
        if (!tu_width_runnable(&c, tu_str(a, "width"))) {
            cr_assert_str_eq(tu_str(a, "state"), "unsupported", "fresh %s", name);
            cr_assert_str_eq(tu_str(b, "state"), "unsupported", "prefork %s", name);
            continue;
        }
        nrun++;
        cr_assert_str_eq(tu_str(a, "state"), "ok", "fresh %s: %s", name, tu_str(a, "reason"));
        cr_assert_str_eq(tu_str(b, "state"), "ok", "prefork %s: %s", name, tu_str(b, "reason"));
        cr_assert_str_eq(tu_str(b, "effective_width"), tu_str(b, "width"), "%s", name);

        char *la = cell_log(&c, jf, tu_str(a, "id"));
        char *lb = cell_log(&c, jp, tu_str(b, "id"));
        long cp = 0, zp = 0;
        cr_assert(!forked_pids(la, &cp, &zp), "fresh %s was not forked", name);
        cr_assert(forked_pids(lb, &cp, &zp), "prefork %s was forked from the zygote; log:\n%s",
                  name, lb);
        if (!zygote)
            zygote = zp;
        cr_assert_eq(zp, zygote, "%s: one zygote serves the whole job", name);
        free(la);
        free(lb);

        size_t na = 0, nb = 0;
        char *ha = tensor_hashes(&c, jf, tu_str(a, "id"), &na);
        char *hb = tensor_hashes(&c, jp, tu_str(b, "id"), &nb);
        cr_assert_gt(na, 5, "%s has records", name);
        cr_assert_eq(na, nb, "%s: %zu records fresh, %zu prefork", name, na, nb);
        cr_assert_str_eq(ha, hb, "%s: prefork records differ from fresh exec", name);
        total += na;
        free(ha);
        free(hb);
    }
    cr_log_info("prefork: %zu tensor records bit-identical over %d cells", total, nrun);

    long st = 0;
    json_t *diff = tu_json(&c, "GET", "/v1/commits/e000000/diff", NULL, &st);
    cr_assert_eq(st, 200);
    json_t *counts = json_object_get(diff, "counts");
    cr_assert_eq(json_integer_value(json_object_get(counts, "identical")), nrun,
                 "the prefork head is identical to the fresh control in all %d cells run", nrun);
    cr_assert_eq(json_integer_value(json_object_get(counts, "not_run")), 24 - nrun);
    json_decref(diff);
    json_t *b = get_build(&c, "pf");
    cr_assert_str_eq(tu_str(b, "prefork_state"), "verified", "reason: %s",
                     tu_str(b, "prefork_reason"));
    json_decref(b);
    json_decref(fresh);
    json_decref(pf);
    free(jf);
    free(jp);
    tu_capd_stop(&c);
}

#define TEMPLATE_FORKED "capd prefork: timing template pid "

/* The zygote pids the log names for both of a paired cell's timing
 * templates (the control build's and the head's): false unless it names
 * two. */
static bool templates_forked(const char *log, long tz[2], long tp[2])
{
    const char *t = log;
    for (int i = 0; i < 2; i++) {
        t = strstr(t, TEMPLATE_FORKED);
        if (!t || sscanf(t, TEMPLATE_FORKED "%ld forked from zygote pid %ld", &tp[i], &tz[i]) != 2)
            return false;
        t++;
    }
    return true;
}

/* One paired head cell of BUILD (registered with PREFORK or without). */
static void paired_templates(struct tu_capd *c, const char *build, bool prefork)
{
    register_build(c, build, prefork, NULL);
    const char *opts = "{\"iterations\":3,\"warmup\":1,\"timing_processes\":2,"
                       "\"timing_pairs\":2,\"max_timing_rounds\":1,\"timing_min_ms\":5}";
    char cc[16], hc[16];
    snprintf(cc, sizeof cc, "c00000%d", prefork);
    snprintf(hc, sizeof hc, "d00000%d", prefork);
    char *jc = submit(c, build, cc, NULL, "\"mlp\"", "\"default\"", "\"forward\"", opts);
    json_decref(af_wait_job(c, jc, JOB_S));
    char *jh = submit(c, build, hc, cc, "\"mlp\"", "\"default\"", "\"forward\"", opts);
    json_t *head = af_wait_job(c, jh, JOB_S);
    json_t *cell = only_cell(head, 0);
    cr_assert_str_eq(tu_str(cell, "state"), "ok", "%s", tu_str(cell, "reason"));
    long cp = 0, zp = 0, tp[2], tz[2];
    char *log = cell_log(c, jh, tu_str(cell, "id"));
    cr_assert(templates_forked(log, tz, tp), "%s: both templates were forked; log:\n%s", build,
              log);
    cr_assert_eq(tz[0], tz[1], "one build, one environment: one zygote");
    cr_assert_neq(tp[0], tp[1]);
    cr_assert_eq(forked_pids(log, &cp, &zp), prefork, "%s: the cell itself forked: %d", build,
                 !prefork);
    if (prefork)
        cr_assert_eq(tz[0], zp, "the build's own zygote");
    free(log);
    long st = 0;
    char path[64];
    snprintf(path, sizeof path, "/v1/builds/%s", build);
    json_t *b = tu_json(c, "GET", path, NULL, &st);
    cr_assert_eq(st, 200);
    cr_assert_eq(json_is_true(json_object_get(b, "prefork")), prefork);
    if (!prefork)
        cr_assert_null(json_object_get(b, "prefork_state"),
                       "a timing-only zygote stores nothing on the build");
    json_decref(b);
    json_t *ts = af_cell_records(c, jh, tu_str(cell, "id"), "timing");
    cr_assert_eq(json_array_size(ts), 4, "2 pairs: %zu timing records", json_array_size(ts));
    for (size_t i = 0; i < 4; i++)
        cr_assert_eq(json_is_true(json_object_get(json_array_get(ts, i), "reference")), i % 2 == 0,
                     "record %zu", i);
    json_decref(ts);
    json_decref(head);
    free(jc);
    free(jh);
}

/*
 * Paired timing: both sides' timing templates are forked by their build's
 * zygote (here one build and environment, one zygote) instead of starting
 * interpreters, and the pairs they time are stored as the head's reference
 * processes. With prefork it is the build's own zygote, which also forked
 * the cell; without, a zygote that serves timing templates only: the
 * cell is a fresh exec, and nothing is stored on the build.
 */
Test(prefork, paired_templates_forked_from_a_zygote, .timeout = 1200)
{
    struct tu_capd c;
    cr_assert_eq(tu_capd_start(&c, NULL, NULL), 0);
    for (int prefork = 1; prefork >= 0; prefork--)
        paired_templates(&c, prefork ? "pf" : "fresh", prefork);
    tu_capd_stop(&c);
}

/*
 * Isolation: a prefork cell that crashes is reported crashed (SIGSEGV) and
 * takes nothing else down: the next cell is forked from the same zygote. A
 * cell past its timeout is killed (its process is gone afterwards). A
 * zygote that dies is replaced by the next prefork cell.
 */
Test(prefork, crash_timeout_and_dead_zygote, .timeout = 1200)
{
    struct tu_capd c;
    cr_assert_eq(tu_capd_start(&c, NULL, NULL), 0);
    const char *roots = pf_model_roots();
    register_build(&c, "pf", true, roots);

    char *j1 = submit(&c, "pf", "a100000", NULL, "\"pfmodels:segv\",\"pfmodels:ok\"", "\"avx2\"",
                      "\"forward\"", "{\"iterations\":1,\"warmup\":0}");
    json_t *job = af_wait_job(&c, j1, JOB_S);
    json_t *crash = only_cell(job, 0), *ok = only_cell(job, 1);
    cr_assert_str_eq(tu_str(crash, "state"), "crashed", "%s", tu_str(crash, "reason"));
    cr_assert_str_eq(tu_str(crash, "signal"), "SIGSEGV");
    cr_assert_str_eq(tu_str(ok, "state"), "ok", "%s", tu_str(ok, "reason"));
    long p1 = 0, z1 = 0, p2 = 0, z2 = 0;
    assert_forked(&c, j1, crash, "the crashing cell", &p1, &z1);
    assert_forked(&c, j1, ok, "the next cell", &p2, &z2);
    cr_assert_eq(z1, z2, "the crash did not take the zygote down");
    cr_assert(alive(z1), "zygote %ld alive after a cell crashed", z1);
    cr_assert_neq(p1, p2);
    json_decref(job);

    /* A timeout: SIGTERM to the cell's group (through capd-exec), and the
     * child is gone once the cell has ended. */
    char *j2;
    job = run_one(&c, "a200000", "\"pfmodels:hang\"",
                  "{\"iterations\":1,\"warmup\":0,\"timeout_s\":3}", "timeout", &j2);
    long p3 = 0, z3 = 0;
    assert_forked(&c, j2, only_cell(job, 0), "the hanging cell", &p3, &z3);
    cr_assert_eq(z3, z1);
    cr_assert(gone_soon(p3), "the timed-out child %ld is gone", p3);
    json_decref(job);

    /* The zygote dies: the next prefork cell gets a new one. */
    cr_assert_eq(kill((pid_t)z1, SIGKILL), 0);
    gone_soon(z1);
    char *j3;
    job = run_one(&c, "a300000", "\"pfmodels:ok\"", "{\"iterations\":1,\"warmup\":0}", "ok", &j3);
    long p4 = 0, z4 = 0;
    assert_forked(&c, j3, only_cell(job, 0), "the cell after the zygote died", &p4, &z4);
    cr_assert_neq(z4, z1, "a new zygote");
    json_decref(job);
    free(j1);
    free(j2);
    free(j3);
    tu_capd_stop(&c);
    cr_assert(gone_soon(z4), "the zygote goes with capd");
}

/*
 * Memory limits hold for a prefork cell, which the zygote forks outside
 * capd's process tree: pfmodels:memhog allocates 2 GiB past a 1 GiB
 * memory_max_bytes and ends oom with the limit in its reason, while
 * pfmodels:ok beside it (torch and the zygote's pages included) ends ok, on
 * the watchdog (forced) and on a cgroup mechanism where the host gives capd
 * one. The zygote survives the kill.
 */
static void prefork_memory_case(const char *config_json, const char *want_mech)
{
    char *dir = tu_tmpdir(), conf[600];
    cr_assert_not_null(dir);
    snprintf(conf, sizeof conf, "%s/capd.json", dir);
    af_put_file(conf, config_json);
    const char *extra[] = {"--config", conf, NULL};
    struct tu_capd c;
    cr_assert_eq(tu_capd_start(&c, dir, extra), 0);
    free(dir);
    long st = 0;
    json_t *host = tu_json(&c, "GET", "/v1/host", NULL, &st);
    char mech[32];
    snprintf(mech, sizeof mech, "%s", tu_str(json_object_get(host, "memory"), "mechanism"));
    json_int_t cell_max = json_integer_value(
        json_object_get(json_object_get(host, "memory"), "cell_memory_max_bytes"));
    json_decref(host);
    if (cell_max < (json_int_t)3 << 29) {
        tu_capd_stop(&c);
        cr_skip_test("this host's cell_memory_max_bytes (%lld) is below the 1.5 GiB a 1 GiB "
                     "cell limit with a torch zygote needs",
                     (long long)cell_max);
    }
    if (!want_mech && strcmp(mech, "watchdog") == 0) {
        tu_capd_stop(&c);
        cr_skip_test("no cgroup capd may use on this host (GET /v1/host memory.reason)");
    }
    if (want_mech)
        cr_assert_str_eq(mech, want_mech);
    const char *roots = pf_model_roots();
    register_build(&c, "pf", true, roots);
    char *j1 =
        submit(&c, "pf", "a400000", NULL, "\"pfmodels:memhog\",\"pfmodels:ok\"", "\"default\"",
               "\"forward\"", "{\"iterations\":1,\"warmup\":0,\"memory_max_bytes\":1073741824}");
    json_t *job = af_wait_job(&c, j1, JOB_S);
    json_t *hog = only_cell(job, 0), *ok = only_cell(job, 1);
    const char *reason = tu_str(hog, "reason");
    cr_assert_str_eq(tu_str(hog, "state"), "oom", "%s: %s", mech, reason);
    cr_assert(strstr(reason, "limit 1073741824 bytes") && strstr(reason, mech), "%s", reason);
    cr_assert_str_eq(tu_str(ok, "state"), "ok", "%s", tu_str(ok, "reason"));
    long p1 = 0, z1 = 0, p2 = 0, z2 = 0;
    assert_forked(&c, j1, hog, "the oom cell", &p1, &z1);
    assert_forked(&c, j1, ok, "the next cell", &p2, &z2);
    cr_assert_eq(z1, z2, "the oom kill did not take the zygote down");
    cr_assert(!alive(p1), "the oom child %ld is gone", p1);
    json_decref(job);
    free(j1);
    tu_capd_stop(&c);
}

Test(prefork, memory_limit_watchdog, .timeout = 600)
{
    prefork_memory_case("{\"cell_memory_mechanism\": \"watchdog\", \"max_parallel\": 2}",
                        "watchdog");
}

Test(prefork, memory_limit_cgroup, .timeout = 600)
{
    prefork_memory_case("{\"max_parallel\": 2}", NULL);
}

/*
 * Refusal. The perturbed example build decides at import time, from the
 * width variable, whether to patch F.linear: a zygote imports it with no
 * width set, so its children at the perturbed width (the widest this host
 * runs) would not be perturbed while a fresh
 * exec is. A build that runs an operator while it is imported fixes the
 * CPU capability in the zygote, so its children cannot take their width.
 * Both are refused at their first prefork cell, and their cells still run,
 * correctly, by fresh exec.
 */
Test(prefork, refused_when_not_equivalent, .timeout = 1200)
{
    struct tu_capd c;
    cr_assert_eq(tu_capd_start(&c, NULL, NULL), 0);
    char env[512], wq[32];
    const char *wide = tu_widest_width(&c);
    if (!strcmp(wide, "default")) {
        tu_capd_stop(&c);
        cr_skip_test("this host runs neither avx2 nor avx512: no vector width to perturb");
    }
    snprintf(wq, sizeof wq, "\"%s\"", wide);
    snprintf(env, sizeof env,
             "\"env\":{\"PYTHONPATH\":\"%s/examples/perturbed-build\",\"CAPD_PERTURB_WIDTH\":"
             "\"%s\"}",
             tu_bin("CAPD_SOURCE_DIR"), wide);
    register_build(&c, "perturbed", true, env);
    snprintf(env, sizeof env, "\"env\":{\"PYTHONPATH\":\"%s/tests/helpers/prefork/import_op\"}",
             tu_bin("CAPD_SOURCE_DIR"));
    register_build(&c, "importop", true, env);
    const char *opts = "{\"iterations\":1,\"warmup\":0}";
    char *j1 = submit(&c, "perturbed", "b100000", NULL, "\"mlp\"", wq, "\"forward\"", opts);
    char *j2 =
        submit(&c, "importop", "b200000", NULL, "\"mlp\"", "\"default\"", "\"forward\"", opts);
    json_t *job1 = af_wait_job(&c, j1, JOB_S), *job2 = af_wait_job(&c, j2, JOB_S);

    json_t *b = get_build(&c, "perturbed");
    cr_assert_str_eq(tu_str(b, "prefork_state"), "refused");
    cr_assert(strstr(tu_str(b, "prefork_reason"), "differs"), "reason: %s",
              tu_str(b, "prefork_reason"));
    json_decref(b);
    b = get_build(&c, "importop");
    cr_assert_str_eq(tu_str(b, "prefork_state"), "refused");
    cr_assert(strstr(tu_str(b, "prefork_reason"), "import time"), "reason: %s",
              tu_str(b, "prefork_reason"));
    json_decref(b);

    for (int k = 0; k < 2; k++) {
        json_t *job = k ? job2 : job1;
        json_t *cell = only_cell(job, 0);
        cr_assert_str_eq(tu_str(cell, "state"), "ok", "%s", tu_str(cell, "reason"));
        cr_assert_str_eq(tu_str(cell, "effective_width"), tu_str(cell, "width"));
        char *log = cell_log(&c, k ? j2 : j1, tu_str(cell, "id"));
        long cp, zp;
        cr_assert(!forked_pids(log, &cp, &zp), "a refused build's cell is not forked:\n%s", log);
        cr_assert(strstr(log, "fresh exec"), "the log says it ran by fresh exec:\n%s", log);
        free(log);
    }

    /* Afterwards no zygote is started for them: the next cell's log has
     * no prefork line at all. */
    char *j3 = submit(&c, "perturbed", "b300000", NULL, "\"mlp\"", wq, "\"forward\"", opts);
    json_t *job3 = af_wait_job(&c, j3, JOB_S);
    char *log = cell_log(&c, j3, tu_str(only_cell(job3, 0), "id"));
    cr_assert_null(strstr(log, "prefork"), "no prefork attempt once refused:\n%s", log);
    free(log);
    json_decref(job1);
    json_decref(job2);
    json_decref(job3);
    free(j1);
    free(j2);
    free(j3);
    tu_capd_stop(&c);
}

/* The "CAPD-FACTS {...}" line a pfmodels:facts cell prints. */
static json_t *facts_of(struct tu_capd *c, const char *job)
{
    json_t *j = af_wait_job(c, job, JOB_S);
    json_t *cell = only_cell(j, 0);
    cr_assert_str_eq(tu_str(cell, "state"), "ok", "%s", tu_str(cell, "reason"));
    char *log = cell_log(c, job, tu_str(cell, "id"));
    const char *p = strstr(log, "CAPD-FACTS ");
    cr_assert_not_null(p, "facts in the log:\n%s", log);
    json_t *f = json_loads(p + strlen("CAPD-FACTS "), JSON_DISABLE_EOF_CHECK, NULL);
    cr_assert_not_null(f);
    long cp, zp;
    json_object_set_new(f, "forked", json_boolean(forked_pids(log, &cp, &zp)));
    json_object_set_new(f, "zygote", json_integer(zp));
    free(log);
    json_decref(j);
    return f;
}

static json_int_t iget(json_t *o, const char *k)
{
    return json_integer_value(json_object_get(o, k));
}

/*
 * Isolation, seen from inside the cell: a prefork child has what a fresh
 * exec has (user, no-new-privs, parent-death signal, rlimits, only fds 0-3
 * of the cell's own kinds and no socket of the zygote's, its scratch dir as
 * cwd, its width variable) and its own session and process group, which is
 * neither capd's nor the zygote's.
 */
Test(prefork, child_isolation_equals_fresh_exec, .timeout = 1200)
{
    struct tu_capd c;
    cr_assert_eq(tu_capd_start(&c, NULL, NULL), 0);
    const char *roots = pf_model_roots();
    register_build(&c, "fresh", false, roots);
    register_build(&c, "pf", true, roots);
    const char *opts = "{\"iterations\":1,\"warmup\":0}";
    char *jf = submit(&c, "fresh", "d100000", NULL, "\"pfmodels:facts\"", "\"default\"",
                      "\"forward\"", opts);
    char *jp =
        submit(&c, "pf", "d200000", NULL, "\"pfmodels:facts\"", "\"default\"", "\"forward\"", opts);
    json_t *ff = facts_of(&c, jf), *fp = facts_of(&c, jp);
    cr_assert(json_is_false(json_object_get(ff, "forked")));
    cr_assert(json_is_true(json_object_get(fp, "forked")), "the prefork cell was forked");

    /* Fresh: the runner is capd's own child, leading its own session. */
    cr_assert_eq(iget(ff, "sid"), iget(ff, "pid"));
    cr_assert_eq(iget(ff, "pgid"), iget(ff, "pid"));
    cr_assert_eq(iget(ff, "ppid"), (json_int_t)c.pid);
    /* Prefork: its own session and group, the zygote's child, not in the
     * zygote's session, and not in capd's. */
    cr_assert_eq(iget(fp, "sid"), iget(fp, "pid"));
    cr_assert_eq(iget(fp, "pgid"), iget(fp, "pid"));
    cr_assert_eq(iget(fp, "ppid"), iget(fp, "zygote"));
    cr_assert_neq(iget(fp, "sid"), iget(fp, "zygote"));
    cr_assert_neq(iget(fp, "sid"), (json_int_t)getsid(c.pid));

    static const char *const same[] = {"uid",      "gid",     "no_new_privs",   "pdeathsig",
                                       "rlimits",  "sockets", "cwd_is_scratch", "fds_0_3",
                                       "env_width"};
    for (size_t i = 0; i < sizeof same / sizeof same[0]; i++) {
        size_t fl = JSON_COMPACT | JSON_SORT_KEYS | JSON_ENCODE_ANY;
        char *a = json_dumps(json_object_get(ff, same[i]), fl);
        char *b = json_dumps(json_object_get(fp, same[i]), fl);
        cr_assert_str_eq(a, b, "%s: fresh %s, prefork %s", same[i], a, b);
        free(a);
        free(b);
    }
    cr_assert_str_eq(tu_str(fp, "no_new_privs"), "1");
    cr_assert_eq(iget(fp, "pdeathsig"), SIGKILL);
    cr_assert_eq(json_array_size(json_object_get(fp, "sockets")), 0, "no zygote socket leaked");
    cr_assert(json_is_true(json_object_get(fp, "cwd_is_scratch")));
    cr_assert_str_eq(tu_str(fp, "env_width"), "default");
    cr_assert_eq(iget(json_object_get(fp, "rlimits"), "CORE"), 0);
    json_decref(ff);
    json_decref(fp);
    free(jf);
    free(jp);
    tu_capd_stop(&c);
}
