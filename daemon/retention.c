/*
 * daemon/retention.c - runs the retention policy (store_prune) every
 * retention_interval_s seconds inside capd.
 *
 * A run can take a while on a big database, so it goes to the libuv
 * thread pool with its own SQLite connection, opened and closed on that
 * thread (no connection is ever shared between threads). store_prune works
 * in short write transactions, so the ingest writer on the loop thread
 * waits at most one of them. The handles are unreferenced: retention never
 * keeps capd alive, and it closes itself when capd is told to stop.
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "util/log.h"
#include "daemon/retention.h"
#include "util/clock.h"

/* The first run comes soon after start-up even with a long interval, so a
 * daemon restarted more often than the interval still prunes. */
#define RETENTION_FIRST_RUN_MAX_S 60

struct retention {
    uv_loop_t *loop;
    uv_timer_t timer;
    uv_signal_t sigterm, sigint;
    uv_work_t work;
    char data_dir[512];
    int keep;
    int stop_flag; /* read by the worker between transactions */
    bool busy;     /* a run is in flight on the thread pool */
    bool stopped;
    int open_handles;
    unsigned runs;
    /* Written by the worker, read in the after-work callback. */
    int run_rc;
    int64_t run_ms;
    char run_err[256];
    struct store_prune_report cur, last;
};

static void maybe_free(struct retention *r)
{
    if (r->stopped && r->open_handles == 0 && !r->busy)
        free(r);
}

static void on_closed(uv_handle_t *h)
{
    struct retention *r = h->data;
    r->open_handles--;
    maybe_free(r);
}

static void work_cb(uv_work_t *w)
{
    struct retention *r = w->data;
    struct store *s = NULL;
    char *err = NULL;
    struct store_prune_opts o = {.keep_heads_per_branch = r->keep, .stop = &r->stop_flag};
    int64_t t0 = util_wall_ms();
    r->run_err[0] = 0;
    r->run_rc = store_open(r->data_dir, false, &s, &err);
    if (r->run_rc == 0) {
        r->run_rc = store_prune(s, &o, &r->cur);
        if (r->run_rc)
            snprintf(r->run_err, sizeof r->run_err, "%s",
                     r->cur.error[0] ? r->cur.error : store_errmsg(s));
    } else {
        snprintf(r->run_err, sizeof r->run_err, "%s", err ? err : "cannot open the database");
    }
    store_close(s);
    free(err);
    r->run_ms = util_wall_ms() - t0;
}

static void after_cb(uv_work_t *w, int status)
{
    struct retention *r = w->data;
    r->busy = false;
    if (status == 0 && r->run_rc == 0) {
        r->runs++;
        r->last = r->cur;
        log_info("retention",
                 "jobs=%lld kept=%lld pruned_jobs=%lld records_detached=%lld "
                 "blobs_deleted=%lld bytes_freed=%lld logs_deleted=%lld log_bytes_freed=%lld "
                 "replays_deleted=%lld replay_bytes_freed=%lld duration_ms=%lld",
                 (long long)r->cur.jobs, (long long)r->cur.jobs_kept, (long long)r->cur.jobs_pruned,
                 (long long)r->cur.records_detached, (long long)r->cur.blobs_deleted,
                 (long long)r->cur.bytes_freed, (long long)r->cur.logs_deleted,
                 (long long)r->cur.log_bytes_freed, (long long)r->cur.replays_deleted,
                 (long long)r->cur.replay_bytes_freed, (long long)r->run_ms);
    } else if (status == 0 && r->run_rc == -ECANCELED) {
        log_info("retention_stopped", "pruned_jobs=%lld", (long long)r->cur.jobs_pruned);
    } else if (status == 0) {
        log_error("retention_failed", "rc=%d err=%s", r->run_rc, log_q(r->run_err));
    }
    maybe_free(r);
}

static void on_timer(uv_timer_t *t)
{
    struct retention *r = t->data;
    if (r->busy || r->stopped)
        return;
    r->busy = true;
    r->work.data = r;
    if (uv_queue_work(r->loop, &r->work, work_cb, after_cb) != 0) {
        r->busy = false;
        log_error("retention_failed", "err=%s", log_q("cannot queue the run"));
    }
}

static void on_signal(uv_signal_t *h, int signum)
{
    (void)signum;
    retention_stop(h->data);
}

int retention_start(uv_loop_t *loop, const struct capd_config *cfg, struct retention **out)
{
    if (out)
        *out = NULL;
    if (cfg->retention_interval_s <= 0)
        return 0;
    if (cfg->retention_keep_heads_per_branch <= 0) {
        log_warn("retention_off", "reason=%s",
                 log_q("retention_interval_s is set but retention_keep_heads_per_branch is 0 "
                       "(keep everything)"));
        return 0;
    }
    struct retention *r = calloc(1, sizeof *r);
    if (!r)
        return -ENOMEM;
    r->loop = loop;
    r->keep = cfg->retention_keep_heads_per_branch;
    snprintf(r->data_dir, sizeof r->data_dir, "%s", cfg->data_dir);
    uv_timer_init(loop, &r->timer);
    uv_signal_init(loop, &r->sigterm);
    uv_signal_init(loop, &r->sigint);
    r->timer.data = r->sigterm.data = r->sigint.data = r;
    r->open_handles = 3;
    uint64_t every = (uint64_t)cfg->retention_interval_s * 1000;
    uint64_t first = cfg->retention_interval_s < RETENTION_FIRST_RUN_MAX_S
                         ? every
                         : (uint64_t)RETENTION_FIRST_RUN_MAX_S * 1000;
    uv_timer_start(&r->timer, on_timer, first, every);
    uv_signal_start(&r->sigterm, on_signal, SIGTERM);
    uv_signal_start(&r->sigint, on_signal, SIGINT);
    uv_unref((uv_handle_t *)&r->timer);
    uv_unref((uv_handle_t *)&r->sigterm);
    uv_unref((uv_handle_t *)&r->sigint);
    log_info("retention_on", "keep_heads_per_branch=%d interval_s=%d", r->keep,
             cfg->retention_interval_s);
    if (out)
        *out = r;
    return 0;
}

void retention_stop(struct retention *r)
{
    if (!r || r->stopped)
        return;
    r->stopped = true;
    __atomic_store_n(&r->stop_flag, 1, __ATOMIC_RELAXED);
    if (r->busy)
        uv_cancel((uv_req_t *)&r->work); /* fails harmlessly once it runs */
    uv_close((uv_handle_t *)&r->timer, on_closed);
    uv_close((uv_handle_t *)&r->sigterm, on_closed);
    uv_close((uv_handle_t *)&r->sigint, on_closed);
}

unsigned retention_runs(const struct retention *r, struct store_prune_report *last)
{
    if (last)
        *last = r->last;
    return r->runs;
}
