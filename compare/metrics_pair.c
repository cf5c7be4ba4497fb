/*
 * compare/metrics_pair.c - how far apart two tensor records are: bit identity,
 * a dtype or shape mismatch, the basis the payloads allow (full, a shared
 * sample, or statistics only), the element metrics on that basis
 * (metrics.c) and the statistics checks that every basis reports.
 */
#include <errno.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "compare/metrics_int.h"

/* Equal hashes of one algorithm; hashes of two algorithms prove nothing
 * either way (cmp__hash_alg_mixed). */
bool cmp__recs_identical(const struct cmp__rec *a, const struct cmp__rec *b)
{
    if (a->hash == NULL || b->hash == NULL || cmp__hash_alg_mixed(a, b) ||
        strcmp(a->hash, b->hash) != 0)
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

bool cmp__hash_alg_mixed(const struct cmp__rec *a, const struct cmp__rec *b)
{
    return a->hash != NULL && b->hash != NULL && strcmp(a->hash_alg, b->hash_alg) != 0;
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

/*
 * Picks the basis: full payloads on both sides; else a shared sample (both
 * sampled with the same count, or one full payload gathered at the other's
 * sample positions); else statistics only.
 */
static enum cmp_basis choose_basis(const struct cmp__rec *h, const struct cmp__rec *c,
                                   struct cmp__view *vh, struct cmp__view *vc, int64_t *n)
{
    int64_t kh = payload_elems(h), kc = payload_elems(c);
    *vh = (struct cmp__view){.p = h->payload, .dt = h->dtype, .numel = h->numel};
    *vc = (struct cmp__view){.p = c->payload, .dt = c->dtype, .numel = c->numel};
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
    cmp__clear_elements(m);
    m->d_min = m->d_max = m->d_mean = m->d_l2 = NAN;
    m->hash_alg_mixed = cmp__hash_alg_mixed(h, c);

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

    struct cmp__view vh, vc;
    int64_t n = 0;
    m->basis = choose_basis(h, c, &vh, &vc, &n);
    if (m->basis != CMP_BASIS_STATS) {
        int rc = cmp__element_metrics(&vh, &vc, n, tol->atol, tol->rtol, s, m);
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
    struct cmp_scratch *own = NULL;
    struct cmp_tol t;
    int rc;

    if (out == NULL)
        return -EINVAL;
    rc = cmp__rec_from_tensor(head, &h, NULL, NULL);
    if (rc < 0)
        goto out;
    rc = cmp__rec_from_tensor(control, &c, NULL, NULL);
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
