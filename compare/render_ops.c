/*
 * compare/render_ops.c - the report lines for per-op findings: the first
 * divergent op with its kernel and the source tree's stale wrappers of that
 * kernel's file, and where NaN/Inf first appeared.
 *
 * One line per cell and finding, for example
 *
 *   mlp / avx512 / forward: aten::gelu in act.0 → GeluKernel,
 *   aten/src/ATen/native/cpu/Activation.cpp — 2 stale generated wrappers of
 *   this file in the source tree
 *
 * render.c places the block; it reads only the result object.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "compare/cmp_int.h"

static const char *js(const json_t *o, const char *k)
{
    const char *s = json_string_value(json_object_get(o, k));
    return s ? s : "";
}

/* Markdown table cells and inline code must not break on these. */
static void put(FILE *f, const char *s, bool md)
{
    for (; *s; s++) {
        if (md && (*s == '`' || *s == '|' || *s == '\n'))
            fputc(*s == '\n' ? ' ' : '\'', f);
        else
            fputc(*s, f);
    }
}

static void cell_id(FILE *f, const json_t *cell, bool md)
{
    fputs(md ? "- `" : "  ", f);
    put(f, js(cell, "model"), md);
    fprintf(f, "%s / %s / %s: ", md ? "`" : "", js(cell, "width"), js(cell, "pass"));
}

/* "aten::gelu in act.0 → GeluKernel, aten/.../Activation.cpp — 2 stale ..." */
static void kernel_line(FILE *f, const json_t *d, bool md)
{
    const json_t *k = json_object_get(d, "kernel");
    const char *kind = js(k, "kind");
    fprintf(f, md ? "`%s` in `" : "%s in ", js(k, "op"));
    put(f, js(d, "module"), md);
    fprintf(f, md ? "` → " : " → ");
    if (strcmp(kind, "stub") == 0)
        fprintf(f, "%s, %s%s", js(k, "stub"), js(k, "file"),
                strcmp(js(k, "source"), "source_tree") == 0 ? " (mapped from the source tree)"
                                                            : "");
    else if (strcmp(kind, "unknown") == 0)
        fprintf(f, "kernel not in capd's table");
    else
        fprintf(f, "%s kernel, %s",
                strcmp(kind, "blas") == 0     ? "BLAS"
                : strcmp(kind, "onednn") == 0 ? "oneDNN"
                                              : "native (no DispatchStub)",
                js(k, "file"));
    json_int_t n = json_integer_value(json_object_get(k, "stale_wrappers"));
    if (n > 0)
        fprintf(f, " — %lld stale generated wrapper%s of this file in the source tree",
                (long long)n, n == 1 ? "" : "s");
    if (json_is_string(json_object_get(k, "note")))
        fprintf(f, " (%s)", js(k, "note"));
}

static void nonfinite_line(FILE *f, const json_t *nf, const char *side, bool md)
{
    const char *inputs = js(nf, "inputs");
    fprintf(f, "%s first non-finite value at %s", side, md ? "`" : "");
    put(f, js(nf, "key"), md);
    fprintf(f, "%s (", md ? "`" : "");
    if (json_is_string(json_object_get(nf, "op")))
        fprintf(f, "%s, ", js(nf, "op"));
    fprintf(f, "%lld NaN, %lld +Inf, %lld -Inf; ",
            (long long)json_integer_value(json_object_get(nf, "nan")),
            (long long)json_integer_value(json_object_get(nf, "pinf")),
            (long long)json_integer_value(json_object_get(nf, "ninf")));
    fprintf(f, "%s)",
            strcmp(inputs, "finite") == 0         ? "its inputs were finite"
            : strcmp(inputs, "not_captured") == 0 ? "its inputs were not captured"
                                                  : "already non-finite: an input or parameter");
}

char *cmp__ops_block(const json_t *result, bool md)
{
    char *out = NULL;
    size_t n = 0, i;
    const json_t *cell;
    bool any = false;
    FILE *f = open_memstream(&out, &n);
    if (f == NULL)
        return NULL;
    json_array_foreach(json_object_get(result, "cells"), i, cell)
    {
        const json_t *d = json_object_get(cell, "first_divergence");
        const json_t *nf = json_object_get(cell, "first_nonfinite");
        const json_t *cnf = json_object_get(cell, "control_first_nonfinite");
        bool div = json_is_object(json_object_get(d, "kernel"));
        /* non-finite values the control shares are no finding of the head */
        bool head_nf = json_is_object(nf) &&
                       !(json_is_object(cnf) && strcmp(js(nf, "key"), js(cnf, "key")) == 0);
        if (!div && !head_nf)
            continue;
        if (!any)
            fputs(md ? "\n### Down to the kernel\n\n" : "kernels:\n", f);
        any = true;
        if (div) {
            cell_id(f, cell, md);
            kernel_line(f, d, md);
            fputc('\n', f);
        }
        if (head_nf) {
            cell_id(f, cell, md);
            nonfinite_line(f, nf, "head", md);
            fputc('\n', f);
        }
    }
    if (fclose(f) != 0 || !any) {
        free(out);
        return NULL;
    }
    return out;
}
