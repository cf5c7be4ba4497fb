/*
 * tests/test_api_cells.c - the REST API v1 end to end, a job's cells: a
 * cell's details, its records (paged, filtered by kind) and its log, and
 * the 404s of cells that are not the job's. The fixture (a real capd per
 * test): api_fixtures.h.
 */
#include <criterion/criterion.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "tests/helpers/common/api_fixtures.h"
#include "tests/helpers/common/testutil.h"

TestSuite(api_cells, AF_SUITE);

/* ============================================================== cells */

Test(api_cells, cell_records_and_log)
{
    af_start(NULL);
    af_ok_build("ok");
    char *id = af_submit1("ok", "abcdef1");
    json_t *j = af_wait_done(id);
    json_t *c0 = json_array_get(json_object_get(j, "cells"), 0);
    cr_assert_str_eq(tu_jstr(c0, "state"), "ok", "cell: %s", af_dump(c0));
    char *cid = strdup(tu_jstr(c0, "id"));
    json_decref(j);

    char path[512];
    long st;
    snprintf(path, sizeof path, "/v1/jobs/%s/cells/%s", id, cid);
    json_t *c = af_get(path, &st);
    cr_assert_eq(st, 200);
    cr_assert_str_eq(tu_jstr(c, "id"), cid);
    cr_assert_str_eq(tu_jstr(c, "job"), id);
    cr_assert_str_eq(tu_jstr(c, "model"), "mlp");
    cr_assert_str_eq(tu_jstr(c, "width"), "avx2");
    cr_assert_str_eq(tu_jstr(c, "pass"), "forward");
    cr_assert_str_eq(tu_jstr(c, "effective_width"), "avx2");
    cr_assert_eq(json_integer_value(json_object_get(c, "exit_code")), 0);
    cr_assert(json_is_false(json_object_get(c, "partial")));
    json_t *rc = json_object_get(c, "record_counts");
    cr_assert_eq(json_integer_value(json_object_get(rc, "tensor")), 5);
    cr_assert_eq(json_integer_value(json_object_get(rc, "hello")), 1);
    cr_assert_eq(json_integer_value(json_object_get(rc, "end")), 1);
    json_t *t = json_object_get(c, "timing");
    cr_assert_eq(json_integer_value(json_object_get(t, "n")), 3);
    cr_assert_float_eq(json_real_value(json_object_get(t, "median_ns")), 200.0, 1e-9);
    cr_assert_float_eq(json_real_value(json_object_get(t, "min_ns")), 100.0, 1e-9);
    cr_assert_eq(
        json_integer_value(json_object_get(json_object_get(c, "memory"), "peak_rss_bytes")), 12345);
    cr_assert_str_eq(tu_jstr(json_object_get(c, "fingerprint"), "torch"), "none");
    json_decref(c);

    /* Records: 10 in all, paged with an opaque cursor, filtered by kind. */
    char base[256];
    snprintf(base, sizeof base, "/v1/jobs/%s/cells/%s/records", id, cid);
    snprintf(path, sizeof path, "%s?limit=3", base);
    int total = 0;
    int64_t last = -1;
    for (int page = 0; page < 10; page++) {
        json_t *r = af_get(path, &st);
        cr_assert_eq(st, 200);
        json_t *recs = json_object_get(r, "records");
        for (size_t i = 0; i < json_array_size(recs); i++, total++) {
            int64_t n = json_integer_value(json_object_get(json_array_get(recs, i), "record"));
            cr_assert(n > last, "records out of order");
            last = n;
        }
        const char *cur = tu_jstr(r, "next_cursor");
        if (!cur) {
            json_decref(r);
            break;
        }
        snprintf(path, sizeof path, "%s?limit=3&cursor=%s", base, cur);
        json_decref(r);
    }
    cr_assert_eq(total, 10);
    snprintf(path, sizeof path, "%s?kind=tensor", base);
    json_t *r = af_get(path, &st);
    json_t *recs = json_object_get(r, "records");
    cr_assert_eq(json_array_size(recs), 5);
    cr_assert_str_eq(tu_jstr(json_array_get(recs, 0), "key"), "model.0.forward.output.0");
    cr_assert_str_eq(tu_jstr(json_array_get(recs, 0), "kind"), "tensor");
    json_decref(r);
    snprintf(path, sizeof path, "%s?kind=end", base);
    r = af_get(path, &st);
    cr_assert_str_eq(tu_jstr(json_array_get(json_object_get(r, "records"), 0), "status"), "ok");
    json_decref(r);

    static const struct {
        const char *query, *field;
    } bad[] = {{"kind=bogus", "kind"},  {"limit=0", "limit"},   {"limit=1001", "limit"},
               {"cursor=s1", "cursor"}, {"cursor=r", "cursor"}, {"cursor=r-2", "cursor"},
               {"cursor=rx", "cursor"}};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        snprintf(path, sizeof path, "%s?%s", base, bad[i].query);
        r = af_get(path, &st);
        af_expect_error(r, st, 400, "invalid_query", bad[i].field);
        json_decref(r);
    }
    snprintf(path, sizeof path, "%s?limit=1000", base);
    r = af_get(path, &st);
    cr_assert_eq(st, 200);
    json_decref(r);

    /* The log is the runner's stdout/stderr as text. */
    struct tu_resp lr;
    snprintf(path, sizeof path, "/v1/jobs/%s/cells/%s/log", id, cid);
    json_decref(af_raw("GET", path, NULL, 0, NULL, &st, &lr));
    cr_assert_eq(st, 200);
    cr_assert_str_eq(lr.body, "runner says hi\n");
    const char *ct = af_header(lr.headers, "Content-Type");
    cr_assert(ct && strncmp(ct, "text/plain", 10) == 0, "log content type %s", ct);
    tu_resp_free(&lr);
    free(id);
    free(cid);
}

Test(api_cells, cell_404s)
{
    af_start(NULL);
    af_ok_build("ok");
    char *a = af_submit1("ok", "abcdef1");
    char *b = af_submit1("ok", "abcdef2");
    json_t *ja = af_wait_done(a);
    json_t *jb = af_wait_done(b);
    const char *ca = tu_jstr(json_array_get(json_object_get(ja, "cells"), 0), "id");
    const char *cb = tu_jstr(json_array_get(json_object_get(jb, "cells"), 0), "id");
    char paths[6][256];
    snprintf(paths[0], 256, "/v1/jobs/%s/cells/cnope", a);
    snprintf(paths[1], 256, "/v1/jobs/jnope/cells/%s", ca);
    snprintf(paths[2], 256, "/v1/jobs/%s/cells/%s", a, cb); /* another job's cell */
    snprintf(paths[3], 256, "/v1/jobs/%s/cells/%s/records", b, ca);
    snprintf(paths[4], 256, "/v1/jobs/%s/cells/%s/log", b, ca);
    snprintf(paths[5], 256, "/v1/jobs/%s/cells/cnope/log", a);
    for (int i = 0; i < 6; i++)
        af_expect_get_error(paths[i], 404, "not_found");
    /* The right pairs work. */
    char p[256];
    long st;
    snprintf(p, sizeof p, "/v1/jobs/%s/cells/%s", b, cb);
    json_decref(af_get(p, &st));
    cr_assert_eq(st, 200);
    json_decref(ja);
    json_decref(jb);
    free(a);
    free(b);
}
