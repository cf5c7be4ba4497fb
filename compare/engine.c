/*
 * compare/engine.c - a comparison from start to end: the options checked,
 * each side's cells picked and matched, every matched pair judged
 * (engine_cell.c), and the result object written (engine_json.c;
 * docs/compare.md is the contract for every field name).
 *
 * The engine answers three questions per cell, in the order a reviewer asks
 * them: did it still run (outcome change), does it still compute the same
 * thing (status, first divergence, where the error was introduced), and is
 * it slower (perf). Everything is deterministic: the same two sides give a
 * byte-identical result, so results can be cached and ETag'd.
 */
#include <errno.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "compare/engine_int.h"

/* ----------------------------------------------------------- the driver */

/* The cells' order by model, width, pass and mode; a cross comparison
 * matches across the width (CROSS_WIDTH) or the mode (CROSS_MODE) it
 * picked one of on each side, so that axis is left out. */
static int cell_order(const struct cmp_cell *x, const struct cmp_cell *y, bool cross_width,
                      bool cross_mode)
{
    int c = strcmp(x->model, y->model);
    if (c)
        return c;
    if (!cross_width) {
        c = strcmp(x->width, y->width);
        if (c)
            return c;
    }
    c = strcmp(x->pass, y->pass);
    return c || cross_mode ? c : strcmp(x->mode, y->mode);
}

/* Sorts one side's picked cells: all of one width (one mode) where the
 * comparison crosses it, so the whole order serves every comparison. */
static int cell_cmp(const void *a, const void *b)
{
    return cell_order(*(const struct cmp_cell *const *)a, *(const struct cmp_cell *const *)b, false,
                      false);
}

/* A side's cells (of WIDTH and MODE where not NULL: a cross comparison),
 * in result order. */
static int pick_cells(const struct cmp_side *s, const char *width, const char *mode,
                      const struct cmp_cell ***out, size_t *n_out)
{
    const struct cmp_cell **v = malloc((s->n_cells + 1) * sizeof(*v));
    size_t n = 0;
    if (v == NULL)
        return -ENOMEM;
    for (size_t i = 0; i < s->n_cells; i++)
        if ((width == NULL || strcmp(s->cells[i]->width, width) == 0) &&
            (mode == NULL || strcmp(s->cells[i]->mode, mode) == 0))
            v[n++] = s->cells[i];
    qsort(v, n, sizeof(*v), cell_cmp);
    *out = v;
    *n_out = n;
    return 0;
}

static json_t *cell_id(const struct cmp_cell *c)
{
    return json_pack("{s:s, s:s, s:s, s:s}", "model", c->model, "width", c->width, "pass", c->pass,
                     "mode", c->mode);
}

/*
 * Options set field by field skip cmp_options_apply_json's checks; a NaN
 * tolerance would silently pass everything, so they are checked again here.
 */
static bool options_ok(const struct cmp_options *o)
{
    for (int i = 0; i < CMP_DTYPE__COUNT; i++)
        if (!(o->tol[i].atol >= 0 && o->tol[i].rtol >= 0 && isfinite(o->tol[i].atol) &&
              isfinite(o->tol[i].rtol)))
            return false;
    if (o->n_key_tols > CMP_MAX_KEY_TOLS)
        return false;
    for (size_t i = 0; i < o->n_key_tols; i++) {
        const struct cmp_key_tol *k = &o->key_tols[i];
        if (memchr(k->pattern, '\0', sizeof(k->pattern)) == NULL || k->pattern[0] == '\0')
            return false;
        if (k->atol < 0 || k->rtol < 0 || isinf(k->atol) || isinf(k->rtol))
            return false;
    }
    if (memchr(o->control_width, '\0', sizeof(o->control_width)) == NULL ||
        memchr(o->head_width, '\0', sizeof(o->head_width)) == NULL ||
        memchr(o->control_mode, '\0', sizeof(o->control_mode)) == NULL ||
        memchr(o->head_mode, '\0', sizeof(o->head_mode)) == NULL)
        return false;
    return o->alpha > 0 && o->alpha < 1 && o->perf_threshold >= 0 && isfinite(o->perf_threshold) &&
           o->bootstrap_resamples >= 0 && o->bootstrap_resamples <= CMP_MAX_BOOTSTRAP;
}

/* The state of one comparison while its cells are matched. */
struct run {
    const struct cmp_options *opt;
    bool cross, cross_mode;           /* across widths, across modes */
    const struct cmp_cell **cc, **hc; /* control's and head's cells, in result order */
    size_t ncc, nhc;
    struct cmp_scratch *s;
    struct cmp__env *env;
    json_t *res, *cells, *miss, *extra, *envj;
    struct cmp__counts cnt;
};

static int run_open(struct run *r, const struct cmp_side *control, const struct cmp_side *head)
{
    const struct cmp_options *opt = r->opt;
    int rc = pick_cells(control, r->cross ? opt->control_width : NULL,
                        r->cross_mode ? opt->control_mode : NULL, &r->cc, &r->ncc);
    if (rc < 0)
        return rc;
    rc = pick_cells(head, r->cross ? opt->head_width : NULL, r->cross_mode ? opt->head_mode : NULL,
                    &r->hc, &r->nhc);
    if (rc < 0)
        return rc;
    rc = cmp_scratch_new(&r->s);
    if (rc < 0)
        return rc;
    rc = cmp__env_new(&r->env);
    if (rc < 0)
        return rc;
    r->res = json_object();
    r->cells = json_array();
    r->miss = json_array();
    r->extra = json_array();
    if (r->res == NULL || r->cells == NULL || r->miss == NULL || r->extra == NULL)
        return -ENOMEM;
    return 0;
}

static void run_close(struct run *r)
{
    json_decref(r->res);
    json_decref(r->cells);
    json_decref(r->miss);
    json_decref(r->extra);
    json_decref(r->envj);
    cmp__env_free(r->env);
    cmp_scratch_free(r->s);
    free(r->cc);
    free(r->hc);
}

/*
 * Walks both sides' cells in result order: a cell of one side only is
 * missing (control) or extra (head); a matched pair is named to the
 * environment section and compared.
 */
static int match_cells(struct run *r)
{
    size_t i = 0, j = 0;
    while (i < r->ncc || j < r->nhc) {
        int k = i == r->ncc   ? 1
                : j == r->nhc ? -1
                              : cell_order(r->cc[i], r->hc[j], r->cross, r->cross_mode);
        if (k < 0) {
            if (json_array_append_new(r->miss, cell_id(r->cc[i++])))
                return -ENOMEM;
            r->cnt.missing_cells++;
        } else if (k > 0) {
            if (json_array_append_new(r->extra, cell_id(r->hc[j++])))
                return -ENOMEM;
            r->cnt.extra_cells++;
        } else {
            int rc = cmp__env_pair(r->env, r->cc[i], r->hc[j]);
            if (rc == 0)
                rc = cmp__compare_cell(r->cc[i++], r->hc[j++], r->opt, r->cross, r->cross_mode,
                                       r->s, r->cells, &r->cnt);
            if (rc < 0)
                return rc;
        }
    }
    return 0;
}

int cmp_compare(const struct cmp_side *control, const struct cmp_side *head,
                const struct cmp_options *opt, json_t **result_out)
{
    int rc = -EINVAL;
    struct cmp_options defaults;
    struct run r = {0};

    if (control == NULL || head == NULL || result_out == NULL)
        goto out;
    if (opt == NULL) {
        cmp_options_init(&defaults);
        opt = &defaults;
    }
    r.opt = opt;
    r.cross = opt->control_width[0] != '\0' && opt->head_width[0] != '\0';
    r.cross_mode = opt->control_mode[0] != '\0' && opt->head_mode[0] != '\0';
    if ((opt->control_width[0] != '\0') != (opt->head_width[0] != '\0') ||
        (opt->control_mode[0] != '\0') != (opt->head_mode[0] != '\0'))
        goto out;
    if (!options_ok(opt))
        goto out;

    rc = run_open(&r, control, head);
    if (rc < 0)
        goto out;
    rc = match_cells(&r);
    if (rc < 0)
        goto out;
    /* What else differs between the two builds (envdiff.c). */
    rc = cmp__env_result(r.env, r.cc, r.ncc, r.hc, r.nhc, &r.envj);
    if (rc < 0)
        goto out;
    rc = cmp__result_json(r.res, &r.cnt, opt, r.cross, r.cross_mode, &r.cells, &r.miss, &r.extra,
                          &r.envj);
    if (rc < 0)
        goto out;
    *result_out = r.res;
    r.res = NULL;
    rc = 0;
out:
    run_close(&r);
    return rc;
}
