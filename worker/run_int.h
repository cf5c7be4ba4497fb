/*
 * worker/run_int.h - what run.c (the runner and the loop) and post.c (the
 * requests of a running attempt) share; internal to worker/.
 */
#ifndef CAPD_WORKER_RUN_INT_H
#define CAPD_WORKER_RUN_INT_H

#include <stdbool.h>
#include <stdint.h>
#include <sys/resource.h>
#include <sys/types.h>

#include "util/buf.h"
#include "worker/worker.h"

enum { RUN_FRAMES, RUN_LOG };

/* One output of the runner and how far capd holds it. */
struct run_stream {
    const char *name; /* "frames" or "log": the endpoint's last word */
    int fd;           /* the pipe's read end; -1 once at EOF */
    struct ubuf buf;  /* the W.buffered bytes from stream offset W.acked on */
    struct worker_window w;
    uint64_t total;                 /* bytes read from the pipe */
    int64_t last_post_ms, retry_ms; /* retry_ms: no POST before it (0: none waits) */
    int fails;                      /* tries in a row that failed */
};

struct run {
    struct worker_http *c;
    const struct worker_opts *o;
    const struct worker_spec *spec;
    size_t chunk; /* the largest POST body: --chunk, or capd's chunk_max_bytes */
    struct run_stream s[2];
    pid_t pid;
    int sfd; /* the signalfd */
    int64_t started_ms, kill_ms, reaped_ms;
    bool reaped;
    /* Why the worker stopped the runner itself: the first signal it got
     * from outside (0: none), or the attempt's timeout. */
    int stopped_by;
    bool timed_out;
    /* The memory watchdog: the last sample's time, the highest sum seen,
     * and whether it killed the group for passing spec->memory_max_bytes. */
    int64_t mem_ms, mem_peak;
    bool oom;
    int status;
    struct rusage ru;
};

/* POSTs the next chunk of S when one is due at NOW (worker_chunk_next)
 * and no retry waits, and books capd's answer. 0 to go on, -1 when the
 * worker must give up (said on stderr). */
int run__post_due(struct run *r, struct run_stream *s, int64_t now);

/* POSTs the finish once capd holds every byte of both streams: 0 when
 * capd accepted it, -1 when the worker must give up (said on stderr). A
 * 409 naming the counts the worker sent is capd still storing them: the
 * finish is tried again after a backoff, like a connection error. */
int run__finish(struct run *r);

#endif
