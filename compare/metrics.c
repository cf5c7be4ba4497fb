/*
 * compare/metrics.c - how far apart two tensors are.
 *
 * a = head, b = control, d = a - b, everything in double. The work is one
 * pass over the payloads for every metric except the 99th percentile, which
 * needs an order statistic. The pass walks the data in blocks: a block of each
 * side is decoded into a small double buffer (a loop the compiler vectorizes
 * for every dtype, including the float16/bfloat16 bit tricks), then one
 * branch-free kernel accumulates all sums and maxima in a few independent
 * lanes. Lanes matter: C forbids reassociating floating-point additions, so a
 * single accumulator would serialize the loop on the add latency and could
 * not use SIMD; fixed lanes make the vector code legal and the result
 * independent of the CPU. The kernel assumes finite input and carries a
 * check value that turns NaN if that assumption fails; such a block (rare:
 * only tensors that contain NaN/Inf) is redone by a careful scalar loop that
 * classifies non-finite positions.
 *
 * The percentile is exact and uses bounded memory. Small tensors keep every
 * |d| in the scratch buffer and select from it. Large ones keep a strided
 * sample of |d|, bracket the target rank from the sample, and re-decode the
 * payloads once to collect just the values inside the bracket (about 1% of
 * them); if the bracket misses or overflows the buffer, a histogram over the
 * bit patterns of |d| narrows the range until it fits. Re-reading a float32
 * payload costs less than writing and re-reading an 8-byte copy of every
 * |d|, and a 1 GiB payload never needs an 8 GiB scratch.
 */
#include <errno.h>
#include <float.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "compare/cmp_int.h"

#define BLK               1024  /* elements decoded per block */
#define LANES             4     /* independent accumulators per statistic */
#define NSAMPLE           16384 /* |d| sample that brackets the percentile */
#define NBUCKET           4096  /* histogram buckets when narrowing the bracket */
#define MAX_SELECT_PASSES 12
#define REL_EPS           2.220446049250313e-16 /* the denominator floor of relative error */
#define INF_BITS          UINT64_C(0x7ff0000000000000)

/*
 * An AVX2 clone of the hot loops where the toolchain can dispatch at run time
 * (glibc ifunc). Results do not depend on the clone: the lanes fix the
 * summation order and ISO C mode keeps the compiler from contracting a*b+c.
 */
#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__) && !defined(CMP_NO_CLONES) &&  \
    defined(__linux__)
#define CMP_CLONES __attribute__((target_clones("avx2", "default")))
#else
#define CMP_CLONES
#endif

#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ == __ORDER_BIG_ENDIAN__
#define LE16(x) __builtin_bswap16(x)
#define LE32(x) __builtin_bswap32(x)
#define LE64(x) __builtin_bswap64(x)
#else
#define LE16(x) (x)
#define LE32(x) (x)
#define LE64(x) (x)
#endif

struct cmp_scratch {
    double *sel; /* up to CMP_SCRATCH_MAX_ELEMS |d| values */
    size_t sel_cap;
    double sample[NSAMPLE + 1];
    int64_t hist[NBUCKET];
};

int cmp_scratch_new(struct cmp_scratch **out)
{
    struct cmp_scratch *s = calloc(1, sizeof(*s));
    if (s == NULL)
        return -ENOMEM;
    *out = s;
    return 0;
}

void cmp_scratch_free(struct cmp_scratch *s)
{
    if (s == NULL)
        return;
    free(s->sel);
    free(s);
}

/* Grows the selection buffer to need elements (never past the maximum). */
static int scratch_reserve(struct cmp_scratch *s, size_t need)
{
    if (need > CMP_SCRATCH_MAX_ELEMS)
        need = CMP_SCRATCH_MAX_ELEMS;
    if (need <= s->sel_cap)
        return 0;
    size_t cap = s->sel_cap ? s->sel_cap : 4096;
    while (cap < need)
        cap *= 2;
    if (cap > CMP_SCRATCH_MAX_ELEMS)
        cap = CMP_SCRATCH_MAX_ELEMS;
    double *n = realloc(s->sel, cap * sizeof(double));
    if (n == NULL)
        return -ENOMEM;
    s->sel = n;
    s->sel_cap = cap;
    return 0;
}

/* ------------------------------------------------------------- decoding */

/*
 * One side's elements as the comparison sees them: either the payload as is
 * (gather_k == 0), or positions floor(i * numel / k) of a full payload, which
 * are exactly the positions the runner samples, so a full payload can be
 * compared with the other side's sample.
 */
struct view {
    const unsigned char *p;
    enum cmp_dtype dt;
    int64_t numel;
    int64_t gather_k;
};

static inline uint16_t ld16(const unsigned char *p)
{
    uint16_t u;
    memcpy(&u, p, 2);
    return LE16(u);
}

static inline uint32_t ld32(const unsigned char *p)
{
    uint32_t u;
    memcpy(&u, p, 4);
    return LE32(u);
}

static inline uint64_t ld64(const unsigned char *p)
{
    uint64_t u;
    memcpy(&u, p, 8);
    return LE64(u);
}

/*
 * IEEE half to double without branches or tables: the 15 magnitude bits are
 * placed where a double's exponent and mantissa start, which makes the value
 * exactly 2^-1008 times too small for normal and subnormal halves alike (the
 * subnormal case is why this works: the double is then subnormal too and the
 * multiply renormalizes it exactly). Exponent 31 lands at >= 65536 after the
 * scale, which no finite half reaches, and becomes Inf/NaN with its payload.
 */
static inline double half_to_double(uint16_t h)
{
    uint64_t u = (uint64_t)(h & 0x7fffu) << 42;
    double d;
    memcpy(&d, &u, 8);
    d *= 0x1p1008;
    memcpy(&u, &d, 8);
    if (d >= 65536.0)
        u |= UINT64_C(0x7ff0000000000000);
    u |= (uint64_t)(h & 0x8000u) << 48;
    memcpy(&d, &u, 8);
    return d;
}

/* bfloat16 is the top half of a float32, so the widening is exact. */
static inline double bf16_to_double(uint16_t h)
{
    uint32_t u = (uint32_t)h << 16;
    float f;
    memcpy(&f, &u, 4);
    return f;
}

static inline double f32_at(const unsigned char *p, size_t i)
{
    uint32_t u = ld32(p + 4 * i);
    float f;
    memcpy(&f, &u, 4);
    return f;
}

static inline double f64_at(const unsigned char *p, size_t i)
{
    uint64_t u = ld64(p + 8 * i);
    double d;
    memcpy(&d, &u, 8);
    return d;
}

static inline double decode_one(const unsigned char *p, enum cmp_dtype dt, int64_t i)
{
    switch (dt) {
    case CMP_DTYPE_FLOAT32: {
        uint32_t u = ld32(p + 4 * i);
        float f;
        memcpy(&f, &u, 4);
        return f;
    }
    case CMP_DTYPE_FLOAT64: {
        uint64_t u = ld64(p + 8 * i);
        double d;
        memcpy(&d, &u, 8);
        return d;
    }
    case CMP_DTYPE_FLOAT16:
        return half_to_double(ld16(p + 2 * i));
    case CMP_DTYPE_BFLOAT16:
        return bf16_to_double(ld16(p + 2 * i));
    case CMP_DTYPE_INT8:
        return (double)(int8_t)p[i];
    case CMP_DTYPE_UINT8:
        return (double)p[i];
    case CMP_DTYPE_INT16:
        return (double)(int16_t)ld16(p + 2 * i);
    case CMP_DTYPE_INT32:
        return (double)(int32_t)ld32(p + 4 * i);
    case CMP_DTYPE_INT64:
        return (double)(int64_t)ld64(p + 8 * i);
    case CMP_DTYPE_BOOL:
        return p[i] != 0 ? 1.0 : 0.0;
    default:
        return NAN;
    }
}

/* The flat payload index of compared position i. */
static inline int64_t view_index(const struct view *v, int64_t i)
{
    if (v->gather_k == 0)
        return i;
    return (int64_t)(((unsigned __int128)i * (unsigned __int128)v->numel) /
                     (unsigned __int128)v->gather_k);
}

/*
 * Decodes compared positions [start, start+n) into out. The contiguous case
 * has one tight loop per dtype (that is what vectorizes); gathering is only
 * used for samples, a few hundred elements.
 */
CMP_CLONES
static void decode_block(const struct view *v, int64_t start, size_t n, double *restrict out)
{
    if (v->gather_k != 0) {
        for (size_t i = 0; i < n; i++)
            out[i] = decode_one(v->p, v->dt, view_index(v, start + (int64_t)i));
        return;
    }
    size_t isz = cmp__dtype_size(v->dt);
    const unsigned char *p = v->p + (size_t)start * isz;
    size_t i = 0;
    /*
     * Fixed groups of 8 let the compiler vectorize at -O2 too, where its
     * cost model refuses loops that would need a scalar epilogue.
     */
#define DECODE_LOOP(EXPR)                                                                          \
    for (; i + 8 <= n; i += 8)                                                                     \
        for (size_t j = i; j < i + 8; j++)                                                         \
            out[j] = (EXPR);                                                                       \
    for (; i < n; i++) {                                                                           \
        size_t j = i;                                                                              \
        out[j] = (EXPR);                                                                           \
    }
    switch (v->dt) {
    case CMP_DTYPE_FLOAT32:
        DECODE_LOOP(f32_at(p, j));
        break;
    case CMP_DTYPE_FLOAT64:
        DECODE_LOOP(f64_at(p, j));
        break;
    case CMP_DTYPE_FLOAT16:
        DECODE_LOOP(half_to_double(ld16(p + 2 * j)));
        break;
    case CMP_DTYPE_BFLOAT16:
        DECODE_LOOP(bf16_to_double(ld16(p + 2 * j)));
        break;
    default:
        DECODE_LOOP(decode_one(p, v->dt, (int64_t)j));
        break;
    }
#undef DECODE_LOOP
}

/* ---------------------------------------------------------- the kernel */

/* Pass-one accumulators of one tensor pair. */
struct acc {
    double sad, mad, srel, mrel, sab, saa, sbb, sdd, viol;
    int64_t nfin;
    int64_t nan1, inf1, nan2, inf2;
};

/*
 * The branch-free kernel for an all-finite block. Returns false, leaving acc
 * and ad_out untouched, when some element was not finite after all (the
 * check lane then holds NaN: x*0 is NaN exactly for Inf and NaN). When
 * ad_out is non-NULL every |d| is stored there for the percentile.
 */
static inline __attribute__((always_inline)) bool
kernel_body(const double *restrict a, const double *restrict b, size_t n, double atol, double rtol,
            struct acc *acc, double *restrict ad_out, const bool store)
{
    double sad[LANES] = {0}, mad[LANES] = {0}, srel[LANES] = {0}, mrel[LANES] = {0};
    double sab[LANES] = {0}, saa[LANES] = {0}, sbb[LANES] = {0}, sdd[LANES] = {0};
    double viol[LANES] = {0}, chk[LANES] = {0};
    size_t i = 0;

    for (; i + LANES <= n; i += LANES) {
        for (size_t j = 0; j < LANES; j++) {
            double x = a[i + j], y = b[i + j];
            double d = x - y, ad = fabs(d), ab = fabs(y);
            double den = ab > REL_EPS ? ab : REL_EPS;
            double rel = ad / den;
            chk[j] += (ad + ab) * 0.0;
            sad[j] += ad;
            mad[j] = ad > mad[j] ? ad : mad[j];
            srel[j] += rel;
            mrel[j] = rel > mrel[j] ? rel : mrel[j];
            viol[j] += ad > atol + rtol * ab ? 1.0 : 0.0;
            sab[j] += x * y;
            saa[j] += x * x;
            sbb[j] += y * y;
            sdd[j] += d * d;
            if (store)
                ad_out[i + j] = ad;
        }
    }
    for (; i < n; i++) {
        double x = a[i], y = b[i];
        double d = x - y, ad = fabs(d), ab = fabs(y);
        double den = ab > REL_EPS ? ab : REL_EPS;
        double rel = ad / den;
        chk[0] += (ad + ab) * 0.0;
        sad[0] += ad;
        mad[0] = ad > mad[0] ? ad : mad[0];
        srel[0] += rel;
        mrel[0] = rel > mrel[0] ? rel : mrel[0];
        viol[0] += ad > atol + rtol * ab ? 1.0 : 0.0;
        sab[0] += x * y;
        saa[0] += x * x;
        sbb[0] += y * y;
        sdd[0] += d * d;
        if (store)
            ad_out[i] = ad;
    }

    double c = 0;
    for (size_t j = 0; j < LANES; j++)
        c += chk[j];
    if (c != 0.0)
        return false;
    for (size_t j = 0; j < LANES; j++) {
        acc->sad += sad[j];
        acc->mad = mad[j] > acc->mad ? mad[j] : acc->mad;
        acc->srel += srel[j];
        acc->mrel = mrel[j] > acc->mrel ? mrel[j] : acc->mrel;
        acc->sab += sab[j];
        acc->saa += saa[j];
        acc->sbb += sbb[j];
        acc->sdd += sdd[j];
        acc->viol += viol[j];
    }
    acc->nfin += (int64_t)n;
    return true;
}

CMP_CLONES
static bool kernel_store(const double *restrict a, const double *restrict b, size_t n, double atol,
                         double rtol, struct acc *acc, double *restrict ad_out)
{
    return kernel_body(a, b, n, atol, rtol, acc, ad_out, true);
}

CMP_CLONES
static bool kernel_nostore(const double *restrict a, const double *restrict b, size_t n,
                           double atol, double rtol, struct acc *acc)
{
    return kernel_body(a, b, n, atol, rtol, acc, NULL, false);
}

/*
 * The careful loop for a block that holds NaN or Inf. A position where both
 * sides are NaN, or both are the same infinity, agrees; any other non-finite
 * position is one-sided (NaN takes precedence over Inf when both occur).
 * Returns how many |d| were stored (only finite pairs are).
 */
static size_t slow_block(const double *a, const double *b, size_t n, double atol, double rtol,
                         struct acc *acc, double *ad_out)
{
    size_t m = 0;
    for (size_t i = 0; i < n; i++) {
        double x = a[i], y = b[i];
        if (isfinite(x) && isfinite(y)) {
            double d = x - y, ad = fabs(d), ab = fabs(y);
            double rel = ad / (ab > REL_EPS ? ab : REL_EPS);
            acc->sad += ad;
            acc->mad = ad > acc->mad ? ad : acc->mad;
            acc->srel += rel;
            acc->mrel = rel > acc->mrel ? rel : acc->mrel;
            acc->viol += ad > atol + rtol * ab ? 1.0 : 0.0;
            acc->sab += x * y;
            acc->saa += x * x;
            acc->sbb += y * y;
            acc->sdd += d * d;
            acc->nfin++;
            if (ad_out)
                ad_out[m++] = ad;
        } else if (isnan(x) || isnan(y)) {
            if (isnan(x) && isnan(y))
                acc->nan2++;
            else
                acc->nan1++;
        } else if (x == y) {
            acc->inf2++;
        } else {
            acc->inf1++;
        }
    }
    return m;
}

/* ------------------------------------------------------ the percentile */

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
static double percentile_in(double *sel, size_t n, double q)
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
static void band_pass(const struct view *va, const struct view *vb, int64_t n, double *A, double *B,
                      struct cmp_scratch *s, struct band *bd)
{
    bd->shift = 0;
    while (bd->shift < 64 && ((bd->hi - bd->lo) >> bd->shift) >= NBUCKET)
        bd->shift++;
    bd->below = bd->in = 0;
    bd->kept = 0;
    bd->min_above = INFINITY;
    memset(s->hist, 0, sizeof(s->hist));
    /* a one-value band (heavy ties, e.g. mostly-zero errors) needs only counts */
    const bool single = bd->lo == bd->hi;

    for (int64_t start = 0; start < n; start += BLK) {
        size_t len = (size_t)(n - start < BLK ? n - start : BLK);
        decode_block(va, start, len, A);
        decode_block(vb, start, len, B);
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
static double percentile_large(const struct view *va, const struct view *vb, int64_t n,
                               int64_t nfin, size_t ns, struct cmp_scratch *s, double q)
{
    double A[BLK], B[BLK];
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
            for (size_t b1 = b0 + 1; b1 < NBUCKET && bd.lo + b1 <= bd.hi; b1++)
                if (s->hist[b1] > 0)
                    return lerp(v0, bitsd(bd.lo + b1), t);
            return lerp(v0, bd.min_above, t);
        }
        uint64_t nlo = bd.lo + ((uint64_t)b0 << bd.shift);
        uint64_t nhi = nlo + ((UINT64_C(1) << bd.shift) - 1);
        bd.lo = nlo;
        bd.hi = nhi < bd.hi ? nhi : bd.hi;
    }
    return NAN; /* unreachable: each narrowing divides the range by NBUCKET */
}

/* ------------------------------------------------------------ one pair */

bool cmp__recs_identical(const struct cmp__rec *a, const struct cmp__rec *b)
{
    if (a->hash == NULL || b->hash == NULL || strcmp(a->hash, b->hash) != 0)
        return false;
    if (a->dtype != b->dtype || strcmp(a->dtype_name, b->dtype_name) != 0)
        return false;
    if (a->ndim != b->ndim)
        return false;
    for (int i = 0; i < a->ndim; i++)
        if (a->shape[i] != b->shape[i])
            return false;
    return true;
}

static bool same_shape(const struct cmp__rec *a, const struct cmp__rec *b)
{
    if (a->ndim != b->ndim || a->numel != b->numel)
        return false;
    for (int i = 0; i < a->ndim; i++)
        if (a->shape[i] != b->shape[i])
            return false;
    return true;
}

static int64_t payload_elems(const struct cmp__rec *r)
{
    size_t isz = cmp__dtype_size(r->dtype);
    return isz ? (int64_t)(r->payload_len / isz) : 0;
}

/*
 * Statistics deltas are reported on every basis; on the statistics basis they
 * are also the test. Each check is a necessary condition of allclose, derived
 * from |a_i - b_i| <= atol + rtol*|b_i| for every finite position:
 *   |d min|, |d max| <= atol + rtol * max(|b.min|, |b.max|)
 *   |d mean|         <= atol + rtol * b.l2 / sqrt(nf)      (mean|b| <= rms b)
 *   |d l2|           <= atol * sqrt(nf) + rtol * b.l2      (triangle inequality)
 * so a failed check proves divergence, while passing them all only fails to
 * disprove it. A relative slack of 1e-12 absorbs rounding in the stats.
 */
static void stats_checks(const struct cmp__rec *h, const struct cmp__rec *c, double atol,
                         double rtol, struct cmp_metrics *m, bool test)
{
    const struct cmp_stats *a = &h->stats, *b = &c->stats;
    m->d_min = m->d_max = m->d_mean = m->d_l2 = NAN;
    if (a->has_finite && b->has_finite) {
        m->d_min = a->min - b->min;
        m->d_max = a->max - b->max;
        m->d_mean = a->mean - b->mean;
        m->d_l2 = a->l2 - b->l2;
    }
    if (!test)
        return;
    int64_t dn = a->nan - b->nan;
    int64_t dinf = llabs(a->pinf - b->pinf) + llabs(a->ninf - b->ninf);
    if (llabs(dn) > m->nan_one_sided)
        m->nan_one_sided = llabs(dn);
    if (dinf > m->inf_one_sided)
        m->inf_one_sided = dinf;
    if (a->has_finite != b->has_finite) {
        m->stat_violations++;
        return;
    }
    if (!a->has_finite)
        return;
    const double slack = 1.0 + 1e-12;
    double big = fmax(fabs(b->min), fabs(b->max));
    double nf = (double)(c->numel - b->nan - b->pinf - b->ninf);
    double rms = nf > 0 ? b->l2 / sqrt(nf) : 0.0;
    double bound_mm = (atol + rtol * big) * slack;
    if (!(fabs(m->d_min) <= bound_mm))
        m->stat_violations++;
    if (!(fabs(m->d_max) <= bound_mm))
        m->stat_violations++;
    if (!(fabs(m->d_mean) <= (atol + rtol * rms) * slack))
        m->stat_violations++;
    if (!(fabs(m->d_l2) <= (atol * sqrt(nf > 0 ? nf : 0) + rtol * b->l2) * slack))
        m->stat_violations++;
}

static void clear_elements(struct cmp_metrics *m)
{
    m->max_abs = m->mean_abs = m->p99_abs = NAN;
    m->max_rel = m->mean_rel = NAN;
    m->cosine = m->sqnr_db = m->nl2 = NAN;
}

/*
 * The element metrics of the pair over n compared positions of the two views.
 * Fills m's element fields and returns the number of finite pairs.
 */
static int element_metrics(const struct view *va, const struct view *vb, int64_t n, double atol,
                           double rtol, struct cmp_scratch *s, struct cmp_metrics *m)
{
    double A[BLK], B[BLK];
    struct acc acc = {0};
    bool keep_all = n <= CMP_SCRATCH_MAX_ELEMS;
    int rc = scratch_reserve(s, keep_all ? (size_t)n : CMP_SCRATCH_MAX_ELEMS);
    if (rc < 0)
        return rc;

    /* int64 beyond 2^53 can differ yet decode to the same double */
    bool raw64 = va->dt == CMP_DTYPE_INT64 && vb->dt == CMP_DTYPE_INT64 && atol == 0 && rtol == 0;
    int64_t stride = n / NSAMPLE + 1, next_sample = 0;
    size_t ns = 0, kept = 0;

    for (int64_t start = 0; start < n; start += BLK) {
        size_t len = (size_t)(n - start < BLK ? n - start : BLK);
        decode_block(va, start, len, A);
        decode_block(vb, start, len, B);
        if (keep_all) {
            if (kernel_store(A, B, len, atol, rtol, &acc, s->sel + kept))
                kept += len;
            else
                kept += slow_block(A, B, len, atol, rtol, &acc, s->sel + kept);
        } else {
            if (!kernel_nostore(A, B, len, atol, rtol, &acc))
                slow_block(A, B, len, atol, rtol, &acc, NULL);
            for (; next_sample < start + (int64_t)len; next_sample += stride) {
                double x = A[next_sample - start], y = B[next_sample - start];
                if (isfinite(x) && isfinite(y) && ns < NSAMPLE)
                    s->sample[ns++] = fabs(x - y);
            }
        }
        if (raw64) {
            for (size_t i = 0; i < len; i++) {
                if (A[i] != B[i])
                    continue;
                int64_t ia = view_index(va, start + (int64_t)i);
                int64_t ib = view_index(vb, start + (int64_t)i);
                if (ld64(va->p + 8 * ia) != ld64(vb->p + 8 * ib))
                    acc.viol += 1.0;
            }
        }
    }

    m->n = n;
    m->n_finite = acc.nfin;
    m->allclose_violations = (int64_t)acc.viol;
    m->nan_one_sided = acc.nan1;
    m->inf_one_sided = acc.inf1;
    m->nan_both = acc.nan2;
    m->inf_both = acc.inf2;
    if (acc.nfin == 0) {
        clear_elements(m);
        return 0;
    }
    double nf = (double)acc.nfin;
    m->max_abs = acc.mad;
    m->mean_abs = acc.sad / nf;
    m->max_rel = acc.mrel;
    m->mean_rel = acc.srel / nf;
    if (keep_all)
        m->p99_abs = percentile_in(s->sel, kept, 0.99);
    else
        m->p99_abs = percentile_large(va, vb, n, acc.nfin, ns, s, 0.99);

    /* cosine: 1 for two zero vectors, 0 when only one is zero */
    double na = sqrt(acc.saa), nb = sqrt(acc.sbb);
    if (na == 0 && nb == 0)
        m->cosine = 1.0;
    else if (na == 0 || nb == 0)
        m->cosine = 0.0;
    else
        m->cosine = fmax(-1.0, fmin(1.0, acc.sab / na / nb));
    /* SQNR: +inf for no error, -inf for error against an all-zero control */
    if (acc.sdd == 0)
        m->sqnr_db = INFINITY;
    else if (acc.sbb == 0)
        m->sqnr_db = -INFINITY;
    else
        m->sqnr_db = 10.0 * log10(acc.sbb / acc.sdd);
    if (acc.sdd == 0)
        m->nl2 = 0.0;
    else if (acc.sbb == 0)
        m->nl2 = INFINITY;
    else
        m->nl2 = sqrt(acc.sdd / acc.sbb);
    return 0;
}

/*
 * Picks the basis: full payloads on both sides; else a shared sample (both
 * sampled with the same count, or one full payload gathered at the other's
 * sample positions); else statistics only.
 */
static enum cmp_basis choose_basis(const struct cmp__rec *h, const struct cmp__rec *c,
                                   struct view *vh, struct view *vc, int64_t *n)
{
    int64_t kh = payload_elems(h), kc = payload_elems(c);
    *vh = (struct view){.p = h->payload, .dt = h->dtype, .numel = h->numel};
    *vc = (struct view){.p = c->payload, .dt = c->dtype, .numel = c->numel};
    if (h->capture == CMP_CAPTURE_NONE || c->capture == CMP_CAPTURE_NONE || kh == 0 || kc == 0)
        return CMP_BASIS_STATS;
    if (h->capture == CMP_CAPTURE_FULL && c->capture == CMP_CAPTURE_FULL) {
        *n = h->numel;
        return CMP_BASIS_FULL;
    }
    if (h->capture == CMP_CAPTURE_SAMPLE && c->capture == CMP_CAPTURE_SAMPLE) {
        if (kh != kc)
            return CMP_BASIS_STATS;
        *n = kh;
        return CMP_BASIS_SAMPLE;
    }
    if (h->capture == CMP_CAPTURE_FULL) {
        vh->gather_k = kc;
        *n = kc;
    } else {
        vc->gather_k = kh;
        *n = kh;
    }
    return CMP_BASIS_SAMPLE;
}

int cmp__rec_compare(const struct cmp__rec *h, const struct cmp__rec *c, const struct cmp_tol *tol,
                     struct cmp_scratch *s, struct cmp_metrics *m)
{
    memset(m, 0, sizeof(*m));
    m->atol = tol->atol;
    m->rtol = tol->rtol;
    clear_elements(m);
    m->d_min = m->d_max = m->d_mean = m->d_l2 = NAN;

    if (cmp__recs_identical(h, c)) {
        m->basis = CMP_BASIS_EXACT;
        m->within_tol = true;
        return 0;
    }
    if (h->dtype != c->dtype || strcmp(h->dtype_name, c->dtype_name) != 0)
        m->mismatch = CMP_MISMATCH_DTYPE;
    else if (!same_shape(h, c))
        m->mismatch = CMP_MISMATCH_SHAPE;
    if (m->mismatch != CMP_MISMATCH_NONE) {
        m->basis = CMP_BASIS_STATS;
        stats_checks(h, c, tol->atol, tol->rtol, m, false);
        m->within_tol = false;
        return 0;
    }

    struct view vh, vc;
    int64_t n = 0;
    m->basis = choose_basis(h, c, &vh, &vc, &n);
    if (m->basis != CMP_BASIS_STATS) {
        int rc = element_metrics(&vh, &vc, n, tol->atol, tol->rtol, s, m);
        if (rc < 0)
            return rc;
    }
    /* a sample can miss what the exact statistics still show */
    stats_checks(h, c, tol->atol, tol->rtol, m, m->basis != CMP_BASIS_FULL);
    m->within_tol = m->allclose_violations == 0 && m->stat_violations == 0 &&
                    m->nan_one_sided == 0 && m->inf_one_sided == 0;
    return 0;
}

int cmp_tensor_compare(const struct cmp_tensor *head, const struct cmp_tensor *control,
                       const struct cmp_tol *tol, struct cmp_scratch *scratch,
                       struct cmp_metrics *out)
{
    struct cmp__rec h, c;
    const char *mod;
    size_t mlen;
    struct cmp_scratch *own = NULL;
    struct cmp_tol t;
    int rc;

    if (out == NULL)
        return -EINVAL;
    rc = cmp__rec_from_tensor(head, &h, &mod, &mlen);
    if (rc < 0)
        goto out;
    rc = cmp__rec_from_tensor(control, &c, &mod, &mlen);
    if (rc < 0)
        goto out;
    if (tol != NULL) {
        t = *tol;
    } else {
        struct cmp_options o;
        cmp_options_init(&o);
        t = o.tol[c.dtype];
    }
    if (scratch == NULL) {
        rc = cmp_scratch_new(&own);
        if (rc < 0)
            goto out;
        scratch = own;
    }
    rc = cmp__rec_compare(&h, &c, &t, scratch, out);
out:
    cmp_scratch_free(own);
    return rc;
}
