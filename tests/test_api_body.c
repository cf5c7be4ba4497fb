/*
 * tests/test_api_body.c - what the route table says of a request's body
 * and of holding its connection (api/server.c, struct route), end to end
 * on a real capd: a route that takes no body refuses one (413, naming the
 * route) before its handler runs, so nothing changes; a JSON route and a
 * worker's upload route read up to max_body_bytes and refuse a byte more;
 * a path no route takes still gets its 404 or 405 whatever it sent; and
 * the live routes (the job long-poll, the event stream) still wait. The
 * fixture (a real capd per test): api_fixtures.h.
 */
#include <criterion/criterion.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "tests/helpers/common/api_fixtures.h"
#include "tests/helpers/common/testutil.h"

TestSuite(api_body, AF_SUITE);

static const char *const JSON_HDR[] = {"Content-Type: application/json", NULL};
static const char *const CHUNKED_HDR[] = {"Content-Type: application/json",
                                          "Transfer-Encoding: chunked", NULL};

/* METHOD PATH with BODY (LEN bytes) under HDRS must be 413 body_too_large
 * whose message holds WANT. A refused upload may race the server's close:
 * a transport failure is retried, never a reply. */
static void expect_413(const char *method, const char *path, const char *body, size_t len,
                       const char *const *hdrs, const char *want)
{
    long st = 0;
    json_t *j = NULL;
    for (int t = 0; t < 5 && st == 0; t++) {
        json_decref(j);
        j = af_raw(method, path, body, len, hdrs, &st, NULL);
    }
    char *s = af_dump(j);
    cr_assert_eq(st, 413, "%s %s with %zu bytes: %ld %s", method, path, len, st, s);
    af_expect_error(j, st, 413, "body_too_large", NULL);
    const char *msg = tu_jstr(json_object_get(j, "error"), "message");
    cr_assert(msg && strstr(msg, want), "%s %s: the message does not say '%s': %s", method, path,
              want, s);
    free(s);
    json_decref(j);
}

/* A state of job ID as GET /v1/jobs/ID gives it (static copy). */
static const char *job_state(const char *id)
{
    static char state[32];
    json_t *j = af_get_job(id);
    snprintf(state, sizeof state, "%s", tu_jstr(j, "state"));
    json_decref(j);
    return state;
}

/* An action's body (a POST that takes no input) is read and ignored up to
 * 4096 bytes, as clients send {} along; past that it is refused before the
 * handler runs, declared or chunked, and the cancel cancelled nothing. An
 * empty body and {} are taken. */
Test(api_body, cancel_ignores_a_small_body_and_refuses_a_large_one)
{
    af_start(NULL);
    af_hang_build("b");
    char *id = af_submit1("b", "abcdef1");
    char path[128], big[4098];
    snprintf(path, sizeof path, "/v1/jobs/%s/cancel", id);
    memset(big, ' ', sizeof big);
    big[0] = '{';
    big[4096] = '}';
    const char *want = "POST /v1/jobs/:id/cancel takes no input; it ignores a request body of "
                       "up to 4096 bytes";
    expect_413("POST", path, big, 4097, JSON_HDR, want);
    expect_413("POST", path, big, 4097, CHUNKED_HDR, want);
    cr_assert_neq(strcmp(job_state(id), "cancelled"), 0, "a refused cancel cancelled the job");
    long st;
    json_t *j = af_raw("POST", path, big, 4096, JSON_HDR, &st, NULL);
    cr_assert_eq(st, 202, "4096 bytes are ignored: %s", af_dump(j));
    json_decref(j);
    cr_assert_str_eq(job_state(id), "cancelled");
    free(id);
    id = af_submit1("b", "abcdef2");
    snprintf(path, sizeof path, "/v1/jobs/%s/cancel", id);
    j = af_raw("POST", path, "{}", 2, JSON_HDR, &st, NULL);
    cr_assert_eq(st, 202, "%s", af_dump(j));
    json_decref(j);
    cr_assert_str_eq(job_state(id), "cancelled");
    free(id);
}

/* The revoked_at of token ID in GET /v1/tokens (json null: not revoked;
 * valid until the next call). Fails the test when the token is not
 * listed. */
static json_t *token_revoked_at(const char *id)
{
    static json_t *list;
    json_decref(list);
    list = af_get_ok("/v1/tokens");
    size_t i;
    json_t *t;
    json_array_foreach(json_object_get(list, "tokens"), i, t)
    {
        if (strcmp(tu_jstr(t, "id"), id) == 0)
            return json_object_get(t, "revoked_at");
    }
    cr_assert_fail("token %s is not listed: %s", id, af_dump(list));
    return NULL;
}

/* Every kind of body-less route refuses a body: a GET, a DELETE (the token
 * stays); the same requests without one are answered. */
Test(api_body, gets_and_deletes_refuse_a_body)
{
    af_start(NULL);
    expect_413("GET", "/v1/jobs", "{}", 2, JSON_HDR, "GET /v1/jobs takes no request body");
    expect_413("GET", "/healthz", "x", 1, CHUNKED_HDR, "GET /healthz takes no request body");
    long st;
    json_t *t = af_callq("POST", "/v1/tokens", "{'scope':'read','name':'victim'}", &st);
    cr_assert_eq(st, 201, "%s", af_dump(t));
    char path[128];
    snprintf(path, sizeof path, "/v1/tokens/%s", tu_jstr(t, "id"));
    json_decref(t);
    expect_413("DELETE", path, "{}", 2, JSON_HDR, "DELETE /v1/tokens/:id takes no request body");
    cr_assert(json_is_null(token_revoked_at(path + strlen("/v1/tokens/"))),
              "a refused DELETE revoked the token");
    json_t *j = af_call("DELETE", path, NULL, &st);
    cr_assert_eq(st, 200, "%s", af_dump(j));
    cr_assert(json_is_true(json_object_get(j, "revoked")));
    json_decref(j);
    cr_assert(json_is_string(token_revoked_at(path + strlen("/v1/tokens/"))));
    json_decref(af_get_ok("/v1/jobs"));
}

/* A path no route takes is answered 404 or 405 whatever body came with it:
 * the body is dropped, not read up to a limit or held against it. */
Test(api_body, unrouted_paths_with_a_body_are_404_or_405)
{
    af_start(NULL);
    size_t big = (1u << 20) + 4096;
    char *body = malloc(big);
    memset(body, 'x', big);
    long st = 0;
    json_t *j = NULL;
    for (int t = 0; t < 5 && st == 0; t++) {
        json_decref(j);
        j = af_raw("POST", "/v1/nope", body, big, JSON_HDR, &st, NULL);
    }
    af_expect_error(j, st, 404, "not_found", NULL);
    json_decref(j);
    struct tu_resp r;
    j = af_raw("DELETE", "/v1/jobs", "{}", 2, JSON_HDR, &st, &r);
    af_expect_error(j, st, 405, "method_not_allowed", NULL);
    cr_assert_str_eq(af_header(r.headers, "Allow"), "GET, POST");
    tu_resp_free(&r);
    json_decref(j);
    free(body);
    cr_assert_eq(af_count_jobs(), 0);
}

/* With max_body_bytes 4096, a JSON route reads exactly that much and
 * refuses a byte more, declared or chunked, naming its limit and route;
 * nothing refused is stored. */
Test(api_body, json_routes_read_up_to_max_body_bytes)
{
    af_ensure_dir();
    const char *cfg = af_write_file("capd.json", "{\"max_body_bytes\": 4096}", 0644);
    const char *extra[] = {"--config", cfg, NULL};
    af_start(extra);
    size_t lim = 4096;
    char *body = malloc(lim + 2);
    const char *b = af_q("{'control_commit':'abcdef0'}");
    memset(body, ' ', lim + 1);
    memcpy(body, b, strlen(b));
    body[lim + 1] = 0;
    const char *want = "exceeds the limit of 4096 bytes of PUT /v1/branches/:name";
    expect_413("PUT", "/v1/branches/b", body, lim + 1, JSON_HDR, want);
    expect_413("PUT", "/v1/branches/b", body, lim + 1, CHUNKED_HDR, want);
    expect_413("POST", "/v1/jobs", body, lim + 1, JSON_HDR,
               "exceeds the limit of 4096 bytes of POST /v1/jobs");
    long st;
    json_t *j = af_get("/v1/branches/b", &st);
    cr_assert_eq(st, 404, "a refused body stored the branch: %s", af_dump(j));
    json_decref(j);
    j = af_raw("PUT", "/v1/branches/b", body, lim, CHUNKED_HDR, &st, NULL);
    cr_assert_eq(st, 200, "a chunked body of exactly max_body_bytes must be read: %s", af_dump(j));
    json_decref(j);
    j = af_raw("PUT", "/v1/branches/c", body, lim, JSON_HDR, &st, NULL);
    cr_assert_eq(st, 200, "a body of exactly max_body_bytes must be read: %s", af_dump(j));
    json_decref(j);
    json_decref(af_get_ok("/v1/branches/c"));
    free(body);
}

/* The live routes still hold their connection: GET /v1/jobs/{id}?wait=1 on
 * a job that does not change answers after about a second (the hub resumes
 * it and it comes back to its handler), and GET /v1/events streams. A body
 * is no more welcome there than on any GET. */
Test(api_body, live_routes_still_wait)
{
    af_start(NULL);
    af_hang_build("b");
    char *id = af_submit1("b", "abcdef1");
    json_decref(af_wait_cell(id, 0, "running", 20));
    char path[128];
    snprintf(path, sizeof path, "/v1/jobs/%s?wait=1", id);
    struct timespec t0, t1;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    long st;
    json_t *j = af_get(path, &st);
    clock_gettime(CLOCK_MONOTONIC, &t1);
    double s = (double)(t1.tv_sec - t0.tv_sec) + (double)(t1.tv_nsec - t0.tv_nsec) / 1e9;
    cr_assert_eq(st, 200, "%s", af_dump(j));
    cr_assert_str_eq(tu_jstr(j, "id"), id);
    cr_assert(s >= 0.8 && s < 10, "the long-poll answered after %.2f s, not about 1 s", s);
    json_decref(j);
    expect_413("GET", path, "{}", 2, JSON_HDR, "GET /v1/jobs/:id takes no request body");
    expect_413("GET", "/v1/events", "{}", 2, JSON_HDR, "GET /v1/events takes no request body");
    char *text = tu_events_until(&af_capd, "/v1/events", "capd event stream", 5000);
    cr_assert(strstr(text, "capd event stream"), "no event stream: %s", text);
    free(text);
    free(id);
}

/* Waits for capd's remote_launch to write "ATTEMPT TOKEN" to PATH; the
 * attempt's id, and its "Authorization: Bearer ..." header into AUTH. */
static long long launched(const char *path, char *auth, size_t n)
{
    char *t = NULL;
    for (int i = 0; i < 200 && !(t && t[0]); i++) {
        free(t);
        t = tu_slurp(path);
        if (!t[0])
            usleep(50 * 1000);
    }
    long long attempt = 0;
    char token[128] = "";
    cr_assert(t && sscanf(t, "%lld %127s", &attempt, token) == 2, "remote_launch wrote %s", t);
    free(t);
    snprintf(auth, n, "Authorization: Bearer %s", token);
    return attempt;
}

/* A worker's upload route reads a chunk of up to max_body_bytes (the
 * chunk_max_bytes its spec names) and refuses one byte more, appending
 * nothing of it; its spec route takes no body. */
Test(api_body, worker_uploads_read_up_to_their_chunk)
{
    af_ensure_dir();
    char launch[512], text[1800];
    snprintf(launch, sizeof launch, "%s/launch.txt", af_dir);
    snprintf(text, sizeof text,
             "{\"max_body_bytes\": 4096, \"executor\": \"remote\", \"remote_launch\": "
             "\"echo \\\"$CAPD_ATTEMPT $CAPD_TOKEN\\\" > %s.tmp && mv %s.tmp %s\"}",
             launch, launch, launch);
    const char *cfg = af_write_file("capd.json", text, 0644);
    const char *extra[] = {"--config", cfg, NULL};
    af_start(extra);
    cr_assert_eq(tu_fake_build(&af_capd, "fake", NULL), 201);
    char *job = tu_submit(&af_capd, "fake", "fake:ok__5", NULL);
    cr_assert_not_null(job);
    char auth[200], path[160];
    long long attempt = launched(launch, auth, sizeof auth);
    const char *hdrs[] = {auth, "Content-Type: application/octet-stream", NULL};
    snprintf(path, sizeof path, "/v1/attempts/%lld/spec", attempt);
    long st;
    json_t *spec = af_raw("GET", path, NULL, 0, hdrs, &st, NULL);
    cr_assert_eq(st, 200, "%s", af_dump(spec));
    cr_assert_eq(json_integer_value(json_object_get(spec, "chunk_max_bytes")), 4096);
    json_decref(spec);
    expect_413("GET", path, "x", 1, hdrs, "GET /v1/attempts/:attempt/spec takes no request body");

    char *chunk = malloc(4097);
    memset(chunk, 'a', 4097);
    snprintf(path, sizeof path, "/v1/attempts/%lld/log?offset=0", attempt);
    expect_413("POST", path, chunk, 4097, hdrs,
               "exceeds the limit of 4096 bytes of POST /v1/attempts/:attempt/log");
    json_t *j = af_raw("POST", path, chunk, 4096, hdrs, &st, NULL);
    cr_assert_eq(st, 200, "a full chunk must be read: %s", af_dump(j));
    cr_assert_eq(json_integer_value(json_object_get(j, "received")), 4096,
                 "the refused chunk appended bytes: %s", af_dump(j));
    json_decref(j);
    snprintf(path, sizeof path, "/v1/attempts/%lld/log?offset=4096", attempt);
    j = af_raw("POST", path, chunk, 1, hdrs, &st, NULL);
    cr_assert_eq(st, 200, "%s", af_dump(j));
    cr_assert_eq(json_integer_value(json_object_get(j, "received")), 4097);
    json_decref(j);
    free(chunk);
    free(job);
}
