/*
 * api/api_jobs_live.c - the front half of GET /v1/jobs/{id}: its ETag and
 * 304, the long-poll ?wait=N that waits suspended for the job to change
 * (woken by the hub, api/api_live.c; see api/live_int.h), and each worker
 * thread's cache of the rendered job bodies.
 */
#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "api/live_int.h"
#include "util/clock.h"

#define LIVE_MAX_WAIT_S    120 /* longest ?wait= */
#define JOB_CACHE_SLOTS    32
#define JOB_CACHE_MAX_BODY (256u << 10)

/* Each worker thread keeps the bodies of the jobs it served last, keyed by
 * job id and version: a dashboard polling a job costs one indexed SELECT
 * and a copy until the job changes. */
struct job_cache_ent {
    char id[16];
    int64_t version;
    char *body;
    size_t len;
};

static pthread_key_t cache_key;
static pthread_once_t cache_once = PTHREAD_ONCE_INIT;

static void cache_free(void *p)
{
    struct job_cache_ent *c = p;
    for (int i = 0; i < JOB_CACHE_SLOTS; i++)
        free(c[i].body);
    free(c);
}

static void cache_init(void)
{
    pthread_key_create(&cache_key, cache_free);
}

static struct job_cache_ent *cache_slot(const char *id)
{
    pthread_once(&cache_once, cache_init);
    struct job_cache_ent *c = pthread_getspecific(cache_key);
    if (!c) {
        c = calloc(JOB_CACHE_SLOTS, sizeof *c);
        if (!c || pthread_setspecific(cache_key, c) != 0) {
            free(c);
            return NULL;
        }
    }
    uint64_t hsh = 1469598103934665603ULL;
    for (const char *p = id; *p; p++)
        hsh = (hsh ^ (unsigned char)*p) * 1099511628211ULL;
    return &c[hsh % JOB_CACHE_SLOTS];
}

static enum MHD_Result reply_job(struct api_req *r, struct store *s, const char *id,
                                 int64_t version)
{
    struct job_cache_ent *e = cache_slot(id);
    if (e && e->body && e->version == version && strcmp(e->id, id) == 0) {
        char *copy = malloc(e->len + 1);
        if (!copy)
            return MHD_NO;
        memcpy(copy, e->body, e->len + 1);
        return api_text(r, 200, "application/json", copy, e->len);
    }
    json_t *job = NULL;
    int rc = store_job_get(s, id, &job);
    if (rc)
        return api_store_error(r, rc, "job");
    /* Exactly what api_json would send. */
    char *body = json_dumps(job, JSON_COMPACT | JSON_ENSURE_ASCII);
    json_decref(job);
    if (!body)
        return api_error(r, 500, "internal", NULL, "the job could not be encoded");
    size_t n = strlen(body);
    char *t = realloc(body, n + 2);
    if (!t) {
        free(body);
        return MHD_NO;
    }
    body = t;
    body[n++] = '\n';
    body[n] = 0;
    if (e && n <= JOB_CACHE_MAX_BODY) {
        char *keep = malloc(n + 1);
        if (keep) {
            memcpy(keep, body, n + 1);
            free(e->body);
            snprintf(e->id, sizeof e->id, "%s", id);
            e->version = version;
            e->body = keep;
            e->len = n;
        }
    }
    return api_text(r, 200, "application/json", body, n);
}

static int64_t hub_last_id(void)
{
    struct live_hub *h = api__live_hub;
    if (!h)
        return 0;
    pthread_mutex_lock(&h->mu);
    int64_t v = h->last_id;
    pthread_mutex_unlock(&h->mu);
    return v;
}

/* ?wait=N, read on the first call; false, having replied 400, when it is
 * not a whole number of seconds in range. */
static bool parse_wait(struct api_req *r, int *wait_s, enum MHD_Result *ret)
{
    const char *ws = api_query(r, "wait");
    if (!ws)
        return true;
    char *end;
    long v = strtol(ws, &end, 10);
    if (*end || end == ws || v < 0 || v > LIVE_MAX_WAIT_S) {
        *ret = api_error(r, 400, "invalid_query", "wait",
                         "wait must be an integer number of seconds in [0, %d]", LIVE_MAX_WAIT_S);
        return false;
    }
    *wait_s = (int)v;
    return true;
}

/* The long-poll of R, made on its first call: it waits WAIT_S seconds at
 * most for the ETag to differ from If-None-Match (INM) or, without one,
 * from the ETag at arrival. NULL when memory runs out. */
static struct live_waiter *waiter_new(struct api_req *r, const char *id, const char *inm,
                                      int wait_s)
{
    struct live_waiter *w = calloc(1, sizeof *w);
    if (!w)
        return NULL;
    w->conn = r->conn;
    snprintf(w->job, sizeof w->job, "%s", id);
    w->has_inm = inm != NULL;
    snprintf(w->baseline, sizeof w->baseline, "%s", inm ? inm : r->etag);
    w->deadline = util_mono_ms() + (int64_t)wait_s * 1000;
    r->poll = w;
    return w;
}

/* The answer of a long-poll that ends with nothing changed: 304 to a client
 * that sent If-None-Match, else the body as it is. */
static enum MHD_Result reply_unchanged(struct api_req *r, const struct live_waiter *w,
                                       struct store *s, const char *id, int64_t version)
{
    return w->has_inm ? api_not_modified(r) : reply_job(r, s, id, version);
}

enum wait_step { WAIT_SUSPENDED, WAIT_AGAIN, WAIT_CLOSING };

/*
 * Lists the long-poll with the hub and suspends the request, unless the
 * server is closing (answer now) or an event was fanned out after SEEN, the
 * hub's last id when the version was read: it may have been this job's, so
 * the caller looks again instead of sleeping.
 */
static enum wait_step waiter_suspend(struct live_hub *h, struct live_waiter *w, struct api_req *r,
                                     int64_t seen)
{
    w->fired = false;
    pthread_mutex_lock(&h->mu);
    if (h->closing) {
        pthread_mutex_unlock(&h->mu);
        return WAIT_CLOSING;
    }
    if (h->last_id != seen) {
        pthread_mutex_unlock(&h->mu);
        return WAIT_AGAIN;
    }
    w->listed = true;
    LIVE_PUSH(h->waiters, w);
    h->nwaiters++;
    api__live_gauges(h);
    pthread_cond_signal(&h->cv); /* the hub recomputes its next deadline */
    pthread_mutex_unlock(&h->mu);
    MHD_suspend_connection(r->conn);
    return WAIT_SUSPENDED;
}

/*
 * The front half of GET /v1/jobs/{id}. Without ?wait it answers 304 when
 * If-None-Match still matches, else the (cached) body. With ?wait=N it
 * holds the request, suspended, until the job's ETag differs from the
 * client's If-None-Match (or, without one, from the ETag at arrival), the
 * job has ended, or N seconds pass; then it answers as without wait.
 * Returns false, having replied nothing, when the handler's own path
 * should answer (no such job, a database error).
 */
bool api_jobs_live_replied(struct api_req *r, enum MHD_Result *ret)
{
    struct live_hub *h = api__live_hub;
    struct live_waiter *w = r->poll;
    const char *id = api_param(r, "id");
    struct store *s = api_store(r);
    int wait_s = 0;
    if (!w && !parse_wait(r, &wait_s, ret))
        return true;
    int64_t version = 0;
    for (int tries = 0; tries < 8; tries++) {
        int64_t seen = hub_last_id();
        bool finished = false;
        if (store_job_version(s, id, &version, &finished) != 0)
            return false;
        api_set_etag(r, "%s.%lld", id, (long long)version);
        if (!w) {
            const char *inm = api_header(r, "If-None-Match");
            if (wait_s == 0 || !h) {
                *ret = inm && api_if_none_match(r) ? api_not_modified(r)
                                                   : reply_job(r, s, id, version);
                return true;
            }
            if (api__live_route_refused(r, ret))
                return true;
            if (!(w = waiter_new(r, id, inm, wait_s))) {
                *ret = api_error(r, 500, "internal", NULL, "out of memory");
                return true;
            }
        }
        bool unchanged = w->has_inm ? api_if_none_match(r) : strcmp(w->baseline, r->etag) == 0;
        if (!unchanged) {
            *ret = reply_job(r, s, id, version);
            return true;
        }
        if (finished || w->timed_out || util_mono_ms() >= w->deadline) {
            *ret = reply_unchanged(r, w, s, id, version);
            return true;
        }
        enum wait_step step = waiter_suspend(h, w, r, seen);
        if (step == WAIT_AGAIN)
            continue;
        *ret = step == WAIT_SUSPENDED ? MHD_YES : reply_unchanged(r, w, s, id, version);
        return true;
    }
    *ret = reply_job(r, s, id, version);
    return true;
}

void api_live_request_done(struct api_req *r)
{
    struct live_waiter *w = r->poll;
    struct live_hub *h = api__live_hub;
    if (!w)
        return;
    if (h && w->listed) {
        pthread_mutex_lock(&h->mu);
        api__live_unlist_waiter(h, w);
        api__live_gauges(h);
        pthread_mutex_unlock(&h->mu);
    }
    free(w);
    r->poll = NULL;
}