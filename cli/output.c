/*
 * cli/output.c - tables and text for people. Everything printed from a
 * server reply passes through ctl_clean() first: a reason string written
 * by a runner must not be able to move the cursor of a reviewer's terminal.
 */
#include <stdlib.h>
#include <string.h>

#include "cli/capctl.h"

#define CTL_TABLE_MAX_ROWS 100000
#define CTL_TABLE_MAX_COLS 8

const char *ctl_clean(const char *s, char *buf, size_t cap)
{
    size_t o = 0;
    if (!s)
        s = "-";
    for (; *s && o + 1 < cap; s++) {
        unsigned char ch = (unsigned char)*s;
        buf[o++] = ch < 0x20 || ch == 0x7f ? '?' : (char)ch;
    }
    buf[o] = 0;
    return buf;
}

void ctl_or_list(const char *const *words, char *buf, size_t cap)
{
    size_t n = 0;
    buf[0] = 0;
    for (const char *const *w = words; *w && n < cap; w++) {
        const char *sep = w == words ? "" : w[1] ? ", " : " or ";
        int k = snprintf(buf + n, cap - n, "%s%s", sep, *w);
        n += k > 0 ? (size_t)k : 0;
    }
}

const char *ctl_jstr(json_t *o, const char *k)
{
    const char *s = json_string_value(json_object_get(o, k));
    return s ? s : "-";
}

const char *ctl_jtext(json_t *v, char *buf, size_t cap)
{
    if (json_is_string(v))
        return ctl_clean(json_string_value(v), buf, cap);
    if (json_is_integer(v))
        snprintf(buf, cap, "%lld", (long long)json_integer_value(v));
    else if (json_is_real(v))
        snprintf(buf, cap, "%g", json_real_value(v));
    else if (json_is_true(v))
        snprintf(buf, cap, "true");
    else if (json_is_false(v))
        snprintf(buf, cap, "false");
    else
        snprintf(buf, cap, "-");
    return buf;
}

void ctl_duration(json_t *ms, char *buf, size_t cap)
{
    if (!json_is_integer(ms)) {
        snprintf(buf, cap, "-");
        return;
    }
    long long v = (long long)json_integer_value(ms);
    if (v < 1000)
        snprintf(buf, cap, "%lld ms", v);
    else if (v < 60000)
        snprintf(buf, cap, "%.1f s", v / 1000.0);
    else
        snprintf(buf, cap, "%lldm%02llds", v / 60000, (v / 1000) % 60);
}

void ctl_print_json(FILE *f, json_t *j)
{
    json_dumpf(j, f, JSON_INDENT(2));
    fputc('\n', f);
}

struct ctl_table {
    int ncol;
    const char *hdr[CTL_TABLE_MAX_COLS];
    char **cells; /* nrows * ncol */
    size_t nrows, cap;
    bool lost_row; /* a row could not be added */
};

struct ctl_table *ctl_table_new(int ncol, const char *const *headers)
{
    if (ncol < 1 || ncol > CTL_TABLE_MAX_COLS)
        return NULL;
    struct ctl_table *t = calloc(1, sizeof *t);
    if (!t)
        return NULL;
    t->ncol = ncol;
    for (int i = 0; i < ncol; i++)
        t->hdr[i] = headers[i];
    return t;
}

int ctl_table_row(struct ctl_table *t, const char *const *cells)
{
    if (!t)
        return -1;
    if (t->nrows >= CTL_TABLE_MAX_ROWS) {
        t->lost_row = true;
        return -1;
    }
    if (t->nrows == t->cap) {
        size_t cap = t->cap ? t->cap * 2 : 16;
        char **nc = realloc(t->cells, cap * (size_t)t->ncol * sizeof *nc);
        if (!nc) {
            t->lost_row = true;
            return -1;
        }
        t->cells = nc;
        t->cap = cap;
    }
    for (int i = 0; i < t->ncol; i++) {
        const char *s = cells[i] ? cells[i] : "-";
        char *c = malloc(strlen(s) + 1);
        if (!c) {
            for (int k = 0; k < i; k++)
                free(t->cells[t->nrows * (size_t)t->ncol + (size_t)k]);
            t->lost_row = true;
            return -1;
        }
        ctl_clean(s, c, strlen(s) + 1);
        t->cells[t->nrows * (size_t)t->ncol + (size_t)i] = c;
    }
    t->nrows++;
    return 0;
}

/* Columns padded to their widest cell; the last one is not padded, so a
 * long reason or description does not push trailing spaces. */
void ctl_table_print(struct ctl_table *t, FILE *f)
{
    size_t w[CTL_TABLE_MAX_COLS];
    if (!t)
        return;
    for (int i = 0; i < t->ncol; i++) {
        w[i] = strlen(t->hdr[i]);
        for (size_t r = 0; r < t->nrows; r++) {
            size_t l = strlen(t->cells[r * (size_t)t->ncol + (size_t)i]);
            if (l > w[i])
                w[i] = l;
        }
    }
    for (size_t r = 0; r <= t->nrows; r++) {
        for (int i = 0; i < t->ncol; i++) {
            const char *s = r == 0 ? t->hdr[i] : t->cells[(r - 1) * (size_t)t->ncol + (size_t)i];
            if (i + 1 < t->ncol)
                fprintf(f, "%-*s  ", (int)w[i], s);
            else
                fprintf(f, "%s\n", s);
        }
    }
}

void ctl_table_free(struct ctl_table *t)
{
    if (!t)
        return;
    for (size_t i = 0; i < t->nrows * (size_t)t->ncol; i++)
        free(t->cells[i]);
    free(t->cells);
    free(t);
}

/* The one way a listing ends: the whole table, or none of it and why. */
int ctl_table_emit(struct ctl_table *t, FILE *f)
{
    int rc = 0;
    if (!t || t->lost_row) {
        fprintf(stderr, "capctl: out of memory\n");
        rc = CTL_EXIT_ERROR;
    } else {
        ctl_table_print(t, f);
    }
    ctl_table_free(t);
    return rc;
}

void ctl_print_report(const char *s, size_t n)
{
    for (size_t i = 0; i < n; i++) {
        unsigned char ch = (unsigned char)s[i];
        putchar((ch < 0x20 && ch != '\n' && ch != '\t') || ch == 0x7f ? '?' : ch);
    }
    if (n && s[n - 1] != '\n')
        putchar('\n');
}
