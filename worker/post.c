/*
 * worker/post.c - the requests of a running attempt (run_int.h): a
 * stream's chunks and the finish, and what capd's answers make of the
 * streams' windows (worker_chunk_ack).
 */
#include <errno.h>
#include <inttypes.h>
#include <jansson.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>

#include "util/clock.h"
#include "worker/run_int.h"

/* A 410: capd ended the attempt (a protocol error, its timeout, a cancel,
 * a restart), so the worker stops. */
static int ended(const struct run *r, const char *method, const char *path,
                 const struct worker_reply *rep)
{
    char state[64];
    worker_reply_string(rep, "state", state, sizeof state);
    worker_say("%s %s%s: HTTP 410: capd ended attempt %lld (state %s)%s%s", method,
               worker_http_base(r->c), path, r->o->attempt, state[0] ? state : "unknown",
               rep->error[0] ? ": " : "", rep->error);
    return -1;
}

/* Books a try of S that failed or made no progress: another after the
 * backoff, or -1 once --retries are spent. */
static int retry_later(struct run *r, struct run_stream *s, const char *path,
                       const struct worker_reply *rep)
{
    s->fails++;
    if (s->fails > r->o->retries) {
        worker_request_failed(r->c, "POST", path, rep, s->fails);
        return -1;
    }
    int ms = worker_backoff_ms(s->fails);
    s->retry_ms = util_mono_ms() + ms;
    if (!r->o->quiet && rep->status)
        worker_say("POST %s%s: HTTP %ld%s; trying again in %d ms", worker_http_base(r->c), path,
                   rep->status, rep->status < 500 ? " moved nothing on" : "", ms);
    else if (!r->o->quiet)
        worker_say("POST %s%s: %s; trying again in %d ms", worker_http_base(r->c), path, rep->why,
                   ms);
    return 0;
}

/* Moves S's window to RECEIVED, which capd named in answer to PATH. */
static int book_received(struct run *r, struct run_stream *s, const char *path, uint64_t received,
                         size_t *drop)
{
    switch (worker_chunk_ack(&s->w, received, drop)) {
    case WORKER_ACK_OK:
        ubuf_shift(&s->buf, *drop);
        return 0;
    case WORKER_ACK_BEHIND:
        worker_say("POST %s%s: capd holds %" PRIu64
                   " bytes of the %s stream, fewer than the %" PRIu64 " it acknowledged",
                   worker_http_base(r->c), path, received, s->name, s->w.acked);
        return -1;
    case WORKER_ACK_AHEAD:
        worker_say("POST %s%s: capd says it holds %" PRIu64 " bytes of the %s stream, more than "
                   "the %" PRIu64 " the runner wrote",
                   worker_http_base(r->c), path, received, s->name, s->total);
        return -1;
    }
    return -1;
}

static int book_answer(struct run *r, struct run_stream *s, const char *path,
                       const struct worker_reply *rep)
{
    uint64_t received;
    size_t drop = 0;
    if (worker_reply_retryable(rep))
        return retry_later(r, s, path, rep);
    if (rep->status == 410)
        return ended(r, "POST", path, rep);
    if (rep->status != 200 && rep->status != 409) {
        worker_request_failed(r->c, "POST", path, rep, s->fails + 1);
        return -1;
    }
    if (worker_reply_count(rep, "received", &received) != 0) {
        worker_say("POST %s%s: HTTP %ld without a \"received\" count", worker_http_base(r->c), path,
                   rep->status);
        return -1;
    }
    if (book_received(r, s, path, received, &drop) != 0)
        return -1;
    /* A 409 resumes from what capd names; an answer that moves nothing on
     * counts as a failed try, so it cannot go round for ever. */
    if (drop == 0 && s->w.buffered > 0)
        return retry_later(r, s, path, rep);
    s->fails = 0;
    s->retry_ms = 0;
    return 0;
}

int run__post_due(struct run *r, struct run_stream *s, int64_t now)
{
    struct worker_chunk ch;
    struct worker_reply rep;
    char path[160];
    if (s->retry_ms && now < s->retry_ms)
        return 0;
    if (!worker_chunk_next(&s->w, r->chunk, now - s->last_post_ms >= WORKER_POST_MS, s->fd < 0,
                           &ch))
        return 0;
    snprintf(path, sizeof path, "/v1/attempts/%lld/%s?offset=%" PRIu64, r->o->attempt, s->name,
             ch.offset);
    if (worker_http_request(r->c, "POST", path, "application/octet-stream", s->buf.p, ch.len,
                            &rep) != 0) {
        worker_say("POST %s%s: out of memory", worker_http_base(r->c), path);
        return -1;
    }
    s->last_post_ms = util_mono_ms();
    int rc = book_answer(r, s, path, &rep);
    worker_reply_free(&rep);
    return rc;
}

/* The finish's body: how the runner ended and what it wrote. */
static char *finish_body(const struct run *r)
{
    int st = r->status;
    json_t *exit_status = WIFEXITED(st) ? json_integer(WEXITSTATUS(st)) : json_null();
    json_t *sig = WIFSIGNALED(st) ? json_integer(WTERMSIG(st)) : json_null();
    long long cpu_ms = ((long long)r->ru.ru_utime.tv_sec + r->ru.ru_stime.tv_sec) * 1000 +
                       ((long long)r->ru.ru_utime.tv_usec + r->ru.ru_stime.tv_usec) / 1000;
    /* the group's peak where the watchdog sampled one, never below the
     * runner's own */
    int64_t peak = (int64_t)r->ru.ru_maxrss * 1024;
    if (r->mem_peak > peak)
        peak = r->mem_peak;
    json_t *b = json_pack("{s:o,s:o,s:I,s:I,s:I,s:I,s:o,s:b,s:b}", "exit_status", exit_status,
                          "signal", sig, "frames_bytes", (json_int_t)r->s[RUN_FRAMES].total,
                          "log_bytes", (json_int_t)r->s[RUN_LOG].total, "peak_rss_bytes",
                          (json_int_t)peak, "cpu_time_ms", (json_int_t)cpu_ms, "worker_signal",
                          r->stopped_by ? json_integer(r->stopped_by) : json_null(),
                          "worker_timeout", r->timed_out, "worker_oom", r->oom);
    char *text = b ? json_dumps(b, JSON_COMPACT) : NULL;
    json_decref(b);
    return text;
}

/* A 409 to the finish: capd lacks bytes. Those it lacks were acknowledged
 * and dropped, unless its counts are the worker's own (it is still
 * storing them): then 1, try again. */
static int finish_conflict(const struct run *r, const char *path, const struct worker_reply *rep)
{
    uint64_t f = 0, l = 0;
    if (worker_reply_count(rep, "frames_received", &f) == 0 &&
        worker_reply_count(rep, "log_received", &l) == 0 && f == r->s[RUN_FRAMES].total &&
        l == r->s[RUN_LOG].total)
        return 1;
    worker_say("POST %s%s: HTTP 409: capd holds %" PRIu64 " frame bytes and %" PRIu64
               " log bytes of the %" PRIu64 " and %" PRIu64 " it acknowledged%s%s",
               worker_http_base(r->c), path, f, l, r->s[RUN_FRAMES].total, r->s[RUN_LOG].total,
               rep->error[0] ? ": " : "", rep->error);
    return -1;
}

/* What the runner's end was, for a person reading the worker's stderr. */
static void say_finished(const struct run *r, const struct worker_reply *rep)
{
    char state[64];
    if (r->o->quiet)
        return;
    worker_reply_string(rep, "state", state, sizeof state);
    if (WIFSIGNALED(r->status))
        worker_say("attempt %lld: the runner was killed by signal %d; capd says %s", r->o->attempt,
                   WTERMSIG(r->status), state[0] ? state : "nothing");
    else
        worker_say("attempt %lld: the runner exited %d; capd says %s", r->o->attempt,
                   WEXITSTATUS(r->status), state[0] ? state : "nothing");
}

int run__finish(struct run *r)
{
    char path[96];
    struct worker_reply rep;
    int rc = -1, tries = 0, conflicts = 0;
    char *body = finish_body(r);
    if (!body) {
        worker_say("out of memory");
        return -1;
    }
    snprintf(path, sizeof path, "/v1/attempts/%lld/finish", r->o->attempt);
    for (;;) {
        if (worker_http_retry(r->c, "POST", path, "application/json", body, strlen(body),
                              r->o->retries, r->o->quiet, &rep, &tries) != 0) {
            worker_say("POST %s%s: out of memory", worker_http_base(r->c), path);
            free(body);
            return -1;
        }
        if (rep.status != 409 || finish_conflict(r, path, &rep) < 0 || ++conflicts > r->o->retries)
            break;
        worker_reply_free(&rep);
        poll(NULL, 0, worker_backoff_ms(conflicts));
    }
    if (rep.status == 200) {
        say_finished(r, &rep);
        rc = 0;
    } else if (rep.status == 410) {
        ended(r, "POST", path, &rep);
    } else if (rep.status != 409) {
        worker_request_failed(r->c, "POST", path, &rep, tries);
    } else if (conflicts > r->o->retries) {
        worker_request_failed(r->c, "POST", path, &rep, conflicts);
    }
    worker_reply_free(&rep);
    free(body);
    return rc;
}
