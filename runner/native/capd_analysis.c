/*
 * runner/native/capd_analysis.c - the runner's tensor statistics in one call.
 *
 * The capture runner (runner/capd_runner) computes, for every snapshot of a
 * tensor, min, max, mean, std, L2 norm and the NaN/+Inf/-Inf/zero counts. With
 * torch alone that is a handful of operator calls per tensor, and each call
 * releases and re-takes the GIL, which the model's thread wants back between
 * its kernels: the analysis worker then steals time from the model it
 * observes. This library does the whole tensor in one foreign call (ctypes
 * releases the GIL once for its whole duration), reading the memory once.
 *
 * It depends on nothing but libc and libm and knows nothing of Python or
 * torch: the runner passes a pointer to a C-contiguous little-endian buffer,
 * an element count and a dtype code (CAPD_DT_*, mirrored in
 * runner/capd_runner/native.py). The values are the same definitions as the
 * runner's torch engine (tensors.StatsEngine): everything in float64 over the
 * finite values, min/max exact, a centred second pass when E[x^2] - mean^2
 * has lost more than 4 digits. Sums are taken in a fixed order (8 lanes,
 * then the lanes in order) so a result depends only on the bytes, never on
 * the CPU: the same tensor gives the same bits at every dispatch width.
 */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE /* nanosleep under -std=c11 when built by hand */
#endif
#include <errno.h>
#include <math.h>
#include <pthread.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "runner/native/blake2b.h"

#define CAPD_ANALYSIS_ABI 2

enum {
    CAPD_DT_F32 = 0,
    CAPD_DT_F64 = 1,
    CAPD_DT_F16 = 2,
    CAPD_DT_BF16 = 3,
    CAPD_DT_I64 = 4,
    CAPD_DT_I32 = 5,
    CAPD_DT_I16 = 6,
    CAPD_DT_I8 = 7,
    CAPD_DT_U8 = 8,
    CAPD_DT_BOOL = 9,
};

/* out[]: what capd_stats fills (doubles; counts are exact below 2^53). */
enum {
    OUT_MIN,
    OUT_MAX,
    OUT_MEAN,
    OUT_STD,
    OUT_L2,
    OUT_NAN,
    OUT_PINF,
    OUT_NINF,
    OUT_ZEROS,
    OUT_NFINITE,
    OUT_N
};

#define LANES 8

int capd_analysis_abi(void);
int capd_stats(const void *data, int64_t n, int dtype, double *out);

int capd_analysis_abi(void)
{
    return CAPD_ANALYSIS_ABI;
}

static inline double f16_to_double(uint16_t h)
{
    int sign = h >> 15, exp = (h >> 10) & 0x1f, man = h & 0x3ff;
    double v;
    if (exp == 0)
        v = ldexp((double)man, -24);
    else if (exp == 31)
        v = man ? NAN : INFINITY;
    else
        v = ldexp((double)(man | 0x400), exp - 25);
    return sign ? -v : v;
}

static inline double bf16_to_double(uint16_t b)
{
    uint32_t u = (uint32_t)b << 16;
    float f;
    memcpy(&f, &u, sizeof f);
    return (double)f;
}

/* Element i of type T at p, unaligned (a snapshot is aligned, a caller's
 * buffer need not be). */
#define ELEM(T, p, i)                                                                              \
    ({                                                                                             \
        T v_;                                                                                      \
        memcpy(&v_, (p) + sizeof(T) * (size_t)(i), sizeof v_);                                     \
        v_;                                                                                        \
    })

/* The value of element i as a double, whatever the dtype. */
static inline double load(const unsigned char *p, int64_t i, int dt)
{
    switch (dt) {
    case CAPD_DT_F32:
        return ELEM(float, p, i);
    case CAPD_DT_F64:
        return ELEM(double, p, i);
    case CAPD_DT_F16:
        return f16_to_double(ELEM(uint16_t, p, i));
    case CAPD_DT_BF16:
        return bf16_to_double(ELEM(uint16_t, p, i));
    case CAPD_DT_I64:
        return (double)ELEM(int64_t, p, i);
    case CAPD_DT_I32:
        return ELEM(int32_t, p, i);
    case CAPD_DT_I16:
        return ELEM(int16_t, p, i);
    case CAPD_DT_I8:
        return (int8_t)p[i];
    case CAPD_DT_U8:
        return p[i];
    default: /* CAPD_DT_BOOL */
        return p[i] != 0;
    }
}

struct acc {
    double s[LANES], q[LANES], lo[LANES], hi[LANES];
    int64_t nz[LANES];
};

static void acc_init(struct acc *a)
{
    for (int j = 0; j < LANES; j++) {
        a->s[j] = a->q[j] = 0.0;
        a->lo[j] = INFINITY;
        a->hi[j] = -INFINITY;
        a->nz[j] = 0;
    }
}

/* One value into lane j. A NaN leaves min/max alone (the comparisons are
 * false) and shows in the sums, which send the tensor to the exact path. */
#define ACC_ONE(a, j, v)                                                                           \
    do {                                                                                           \
        (a)->s[j] += (v);                                                                          \
        (a)->q[j] += (v) * (v);                                                                    \
        (a)->lo[j] = (v) < (a)->lo[j] ? (v) : (a)->lo[j];                                          \
        (a)->hi[j] = (v) > (a)->hi[j] ? (v) : (a)->hi[j];                                          \
        (a)->nz[j] += (v) != 0.0;                                                                  \
    } while (0)

/* Lane j takes elements i with i % LANES == j. */
#define ACC_LOOP(T, CONV)                                                                          \
    do {                                                                                           \
        const T *x = (const T *)(const void *)p;                                                   \
        int64_t full = n - n % LANES;                                                              \
        for (int64_t i = 0; i < full; i += LANES) {                                                \
            for (int j = 0; j < LANES; j++) {                                                      \
                double v = CONV(x[i + j]);                                                         \
                ACC_ONE(a, j, v);                                                                  \
            }                                                                                      \
        }                                                                                          \
        for (int64_t i = full; i < n; i++) {                                                       \
            double v = CONV(x[i]);                                                                 \
            ACC_ONE(a, i - full, v);                                                               \
        }                                                                                          \
    } while (0)

#define AS_DOUBLE(v) ((double)(v))

/* The fast pass for the dtypes read in place; the others go through load(). */
__attribute__((target_clones("avx2", "default"))) static void
accumulate(const unsigned char *p, int64_t n, int dt, struct acc *a)
{
    switch (dt) {
    case CAPD_DT_F32:
        ACC_LOOP(float, AS_DOUBLE);
        return;
    case CAPD_DT_F64:
        ACC_LOOP(double, AS_DOUBLE);
        return;
    case CAPD_DT_I32:
        ACC_LOOP(int32_t, AS_DOUBLE);
        return;
    case CAPD_DT_I64:
        ACC_LOOP(int64_t, AS_DOUBLE);
        return;
    default:
        break;
    }
    for (int64_t i = 0; i < n; i++) {
        double v = load(p, i, dt);
        ACC_ONE(a, i % LANES, v);
    }
}

/* sum of (x - mean)^2 over the finite values, lanes as above. */
static double centred(const unsigned char *p, int64_t n, int dt, double mean)
{
    double c[LANES] = {0};
    for (int64_t i = 0; i < n; i++) {
        double v = load(p, i, dt);
        if (isfinite(v)) {
            double d = v - mean;
            c[i % LANES] += d * d;
        }
    }
    double css = 0.0;
    for (int j = 0; j < LANES; j++)
        css += c[j];
    return css;
}

/* Any NaN or infinity (or a sum that overflowed): counts, then the stats of
 * the finite values, mean first and the spread about it. */
static void nonfinite(const unsigned char *p, int64_t n, int dt, double *out)
{
    int64_t nan = 0, pinf = 0, ninf = 0, zeros = 0, nf = 0;
    double s[LANES] = {0}, q[LANES] = {0}, lo = INFINITY, hi = -INFINITY;
    for (int64_t i = 0; i < n; i++) {
        double v = load(p, i, dt);
        if (isnan(v)) {
            nan++;
            continue;
        }
        if (isinf(v)) {
            if (v > 0)
                pinf++;
            else
                ninf++;
            continue;
        }
        zeros += v == 0.0;
        s[nf % LANES] += v;
        q[nf % LANES] += v * v;
        lo = v < lo ? v : lo;
        hi = v > hi ? v : hi;
        nf++;
    }
    out[OUT_NAN] = (double)nan;
    out[OUT_PINF] = (double)pinf;
    out[OUT_NINF] = (double)ninf;
    out[OUT_ZEROS] = (double)zeros;
    out[OUT_NFINITE] = (double)nf;
    if (nf == 0) {
        out[OUT_MIN] = out[OUT_MAX] = out[OUT_MEAN] = out[OUT_STD] = out[OUT_L2] = NAN;
        return;
    }
    double total = 0.0, sumsq = 0.0;
    for (int j = 0; j < LANES; j++) {
        total += s[j];
        sumsq += q[j];
    }
    double mean = total / (double)nf;
    out[OUT_MIN] = lo;
    out[OUT_MAX] = hi;
    out[OUT_MEAN] = mean;
    out[OUT_STD] = sqrt(centred(p, n, dt, mean) / (double)nf);
    out[OUT_L2] = sqrt(sumsq);
}

/*
 * Stats of n elements of dtype dt at data into out[OUT_N]: min, max, mean,
 * std, l2 (NaN where undefined or not finite: the runner reports null), and
 * the nan/+inf/-inf/zero counts and the finite count. Returns 0, or -1 for
 * an unknown dtype.
 */
int capd_stats(const void *data, int64_t n, int dtype, double *out)
{
    const unsigned char *p = data;
    if (dtype < CAPD_DT_F32 || dtype > CAPD_DT_BOOL || n < 0)
        return -1;
    for (int i = 0; i < OUT_N; i++)
        out[i] = 0.0;
    if (n == 0) {
        out[OUT_MIN] = out[OUT_MAX] = out[OUT_MEAN] = out[OUT_STD] = out[OUT_L2] = NAN;
        return 0;
    }
    struct acc a;
    acc_init(&a);
    accumulate(p, n, dtype, &a);
    double total = 0.0, sumsq = 0.0, lo = INFINITY, hi = -INFINITY;
    int64_t nonzero = 0;
    for (int j = 0; j < LANES; j++) {
        total += a.s[j];
        sumsq += a.q[j];
        lo = a.lo[j] < lo ? a.lo[j] : lo;
        hi = a.hi[j] > hi ? a.hi[j] : hi;
        nonzero += a.nz[j];
    }
    if (!(isfinite(total) && isfinite(sumsq) && isfinite(lo) && isfinite(hi))) {
        nonfinite(p, n, dtype, out);
        return 0;
    }
    double mean = total / (double)n, msq = sumsq / (double)n;
    double var = msq - mean * mean;
    if (var <= 1e-4 * msq)
        var = centred(p, n, dtype, mean) / (double)n; /* lost > 4 digits */
    out[OUT_MIN] = lo;
    out[OUT_MAX] = hi;
    out[OUT_MEAN] = mean;
    out[OUT_STD] = sqrt(var > 0.0 ? var : 0.0);
    out[OUT_L2] = sqrt(sumsq);
    out[OUT_ZEROS] = (double)(n - nonzero);
    out[OUT_NFINITE] = (double)n;
    return 0;
}

/* ------------------------------------------------------------------ pipe */
/*
 * A capture pipe: the runner's hooks hand it snapshots (analyze) and records
 * (emit). Analysis threads (one per core the model leaves free) compute the
 * stats, the BLAKE2b-128 hash and the sample of each snapshot; one writer
 * thread writes the tensor frames to the frame fd strictly in submission
 * order, each once its analysis is done. No thread of the pipe ever touches
 * Python, so none competes with the model's thread for the GIL: a hook's
 * cost is the snapshot copy and two short foreign calls (docs/runner.md,
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

#define AN_BLOCK     1024
#define AN_BLOCKS    65536
#define OUT_FLUSH_AT (64u << 10)
#define MAX_HEADER   65536
#define MAX_THREADS  16

enum { CAP_STATS, CAP_SAMPLE };

struct analysis {
    double st[OUT_N];
    char hash[33];
    int done;
    unsigned char *sample;
    size_t sample_len;
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

void *capd_pipe_new(int fd, int threads);
int64_t capd_pipe_analyze(void *pipe, const void *data, int64_t n, int dtype, int want_stats,
                          int64_t sample_k);
int capd_pipe_emit(void *pipe, int64_t aid, const char *prefix, int64_t len, int capture);
int64_t capd_pipe_analyzed(void *pipe);
int capd_pipe_wait_analyzed(void *pipe, int64_t count);
int capd_pipe_drain(void *pipe);
int capd_pipe_hashes(void *pipe, int64_t first, int64_t n, char *out);
int capd_pipe_reset(void *pipe);
void capd_pipe_counts(void *pipe, int64_t *out);
void capd_pipe_free(void *pipe);

static const int elsize_of[] = {4, 8, 2, 2, 8, 4, 2, 1, 1, 1};

/* The pipe's lock held (the block pointer may be new). */
static struct analysis *entry(struct capd_pipe *p, int64_t aid)
{
    return &p->blocks[aid / AN_BLOCK][aid % AN_BLOCK];
}

static int fifo_push(struct fifo *f, const struct job *j)
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
    struct b2b ctx;
    size_t el = (size_t)elsize_of[j->dtype], bytes = (size_t)j->n * el;
    b2b_init(&ctx, 16);
    b2b_update(&ctx, j->data, bytes);
    b2b_final_hex16(&ctx, a->hash);
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

static void run_emit(struct capd_pipe *p, const struct job *j, const struct analysis *a)
{
    static const char *names[] = {"min", "max", "mean", "std", "l2"};
    static const char *counts[] = {"nan", "pinf", "ninf", "zeros"};
    char tail[1024], num[40];
    size_t t = 0;
    t += (size_t)snprintf(tail + t, sizeof tail - t, ",\"stats\":{");
    for (int i = 0; i < 5; i++) {
        fmt_double(num, sizeof num, a->st[OUT_MIN + i]);
        t +=
            (size_t)snprintf(tail + t, sizeof tail - t, "%s\"%s\":%s", i ? "," : "", names[i], num);
    }
    for (int i = 0; i < 4; i++)
        t += (size_t)snprintf(tail + t, sizeof tail - t, ",\"%s\":%lld", counts[i],
                              (long long)a->st[OUT_NAN + i]);
    int sample = j->capture == CAP_SAMPLE;
    size_t payload = sample ? a->sample_len : 0;
    t += (size_t)snprintf(tail + t, sizeof tail - t, "},\"hash\":\"%s\",\"capture\":\"%s\"%s",
                          a->hash, sample ? "sample" : "stats",
                          sample ? ",\"sample_positions\":\"stride\"" : "");
    if (payload)
        t += (size_t)snprintf(tail + t, sizeof tail - t, ",\"nbytes\":%zu", payload);
    t += (size_t)snprintf(tail + t, sizeof tail - t, "}\n");
    if (j->prefix_len + t > MAX_HEADER) {
        fail(p, EMSGSIZE);
        return;
    }
    if (out_put(p, j->prefix, j->prefix_len) || out_put(p, tail, t) ||
        (payload && out_put(p, a->sample, payload))) {
        fail(p, ENOMEM);
        return;
    }
    pthread_mutex_lock(&p->mu);
    p->frames++;
    p->payload_bytes += (int64_t)payload;
    pthread_mutex_unlock(&p->mu);
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

static void sleep_on(struct capd_pipe *p, pthread_cond_t *cond, int *count)
{
    (*count)++;
    pthread_cond_wait(cond, &p->mu);
    (*count)--;
}

static void wake_all(struct capd_pipe *p)
{
    p->unwoken_bytes = 0;
    p->unwoken_jobs = p->unwritten = 0;
    if (p->asleep)
        pthread_cond_broadcast(&p->awork);
    if (p->wasleep)
        pthread_cond_signal(&p->ework);
}

static void finished(struct capd_pipe *p)
{
    if (p->waiters)
        pthread_cond_broadcast(&p->done);
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
        struct analysis *a = entry(p, j.aid);
        pthread_mutex_unlock(&p->mu);
        run_analyze(p, &j, a);
        pthread_mutex_lock(&p->mu);
        a->done = 1;
        while (p->analyzed < p->next_aid && entry(p, p->analyzed)->done)
            p->analyzed++;
        if ((++p->unwritten >= WRITER_BATCH || p->waiters) && p->wasleep) {
            p->unwritten = 0;
            pthread_cond_signal(&p->ework);
        }
        finished(p);
    }
    pthread_mutex_unlock(&p->mu);
    return NULL;
}

static void *writer_thread(void *arg)
{
    struct capd_pipe *p = arg;
    pthread_mutex_lock(&p->mu);
    for (;;) {
        /* Idle: write what is buffered, then wait for a record whose
         * analysis is done (records go out in order). */
        while (!p->stop && (p->eq.len == 0 || !entry(p, p->eq.q[p->eq.head].aid)->done)) {
            if (p->olen) {
                pthread_mutex_unlock(&p->mu);
                flush_out(p);
                pthread_mutex_lock(&p->mu);
                continue;
            }
            if (p->eq.len == 0 && !p->flushed) {
                p->flushed = 1;
                finished(p);
            }
            sleep_on(p, &p->ework, &p->wasleep);
        }
        if (p->stop)
            break;
        struct job j = fifo_pop(&p->eq);
        const struct analysis *a = entry(p, j.aid);
        p->writing = 1;
        pthread_mutex_unlock(&p->mu);
        run_emit(p, &j, a);
        free(j.prefix);
        pthread_mutex_lock(&p->mu);
        p->writing = 0;
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

int64_t capd_pipe_analyze(void *pipe, const void *data, int64_t n, int dtype, int want_stats,
                          int64_t sample_k)
{
    struct capd_pipe *p = pipe;
    if (dtype < CAPD_DT_F32 || dtype > CAPD_DT_BOOL || n < 0 || sample_k < 0 || (n > 0 && !data))
        return -EINVAL;
    struct job j = {.dtype = dtype,
                    .want_stats = want_stats,
                    .n = n,
                    .sample_k = sample_k < n ? sample_k : n,
                    .data = data};
    pthread_mutex_lock(&p->mu);
    int64_t aid = p->next_aid;
    int rc = 0;
    if (aid / AN_BLOCK >= AN_BLOCKS) {
        rc = -E2BIG;
    } else if (!p->blocks[aid / AN_BLOCK] &&
               !(p->blocks[aid / AN_BLOCK] = calloc(AN_BLOCK, sizeof(struct analysis)))) {
        rc = -ENOMEM;
    } else {
        j.aid = aid;
        if (!(rc = fifo_push(&p->aq, &j))) {
            p->next_aid++;
            p->unwoken_bytes += (size_t)n * (size_t)elsize_of[dtype];
            if (++p->unwoken_jobs >= WAKE_JOBS || p->unwoken_bytes >= WAKE_BYTES) {
                p->unwoken_bytes = 0;
                p->unwoken_jobs = 0;
                if (p->asleep)
                    pthread_cond_broadcast(&p->awork);
            }
        }
    }
    pthread_mutex_unlock(&p->mu);
    return rc ? rc : aid;
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
    wake_all(p); /* what it waits for may be queued below a batch */
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
    wake_all(p); /* the sleeping threads must finish the work first */
    while (p->analyzed < p->next_aid || p->eq.len || p->writing || !p->flushed)
        pthread_cond_wait(&p->done, &p->mu);
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
        for (int i = 0; i < AN_BLOCK; i++)
            free(p->blocks[b][i].sample);
        free(p->blocks[b]);
        p->blocks[b] = NULL;
    }
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
