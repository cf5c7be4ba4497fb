/*
 * tests/test_history.c - history along a branch end to end: a real capd,
 * the fake runner, real HTTP.
 *
 * The branch has 30 commits, each captured by its own job. Three builds of
 * the fake runner differ only in their environment: from commit K on one
 * tensor is perturbed (FAKE_PERTURB_KEY), from commit M on the timings are
 * also 30% slower (FAKE_TIMING_SCALE). The alerts must name exactly K
 * (numerics) and M (perf), whatever order the jobs were submitted in.
 */
#include <criterion/criterion.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

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
    cr_assert_eq(tu_capd_start(&g_capd, NULL, NULL), 0);
}

TestSuite(history, .init = start, .fini = teardown);

#define N_COMMITS 30
#define K         12 /* numerics change */
#define M         20 /* slowdown */
#define PKEY      "layer1.0.forward.output.0"

static void sha(int i, char out[41])
{
    snprintf(out, 41, "c0ffee%02x%032x", i, 0x5eed + i);
}

/* Submits commit I of branch BRANCH on BUILD; ORDER adds commit_time and
 * parents. Returns the job id (malloc'd). */
static char *submit(const char *branch, int i, const char *build, bool order)
{
    char c[41], p[41], extra[256] = "";
    sha(i, c);
    sha(i - 1, p);
    if (order)
        snprintf(extra, sizeof extra,
                 ",\"commit_time\":\"2024-01-01T%02d:%02d:00Z\",\"parents\":[\"%s\"]", i / 60,
                 i % 60, p);
    return jobs_post(&g_capd,
                     "{\"project\":\"h\",\"commit\":\"%s\",\"branch\":\"%s\",\"build\":\"%s\","
                     "\"matrix\":{\"models\":[\"fake:ok\"],\"widths\":[\"default\"],"
                     "\"passes\":[\"forward\"]},\"options\":{\"iterations\":7}%s}",
                     c, branch, build, extra);
}

/* Waits for the N jobs IDS to end (two minutes each at most); frees them. */
static void wait_all(char **ids, int n)
{
    jobs_wait_all(&g_capd, ids, n, 120, NULL);
}

static void builds(void)
{
    cr_assert_eq(tu_fake_build(&g_capd, "base", "{}"), 201);
    cr_assert_eq(tu_fake_build(&g_capd, "pert", "{\"FAKE_PERTURB_KEY\":\"" PKEY "\"}"), 201);
    cr_assert_eq(tu_fake_build(&g_capd, "pslow",
                               "{\"FAKE_PERTURB_KEY\":\"" PKEY "\",\"FAKE_TIMING_SCALE\":\"1.3\"}"),
                 201);
}

/*
 * Alerts other than memory. The fake runner's peak RSS is not steered by
 * anything in this test, and under the sanitizer build it moves by tens of
 * MB from run to run (real level shifts the detector rightly reports), so
 * memory alerts are left out of the exact count.
 */
static size_t count_kinds(json_t *list)
{
    size_t i, n = 0;
    json_t *e;
    json_array_foreach(list, i, e)
    {
        n += strcmp(json_string_value(json_object_get(e, "kind")), "memory") != 0;
    }
    return n;
}

static const char *build_of(int i)
{
    return i < K ? "base" : i < M ? "pert" : "pslow";
}

/* Submission order: mostly in commit order, with a few neighbours swapped
 * (K with K-1, M with M+1): commit_time, not arrival, decides. */
static int submission(int i)
{
    return i == K ? K - 1 : i == K - 1 ? K : i == M ? M + 1 : i == M + 1 ? M : i;
}

/* The builds, and every commit of main submitted in submission() order
 * and finished. */
static void run_main_history(void)
{
    builds();
    char *ids[N_COMMITS];
    for (int i = 0; i < N_COMMITS; i++)
        ids[i] = submit("main", submission(i), build_of(submission(i)), true);
    wait_all(ids, N_COMMITS);
}

/* capctl shows the same two alerts as the API, first bad commits (CK and
 * CM) shortened to 12. */
static void capctl_shows_the_alerts(const char *ck, const char *cm)
{
    char *out = NULL;
    cr_expect_eq(af_capctl(&g_capd, "alerts --project h --branch main --markdown", &out), 0, "%s",
                 out);
    cr_expect(strstr(out, "| numerics ") && strstr(out, "| perf "), "%s", out);
    cr_expect(strstr(out, "first divergent: " PKEY), "%s", out);
    char short_k[13], short_m[13];
    snprintf(short_k, sizeof short_k, "%.12s", ck);
    snprintf(short_m, sizeof short_m, "%.12s", cm);
    cr_expect(strstr(out, short_k) && strstr(out, short_m), "%s", out);
    free(out);
    cr_expect_eq(af_capctl(&g_capd,
                           "history --project h --branch main --model fake:ok --width default "
                           "--pass forward",
                           &out),
                 0, "%s", out);
    cr_expect(strstr(out, "perf regression") && strstr(out, "numerics changed"), "%s", out);
    free(out);
    cr_expect_neq(af_capctl(&g_capd, "alerts --set expected", &out), 0, "%s", out);
    free(out);
}

Test(history, alerts_name_exactly_the_changing_commits, .timeout = 300)
{
    run_main_history();

    long st = 0;
    json_t *a = tu_json(&g_capd, "GET", "/v1/alerts?project=h&branch=main", NULL, &st);
    cr_assert_eq(st, 200);
    json_t *list = json_object_get(a, "alerts");
    char *dump = json_dumps(list, JSON_INDENT(1));
    cr_assert_eq(count_kinds(list), 2, "alerts: %s", dump);
    char ck[41], cm[41], ck1[41], cm1[41];
    sha(K, ck);
    sha(M, cm);
    sha(K - 1, ck1);
    sha(M - 1, cm1);
    bool saw_k = false, saw_m = false;
    size_t i;
    json_t *e;
    json_array_foreach(list, i, e)
    {
        const char *kind = json_string_value(json_object_get(e, "kind"));
        if (strcmp(kind, "memory") == 0)
            continue;
        const char *bad = json_string_value(json_object_get(e, "first_bad"));
        const char *good = json_string_value(json_object_get(e, "last_good"));
        json_t *d = json_object_get(e, "detail");
        if (strcmp(kind, "numerics") == 0) {
            saw_k = strcmp(bad, ck) == 0 && strcmp(good, ck1) == 0;
            cr_expect_str_eq(json_string_value(json_object_get(d, "first_divergent_key")), PKEY);
        } else if (strcmp(kind, "perf") == 0) {
            saw_m = strcmp(bad, cm) == 0 && strcmp(good, cm1) == 0;
            cr_expect_str_eq(json_string_value(json_object_get(e, "label")), "regression");
            double mag = json_number_value(json_object_get(d, "magnitude"));
            cr_expect(mag > 0.25 && mag < 0.35, "magnitude %g", mag);
            cr_expect_leq(json_number_value(json_object_get(d, "p_value")), 0.001);
        }
        cr_expect_str_eq(json_string_value(json_object_get(e, "status")), "open");
    }
    cr_expect(saw_k && saw_m, "alerts: %s", dump);
    free(dump);

    capctl_shows_the_alerts(ck, cm);

    /* Feedback: an acknowledged alert leaves the open list. */
    const char *id = NULL;
    json_array_foreach(list, i, e)
    {
        if (!id && strcmp(json_string_value(json_object_get(e, "kind")), "memory") != 0)
            id = json_string_value(json_object_get(e, "id"));
    }
    char path[128];
    snprintf(path, sizeof path, "/v1/alerts/%s", id);
    json_t *r =
        tu_json(&g_capd, "POST", path, "{\"status\":\"false_positive\",\"note\":\"n\"}", &st);
    cr_expect_eq(st, 200);
    cr_expect_str_eq(json_string_value(json_object_get(r, "status")), "false_positive");
    json_decref(r);
    json_decref(a);
    a = tu_json(&g_capd, "GET", "/v1/alerts?project=h&branch=main", NULL, &st);
    cr_expect_eq(count_kinds(json_object_get(a, "alerts")), 1);
    json_decref(a);
    a = tu_json(&g_capd, "GET", "/v1/alerts?project=h&status=all", NULL, &st);
    cr_expect_eq(count_kinds(json_object_get(a, "alerts")), 2);
    json_decref(a);
    r = tu_json(&g_capd, "POST", "/v1/alerts/a000000000000", "{\"status\":\"expected\"}", &st);
    cr_expect_eq(st, 404);
    json_decref(r);
    r = tu_json(&g_capd, "POST", path, "{\"status\":\"fixed\"}", &st);
    cr_expect_eq(st, 400);
    cr_expect_str_eq(json_string_value(json_object_get(json_object_get(r, "error"), "field")),
                     "status");
    json_decref(r);
}

Test(history, series_in_commit_order_with_drift, .timeout = 300)
{
    run_main_history();
    long st = 0;
    json_t *h = tu_json(
        &g_capd, "GET",
        "/v1/history?project=h&branch=main&model=fake:ok&width=default&pass=forward", NULL, &st);
    cr_assert_eq(st, 200, "%s", json_dumps(h, 0));
    json_t *pts = json_object_get(h, "points"), *e;
    size_t i;
    cr_assert_eq(json_array_size(pts), N_COMMITS);
    cr_expect_str_eq(json_string_value(json_object_get(h, "status")), "ok");
    for (int k = 0; k < N_COMMITS; k++) {
        json_t *p = json_array_get(pts, k);
        char c[41];
        sha(k, c);
        cr_expect_str_eq(json_string_value(json_object_get(p, "commit")), c, "point %d", k);
        cr_expect_str_eq(json_string_value(json_object_get(p, "ordered_by")), "commit");
        const char *num = json_string_value(json_object_get(p, "numerics"));
        cr_expect_str_eq(num, k == 0 ? "first" : k == K ? "diverged" : "identical", "point %d", k);
        cr_expect(json_number_value(json_object_get(p, "perf_ns")) > 0);
    }
    /* One perf change point (memory ones: see count_kinds). */
    json_t *cps = json_object_get(h, "change_points"), *perf = NULL;
    cr_assert_eq(count_kinds(cps), 1);
    json_array_foreach(cps, i, e)
    {
        if (strcmp(json_string_value(json_object_get(e, "kind")), "perf") == 0)
            perf = e;
    }
    char cm[41];
    sha(M, cm);
    cr_assert_not_null(perf);
    cr_expect_str_eq(json_string_value(json_object_get(perf, "first_bad")), cm);
    cr_expect_eq(json_array_size(json_object_get(h, "events")), 1);
    json_decref(h);
    /* The limit returns the newest points. */
    h = tu_json(&g_capd, "GET",
                "/v1/history?project=h&branch=main&model=fake:ok&width=default&pass=forward"
                "&limit=5",
                NULL, &st);
    cr_assert_eq(json_array_size(json_object_get(h, "points")), 5);
    char last[41];
    sha(N_COMMITS - 1, last);
    cr_expect_str_eq(json_string_value(json_object_get(
                         json_array_get(json_object_get(h, "points"), 4), "commit")),
                     last);
    json_decref(h);
}

Test(history, submission_order_and_too_little_data)
{
    cr_assert_eq(tu_fake_build(&g_capd, "base", "{}"), 201);
    char *ids[2] = {submit("side", 1, "base", false), submit("side", 2, "base", false)};
    wait_all(ids, 2);
    long st = 0;
    json_t *h = tu_json(
        &g_capd, "GET",
        "/v1/history?project=h&branch=side&model=fake:ok&width=default&pass=forward", NULL, &st);
    cr_assert_eq(st, 200);
    cr_expect_str_eq(json_string_value(json_object_get(h, "status")), "insufficient_data");
    json_t *p = json_array_get(json_object_get(h, "points"), 1);
    cr_expect_str_eq(json_string_value(json_object_get(p, "ordered_by")), "submission");
    cr_expect_str_eq(json_string_value(json_object_get(p, "numerics")), "identical");
    json_decref(h);
    h = tu_json(&g_capd, "GET",
                "/v1/history?project=h&branch=nope&model=fake:ok&width=default&pass=forward", NULL,
                &st);
    cr_expect_eq(st, 404);
    json_decref(h);
}

static void expect_400(const char *path, const char *body, const char *field)
{
    long st = 0;
    json_t *r = tu_json(&g_capd, body ? "POST" : "GET", path, body, &st);
    cr_expect_eq(st, 400, "%s %s", path, json_dumps(r, 0));
    cr_expect_str_eq(json_string_value(json_object_get(json_object_get(r, "error"), "field")),
                     field);
    json_decref(r);
}

Test(history, requests_are_checked_and_limits_refuse)
{
    cr_assert_eq(tu_fake_build(&g_capd, "base", "{}"), 201);
    static const char job[] =
        "{\"project\":\"h\",\"commit\":\"abcdef1\",\"branch\":\"main\",\"build\":\"base\","
        "\"matrix\":{\"models\":[\"fake:ok\"],\"widths\":[\"default\"],\"passes\":[\"forward\"]},";
    char body[4096];
    snprintf(body, sizeof body, "%s\"commit_time\":\"yesterday\"}", job);
    expect_400("/v1/jobs", body, "commit_time");
    snprintf(body, sizeof body, "%s\"parents\":[\"abcdef0\",\"xyz\"]}", job);
    expect_400("/v1/jobs", body, "parents[1]");
    /* 16 parents are fine, 17 refused. */
    char ps[1024] = "";
    for (int i = 0; i < 17; i++)
        snprintf(ps + strlen(ps), sizeof ps - strlen(ps), "%s\"abcdef%x\"", i ? "," : "", i % 16);
    snprintf(body, sizeof body, "%s\"parents\":[%s]}", job, ps);
    expect_400("/v1/jobs", body, "parents");
    *strrchr(ps, ',') = 0;
    snprintf(body, sizeof body, "%s\"parents\":[%s],\"commit_time\":\"2024-05-01T14:00:00+02:00\"}",
             job, ps);
    long st = 0;
    json_t *r = tu_json(&g_capd, "POST", "/v1/jobs", body, &st);
    cr_expect_eq(st, 201, "%s", json_dumps(r, 0));
    json_decref(r);
    expect_400("/v1/history?project=h&branch=main&model=m&width=w", NULL, "pass");
    expect_400("/v1/history?project=h&branch=main&model=m&width=w&pass=p&limit=10001", NULL,
               "limit");
    expect_400("/v1/alerts?limit=1001", NULL, "limit");
    expect_400("/v1/alerts?status=closed", NULL, "status");
    expect_400("/v1/alerts?kind=speed", NULL, "kind");
}

/* The numerics alert of BRANCH (commits 0, 1 base, 2 perturbed): its id. */
static char *numerics_alert(const char *branch)
{
    char *ids[3] = {submit(branch, 0, "base", true), submit(branch, 1, "base", true),
                    submit(branch, 2, "pert", true)};
    wait_all(ids, 3);
    long st = 0;
    char path[128];
    snprintf(path, sizeof path, "/v1/alerts?project=h&branch=%s&kind=numerics", branch);
    json_t *a = tu_json(&g_capd, "GET", path, NULL, &st);
    json_t *e = json_array_get(json_object_get(a, "alerts"), 0);
    cr_assert_not_null(e, "%s", json_dumps(a, 0));
    char *id = strdup(json_string_value(json_object_get(e, "id")));
    json_decref(a);
    return id;
}

static void mark(const char *id, const char *status)
{
    char path[64], body[64];
    long st = 0;
    snprintf(path, sizeof path, "/v1/alerts/%s", id);
    snprintf(body, sizeof body, "{\"status\":\"%s\"}", status);
    json_decref(tu_json(&g_capd, "POST", path, body, &st));
    cr_assert_eq(st, 200);
}

/* An alert that opens is an `alert` event on the stream; the precision of
 * marked alerts is in /metrics once one is marked. */
Test(history, alert_events_and_precision, .timeout = 120)
{
    builds();
    char *a1 = numerics_alert("main");
    char c2[41], path[80];
    sha(2, c2);
    snprintf(path, sizeof path, "/v1/events?job=%s", a1);
    char *ev = tu_events_until(&g_capd, path, "\"kind\":\"numerics\"", 20000);
    cr_expect(strstr(ev, "event: alert\n"), "%s", ev);
    cr_expect(strstr(ev, "\"change\":\"opened\"") && strstr(ev, c2), "%s", ev);
    cr_expect(strstr(ev, "\"first_divergent_key\":\"" PKEY "\""), "%s", ev);
    free(ev);
    cr_expect_eq(tu_metric(&g_capd, "capd_alerts{state=\"open\"}"), 1);
    cr_expect_eq(tu_metric(&g_capd, "capd_alerts_marked"), 0);
    cr_expect_eq(tu_metric(&g_capd, "capd_alert_precision"), -1, "no precision before a mark");
    char *a2 = numerics_alert("side");
    mark(a1, "false_positive");
    cr_expect_eq(tu_metric(&g_capd, "capd_alert_precision"), 0);
    mark(a2, "acknowledged");
    cr_expect_eq(tu_metric(&g_capd, "capd_alert_precision"), 0.5);
    mark(a1, "expected");
    cr_expect_eq(tu_metric(&g_capd, "capd_alert_precision"), 1);
    cr_expect_eq(tu_metric(&g_capd, "capd_alerts_marked"), 2);
    mark(a1, "open");
    cr_expect_eq(tu_metric(&g_capd, "capd_alerts{state=\"open\"}"), 1);
    free(a1);
    free(a2);
}
