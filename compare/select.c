/*
 * compare/select.c - k-th smallest element without sorting.
 *
 * Percentiles and medians need one or two order statistics, not a sorted
 * array, so a quickselect does in expected linear time what a sort does in
 * n log n. Two details matter for our data: absolute errors are often
 * massively tied (a tensor that is mostly bit-equal has millions of zero
 * errors), which degrades a two-way partition to quadratic time, so the
 * partition is three-way; and data can be sorted or adversarially ordered,
 * so the pivot is the median of three pseudo-random elements (a fixed-seed
 * generator: the result never depends on it, only the running time).
 */
#include "compare/cmp_int.h"

static uint64_t xorshift(uint64_t *s)
{
    uint64_t x = *s;
    x ^= x << 13;
    x ^= x >> 7;
    x ^= x << 17;
    *s = x;
    return x;
}

#define DEFINE_SELECT(NAME, T)                                                                     \
    static T NAME##_med3(T a, T b, T c)                                                            \
    {                                                                                              \
        if (a < b) {                                                                               \
            if (b < c)                                                                             \
                return b;                                                                          \
            return a < c ? c : a;                                                                  \
        }                                                                                          \
        if (a < c)                                                                                 \
            return a;                                                                              \
        return b < c ? c : b;                                                                      \
    }                                                                                              \
                                                                                                   \
    static T NAME(T *v, size_t n, size_t k)                                                        \
    {                                                                                              \
        uint64_t seed = 0x9e3779b97f4a7c15ull;                                                     \
        size_t lo = 0, hi = n; /* the answer is in v[lo..hi) */                                    \
        while (hi - lo > 16) {                                                                     \
            size_t m = hi - lo;                                                                    \
            T p = NAME##_med3(v[lo + xorshift(&seed) % m], v[lo + xorshift(&seed) % m],            \
                              v[lo + xorshift(&seed) % m]);                                        \
            /* Dutch national flag: [lo,lt) < p, [lt,i) == p, (gt,hi) > p */                       \
            size_t lt = lo, i = lo, gt = hi;                                                       \
            while (i < gt) {                                                                       \
                T x = v[i];                                                                        \
                if (x < p) {                                                                       \
                    v[i++] = v[lt];                                                                \
                    v[lt++] = x;                                                                   \
                } else if (x > p) {                                                                \
                    v[i] = v[--gt];                                                                \
                    v[gt] = x;                                                                     \
                } else {                                                                           \
                    i++;                                                                           \
                }                                                                                  \
            }                                                                                      \
            if (k < lt)                                                                            \
                hi = lt;                                                                           \
            else if (k >= gt)                                                                      \
                lo = gt;                                                                           \
            else                                                                                   \
                return p;                                                                          \
        }                                                                                          \
        /* insertion sort of the small rest */                                                     \
        for (size_t i = lo + 1; i < hi; i++) {                                                     \
            T x = v[i];                                                                            \
            size_t j = i;                                                                          \
            while (j > lo && v[j - 1] > x) {                                                       \
                v[j] = v[j - 1];                                                                   \
                j--;                                                                               \
            }                                                                                      \
            v[j] = x;                                                                              \
        }                                                                                          \
        return v[k];                                                                               \
    }

DEFINE_SELECT(select_d, double)
DEFINE_SELECT(select_i64, int64_t)

/*
 * Callers must not pass NaN (they only select finite absolute errors and
 * integer timings); after the call v[0..k) <= v[k] <= v[k+1..n).
 */
double cmp__select_d(double *v, size_t n, size_t k)
{
    return select_d(v, n, k);
}

int64_t cmp__select_i64(int64_t *v, size_t n, size_t k)
{
    return select_i64(v, n, k);
}
