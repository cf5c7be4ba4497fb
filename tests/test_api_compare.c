/*
 * tests/test_api_compare.c - the REST API v1 end to end, what
 * api/api_compare.c answers: branches and their control commits, jobs by
 * commit, /v1/compare and /v1/commits/SHA/diff, and what else differs
 * between two builds. The fixture (a real capd per test): api_fixtures.h.
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

TestSuite(api_branches, AF_SUITE);
TestSuite(api_compare, AF_SUITE);

/* ============================================== branches and commits */

Test(api_branches, put_get_branch)
{
    af_start(NULL);
    long st;
    json_t *j = af_callq("PUT", "/v1/branches/main", "{'control_commit':'1b0e7d2'}", &st);
    cr_assert_eq(st, 200);
    cr_assert_str_eq(tu_jstr(j, "name"), "main");
    cr_assert_str_eq(tu_jstr(j, "control_commit"), "1b0e7d2");
    cr_assert(af_is_rfc3339(json_object_get(j, "updated_at")));
    cr_assert_eq(json_object_size(j), 3);
    json_t *g = af_get("/v1/branches/main", &st);
    cr_assert_eq(st, 200);
    cr_assert(json_equal(g, j));
    json_decref(g);
    json_decref(j);
    j = af_callq("PUT", "/v1/branches/main",
                 "{'control_commit':'"
                 "0123456789abcdef0123456789abcdef01234567'}",
                 &st);
    cr_assert_eq(st, 200, "PUT replaces the control");
    json_decref(j);
    g = af_get("/v1/branches/main", &st);
    cr_assert_str_eq(tu_jstr(g, "control_commit"), "0123456789abcdef0123456789abcdef01234567");
    json_decref(g);

    static const struct {
        const char *path, *body, *code, *field;
    } bad[] = {
        {"/v1/branches/main", "{'control_commit':'xyz'}", "invalid_field", "control_commit"},
        {"/v1/branches/main", "{'control_commit':'abc'}", "invalid_field", "control_commit"},
        {"/v1/branches/main", "{'control_commit':null}", "invalid_field", "control_commit"},
        {"/v1/branches/main", "{'control_commit':1234567}", "invalid_field", "control_commit"},
        {"/v1/branches/main", "{}", "invalid_field", "control_commit"},
        {"/v1/branches/main", "{'control_commit':'abcdef0','x':1}", "unknown_field", "x"},
        {"/v1/branches/a..b", "{'control_commit':'abcdef0'}", "invalid_field", "name"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        j = af_callq("PUT", bad[i].path, bad[i].body, &st);
        af_expect_error(j, st, 400, bad[i].code, bad[i].field);
        json_decref(j);
    }
    g = af_get("/v1/branches/main", &st);
    cr_assert_str_eq(tu_jstr(g, "control_commit"), "0123456789abcdef0123456789abcdef01234567",
                     "a refused PUT changed the branch");
    json_decref(g);
    af_expect_get_error("/v1/branches/a..b", 404, "not_found");
    af_expect_get_error("/v1/branches/nope", 404, "not_found");
}

Test(api_branches, commits)
{
    af_start(NULL);
    af_hang_build("b");
    char *a = af_submit1("b", "abcdef1");
    char *b = af_submit1("b", "abcdef1");
    char *c = af_submit1("b", "abcdef2");
    long st;
    json_t *j = af_get("/v1/commits/abcdef1", &st);
    cr_assert_eq(st, 200);
    cr_assert_str_eq(tu_jstr(j, "commit"), "abcdef1");
    json_t *jobs = json_object_get(j, "jobs");
    cr_assert_eq(json_array_size(jobs), 2);
    cr_assert_str_eq(tu_jstr(json_array_get(jobs, 0), "id"), b, "newest first");
    cr_assert_str_eq(tu_jstr(json_array_get(jobs, 1), "id"), a);
    json_decref(j);
    af_expect_get_error("/v1/commits/abcdef9", 404, "not_found");
    static const char *const bad[] = {"xyz1234", "abc", "abcdef1-",
                                      "0000000000000000000000000000000000000000000000000000000000"
                                      "0000000"};
    for (size_t i = 0; i < 4; i++) {
        char p[256];
        snprintf(p, sizeof p, "/v1/commits/%s", bad[i]);
        j = af_get(p, &st);
        af_expect_error(j, st, 400, "invalid_field", "sha");
        json_decref(j);
    }
    free(a);
    free(b);
    free(c);
}

/* ============================================================ compare */

Test(api_compare, compare_and_diff)
{
    af_start(NULL);
    af_ok_build("ok");
    af_hang_build("hang");
    char *ctl = af_submit1("ok", "1b0e7d2");
    json_t *h = af_post_job(201, "{'project':'p','commit':'3f2a9c1','branch':'main','build':'ok',"
                                 "'matrix':{'models':['mlp'],'widths':['avx2'],'passes':['forward']"
                                 "}}");
    char *head = af_job_id(h);
    json_decref(af_wait_done(ctl));
    json_decref(af_wait_done(head));

    long st;
    json_t *r = af_get("/v1/compare?control=1b0e7d2&head=3f2a9c1", &st);
    char *s = af_dump(r);
    cr_assert_eq(st, 200, "%s", s);
    free(s);
    cr_assert_str_eq(tu_jstr(r, "verdict"), "pass");
    cr_assert(json_is_object(json_object_get(r, "counts")));
    cr_assert_eq(json_integer_value(json_object_get(json_object_get(r, "counts"), "cells")), 1);
    cr_assert_eq(json_array_size(json_object_get(r, "cells")), 1);
    cr_assert_str_eq(tu_jstr(json_object_get(r, "control"), "job"), ctl);
    cr_assert_str_eq(tu_jstr(json_object_get(r, "head"), "job"), head);
    json_decref(r);
    /* Job ids work as well as commits. */
    char p[256];
    snprintf(p, sizeof p, "/v1/compare?control=%s&head=%s&format=json", ctl, head);
    r = af_get(p, &st);
    cr_assert_eq(st, 200);
    cr_assert_str_eq(tu_jstr(r, "verdict"), "pass");
    json_decref(r);

    /* Markdown by format=md or by Accept. */
    struct tu_resp m;
    json_decref(af_raw("GET", "/v1/compare?control=1b0e7d2&head=3f2a9c1&format=md", NULL, 0, NULL,
                       &st, &m));
    cr_assert_eq(st, 200);
    cr_assert(strncmp(af_header(m.headers, "Content-Type"), "text/markdown", 13) == 0);
    cr_assert(strstr(m.body, "pass"), "markdown: %s", m.body);
    tu_resp_free(&m);
    const char *acc[] = {"Accept: text/markdown", NULL};
    json_decref(af_raw("GET", "/v1/compare?control=1b0e7d2&head=3f2a9c1", NULL, 0, acc, &st, &m));
    cr_assert_eq(st, 200);
    cr_assert(strncmp(af_header(m.headers, "Content-Type"), "text/markdown", 13) == 0);
    tu_resp_free(&m);

    /* A head of another width: the two jobs share no cell. */
    h = af_post_job(201,
                    "{'project':'p','commit':'ccccccc','build':'ok','matrix':{'models':['mlp'],"
                    "'widths':['default'],'passes':['forward']}}");
    json_decref(af_wait_done(tu_jstr(h, "id")));
    json_decref(h);
    static const struct {
        const char *query;
        long status;
        const char *code, *field, *says;
    } bad[] = {
        {"", 400, "missing_query", "control", NULL},
        {"control=1b0e7d2", 400, "missing_query", "head", NULL},
        {"head=3f2a9c1", 400, "missing_query", "control", NULL},
        {"control=abcdef9&head=3f2a9c1", 404, "not_found", "control", NULL},
        {"control=1b0e7d2&head=jnope", 404, "not_found", "head", NULL},
        {"control=1b0e7d2&head=3f2a9c1&format=xml", 400, "invalid_query", "format", NULL},
        {"control=1b0e7d2&head=3f2a9c1&reference=float32", 400, "invalid_query", "reference",
         "none, float64, default-width"},
        {"control=1b0e7d2&head=3f2a9c1&overrides=%7B%22reference%22%3A1%7D", 400, "invalid_query",
         "overrides", "reference: must be one of"},
        {"job=jx&control_width=avx2", 400, "missing_query", "head_width", NULL},
        /* Gates never pass on nothing: filters that match no cell. */
        {"control=1b0e7d2&head=3f2a9c1&width=avx-2", 400, "unknown_width", "width",
         "did you mean avx2?"},
        {"control=1b0e7d2&head=3f2a9c1&model=MLP", 400, "no_match", "model", "did you mean mlp?"},
        {"control=1b0e7d2&head=3f2a9c1&width=avx512", 400, "no_match", "width", "widths: avx2)"},
        {"control=1b0e7d2&head=3f2a9c1&pass=backward", 400, "no_match", "pass", "passes: forward)"},
        {"control=1b0e7d2&head=3f2a9c1&model=x*", 400, "no_match", "model", "models: mlp)"},
        {"job=1b0e7d2&control_width=avx2&head_width=default", 400, "no_match", "head_width",
         "widths: avx2)"},
        {"job=1b0e7d2&control_width=AVX2&head_width=avx2", 400, "unknown_width", "control_width",
         "did you mean avx2?"},
        {"control=1b0e7d2&head=ccccccc", 400, "no_cells", NULL, "1 cells only in the control"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        snprintf(p, sizeof p, "/v1/compare?%s", bad[i].query);
        r = af_get(p, &st);
        af_expect_error(r, st, bad[i].status, bad[i].code, bad[i].field);
        const char *msg = tu_jstr(json_object_get(r, "error"), "message");
        cr_assert(!bad[i].says || strstr(msg, bad[i].says), "%s: %s", bad[i].query, msg);
        json_decref(r);
    }
    /* The arbiter named by the query is the comparison's. */
    r = af_get("/v1/compare?control=1b0e7d2&head=3f2a9c1&reference=float64", &st);
    cr_assert_eq(st, 200);
    cr_assert_str_eq(tu_jstr(json_object_get(r, "thresholds"), "reference"), "float64");
    json_decref(r);
    /* A pattern that matches is a filter, not a typo. */
    r = af_get("/v1/compare?control=1b0e7d2&head=3f2a9c1&model=m*&width=avx2", &st);
    cr_assert_eq(st, 200);
    cr_assert_eq(json_integer_value(json_object_get(json_object_get(r, "counts"), "cells")), 1);
    json_decref(r);

    /* A side that has not finished is 409 pending. */
    char *run = af_submit1("hang", "aaaaaaa");
    json_decref(af_wait_cell(run, 0, "running", 20));
    /* By commit: the commit has no finished job yet. */
    r = af_get("/v1/compare?control=1b0e7d2&head=aaaaaaa", &st);
    af_expect_error(r, st, 409, "pending", "head");
    json_decref(r);
    /* By job id: the job is found but has not finished. */
    snprintf(p, sizeof p, "/v1/compare?control=1b0e7d2&head=%s", run);
    r = af_get(p, &st);
    cr_assert_eq(st, 409);
    cr_assert_str_eq(tu_jstr(json_object_get(r, "error"), "code"), "pending");
    cr_assert_str_eq(tu_jstr(r, "verdict"), "pending");
    cr_assert_str_eq(tu_jstr(json_object_get(r, "head"), "job"), run);
    cr_assert_str_eq(tu_jstr(json_object_get(r, "head"), "state"), "running");
    json_decref(r);

    /* diff: the control comes from the branch when the job names none. */
    af_expect_get_error("/v1/commits/3f2a9c1/diff", 404, "no_control");
    json_decref(af_callq("PUT", "/v1/branches/main", "{'control_commit':'1b0e7d2'}", &st));
    cr_assert_eq(st, 200);
    r = af_get("/v1/commits/3f2a9c1/diff", &st);
    cr_assert_eq(st, 200);
    cr_assert_str_eq(tu_jstr(r, "verdict"), "pass");
    cr_assert_str_eq(tu_jstr(r, "control_source"), "branch");
    cr_assert_str_eq(tu_jstr(r, "control_commit"), "1b0e7d2");
    json_decref(r);
    r = af_get("/v1/commits/xyz/diff", &st);
    af_expect_error(r, st, 400, "invalid_field", "sha");
    json_decref(r);
    af_expect_get_error("/v1/commits/abcdef9/diff", 404, "not_found");
    free(ctl);
    free(head);
    free(run);
}

/*
 * What else differs: two builds of the fake runner (which records the
 * environment it runs in, like the real one), the head with an extra
 * PYTHONPATH entry, another thread count and a credential-like variable.
 * The comparison lists exactly those, the credential without its values;
 * a build compared with itself lists nothing.
 */
static void env_build(const char *name, const char *env)
{
    long st;
    char *fake = tu_helper("fake_runner");
    json_t *j = tu_jsonf(&af_capd, "POST", "/v1/builds", &st,
                         "{\"name\":\"%s\",\"python\":\"%s\",\"model_roots\":[\"%s\"],\"env\":%s}",
                         name, fake, af_dir, env);
    char *s = af_dump(j);
    cr_assert_eq(st, 201, "build %s: %ld %s", name, st, s);
    free(s);
    free(fake);
    json_decref(j);
}

static char *submit_fake(const char *build, const char *commit)
{
    struct af_job job = {"p",           commit, NULL, build, "\"fake:ok\"", "\"default\",\"avx2\"",
                         "\"forward\"", NULL};
    return af_submit_job(&af_capd, &job);
}

static json_t *env_entry(json_t *r, const char *field)
{
    size_t i;
    json_t *d;
    json_array_foreach(json_object_get(json_object_get(r, "environment"), "differences"), i, d)
    {
        if (strcmp(tu_jstr(d, "field"), field) == 0)
            return d;
    }
    return NULL;
}

Test(api_compare, what_else_differs_between_two_builds)
{
    af_start(NULL);
    char pp[600];
    snprintf(pp, sizeof pp, "%s/perturbed-build", af_dir);
    env_build("ctl", "{\"MKL_FAKE_TOKEN\":\"old-token-value\"}");
    char env[1024];
    snprintf(env, sizeof env,
             "{\"PYTHONPATH\":\"%s\",\"OMP_NUM_THREADS\":\"3\",\"MKL_FAKE_TOKEN\":"
             "\"new-token-value\"}",
             pp);
    env_build("head", env);
    char *c1 = submit_fake("ctl", "c0ffee1"), *c2 = submit_fake("ctl", "c0ffee2"),
         *hd = submit_fake("head", "abcdef1");
    json_decref(af_wait_done(c1));
    json_decref(af_wait_done(c2));
    json_decref(af_wait_done(hd));

    long st;
    char p[256];
    snprintf(p, sizeof p, "/v1/compare?control=%s&head=%s", c1, c2);
    json_t *r = af_get(p, &st);
    cr_assert_eq(st, 200);
    json_t *e = json_object_get(r, "environment");
    char *s = af_dump(e);
    cr_assert(json_is_object(e), "every comparison has the section");
    cr_assert_eq(json_array_size(json_object_get(e, "differences")), 0, "same build: %s", s);
    cr_assert_eq(json_integer_value(json_object_get(e, "pairs_compared")), 2, "%s", s);
    cr_assert_gt(json_integer_value(json_object_get(e, "fields_compared")), 5, "%s", s);
    free(s);
    json_decref(r);
    struct tu_resp m;
    snprintf(p, sizeof p, "/v1/compare?control=%s&head=%s&format=md", c1, c2);
    json_decref(af_raw("GET", p, NULL, 0, NULL, &st, &m));
    cr_assert_eq(st, 200);
    cr_assert_null(strstr(m.body, "What else differs"), "%s", m.body);
    tu_resp_free(&m);

    snprintf(p, sizeof p, "/v1/compare?control=%s&head=%s", c1, hd);
    r = af_get(p, &st);
    cr_assert_eq(st, 200);
    s = af_dump(json_object_get(r, "environment"));
    json_t *d = env_entry(r, "env.PYTHONPATH");
    cr_assert_not_null(d, "%s", s);
    cr_assert_str_eq(tu_jstr(d, "group"), "environment");
    cr_assert_eq(json_integer_value(json_object_get(d, "cells")), 2);
    cr_assert(strncmp(tu_jstr(d, "head"), pp, strlen(pp)) == 0, "head's PYTHONPATH first: %s", s);
    cr_assert_null(strstr(tu_jstr(d, "control"), "perturbed-build"), "%s", s);
    cr_assert_str_eq(tu_jstr(env_entry(r, "env.OMP_NUM_THREADS"), "head"), "3", "%s", s);
    /* capd sets the job's thread count unless the build does */
    cr_assert_str_eq(tu_jstr(env_entry(r, "env.OMP_NUM_THREADS"), "control"), "1", "%s", s);
    d = env_entry(r, "env.MKL_FAKE_TOKEN");
    cr_assert_not_null(d, "%s", s);
    cr_assert(json_is_true(json_object_get(d, "redacted")), "%s", s);
    cr_assert_eq(json_array_size(json_object_get(json_object_get(r, "environment"), "differences")),
                 3, "nothing else differs: %s", s);
    cr_assert_null(strstr(s, "token-value"), "a credential leaked: %s", s);
    free(s);
    json_decref(r);
    const char *fmts[] = {"md", "text"};
    for (int i = 0; i < 2; i++) {
        snprintf(p, sizeof p, "/v1/compare?control=%s&head=%s&format=%s", c1, hd, fmts[i]);
        json_decref(af_raw("GET", p, NULL, 0, NULL, &st, &m));
        cr_assert_eq(st, 200);
        cr_assert(strstr(m.body, "What else differs"), "%s", m.body);
        cr_assert(strstr(m.body, "env.PYTHONPATH"), "%s", m.body);
        cr_assert(strstr(m.body, pp), "%s", m.body);
        cr_assert(strstr(m.body, "changed (value not shown)"), "%s", m.body);
        cr_assert_null(strstr(m.body, "token-value"), "%s", m.body);
        tu_resp_free(&m);
    }
    free(c1);
    free(c2);
    free(hd);
}

/* Cells pair by mode: a control of eager and inductor cells against a head
 * of eager ones compares the eager cells and finds the inductor one
 * missing in the head; each names its mode. */
Test(api_compare, cells_pair_by_mode)
{
    af_start(NULL);
    env_build("fake", "{}");
    json_t *c = af_post_job(201, "{'project':'p','commit':'abcdef1','build':'fake','matrix':{"
                                 "'models':['fake:ok'],'widths':['avx2'],'passes':['forward'],"
                                 "'modes':['eager','inductor']}}");
    json_t *h = af_post_job(201, "{'project':'p','commit':'abcdef2','build':'fake','matrix':{"
                                 "'models':['fake:ok'],'widths':['avx2'],'passes':['forward']}}");
    json_decref(af_wait_done(tu_jstr(c, "id")));
    json_decref(af_wait_done(tu_jstr(h, "id")));
    char path[200];
    snprintf(path, sizeof path, "/v1/compare?control=%s&head=%s", tu_jstr(c, "id"),
             tu_jstr(h, "id"));
    json_t *r = af_get_ok(path);
    char *rs = af_dump(r);
    json_t *cells = json_object_get(r, "cells"), *miss = json_object_get(r, "missing_cells");
    cr_assert_eq(json_array_size(cells), 1, "%s", rs);
    cr_assert_str_eq(tu_jstr(json_array_get(cells, 0), "mode"), "eager", "%s", rs);
    cr_assert_str_eq(tu_jstr(json_array_get(cells, 0), "status"), "identical", "%s", rs);
    cr_assert_eq(json_array_size(miss), 1, "%s", rs);
    cr_assert_str_eq(tu_jstr(json_array_get(miss, 0), "mode"), "inductor", "%s", rs);
    free(rs);
    json_decref(r);
    /* the other way round, the inductor cell is extra in the head */
    snprintf(path, sizeof path, "/v1/compare?control=%s&head=%s", tu_jstr(h, "id"),
             tu_jstr(c, "id"));
    r = af_get_ok(path);
    cr_assert_str_eq(tu_jstr(json_array_get(json_object_get(r, "extra_cells"), 0), "mode"),
                     "inductor");
    json_decref(r);
    json_decref(c);
    json_decref(h);
}
