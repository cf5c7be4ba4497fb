/*
 * tests/test_numerics.c - the scheduler runs numerics-only cells
 * (options.iterations 0: nothing is timed) in parallel up to
 * max_parallel_numerics, keeps them to max_parallel without it, and never
 * lets a timing cell share the CPU with
 * anything (daemon/capd.c, docs/prefork.md "Numerics-only jobs").
 *
 * Cells of the fake runner that sleep 1.5 s; whether two ran at once is read
 * from their started_at/finished_at.
 */
#include <criterion/criterion.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "tests/helpers/common/api_fixtures.h"
#include "tests/helpers/common/testutil.h"

#define SLOW_MODELS                                                                                \
    "\"fake:slow__1500\",\"fake:slow__1501\",\"fake:slow__1502\",\"fake:slow__1503\""

/* ms since midnight from "YYYY-MM-DDTHH:MM:SS.mmmZ" (tests run for minutes). */
static long ms_of(json_t *cell, const char *k)
{
    const char *t = json_string_value(json_object_get(cell, k));
    int h, m, s, ms;
    cr_assert(t && sscanf(t, "%*d-%*d-%*dT%d:%d:%d.%dZ", &h, &m, &s, &ms) == 4, "%s: %s", k,
              t ? t : "(null)");
    return ((h * 60L + m) * 60 + s) * 1000 + ms;
}

/* The largest number of cells of JOBS that were running at one moment. */
static int max_overlap(json_t **jobs, int njobs)
{
    long start[64], end[64];
    int n = 0;
    for (int j = 0; j < njobs; j++) {
        size_t i;
        json_t *cell;
        json_array_foreach(json_object_get(jobs[j], "cells"), i, cell)
        {
            cr_assert_str_eq(json_string_value(json_object_get(cell, "state")), "ok", "%s",
                             json_string_value(json_object_get(cell, "reason")));
            cr_assert_lt(n, 64);
            start[n] = ms_of(cell, "started_at");
            end[n] = ms_of(cell, "finished_at");
            n++;
        }
    }
    int best = 0;
    for (int i = 0; i < n; i++) {
        int k = 0;
        for (int j = 0; j < n; j++)
            k += start[j] <= start[i] && start[i] < end[j];
        best = k > best ? k : best;
    }
    return best;
}

static char *submit(struct tu_capd *c, const char *commit, int iterations)
{
    char options[64];
    snprintf(options, sizeof options, "{\"iterations\":%d}", iterations);
    struct af_job job = {"p",         commit,     NULL,          "fake",
                         SLOW_MODELS, "\"avx2\"", "\"forward\"", options};
    return af_submit_job(c, &job);
}

static json_t *wait_done(struct tu_capd *c, const char *id)
{
    return af_wait_job(c, id, 120);
}

/* The most cells that overlapped in one numerics-only job at COMMIT, on a
 * capd started with EXTRA. */
static int one_job_overlap(const char *const *extra, const char *commit)
{
    struct tu_capd c;
    cr_assert_eq(tu_capd_start(&c, NULL, extra), 0);
    cr_assert_eq(tu_fake_build(&c, "fake", NULL), 201);
    char *id = submit(&c, commit, 0);
    json_t *job = wait_done(&c, id);
    int k = max_overlap(&job, 1);
    json_decref(job);
    free(id);
    tu_capd_stop(&c);
    return k;
}

/* iterations 0 at max_parallel 1: cells run side by side. */
Test(numerics, numerics_only_cells_run_in_parallel)
{
    if (sysconf(_SC_NPROCESSORS_ONLN) < 2)
        cr_skip_test("one CPU: nothing to run in parallel");
    const char *const extra[] = {"--max-parallel-numerics", "2", NULL};
    int k = one_job_overlap(extra, "1111111");
    cr_assert_eq(k, 2, "numerics-only cells overlapped up to max_parallel_numerics (%d)", k);
}

/* Without max_parallel_numerics, max_parallel 1 means one cell at a time
 * for numerics-only jobs too. */
Test(numerics, max_parallel_is_a_cap_for_numerics_only_jobs)
{
    int k = one_job_overlap(NULL, "3333333");
    cr_assert_eq(k, 1, "max_parallel 1 was exceeded (%d at once)", k);
}

/* A timing job queued behind a numerics-only one: its cells run alone, and
 * the numerics cells still overlap among themselves. A timing job queued
 * first keeps the numerics job behind it from starting beside it. */
Test(numerics, timing_cells_never_share_the_cpu)
{
    struct tu_capd c;
    const char *const extra[] = {"--max-parallel-numerics", "4", NULL};
    cr_assert_eq(tu_capd_start(&c, NULL, extra), 0);
    cr_assert_eq(tu_fake_build(&c, "fake", NULL), 201);
    char *t1 = submit(&c, "2222222", 2);
    char *n1 = submit(&c, "3333333", 0);
    char *t2 = submit(&c, "4444444", 2);
    json_t *jt1 = wait_done(&c, t1), *jn1 = wait_done(&c, n1), *jt2 = wait_done(&c, t2);
    cr_assert_eq(max_overlap(&jt1, 1), 1, "timing cells run one at a time");
    cr_assert_eq(max_overlap(&jt2, 1), 1, "timing cells run one at a time");
    json_t *a[2] = {jt1, jn1}, *b[2] = {jn1, jt2};
    /* A timing cell never runs beside a numerics cell: the largest overlap
     * with the neighbouring jobs is the numerics job's own. */
    int own = max_overlap(&jn1, 1);
    cr_assert_eq(max_overlap(a, 2), own > 1 ? own : 1);
    cr_assert_eq(max_overlap(b, 2), own > 1 ? own : 1);
    if (sysconf(_SC_NPROCESSORS_ONLN) >= 2)
        cr_assert_geq(own, 2, "the numerics job between them still ran in parallel");
    json_decref(jt1);
    json_decref(jn1);
    json_decref(jt2);
    free(t1);
    free(n1);
    free(t2);
    tu_capd_stop(&c);
}
