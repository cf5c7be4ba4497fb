/*
 * tests/test_compare_ops.c - per-op records in the comparison engine: op
 * keys, first divergence at the op, the first non-finite origin, and the
 * kernel attribution with the provenance scan's stale wrappers. Known
 * vectors built for one rule each; the engine does no I/O (the shipped
 * table is read from the source tree by the one test about it).
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

/*
 * A record of four float64 values v0..v3 = base, -base, 1, 2 (+delta on
 * element 0), or with nan NaNs in front (stats say so, payload holds them).
 */
static void add(struct cmp_cell *c, const char *key, int64_t seq, double delta, int nan)
{
    double base = (double)seq + 1;
    double v[4] = {base + delta, -base, 1, 2};
    char hash[96];
    for (int i = 0; i < nan && i < 4; i++)
        v[i] = NAN;
    struct cmp_stats st = {.has_finite = nan < 4, .nan = nan, .min = -base, .max = 2};
    snprintf(hash, sizeof hash, "%s-%g-%d", key, delta, nan);
    crec_add_f64(c, key, seq, v, 4, st, hash, CMP_CAPTURE_FULL);
}

static struct cmp_cell *cell(struct cmp_side *s, const char *pass)
{
    return crec_cell(s, "mlp", "avx2", pass);
}

static long long ji(json_t *r, const char *path)
{
    return (long long)json_integer_value(jw_path(r, path));
}

/* Key paths hold dots, so the op record's fields are read through this. */
static json_t *field(json_t *r, const char *obj)
{
    return json_object_get(json_array_get(json_object_get(r, "cells"), 0), obj);
}

static json_t *compare(struct cmp_side *c, struct cmp_side *h)
{
    json_t *r = NULL;
    cr_assert_eq(cmp_compare(c, h, NULL, &r), 0);
    return r;
}

/* The op records of one GELU module call: addmm in fc1, gelu in act. */
static const char *const keys[] = {
    "model.0.forward.input.0",
    "fc1.0.forward.input.0",
    "fc1.0.forward/op.aten::addmm.0.output.0",
    "fc1.0.forward.output.0",
    "act.0.forward.input.0",
    "act.0.forward/op.aten::gelu.0.output.0",
    "act.0.forward.output.0",
    "model.0.forward.output.0",
};
#define NKEYS (sizeof keys / sizeof keys[0])

static void gelu_cell(struct cmp_side *s, const double *delta, const int *nan)
{
    struct cmp_cell *c = cell(s, "forward");
    for (size_t k = 0; k < NKEYS; k++)
        add(c, keys[k], (int64_t)k, delta ? delta[k] : 0, nan ? nan[k] : 0);
}

/* The comparison of the gelu cell on a new control and head side (*C and
 * *H); the head's records are moved by DELTA and hold NAN NaNs (NULL:
 * none). */
static json_t *gelu_compare(struct cmp_side **c, struct cmp_side **h, const double *delta,
                            const int *nan)
{
    cr_assert_eq(cmp_side_new(c), 0);
    cr_assert_eq(cmp_side_new(h), 0);
    gelu_cell(*c, NULL, NULL);
    gelu_cell(*h, delta, nan);
    return compare(*c, *h);
}

/* Frees R, the last result, and the sides C and H it was compared from. */
static void sides_free(json_t *r, struct cmp_side *c, struct cmp_side *h)
{
    json_decref(r);
    cmp_side_free(c);
    cmp_side_free(h);
}

Test(ops, key_parts_and_first_divergence_at_the_op)
{
    struct cmp_side *c, *h;
    double d[NKEYS] = {0, 0, 0, 0, 0, 0.25, 0.25, 0.25};
    json_t *r = gelu_compare(&c, &h, d, NULL);
    const struct jw_want w[] = {
        JW_S("key", keys[5]), JW_S("module", "act"),    JW_S("op", "aten::gelu"),
        JW_I("op_index", 0),  JW_S("phase", "forward"), JW_S("role", "output"),
    };
    jw_expect_all(field(r, "first_divergence"), w);
    /* its module call's input was identical: the op introduced the error */
    cr_assert_str_eq(json_string_value(json_object_get(field(r, "first_introduced"), "key")),
                     keys[5]);
    /* module records carry no op */
    cr_assert_null(json_object_get(field(r, "first_nonfinite"), "op"));
    cr_assert_eq(ji(r, "cells.0.tensors_diverged"), 3);
    sides_free(r, c, h);
}

/* An overload name holds dots; the parts are read from the right. */
Test(ops, overload_names_and_backward_roles)
{
    struct cmp_side *c, *h;
    cmp_side_new(&c);
    cmp_side_new(&h);
    struct cmp_cell *cc = cell(c, "backward"), *hc = cell(h, "backward");
    const char *k0 = "layers.0.attn.2.backward.grad_output.0";
    const char *k1 = "layers.0.attn.2.backward/op.aten::add.Tensor.3.grad_input.1";
    add(cc, k0, 0, 0, 0);
    add(cc, k1, 1, 0, 0);
    add(hc, k0, 0, 0, 0);
    add(hc, k1, 1, 1.0, 0);
    json_t *r = compare(c, h);
    static const struct jw_want w[] = {
        JW_S("module", "layers.0.attn"), JW_I("call", 2),
        JW_S("op", "aten::add.Tensor"),  JW_I("op_index", 3),
        JW_S("phase", "backward"),       JW_S("role", "grad_input"),
    };
    jw_expect_all(field(r, "first_divergence"), w);
    cr_assert_str_eq(json_string_value(json_object_get(field(r, "first_introduced"), "key")), k1);
    sides_free(r, c, h);
}

/* NaN from the gelu op: it is named, not the module outputs after it. */
Test(ops, first_nonfinite_is_the_op)
{
    struct cmp_side *c, *h;
    int nan[NKEYS] = {0, 0, 0, 0, 0, 1, 1, 1};
    json_t *r = gelu_compare(&c, &h, NULL, nan);
    const struct jw_want w[] = {
        JW_S("key", keys[5]),
        JW_S("op", "aten::gelu"),
        JW_S("inputs", "finite"),
        JW_I("nan", 1),
    };
    jw_expect_all(field(r, "first_nonfinite"), w);
    cr_assert(json_is_null(field(r, "control_first_nonfinite")));
    cr_assert_str_eq(json_string_value(json_object_get(field(r, "first_divergence"), "reason")),
                     "nan_inf");
    json_decref(r);
    /* one job alone (compared with itself): the same origin */
    r = compare(h, h);
    cr_assert_str_eq(json_string_value(json_object_get(field(r, "first_nonfinite"), "key")),
                     keys[5]);
    cr_assert_str_eq(jw_str(r, "cells.0.status"), "identical");
    sides_free(r, c, h);
}

/* Module level: the innermost module whose inputs were finite. */
Test(ops, first_nonfinite_module_level_and_from_the_input)
{
    struct cmp_side *s, *t;
    cmp_side_new(&s);
    struct cmp_cell *c = cell(s, "forward");
    add(c, "outer.0.forward.input.0", 0, 0, 0);
    add(c, "inner.0.forward.input.0", 1, 0, 0);
    add(c, "inner.0.forward.output.0", 2, 0, 2);
    add(c, "outer.0.forward.output.0", 3, 0, 2);
    json_t *r = compare(s, s);
    json_t *nf = field(r, "first_nonfinite");
    cr_assert_str_eq(json_string_value(json_object_get(nf, "key")), "inner.0.forward.output.0");
    cr_assert_eq(json_integer_value(json_object_get(nf, "nan")), 2);
    cr_assert_str_eq(json_string_value(json_object_get(nf, "inputs")), "finite");
    json_decref(r);

    /* a NaN in the model's input: no call made it, the input is named */
    cmp_side_new(&t);
    c = cell(t, "forward");
    add(c, "model.0.forward.input.0", 0, 0, 1);
    add(c, "fc.0.forward.input.0", 1, 0, 1);
    add(c, "fc.0.forward.output.0", 2, 0, 1);
    r = compare(t, t);
    nf = field(r, "first_nonfinite");
    cr_assert_str_eq(json_string_value(json_object_get(nf, "key")), "model.0.forward.input.0");
    cr_assert_str_eq(json_string_value(json_object_get(nf, "inputs")), "nonfinite");
    json_decref(r);
    cmp_side_free(s);
    cmp_side_free(t);
}

/* A clean cell has none. */
Test(ops, first_nonfinite_none)
{
    struct cmp_side *s;
    cmp_side_new(&s);
    gelu_cell(s, NULL, NULL);
    json_t *r = compare(s, s);
    cr_assert(json_is_null(field(r, "first_nonfinite")));
    cr_assert(json_is_null(field(r, "control_first_nonfinite")));
    json_decref(r);
    cmp_side_free(s);
}

static const char *const table_text =
    "{\"torch_versions\": [\"1.13\"], \"ops\": {"
    " \"aten::gelu\": {\"kind\": \"stub\", \"stub\": \"GeluKernel\","
    "   \"file\": \"aten/src/ATen/native/cpu/Activation.cpp\"},"
    " \"aten::addmm\": {\"kind\": \"blas\", \"file\": "
    "\"aten/src/ATen/native/LinearAlgebra.cpp\"}}}";

static json_t *provenance(void)
{
    json_t *p = json_loads(
        "{\"findings\": ["
        " {\"kind\": \"generated_source\", \"path\": "
        "\"aten/src/ATen/native/cpu/Activation.cpp.DEFAULT.cpp\", \"message\": \"m\"},"
        " {\"kind\": \"generated_source\", \"path\": "
        "\"aten/src/ATen/native/cpu/Activation.cpp.AVX2.cpp.AVX2.cpp\", \"message\": \"m\"},"
        " {\"kind\": \"generated_source\", \"path\": "
        "\"aten/src/ATen/native/cpu/BinaryOpsKernel.cpp.AVX2.cpp\", \"message\": \"m\"},"
        " {\"kind\": \"generated_source\", \"path\": "
        "\"aten/src/ATen/native/cpu/MyActivation.cpp.AVX2.cpp\", \"message\": \"m\"},"
        " {\"kind\": \"stale_header\", \"path\": \"aten/src/ATen/Config.h\", \"message\": \"m\"},"
        " {\"kind\": \"generated_source\", \"path\": "
        "\"aten/src/ATen/native/cpu/Activation.cpp.AVX512.cpp\", \"message\": "
        "\"7 more generated_source findings not listed (the first: x)\"}]}",
        0, NULL);
    cr_assert_not_null(p);
    return p;
}

/* A kernels test's comparison of the gelu cells, the kernel table and the
 * provenance it attributes with: made by kernels_compare, freed by the
 * suite's fini even when the test fails. */
static struct cmp_side *kc, *kh;
static json_t *kr, *ktable, *kprov;

static void kernels_fini(void)
{
    json_decref(ktable);
    json_decref(kprov);
    sides_free(kr, kc, kh);
}

TestSuite(kernels, .fini = kernels_fini);

/* Compares the gelu cells, the head's records off by DELTA, and loads the
 * test table, and the provenance when WITH_PROV. */
static void kernels_compare(const double *delta, bool with_prov)
{
    kr = gelu_compare(&kc, &kh, delta, NULL);
    ktable = json_loads(table_text, 0, NULL);
    cr_assert_not_null(ktable);
    kprov = with_prov ? provenance() : NULL;
}

Test(kernels, gelu_named_with_its_stale_wrappers)
{
    double d[NKEYS] = {0, 0, 0, 0, 0, 0.25, 0.25, 0.25};
    kernels_compare(d, true);
    cr_assert_eq(cmp_attribute_kernels(kr, ktable, kprov), 0);
    /* two wrappers of Activation.cpp; not BinaryOps, not MyActivation, not the summary */
    static const struct jw_want w[] = {
        JW_S("op", "aten::gelu"),
        JW_S("kind", "stub"),
        JW_S("stub", "GeluKernel"),
        JW_S("file", "aten/src/ATen/native/cpu/Activation.cpp"),
        JW_I("stale_wrappers", 2),
        JW_S("stale_wrapper_paths.1", "aten/src/ATen/native/cpu/Activation.cpp.AVX2.cpp.AVX2.cpp"),
    };
    jw_expect_all(json_object_get(field(kr, "first_divergence"), "kernel"), w);
    cr_assert_str_eq(jw_str(kr, "kernel_table.torch_versions.0"), "1.13");

    char *md = cmp_result_to_markdown(kr), *txt = cmp_result_to_text(kr);
    cr_assert_not_null(md);
    cr_assert_not_null(txt);
    cr_assert(strstr(md, "`aten::gelu` in `act` → GeluKernel, aten/src/ATen/native/cpu/"
                         "Activation.cpp — 2 stale generated wrappers of this file in the "
                         "source tree") != NULL,
              "%s", md);
    cr_assert(strstr(txt, "aten::gelu in act → GeluKernel, aten/src/ATen/native/cpu/"
                          "Activation.cpp — 2 stale generated wrappers") != NULL,
              "%s", txt);
    free(md);
    free(txt);
    json_decref(kr);

    /* without provenance: the kernel, no stale count and no note */
    kr = compare(kc, kh);
    cr_assert_eq(cmp_attribute_kernels(kr, ktable, NULL), 0);
    json_t *k = json_object_get(field(kr, "first_divergence"), "kernel");
    cr_assert_str_eq(json_string_value(json_object_get(k, "stub")), "GeluKernel");
    cr_assert_null(json_object_get(k, "stale_wrappers"));
    md = cmp_result_to_markdown(kr);
    cr_assert(strstr(md, "GeluKernel, aten/src/ATen/native/cpu/Activation.cpp\n") != NULL, "%s",
              md);
    cr_assert(strstr(md, "stale") == NULL, "%s", md);
    free(md);
}

/* A kernel map derived from the source tree names the op before the table
 * does; a malformed entry falls back to the table, and only the map's
 * string fields are taken. */
Test(kernels, source_tree_map_comes_before_the_table)
{
    double d[NKEYS] = {0, 0, 0, 0, 0, 0.25, 0.25, 0.25};
    kernels_compare(d, true);
    cr_assert_eq(json_object_set_new(kprov, "kernel_map",
                                     json_pack("{s:{s:{s:s, s:s, s:s, s:s, s:i}}}", "ops",
                                               "aten::gelu", "kind", "stub", "stub", "gelu_stub",
                                               "file", "aten/src/ATen/native/cpu/Activation.cpp",
                                               "cpu_function", "gelu_out_cpu", "extra", 7)),
                 0);
    cr_assert_eq(cmp_attribute_kernels(kr, ktable, kprov), 0);
    static const struct jw_want w[] = {
        JW_S("op", "aten::gelu"),      JW_S("stub", "gelu_stub"),
        JW_S("source", "source_tree"), JW_S("cpu_function", "gelu_out_cpu"),
        JW_I("stale_wrappers", 2),
    };
    json_t *k = json_object_get(field(kr, "first_divergence"), "kernel");
    jw_expect_all(k, w);
    cr_assert_null(json_object_get(k, "extra"), "only the map's string fields are taken");
    cr_assert_eq(
        json_integer_value(json_object_get(json_object_get(kr, "kernel_table"), "source_tree_ops")),
        1);
    char *txt = cmp_result_to_text(kr);
    cr_assert(strstr(txt, "gelu_stub, aten/src/ATen/native/cpu/Activation.cpp (mapped from the "
                          "source tree) — 2 stale generated wrappers") != NULL,
              "%s", txt);
    free(txt);
    json_decref(kr);

    /* an entry without a stub name is no entry: the table names the kernel */
    json_object_set_new(json_object_get(json_object_get(kprov, "kernel_map"), "ops"), "aten::gelu",
                        json_pack("{s:s, s:i}", "kind", "stub", "stub", 3));
    kr = compare(kc, kh);
    cr_assert_eq(cmp_attribute_kernels(kr, ktable, kprov), 0);
    k = json_object_get(field(kr, "first_divergence"), "kernel");
    cr_assert_str_eq(json_string_value(json_object_get(k, "stub")), "GeluKernel");
    cr_assert_str_eq(json_string_value(json_object_get(k, "source")), "table");
}

Test(kernels, blas_and_unknown_ops)
{
    double d[NKEYS] = {0, 0, 0.5, 0.5, 0.5, 0.5, 0.5, 0.5};
    kernels_compare(d, false);
    cr_assert_eq(cmp_attribute_kernels(kr, ktable, NULL), 0);
    json_t *k = json_object_get(field(kr, "first_divergence"), "kernel");
    cr_assert_str_eq(json_string_value(json_object_get(k, "kind")), "blas");
    char *txt = cmp_result_to_text(kr);
    cr_assert(strstr(txt, "aten::addmm in fc1 → BLAS kernel") != NULL, "%s", txt);
    free(txt);
    json_decref(kr);
    json_decref(ktable);
    /* an op the table lacks */
    ktable = json_loads("{\"ops\": {}}", 0, NULL);
    kr = compare(kc, kh);
    cr_assert_eq(cmp_attribute_kernels(kr, ktable, NULL), 0);
    k = json_object_get(field(kr, "first_divergence"), "kernel");
    cr_assert_str_eq(json_string_value(json_object_get(k, "kind")), "unknown");
    cr_assert_eq(cmp_attribute_kernels(kr, NULL, NULL), -EINVAL);
}

/* The table capd ships: the entries the docs promise. */
Test(kernels, shipped_table)
{
    const char *src = getenv("CAPD_SOURCE_DIR");
    char path[1024];
    cr_assert_not_null(src);
    snprintf(path, sizeof path, "%s/schema/kernels.json", src);
    json_t *t = json_load_file(path, 0, NULL);
    cr_assert_not_null(t, "%s", path);
    static const struct jw_want w[] = {
        JW_S("ops.aten::gelu.stub", "GeluKernel"),
        JW_S("ops.aten::gelu.file", "aten/src/ATen/native/cpu/Activation.cpp"),
        JW_S("ops.aten::gelu_backward.stub", "GeluBackwardKernel"),
        JW_S("ops.aten::addmm.kind", "blas"),
        JW_S("ops.aten::relu.file", "aten/src/ATen/native/cpu/TensorCompareKernel.cpp"),
    };
    jw_expect_all(t, w);
    cr_assert(json_array_size(json_object_get(t, "torch_versions")) > 0);
    const char *name;
    json_t *e;
    json_object_foreach(json_object_get(t, "ops"), name, e)
    {
        const char *kind = json_string_value(json_object_get(e, "kind"));
        cr_assert(strncmp(name, "aten::", 6) == 0, "%s", name);
        cr_assert(kind && json_is_string(json_object_get(e, "file")), "%s", name);
        if (strcmp(kind, "stub") == 0)
            cr_assert(json_is_string(json_object_get(e, "stub")), "%s", name);
    }
    json_decref(t);
}
