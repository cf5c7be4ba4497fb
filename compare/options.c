/*
 * compare/options.c - tolerances and thresholds, and their JSON overrides.
 *
 * Defaults follow torch.testing.assert_close, because that is the tolerance
 * PyTorch's own test suite holds kernels to: a capd divergence then means
 * "this would fail a PyTorch test", not a number we made up. Integer and bool
 * tensors are compared exactly.
 */
#include <errno.h>
#include <fnmatch.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>

#include "compare/cmp_int.h"

void cmp_options_init(struct cmp_options *o)
{
    memset(o, 0, sizeof(*o));
    for (int i = 0; i < CMP_DTYPE__COUNT; i++)
        o->tol[i] = (struct cmp_tol){0.0, 0.0};
    o->tol[CMP_DTYPE_FLOAT32] = (struct cmp_tol){.atol = 1e-5, .rtol = 1.3e-6};
    o->tol[CMP_DTYPE_FLOAT64] = (struct cmp_tol){.atol = 1e-7, .rtol = 1e-7};
    o->tol[CMP_DTYPE_FLOAT16] = (struct cmp_tol){.atol = 1e-5, .rtol = 1e-3};
    o->tol[CMP_DTYPE_BFLOAT16] = (struct cmp_tol){.atol = 1e-5, .rtol = 1.6e-2};
    /* undecodable dtypes are judged on statistics; float32's bounds are the best guess */
    o->tol[CMP_DTYPE_OTHER] = (struct cmp_tol){.atol = 1e-5, .rtol = 1.3e-6};
    o->perf_threshold = 0.05;
    o->alpha = 0.01;
    o->bootstrap_seed = UINT64_C(0x6361706463617064);
    o->bootstrap_resamples = 2000;
    o->perf_gate = true;
}

/*
 * The tolerance of one record: the first key pattern that matches, else the
 * dtype's. A pattern may set only one of atol/rtol (NaN keeps the dtype's).
 */
struct cmp_tol cmp__tol_for(const struct cmp_options *o, const char *key, enum cmp_dtype dt)
{
    struct cmp_tol t = o->tol[dt];
    for (size_t i = 0; i < o->n_key_tols; i++) {
        const struct cmp_key_tol *k = &o->key_tols[i];
        if (fnmatch(k->pattern, key, 0) == 0) {
            if (!isnan(k->atol))
                t.atol = k->atol;
            if (!isnan(k->rtol))
                t.rtol = k->rtol;
            break;
        }
    }
    return t;
}

__attribute__((format(printf, 3, 4))) static int fail(struct cmp_err *err, const char *field,
                                                      const char *fmt, ...)
{
    if (err != NULL) {
        va_list ap;
        snprintf(err->field, sizeof(err->field), "%s", field);
        va_start(ap, fmt);
        vsnprintf(err->message, sizeof(err->message), fmt, ap);
        va_end(ap);
    }
    return -EINVAL;
}

/* A tolerance must be a finite, non-negative JSON number (integers count). */
static int get_tol(const json_t *v, const char *field, double *out, struct cmp_err *err)
{
    if (!json_is_number(v))
        return fail(err, field, "must be a number");
    double d = json_number_value(v);
    if (!isfinite(d) || d < 0)
        return fail(err, field, "must be a finite number >= 0");
    *out = d;
    return 0;
}

static int apply_tolerances(struct cmp_options *o, const json_t *tols, struct cmp_err *err)
{
    const char *name;
    const json_t *v;
    char field[128];

    if (!json_is_object(tols))
        return fail(err, "tolerances", "must be an object of dtype names");
    json_object_foreach((json_t *)tols, name, v)
    {
        enum cmp_dtype dt = cmp_dtype_from_name(name);
        snprintf(field, sizeof(field), "tolerances.%s", name);
        if (dt == CMP_DTYPE_OTHER && strcmp(name, "other") != 0)
            return fail(err, field, "unknown dtype");
        if (!json_is_object(v))
            return fail(err, field, "must be an object with atol and/or rtol");
        const char *k;
        const json_t *x;
        json_object_foreach((json_t *)v, k, x)
        {
            snprintf(field, sizeof(field), "tolerances.%s.%s", name, k);
            int rc;
            if (strcmp(k, "atol") == 0)
                rc = get_tol(x, field, &o->tol[dt].atol, err);
            else if (strcmp(k, "rtol") == 0)
                rc = get_tol(x, field, &o->tol[dt].rtol, err);
            else
                rc = fail(err, field, "unknown field");
            if (rc < 0)
                return rc;
        }
    }
    return 0;
}

static int apply_key_tolerances(struct cmp_options *o, const json_t *arr, struct cmp_err *err)
{
    struct cmp_key_tol add[CMP_MAX_KEY_TOLS];
    size_t n = json_array_size(arr);
    char field[128];

    if (!json_is_array(arr))
        return fail(err, "key_tolerances", "must be an array");
    if (n + o->n_key_tols > CMP_MAX_KEY_TOLS)
        return fail(err, "key_tolerances", "at most %d patterns in all", CMP_MAX_KEY_TOLS);
    for (size_t i = 0; i < n; i++) {
        const json_t *e = json_array_get(arr, i);
        struct cmp_key_tol *kt = &add[i];
        kt->pattern[0] = '\0';
        kt->atol = kt->rtol = NAN;
        snprintf(field, sizeof(field), "key_tolerances[%zu]", i);
        if (!json_is_object(e))
            return fail(err, field, "must be an object with pattern, atol, rtol");
        const char *k;
        const json_t *x;
        json_object_foreach((json_t *)e, k, x)
        {
            int rc = 0;
            snprintf(field, sizeof(field), "key_tolerances[%zu].%s", i, k);
            if (strcmp(k, "pattern") == 0) {
                const char *p = json_string_value(x);
                if (p == NULL || p[0] == '\0')
                    rc = fail(err, field, "must be a non-empty string");
                else if (strlen(p) >= CMP_MAX_PATTERN)
                    rc = fail(err, field, "longer than %d bytes", CMP_MAX_PATTERN - 1);
                else
                    memcpy(kt->pattern, p, strlen(p) + 1);
            } else if (strcmp(k, "atol") == 0) {
                rc = get_tol(x, field, &kt->atol, err);
            } else if (strcmp(k, "rtol") == 0) {
                rc = get_tol(x, field, &kt->rtol, err);
            } else {
                rc = fail(err, field, "unknown field");
            }
            if (rc < 0)
                return rc;
        }
        snprintf(field, sizeof(field), "key_tolerances[%zu]", i);
        if (kt->pattern[0] == '\0')
            return fail(err, field, "pattern is required");
        if (isnan(kt->atol) && isnan(kt->rtol))
            return fail(err, field, "needs atol or rtol");
    }
    /* new entries first: the most recently applied override wins */
    memmove(o->key_tols + n, o->key_tols, o->n_key_tols * sizeof(o->key_tols[0]));
    memcpy(o->key_tols, add, n * sizeof(add[0]));
    o->n_key_tols += n;
    return 0;
}

static int apply_bootstrap(struct cmp_options *o, const json_t *b, struct cmp_err *err)
{
    const char *k;
    const json_t *x;
    if (!json_is_object(b))
        return fail(err, "bootstrap", "must be an object with seed and/or resamples");
    json_object_foreach((json_t *)b, k, x)
    {
        if (strcmp(k, "seed") == 0) {
            if (!json_is_integer(x) || json_integer_value(x) < 0)
                return fail(err, "bootstrap.seed", "must be an integer >= 0");
            o->bootstrap_seed = (uint64_t)json_integer_value(x);
        } else if (strcmp(k, "resamples") == 0) {
            if (!json_is_integer(x) || json_integer_value(x) < 0 ||
                json_integer_value(x) > CMP_MAX_BOOTSTRAP)
                return fail(err, "bootstrap.resamples", "must be an integer in [0, %d]",
                            CMP_MAX_BOOTSTRAP);
            o->bootstrap_resamples = (int)json_integer_value(x);
        } else {
            char field[128];
            snprintf(field, sizeof(field), "bootstrap.%s", k);
            return fail(err, field, "unknown field");
        }
    }
    return 0;
}

static int apply_cross_width(struct cmp_options *o, const json_t *cw, struct cmp_err *err)
{
    if (json_is_null(cw)) {
        o->control_width[0] = o->head_width[0] = '\0';
        return 0;
    }
    if (!json_is_object(cw))
        return fail(err, "cross_width", "must be an object with control and head, or null");
    const char *k;
    const json_t *x;
    json_object_foreach((json_t *)cw, k, x)
    {
        if (strcmp(k, "control") != 0 && strcmp(k, "head") != 0) {
            char field[128];
            snprintf(field, sizeof(field), "cross_width.%s", k);
            return fail(err, field, "unknown field");
        }
    }
    const char *c = json_string_value(json_object_get(cw, "control"));
    const char *h = json_string_value(json_object_get(cw, "head"));
    if (c == NULL || c[0] == '\0' || strlen(c) >= CMP_MAX_WIDTH_NAME)
        return fail(err, "cross_width.control", "must be a width name");
    if (h == NULL || h[0] == '\0' || strlen(h) >= CMP_MAX_WIDTH_NAME)
        return fail(err, "cross_width.head", "must be a width name");
    memcpy(o->control_width, c, strlen(c) + 1);
    memcpy(o->head_width, h, strlen(h) + 1);
    return 0;
}

const char *cmp_reference_name(enum cmp_reference r)
{
    return r == CMP_REF_FLOAT64 ? "float64" : r == CMP_REF_DEFAULT_WIDTH ? "default-width" : "none";
}

const char *cmp_reference_rule(enum cmp_reference r)
{
    return r == CMP_REF_FLOAT64         ? "reference_float64"
           : r == CMP_REF_DEFAULT_WIDTH ? "reference_default_width"
                                        : "tolerance";
}

int cmp_reference_from_name(const char *name, enum cmp_reference *out)
{
    static const enum cmp_reference all[] = {CMP_REF_NONE, CMP_REF_FLOAT64, CMP_REF_DEFAULT_WIDTH};
    if (name == NULL) {
        *out = CMP_REF_NONE;
        return 0;
    }
    for (size_t i = 0; i < sizeof all / sizeof all[0]; i++)
        if (strcmp(name, cmp_reference_name(all[i])) == 0) {
            *out = all[i];
            return 0;
        }
    return -EINVAL;
}

/* The boolean option K: V must be true or false. */
static int read_bool(const char *k, const json_t *v, bool *out, struct cmp_err *err)
{
    if (!json_is_boolean(v))
        return fail(err, k, "must be true or false");
    *out = json_is_true(v);
    return 0;
}

int cmp_options_apply_json(struct cmp_options *opt, const json_t *j, struct cmp_err *err)
{
    /* work on a copy so a rejected object leaves the caller's options untouched */
    struct cmp_options o = *opt;
    const char *k;
    const json_t *v;
    int rc = 0;

    if (!json_is_object(j))
        return fail(err, "", "options must be a JSON object");
    json_object_foreach((json_t *)j, k, v)
    {
        if (strcmp(k, "tolerances") == 0) {
            rc = apply_tolerances(&o, v, err);
        } else if (strcmp(k, "key_tolerances") == 0) {
            rc = apply_key_tolerances(&o, v, err);
        } else if (strcmp(k, "perf_threshold") == 0) {
            if (!json_is_number(v) || !(json_number_value(v) >= 0) || !(json_number_value(v) <= 10))
                rc = fail(err, k, "must be a number in [0, 10]");
            else
                o.perf_threshold = json_number_value(v);
        } else if (strcmp(k, "alpha") == 0) {
            if (!json_is_number(v) || !(json_number_value(v) > 0) || !(json_number_value(v) < 1))
                rc = fail(err, k, "must be a number in (0, 1)");
            else
                o.alpha = json_number_value(v);
        } else if (strcmp(k, "bootstrap") == 0) {
            rc = apply_bootstrap(&o, v, err);
        } else if (strcmp(k, "include_tensors") == 0) {
            rc = read_bool(k, v, &o.include_tensors, err);
        } else if (strcmp(k, "cross_width") == 0) {
            rc = apply_cross_width(&o, v, err);
        } else if (strcmp(k, "allow_device_mismatch") == 0) {
            rc = read_bool(k, v, &o.allow_device_mismatch, err);
        } else if (strcmp(k, "perf_gate") == 0) {
            rc = read_bool(k, v, &o.perf_gate, err);
        } else if (strcmp(k, "reference") == 0) {
            if ((!json_is_null(v) && !json_is_string(v)) ||
                cmp_reference_from_name(json_string_value(v), &o.reference) < 0)
                rc = fail(err, k, "must be one of: none, float64, default-width (or null)");
        } else {
            rc = fail(err, k, "unknown field");
        }
        if (rc < 0)
            return rc;
    }
    *opt = o;
    return 0;
}
