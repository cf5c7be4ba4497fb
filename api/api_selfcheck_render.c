/*
 * api/api_selfcheck_render.c - a self-check's result (GET
 * /v1/jobs/{id}/widths and /modes, api/api_selfcheck.c) as Markdown or
 * text.
 *
 * Like the comparison's renderers (compare/render.c) it reads only the
 * result object, and it writes into their capped report (struct
 * cmp_report, compare/cmp.h). A reader stops early, so the report leads
 * with the verdict, then one line per width (or compiled mode) with its
 * verdict and where it first left the baseline, then the details: every
 * cell of each. At most CMP_MAX_RENDER bytes; past that the report ends
 * with a note and the JSON holds the rest.
 */
#include <stdarg.h>
#include <stdio.h>
#include <string.h>

#include "api/api_int.h"
#include "compare/cmp.h"

#define TRUNC_NOTE "\n(report truncated; the JSON result has everything)\n"

/* The report (compare's capped one), whether it is Markdown, the axis
 * checked ("width" or "mode") and its baseline ("default", "eager"). */
struct rbuf {
    struct cmp_report r;
    bool md;
    const char *axis, *baseline;
};

__attribute__((format(printf, 2, 3))) static void put(struct rbuf *o, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    cmp_report_vaddf(&o->r, fmt, ap);
    va_end(ap);
}

/* A name from the result (a key, a module, an op): code in Markdown, where
 * a backtick would end the span and a pipe the table cell; no control
 * character either way. */
static void name(struct rbuf *o, const char *s)
{
    put(o, "%s", o->md ? "`" : "");
    for (; *s; s++) {
        unsigned char c = (unsigned char)*s;
        if (c < 0x20 || c == 0x7f)
            put(o, "?");
        else if (o->md && c == '`')
            put(o, "'");
        else if (o->md && c == '|')
            put(o, "\\|");
        else
            put(o, "%c", c);
    }
    put(o, "%s", o->md ? "`" : "");
}

/* The arbiter's word, as the comparison reports say it. */
static void judgement(struct rbuf *o, const json_t *site)
{
    char t[256];
    if (cmp_reference_judgement(site, t, sizeof t) == 0)
        put(o, "; %s", t);
}

/* "layer fc1, op aten::mul, key fc1.0.forward.output.0 (tolerance; rule
 * ...)": where a divergence is and what decided it. */
static void site_text(struct rbuf *o, const json_t *site)
{
    if (json_is_string(json_object_get(site, "module"))) {
        put(o, "layer ");
        name(o, cmp_json_str(site, "module"));
        put(o, ", ");
    }
    if (json_is_string(json_object_get(site, "op"))) {
        put(o, "op ");
        name(o, cmp_json_str(site, "op"));
        put(o, ", ");
    }
    put(o, "key ");
    name(o, cmp_json_str(site, "key"));
    put(o, " (%s",
        json_is_string(json_object_get(site, "reason")) ? cmp_json_str(site, "reason")
                                                        : "within tolerance");
    put(o, "; rule %s", cmp_json_str(site, "rule"));
    judgement(o, site);
    if (json_is_object(json_object_get(site, "kernel")))
        put(o, "; kernel %s", cmp_json_str(json_object_get(site, "kernel"), "file"));
    put(o, ")");
}

/* "3 cells, 2 compared: 1 within tolerance, 1 diverged; 1 not run". */
static void counts_text(struct rbuf *o, const json_t *c)
{
    static const char *const order[] = {"identical", "within_tolerance", "nondeterministic",
                                        "diverged",  "incomparable",     "unsupported",
                                        "not_run",   "missing"};
    put(o, "%lld cell%s, %lld compared", (long long)cmp_json_int(c, "cells"),
        cmp_json_int(c, "cells") == 1 ? "" : "s", (long long)cmp_json_int(c, "compared"));
    const char *sep = ": ";
    for (size_t i = 0; i < sizeof order / sizeof order[0]; i++) {
        if (cmp_json_int(c, order[i]) == 0)
            continue;
        put(o, "%s%lld %s", sep, (long long)cmp_json_int(c, order[i]), order[i]);
        sep = ", ";
    }
    if (cmp_json_int(c, "outcome_regressions") > 0)
        put(o, "; %lld failed where %s ran ok", (long long)cmp_json_int(c, "outcome_regressions"),
            o->baseline);
}

static void head(struct rbuf *o, const json_t *r)
{
    bool f64 = json_is_string(json_object_get(r, "reference"));
    put(o, o->md ? "## capd %s self-check: %s\n\nJob " : "capd %s self-check: %s\njob ", o->axis,
        cmp_json_str(r, "verdict"));
    name(o, cmp_json_str(r, "job"));
    put(o, " (commit ");
    name(o, cmp_json_str(r, "commit"));
    put(o, ", build ");
    name(o, cmp_json_str(r, "build"));
    put(o, strcmp(o->axis, "mode") == 0 ? "): every compiled mode against "
                                        : "): every width against ");
    name(o, o->baseline);
    if (strcmp(o->axis, "mode") == 0)
        put(o, " at the same width");
    put(o, f64 ? ", judged by the float64 reference (rule reference_float64).\n"
               : ", judged by the tolerance rule (no float64 reference records).\n");
    if (!f64)
        put(o, o->md ? "\n> **Note:** %s\n" : "note: %s\n", cmp_json_str(r, "note"));
    if (o->md)
        put(o, "\n| %s | verdict | cells | first divergence |\n| --- | --- | --- | --- |\n",
            o->axis);
    else
        put(o, "\n");
}

/* One line (a table row in Markdown) per width or mode. */
static void summary_line(struct rbuf *o, const json_t *w)
{
    const json_t *fd = json_object_get(w, "first_divergence");
    bool div = strcmp(cmp_json_str(w, "verdict"), "diverged") == 0;
    if (o->md) {
        put(o, "| ");
        name(o, cmp_json_str(w, o->axis));
        put(o, div ? " | **%s** | " : " | %s | ", cmp_json_str(w, "verdict"));
    } else {
        put(o, "%-9s %-10s ", cmp_json_str(w, o->axis), cmp_json_str(w, "verdict"));
    }
    counts_text(o, json_object_get(w, "counts"));
    put(o, "%s", o->md ? " | " : json_is_object(fd) ? "; first divergence: " : "");
    if (json_is_object(fd)) {
        put(o, "%s %s", cmp_json_str(fd, "model"), cmp_json_str(fd, "pass"));
        if (strcmp(o->axis, "mode") == 0)
            put(o, " at %s", cmp_json_str(fd, "width"));
        put(o, ": ");
        site_text(o, fd);
    } else if (o->md) {
        put(o, "–");
    }
    put(o, "%s\n", o->md ? " |" : "");
}

/* Why a cell of VALUE (a width or mode) was not judged: the side whose
 * outcome was not ok, or the engine's word. */
static void status_reason(struct rbuf *o, const json_t *c, const char *value)
{
    const char *why = cmp_json_str(c, "status_reason");
    if (strcmp(why, "control_outcome") == 0)
        put(o, " (the %s cell ended %s)", o->baseline, cmp_json_str(c, "control_outcome"));
    else if (strcmp(why, "head_outcome") == 0 ||
             strcmp(cmp_json_str(c, "status"), "unsupported") == 0)
        put(o, " (the %s cell ended %s)", value, cmp_json_str(c, "head_outcome"));
    else if (strcmp(cmp_json_str(c, "status"), "not_run") == 0)
        put(o, " (this host cannot run %s)",
            strcmp(o->axis, "mode") == 0 ? cmp_json_str(c, "width") : value);
    else if (*why)
        put(o, " (%s)", why);
}

/* One line per model and pass of VALUE, with the cell's other axis: its
 * mode (eager goes unsaid) in a width check, its width in a mode check. */
static void cell_line(struct rbuf *o, const json_t *c, const char *value)
{
    const json_t *fd = json_object_get(c, "first_divergence");
    const json_t *fi = json_object_get(c, "first_introduced");
    const char *st = cmp_json_str(c, "status");
    bool by_mode = strcmp(o->axis, "mode") == 0;
    const char *other = cmp_json_str(c, by_mode ? "width" : "mode");
    bool say = by_mode || (other[0] && strcmp(other, "eager") != 0);
    put(o, "%s%s %s%s%s: %s", o->md ? "- " : "  ", cmp_json_str(c, "model"),
        cmp_json_str(c, "pass"), say ? (by_mode ? " at " : " ") : "", say ? other : "", st);
    status_reason(o, c, value);
    if (strcmp(cmp_json_str(c, "outcome_change"), "regression") == 0)
        put(o, ", failed where %s ran ok", o->baseline);
    if (strcmp(st, "within_tolerance") == 0 || strcmp(st, "diverged") == 0)
        put(o, " (rule %s)", cmp_json_str(c, "rule"));
    if (json_is_object(fd)) {
        put(o, "; first divergence ");
        site_text(o, fd);
    }
    if (json_is_object(fi) && !json_equal(json_object_get(fi, "key"), json_object_get(fd, "key"))) {
        put(o, "; error introduced at ");
        name(o, cmp_json_str(fi, "key"));
    }
    put(o, "\n");
}

char *api_selfcheck_render(const json_t *check, const char *axis, bool md)
{
    char base[32];
    snprintf(base, sizeof base, "baseline_%s", axis);
    struct rbuf o = {.md = md, .axis = axis, .baseline = cmp_json_str(check, base)};
    const json_t *widths = json_object_get(check, strcmp(axis, "mode") == 0 ? "modes" : "widths");
    size_t i, k;
    json_t *w, *c;
    cmp_report_init(&o.r, TRUNC_NOTE);
    head(&o, check);
    json_array_foreach(widths, i, w)
    {
        summary_line(&o, w);
    }
    put(&o, md ? "\n### Details\n" : "\ndetails:\n");
    json_array_foreach(widths, i, w)
    {
        if (md) {
            put(&o, "\n**");
            name(&o, cmp_json_str(w, axis));
            put(&o, "**: %s\n\n", cmp_json_str(w, "verdict"));
        } else {
            put(&o, "%s: %s\n", cmp_json_str(w, axis), cmp_json_str(w, "verdict"));
        }
        json_array_foreach(json_object_get(w, "cells"), k, c)
        {
            cell_line(&o, c, cmp_json_str(w, axis));
        }
    }
    return cmp_report_finish(&o.r);
}
