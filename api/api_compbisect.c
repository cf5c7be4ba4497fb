/*
 * api/api_compbisect.c - GET /v1/jobs/{id}/cells/{cell}/compiler-bisect:
 * what the compiler bisection of a compiled cell found (docs/api.md,
 * "Compiled cells").
 *
 * capd follows a compiled cell that its job's mode self-check finds
 * diverged with a job of that one cell whose runner runs Inductor's
 * compiler bisector instead of capturing (daemon/replay/compiler.h, label
 * compiler_bisect_of "<job>/<cell>"). The runner sends what the bisector
 * found as one note, "compile_bisect=<JSON>" (docs/runner.md): whether it
 * narrowed the difference, the backend, subsystem and bisect number, the
 * lowering or pass it names (debug_info), why not where it could not, the
 * float64 judgement it bisected on and the command that repeats it. The
 * answer is that object beside the follow-up job and its cell's outcome.
 */
#include <errno.h>
#include <stdio.h>
#include <string.h>

#include "api/api_int.h"

#define NOTE_PREFIX "compile_bisect="

/* The runner's result in the notes of the follow-up's CELL of JOB, or
 * NULL (none, or not JSON). */
static json_t *bisect_result(struct store *s, const char *job, const char *cell)
{
    json_t *page = NULL, *rec, *out = NULL;
    size_t i;
    if (store_records_list(s, job, cell, "note", 0, 1000, &page) != 0)
        return NULL;
    json_array_foreach(json_object_get(page, "records"), i, rec)
    {
        const char *m = json_string_value(json_object_get(rec, "message"));
        if (!out && m && strncmp(m, NOTE_PREFIX, strlen(NOTE_PREFIX)) == 0)
            out = json_loads(m + strlen(NOTE_PREFIX), 0, NULL);
    }
    json_decref(page);
    return out;
}

/* The answer once the follow-up job BJOB has finished. */
static enum MHD_Result answer(struct api_req *r, json_t *bjob)
{
    json_t *bcell = json_array_get(json_object_get(bjob, "cells"), 0);
    const char *bid = json_string_value(json_object_get(bjob, "id"));
    json_t *res =
        bcell ? bisect_result(api_store(r), bid, json_string_value(json_object_get(bcell, "id")))
              : NULL;
    return api_json(r, 200,
                    json_pack("{s:s, s:s, s:o, s:O*, s:O*, s:o}", "job", api_param(r, "id"), "cell",
                              api_param(r, "cell"), "bisect", api_job_summary(bjob), "state",
                              json_object_get(bcell, "state"), "reason",
                              json_object_get(bcell, "reason"), "result", res ? res : json_null()));
}

enum MHD_Result api_cell_compiler_bisect(struct api_req *r)
{
    struct store *s = api_store(r);
    json_t *cell = NULL, *bjob = NULL;
    enum MHD_Result ret;
    char of[64], id[16];
    int rc = store_cell_get(s, api_param(r, "id"), api_param(r, "cell"), &cell);
    if (rc) {
        ret = api_store_error(r, rc, "cell");
        goto out;
    }
    const char *mode = json_string_value(json_object_get(cell, "mode"));
    if (!mode || strcmp(mode, "eager") == 0) {
        ret = api_error(r, 409, "eager_cell", NULL,
                        "cell %s runs eagerly: a compiler bisection follows a compiled cell (mode "
                        "aot_eager or inductor) that departs from the job's eager cell",
                        api_param(r, "cell"));
        goto out;
    }
    snprintf(of, sizeof of, "%s/%s", api_param(r, "id"), api_param(r, "cell"));
    if ((rc = store_job_compiler_bisect(s, of, id)) == -ENOENT) {
        ret = api_error(r, 404, "no_compiler_bisect", NULL,
                        "cell %s has no compiler bisection: capd starts one when the job's mode "
                        "self-check finds the cell diverged from its eager cell and the job's "
                        "option compiler_bisect is auto",
                        api_param(r, "cell"));
        goto out;
    }
    if (!rc)
        rc = store_job_get(s, id, &bjob);
    if (rc) {
        ret = api_store_error(r, rc, "compiler bisection job");
    } else if (!api_job_finished(bjob)) {
        json_t *b = json_pack("{s:{s:s, s:s, s:n}, s:o}", "error", "code", "pending", "message",
                              "the compiler bisection has not finished; retry when it has", "field",
                              "bisect", api_job_summary(bjob));
        ret = api_json(r, 409, b);
    } else {
        ret = answer(r, bjob);
    }
out:
    json_decref(cell);
    json_decref(bjob);
    return ret;
}
