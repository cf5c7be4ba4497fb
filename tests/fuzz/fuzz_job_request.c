/*
 * tests/fuzz/fuzz_job_request.c - libFuzzer target for the job-request
 * validator behind POST /v1/jobs (api_validate_job_request in
 * api/api_jobs.c), from raw body bytes through jansson exactly as
 * api_body_object reads them.
 *
 * The first byte chooses the registered build the request is checked
 * against: none (unknown build), one without model roots, or one with.
 * An accepted request must come back normalized (every option filled in,
 * the matrix within max_cells_per_job); a refused one must say why with a
 * code and a message.
 */
#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "api/api_int.h"
#include "daemon/config/config.h"

#define FUZZ_TARGET "fuzz_job_request"
#include "tests/fuzz/fuzz_check.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    static struct capd_config cfg;
    static json_t *builds[3];
    if (!builds[1]) {
        config_defaults(&cfg);
        cfg.max_cells_per_job = 16;
        builds[1] = json_pack("{s:s,s:s,s:{},s:[]}", "name", "b", "python", "/bin/true", "env",
                              "model_roots");
        builds[2] = json_pack("{s:s,s:s,s:{},s:[s]}", "name", "b", "python", "/bin/true", "env",
                              "model_roots", "/srv/models");
    }
    if (size < 1)
        return 0;
    json_t *build = builds[data[0] % 3];
    json_error_t je;
    json_t *body = json_loadb((const char *)data + 1, size - 1, JSON_REJECT_DUPLICATES, &je);
    if (!body)
        return 0;
    json_t *norm = NULL;
    struct api_verr err;
    memset(&err, 0, sizeof err);
    int rc = api_validate_job_request(body, build, &cfg, &norm, &err);
    if (rc == 0) {
        CHECK(json_is_object(norm));
        json_t *m = json_object_get(norm, "matrix"), *o = json_object_get(norm, "options");
        size_t cells = json_array_size(json_object_get(m, "models")) *
                       json_array_size(json_object_get(m, "widths")) *
                       json_array_size(json_object_get(m, "passes"));
        CHECK(cells >= 1 && cells <= (size_t)cfg.max_cells_per_job);
        CHECK(json_is_integer(json_object_get(o, "timeout_s")));
        CHECK(json_is_string(json_object_get(o, "capture")));
        char *s = json_dumps(norm, JSON_COMPACT);
        CHECK(s);
        free(s);
        json_decref(norm);
    } else {
        CHECK(rc == -EINVAL && norm == NULL);
        CHECK(err.code && err.code[0] && err.message[0]);
    }
    json_decref(body);
    return 0;
}
