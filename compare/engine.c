/*
 * compare/engine.c - matching cells and records, judging them, and writing
 * the result object (docs/compare.md is the contract for every field name).
 *
 * The engine answers three questions per cell, in the order a reviewer asks
 * them: did it still run (outcome change), does it still compute the same
 * thing (status, first divergence, where the error was introduced), and is
 * it slower (perf). Everything is deterministic: the same two sides give a
 * byte-identical result, so results can be cached and ETag'd.
 */
#include <errno.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "compare/cmp_int.h"

#define KEY_NAMES_SHOWN 5 /* missing/extra key names listed per cell */

enum tclass { T_IDENTICAL, T_WITHIN, T_DIVERGED, T_NONDET };

static const char *const tclass_names[] = {"identical", "within_tolerance", "diverged",
                                           "nondeterministic"};

enum cstatus { C_IDENTICAL, C_WITHIN, C_DIVERGED, C_NONDET, C_INCOMPARABLE, C_NOT_RUN, C__COUNT };

static const char *const cstatus_names[] = {"identical",        "within_tolerance", "diverged",
                                            "nondeterministic", "incomparable",     "not_run"};

/* One matched record pair. */
struct row {
    const struct cmp__rec *h, *c;
    struct cmp_metrics m;
    enum tclass cls;
};

struct counts {
    int64_t status[C__COUNT];
    int64_t cells, missing_cells, extra_cells;
    int64_t outcome_regressions, outcome_fixes;
    int64_t perf_regressions, perf_improvements, perf_unknown, perf_unstable, perf_same;
    int64_t device_mismatches; /* pairs refused for running on different devices */
    int64_t lost_coverage;     /* control ran, the head's host lacks the width */
};

/* ------------------------------------------------------------- JSON bits */

/*
 * JSON has no Inf or NaN, and jansson refuses to build them. A non-finite
 * double becomes null, and the object gets a "nonfinite" member naming the
 * field and its value ("inf", "-inf", "nan") so nothing is silently lost:
 * an SQNR of +inf (no error at all) must not read like a missing value.
 */
int cmp__set_real(json_t *obj, const char *name, double v)
{
    if (isfinite(v))
        return json_object_set_new(obj, name, json_real(v)) ? -ENOMEM : 0;
    if (json_object_set_new(obj, name, json_null()))
        return -ENOMEM;
    json_t *nf = json_object_get(obj, "nonfinite");
    if (nf == NULL) {
        nf = json_object();
        if (nf == NULL || json_object_set_new(obj, "nonfinite", nf))
            return -ENOMEM;
    }
    const char *s = isnan(v) ? "nan" : (v > 0 ? "inf" : "-inf");
    return json_object_set_new(nf, name, json_string(s)) ? -ENOMEM : 0;
}

static int set(json_t *o, const char *k, json_t *v)
{
    return json_object_set_new(o, k, v) ? -ENOMEM : 0;
}

static json_t *str_or_null(const char *s)
{
    return s ? json_string(s) : json_null();
}

static json_t *shape_json(const struct cmp__rec *r)
{
    json_t *a = json_array();
    for (int i = 0; a && i < r->ndim; i++)
        if (json_array_append_new(a, json_integer(r->shape[i]))) {
            json_decref(a);
            return NULL;
        }
    return a;
}

static const char *basis_name(enum cmp_basis b)
{
    switch (b) {
    case CMP_BASIS_EXACT:
        return "exact";
    case CMP_BASIS_FULL:
        return "full";
    case CMP_BASIS_SAMPLE:
        return "sample";
    default:
        return "stats";
    }
}

static const char *diverge_reason(const struct cmp_metrics *m)
{
    if (m->mismatch == CMP_MISMATCH_DTYPE)
        return "dtype";
    if (m->mismatch == CMP_MISMATCH_SHAPE)
        return "shape";
    if (m->nan_one_sided > 0 || m->inf_one_sided > 0)
        return "nan_inf";
    if (m->allclose_violations > 0)
        return "tolerance";
    return "stats";
}

/*
 * One record pair as JSON: identity, verdict and, unless it was bit-exact,
 * every metric that was computed on its basis.
 */
static json_t *row_json(const struct row *r)
{
    const struct cmp_metrics *m = &r->m;
    const struct cmp__rec *h = r->h, *c = r->c;
    json_t *o = json_object();
    int rc = 0;

    if (o == NULL)
        return NULL;
    rc |= set(o, "key", json_string(h->key));
    rc |= set(o, "seq", json_integer(h->seq));
    rc |= set(o, "control_seq", json_integer(c->seq));
    rc |= set(o, "module", str_or_null(h->module));
    rc |= set(o, "call", json_integer(h->call));
    rc |= set(o, "phase", json_string(cmp__phase_name(h->phase)));
    rc |= set(o, "role", json_string(cmp__role_name(h->role)));
    if (h->op != NULL) { /* a per-op record (ops.c) */
        rc |= set(o, "op", json_string(h->op));
        rc |= set(o, "op_index", json_integer(h->op_index));
    }
    rc |= set(o, "dtype", json_string(c->dtype_name));
    rc |= set(o, "status", json_string(tclass_names[r->cls]));
    if (r->cls == T_DIVERGED)
        rc |= set(o, "reason", json_string(diverge_reason(m)));
    rc |= set(o, "basis", json_string(basis_name(m->basis)));
    if (m->basis == CMP_BASIS_EXACT)
        goto done;
    if (m->mismatch != CMP_MISMATCH_NONE) {
        rc |= set(o, "head_dtype", json_string(h->dtype_name));
        rc |= set(o, "head_shape", shape_json(h));
        rc |= set(o, "control_shape", shape_json(c));
    }
    rc |= cmp__set_real(o, "atol", m->atol);
    rc |= cmp__set_real(o, "rtol", m->rtol);
    if (m->basis == CMP_BASIS_FULL || m->basis == CMP_BASIS_SAMPLE) {
        rc |= set(o, "n", json_integer(m->n));
        rc |= set(o, "n_finite", json_integer(m->n_finite));
        rc |= cmp__set_real(o, "max_abs", m->max_abs);
        rc |= cmp__set_real(o, "mean_abs", m->mean_abs);
        rc |= cmp__set_real(o, "p99_abs", m->p99_abs);
        rc |= cmp__set_real(o, "max_rel", m->max_rel);
        rc |= cmp__set_real(o, "mean_rel", m->mean_rel);
        rc |= set(o, "allclose_violations", json_integer(m->allclose_violations));
        rc |= cmp__set_real(o, "cosine", m->cosine);
        rc |= cmp__set_real(o, "sqnr_db", m->sqnr_db);
        rc |= cmp__set_real(o, "nl2", m->nl2);
    }
    if (m->basis == CMP_BASIS_STATS && m->mismatch == CMP_MISMATCH_NONE)
        rc |= cmp__derived_json(o, h, c); /* derived.c: sizes from the statistics */
    rc |= set(o, "stat_violations", json_integer(m->stat_violations));
    rc |= set(o, "nan_one_sided", json_integer(m->nan_one_sided));
    rc |= set(o, "inf_one_sided", json_integer(m->inf_one_sided));
    json_t *d = json_object();
    rc |= set(o, "delta", d);
    if (d != NULL) {
        rc |= cmp__set_real(d, "min", m->d_min);
        rc |= cmp__set_real(d, "max", m->d_max);
        rc |= cmp__set_real(d, "mean", m->d_mean);
        rc |= cmp__set_real(d, "l2", m->d_l2);
    }
done:
    if (rc) {
        json_decref(o);
        return NULL;
    }
    return o;
}

/* ------------------------------------------------------------- sorting */

static int by_key(const void *a, const void *b)
{
    const struct cmp__rec *x = *(const struct cmp__rec *const *)a;
    const struct cmp__rec *y = *(const struct cmp__rec *const *)b;
    int c = strcmp(x->key, y->key);
    if (c)
        return c;
    return (x->seq > y->seq) - (x->seq < y->seq);
}

static int rec_by_seq(const void *a, const void *b)
{
    const struct cmp__rec *x = *(const struct cmp__rec *const *)a;
    const struct cmp__rec *y = *(const struct cmp__rec *const *)b;
    return (x->seq > y->seq) - (x->seq < y->seq);
}

static int row_by_head_seq(const void *a, const void *b)
{
    const struct row *x = a, *y = b;
    return (x->h->seq > y->h->seq) - (x->h->seq < y->h->seq);
}

/* Groups of one module call: module name, then call index. NULL modules last. */
static int group_cmp(const struct cmp__rec *x, const struct cmp__rec *y)
{
    if (x->module == NULL || y->module == NULL)
        return (x->module == NULL) - (y->module == NULL);
    int c = strcmp(x->module, y->module);
    if (c)
        return c;
    return (x->call > y->call) - (x->call < y->call);
}

/* The module-call index: pairs sorted by group, then by head execution order. */
struct gidx {
    const struct cmp__rec *h;
    size_t row;
};

static int gidx_cmp(const void *a, const void *b)
{
    const struct gidx *x = a, *y = b;
    int c = group_cmp(x->h, y->h);
    if (c)
        return c;
    return (x->row > y->row) - (x->row < y->row);
}

/* A sorted copy of a cell's record pointers, by key. */
static int sorted_recs(const struct cmp_cell *cell, const struct cmp__rec ***out)
{
    const struct cmp__rec **v = malloc((cell->n_recs + 1) * sizeof(*v));
    if (v == NULL)
        return -ENOMEM;
    for (size_t i = 0; i < cell->n_recs; i++)
        v[i] = &cell->recs[i];
    qsort(v, cell->n_recs, sizeof(*v), by_key);
    *out = v;
    return 0;
}

static bool is_nondet(const struct cmp_cell *cell, const struct cmp__rec *r,
                      const char **sorted_marks)
{
    if (r->nondet)
        return true;
    size_t lo = 0, hi = cell->n_nondet;
    while (lo < hi) {
        size_t mid = lo + (hi - lo) / 2;
        int c = strcmp(sorted_marks[mid], r->key);
        if (c == 0)
            return true;
        if (c < 0)
            lo = mid + 1;
        else
            hi = mid;
    }
    return false;
}

static int by_str(const void *a, const void *b)
{
    return strcmp(*(const char *const *)a, *(const char *const *)b);
}

/* --------------------------------------------------------- cell verdict */

static bool outcome_bad(enum cmp__outcome o)
{
    return o == CMP__OUT_FAILED || o == CMP__OUT_CRASHED || o == CMP__OUT_TIMEOUT ||
           o == CMP__OUT_PROTOCOL_ERROR || o == CMP__OUT_OOM;
}

static const char *outcome_change(enum cmp__outcome c, enum cmp__outcome h)
{
    if (c == CMP__OUT_OK && outcome_bad(h))
        return "regression";
    if (outcome_bad(c) && h == CMP__OUT_OK)
        return "fix";
    if (c != h)
        return "changed";
    return "none";
}

static bool close_enough(enum tclass k)
{
    return k == T_IDENTICAL || k == T_WITHIN;
}

/*
 * Did row r introduce error? (docs/compare.md, "First introduced".) Its
 * module inputs are the other records of the same module call with role
 * input (forward) or grad_output (backward). A record that is itself such an
 * input, an init parameter, or one whose inputs were not captured can only be
 * the origin when nothing diverged before it; otherwise it introduced error
 * exactly when all of its inputs were identical or within tolerance.
 */
static bool introduces(const struct row *rows, const struct gidx *grp, size_t ngrp, size_t ri,
                       bool first_divergent)
{
    const struct cmp__rec *r = rows[ri].h;
    enum cmp__role want;

    if (r->phase == CMP__PH_FORWARD)
        want = CMP__ROLE_INPUT;
    else if (r->phase == CMP__PH_BACKWARD)
        want = CMP__ROLE_GRAD_OUTPUT;
    else
        return first_divergent;
    if (r->role == want || r->module == NULL)
        return first_divergent;

    /* binary search for the first member of r's group */
    size_t lo = 0, hi = ngrp;
    while (lo < hi) {
        size_t mid = lo + (hi - lo) / 2;
        if (group_cmp(grp[mid].h, r) < 0)
            lo = mid + 1;
        else
            hi = mid;
    }
    size_t inputs = 0;
    for (size_t g = lo; g < ngrp && group_cmp(grp[g].h, r) == 0; g++) {
        const struct row *q = &rows[grp[g].row];
        if (grp[g].row == ri || q->h->phase != r->phase || q->h->role != want)
            continue;
        inputs++;
        if (!close_enough(q->cls))
            return false;
    }
    return inputs > 0 ? true : first_divergent;
}

static json_t *names_json(const struct cmp__rec **v, size_t n)
{
    json_t *a = json_array();
    for (size_t i = 0; a && i < n && i < KEY_NAMES_SHOWN; i++)
        if (json_array_append_new(a, json_string(v[i]->key))) {
            json_decref(a);
            return NULL;
        }
    return a;
}

static json_t *peak_json(int64_t v)
{
    return v >= 0 ? json_integer(v) : json_null();
}

static int memory_json(const struct cmp_cell *c, const struct cmp_cell *h, json_t **out)
{
    int rc = 0;
    json_t *o = json_object();
    if (o == NULL)
        return -ENOMEM;
    rc |= set(o, "control_peak", peak_json(c->peak_rss));
    rc |= set(o, "head_peak", peak_json(h->peak_rss));
    if (c->peak_rss > 0 && h->peak_rss >= 0)
        rc |= cmp__set_real(o, "ratio", (double)h->peak_rss / (double)c->peak_rss);
    else
        rc |= set(o, "ratio", json_null());
    rc |= set(o, "control_device_peak", peak_json(c->device_peak));
    rc |= set(o, "head_device_peak", peak_json(h->device_peak));
    if (c->device_peak > 0 && h->device_peak >= 0)
        rc |= cmp__set_real(o, "device_ratio", (double)h->device_peak / (double)c->device_peak);
    else
        rc |= set(o, "device_ratio", json_null());
    if (rc) {
        json_decref(o);
        return -ENOMEM;
    }
    *out = o;
    return 0;
}

/*
 * Compares one matched cell pair and appends its object to cells. The
 * record work: sort both sides by key, merge (keys on one side only are
 * missing/extra), compare each pair, then walk the pairs in head execution
 * order to find the first divergence and the first introduced error.
 */
static int compare_cell(const struct cmp_cell *c, const struct cmp_cell *h,
                        const struct cmp_options *o, bool cross, struct cmp_scratch *s,
                        json_t *cells, struct counts *cnt)
{
    int rc = -ENOMEM;
    const struct cmp__rec **sc = NULL, **sh = NULL, **missing = NULL, **extra = NULL;
    const char **mc = NULL, **mh = NULL;
    struct row *rows = NULL;
    struct gidx *grp = NULL;
    size_t nrows = 0, nmiss = 0, nextra = 0;
    json_t *cj = NULL, *tensors = NULL, *sub = NULL;
    struct cmp_perf perf;

    rc = sorted_recs(c, &sc);
    if (rc < 0)
        goto out;
    rc = sorted_recs(h, &sh);
    if (rc < 0)
        goto out;
    rc = -ENOMEM;
    mc = malloc((c->n_nondet + 1) * sizeof(*mc));
    mh = malloc((h->n_nondet + 1) * sizeof(*mh));
    rows = malloc((c->n_recs < h->n_recs ? c->n_recs : h->n_recs) * sizeof(*rows) + 1);
    missing = malloc((c->n_recs + 1) * sizeof(*missing));
    extra = malloc((h->n_recs + 1) * sizeof(*extra));
    if (mc == NULL || mh == NULL || rows == NULL || missing == NULL || extra == NULL)
        goto out;
    if (c->n_nondet)
        memcpy(mc, c->nondet_keys, c->n_nondet * sizeof(*mc));
    if (h->n_nondet)
        memcpy(mh, h->nondet_keys, h->n_nondet * sizeof(*mh));
    qsort(mc, c->n_nondet, sizeof(*mc), by_str);
    qsort(mh, h->n_nondet, sizeof(*mh), by_str);

    /* merge by key; a repeated key keeps its lowest-seq record only */
    size_t i = 0, j = 0;
    while (i < c->n_recs || j < h->n_recs) {
        if (i > 0 && i < c->n_recs && strcmp(sc[i]->key, sc[i - 1]->key) == 0) {
            i++;
            continue;
        }
        if (j > 0 && j < h->n_recs && strcmp(sh[j]->key, sh[j - 1]->key) == 0) {
            j++;
            continue;
        }
        int k = i == c->n_recs ? 1 : j == h->n_recs ? -1 : strcmp(sc[i]->key, sh[j]->key);
        if (k < 0) {
            missing[nmiss++] = sc[i++];
        } else if (k > 0) {
            extra[nextra++] = sh[j++];
        } else {
            rows[nrows].c = sc[i++];
            rows[nrows].h = sh[j++];
            nrows++;
        }
    }
    qsort(rows, nrows, sizeof(*rows), row_by_head_seq);
    qsort(missing, nmiss, sizeof(*missing), rec_by_seq);
    qsort(extra, nextra, sizeof(*extra), rec_by_seq);

    /*
     * Different devices (a GPU against the CPU, two GPU models) run
     * different kernels: their records and timings are not compared at
     * all unless asked, so a device change never reads as a regression.
     */
    const char *dev_check = "unknown";
    bool dev_refused = false;
    if (c->device != NULL && h->device != NULL) {
        if (strcmp(c->device, h->device) == 0) {
            dev_check = "same";
        } else if (o->allow_device_mismatch) {
            dev_check = "mismatch_allowed";
        } else {
            dev_check = "mismatch_refused";
            dev_refused = true;
            nrows = nmiss = nextra = 0;
        }
    }

    /* judge every pair */
    int64_t ncls[4] = {0};
    bool params_differed = false;
    for (size_t r = 0; r < nrows; r++) {
        struct row *w = &rows[r];
        struct cmp_tol tol = cmp__tol_for(o, w->c->key, w->c->dtype);
        rc = cmp__rec_compare(w->h, w->c, &tol, s, &w->m);
        if (rc < 0)
            goto out;
        if (w->m.basis == CMP_BASIS_EXACT)
            w->cls = T_IDENTICAL;
        else if (is_nondet(h, w->h, mh) || is_nondet(c, w->c, mc))
            w->cls = T_NONDET;
        else if (w->m.within_tol)
            w->cls = T_WITHIN;
        else
            w->cls = T_DIVERGED;
        ncls[w->cls]++;
        if (w->h->phase == CMP__PH_INIT && w->cls != T_IDENTICAL)
            params_differed = true;
    }

    /* index of pairs by module call, for the module-input lookups */
    rc = -ENOMEM;
    grp = malloc((nrows + 1) * sizeof(*grp));
    if (grp == NULL)
        goto out;
    for (size_t r = 0; r < nrows; r++)
        grp[r] = (struct gidx){rows[r].h, r};
    qsort(grp, nrows, sizeof(*grp), gidx_cmp);

    const struct row *first_div = NULL, *first_intro = NULL;
    for (size_t r = 0; r < nrows && first_intro == NULL; r++) {
        if (rows[r].cls != T_DIVERGED)
            continue;
        bool first = first_div == NULL;
        if (first)
            first_div = &rows[r];
        if (introduces(rows, grp, nrows, r, first))
            first_intro = &rows[r];
    }

    /* status, in order of precedence: a side that its host could not run
     * says nothing about the change, whatever the other side did */
    enum cstatus st;
    const char *why = NULL;
    if (c->host_missing || h->host_missing) {
        st = C_NOT_RUN;
        why = !h->host_missing ? "control_host" : !c->host_missing ? "head_host" : "both_hosts";
    } else if (c->outcome != CMP__OUT_OK) {
        st = C_INCOMPARABLE;
        why = "control_outcome";
    } else if (h->outcome != CMP__OUT_OK) {
        st = C_INCOMPARABLE;
        why = "head_outcome";
    } else if (dev_refused) {
        st = C_INCOMPARABLE;
        why = "device_mismatch";
    } else if (c->n_recs == 0 || h->n_recs == 0) {
        st = C_INCOMPARABLE;
        why = "no_records";
    } else if (ncls[T_DIVERGED] > 0 || nmiss > 0 || nextra > 0) {
        st = C_DIVERGED;
    } else if (ncls[T_WITHIN] > 0) {
        st = C_WITHIN;
    } else if (ncls[T_NONDET] > 0) {
        st = C_NONDET;
    } else {
        st = C_IDENTICAL;
    }

    rc = cmp__perf_cells(c, h, dev_refused, o, &perf);
    if (rc < 0)
        goto out;

    const char *oc = st == C_NOT_RUN ? "not_run" : outcome_change(c->outcome, h->outcome);
    cnt->cells++;
    /* Coverage the control had and the head's host lost. */
    cnt->lost_coverage += st == C_NOT_RUN && !c->host_missing && c->outcome == CMP__OUT_OK;
    cnt->device_mismatches += dev_refused;
    cnt->status[st]++;
    if (strcmp(oc, "regression") == 0)
        cnt->outcome_regressions++;
    else if (strcmp(oc, "fix") == 0)
        cnt->outcome_fixes++;
    if (perf.verdict == CMP_PERF_REGRESSION)
        cnt->perf_regressions++;
    else if (perf.verdict == CMP_PERF_IMPROVEMENT)
        cnt->perf_improvements++;
    cnt->perf_unknown += perf.verdict == CMP_PERF_UNKNOWN;
    cnt->perf_unstable += perf.verdict == CMP_PERF_UNSTABLE;
    cnt->perf_same += perf.verdict == CMP_PERF_SAME;

    rc = -ENOMEM;
    cj = json_object();
    if (cj == NULL)
        goto out;
    int e = 0;
    e |= set(cj, "model", json_string(h->model));
    e |= set(cj, "width", json_string(h->width));
    e |= set(cj, "pass", json_string(h->pass));
    if (cross)
        e |= set(cj, "control_width", json_string(c->width));
    e |= set(cj, "status", json_string(cstatus_names[st]));
    e |= set(cj, "incomparable_reason", str_or_null(st == C_INCOMPARABLE ? why : NULL));
    e |= set(cj, "not_run_reason", str_or_null(st == C_NOT_RUN ? why : NULL));
    e |= set(cj, "control_host_missing", str_or_null(c->host_missing));
    e |= set(cj, "head_host_missing", str_or_null(h->host_missing));
    e |= set(cj, "control_outcome", str_or_null(cmp__outcome_name(c->outcome)));
    e |= set(cj, "head_outcome", str_or_null(cmp__outcome_name(h->outcome)));
    e |= set(cj, "outcome_change", json_string(oc));
    e |= set(cj, "control_effective_width", str_or_null(c->effective_width));
    e |= set(cj, "head_effective_width", str_or_null(h->effective_width));
    e |= set(cj, "control_device", str_or_null(c->device));
    e |= set(cj, "head_device", str_or_null(h->device));
    e |= set(cj, "device_check", json_string(dev_check));
    e |= set(cj, "tensors_compared", json_integer((json_int_t)nrows));
    e |= set(cj, "tensors_identical", json_integer(ncls[T_IDENTICAL]));
    e |= set(cj, "tensors_within_tolerance", json_integer(ncls[T_WITHIN]));
    e |= set(cj, "tensors_diverged", json_integer(ncls[T_DIVERGED]));
    e |= set(cj, "tensors_nondeterministic", json_integer(ncls[T_NONDET]));
    e |= set(cj, "missing_keys", json_integer((json_int_t)nmiss));
    e |= set(cj, "extra_keys", json_integer((json_int_t)nextra));
    e |= set(cj, "missing_key_names", names_json(missing, nmiss));
    e |= set(cj, "extra_key_names", names_json(extra, nextra));
    e |= set(cj, "params_differed", json_boolean(params_differed));
    if (first_div != NULL) {
        e |= set(cj, "first_divergence", row_json(first_div));
    } else if (st == C_DIVERGED && (nmiss > 0 || nextra > 0)) {
        /*
         * Only the key sets differ: point at the first record that is not
         * shared. (A crashed side is missing keys as a matter of course;
         * that is reported as its outcome, not here.)
         */
        const struct cmp__rec *r = nmiss > 0 ? missing[0] : extra[0];
        sub = json_object();
        if (sub != NULL) {
            e |= set(sub, "key", json_string(r->key));
            e |= set(sub, "seq", json_integer(r->seq));
            e |= set(sub, "status", json_string("diverged"));
            e |= set(sub, "reason", json_string(nmiss > 0 ? "missing_in_head" : "extra_in_head"));
        }
        e |= set(cj, "first_divergence", sub);
        sub = NULL;
    } else {
        e |= set(cj, "first_divergence", json_null());
    }
    e |= set(cj, "first_introduced", first_intro ? row_json(first_intro) : json_null());
    /* Where NaN/Inf first appeared on each side, from its own records (ops.c). */
    for (int side = 0; side < 2 && !e; side++) {
        json_t *nf = NULL;
        e |= cmp__first_nonfinite(side ? c : h, &nf);
        e |= set(cj, side ? "control_first_nonfinite" : "first_nonfinite", nf ? nf : json_null());
    }

    e |= cmp__perf_json(&perf, o, &sub);
    e |= set(cj, "perf", sub);
    sub = NULL;
    e |= memory_json(c, h, &sub);
    e |= set(cj, "memory", sub);
    sub = NULL;

    if (o->include_tensors) {
        tensors = json_array();
        for (size_t r = 0; tensors && r < nrows; r++)
            e |= json_array_append_new(tensors, row_json(&rows[r])) ? -ENOMEM : 0;
        e |= set(cj, "tensors", tensors);
        tensors = NULL;
    }
    if (e)
        goto out;
    if (json_array_append_new(cells, cj)) {
        cj = NULL;
        goto out;
    }
    cj = NULL;
    rc = 0;
out:
    json_decref(cj);
    json_decref(tensors);
    json_decref(sub);
    free(sc);
    free(sh);
    free(mc);
    free(mh);
    free(rows);
    free(missing);
    free(extra);
    free(grp);
    return rc;
}

/* ----------------------------------------------------------- the driver */

struct sel_cell {
    const struct cmp_cell *cell;
    bool cross;
};

static int cell_order(const struct cmp_cell *x, const struct cmp_cell *y, bool cross)
{
    int c = strcmp(x->model, y->model);
    if (c)
        return c;
    if (!cross) {
        c = strcmp(x->width, y->width);
        if (c)
            return c;
    }
    return strcmp(x->pass, y->pass);
}

static int cell_cmp_same(const void *a, const void *b)
{
    return cell_order(*(const struct cmp_cell *const *)a, *(const struct cmp_cell *const *)b,
                      false);
}

static int cell_cmp_cross(const void *a, const void *b)
{
    return cell_order(*(const struct cmp_cell *const *)a, *(const struct cmp_cell *const *)b, true);
}

/* A side's cells (of one width in cross mode), in result order. */
static int pick_cells(const struct cmp_side *s, const char *width, const struct cmp_cell ***out,
                      size_t *n_out)
{
    const struct cmp_cell **v = malloc((s->n_cells + 1) * sizeof(*v));
    size_t n = 0;
    if (v == NULL)
        return -ENOMEM;
    for (size_t i = 0; i < s->n_cells; i++)
        if (width == NULL || strcmp(s->cells[i]->width, width) == 0)
            v[n++] = s->cells[i];
    qsort(v, n, sizeof(*v), width ? cell_cmp_cross : cell_cmp_same);
    *out = v;
    *n_out = n;
    return 0;
}

static json_t *cell_id(const struct cmp_cell *c)
{
    return json_pack("{s:s, s:s, s:s}", "model", c->model, "width", c->width, "pass", c->pass);
}

/*
 * Options set field by field skip cmp_options_apply_json's checks; a NaN
 * tolerance would silently pass everything, so they are checked again here.
 */
static bool options_ok(const struct cmp_options *o)
{
    for (int i = 0; i < CMP_DTYPE__COUNT; i++)
        if (!(o->tol[i].atol >= 0 && o->tol[i].rtol >= 0 && isfinite(o->tol[i].atol) &&
              isfinite(o->tol[i].rtol)))
            return false;
    if (o->n_key_tols > CMP_MAX_KEY_TOLS)
        return false;
    for (size_t i = 0; i < o->n_key_tols; i++) {
        const struct cmp_key_tol *k = &o->key_tols[i];
        if (memchr(k->pattern, '\0', sizeof(k->pattern)) == NULL || k->pattern[0] == '\0')
            return false;
        if (k->atol < 0 || k->rtol < 0 || isinf(k->atol) || isinf(k->rtol))
            return false;
    }
    if (memchr(o->control_width, '\0', sizeof(o->control_width)) == NULL ||
        memchr(o->head_width, '\0', sizeof(o->head_width)) == NULL)
        return false;
    return o->alpha > 0 && o->alpha < 1 && o->perf_threshold >= 0 && isfinite(o->perf_threshold) &&
           o->bootstrap_resamples >= 0 && o->bootstrap_resamples <= CMP_MAX_BOOTSTRAP;
}

int cmp_compare(const struct cmp_side *control, const struct cmp_side *head,
                const struct cmp_options *opt, json_t **result_out)
{
    int rc = -EINVAL;
    struct cmp_options defaults;
    const struct cmp_cell **cc = NULL, **hc = NULL;
    size_t ncc = 0, nhc = 0;
    struct cmp_scratch *s = NULL;
    struct cmp__env *env = NULL;
    json_t *res = NULL, *cells = NULL, *miss = NULL, *extra = NULL, *counts = NULL, *envj = NULL;
    struct counts cnt = {0};

    if (control == NULL || head == NULL || result_out == NULL)
        goto out;
    if (opt == NULL) {
        cmp_options_init(&defaults);
        opt = &defaults;
    }
    bool cross = opt->control_width[0] != '\0' && opt->head_width[0] != '\0';
    if ((opt->control_width[0] != '\0') != (opt->head_width[0] != '\0'))
        goto out;
    if (!options_ok(opt))
        goto out;

    rc = pick_cells(control, cross ? opt->control_width : NULL, &cc, &ncc);
    if (rc < 0)
        goto out;
    rc = pick_cells(head, cross ? opt->head_width : NULL, &hc, &nhc);
    if (rc < 0)
        goto out;
    rc = cmp_scratch_new(&s);
    if (rc < 0)
        goto out;
    rc = cmp__env_new(&env);
    if (rc < 0)
        goto out;
    rc = -ENOMEM;
    res = json_object();
    cells = json_array();
    miss = json_array();
    extra = json_array();
    if (res == NULL || cells == NULL || miss == NULL || extra == NULL)
        goto out;

    size_t i = 0, j = 0;
    while (i < ncc || j < nhc) {
        int k = i == ncc ? 1 : j == nhc ? -1 : cell_order(cc[i], hc[j], cross);
        if (k < 0) {
            if (json_array_append_new(miss, cell_id(cc[i++])))
                goto out;
            cnt.missing_cells++;
        } else if (k > 0) {
            if (json_array_append_new(extra, cell_id(hc[j++])))
                goto out;
            cnt.extra_cells++;
        } else {
            rc = cmp__env_pair(env, cc[i], hc[j]);
            if (rc == 0)
                rc = compare_cell(cc[i++], hc[j++], opt, cross, s, cells, &cnt);
            if (rc < 0)
                goto out;
            rc = -ENOMEM;
        }
    }
    /* What else differs between the two builds (envdiff.c). */
    rc = cmp__env_result(env, cc, ncc, hc, nhc, &envj);
    if (rc < 0)
        goto out;
    rc = -ENOMEM;

    bool regression = cnt.outcome_regressions > 0 || cnt.status[C_DIVERGED] > 0 ||
                      cnt.missing_cells > 0 || (opt->perf_gate && cnt.perf_regressions > 0);
    int e = 0;
    e |= set(res, "verdict", json_string(regression ? "regression" : "pass"));
    e |= set(res, "mode", json_string(cross ? "cross_width" : "same_width"));
    if (cross) {
        e |= set(res, "control_width", json_string(opt->control_width));
        e |= set(res, "head_width", json_string(opt->head_width));
    }
    counts = json_object();
    if (counts != NULL) {
        e |= set(counts, "cells", json_integer(cnt.cells));
        for (int st = 0; st < C__COUNT; st++)
            e |= set(counts, cstatus_names[st], json_integer(cnt.status[st]));
        e |= set(counts, "missing_cells", json_integer(cnt.missing_cells));
        e |= set(counts, "extra_cells", json_integer(cnt.extra_cells));
        e |= set(counts, "outcome_regressions", json_integer(cnt.outcome_regressions));
        e |= set(counts, "outcome_fixes", json_integer(cnt.outcome_fixes));
        e |= set(counts, "perf_regressions", json_integer(cnt.perf_regressions));
        e |= set(counts, "perf_improvements", json_integer(cnt.perf_improvements));
        e |= set(counts, "perf_unknown", json_integer(cnt.perf_unknown));
        e |= set(counts, "perf_unstable", json_integer(cnt.perf_unstable));
        e |= set(counts, "perf_same", json_integer(cnt.perf_same));
        e |= set(counts, "device_mismatches", json_integer(cnt.device_mismatches));
        e |= set(counts, "lost_coverage", json_integer(cnt.lost_coverage));
    }
    e |= set(res, "counts", counts);
    counts = NULL;
    json_t *th = json_pack("{s:f, s:f, s:i, s:I}", "perf_threshold", opt->perf_threshold, "alpha",
                           opt->alpha, "bootstrap_resamples", opt->bootstrap_resamples,
                           "bootstrap_seed", (json_int_t)opt->bootstrap_seed);
    if (th != NULL) {
        e |= set(th, "allow_device_mismatch", json_boolean(opt->allow_device_mismatch));
        e |= set(th, "perf_gate", json_boolean(opt->perf_gate));
    }
    e |= set(res, "thresholds", th);
    e |= set(res, "cells", cells);
    cells = NULL;
    e |= set(res, "missing_cells", miss);
    miss = NULL;
    e |= set(res, "extra_cells", extra);
    extra = NULL;
    e |= set(res, "environment", envj);
    envj = NULL;
    if (e)
        goto out;
    *result_out = res;
    res = NULL;
    rc = 0;
out:
    json_decref(res);
    json_decref(cells);
    json_decref(miss);
    json_decref(extra);
    json_decref(counts);
    json_decref(envj);
    cmp__env_free(env);
    cmp_scratch_free(s);
    free(cc);
    free(hc);
    return rc;
}
