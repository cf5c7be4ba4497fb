/*
 * tests/test_compare_engine.c - the comparison engine on small
 * synthetic record sets built for one rule each: statuses, first
 * divergence and introduction, outcomes, perf and memory, cross-width, and
 * the device check.
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

TestSuite(engine, .init = reset_pool);

/* The mlp duo whose head ended HEAD_OUTCOME must compare as the N wants at
 * W, and the other way round, head as control, as the NR wants at REV. */
static void outcome_change_check_n(const char *head_outcome, const struct jw_want *w, size_t n,
                                   const struct jw_want *rev, size_t nr)
{
    struct duo s = duo_mlp(NULL, head_outcome);
    json_decref(duo_expect_n(&s, NULL, w, n));
    json_t *r = run_compare(s.h, s.c, NULL);
    jw_expect_n(r, rev, nr);
    duo_free(&s, r);
}
#define outcome_change_check(outcome, w, rev)                                                      \
    outcome_change_check_n((outcome), (w), sizeof(w) / sizeof((w)[0]), (rev),                      \
                           sizeof(rev) / sizeof((rev)[0]))

Test(engine, identical)
{
    static const struct jw_want w[] = {
        JW_S("verdict", "pass"),
        JW_S("mode", "same_width"),
        JW_S("cells.0.status", "identical"),
        JW_I("cells.0.tensors_compared", 8),
        JW_I("cells.0.tensors_identical", 8),
        JW_N("cells.0.first_divergence"),
        JW_F("cells.0.params_differed"),
        JW_I("counts.identical", 1),
        JW_I("counts.cells", 1),
        JW_S("cells.0.outcome_change", "none"),
    };
    mlp_check(NULL, w);
}

/* A control hashed with BLAKE2b and a head with XXH3, the same values:
 * never identical by hash, so within tolerance on the payloads, and the
 * cell and every pair say why. */
Test(engine, mixed_hash_alg)
{
    struct duo s = duo_cells("mlp", "forward");
    for (int k = 0; k < 8; k++) {
        add_record(s.cc, mlp_keys[k], k, 0, false);
        double v[4] = {(double)k + 1, -(double)k - 2, 0.5 * (double)k, 3};
        char hash[64];
        snprintf(hash, sizeof hash, "xxh-%d", k);
        struct cmp_tensor t = f64_tensor(mlp_keys[k], k, v, 4, hash);
        t.hash_alg = "xxh3-128";
        cr_assert_eq(cmp_cell_add_tensor(s.hc, &t), 0);
    }
    struct cmp_options o;
    cmp_options_init(&o);
    o.include_tensors = true;
    static const struct jw_want w[] = {
        JW_S("verdict", "pass"),
        JW_S("cells.0.status", "within_tolerance"),
        JW_I("cells.0.tensors_identical", 0),
        JW_I("cells.0.tensors_diverged", 0),
        JW_I("cells.0.tensors_within_tolerance", 8),
        JW_I("cells.0.tensors_hash_alg_mixed", 8),
        JW_T("cells.0.tensors.0.hash_alg_mixed"),
        JW_S("cells.0.tensors.0.basis", "full"),
        JW_S("cells.0.tensors.0.head_hash_alg", "xxh3-128"),
        JW_S("cells.0.tensors.0.control_hash_alg", "blake2b-128"),
        JW_T("cells.0.tensors.7.hash_alg_mixed"),
    };
    duo_check(&s, &o, w);
    /* One algorithm on both sides: no such field at all. */
    struct duo d = duo_mlp(NULL, "ok");
    json_t *r = duo_compare(&d, NULL);
    cr_assert_null(
        json_object_get(json_array_get(json_object_get(r, "cells"), 0), "tensors_hash_alg_mixed"));
    duo_free(&d, r);
}

Test(engine, within_tolerance)
{
    double d[8] = {0, 0, 1e-9, 1e-9, 1e-9, 1e-9, 2e-9, 2e-9}; /* fp64 bound ~1e-7 */
    static const struct jw_want w[] = {
        JW_S("verdict", "pass"),
        JW_S("cells.0.status", "within_tolerance"),
        JW_I("cells.0.tensors_identical", 2),
        JW_I("cells.0.tensors_within_tolerance", 6),
        JW_I("counts.within_tolerance", 1),
    };
    mlp_check(d, w);
}

/*
 * fc1 drifts within tolerance, act (seq 4) is the first to leave it, while its
 * input (seq 3) is still within tolerance: act both diverges first and
 * introduces the error. Its metrics come along; element 1 of seq 4 is -6, so
 * its rel is .5/6.
 */
Test(engine, diverged_first_divergence_and_introduced)
{
    double d[8] = {0, 0, 1e-9, 1e-9, 0.5, 0.5, 0.7, 0.7};
    static const struct jw_want w[] = {
        JW_S("verdict", "regression"),
        JW_S("cells.0.status", "diverged"),
        JW_S("cells.0.first_divergence.key", "act.0.forward.output.0"),
        JW_I("cells.0.first_divergence.seq", 4),
        JW_S("cells.0.first_divergence.reason", "tolerance"),
        JW_S("cells.0.first_divergence.basis", "full"),
        JW_D("cells.0.first_divergence.max_abs", 0.5, 1e-12),
        JW_D("cells.0.first_divergence.max_rel", 0.5 / 6, 1e-12),
        JW_I("cells.0.first_divergence.allclose_violations", 1),
        JW_S("cells.0.first_divergence.module", "act"),
        JW_S("cells.0.first_introduced.key", "act.0.forward.output.0"),
        JW_I("cells.0.tensors_diverged", 4),
        JW_I("counts.diverged", 1),
    };
    mlp_check(d, w);
}

/* See duo_unclean_inputs: the first divergence is not where it was introduced. */
Test(engine, first_introduced_skips_records_with_unclean_inputs)
{
    struct duo s = duo_unclean_inputs();
    static const struct jw_want w[] = {
        JW_S("cells.0.status", "diverged"),
        JW_S("cells.0.first_divergence.key", "fc1.0.forward.output.0"),
        JW_S("cells.0.first_introduced.key", "act.0.forward.output.0"),
        JW_I("cells.0.tensors_nondeterministic", 1),
    };
    duo_check(&s, NULL, w);
}

/*
 * A record that is itself a module input can only introduce error when it is
 * the first divergence (the model's input differing, here).
 */
Test(engine, first_introduced_input_origin)
{
    double d[8] = {0.25, 0.25, 0.25, 0.25, 0.25, 0.25, 0.25, 0.25};
    struct duo s = duo_mlp(d, "ok");
    json_t *r = duo_compare(&s, NULL);
    cr_assert_str_eq(jw_str(r, "cells.0.first_divergence.key"), "model.0.forward.input.0");
    cr_assert_str_eq(jw_str(r, "cells.0.first_introduced.key"), "model.0.forward.input.0");
    duo_free(&s, r);
}

Test(engine, backward_param_grad_introduces)
{
    static const char *const keys[4] = {
        "fc1.0.backward.grad_output.0", "fc1.0.backward.grad_input.0",
        "fc1.0.backward.param_grad.weight", "fc1.0.backward.param_grad.bias"};
    static const double d[4] = {1e-9, 1e-9, 0.5, 0};
    struct duo s = duo_keys("backward", keys, d, 4);
    static const struct jw_want w[] = {
        JW_S("cells.0.first_divergence.key", "fc1.0.backward.param_grad.weight"),
        JW_S("cells.0.first_introduced.key", "fc1.0.backward.param_grad.weight"),
        JW_S("cells.0.first_introduced.phase", "backward"),
        JW_S("cells.0.first_introduced.role", "param_grad"),
    };
    duo_check(&s, NULL, w);
}

Test(engine, params_differed)
{
    static const char *const keys[3] = {"fc1.0.init.param.weight", "fc1.0.forward.input.0",
                                        "fc1.0.forward.output.0"};
    static const double d[3] = {1e-3, 0, 1e-3};
    struct duo s = duo_keys("forward", keys, d, 3);
    static const struct jw_want w[] = {
        JW_T("cells.0.params_differed"),
        JW_S("cells.0.first_divergence.key", "fc1.0.init.param.weight"),
        JW_S("cells.0.first_divergence.phase", "init"),
        JW_S("cells.0.first_introduced.key", "fc1.0.init.param.weight"),
    };
    duo_check(&s, NULL, w);
}

Test(engine, missing_and_extra_keys)
{
    struct duo s = duo_cells("mlp", "forward");
    duo_record(&s, "a.0.forward.output.0", 0, 0);
    add_record(s.cc, "b.0.forward.output.0", 1, 0, false);
    add_record(s.cc, "c.0.forward.output.0", 2, 0, false);
    add_record(s.hc, "d.0.forward.output.0", 1, 0, false);
    static const struct jw_want w[] = {
        JW_S("cells.0.status", "diverged"),
        JW_I("cells.0.missing_keys", 2),
        JW_I("cells.0.extra_keys", 1),
        JW_S("cells.0.missing_key_names.0", "b.0.forward.output.0"),
        JW_S("cells.0.missing_key_names.1", "c.0.forward.output.0"),
        JW_S("cells.0.extra_key_names.0", "d.0.forward.output.0"),
        JW_S("cells.0.first_divergence.reason", "missing_in_head"),
        JW_S("cells.0.first_divergence.key", "b.0.forward.output.0"),
        JW_I("cells.0.tensors_compared", 1),
        JW_S("verdict", "regression"),
    };
    duo_check(&s, NULL, w);
}

Test(engine, nondeterministic_only)
{
    double d[8] = {0, 0, 0, 0, 0.5, 0.5, 0.5, 0.5};
    struct duo s = duo_mlp(d, "ok");
    /* the nondeterministic frame after the tensors, on either side */
    cr_assert_eq(cmp_cell_mark_nondeterministic(s.hc, "act.0.forward.output.0"), 0);
    cr_assert_eq(cmp_cell_mark_nondeterministic(s.hc, "fc2.0.forward.input.0"), 0);
    cr_assert_eq(cmp_cell_mark_nondeterministic(s.cc, "fc2.0.forward.output.0"), 0);
    cr_assert_eq(cmp_cell_mark_nondeterministic(s.cc, "model.0.forward.output.0"), 0);
    cr_assert_eq(cmp_cell_mark_nondeterministic(s.cc, "not.a.key"), 0);
    static const struct jw_want w[] = {
        JW_S("cells.0.status", "nondeterministic"), JW_I("cells.0.tensors_nondeterministic", 4),
        JW_N("cells.0.first_divergence"),           JW_S("verdict", "pass"),
        JW_I("counts.nondeterministic", 1),
    };
    json_t *r = duo_expect(&s, NULL, w);
    json_decref(r);

    /* one more deterministic difference and the cell diverges */
    cmp_side_free(s.h);
    cmp_side_new(&s.h);
    double d2[8] = {0, 0, 0.5, 0, 0.5, 0.5, 0.5, 0.5};
    s.hc = mlp_cell(s.h, "avx2", d2, "ok");
    cmp_cell_mark_nondeterministic(s.hc, "act.0.forward.output.0");
    r = duo_compare(&s, NULL);
    cr_assert_str_eq(jw_str(r, "cells.0.status"), "diverged");
    cr_assert_str_eq(jw_str(r, "cells.0.first_divergence.key"), "fc1.0.forward.output.0");
    duo_free(&s, r);
}

/* Records reached before the crash are still compared; the reverse is a fix
 * and does not fail the comparison. */
Test(engine, outcome_regression_and_fix)
{
    static const struct jw_want w[] = {
        JW_S("cells.0.status", "incomparable"),
        JW_S("cells.0.incomparable_reason", "head_outcome"),
        JW_S("cells.0.outcome_change", "regression"),
        JW_S("cells.0.control_outcome", "ok"),
        JW_S("cells.0.head_outcome", "crashed"),
        JW_I("counts.outcome_regressions", 1),
        JW_S("verdict", "regression"),
        JW_I("cells.0.tensors_compared", 8),
    };
    static const struct jw_want fix[] = {
        JW_S("cells.0.outcome_change", "fix"),
        JW_I("counts.outcome_fixes", 1),
        JW_S("verdict", "pass"),
    };
    outcome_change_check("crashed", w, fix);
}

/* A cell killed for memory on one side is an outcome change like a crash:
 * a regression against an ok control, a fix the other way round. */
Test(engine, oom_is_an_outcome_change)
{
    static const struct jw_want w[] = {
        JW_S("cells.0.outcome_change", "regression"),
        JW_S("cells.0.head_outcome", "oom"),
        JW_I("counts.outcome_regressions", 1),
        JW_S("verdict", "regression"),
    };
    static const struct jw_want fix[] = {
        JW_S("cells.0.outcome_change", "fix"),
        JW_S("verdict", "pass"),
    };
    outcome_change_check("oom", w, fix);
}

/* An unsupported head cell and a cell with no records are incomparable,
 * and unsupported is not a regression. */
Test(engine, incomparable_kinds)
{
    struct duo s = duo_mlp(NULL, "unsupported");
    struct cmp_cell *x;
    cmp_side_add_cell(s.c, "mlp", "avx512", "forward", &x);
    cmp_cell_set_outcome(x, "ok");
    cmp_side_add_cell(s.h, "mlp", "avx512", "forward", &x);
    cmp_cell_set_outcome(x, "ok");
    static const struct jw_want w[] = {
        JW_S("cells.0.width", "avx2"),
        JW_S("cells.0.status", "incomparable"),
        JW_S("cells.0.outcome_change", "changed"),
        JW_S("cells.1.status", "incomparable"),
        JW_S("cells.1.incomparable_reason", "no_records"),
        JW_I("counts.incomparable", 2),
        JW_S("verdict", "pass"),
    };
    duo_check(&s, NULL, w);
}

/* A missing head cell fails; an extra head cell alone does not. */
Test(engine, missing_and_extra_cells)
{
    struct duo s = duo_mlp(NULL, "ok");
    mlp_cell(s.c, "default", NULL, "ok");
    mlp_cell(s.h, "avx512", NULL, "ok");
    static const struct jw_want w[] = {
        JW_I("counts.missing_cells", 1),
        JW_I("counts.extra_cells", 1),
        JW_S("missing_cells.0.width", "default"),
        JW_S("extra_cells.0.width", "avx512"),
        JW_S("verdict", "regression"),
    };
    json_t *r = duo_expect(&s, NULL, w);
    json_decref(r);

    cmp_side_free(s.c);
    cmp_side_new(&s.c);
    mlp_cell(s.c, "avx2", NULL, "ok");
    r = duo_compare(&s, NULL);
    cr_assert_str_eq(jw_str(r, "verdict"), "pass");
    cr_assert_eq(ji(r, "counts.extra_cells"), 1);
    duo_free(&s, r);
}

/* One observation per process; perf_gate false still computes and counts,
 * but the verdict passes; the same processes on both sides are the same. */
Test(engine, perf_and_memory)
{
    struct duo s = duo_mlp(NULL, "ok");
    add_fake_processes(s.cc, 6, 1e6, 11);
    add_fake_processes(s.hc, 6, 1.5e6, 12);
    cmp_cell_set_memory(s.cc, 1000, -1);
    cmp_cell_set_memory(s.hc, 1500, -1);
    static const struct jw_want w[] = {
        JW_S("cells.0.status", "identical"),       JW_S("cells.0.perf.verdict", "regression"),
        JW_S("cells.0.perf.design", "unpaired"),   JW_S("cells.0.perf.test", "mann_whitney"),
        JW_I("cells.0.perf.n_control", 6),         JW_I("cells.0.perf.n_head", 6),
        JW_I("cells.0.perf.samples_head", 60),     JW_I("cells.0.perf.pairs", 0),
        JW_S("cells.0.perf.p_method", "exact"),    JW_N("cells.0.perf.reason"),
        JW_I("counts.perf_regressions", 1),        JW_S("verdict", "regression"),
        JW_I("cells.0.memory.control_peak", 1000), JW_D("cells.0.memory.ratio", 1.5, 1e-15),
        JW_N("cells.0.memory.device_ratio"),
    };
    json_t *r = duo_expect(&s, NULL, w);
    cr_assert(jw_num(r, "cells.0.perf.ratio") > 1.45);
    cr_assert(jw_num(r, "cells.0.perf.ci99.0") <= jw_num(r, "cells.0.perf.ratio"));
    cr_assert(jw_num(r, "cells.0.perf.mde") > 0);
    json_decref(r);

    struct cmp_options o;
    cmp_options_init(&o);
    cr_assert(o.perf_gate, "perf gates by default");
    o = options_from("{\"perf_gate\":false}");
    r = duo_compare(&s, &o);
    static const struct jw_want ungated[] = {
        JW_S("cells.0.perf.verdict", "regression"),
        JW_I("counts.perf_regressions", 1),
        JW_F("thresholds.perf_gate"),
        JW_S("verdict", "pass"),
    };
    jw_expect_all(r, ungated);
    json_decref(r);

    r = run_compare(s.c, s.c, NULL);
    cr_assert_str_eq(jw_str(r, "cells.0.perf.verdict"), "same");
    cr_assert_eq(ji(r, "counts.perf_same"), 1);
    duo_free(&s, r);
}

/* A cell stored before timing processes: one timing frame of many samples
 * is one process, so however slow it looks it is insufficient_data. */
Test(engine, old_cell_is_one_observation)
{
    int64_t tc[30], th[30];
    struct duo s = duo_mlp(NULL, "ok");
    fake_timings(tc, 30, 1e6, 1);
    fake_timings(th, 30, 1.5e6, 2);
    cr_assert_eq(cmp_cell_add_timing(s.cc, tc, 30), 0);
    cr_assert_eq(cmp_cell_add_timing(s.hc, th, 30), 0);
    static const struct jw_want w[] = {
        JW_S("cells.0.perf.verdict", "insufficient_data"),
        JW_I("cells.0.perf.n_head", 1),
        JW_I("cells.0.perf.samples_head", 30),
        JW_I("cells.0.perf.min_n", 5),
        JW_I("counts.perf_regressions", 0),
        JW_S("verdict", "pass"),
    };
    json_t *r = duo_expect(&s, NULL, w);
    cr_assert(strstr(jw_str(r, "cells.0.perf.reason"), "cannot reach alpha"), "%s",
              jw_str(r, "cells.0.perf.reason"));
    duo_free(&s, r);
}

/* A head cell with reference processes (the control's build timed in the
 * head's job) is compared on its pairs and ignores the control cell's
 * timing; pairs missing a partner are left out. */
Test(engine, reference_processes_make_pairs)
{
    int64_t t[10];
    struct duo s = duo_mlp(NULL, "ok");
    add_fake_processes(s.cc, 6, 3e6, 1); /* a control job on a slower day: not used */
    for (int i = 0; i < 10; i++) {
        double drift = 1.0 + 0.03 * (i % 4);
        fake_timings(t, 10, 1e6 * drift, 100 + (uint64_t)i);
        cr_assert_eq(cmp_cell_add_timing_process(s.hc, t, 10, i, true), 0);
        fake_timings(t, 10, 1.2e6 * drift, 200 + (uint64_t)i);
        cr_assert_eq(cmp_cell_add_timing_process(s.hc, t, 10, i, false), 0);
    }
    fake_timings(t, 10, 5e6, 300);
    cr_assert_eq(cmp_cell_add_timing_process(s.hc, t, 10, 10, false), 0, "no partner");
    static const struct jw_want w[] = {
        JW_S("cells.0.perf.design", "paired"),
        JW_S("cells.0.perf.test", "paired_t"),
        JW_I("cells.0.perf.pairs", 10),
        JW_S("cells.0.perf.verdict", "regression"),
    };
    json_t *r = duo_expect(&s, NULL, w);
    cr_assert(jw_num(r, "cells.0.perf.ratio") > 1.18 && jw_num(r, "cells.0.perf.ratio") < 1.22);
    duo_free(&s, r);
}

/* Pairs whose wall clocks say 20% slower (the head's processes shared
 * their CPU) but whose CPU times agree are judged on the CPU times when
 * every process has them (basis cpu_time), and on the wall clocks as soon
 * as one lacks them. */
Test(engine, cpu_time_basis_when_every_process_has_it)
{
    int64_t t[10], cpu[10];
    for (int lacking = 0; lacking < 2; lacking++) {
        struct duo s = duo_mlp(NULL, "ok");
        for (int i = 0; i < 8; i++) {
            fake_timings(t, 10, 1e6, 100 + (uint64_t)i);
            fake_timings(cpu, 10, 0.98e6, 300 + (uint64_t)i);
            cr_assert_eq(cmp_cell_add_timing_process(s.hc, t, 10, i, true), 0);
            cr_assert_eq(cmp_cell_set_process_cpu(s.hc, cpu, 10), 0);
            fake_timings(t, 10, 1.2e6, 200 + (uint64_t)i);
            fake_timings(cpu, 10, 0.98e6, 400 + (uint64_t)i);
            cr_assert_eq(cmp_cell_add_timing_process(s.hc, t, 10, i, false), 0);
            if (!lacking || i != 5)
                cr_assert_eq(cmp_cell_set_process_cpu(s.hc, cpu, 10), 0);
        }
        json_t *r = duo_compare(&s, NULL);
        cr_assert_str_eq(jw_str(r, "cells.0.perf.basis"), lacking ? "wall_time" : "cpu_time");
        cr_assert_str_eq(jw_str(r, "cells.0.perf.verdict"), lacking ? "regression" : "same",
                         "ratio %g", jw_num(r, "cells.0.perf.ratio"));
        duo_free(&s, r);
    }
    struct cmp_side *side;
    struct cmp_cell *none;
    cr_assert_eq(cmp_side_new(&side), 0);
    cr_assert_eq(cmp_side_add_cell(side, "m", "default", "forward", &none), 0);
    cr_assert_eq(cmp_cell_set_process_cpu(none, t, 10), -EINVAL, "no process to set");
    cr_assert_eq(cmp_cell_add_timing_process(none, t, 10, -1, false), 0);
    cpu[3] = -1;
    cr_assert_eq(cmp_cell_set_process_cpu(none, cpu, 10), -EINVAL, "a negative CPU time");
    cmp_side_free(side);
}

Test(engine, cross_width)
{
    struct cmp_side *job;
    double d[8] = {0, 0, 0.5, 0.5, 0.5, 0.5, 0.5, 0.5};
    cmp_side_new(&job);
    mlp_cell(job, "default", NULL, "ok");
    mlp_cell(job, "avx512", d, "ok");
    mlp_cell(job, "avx2", NULL, "ok");
    struct cmp_options o;
    cross_width_options(&o, "default", "avx512");
    json_t *r = run_compare(job, job, &o);
    static const struct jw_want w[] = {
        JW_S("mode", "cross_width"),
        JW_S("control_width", "default"),
        JW_S("head_width", "avx512"),
        JW_I("counts.cells", 1),
        JW_S("cells.0.width", "avx512"),
        JW_S("cells.0.control_width", "default"),
        JW_S("cells.0.status", "diverged"),
        JW_S("cells.0.first_divergence.key", "fc1.0.forward.output.0"),
    };
    jw_expect_all(r, w);
    json_decref(r);

    /* default against avx2: identical */
    snprintf(o.head_width, sizeof(o.head_width), "avx2");
    r = run_compare(job, job, &o);
    cr_assert_str_eq(jw_str(r, "cells.0.status"), "identical");
    json_decref(r);

    /* half a cross-width setting is refused */
    o.head_width[0] = '\0';
    json_t *bad = NULL;
    cr_assert_eq(cmp_compare(job, job, &o, &bad), -EINVAL);
    cr_assert_null(bad);
    cmp_side_free(job);
}

/* Cross-mode (the mode self-check): one job's eager mlp cell against its
 * inductor cell, which records only the model's boundary. The eager
 * cell's inner keys are left out, not missing; the boundary key the
 * compiled cell moved diverges; the compile time goes beside the perf
 * (never judged), in the JSON and the text. */
Test(engine, cross_mode)
{
    struct cmp_side *job;
    struct cmp_cell *eager, *ind;
    cmp_side_new(&job);
    eager = mlp_cell(job, "avx2", NULL, "ok");
    cr_assert_eq(cmp_side_add_cell_mode(job, "mlp", "avx2", "forward", "inductor", &ind), 0);
    cr_assert_eq(cmp_cell_set_outcome(ind, "ok"), 0);
    add_record(ind, "model.0.forward.input.0", 0, 0, false);
    add_record(ind, "model.0.forward.output.0", 1, 0.5, false);
    cmp_cell_set_compile(ind, 12500000000);
    add_fake_processes(eager, 5, 2e6, 1);
    add_fake_processes(ind, 5, 1e6, 2);
    struct cmp_options o;
    cmp_options_init(&o);
    snprintf(o.control_mode, sizeof o.control_mode, "eager");
    snprintf(o.head_mode, sizeof o.head_mode, "inductor");
    json_t *r = run_compare(job, job, &o);
    static const struct jw_want w[] = {
        JW_S("control_mode", "eager"),
        JW_S("head_mode", "inductor"),
        JW_I("counts.cells", 1),
        JW_S("cells.0.mode", "inductor"),
        JW_S("cells.0.control_mode", "eager"),
        JW_S("cells.0.status", "diverged"),
        JW_I("cells.0.missing_keys", 0),
        JW_S("cells.0.first_divergence.key", "model.0.forward.output.0"),
        JW_N("cells.0.perf.control_compile_ns"),
        JW_I("cells.0.perf.head_compile_ns", 12500000000),
        JW_N("cells.0.perf.compile_ratio"),
    };
    jw_expect_all(r, w);
    char *text = cmp_result_to_text(r);
    cr_assert(strstr(text, "compile n/a -> 12.5 s") != NULL, "%s", text);
    free(text);
    json_decref(r);

    /* the same cells within one mode: the eager cell's keys are missing */
    o.control_mode[0] = o.head_mode[0] = '\0';
    snprintf(o.control_width, sizeof o.control_width, "avx2");
    snprintf(o.head_width, sizeof o.head_width, "avx2");
    r = run_compare(job, job, &o);
    cr_assert_eq(ji(r, "counts.cells"), 2);
    json_decref(r);

    /* half a cross-mode setting is refused */
    o.control_width[0] = o.head_width[0] = '\0';
    snprintf(o.head_mode, sizeof o.head_mode, "inductor");
    json_t *bad = NULL;
    cr_assert_eq(cmp_compare(job, job, &o, &bad), -EINVAL);
    cr_assert_null(bad);
    cmp_side_free(job);
}

/* Per-tensor rows come in execution order with the applied tolerance (rtol
 * kept from float64); nothing is computed for identical rows. */
Test(engine, key_tolerance_override)
{
    double d[8] = {0, 0, 0, 0, 1e-3, 0, 0, 0};
    struct duo s = duo_mlp(d, "ok");
    struct cmp_options o =
        options_from("{\"key_tolerances\":[{\"pattern\":\"act.*.output.*\",\"atol\":1e-2}],"
                     "\"include_tensors\":true}");
    json_t *r = duo_compare(&s, &o);
    static const struct jw_want w[] = {
        JW_S("cells.0.status", "within_tolerance"),
        JW_S("cells.0.tensors.4.key", "act.0.forward.output.0"),
        JW_D("cells.0.tensors.4.atol", 1e-2, 0),
        JW_D("cells.0.tensors.4.rtol", 1e-7, 0),
        JW_S("cells.0.tensors.0.status", "identical"),
        JW_S("cells.0.tensors.0.basis", "exact"),
        JW_A("cells.0.tensors.0.max_abs"),
    };
    cr_assert_eq(json_array_size(jw_path(r, "cells.0.tensors")), 8);
    jw_expect_all(r, w);
    duo_free(&s, r);
}

Test(engine, nonfinite_doubles_encode_as_null)
{
    struct duo s = duo_cells("m", "forward");
    double z[2] = {0, 0}, nz[2] = {-0.0, 0};
    struct cmp_tensor t = f64_tensor("m.0.forward.output.0", 0, z, 2, "a");
    cmp_cell_add_tensor(s.cc, &t);
    t = f64_tensor("m.0.forward.output.0", 0, nz, 2, "b");
    cmp_cell_add_tensor(s.hc, &t);
    struct cmp_options o;
    cmp_options_init(&o);
    o.include_tensors = true;
    static const struct jw_want w[] = {
        JW_N("cells.0.tensors.0.sqnr_db"),
        JW_S("cells.0.tensors.0.nonfinite.sqnr_db", "inf"),
        JW_D("cells.0.tensors.0.nl2", 0.0, 0),
    };
    duo_check(&s, &o, w);
}

Test(engine, env_and_bad_options)
{
    struct duo s = duo_mlp(NULL, "ok");
    cr_assert_eq(cmp_cell_set_env(s.cc, "avx2", "cpu"), 0);
    cr_assert_eq(cmp_cell_set_env(s.hc, "avx2", "cpu"), 0);
    cr_assert_eq(cmp_cell_set_env(s.hc, NULL, "Intel Xeon"), 0, "NULL keeps the width");
    static const struct jw_want w[] = {
        JW_S("cells.0.head_effective_width", "avx2"),
        JW_S("cells.0.head_device", "Intel Xeon"),
        JW_S("cells.0.control_device", "cpu"),
    };
    json_t *r = duo_expect(&s, NULL, w);
    json_decref(r);

    /* options set by hand are checked too: a NaN tolerance would pass anything */
    struct cmp_options o;
    cmp_options_init(&o);
    o.tol[CMP_DTYPE_FLOAT64].atol = NAN;
    cr_assert_eq(cmp_compare(s.c, s.h, &o, &r), -EINVAL);
    cmp_options_init(&o);
    o.alpha = 1.5;
    cr_assert_eq(cmp_compare(s.c, s.h, &o, &r), -EINVAL);
    duo_free(&s, NULL);
}

Test(engine, result_is_deterministic)
{
    double d[8] = {0, 0, 1e-9, 1e-9, 0.5, 0.5, 0.7, 0.7};
    struct duo s = duo_mlp(d, "ok");
    add_fake_processes(s.cc, 5, 1e6, 1);
    add_fake_processes(s.hc, 5, 1e6, 2);
    json_t *r1 = duo_compare(&s, NULL), *r2 = duo_compare(&s, NULL);
    char *s1 = json_dumps(r1, JSON_SORT_KEYS), *s2 = json_dumps(r2, JSON_SORT_KEYS);
    cr_assert_str_eq(s1, s2);
    free(s1);
    free(s2);
    json_decref(r1);
    json_decref(r2);
    duo_free(&s, NULL);
}

/* An mlp cell on DEVICE (NULL: never set) with DELTA and timings around BASE. */
static struct cmp_cell *device_cell(struct cmp_side *s, const char *device, const double *delta,
                                    double base, uint64_t seed)
{
    int64_t t[5];
    struct cmp_cell *c = mlp_cell(s, "native", delta, "ok");
    if (device)
        cr_assert_eq(cmp_cell_set_env(c, "avx2", device), 0);
    for (uint64_t k = 0; k < 8; k++) {
        fake_timings(t, 5, base, seed * 100 + k);
        cr_assert_eq(cmp_cell_add_timing(c, t, 5), 0, "one timing process");
    }
    return c;
}

/* A control cell on CDEV timed around CBASE against a head cell on HDEV,
 * moved by HDELTA, timed around 1e6 from HSEED. */
static struct duo duo_devices(const char *cdev, double cbase, const char *hdev,
                              const double *hdelta, uint64_t hseed)
{
    struct duo s = duo_new();
    s.cc = device_cell(s.c, cdev, NULL, cbase, 1);
    s.hc = device_cell(s.h, hdev, hdelta, 1e6, hseed);
    return s;
}

/* A GPU head three times faster and numerically different: no record is
 * compared, timings of two devices are not a perf change, a refusal is not a
 * regression, and perf gates by default. */
Test(engine, device_mismatch_is_refused)
{
    double d[8] = {0, 0, 0.5, 0.5, 0.5, 0.5, 0.5, 0.5};
    struct duo s = duo_devices("cpu", 3e6, "NVIDIA H200", d, 2);
    static const struct jw_want w[] = {
        JW_S("cells.0.status", "incomparable"),
        JW_S("cells.0.incomparable_reason", "device_mismatch"),
        JW_S("cells.0.device_check", "mismatch_refused"),
        JW_S("cells.0.control_device", "cpu"),
        JW_S("cells.0.head_device", "NVIDIA H200"),
        JW_I("cells.0.tensors_compared", 0),
        JW_I("cells.0.tensors_diverged", 0),
        JW_I("cells.0.missing_keys", 0),
        JW_N("cells.0.first_divergence"),
        JW_S("cells.0.perf.verdict", "insufficient_data"),
        JW_I("counts.device_mismatches", 1),
        JW_I("counts.incomparable", 1),
        JW_I("counts.perf_improvements", 0),
        JW_S("verdict", "pass"),
        JW_F("thresholds.allow_device_mismatch"),
        JW_T("thresholds.perf_gate"),
    };
    json_t *r = duo_expect(&s, NULL, w);
    char *md = cmp_result_to_markdown(r);
    cr_assert(strstr(md, "| incomparable (device mismatch: cpu vs NVIDIA H200) |"), "%s", md);
    free(md);
    char *txt = cmp_result_to_text(r);
    cr_assert(strstr(txt, "incomparable mlp/native/forward (device mismatch: cpu vs NVIDIA "
                          "H200)\n"),
              "%s", txt);
    free(txt);
    duo_free(&s, r);
}

/* Compares a control cell on CDEV against a head cell on HDEV (both timed
 * around 1e6, the head's from HSEED, no record moved): cell 0 must be
 * STATUS, with FIELD of the result at VALUE. */
static void expect_devices(const char *cdev, const char *hdev, uint64_t hseed, const char *status,
                           const char *field, const char *value)
{
    struct duo s = duo_devices(cdev, 1e6, hdev, NULL, hseed);
    json_t *r = duo_compare(&s, NULL);
    cr_assert_str_eq(jw_str(r, "cells.0.status"), status, "%s against %s", cdev ? cdev : "(none)",
                     hdev);
    cr_assert_str_eq(jw_str(r, field), value, "%s against %s", cdev ? cdev : "(none)", hdev);
    duo_free(&s, r);
}

Test(engine, two_gpu_models_are_a_mismatch_too)
{
    expect_devices("NVIDIA H100 80GB HBM3", "NVIDIA H200", 2, "incomparable",
                   "cells.0.incomparable_reason", "device_mismatch");
}

Test(engine, device_mismatch_compared_when_asked)
{
    double d[8] = {0, 0, 0.5, 0.5, 0.5, 0.5, 0.5, 0.5};
    struct duo s = duo_devices("cpu", 3e6, "NVIDIA H200", d, 2);
    struct cmp_options o = options_from("{\"allow_device_mismatch\":true}");
    cr_assert(o.allow_device_mismatch);
    static const struct jw_want w[] = {
        JW_S("cells.0.status", "diverged"),
        JW_N("cells.0.incomparable_reason"),
        JW_S("cells.0.device_check", "mismatch_allowed"),
        JW_S("cells.0.first_divergence.key", "fc1.0.forward.output.0"),
        JW_S("cells.0.perf.verdict", "improvement"),
        JW_I("counts.device_mismatches", 0),
        JW_T("thresholds.allow_device_mismatch"),
    };
    duo_check(&s, &o, w);
}

/* The same device is compared, and so is a side that never said its device
 * (older records). */
Test(engine, same_or_unknown_device_is_compared)
{
    expect_devices("NVIDIA H200", "NVIDIA H200", 1, "identical", "cells.0.device_check", "same");
    expect_devices(NULL, "NVIDIA H200", 1, "identical", "cells.0.device_check", "unknown");
}

/* A failed head outcome is still reported as such, not hidden behind the
 * device check. */
Test(engine, outcome_comes_before_device_mismatch)
{
    struct duo s = duo_devices("cpu", 1e6, "NVIDIA H200", NULL, 2);
    cr_assert_eq(cmp_cell_set_outcome(s.hc, "crashed"), 0);
    json_t *r = duo_compare(&s, NULL);
    cr_assert_str_eq(jw_str(r, "cells.0.incomparable_reason"), "head_outcome");
    cr_assert_str_eq(jw_str(r, "cells.0.outcome_change"), "regression");
    duo_free(&s, r);
}
