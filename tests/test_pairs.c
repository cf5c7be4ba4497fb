/*
 * tests/test_pairs.c - paired timing through a real capd: a head job whose
 * control build still runs here gets the control build's timing processes
 * interleaved with its own in each cell (docs/compare.md, "Paired
 * timing"), and the comparison uses the pairs; without a runnable control
 * build it stays unpaired. The builds are tests/helpers/fake_runner, which
 * honours the spec's reference like the real runner: per pair a reference
 * frame scaled by the reference env's FAKE_TIMING_SCALE, then the head's.
 */
#include <criterion/criterion.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "tests/helpers/common/testutil.h"

static struct tu_capd capd;

static void start(void)
{
    char *dir = tu_tmpdir();
    cr_assert_not_null(dir);
    cr_assert_eq(tu_capd_start(&capd, dir, NULL), 0, "capd starts");
    free(dir);
}

static void stop(void)
{
    tu_capd_stop(&capd);
}

/* A fake build whose timing is SCALE times 1 ms; PYTHON NULL: the fake. */
static void build(const char *name, const char *scale, const char *python, const char *method)
{
    long st = 0;
    char *fake = tu_helper("fake_runner"), path[128];
    snprintf(path, sizeof path, method[1] == 'U' ? "/v1/builds/%s" : "/v1/builds", name);
    json_t *j = tu_jsonf(&capd, method, path, &st,
                         "{\"name\":\"%s\",\"python\":\"%s\",\"env\":{\"FAKE_TIMING_SCALE\":"
                         "\"%s\"},\"model_roots\":[\"%s\"]}",
                         name, python ? python : fake, scale, capd.dir);
    cr_assert(st == 201 || st == 200, "build %s: %ld", name, st);
    json_decref(j);
    free(fake);
}

/* Posts a one-cell job of BUILD at COMMIT (EXTRA: more job fields) and waits. */
static char *job(const char *build, const char *commit, const char *extra, const char *options)
{
    long st = 0;
    json_t *j =
        tu_jsonf(&capd, "POST", "/v1/jobs", &st,
                 "{\"project\":\"t\",\"commit\":\"%s\",\"build\":\"%s\",%s"
                 "\"matrix\":{\"models\":[\"fake:ok\"],\"widths\":[\"default\"],"
                 "\"passes\":[\"forward\"]},\"options\":%s}",
                 commit, build, extra ? extra : "", options ? options : "{\"iterations\":10}");
    cr_assert_eq(st, 201, "job of %s at %s", build, commit);
    char *id = strdup(json_string_value(json_object_get(j, "id")));
    json_decref(j);
    json_t *done = tu_wait_job(&capd, id, 120);
    cr_assert_not_null(done, "job %s finishes", id);
    cr_assert_str_eq(json_string_value(json_object_get(done, "state")), "done");
    json_decref(done);
    return id;
}

/* The timing records of the job's only cell. */
static json_t *timings(const char *id)
{
    char path[160];
    snprintf(path, sizeof path, "/v1/jobs/%s", id);
    json_t *j = tu_json(&capd, "GET", path, NULL, NULL);
    const char *cid =
        json_string_value(json_object_get(json_array_get(json_object_get(j, "cells"), 0), "id"));
    snprintf(path, sizeof path, "/v1/jobs/%s/cells/%s/records?kind=timing&limit=1000", id, cid);
    json_t *r = tu_json(&capd, "GET", path, NULL, NULL);
    json_decref(j);
    cr_assert_not_null(r);
    json_t *a = json_incref(json_object_get(r, "records"));
    json_decref(r);
    return a;
}

/* The perf object of the only cell of control vs head. */
static json_t *perf(const char *control, const char *head)
{
    char path[160];
    long st = 0;
    snprintf(path, sizeof path, "/v1/compare?control=%s&head=%s", control, head);
    json_t *r = tu_json(&capd, "GET", path, NULL, &st);
    cr_assert_eq(st, 200, "compare %s %s", control, head);
    json_t *p =
        json_incref(json_object_get(json_array_get(json_object_get(r, "cells"), 0), "perf"));
    json_decref(r);
    return p;
}

static const char *pstr(json_t *p, const char *k)
{
    const char *s = json_string_value(json_object_get(p, k));
    return s ? s : "(null)";
}

static json_int_t pint(json_t *p, const char *k)
{
    return json_integer_value(json_object_get(p, k));
}

/* Every record of TS is unpaired: no pair, no reference. */
static void assert_unpaired(json_t *ts, size_t n)
{
    size_t i;
    json_t *t;
    cr_assert_eq(json_array_size(ts), n, "%zu timing records", json_array_size(ts));
    json_array_foreach(ts, i, t)
    {
        cr_assert_null(json_object_get(t, "pair"));
        cr_assert_null(json_object_get(t, "reference"));
    }
}

/* Build "ctl" at speed factor CTL and build HEAD at HEAD_FACTOR; the
 * control job (*C, aaaaaaa) and the head's (*H, bbbbbbb) against it.
 * Returns the head job's timing records. */
static json_t *paired_jobs(const char *head, const char *ctl, const char *head_factor, char **c,
                           char **h)
{
    build("ctl", ctl, NULL, "POST");
    build(head, head_factor, NULL, "POST");
    *c = job("ctl", "aaaaaaa", NULL, NULL);
    *h = job(head, "bbbbbbb", "\"control_commit\":\"aaaaaaa\",", NULL);
    return timings(*h);
}

Test(pairs, head_interleaves_the_control_build, .init = start, .fini = stop, .timeout = 120)
{
    char *c, *h;
    json_t *ts = paired_jobs("slow", "1.0", "1.5", &c, &h);
    size_t i;
    json_t *t;
    cr_assert_eq(json_array_size(ts), 8, "4 pairs, one round: %zu", json_array_size(ts));
    json_array_foreach(ts, i, t)
    {
        /* control, head, control, head, ...: pair i/2, the even ones the reference */
        cr_assert_eq(json_integer_value(json_object_get(t, "pair")), (json_int_t)(i / 2));
        cr_assert_eq(json_is_true(json_object_get(t, "reference")), i % 2 == 0, "record %zu", i);
        json_int_t s0 = json_integer_value(json_array_get(json_object_get(t, "samples_ns"), 0));
        /* the reference in the control build's environment, the head in its own */
        if (i % 2 == 0)
            cr_assert(s0 > 900000 && s0 < 1100000, "reference sample %lld", (long long)s0);
        else
            cr_assert(s0 > 1400000 && s0 < 1600000, "head sample %lld", (long long)s0);
    }
    json_decref(ts);
    json_t *p = perf(c, h);
    cr_assert_str_eq(pstr(p, "design"), "paired");
    cr_assert_eq(pint(p, "pairs"), 4);
    cr_assert_str_eq(pstr(p, "verdict"), "regression");
    json_decref(p);
    /* the control's own job has no control: unpaired */
    ts = timings(c);
    assert_unpaired(ts, 5);
    json_decref(ts);
    free(c);
    free(h);
}

/*
 * A paired head cell's history point is its own processes' time: the
 * control build's (a third of it here) are in the cell's timing records
 * but are the control's (docs/history.md, the perf observation).
 */
Test(pairs, history_point_is_the_heads_own_time, .init = start, .fini = stop, .timeout = 120)
{
    build("ctl", "1.0", NULL, "POST");
    build("slow", "3.0", NULL, "POST");
    char *c = job("ctl", "aaaaaaa", "\"branch\":\"main\",", NULL);
    char *h = job("slow", "bbbbbbb", "\"branch\":\"main\",\"control_commit\":\"aaaaaaa\",", NULL);
    long st = 0;
    json_t *hist = tu_json(
        &capd, "GET", "/v1/history?project=t&branch=main&model=fake:ok&width=default&pass=forward",
        NULL, &st);
    cr_assert_eq(st, 200);
    json_t *pts = json_object_get(hist, "points");
    cr_assert_eq(json_array_size(pts), 2, "one point per job");
    /* the fake's samples: scale x 1 ms, each within a few percent */
    double want[2] = {1e6, 3e6};
    for (size_t i = 0; i < 2; i++) {
        json_t *p = json_array_get(pts, i);
        double ns = json_number_value(json_object_get(p, "perf_ns"));
        cr_assert(ns > 0.9 * want[i] && ns < 1.1 * want[i], "point %zu: %g ns", i, ns);
    }
    cr_assert_eq(json_integer_value(json_object_get(json_array_get(pts, 1), "perf_samples")), 4,
                 "the head's 4 processes, not the control's");
    json_decref(hist);
    free(c);
    free(h);
}

Test(pairs, branch_control_pairs_too, .init = start, .fini = stop, .timeout = 120)
{
    build("ctl", "1.0", NULL, "POST");
    char *c = job("ctl", "aaaaaaa", NULL, NULL);
    long st = 0;
    json_decref(
        tu_json(&capd, "PUT", "/v1/branches/main", "{\"control_commit\":\"aaaaaaa\"}", &st));
    cr_assert_eq(st, 200);
    char *h = job("ctl", "bbbbbbb", "\"branch\":\"main\",", NULL);
    json_t *p = perf(c, h);
    cr_assert_str_eq(pstr(p, "design"), "paired");
    cr_assert_eq(pint(p, "pairs"), 4);
    cr_assert_str_eq(pstr(p, "verdict"), "same", "an A/A on pairs");
    json_decref(p);
    free(c);
    free(h);
}

/* Pairs whose ratios straddle the threshold (the control 5% slower than the
 * head) get more rounds: max_timing_rounds rounds, timing_pairs pairs and
 * then half as many a round (rounded up). */
Test(pairs, unknown_pairs_get_more_rounds, .init = start, .fini = stop, .timeout = 120)
{
    char *c, *h;
    json_t *ts = paired_jobs("head", "1.05", "1.0", &c, &h);
    cr_assert_eq(json_array_size(ts), 16, "rounds of 4, 2 and 2 pairs: %zu", json_array_size(ts));
    cr_assert_eq(json_integer_value(json_object_get(json_array_get(ts, 7), "round")), 0);
    cr_assert_eq(json_integer_value(json_object_get(json_array_get(ts, 8), "round")), 1);
    cr_assert_eq(json_integer_value(json_object_get(json_array_get(ts, 15), "round")), 2);
    json_decref(ts);
    json_t *p = perf(c, h);
    cr_assert_eq(pint(p, "pairs"), 8);
    json_decref(p);
    char *h2 = job("head", "ccccccc", "\"control_commit\":\"aaaaaaa\",",
                   "{\"iterations\":10,\"timing_pairs\":5,\"max_timing_rounds\":2}");
    ts = timings(h2);
    cr_assert_eq(json_array_size(ts), 16, "rounds of 5 and 3 pairs: %zu", json_array_size(ts));
    json_decref(ts);
    free(c);
    free(h);
    free(h2);
}

Test(pairs, unpaired_without_a_runnable_control_build, .init = start, .fini = stop, .timeout = 180)
{
    /* a copy of the fake runner as the control build's interpreter */
    char *fake = tu_helper("fake_runner"), copy[400];
    snprintf(copy, sizeof copy, "%s/ctl-python", capd.dir);
    cr_assert_eq(tu_sh("cp '%s' '%s'", fake, copy), 0);
    build("ctl", "1.0", copy, "POST");
    build("head", "1.0", NULL, "POST");

    /* no control at all */
    char *c = job("ctl", "aaaaaaa", NULL, NULL);
    char *h = job("head", "bbbbbbb", NULL, NULL);
    json_t *ts = timings(h);
    assert_unpaired(ts, 5);
    json_decref(ts);
    json_t *p = perf(c, h);
    cr_assert_str_eq(pstr(p, "design"), "unpaired");
    json_decref(p);

    /* timing_pairs 0: never paired */
    char *h0 = job("head", "bbbbbb0", "\"control_commit\":\"aaaaaaa\",",
                   "{\"iterations\":10,\"timing_pairs\":0}");
    ts = timings(h0);
    assert_unpaired(ts, 5);
    json_decref(ts);

    /* the control build's interpreter is gone from the host */
    cr_assert_eq(unlink(copy), 0);
    char *h1 = job("head", "bbbbbb1", "\"control_commit\":\"aaaaaaa\",", NULL);
    ts = timings(h1);
    assert_unpaired(ts, 5);
    json_decref(ts);
    p = perf(c, h1);
    cr_assert_str_eq(pstr(p, "design"), "unpaired");
    json_decref(p);

    /* the control build replaced (PUT) after the control job: not the build it ran */
    build("ctl", "1.0", NULL, "PUT");
    char *h2 = job("head", "bbbbbb2", "\"control_commit\":\"aaaaaaa\",", NULL);
    ts = timings(h2);
    assert_unpaired(ts, 5);
    json_decref(ts);

    /* a new control job of the replaced build pairs again */
    char *c2 = job("ctl", "aaaaaaa", NULL, NULL);
    char *h3 = job("head", "bbbbbb3", "\"control_commit\":\"aaaaaaa\",", NULL);
    ts = timings(h3);
    cr_assert_eq(json_array_size(ts), 8, "4 pairs");
    json_decref(ts);
    free(fake);
    free(c);
    free(c2);
    free(h);
    free(h0);
    free(h1);
    free(h2);
    free(h3);
}
