/*
 * compare/perf.c - is the head slower, and can we tell?
 *
 * Timing samples are neither normal nor independent of the machine's mood.
 * Unpaired, everything is rank based or resampled: the Mann-Whitney U test
 * says whether the two sides differ at all, the Hodges-Lehmann estimator by
 * how much in nanoseconds (robust to the odd slow process), and a bootstrap
 * gives a confidence interval for the ratio of medians, the number people
 * actually read ("5% slower"). Paired, the unit is the pair's log ratio,
 * whose drift the interleaving cancelled: a t test and t interval on them
 * (a rank test needs 8 pairs to reach alpha 0.01, the t test decides from
 * the 5 a side's processes give when the pairs agree). A regression needs
 * both significance and an interval past the threshold: significance alone
 * flags a 0.1% change on a quiet machine, a large ratio alone noise on a
 * busy one.
 */
#include <errno.h>
#include <math.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>

#include "compare/cmp_int.h"

#define MW_EXACT_MAX 20 /* exact U distribution when both samples are this small */

/* ------------------------------------------------------------------ PRNG */

/*
 * xoshiro256** seeded through splitmix64: fast, well tested, and above all
 * reproducible, so the same inputs give the same interval on every machine.
 */
struct rng {
    uint64_t s[4];
};

static uint64_t splitmix64(uint64_t *x)
{
    uint64_t z = (*x += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

static void rng_seed(struct rng *r, uint64_t seed)
{
    for (int i = 0; i < 4; i++)
        r->s[i] = splitmix64(&seed);
}

static inline uint64_t rotl(uint64_t x, int k)
{
    return (x << k) | (x >> (64 - k));
}

static uint64_t rng_next(struct rng *r)
{
    uint64_t *s = r->s;
    uint64_t result = rotl(s[1] * 5, 7) * 9;
    uint64_t t = s[1] << 17;
    s[2] ^= s[0];
    s[3] ^= s[1];
    s[1] ^= s[2];
    s[0] ^= s[3];
    s[2] ^= t;
    s[3] = rotl(s[3], 45);
    return result;
}

/* Uniform in [0, n) by Lemire's multiply-shift; the bias is below 2^-40 here. */
static size_t rng_below(struct rng *r, size_t n)
{
    return (size_t)(((unsigned __int128)rng_next(r) * n) >> 64);
}

/* --------------------------------------------------------------- medians */

static int64_t min_i64(const int64_t *v, size_t n)
{
    int64_t m = v[0];
    for (size_t i = 1; i < n; i++)
        m = v[i] < m ? v[i] : m;
    return m;
}

/* Median of tmp[0..n), reordering tmp; the mean of the middle two for even n. */
static double median_inplace(int64_t *tmp, size_t n)
{
    if (n == 0)
        return NAN;
    if (n % 2 == 1)
        return (double)cmp__select_i64(tmp, n, n / 2);
    int64_t lo = cmp__select_i64(tmp, n, n / 2 - 1);
    int64_t hi = min_i64(tmp + n / 2, n - n / 2);
    return ((double)lo + (double)hi) / 2.0;
}

double cmp__median_i64(const int64_t *v, size_t n, int64_t *tmp)
{
    if (n == 0)
        return NAN;
    memcpy(tmp, v, n * sizeof(*v));
    return median_inplace(tmp, n);
}

int cmp__median_ns(const int64_t *v, size_t n, double *out)
{
    int64_t *tmp = malloc(n * sizeof(*tmp));
    if (tmp == NULL)
        return -ENOMEM;
    *out = cmp__median_i64(v, n, tmp);
    free(tmp);
    return 0;
}

static double percentile_sorted(const double *v, size_t n, double q)
{
    double h = q * (double)(n - 1);
    size_t k = (size_t)h;
    double t = h - (double)k;
    if (k + 1 >= n || t == 0)
        return v[k];
    return v[k] + (v[k + 1] - v[k]) * t;
}

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

static int cmp_i64(const void *a, const void *b)
{
    int64_t x = *(const int64_t *)a, y = *(const int64_t *)b;
    return (x > y) - (x < y);
}

static bool values_ok(const int64_t *v, size_t n)
{
    for (size_t i = 0; i < n; i++)
        if (v[i] < -CMP_MAX_TIMING_NS || v[i] > CMP_MAX_TIMING_NS)
            return false;
    return true;
}

/* ---------------------------------------------------------- Mann-Whitney */

/*
 * Two-sided p of U under H0 without ties, from the exact distribution: the
 * number of arrangements with U = u is the coefficient of q^u in the Gaussian
 * binomial [m+n choose m]_q = prod_{i=1..m} (1 - q^(n+i)) / (1 - q^i). Each
 * partial product is itself a Gaussian binomial with non-negative integer
 * coefficients below C(40,20) < 2^38, so int64 arithmetic is exact.
 */
static double mw_exact_p(size_t m, size_t n, double u)
{
    int64_t c[MW_EXACT_MAX * MW_EXACT_MAX + 1 + 2 * MW_EXACT_MAX] = {0};
    size_t deg = 0;
    c[0] = 1;
    for (size_t i = 1; i <= m; i++) {
        size_t s = n + i;
        for (size_t k = deg + s; k >= s; k--)
            c[k] -= c[k - s];
        deg += s;
        for (size_t k = i; k <= deg; k++)
            c[k] += c[k - i];
        deg -= i;
    }
    double total = 0, tail = 0;
    double umax = u > (double)(m * n) - u ? u : (double)(m * n) - u;
    for (size_t k = 0; k <= deg; k++) {
        total += (double)c[k];
        if ((double)k >= umax)
            tail += (double)c[k];
    }
    double p = 2.0 * tail / total;
    return p > 1.0 ? 1.0 : p;
}

/* Over the N sorted elements of A, each SIZE bytes, where CMP (the
 * comparator A was sorted with) returning 0 says two elements tie and the
 * int at byte FLAG of an element picks the ones counted: the sum of the
 * counted elements' ranks (from 1; tied elements share their mid-rank),
 * and the tie term sum(t^3 - t) over the groups of ties in *TIE. */
static double mid_rank_sum(const void *a, size_t n, size_t size,
                           int (*cmp)(const void *, const void *), size_t flag, double *tie)
{
    const char *e = a;
    double sum = 0;

    *tie = 0;
    for (size_t i = 0; i < n;) {
        size_t j = i;
        while (j + 1 < n && cmp(e + (j + 1) * size, e + i * size) == 0)
            j++;
        double rank = ((double)i + (double)j) / 2.0 + 1.0, t = (double)(j - i + 1);
        *tie += t * t * t - t;
        for (size_t k = i; k <= j; k++) {
            int counted;
            memcpy(&counted, e + k * size + flag, sizeof counted);
            if (counted)
                sum += rank;
        }
        i = j + 1;
    }
    return sum;
}

/* A timing sample of the Mann-Whitney test, and which side it is from. */
struct tagged {
    int64_t v;
    int from_x;
};

int cmp_mann_whitney(const int64_t *x, size_t nx, const int64_t *y, size_t ny, double *u_out,
                     double *p_out, bool *exact_out)
{
    int rc = -EINVAL;
    struct tagged *all = NULL;
    size_t n = nx + ny;

    if (x == NULL || y == NULL || nx == 0 || ny == 0 || nx > CMP_MAX_TIMING_SAMPLES ||
        ny > CMP_MAX_TIMING_SAMPLES)
        goto out;
    rc = -ENOMEM;
    all = malloc(n * sizeof(*all));
    if (all == NULL)
        goto out;
    for (size_t i = 0; i < nx; i++)
        all[i] = (struct tagged){x[i], 1};
    for (size_t j = 0; j < ny; j++)
        all[nx + j] = (struct tagged){y[j], 0};
    qsort(all, n, sizeof(*all), cmp_i64); /* v is the first member */

    double tie;
    double rx = mid_rank_sum(all, n, sizeof(*all), cmp_i64, offsetof(struct tagged, from_x), &tie);
    double u = rx - (double)nx * ((double)nx + 1) / 2.0;
    double mn = (double)nx * (double)ny;
    *u_out = u;

    if (nx <= MW_EXACT_MAX && ny <= MW_EXACT_MAX && tie == 0) {
        *p_out = mw_exact_p(nx, ny, u);
        *exact_out = true;
    } else {
        double nn = (double)n;
        double var = mn / 12.0 * ((nn + 1.0) - tie / (nn * (nn - 1.0)));
        double umax = u > mn - u ? u : mn - u;
        double p = 1.0;
        if (var > 0) {
            double z = (umax - mn / 2.0 - 0.5) / sqrt(var);
            p = erfc(z / sqrt(2.0));
        }
        *p_out = p > 1.0 ? 1.0 : p;
        *exact_out = false;
    }
    rc = 0;
out:
    free(all);
    return rc;
}

/* ------------------------------------------------------- Hodges-Lehmann */

/* How many x_i - y_j <= t, for ascending x and y; O(nx + ny). */
static int64_t count_le(const int64_t *x, size_t nx, const int64_t *y, size_t ny, int64_t t)
{
    int64_t cnt = 0;
    size_t p = 0; /* y[0..p) < x_i - t */
    for (size_t i = 0; i < nx; i++) {
        int64_t lim = x[i] - t;
        while (p < ny && y[p] < lim)
            p++;
        cnt += (int64_t)(ny - p);
    }
    return cnt;
}

/* The k-th smallest (1-based) difference: bisection on the integer value. */
static int64_t kth_diff(const int64_t *x, size_t nx, const int64_t *y, size_t ny, int64_t k)
{
    int64_t lo = x[0] - y[ny - 1], hi = x[nx - 1] - y[0];
    while (lo < hi) {
        int64_t mid = lo + (hi - lo) / 2;
        if (count_le(x, nx, y, ny, mid) >= k)
            hi = mid;
        else
            lo = mid + 1;
    }
    return lo;
}

/*
 * The median of all nx*ny pairwise differences without materializing them
 * (10^4 samples a side would be 10^8 pairs): samples are integers, so the
 * k-th difference is found by bisecting on its value, counting with two
 * pointers over the sorted samples, in at most 62 rounds.
 */
int cmp_hodges_lehmann(const int64_t *x, size_t nx, const int64_t *y, size_t ny, double *shift_out)
{
    int rc = -EINVAL;
    int64_t *sx = NULL, *sy = NULL;

    if (x == NULL || y == NULL || nx == 0 || ny == 0 || nx > CMP_MAX_TIMING_SAMPLES ||
        ny > CMP_MAX_TIMING_SAMPLES || !values_ok(x, nx) || !values_ok(y, ny))
        goto out;
    rc = -ENOMEM;
    sx = malloc(nx * sizeof(*sx));
    sy = malloc(ny * sizeof(*sy));
    if (sx == NULL || sy == NULL)
        goto out;
    memcpy(sx, x, nx * sizeof(*x));
    memcpy(sy, y, ny * sizeof(*y));
    qsort(sx, nx, sizeof(*sx), cmp_i64);
    qsort(sy, ny, sizeof(*sy), cmp_i64);
    int64_t total = (int64_t)nx * (int64_t)ny;
    if (total % 2 == 1) {
        *shift_out = (double)kth_diff(sx, nx, sy, ny, total / 2 + 1);
    } else {
        double a = (double)kth_diff(sx, nx, sy, ny, total / 2);
        double b = (double)kth_diff(sx, nx, sy, ny, total / 2 + 1);
        *shift_out = (a + b) / 2.0;
    }
    rc = 0;
out:
    free(sx);
    free(sy);
    return rc;
}

/* ------------------------------------------------------------ bootstrap */

static double median_d(double *tmp, size_t n)
{
    if (n == 0)
        return NAN;
    if (n % 2 == 1)
        return cmp__select_d(tmp, n, n / 2);
    double lo = cmp__select_d(tmp, n, n / 2 - 1);
    double hi = tmp[n / 2];
    for (size_t i = n / 2 + 1; i < n; i++)
        hi = tmp[i] < hi ? tmp[i] : hi;
    return (lo + hi) / 2.0;
}

static double median_copy(const double *v, size_t n, double *tmp)
{
    if (n == 0)
        return NAN;
    memcpy(tmp, v, n * sizeof(*v));
    return median_d(tmp, n);
}

/*
 * Percentile bootstrap of the unpaired ratio, B resamples, 0.5% and 99.5%
 * points (numpy's linear interpolation) into OUT's ci_lo/ci_hi and the
 * CMP_EQUIV_ALPHA points into eq_lo/eq_hi: resample each side's
 * observations and take the ratio of the medians; resamples whose control
 * median is 0 are dropped. With none left the intervals are NaN.
 */
static int bootstrap_ci(const double *c, size_t nc, const double *h, size_t nh, int b,
                        uint64_t seed, struct cmp_perf *out)
{
    int rc = -ENOMEM;
    size_t nmax = nc > nh ? nc : nh;
    double *tmp = malloc((nmax + 1) * sizeof(*tmp));
    double *ratios = malloc((size_t)b * sizeof(*ratios));
    struct rng r;
    size_t nr = 0;

    if (tmp == NULL || ratios == NULL)
        goto out;
    rng_seed(&r, seed);
    for (int i = 0; i < b; i++) {
        for (size_t k = 0; k < nh; k++)
            tmp[k] = h[rng_below(&r, nh)];
        double mh = median_d(tmp, nh);
        for (size_t k = 0; k < nc; k++)
            tmp[k] = c[rng_below(&r, nc)];
        double mc = median_d(tmp, nc);
        if (mc > 0)
            ratios[nr++] = mh / mc;
    }
    if (nr > 0) {
        qsort(ratios, nr, sizeof(*ratios), cmp_double);
        out->ci_lo = percentile_sorted(ratios, nr, 0.005);
        out->ci_hi = percentile_sorted(ratios, nr, 0.995);
        out->eq_lo = percentile_sorted(ratios, nr, CMP_EQUIV_ALPHA);
        out->eq_hi = percentile_sorted(ratios, nr, 1.0 - CMP_EQUIV_ALPHA);
    }
    rc = 0;
out:
    free(tmp);
    free(ratios);
    return rc;
}

/* ---------------------------------------------------------- noise, power */

/* The normal quantile by bisection on erfc: only called with a handful of alphas. */
static double z_upper(double q)
{
    double lo = 0, hi = 40;
    for (int i = 0; i < 200; i++) {
        double mid = (lo + hi) / 2;
        if (0.5 * erfc(mid / sqrt(2.0)) > q)
            lo = mid;
        else
            hi = mid;
    }
    return (lo + hi) / 2;
}

/* The median absolute deviation of v, with the median in *MED (TMP holds
 * n values); both NaN under 3 values, too few for a spread. */
static double mad_of(const double *v, size_t n, double *tmp, double *med)
{
    *med = NAN;
    if (n < 3)
        return NAN;
    *med = median_copy(v, n, tmp);
    for (size_t i = 0; i < n; i++)
        tmp[i] = fabs(v[i] - *med);
    return median_d(tmp, n);
}

/* 1.4826 * MAD / median of v (a robust coefficient of variation); NaN under 3 values. */
static double robust_cv(const double *v, size_t n, double *tmp)
{
    double med, mad = mad_of(v, n, tmp, &med);
    return med > 0 ? 1.4826 * mad / med : NAN;
}

/* 1.4826 * MAD of log ratios, as a fraction: the spread of the pairs; NaN under 3 values. */
static double robust_sd(const double *v, size_t n, double *tmp)
{
    double med;
    return expm1(1.4826 * mad_of(v, n, tmp, &med));
}

/* Sample variance of v, or of log(v) when logs; NaN under 2 values. */
static double var_of(const double *v, size_t n, bool logs)
{
    double s = 0, ss = 0;
    if (n < 2)
        return NAN;
    for (size_t i = 0; i < n; i++)
        s += logs ? log(fmax(v[i], 1.0)) : v[i];
    double mean = s / (double)n;
    for (size_t i = 0; i < n; i++) {
        double x = (logs ? log(fmax(v[i], 1.0)) : v[i]) - mean;
        ss += x * x;
    }
    return ss / (double)(n - 1);
}

static double sample_var(const double *v, size_t n)
{
    return var_of(v, n, false);
}

/*
 * The smallest p the test can give at these sizes, and the size (pairs, or
 * processes a side for a balanced unpaired design) it needs to go below
 * alpha: the paired t test reaches any p from 2 pairs on (given pairs that
 * agree closely enough); Mann-Whitney no lower than 2 / C(m+n, m).
 */
static double min_p_of(enum cmp_perf_design d, size_t nc, size_t nh)
{
    if (d == CMP_PERF_PAIRED)
        return nc >= 2 ? 0.0 : 1.0;
    if (nc == 0 || nh == 0)
        return 1.0;
    double lc = lgamma((double)(nc + nh) + 1) - lgamma((double)nc + 1) - lgamma((double)nh + 1);
    return fmin(1.0, 2.0 * exp(-lc));
}

static size_t min_n_of(enum cmp_perf_design d, double alpha)
{
    for (size_t n = 1; n < CMP_MAX_TIMING_PROCESSES; n++)
        if (min_p_of(d, n, n) < alpha)
            return n;
    return CMP_MAX_TIMING_PROCESSES;
}

/*
 * The smallest change the test would call significant four times out of
 * five at this noise (power 0.8, on the log scale): (q_{1-a/2} + q_{0.8}) s
 * k, with the t quantiles at DF for pairs (k = 1/sqrt(n)) and the normal
 * ones unpaired (DF 0; the pooled s, k = sqrt(1/m + 1/n)).
 */
static double mde_of(const struct cmp_perf *p, double alpha, double var, double se_scale, double df)
{
    if (p->min_p >= alpha || isnan(var))
        return NAN;
    double q = df > 0 ? cmp_t_quantile(alpha, df) + cmp_t_quantile(0.4, df)
                      : z_upper(alpha / 2) + z_upper(0.2);
    return expm1(q * sqrt(var) * se_scale);
}

/* ------------------------------------------------------------- verdicts */

static enum cmp_perf_verdict decide(const struct cmp_perf *p, const struct cmp_options *o)
{
    double t = o->perf_threshold;
    bool ci = !isnan(p->ci_lo) && !isnan(p->ci_hi);
    bool same = !isnan(p->eq_lo) && p->eq_lo >= 1.0 - t && p->eq_hi <= 1.0 + t;
    if (p->n_control == 0 || p->n_head == 0 || p->min_p >= o->alpha)
        return CMP_PERF_INSUFFICIENT_DATA;
    /* Paired, the intervals decide whatever the spread: both members of a
     * pair ran under the same conditions, so the intervals of the ratios
     * carry all the noise. Unpaired, the two sides may have been timed
     * hours apart under other loads, which no interval sees: spread comes
     * first. */
    enum cmp_perf_verdict alarm = CMP_PERF_UNKNOWN; /* none */
    if (ci && p->p_value < o->alpha && p->ci_lo > 1.0 + t)
        alarm = CMP_PERF_REGRESSION;
    else if (ci && p->p_value < o->alpha && p->ci_hi < 1.0 - t)
        alarm = CMP_PERF_IMPROVEMENT;
    if (p->design == CMP_PERF_PAIRED && (alarm != CMP_PERF_UNKNOWN || same))
        return alarm != CMP_PERF_UNKNOWN ? alarm : CMP_PERF_SAME;
    if (p->spread > t)
        return CMP_PERF_UNSTABLE;
    if (alarm != CMP_PERF_UNKNOWN || !ci)
        return alarm;
    return same ? CMP_PERF_SAME : CMP_PERF_UNKNOWN;
}

static bool obs_ok(const double *v, size_t n)
{
    if (v == NULL && n > 0)
        return false;
    for (size_t i = 0; i < n; i++)
        if (!isfinite(v[i]) || v[i] < 0 || v[i] > (double)CMP_MAX_TIMING_NS)
            return false;
    return true;
}

/*
 * Paired: the per-pair log ratios, their mean (the ratio is its exp), a
 * paired t test and its 99% t interval, the median pair difference and the
 * spread of the pairs. A rank test cannot go below alpha 0.01 under 8
 * pairs; the t test decides from 2, so a cell pays for no more pairs than
 * its noise needs (docs/compare.md, "Paired timing").
 */
static int paired(const double *c, const double *h, size_t n, double *tmp, double *logr,
                  const struct cmp_options *o, struct cmp_perf *out)
{
    double mean = 0;
    for (size_t i = 0; i < n; i++) {
        logr[i] = c[i] > 0 && h[i] > 0 ? log(h[i] / c[i]) : 0;
        tmp[i] = h[i] - c[i];
        mean += logr[i];
    }
    mean /= (double)n;
    out->hl_shift_ns = median_d(tmp, n);
    out->ratio = exp(mean);
    out->min_p = min_p_of(CMP_PERF_PAIRED, n, n);
    out->spread = robust_sd(logr, n, tmp);
    out->p_exact = false;
    if (n < 2)
        return 0;
    double var = sample_var(logr, n), df = (double)(n - 1), se = sqrt(var / (double)n);
    if (se > 0) {
        out->u = mean / se;
        out->p_value = cmp_t_p(out->u, df);
    } else {
        /* every pair the same ratio: no noise to test against */
        out->u = mean == 0 ? 0 : copysign(INFINITY, mean);
        out->p_value = mean == 0 ? 1.0 : 0.0;
    }
    double half = cmp_t_quantile(0.01, df) * se, eq = cmp_t_quantile(2 * CMP_EQUIV_ALPHA, df) * se;
    out->ci_lo = exp(mean - half);
    out->ci_hi = exp(mean + half);
    out->eq_lo = exp(mean - eq);
    out->eq_hi = exp(mean + eq);
    out->mde = mde_of(out, o->alpha, var, 1.0 / sqrt((double)n), df);
    return 0;
}

/* Unpaired: Mann-Whitney and Hodges-Lehmann on the rounded observations. */
static int unpaired(const double *c, size_t nc, const double *h, size_t nh, double *tmp,
                    const struct cmp_options *o, struct cmp_perf *out)
{
    int rc = -ENOMEM;
    int64_t *ic = malloc(nc * sizeof(*ic)), *ih = malloc(nh * sizeof(*ih));
    if (ic == NULL || ih == NULL)
        goto out;
    for (size_t i = 0; i < nc; i++)
        ic[i] = llround(c[i]);
    for (size_t i = 0; i < nh; i++)
        ih[i] = llround(h[i]);
    if ((rc = cmp_mann_whitney(ih, nh, ic, nc, &out->u, &out->p_value, &out->p_exact)) < 0 ||
        (rc = cmp_hodges_lehmann(ih, nh, ic, nc, &out->hl_shift_ns)) < 0)
        goto out;
    if (out->control_median_ns > 0)
        out->ratio = out->head_median_ns / out->control_median_ns;
    out->min_p = min_p_of(CMP_PERF_UNPAIRED, nc, nh);
    /* fmax takes the side that has a spread when the other has too few values */
    out->spread = fmax(robust_cv(c, nc, tmp), robust_cv(h, nh, tmp));
    double vc = var_of(c, nc, true), vh = var_of(h, nh, true);
    double var = NAN;
    if (!isnan(vc) && !isnan(vh))
        var = (vc * (double)(nc - 1) + vh * (double)(nh - 1)) / (double)(nc + nh - 2);
    out->mde = mde_of(out, o->alpha, var, sqrt(1.0 / (double)nc + 1.0 / (double)nh), 0);
    rc = 0;
    if (o->bootstrap_resamples > 0)
        rc = bootstrap_ci(c, nc, h, nh, o->bootstrap_resamples, o->bootstrap_seed, out);
out:
    free(ic);
    free(ih);
    return rc;
}

int cmp_perf_compare(const double *control, size_t nc, const double *head, size_t nh,
                     enum cmp_perf_design design, const struct cmp_options *opt,
                     struct cmp_perf *out)
{
    int rc = -EINVAL;
    double *tmp = NULL, *logr = NULL;
    struct cmp_options defaults;

    if (out == NULL || nc > CMP_MAX_TIMING_PROCESSES || nh > CMP_MAX_TIMING_PROCESSES ||
        !obs_ok(control, nc) || !obs_ok(head, nh) || (design == CMP_PERF_PAIRED && nc != nh))
        return -EINVAL;
    if (opt == NULL) {
        cmp_options_init(&defaults);
        opt = &defaults;
    }
    memset(out, 0, sizeof(*out));
    out->design = design;
    out->n_control = nc;
    out->n_head = nh;
    out->control_median_ns = out->head_median_ns = out->ratio = NAN;
    out->ci_lo = out->ci_hi = out->eq_lo = out->eq_hi = NAN;
    out->u = out->p_value = out->hl_shift_ns = NAN;
    out->spread = out->mde = NAN;
    out->min_p = 1.0;
    out->min_n = min_n_of(design, opt->alpha);

    rc = -ENOMEM;
    tmp = malloc((nc > nh ? nc : nh) * sizeof(*tmp) + sizeof(*tmp));
    logr = malloc(nc * sizeof(*logr) + sizeof(*logr));
    if (tmp == NULL || logr == NULL)
        goto out;
    out->control_median_ns = median_copy(control, nc, tmp);
    out->head_median_ns = median_copy(head, nh, tmp);
    rc = 0;
    if (nc > 0 && nh > 0)
        rc = design == CMP_PERF_PAIRED ? paired(control, head, nc, tmp, logr, opt, out)
                                       : unpaired(control, nc, head, nh, tmp, opt, out);
    out->verdict = decide(out, opt);
out:
    free(tmp);
    free(logr);
    return rc;
}
