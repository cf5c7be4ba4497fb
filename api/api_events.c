/*
 * api/api_events.c - live updates: GET /v1/events (Server-Sent Events) and
 * the long-poll GET /v1/jobs/{id}?wait=N, neither of which holds a thread
 * while it waits.
 *
 * How a change reaches a waiting client:
 *
 *   1. A transaction that changes a job or a cell writes its event rows
 *      through triggers (schema/003_events.sql). After the commit,
 *      storage calls our listener (live_poke) on the committing thread;
 *      the listener only sets a flag and signals a condition variable.
 *   2. One notifier thread (the "hub") reads the new rows from SQLite with
 *      its own connection, formats each event once, appends it to the
 *      buffer of every stream whose filters match, and collects the
 *      connections to wake: suspended streams that got data, and
 *      long-polls of the jobs the events name.
 *   3. It calls MHD_resume_connection (thread-safe) on those, outside its
 *      lock. MHD then runs the stream's content reader, or the long-poll's
 *      handler again, on the worker thread that owns the connection.
 *
 * A waiting connection is suspended (MHD_suspend_connection from its
 * handler or content reader), so it costs a socket and a few hundred bytes,
 * never a pool thread, and MHD neither polls nor times it out meanwhile.
 * The hub also wakes long-polls at their deadline and queues a heartbeat
 * comment on every stream each event_heartbeat_s (which is also how a
 * vanished client is noticed: the write fails).
 *
 * A stream that falls behind (its buffer would pass LIVE_MAX_BUF) stops
 * taking events from the hub and catches up from SQLite by itself, a page
 * at a time, exactly as a reconnecting client with Last-Event-ID does; a
 * client whose Last-Event-ID has left the replay window first gets a
 * `reset` event telling it to reload.
 *
 * Races between suspending and resuming are benign by MHD's design: a
 * resume that arrives before the suspend it answers cancels that suspend
 * (the reader or handler simply runs again), and a connection that has
 * announced it will suspend (the `suspended` flag, set under the hub lock)
 * cannot be closed before it has been resumed. At shutdown every waiting
 * connection is resumed and told to finish, because MHD refuses to stop
 * with suspended connections.
 */
#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "api/api_int.h"
#include "daemon/log.h"
#include "daemon/metrics.h"

#define LIVE_MAX_BUF       (64u << 10) /* queued bytes per stream before it catches up from SQLite */
#define LIVE_PAGE          200         /* events per SQLite read */
#define LIVE_POLL_MS       2000        /* re-read the events table even without a signal */
#define LIVE_MAX_WAIT_S    120         /* longest ?wait= */
#define LIVE_BLOCK         16384       /* MHD block size of a stream */
#define JOB_CACHE_SLOTS    32
#define JOB_CACHE_MAX_BODY (256u << 10)

struct live_stream {
    struct live_stream *prev, *next;
    struct MHD_Connection *conn;
    const struct capd_config *cfg;
    struct store_event_filter f; /* points into the arrays below */
    char job[16], project[129], branch[256];
    int64_t cursor;      /* last event id queued or known not to match */
    bool replaying;      /* reading from SQLite until it has caught up */
    bool checked_window; /* Last-Event-ID compared with the replay window */
    bool suspended, hb_due;
    int64_t next_hb; /* CLOCK_MONOTONIC ms; pushed back whenever data goes out */
    bool failed;     /* SQLite could not be read: end, the client resumes */
    char *buf;
    size_t len, off, cap;
};

/* A long-poll of one job; lives in r->poll from its first call to the end
 * of the request, and in the hub's list only while suspended. */
struct live_waiter {
    struct live_waiter *prev, *next;
    struct MHD_Connection *conn;
    char job[16];
    char baseline[96]; /* If-None-Match as sent, or the ETag at the first call */
    bool has_inm;
    int64_t deadline; /* CLOCK_MONOTONIC ms */
    bool listed, fired, timed_out;
};

struct live_hub {
    pthread_mutex_t mu;
    pthread_cond_t cv;
    pthread_t thread;
    bool started, ready, dirty, stop, closing;
    int start_rc;
    int64_t last_id;            /* newest event fanned out */
    int64_t next_hb, next_poll; /* next heartbeat scan, next safety re-read */
    unsigned stream_seq;        /* spreads the streams' first heartbeats */
    struct live_stream *streams;
    struct live_waiter *waiters;
    unsigned nstreams, nwaiters;
    const struct capd_config *cfg;
};

static struct live_hub *g_hub;

static int64_t mono_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

static void publish_gauges(struct live_hub *h)
{
    metrics_live_set(h->nstreams, h->nwaiters);
}

/* ---- buffers ---- */

/* Appends to a stream's buffer; false when that would pass LIVE_MAX_BUF or
 * memory runs out (the stream then catches up from SQLite). */
static bool buf_append(struct live_stream *st, const char *p, size_t n)
{
    if (st->off > 0 && st->off == st->len)
        st->off = st->len = 0;
    if (st->len - st->off + n > LIVE_MAX_BUF)
        return false;
    if (st->len + n > st->cap) {
        if (st->off > 0) {
            memmove(st->buf, st->buf + st->off, st->len - st->off);
            st->len -= st->off;
            st->off = 0;
        }
        if (st->len + n > st->cap) {
            size_t cap = st->cap ? st->cap : 4096;
            while (cap < st->len + n)
                cap *= 2;
            char *nb = realloc(st->buf, cap);
            if (!nb)
                return false;
            st->buf = nb;
            st->cap = cap;
        }
    }
    memcpy(st->buf + st->len, p, n);
    st->len += n;
    return true;
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

static void unlist_waiter(struct live_hub *h, struct live_waiter *w)
{
    if (!w->listed)
        return;
    if (w->prev)
        w->prev->next = w->next;
    else
        h->waiters = w->next;
    if (w->next)
        w->next->prev = w->prev;
    w->prev = w->next = NULL;
    w->listed = false;
    h->nwaiters--;
}

/* ---- the hub thread ---- */

struct ev {
    int64_t id;
    char job[16];
    char *project, *branch, *msg;
    size_t len;
};

struct ev_page {
    struct ev v[LIVE_PAGE];
    int n;
};

static int page_add(void *ud, int64_t id, const char *type, const char *job, const char *project,
                    const char *branch, const char *data)
{
    struct ev_page *p = ud;
    struct ev *e = &p->v[p->n];
    memset(e, 0, sizeof *e);
    e->id = id;
    snprintf(e->job, sizeof e->job, "%s", job ? job : "");
    e->project = strdup(project ? project : "");
    e->branch = branch ? strdup(branch) : NULL;
    e->msg = sse_format(id, type, data ? data : "{}", &e->len);
    p->n++;
    return 0;
}

static void page_clear(struct ev_page *p)
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
static void fan_out(struct live_hub *h, const struct ev_page *p, struct conn_list *l)
{
    for (int i = 0; i < p->n; i++) {
        const struct ev *e = &p->v[i];
        if (e->id <= h->last_id)
            continue;
        for (struct live_stream *st = h->streams; st; st = st->next) {
            if (st->replaying || st->failed || e->id <= st->cursor)
                continue;
            if (e->msg && stream_matches(st, e->job, e->project, e->branch)) {
                if (!buf_append(st, e->msg, e->len)) {
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
                unlist_waiter(h, w);
                w->fired = true;
                collect(l, w->conn);
            }
        }
        h->last_id = e->id;
    }
    publish_gauges(h);
}

static void read_new_events(struct live_hub *h, struct store *s, struct conn_list *l)
{
    struct ev_page *p = calloc(1, sizeof *p);
    if (!p)
        return;
    for (int round = 0; round < 1000; round++) {
        pthread_mutex_lock(&h->mu);
        int64_t after = h->last_id;
        pthread_mutex_unlock(&h->mu);
        int n = 0;
        int rc = store_events_read(s, after, 0, NULL, LIVE_PAGE, page_add, p, &n);
        if (rc) {
            log_warn("events_read_failed", "rc=%d err=%s", rc, log_q(store_errmsg(s)));
            page_clear(p);
            break;
        }
        pthread_mutex_lock(&h->mu);
        fan_out(h, p, l);
        pthread_mutex_unlock(&h->mu);
        page_clear(p);
        resume_all(l);
        if (n < LIVE_PAGE)
            break;
    }
    free(p);
}

static void *hub_main(void *arg)
{
    struct live_hub *h = arg;
    struct store *s = NULL;
    char *err = NULL;
    struct conn_list l = {0};
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
    int64_t now = mono_ms();
    /* Heartbeats are due per stream (an interval after it last sent
     * anything) and looked for ten times per interval, so a thousand
     * streams opened together do not all wake in the same instant. */
    int64_t hb_ms = (int64_t)h->cfg->event_heartbeat_s * 1000;
    int64_t hb_tick = hb_ms / 10 > 20 ? hb_ms / 10 : 20;
    h->next_hb = now + hb_tick;
    h->next_poll = now + LIVE_POLL_MS;
    while (!h->stop) {
        now = mono_ms();
        if (h->dirty || now >= h->next_poll) {
            h->dirty = false;
            h->next_poll = now + LIVE_POLL_MS;
            pthread_mutex_unlock(&h->mu);
            read_new_events(h, s, &l);
            pthread_mutex_lock(&h->mu);
            continue;
        }
        int64_t wake = h->streams && h->next_hb < h->next_poll ? h->next_hb : h->next_poll;
        for (struct live_waiter *w = h->waiters, *nx; w; w = nx) {
            nx = w->next;
            if (w->deadline <= now) {
                unlist_waiter(h, w);
                w->timed_out = true;
                collect(&l, w->conn);
            } else if (w->deadline < wake) {
                wake = w->deadline;
            }
        }
        if (now >= h->next_hb) {
            for (struct live_stream *st = h->streams; st; st = st->next) {
                if (now < st->next_hb)
                    continue;
                st->hb_due = true;
                st->next_hb = now + hb_ms;
                wake_stream(st, &l);
            }
            h->next_hb = now + hb_tick;
            if (h->streams && h->next_hb < wake)
                wake = h->next_hb;
        }
        if (l.n) {
            publish_gauges(h);
            pthread_mutex_unlock(&h->mu);
            resume_all(&l);
            pthread_mutex_lock(&h->mu);
            continue;
        }
        if (h->dirty || h->stop)
            continue;
        struct timespec ts;
        int64_t ms = wake > now ? wake : now + 1;
        ts.tv_sec = (time_t)(ms / 1000);
        ts.tv_nsec = (long)(ms % 1000) * 1000000;
        pthread_cond_timedwait(&h->cv, &h->mu, &ts);
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
    g_hub = h;
    store_events_listen(live_poke, h);
    return 0;
}

/* Ends every stream and answers every long-poll now; refuses new ones.
 * Called when the server quiesces and again before it stops. */
void api_live_close(void)
{
    struct live_hub *h = g_hub;
    struct conn_list l = {0};
    if (!h)
        return;
    pthread_mutex_lock(&h->mu);
    h->closing = true;
    for (struct live_stream *st = h->streams; st; st = st->next)
        wake_stream(st, &l);
    while (h->waiters) {
        struct live_waiter *w = h->waiters;
        unlist_waiter(h, w);
        w->timed_out = true;
        collect(&l, w->conn);
    }
    publish_gauges(h);
    pthread_mutex_unlock(&h->mu);
    resume_all(&l);
    free(l.v);
}

void api_live_stop(void)
{
    struct live_hub *h = g_hub;
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
    struct live_hub *h = g_hub;
    if (!h)
        return;
    g_hub = NULL;
    pthread_cond_destroy(&h->cv);
    pthread_mutex_destroy(&h->mu);
    free(h);
}

/* ---- GET /v1/events ---- */

/* Reads the next page of a stream that is catching up, on the worker thread
 * that serves it (with that thread's own connection). */
static void stream_replay(struct live_stream *st)
{
    struct live_hub *h = g_hub;
    struct store *s = api_thread_store(st->cfg);
    struct ev_page *p = calloc(1, sizeof *p);
    int64_t oldest = 0, newest = 0;
    char reset[160] = "";
    int n = 0;
    int rc = !s || !p ? -ENOMEM : store_events_bounds(s, &oldest, &newest);
    pthread_mutex_lock(&h->mu);
    int64_t cursor = st->cursor;
    bool check = !st->checked_window;
    pthread_mutex_unlock(&h->mu);
    if (rc == 0 && check) {
        /* The client's last id is newer than anything here (another
         * database), or older than the window: it missed events it can
         * never get, so it is told to reload. */
        const char *why = NULL;
        if (cursor > newest) {
            why = "unknown_id";
            cursor = newest;
        } else if (oldest > 0 && cursor < oldest - 1) {
            why = "window_exceeded";
            cursor = oldest - 1;
        }
        if (why)
            snprintf(reset, sizeof reset,
                     "event: reset\ndata: {\"reason\":\"%s\",\"oldest_id\":%lld,"
                     "\"newest_id\":%lld}\n\n",
                     why, (long long)oldest, (long long)newest);
    }
    if (rc == 0)
        rc = store_events_read(s, cursor, newest, &st->f, LIVE_PAGE, page_add, p, &n);
    pthread_mutex_lock(&h->mu);
    if (rc) {
        /* Give up on this stream; the client reconnects with its last id. */
        st->failed = true;
    } else {
        bool complete = n < LIVE_PAGE;
        st->checked_window = true;
        if (reset[0])
            buf_append(st, reset, strlen(reset));
        st->cursor = cursor;
        for (int i = 0; i < p->n; i++) {
            if (!p->v[i].msg || p->v[i].id <= st->cursor)
                continue;
            if (!buf_append(st, p->v[i].msg, p->v[i].len)) {
                complete = false; /* the rest on the next call */
                break;
            }
            st->cursor = p->v[i].id;
        }
        /* A complete page scanned everything up to NEWEST. */
        if (complete && newest > st->cursor)
            st->cursor = newest;
        if (complete && st->cursor >= h->last_id)
            st->replaying = false;
    }
    pthread_mutex_unlock(&h->mu);
    if (rc)
        log_warn("events_replay_failed", "rc=%d", rc);
    if (p)
        page_clear(p);
    free(p);
}

static ssize_t stream_read(void *cls, uint64_t pos, char *out, size_t max)
{
    struct live_stream *st = cls;
    struct live_hub *h = g_hub;
    (void)pos;
    for (int round = 0; round < 8; round++) {
        pthread_mutex_lock(&h->mu);
        if (st->len > st->off) {
            size_t n = st->len - st->off < max ? st->len - st->off : max;
            memcpy(out, st->buf + st->off, n);
            st->off += n;
            if (st->off == st->len)
                st->off = st->len = 0;
            st->next_hb = mono_ms() + (int64_t)st->cfg->event_heartbeat_s * 1000;
            pthread_mutex_unlock(&h->mu);
            return (ssize_t)n;
        }
        if (h->closing || st->failed) {
            pthread_mutex_unlock(&h->mu);
            return MHD_CONTENT_READER_END_OF_STREAM;
        }
        if (st->hb_due) {
            st->hb_due = false;
            buf_append(st, ": hb\n\n", 6);
            pthread_mutex_unlock(&h->mu);
            continue;
        }
        if (st->replaying) {
            pthread_mutex_unlock(&h->mu);
            stream_replay(st);
            continue;
        }
        st->suspended = true;
        pthread_mutex_unlock(&h->mu);
        MHD_suspend_connection(st->conn);
        return 0;
    }
    /* Still catching up after several pages: let MHD call again. */
    return 0;
}

static void stream_free(void *cls)
{
    struct live_stream *st = cls;
    struct live_hub *h = g_hub;
    if (h) {
        pthread_mutex_lock(&h->mu);
        if (st->prev)
            st->prev->next = st->next;
        else
            h->streams = st->next;
        if (st->next)
            st->next->prev = st->prev;
        h->nstreams--;
        publish_gauges(h);
        pthread_mutex_unlock(&h->mu);
    }
    free(st->buf);
    free(st);
}

/* Last-Event-ID: decimal digits only. */
static bool parse_event_id(const char *s, int64_t *out)
{
    int64_t v = 0;
    size_t n = 0;
    for (; s[n]; n++) {
        if (s[n] < '0' || s[n] > '9' || n >= 18)
            return false;
        v = v * 10 + (s[n] - '0');
    }
    if (n == 0)
        return false;
    *out = v;
    return true;
}

enum MHD_Result api_events(struct api_req *r)
{
    struct live_hub *h = g_hub;
    const char *job = api_query(r, "job"), *project = api_query(r, "project"),
               *branch = api_query(r, "branch");
    const char *leid = api_header(r, "Last-Event-ID");
    const char *leid_field = "Last-Event-ID";
    int64_t last = -1;
    if (!leid) {
        leid = api_query(r, "last_event_id");
        leid_field = "last_event_id";
    }
    if (job && !api_valid_name(job, 15))
        return api_error(r, 400, "invalid_query", "job", "job must be a job id");
    if (project && !api_valid_name(project, 128))
        return api_error(r, 400, "invalid_query", "project",
                         "project must match ^[A-Za-z0-9._-]{1,128}$");
    if (branch && !api_valid_text(branch, 255))
        return api_error(r, 400, "invalid_query", "branch",
                         "branch must be 1 to 255 printable characters");
    if (leid && !parse_event_id(leid, &last))
        return api_error(r, 400, "invalid_field", leid_field,
                         "%s must be an event id this server sent (decimal digits)", leid_field);
    if (!h)
        return api_error(r, 503, "unavailable", NULL, "the event stream is not running");
    struct live_stream *st = calloc(1, sizeof *st);
    if (!st)
        return api_error(r, 500, "internal", NULL, "out of memory");
    st->conn = r->conn;
    st->cfg = api_cfg(r);
    if (job) {
        snprintf(st->job, sizeof st->job, "%s", job);
        st->f.job = st->job;
    }
    if (project) {
        snprintf(st->project, sizeof st->project, "%s", project);
        st->f.project = st->project;
    }
    if (branch) {
        snprintf(st->branch, sizeof st->branch, "%s", branch);
        st->f.branch = st->branch;
    }
    static const char hello[] = "retry: 3000\n: capd event stream\n\n";
    if (!buf_append(st, hello, sizeof hello - 1)) {
        free(st);
        return api_error(r, 500, "internal", NULL, "out of memory");
    }
    pthread_mutex_lock(&h->mu);
    bool closing = h->closing;
    bool full = h->nstreams >= (unsigned)api_cfg(r)->max_event_streams;
    if (!closing && !full) {
        /* Without Last-Event-ID the stream starts now; with it, the reader
         * first replays what the client missed. */
        st->cursor = last >= 0 ? last : h->last_id;
        st->replaying = last >= 0;
        st->checked_window = last < 0;
        /* The first heartbeat comes after half to one interval. */
        int64_t hb_ms = (int64_t)api_cfg(r)->event_heartbeat_s * 1000;
        st->next_hb = mono_ms() + hb_ms / 2 + (int64_t)(h->stream_seq++ * 7919u) % (hb_ms / 2 + 1);
        st->next = h->streams;
        if (h->streams)
            h->streams->prev = st;
        h->streams = st;
        h->nstreams++;
        publish_gauges(h);
        pthread_cond_signal(&h->cv); /* the hub schedules its heartbeat */
    }
    pthread_mutex_unlock(&h->mu);
    if (closing || full) {
        free(st->buf);
        free(st);
        if (closing)
            return api_error(r, 503, "shutting_down", NULL, "the server is shutting down");
        api_reply_header(r, "Retry-After", "10");
        return api_error(r, 503, "too_many_streams", NULL,
                         "%d event streams are open (max_event_streams); retry later",
                         api_cfg(r)->max_event_streams);
    }
    /* From here the stream belongs to the response: stream_free unlists it. */
    struct MHD_Response *resp = MHD_create_response_from_callback(MHD_SIZE_UNKNOWN, LIVE_BLOCK,
                                                                  stream_read, st, stream_free);
    if (!resp) {
        stream_free(st);
        return MHD_NO;
    }
    MHD_add_response_header(resp, "Content-Type", "text/event-stream; charset=utf-8");
    MHD_add_response_header(resp, "Cache-Control", "no-cache");
    MHD_add_response_header(resp, "X-Accel-Buffering", "no");
    r->status = 200;
    enum MHD_Result ret = MHD_queue_response(r->conn, 200, resp);
    MHD_destroy_response(resp);
    return ret;
}

/* ---- GET /v1/jobs/{id}: ETag, 304, long-poll, rendered-body cache ---- */

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
    struct live_hub *h = g_hub;
    if (!h)
        return 0;
    pthread_mutex_lock(&h->mu);
    int64_t v = h->last_id;
    pthread_mutex_unlock(&h->mu);
    return v;
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
bool api_jobs_get_live(struct api_req *r, enum MHD_Result *ret)
{
    struct live_hub *h = g_hub;
    struct live_waiter *w = r->poll;
    const char *id = r->seg[2];
    struct store *s = api_store(r);
    int wait_s = 0;
    if (!s)
        return false;
    if (!w) {
        const char *ws = api_query(r, "wait");
        if (ws) {
            char *end;
            long v = strtol(ws, &end, 10);
            if (*end || end == ws || v < 0 || v > LIVE_MAX_WAIT_S) {
                *ret = api_error(r, 400, "invalid_query", "wait",
                                 "wait must be an integer number of seconds in [0, %d]",
                                 LIVE_MAX_WAIT_S);
                return true;
            }
            wait_s = (int)v;
        }
    }
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
            if (!(w = calloc(1, sizeof *w))) {
                *ret = api_error(r, 500, "internal", NULL, "out of memory");
                return true;
            }
            w->conn = r->conn;
            snprintf(w->job, sizeof w->job, "%s", id);
            w->has_inm = inm != NULL;
            snprintf(w->baseline, sizeof w->baseline, "%s", inm ? inm : r->etag);
            w->deadline = mono_ms() + (int64_t)wait_s * 1000;
            r->poll = w;
        }
        bool unchanged = w->has_inm ? api_if_none_match(r) : strcmp(w->baseline, r->etag) == 0;
        if (!unchanged) {
            *ret = reply_job(r, s, id, version);
            return true;
        }
        if (finished || w->timed_out || mono_ms() >= w->deadline) {
            *ret = w->has_inm ? api_not_modified(r) : reply_job(r, s, id, version);
            return true;
        }
        w->fired = false;
        pthread_mutex_lock(&h->mu);
        if (h->closing) {
            pthread_mutex_unlock(&h->mu);
            *ret = w->has_inm ? api_not_modified(r) : reply_job(r, s, id, version);
            return true;
        }
        if (h->last_id != seen) {
            /* An event was fanned out after the version was read: it may
             * have been this job's, so look again instead of sleeping. */
            pthread_mutex_unlock(&h->mu);
            continue;
        }
        w->listed = true;
        w->prev = NULL;
        w->next = h->waiters;
        if (h->waiters)
            h->waiters->prev = w;
        h->waiters = w;
        h->nwaiters++;
        publish_gauges(h);
        pthread_cond_signal(&h->cv); /* the hub recomputes its next deadline */
        pthread_mutex_unlock(&h->mu);
        MHD_suspend_connection(r->conn);
        *ret = MHD_YES;
        return true;
    }
    *ret = reply_job(r, s, id, version);
    return true;
}

void api_live_request_done(struct api_req *r)
{
    struct live_waiter *w = r->poll;
    struct live_hub *h = g_hub;
    if (!w)
        return;
    if (h && w->listed) {
        pthread_mutex_lock(&h->mu);
        unlist_waiter(h, w);
        publish_gauges(h);
        pthread_mutex_unlock(&h->mu);
    }
    free(w);
    r->poll = NULL;
}
