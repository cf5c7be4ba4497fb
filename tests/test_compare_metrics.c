/*
 * tests/test_compare_metrics.c - the comparison engine's element metrics
 * against values worked out by hand in the comments (float16, bfloat16,
 * integers, the sample and stats bases, the p99 selection against numpy's
 * definition).
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

TestSuite(metrics, .init = reset_pool);

/* A 1-D record of raw bits of any dtype (stats left empty: payload basis only). */
static struct cmp_tensor raw_tensor(const char *dtype, const void *p, size_t n, size_t isz,
                                    const char *hash)
{
    struct cmp_tensor t = {0};
    t.key = "m.0.forward.output.0";
    t.dtype = dtype;
    t.ndim = 1;
    t.shape[0] = (int64_t)n;
    t.numel = (int64_t)n;
    t.hash = hash;
    t.capture = CMP_CAPTURE_FULL;
    t.payload = pool_keep(p, n * isz);
    t.payload_len = n * isz;
    return t;
}

/* numpy.percentile(v, q) ("linear"), by sorting: the reference for the selection. */
static int dcmp(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

static double ref_percentile(double *v, size_t n, double q)
{
    qsort(v, n, sizeof(double), dcmp);
    double h = q * (double)(n - 1);
    size_t k = (size_t)h;
    double t = h - (double)k;
    if (k + 1 >= n)
        return v[k];
    double diff = v[k + 1] - v[k];
    return t >= 0.5 ? v[k + 1] - diff * (1 - t) : v[k] + diff * t;
}

Test(metrics, identical_hash_computes_nothing)
{
    double v[3] = {1, 2, 3}, w[3] = {9, 9, 9};
    struct cmp_tensor c = f64_tensor("a.0.forward.output.0", 0, v, 3, "abc");
    /* same hash, dtype and shape: identical even though the payload differs */
    struct cmp_tensor h = f64_tensor("a.0.forward.output.0", 0, w, 3, "abc");
    struct cmp_metrics m = tensor_metrics(&h, &c, NULL);
    cr_assert_eq(m.basis, CMP_BASIS_EXACT);
    cr_assert(m.within_tol);
    cr_assert(isnan(m.max_abs), "nothing else is computed");
}

/* Hashes of two algorithms say nothing about each other: equal ones are not
 * "identical" and unequal ones not "diverged"; the payloads decide. */
Test(metrics, mixed_hash_alg_is_judged_on_payloads)
{
    double v[3] = {1, 2, 3}, w[3] = {9, 9, 9};
    struct cmp_tensor c = f64_tensor("a.0.forward.output.0", 0, v, 3, "abc");
    struct cmp_tensor h = f64_tensor("a.0.forward.output.0", 0, w, 3, "abc");
    h.hash_alg = "xxh3-128";
    struct cmp_metrics m = tensor_metrics(&h, &c, NULL);
    cr_assert_neq(m.basis, CMP_BASIS_EXACT, "equal hashes of two algorithms are not identity");
    cr_assert_eq(m.basis, CMP_BASIS_FULL);
    cr_assert(m.hash_alg_mixed);
    cr_assert_not(m.within_tol, "the payloads differ");
    cr_assert_eq(m.max_abs, 8.0);

    /* Unequal hashes, equal bytes: within tolerance on the payloads. */
    struct cmp_tensor h2 = f64_tensor("a.0.forward.output.0", 0, v, 3, "def");
    h2.hash_alg = "xxh3-128";
    m = tensor_metrics(&h2, &c, NULL);
    cr_assert_eq(m.basis, CMP_BASIS_FULL);
    cr_assert(m.hash_alg_mixed);
    cr_assert(m.within_tol);
    cr_assert_eq(m.max_abs, 0.0);

    /* Unnamed is the default algorithm: equal hashes stay identical. */
    struct cmp_tensor h3 = f64_tensor("a.0.forward.output.0", 0, w, 3, "abc");
    h3.hash_alg = CMP_HASH_ALG_DEFAULT;
    m = tensor_metrics(&h3, &c, NULL);
    cr_assert_eq(m.basis, CMP_BASIS_EXACT);
    cr_assert_not(m.hash_alg_mixed);
    /* Both named alike, equal hashes: identical too. */
    c.hash_alg = "xxh3-128";
    m = tensor_metrics(&h, &c, NULL);
    cr_assert_eq(m.basis, CMP_BASIS_EXACT);
    cr_assert_not(m.hash_alg_mixed);
}

/*
 * b = [1, 2, 0, -4], a = [1, 2.5, 0, -4.25], all exact in binary:
 *   d = [0, .5, 0, -.25]; |d| = [0, .5, 0, .25]
 *   max_abs .5, mean_abs .75/4 = .1875
 *   p99: sorted [0, 0, .25, .5], h = .99*3 = 2.97 -> .5 - .25*.03 = .4925
 *   rel = [0, .25, 0 (0/eps), .0625]: max .25, mean .3125/4 = .078125
 *   fp64 allclose (1e-7, 1e-7): 2 violations
 *   a.b = 1 + 5 + 0 + 17 = 23, |a|^2 = 25.3125, |b|^2 = 21
 *   cosine 23/sqrt(25.3125*21); SQNR 10*log10(21/.3125) = 18.273692730538253 dB
 *   nl2 sqrt(.3125/21) = 0.12198750911856666
 */
Test(metrics, hand_computed_float64)
{
    double b[4] = {1, 2, 0, -4}, a[4] = {1, 2.5, 0, -4.25};
    struct cmp_tensor c = f64_tensor("m.0.forward.output.0", 0, b, 4, "c");
    struct cmp_tensor h = f64_tensor("m.0.forward.output.0", 0, a, 4, "h");
    struct cmp_metrics m = tensor_metrics(&h, &c, NULL);
    cr_assert_eq(m.basis, CMP_BASIS_FULL);
    cr_assert_eq(m.n, 4);
    cr_assert_eq(m.n_finite, 4);
    cr_assert_float_eq(m.max_abs, 0.5, 1e-15);
    cr_assert_float_eq(m.mean_abs, 0.1875, 1e-15);
    cr_assert_float_eq(m.p99_abs, 0.4925, 1e-15);
    cr_assert_float_eq(m.max_rel, 0.25, 1e-15);
    cr_assert_float_eq(m.mean_rel, 0.078125, 1e-15);
    cr_assert_eq(m.allclose_violations, 2);
    cr_assert_float_eq(m.cosine, 23.0 / sqrt(25.3125 * 21.0), 1e-15);
    cr_assert_float_eq(m.sqnr_db, 18.273692730538253, 1e-12);
    cr_assert_float_eq(m.nl2, 0.12198750911856666, 1e-15);
    cr_assert_eq(m.nan_one_sided, 0);
    cr_assert_eq(m.inf_one_sided, 0);
    cr_assert_not(m.within_tol);
    cr_assert_float_eq(m.atol, 1e-7, 0);
    /* statistic deltas: max 2.5-2, min -4.25-(-4), mean -.25/4... */
    cr_assert_float_eq(m.d_max, 0.5, 1e-15);
    cr_assert_float_eq(m.d_min, -0.25, 1e-15);
    cr_assert_float_eq(m.d_mean, 0.0625, 1e-15);
    cr_assert_float_eq(m.d_l2, sqrt(25.3125) - sqrt(21.0), 1e-14);
}

Test(metrics, tolerance_boundary)
{
    /* fp32 default: |d| > 1e-5 + 1.3e-6*|b|; b = 1 gives a bound of 1.13e-5 */
    float b[2] = {1.0f, 0.0f}, a[2] = {1.0f + 1.0e-5f, 2e-5f};
    struct cmp_tensor c = raw_tensor("float32", b, 2, 4, "c");
    struct cmp_tensor h = raw_tensor("float32", a, 2, 4, "h");
    struct cmp_metrics m = tensor_metrics(&h, &c, NULL);
    cr_assert_eq(m.allclose_violations, 1, "only the 2e-5 against 0 fails");
    cr_assert_float_eq(m.rtol, 1.3e-6, 0);
    /* the relative error against 0 uses the 2.22e-16 floor */
    cr_assert_float_eq(m.max_rel, (double)2e-5f / 2.220446049250313e-16, 1e-3);
}

Test(metrics, zeros_and_signed_zero)
{
    double b[3] = {0, 0, 0}, a[3] = {-0.0, 0, 0};
    struct cmp_tensor c = f64_tensor("z.0.forward.output.0", 0, b, 3, "c");
    struct cmp_tensor h = f64_tensor("z.0.forward.output.0", 0, a, 3, "h");
    struct cmp_metrics m = tensor_metrics(&h, &c, NULL);
    cr_assert(m.within_tol, "-0 vs 0 differs in bits only");
    cr_assert_eq(m.max_abs, 0.0);
    cr_assert_eq(m.cosine, 1.0, "two zero vectors are parallel by convention");
    cr_assert(isinf(m.sqnr_db) && m.sqnr_db > 0);
    cr_assert_eq(m.nl2, 0.0);

    /* error against an all-zero control: SQNR -inf, nl2 +inf, cosine 0 */
    double a2[3] = {1, 0, 0};
    h = f64_tensor("z.0.forward.output.0", 0, a2, 3, "h2");
    m = tensor_metrics(&h, &c, NULL);
    cr_assert(isinf(m.sqnr_db) && m.sqnr_db < 0);
    cr_assert(isinf(m.nl2));
    cr_assert_eq(m.cosine, 0.0);
}

Test(metrics, nan_and_inf_classification)
{
    /*
     * position: 0 both NaN (agree), 1 both +inf (agree), 2 NaN in head only,
     * 3 opposite infinities, 4 NaN in control only, 5 finite both.
     */
    double b[6] = {NAN, INFINITY, 1, -INFINITY, NAN, 3};
    double a[6] = {NAN, INFINITY, NAN, INFINITY, 2, 3.5};
    struct cmp_tensor c = f64_tensor("n.0.forward.output.0", 0, b, 6, "c");
    struct cmp_tensor h = f64_tensor("n.0.forward.output.0", 0, a, 6, "h");
    struct cmp_metrics m = tensor_metrics(&h, &c, NULL);
    cr_assert_eq(m.nan_both, 1);
    cr_assert_eq(m.inf_both, 1);
    cr_assert_eq(m.nan_one_sided, 2);
    cr_assert_eq(m.inf_one_sided, 1);
    cr_assert_eq(m.n_finite, 1);
    cr_assert_float_eq(m.max_abs, 0.5, 1e-15);
    cr_assert_not(m.within_tol, "one-sided NaN/Inf is always an error");

    /* one-sided Inf with no tolerance violation at all is still not within */
    double b2[2] = {1, 2}, a2[2] = {1, INFINITY};
    c = f64_tensor("n.0.forward.output.0", 0, b2, 2, "c2");
    h = f64_tensor("n.0.forward.output.0", 0, a2, 2, "h2");
    m = tensor_metrics(&h, &c, NULL);
    cr_assert_eq(m.allclose_violations, 0);
    cr_assert_eq(m.inf_one_sided, 1);
    cr_assert_not(m.within_tol);
}

/* Decodes one value of a 2-byte dtype through the metrics: |x - 0|. */
static double decode16(const char *dtype, uint16_t bits, struct cmp_metrics *m)
{
    uint16_t zero = 0;
    struct cmp_tensor c = raw_tensor(dtype, &zero, 1, 2, "c");
    struct cmp_tensor h = raw_tensor(dtype, &bits, 1, 2, "h");
    *m = tensor_metrics(&h, &c, NULL);
    return m->max_abs;
}

Test(metrics, float16_decoding)
{
    struct cmp_metrics m;
    cr_assert_eq(decode16("float16", 0x3c00, &m), 1.0);
    cr_assert_eq(decode16("float16", 0xc000, &m), 2.0, "-2");
    cr_assert_eq(decode16("float16", 0x3555, &m), 0x1.554p-2, "0.333251953125");
    cr_assert_eq(decode16("float16", 0x7bff, &m), 65504.0, "largest normal");
    cr_assert_eq(decode16("float16", 0x0400, &m), 0x1p-14, "smallest normal");
    cr_assert_eq(decode16("float16", 0x0001, &m), 0x1p-24, "smallest subnormal");
    cr_assert_eq(decode16("float16", 0x03ff, &m), 1023 * 0x1p-24, "largest subnormal");
    cr_assert_eq(decode16("float16", 0x8001, &m), 0x1p-24, "negative subnormal");
    decode16("float16", 0x7c00, &m);
    cr_assert_eq(m.inf_one_sided, 1, "+inf");
    decode16("float16", 0xfc00, &m);
    cr_assert_eq(m.inf_one_sided, 1, "-inf");
    decode16("float16", 0x7e00, &m);
    cr_assert_eq(m.nan_one_sided, 1, "quiet NaN");
    decode16("float16", 0x7c01, &m);
    cr_assert_eq(m.nan_one_sided, 1, "signalling NaN is NaN, not inf");
    cr_assert_eq(m.inf_one_sided, 0);
}

Test(metrics, bfloat16_decoding)
{
    struct cmp_metrics m;
    cr_assert_eq(decode16("bfloat16", 0x3f80, &m), 1.0);
    cr_assert_eq(decode16("bfloat16", 0xc2f7, &m), 123.5, "-123.5");
    cr_assert_eq(decode16("bfloat16", 0x7f7f, &m), 0x1.fep127, "largest finite");
    cr_assert_eq(decode16("bfloat16", 0x0001, &m), 0x1p-133, "smallest subnormal");
    decode16("bfloat16", 0x7f80, &m);
    cr_assert_eq(m.inf_one_sided, 1);
    decode16("bfloat16", 0xffc0, &m);
    cr_assert_eq(m.nan_one_sided, 1);
}

Test(metrics, half_precision_tolerances)
{
    /* fp16 1.0 vs one ulp (2^-10) up: 9.77e-4 <= 1e-5 + 1e-3 -> close; two ulps -> not */
    uint16_t one = 0x3c00, ulp1 = 0x3c01, ulp2 = 0x3c02;
    struct cmp_tensor c = raw_tensor("float16", &one, 1, 2, "c");
    struct cmp_tensor h = raw_tensor("float16", &ulp1, 1, 2, "h");
    cr_assert(tensor_metrics(&h, &c, NULL).within_tol);
    h = raw_tensor("float16", &ulp2, 1, 2, "h2");
    cr_assert_not(tensor_metrics(&h, &c, NULL).within_tol);

    /* bf16 1.0 vs 1.0078125 (one ulp, 2^-7): 7.8e-3 <= 1e-5 + 1.6e-2 -> close */
    uint16_t b1 = 0x3f80, b2 = 0x3f81, b3 = 0x3f83;
    c = raw_tensor("bfloat16", &b1, 1, 2, "c");
    h = raw_tensor("bfloat16", &b2, 1, 2, "h");
    cr_assert(tensor_metrics(&h, &c, NULL).within_tol);
    h = raw_tensor("bfloat16", &b3, 1, 2, "h3"); /* 3 ulps = 0.0234 > 0.016 */
    cr_assert_not(tensor_metrics(&h, &c, NULL).within_tol);
}

Test(metrics, integers_and_bool_are_exact)
{
    int32_t c32[3] = {1, 2, 3}, h32[3] = {1, 2, 4};
    struct cmp_tensor c = raw_tensor("int32", c32, 3, 4, "c");
    struct cmp_tensor h = raw_tensor("int32", h32, 3, 4, "h");
    struct cmp_metrics m = tensor_metrics(&h, &c, NULL);
    cr_assert_eq(m.allclose_violations, 1);
    cr_assert_eq(m.max_abs, 1.0);
    cr_assert_not(m.within_tol);

    /* 2^60 and 2^60+1 are the same double; the raw values still differ */
    int64_t c64[2] = {INT64_C(1) << 60, 5}, h64[2] = {(INT64_C(1) << 60) + 1, 5};
    c = raw_tensor("int64", c64, 2, 8, "c");
    h = raw_tensor("int64", h64, 2, 8, "h");
    m = tensor_metrics(&h, &c, NULL);
    cr_assert_eq(m.allclose_violations, 1);
    cr_assert_not(m.within_tol);

    unsigned char cb[3] = {1, 0, 1}, hb[3] = {1, 1, 2};
    c = raw_tensor("bool", cb, 3, 1, "c");
    h = raw_tensor("bool", hb, 3, 1, "h");
    m = tensor_metrics(&h, &c, NULL);
    cr_assert_eq(m.allclose_violations, 1, "2 is true, like 1");

    int8_t ci[2] = {-128, 0}, hi[2] = {127, 0};
    c = raw_tensor("int8", ci, 2, 1, "c");
    h = raw_tensor("int8", hi, 2, 1, "h");
    cr_assert_eq(tensor_metrics(&h, &c, NULL).max_abs, 255.0);
    uint8_t cu[1] = {0}, hu[1] = {255};
    c = raw_tensor("uint8", cu, 1, 1, "c");
    h = raw_tensor("uint8", hu, 1, 1, "h");
    cr_assert_eq(tensor_metrics(&h, &c, NULL).max_abs, 255.0);
    int16_t cs[1] = {-32768}, hs[1] = {32767};
    c = raw_tensor("int16", cs, 1, 2, "c");
    h = raw_tensor("int16", hs, 1, 2, "h");
    cr_assert_eq(tensor_metrics(&h, &c, NULL).max_abs, 65535.0);
}

Test(metrics, sample_basis)
{
    /* both sides sampled, same count: positions agree, compare element-wise */
    double cs[4] = {0, 25, 50, 75}, hs[4] = {0, 25, 50, 76};
    struct cmp_tensor c = f64_tensor("s.0.forward.output.0", 0, cs, 4, "c");
    struct cmp_tensor h = f64_tensor("s.0.forward.output.0", 0, hs, 4, "h");
    c.capture = h.capture = CMP_CAPTURE_SAMPLE;
    c.numel = h.numel = c.shape[0] = h.shape[0] = 100;
    struct cmp_metrics m = tensor_metrics(&h, &c, NULL);
    cr_assert_eq(m.basis, CMP_BASIS_SAMPLE);
    cr_assert_eq(m.n, 4);
    cr_assert_eq(m.max_abs, 1.0);

    /* different sample counts: only statistics are shared */
    h.payload_len = 3 * sizeof(double);
    m = tensor_metrics(&h, &c, NULL);
    cr_assert_eq(m.basis, CMP_BASIS_STATS);
}

Test(metrics, full_against_sample_gathers_positions)
{
    /* numel 10, k 3: positions floor(i*10/3) = 0, 3, 6 */
    double full[10] = {0, 1, 2, 3, 4, 5, 6, 7, 8, 9};
    double samp[3] = {0, 3, 6};
    struct cmp_tensor h = f64_tensor("g.0.forward.output.0", 0, full, 10, "h");
    struct cmp_tensor c = f64_tensor("g.0.forward.output.0", 0, samp, 3, "c");
    c.capture = CMP_CAPTURE_SAMPLE;
    c.numel = c.shape[0] = 10;
    c.stats = h.stats;
    struct cmp_metrics m = tensor_metrics(&h, &c, NULL);
    cr_assert_eq(m.basis, CMP_BASIS_SAMPLE);
    cr_assert_eq(m.n, 3);
    cr_assert_eq(m.max_abs, 0.0);
    cr_assert(m.within_tol);

    double samp2[3] = {0, 3, 7};
    c.payload = pool_keep(samp2, sizeof(samp2));
    m = tensor_metrics(&h, &c, NULL);
    cr_assert_eq(m.max_abs, 1.0, "position 6 holds 6, the sample said 7");

    /* and the other way round: the control is full */
    m = tensor_metrics(&c, &h, NULL);
    cr_assert_eq(m.basis, CMP_BASIS_SAMPLE);
    cr_assert_eq(m.max_abs, 1.0);
}

Test(metrics, sample_basis_still_sees_nan_in_stats)
{
    double cs[2] = {1, 2}, hs[2] = {1, 2};
    struct cmp_tensor c = f64_tensor("s.0.forward.output.0", 0, cs, 2, "c");
    struct cmp_tensor h = f64_tensor("s.0.forward.output.0", 0, hs, 2, "h");
    c.capture = h.capture = CMP_CAPTURE_SAMPLE;
    c.numel = h.numel = c.shape[0] = h.shape[0] = 50;
    h.stats.nan = 3; /* NaN at unsampled positions */
    struct cmp_metrics m = tensor_metrics(&h, &c, NULL);
    cr_assert_eq(m.allclose_violations, 0);
    cr_assert_eq(m.nan_one_sided, 3);
    cr_assert_not(m.within_tol);
}

Test(metrics, stats_basis)
{
    double v[4] = {1, 2, 3, 4};
    struct cmp_tensor c = f64_tensor("t.0.forward.output.0", 0, v, 4, "c");
    c.capture = CMP_CAPTURE_NONE;
    struct cmp_tensor h = c;
    h.hash = "h";
    struct cmp_metrics m = tensor_metrics(&h, &c, NULL);
    cr_assert_eq(m.basis, CMP_BASIS_STATS);
    cr_assert(m.within_tol, "equal statistics cannot disprove closeness");
    cr_assert(isnan(m.max_abs));

    /* mean off by 1e-3 against a bound of 1e-7 + 1e-7*rms(b): proven divergent */
    h.stats.mean += 1e-3;
    m = tensor_metrics(&h, &c, NULL);
    cr_assert_eq(m.stat_violations, 1);
    cr_assert_float_eq(m.d_mean, 1e-3, 1e-12);
    cr_assert_not(m.within_tol);

    /* l2 bound: |d l2| <= atol*sqrt(n) + rtol*l2(b) = 2e-7 + 1e-7*sqrt(30) */
    h.stats = c.stats;
    h.stats.l2 += 1e-7;
    cr_assert(tensor_metrics(&h, &c, NULL).within_tol);
    h.stats.l2 += 1e-6;
    cr_assert_eq(tensor_metrics(&h, &c, NULL).stat_violations, 1);

    /* NaN count change */
    h.stats = c.stats;
    h.stats.nan = 1;
    m = tensor_metrics(&h, &c, NULL);
    cr_assert_eq(m.nan_one_sided, 1);
    cr_assert_not(m.within_tol);
}

Test(metrics, dtype_and_shape_mismatch)
{
    double v[6] = {1, 2, 3, 4, 5, 6};
    struct cmp_tensor c = f64_tensor("x.0.forward.output.0", 0, v, 6, "c");
    struct cmp_tensor h = c;
    h.hash = "h";
    h.dtype = "float32";
    h.payload_len = 6 * 4;
    struct cmp_metrics m = tensor_metrics(&h, &c, NULL);
    cr_assert_eq(m.mismatch, CMP_MISMATCH_DTYPE);
    cr_assert_not(m.within_tol);

    h = c;
    h.hash = "h";
    c.ndim = h.ndim = 2;
    c.shape[0] = 2, c.shape[1] = 3;
    h.shape[0] = 3, h.shape[1] = 2;
    m = tensor_metrics(&h, &c, NULL);
    cr_assert_eq(m.mismatch, CMP_MISMATCH_SHAPE);
    cr_assert_not(m.within_tol);

    /* same hash but different shape is not bit-identical */
    h.hash = "c";
    cr_assert_eq(tensor_metrics(&h, &c, NULL).mismatch, CMP_MISMATCH_SHAPE);
}

Test(metrics, explicit_tolerance)
{
    double b[1] = {1}, a[1] = {1.01};
    struct cmp_tensor c = f64_tensor("e.0.forward.output.0", 0, b, 1, "c");
    struct cmp_tensor h = f64_tensor("e.0.forward.output.0", 0, a, 1, "h");
    struct cmp_tol loose = {.atol = 0, .rtol = 0.02};
    cr_assert(tensor_metrics(&h, &c, &loose).within_tol);
    cr_assert_not(tensor_metrics(&h, &c, NULL).within_tol);
}

/* A float32 pair of n elements with |d| given per position, compared in one go. */
static struct cmp_metrics large_pair(const float *a, const float *b, size_t n)
{
    struct cmp_tensor c = {0}, h = {0};
    c.key = h.key = "big.0.forward.output.0";
    c.dtype = h.dtype = "float32";
    c.ndim = h.ndim = 1;
    c.shape[0] = h.shape[0] = c.numel = h.numel = (int64_t)n;
    c.capture = h.capture = CMP_CAPTURE_FULL;
    c.payload = b;
    h.payload = a;
    c.payload_len = h.payload_len = n * sizeof(float);
    c.hash = "c";
    h.hash = "h";
    struct cmp_scratch *s;
    cr_assert_eq(cmp_scratch_new(&s), 0);
    struct cmp_metrics m;
    cr_assert_eq(cmp_tensor_compare(&h, &c, NULL, s, &m), 0);
    cmp_scratch_free(s);
    return m;
}

static double ref_p99_f32(const float *a, const float *b, size_t n)
{
    double *ad = malloc(n * sizeof(double));
    size_t k = 0;
    for (size_t i = 0; i < n; i++)
        if (isfinite(a[i]) && isfinite(b[i]))
            ad[k++] = fabs((double)a[i] - (double)b[i]);
    double p = ref_percentile(ad, k, 0.99);
    free(ad);
    return p;
}

/*
 * Tensors above CMP_SCRATCH_MAX_ELEMS take the bracketing path. Three inputs
 * exercise its three ways to the answer: a smooth distribution (the sample
 * bracket holds), massive ties at the answer (the bracket overflows and the
 * histogram resolves it), and a period equal to the sampling stride (the
 * sample sees only zeros and misleads; the full-range retry fixes it).
 */
Test(metrics, p99_large_tensors_exact)
{
    size_t n = (size_t)CMP_SCRATCH_MAX_ELEMS * 2 + 12345;
    float *a = malloc(n * sizeof(float)), *b = malloc(n * sizeof(float));
    uint64_t x = 88172645463325252ull;
    for (size_t i = 0; i < n; i++) {
        x ^= x << 13, x ^= x >> 7, x ^= x << 17;
        b[i] = (float)((double)(x >> 11) * 0x1p-53 * 8 - 4);
        a[i] = b[i] + (float)((double)(x & 0xffff) * 1e-9);
    }
    a[17] = NAN; /* non-finite positions are left out of the percentile */
    b[99] = INFINITY;
    struct cmp_metrics m = large_pair(a, b, n);
    cr_assert_eq(m.p99_abs, ref_p99_f32(a, b, n), "smooth: %.17g", m.p99_abs);
    cr_assert_eq(m.n_finite, (int64_t)n - 2);

    for (size_t i = 0; i < n; i++) {
        b[i] = 1.0f;
        a[i] = i % 2 ? 1.0f : 2.0f; /* half the errors are exactly 1.0 */
    }
    m = large_pair(a, b, n);
    cr_assert_eq(m.p99_abs, 1.0);
    cr_assert_eq(m.p99_abs, ref_p99_f32(a, b, n));

    size_t stride = n / 16384 + 1;
    for (size_t i = 0; i < n; i++) {
        b[i] = 0.0f;
        a[i] = i % stride == 0 ? 0.0f : (float)(i % 1013) * 0.5f;
    }
    m = large_pair(a, b, n);
    cr_assert_eq(m.p99_abs, ref_p99_f32(a, b, n), "periodic: %.17g", m.p99_abs);

    /*
     * Mostly-zero errors with the non-zero ones off the sampled positions: the
     * bracket is the single value 0, and rank k0 is its last member, so the
     * answer interpolates towards the smallest error above it.
     */
    size_t k0 = (size_t)(0.99 * (double)(n - 1)), nonzero = n - (k0 + 1);
    for (size_t i = 0; i < n; i++)
        a[i] = b[i] = 0.0f;
    for (size_t i = n - 1; nonzero > 0; i--) {
        if (i % stride == 0)
            continue;
        a[i] = 3.0f + (float)(i % 7);
        nonzero--;
    }
    m = large_pair(a, b, n);
    double want = ref_p99_f32(a, b, n);
    cr_assert(want > 0, "the reference interpolates: %g", want);
    cr_assert_eq(m.p99_abs, want, "single-value band: %.17g vs %.17g", m.p99_abs, want);
    free(a);
    free(b);
}

Test(metrics, p99_small_matches_numpy_definition)
{
    /* np.percentile(np.arange(1, 101), 99) == 99.01 */
    double b[100], a[100];
    for (int i = 0; i < 100; i++) {
        b[i] = 0;
        a[i] = i + 1;
    }
    struct cmp_tensor c = f64_tensor("p.0.forward.output.0", 0, b, 100, "c");
    struct cmp_tensor h = f64_tensor("p.0.forward.output.0", 0, a, 100, "h");
    cr_assert_float_eq(tensor_metrics(&h, &c, NULL).p99_abs, 99.01, 1e-12);
}
