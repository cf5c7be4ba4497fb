/*
 * tests/test_compare.c - the comparison engine against known answers.
 *
 * Every metric is checked against values worked out by hand in the comments;
 * the rank statistics against published worked examples; the engine against
 * small synthetic record sets built for one rule each. The engine does no
 * I/O; the only files read here are the recorded runner fingerprints in
 * tests/fixtures/ (suite environment), loaded by the test that uses them.
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
#include "tests/helpers/common/cmp_records.h"
#include "tests/helpers/common/json_want.h"
#include "tests/helpers/common/text_want.h"

/* ----------------------------------------------------------------- helpers */

/*
 * Payloads are borrowed by the engine, so tests copy them into a static pool
 * that outlives every comparison of the test (Criterion runs each test in its
 * own process; the pool is reset per test for --no-fork runs).
 */
static unsigned char pool[16 << 20];
static size_t pool_used;

static void reset_pool(void)
{
    pool_used = 0;
    crec_reset();
}

TestSuite(metrics, .init = reset_pool);
TestSuite(perf, .init = reset_pool);
TestSuite(engine, .init = reset_pool);
TestSuite(options, .init = reset_pool);
TestSuite(render, .init = reset_pool);
TestSuite(derived, .init = reset_pool);
TestSuite(input, .init = reset_pool);
TestSuite(environment, .init = reset_pool);

static void *keep(const void *p, size_t n)
{
    size_t at = (pool_used + 15) & ~(size_t)15;
    cr_assert(at + n <= sizeof(pool), "test pool exhausted");
    memcpy(pool + at, p, n);
    pool_used = at + n;
    return pool + at;
}

/* Runner-style statistics of double values, so statistics checks are realistic. */
static struct cmp_stats stats_of(const double *v, size_t n)
{
    struct cmp_stats s = {0};
    double sum = 0, sq = 0;
    size_t nf = 0;
    for (size_t i = 0; i < n; i++) {
        if (isnan(v[i])) {
            s.nan++;
            continue;
        }
        if (isinf(v[i])) {
            if (v[i] > 0)
                s.pinf++;
            else
                s.ninf++;
            continue;
        }
        if (v[i] == 0)
            s.zeros++;
        if (nf == 0 || v[i] < s.min)
            s.min = v[i];
        if (nf == 0 || v[i] > s.max)
            s.max = v[i];
        sum += v[i];
        sq += v[i] * v[i];
        nf++;
    }
    s.has_finite = nf > 0;
    if (nf) {
        s.mean = sum / (double)nf;
        s.l2 = sqrt(sq);
        s.std = sqrt(fmax(0, sq / (double)nf - s.mean * s.mean));
    }
    return s;
}

/* A 1-D float64 record with a full payload. */
static struct cmp_tensor f64_tensor(const char *key, int64_t seq, const double *v, size_t n,
                                    const char *hash)
{
    return crec_f64(key, seq, v, n, stats_of(v, n), hash, CMP_CAPTURE_FULL);
}

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
    t.payload = keep(p, n * isz);
    t.payload_len = n * isz;
    return t;
}

static struct cmp_metrics compare(const struct cmp_tensor *h, const struct cmp_tensor *c,
                                  const struct cmp_tol *tol)
{
    struct cmp_metrics m;
    int rc = cmp_tensor_compare(h, c, tol, NULL, &m);
    cr_assert_eq(rc, 0, "cmp_tensor_compare: %d", rc);
    return m;
}

static long long ji(json_t *root, const char *path)
{
    json_t *v = jw_path(root, path);
    cr_assert(json_is_integer(v), "%s is not an integer", path);
    return json_integer_value(v);
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

/* ----------------------------------------------------------------- metrics */

Test(metrics, identical_hash_computes_nothing)
{
    double v[3] = {1, 2, 3}, w[3] = {9, 9, 9};
    struct cmp_tensor c = f64_tensor("a.0.forward.output.0", 0, v, 3, "abc");
    /* same hash, dtype and shape: identical even though the payload differs */
    struct cmp_tensor h = f64_tensor("a.0.forward.output.0", 0, w, 3, "abc");
    struct cmp_metrics m = compare(&h, &c, NULL);
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
    struct cmp_metrics m = compare(&h, &c, NULL);
    cr_assert_neq(m.basis, CMP_BASIS_EXACT, "equal hashes of two algorithms are not identity");
    cr_assert_eq(m.basis, CMP_BASIS_FULL);
    cr_assert(m.hash_alg_mixed);
    cr_assert_not(m.within_tol, "the payloads differ");
    cr_assert_eq(m.max_abs, 8.0);

    /* Unequal hashes, equal bytes: within tolerance on the payloads. */
    struct cmp_tensor h2 = f64_tensor("a.0.forward.output.0", 0, v, 3, "def");
    h2.hash_alg = "xxh3-128";
    m = compare(&h2, &c, NULL);
    cr_assert_eq(m.basis, CMP_BASIS_FULL);
    cr_assert(m.hash_alg_mixed);
    cr_assert(m.within_tol);
    cr_assert_eq(m.max_abs, 0.0);

    /* Unnamed is the default algorithm: equal hashes stay identical. */
    struct cmp_tensor h3 = f64_tensor("a.0.forward.output.0", 0, w, 3, "abc");
    h3.hash_alg = CMP_HASH_ALG_DEFAULT;
    m = compare(&h3, &c, NULL);
    cr_assert_eq(m.basis, CMP_BASIS_EXACT);
    cr_assert_not(m.hash_alg_mixed);
    /* Both named alike, equal hashes: identical too. */
    c.hash_alg = "xxh3-128";
    m = compare(&h, &c, NULL);
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
    struct cmp_metrics m = compare(&h, &c, NULL);
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
    struct cmp_metrics m = compare(&h, &c, NULL);
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
    struct cmp_metrics m = compare(&h, &c, NULL);
    cr_assert(m.within_tol, "-0 vs 0 differs in bits only");
    cr_assert_eq(m.max_abs, 0.0);
    cr_assert_eq(m.cosine, 1.0, "two zero vectors are parallel by convention");
    cr_assert(isinf(m.sqnr_db) && m.sqnr_db > 0);
    cr_assert_eq(m.nl2, 0.0);

    /* error against an all-zero control: SQNR -inf, nl2 +inf, cosine 0 */
    double a2[3] = {1, 0, 0};
    h = f64_tensor("z.0.forward.output.0", 0, a2, 3, "h2");
    m = compare(&h, &c, NULL);
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
    struct cmp_metrics m = compare(&h, &c, NULL);
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
    m = compare(&h, &c, NULL);
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
    *m = compare(&h, &c, NULL);
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
    cr_assert(compare(&h, &c, NULL).within_tol);
    h = raw_tensor("float16", &ulp2, 1, 2, "h2");
    cr_assert_not(compare(&h, &c, NULL).within_tol);

    /* bf16 1.0 vs 1.0078125 (one ulp, 2^-7): 7.8e-3 <= 1e-5 + 1.6e-2 -> close */
    uint16_t b1 = 0x3f80, b2 = 0x3f81, b3 = 0x3f83;
    c = raw_tensor("bfloat16", &b1, 1, 2, "c");
    h = raw_tensor("bfloat16", &b2, 1, 2, "h");
    cr_assert(compare(&h, &c, NULL).within_tol);
    h = raw_tensor("bfloat16", &b3, 1, 2, "h3"); /* 3 ulps = 0.0234 > 0.016 */
    cr_assert_not(compare(&h, &c, NULL).within_tol);
}

Test(metrics, integers_and_bool_are_exact)
{
    int32_t c32[3] = {1, 2, 3}, h32[3] = {1, 2, 4};
    struct cmp_tensor c = raw_tensor("int32", c32, 3, 4, "c");
    struct cmp_tensor h = raw_tensor("int32", h32, 3, 4, "h");
    struct cmp_metrics m = compare(&h, &c, NULL);
    cr_assert_eq(m.allclose_violations, 1);
    cr_assert_eq(m.max_abs, 1.0);
    cr_assert_not(m.within_tol);

    /* 2^60 and 2^60+1 are the same double; the raw values still differ */
    int64_t c64[2] = {INT64_C(1) << 60, 5}, h64[2] = {(INT64_C(1) << 60) + 1, 5};
    c = raw_tensor("int64", c64, 2, 8, "c");
    h = raw_tensor("int64", h64, 2, 8, "h");
    m = compare(&h, &c, NULL);
    cr_assert_eq(m.allclose_violations, 1);
    cr_assert_not(m.within_tol);

    unsigned char cb[3] = {1, 0, 1}, hb[3] = {1, 1, 2};
    c = raw_tensor("bool", cb, 3, 1, "c");
    h = raw_tensor("bool", hb, 3, 1, "h");
    m = compare(&h, &c, NULL);
    cr_assert_eq(m.allclose_violations, 1, "2 is true, like 1");

    int8_t ci[2] = {-128, 0}, hi[2] = {127, 0};
    c = raw_tensor("int8", ci, 2, 1, "c");
    h = raw_tensor("int8", hi, 2, 1, "h");
    cr_assert_eq(compare(&h, &c, NULL).max_abs, 255.0);
    uint8_t cu[1] = {0}, hu[1] = {255};
    c = raw_tensor("uint8", cu, 1, 1, "c");
    h = raw_tensor("uint8", hu, 1, 1, "h");
    cr_assert_eq(compare(&h, &c, NULL).max_abs, 255.0);
    int16_t cs[1] = {-32768}, hs[1] = {32767};
    c = raw_tensor("int16", cs, 1, 2, "c");
    h = raw_tensor("int16", hs, 1, 2, "h");
    cr_assert_eq(compare(&h, &c, NULL).max_abs, 65535.0);
}

Test(metrics, sample_basis)
{
    /* both sides sampled, same count: positions agree, compare element-wise */
    double cs[4] = {0, 25, 50, 75}, hs[4] = {0, 25, 50, 76};
    struct cmp_tensor c = f64_tensor("s.0.forward.output.0", 0, cs, 4, "c");
    struct cmp_tensor h = f64_tensor("s.0.forward.output.0", 0, hs, 4, "h");
    c.capture = h.capture = CMP_CAPTURE_SAMPLE;
    c.numel = h.numel = c.shape[0] = h.shape[0] = 100;
    struct cmp_metrics m = compare(&h, &c, NULL);
    cr_assert_eq(m.basis, CMP_BASIS_SAMPLE);
    cr_assert_eq(m.n, 4);
    cr_assert_eq(m.max_abs, 1.0);

    /* different sample counts: only statistics are shared */
    h.payload_len = 3 * sizeof(double);
    m = compare(&h, &c, NULL);
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
    struct cmp_metrics m = compare(&h, &c, NULL);
    cr_assert_eq(m.basis, CMP_BASIS_SAMPLE);
    cr_assert_eq(m.n, 3);
    cr_assert_eq(m.max_abs, 0.0);
    cr_assert(m.within_tol);

    double samp2[3] = {0, 3, 7};
    c.payload = keep(samp2, sizeof(samp2));
    m = compare(&h, &c, NULL);
    cr_assert_eq(m.max_abs, 1.0, "position 6 holds 6, the sample said 7");

    /* and the other way round: the control is full */
    m = compare(&c, &h, NULL);
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
    struct cmp_metrics m = compare(&h, &c, NULL);
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
    struct cmp_metrics m = compare(&h, &c, NULL);
    cr_assert_eq(m.basis, CMP_BASIS_STATS);
    cr_assert(m.within_tol, "equal statistics cannot disprove closeness");
    cr_assert(isnan(m.max_abs));

    /* mean off by 1e-3 against a bound of 1e-7 + 1e-7*rms(b): proven divergent */
    h.stats.mean += 1e-3;
    m = compare(&h, &c, NULL);
    cr_assert_eq(m.stat_violations, 1);
    cr_assert_float_eq(m.d_mean, 1e-3, 1e-12);
    cr_assert_not(m.within_tol);

    /* l2 bound: |d l2| <= atol*sqrt(n) + rtol*l2(b) = 2e-7 + 1e-7*sqrt(30) */
    h.stats = c.stats;
    h.stats.l2 += 1e-7;
    cr_assert(compare(&h, &c, NULL).within_tol);
    h.stats.l2 += 1e-6;
    cr_assert_eq(compare(&h, &c, NULL).stat_violations, 1);

    /* NaN count change */
    h.stats = c.stats;
    h.stats.nan = 1;
    m = compare(&h, &c, NULL);
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
    struct cmp_metrics m = compare(&h, &c, NULL);
    cr_assert_eq(m.mismatch, CMP_MISMATCH_DTYPE);
    cr_assert_not(m.within_tol);

    h = c;
    h.hash = "h";
    c.ndim = h.ndim = 2;
    c.shape[0] = 2, c.shape[1] = 3;
    h.shape[0] = 3, h.shape[1] = 2;
    m = compare(&h, &c, NULL);
    cr_assert_eq(m.mismatch, CMP_MISMATCH_SHAPE);
    cr_assert_not(m.within_tol);

    /* same hash but different shape is not bit-identical */
    h.hash = "c";
    cr_assert_eq(compare(&h, &c, NULL).mismatch, CMP_MISMATCH_SHAPE);
}

Test(metrics, explicit_tolerance)
{
    double b[1] = {1}, a[1] = {1.01};
    struct cmp_tensor c = f64_tensor("e.0.forward.output.0", 0, b, 1, "c");
    struct cmp_tensor h = f64_tensor("e.0.forward.output.0", 0, a, 1, "h");
    struct cmp_tol loose = {.atol = 0, .rtol = 0.02};
    cr_assert(compare(&h, &c, &loose).within_tol);
    cr_assert_not(compare(&h, &c, NULL).within_tol);
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
    cr_assert_float_eq(compare(&h, &c, NULL).p99_abs, 99.01, 1e-12);
}

/* -------------------------------------------------------------------- perf */

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

/* n distinct timings around base, deterministic */
static void timings(int64_t *v, size_t n, double base, uint64_t seed)
{
    for (size_t i = 0; i < n; i++) {
        seed = seed * 6364136223846793005ull + 1442695040888963407ull;
        v[i] =
            (int64_t)(base * (1.0 + 0.01 * ((double)(seed >> 40) / 16777216.0 - 0.5))) + (int64_t)i;
    }
}

/* n process medians around base with a relative jitter of +-j/2, deterministic */
static void observations(double *v, size_t n, double base, double j, uint64_t seed)
{
    for (size_t i = 0; i < n; i++) {
        seed = seed * 6364136223846793005ull + 1442695040888963407ull;
        v[i] = base * (1.0 + j * ((double)(seed >> 40) / 16777216.0 - 0.5));
    }
}

/* k timing processes of n samples each around base, one observation each */
static void add_processes(struct cmp_cell *cell, int k, double base, uint64_t seed)
{
    int64_t t[10];
    for (int i = 0; i < k; i++) {
        timings(t, 10, base, seed * 1000 + (uint64_t)i);
        cr_assert_eq(cmp_cell_add_timing(cell, t, 10), 0);
    }
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
    observations(c, 8, 1e6, 0.01, 1);

    observations(h, 8, 1.2e6, 0.01, 2);
    struct cmp_perf p = perf_of(c, 8, h, 8, CMP_PERF_UNPAIRED);
    cr_assert_eq(p.verdict, CMP_PERF_REGRESSION);
    cr_assert_eq(p.design, CMP_PERF_UNPAIRED);
    cr_assert(p.p_exact);
    cr_assert_float_eq(p.p_value, 2.0 / 12870.0, 1e-12, "complete separation: 2/C(16,8)");
    cr_assert(p.ratio > 1.18 && p.ratio < 1.22, "ratio %g", p.ratio);
    cr_assert(p.ci_lo > 1.05 && p.ci_lo <= p.ratio && p.ratio <= p.ci_hi);
    cr_assert(p.spread < 0.02, "spread %g", p.spread);
    cr_assert(p.mde > 0 && p.mde < 0.05, "1%% noise, 8 a side: mde %g", p.mde);

    observations(h, 8, 0.8e6, 0.01, 3);
    cr_assert_eq(perf_of(c, 8, h, 8, CMP_PERF_UNPAIRED).verdict, CMP_PERF_IMPROVEMENT);

    /* the same distribution: the interval lies within +-5% */
    observations(h, 8, 1e6, 0.01, 4);
    p = perf_of(c, 8, h, 8, CMP_PERF_UNPAIRED);
    cr_assert_eq(p.verdict, CMP_PERF_SAME, "ci %g-%g", p.ci_lo, p.ci_hi);

    /* significant, past 1, but the interval reaches into +-5%: unknown */
    observations(h, 8, 1.05e6, 0.01, 5);
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
    observations(c, 8, 1e6, 0.4, 6);
    observations(h, 8, 3e6, 0.4, 7);
    struct cmp_perf p = perf_of(c, 8, h, 8, CMP_PERF_UNPAIRED);
    cr_assert_eq(p.verdict, CMP_PERF_UNSTABLE, "ci %g..%g p %g", p.ci_lo, p.ci_hi, p.p_value);
    cr_assert(p.spread > 0.05, "spread %g", p.spread);
    cr_assert(p.ci_lo > 1.05, "decisive but for the spread: ci %g..%g", p.ci_lo, p.ci_hi);

    /* one process a side (an old record): never a regression, however large */
    observations(h, 1, 3e6, 0, 8);
    p = perf_of(c, 1, h, 1, CMP_PERF_UNPAIRED);
    cr_assert_eq(p.verdict, CMP_PERF_INSUFFICIENT_DATA);
    cr_assert_eq(p.min_n, 5, "2/C(10,5) < 0.01 is the first balanced size that can reach alpha");
    cr_assert(isnan(p.mde));
    cr_assert(p.ratio > 2.5);
    /* four a side cannot reach 0.01 (2/C(8,4) = 0.029), five can */
    observations(c, 5, 1e6, 0.001, 9);
    observations(h, 5, 3e6, 0.001, 10);
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
    observations(drift, 12, 1.0, 0.3, 11);
    observations(c, 12, 1e6, 0.01, 12);
    observations(h, 12, 1.1e6, 0.01, 13);
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

    observations(h, 12, 1e6, 0.01, 14);
    for (int i = 0; i < 12; i++)
        h[i] *= drift[i];
    cr_assert_eq(perf_of(c, 12, h, 12, CMP_PERF_PAIRED).verdict, CMP_PERF_SAME);
    /* one pair cannot be tested; the t test decides from two, and five
     * pairs (one round at the default timing_pairs) settle a 50% change */
    observations(h, 12, 1.5e6, 0.01, 15);
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
    for (int i = 0; i < 5; i++)
        h[i] = 1e6 * exp(lr[i] - 0.25);
    p = perf_of(c, 5, h, 5, CMP_PERF_PAIRED);
    cr_assert(p.spread > 0.05, "spread %g", p.spread);
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
    observations(c, 10, 1e6, 0.02, 7);
    observations(h, 10, 1.1e6, 0.02, 8);
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

/* ------------------------------------------------------------------ engine */

/*
 * The synthetic model: an MLP's forward records in execution order. Each has
 * four float64 values; a head can add deltas to element 1 of any record.
 */
static const char *const mlp_keys[8] = {
    "model.0.forward.input.0", "fc1.0.forward.input.0",    "fc1.0.forward.output.0",
    "act.0.forward.input.0",   "act.0.forward.output.0",   "fc2.0.forward.input.0",
    "fc2.0.forward.output.0",  "model.0.forward.output.0",
};

static void add_record(struct cmp_cell *cell, const char *key, int64_t seq, double delta,
                       bool nondet)
{
    double v[4] = {(double)seq + 1, -(double)seq - 2, 0.5 * (double)seq, 3};
    char hash[64];
    v[1] += delta;
    snprintf(hash, sizeof(hash), delta == 0 ? "same-%s" : "diff-%s-%g", key, delta);
    struct cmp_tensor t = f64_tensor(key, seq, v, 4, hash);
    t.nondeterministic = nondet;
    cr_assert_eq(cmp_cell_add_tensor(cell, &t), 0);
}

/* delta NULL: the control's values */
static struct cmp_cell *mlp_cell(struct cmp_side *s, const char *width, const double *delta,
                                 const char *outcome)
{
    struct cmp_cell *c;
    cr_assert_eq(cmp_side_add_cell(s, "mlp", width, "forward", &c), 0);
    cr_assert_eq(cmp_cell_set_outcome(c, outcome), 0);
    for (int k = 0; k < 8; k++)
        add_record(c, mlp_keys[k], k, delta ? delta[k] : 0, false);
    return c;
}

static json_t *run_compare(struct cmp_side *c, struct cmp_side *h, const struct cmp_options *o)
{
    json_t *r = NULL;
    cr_assert_eq(cmp_compare(c, h, o, &r), 0);
    cr_assert_not_null(r);
    /* every result must serialize (no raw Inf/NaN reached jansson) */
    char *txt = json_dumps(r, 0);
    cr_assert_not_null(txt);
    free(txt);
    return r;
}

/* The two sides of one engine test and, where it made them, a cell on each. */
struct duo {
    struct cmp_side *c, *h;
    struct cmp_cell *cc, *hc;
};

static struct duo duo_new(void)
{
    struct duo d = {0};
    cr_assert_eq(cmp_side_new(&d.c), 0);
    cr_assert_eq(cmp_side_new(&d.h), 0);
    return d;
}

/* One empty MODEL/avx2/PHASE cell with outcome ok on each side. */
static struct duo duo_cells(const char *model, const char *phase)
{
    struct duo d = duo_new();
    cr_assert_eq(cmp_side_add_cell(d.c, model, "avx2", phase, &d.cc), 0);
    cr_assert_eq(cmp_side_add_cell(d.h, model, "avx2", phase, &d.hc), 0);
    cr_assert_eq(cmp_cell_set_outcome(d.cc, "ok"), 0);
    cr_assert_eq(cmp_cell_set_outcome(d.hc, "ok"), 0);
    return d;
}

/* The mlp cell at avx2 on each side: the head's records moved by DELTA
 * (NULL: none), its outcome HEAD_OUTCOME, the control's ok. */
static struct duo duo_mlp(const double *delta, const char *head_outcome)
{
    struct duo d = duo_new();
    d.cc = mlp_cell(d.c, "avx2", NULL, "ok");
    d.hc = mlp_cell(d.h, "avx2", delta, head_outcome);
    return d;
}

/* KEY at SEQ on both sides, the head's moved by DELTA. */
static void duo_record(struct duo *d, const char *key, int64_t seq, double delta)
{
    add_record(d->cc, key, seq, 0, false);
    add_record(d->hc, key, seq, delta, false);
}

/* duo_cells of mlp and PHASE with N records, KEYS[k] at seq k, the head's
 * moved by DELTAS[k]. */
static struct duo duo_keys(const char *phase, const char *const *keys, const double *deltas, int n)
{
    struct duo d = duo_cells("mlp", phase);
    for (int k = 0; k < n; k++)
        duo_record(&d, keys[k], k, deltas[k]);
    return d;
}

static json_t *duo_compare(struct duo *d, const struct cmp_options *o)
{
    return run_compare(d->c, d->h, o);
}

/* Frees both sides and R, the last result compared from them. */
static void duo_free(struct duo *d, json_t *r)
{
    json_decref(r);
    cmp_side_free(d->c);
    cmp_side_free(d->h);
}

/* Compares D's sides with options O (NULL: the defaults) and checks the
 * result against the N wants at W; returns the result (owned). */
static json_t *duo_expect_n(struct duo *d, const struct cmp_options *o, const struct jw_want *w,
                            size_t n)
{
    json_t *r = duo_compare(d, o);
    jw_expect_n(r, w, n);
    return r;
}
#define duo_expect(d, o, w) duo_expect_n((d), (o), (w), sizeof(w) / sizeof((w)[0]))

/* duo_expect, then duo_free of D and the result: a test's last comparison. */
static void duo_check_n(struct duo *d, const struct cmp_options *o, const struct jw_want *w,
                        size_t n)
{
    duo_free(d, duo_expect_n(d, o, w, n));
}
#define duo_check(d, o, w) duo_check_n((d), (o), (w), sizeof(w) / sizeof((w)[0]))

/* The mlp duo (duo_mlp) with head DELTA, compared with the defaults, must
 * give the N wants at W. */
static void mlp_check_n(const double *delta, const struct jw_want *w, size_t n)
{
    struct duo s = duo_mlp(delta, "ok");
    duo_check_n(&s, NULL, w, n);
}
#define mlp_check(delta, w) mlp_check_n((delta), (w), sizeof(w) / sizeof((w)[0]))

/* The mlp duo whose head ended HEAD_OUTCOME must compare as the N wants at
 * W, and the other way round, head as control, as the NR wants at REV. */
static void outcome_change_check_n(const char *head_outcome, const struct jw_want *w, size_t n,
                                   const struct jw_want *rev, size_t nr)
{
    struct duo s = duo_mlp(NULL, head_outcome);
    json_decref(duo_expect_n(&s, NULL, w, n));
    json_t *r = run_compare(s.h, s.c, NULL);
    jw_expect_n(r, rev, nr);
    duo_free(&s, r);
}
#define outcome_change_check(outcome, w, rev)                                                      \
    outcome_change_check_n((outcome), (w), sizeof(w) / sizeof((w)[0]), (rev),                      \
                           sizeof(rev) / sizeof((rev)[0]))

/*
 * The mlp records with fc1's input nondeterministic and different, so fc1's
 * diverged output is the first divergence without having introduced it, and
 * act, whose input is within tolerance while its output diverges, introduced it.
 */
static struct duo duo_unclean_inputs(void)
{
    static const double d[8] = {0, 0.3, 0.3, 1e-9, 0.4, 0.4, 0.4, 0.4};
    struct duo s = duo_cells("mlp", "forward");
    for (int k = 0; k < 8; k++) {
        add_record(s.cc, mlp_keys[k], k, 0, false);
        add_record(s.hc, mlp_keys[k], k, d[k], k == 1);
    }
    return s;
}

Test(engine, identical)
{
    static const struct jw_want w[] = {
        JW_S("verdict", "pass"),
        JW_S("mode", "same_width"),
        JW_S("cells.0.status", "identical"),
        JW_I("cells.0.tensors_compared", 8),
        JW_I("cells.0.tensors_identical", 8),
        JW_N("cells.0.first_divergence"),
        JW_F("cells.0.params_differed"),
        JW_I("counts.identical", 1),
        JW_I("counts.cells", 1),
        JW_S("cells.0.outcome_change", "none"),
    };
    mlp_check(NULL, w);
}

/* A control hashed with BLAKE2b and a head with XXH3, the same values:
 * never identical by hash, so within tolerance on the payloads, and the
 * cell and every pair say why. */
Test(engine, mixed_hash_alg)
{
    struct duo s = duo_cells("mlp", "forward");
    for (int k = 0; k < 8; k++) {
        add_record(s.cc, mlp_keys[k], k, 0, false);
        double v[4] = {(double)k + 1, -(double)k - 2, 0.5 * (double)k, 3};
        char hash[64];
        snprintf(hash, sizeof hash, "xxh-%d", k);
        struct cmp_tensor t = f64_tensor(mlp_keys[k], k, v, 4, hash);
        t.hash_alg = "xxh3-128";
        cr_assert_eq(cmp_cell_add_tensor(s.hc, &t), 0);
    }
    struct cmp_options o;
    cmp_options_init(&o);
    o.include_tensors = true;
    static const struct jw_want w[] = {
        JW_S("verdict", "pass"),
        JW_S("cells.0.status", "within_tolerance"),
        JW_I("cells.0.tensors_identical", 0),
        JW_I("cells.0.tensors_diverged", 0),
        JW_I("cells.0.tensors_within_tolerance", 8),
        JW_I("cells.0.tensors_hash_alg_mixed", 8),
        JW_T("cells.0.tensors.0.hash_alg_mixed"),
        JW_S("cells.0.tensors.0.basis", "full"),
        JW_S("cells.0.tensors.0.head_hash_alg", "xxh3-128"),
        JW_S("cells.0.tensors.0.control_hash_alg", "blake2b-128"),
        JW_T("cells.0.tensors.7.hash_alg_mixed"),
    };
    duo_check(&s, &o, w);
    /* One algorithm on both sides: no such field at all. */
    struct duo d = duo_mlp(NULL, "ok");
    json_t *r = duo_compare(&d, NULL);
    cr_assert_null(
        json_object_get(json_array_get(json_object_get(r, "cells"), 0), "tensors_hash_alg_mixed"));
    duo_free(&d, r);
}

Test(engine, within_tolerance)
{
    double d[8] = {0, 0, 1e-9, 1e-9, 1e-9, 1e-9, 2e-9, 2e-9}; /* fp64 bound ~1e-7 */
    static const struct jw_want w[] = {
        JW_S("verdict", "pass"),
        JW_S("cells.0.status", "within_tolerance"),
        JW_I("cells.0.tensors_identical", 2),
        JW_I("cells.0.tensors_within_tolerance", 6),
        JW_I("counts.within_tolerance", 1),
    };
    mlp_check(d, w);
}

/*
 * fc1 drifts within tolerance, act (seq 4) is the first to leave it, while its
 * input (seq 3) is still within tolerance: act both diverges first and
 * introduces the error. Its metrics come along; element 1 of seq 4 is -6, so
 * its rel is .5/6.
 */
Test(engine, diverged_first_divergence_and_introduced)
{
    double d[8] = {0, 0, 1e-9, 1e-9, 0.5, 0.5, 0.7, 0.7};
    static const struct jw_want w[] = {
        JW_S("verdict", "regression"),
        JW_S("cells.0.status", "diverged"),
        JW_S("cells.0.first_divergence.key", "act.0.forward.output.0"),
        JW_I("cells.0.first_divergence.seq", 4),
        JW_S("cells.0.first_divergence.reason", "tolerance"),
        JW_S("cells.0.first_divergence.basis", "full"),
        JW_D("cells.0.first_divergence.max_abs", 0.5, 1e-12),
        JW_D("cells.0.first_divergence.max_rel", 0.5 / 6, 1e-12),
        JW_I("cells.0.first_divergence.allclose_violations", 1),
        JW_S("cells.0.first_divergence.module", "act"),
        JW_S("cells.0.first_introduced.key", "act.0.forward.output.0"),
        JW_I("cells.0.tensors_diverged", 4),
        JW_I("counts.diverged", 1),
    };
    mlp_check(d, w);
}

/* See duo_unclean_inputs: the first divergence is not where it was introduced. */
Test(engine, first_introduced_skips_records_with_unclean_inputs)
{
    struct duo s = duo_unclean_inputs();
    static const struct jw_want w[] = {
        JW_S("cells.0.status", "diverged"),
        JW_S("cells.0.first_divergence.key", "fc1.0.forward.output.0"),
        JW_S("cells.0.first_introduced.key", "act.0.forward.output.0"),
        JW_I("cells.0.tensors_nondeterministic", 1),
    };
    duo_check(&s, NULL, w);
}

/*
 * A record that is itself a module input can only introduce error when it is
 * the first divergence (the model's input differing, here).
 */
Test(engine, first_introduced_input_origin)
{
    double d[8] = {0.25, 0.25, 0.25, 0.25, 0.25, 0.25, 0.25, 0.25};
    struct duo s = duo_mlp(d, "ok");
    json_t *r = duo_compare(&s, NULL);
    cr_assert_str_eq(jw_str(r, "cells.0.first_divergence.key"), "model.0.forward.input.0");
    cr_assert_str_eq(jw_str(r, "cells.0.first_introduced.key"), "model.0.forward.input.0");
    duo_free(&s, r);
}

Test(engine, backward_param_grad_introduces)
{
    static const char *const keys[4] = {
        "fc1.0.backward.grad_output.0", "fc1.0.backward.grad_input.0",
        "fc1.0.backward.param_grad.weight", "fc1.0.backward.param_grad.bias"};
    static const double d[4] = {1e-9, 1e-9, 0.5, 0};
    struct duo s = duo_keys("backward", keys, d, 4);
    static const struct jw_want w[] = {
        JW_S("cells.0.first_divergence.key", "fc1.0.backward.param_grad.weight"),
        JW_S("cells.0.first_introduced.key", "fc1.0.backward.param_grad.weight"),
        JW_S("cells.0.first_introduced.phase", "backward"),
        JW_S("cells.0.first_introduced.role", "param_grad"),
    };
    duo_check(&s, NULL, w);
}

Test(engine, params_differed)
{
    static const char *const keys[3] = {"fc1.0.init.param.weight", "fc1.0.forward.input.0",
                                        "fc1.0.forward.output.0"};
    static const double d[3] = {1e-3, 0, 1e-3};
    struct duo s = duo_keys("forward", keys, d, 3);
    static const struct jw_want w[] = {
        JW_T("cells.0.params_differed"),
        JW_S("cells.0.first_divergence.key", "fc1.0.init.param.weight"),
        JW_S("cells.0.first_divergence.phase", "init"),
        JW_S("cells.0.first_introduced.key", "fc1.0.init.param.weight"),
    };
    duo_check(&s, NULL, w);
}

Test(engine, missing_and_extra_keys)
{
    struct duo s = duo_cells("mlp", "forward");
    duo_record(&s, "a.0.forward.output.0", 0, 0);
    add_record(s.cc, "b.0.forward.output.0", 1, 0, false);
    add_record(s.cc, "c.0.forward.output.0", 2, 0, false);
    add_record(s.hc, "d.0.forward.output.0", 1, 0, false);
    static const struct jw_want w[] = {
        JW_S("cells.0.status", "diverged"),
        JW_I("cells.0.missing_keys", 2),
        JW_I("cells.0.extra_keys", 1),
        JW_S("cells.0.missing_key_names.0", "b.0.forward.output.0"),
        JW_S("cells.0.missing_key_names.1", "c.0.forward.output.0"),
        JW_S("cells.0.extra_key_names.0", "d.0.forward.output.0"),
        JW_S("cells.0.first_divergence.reason", "missing_in_head"),
        JW_S("cells.0.first_divergence.key", "b.0.forward.output.0"),
        JW_I("cells.0.tensors_compared", 1),
        JW_S("verdict", "regression"),
    };
    duo_check(&s, NULL, w);
}

Test(engine, nondeterministic_only)
{
    double d[8] = {0, 0, 0, 0, 0.5, 0.5, 0.5, 0.5};
    struct duo s = duo_mlp(d, "ok");
    /* the nondeterministic frame after the tensors, on either side */
    cr_assert_eq(cmp_cell_mark_nondeterministic(s.hc, "act.0.forward.output.0"), 0);
    cr_assert_eq(cmp_cell_mark_nondeterministic(s.hc, "fc2.0.forward.input.0"), 0);
    cr_assert_eq(cmp_cell_mark_nondeterministic(s.cc, "fc2.0.forward.output.0"), 0);
    cr_assert_eq(cmp_cell_mark_nondeterministic(s.cc, "model.0.forward.output.0"), 0);
    cr_assert_eq(cmp_cell_mark_nondeterministic(s.cc, "not.a.key"), 0);
    static const struct jw_want w[] = {
        JW_S("cells.0.status", "nondeterministic"), JW_I("cells.0.tensors_nondeterministic", 4),
        JW_N("cells.0.first_divergence"),           JW_S("verdict", "pass"),
        JW_I("counts.nondeterministic", 1),
    };
    json_t *r = duo_expect(&s, NULL, w);
    json_decref(r);

    /* one more deterministic difference and the cell diverges */
    cmp_side_free(s.h);
    cmp_side_new(&s.h);
    double d2[8] = {0, 0, 0.5, 0, 0.5, 0.5, 0.5, 0.5};
    s.hc = mlp_cell(s.h, "avx2", d2, "ok");
    cmp_cell_mark_nondeterministic(s.hc, "act.0.forward.output.0");
    r = duo_compare(&s, NULL);
    cr_assert_str_eq(jw_str(r, "cells.0.status"), "diverged");
    cr_assert_str_eq(jw_str(r, "cells.0.first_divergence.key"), "fc1.0.forward.output.0");
    duo_free(&s, r);
}

/* Records reached before the crash are still compared; the reverse is a fix
 * and does not fail the comparison. */
Test(engine, outcome_regression_and_fix)
{
    static const struct jw_want w[] = {
        JW_S("cells.0.status", "incomparable"),
        JW_S("cells.0.incomparable_reason", "head_outcome"),
        JW_S("cells.0.outcome_change", "regression"),
        JW_S("cells.0.control_outcome", "ok"),
        JW_S("cells.0.head_outcome", "crashed"),
        JW_I("counts.outcome_regressions", 1),
        JW_S("verdict", "regression"),
        JW_I("cells.0.tensors_compared", 8),
    };
    static const struct jw_want fix[] = {
        JW_S("cells.0.outcome_change", "fix"),
        JW_I("counts.outcome_fixes", 1),
        JW_S("verdict", "pass"),
    };
    outcome_change_check("crashed", w, fix);
}

/* A cell killed for memory on one side is an outcome change like a crash:
 * a regression against an ok control, a fix the other way round. */
Test(engine, oom_is_an_outcome_change)
{
    static const struct jw_want w[] = {
        JW_S("cells.0.outcome_change", "regression"),
        JW_S("cells.0.head_outcome", "oom"),
        JW_I("counts.outcome_regressions", 1),
        JW_S("verdict", "regression"),
    };
    static const struct jw_want fix[] = {
        JW_S("cells.0.outcome_change", "fix"),
        JW_S("verdict", "pass"),
    };
    outcome_change_check("oom", w, fix);
}

/* An unsupported head cell and a cell with no records are incomparable,
 * and unsupported is not a regression. */
Test(engine, incomparable_kinds)
{
    struct duo s = duo_mlp(NULL, "unsupported");
    struct cmp_cell *x;
    cmp_side_add_cell(s.c, "mlp", "avx512", "forward", &x);
    cmp_cell_set_outcome(x, "ok");
    cmp_side_add_cell(s.h, "mlp", "avx512", "forward", &x);
    cmp_cell_set_outcome(x, "ok");
    static const struct jw_want w[] = {
        JW_S("cells.0.width", "avx2"),
        JW_S("cells.0.status", "incomparable"),
        JW_S("cells.0.outcome_change", "changed"),
        JW_S("cells.1.status", "incomparable"),
        JW_S("cells.1.incomparable_reason", "no_records"),
        JW_I("counts.incomparable", 2),
        JW_S("verdict", "pass"),
    };
    duo_check(&s, NULL, w);
}

/* A missing head cell fails; an extra head cell alone does not. */
Test(engine, missing_and_extra_cells)
{
    struct duo s = duo_mlp(NULL, "ok");
    mlp_cell(s.c, "default", NULL, "ok");
    mlp_cell(s.h, "avx512", NULL, "ok");
    static const struct jw_want w[] = {
        JW_I("counts.missing_cells", 1),
        JW_I("counts.extra_cells", 1),
        JW_S("missing_cells.0.width", "default"),
        JW_S("extra_cells.0.width", "avx512"),
        JW_S("verdict", "regression"),
    };
    json_t *r = duo_expect(&s, NULL, w);
    json_decref(r);

    cmp_side_free(s.c);
    cmp_side_new(&s.c);
    mlp_cell(s.c, "avx2", NULL, "ok");
    r = duo_compare(&s, NULL);
    cr_assert_str_eq(jw_str(r, "verdict"), "pass");
    cr_assert_eq(ji(r, "counts.extra_cells"), 1);
    duo_free(&s, r);
}

/* Options from TEXT applied over the defaults. */
static struct cmp_options options_from(const char *text)
{
    struct cmp_options o;
    struct cmp_err err;
    cmp_options_init(&o);
    json_t *j = json_loads(text, 0, NULL);
    cr_assert_not_null(j, "test JSON: %s", text);
    cr_assert_eq(cmp_options_apply_json(&o, j, &err), 0, "%s", err.message);
    json_decref(j);
    return o;
}

/* One observation per process; perf_gate false still computes and counts,
 * but the verdict passes; the same processes on both sides are the same. */
Test(engine, perf_and_memory)
{
    struct duo s = duo_mlp(NULL, "ok");
    add_processes(s.cc, 6, 1e6, 11);
    add_processes(s.hc, 6, 1.5e6, 12);
    cmp_cell_set_memory(s.cc, 1000, -1);
    cmp_cell_set_memory(s.hc, 1500, -1);
    static const struct jw_want w[] = {
        JW_S("cells.0.status", "identical"),       JW_S("cells.0.perf.verdict", "regression"),
        JW_S("cells.0.perf.design", "unpaired"),   JW_S("cells.0.perf.test", "mann_whitney"),
        JW_I("cells.0.perf.n_control", 6),         JW_I("cells.0.perf.n_head", 6),
        JW_I("cells.0.perf.samples_head", 60),     JW_I("cells.0.perf.pairs", 0),
        JW_S("cells.0.perf.p_method", "exact"),    JW_N("cells.0.perf.reason"),
        JW_I("counts.perf_regressions", 1),        JW_S("verdict", "regression"),
        JW_I("cells.0.memory.control_peak", 1000), JW_D("cells.0.memory.ratio", 1.5, 1e-15),
        JW_N("cells.0.memory.device_ratio"),
    };
    json_t *r = duo_expect(&s, NULL, w);
    cr_assert(jw_num(r, "cells.0.perf.ratio") > 1.45);
    cr_assert(jw_num(r, "cells.0.perf.ci99.0") <= jw_num(r, "cells.0.perf.ratio"));
    cr_assert(jw_num(r, "cells.0.perf.mde") > 0);
    json_decref(r);

    struct cmp_options o;
    cmp_options_init(&o);
    cr_assert(o.perf_gate, "perf gates by default");
    o = options_from("{\"perf_gate\":false}");
    r = duo_compare(&s, &o);
    static const struct jw_want ungated[] = {
        JW_S("cells.0.perf.verdict", "regression"),
        JW_I("counts.perf_regressions", 1),
        JW_F("thresholds.perf_gate"),
        JW_S("verdict", "pass"),
    };
    jw_expect_all(r, ungated);
    json_decref(r);

    r = run_compare(s.c, s.c, NULL);
    cr_assert_str_eq(jw_str(r, "cells.0.perf.verdict"), "same");
    cr_assert_eq(ji(r, "counts.perf_same"), 1);
    duo_free(&s, r);
}

/* A cell stored before timing processes: one timing frame of many samples
 * is one process, so however slow it looks it is insufficient_data. */
Test(engine, old_cell_is_one_observation)
{
    int64_t tc[30], th[30];
    struct duo s = duo_mlp(NULL, "ok");
    timings(tc, 30, 1e6, 1);
    timings(th, 30, 1.5e6, 2);
    cr_assert_eq(cmp_cell_add_timing(s.cc, tc, 30), 0);
    cr_assert_eq(cmp_cell_add_timing(s.hc, th, 30), 0);
    static const struct jw_want w[] = {
        JW_S("cells.0.perf.verdict", "insufficient_data"),
        JW_I("cells.0.perf.n_head", 1),
        JW_I("cells.0.perf.samples_head", 30),
        JW_I("cells.0.perf.min_n", 5),
        JW_I("counts.perf_regressions", 0),
        JW_S("verdict", "pass"),
    };
    json_t *r = duo_expect(&s, NULL, w);
    cr_assert(strstr(jw_str(r, "cells.0.perf.reason"), "cannot reach alpha"), "%s",
              jw_str(r, "cells.0.perf.reason"));
    duo_free(&s, r);
}

/* A head cell with reference processes (the control's build timed in the
 * head's job) is compared on its pairs and ignores the control cell's
 * timing; pairs missing a partner are left out. */
Test(engine, reference_processes_make_pairs)
{
    int64_t t[10];
    struct duo s = duo_mlp(NULL, "ok");
    add_processes(s.cc, 6, 3e6, 1); /* a control job on a slower day: not used */
    for (int i = 0; i < 10; i++) {
        double drift = 1.0 + 0.03 * (i % 4);
        timings(t, 10, 1e6 * drift, 100 + (uint64_t)i);
        cr_assert_eq(cmp_cell_add_timing_process(s.hc, t, 10, i, true), 0);
        timings(t, 10, 1.2e6 * drift, 200 + (uint64_t)i);
        cr_assert_eq(cmp_cell_add_timing_process(s.hc, t, 10, i, false), 0);
    }
    timings(t, 10, 5e6, 300);
    cr_assert_eq(cmp_cell_add_timing_process(s.hc, t, 10, 10, false), 0, "no partner");
    static const struct jw_want w[] = {
        JW_S("cells.0.perf.design", "paired"),
        JW_S("cells.0.perf.test", "paired_t"),
        JW_I("cells.0.perf.pairs", 10),
        JW_S("cells.0.perf.verdict", "regression"),
    };
    json_t *r = duo_expect(&s, NULL, w);
    cr_assert(jw_num(r, "cells.0.perf.ratio") > 1.18 && jw_num(r, "cells.0.perf.ratio") < 1.22);
    duo_free(&s, r);
}

/* Pairs whose wall clocks say 20% slower (the head's processes shared
 * their CPU) but whose CPU times agree are judged on the CPU times when
 * every process has them (basis cpu_time), and on the wall clocks as soon
 * as one lacks them. */
Test(engine, cpu_time_basis_when_every_process_has_it)
{
    int64_t t[10], cpu[10];
    for (int lacking = 0; lacking < 2; lacking++) {
        struct duo s = duo_mlp(NULL, "ok");
        for (int i = 0; i < 8; i++) {
            timings(t, 10, 1e6, 100 + (uint64_t)i);
            timings(cpu, 10, 0.98e6, 300 + (uint64_t)i);
            cr_assert_eq(cmp_cell_add_timing_process(s.hc, t, 10, i, true), 0);
            cr_assert_eq(cmp_cell_set_process_cpu(s.hc, cpu, 10), 0);
            timings(t, 10, 1.2e6, 200 + (uint64_t)i);
            timings(cpu, 10, 0.98e6, 400 + (uint64_t)i);
            cr_assert_eq(cmp_cell_add_timing_process(s.hc, t, 10, i, false), 0);
            if (!lacking || i != 5)
                cr_assert_eq(cmp_cell_set_process_cpu(s.hc, cpu, 10), 0);
        }
        json_t *r = duo_compare(&s, NULL);
        cr_assert_str_eq(jw_str(r, "cells.0.perf.basis"), lacking ? "wall_time" : "cpu_time");
        cr_assert_str_eq(jw_str(r, "cells.0.perf.verdict"), lacking ? "regression" : "same",
                         "ratio %g", jw_num(r, "cells.0.perf.ratio"));
        duo_free(&s, r);
    }
    struct cmp_side *side;
    struct cmp_cell *none;
    cr_assert_eq(cmp_side_new(&side), 0);
    cr_assert_eq(cmp_side_add_cell(side, "m", "default", "forward", &none), 0);
    cr_assert_eq(cmp_cell_set_process_cpu(none, t, 10), -EINVAL, "no process to set");
    cr_assert_eq(cmp_cell_add_timing_process(none, t, 10, -1, false), 0);
    cpu[3] = -1;
    cr_assert_eq(cmp_cell_set_process_cpu(none, cpu, 10), -EINVAL, "a negative CPU time");
    cmp_side_free(side);
}

/* The default options with the cross-width pair CONTROL against HEAD. */
static void cross_width_options(struct cmp_options *o, const char *control, const char *head)
{
    cmp_options_init(o);
    snprintf(o->control_width, sizeof o->control_width, "%s", control);
    snprintf(o->head_width, sizeof o->head_width, "%s", head);
}

Test(engine, cross_width)
{
    struct cmp_side *job;
    double d[8] = {0, 0, 0.5, 0.5, 0.5, 0.5, 0.5, 0.5};
    cmp_side_new(&job);
    mlp_cell(job, "default", NULL, "ok");
    mlp_cell(job, "avx512", d, "ok");
    mlp_cell(job, "avx2", NULL, "ok");
    struct cmp_options o;
    cross_width_options(&o, "default", "avx512");
    json_t *r = run_compare(job, job, &o);
    static const struct jw_want w[] = {
        JW_S("mode", "cross_width"),
        JW_S("control_width", "default"),
        JW_S("head_width", "avx512"),
        JW_I("counts.cells", 1),
        JW_S("cells.0.width", "avx512"),
        JW_S("cells.0.control_width", "default"),
        JW_S("cells.0.status", "diverged"),
        JW_S("cells.0.first_divergence.key", "fc1.0.forward.output.0"),
    };
    jw_expect_all(r, w);
    json_decref(r);

    /* default against avx2: identical */
    snprintf(o.head_width, sizeof(o.head_width), "avx2");
    r = run_compare(job, job, &o);
    cr_assert_str_eq(jw_str(r, "cells.0.status"), "identical");
    json_decref(r);

    /* half a cross-width setting is refused */
    o.head_width[0] = '\0';
    json_t *bad = NULL;
    cr_assert_eq(cmp_compare(job, job, &o, &bad), -EINVAL);
    cr_assert_null(bad);
    cmp_side_free(job);
}

/* Per-tensor rows come in execution order with the applied tolerance (rtol
 * kept from float64); nothing is computed for identical rows. */
Test(engine, key_tolerance_override)
{
    double d[8] = {0, 0, 0, 0, 1e-3, 0, 0, 0};
    struct duo s = duo_mlp(d, "ok");
    struct cmp_options o =
        options_from("{\"key_tolerances\":[{\"pattern\":\"act.*.output.*\",\"atol\":1e-2}],"
                     "\"include_tensors\":true}");
    json_t *r = duo_compare(&s, &o);
    static const struct jw_want w[] = {
        JW_S("cells.0.status", "within_tolerance"),
        JW_S("cells.0.tensors.4.key", "act.0.forward.output.0"),
        JW_D("cells.0.tensors.4.atol", 1e-2, 0),
        JW_D("cells.0.tensors.4.rtol", 1e-7, 0),
        JW_S("cells.0.tensors.0.status", "identical"),
        JW_S("cells.0.tensors.0.basis", "exact"),
        JW_A("cells.0.tensors.0.max_abs"),
    };
    cr_assert_eq(json_array_size(jw_path(r, "cells.0.tensors")), 8);
    jw_expect_all(r, w);
    duo_free(&s, r);
}

Test(engine, nonfinite_doubles_encode_as_null)
{
    struct duo s = duo_cells("m", "forward");
    double z[2] = {0, 0}, nz[2] = {-0.0, 0};
    struct cmp_tensor t = f64_tensor("m.0.forward.output.0", 0, z, 2, "a");
    cmp_cell_add_tensor(s.cc, &t);
    t = f64_tensor("m.0.forward.output.0", 0, nz, 2, "b");
    cmp_cell_add_tensor(s.hc, &t);
    struct cmp_options o;
    cmp_options_init(&o);
    o.include_tensors = true;
    static const struct jw_want w[] = {
        JW_N("cells.0.tensors.0.sqnr_db"),
        JW_S("cells.0.tensors.0.nonfinite.sqnr_db", "inf"),
        JW_D("cells.0.tensors.0.nl2", 0.0, 0),
    };
    duo_check(&s, &o, w);
}

Test(engine, env_and_bad_options)
{
    struct duo s = duo_mlp(NULL, "ok");
    cr_assert_eq(cmp_cell_set_env(s.cc, "avx2", "cpu"), 0);
    cr_assert_eq(cmp_cell_set_env(s.hc, "avx2", "cpu"), 0);
    cr_assert_eq(cmp_cell_set_env(s.hc, NULL, "Intel Xeon"), 0, "NULL keeps the width");
    static const struct jw_want w[] = {
        JW_S("cells.0.head_effective_width", "avx2"),
        JW_S("cells.0.head_device", "Intel Xeon"),
        JW_S("cells.0.control_device", "cpu"),
    };
    json_t *r = duo_expect(&s, NULL, w);
    json_decref(r);

    /* options set by hand are checked too: a NaN tolerance would pass anything */
    struct cmp_options o;
    cmp_options_init(&o);
    o.tol[CMP_DTYPE_FLOAT64].atol = NAN;
    cr_assert_eq(cmp_compare(s.c, s.h, &o, &r), -EINVAL);
    cmp_options_init(&o);
    o.alpha = 1.5;
    cr_assert_eq(cmp_compare(s.c, s.h, &o, &r), -EINVAL);
    duo_free(&s, NULL);
}

Test(engine, result_is_deterministic)
{
    double d[8] = {0, 0, 1e-9, 1e-9, 0.5, 0.5, 0.7, 0.7};
    struct duo s = duo_mlp(d, "ok");
    add_processes(s.cc, 5, 1e6, 1);
    add_processes(s.hc, 5, 1e6, 2);
    json_t *r1 = duo_compare(&s, NULL), *r2 = duo_compare(&s, NULL);
    char *s1 = json_dumps(r1, JSON_SORT_KEYS), *s2 = json_dumps(r2, JSON_SORT_KEYS);
    cr_assert_str_eq(s1, s2);
    free(s1);
    free(s2);
    json_decref(r1);
    json_decref(r2);
    duo_free(&s, NULL);
}

/* ----------------------------------------------------------------- options */

Test(options, defaults_are_torch_testing)
{
    struct cmp_options o;
    cmp_options_init(&o);
    cr_assert_eq(o.tol[CMP_DTYPE_FLOAT32].rtol, 1.3e-6);
    cr_assert_eq(o.tol[CMP_DTYPE_FLOAT32].atol, 1e-5);
    cr_assert_eq(o.tol[CMP_DTYPE_FLOAT16].rtol, 1e-3);
    cr_assert_eq(o.tol[CMP_DTYPE_FLOAT16].atol, 1e-5);
    cr_assert_eq(o.tol[CMP_DTYPE_BFLOAT16].rtol, 1.6e-2);
    cr_assert_eq(o.tol[CMP_DTYPE_BFLOAT16].atol, 1e-5);
    cr_assert_eq(o.tol[CMP_DTYPE_FLOAT64].rtol, 1e-7);
    cr_assert_eq(o.tol[CMP_DTYPE_FLOAT64].atol, 1e-7);
    cr_assert_eq(o.tol[CMP_DTYPE_INT32].atol, 0);
    cr_assert_eq(o.tol[CMP_DTYPE_BOOL].rtol, 0);
    cr_assert_eq(o.alpha, 0.01);
    cr_assert_eq(o.perf_threshold, 0.05);
    cr_assert_eq(o.bootstrap_resamples, 2000);
}

Test(options, apply_good_json)
{
    struct cmp_options o;
    struct cmp_err err;
    cmp_options_init(&o);
    json_t *j = json_loads(
        "{\"tolerances\":{\"float32\":{\"atol\":1e-4,\"rtol\":2e-6},\"int8\":{\"atol\":1}},"
        "\"key_tolerances\":[{\"pattern\":\"*.attn.*\",\"atol\":1e-3,\"rtol\":1e-2},"
        "{\"pattern\":\"x*\",\"rtol\":0}],"
        "\"perf_threshold\":0.1,\"alpha\":0.05,\"bootstrap\":{\"seed\":7,\"resamples\":500},"
        "\"include_tensors\":true,\"cross_width\":{\"control\":\"default\",\"head\":\"avx2\"}}",
        0, NULL);
    cr_assert_not_null(j);
    cr_assert_eq(cmp_options_apply_json(&o, j, &err), 0, "%s: %s", err.field, err.message);
    cr_assert_eq(o.tol[CMP_DTYPE_FLOAT32].atol, 1e-4);
    cr_assert_eq(o.tol[CMP_DTYPE_FLOAT32].rtol, 2e-6);
    cr_assert_eq(o.tol[CMP_DTYPE_INT8].atol, 1);
    cr_assert_eq(o.n_key_tols, 2);
    cr_assert_str_eq(o.key_tols[0].pattern, "*.attn.*");
    cr_assert(isnan(o.key_tols[1].atol));
    cr_assert_eq(o.perf_threshold, 0.1);
    cr_assert_eq(o.alpha, 0.05);
    cr_assert_eq(o.bootstrap_seed, 7);
    cr_assert_eq(o.bootstrap_resamples, 500);
    cr_assert(o.include_tensors);
    cr_assert_str_eq(o.control_width, "default");
    cr_assert_str_eq(o.head_width, "avx2");

    /* a second application puts its patterns first */
    json_decref(j);
    j = json_loads("{\"key_tolerances\":[{\"pattern\":\"new\",\"atol\":0}]}", 0, NULL);
    cr_assert_eq(cmp_options_apply_json(&o, j, &err), 0);
    cr_assert_eq(o.n_key_tols, 3);
    cr_assert_str_eq(o.key_tols[0].pattern, "new");
    cr_assert_str_eq(o.key_tols[1].pattern, "*.attn.*");
    json_decref(j);
}

static void expect_bad(const char *text, const char *field)
{
    struct cmp_options o, before;
    struct cmp_err err = {{0}, {0}};
    cmp_options_init(&o);
    o.alpha = 0.02;
    before = o;
    json_t *j = json_loads(text, 0, NULL);
    cr_assert_not_null(j, "test JSON: %s", text);
    cr_assert_eq(cmp_options_apply_json(&o, j, &err), -EINVAL, "%s accepted", text);
    cr_assert_str_eq(err.field, field, "%s: field %s", text, err.field);
    cr_assert_neq(err.message[0], '\0');
    cr_assert_eq(memcmp(&o, &before, sizeof(o)), 0, "options changed on error");
    json_decref(j);
}

Test(options, apply_bad_json)
{
    expect_bad("{\"tolerance\":{}}", "tolerance");
    expect_bad("{\"tolerances\":{\"float33\":{\"atol\":1}}}", "tolerances.float33");
    expect_bad("{\"tolerances\":{\"float32\":{\"atol\":-1}}}", "tolerances.float32.atol");
    expect_bad("{\"tolerances\":{\"float32\":{\"atol\":\"1e-5\"}}}", "tolerances.float32.atol");
    expect_bad("{\"tolerances\":{\"float32\":{\"btol\":1}}}", "tolerances.float32.btol");
    expect_bad("{\"tolerances\":{\"float32\":{\"rtol\":1e-5}},\"alpha\":2}", "alpha");
    expect_bad("{\"tolerances\":[]}", "tolerances");
    expect_bad("{\"key_tolerances\":{}}", "key_tolerances");
    expect_bad("{\"key_tolerances\":[{\"atol\":1}]}", "key_tolerances[0]");
    expect_bad("{\"key_tolerances\":[{\"pattern\":\"a\"}]}", "key_tolerances[0]");
    expect_bad(
        "{\"key_tolerances\":[{\"pattern\":\"a\",\"atol\":1},{\"pattern\":\"\",\"atol\":1}]}",
        "key_tolerances[1].pattern");
    expect_bad("{\"key_tolerances\":[{\"pattern\":\"a\",\"atol\":1,\"x\":1}]}",
               "key_tolerances[0].x");
    expect_bad("{\"perf_threshold\":-0.1}", "perf_threshold");
    expect_bad("{\"alpha\":0}", "alpha");
    expect_bad("{\"bootstrap\":{\"resamples\":-1}}", "bootstrap.resamples");
    expect_bad("{\"bootstrap\":{\"resamples\":100001}}", "bootstrap.resamples");
    expect_bad("{\"bootstrap\":{\"seed\":1.5}}", "bootstrap.seed");
    expect_bad("{\"bootstrap\":{\"sed\":1}}", "bootstrap.sed");
    expect_bad("{\"include_tensors\":1}", "include_tensors");
    expect_bad("{\"cross_width\":{\"control\":\"default\"}}", "cross_width.head");
    expect_bad("{\"cross_width\":{\"control\":\"default\",\"head\":\"a\",\"x\":1}}",
               "cross_width.x");
}

Test(options, key_tolerance_limit)
{
    struct cmp_options o;
    struct cmp_err err;
    cmp_options_init(&o);
    json_t *arr = json_array();
    for (int i = 0; i < CMP_MAX_KEY_TOLS + 1; i++)
        json_array_append_new(arr, json_pack("{s:s, s:f}", "pattern", "p*", "atol", 1.0));
    json_t *j = json_pack("{s:o}", "key_tolerances", arr);
    cr_assert_eq(cmp_options_apply_json(&o, j, &err), -EINVAL);
    cr_assert_str_eq(err.field, "key_tolerances");
    cr_assert_eq(o.n_key_tols, 0);
    json_array_remove(arr, 0);
    cr_assert_eq(cmp_options_apply_json(&o, j, &err), 0, "exactly the maximum is fine");
    cr_assert_eq(o.n_key_tols, CMP_MAX_KEY_TOLS);
    json_decref(j);
}

/* ------------------------------------------------------------------- input */

Test(input, validation_and_limits)
{
    struct cmp_side *s;
    struct cmp_cell *c, *c2;
    cr_assert_eq(cmp_side_new(&s), 0);
    cr_assert_eq(cmp_side_add_cell(s, "m", "avx2", "forward", &c), 0);
    cr_assert_eq(cmp_side_add_cell(s, "m", "avx2", "forward", &c2), -EEXIST);
    cr_assert_eq(cmp_side_add_cell(s, "m", "", "forward", &c2), -EINVAL);
    cr_assert_eq(cmp_cell_set_outcome(c, "exploded"), -EINVAL);
    cr_assert_eq(cmp_cell_set_outcome(c, "protocol_error"), 0);

    double v[4] = {1, 2, 3, 4};
    struct cmp_tensor t = f64_tensor("a.0.forward.output.0", 0, v, 4, "h");
    t.numel = 5;
    cr_assert_eq(cmp_cell_add_tensor(c, &t), -EINVAL, "numel is not the shape's product");
    t.numel = 4;
    t.payload_len = 3 * 8;
    cr_assert_eq(cmp_cell_add_tensor(c, &t), -EINVAL, "full payload of 3 of 4 elements");
    t.payload_len = 31;
    t.capture = CMP_CAPTURE_SAMPLE;
    cr_assert_eq(cmp_cell_add_tensor(c, &t), -EINVAL, "not a whole element");
    t.payload_len = 8 * 8;
    cr_assert_eq(cmp_cell_add_tensor(c, &t), -EINVAL, "sample longer than the tensor");
    t.payload_len = 32;
    t.ndim = CMP_MAX_NDIM + 1;
    cr_assert_eq(cmp_cell_add_tensor(c, &t), -EINVAL, "ndim past CMP_MAX_NDIM");
    t.ndim = 1;
    t.key = NULL;
    cr_assert_eq(cmp_cell_add_tensor(c, &t), -EINVAL);
    t.key = "a.0.forward.output.0";
    cr_assert_eq(cmp_cell_add_tensor(c, &t), 0);

    int64_t neg = -1;
    cr_assert_eq(cmp_cell_add_timing(c, &neg, 1), -EINVAL);
    int64_t *many = calloc(CMP_MAX_TIMING_SAMPLES + 1, sizeof(int64_t));
    cr_assert_eq(cmp_cell_add_timing(c, many, CMP_MAX_TIMING_SAMPLES + 1), -E2BIG);
    cr_assert_eq(cmp_cell_add_timing(c, many, CMP_MAX_TIMING_SAMPLES), 0);
    cr_assert_eq(cmp_cell_add_timing(c, many, 1), -E2BIG);
    free(many);
    cmp_side_free(s);
}

Test(input, cell_limit)
{
    struct cmp_side *s;
    struct cmp_cell *c;
    char model[32];
    cmp_side_new(&s);
    for (int i = 0; i < CMP_MAX_CELLS; i++) {
        snprintf(model, sizeof(model), "m%d", i);
        cr_assert_eq(cmp_side_add_cell(s, model, "avx2", "forward", &c), 0);
    }
    cr_assert_eq(cmp_side_add_cell(s, "one-more", "avx2", "forward", &c), -E2BIG);
    cmp_side_free(s);
}

Test(input, key_parsing)
{
    /* module/phase/role come from the key when not given */
    struct duo s = duo_cells("m", "forward");
    duo_record(&s, "encoder.layers.0.self_attn.2.forward.output.0", 0, 1);
    static const struct jw_want w[] = {
        JW_S("cells.0.first_divergence.module", "encoder.layers.0.self_attn"),
        JW_I("cells.0.first_divergence.call", 2),
        JW_S("cells.0.first_divergence.phase", "forward"),
        JW_S("cells.0.first_divergence.role", "output"),
    };
    duo_check(&s, NULL, w);
}

/*
 * Sizes derived from statistics: by hand for control [1,2,3,4] and head
 * [1,2,3,5] (d = [0,0,0,1], so max|d| = 1, ||d|| = 1, max rel 1/4), then as
 * lower bounds of the true elementwise values over random pairs.
 */
Test(derived, hand_computed)
{
    double b[4] = {1, 2, 3, 4}, a[4] = {1, 2, 3, 5};
    struct cmp_stats sb = stats_of(b, 4), sa = stats_of(a, 4);
    struct cmp_derived d;
    cr_assert_eq(cmp_stats_derive(&sa, &sb, 4, 4, &d), 0);
    cr_assert_eq(d.n, 4);
    cr_assert_float_eq(d.abs_dmean, 0.25, 1e-12);
    cr_assert_float_eq(d.abs_dstd, sqrt(2.1875) - sqrt(1.25), 1e-12);
    cr_assert_float_eq(d.abs_dmax, 1.0, 1e-12);
    cr_assert_float_eq(d.abs_dmin, 0.0, 1e-12);
    /* sqrt(n) hypot(dmean, dstd) beats |l2_a - l2_b| = sqrt(39) - sqrt(30) here */
    double want_l2 = 2.0 * hypot(0.25, sqrt(2.1875) - sqrt(1.25));
    cr_assert(want_l2 > sqrt(39) - sqrt(30));
    cr_assert_float_eq(d.l2_lower, want_l2, 1e-12);
    cr_assert_float_eq(d.rms_lower, want_l2 / 2.0, 1e-12);
    cr_assert_float_eq(d.max_abs_lower, 1.0, 1e-12, "|dmax| is the true max error here");
    cr_assert_float_eq(d.control_rms, sqrt(30) / 2.0, 1e-12);
    cr_assert_float_eq(d.control_max_abs, 4.0, 1e-12);
    cr_assert_float_eq(d.rel_l2_lower, want_l2 / sqrt(30), 1e-12);
    cr_assert_float_eq(d.max_rel_lower, 0.25, 1e-12, "the true max rel is 1/4");

    /* Nothing to derive from: counts that differ, no finite value. */
    struct cmp_stats n1 = sa;
    n1.nan = 1;
    cr_assert_eq(cmp_stats_derive(&n1, &sb, 4, 4, &d), -ENODATA);
    cr_assert_eq(cmp_stats_derive(&sa, &sb, 5, 4, &d), -ENODATA);
    struct cmp_stats none = {0};
    cr_assert_eq(cmp_stats_derive(&none, &none, 4, 4, &d), -ENODATA);
    /* A zero control with a nonzero head: infinitely far, relatively. */
    double z[4] = {0, 0, 0, 0};
    struct cmp_stats sz = stats_of(z, 4);
    cr_assert_eq(cmp_stats_derive(&sa, &sz, 4, 4, &d), 0);
    cr_assert(isinf(d.max_rel_lower) && isinf(d.rel_l2_lower));
}

Test(derived, bounds_never_exceed_the_elementwise_truth)
{
    uint64_t x = 0x9e3779b97f4a7c15ull;
    double a[64], b[64];
    for (int trial = 0; trial < 500; trial++) {
        size_t n = 2 + (size_t)(trial % 60);
        double scale = pow(10.0, (double)(trial % 7) - 3);
        for (size_t i = 0; i < n; i++) {
            x ^= x << 13, x ^= x >> 7, x ^= x << 17;
            b[i] = ((double)(x % 20001) - 10000.0) * 1e-4;
            x ^= x << 13, x ^= x >> 7, x ^= x << 17;
            a[i] = b[i] + ((double)(x % 2001) - 1000.0) * 1e-3 * scale * (trial % 3 == 0);
            if (trial % 5 == 1 && i == n / 2)
                a[i] += scale; /* one outlier */
        }
        struct cmp_stats sa = stats_of(a, n), sb = stats_of(b, n);
        struct cmp_derived d;
        cr_assert_eq(cmp_stats_derive(&sa, &sb, (int64_t)n, (int64_t)n, &d), 0);
        double l2 = 0, mx = 0, bmax = 0;
        for (size_t i = 0; i < n; i++) {
            l2 += (a[i] - b[i]) * (a[i] - b[i]);
            mx = fmax(mx, fabs(a[i] - b[i]));
            bmax = fmax(bmax, fabs(b[i]));
        }
        l2 = sqrt(l2);
        double slack = 1e-9 * (1 + sb.l2 + sa.l2);
        cr_assert(d.l2_lower <= l2 + slack, "trial %d: l2 %g > true %g", trial, d.l2_lower, l2);
        cr_assert(d.max_abs_lower <= mx + slack, "trial %d: max %g > true %g", trial,
                  d.max_abs_lower, mx);
        cr_assert(d.max_rel_lower <= mx / bmax + slack, "trial %d", trial);
    }
    /* Not vacuous: a shift and a scaling, the two errors a wrong dispatch
     * width most often makes, are sized exactly. */
    for (size_t i = 0; i < 32; i++) {
        b[i] = sin((double)i) + 0.5;
        a[i] = b[i] + 2e-4;
    }
    struct cmp_stats sa = stats_of(a, 32), sb = stats_of(b, 32);
    struct cmp_derived d;
    cr_assert_eq(cmp_stats_derive(&sa, &sb, 32, 32, &d), 0);
    cr_assert_float_eq(d.max_abs_lower, 2e-4, 1e-12);
    cr_assert_float_eq(d.l2_lower, 2e-4 * sqrt(32), 1e-12);
    for (size_t i = 0; i < 32; i++)
        a[i] = b[i] * (1 + 2e-4);
    sa = stats_of(a, 32);
    cr_assert_eq(cmp_stats_derive(&sa, &sb, 32, 32, &d), 0);
    cr_assert_float_eq(d.rel_l2_lower, 2e-4, 1e-12, "the true nl2");
}

/* The engine labels them on stats rows only; elementwise rows keep theirs. */
Test(derived, engine_rows_and_reports)
{
    double b[4] = {1, 2, 3, 4}, a[4] = {1, 2, 3, 5};
    struct duo s = duo_cells("mlp", "forward");
    struct cmp_cell *cc = s.cc, *hc = s.hc;
    struct cmp_tensor tc = f64_tensor("fc1.0.forward.output.0", 0, b, 4, "c");
    struct cmp_tensor th = f64_tensor("fc1.0.forward.output.0", 0, a, 4, "h");
    tc.capture = th.capture = CMP_CAPTURE_NONE;
    cr_assert_eq(cmp_cell_add_tensor(cc, &tc), 0);
    cr_assert_eq(cmp_cell_add_tensor(hc, &th), 0);
    struct cmp_tensor fc = f64_tensor("fc2.0.forward.output.0", 1, b, 4, "c2");
    struct cmp_tensor fh = f64_tensor("fc2.0.forward.output.0", 1, a, 4, "h2");
    cr_assert_eq(cmp_cell_add_tensor(cc, &fc), 0);
    cr_assert_eq(cmp_cell_add_tensor(hc, &fh), 0);
    struct cmp_options o;
    cmp_options_init(&o);
    o.include_tensors = true;
    json_t *r = duo_compare(&s, &o);
    /* elementwise rows are measured: no derived_from */
    static const struct jw_want w[] = {
        JW_S("cells.0.first_divergence.basis", "stats"),
        JW_S("cells.0.first_divergence.derived_from", "stats"),
        JW_D("cells.0.first_divergence.derived.max_rel_lower", 0.25, 1e-12),
        JW_D("cells.0.first_divergence.derived.max_abs_lower", 1.0, 1e-12),
        JW_S("cells.0.tensors.1.basis", "full"),
        JW_A("cells.0.tensors.1.derived_from"),
        JW_D("cells.0.tensors.1.max_rel", 0.25, 1e-12),
    };
    jw_expect_all(r, w);
    char *md = cmp_result_to_markdown(r), *txt = cmp_result_to_text(r);
    const char *want = "max rel >= 0.25, l2 rel >= 0.16 (derived from stats; capture sample "
                       "for elementwise), stats basis";
    cr_assert(md && strstr(md, want), "%s", md);
    cr_assert(txt && strstr(txt, want), "%s", txt);
    free(md);
    free(txt);
    duo_free(&s, r);
}

/* ------------------------------------------------------------------ render */

static json_t *report_fixture(void)
{
    double d[8] = {0, 0, 1e-9, 1e-9, 0.5, 0.5, 0.7, 0.7};
    struct duo s = duo_mlp(d, "ok");
    struct cmp_cell *cc, *hc;
    cmp_side_add_cell(s.c, "mlp", "avx2", "backward", &cc);
    cmp_side_add_cell(s.h, "mlp", "avx2", "backward", &hc);
    cmp_cell_set_outcome(cc, "ok");
    cmp_cell_set_outcome(hc, "crashed");
    cc = mlp_cell(s.c, "default", NULL, "ok");
    hc = mlp_cell(s.h, "default", NULL, "ok");
    add_processes(cc, 6, 1e6, 1);
    add_processes(hc, 6, 1.3e6, 2);
    json_t *r = duo_compare(&s, NULL);
    duo_free(&s, NULL);
    return r;
}

Test(render, markdown)
{
    json_t *r = report_fixture();
    char *md = cmp_result_to_markdown(r);
    cr_assert_not_null(md);
    tw_expect_has(md, "## capd comparison: **regression**\n",
                  "3 cells compared, 1 identical, 1 diverged, 1 incomparable", NULL);
    cr_assert(
        strstr(md, "### Outcome regressions\n\n- `mlp` / avx2 / backward: ok -> **crashed**\n"),
        "%s", md);
    cr_assert(strstr(md, "### Cells that differ\n"), "%s", md);
    /* act's input moved by 1e-9: act amplified that error (amplify.c) */
    tw_expect_has(
        md,
        "| mlp | avx2 | forward | diverged | ok | `act.0.forward.output.0` "
        "(seq 4, tolerance, max rel 0.0833, 1/4 off); error amplified ",
        " out | same |\n", "| mlp | avx2 | backward | incomparable | ok -> crashed | - | - |",
        "### Performance changes\n", "| evidence | detects |", " | 6/6 processes, wall time | ",
        "| mlp | default | forward | ", "| regression |\n", NULL);
    cr_assert_null(strstr(md, "| mlp | default | forward | identical"), "identical cells omitted");
    free(md);

    char *txt = cmp_result_to_text(r);
    cr_assert_not_null(txt);
    tw_expect_has(txt, "capd comparison: REGRESSION\n",
                  "OUTCOME REGRESSION mlp/avx2/backward: ok -> crashed\n",
                  "diverged mlp/avx2/forward: first divergence act.0.forward.output.0 "
                  "(seq 4, tolerance, max rel 0.0833, 1/4 off); error amplified ",
                  " out; introduced at same\n", "PERF REGRESSION mlp/default/forward: ",
                  "6/6 processes, wall time, detects >= ", NULL);
    free(txt);
    json_decref(r);
}

Test(render, introduced_elsewhere)
{
    struct duo s = duo_unclean_inputs();
    json_t *r = duo_compare(&s, NULL);
    char *md = cmp_result_to_markdown(r);
    tw_expect_has(md,
                  "| `fc1.0.forward.output.0` (seq 2, tolerance, max rel 0.075, 1/4 off); "
                  "error carried, not grown: ",
                  " out | `act.0.forward.output.0` (seq 4, tolerance, max rel 0.0667, "
                  "1/4 off) |\n",
                  NULL);
    free(md);
    duo_free(&s, r);
}

Test(render, pass_and_bad_input)
{
    struct cmp_side *c;
    cmp_side_new(&c);
    mlp_cell(c, "avx2", NULL, "ok");
    json_t *r = run_compare(c, c, NULL);
    char *md = cmp_result_to_markdown(r);
    cr_assert(strstr(md, "## capd comparison: pass\n"), "%s", md);
    cr_assert_null(strstr(md, "###"), "nothing to list: %s", md);
    free(md);
    json_decref(r);
    cmp_side_free(c);

    json_t *junk = json_pack("{s:i}", "x", 1);
    cr_assert_null(cmp_result_to_markdown(junk));
    cr_assert_null(cmp_result_to_text(NULL));
    json_decref(junk);
}

/* ---- devices: a GPU cell is never silently compared with a CPU cell ---- */

/* An mlp cell on DEVICE (NULL: never set) with DELTA and timings around BASE. */
static struct cmp_cell *device_cell(struct cmp_side *s, const char *device, const double *delta,
                                    double base, uint64_t seed)
{
    int64_t t[5];
    struct cmp_cell *c = mlp_cell(s, "native", delta, "ok");
    if (device)
        cr_assert_eq(cmp_cell_set_env(c, "avx2", device), 0);
    for (uint64_t k = 0; k < 8; k++) {
        timings(t, 5, base, seed * 100 + k);
        cr_assert_eq(cmp_cell_add_timing(c, t, 5), 0, "one timing process");
    }
    return c;
}

/* A control cell on CDEV timed around CBASE against a head cell on HDEV,
 * moved by HDELTA, timed around 1e6 from HSEED. */
static struct duo duo_devices(const char *cdev, double cbase, const char *hdev,
                              const double *hdelta, uint64_t hseed)
{
    struct duo s = duo_new();
    s.cc = device_cell(s.c, cdev, NULL, cbase, 1);
    s.hc = device_cell(s.h, hdev, hdelta, 1e6, hseed);
    return s;
}

/* A GPU head three times faster and numerically different: no record is
 * compared, timings of two devices are not a perf change, a refusal is not a
 * regression, and perf gates by default. */
Test(engine, device_mismatch_is_refused)
{
    double d[8] = {0, 0, 0.5, 0.5, 0.5, 0.5, 0.5, 0.5};
    struct duo s = duo_devices("cpu", 3e6, "NVIDIA H200", d, 2);
    static const struct jw_want w[] = {
        JW_S("cells.0.status", "incomparable"),
        JW_S("cells.0.incomparable_reason", "device_mismatch"),
        JW_S("cells.0.device_check", "mismatch_refused"),
        JW_S("cells.0.control_device", "cpu"),
        JW_S("cells.0.head_device", "NVIDIA H200"),
        JW_I("cells.0.tensors_compared", 0),
        JW_I("cells.0.tensors_diverged", 0),
        JW_I("cells.0.missing_keys", 0),
        JW_N("cells.0.first_divergence"),
        JW_S("cells.0.perf.verdict", "insufficient_data"),
        JW_I("counts.device_mismatches", 1),
        JW_I("counts.incomparable", 1),
        JW_I("counts.perf_improvements", 0),
        JW_S("verdict", "pass"),
        JW_F("thresholds.allow_device_mismatch"),
        JW_T("thresholds.perf_gate"),
    };
    json_t *r = duo_expect(&s, NULL, w);
    char *md = cmp_result_to_markdown(r);
    cr_assert(strstr(md, "| incomparable (device mismatch: cpu vs NVIDIA H200) |"), "%s", md);
    free(md);
    char *txt = cmp_result_to_text(r);
    cr_assert(strstr(txt, "incomparable mlp/native/forward (device mismatch: cpu vs NVIDIA "
                          "H200)\n"),
              "%s", txt);
    free(txt);
    duo_free(&s, r);
}

/* Compares a control cell on CDEV against a head cell on HDEV (both timed
 * around 1e6, the head's from HSEED, no record moved): cell 0 must be
 * STATUS, with FIELD of the result at VALUE. */
static void expect_devices(const char *cdev, const char *hdev, uint64_t hseed, const char *status,
                           const char *field, const char *value)
{
    struct duo s = duo_devices(cdev, 1e6, hdev, NULL, hseed);
    json_t *r = duo_compare(&s, NULL);
    cr_assert_str_eq(jw_str(r, "cells.0.status"), status, "%s against %s", cdev ? cdev : "(none)",
                     hdev);
    cr_assert_str_eq(jw_str(r, field), value, "%s against %s", cdev ? cdev : "(none)", hdev);
    duo_free(&s, r);
}

Test(engine, two_gpu_models_are_a_mismatch_too)
{
    expect_devices("NVIDIA H100 80GB HBM3", "NVIDIA H200", 2, "incomparable",
                   "cells.0.incomparable_reason", "device_mismatch");
}

Test(engine, device_mismatch_compared_when_asked)
{
    double d[8] = {0, 0, 0.5, 0.5, 0.5, 0.5, 0.5, 0.5};
    struct duo s = duo_devices("cpu", 3e6, "NVIDIA H200", d, 2);
    struct cmp_options o = options_from("{\"allow_device_mismatch\":true}");
    cr_assert(o.allow_device_mismatch);
    static const struct jw_want w[] = {
        JW_S("cells.0.status", "diverged"),
        JW_N("cells.0.incomparable_reason"),
        JW_S("cells.0.device_check", "mismatch_allowed"),
        JW_S("cells.0.first_divergence.key", "fc1.0.forward.output.0"),
        JW_S("cells.0.perf.verdict", "improvement"),
        JW_I("counts.device_mismatches", 0),
        JW_T("thresholds.allow_device_mismatch"),
    };
    duo_check(&s, &o, w);
}

/* The same device is compared, and so is a side that never said its device
 * (older records). */
Test(engine, same_or_unknown_device_is_compared)
{
    expect_devices("NVIDIA H200", "NVIDIA H200", 1, "identical", "cells.0.device_check", "same");
    expect_devices(NULL, "NVIDIA H200", 1, "identical", "cells.0.device_check", "unknown");
}

/* A failed head outcome is still reported as such, not hidden behind the
 * device check. */
Test(engine, outcome_comes_before_device_mismatch)
{
    struct duo s = duo_devices("cpu", 1e6, "NVIDIA H200", NULL, 2);
    cr_assert_eq(cmp_cell_set_outcome(s.hc, "crashed"), 0);
    json_t *r = duo_compare(&s, NULL);
    cr_assert_str_eq(jw_str(r, "cells.0.incomparable_reason"), "head_outcome");
    cr_assert_str_eq(jw_str(r, "cells.0.outcome_change"), "regression");
    duo_free(&s, r);
}

Test(options, allow_device_mismatch_json)
{
    expect_bad("{\"allow_device_mismatch\":1}", "allow_device_mismatch");
    expect_bad("{\"perf_gate\":0}", "perf_gate");
    expect_bad("{\"perf_gate\":\"no\"}", "perf_gate");
    expect_bad("{\"allow_device_mismatch\":\"yes\"}", "allow_device_mismatch");
    struct cmp_options o;
    cmp_options_init(&o);
    cr_assert(!o.allow_device_mismatch, "refused by default");
}

/* ------------------------------------------------------------- environment */

static json_t *fixture_fp(const char *name)
{
    char path[512];
    json_error_t e;
    snprintf(path, sizeof path, "%s/tests/fixtures/%s", CAPD_SOURCE_DIR, name);
    json_t *fp = json_load_file(path, 0, &e);
    cr_assert(json_is_object(fp), "%s: %s", path, e.text);
    return fp;
}

static struct cmp_cell *fp_cell(struct cmp_side *s, const char *width, const json_t *fp)
{
    struct cmp_cell *c = mlp_cell(s, width, NULL, "ok");
    cr_assert_eq(cmp_cell_set_fingerprint(c, fp), 0);
    return c;
}

/* The avx2 mlp cell on each side with fingerprints CFP and HFP. The cells
 * keep copies: the caller still owns the fingerprints. */
static struct duo duo_fp(const json_t *cfp, const json_t *hfp)
{
    struct duo s = duo_new();
    s.cc = fp_cell(s.c, "avx2", cfp);
    s.hc = fp_cell(s.h, "avx2", hfp);
    return s;
}

/* duo_fp, and a default mlp cell on each side with the same fingerprints. */
static struct duo duo_fp_widths(const json_t *cfp, const json_t *hfp)
{
    struct duo s = duo_fp(cfp, hfp);
    fp_cell(s.c, "default", cfp);
    fp_cell(s.h, "default", hfp);
    return s;
}

/* The difference entry for FIELD, or NULL. */
static json_t *env_diff(json_t *r, const char *field)
{
    return jw_find(jw_path(r, "environment.differences"), "field", field);
}

static const char *dstr(json_t *d, const char *k)
{
    cr_assert_not_null(d);
    return json_string_value(json_object_get(d, k));
}

static int group_rank(const char *g)
{
    static const char *const order[] = {"build",       "libraries", "threads", "cpu",
                                        "environment", "python",    "runner",  "other"};
    for (int i = 0; i < 8; i++)
        if (strcmp(g, order[i]) == 0)
            return i;
    cr_assert_fail("unknown group %s", g);
    return -1;
}

/* Entries come group by group in the order of likely numeric impact. */
static void assert_grouped(json_t *r)
{
    size_t i;
    json_t *d;
    int last = -1;
    json_array_foreach(jw_path(r, "environment.differences"), i, d)
    {
        int g = group_rank(dstr(d, "group"));
        cr_assert_geq(g, last, "entry %zu (%s) out of group order", i, dstr(d, "field"));
        last = g;
    }
}

Test(environment, identical_fingerprints_give_an_empty_section)
{
    json_t *fp = fixture_fp("fingerprint-debian-torch-1.13.json");
    json_t *copy = json_deep_copy(fp);
    struct duo s = duo_fp(fp, copy);
    json_decref(fp);
    json_decref(copy);
    json_t *r = duo_compare(&s, NULL);
    static const struct jw_want w[] = {
        JW_I("environment.pairs_compared", 1),
        JW_I("environment.pairs_without_fingerprint", 0),
        JW_S("environment.premise", "ok"),
    };
    cr_assert_eq(json_array_size(jw_path(r, "environment.differences")), 0);
    jw_expect_all(r, w);
    /* torch fields, every config line and build setting, cpu, env, ... */
    cr_assert_gt(ji(r, "environment.fields_compared"), 60, "%lld",
                 ji(r, "environment.fields_compared"));
    char *md = cmp_result_to_markdown(r), *txt = cmp_result_to_text(r);
    cr_assert_null(strstr(md, "What else differs"), "%s", md);
    cr_assert_null(strstr(txt, "What else differs"), "%s", txt);
    free(md);
    free(txt);
    duo_free(&s, r);
}

Test(environment, section_in_every_result)
{
    struct duo s = duo_mlp(NULL, "ok");
    json_t *r = duo_compare(&s, NULL);
    cr_assert(json_is_object(jw_path(r, "environment")));
    static const struct jw_want w[] = {
        JW_I("environment.pairs_compared", 0),
        JW_I("environment.pairs_without_fingerprint", 1),
        JW_I("environment.fields_compared", 0),
    };
    jw_expect_all(r, w);
    cr_assert_eq(json_array_size(jw_path(r, "environment.differences")), 0);
    cr_assert_eq(json_array_size(jw_path(r, "environment.inconsistent")), 0);
    duo_free(&s, r);
}

Test(environment, two_torch_builds)
{
    json_t *a = fixture_fp("fingerprint-debian-torch-1.13.json");
    json_t *b = fixture_fp("fingerprint-pip-torch-2.1-cpu.json");
    struct duo s = duo_fp(a, b);
    json_decref(a);
    json_decref(b);
    json_t *r = duo_compare(&s, NULL);
    assert_grouped(r);
    json_t *d = json_array_get(jw_path(r, "environment.differences"), 0);
    cr_assert_str_eq(dstr(d, "field"), "torch.version", "the torch version leads");
    cr_assert_str_eq(dstr(d, "control"), "1.13.0a0");
    cr_assert_str_eq(dstr(d, "head"), "2.1.0+cpu");
    cr_assert_str_eq(dstr(d, "change"), "changed");
    cr_assert_eq(json_integer_value(json_object_get(d, "cells")), 1);
    cr_assert_str_eq(dstr(env_diff(r, "torch.git_version"), "head"),
                     "7bcf7da3a268b435777fe87c7794c382f444e86d");
    /* each build setting on its own, libraries grouped as libraries */
    d = env_diff(r, "build_settings.BLAS_INFO");
    cr_assert_str_eq(dstr(d, "group"), "libraries");
    cr_assert_str_eq(dstr(d, "control"), "generic");
    cr_assert_str_eq(dstr(d, "head"), "mkl");
    cr_assert_str_eq(dstr(env_diff(r, "build_settings.BUILD_TYPE"), "group"), "build");
    cr_assert_str_eq(dstr(env_diff(r, "build_settings.USE_MKL"), "change"), "added");
    cr_assert_str_eq(dstr(env_diff(r, "build.GCC"), "head"), "GCC 9.3");
    d = env_diff(r, "build.Intel(R) MKL-DNN");
    cr_assert_str_eq(dstr(d, "group"), "libraries");
    cr_assert_str_eq(dstr(d, "control"), "Intel(R) MKL-DNN v2.6.3 (Git Hash N/A)");
    cr_assert_str_eq(dstr(env_diff(r, "build.NNPACK"), "change"), "added");
    cr_assert_str_eq(dstr(env_diff(r, "parallel.mkl_get_max_threads()"), "group"), "threads");
    cr_assert_str_eq(dstr(env_diff(r, "python.executable"), "group"), "python");
    cr_assert_str_eq(dstr(env_diff(r, "torchvision"), "head"), "0.16.0+cpu");
    /* equal fields and the raw texts are not listed */
    cr_assert_null(env_diff(r, "build.OpenMP"));
    cr_assert_null(env_diff(r, "build.CPU capability usage"));
    cr_assert_null(env_diff(r, "build_settings.USE_OPENMP"));
    cr_assert_null(env_diff(r, "torch.config"));
    cr_assert_null(env_diff(r, "torch.config_sha256"));
    cr_assert_null(env_diff(r, "cpu.flags"));
    cr_assert_null(env_diff(r, "env.PYTHONPATH"));
    /* the libraries' group opens with the BLAS, then LAPACK */
    size_t k;
    json_array_foreach(jw_path(r, "environment.differences"), k, d)
    {
        if (strcmp(dstr(d, "group"), "libraries") == 0)
            break;
    }
    cr_assert_str_eq(dstr(d, "field"), "build_settings.BLAS_INFO");
    cr_assert_str_eq(dstr(json_array_get(jw_path(r, "environment.differences"), k + 1), "field"),
                     "build_settings.LAPACK_INFO");

    char *md = cmp_result_to_markdown(r);
    const char *blk = strstr(md, "\n### What else differs\n");
    cr_assert_not_null(blk, "%s", md);
    cr_assert(strstr(md, "## capd comparison: pass\n") < blk, "after the verdict: %s", md);
    cr_assert(strstr(blk, "- build `torch.version`: `1.13.0a0` -> `2.1.0+cpu`\n"), "%s", md);
    int items = 0;
    for (const char *p = blk; (p = strstr(p, "\n- ")) != NULL; p++)
        items++;
    cr_assert_leq(items, 13, "a short block: %s", md);
    cr_assert(strstr(blk, "- ... and "), "the rest is counted: %s", md);
    free(md);
    duo_free(&s, r);
}

/* A head whose build differs in more fields than the block holds still
 * shows its libraries and interpreter there: each group's first lines come
 * before the build's many settings fill it up. */
Test(environment, block_gives_every_group_its_first_lines)
{
    json_t *a = fixture_fp("fingerprint-debian-torch-1.13.json");
    json_t *b = fixture_fp("fingerprint-pip-torch-2.1-cpu.json");
    json_t *torch = json_object_get(b, "torch");
    for (int i = 0; i < 20; i++) {
        char k[32];
        snprintf(k, sizeof k, "extra_%02d", i);
        json_object_set_new(torch, k, json_string("x"));
    }
    struct duo s = duo_fp(a, b);
    json_decref(a);
    json_decref(b);
    json_t *r = duo_compare(&s, NULL);
    cr_assert_str_eq(dstr(env_diff(r, "torch.extra_19"), "group"), "build");
    char *txt = cmp_result_to_text(r);
    const char *tb = strstr(txt, "What else differs");
    cr_assert_not_null(tb, "%s", txt);
    cr_assert(strstr(tb, "  libraries build_settings.BLAS_INFO: generic -> mkl\n"), "%s", txt);
    cr_assert(strstr(tb, "  python python.executable: "), "%s", txt);
    cr_assert(strstr(tb, "  build torch.version: 1.13.0a0 -> 2.1.0+cpu\n") <
                  strstr(tb, "  libraries build_settings.BLAS_INFO"),
              "in the section's order: %s", txt);
    int lines = 0;
    for (const char *p = strchr(tb, '\n'); p && p[1] == ' '; p = strchr(p + 1, '\n'))
        lines++;
    int64_t total = json_array_size(jw_path(r, "environment.differences"));
    cr_assert_eq(lines, total > 12 ? 13 : total, "12 differences and the count of the rest: %s",
                 txt);
    free(txt);
    duo_free(&s, r);
}

Test(environment, perturbed_build_env_and_pythonpath)
{
    json_t *a = fixture_fp("fingerprint-debian-torch-1.13.json");
    json_t *b = json_deep_copy(a);
    json_t *benv = json_object_get(b, "env");
    json_object_set_new(benv, "PYTHONPATH",
                        json_string("/src/examples/perturbed-build:/opt/capd/runner"));
    json_object_set_new(benv, "OMP_NUM_THREADS", json_string("2"));
    /* Any variable of the cell's environment counts (the runner records
     * them all): one the head sets and the control does not is "added". */
    json_object_set_new(benv, "KMP_BLOCKTIME", json_string("0"));
    json_object_set_new(benv, "MKL_LICENSE_KEY", json_string("hunter2-secret-value"));
    json_object_set_new(json_object_get(a, "env"), "MKL_LICENSE_KEY",
                        json_string("an-older-secret-value"));
    struct duo s = duo_fp_widths(a, b);
    json_decref(a);
    json_decref(b);
    json_t *r = duo_compare(&s, NULL);
    assert_grouped(r);
    cr_assert_eq(ji(r, "environment.pairs_compared"), 2);
    json_t *d = env_diff(r, "env.PYTHONPATH");
    cr_assert_str_eq(dstr(d, "group"), "environment");
    cr_assert_str_eq(dstr(d, "control"), "/opt/capd/runner");
    cr_assert_str_eq(dstr(d, "head"), "/src/examples/perturbed-build:/opt/capd/runner");
    cr_assert_eq(json_integer_value(json_object_get(d, "cells")), 2, "both pairs, one entry");
    cr_assert_str_eq(dstr(env_diff(r, "env.OMP_NUM_THREADS"), "head"), "2");
    d = env_diff(r, "env.KMP_BLOCKTIME");
    cr_assert_str_eq(dstr(d, "change"), "added");
    cr_assert_str_eq(dstr(d, "head"), "0");
    d = env_diff(r, "env.MKL_LICENSE_KEY");
    cr_assert_str_eq(dstr(d, "change"), "changed");
    cr_assert(json_is_true(json_object_get(d, "redacted")));
    cr_assert_null(json_object_get(d, "control"));
    cr_assert_null(json_object_get(d, "head"));
    cr_assert_eq(json_array_size(jw_path(r, "environment.differences")), 4, "nothing else differs");

    char *all = json_dumps(r, 0), *md = cmp_result_to_markdown(r), *txt = cmp_result_to_text(r);
    const char *outs[] = {all, md, txt};
    for (int i = 0; i < 3; i++) {
        cr_assert_null(strstr(outs[i], "secret-value"), "a credential leaked: %s", outs[i]);
    }
    tw_expect_has(md,
                  "- environment `env.PYTHONPATH`: `/opt/capd/runner` -> "
                  "`/src/examples/perturbed-build:/opt/capd/runner`\n",
                  "- environment `env.MKL_LICENSE_KEY`: changed (value not shown)\n", NULL);
    cr_assert(strstr(txt, "  environment env.PYTHONPATH: /opt/capd/runner -> "
                          "/src/examples/perturbed-build:/opt/capd/runner\n"),
              "%s", txt);
    free(all);
    free(md);
    free(txt);
    duo_free(&s, r);
}

Test(environment, cells_of_one_side_that_disagree_break_the_premise)
{
    json_t *a = fixture_fp("fingerprint-debian-torch-1.13.json");
    json_t *other_cpu = json_deep_copy(a), *other_width = json_deep_copy(a);
    json_object_set_new(json_object_get(other_cpu, "cpu"), "model",
                        json_string("Intel(R) Xeon(R) Gold 6338"));
    json_object_set_new(json_object_get(other_cpu, "python"), "executable",
                        json_string("/opt/py/bin/python3"));
    /* width-dependent fields differ between cells by design */
    json_object_set_new(other_width, "cpu_capability", json_string("default"));
    json_object_set_new(json_object_get(other_width, "env"), "ATEN_CPU_CAPABILITY",
                        json_string("default"));
    struct duo s = duo_fp(a, a);
    fp_cell(s.c, "default", other_width);
    fp_cell(s.h, "default", other_width);
    json_decref(a);
    json_decref(other_width);
    json_t *r = duo_compare(&s, NULL);
    cr_assert_str_eq(jw_str(r, "environment.premise"), "ok", "width fields do not count");
    cr_assert_eq(json_array_size(jw_path(r, "environment.differences")), 0);
    json_decref(r);

    struct cmp_cell *x;
    cr_assert_eq(cmp_side_add_cell(s.h, "mlp", "avx512", "forward", &x), 0);
    cmp_cell_set_outcome(x, "ok");
    cr_assert_eq(cmp_cell_set_fingerprint(x, other_cpu), 0);
    r = duo_compare(&s, NULL);
    json_t *inc = jw_path(r, "environment.inconsistent");
    cr_assert_eq(json_array_size(inc), 2, "python.executable and cpu.model");
    static const struct jw_want w[] = {
        JW_S("environment.premise", "broken"),
        JW_S("environment.inconsistent.0.side", "head"),
        JW_S("environment.inconsistent.0.field", "python.executable"),
        JW_S("environment.inconsistent.1.field", "cpu.model"),
        JW_I("environment.inconsistent.0.values.0.cells", 2),
        JW_S("environment.inconsistent.0.values.1.value", "/opt/py/bin/python3"),
        JW_I("environment.inconsistent.0.values.1.cells", 1),
        JW_S("environment.inconsistent.0.values.1.example.width", "avx512"),
    };
    jw_expect_all(r, w);
    char *md = cmp_result_to_markdown(r);
    cr_assert(strstr(md, "- **Broken premise:** head cells disagree on `python.executable`: "
                         "`/usr/bin/python3` (2), `/opt/py/bin/python3` (1)\n"),
              "%s", md);
    free(md);
    json_decref(other_cpu);
    duo_free(&s, r);
}

Test(environment, limits_and_bad_input)
{
    struct duo s = duo_mlp(NULL, "ok");
    struct cmp_cell *cc = s.cc, *hc = s.hc;
    json_t *arr = json_array();
    cr_assert_eq(cmp_cell_set_fingerprint(cc, arr), -EINVAL);
    cr_assert_eq(cmp_cell_set_fingerprint(cc, NULL), -EINVAL);
    json_decref(arr);

    /* past CMP_MAX_ENV_FIELDS fields: refused, the cell keeps none */
    json_t *big = json_object(), *env = json_object();
    json_object_set_new(big, "env", env);
    for (int i = 0; i <= CMP_MAX_ENV_FIELDS; i++) {
        char k[32];
        snprintf(k, sizeof k, "MKL_V%05d", i);
        json_object_set_new(env, k, json_string("1"));
    }
    cr_assert_eq(cmp_cell_set_fingerprint(cc, big), -E2BIG);
    json_decref(big);

    /* 300 differing variables: the list stops at CMP_MAX_ENV_DIFFS, the rest is counted */
    json_t *fc = json_object(), *fh = json_object(), *ec = json_object(), *eh = json_object();
    json_object_set_new(fc, "env", ec);
    json_object_set_new(fh, "env", eh);
    for (int i = 0; i < 300; i++) {
        char k[32];
        snprintf(k, sizeof k, "OPENBLAS_V%03d", i);
        json_object_set_new(ec, k, json_string("a"));
        json_object_set_new(eh, k, json_string("b"));
    }
    /* a value past CMP_MAX_ENV_VALUE is cut, not refused */
    char *longv = malloc(CMP_MAX_ENV_VALUE * 2);
    memset(longv, 'x', CMP_MAX_ENV_VALUE * 2 - 1);
    longv[CMP_MAX_ENV_VALUE * 2 - 1] = '\0';
    json_object_set_new(fh, "torch", json_pack("{s:s}", "version", longv));
    free(longv);
    cr_assert_eq(cmp_cell_set_fingerprint(cc, fc), 0);
    cr_assert_eq(cmp_cell_set_fingerprint(hc, fh), 0);
    json_decref(fc);
    json_decref(fh);
    json_t *r = duo_compare(&s, NULL);
    cr_assert_eq(json_array_size(jw_path(r, "environment.differences")), CMP_MAX_ENV_DIFFS);
    cr_assert_eq(ji(r, "environment.differences_omitted"), 301 - CMP_MAX_ENV_DIFFS);
    cr_assert_eq(ji(r, "environment.fields_compared"), 301);
    json_t *pp = env_diff(r, "torch.version");
    cr_assert_not_null(pp);
    cr_assert_lt(strlen(dstr(pp, "head")), CMP_MAX_ENV_VALUE);
    cr_assert(strstr(dstr(pp, "head"), " [cut]"), "a cut value says so");
    cr_assert_str_eq(dstr(pp, "change"), "added");
    char *md = cmp_result_to_markdown(r);
    cr_assert(strstr(md, "- ... and 289 more\n"), "%s", md);
    cr_assert_lt(strlen(strstr(md, "### What else differs")), 8192);
    free(md);
    duo_free(&s, r);
}

Test(environment, cross_width_shows_the_width_variables)
{
    json_t *a = fixture_fp("fingerprint-debian-torch-1.13.json");
    json_t *b = json_deep_copy(a);
    json_object_set_new(json_object_get(b, "env"), "ATEN_CPU_CAPABILITY", json_string("default"));
    struct cmp_side *s;
    cmp_side_new(&s);
    fp_cell(s, "avx2", a);
    fp_cell(s, "default", b);
    /* The cells hold copies of the fingerprints. */
    json_decref(a);
    json_decref(b);
    struct cmp_options o;
    cross_width_options(&o, "avx2", "default");
    json_t *r = run_compare(s, s, &o);
    json_t *d = env_diff(r, "env.ATEN_CPU_CAPABILITY");
    cr_assert_str_eq(dstr(d, "control"), "avx2");
    cr_assert_str_eq(dstr(d, "head"), "default");
    cr_assert_str_eq(jw_str(r, "environment.premise"), "ok");
    json_decref(r);
    cmp_side_free(s);
}
