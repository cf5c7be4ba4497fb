/*
 * tests/test_compare_perf_basis.c - which clock the perf verdict judges
 * (docs/compare.md, "Performance", basis): own time (wall time less the
 * timing thread's run-queue delay) when every process has it, so a head
 * that waits (sleeps, locks, device synchronisation) is slower even at
 * equal CPU time, and a head that only waited for its CPU is not; the
 * older bases for records from before own time. The engine alone, on
 * processes built by hand.
 */
#include <errno.h>
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <criterion/criterion.h>
#include <jansson.h>

#include "compare/cmp.h"
#include "tests/helpers/common/cmp_records.h"
#include "tests/helpers/common/json_want.h"

#define SAMPLES 10

/* One timing process as the runner measures it: per-sample medians of
 * each clock in nanoseconds, all jittered by up to +-0.5%. */
struct clocks {
    double wall, runqueue, cpu;
    double device;    /* the device's time a sample (a GPU cell); 0: none sent */
    bool own, totals; /* send own samples; send the totals (a runner of own time) */
};

static double jitter(uint64_t *seed)
{
    *seed = *seed * 6364136223846793005ull + 1442695040888963407ull;
    return 1.0 + 0.01 * ((double)(*seed >> 40) / 16777216.0 - 0.5);
}

/* Adds one process of clocks K to CELL (PAIR -1: unpaired). */
static void add_proc(struct cmp_cell *cell, const struct clocks *k, int64_t pair, bool ref,
                     uint64_t seed)
{
    int64_t wall[SAMPLES], own[SAMPLES], cpu[SAMPLES], dev[SAMPLES], rq_total = 0, cpu_total = 0;
    for (size_t i = 0; i < SAMPLES; i++) {
        wall[i] = (int64_t)(k->wall * jitter(&seed));
        int64_t rq = (int64_t)(k->runqueue * jitter(&seed));
        own[i] = rq < wall[i] ? wall[i] - rq : 0;
        cpu[i] = (int64_t)fmin(k->cpu * jitter(&seed), (double)own[i]);
        dev[i] = (int64_t)fmin(k->device * jitter(&seed), (double)wall[i]);
        rq_total += wall[i] - own[i];
        cpu_total += cpu[i];
    }
    cr_assert_eq(cmp_cell_add_timing_process(cell, wall, SAMPLES, pair, ref), 0);
    cr_assert_eq(cmp_cell_set_process_cpu(cell, cpu, SAMPLES), 0);
    if (k->own)
        cr_assert_eq(cmp_cell_set_process_own(cell, own, SAMPLES), 0);
    if (k->device > 0)
        cr_assert_eq(cmp_cell_set_process_device(cell, dev, SAMPLES), 0);
    struct cmp_proc_totals t = {SAMPLES, k->own ? rq_total : -1, cpu_total, 0};
    if (k->totals)
        cr_assert_eq(cmp_cell_set_process_totals(cell, &t), 0);
}

/* Control and head cells of one model; PAIRED: the head cell carries N
 * pairs (the control's build as reference processes), else N own
 * processes a side. */
static json_t *compare(const struct clocks *c, const struct clocks *h, bool paired, int n)
{
    struct cmp_side *sc, *sh;
    cr_assert_eq(cmp_side_new(&sc), 0);
    cr_assert_eq(cmp_side_new(&sh), 0);
    struct cmp_cell *cc = crec_cell(sc, "m", "default", "forward");
    struct cmp_cell *hc = crec_cell(sh, "m", "default", "forward");
    for (int i = 0; i < n; i++) {
        if (paired) {
            add_proc(hc, c, i, true, 100 + (uint64_t)i);
        } else {
            add_proc(cc, c, -1, false, 100 + (uint64_t)i);
        }
        add_proc(hc, h, paired ? i : -1, false, 200 + (uint64_t)i);
    }
    return crec_compare(sc, sh);
}

/* compare() of C and H, paired (6 pairs) or not (5 processes a side),
 * failing the test unless the head is a regression of about twice the
 * control, judged on BASIS; the result (owned). */
static json_t *doubled_on(const struct clocks *c, const struct clocks *h, bool paired,
                          const char *basis)
{
    json_t *r = compare(c, h, paired, paired ? 6 : 5);
    const struct jw_want w[] = {
        JW_S("cells.0.perf.basis", basis),
        JW_N("cells.0.perf.basis_reason"),
        JW_S("cells.0.perf.verdict", "regression"),
    };
    jw_expect_all(r, w);
    cr_assert(fabs(jw_num(r, "cells.0.perf.ratio") - 2.0) < 0.05, "ratio %g",
              jw_num(r, "cells.0.perf.ratio"));
    return r;
}

/*
 * A head whose model waits (sleeps, blocks) for as long again as it
 * computes spends no more CPU: judged on CPU time it was `same`, which is
 * how records from before own time still read. Its own time is twice the
 * control's: a regression, in either design, and the perf block lists
 * every clock beside the basis.
 */
Test(perf_basis, a_head_that_waits_is_a_regression_at_equal_cpu_time)
{
    struct clocks c = {1e6, 1e4, 0.95e6, 0, true, true}, h = {2e6, 1e4, 0.95e6, 0, true, true};
    for (int paired = 0; paired < 2; paired++) {
        json_t *r = doubled_on(&c, &h, paired, "own_time");
        double cpu_ratio = jw_num(r, "cells.0.perf.times.head.cpu_ns") /
                           jw_num(r, "cells.0.perf.times.control.cpu_ns");
        cr_assert(fabs(cpu_ratio - 1.0) < 0.02, "CPU time equal: %g", cpu_ratio);
        /* The observations are each process's fastest own sample: at most
         * its median, within the samples' 1% jitter of it. */
        double fastest = jw_num(r, "cells.0.perf.head_median_ns");
        double typical = jw_num(r, "cells.0.perf.times.head.own_ns");
        cr_assert(fastest <= typical && fastest > 0.99 * typical, "%g %g", fastest, typical);
        cr_assert(fabs(jw_num(r, "cells.0.perf.times.head.wall_ns") / 2e6 - 1) < 0.01);
        cr_assert(fabs(jw_num(r, "cells.0.perf.times.control.runqueue_ns") / 1e4 - 1) < 0.02);
        cr_assert(fabs(jw_num(r, "cells.0.perf.times.control.process_runqueue_ns") / 1e4 - 1) <
                  0.02);
        cr_assert(fabs(jw_num(r, "cells.0.perf.times.control.process_cpu_ns") / 0.95e6 - 1) < 0.01);
        cr_assert_eq(jw_num(r, "cells.0.perf.times.head.steal_ns"), 0);
        json_decref(r);
    }
    /* The same processes from before own time: CPU time, and a pass. */
    c.own = h.own = c.totals = h.totals = false;
    json_t *r = compare(&c, &h, true, 6);
    cr_assert_str_eq(jw_str(r, "cells.0.perf.basis"), "cpu_time");
    cr_assert_str_eq(jw_str(r, "cells.0.perf.verdict"), "same");
    json_decref(r);
}

/*
 * A head whose wall time doubled only because other work held its CPU
 * (run-queue delay; its own time equal to the control's) is not a
 * regression: judged on wall time it would be.
 */
Test(perf_basis, waiting_for_the_cpu_is_not_the_heads_time)
{
    struct clocks c = {1e6, 1e4, 0.95e6, 0, true, true}, h = {2e6, 1.01e6, 0.95e6, 0, true, true};
    for (int paired = 0; paired < 2; paired++) {
        json_t *r = compare(&c, &h, paired, paired ? 6 : 5);
        cr_assert_str_eq(jw_str(r, "cells.0.perf.basis"), "own_time");
        cr_assert_str_eq(jw_str(r, "cells.0.perf.verdict"), "same", "%s: ratio %g",
                         paired ? "paired" : "unpaired", jw_num(r, "cells.0.perf.ratio"));
        cr_assert(fabs(jw_num(r, "cells.0.perf.times.head.wall_ns") / 2e6 - 1) < 0.01);
        cr_assert(fabs(jw_num(r, "cells.0.perf.times.head.runqueue_ns") / 1.01e6 - 1) < 0.02);
        json_decref(r);
    }
    /* Where the kernel keeps no run-queue delay, the runner sends none
     * (totals, no own samples): wall time, said so, and the alarm. */
    c.own = h.own = false;
    json_t *r = compare(&c, &h, true, 6);
    static const struct jw_want w[] = {
        JW_S("cells.0.perf.basis", "wall_time"),
        JW_S("cells.0.perf.verdict", "regression"),
        JW_N("cells.0.perf.times.head.own_ns"),
        JW_N("cells.0.perf.times.head.process_runqueue_ns"),
    };
    jw_expect_all(r, w);
    cr_assert(strstr(jw_str(r, "cells.0.perf.basis_reason"), "no run-queue delay for 12 of 12"),
              "%s", jw_str(r, "cells.0.perf.basis_reason"));
    json_decref(r);
}

/* Records from before own time keep the basis they were judged on, and a
 * comparison of old against new records falls back to wall time. */
Test(perf_basis, older_records_keep_their_basis)
{
    struct clocks old = {1e6, 1e4, 0.95e6, 0, false, false},
                  now = {1e6, 1e4, 0.95e6, 0, true, true};
    json_t *r = compare(&old, &old, false, 5);
    cr_assert_str_eq(jw_str(r, "cells.0.perf.basis"), "cpu_time");
    cr_assert(strstr(jw_str(r, "cells.0.perf.basis_reason"), "before own time: CPU time"));
    cr_assert(json_is_null(jw_path(r, "cells.0.perf.times.control.own_ns")));
    json_decref(r);

    r = compare(&old, &now, false, 5);
    cr_assert_str_eq(jw_str(r, "cells.0.perf.basis"), "wall_time");
    cr_assert(
        strstr(jw_str(r, "cells.0.perf.basis_reason"), "5 of 10 timing processes have no own"),
        "%s", jw_str(r, "cells.0.perf.basis_reason"));
    json_decref(r);

    /* Wall samples only (the oldest runners): wall time. */
    struct cmp_side *sc, *sh;
    int64_t t[SAMPLES];
    cr_assert_eq(cmp_side_new(&sc), 0);
    cr_assert_eq(cmp_side_new(&sh), 0);
    struct cmp_cell *cc = crec_cell(sc, "m", "default", "forward");
    struct cmp_cell *hc = crec_cell(sh, "m", "default", "forward");
    for (int i = 0; i < SAMPLES; i++)
        t[i] = 1000000 + i;
    for (int i = 0; i < 5; i++) {
        cr_assert_eq(cmp_cell_add_timing(cc, t, SAMPLES), 0);
        cr_assert_eq(cmp_cell_add_timing(hc, t, SAMPLES), 0);
    }
    r = crec_compare(sc, sh);
    cr_assert_str_eq(jw_str(r, "cells.0.perf.basis"), "wall_time");
    cr_assert_str_eq(jw_str(r, "cells.0.perf.basis_reason"),
                     "records from before own time: wall time");
    json_decref(r);
}

/* What the engine refuses of own samples and totals, leaving the process
 * as it was. */
Test(perf_basis, own_samples_and_totals_are_checked)
{
    struct cmp_side *s;
    struct cmp_cell *c;
    int64_t wall[4] = {100, 200, 300, 400}, own[4] = {90, 200, 250, 10};
    struct cmp_proc_totals t = {4, 50, 1000, -1};
    cr_assert_eq(cmp_side_new(&s), 0);
    c = crec_cell(s, "m", "default", "forward");
    cr_assert_eq(cmp_cell_set_process_own(c, own, 4), -EINVAL, "no process yet");
    cr_assert_eq(cmp_cell_set_process_totals(c, &t), -EINVAL, "no process yet");
    cr_assert_eq(cmp_cell_add_timing_process(c, wall, 4, -1, false), 0);
    cr_assert_eq(cmp_cell_set_process_own(c, own, 3), -EINVAL, "one per wall sample");
    own[2] = 301;
    cr_assert_eq(cmp_cell_set_process_own(c, own, 4), -EINVAL, "past its wall sample");
    own[2] = -1;
    cr_assert_eq(cmp_cell_set_process_own(c, own, 4), -EINVAL, "negative");
    own[2] = 250;
    cr_assert_eq(cmp_cell_set_process_own(c, own, 0), 0, "none: ignored");
    cr_assert_eq(cmp_cell_set_process_own(c, own, 4), 0);
    t.iterations = 0;
    cr_assert_eq(cmp_cell_set_process_totals(c, &t), -EINVAL, "no iterations");
    t.iterations = 4;
    t.cpu_ns = CMP_MAX_TIMING_NS + 1;
    cr_assert_eq(cmp_cell_set_process_totals(c, &t), -EINVAL, "past CMP_MAX_TIMING_NS");
    t.cpu_ns = 1000;
    cr_assert_eq(cmp_cell_set_process_totals(c, &t), 0);
    cr_assert_eq(cmp_cell_set_process_totals(NULL, &t), -EINVAL);
    cr_assert_eq(cmp_cell_set_process_own(NULL, own, 4), -EINVAL);

    /* Compared with itself: own time; the observation its fastest own
     * sample, the times medians per iteration; steal unknown. */
    json_t *r = NULL;
    cr_assert_eq(cmp_compare(s, s, NULL, &r), 0);
    static const struct jw_want w[] = {
        JW_S("cells.0.perf.basis", "own_time"),
        JW_D("cells.0.perf.control_median_ns", 10, 1e-9),     /* the least of 90 200 250 10 */
        JW_D("cells.0.perf.times.control.own_ns", 145, 1e-9), /* their median */
        JW_D("cells.0.perf.times.control.wall_ns", 250, 1e-9),
        JW_D("cells.0.perf.times.control.runqueue_ns", 30, 1e-9), /* of 10 0 50 390 */
        JW_D("cells.0.perf.times.control.process_runqueue_ns", 12.5, 1e-9),
        JW_D("cells.0.perf.times.control.process_cpu_ns", 250, 1e-9),
        JW_N("cells.0.perf.times.control.steal_ns"),
        JW_N("cells.0.perf.times.control.cpu_ns"),
    };
    jw_expect_all(r, w);
    json_decref(r);
    cmp_side_free(s);
}

/*
 * A GPU cell whose every process sent device time is judged on it: a head
 * whose device span doubled is a regression whatever its host clocks
 * (own, wall) say, and a head whose host clocks grew outside the device's
 * span (its wait for the final synchronisation, say) with the same device
 * time is `same`, its own time beside the verdict. One process without
 * device time puts the cell back on own time.
 */
Test(perf_basis, a_gpu_cell_is_judged_on_device_time)
{
    struct clocks c = {2e6, 1e4, 0.3e6, 1e6, true, true}, h = {2.1e6, 1e4, 0.3e6, 2e6, true, true};
    for (int paired = 0; paired < 2; paired++) {
        json_t *r = doubled_on(&c, &h, paired, "device_time");
        cr_assert(fabs(jw_num(r, "cells.0.perf.times.head.device_ns") / 2e6 - 1) < 0.01);
        cr_assert(fabs(jw_num(r, "cells.0.perf.times.head.own_ns") / 2.1e6 - 1) < 0.01);
        char *md = cmp_result_to_markdown(r);
        cr_assert(strstr(md, "pairs, device time") || strstr(md, "processes, device time"), "%s",
                  md);
        free(md);
        json_decref(r);
    }
    struct clocks slow_host = {4e6, 1e4, 0.3e6, 1e6, true, true};
    json_t *r = compare(&c, &slow_host, true, 6);
    cr_assert_str_eq(jw_str(r, "cells.0.perf.basis"), "device_time");
    cr_assert_str_eq(jw_str(r, "cells.0.perf.verdict"), "same");
    cr_assert(jw_num(r, "cells.0.perf.times.head.own_ns") >
              1.9 * jw_num(r, "cells.0.perf.times.control.own_ns"));
    json_decref(r);
    struct clocks no_device = h;
    no_device.device = 0;
    r = compare(&c, &no_device, true, 6);
    cr_assert_str_eq(jw_str(r, "cells.0.perf.basis"), "own_time");
    cr_assert(json_is_null(jw_path(r, "cells.0.perf.times.head.device_ns")));
    json_decref(r);
}

/* Device samples are one per wall sample, each a non-negative time. */
Test(perf_basis, device_samples_are_checked)
{
    struct cmp_side *s;
    int64_t wall[3] = {100, 200, 300}, dev[3] = {50, 60, 70};
    cr_assert_eq(cmp_side_new(&s), 0);
    struct cmp_cell *c = crec_cell(s, "m", "default", "forward");
    cr_assert_eq(cmp_cell_set_process_device(c, dev, 3), -EINVAL, "no process yet");
    cr_assert_eq(cmp_cell_add_timing_process(c, wall, 3, -1, false), 0);
    cr_assert_eq(cmp_cell_set_process_device(c, dev, 2), -EINVAL, "one per wall sample");
    dev[1] = -1;
    cr_assert_eq(cmp_cell_set_process_device(c, dev, 3), -EINVAL, "negative");
    dev[1] = 60;
    cr_assert_eq(cmp_cell_set_process_device(c, dev, 3), 0);
    cmp_side_free(s);
}
