/*
 * tests/test_reference.c - the reference arbiter (compare/reference.c) on
 * hand-built cells: a record pair outside tolerance passes when the head's
 * RMS error against the reference is at most k times the control's plus
 * atol / 10, k 2 or 3 for a tensor of at most 10 elements; each verdict
 * says which rule decided it, and a record the arbiter cannot judge (no
 * values, no reference record, no default-width cell) keeps the tolerance
 * rule's verdict and says why. The reference's own records are never
 * compared as pairs.
 */
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <criterion/criterion.h>
#include <jansson.h>

#include "compare/cmp.h"
#include "tests/helpers/common/cmp_records.h"
#include "tests/helpers/common/json_want.h"
#include "tests/helpers/common/text_want.h"

#define N   100 /* elements of a large record */
#define KEY "fc.0.forward.output.0"

/* Payloads are borrowed: kept here for the test's lifetime. */
static unsigned char pool[1 << 16];
static size_t used;

/* The truth at element i, and the +-1 pattern an error follows. */
static double truth(int i)
{
    return 1000.0 + i;
}

static double sign(int i)
{
    return (i * 7) % 3 ? 1.0 : -1.0;
}

/*
 * Adds record KEY of n elements truth(i) + err * sign(i) * flip(i) (flip
 * -1 at odd i when flip is set) as DTYPE (float32 or float64) at capture
 * CAP; returns the stored values as doubles in out (when not NULL).
 */
static void add(struct cmp_cell *c, const char *key, int64_t seq, const char *dtype, int n,
                double err, bool flip, enum cmp_capture cap, double *out)
{
    bool f64 = strcmp(dtype, "float64") == 0;
    size_t sz = f64 ? 8 : 4;
    cr_assert(used + sz * (size_t)n <= sizeof pool);
    unsigned char *p = &pool[used];
    used += sz * (size_t)n;
    double l2 = 0, sum = 0, mn = INFINITY, mx = -INFINITY;
    for (int i = 0; i < n; i++) {
        double v = truth(i) + err * sign(i) * (flip && i % 2 ? -1 : 1);
        if (f64) {
            memcpy(p + 8 * i, &v, 8);
        } else {
            float x = (float)v;
            memcpy(p + 4 * i, &x, 4);
            v = x;
        }
        if (out)
            out[i] = v;
        l2 += v * v;
        sum += v;
        mn = fmin(mn, v);
        mx = fmax(mx, v);
    }
    char hash[160];
    snprintf(hash, sizeof hash, "%s-%s-%d-%a-%d", key, dtype, n, err, flip);
    struct cmp_tensor t = {.key = key, .seq = seq, .dtype = dtype, .ndim = 1, .numel = n};
    t.shape[0] = n;
    t.stats = (struct cmp_stats){
        .has_finite = true, .min = mn, .max = mx, .mean = sum / n, .l2 = sqrt(l2)};
    t.hash = hash;
    t.capture = cap;
    if (cap != CMP_CAPTURE_NONE) {
        t.payload = p;
        t.payload_len = sz * (size_t)n;
    }
    cr_assert_eq(cmp_cell_add_tensor(c, &t), 0, "%s", key);
}

static struct cmp_cell *cell(struct cmp_side *s, const char *width)
{
    return crec_cell(s, "mm", width, "forward");
}

/* The RMS difference of a[0..n) from the float64 truth. */
static double rms(const double *a, int n)
{
    double s = 0;
    for (int i = 0; i < n; i++)
        s += (a[i] - truth(i)) * (a[i] - truth(i));
    return sqrt(s / n);
}

/* Two sides, the values their records hold, and the last comparison of
 * them (r), which done frees with the sides. */
struct fixture {
    struct cmp_side *c, *h;
    double hv[N], cv[N];
    json_t *r;
};

/*
 * A control of error 0.01 and a head of error HEAD_ERR (flipped: the same
 * size, another pattern) at the same width, both N elements (or n), the
 * control cell holding the float64 reference unless NO_REF. Both are
 * outside float32's tolerance of each other.
 */
static void build(struct fixture *f, int n, double head_err, bool flip, enum cmp_capture cap,
                  bool no_ref)
{
    used = 0;
    f->r = NULL;
    cr_assert_eq(cmp_side_new(&f->c), 0);
    cr_assert_eq(cmp_side_new(&f->h), 0);
    struct cmp_cell *cc = cell(f->c, "avx2"), *hc = cell(f->h, "avx2");
    add(cc, KEY, 0, "float32", n, 0.01, false, cap, f->cv);
    add(hc, KEY, 0, "float32", n, head_err, flip, cap, f->hv);
    if (!no_ref)
        add(cc, "ref.float64/" KEY, 1, "float64", n, 0, false, cap, NULL);
}

static void done(struct fixture *f)
{
    json_decref(f->r);
    cmp_side_free(f->c);
    cmp_side_free(f->h);
}

/* Compares F's sides judged by REFERENCE into F->r (freeing the last
 * comparison) and returns its first cell. */
static json_t *compare(struct fixture *f, const char *reference)
{
    struct cmp_options o;
    struct cmp_err e;
    cmp_options_init(&o);
    o.include_tensors = true;
    json_t *ov = json_pack("{s:s}", "reference", reference);
    cr_assert_eq(cmp_options_apply_json(&o, ov, &e), 0, "%s: %s", e.field, e.message);
    json_decref(ov);
    json_decref(f->r);
    f->r = NULL;
    cr_assert_eq(cmp_compare(f->c, f->h, &o, &f->r), 0);
    return jw_path(f->r, "cells.0");
}

/* The float64 arbiter's judgement of HOLDER (a tensor's row or a first
 * divergence): checks that it PASSED or not and that its head error is
 * the RMS of F's head, and gives the head and control errors. */
static json_t *judgement(json_t *holder, const struct fixture *f, bool passed, double *eh,
                         double *ec)
{
    json_t *rj = json_object_get(holder, "reference");
    cr_assert_eq(json_is_true(json_object_get(rj, "passed")), passed);
    cr_assert(json_is_boolean(json_object_get(rj, "passed")));
    *eh = json_real_value(json_object_get(rj, "err_head"));
    *ec = json_real_value(json_object_get(rj, "err_control"));
    cr_assert_float_eq(*eh, rms(f->hv, N), 1e-12);
    return rj;
}

Test(reference, an_equally_accurate_head_passes_by_float64)
{
    struct fixture f;
    build(&f, N, 0.01, true, CMP_CAPTURE_FULL, false);
    json_t *c = compare(&f, "float64");
    cr_assert_str_eq(jw_str(c, "status"), "within_tolerance");
    cr_assert_str_eq(jw_str(c, "rule"), "reference_float64");
    cr_assert_eq(json_integer_value(json_object_get(c, "tensors_compared")), 1,
                 "the reference's record is not a pair");
    cr_assert_eq(json_integer_value(json_object_get(c, "missing_keys")), 0);
    json_t *ref = json_object_get(c, "reference");
    cr_assert_str_eq(jw_str(ref, "kind"), "float64");
    cr_assert_eq(json_integer_value(json_object_get(ref, "passed")), 1);
    json_t *row = json_array_get(json_object_get(c, "tensors"), 0);
    cr_assert_str_eq(jw_str(row, "rule"), "reference_float64");
    double eh, ec;
    json_t *rj = judgement(row, &f, true, &eh, &ec);
    cr_assert_float_eq(ec, rms(f.cv, N), 1e-12);
    cr_assert_float_eq(json_real_value(json_object_get(rj, "k")), 2.0, 0);
    cr_assert_float_eq(json_real_value(json_object_get(rj, "tol")), 1e-6, 1e-18);
    cr_assert_str_eq(jw_str(json_object_get(f.r, "thresholds"), "reference"), "float64");
    cr_assert_str_eq(jw_str(f.r, "verdict"), "pass");

    /* The same pair without the arbiter: the tolerance rule diverges it. */
    c = compare(&f, "none");
    cr_assert_str_eq(jw_str(c, "status"), "diverged");
    cr_assert_str_eq(jw_str(c, "rule"), "tolerance");
    cr_assert(json_is_null(json_object_get(c, "reference")));
    cr_assert_null(json_object_get(json_object_get(c, "first_divergence"), "rule"));
    done(&f);
}

Test(reference, a_head_three_times_further_from_the_truth_diverges)
{
    struct fixture f;
    build(&f, N, 0.03, false, CMP_CAPTURE_FULL, false);
    json_t *c = compare(&f, "float64");
    cr_assert_str_eq(jw_str(c, "status"), "diverged");
    cr_assert_str_eq(jw_str(c, "rule"), "reference_float64", "the arbiter judged and refused it");
    json_t *d = json_object_get(c, "first_divergence");
    cr_assert_str_eq(jw_str(d, "rule"), "reference_float64");
    double eh, ec;
    judgement(d, &f, false, &eh, &ec);
    cr_assert_gt(eh, 2 * ec + 1e-6, "%g vs %g", eh, ec);
    cr_assert_str_eq(jw_str(f.r, "verdict"), "regression");
    /* Both reports say which rule decided, and by how much. */
    char *md = cmp_result_to_markdown(f.r), *txt = cmp_result_to_text(f.r);
    tw_expect_has(md, "diverged (rule reference_float64)",
                  "reference_float64: err 0.03 > 2 x 0.01 + 1e-06", NULL);
    cr_assert(strstr(txt, "diverged mm/avx2/forward (rule reference_float64)"), "%s", txt);
    free(md);
    free(txt);
    done(&f);
}

/* 2.5 times the control's error: refused at k 2, passed at k 3, which a
 * tensor of at most 10 elements gets. */
Test(reference, a_small_tensor_gets_k_three)
{
    static const struct {
        int n;
        const char *status;
        double k;
    } cases[] = {{N, "diverged", 2}, {10, "within_tolerance", 3}, {11, "diverged", 2}};
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        struct fixture f;
        build(&f, cases[i].n, 0.025, false, CMP_CAPTURE_FULL, false);
        json_t *c = compare(&f, "float64");
        cr_assert_str_eq(jw_str(c, "status"), cases[i].status, "n %d", cases[i].n);
        json_t *row = json_array_get(json_object_get(c, "tensors"), 0);
        cr_assert_float_eq(json_real_value(json_object_get(json_object_get(row, "reference"), "k")),
                           cases[i].k, 0, "n %d", cases[i].n);
        done(&f);
    }
}

/* What the arbiter cannot judge keeps the tolerance rule's verdict, and
 * the record and the cell say why. */
Test(reference, no_values_or_no_record_falls_back_with_a_reason)
{
    static const struct {
        enum cmp_capture cap;
        bool no_ref;
        const char *why;
    } cases[] = {{CMP_CAPTURE_NONE, false, "no_values"},
                 {CMP_CAPTURE_FULL, true, "no_reference_record"}};
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        struct fixture f;
        build(&f, N, 0.01, true, cases[i].cap, cases[i].no_ref);
        json_t *c = compare(&f, "float64");
        cr_assert_str_eq(jw_str(c, "status"), "diverged", "%s", cases[i].why);
        cr_assert_str_eq(jw_str(c, "rule"), "tolerance", "%s", cases[i].why);
        json_t *d = json_object_get(c, "first_divergence");
        cr_assert_str_eq(jw_str(d, "rule"), "tolerance");
        cr_assert_str_eq(jw_str(json_object_get(d, "reference"), "reason"), cases[i].why);
        cr_assert(json_is_false(json_object_get(json_object_get(d, "reference"), "judged")));
        char *txt = cmp_result_to_text(f.r), want[96];
        snprintf(want, sizeof want, "tolerance rule: reference %s", cases[i].why);
        cr_assert(strstr(txt, "mm/avx2/forward (rule tolerance)") && strstr(txt, want), "%s", txt);
        free(txt);
        done(&f);
    }
}

/* default-width: the control side's default cell of the same model and
 * pass is the reference; without one the cell says so. */
Test(reference, default_width_is_the_control_sides_default_cell)
{
    for (int with_default = 0; with_default < 2; with_default++) {
        struct fixture f;
        build(&f, N, 0.01, true, CMP_CAPTURE_FULL, true);
        if (with_default)
            add(cell(f.c, "default"), KEY, 0, "float32", N, 0, false, CMP_CAPTURE_FULL, NULL);
        struct cmp_options o;
        cmp_options_init(&o);
        o.reference = CMP_REF_DEFAULT_WIDTH;
        snprintf(o.control_width, sizeof o.control_width, "avx2");
        snprintf(o.head_width, sizeof o.head_width, "avx2");
        cr_assert_eq(cmp_compare(f.c, f.h, &o, &f.r), 0);
        json_t *c = jw_path(f.r, "cells.0");
        json_t *ref = json_object_get(c, "reference");
        if (with_default) {
            cr_assert_str_eq(jw_str(c, "status"), "within_tolerance");
            cr_assert_str_eq(jw_str(c, "rule"), "reference_default_width");
            cr_assert(json_is_null(json_object_get(ref, "reason")));
        } else {
            cr_assert_str_eq(jw_str(c, "status"), "diverged");
            cr_assert_str_eq(jw_str(c, "rule"), "tolerance");
            cr_assert_str_eq(jw_str(ref, "reason"), "no_default_width_cell");
        }
        done(&f);
    }
}

/* Both sides' float64 records, however different, are never a pair, and
 * one side's alone is never a missing or extra key. */
Test(reference, reference_records_are_never_pairs)
{
    for (int head_has = 0; head_has < 2; head_has++) {
        struct fixture f;
        build(&f, N, 0.01, false, CMP_CAPTURE_FULL, false);
        struct cmp_cell *hc = NULL;
        if (head_has) {
            /* a head of its own float64 records, far from the control's */
            cmp_side_free(f.h);
            cr_assert_eq(cmp_side_new(&f.h), 0);
            hc = cell(f.h, "avx2");
            add(hc, KEY, 0, "float32", N, 0.01, false, CMP_CAPTURE_FULL, NULL);
            add(hc, "ref.float64/" KEY, 1, "float64", N, 0.5, false, CMP_CAPTURE_FULL, NULL);
        }
        for (int mode = 0; mode < 2; mode++) {
            json_t *c = compare(&f, mode ? "float64" : "none");
            cr_assert_str_eq(jw_str(c, "status"), "identical", "head_has %d mode %d", head_has,
                             mode);
            cr_assert_eq(json_integer_value(json_object_get(c, "tensors_compared")), 1);
            cr_assert_eq(json_integer_value(json_object_get(c, "missing_keys")), 0);
            cr_assert_eq(json_integer_value(json_object_get(c, "extra_keys")), 0);
        }
        done(&f);
    }
}

Test(reference, options_name_the_field)
{
    struct cmp_options o;
    struct cmp_err e;
    cmp_options_init(&o);
    cr_assert_eq(o.reference, CMP_REF_NONE);
    json_t *bad[] = {json_pack("{s:s}", "reference", "float32"),
                     json_pack("{s:i}", "reference", 1)};
    for (size_t i = 0; i < 2; i++) {
        cr_assert_eq(cmp_options_apply_json(&o, bad[i], &e), -EINVAL);
        cr_assert_str_eq(e.field, "reference");
        cr_assert(strstr(e.message, "none, float64, default-width"), "%s", e.message);
        json_decref(bad[i]);
    }
    json_t *ok = json_pack("{s:s}", "reference", "default-width");
    cr_assert_eq(cmp_options_apply_json(&o, ok, &e), 0);
    cr_assert_eq(o.reference, CMP_REF_DEFAULT_WIDTH);
    json_decref(ok);
    ok = json_pack("{s:n}", "reference");
    cr_assert_eq(cmp_options_apply_json(&o, ok, &e), 0);
    cr_assert_eq(o.reference, CMP_REF_NONE);
    json_decref(ok);
}
