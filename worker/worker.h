/*
 * worker/worker.h - capd-cell, the worker of a remote cell attempt
 * (docs/scale.md, "Running capd-cell by hand"; the contract with capd is
 * the /v1/attempts endpoints of issue 21).
 *
 * capd-cell fetches an attempt's spec from capd, runs the runner it names
 * in a scratch dir of its own, streams the runner's frame stream (fd 3)
 * and its stdout+stderr back to capd in chunks, and reports how the
 * runner ended. It talks to capd over HTTP(S) only and links util/,
 * libcurl and jansson: no code of capd's daemon.
 *
 * This header is what the worker's parts share and what its tests reach:
 *   - the spec rewriting (spec.c): capd's spec reply, taken apart and
 *     pointed at the local scratch dir;
 *   - the chunk bookkeeping (chunk.c): what to send next, and where a
 *     stream stands after capd's answer; pure, table-tested;
 *   - the HTTP client (http.c) and the runner's process and streams
 *     (run.c), which capd_cell.c, the program, drives.
 *
 * Conventions: 0 or -errno, a message in a `char **err` (util/err.h).
 */
#ifndef CAPD_WORKER_H
#define CAPD_WORKER_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

#include "util/buf.h"

#ifndef CAPD_VERSION
#define CAPD_VERSION "unknown"
#endif

/* Exit codes: capd accepted the finish (whatever the cell's outcome), capd
 * could not be reached or refused a request, the command line was wrong. */
#define WORKER_EXIT_OK    0
#define WORKER_EXIT_ERROR 1
#define WORKER_EXIT_USAGE 2

#define WORKER_CHUNK_DEFAULT (256u * 1024u)        /* --chunk: bytes buffered before a POST */
#define WORKER_CHUNK_MAX     (16u * 1024u * 1024u) /* the largest --chunk */
#define WORKER_POST_MS       100                   /* a POST of what waits, at the latest */
#define WORKER_RETRIES       12 /* --retries' default: about 36 s, a capd restart */
#define WORKER_RETRIES_MAX   100
#define WORKER_BACKOFF_MS    100                   /* the first retry's wait, doubled each time */
#define WORKER_BACKOFF_MAX   5000                  /* the longest wait between two tries */
#define WORKER_KILL_GRACE_MS 5000                  /* SIGTERM to SIGKILL of the runner's group */
#define WORKER_MEM_MS        100                   /* the memory watchdog's sampling period */
#define WORKER_SPEC_MAX      (16u * 1024u * 1024u) /* bytes of capd's spec reply, or any */
#define WORKER_ARGV_MAX      4096                  /* words of the runner's argv */
#define WORKER_ENV_MAX       4096                  /* variables of its environment */
#define WORKER_TOKEN_MAX     256                   /* bytes of a token */

/* ---- the spec ---- */

/* capd's spec reply, rewritten for this worker's scratch dir. */
struct worker_spec {
    long long attempt;
    char **argv;     /* NULL-terminated; argv[0] is the program execve runs */
    char **env;      /* "K=V", NULL-terminated: exactly what the runner gets */
    char *cell_json; /* the text of SCRATCH/cell.json */
    long long timeout_s;
    /* the runner's process group's resident memory limit (0: none), held
     * by the worker's watchdog (run.c) as capd's own holds a local cell's */
    long long memory_max_bytes;
    size_t chunk_max_bytes; /* capd's largest POST body; 0 when it names none */
    uint64_t frames_received, log_received;
};

/*
 * Takes capd's reply to GET /v1/attempts/N/spec (LEN bytes of JSON at
 * REPLY) apart for the local scratch dir SCRATCH (an absolute path): in
 * every env value (and in spec.reference.env, the paired control build's)
 * the prefix reply.scratch (capd's own scratch path) becomes SCRATCH, where
 * it is the whole value or followed by '/'; CAPD_CELL_SPEC is
 * SCRATCH/cell.json; the cell spec gets "frame_fd": 3 and "scratch":
 * SCRATCH. 0, -EINVAL with *ERR naming the field that is wrong, -E2BIG
 * past a limit above, or -ENOMEM. OUT is zeroed first and holds nothing
 * on failure.
 */
int worker_spec_rewrite(const char *reply, size_t len, const char *scratch, struct worker_spec *out,
                        char **err);
void worker_spec_free(struct worker_spec *s);

/* ---- the chunk bookkeeping of one stream ---- */

/*
 * A stream (frames or log) as the worker holds it: capd holds its first
 * ACKED bytes; the next BUFFERED bytes were read from the runner and wait
 * to be acknowledged. The worker sends from ACKED, so a retried POST
 * repeats the same offset and capd stores nothing twice.
 */
struct worker_window {
    uint64_t acked;
    size_t buffered;
};

/* One POST: LEN bytes from the start of the buffer, at stream OFFSET. */
struct worker_chunk {
    uint64_t offset;
    size_t len;
};

/*
 * Whether a POST is due and of what: when CHUNK (the largest body, >= 1)
 * bytes wait, or when some wait and DUE (WORKER_POST_MS passed since the
 * last POST) or FLUSH (the runner has ended) is set. The chunk is at most
 * CHUNK bytes. Returns false, and leaves C alone, when nothing is to be
 * sent.
 */
bool worker_chunk_next(const struct worker_window *w, size_t chunk, bool due, bool flush,
                       struct worker_chunk *c);

enum worker_ack {
    WORKER_ACK_OK,     /* *DROP bytes leave the buffer; the next POST is at RECEIVED */
    WORKER_ACK_BEHIND, /* capd holds less than it acknowledged before */
    WORKER_ACK_AHEAD,  /* capd names bytes the worker never read */
};

/*
 * Where W stands after capd named RECEIVED, the "received" of a 200 or a
 * 409 (or the frames_received/log_received of a finish's 409): the bytes
 * up to RECEIVED leave the buffer (*DROP of them) and W->acked becomes
 * RECEIVED. W is unchanged unless the answer is WORKER_ACK_OK.
 */
enum worker_ack worker_chunk_ack(struct worker_window *w, uint64_t received, size_t *drop);

/* ---- HTTP to capd (http.c) ---- */

struct worker_http;

/* One answer: STATUS 0 when no HTTP reply came (WHY says what curl met);
 * else the body (BODY, at most WORKER_SPEC_MAX bytes) and capd's error
 * text, when the body has one (ERROR, "" when not). */
struct worker_reply {
    long status;
    struct ubuf body;
    char why[256];
    char error[512];
};

/* A client of BASE (http[s]://..., no trailing '/') sending TOKEN; CACERT
 * (may be NULL) the CA file a self-signed capd is checked against. */
int worker_http_open(struct worker_http **out, const char *base, const char *token,
                     const char *cacert);
void worker_http_close(struct worker_http *c);
const char *worker_http_base(const struct worker_http *c);

/* One request of METHOD on PATH (after BASE), with BODY of LEN bytes of
 * type CTYPE when CTYPE is not NULL. Fills R (the caller frees R->body);
 * 0, or -ENOMEM. A connection error or timeout is R->status 0, not an
 * error of this function. */
int worker_http_request(struct worker_http *c, const char *method, const char *path,
                        const char *ctype, const void *body, size_t len, struct worker_reply *r);
void worker_reply_free(struct worker_reply *r);

/* worker_http_request, tried again after worker_backoff_ms() while the
 * answer is worth another try (worker_reply_retryable), at most RETRIES
 * more times; each retry is said on stderr unless QUIET. *TRIES gets how
 * many were made. */
int worker_http_retry(struct worker_http *c, const char *method, const char *path,
                      const char *ctype, const void *body, size_t len, int retries, bool quiet,
                      struct worker_reply *r, int *tries);

/* Says on stderr that METHOD PATH failed after TRIES tries: the URL, what
 * curl met or the HTTP status, and capd's error text. */
void worker_request_failed(const struct worker_http *c, const char *method, const char *path,
                           const struct worker_reply *r, int tries);

/* Member KEY of R's JSON body: a non-negative integer (0, or -EINVAL when
 * it is absent or not one), or a string into OUT of N bytes ("" when it is
 * absent). */
int worker_reply_count(const struct worker_reply *r, const char *key, uint64_t *out);
void worker_reply_string(const struct worker_reply *r, const char *key, char *out, size_t n);

/* Whether R is worth another try: no reply at all, or a 5xx. */
bool worker_reply_retryable(const struct worker_reply *r);

/* The wait before try number TRY (1 for the first retry): WORKER_BACKOFF_MS
 * doubled TRY - 1 times, at most WORKER_BACKOFF_MAX. */
int worker_backoff_ms(int try);

/* ---- the runner (run.c) ---- */

struct worker_opts {
    long long attempt;
    const char *cacert;
    const char *scratch; /* an absolute path, already made and empty */
    size_t chunk;
    int retries;
    bool quiet;
};

/*
 * Runs the runner of SPEC in O->scratch and streams its output to capd
 * through C until capd accepted the finish: WORKER_EXIT_OK, or
 * WORKER_EXIT_ERROR with the reason on stderr (the request, the HTTP
 * status and capd's error text). Kills the runner's group on the way out
 * when it is still running.
 */
int worker_run(struct worker_http *c, const struct worker_opts *o, const struct worker_spec *spec);

/* Prints "capd-cell: " and the formatted message on stderr. */
void worker_say(const char *fmt, ...) __attribute__((format(printf, 1, 2)));

#endif
