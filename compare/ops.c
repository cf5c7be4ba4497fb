/*
 * compare/ops.c - per-op records and the first non-finite origin.
 *
 * A cell captured at granularity op (docs/runner.md, "Per-op capture") has,
 * besides its module records, one record per ATen operator result, keyed
 * <module>.<call>.<phase>/op.<aten name>.<n>.<role>.<index>. They match and
 * diverge like any other record; this file only reads their keys.
 *
 * The first non-finite origin answers "where did the NaN come from?" from
 * one side's records alone, so a single job's report can say it too: in
 * execution order, the first record holding a NaN or an Inf that is the
 * result of its module call (an output, a grad_input, an op's result) while
 * every input of that call was finite. With per-op records that is the op;
 * without, the innermost module, whose output is recorded before its
 * parents'.
 */
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "compare/cmp_int.h"

static bool digits(const char *s, size_t n, int64_t *v)
{
    int64_t x = 0;
    if (n == 0 || n > 18)
        return false;
    for (size_t i = 0; i < n; i++) {
        if (s[i] < '0' || s[i] > '9')
            return false;
        x = x * 10 + (s[i] - '0');
    }
    *v = x;
    return true;
}

/* The last '.' in s[0..n), or NULL. */
static const char *last_dot(const char *s, size_t n)
{
    while (n > 0)
        if (s[--n] == '.')
            return s + n;
    return NULL;
}

/* The ".<n>." of "<name>.<n>.<word>" ending at END: D1 and D2, the last
 * two dots of S before END, with the number N between them and a name of
 * at least one byte before D1. */
static bool number_field(const char *s, const char *end, const char **d1, const char **d2,
                         int64_t *n)
{
    *d2 = last_dot(s, (size_t)(end - s));
    if (*d2 == NULL)
        return false;
    *d1 = last_dot(s, (size_t)(*d2 - s));
    return *d1 != NULL && *d1 != s && digits(*d1 + 1, (size_t)(*d2 - *d1 - 1), n);
}

bool cmp__op_key(const char *key, struct cmp__opkey *out)
{
    const char *mark = strstr(key, "/op.");
    if (mark == NULL)
        return false;
    /* <module>.<call>.<phase> before the mark */
    const char *d1, *d2;
    if (!number_field(key, mark, &d1, &d2, &out->call))
        return false;
    out->module_len = (size_t)(d1 - key);
    out->phase = d2 + 1;
    out->phase_len = (size_t)(mark - d2 - 1);
    /* <aten name>.<n>.<role>.<index> after it, read from the right */
    const char *tail = mark + 4, *end = tail + strlen(tail);
    const char *e3 = last_dot(tail, (size_t)(end - tail));
    int64_t index;
    if (e3 == NULL || !digits(e3 + 1, (size_t)(end - e3 - 1), &index))
        return false;
    const char *e1, *e2;
    if (!number_field(tail, e3, &e1, &e2, &out->op_index))
        return false;
    out->op = tail;
    out->op_len = (size_t)(e1 - tail);
    out->role = e2 + 1;
    out->role_len = (size_t)(e3 - e2 - 1);
    return out->phase_len > 0 && out->role_len > 0;
}

/* ------------------------------------------------------- first non-finite */

static bool nonfinite(const struct cmp__rec *r)
{
    return r->stats.nan > 0 || r->stats.pinf > 0 || r->stats.ninf > 0;
}

int cmp__rec_by_seq(const void *a, const void *b)
{
    const struct cmp__rec *x = *(const struct cmp__rec *const *)a;
    const struct cmp__rec *y = *(const struct cmp__rec *const *)b;
    return (x->seq > y->seq) - (x->seq < y->seq);
}

int cmp__call_cmp(const struct cmp__rec *x, const struct cmp__rec *y)
{
    int c = strcmp(x->module, y->module);
    if (c)
        return c;
    if (x->call != y->call)
        return (x->call > y->call) - (x->call < y->call);
    return (int)x->phase - (int)y->phase;
}

/* Module call, then phase, then execution order. */
int cmp__rec_by_group(const void *a, const void *b)
{
    int c = cmp__call_cmp(*(const struct cmp__rec *const *)a, *(const struct cmp__rec *const *)b);
    return c ? c : cmp__rec_by_seq(a, b);
}

/* The role that feeds a call in this phase, and the role of its results. */
static bool roles_of(enum cmp__phase ph, enum cmp__role *in, enum cmp__role *res)
{
    if (ph == CMP__PH_FORWARD) {
        *in = CMP__ROLE_INPUT;
        *res = CMP__ROLE_OUTPUT;
        return true;
    }
    if (ph == CMP__PH_BACKWARD) {
        *in = CMP__ROLE_GRAD_OUTPUT;
        *res = CMP__ROLE_GRAD_INPUT;
        return true;
    }
    return false;
}

/*
 * Whether every input record of r's module call is finite; *n_inputs is how
 * many there were. grp holds the cell's records with a module, cmp__rec_by_group.
 */
static bool inputs_finite(const struct cmp__rec *const *grp, size_t ng, const struct cmp__rec *r,
                          enum cmp__role in, size_t *n_inputs)
{
    size_t lo = 0, hi = ng;
    struct cmp__rec probe = *r;
    const struct cmp__rec *pp = &probe;
    probe.seq = INT64_MIN;
    while (lo < hi) {
        size_t mid = lo + (hi - lo) / 2;
        if (cmp__rec_by_group(&grp[mid], &pp) < 0)
            lo = mid + 1;
        else
            hi = mid;
    }
    *n_inputs = 0;
    for (size_t g = lo; g < ng; g++) {
        const struct cmp__rec *q = grp[g];
        if (strcmp(q->module, r->module) != 0 || q->call != r->call || q->phase != r->phase)
            break;
        if (q->role != in || q->op != NULL)
            continue;
        (*n_inputs)++;
        if (nonfinite(q))
            return false;
    }
    return true;
}

static json_t *origin_json(const struct cmp__rec *r, const char *inputs)
{
    json_t *o =
        json_pack("{s:s, s:I, s:s?, s:I, s:s, s:s, s:s?, s:I, s:I, s:I, s:s}", "key", r->key, "seq",
                  (json_int_t)r->seq, "module", r->module, "call", (json_int_t)r->call, "phase",
                  cmp__phase_name(r->phase), "role", cmp__role_name(r->role), "op", r->op, "nan",
                  (json_int_t)r->stats.nan, "pinf", (json_int_t)r->stats.pinf, "ninf",
                  (json_int_t)r->stats.ninf, "inputs", inputs);
    if (o != NULL && r->op != NULL &&
        json_object_set_new(o, "op_index", json_integer((json_int_t)r->op_index))) {
        json_decref(o);
        return NULL;
    }
    return o;
}

int cmp__first_nonfinite(const struct cmp_cell *cell, json_t **out)
{
    const struct cmp__rec **seq = NULL, **grp = NULL, *first = NULL, *origin = NULL;
    const char *why = NULL;
    size_t ng = 0;
    int rc = -ENOMEM;

    *out = NULL;
    seq = malloc((cell->n_recs + 1) * sizeof(*seq));
    grp = malloc((cell->n_recs + 1) * sizeof(*grp));
    if (seq == NULL || grp == NULL)
        goto out;
    for (size_t i = 0; i < cell->n_recs; i++) {
        seq[i] = &cell->recs[i];
        if (cell->recs[i].module != NULL)
            grp[ng++] = &cell->recs[i];
    }
    qsort(seq, cell->n_recs, sizeof(*seq), cmp__rec_by_seq);
    qsort(grp, ng, sizeof(*grp), cmp__rec_by_group);

    for (size_t i = 0; i < cell->n_recs && origin == NULL; i++) {
        const struct cmp__rec *r = seq[i];
        enum cmp__role in, res;
        size_t n_in = 0;
        if (!nonfinite(r))
            continue;
        if (first == NULL)
            first = r;
        if (r->module == NULL || !roles_of(r->phase, &in, &res) || r->role != res)
            continue;
        if (!inputs_finite(grp, ng, r, in, &n_in))
            continue;
        /* A call whose inputs were not captured can only be the origin when
         * nothing before it was non-finite. */
        if (n_in == 0 && first != r)
            continue;
        origin = r;
        why = n_in > 0 ? "finite" : "not_captured";
    }
    rc = 0;
    if (origin != NULL)
        *out = origin_json(origin, why);
    else if (first != NULL) /* non-finite from the start: an input or a parameter */
        *out = origin_json(first, "nonfinite");
    if ((origin != NULL || first != NULL) && *out == NULL)
        rc = -ENOMEM;
out:
    free(seq);
    free(grp);
    return rc;
}
