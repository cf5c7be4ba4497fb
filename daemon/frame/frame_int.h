/*
 * daemon/frame/frame_int.h - what the files of the frame parser share and nobody
 * else sees: the parser's state, its one error helper, and the entry points
 * and tensor rules the framing (frame.c), the jansson path (frame_check.c)
 * and the fast tensor validator (frame_fast.c) call across files. Internal
 * names carry the frame__ prefix.
 */
#ifndef CAPD_DAEMON_FRAME_INT_H
#define CAPD_DAEMON_FRAME_INT_H

#include <locale.h>

#include "daemon/frame/frame.h"

#define FRAME__ERROR_MAX 320

enum frame__state { FRAME__ST_HEADER, FRAME__ST_PAYLOAD, FRAME__ST_DONE, FRAME__ST_ERROR };

struct frame_parser {
    struct frame_limits lim;
    frame_cb cb;
    void *ud;

    enum frame__state state;
    int err;
    bool finished;
    char errbuf[FRAME__ERROR_MAX];

    /* A header line that has not been terminated yet, or the header of the
     * frame whose payload is being buffered. */
    char *line;
    size_t line_len;
    size_t line_cap;

    /* The frame being assembled while in FRAME__ST_PAYLOAD; cur.hdr_ is owned. */
    struct frame cur;
    unsigned char *pay;
    uint64_t pay_len;
    size_t pay_cap;

    uint64_t headers;   /* header lines accepted so far */
    uint64_t delivered; /* frames the callback accepted */
    uint64_t payload_announced;
    uint64_t payload_delivered;
    int64_t last_seq;
    bool fast;
    locale_t c_locale; /* strtod_l() must not depend on the daemon's locale */
    /* NUL-terminated copies of the fast path's tensor strings, and where its
     * stats are in the header text (NULL: absent), for frame_tensor_stats(). */
    char tstr[FRAME_MAX_KEY + 1 + FRAME_MAX_DTYPE + 1 + FRAME_HASH_MAX + 1];
    bool stats_fast;
    const char *stat_at[9];
    bool saw_hello;
    bool saw_env;
    bool saw_end;
    char *end_status;
    char *end_reason;
};

/* A protocol violation in the frame whose header is being checked: the
 * error becomes sticky, prefixed with "frame N: ", and the half-built frame
 * is released. Returns -EPROTO (frame.c). */
__attribute__((format(printf, 2, 3))) int frame__bad(struct frame_parser *p, const char *fmt, ...);

/* Parses one header line with jansson and checks it against the protocol;
 * the authoritative path for every kind, and the one that words every error.
 * Fills p->cur (kind, the owned tree, the tensor fields) and *nbytes_out.
 * Returns 0 or the sticky error (frame_check.c). */
int frame__slow_header(struct frame_parser *p, const char *text, size_t len, uint64_t *nbytes_out);

/* Returns true when the line is a valid tensor header, with p->cur.tensor
 * and *nbytes_out filled; false to let frame__slow_header() decide. It never
 * accepts a header that frame__slow_header() rejects (frame_fast.c). */
bool frame__fast_tensor(struct frame_parser *p, const char *text, size_t len, uint64_t *nbytes_out);

/* The tensor rules both validation paths apply (frame_check.c). */

/* The members of "stats" in frame_stats order, each list NULL-terminated:
 * the five reals, and the four counts. */
extern const char *const frame__stats_reals[];
extern const char *const frame__stats_counts[];

/* Bytes per element of the dtypes whose size is known; 0 means unknown, and
 * a payload of an unknown dtype is only checked against the limits. */
unsigned frame__dtype_size(const char *d);

/* Whether s[0..n) is FRAME_HASH_MIN..FRAME_HASH_MAX lowercase hex digits. */
bool frame__hash_ok(const char *s, size_t n);

/* The algorithm named by s[0..n), or -1 when the protocol knows no such
 * name; a hash of a named algorithm must be FRAME__HASH_ALG_DIGITS long. */
#define FRAME__HASH_ALG_DIGITS 32
int frame__hash_alg_of(const char *s, size_t n);

enum frame__pay {
    FRAME__PAY_OK,
    FRAME__PAY_STATS_WITH_PAYLOAD,
    FRAME__PAY_FULL_SIZE,
    FRAME__PAY_SAMPLE_SIZE
};

/* Whether `nbytes` is the payload the tensor's capture level says it is,
 * given `isz` = frame__dtype_size() of its dtype. */
enum frame__pay frame__payload_check(const struct frame_tensor *t, unsigned isz, uint64_t nbytes);

#endif
