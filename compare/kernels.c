/*
 * compare/kernels.c - from the first divergent op to its CPU kernel and
 * to the polluted files of the source tree.
 *
 * A per-op record names an ATen operator (aten::gelu). When the head job
 * was submitted with its source tree, capctl derived the op -> stub -> file
 * map from that tree (provenance.kernel_map, cli/kernelmap.h) and it names
 * the kernel first. Otherwise the table shipped
 * with capd (schema/kernels.json, docs/compare.md "Kernel attribution")
 * maps it to the DispatchStub its CPU function calls and the file under
 * aten/src/ATen/native/cpu/ that registers the stub, or says that the kernel
 * is no stub at all (BLAS, oneDNN). The job's provenance scan lists the
 * generated wrappers (Activation.cpp.DEFAULT.cpp...) left in the tree;
 * wrappers of the kernel's own file, by the naming rule capctl's scan
 * applies too (util/cpuwrap.h), are the likely cause of the divergence,
 * so the attribution counts them.
 *
 * This runs on a finished cmp_compare() result, so it needs no engine state
 * and a caller without a table (or without provenance) simply skips it.
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "compare/cmp_int.h"
#include "util/cpuwrap.h"

#define STALE_PATHS_SHOWN 5 /* wrapper paths listed per attribution */

/* Whether wrapper path peels to file (also below a prefix: a tree holding pytorch/). */
static bool wraps(const char *path, const char *file)
{
    int depth;
    size_t n = util_cpuwrap_peel(path, &depth), f = strlen(file);
    if (depth == 0 || n < f || memcmp(path + n - f, file, f) != 0)
        return false;
    return n == f || path[n - f - 1] == '/';
}

/* The stale wrappers of file among the provenance findings. */
static int stale_of(const json_t *provenance, const char *file, json_t *kernel)
{
    const json_t *findings = json_object_get(provenance, "findings");
    json_t *paths = json_array();
    json_int_t n = 0;
    size_t i;
    const json_t *f;
    int rc = 0;

    if (paths == NULL)
        return -ENOMEM;
    json_array_foreach(findings, i, f)
    {
        const char *kind = json_string_value(json_object_get(f, "kind"));
        const char *path = json_string_value(json_object_get(f, "path"));
        const char *msg = json_string_value(json_object_get(f, "message"));
        if (!kind || !path || strcmp(kind, "generated_source") != 0 || !wraps(path, file))
            continue;
        /* the scan's "N more findings not listed" summary is not one wrapper */
        if (msg && strstr(msg, " more generated_source findings not listed"))
            continue;
        n++;
        if (json_array_size(paths) < STALE_PATHS_SHOWN)
            rc |= json_array_append_new(paths, json_string(path)) ? -ENOMEM : 0;
    }
    rc |= json_object_set_new(kernel, "stale_wrappers", json_integer(n)) ? -ENOMEM : 0;
    rc |= json_object_set_new(kernel, "stale_wrapper_paths", paths) ? -ENOMEM : 0;
    return rc;
}

/*
 * The source tree's entry for op (provenance.kernel_map.ops, made by
 * `capctl submit --source-tree`), copied field by field: the map comes in
 * with a job request, so only its string fields of a stub entry count.
 */
static json_t *tree_entry(const char *op, const json_t *provenance)
{
    static const char *const fields[] = {"stub", "file", "cpu_function"};
    const json_t *map = json_object_get(json_object_get(provenance, "kernel_map"), "ops");
    const json_t *ent = json_object_get(map, op);
    const char *kind = json_string_value(json_object_get(ent, "kind"));
    json_t *k;

    if (kind == NULL || strcmp(kind, "stub") != 0 ||
        !json_is_string(json_object_get(ent, "stub")) ||
        !json_is_string(json_object_get(ent, "file")) || (k = json_object()) == NULL)
        return NULL;
    int rc = json_object_set_new(k, "kind", json_string("stub"));
    for (size_t i = 0; i < sizeof fields / sizeof fields[0]; i++) {
        const json_t *v = json_object_get(ent, fields[i]);
        if (json_is_string(v))
            rc |= json_object_set_new(k, fields[i], json_string(json_string_value(v)));
    }
    rc |= json_object_set_new(k, "source", json_string("source_tree"));
    if (rc) {
        json_decref(k);
        return NULL;
    }
    return k;
}

/* The "kernel" object for op: the source tree's entry, else the table's,
 * plus the stale wrappers of its file. */
static int kernel_for(const char *op, const json_t *table, const json_t *provenance, json_t **out)
{
    const json_t *ent = json_object_get(json_object_get(table, "ops"), op);
    json_t *k = tree_entry(op, provenance);
    int rc = 0;
    if (k == NULL && json_is_object(ent) && (k = json_deep_copy(ent)) != NULL)
        rc |= json_object_set_new(k, "source", json_string("table"));
    else if (k == NULL)
        k = json_pack("{s:s}", "kind", "unknown");
    if (k == NULL)
        return -ENOMEM;
    rc |= json_object_set_new(k, "op", json_string(op)) ? -ENOMEM : 0;
    const char *file = json_string_value(json_object_get(k, "file"));
    if (file != NULL && provenance != NULL &&
        json_is_array(json_object_get(provenance, "findings")))
        rc |= stale_of(provenance, file, k);
    if (rc) {
        json_decref(k);
        return rc;
    }
    *out = k;
    return 0;
}

int cmp_attribute_kernels(json_t *result, const json_t *table, const json_t *provenance)
{
    static const char *const fields[] = {"first_divergence", "first_introduced", "first_nonfinite",
                                         "control_first_nonfinite"};
    size_t i;
    json_t *cell;

    if (!json_is_object(result) || !json_is_object(table))
        return -EINVAL;
    json_array_foreach(json_object_get(result, "cells"), i, cell)
    {
        for (size_t f = 0; f < sizeof fields / sizeof fields[0]; f++) {
            json_t *d = json_object_get(cell, fields[f]), *k = NULL;
            const char *op = json_string_value(json_object_get(d, "op"));
            if (op == NULL)
                continue;
            int rc = kernel_for(op, table, provenance, &k);
            if (rc == 0 && json_object_set_new(d, "kernel", k))
                rc = -ENOMEM;
            if (rc)
                return rc;
        }
    }
    const json_t *tree = json_object_get(json_object_get(provenance, "kernel_map"), "ops");
    json_t *about =
        json_pack("{s:O?, s:b, s:I}", "torch_versions", json_object_get(table, "torch_versions"),
                  "provenance", provenance != NULL, "source_tree_ops",
                  (json_int_t)(json_is_object(tree) ? json_object_size(tree) : 0));
    if (about == NULL || json_object_set_new(result, "kernel_table", about))
        return -ENOMEM;
    return 0;
}
