/*
 * compare/engine_cell.c - one matched cell pair: its records merged by key,
 * each record pair judged, the first divergence and the record that
 * introduced the error, and the cell's status and counts.
 *
 * The work runs in stages over a struct cmp__cellcmp: sort both sides by
 * key, merge (keys on one side only are missing/extra), check the devices,
 * judge each pair, then walk the pairs in head execution order to find the
 * first divergence and the first introduced error, and last the status.
 */
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "compare/engine_int.h"

/* ------------------------------------------------------------- sorting */

int cmp__rec_by_key(const void *a, const void *b)
{
    const struct cmp__rec *x = *(const struct cmp__rec *const *)a;
    const struct cmp__rec *y = *(const struct cmp__rec *const *)b;
    int c = strcmp(x->key, y->key);
    return c ? c : cmp__rec_by_seq(a, b);
}

static int row_by_head_seq(const void *a, const void *b)
{
    const struct cmp__row *x = a, *y = b;
    return (x->h->seq > y->h->seq) - (x->h->seq < y->h->seq);
}

/* Groups of one module call: module name, then call index. NULL modules last. */
static int group_cmp(const struct cmp__rec *x, const struct cmp__rec *y)
{
    if (x->module == NULL || y->module == NULL)
        return (x->module == NULL) - (y->module == NULL);
    int c = strcmp(x->module, y->module);
    if (c)
        return c;
    return (x->call > y->call) - (x->call < y->call);
}

/* The module-call index: pairs sorted by group, then by head execution order. */
static int gidx_cmp(const void *a, const void *b)
{
    const struct cmp__rowix *x = a, *y = b;
    return cmp__rowix_then(group_cmp(x->h, y->h), x, y);
}

/* A sorted copy of a cell's record pointers, by key. */
static int sorted_recs(const struct cmp_cell *cell, const struct cmp__rec ***out)
{
    const struct cmp__rec **v = malloc((cell->n_recs + 1) * sizeof(*v));
    if (v == NULL)
        return -ENOMEM;
    for (size_t i = 0; i < cell->n_recs; i++)
        v[i] = &cell->recs[i];
    qsort(v, cell->n_recs, sizeof(*v), cmp__rec_by_key);
    *out = v;
    return 0;
}

static bool is_nondet(const struct cmp_cell *cell, const struct cmp__rec *r,
                      const char **sorted_marks)
{
    if (r->nondet)
        return true;
    size_t lo = 0, hi = cell->n_nondet;
    while (lo < hi) {
        size_t mid = lo + (hi - lo) / 2;
        int c = strcmp(sorted_marks[mid], r->key);
        if (c == 0)
            return true;
        if (c < 0)
            lo = mid + 1;
        else
            hi = mid;
    }
    return false;
}

static int by_str(const void *a, const void *b)
{
    return strcmp(*(const char *const *)a, *(const char *const *)b);
}

/* --------------------------------------------------------- cell verdict */

/* A failure of the build under test (util/cellstate.h); an unset outcome is none. */
static bool outcome_bad(const struct cmp_cell *x)
{
    return x->has_outcome && cell_state_failure(x->outcome);
}

static const char *outcome_change(const struct cmp_cell *c, const struct cmp_cell *h)
{
    if (cmp__outcome_is(c, CELL_OK) && outcome_bad(h))
        return "regression";
    if (outcome_bad(c) && cmp__outcome_is(h, CELL_OK))
        return "fix";
    if (c->has_outcome != h->has_outcome || (c->has_outcome && c->outcome != h->outcome))
        return "changed";
    return "none";
}

static bool close_enough(enum cmp__tclass k)
{
    return k == CMP__T_IDENTICAL || k == CMP__T_WITHIN;
}

/*
 * Did row r introduce error? (docs/compare.md, "First introduced".) Its
 * module inputs are the other records of the same module call with role
 * input (forward) or grad_output (backward). A record that is itself such an
 * input, an init parameter, or one whose inputs were not captured can only be
 * the origin when nothing diverged before it; otherwise it introduced error
 * exactly when all of its inputs were identical or within tolerance.
 */
static bool introduces(const struct cmp__row *rows, const struct cmp__rowix *grp, size_t ngrp,
                       size_t ri, bool first_divergent)
{
    const struct cmp__rec *r = rows[ri].h;
    enum cmp__role want;

    if (r->phase == CMP__PH_FORWARD)
        want = CMP__ROLE_INPUT;
    else if (r->phase == CMP__PH_BACKWARD)
        want = CMP__ROLE_GRAD_OUTPUT;
    else
        return first_divergent;
    if (r->role == want || r->module == NULL)
        return first_divergent;

    /* binary search for the first member of r's group */
    size_t lo = 0, hi = ngrp;
    while (lo < hi) {
        size_t mid = lo + (hi - lo) / 2;
        if (group_cmp(grp[mid].h, r) < 0)
            lo = mid + 1;
        else
            hi = mid;
    }
    size_t inputs = 0;
    for (size_t g = lo; g < ngrp && group_cmp(grp[g].h, r) == 0; g++) {
        const struct cmp__row *q = &rows[grp[g].row];
        if (grp[g].row == ri || q->h->phase != r->phase || q->h->role != want)
            continue;
        inputs++;
        if (!close_enough(q->cls))
            return false;
    }
    return inputs > 0 ? true : first_divergent;
}

/* ------------------------------------------------------------- stages */

/* Both sides' records sorted by key, their nondeterministic marks sorted,
 * and room for the merge. */
static int cellcmp_prepare(struct cmp__cellcmp *k)
{
    const struct cmp_cell *c = k->c, *h = k->h;
    int rc = sorted_recs(c, &k->sc);
    if (rc < 0)
        return rc;
    rc = sorted_recs(h, &k->sh);
    if (rc < 0)
        return rc;
    k->mc = malloc((c->n_nondet + 1) * sizeof(*k->mc));
    k->mh = malloc((h->n_nondet + 1) * sizeof(*k->mh));
    k->rows = malloc((c->n_recs < h->n_recs ? c->n_recs : h->n_recs) * sizeof(*k->rows) + 1);
    k->missing = malloc((c->n_recs + 1) * sizeof(*k->missing));
    k->extra = malloc((h->n_recs + 1) * sizeof(*k->extra));
    if (k->mc == NULL || k->mh == NULL || k->rows == NULL || k->missing == NULL || k->extra == NULL)
        return -ENOMEM;
    if (c->n_nondet)
        memcpy(k->mc, c->nondet_keys, c->n_nondet * sizeof(*k->mc));
    if (h->n_nondet)
        memcpy(k->mh, h->nondet_keys, h->n_nondet * sizeof(*k->mh));
    qsort(k->mc, c->n_nondet, sizeof(*k->mc), by_str);
    qsort(k->mh, h->n_nondet, sizeof(*k->mh), by_str);
    return 0;
}

static void cellcmp_free(struct cmp__cellcmp *k)
{
    free(k->sc);
    free(k->sh);
    free(k->mc);
    free(k->mh);
    free(k->rows);
    free(k->missing);
    free(k->extra);
    free(k->grp);
    if (k->sr_owned)
        free(k->sr);
}

/* Merges by key; a repeated key keeps its lowest-seq record only. The
 * float64 reference's records are the arbiter's (reference.c), never a
 * pair of their own. Across modes a control key the compiled head lacks
 * is left out: the head records at its own, coarser grain. */
static void merge_keys(struct cmp__cellcmp *k)
{
    const struct cmp__rec **sc = k->sc, **sh = k->sh;
    size_t nc = k->c->n_recs, nh = k->h->n_recs;
    size_t i = 0, j = 0;
    while (i < nc || j < nh) {
        if (i > 0 && i < nc && strcmp(sc[i]->key, sc[i - 1]->key) == 0) {
            i++;
            continue;
        }
        if (j > 0 && j < nh && strcmp(sh[j]->key, sh[j - 1]->key) == 0) {
            j++;
            continue;
        }
        if (i < nc && cmp__reference_key(sc[i]->key)) {
            i++;
            continue;
        }
        if (j < nh && cmp__reference_key(sh[j]->key)) {
            j++;
            continue;
        }
        int c = i == nc ? 1 : j == nh ? -1 : strcmp(sc[i]->key, sh[j]->key);
        if (c < 0 && k->cross_mode) {
            i++;
        } else if (c < 0) {
            k->missing[k->nmiss++] = sc[i++];
        } else if (c > 0) {
            k->extra[k->nextra++] = sh[j++];
        } else {
            k->rows[k->nrows++] = (struct cmp__row){.c = sc[i++], .h = sh[j++]};
        }
    }
    cmp__rows_in_order(k);
}

void cmp__rows_in_order(struct cmp__cellcmp *k)
{
    qsort(k->rows, k->nrows, sizeof(*k->rows), row_by_head_seq);
    qsort(k->missing, k->nmiss, sizeof(*k->missing), cmp__rec_by_seq);
    qsort(k->extra, k->nextra, sizeof(*k->extra), cmp__rec_by_seq);
}

/*
 * Different devices (a GPU against the CPU, two GPU models) run different
 * kernels: their records and timings are not compared at all unless asked,
 * so a device change never reads as a regression.
 */
static void check_devices(struct cmp__cellcmp *k)
{
    const struct cmp_cell *c = k->c, *h = k->h;
    k->dev_check = "unknown";
    k->dev_refused = false;
    if (c->device == NULL || h->device == NULL)
        return;
    if (strcmp(c->device, h->device) == 0) {
        k->dev_check = "same";
    } else if (k->o->allow_device_mismatch) {
        k->dev_check = "mismatch_allowed";
    } else {
        k->dev_check = "mismatch_refused";
        k->dev_refused = true;
        k->nrows = k->nmiss = k->nextra = 0;
    }
}

/* Judges every record pair: identical, nondeterministic, within tolerance
 * or diverged, in that order of precedence; a pair the tolerance rule
 * diverged goes to the reference arbiter when the options name one. */
static int judge_rows(struct cmp__cellcmp *k, struct cmp_scratch *s)
{
    for (size_t r = 0; r < k->nrows; r++) {
        struct cmp__row *w = &k->rows[r];
        struct cmp_tol tol = cmp__tol_for(k->o, w->c->key, w->c->dtype);
        int rc = cmp__rec_compare(w->h, w->c, &tol, s, &w->m);
        if (rc < 0)
            return rc;
        if (w->m.basis == CMP_BASIS_EXACT)
            w->cls = CMP__T_IDENTICAL;
        else if (is_nondet(k->h, w->h, k->mh) || is_nondet(k->c, w->c, k->mc))
            w->cls = CMP__T_NONDET;
        else if (w->m.within_tol)
            w->cls = CMP__T_WITHIN;
        else
            w->cls = CMP__T_DIVERGED;
        if (w->cls == CMP__T_DIVERGED && k->o->reference != CMP_REF_NONE)
            cmp__reference_judge(k, w);
        k->ncls[w->cls]++;
        k->nmixed += w->m.hash_alg_mixed;
        if (w->h->phase == CMP__PH_INIT && w->cls != CMP__T_IDENTICAL)
            k->params_differed = true;
    }
    return 0;
}

/* The first divergence and the first introduced error, in head execution
 * order, through an index of the pairs by module call. */
static int find_origins(struct cmp__cellcmp *k)
{
    k->grp = malloc((k->nrows + 1) * sizeof(*k->grp));
    if (k->grp == NULL)
        return -ENOMEM;
    for (size_t r = 0; r < k->nrows; r++)
        k->grp[r] = (struct cmp__rowix){k->rows[r].h, r};
    qsort(k->grp, k->nrows, sizeof(*k->grp), gidx_cmp);

    for (size_t r = 0; r < k->nrows && k->first_intro == NULL; r++) {
        if (k->rows[r].cls != CMP__T_DIVERGED)
            continue;
        bool first = k->first_div == NULL;
        if (first)
            k->first_div = &k->rows[r];
        if (introduces(k->rows, k->grp, k->nrows, r, first))
            k->first_intro = &k->rows[r];
    }
    return 0;
}

/* The status, in order of precedence: a side that its host could not run
 * says nothing about the change, whatever the other side did. */
static void cell_status(struct cmp__cellcmp *k)
{
    const struct cmp_cell *c = k->c, *h = k->h;
    k->why = NULL;
    if (c->host_missing || h->host_missing) {
        k->st = CMP__C_NOT_RUN;
        k->why = !h->host_missing ? "control_host" : !c->host_missing ? "head_host" : "both_hosts";
    } else if (!cmp__outcome_is(c, CELL_OK)) {
        k->st = CMP__C_INCOMPARABLE;
        k->why = "control_outcome";
    } else if (!cmp__outcome_is(h, CELL_OK)) {
        k->st = CMP__C_INCOMPARABLE;
        k->why = "head_outcome";
    } else if (k->dev_refused) {
        k->st = CMP__C_INCOMPARABLE;
        k->why = "device_mismatch";
    } else if (c->n_recs == 0 || h->n_recs == 0) {
        k->st = CMP__C_INCOMPARABLE;
        k->why = "no_records";
    } else if (k->ncls[CMP__T_DIVERGED] > 0 || k->nmiss > 0 || k->nextra > 0) {
        k->st = CMP__C_DIVERGED;
    } else if (k->ncls[CMP__T_WITHIN] > 0) {
        k->st = CMP__C_WITHIN;
    } else if (k->ncls[CMP__T_NONDET] > 0) {
        k->st = CMP__C_NONDET;
    } else {
        k->st = CMP__C_IDENTICAL;
    }
}

/* The outcome change, and the cell's share of the result's counts. */
static void count_cell(struct cmp__cellcmp *k, struct cmp__counts *cnt)
{
    const struct cmp_cell *c = k->c, *h = k->h;
    k->oc = k->st == CMP__C_NOT_RUN ? "not_run" : outcome_change(c, h);
    cnt->cells++;
    /* Coverage the control had and the head's host lost. */
    cnt->lost_coverage +=
        k->st == CMP__C_NOT_RUN && !c->host_missing && cmp__outcome_is(c, CELL_OK);
    cnt->device_mismatches += k->dev_refused;
    cnt->status[k->st]++;
    if (strcmp(k->oc, "regression") == 0)
        cnt->outcome_regressions++;
    else if (strcmp(k->oc, "fix") == 0)
        cnt->outcome_fixes++;
    if (k->perf.verdict == CMP_PERF_REGRESSION)
        cnt->perf_regressions++;
    else if (k->perf.verdict == CMP_PERF_IMPROVEMENT)
        cnt->perf_improvements++;
    cnt->perf_unknown += k->perf.verdict == CMP_PERF_UNKNOWN;
    cnt->perf_unstable += k->perf.verdict == CMP_PERF_UNSTABLE;
    cnt->perf_same += k->perf.verdict == CMP_PERF_SAME;
}

/*
 * Compares one matched cell pair and appends its object to cells (see the
 * file comment for the stages; the object is engine_json.c's).
 */
int cmp__compare_cell(const struct cmp_cell *c, const struct cmp_cell *h,
                      const struct cmp_options *o, bool cross, bool cross_mode,
                      struct cmp_scratch *s, json_t *cells, struct cmp__counts *cnt)
{
    struct cmp__cellcmp k = {.c = c, .h = h, .o = o, .cross = cross, .cross_mode = cross_mode};
    json_t *cj = NULL;
    int rc = cellcmp_prepare(&k);
    if (rc < 0)
        goto out;
    merge_keys(&k);
    rc = cmp__align_ops(&k);
    if (rc < 0)
        goto out;
    check_devices(&k);
    rc = cmp__reference_prepare(&k);
    if (rc < 0)
        goto out;
    rc = judge_rows(&k, s);
    if (rc < 0)
        goto out;
    rc = find_origins(&k);
    if (rc < 0)
        goto out;
    cmp__op_origin(&k);
    cell_status(&k);
    rc = cmp__perf_cells(c, h, k.dev_refused, o, &k.perf);
    if (rc < 0)
        goto out;
    count_cell(&k, cnt);
    rc = cmp__cell_json(&k, &cj);
    if (rc < 0)
        goto out;
    rc = json_array_append_new(cells, cj) ? -ENOMEM : 0;
out:
    cellcmp_free(&k);
    return rc;
}
