/*
 * tests/test_compare_amplify.c - error amplification (compare/amplify.c):
 * the row whose relative error grew most over its module input's, and
 * whether the first divergence introduced, amplified or carried its error,
 * on hand-built cells whose relative errors are known in closed form; and
 * how the reports say it, with the kernel's stale wrappers.
 */
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

/* Every record's control values; the head moves element AT by DELTA. */
static const double base[4] = {1, 2, 3, 400};
#define BASE_NORM sqrt(1.0 + 4 + 9 + 160000)

/* nl2 of a record moved by delta at element at: |d| / ||base||, with d
 * the difference the payload really holds after rounding. */
static double rel_at(double delta, int at)
{
    return fabs((base[at] + delta) - base[at]) / BASE_NORM;
}

static double rel(double delta)
{
    return rel_at(delta, 0);
}

static void add_at(struct cmp_cell *c, const char *key, int64_t seq, double delta, int at,
                   enum cmp_capture cap)
{
    double v[4];
    char hash[128];
    memcpy(v, base, sizeof base);
    v[at] += delta;
    struct cmp_stats st = {.has_finite = true, .min = v[0], .max = v[3], .l2 = BASE_NORM};
    st.mean = (v[0] + v[1] + v[2] + v[3]) / 4;
    snprintf(hash, sizeof hash, "%s-%a-%d", key, delta, at);
    crec_add_f64(c, key, seq, v, 4, st, hash, cap);
}

static void add(struct cmp_cell *c, const char *key, int64_t seq, double delta)
{
    add_at(c, key, seq, delta, 0, CMP_CAPTURE_FULL);
}

/* One record of a cell as its key, the head's delta and where it is. */
struct rec {
    const char *key;
    double delta;
    int at;
};

static struct cmp_cell *new_cell(struct cmp_side *s, const char *pass)
{
    return crec_cell(s, "mlp", "avx2", pass);
}

/* The control (every delta 0) and the head of one cell of PASS holding
 * records v[0..n). */
static void sides(struct cmp_side **c, struct cmp_side **h, const struct rec *v, size_t n,
                  const char *pass)
{
    cr_assert_eq(cmp_side_new(c), 0);
    cr_assert_eq(cmp_side_new(h), 0);
    struct cmp_cell *cc = new_cell(*c, pass), *hc = new_cell(*h, pass);
    for (size_t i = 0; i < n; i++) {
        add_at(cc, v[i].key, (int64_t)i, 0, v[i].at, CMP_CAPTURE_FULL);
        add_at(hc, v[i].key, (int64_t)i, v[i].delta, v[i].at, CMP_CAPTURE_FULL);
    }
}

static json_t *compare(struct cmp_side *c, struct cmp_side *h)
{
    json_t *r = NULL;
    cr_assert_eq(cmp_compare(c, h, NULL, &r), 0);
    return r;
}

/* Keys hold dots, so a cell's fields are read through this. */
static json_t *field(json_t *r, const char *name)
{
    return json_object_get(json_array_get(json_object_get(r, "cells"), 0), name);
}

static const char *str(json_t *o, const char *k)
{
    const char *s = json_string_value(json_object_get(o, k));
    cr_assert_not_null(s, "no string %s", k);
    return s;
}

static double real(json_t *o, const char *k)
{
    json_t *v = json_object_get(o, k);
    cr_assert(json_is_real(v), "no number %s", k);
    return json_real_value(v);
}

static void expect_close(double got, double want)
{
    cr_assert(fabs(got - want) <= 1e-9 * fabs(want), "%.17g, want %.17g", got, want);
}

/* A test's two sides and the result of comparing them, freed by the
 * suite's fini even when the test fails. */
static struct cmp_side *ctl, *head;
static json_t *res;

static void amplify_fini(void)
{
    json_decref(res);
    cmp_side_free(ctl);
    cmp_side_free(head);
}

TestSuite(amplify, .fini = amplify_fini);

/* The comparison of one cell of PASS holding records v[0..n), its head
 * moved as they say. */
static json_t *compare_recs(const struct rec *v, size_t n, const char *pass)
{
    sides(&ctl, &head, v, n, pass);
    return compare(ctl, head);
}

/* The largest amplification of comparing v[0..n) in PASS (left in res),
 * checked to come from INPUT_KEY with ratio RATIO; the tests that judge
 * which input feeds a call share these steps and check the rest. */
static json_t *max_amp_from(const struct rec *v, size_t n, const char *pass, const char *input_key,
                            double ratio)
{
    res = compare_recs(v, n, pass);
    json_t *a = field(res, "max_amplification");
    cr_assert_str_eq(str(a, "input_key"), input_key);
    expect_close(real(a, "ratio"), ratio);
    return a;
}

/*
 * Three layers: l1's op introduces error from an exact input, l2's op grows
 * it 50 times, l3 doubles it. l2's output grows it 50 times too: the tie
 * goes to the op, which ran first.
 */
static const struct rec chain[] = {
    {"l1.0.forward.input.0", 0, 0},
    {"l1.0.forward/op.aten::mul.0.output.0", 1e-3, 0},
    {"l1.0.forward.output.0", 1e-3, 0},
    {"l2.0.forward.input.0", 1e-3, 0},
    {"l2.0.forward/op.aten::exp.0.output.0", 5e-2, 0},
    {"l2.0.forward.output.0", 5e-2, 0},
    {"l3.0.forward.input.0", 5e-2, 0},
    {"l3.0.forward.output.0", 0.1, 0},
};
#define NCHAIN (sizeof chain / sizeof chain[0])

Test(amplify, the_largest_ratio_is_found_and_an_exact_input_introduces)
{
    res = compare_recs(chain, NCHAIN, "forward");
    cr_assert_str_eq(json_string_value(field(res, "status")), "diverged");

    json_t *a = field(res, "max_amplification");
    cr_assert(json_is_object(a), "%s", json_dumps(field(res, "max_amplification"), 0));
    cr_assert_str_eq(str(a, "key"), chain[4].key);
    cr_assert_str_eq(str(a, "op"), "aten::exp");
    cr_assert_str_eq(str(a, "module"), "l2");
    cr_assert_str_eq(str(a, "input_key"), chain[3].key);
    cr_assert_eq(json_integer_value(json_object_get(a, "seq")), 4);
    expect_close(real(a, "in_rel_err"), rel(1e-3));
    expect_close(real(a, "out_rel_err"), rel(5e-2));
    expect_close(real(a, "ratio"), rel(5e-2) / rel(1e-3));

    /* the first divergence is l1's op, fed by an exact input */
    cr_assert_str_eq(str(field(res, "first_divergence"), "key"), chain[1].key);
    json_t *g = field(res, "first_divergence_growth");
    cr_assert_str_eq(str(g, "kind"), "introduced");
    cr_assert_str_eq(str(g, "input_key"), chain[0].key);
    cr_assert(json_is_null(json_object_get(g, "ratio")));
    cr_assert_eq(json_number_value(json_object_get(g, "in_rel_err")), 0);
    expect_close(real(g, "out_rel_err"), rel(1e-3));
}

/* All inputs exact: every divergent row introduced its error, none grew any. */
Test(amplify, all_inputs_exact_is_null)
{
    static const struct rec v[] = {
        {"l1.0.forward.input.0", 0, 0},
        {"l1.0.forward/op.aten::gelu.0.output.0", 1e-3, 0},
        {"l1.0.forward.output.0", 2e-3, 0},
    };
    res = compare_recs(v, 3, "forward");
    cr_assert(json_is_null(field(res, "max_amplification")));
    cr_assert_str_eq(str(field(res, "first_divergence_growth"), "kind"), "introduced");
}

/* Compares an input and its output V, checks the output is the first
 * divergence and its growth of KIND, and returns the growth. */
static json_t *growth_of_the_output(const struct rec v[2], const char *kind)
{
    res = compare_recs(v, 2, "forward");
    cr_assert_str_eq(str(field(res, "first_divergence"), "key"), v[1].key);
    json_t *g = field(res, "first_divergence_growth");
    cr_assert_str_eq(str(g, "kind"), kind);
    return g;
}

/* An input within tolerance but not exact: the first divergence amplified it. */
Test(amplify, an_input_within_tolerance_is_amplified)
{
    static const struct rec v[] = {
        {"l1.0.forward.input.0", 1e-9, 0},
        {"l1.0.forward.output.0", 1e-3, 0},
    };
    json_t *g = growth_of_the_output(v, "amplified");
    expect_close(real(g, "ratio"), rel(1e-3) / rel(1e-9));
    cr_assert_str_eq(str(field(res, "max_amplification"), "key"), v[1].key);
}

/*
 * The input moved 1e-5 at 400 (within tolerance), the output 1e-6 at 1
 * (past it): diverged, with less relative error than it was fed.
 */
Test(amplify, a_smaller_error_past_tolerance_is_carried)
{
    static const struct rec v[] = {
        {"l1.0.forward.input.0", 1e-5, 3},
        {"l1.0.forward.output.0", 1e-6, 0},
    };
    json_t *g = growth_of_the_output(v, "carried");
    cr_assert(real(g, "ratio") < 1);
    /* the largest ratio is still reported, though it is below 1 */
    expect_close(real(field(res, "max_amplification"), "ratio"), rel(1e-6) / rel_at(1e-5, 3));
    char *txt = cmp_result_to_text(res);
    cr_assert(strstr(txt, "; error carried, not grown: relative error "), "%s", txt);
    free(txt);
}

/* Several inputs: the largest error feeding the call is the input error. */
Test(amplify, the_largest_input_error_is_used)
{
    static const struct rec v[] = {
        {"add.0.forward.input.0", 1e-4, 0},
        {"add.0.forward.input.1", 1e-3, 0},
        {"add.0.forward.output.0", 2e-2, 0},
    };
    max_amp_from(v, 3, "forward", v[1].key, rel(2e-2) / rel(1e-3));
}

/* Backward: a call's grad_output feeds its grad_input and param_grad. */
Test(amplify, backward_grad_output_feeds_the_call)
{
    static const struct rec v[] = {
        {"fc.0.backward.grad_output.0", 1e-3, 0},
        {"fc.0.backward/op.aten::mm.0.grad_input.0", 4e-3, 0},
        {"fc.0.backward.param_grad.weight", 3e-2, 0},
        {"fc.0.backward.grad_input.0", 4e-3, 0},
    };
    json_t *a = max_amp_from(v, 4, "backward", v[0].key, rel(3e-2) / rel(1e-3));
    cr_assert_str_eq(str(a, "key"), v[2].key);
    /* the first divergence is the grad_output, an input: nothing feeds it */
    cr_assert_str_eq(str(field(res, "first_divergence"), "key"), v[0].key);
    cr_assert(json_is_null(field(res, "first_divergence_growth")));
}

/* An input of unknown error (stats basis) feeds no known error. */
Test(amplify, an_input_on_the_stats_basis_is_unknown)
{
    cr_assert_eq(cmp_side_new(&ctl), 0);
    cr_assert_eq(cmp_side_new(&head), 0);
    struct cmp_cell *cc = new_cell(ctl, "forward"), *hc = new_cell(head, "forward");
    add_at(cc, "l1.0.forward.input.0", 0, 0, 0, CMP_CAPTURE_NONE);
    add_at(hc, "l1.0.forward.input.0", 0, 1e-9, 0, CMP_CAPTURE_NONE);
    add(cc, "l1.0.forward.output.0", 1, 0);
    add(hc, "l1.0.forward.output.0", 1, 1e-3);
    /* a call with no captured input at all */
    add(cc, "l2.0.forward.output.0", 2, 0);
    add(hc, "l2.0.forward.output.0", 2, 1e-2);
    res = compare(ctl, head);
    cr_assert_str_eq(json_string_value(field(res, "status")), "diverged");
    cr_assert(json_is_null(field(res, "max_amplification")));
    cr_assert(json_is_null(field(res, "first_divergence_growth")));
}

/* No divergence: null on an identical cell and on one within tolerance. */
Test(amplify, no_divergence_is_null)
{
    static const struct rec v[] = {
        {"l1.0.forward.input.0", 1e-9, 0},
        {"l1.0.forward.output.0", 1e-8, 0},
    };
    res = compare_recs(v, 2, "forward");
    cr_assert_str_eq(json_string_value(field(res, "status")), "within_tolerance");
    cr_assert(json_is_null(field(res, "max_amplification")));
    cr_assert(json_is_null(field(res, "first_divergence_growth")));
    json_decref(res);
    res = compare(ctl, ctl);
    cr_assert_str_eq(json_string_value(field(res, "status")), "identical");
    cr_assert(json_is_null(field(res, "max_amplification")));
    cr_assert(json_is_null(field(res, "first_divergence_growth")));
    char *md = cmp_result_to_markdown(res);
    cr_assert_null(strstr(md, "amplif"), "%s", md);
    free(md);
}

/* The reports: the growth beside the first divergence, the largest
 * amplification, and the kernel with its stale wrappers, paths included. */
Test(amplify, reports_say_introduced_amplified_and_the_kernel)
{
    res = compare_recs(chain, NCHAIN, "forward");
    json_t *table = json_loads("{\"ops\": {\"aten::mul\": {\"kind\": \"stub\", \"stub\": "
                               "\"mul_stub\", \"file\": \"native/cpu/BinaryOpsKernel.cpp\"}}}",
                               0, NULL);
    /* seven wrappers of the file: five paths are kept, two more counted */
    json_t *prov = json_pack("{s:[]}", "findings");
    for (int i = 0; i < 7; i++) {
        char p[96];
        snprintf(p, sizeof p, "native/cpu/BinaryOpsKernel.cpp.AVX%d.cpp", i);
        json_array_append_new(
            json_object_get(prov, "findings"),
            json_pack("{s:s, s:s, s:s}", "kind", "generated_source", "path", p, "message", "m"));
    }
    cr_assert_eq(cmp_attribute_kernels(res, table, prov), 0);
    char *md = cmp_result_to_markdown(res), *txt = cmp_result_to_text(res);
    tw_expect_has(md,
                  "(seq 1, tolerance, max rel 0.001, 1/4 off); error introduced here: "
                  "inputs exact, relative error ",
                  "### Error amplification\n\n- `mlp` / avx2 / forward: largest at "
                  "`l2.0.forward/op.aten::exp.0.output.0` (`aten::exp` in `l2`): "
                  "relative error ",
                  "x, fed by `l2.0.forward.input.0`\n",
                  "`aten::mul` in `l1` → mul_stub, native/cpu/BinaryOpsKernel.cpp — 7 "
                  "stale generated wrappers of this file in the source tree: "
                  "`native/cpu/BinaryOpsKernel.cpp.AVX0.cpp`, ",
                  "`native/cpu/BinaryOpsKernel.cpp.AVX4.cpp` and 2 more\n", NULL);
    tw_expect_has(txt, "; error introduced here: inputs exact",
                  "amplification:\n  mlp / avx2 / forward: largest at "
                  "l2.0.forward/op.aten::exp.0.output.0 (aten::exp in l2): ",
                  "source tree: native/cpu/BinaryOpsKernel.cpp.AVX0.cpp, ", NULL);
    free(md);
    free(txt);
    json_decref(table);
    json_decref(prov);
}
