/*
 * tests/test_api_input.c - the REST API v1 end to end, bad input to every
 * writing endpoint: malformed JSON and wrong shapes, bodies over
 * max_body_bytes (declared or chunked), invalid UTF-8 in URLs and
 * headers. The fixture (a real capd per test): api_fixtures.h.
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

TestSuite(api_input, AF_SUITE);

/* ========================================================== bad input */

struct bad_body {
    const char *name;
    const char *body;
    size_t len; /* 0: strlen */
    const char *ctype;
    long status;
    const char *code;
};

/* Sends every bad body to every writing endpoint; each must be refused
 * with the right status and error, and nothing may be stored. */
static void send_bad_bodies(const struct bad_body *cases, size_t n)
{
    static const struct {
        const char *method, *path;
    } eps[] = {{"POST", "/v1/jobs"},
               {"POST", "/v1/builds"},
               {"PUT", "/v1/builds/x"},
               {"PUT", "/v1/branches/b"}};
    int jobs0 = af_count_jobs(), builds0 = af_count_builds();
    for (size_t i = 0; i < n; i++) {
        for (size_t e = 0; e < sizeof eps / sizeof eps[0]; e++) {
            char ct[128];
            const char *hdrs[2] = {NULL, NULL};
            if (cases[i].ctype) {
                snprintf(ct, sizeof ct, "Content-Type: %s", cases[i].ctype);
                hdrs[0] = ct;
            }
            long st = 0;
            json_t *j = NULL;
            size_t len = cases[i].len ? cases[i].len : strlen(cases[i].body);
            /* A refused upload may race the server's close: retry a
             * transport failure, never a reply. */
            for (int t = 0; t < 5 && st == 0; t++) {
                json_decref(j);
                j = af_raw(eps[e].method, eps[e].path, cases[i].body, len, hdrs, &st, NULL);
            }
            char *s = af_dump(j);
            cr_assert_eq(st, cases[i].status, "%s to %s %s: %ld %s", cases[i].name, eps[e].method,
                         eps[e].path, st, s);
            free(s);
            af_expect_error(j, st, cases[i].status, cases[i].code, NULL);
            json_decref(j);
        }
    }
    cr_assert_eq(af_count_jobs(), jobs0, "a bad body stored a job");
    cr_assert_eq(af_count_builds(), builds0, "a bad body stored a build");
    long st;
    json_t *b = af_get("/v1/branches/b", &st);
    cr_assert_eq(st, 404, "a bad body stored a branch");
    json_decref(b);
    b = af_get("/v1/builds/x", &st);
    cr_assert_eq(st, 404, "a bad body stored a build");
    json_decref(b);
}

Test(api_input, malformed_json_and_wrong_shapes)
{
    af_start(NULL);
    af_hang_build("b"); /* a valid build, so a body could only fail on itself */
    static const char deep_obj_prefix[] = "{\"project\":";
    size_t dn = 100000;
    char *deep = malloc(dn + 1);
    memset(deep, '[', dn);
    deep[dn] = 0;
    char *deep2 = malloc(dn * 2 + 64);
    strcpy(deep2, deep_obj_prefix);
    memset(deep2 + strlen(deep_obj_prefix), '[', dn);
    memset(deep2 + strlen(deep_obj_prefix) + dn, ']', dn);
    strcpy(deep2 + strlen(deep_obj_prefix) + 2 * dn, "}");
    static const char nul[] = "{\"name\":\"a\0b\",\"python\":\"/bin/true\"}";
    const struct bad_body cases[] = {
        {"truncated", "{\"project\":", 0, "application/json", 400, "invalid_json"},
        {"garbage", "hello", 0, "application/json", 400, "invalid_json"},
        {"trailing garbage", "{\"control_commit\":\"abcdef0\"} x", 0, "application/json", 400,
         "invalid_json"},
        {"two objects", "{}{}", 0, "application/json", 400, "invalid_json"},
        {"single quotes", "{'a':1}", 0, "application/json", 400, "invalid_json"},
        {"duplicate key", "{\"control_commit\":\"abcdef0\",\"control_commit\":\"abcdef1\"}", 0,
         "application/json", 400, "invalid_json"},
        {"array", "[{\"control_commit\":\"abcdef0\"}]", 0, "application/json", 400, "invalid_json"},
        {"string", "\"x\"", 0, "application/json", 400, "invalid_json"},
        {"number", "5", 0, "application/json", 400, "invalid_json"},
        {"null", "null", 0, "application/json", 400, "invalid_json"},
        {"empty", "", 0, "application/json", 400, "invalid_json"},
        {"whitespace", "  \n ", 0, "application/json", 400, "invalid_json"},
        {"invalid utf-8", "{\"control_commit\":\"abc\xff\xfe\"}", 0, "application/json", 400,
         "invalid_json"},
        {"overlong utf-8", "{\"control_commit\":\"\xc0\xaf\"}", 0, "application/json", 400,
         "invalid_json"},
        {"escaped NUL", "{\"control_commit\":\"abc\\u0000def\"}", 0, "application/json", 400,
         "invalid_json"},
        {"raw NUL", nul, sizeof nul - 1, "application/json", 400, "invalid_json"},
        {"deep array", deep, 0, "application/json", 400, "invalid_json"},
        {"deep value", deep2, 0, "application/json", 400, "invalid_json"},
        {"text/plain", "{\"control_commit\":\"abcdef0\"}", 0, "text/plain", 415,
         "unsupported_media_type"},
        {"no content type", "{\"control_commit\":\"abcdef0\"}", 0, NULL, 415,
         "unsupported_media_type"},
        {"json prefix", "{\"control_commit\":\"abcdef0\"}", 0, "application/jsonx", 415,
         "unsupported_media_type"},
        {"form", "a=b", 0, "application/x-www-form-urlencoded", 415, "unsupported_media_type"},
    };
    send_bad_bodies(cases, sizeof cases / sizeof cases[0]);
    free(deep);
    free(deep2);
    /* The server is still fine, and a parameter on the type is accepted. */
    const char *h[] = {"Content-Type: application/json; charset=utf-8", NULL};
    const char *ok = "{\"control_commit\":\"abcdef0\"}";
    long st;
    json_decref(af_raw("PUT", "/v1/branches/c", ok, strlen(ok), h, &st, NULL));
    cr_assert_eq(st, 200);
    const char *h2[] = {"Content-Type: Application/JSON", NULL};
    json_decref(af_raw("PUT", "/v1/branches/c", ok, strlen(ok), h2, &st, NULL));
    cr_assert_eq(st, 200);
}

/* A body one byte over max_body_bytes is 413, whether its length is
 * declared or it arrives chunked; one at the limit is read. */
Test(api_input, body_over_limit_413)
{
    af_start(NULL);
    af_hang_build("b");
    size_t big = 2u << 20;
    char *body = malloc(big + 1);
    memset(body, ' ', big);
    body[0] = '{';
    body[big - 1] = '}';
    body[big] = 0;
    const struct bad_body cases[] = {
        {"2 MiB", body, big, "application/json", 413, "body_too_large"},
        {"limit+1", body, (1u << 20) + 1, "application/json", 413, "body_too_large"},
    };
    send_bad_bodies(cases, 2);

    /* Chunked: no length is declared, so the limit is found while reading;
     * the message then cannot name the declared size. */
    const char *hc[] = {"Content-Type: application/json", "Transfer-Encoding: chunked", NULL};
    long st;
    json_t *j = af_raw("POST", "/v1/jobs", body, big, hc, &st, NULL);
    af_expect_error(j, st, 413, "body_too_large", NULL);
    const char *msg = tu_jstr(json_object_get(j, "error"), "message");
    cr_assert(!strstr(msg, "2097152"), "not sent chunked? %s", msg);
    json_decref(j);
    j = af_raw("PUT", "/v1/branches/b", body, (1u << 20) + 1, hc, &st, NULL);
    af_expect_error(j, st, 413, "body_too_large", NULL);
    json_decref(j);

    /* Exactly the limit: a valid job padded with spaces to 1 MiB. */
    const char *job =
        af_q("{'project':'p','commit':'abcdef1','build':'b','matrix':{'models':['mlp'],"
             "'widths':['default'],'passes':['forward']}}");
    size_t lim = 1u << 20;
    memset(body, ' ', lim);
    memcpy(body, job, strlen(job));
    const char *h[] = {"Content-Type: application/json", NULL};
    j = af_raw("POST", "/v1/jobs", body, lim, h, &st, NULL);
    cr_assert_eq(st, 201, "a body of exactly max_body_bytes must be read");
    json_decref(j);
    j = af_raw("POST", "/v1/jobs", body, lim, hc, &st, NULL);
    cr_assert_eq(st, 201, "a chunked body of exactly max_body_bytes must be read");
    json_decref(j);
    cr_assert_eq(af_count_jobs(), 2);
    free(body);
    /* The daemon survived it all and runs the first job. */
    af_wait_running_cells(1);
}

/* Client input echoed in an error message (the URL, a query value) may
 * be invalid UTF-8; the reply must still be a proper error. */
Test(api_input, invalid_utf8_in_url_gets_an_error_reply)
{
    af_start(NULL);
    long st;
    af_expect_get_error("/v1/nope%FF", 404, "not_found");
    af_expect_get_error("/v1/jobs/j%FF%FE", 404, "not_found");
    af_ok_build("ok");
    char *id = af_submit1("ok", "abcdef1");
    json_t *job = af_wait_done(id);
    char p[256];
    snprintf(p, sizeof p, "/v1/jobs/%s/cells/%s/records?kind=%%FF", id,
             tu_jstr(json_array_get(json_object_get(job, "cells"), 0), "id"));
    json_t *j = af_get(p, &st);
    af_expect_error(j, st, 400, "invalid_query", "kind");
    json_decref(j);
    /* A key that is not UTF-8, reused with another body: the conflict
     * message echoes the key. */
    const char *hdrs[] = {"Content-Type: application/json", "Idempotency-Key: k\xff\xfe", NULL};
    char *b1 = strdup(af_q("{'project':'p','commit':'abcdef1','build':'ok','matrix':{'models':"
                           "['mlp'],'widths':['avx2'],'passes':['forward']}}"));
    char *b2 = strdup(af_q("{'project':'p','commit':'abcdef2','build':'ok','matrix':{'models':"
                           "['mlp'],'widths':['avx2'],'passes':['forward']}}"));
    j = af_raw("POST", "/v1/jobs", b1, strlen(b1), hdrs, &st, NULL);
    cr_assert(st == 201 || st == 400, "status %ld", st);
    json_decref(j);
    if (st == 201) {
        j = af_raw("POST", "/v1/jobs", b2, strlen(b2), hdrs, &st, NULL);
        af_expect_error(j, st, 409, "idempotency_conflict", "Idempotency-Key");
        json_decref(j);
    }
    free(b1);
    free(b2);
    json_decref(job);
    free(id);
}

/* An error message is cut at a fixed size, which may split a UTF-8
 * sequence; the reply must still be a proper error. */
Test(api_input, long_non_ascii_field_name_gets_a_reply)
{
    af_start(NULL);
    char body[4096] = "{\"a";
    for (int i = 0; i < 1000; i++)
        strcat(body, "\xc3\xa9");
    strcat(body, "\":1}");
    long st;
    json_t *j = af_call("POST", "/v1/builds", body, &st);
    cr_assert_eq(st, 400, "no reply (status %ld)", st);
    cr_assert_str_eq(tu_jstr(json_object_get(j, "error"), "code"), "unknown_field");
    json_decref(j);
    cr_assert_eq(af_count_builds(), 0);
}
