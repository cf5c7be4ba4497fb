/*
 * tests/test_history_cp.c - the change-point detector (compare/changepoint.c)
 * against known vectors and seeded synthetic series.
 *
 * The rate tests draw 200 series per case from a seeded generator (normal
 * noise by Box-Muller), run the detector and count: a step must be found at
 * its exact index, noise and single spikes must give nothing. The measured
 * rates are printed (cr_log_info) and asserted against the contract of
 * docs/history.md.
 */
#include <errno.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

#include <criterion/criterion.h>
#include <criterion/logging.h>

#include "compare/changepoint.h"

static uint64_t splitmix(uint64_t *s)
{
    uint64_t z = (*s += 0x9e3779b97f4a7c15ULL);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
    return z ^ (z >> 31);
}

static double uniform(uint64_t *s)
{
    return ((double)(splitmix(s) >> 11) + 0.5) / 9007199254740992.0;
}

static double normal(uint64_t *s)
{
    double u = uniform(s), v = uniform(s);
    return sqrt(-2 * log(u)) * cos(2 * M_PI * v);
}

#define LEN 60
#define AT  30

/* LEN points of level 100 with NOISE relative normal noise; from AT on the
 * level is 100 * (1 + STEP); SPIKE (when not 0) multiplies the point at AT. */
static void series(uint64_t seed, double noise, double step, double spike, double *x)
{
    uint64_t s = seed * 7919 + 1;
    for (int i = 0; i < LEN; i++) {
        double level = i >= AT ? 100 * (1 + step) : 100;
        x[i] = level * (1 + noise * normal(&s));
    }
    if (spike != 0)
        x[AT] *= spike;
}

struct rates {
    int exact, any, total;
};

static struct rates run(double noise, double step, double spike)
{
    struct rates r = {0, 0, 0};
    double x[LEN];
    struct cmp_cp cps[CMP_CP_MAX_CHANGES];
    for (uint64_t seed = 1; seed <= 200; seed++) {
        size_t n = 0;
        series(seed, noise, step, spike, x);
        cr_assert_eq(cmp_changepoints(x, LEN, NULL, cps, CMP_CP_MAX_CHANGES, &n), 0);
        r.total++;
        r.any += n > 0;
        r.exact += n == 1 && cps[0].index == AT;
    }
    return r;
}

Test(changepoint, steps_found_at_the_right_index)
{
    static const double steps[] = {0.10, 0.30, -0.10, 0.03};
    for (size_t i = 0; i < sizeof steps / sizeof steps[0]; i++) {
        struct rates r = run(0.02, steps[i], 0);
        double rate = (double)r.exact / r.total;
        cr_log_info("step %+.0f%% at 2%% noise: exact index in %d/%d series (%.1f%%), some change "
                    "in %d",
                    steps[i] * 100, r.exact, r.total, 100 * rate, r.any);
        if (fabs(steps[i]) >= 0.10)
            cr_expect_geq(rate, 0.95, "step %+.0f%%: %.3f", steps[i] * 100, rate);
        else /* 1.5 sigma: found, not always placed exactly (docs/history.md) */
            cr_expect_geq((double)r.any / r.total, 0.80, "3%% step found at all: %d", r.any);
    }
    /* A 3% step over 0.5% noise (a quiet machine) is placed exactly. */
    struct rates quiet = run(0.005, 0.03, 0);
    cr_log_info("step +3%% at 0.5%% noise: exact index in %d/%d series", quiet.exact, quiet.total);
    cr_expect_geq((double)quiet.exact / quiet.total, 0.95);
}

Test(changepoint, noise_and_spikes_give_nothing)
{
    struct rates noise = run(0.02, 0, 0);
    struct rates spike = run(0.02, 0, 1.5);
    struct rates dip = run(0.02, 0, 0.6);
    cr_log_info("pure noise (2%%): a change point in %d/%d series", noise.any, noise.total);
    cr_log_info("single spike x1.5: a change point in %d/%d series", spike.any, spike.total);
    cr_log_info("single dip x0.6: a change point in %d/%d series", dip.any, dip.total);
    cr_expect_leq((double)noise.any / noise.total, 0.01);
    cr_expect_leq((double)spike.any / spike.total, 0.01);
    cr_expect_leq((double)dip.any / dip.total, 0.01);
}

Test(changepoint, known_vector)
{
    /* A clean step: every field is worked out by hand. */
    double x[12] = {10, 10, 10, 10, 10, 10, 12, 12, 12, 12, 12, 12};
    struct cmp_cp cp[4];
    size_t n = 0;
    cr_assert_eq(cmp_changepoints(x, 12, NULL, cp, 4, &n), 0);
    cr_assert_eq(n, 1);
    cr_expect_eq(cp[0].index, 6);
    cr_expect_eq(cp[0].last_good, 5);
    cr_expect_eq(cp[0].before_n, 6);
    cr_expect_eq(cp[0].after_n, 6);
    cr_expect_float_eq(cp[0].before_mean, 10, 1e-12);
    cr_expect_float_eq(cp[0].after_mean, 12, 1e-12);
    cr_expect_float_eq(cp[0].magnitude, 0.2, 1e-12);
    cr_expect_eq(cp[0].p_value, 0);
    cr_expect_eq(cp[0].label, CMP_CP_REGRESSION);
    /* The same step read as a throughput: an improvement. */
    struct cmp_cp_options o;
    cmp_cp_options_init(&o);
    o.higher_is_better = true;
    cr_assert_eq(cmp_changepoints(x, 12, &o, cp, 4, &n), 0);
    cr_expect_eq(cp[0].label, CMP_CP_IMPROVEMENT);
}

Test(changepoint, interval_and_label_of_a_noisy_step)
{
    double x[LEN];
    struct cmp_cp cp[8];
    size_t n = 0;
    series(42, 0.02, 0.10, 0, x);
    cr_assert_eq(cmp_changepoints(x, LEN, NULL, cp, 8, &n), 0);
    cr_assert_eq(n, 1);
    cr_expect_lt(cp[0].mag_lo, cp[0].magnitude);
    cr_expect_gt(cp[0].mag_hi, cp[0].magnitude);
    cr_expect(cp[0].mag_lo > 0.05 && cp[0].mag_hi < 0.15, "[%g, %g]", cp[0].mag_lo, cp[0].mag_hi);
    cr_expect_leq(cp[0].p_value, 0.001);
    cr_expect(cp[0].before_sd > 1 && cp[0].before_sd < 3, "sd %g", cp[0].before_sd);
}

Test(changepoint, a_fresh_step_is_suspicious)
{
    /* Three points at the new level: found, but not yet confirmed. */
    double x[23];
    for (int i = 0; i < 23; i++)
        x[i] = i < 20 ? 100 + (i % 3) : 150 + (i % 2);
    struct cmp_cp cp[4];
    size_t n = 0;
    cr_assert_eq(cmp_changepoints(x, 23, NULL, cp, 4, &n), 0);
    cr_assert_eq(n, 1);
    cr_expect_eq(cp[0].index, 20);
    cr_expect_eq(cp[0].label, CMP_CP_SUSPICIOUS);
}

Test(changepoint, deterministic_and_several_steps)
{
    double x[200];
    uint64_t s = 9;
    for (int i = 0; i < 200; i++)
        x[i] = (i < 70 ? 100 : i < 140 ? 120 : 90) * (1 + 0.01 * normal(&s));
    struct cmp_cp a[8], b[8];
    size_t na = 0, nb = 0;
    cr_assert_eq(cmp_changepoints(x, 200, NULL, a, 8, &na), 0);
    cr_assert_eq(cmp_changepoints(x, 200, NULL, b, 8, &nb), 0);
    cr_assert_eq(na, 2);
    cr_assert_eq(nb, 2);
    cr_expect_eq(a[0].index, 70);
    cr_expect_eq(a[1].index, 140);
    cr_expect_eq(a[1].label, CMP_CP_IMPROVEMENT);
    for (size_t i = 0; i < na; i++)
        cr_expect_eq(a[i].p_value, b[i].p_value);
}

Test(changepoint, limits_refuse_out_loud)
{
    double x[40];
    for (int i = 0; i < 40; i++)
        x[i] = i / 10 * 100.0; /* four levels: three change points */
    struct cmp_cp cp[4];
    size_t n = 0;
    cr_expect_eq(cmp_changepoints(x, 40, NULL, cp, 2, &n), -E2BIG);
    cr_expect_eq(n, 2);
    cr_expect_eq(cmp_changepoints(x, 40, NULL, cp, 4, &n), 0);
    cr_expect_eq(n, 3);
    cr_expect_eq(cmp_changepoints(x, CMP_CP_MAX_POINTS + 1, NULL, cp, 4, &n), -E2BIG);
    x[3] = NAN;
    cr_expect_eq(cmp_changepoints(x, 40, NULL, cp, 4, &n), -EINVAL);
    struct cmp_cp_options o;
    cmp_cp_options_init(&o);
    o.window = CMP_CP_MAX_WINDOW + 1;
    cr_expect_eq(cmp_changepoints(x, 40, &o, cp, 4, &n), -EINVAL);
    /* Too short to say anything. */
    x[3] = 0;
    cr_expect_eq(cmp_cp_series_label(5, NULL), CMP_CP_INSUFFICIENT_DATA);
    cr_expect_eq(cmp_cp_series_label(6, NULL), CMP_CP_SUSPICIOUS);
    cr_expect_eq(cmp_changepoints(x, 5, NULL, cp, 4, &n), 0);
    cr_expect_eq(n, 0);
}

Test(changepoint, welch_and_observation)
{
    /* t = 2 / sqrt(5/6) = 2.1909 with 6 degrees of freedom: the two-sided tail,
     * integrated numerically, is 0.070988. */
    double a[] = {1, 2, 3, 4}, b[] = {3, 4, 5, 6};
    cr_expect_float_eq(cmp_ttest_p(a, 4, b, 4), 0.070988, 1e-5);
    cr_expect_eq(cmp_ttest_p(a, 1, b, 4), 1);
    int64_t s[] = {5, 1, 9, 3};
    double m = 0;
    cr_expect_eq(cmp_perf_observation(s, 4, &m), 0);
    cr_expect_float_eq(m, 4, 1e-12);
    cr_expect_eq(cmp_perf_observation(s, 0, &m), -EINVAL);
}
