/*
 * runner/native/capd_pipe.c - the native capture pipe (capd_pipe_*, whose
 * ABI is in capd_analysis.h).
 *
 * The runner's hooks hand the pipe records, each in one call (capd_pipe_record: the analysis,
 * in the hook over the tensor's own bytes, and the frame), or snapshots (analyze) and records
 * (emit) in two. Analysis threads (one
 * per core the model leaves free) compute the stats, the XXH3-128 hash and the sample of each
 * snapshot; one writer thread writes the tensor frames to the frame fd strictly in submission
 * order, each once its analysis is done. No thread of the pipe ever touches
 * Python, so none competes with the model's thread for the GIL: a hook's
 * cost is one short foreign call and the analysis, or a copy and two calls (docs/runner.md,
 * "What bounds the cost").
 *
 * Analyses are numbered from 0 after each reset; a record names the analysis
 * it shows, so a tensor recorded twice (one module's output, the next one's
 * input) is analysed once. The snapshot of analysis i is the caller's again
 * once capd_pipe_analyzed() > i (analyses finish in any order; the count is
 * that of the finished prefix). Frames are buffered and written whenever the
 * writer catches up, as the Python pipeline does. A write error stops all
 * further writing; drain reports it.
 */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE /* the POSIX declarations under -std=c11 when built by hand */
#endif
#include <errno.h>
#include <math.h>
#include <pthread.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "runner/native/capd_analysis.h"

/* The equality hash is XXH3-128, compiled in from libxxhash's header
 * (XXH_INLINE_ALL), so the library still links nothing but libc, libm and
 * pthreads. It is a non-cryptographic hash: records name it ("hash_alg":
 * "xxh3-128", docs/protocol.md) and it only says whether two tensors are
 * equal, never what a stored blob is called (storage keys blobs by
 * SHA-256). It reads several GB/s on one core; BLAKE2b-128 over the same
 * bytes costs about as much as the rest of a module capture together. */
#define XXH_INLINE_ALL
#include <xxhash.h>

#ifdef CAPD_XXH3_AVX2
XXH128_hash_t capd__xxh3_128_avx2(const void *data, size_t len); /* capd_xxh3_avx2.c */
#endif

/* XXH3-128 of LEN bytes, by the AVX2 build where the CPU has it (the same
 * hash either way). */
static XXH128_hash_t hash128(const void *data, size_t len)
{
#ifdef CAPD_XXH3_AVX2
    if (__builtin_cpu_supports("avx2"))
        return capd__xxh3_128_avx2(data, len);
#endif
    return XXH3_128bits(data, len);
}

#define AN_BLOCK     1024
#define AN_BLOCKS    65536
#define OUT_FLUSH_AT (64u << 10)
#define MAX_HEADER   65536
#define MAX_THREADS  16

enum { CAP_STATS, CAP_SAMPLE };

struct analysis {
    double st[CAPD_OUT_N];
    char hash[33];
    int done;
    unsigned char *sample;
    size_t sample_len;
    char *text; /* its frames' stats and hash fields, made by the writer (stats_text) */
    size_t text_len;
};

struct job {
    int dtype, want_stats, capture;
    int64_t aid, n, sample_k;
    const unsigned char *data;
    char *prefix;
    size_t prefix_len;
};

struct fifo {
    struct job *q;
    size_t cap, head, len;
};

struct capd_pipe {
    int fd;
    pthread_t writer, threads[MAX_THREADS];
    int nthreads;
    pthread_mutex_t mu;
    pthread_cond_t awork, ework, done;
    int asleep, wasleep, waiters; /* analysers in awork, the writer in ework, callers in done */
    size_t unwoken_bytes;         /* queued for analysis since the analysers were last woken */
    int unwoken_jobs, unwritten;  /* the same in jobs; analyses done since the writer was */
    struct fifo aq, eq;           /* analyses to run; records to write */
    struct analysis **blocks;     /* AN_BLOCKS pointers, blocks made on demand */
    int64_t next_aid, analyzed;
    int writing, flushed, stop, err;
    unsigned char *ob; /* the writer's own */
    size_t olen, ocap;
    int64_t frames, payload_bytes;
};

static const int elsize_of[] = {4, 8, 2, 2, 8, 4, 2, 1, 1, 1};

/* The pipe's lock held (the block pointer may be new). */
static struct analysis *entry(struct capd_pipe *p, int64_t aid)
{
    return &p->blocks[aid / AN_BLOCK][aid % AN_BLOCK];
}

/* Room for one more job in F; 0 or -ENOMEM. */
static int fifo_room(struct fifo *f)
{
    if (f->len == f->cap) {
        size_t cap = f->cap ? f->cap * 2 : 256;
        struct job *q = malloc(cap * sizeof *q);
        if (!q)
            return -ENOMEM;
        for (size_t i = 0; i < f->len; i++)
            q[i] = f->q[(f->head + i) % f->cap];
        free(f->q);
        f->q = q;
        f->head = 0;
        f->cap = cap;
    }
    return 0;
}

static int fifo_push(struct fifo *f, const struct job *j)
{
    int rc = fifo_room(f);
    if (rc)
        return rc;
    f->q[(f->head + f->len) % f->cap] = *j;
    f->len++;
    return 0;
}

static struct job fifo_pop(struct fifo *f)
{
    struct job j = f->q[f->head];
    f->head = (f->head + 1) % f->cap;
    f->len--;
    return j;
}

static void fail(struct capd_pipe *p, int err)
{
    pthread_mutex_lock(&p->mu);
    if (!p->err)
        p->err = err;
    pthread_mutex_unlock(&p->mu);
}

static void flush_out(struct capd_pipe *p)
{
    size_t off = 0;
    int err;
    pthread_mutex_lock(&p->mu);
    err = p->err;
    pthread_mutex_unlock(&p->mu);
    while (!err && off < p->olen) {
        ssize_t w = write(p->fd, p->ob + off, p->olen - off);
        if (w < 0 && errno == EINTR)
            continue;
        if (w <= 0) {
            fail(p, w < 0 ? errno : EIO);
            break;
        }
        off += (size_t)w;
    }
    p->olen = 0;
}

static int out_put(struct capd_pipe *p, const void *data, size_t n)
{
    if (p->olen + n > p->ocap) {
        size_t cap = p->ocap ? p->ocap : OUT_FLUSH_AT * 2;
        while (cap < p->olen + n)
            cap *= 2;
        unsigned char *ob = realloc(p->ob, cap);
        if (!ob)
            return -ENOMEM;
        p->ob = ob;
        p->ocap = cap;
    }
    memcpy(p->ob + p->olen, data, n);
    p->olen += n;
    return 0;
}

/* Shortest of %.15g..%.17g that reads back as v, always with a '.', an
 * exponent or "null" so it reads as a float (what the Python encoder writes
 * for the same value, give or take the spelling). */
static int fmt_double(char *buf, size_t cap, double v)
{
    if (!isfinite(v))
        return snprintf(buf, cap, "null");
    int n = 0;
    for (int prec = 15; prec <= 17; prec++) {
        n = snprintf(buf, cap, "%.*g", prec, v);
        if (strtod(buf, NULL) == v)
            break;
    }
    if (strcspn(buf, ".en") == (size_t)n && (size_t)n + 2 < cap) {
        memcpy(buf + n, ".0", 3);
        n += 2;
    }
    return n;
}

static void run_analyze(struct capd_pipe *p, const struct job *j, struct analysis *a)
{
    size_t el = (size_t)elsize_of[j->dtype], bytes = (size_t)j->n * el;
    XXH128_hash_t h = hash128(j->data, bytes); /* NULL is fine when bytes is 0 */
    snprintf(a->hash, sizeof a->hash, "%016llx%016llx", (unsigned long long)h.high64,
             (unsigned long long)h.low64);
    if (j->want_stats)
        capd_stats(j->data, j->n, j->dtype, a->st);
    if (j->sample_k > 0) {
        a->sample_len = (size_t)j->sample_k * el;
        a->sample = malloc(a->sample_len);
        if (!a->sample) {
            fail(p, ENOMEM);
            a->sample_len = 0;
            return;
        }
        if (j->sample_k >= j->n) {
            memcpy(a->sample, j->data, bytes);
        } else {
            for (int64_t i = 0; i < j->sample_k; i++) {
                /* flat position floor(i * n / k), as tensors.sample_positions */
                int64_t pos =
                    (int64_t)(((unsigned __int128)i * (uint64_t)j->n) / (uint64_t)j->sample_k);
                memcpy(a->sample + (size_t)i * el, j->data + (size_t)pos * el, el);
            }
        }
    }
}

/* The writer's: A's stats, hash and hash_alg fields, formatted at its
 * first frame and kept for the others (a tensor recorded twice, one
 * module's output and the next one's input, writes the same text, and the
 * shortest-round-trip floats cost a few snprintf each); 0 or -ENOMEM. */
static int stats_text(struct analysis *a)
{
    static const char *names[] = {"min", "max", "mean", "std", "l2"};
    static const char *counts[] = {"nan", "pinf", "ninf", "zeros"};
    char text[512], num[40];
    size_t t = 0;
    if (a->text)
        return 0;
    t += (size_t)snprintf(text + t, sizeof text - t, ",\"stats\":{");
    for (int i = 0; i < 5; i++) {
        fmt_double(num, sizeof num, a->st[CAPD_OUT_MIN + i]);
        t +=
            (size_t)snprintf(text + t, sizeof text - t, "%s\"%s\":%s", i ? "," : "", names[i], num);
    }
    for (int i = 0; i < 4; i++)
        t += (size_t)snprintf(text + t, sizeof text - t, ",\"%s\":%lld", counts[i],
                              (long long)a->st[CAPD_OUT_NAN + i]);
    t += (size_t)snprintf(text + t, sizeof text - t, "},\"hash\":\"%s\",\"hash_alg\":\"xxh3-128\"",
                          a->hash);
    if (!(a->text = malloc(t)))
        return -ENOMEM;
    memcpy(a->text, text, t);
    a->text_len = t;
    return 0;
}

/* The writer's: job J's frame into the output buffer (flushed past
 * OUT_FLUSH_AT), counted in *FRAMES and *PAYLOAD. */
static void run_emit(struct capd_pipe *p, const struct job *j, struct analysis *a, int64_t *frames,
                     int64_t *payload_bytes)
{
    char tail[128];
    size_t t = 0;
    if (stats_text(a)) {
        fail(p, ENOMEM);
        return;
    }
    int sample = j->capture == CAP_SAMPLE;
    size_t payload = sample ? a->sample_len : 0;
    t += (size_t)snprintf(tail + t, sizeof tail - t, ",\"capture\":\"%s\"%s",
                          sample ? "sample" : "stats",
                          sample ? ",\"sample_positions\":\"stride\"" : "");
    if (payload)
        t += (size_t)snprintf(tail + t, sizeof tail - t, ",\"nbytes\":%zu", payload);
    t += (size_t)snprintf(tail + t, sizeof tail - t, "}\n");
    if (j->prefix_len + a->text_len + t > MAX_HEADER) {
        fail(p, EMSGSIZE);
        return;
    }
    if (out_put(p, j->prefix, j->prefix_len) || out_put(p, a->text, a->text_len) ||
        out_put(p, tail, t) || (payload && out_put(p, a->sample, payload))) {
        fail(p, ENOMEM);
        return;
    }
    (*frames)++;
    *payload_bytes += (int64_t)payload;
    if (p->olen >= OUT_FLUSH_AT)
        flush_out(p);
}

/*
 * Waking a thread is a futex call for the one that wakes it and, in a VM, an
 * interrupt to another CPU: done for every job it cost the model's thread
 * about 20 us a job, more than the analysis itself; polling instead costs
 * the model its CPU whenever the machine has no core to spare (each wake-up
 * of a poller preempts it). So the threads sleep on condition variables and
 * are woken in batches: the analysers once WAKE_BYTES or WAKE_JOBS have been
 * queued since their last wake-up, the writer every WRITER_BATCH finished
 * analyses; a drain (or a wait) wakes everyone. A batch bounds both the
 * work left for the drain at the end of a capture and the frames a crash can
 * lose. `done` is signalled only when someone waits.
 */
#define WAKE_BYTES   (256u << 10)
#define WAKE_JOBS    16
#define WRITER_BATCH 32
#define EMIT_BACKLOG 512
#define WRITER_TAKE  64 /* records the writer takes in one hold of the lock */

static void sleep_on(struct capd_pipe *p, pthread_cond_t *cond, int *count)
{
    (*count)++;
    pthread_cond_wait(cond, &p->mu);
    (*count)--;
}

/* The pipe's lock held: the sleeping analysers that have work woken, and
 * the writer too when WRITER and it has work (a capture's reset and sync
 * find them idle, and a wake-up for nothing costs the caller as much as one
 * for work). */
static void wake(struct capd_pipe *p, int writer)
{
    p->unwoken_bytes = 0;
    p->unwoken_jobs = p->unwritten = 0;
    if (p->asleep && p->aq.len)
        pthread_cond_broadcast(&p->awork);
    if (writer && p->wasleep && (p->eq.len || !p->flushed))
        pthread_cond_signal(&p->ework);
}

static void finished(struct capd_pipe *p)
{
    if (p->waiters)
        pthread_cond_broadcast(&p->done);
}

/* The pipe's lock held: analysis A is done; the finished prefix grows and
 * the writer and the waiters hear of it. */
static void analysis_done(struct capd_pipe *p, struct analysis *a)
{
    a->done = 1;
    while (p->analyzed < p->next_aid && entry(p, p->analyzed)->done)
        p->analyzed++;
    if ((++p->unwritten >= WRITER_BATCH || p->waiters) && p->wasleep) {
        p->unwritten = 0;
        pthread_cond_signal(&p->ework);
    }
    finished(p);
}

/* The pipe's lock held: job J's analysis, run with the lock let go (its
 * entry is J's alone until it is done) and then marked done; returns with
 * the lock held again. An analysis thread and a caller running its own
 * analysis at once both go through here. */
static void analyze_unlocked(struct capd_pipe *p, const struct job *j)
{
    struct analysis *a = entry(p, j->aid);
    pthread_mutex_unlock(&p->mu);
    run_analyze(p, j, a);
    pthread_mutex_lock(&p->mu);
    analysis_done(p, a);
}

static void *analysis_thread(void *arg)
{
    struct capd_pipe *p = arg;
    pthread_mutex_lock(&p->mu);
    for (;;) {
        while (p->aq.len == 0 && !p->stop)
            sleep_on(p, &p->awork, &p->asleep);
        if (p->aq.len == 0)
            break;
        struct job j = fifo_pop(&p->aq);
        analyze_unlocked(p, &j);
    }
    pthread_mutex_unlock(&p->mu);
    return NULL;
}

/*
 * The pipe's lock held and the output (the frames' order, ob, olen) free
 * (!writing): takes it, writes every record whose analysis is done, in one
 * hold of the lock (the model's thread takes it at each record, and a
 * writer that came back for each frame made it wait), flushes when nothing
 * more is ready, and gives it back. The writer thread does this, and so does
 * a caller of drain rather than waking the writer and waiting for it (two
 * wake-ups, each a futex call and an interrupt to another CPU in a VM, at
 * the end of every capture). Whether there was anything to do.
 */
static int write_ready(struct capd_pipe *p)
{
    struct job js[WRITER_TAKE];
    struct analysis *as[WRITER_TAKE];
    int n = 0;
    while (n < WRITER_TAKE && p->eq.len && (as[n] = entry(p, p->eq.q[p->eq.head].aid))->done)
        js[n++] = fifo_pop(&p->eq);
    int flush = n == 0 && p->olen; /* ob is the holder's, and nobody holds it */
    if (!n && !flush) {
        if (p->eq.len == 0 && !p->flushed) {
            p->flushed = 1;
            finished(p);
        }
        return 0;
    }
    p->writing = 1;
    pthread_mutex_unlock(&p->mu);
    int64_t frames = 0, payload_bytes = 0;
    for (int i = 0; i < n; i++) {
        run_emit(p, &js[i], as[i], &frames, &payload_bytes);
        free(js[i].prefix);
    }
    if (flush)
        flush_out(p);
    pthread_mutex_lock(&p->mu);
    p->frames += frames;
    p->payload_bytes += payload_bytes;
    p->writing = 0;
    finished(p);
    return 1;
}

static void *writer_thread(void *arg)
{
    struct capd_pipe *p = arg;
    pthread_mutex_lock(&p->mu);
    while (!p->stop) {
        if (!p->writing && write_ready(p))
            continue;
        /* nothing ready (records go out in order), or a drain writes */
        sleep_on(p, &p->ework, &p->wasleep);
    }
    pthread_mutex_unlock(&p->mu);
    flush_out(p);
    return NULL;
}

static void pipe_stop(struct capd_pipe *p, int analysers)
{
    pthread_mutex_lock(&p->mu);
    p->stop = 1;
    pthread_cond_broadcast(&p->awork);
    pthread_cond_broadcast(&p->ework);
    pthread_mutex_unlock(&p->mu);
    for (int i = 0; i < analysers; i++)
        pthread_join(p->threads[i], NULL);
}

/* Frees the pipe and its synchronisation, every thread of it joined. */
static void pipe_release(struct capd_pipe *p)
{
    if (p->blocks)
        free(p->blocks[0]); /* the one capd_pipe_reset keeps */
    pthread_cond_destroy(&p->awork);
    pthread_cond_destroy(&p->ework);
    pthread_cond_destroy(&p->done);
    pthread_mutex_destroy(&p->mu);
    free(p->blocks);
    free(p->aq.q);
    free(p->eq.q);
    free(p->ob);
    free(p);
}

/* threads: analysis threads, 1..MAX_THREADS. */
void *capd_pipe_new(int fd, int threads)
{
    struct capd_pipe *p = calloc(1, sizeof *p);
    if (!p)
        return NULL;
    p->fd = fd;
    p->flushed = 1;
    p->nthreads = threads < 1 ? 1 : threads > MAX_THREADS ? MAX_THREADS : threads;
    if (!(p->blocks = calloc(AN_BLOCKS, sizeof *p->blocks)) || pthread_mutex_init(&p->mu, NULL)) {
        free(p->blocks);
        free(p);
        return NULL;
    }
    pthread_cond_init(&p->awork, NULL);
    pthread_cond_init(&p->ework, NULL);
    pthread_cond_init(&p->done, NULL);
    int started = 0;
    if (pthread_create(&p->writer, NULL, writer_thread, p) == 0) {
        while (started < p->nthreads &&
               pthread_create(&p->threads[started], NULL, analysis_thread, p) == 0)
            started++;
        if (started == p->nthreads)
            return p;
        pipe_stop(p, started);
        pthread_join(p->writer, NULL);
    }
    pipe_release(p);
    return NULL;
}

/* The job of an analysis, checked; 0 or -EINVAL. */
static int job_of(struct job *j, const void *data, int64_t n, int dtype, int want_stats,
                  int64_t sample_k)
{
    if (dtype < CAPD_DT_F32 || dtype > CAPD_DT_BOOL || n < 0 || sample_k < 0 || (n > 0 && !data))
        return -EINVAL;
    *j = (struct job){.dtype = dtype,
                      .want_stats = want_stats,
                      .n = n,
                      .sample_k = sample_k < n ? sample_k : n,
                      .data = data};
    return 0;
}

/* The pipe's lock held: the next analysis id with its entry made, or
 * -E2BIG past AN_BLOCKS * AN_BLOCK analyses, or -ENOMEM. */
static int64_t next_slot(struct capd_pipe *p)
{
    int64_t aid = p->next_aid;
    if (aid / AN_BLOCK >= AN_BLOCKS)
        return -E2BIG;
    if (!p->blocks[aid / AN_BLOCK] &&
        !(p->blocks[aid / AN_BLOCK] = calloc(AN_BLOCK, sizeof(struct analysis))))
        return -ENOMEM;
    return aid;
}

/*
 * One analysis claimed under the pipe's lock: queued for an analysis
 * thread (NOW false), or run at once on the caller's thread over the
 * caller's bytes (NOW true), which then need not outlive the call: no
 * snapshot copy, no hand-off and nothing left for drain to wait on. XXH3
 * and the stats read a resnet18 activation in less time than the copy and
 * the wake-up of a sleeping thread cost the hook when the cores are busy;
 * either way the record goes out through the writer, in order. The id, or
 * a negative errno with nothing claimed.
 */
static int64_t analyze(struct capd_pipe *p, const void *data, int64_t n, int dtype, int want_stats,
                       int64_t sample_k, bool now)
{
    struct job j;
    int64_t rc = job_of(&j, data, n, dtype, want_stats, sample_k);
    if (rc)
        return rc;
    pthread_mutex_lock(&p->mu);
    int64_t aid = rc = next_slot(p);
    if (aid >= 0) {
        j.aid = aid;
        rc = now ? 0 : fifo_push(&p->aq, &j);
    }
    if (!rc && !now) {
        p->unwoken_bytes += (size_t)n * (size_t)elsize_of[dtype];
        if (++p->unwoken_jobs >= WAKE_JOBS || p->unwoken_bytes >= WAKE_BYTES) {
            p->unwoken_bytes = 0;
            p->unwoken_jobs = 0;
            if (p->asleep)
                pthread_cond_broadcast(&p->awork);
        }
    }
    if (!rc)
        p->next_aid++;
    if (!rc && now)
        analyze_unlocked(p, &j);
    pthread_mutex_unlock(&p->mu);
    return rc ? rc : aid;
}

int64_t capd_pipe_analyze(void *pipe, const void *data, int64_t n, int dtype, int want_stats,
                          int64_t sample_k)
{
    return analyze(pipe, data, n, dtype, want_stats, sample_k, false);
}

int64_t capd_pipe_analyze_now(void *pipe, const void *data, int64_t n, int dtype, int want_stats,
                              int64_t sample_k)
{
    return analyze(pipe, data, n, dtype, want_stats, sample_k, true);
}

int capd_pipe_emit(void *pipe, int64_t aid, const char *prefix, int64_t len, int capture)
{
    struct capd_pipe *p = pipe;
    if (len < 0 || len > MAX_HEADER || (capture != CAP_STATS && capture != CAP_SAMPLE))
        return -EINVAL;
    struct job j = {.aid = aid, .capture = capture, .prefix_len = (size_t)len};
    if (!(j.prefix = malloc((size_t)len + 1)))
        return -ENOMEM;
    memcpy(j.prefix, prefix, (size_t)len);
    pthread_mutex_lock(&p->mu);
    int rc = aid >= 0 && aid < p->next_aid ? fifo_push(&p->eq, &j) : -EINVAL;
    if (!rc) {
        p->flushed = 0;
        if (p->eq.len >= EMIT_BACKLOG && p->wasleep)
            pthread_cond_signal(&p->ework);
    }
    pthread_mutex_unlock(&p->mu);
    if (rc)
        free(j.prefix);
    return rc;
}

int64_t capd_pipe_analyzed(void *pipe)
{
    struct capd_pipe *p = pipe;
    pthread_mutex_lock(&p->mu);
    int64_t n = p->analyzed;
    pthread_mutex_unlock(&p->mu);
    return n;
}

int capd_pipe_wait_analyzed(void *pipe, int64_t count)
{
    struct capd_pipe *p = pipe;
    pthread_mutex_lock(&p->mu);
    p->waiters++;
    wake(p, 1); /* what it waits for may be queued below a batch */
    while (p->analyzed < count && p->analyzed < p->next_aid)
        pthread_cond_wait(&p->done, &p->mu);
    p->waiters--;
    int err = p->err;
    pthread_mutex_unlock(&p->mu);
    return -err;
}

int capd_pipe_drain(void *pipe)
{
    struct capd_pipe *p = pipe;
    pthread_mutex_lock(&p->mu);
    p->waiters++;
    /* The analysers must finish theirs; what is ready to write, this
     * thread writes (write_ready), the writer only if it is at it. */
    wake(p, 0);
    for (;;) {
        if (!p->writing && write_ready(p))
            continue;
        if (!(p->analyzed < p->next_aid || p->eq.len || p->writing || !p->flushed))
            break;
        pthread_cond_wait(&p->done, &p->mu);
    }
    p->waiters--;
    int err = p->err;
    pthread_mutex_unlock(&p->mu);
    return -err;
}

/* The hex hashes of analyses first..first+n-1 (finished), 32 bytes each. */
int capd_pipe_hashes(void *pipe, int64_t first, int64_t n, char *out)
{
    struct capd_pipe *p = pipe;
    pthread_mutex_lock(&p->mu);
    int ok = first >= 0 && n >= 0 && first + n <= p->analyzed;
    for (int64_t i = 0; ok && i < n; i++)
        memcpy(out + 32 * i, entry(p, first + i)->hash, 32);
    pthread_mutex_unlock(&p->mu);
    return ok ? 0 : -EINVAL;
}

/* Drains, then forgets every analysis (numbering starts again at 0). */
int capd_pipe_reset(void *pipe)
{
    struct capd_pipe *p = pipe;
    int rc = capd_pipe_drain(p);
    pthread_mutex_lock(&p->mu);
    for (int64_t b = 0; b < AN_BLOCKS && p->blocks[b]; b++) {
        for (int i = 0; i < AN_BLOCK; i++) {
            free(p->blocks[b][i].sample);
            free(p->blocks[b][i].text);
        }
        if (b > 0) {
            free(p->blocks[b]);
            p->blocks[b] = NULL;
        }
    }
    /* The first block stays, cleared, for the next capture: made anew it
     * would be mapped and faulted in again each time. */
    if (p->blocks[0])
        memset(p->blocks[0], 0,
               (size_t)(p->next_aid < AN_BLOCK ? p->next_aid : AN_BLOCK) * sizeof **p->blocks);
    p->next_aid = p->analyzed = 0;
    pthread_mutex_unlock(&p->mu);
    return rc;
}

void capd_pipe_counts(void *pipe, int64_t *out)
{
    struct capd_pipe *p = pipe;
    pthread_mutex_lock(&p->mu);
    out[0] = p->frames;
    out[1] = p->payload_bytes;
    pthread_mutex_unlock(&p->mu);
}

void capd_pipe_free(void *pipe)
{
    struct capd_pipe *p = pipe;
    if (!p)
        return;
    capd_pipe_reset(p);
    pipe_stop(p, p->nthreads);
    pthread_join(p->writer, NULL);
    pipe_release(p);
}

/*
 * One record in one call, for a hook that would otherwise make three
 * (snapshot, analyze, emit): the analysis of N elements at DATA, run now on
 * the caller's thread over its own bytes, which need not outlive the call
 * (capd_pipe_analyze_now), and unless PREFIX is NULL the record's frame
 * (capd_pipe_emit's PREFIX, LEN and CAPTURE), queued for the writer. Returns
 * the analysis id or -errno; a refused record is neither numbered nor
 * queued.
 */
int64_t capd_pipe_record(void *pipe, const void *data, int64_t n, int dtype, int want_stats,
                         int64_t sample_k, const char *prefix, int64_t len, int capture)
{
    struct capd_pipe *p = pipe;
    struct job j, e = {.capture = capture, .prefix_len = (size_t)len};
    int64_t rc = job_of(&j, data, n, dtype, want_stats, sample_k);
    if (rc)
        return rc;
    if (prefix && (len < 0 || len > MAX_HEADER || (capture != CAP_STATS && capture != CAP_SAMPLE)))
        return -EINVAL;
    if (prefix) {
        if (!(e.prefix = malloc((size_t)len + 1)))
            return -ENOMEM;
        memcpy(e.prefix, prefix, (size_t)len);
    }
    pthread_mutex_lock(&p->mu);
    int64_t aid = rc = next_slot(p);
    if (rc >= 0 && prefix)
        rc = fifo_room(&p->eq);
    if (rc < 0) {
        pthread_mutex_unlock(&p->mu);
        free(e.prefix);
        return rc;
    }
    j.aid = e.aid = aid;
    p->next_aid++;
    if (prefix) {
        fifo_push(&p->eq, &e); /* cannot fail: room made above */
        p->flushed = 0;
        if (p->eq.len >= EMIT_BACKLOG && p->wasleep)
            pthread_cond_signal(&p->ework);
    }
    analyze_unlocked(p, &j);
    pthread_mutex_unlock(&p->mu);
    return aid;
}
