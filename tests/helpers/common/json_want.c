#include <criterion/criterion.h>
#include <math.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "tests/helpers/common/json_want.h"

json_t *jw_path(json_t *root, const char *path)
{
    char buf[256], *save = NULL;
    snprintf(buf, sizeof(buf), "%s", path);
    json_t *cur = root;
    for (char *tok = strtok_r(buf, ".", &save); tok && cur; tok = strtok_r(NULL, ".", &save)) {
        if (json_is_array(cur))
            cur = json_array_get(cur, (size_t)strtoul(tok, NULL, 10));
        else
            cur = json_object_get(cur, tok);
    }
    return cur;
}

const char *jw_str(json_t *root, const char *path)
{
    const char *s = json_string_value(jw_path(root, path));
    return s ? s : "(none)";
}

double jw_num(json_t *root, const char *path)
{
    json_t *v = jw_path(root, path);
    cr_assert(json_is_number(v), "%s is not a number", path);
    return json_number_value(v);
}

json_t *jw_find(json_t *arr, const char *key, const char *value)
{
    size_t i;
    json_t *row;
    json_array_foreach(arr, i, row)
    {
        const char *s = json_string_value(json_object_get(row, key));
        if (s && strcmp(s, value) == 0)
            return row;
    }
    return NULL;
}

static bool want_met(json_t *v, const struct jw_want *w)
{
    switch (w->kind) {
    case JW_STR:
        return json_is_string(v) && strcmp(json_string_value(v), w->s) == 0;
    case JW_INT:
        return json_is_integer(v) && json_integer_value(v) == w->i;
    case JW_DBL:
        return json_is_number(v) && fabs(json_number_value(v) - w->d) <= w->eps;
    case JW_NULL:
        return json_is_null(v);
    case JW_TRUE:
        return json_is_true(v);
    case JW_FALSE:
        return json_is_false(v);
    case JW_ABSENT:
        return v == NULL;
    }
    return false;
}

static void want_text(const struct jw_want *w, char *buf, size_t len)
{
    static const char *const fixed[] = {
        [JW_NULL] = "null", [JW_TRUE] = "true", [JW_FALSE] = "false", [JW_ABSENT] = "(absent)"};
    if (w->kind == JW_STR)
        snprintf(buf, len, "\"%s\"", w->s);
    else if (w->kind == JW_INT)
        snprintf(buf, len, "%lld", w->i);
    else if (w->kind == JW_DBL)
        snprintf(buf, len, "%.17g (within %g)", w->d, w->eps);
    else
        snprintf(buf, len, "%s", fixed[w->kind]);
}

void jw_expect_n(json_t *root, const struct jw_want *w, size_t n)
{
    for (size_t k = 0; k < n; k++) {
        json_t *v = jw_path(root, w[k].path);
        if (want_met(v, &w[k]))
            continue;
        char *got = v ? json_dumps(v, JSON_ENCODE_ANY) : NULL, want[160];
        want_text(&w[k], want, sizeof(want));
        cr_assert_fail("%s: got %s, want %s", w[k].path, got ? got : "(absent)", want);
    }
}
