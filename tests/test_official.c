/*
 * tests/test_official.c - the official PyTorch wheel (MKL, oneDNN,
 * Inductor; torchvision, timm, transformers from PyPI) beside Debian's
 * build, run by the real capd. The interpreter is the official-build lane
 * that scripts/test makes with scripts/official-torch.sh and hands over as
 * CAPD_OFFICIAL_PYTHON. Without it each test says skipped and why
 * (CAPD_OFFICIAL_SKIP), except under CI=true, where a missing lane fails.
 *
 * hub_models_aa: model-library code (a torchvision CNN, a timm ResNet, a
 *   transformers BERT encoder) at every width this host runs, forward and
 *   backward, twice: every cell ok, the two runs identical or
 *   nondeterministic only, no outcome change.
 * debian_vs_official_zoo: Debian's torch as control, the official wheel as
 *   head, the whole zoo in both passes with the float64 reference: every
 *   cell compared, and the environment section names both torch versions
 *   and both BLAS libraries, as each interpreter reports them itself and
 *   as the runner read them back (the reference BLAS, with no width, and
 *   MKL).
 * widths_pin_mkl: an MLP of long matrix products (capd_examples.gemm) at
 *   every x86 width this host runs gives one MKL
 *   branch per width in its fingerprints and other GEMM bits at avx2 than
 *   at avx512; a build whose Python start-up forces MKL's AVX-512 branch
 *   (MKL_CBWR and MKL_ENABLE_INSTRUCTIONS) has its narrower cells
 *   unsupported, naming MKL.
 * compiled_cells_name_their_isa: mlp eager and inductor at every x86 width
 *   this host runs: Inductor's vector ISA named per width, an A/A compared
 *   by mode, and Debian's torch refusing compiled cells with the reason.
 */
#include <criterion/criterion.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "tests/helpers/common/api_fixtures.h"
#include "tests/helpers/common/json_want.h"
#include "tests/helpers/common/models_aa.h"
#include "tests/helpers/common/testutil.h"

Test(official, hub_models_aa, AF_TWO_CELLS_SUITE, .timeout = 1500)
{
    const char *py = af_official_python();
    ma_register(&af_capd, "official", py);
    ma_models_aa(&af_capd, "official",
                 "\"capd_examples.vision:squeezenet1_1\",\"capd_examples.hub:timm_resnet10t\","
                 "\"capd_examples.hub:bert_encoder\"",
                 3);
}

/* What PYTHON's torch says of itself: "VERSION BLAS_INFO", parsed into
 * VERSION and BLAS (each at most 63 bytes). */
static void torch_identity(const char *python, char version[64], char blas[64])
{
    char cmd[1024];
    snprintf(cmd, sizeof cmd,
             "'%s' -c 'import torch, re; "
             "m = re.search(r\"BLAS_INFO=([^,]*)\", torch.__config__.show()); "
             "print(torch.__version__, m.group(1) if m else \"-\")'",
             python);
    FILE *f = popen(cmd, "r");
    cr_assert_not_null(f, "%s", cmd);
    int n = fscanf(f, "%63s %63s", version, blas);
    int rc = pclose(f);
    cr_assert(n == 2 && rc == 0, "%s said its torch version and BLAS (rc %d)", python, rc);
}

/* The environment difference of FIELD in compare result R, or NULL. */
static json_t *difference(json_t *r, const char *field)
{
    size_t i;
    json_t *d;
    json_array_foreach(jw_path(r, "environment.differences"), i, d)
    {
        if (strcmp(jw_str(d, "field"), field) == 0)
            return d;
    }
    return NULL;
}

static void want_difference(json_t *r, const char *field, const char *control, const char *head,
                            const char *text)
{
    json_t *d = difference(r, field);
    char *env = af_dump(json_object_get(r, "environment"));
    cr_assert_not_null(d, "environment names %s: %s", field, env);
    cr_assert_str_eq(jw_str(d, "control"), control, "%s: %s", field, env);
    cr_assert_str_eq(jw_str(d, "head"), head, "%s: %s", field, env);
    cr_assert(strstr(text, control) && strstr(text, head), "the text report names %s %s and %s",
              field, control, head);
    free(env);
}

static const char *const zoo[] = {"mlp",         "cnn",  "resnet18",     "mobilenet_v3_small",
                                  "transformer", "lstm", "embedding_bag"};
#define N_ZOO (sizeof zoo / sizeof zoo[0])

static char *zoo_job(const char *build, const char *commit, const char *control, const char *width)
{
    char models[256] = "", widths[32];
    for (size_t i = 0; i < N_ZOO; i++)
        snprintf(models + strlen(models), sizeof models - strlen(models), "%s\"%s\"", i ? "," : "",
                 zoo[i]);
    snprintf(widths, sizeof widths, "\"%s\"", width);
    return ma_submit(&af_capd, build, models, widths, commit, control,
                     "{\"iterations\":1,\"warmup\":0,\"capture\":\"sample\","
                     "\"reference\":\"float64\",\"replay\":\"off\"}");
}

Test(official, debian_vs_official_zoo, AF_TWO_CELLS_SUITE, .timeout = 1500)
{
    const char *py = af_official_python();
    ma_register(&af_capd, "debian", tu_python());
    ma_register(&af_capd, "official", py);
    const char *width = tu_widest_width(&af_capd);
    char *ctl = zoo_job("debian", "bbbb001", NULL, width);
    char *head = zoo_job("official", "bbbb002", "bbbb001", width);
    for (int k = 0; k < 2; k++) {
        const char *id = k ? head : ctl;
        json_t *j = tu_wait_job(&af_capd, id, 1200);
        cr_assert_not_null(j, "job %s finished", id);
        size_t i;
        json_t *cell;
        json_array_foreach(json_object_get(j, "cells"), i, cell)
        {
            cr_assert_str_eq(jw_str(cell, "state"), "ok", "%s %s %s: %s", k ? "official" : "debian",
                             jw_str(cell, "model"), jw_str(cell, "pass"),
                             json_string_value(json_object_get(cell, "reason")));
        }
        json_decref(j);
    }

    char path[256];
    snprintf(path, sizeof path, "/v1/compare?control=%s&head=%s", ctl, head);
    long st = 0;
    json_t *r = tu_json(&af_capd, "GET", path, NULL, &st);
    cr_assert_eq(st, 200, "%s", path);
    snprintf(path, sizeof path, "/v1/compare?control=%s&head=%s&format=text", ctl, head);
    struct tu_resp resp;
    cr_assert_eq(tu_http(&af_capd, "GET", path, NULL, 0, NULL, &resp), 0);
    cr_assert_eq(resp.status, 200);
    cr_log_info("Debian's torch against the official wheel:\n%s", resp.body);

    /* Every cell compared: all of the matrix, none missing, each pair of ok
     * cells with tensors matched, by value or by the reference. */
    char *counts = af_dump(json_object_get(r, "counts"));
    cr_assert_eq(json_integer_value(jw_path(r, "counts.cells")), (json_int_t)(N_ZOO * 2), "%s",
                 counts);
    cr_assert_eq(json_integer_value(jw_path(r, "counts.missing_cells")), 0, "%s", counts);
    cr_assert_eq(json_integer_value(jw_path(r, "counts.extra_cells")), 0, "%s", counts);
    cr_assert_eq(json_integer_value(jw_path(r, "counts.incomparable")), 0, "%s", counts);
    cr_assert_eq(json_integer_value(jw_path(r, "counts.not_run")), 0, "%s", counts);
    cr_assert_eq(json_integer_value(jw_path(r, "counts.outcome_regressions")), 0, "%s", counts);
    size_t i;
    json_t *c;
    json_array_foreach(json_object_get(r, "cells"), i, c)
    {
        char *d = af_dump(c);
        cr_assert_gt(json_integer_value(json_object_get(c, "tensors_compared")), 0, "%s", d);
        cr_assert(strstr(resp.body, jw_str(c, "model")), "the text report names %s",
                  jw_str(c, "model"));
        free(d);
    }
    free(counts);

    /* The environment names both builds as they name themselves. */
    char dv[64], db[64], ov[64], ob[64];
    torch_identity(tu_python(), dv, db);
    torch_identity(py, ov, ob);
    cr_log_info("control: torch %s, BLAS %s; head: torch %s, BLAS %s", dv, db, ov, ob);
    want_difference(r, "torch.version", dv, ov, resp.body);
    /* What the runner read back: Debian's torch calls the reference BLAS,
     * which has no width; the wheel calls MKL. */
    json_t *lib = difference(r, "libraries.blas.library");
    cr_assert_not_null(lib, "the environment names the BLAS each side ran");
    cr_assert_str_eq(jw_str(lib, "control"), "reference");
    cr_assert_str_eq(jw_str(lib, "head"), "mkl");
    json_t *hw = difference(r, "libraries.blas.has_width");
    cr_assert_not_null(hw, "the environment says which BLAS has a width");
    cr_assert_str_eq(jw_str(hw, "control"), "false");
    cr_assert_str_eq(jw_str(hw, "head"), "true");
    if (strcmp(db, ob) != 0)
        want_difference(r, "build_settings.BLAS_INFO", db, ob, resp.body);
    tu_resp_free(&resp);
    json_decref(r);
    free(ctl);
    free(head);
}

/* JOB's cell at WIDTH in MODE, which must have ended STATE: GET of it
 * (its fingerprint), owned. */
static json_t *mode_cell(json_t *job, const char *width, const char *mode, const char *state)
{
    size_t i;
    json_t *cell;
    json_array_foreach(json_object_get(job, "cells"), i, cell)
    {
        if (strcmp(jw_str(cell, "width"), width) || strcmp(jw_str(cell, "mode"), mode))
            continue;
        cr_assert_str_eq(jw_str(cell, "state"), state, "%s %s cell: %s", width, mode,
                         json_string_value(json_object_get(cell, "reason")));
        char path[256];
        snprintf(path, sizeof path, "/v1/jobs/%s/cells/%s", jw_str(job, "id"), jw_str(cell, "id"));
        long st = 0;
        json_t *c = tu_json(&af_capd, "GET", path, NULL, &st);
        cr_assert_eq(st, 200, "%s", path);
        return c;
    }
    cr_assert_fail("no %s %s cell", width, mode);
    return NULL;
}

static const char *const x86[] = {"default", "avx2", "avx512", "amx"};
#define N_X86 (sizeof x86 / sizeof x86[0])

/* The x86 widths this host runs, as the contents of a JSON list. */
static void runnable(char *buf, size_t size, bool run[N_X86])
{
    buf[0] = 0;
    for (size_t i = 0; i < N_X86; i++) {
        run[i] = tu_width_runnable(&af_capd, x86[i]);
        if (run[i])
            snprintf(buf + strlen(buf), size - strlen(buf), "%s\"%s\"", buf[0] ? "," : "", x86[i]);
    }
}

/* The CPU's vendor_id (GenuineIntel, AuthenticAMD) into BUF, "" where
 * /proc/cpuinfo does not say. */
static const char *cpu_vendor(char buf[64])
{
    char line[256];
    buf[0] = 0;
    FILE *f = fopen("/proc/cpuinfo", "r");
    while (f && fgets(line, sizeof line, f))
        if (sscanf(line, "vendor_id : %63s", buf) == 1)
            break;
    if (f)
        fclose(f);
    return buf;
}

static json_t *mlp_job(const char *build, const char *commit, const char *widths)
{
    char *id = ma_submit(&af_capd, build, "\"capd_examples.gemm:wide_mlp\"", widths, commit, NULL,
                         "{\"iterations\":0,\"capture\":\"full\"}");
    json_t *j = tu_wait_job(&af_capd, id, 900);
    cr_assert_not_null(j, "job %s finished", id);
    free(id);
    return j;
}

Test(official, widths_pin_mkl, AF_TWO_CELLS_SUITE, .timeout = 1500)
{
    const char *py = af_official_python();
    char widths[128];
    bool run[N_X86];
    runnable(widths, sizeof widths, run);
    if (!run[1] || !run[2])
        cr_skip_test("this host does not run both avx2 and avx512 (%s): MKL's branches cannot "
                     "be told apart here",
                     widths);
    char vendor[64];
    bool intel = strcmp(cpu_vendor(vendor), "GenuineIntel") == 0;
    ma_register(&af_capd, "official", py);
    json_t *j = mlp_job("official", "cccc001", widths);
    const char *seen[N_X86] = {0};
    json_t *fps[N_X86] = {0};
    for (size_t i = 0; i < N_X86; i++) {
        if (!run[i])
            continue;
        fps[i] = mode_cell(j, x86[i], "eager", "ok");
        json_t *blas = jw_path(fps[i], "fingerprint.libraries.blas");
        char *d = af_dump(blas);
        cr_assert_str_eq(jw_str(blas, "library"), "mkl", "%s: %s", x86[i], d);
        if (!intel) {
            /* Off Intel MKL takes only COMPATIBLE (the default width's);
             * a width that asks for another branch says MKL ignored it. */
            cr_assert(strstr(jw_str(blas, "reason"), vendor) ||
                          strcmp(jw_str(blas, "branch"), "COMPATIBLE") == 0,
                      "%s on %s: %s", x86[i], vendor, d);
            free(d);
            continue;
        }
        seen[i] = jw_str(blas, "branch");
        cr_assert(seen[i] && *seen[i], "%s: MKL's branch is named: %s", x86[i], d);
        for (size_t k = 0; k < i; k++)
            cr_assert(!seen[k] || strcmp(seen[k], seen[i]) != 0,
                      "widths %s and %s name one MKL branch %s", x86[k], x86[i], seen[i]);
        cr_log_info("official wheel, width %s: %s", x86[i], d);
        free(d);
    }

    if (!intel) {
        for (size_t i = 0; i < N_X86; i++)
            json_decref(fps[i]);
        json_decref(j);
        cr_skip_test("MKL takes no branch but COMPATIBLE on this %s CPU (each width's "
                     "fingerprint says so, checked): its widths' MKL paths and GEMM bits cannot "
                     "be told apart here",
                     vendor);
    }
    /* avx2 and avx512 compute the mlp's GEMMs with other bits. */
    char path[256];
    snprintf(path, sizeof path, "/v1/compare?job=%s&control_width=avx2&head_width=avx512",
             jw_str(j, "id"));
    long st = 0;
    json_t *r = tu_json(&af_capd, "GET", path, NULL, &st);
    cr_assert_eq(st, 200, "%s", path);
    json_t *cell = json_array_get(json_object_get(r, "cells"), 0);
    char *d = af_dump(cell);
    cr_assert_str_neq(jw_str(cell, "status"), "identical", "%s", d);
    free(d);
    json_decref(r);
    for (size_t i = 0; i < N_X86; i++)
        json_decref(fps[i]);
    json_decref(j);

    /* A build whose start-up forces MKL's AVX-512 branch, past capd's
     * variables: its narrower cells did not run at their width. */
    char *dir = tu_tmpdir();
    /* Both variables: MKL_ENABLE_INSTRUCTIONS=AVX2 alone would turn a
     * forced MKL_CBWR=AVX512 back into MKL's own choice under the cap. */
    cr_assert_eq(tu_sh("chmod 755 '%s' && printf 'import os\\nos.environ[\"MKL_CBWR\"] = "
                       "\"AVX512\"\\nos.environ[\"MKL_ENABLE_INSTRUCTIONS\"] = \"AVX512\"\\n' "
                       "> '%s/sitecustomize.py'",
                       dir, dir),
                 0);
    char body[1024];
    snprintf(body, sizeof body,
             "{\"name\":\"forced\",\"python\":\"%s\",\"env\":{\"PYTHONPATH\":\"%s\"},"
             "\"model_roots\":[\"%s/examples/models\"]}",
             py, dir, tu_bin("CAPD_SOURCE_DIR"));
    json_decref(tu_json(&af_capd, "POST", "/v1/builds", body, &st));
    cr_assert_eq(st, 201, "%s", body);
    j = mlp_job("forced", "cccc002", widths);
    for (size_t i = 0; i < 3; i++) {
        if (!run[i])
            continue;
        json_t *c = mode_cell(j, x86[i], "eager", i < 2 ? "unsupported" : "ok");
        const char *why = jw_str(c, "reason");
        if (i < 2)
            cr_assert(why && strstr(why, "MKL") && strstr(why, "AVX512") && strstr(why, x86[i]),
                      "%s: the reason names MKL, its branch and the width: %s", x86[i], why);
        json_decref(c);
    }
    json_decref(j);
    tu_sh("rm -rf '%s'", dir);
    free(dir);
}

/* A job of mlp at WIDTHS (JSON list contents), forward, in MODES, numerics
 * only, of BUILD at COMMIT (against CONTROL, or none), replay off, waited
 * for. */
static json_t *modes_job(const char *build, const char *commit, const char *control,
                         const char *widths, const char *modes)
{
    return ma_modes_job(&af_capd, build, "\"mlp\"", widths, modes, commit, control,
                        ",\"replay\":\"off\"");
}

/*
 * The compile axis (docs/api.md, "Compiled cells"): mlp at every x86
 * width this host runs, eager and inductor, on the official wheel: every
 * cell ok, the inductor cells' fingerprints naming the vector ISA Inductor
 * picked, none at default and the width's own at avx2 and avx512; the same
 * job again compares cell for cell by mode, nothing diverged. On Debian's
 * torch (no torch.compile) the compiled cells are unsupported, saying so.
 */
Test(official, compiled_cells_name_their_isa, AF_TWO_CELLS_SUITE, .timeout = 1500)
{
    char widths[128];
    bool run[N_X86];
    runnable(widths, sizeof widths, run);
    ma_register(&af_capd, "official", af_official_python());
    ma_register(&af_capd, "debian", tu_python());
    json_t *a = modes_job("official", "dddd001", NULL, widths, "\"eager\",\"inductor\"");
    for (size_t i = 0; i < N_X86 - 1; i++) { /* amx: an ISA of its own */
        if (!run[i])
            continue;
        json_decref(mode_cell(a, x86[i], "eager", "ok"));
        json_t *c = mode_cell(a, x86[i], "inductor", "ok");
        const char *isa = jw_str(c, "fingerprint.compile.vec_isa");
        char *d = af_dump(jw_path(c, "fingerprint.compile"));
        cr_assert_not_null(isa, "%s: %s", x86[i], d);
        if (i == 0)
            cr_assert(strstr(isa, "INVALID") != NULL, "default vectorises nothing: %s", d);
        else
            cr_assert(strncmp(isa, x86[i], strlen(x86[i])) == 0, "%s: %s", x86[i], d);
        cr_log_info("inductor at %s: %s", x86[i], d);
        free(d);
        json_decref(c);
    }
    /* compiled against eager at each width, judged by float64: Inductor
     * rounds differently, never worse than the arbiter allows */
    char path[96];
    snprintf(path, sizeof path, "/v1/jobs/%s/modes", jw_str(a, "id"));
    long mst = 0;
    json_t *mc = tu_json(&af_capd, "GET", path, NULL, &mst);
    char *ms = af_dump(mc);
    cr_assert_eq(mst, 200, "%s", ms);
    const struct jw_want mw[] = {JW_S("verdict", "pass"), JW_S("reference", "float64"),
                                 JW_S("modes.0.mode", "inductor"), JW_A("modes.1")};
    jw_expect_all(mc, mw);
    cr_assert_gt(jw_num(mc, "modes.0.counts.compared"), 0, "%s", ms);
    cr_log_info("mode self-check: %s", ms);
    free(ms);
    json_decref(mc);
    json_t *b = modes_job("official", "dddd002", "dddd001", widths, "\"eager\",\"inductor\"");
    long st = 0;
    json_t *diff = tu_json(&af_capd, "GET", "/v1/commits/dddd002/diff", NULL, &st);
    cr_assert_eq(st, 200);
    char *ds = af_dump(diff);
    cr_assert_eq(json_array_size(json_object_get(diff, "missing_cells")), 0, "%s", ds);
    size_t i, inductor = 0;
    json_t *cell;
    json_array_foreach(json_object_get(diff, "cells"), i, cell)
    {
        const char *s = jw_str(cell, "status");
        cr_assert(!strcmp(s, "identical") || !strcmp(s, "within_tolerance"), "%s/%s: %s: %s",
                  jw_str(cell, "width"), jw_str(cell, "mode"), s, ds);
        if (strcmp(jw_str(cell, "mode"), "inductor") != 0)
            continue;
        inductor++;
        /* the compile time beside the steady state, each side's own */
        cr_assert_gt(jw_num(cell, "perf.control_compile_ns"), 0, "%s", ds);
        cr_assert_gt(jw_num(cell, "perf.head_compile_ns"), 0, "%s", ds);
    }
    cr_assert_eq(inductor, json_array_size(json_object_get(diff, "cells")) / 2, "%s", ds);
    free(ds);
    json_decref(diff);
    json_t *deb = modes_job("debian", "dddd003", NULL, "\"avx2\"", "\"eager\",\"aot_eager\"");
    json_decref(mode_cell(deb, "avx2", "eager", "ok"));
    json_t *u = mode_cell(deb, "avx2", "aot_eager", "unsupported");
    cr_assert(strstr(jw_str(u, "reason"), "torch.compile") != NULL, "%s", jw_str(u, "reason"));
    json_decref(u);
    json_decref(deb);
    json_decref(a);
    json_decref(b);
}
