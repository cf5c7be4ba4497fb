/*
 * tests/test_api_meta.c - the REST API v1 end to end, what api/api_meta.c
 * and the route table answer: /healthz, /v1/models and /v1/widths as
 * schema/ defines them, 404 for unknown routes, 405 with Allow, trailing
 * slashes. The fixture (a real capd per test): api_fixtures.h.
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

TestSuite(api_meta, AF_SUITE);

/* ================================================================ meta */

Test(api_meta, healthz)
{
    af_start(NULL);
    struct tu_resp r;
    long st;
    json_t *j = af_raw("GET", "/healthz", NULL, 0, NULL, &st, &r);
    cr_assert_eq(st, 200);
    cr_assert_str_eq(tu_jstr(j, "status"), "ok");
    cr_assert_str_eq(tu_jstr(j, "version"), CAPD_VERSION);
    cr_assert(json_is_integer(json_object_get(j, "running_cells")));
    cr_assert_eq(json_integer_value(json_object_get(j, "running_cells")), 0);
    const char *ct = af_header(r.headers, "Content-Type");
    cr_assert(ct && strncmp(ct, "application/json", 16) == 0, "content type %s", ct);
    cr_assert_str_eq(af_header(r.headers, "Cache-Control"), "no-store");
    tu_resp_free(&r);
    json_decref(j);
    cr_assert_eq(tu_capd_stop(&af_capd), 0, "SIGTERM must exit 0");
}

/* The zoo and the width table are served exactly as schema/ defines them;
 * each width row adds only what this host makes of it. */
Test(api_meta, models_and_widths_match_schema)
{
    af_start(NULL);
    char p[1024];
    json_error_t je;
    snprintf(p, sizeof p, "%s/schema/models.json", tu_bin("CAPD_SOURCE_DIR"));
    json_t *models = json_load_file(p, 0, &je);
    cr_assert_not_null(models, "%s: %s", p, je.text);
    snprintf(p, sizeof p, "%s/schema/widths.json", tu_bin("CAPD_SOURCE_DIR"));
    json_t *widths = json_load_file(p, 0, &je);
    cr_assert_not_null(widths, "%s: %s", p, je.text);

    long st;
    json_t *m = af_get("/v1/models", &st);
    cr_assert_eq(st, 200);
    cr_assert(json_equal(json_object_get(m, "models"), models), "models differ from schema");
    cr_assert(json_is_string(json_object_get(m, "user_models")));
    json_t *w = af_get("/v1/widths", &st);
    cr_assert_eq(st, 200);
    json_t *rows = json_deep_copy(json_object_get(w, "widths"));
    size_t i;
    json_t *row;
    json_array_foreach(rows, i, row)
    {
        cr_assert(json_is_boolean(json_object_get(row, "runnable_here")));
        json_object_del(row, "runnable_here");
        json_object_del(row, "missing");
        json_object_del(row, "reason");
    }
    cr_assert(json_equal(rows, json_object_get(widths, "widths")), "widths differ from schema");
    json_decref(rows);
    cr_assert(json_is_string(json_object_get(w, "host_arch")));
    cr_assert_eq(json_object_size(w), 2);
    json_decref(m);
    json_decref(w);
    json_decref(models);
    json_decref(widths);
}

Test(api_meta, unknown_routes_404)
{
    af_start(NULL);
    /* "/" is the dashboard (tests/test_live.c). */
    static const char *const paths[] = {
        "/v1",
        "/v1/nope",
        "/v1/jobs/j1/nope",
        "/v1/jobs/j1/cells",
        "/healthz/x",
        "//v1/jobs",
        "/v2/jobs",
        "/v1/jobs/j1/cells/c1/records/x",
        "/a/b/c/d/e/f/g/h/i/j",
        "/v1/jobs//cancel",
    };
    for (size_t i = 0; i < sizeof paths / sizeof paths[0]; i++) {
        long st;
        json_t *j = af_get(paths[i], &st);
        cr_assert_eq(st, 404, "GET %s -> %ld", paths[i], st);
        af_expect_error(j, st, 404, "not_found", NULL);
        json_decref(j);
    }
}

/* A known path, the Allow header of its 405, and methods it does not take
 * (NULL-terminated). */
struct wrong_methods {
    const char *path, *allow;
    const char *methods[3];
};

/* METHOD on PATH is a 405 whose Allow header is exactly ALLOW. */
static void expect_405(const char *method, const char *path, const char *allow)
{
    struct tu_resp r;
    long st;
    json_t *j = af_raw(method, path, NULL, 0, NULL, &st, &r);
    af_expect_error(j, st, 405, "method_not_allowed", NULL);
    const char *got = af_header(r.headers, "Allow");
    cr_assert_not_null(got, "%s %s: no Allow header", method, path);
    cr_assert_str_eq(got, allow, "%s %s", method, path);
    tu_resp_free(&r);
    json_decref(j);
}

/* A known path with another method is 405 with an Allow header listing
 * exactly the methods the route table has for it. */
Test(api_meta, wrong_method_405_with_allow)
{
    af_start(NULL);
    static const struct wrong_methods cases[] = {
        {"/v1/jobs", "GET, POST", {"DELETE", "PUT"}},
        {"/healthz", "GET", {"POST"}},
        {"/v1/builds/b", "GET, PUT", {"DELETE", "POST"}},
        {"/v1/builds", "GET, POST", {"DELETE"}},
        {"/v1/jobs/j1/cancel", "POST", {"GET"}},
        {"/v1/jobs/j1", "GET", {"DELETE"}},
        {"/v1/models", "GET", {"POST"}},
        {"/v1/widths", "GET", {"PUT"}},
        {"/v1/compare", "GET", {"POST"}},
        {"/v1/branches/main", "GET, PUT", {"DELETE"}},
        {"/v1/commits/abcdef1", "GET", {"POST"}},
        {"/v1/commits/abcdef1/diff", "GET", {"POST"}},
        {"/v1/jobs/j1/cells/c1/log", "GET", {"POST"}},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++)
        for (int m = 0; cases[i].methods[m]; m++)
            expect_405(cases[i].methods[m], cases[i].path, cases[i].allow);
    cr_assert_eq(af_count_builds(), 0);
    cr_assert_eq(af_count_jobs(), 0);
}

Test(api_meta, trailing_slash_is_the_same_resource)
{
    af_start(NULL);
    long st;
    json_t *j = af_get("/v1/builds/", &st);
    cr_assert_eq(st, 200);
    cr_assert(json_is_array(json_object_get(j, "builds")));
    json_decref(j);
    j = af_get("/v1/widths/", &st);
    cr_assert_eq(st, 200);
    json_decref(j);
}
