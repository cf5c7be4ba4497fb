/*
 * tests/test_compare_opalign.c - ops one side has and the other lacks
 * (compare/opalign.c; docs/compare.md, "Ops one side has and the other
 * lacks"): per-op records of a module call aligned by operator, signature
 * and value rather than by their occurrence index, and an inserted or
 * removed op named as the origin of the divergence it feeds. Each record is
 * built from its values, its hash from them, so equal values hash equal as
 * the runner's content hashes do.
 */
#include <stdio.h>
#include <string.h>

#include <criterion/criterion.h>
#include <jansson.h>

#include "compare/cmp.h"
#include "tests/helpers/common/cmp_records.h"
#include "tests/helpers/common/json_want.h"

/* One record: KEY at SEQ holding N copies of V (N 1..8); its hash is its values'. */
static void put(struct cmp_cell *c, const char *key, int64_t seq, double v, size_t n)
{
    double x[8];
    char hash[64];
    for (size_t i = 0; i < n; i++)
        x[i] = v;
    struct cmp_stats st = {.has_finite = true, .min = v, .max = v, .mean = v};
    snprintf(hash, sizeof hash, "v%.17g-n%zu", v, n);
    crec_add_f64(c, key, seq, x, n, st, hash, CMP_CAPTURE_FULL);
}

static struct cmp_side *new_side(void)
{
    struct cmp_side *s = NULL;
    cr_assert_eq(cmp_side_new(&s), 0);
    return s;
}

/* A record of a side: its key, value and length. */
struct r {
    const char *key;
    double v;
    size_t n;
};

/* A side with one mlp/avx2/forward cell holding RECS in execution order. */
static struct cmp_side *side(const struct r *recs, size_t n)
{
    struct cmp_side *s = new_side();
    struct cmp_cell *c = crec_cell(s, "mlp", "avx2", "forward");
    for (size_t i = 0; i < n; i++)
        put(c, recs[i].key, (int64_t)i, recs[i].v, recs[i].n ? recs[i].n : 4);
    return s;
}

static json_t *compare_all(struct cmp_side *c, struct cmp_side *h)
{
    struct cmp_options o;
    cmp_options_init(&o);
    o.include_tensors = true;
    json_t *r = NULL;
    cr_assert_eq(cmp_compare(c, h, &o, &r), 0);
    char *txt = json_dumps(r, 0); /* every result serializes */
    cr_assert_not_null(txt);
    free(txt);
    return r;
}

/* The control's records CR against the head's HR: the cell holds W. */
static void expect(const struct r *cr, size_t ncr, const struct r *hr, size_t nhr,
                   const struct jw_want *w, size_t nw)
{
    struct cmp_side *c = side(cr, ncr), *h = side(hr, nhr);
    json_t *res = compare_all(c, h);
    jw_expect_n(json_array_get(json_object_get(res, "cells"), 0), w, nw);
    json_decref(res);
    cmp_side_free(c);
    cmp_side_free(h);
}

#define N(a)              (sizeof(a) / sizeof((a)[0]))
#define EXPECT(cr, hr, w) expect(cr, N(cr), hr, N(hr), w, N(w))
#define MUL(n)            "act.0.forward/op.aten::mul." #n ".output.0"
#define IN                                                                                         \
    {                                                                                              \
        "act.0.forward.input.0", 1, 0                                                              \
    }

/* The head inserts an aten::mul before the two the module call runs: by
 * key its first mul would meet the control's first and every later one
 * its predecessor; aligned, the head's second and third meet the control's
 * two, identical, and the inserted one is the only extra. Nothing
 * diverged, so the extra key is the divergence and no op its origin. */
Test(opalign, an_inserted_op_shifts_no_later_call)
{
    const struct r cr[] = {IN, {MUL(0), 2, 0}, {MUL(1), 3, 0}};
    const struct r hr[] = {IN, {MUL(0), 9, 0}, {MUL(1), 2, 0}, {MUL(2), 3, 0}};
    const struct jw_want w[] = {
        JW_I("tensors_diverged", 0),
        JW_I("ops_realigned", 2),
        JW_I("extra_keys", 1),
        JW_I("missing_keys", 0),
        JW_S("extra_key_names.0", MUL(0)),
        JW_S("tensors.1.key", MUL(1)),
        JW_S("tensors.1.control_key", MUL(0)),
        JW_S("tensors.1.status", "identical"),
        JW_S("tensors.2.control_key", MUL(1)),
        JW_S("first_divergence.reason", "extra_in_head"),
        JW_N("op_origin"),
    };
    EXPECT(cr, hr, w);
}

/* Keys that match alone need no alignment: no control_key, no count. */
Test(opalign, equal_op_keys_keep_the_key_merge)
{
    const struct r cr[] = {IN, {MUL(0), 2, 0}, {MUL(1), 3, 0}};
    const struct r hr[] = {IN, {MUL(0), 2, 0}, {MUL(1), 4, 0}};
    const struct jw_want w[] = {
        JW_A("ops_realigned"),
        JW_A("tensors.2.control_key"),
        JW_S("first_divergence.key", MUL(1)),
        JW_N("op_origin"),
    };
    EXPECT(cr, hr, w);
}

/*
 * The measured case: a wrapped gelu that adds an aten::mul, whose module
 * output is not recorded, so the first divergence is the next module's
 * input. Its value is the inserted op's result: that op is the origin.
 */
static const struct r plain[] = {
    {"model.0.forward.input.0", 1, 0},
    IN,
    {"act.0.forward/op.aten::gelu.0.output.0", 2, 0},
    {"fc2.0.forward.input.0", 2, 0},
    {"fc2.0.forward/op.aten::addmm.0.output.0", 3, 0},
    {"fc2.0.forward.output.0", 3, 0},
};
static const struct r wrapped[] = {
    {"model.0.forward.input.0", 1, 0},
    IN,
    {"act.0.forward/op.aten::gelu.0.output.0", 2, 0},
    {MUL(0), 2.0004, 0},
    {"fc2.0.forward.input.0", 2.0004, 0},
    {"fc2.0.forward/op.aten::addmm.0.output.0", 3.1, 0},
    {"fc2.0.forward.output.0", 3.1, 0},
};

Test(opalign, an_inserted_op_is_the_origin_of_the_value_it_passed_on)
{
    const struct jw_want w[] = {
        JW_S("first_divergence.key", "fc2.0.forward.input.0"),
        JW_S("op_origin.kind", "inserted"),
        JW_S("op_origin.op", "aten::mul"),
        JW_S("op_origin.key", MUL(0)),
        JW_S("op_origin.module", "act"),
        JW_I("op_origin.call", 0),
        JW_S("op_origin.phase", "forward"),
        JW_I("op_origin.op_index", 0),
        JW_S("op_origin.link", "same_value"),
        JW_I("op_origin.seq", 3),
        JW_S("op_origin.divergence_key", "fc2.0.forward.input.0"),
    };
    EXPECT(plain, wrapped, w);
}

/* The other way round, the head lost the control's mul (seq: the control's). */
Test(opalign, a_removed_op_is_the_origin)
{
    const struct jw_want w[] = {
        JW_S("op_origin.kind", "removed"),
        JW_S("op_origin.key", MUL(0)),
        JW_I("op_origin.seq", 3),
        JW_S("op_origin.link", "same_value"),
    };
    EXPECT(wrapped, plain, w);
}

/* An op inserted in the module call that diverges, whose own value is not
 * the divergent one (another op follows it), is still its origin. */
Test(opalign, an_inserted_op_in_the_divergent_call)
{
    const struct r cr[] = {
        IN, {"act.0.forward/op.aten::gelu.0.output.0", 2, 0}, {"act.0.forward.output.0", 2, 0}};
    const struct r hr[] = {IN,
                           {"act.0.forward/op.aten::gelu.0.output.0", 2, 0},
                           {MUL(0), 4, 0},
                           {"act.0.forward.output.0", 5, 0}};
    const struct jw_want w[] = {
        JW_S("op_origin.link", "same_call"),
        JW_S("op_origin.divergence_key", "act.0.forward.output.0"),
    };
    EXPECT(cr, hr, w);
}

/* An op inserted elsewhere whose value nobody carries, or after the first
 * divergence, explains nothing. */
Test(opalign, an_unrelated_inserted_op_is_no_origin)
{
    const struct r cr[] = {{"fc1.0.forward.input.0", 1, 0},
                           {"fc1.0.forward.output.0", 2, 0},
                           {"act.0.forward.input.0", 2, 0},
                           {"act.0.forward.output.0", 3, 0}};
    const struct r hr[] = {
        {"fc1.0.forward.input.0", 1, 0},    {"fc1.0.forward/op.aten::clone.0.output.0", 7, 0},
        {"fc1.0.forward.output.0", 2, 0},   {"act.0.forward.input.0", 2, 0},
        {"act.0.forward.output.0", 3.5, 0}, {MUL(0), 3.5, 0}};
    const struct jw_want w[] = {
        JW_S("first_divergence.key", "act.0.forward.output.0"),
        JW_N("op_origin"),
        JW_I("extra_keys", 2),
    };
    EXPECT(cr, hr, w);
}

/* Of two calls of one name, the one of the same output shape pairs, even
 * when its values differ: the head ran only the control's second mul. */
Test(opalign, the_signature_picks_the_call)
{
    const struct r cr[] = {IN, {MUL(0), 2, 4}, {MUL(1), 3, 2}};
    const struct r hr[] = {IN, {MUL(0), 3.5, 2}};
    const struct jw_want w[] = {
        JW_S("tensors.1.key", MUL(0)),        JW_S("tensors.1.control_key", MUL(1)),
        JW_S("tensors.1.status", "diverged"), JW_S("missing_key_names.0", MUL(0)),
        JW_S("op_origin.kind", "removed"),    JW_S("op_origin.link", "same_call"),
    };
    EXPECT(cr, hr, w);
}

/* Ops of another name never pair, whatever their shape and values. */
Test(opalign, only_one_operator_pairs)
{
    const struct r cr[] = {IN, {MUL(0), 2, 0}};
    const struct r hr[] = {IN, {"act.0.forward/op.aten::add.0.output.0", 2, 0}};
    const struct jw_want w[] = {
        JW_A("ops_realigned"),
        JW_I("missing_keys", 1),
        JW_I("extra_keys", 1),
    };
    EXPECT(cr, hr, w);
}

/*
 * A module call of N control mul calls and N + 1 head ones, the head's
 * first inserted before the rest: the cell holds W.
 */
static void expect_long_call(int n, const struct jw_want *w, size_t nw)
{
    struct cmp_side *c = new_side(), *h = new_side();
    struct cmp_cell *cc = crec_cell(c, "mlp", "avx2", "forward");
    struct cmp_cell *hc = crec_cell(h, "mlp", "avx2", "forward");
    char key[96];
    put(hc, MUL(0), 0, -1, 1);
    for (int i = 0; i < n; i++) {
        snprintf(key, sizeof key, "act.0.forward/op.aten::mul.%d.output.0", i);
        put(cc, key, i, i, 1);
        snprintf(key, sizeof key, "act.0.forward/op.aten::mul.%d.output.0", i + 1);
        put(hc, key, i + 1, i, 1);
    }
    json_t *res = compare_all(c, h);
    jw_expect_n(json_array_get(json_object_get(res, "cells"), 0), w, nw);
    json_decref(res);
    cmp_side_free(c);
    cmp_side_free(h);
}

/*
 * The limit: a module call of 2,047 control and 2,048 head op calls is a
 * dynamic programme of 2,048 x 2,049 cells, more than 2^22. It is paired
 * by key, as before alignment (every mul meets its predecessor), and
 * counted: nothing is lost, the count says why.
 */
Test(opalign, a_call_too_long_to_align_is_paired_by_key_and_counted)
{
    const struct jw_want w[] = {
        JW_I("ops_unaligned", 1),       JW_A("ops_realigned"), JW_I("tensors_compared", 2047),
        JW_I("tensors_diverged", 2047), JW_I("extra_keys", 1),
    };
    expect_long_call(2047, w, N(w));
}

/* One call fewer a side (2,047 x 2,048 cells, within 2^22), it aligns. */
Test(opalign, a_call_below_the_limit_aligns)
{
    const struct jw_want w[] = {
        JW_A("ops_unaligned"),
        JW_I("ops_realigned", 2046),
        JW_I("tensors_diverged", 0),
    };
    expect_long_call(2046, w, N(w));
}
