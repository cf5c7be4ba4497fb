/*
 * tests/test_live.c - polling done right, over real HTTP against a real
 * capd: ETags and 304 on jobs, cells, lists, comparisons and records; the
 * long-poll GET /v1/jobs/{id}?wait=N (woken by a change, timing out, and
 * many of them waiting at once on a two-thread server); GET /v1/events
 * (live events, filters, Last-Event-ID resume, the stream cap,
 * heartbeats, shutdown with streams open); GET /metrics; the dashboard's
 * static files.
 *
 * Cells run the fake runner (tests/helpers/fake_runner.c): fake:ok for
 * quick cells, fake:hang for a job that stays running until cancelled.
 */
#include <criterion/criterion.h>
#include <curl/curl.h>
#include <dirent.h>
#include <errno.h>
#include <poll.h>
#include <pthread.h>
#include <regex.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include "tests/helpers/common/api_fixtures.h"
#include "tests/helpers/common/tcp.h"
#include "tests/helpers/common/testutil.h"

static struct tu_capd g_capd;
static char *g_dir;

static void teardown(void)
{
    af_stop_capd(&g_capd, &g_dir);
}

TestSuite(etag, .fini = teardown, .timeout = 120);
TestSuite(longpoll, .fini = teardown, .timeout = 120);
TestSuite(events, .fini = teardown, .timeout = 120);
TestSuite(metrics, .fini = teardown, .timeout = 120);
TestSuite(dashboard, .fini = teardown, .timeout = 60);
TestSuite(schema, .timeout = 30);

/* ---- helpers ---- */

/* Starts capd with CONFIG (a JSON object text, or NULL) as its config file
 * and registers the fake runner as build "fake" (unless auth is on). */
static void start(const char *config)
{
    g_dir = tu_tmpdir();
    cr_assert_not_null(g_dir);
    char cfg[512];
    snprintf(cfg, sizeof cfg, "%s/capd.json", g_dir);
    af_put_file(cfg, config ? config : "{}");
    const char *extra[] = {"--config", cfg, NULL};
    af_start_capd(&g_capd, g_dir, extra);
    /* A test that configures auth itself sends its own tokens. */
    if (config && strstr(config, "auth_required"))
        tu_anonymous(&g_capd);
    else
        cr_assert_eq(tu_fake_build(&g_capd, "fake", NULL), 201);
}

/* GET PATH with an optional If-None-Match; returns the status, the ETag
 * (copied into ETAG_OUT when non-NULL) and the body length. */
static long get_tagged(const char *path, const char *inm, char etag_out[128], size_t *len)
{
    char h[400];
    const char *hdrs[] = {h, NULL};
    snprintf(h, sizeof h, "If-None-Match: %s", inm ? inm : "");
    struct tu_resp r;
    tu_http(&g_capd, "GET", path, NULL, 0, inm ? hdrs : NULL, &r);
    const char *e = af_header(r.headers, "ETag");
    if (etag_out)
        snprintf(etag_out, 128, "%s", e ? e : "");
    if (len)
        *len = r.len;
    long st = r.status;
    tu_resp_free(&r);
    return st;
}

static char *submit(const char *commit, const char *models, const char *extra)
{
    long st;
    json_t *j = tu_jsonf(&g_capd, "POST", "/v1/jobs", &st,
                         "{\"project\":\"p\",\"commit\":\"%s\",\"branch\":\"main\","
                         "\"build\":\"fake\",\"matrix\":{\"models\":[%s],"
                         "\"widths\":[\"avx2\",\"default\"],\"passes\":[\"forward\"]}%s}",
                         commit, models, extra ? extra : "");
    cr_assert_eq(st, 201, "POST /v1/jobs -> %ld", st);
    char *id = strdup(json_string_value(json_object_get(j, "id")));
    json_decref(j);
    return id;
}

static void wait_done(const char *id)
{
    json_t *j = tu_wait_job(&g_capd, id, 60);
    cr_assert_not_null(j, "job %s did not finish", id);
    json_decref(j);
}

/* Waits until the job has a running cell. */
static void wait_running(const char *id)
{
    char path[128];
    snprintf(path, sizeof path, "/v1/jobs/%s", id);
    for (int i = 0; i < 400; i++) {
        json_t *j = tu_json(&g_capd, "GET", path, NULL, NULL);
        json_t *counts = json_object_get(j, "counts");
        bool running = json_integer_value(json_object_get(counts, "running")) > 0;
        json_decref(j);
        if (running)
            return;
        usleep(25000);
    }
    cr_assert_fail("job %s never ran a cell", id);
}

/* GET PATH answers 200 with an ETag (into ETAG) and then, revalidated
 * with it, 304. */
static void assert_revalidates(const char *path, char etag[128])
{
    cr_assert_eq(get_tagged(path, NULL, etag, NULL), 200, "%s", path);
    cr_assert(etag[0], "no ETag on %s", path);
    cr_assert_eq(get_tagged(path, etag, NULL, NULL), 304, "%s", path);
}

/* Starts capd with the defaults and runs one job of MODELS at commit
 * abcdef1 to its end; returns its id. */
/* Waits until job ID is settled: done, and labelled by the steps that look
 * at every finished job on the loop just after its end (replay_auto,
 * compiler_bisect_auto), which change its ETag once more. */
static void wait_settled(const char *id)
{
    char path[128];
    snprintf(path, sizeof path, "/v1/jobs/%s", id);
    wait_done(id);
    for (int i = 0; i < 500; i++) {
        json_t *j = tu_json(&g_capd, "GET", path, NULL, NULL);
        json_t *labels = json_object_get(j, "labels");
        bool settled = json_object_get(labels, "replay_auto") &&
                       json_object_get(labels, "compiler_bisect_auto");
        json_decref(j);
        if (settled)
            return;
        usleep(10000);
    }
    cr_assert_fail("job %s was not labelled by the automatic steps", id);
}

static char *start_with_finished_job(const char *models)
{
    start(NULL);
    char *id = submit("abcdef1", models, NULL);
    wait_settled(id);
    return id;
}

/* A request is counted when MHD reports it complete, which can be just
 * after the client has its reply: wait a little for the count. */
static double metric_reaches(const char *series, double want)
{
    double v = -1;
    for (int i = 0; i < 100; i++) {
        if ((v = tu_metric(&g_capd, series)) == want)
            break;
        usleep(10000);
    }
    return v;
}

/* ---- etag ---- */

Test(etag, job_304_until_it_changes)
{
    char *id = start_with_finished_job("\"fake:ok\"");
    char path[128], e1[128], e2[128], inm[300];
    size_t len;
    snprintf(path, sizeof path, "/v1/jobs/%s", id);
    cr_assert_eq(get_tagged(path, NULL, e1, &len), 200);
    cr_assert(e1[0] == '"' && len > 0, "no ETag on a job: '%s'", e1);
    cr_assert_eq(get_tagged(path, e1, e2, &len), 304);
    cr_assert_eq(len, 0, "a 304 has no body");
    cr_assert_str_eq(e2, e1, "the 304 repeats the ETag");
    /* A list of tags and the weak form match too; another tag does not. */
    snprintf(inm, sizeof inm, "\"nope\", W/%s", e1);
    cr_assert_eq(get_tagged(path, inm, NULL, NULL), 304);
    cr_assert_eq(get_tagged(path, "*", NULL, NULL), 304);
    cr_assert_eq(get_tagged(path, "\"j000000000000.1\"", NULL, NULL), 200);
    /* A change (a new job does not touch this one; cancelling a finished
     * job is refused and changes nothing). */
    char *other = submit("abcdef2", "\"fake:ok\"", NULL);
    wait_settled(other);
    cr_assert_eq(get_tagged(path, e1, NULL, NULL), 304, "another job changed this one's ETag");
    /* Unknown job: 404, no ETag. */
    cr_assert_eq(get_tagged("/v1/jobs/j000000000000", NULL, e2, NULL), 404);
    cr_assert_str_eq(e2, "", "an error carries no ETag");
    free(id);
    free(other);
}

Test(etag, list_cell_records_compare)
{
    char *id = start_with_finished_job("\"fake:ok\"");
    char e[128], e2[128];
    /* The job list: 304 until any job changes. */
    assert_revalidates("/v1/jobs?limit=10", e);
    cr_assert_eq(get_tagged("/v1/jobs?limit=11", e, NULL, NULL), 200,
                 "another query is another representation");
    char *id2 = submit("abcdef2", "\"fake:ok\"", NULL);
    cr_assert_eq(get_tagged("/v1/jobs?limit=10", e, e2, NULL), 200, "a new job changes the list");
    cr_assert_str_neq(e, e2);
    wait_done(id2);
    /* The build list. */
    cr_assert_eq(get_tagged("/v1/builds", NULL, e, NULL), 200);
    cr_assert_eq(get_tagged("/v1/builds", e, NULL, NULL), 304);
    cr_assert_eq(tu_fake_build(&g_capd, "fake2", NULL), 201);
    cr_assert_eq(get_tagged("/v1/builds", e, NULL, NULL), 200, "a new build changes the list");
    /* A cell, and its records (ETag from the body). */
    json_t *job = tu_wait_job(&g_capd, id, 10);
    const char *cell =
        json_string_value(json_object_get(json_array_get(json_object_get(job, "cells"), 0), "id"));
    char path[256];
    snprintf(path, sizeof path, "/v1/jobs/%s/cells/%s", id, cell);
    assert_revalidates(path, e);
    snprintf(path, sizeof path, "/v1/jobs/%s/cells/%s/records?kind=tensor", id, cell);
    assert_revalidates(path, e);
    /* A comparison: 304 without recomputing; a different query or Accept
     * is a different result. */
    snprintf(path, sizeof path, "/v1/compare?control=%s&head=%s", id, id2);
    assert_revalidates(path, e);
    snprintf(path, sizeof path, "/v1/compare?control=%s&head=%s&tensors=1", id, id2);
    cr_assert_eq(get_tagged(path, e, e2, NULL), 200);
    cr_assert_str_neq(e, e2);
    snprintf(path, sizeof path, "/v1/commits/abcdef2");
    cr_assert_eq(get_tagged(path, NULL, e, NULL), 200);
    cr_assert_eq(get_tagged(path, e, NULL, NULL), 304);
    json_decref(job);
    free(id);
    free(id2);
}

/* ---- longpoll ---- */

struct lp {
    char path[256];
    char inm[128];
    long status;
    double secs;
    char etag[128];
    char *body;
};

static void *lp_run(void *arg)
{
    struct lp *l = arg;
    char h[256];
    const char *hdrs[] = {h, NULL};
    snprintf(h, sizeof h, "If-None-Match: %s", l->inm);
    struct tu_resp r;
    double t0 = tu_now_s();
    tu_http(&g_capd, "GET", l->path, NULL, 0, l->inm[0] ? hdrs : NULL, &r);
    l->secs = tu_now_s() - t0;
    l->status = r.status;
    const char *e = af_header(r.headers, "ETag");
    snprintf(l->etag, sizeof l->etag, "%s", e ? e : "");
    l->body = strdup(r.body);
    tu_resp_free(&r);
    return NULL;
}

Test(longpoll, wakes_on_change_and_times_out)
{
    start(NULL);
    char *id = submit("abcdef1", "\"fake:hang\"", NULL);
    wait_running(id);
    char path[128], e[128];
    snprintf(path, sizeof path, "/v1/jobs/%s", id);
    cr_assert_eq(get_tagged(path, NULL, e, NULL), 200);

    /* Nothing changes: 304 after the wait, not before. */
    struct lp l = {0};
    snprintf(l.path, sizeof l.path, "%s?wait=1", path);
    snprintf(l.inm, sizeof l.inm, "%s", e);
    lp_run(&l);
    cr_assert_eq(l.status, 304, "an unchanged job answers 304 at the deadline, got %ld", l.status);
    cr_assert(l.secs >= 0.9 && l.secs < 5, "waited %.2f s for wait=1", l.secs);
    free(l.body);

    /* A stale ETag answers at once. */
    memset(&l, 0, sizeof l);
    snprintf(l.path, sizeof l.path, "%s?wait=30", path);
    snprintf(l.inm, sizeof l.inm, "\"stale\"");
    lp_run(&l);
    cr_assert_eq(l.status, 200);
    cr_assert(l.secs < 2, "a stale ETag must not wait (%.2f s)", l.secs);
    free(l.body);

    /* A change wakes the poll well before its deadline. */
    memset(&l, 0, sizeof l);
    snprintf(l.path, sizeof l.path, "%s?wait=30", path);
    snprintf(l.inm, sizeof l.inm, "%s", e);
    pthread_t t;
    pthread_create(&t, NULL, lp_run, &l);
    usleep(400 * 1000);
    char cpath[160];
    snprintf(cpath, sizeof cpath, "/v1/jobs/%s/cancel", id);
    long st;
    json_decref(tu_json(&g_capd, "POST", cpath, "{}", &st));
    cr_assert_eq(st, 202);
    pthread_join(t, NULL);
    cr_assert_eq(l.status, 200, "the cancel must end the poll with the new job, got %ld", l.status);
    /* The reply's state below (cancelled) shows it woke on the change; how
     * long it waited depends on when the thread got its request out, so
     * only the deadline is checked. */
    cr_assert(l.secs < 10, "woke after %.2f s, not at the change", l.secs);
    cr_assert_str_neq(l.etag, e, "the new reply has a new ETag");
    json_t *j = json_loads(l.body, 0, NULL);
    cr_assert_str_eq(json_string_value(json_object_get(j, "state")), "cancelled");
    json_decref(j);
    free(l.body);

    /* An ended job never changes again: no waiting. (A cancelled job has
     * ended once its running cell has been stopped too.) */
    for (int i = 0; i < 400; i++) {
        json_t *jj = tu_json(&g_capd, "GET", path, NULL, NULL);
        bool running =
            json_integer_value(json_object_get(json_object_get(jj, "counts"), "running"));
        json_decref(jj);
        if (!running)
            break;
        usleep(25000);
    }
    memset(&l, 0, sizeof l);
    snprintf(l.path, sizeof l.path, "%s?wait=30", path);
    double t0 = tu_now_s();
    char e2[128];
    cr_assert_eq(get_tagged(path, NULL, e2, NULL), 200);
    snprintf(l.inm, sizeof l.inm, "%s", e2);
    lp_run(&l);
    cr_assert_eq(l.status, 304);
    cr_assert(tu_now_s() - t0 < 3, "a finished job must not be waited on");
    free(l.body);
    free(id);
}

Test(longpoll, bad_wait_and_unknown_job)
{
    start(NULL);
    char e[128];
    cr_assert_eq(get_tagged("/v1/jobs/j000000000000?wait=5", NULL, e, NULL), 404);
    char *id = submit("abcdef1", "\"fake:ok\"", NULL);
    char path[128];
    snprintf(path, sizeof path, "/v1/jobs/%s?wait=x", id);
    cr_assert_eq(get_tagged(path, NULL, NULL, NULL), 400);
    snprintf(path, sizeof path, "/v1/jobs/%s?wait=100000", id);
    cr_assert_eq(get_tagged(path, NULL, NULL, NULL), 400);
    wait_done(id);
    free(id);
}

/* Reads from FD until the text read contains NEEDLE or TIMEOUT_MS pass;
 * returns whether it was found. */
static bool read_until(int fd, const char *needle, int timeout_ms, char *buf, size_t cap)
{
    size_t n = strlen(buf);
    double end = tu_now_s() + timeout_ms / 1000.0;
    while (!strstr(buf, needle)) {
        int left = (int)((end - tu_now_s()) * 1000);
        if (left <= 0)
            return false;
        struct pollfd p = {.fd = fd, .events = POLLIN};
        if (poll(&p, 1, left) <= 0)
            return false;
        if (n + 1 >= cap)
            return false;
        ssize_t r = read(fd, buf + n, cap - 1 - n);
        if (r <= 0)
            return strstr(buf, needle) != NULL;
        n += (size_t)r;
        buf[n] = 0;
    }
    return true;
}

/* The point of suspend/resume: with two worker threads, 64 clients waiting
 * in long-polls hold no thread, so the server keeps answering. */
Test(longpoll, many_waiters_hold_no_thread)
{
    start("{\"http_threads\": 2}");
    char *id = submit("abcdef1", "\"fake:hang\"", NULL);
    wait_running(id);
    char path[128], e[128], req[768];
    snprintf(path, sizeof path, "/v1/jobs/%s", id);
    cr_assert_eq(get_tagged(path, NULL, e, NULL), 200);
    enum { N = 64 };
    int fds[N];
    snprintf(req, sizeof req,
             "GET /v1/jobs/%s?wait=60 HTTP/1.1\r\nHost: localhost:%d\r\nAuthorization: Bearer "
             "%s\r\nIf-None-Match: %s\r\n\r\n",
             id, g_capd.port, g_capd.token, e);
    for (int i = 0; i < N; i++) {
        fds[i] = tcp_connect_local(g_capd.port);
        cr_assert(fds[i] >= 0);
        cr_assert_eq(write(fds[i], req, strlen(req)), (ssize_t)strlen(req));
    }
    double waiting = 0;
    for (int i = 0; i < 200 && waiting < N; i++) {
        waiting = tu_metric(&g_capd, "capd_long_polls");
        usleep(20000);
    }
    cr_assert_eq(waiting, N, "capd_long_polls is %g, want %d", waiting, N);
    /* Both workers are free: ordinary requests are answered at once. */
    for (int i = 0; i < 10; i++) {
        double t0 = tu_now_s();
        cr_assert_eq(get_tagged("/healthz", NULL, NULL, NULL), 200);
        cr_assert(tu_now_s() - t0 < 1.0, "healthz took %.2f s with %d long-polls", tu_now_s() - t0,
                  N);
    }
    /* One change answers every one of them. */
    char cpath[160];
    snprintf(cpath, sizeof cpath, "/v1/jobs/%s/cancel", id);
    long st;
    json_decref(tu_json(&g_capd, "POST", cpath, "{}", &st));
    cr_assert_eq(st, 202);
    for (int i = 0; i < N; i++) {
        char buf[8192] = "";
        cr_assert(read_until(fds[i], "\"cancelled\"", 10000, buf, sizeof buf),
                  "long-poll %d did not get the cancelled job: %.200s", i, buf);
        cr_assert(strncmp(buf, "HTTP/1.1 200", 12) == 0, "long-poll %d: %.40s", i, buf);
        close(fds[i]);
    }
    free(id);
}

/* ---- events ---- */

struct sse {
    char path[256];
    char last_id[32];
    const char *until; /* stop once the text read contains this */
    int timeout_ms;
    char *text;
    size_t len;
    long status;
    bool done;
};

static size_t sse_write(char *d, size_t sz, size_t nm, void *ud)
{
    struct sse *s = ud;
    size_t n = sz * nm;
    if (tu_append(&s->text, &s->len, d, n) != 0)
        return 0;
    if (s->until && strstr(s->text, s->until))
        return 0; /* enough: abort the transfer */
    return n;
}

static void *sse_run(void *arg)
{
    struct sse *s = arg;
    CURL *h = curl_easy_init();
    char url[512], hdr[64], auth[200];
    struct curl_slist *hl = NULL;
    snprintf(url, sizeof url, "%s%s", g_capd.base, s->path);
    if (g_capd.token[0]) {
        snprintf(auth, sizeof auth, "Authorization: Bearer %s", g_capd.token);
        hl = curl_slist_append(hl, auth);
    }
    if (s->last_id[0]) {
        snprintf(hdr, sizeof hdr, "Last-Event-ID: %s", s->last_id);
        hl = curl_slist_append(hl, hdr);
    }
    curl_easy_setopt(h, CURLOPT_URL, url);
    curl_easy_setopt(h, CURLOPT_HTTPHEADER, hl);
    curl_easy_setopt(h, CURLOPT_WRITEFUNCTION, sse_write);
    curl_easy_setopt(h, CURLOPT_WRITEDATA, s);
    curl_easy_setopt(h, CURLOPT_TIMEOUT_MS, (long)s->timeout_ms);
    curl_easy_setopt(h, CURLOPT_NOSIGNAL, 1L);
    curl_easy_perform(h);
    curl_easy_getinfo(h, CURLINFO_RESPONSE_CODE, &s->status);
    curl_slist_free_all(hl);
    curl_easy_cleanup(h);
    if (!s->text)
        s->text = strdup("");
    __atomic_store_n(&s->done, true, __ATOMIC_RELEASE);
    return NULL;
}

/* Waits until capd counts at least N open event streams. */
static void wait_streams(int n)
{
    for (int i = 0; i < 250; i++) {
        if (tu_metric(&g_capd, "capd_event_streams") >= n)
            return;
        usleep(20000);
    }
    cr_assert_fail("capd never counted %d event streams", n);
}

/* The ids of the events in TEXT, in order; returns how many. */
static int event_ids(const char *text, long long *ids, int max)
{
    int n = 0;
    for (const char *p = text; (p = strstr(p, "id: ")) && n < max; p += 4)
        if (p == text || p[-1] == '\n')
            ids[n++] = atoll(p + 4);
    return n;
}

static int count_of(const char *hay, const char *needle)
{
    int n = 0;
    for (const char *p = hay; (p = strstr(p, needle)); p += strlen(needle))
        n++;
    return n;
}

Test(events, live_filtered_and_resumed)
{
    start(NULL);
    /* One stream for project p, one for another project. */
    struct sse a = {.until = "\"state\":\"done\"", .timeout_ms = 30000};
    struct sse b = {.timeout_ms = 2500};
    snprintf(a.path, sizeof a.path, "/v1/events?project=p");
    snprintf(b.path, sizeof b.path, "/v1/events?project=other");
    pthread_t ta, tb;
    pthread_create(&ta, NULL, sse_run, &a);
    pthread_create(&tb, NULL, sse_run, &b);
    wait_streams(2);
    char *id = submit("abcdef1", "\"fake:ok\"", NULL);
    pthread_join(ta, NULL);
    pthread_join(tb, NULL);
    cr_assert_eq(a.status, 200);
    cr_assert(strstr(a.text, "event: job\n"), "no job event:\n%s", a.text);
    cr_assert(strstr(a.text, "\"change\":\"created\""), "no creation event:\n%s", a.text);
    cr_assert(strstr(a.text, "event: cell\n"), "no cell event:\n%s", a.text);
    cr_assert(strstr(a.text, id), "events do not name the job");
    /* Two cells, each queued -> running -> ok: four cell events. */
    cr_assert_eq(count_of(a.text, "event: cell\n"), 4, "%s", a.text);
    cr_assert(!strstr(b.text, "event:"), "a filtered stream got events:\n%s", b.text);
    long long ids[64];
    int n = event_ids(a.text, ids, 64);
    cr_assert(n >= 6, "only %d events", n);
    for (int i = 1; i < n; i++)
        cr_assert(ids[i] > ids[i - 1], "ids not increasing");

    /* Reconnect after the second event: the rest is replayed, the same
     * ids in the same order, then the stream goes on live. */
    struct sse r = {.timeout_ms = 3000};
    snprintf(r.path, sizeof r.path, "/v1/events?project=p");
    snprintf(r.last_id, sizeof r.last_id, "%lld", ids[1]);
    char want[32];
    snprintf(want, sizeof want, "id: %lld\n", ids[n - 1]);
    r.until = want;
    sse_run(&r);
    long long rids[64];
    int rn = event_ids(r.text, rids, 64);
    cr_assert_eq(rn, n - 2, "replayed %d events, want %d:\n%s", rn, n - 2, r.text);
    for (int i = 0; i < rn; i++)
        cr_assert_eq(rids[i], ids[i + 2]);
    /* The query parameter works as well (EventSource cannot set headers on
     * its first connection). */
    struct sse q = {.timeout_ms = 3000, .until = want};
    snprintf(q.path, sizeof q.path, "/v1/events?project=p&last_event_id=%lld", ids[n - 2]);
    sse_run(&q);
    cr_assert_eq(event_ids(q.text, rids, 64), 1);

    /* An id this server never sent: a reset event first. */
    struct sse z = {.timeout_ms = 3000, .until = "event: reset"};
    snprintf(z.path, sizeof z.path, "/v1/events");
    snprintf(z.last_id, sizeof z.last_id, "99999999");
    sse_run(&z);
    cr_assert(strstr(z.text, "\"reason\":\"unknown_id\""), "%s", z.text);
    free(a.text);
    free(b.text);
    free(r.text);
    free(q.text);
    free(z.text);
    free(id);
}

/* A burst of events longer than a page of SQLite reads and than a stream's
 * buffer (LIVE_PAGE in api/live_int.h, LIVE_MAX_BUF in api/api_live.c)
 * arrives whole, in order, once: live (where the stream falls behind and
 * catches up from SQLite) and replayed from Last-Event-ID. Cancelling a
 * 256-cell job whose first cell hangs makes the burst without running
 * cells. */
Test(events, long_burst_and_replay_are_complete_and_ordered)
{
    start(NULL);
    char models[4096] = "\"fake:hang\"";
    for (int i = 1; i < 64; i++)
        snprintf(models + strlen(models), sizeof models - strlen(models), ",\"fake:hang__%d\"", i);
    const char *last = "\"state\":\"cancelled\",\"previous_state\":\"running\"";
    struct sse a = {.timeout_ms = 30000, .until = last};
    snprintf(a.path, sizeof a.path, "/v1/events?project=big");
    pthread_t t;
    pthread_create(&t, NULL, sse_run, &a);
    wait_streams(1);
    long st;
    json_t *j = tu_jsonf(&g_capd, "POST", "/v1/jobs", &st,
                         "{\"project\":\"big\",\"commit\":\"abcdef1\",\"build\":\"fake\","
                         "\"matrix\":{\"models\":[%s],\"widths\":[\"avx2\",\"default\"],"
                         "\"passes\":[\"forward\",\"backward\"]}}",
                         models);
    cr_assert_eq(st, 201);
    char *id = strdup(json_string_value(json_object_get(j, "id")));
    json_decref(j);
    wait_running(id);
    char cpath[160];
    snprintf(cpath, sizeof cpath, "/v1/jobs/%s/cancel", id);
    json_decref(tu_json(&g_capd, "POST", cpath, "{}", &st));
    cr_assert_eq(st, 202);
    pthread_join(t, NULL);
    /* created, first cell running, job running, 255 queued cells and the
     * job cancelled in one transaction, then the running cell cancelled. */
    const int want = 1 + 1 + 1 + 255 + 1 + 1;
    static long long ids[1024], rids[1024];
    int n = event_ids(a.text, ids, 1024);
    cr_assert_eq(n, want, "the live stream got %d events, want %d", n, want);
    for (int i = 1; i < n; i++)
        cr_assert(ids[i] > ids[i - 1], "live event %d out of order", i);
    cr_assert_eq(count_of(a.text, "event: cell\n"), 257);

    struct sse r = {.timeout_ms = 20000, .until = last};
    snprintf(r.path, sizeof r.path, "/v1/events?project=big");
    snprintf(r.last_id, sizeof r.last_id, "0");
    sse_run(&r);
    int rn = event_ids(r.text, rids, 1024);
    cr_assert_eq(rn, n, "replayed %d events, the live stream got %d", rn, n);
    for (int i = 0; i < n; i++)
        cr_assert_eq(rids[i], ids[i], "replayed event %d differs", i);
    free(a.text);
    free(r.text);
    free(id);
}

Test(events, job_filter_and_bad_input)
{
    start(NULL);
    char *id1 = submit("abcdef1", "\"fake:hang\"", NULL);
    wait_running(id1);
    struct sse a = {.timeout_ms = 30000, .until = "\"state\":\"cancelled\""};
    snprintf(a.path, sizeof a.path, "/v1/events?job=%s", id1);
    pthread_t t;
    pthread_create(&t, NULL, sse_run, &a);
    wait_streams(1);
    char *id2 = submit("abcdef2", "\"fake:ok\"", NULL); /* queued behind the hang */
    char cpath[160];
    long st;
    snprintf(cpath, sizeof cpath, "/v1/jobs/%s/cancel", id1);
    json_decref(tu_json(&g_capd, "POST", cpath, "{}", &st));
    cr_assert_eq(st, 202);
    pthread_join(t, NULL);
    cr_assert(strstr(a.text, id1));
    cr_assert(!strstr(a.text, id2), "the job filter let another job through:\n%s", a.text);
    wait_done(id2);
    cr_assert_eq(get_tagged("/v1/events?job=../x", NULL, NULL, NULL), 400);
    struct tu_resp r;
    const char *hdrs[] = {"Last-Event-ID: abc", NULL};
    tu_http(&g_capd, "GET", "/v1/events", NULL, 0, hdrs, &r);
    cr_assert_eq(r.status, 400);
    tu_resp_free(&r);
    free(a.text);
    free(id1);
    free(id2);
}

Test(events, cap_and_heartbeat)
{
    start("{\"max_event_streams\": 2, \"event_heartbeat_s\": 1}");
    struct sse a = {.timeout_ms = 4000, .until = ": hb\n"}, b = {.timeout_ms = 4000};
    snprintf(a.path, sizeof a.path, "/v1/events");
    snprintf(b.path, sizeof b.path, "/v1/events");
    pthread_t ta, tb;
    double t0 = tu_now_s();
    pthread_create(&ta, NULL, sse_run, &a);
    pthread_create(&tb, NULL, sse_run, &b);
    wait_streams(2);
    /* The third stream is refused with 503 and Retry-After. */
    struct tu_resp r;
    tu_http(&g_capd, "GET", "/v1/events", NULL, 0, NULL, &r);
    cr_assert_eq(r.status, 503);
    cr_assert(strstr(r.body, "too_many_streams"), "%s", r.body);
    cr_assert_not_null(af_header(r.headers, "Retry-After"));
    tu_resp_free(&r);
    /* An idle stream gets a heartbeat comment within the interval. */
    pthread_join(ta, NULL);
    cr_assert(strstr(a.text, ": hb\n"), "no heartbeat in %.1f s:\n%s", tu_now_s() - t0, a.text);
    cr_assert(tu_now_s() - t0 < 3.5);
    pthread_join(tb, NULL);
    /* Streams that ended make room again (the server notices a vanished
     * client at its next heartbeat). */
    for (int i = 0; i < 100 && tu_metric(&g_capd, "capd_event_streams") > 0; i++)
        usleep(50000);
    cr_assert_eq(tu_metric(&g_capd, "capd_event_streams"), 0);
    free(a.text);
    free(b.text);
}

Test(events, shutdown_with_streams_and_polls_open)
{
    start(NULL);
    char *id = submit("abcdef1", "\"fake:hang\"", NULL);
    wait_running(id);
    struct sse a = {.timeout_ms = 20000};
    snprintf(a.path, sizeof a.path, "/v1/events");
    pthread_t ta, tl;
    pthread_create(&ta, NULL, sse_run, &a);
    wait_streams(1);
    struct lp l = {0};
    char e[128], path[128];
    snprintf(path, sizeof path, "/v1/jobs/%s", id);
    cr_assert_eq(get_tagged(path, NULL, e, NULL), 200);
    snprintf(l.path, sizeof l.path, "%s?wait=60", path);
    snprintf(l.inm, sizeof l.inm, "%s", e);
    pthread_create(&tl, NULL, lp_run, &l);
    for (int i = 0; i < 100 && tu_metric(&g_capd, "capd_long_polls") < 1; i++)
        usleep(20000);
    double t0 = tu_now_s();
    cr_assert_eq(tu_capd_stop(&g_capd), 0, "capd did not exit cleanly");
    cr_assert(tu_now_s() - t0 < 8, "shutdown took %.1f s", tu_now_s() - t0);
    pthread_join(ta, NULL);
    pthread_join(tl, NULL);
    cr_assert(a.done);
    cr_assert(l.status == 304 || l.status == 200, "the long-poll got %ld", l.status);
    free(a.text);
    free(l.body);
    free(id);
}

/* ---- metrics ---- */

Test(metrics, text_format_and_values)
{
    char *id = start_with_finished_job("\"fake:ok\", \"fake:failed\"");
    char path[128], e[128];
    snprintf(path, sizeof path, "/v1/jobs/%s", id);
    cr_assert_eq(get_tagged(path, NULL, e, NULL), 200);
    cr_assert_eq(get_tagged(path, e, NULL, NULL), 304);
    struct tu_resp r;
    tu_http(&g_capd, "GET", "/metrics", NULL, 0, NULL, &r);
    cr_assert_eq(r.status, 200);
    const char *ct = af_header(r.headers, "Content-Type");
    cr_assert(ct && strstr(ct, "text/plain") && strstr(ct, "version=0.0.4"), "Content-Type %s", ct);
    /* Every sample line is NAME{LABELS} VALUE, and every family it belongs
     * to has HELP and TYPE lines. */
    regex_t re;
    cr_assert_eq(
        regcomp(&re,
                "^([a-zA-Z_:][a-zA-Z0-9_:]*)(\\{([a-zA-Z_][a-zA-Z0-9_]*=\"([^\"\\\\]|\\\\.)*\""
                ",?)*\\})? -?[0-9.eE+-]+$",
                REG_EXTENDED),
        0);
    int samples = 0;
    for (char *l = r.body; *l;) {
        char *nl = strchr(l, '\n');
        cr_assert_not_null(nl, "the text must end with a newline");
        *nl = 0;
        if (l[0] == '#') {
            cr_assert(strncmp(l, "# HELP ", 7) == 0 || strncmp(l, "# TYPE ", 7) == 0, "%s", l);
        } else {
            regmatch_t m[2];
            cr_assert_eq(regexec(&re, l, 2, m, 0), 0, "not a sample line: '%s'", l);
            char fam[128], typeline[200];
            snprintf(fam, sizeof fam, "%.*s", (int)(m[1].rm_eo - m[1].rm_so), l);
            snprintf(typeline, sizeof typeline, "# TYPE %s ", fam);
            if (!strstr(r.body, typeline)) {
                /* A histogram's series are NAME_bucket, NAME_sum, NAME_count. */
                char *us = strrchr(fam, '_');
                cr_assert(
                    us && (!strcmp(us, "_bucket") || !strcmp(us, "_sum") || !strcmp(us, "_count")),
                    "no TYPE line for %s", fam);
                *us = 0;
                snprintf(typeline, sizeof typeline, "# TYPE %s histogram\n", fam);
                cr_assert(strstr(r.body, typeline), "no histogram TYPE line for %s", fam);
            }
            samples++;
        }
        *nl = '\n';
        l = nl + 1;
    }
    regfree(&re);
    cr_assert(samples > 40, "only %d samples", samples);
    cr_assert(strstr(r.body, "# TYPE capd_http_request_duration_seconds histogram\n"));
    cr_assert(strstr(r.body, "# TYPE capd_cell_duration_seconds histogram\n"));
    tu_resp_free(&r);
    cr_assert_eq(tu_metric(&g_capd, "capd_jobs{state=\"done\"}"), 1);
    cr_assert_eq(tu_metric(&g_capd, "capd_cells{state=\"ok\"}"), 2);
    cr_assert_eq(tu_metric(&g_capd, "capd_cells{state=\"failed\"}"), 2);
    cr_assert_eq(tu_metric(&g_capd, "capd_queue_depth"), 0);
    cr_assert_eq(tu_metric(&g_capd, "capd_running_children"), 0);
    cr_assert_eq(tu_metric(&g_capd, "capd_cells_finished_total{outcome=\"ok\"}"), 2);
    cr_assert_eq(tu_metric(&g_capd, "capd_cells_finished_total{outcome=\"failed\"}"), 2);
    cr_assert_eq(tu_metric(&g_capd, "capd_cell_duration_seconds_count"), 4);
    cr_assert_eq(tu_metric(&g_capd, "capd_cell_duration_seconds_bucket{le=\"+Inf\"}"), 4);
    cr_assert(tu_metric(&g_capd, "capd_ingest_records_total") >= 10);
    cr_assert(tu_metric(&g_capd, "capd_ingest_bytes_total") > 1000);
    cr_assert(
        tu_metric(
            &g_capd,
            "capd_http_requests_total{method=\"GET\",route=\"/v1/jobs/:id\",status=\"304\"}") >= 1);
    cr_assert_eq(
        tu_metric(&g_capd,
                  "capd_http_requests_total{method=\"POST\",route=\"/v1/jobs\",status=\"201\"}"),
        1);
    cr_assert_eq(tu_metric(&g_capd, "capd_sqlite_errors_total{kind=\"io\"}"), 0);
    /* Histogram buckets are cumulative and end at the count. */
    double c = tu_metric(
        &g_capd, "capd_http_request_duration_seconds_count{method=\"POST\",route=\"/v1/jobs\"}");
    double inf =
        tu_metric(&g_capd, "capd_http_request_duration_seconds_bucket{method=\"POST\",route=\"/v1/"
                           "jobs\",le=\"+Inf\"}");
    double fast =
        tu_metric(&g_capd, "capd_http_request_duration_seconds_bucket{method=\"POST\",route=\"/v1/"
                           "jobs\",le=\"0.001\"}");
    cr_assert_eq(c, 1);
    cr_assert_eq(inf, c);
    cr_assert(fast >= 0 && fast <= inf);
    /* A 404 is counted under its route, an unknown path as unmatched. */
    get_tagged("/v1/jobs/j000000000000", NULL, NULL, NULL);
    get_tagged("/nope", NULL, NULL, NULL);
    cr_assert_eq(metric_reaches("capd_http_requests_total{method=\"GET\",route=\"/v1/jobs/"
                                ":id\",status=\"404\"}",
                                1),
                 1);
    cr_assert_eq(
        metric_reaches("capd_http_requests_total{method=\"\",route=\"(unmatched)\",status=\"404\"}",
                       1),
        1);
    free(id);
}

/* ---- dashboard ---- */

Test(dashboard, static_files_public_and_cached)
{
    start("{\"auth_required\": true}");
    struct tu_resp r;
    tu_http(&g_capd, "GET", "/", NULL, 0, NULL, &r);
    cr_assert_eq(r.status, 200);
    cr_assert(strstr(r.body, "<!doctype html>"));
    cr_assert(strstr(r.body, "/static/app.js"));
    const char *ct = af_header(r.headers, "Content-Type");
    cr_assert(ct && strncmp(ct, "text/html", 9) == 0);
    const char *csp = af_header(r.headers, "Content-Security-Policy");
    cr_assert(csp && strstr(csp, "default-src 'none'") && strstr(csp, "script-src 'self'"),
              "CSP %s", csp);
    tu_resp_free(&r);
    char e[128];
    assert_revalidates("/static/app.js", e);
    cr_assert_eq(get_tagged("/static/style.css", NULL, NULL, NULL), 200);
    cr_assert_eq(get_tagged("/static/nope.js", NULL, NULL, NULL), 404);
    cr_assert_eq(get_tagged("/static/..%2Fcapd.db", NULL, NULL, NULL), 404);
    /* The page is public; the data behind it is not. */
    cr_assert_eq(get_tagged("/v1/jobs", NULL, NULL, NULL), 401);
    cr_assert_eq(get_tagged("/v1/events", NULL, NULL, NULL), 401);
}

/* ---- schema ---- */

/* Migrations are found by number and must run 1..N without a gap; two
 * files with one number would silently skip one of them. */
Test(schema, migrations_numbered_without_gaps_or_duplicates)
{
    char dir[600], names[4096] = "";
    int seen[1000] = {0}, max = 0;
    snprintf(dir, sizeof dir, "%s/schema", tu_bin("CAPD_SOURCE_DIR"));
    DIR *d = opendir(dir);
    cr_assert_not_null(d, "cannot list %s", dir);
    struct dirent *e;
    while ((e = readdir(d)) != NULL) {
        size_t n = strlen(e->d_name);
        if (e->d_name[0] < '0' || e->d_name[0] > '9' || n < 5 || strcmp(e->d_name + n - 4, ".sql"))
            continue;
        int num = atoi(e->d_name);
        cr_assert(num > 0 && num < 1000, "bad migration name %s", e->d_name);
        seen[num]++;
        max = num > max ? num : max;
        snprintf(names + strlen(names), sizeof names - strlen(names), "%s\n", e->d_name);
    }
    closedir(d);
    for (int i = 1; i <= max; i++)
        cr_assert_eq(seen[i], 1, "migration %d appears %d times:\n%s", i, seen[i], names);
    cr_assert(max >= 3, "no events migration among:\n%s", names);
}
