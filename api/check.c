/*
 * api/check.c - the checks every endpoint group makes of a request's words
 * (see api_int.h): a name, hex digits or a line of text, a value from a
 * closed set, a body of known fields and the ?limit= of a list.
 */
#include <stdlib.h>
#include <string.h>

#include "api/api_int.h"
#include "api/repro.h"

bool api_valid_name(const char *s, size_t max)
{
    size_t n = 0;
    if (!s)
        return false;
    for (; s[n]; n++) {
        char c = s[n];
        if (!((c >= 'A' && c <= 'Z') || (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') ||
              c == '.' || c == '_' || c == '-'))
            return false;
    }
    return n >= 1 && n <= max;
}

bool api_valid_hex(const char *s, size_t min, size_t max)
{
    size_t n = 0;
    if (!s)
        return false;
    for (; s[n]; n++)
        if (!((s[n] >= '0' && s[n] <= '9') || (s[n] >= 'a' && s[n] <= 'f') ||
              (s[n] >= 'A' && s[n] <= 'F')))
            return false;
    return n >= min && n <= max;
}

bool api_valid_text(const char *s, size_t max)
{
    size_t n = 0;
    if (!s)
        return false;
    for (; s[n]; n++)
        if ((unsigned char)s[n] < 0x20 || s[n] == 0x7f)
            return false;
    if (n < 1 || n > max)
        return false;
    /* Everything stored is echoed in JSON later: it must be UTF-8. */
    json_t *j = json_string(s);
    json_decref(j);
    return j != NULL;
}

/* Whether S up to END is "<module>.<call>.<phase>": a module name, a call
 * number, phase forward (or backward when BACKWARD). */
static bool module_call(const char *s, const char *end, bool backward)
{
    const char *p = end;
    while (p > s && p[-1] != '.')
        p--;
    size_t len = (size_t)(end - p);
    if (p == end || p - s < 3 ||
        !((len == 7 && strncmp(p, "forward", 7) == 0) ||
          (backward && len == 8 && strncmp(p, "backward", 8) == 0)))
        return false;
    const char *q = p - 1; /* the '.' before the phase */
    const char *d = q;
    while (d > s && d[-1] >= '0' && d[-1] <= '9')
        d--;
    return d != q && d != s && d[-1] == '.';
}

/* What a target_op names: "<module>.<call>.<phase>/op.<aten name>.<n>",
 * or "<module>.<call>.forward". */
enum api_target api_target_kind(const char *s)
{
    if (!api_valid_text(s, API_TARGET_OP_MAX))
        return API_TARGET_NONE;
    const char *mark = strstr(s, "/op.");
    if (mark == NULL)
        return !strchr(s, '/') && module_call(s, s + strlen(s), false) ? API_TARGET_MODULE
                                                                       : API_TARGET_NONE;
    if (mark == s || !module_call(s, mark, true))
        return API_TARGET_NONE;
    /* "<aten name>.<n>" after it */
    const char *tail = mark + 4, *dot = strrchr(tail, '.');
    if (dot == NULL || dot == tail || dot[1] == '\0')
        return API_TARGET_NONE;
    for (const char *c = dot + 1; *c; c++)
        if (*c < '0' || *c > '9')
            return API_TARGET_NONE;
    return API_TARGET_OP;
}

bool api_one_of(const char *s, const char *const *set)
{
    for (; s && *set; set++)
        if (strcmp(s, *set) == 0)
            return true;
    return false;
}

bool api_verr_fields_known(struct api_verr *e, json_t *body, const char *const *fields)
{
    const char *k;
    json_t *v;
    json_object_foreach(body, k, v)
    {
        if (!api_one_of(k, fields))
            return api_verr_set(e, "unknown_field", k, "unknown field '%s'", k);
    }
    return true;
}

bool api_limit_refused(struct api_req *r, int dflt, int max, int *out, enum MHD_Result *ret)
{
    const char *v = api_query(r, "limit");
    char *end;
    *out = dflt;
    if (!v)
        return false;
    long n = strtol(v, &end, 10);
    if (*end || end == v || n < 1 || n > max) {
        *ret =
            api_error(r, 400, "invalid_query", "limit", "limit must be an integer in [1, %d]", max);
        return true;
    }
    *out = (int)n;
    return false;
}
