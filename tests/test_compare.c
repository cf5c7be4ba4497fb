/*
 * tests/test_compare.c - the comparison engine's options, input
 * limits, sizes derived from statistics and the Markdown and text
 * renderers with their capped report. The element metrics, the perf statistics, the engine's rules
 * and the environment section have suites of their own
 * (test_compare_metrics.c, test_compare_stats.c, test_compare_engine.c,
 * test_compare_env.c).
 */
#include <errno.h>
#include <float.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <criterion/criterion.h>
#include <jansson.h>

#include "compare/cmp.h"
#include "tests/helpers/common/cmp_fixtures.h"
#include "tests/helpers/common/cmp_records.h"
#include "tests/helpers/common/json_want.h"
#include "tests/helpers/common/text_want.h"

TestSuite(options, .init = reset_pool);
TestSuite(input, .init = reset_pool);
TestSuite(derived, .init = reset_pool);
TestSuite(render, .init = reset_pool);

Test(options, defaults_are_torch_testing)
{
    struct cmp_options o;
    cmp_options_init(&o);
    cr_assert_eq(o.tol[CMP_DTYPE_FLOAT32].rtol, 1.3e-6);
    cr_assert_eq(o.tol[CMP_DTYPE_FLOAT32].atol, 1e-5);
    cr_assert_eq(o.tol[CMP_DTYPE_FLOAT16].rtol, 1e-3);
    cr_assert_eq(o.tol[CMP_DTYPE_FLOAT16].atol, 1e-5);
    cr_assert_eq(o.tol[CMP_DTYPE_BFLOAT16].rtol, 1.6e-2);
    cr_assert_eq(o.tol[CMP_DTYPE_BFLOAT16].atol, 1e-5);
    cr_assert_eq(o.tol[CMP_DTYPE_FLOAT64].rtol, 1e-7);
    cr_assert_eq(o.tol[CMP_DTYPE_FLOAT64].atol, 1e-7);
    cr_assert_eq(o.tol[CMP_DTYPE_INT32].atol, 0);
    cr_assert_eq(o.tol[CMP_DTYPE_BOOL].rtol, 0);
    cr_assert_eq(o.alpha, 0.01);
    cr_assert_eq(o.perf_threshold, 0.05);
    cr_assert_eq(o.bootstrap_resamples, 2000);
}

Test(options, apply_good_json)
{
    struct cmp_options o;
    struct cmp_err err;
    cmp_options_init(&o);
    json_t *j = json_loads(
        "{\"tolerances\":{\"float32\":{\"atol\":1e-4,\"rtol\":2e-6},\"int8\":{\"atol\":1}},"
        "\"key_tolerances\":[{\"pattern\":\"*.attn.*\",\"atol\":1e-3,\"rtol\":1e-2},"
        "{\"pattern\":\"x*\",\"rtol\":0}],"
        "\"perf_threshold\":0.1,\"alpha\":0.05,\"bootstrap\":{\"seed\":7,\"resamples\":500},"
        "\"include_tensors\":true,\"cross_width\":{\"control\":\"default\",\"head\":\"avx2\"}}",
        0, NULL);
    cr_assert_not_null(j);
    cr_assert_eq(cmp_options_apply_json(&o, j, &err), 0, "%s: %s", err.field, err.message);
    cr_assert_eq(o.tol[CMP_DTYPE_FLOAT32].atol, 1e-4);
    cr_assert_eq(o.tol[CMP_DTYPE_FLOAT32].rtol, 2e-6);
    cr_assert_eq(o.tol[CMP_DTYPE_INT8].atol, 1);
    cr_assert_eq(o.n_key_tols, 2);
    cr_assert_str_eq(o.key_tols[0].pattern, "*.attn.*");
    cr_assert(isnan(o.key_tols[1].atol));
    cr_assert_eq(o.perf_threshold, 0.1);
    cr_assert_eq(o.alpha, 0.05);
    cr_assert_eq(o.bootstrap_seed, 7);
    cr_assert_eq(o.bootstrap_resamples, 500);
    cr_assert(o.include_tensors);
    cr_assert_str_eq(o.control_width, "default");
    cr_assert_str_eq(o.head_width, "avx2");

    /* a second application puts its patterns first */
    json_decref(j);
    j = json_loads("{\"key_tolerances\":[{\"pattern\":\"new\",\"atol\":0}]}", 0, NULL);
    cr_assert_eq(cmp_options_apply_json(&o, j, &err), 0);
    cr_assert_eq(o.n_key_tols, 3);
    cr_assert_str_eq(o.key_tols[0].pattern, "new");
    cr_assert_str_eq(o.key_tols[1].pattern, "*.attn.*");
    json_decref(j);
}

Test(options, apply_bad_json)
{
    expect_bad("{\"tolerance\":{}}", "tolerance");
    expect_bad("{\"tolerances\":{\"float33\":{\"atol\":1}}}", "tolerances.float33");
    expect_bad("{\"tolerances\":{\"float32\":{\"atol\":-1}}}", "tolerances.float32.atol");
    expect_bad("{\"tolerances\":{\"float32\":{\"atol\":\"1e-5\"}}}", "tolerances.float32.atol");
    expect_bad("{\"tolerances\":{\"float32\":{\"btol\":1}}}", "tolerances.float32.btol");
    expect_bad("{\"tolerances\":{\"float32\":{\"rtol\":1e-5}},\"alpha\":2}", "alpha");
    expect_bad("{\"tolerances\":[]}", "tolerances");
    expect_bad("{\"key_tolerances\":{}}", "key_tolerances");
    expect_bad("{\"key_tolerances\":[{\"atol\":1}]}", "key_tolerances[0]");
    expect_bad("{\"key_tolerances\":[{\"pattern\":\"a\"}]}", "key_tolerances[0]");
    expect_bad(
        "{\"key_tolerances\":[{\"pattern\":\"a\",\"atol\":1},{\"pattern\":\"\",\"atol\":1}]}",
        "key_tolerances[1].pattern");
    expect_bad("{\"key_tolerances\":[{\"pattern\":\"a\",\"atol\":1,\"x\":1}]}",
               "key_tolerances[0].x");
    expect_bad("{\"perf_threshold\":-0.1}", "perf_threshold");
    expect_bad("{\"alpha\":0}", "alpha");
    expect_bad("{\"bootstrap\":{\"resamples\":-1}}", "bootstrap.resamples");
    expect_bad("{\"bootstrap\":{\"resamples\":100001}}", "bootstrap.resamples");
    expect_bad("{\"bootstrap\":{\"seed\":1.5}}", "bootstrap.seed");
    expect_bad("{\"bootstrap\":{\"sed\":1}}", "bootstrap.sed");
    expect_bad("{\"include_tensors\":1}", "include_tensors");
    expect_bad("{\"cross_width\":{\"control\":\"default\"}}", "cross_width.head");
    expect_bad("{\"cross_width\":{\"control\":\"default\",\"head\":\"a\",\"x\":1}}",
               "cross_width.x");
}

Test(options, key_tolerance_limit)
{
    struct cmp_options o;
    struct cmp_err err;
    cmp_options_init(&o);
    json_t *arr = json_array();
    for (int i = 0; i < CMP_MAX_KEY_TOLS + 1; i++)
        json_array_append_new(arr, json_pack("{s:s, s:f}", "pattern", "p*", "atol", 1.0));
    json_t *j = json_pack("{s:o}", "key_tolerances", arr);
    cr_assert_eq(cmp_options_apply_json(&o, j, &err), -EINVAL);
    cr_assert_str_eq(err.field, "key_tolerances");
    cr_assert_eq(o.n_key_tols, 0);
    json_array_remove(arr, 0);
    cr_assert_eq(cmp_options_apply_json(&o, j, &err), 0, "exactly the maximum is fine");
    cr_assert_eq(o.n_key_tols, CMP_MAX_KEY_TOLS);
    json_decref(j);
}

/* ------------------------------------------------------------------- input */

Test(input, validation_and_limits)
{
    struct cmp_side *s;
    struct cmp_cell *c, *c2;
    cr_assert_eq(cmp_side_new(&s), 0);
    cr_assert_eq(cmp_side_add_cell(s, "m", "avx2", "forward", &c), 0);
    cr_assert_eq(cmp_side_add_cell(s, "m", "avx2", "forward", &c2), -EEXIST);
    cr_assert_eq(cmp_side_add_cell(s, "m", "", "forward", &c2), -EINVAL);
    cr_assert_eq(cmp_cell_set_outcome(c, "exploded"), -EINVAL);
    cr_assert_eq(cmp_cell_set_outcome(c, "protocol_error"), 0);

    double v[4] = {1, 2, 3, 4};
    struct cmp_tensor t = f64_tensor("a.0.forward.output.0", 0, v, 4, "h");
    t.numel = 5;
    cr_assert_eq(cmp_cell_add_tensor(c, &t), -EINVAL, "numel is not the shape's product");
    t.numel = 4;
    t.payload_len = 3 * 8;
    cr_assert_eq(cmp_cell_add_tensor(c, &t), -EINVAL, "full payload of 3 of 4 elements");
    t.payload_len = 31;
    t.capture = CMP_CAPTURE_SAMPLE;
    cr_assert_eq(cmp_cell_add_tensor(c, &t), -EINVAL, "not a whole element");
    t.payload_len = 8 * 8;
    cr_assert_eq(cmp_cell_add_tensor(c, &t), -EINVAL, "sample longer than the tensor");
    t.payload_len = 32;
    t.ndim = CMP_MAX_NDIM + 1;
    cr_assert_eq(cmp_cell_add_tensor(c, &t), -EINVAL, "ndim past CMP_MAX_NDIM");
    t.ndim = 1;
    t.key = NULL;
    cr_assert_eq(cmp_cell_add_tensor(c, &t), -EINVAL);
    t.key = "a.0.forward.output.0";
    cr_assert_eq(cmp_cell_add_tensor(c, &t), 0);

    int64_t neg = -1;
    cr_assert_eq(cmp_cell_add_timing(c, &neg, 1), -EINVAL);
    int64_t *many = calloc(CMP_MAX_TIMING_SAMPLES + 1, sizeof(int64_t));
    cr_assert_eq(cmp_cell_add_timing(c, many, CMP_MAX_TIMING_SAMPLES + 1), -E2BIG);
    cr_assert_eq(cmp_cell_add_timing(c, many, CMP_MAX_TIMING_SAMPLES), 0);
    cr_assert_eq(cmp_cell_add_timing(c, many, 1), -E2BIG);
    free(many);
    cmp_side_free(s);
}

Test(input, cell_limit)
{
    struct cmp_side *s;
    struct cmp_cell *c;
    char model[32];
    cmp_side_new(&s);
    for (int i = 0; i < CMP_MAX_CELLS; i++) {
        snprintf(model, sizeof(model), "m%d", i);
        cr_assert_eq(cmp_side_add_cell(s, model, "avx2", "forward", &c), 0);
    }
    cr_assert_eq(cmp_side_add_cell(s, "one-more", "avx2", "forward", &c), -E2BIG);
    cmp_side_free(s);
}

Test(input, key_parsing)
{
    /* module/phase/role come from the key when not given */
    struct duo s = duo_cells("m", "forward");
    duo_record(&s, "encoder.layers.0.self_attn.2.forward.output.0", 0, 1);
    static const struct jw_want w[] = {
        JW_S("cells.0.first_divergence.module", "encoder.layers.0.self_attn"),
        JW_I("cells.0.first_divergence.call", 2),
        JW_S("cells.0.first_divergence.phase", "forward"),
        JW_S("cells.0.first_divergence.role", "output"),
    };
    duo_check(&s, NULL, w);
}

/*
 * Sizes derived from statistics: by hand for control [1,2,3,4] and head
 * [1,2,3,5] (d = [0,0,0,1], so max|d| = 1, ||d|| = 1, max rel 1/4), then as
 * lower bounds of the true elementwise values over random pairs.
 */
Test(derived, hand_computed)
{
    double b[4] = {1, 2, 3, 4}, a[4] = {1, 2, 3, 5};
    struct cmp_stats sb = stats_of(b, 4), sa = stats_of(a, 4);
    struct cmp_derived d;
    cr_assert_eq(cmp_stats_derive(&sa, &sb, 4, 4, &d), 0);
    cr_assert_eq(d.n, 4);
    cr_assert_float_eq(d.abs_dmean, 0.25, 1e-12);
    cr_assert_float_eq(d.abs_dstd, sqrt(2.1875) - sqrt(1.25), 1e-12);
    cr_assert_float_eq(d.abs_dmax, 1.0, 1e-12);
    cr_assert_float_eq(d.abs_dmin, 0.0, 1e-12);
    /* sqrt(n) hypot(dmean, dstd) beats |l2_a - l2_b| = sqrt(39) - sqrt(30) here */
    double want_l2 = 2.0 * hypot(0.25, sqrt(2.1875) - sqrt(1.25));
    cr_assert(want_l2 > sqrt(39) - sqrt(30));
    cr_assert_float_eq(d.l2_lower, want_l2, 1e-12);
    cr_assert_float_eq(d.rms_lower, want_l2 / 2.0, 1e-12);
    cr_assert_float_eq(d.max_abs_lower, 1.0, 1e-12, "|dmax| is the true max error here");
    cr_assert_float_eq(d.control_rms, sqrt(30) / 2.0, 1e-12);
    cr_assert_float_eq(d.control_max_abs, 4.0, 1e-12);
    cr_assert_float_eq(d.rel_l2_lower, want_l2 / sqrt(30), 1e-12);
    cr_assert_float_eq(d.max_rel_lower, 0.25, 1e-12, "the true max rel is 1/4");

    /* Nothing to derive from: counts that differ, no finite value. */
    struct cmp_stats n1 = sa;
    n1.nan = 1;
    cr_assert_eq(cmp_stats_derive(&n1, &sb, 4, 4, &d), -ENODATA);
    cr_assert_eq(cmp_stats_derive(&sa, &sb, 5, 4, &d), -ENODATA);
    struct cmp_stats none = {0};
    cr_assert_eq(cmp_stats_derive(&none, &none, 4, 4, &d), -ENODATA);
    /* A zero control with a nonzero head: infinitely far, relatively. */
    double z[4] = {0, 0, 0, 0};
    struct cmp_stats sz = stats_of(z, 4);
    cr_assert_eq(cmp_stats_derive(&sa, &sz, 4, 4, &d), 0);
    cr_assert(isinf(d.max_rel_lower) && isinf(d.rel_l2_lower));
}

Test(derived, bounds_never_exceed_the_elementwise_truth)
{
    uint64_t x = 0x9e3779b97f4a7c15ull;
    double a[64], b[64];
    for (int trial = 0; trial < 500; trial++) {
        size_t n = 2 + (size_t)(trial % 60);
        double scale = pow(10.0, (double)(trial % 7) - 3);
        for (size_t i = 0; i < n; i++) {
            x ^= x << 13, x ^= x >> 7, x ^= x << 17;
            b[i] = ((double)(x % 20001) - 10000.0) * 1e-4;
            x ^= x << 13, x ^= x >> 7, x ^= x << 17;
            a[i] = b[i] + ((double)(x % 2001) - 1000.0) * 1e-3 * scale * (trial % 3 == 0);
            if (trial % 5 == 1 && i == n / 2)
                a[i] += scale; /* one outlier */
        }
        struct cmp_stats sa = stats_of(a, n), sb = stats_of(b, n);
        struct cmp_derived d;
        cr_assert_eq(cmp_stats_derive(&sa, &sb, (int64_t)n, (int64_t)n, &d), 0);
        double l2 = 0, mx = 0, bmax = 0;
        for (size_t i = 0; i < n; i++) {
            l2 += (a[i] - b[i]) * (a[i] - b[i]);
            mx = fmax(mx, fabs(a[i] - b[i]));
            bmax = fmax(bmax, fabs(b[i]));
        }
        l2 = sqrt(l2);
        double slack = 1e-9 * (1 + sb.l2 + sa.l2);
        cr_assert(d.l2_lower <= l2 + slack, "trial %d: l2 %g > true %g", trial, d.l2_lower, l2);
        cr_assert(d.max_abs_lower <= mx + slack, "trial %d: max %g > true %g", trial,
                  d.max_abs_lower, mx);
        cr_assert(d.max_rel_lower <= mx / bmax + slack, "trial %d", trial);
    }
    /* Not vacuous: a shift and a scaling, the two errors a wrong dispatch
     * width most often makes, are sized exactly. */
    for (size_t i = 0; i < 32; i++) {
        b[i] = sin((double)i) + 0.5;
        a[i] = b[i] + 2e-4;
    }
    struct cmp_stats sa = stats_of(a, 32), sb = stats_of(b, 32);
    struct cmp_derived d;
    cr_assert_eq(cmp_stats_derive(&sa, &sb, 32, 32, &d), 0);
    cr_assert_float_eq(d.max_abs_lower, 2e-4, 1e-12);
    cr_assert_float_eq(d.l2_lower, 2e-4 * sqrt(32), 1e-12);
    for (size_t i = 0; i < 32; i++)
        a[i] = b[i] * (1 + 2e-4);
    sa = stats_of(a, 32);
    cr_assert_eq(cmp_stats_derive(&sa, &sb, 32, 32, &d), 0);
    cr_assert_float_eq(d.rel_l2_lower, 2e-4, 1e-12, "the true nl2");
}

/* The engine labels them on stats rows only; elementwise rows keep theirs. */
Test(derived, engine_rows_and_reports)
{
    double b[4] = {1, 2, 3, 4}, a[4] = {1, 2, 3, 5};
    struct duo s = duo_cells("mlp", "forward");
    struct cmp_cell *cc = s.cc, *hc = s.hc;
    struct cmp_tensor tc = f64_tensor("fc1.0.forward.output.0", 0, b, 4, "c");
    struct cmp_tensor th = f64_tensor("fc1.0.forward.output.0", 0, a, 4, "h");
    tc.capture = th.capture = CMP_CAPTURE_NONE;
    cr_assert_eq(cmp_cell_add_tensor(cc, &tc), 0);
    cr_assert_eq(cmp_cell_add_tensor(hc, &th), 0);
    struct cmp_tensor fc = f64_tensor("fc2.0.forward.output.0", 1, b, 4, "c2");
    struct cmp_tensor fh = f64_tensor("fc2.0.forward.output.0", 1, a, 4, "h2");
    cr_assert_eq(cmp_cell_add_tensor(cc, &fc), 0);
    cr_assert_eq(cmp_cell_add_tensor(hc, &fh), 0);
    struct cmp_options o;
    cmp_options_init(&o);
    o.include_tensors = true;
    json_t *r = duo_compare(&s, &o);
    /* elementwise rows are measured: no derived_from */
    static const struct jw_want w[] = {
        JW_S("cells.0.first_divergence.basis", "stats"),
        JW_S("cells.0.first_divergence.derived_from", "stats"),
        JW_D("cells.0.first_divergence.derived.max_rel_lower", 0.25, 1e-12),
        JW_D("cells.0.first_divergence.derived.max_abs_lower", 1.0, 1e-12),
        JW_S("cells.0.tensors.1.basis", "full"),
        JW_A("cells.0.tensors.1.derived_from"),
        JW_D("cells.0.tensors.1.max_rel", 0.25, 1e-12),
    };
    jw_expect_all(r, w);
    char *md = cmp_result_to_markdown(r), *txt = cmp_result_to_text(r);
    const char *want = "max rel >= 0.25, l2 rel >= 0.16 (derived from stats; capture sample "
                       "for elementwise), stats basis";
    cr_assert(md && strstr(md, want), "%s", md);
    cr_assert(txt && strstr(txt, want), "%s", txt);
    free(md);
    free(txt);
    duo_free(&s, r);
}

/* ------------------------------------------------------------------ render */

static json_t *report_fixture(void)
{
    double d[8] = {0, 0, 1e-9, 1e-9, 0.5, 0.5, 0.7, 0.7};
    struct duo s = duo_mlp(d, "ok");
    struct cmp_cell *cc, *hc;
    cmp_side_add_cell(s.c, "mlp", "avx2", "backward", &cc);
    cmp_side_add_cell(s.h, "mlp", "avx2", "backward", &hc);
    cmp_cell_set_outcome(cc, "ok");
    cmp_cell_set_outcome(hc, "crashed");
    cc = mlp_cell(s.c, "default", NULL, "ok");
    hc = mlp_cell(s.h, "default", NULL, "ok");
    add_fake_processes(cc, 6, 1e6, 1);
    add_fake_processes(hc, 6, 1.3e6, 2);
    json_t *r = duo_compare(&s, NULL);
    duo_free(&s, NULL);
    return r;
}

Test(render, markdown)
{
    json_t *r = report_fixture();
    char *md = cmp_result_to_markdown(r);
    cr_assert_not_null(md);
    tw_expect_has(md, "## capd comparison: **regression**\n",
                  "3 cells compared, 1 identical, 1 diverged, 1 incomparable", NULL);
    cr_assert(
        strstr(md, "### Outcome regressions\n\n- `mlp` / avx2 / backward: ok -> **crashed**\n"),
        "%s", md);
    cr_assert(strstr(md, "### Cells that differ\n"), "%s", md);
    /* act's input moved by 1e-9: act amplified that error (amplify.c) */
    tw_expect_has(
        md,
        "| mlp | avx2 | forward | diverged | ok | `act.0.forward.output.0` "
        "(seq 4, tolerance, max rel 0.0833, 1/4 off); error amplified ",
        " out | same |\n", "| mlp | avx2 | backward | incomparable | ok -> crashed | - | - |",
        "### Performance changes\n", "| evidence | detects |", " | 6/6 processes, wall time | ",
        "| mlp | default | forward | ", "| regression |\n", NULL);
    cr_assert_null(strstr(md, "| mlp | default | forward | identical"), "identical cells omitted");
    free(md);

    char *txt = cmp_result_to_text(r);
    cr_assert_not_null(txt);
    tw_expect_has(txt, "capd comparison: REGRESSION\n",
                  "OUTCOME REGRESSION mlp/avx2/backward: ok -> crashed\n",
                  "diverged mlp/avx2/forward: first divergence act.0.forward.output.0 "
                  "(seq 4, tolerance, max rel 0.0833, 1/4 off); error amplified ",
                  " out; introduced at same\n", "PERF REGRESSION mlp/default/forward: ",
                  "6/6 processes, wall time, detects >= ", NULL);
    free(txt);
    json_decref(r);
}

Test(render, introduced_elsewhere)
{
    struct duo s = duo_unclean_inputs();
    json_t *r = duo_compare(&s, NULL);
    char *md = cmp_result_to_markdown(r);
    tw_expect_has(md,
                  "| `fc1.0.forward.output.0` (seq 2, tolerance, max rel 0.075, 1/4 off); "
                  "error carried, not grown: ",
                  " out | `act.0.forward.output.0` (seq 4, tolerance, max rel 0.0667, "
                  "1/4 off) |\n",
                  NULL);
    free(md);
    duo_free(&s, r);
}

Test(render, pass_and_bad_input)
{
    struct cmp_side *c;
    cmp_side_new(&c);
    mlp_cell(c, "avx2", NULL, "ok");
    json_t *r = run_compare(c, c, NULL);
    char *md = cmp_result_to_markdown(r);
    cr_assert(strstr(md, "## capd comparison: pass\n"), "%s", md);
    cr_assert_null(strstr(md, "###"), "nothing to list: %s", md);
    free(md);
    json_decref(r);
    cmp_side_free(c);

    json_t *junk = json_pack("{s:i}", "x", 1);
    cr_assert_null(cmp_result_to_markdown(junk));
    cr_assert_null(cmp_result_to_text(NULL));
    json_decref(junk);
}

/* The capped report: a piece that would leave no room for the note is
 * dropped whole, as is every later one, and the note ends the report at
 * CMP_MAX_RENDER bytes or fewer with the NUL. */
Test(render, report_cut_before_the_note)
{
    static const char note[] = "\n(cut)\n";
    char line[1000];
    memset(line, 'x', sizeof line - 2);
    line[sizeof line - 2] = '\n';
    line[sizeof line - 1] = 0;
    struct cmp_report r;
    cmp_report_init(&r, note);
    size_t whole = 0;
    for (size_t n = 0; n < CMP_MAX_RENDER / (sizeof line - 1) + 2; n++) {
        cmp_report_addf(&r, "%s", line);
        whole += !r.truncated;
    }
    cmp_report_addf(&r, "short");
    char *s = cmp_report_finish(&r);
    cr_assert_not_null(s);
    size_t len = strlen(s), body = len - (sizeof note - 1);
    cr_assert_leq(len + 1, CMP_MAX_RENDER);
    cr_assert_str_eq(s + body, note, "the note ends it");
    cr_assert_eq(body, whole * (sizeof line - 1), "whole lines only, nothing after the cut");
    cr_assert_gt(body + sizeof line - 1 + sizeof note, CMP_MAX_RENDER, "one more would not fit");
    free(s);

    /* An uncut report carries no note. */
    cmp_report_init(&r, note);
    cmp_report_addf(&r, "%d cells", 3);
    s = cmp_report_finish(&r);
    cr_assert_str_eq(s, "3 cells");
    free(s);
}

/* A result's fields: "" and 0 for what is absent or of another type. */
Test(render, json_fields)
{
    json_t *o = json_pack("{s:s,s:I,s:i}", "s", "v", "n", (json_int_t)1 << 40, "i", 7);
    cr_assert_str_eq(cmp_json_str(o, "s"), "v");
    cr_assert_str_eq(cmp_json_str(o, "i"), "");
    cr_assert_str_eq(cmp_json_str(o, "none"), "");
    cr_assert_str_eq(cmp_json_str(NULL, "s"), "");
    cr_assert_eq(cmp_json_int(o, "n"), (json_int_t)1 << 40);
    cr_assert_eq(cmp_json_int(o, "s"), 0);
    cr_assert_eq(cmp_json_int(o, "none"), 0);
    json_decref(o);
}

Test(options, allow_device_mismatch_json)
{
    expect_bad("{\"allow_device_mismatch\":1}", "allow_device_mismatch");
    expect_bad("{\"perf_gate\":0}", "perf_gate");
    expect_bad("{\"perf_gate\":\"no\"}", "perf_gate");
    expect_bad("{\"allow_device_mismatch\":\"yes\"}", "allow_device_mismatch");
    struct cmp_options o;
    cmp_options_init(&o);
    cr_assert(!o.allow_device_mismatch, "refused by default");
}
