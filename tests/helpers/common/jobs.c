#include <criterion/criterion.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>

#include "tests/helpers/common/jobs.h"

char *jobs_post(const struct tu_capd *c, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    char *body = tu_vfmt(fmt, ap);
    va_end(ap);
    long st = 0;
    json_t *j = tu_json(c, "POST", "/v1/jobs", body, &st);
    char *reply = j ? json_dumps(j, 0) : NULL;
    cr_assert_eq(st, 201, "POST /v1/jobs %s: %ld %s", body, st, reply ? reply : "(no JSON)");
    const char *id = json_string_value(json_object_get(j, "id"));
    cr_assert_not_null(id, "POST /v1/jobs answered 201 without an id: %s", reply);
    char *out = strdup(id);
    free(reply);
    free(body);
    json_decref(j);
    return out;
}

void jobs_wait_all(const struct tu_capd *c, char **ids, int n, int timeout_s, const char *want_cell)
{
    for (int i = 0; i < n; i++) {
        json_t *j = tu_wait_job(c, ids[i], timeout_s);
        cr_assert_not_null(j, "job %s did not finish", ids[i]);
        if (want_cell) {
            json_t *cell = json_array_get(json_object_get(j, "cells"), 0);
            char *dump = json_dumps(j, 0);
            cr_assert_str_eq(tu_str(cell, "state"), want_cell, "%s", dump);
            free(dump);
        }
        json_decref(j);
        free(ids[i]);
    }
}
