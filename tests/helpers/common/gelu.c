/*
 * tests/helpers/common/gelu.c - the gelumlp user model (fc1, act = GELU,
 * fc2) and its two builds, for the tests at granularity op
 * (tests/test_perop_e2e.c): Debian's torch as "control", and "gelu", whose
 * GELU examples/perturbed-gelu changes at the widest width the host runs.
 */
#include <criterion/criterion.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "tests/helpers/common/api_fixtures.h"
#include "tests/helpers/common/gelu.h"
#include "tests/helpers/common/testutil.h"

/* A job of one user model at one width, forward, at granularity op,
 * replaying nothing by itself (option replay off: the replays here are
 * asked for, and real-torch replays at every width would only slow the
 * other tests; tests/test_api_replay.c covers replay auto). */
char *gelu_submit(struct tu_capd *c, const char *build, const char *commit, const char *control,
                  const char *width, const char *provenance)
{
    return gelu_submit_model(c, "gelumlp:factory", build, commit, control, width, provenance);
}

char *gelu_submit_model(struct tu_capd *c, const char *model, const char *build, const char *commit,
                        const char *control, const char *width, const char *provenance)
{
    return gelu_submit_opts(c, model, build, commit, control, width, provenance,
                            "\"granularity\":\"op\",\"replay\":\"off\"");
}

char *gelu_submit_opts(struct tu_capd *c, const char *model, const char *build, const char *commit,
                       const char *control, const char *width, const char *provenance,
                       const char *options)
{
    long st = 0;
    char cc[96] = "";
    if (control)
        snprintf(cc, sizeof cc, ",\"control_commit\":\"%s\"", control);
    json_t *j = tu_jsonf(c, "POST", "/v1/jobs", &st,
                         "{\"project\":\"pytorch\",\"commit\":\"%s\",\"build\":\"%s\"%s,"
                         "\"matrix\":{\"models\":[\"%s\"],\"widths\":[\"%s\"],"
                         "\"passes\":[\"forward\"]},\"options\":{\"iterations\":2,\"warmup\":0,"
                         "%s}%s%s}",
                         commit, build, cc, model, width, options,
                         provenance ? ",\"provenance\":" : "", provenance ? provenance : "");
    cr_assert_eq(st, 201, "submit: %ld", st);
    return af_job_id(j);
}

/*
 * Starts C with two builds of the gelumlp user model (fc1, act = GELU,
 * fc2): "control", and "gelu", whose aten::gelu kernel
 * examples/perturbed-gelu replaces at the widest width the host runs, which
 * it returns (EXTRA_ENV: more "name":"value" pairs for its env, or "").
 */
const char *gelu_start(struct tu_capd *c, const char *python, const char *extra_env)
{
    cr_assert_eq(tu_capd_start(c, NULL, NULL), 0);
    const char *width = tu_widest_width(c);
    char roots[512], path[700];
    snprintf(roots, sizeof roots, "%s/roots", c->dir);
    mkdir(roots, 0755);
    snprintf(path, sizeof path, "%s/gelumlp.py", roots);
    af_put_file(path, "import collections, torch\n"
                      "def factory(seed, batch, dtype):\n"
                      "    torch.manual_seed(seed)\n"
                      "    m = torch.nn.Sequential(collections.OrderedDict(fc1=torch.nn.Linear(8, "
                      "16), act=torch.nn.GELU(), fc2=torch.nn.Linear(16, 4)))\n"
                      "    return m, (torch.randn(batch, 8),)\n"
                      "class Noisy(torch.nn.Module):\n"
                      "    def forward(self, x):\n"
                      "        import time\n"
                      "        return x * (1.0 + (time.perf_counter_ns() % 997 + 1) * 1e-6)\n"
                      "def noisy(seed, batch, dtype):\n"
                      "    torch.manual_seed(seed)\n"
                      "    m = torch.nn.Sequential(collections.OrderedDict(fc1=torch.nn.Linear(8, "
                      "4), noise=Noisy()))\n"
                      "    return m, (torch.randn(batch, 8),)\n");
    long st = 0;
    json_t *b = tu_jsonf(c, "POST", "/v1/builds", &st,
                         "{\"name\":\"control\",\"python\":\"%s\",\"model_roots\":[\"%s\"]}",
                         python, roots);
    cr_assert_eq(st, 201);
    json_decref(b);
    b = tu_jsonf(c, "POST", "/v1/builds", &st,
                 "{\"name\":\"gelu\",\"python\":\"%s\",\"model_roots\":[\"%s\"],\"env\":{"
                 "\"PYTHONPATH\":\"%s/examples/perturbed-gelu\",\"CAPD_PERTURB_WIDTH\":\"%s\"%s}}",
                 python, roots, tu_bin("CAPD_SOURCE_DIR"), width, extra_env);
    cr_assert_eq(st, 201);
    json_decref(b);
    return width;
}

/* gelu_start, then a control job (commit C1) and a job of the gelu build
 * (C2) paired with it, both waited for; returns the width. */
const char *gelu_pair(struct tu_capd *c, const char *python, const char *extra_env, const char *c1,
                      const char *c2, char **j1, char **j2)
{
    const char *width = gelu_start(c, python, extra_env);
    *j1 = gelu_submit(c, "control", c1, NULL, width, NULL);
    *j2 = gelu_submit(c, "gelu", c2, c1, width, NULL);
    af_wait_jobs(c, GELU_JOB_S, *j1, *j2, NULL);
    return width;
}

/* GETs PATH of C, which must answer 200, and returns the reply's cell of
 * gelumlp:factory at WIDTH, forward, which must be there; *RESULT owns
 * the reply. */
json_t *gelu_cell(const struct tu_capd *c, const char *path, const char *width, json_t **result)
{
    long st = 0;
    *result = tu_json(c, "GET", path, NULL, &st);
    cr_assert_eq(st, 200, "GET %s", path);
    json_t *cell = af_find_cell(*result, "gelumlp:factory", width, "forward");
    cr_assert_not_null(cell, "GET %s has no gelumlp:factory cell at %s", path, width);
    return cell;
}
