/*
 * api/check.c - the checks every endpoint group makes of a request's words
 * (see api_int.h): a value from a closed set, and a body of known fields.
 */
#include <string.h>

#include "api/api_int.h"

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
