/*
 * api/api_widths_render.c - the width self-check's result (GET
 * /v1/jobs/{id}/widths, api/api_widths_check.c) as Markdown or text.
 *
 * Like the comparison's renderers (compare/render.c) it reads only the
 * result object. A reader stops early, so the report leads with the
 * verdict, then one line per width with its verdict and where it first
 * left the scalar path, then the details: every model and pass of each
 * width. At most CMP_MAX_RENDER bytes; past that the report ends with a
 * note and the JSON holds the rest.
 */
#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>

#include "api/api_int.h"
#include "compare/cmp.h"
#include "util/buf.h"

#define TRUNC_NOTE "\n(report truncated; the JSON result has everything)\n"

struct rbuf {
    struct ubuf b;
    bool md, truncated, oom;
};

__attribute__((format(printf, 2, 3))) static void put(struct rbuf *o, const char *fmt, ...)
{
    if (o->truncated || o->oom)
        return;
    size_t len = o->b.len;
    va_list ap;
    va_start(ap, fmt);
    int rc = ubuf_vaddf(&o->b, fmt, ap);
    va_end(ap);
    if (rc == -E2BIG || (rc == 0 && o->b.len + sizeof(TRUNC_NOTE) > CMP_MAX_RENDER)) {
        ubuf_setlen(&o->b, len);
        o->truncated = true;
    } else if (rc) {
        o->oom = true;
    }
}

static const char *jstr(const json_t *o, const char *k)
{
    const char *s = json_string_value(json_object_get(o, k));
    return s ? s : "";
}

static json_int_t jint(const json_t *o, const char *k)
{
    return json_integer_value(json_object_get(o, k));
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
        name(o, jstr(site, "module"));
        put(o, ", ");
    }
    if (json_is_string(json_object_get(site, "op"))) {
        put(o, "op ");
        name(o, jstr(site, "op"));
        put(o, ", ");
    }
    put(o, "key ");
    name(o, jstr(site, "key"));
    put(o, " (%s",
        json_is_string(json_object_get(site, "reason")) ? jstr(site, "reason")
                                                        : "within tolerance");
    put(o, "; rule %s", jstr(site, "rule"));
    judgement(o, site);
    if (json_is_object(json_object_get(site, "kernel")))
        put(o, "; kernel %s", jstr(json_object_get(site, "kernel"), "file"));
    put(o, ")");
}

/* "3 cells, 2 compared: 1 within tolerance, 1 diverged; 1 not run". */
static void counts_text(struct rbuf *o, const json_t *c)
{
    static const char *const order[] = {"identical", "within_tolerance", "nondeterministic",
                                        "diverged",  "incomparable",     "unsupported",
                                        "not_run",   "missing"};
    put(o, "%lld cell%s, %lld compared", (long long)jint(c, "cells"),
        jint(c, "cells") == 1 ? "" : "s", (long long)jint(c, "compared"));
    const char *sep = ": ";
    for (size_t i = 0; i < sizeof order / sizeof order[0]; i++) {
        if (jint(c, order[i]) == 0)
            continue;
        put(o, "%s%lld %s", sep, (long long)jint(c, order[i]), order[i]);
        sep = ", ";
    }
    if (jint(c, "outcome_regressions") > 0)
        put(o, "; %lld failed where default ran ok", (long long)jint(c, "outcome_regressions"));
}

static void head(struct rbuf *o, const json_t *r)
{
    bool f64 = json_is_string(json_object_get(r, "reference"));
    put(o, o->md ? "## capd width self-check: %s\n\nJob " : "capd width self-check: %s\njob ",
        jstr(r, "verdict"));
    name(o, jstr(r, "job"));
    put(o, " (commit ");
    name(o, jstr(r, "commit"));
    put(o, ", build ");
    name(o, jstr(r, "build"));
    put(o, "): every width against ");
    name(o, jstr(r, "baseline_width"));
    put(o, f64 ? ", judged by the float64 reference (rule reference_float64).\n"
               : ", judged by the tolerance rule (no float64 reference records).\n");
    if (!f64)
        put(o, o->md ? "\n> **Note:** %s\n" : "note: %s\n", jstr(r, "note"));
    put(o, o->md ? "\n| width | verdict | cells | first divergence |\n| --- | --- | --- | --- |\n"
                 : "\n");
}

/* One line (a table row in Markdown) per width. */
static void summary_line(struct rbuf *o, const json_t *w)
{
    const json_t *fd = json_object_get(w, "first_divergence");
    bool div = strcmp(jstr(w, "verdict"), "diverged") == 0;
    if (o->md) {
        put(o, "| ");
        name(o, jstr(w, "width"));
        put(o, div ? " | **%s** | " : " | %s | ", jstr(w, "verdict"));
    } else {
        put(o, "%-9s %-10s ", jstr(w, "width"), jstr(w, "verdict"));
    }
    counts_text(o, json_object_get(w, "counts"));
    put(o, "%s", o->md ? " | " : json_is_object(fd) ? "; first divergence: " : "");
    if (json_is_object(fd)) {
        put(o, "%s %s: ", jstr(fd, "model"), jstr(fd, "pass"));
        site_text(o, fd);
    } else if (o->md) {
        put(o, "–");
    }
    put(o, "%s\n", o->md ? " |" : "");
}

/* Why a cell of width WIDTH was not judged: the side whose outcome was not
 * ok, or the engine's word. */
static void status_reason(struct rbuf *o, const json_t *c, const char *width)
{
    const char *why = jstr(c, "status_reason");
    if (strcmp(why, "control_outcome") == 0)
        put(o, " (the default cell ended %s)", jstr(c, "control_outcome"));
    else if (strcmp(why, "head_outcome") == 0 || strcmp(jstr(c, "status"), "unsupported") == 0)
        put(o, " (the %s cell ended %s)", width, jstr(c, "head_outcome"));
    else if (strcmp(jstr(c, "status"), "not_run") == 0)
        put(o, " (this host cannot run %s)", width);
    else if (*why)
        put(o, " (%s)", why);
}

/* One line per model and pass of width WIDTH. */
static void cell_line(struct rbuf *o, const json_t *c, const char *width)
{
    const json_t *fd = json_object_get(c, "first_divergence");
    const json_t *fi = json_object_get(c, "first_introduced");
    const char *st = jstr(c, "status");
    put(o, "%s%s %s: %s", o->md ? "- " : "  ", jstr(c, "model"), jstr(c, "pass"), st);
    status_reason(o, c, width);
    if (strcmp(jstr(c, "outcome_change"), "regression") == 0)
        put(o, ", failed where default ran ok");
    if (strcmp(st, "within_tolerance") == 0 || strcmp(st, "diverged") == 0)
        put(o, " (rule %s)", jstr(c, "rule"));
    if (json_is_object(fd)) {
        put(o, "; first divergence ");
        site_text(o, fd);
    }
    if (json_is_object(fi) && !json_equal(json_object_get(fi, "key"), json_object_get(fd, "key"))) {
        put(o, "; error introduced at ");
        name(o, jstr(fi, "key"));
    }
    put(o, "\n");
}

char *api_widths_check_render(const json_t *check, bool md)
{
    struct rbuf o = {.md = md};
    const json_t *widths = json_object_get(check, "widths");
    size_t i, k;
    json_t *w, *c;
    ubuf_init(&o.b, CMP_MAX_RENDER - 1);
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
            name(&o, jstr(w, "width"));
            put(&o, "**: %s\n\n", jstr(w, "verdict"));
        } else {
            put(&o, "%s: %s\n", jstr(w, "width"), jstr(w, "verdict"));
        }
        json_array_foreach(json_object_get(w, "cells"), k, c)
        {
            cell_line(&o, c, jstr(w, "width"));
        }
    }
    if (!o.oom && o.truncated && ubuf_adds(&o.b, TRUNC_NOTE) != 0)
        o.oom = true;
    if (o.oom) {
        ubuf_free(&o.b);
        return NULL;
    }
    return ubuf_take(&o.b, NULL);
}
