/*
 * worker/http.c - the worker's HTTP client (worker.h): one libcurl easy
 * handle for the whole run, so every POST reuses the keep-alive
 * connection. Like capctl's (cli/client.c), it speaks http and https
 * only, follows no redirect (it would carry the token elsewhere) and
 * never prints the token; the token's header and its scrubbing are
 * util/http.h's, which capctl uses too.
 */
#include <curl/curl.h>
#include <errno.h>
#include <jansson.h>
#include <poll.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "util/http.h"
#include "worker/worker.h"

void worker_say(const char *fmt, ...)
{
    va_list ap;
    char line[2048];
    va_start(ap, fmt);
    vsnprintf(line, sizeof line, fmt, ap);
    va_end(ap);
    /* One write, so lines of the worker and of others do not interleave. */
    fprintf(stderr, "capd-cell: %s\n", line);
}

struct worker_http {
    CURL *h;
    char *auth; /* "Authorization: Bearer TOKEN" */
    char *base;
    char *cacert;
};

int worker_http_open(struct worker_http **out, const char *base, const char *token,
                     const char *cacert)
{
    struct worker_http *c = calloc(1, sizeof *c);
    *out = NULL;
    if (!c)
        return -ENOMEM;
    c->auth = util_http_bearer(token);
    c->base = strdup(base);
    c->cacert = cacert ? strdup(cacert) : NULL;
    c->h = curl_easy_init();
    if (!c->auth || !c->base || (cacert && !c->cacert) || !c->h) {
        worker_http_close(c);
        return -ENOMEM;
    }
    *out = c;
    return 0;
}

void worker_http_close(struct worker_http *c)
{
    if (!c)
        return;
    if (c->h)
        curl_easy_cleanup(c->h);
    util_http_secret_free(c->auth);
    free(c->base);
    free(c->cacert);
    free(c);
}

const char *worker_http_base(const struct worker_http *c)
{
    return c->base;
}

static size_t on_body(char *d, size_t sz, size_t nm, void *ud)
{
    struct ubuf *b = ud;
    return ubuf_add(b, d, sz * nm) == 0 ? sz * nm : 0;
}

/* capd's error text from an error body: {"error": "..."}, or the API's
 * {"error": {"code", "message", "field"}}. */
static void error_text(struct worker_reply *r)
{
    json_t *j = r->body.len ? json_loadb(r->body.p, r->body.len, 0, NULL) : NULL;
    json_t *e = json_object_get(j, "error");
    if (!j && r->body.len)
        snprintf(r->error, sizeof r->error, "%.200s", r->body.p);
    const char *msg = json_string_value(e);
    const char *code = json_string_value(json_object_get(e, "code"));
    if (!msg)
        msg = json_string_value(json_object_get(e, "message"));
    if (msg && code)
        snprintf(r->error, sizeof r->error, "%s (%s)", msg, code);
    else if (msg)
        snprintf(r->error, sizeof r->error, "%s", msg);
    json_decref(j);
}

static void request_options(struct worker_http *c, const char *url, const char *method,
                            struct worker_reply *r, char *errbuf)
{
    curl_easy_reset(c->h);
    curl_easy_setopt(c->h, CURLOPT_URL, url);
    curl_easy_setopt(c->h, CURLOPT_PROTOCOLS_STR, "http,https");
    curl_easy_setopt(c->h, CURLOPT_CUSTOMREQUEST, method);
    curl_easy_setopt(c->h, CURLOPT_WRITEFUNCTION, on_body);
    curl_easy_setopt(c->h, CURLOPT_WRITEDATA, &r->body);
    curl_easy_setopt(c->h, CURLOPT_ERRORBUFFER, errbuf);
    curl_easy_setopt(c->h, CURLOPT_CONNECTTIMEOUT, 10L);
    curl_easy_setopt(c->h, CURLOPT_TIMEOUT, 120L);
    curl_easy_setopt(c->h, CURLOPT_NOSIGNAL, 1L);
    curl_easy_setopt(c->h, CURLOPT_FOLLOWLOCATION, 0L);
    curl_easy_setopt(c->h, CURLOPT_USERAGENT, "capd-cell/" CAPD_VERSION);
    if (c->cacert)
        curl_easy_setopt(c->h, CURLOPT_CAINFO, c->cacert);
}

int worker_http_request(struct worker_http *c, const char *method, const char *path,
                        const char *ctype, const void *body, size_t len, struct worker_reply *r)
{
    char url[8192], errbuf[CURL_ERROR_SIZE] = "", ct[128];
    struct curl_slist *hl = NULL, *t;
    memset(r, 0, sizeof *r);
    ubuf_init(&r->body, WORKER_SPEC_MAX);
    if (snprintf(url, sizeof url, "%s%s", c->base, path) >= (int)sizeof url)
        return -ENAMETOOLONG;
    request_options(c, url, method, r, errbuf);
    /* No "Expect: 100-continue": it would hold every chunk back a round
     * trip (or a second) for an answer capd gives to the body anyway. */
    snprintf(ct, sizeof ct, "Content-Type: %s", ctype ? ctype : "");
    const char *const hdrs[] = {c->auth, "Expect:", ctype ? ct : NULL};
    for (size_t i = 0; i < sizeof hdrs / sizeof hdrs[0]; i++) {
        if (!hdrs[i])
            continue;
        if (!(t = curl_slist_append(hl, hdrs[i])))
            goto nomem;
        hl = t;
    }
    if (ctype) {
        curl_easy_setopt(c->h, CURLOPT_POSTFIELDS, body ? body : "");
        curl_easy_setopt(c->h, CURLOPT_POSTFIELDSIZE_LARGE, (curl_off_t)len);
    }
    curl_easy_setopt(c->h, CURLOPT_HTTPHEADER, hl);
    CURLcode cc = curl_easy_perform(c->h);
    curl_easy_setopt(c->h, CURLOPT_HTTPHEADER, NULL);
    curl_slist_free_all(hl);
    if (cc != CURLE_OK) {
        snprintf(r->why, sizeof r->why, "%s", errbuf[0] ? errbuf : curl_easy_strerror(cc));
        ubuf_free(&r->body);
        return 0;
    }
    curl_easy_getinfo(c->h, CURLINFO_RESPONSE_CODE, &r->status);
    if (r->status >= 400)
        error_text(r);
    return 0;
nomem:
    curl_slist_free_all(hl);
    return -ENOMEM;
}

void worker_reply_free(struct worker_reply *r)
{
    ubuf_free(&r->body);
}

bool worker_reply_retryable(const struct worker_reply *r)
{
    return r->status == 0 || r->status >= 500;
}

int worker_backoff_ms(int try)
{
    int ms = WORKER_BACKOFF_MS;
    for (int i = 1; i < try && ms < WORKER_BACKOFF_MAX; i++)
        ms *= 2;
    return ms < WORKER_BACKOFF_MAX ? ms : WORKER_BACKOFF_MAX;
}

int worker_http_retry(struct worker_http *c, const char *method, const char *path,
                      const char *ctype, const void *body, size_t len, int retries, bool quiet,
                      struct worker_reply *r, int *tries)
{
    for (int try = 0;; try++) {
        int rc = worker_http_request(c, method, path, ctype, body, len, r);
        *tries = try + 1;
        if (rc != 0 || !worker_reply_retryable(r) || try >= retries)
            return rc;
        int ms = worker_backoff_ms(try + 1);
        if (!quiet && r->status)
            worker_say("%s %s%s: HTTP %ld; trying again in %d ms", method, c->base, path, r->status,
                       ms);
        else if (!quiet)
            worker_say("%s %s%s: %s; trying again in %d ms", method, c->base, path, r->why, ms);
        worker_reply_free(r);
        poll(NULL, 0, ms);
    }
}

void worker_request_failed(const struct worker_http *c, const char *method, const char *path,
                           const struct worker_reply *r, int tries)
{
    char after[64] = "";
    if (tries > 1)
        snprintf(after, sizeof after, " (gave up after %d tries)", tries);
    if (r->status == 0)
        worker_say("%s %s%s: cannot reach capd: %s%s", method, c->base, path, r->why, after);
    else
        worker_say("%s %s%s: HTTP %ld%s%s%s", method, c->base, path, r->status,
                   r->error[0] ? ": " : "", r->error, after);
}

static json_t *reply_json(const struct worker_reply *r)
{
    return r->body.len ? json_loadb(r->body.p, r->body.len, 0, NULL) : NULL;
}

int worker_reply_count(const struct worker_reply *r, const char *key, uint64_t *out)
{
    json_t *j = reply_json(r), *v = json_object_get(j, key);
    int rc = json_is_integer(v) && json_integer_value(v) >= 0 ? 0 : -EINVAL;
    if (rc == 0)
        *out = (uint64_t)json_integer_value(v);
    json_decref(j);
    return rc;
}

void worker_reply_string(const struct worker_reply *r, const char *key, char *out, size_t n)
{
    json_t *j = reply_json(r);
    const char *s = json_string_value(json_object_get(j, key));
    snprintf(out, n, "%s", s ? s : "");
    json_decref(j);
}
