/* tests/helpers/common/models_aa.c - see models_aa.h. */
#include "tests/helpers/common/models_aa.h"

#include <criterion/criterion.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "tests/helpers/common/api_fixtures.h"

void ma_register(const struct tu_capd *c, const char *name, const char *python)
{
    long st = 0;
    json_t *b = tu_jsonf(c, "POST", "/v1/builds", &st,
                         "{\"name\":\"%s\",\"python\":\"%s\","
                         "\"model_roots\":[\"%s/examples/models\"]}",
                         name, python, tu_bin("CAPD_SOURCE_DIR"));
    char *d = af_dump(b);
    cr_assert_eq(st, 201, "register build %s (%s): %s", name, python, d);
    free(d);
    json_decref(b);
}

size_t ma_runnable_widths(const struct tu_capd *c, char *buf, size_t size)
{
    static const char *const all[] = {"default", "avx2", "avx512"};
    size_t n = 0, len = 0;
    buf[0] = '\0';
    for (size_t w = 0; w < sizeof all / sizeof all[0]; w++) {
        if (!tu_width_runnable(c, all[w]))
            continue;
        int k = snprintf(buf + len, size - len, "%s\"%s\"", n ? "," : "", all[w]);
        cr_assert(k > 0 && (size_t)k < size - len, "widths fit in %zu bytes", size);
        len += (size_t)k;
        n++;
    }
    cr_assert_gt(n, 0, "the host runs some width");
    return n;
}

char *ma_submit(const struct tu_capd *c, const char *build, const char *models, const char *widths,
                const char *commit, const char *control, const char *options)
{
    struct af_job job = {.project = "models",
                         .commit = commit,
                         .control = control,
                         .build = build,
                         .models = models,
                         .widths = widths,
                         .passes = "\"forward\",\"backward\"",
                         .options = options};
    return af_submit_job(c, &job);
}

json_t *ma_modes_job(const struct tu_capd *c, const char *build, const char *models,
                     const char *widths, const char *modes, const char *commit, const char *control,
                     const char *extra)
{
    char options[256];
    snprintf(options, sizeof options,
             "{\"iterations\":0,\"reference\":\"float64\",\"capture\":\"sample\"%s}", extra);
    struct af_job job = {"p", commit, control, build, models, widths, "\"forward\"", options};
    char *id = af_submit_modes_job(c, &job, modes);
    json_t *done = af_wait_job(c, id, 900);
    free(id);
    return done;
}

/* Every cell ok, with its memory limit, peak and CPU time on the record. */
static void check_job(const struct tu_capd *c, const char *id, size_t ncells)
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

void ma_models_aa(const struct tu_capd *c, const char *build, const char *models, size_t n_models)
{
    char widths[64];
    size_t nw = ma_runnable_widths(c, widths, sizeof widths);
    static const char opts[] = "{\"iterations\":1,\"warmup\":0}";
    char *j1 = ma_submit(c, build, models, widths, "aaaa001", NULL, opts);
    char *j2 = ma_submit(c, build, models, widths, "aaaa002", "aaaa001", opts);
    check_job(c, j1, n_models * nw * 2);
    check_job(c, j2, n_models * nw * 2);

    char path[256];
    snprintf(path, sizeof path,
             "/v1/compare?control=%s&head=%s&overrides=%%7B%%22perf_gate%%22%%3Afalse%%7D", j1, j2);
    long st = 0;
    json_t *cmp = tu_json(c, "GET", path, NULL, &st);
    cr_assert_eq(st, 200);
    json_t *counts = json_object_get(cmp, "counts");
    char *d = af_dump(counts);
    cr_assert_str_eq(json_string_value(json_object_get(cmp, "verdict")), "pass", "A/A: %s", d);
    json_int_t same = json_integer_value(json_object_get(counts, "identical")) +
                      json_integer_value(json_object_get(counts, "nondeterministic"));
    cr_assert_eq(same, (json_int_t)(n_models * nw * 2), "identical or nondeterministic only: %s",
                 d);
    cr_assert_eq(json_integer_value(json_object_get(counts, "outcome_regressions")), 0, "%s", d);
    cr_log_info("%s A/A over %zu widths: %s", build, nw, d);
    free(d);
    json_decref(cmp);
    free(j1);
    free(j2);
}
