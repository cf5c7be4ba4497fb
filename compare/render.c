/*
 * compare/render.c - a cmp_compare() result as a PR comment or as text.
 *
 * The renderers read only the result object, never the engine's structs, so
 * anything that holds a stored result (the API, the CLI, a dashboard hook)
 * renders the same report. A reviewer reads top-down and stops early, so the
 * order is: verdict, outcome regressions (a crash is the loudest finding),
 * missing cells, cells whose numbers differ, then performance changes.
 *
 * It also owns the capped report they write into (cmp_report_*) and the two
 * readers of a result's fields (cmp_json_str, cmp_json_int), which the API's
 * width self-check report (api/api_selfcheck_render.c) writes and reads with.
 */
#include <errno.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "compare/cmp_int.h"
#include "util/buf.h"

#define TRUNC_NOTE "\n(report truncated)\n"

/* ------------------------------------------------------------ the report */

void cmp_report_init(struct cmp_report *r, const char *note)
{
    ubuf_init(&r->b, CMP_MAX_RENDER - 1);
    r->note = note;
    r->truncated = r->oom = false;
}

/* All of the piece or none of it (ubuf_vaddf's rule), and none once the
 * note would no longer fit behind it: from then on the report is closed. */
void cmp_report_vaddf(struct cmp_report *r, const char *fmt, va_list ap)
{
    if (r->truncated || r->oom)
        return;
    size_t len = r->b.len;
    int rc = ubuf_vaddf(&r->b, fmt, ap);
    if (rc == -E2BIG || (rc == 0 && r->b.len + strlen(r->note) + 1 > CMP_MAX_RENDER)) {
        ubuf_setlen(&r->b, len);
        r->truncated = true;
    } else if (rc) {
        r->oom = true;
    }
}

void cmp_report_addf(struct cmp_report *r, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    cmp_report_vaddf(r, fmt, ap);
    va_end(ap);
}

char *cmp_report_finish(struct cmp_report *r)
{
    if (!r->oom && r->truncated && ubuf_adds(&r->b, r->note) != 0)
        r->oom = true;
    if (r->oom) {
        ubuf_free(&r->b);
        return NULL;
    }
    return ubuf_take(&r->b, NULL);
}

/* ------------------------------------------------------- reading results */

const char *cmp_json_str(const json_t *o, const char *k)
{
    const char *s = json_string_value(json_object_get(o, k));
    return s ? s : "";
}

const char *cmp_json_pass(const json_t *cell, char *buf, size_t n)
{
    const char *mode = cmp_json_str(cell, "mode");
    if (!mode[0] || strcmp(mode, "eager") == 0)
        return cmp_json_str(cell, "pass");
    snprintf(buf, n, "%s/%s", cmp_json_str(cell, "pass"), mode);
    return buf;
}

json_int_t cmp_json_int(const json_t *o, const char *k)
{
    return json_integer_value(json_object_get(o, k));
}

/* A real field, with nulls resolved through the object's "nonfinite" map. */
static double jreal(const json_t *o, const char *k)
{
    const json_t *v = json_object_get(o, k);
    if (json_is_number(v))
        return json_number_value(v);
    const char *nf = json_string_value(json_object_get(json_object_get(o, "nonfinite"), k));
    if (nf != NULL && strcmp(nf, "inf") == 0)
        return INFINITY;
    if (nf != NULL && strcmp(nf, "-inf") == 0)
        return -INFINITY;
    return NAN;
}

static void num(char *out, size_t n, double v)
{
    if (isnan(v))
        snprintf(out, n, "n/a");
    else if (isinf(v))
        snprintf(out, n, v > 0 ? "inf" : "-inf");
    else
        snprintf(out, n, "%.3g", v);
}

static void dur(char *out, size_t n, double ns)
{
    if (isnan(ns))
        snprintf(out, n, "n/a");
    else if (ns >= 1e9)
        snprintf(out, n, "%.3g s", ns / 1e9);
    else if (ns >= 1e6)
        snprintf(out, n, "%.3g ms", ns / 1e6);
    else if (ns >= 1e3)
        snprintf(out, n, "%.3g us", ns / 1e3);
    else
        snprintf(out, n, "%.0f ns", ns);
}

/* Markdown table cells: a pipe ends the cell even inside code, a backtick ends code. */
static void md_cell(struct cmp_report *b, const char *s)
{
    for (; *s; s++) {
        if (*s == '|')
            cmp_report_addf(b, "\\|");
        else if (*s == '`')
            cmp_report_addf(b, "'");
        else if (*s == '\n' || *s == '\r')
            cmp_report_addf(b, " ");
        else
            cmp_report_addf(b, "%c", *s);
    }
}

static bool valid_result(const json_t *r)
{
    return json_is_object(r) && json_is_string(json_object_get(r, "verdict")) &&
           json_is_array(json_object_get(r, "cells")) &&
           json_is_object(json_object_get(r, "counts"));
}

/* thresholds.perf_gate, true when absent (a result from before the option) */
static bool perf_gates(const json_t *result)
{
    return !json_is_false(json_object_get(json_object_get(result, "thresholds"), "perf_gate"));
}

/* "3 identical, 1 diverged, ..." (zero counts left out, except cells) */
static void counts_line(struct cmp_report *b, const json_t *counts)
{
    static const char *const names[] = {"identical",        "within_tolerance", "diverged",
                                        "nondeterministic", "incomparable",     "not_run",
                                        "missing_cells",    "extra_cells"};
    cmp_report_addf(b, "%lld cells compared", (long long)cmp_json_int(counts, "cells"));
    for (size_t i = 0; i < sizeof(names) / sizeof(names[0]); i++) {
        int64_t v = cmp_json_int(counts, names[i]);
        if (v > 0)
            cmp_report_addf(b, ", %lld %s", (long long)v, names[i]);
    }
}

/*
 * A statistics-only row has no element error; its size is bounded from the
 * statistics (derived.c). Said as bounds, with where they come from and how
 * to get measured numbers: ", max rel >= 2.1e-04, l2 rel >= 1.3e-04
 * (derived from stats; capture sample for elementwise)".
 */
static void derived_desc(struct cmp_report *b, const json_t *d)
{
    const json_t *dv = json_object_get(d, "derived");
    char v1[32], v2[32];
    if (!json_is_object(dv))
        return;
    num(v1, sizeof(v1), jreal(dv, "max_rel_lower"));
    num(v2, sizeof(v2), jreal(dv, "rel_l2_lower"));
    cmp_report_addf(
        b, ", max rel >= %s, l2 rel >= %s (derived from %s; capture sample for elementwise)", v1,
        v2, cmp_json_str(d, "derived_from"));
}

int cmp_reference_judgement(const json_t *site, char *out, size_t n)
{
    const json_t *x = json_object_get(site, "reference");
    char eh[32], ec[32], k[32], tol[32];
    if (!json_is_object(x))
        return -ENOENT;
    if (!json_is_true(json_object_get(x, "judged"))) {
        snprintf(out, n, "tolerance rule: reference %s", cmp_json_str(x, "reason"));
        return 0;
    }
    num(eh, sizeof eh, jreal(x, "err_head"));
    num(ec, sizeof ec, jreal(x, "err_control"));
    num(k, sizeof k, jreal(x, "k"));
    num(tol, sizeof tol, jreal(x, "tol"));
    snprintf(out, n, "%s: err %s %s %s x %s + %s", cmp_json_str(x, "rule"), eh,
             json_is_true(json_object_get(x, "passed")) ? "<=" : ">", k, ec, tol);
    return 0;
}

/* The reference arbiter's word on a record, after a comma. */
static void reference_desc(struct cmp_report *b, const json_t *d)
{
    char t[256];
    if (cmp_reference_judgement(d, t, sizeof t) == 0)
        cmp_report_addf(b, ", %s", t);
}

/* Which rule decided a cell, when the arbiter was asked: " (rule
 * reference_float64)". */
static void rule_note(struct cmp_report *b, const json_t *cell)
{
    if (json_is_object(json_object_get(cell, "reference")))
        cmp_report_addf(b, " (rule %s)", cmp_json_str(cell, "rule"));
}

/* "fc1.0.forward.output.0 (seq 3, tolerance, max rel 0.012)" */
static void divergence_desc(struct cmp_report *b, const json_t *d, bool md)
{
    char v[32];
    if (!json_is_object(d)) {
        cmp_report_addf(b, md ? "-" : "none");
        return;
    }
    if (md) {
        cmp_report_addf(b, "`");
        md_cell(b, cmp_json_str(d, "key"));
        cmp_report_addf(b, "`");
    } else {
        cmp_report_addf(b, "%s", cmp_json_str(d, "key"));
    }
    cmp_report_addf(b, " (seq %lld", (long long)cmp_json_int(d, "seq"));
    if (json_object_get(d, "reason"))
        cmp_report_addf(b, ", %s", cmp_json_str(d, "reason"));
    if (json_object_get(d, "max_rel")) {
        num(v, sizeof(v), jreal(d, "max_rel"));
        cmp_report_addf(b, ", max rel %s", v);
    }
    if (json_object_get(d, "allclose_violations"))
        cmp_report_addf(b, ", %lld/%lld off", (long long)cmp_json_int(d, "allclose_violations"),
                        (long long)cmp_json_int(d, "n"));
    derived_desc(b, d);
    reference_desc(b, d);
    if (json_object_get(d, "basis") && strcmp(cmp_json_str(d, "basis"), "full") != 0)
        cmp_report_addf(b, ", %s basis", cmp_json_str(d, "basis"));
    cmp_report_addf(b, ")");
}

/* "; error amplified 40x here: ...": the first divergence's growth (render_ops.c). */
static void growth_note(struct cmp_report *b, const json_t *cell)
{
    char *s = cmp__growth_note(cell);
    if (s != NULL)
        cmp_report_addf(b, "; %s", s);
    free(s);
}

/* The introduced-at column, or "same" when it is the first divergence itself. */
static void introduced_desc(struct cmp_report *b, const json_t *cell, bool md)
{
    const json_t *d = json_object_get(cell, "first_divergence");
    const json_t *i = json_object_get(cell, "first_introduced");
    if (json_is_object(d) && json_is_object(i) &&
        strcmp(cmp_json_str(d, "key"), cmp_json_str(i, "key")) == 0) {
        cmp_report_addf(b, "same");
        return;
    }
    divergence_desc(b, i, md);
}

/* Why a pair on two devices was not compared: " (device mismatch: cpu vs
 * NVIDIA H200)". Nothing for any other cell. */
static void device_note(struct cmp_report *b, const json_t *cell, bool md)
{
    if (strcmp(cmp_json_str(cell, "incomparable_reason"), "device_mismatch") != 0)
        return;
    cmp_report_addf(b, " (device mismatch: ");
    if (md)
        md_cell(b, cmp_json_str(cell, "control_device"));
    else
        cmp_report_addf(b, "%s", cmp_json_str(cell, "control_device"));
    cmp_report_addf(b, " vs ");
    if (md)
        md_cell(b, cmp_json_str(cell, "head_device"));
    else
        cmp_report_addf(b, "%s", cmp_json_str(cell, "head_device"));
    cmp_report_addf(b, ")");
}

static bool same_not_run(const json_t *a, const json_t *b)
{
    static const char *const k[] = {"width", "not_run_reason", "control_host_missing",
                                    "head_host_missing"};
    for (size_t i = 0; i < sizeof k / sizeof k[0]; i++)
        if (strcmp(cmp_json_str(a, k[i]), cmp_json_str(b, k[i])) != 0)
            return false;
    return true;
}

/*
 * "Not run on this host" lines: one per width and reason, with the cell
 * count. A head whose host lost a width the control ran is a warning (the
 * coverage is gone), never a regression.
 */
static void not_run_lines(struct cmp_report *b, const json_t *cells, bool md)
{
    size_t i, j;
    const json_t *cell, *other;
    json_array_foreach(cells, i, cell)
    {
        if (strcmp(cmp_json_str(cell, "status"), "not_run") != 0)
            continue;
        bool seen = false;
        long n = 0;
        json_array_foreach(cells, j, other)
        {
            bool match =
                strcmp(cmp_json_str(other, "status"), "not_run") == 0 && same_not_run(cell, other);
            seen |= match && j < i;
            n += match;
        }
        if (seen)
            continue;
        const char *why = cmp_json_str(cell, "not_run_reason");
        bool lost = strcmp(why, "head_host") == 0 &&
                    cell_state_is(cmp_json_str(cell, "control_outcome"), CELL_OK);
        const char *missing = cmp_json_str(
            cell, strcmp(why, "control_host") == 0 ? "control_host_missing" : "head_host_missing");
        cmp_report_addf(
            b, md ? "%s width `%s` (%ld cells): %s %s%s\n" : "%s width %s (%ld cells): %s %s%s\n",
            lost ? (md ? "- **Warning: coverage lost:**" : "WARNING coverage lost:")
                 : (md ? "- Not run on this host:" : "NOT RUN on this host:"),
            cmp_json_str(cell, "width"), n,
            strcmp(why, "both_hosts") == 0  ? "both sides' hosts lack"
            : strcmp(why, "head_host") == 0 ? "the head's host lacks"
                                            : "the control's host lacks",
            missing, lost ? " (the control ran them)" : "");
    }
}

/* Perf rows worth a line: changes, and what could not be decided. */
static bool is_perf_change(const json_t *cell)
{
    const char *v = cmp_json_str(json_object_get(cell, "perf"), "verdict");
    return strcmp(v, "regression") == 0 || strcmp(v, "improvement") == 0 ||
           strcmp(v, "unknown") == 0 || strcmp(v, "unstable") == 0;
}

/* "5 pairs" or "5/5 processes", and "detects >= 4.1%" (or "n/a"). */
/* "4 pairs, own time": the evidence and the clock it is of (perf.basis). */
static void perf_evidence(char *ev, size_t evn, char *mde, size_t mden, const json_t *p)
{
    const char *basis = cmp_json_str(p, "basis");
    const char *clock = strcmp(basis, "device_time") == 0 ? ", device time"
                        : strcmp(basis, "own_time") == 0  ? ", own time"
                        : strcmp(basis, "wall_time") == 0 ? ", wall time"
                        : strcmp(basis, "cpu_time") == 0  ? ", CPU time"
                                                          : "";
    if (strcmp(cmp_json_str(p, "design"), "paired") == 0)
        snprintf(ev, evn, "%lld pairs%s",
                 (long long)json_integer_value(json_object_get(p, "pairs")), clock);
    else
        snprintf(ev, evn, "%lld/%lld processes%s",
                 (long long)json_integer_value(json_object_get(p, "n_control")),
                 (long long)json_integer_value(json_object_get(p, "n_head")), clock);
    double m = jreal(p, "mde");
    if (isfinite(m))
        snprintf(mde, mden, "%.1f%%", 100 * m);
    else
        snprintf(mde, mden, "n/a");
}

/* A compiled cell's compile time beside its steady state, never judged:
 * "; compile 12.3 s -> 13.1 s (ratio 1.07)". */
static void compile_desc(struct cmp_report *b, const json_t *p)
{
    const json_t *cc = json_object_get(p, "control_compile_ns"),
                 *hc = json_object_get(p, "head_compile_ns");
    if (!json_is_integer(cc) && !json_is_integer(hc))
        return;
    char c[32] = "n/a", h[32] = "n/a", r[32] = "n/a";
    if (json_is_integer(cc))
        dur(c, sizeof c, (double)json_integer_value(cc));
    if (json_is_integer(hc))
        dur(h, sizeof h, (double)json_integer_value(hc));
    if (json_is_number(json_object_get(p, "compile_ratio")))
        num(r, sizeof r, jreal(p, "compile_ratio"));
    cmp_report_addf(b, "; compile %s -> %s (ratio %s)", c, h, r);
}

static void perf_desc(struct cmp_report *b, const json_t *p, bool md)
{
    char c[32], h[32], r[32], lo[32], hi[32], pv[32], ev[64], mde[32];
    const json_t *ci = json_object_get(p, "ci99");
    dur(c, sizeof(c), jreal(p, "control_median_ns"));
    dur(h, sizeof(h), jreal(p, "head_median_ns"));
    num(r, sizeof(r), jreal(p, "ratio"));
    num(lo, sizeof(lo), json_number_value(json_array_get(ci, 0)));
    num(hi, sizeof(hi), json_number_value(json_array_get(ci, 1)));
    num(pv, sizeof(pv), jreal(p, "p_value"));
    if (!json_is_array(ci)) {
        snprintf(lo, sizeof(lo), "n/a");
        snprintf(hi, sizeof(hi), "n/a");
    }
    perf_evidence(ev, sizeof ev, mde, sizeof mde, p);
    if (md)
        cmp_report_addf(b, "%s | %s | %s | %s-%s | %s | %s | %s | %s", c, h, r, lo, hi, ev, mde, pv,
                        cmp_json_str(p, "verdict"));
    else
        cmp_report_addf(b, "%s -> %s (ratio %s, 99%% CI %s-%s, %s, detects >= %s, p %s)", c, h, r,
                        lo, hi, ev, mde, pv);
    const char *why = cmp_json_str(p, "reason");
    if (!md && why[0])
        cmp_report_addf(b, ": %s", why);
    compile_desc(b, p);
}

/*
 * A block another file renders, appended and released (NULL: none):
 * "what else differs" right under the verdict (envdiff.c), the first
 * divergent op's kernel and non-finite origins (render_ops.c), and which
 * modules and ops explain each perf change (profile.c).
 */
static void block(struct cmp_report *b, char *s)
{
    if (s != NULL)
        cmp_report_addf(b, "%s", s);
    free(s);
}

/* ---------------------------------------------------------------- markdown */

/* The verdict and what frames it: perf gating, the cross-width pair, the
 * counts, what else differs and the widths not run on a host. */
static void md_summary(struct cmp_report *b, const json_t *result)
{
    const json_t *counts = json_object_get(result, "counts");
    bool reg = strcmp(cmp_json_str(result, "verdict"), "regression") == 0;
    cmp_report_addf(b, "## capd comparison: %s\n\n", reg ? "**regression**" : "pass");
    if (!perf_gates(result))
        cmp_report_addf(
            b, "Perf is reported but does not decide the verdict (`perf_gate` false).\n\n");
    if (strcmp(cmp_json_str(result, "mode"), "cross_width") == 0)
        cmp_report_addf(b, "Cross-width: head width `%s` against control width `%s`.\n\n",
                        cmp_json_str(result, "head_width"), cmp_json_str(result, "control_width"));
    counts_line(b, counts);
    cmp_report_addf(b, ".\n");
    block(b, cmp__env_block(json_object_get(result, "environment"), true));
    if (cmp_json_int(counts, "not_run") > 0) {
        cmp_report_addf(b, "\n");
        not_run_lines(b, json_object_get(result, "cells"), true);
    }
}

/* Cells whose outcome got worse (a crash is the loudest finding), then
 * the cells the head lacks; each section only when it has a line. */
static void md_outcomes(struct cmp_report *b, const json_t *result)
{
    char pm[48]; /* a pass and its mode (cmp_json_pass) */
    const json_t *cell;
    size_t i;
    bool any = false;
    json_array_foreach(json_object_get(result, "cells"), i, cell)
    {
        if (strcmp(cmp_json_str(cell, "outcome_change"), "regression") != 0)
            continue;
        if (!any)
            cmp_report_addf(b, "\n### Outcome regressions\n\n");
        any = true;
        cmp_report_addf(b, "- `");
        md_cell(b, cmp_json_str(cell, "model"));
        cmp_report_addf(b, "` / %s / %s: %s -> **%s**\n", cmp_json_str(cell, "width"),
                        cmp_json_pass(cell, pm, sizeof pm), cmp_json_str(cell, "control_outcome"),
                        cmp_json_str(cell, "head_outcome"));
    }

    const json_t *miss = json_object_get(result, "missing_cells");
    if (json_array_size(miss) > 0) {
        cmp_report_addf(b, "\n### Missing in head\n\n");
        json_array_foreach(miss, i, cell)
        {
            cmp_report_addf(b, "- `");
            md_cell(b, cmp_json_str(cell, "model"));
            cmp_report_addf(b, "` / %s / %s\n", cmp_json_str(cell, "width"),
                            cmp_json_pass(cell, pm, sizeof pm));
        }
    }
}

/* The first columns of a cell's row in a table: model, width and pass. */
static void md_row_start(struct cmp_report *b, const json_t *cell)
{
    char pm[48]; /* a pass and its mode (cmp_json_pass) */
    cmp_report_addf(b, "| ");
    md_cell(b, cmp_json_str(cell, "model"));
    cmp_report_addf(b, " | %s | %s", cmp_json_str(cell, "width"),
                    cmp_json_pass(cell, pm, sizeof pm));
}

/* The table of cells whose numbers differ (all but identical and not
 * run), with where they first diverge and where that was introduced. */
static void md_differences(struct cmp_report *b, const json_t *cells)
{
    const json_t *cell;
    size_t i;
    bool any = false;
    json_array_foreach(cells, i, cell)
    {
        if (strcmp(cmp_json_str(cell, "status"), "identical") == 0 ||
            strcmp(cmp_json_str(cell, "status"), "not_run") == 0)
            continue;
        if (!any) {
            cmp_report_addf(b, "\n### Cells that differ\n\n"
                               "| model | width | pass | status | outcome | first divergence "
                               "| first introduced |\n|---|---|---|---|---|---|---|\n");
        }
        any = true;
        md_row_start(b, cell);
        cmp_report_addf(b, " | %s", cmp_json_str(cell, "status"));
        rule_note(b, cell);
        device_note(b, cell, true);
        if (json_is_true(json_object_get(cell, "params_differed")))
            cmp_report_addf(b, " (initial params differ)");
        cmp_report_addf(b, " | %s", cmp_json_str(cell, "control_outcome"));
        if (strcmp(cmp_json_str(cell, "outcome_change"), "none") != 0)
            cmp_report_addf(b, " -> %s", cmp_json_str(cell, "head_outcome"));
        cmp_report_addf(b, " | ");
        divergence_desc(b, json_object_get(cell, "first_divergence"), true);
        growth_note(b, cell);
        cmp_report_addf(b, " | ");
        introduced_desc(b, cell, true);
        cmp_report_addf(b, " |\n");
    }
}

/* The table of performance changes, and of what could not be decided. */
static void md_perf(struct cmp_report *b, const json_t *cells)
{
    const json_t *cell;
    size_t i;
    bool any = false;
    json_array_foreach(cells, i, cell)
    {
        if (!is_perf_change(cell))
            continue;
        if (!any)
            cmp_report_addf(b,
                            "\n### Performance changes\n\n| model | width | pass | control median "
                            "| head median | ratio | 99%% CI | evidence | detects | p | verdict |\n"
                            "|---|---|---|---|---|---|---|---|---|---|---|\n");
        any = true;
        md_row_start(b, cell);
        cmp_report_addf(b, " | ");
        perf_desc(b, json_object_get(cell, "perf"), true);
        cmp_report_addf(b, " |\n");
    }
}

/* The sections in the order a reviewer reads them (see the top of the
 * file); the first divergent op's details follow the table of cells. */
char *cmp_result_to_markdown(const json_t *result)
{
    struct cmp_report b;
    if (!valid_result(result))
        return NULL;
    cmp_report_init(&b, TRUNC_NOTE);
    const json_t *cells = json_object_get(result, "cells");
    md_summary(&b, result);
    md_outcomes(&b, result);
    md_differences(&b, cells);
    block(&b, cmp__ops_block(result, true));
    md_perf(&b, cells);
    block(&b, cmp__profile_block(result, true));
    return cmp_report_finish(&b);
}

/* ------------------------------------------------------------------- text */

char *cmp_result_to_text(const json_t *result)
{
    char pm[48]; /* a pass and its mode (cmp_json_pass) */
    struct cmp_report b;
    const json_t *cells, *cell;
    size_t i;

    if (!valid_result(result))
        return NULL;
    cmp_report_init(&b, TRUNC_NOTE);
    cells = json_object_get(result, "cells");
    bool reg = strcmp(cmp_json_str(result, "verdict"), "regression") == 0;
    cmp_report_addf(&b, "capd comparison: %s%s\n", reg ? "REGRESSION" : "pass",
                    perf_gates(result) ? "" : " (perf not gating)");
    if (strcmp(cmp_json_str(result, "mode"), "cross_width") == 0)
        cmp_report_addf(&b, "cross-width: head %s vs control %s\n",
                        cmp_json_str(result, "head_width"), cmp_json_str(result, "control_width"));
    counts_line(&b, json_object_get(result, "counts"));
    cmp_report_addf(&b, "\n");
    block(&b, cmp__env_block(json_object_get(result, "environment"), false));
    not_run_lines(&b, cells, false);

    json_array_foreach(cells, i, cell)
    {
        if (strcmp(cmp_json_str(cell, "outcome_change"), "regression") == 0)
            cmp_report_addf(
                &b, "OUTCOME REGRESSION %s/%s/%s: %s -> %s\n", cmp_json_str(cell, "model"),
                cmp_json_str(cell, "width"), cmp_json_pass(cell, pm, sizeof pm),
                cmp_json_str(cell, "control_outcome"), cmp_json_str(cell, "head_outcome"));
    }
    json_array_foreach(json_object_get(result, "missing_cells"), i, cell)
        cmp_report_addf(&b, "MISSING %s/%s/%s\n", cmp_json_str(cell, "model"),
                        cmp_json_str(cell, "width"), cmp_json_pass(cell, pm, sizeof pm));
    json_array_foreach(cells, i, cell)
    {
        const char *st = cmp_json_str(cell, "status");
        if (strcmp(st, "identical") == 0 || strcmp(st, "not_run") == 0)
            continue;
        cmp_report_addf(&b, "%s %s/%s/%s", st, cmp_json_str(cell, "model"),
                        cmp_json_str(cell, "width"), cmp_json_pass(cell, pm, sizeof pm));
        rule_note(&b, cell);
        device_note(&b, cell, false);
        if (json_is_object(json_object_get(cell, "first_divergence"))) {
            cmp_report_addf(&b, ": first divergence ");
            divergence_desc(&b, json_object_get(cell, "first_divergence"), false);
            growth_note(&b, cell);
            cmp_report_addf(&b, "; introduced at ");
            introduced_desc(&b, cell, false);
        }
        if (json_is_true(json_object_get(cell, "params_differed")))
            cmp_report_addf(&b, "; initial params differ");
        cmp_report_addf(&b, "\n");
    }
    block(&b, cmp__ops_block(result, false));
    json_array_foreach(cells, i, cell)
    {
        if (!is_perf_change(cell))
            continue;
        const json_t *p = json_object_get(cell, "perf");
        const char *v = cmp_json_str(p, "verdict");
        cmp_report_addf(&b, "PERF %s %s/%s/%s: ", strcmp(v, "regression") == 0 ? "REGRESSION" : v,
                        cmp_json_str(cell, "model"), cmp_json_str(cell, "width"),
                        cmp_json_pass(cell, pm, sizeof pm));
        perf_desc(&b, p, false);
        cmp_report_addf(&b, "\n");
    }
    block(&b, cmp__profile_block(result, false));
    return cmp_report_finish(&b);
}
