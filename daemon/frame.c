/* frame.c: incremental, allocation-bounded parser of runner frames.
 *
 * The parser is a two-state machine (header line, payload) driven by whatever
 * chunks the caller read from the pipe. The hot path is a stream of small
 * tensor frames that arrive many to a read: for those we find each '\n' with
 * memchr, validate the line straight from the caller's buffer (with a
 * non-allocating validator for tensor headers, see "fast path" below, and
 * jansson for everything else), and when a payload is wholly inside the same
 * chunk we pass a pointer into that chunk too. Bytes are copied only when a
 * header line or a payload straddles two reads, and then with one memcpy per
 * read.
 *
 * Memory is bounded by the limits: the line buffer never exceeds max_header,
 * the payload buffer never exceeds the announced nbytes (itself checked
 * against max_payload before any byte is buffered), and it grows with what has
 * actually arrived, so a runner that announces 1 GiB and sends nothing costs
 * nothing.
 */
#include "daemon/frame.h"

#include <errno.h>
#include <inttypes.h>
#include <locale.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define FRAME_ERROR_MAX 320
#define LINE_BUF_MIN    4096
#define PAYLOAD_BUF_MIN 65536
/* A payload buffer larger than this is released after its frame, so one big
 * tensor does not pin its memory for the rest of the cell. */
#define PAYLOAD_BUF_KEEP (4u << 20)

enum parser_state { ST_HEADER, ST_PAYLOAD, ST_DONE, ST_ERROR };

struct frame_parser {
    struct frame_limits lim;
    frame_cb cb;
    void *ud;

    enum parser_state state;
    int err;
    bool finished;
    char errbuf[FRAME_ERROR_MAX];

    /* A header line that has not been terminated yet, or the header of the
     * frame whose payload is being buffered. */
    char *line;
    size_t line_len;
    size_t line_cap;

    /* The frame being assembled while in ST_PAYLOAD; cur.hdr_ is owned. */
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

static const char *const kind_names[] = {
    [FRAME_HELLO] = "hello",     [FRAME_ENV] = "env",
    [FRAME_TENSOR] = "tensor",   [FRAME_NONDET] = "nondeterministic",
    [FRAME_TIMING] = "timing",   [FRAME_MEMORY] = "memory",
    [FRAME_NOTE] = "note",       [FRAME_END] = "end",
    [FRAME_UNKNOWN] = "unknown",
};

const char *frame_kind_name(enum frame_kind k)
{
    if ((unsigned)k > FRAME_UNKNOWN)
        return "invalid";
    return kind_names[k];
}

/* The hot path sees mostly "tensor", so compare the first byte before
 * calling strcmp. */
static enum frame_kind kind_of(const char *s)
{
    switch (s[0]) {
    case 't':
        if (strcmp(s, "tensor") == 0)
            return FRAME_TENSOR;
        if (strcmp(s, "timing") == 0)
            return FRAME_TIMING;
        break;
    case 'h':
        if (strcmp(s, "hello") == 0)
            return FRAME_HELLO;
        break;
    case 'e':
        if (strcmp(s, "env") == 0)
            return FRAME_ENV;
        if (strcmp(s, "end") == 0)
            return FRAME_END;
        break;
    case 'n':
        if (strcmp(s, "note") == 0)
            return FRAME_NOTE;
        if (strcmp(s, "nondeterministic") == 0)
            return FRAME_NONDET;
        break;
    case 'm':
        if (strcmp(s, "memory") == 0)
            return FRAME_MEMORY;
        break;
    }
    return FRAME_UNKNOWN;
}

static const char *type_name(const json_t *v)
{
    switch (json_typeof(v)) {
    case JSON_OBJECT:
        return "object";
    case JSON_ARRAY:
        return "array";
    case JSON_STRING:
        return "string";
    case JSON_INTEGER:
        return "integer";
    case JSON_REAL:
        return "real";
    case JSON_TRUE:
        return "true";
    case JSON_FALSE:
        return "false";
    case JSON_NULL:
        return "null";
    }
    return "?";
}

/* Every error goes through here so that it becomes sticky, the half-built
 * frame is released, and the reason is kept for frame_error(). */
static int vfail(struct frame_parser *p, int rc, bool with_frame, const char *fmt, va_list ap)
{
    int n = 0;

    if (with_frame)
        n = snprintf(p->errbuf, sizeof(p->errbuf), "frame %" PRIu64 ": ", p->headers + 1);
    if (n < 0 || (size_t)n >= sizeof(p->errbuf))
        n = 0;
    vsnprintf(p->errbuf + n, sizeof(p->errbuf) - (size_t)n, fmt, ap);
    json_decref(p->cur.hdr_);
    p->cur.hdr_ = NULL;
    p->state = ST_ERROR;
    p->err = rc;
    return rc;
}

__attribute__((format(printf, 3, 4))) static int fail(struct frame_parser *p, int rc,
                                                      const char *fmt, ...)
{
    va_list ap;

    va_start(ap, fmt);
    vfail(p, rc, false, fmt, ap);
    va_end(ap);
    return rc;
}

/* A protocol violation in the frame whose header is being checked. */
__attribute__((format(printf, 2, 3))) static int bad(struct frame_parser *p, const char *fmt, ...)
{
    va_list ap;

    va_start(ap, fmt);
    vfail(p, -EPROTO, true, fmt, ap);
    va_end(ap);
    return -EPROTO;
}

void frame_limits_default(struct frame_limits *l)
{
    l->max_header = FRAME_DEFAULT_MAX_HEADER;
    l->max_payload = FRAME_DEFAULT_MAX_PAYLOAD;
    l->max_frames = FRAME_DEFAULT_MAX_FRAMES;
    l->max_total_payload = FRAME_DEFAULT_MAX_TOTAL_PAYLOAD;
}

int frame_parser_new(const struct frame_limits *l, frame_cb cb, void *ud, struct frame_parser **out)
{
    struct frame_parser *p;

    *out = NULL;
    if (!cb)
        return -EINVAL;
    if (l && (l->max_header < 2 || l->max_header > FRAME_HARD_MAX_HEADER ||
              l->max_payload > SIZE_MAX || l->max_frames == 0))
        return -EINVAL;
    p = calloc(1, sizeof(*p));
    if (!p)
        return -ENOMEM;
    if (l)
        p->lim = *l;
    else
        frame_limits_default(&p->lim);
    p->cb = cb;
    p->ud = ud;
    p->state = ST_HEADER;
    p->last_seq = -1;
    p->fast = true;
    p->c_locale = newlocale(LC_NUMERIC_MASK, "C", (locale_t)0);
    if (!p->c_locale) {
        free(p);
        return -ENOMEM;
    }
    *out = p;
    return 0;
}

void frame_parser_free(struct frame_parser *p)
{
    if (!p)
        return;
    json_decref(p->cur.hdr_);
    if (p->c_locale)
        freelocale(p->c_locale);
    free(p->line);
    free(p->pay);
    free(p->end_status);
    free(p->end_reason);
    free(p);
}

/* Grows the line buffer geometrically; `need` never exceeds max_header
 * because the caller checked the line length first. */
static int line_reserve(struct frame_parser *p, size_t need)
{
    size_t cap = p->line_cap ? p->line_cap : LINE_BUF_MIN;
    char *nl;

    if (need <= p->line_cap)
        return 0;
    while (cap < need)
        cap *= 2;
    if (cap > p->lim.max_header)
        cap = p->lim.max_header;
    nl = realloc(p->line, cap);
    if (!nl)
        return fail(p, -ENOMEM, "out of memory buffering a %zu-byte header line", need);
    p->line = nl;
    p->line_cap = cap;
    return 0;
}

/* Same for the payload buffer, capped at the announced size of the frame. */
static int pay_reserve(struct frame_parser *p, uint64_t need)
{
    size_t cap = p->pay_cap ? p->pay_cap : PAYLOAD_BUF_MIN;
    unsigned char *np;

    if (need <= p->pay_cap)
        return 0;
    while (cap < need)
        cap = cap > SIZE_MAX / 2 ? SIZE_MAX : cap * 2;
    if (cap > p->cur.nbytes)
        cap = (size_t)p->cur.nbytes;
    np = realloc(p->pay, cap);
    if (!np)
        return fail(p, -ENOMEM, "out of memory buffering a %" PRIu64 "-byte payload",
                    p->cur.nbytes);
    p->pay = np;
    p->pay_cap = cap;
    return 0;
}

/* ---- header validation -------------------------------------------------- */

static int get_field(struct frame_parser *p, json_t *h, const char *kind, const char *name,
                     json_type type, const char *what, bool required, json_t **out)
{
    json_t *v = json_object_get(h, name);

    *out = v;
    if (!v) {
        if (required)
            return bad(p, "%s header missing %s field \"%s\"", kind, what, name);
        return 0;
    }
    if (json_typeof(v) != type)
        return bad(p, "%s field \"%s\" must be %s %s, got %s", kind, name,
                   type == JSON_INTEGER || type == JSON_OBJECT || type == JSON_ARRAY ? "an" : "a",
                   what, type_name(v));
    return 0;
}

static int need_str(struct frame_parser *p, json_t *h, const char *kind, const char *name,
                    json_t **out)
{
    return get_field(p, h, kind, name, JSON_STRING, "string", true, out);
}

static int opt_str(struct frame_parser *p, json_t *h, const char *kind, const char *name)
{
    json_t *v;

    return get_field(p, h, kind, name, JSON_STRING, "string", false, &v);
}

static int check_int(struct frame_parser *p, json_t *h, const char *kind, const char *name,
                     bool required, json_int_t *out)
{
    json_t *v;
    int rc = get_field(p, h, kind, name, JSON_INTEGER, "integer", required, &v);

    if (rc || !v)
        return rc;
    if (json_integer_value(v) < 0)
        return bad(p, "%s field \"%s\" must be >= 0, got %" JSON_INTEGER_FORMAT, kind, name,
                   json_integer_value(v));
    if (out)
        *out = json_integer_value(v);
    return 0;
}

static int check_enum(struct frame_parser *p, json_t *h, const char *kind, const char *name,
                      bool required, const char *const *allowed, const char **out)
{
    json_t *v;
    int rc = get_field(p, h, kind, name, JSON_STRING, "string", required, &v);
    const char *s;

    if (rc || !v)
        return rc;
    s = json_string_value(v);
    for (size_t i = 0; allowed[i]; i++) {
        if (strcmp(s, allowed[i]) == 0) {
            if (out)
                *out = s;
            return 0;
        }
    }
    return bad(p, "%s field \"%s\" has invalid value \"%.64s\"", kind, name, s);
}

/* True when the UTF-8 string holds a C0 or C1 control character or DEL;
 * jansson already guarantees the encoding is valid. */
static bool has_control(const char *s, size_t n)
{
    for (size_t i = 0; i < n; i++) {
        unsigned char c = (unsigned char)s[i];

        if (c < 0x20 || c == 0x7f)
            return true;
        if (c == 0xc2 && i + 1 < n && (unsigned char)s[i + 1] >= 0x80 &&
            (unsigned char)s[i + 1] <= 0x9f)
            return true;
    }
    return false;
}

/* Bytes per element of the dtypes whose size we know; 0 means unknown, and a
 * payload of an unknown dtype is only checked against the limits. */
static unsigned dtype_size(const char *d)
{
    static const struct {
        const char *name;
        unsigned size;
    } sizes[] = {
        {"float32", 4},
        {"float64", 8},
        {"float16", 2},
        {"bfloat16", 2},
        {"int8", 1},
        {"uint8", 1},
        {"int16", 2},
        {"int32", 4},
        {"int64", 8},
        {"bool", 1},
        {"complex64", 8},
        {"complex128", 16},
        {"complex32", 4},
        {"uint16", 2},
        {"uint32", 4},
        {"uint64", 8},
        {"qint8", 1},
        {"quint8", 1},
        {"qint32", 4},
        {"float8_e4m3fn", 1},
        {"float8_e5m2", 1},
        {"float8_e4m3fnuz", 1},
        {"float8_e5m2fnuz", 1},
    };

    for (size_t i = 0; i < sizeof(sizes) / sizeof(sizes[0]); i++)
        if (strcmp(d, sizes[i].name) == 0)
            return sizes[i].size;
    return 0;
}

static const char *const stats_reals[] = {"min", "max", "mean", "std", "l2", NULL};
static const char *const stats_counts[] = {"nan", "pinf", "ninf", "zeros", NULL};

/* The stats members are optional, but when present they must have the types
 * the comparison engine reads: numbers (or null when nothing was finite) and
 * non-negative counts. */
static int check_stats(struct frame_parser *p, json_t *stats)
{
    for (size_t i = 0; stats_reals[i]; i++) {
        json_t *v = json_object_get(stats, stats_reals[i]);

        if (v && !json_is_number(v) && !json_is_null(v))
            return bad(p, "tensor field \"stats.%s\" must be a number or null, got %s",
                       stats_reals[i], type_name(v));
    }
    for (size_t i = 0; stats_counts[i]; i++) {
        json_t *v = json_object_get(stats, stats_counts[i]);

        if (v && (!json_is_integer(v) || json_integer_value(v) < 0))
            return bad(p, "tensor field \"stats.%s\" must be a non-negative integer",
                       stats_counts[i]);
    }
    return 0;
}

enum pay_check { PAY_OK, PAY_STATS_WITH_PAYLOAD, PAY_FULL_SIZE, PAY_SAMPLE_SIZE };

static uint64_t payload_full_size(const struct frame_tensor *t, unsigned isz)
{
    uint64_t all;

    if (__builtin_mul_overflow((uint64_t)t->numel, (uint64_t)isz, &all))
        return UINT64_MAX;
    return all;
}

/* Shared by both validation paths. */
static enum pay_check payload_check(const struct frame_tensor *t, unsigned isz, uint64_t nbytes)
{
    uint64_t all;

    if (t->capture == FRAME_CAPTURE_STATS)
        return nbytes ? PAY_STATS_WITH_PAYLOAD : PAY_OK;
    if (!isz)
        return PAY_OK;
    all = payload_full_size(t, isz);
    if (t->capture == FRAME_CAPTURE_FULL && nbytes != all)
        return PAY_FULL_SIZE;
    if (t->capture == FRAME_CAPTURE_SAMPLE && (nbytes > all || nbytes % isz))
        return PAY_SAMPLE_SIZE;
    return PAY_OK;
}

static bool hash_ok(const char *s, size_t n)
{
    if (n < FRAME_HASH_MIN || n > FRAME_HASH_MAX)
        return false;
    for (size_t i = 0; i < n; i++)
        if (!((s[i] >= '0' && s[i] <= '9') || (s[i] >= 'a' && s[i] <= 'f')))
            return false;
    return true;
}

static int check_tensor(struct frame_parser *p, json_t *h, uint64_t nbytes)
{
    struct frame_tensor *t = &p->cur.tensor;
    json_t *v;
    json_int_t seq, numel;
    int64_t prod = 1;
    size_t n, i;
    const char *s;
    unsigned isz;
    uint64_t all;
    int rc;

    if (!p->saw_env)
        return bad(p, "tensor before env");

    if ((rc = check_int(p, h, "tensor", "seq", true, &seq)))
        return rc;
    if (seq <= p->last_seq)
        return bad(p,
                   "tensor seq %" JSON_INTEGER_FORMAT
                   " is not strictly increasing (previous %" PRId64 ")",
                   seq, p->last_seq);
    t->seq = seq;

    if ((rc = need_str(p, h, "tensor", "key", &v)))
        return rc;
    n = json_string_length(v);
    s = json_string_value(v);
    if (n == 0 || n > FRAME_MAX_KEY)
        return bad(p, "tensor key must be 1..%d bytes, got %zu", FRAME_MAX_KEY, n);
    if (has_control(s, n))
        return bad(p, "tensor key \"%.64s\" contains a control character", s);
    t->key = s;
    t->key_len = n;

    if ((rc = need_str(p, h, "tensor", "dtype", &v)))
        return rc;
    n = json_string_length(v);
    s = json_string_value(v);
    if (n == 0 || n > FRAME_MAX_DTYPE || has_control(s, n))
        return bad(p, "tensor dtype must be 1..%d printable bytes", FRAME_MAX_DTYPE);
    t->dtype = s;

    if ((rc = get_field(p, h, "tensor", "shape", JSON_ARRAY, "array", true, &v)))
        return rc;
    n = json_array_size(v);
    if (n > FRAME_MAX_NDIM)
        return bad(p, "tensor shape has %zu dimensions, more than %d", n, FRAME_MAX_NDIM);
    for (i = 0; i < n; i++) {
        json_t *d = json_array_get(v, i);

        if (!json_is_integer(d) || json_integer_value(d) < 0)
            return bad(p, "tensor shape[%zu] must be a non-negative integer", i);
        t->shape[i] = json_integer_value(d);
        if (prod >= 0 && __builtin_mul_overflow(prod, t->shape[i], &prod))
            prod = -1; /* overflowed; no numel can match */
    }
    t->ndim = (int)n;

    if ((rc = check_int(p, h, "tensor", "numel", true, &numel)))
        return rc;
    if (prod < 0)
        return bad(p, "tensor shape product overflows 64 bits");
    if (numel != prod)
        return bad(p, "tensor numel %" JSON_INTEGER_FORMAT " does not match shape product %" PRId64,
                   numel, prod);
    t->numel = numel;

    if ((rc = get_field(p, h, "tensor", "stats", JSON_OBJECT, "object", true, &v)))
        return rc;
    if ((rc = check_stats(p, v)))
        return rc;

    if ((rc = need_str(p, h, "tensor", "hash", &v)))
        return rc;
    n = json_string_length(v);
    s = json_string_value(v);
    if (n < FRAME_HASH_MIN || n > FRAME_HASH_MAX)
        return bad(p, "tensor hash must be %d..%d hex digits, got %zu", FRAME_HASH_MIN,
                   FRAME_HASH_MAX, n);
    if (!hash_ok(s, n))
        return bad(p, "tensor hash must be lowercase hex, got \"%.130s\"", s);
    t->hash = s;

    if ((rc = need_str(p, h, "tensor", "capture", &v)))
        return rc;
    s = json_string_value(v);
    if (strcmp(s, "stats") == 0)
        t->capture = FRAME_CAPTURE_STATS;
    else if (strcmp(s, "sample") == 0)
        t->capture = FRAME_CAPTURE_SAMPLE;
    else if (strcmp(s, "full") == 0)
        t->capture = FRAME_CAPTURE_FULL;
    else
        return bad(p, "tensor capture must be stats, sample or full, got \"%.32s\"", s);

    /* The payload must be what the capture level says it is, so that a
     * comparison never reads a truncated or padded tensor. */
    isz = dtype_size(t->dtype);
    all = payload_full_size(t, isz);
    switch (payload_check(t, isz, nbytes)) {
    case PAY_OK:
        break;
    case PAY_STATS_WITH_PAYLOAD:
        return bad(p, "tensor with capture \"stats\" must not carry a payload (nbytes %" PRIu64 ")",
                   nbytes);
    case PAY_FULL_SIZE:
        return bad(p,
                   "tensor with capture \"full\" needs nbytes %" PRIu64 " (%" PRId64
                   " x %s), got %" PRIu64,
                   all, t->numel, t->dtype, nbytes);
    case PAY_SAMPLE_SIZE:
        return bad(p,
                   "tensor with capture \"sample\" has nbytes %" PRIu64
                   ", not a multiple of %u up to %" PRIu64,
                   nbytes, isz, all);
    }

    /* Descriptive fields: optional, but typed. */
    if ((rc = opt_str(p, h, "tensor", "module")) || (rc = opt_str(p, h, "tensor", "phase")) ||
        (rc = opt_str(p, h, "tensor", "role")) ||
        (rc = opt_str(p, h, "tensor", "sample_positions")) ||
        (rc = check_int(p, h, "tensor", "call", false, NULL)))
        return rc;
    v = json_object_get(h, "index");
    if (v && !json_is_integer(v) && !json_is_string(v))
        return bad(p, "tensor field \"index\" must be an integer or a string, got %s",
                   type_name(v));

    p->last_seq = seq;
    return 0;
}

static const char *const phases[] = {"forward", "backward", NULL};
static const char *const levels[] = {"debug", "info", "warn", "error", NULL};
static const char *const statuses[] = {"ok", "unsupported", "failed", "oom", NULL};

static int check_timing(struct frame_parser *p, json_t *h)
{
    json_t *v;
    size_t n;
    int rc;

    if ((rc = check_enum(p, h, "timing", "phase", true, phases, NULL)))
        return rc;
    if ((rc = get_field(p, h, "timing", "samples_ns", JSON_ARRAY, "array", true, &v)))
        return rc;
    n = json_array_size(v);
    if (n > FRAME_MAX_TIMING_SAMPLES)
        return bad(p, "timing has %zu samples, more than %d", n, FRAME_MAX_TIMING_SAMPLES);
    for (size_t i = 0; i < n; i++) {
        json_t *s = json_array_get(v, i);

        if (!json_is_integer(s) || json_integer_value(s) < 0)
            return bad(p, "timing samples_ns[%zu] must be a non-negative integer", i);
    }
    if ((rc = check_int(p, h, "timing", "warmup", true, NULL)) ||
        (rc = check_int(p, h, "timing", "iterations", true, NULL)) ||
        (rc = check_int(p, h, "timing", "threads", true, NULL)) ||
        (rc = check_int(p, h, "timing", "process", false, NULL)) ||
        (rc = check_int(p, h, "timing", "processes", false, NULL)))
        return rc;
    v = json_object_get(h, "cpus");
    if (v && (!json_is_array(v) || json_array_size(v) > FRAME_MAX_TIMING_CPUS))
        return bad(p, "timing cpus must be an array of at most %d CPU numbers",
                   FRAME_MAX_TIMING_CPUS);
    return 0;
}

static int check_nondet(struct frame_parser *p, json_t *h)
{
    json_t *v;
    int rc;

    if ((rc = get_field(p, h, "nondeterministic", "keys", JSON_ARRAY, "array", true, &v)))
        return rc;
    for (size_t i = 0; i < json_array_size(v); i++) {
        json_t *k = json_array_get(v, i);

        if (!json_is_string(k) || json_string_length(k) == 0 ||
            json_string_length(k) > FRAME_MAX_KEY)
            return bad(p, "nondeterministic keys[%zu] must be a key string of 1..%d bytes", i,
                       FRAME_MAX_KEY);
    }
    return 0;
}

/* Checks one header against the protocol: ordering first (hello, env, end),
 * then the fields of its kind. Required fields are those protocol.md lists
 * without "optional"; fields we know are type-checked when present; fields we
 * do not know are ignored. */
static int check_header(struct frame_parser *p, json_t *h, enum frame_kind kind, uint64_t nbytes)
{
    json_t *v;
    json_int_t proto;
    int rc;

    if (!p->saw_hello && kind != FRAME_HELLO)
        return bad(p, "first frame must be hello, got kind \"%.32s\"",
                   json_string_value(json_object_get(h, "kind")));

    switch (kind) {
    case FRAME_TENSOR:
        return check_tensor(p, h, nbytes);
    case FRAME_HELLO:
        if (p->saw_hello)
            return bad(p, "duplicate hello");
        if ((rc = check_int(p, h, "hello", "protocol", true, &proto)))
            return rc;
        if (proto != FRAME_PROTOCOL_VERSION)
            return bad(p, "unsupported protocol version %" JSON_INTEGER_FORMAT " (expected %d)",
                       proto, FRAME_PROTOCOL_VERSION);
        if ((rc = need_str(p, h, "hello", "runner", &v)))
            return rc;
        p->saw_hello = true;
        return 0;
    case FRAME_ENV:
        if (p->saw_env)
            return bad(p, "duplicate env");
        if ((rc = get_field(p, h, "env", "fingerprint", JSON_OBJECT, "object", true, &v)) ||
            (rc = need_str(p, h, "env", "effective_width", &v)))
            return rc;
        p->saw_env = true;
        return 0;
    case FRAME_NONDET:
        return check_nondet(p, h);
    case FRAME_TIMING:
        return check_timing(p, h);
    case FRAME_MEMORY:
        if ((rc = check_int(p, h, "memory", "peak_rss_bytes", true, NULL)) ||
            (rc = check_int(p, h, "memory", "device_peak_bytes", false, NULL)))
            return rc;
        return 0;
    case FRAME_NOTE:
        if ((rc = check_enum(p, h, "note", "level", true, levels, NULL)) ||
            (rc = need_str(p, h, "note", "message", &v)))
            return rc;
        return 0;
    case FRAME_END:
        if ((rc = check_enum(p, h, "end", "status", true, statuses, NULL)) ||
            (rc = opt_str(p, h, "end", "reason")))
            return rc;
        return 0;
    case FRAME_UNKNOWN:
        return 0;
    }
    return 0;
}

/* ---- fast path for tensor headers ----------------------------------------
 *
 * jansson builds a tree of ~30 allocated values for a tensor header, which
 * costs more than everything else ingest does with the frame. This validator
 * walks the line once without allocating and fills struct frame_tensor. It is
 * deliberately partial: it accepts only what it can judge exactly (ASCII,
 * no escapes, objects of at most FAST_MAX_MEMBERS members, nesting up to
 * FAST_MAX_DEPTH) and returns false for anything else, valid or not, so the
 * jansson path decides and words the error. It must therefore never accept a
 * header the jansson path would reject; test_frame.c checks that by feeding
 * mutated headers through both.
 */
#define FAST_MAX_DEPTH   8
#define FAST_MAX_MEMBERS 48

enum fast_tok { T_STR, T_INT, T_REAL, T_LIT, T_NULL, T_OBJ, T_ARR };

struct fast_val {
    enum fast_tok t;
    const char *s; /* T_STR: the characters, unquoted */
    size_t n;
    int64_t i; /* T_INT */
    double d;  /* T_REAL, only when it had to be converted */
};

static const char *f_value(struct frame_parser *p, const char *s, const char *e, int depth,
                           struct fast_val *v);

static inline bool f_digit(char c)
{
    return c >= '0' && c <= '9';
}

static inline const char *f_ws(const char *s, const char *e)
{
    while (s < e && (*s == ' ' || *s == '\t' || *s == '\r' || *s == '\n'))
        s++;
    return s;
}

/* A string with no escape, control character or byte >= 0x80. */
static const char *f_str(const char *s, const char *e, struct fast_val *v)
{
    const char *b = ++s;

    while (s < e) {
        unsigned char c = (unsigned char)*s;

        if (c == '"') {
            v->t = T_STR;
            v->s = b;
            v->n = (size_t)(s - b);
            return s + 1;
        }
        if (c < 0x20 || c >= 0x80 || c == '\\')
            return NULL;
        s++;
    }
    return NULL;
}

/* A number in RFC 8259 grammar. Integers must fit in int64 like jansson's
 * strtoll; reals that could overflow a double are converted to check, as
 * jansson rejects them. Other reals are not converted at all. */
static const char *f_num(struct frame_parser *p, const char *s, const char *e, struct fast_val *v)
{
    const char *b = s;
    bool neg = false, real = false;
    uint64_t m = 0;
    int idig = 0;
    long ex = 0;
    bool eneg = false;

    if (*s == '-') {
        neg = true;
        s++;
    }
    if (s >= e || !f_digit(*s))
        return NULL;
    if (*s == '0') {
        s++;
        idig = 1;
        if (s < e && f_digit(*s))
            return NULL;
    } else {
        while (s < e && f_digit(*s)) {
            if (idig < 19)
                m = m * 10 + (uint64_t)(*s - '0');
            idig++;
            s++;
        }
    }
    if (s < e && *s == '.') {
        real = true;
        s++;
        if (s >= e || !f_digit(*s))
            return NULL;
        while (s < e && f_digit(*s))
            s++;
    }
    if (s < e && (*s == 'e' || *s == 'E')) {
        real = true;
        s++;
        if (s < e && (*s == '+' || *s == '-'))
            eneg = *s++ == '-';
        if (s >= e || !f_digit(*s))
            return NULL;
        while (s < e && f_digit(*s)) {
            if (ex < 100000)
                ex = ex * 10 + (*s - '0');
            s++;
        }
    }
    /* A valid number is always followed by ',', '}' or ']' inside the line,
     * which also keeps strtod_l() from reading past it. */
    if (s >= e)
        return NULL;
    if (!real) {
        if (idig > 19 || m > (uint64_t)INT64_MAX + (neg ? 1 : 0))
            return NULL;
        v->t = T_INT;
        v->i = neg ? (m ? -(int64_t)(m - 1) - 1 : 0) : (int64_t)m;
        return s;
    }
    v->t = T_REAL;
    if (idig + (eneg ? -ex : ex) > 300) {
        char *end;

        v->d = strtod_l(b, &end, p->c_locale);
        if (end != s || isinf(v->d))
            return NULL;
    }
    return s;
}

static const char *f_lit(const char *s, const char *e, const char *lit, size_t n)
{
    if ((size_t)(e - s) < n || memcmp(s, lit, n) != 0)
        return NULL;
    return s + n;
}

/* True when `key` equals one of keys[0..n). */
static bool f_dup(const struct fast_val *keys, size_t n, const struct fast_val *key)
{
    for (size_t i = 0; i < n; i++)
        if (keys[i].n == key->n && memcmp(keys[i].s, key->s, key->n) == 0)
            return true;
    return false;
}

/* An object whose members are all unknown to us: duplicates are found by
 * comparing every key with the previous ones. */
static const char *f_obj(struct frame_parser *p, const char *s, const char *e, int depth)
{
    struct fast_val keys[FAST_MAX_MEMBERS];
    struct fast_val v;
    size_t nk = 0;

    if (depth > FAST_MAX_DEPTH)
        return NULL;
    s = f_ws(s + 1, e);
    if (s < e && *s == '}')
        return s + 1;
    for (;;) {
        if (s >= e || *s != '"' || nk == FAST_MAX_MEMBERS)
            return NULL;
        if (!(s = f_str(s, e, &keys[nk])) || f_dup(keys, nk, &keys[nk]))
            return NULL;
        nk++;
        s = f_ws(s, e);
        if (s >= e || *s != ':')
            return NULL;
        if (!(s = f_value(p, f_ws(s + 1, e), e, depth, &v)))
            return NULL;
        s = f_ws(s, e);
        if (s < e && *s == ',') {
            s = f_ws(s + 1, e);
            continue;
        }
        if (s < e && *s == '}')
            return s + 1;
        return NULL;
    }
}

static const char *f_arr(struct frame_parser *p, const char *s, const char *e, int depth)
{
    struct fast_val v;

    if (depth > FAST_MAX_DEPTH)
        return NULL;
    s = f_ws(s + 1, e);
    if (s < e && *s == ']')
        return s + 1;
    for (;;) {
        if (!(s = f_value(p, s, e, depth, &v)))
            return NULL;
        s = f_ws(s, e);
        if (s < e && *s == ',') {
            s = f_ws(s + 1, e);
            continue;
        }
        if (s < e && *s == ']')
            return s + 1;
        return NULL;
    }
}

static const char *f_value(struct frame_parser *p, const char *s, const char *e, int depth,
                           struct fast_val *v)
{
    if (s >= e)
        return NULL;
    switch (*s) {
    case '"':
        return f_str(s, e, v);
    case '{':
        v->t = T_OBJ;
        return f_obj(p, s, e, depth + 1);
    case '[':
        v->t = T_ARR;
        return f_arr(p, s, e, depth + 1);
    case 't':
        v->t = T_LIT;
        return f_lit(s, e, "true", 4);
    case 'f':
        v->t = T_LIT;
        return f_lit(s, e, "false", 5);
    case 'n':
        v->t = T_NULL;
        return f_lit(s, e, "null", 4);
    default:
        if (*s == '-' || f_digit(*s))
            return f_num(p, s, e, v);
        return NULL;
    }
}

/* "shape": an array of at most FRAME_MAX_NDIM non-negative integers. */
static const char *f_shape(struct frame_parser *p, const char *s, const char *e,
                           struct frame_tensor *t)
{
    struct fast_val v;

    t->ndim = 0;
    if (s >= e || *s != '[')
        return NULL;
    s = f_ws(s + 1, e);
    if (s < e && *s == ']')
        return s + 1;
    for (;;) {
        if (s >= e || (*s != '-' && !f_digit(*s)) || t->ndim == FRAME_MAX_NDIM)
            return NULL;
        if (!(s = f_num(p, s, e, &v)) || v.t != T_INT || v.i < 0)
            return NULL;
        t->shape[t->ndim++] = v.i;
        s = f_ws(s, e);
        if (s < e && *s == ',') {
            s = f_ws(s + 1, e);
            continue;
        }
        if (s < e && *s == ']')
            return s + 1;
        return NULL;
    }
}

/* The members of "stats" in frame_stats order: five reals, then four counts. */
static const struct {
    const char *name;
    size_t len;
} stat_keys[9] = {
    {"min", 3}, {"max", 3},  {"mean", 4}, {"std", 3},   {"l2", 2},
    {"nan", 3}, {"pinf", 4}, {"ninf", 4}, {"zeros", 5},
};

/* "stats": known members typed as check_stats() wants them, others skipped.
 * Values are not converted, only located in p->stat_at[]. */
static const char *f_stats(struct frame_parser *p, const char *s, const char *e)
{
    struct fast_val keys[FAST_MAX_MEMBERS];
    struct fast_val v;
    unsigned seen = 0;
    size_t nk = 0;
    int k;

    memset(p->stat_at, 0, sizeof(p->stat_at));
    if (s >= e || *s != '{')
        return NULL;
    s = f_ws(s + 1, e);
    if (s < e && *s == '}')
        return s + 1;
    for (;;) {
        if (s >= e || *s != '"' || nk == FAST_MAX_MEMBERS)
            return NULL;
        if (!(s = f_str(s, e, &keys[nk])))
            return NULL;
        k = -1;
        for (int i = 0; i < 9 && k < 0; i++)
            if (stat_keys[i].len == keys[nk].n &&
                memcmp(stat_keys[i].name, keys[nk].s, keys[nk].n) == 0)
                k = i;
        s = f_ws(s, e);
        if (s >= e || *s != ':')
            return NULL;
        s = f_ws(s + 1, e);
        if (s >= e)
            return NULL;
        if (k >= 0) {
            if (seen & (1u << k))
                return NULL;
            seen |= 1u << k;
            p->stat_at[k] = s;
        } else if (f_dup(keys, nk, &keys[nk])) {
            return NULL;
        }
        nk++;
        if (k >= 0 && k < 5) {
            if (*s == 'n')
                s = f_lit(s, e, "null", 4);
            else if (*s == '-' || f_digit(*s))
                s = f_num(p, s, e, &v);
            else
                return NULL;
        } else if (k >= 5) {
            if (*s != '-' && !f_digit(*s))
                return NULL;
            if (!(s = f_num(p, s, e, &v)) || v.t != T_INT || v.i < 0)
                return NULL;
        } else {
            s = f_value(p, s, e, 2, &v);
        }
        if (!s)
            return NULL;
        s = f_ws(s, e);
        if (s < e && *s == ',') {
            s = f_ws(s + 1, e);
            continue;
        }
        if (s < e && *s == '}')
            return s + 1;
        return NULL;
    }
}

enum {
    K_KIND,
    K_SEQ,
    K_KEY,
    K_DTYPE,
    K_SHAPE,
    K_NUMEL,
    K_STATS,
    K_HASH,
    K_CAPTURE,
    K_NBYTES,
    K_MODULE,
    K_PHASE,
    K_ROLE,
    K_SAMPLE_POS,
    K_CALL,
    K_INDEX,
    K_COUNT
};

static const struct {
    const char *name;
    size_t len;
} fast_keys[K_COUNT] = {
    [K_KIND] = {"kind", 4},       [K_SEQ] = {"seq", 3},
    [K_KEY] = {"key", 3},         [K_DTYPE] = {"dtype", 5},
    [K_SHAPE] = {"shape", 5},     [K_NUMEL] = {"numel", 5},
    [K_STATS] = {"stats", 5},     [K_HASH] = {"hash", 4},
    [K_CAPTURE] = {"capture", 7}, [K_NBYTES] = {"nbytes", 6},
    [K_MODULE] = {"module", 6},   [K_PHASE] = {"phase", 5},
    [K_ROLE] = {"role", 4},       [K_SAMPLE_POS] = {"sample_positions", 16},
    [K_CALL] = {"call", 4},       [K_INDEX] = {"index", 5},
};

static int fast_key(const struct fast_val *k)
{
    for (int i = 0; i < K_COUNT; i++)
        if (fast_keys[i].len == k->n && fast_keys[i].name[0] == k->s[0] &&
            memcmp(fast_keys[i].name, k->s, k->n) == 0)
            return i;
    return -1;
}

static bool f_is(const struct fast_val *v, const char *lit)
{
    size_t n = strlen(lit);

    return v->t == T_STR && v->n == n && memcmp(v->s, lit, n) == 0;
}

/* Returns true when the line is a valid tensor header, with p->cur.tensor
 * and *nbytes_out filled; false to let the jansson path decide. Parser state
 * other than p->cur.tensor and p->tstr is only touched on success. */
static bool fast_tensor(struct frame_parser *p, const char *text, size_t len, uint64_t *nbytes_out)
{
    const char *s = text, *e = text + len;
    struct fast_val vals[K_COUNT];
    struct fast_val unknown[FAST_MAX_MEMBERS];
    struct frame_tensor *t = &p->cur.tensor;
    unsigned seen = 0;
    size_t nu = 0;
    int64_t prod = 1;
    uint64_t nbytes = 0;
    char *d;

    s = f_ws(s, e);
    if (s >= e || *s != '{')
        return false;
    s = f_ws(s + 1, e);
    if (s < e && *s == '}')
        return false;
    for (;;) {
        struct fast_val key, scratch;
        struct fast_val *v = &scratch;
        int k;

        if (s >= e || *s != '"' || !(s = f_str(s, e, &key)) || key.n == 0)
            return false;
        s = f_ws(s, e);
        if (s >= e || *s != ':')
            return false;
        s = f_ws(s + 1, e);
        if (s >= e)
            return false;
        k = fast_key(&key);
        if (k >= 0) {
            if (seen & (1u << k))
                return false;
            seen |= 1u << k;
            v = &vals[k];
        } else {
            if (nu == FAST_MAX_MEMBERS || f_dup(unknown, nu, &key))
                return false;
            unknown[nu++] = key;
        }
        if (k == K_SHAPE) {
            v->t = T_ARR;
            s = f_shape(p, s, e, t);
        } else if (k == K_STATS) {
            v->t = T_OBJ;
            s = f_stats(p, s, e);
        } else {
            s = f_value(p, s, e, 1, v);
        }
        if (!s)
            return false;
        s = f_ws(s, e);
        if (s < e && *s == ',') {
            s = f_ws(s + 1, e);
            continue;
        }
        if (s < e && *s == '}')
            break;
        return false;
    }
    if (f_ws(s + 1, e) != e)
        return false;

    /* The same rules as check_tensor(), without the words. */
    if ((seen & ((1u << K_NBYTES) - 1)) != (1u << K_NBYTES) - 1)
        return false;
    if (!f_is(&vals[K_KIND], "tensor"))
        return false;
    if (seen & (1u << K_NBYTES)) {
        if (vals[K_NBYTES].t != T_INT || vals[K_NBYTES].i < 0)
            return false;
        nbytes = (uint64_t)vals[K_NBYTES].i;
        if (nbytes > p->lim.max_payload || nbytes > p->lim.max_total_payload - p->payload_announced)
            return false;
    }
    if (vals[K_SEQ].t != T_INT || vals[K_SEQ].i < 0 || vals[K_SEQ].i <= p->last_seq)
        return false;
    if (vals[K_KEY].t != T_STR || vals[K_KEY].n == 0 || vals[K_KEY].n > FRAME_MAX_KEY ||
        memchr(vals[K_KEY].s, 0x7f, vals[K_KEY].n))
        return false;
    if (vals[K_DTYPE].t != T_STR || vals[K_DTYPE].n == 0 || vals[K_DTYPE].n > FRAME_MAX_DTYPE ||
        memchr(vals[K_DTYPE].s, 0x7f, vals[K_DTYPE].n))
        return false;
    for (int i = 0; i < t->ndim; i++)
        if (__builtin_mul_overflow(prod, t->shape[i], &prod))
            return false;
    if (vals[K_NUMEL].t != T_INT || vals[K_NUMEL].i != prod)
        return false;
    if (vals[K_HASH].t != T_STR || !hash_ok(vals[K_HASH].s, vals[K_HASH].n))
        return false;
    if (f_is(&vals[K_CAPTURE], "stats"))
        t->capture = FRAME_CAPTURE_STATS;
    else if (f_is(&vals[K_CAPTURE], "sample"))
        t->capture = FRAME_CAPTURE_SAMPLE;
    else if (f_is(&vals[K_CAPTURE], "full"))
        t->capture = FRAME_CAPTURE_FULL;
    else
        return false;
    for (int k = K_MODULE; k <= K_SAMPLE_POS; k++)
        if ((seen & (1u << k)) && vals[k].t != T_STR)
            return false;
    if ((seen & (1u << K_CALL)) && (vals[K_CALL].t != T_INT || vals[K_CALL].i < 0))
        return false;
    if ((seen & (1u << K_INDEX)) && vals[K_INDEX].t != T_INT && vals[K_INDEX].t != T_STR)
        return false;

    /* Accepted: publish NUL-terminated copies of the strings. */
    d = p->tstr;
    memcpy(d, vals[K_KEY].s, vals[K_KEY].n);
    d[vals[K_KEY].n] = '\0';
    t->key = d;
    t->key_len = vals[K_KEY].n;
    d += vals[K_KEY].n + 1;
    memcpy(d, vals[K_DTYPE].s, vals[K_DTYPE].n);
    d[vals[K_DTYPE].n] = '\0';
    t->dtype = d;
    d += vals[K_DTYPE].n + 1;
    memcpy(d, vals[K_HASH].s, vals[K_HASH].n);
    d[vals[K_HASH].n] = '\0';
    t->hash = d;
    t->seq = vals[K_SEQ].i;
    t->numel = prod;
    if (payload_check(t, dtype_size(t->dtype), nbytes) != PAY_OK)
        return false;
    p->last_seq = t->seq;
    p->stats_fast = true;
    *nbytes_out = nbytes;
    return true;
}

void frame_parser_set_fast_path(struct frame_parser *p, bool on)
{
    p->fast = on;
}

int frame_tensor_stats(const struct frame *f, struct frame_stats *out)
{
    const struct frame_parser *p = f->owner_;
    double *reals[] = {&out->min, &out->max, &out->mean, &out->std, &out->l2};
    int64_t *counts[] = {&out->nan, &out->pinf, &out->ninf, &out->zeros};
    json_t *stats;

    if (f->kind != FRAME_TENSOR || !p)
        return -EINVAL;
    for (int i = 0; i < 5; i++)
        *reals[i] = NAN;
    for (int i = 0; i < 4; i++)
        *counts[i] = -1;
    if (p->stats_fast) {
        /* Validated numbers, each followed by ',' or '}' inside the line. */
        for (int i = 0; i < 5; i++) {
            const char *q = p->stat_at[i];
            if (!q || *q == 'n')
                continue;
            *reals[i] = strtod_l(q, NULL, p->c_locale);
            /* jansson reads integer syntax as an integer, so "-0" is +0
             * there; keep both paths bit-identical (found by fuzz_record). */
            size_t n = strcspn(q, ",}");
            if (*reals[i] == 0.0 && !memchr(q, '.', n) && !memchr(q, 'e', n) && !memchr(q, 'E', n))
                *reals[i] = 0.0;
        }
        for (int i = 0; i < 4; i++)
            if (p->stat_at[5 + i])
                *counts[i] = strtoll(p->stat_at[5 + i], NULL, 10);
        return 0;
    }
    stats = json_object_get(frame_header(f), "stats");
    for (int i = 0; i < 5; i++) {
        json_t *v = json_object_get(stats, stats_reals[i]);

        if (json_is_number(v))
            *reals[i] = json_number_value(v);
    }
    for (int i = 0; i < 4; i++) {
        json_t *v = json_object_get(stats, stats_counts[i]);

        if (json_is_integer(v))
            *counts[i] = json_integer_value(v);
    }
    return 0;
}

json_t *frame_header(const struct frame *f)
{
    struct frame *m = (struct frame *)f; /* the parser's own, non-const frame */

    if (!m->hdr_)
        m->hdr_ = json_loadb(f->hdr_text, f->hdr_len, JSON_REJECT_DUPLICATES, NULL);
    return m->hdr_;
}

/* ---- framing -------------------------------------------------------------- */

/* Hands the assembled frame to the consumer and resets for the next one. */
static int deliver(struct frame_parser *p)
{
    struct frame *f = &p->cur;
    int rc;

    if (f->kind == FRAME_END) {
        const char *st = json_string_value(json_object_get(f->hdr_, "status"));
        const char *why = json_string_value(json_object_get(f->hdr_, "reason"));

        p->end_status = strdup(st);
        if (!p->end_status || (why && !(p->end_reason = strdup(why))))
            return fail(p, -ENOMEM, "out of memory");
    }
    rc = p->cb(p->ud, f);
    if (rc)
        return fail(p, rc, "frame %" PRIu64 " (%s): consumer failed: %s", f->index,
                    frame_kind_name(f->kind), strerror(rc < 0 ? -rc : rc));
    json_decref(f->hdr_);
    f->hdr_ = NULL;
    p->delivered++;
    p->payload_delivered += f->nbytes;
    p->line_len = 0;
    p->pay_len = 0;
    if (p->pay_cap > PAYLOAD_BUF_KEEP) {
        free(p->pay);
        p->pay = NULL;
        p->pay_cap = 0;
    }
    if (f->kind == FRAME_END) {
        p->saw_end = true;
        p->state = ST_DONE;
    } else {
        p->state = ST_HEADER;
    }
    return 0;
}

/* Parses the header with jansson and checks it; the authoritative path for
 * every kind, and the one that words every error. */
static int slow_header(struct frame_parser *p, const char *text, size_t len, uint64_t *nbytes_out)
{
    struct frame *f = &p->cur;
    json_error_t jerr;
    json_t *h, *v;
    uint64_t nbytes = 0;

    p->stats_fast = false;
    h = json_loadb(text, len, JSON_REJECT_DUPLICATES, &jerr);
    if (!h)
        return bad(p, "header is not valid JSON: %s (column %d)", jerr.text, jerr.column);
    f->hdr_ = h; /* owned by p->cur from here; fail() releases it */
    if (!json_is_object(h))
        return bad(p, "header is not a JSON object (got %s)", type_name(h));
    v = json_object_get(h, "kind");
    if (!v)
        return bad(p, "header missing string field \"kind\"");
    if (!json_is_string(v))
        return bad(p, "header field \"kind\" must be a string, got %s", type_name(v));
    f->kind = kind_of(json_string_value(v));

    v = json_object_get(h, "nbytes");
    if (v) {
        if (!json_is_integer(v) || json_integer_value(v) < 0)
            return bad(p, "field \"nbytes\" must be a non-negative integer");
        nbytes = (uint64_t)json_integer_value(v);
        if (nbytes > p->lim.max_payload)
            return bad(p, "nbytes %" PRIu64 " exceeds the payload limit of %" PRIu64 " bytes",
                       nbytes, p->lim.max_payload);
        if (nbytes > p->lim.max_total_payload - p->payload_announced)
            return bad(p,
                       "total payload limit exceeded: %" PRIu64 " + %" PRIu64 " bytes > %" PRIu64,
                       p->payload_announced, nbytes, p->lim.max_total_payload);
    }

    *nbytes_out = nbytes;
    return check_header(p, h, f->kind, nbytes);
}

/* Parses and checks one complete header line (without '\n'), then delivers
 * the frame at once if its payload is empty or already in [*inp, end), or
 * switches to ST_PAYLOAD. `text` is either in the caller's chunk or in
 * p->line; in the first case it is copied to p->line before the chunk can go
 * away. */
static int on_header(struct frame_parser *p, const char *text, size_t len,
                     const unsigned char **inp, const unsigned char *end)
{
    struct frame *f = &p->cur;
    uint64_t nbytes = 0;
    size_t avail;
    int rc;

    if (len == 0)
        return bad(p, "empty header line");
    if (p->headers >= p->lim.max_frames)
        return bad(p, "frame limit exceeded: more than %" PRIu64 " frames", p->lim.max_frames);

    memset(f, 0, sizeof(*f));
    if (p->fast && p->saw_env && fast_tensor(p, text, len, &nbytes)) {
        f->kind = FRAME_TENSOR;
    } else {
        memset(f, 0, sizeof(*f));
        if ((rc = slow_header(p, text, len, &nbytes)))
            return rc;
    }

    p->headers++;
    p->payload_announced += nbytes;
    f->owner_ = p;
    f->index = p->headers;
    f->hdr_text = text;
    f->hdr_len = len;
    f->nbytes = nbytes;
    avail = (size_t)(end - *inp);
    if (nbytes <= avail) {
        f->payload = nbytes ? *inp : NULL;
        *inp += nbytes;
        return deliver(p);
    }

    /* The payload straddles reads: keep the header text and start buffering. */
    if (text != p->line) {
        if ((rc = line_reserve(p, len)))
            return rc;
        memcpy(p->line, text, len);
        p->line_len = len;
        f->hdr_text = p->line;
    }
    p->state = ST_PAYLOAD;
    p->pay_len = 0;
    if (avail) {
        if ((rc = pay_reserve(p, avail)))
            return rc;
        memcpy(p->pay, *inp, avail);
        p->pay_len = avail;
        *inp = end;
    }
    return 0;
}

static int feed_header(struct frame_parser *p, const unsigned char **inp, const unsigned char *end)
{
    const unsigned char *in = *inp;
    size_t avail = (size_t)(end - in);
    /* Bytes this line may still take, its '\n' included. */
    size_t room = p->lim.max_header - p->line_len;
    size_t scan = avail < room ? avail : room;
    const unsigned char *nl = memchr(in, '\n', scan);
    size_t n;
    int rc;

    if (!nl) {
        if (avail >= room)
            return bad(p, "header line exceeds %zu bytes", p->lim.max_header);
        if ((rc = line_reserve(p, p->line_len + avail)))
            return rc;
        memcpy(p->line + p->line_len, in, avail);
        p->line_len += avail;
        *inp = end;
        return 0;
    }
    n = (size_t)(nl - in);
    *inp = nl + 1;
    if (p->line_len == 0)
        return on_header(p, (const char *)in, n, inp, end);
    if ((rc = line_reserve(p, p->line_len + n)))
        return rc;
    memcpy(p->line + p->line_len, in, n);
    p->line_len += n;
    return on_header(p, p->line, p->line_len, inp, end);
}

static int feed_payload(struct frame_parser *p, const unsigned char **inp, const unsigned char *end)
{
    uint64_t need = p->cur.nbytes - p->pay_len;
    size_t avail = (size_t)(end - *inp);
    size_t take = avail < need ? avail : (size_t)need;
    int rc;

    if ((rc = pay_reserve(p, p->pay_len + take)))
        return rc;
    memcpy(p->pay + p->pay_len, *inp, take);
    p->pay_len += take;
    *inp += take;
    if (p->pay_len < p->cur.nbytes)
        return 0;
    p->cur.payload = p->pay;
    return deliver(p);
}

int frame_feed(struct frame_parser *p, const void *buf, size_t len)
{
    const unsigned char *in = buf;
    const unsigned char *end = in + len;
    int rc = 0;

    if (p->state == ST_ERROR)
        return p->err;
    if (p->finished && len)
        return fail(p, -EINVAL, "frame_feed after frame_finish");
    while (in < end) {
        switch (p->state) {
        case ST_HEADER:
            rc = feed_header(p, &in, end);
            break;
        case ST_PAYLOAD:
            rc = feed_payload(p, &in, end);
            break;
        case ST_DONE:
            return fail(p, -EPROTO, "unexpected data after the end frame (first byte 0x%02x)", *in);
        case ST_ERROR:
            return p->err;
        }
        if (rc)
            return rc;
    }
    return 0;
}

int frame_finish(struct frame_parser *p)
{
    p->finished = true;
    switch (p->state) {
    case ST_ERROR:
        return p->err;
    case ST_DONE:
        return 0;
    case ST_PAYLOAD:
        return fail(p, -EPROTO,
                    "frame %" PRIu64 " (%s): payload truncated: expected %" PRIu64
                    " bytes, got %" PRIu64 " at EOF",
                    p->cur.index, frame_kind_name(p->cur.kind), p->cur.nbytes, p->pay_len);
    case ST_HEADER:
        if (p->line_len)
            return bad(p, "header line truncated at EOF (%zu bytes without a newline)",
                       p->line_len);
        return fail(p, -ENODATA, "stream ended without an end frame after %" PRIu64 " frames",
                    p->delivered);
    }
    return 0;
}

const char *frame_error(const struct frame_parser *p)
{
    return p->state == ST_ERROR ? p->errbuf : "";
}

bool frame_saw_end(const struct frame_parser *p)
{
    return p->saw_end;
}

const char *frame_end_status(const struct frame_parser *p)
{
    return p->saw_end ? p->end_status : NULL;
}

const char *frame_end_reason(const struct frame_parser *p)
{
    return p->saw_end ? p->end_reason : NULL;
}

uint64_t frame_count(const struct frame_parser *p)
{
    return p->delivered;
}

uint64_t frame_payload_bytes(const struct frame_parser *p)
{
    return p->payload_delivered;
}
