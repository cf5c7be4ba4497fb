/*
 * tests/test_api_builds.c - the REST API v1 end to end, /v1/builds
 * (api/api_builds.c): create, get, list, PUT, duplicate names, invalid
 * bodies, and the checks made as the cell user. The fixture (a real capd
 * per test): api_fixtures.h.
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

TestSuite(api_builds, AF_SUITE);

/* ============================================================== builds */

Test(api_builds, create_get_list)
{
    af_start(NULL);
    cr_assert_eq(af_count_builds(), 0);
    long st;
    json_t *b = tu_jsonf(&af_capd, "POST", "/v1/builds", &st,
                         "{\"name\":\"torch-main.v2_x\",\"python\":\"/bin/true\","
                         "\"env\":{\"PYTHONPATH\":\"/src/build\",\"OMP_NUM_THREADS\":\"1\"},"
                         "\"model_roots\":[\"%s\"],\"description\":\"main branch\"}",
                         af_dir);
    char *s = af_dump(b);
    cr_assert_eq(st, 201, "%s", s);
    free(s);
    cr_assert_str_eq(tu_jstr(b, "name"), "torch-main.v2_x");
    cr_assert_str_eq(tu_jstr(b, "python"), "/bin/true");
    cr_assert_str_eq(tu_jstr(json_object_get(b, "env"), "PYTHONPATH"), "/src/build");
    cr_assert_eq(json_object_size(json_object_get(b, "env")), 2);
    cr_assert_eq(json_array_size(json_object_get(b, "model_roots")), 1);
    cr_assert_str_eq(json_string_value(json_array_get(json_object_get(b, "model_roots"), 0)),
                     af_dir);
    cr_assert_str_eq(tu_jstr(b, "description"), "main branch");
    cr_assert(af_is_rfc3339(json_object_get(b, "created_at")));
    cr_assert(af_is_rfc3339(json_object_get(b, "updated_at")));
    cr_assert(json_is_false(json_object_get(b, "prefork")), "prefork is off by default");
    cr_assert_eq(json_object_size(b), 8, "unexpected members in a build");

    json_t *g = af_get("/v1/builds/torch-main.v2_x", &st);
    cr_assert_eq(st, 200);
    cr_assert(json_equal(g, b), "GET differs from the POST reply");
    json_t *l = af_get("/v1/builds", &st);
    cr_assert_eq(st, 200);
    cr_assert_eq(json_array_size(json_object_get(l, "builds")), 1);
    cr_assert(json_equal(json_array_get(json_object_get(l, "builds"), 0), b));

    /* Defaults: env {} and model_roots [] and description "". */
    json_t *m = af_callq("POST", "/v1/builds", "{'name':'min','python':'/bin/true'}", &st);
    cr_assert_eq(st, 201);
    cr_assert(json_is_object(json_object_get(m, "env")));
    cr_assert_eq(json_object_size(json_object_get(m, "env")), 0);
    cr_assert(json_is_array(json_object_get(m, "model_roots")));
    cr_assert_eq(json_array_size(json_object_get(m, "model_roots")), 0);
    cr_assert_str_eq(tu_jstr(m, "description"), "");
    cr_assert_eq(af_count_builds(), 2);
    /* Listed by name. */
    json_decref(l);
    l = af_get("/v1/builds", &st);
    cr_assert_str_eq(tu_jstr(json_array_get(json_object_get(l, "builds"), 0), "name"), "min");

    af_expect_get_error("/v1/builds/nope", 404, "not_found");
    json_decref(b);
    json_decref(g);
    json_decref(l);
    json_decref(m);
}

Test(api_builds, duplicate_name_409_changes_nothing)
{
    af_start(NULL);
    long st;
    json_t *a = af_callq("POST", "/v1/builds", "{'name':'b','python':'/bin/true'}", &st);
    cr_assert_eq(st, 201);
    json_t *d = af_callq("POST", "/v1/builds", "{'name':'b','python':'/bin/false'}", &st);
    af_expect_error(d, st, 409, "conflict", "name");
    cr_assert(strstr(tu_jstr(json_object_get(d, "error"), "message"), "'b'"),
              "the message should name the build: %s",
              tu_jstr(json_object_get(d, "error"), "message"));
    json_t *g = af_get("/v1/builds/b", &st);
    cr_assert_str_eq(tu_jstr(g, "python"), "/bin/true", "the 409 must not replace the build");
    cr_assert(json_equal(a, g));
    cr_assert_eq(af_count_builds(), 1);
    /* A client's conflict, not a storage error, in /metrics. */
    cr_assert_eq(tu_metric(&af_capd, "capd_store_conflicts_total"), 1);
    cr_assert_eq(tu_metric(&af_capd, "capd_sqlite_errors_total{kind=\"constraint\"}"), 0);
    json_decref(a);
    json_decref(d);
    json_decref(g);
}

/* An invalid build body and the error it is refused with. */
struct bad_body {
    const char *body, *code, *field;
};

/* A body refused as an invalid_field error naming FIELD. */
#define INVALID(field, body)                                                                       \
    {                                                                                              \
        (body), "invalid_field", (field)                                                           \
    }

/* Case I: C's body is a 400 naming its field on POST, and on PUT (a body
 * without a name takes the URL's, so that case is valid there). */
static void expect_bad_body(size_t i, const struct bad_body *c)
{
    long st;
    json_t *j = af_callq("POST", "/v1/builds", c->body, &st);
    cr_assert_eq(st, 400, "case %zu %s -> %ld", i, c->body, st);
    af_expect_error(j, st, 400, c->code, c->field);
    json_decref(j);
    if (!strstr(c->body, "'name'"))
        return;
    j = af_callq("PUT", "/v1/builds/x", c->body, &st);
    if (strcmp(c->field, "name") != 0) {
        af_expect_error(j, st, 400, c->code, c->field);
    } else {
        cr_assert_eq(st, 400, "PUT case %zu %s -> %ld", i, c->body, st);
    }
    json_decref(j);
}

/* Every invalid build body is a 400 naming the field, and stores nothing. */
Test(api_builds, invalid_bodies_400_store_nothing)
{
    af_start(NULL);
    const char *noexec = af_write_file("noexec", "#!/bin/sh\n", 0644);
    char long_name[80];
    memset(long_name, 'a', 65);
    long_name[65] = 0;
    char *roots33 = NULL, *longname_body = NULL, *noexec_body = NULL;
    {
        char buf[2048] = "{'name':'x','python':'/bin/true','model_roots':[";
        for (int i = 0; i < 33; i++)
            snprintf(buf + strlen(buf), sizeof buf - strlen(buf), "%s'/r%d'", i ? "," : "", i);
        strcat(buf, "]}");
        roots33 = strdup(buf);
    }
    if (asprintf(&longname_body, "{'name':'%s','python':'/bin/true'}", long_name) < 0 ||
        asprintf(&noexec_body, "{'name':'x','python':'%s'}", noexec) < 0)
        cr_assert_fail("asprintf");
    const struct bad_body cases[] = {
        INVALID("name", "{'name':'a b','python':'/bin/true'}"),
        INVALID("name", "{'name':'','python':'/bin/true'}"),
        INVALID("name", "{'name':'a/b','python':'/bin/true'}"),
        INVALID("name", "{'name':5,'python':'/bin/true'}"),
        INVALID("name", "{'python':'/bin/true'}"),
        INVALID("name", longname_body),
        INVALID("python", "{'name':'x'}"),
        INVALID("python", "{'name':'x','python':5}"),
        INVALID("python", "{'name':'x','python':'bin/true'}"),
        INVALID("python", "{'name':'x','python':'/nonexistent/python3'}"),
        INVALID("python", noexec_body),
        {"{'name':'x','python':'/bin/true','foo':1}", "unknown_field", "foo"},
        INVALID("env", "{'name':'x','python':'/bin/true','env':[]}"),
        INVALID("env", "{'name':'x','python':'/bin/true','env':'A=1'}"),
        INVALID("env", "{'name':'x','python':'/bin/true','env':{'A=B':'x'}}"),
        INVALID("env", "{'name':'x','python':'/bin/true','env':{'A-B':'x'}}"),
        INVALID("env", "{'name':'x','python':'/bin/true','env':{'':'x'}}"),
        INVALID("env", "{'name':'x','python':'/bin/true','env':{'A':1}}"),
        INVALID("env", "{'name':'x','python':'/bin/true','env':{'A':null}}"),
        INVALID("env", "{'name':'x','python':'/bin/true','env':{'CAPD_CELL_SPEC':'/x'}}"),
        INVALID("env", "{'name':'x','python':'/bin/true','env':{'CAPD_WIDTH':'avx2'}}"),
        INVALID("model_roots", "{'name':'x','python':'/bin/true','model_roots':'/a'}"),
        INVALID("model_roots", "{'name':'x','python':'/bin/true','model_roots':['rel']}"),
        INVALID("model_roots", "{'name':'x','python':'/bin/true','model_roots':['/a/../b']}"),
        INVALID("model_roots", "{'name':'x','python':'/bin/true','model_roots':['/a/./b']}"),
        INVALID("model_roots", "{'name':'x','python':'/bin/true','model_roots':[1]}"),
        INVALID("model_roots", "{'name':'x','python':'/bin/true','model_roots':['']}"),
        INVALID("model_roots", roots33),
        INVALID("description", "{'name':'x','python':'/bin/true','description':5}"),
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++)
        expect_bad_body(i, &cases[i]);
    cr_assert_eq(af_count_builds(), 0, "an invalid build was stored");
    free(roots33);
    free(longname_body);
    free(noexec_body);
}

/*
 * Registration checks as the cell user (nobody when capd is root, else
 * capd's own user): a directory that user cannot search in front of the
 * interpreter or a model root, a model root it cannot list, one that does
 * not exist or is a file. Each refusal names the path, the user and what is
 * missing. A directory of mode 0600 blocks every user but root's cells, so
 * this holds whoever runs the test.
 */
Test(api_builds, refused_when_the_cell_user_cannot_reach_it)
{
    af_start(NULL);
    long st;
    char priv[600], py[700], unlisted[600], file[700];
    snprintf(priv, sizeof priv, "%s/private", af_dir);
    snprintf(py, sizeof py, "%s/python", priv);
    snprintf(unlisted, sizeof unlisted, "%s/unlisted", af_dir);
    cr_assert_eq(mkdir(priv, 0755), 0);
    cr_assert_eq(mkdir(unlisted, 0311), 0);
    af_put_file(py, AF_OK_SH);
    cr_assert_eq(chmod(py, 0755), 0);
    snprintf(file, sizeof file, "%s", af_write_file("plain", "x", 0644));
    /* Reachable: accepted, as before. */
    json_t *j =
        tu_jsonf(&af_capd, "POST", "/v1/builds", &st,
                 "{\"name\":\"fine\",\"python\":\"%s\",\"model_roots\":[\"%s\"]}", py, priv);
    cr_assert_eq(st, 201, "%s", af_dump(j));
    json_decref(j);
    cr_assert_eq(chmod(priv, 0600), 0);
    const struct {
        const char *python, *root, *code, *field, *says;
    } bad[] = {
        {py, NULL, "cell_user_denied", "python", "cannot search it"},
        {"/bin/sh", priv, "cell_user_denied", "model_roots", "cannot list and search it"},
        {"/bin/sh", unlisted, "cell_user_denied", "model_roots", "cannot list and search it"},
        {"/bin/sh", "/nonexistent/models", "invalid_field", "model_roots", "does not exist"},
        {"/bin/sh", file, "invalid_field", "model_roots", "is not a directory"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        j = tu_jsonf(&af_capd, "POST", "/v1/builds", &st,
                     "{\"name\":\"b%zu\",\"python\":\"%s\",\"model_roots\":[%s%s%s]}", i,
                     bad[i].python, bad[i].root ? "\"" : "", bad[i].root ? bad[i].root : "",
                     bad[i].root ? "\"" : "");
        af_expect_error(j, st, 400, bad[i].code, bad[i].field);
        const char *msg = tu_jstr(json_object_get(j, "error"), "message");
        cr_assert(strstr(msg, bad[i].says), "case %zu: %s", i, msg);
        /* The user is named whenever permissions are the cause. */
        cr_assert(strcmp(bad[i].code, "cell_user_denied") != 0 || strstr(msg, "uid "),
                  "case %zu names no user: %s", i, msg);
        json_decref(j);
    }
    /* A cell of the build registered while it was reachable fails before
     * its exec and says why as the cell user sees it, not a bare exit code. */
    char *id = af_submit1("fine", "abcdef1");
    json_t *job = af_wait_done(id);
    const char *reason = tu_jstr(json_array_get(json_object_get(job, "cells"), 0), "reason");
    cr_assert(reason && strstr(reason, "cell user") && strstr(reason, "private"), "reason: %s",
              reason ? reason : "(none)");
    json_decref(job);
    free(id);
    /* An interpreter the check cannot see (a script's #! line) that the
     * cell user cannot reach: the exec fails, and the cell says so as the
     * cell user, not a bare "exit code 127". */
    char bang[720];
    snprintf(bang, sizeof bang, "#!%s\n", py);
    snprintf(file, sizeof file, "%s", af_write_file("bang.sh", bang, 0755));
    j = tu_jsonf(&af_capd, "POST", "/v1/builds", &st, "{\"name\":\"bang\",\"python\":\"%s\"}",
                 file);
    cr_assert_eq(st, 201, "%s", af_dump(j));
    json_decref(j);
    id = af_submit1("bang", "abcdef2");
    job = af_wait_done(id);
    reason = tu_jstr(json_array_get(json_object_get(job, "cells"), 0), "reason");
    cr_assert(reason &&
                  strstr(reason, "exit code 127: the runner could not be executed as the "
                                 "cell user") &&
                  strstr(reason, "uid "),
              "reason: %s", reason ? reason : "(none)");
    json_decref(job);
    free(id);
    chmod(priv, 0755);
}

/* A description of exactly 1024 bytes is the limit; 1025 is refused. */
Test(api_builds, description_limit)
{
    af_start(NULL);
    char d[1100];
    memset(d, 'd', 1025);
    d[1025] = 0;
    long st;
    json_t *j = tu_jsonf(&af_capd, "POST", "/v1/builds", &st,
                         "{\"name\":\"x\",\"python\":\"/bin/true\",\"description\":\"%s\"}", d);
    af_expect_error(j, st, 400, "invalid_field", "description");
    json_decref(j);
    d[1024] = 0;
    j = tu_jsonf(&af_capd, "POST", "/v1/builds", &st,
                 "{\"name\":\"x\",\"python\":\"/bin/true\",\"description\":\"%s\"}", d);
    cr_assert_eq(st, 201);
    json_decref(j);
}

Test(api_builds, put_creates_and_replaces_200)
{
    af_start(NULL);
    long st;
    json_t *a = af_callq("PUT", "/v1/builds/b", "{'python':'/bin/true','env':{'A':'1'}}", &st);
    cr_assert_eq(st, 200, "PUT of a new build");
    cr_assert_str_eq(tu_jstr(a, "name"), "b");
    usleep(5000);
    json_t *b = af_callq("PUT", "/v1/builds/b",
                         "{'name':'b','python':'/bin/false','description':'replaced'}", &st);
    cr_assert_eq(st, 200);
    cr_assert_str_eq(tu_jstr(b, "python"), "/bin/false");
    cr_assert_str_eq(tu_jstr(b, "description"), "replaced");
    cr_assert_eq(json_object_size(json_object_get(b, "env")), 0, "PUT replaces env entirely");
    cr_assert_str_eq(tu_jstr(b, "created_at"), tu_jstr(a, "created_at"));
    cr_assert(strcmp(tu_jstr(b, "updated_at"), tu_jstr(a, "updated_at")) > 0,
              "updated_at must move forward");
    json_t *g = af_get("/v1/builds/b", &st);
    cr_assert(json_equal(g, b));
    cr_assert_eq(af_count_builds(), 1);

    af_expect_call_error("PUT", "/v1/builds/b", "{'name':'c','python':'/bin/true'}", 400,
                         "invalid_field", "name");
    af_expect_call_error("PUT", "/v1/builds/a%20b", "{'python':'/bin/true'}", 400, "invalid_field",
                         "name");
    json_decref(g);
    g = af_get("/v1/builds/b", &st);
    cr_assert_str_eq(tu_jstr(g, "python"), "/bin/false", "a refused PUT changed the build");
    cr_assert_eq(af_count_builds(), 1);
    json_decref(a);
    json_decref(b);
    json_decref(g);
}

/* The 409 message names the build, every time (it once read freed memory:
 * an empty name, garbage, or no reply at all). */
Test(api_builds, duplicate_message_names_the_build)
{
    af_start(NULL);
    long st;
    json_decref(af_callq("POST", "/v1/builds", "{'name':'dupname','python':'/bin/true'}", &st));
    for (int i = 0; i < 20; i++) {
        json_t *j = af_callq("POST", "/v1/builds", "{'name':'dupname','python':'/bin/true'}", &st);
        af_expect_error(j, st, 409, "conflict", "name");
        cr_assert(strstr(tu_jstr(json_object_get(j, "error"), "message"), "'dupname'"), "%s",
                  tu_jstr(json_object_get(j, "error"), "message"));
        json_decref(j);
    }
}
