/* frame.c: the frame stream of the runner protocol: the parser's life, its
 * errors, its buffers, and the state machine that cuts a byte stream into
 * frames and hands each one to the consumer.
 *
 * The parser is a two-state machine (header line, payload) driven by whatever
 * chunks the caller read from the pipe. The hot path is a stream of small
 * tensor frames that arrive many to a read: for those each '\n' is found with
 * memchr, the line is validated straight from the caller's buffer (by the
 * non-allocating validator of frame_fast.c for tensor headers, and by the
 * jansson path of frame_check.c for everything else), and when a payload is
 * wholly inside the same chunk the frame points into that chunk too. Bytes
 * are copied only when a header line or a payload straddles two reads, and
 * then with one memcpy per read.
 *
 * Memory is bounded by the limits: the line buffer never exceeds max_header,
 * the payload buffer never exceeds the announced nbytes (itself checked
 * against max_payload before any byte is buffered), and it grows with what has
 * actually arrived, so a runner that announces 1 GiB and sends nothing costs
 * nothing.
 */
#include "daemon/frame/frame.h"
#include "daemon/frame/frame_int.h"

#include <errno.h>
#include <inttypes.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define LINE_BUF_MIN    4096
#define PAYLOAD_BUF_MIN 65536
/* A payload buffer larger than this is released after its frame, so one big
 * tensor does not pin its memory for the rest of the cell. */
#define PAYLOAD_BUF_KEEP (4u << 20)

static const char *const kind_names[] = {
    [FRAME_HELLO] = "hello",   [FRAME_ENV] = "env",
    [FRAME_TENSOR] = "tensor", [FRAME_NONDET] = "nondeterministic",
    [FRAME_TIMING] = "timing", [FRAME_MEMORY] = "memory",
    [FRAME_NOTE] = "note",     [FRAME_PROFILE] = "profile",
    [FRAME_END] = "end",       [FRAME_UNKNOWN] = "unknown",
};

const char *frame_kind_name(enum frame_kind k)
{
    if ((unsigned)k > FRAME_UNKNOWN)
        return "invalid";
    return kind_names[k];
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
    p->state = FRAME__ST_ERROR;
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

/* A protocol violation in the frame whose header is being checked; every
 * file of the parser words its violations through here. */
int frame__bad(struct frame_parser *p, const char *fmt, ...)
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
    p->state = FRAME__ST_HEADER;
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
        p->state = FRAME__ST_DONE;
    } else {
        p->state = FRAME__ST_HEADER;
    }
    return 0;
}

/* Parses and checks one complete header line (without '\n'), then delivers
 * the frame at once if its payload is empty or already in [*inp, end), or
 * switches to FRAME__ST_PAYLOAD. `text` is either in the caller's chunk or in
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
        return frame__bad(p, "empty header line");
    if (p->headers >= p->lim.max_frames)
        return frame__bad(p, "frame limit exceeded: more than %" PRIu64 " frames",
                          p->lim.max_frames);

    memset(f, 0, sizeof(*f));
    if (p->fast && p->saw_env && frame__fast_tensor(p, text, len, &nbytes)) {
        f->kind = FRAME_TENSOR;
    } else {
        memset(f, 0, sizeof(*f));
        if ((rc = frame__slow_header(p, text, len, &nbytes)))
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
    p->state = FRAME__ST_PAYLOAD;
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
            return frame__bad(p, "header line exceeds %zu bytes", p->lim.max_header);
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

    if (p->state == FRAME__ST_ERROR)
        return p->err;
    if (p->finished && len)
        return fail(p, -EINVAL, "frame_feed after frame_finish");
    while (in < end) {
        switch (p->state) {
        case FRAME__ST_HEADER:
            rc = feed_header(p, &in, end);
            break;
        case FRAME__ST_PAYLOAD:
            rc = feed_payload(p, &in, end);
            break;
        case FRAME__ST_DONE:
            return fail(p, -EPROTO, "unexpected data after the end frame (first byte 0x%02x)", *in);
        case FRAME__ST_ERROR:
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
    case FRAME__ST_ERROR:
        return p->err;
    case FRAME__ST_DONE:
        return 0;
    case FRAME__ST_PAYLOAD:
        return fail(p, -EPROTO,
                    "frame %" PRIu64 " (%s): payload truncated: expected %" PRIu64
                    " bytes, got %" PRIu64 " at EOF",
                    p->cur.index, frame_kind_name(p->cur.kind), p->cur.nbytes, p->pay_len);
    case FRAME__ST_HEADER:
        if (p->line_len)
            return frame__bad(p, "header line truncated at EOF (%zu bytes without a newline)",
                              p->line_len);
        return fail(p, -ENODATA, "stream ended without an end frame after %" PRIu64 " frames",
                    p->delivered);
    }
    return 0;
}

const char *frame_error(const struct frame_parser *p)
{
    return p->state == FRAME__ST_ERROR ? p->errbuf : "";
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
