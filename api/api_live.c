/*
 * api/api_live.c - the notifier thread (the "hub") of live updates: it
 * reads new event rows after each commit that wrote some, fans them out to
 * the buffers of the matching event streams, wakes the suspended streams and
 * long-polls they concern, times the long-polls out and queues heartbeats;
 * and it starts, closes and stops with the HTTP server. How the parts fit
 * together is in api/live_int.h.
 */
#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "api/live_int.h"
#include "util/clock.h"
#include "util/log.h"
#include "util/metrics.h"

#define LIVE_POLL_MS 2000 /* re-read the events table even without a signal */

struct live_hub *api__live_hub;

void api__live_gauges(struct live_hub *h)
{
    metrics_live_set(h->nstreams, h->nwaiters);
}

/* ---- buffers ---- */

/* Appends to a stream's buffer; false when that would pass LIVE_MAX_BUF or
 * memory runs out (the stream then catches up from SQLite). */
bool api__live_buf_append(struct live_stream *st, const char *p, size_t n)
{
    struct ubuf *b = &st->buf;
    if (st->off > 0 && st->off == b->len) {
        ubuf_reset(b);
        st->off = 0;
    }
    if (b->len - st->off + n > LIVE_MAX_BUF)
        return false;
    /* The sent bytes at the front are dropped only when the room is needed. */
    if (st->off > 0 && b->len + n + 1 > b->cap) {
        ubuf_shift(b, st->off);
        st->off = 0;
    }
    return ubuf_add(b, p, n) == 0;
}

static char *sse_format(int64_t id, const char *type, const char *data, size_t *n)
{
    char *s = NULL;
    int k = asprintf(&s, "id: %lld\nevent: %s\ndata: %s\n\n", (long long)id, type, data);
    if (k < 0)
        return NULL;
    *n = (size_t)k;
    return s;
}

static bool stream_matches(const struct live_stream *st, const char *job, const char *project,
                           const char *branch)
{
    if (st->f.job && strcmp(st->f.job, job) != 0)
        return false;
    if (st->f.project && strcmp(st->f.project, project) != 0)
        return false;
    if (st->f.branch && (!branch || strcmp(st->f.branch, branch) != 0))
        return false;
    return true;
}

/* ---- resuming ---- */

struct conn_list {
    struct MHD_Connection **v;
    size_t n, cap;
};

/* Collects a connection to resume once the hub lock is released; when no
 * memory is left it resumes at once (MHD_resume_connection only takes
 * MHD's own short lock, so this is safe, merely not preferred). */
static void collect(struct conn_list *l, struct MHD_Connection *c)
{
    if (l->n == l->cap) {
        size_t cap = l->cap ? l->cap * 2 : 64;
        struct MHD_Connection **nv = realloc(l->v, cap * sizeof *nv);
        if (!nv) {
            MHD_resume_connection(c);
            return;
        }
        l->v = nv;
        l->cap = cap;
    }
    l->v[l->n++] = c;
}

static void resume_all(struct conn_list *l)
{
    for (size_t i = 0; i < l->n; i++)
        MHD_resume_connection(l->v[i]);
    l->n = 0;
}

static void wake_stream(struct live_stream *st, struct conn_list *l)
{
    if (st->suspended) {
        st->suspended = false;
        collect(l, st->conn);
    }
}

void api__live_unlist_waiter(struct live_hub *h, struct live_waiter *w)
{
    if (!w->listed)
        return;
    LIVE_UNLINK(h->waiters, w);
    w->listed = false;
    h->nwaiters--;
}

bool api__live_route_refused(struct api_req *r, enum MHD_Result *ret)
{
    if (api_route_live(r))
        return false;
    *ret = api_error(r, 500, "internal", NULL,
                     "%s %s may not hold its connection: the route table does not mark it live",
                     r->route_method, r->route_pattern);
    return true;
}

/* ---- the hub thread ---- */

int api__live_page_add(void *ud, int64_t id, const char *type, const char *job, const char *project,
                       const char *branch, const char *data)
{
    struct live_page *p = ud;
    struct live_ev *e = &p->v[p->n];
    memset(e, 0, sizeof *e);
    e->id = id;
    snprintf(e->job, sizeof e->job, "%s", job ? job : "");
    e->project = strdup(project ? project : "");
    e->branch = branch ? strdup(branch) : NULL;
    e->msg = sse_format(id, type, data ? data : "{}", &e->len);
    p->n++;
    return 0;
}

void api__live_page_clear(struct live_page *p)
{
    for (int i = 0; i < p->n; i++) {
        free(p->v[i].project);
        free(p->v[i].branch);
        free(p->v[i].msg);
    }
    p->n = 0;
}

/* Under the hub lock: hands one page of new events to every stream that is
 * live (not catching up) and wakes the long-polls of the jobs named. */
static void fan_out(struct live_hub *h, const struct live_page *p, struct conn_list *l)
{
    for (int i = 0; i < p->n; i++) {
        const struct live_ev *e = &p->v[i];
        if (e->id <= h->last_id)
            continue;
        for (struct live_stream *st = h->streams; st; st = st->next) {
            if (st->replaying || st->failed || e->id <= st->cursor)
                continue;
            if (e->msg && stream_matches(st, e->job, e->project, e->branch)) {
                if (!api__live_buf_append(st, e->msg, e->len)) {
                    /* Too far behind: read the rest from SQLite. */
                    st->replaying = true;
                    wake_stream(st, l);
                    continue;
                }
                wake_stream(st, l);
            }
            st->cursor = e->id;
        }
        for (struct live_waiter *w = h->waiters, *nx; w; w = nx) {
            nx = w->next;
            if (strcmp(w->job, e->job) == 0) {
                api__live_unlist_waiter(h, w);
                w->fired = true;
                collect(l, w->conn);
            }
        }
        h->last_id = e->id;
    }
    api__live_gauges(h);
}

static void read_new_events(struct live_hub *h, struct store *s, struct conn_list *l)
{
    struct live_page *p = calloc(1, sizeof *p);
    if (!p)
        return;
    for (int round = 0; round < 1000; round++) {
        pthread_mutex_lock(&h->mu);
        int64_t after = h->last_id;
        pthread_mutex_unlock(&h->mu);
        int n = 0;
        int rc = store_events_read(s, after, 0, NULL, LIVE_PAGE, api__live_page_add, p, &n);
        if (rc) {
            log_warn("events_read_failed", "rc=%d err=%s", rc, log_q(store_errmsg(s)));
            api__live_page_clear(p);
            break;
        }
        pthread_mutex_lock(&h->mu);
        fan_out(h, p, l);
        pthread_mutex_unlock(&h->mu);
        api__live_page_clear(p);
        resume_all(l);
        if (n < LIVE_PAGE)
            break;
    }
    free(p);
}

/*
 * The hub's start: its own connection and the newest event id, handed to
 * api_live_start, which waits for them. Returns the connection with the hub
 * lock held, or NULL (reported, lock released) when SQLite cannot be read.
 */
static struct store *hub_open(struct live_hub *h)
{
    struct store *s = NULL;
    char *err = NULL;
    int rc = store_open(h->cfg->data_dir, false, &s, &err);
    int64_t oldest = 0, newest = 0;
    if (rc == 0)
        rc = store_events_bounds(s, &oldest, &newest);
    pthread_mutex_lock(&h->mu);
    h->start_rc = rc;
    h->last_id = newest;
    h->ready = true;
    pthread_cond_broadcast(&h->cv);
    if (rc) {
        pthread_mutex_unlock(&h->mu);
        log_error("events_hub_failed", "rc=%d err=%s", rc, log_q(err));
        free(err);
        store_close(s);
        return NULL;
    }
    return s;
}

/* Under the hub lock: wakes the long-polls whose deadline has passed and
 * lowers *wake to the nearest deadline still ahead. */
static void hub_expire_waiters(struct live_hub *h, int64_t now, int64_t *wake, struct conn_list *l)
{
    for (struct live_waiter *w = h->waiters, *nx; w; w = nx) {
        nx = w->next;
        if (w->deadline <= now) {
            api__live_unlist_waiter(h, w);
            w->timed_out = true;
            collect(l, w->conn);
        } else if (w->deadline < *wake) {
            *wake = w->deadline;
        }
    }
}

/* Under the hub lock, once per tick: marks a heartbeat due on every stream
 * that has sent nothing for an interval, and lowers *wake to the next tick. */
static void hub_heartbeats(struct live_hub *h, int64_t now, int64_t hb_ms, int64_t hb_tick,
                           int64_t *wake, struct conn_list *l)
{
    if (now < h->next_hb)
        return;
    for (struct live_stream *st = h->streams; st; st = st->next) {
        if (now < st->next_hb)
            continue;
        st->hb_due = true;
        st->next_hb = now + hb_ms;
        wake_stream(st, l);
    }
    h->next_hb = now + hb_tick;
    if (h->streams && h->next_hb < *wake)
        *wake = h->next_hb;
}

/* Under the hub lock: sleeps until WAKE (CLOCK_MONOTONIC ms) or a signal. */
static void hub_sleep(struct live_hub *h, int64_t now, int64_t wake)
{
    struct timespec ts;
    int64_t ms = wake > now ? wake : now + 1;
    ts.tv_sec = (time_t)(ms / 1000);
    ts.tv_nsec = (long)(ms % 1000) * 1000000;
    pthread_cond_timedwait(&h->cv, &h->mu, &ts);
}

/*
 * The hub thread. Each round, with the lock held: new events first (read
 * with the lock released), else the long-polls past their deadline and the
 * heartbeats due, then the connections collected are resumed outside the
 * lock, and otherwise it sleeps until the nearest deadline or a poke.
 */
static void *hub_main(void *arg)
{
    struct live_hub *h = arg;
    struct conn_list l = {0};
    struct store *s = hub_open(h);
    if (s == NULL)
        return NULL;
    int64_t now = util_mono_ms();
    /* Heartbeats are due per stream (an interval after it last sent
     * anything) and looked for ten times per interval, so a thousand
     * streams opened together do not all wake in the same instant. */
    int64_t hb_ms = (int64_t)h->cfg->event_heartbeat_s * 1000;
    int64_t hb_tick = hb_ms / 10 > 20 ? hb_ms / 10 : 20;
    h->next_hb = now + hb_tick;
    h->next_poll = now + LIVE_POLL_MS;
    while (!h->stop) {
        now = util_mono_ms();
        if (h->dirty || now >= h->next_poll) {
            h->dirty = false;
            h->next_poll = now + LIVE_POLL_MS;
            pthread_mutex_unlock(&h->mu);
            read_new_events(h, s, &l);
            pthread_mutex_lock(&h->mu);
            continue;
        }
        int64_t wake = h->streams && h->next_hb < h->next_poll ? h->next_hb : h->next_poll;
        hub_expire_waiters(h, now, &wake, &l);
        hub_heartbeats(h, now, hb_ms, hb_tick, &wake, &l);
        if (l.n) {
            api__live_gauges(h);
            pthread_mutex_unlock(&h->mu);
            resume_all(&l);
            pthread_mutex_lock(&h->mu);
            continue;
        }
        if (h->dirty || h->stop)
            continue;
        hub_sleep(h, now, wake);
    }
    pthread_mutex_unlock(&h->mu);
    free(l.v);
    store_close(s);
    return NULL;
}

/* storage's listener: runs on the committing thread, right after commit. */
static void live_poke(void *ud)
{
    struct live_hub *h = ud;
    pthread_mutex_lock(&h->mu);
    h->dirty = true;
    pthread_cond_signal(&h->cv);
    pthread_mutex_unlock(&h->mu);
}

int api_live_start(const struct capd_config *cfg)
{
    struct live_hub *h = calloc(1, sizeof *h);
    pthread_condattr_t ca;
    if (!h)
        return -ENOMEM;
    h->cfg = cfg;
    pthread_mutex_init(&h->mu, NULL);
    pthread_condattr_init(&ca);
    pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
    pthread_cond_init(&h->cv, &ca);
    pthread_condattr_destroy(&ca);
    if (pthread_create(&h->thread, NULL, hub_main, h) != 0) {
        pthread_cond_destroy(&h->cv);
        pthread_mutex_destroy(&h->mu);
        free(h);
        return -EAGAIN;
    }
    h->started = true;
    pthread_mutex_lock(&h->mu);
    while (!h->ready)
        pthread_cond_wait(&h->cv, &h->mu);
    int rc = h->start_rc;
    pthread_mutex_unlock(&h->mu);
    if (rc) {
        pthread_join(h->thread, NULL);
        pthread_cond_destroy(&h->cv);
        pthread_mutex_destroy(&h->mu);
        free(h);
        return rc;
    }
    api__live_hub = h;
    store_events_listen(live_poke, h);
    return 0;
}

/* Ends every stream and answers every long-poll now; refuses new ones.
 * Called when the server quiesces and again before it stops. */
void api_live_close(void)
{
    struct live_hub *h = api__live_hub;
    struct conn_list l = {0};
    if (!h)
        return;
    pthread_mutex_lock(&h->mu);
    h->closing = true;
    for (struct live_stream *st = h->streams; st; st = st->next)
        wake_stream(st, &l);
    while (h->waiters) {
        struct live_waiter *w = h->waiters;
        api__live_unlist_waiter(h, w);
        w->timed_out = true;
        collect(&l, w->conn);
    }
    api__live_gauges(h);
    pthread_mutex_unlock(&h->mu);
    resume_all(&l);
    free(l.v);
}

void api_live_stop(void)
{
    struct live_hub *h = api__live_hub;
    if (!h)
        return;
    api_live_close();
    store_events_listen(NULL, NULL);
    pthread_mutex_lock(&h->mu);
    h->stop = true;
    pthread_cond_signal(&h->cv);
    pthread_mutex_unlock(&h->mu);
    if (h->started)
        pthread_join(h->thread, NULL);
    h->started = false;
}

/* After MHD has stopped: every stream's free callback has run. */
void api_live_free(void)
{
    struct live_hub *h = api__live_hub;
    if (!h)
        return;
    api__live_hub = NULL;
    pthread_cond_destroy(&h->cv);
    pthread_mutex_destroy(&h->mu);
    free(h);
}