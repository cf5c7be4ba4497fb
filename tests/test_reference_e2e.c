/*
 * tests/test_reference_e2e.c - the reference arbiter through real torch
 * cells and a real capd (docs/compare.md, "Reference arbiter"): a model of
 * one matrix product, whose heads are builds that set REFTEST_MM. Head
 * "split" sums the product's K dimension in another order (the even and
 * the odd terms apart, then added): as accurate as the control, only
 * rounded differently, so it is within_tolerance under reference float64
 * and diverged without it. Head "nudge" scales the same product by
 * 1 + 1e-4: diverged under both, and the reports say which rule decided.
 */
#include <criterion/criterion.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "tests/helpers/common/api_fixtures.h"
#include "tests/helpers/common/json_want.h"
#include "tests/helpers/common/testutil.h"

/* The user model: its float32 forward follows REFTEST_MM; the float64
 * reference copy always computes the plain product. */
static const char model_py[] =
    "import os\n"
    "import torch\n"
    "\n"
    "class MM(torch.nn.Module):\n"
    "    def __init__(self):\n"
    "        super().__init__()\n"
    "        self.w = torch.nn.Parameter(torch.randn(1024, 64) * 10)\n"
    "\n"
    "    def forward(self, x):\n"
    "        mode = os.environ.get('REFTEST_MM', '')\n"
    "        if x.dtype == torch.float32 and mode == 'split':\n"
    "            return x[:, 0::2] @ self.w[0::2] + x[:, 1::2] @ self.w[1::2]\n"
    "        y = x @ self.w\n"
    "        if x.dtype == torch.float32 and mode == 'nudge':\n"
    "            y = y * (1 + 1e-4)\n"
    "        return y\n"
    "\n"
    "def mm(seed, batch, dtype):\n"
    "    torch.manual_seed(seed)\n"
    "    m = MM().to(dtype)\n"
    "    return m, torch.randn(batch, 1024, dtype=dtype)\n";

static struct tu_capd capd;
static char *root;

static void build(const char *name, const char *mode)
{
    const char *py = tu_python();
    long st = 0;
    json_t *b = tu_jsonf(&capd, "POST", "/v1/builds", &st,
                         "{\"name\":\"%s\",\"python\":\"%s\",\"model_roots\":[\"%s\"],"
                         "\"env\":{\"REFTEST_MM\":\"%s\"}}",
                         name, py, root, mode);
    char *d = json_dumps(b, JSON_COMPACT);
    cr_assert_eq(st, 201, "register build %s: %s", name, d);
    free(d);
    json_decref(b);
}

static char *submit(const char *build_name, const char *commit, const char *control)
{
    struct af_job job = {.project = "ref",
                         .commit = commit,
                         .control = control,
                         .build = build_name,
                         .models = "\"refmm:mm\"",
                         .widths = "\"default\"",
                         .passes = "\"forward\"",
                         .options = "{\"iterations\":0,\"warmup\":0,\"replay\":\"off\",\"batch\":4,"
                                    "\"capture\":\"full\",\"reference\":\"float64\"}"};
    char *id = af_submit_job(&capd, &job);
    json_t *j = tu_wait_job(&capd, id, 300);
    cr_assert_not_null(j, "job %s finished", id);
    json_t *cell = json_array_get(json_object_get(j, "cells"), 0);
    cr_assert_str_eq(json_string_value(json_object_get(cell, "state")), "ok", "%s: %s", commit,
                     json_string_value(json_object_get(cell, "reason")));
    json_decref(j);
    return id;
}

/* capd, and the model root in its directory, which the cell user can
 * list (capd checks at registration). */
static void start(void)
{
    cr_assert_eq(tu_capd_start(&capd, NULL, NULL), 0, "capd starts");
    cr_assert(asprintf(&root, "%s/roots", capd.dir) > 0);
    cr_assert_eq(mkdir(root, 0755), 0, "%s", root);
    char path[700];
    snprintf(path, sizeof path, "%s/refmm.py", root);
    af_put_file(path, model_py);
    build("ctl", "");
    build("split", "split");
    build("nudge", "nudge");
}

static void stop(void)
{
    tu_capd_stop(&capd);
    free(root);
}

/* The comparison of HEAD against CTL with REFERENCE (NULL: the head job's
 * option), as JSON; and as text in *TEXT. */
static json_t *compare(const char *ctl, const char *head, const char *reference, char **text)
{
    char path[256], q[64] = "";
    if (reference)
        snprintf(q, sizeof q, "&reference=%s", reference);
    snprintf(path, sizeof path, "/v1/compare?control=%s&head=%s%s", ctl, head, q);
    long st = 0;
    json_t *r = tu_json(&capd, "GET", path, NULL, &st);
    cr_assert_eq(st, 200, "%s", path);
    snprintf(path, sizeof path, "/v1/compare?control=%s&head=%s%s&format=text", ctl, head, q);
    struct tu_resp resp;
    cr_assert_eq(tu_http(&capd, "GET", path, NULL, 0, NULL, &resp), 0);
    cr_assert_eq(resp.status, 200);
    *text = strdup(resp.body);
    tu_resp_free(&resp);
    return r;
}

Test(reference_e2e, equally_accurate_passes_a_perturbed_head_does_not, .init = start, .fini = stop,
     .timeout = 900)
{
    char *ctl = submit("ctl", "aaaa001", NULL);
    char *split = submit("split", "aaaa002", "aaaa001");
    char *nudge = submit("nudge", "aaaa003", "aaaa001");
    char *text = NULL;

    /* split under float64 (the head job's option): within tolerance, by the reference. */
    json_t *r = compare(ctl, split, NULL, &text);
    json_t *c = jw_path(r, "cells.0");
    char *dump = json_dumps(c, JSON_COMPACT);
    cr_assert_str_eq(jw_str(c, "status"), "within_tolerance", "%s", dump);
    cr_assert_str_eq(jw_str(c, "rule"), "reference_float64", "%s", dump);
    json_t *ref = json_object_get(c, "reference");
    cr_assert_gt(json_integer_value(json_object_get(ref, "passed")), 0, "%s", dump);
    cr_log_info("split, float64: %s", text);
    cr_assert_eq(json_integer_value(json_object_get(c, "missing_keys")), 0, "%s", dump);
    cr_assert_str_eq(jw_str(r, "verdict"), "pass", "%s", dump);
    cr_assert(strstr(text, "within_tolerance refmm:mm/default/forward (rule reference_float64)"),
              "%s", text);
    free(dump);
    free(text);
    json_decref(r);

    /* split without the arbiter: the tolerance rule diverges it. */
    r = compare(ctl, split, "none", &text);
    c = jw_path(r, "cells.0");
    dump = json_dumps(c, JSON_COMPACT);
    cr_assert_str_eq(jw_str(c, "status"), "diverged", "%s", dump);
    cr_assert_str_eq(jw_str(c, "rule"), "tolerance", "%s", dump);
    cr_assert_str_eq(jw_str(json_object_get(c, "first_divergence"), "reason"), "tolerance", "%s",
                     dump);
    cr_log_info("split, none: %s", text);
    free(dump);
    free(text);
    json_decref(r);

    /* nudge: diverged under both, and the report says which rule and why. */
    static const char *const refs[] = {"float64", "none"};
    for (size_t i = 0; i < 2; i++) {
        r = compare(ctl, nudge, refs[i], &text);
        c = jw_path(r, "cells.0");
        dump = json_dumps(c, JSON_COMPACT);
        cr_assert_str_eq(jw_str(c, "status"), "diverged", "%s: %s", refs[i], dump);
        cr_assert_str_eq(jw_str(r, "verdict"), "regression");
        if (i == 0) {
            cr_assert_str_eq(jw_str(c, "rule"), "reference_float64", "%s", dump);
            json_t *rj = json_object_get(json_object_get(c, "first_divergence"), "reference");
            cr_assert(json_is_false(json_object_get(rj, "passed")), "%s", dump);
            double eh = json_real_value(json_object_get(rj, "err_head"));
            double ec = json_real_value(json_object_get(rj, "err_control"));
            cr_assert_gt(eh, 2 * ec, "%s", dump);
            cr_log_info("nudge, float64: %s", text);
            cr_assert(strstr(text, "(rule reference_float64)"), "%s", text);
            cr_assert(strstr(text, "reference_float64: err "), "%s", text);
        } else {
            cr_assert_str_eq(jw_str(c, "rule"), "tolerance", "%s", dump);
            cr_assert(strstr(text, "(rule") == NULL, "no arbiter, no rule note: %s", text);
        }
        free(dump);
        free(text);
        json_decref(r);
    }
    free(ctl);
    free(split);
    free(nudge);
}
