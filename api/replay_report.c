/*
 * api/replay_report.c - what a replay found (GET
 * /v1/jobs/{id}/cells/{cell}/replay; docs/api.md, "Replay and repro").
 *
 * The two replay jobs ran the cell's model on each build at every width
 * the host runs (the model run), recording the target unit's inputs and
 * results in full: an op call's arguments (role arg), or a module's
 * forward call's inputs (role input); "unit" says which, "op" names it. They are compared like any
 * two jobs (the head job's options: its tolerances and reference arbiter), and for each width the
 * target's rows say what happened there:
 *
 *   same            its arguments and its results are identical;
 *   kernel_changed  identical arguments, other results: the head's op
 *                   itself computes something else from the same inputs;
 *   inputs_differ   its arguments already differ (and its results too):
 *                   whatever the op did, its input had drifted upstream;
 *   nondeterministic a result the runner saw change between two runs of
 *                   one build;
 *   not_run         the op call did not run there (or the cell failed).
 *
 * The isolated pair (daemon/replay/isolate.h) ran the unit alone on the
 * control's recorded inputs under each build at every width, judged
 * against a float64 evaluation of it on the same inputs (option reference
 * float64). Its verdict per width, under "isolated":
 *
 *   same              both builds' results are identical;
 *   within_reference  they differ, the head within the float64 reference's
 *                     error (the arbiter's rule, docs/compare.md);
 *   diverged          they differ beyond it;
 *   nondeterministic, not_run as above.
 *
 * and, in isolated.control and isolated.head, each build's result there
 * graded the same way against the control's output (the control build's
 * result at the cell's width: cross-width comparisons, grade_builds).
 *
 * The conclusion: kernel_changed (at the widths listed, with the kernel the
 * comparison names) when the isolated pair's results differ at any width
 * (where the isolated pair did not run, when the model run says so); else
 * inherited when the cell's own width says inputs_differ (upstream: the
 * first record the two model runs differ at); else not_reproducible,
 * saying why (nondeterministic at a width, or the same everywhere: the
 * divergence needs what an isolated run does not recreate).
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "api/api_int.h"
#include "api/repro.h"
#include "compare/cmp.h"

/* The order of a row status, worst last. */
static int rank(const char *st)
{
    static const char *const order[] = {"identical", "within_tolerance", "diverged",
                                        "nondeterministic"};
    for (int i = 0; i < 4; i++)
        if (st && strcmp(st, order[i]) == 0)
            return i;
    return 2;
}

static const char *const rank_name[] = {"identical", "within_tolerance", "diverged",
                                        "nondeterministic"};

/* The target's rows of one compared cell: the worst status of its
 * arguments and of its results (-1: none), the largest relative error of a
 * result. */
struct target_rows {
    int args, outs;
    double max_rel;
};

static struct target_rows target_rows(json_t *cell, const char *op)
{
    struct target_rows t = {-1, -1, 0};
    size_t i, n = strlen(op);
    json_t *row;
    json_array_foreach(json_object_get(cell, "tensors"), i, row)
    {
        const char *key = json_string_value(json_object_get(row, "key"));
        if (!key || strncmp(key, op, n) != 0 || key[n] != '.')
            continue;
        int k = rank(json_string_value(json_object_get(row, "status")));
        /* an op call's arguments, a module call's inputs */
        bool arg = strncmp(key + n, ".arg.", 5) == 0 || strncmp(key + n, ".input.", 7) == 0;
        int *worst = arg ? &t.args : &t.outs;
        *worst = k > *worst ? k : *worst;
        double rel = json_real_value(json_object_get(row, "max_rel"));
        if (!arg && rel > t.max_rel)
            t.max_rel = rel;
    }
    return t;
}

static const char *width_verdict(json_t *cell, const struct target_rows *t)
{
    const char *st = json_string_value(json_object_get(cell, "status"));
    if ((st && (strcmp(st, "incomparable") == 0 || strcmp(st, "not_run") == 0)) || t->outs < 0)
        return "not_run";
    if (t->outs == 3 || t->args == 3)
        return "nondeterministic";
    if (t->outs == 0)
        return "same";
    return t->args <= 0 ? "kernel_changed" : "inputs_differ";
}

/* One width's entry, its verdict into *V. */
static json_t *width_entry(json_t *cell, const char *op, const char **v)
{
    struct target_rows t = target_rows(cell, op);
    *v = width_verdict(cell, &t);
    json_t *e = json_pack("{s:O, s:s, s:s, s:s}", "width", json_object_get(cell, "width"),
                          "verdict", *v, "inputs", t.args < 0 ? "none" : rank_name[t.args],
                          "outputs", t.outs < 0 ? "none" : rank_name[t.outs]);
    if (t.outs > 0 && t.max_rel > 0)
        json_object_set_new(e, "max_rel", json_real(t.max_rel));
    return e;
}

/* The isolated pair's verdict at one width (its rows of op OP): the op
 * alone on the control's recorded arguments under each build. */
static const char *isolated_verdict(json_t *cell, const char *op, struct target_rows *t)
{
    static const char *const grade[] = {"same", "within_reference", "diverged", "nondeterministic"};
    const char *st = json_string_value(json_object_get(cell, "status"));
    *t = target_rows(cell, op);
    if ((st && (strcmp(st, "incomparable") == 0 || strcmp(st, "not_run") == 0)) || t->outs < 0)
        return "not_run";
    return grade[t->outs];
}

/* Each width's isolated verdict, beside its entry in PER_WIDTH; the
 * widths whose isolated results differ into CHANGED, the kernel the
 * comparison names into *KERNEL, whether any ran and the first
 * nondeterministic width. */
static void isolated_entries(json_t *per_width, json_t *icells, const char *op, json_t *changed,
                             json_t **kernel, bool *ran, const char **nondet)
{
    json_t *cell, *e;
    size_t i, k;
    json_array_foreach(icells, i, cell)
    {
        struct target_rows t;
        const char *w = json_string_value(json_object_get(cell, "width"));
        const char *v = isolated_verdict(cell, op, &t);
        json_t *iso = json_pack("{s:s}", "verdict", v);
        if (t.outs > 0 && t.max_rel > 0)
            json_object_set_new(iso, "max_rel", json_real(t.max_rel));
        json_array_foreach(per_width, k, e) if (w && json_equal(json_object_get(e, "width"),
                                                                json_object_get(cell, "width")))
            json_object_set(e, "isolated", iso);
        json_decref(iso);
        *ran |= strcmp(v, "not_run") != 0;
        if (strcmp(v, "nondeterministic") == 0 && !*nondet)
            *nondet = w;
        if (strcmp(v, "within_reference") == 0 || strcmp(v, "diverged") == 0) {
            json_array_append_new(changed, json_string(w));
            json_t *fd = json_object_get(cell, "first_divergence");
            if (!*kernel && json_is_object(json_object_get(fd, "kernel")))
                *kernel = json_object_get(fd, "kernel");
        }
    }
}

/* What the natural replay (the model run on each build) found: each
 * width's entry into RES's per_width, the widths where the op's results
 * differ on identical arguments, the kernel, the own width's verdict and
 * the first record the runs differ at there. */
struct natural {
    json_t *changed, *kernel, *upstream;
    const char *own, *nondet;
    bool ran;
};

static void natural_entries(json_t *res, json_t *cells, const char *op, const char *own,
                            struct natural *n)
{
    json_t *cell;
    const char *v;
    size_t i;
    json_array_foreach(cells, i, cell)
    {
        const char *w = json_string_value(json_object_get(cell, "width"));
        json_t *e = width_entry(cell, op, &v);
        json_array_append_new(json_object_get(res, "per_width"), e);
        json_t *fd = json_object_get(cell, "first_divergence");
        if (strcmp(v, "kernel_changed") == 0) {
            json_array_append_new(n->changed, json_string(w));
            if (!n->kernel && json_is_object(json_object_get(fd, "kernel")))
                n->kernel = json_object_get(fd, "kernel");
        }
        if (strcmp(v, "nondeterministic") == 0 && !n->nondet)
            n->nondet = w;
        n->ran |= strcmp(v, "not_run") != 0;
        if (w && strcmp(w, own) == 0) {
            n->own = v;
            if (json_is_object(fd) && !n->upstream)
                n->upstream =
                    json_pack("{s:O, s:O*, s:O*}", "key", json_object_get(fd, "key"), "module",
                              json_object_get(fd, "module"), "op", json_object_get(fd, "op"));
        }
    }
}

/* The conclusion into RES: from the isolated pair where it ran (ICELLS,
 * its op IOP), else from the natural replay alone. */
static void conclude(json_t *res, json_t *cells, const char *op, const char *own, json_t *icells,
                     const char *iop)
{
    struct natural n = {json_array(), NULL, NULL, "not_run", NULL, false};
    natural_entries(res, cells, op, own, &n);
    json_t *changed = n.changed, *kernel = n.kernel;
    const char *nondet = n.nondet;
    bool ran = n.ran, iran = false;
    if (icells) {
        json_t *ich = json_array();
        json_t *ikernel = NULL;
        const char *inondet = NULL;
        isolated_entries(json_object_get(res, "per_width"), icells, iop, ich, &ikernel, &iran,
                         &inondet);
        if (iran) {
            json_decref(changed);
            changed = ich;
            kernel = ikernel;
            /* the model run's nondeterminism still says why, when the op
             * alone (on fixed inputs and scalars) is deterministic */
            nondet = inondet ? inondet : n.nondet;
        } else {
            json_decref(ich);
        }
    }
    const char *c = "not_reproducible", *why = NULL;
    char buf[200];
    if (json_array_size(changed) > 0)
        c = "kernel_changed";
    else if (strcmp(n.own, "inputs_differ") == 0)
        c = "inherited";
    else if (!ran && !iran)
        why = "the unit did not run in the replay at any width (or its cells failed)";
    else if (nondet && snprintf(buf, sizeof buf,
                                "nondeterministic at %s: one build's own runs "
                                "differ",
                                nondet) > 0)
        why = buf;
    else
        why = "the replay computed the same on both builds at every width: the divergence needs "
              "what an isolated run does not recreate (state, order, nondeterminism the capture "
              "did not see)";
    json_object_set_new(res, "conclusion", json_string(c));
    json_object_set_new(res, "widths", changed);
    json_object_set_new(res, "kernel", kernel ? json_incref(kernel) : json_null());
    bool inh = strcmp(c, "inherited") == 0 && n.upstream;
    json_object_set_new(res, "upstream", inh ? n.upstream : json_null());
    if (!inh)
        json_decref(n.upstream);
    json_object_set_new(res, "why", why ? json_string(why) : json_null());
}

/* The report as Markdown or text. */
static char *render(json_t *res, bool md)
{
    char *out = NULL;
    size_t n = 0;
    FILE *f = open_memstream(&out, &n);
    if (!f)
        return NULL;
    const char *c = json_string_value(json_object_get(res, "conclusion"));
    const char *q = md ? "`" : "";
    const char *unit = json_string_value(json_object_get(res, "unit"));
    fprintf(f, "%sreplay of %s%s%s: %s\n\n", md ? "## " : "", q,
            json_string_value(json_object_get(res, "op")), q, c);
    if (strcmp(c, "kernel_changed") == 0) {
        json_t *k = json_object_get(res, "kernel"), *w;
        size_t i;
        fprintf(f, "the head's %s computes something else from the same inputs at", unit);
        json_array_foreach(json_object_get(res, "widths"), i, w)
            fprintf(f, "%s %s", i ? "," : "", json_string_value(w));
        /* a DispatchStub by name; a BLAS, oneDNN or native kernel by its
         * kind; an op the table does not know: nothing */
        const char *stub = json_string_value(json_object_get(k, "stub"));
        const char *kind = json_string_value(json_object_get(k, "kind"));
        const char *file = json_string_value(json_object_get(k, "file"));
        if (stub && file)
            fprintf(f, "; %s%s%s, %s", q, stub, q, file);
        else if (kind && file)
            fprintf(f, "; %s kernel, %s", kind, file);
        fputc('\n', f);
    } else if (strcmp(c, "inherited") == 0) {
        fprintf(f, "the %s's inputs had already drifted: upstream %s%s%s\n", unit, q,
                json_string_value(json_object_get(json_object_get(res, "upstream"), "key")), q);
    } else {
        fprintf(f, "%s\n", json_string_value(json_object_get(res, "why")));
    }
    json_t *e, *iso = json_object_get(res, "isolated");
    size_t i;
    if (json_is_string(json_object_get(iso, "refused")))
        fprintf(f, "\nno isolated replay: %s\n",
                json_string_value(json_object_get(iso, "refused")));
    if (md)
        fprintf(f,
                "\n| width | model run | inputs | results | %s alone on the control's inputs "
                "| control build vs the control's output | head build vs it |\n"
                "| --- | --- | --- | --- | --- | --- | --- |\n",
                unit);
    else
        fputc('\n', f);
    json_array_foreach(json_object_get(res, "per_width"), i, e)
    {
        json_t *alone_e = json_object_get(e, "isolated");
        const char *alone = json_string_value(json_object_get(alone_e, "verdict"));
        const char *bc = json_string_value(json_object_get(alone_e, "control"));
        const char *bh = json_string_value(json_object_get(alone_e, "head"));
        /* the text says which unit ran alone, the Markdown's header does */
        fprintf(f,
                md ? "| %s | %s | %s | %s | %.0s%s | %s | %s |\n"
                   : "  %s: %s (inputs %s, results %s; %s alone: %s; against the control's "
                     "output: control build %s, head build %s)\n",
                json_string_value(json_object_get(e, "width")),
                json_string_value(json_object_get(e, "verdict")),
                json_string_value(json_object_get(e, "inputs")),
                json_string_value(json_object_get(e, "outputs")), unit, alone ? alone : "none",
                bc ? bc : "none", bh ? bh : "none");
    }
    if (fclose(f) != 0) {
        free(out);
        return NULL;
    }
    return out;
}

/* The comparison of replay jobs CTL and HEAD (at HEAD's options: its
 * reference and tolerances; with their tensor rows) into *OUT; false,
 * having replied, when it failed. */
static bool compare_pair(struct api_req *r, json_t *ctl, json_t *head, json_t **out,
                         enum MHD_Result *ret)
{
    struct api_cmp_input in = {0};
    struct cmp_options o;
    cmp_options_init(&o);
    if (api_job_options_refused(r, head, &o, ret))
        return false;
    o.include_tensors = true;
    int rc = api_cmp_load(api_store(r), ctl, head, &(struct store_cell_filter){0}, &in);
    if (!rc)
        rc = api_cmp_run(&in, head, &o, out);
    api_cmp_input_free(&in);
    if (rc)
        *ret = api_cmp_failed(r, rc);
    return rc == 0;
}

/* Each width's isolated results against the control's output (the
 * control build's result at the cell's width OWN), per build: into each
 * PER_WIDTH entry's isolated.control and isolated.head (same,
 * within_reference, diverged...). False, having replied, on a failure. */
static bool grade_builds(struct api_req *r, const struct api_replay_jobs *j, const char *own,
                         const char *iop, json_t *per_width, enum MHD_Result *ret)
{
    static const char *const side[2] = {"control", "head"};
    for (int s = 0; s < 2; s++) {
        json_t *hj = s ? j->ihead : j->ictl, *e;
        struct api_cmp_input in = {0};
        struct cmp_options o;
        size_t i;
        cmp_options_init(&o);
        if (api_job_options_refused(r, hj, &o, ret))
            return false;
        o.include_tensors = true;
        snprintf(o.control_width, sizeof o.control_width, "%s", own);
        int rc = api_cmp_load(api_store(r), j->ictl, hj, &(struct store_cell_filter){0}, &in);
        json_array_foreach(per_width, i, e)
        {
            json_t *res = NULL, *iso = json_object_get(e, "isolated");
            snprintf(o.head_width, sizeof o.head_width, "%s",
                     json_string_value(json_object_get(e, "width")));
            if (!rc && json_is_object(iso))
                rc = api_cmp_run(&in, hj, &o, &res);
            json_t *cell = json_array_get(json_object_get(res, "cells"), 0);
            struct target_rows t;
            if (!rc && json_is_object(iso))
                json_object_set_new(
                    iso, side[s], json_string(cell ? isolated_verdict(cell, iop, &t) : "not_run"));
            json_decref(res);
        }
        api_cmp_input_free(&in);
        if (rc) {
            *ret = api_cmp_failed(r, rc);
            return false;
        }
    }
    return true;
}

enum MHD_Result api_replay_report(struct api_req *r, const struct api_replay_jobs *j,
                                  const char *width)
{
    enum api_format fmt;
    enum MHD_Result ret;
    json_t *cmp = NULL, *icmp = NULL;
    const char *op =
        json_string_value(json_object_get(json_object_get(j->ctl, "labels"), "replay_op"));
    const char *iop =
        j->ictl
            ? json_string_value(json_object_get(json_object_get(j->ictl, "options"), "target_op"))
            : NULL;
    if (api_format_refused(r, &fmt, &ret) || !compare_pair(r, j->ctl, j->head, &cmp, &ret) ||
        (j->ictl && j->ihead && !compare_pair(r, j->ictl, j->ihead, &icmp, &ret)))
        goto out;
    json_t *res =
        json_pack("{s:s, s:s, s:s, s:o, s:o, s:[]}", "op", op ? op : "", "unit",
                  op && !strstr(op, "/op.") ? "module" : "op", "cell_width", width, "control",
                  api_job_summary(j->ctl), "head", api_job_summary(j->head), "per_width");
    json_object_set_new(res, "isolated",
                        j->refused ? json_pack("{s:s}", "refused", j->refused)
                        : icmp
                            ? json_pack("{s:s*, s:o, s:o}", "op", iop, "control",
                                        api_job_summary(j->ictl), "head", api_job_summary(j->ihead))
                            : json_null());
    conclude(res, json_object_get(cmp, "cells"), op ? op : "", width,
             json_object_get(icmp, "cells"), iop ? iop : "");
    if (icmp &&
        !grade_builds(r, j, width, iop ? iop : "", json_object_get(res, "per_width"), &ret)) {
        json_decref(res);
        goto out;
    }
    if (fmt == API_FORMAT_JSON) {
        ret = api_json(r, 200, res);
    } else {
        ret = api_report_reply(r, fmt, render(res, fmt == API_FORMAT_MD));
        json_decref(res);
    }
out:
    json_decref(cmp);
    json_decref(icmp);
    return ret;
}
