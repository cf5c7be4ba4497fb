/*
 * tests/test_hostile.c - 10,000 generated bad requests against a running
 * capd: malformed bodies, wrong types, bad media types, hostile paths and
 * percent-encodings, unknown and lower-case methods, broken framing
 * (Content-Length lies, bad chunking), garbage request lines and header
 * lines, refused and malformed tokens.
 *
 * Every write request is bad by construction (invalid JSON, an unknown
 * field, a route to something that does not exist, or no valid token), so
 * none may succeed. The suite checks: no 5xx at all, no write answered
 * 2xx, capd still serving and exiting 0 afterwards (no crash, no sanitizer
 * report in the ASan run), no file descriptor leaked, and the database
 * byte-for-byte the same as before (builds, jobs, cells, branches, tokens).
 * The generator is seeded, so a failure names the seed and the request.
 */
#include <criterion/criterion.h>
#include <errno.h>
#include <poll.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include "storage/store.h"
#include "tests/helpers/common/tcp.h"
#include "tests/helpers/common/testutil.h"

#define HOSTILE_REQUESTS 10000
#define HOSTILE_THREADS  4
#define REQ_MAX          (96 * 1024)

static char g_token[STORE_TOKEN_LEN + 1];
static int g_port;

/* ---- a small deterministic generator ---- */

static uint64_t rnd(uint64_t *s)
{
    uint64_t x = *s;
    x ^= x << 13;
    x ^= x >> 7;
    x ^= x << 17;
    return *s = x;
}

static unsigned pick(uint64_t *s, unsigned n)
{
    return (unsigned)(rnd(s) % n);
}

struct buf {
    char *p;
    size_t n, cap;
};

static void put(struct buf *b, const void *p, size_t n)
{
    if (b->n + n > b->cap)
        n = b->cap - b->n; /* requests are capped; the tail is dropped */
    memcpy(b->p + b->n, p, n);
    b->n += n;
}

/* The byte C, N times (as far as the cap allows). */
static void put_rep(struct buf *b, char c, int n)
{
    for (int i = 0; i < n; i++)
        put(b, &c, 1);
}

/* Bytes of a fixed text, its length given: some carry NUL bytes. */
struct lit {
    const char *p;
    size_t n;
};

static void putf(struct buf *b, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void putf(struct buf *b, const char *fmt, ...)
{
    char tmp[8192];
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(tmp, sizeof tmp, fmt, ap);
    va_end(ap);
    put(b, tmp, n < 0 ? 0 : (size_t)n < sizeof tmp ? (size_t)n : sizeof tmp - 1);
}

static void hexid(uint64_t *s, char prefix, char out[16])
{
    snprintf(out, 16, "%c%012llx", prefix, (unsigned long long)(rnd(s) & 0xffffffffffffULL));
}

/* A hostile path segment. */
static void segment(uint64_t *s, struct buf *b)
{
    static const char *const fixed[] = {
        "..",     "%2e%2e", "%00",       "%",   "%zz",   "%ff%fe",      "%c3%28",
        "a%2fb",  "%20",    "fake",      ".",   "~root", "%252e",       "*",
        "%e2%82", "a;b",    "%0d%0aX:1", "%7f", "main",  "feature%2fx",
    };
    char id[16];
    switch (pick(s, 6)) {
    case 0:
        hexid(s, "jctb"[pick(s, 4)], id);
        putf(b, "%s", id);
        break;
    case 1: {
        size_t n = 1 + pick(s, 3000);
        for (size_t i = 0; i < n; i++)
            put(b, "a", 1);
        break;
    }
    case 2:
        put(b, "\xc3\xa9\xf0\x9f\x98\x80", 6); /* raw UTF-8 */
        break;
    default:
        putf(b, "%s", fixed[pick(s, sizeof fixed / sizeof fixed[0])]);
    }
}

/* GET routes to probe. /v1/events is left out: a stream that stays open by
 * design would only measure this test's patience. */
static const char *const get_routes[] = {
    "/healthz",
    "/v1/models",
    "/v1/widths",
    "/v1/builds",
    "/v1/builds/@",
    "/v1/jobs",
    "/v1/jobs/@",
    "/v1/jobs/@/cells/@",
    "/v1/jobs/@/cells/@/records",
    "/v1/jobs/@/cells/@/log",
    "/v1/compare",
    "/v1/branches/@",
    "/v1/commits/@",
    "/v1/commits/@/diff",
    "/v1/tokens",
    "/metrics",
    "/@/@/@/@/@/@/@/@/@/@",
    "//v1//jobs",
    "/v1/jobs/",
    "",
    "*",
    "http://capd/v1/jobs",
};

static const char *const queries[] = {
    "limit=-1",
    "limit=99999999999999999999",
    "limit=abc",
    "cursor=zzz",
    "cursor=s-5",
    "state=%ff",
    "kind=tensor%00",
    "format=%",
    "model=[",
    "width=*",
    "head=abcdef1&control=x",
    "commit=..",
    "branch=%0a",
    "a=1&a=2&a=3",
    "=",
    "&&&&",
    "%zz=%zz",
};

static void target(uint64_t *s, struct buf *b, const char *route)
{
    for (const char *c = route; *c; c++) {
        if (*c == '@')
            segment(s, b);
        else
            put(b, c, 1);
    }
    if (pick(s, 3) == 0) {
        put(b, "?", 1);
        int n = 1 + (int)pick(s, 3);
        for (int i = 0; i < n; i++)
            putf(b, "%s%s", i ? "&" : "", queries[pick(s, sizeof queries / sizeof queries[0])]);
    }
}

/* Valid-looking bodies, each to be spoiled below. */
static const char *const templates[] = {
    "{\"project\":\"t\",\"commit\":\"abcdef1\",\"build\":\"fake\",\"matrix\":{\"models\":"
    "[\"mlp\"],\"widths\":[\"avx2\"],\"passes\":[\"forward\"]},\"options\":{\"iterations\":5}}",
    "{\"name\":\"hb\",\"python\":\"/bin/true\",\"env\":{\"A\":\"1\"},\"model_roots\":[\"/tmp\"]}",
    "{\"control_commit\":\"abcdef1\"}",
    "{\"scope\":\"read\",\"name\":\"x\",\"expires_in_s\":60}",
};

/* JSON values capd must refuse or survive, case 1 to 4 of json_junk; the
 * last is invalid UTF-8, so a body holding it is never valid. */
static const struct lit junk_atoms[] = {
    {"1e999999", 8},
    {"null", 4},
    {"\"\\ud800\\u0000\\n\"", 16},
    {"\"\xff\xfe\"", 4},
};

static void json_junk(uint64_t *s, struct buf *b, int depth)
{
    unsigned k = depth > 3 ? pick(s, 5) : pick(s, 9);
    if (k >= 1 && k <= 4) {
        put(b, junk_atoms[k - 1].p, junk_atoms[k - 1].n);
        return;
    }
    switch (k) {
    case 0:
        putf(b, "%lld", (long long)(rnd(s) >> pick(s, 64)) * (pick(s, 2) ? 1 : -1));
        break;
    case 5: {
        int n = 1 + (int)pick(s, 3000);
        put_rep(b, '[', n);
        put_rep(b, ']', n);
        break;
    }
    case 6:
        put(b, "[", 1);
        json_junk(s, b, depth + 1);
        put(b, ",", 1);
        json_junk(s, b, depth + 1);
        put(b, "]", 1);
        break;
    case 7:
        put(b, "{\"k\":", 5);
        json_junk(s, b, depth + 1);
        put(b, "}", 1);
        break;
    default:
        put(b, "\"", 1);
        put_rep(b, 'x', (int)pick(s, 5000));
        put(b, "\"", 1);
    }
}

/* A body that no write route accepts: valid JSON with an unknown field
 * (always refused), or bytes that are not valid JSON at all. */
static void bad_body(uint64_t *s, struct buf *b)
{
    const char *t = templates[pick(s, sizeof templates / sizeof templates[0])];
    size_t tl = strlen(t);
    switch (pick(s, 6)) {
    case 0: /* truncated */
        put(b, t, pick(s, (unsigned)tl));
        break;
    case 1: { /* an invalid byte somewhere */
        size_t at = pick(s, (unsigned)tl);
        put(b, t, at);
        put(b, "\xff", 1);
        put(b, t + at, tl - at);
        break;
    }
    case 2: /* not JSON */
        for (int i = 0, n = 1 + (int)pick(s, 200); i < n; i++) {
            char c = (char)(1 + pick(s, 255));
            put(b, &c, 1);
        }
        put(b, "\xff", 1);
        break;
    case 3: /* duplicate keys */
        put(b, "{\"a\":1,\"a\":2,", 13);
        put(b, t + 1, tl - 1);
        break;
    default: /* an unknown field with a hostile value, then the template */
        put(b, "{\"zz_hostile\":", 14);
        json_junk(s, b, 0);
        put(b, ",", 1);
        put(b, t + 1, tl - 1);
    }
}

struct gen {
    struct buf req;
    bool write;       /* a method that could change something */
    bool incomplete;  /* the request never completes: capd must time it out */
    bool bad_version; /* an HTTP version libmicrohttpd answers with 505 */
    char desc[160];
};

static void header_lines(uint64_t *s, struct buf *b, bool write)
{
    static const char *const ctypes[] = {
        "application/json",
        "application/json; charset=utf-8",
        "APPLICATION/JSON",
        "application/jsonx",
        "text/plain",
        "",
        "multipart/form-data; boundary=x",
        "application/json;;;",
    };
    if (pick(s, 20))
        put(b, "Host: capd\r\n", 12);
    put(b, "Connection: close\r\n", 19);
    unsigned a = pick(s, 10);
    if (a < 6) {
        putf(b, "Authorization: Bearer %s\r\n", g_token);
    } else if (a == 6) {
        char bad[STORE_TOKEN_LEN + 1];
        snprintf(bad, sizeof bad, "%s", g_token);
        bad[20 + pick(s, 60)] ^= 1;
        putf(b, "Authorization: Bearer %s\r\n", bad);
    } else if (a == 7) {
        static const char *const junk[] = {"Basic YTpi",
                                           "Bearer",
                                           "Bearer  ",
                                           "bearer capd_",
                                           "Bearer capd_t000000000000_",
                                           "Digest x=y",
                                           "Bearer \x01\x02"};
        putf(b, "Authorization: %s\r\n", junk[pick(s, sizeof junk / sizeof junk[0])]);
    } else if (a == 8) {
        put(b, "Authorization: Bearer ", 22);
        put_rep(b, 'A', 1 + (int)pick(s, 9000));
        put(b, "\r\n", 2);
    }
    if (write || pick(s, 4) == 0)
        putf(b, "Content-Type: %s\r\n", ctypes[pick(s, sizeof ctypes / sizeof ctypes[0])]);
    /* Broken header lines, case 0 to 3 below; the first goes out with its
     * terminating NUL byte. */
    static const struct lit broken[] = {
        {"X-Junk: \x7f\x01\r\n", 13},
        {"NoColonHere\r\n", 13},
        {": empty-name\r\n", 14},
        {"X-Fold: a\r\n  folded\r\n", 21},
    };
    unsigned k = pick(s, 12);
    if (k <= 3) {
        put(b, broken[k].p, broken[k].n);
    } else if (k == 4) {
        putf(b, "Idempotency-Key: %s\r\n", pick(s, 2) ? "\xff\xfe" : "k\x01");
    } else if (k == 5) {
        put(b, "X-Big: ", 7);
        put_rep(b, 'b', (int)pick(s, 40000));
        put(b, "\r\n", 2);
    }
}

static void generate(uint64_t *s, struct gen *g)
{
    static const char *const write_methods[] = {"POST", "PUT", "DELETE", "PATCH", "post"};
    static const char *const other_methods[] = {"GET",   "GET",     "GET", "HEAD",  "OPTIONS",
                                                "TRACE", "CONNECT", "FOO", "G\x01T"};
    static const char *const versions[] = {"HTTP/1.1", "HTTP/1.1", "HTTP/1.1",  "HTTP/1.0",
                                           "HTTP/2.0", "HTTP/9.9", "HTTP/1.1x", ""};
    struct buf *b = &g->req;
    b->n = 0;
    g->write = g->incomplete = g->bad_version = false;
    unsigned kind = pick(s, 100);
    if (kind < 3) { /* garbage request lines */
        static const char *const lines[] = {
            "\r\n\r\n",
            "GET\r\n\r\n",
            "GET /healthz\r\n\r\n",
            "GET  /healthz  HTTP/1.1\r\n\r\n",
            "\x00\x01\x02 / HTTP/1.1\r\n\r\n",
            " / HTTP/1.1\r\nHost: x\r\n\r\n",
            "GET /healthz HTTP/1.1\nHost: x\n\n",
        };
        unsigned i = pick(s, sizeof lines / sizeof lines[0]);
        /* Line 4 starts with a NUL byte: its length is not strlen's. */
        static const char nul_line[] = "\x00\x01\x02 / HTTP/1.1\r\n\r\n";
        put(b, lines[i], i == 4 ? sizeof nul_line - 1 : strlen(lines[i]));
        snprintf(g->desc, sizeof g->desc, "garbage request line %u", i);
        return;
    }
    if (kind < 5) { /* a request line of 20 KiB */
        put(b, "GET /", 5);
        put_rep(b, 'x', 20000);
        put(b, " HTTP/1.1\r\nConnection: close\r\n\r\n", 32);
        snprintf(g->desc, sizeof g->desc, "20 KiB request line");
        return;
    }
    const char *method;
    char path[64] = "";
    struct buf t = {malloc(REQ_MAX), 0, 16384};
    if (kind < 55) {
        g->write = true;
        method = write_methods[pick(s, sizeof write_methods / sizeof write_methods[0])];
        static const char *const wroutes[] = {"/v1/jobs",       "/v1/builds", "/v1/builds/@",
                                              "/v1/branches/@", "/v1/tokens", "/v1/jobs/@/cancel",
                                              "/v1/tokens/@",   "/v1/jobs/@"};
        const char *r = wroutes[pick(s, sizeof wroutes / sizeof wroutes[0])];
        /* Writes to a named thing name something that does not exist, or a
         * known name with a body that is always refused. */
        target(s, &t, r);
    } else {
        method = other_methods[pick(s, sizeof other_methods / sizeof other_methods[0])];
        target(s, &t, get_routes[pick(s, sizeof get_routes / sizeof get_routes[0])]);
    }
    snprintf(path, sizeof path, "%.*s", (int)(t.n < 60 ? t.n : 60), t.p);
    const char *ver = versions[pick(s, sizeof versions / sizeof versions[0])];
    g->bad_version = strcmp(ver, "HTTP/1.1") != 0 && strcmp(ver, "HTTP/1.0") != 0;
    putf(b, "%s ", method);
    put(b, t.p, t.n);
    putf(b, "%s%s\r\n", ver[0] ? " " : "", ver);
    free(t.p);
    header_lines(s, b, g->write);
    struct buf body = {malloc(REQ_MAX), 0, 48 * 1024};
    if (g->write || pick(s, 8) == 0)
        bad_body(s, &body);
    unsigned framing = pick(s, 400);
    if (body.n == 0 && framing < 300) {
        put(b, "\r\n", 2);
    } else if (framing < 280) {
        putf(b, "Content-Length: %zu\r\n\r\n", body.n);
        put(b, body.p, body.n);
    } else if (framing < 340) { /* chunked, well formed */
        put(b, "Transfer-Encoding: chunked\r\n\r\n", 31);
        size_t o = 0;
        while (o < body.n) {
            size_t c = 1 + pick(s, 700);
            if (c > body.n - o)
                c = body.n - o;
            putf(b, "%zx\r\n", c);
            put(b, body.p + o, c);
            put(b, "\r\n", 2);
            o += c;
        }
        put(b, "0\r\n\r\n", 5);
    } else if (framing < 390) { /* chunked, malformed */
        static const char *const bad[] = {"zz\r\n", "ffffffffffffffffffffffff\r\nx\r\n", "-1\r\n",
                                          "5;ext=\x01\r\nabcde\r\n0\r\n\r\n",
                                          "3\r\nabcdef\r\n0\r\n\r\n"};
        put(b, "Transfer-Encoding: chunked\r\n\r\n", 31);
        putf(b, "%s", bad[pick(s, sizeof bad / sizeof bad[0])]);
    } else if (framing < 394) { /* lengths that lie or cannot be */
        static const char *const cls[] = {"-1", "99999999999999999999", "0x10", "1, 2",
                                          "18446744073709551615"};
        putf(b, "Content-Length: %s\r\n\r\n", cls[pick(s, sizeof cls / sizeof cls[0])]);
        put(b, body.p, body.n);
    } else if (framing < 398) { /* both framings at once */
        putf(b, "Content-Length: %zu\r\nTransfer-Encoding: chunked\r\n\r\n", body.n);
        put(b, body.p, body.n);
    } else { /* promises more than it sends: capd must time it out */
        putf(b, "Content-Length: %zu\r\n\r\n", body.n + 10);
        put(b, body.p, body.n);
        g->incomplete = true;
    }
    free(body.p);
    snprintf(g->desc, sizeof g->desc, "%s %s ... framing %u", method, path, framing);
}

/* ---- sending ---- */

/* Whether BUF (N bytes) holds a whole response: its head and then
 * Content-Length bytes, or a chunked body up to its last chunk. */
static bool complete(const char *buf, size_t n)
{
    const char *end = memmem(buf, n, "\r\n\r\n", 4);
    if (!end)
        return false;
    size_t head = (size_t)(end + 4 - buf);
    const char *cl = memmem(buf, head, "Content-Length:", 15);
    if (cl)
        return n >= head + strtoul(cl + 15, NULL, 10);
    if (memmem(buf, head, "chunked", 7))
        return memmem(buf + head, n - head, "0\r\n\r\n", 5) != NULL;
    return false;
}

/* Sends REQ, half-closes, and reads until EOF or a complete response;
 * returns the status (0: closed without one, -1: neither within 15 s). */
static int exchange(const char *req, size_t n)
{
    int fd = tcp_connect_local(g_port);
    if (fd < 0)
        return -2;
    size_t o = 0;
    while (o < n) {
        struct pollfd p = {.fd = fd, .events = POLLOUT | POLLIN};
        if (poll(&p, 1, 5000) <= 0)
            break;
        if (p.revents & (POLLIN | POLLERR | POLLHUP))
            break; /* capd answered or closed early */
        ssize_t w = send(fd, req + o, n - o, MSG_NOSIGNAL | MSG_DONTWAIT);
        if (w <= 0) {
            if (errno == EAGAIN)
                continue;
            break;
        }
        o += (size_t)w;
    }
    /* EOF after the request: a server waiting for more of a broken one can
     * tell at once (libmicrohttpd does, except inside a body). */
    shutdown(fd, SHUT_WR);
    static __thread char buf[65536];
    size_t got = 0;
    double deadline = tu_now_s() + 15;
    int status = -1;
    buf[0] = 0;
    for (;;) {
        int left = (int)((deadline - tu_now_s()) * 1000);
        struct pollfd p = {.fd = fd, .events = POLLIN};
        if (left <= 0 || poll(&p, 1, left) <= 0)
            break;
        ssize_t r = recv(fd, buf + got, sizeof buf - 1 - got, 0);
        if (r <= 0) {
            status = 0;
            break;
        }
        got += (size_t)r;
        buf[got] = 0;
        if (complete(buf, got))
            break;
        if (got >= sizeof buf - 1)
            got = 12; /* keep the status line, drop the rest */
    }
    if (strncmp(buf, "HTTP/1.", 7) == 0 && got >= 12)
        status = atoi(buf + 9);
    close(fd);
    return status;
}

struct worker {
    uint64_t seed;
    int count;
    int by_class[6]; /* 0: closed without a reply, 1..5: 1xx..5xx */
    int timeouts, incomplete, v505;
    char failure[400];
};

static void *run_worker(void *arg)
{
    struct worker *w = arg;
    uint64_t s = w->seed;
    struct gen g = {.req = {malloc(REQ_MAX), 0, REQ_MAX}};
    for (int i = 0; i < w->count; i++) {
        generate(&s, &g);
        w->incomplete += g.incomplete;
        int st = exchange(g.req.p, g.req.n);
        if (st == -1 || st == -2) {
            w->timeouts++;
            if (!w->failure[0])
                snprintf(w->failure, sizeof w->failure,
                         "seed %llu request %d: no answer and no close within 15 s (%s)",
                         (unsigned long long)w->seed, i, g.desc);
            continue;
        }
        w->by_class[st / 100 > 5 ? 5 : st / 100]++;
        /* 505 is libmicrohttpd's answer to an HTTP version it does not
         * speak: a refusal, not a server error. Any other 5xx is a bug. */
        if (st == 505 && g.bad_version)
            w->v505++;
        else if (st >= 500 && !w->failure[0])
            snprintf(w->failure, sizeof w->failure, "seed %llu request %d: status %d for %s",
                     (unsigned long long)w->seed, i, st, g.desc);
        if (g.write && st >= 200 && st < 300 && !w->failure[0])
            snprintf(w->failure, sizeof w->failure,
                     "seed %llu request %d: a bad write was accepted (%d): %s",
                     (unsigned long long)w->seed, i, st, g.desc);
    }
    free(g.req.p);
    return NULL;
}

static char *snapshot(const char *data, const char *dir, const char *name)
{
    char out[512];
    snprintf(out, sizeof out, "%s/%s", dir, name);
    int rc = tu_sh("sqlite3 -readonly '%s/capd.db' \"SELECT * FROM builds ORDER BY name; "
                   "SELECT * FROM jobs ORDER BY seq; SELECT * FROM cells ORDER BY seq; "
                   "SELECT * FROM attempts ORDER BY id; SELECT * FROM branches ORDER BY name; "
                   "SELECT * FROM tokens ORDER BY id;\" >'%s'",
                   data, out);
    cr_assert_eq(rc, 0, "sqlite3 snapshot");
    FILE *f = fopen(out, "rb");
    cr_assert_not_null(f);
    char *p = calloc(1, 1 << 20);
    size_t n = fread(p, 1, (1 << 20) - 1, f);
    p[n] = 0;
    fclose(f);
    return p;
}

static int warm_fds(const struct tu_capd *c)
{
    for (int i = 0; i < 64; i++) {
        char auth[200];
        snprintf(auth, sizeof auth, "Authorization: Bearer %s", g_token);
        const char *hdr[] = {auth, NULL};
        struct tu_resp r;
        tu_http(c, "GET", "/v1/builds", NULL, 0, hdr, &r);
        tu_resp_free(&r);
    }
    usleep(300 * 1000);
    return tu_count_fds(c->pid);
}

Test(hostile, ten_thousand_bad_requests, .timeout = 600)
{
    char *dir = tu_tmpdir();
    char data[400], cfg[400], out[400];
    snprintf(data, sizeof data, "%s/data", dir);
    snprintf(cfg, sizeof cfg, "%s/capd.json", dir);
    snprintf(out, sizeof out, "%s/tok", dir);
    cr_assert_eq(tu_sh("'%s' token create --data-dir '%s' --scope admin >'%s' 2>/dev/null",
                       tu_bin("CAPD_BIN"), data, out),
                 0);
    FILE *f = fopen(out, "r");
    cr_assert(f && fgets(g_token, sizeof g_token, f));
    fclose(f);
    f = fopen(cfg, "w");
    /* The generated requests name capd "capd" or "x". */
    fputs("{\"auth_required\": true, \"allowed_hosts\": [\"capd\", \"x\"], \"request_timeout_s\": "
          "1, \"max_body_bytes\": 32768, "
          "\"connection_memory_bytes\": 32768, \"max_queued_jobs\": 0}",
          f);
    fclose(f);
    const char *extra[] = {"--config", cfg, NULL};
    struct tu_capd c;
    cr_assert_eq(tu_capd_start(&c, dir, extra), 0);
    g_port = c.port;
    /* Something to protect: a build, a branch, a token. */
    char auth[200], body[1024];
    snprintf(auth, sizeof auth, "Authorization: Bearer %s", g_token);
    const char *hdr[] = {auth, "Content-Type: application/json", NULL};
    struct tu_resp r;
    char *fake = tu_helper("fake_runner");
    snprintf(body, sizeof body, "{\"name\":\"fake\",\"python\":\"%s\",\"model_roots\":[\"%s\"]}",
             fake, dir);
    free(fake);
    tu_http(&c, "POST", "/v1/builds", body, strlen(body), hdr, &r);
    cr_assert_eq(r.status, 201, "%s", r.body);
    tu_resp_free(&r);
    tu_http(&c, "PUT", "/v1/branches/main", "{\"control_commit\":\"abcdef1\"}", 28, hdr, &r);
    cr_assert_eq(r.status, 200, "%s", r.body);
    tu_resp_free(&r);

    char *before = snapshot(data, dir, "before.txt");
    int fds_before = warm_fds(&c);

    struct worker w[HOSTILE_THREADS];
    pthread_t th[HOSTILE_THREADS];
    double t0 = tu_now_s();
    for (int i = 0; i < HOSTILE_THREADS; i++) {
        memset(&w[i], 0, sizeof w[i]);
        w[i].seed = 0x9e3779b97f4a7c15ULL * (uint64_t)(i + 1);
        w[i].count = HOSTILE_REQUESTS / HOSTILE_THREADS;
        pthread_create(&th[i], NULL, run_worker, &w[i]);
    }
    int total = 0, cls[6] = {0}, incomplete = 0, timeouts = 0, v505 = 0;
    for (int i = 0; i < HOSTILE_THREADS; i++) {
        pthread_join(th[i], NULL);
        total += w[i].count;
        incomplete += w[i].incomplete;
        timeouts += w[i].timeouts;
        v505 += w[i].v505;
        for (int k = 0; k < 6; k++)
            cls[k] += w[i].by_class[k];
    }
    double dt = tu_now_s() - t0;
    fprintf(stderr,
            "hostile: %d requests in %.1f s: %d closed without a reply, %d 2xx (reads), %d 3xx, "
            "%d 4xx, %d 505 (unsupported HTTP version), %d other 5xx, %d timed out; %d never "
            "completed by the client\n",
            total, dt, cls[0], cls[2], cls[3], cls[4], v505, cls[5] - v505, timeouts, incomplete);
    for (int i = 0; i < HOSTILE_THREADS; i++)
        cr_assert_eq(w[i].failure[0], 0, "%s", w[i].failure);
    cr_assert_eq(total, HOSTILE_REQUESTS);
    cr_assert_eq(cls[5] - v505, 0, "no 5xx but 505 for bad versions");
    cr_assert_gt(cls[4], total / 2, "most requests are refused with a 4xx");

    /* Still serving, nothing leaked, nothing changed. */
    long st;
    json_decref(tu_json(&c, "GET", "/healthz", NULL, &st));
    cr_assert_eq(st, 200, "capd still serves");
    int fds_after = warm_fds(&c);
    cr_assert_leq(fds_after, fds_before + 3, "fds: %d before, %d after", fds_before, fds_after);
    char *after = snapshot(data, dir, "after.txt");
    cr_assert_str_eq(after, before, "the database changed");
    free(before);
    free(after);
    cr_assert_eq(tu_capd_stop(&c), 0, "capd exits 0 after the storm");
    tu_sh("rm -rf '%s'", dir);
    free(dir);
}
