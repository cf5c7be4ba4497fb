/*
 * api/api_filter.c - a comparison's filters (model, width, pass, and the two
 * widths of a cross-width comparison) checked before anything is compared.
 *
 * A filter is an fnmatch pattern over the cells of both jobs. One that
 * matches no cell used to give "pass, 0 cells compared", and a CI gate with
 * a typo in its filter passed forever. Now a width that is not in the width
 * table (daemon/cpu/widths.h), or a value no cell of the compared jobs has, is
 * a 400 that names the filter, the values that exist and, when one matches
 * but for case or punctuation ("MLP", "avx-2"), suggests it. A comparison
 * that still pairs zero cells (filters that each match, but no cell both)
 * is a 400 too: see api_no_cells.
 */
#include <ctype.h>
#include <fnmatch.h>
#include <stdio.h>
#include <string.h>

#include "api/api_int.h"
#include "daemon/cpu/widths.h"

/* Longest list of values quoted in a message; the rest is counted. */
#define FILTER_LIST_MAX 600

static bool is_glob(const char *v)
{
    return strpbrk(v, "*?[") != NULL;
}

/* Equal but for case and the separators people swap (- _ . space). */
static bool loose_eq(const char *a, const char *b)
{
    for (;;) {
        while (*a && !isalnum((unsigned char)*a))
            a++;
        while (*b && !isalnum((unsigned char)*b))
            b++;
        if (!*a || !*b)
            return !*a && !*b;
        if (tolower((unsigned char)*a++) != tolower((unsigned char)*b++))
            return false;
    }
}

/* "a, b, c" into BUF; past FILTER_LIST_MAX the rest is "and N more". */
static void join(json_t *vals, char *buf, size_t cap)
{
    size_t i, n = 0;
    json_t *v;
    buf[0] = 0;
    json_array_foreach(vals, i, v)
    {
        const char *s = json_string_value(v);
        if (n + strlen(s) + 40 > cap) {
            snprintf(buf + n, cap - n, "%sand %zu more", i ? ", " : "", json_array_size(vals) - i);
            return;
        }
        n += (size_t)snprintf(buf + n, cap - n, "%s%s", i ? ", " : "", s);
    }
    if (!json_array_size(vals))
        snprintf(buf, cap, "none");
}

/* "; did you mean X?" for the first value of VALS loosely equal to V. */
static void suggest(json_t *vals, const char *v, char *buf, size_t cap)
{
    size_t i;
    json_t *c;
    buf[0] = 0;
    json_array_foreach(vals, i, c)
    {
        if (loose_eq(json_string_value(c), v)) {
            snprintf(buf, cap, "; did you mean %s?", json_string_value(c));
            return;
        }
    }
}

static json_t *table_widths(void)
{
    json_t *out = json_array();
    size_t i;
    json_t *w;
    json_array_foreach(json_object_get(widths_table(), "widths"), i, w)
    {
        json_array_append(out, json_object_get(w, "name"));
    }
    return out;
}

static bool any_match(json_t *vals, const char *pat)
{
    size_t i;
    json_t *v;
    json_array_foreach(vals, i, v)
    {
        if (fnmatch(pat, json_string_value(v), 0) == 0)
            return true;
    }
    return false;
}

bool api_in_list(json_t *list, const char *s)
{
    size_t i;
    json_t *v;
    json_array_foreach(list, i, v)
    {
        if (strcmp(json_string_value(v), s) == 0)
            return true;
    }
    return false;
}

/* The union of DIM's values over both jobs (sorted, distinct), or NULL
 * with the reply made. */
static json_t *job_values(struct api_req *r, struct store *s, json_t *ctl, json_t *head,
                          const char *dim, enum MHD_Result *ret)
{
    json_t *a = NULL, *b = NULL, *out = NULL;
    int rc = store_job_cell_values(s, json_string_value(json_object_get(ctl, "id")), &a);
    if (!rc && head != ctl)
        rc = store_job_cell_values(s, json_string_value(json_object_get(head, "id")), &b);
    if (rc) {
        *ret = api_store_error(r, rc, "job");
        goto out;
    }
    out = json_incref(json_object_get(a, dim));
    size_t i;
    json_t *v;
    json_array_foreach(json_object_get(b, dim), i, v)
    {
        if (!api_in_list(out, json_string_value(v)))
            json_array_append(out, v);
    }
out:
    json_decref(a);
    json_decref(b);
    return out;
}

/* One filter: replies and returns false when it cannot match a cell. */
static bool check_one(struct api_req *r, struct store *s, json_t *ctl, json_t *head,
                      const struct api_filter *f, enum MHD_Result *ret)
{
    char list[FILTER_LIST_MAX], hint[160];
    bool ok = false;
    json_t *vals = NULL, *table = NULL;
    if (strcmp(f->dim, "width") == 0 && !is_glob(f->value)) {
        table = table_widths();
        if (!any_match(table, f->value)) {
            join(table, list, sizeof list);
            suggest(table, f->value, hint, sizeof hint);
            *ret = api_error(r, 400, "unknown_width", f->field,
                             "%s '%s' is not a width of the width table (%s)%s", f->field, f->value,
                             list, hint);
            goto out;
        }
    }
    if (!(vals = job_values(r, s, ctl, head, f->dim, ret)))
        goto out;
    if (!any_match(vals, f->value)) {
        join(vals, list, sizeof list);
        suggest(vals, f->value, hint, sizeof hint);
        *ret = api_error(r, 400, "no_match", f->field,
                         "%s '%s' matches no cell of %s (their %s: %s)%s", f->field, f->value,
                         ctl == head ? "the job" : "the two jobs",
                         strcmp(f->dim, "pass") == 0    ? "passes"
                         : strcmp(f->dim, "model") == 0 ? "models"
                                                        : "widths",
                         list, hint);
        goto out;
    }
    ok = true;
out:
    json_decref(vals);
    json_decref(table);
    return ok;
}

bool api_filters_refused(struct api_req *r, struct store *s, json_t *ctl, json_t *head,
                         const struct api_filter *f, size_t n, enum MHD_Result *ret)
{
    for (size_t i = 0; i < n; i++) {
        if (f[i].value && *f[i].value && !check_one(r, s, ctl, head, &f[i], ret))
            return true;
    }
    return false;
}

enum MHD_Result api_no_cells(struct api_req *r, json_t *result, const struct api_filter *f,
                             size_t n)
{
    char what[400] = "";
    size_t len = 0;
    for (size_t i = 0; i < n && len < sizeof what - 1; i++) {
        if (f[i].value && *f[i].value)
            len += (size_t)snprintf(what + len, sizeof what - len, "%s%s=%s", len ? " " : "",
                                    f[i].field, f[i].value);
    }
    json_t *c = json_object_get(result, "counts");
    return api_error(r, 400, "no_cells", NULL,
                     "the comparison paired no cell (%s; %lld cells only in the control, %lld "
                     "only in the head): a gate never passes on nothing",
                     len ? what : "no filters",
                     (long long)json_integer_value(json_object_get(c, "missing_cells")),
                     (long long)json_integer_value(json_object_get(c, "extra_cells")));
}
