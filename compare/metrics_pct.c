/*
 * compare/metrics_pct.c - the exact 99th percentile of |d| in bounded memory.
 *
 * Small tensors keep every |d| in the scratch buffer and select from it.
 * Large ones keep a strided sample of |d|, bracket the target rank from the
 * sample, and re-decode the payloads once to collect just the values inside
 * the bracket (about 1% of them); if the bracket misses or overflows the
 * buffer, a histogram over the bit patterns of |d| narrows the range until it
 * fits. Re-reading a float32 payload costs less than writing and re-reading an
 * 8-byte copy of every |d|, and a 1 GiB payload never needs an 8 GiB scratch.
 */
#include <float.h>
#include <math.h>
#include <string.h>

#include "compare/metrics_int.h"

#define MAX_SELECT_PASSES 12
#define INF_BITS          UINT64_C(0x7ff0000000000000)

static inline uint64_t dbits(double d)
{
    uint64_t u;
    memcpy(&u, &d, 8);
    return u;
}

static inline double bitsd(uint64_t u)
{
    double d;
    memcpy(&d, &u, 8);
    return d;
}

/* numpy's linear interpolation, including its choice of end for t >= 0.5. */
static double lerp(double lo, double hi, double t)
{
    double diff = hi - lo;
    return t >= 0.5 ? hi - diff * (1.0 - t) : lo + diff * t;
}

static double min_of(const double *v, size_t n)
{
    double m = INFINITY;
    for (size_t i = 0; i < n; i++)
        m = v[i] < m ? v[i] : m;
    return m;
}

/*
 * The percentile when every finite |d| is in sel[0..n): numpy's "linear"
 * definition, rank h = q*(n-1) interpolated between its neighbours.
 */
double cmp__percentile_in(double *sel, size_t n, double q)
{
    if (n == 0)
        return NAN;
    double h = q * (double)(n - 1);
    size_t k0 = (size_t)h;
    double t = h - (double)k0;
    double v0 = cmp__select_d(sel, n, k0);
    if (t == 0.0 || k0 + 1 >= n)
        return v0;
    return lerp(v0, min_of(sel + k0 + 1, n - k0 - 1), t);
}

struct band {
    uint64_t lo, hi;   /* bit patterns of |d|, inclusive */
    int shift;         /* histogram bucket = (bits - lo) >> shift */
    int64_t below, in; /* counts of |d| below lo and inside [lo, hi] */
    size_t kept;       /* how many of those are in sel (all, unless overflowed) */
    double min_above;  /* smallest |d| above hi */
};

/*
 * One re-decoding pass for the percentile: counts what falls below the band,
 * keeps what falls inside (histogramming it too, in case it does not fit),
 * and remembers the smallest value above it.
 */
static void band_pass(const struct cmp__view *va, const struct cmp__view *vb, int64_t n, double *A,
                      double *B, struct cmp_scratch *s, struct band *bd)
{
    bd->shift = 0;
    while (bd->shift < 64 && ((bd->hi - bd->lo) >> bd->shift) >= CMP__NBUCKET)
        bd->shift++;
    bd->below = bd->in = 0;
    bd->kept = 0;
    bd->min_above = INFINITY;
    memset(s->hist, 0, sizeof(s->hist));
    /* a one-value band (heavy ties, e.g. mostly-zero errors) needs only counts */
    const bool single = bd->lo == bd->hi;

    for (int64_t start = 0; start < n; start += CMP__BLK) {
        size_t len = (size_t)(n - start < CMP__BLK ? n - start : CMP__BLK);
        cmp__decode_block(va, start, len, A);
        cmp__decode_block(vb, start, len, B);
        for (size_t i = 0; i < len; i++) {
            double x = A[i], y = B[i];
            if (!(fabs(x) <= DBL_MAX && fabs(y) <= DBL_MAX))
                continue;
            double ad = fabs(x - y);
            uint64_t u = dbits(ad);
            if (u < bd->lo) {
                bd->below++;
            } else if (u <= bd->hi && single) {
                bd->in++;
            } else if (u <= bd->hi) {
                bd->in++;
                s->hist[(u - bd->lo) >> bd->shift]++;
                if (bd->kept < s->sel_cap)
                    s->sel[bd->kept++] = ad;
            } else if (ad < bd->min_above) {
                bd->min_above = ad;
            }
        }
    }
}

/*
 * The exact q-percentile of the nfin finite |d| of a large tensor, from the
 * pass-one sample (s->sample[0..ns)). See the file comment for the method;
 * every path ends in an exact answer, the sample only decides how fast.
 */
double cmp__percentile_large(const struct cmp__view *va, const struct cmp__view *vb, int64_t n,
                             int64_t nfin, size_t ns, struct cmp_scratch *s, double q)
{
    double A[CMP__BLK], B[CMP__BLK];
    double h = q * (double)(nfin - 1);
    int64_t k0 = (int64_t)h;
    double t = h - (double)k0;
    bool need1 = t != 0.0 && k0 + 1 < nfin;
    struct band bd = {.lo = 0, .hi = INF_BITS};

    if (ns >= 64) {
        /* bracket rank q*(ns-1) by four standard deviations of a sample quantile */
        double r = q * (double)(ns - 1);
        double m = 4.0 * sqrt((double)ns * q * (1.0 - q)) + 2.0;
        double rlo = floor(r - m), rhi = ceil(r + m) + 1.0;
        if (rlo > 0)
            bd.lo = dbits(cmp__select_d(s->sample, ns, (size_t)rlo));
        if (rhi < (double)ns)
            bd.hi = dbits(cmp__select_d(s->sample, ns, (size_t)rhi));
    }

    for (int pass = 0; pass < MAX_SELECT_PASSES; pass++) {
        band_pass(va, vb, n, A, B, s, &bd);
        if (k0 < bd.below || k0 >= bd.below + bd.in) {
            /* the sample misled us: start over with everything in the band */
            bd.lo = 0;
            bd.hi = INF_BITS;
            continue;
        }
        size_t r0 = (size_t)(k0 - bd.below);
        if (bd.lo == bd.hi) {
            double v0 = bitsd(bd.lo);
            if (!need1 || k0 + 1 < bd.below + bd.in)
                return v0;
            return lerp(v0, bd.min_above, t);
        }
        if ((int64_t)bd.kept == bd.in) {
            double v0 = cmp__select_d(s->sel, bd.kept, r0);
            if (!need1)
                return v0;
            double v1 = r0 + 1 < bd.kept ? min_of(s->sel + r0 + 1, bd.kept - r0 - 1) : bd.min_above;
            return lerp(v0, v1, t);
        }
        /* overflowed: find the bucket holding rank r0 */
        int64_t cum = 0;
        size_t b0 = 0;
        while (cum + s->hist[b0] <= (int64_t)r0)
            cum += s->hist[b0++];
        if (bd.shift == 0) {
            /* buckets are single values */
            double v0 = bitsd(bd.lo + b0);
            if (!need1)
                return v0;
            if ((int64_t)r0 + 1 < cum + s->hist[b0])
                return v0;
            for (size_t b1 = b0 + 1; b1 < CMP__NBUCKET && bd.lo + b1 <= bd.hi; b1++)
                if (s->hist[b1] > 0)
                    return lerp(v0, bitsd(bd.lo + b1), t);
            return lerp(v0, bd.min_above, t);
        }
        uint64_t nlo = bd.lo + ((uint64_t)b0 << bd.shift);
        uint64_t nhi = nlo + ((UINT64_C(1) << bd.shift) - 1);
        bd.lo = nlo;
        bd.hi = nhi < bd.hi ? nhi : bd.hi;
    }
    return NAN; /* unreachable: each narrowing divides the range by CMP__NBUCKET */
}
