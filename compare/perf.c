/*
 * compare/perf.c - is the head slower, and can we tell?
 *
 * Timing samples are neither normal nor independent of the machine's mood, so
 * everything here is rank based or resampled: the Mann-Whitney U test says
 * whether the two samples differ at all, the Hodges-Lehmann estimator says by
 * how much in nanoseconds (robust to the odd slow iteration), and a bootstrap
 * gives a confidence interval for the ratio of medians, the number people
 * actually read ("5% slower"). A regression needs both: significance alone
 * flags a 0.1% change on a quiet machine, a large ratio alone flags noise on
 * a busy one.
 */
#include <errno.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "compare/cmp_int.h"

#define MW_EXACT_MAX     20 /* exact U distribution when both samples are this small */
#define MIN_PERF_SAMPLES 5

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

int cmp_mann_whitney(const int64_t *x, size_t nx, const int64_t *y, size_t ny, double *u_out,
                     double *p_out, bool *exact_out)
{
    int rc = -EINVAL;
    struct tagged {
        int64_t v;
        int from_x;
    } *all = NULL;
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

    /* mid-ranks for ties, and the tie term sum(t^3 - t) */
    double rx = 0, tie = 0;
    for (size_t i = 0; i < n;) {
        size_t j = i;
        while (j + 1 < n && all[j + 1].v == all[i].v)
            j++;
        double rank = ((double)i + (double)j) / 2.0 + 1.0, t = (double)(j - i + 1);
        tie += t * t * t - t;
        for (size_t k = i; k <= j; k++)
            if (all[k].from_x)
                rx += rank;
        i = j + 1;
    }
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

/*
 * Percentile bootstrap of median(head)/median(control): resample each side
 * with replacement, B times, and take the 0.5% and 99.5% points of the
 * ratios (numpy's linear interpolation). Resamples whose control median is 0
 * are dropped; with none left the interval is NaN.
 */
static int bootstrap_ci(const int64_t *c, size_t nc, const int64_t *h, size_t nh, int b,
                        uint64_t seed, double *lo, double *hi)
{
    int rc = -ENOMEM;
    size_t nmax = nc > nh ? nc : nh;
    int64_t *tmp = malloc(nmax * sizeof(*tmp));
    double *ratios = malloc((size_t)b * sizeof(*ratios));
    struct rng r;
    size_t nr = 0;

    *lo = *hi = NAN;
    if (tmp == NULL || ratios == NULL)
        goto out;
    rng_seed(&r, seed);
    for (int i = 0; i < b; i++) {
        for (size_t k = 0; k < nh; k++)
            tmp[k] = h[rng_below(&r, nh)];
        double mh = median_inplace(tmp, nh);
        for (size_t k = 0; k < nc; k++)
            tmp[k] = c[rng_below(&r, nc)];
        double mc = median_inplace(tmp, nc);
        if (mc > 0)
            ratios[nr++] = mh / mc;
    }
    if (nr > 0) {
        qsort(ratios, nr, sizeof(*ratios), cmp_double);
        *lo = percentile_sorted(ratios, nr, 0.005);
        *hi = percentile_sorted(ratios, nr, 0.995);
    }
    rc = 0;
out:
    free(tmp);
    free(ratios);
    return rc;
}

int cmp_perf_compare(const int64_t *control, size_t nc, const int64_t *head, size_t nh,
                     const struct cmp_options *opt, struct cmp_perf *out)
{
    int rc = -EINVAL;
    int64_t *tmp = NULL;
    struct cmp_options defaults;

    if (out == NULL || (control == NULL && nc > 0) || (head == NULL && nh > 0) ||
        nc > CMP_MAX_TIMING_SAMPLES || nh > CMP_MAX_TIMING_SAMPLES || !values_ok(control, nc) ||
        !values_ok(head, nh))
        goto out;
    if (opt == NULL) {
        cmp_options_init(&defaults);
        opt = &defaults;
    }
    memset(out, 0, sizeof(*out));
    out->n_control = nc;
    out->n_head = nh;
    out->control_median_ns = out->head_median_ns = out->ratio = NAN;
    out->ci_lo = out->ci_hi = out->u = out->p_value = out->hl_shift_ns = NAN;
    out->verdict = CMP_PERF_INSUFFICIENT_DATA;

    rc = -ENOMEM;
    tmp = malloc((nc > nh ? nc : nh) * sizeof(*tmp) + 1);
    if (tmp == NULL)
        goto out;
    out->control_median_ns = cmp__median_i64(control, nc, tmp);
    out->head_median_ns = cmp__median_i64(head, nh, tmp);
    if (out->control_median_ns > 0)
        out->ratio = out->head_median_ns / out->control_median_ns;
    if (nc > 0 && nh > 0) {
        rc = cmp_mann_whitney(head, nh, control, nc, &out->u, &out->p_value, &out->p_exact);
        if (rc < 0)
            goto out;
        rc = cmp_hodges_lehmann(head, nh, control, nc, &out->hl_shift_ns);
        if (rc < 0)
            goto out;
        if (opt->bootstrap_resamples > 0) {
            rc = bootstrap_ci(control, nc, head, nh, opt->bootstrap_resamples, opt->bootstrap_seed,
                              &out->ci_lo, &out->ci_hi);
            if (rc < 0)
                goto out;
        }
    }
    if (nc >= MIN_PERF_SAMPLES && nh >= MIN_PERF_SAMPLES) {
        /* Significance and size are both required; when a bootstrap
         * interval exists it must also exclude "no change" (1.0), so a
         * shift that the interval cannot tell from noise between two
         * processes is not reported as a regression. */
        bool ci = !isnan(out->ci_lo) && !isnan(out->ci_hi);
        out->verdict = CMP_PERF_NO_CHANGE;
        if (out->p_value < opt->alpha && out->ratio > 1.0 + opt->perf_threshold &&
            (!ci || out->ci_lo > 1.0))
            out->verdict = CMP_PERF_REGRESSION;
        else if (out->p_value < opt->alpha && out->ratio < 1.0 - opt->perf_threshold &&
                 (!ci || out->ci_hi < 1.0))
            out->verdict = CMP_PERF_IMPROVEMENT;
    }
    rc = 0;
out:
    free(tmp);
    return rc;
}
