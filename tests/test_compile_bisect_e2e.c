/*
 * tests/test_compile_bisect_e2e.c - the compile axis end to end on the
 * official build (docs/api.md, "Compiled cells"): a head build with a fault
 * planted in one Inductor lowering (tests/helpers/planted_inductor_fault:
 * relu's lowering scaled by 1 + 2^-8, installed when Inductor's lowering
 * module is imported) is found at the right cells by the mode self-check
 * (the inductor cells diverged from eager under the float64 arbiter, the
 * aot_eager cells not: aot_eager lowers nothing), and the compiler
 * bisection capd starts by itself names that lowering: backend inductor,
 * subsystem lowerings, the relu node, with the command that repeats it.
 * The zoo's models that need nothing beyond torch (mlp, cnn, transformer,
 * lstm, embedding_bag) under inductor on the clean official build pass
 * the mode self-check at every x86 width this host runs, compiled within
 * the float64 rule of eager, and start no bisection. Needs the official-build lane
 * (CAPD_OFFICIAL_PYTHON); skipped, saying why, without it.
 */
#include <criterion/criterion.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "tests/helpers/common/api_fixtures.h"
#include "tests/helpers/common/json_want.h"
#include "tests/helpers/common/models_aa.h"
#include "tests/helpers/common/testutil.h"

/* Registers build NAME of the official interpreter, with the planted
 * fault's directory on its PYTHONPATH when FAULTY. */
static void official_build(const char *name, bool faulty)
{
    long st = 0;
    char env[600] = "{}";
    if (faulty)
        snprintf(env, sizeof env, "{\"PYTHONPATH\":\"%s/tests/helpers/planted_inductor_fault\"}",
                 tu_bin("CAPD_SOURCE_DIR"));
    json_t *b =
        tu_jsonf(&af_capd, "POST", "/v1/builds", &st,
                 "{\"name\":\"%s\",\"python\":\"%s\",\"env\":%s}", name, af_official_python(), env);
    char *d = af_dump(b);
    cr_assert_eq(st, 201, "register %s: %s", name, d);
    free(d);
    json_decref(b);
}

/* The x86 widths this host runs as the items of a JSON list, their count
 * in *N. */
static void runnable_widths(char *buf, size_t size, int *n)
{
    static const char *const x86[] = {"default", "avx2", "avx512", "amx"};
    buf[0] = 0;
    *n = 0;
    for (size_t i = 0; i < sizeof x86 / sizeof x86[0]; i++) {
        if (!tu_width_runnable(&af_capd, x86[i]))
            continue;
        snprintf(buf + strlen(buf), size - strlen(buf), "%s\"%s\"", buf[0] ? "," : "", x86[i]);
        ++*n;
    }
}

/* The id of MODE's cell of job ID (owned). */
static char *cell_id(const char *id, const char *mode)
{
    char path[64];
    snprintf(path, sizeof path, "/v1/jobs/%s", id);
    json_t *j = af_get_ok(path), *c;
    size_t i;
    char *out = NULL;
    json_array_foreach(json_object_get(j, "cells"), i, c)
    {
        if (!out && strcmp(jw_str(c, "mode"), mode) == 0)
            out = strdup(jw_str(c, "id"));
    }
    cr_assert_not_null(out, "no %s cell", mode);
    json_decref(j);
    return out;
}

Test(compile_bisect, a_planted_lowering_fault_is_named, AF_TWO_CELLS_SUITE, .timeout = 1700)
{
    official_build("clean", false);
    official_build("faulty", true);
    char widths[128];
    int nw;
    runnable_widths(widths, sizeof widths, &nw);
    char *clean = af_job_id(ma_modes_job(
        &af_capd, "clean", "\"mlp\",\"cnn\",\"transformer\",\"lstm\",\"embedding_bag\"", widths,
        "\"eager\",\"inductor\"", "c1ea001", NULL, ""));
    char *bad =
        af_job_id(ma_modes_job(&af_capd, "faulty", "\"mlp\"", "\"avx2\"",
                               "\"eager\",\"aot_eager\",\"inductor\"", "bad0001", NULL, ""));
    char path[200];
    snprintf(path, sizeof path, "/v1/jobs/%s/modes", clean);
    json_t *r = af_get_ok(path);
    char *rs = af_dump(r);
    cr_assert_str_eq(jw_str(r, "verdict"), "pass", "%s", rs);
    cr_assert_str_eq(jw_str(r, "modes.0.mode"), "inductor", "%s", rs);
    cr_assert_eq(jw_num(r, "modes.0.counts.compared"), 5 * nw, "%s", rs);
    cr_log_info("mode self-check of the zoo: %s", rs);
    free(rs);
    json_decref(r);
    char *l = af_wait_label(&af_capd, clean, "compiler_bisect_auto", 60);
    cr_assert_str_eq(l, "nothing diverged");
    free(l);

    /* the right cells: inductor left eager beyond the float64 rule,
     * aot_eager (which lowers nothing) did not */
    snprintf(path, sizeof path, "/v1/jobs/%s/modes", bad);
    r = af_get_ok(path);
    rs = af_dump(r);
    const struct jw_want mw[] = {JW_S("verdict", "diverged"),
                                 JW_S("reference", "float64"),
                                 JW_S("modes.0.mode", "aot_eager"),
                                 JW_S("modes.0.verdict", "pass"),
                                 JW_S("modes.1.mode", "inductor"),
                                 JW_S("modes.1.verdict", "diverged"),
                                 JW_S("modes.1.first_divergence.rule", "reference_float64")};
    jw_expect_all(r, mw);
    cr_log_info("mode self-check of the faulty build: %s", rs);
    free(rs);
    json_decref(r);
    l = af_wait_label(&af_capd, bad, "compiler_bisect_auto", 60);
    cr_assert_str_eq(l, "bisecting 1");
    free(l);

    /* the bisection names the lowering */
    char *ind = cell_id(bad, "inductor");
    snprintf(path, sizeof path, "/v1/jobs/%s/cells/%s/compiler-bisect", bad, ind);
    r = af_get_settled(&af_capd, path, 900);
    rs = af_dump(r);
    const struct jw_want bw[] = {JW_S("state", "ok"), JW_T("result.narrowed"),
                                 JW_S("result.backend", "inductor"),
                                 JW_S("result.subsystem", "lowerings")};
    jw_expect_all(r, bw);
    cr_assert(strstr(jw_str(r, "result.debug_info"), "relu"), "%s", rs);
    cr_assert(strstr(jw_str(r, "result.command"), "capd_runner.compbisect"), "%s", rs);
    cr_log_info("compiler bisection: %s", rs);
    free(rs);
    json_decref(r);
    free(ind);
    free(clean);
    free(bad);
}
