/*
 * runner/native/capd_analysis.c - the runner's tensor statistics in one call.
 *
 * The capture runner (runner/capd_runner) computes, for every snapshot of a
 * tensor, min, max, mean, std, L2 norm and the NaN/+Inf/-Inf/zero counts. With
 * torch alone that is a handful of operator calls per tensor, and each call
 * releases and re-takes the GIL, which the model's thread wants back between
 * its kernels: the analysis worker then steals time from the model it
 * observes. This library does the whole tensor in one foreign call (ctypes
 * releases the GIL once for its whole duration), reading the memory once.
 *
 * It depends on nothing but libc and libm and knows nothing of Python or
 * torch: the runner passes a pointer to a C-contiguous little-endian buffer,
 * an element count and a dtype code (CAPD_DT_*, in capd_analysis.h and
 * mirrored in runner/capd_runner/native.py). The values are the same
 * definitions as the runner's torch engine (tensors.StatsEngine): everything in float64 over the
 * finite values, min/max exact, a centred second pass when E[x^2] - mean^2
 * has lost more than 4 digits. Sums are taken in a fixed order (8 lanes,
 * then the lanes in order) so a result depends only on the bytes, never on
 * the CPU: the same tensor gives the same bits at every dispatch width.
 */
#include <math.h>
#include <stdint.h>
#include <string.h>

#include "runner/native/capd_analysis.h"

#define LANES 8

#ifdef CAPD_STATS_AVX2
void capd__acc_f32_avx2(const float *x, int64_t n, double *s, double *q, double *lo, double *hi,
                        int64_t *nz); /* capd_stats_avx2.c */
#endif

int capd_analysis_abi(void)
{
    return CAPD_ANALYSIS_ABI;
}

static inline double f16_to_double(uint16_t h)
{
    int sign = h >> 15, exp = (h >> 10) & 0x1f, man = h & 0x3ff;
    double v;
    if (exp == 0)
        v = ldexp((double)man, -24);
    else if (exp == 31)
        v = man ? NAN : INFINITY;
    else
        v = ldexp((double)(man | 0x400), exp - 25);
    return sign ? -v : v;
}

static inline double bf16_to_double(uint16_t b)
{
    uint32_t u = (uint32_t)b << 16;
    float f;
    memcpy(&f, &u, sizeof f);
    return (double)f;
}

/* Element i of type T at p, unaligned (a snapshot is aligned, a caller's
 * buffer need not be). */
#define ELEM(T, p, i)                                                                              \
    ({                                                                                             \
        T v_;                                                                                      \
        memcpy(&v_, (p) + sizeof(T) * (size_t)(i), sizeof v_);                                     \
        v_;                                                                                        \
    })

/* The value of element i as a double, whatever the dtype. */
static inline double load(const unsigned char *p, int64_t i, int dt)
{
    switch (dt) {
    case CAPD_DT_F32:
        return ELEM(float, p, i);
    case CAPD_DT_F64:
        return ELEM(double, p, i);
    case CAPD_DT_F16:
        return f16_to_double(ELEM(uint16_t, p, i));
    case CAPD_DT_BF16:
        return bf16_to_double(ELEM(uint16_t, p, i));
    case CAPD_DT_I64:
        return (double)ELEM(int64_t, p, i);
    case CAPD_DT_I32:
        return ELEM(int32_t, p, i);
    case CAPD_DT_I16:
        return ELEM(int16_t, p, i);
    case CAPD_DT_I8:
        return (int8_t)p[i];
    case CAPD_DT_U8:
        return p[i];
    default: /* CAPD_DT_BOOL */
        return p[i] != 0;
    }
}

struct acc {
    double s[LANES], q[LANES], lo[LANES], hi[LANES];
    int64_t nz[LANES];
};

static void acc_init(struct acc *a)
{
    for (int j = 0; j < LANES; j++) {
        a->s[j] = a->q[j] = 0.0;
        a->lo[j] = INFINITY;
        a->hi[j] = -INFINITY;
        a->nz[j] = 0;
    }
}

/* One value into lane j. A NaN leaves min/max alone (the comparisons are
 * false) and shows in the sums, which send the tensor to the exact path. */
#define ACC_ONE(a, j, v)                                                                           \
    do {                                                                                           \
        (a)->s[j] += (v);                                                                          \
        (a)->q[j] += (v) * (v);                                                                    \
        (a)->lo[j] = (v) < (a)->lo[j] ? (v) : (a)->lo[j];                                          \
        (a)->hi[j] = (v) > (a)->hi[j] ? (v) : (a)->hi[j];                                          \
        (a)->nz[j] += (v) != 0.0;                                                                  \
    } while (0)

/* The case of dtype DT, whose elements are C type T read in place: lane j
 * takes elements i with i % LANES == j. */
#define ACC_CASE(DT, T)                                                                            \
    case DT: {                                                                                     \
        const T *x = (const T *)(const void *)p;                                                   \
        int64_t full = n - n % LANES;                                                              \
        for (int64_t i = 0; i < full; i += LANES) {                                                \
            for (int j = 0; j < LANES; j++) {                                                      \
                double v = (double)x[i + j];                                                       \
                ACC_ONE(a, j, v);                                                                  \
            }                                                                                      \
        }                                                                                          \
        for (int64_t i = full; i < n; i++) {                                                       \
            double v = (double)x[i];                                                               \
            ACC_ONE(a, i - full, v);                                                               \
        }                                                                                          \
        return;                                                                                    \
    }

/* The fast pass for the dtypes read in place; the others go through load(). */
__attribute__((target_clones("avx2", "default"))) static void
accumulate(const unsigned char *p, int64_t n, int dt, struct acc *a)
{
    switch (dt) {
        ACC_CASE(CAPD_DT_F32, float)
        ACC_CASE(CAPD_DT_F64, double)
        ACC_CASE(CAPD_DT_I32, int32_t)
        ACC_CASE(CAPD_DT_I64, int64_t)
    default:
        break;
    }
    for (int64_t i = 0; i < n; i++) {
        double v = load(p, i, dt);
        ACC_ONE(a, i % LANES, v);
    }
}

/* sum of (x - mean)^2 over the finite values, lanes as above. */
static double centred(const unsigned char *p, int64_t n, int dt, double mean)
{
    double c[LANES] = {0};
    for (int64_t i = 0; i < n; i++) {
        double v = load(p, i, dt);
        if (isfinite(v)) {
            double d = v - mean;
            c[i % LANES] += d * d;
        }
    }
    double css = 0.0;
    for (int j = 0; j < LANES; j++)
        css += c[j];
    return css;
}

/* Any NaN or infinity (or a sum that overflowed): counts, then the stats of
 * the finite values, mean first and the spread about it. */
static void nonfinite(const unsigned char *p, int64_t n, int dt, double *out)
{
    int64_t nan = 0, pinf = 0, ninf = 0, zeros = 0, nf = 0;
    double s[LANES] = {0}, q[LANES] = {0}, lo = INFINITY, hi = -INFINITY;
    for (int64_t i = 0; i < n; i++) {
        double v = load(p, i, dt);
        if (isnan(v)) {
            nan++;
            continue;
        }
        if (isinf(v)) {
            if (v > 0)
                pinf++;
            else
                ninf++;
            continue;
        }
        zeros += v == 0.0;
        s[nf % LANES] += v;
        q[nf % LANES] += v * v;
        lo = v < lo ? v : lo;
        hi = v > hi ? v : hi;
        nf++;
    }
    out[CAPD_OUT_NAN] = (double)nan;
    out[CAPD_OUT_PINF] = (double)pinf;
    out[CAPD_OUT_NINF] = (double)ninf;
    out[CAPD_OUT_ZEROS] = (double)zeros;
    out[CAPD_OUT_NFINITE] = (double)nf;
    if (nf == 0) {
        out[CAPD_OUT_MIN] = out[CAPD_OUT_MAX] = out[CAPD_OUT_MEAN] = out[CAPD_OUT_STD] =
            out[CAPD_OUT_L2] = NAN;
        return;
    }
    double total = 0.0, sumsq = 0.0;
    for (int j = 0; j < LANES; j++) {
        total += s[j];
        sumsq += q[j];
    }
    double mean = total / (double)nf;
    out[CAPD_OUT_MIN] = lo;
    out[CAPD_OUT_MAX] = hi;
    out[CAPD_OUT_MEAN] = mean;
    out[CAPD_OUT_STD] = sqrt(centred(p, n, dt, mean) / (double)nf);
    out[CAPD_OUT_L2] = sqrt(sumsq);
}

/*
 * Stats of n elements of dtype dt at data into out[CAPD_OUT_N]: min, max, mean,
 * std, l2 (NaN where undefined or not finite: the runner reports null), and
 * the nan/+inf/-inf/zero counts and the finite count. Returns 0, or -1 for
 * an unknown dtype.
 */
int capd_stats(const void *data, int64_t n, int dtype, double *out)
{
    const unsigned char *p = data;
    if (dtype < CAPD_DT_F32 || dtype > CAPD_DT_BOOL || n < 0)
        return -1;
    for (int i = 0; i < CAPD_OUT_N; i++)
        out[i] = 0.0;
    if (n == 0) {
        out[CAPD_OUT_MIN] = out[CAPD_OUT_MAX] = out[CAPD_OUT_MEAN] = out[CAPD_OUT_STD] =
            out[CAPD_OUT_L2] = NAN;
        return 0;
    }
    struct acc a;
    acc_init(&a);
#ifdef CAPD_STATS_AVX2
    /* float32 (nearly every tensor a model records) by the AVX2 loop where
     * the CPU has it: the same lanes, the same bits (capd_stats_avx2.c). */
    if (dtype == CAPD_DT_F32 && __builtin_cpu_supports("avx2"))
        capd__acc_f32_avx2(data, n, a.s, a.q, a.lo, a.hi, a.nz);
    else
#endif
        accumulate(p, n, dtype, &a);
    double total = 0.0, sumsq = 0.0, lo = INFINITY, hi = -INFINITY;
    int64_t nonzero = 0;
    for (int j = 0; j < LANES; j++) {
        total += a.s[j];
        sumsq += a.q[j];
        lo = a.lo[j] < lo ? a.lo[j] : lo;
        hi = a.hi[j] > hi ? a.hi[j] : hi;
        nonzero += a.nz[j];
    }
    if (!(isfinite(total) && isfinite(sumsq) && isfinite(lo) && isfinite(hi))) {
        nonfinite(p, n, dtype, out);
        return 0;
    }
    double mean = total / (double)n, msq = sumsq / (double)n;
    double var = msq - mean * mean;
    if (var <= 1e-4 * msq)
        var = centred(p, n, dtype, mean) / (double)n; /* lost > 4 digits */
    out[CAPD_OUT_MIN] = lo;
    out[CAPD_OUT_MAX] = hi;
    out[CAPD_OUT_MEAN] = mean;
    out[CAPD_OUT_STD] = sqrt(var > 0.0 ? var : 0.0);
    out[CAPD_OUT_L2] = sqrt(sumsq);
    out[CAPD_OUT_ZEROS] = (double)(n - nonzero);
    out[CAPD_OUT_NFINITE] = (double)n;
    return 0;
}
