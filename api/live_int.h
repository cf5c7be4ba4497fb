/*
 * api/live_int.h - what the files of live updates share and nobody else
 * sees: the notifier thread (the "hub", api/api_live.c), the event streams
 * of GET /v1/events (api/api_events.c) and the long-polls of
 * GET /v1/jobs/{id}?wait=N (api/api_jobs_live.c), none of which holds a
 * thread while it waits. Internal names carry the api__ prefix.
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
 * A stream that falls behind (its buffer would pass LIVE_MAX_BUF, below)
 * stops taking events from the hub and catches up from
 * SQLite by itself, a page at a time, exactly as a reconnecting client
 * with Last-Event-ID does; a client whose Last-Event-ID has left the
 * replay window first gets a `reset` event telling it to reload.
 *
 * Races between suspending and resuming are benign by MHD's design: a
 * resume that arrives before the suspend it answers cancels that suspend
 * (the reader or handler simply runs again), and a connection that has
 * announced it will suspend (the `suspended` flag, set under the hub lock)
 * cannot be closed before it has been resumed. At shutdown every waiting
 * connection is resumed and told to finish, because MHD refuses to stop
 * with suspended connections.
 */
#ifndef CAPD_API_LIVE_INT_H
#define CAPD_API_LIVE_INT_H

#include <pthread.h>
#include <stdbool.h>
#include <stdint.h>

#include "api/api_int.h"

#define LIVE_MAX_BUF (64u << 10) /* queued bytes per stream before it catches up from SQLite */

#define LIVE_PAGE 200 /* events per SQLite read */

/* The hub's lists of streams and of waiters are doubly linked through
 * their prev and next members, HEAD naming the first: LIVE_PUSH puts IT
 * first, LIVE_UNLINK takes it out. Both run under the hub lock. */
#define LIVE_PUSH(head, it)                                                                        \
    do {                                                                                           \
        (it)->prev = NULL;                                                                         \
        (it)->next = (head);                                                                       \
        if (head)                                                                                  \
            (head)->prev = (it);                                                                   \
        (head) = (it);                                                                             \
    } while (0)

#define LIVE_UNLINK(head, it)                                                                      \
    do {                                                                                           \
        if ((it)->prev)                                                                            \
            (it)->prev->next = (it)->next;                                                         \
        else                                                                                       \
            (head) = (it)->next;                                                                   \
        if ((it)->next)                                                                            \
            (it)->next->prev = (it)->prev;                                                         \
        (it)->prev = (it)->next = NULL;                                                            \
    } while (0)

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
    int64_t next_hb; /* util_mono_ms(); pushed back whenever data goes out */
    bool failed;     /* SQLite could not be read: end, the client resumes */
    struct ubuf buf; /* at most LIVE_MAX_BUF bytes queued; buf.p + off is unsent */
    size_t off;
};

/* A long-poll of one job; lives in r->poll from its first call to the end
 * of the request, and in the hub's list only while suspended. */
struct live_waiter {
    struct live_waiter *prev, *next;
    struct MHD_Connection *conn;
    char job[16];
    char baseline[96]; /* If-None-Match as sent, or the ETag at the first call */
    bool has_inm;
    int64_t deadline; /* util_mono_ms() */
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

/* The hub; NULL unless api_live_start succeeded (and until api_live_free). */
extern struct live_hub *api__live_hub;

/* One event read from SQLite, formatted once as an SSE message (msg). */
struct live_ev {
    int64_t id;
    char job[16];
    char *project, *branch, *msg;
    size_t len;
};

/* A page of events: what one store_events_read call collects. */
struct live_page {
    struct live_ev v[LIVE_PAGE];
    int n;
};

/* Publishes the numbers of streams and long-polls (the hub lock held). */
void api__live_gauges(struct live_hub *h);
/* Appends to a stream's buffer; false when that would pass its maximum or
 * memory runs out (the stream then catches up from SQLite). */
bool api__live_buf_append(struct live_stream *st, const char *p, size_t n);
/* store_events_read's callback: adds one event to the struct live_page UD. */
int api__live_page_add(void *ud, int64_t id, const char *type, const char *job, const char *project,
                       const char *branch, const char *data);
void api__live_page_clear(struct live_page *p);
/* Takes a long-poll off the hub's list (the hub lock held; idempotent). */
void api__live_unlist_waiter(struct live_hub *h, struct live_waiter *w);
/* Whether R may not wait: only a route the table marks live may hold its
 * connection (api_route_live). Another is capd's bug, answered 500 (true,
 * having replied); false to go on. */
bool api__live_route_refused(struct api_req *r, enum MHD_Result *ret);

#endif
