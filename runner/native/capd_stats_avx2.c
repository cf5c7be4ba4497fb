/*
 * runner/native/capd_stats_avx2.c - the float32 stats pass built for AVX2.
 *
 * This file alone is compiled with -mavx2 -ffp-contract=off (CMakeLists.txt,
 * on x86-64); capd_analysis.c calls it only on a CPU that has AVX2. It is
 * the loop of capd_analysis.c's accumulate() for float32, written so that
 * every lane does the very operations that loop does, in the same order:
 * lane j takes the elements i with i % 8 == j, adds the value as a double
 * to its sum and its square (a multiply, then an add: never a fused one) to
 * its sum of squares, so the sums are the same bits as the generic build's.
 * What it does differently is free of rounding: min and max run on the
 * floats themselves (converting a float to double is exact and keeps the
 * order, and min_ps/max_ps are the same "v < lo ? v : lo" selection, NaN
 * included), and the non-zero count is kept in 32-bit lanes, emptied into
 * the 64-bit counts before it can wrap. The compiler's own vectorization of
 * the generic loop spends about half its instructions on the double min/max
 * and on widening the counts: the stats pass is on the hook's path (the
 * analysis runs in the hook), and this one reads about 1.5 times as fast.
 */
#include <immintrin.h>
#include <stdint.h>

void capd__acc_f32_avx2(const float *x, int64_t n, double *s, double *q, double *lo, double *hi,
                        int64_t *nz);

/* Iterations between two empties of the 32-bit counts, well below 2^31. */
#define COUNT_CHUNK ((int64_t)1 << 28)

/* The first n floats at x into the 8 lanes s, q, lo, hi, nz (the fields of
 * capd_analysis.c's struct acc), which hold the lanes' state on entry. */
void capd__acc_f32_avx2(const float *x, int64_t n, double *s, double *q, double *lo, double *hi,
                        int64_t *nz)
{
    __m256d s0 = _mm256_loadu_pd(s), s1 = _mm256_loadu_pd(s + 4);
    __m256d q0 = _mm256_loadu_pd(q), q1 = _mm256_loadu_pd(q + 4);
    __m256 vlo = _mm256_setr_m128(_mm256_cvtpd_ps(_mm256_loadu_pd(lo)),
                                  _mm256_cvtpd_ps(_mm256_loadu_pd(lo + 4)));
    __m256 vhi = _mm256_setr_m128(_mm256_cvtpd_ps(_mm256_loadu_pd(hi)),
                                  _mm256_cvtpd_ps(_mm256_loadu_pd(hi + 4)));
    const __m256 zero = _mm256_setzero_ps();
    int64_t full = n - n % 8;
    for (int64_t base = 0; base < full;) {
        int64_t end = full - base > COUNT_CHUNK * 8 ? base + COUNT_CHUNK * 8 : full;
        __m256i cnt = _mm256_setzero_si256();
        for (int64_t i = base; i < end; i += 8) {
            __m256 v = _mm256_loadu_ps(x + i);
            vlo = _mm256_min_ps(v, vlo);
            vhi = _mm256_max_ps(v, vhi);
            /* all ones (-1) where v != 0, NaN included, as (v) != 0.0 */
            cnt = _mm256_sub_epi32(cnt, _mm256_castps_si256(_mm256_cmp_ps(v, zero, _CMP_NEQ_UQ)));
            __m256d d0 = _mm256_cvtps_pd(_mm256_castps256_ps128(v));
            __m256d d1 = _mm256_cvtps_pd(_mm256_extractf128_ps(v, 1));
            s0 = _mm256_add_pd(s0, d0);
            s1 = _mm256_add_pd(s1, d1);
            q0 = _mm256_add_pd(q0, _mm256_mul_pd(d0, d0));
            q1 = _mm256_add_pd(q1, _mm256_mul_pd(d1, d1));
        }
        int32_t c[8];
        _mm256_storeu_si256((__m256i *)(void *)c, cnt);
        for (int j = 0; j < 8; j++)
            nz[j] += c[j];
        base = end;
    }
    _mm256_storeu_pd(s, s0);
    _mm256_storeu_pd(s + 4, s1);
    _mm256_storeu_pd(q, q0);
    _mm256_storeu_pd(q + 4, q1);
    float l[8], h[8];
    _mm256_storeu_ps(l, vlo);
    _mm256_storeu_ps(h, vhi);
    for (int j = 0; j < 8; j++) {
        lo[j] = l[j];
        hi[j] = h[j];
    }
    /* The tail, lane i - full, as the generic loop. */
    for (int64_t i = full; i < n; i++) {
        int j = (int)(i - full);
        double v = x[i];
        s[j] += v;
        q[j] += v * v;
        lo[j] = v < lo[j] ? v : lo[j];
        hi[j] = v > hi[j] ? v : hi[j];
        nz[j] += v != 0.0;
    }
}
