/*
 * compare/metrics_int.h - what the files of the tensor metrics share and
 * nobody else sees: the scratch space, a side's view of its payload, and
 * the stages of one pair's element metrics.
 *
 * metrics_pair.c decides how a record pair is compared (its basis) and runs
 * the statistics checks; metrics.c makes the one pass over the payloads
 * (decoding and the accumulating kernels); metrics_pct.c finds the exact
 * 99th percentile of |d|, re-decoding the payloads when the pass could not
 * keep every value.
 */
#ifndef CAPD_COMPARE_METRICS_INT_H
#define CAPD_COMPARE_METRICS_INT_H

#include <math.h>

#include "compare/cmp_int.h"

#define CMP__BLK     1024  /* elements decoded per block */
#define CMP__NSAMPLE 16384 /* |d| sample that brackets the percentile */
#define CMP__NBUCKET 4096  /* histogram buckets when narrowing the bracket */

struct cmp_scratch {
    double *sel; /* up to CMP_SCRATCH_MAX_ELEMS |d| values */
    size_t sel_cap;
    double sample[CMP__NSAMPLE + 1];
    int64_t hist[CMP__NBUCKET];
};

/*
 * One side's elements as the comparison sees them: either the payload as is
 * (gather_k == 0), or positions floor(i * numel / k) of a full payload, which
 * are exactly the positions the runner samples, so a full payload can be
 * compared with the other side's sample.
 */
struct cmp__view {
    const unsigned char *p;
    enum cmp_dtype dt;
    int64_t numel;
    int64_t gather_k;
};

/* metrics.c: decodes compared positions [start, start+n) of v into out. */
void cmp__decode_block(const struct cmp__view *v, int64_t start, size_t n, double *restrict out);

/*
 * metrics.c: the element metrics of a pair over n compared positions of the
 * two views. Fills m's element fields (n, n_finite, the violation and
 * non-finite counts, the |d| and relative error figures, cosine, SQNR, nl2);
 * 0 or -ENOMEM.
 */
int cmp__element_metrics(const struct cmp__view *va, const struct cmp__view *vb, int64_t n,
                         double atol, double rtol, struct cmp_scratch *s, struct cmp_metrics *m);

/* The element figures of m set to "not computed" (NaN). */
static inline void cmp__clear_elements(struct cmp_metrics *m)
{
    m->max_abs = m->mean_abs = m->p99_abs = NAN;
    m->max_rel = m->mean_rel = NAN;
    m->cosine = m->sqnr_db = m->nl2 = NAN;
}

/*
 * metrics_pct.c: the q-percentile of |d|, numpy's "linear" definition.
 * cmp__percentile_in: when every finite |d| is in sel[0..n) (reordered).
 * cmp__percentile_large: of the nfin finite |d| of n compared positions,
 * from the pass's sample s->sample[0..ns), re-decoding the views.
 */
double cmp__percentile_in(double *sel, size_t n, double q);
double cmp__percentile_large(const struct cmp__view *va, const struct cmp__view *vb, int64_t n,
                             int64_t nfin, size_t ns, struct cmp_scratch *s, double q);

#endif
