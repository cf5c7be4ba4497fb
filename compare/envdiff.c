/*
 * compare/envdiff.c - the result's "environment" section and its block in the
 * reports (docs/compare.md, "Environment").
 *
 * The engine names every matched cell pair; the pairs are reduced to the
 * distinct (control fingerprint, head fingerprint) pairs, each is diffed once
 * by a merge of the two name-sorted field lists, and equal differences of
 * different pairs are folded into one entry that counts its cells. Entries
 * are ordered by group, then by rank within the group (environment.c's rule
 * table), then by name and values, so the same two sides always give the
 * same section.
 */
#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "compare/cmp_int.h"

#define BLOCK_MAX         8192 /* bytes of the rendered block */
#define BLOCK_ITEMS       12   /* difference lines in the block; the rest is counted */
#define BLOCK_GROUP_FIRST 2    /* lines each group is sure of, before the rest fill up */
#define BLOCK_PREMISE     3    /* broken-premise lines in the block */
#define BLOCK_VALUE       100  /* bytes of a value shown in the block */
#define PREMISE_SHOWN     4    /* distinct values listed per inconsistent field */
#define PREMISE_VALUE_MAX 512  /* bytes of such a value in the result */

struct pair {
    const struct cmp__fp *c, *h;
};

struct cmp__env {
    struct pair *p;
    size_t n, cap;
    int64_t without; /* pairs where a side has no fingerprint */
};

/* One difference: c or h is NULL when the field is on one side only. */
struct diff {
    const struct cmp__envf *c, *h;
    int64_t cells;
};

int cmp__env_new(struct cmp__env **out)
{
    *out = calloc(1, sizeof(**out));
    return *out ? 0 : -ENOMEM;
}

void cmp__env_free(struct cmp__env *env)
{
    if (env == NULL)
        return;
    free(env->p);
    free(env);
}

int cmp__env_pair(struct cmp__env *env, const struct cmp_cell *control, const struct cmp_cell *head)
{
    if (control->fp == NULL || head->fp == NULL) {
        env->without++;
        return 0;
    }
    int rc = cmp__grow((void **)&env->p, &env->cap, env->n + 1, sizeof(*env->p), SIZE_MAX / 2);
    if (rc)
        return rc;
    env->p[env->n++] = (struct pair){control->fp, head->fp};
    return 0;
}

/* ------------------------------------------------------------- diffing */

static int pair_cmp(const void *a, const void *b)
{
    const struct pair *x = a, *y = b;
    if (x->c->id != y->c->id)
        return x->c->id < y->c->id ? -1 : 1;
    if (x->h->id != y->h->id)
        return x->h->id < y->h->id ? -1 : 1;
    return 0;
}

static const struct cmp__envf *either(const struct diff *d)
{
    return d->c ? d->c : d->h;
}

static int nullstr_cmp(const struct cmp__envf *x, const struct cmp__envf *y)
{
    if (x == NULL || y == NULL)
        return (x != NULL) - (y != NULL);
    return strcmp(x->value, y->value);
}

static int diff_cmp(const void *a, const void *b)
{
    const struct diff *x = a, *y = b;
    const struct cmp__envf *fx = either(x), *fy = either(y);
    if (fx->group != fy->group)
        return fx->group < fy->group ? -1 : 1;
    if (fx->order != fy->order)
        return fx->order < fy->order ? -1 : 1;
    int c = strcmp(fx->name, fy->name);
    if (c)
        return c;
    c = nullstr_cmp(x->c, y->c);
    return c ? c : nullstr_cmp(x->h, y->h);
}

struct diffs {
    struct diff *v;
    size_t n, cap;
};

static int push(struct diffs *d, const struct cmp__envf *c, const struct cmp__envf *h, int64_t m)
{
    int rc = cmp__grow((void **)&d->v, &d->cap, d->n + 1, sizeof(*d->v), SIZE_MAX / 2);
    if (rc)
        return rc;
    d->v[d->n++] = (struct diff){c, h, m};
    return 0;
}

/* The fields of c and h that differ, merged by name; m cells share the pair. */
static int diff_pair(const struct cmp__fp *c, const struct cmp__fp *h, int64_t m, struct diffs *d)
{
    size_t i = 0, j = 0;
    int rc = 0;
    while (rc == 0 && (i < c->n || j < h->n)) {
        int k = i == c->n ? 1 : j == h->n ? -1 : strcmp(c->f[i].name, h->f[j].name);
        if (k < 0)
            rc = push(d, &c->f[i++], NULL, m);
        else if (k > 0)
            rc = push(d, NULL, &h->f[j++], m);
        else if (strcmp(c->f[i].value, h->f[j].value) != 0)
            rc = push(d, &c->f[i++], &h->f[j++], m);
        else
            i++, j++;
    }
    return rc;
}

/* Every difference of every distinct pair, sorted, equal ones folded. */
static int collect(const struct cmp__env *env, struct diffs *d)
{
    struct pair *p = malloc((env->n + 1) * sizeof(*p));
    int rc = 0;
    if (p == NULL)
        return -ENOMEM;
    if (env->n > 0) { /* env->p is NULL while no pair was added */
        memcpy(p, env->p, env->n * sizeof(*p));
        qsort(p, env->n, sizeof(*p), pair_cmp);
    }
    for (size_t i = 0; i < env->n && rc == 0;) {
        size_t j = i;
        while (j < env->n && pair_cmp(&p[i], &p[j]) == 0)
            j++;
        rc = diff_pair(p[i].c, p[i].h, (int64_t)(j - i), d);
        i = j;
    }
    free(p);
    if (rc < 0)
        return rc;
    if (d->n > 0)
        qsort(d->v, d->n, sizeof(*d->v), diff_cmp);
    size_t w = 0;
    for (size_t r = 0; r < d->n; r++) {
        if (w > 0 && diff_cmp(&d->v[w - 1], &d->v[r]) == 0)
            d->v[w - 1].cells += d->v[r].cells;
        else
            d->v[w++] = d->v[r];
    }
    d->n = w;
    return 0;
}

static int by_str(const void *a, const void *b)
{
    return strcmp(*(const char *const *)a, *(const char *const *)b);
}

/* How many distinct field names the fingerprints of the pairs hold. */
static int count_fields(const struct cmp__env *env, int64_t *out)
{
    size_t total = 0, n = 0;
    const struct cmp__fp **fps = malloc((2 * env->n + 1) * sizeof(*fps));
    if (fps == NULL)
        return -ENOMEM;
    for (size_t i = 0; i < env->n; i++) {
        bool seen_c = false, seen_h = false;
        for (size_t k = 0; k < n; k++) {
            seen_c |= fps[k] == env->p[i].c;
            seen_h |= fps[k] == env->p[i].h;
        }
        if (!seen_c)
            fps[n++] = env->p[i].c, total += env->p[i].c->n;
        if (!seen_h && env->p[i].h != env->p[i].c)
            fps[n++] = env->p[i].h, total += env->p[i].h->n;
    }
    const char **names = malloc((total + 1) * sizeof(*names));
    if (names == NULL) {
        free(fps);
        return -ENOMEM;
    }
    size_t m = 0;
    for (size_t k = 0; k < n; k++)
        for (size_t f = 0; f < fps[k]->n; f++)
            names[m++] = fps[k]->f[f].name;
    qsort(names, m, sizeof(*names), by_str);
    int64_t u = 0;
    for (size_t k = 0; k < m; k++)
        u += k == 0 || strcmp(names[k], names[k - 1]) != 0;
    free(names);
    free(fps);
    *out = u;
    return 0;
}

/* ---------------------------------------------------------------- JSON */

/* The words of a that b lacks, space-joined (both sorted flag lists). */
static char *only_in(const char *a, const char *b)
{
    size_t n = strlen(a), o = 0;
    char *out = malloc(n + 1);
    if (out == NULL)
        return NULL;
    out[0] = '\0';
    for (const char *w = a; *w;) {
        size_t wl = strcspn(w, " ");
        bool found = false;
        for (const char *x = b; *x && !found;) {
            size_t xl = strcspn(x, " ");
            found = xl == wl && strncmp(x, w, wl) == 0;
            x += xl + (x[xl] == ' ');
        }
        if (!found)
            o += (size_t)snprintf(out + o, n + 1 - o, "%s%.*s", o ? " " : "", (int)wl, w);
        w += wl + (w[wl] == ' ');
    }
    return out;
}

static json_t *value_json(const struct cmp__envf *f)
{
    return f ? json_string(f->value) : json_null();
}

/*
 * One entry. A secret says "changed" and nothing else; two CPU flag lists
 * say which flags each side has that the other lacks.
 */
static json_t *diff_json(const struct diff *d)
{
    const struct cmp__envf *f = either(d);
    json_t *o = json_object();
    int e = 0;
    if (o == NULL)
        return NULL;
    e |= cmp__set(o, "group", json_string(cmp__env_group_names[f->group]));
    e |= cmp__set(o, "field", json_string(f->name));
    e |= cmp__set(o, "change",
                  json_string(d->c == NULL   ? "added"
                              : d->h == NULL ? "removed"
                                             : "changed"));
    if ((d->c && d->c->secret) || (d->h && d->h->secret)) {
        e |= cmp__set(o, "redacted", json_true());
    } else if (d->c && d->h && strcmp(f->name, "cpu.flags") == 0) {
        char *oc = only_in(d->c->value, d->h->value), *oh = only_in(d->h->value, d->c->value);
        e |= cmp__set(o, "control", oc ? json_string(oc) : NULL);
        e |= cmp__set(o, "head", oh ? json_string(oh) : NULL);
        e |= cmp__set(o, "detail", json_string("flags on one side only"));
        free(oc);
        free(oh);
    } else {
        e |= cmp__set(o, "control", value_json(d->c));
        e |= cmp__set(o, "head", value_json(d->h));
    }
    e |= cmp__set(o, "cells", json_integer(d->cells));
    return cmp__obj_or_null(o, e);
}

static json_t *cell_ref(const struct cmp_cell *c)
{
    return json_pack("{s:s, s:s, s:s, s:s}", "model", c->model, "width", c->width, "pass", c->pass,
                     "mode", c->mode);
}

/* A value as shown in an inconsistency: at most PREMISE_VALUE_MAX bytes. */
static json_t *premise_value(const struct cmp__envf *f)
{
    if (f == NULL)
        return json_null();
    size_t n = strlen(f->value);
    if (n <= PREMISE_VALUE_MAX)
        return json_string(f->value);
    while (n > PREMISE_VALUE_MAX || (n > 0 && ((unsigned char)f->value[n] & 0xC0) == 0x80))
        n--;
    return json_stringn(f->value, n);
}

/*
 * One premise field over the cells of one side: its distinct values, with
 * how many cells hold each and one of them. Appends an entry to arr when
 * there is more than one value. used/example are per fingerprint id.
 */
static int premise_field(const char *side, const char *name, const struct cmp_side *s,
                         const int64_t *used, const struct cmp_cell *const *example, json_t *arr)
{
    const struct cmp__envf **val = malloc((s->n_fps + 1) * sizeof(*val));
    int64_t *cnt = calloc(s->n_fps + 1, sizeof(*cnt));
    size_t *first = malloc((s->n_fps + 1) * sizeof(*first));
    size_t k = 0;
    int rc = -ENOMEM;
    if (val == NULL || cnt == NULL || first == NULL)
        goto out;
    for (size_t i = 0; i < s->n_fps; i++) {
        if (used[i] == 0)
            continue;
        const struct cmp__envf *f = cmp__fp_field(s->fps[i], name);
        size_t v = 0;
        while (v < k && nullstr_cmp(val[v], f) != 0)
            v++;
        if (v == k) {
            val[k] = f;
            first[k++] = i;
        }
        cnt[v] += used[i];
    }
    rc = 0;
    if (k < 2)
        goto out;
    json_t *o = json_pack("{s:s, s:s}", "side", side, "field", name), *vs = json_array();
    int e = o == NULL || vs == NULL || cmp__set(o, "values", vs);
    for (size_t v = 0; v < k && v < PREMISE_SHOWN && !e; v++)
        e |= json_array_append_new(vs, json_pack("{s:o, s:I, s:o}", "value", premise_value(val[v]),
                                                 "cells", (json_int_t)cnt[v], "example",
                                                 cell_ref(example[first[v]])));
    e |= cmp__set(o, "values_omitted",
                  json_integer(k > PREMISE_SHOWN ? (json_int_t)(k - PREMISE_SHOWN) : 0));
    if (e || json_array_append_new(arr, o))
        rc = -ENOMEM;
out:
    free(val);
    free(cnt);
    free(first);
    return rc;
}

/* The within-side check over the cells of one side that took part. */
static int premise_side(const char *side, const struct cmp_cell *const *cells, size_t n,
                        json_t *arr)
{
    if (n == 0)
        return 0;
    const struct cmp_side *s = cells[0]->side;
    int64_t *used = calloc(s->n_fps + 1, sizeof(*used));
    const struct cmp_cell **example = calloc(s->n_fps + 1, sizeof(*example));
    int rc = -ENOMEM;
    if (used == NULL || example == NULL)
        goto out;
    for (size_t i = 0; i < n; i++) {
        const struct cmp__fp *fp = cells[i]->fp;
        if (fp == NULL)
            continue;
        if (used[fp->id]++ == 0)
            example[fp->id] = cells[i];
    }
    rc = 0;
    for (size_t f = 0; f < cmp__env_n_premise_fields && rc == 0; f++)
        rc = premise_field(side, cmp__env_premise_fields[f], s, used, example, arr);
out:
    free(used);
    free(example);
    return rc;
}

int cmp__env_result(const struct cmp__env *env, const struct cmp_cell *const *cc, size_t ncc,
                    const struct cmp_cell *const *hc, size_t nhc, json_t **out)
{
    struct diffs d = {0};
    int64_t fields = 0;
    json_t *o = json_object(), *list = json_array(), *inc = json_array();
    int rc = -ENOMEM;
    if (o == NULL || list == NULL || inc == NULL)
        goto out;
    if ((rc = collect(env, &d)) < 0 || (rc = count_fields(env, &fields)) < 0)
        goto out;
    if ((rc = premise_side("control", cc, ncc, inc)) < 0 ||
        (rc = premise_side("head", hc, nhc, inc)) < 0)
        goto out;
    rc = -ENOMEM;
    for (size_t i = 0; i < d.n && i < CMP_MAX_ENV_DIFFS; i++)
        if (json_array_append_new(list, diff_json(&d.v[i])))
            goto out;
    int e = 0;
    e |= cmp__set(o, "fields_compared", json_integer(fields));
    e |= cmp__set(o, "pairs_compared", json_integer((json_int_t)env->n));
    e |= cmp__set(o, "pairs_without_fingerprint", json_integer(env->without));
    e |= cmp__set(o, "premise", json_string(json_array_size(inc) ? "broken" : "ok"));
    e |= cmp__set(o, "inconsistent", inc);
    inc = NULL;
    e |= cmp__set(o, "differences", list);
    list = NULL;
    e |=
        cmp__set(o, "differences_omitted",
                 json_integer(d.n > CMP_MAX_ENV_DIFFS ? (json_int_t)(d.n - CMP_MAX_ENV_DIFFS) : 0));
    if (e)
        goto out;
    *out = o;
    o = NULL;
    rc = 0;
out:
    json_decref(o);
    json_decref(list);
    json_decref(inc);
    free(d.v);
    return rc;
}

/* --------------------------------------------------------------- report */

/* A fixed buffer: the block is short by design, so past BLOCK_MAX it just stops. */
struct out {
    char p[BLOCK_MAX];
    size_t len;
};

__attribute__((format(printf, 2, 3))) static void put(struct out *b, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(b->p + b->len, sizeof(b->p) - b->len, fmt, ap);
    va_end(ap);
    if (n > 0)
        b->len = b->len + (size_t)n < sizeof(b->p) ? b->len + (size_t)n : sizeof(b->p) - 1;
}

/*
 * A value on one line: at most BLOCK_VALUE bytes (cut on a UTF-8 boundary,
 * then "..."), line breaks as spaces, and in markdown no backtick that could
 * end the code span.
 */
static void put_value(struct out *b, const char *v, bool md)
{
    if (v == NULL) {
        put(b, "%s", md ? "*(not set)*" : "(not set)");
        return;
    }
    size_t n = strlen(v), cut = n;
    if (n > BLOCK_VALUE) {
        cut = BLOCK_VALUE;
        while (cut > 0 && ((unsigned char)v[cut] & 0xC0) == 0x80)
            cut--;
    }
    if (md)
        put(b, "`");
    for (size_t i = 0; i < cut; i++) {
        char ch = v[i];
        if (ch == '\n' || ch == '\r' || ch == '\t')
            ch = ' ';
        else if (md && ch == '`')
            ch = '\'';
        put(b, "%c", ch);
    }
    put(b, "%s%s", cut < n ? "..." : "", md ? "`" : "");
}

static void put_premise(struct out *b, const json_t *inc, bool md)
{
    size_t i, k;
    const json_t *x, *v;
    json_array_foreach(inc, i, x)
    {
        if (i == BLOCK_PREMISE) {
            put(b,
                md ? "- ... and %zu more inconsistencies\n"
                   : "  ... and %zu more inconsistencies\n",
                json_array_size(inc) - BLOCK_PREMISE);
            break;
        }
        const char *field = json_string_value(json_object_get(x, "field"));
        put(b,
            md ? "- **Broken premise:** %s cells disagree on `%s`: "
               : "  BROKEN PREMISE: %s cells disagree on %s: ",
            json_string_value(json_object_get(x, "side")), field ? field : "");
        json_array_foreach(json_object_get(x, "values"), k, v)
        {
            put(b, "%s", k ? ", " : "");
            put_value(b, json_string_value(json_object_get(v, "value")), md);
            put(b, " (%lld)", (long long)json_integer_value(json_object_get(v, "cells")));
        }
        put(b, "\n");
    }
}

static void put_diff(struct out *b, const json_t *d, int64_t pairs, bool md)
{
    const char *group = json_string_value(json_object_get(d, "group"));
    const char *field = json_string_value(json_object_get(d, "field"));
    put(b, md ? "- %s `%s`: " : "  %s %s: ", group ? group : "", field ? field : "");
    if (json_is_true(json_object_get(d, "redacted"))) {
        put(b, "changed (value not shown)");
    } else {
        put_value(b, json_string_value(json_object_get(d, "control")), md);
        put(b, " -> ");
        put_value(b, json_string_value(json_object_get(d, "head")), md);
        if (json_object_get(d, "detail"))
            put(b, " (%s)", json_string_value(json_object_get(d, "detail")));
    }
    int64_t cells = json_integer_value(json_object_get(d, "cells"));
    if (cells != pairs)
        put(b, " (%lld of %lld cells)", (long long)cells, (long long)pairs);
    put(b, "\n");
}

/*
 * Which of the N differences DIFFS the block shows, in SHOWN: the first
 * BLOCK_GROUP_FIRST of each group, so that a build whose configuration
 * differs in dozens of lines still shows its libraries, then the next ones
 * in the section's order, BLOCK_ITEMS in all. Returns how many.
 */
static size_t block_pick(const json_t *diffs, size_t n, bool shown[CMP_MAX_ENV_DIFFS])
{
    size_t picked = 0, in_group = 0, i;
    const char *group = "";
    const json_t *d;
    memset(shown, 0, CMP_MAX_ENV_DIFFS * sizeof(bool));
    json_array_foreach(diffs, i, d)
    {
        const char *g = json_string_value(json_object_get(d, "group"));
        g = g ? g : "";
        in_group = strcmp(g, group) == 0 ? in_group + 1 : 0;
        group = g;
        if (i < CMP_MAX_ENV_DIFFS && in_group < BLOCK_GROUP_FIRST && picked < BLOCK_ITEMS) {
            shown[i] = true;
            picked++;
        }
    }
    for (i = 0; i < n && i < CMP_MAX_ENV_DIFFS && picked < BLOCK_ITEMS; i++) {
        if (!shown[i]) {
            shown[i] = true;
            picked++;
        }
    }
    return picked;
}

/*
 * The "What else differs" block: broken premises first, then the
 * differences block_pick chose, in the section's order, then a count of the
 * rest, which the JSON holds. Nothing at all when the fingerprints agree.
 */
char *cmp__env_block(const json_t *env, bool md)
{
    const json_t *diffs = json_object_get(env, "differences");
    const json_t *inc = json_object_get(env, "inconsistent");
    int64_t omitted = json_integer_value(json_object_get(env, "differences_omitted"));
    size_t n = json_array_size(diffs), i;
    if (n == 0 && json_array_size(inc) == 0)
        return NULL;
    struct out *b = calloc(1, sizeof(*b));
    if (b == NULL)
        return NULL;
    int64_t pairs = json_integer_value(json_object_get(env, "pairs_compared"));
    int64_t total = (int64_t)n + omitted;
    if (md)
        put(b,
            "\n### What else differs\n\nBuild and environment, control -> head: %lld "
            "difference(s) among %lld fields compared (all under `environment` in the "
            "JSON).\n\n",
            (long long)total,
            (long long)json_integer_value(json_object_get(env, "fields_compared")));
    else
        put(b, "What else differs (control -> head, %lld difference(s) among %lld fields):\n",
            (long long)total,
            (long long)json_integer_value(json_object_get(env, "fields_compared")));
    put_premise(b, inc, md);
    bool shown[CMP_MAX_ENV_DIFFS];
    size_t picked = block_pick(diffs, n, shown);
    const json_t *d;
    json_array_foreach(diffs, i, d)
    {
        if (i < CMP_MAX_ENV_DIFFS && shown[i])
            put_diff(b, d, pairs, md);
    }
    if ((int64_t)picked < total)
        put(b, md ? "- ... and %lld more\n" : "  ... and %lld more (environment in the JSON)\n",
            (long long)(total - (int64_t)picked));
    char *s = strdup(b->p);
    free(b);
    return s;
}
