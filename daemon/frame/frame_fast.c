/* frame_fast.c: the fast validator of tensor headers, and the reading of
 * the stats it located (frame_tensor_stats()).
 *
 * jansson builds a tree of ~30 allocated values for a tensor header, which
 * costs more than everything else ingest does with the frame. This validator
 * walks the line once without allocating and fills struct frame_tensor. It is
 * deliberately partial: it accepts only what it can judge exactly (ASCII,
 * no escapes, objects of at most FAST_MAX_MEMBERS members, nesting up to
 * FAST_MAX_DEPTH) and returns false for anything else, valid or not, so the
 * jansson path (frame_check.c) decides and words the error. It must therefore
 * never accept a header the jansson path would reject; test_frame.c checks
 * that by feeding mutated headers through both.
 */
#include "daemon/frame/frame.h"
#include "daemon/frame/frame_int.h"

#include <errno.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

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

/* A member's name and the ':' after it: returns where its value starts
 * (past white space, inside the line), or NULL. */
static const char *f_key(const char *s, const char *e, struct fast_val *key)
{
    if (s >= e || *s != '"' || !(s = f_str(s, e, key)))
        return NULL;
    s = f_ws(s, e);
    if (s >= e || *s != ':')
        return NULL;
    s = f_ws(s + 1, e);
    return s < e ? s : NULL;
}

/* Reads one member or element at s and returns where it ends, or NULL. */
typedef const char *(*f_item_fn)(struct frame_parser *p, const char *s, const char *e, void *ctx);

/* The members or elements of the object or array whose opening bracket is
 * at s, up to the bracket CLOSE: each is read by ITEM, and they are
 * separated by commas. Returns where the container ends, or NULL. */
static inline const char *f_items(struct frame_parser *p, const char *s, const char *e, char close,
                                  f_item_fn item, void *ctx)
{
    s = f_ws(s + 1, e);
    if (s < e && *s == close)
        return s + 1;
    for (;;) {
        if (!(s = item(p, s, e, ctx)))
            return NULL;
        s = f_ws(s, e);
        if (s < e && *s == ',') {
            s = f_ws(s + 1, e);
            continue;
        }
        if (s < e && *s == close)
            return s + 1;
        return NULL;
    }
}

/* An object of unknown members being read: its depth, and the names of
 * the members seen so far, to find duplicates. */
struct f_any {
    int depth;
    struct fast_val keys[FAST_MAX_MEMBERS];
    size_t nk;
};

/* One element of an array of anything; CTX points to its depth. */
static const char *f_any_elem(struct frame_parser *p, const char *s, const char *e, void *ctx)
{
    struct fast_val v;

    return f_value(p, s, e, *(int *)ctx, &v);
}

/* One member of an object whose members are all unknown to us: duplicates
 * are found by comparing every key with the previous ones. */
static const char *f_any_member(struct frame_parser *p, const char *s, const char *e, void *ctx)
{
    struct f_any *a = ctx;
    struct fast_val v;

    if (a->nk == FAST_MAX_MEMBERS || !(s = f_key(s, e, &a->keys[a->nk])) ||
        f_dup(a->keys, a->nk, &a->keys[a->nk]))
        return NULL;
    a->nk++;
    return f_value(p, s, e, a->depth, &v);
}

static const char *f_obj(struct frame_parser *p, const char *s, const char *e, int depth)
{
    struct f_any a;

    if (depth > FAST_MAX_DEPTH)
        return NULL;
    a.depth = depth;
    a.nk = 0;
    return f_items(p, s, e, '}', f_any_member, &a);
}

static const char *f_arr(struct frame_parser *p, const char *s, const char *e, int depth)
{
    if (depth > FAST_MAX_DEPTH)
        return NULL;
    return f_items(p, s, e, ']', f_any_elem, &depth);
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

/* One dimension of "shape": a non-negative integer, while there is room. */
static const char *f_dim(struct frame_parser *p, const char *s, const char *e, void *ctx)
{
    struct frame_tensor *t = ctx;
    struct fast_val v;

    if ((*s != '-' && !f_digit(*s)) || t->ndim == FRAME_MAX_NDIM)
        return NULL;
    if (!(s = f_num(p, s, e, &v)) || v.t != T_INT || v.i < 0)
        return NULL;
    t->shape[t->ndim++] = v.i;
    return s;
}

/* "shape": an array of at most FRAME_MAX_NDIM non-negative integers. */
static const char *f_shape(struct frame_parser *p, const char *s, const char *e,
                           struct frame_tensor *t)
{
    t->ndim = 0;
    if (s >= e || *s != '[')
        return NULL;
    return f_items(p, s, e, ']', f_dim, t);
}

/* The members of "stats" in frame_stats order: five reals, then four counts. */
static const struct {
    const char *name;
    size_t len;
} stat_keys[9] = {
    {"min", 3}, {"max", 3},  {"mean", 4}, {"std", 3},   {"l2", 2},
    {"nan", 3}, {"pinf", 4}, {"ninf", 4}, {"zeros", 5},
};

/* The members of "stats" seen so far: the known ones by bit in SEEN, the
 * names of the others in KEYS (to find duplicates). */
struct f_stats_seen {
    struct fast_val keys[FAST_MAX_MEMBERS];
    unsigned seen;
    size_t nk;
};

/* The value of stat_keys[k]: a real or null (k < 5) or a count (k >= 5). */
static const char *f_stat_value(struct frame_parser *p, const char *s, const char *e, int k)
{
    struct fast_val v;

    if (k < 5) {
        if (*s == 'n')
            return f_lit(s, e, "null", 4);
        if (*s == '-' || f_digit(*s))
            return f_num(p, s, e, &v);
        return NULL;
    }
    if (*s != '-' && !f_digit(*s))
        return NULL;
    if (!(s = f_num(p, s, e, &v)) || v.t != T_INT || v.i < 0)
        return NULL;
    return s;
}

/* One member of "stats": a known one is located in p->stat_at[], any other
 * is skipped. */
static const char *f_stat(struct frame_parser *p, const char *s, const char *e, void *ctx)
{
    struct f_stats_seen *st = ctx;
    struct fast_val *key = &st->keys[st->nk];
    struct fast_val v;
    int k = -1;

    if (st->nk == FAST_MAX_MEMBERS || !(s = f_key(s, e, key)))
        return NULL;
    for (int i = 0; i < 9 && k < 0; i++)
        if (stat_keys[i].len == key->n && memcmp(stat_keys[i].name, key->s, key->n) == 0)
            k = i;
    if (k < 0) {
        if (f_dup(st->keys, st->nk, key))
            return NULL;
        st->nk++;
        return f_value(p, s, e, 2, &v);
    }
    if (st->seen & (1u << k))
        return NULL;
    st->seen |= 1u << k;
    st->nk++;
    p->stat_at[k] = s;
    return f_stat_value(p, s, e, k);
}

/* "stats": known members typed as check_stats() wants them, others skipped.
 * Values are not converted, only located in p->stat_at[]. */
static const char *f_stats(struct frame_parser *p, const char *s, const char *e)
{
    struct f_stats_seen st;

    memset(p->stat_at, 0, sizeof(p->stat_at));
    if (s >= e || *s != '{')
        return NULL;
    st.seen = 0;
    st.nk = 0;
    return f_items(p, s, e, '}', f_stat, &st);
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
    K_HASH_ALG,
    K_COUNT
};

static const struct {
    const char *name;
    size_t len;
} fast_keys[K_COUNT] = {
    [K_KIND] = {"kind", 4},         [K_SEQ] = {"seq", 3},
    [K_KEY] = {"key", 3},           [K_DTYPE] = {"dtype", 5},
    [K_SHAPE] = {"shape", 5},       [K_NUMEL] = {"numel", 5},
    [K_STATS] = {"stats", 5},       [K_HASH] = {"hash", 4},
    [K_CAPTURE] = {"capture", 7},   [K_NBYTES] = {"nbytes", 6},
    [K_MODULE] = {"module", 6},     [K_PHASE] = {"phase", 5},
    [K_ROLE] = {"role", 4},         [K_SAMPLE_POS] = {"sample_positions", 16},
    [K_CALL] = {"call", 4},         [K_INDEX] = {"index", 5},
    [K_HASH_ALG] = {"hash_alg", 8},
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

/* The members of a tensor header that the scan found, by K_* index. */
struct fast_hdr {
    struct fast_val vals[K_COUNT];
    unsigned seen;   /* bit k: member k is present */
    uint64_t nbytes; /* 0 when absent */
};

/* The members of the header object seen so far: the known ones in H, the
 * names of the others in UNKNOWN (kept to find duplicates). */
struct fast_seen {
    struct fast_hdr *h;
    struct fast_val unknown[FAST_MAX_MEMBERS];
    size_t nu;
};

/* One "name": value member of the header object at s, into h (a known
 * member) or unknown[] (any other). Returns where the value ends, or NULL. */
static const char *fast_member(struct frame_parser *p, const char *s, const char *e, void *ctx)
{
    struct fast_seen *fs = ctx;
    struct fast_hdr *h = fs->h;
    struct fast_val key, scratch;
    struct fast_val *v = &scratch;
    int k;

    if (!(s = f_key(s, e, &key)) || key.n == 0)
        return NULL;
    k = fast_key(&key);
    if (k >= 0) {
        if (h->seen & (1u << k))
            return NULL;
        h->seen |= 1u << k;
        v = &h->vals[k];
    } else {
        if (fs->nu == FAST_MAX_MEMBERS || f_dup(fs->unknown, fs->nu, &key))
            return NULL;
        fs->unknown[fs->nu++] = key;
    }
    if (k == K_SHAPE) {
        v->t = T_ARR;
        return f_shape(p, s, e, &p->cur.tensor);
    }
    if (k == K_STATS) {
        v->t = T_OBJ;
        return f_stats(p, s, e);
    }
    return f_value(p, s, e, 1, v);
}

/* Walks the line as one JSON object and nothing after it, collecting its
 * members into h (the shape goes straight to p->cur.tensor, the places of
 * the stats to p->stat_at). */
static bool fast_scan(struct frame_parser *p, const char *text, size_t len, struct fast_hdr *h)
{
    const char *s = text, *e = text + len;
    struct fast_seen fs;

    s = f_ws(s, e);
    if (s >= e || *s != '{')
        return false;
    fs.h = h;
    fs.nu = 0;
    if (!(s = f_items(p, s, e, '}', fast_member, &fs)))
        return false;
    return f_ws(s, e) == e;
}

/* The same rules as check_tensor() of frame_check.c, without the words; fills h->nbytes and
 * the numbers and capture level of p->cur.tensor. */
static bool fast_rules(struct frame_parser *p, struct fast_hdr *h)
{
    const struct fast_val *vals = h->vals;
    struct frame_tensor *t = &p->cur.tensor;
    int64_t prod = 1;

    if ((h->seen & ((1u << K_NBYTES) - 1)) != (1u << K_NBYTES) - 1)
        return false;
    if (!f_is(&vals[K_KIND], "tensor"))
        return false;
    h->nbytes = 0;
    if (h->seen & (1u << K_NBYTES)) {
        if (vals[K_NBYTES].t != T_INT || vals[K_NBYTES].i < 0)
            return false;
        h->nbytes = (uint64_t)vals[K_NBYTES].i;
        if (h->nbytes > p->lim.max_payload ||
            h->nbytes > p->lim.max_total_payload - p->payload_announced)
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
    if (vals[K_HASH].t != T_STR || !frame__hash_ok(vals[K_HASH].s, vals[K_HASH].n))
        return false;
    t->hash_alg = FRAME_HASH_BLAKE2B_128;
    if (h->seen & (1u << K_HASH_ALG)) {
        int a = vals[K_HASH_ALG].t == T_STR
                    ? frame__hash_alg_of(vals[K_HASH_ALG].s, vals[K_HASH_ALG].n)
                    : -1;
        if (a < 0 || vals[K_HASH].n != FRAME__HASH_ALG_DIGITS)
            return false;
        t->hash_alg = (enum frame_hash_alg)a;
    }
    if (f_is(&vals[K_CAPTURE], "stats"))
        t->capture = FRAME_CAPTURE_STATS;
    else if (f_is(&vals[K_CAPTURE], "sample"))
        t->capture = FRAME_CAPTURE_SAMPLE;
    else if (f_is(&vals[K_CAPTURE], "full"))
        t->capture = FRAME_CAPTURE_FULL;
    else
        return false;
    for (int k = K_MODULE; k <= K_SAMPLE_POS; k++)
        if ((h->seen & (1u << k)) && vals[k].t != T_STR)
            return false;
    if ((h->seen & (1u << K_CALL)) && (vals[K_CALL].t != T_INT || vals[K_CALL].i < 0))
        return false;
    if ((h->seen & (1u << K_INDEX)) && vals[K_INDEX].t != T_INT && vals[K_INDEX].t != T_STR)
        return false;
    t->seq = vals[K_SEQ].i;
    t->numel = prod;
    return true;
}

/* Publishes NUL-terminated copies of the key, dtype and hash in p->tstr. */
static void fast_publish(struct frame_parser *p, const struct fast_hdr *h)
{
    const struct fast_val *vals = h->vals;
    struct frame_tensor *t = &p->cur.tensor;
    char *d = p->tstr;

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
}

/* Scans, checks and publishes, in that order. Parser state other than
 * p->cur.tensor, p->tstr and p->stat_at is only touched on success. */
bool frame__fast_tensor(struct frame_parser *p, const char *text, size_t len, uint64_t *nbytes_out)
{
    struct fast_hdr h;
    struct frame_tensor *t = &p->cur.tensor;

    h.seen = 0;
    if (!fast_scan(p, text, len, &h) || !fast_rules(p, &h))
        return false;
    fast_publish(p, &h);
    if (frame__payload_check(t, frame__dtype_size(t->dtype), h.nbytes) != FRAME__PAY_OK)
        return false;
    p->last_seq = t->seq;
    p->stats_fast = true;
    *nbytes_out = h.nbytes;
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
        json_t *v = json_object_get(stats, frame__stats_reals[i]);

        if (json_is_number(v))
            *reals[i] = json_number_value(v);
    }
    for (int i = 0; i < 4; i++) {
        json_t *v = json_object_get(stats, frame__stats_counts[i]);

        if (json_is_integer(v))
            *counts[i] = json_integer_value(v);
    }
    return 0;
}
