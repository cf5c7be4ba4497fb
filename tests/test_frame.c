/* test_frame.c: the runner-protocol parser (daemon/frame/frame.h).
 *
 * Every stream is fed several ways (whole, byte by byte, random chunks) and
 * through both header validators (the fast tensor path and jansson); all must
 * agree on the frames delivered and on the exact error. Violations are checked
 * by the words of their reason, limits by crossing them by one.
 */
#include <criterion/criterion.h>

#include <errno.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "daemon/frame/frame.h"

/* ---- a growing byte string to build streams ------------------------------ */

struct sb {
    char *b;
    size_t n, cap;
};

static void sb_raw(struct sb *s, const void *p, size_t n)
{
    if (s->n + n + 1 > s->cap) {
        s->cap = (s->n + n + 1) * 2;
        s->b = realloc(s->b, s->cap);
        cr_assert_not_null(s->b);
    }
    memcpy(s->b + s->n, p, n);
    s->n += n;
    s->b[s->n] = '\0';
}

static void sb_str(struct sb *s, const char *str)
{
    sb_raw(s, str, strlen(str));
}

__attribute__((format(printf, 2, 3))) static void sb_printf(struct sb *s, const char *fmt, ...)
{
    char *tmp = NULL;
    va_list ap;
    int n;

    va_start(ap, fmt);
    n = vasprintf(&tmp, fmt, ap);
    va_end(ap);
    cr_assert_geq(n, 0);
    sb_raw(s, tmp, (size_t)n);
    free(tmp);
}

static void sb_free(struct sb *s)
{
    free(s->b);
    memset(s, 0, sizeof(*s));
}

#define HELLO "{\"kind\":\"hello\",\"protocol\":1,\"runner\":\"test/1\"}\n"
#define ENV                                                                                        \
    "{\"kind\":\"env\",\"fingerprint\":{\"torch\":\"2.4.0\"},\"effective_width\":\"avx2\"}\n"
#define END_OK "{\"kind\":\"end\",\"status\":\"ok\"}\n"
#define HASH   "9f86d081884c7d659a2feaa0c55ad015"
#define STATS                                                                                      \
    "{\"min\":-1.5,\"max\":2.25,\"mean\":0.010416666666666666,\"std\":0.9,\"l2\":28.7,"            \
    "\"nan\":0,\"pinf\":0,\"ninf\":0,\"zeros\":3}"

/* A tensor header of a 1-D uint8 tensor of `numel` elements, plus its payload
 * (bytes fill, fill+1, ...) when the capture carries one. */
static void sb_tensor(struct sb *s, long long seq, const char *capture, long long numel,
                      size_t nbytes, unsigned char fill)
{
    sb_printf(s,
              "{\"kind\":\"tensor\",\"seq\":%lld,\"key\":\"layer%lld.0.forward.output.0\","
              "\"module\":\"layer%lld\",\"call\":0,\"phase\":\"forward\",\"role\":\"output\","
              "\"index\":0,\"dtype\":\"uint8\",\"shape\":[%lld],\"numel\":%lld,\"stats\":" STATS
              ",\"hash\":\"" HASH "\",\"capture\":\"%s\"",
              seq, seq, seq, numel, numel, capture);
    if (nbytes)
        sb_printf(s, ",\"nbytes\":%zu", nbytes);
    sb_str(s, "}\n");
    for (size_t i = 0; i < nbytes; i++) {
        unsigned char c = (unsigned char)(fill + i);

        sb_raw(s, &c, 1);
    }
}

/* A whole stream (hello, env, tensors, end ok) of N stats tensors of one
 * element, seq 0 to N-1. */
static void sb_stats_stream(struct sb *s, int n)
{
    sb_str(s, HELLO ENV);
    for (int i = 0; i < n; i++)
        sb_tensor(s, i, "stats", 1, 0, 0);
    sb_str(s, END_OK);
}

/* A whole stream (hello, env, tensors, end ok) of a full-capture tensor of
 * SIZES[i] bytes for each i below N, seq i. */
static void sb_full_stream(struct sb *s, const int *sizes, int n)
{
    sb_str(s, HELLO ENV);
    for (int i = 0; i < n; i++)
        sb_tensor(s, i, "full", sizes[i], (size_t)sizes[i], 0);
    sb_str(s, END_OK);
}

/* ---- recording what the parser delivers ---------------------------------- */

struct rec_frame {
    enum frame_kind kind;
    uint64_t index;
    char *hdr;
    size_t hdr_len;
    unsigned char *payload;
    uint64_t nbytes;
    bool fast; /* the header tree was not built before the callback */
    bool header_ok;
    struct frame_tensor t;
    struct frame_stats stats;
    char key[FRAME_MAX_KEY + 1], dtype[FRAME_MAX_DTYPE + 1], hash[FRAME_HASH_MAX + 1];
};

struct rec {
    struct rec_frame *v;
    size_t n, cap;
    size_t fail_at; /* 1-based frame whose callback fails; 0: never */
    int fail_rc;
};

static int on_frame(void *ud, const struct frame *f)
{
    struct rec *r = ud;
    struct rec_frame *x;
    json_t *h;

    if (r->fail_at && r->n + 1 == r->fail_at)
        return r->fail_rc;
    if (r->n == r->cap) {
        r->cap = r->cap ? r->cap * 2 : 64;
        r->v = realloc(r->v, r->cap * sizeof(*r->v));
        cr_assert_not_null(r->v);
    }
    x = &r->v[r->n++];
    memset(x, 0, sizeof(*x));
    x->kind = f->kind;
    x->index = f->index;
    x->fast = f->hdr_ == NULL;
    x->hdr = malloc(f->hdr_len + 1);
    memcpy(x->hdr, f->hdr_text, f->hdr_len);
    x->hdr[f->hdr_len] = '\0';
    x->hdr_len = f->hdr_len;
    x->nbytes = f->nbytes;
    if (f->nbytes) {
        cr_assert_not_null(f->payload);
        x->payload = malloc(f->nbytes);
        memcpy(x->payload, f->payload, f->nbytes);
    } else {
        cr_assert_null(f->payload);
    }
    /* The tree, built lazily or not, must say the same as the typed fields. */
    h = frame_header(f);
    x->header_ok = json_is_object(h) && json_is_string(json_object_get(h, "kind"));
    if (f->kind != FRAME_TENSOR) {
        struct frame_stats st;

        cr_assert_eq(frame_tensor_stats(f, &st), -EINVAL);
    }
    if (f->kind == FRAME_TENSOR) {
        x->t = f->tensor;
        cr_assert_eq(frame_tensor_stats(f, &x->stats), 0);
        cr_assert_eq(strlen(f->tensor.key), f->tensor.key_len);
        snprintf(x->key, sizeof(x->key), "%s", f->tensor.key);
        snprintf(x->dtype, sizeof(x->dtype), "%s", f->tensor.dtype);
        snprintf(x->hash, sizeof(x->hash), "%s", f->tensor.hash);
        x->t.key = x->t.dtype = x->t.hash = NULL;
        cr_assert_eq(json_integer_value(json_object_get(h, "seq")), f->tensor.seq);
        cr_assert_str_eq(json_string_value(json_object_get(h, "key")), f->tensor.key);
        cr_assert_eq(json_integer_value(json_object_get(h, "numel")), f->tensor.numel);
    }
    return 0;
}

static void rec_free(struct rec *r)
{
    for (size_t i = 0; i < r->n; i++) {
        free(r->v[i].hdr);
        free(r->v[i].payload);
    }
    free(r->v);
    memset(r, 0, sizeof(*r));
}

/* Same frames, same bytes, same typed fields (NaN equal to NaN). */
static bool same_double(double a, double b)
{
    return (isnan(a) && isnan(b)) || a == b;
}

static void rec_assert_equal(const struct rec *a, const struct rec *b, const char *what)
{
    cr_assert_eq(a->n, b->n, "%s: %zu frames vs %zu", what, a->n, b->n);
    for (size_t i = 0; i < a->n; i++) {
        const struct rec_frame *x = &a->v[i], *y = &b->v[i];

        cr_assert_eq(x->kind, y->kind, "%s: frame %zu kind", what, i);
        cr_assert_eq(x->index, y->index, "%s: frame %zu index", what, i);
        cr_assert_eq(x->hdr_len, y->hdr_len, "%s: frame %zu header length", what, i);
        cr_assert_str_eq(x->hdr, y->hdr, "%s: frame %zu header", what, i);
        cr_assert_eq(x->nbytes, y->nbytes, "%s: frame %zu nbytes", what, i);
        if (x->nbytes)
            cr_assert(memcmp(x->payload, y->payload, x->nbytes) == 0, "%s: frame %zu payload", what,
                      i);
        cr_assert_eq(x->header_ok, y->header_ok);
        if (x->kind != FRAME_TENSOR)
            continue;
        cr_assert_eq(x->t.seq, y->t.seq, "%s: frame %zu seq", what, i);
        cr_assert_str_eq(x->key, y->key);
        cr_assert_str_eq(x->dtype, y->dtype);
        cr_assert_str_eq(x->hash, y->hash);
        cr_assert_eq(x->t.key_len, y->t.key_len);
        cr_assert_eq(x->t.capture, y->t.capture);
        cr_assert_eq(x->t.hash_alg, y->t.hash_alg, "%s: frame %zu hash_alg", what, i);
        cr_assert_eq(x->t.ndim, y->t.ndim);
        for (int d = 0; d < x->t.ndim; d++)
            cr_assert_eq(x->t.shape[d], y->t.shape[d]);
        cr_assert_eq(x->t.numel, y->t.numel);
        cr_assert(same_double(x->stats.min, y->stats.min), "%s: frame %zu min", what, i);
        cr_assert(same_double(x->stats.max, y->stats.max));
        cr_assert(same_double(x->stats.mean, y->stats.mean));
        cr_assert(same_double(x->stats.std, y->stats.std));
        cr_assert(same_double(x->stats.l2, y->stats.l2));
        cr_assert_eq(x->stats.nan, y->stats.nan);
        cr_assert_eq(x->stats.pinf, y->stats.pinf);
        cr_assert_eq(x->stats.ninf, y->stats.ninf);
        cr_assert_eq(x->stats.zeros, y->stats.zeros);
    }
}

/* ---- feeding ------------------------------------------------------------ */

enum mode { WHOLE, BYTEWISE, RANDOM, FIXED };

static uint64_t rng_state;

static uint64_t rnd(void)
{
    /* xorshift64*: deterministic per seed, good enough for chunk sizes. */
    rng_state ^= rng_state >> 12;
    rng_state ^= rng_state << 25;
    rng_state ^= rng_state >> 27;
    return rng_state * 2685821657736338717ull;
}

static void seed(uint64_t s)
{
    rng_state = s * 0x9e3779b97f4a7c15ull + 1;
}

/* Random chunk sizes that mix the tiny and the huge, so that lines and
 * payloads split at every kind of place. */
static size_t rnd_chunk(void)
{
    switch (rnd() % 4) {
    case 0:
        return 1 + rnd() % 3;
    case 1:
        return 1 + rnd() % 64;
    case 2:
        return 1 + rnd() % 4096;
    default:
        return 1 + rnd() % 70000;
    }
}

struct result {
    int rc; /* first non-zero of frame_feed() / frame_finish() */
    bool at_finish;
    char err[512];
    uint64_t count, payload_bytes;
    bool saw_end;
    char end_status[32], end_reason[128];
};

static void run(const void *buf, size_t len, const struct frame_limits *l, enum mode mode,
                size_t fixed, bool fast, struct rec *r, struct result *res)
{
    struct frame_parser *p = NULL;
    const unsigned char *b = buf;
    size_t off = 0;
    int rc = 0;

    memset(res, 0, sizeof(*res));
    cr_assert_eq(frame_parser_new(l, on_frame, r, &p), 0);
    frame_parser_set_fast_path(p, fast);
    while (off < len && rc == 0) {
        size_t n = len - off;

        if (mode == BYTEWISE)
            n = 1;
        else if (mode == RANDOM)
            n = rnd_chunk();
        else if (mode == FIXED)
            n = fixed;
        if (n > len - off)
            n = len - off;
        rc = frame_feed(p, b + off, n);
        off += n;
    }
    if (rc == 0) {
        rc = frame_finish(p);
        res->at_finish = true;
    } else {
        /* Errors are sticky: more input and EOF report the same. */
        cr_assert_eq(frame_feed(p, "x", 1), rc);
        cr_assert_eq(frame_finish(p), rc);
    }
    res->rc = rc;
    snprintf(res->err, sizeof(res->err), "%s", frame_error(p));
    res->count = frame_count(p);
    res->payload_bytes = frame_payload_bytes(p);
    res->saw_end = frame_saw_end(p);
    if (frame_end_status(p))
        snprintf(res->end_status, sizeof(res->end_status), "%s", frame_end_status(p));
    if (frame_end_reason(p))
        snprintf(res->end_reason, sizeof(res->end_reason), "%s", frame_end_reason(p));
    frame_parser_free(p);
}

/* Feeds `buf` every way and through both paths; asserts they all agree and
 * returns the outcome of the first (whole, fast). */
static void run_all(const void *buf, size_t len, const struct frame_limits *l, struct rec *out,
                    struct result *res)
{
    struct rec ref = {0};
    struct result first;
    static const enum mode modes[] = {WHOLE, BYTEWISE, RANDOM, RANDOM, RANDOM, FIXED};

    run(buf, len, l, WHOLE, 0, true, &ref, &first);
    for (int fast = 1; fast >= 0; fast--) {
        for (size_t m = 0; m < sizeof(modes) / sizeof(modes[0]); m++) {
            struct rec r = {0};
            struct result x;

            if (len > 4 << 20 && modes[m] == BYTEWISE)
                continue;
            seed(m * 7 + (uint64_t)fast);
            run(buf, len, l, modes[m], 4093, fast, &r, &x);
            cr_assert_eq(x.rc, first.rc, "mode %zu fast %d: rc %d vs %d (%s / %s)", m, fast, x.rc,
                         first.rc, x.err, first.err);
            cr_assert_str_eq(x.err, first.err, "mode %zu fast %d", m, fast);
            cr_assert_eq(x.count, first.count);
            cr_assert_eq(x.payload_bytes, first.payload_bytes);
            cr_assert_eq(x.saw_end, first.saw_end);
            rec_assert_equal(&ref, &r, "modes");
            rec_free(&r);
        }
    }
    *res = first;
    if (out)
        *out = ref;
    else
        rec_free(&ref);
}

/* run_all over the bytes of S, asserting that they parse cleanly; WHAT
 * names the stream in a failure. */
static void run_all_ok(const struct sb *s, const struct frame_limits *l, struct rec *out,
                       struct result *res, const char *what)
{
    run_all(s->b, s->n, l, out, res);
    cr_assert_eq(res->rc, 0, "%s: %s", what, res->err);
}

/* run over the bytes of S (no limits), asserting that they parse cleanly. */
static void run_ok(const struct sb *s, enum mode mode, size_t fixed, bool fast, struct rec *r,
                   struct result *res)
{
    run(s->b, s->n, NULL, mode, fixed, fast, r, res);
    cr_assert_eq(res->rc, 0, "%s", res->err);
}

/* ---- valid streams --------------------------------------------------------- */

/* A valid-stream test's bytes, the frames the parser gave for them and its
 * outcome. */
struct parsed {
    struct sb s;
    struct rec r;
    struct result res;
};

static void parsed_free(struct parsed *p)
{
    rec_free(&p->r);
    sb_free(&p->s);
}

/* A stream with every kind, payloads small and large, and frames of unknown
 * kind, whose payload must be skipped like any other. */
static void build_full_stream(struct sb *s, uint64_t *payload_total)
{
    static const size_t sizes[] = {1, 16, 255, 4096, 65535, 65536, 65537, 300000};
    uint64_t total = 0;
    long long seq = 0;

    sb_str(s, HELLO);
    sb_str(s,
           "{\"kind\":\"note\",\"level\":\"info\",\"message\":\"starting \\\"x\\\" \\u00e9\"}\n");
    sb_str(s, ENV);
    for (int i = 0; i < 40; i++)
        sb_tensor(s, seq++, "stats", 1024, 0, 0);
    for (size_t i = 0; i < sizeof(sizes) / sizeof(sizes[0]); i++) {
        sb_tensor(s, seq++, "full", (long long)sizes[i], sizes[i], (unsigned char)i);
        total += sizes[i];
        sb_tensor(s, seq++ + 3, "sample", 1000000, 256, (unsigned char)(i + 100));
        seq += 3;
        total += 256;
    }
    sb_str(s, "{\"kind\":\"future_kind\",\"nbytes\":10,\"x\":[1,{\"y\":null}]}\n0123456789");
    total += 10;
    sb_str(s, "{\"kind\":\"nondeterministic\",\"keys\":[\"layer3.0.forward.output.0\"]}\n");
    sb_str(s, "{\"kind\":\"timing\",\"phase\":\"forward\",\"samples_ns\":[1200,1100,1300],"
              "\"cpu_samples_ns\":[1190,1090,1000],\"own_samples_ns\":[1200,1050,1100],"
              "\"runqueue_ns\":250,\"cpu_ns\":3500,\"steal_ns\":null,\"warmup\":3,"
              "\"iterations\":3,\"threads\":1}\n");
    sb_str(s, "{\"kind\":\"profile\",\"phase\":\"forward\",\"side\":\"head\",\"iterations\":3,"
              "\"total_ns\":1200,\"outside_ns\":0,\"pair\":4,\"modules\":[{\"path\":\"\","
              "\"type\":\"M\",\"self_ns\":200,\"total_ns\":1200,\"calls\":1}],"
              "\"modules_left_out\":0,\"ops\":[{\"name\":\"aten::mm\",\"self_ns\":900,"
              "\"calls\":1.5}],\"ops_left_out\":0}\n");
    sb_str(s, "{\"kind\":\"memory\",\"peak_rss_bytes\":123456789,\"device_peak_bytes\":0}\n");
    sb_str(s, "{\"kind\":\"end\",\"status\":\"ok\",\"reason\":\"fine\"}\n");
    *payload_total = total;
}

Test(frame, valid_stream_any_chunking)
{
    struct parsed p = {0};
    uint64_t total;
    size_t ntensor = 0, nfast = 0;

    build_full_stream(&p.s, &total);
    run_all_ok(&p.s, NULL, &p.r, &p.res, "the full stream");
    cr_assert_str_eq(p.res.err, "");
    cr_assert(p.res.saw_end);
    cr_assert_str_eq(p.res.end_status, "ok");
    cr_assert_str_eq(p.res.end_reason, "fine");
    cr_assert_eq(p.res.count, 3 + 40 + 16 + 6);
    cr_assert_eq(p.r.n, p.res.count);
    cr_assert_eq(p.res.payload_bytes, total);
    cr_assert_eq(p.r.v[0].kind, FRAME_HELLO);
    cr_assert_eq(p.r.v[1].kind, FRAME_NOTE);
    cr_assert_eq(p.r.v[2].kind, FRAME_ENV);
    cr_assert_eq(p.r.v[p.r.n - 6].kind, FRAME_UNKNOWN);
    cr_assert_eq(p.r.v[p.r.n - 6].nbytes, 10);
    cr_assert(memcmp(p.r.v[p.r.n - 6].payload, "0123456789", 10) == 0);
    cr_assert_eq(p.r.v[p.r.n - 5].kind, FRAME_NONDET);
    cr_assert_eq(p.r.v[p.r.n - 4].kind, FRAME_TIMING);
    cr_assert_eq(p.r.v[p.r.n - 3].kind, FRAME_PROFILE);
    cr_assert_eq(p.r.v[p.r.n - 2].kind, FRAME_MEMORY);
    cr_assert_eq(p.r.v[p.r.n - 1].kind, FRAME_END);
    for (size_t i = 0; i < p.r.n; i++) {
        cr_assert_eq(p.r.v[i].index, i + 1);
        cr_assert(p.r.v[i].header_ok);
        cr_assert_neq(p.r.v[i].hdr[p.r.v[i].hdr_len - 1], '\n');
        if (p.r.v[i].kind != FRAME_TENSOR)
            continue;
        ntensor++;
        nfast += p.r.v[i].fast;
    }
    cr_assert_eq(ntensor, 56);
    /* The whole-fed, fast-path run took no tensor through jansson. */
    cr_assert_eq(nfast, ntensor);

    /* Spot-check typed fields and payload bytes. */
    {
        const struct rec_frame *t = &p.r.v[3];
        const struct rec_frame *big = &p.r.v[3 + 40 + 14];

        cr_assert_eq(t->t.seq, 0);
        cr_assert_str_eq(t->key, "layer0.0.forward.output.0");
        cr_assert_eq(t->t.key_len, strlen("layer0.0.forward.output.0"));
        cr_assert_str_eq(t->dtype, "uint8");
        cr_assert_str_eq(t->hash, HASH);
        cr_assert_eq(t->t.capture, FRAME_CAPTURE_STATS);
        cr_assert_eq(t->t.ndim, 1);
        cr_assert_eq(t->t.shape[0], 1024);
        cr_assert_eq(t->t.numel, 1024);
        cr_assert_eq(t->stats.min, -1.5);
        cr_assert_eq(t->stats.max, 2.25);
        cr_assert_eq(t->stats.mean, strtod("0.010416666666666666", NULL));
        cr_assert_eq(t->stats.l2, 28.7);
        cr_assert_eq(t->stats.zeros, 3);
        cr_assert_eq(t->stats.nan, 0);
        cr_assert_eq(big->t.capture, FRAME_CAPTURE_FULL);
        cr_assert_eq(big->nbytes, 300000);
        for (size_t i = 0; i < big->nbytes; i++)
            cr_assert_eq(big->payload[i], (unsigned char)(7 + i), "payload byte %zu", i);
    }
    parsed_free(&p);
}

Test(frame, slow_path_builds_tree_before_callback)
{
    struct parsed p = {0};

    sb_str(&p.s, HELLO ENV);
    sb_tensor(&p.s, 0, "stats", 4, 0, 0);
    sb_str(&p.s, END_OK);
    run_ok(&p.s, WHOLE, 0, false, &p.r, &p.res);
    cr_assert_eq(p.r.n, 4);
    cr_assert_eq(p.r.v[2].kind, FRAME_TENSOR);
    cr_assert_not(p.r.v[2].fast);
    cr_assert_not(p.r.v[0].fast);
    parsed_free(&p);
}

/* Every place a two-chunk split can fall, including inside "\n" + payload. */
Test(frame, every_two_chunk_split)
{
    struct parsed ref = {0};

    sb_str(&ref.s, HELLO ENV);
    sb_tensor(&ref.s, 0, "full", 100, 100, 1);
    sb_tensor(&ref.s, 1, "sample", 1000, 8, 2);
    sb_tensor(&ref.s, 2, "stats", 1, 0, 0);
    sb_str(&ref.s, END_OK);
    run_ok(&ref.s, WHOLE, 0, true, &ref.r, &ref.res);
    cr_assert_eq(ref.r.n, 6);
    for (size_t cut = 1; cut < ref.s.n; cut++) {
        struct frame_parser *p;
        struct rec r = {0};

        cr_assert_eq(frame_parser_new(NULL, on_frame, &r, &p), 0);
        cr_assert_eq(frame_feed(p, ref.s.b, cut), 0, "cut %zu: %s", cut, frame_error(p));
        cr_assert_eq(frame_feed(p, ref.s.b + cut, ref.s.n - cut), 0, "cut %zu: %s", cut,
                     frame_error(p));
        cr_assert_eq(frame_finish(p), 0);
        rec_assert_equal(&ref.r, &r, "split");
        frame_parser_free(p);
        rec_free(&r);
    }
    parsed_free(&ref);
}

Test(frame, big_payload_in_pipe_sized_chunks)
{
    struct parsed p = {0};
    const size_t n = (6u << 20) + 1;

    sb_str(&p.s, HELLO ENV);
    sb_tensor(&p.s, 0, "full", (long long)n, n, 9);
    sb_tensor(&p.s, 1, "full", 3, 3, 1);
    sb_str(&p.s, END_OK);
    run_ok(&p.s, FIXED, 65536, true, &p.r, &p.res);
    cr_assert_eq(p.r.n, 5);
    cr_assert_eq(p.r.v[2].nbytes, n);
    for (size_t i = 0; i < n; i += 4099)
        cr_assert_eq(p.r.v[2].payload[i], (unsigned char)(9 + i));
    cr_assert_eq(p.r.v[2].payload[n - 1], (unsigned char)(9 + n - 1));
    cr_assert_eq(p.r.v[3].payload[2], 3);
    cr_assert_eq(p.res.payload_bytes, n + 3);
    parsed_free(&p);
}

Test(frame, stats_null_and_absent)
{
    struct parsed p = {0};
    static const char line[] =
        "{\"kind\":\"tensor\",\"seq\":0,\"key\":\"a.0.forward.output.0\",\"dtype\":\"float32\","
        "\"shape\":[],\"numel\":1,\"stats\":{\"min\":null,\"max\":-0.30000000000000004,"
        "\"mean\":1e-320,\"std\":5,\"zeros\":1,\"extra\":{\"deep\":[1,2,{\"x\":true}]}},"
        "\"hash\":\"0123456789abcdef\",\"capture\":\"stats\",\"nbytes\":0}\n";

    sb_str(&p.s, HELLO ENV);
    sb_str(&p.s, line);
    sb_str(&p.s, END_OK);
    run_all_ok(&p.s, NULL, &p.r, &p.res, "null and absent stats");
    cr_assert_eq(p.r.v[2].t.ndim, 0);
    cr_assert_eq(p.r.v[2].t.numel, 1);
    cr_assert(isnan(p.r.v[2].stats.min));
    cr_assert_eq(p.r.v[2].stats.max, -0.30000000000000004);
    cr_assert_eq(p.r.v[2].stats.mean, strtod("1e-320", NULL));
    cr_assert_eq(p.r.v[2].stats.std, 5.0);
    cr_assert(isnan(p.r.v[2].stats.l2));
    cr_assert_eq(p.r.v[2].stats.zeros, 1);
    cr_assert_eq(p.r.v[2].stats.nan, -1);
    cr_assert(p.r.v[2].fast);
    parsed_free(&p);
}

Test(frame, end_status_and_reason)
{
    struct sb s = {0};
    struct result res;

    sb_str(&s, HELLO "{\"kind\":\"end\",\"status\":\"unsupported\",\"reason\":\"width avx512 "
                     "requested, effective avx2\"}\n");
    run_all_ok(&s, NULL, NULL, &res, "an end with a reason");
    cr_assert(res.saw_end);
    cr_assert_str_eq(res.end_status, "unsupported");
    cr_assert_str_eq(res.end_reason, "width avx512 requested, effective avx2");
    cr_assert_eq(res.count, 2);
    sb_free(&s);
}

/* ---- violations ------------------------------------------------------------ */

static void expect_violation(const char *name, const void *buf, size_t len,
                             const struct frame_limits *l, int want_rc, const char *want)
{
    struct result res;

    run_all(buf, len, l, NULL, &res);
    cr_assert_eq(res.rc, want_rc, "%s: rc %d, error \"%s\"", name, res.rc, res.err);
    cr_assert_not_null(strstr(res.err, want), "%s: error \"%s\" lacks \"%s\"", name, res.err, want);
}

struct raw_case {
    const char *name;
    int pre; /* 0: nothing before, 1: hello, 2: hello and env */
    const char *body;
    const char *want;
};

static const struct raw_case raw_cases[] = {
    {"not json", 0, "hello\n", "frame 1: header is not valid JSON"},
    {"array", 0, "[1,2]\n", "frame 1: header is not a JSON object (got array)"},
    {"bare number", 0, "42\n", "header is not valid JSON"},
    {"trailing garbage", 0, "{\"kind\":\"hello\",\"protocol\":1,\"runner\":\"x\"} x\n",
     "header is not valid JSON"},
    {"duplicate key", 0, "{\"kind\":\"hello\",\"protocol\":1,\"protocol\":1,\"runner\":\"x\"}\n",
     "duplicate object key"},
    {"duplicate key nested", 2,
     "{\"kind\":\"tensor\",\"seq\":0,\"key\":\"a\",\"dtype\":\"uint8\",\"shape\":[1],\"numel\":1,"
     "\"stats\":{\"min\":1,\"min\":2},\"hash\":\"" HASH "\",\"capture\":\"stats\"}\n",
     "duplicate object key"},
    {"duplicate key via escape", 2,
     "{\"kind\":\"tensor\",\"seq\":0,\"se\\u0071\":1,\"key\":\"a\",\"dtype\":\"uint8\","
     "\"shape\":[1],\"numel\":1,\"stats\":{},\"hash\":\"" HASH "\",\"capture\":\"stats\"}\n",
     "duplicate object key"},
    {"invalid utf-8", 1, "{\"kind\":\"note\",\"level\":\"info\",\"message\":\"\xff\xfe\"}\n",
     "header is not valid JSON"},
    {"overlong utf-8", 1, "{\"kind\":\"note\",\"level\":\"info\",\"message\":\"\xc0\xaf\"}\n",
     "header is not valid JSON"},
    {"nul escape", 1, "{\"kind\":\"note\",\"level\":\"info\",\"message\":\"a\\u0000b\"}\n",
     "header is not valid JSON"},
    {"raw control in string", 1, "{\"kind\":\"note\",\"level\":\"info\",\"message\":\"a\tb\"}\n",
     "header is not valid JSON"},
    {"integer too big", 2,
     "{\"kind\":\"tensor\",\"seq\":9223372036854775808,\"key\":\"a\",\"dtype\":\"uint8\","
     "\"shape\":[1],\"numel\":1,\"stats\":{},\"hash\":\"" HASH "\",\"capture\":\"stats\"}\n",
     "header is not valid JSON"},
    {"real overflow", 2,
     "{\"kind\":\"tensor\",\"seq\":0,\"key\":\"a\",\"dtype\":\"uint8\",\"shape\":[1],\"numel\":1,"
     "\"stats\":{\"max\":1e999},\"hash\":\"" HASH "\",\"capture\":\"stats\"}\n",
     "header is not valid JSON"},
    {"empty line", 0, "\n", "frame 1: empty header line"},
    {"empty line later", 2, "\n", "frame 3: empty header line"},
    {"kind missing", 0, "{\"protocol\":1}\n", "header missing string field \"kind\""},
    {"kind not string", 0, "{\"kind\":7}\n", "header field \"kind\" must be a string, got integer"},
    {"first not hello", 0, ENV, "frame 1: first frame must be hello, got kind \"env\""},
    {"unknown first", 0, "{\"kind\":\"zzz\"}\n", "first frame must be hello, got kind \"zzz\""},
    {"duplicate hello", 1, HELLO, "frame 2: duplicate hello"},
    {"protocol 2", 0, "{\"kind\":\"hello\",\"protocol\":2,\"runner\":\"x\"}\n",
     "frame 1: unsupported protocol version 2 (expected 1)"},
    {"protocol missing", 0, "{\"kind\":\"hello\",\"runner\":\"x\"}\n",
     "hello header missing integer field \"protocol\""},
    {"protocol string", 0, "{\"kind\":\"hello\",\"protocol\":\"1\",\"runner\":\"x\"}\n",
     "hello field \"protocol\" must be an integer, got string"},
    {"runner missing", 0, "{\"kind\":\"hello\",\"protocol\":1}\n",
     "hello header missing string field \"runner\""},
    {"duplicate env", 2, ENV, "frame 3: duplicate env"},
    {"env width missing", 1, "{\"kind\":\"env\",\"fingerprint\":{}}\n",
     "env header missing string field \"effective_width\""},
    {"env fingerprint type", 1, "{\"kind\":\"env\",\"fingerprint\":[],\"effective_width\":\"x\"}\n",
     "env field \"fingerprint\" must be an object, got array"},
    {"tensor before env", 1,
     "{\"kind\":\"tensor\",\"seq\":0,\"key\":\"a\",\"dtype\":\"uint8\",\"shape\":[1],\"numel\":1,"
     "\"stats\":{},\"hash\":\"" HASH "\",\"capture\":\"stats\"}\n",
     "frame 2: tensor before env"},
    {"timing samples missing", 2,
     "{\"kind\":\"timing\",\"phase\":\"forward\",\"warmup\":1,\"iterations\":1,\"threads\":1}\n",
     "timing header missing array field \"samples_ns\""},
    {"timing negative sample", 2,
     "{\"kind\":\"timing\",\"phase\":\"forward\",\"samples_ns\":[5,-1],\"warmup\":1,"
     "\"iterations\":2,\"threads\":1}\n",
     "timing samples_ns[1] must be a non-negative integer"},
    {"timing real sample", 2,
     "{\"kind\":\"timing\",\"phase\":\"forward\",\"samples_ns\":[1.5],\"warmup\":1,"
     "\"iterations\":1,\"threads\":1}\n",
     "timing samples_ns[0] must be a non-negative integer"},
    {"timing samples not array", 2,
     "{\"kind\":\"timing\",\"phase\":\"forward\",\"samples_ns\":{},\"warmup\":1,"
     "\"iterations\":1,\"threads\":1}\n",
     "timing field \"samples_ns\" must be an array, got object"},
    {"timing cpu samples of another length", 2,
     "{\"kind\":\"timing\",\"phase\":\"forward\",\"samples_ns\":[5,6],\"cpu_samples_ns\":[5],"
     "\"warmup\":1,\"iterations\":2,\"threads\":1}\n",
     "timing cpu_samples_ns has 1 samples, samples_ns 2"},
    {"timing negative cpu sample", 2,
     "{\"kind\":\"timing\",\"phase\":\"forward\",\"samples_ns\":[5,6],\"cpu_samples_ns\":[5,-6],"
     "\"warmup\":1,\"iterations\":2,\"threads\":1}\n",
     "timing cpu_samples_ns[1] must be a non-negative integer"},
    {"timing own sample past its wall sample", 2,
     "{\"kind\":\"timing\",\"phase\":\"forward\",\"samples_ns\":[5,6],\"own_samples_ns\":[5,7],"
     "\"runqueue_ns\":0,\"warmup\":1,\"iterations\":2,\"threads\":1}\n",
     "timing own_samples_ns[1] exceeds samples_ns[1]"},
    {"timing own samples of another length", 2,
     "{\"kind\":\"timing\",\"phase\":\"forward\",\"samples_ns\":[5,6],\"own_samples_ns\":[5],"
     "\"runqueue_ns\":0,\"warmup\":1,\"iterations\":2,\"threads\":1}\n",
     "timing own_samples_ns has 1 samples, samples_ns 2"},
    {"timing own samples without a run-queue delay", 2,
     "{\"kind\":\"timing\",\"phase\":\"forward\",\"samples_ns\":[5,6],\"own_samples_ns\":[5,6],"
     "\"runqueue_ns\":null,\"warmup\":1,\"iterations\":2,\"threads\":1}\n",
     "timing own_samples_ns without runqueue_ns"},
    {"timing device samples of another length", 2,
     "{\"kind\":\"timing\",\"phase\":\"forward\",\"samples_ns\":[5,6],\"device_samples_ns\":[5],"
     "\"warmup\":1,\"iterations\":2,\"threads\":1}\n",
     "timing device_samples_ns has 1 samples, samples_ns 2"},
    {"timing negative run-queue delay", 2,
     "{\"kind\":\"timing\",\"phase\":\"forward\",\"samples_ns\":[5,6],\"runqueue_ns\":-1,"
     "\"warmup\":1,\"iterations\":2,\"threads\":1}\n",
     "timing field \"runqueue_ns\" must be >= 0, got -1"},
    {"timing steal not a number", 2,
     "{\"kind\":\"timing\",\"phase\":\"forward\",\"samples_ns\":[5,6],\"steal_ns\":\"x\","
     "\"warmup\":1,\"iterations\":2,\"threads\":1}\n",
     "timing field \"steal_ns\" must be an integer, got string"},
    {"profile side", 2,
     "{\"kind\":\"profile\",\"phase\":\"forward\",\"side\":\"both\",\"iterations\":3,"
     "\"total_ns\":5,\"modules\":[],\"ops\":[]}\n",
     "profile field \"side\" has invalid value \"both\""},
    {"profile total missing", 2,
     "{\"kind\":\"profile\",\"phase\":\"forward\",\"side\":\"head\",\"iterations\":3,"
     "\"modules\":[],\"ops\":[]}\n",
     "profile header missing integer field \"total_ns\""},
    {"profile module without a path", 2,
     "{\"kind\":\"profile\",\"phase\":\"forward\",\"side\":\"head\",\"iterations\":3,"
     "\"total_ns\":5,\"modules\":[{\"type\":\"Linear\",\"self_ns\":1}],\"ops\":[]}\n",
     "profile modules[0] must be an object with a string \"path\" and a non-negative integer "
     "\"self_ns\""},
    {"profile negative op time", 2,
     "{\"kind\":\"profile\",\"phase\":\"backward\",\"side\":\"control\",\"iterations\":3,"
     "\"total_ns\":5,\"modules\":[],\"ops\":[{\"name\":\"aten::mm\",\"self_ns\":-2}]}\n",
     "profile ops[0] must be an object with a string \"name\" and a non-negative integer "
     "\"self_ns\""},
    {"profile ops missing", 2,
     "{\"kind\":\"profile\",\"phase\":\"forward\",\"side\":\"head\",\"iterations\":3,"
     "\"total_ns\":5,\"modules\":[]}\n",
     "profile header missing array field \"ops\""},
    {"timing phase", 2,
     "{\"kind\":\"timing\",\"phase\":\"sideways\",\"samples_ns\":[],\"warmup\":1,"
     "\"iterations\":1,\"threads\":1}\n",
     "timing field \"phase\" has invalid value \"sideways\""},
    {"timing warmup missing", 2,
     "{\"kind\":\"timing\",\"phase\":\"backward\",\"samples_ns\":[],\"iterations\":1,"
     "\"threads\":1}\n",
     "timing header missing integer field \"warmup\""},
    {"memory peak missing", 2, "{\"kind\":\"memory\"}\n",
     "memory header missing integer field \"peak_rss_bytes\""},
    {"memory peak negative", 2, "{\"kind\":\"memory\",\"peak_rss_bytes\":-5}\n",
     "memory field \"peak_rss_bytes\" must be >= 0, got -5"},
    {"memory device type", 2,
     "{\"kind\":\"memory\",\"peak_rss_bytes\":5,\"device_peak_bytes\":\"x\"}\n",
     "memory field \"device_peak_bytes\" must be an integer, got string"},
    {"note message missing", 1, "{\"kind\":\"note\",\"level\":\"info\"}\n",
     "note header missing string field \"message\""},
    {"note level", 1, "{\"kind\":\"note\",\"level\":\"loud\",\"message\":\"m\"}\n",
     "note field \"level\" has invalid value \"loud\""},
    {"end status missing", 1, "{\"kind\":\"end\"}\n", "end header missing string field \"status\""},
    {"end status value", 1, "{\"kind\":\"end\",\"status\":\"great\"}\n",
     "end field \"status\" has invalid value \"great\""},
    {"end reason type", 1, "{\"kind\":\"end\",\"status\":\"failed\",\"reason\":5}\n",
     "end field \"reason\" must be a string, got integer"},
    {"nondet keys missing", 2, "{\"kind\":\"nondeterministic\"}\n",
     "nondeterministic header missing array field \"keys\""},
    {"nondet key type", 2, "{\"kind\":\"nondeterministic\",\"keys\":[\"a\",1]}\n",
     "nondeterministic keys[1] must be a key string"},
    {"nbytes negative", 2,
     "{\"kind\":\"note\",\"level\":\"info\",\"message\":\"m\",\"nbytes\":-1}\n",
     "frame 3: field \"nbytes\" must be a non-negative integer"},
    {"nbytes string", 2, "{\"kind\":\"zzz\",\"nbytes\":\"16\"}\n",
     "field \"nbytes\" must be a non-negative integer"},
    {"nbytes real", 2, "{\"kind\":\"zzz\",\"nbytes\":16.0}\n",
     "field \"nbytes\" must be a non-negative integer"},
    {"nbytes over default limit", 2, "{\"kind\":\"zzz\",\"nbytes\":268435457}\n",
     "nbytes 268435457 exceeds the payload limit of 268435456 bytes"},
    {"data after end", 1, END_OK "x", "unexpected data after the end frame (first byte 0x78)"},
    {"hello after end", 1, END_OK HELLO, "unexpected data after the end frame (first byte 0x7b)"},
    {"newline after end", 1, END_OK "\n", "unexpected data after the end frame"},
    {"frame after end", 1, END_OK END_OK, "unexpected data after the end frame"},
    {"end payload then data", 1, "{\"kind\":\"end\",\"status\":\"ok\",\"nbytes\":3}\nabcd",
     "unexpected data after the end frame (first byte 0x64)"},
};

Test(frame, violations_raw)
{
    for (size_t i = 0; i < sizeof(raw_cases) / sizeof(raw_cases[0]); i++) {
        const struct raw_case *c = &raw_cases[i];
        struct sb s = {0};

        if (c->pre >= 1)
            sb_str(&s, HELLO);
        if (c->pre >= 2)
            sb_str(&s, ENV);
        sb_str(&s, c->body);
        expect_violation(c->name, s.b, s.n, NULL, -EPROTO, c->want);
        sb_free(&s);
    }
}

/* Tensor cases: one field of a valid header replaced (value JSON). The
 * header is frame 3. */
struct tensor_case {
    const char *field;
    const char *value;
    const char *want;
};

/* What a hash_alg that is neither algorithm is refused with. */
#define HASH_ALGS "tensor hash_alg must be \"blake2b-128\" or \"xxh3-128\""

static const struct tensor_case tensor_cases[] = {
    {"seq", "\"1\"", "tensor field \"seq\" must be an integer, got string"},
    {"seq", "1.0", "tensor field \"seq\" must be an integer, got real"},
    {"seq", "-1", "tensor field \"seq\" must be >= 0, got -1"},
    {"key", "7", "tensor field \"key\" must be a string, got integer"},
    {"key", "\"\"", "tensor key must be 1..512 bytes, got 0"},
    {"key", "\"a\\u0001b\"", "contains a control character"},
    {"key", "\"a\\tb\"", "contains a control character"},
    {"key", "\"a\\u007fb\"", "contains a control character"},
    {"key", "\"a\\u0085b\"", "contains a control character"},
    {"dtype", "\"\"", "tensor dtype must be 1..32 printable bytes"},
    {"dtype", "\"float32_and_a_name_far_too_long_x\"", "tensor dtype must be 1..32"},
    {"shape", "\"4\"", "tensor field \"shape\" must be an array, got string"},
    {"shape", "[-1]", "tensor shape[0] must be a non-negative integer"},
    {"shape", "[2,1.5]", "tensor shape[1] must be a non-negative integer"},
    {"shape", "[1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,4]",
     "tensor shape has 17 dimensions, more than 16"},
    {"shape", "[4294967296,4294967296]", "tensor shape product overflows 64 bits"},
    {"numel", "5", "tensor numel 5 does not match shape product 4"},
    {"numel", "-4", "tensor field \"numel\" must be >= 0"},
    {"stats", "[]", "tensor field \"stats\" must be an object, got array"},
    {"stats", "{\"min\":\"x\"}", "tensor field \"stats.min\" must be a number or null, got string"},
    {"stats", "{\"l2\":true}", "tensor field \"stats.l2\" must be a number or null, got true"},
    {"stats", "{\"nan\":-1}", "tensor field \"stats.nan\" must be a non-negative integer"},
    {"stats", "{\"zeros\":1.0}", "tensor field \"stats.zeros\" must be a non-negative integer"},
    {"hash", "\"abc1234\"", "tensor hash must be 8..128 hex digits, got 7"},
    {"hash", "\"ABCDEF12\"", "tensor hash must be lowercase hex"},
    {"hash", "\"zzzzzzzz\"", "tensor hash must be lowercase hex"},
    {"hash_alg", "\"sha1\"", HASH_ALGS ", got \"sha1\""},
    {"hash_alg", "\"XXH3-128\"", HASH_ALGS},
    {"hash_alg", "\"\"", HASH_ALGS ", got \"\""},
    {"hash_alg", "7", "tensor field \"hash_alg\" must be a string, got integer"},
    {"hash_alg", "null", "tensor field \"hash_alg\" must be a string, got null"},
    {"capture", "\"partial\"", "tensor capture must be stats, sample or full, got \"partial\""},
    {"nbytes", "16", "tensor with capture \"stats\" must not carry a payload (nbytes 16)"},
    {"module", "5", "tensor field \"module\" must be a string, got integer"},
    {"phase", "null", "tensor field \"phase\" must be a string, got null"},
    {"role", "[]", "tensor field \"role\" must be a string, got array"},
    {"sample_positions", "1", "tensor field \"sample_positions\" must be a string"},
    {"call", "-1", "tensor field \"call\" must be >= 0, got -1"},
    {"call", "\"0\"", "tensor field \"call\" must be an integer, got string"},
    {"index", "1.5", "tensor field \"index\" must be an integer or a string, got real"},
};

/* The fields a tensor header must have, and their JSON types: removing one
 * is refused, naming both. */
static const struct {
    const char *field, *type;
} required_fields[] = {
    {"seq", "integer"},   {"key", "string"},   {"dtype", "string"}, {"shape", "array"},
    {"numel", "integer"}, {"stats", "object"}, {"hash", "string"},  {"capture", "string"},
};

static json_t *base_tensor(void)
{
    json_t *t = json_pack(
        "{s:s, s:i, s:s, s:s, s:i, s:s, s:s, s:i, s:s, s:[i], s:i, s:{s:f, s:f, s:i}, s:s, s:s}",
        "kind", "tensor", "seq", 0, "key", "m.0.forward.output.0", "module", "m", "call", 0,
        "phase", "forward", "role", "output", "index", 0, "dtype", "float32", "shape", 4, "numel",
        4, "stats", "min", -1.0, "max", 1.0, "zeros", 0, "hash", HASH, "capture", "stats");

    cr_assert_not_null(t);
    return t;
}

static void sb_json_line(struct sb *s, json_t *j)
{
    char *txt = json_dumps(j, JSON_COMPACT);

    cr_assert_not_null(txt);
    sb_str(s, txt);
    sb_str(s, "\n");
    free(txt);
}

/* The valid base tensor header with FIELD replaced by the JSON text VALUE
 * (NULL: removed), between hello, env and an end: refused with WANT (NAME
 * names the case). */
static void expect_tensor_violation(const char *name, const char *field, const char *value,
                                    const char *want)
{
    struct sb s = {0};
    json_t *t = base_tensor();

    if (value) {
        json_error_t jerr;
        json_t *v = json_loads(value, JSON_DECODE_ANY, &jerr);

        cr_assert_not_null(v, "%s: %s", name, jerr.text);
        json_object_set_new(t, field, v);
    } else {
        json_object_del(t, field);
    }
    sb_str(&s, HELLO ENV);
    sb_json_line(&s, t);
    sb_str(&s, END_OK);
    expect_violation(name, s.b, s.n, NULL, -EPROTO, want);
    json_decref(t);
    sb_free(&s);
}

Test(frame, violations_tensor_fields)
{
    /* The base itself is valid, so each case fails for its one change. */
    {
        struct sb s = {0};
        struct result res;
        json_t *t = base_tensor();

        sb_str(&s, HELLO ENV);
        sb_json_line(&s, t);
        sb_str(&s, END_OK);
        run_all_ok(&s, NULL, NULL, &res, "base");
        json_decref(t);
        sb_free(&s);
    }
    for (size_t i = 0; i < sizeof(tensor_cases) / sizeof(tensor_cases[0]); i++) {
        const struct tensor_case *c = &tensor_cases[i];
        char name[128];

        snprintf(name, sizeof(name), "tensor case %zu (%s=%s)", i, c->field, c->value);
        expect_tensor_violation(name, c->field, c->value, c->want);
    }
    for (size_t i = 0; i < sizeof(required_fields) / sizeof(required_fields[0]); i++) {
        char name[128], want[128];

        snprintf(name, sizeof(name), "tensor case %s=<removed>", required_fields[i].field);
        snprintf(want, sizeof(want), "frame 3: tensor header missing %s field \"%s\"",
                 required_fields[i].type, required_fields[i].field);
        expect_tensor_violation(name, required_fields[i].field, NULL, want);
    }
}

/* A stats tensor frame, seq 5, under KEY. */
static void sb_keyed_tensor(struct sb *s, const char *key)
{
    sb_printf(s,
              "{\"kind\":\"tensor\",\"seq\":5,\"key\":\"%s\",\"dtype\":\"uint8\",\"shape\":[1],"
              "\"numel\":1,\"stats\":{},\"hash\":\"" HASH "\",\"capture\":\"stats\"}\n",
              key);
}

/* The hash's algorithm as delivered for one tensor header whose hash_alg
 * member is ALG (NULL: absent) and whose hash is HASH_HEX; both paths and
 * every way of feeding agree (run_all). Returns the parser's rc. */
static int hash_alg_run(const char *alg, const char *hash_hex, enum frame_hash_alg *got,
                        struct result *res)
{
    struct sb s = {0};
    struct rec r = {0};
    json_t *t = base_tensor();

    json_object_set_new(t, "hash", json_string(hash_hex));
    if (alg)
        json_object_set_new(t, "hash_alg", json_string(alg));
    sb_str(&s, HELLO ENV);
    sb_json_line(&s, t);
    sb_str(&s, END_OK);
    run_all(s.b, s.n, NULL, &r, res);
    if (res->rc == 0) {
        cr_assert_eq(r.n, 4);
        *got = r.v[2].t.hash_alg;
        cr_assert(r.v[2].fast, "the fast path takes a tensor with hash_alg too");
    }
    rec_free(&r);
    json_decref(t);
    sb_free(&s);
    return res->rc;
}

Test(frame, tensor_hash_alg)
{
    struct result res;
    enum frame_hash_alg got = FRAME_HASH_ALG_COUNT;

    /* Absent: the algorithm every runner used before the field. */
    cr_assert_eq(hash_alg_run(NULL, HASH, &got, &res), 0, "%s", res.err);
    cr_assert_eq(got, FRAME_HASH_BLAKE2B_128);
    cr_assert_eq(hash_alg_run(NULL, "0123456789abcdef", &got, &res), 0, "%s", res.err);
    cr_assert_eq(got, FRAME_HASH_BLAKE2B_128);
    for (int a = 0; a < FRAME_HASH_ALG_COUNT; a++) {
        got = FRAME_HASH_ALG_COUNT;
        cr_assert_eq(hash_alg_run(frame_hash_alg_name((enum frame_hash_alg)a), HASH, &got, &res), 0,
                     "%s: %s", frame_hash_alg_name((enum frame_hash_alg)a), res.err);
        cr_assert_eq(got, (enum frame_hash_alg)a);
    }
    cr_assert_str_eq(frame_hash_alg_name(FRAME_HASH_XXH3_128), "xxh3-128");
    cr_assert_str_eq(frame_hash_alg_name(FRAME_HASH_BLAKE2B_128), "blake2b-128");
    /* A named algorithm has exactly 128 bits: 32 digits, no fewer, no more. */
    cr_assert_eq(hash_alg_run("xxh3-128", "0123456789abcdef", &got, &res), -EPROTO);
    cr_assert_not_null(
        strstr(res.err, "tensor hash of hash_alg \"xxh3-128\" must be 32 hex digits, got 16"), "%s",
        res.err);
    cr_assert_eq(hash_alg_run("blake2b-128", HASH "0", &got, &res), -EPROTO);
    cr_assert_not_null(strstr(res.err, "must be 32 hex digits, got 33"), "%s", res.err);
}

Test(frame, tensor_key_length_and_seq_order)
{
    char key[FRAME_MAX_KEY + 2];
    struct sb s = {0};
    struct result res;
    struct rec r;

    memset(key, 'k', sizeof(key));
    key[FRAME_MAX_KEY] = '\0';
    sb_str(&s, HELLO ENV);
    sb_keyed_tensor(&s, key);
    sb_str(&s, END_OK);
    run_all_ok(&s, NULL, &r, &res, "512-byte key");
    cr_assert_eq(r.v[2].t.key_len, FRAME_MAX_KEY);
    rec_free(&r);
    sb_free(&s);

    key[FRAME_MAX_KEY] = 'k';
    key[FRAME_MAX_KEY + 1] = '\0';
    sb_str(&s, HELLO ENV);
    sb_keyed_tensor(&s, key);
    expect_violation("513-byte key", s.b, s.n, NULL, -EPROTO,
                     "tensor key must be 1..512 bytes, got 513");
    sb_free(&s);

    /* Seq 5, then one not above it. */
    static const struct {
        const char *name;
        long long second;
        const char *want;
    } seqs[] = {
        {"equal seq", 5, "frame 4: tensor seq 5 is not strictly increasing (previous 5)"},
        {"decreasing seq", 3, "tensor seq 3 is not strictly increasing (previous 5)"},
    };
    for (size_t i = 0; i < sizeof(seqs) / sizeof(seqs[0]); i++) {
        sb_str(&s, HELLO ENV);
        sb_tensor(&s, 5, "stats", 1, 0, 0);
        sb_tensor(&s, seqs[i].second, "stats", 1, 0, 0);
        expect_violation(seqs[i].name, s.b, s.n, NULL, -EPROTO, seqs[i].want);
        sb_free(&s);
    }
}

Test(frame, payload_size_must_match_capture)
{
    static const struct {
        const char *capture, *dtype;
        int numel;
        int nbytes;
        const char *want; /* NULL: valid */
    } cases[] = {
        {"full", "float32", 4, 16, NULL},
        {"full", "float32", 4, 15,
         "tensor with capture \"full\" needs nbytes 16 (4 x float32), got 15"},
        {"full", "float32", 4, 0, "needs nbytes 16"},
        {"full", "float64", 4, 32, NULL},
        {"full", "bfloat16", 4, 8, NULL},
        {"full", "complex64", 2, 16, NULL},
        {"full", "float32", 0, 0, NULL},
        {"sample", "float32", 4, 8, NULL},
        {"sample", "float32", 4, 6,
         "tensor with capture \"sample\" has nbytes 6, not a multiple of 4 up to 16"},
        {"sample", "float32", 4, 20, "has nbytes 20, not a multiple of 4 up to 16"},
        {"full", "weird_future_dtype", 4, 3, NULL},
    };

    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        struct sb s = {0};
        struct result res;

        sb_str(&s, HELLO ENV);
        sb_printf(&s,
                  "{\"kind\":\"tensor\",\"seq\":0,\"key\":\"a\",\"dtype\":\"%s\",\"shape\":[%d],"
                  "\"numel\":%d,\"stats\":{},\"hash\":\"" HASH "\",\"capture\":\"%s\","
                  "\"nbytes\":%d}\n",
                  cases[i].dtype, cases[i].numel, cases[i].numel, cases[i].capture,
                  cases[i].nbytes);
        for (int b = 0; b < cases[i].nbytes; b++)
            sb_raw(&s, "p", 1);
        sb_str(&s, END_OK);
        if (cases[i].want) {
            expect_violation(cases[i].dtype, s.b, s.n, NULL, -EPROTO, cases[i].want);
        } else {
            char name[32];
            snprintf(name, sizeof(name), "case %zu", i);
            run_all_ok(&s, NULL, NULL, &res, name);
            cr_assert_eq(res.payload_bytes, (uint64_t)cases[i].nbytes);
        }
        sb_free(&s);
    }
}

/* ---- limits, each crossed by one ------------------------------------------ */

/* A note header line of exactly `total` bytes, its '\n' included. */
static void sb_note_of_size(struct sb *s, size_t total)
{
    static const char pre[] = "{\"kind\":\"note\",\"level\":\"info\",\"message\":\"";
    static const char post[] = "\"}\n";
    size_t fill = total - (sizeof(pre) - 1) - (sizeof(post) - 1);

    sb_str(s, pre);
    for (size_t i = 0; i < fill; i++)
        sb_raw(s, "m", 1);
    sb_str(s, post);
}

/* Hello, a note line of TOTAL bytes and, when END, an end frame. */
static void sb_note_stream(struct sb *s, size_t total, bool end)
{
    sb_str(s, HELLO);
    sb_note_of_size(s, total);
    if (end)
        sb_str(s, END_OK);
}

/* frame_limits_default's limits as a value, for a test to change one. */
static struct frame_limits default_limits(void)
{
    struct frame_limits l;

    frame_limits_default(&l);
    return l;
}

/* The stream in S, at the limits L, parses cleanly (WHAT names it); frees
 * S and returns the outcome. */
static struct result expect_within(struct sb *s, const struct frame_limits *l, const char *what)
{
    struct result res;

    run_all_ok(s, l, NULL, &res, what);
    sb_free(s);
    return res;
}

/* The stream in S, past the limits L, is refused with WANT (NAME names
 * it); frees S. */
static void expect_past(const char *name, struct sb *s, const struct frame_limits *l,
                        const char *want)
{
    expect_violation(name, s->b, s->n, l, -EPROTO, want);
    sb_free(s);
}

Test(frame, header_line_limit_default)
{
    struct sb s = {0};

    sb_note_stream(&s, FRAME_DEFAULT_MAX_HEADER, true);
    cr_assert_eq(expect_within(&s, NULL, "65536-byte line").count, 3);

    sb_note_stream(&s, FRAME_DEFAULT_MAX_HEADER + 1, true);
    expect_past("65537-byte line", &s, NULL, "frame 2: header line exceeds 65536 bytes");

    /* An endless line is refused once the limit is reached, not at EOF. */
    {
        struct frame_parser *p;
        struct rec r = {0};
        char junk[4096];
        int rc = 0;
        size_t fed = 0;

        memset(junk, ' ', sizeof(junk));
        cr_assert_eq(frame_parser_new(NULL, on_frame, &r, &p), 0);
        cr_assert_eq(frame_feed(p, HELLO, strlen(HELLO)), 0);
        while (rc == 0 && fed < (1u << 20)) {
            rc = frame_feed(p, junk, sizeof(junk));
            fed += sizeof(junk);
        }
        cr_assert_eq(rc, -EPROTO);
        cr_assert_eq(fed, FRAME_DEFAULT_MAX_HEADER);
        cr_assert_str_eq(frame_error(p), "frame 2: header line exceeds 65536 bytes");
        frame_parser_free(p);
        rec_free(&r);
    }
}

Test(frame, header_line_limit_small)
{
    struct frame_limits l = default_limits();
    struct sb s = {0};

    l.max_header = 128;
    sb_note_stream(&s, 128, true);
    expect_within(&s, &l, "a 128-byte line");

    sb_note_stream(&s, 129, false);
    expect_past("129 > 128", &s, &l, "frame 2: header line exceeds 128 bytes");
}

Test(frame, frame_count_limit)
{
    struct frame_limits l = default_limits();
    struct sb s = {0};

    l.max_frames = 5;
    sb_stats_stream(&s, 2);
    cr_assert_eq(expect_within(&s, &l, "5 frames").count, 5);

    sb_stats_stream(&s, 3);
    expect_past("6 frames", &s, &l, "frame 6: frame limit exceeded: more than 5 frames");
}

Test(frame, payload_limits)
{
    struct frame_limits l = default_limits();
    struct sb s = {0};

    l.max_payload = 1000;
    l.max_total_payload = 2500;

    static const int at_limits[] = {1000, 1000, 500}, one_over[] = {1001},
                     total_over[] = {1000, 1000, 501};
    sb_full_stream(&s, at_limits, 3);
    cr_assert_eq(expect_within(&s, &l, "payloads at the limits").payload_bytes, 2500);

    sb_full_stream(&s, one_over, 1);
    expect_past("payload 1001", &s, &l,
                "frame 3: nbytes 1001 exceeds the payload limit of 1000 bytes");

    sb_full_stream(&s, total_over, 3);
    expect_past("total 2501", &s, &l,
                "frame 5: total payload limit exceeded: 2000 + 501 bytes > 2500");
}

Test(frame, new_rejects_bad_arguments)
{
    struct frame_limits l;
    struct frame_parser *p = (struct frame_parser *)1;

    cr_assert_eq(frame_parser_new(NULL, NULL, NULL, &p), -EINVAL);
    cr_assert_null(p);
    frame_limits_default(&l);
    cr_assert_eq(l.max_header, 65536);
    cr_assert_eq(l.max_payload, 256ull << 20, "the documented frame_max_payload default");
    cr_assert_eq(l.max_frames, 2000000);
    cr_assert_eq(l.max_total_payload, 8ull << 30);
    l.max_header = 1;
    cr_assert_eq(frame_parser_new(&l, on_frame, NULL, &p), -EINVAL);
    l.max_header = FRAME_HARD_MAX_HEADER + 1;
    cr_assert_eq(frame_parser_new(&l, on_frame, NULL, &p), -EINVAL);
    frame_limits_default(&l);
    l.max_frames = 0;
    cr_assert_eq(frame_parser_new(&l, on_frame, NULL, &p), -EINVAL);
    frame_parser_free(NULL);
}

/* ---- EOF -------------------------------------------------------------------- */

Test(frame, truncated_payload_at_eof)
{
    struct sb s = {0};
    struct result res;

    sb_str(&s, HELLO ENV
           "{\"kind\":\"tensor\",\"seq\":0,\"key\":\"a\",\"dtype\":\"float32\",\"shape\":[1024],"
           "\"numel\":1024,\"stats\":{},\"hash\":\"" HASH "\",\"capture\":\"full\","
           "\"nbytes\":4096}\n");
    for (int i = 0; i < 100; i++)
        sb_raw(&s, "z", 1);
    expect_violation("short payload", s.b, s.n, NULL, -EPROTO,
                     "frame 3 (tensor): payload truncated: expected 4096 bytes, got 100 at EOF");
    run_all(s.b, s.n, NULL, NULL, &res);
    cr_assert(res.at_finish);
    cr_assert_eq(res.count, 2);
    sb_free(&s);
}

Test(frame, truncated_header_at_eof)
{
    struct sb s = {0};

    sb_str(&s, HELLO ENV "{\"kind\":\"end\",\"status\":\"ok\"}");
    expect_violation("no newline", s.b, s.n, NULL, -EPROTO,
                     "frame 3: header line truncated at EOF (28 bytes without a newline)");
    sb_free(&s);
}

Test(frame, missing_end)
{
    struct sb s = {0};
    struct result res;

    sb_str(&s, HELLO ENV);
    sb_tensor(&s, 0, "stats", 1, 0, 0);
    run_all(s.b, s.n, NULL, NULL, &res);
    cr_assert_eq(res.rc, -ENODATA);
    cr_assert(res.at_finish);
    cr_assert_not(res.saw_end);
    cr_assert_eq(res.count, 3);
    cr_assert_str_eq(res.err, "stream ended without an end frame after 3 frames");
    sb_free(&s);

    run_all("", 0, NULL, NULL, &res);
    cr_assert_eq(res.rc, -ENODATA);
    cr_assert_str_eq(res.err, "stream ended without an end frame after 0 frames");
}

Test(frame, finish_is_idempotent_and_feed_after_finish_fails)
{
    struct frame_parser *p;
    struct rec r = {0};

    cr_assert_eq(frame_parser_new(NULL, on_frame, &r, &p), 0);
    cr_assert_eq(frame_feed(p, HELLO END_OK, strlen(HELLO END_OK)), 0);
    cr_assert_eq(frame_finish(p), 0);
    cr_assert_eq(frame_finish(p), 0);
    cr_assert(frame_saw_end(p));
    cr_assert_str_eq(frame_end_status(p), "ok");
    cr_assert_null(frame_end_reason(p));
    cr_assert_eq(frame_feed(p, "", 0), 0);
    cr_assert_eq(frame_feed(p, "{", 1), -EINVAL);
    frame_parser_free(p);
    rec_free(&r);
}

/* ---- the consumer's errors ------------------------------------------------- */

Test(frame, callback_error_propagates_and_sticks)
{
    struct sb s = {0};
    struct frame_parser *p;
    struct rec r = {0};

    sb_str(&s, HELLO ENV);
    for (int i = 0; i < 5; i++)
        sb_tensor(&s, i, "full", 8, 8, 0);
    sb_str(&s, END_OK);
    r.fail_at = 4;
    r.fail_rc = -EIO;
    cr_assert_eq(frame_parser_new(NULL, on_frame, &r, &p), 0);
    cr_assert_eq(frame_feed(p, s.b, s.n), -EIO);
    cr_assert_eq(r.n, 3);
    cr_assert_eq(frame_count(p), 3);
    cr_assert_str_eq(frame_error(p), "frame 4 (tensor): consumer failed: Input/output error");
    cr_assert_eq(frame_feed(p, HELLO, strlen(HELLO)), -EIO);
    cr_assert_eq(frame_finish(p), -EIO);
    cr_assert_eq(r.n, 3);
    cr_assert_not(frame_saw_end(p));
    frame_parser_free(p);
    rec_free(&r);

    /* The same when the failing frame's payload arrives byte by byte. */
    memset(&r, 0, sizeof(r));
    r.fail_at = 4;
    r.fail_rc = -ENOSPC;
    cr_assert_eq(frame_parser_new(NULL, on_frame, &r, &p), 0);
    {
        int rc = 0;

        for (size_t i = 0; i < s.n && rc == 0; i++)
            rc = frame_feed(p, s.b + i, 1);
        cr_assert_eq(rc, -ENOSPC);
    }
    cr_assert_eq(r.n, 3);
    frame_parser_free(p);
    rec_free(&r);
    sb_free(&s);
}

Test(frame, violation_sticks_without_more_callbacks)
{
    struct frame_parser *p;
    struct rec r = {0};

    cr_assert_eq(frame_parser_new(NULL, on_frame, &r, &p), 0);
    cr_assert_eq(frame_feed(p, HELLO "nope\n" ENV, strlen(HELLO "nope\n" ENV)), -EPROTO);
    cr_assert_eq(r.n, 1);
    cr_assert_eq(frame_feed(p, ENV, strlen(ENV)), -EPROTO);
    cr_assert_eq(r.n, 1);
    cr_assert_not_null(strstr(frame_error(p), "frame 2: header is not valid JSON"));
    frame_parser_free(p);
    rec_free(&r);
}

/* ---- the fast path accepts exactly what jansson accepts ------------------- */

static const char *const fuzz_tokens[] = {
    "0",
    "-0",
    "1",
    "-1",
    "1.5",
    "1e400",
    "-1e400",
    "1e-400",
    "9223372036854775807",
    "9223372036854775808",
    "-9223372036854775808",
    "-9223372036854775809",
    "01",
    "1.",
    ".5",
    "-",
    "1E2",
    "0.1e+2",
    "1e",
    "123456789012345678901234567890",
    "true",
    "false",
    "null",
    "nul",
    "\"\"",
    "\"x\"",
    "\"\\u0041\"",
    "\"\\n\"",
    "\"\xc3\xa9\"",
    "\"\xff\"",
    "[]",
    "[1,]",
    "{}",
    "{\"a\":1,\"a\":2}",
    "{\"a\":[[[[[[[[[[1]]]]]]]]]]}",
    " ",
    "\t",
    "\r",
    ",",
    ":",
    "{",
    "}",
    "[",
    "]",
    "\"",
    "\\",
    "\x7f",
    "\x01",
    "\"tensor\"",
    "\"stats\"",
    "\"full\"",
    "\"sample\"",
    "[4]",
    "[2,2]",
    "4",
    "\"" HASH "\"",
    "\"seq\":9,",
    "\"seq\":1,",
    "\"kind\":\"tensor\",",
    "\"zz\":{},",
    "\"nbytes\":0,",
    "\"nbytes\":16,",
    "\"index\":\"w\",",
    "\"stats\":{},",
    "\"min\":null,",
    "\"nan\":2,",
};

static void mutate(struct sb *out, const char *base)
{
    size_t n = strlen(base);
    int ops = 1 + (int)(rnd() % 3);

    sb_str(out, base);
    for (int k = 0; k < ops; k++) {
        size_t at = out->n ? rnd() % out->n : 0;
        struct sb t = {0};

        switch (rnd() % 4) {
        case 0: /* delete a run */
            sb_raw(&t, out->b, at);
            {
                size_t del = 1 + rnd() % 8;

                if (at + del > out->n)
                    del = out->n - at;
                sb_raw(&t, out->b + at + del, out->n - at - del);
            }
            break;
        case 1: /* insert a token */
        case 2: {
            const char *tok = fuzz_tokens[rnd() % (sizeof(fuzz_tokens) / sizeof(fuzz_tokens[0]))];

            sb_raw(&t, out->b, at);
            sb_str(&t, tok);
            sb_raw(&t, out->b + at, out->n - at);
            break;
        }
        default: { /* replace a run of digits or letters by a token */
            const char *tok = fuzz_tokens[rnd() % (sizeof(fuzz_tokens) / sizeof(fuzz_tokens[0]))];
            size_t end = at;

            while (end < out->n && end < at + 6 && out->b[end] != ',' && out->b[end] != '}')
                end++;
            sb_raw(&t, out->b, at);
            sb_str(&t, tok);
            sb_raw(&t, out->b + end, out->n - end);
            break;
        }
        }
        sb_free(out);
        *out = t;
    }
    (void)n;
}

Test(frame, fast_path_agrees_with_jansson, .timeout = 120)
{
    const char *bases[] = {
        "{\"kind\":\"tensor\",\"seq\":3,\"key\":\"enc.0.forward.output.0\",\"module\":\"enc\","
        "\"call\":0,\"phase\":\"forward\",\"role\":\"output\",\"index\":0,\"dtype\":\"float32\","
        "\"shape\":[2,2],\"numel\":4,\"stats\":{\"min\":-1.25,\"max\":3,\"mean\":0.5,"
        "\"std\":1.0000000000000002,\"l2\":2.5,\"nan\":0,\"pinf\":0,\"ninf\":0,\"zeros\":1},"
        "\"hash\":\"" HASH "\",\"capture\":\"stats\"}",
        "{\"kind\":\"tensor\",\"seq\":7,\"key\":\"fc.0.backward.param_grad.weight\","
        "\"dtype\":\"uint8\",\"shape\":[4],\"numel\":4,\"stats\":{},\"hash\":\"0011223344556677\","
        "\"capture\":\"full\",\"nbytes\":4,\"index\":\"weight\",\"x\":[1,{\"y\":null}]}",
        " { \"seq\" : 1 , \"kind\" : \"tensor\" , \"key\" : \"a\" , \"dtype\" : \"int8\" , "
        "\"shape\" : [ ] , \"numel\" : 1 , \"stats\" : { \"min\" : 1e2 } , \"hash\" : "
        "\"abcdefab\" , \"capture\" : \"sample\" , \"nbytes\" : 1 } ",
    };
    size_t accepted = 0, accepted_fast = 0, total = 0;

    seed(12345);
    for (size_t b = 0; b < sizeof(bases) / sizeof(bases[0]); b++) {
        for (int it = 0; it < 6000; it++) {
            struct sb line = {0}, s = {0};
            struct rec rf = {0}, rs = {0};
            struct result xf, xs;
            uint64_t keep = rng_state;

            if (it == 0)
                sb_str(&line, bases[b]);
            else
                mutate(&line, bases[b]);
            if (memchr(line.b, '\n', line.n)) {
                sb_free(&line);
                continue;
            }
            sb_str(&s, HELLO ENV);
            sb_raw(&s, line.b, line.n);
            sb_str(&s, "\nabcd" END_OK);
            run(s.b, s.n, NULL, WHOLE, 0, true, &rf, &xf);
            run(s.b, s.n, NULL, WHOLE, 0, false, &rs, &xs);
            rng_state = keep;
            cr_assert_eq(xf.rc, xs.rc, "fast %d vs jansson %d on: %s (%s / %s)", xf.rc, xs.rc,
                         line.b, xf.err, xs.err);
            cr_assert_str_eq(xf.err, xs.err, "on: %s", line.b);
            rec_assert_equal(&rs, &rf, line.b);
            total++;
            if (rf.n >= 3 && rf.v[2].kind == FRAME_TENSOR) {
                accepted++;
                accepted_fast += rf.v[2].fast;
            }
            if (it == 0)
                cr_assert(rf.n >= 3 && rf.v[2].fast, "base %zu not taken by the fast path", b);
            rec_free(&rf);
            rec_free(&rs);
            sb_free(&line);
            sb_free(&s);
            (void)rnd();
        }
    }
    cr_log_info("fuzz: %zu headers, %zu accepted, %zu of them by the fast path", total, accepted,
                accepted_fast);
    /* The mutations must exercise both acceptance and rejection. */
    cr_assert_gt(total, 15000);
    cr_assert_gt(accepted, 500, "only %zu of %zu mutated headers accepted", accepted, total);
    cr_assert_gt(accepted_fast, 300);
    cr_assert_lt(accepted, total / 2);
}
