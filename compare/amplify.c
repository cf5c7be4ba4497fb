/*
 * compare/amplify.c - error amplification: where a diverged cell's error
 * grew the most, and whether its first divergence introduced its error or
 * amplified error that was already there (docs/compare.md, "Error
 * amplification").
 *
 * A row's relative error is its nl2, ||head - control|| / ||control||
 * over the finite positions (0 for a bit-identical row, and for one within
 * its dtype's unit roundoff: rounding is no error carried in). Its input error
 * is the largest relative error among its module inputs, the records that
 * first_introduced calls inputs (engine_cell.c): the other matched records
 * of the same module call and phase with role input (forward) or
 * grad_output (backward). The ratio out/in says how much that call grew
 * the error it was fed; the input with the largest error is used, so the
 * ratio never overstates the growth.
 *
 * A relative error is unknown on the stats basis (only lower bounds exist
 * there), with one-sided NaN/Inf (the finite positions do not measure it)
 * or when it is not finite; a row is fed an unknown input error when any
 * of its inputs has one or when it has no captured input at all.
 */
#include <errno.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "compare/engine_int.h"

/* The unit roundoff of a floating dtype (0 for others): a relative error
 * at or below it is the rounding of one result, not error carried in. */
static double roundoff(enum cmp_dtype dt)
{
    switch (dt) {
    case CMP_DTYPE_FLOAT64:
        return 0x1p-53;
    case CMP_DTYPE_FLOAT32:
        return 0x1p-24;
    case CMP_DTYPE_FLOAT16:
        return 0x1p-11;
    case CMP_DTYPE_BFLOAT16:
        return 0x1p-8;
    default:
        return 0;
    }
}

/* A row's relative error, NaN when unknown (see the file comment); an
 * error within its dtype's rounding counts as none. */
static double rel_err(const struct cmp__row *w)
{
    const struct cmp_metrics *m = &w->m;
    if (m->basis == CMP_BASIS_EXACT)
        return 0;
    if ((m->basis != CMP_BASIS_FULL && m->basis != CMP_BASIS_SAMPLE) ||
        m->mismatch != CMP_MISMATCH_NONE || m->nan_one_sided > 0 || m->inf_one_sided > 0 ||
        !isfinite(m->nl2))
        return NAN;
    return m->nl2 <= roundoff(w->h->dtype) ? 0 : m->nl2;
}

/* The role that feeds a call in this phase; false for init and other. */
static bool input_role(enum cmp__phase ph, enum cmp__role *in)
{
    if (ph == CMP__PH_FORWARD)
        *in = CMP__ROLE_INPUT;
    else if (ph == CMP__PH_BACKWARD)
        *in = CMP__ROLE_GRAD_OUTPUT;
    else
        return false;
    return true;
}

/* Module call, then phase, then execution order. */
static int by_call(const void *a, const void *b)
{
    const struct cmp__rowix *p = a, *q = b;
    return cmp__rowix_then(cmp__call_cmp(p->h, q->h), p, q);
}

/* What the walk found: per row its input error and the input it came from. */
struct amp {
    double *out, *in;       /* per row; in is NaN when unknown */
    size_t *from;           /* per row: the row of its largest input error */
    struct cmp__rowix *idx; /* rows with a module and a phase that has inputs */
};

/*
 * Fills a->in for every row of one module call idx[lo..hi): the largest
 * input error, NaN when an input's is unknown or there is no input.
 */
static void call_inputs(struct amp *a, const struct cmp__row *rows, size_t lo, size_t hi)
{
    enum cmp__role want = CMP__ROLE_OTHER;
    double in = -1;
    size_t from = 0;
    bool unknown = false;
    input_role(a->idx[lo].h->phase, &want);
    for (size_t g = lo; g < hi; g++) {
        size_t r = a->idx[g].row;
        if (rows[r].h->role != want)
            continue;
        if (isnan(a->out[r]))
            unknown = true;
        else if (a->out[r] > in) {
            in = a->out[r];
            from = r;
        }
    }
    for (size_t g = lo; g < hi; g++) {
        size_t r = a->idx[g].row;
        if (rows[r].h->role == want)
            continue;
        a->in[r] = unknown || in < 0 ? NAN : in;
        a->from[r] = from;
    }
}

/* Every row's errors; -ENOMEM. The caller frees a's arrays. */
static int amp_walk(struct amp *a, const struct cmp__row *rows, size_t n)
{
    size_t ni = 0;
    enum cmp__role want;
    a->out = malloc((n + 1) * sizeof(*a->out));
    a->in = malloc((n + 1) * sizeof(*a->in));
    a->from = malloc((n + 1) * sizeof(*a->from));
    a->idx = malloc((n + 1) * sizeof(*a->idx));
    if (a->out == NULL || a->in == NULL || a->from == NULL || a->idx == NULL)
        return -ENOMEM;
    for (size_t r = 0; r < n; r++) {
        a->out[r] = rel_err(&rows[r]);
        a->in[r] = NAN;
        if (rows[r].h->module != NULL && input_role(rows[r].h->phase, &want))
            a->idx[ni++] = (struct cmp__rowix){rows[r].h, r};
    }
    qsort(a->idx, ni, sizeof(*a->idx), by_call);
    for (size_t lo = 0, hi; lo < ni; lo = hi) {
        for (hi = lo + 1; hi < ni && cmp__call_cmp(a->idx[hi].h, a->idx[lo].h) == 0; hi++)
            ;
        call_inputs(a, rows, lo, hi);
    }
    return 0;
}

/* The row's identity for an amplification object: key, seq, module, op. */
static int row_id(json_t *o, const struct cmp__rec *h)
{
    int e = cmp__set(o, "key", json_string(h->key));
    e |= cmp__set(o, "seq", json_integer(h->seq));
    e |= cmp__set(o, "module", h->module ? json_string(h->module) : json_null());
    if (h->op != NULL)
        e |= cmp__set(o, "op", json_string(h->op));
    return e;
}

static json_t *max_json(const struct amp *a, const struct cmp__row *rows, size_t best)
{
    json_t *o = json_object();
    if (o == NULL)
        return NULL;
    int e = row_id(o, rows[best].h);
    e |= cmp__set(o, "input_key", json_string(rows[a->from[best]].h->key));
    e |= cmp__set_real(o, "ratio", a->out[best] / a->in[best]);
    e |= cmp__set_real(o, "in_rel_err", a->in[best]);
    e |= cmp__set_real(o, "out_rel_err", a->out[best]);
    return cmp__obj_or_null(o, e);
}

/* "introduced" (its inputs exact), "amplified" (ratio > 1) or "carried". */
static json_t *growth_json(const struct amp *a, const struct cmp__row *rows, size_t r)
{
    double in = a->in[r], out = a->out[r];
    if (isnan(in) || isnan(out) || (in == 0 && out == 0))
        return json_null();
    json_t *o = json_object();
    if (o == NULL)
        return NULL;
    const char *kind = in == 0 ? "introduced" : out > in ? "amplified" : "carried";
    int e = cmp__set(o, "kind", json_string(kind));
    e |= cmp__set(o, "input_key", json_string(rows[a->from[r]].h->key));
    e |= cmp__set_real(o, "in_rel_err", in);
    e |= cmp__set_real(o, "out_rel_err", out);
    e |= in > 0 ? cmp__set_real(o, "ratio", out / in) : cmp__set(o, "ratio", json_null());
    return cmp__obj_or_null(o, e);
}

int cmp__amplify_json(const struct cmp__cellcmp *k, json_t *cj)
{
    struct amp a = {0};
    json_t *max = json_null(), *growth = json_null();
    int rc = 0;

    if (k->st != CMP__C_DIVERGED || k->nrows == 0)
        goto out;
    rc = amp_walk(&a, k->rows, k->nrows);
    if (rc < 0)
        goto out;
    /* The largest ratio over rows fed error; the earliest row wins a tie. */
    size_t best = k->nrows;
    for (size_t r = 0; r < k->nrows; r++) {
        if (isnan(a.in[r]) || isnan(a.out[r]) || a.in[r] == 0)
            continue;
        if (best == k->nrows || a.out[r] / a.in[r] > a.out[best] / a.in[best])
            best = r;
    }
    if (best < k->nrows)
        max = max_json(&a, k->rows, best);
    if (k->first_div != NULL)
        growth = growth_json(&a, k->rows, (size_t)(k->first_div - k->rows));
    if (max == NULL || growth == NULL)
        rc = -ENOMEM;
out:
    rc |= cmp__set(cj, "max_amplification", max);
    rc |= cmp__set(cj, "first_divergence_growth", growth);
    free(a.out);
    free(a.in);
    free(a.from);
    free(a.idx);
    return rc ? -ENOMEM : 0;
}
