/*
 * api/server.c - the libmicrohttpd daemon, request bodies, routing and the
 * reply helpers every endpoint uses.
 *
 * Threading model: MHD_USE_INTERNAL_POLLING_THREAD with a thread pool over
 * epoll. Handlers are short (SQLite reads and small writes), so a few
 * workers serve many connections, and idle keep-alive connections cost a
 * socket, not a thread. Thread-per-connection would let thousands of idle
 * dashboard pollers each hold a thread; an external select loop on the
 * libuv thread would put HTTP latency behind ingest. See
 * docs/architecture.md.
 */
#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <time.h>
#include <unistd.h>

#include "api/api_int.h"
#include "util/log.h"
#include "util/metrics.h"
#include "util/clock.h"
#include "util/err.h"

struct api {
    struct capd *d;
    struct MHD_Daemon *mhd;
    unsigned inflight;
    int port; /* the bound port, for the Host check (api/host.c) */
    bool quiesced;
    char *tls_cert, *tls_key; /* PEM text; MHD keeps pointers to them while it runs */
};

static pthread_key_t store_key;
static pthread_once_t store_once = PTHREAD_ONCE_INIT;

static void store_key_free(void *p)
{
    store_close(p);
}

static void store_key_init(void)
{
    pthread_key_create(&store_key, store_key_free);
}

struct capd *api_daemon(struct api_req *r)
{
    return r->api->d;
}

int api_bound_port(struct api_req *r)
{
    return r->api->port;
}

const struct capd_config *api_cfg(struct api_req *r)
{
    return capd_cfg(r->api->d);
}

struct store *api_store(struct api_req *r)
{
    return api_thread_store(api_cfg(r));
}

struct store *api_thread_store(const struct capd_config *cfg)
{
    struct store *s = pthread_getspecific(store_key);
    if (!s) {
        char *err = NULL;
        if (store_open(cfg->data_dir, false, &s, &err) != 0) {
            log_error("http_store_open_failed", "err=%s", log_q(err));
            free(err);
            return NULL;
        }
        pthread_setspecific(store_key, s);
    }
    return s;
}

/* ---- replies ---- */

static enum MHD_Result send_buf(struct api_req *r, unsigned status, const char *ctype, char *buf,
                                size_t len)
{
    /* A body-hash ETag (api_etag_by_body) that the client has: 304. */
    if (r->etag_body && status == 200 && api_etag_body_match(r, buf, len)) {
        free(buf);
        return api_not_modified(r);
    }
    r->status = status;
    struct MHD_Response *resp = MHD_create_response_from_buffer(len, buf, MHD_RESPMEM_MUST_FREE);
    if (!resp) {
        free(buf);
        return MHD_NO;
    }
    MHD_add_response_header(resp, "Content-Type", ctype);
    /* A reply with an ETag may be kept but must be revalidated. */
    bool tagged = r->etag[0] && status >= 200 && status < 300;
    if (tagged)
        MHD_add_response_header(resp, "ETag", r->etag);
    MHD_add_response_header(resp, "Cache-Control", tagged ? "no-cache" : "no-store");
    for (int i = 0; i < r->nxhdr; i++)
        MHD_add_response_header(resp, r->xhdr[i][0], r->xhdr[i][1]);
    enum MHD_Result ret = MHD_queue_response(r->conn, status, resp);
    MHD_destroy_response(resp);
    log_debug("http_reply", "method=%s url=%s status=%u", r->method, log_q(r->url), status);
    return ret;
}

void api_reply_header(struct api_req *r, const char *name, const char *value)
{
    if (r->nxhdr >= API_MAX_XHDR) {
        log_error("reply_headers_full", "url=%s header=%s max=%d", log_q(r->url), log_q(name),
                  API_MAX_XHDR);
        return;
    }
    snprintf(r->xhdr[r->nxhdr][0], sizeof r->xhdr[0][0], "%s", name);
    snprintf(r->xhdr[r->nxhdr][1], sizeof r->xhdr[0][1], "%s", value);
    r->nxhdr++;
}

enum MHD_Result api_json(struct api_req *r, unsigned status, json_t *body)
{
    char *s = body ? json_dumps(body, JSON_COMPACT | JSON_ENSURE_ASCII) : NULL;
    json_decref(body);
    if (!s) {
        /* Out of memory or a body that could not be built: still answer. */
        static const char fallback[] = "{\"error\":{\"code\":\"internal\",\"message\":"
                                       "\"the reply could not be encoded\",\"field\":null}}\n";
        s = strdup(fallback);
        if (!s)
            return MHD_NO;
        return send_buf(r, 500, "application/json", s, strlen(s));
    }
    size_t n = strlen(s);
    char *t = realloc(s, n + 2);
    if (t) {
        s = t;
        s[n++] = '\n';
        s[n] = 0;
    }
    return send_buf(r, status, "application/json", s, n);
}

enum MHD_Result api_text(struct api_req *r, unsigned status, const char *ctype, char *body,
                         size_t len)
{
    return send_buf(r, status, ctype, body, len);
}

enum MHD_Result api_error(struct api_req *r, unsigned status, const char *code, const char *field,
                          const char *fmt, ...)
{
    char msg[1024];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    /* Messages echo client input (ids, header values); bytes that are not
     * valid UTF-8 become '?' so the error can always be encoded. */
    json_t *m = json_string(msg);
    if (!m) {
        for (char *p = msg; *p; p++)
            if ((unsigned char)*p >= 0x80 || (unsigned char)*p < 0x20)
                *p = '?';
        m = json_string(msg);
    }
    json_t *fj = field ? json_string(field) : json_null();
    if (!fj)
        fj = json_string("?");
    json_t *e = json_pack("{s:s,s:o,s:o}", "code", code, "message", m, "field", fj);
    if (status >= 500)
        log_error("http_error", "method=%s url=%s status=%u code=%s message=%s", r->method,
                  log_q(r->url), status, code, log_q(msg));
    return api_json(r, status, json_pack("{s:o}", "error", e));
}

enum MHD_Result api_store_error(struct api_req *r, int rc, const char *what)
{
    switch (rc) {
    case -ENOENT:
        return api_error(r, 404, "not_found", NULL, "%s not found (%s)", what, r->url);
    case -EEXIST:
        return api_error(r, 409, "conflict", NULL, "%s conflicts with an existing one", what);
    case -EBUSY:
        return api_error(r, 503, "busy", NULL, "the database is busy; retry");
    case -ENOSPC:
        /* Disk full or data dir read-only: the write was rolled back whole
         * and will work once the operator makes room, without a restart. */
        api_reply_header(r, "Retry-After", API_STORAGE_RETRY_AFTER_S);
        return api_error(r, 503, "storage_unavailable", NULL,
                         "capd cannot write its data dir (disk full, read-only or an I/O "
                         "error); nothing was stored for this %s, retry later",
                         what);
    default:
        return api_error(r, 500, "internal", NULL, "storage error %d while handling %s", rc, what);
    }
}

enum MHD_Result api_store_reply(struct api_req *r, int rc, const char *what, json_t *out)
{
    if (rc) {
        json_decref(out);
        return api_store_error(r, rc, what);
    }
    return api_json(r, 200, out);
}

enum MHD_Result api_store_reply_etag(struct api_req *r, int rc, const char *what, json_t *out)
{
    if (rc == 0)
        api_etag_by_body(r);
    return api_store_reply(r, rc, what, out);
}

enum MHD_Result api_store_get(struct api_req *r,
                              int (*get)(struct store *s, const char *key, json_t **out),
                              const char *param, const char *what)
{
    json_t *out = NULL;
    int rc = get(api_store(r), api_param(r, param), &out);
    return api_store_reply(r, rc, what, out);
}

/* MHD is told not to decode anything (see no_unescape), so the path can be
 * split before its segments are decoded once; query values are decoded
 * here, into copies that live as long as the request. */
const char *api_query(struct api_req *r, const char *key)
{
    const char *v = MHD_lookup_connection_value(r->conn, MHD_GET_ARGUMENT_KIND, key);
    if (!v || !strchr(v, '%'))
        return v;
    for (int i = 0; i < r->nq; i++)
        if (strcmp(r->qcache[i].key, key) == 0)
            return r->qcache[i].value;
    /* Handlers ask for a fixed set of keys: past the bound is a bug of
     * capd's, said in the log; the value is then the undecoded one. */
    if (r->nq == API_MAX_QUERY_KEYS) {
        log_error("query_keys_full", "url=%s key=%s max=%d", log_q(r->url), log_q(key),
                  API_MAX_QUERY_KEYS);
        return v;
    }
    char *d = strdup(v);
    if (!d)
        return v;
    MHD_http_unescape(d);
    r->qcache[r->nq].key = key;
    r->qcache[r->nq++].value = d;
    return d;
}

static size_t no_unescape(void *cls, struct MHD_Connection *c, char *s)
{
    (void)cls;
    (void)c;
    return strlen(s);
}

const char *api_header(struct api_req *r, const char *key)
{
    return MHD_lookup_connection_value(r->conn, MHD_HEADER_KIND, key);
}

json_t *api_body_object(struct api_req *r, enum MHD_Result *ret)
{
    json_error_t je;
    const char *ct = api_header(r, "Content-Type");
    if (!ct || strncasecmp(ct, "application/json", 16) != 0 || (ct[16] && ct[16] != ';')) {
        *ret = api_error(r, 415, "unsupported_media_type", NULL,
                         "the body must be application/json (got %s)", ct ? ct : "no type");
        return NULL;
    }
    if (r->body.len == 0) {
        *ret = api_error(r, 400, "invalid_json", NULL, "the request body is empty");
        return NULL;
    }
    json_t *j = json_loadb(r->body.p, r->body.len, JSON_REJECT_DUPLICATES, &je);
    if (!j) {
        *ret = api_error(r, 400, "invalid_json", NULL, "malformed JSON at byte %d: %s", je.position,
                         je.text);
        return NULL;
    }
    if (!json_is_object(j)) {
        json_decref(j);
        *ret = api_error(r, 400, "invalid_json", NULL, "the body must be a JSON object");
        return NULL;
    }
    return j;
}

/* ---- routing ---- */

/* What an action (a POST that takes no input) reads of a body and ignores. */
#define API_ACTION_BODY_MAX 4096

/* What a route reads of a request body, and so its limit
 * (route_body_limit): a body over it is refused 413 before the handler. */
enum route_body {
    BODY_NONE,   /* none: a single byte is refused */
    BODY_ACTION, /* a POST that takes no input: what clients send along
                    (often {}) is read up to API_ACTION_BODY_MAX and ignored */
    BODY_JSON,   /* a JSON object (api_body_object): max_body_bytes */
    BODY_UPLOAD, /* a worker's chunk of its frames or log: max_body_bytes */
};

/*
 * The routes, looked up on a request's first call, from its method and path
 * alone, before any body is read. A pattern's ":x" segment matches any one
 * segment, which the handler reads as api_param(r, "x").
 *
 *   STORE   the handler uses the worker's store connection, which the
 *           dispatcher then guarantees (503 when it cannot open one), so
 *           handlers never check for it.
 *   ACCESS  what the caller's token must allow (api_int.h): api/auth.c
 *           reads it, before the body, for the token (a worker's routes take
 *           an attempt's own) and for the scope.
 *   BODY    what the route reads of a body (enum route_body): the limit it
 *           is read up to, declared or chunked; past it the body is
 *           discarded as it arrives and the request answered 413.
 *   LIVE    the handler may hold the connection open, suspended, until
 *           something changes (an event stream, a long-poll: api/live_int.h).
 *           Only a live route's request may wait and come back to its
 *           handler when resumed (api_route_live).
 */
struct route {
    const char *method;
    const char *pattern;
    api_handler h;
    bool store;
    enum api_access access;
    enum route_body body;
    bool live;
};

static const struct route routes[] = {
    {"GET", "/healthz", api_healthz, false, API_OPEN, BODY_NONE, false},
    {"GET", "/v1/models", api_models, false, API_READ, BODY_NONE, false},
    {"GET", "/v1/widths", api_widths, false, API_READ, BODY_NONE, false},
    {"GET", "/v1/host", api_host, false, API_READ, BODY_NONE, false},
    {"GET", "/v1/builds", api_builds_list, true, API_READ, BODY_NONE, false},
    {"POST", "/v1/builds", api_builds_create, true, API_ADMIN, BODY_JSON, false},
    {"GET", "/v1/builds/:name", api_builds_get, true, API_READ, BODY_NONE, false},
    {"PUT", "/v1/builds/:name", api_builds_put, true, API_ADMIN, BODY_JSON, false},
    {"GET", "/v1/jobs", api_jobs_list, true, API_READ, BODY_NONE, false},
    {"POST", "/v1/jobs", api_jobs_create, true, API_SUBMIT, BODY_JSON, false},
    {"GET", "/v1/jobs/:id", api_jobs_get, true, API_READ, BODY_NONE, true},
    {"POST", "/v1/jobs/:id/cancel", api_jobs_cancel, true, API_SUBMIT, BODY_ACTION, false},
    {"GET", "/v1/jobs/:id/cells/:cell", api_cell_get, true, API_READ, BODY_NONE, false},
    {"GET", "/v1/jobs/:id/cells/:cell/records", api_cell_records, true, API_READ, BODY_NONE, false},
    {"GET", "/v1/jobs/:id/cells/:cell/log", api_cell_log, true, API_READ, BODY_NONE, false},
    {"POST", "/v1/jobs/:id/cells/:cell/replay", api_cell_replay, true, API_SUBMIT, BODY_JSON,
     false},
    {"GET", "/v1/jobs/:id/cells/:cell/replay", api_cell_replay_get, true, API_READ, BODY_NONE,
     false},
    {"GET", "/v1/jobs/:id/cells/:cell/repro", api_cell_repro, true, API_READ, BODY_NONE, false},
    {"GET", "/v1/jobs/:id/cells/:cell/compiler-bisect", api_cell_compiler_bisect, true, API_READ,
     BODY_NONE, false},
    {"GET", "/v1/jobs/:id/widths", api_jobs_widths, true, API_READ, BODY_NONE, false},
    {"GET", "/v1/jobs/:id/modes", api_jobs_modes, true, API_READ, BODY_NONE, false},
    {"GET", "/v1/compare", api_compare, true, API_READ, BODY_NONE, false},
    {"GET", "/v1/branches/:name", api_branch_get, true, API_READ, BODY_NONE, false},
    {"PUT", "/v1/branches/:name", api_branch_put, true, API_ADMIN, BODY_JSON, false},
    {"GET", "/v1/commits/:sha", api_commit_get, true, API_READ, BODY_NONE, false},
    {"GET", "/v1/commits/:sha/diff", api_commit_diff, true, API_READ, BODY_NONE, false},
    {"GET", "/v1/tokens", api_tokens_list, true, API_ADMIN, BODY_NONE, false},
    {"POST", "/v1/tokens", api_tokens_create, true, API_ADMIN, BODY_JSON, false},
    {"DELETE", "/v1/tokens/:id", api_tokens_revoke, true, API_ADMIN, BODY_NONE, false},
    {"GET", "/v1/devices", api_devices_list, false, API_READ, BODY_NONE, false},
    {"POST", "/v1/devices/refresh", api_devices_refresh, false, API_ADMIN, BODY_ACTION, false},
    {"GET", "/v1/events", api_events, false, API_READ, BODY_NONE, true},
    {"GET", "/v1/history", api_history_get, true, API_READ, BODY_NONE, false},
    {"GET", "/v1/alerts", api_alerts_list, true, API_READ, BODY_NONE, false},
    {"POST", "/v1/alerts/:id", api_alert_post, true, API_ADMIN, BODY_JSON, false},
    {"GET", "/v1/bisect", api_bisect_list, true, API_READ, BODY_NONE, false},
    {"POST", "/v1/bisect", api_bisect_create, true, API_SUBMIT, BODY_JSON, false},
    {"GET", "/v1/bisect/:id", api_bisect_get, true, API_READ, BODY_NONE, false},
    {"POST", "/v1/bisect/:id/cancel", api_bisect_cancel, true, API_SUBMIT, BODY_ACTION, false},
    {"GET", "/v1/attempts/:attempt/spec", api_attempt_spec, true, API_WORKER, BODY_NONE, false},
    {"POST", "/v1/attempts/:attempt/frames", api_attempt_frames, true, API_WORKER, BODY_UPLOAD,
     false},
    {"POST", "/v1/attempts/:attempt/log", api_attempt_log, true, API_WORKER, BODY_UPLOAD, false},
    {"POST", "/v1/attempts/:attempt/finish", api_attempt_finish, true, API_WORKER, BODY_JSON,
     false},
    {"GET", "/metrics", api_metrics, true, API_METRICS, BODY_NONE, false},
    {"GET", "/", api_static_index, false, API_OPEN, BODY_NONE, false},
    {"GET", "/static/:file", api_static_file, false, API_OPEN, BODY_NONE, false},
};

/* The most bytes of body ROUTE reads. An upload's limit is also the
 * chunk_max_bytes a remote attempt's spec names to its worker
 * (daemon/executors/cellremote.c sends max_body_bytes): the two must agree, or a
 * worker's full chunk would be refused. */
static size_t route_body_limit(const struct capd_config *cfg, const struct route *rt)
{
    switch (rt->body) {
    case BODY_NONE:
        return 0;
    case BODY_ACTION:
        return API_ACTION_BODY_MAX;
    case BODY_JSON:
    case BODY_UPLOAD:
        break;
    }
    return cfg->max_body_bytes;
}

bool api_route_live(const struct api_req *r)
{
    return r->route >= 0 && routes[r->route].live;
}

static int hexval(char c)
{
    return c >= '0' && c <= '9'   ? c - '0'
           : c >= 'a' && c <= 'f' ? c - 'a' + 10
           : c >= 'A' && c <= 'F' ? c - 'A' + 10
                                  : -1;
}

/* Splits the path into percent-decoded segments; -1 for a path that is
 * too deep or has a bad escape or a NUL. */
static int split_path(struct api_req *r)
{
    const char *p = r->url;
    if (*p != '/')
        return -1;
    while (*p) {
        p++;
        const char *e = strchr(p, '/');
        size_t n = e ? (size_t)(e - p) : strlen(p);
        if (r->nseg == API_MAX_SEGS)
            return -1;
        char *seg = malloc(n + 1);
        if (!seg)
            return -1;
        size_t o = 0;
        for (size_t i = 0; i < n; i++) {
            if (p[i] == '%' && i + 2 < n + 1 && hexval(p[i + 1]) >= 0 && hexval(p[i + 2]) >= 0) {
                char c = (char)(hexval(p[i + 1]) * 16 + hexval(p[i + 2]));
                if (c == 0) {
                    free(seg);
                    return -1;
                }
                seg[o++] = c;
                i += 2;
            } else {
                seg[o++] = p[i];
            }
        }
        seg[o] = 0;
        r->seg[r->nseg++] = seg;
        p += n;
    }
    /* A trailing slash is not a different resource. */
    if (r->nseg > 1 && r->seg[r->nseg - 1][0] == 0)
        free(r->seg[--r->nseg]);
    return 0;
}

const char *api_param(struct api_req *r, const char *name)
{
    const char *p = r->route_pattern ? r->route_pattern : "";
    size_t want = strlen(name);
    for (int i = 0; *p; i++) {
        p++;
        const char *e = strchr(p, '/');
        size_t n = e ? (size_t)(e - p) : strlen(p);
        if (p[0] == ':' && n == want + 1 && strncmp(p + 1, name, want) == 0 && i < r->nseg)
            return r->seg[i];
        p += n;
    }
    /* A handler asking for what its route does not name is capd's bug. */
    log_error("route_param_unknown", "pattern=%s param=%s", log_q(r->route_pattern), log_q(name));
    return "";
}

static bool route_match(const struct route *rt, struct api_req *r)
{
    const char *p = rt->pattern;
    int i = 0;
    while (*p) {
        p++;
        const char *e = strchr(p, '/');
        size_t n = e ? (size_t)(e - p) : strlen(p);
        if (i >= r->nseg)
            return false;
        if (p[0] != ':' && (strlen(r->seg[i]) != n || strncmp(r->seg[i], p, n) != 0))
            return false;
        if (p[0] == ':' && r->seg[i][0] == 0)
            return false;
        i++;
        p += n;
    }
    return i == r->nseg;
}

/* Looks R's route up from its method and path alone, on its first call:
 * r->route and its method and pattern, or NULL (r->route -1) when none
 * takes the request, which dispatch then answers 404 or 405. A path that
 * cannot be split (too deep, a bad escape, a NUL) keeps no segment. */
static const struct route *route_find(struct api_req *r)
{
    if (split_path(r) != 0) {
        while (r->nseg > 0)
            free(r->seg[--r->nseg]);
        return NULL;
    }
    for (size_t i = 0; i < sizeof routes / sizeof routes[0]; i++) {
        if (route_match(&routes[i], r) && strcmp(routes[i].method, r->method) == 0) {
            r->route = (int)i;
            r->route_method = routes[i].method;
            r->route_pattern = routes[i].pattern;
            return &routes[i];
        }
    }
    return NULL;
}

/* The reply to a request no route takes: 405 naming in Allow the methods
 * its path has, else 404. */
static enum MHD_Result no_route(struct api_req *r)
{
    char allow[64] = "";
    if (r->nseg == 0)
        return api_error(r, 404, "not_found", NULL, "no such resource");
    for (size_t i = 0; i < sizeof routes / sizeof routes[0]; i++) {
        if (!route_match(&routes[i], r))
            continue;
        size_t l = strlen(allow);
        snprintf(allow + l, sizeof allow - l, "%s%s", l ? ", " : "", routes[i].method);
    }
    if (allow[0]) {
        api_reply_header(r, "Allow", allow);
        return api_error(r, 405, "method_not_allowed", NULL, "method not allowed here");
    }
    return api_error(r, 404, "not_found", NULL, "no route for %s %s", r->method, r->url);
}

/* The last call of a request, its body read: the handler, with the store it
 * needs. A request comes back here after its handler ran only when the
 * handler suspended it and the hub resumed it, which only a live route may
 * do; any other is capd's bug, answered rather than run twice. */
static enum MHD_Result dispatch(struct api_req *r)
{
    if (r->route < 0)
        return no_route(r);
    const struct route *rt = &routes[r->route];
    if (r->handled && !rt->live)
        return api_error(r, 500, "internal", NULL,
                         "%s %s came back to its handler but is not a live route", rt->method,
                         rt->pattern);
    r->handled = true;
    if (rt->store && !api_store(r))
        return api_error(r, 503, "unavailable", NULL, "database unavailable");
    return rt->h(r);
}

/* ---- MHD callbacks ---- */

/*
 * The first call of a request: its headers are in, its body (if any) is
 * not. The Host and Origin checks, its route, who is asking and whether the
 * route lets them, and the body's limit, all before a byte of body is read:
 * a refusal here is the reply, and the body is dropped as it arrives.
 */
static enum MHD_Result request_begin(struct api_req *r)
{
    enum MHD_Result ret;
    const struct route *rt = route_find(r);
    ubuf_init(&r->body, rt ? route_body_limit(api_cfg(r), rt) : 0);
    /* Without a route the caller's token is checked as for an admin
     * route: a write needs a valid one; a read gets its 404 or 405. */
    if (api_host_refused(r, &ret) || api_auth_refused(r, rt ? rt->access : API_ADMIN, &ret))
        return ret;
    if (rt && api_scope_refused(r, rt->access, &ret)) {
        r->replied = true;
        return ret;
    }
    /* A declared length over the limit is noted now, and the body is
     * discarded as it arrives: replying before the upload is read
     * makes some clients see a reset instead of the 413. */
    const char *cl = api_header(r, "Content-Length");
    if (rt && cl && strtoull(cl, NULL, 10) > r->body.max)
        r->too_large = true;
    return MHD_YES;
}

/* A piece of R's body, kept up to its route's limit; past the limit, or on
 * a path no route takes (nothing would read it), dropped. */
static enum MHD_Result take_body(struct api_req *r, const char *data, size_t *size)
{
    int rc = r->too_large || r->route < 0 ? 0 : ubuf_add(&r->body, data, *size);
    if (rc == -E2BIG) {
        r->too_large = true;
        ubuf_free(&r->body);
    } else if (rc) {
        return MHD_NO;
    }
    *size = 0;
    return MHD_YES;
}

/* The 413 of a body over its route's limit, naming the route and limit. */
static enum MHD_Result body_refused(struct api_req *r)
{
    enum route_body kind = routes[r->route].body;
    if (kind == BODY_NONE)
        return api_error(r, 413, "body_too_large", NULL,
                         "%s %s takes no request body (its limit is 0 bytes)", r->route_method,
                         r->route_pattern);
    if (kind == BODY_ACTION)
        return api_error(r, 413, "body_too_large", NULL,
                         "%s %s takes no input; it ignores a request body of up to %d bytes",
                         r->route_method, r->route_pattern, API_ACTION_BODY_MAX);
    return api_error(r, 413, "body_too_large", NULL,
                     "request body exceeds the limit of %zu bytes of %s %s (max_body_bytes)",
                     r->body.max, r->route_method, r->route_pattern);
}

static enum MHD_Result on_request(void *cls, struct MHD_Connection *conn, const char *url,
                                  const char *method, const char *version, const char *upload_data,
                                  size_t *upload_size, void **con_cls)
{
    struct api *a = cls;
    struct api_req *r = *con_cls;
    (void)version;
    if (!r) {
        r = calloc(1, sizeof *r);
        if (!r)
            return MHD_NO;
        r->api = a;
        r->conn = conn;
        r->method = method;
        r->url = url;
        r->counted = true;
        r->route = -1;
        r->t0_ns = util_mono_ns();
        __atomic_add_fetch(&a->inflight, 1, __ATOMIC_RELAXED);
        *con_cls = r;
        return request_begin(r);
    }
    if (r->replied) {
        /* Refused before its body: whatever still arrives is dropped. */
        *upload_size = 0;
        return MHD_YES;
    }
    if (*upload_size > 0)
        return take_body(r, upload_data, upload_size);
    if (r->too_large)
        return body_refused(r);
    return dispatch(r);
}

static void on_completed(void *cls, struct MHD_Connection *conn, void **con_cls,
                         enum MHD_RequestTerminationCode toe)
{
    struct api *a = cls;
    struct api_req *r = *con_cls;
    (void)conn;
    (void)toe;
    if (!r)
        return;
    metrics_http(r->route, r->route_method, r->route_pattern, r->status, util_mono_ns() - r->t0_ns);
    api_live_request_done(r);
    if (r->counted)
        __atomic_sub_fetch(&a->inflight, 1, __ATOMIC_RELAXED);
    for (int i = 0; i < r->nseg; i++)
        free(r->seg[i]);
    for (int i = 0; i < r->nq; i++)
        free(r->qcache[i].value);
    ubuf_free(&r->body);
    free(r);
    *con_cls = NULL;
}

static void mhd_log(void *cls, const char *fmt, va_list ap)
{
    char msg[512];
    (void)cls;
    vsnprintf(msg, sizeof msg, fmt, ap);
    size_t n = strlen(msg);
    while (n && msg[n - 1] == '\n')
        msg[--n] = 0;
    log_warn("http_server", "message=%s", log_q(msg));
}

static void api_free(struct api *a)
{
    api_tls_free(a->tls_cert, a->tls_key);
    free(a);
}

bool api_tls(const struct api *a)
{
    return a && a->tls_cert;
}

int api_start(struct capd *d, struct api **out, int *port, char **err)
{
    const struct capd_config *cfg = capd_cfg(d);
    struct sockaddr_in sin;
    pthread_once(&store_once, store_key_init);
    memset(&sin, 0, sizeof sin);
    sin.sin_family = AF_INET;
    sin.sin_port = htons((uint16_t)cfg->listen_port);
    if (inet_pton(AF_INET, cfg->listen_addr, &sin.sin_addr) != 1)
        return util_errf(err, -EINVAL, "listen address '%s' is not an IPv4 address",
                         cfg->listen_addr);
    struct api *a = calloc(1, sizeof *a);
    if (!a)
        return -ENOMEM;
    a->d = d;
    /* HTTPS through libmicrohttpd's GnuTLS backend: the cert and key are
     * handed over as PEM text read now (api/tls.c), so capd needs them
     * readable only at start-up. */
    bool tls = cfg->tls_cert[0] != 0;
    if (tls) {
        int rc = api_tls_load(cfg, &a->tls_cert, &a->tls_key, err);
        if (rc) {
            free(a);
            return rc;
        }
    }
    /* Suspend/resume lets event streams and long-polls wait without a
     * thread (api/live_int.h). */
    unsigned flags = MHD_USE_INTERNAL_POLLING_THREAD | MHD_USE_EPOLL | MHD_USE_ITC |
                     MHD_USE_ERROR_LOG | MHD_ALLOW_SUSPEND_RESUME | (tls ? MHD_USE_TLS : 0);
    int lrc = api_live_start(cfg);
    if (lrc) {
        util_errf(err, lrc, "cannot start the event notifier (%d)", lrc);
        api_free(a);
        return lrc;
    }
    /* MHD reads options up to MHD_OPTION_END: without TLS the list ends
     * before the certificate options. */
    a->mhd = MHD_start_daemon(
        flags, 0, NULL, NULL, on_request, a, MHD_OPTION_EXTERNAL_LOGGER, mhd_log, NULL,
        MHD_OPTION_UNESCAPE_CALLBACK, no_unescape, NULL, MHD_OPTION_SOCK_ADDR,
        (struct sockaddr *)&sin, MHD_OPTION_THREAD_POOL_SIZE, (unsigned)cfg->http_threads,
        MHD_OPTION_NOTIFY_COMPLETED, on_completed, a, MHD_OPTION_CONNECTION_TIMEOUT,
        (unsigned)cfg->request_timeout_s, MHD_OPTION_CONNECTION_LIMIT,
        (unsigned)cfg->max_connections, MHD_OPTION_PER_IP_CONNECTION_LIMIT,
        (unsigned)cfg->max_connections_per_ip, MHD_OPTION_CONNECTION_MEMORY_LIMIT,
        cfg->connection_memory_bytes, tls ? MHD_OPTION_HTTPS_MEM_CERT : MHD_OPTION_END, a->tls_cert,
        MHD_OPTION_HTTPS_MEM_KEY, a->tls_key, MHD_OPTION_END);
    if (!a->mhd) {
        api_live_stop();
        api_live_free();
        api_free(a);
        if (tls)
            return util_errf(err, -EINVAL,
                             "cannot serve HTTPS on %s:%d: the address is in use or not "
                             "permitted, or GnuTLS refused tls_cert '%s' / tls_key '%s' (a key "
                             "that does not match the certificate, or an encrypted key)",
                             cfg->listen_addr, cfg->listen_port, cfg->tls_cert, cfg->tls_key);
        return util_errf(err, -EADDRINUSE,
                         "cannot listen on %s:%d (address in use or not permitted)",
                         cfg->listen_addr, cfg->listen_port);
    }
    const union MHD_DaemonInfo *info = MHD_get_daemon_info(a->mhd, MHD_DAEMON_INFO_BIND_PORT);
    *port = info ? info->port : cfg->listen_port;
    a->port = *port;
    *out = a;
    return 0;
}

void api_quiesce(struct api *a)
{
    if (a->quiesced)
        return;
    a->quiesced = true;
    MHD_socket fd = MHD_quiesce_daemon(a->mhd);
    if (fd != MHD_INVALID_SOCKET)
        close(fd);
    /* Streams and long-polls never end on their own: end them now so the
     * in-flight count can drain. */
    api_live_close();
}

unsigned api_inflight(struct api *a)
{
    return __atomic_load_n(&a->inflight, __ATOMIC_RELAXED);
}

void api_stop(struct api *a)
{
    if (!a)
        return;
    /* MHD must not stop with suspended connections: resume them all and
     * stop the notifier first. */
    api_live_stop();
    MHD_stop_daemon(a->mhd);
    api_live_free();
    api_free(a);
}
