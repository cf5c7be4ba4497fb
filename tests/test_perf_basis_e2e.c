/*
 * tests/test_perf_basis_e2e.c - the perf verdict's basis with the real
 * runner under Debian's torch (docs/compare.md, "Performance", basis).
 *
 * One user model, one width, forward only, in three builds: the control;
 * a head whose forward also sleeps 2 ms (the model's own waiting, which
 * costs no CPU time); and a head whose timing processes each start a busy
 * loop on their own CPU (another tenant: the head's wall time grows, its
 * own time does not). Each head job names the control's commit, so its
 * cells time the control build interleaved with their own (paired). The
 * sleeping head is a regression on own time, and its profiled pair names
 * the module that sleeps; the competed-with head is not a regression.
 */
#include <criterion/criterion.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "tests/helpers/common/api_fixtures.h"
#include "tests/helpers/common/testutil.h"

/*
 * The build's start-up code (a sitecustomize on its PYTHONPATH): it reads
 * PERF_SLEEP_S when the process runs at width default (CAPD_WIDTH), once,
 * at interpreter start, as a build whose kernels depend on its width
 * does. Timing processes forked from a zygote run what the zygote's
 * start-up read: it must have seen the cell's width (daemon/prefork/zygote.h).
 */
static const char site[] = "import os\n"
                           "SLEEP = float(os.environ.get('PERF_SLEEP_S', '0')) "
                           "if os.environ.get('CAPD_WIDTH') == 'default' else 0.0\n";

/*
 * The model: about a millisecond of matrix products a forward, on one
 * thread. The start-up's SLEEP makes its module nap sleep as well; PERF_HOG=1 makes a
 * timing process fork a busy loop that inherits its CPUs and ends with it
 * (a timing process builds the model in capd_runner.timing's _one_process;
 * the cell in its own capture).
 */
static const char model[] =
    "import os, sys, time, torch\n"
    "class Nap(torch.nn.Module):\n"
    "    def __init__(self):\n"
    "        super().__init__()\n"
    "        import sitecustomize\n"
    "        self.sleep = getattr(sitecustomize, 'SLEEP', 0.0)\n"
    "    def forward(self, x):\n"
    "        if self.sleep:\n"
    "            time.sleep(self.sleep)\n"
    "        return x\n"
    "class M(torch.nn.Module):\n"
    "    def __init__(self):\n"
    "        super().__init__()\n"
    "        self.fc = torch.nn.Sequential(*[torch.nn.Linear(128, 128) for _ in range(4)])\n"
    "        self.nap = Nap()\n"
    "    def forward(self, x):\n"
    "        return self.fc(self.nap(x))\n"
    "def _hog():\n"
    "    parent = os.getpid()\n"
    "    if os.fork() == 0:\n"
    "        while os.getppid() == parent:\n"
    "            pass\n"
    "        os._exit(0)\n"
    "def factory(seed, batch, dtype):\n"
    "    torch.manual_seed(seed)\n"
    "    f = sys._getframe(1)\n"
    "    while f is not None and f.f_code.co_name != '_one_process':\n"
    "        f = f.f_back\n"
    "    if os.environ.get('PERF_HOG') == '1' and f is not None:\n"
    "        _hog()\n"
    "    return M(), (torch.randn(32, 128),)\n";

/* Samples of 20 ms: longer than the scheduler's slice, so a competitor
 * takes its turns inside them. */
#define OPTIONS "{\"iterations\":10,\"warmup\":2,\"threads\":1,\"timing_min_ms\":200}"

static void build(struct tu_capd *c, const char *name, const char *roots, const char *env)
{
    long st = 0;
    json_t *b = tu_jsonf(c, "POST", "/v1/builds", &st,
                         "{\"name\":\"%s\",\"python\":\"%s\",\"model_roots\":[\"%s\"],"
                         "\"env\":{\"PYTHONPATH\":\"%s/site\"%s%s}}",
                         name, tu_python(), roots, roots, *env ? "," : "", env);
    cr_assert_eq(st, 201, "build %s: %ld", name, st);
    json_decref(b);
}

static char *run_job(struct tu_capd *c, const char *build, const char *commit, const char *control)
{
    struct af_job job = {"perf",          commit,        control,       build,
                         "\"m:factory\"", "\"default\"", "\"forward\"", OPTIONS};
    char *id = af_submit_job(c, &job);
    json_t *j = af_wait_job(c, id, 600);
    json_t *cell = json_array_get(json_object_get(j, "cells"), 0);
    cr_assert_str_eq(tu_jstr(cell, "state"), "ok", "%s: %s", build, tu_jstr(cell, "reason"));
    json_decref(j);
    return id;
}

/* The perf block of the only cell of CONTROL against HEAD (owned). */
static json_t *perf(struct tu_capd *c, const char *control, const char *head)
{
    char path[200];
    long st = 0;
    snprintf(path, sizeof path, "/v1/compare?control=%s&head=%s", control, head);
    json_t *r = tu_json(c, "GET", path, NULL, &st);
    cr_assert_eq(st, 200, "compare %s %s", control, head);
    json_t *p =
        json_incref(json_object_get(json_array_get(json_object_get(r, "cells"), 0), "perf"));
    json_decref(r);
    cr_assert(json_is_object(p));
    return p;
}

static double times(json_t *p, const char *side, const char *clock)
{
    return json_number_value(
        json_object_get(json_object_get(json_object_get(p, "times"), side), clock));
}

/* What the comparison says, for the test's messages and the log. */
static void describe(const char *what, json_t *p)
{
    fprintf(stderr,
            "%s: basis %s, verdict %s, ratio %.3f; wall %.0f -> %.0f ns, own %.0f -> %.0f, "
            "cpu %.0f -> %.0f, runqueue %.0f -> %.0f\n",
            what, tu_jstr(p, "basis"), tu_jstr(p, "verdict"),
            json_number_value(json_object_get(p, "ratio")), times(p, "control", "wall_ns"),
            times(p, "head", "wall_ns"), times(p, "control", "own_ns"), times(p, "head", "own_ns"),
            times(p, "control", "cpu_ns"), times(p, "head", "cpu_ns"),
            times(p, "control", "runqueue_ns"), times(p, "head", "runqueue_ns"));
}

Test(perf_basis_e2e, own_time_catches_waiting_and_leaves_out_competition, .timeout = 900)
{
    struct tu_capd c;
    char roots[512], path[600];
    cr_assert_eq(tu_capd_start(&c, NULL, NULL), 0);
    snprintf(roots, sizeof roots, "%s/roots", c.dir);
    mkdir(roots, 0755);
    snprintf(path, sizeof path, "%s/m.py", roots);
    af_put_file(path, model);
    snprintf(path, sizeof path, "%s/site", roots);
    mkdir(path, 0755);
    snprintf(path, sizeof path, "%s/site/sitecustomize.py", roots);
    af_put_file(path, site);
    build(&c, "control", roots, "");
    build(&c, "sleepy", roots, "\"PERF_SLEEP_S\":\"0.002\"");
    build(&c, "competed", roots, "\"PERF_HOG\":\"1\"");

    char *ctl = run_job(&c, "control", "aaaaaaa", NULL);
    char *sleepy = run_job(&c, "sleepy", "bbbbbbb", "aaaaaaa");
    char *competed = run_job(&c, "competed", "ccccccc", "aaaaaaa");

    json_t *p = perf(&c, ctl, sleepy);
    describe("sleeping head", p);
    cr_assert_str_eq(tu_jstr(p, "design"), "paired");
    cr_assert_str_eq(tu_jstr(p, "basis"), "own_time", "this kernel keeps no run-queue delay? %s",
                     tu_jstr(p, "basis_reason"));
    cr_assert_str_eq(tu_jstr(p, "verdict"), "regression");
    /* The sleep is own time: the head's grew by at least most of its 2 ms,
     * whatever the speed of the host's products. */
    cr_assert(times(p, "head", "own_ns") - times(p, "control", "own_ns") > 1.5e6,
              "the sleep is own time");
    /* Its CPU time moved far less: a sleep costs only its system call. */
    cr_assert(times(p, "head", "cpu_ns") < 1.5 * times(p, "control", "cpu_ns"));
    /* The pairs said regression, so the cell ran a profiled pair: it
     * names the module that sleeps first, with most of the change. */
    json_t *prof = json_object_get(p, "profile");
    cr_assert(json_is_object(prof), "no profiled pair in the sleeping head's cell");
    json_t *first = json_array_get(json_object_get(prof, "modules"), 0);
    fprintf(stderr, "profiled pair: %.0f -> %.0f ns; first module %s, %.0f ns, share %.2f\n",
            json_number_value(json_object_get(prof, "control_ns")),
            json_number_value(json_object_get(prof, "head_ns")), tu_jstr(first, "path"),
            json_number_value(json_object_get(first, "delta_ns")),
            json_number_value(json_object_get(first, "share")));
    cr_assert_str_eq(tu_jstr(first, "path"), "nap");
    cr_assert_str_eq(tu_jstr(first, "type"), "Nap");
    cr_assert(json_number_value(json_object_get(first, "delta_ns")) > 1.5e6);
    cr_assert(json_number_value(json_object_get(first, "share")) > 0.5);
    json_decref(p);

    p = perf(&c, ctl, competed);
    describe("competed-with head", p);
    cr_assert_str_eq(tu_jstr(p, "basis"), "own_time");
    /* Other tenants may delay the control's processes too; the busy loop
     * holds the head's CPU for about half of each sample. */
    cr_assert(times(p, "head", "runqueue_ns") > 0.3 * times(p, "head", "wall_ns"),
              "the busy loop took its share of the head's CPU");
    cr_assert_str_neq(tu_jstr(p, "verdict"), "regression");
    json_decref(p);

    free(ctl);
    free(sleepy);
    free(competed);
    af_stop_own_capd(&c);
}
