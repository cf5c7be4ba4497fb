/*
 * compare/reference.c - the reference arbiter (docs/compare.md, "Reference
 * arbiter"): a record pair the tolerance rule diverged is judged again by
 * how far each side is from a reference, the way torch._dynamo's same()
 * judges a compiled result against float64 (its error may be at most a
 * multiple of the eager result's). A head whose rounding is as good as the
 * control's, only different (another summation order, another vector
 * width), then passes; a head that is further from the truth does not.
 *
 * The reference is the control cell's float64 records (ref.float64/<key>,
 * the runner's reference run) or the control side's default-width cell of
 * the same model and pass. The errors are RMS differences over the values
 * the three records all captured, so capture stats has nothing to judge by.
 */
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "compare/engine_int.h"
#include "compare/metrics_int.h"

#define REF_PREFIX "ref.float64/"

bool cmp__reference_key(const char *key)
{
    return strncmp(key, REF_PREFIX, sizeof REF_PREFIX - 1) == 0;
}

static int by_key(const void *a, const void *b)
{
    const struct cmp__rec *x = *(const struct cmp__rec *const *)a;
    const struct cmp__rec *y = *(const struct cmp__rec *const *)b;
    int c = strcmp(x->key, y->key);
    return c ? c : (x->seq > y->seq) - (x->seq < y->seq);
}

/* The control side's default-width cell of C's model, pass and mode, or
 * NULL. */
static const struct cmp_cell *default_width_cell(const struct cmp_cell *c)
{
    const struct cmp_side *side = c->side;
    for (size_t i = 0; side && i < side->n_cells; i++) {
        const struct cmp_cell *x = side->cells[i];
        if (strcmp(x->width, "default") == 0 && strcmp(x->model, c->model) == 0 &&
            strcmp(x->pass, c->pass) == 0 && strcmp(x->mode, c->mode) == 0)
            return x;
    }
    return NULL;
}

int cmp__reference_prepare(struct cmp__cellcmp *k)
{
    if (k->o->reference == CMP_REF_NONE)
        return 0;
    if (k->o->reference == CMP_REF_FLOAT64) {
        k->sr = k->sc;
        k->nsr = k->c->n_recs;
        return 0;
    }
    const struct cmp_cell *d = default_width_cell(k->c);
    if (d == NULL) {
        k->ref_why = "no_default_width_cell";
        return 0;
    }
    if (!cmp__outcome_is(d, CELL_OK)) {
        k->ref_why = "default_width_outcome";
        return 0;
    }
    k->sr = malloc((d->n_recs + 1) * sizeof(*k->sr));
    if (k->sr == NULL)
        return -ENOMEM;
    k->sr_owned = true;
    for (size_t i = 0; i < d->n_recs; i++)
        k->sr[i] = &d->recs[i];
    qsort(k->sr, d->n_recs, sizeof(*k->sr), by_key);
    k->nsr = d->n_recs;
    return 0;
}

/* The reference record of control record C (lowest seq of its key), or NULL. */
static const struct cmp__rec *find_ref(const struct cmp__cellcmp *k, const struct cmp__rec *c)
{
    char key[CMP_MAX_KEY + sizeof REF_PREFIX];
    snprintf(key, sizeof key, "%s%s", k->o->reference == CMP_REF_FLOAT64 ? REF_PREFIX : "", c->key);
    size_t lo = 0, hi = k->nsr;
    while (lo < hi) {
        size_t mid = lo + (hi - lo) / 2;
        if (strcmp(k->sr[mid]->key, key) < 0)
            lo = mid + 1;
        else
            hi = mid;
    }
    return lo < k->nsr && strcmp(k->sr[lo]->key, key) == 0 ? k->sr[lo] : NULL;
}

static int64_t payload_elems(const struct cmp__rec *r)
{
    size_t sz = cmp__dtype_size(r->dtype);
    return sz ? (int64_t)(r->payload_len / sz) : 0;
}

/*
 * The positions all of R[0..3) captured: every full payload (n = numel), or
 * the runner's stride sample of k positions, where a full payload is read
 * at the same positions. NULL and the views, or why there are no values.
 */
static const char *views_of(const struct cmp__rec *const r[3], struct cmp__view v[3], int64_t *n)
{
    int64_t ks = -1;
    for (int i = 0; i < 3; i++) {
        if (r[i]->capture == CMP_CAPTURE_NONE || payload_elems(r[i]) == 0 ||
            cmp__dtype_size(r[i]->dtype) == 0 || r[i]->dtype == CMP_DTYPE_OTHER)
            return "no_values";
        if (r[i]->numel != r[0]->numel || r[i]->ndim != r[0]->ndim ||
            memcmp(r[i]->shape, r[0]->shape, (size_t)r[0]->ndim * sizeof(r[0]->shape[0])) != 0)
            return "shape";
        v[i] = (struct cmp__view){.p = r[i]->payload, .dt = r[i]->dtype, .numel = r[i]->numel};
        if (r[i]->capture == CMP_CAPTURE_SAMPLE) {
            if (ks >= 0 && payload_elems(r[i]) != ks)
                return "sample_positions";
            ks = payload_elems(r[i]);
        }
    }
    *n = ks >= 0 ? ks : r[0]->numel;
    for (int i = 0; i < 3 && ks >= 0; i++)
        if (r[i]->capture == CMP_CAPTURE_FULL)
            v[i].gather_k = ks;
    return NULL;
}

/* err(head) and err(control), the RMS differences from the reference over
 * the compared positions; why when a value is not finite. */
static const char *ref_errors(const struct cmp__view v[3], int64_t n, double *eh, double *ec)
{
    double a[CMP__BLK], b[CMP__BLK], r[CMP__BLK];
    double sh = 0, sc = 0;
    for (int64_t start = 0; start < n; start += CMP__BLK) {
        size_t len = (size_t)(n - start < CMP__BLK ? n - start : CMP__BLK);
        cmp__decode_block(&v[0], start, len, a);
        cmp__decode_block(&v[1], start, len, b);
        cmp__decode_block(&v[2], start, len, r);
        for (size_t i = 0; i < len; i++) {
            if (!isfinite(a[i]) || !isfinite(b[i]) || !isfinite(r[i]))
                return "nonfinite";
            sh += (a[i] - r[i]) * (a[i] - r[i]);
            sc += (b[i] - r[i]) * (b[i] - r[i]);
        }
    }
    *eh = sqrt(sh / (double)n);
    *ec = sqrt(sc / (double)n);
    return NULL;
}

void cmp__reference_judge(struct cmp__cellcmp *k, struct cmp__row *w)
{
    struct cmp__refjudge *j = &w->ref;
    *j = (struct cmp__refjudge){.tried = true, .rule = cmp_reference_rule(k->o->reference)};
    j->err_head = j->err_control = j->k = j->tol = NAN;
    k->ref_tried++;
    const struct cmp__rec *ref = NULL;
    if (k->ref_why)
        j->why = k->ref_why;
    else if (w->m.mismatch != CMP_MISMATCH_NONE)
        j->why = "mismatch";
    else if ((ref = find_ref(k, w->c)) == NULL)
        j->why = "no_reference_record";
    if (j->why)
        return;
    const struct cmp__rec *r[3] = {w->h, w->c, ref};
    struct cmp__view v[3];
    if ((j->why = views_of(r, v, &j->n)) != NULL)
        return;
    if ((j->why = ref_errors(v, j->n, &j->err_head, &j->err_control)) != NULL)
        return;
    enum cmp_dtype dt = w->c->dtype;
    j->k = dt == CMP_DTYPE_FLOAT16 || dt == CMP_DTYPE_BFLOAT16 || w->c->numel <= 10 ? 3.0 : 2.0;
    j->tol = w->m.atol / 10.0;
    j->judged = true;
    j->passed = j->err_head <= j->k * j->err_control + j->tol;
    k->ref_judged++;
    k->ref_passed += j->passed;
    if (j->passed)
        w->cls = CMP__T_WITHIN;
}

int cmp__reference_row_json(const struct cmp__row *w, json_t *o)
{
    const struct cmp__refjudge *j = &w->ref;
    if (!j->tried)
        return 0;
    int e = cmp__set(o, "rule", json_string(j->judged ? j->rule : "tolerance"));
    json_t *x = json_object();
    e |= cmp__set(o, "reference", x);
    if (x == NULL || e)
        return -ENOMEM;
    e |= cmp__set(x, "rule", json_string(j->rule));
    e |= cmp__set(x, "judged", json_boolean(j->judged));
    e |= cmp__set(x, "reason", j->why ? json_string(j->why) : json_null());
    if (j->judged) {
        const struct cmp__real errs[] = {{"err_head", j->err_head},
                                         {"err_control", j->err_control},
                                         {"k", j->k},
                                         {"tol", j->tol}};
        e |= cmp__set(x, "passed", json_boolean(j->passed));
        e |= cmp__set(x, "n", json_integer(j->n));
        e |= cmp__set_reals(x, errs, sizeof errs / sizeof errs[0]);
    }
    return e ? -ENOMEM : 0;
}

/*
 * The cell's "rule" (which rule decided its status: a reference rule when
 * it passed a record the tolerance rule diverged, or judged the first
 * divergence; else "tolerance") and its "reference" object (null when the
 * option is none).
 */
int cmp__reference_cell_json(const struct cmp__cellcmp *k, json_t *cj)
{
    enum cmp_reference ref = k->o->reference;
    bool by_ref = ref != CMP_REF_NONE &&
                  ((k->st == CMP__C_WITHIN && k->ref_passed > 0) ||
                   (k->st == CMP__C_DIVERGED && k->first_div && k->first_div->ref.judged));
    int e = cmp__set(cj, "rule", json_string(by_ref ? cmp_reference_rule(ref) : "tolerance"));
    if (ref == CMP_REF_NONE)
        return e | cmp__set(cj, "reference", json_null());
    json_t *x = json_object();
    e |= cmp__set(cj, "reference", x);
    if (x == NULL || e)
        return -ENOMEM;
    e |= cmp__set(x, "kind", json_string(cmp_reference_name(ref)));
    e |= cmp__set(x, "rule", json_string(cmp_reference_rule(ref)));
    e |= cmp__set(x, "tried", json_integer(k->ref_tried));
    e |= cmp__set(x, "judged", json_integer(k->ref_judged));
    e |= cmp__set(x, "passed", json_integer(k->ref_passed));
    e |= cmp__set(x, "reason", k->ref_why ? json_string(k->ref_why) : json_null());
    return e ? -ENOMEM : 0;
}
