/*
 * compare/engine_json.c - the objects of a comparison result: a record pair,
 * a cell pair, its memory, and the result's verdict, counts and thresholds
 * (docs/compare.md is the contract for every field name).
 */
#include <errno.h>
#include <math.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "compare/engine_int.h"

#define KEY_NAMES_SHOWN 5 /* missing/extra key names listed per cell */

static const char *const tclass_names[] = {"identical", "within_tolerance", "diverged",
                                           "nondeterministic"};

static const char *const cstatus_names[] = {"identical",        "within_tolerance", "diverged",
                                            "nondeterministic", "incomparable",     "not_run"};

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

int cmp__set_reals(json_t *obj, const struct cmp__real *f, size_t n)
{
    int rc = 0;
    for (size_t i = 0; i < n; i++)
        rc |= cmp__set_real(obj, f[i].name, f[i].v);
    return rc;
}

int cmp__set(json_t *o, const char *k, json_t *v)
{
    return json_object_set_new(o, k, v) ? -ENOMEM : 0;
}

json_t *cmp__obj_or_null(json_t *o, int e)
{
    if (e == 0)
        return o;
    json_decref(o);
    return NULL;
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
    static const char *const names[] = {
        [CMP_BASIS_EXACT] = "exact", [CMP_BASIS_FULL] = "full", [CMP_BASIS_SAMPLE] = "sample"};
    return (unsigned)b < sizeof names / sizeof names[0] ? names[b] : "stats";
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
static json_t *row_json(const struct cmp__row *r)
{
    const struct cmp_metrics *m = &r->m;
    const struct cmp__rec *h = r->h, *c = r->c;
    json_t *o = json_object();
    int rc = 0;

    if (o == NULL)
        return NULL;
    rc |= cmp__set(o, "key", json_string(h->key));
    if (strcmp(h->key, c->key) != 0) /* per-op records paired by alignment (opalign.c) */
        rc |= cmp__set(o, "control_key", json_string(c->key));
    rc |= cmp__set(o, "seq", json_integer(h->seq));
    rc |= cmp__set(o, "control_seq", json_integer(c->seq));
    rc |= cmp__set(o, "module", str_or_null(h->module));
    rc |= cmp__set(o, "call", json_integer(h->call));
    rc |= cmp__set(o, "phase", json_string(cmp__phase_name(h->phase)));
    rc |= cmp__set(o, "role", json_string(cmp__role_name(h->role)));
    if (h->op != NULL) { /* a per-op record (ops.c) */
        rc |= cmp__set(o, "op", json_string(h->op));
        rc |= cmp__set(o, "op_index", json_integer(h->op_index));
    }
    rc |= cmp__set(o, "dtype", json_string(c->dtype_name));
    rc |= cmp__set(o, "status", json_string(tclass_names[r->cls]));
    if (r->cls == CMP__T_DIVERGED)
        rc |= cmp__set(o, "reason", json_string(diverge_reason(m)));
    rc |= cmp__set(o, "basis", json_string(basis_name(m->basis)));
    rc |= cmp__reference_row_json(r, o);
    if (m->hash_alg_mixed) { /* the hashes said nothing: judged on payloads and statistics */
        rc |= cmp__set(o, "hash_alg_mixed", json_true());
        rc |= cmp__set(o, "head_hash_alg", json_string(h->hash_alg));
        rc |= cmp__set(o, "control_hash_alg", json_string(c->hash_alg));
    }
    if (m->basis == CMP_BASIS_EXACT)
        goto done;
    if (m->mismatch != CMP_MISMATCH_NONE) {
        rc |= cmp__set(o, "head_dtype", json_string(h->dtype_name));
        rc |= cmp__set(o, "head_shape", shape_json(h));
        rc |= cmp__set(o, "control_shape", shape_json(c));
    }
    rc |= cmp__set_real(o, "atol", m->atol);
    rc |= cmp__set_real(o, "rtol", m->rtol);
    if (m->basis == CMP_BASIS_FULL || m->basis == CMP_BASIS_SAMPLE) {
        rc |= cmp__set(o, "n", json_integer(m->n));
        rc |= cmp__set(o, "n_finite", json_integer(m->n_finite));
        const struct cmp__real sizes[] = {{"max_abs", m->max_abs},
                                          {"mean_abs", m->mean_abs},
                                          {"p99_abs", m->p99_abs},
                                          {"max_rel", m->max_rel},
                                          {"mean_rel", m->mean_rel}};
        const struct cmp__real similarity[] = {
            {"cosine", m->cosine}, {"sqnr_db", m->sqnr_db}, {"nl2", m->nl2}};
        rc |= cmp__set_reals(o, sizes, sizeof sizes / sizeof sizes[0]);
        rc |= cmp__set(o, "allclose_violations", json_integer(m->allclose_violations));
        rc |= cmp__set_reals(o, similarity, sizeof similarity / sizeof similarity[0]);
    }
    if (m->basis == CMP_BASIS_STATS && m->mismatch == CMP_MISMATCH_NONE)
        rc |= cmp__derived_json(o, h, c); /* derived.c: sizes from the statistics */
    rc |= cmp__set(o, "stat_violations", json_integer(m->stat_violations));
    rc |= cmp__set(o, "nan_one_sided", json_integer(m->nan_one_sided));
    rc |= cmp__set(o, "inf_one_sided", json_integer(m->inf_one_sided));
    json_t *d = json_object();
    rc |= cmp__set(o, "delta", d);
    if (d != NULL) {
        const struct cmp__real delta[] = {
            {"min", m->d_min}, {"max", m->d_max}, {"mean", m->d_mean}, {"l2", m->d_l2}};
        rc |= cmp__set_reals(d, delta, sizeof delta / sizeof delta[0]);
    }
done:
    if (rc) {
        json_decref(o);
        return NULL;
    }
    return o;
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

/* One kind of peak: the control's and the head's (null when unknown) as
 * NAMES[0] and NAMES[1], and head over control as NAMES[2] (null without a
 * control peak). */
static int peaks_json(json_t *o, const char *const names[3], int64_t c, int64_t h)
{
    int rc = cmp__set(o, names[0], peak_json(c));
    rc |= cmp__set(o, names[1], peak_json(h));
    if (c > 0 && h >= 0)
        return rc | cmp__set_real(o, names[2], (double)h / (double)c);
    return rc | cmp__set(o, names[2], json_null());
}

static int memory_json(const struct cmp_cell *c, const struct cmp_cell *h, json_t **out)
{
    static const char *const rss[] = {"control_peak", "head_peak", "ratio"};
    static const char *const dev[] = {"control_device_peak", "head_device_peak", "device_ratio"};
    json_t *o = json_object();
    if (o == NULL)
        return -ENOMEM;
    int rc = peaks_json(o, rss, c->peak_rss, h->peak_rss);
    rc |= peaks_json(o, dev, c->device_peak, h->device_peak);
    if (rc) {
        json_decref(o);
        return -ENOMEM;
    }
    *out = o;
    return 0;
}

/* ------------------------------------------------------- one cell pair */

/* "control_NAME" and "head_NAME", each side's string or null (NAME is a
 * short literal: the names fit the buffer). */
static int sides_json(json_t *cj, const char *name, const char *control, const char *head)
{
    char key[64];
    snprintf(key, sizeof key, "control_%s", name);
    int e = cmp__set(cj, key, str_or_null(control));
    snprintf(key, sizeof key, "head_%s", name);
    return e | cmp__set(cj, key, str_or_null(head));
}

/* The cell pair's identity, status, outcomes and devices. */
static int cell_id_json(const struct cmp__cellcmp *k, json_t *cj)
{
    const struct cmp_cell *c = k->c, *h = k->h;
    int e = 0;
    e |= cmp__set(cj, "model", json_string(h->model));
    e |= cmp__set(cj, "width", json_string(h->width));
    e |= cmp__set(cj, "pass", json_string(h->pass));
    e |= cmp__set(cj, "mode", json_string(h->mode));
    if (k->cross)
        e |= cmp__set(cj, "control_width", json_string(c->width));
    if (k->cross_mode)
        e |= cmp__set(cj, "control_mode", json_string(c->mode));
    e |= cmp__set(cj, "status", json_string(cstatus_names[k->st]));
    e |= cmp__set(cj, "incomparable_reason",
                  str_or_null(k->st == CMP__C_INCOMPARABLE ? k->why : NULL));
    e |= cmp__set(cj, "not_run_reason", str_or_null(k->st == CMP__C_NOT_RUN ? k->why : NULL));
    e |= sides_json(cj, "host_missing", c->host_missing, h->host_missing);
    e |= sides_json(cj, "outcome", cmp__outcome_name(c), cmp__outcome_name(h));
    e |= cmp__set(cj, "outcome_change", json_string(k->oc));
    e |= sides_json(cj, "effective_width", c->effective_width, h->effective_width);
    e |= sides_json(cj, "device", c->device, h->device);
    e |= cmp__set(cj, "device_check", json_string(k->dev_check));
    return e;
}

/* How many record pairs fell in each class, and the keys one side lacks. */
static int cell_records_json(const struct cmp__cellcmp *k, json_t *cj)
{
    int e = 0;
    e |= cmp__set(cj, "tensors_compared", json_integer((json_int_t)k->nrows));
    e |= cmp__set(cj, "tensors_identical", json_integer(k->ncls[CMP__T_IDENTICAL]));
    e |= cmp__set(cj, "tensors_within_tolerance", json_integer(k->ncls[CMP__T_WITHIN]));
    e |= cmp__set(cj, "tensors_diverged", json_integer(k->ncls[CMP__T_DIVERGED]));
    e |= cmp__set(cj, "tensors_nondeterministic", json_integer(k->ncls[CMP__T_NONDET]));
    if (k->nmixed > 0) /* only then, so that results of one algorithm keep their bytes */
        e |= cmp__set(cj, "tensors_hash_alg_mixed", json_integer(k->nmixed));
    if (k->ops_realigned > 0) /* only then, like tensors_hash_alg_mixed */
        e |= cmp__set(cj, "ops_realigned", json_integer(k->ops_realigned));
    if (k->ops_unaligned > 0)
        e |= cmp__set(cj, "ops_unaligned", json_integer(k->ops_unaligned));
    e |= cmp__set(cj, "missing_keys", json_integer((json_int_t)k->nmiss));
    e |= cmp__set(cj, "extra_keys", json_integer((json_int_t)k->nextra));
    e |= cmp__set(cj, "missing_key_names", names_json(k->missing, k->nmiss));
    e |= cmp__set(cj, "extra_key_names", names_json(k->extra, k->nextra));
    e |= cmp__set(cj, "params_differed", json_boolean(k->params_differed));
    return e;
}

/* Where the cell first diverged, and where the error was introduced. */
static int cell_origins_json(const struct cmp__cellcmp *k, json_t *cj)
{
    int e = 0;
    if (k->first_div != NULL) {
        e |= cmp__set(cj, "first_divergence", row_json(k->first_div));
    } else if (k->st == CMP__C_DIVERGED && (k->nmiss > 0 || k->nextra > 0)) {
        /*
         * Only the key sets differ: point at the first record that is not
         * shared. (A crashed side is missing keys as a matter of course;
         * that is reported as its outcome, not here.)
         */
        const struct cmp__rec *r = k->nmiss > 0 ? k->missing[0] : k->extra[0];
        json_t *sub = json_object();
        if (sub != NULL) {
            e |= cmp__set(sub, "key", json_string(r->key));
            e |= cmp__set(sub, "seq", json_integer(r->seq));
            e |= cmp__set(sub, "status", json_string("diverged"));
            e |= cmp__set(sub, "reason",
                          json_string(k->nmiss > 0 ? "missing_in_head" : "extra_in_head"));
        }
        e |= cmp__set(cj, "first_divergence", sub);
    } else {
        e |= cmp__set(cj, "first_divergence", json_null());
    }
    e |= cmp__set(cj, "first_introduced", k->first_intro ? row_json(k->first_intro) : json_null());
    e |= cmp__op_origin_json(k, cj);
    return e;
}

/* Where NaN/Inf first appeared on each side, from its own records (ops.c). */
static int cell_nonfinite_json(const struct cmp__cellcmp *k, json_t *cj)
{
    int e = 0;
    for (int side = 0; side < 2 && !e; side++) {
        json_t *nf = NULL;
        e |= cmp__first_nonfinite(side ? k->c : k->h, &nf);
        e |= cmp__set(cj, side ? "control_first_nonfinite" : "first_nonfinite",
                      nf ? nf : json_null());
    }
    return e;
}

/*
 * A judged cell pair's object, in the order docs/compare.md lists its
 * fields: identity and status, the records, the origins of a divergence,
 * perf, memory, and every record pair when the options ask for them.
 */
int cmp__cell_json(const struct cmp__cellcmp *k, json_t **out)
{
    json_t *cj = json_object(), *sub = NULL;
    int e = 0;

    if (cj == NULL)
        return -ENOMEM;
    e |= cell_id_json(k, cj);
    e |= cell_records_json(k, cj);
    e |= cmp__reference_cell_json(k, cj);
    e |= cell_origins_json(k, cj);
    if (!e)
        e |= cmp__amplify_json(k, cj);
    if (!e)
        e |= cell_nonfinite_json(k, cj);
    e |= cmp__perf_json(&k->perf, k->o, &sub);
    if (e == 0) {
        json_t *why = NULL;
        e |= cmp__profile_json(k->h, &why);
        e |= why ? cmp__set(sub, "profile", why) : 0;
    }
    if (e == 0 && (k->c->compile_ns >= 0 || k->h->compile_ns >= 0)) {
        static const char *const names[] = {"control_compile_ns", "head_compile_ns",
                                            "compile_ratio"};
        e |= peaks_json(sub, names, k->c->compile_ns, k->h->compile_ns);
    }
    e |= cmp__set(cj, "perf", sub);
    sub = NULL;
    e |= memory_json(k->c, k->h, &sub);
    e |= cmp__set(cj, "memory", sub);
    sub = NULL;
    if (k->o->include_tensors) {
        json_t *tensors = json_array();
        for (size_t r = 0; tensors && r < k->nrows; r++)
            e |= json_array_append_new(tensors, row_json(&k->rows[r])) ? -ENOMEM : 0;
        e |= cmp__set(cj, "tensors", tensors);
    }
    if (e) {
        json_decref(cj);
        return -ENOMEM;
    }
    *out = cj;
    return 0;
}

/* ---------------------------------------------------------- the result */

/* The members of "counts" after "cells" and the statuses, in their order. */
#define COUNT(field)                                                                               \
    {                                                                                              \
#field, offsetof(struct cmp__counts, field)                                                \
    }
static const struct {
    const char *name;
    size_t off;
} count_fields[] = {
    COUNT(missing_cells),     COUNT(extra_cells),      COUNT(outcome_regressions),
    COUNT(outcome_fixes),     COUNT(perf_regressions), COUNT(perf_improvements),
    COUNT(perf_unknown),      COUNT(perf_unstable),    COUNT(perf_same),
    COUNT(device_mismatches), COUNT(lost_coverage),
};
#undef COUNT

static json_t *counts_json(const struct cmp__counts *cnt)
{
    json_t *counts = json_object();
    int e = 0;
    if (counts == NULL)
        return NULL;
    e |= cmp__set(counts, "cells", json_integer(cnt->cells));
    for (int st = 0; st < CMP__C__COUNT; st++)
        e |= cmp__set(counts, cstatus_names[st], json_integer(cnt->status[st]));
    for (size_t i = 0; i < sizeof count_fields / sizeof count_fields[0]; i++) {
        const int64_t *v = (const int64_t *)((const char *)cnt + count_fields[i].off);
        e |= cmp__set(counts, count_fields[i].name, json_integer(*v));
    }
    return cmp__obj_or_null(counts, e);
}

static json_t *thresholds_json(const struct cmp_options *opt)
{
    json_t *th = json_pack("{s:f, s:f, s:i, s:I}", "perf_threshold", opt->perf_threshold, "alpha",
                           opt->alpha, "bootstrap_resamples", opt->bootstrap_resamples,
                           "bootstrap_seed", (json_int_t)opt->bootstrap_seed);
    int e = 0;
    if (th == NULL)
        return NULL;
    e |= cmp__set(th, "allow_device_mismatch", json_boolean(opt->allow_device_mismatch));
    e |= cmp__set(th, "perf_gate", json_boolean(opt->perf_gate));
    e |= cmp__set(th, "reference", json_string(cmp_reference_name(opt->reference)));
    return cmp__obj_or_null(th, e);
}

/*
 * The verdict is a regression when a cell stopped running, diverged or went
 * missing, or (only when the perf gate is on) got slower.
 */
int cmp__result_json(json_t *res, const struct cmp__counts *cnt, const struct cmp_options *opt,
                     bool cross, bool cross_mode, json_t **cells, json_t **miss, json_t **extra,
                     json_t **envj)
{
    bool regression = cnt->outcome_regressions > 0 || cnt->status[CMP__C_DIVERGED] > 0 ||
                      cnt->missing_cells > 0 || (opt->perf_gate && cnt->perf_regressions > 0);
    int e = 0;
    e |= cmp__set(res, "verdict", json_string(regression ? "regression" : "pass"));
    e |= cmp__set(res, "mode", json_string(cross ? "cross_width" : "same_width"));
    if (cross) {
        e |= cmp__set(res, "control_width", json_string(opt->control_width));
        e |= cmp__set(res, "head_width", json_string(opt->head_width));
    }
    if (cross_mode) {
        e |= cmp__set(res, "control_mode", json_string(opt->control_mode));
        e |= cmp__set(res, "head_mode", json_string(opt->head_mode));
    }
    e |= cmp__set(res, "counts", counts_json(cnt));
    e |= cmp__set(res, "thresholds", thresholds_json(opt));
    e |= cmp__set(res, "cells", *cells);
    *cells = NULL;
    e |= cmp__set(res, "missing_cells", *miss);
    *miss = NULL;
    e |= cmp__set(res, "extra_cells", *extra);
    *extra = NULL;
    e |= cmp__set(res, "environment", *envj);
    *envj = NULL;
    return e ? -ENOMEM : 0;
}
