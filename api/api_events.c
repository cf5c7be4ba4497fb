/*
 * api/api_events.c - GET /v1/events: a Server-Sent Events stream of job
 * and cell changes, filtered by job, project or branch, resumable with
 * Last-Event-ID. The hub (api/api_live.c) fills a stream's buffer; its
 * content reader here sends it, queues heartbeats, and catches up from
 * SQLite itself when the stream fell behind or the client resumes (the
 * whole mechanism is described in api/live_int.h).
 */
#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "api/live_int.h"
#include "util/clock.h"
#include "util/log.h"

#define LIVE_BLOCK 16384 /* MHD block size of a stream */

/* Reads the next page of a stream that is catching up, on the worker thread
 * that serves it (with that thread's own connection). */
static void stream_replay(struct live_stream *st)
{
    struct live_hub *h = api__live_hub;
    struct store *s = api_thread_store(st->cfg);
    struct live_page *p = calloc(1, sizeof *p);
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
        rc = store_events_read(s, cursor, newest, &st->f, LIVE_PAGE, api__live_page_add, p, &n);
    pthread_mutex_lock(&h->mu);
    if (rc) {
        /* Give up on this stream; the client reconnects with its last id. */
        st->failed = true;
    } else {
        bool complete = n < LIVE_PAGE;
        st->checked_window = true;
        if (reset[0])
            api__live_buf_append(st, reset, strlen(reset));
        st->cursor = cursor;
        for (int i = 0; i < p->n; i++) {
            if (!p->v[i].msg || p->v[i].id <= st->cursor)
                continue;
            if (!api__live_buf_append(st, p->v[i].msg, p->v[i].len)) {
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
        api__live_page_clear(p);
    free(p);
}

static ssize_t stream_read(void *cls, uint64_t pos, char *out, size_t max)
{
    struct live_stream *st = cls;
    struct live_hub *h = api__live_hub;
    (void)pos;
    for (int round = 0; round < 8; round++) {
        pthread_mutex_lock(&h->mu);
        if (st->buf.len > st->off) {
            size_t n = st->buf.len - st->off < max ? st->buf.len - st->off : max;
            memcpy(out, st->buf.p + st->off, n);
            st->off += n;
            if (st->off == st->buf.len) {
                ubuf_reset(&st->buf);
                st->off = 0;
            }
            st->next_hb = util_mono_ms() + (int64_t)st->cfg->event_heartbeat_s * 1000;
            pthread_mutex_unlock(&h->mu);
            return (ssize_t)n;
        }
        if (h->closing || st->failed) {
            pthread_mutex_unlock(&h->mu);
            return MHD_CONTENT_READER_END_OF_STREAM;
        }
        if (st->hb_due) {
            st->hb_due = false;
            api__live_buf_append(st, ": hb\n\n", 6);
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
    struct live_hub *h = api__live_hub;
    if (h) {
        pthread_mutex_lock(&h->mu);
        LIVE_UNLINK(h->streams, st);
        h->nstreams--;
        api__live_gauges(h);
        pthread_mutex_unlock(&h->mu);
    }
    ubuf_free(&st->buf);
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

/* The filters and the resume point of GET /v1/events. */
struct events_query {
    const char *job, *project, *branch;
    int64_t last; /* Last-Event-ID (header or query); -1: none */
};

/* Reads and checks the query and Last-Event-ID; false, having replied 400,
 * when one is malformed. */
static bool events_query(struct api_req *r, struct events_query *q, enum MHD_Result *ret)
{
    q->job = api_query(r, "job");
    q->project = api_query(r, "project");
    q->branch = api_query(r, "branch");
    q->last = -1;
    const char *leid = api_header(r, "Last-Event-ID");
    const char *leid_field = "Last-Event-ID";
    if (!leid) {
        leid = api_query(r, "last_event_id");
        leid_field = "last_event_id";
    }
    if (q->job && !api_valid_name(q->job, 15)) {
        *ret = api_error(r, 400, "invalid_query", "job", "job must be a job id");
        return false;
    }
    if (q->project && !api_valid_name(q->project, 128)) {
        *ret = api_error(r, 400, "invalid_query", "project",
                         "project must match ^[A-Za-z0-9._-]{1,128}$");
        return false;
    }
    if (q->branch && !api_valid_text(q->branch, 255)) {
        *ret = api_error(r, 400, "invalid_query", "branch",
                         "branch must be 1 to 255 printable characters");
        return false;
    }
    if (leid && !parse_event_id(leid, &q->last)) {
        *ret = api_error(r, 400, "invalid_field", leid_field,
                         "%s must be an event id this server sent (decimal digits)", leid_field);
        return false;
    }
    return true;
}

/* A new stream with the query's filters and the opening comment queued;
 * NULL when memory runs out. */
static struct live_stream *stream_new(struct api_req *r, const struct events_query *q)
{
    struct live_stream *st = calloc(1, sizeof *st);
    if (!st)
        return NULL;
    ubuf_init(&st->buf, LIVE_MAX_BUF);
    st->conn = r->conn;
    st->cfg = api_cfg(r);
    if (q->job) {
        snprintf(st->job, sizeof st->job, "%s", q->job);
        st->f.job = st->job;
    }
    if (q->project) {
        snprintf(st->project, sizeof st->project, "%s", q->project);
        st->f.project = st->project;
    }
    if (q->branch) {
        snprintf(st->branch, sizeof st->branch, "%s", q->branch);
        st->f.branch = st->branch;
    }
    static const char hello[] = "retry: 3000\n: capd event stream\n\n";
    if (!api__live_buf_append(st, hello, sizeof hello - 1)) {
        free(st);
        return NULL;
    }
    return st;
}

/*
 * Lists the stream with the hub, unless the server is closing (-ESHUTDOWN)
 * or max_event_streams are open (-EBUSY). Without Last-Event-ID the stream
 * starts now; with it, the reader first replays what the client missed.
 */
static int stream_register(struct live_hub *h, struct live_stream *st, int64_t last)
{
    int rc = 0;
    pthread_mutex_lock(&h->mu);
    if (h->closing) {
        rc = -ESHUTDOWN;
    } else if (h->nstreams >= (unsigned)st->cfg->max_event_streams) {
        rc = -EBUSY;
    } else {
        st->cursor = last >= 0 ? last : h->last_id;
        st->replaying = last >= 0;
        st->checked_window = last < 0;
        /* The first heartbeat comes after half to one interval. */
        int64_t hb_ms = (int64_t)st->cfg->event_heartbeat_s * 1000;
        st->next_hb =
            util_mono_ms() + hb_ms / 2 + (int64_t)(h->stream_seq++ * 7919u) % (hb_ms / 2 + 1);
        LIVE_PUSH(h->streams, st);
        h->nstreams++;
        api__live_gauges(h);
        pthread_cond_signal(&h->cv); /* the hub schedules its heartbeat */
    }
    pthread_mutex_unlock(&h->mu);
    return rc;
}

/* The 200 whose body is the stream; from here the stream belongs to the
 * response (stream_free unlists it). */
static enum MHD_Result stream_respond(struct api_req *r, struct live_stream *st)
{
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

enum MHD_Result api_events(struct api_req *r)
{
    struct live_hub *h = api__live_hub;
    struct events_query q;
    enum MHD_Result ret;
    if (!events_query(r, &q, &ret) || api__live_route_refused(r, &ret))
        return ret;
    if (!h)
        return api_error(r, 503, "unavailable", NULL, "the event stream is not running");
    struct live_stream *st = stream_new(r, &q);
    if (!st)
        return api_error(r, 500, "internal", NULL, "out of memory");
    int rc = stream_register(h, st, q.last);
    if (rc) {
        ubuf_free(&st->buf);
        free(st);
        if (rc == -ESHUTDOWN)
            return api_error(r, 503, "shutting_down", NULL, "the server is shutting down");
        api_reply_header(r, "Retry-After", "10");
        return api_error(r, 503, "too_many_streams", NULL,
                         "%d event streams are open (max_event_streams); retry later",
                         api_cfg(r)->max_event_streams);
    }
    return stream_respond(r, st);
}
