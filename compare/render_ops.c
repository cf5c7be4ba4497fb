/*
 * compare/render_ops.c - the report lines for per-op findings: an op one
 * side ran alone, the first divergent op with its kernel and the source tree's stale wrappers of
 * that kernel's file, and where NaN/Inf first appeared.
 *
 * One line per cell and finding, for example
 *
 *   mlp / avx512 / forward: aten::gelu in act.0 → GeluKernel,
 *   aten/src/ATen/native/cpu/Activation.cpp — 2 stale generated wrappers of
 *   this file in the source tree
 *
 * an op one side ran alone that the first divergence follows:
 *
 *   mlp / avx512 / forward: aten::mul inserted in the head in act (call 0,
 *   forward), before the first divergence act.0.forward.output.0, which
 *   holds its result
 *
 * and, per diverged cell, where its error grew the most:
 *
 *   mlp / avx512 / forward: largest at act.0.forward/op.aten::gelu.0.output.0
 *   (aten::gelu in act): relative error 0.001 -> 0.04, 40x, fed by
 *   act.0.forward.input.0
 *
 * render.c places the block, and the first divergence's growth note
 * (cmp__growth_note) beside the first divergence; they read only the
 * result object.
 */
#include <math.h>
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
    char pm[48];
    fputs(md ? "- `" : "  ", f);
    put(f, js(cell, "model"), md);
    fprintf(f, "%s / %s / %s: ", md ? "`" : "", js(cell, "width"),
            cmp_json_pass(cell, pm, sizeof pm));
}

/*
 * The provenance note: how many stale generated wrappers of the kernel's
 * file the head's source tree holds, and the paths the attribution kept.
 */
static void stale_note(FILE *f, const json_t *k, bool md)
{
    json_int_t n = json_integer_value(json_object_get(k, "stale_wrappers"));
    const json_t *paths = json_object_get(k, "stale_wrapper_paths");
    size_t i;
    const json_t *p;
    if (n <= 0)
        return;
    fprintf(f, " — %lld stale generated wrapper%s of this file in the source tree", (long long)n,
            n == 1 ? "" : "s");
    json_array_foreach(paths, i, p)
    {
        fputs(i == 0 ? ": " : ", ", f);
        fputs(md ? "`" : "", f);
        put(f, json_string_value(p) ? json_string_value(p) : "", md);
        fputs(md ? "`" : "", f);
    }
    if ((size_t)n > json_array_size(paths) && json_array_size(paths) > 0)
        fprintf(f, " and %lld more", (long long)n - (long long)json_array_size(paths));
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
    stale_note(f, k, md);
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

static double jreal(const json_t *o, const char *k)
{
    const json_t *v = json_object_get(o, k);
    return json_is_number(v) ? json_number_value(v) : NAN;
}

/* The cell's op or module, as "aten::gelu in act" or "act". */
static void where(FILE *f, const json_t *o, bool md)
{
    const char *q = md ? "`" : "";
    if (json_is_string(json_object_get(o, "op")))
        fprintf(f, "%s%s%s in ", q, js(o, "op"), q);
    fputs(q, f);
    put(f, js(o, "module"), md);
    fputs(q, f);
}

char *cmp__growth_note(const json_t *cell)
{
    const json_t *g = json_object_get(cell, "first_divergence_growth");
    const char *kind = js(g, "kind");
    char *out = NULL;
    size_t n = 0;
    if (!json_is_object(g))
        return NULL;
    FILE *f = open_memstream(&out, &n);
    if (f == NULL)
        return NULL;
    if (strcmp(kind, "introduced") == 0)
        fprintf(f, "error introduced here: inputs exact, relative error %.3g",
                jreal(g, "out_rel_err"));
    else if (strcmp(kind, "amplified") == 0)
        fprintf(f, "error amplified %.3gx here: relative error %.3g in, %.3g out",
                jreal(g, "ratio"), jreal(g, "in_rel_err"), jreal(g, "out_rel_err"));
    else
        fprintf(f, "error carried, not grown: relative error %.3g in, %.3g out",
                jreal(g, "in_rel_err"), jreal(g, "out_rel_err"));
    if (fclose(f) != 0) {
        free(out);
        return NULL;
    }
    return out;
}

/*
 * One titled section of the ops block over the result's cells: a cell
 * writer calls section_open before its first line, so the title goes out
 * once, ahead of the first cell with something to say, and never for a
 * section with nothing in it.
 */
struct section {
    FILE *f;
    bool md, any;
    const char *title_md, *title;
};

static void section_open(struct section *s)
{
    if (!s->any)
        fputs(s->md ? s->title_md : s->title, s->f);
    s->any = true;
}

/* CELL's object FIELD, when it has one, as a line of S: the section's
 * title first, the cell's name, then LINE's text of the object. */
static void field_cell(struct section *s, const json_t *cell, const char *field,
                       void (*line)(FILE *f, const json_t *o, bool md))
{
    const json_t *o = json_object_get(cell, field);
    if (!json_is_object(o))
        return;
    section_open(s);
    cell_id(s->f, cell, s->md);
    line(s->f, o, s->md);
}

/* Where a diverged cell's error grew most (amplify.c), A its
 * max_amplification. */
static void amp_line(FILE *f, const json_t *a, bool md)
{
    fputs(md ? "largest at `" : "largest at ", f);
    put(f, js(a, "key"), md);
    fputs(md ? "` (" : " (", f);
    where(f, a, md);
    fprintf(f, "): relative error %.3g → %.3g, %.3gx, fed by %s", jreal(a, "in_rel_err"),
            jreal(a, "out_rel_err"), jreal(a, "ratio"), md ? "`" : "");
    put(f, js(a, "input_key"), md);
    fputs(md ? "`\n" : "\n", f);
}

static void amp_cell(struct section *s, const json_t *cell)
{
    field_cell(s, cell, "max_amplification", amp_line);
}

/* The kernel of a cell's first divergent op and of its head non-finite
 * origin when the control does not share it. */
static void kernel_cell(struct section *s, const json_t *cell)
{
    FILE *f = s->f;
    bool md = s->md;
    const json_t *d = json_object_get(cell, "first_divergence");
    const json_t *nf = json_object_get(cell, "first_nonfinite");
    const json_t *cnf = json_object_get(cell, "control_first_nonfinite");
    bool div = json_is_object(json_object_get(d, "kernel"));
    /* non-finite values the control shares are no finding of the head */
    bool head_nf =
        json_is_object(nf) && !(json_is_object(cnf) && strcmp(js(nf, "key"), js(cnf, "key")) == 0);
    if (div) {
        section_open(s);
        cell_id(f, cell, md);
        kernel_line(f, d, md);
        fputc('\n', f);
    }
    if (head_nf) {
        section_open(s);
        cell_id(f, cell, md);
        nonfinite_line(f, nf, "head", md);
        fputc('\n', f);
    }
}

/* An op one side ran alone that the first divergence follows (opalign.c),
 * O the cell's op_origin. */
static void origin_line(FILE *f, const json_t *o, bool md)
{
    bool ins = strcmp(js(o, "kind"), "inserted") == 0;
    fputs(md ? "`" : "", f);
    put(f, js(o, "op"), md);
    fprintf(f, "%s %s in %s", md ? "`" : "", ins ? "inserted in the head" : "removed from the head",
            md ? "`" : "");
    put(f, js(o, "module"), md);
    fprintf(f, "%s (call %lld, %s), before the first divergence %s", md ? "`" : "",
            (long long)json_integer_value(json_object_get(o, "call")), js(o, "phase"),
            md ? "`" : "");
    put(f, js(o, "divergence_key"), md);
    fprintf(f, "%s%s\n", md ? "`" : "",
            strcmp(js(o, "link"), "same_value") == 0
                ? (ins ? ", which holds its result" : ", which held its result in the control")
                : ", in the same module call");
}

static void origin_cell(struct section *s, const json_t *cell)
{
    field_cell(s, cell, "op_origin", origin_line);
}

/* The section CELL_LINES writes over every cell; false when it wrote none. */
static bool section(FILE *f, const json_t *result, bool md, const char *title_md, const char *title,
                    void (*cell_lines)(struct section *, const json_t *))
{
    struct section s = {.f = f, .md = md, .title_md = title_md, .title = title};
    size_t i;
    const json_t *cell;
    json_array_foreach(json_object_get(result, "cells"), i, cell)
    {
        cell_lines(&s, cell);
    }
    return s.any;
}

char *cmp__ops_block(const json_t *result, bool md)
{
    char *out = NULL;
    size_t n = 0;
    FILE *f = open_memstream(&out, &n);
    if (f == NULL)
        return NULL;
    bool any = section(f, result, md, "\n### Ops one side ran alone\n\n",
                       "inserted or removed ops:\n", origin_cell);
    any |= section(f, result, md, "\n### Down to the kernel\n\n", "kernels:\n", kernel_cell);
    any |= section(f, result, md, "\n### Error amplification\n\n", "amplification:\n", amp_cell);
    if (fclose(f) != 0 || !any) {
        free(out);
        return NULL;
    }
    return out;
}
