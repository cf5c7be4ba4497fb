/* frame.h: the incremental parser of the runner protocol (docs/protocol.md).
 *
 * A runner writes frames on a pipe: one line of JSON (the header, at most
 * max_header bytes including its '\n'), then exactly `nbytes` raw bytes when
 * the header says so. The caller owns the pipe: it reads whatever the kernel
 * hands it (1 byte or 64 KiB+) and passes it to frame_feed(); the parser calls
 * back once per complete, validated frame. The parser does no I/O and never
 * holds more than one header line plus one payload, each below its limit.
 *
 * Any violation of the protocol is sticky: frame_feed() and frame_finish()
 * return -EPROTO from then on and frame_error() says why in one human line
 * ("frame 12: tensor header missing integer field \"seq\""). Frames in
 * messages are numbered from 1 (the hello frame is frame 1).
 *
 * Typical use on the daemon's loop:
 *
 *     frame_parser_new(&limits, on_frame, cell, &fp);
 *     on every read:  rc = frame_feed(fp, buf, n);   (rc != 0: end the cell)
 *     on EOF:         rc = frame_finish(fp);
 *         0         the stream ended right after a complete `end` frame
 *         -ENODATA  clean frame boundary but no `end` frame (outcome `failed`)
 *         -EPROTO   cut mid-header or mid-payload (outcome `protocol_error`)
 */
#ifndef CAPD_DAEMON_FRAME_H
#define CAPD_DAEMON_FRAME_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include <jansson.h>

#define FRAME_PROTOCOL_VERSION 1

/* Defaults of the configurable limits (docs/protocol.md, "Limits"). */
#define FRAME_DEFAULT_MAX_HEADER        65536u         /* bytes, including '\n' */
#define FRAME_DEFAULT_MAX_PAYLOAD       (256ull << 20) /* one payload: 256 MiB */
#define FRAME_DEFAULT_MAX_FRAMES        2000000ull     /* frames per stream */
#define FRAME_DEFAULT_MAX_TOTAL_PAYLOAD (8ull << 30)   /* payload bytes per stream */

/* Fixed limits of the protocol itself. */
#define FRAME_HARD_MAX_HEADER    (16u << 20) /* frame_parser_new() refuses more */
#define FRAME_MAX_KEY            512         /* tensor key, bytes */
#define FRAME_MAX_DTYPE          32          /* dtype name, bytes */
#define FRAME_MAX_NDIM           16
#define FRAME_HASH_MIN           8 /* hex digits */
#define FRAME_HASH_MAX           128
#define FRAME_MAX_TIMING_SAMPLES 1000000
#define FRAME_MAX_TIMING_CPUS    4096 /* CPU numbers in a timing frame's "cpus" */
#define FRAME_MAX_PROFILE        4096 /* modules, or operators, in a profile frame */

struct frame_limits {
    size_t max_header;          /* longest header line, '\n' included */
    uint64_t max_payload;       /* largest `nbytes` of one frame */
    uint64_t max_frames;        /* frames per stream */
    uint64_t max_total_payload; /* sum of `nbytes` over the stream */
};

enum frame_kind {
    FRAME_HELLO,
    FRAME_ENV,
    FRAME_TENSOR,
    FRAME_NONDET, /* "nondeterministic" */
    FRAME_TIMING,
    FRAME_MEMORY,
    FRAME_NOTE,
    FRAME_PROFILE, /* a profiled process's module and operator times */
    FRAME_END,
    FRAME_UNKNOWN /* a kind this daemon does not know: framed, then ignored */
};

enum frame_capture {
    FRAME_CAPTURE_STATS,  /* no payload */
    FRAME_CAPTURE_SAMPLE, /* payload: strided sample, raw, in dtype */
    FRAME_CAPTURE_FULL    /* payload: every element, raw, C-contiguous */
};

/* The algorithm of a tensor's "hash" (its "hash_alg"; absent means
 * blake2b-128, what every runner wrote before the field). Both name 128
 * bits, 32 hex digits. Hashes of different algorithms say nothing about
 * each other: the comparison falls back to statistics and samples. */
enum frame_hash_alg {
    FRAME_HASH_BLAKE2B_128, /* "blake2b-128" */
    FRAME_HASH_XXH3_128,    /* "xxh3-128", non-cryptographic */
    FRAME_HASH_ALG_COUNT
};

/* The protocol's name of an algorithm ("blake2b-128", "xxh3-128"). */
const char *frame_hash_alg_name(enum frame_hash_alg a);

/* The statistics of a tensor header, from frame_tensor_stats(). A real that
 * is null (no finite element) or absent is NAN; a count that is absent is -1. */
struct frame_stats {
    double min, max, mean, std, l2;
    int64_t nan, pinf, ninf, zeros;
};

/* The validated fields of a tensor header, so that the consumer's hot path
 * needs no JSON at all. Strings are NUL-terminated and borrowed. */
struct frame_tensor {
    int64_t seq;
    const char *key;
    size_t key_len;
    const char *dtype;
    const char *hash; /* lowercase hex, FRAME_HASH_MIN..FRAME_HASH_MAX digits */
    enum frame_hash_alg hash_alg;
    enum frame_capture capture;
    int ndim;
    int64_t shape[FRAME_MAX_NDIM];
    int64_t numel;
};

/* One complete frame. Everything is borrowed and valid only during the
 * callback; copy what must outlive it (or json_incref the header). */
struct frame {
    enum frame_kind kind;
    uint64_t index;       /* 1-based position in the stream */
    const char *hdr_text; /* the raw header line, without '\n'; NOT NUL-terminated */
    size_t hdr_len;
    const unsigned char *payload; /* NULL when nbytes == 0 */
    uint64_t nbytes;
    struct frame_tensor tensor;  /* valid when kind == FRAME_TENSOR */
    json_t *hdr_;                /* private: use frame_header() */
    struct frame_parser *owner_; /* private */
};

/* The header as a JSON object, borrowed like the rest of the frame. Tensor
 * headers are validated without building a JSON tree (that is most of the
 * ingest cost), so for them the tree is parsed on the first call; other kinds
 * already have it. NULL only when out of memory. */
json_t *frame_header(const struct frame *f);

/* The stats of a tensor frame, converted on demand: an ingest that stores
 * the header text never pays for five decimal-to-double conversions per
 * tensor. Returns 0, or -EINVAL when f is not a tensor frame. */
int frame_tensor_stats(const struct frame *f, struct frame_stats *out);

/* Called once per complete frame, in stream order. A non-zero return stops
 * the parser: frame_feed() returns that value, now and on every later call. */
typedef int (*frame_cb)(void *ud, const struct frame *f);

struct frame_parser;

/* Fills `l` with the FRAME_DEFAULT_* limits. */
void frame_limits_default(struct frame_limits *l);

/* Creates a parser. `l` may be NULL for the defaults. Returns 0, -EINVAL (a
 * limit out of range, or no callback) or -ENOMEM. */
int frame_parser_new(const struct frame_limits *l, frame_cb cb, void *ud,
                     struct frame_parser **out);

/* Parses `len` more bytes of the stream. Returns 0, -EPROTO on a protocol
 * violation, -ENOMEM, or the callback's non-zero return. Errors are sticky. */
int frame_feed(struct frame_parser *p, const void *buf, size_t len);

/* Declares EOF. Returns 0 if the stream ended right after its end frame,
 * -ENODATA if it ended on a frame boundary without one (frame_error() says so
 * too), -EPROTO if it was cut inside a header line or a payload, or the
 * earlier sticky error. Idempotent. */
int frame_finish(struct frame_parser *p);

/* The reason of the current error, or "" when there is none. */
const char *frame_error(const struct frame_parser *p);

/* Whether a complete end frame was delivered, and its status (ok,
 * unsupported, failed) and optional reason; NULL before that / when absent. */
bool frame_saw_end(const struct frame_parser *p);
const char *frame_end_status(const struct frame_parser *p);
const char *frame_end_reason(const struct frame_parser *p);

/* Frames the callback accepted, and the payload bytes they carried. */
uint64_t frame_count(const struct frame_parser *p);
uint64_t frame_payload_bytes(const struct frame_parser *p);

/* Tensor headers go through a fast validator that accepts only plain ASCII,
 * escape-free, shallow JSON and hands anything else to jansson, which then
 * decides and words the error. Both paths accept exactly the same headers;
 * tests turn the fast one off to prove it. On by default. */
void frame_parser_set_fast_path(struct frame_parser *p, bool on);

/* "hello", "env", ..., "unknown". */
const char *frame_kind_name(enum frame_kind k);

void frame_parser_free(struct frame_parser *p);

#endif
