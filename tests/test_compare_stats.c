/*
 * tests/test_compare_stats.c - the perf statistics against published
 * worked examples (Mann-Whitney, Hodges-Lehmann, Student's t) and the
 * verdict rules, paired and unpaired.
 */
#include <errno.h>
#include <float.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <criterion/criterion.h>
#include <jansson.h>

#include "compare/cmp.h"
#include "tests/helpers/common/cmp_fixtures.h"
#include "tests/helpers/common/cmp_records.h"
#include "tests/helpers/common/json_want.h"
#include "tests/helpers/common/text_want.h"

TestSuite(perf, .init = reset_pool);

/*
 * scipy.stats.mannwhitneyu documentation example (ages at diagnosis):
 * males = [19, 22, 16, 29, 24], females = [20, 11, 17, 12]; U1 = 17, exact
 * two-sided p = 0.1111 (= 2 * 7/126: 7 of the C(9,4) = 126 arrangements have
 * U >= 17), asymptotic p = 0.11134688653314041.
 */
Test(perf, mann_whitney_exact_scipy_example)
{
    int64_t males[5] = {19, 22, 16, 29, 24}, females[4] = {20, 11, 17, 12};
    double u, p;
    bool exact;
    cr_assert_eq(cmp_mann_whitney(males, 5, females, 4, &u, &p, &exact), 0);
    cr_assert_eq(u, 17.0);
    cr_assert(exact);
    cr_assert_float_eq(p, 14.0 / 126.0, 1e-15);
    /* symmetric: the other sample's U is 20 - 17 = 3, same p */
    cr_assert_eq(cmp_mann_whitney(females, 4, males, 5, &u, &p, &exact), 0);
    cr_assert_eq(u, 3.0);
    cr_assert_float_eq(p, 14.0 / 126.0, 1e-15);
}

/*
 * Complete separation, {10, 11, 12} vs {1, 2, 3} (ClickHouse mannWhitneyUTest
 * documentation): U = 9, exact two-sided p = 2/C(6,3) = 0.1 (their one-sided
 * normal-approximation p is 0.0404).
 */
Test(perf, mann_whitney_exact_separated)
{
    int64_t x[3] = {10, 11, 12}, y[3] = {1, 2, 3};
    double u, p;
    bool exact;
    cr_assert_eq(cmp_mann_whitney(x, 3, y, 3, &u, &p, &exact), 0);
    cr_assert_eq(u, 9.0);
    cr_assert_float_eq(p, 0.1, 1e-15);
}

/*
 * NAG Library g08amc example program (nag_mann_whitney), data with ties:
 * group 1 (n=16), group 2 (n=23). Published results: U = 86.0, normal
 * statistic -2.8039, approximate (one-tailed, continuity- and tie-corrected)
 * tail probability 0.0025. Two-sided: 2 * Phi(-2.803900661575858) =
 * 0.005048845813774749 (computed by hand from the tie-corrected variance
 * 16*23/12 * (40 - 1932/1560), U' = max(86, 282) = 282).
 */
Test(perf, mann_whitney_normal_ties_nag_example)
{
    int64_t g1[16] = {13, 6, 12, 7, 12, 7, 10, 7, 10, 7, 16, 7, 10, 8, 9, 8};
    int64_t g2[23] = {17, 6,  10, 8,  15, 8,  15, 10, 15, 10, 14, 10,
                      14, 11, 14, 11, 13, 12, 13, 12, 13, 12, 12};
    double u, p;
    bool exact;
    cr_assert_eq(cmp_mann_whitney(g1, 16, g2, 23, &u, &p, &exact), 0);
    cr_assert_eq(u, 86.0);
    cr_assert_not(exact, "ties and n > 20 use the normal approximation");
    cr_assert_float_eq(p, 0.005048845813774749, 1e-12);
    cr_assert(fabs(p / 2 - 0.0025) < 0.00005, "NAG's one-tailed 0.0025");
}

Test(perf, mann_whitney_all_tied)
{
    int64_t x[6] = {5, 5, 5, 5, 5, 5}, y[6] = {5, 5, 5, 5, 5, 5};
    double u, p;
    bool exact;
    cr_assert_eq(cmp_mann_whitney(x, 6, y, 6, &u, &p, &exact), 0);
    cr_assert_eq(u, 18.0);
    cr_assert_eq(p, 1.0);
    cr_assert_eq(cmp_mann_whitney(x, 0, y, 6, &u, &p, &exact), -EINVAL);
}

/*
 * Hodges-Lehmann by hand: x = [10, 20, 35], y = [5, 12]; the differences are
 * 5, -2, 15, 8, 30, 23 -> sorted -2 5 8 15 23 30 -> median (8 + 15)/2 = 11.5.
 * Odd count: x = [1, 4, 9], y = [2]: -1, 2, 7 -> 2.
 */
Test(perf, hodges_lehmann_by_hand)
{
    int64_t x[3] = {10, 20, 35}, y[2] = {5, 12};
    double s;
    cr_assert_eq(cmp_hodges_lehmann(x, 3, y, 2, &s), 0);
    cr_assert_eq(s, 11.5);
    int64_t x2[3] = {1, 4, 9}, y2[1] = {2};
    cr_assert_eq(cmp_hodges_lehmann(x2, 3, y2, 1, &s), 0);
    cr_assert_eq(s, 2.0);
}

static int i64cmp(const void *a, const void *b)
{
    int64_t x = *(const int64_t *)a, y = *(const int64_t *)b;
    return (x > y) - (x < y);
}

Test(perf, hodges_lehmann_matches_brute_force)
{
    enum { NX = 301, NY = 250 };
    int64_t x[NX], y[NY];
    int64_t *d = malloc(sizeof(int64_t) * NX * NY);
    uint64_t r = 12345;
    for (int i = 0; i < NX; i++) {
        r = r * 6364136223846793005ull + 1442695040888963407ull;
        x[i] = 1000000 + (int64_t)(r >> 44);
    }
    for (int j = 0; j < NY; j++) {
        r = r * 6364136223846793005ull + 1442695040888963407ull;
        y[j] = 900000 + (int64_t)(r >> 45);
    }
    size_t k = 0;
    for (int i = 0; i < NX; i++)
        for (int j = 0; j < NY; j++)
            d[k++] = x[i] - y[j];
    qsort(d, k, sizeof(int64_t), i64cmp);
    double expect = ((double)d[k / 2 - 1] + (double)d[k / 2]) / 2; /* k is even */
    double s;
    cr_assert_eq(cmp_hodges_lehmann(x, NX, y, NY, &s), 0);
    cr_assert_eq(s, expect);
    free(d);
}

static struct cmp_perf perf_of(const double *c, size_t nc, const double *h, size_t nh,
                               enum cmp_perf_design d)
{
    struct cmp_perf p;
    cr_assert_eq(cmp_perf_compare(c, nc, h, nh, d, NULL, &p), 0);
    return p;
}

Test(perf, unpaired_verdicts)
{
    double c[8], h[8];
    fake_observations(c, 8, 1e6, 0.01, 1);

    fake_observations(h, 8, 1.2e6, 0.01, 2);
    struct cmp_perf p = perf_of(c, 8, h, 8, CMP_PERF_UNPAIRED);
    cr_assert_eq(p.verdict, CMP_PERF_REGRESSION);
    cr_assert_eq(p.design, CMP_PERF_UNPAIRED);
    cr_assert(p.p_exact);
    cr_assert_float_eq(p.p_value, 2.0 / 12870.0, 1e-12, "complete separation: 2/C(16,8)");
    cr_assert(p.ratio > 1.18 && p.ratio < 1.22, "ratio %g", p.ratio);
    cr_assert(p.ci_lo > 1.05 && p.ci_lo <= p.ratio && p.ratio <= p.ci_hi);
    cr_assert(p.spread < 0.02, "spread %g", p.spread);
    cr_assert(p.mde > 0 && p.mde < 0.05, "1%% noise, 8 a side: mde %g", p.mde);

    fake_observations(h, 8, 0.8e6, 0.01, 3);
    cr_assert_eq(perf_of(c, 8, h, 8, CMP_PERF_UNPAIRED).verdict, CMP_PERF_IMPROVEMENT);

    /* the same distribution: the interval lies within +-5% */
    fake_observations(h, 8, 1e6, 0.01, 4);
    p = perf_of(c, 8, h, 8, CMP_PERF_UNPAIRED);
    cr_assert_eq(p.verdict, CMP_PERF_SAME, "ci %g-%g", p.ci_lo, p.ci_hi);

    /* significant, past 1, but the interval reaches into +-5%: unknown */
    fake_observations(h, 8, 1.05e6, 0.01, 5);
    p = perf_of(c, 8, h, 8, CMP_PERF_UNPAIRED);
    cr_assert(p.p_value < 0.01);
    cr_assert_eq(p.verdict, CMP_PERF_UNKNOWN, "ci %g-%g", p.ci_lo, p.ci_hi);
}

Test(perf, unstable_and_insufficient)
{
    double c[8], h[8];
    /* +-20% between processes: a 5% threshold cannot be honoured, even for
     * 3x: unstable comes first and never gates (an A/A whose two sides are
     * timed under different conditions must not alarm) */
    fake_observations(c, 8, 1e6, 0.4, 6);
    fake_observations(h, 8, 3e6, 0.4, 7);
    struct cmp_perf p = perf_of(c, 8, h, 8, CMP_PERF_UNPAIRED);
    cr_assert_eq(p.verdict, CMP_PERF_UNSTABLE, "ci %g..%g p %g", p.ci_lo, p.ci_hi, p.p_value);
    cr_assert(p.spread > 0.05, "spread %g", p.spread);
    cr_assert(p.ci_lo > 1.05, "decisive but for the spread: ci %g..%g", p.ci_lo, p.ci_hi);

    /* one process a side (an old record): never a regression, however large */
    fake_observations(h, 1, 3e6, 0, 8);
    p = perf_of(c, 1, h, 1, CMP_PERF_UNPAIRED);
    cr_assert_eq(p.verdict, CMP_PERF_INSUFFICIENT_DATA);
    cr_assert_eq(p.min_n, 5, "2/C(10,5) < 0.01 is the first balanced size that can reach alpha");
    cr_assert(isnan(p.mde));
    cr_assert(p.ratio > 2.5);
    /* four a side cannot reach 0.01 (2/C(8,4) = 0.029), five can */
    fake_observations(c, 5, 1e6, 0.001, 9);
    fake_observations(h, 5, 3e6, 0.001, 10);
    cr_assert_eq(perf_of(c, 4, h, 4, CMP_PERF_UNPAIRED).verdict, CMP_PERF_INSUFFICIENT_DATA);
    cr_assert_eq(perf_of(c, 5, h, 5, CMP_PERF_UNPAIRED).verdict, CMP_PERF_REGRESSION);
    p = perf_of(c, 0, h, 0, CMP_PERF_UNPAIRED);
    cr_assert_eq(p.verdict, CMP_PERF_INSUFFICIENT_DATA);
    cr_assert(isnan(p.ratio));
    /* bad input */
    double bad[2] = {1, NAN};
    cr_assert_eq(cmp_perf_compare(c, 2, bad, 2, CMP_PERF_UNPAIRED, NULL, &p), -EINVAL);
    cr_assert_eq(cmp_perf_compare(c, 2, h, 3, CMP_PERF_PAIRED, NULL, &p), -EINVAL);
}

/* Student's t against the printed tables (two-sided 0.05 and 0.01 points)
 * and the closed forms at 1 and 2 degrees of freedom: p = 1 - 2 atan(t)/pi
 * and p = 1 - t / sqrt(2 + t^2). */
Test(perf, student_t)
{
    static const struct {
        double df, t05, t01;
    } table[] = {{1, 12.706, 63.657}, {4, 2.776, 4.604}, {9, 2.262, 3.250}, {30, 2.042, 2.750}};
    for (size_t i = 0; i < sizeof table / sizeof table[0]; i++) {
        cr_assert_float_eq(cmp_t_quantile(0.05, table[i].df), table[i].t05, 1e-3, "df %g",
                           table[i].df);
        cr_assert_float_eq(cmp_t_quantile(0.01, table[i].df), table[i].t01, 1e-3, "df %g",
                           table[i].df);
        cr_assert_float_eq(cmp_t_p(table[i].t01, table[i].df), 0.01, 1e-5, "df %g", table[i].df);
    }
    for (double t = 0; t < 50; t += 0.7) {
        cr_assert_float_eq(cmp_t_p(t, 1), 1 - 2 * atan(t) / M_PI, 1e-12, "t %g", t);
        cr_assert_float_eq(cmp_t_p(-t, 2), 1 - t / sqrt(2 + t * t), 1e-12, "t %g", t);
        cr_assert_float_eq(cmp_t_p(cmp_t_quantile(cmp_t_p(t + 0.1, 7), 7), 7), cmp_t_p(t + 0.1, 7),
                           1e-9, "the quantile inverts p at t %g", t);
    }
    cr_assert_eq(cmp_t_p(INFINITY, 3), 0.0);
    cr_assert(isnan(cmp_t_p(1, 0)) && isnan(cmp_t_p(NAN, 3)));
    cr_assert(isnan(cmp_t_quantile(0, 3)) && isnan(cmp_t_quantile(1, 3)) &&
              isnan(cmp_t_quantile(0.5, -1)));
}

Test(perf, paired_verdicts)
{
    double c[12], h[12], drift[12];
    /* the machine drifts by +-15% between pairs; both members of a pair see it */
    fake_observations(drift, 12, 1.0, 0.3, 11);
    fake_observations(c, 12, 1e6, 0.01, 12);
    fake_observations(h, 12, 1.1e6, 0.01, 13);
    for (int i = 0; i < 12; i++) {
        c[i] *= drift[i];
        h[i] *= drift[i];
    }
    struct cmp_perf p = perf_of(c, 12, h, 12, CMP_PERF_PAIRED);
    cr_assert_eq(p.design, CMP_PERF_PAIRED);
    cr_assert_eq(p.verdict, CMP_PERF_REGRESSION, "ci %g-%g p %g spread %g", p.ci_lo, p.ci_hi,
                 p.p_value, p.spread);
    cr_assert(p.p_value < 1e-6, "every pair about 10%% slower: p %g", p.p_value);
    cr_assert(p.ci_lo > 1.05 && p.ci_hi < 1.15, "ci %g-%g", p.ci_lo, p.ci_hi);
    cr_assert(p.ratio > 1.08 && p.ratio < 1.12, "ratio %g", p.ratio);
    cr_assert(p.mde < 0.05, "mde %g", p.mde);
    /* the same drift unpaired is hopeless */
    cr_assert_eq(perf_of(c, 12, h, 12, CMP_PERF_UNPAIRED).verdict, CMP_PERF_UNSTABLE);

    fake_observations(h, 12, 1e6, 0.01, 14);
    for (int i = 0; i < 12; i++)
        h[i] *= drift[i];
    cr_assert_eq(perf_of(c, 12, h, 12, CMP_PERF_PAIRED).verdict, CMP_PERF_SAME);
    /* one pair cannot be tested; the t test decides from two, and five
     * pairs (one round at the default timing_pairs) settle a 50% change */
    fake_observations(h, 12, 1.5e6, 0.01, 15);
    for (int i = 0; i < 12; i++)
        h[i] *= drift[i];
    p = perf_of(c, 1, h, 1, CMP_PERF_PAIRED);
    cr_assert_eq(p.verdict, CMP_PERF_INSUFFICIENT_DATA);
    cr_assert_eq(p.min_n, 2);
    cr_assert_eq(perf_of(c, 5, h, 5, CMP_PERF_PAIRED).verdict, CMP_PERF_REGRESSION);
    /* pairs that all agree exactly: no noise, p 0 and a point interval */
    for (int i = 0; i < 5; i++)
        h[i] = 2 * c[i];
    p = perf_of(c, 5, h, 5, CMP_PERF_PAIRED);
    cr_assert_eq(p.verdict, CMP_PERF_REGRESSION);
    cr_assert_eq(p.p_value, 0.0);
    cr_assert_float_eq(p.ci_lo, 2.0, 1e-12);
    cr_assert_float_eq(p.ci_hi, 2.0, 1e-12);
}

/* Paired, a change whose interval lies wholly past the threshold is decided
 * before the spread rule: five pairs about 25% slower whose log ratios
 * spread 6% (1.4826 MAD, the benchmark's transformer cell) are a
 * regression; the same spread around no change is unstable; unpaired, the
 * same spread comes first. */
Test(perf, paired_decisive_change_before_spread)
{
    static const double lr[5] = {0.270, 0.309, 0.269, 0.210, 0.190};
    double c[5], h[5];
    for (int i = 0; i < 5; i++) {
        c[i] = 1e6;
        h[i] = 1e6 * exp(lr[i]);
    }
    struct cmp_perf p = perf_of(c, 5, h, 5, CMP_PERF_PAIRED);
    cr_assert(p.spread > 0.05, "spread %g", p.spread);
    cr_assert(p.ci_lo > 1.05 && p.p_value < 0.01, "ci %g..%g p %g", p.ci_lo, p.ci_hi, p.p_value);
    cr_assert_eq(p.verdict, CMP_PERF_REGRESSION);
    /* Centred, the same spread: the 90% interval lies within 1 +- 0.05, so
     * the pairs say `same` whatever the spread (the equivalence test) */
    for (int i = 0; i < 5; i++)
        h[i] = 1e6 * exp(lr[i] - 0.25);
    p = perf_of(c, 5, h, 5, CMP_PERF_PAIRED);
    cr_assert(p.spread > 0.05, "spread %g", p.spread);
    cr_assert(p.eq_lo >= 0.95 && p.eq_hi <= 1.05, "ci90 %g..%g", p.eq_lo, p.eq_hi);
    cr_assert(p.ci_lo < 0.95, "the 99%% interval alone would not: %g", p.ci_lo);
    cr_assert_eq(p.verdict, CMP_PERF_SAME, "ci90 %g..%g", p.eq_lo, p.eq_hi);
    /* twice that spread: neither interval decides, and the spread says why */
    for (int i = 0; i < 5; i++)
        h[i] = 1e6 * exp(2 * (lr[i] - 0.25));
    p = perf_of(c, 5, h, 5, CMP_PERF_PAIRED);
    cr_assert(p.eq_hi > 1.05, "ci90 %g..%g", p.eq_lo, p.eq_hi);
    cr_assert_eq(p.verdict, CMP_PERF_UNSTABLE, "ci %g..%g", p.ci_lo, p.ci_hi);
    /* improvements the same way */
    for (int i = 0; i < 5; i++)
        h[i] = 1e6 * exp(-lr[i]);
    cr_assert_eq(perf_of(c, 5, h, 5, CMP_PERF_PAIRED).verdict, CMP_PERF_IMPROVEMENT);
}

/* The paired t interval by hand: log ratios {0.1, 0.2, 0.3} have mean 0.2
 * and standard error 0.1/sqrt(3); the 99% point of t at 2 degrees of
 * freedom is 9.925 (tables), so the interval is exp(0.2 +- 0.573). */
Test(perf, paired_t_interval)
{
    double c[3] = {1e6, 1e6, 1e6}, h[3];
    for (int i = 0; i < 3; i++)
        h[i] = c[i] * exp(0.1 * (i + 1));
    struct cmp_perf p = perf_of(c, 3, h, 3, CMP_PERF_PAIRED);
    double half = 9.925 * 0.1 / sqrt(3.0);
    cr_assert_float_eq(p.ratio, exp(0.2), 1e-12);
    cr_assert_float_eq(p.u, 0.2 / (0.1 / sqrt(3.0)), 1e-9, "t %g", p.u);
    cr_assert_float_eq(p.ci_lo, exp(0.2 - half), 1e-3);
    cr_assert_float_eq(p.ci_hi, exp(0.2 + half), 1e-3);
    cr_assert_eq(p.verdict, CMP_PERF_UNSTABLE, "the pairs spread %g", p.spread);
}

Test(perf, bootstrap_is_deterministic)
{
    double c[10], h[10];
    struct cmp_perf p1, p2, p3;
    struct cmp_options o;
    fake_observations(c, 10, 1e6, 0.02, 7);
    fake_observations(h, 10, 1.1e6, 0.02, 8);
    cmp_options_init(&o);
    /* the paired interval is Student's: no resampling, no seed */
    cr_assert_eq(cmp_perf_compare(c, 10, h, 10, CMP_PERF_PAIRED, &o, &p1), 0);
    o.bootstrap_seed = 99;
    o.bootstrap_resamples = 0;
    cr_assert_eq(cmp_perf_compare(c, 10, h, 10, CMP_PERF_PAIRED, &o, &p2), 0);
    cr_assert(p1.ci_lo == p2.ci_lo && p1.ci_hi == p2.ci_hi && !isnan(p2.ci_lo));
    cmp_options_init(&o);
    for (int d = CMP_PERF_UNPAIRED; d <= CMP_PERF_UNPAIRED; d++) {
        cr_assert_eq(cmp_perf_compare(c, 10, h, 10, d, &o, &p1), 0);
        cr_assert_eq(cmp_perf_compare(c, 10, h, 10, d, &o, &p2), 0);
        cr_assert_eq(p1.ci_lo, p2.ci_lo);
        cr_assert_eq(p1.ci_hi, p2.ci_hi);
        o.bootstrap_seed = 99;
        cr_assert_eq(cmp_perf_compare(c, 10, h, 10, d, &o, &p3), 0);
        cr_assert(p3.ci_lo != p1.ci_lo || p3.ci_hi != p1.ci_hi, "the seed matters");
        o.bootstrap_resamples = 0;
        cr_assert_eq(cmp_perf_compare(c, 10, h, 10, d, &o, &p3), 0);
        cr_assert(isnan(p3.ci_lo));
        cr_assert_eq(p3.verdict, CMP_PERF_UNKNOWN, "no interval, no verdict either way");
        cmp_options_init(&o);
    }
}

/* `same` is an equivalence test at CMP_EQUIV_ALPHA (two one-sided tests):
 * its 90% interval inside 1 +- threshold, where the 99% interval of the
 * alarms would reach past it; both intervals are reported. */
Test(perf, same_is_an_equivalence_test)
{
    double c[8] = {1.00e6, 1.03e6, 0.97e6, 1.02e6, 0.98e6, 1.00e6, 1.01e6, 0.99e6};
    double h[8] = {1.04e6, 1.00e6, 1.03e6, 0.99e6, 1.05e6, 1.01e6, 0.98e6, 1.02e6};
    struct cmp_perf p = perf_of(c, 8, h, 8, CMP_PERF_UNPAIRED);
    cr_assert(p.ci_lo <= p.eq_lo && p.eq_hi <= p.ci_hi, "ci99 %g..%g ci90 %g..%g", p.ci_lo, p.ci_hi,
              p.eq_lo, p.eq_hi);
    cr_assert(p.ci_lo < 0.95 || p.ci_hi > 1.05, "the 99%% interval alone would not: %g..%g",
              p.ci_lo, p.ci_hi);
    cr_assert(p.eq_lo >= 0.95 && p.eq_hi <= 1.05, "ci90 %g..%g", p.eq_lo, p.eq_hi);
    cr_assert_eq(p.verdict, CMP_PERF_SAME);
    /* paired: the 90% t interval, exp(mean +- t(0.90, n-1) s / sqrt(n)) */
    p = perf_of(c, 8, h, 8, CMP_PERF_PAIRED);
    double lr[8], mean = 0, ss = 0;
    for (int i = 0; i < 8; i++)
        mean += (lr[i] = log(h[i] / c[i])) / 8;
    for (int i = 0; i < 8; i++)
        ss += (lr[i] - mean) * (lr[i] - mean);
    double half = 1.894579 * sqrt(ss / 7 / 8); /* t tables: 0.95 point, 7 df */
    cr_assert_float_eq(p.eq_lo, exp(mean - half), 1e-4);
    cr_assert_float_eq(p.eq_hi, exp(mean + half), 1e-4);
    cr_assert(p.ci_hi > 1.05, "ci99 %g..%g", p.ci_lo, p.ci_hi);              /* 0.965..1.068 */
    cr_assert_eq(p.verdict, CMP_PERF_SAME, "ci90 %g..%g", p.eq_lo, p.eq_hi); /* 0.987..1.043 */
}
