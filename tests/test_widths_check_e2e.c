/*
 * tests/test_widths_check_e2e.c - the width self-check (GET
 * /v1/jobs/{id}/widths, `capctl widths check`) on real torch cells of
 * Debian's build, with no control job: the zoo's mlp at default and every
 * other width this host runs, forward, captured with the float64
 * reference. The build as it is passes at every width; the same build
 * with examples/perturbed-build, which scales every Linear's output by
 * 1 + 2e-4 at one width only (CAPD_PERTURB_WIDTH, the widest this host
 * runs), diverges at that width, at the first Linear layer, by the float64
 * arbiter's judgement, and passes at the others. capctl's exit status
 * follows: 0, then 1. The same holds on the official wheel (the lane of
 * scripts/official-torch.sh, CAPD_OFFICIAL_PYTHON) with
 * capd_examples.gemm:wide_mlp, whose matrix products give other bits at
 * each width there (MKL's SSE4.2, AVX2 and AVX-512 branches): the clean
 * build is within the float64 reference's error at every width.
 */
#include <criterion/criterion.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "tests/helpers/common/api_fixtures.h"
#include "tests/helpers/common/json_want.h"
#include "tests/helpers/common/models_aa.h"
#include "tests/helpers/common/testutil.h"
#include "tests/helpers/common/text_want.h"

/* How long one job of real torch cells may take. */
#define JOB_S 600

static void register_perturbed(const struct tu_capd *c, const char *python, const char *width)
{
    long st = 0;
    json_t *j = tu_jsonf(c, "POST", "/v1/builds", &st,
                         "{\"name\":\"perturbed\",\"python\":\"%s\",\"env\":{\"PYTHONPATH\":"
                         "\"%s/examples/perturbed-build\",\"CAPD_PERTURB_WIDTH\":\"%s\"},"
                         "\"model_roots\":[\"%s/examples/models\"]}",
                         python, tu_bin("CAPD_SOURCE_DIR"), width, tu_bin("CAPD_SOURCE_DIR"));
    char *d = af_dump(j);
    cr_assert_eq(st, 201, "register the perturbed build: %s", d);
    free(d);
    json_decref(j);
}

/* MODEL (a JSON string) at WIDTHS (JSON list contents), forward, on
 * BUILD: one sample per record and the float64 reference, no timing. Every
 * cell must end ok. */
static char *run_job(const struct tu_capd *c, const char *build, const char *commit,
                     const char *model, const char *widths)
{
    struct af_job job = {.project = "selfcheck",
                         .commit = commit,
                         .build = build,
                         .models = model,
                         .widths = widths,
                         .passes = "\"forward\"",
                         .options = "{\"iterations\":0,\"warmup\":0,\"batch\":1,"
                                    "\"capture\":\"sample\",\"reference\":\"float64\"}"};
    char *id = af_submit_job(c, &job);
    json_t *j = af_wait_job(c, id, JOB_S);
    size_t i;
    json_t *cell;
    json_array_foreach(json_object_get(j, "cells"), i, cell)
    {
        cr_assert_str_eq(tu_str(cell, "state"), "ok", "%s %s: %s", commit, tu_str(cell, "width"),
                         tu_str(cell, "reason"));
    }
    json_decref(j);
    return id;
}

static json_t *self_check(const struct tu_capd *c, const char *id, char **text)
{
    char p[128];
    long st = 0;
    snprintf(p, sizeof p, "/v1/jobs/%s/widths", id);
    json_t *r = tu_json(c, "GET", p, NULL, &st);
    char *d = af_dump(r);
    cr_assert_eq(st, 200, "GET %s: %s", p, d);
    free(d);
    struct tu_resp resp;
    snprintf(p, sizeof p, "/v1/jobs/%s/widths?format=text", id);
    cr_assert_eq(tu_http(c, "GET", p, NULL, 0, NULL, &resp), 0);
    cr_assert_eq(resp.status, 200);
    *text = strdup(resp.body);
    tu_resp_free(&resp);
    return r;
}

static struct tu_capd c;

/* Numerics-only cells (iterations 0) may run two at a time. */
static void start(void)
{
    const char *extra[] = {"--max-parallel-numerics", "2", NULL};
    af_start_capd(&c, NULL, extra);
}

/* Stops capd and removes its directory, also after a failed assertion. */
static void stop(void)
{
    af_stop_own_capd(&c);
}

/* The self-check on PYTHON's build with MODEL, whose first Linear is
 * LAYER; C1 and C2 the commits of the clean and the perturbed job. */
static void check_build(const char *python, const char *model, const char *layer, const char *c1,
                        const char *c2)
{
    const char *pw = tu_widest_width(&c);
    if (strcmp(pw, "default") == 0)
        cr_skip_test("this host's CPU runs no width wider than default: nothing to check");
    char widths[64], *text = NULL, *out = NULL;
    size_t nw = ma_runnable_widths(&c, widths, sizeof widths);
    char key[64], cmd[64];
    snprintf(key, sizeof key, "%s.0.forward.output.0", layer);
    ma_register(&c, "clean", python);
    register_perturbed(&c, python, pw);
    char *clean = run_job(&c, "clean", c1, model, widths);
    char *pert = run_job(&c, "perturbed", c2, model, widths);

    /* (a) Every width within tolerance of default by the float64 arbiter. */
    json_t *r = self_check(&c, clean, &text);
    char *d = af_dump(r);
    cr_log_info("clean build:\n%s", text);
    const struct jw_want clean_want[] = {JW_S("verdict", "pass"), JW_S("reference", "float64"),
                                         JW_N("note"), JW_S("baseline_width", "default")};
    jw_expect_all(r, clean_want);
    json_t *ws = json_object_get(r, "widths");
    cr_assert_eq(json_array_size(ws), nw - 1, "every width but default: %s", d);
    size_t i;
    json_t *w;
    json_array_foreach(ws, i, w)
    {
        cr_assert_str_eq(jw_str(w, "verdict"), "pass", "%s", d);
        cr_assert_eq(json_integer_value(jw_path(w, "counts.compared")), 1, "%s", d);
        cr_assert(json_is_null(json_object_get(w, "first_divergence")), "%s", d);
    }
    tw_expect_has(text, "capd width self-check: pass", "judged by the float64 reference", NULL);
    free(d);
    free(text);
    json_decref(r);
    snprintf(cmd, sizeof cmd, "widths check %s", c1);
    cr_assert_eq(af_capctl(&c, cmd, &out), 0, "%s", out);
    free(out);

    /* (b) The perturbed width diverges at the first Linear, by the arbiter;
     * the others pass. */
    r = self_check(&c, pert, &text);
    d = af_dump(r);
    cr_log_info("perturbed at %s:\n%s", pw, text);
    cr_assert_str_eq(jw_str(r, "verdict"), "diverged", "%s", d);
    json_array_foreach(json_object_get(r, "widths"), i, w)
    {
        if (strcmp(jw_str(w, "width"), pw) != 0) {
            cr_assert_str_eq(jw_str(w, "verdict"), "pass", "%s", d);
            continue;
        }
        const struct jw_want div[] = {
            JW_S("verdict", "diverged"),
            JW_I("counts.diverged", 1),
            JW_S("first_divergence.pass", "forward"),
            JW_S("first_divergence.module", layer),
            JW_S("first_divergence.key", key),
            JW_S("first_divergence.rule", "reference_float64"),
            JW_T("first_divergence.reference.judged"),
            JW_F("first_divergence.reference.passed"),
            JW_S("cells.0.status", "diverged"),
        };
        jw_expect_all(w, div);
    }
    char said[64];
    snprintf(said, sizeof said, "layer %s", layer);
    tw_expect_has(text, "capd width self-check: diverged", said, "reference_float64: err ", NULL);
    free(d);
    free(text);
    json_decref(r);

    /* (d) capctl's exit status: 1 for the diverged width. */
    snprintf(cmd, sizeof cmd, "widths check %s", c2);
    cr_assert_eq(af_capctl(&c, cmd, &out), 1, "%s", out);
    cr_assert(strstr(out, "diverged"), "%s", out);
    free(out);
    free(clean);
    free(pert);
}

Test(widths_check_e2e, clean_passes_perturbed_width_diverges_at_its_first_linear, .init = start,
     .fini = stop, .timeout = 900)
{
    check_build(tu_python(), "\"mlp\"", "fc1", "5e1f001", "5e1f002");
}

/* The official-build lane (af_official_python: skipped without one, or
 * failed under CI=true). */
Test(widths_check_e2e, official_wheel_within_reference_at_every_width, .init = start, .fini = stop,
     .timeout = 900)
{
    check_build(af_official_python(), "\"capd_examples.gemm:wide_mlp\"", "0", "0ff1c01", "0ff1c02");
}
