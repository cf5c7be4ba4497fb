/*
 * tests/test_api_regressions.c - the REST API v1 end to end: the
 * "api_regressions" suite pins bugs found while writing the API tests
 * (each failed before its fix). The fixture (a real capd per test):
 * api_fixtures.h.
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

TestSuite(api_known_bugs, AF_SUITE);
TestSuite(api_regressions, AF_SUITE);

/* ===================================================== known bugs
 * Each of these fails today; see the comment for the fix. */

/* storage/jobs.c store_job_cancel(): a job cancelled with no cell running
 * has ended, but finished_at stays null forever. */
Test(api_regressions, cancelled_queued_job_has_finished_at)
{
    af_start(NULL);
    af_hang_build("b");
    char *a = af_submit1("b", "abcdef1");
    char *b = af_submit1("b", "abcdef2");
    json_decref(af_wait_cell(a, 0, "running", 20));
    char p[128];
    long st;
    snprintf(p, sizeof p, "/v1/jobs/%s/cancel", b);
    json_t *j = af_call("POST", p, NULL, &st);
    cr_assert_eq(st, 202);
    cr_assert(af_is_rfc3339(json_object_get(j, "finished_at")), "finished_at %s",
              af_dump(json_object_get(j, "finished_at")));
    json_decref(j);
    free(a);
    free(b);
}

/* api/api_builds.c validate_build(): access(X_OK) is true for a
 * directory, so "python":"/tmp" is registered. */
Test(api_regressions, python_directory_refused)
{
    af_start(NULL);
    af_expect_call_error("POST", "/v1/builds", "{'name':'x','python':'/tmp'}", 400, "invalid_field",
                         "python");
    cr_assert_eq(af_count_builds(), 0);
}

/* api/api_builds.c validate_build(): "/a/." (a trailing "/.") passes the
 * strstr checks although the message promises no "." components. */
Test(api_regressions, model_root_trailing_dot_refused)
{
    af_start(NULL);
    af_expect_call_error("POST", "/v1/builds",
                         "{'name':'x','python':'/bin/true','model_roots':['/a/.']}", 400,
                         "invalid_field", "model_roots");
    af_expect_call_error("POST", "/v1/builds",
                         "{'name':'y','python':'/bin/true','model_roots':['/a/..']}", 400,
                         "invalid_field", "model_roots");
}

/* api/server.c: MHD already percent-decodes the path, and split_path()
 * decodes it again. So %2F in a branch name becomes a path separator
 * (branches like feature/x cannot be read or set) and %25 is decoded
 * twice. */
Test(api_regressions, branch_names_with_slash_and_percent)
{
    af_start(NULL);
    long st;
    json_t *j = af_callq("PUT", "/v1/branches/feature%2Fx", "{'control_commit':'abcdef0'}", &st);
    cr_assert_eq(st, 200, "PUT /v1/branches/feature%%2Fx -> %ld", st);
    cr_assert_str_eq(tu_jstr(j, "name"), "feature/x");
    json_decref(j);
    j = af_get("/v1/branches/feature%2Fx", &st);
    cr_assert_eq(st, 200);
    json_decref(j);
    j = af_callq("PUT", "/v1/branches/a%2541", "{'control_commit':'abcdef0'}", &st);
    cr_assert_eq(st, 200);
    cr_assert_str_eq(tu_jstr(j, "name"), "a%41", "the path was percent-decoded twice");
    json_decref(j);
}

/* api/api_compare.c api_branch_put() checks the name from the URL with
 * api_valid_text(), which does not check UTF-8: PUT /v1/branches/x%FFy
 * stores a name that no reply can carry (the PUT answers 500 and the
 * branch exists). api_valid_text() should refuse invalid UTF-8. */
Test(api_regressions, branch_name_with_invalid_utf8_refused)
{
    af_start(NULL);
    af_expect_call_error("PUT", "/v1/branches/x%FFy", "{'control_commit':'abcdef0'}", 400,
                         "invalid_field", "name");
}

/* daemon/main.c prints "capd listening on ..." before capd_run() starts the
 * SIGTERM/SIGINT watchers, so a SIGTERM sent as soon as the line is read
 * kills capd with the default action (status 143) about half the time. */
Test(api_regressions, sigterm_right_after_start_exits_0)
{
    for (int i = 0; i < 10; i++) {
        af_start(NULL);
        cr_assert_eq(tu_capd_stop(&af_capd), 0, "round %d", i);
    }
}
