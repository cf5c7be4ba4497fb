/*
 * compare/metrics.c - the one pass over a tensor pair's payloads that gives
 * every element metric except the 99th percentile (metrics_pct.c).
 *
 * a = head, b = control, d = a - b, everything in double. The pass walks the
 * data in blocks: a block of each side is decoded into a small double buffer
 * (a loop the compiler vectorizes for every dtype, including the
 * float16/bfloat16 bit tricks), then one branch-free kernel accumulates all
 * sums and maxima in a few independent lanes. Lanes matter: C forbids
 * reassociating floating-point additions, so a single accumulator would
 * serialize the loop on the add latency and could not use SIMD; fixed lanes
 * make the vector code legal and the result independent of the CPU. The
 * kernel assumes finite input and carries a check value that turns NaN if
 * that assumption fails; such a block (rare: only tensors that contain
 * NaN/Inf) is redone by a careful scalar loop that classifies non-finite
 * positions. Small tensors keep every |d| for the percentile; large ones
 * keep a strided sample of it.
 */
#include <errno.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "compare/metrics_int.h"

#define LANES   4                     /* independent accumulators per statistic */
#define REL_EPS 2.220446049250313e-16 /* the denominator floor of relative error */

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
static inline int64_t view_index(const struct cmp__view *v, int64_t i)
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
void cmp__decode_block(const struct cmp__view *v, int64_t start, size_t n, double *restrict out)
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

/* ------------------------------------------------------ the element pass */

/* The pass's state over the blocks of one pair. */
struct pass {
    const struct cmp__view *va, *vb;
    double atol, rtol;
    struct cmp_scratch *s;
    struct acc acc;
    bool keep_all; /* every |d| goes to s->sel; else a strided sample to s->sample */
    bool raw64;    /* int64 at zero tolerance: compare the raw words too */
    int64_t stride, next_sample;
    size_t ns, kept; /* |d| in s->sample, in s->sel */
};

/* One decoded block [start, start+len) of both sides into the pass. */
static void pass_block(struct pass *p, int64_t start, size_t len, const double *A, const double *B)
{
    struct cmp_scratch *s = p->s;
    if (p->keep_all) {
        if (kernel_store(A, B, len, p->atol, p->rtol, &p->acc, s->sel + p->kept))
            p->kept += len;
        else
            p->kept += slow_block(A, B, len, p->atol, p->rtol, &p->acc, s->sel + p->kept);
    } else {
        if (!kernel_nostore(A, B, len, p->atol, p->rtol, &p->acc))
            slow_block(A, B, len, p->atol, p->rtol, &p->acc, NULL);
        for (; p->next_sample < start + (int64_t)len; p->next_sample += p->stride) {
            double x = A[p->next_sample - start], y = B[p->next_sample - start];
            if (isfinite(x) && isfinite(y) && p->ns < CMP__NSAMPLE)
                s->sample[p->ns++] = fabs(x - y);
        }
    }
    if (p->raw64) {
        for (size_t i = 0; i < len; i++) {
            if (A[i] != B[i])
                continue;
            int64_t ia = view_index(p->va, start + (int64_t)i);
            int64_t ib = view_index(p->vb, start + (int64_t)i);
            if (ld64(p->va->p + 8 * ia) != ld64(p->vb->p + 8 * ib))
                p->acc.viol += 1.0;
        }
    }
}

/* Cosine, SQNR and the normalized L2 error from the pass's sums. */
static void similarity(const struct acc *acc, struct cmp_metrics *m)
{
    /* cosine: 1 for two zero vectors, 0 when only one is zero */
    double na = sqrt(acc->saa), nb = sqrt(acc->sbb);
    if (na == 0 && nb == 0)
        m->cosine = 1.0;
    else if (na == 0 || nb == 0)
        m->cosine = 0.0;
    else
        m->cosine = fmax(-1.0, fmin(1.0, acc->sab / na / nb));
    /* SQNR: +inf for no error, -inf for error against an all-zero control */
    if (acc->sdd == 0)
        m->sqnr_db = INFINITY;
    else if (acc->sbb == 0)
        m->sqnr_db = -INFINITY;
    else
        m->sqnr_db = 10.0 * log10(acc->sbb / acc->sdd);
    if (acc->sdd == 0)
        m->nl2 = 0.0;
    else if (acc->sbb == 0)
        m->nl2 = INFINITY;
    else
        m->nl2 = sqrt(acc->sdd / acc->sbb);
}

int cmp__element_metrics(const struct cmp__view *va, const struct cmp__view *vb, int64_t n,
                         double atol, double rtol, struct cmp_scratch *s, struct cmp_metrics *m)
{
    double A[CMP__BLK], B[CMP__BLK];
    struct pass p = {.va = va, .vb = vb, .atol = atol, .rtol = rtol, .s = s};
    p.keep_all = n <= CMP_SCRATCH_MAX_ELEMS;
    int rc = scratch_reserve(s, p.keep_all ? (size_t)n : CMP_SCRATCH_MAX_ELEMS);
    if (rc < 0)
        return rc;

    /* int64 beyond 2^53 can differ yet decode to the same double */
    p.raw64 = va->dt == CMP_DTYPE_INT64 && vb->dt == CMP_DTYPE_INT64 && atol == 0 && rtol == 0;
    p.stride = n / CMP__NSAMPLE + 1;
    for (int64_t start = 0; start < n; start += CMP__BLK) {
        size_t len = (size_t)(n - start < CMP__BLK ? n - start : CMP__BLK);
        cmp__decode_block(va, start, len, A);
        cmp__decode_block(vb, start, len, B);
        pass_block(&p, start, len, A, B);
    }

    const struct acc *acc = &p.acc;
    m->n = n;
    m->n_finite = acc->nfin;
    m->allclose_violations = (int64_t)acc->viol;
    m->nan_one_sided = acc->nan1;
    m->inf_one_sided = acc->inf1;
    m->nan_both = acc->nan2;
    m->inf_both = acc->inf2;
    if (acc->nfin == 0) {
        cmp__clear_elements(m);
        return 0;
    }
    double nf = (double)acc->nfin;
    m->max_abs = acc->mad;
    m->mean_abs = acc->sad / nf;
    m->max_rel = acc->mrel;
    m->mean_rel = acc->srel / nf;
    if (p.keep_all)
        m->p99_abs = cmp__percentile_in(s->sel, p.kept, 0.99);
    else
        m->p99_abs = cmp__percentile_large(va, vb, n, acc->nfin, p.ns, s, 0.99);
    similarity(acc, m);
    return 0;
}
