/*
 * compare/opalign.c - per-op records paired by alignment, and an inserted or
 * removed op named as the origin of a divergence (docs/compare.md, "Ops one
 * side has and the other lacks").
 *
 * A per-op record's key counts the calls of its operator within the module
 * call (<module>.<call>.<phase>/op.<aten name>.<n>.<role>.<i>), so a head
 * that inserts an op of a name the module call already runs shifts the
 * count of every later call of that name: matched by key, the inserted op is
 * compared with the control's first call, and the control's last call is
 * left over. Where a module call's op keys differ between the sides (some
 * are missing or extra after the key merge), its op calls are aligned
 * instead: a longest common subsequence over the two sequences of op calls
 * in execution order, where two calls may pair only under one operator
 * name, and a pair scores more for the same output signature (count, dtypes
 * and shapes), more again for the same values (every output's content hash)
 * and a little for the same occurrence index (the key merge's answer where
 * nothing else decides). Paired calls pair their outputs by role and index;
 * calls left over are missing (removed in the head) or extra (inserted).
 *
 * A module call whose dynamic programme, (control's op calls + 1) x
 * (head's + 1), holds more than CMP__ALIGN_MAX_CELLS (2^22) cells is left
 * as the key merge paired it and counted in the cell's ops_unaligned.
 */
#include <errno.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "compare/engine_int.h"

/* The largest dynamic programme (op calls of the control x of the head). */
#define CMP__ALIGN_MAX_CELLS ((size_t)1 << 22)

/* A pair's score: the same operator, signature, values and index. */
enum { SC_OP = 8, SC_SIG = 4, SC_VAL = 2, SC_IDX = 1 };

/* One op call: its output records, consecutive in execution order. */
struct opcall {
    const struct cmp__rec **r;
    size_t n;
};

static bool is_op(const struct cmp__rec *r)
{
    return r->op != NULL && r->module != NULL;
}

/* The same module call and phase (both per-op records). */
static bool same_group(const struct cmp__rec *x, const struct cmp__rec *g)
{
    return is_op(x) && cmp__call_cmp(x, g) == 0;
}

/* The role and index part of a per-op key ("output.0"). */
static const char *out_suffix(const struct cmp__rec *r)
{
    struct cmp__opkey ok;
    return cmp__op_key(r->key, &ok) ? ok.role : r->key;
}

/* Splits RECS (one side of a group, in execution order) into op calls. */
static size_t split_calls(const struct cmp__rec **recs, size_t n, struct opcall *calls)
{
    size_t nc = 0;
    for (size_t i = 0; i < n; i++) {
        const struct cmp__rec *r = recs[i];
        struct opcall *last = nc ? &calls[nc - 1] : NULL;
        if (last && strcmp(last->r[0]->op, r->op) == 0 && last->r[0]->op_index == r->op_index) {
            last->n++;
        } else {
            calls[nc++] = (struct opcall){recs + i, 1};
        }
    }
    return nc;
}

static bool same_shape(const struct cmp__rec *x, const struct cmp__rec *y)
{
    if (x->dtype != y->dtype || x->ndim != y->ndim || strcmp(x->dtype_name, y->dtype_name) != 0)
        return false;
    for (int d = 0; d < x->ndim && d < CMP_MAX_NDIM; d++)
        if (x->shape[d] != y->shape[d])
            return false;
    return true;
}

static bool same_value(const struct cmp__rec *x, const struct cmp__rec *y)
{
    return x->hash != NULL && y->hash != NULL && strcmp(x->hash_alg, y->hash_alg) == 0 &&
           strcmp(x->hash, y->hash) == 0;
}

/* The score of pairing control call A with head call B; 0: they may not pair. */
static int pair_score(const struct opcall *a, const struct opcall *b)
{
    if (strcmp(a->r[0]->op, b->r[0]->op) != 0)
        return 0;
    int s = SC_OP;
    bool sig = a->n == b->n, val = a->n == b->n;
    for (size_t i = 0; sig && i < a->n; i++) {
        sig = strcmp(out_suffix(a->r[i]), out_suffix(b->r[i])) == 0 && same_shape(a->r[i], b->r[i]);
        val = val && same_value(a->r[i], b->r[i]);
    }
    if (sig)
        s += SC_SIG + (val ? SC_VAL : 0);
    if (a->r[0]->op_index == b->r[0]->op_index)
        s += SC_IDX;
    return s;
}

/* The working state of one cell pair's alignment. */
struct align {
    struct cmp__cellcmp *k;
    const struct cmp__rec **gc, **gh; /* one group's records of each side */
    size_t ngc, ngh;
    struct opcall *cc, *ch; /* its op calls */
    size_t ncc, nch;
    int32_t *dp;
    bool *used; /* the head call's outputs already paired */
};

/* Appends the outputs of paired calls A (control) and B (head): a pair by
 * role and index, the rest missing or extra. */
static void emit_pair(struct align *al, const struct opcall *a, const struct opcall *b)
{
    struct cmp__cellcmp *k = al->k;
    bool *used = al->used;
    memset(used, 0, b->n * sizeof(*used));
    if (strcmp(a->r[0]->key, b->r[0]->key) != 0)
        k->ops_realigned++;
    for (size_t i = 0; i < a->n; i++) {
        const char *sa = out_suffix(a->r[i]);
        size_t j = 0;
        while (j < b->n && (used[j] || strcmp(sa, out_suffix(b->r[j])) != 0))
            j++;
        if (j < b->n) {
            used[j] = true;
            k->rows[k->nrows++] = (struct cmp__row){.c = a->r[i], .h = b->r[j]};
        } else {
            k->missing[k->nmiss++] = a->r[i];
        }
    }
    for (size_t j = 0; j < b->n; j++)
        if (!used[j])
            k->extra[k->nextra++] = b->r[j];
}

static void emit_alone(const struct opcall *x, const struct cmp__rec **to, size_t *n)
{
    for (size_t i = 0; i < x->n; i++)
        to[(*n)++] = x->r[i];
}

/* The longest common subsequence of the group's op calls by score, then its
 * pairs and leftovers appended to the cell pair's rows, missing and extra. */
static void align_group(struct align *a)
{
    size_t m = a->ncc, n = a->nch, w = n + 1;
    int32_t *dp = a->dp;
    for (size_t j = 0; j <= n; j++)
        dp[j] = 0;
    for (size_t i = 1; i <= m; i++) {
        dp[i * w] = 0;
        for (size_t j = 1; j <= n; j++) {
            int32_t best =
                dp[(i - 1) * w + j] > dp[i * w + j - 1] ? dp[(i - 1) * w + j] : dp[i * w + j - 1];
            int s = pair_score(&a->cc[i - 1], &a->ch[j - 1]);
            if (s > 0 && dp[(i - 1) * w + j - 1] + s > best)
                best = dp[(i - 1) * w + j - 1] + s;
            dp[i * w + j] = best;
        }
    }
    struct cmp__cellcmp *k = a->k;
    size_t i = m, j = n;
    while (i > 0 || j > 0) {
        int s = i > 0 && j > 0 ? pair_score(&a->cc[i - 1], &a->ch[j - 1]) : 0;
        if (s > 0 && dp[i * w + j] == dp[(i - 1) * w + j - 1] + s) {
            emit_pair(a, &a->cc[--i], &a->ch[--j]);
        } else if (i > 0 && (j == 0 || dp[i * w + j] == dp[(i - 1) * w + j])) {
            emit_alone(&a->cc[--i], k->missing, &k->nmiss);
        } else {
            emit_alone(&a->ch[--j], k->extra, &k->nextra);
        }
    }
}

/* Moves G's per-op records of V (*N of them) to the end of TO (*NTO). */
static void take_from(const struct cmp__rec **v, size_t *n, const struct cmp__rec *g,
                      const struct cmp__rec **to, size_t *nto)
{
    size_t keep = 0;
    for (size_t r = 0; r < *n; r++)
        if (same_group(v[r], g))
            to[(*nto)++] = v[r];
        else
            v[keep++] = v[r];
    *n = keep;
}

/* Moves group G's per-op records out of the rows, missing and extra into
 * the alignment's arrays, in execution order. */
static void take_group(struct align *a, const struct cmp__rec *g)
{
    struct cmp__cellcmp *k = a->k;
    size_t keep = 0;
    a->ngc = a->ngh = 0;
    for (size_t r = 0; r < k->nrows; r++) {
        if (same_group(k->rows[r].c, g) && same_group(k->rows[r].h, g)) {
            a->gc[a->ngc++] = k->rows[r].c;
            a->gh[a->ngh++] = k->rows[r].h;
        } else {
            k->rows[keep++] = k->rows[r];
        }
    }
    k->nrows = keep;
    take_from(k->missing, &k->nmiss, g, a->gc, &a->ngc);
    take_from(k->extra, &k->nextra, g, a->gh, &a->ngh);
    qsort(a->gc, a->ngc, sizeof(*a->gc), cmp__rec_by_seq);
    qsort(a->gh, a->ngh, sizeof(*a->gh), cmp__rec_by_seq);
}

/* The per-op records that the key merge left on one side, by group. */
static int unpaired_ops(const struct cmp__cellcmp *k, const struct cmp__rec ***out, size_t *n)
{
    const struct cmp__rec **v = malloc((k->nmiss + k->nextra + 1) * sizeof(*v));
    if (v == NULL)
        return -ENOMEM;
    *n = 0;
    for (size_t i = 0; i < k->nmiss; i++)
        if (is_op(k->missing[i]))
            v[(*n)++] = k->missing[i];
    for (size_t i = 0; i < k->nextra; i++)
        if (is_op(k->extra[i]))
            v[(*n)++] = k->extra[i];
    qsort(v, *n, sizeof(*v), cmp__rec_by_group);
    *out = v;
    return 0;
}

static int realign(struct align *a, const struct cmp__rec *g)
{
    take_group(a, g);
    a->ncc = split_calls(a->gc, a->ngc, a->cc);
    a->nch = split_calls(a->gh, a->ngh, a->ch);
    size_t cells = (a->ncc + 1) * (a->nch + 1);
    if (cells > CMP__ALIGN_MAX_CELLS) {
        a->k->ops_unaligned++;
        return 1;
    }
    free(a->dp);
    a->dp = malloc(cells * sizeof(*a->dp));
    if (a->dp == NULL)
        return -ENOMEM;
    align_group(a);
    return 0;
}

/* Puts a group the alignment declined back as the key merge paired it. */
static void restore_keys(struct align *a)
{
    struct cmp__cellcmp *k = a->k;
    size_t i = 0, j = 0;
    qsort(a->gc, a->ngc, sizeof(*a->gc), cmp__rec_by_key);
    qsort(a->gh, a->ngh, sizeof(*a->gh), cmp__rec_by_key);
    while (i < a->ngc || j < a->ngh) {
        int c = i == a->ngc ? 1 : j == a->ngh ? -1 : strcmp(a->gc[i]->key, a->gh[j]->key);
        if (c < 0)
            k->missing[k->nmiss++] = a->gc[i++];
        else if (c > 0)
            k->extra[k->nextra++] = a->gh[j++];
        else
            k->rows[k->nrows++] = (struct cmp__row){.c = a->gc[i++], .h = a->gh[j++]};
    }
}

int cmp__align_ops(struct cmp__cellcmp *k)
{
    const struct cmp__rec **todo = NULL;
    size_t ntodo = 0;
    int rc = unpaired_ops(k, &todo, &ntodo);
    size_t cap = k->c->n_recs + k->h->n_recs + 1;
    struct align a = {.k = k};
    if (rc < 0 || ntodo == 0)
        goto out;
    a.gc = malloc(cap * sizeof(*a.gc));
    a.gh = malloc(cap * sizeof(*a.gh));
    a.cc = malloc(cap * sizeof(*a.cc));
    a.ch = malloc(cap * sizeof(*a.ch));
    a.used = malloc(cap * sizeof(*a.used));
    rc = -ENOMEM;
    if (a.gc == NULL || a.gh == NULL || a.cc == NULL || a.ch == NULL || a.used == NULL)
        goto out;
    for (size_t t = 0; t < ntodo; t++) {
        if (t > 0 && cmp__call_cmp(todo[t], todo[t - 1]) == 0)
            continue;
        rc = realign(&a, todo[t]);
        if (rc < 0)
            goto out;
        if (rc > 0)
            restore_keys(&a);
    }
    rc = 0;
    cmp__rows_in_order(k);
out:
    free(todo);
    free(a.gc);
    free(a.gh);
    free(a.cc);
    free(a.ch);
    free(a.dp);
    free(a.used);
    return rc;
}

/* ------------------------------------------------------- the op's origin */

/*
 * Is X, a per-op record one side has alone, the origin of divergence D (that
 * side's record of the first diverged pair)? It must come before D in that
 * side's execution order and either run in D's module call and phase
 * ("same_call") or have produced D's very value ("same_value": the diverged
 * record is the inserted op's result, passed on).
 */
static const char *origin_link(const struct cmp__rec *x, const struct cmp__rec *d)
{
    if (x->seq >= d->seq)
        return NULL;
    if (same_value(x, d))
        return "same_value";
    if (d->module != NULL && same_group(x, d))
        return "same_call";
    return NULL;
}

/* The latest linked record of V (one side's leftovers) before D. */
static const struct cmp__rec *latest_origin(const struct cmp__rec *const *v, size_t n,
                                            const struct cmp__rec *d, const char **link)
{
    const struct cmp__rec *best = NULL;
    for (size_t i = 0; i < n; i++) {
        const char *l = is_op(v[i]) ? origin_link(v[i], d) : NULL;
        if (l != NULL && (best == NULL || v[i]->seq > best->seq)) {
            best = v[i];
            *link = l;
        }
    }
    return best;
}

void cmp__op_origin(struct cmp__cellcmp *k)
{
    const struct cmp__row *d = k->first_div;
    if (d == NULL)
        return;
    k->origin = latest_origin(k->extra, k->nextra, d->h, &k->origin_link);
    k->origin_inserted = k->origin != NULL;
    if (k->origin == NULL)
        k->origin = latest_origin(k->missing, k->nmiss, d->c, &k->origin_link);
}

int cmp__op_origin_json(const struct cmp__cellcmp *k, json_t *cj)
{
    const struct cmp__rec *x = k->origin;
    if (x == NULL)
        return cmp__set(cj, "op_origin", json_null());
    json_t *o =
        json_pack("{s:s, s:s, s:I, s:s, s:I, s:s, s:s, s:I, s:s, s:s}", "kind",
                  k->origin_inserted ? "inserted" : "removed", "key", x->key, "seq",
                  (json_int_t)x->seq, "module", x->module, "call", (json_int_t)x->call, "phase",
                  cmp__phase_name(x->phase), "op", x->op, "op_index", (json_int_t)x->op_index,
                  "link", k->origin_link, "divergence_key", k->first_div->h->key);
    return cmp__set(cj, "op_origin", o);
}
