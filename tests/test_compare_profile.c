/*
 * tests/test_compare_profile.c - which modules and operators explain a
 * perf change (docs/compare.md, "Which op got slower"): the head cell's
 * profiled pair, joined by module path and operator name, each entry's
 * change and share, largest first, in the result and both reports. The
 * engine alone, on processes and profile frames built by hand.
 */
#include <errno.h>
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <criterion/criterion.h>
#include <jansson.h>

#include "compare/cmp.h"
#include "tests/helpers/common/cmp_records.h"
#include "tests/helpers/common/json_want.h"

#define PAIRS 6

/* One process of about NS a sample (the sample's index varies it a
 * little, so the pairs have a spread). */
static void add_proc(struct cmp_cell *cell, double ns, int64_t pair, bool ref)
{
    int64_t s[5];
    for (size_t i = 0; i < 5; i++)
        s[i] = (int64_t)(ns * (1.0 + 0.001 * (double)((pair * 7 + (int64_t)i) % 5)));
    cr_assert_eq(cmp_cell_add_timing_process(cell, s, 5, pair, ref), 0);
}

/*
 * A profile frame of SIDE: NAP_NS of self time in module "nap", 300 us in
 * "fc" (Linear), 250 us of aten::addmm, OP_NS of aten::mul, and OUTSIDE_NS
 * outside the modules; the total is their sum of module self times and
 * outside.
 */
static json_t *frame(const char *side, double nap_ns, double op_ns, double outside_ns)
{
    double total = nap_ns + 300e3 + 10e3 + outside_ns;
    json_t *f = json_pack(
        "{s:s,s:s,s:s,s:i,s:I,s:I,s:I,s:[{s:s,s:s,s:I,s:I,s:f},{s:s,s:s,s:I,s:I,s:f},"
        "{s:s,s:s,s:I,s:I,s:f}],s:i,s:[{s:s,s:I,s:f},{s:s,s:I,s:f}],s:i}",
        "kind", "profile", "phase", "forward", "side", side, "iterations", 40, "total_ns",
        (json_int_t)total, "outside_ns", (json_int_t)outside_ns, "pair", (json_int_t)PAIRS,
        "modules", "path", "", "type", "M", "self_ns", (json_int_t)10e3, "total_ns",
        (json_int_t)(total - outside_ns), "calls", 1.0, "path", "nap", "type", "Nap", "self_ns",
        (json_int_t)nap_ns, "total_ns", (json_int_t)nap_ns, "calls", 1.0, "path", "fc", "type",
        "Linear", "self_ns", (json_int_t)300e3, "total_ns", (json_int_t)300e3, "calls", 1.0,
        "modules_left_out", 0, "ops", "name", "aten::addmm", "self_ns", (json_int_t)250e3, "calls",
        1.0, "name", "aten::mul", "self_ns", (json_int_t)op_ns, "calls", 2.0, "ops_left_out", 3);
    cr_assert_not_null(f);
    return f;
}

/* A paired comparison of a control of CTL_NS a process against a head of
 * HEAD_NS, the head cell carrying the two profile frames given (NULL:
 * none of that side). */
static json_t *compare(double ctl_ns, double head_ns, json_t *pc, json_t *ph)
{
    struct cmp_side *sc, *sh;
    cr_assert_eq(cmp_side_new(&sc), 0);
    cr_assert_eq(cmp_side_new(&sh), 0);
    crec_cell(sc, "m", "default", "forward");
    struct cmp_cell *hc = crec_cell(sh, "m", "default", "forward");
    for (int i = 0; i < PAIRS; i++) {
        add_proc(hc, ctl_ns, i, true);
        add_proc(hc, head_ns, i, false);
    }
    if (pc)
        cr_assert_eq(cmp_cell_set_profile(hc, pc), 0);
    if (ph)
        cr_assert_eq(cmp_cell_set_profile(hc, ph), 0);
    json_decref(pc);
    json_decref(ph);
    return crec_compare(sc, sh);
}

/*
 * A head whose module "nap" takes 2 ms more (and whose aten::mul takes
 * 20 us more) is a regression, and its profile names nap first with its
 * share of the profiled change, the operator that grew, and the entries
 * that did not grow nowhere. Both reports carry the line.
 */
Test(profile, a_slowed_module_is_named_first_with_its_share)
{
    json_t *r =
        compare(2.6e6, 4.6e6, frame("control", 2e6, 30e3, 40e3), frame("head", 4e6, 50e3, 45e3));
    static const struct jw_want w[] = {
        JW_S("cells.0.perf.verdict", "regression"),
        JW_I("cells.0.perf.profile.pair", PAIRS),
        JW_I("cells.0.perf.profile.iterations.head", 40),
        JW_S("cells.0.perf.profile.modules.0.path", "nap"),
        JW_S("cells.0.perf.profile.modules.0.type", "Nap"),
        JW_D("cells.0.perf.profile.modules.0.delta_ns", 2e6, 1),
        JW_D("cells.0.perf.profile.modules.0.control_ns", 2e6, 1),
        JW_S("cells.0.perf.profile.ops.0.name", "aten::mul"),
        JW_D("cells.0.perf.profile.ops.0.delta_ns", 20e3, 1),
        JW_D("cells.0.perf.profile.outside.delta_ns", 5e3, 1),
        JW_I("cells.0.perf.profile.modules_left_out", 0),
        JW_I("cells.0.perf.profile.ops_left_out", 6),
        JW_N("cells.0.perf.profile.ops_unavailable"),
    };
    jw_expect_all(r, w);
    double total = jw_num(r, "cells.0.perf.profile.delta_ns");
    cr_assert(fabs(total - 2.005e6) < 2, "profiled change %g", total);
    cr_assert(fabs(jw_num(r, "cells.0.perf.profile.modules.0.share") - 2e6 / total) < 1e-9);
    /* Only what grew: fc and the root module kept their time. */
    cr_assert_eq(json_array_size(jw_path(r, "cells.0.perf.profile.modules")), 1);
    cr_assert_eq(json_array_size(jw_path(r, "cells.0.perf.profile.ops")), 1);
    char *md = cmp_result_to_markdown(r), *txt = cmp_result_to_text(r);
    cr_assert(strstr(md, "### Where the time went (profiled pair)"), "%s", md);
    cr_assert(strstr(md, "- `m` / default / forward: +2.00 ms per profiled iteration; modules "
                         "`nap` (Nap) +2.00 ms (100%)"),
              "%s", md);
    cr_assert(strstr(md, "ops `aten::mul` +20.0 us (1%)"), "%s", md);
    cr_assert(strstr(txt, "PROFILE m/default/forward: +2.00 ms per profiled iteration; modules "
                          "nap (Nap) +2.00 ms (100%); outside the modules +5.0 us"),
              "%s", txt);
    free(md);
    free(txt);
    json_decref(r);
}

/* An improvement lists what shrank, largest first; shares stay positive
 * (each entry's part of the change, in the change's direction). */
Test(profile, an_improvement_lists_what_shrank)
{
    json_t *r =
        compare(4.6e6, 2.6e6, frame("control", 4e6, 50e3, 40e3), frame("head", 2e6, 30e3, 40e3));
    cr_assert_str_eq(jw_str(r, "cells.0.perf.verdict"), "improvement");
    cr_assert_str_eq(jw_str(r, "cells.0.perf.profile.modules.0.path"), "nap");
    cr_assert(jw_num(r, "cells.0.perf.profile.modules.0.delta_ns") < -1.9e6);
    cr_assert(jw_num(r, "cells.0.perf.profile.modules.0.share") > 0.99);
    cr_assert_str_eq(jw_str(r, "cells.0.perf.profile.ops.0.name"), "aten::mul");
    json_decref(r);
}

/* A cell with one side's profile, or none, has no explanation; the
 * reports say nothing of it. A same cell with both keeps them in the
 * result but the reports list only changes. */
Test(profile, no_explanation_without_both_sides)
{
    json_t *r = compare(2.6e6, 4.6e6, NULL, frame("head", 4e6, 50e3, 40e3));
    cr_assert_str_eq(jw_str(r, "cells.0.perf.verdict"), "regression");
    cr_assert_null(jw_path(r, "cells.0.perf.profile"));
    char *md = cmp_result_to_markdown(r);
    cr_assert_null(strstr(md, "Where the time went"), "%s", md);
    free(md);
    json_decref(r);

    r = compare(2.6e6, 2.6e6, frame("control", 2e6, 30e3, 40e3), frame("head", 2e6, 30e3, 40e3));
    cr_assert_str_eq(jw_str(r, "cells.0.perf.verdict"), "same");
    cr_assert(json_is_object(jw_path(r, "cells.0.perf.profile")));
    cr_assert_eq(json_array_size(jw_path(r, "cells.0.perf.profile.modules")), 0);
    md = cmp_result_to_markdown(r);
    cr_assert_null(strstr(md, "Where the time went"), "%s", md);
    free(md);
    json_decref(r);
}

/* A frame the engine cannot take (no side, an unknown side, more entries
 * than CMP_MAX_PROFILE_ENTRIES) is refused and the cell keeps what it had. */
Test(profile, a_frame_past_the_limits_is_refused_and_nothing_is_lost)
{
    struct cmp_side *sc, *sh;
    cr_assert_eq(cmp_side_new(&sc), 0);
    cr_assert_eq(cmp_side_new(&sh), 0);
    crec_cell(sc, "m", "default", "forward");
    struct cmp_cell *c = crec_cell(sh, "m", "default", "forward");
    json_t *f[] = {frame("head", 3e6, 1e3, 1e3), json_pack("{s:s}", "kind", "profile"),
                   frame("both", 1e6, 1e3, 1e3), frame("control", 1e6, 1e3, 1e3),
                   frame("control", 1e6, 1e3, 1e3)};
    json_t *mods = json_array();
    for (int i = 0; i <= CMP_MAX_PROFILE_ENTRIES; i++)
        json_array_append_new(mods, json_pack("{s:s,s:i}", "path", "x", "self_ns", 1));
    json_object_set_new(f[3], "modules", mods);
    cr_assert_eq(cmp_cell_set_profile(c, f[0]), 0);
    cr_assert_eq(cmp_cell_set_profile(c, f[1]), -EINVAL);
    cr_assert_eq(cmp_cell_set_profile(c, f[2]), -EINVAL);
    cr_assert_eq(cmp_cell_set_profile(c, f[3]), -EINVAL);
    cr_assert_eq(cmp_cell_set_profile(c, NULL), -EINVAL);
    /* The head's frame is still the cell's: a control frame completes it. */
    cr_assert_eq(cmp_cell_set_profile(c, f[4]), 0);
    for (size_t i = 0; i < sizeof f / sizeof f[0]; i++)
        json_decref(f[i]);
    json_t *r = crec_compare(sc, sh);
    cr_assert_str_eq(jw_str(r, "cells.0.perf.profile.modules.0.path"), "nap");
    cr_assert(fabs(jw_num(r, "cells.0.perf.profile.modules.0.delta_ns") - 2e6) < 1);
    json_decref(r);
}

/* A GPU cell's operators carry device self time beside the CPU's: they
 * are ranked by it (ops_clock "device"), so a kernel that got slower on
 * the device comes first although its launch cost the CPU no more. */
Test(profile, a_gpu_cells_operators_are_ranked_by_device_time)
{
    json_t *c = frame("control", 2e6, 30e3, 40e3), *h = frame("head", 4e6, 30e3, 40e3);
    json_t *dev[2] = {c, h};
    for (int s = 0; s < 2; s++) {
        json_t *ops = json_object_get(dev[s], "ops");
        json_object_set_new(json_array_get(ops, 0), "device_self_ns", json_integer(900000));
        json_object_set_new(json_array_get(ops, 1), "device_self_ns",
                            json_integer(s ? 2900000 : 900000));
    }
    json_t *r = compare(2.6e6, 4.6e6, c, h);
    cr_assert_str_eq(jw_str(r, "cells.0.perf.profile.ops_clock"), "device");
    cr_assert_str_eq(jw_str(r, "cells.0.perf.profile.ops.0.name"), "aten::mul");
    cr_assert(fabs(jw_num(r, "cells.0.perf.profile.ops.0.delta_ns") - 2e6) < 1);
    json_decref(r);
    r = compare(2.6e6, 4.6e6, frame("control", 2e6, 30e3, 40e3), frame("head", 4e6, 50e3, 45e3));
    cr_assert_str_eq(jw_str(r, "cells.0.perf.profile.ops_clock"), "cpu");
    json_decref(r);
}
