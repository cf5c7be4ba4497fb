/*
 * daemon/executors/remote.c - the table of remote attempts and their spool files
 * (daemon/executors/remote.h). The API writes, the loop reads. `mu` guards the table
 * and each attempt's `lk` its fields, so uploads of different attempts
 * write at once; the order is mu, then lk (an API call takes lk before it
 * lets mu go, and remote_close takes lk after taking the attempt out of
 * the table, so no call still holds it when it is freed).
 *
 * The worker's finish is kept in the spool dir too (finish.json, written
 * before the API answers): a capd killed after that answer and before the
 * loop stored the outcome finds it when it takes the attempt up again.
 */
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "daemon/executors/remote.h"
#include "util/path.h"

static const char *const spool_names[REMOTE_STREAMS] = {"frames.spool", "log.spool"};
#define FINISH_NAME "finish.json"

struct remote_att {
    struct remote_att *next;
    int64_t id;
    int fd[REMOTE_STREAMS];
    uint64_t received[REMOTE_STREAMS]; /* written by the API */
    uint64_t read_off[REMOTE_STREAMS]; /* read by the loop (loop only) */
    char path[REMOTE_STREAMS][UTIL_PATH_MAX], finish_path[UTIL_PATH_MAX];
    pthread_mutex_t lk;
    json_t *spec;
    uv_async_t *wake;
    bool started, finished, ended;
    struct remote_exit ex;
    char state[96]; /* how capd ended it, or "finished" */
};

static pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;
static struct remote_att *atts;

/* The attempt of ID under the lock, or NULL. */
static struct remote_att *find(int64_t id)
{
    for (struct remote_att *r = atts; r; r = r->next)
        if (r->id == id)
            return r;
    return NULL;
}

/* The attempt of ID with its lock held, or NULL (no lock held). */
static struct remote_att *lock_id(int64_t id)
{
    pthread_mutex_lock(&mu);
    struct remote_att *r = find(id);
    if (r)
        pthread_mutex_lock(&r->lk);
    pthread_mutex_unlock(&mu);
    return r;
}

/* The attempt of ID, locked, when it is held and open: 0 with its lock
 * held; -ENOENT or -ESTALE (STATE filled) with no lock held. */
static int lock_open(int64_t id, struct remote_att **out, char *state, size_t slen)
{
    struct remote_att *r = lock_id(id);
    if (!r)
        return -ENOENT;
    if (r->ended) {
        snprintf(state, slen, "%s", r->state);
        pthread_mutex_unlock(&r->lk);
        return -ESTALE;
    }
    *out = r;
    return 0;
}

static int write_at(int fd, const char *p, size_t n, uint64_t off)
{
    while (n > 0) {
        ssize_t w = pwrite(fd, p, n, (off_t)off);
        if (w < 0 && errno == EINTR)
            continue;
        if (w <= 0)
            return w < 0 ? -errno : -EIO;
        p += w;
        n -= (size_t)w;
        off += (uint64_t)w;
    }
    return 0;
}

int remote_append(int64_t attempt_id, enum remote_stream which, uint64_t offset, const void *data,
                  size_t n, uint64_t received[REMOTE_STREAMS], char *state, size_t slen)
{
    struct remote_att *r;
    if (which >= REMOTE_STREAMS)
        return -EINVAL;
    int rc = lock_open(attempt_id, &r, state, slen);
    if (rc)
        return rc;
    uint64_t have = r->received[which];
    if (offset > have) {
        rc = -ERANGE;
    } else if (offset + n > have) {
        size_t skip = (size_t)(have - offset), w = n - skip;
        /* the log keeps its first REMOTE_LOG_SPOOL_MAX bytes in the spool */
        if (which == REMOTE_LOG)
            w = have >= REMOTE_LOG_SPOOL_MAX      ? 0
                : w > REMOTE_LOG_SPOOL_MAX - have ? (size_t)(REMOTE_LOG_SPOOL_MAX - have)
                                                  : w;
        rc = w ? write_at(r->fd[which], (const char *)data + skip, w, have) : 0;
        if (rc == 0) {
            r->received[which] = offset + n;
            r->started = true; /* a worker that uploads has its spec */
            uv_async_send(r->wake);
        }
    }
    received[0] = r->received[0];
    received[1] = r->received[1];
    pthread_mutex_unlock(&r->lk);
    return rc;
}

int remote_spec(int64_t attempt_id, json_t **out, char *state, size_t slen)
{
    struct remote_att *r;
    int rc = lock_open(attempt_id, &r, state, slen);
    if (rc)
        return rc;
    *out = json_deep_copy(r->spec);
    if (*out) {
        json_object_set_new(*out, "frames_received", json_integer((json_int_t)r->received[0]));
        json_object_set_new(*out, "log_received", json_integer((json_int_t)r->received[1]));
    }
    if (*out && !r->started) {
        r->started = true;
        uv_async_send(r->wake);
    }
    pthread_mutex_unlock(&r->lk);
    return *out ? 0 : -ENOMEM;
}

/* The finish EX as FINISH_NAME, whole or not at all (a temporary file
 * renamed); 0 or -errno. */
static int finish_save(const struct remote_att *r, const struct remote_exit *ex)
{
    char tmp[UTIL_PATH_MAX + 8];
    snprintf(tmp, sizeof tmp, "%s.tmp", r->finish_path);
    json_t *j = json_pack(
        "{s:I,s:i,s:I,s:I,s:I,s:I,s:i,s:b,s:b}", "exit_status", (json_int_t)ex->exit_status,
        "signal", ex->signal, "peak_rss_bytes", (json_int_t)ex->peak_rss_bytes, "cpu_time_ms",
        (json_int_t)ex->cpu_time_ms, "frames_bytes", (json_int_t)ex->bytes[REMOTE_FRAMES],
        "log_bytes", (json_int_t)ex->bytes[REMOTE_LOG], "worker_signal", ex->worker_signal,
        "worker_timeout", ex->worker_timeout, "worker_oom", ex->worker_oom);
    int rc = j && json_dump_file(j, tmp, JSON_COMPACT) == 0 ? 0 : -EIO;
    json_decref(j);
    if (rc == 0 && rename(tmp, r->finish_path) != 0)
        rc = -errno;
    if (rc)
        unlink(tmp);
    return rc;
}

/* A finish an earlier capd answered for R (finish_save), taken as the
 * worker's: true when there is one whose byte counts R's spool holds. */
static bool finish_load(struct remote_att *r)
{
    json_t *j = json_load_file(r->finish_path, 0, NULL);
    if (!j)
        return false;
    struct remote_exit ex = {
        .exit_status = json_integer_value(json_object_get(j, "exit_status")),
        .signal = (int)json_integer_value(json_object_get(j, "signal")),
        .peak_rss_bytes = json_integer_value(json_object_get(j, "peak_rss_bytes")),
        .cpu_time_ms = json_integer_value(json_object_get(j, "cpu_time_ms")),
        .bytes = {(uint64_t)json_integer_value(json_object_get(j, "frames_bytes")),
                  (uint64_t)json_integer_value(json_object_get(j, "log_bytes"))},
        .worker_signal = (int)json_integer_value(json_object_get(j, "worker_signal")),
        .worker_timeout = json_is_true(json_object_get(j, "worker_timeout")),
        .worker_oom = json_is_true(json_object_get(j, "worker_oom")),
    };
    json_decref(j);
    if (ex.bytes[REMOTE_FRAMES] != r->received[REMOTE_FRAMES] ||
        ex.bytes[REMOTE_LOG] != r->received[REMOTE_LOG])
        return false;
    r->ex = ex;
    r->finished = r->ended = r->started = true;
    snprintf(r->state, sizeof r->state, "finished");
    return true;
}

int remote_finish(int64_t attempt_id, const struct remote_exit *ex,
                  uint64_t received[REMOTE_STREAMS], char *state, size_t slen)
{
    struct remote_att *r = lock_id(attempt_id);
    int rc = 0;
    if (!r) {
        rc = -ENOENT;
    } else if (r->finished) {
        rc = 0; /* the same finish again */
    } else if (r->ended) {
        snprintf(state, slen, "%s", r->state);
        rc = -ESTALE;
    } else if (ex->bytes[0] != r->received[0] || ex->bytes[1] != r->received[1]) {
        rc = -ERANGE;
    } else if ((rc = finish_save(r, ex)) == 0) {
        r->ex = *ex;
        r->finished = r->ended = r->started = true;
        snprintf(r->state, sizeof r->state, "finished");
        uv_async_send(r->wake);
    }
    if (r) {
        received[0] = r->received[0];
        received[1] = r->received[1];
        pthread_mutex_unlock(&r->lk);
    }
    return rc;
}

static int open_spool(int64_t attempt_id, const char *dir, json_t *spec, uv_async_t *wake,
                      bool keep, struct remote_att **out);

int remote_open(int64_t attempt_id, const char *dir, json_t *spec, uv_async_t *wake,
                struct remote_att **out)
{
    return open_spool(attempt_id, dir, spec, wake, false, out);
}

int remote_reopen(int64_t attempt_id, const char *dir, json_t *spec, uv_async_t *wake,
                  struct remote_att **out)
{
    return open_spool(attempt_id, dir, spec, wake, true, out);
}

static int open_spool(int64_t attempt_id, const char *dir, json_t *spec, uv_async_t *wake,
                      bool keep, struct remote_att **out)
{
    struct remote_att *r = calloc(1, sizeof *r);
    if (!r)
        return -ENOMEM;
    r->id = attempt_id;
    r->wake = wake;
    r->fd[0] = r->fd[1] = -1;
    int rc = util_path_join(r->finish_path, dir, FINISH_NAME);
    for (int i = 0; i < REMOTE_STREAMS && rc == 0; i++) {
        rc = util_path_join(r->path[i], dir, spool_names[i]);
        if (rc == 0 &&
            (r->fd[i] =
                 open(r->path[i], O_RDWR | O_CREAT | O_CLOEXEC | (keep ? 0 : O_TRUNC), 0600)) < 0)
            rc = -errno;
        off_t end = rc == 0 ? lseek(r->fd[i], 0, SEEK_END) : 0;
        r->received[i] = end > 0 ? (uint64_t)end : 0;
        r->started = r->started || r->received[i] > 0;
    }
    if (rc) {
        for (int i = 0; i < REMOTE_STREAMS; i++)
            if (r->fd[i] >= 0)
                close(r->fd[i]);
        free(r);
        return rc;
    }
    /* a finish answered before a restart: the loop's first read ends it */
    if (!keep)
        unlink(r->finish_path);
    else
        finish_load(r);
    pthread_mutex_init(&r->lk, NULL);
    r->spec = json_incref(spec);
    pthread_mutex_lock(&mu);
    r->next = atts;
    atts = r;
    pthread_mutex_unlock(&mu);
    *out = r;
    return 0;
}

uint64_t remote_log_dropped(struct remote_att *r)
{
    pthread_mutex_lock(&r->lk);
    uint64_t have = r->received[REMOTE_LOG];
    pthread_mutex_unlock(&r->lk);
    return have > REMOTE_LOG_SPOOL_MAX ? have - REMOTE_LOG_SPOOL_MAX : 0;
}

ssize_t remote_read(struct remote_att *r, enum remote_stream which, char *buf, size_t n)
{
    pthread_mutex_lock(&r->lk);
    uint64_t have = r->received[which];
    pthread_mutex_unlock(&r->lk);
    if (which == REMOTE_LOG && have > REMOTE_LOG_SPOOL_MAX)
        have = REMOTE_LOG_SPOOL_MAX; /* the rest was dropped */
    uint64_t off = r->read_off[which];
    if (off >= have)
        return 0;
    if (have - off < n)
        n = (size_t)(have - off);
    ssize_t got;
    do
        got = pread(r->fd[which], buf, n, (off_t)off);
    while (got < 0 && errno == EINTR);
    if (got < 0)
        return -errno;
    r->read_off[which] += (uint64_t)got;
    return got;
}

bool remote_started(struct remote_att *r)
{
    pthread_mutex_lock(&r->lk);
    bool s = r->started;
    pthread_mutex_unlock(&r->lk);
    return s;
}

bool remote_over(struct remote_att *r, bool *finished, struct remote_exit *ex, char *state,
                 size_t slen)
{
    pthread_mutex_lock(&r->lk);
    bool over = r->ended;
    snprintf(state, slen, "%s", r->state);
    *finished = r->finished;
    if (r->finished)
        *ex = r->ex;
    pthread_mutex_unlock(&r->lk);
    return over;
}

static void end_locked(struct remote_att *r, const char *state)
{
    if (r && !r->ended) {
        r->ended = true;
        snprintf(r->state, sizeof r->state, "%s", state);
        uv_async_send(r->wake);
    }
}

void remote_end(struct remote_att *r, const char *state)
{
    pthread_mutex_lock(&r->lk);
    end_locked(r, state);
    pthread_mutex_unlock(&r->lk);
}

void remote_end_id(int64_t attempt_id, const char *state)
{
    struct remote_att *r = lock_id(attempt_id);
    if (r) {
        end_locked(r, state);
        pthread_mutex_unlock(&r->lk);
    }
}

void remote_close(struct remote_att *r, bool keep)
{
    pthread_mutex_lock(&mu);
    for (struct remote_att **p = &atts; *p; p = &(*p)->next) {
        if (*p == r) {
            *p = r->next;
            break;
        }
    }
    pthread_mutex_unlock(&mu);
    /* out of the table: wait for a call that found it before */
    pthread_mutex_lock(&r->lk);
    pthread_mutex_unlock(&r->lk);
    pthread_mutex_destroy(&r->lk);
    for (int i = 0; i < REMOTE_STREAMS; i++) {
        close(r->fd[i]);
        if (!keep)
            unlink(r->path[i]);
    }
    if (!keep)
        unlink(r->finish_path);
    json_decref(r->spec);
    free(r);
}
