/*
 * tests/test_models.c - third-party model code under capd's defaults: the
 * user models of examples/models (torchvision architectures outside the
 * zoo, torchaudio models) run by the real capd and Debian's torch at every
 * width this host runs, forward and backward. With the default memory
 * limits (no address-space cap, a cgroup or the watchdog) every cell must
 * end ok, and the same build compared with itself must pass on numerics
 * with no outcome change (issue 17: allocations failing under an
 * address-space cap turned such cells into failures that came and went).
 */
#include <criterion/criterion.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "tests/helpers/common/api_fixtures.h"
#include "tests/helpers/common/testutil.h"

/* Two of each kind keep the suite short; examples/models has more. */
static const char *const models =
    "\"capd_examples.vision:squeezenet1_1\",\"capd_examples.vision:shufflenet_v2_x0_5\","
    "\"capd_examples.audio:conv_tasnet\",\"capd_examples.audio:conformer\"";
#define N_MODELS 4

static char *submit(struct tu_capd *c, const char *commit, const char *control, const char *widths)
{
    struct af_job job = {.project = "models",
                         .commit = commit,
                         .control = control,
                         .build = "debian",
                         .models = models,
                         .widths = widths,
                         .passes = "\"forward\",\"backward\"",
                         .options = "{\"iterations\":1,\"warmup\":0}"};
    return af_submit_job(c, &job);
}

/* Every cell ok, with its memory limit, peak and CPU time on the record. */
static void check_job(struct tu_capd *c, const char *id, size_t ncells)
{
    json_t *job = tu_wait_job(c, id, 900);
    cr_assert_not_null(job, "job %s finished", id);
    json_t *cells = json_object_get(job, "cells");
    cr_assert_eq(json_array_size(cells), ncells);
    size_t i;
    json_t *cell;
    json_array_foreach(cells, i, cell)
    {
        const char *model = json_string_value(json_object_get(cell, "model"));
        const char *width = json_string_value(json_object_get(cell, "width"));
        cr_assert_str_eq(json_string_value(json_object_get(cell, "state")), "ok", "%s %s %s: %s",
                         model, width, json_string_value(json_object_get(cell, "pass")),
                         json_string_value(json_object_get(cell, "reason")));
        cr_assert_gt(json_integer_value(json_object_get(cell, "memory_limit_bytes")), 0);
        cr_assert_gt(json_integer_value(json_object_get(cell, "peak_rss_bytes")), 0);
        cr_assert_gt(json_integer_value(json_object_get(cell, "cpu_time_ms")), 0);
    }
    json_decref(job);
}

Test(models, examples_ok_at_every_width_and_aa_pass, .timeout = 1200)
{
    struct tu_capd c;
    /* The defaults, but two cells at a time: what an operator changes. */
    const char *extra[] = {"--max-parallel", "2", NULL};
    cr_assert_eq(tu_capd_start(&c, NULL, extra), 0);
    const char *py = getenv("CAPD_PYTHON") ? getenv("CAPD_PYTHON") : "/usr/bin/python3";
    long st = 0;
    json_t *b = tu_jsonf(&c, "POST", "/v1/builds", &st,
                         "{\"name\":\"debian\",\"python\":\"%s\","
                         "\"model_roots\":[\"%s/examples/models\"]}",
                         py, tu_bin("CAPD_SOURCE_DIR"));
    cr_assert_eq(st, 201, "register the build");
    json_decref(b);
    static const char *const all[] = {"default", "avx2", "avx512"};
    char widths[64] = "";
    size_t nw = 0;
    for (size_t w = 0; w < 3; w++) {
        if (!tu_width_runnable(&c, all[w]))
            continue;
        snprintf(widths + strlen(widths), sizeof widths - strlen(widths), "%s\"%s\"", nw ? "," : "",
                 all[w]);
        nw++;
    }
    cr_assert_gt(nw, 0, "the host runs some width");
    char *j1 = submit(&c, "aaaa001", NULL, widths);
    char *j2 = submit(&c, "aaaa002", "aaaa001", widths);
    check_job(&c, j1, N_MODELS * nw * 2);
    check_job(&c, j2, N_MODELS * nw * 2);

    char path[256];
    snprintf(path, sizeof path,
             "/v1/compare?control=%s&head=%s&overrides=%%7B%%22perf_gate%%22%%3Afalse%%7D", j1, j2);
    json_t *cmp = tu_json(&c, "GET", path, NULL, &st);
    cr_assert_eq(st, 200);
    json_t *counts = json_object_get(cmp, "counts");
    cr_assert_str_eq(json_string_value(json_object_get(cmp, "verdict")), "pass", "A/A: %s",
                     json_dumps(counts, JSON_COMPACT));
    json_int_t same = json_integer_value(json_object_get(counts, "identical")) +
                      json_integer_value(json_object_get(counts, "nondeterministic"));
    cr_assert_eq(same, (json_int_t)(N_MODELS * nw * 2), "identical or nondeterministic only: %s",
                 json_dumps(counts, JSON_COMPACT));
    cr_assert_eq(json_integer_value(json_object_get(counts, "outcome_regressions")), 0);
    json_decref(cmp);
    free(j1);
    free(j2);
    cr_assert_eq(tu_capd_stop(&c), 0);
}
