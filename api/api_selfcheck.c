/*
 * api/api_selfcheck.c - the self-checks of one finished job, each value of
 * one axis against the same job's baseline cells, through the engine's
 * cross comparisons (docs/compare.md):
 *
 * - GET /v1/jobs/{id}/widths, the width self-check (docs/widths.md, "Width
 *   self-check"): every width against `default`, the scalar path
 *   (cross-width);
 * - GET /v1/jobs/{id}/modes, the mode self-check (docs/api.md, "Compiled
 *   cells"): every compiled mode against `eager` at the same width
 *   (cross-mode; the compiled cell's coarser records are the ones judged).
 *
 * A first build from a polluted tree has no known-good control to compare
 * with, and a compiled result has no other yardstick than the same model
 * run eagerly. With the job's float64 reference records the arbiter judges
 * each value by its error against float64 (not by bit equality): a width or
 * a compiled mode that only rounds differently passes, one whose error
 * exceeds the baseline's by the arbiter's rule is diverged, named with the
 * first record (layer, and op at granularity op) where it left. Without
 * those records the tolerance rule judges, and the result says so.
 *
 * The job's cells are loaded once and compared value by value (widths in
 * the width table's order, modes in the job's); each engine result is
 * condensed into a verdict, counts, the first divergence and one line per
 * cell.
 */
#include <errno.h>
#include <stdio.h>
#include <string.h>

#include "api/api_int.h"
#include "compare/cmp.h"
#include "daemon/cpu/widths.h"
#include "util/cellstate.h"

/* One axis a self-check walks: its word (a result entry's member, the
 * renderer's), its list in the result and the matrix, its baseline, the
 * cells' other axis within one entry (a width's cells differ by mode, a
 * mode's by width), and its refusals of a job without the baseline or
 * without another value to check (their code, and messages that take the
 * job's id). */
struct axis {
    const char *name, *plural, *baseline, *other, *others;
    const char *no_baseline, *no_values_code, *no_values;
};
static const struct axis WIDTHS = {
    "width",
    "widths",
    "default",
    "mode",
    "modes",
    "job %s has no cell at width default, the scalar baseline each width is checked against: "
    "submit a job whose matrix.widths include \"default\" as well as the widths to check",
    "no_widths",
    "job %s has no width but default: there is no width to check against it (add avx2, avx512, "
    "... to matrix.widths)",
};
static const struct axis MODES = {
    "mode",
    "modes",
    "eager",
    "width",
    "widths",
    "job %s has no eager cell, the baseline each compiled mode is checked against: submit a job "
    "whose matrix.modes include \"eager\" as well as the modes to check",
    "no_modes",
    "job %s has no compiled mode: there is nothing to check against eager (add aot_eager or "
    "inductor to matrix.modes)",
};

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

static json_t *cell_summary(const struct axis *ax, json_t *cell)
{
    json_t *why = json_object_get(cell, "incomparable_reason");
    if (!json_is_string(why))
        why = json_object_get(cell, "not_run_reason");
    json_t *o = json_pack("{s:O,s:O,s:O,s:s}", "model", json_object_get(cell, "model"), "pass",
                          json_object_get(cell, "pass"), ax->other,
                          json_object_get(cell, ax->other), "status", cell_status(cell));
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

/* The cell of MODEL, PASS and X (its value of AX's other axis) in the
 * array CELLS, or NULL. */
static json_t *find_cell(const struct axis *ax, json_t *cells, json_t *model, json_t *pass,
                         json_t *x)
{
    size_t i;
    json_t *c;
    json_array_foreach(cells, i, c)
    {
        if (json_equal(json_object_get(c, "model"), model) &&
            json_equal(json_object_get(c, "pass"), pass) &&
            json_equal(json_object_get(c, ax->other), x))
            return c;
    }
    return NULL;
}

/* What one value's cells add up to. FIRST is the cell whose first
 * divergence the value reports: the first diverged cell, else the first
 * that failed where the baseline ran ok (borrowed from CELLS). */
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
static json_t *summary_of(const struct axis *ax, json_t *res, json_t *m, json_t *p, json_t *x,
                          bool *left)
{
    json_t *c = find_cell(ax, json_object_get(res, "cells"), m, p, x);
    *left = false;
    if (c)
        return cell_summary(ax, c);
    if (find_cell(ax, json_object_get(res, "missing_cells"), m, p, x))
        return json_pack("{s:O,s:O,s:O,s:s,s:n,s:n,s:n}", "model", m, "pass", p, ax->other, x,
                         "status", "missing", "rule", "first_divergence", "first_introduced");
    *left = true;
    return NULL;
}

/* The job's modes as its matrix holds them; ["eager"] (owned) for a job
 * stored without modes. */
static json_t *modes_of(json_t *job)
{
    json_t *m = json_object_get(json_object_get(job, "matrix"), "modes");
    return json_is_array(m) ? json_incref(m) : json_pack("[s]", "eager");
}

/* The values of AX's other axis in the job's matrix (owned). */
static json_t *others_of(const struct axis *ax, json_t *job)
{
    if (ax == &MODES)
        return json_incref(json_object_get(json_object_get(job, "matrix"), "widths"));
    return modes_of(job);
}

/* The engine's cells of RES in the job's matrix order (models, then
 * passes, as submitted: forward before backward, then the other axis),
 * filtered ones left out. */
static int collect_cells(const struct axis *ax, json_t *res, json_t *job, struct tally *t)
{
    json_t *matrix = json_object_get(job, "matrix"), *others = others_of(ax, job);
    size_t i, k, l;
    json_t *m, *p, *x;
    int rc = others ? 0 : -ENOMEM;
    json_array_foreach(json_object_get(matrix, "models"), i, m)
    {
        json_array_foreach(json_object_get(matrix, "passes"), k, p)
        {
            json_array_foreach(others, l, x)
            {
                bool left;
                json_t *cs = rc ? NULL : summary_of(ax, res, m, p, x, &left);
                if (!rc && !cs && !left)
                    rc = -ENOMEM;
                if (cs)
                    tally_add(t, cs);
            }
        }
    }
    json_decref(others);
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
 * left the baseline's, or its cell failed where the baseline's ran ok;
 * incomplete: neither, but some cell could not be judged. */
static const char *value_verdict(const struct tally *t)
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

/* The first divergence of the value: FIRST's, with its model, pass and
 * value of the other axis. */
static json_t *value_first(const struct axis *ax, const struct tally *t, const char *member)
{
    json_t *cs = t->first ? t->first : t->first_failed;
    json_t *fd = json_object_get(cs, member);
    if (!json_is_object(fd))
        return json_null();
    json_t *o = json_pack("{s:O,s:O,s:O}", "model", json_object_get(cs, "model"), "pass",
                          json_object_get(cs, "pass"), ax->other, json_object_get(cs, ax->other));
    if (o)
        json_object_update(o, fd);
    return o;
}

/* One value's entry of the result, from the engine's result RES. */
static json_t *value_summary(const struct axis *ax, const char *v, json_t *res, json_t *job)
{
    struct tally t = {.cells = json_array()};
    if (!t.cells || collect_cells(ax, res, job, &t) != 0) {
        json_decref(t.cells);
        return NULL;
    }
    return json_pack("{s:s,s:s,s:o,s:o,s:o,s:o}", ax->name, v, "verdict", value_verdict(&t),
                     "counts", counts_json(&t), "first_divergence",
                     value_first(ax, &t, "first_divergence"), "first_introduced",
                     value_first(ax, &t, "first_introduced"), "cells", t.cells);
}

/* Whether the job's matrix names the value V of AX (a job without modes
 * is eager). */
static bool job_has(const struct axis *ax, json_t *job, const char *v)
{
    if (ax == &WIDTHS)
        return api_in_list(json_object_get(json_object_get(job, "matrix"), "widths"), v);
    json_t *modes = modes_of(job);
    bool in = api_in_list(modes, v);
    json_decref(modes);
    return in;
}

/* The values of AX to check, in order (owned): the width table's widths,
 * or the job's modes, that the job has, but the baseline. */
static json_t *values_to_check(const struct axis *ax, json_t *job)
{
    json_t *all =
        ax == &WIDTHS ? json_incref(json_object_get(widths_table(), "widths")) : modes_of(job);
    json_t *out = json_array(), *row;
    size_t i;
    json_array_foreach(all, i, row)
    {
        const char *v = json_string_value(json_is_object(row) ? json_object_get(row, "name") : row);
        if (v && strcmp(v, ax->baseline) != 0 && job_has(ax, job, v))
            json_array_append_new(out, json_string(v));
    }
    json_decref(all);
    return out;
}

/* Points O's cross comparison at value V of AX against its baseline. */
static void aim(const struct axis *ax, struct cmp_options *o, const char *v)
{
    if (ax == &WIDTHS) {
        snprintf(o->control_width, sizeof o->control_width, "%s", ax->baseline);
        snprintf(o->head_width, sizeof o->head_width, "%s", v);
    } else {
        snprintf(o->control_mode, sizeof o->control_mode, "%s", ax->baseline);
        snprintf(o->head_mode, sizeof o->head_mode, "%s", v);
    }
}

/* Each value of AX in the job but the baseline, compared with the
 * baseline under O, into the array *OUT. */
static int check_values(const struct axis *ax, const struct api_cmp_input *in, json_t *job,
                        struct cmp_options *o, json_t **out)
{
    size_t i;
    json_t *v, *values = values_to_check(ax, job);
    int rc = values ? 0 : -ENOMEM;
    *out = json_array();
    if (!*out)
        rc = -ENOMEM;
    json_array_foreach(values, i, v)
    {
        json_t *res = NULL, *vs = NULL;
        if (rc)
            break;
        aim(ax, o, json_string_value(v));
        if ((rc = api_cmp_run(in, job, o, &res)) == 0 &&
            !(vs = value_summary(ax, json_string_value(v), res, job)))
            rc = -ENOMEM;
        json_decref(res);
        if (!rc)
            json_array_append_new(*out, vs);
    }
    json_decref(values);
    return rc;
}

/* The worst verdict of the values: diverged, else incomplete, else pass. */
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

static json_t *result_json(const struct axis *ax, json_t *job, bool f64, json_t *values)
{
    char note[600] = "", base[32];
    if (!f64)
        snprintf(note, sizeof note,
                 "job %s was not submitted with \"reference\": \"float64\", so its cells have "
                 "no float64 reference records: the tolerance rule judges each %s against %s, "
                 "and one that only rounds differently may show as diverged. Submit the job "
                 "with \"reference\": \"float64\" (and capture sample or full) for the float64 "
                 "arbiter.",
                 json_string_value(json_object_get(job, "id")), ax->name, ax->baseline);
    snprintf(base, sizeof base, "baseline_%s", ax->name);
    return json_pack("{s:O,s:O,s:O,s:O,s:s,s:o,s:o,s:s,s:o}", "job", json_object_get(job, "id"),
                     "commit", json_object_get(job, "commit"), "branch",
                     json_object_get(job, "branch"), "build", json_object_get(job, "build"), base,
                     ax->baseline, "reference", f64 ? json_string("float64") : json_null(), "note",
                     f64 ? json_null() : json_string(note), "verdict", overall_verdict(values),
                     ax->plural, values);
}

/* A job without a baseline cell has nothing to check against, and one with
 * no other value nothing to check: 409, naming what the matrix lacks. */
static bool baseline_refused(struct api_req *r, const struct axis *ax, json_t *job,
                             enum MHD_Result *ret)
{
    const char *id = json_string_value(json_object_get(job, "id"));
    json_t *values = values_to_check(ax, job);
    size_t n = json_array_size(values);
    json_decref(values);
    if (!job_has(ax, job, ax->baseline)) {
        *ret = api_error(r, 409, "no_baseline", "id", ax->no_baseline, id);
        return true;
    }
    if (n == 0) {
        *ret = api_error(r, 409, ax->no_values_code, "id", ax->no_values, id);
        return true;
    }
    return false;
}

/* The check of AX of a finished job, in the format asked for. */
static enum MHD_Result check(struct api_req *r, const struct axis *ax, struct store *s, json_t *job)
{
    struct api_cmp_input in = {0};
    struct cmp_options o;
    enum api_format fmt;
    enum MHD_Result ret;
    json_t *values = NULL, *out;
    struct store_cell_filter f = {api_query(r, "model"), NULL, api_query(r, "pass")};
    const struct api_filter af[] = {{"model", "model", f.model}, {"pass", "pass", f.pass}};
    if (api_format_refused(r, &fmt, &ret) || baseline_refused(r, ax, job, &ret))
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
    int rc = api_cmp_load(s, job, job, &f, &in);
    if (!rc)
        rc = check_values(ax, &in, job, &o, &values);
    api_cmp_input_free(&in);
    if (rc) {
        json_decref(values);
        return api_cmp_failed(r, rc);
    }
    out = result_json(ax, job, f64, values);
    if (fmt == API_FORMAT_JSON)
        return api_json(r, 200, out);
    char *report = api_selfcheck_render(out, ax->name, fmt == API_FORMAT_MD);
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

static enum MHD_Result self_check(struct api_req *r, const struct axis *ax)
{
    struct store *s = api_store(r);
    json_t *job = NULL;
    enum MHD_Result ret;
    if (api_job_ref_refused(r, s, api_param(r, "id"), "id", &job, &ret))
        return ret;
    ret = api_job_finished(job) ? check(r, ax, s, job) : pending(r, job);
    json_decref(job);
    return ret;
}

enum MHD_Result api_jobs_widths(struct api_req *r)
{
    return self_check(r, &WIDTHS);
}

enum MHD_Result api_jobs_modes(struct api_req *r)
{
    return self_check(r, &MODES);
}
