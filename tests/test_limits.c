/*
 * tests/test_limits.c - every configurable limit, crossed: request body,
 * header size (per-connection memory), connections in total and per client
 * address, the request (idle) timeout, cells per job, queued jobs in total
 * and per token (429 + Retry-After), frames per cell and the cell log cap.
 *
 * Each test sets the limit low in a config file, stays at it once (it must
 * still work) and then goes past it: the error must be clear, and nothing
 * may have been stored by the refused request. Tests that run cells turn
 * the address-space rlimit off: an ASan-built fake runner (the sanitizer
 * suite) cannot reserve its shadow memory under one. Connection-level limits are
 * tested over raw sockets, since curl would retry or pool connections.
 */
#include <criterion/criterion.h>
#include <errno.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include "storage/store.h"
#include "tests/helpers/common/api_fixtures.h"
#include "tests/helpers/common/tcp.h"
#include "tests/helpers/common/testutil.h"

static void start(struct af_env *e, const char *config_json)
{
    af_env_init(e);
    char cfg[400];
    snprintf(cfg, sizeof cfg, "%s/capd.json", e->dir);
    /* The raw requests here say "Host: capd". */
    json_t *conf = json_loads(config_json, 0, NULL);
    cr_assert_not_null(conf, "config: %s", config_json);
    json_object_set_new(conf, "allowed_hosts", json_pack("[s]", "capd"));
    cr_assert_eq(json_dump_file(conf, cfg, 0), 0);
    json_decref(conf);
    const char *extra[] = {"--config", cfg, NULL};
    af_start_capd(&e->c, e->dir, extra);
}

/* start, then the fake runner's build "fake", which the jobs here use. */
static void start_with_fake(struct af_env *e, const char *config_json)
{
    start(e, config_json);
    cr_assert_eq(tu_fake_build(&e->c, "fake", NULL), 201);
}

static void stop(struct af_env *e)
{
    int rc = tu_capd_stop(&e->c);
    if (rc != 0) {
        char *log = tu_slurp(e->c.errlog);
        size_t n = log ? strlen(log) : 0;
        cr_assert_fail("capd exits 0 on SIGTERM, not %d; its log ends: ...%s", rc,
                       log ? (n > 4000 ? log + n - 4000 : log) : "(none)");
    }
    tu_sh("rm -rf '%s'", e->dir);
}

static json_int_t count_of(const struct af_env *e, const char *path, const char *key)
{
    json_t *j = tu_json(&e->c, "GET", path, NULL, NULL);
    json_int_t n = (json_int_t)json_array_size(json_object_get(j, key));
    json_decref(j);
    return n;
}

static const char *err_code(json_t *j)
{
    const char *c = json_string_value(json_object_get(json_object_get(j, "error"), "code"));
    return c ? c : "";
}

/* ---- raw sockets ---- */

static int sock_open(const struct af_env *e)
{
    int fd = tcp_connect_local(e->c.port);
    cr_assert_geq(fd, 0, "connect: %s", strerror(errno));
    return fd;
}

static bool sock_send(int fd, const char *p, size_t n)
{
    while (n > 0) {
        ssize_t w = send(fd, p, n, MSG_NOSIGNAL);
        if (w <= 0)
            return false;
        p += w;
        n -= (size_t)w;
    }
    return true;
}

/* Reads until a complete response head plus Content-Length body, EOF, an
 * error or TIMEOUT_MS. Returns the status (0 when none), *eof set when the
 * peer closed or reset the connection. */
static int sock_response(int fd, int timeout_ms, bool *eof, char *buf, size_t cap)
{
    size_t n = 0;
    double deadline = tu_now_s() + timeout_ms / 1000.0;
    *eof = false;
    buf[0] = 0;
    for (;;) {
        int left = (int)((deadline - tu_now_s()) * 1000);
        if (left <= 0)
            break;
        struct pollfd p = {.fd = fd, .events = POLLIN};
        if (poll(&p, 1, left) <= 0)
            break;
        ssize_t r = recv(fd, buf + n, cap - 1 - n, 0);
        if (r <= 0) {
            *eof = true;
            break;
        }
        n += (size_t)r;
        buf[n] = 0;
        char *end = strstr(buf, "\r\n\r\n");
        const char *cl = strcasestr(buf, "Content-Length:");
        if (end && cl && (size_t)(end + 4 - buf) + strtoul(cl + 15, NULL, 10) <= n)
            break;
        if (n + 1 >= cap)
            break;
    }
    int status = 0;
    if (strncmp(buf, "HTTP/1.", 7) == 0)
        status = atoi(buf + 9);
    return status;
}

static const char get_healthz[] = "GET /healthz HTTP/1.1\r\nHost: capd\r\n\r\n";

/* A kept-alive connection that was served once (so MHD has accepted it). */
static int served_conn(const struct af_env *e)
{
    char buf[4096];
    bool eof;
    int fd = sock_open(e);
    cr_assert(sock_send(fd, get_healthz, sizeof get_healthz - 1));
    cr_assert_eq(sock_response(fd, 5000, &eof, buf, sizeof buf), 200, "served: %s", buf);
    return fd;
}

/* REQ (LEN bytes) on a new connection, closed afterwards: the status
 * sock_response gives within TIMEOUT_MS (0: no response), whether the
 * connection reached EOF in *EOF, the response (or what came) in BUF. A send
 * cut short is no failure: capd may close before reading it all. */
static int send_once(const struct af_env *e, const char *req, size_t len, int timeout_ms, bool *eof,
                     char *buf, size_t cap)
{
    int fd = sock_open(e);
    sock_send(fd, req, len);
    int st = sock_response(fd, timeout_ms, eof, buf, cap);
    close(fd);
    return st;
}

/* One GET /healthz on a new connection (send_once). */
static int healthz_once(const struct af_env *e, int timeout_ms, bool *eof, char *buf, size_t cap)
{
    return send_once(e, get_healthz, sizeof get_healthz - 1, timeout_ms, eof, buf, cap);
}

/* ===================================================== request body */

Test(limits, body_size)
{
    struct af_env e;
    start(&e, "{\"max_body_bytes\": 4096}");
    char *fake = tu_helper("fake_runner");
    char body[8192];
    int n = snprintf(body, sizeof body, "{\"name\":\"b\",\"python\":\"%s\"}", fake);
    free(fake);
    const char *hdr[] = {"Content-Type: application/json", NULL};
    const char *chunked[] = {"Content-Type: application/json", "Transfer-Encoding: chunked", NULL};
    struct tu_resp r;
    /* One byte over, declared and chunked: 413, nothing stored. */
    memset(body + n - 1, ' ', 4097 - (size_t)n);
    body[4096] = '}';
    body[4097] = 0;
    tu_http(&e.c, "POST", "/v1/builds", body, 4097, hdr, &r);
    cr_assert_eq(r.status, 413, "declared 4097 bytes: %ld %s", r.status, r.body);
    cr_assert(strstr(r.body, "body_too_large"), "%s", r.body);
    tu_resp_free(&r);
    tu_http(&e.c, "POST", "/v1/builds", body, 4097, chunked, &r);
    cr_assert_eq(r.status, 413, "chunked 4097 bytes: %ld %s", r.status, r.body);
    tu_resp_free(&r);
    cr_assert_eq(count_of(&e, "/v1/builds", "builds"), 0, "an oversized body was stored");
    /* At the limit it is accepted. */
    body[4095] = '}';
    body[4096] = 0;
    tu_http(&e.c, "POST", "/v1/builds", body, 4096, hdr, &r);
    cr_assert_eq(r.status, 201, "exactly 4096 bytes: %ld %s", r.status, r.body);
    tu_resp_free(&r);
    stop(&e);
}

/* ===================================================== headers */

/* A header block larger than the per-connection memory is refused by MHD
 * (431, or 413 from older versions, or the connection closed): never
 * served, never stored. */
static void big_header(const struct af_env *e, size_t hbytes, bool want_refused)
{
    char *fake = tu_helper("fake_runner");
    char json[1024];
    int jn = snprintf(json, sizeof json, "{\"name\":\"h%zu\",\"python\":\"%s\"}", hbytes, fake);
    free(fake);
    size_t cap = hbytes + 4096;
    char *req = malloc(cap);
    int hn = snprintf(req, cap,
                      "POST /v1/builds HTTP/1.1\r\nHost: capd\r\nContent-Type: application/json\r\n"
                      "Authorization: Bearer %s\r\nContent-Length: %d\r\nConnection: close\r\n"
                      "X-Pad: ",
                      e->c.token, jn);
    memset(req + hn, 'a', hbytes);
    size_t len = (size_t)hn + hbytes;
    len += (size_t)snprintf(req + len, cap - len, "\r\n\r\n%s", json);
    char buf[8192];
    bool eof;
    int st = send_once(e, req, len, 10000, &eof, buf, sizeof buf);
    free(req);
    if (want_refused) {
        cr_assert(st == 431 || st == 413 || (st == 0 && eof),
                  "a %zu-byte header got status %d: %.200s", hbytes, st, buf);
    } else {
        cr_assert_eq(st, 201, "a %zu-byte header is within the limit: %.300s", hbytes, buf);
    }
}

/* Under CONFIG_JSON, a header block of OVER bytes is refused and stores
 * nothing, and one of WITHIN bytes is served (and, with COUNT_WITHIN, its
 * build is then the only one stored). */
static void header_limit(const char *config_json, size_t over, size_t within, bool count_within)
{
    struct af_env e;
    start(&e, config_json);
    big_header(&e, over, true);
    cr_assert_eq(count_of(&e, "/v1/builds", "builds"), 0, "a refused request stored a build");
    big_header(&e, within, false);
    if (count_within)
        cr_assert_eq(count_of(&e, "/v1/builds", "builds"), 1);
    stop(&e);
}

Test(limits, header_size_default_64k)
{
    header_limit("{}", 100 * 1024, 16 * 1024, true);
}

Test(limits, header_size_configured)
{
    header_limit("{\"connection_memory_bytes\": 16384}", 20 * 1024, 4 * 1024, false);
}

/* ===================================================== connections */

/* Fills a connection limit of N: N kept-alive connections, each served
 * once, into FDS; asserts that one more (WHAT names it) gets no response
 * within TIMEOUT_MS, and returns whether capd closed it at once. */
static bool fill_connections(const struct af_env *e, int *fds, int n, int timeout_ms,
                             const char *what)
{
    for (int i = 0; i < n; i++)
        fds[i] = served_conn(e);
    char buf[4096];
    bool eof;
    int st = healthz_once(e, timeout_ms, &eof, buf, sizeof buf);
    cr_assert_eq(st, 0, "%s was served: %s", what, buf);
    return eof;
}

Test(limits, connections_total, .timeout = 60)
{
    struct af_env e;
    start(&e, "{\"http_threads\": 1, \"max_connections\": 4, \"max_connections_per_ip\": 4}");
    int fds[4];
    /* The fifth is not served while four are open (MHD either stops
     * accepting or closes it at once). */
    fill_connections(&e, fds, 4, 1500, "a fifth connection");
    /* Once one is closed, a new connection is served again. */
    close(fds[0]);
    bool served = false;
    for (int i = 0; i < 20 && !served; i++) {
        char buf[4096];
        bool eof;
        usleep(100 * 1000);
        served = healthz_once(&e, 1000, &eof, buf, sizeof buf) == 200;
    }
    cr_assert(served, "capd serves again below the limit");
    for (int i = 1; i < 4; i++)
        close(fds[i]);
    stop(&e);
}

Test(limits, connections_per_client_address, .timeout = 60)
{
    struct af_env e;
    start(&e, "{\"max_connections\": 64, \"max_connections_per_ip\": 3}");
    int fds[3];
    bool eof = fill_connections(&e, fds, 3, 2000, "a fourth connection from one address");
    cr_assert(eof, "the fourth connection is closed at once");
    close(fds[0]);
    usleep(200 * 1000);
    close(served_conn(&e));
    close(fds[1]);
    close(fds[2]);
    stop(&e);
}

Test(limits, config_refuses_per_ip_over_total)
{
    char *d = tu_tmpdir();
    char cfg[400];
    snprintf(cfg, sizeof cfg, "%s/capd.json", d);
    FILE *f = fopen(cfg, "w");
    fputs("{\"max_connections\": 4, \"max_connections_per_ip\": 8}", f);
    fclose(f);
    int rc = tu_sh("'%s' --listen 127.0.0.1:0 --data-dir '%s/data' --config '%s' "
                   ">/dev/null 2>'%s/err'",
                   tu_bin("CAPD_BIN"), d, cfg, d);
    char p[400];
    snprintf(p, sizeof p, "%s/err", d);
    char *err = tu_slurp(p);
    cr_assert(rc != 0 && strstr(err, "max_connections_per_ip"), "rc %d: %s", rc, err);
    free(err);
    tu_sh("rm -rf '%s'", d);
    free(d);
}

/* ===================================================== request timeout */

/* Half a request, then silence: the connection is closed once it has been
 * idle for request_timeout_s (here 2 s, against a default of 30). */
Test(limits, request_timeout_closes_half_requests, .timeout = 60)
{
    struct af_env e;
    start(&e, "{\"request_timeout_s\": 2}");
    int fd = sock_open(&e);
    const char half[] = "GET /healthz HTTP/1.1\r\nHost: capd\r\n";
    double t0 = tu_now_s();
    cr_assert(sock_send(fd, half, sizeof half - 1));
    char buf[1024];
    bool eof;
    int st = sock_response(fd, 10000, &eof, buf, sizeof buf);
    double dt = tu_now_s() - t0;
    close(fd);
    cr_assert(eof, "the connection was still open after 10 s (status %d)", st);
    cr_assert_neq(st, 200, "half a request was served");
    cr_assert(dt >= 1.5 && dt < 8, "closed after %.2f s; want about 2", dt);
    /* A complete request right away is still served. */
    close(served_conn(&e));
    stop(&e);
}

/* ===================================================== jobs */

/* A job of MODELS cells: MODEL itself when one, else MODEL__0, MODEL__1...
 * (the fake runner ignores the argument of hang). */
static const char *job_body(char *buf, size_t n, int models, const char *model)
{
    size_t o = (size_t)snprintf(buf, n,
                                "{\"project\":\"t\",\"commit\":\"abcdef1\",\"build\":\"fake\","
                                "\"matrix\":{\"models\":[");
    for (int i = 0; i < models; i++) {
        if (models == 1)
            o += (size_t)snprintf(buf + o, n - o, "\"%s\"", model);
        else
            o += (size_t)snprintf(buf + o, n - o, "%s\"%s__%d\"", i ? "," : "", model, i);
    }
    snprintf(buf + o, n - o, "],\"widths\":[\"avx2\"],\"passes\":[\"forward\"]}}");
    return buf;
}

Test(limits, cells_per_job)
{
    struct af_env e;
    start_with_fake(&e, "{\"max_cells_per_job\": 4}");
    char body[2048];
    long st;
    json_t *j = tu_json(&e.c, "POST", "/v1/jobs", job_body(body, sizeof body, 5, "fake:hang"), &st);
    cr_assert_eq(st, 400, "%s", body);
    cr_assert_str_eq(err_code(j), "too_many_cells");
    cr_assert(strstr(json_string_value(json_object_get(json_object_get(j, "error"), "message")),
                     "5 cells; the limit is 4"));
    json_decref(j);
    cr_assert_eq(count_of(&e, "/v1/jobs", "jobs"), 0, "a refused job was stored");
    j = tu_json(&e.c, "POST", "/v1/jobs", job_body(body, sizeof body, 4, "fake:hang"), &st);
    cr_assert_eq(st, 201, "4 cells are within the limit");
    char path[128];
    snprintf(path, sizeof path, "/v1/jobs/%s/cancel", json_string_value(json_object_get(j, "id")));
    json_decref(j);
    json_decref(tu_json(&e.c, "POST", path, "{}", &st));
    stop(&e);
}

Test(limits, queued_jobs_total_429_with_retry_after)
{
    struct af_env e;
    start_with_fake(&e, "{\"max_queued_jobs\": 1}");
    char *job = tu_submit(&e.c, "fake", "fake:hang", NULL);
    cr_assert_not_null(job);
    char body[1024];
    const char *hdr[] = {"Content-Type: application/json", NULL};
    struct tu_resp r;
    job_body(body, sizeof body, 1, "fake:hang");
    tu_http(&e.c, "POST", "/v1/jobs", body, strlen(body), hdr, &r);
    cr_assert_eq(r.status, 429, "%s", r.body);
    cr_assert(strcasestr(r.headers, "Retry-After: "), "%s", r.headers);
    cr_assert(strstr(r.body, "too_many_jobs"), "%s", r.body);
    tu_resp_free(&r);
    cr_assert_eq(count_of(&e, "/v1/jobs", "jobs"), 1);
    char path[128];
    long st;
    snprintf(path, sizeof path, "/v1/jobs/%s/cancel", job);
    json_decref(tu_json(&e.c, "POST", path, "{}", &st));
    free(job);
    stop(&e);
}

static char *make_token(const struct af_env *e, const char *scope)
{
    char out[400];
    snprintf(out, sizeof out, "%s/tok.out", e->dir);
    cr_assert_eq(tu_sh("'%s' token create --data-dir '%s' --scope %s >'%s' 2>/dev/null",
                       tu_bin("CAPD_BIN"), e->data, scope, out),
                 0);
    char *t = tu_slurp(out);
    t[strcspn(t, "\n")] = 0;
    cr_assert_eq(strlen(t), STORE_TOKEN_LEN);
    return t;
}

static long post_as(const struct af_env *e, const char *token, const char *path, const char *body,
                    struct tu_resp *r)
{
    char auth[200];
    snprintf(auth, sizeof auth, "Authorization: Bearer %s", token);
    const char *hdr[] = {auth, "Content-Type: application/json", NULL};
    tu_http(&e->c, "POST", path, body, strlen(body), hdr, r);
    return r->status;
}

static long get_as(const struct af_env *e, const char *token, const char *path, json_t **out)
{
    char auth[200];
    struct tu_resp r;
    snprintf(auth, sizeof auth, "Authorization: Bearer %s", token);
    const char *hdr[] = {auth, NULL};
    tu_http(&e->c, "GET", path, NULL, 0, hdr, &r);
    *out = json_loadb(r.body, r.len, 0, NULL);
    long st = r.status;
    tu_resp_free(&r);
    return st;
}

Test(limits, queued_jobs_per_token_429_with_retry_after, .timeout = 60)
{
    struct af_env e;
    start(&e, "{\"auth_required\": true, \"max_queued_jobs_per_token\": 2}");
    char *ad = make_token(&e, "admin"), *a = make_token(&e, "submit"),
         *b = make_token(&e, "submit");
    char *fake = tu_helper("fake_runner"), bb[1024], body[1024];
    snprintf(bb, sizeof bb, "{\"name\":\"fake\",\"python\":\"%s\",\"model_roots\":[\"%s\"]}", fake,
             e.c.dir);
    free(fake);
    struct tu_resp r;
    cr_assert_eq(post_as(&e, ad, "/v1/builds", bb, &r), 201);
    tu_resp_free(&r);
    job_body(body, sizeof body, 1, "fake:hang");
    char ids[2][32];
    for (int i = 0; i < 2; i++) {
        cr_assert_eq(post_as(&e, a, "/v1/jobs", body, &r), 201, "job %d: %s", i, r.body);
        json_t *j = json_loadb(r.body, r.len, 0, NULL);
        snprintf(ids[i], sizeof ids[i], "%s", json_string_value(json_object_get(j, "id")));
        json_decref(j);
        tu_resp_free(&r);
    }
    /* The third of token A: 429, a Retry-After, nothing stored. */
    cr_assert_eq(post_as(&e, a, "/v1/jobs", body, &r), 429, "%s", r.body);
    cr_assert(strcasestr(r.headers, "Retry-After: 30"), "%s", r.headers);
    cr_assert(strstr(r.body, "too_many_jobs_for_token"), "%s", r.body);
    tu_resp_free(&r);
    json_t *list = NULL;
    cr_assert_eq(get_as(&e, a, "/v1/jobs", &list), 200);
    cr_assert_eq(json_array_size(json_object_get(list, "jobs")), 2, "a refused job was stored");
    json_decref(list);
    /* Another token has its own allowance. */
    cr_assert_eq(post_as(&e, b, "/v1/jobs", body, &r), 201, "%s", r.body);
    tu_resp_free(&r);
    /* Once one of A's jobs ends, A may post again. */
    char path[128];
    snprintf(path, sizeof path, "/v1/jobs/%s/cancel", ids[1]);
    cr_assert_eq(post_as(&e, a, path, "{}", &r), 202, "%s", r.body);
    tu_resp_free(&r);
    cr_assert_eq(post_as(&e, a, "/v1/jobs", body, &r), 201, "%s", r.body);
    tu_resp_free(&r);
    /* Clean up: admin cancels whatever is left. */
    cr_assert_eq(get_as(&e, ad, "/v1/jobs", &list), 200);
    size_t i;
    json_t *jv;
    json_array_foreach(json_object_get(list, "jobs"), i, jv)
    {
        snprintf(path, sizeof path, "/v1/jobs/%s/cancel",
                 json_string_value(json_object_get(jv, "id")));
        post_as(&e, ad, path, "{}", &r);
        tu_resp_free(&r);
    }
    json_decref(list);
    free(ad);
    free(a);
    free(b);
    stop(&e);
}

/* ===================================================== per-cell caps */

/* Starts capd with the per-cell cap in CONFIG_JSON and runs one cell of
 * MODEL under it (af_run_cell); returns the cell, its job id in *JOB. */
static json_t *run_capped(struct af_env *e, const char *config_json, const char *model, char **job)
{
    start_with_fake(e, config_json);
    return af_run_cell(&e->c, model, NULL, job);
}

/* fake:stream writes 100000 frames; the cell may have 50. */
Test(limits, frames_per_cell, .timeout = 120)
{
    struct af_env e;
    char *job;
    json_t *cell =
        run_capped(&e, "{\"frame_max_frames\": 50, \"rlimit_as_bytes\": 0}", "fake:stream", &job);
    const char *state = json_string_value(json_object_get(cell, "state"));
    const char *reason = json_string_value(json_object_get(cell, "reason"));
    cr_assert_str_eq(state, "protocol_error", "%s", reason ? reason : "");
    cr_assert(reason && strstr(reason, "frame limit") && strstr(reason, "50"), "%s",
              reason ? reason : "");
    const char *k;
    json_t *v;
    json_int_t total = 0;
    json_object_foreach(json_object_get(cell, "record_counts"), k, v) total +=
        json_integer_value(v);
    cr_assert_leq(total, 50, "%lld records stored past the limit", (long long)total);
    cr_assert_gt(total, 0, "the records before the limit are kept");
    json_decref(cell);
    /* Under the limit the same daemon runs a normal cell fine. */
    free(job);
    cell = af_run_cell(&e.c, "fake:ok", NULL, &job);
    cr_assert_str_eq(json_string_value(json_object_get(cell, "state")), "ok");
    json_decref(cell);
    free(job);
    stop(&e);
}

/* fake:flood__1 writes 1 MiB of stdout and 64 KiB of stderr; the log keeps
 * a tail of at most cell_log_max_bytes and says so. */
Test(limits, cell_log_cap, .timeout = 120)
{
    struct af_env e;
    char *job;
    json_t *cell = run_capped(&e, "{\"cell_log_max_bytes\": 4096, \"rlimit_as_bytes\": 0}",
                              "fake:flood__1", &job);
    cr_assert_str_eq(json_string_value(json_object_get(cell, "state")), "ok", "%s",
                     json_string_value(json_object_get(cell, "reason")));
    char path[160];
    snprintf(path, sizeof path, "/v1/jobs/%s/cells/%s/log", job,
             json_string_value(json_object_get(cell, "id")));
    struct tu_resp r;
    tu_http(&e.c, "GET", path, NULL, 0, NULL, &r);
    cr_assert_eq(r.status, 200);
    cr_assert_leq(r.len, 4096 + 200, "the log holds %zu bytes", r.len);
    cr_assert_gt(r.len, 1024, "the tail is kept");
    cr_assert(strstr(r.body, "cap"), "the log says it was capped: %.200s", r.body);
    tu_resp_free(&r);
    json_decref(cell);
    free(job);
    stop(&e);
}
