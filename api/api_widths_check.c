/*
 * api/api_widths_check.c - GET /v1/jobs/{id}/widths, the width self-check
 * (docs/widths.md, "Width self-check"): every width of one finished job
 * against the same job's `default` cells, the scalar path, through the
 * engine's cross-width comparison (docs/compare.md).
 *
 * A first build from a polluted tree has no known-good control to compare
 * with. Its own scalar cells are the next best thing: with the job's
 * float64 reference records the arbiter judges each width by its error
 * against float64 (not by bit equality), so a width that only rounds
 * differently passes, and a width whose kernel computes something else is
 * named with the first layer (and op, at granularity op) where it left the
 * scalar path. Without those records the tolerance rule judges, and the
 * result says so.
 *
 * The job's cells are loaded once and compared width by width in the width
 * table's order; each engine result is condensed into a verdict, counts,
 * the first divergence and one line per model and pass.
 */
#include <errno.h>
#include <stdio.h>
#include <string.h>

#include "api/api_int.h"
#include "compare/cmp.h"
#include "daemon/cpu/widths.h"
#include "util/cellstate.h"

#define BASELINE "default"

/* The self-check's cell statuses, in the order counts lists them: the
 * engine's, with an incomparable cell that either side's build could not
 * run at its width (outcome unsupported) counted apart, and a default cell
 * with no cell at the width "missing". */
static const char *const statuses[] = {"identical", "within_tolerance", "nondeterministic",
                                       "diverged",  "incomparable",     "unsupported",
                                       "not_run",   "missing"};
#define NSTATUS     (sizeof statuses / sizeof statuses[0])
#define NCOMPARED   4 /* the first four: the cells whose records were judged */
#define ST_DIVERGED 3

static void copy_member(json_t *dst, json_t *src, const char *key, bool always)
{
    json_t *v = json_object_get(src, key);
    if (v)
        json_object_set(dst, key, v);
    else if (always)
        json_object_set_new(dst, key, json_null());
}

/* Where a record row of the engine's (first_divergence, first_introduced)
 * points: key, layer (module), op at granularity op, why it diverged and
 * the rule that decided it, with the arbiter's numbers and the op's kernel
 * when the engine gave them; json null for no row. */
static json_t *site(json_t *row)
{
    if (!json_is_object(row))
        return json_null();
    json_t *o = json_object();
    copy_member(o, row, "key", true);
    copy_member(o, row, "module", true);
    copy_member(o, row, "op", false);
    copy_member(o, row, "reason", true);
    json_t *rule = json_object_get(row, "rule");
    json_object_set_new(o, "rule",
                        json_is_string(rule) ? json_incref(rule) : json_string("tolerance"));
    copy_member(o, row, "max_rel", false);
    copy_member(o, row, "reference", false);
    copy_member(o, row, "kernel", false);
    return o;
}

static bool str_is(json_t *o, const char *key, const char *want)
{
    const char *v = json_string_value(json_object_get(o, key));
    return v && strcmp(v, want) == 0;
}

/* Whether the engine cell's KEY ("head_outcome") names the cell state ST. */
static bool outcome_is(json_t *cell, const char *key, enum cell_state st)
{
    return cell_state_is(json_string_value(json_object_get(cell, key)), st);
}

/* The engine cell's status as the self-check counts it. */
static const char *cell_status(json_t *cell)
{
    if (str_is(cell, "status", "incomparable") &&
        (outcome_is(cell, "head_outcome", CELL_UNSUPPORTED) ||
         outcome_is(cell, "control_outcome", CELL_UNSUPPORTED)))
        return "unsupported";
    const char *st = json_string_value(json_object_get(cell, "status"));
    return st ? st : "incomparable";
}

static json_t *cell_summary(json_t *cell)
{
    json_t *why = json_object_get(cell, "incomparable_reason");
    if (!json_is_string(why))
        why = json_object_get(cell, "not_run_reason");
    json_t *o = json_pack("{s:O,s:O,s:O,s:s}", "model", json_object_get(cell, "model"), "pass",
                          json_object_get(cell, "pass"), "mode", json_object_get(cell, "mode"),
                          "status", cell_status(cell));
    if (!o)
        return NULL;
    copy_member(o, cell, "rule", true);
    json_object_set_new(o, "status_reason", json_is_string(why) ? json_incref(why) : json_null());
    copy_member(o, cell, "control_outcome", true);
    copy_member(o, cell, "head_outcome", true);
    copy_member(o, cell, "outcome_change", true);
    json_object_set_new(o, "first_divergence", site(json_object_get(cell, "first_divergence")));
    json_object_set_new(o, "first_introduced", site(json_object_get(cell, "first_introduced")));
    return o;
}

/* The cell of MODEL, PASS and MODE in the array CELLS, or NULL. */
static json_t *find_cell(json_t *cells, json_t *model, json_t *pass, json_t *mode)
{
    size_t i;
    json_t *c;
    json_array_foreach(cells, i, c)
    {
        if (json_equal(json_object_get(c, "model"), model) &&
            json_equal(json_object_get(c, "pass"), pass) &&
            json_equal(json_object_get(c, "mode"), mode))
            return c;
    }
    return NULL;
}

/* What one width's cells add up to. FIRST is the cell whose first
 * divergence the width reports: the first diverged cell, else the first
 * that failed where default ran ok (borrowed from CELLS). */
struct tally {
    json_t *cells;
    json_int_t n[NSTATUS], outcome_regressions;
    json_t *first, *first_failed;
};

static void tally_add(struct tally *t, json_t *cs)
{
    const char *st = json_string_value(json_object_get(cs, "status"));
    for (size_t k = 0; k < NSTATUS; k++)
        if (strcmp(st, statuses[k]) == 0)
            t->n[k]++;
    if (str_is(cs, "outcome_change", "regression")) {
        t->outcome_regressions++;
        if (!t->first_failed)
            t->first_failed = cs;
    }
    if (!t->first && strcmp(st, statuses[ST_DIVERGED]) == 0)
        t->first = cs;
    json_array_append_new(t->cells, cs);
}

/* The summary of the engine's cell of M, P and X in RES, or of one
 * missing there; NULL (*LEFT true) when the filter left it out. */
static json_t *summary_of(json_t *res, json_t *m, json_t *p, json_t *x, bool *left)
{
    json_t *c = find_cell(json_object_get(res, "cells"), m, p, x);
    *left = false;
    if (c)
        return cell_summary(c);
    if (find_cell(json_object_get(res, "missing_cells"), m, p, x))
        return json_pack("{s:O,s:O,s:O,s:s,s:n,s:n,s:n}", "model", m, "pass", p, "mode", x,
                         "status", "missing", "rule", "first_divergence", "first_introduced");
    *left = true;
    return NULL;
}

/* The engine's cells of RES in the job's matrix order (models, then
 * passes, as submitted: forward before backward, then modes; eager in a
 * job stored without modes), filtered ones left out. */
static int collect_cells(json_t *res, json_t *job, struct tally *t)
{
    json_t *matrix = json_object_get(job, "matrix"), *eager = json_pack("[s]", "eager");
    json_t *modes =
        json_is_array(json_object_get(matrix, "modes")) ? json_object_get(matrix, "modes") : eager;
    size_t i, k, l;
    json_t *m, *p, *x;
    int rc = eager ? 0 : -ENOMEM;
    json_array_foreach(json_object_get(matrix, "models"), i, m)
    {
        json_array_foreach(json_object_get(matrix, "passes"), k, p)
        {
            json_array_foreach(modes, l, x)
            {
                bool left;
                json_t *cs = rc ? NULL : summary_of(res, m, p, x, &left);
                if (!rc && !cs && !left)
                    rc = -ENOMEM;
                if (cs)
                    tally_add(t, cs);
            }
        }
    }
    json_decref(eager);
    return rc;
}

static json_t *counts_json(const struct tally *t)
{
    json_int_t total = 0, compared = 0;
    for (size_t k = 0; k < NSTATUS; k++) {
        total += t->n[k];
        compared += k < NCOMPARED ? t->n[k] : 0;
    }
    json_t *c = json_pack("{s:I,s:I}", "cells", total, "compared", compared);
    for (size_t k = 0; c && k < NSTATUS; k++)
        json_object_set_new(c, statuses[k], json_integer(t->n[k]));
    if (c)
        json_object_set_new(c, "outcome_regressions", json_integer(t->outcome_regressions));
    return c;
}

/* pass: every cell compared and none diverged; diverged: a cell's records
 * left the scalar path, or its cell failed where default's ran ok;
 * incomplete: neither, but some cell could not be judged. */
static const char *width_verdict(const struct tally *t)
{
    json_int_t judged = 0;
    if (t->n[ST_DIVERGED] > 0 || t->outcome_regressions > 0)
        return "diverged";
    for (size_t k = 0; k < NCOMPARED; k++)
        judged += t->n[k];
    for (size_t k = NCOMPARED; k < NSTATUS; k++)
        if (t->n[k] > 0)
            return "incomplete";
    return judged > 0 ? "pass" : "incomplete";
}

/* The first divergence of the width: FIRST's, with its model and pass. */
static json_t *width_first(const struct tally *t, const char *member)
{
    json_t *cs = t->first ? t->first : t->first_failed;
    json_t *fd = json_object_get(cs, member);
    if (!json_is_object(fd))
        return json_null();
    json_t *o = json_pack("{s:O,s:O}", "model", json_object_get(cs, "model"), "pass",
                          json_object_get(cs, "pass"));
    if (o)
        json_object_update(o, fd);
    return o;
}

/* One width's entry of the result, from the engine's result RES. */
static json_t *width_summary(const char *width, json_t *res, json_t *job)
{
    struct tally t = {.cells = json_array()};
    if (!t.cells || collect_cells(res, job, &t) != 0) {
        json_decref(t.cells);
        return NULL;
    }
    return json_pack("{s:s,s:s,s:o,s:o,s:o,s:o}", "width", width, "verdict", width_verdict(&t),
                     "counts", counts_json(&t), "first_divergence",
                     width_first(&t, "first_divergence"), "first_introduced",
                     width_first(&t, "first_introduced"), "cells", t.cells);
}

/* Whether the job's matrix names width W. */
static bool job_has_width(json_t *job, const char *w)
{
    return api_in_list(json_object_get(json_object_get(job, "matrix"), "widths"), w);
}

/* Each width of the job but the baseline, in the width table's order,
 * compared with the baseline under O, into the array *OUT. */
static int check_widths(const struct api_cmp_input *in, json_t *job, struct cmp_options *o,
                        json_t **out)
{
    size_t i;
    json_t *row;
    int rc = 0;
    *out = json_array();
    if (!*out)
        return -ENOMEM;
    json_array_foreach(json_object_get(widths_table(), "widths"), i, row)
    {
        const char *w = json_string_value(json_object_get(row, "name"));
        if (!w || strcmp(w, BASELINE) == 0 || !job_has_width(job, w))
            continue;
        json_t *res = NULL, *ws = NULL;
        snprintf(o->head_width, sizeof o->head_width, "%s", w);
        if ((rc = api_cmp_run(in, job, o, &res)) == 0 && !(ws = width_summary(w, res, job)))
            rc = -ENOMEM;
        json_decref(res);
        if (rc)
            break;
        json_array_append_new(*out, ws);
    }
    return rc;
}

/* The worst verdict of the widths: diverged, else incomplete, else pass. */
static const char *overall_verdict(json_t *widths)
{
    const char *v = "pass";
    size_t i;
    json_t *w;
    json_array_foreach(widths, i, w)
    {
        if (str_is(w, "verdict", "diverged"))
            return "diverged";
        if (str_is(w, "verdict", "incomplete"))
            v = "incomplete";
    }
    return v;
}

static json_t *result_json(json_t *job, bool f64, json_t *widths)
{
    char note[512] = "";
    if (!f64)
        snprintf(note, sizeof note,
                 "job %s was not submitted with \"reference\": \"float64\", so its cells have "
                 "no float64 reference records: the tolerance rule judges each width against "
                 "default, and a width that only rounds differently may show as diverged. "
                 "Submit the job with \"reference\": \"float64\" (and capture sample or full) "
                 "for the float64 arbiter.",
                 json_string_value(json_object_get(job, "id")));
    return json_pack(
        "{s:O,s:O,s:O,s:O,s:s,s:o,s:o,s:s,s:o}", "job", json_object_get(job, "id"), "commit",
        json_object_get(job, "commit"), "branch", json_object_get(job, "branch"), "build",
        json_object_get(job, "build"), "baseline_width", BASELINE, "reference",
        f64 ? json_string("float64") : json_null(), "note", f64 ? json_null() : json_string(note),
        "verdict", overall_verdict(widths), "widths", widths);
}

/* A job without a default cell has nothing to check against, and one with
 * no other width nothing to check: 409, naming what the matrix lacks. */
static bool baseline_refused(struct api_req *r, json_t *job, enum MHD_Result *ret)
{
    const char *id = json_string_value(json_object_get(job, "id"));
    json_t *widths = json_object_get(json_object_get(job, "matrix"), "widths");
    if (!job_has_width(job, BASELINE)) {
        *ret = api_error(r, 409, "no_baseline", "id",
                         "job %s has no cell at width default, the scalar baseline each width "
                         "is checked against: submit a job whose matrix.widths include "
                         "\"default\" as well as the widths to check",
                         id);
        return true;
    }
    if (json_array_size(widths) < 2) {
        *ret = api_error(r, 409, "no_widths", "id",
                         "job %s has no width but default: there is no width to check against "
                         "it (add avx2, avx512, ... to matrix.widths)",
                         id);
        return true;
    }
    return false;
}

/* The checks of a finished job, in the format asked for. */
static enum MHD_Result check(struct api_req *r, struct store *s, json_t *job)
{
    struct api_cmp_input in = {0};
    struct cmp_options o;
    enum api_format fmt;
    enum MHD_Result ret;
    json_t *widths = NULL, *out;
    struct store_cell_filter f = {api_query(r, "model"), NULL, api_query(r, "pass")};
    const struct api_filter af[] = {{"model", "model", f.model}, {"pass", "pass", f.pass}};
    if (api_format_refused(r, &fmt, &ret) || baseline_refused(r, job, &ret))
        return ret;
    if (api_not_modified_compare(r, job, job, NULL, &ret) ||
        api_filters_refused(r, s, job, job, af, sizeof af / sizeof af[0], &ret))
        return ret;
    cmp_options_init(&o);
    if (api_job_options_refused(r, job, &o, &ret))
        return ret;
    /* The records decide the rule: float64 only where the runner captured
     * them. Timings are not the question (and cost a bootstrap a cell). */
    bool f64 = str_is(json_object_get(job, "options"), "reference", "float64");
    o.reference = f64 ? CMP_REF_FLOAT64 : CMP_REF_NONE;
    o.perf_gate = false;
    o.bootstrap_resamples = 0;
    o.include_tensors = false;
    snprintf(o.control_width, sizeof o.control_width, "%s", BASELINE);
    int rc = api_cmp_load(s, job, job, &f, &in);
    if (!rc)
        rc = check_widths(&in, job, &o, &widths);
    api_cmp_input_free(&in);
    if (rc) {
        json_decref(widths);
        return api_cmp_failed(r, rc);
    }
    out = result_json(job, f64, widths);
    if (fmt == API_FORMAT_JSON)
        return api_json(r, 200, out);
    char *report = api_widths_check_render(out, fmt == API_FORMAT_MD);
    json_decref(out);
    return api_report_reply(r, fmt, report);
}

static enum MHD_Result pending(struct api_req *r, json_t *job)
{
    char msg[160];
    snprintf(msg, sizeof msg, "job %s has not finished; retry when it has",
             json_string_value(json_object_get(job, "id")));
    json_t *b = json_pack("{s:{s:s,s:s,s:n},s:s,s:o}", "error", "code", "pending", "message", msg,
                          "field", "verdict", "pending", "job", api_job_summary(job));
    return api_json(r, 409, b);
}

enum MHD_Result api_jobs_widths(struct api_req *r)
{
    struct store *s = api_store(r);
    json_t *job = NULL;
    enum MHD_Result ret;
    if (api_job_ref_refused(r, s, api_param(r, "id"), "id", &job, &ret))
        return ret;
    ret = api_job_finished(job) ? check(r, s, job) : pending(r, job);
    json_decref(job);
    return ret;
}
