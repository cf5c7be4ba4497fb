/*
 * tests/test_history_e2e.c - history and bisection with real cells: the
 * real runner under Debian's torch (tu_python), a real capd, real HTTP.
 *
 * The branch has N commits. The build is a template: DIR/c/<commit>/python
 * (a link to the interpreter) with PYTHONPATH=DIR/c/<commit>, whose
 * sitecustomize.py changes the numerics of every Linear from commit K on
 * (its output times 1 + 2e-4) and from commit M on makes every Linear
 * spin for twice its own time plus 2 ms (a tiny Linear's own time is
 * small next to the rest of a forward: the 2 ms make the step several
 * times the forward, far beyond this host's noise, so the change point
 * does not depend on it; no timing figure is asserted). The alerts must name exactly K and M. Then
 * commit S's directory is removed and a bisection in another project (nothing is reused), with only
 * the two ends captured, must find K in at most ceil(log2(N)) + 1 rounds, skipping S.
 */
#include <criterion/criterion.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "tests/helpers/common/api_fixtures.h"
#include "tests/helpers/common/jobs.h"
#include "tests/helpers/common/testutil.h"

static struct tu_capd g_capd;

static void teardown(void)
{
    af_stop_own_capd(&g_capd);
}

static void start(void)
{
    /* The bisection's probes only capture: two of them at once. */
    static const char *const extra[] = {"--max-parallel-numerics", "2", NULL};
    cr_assert_eq(tu_capd_start(&g_capd, NULL, extra), 0);
}

TestSuite(history_e2e, .init = start, .fini = teardown);

#define N      30
#define K      11 /* numerics change */
#define M      19 /* 3x slower */
#define S      18 /* build directory removed before the bisection */
#define MATRIX "\"matrix\":{\"models\":[\"mlp\"],\"widths\":[\"default\"],\"passes\":[\"forward\"]}"
/* The branch's jobs are timed (one timing process: the smallest perf
 * observation); the bisection's only capture. */
#define TIMED    "\"options\":{\"iterations\":3,\"warmup\":1,\"timing_processes\":1,\"threads\":1}"
#define CAPTURED "\"options\":{\"iterations\":0,\"threads\":1}"

static void sha(int i, char out[41])
{
    snprintf(out, 41, "e2e0%04x%032x", i, 0xface + i);
}

static const char *perturb_py = "import torch.nn.functional as F\n"
                                "_linear = F.linear\n"
                                "def _perturbed(input, weight, bias=None):\n"
                                "    return _linear(input, weight, bias) * (1.0 + 2e-4)\n"
                                "F.linear = _perturbed\n";

static const char *slow_py =
    "import time\n"
    "import torch.nn.functional as F\n"
    "_inner = F.linear\n"
    "def _slow(input, weight, bias=None):\n"
    "    t0 = time.perf_counter()\n"
    "    out = _inner(input, weight, bias)\n"
    "    end = time.perf_counter() + 2 * (time.perf_counter() - t0) + 0.002\n"
    "    while time.perf_counter() < end:\n"
    "        pass\n"
    "    return out\n"
    "F.linear = _slow\n";

static void make_builds(void)
{
    for (int i = 0; i < N; i++) {
        char c[41], path[600];
        sha(i, c);
        cr_assert_eq(tu_sh("mkdir -p '%s/c/%s' && ln -s '%s' '%s/c/%s/python'", g_capd.dir, c,
                           tu_python(), g_capd.dir, c),
                     0);
        snprintf(path, sizeof path, "%s/c/%s/sitecustomize.py", g_capd.dir, c);
        FILE *f = fopen(path, "w");
        cr_assert_not_null(f);
        if (i >= K)
            fputs(perturb_py, f);
        if (i >= M)
            fputs(slow_py, f);
        fclose(f);
    }
    long st = 0;
    json_t *j = tu_jsonf(&g_capd, "POST", "/v1/builds", &st,
                         "{\"name\":\"pc\",\"python\":\"%s/c/{commit}/python\",\"env\":"
                         "{\"PYTHONPATH\":\"%s/c/{commit}\"}}",
                         g_capd.dir, g_capd.dir);
    cr_assert_eq(st, 201, "%s", json_dumps(j, 0));
    json_decref(j);
}

/* Submits commit I of project PROJECT (on branch main when ORDERED, with
 * its commit time and parent); returns the job id (malloc'd). */
static char *submit(const char *project, int i, bool ordered)
{
    char c[41], p[41], extra[200] = "";
    sha(i, c);
    sha(i - 1, p);
    if (ordered)
        snprintf(extra, sizeof extra,
                 ",\"branch\":\"main\",\"commit_time\":\"2024-01-01T00:%02d:00Z\","
                 "\"parents\":[\"%s\"]",
                 i, p);
    return jobs_post(&g_capd,
                     "{\"project\":\"%s\",\"commit\":\"%s\",\"build\":\"pc\"," MATRIX ",%s%s}",
                     project, c, ordered ? TIMED : CAPTURED, extra);
}

/* Waits for the N jobs IDS to end with their cell ok (five minutes each at
 * most); frees them. */
static void wait_all(char **ids, int n)
{
    jobs_wait_all(&g_capd, ids, n, 300, "ok");
}

/* The alerts other than memory (peak RSS is not steered here) name
 * exactly K (numerics) and M (perf). A shared host's load can really move
 * a few commits' timings by tens of percent, and the statistics then
 * rightly see a change: such a perf alert elsewhere is allowed when it is
 * far smaller than the step at M (under 1x, where M's is several times);
 * it is never allowed at M's magnitude or as a numerics alert. */
static void expect_alerts(void)
{
    long st = 0;
    json_t *a = tu_json(&g_capd, "GET", "/v1/alerts?project=e2e&branch=main", NULL, &st);
    cr_assert_eq(st, 200);
    char *dump = json_dumps(a, JSON_INDENT(1)), ck[41], cm[41];
    sha(K, ck);
    sha(M, cm);
    int n = 0, saw_k = 0, saw_m = 0;
    size_t i;
    json_t *e;
    json_array_foreach(json_object_get(a, "alerts"), i, e)
    {
        const char *kind = tu_str(e, "kind"), *bad = tu_str(e, "first_bad");
        double mag = json_number_value(json_object_get(json_object_get(e, "detail"), "magnitude"));
        if (strcmp(kind, "memory") == 0)
            continue;
        if (strcmp(kind, "perf") == 0 && strcmp(bad, cm) != 0 && fabs(mag) < 1.0)
            continue; /* the host's noise, not the step */
        n++;
        saw_k += strcmp(kind, "numerics") == 0 && strcmp(bad, ck) == 0;
        saw_m += strcmp(kind, "perf") == 0 && strcmp(bad, cm) == 0 &&
                 strcmp(tu_str(e, "label"), "regression") == 0;
    }
    cr_expect(n == 2 && saw_k == 1 && saw_m == 1, "%s", dump);
    free(dump);
    json_decref(a);
}

static void bisect_finds_k(void)
{
    char *commits = af_commit_list(N, sha);
    char good[41], bad[41], ck[41], body[4096];
    sha(0, good);
    sha(N - 1, bad);
    sha(K, ck);
    snprintf(body, sizeof body,
             "{\"project\":\"e2e-bisect\",\"build\":\"pc\",\"commits\":%s,\"good\":\"%s\","
             "\"bad\":\"%s\"," MATRIX "," CAPTURED ",\"predicate\":\"numerics\"}",
             commits, good, bad);
    free(commits);
    char id[16], *dump = NULL;
    af_post_bisect(&g_capd, body, id, NULL);
    json_t *b = af_bisect_done(&g_capd, id, 400, &dump);
    json_t *res = json_object_get(b, "result");
    cr_expect_str_eq(tu_str(res, "first_bad"), ck, "%s", dump);
    /* ceil(log2(30)) + 1 = 6 */
    cr_expect_leq(json_integer_value(json_object_get(b, "round")), 6, "%s", dump);
    size_t i;
    json_t *pr;
    int skipped = 0;
    json_array_foreach(json_object_get(b, "probes"), i, pr)
    {
        int idx = (int)json_integer_value(json_object_get(pr, "index"));
        if (idx == 0 || idx == N - 1)
            cr_expect(json_is_true(json_object_get(pr, "reused")), "%s", dump);
        if (idx == S)
            skipped = strcmp(tu_str(pr, "state"), "skipped") == 0 &&
                      strstr(tu_str(pr, "skipped_reason"), "did not start") != NULL;
    }
    cr_expect(skipped, "S was not probed and skipped: %s", dump);
    free(dump);
    json_decref(b);
}

Test(history_e2e, alerts_and_bisection_name_the_changing_commits, .timeout = 900)
{
    make_builds();
    char *ids[N];
    for (int i = 0; i < N; i++)
        ids[i] = submit("e2e", i, true);
    wait_all(ids, N);
    expect_alerts();
    /* Only the two ends are captured in the bisection's project. */
    char *ends[2] = {submit("e2e-bisect", 0, false), submit("e2e-bisect", N - 1, false)};
    wait_all(ends, 2);
    char c[41];
    sha(S, c);
    cr_assert_eq(tu_sh("rm -rf '%s/c/%s'", g_capd.dir, c), 0);
    bisect_finds_k();
}
