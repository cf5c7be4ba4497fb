/* frame_check.c: the jansson path of the frame parser. It parses a header
 * line into a tree, checks it against the protocol (ordering, then the
 * fields of its kind), and words every error. It also owns the tensor rules
 * that the fast validator of frame_fast.c applies too (dtype sizes, hashes,
 * the payload a capture level implies), and frame_header(), which builds the
 * tree on demand for a tensor header the fast path accepted.
 */
#include "daemon/frame/frame.h"
#include "daemon/frame/frame_int.h"

#include <errno.h>
#include <inttypes.h>
#include <string.h>

/* The kind named S, read from frame_kind_name's table. The hot path sees
 * mostly "tensor", so the first byte is compared before strcmp. */
static enum frame_kind kind_of(const char *s)
{
    for (enum frame_kind k = FRAME_HELLO; k < FRAME_UNKNOWN; k++) {
        const char *name = frame_kind_name(k);
        if (name[0] == s[0] && strcmp(name, s) == 0)
            return k;
    }
    return FRAME_UNKNOWN;
}

static const char *type_name(const json_t *v)
{
    static const char *const names[] = {
        [JSON_OBJECT] = "object",   [JSON_ARRAY] = "array", [JSON_STRING] = "string",
        [JSON_INTEGER] = "integer", [JSON_REAL] = "real",   [JSON_TRUE] = "true",
        [JSON_FALSE] = "false",     [JSON_NULL] = "null",
    };
    unsigned t = (unsigned)json_typeof(v);
    return t < sizeof names / sizeof names[0] && names[t] ? names[t] : "?";
}

static int get_field(struct frame_parser *p, json_t *h, const char *kind, const char *name,
                     json_type type, const char *what, bool required, json_t **out)
{
    json_t *v = json_object_get(h, name);

    *out = v;
    if (!v) {
        if (required)
            return frame__bad(p, "%s header missing %s field \"%s\"", kind, what, name);
        return 0;
    }
    if (json_typeof(v) != type) {
        bool an = type == JSON_INTEGER || type == JSON_OBJECT || type == JSON_ARRAY;

        return frame__bad(p, "%s field \"%s\" must be %s %s, got %s", kind, name, an ? "an" : "a",
                          what, type_name(v));
    }
    return 0;
}

static int need_str(struct frame_parser *p, json_t *h, const char *kind, const char *name,
                    json_t **out)
{
    return get_field(p, h, kind, name, JSON_STRING, "string", true, out);
}

/* The required string field NAME: its text into *S, its length into *N. */
static int need_text(struct frame_parser *p, json_t *h, const char *kind, const char *name,
                     const char **s, size_t *n)
{
    json_t *v;
    int rc = need_str(p, h, kind, name, &v);

    if (rc)
        return rc;
    *s = json_string_value(v);
    *n = json_string_length(v);
    return 0;
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
        return frame__bad(p, "%s field \"%s\" must be >= 0, got %" JSON_INTEGER_FORMAT, kind, name,
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
    return frame__bad(p, "%s field \"%s\" has invalid value \"%.64s\"", kind, name, s);
}

/* The required array NAME of a KIND frame, at most MAX elements, each a
 * non-negative integer, into *OUT. Too many is "SUBJECT has N WHAT, more
 * than MAX"; a bad element is named "KIND NAME[i]". */
static int check_counts(struct frame_parser *p, json_t *h, const char *kind, const char *name,
                        size_t max, const char *subject, const char *what, json_t **out)
{
    json_t *v;
    size_t n;
    int rc;

    if ((rc = get_field(p, h, kind, name, JSON_ARRAY, "array", true, &v)))
        return rc;
    n = json_array_size(v);
    if (n > max)
        return frame__bad(p, "%s has %zu %s, more than %zu", subject, n, what, max);
    for (size_t i = 0; i < n; i++) {
        json_t *d = json_array_get(v, i);

        if (!json_is_integer(d) || json_integer_value(d) < 0)
            return frame__bad(p, "%s %s[%zu] must be a non-negative integer", kind, name, i);
    }
    *out = v;
    return 0;
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

/* The sizes of the dtypes protocol.md names, and of the rest of torch's. */
unsigned frame__dtype_size(const char *d)
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

const char *const frame__stats_reals[] = {"min", "max", "mean", "std", "l2", NULL};
const char *const frame__stats_counts[] = {"nan", "pinf", "ninf", "zeros", NULL};

/* The stats members are optional, but when present they must have the types
 * the comparison engine reads: numbers (or null when nothing was finite) and
 * non-negative counts. */
static int check_stats(struct frame_parser *p, json_t *stats)
{
    for (size_t i = 0; frame__stats_reals[i]; i++) {
        json_t *v = json_object_get(stats, frame__stats_reals[i]);

        if (v && !json_is_number(v) && !json_is_null(v))
            return frame__bad(p, "tensor field \"stats.%s\" must be a number or null, got %s",
                              frame__stats_reals[i], type_name(v));
    }
    for (size_t i = 0; frame__stats_counts[i]; i++) {
        json_t *v = json_object_get(stats, frame__stats_counts[i]);

        if (v && (!json_is_integer(v) || json_integer_value(v) < 0))
            return frame__bad(p, "tensor field \"stats.%s\" must be a non-negative integer",
                              frame__stats_counts[i]);
    }
    return 0;
}

static uint64_t payload_full_size(const struct frame_tensor *t, unsigned isz)
{
    uint64_t all;

    if (__builtin_mul_overflow((uint64_t)t->numel, (uint64_t)isz, &all))
        return UINT64_MAX;
    return all;
}

/* Shared by both validation paths: a stats capture carries nothing, a full
 * one every element, a sample whole elements up to the full size. */
enum frame__pay frame__payload_check(const struct frame_tensor *t, unsigned isz, uint64_t nbytes)
{
    uint64_t all;

    if (t->capture == FRAME_CAPTURE_STATS)
        return nbytes ? FRAME__PAY_STATS_WITH_PAYLOAD : FRAME__PAY_OK;
    if (!isz)
        return FRAME__PAY_OK;
    all = payload_full_size(t, isz);
    if (t->capture == FRAME_CAPTURE_FULL && nbytes != all)
        return FRAME__PAY_FULL_SIZE;
    if (t->capture == FRAME_CAPTURE_SAMPLE && (nbytes > all || nbytes % isz))
        return FRAME__PAY_SAMPLE_SIZE;
    return FRAME__PAY_OK;
}

static const char *const hash_alg_names[FRAME_HASH_ALG_COUNT] = {
    [FRAME_HASH_BLAKE2B_128] = "blake2b-128",
    [FRAME_HASH_XXH3_128] = "xxh3-128",
};

const char *frame_hash_alg_name(enum frame_hash_alg a)
{
    return (unsigned)a < FRAME_HASH_ALG_COUNT ? hash_alg_names[a] : "?";
}

int frame__hash_alg_of(const char *s, size_t n)
{
    for (int a = 0; a < FRAME_HASH_ALG_COUNT; a++)
        if (strlen(hash_alg_names[a]) == n && memcmp(hash_alg_names[a], s, n) == 0)
            return a;
    return -1;
}

bool frame__hash_ok(const char *s, size_t n)
{
    if (n < FRAME_HASH_MIN || n > FRAME_HASH_MAX)
        return false;
    for (size_t i = 0; i < n; i++)
        if (!((s[i] >= '0' && s[i] <= '9') || (s[i] >= 'a' && s[i] <= 'f')))
            return false;
    return true;
}

/* The stages of check_tensor(), in the order their errors are reported.
 * The first four fill p->cur.tensor, which carries what a later stage needs
 * (dtype, numel and capture for the payload, seq for the caller). */

static int tensor_seq(struct frame_parser *p, json_t *h)
{
    json_int_t seq;
    int rc;

    if ((rc = check_int(p, h, "tensor", "seq", true, &seq)))
        return rc;
    if (seq <= p->last_seq)
        return frame__bad(p,
                          "tensor seq %" JSON_INTEGER_FORMAT
                          " is not strictly increasing (previous %" PRId64 ")",
                          seq, p->last_seq);
    p->cur.tensor.seq = seq;
    return 0;
}

static int tensor_key_dtype(struct frame_parser *p, json_t *h)
{
    struct frame_tensor *t = &p->cur.tensor;
    size_t n;
    const char *s;
    int rc;

    if ((rc = need_text(p, h, "tensor", "key", &s, &n)))
        return rc;
    if (n == 0 || n > FRAME_MAX_KEY)
        return frame__bad(p, "tensor key must be 1..%d bytes, got %zu", FRAME_MAX_KEY, n);
    if (has_control(s, n))
        return frame__bad(p, "tensor key \"%.64s\" contains a control character", s);
    t->key = s;
    t->key_len = n;

    if ((rc = need_text(p, h, "tensor", "dtype", &s, &n)))
        return rc;
    if (n == 0 || n > FRAME_MAX_DTYPE || has_control(s, n))
        return frame__bad(p, "tensor dtype must be 1..%d printable bytes", FRAME_MAX_DTYPE);
    t->dtype = s;
    return 0;
}

/* The shape, and a numel that must be its product. */
static int tensor_shape(struct frame_parser *p, json_t *h)
{
    struct frame_tensor *t = &p->cur.tensor;
    json_t *v;
    json_int_t numel;
    int64_t prod = 1;
    size_t n, i;
    int rc;

    if ((rc = check_counts(p, h, "tensor", "shape", FRAME_MAX_NDIM, "tensor shape", "dimensions",
                           &v)))
        return rc;
    n = json_array_size(v);
    for (i = 0; i < n; i++) {
        t->shape[i] = json_integer_value(json_array_get(v, i));
        if (prod >= 0 && __builtin_mul_overflow(prod, t->shape[i], &prod))
            prod = -1; /* overflowed; no numel can match */
    }
    t->ndim = (int)n;

    if ((rc = check_int(p, h, "tensor", "numel", true, &numel)))
        return rc;
    if (prod < 0)
        return frame__bad(p, "tensor shape product overflows 64 bits");
    if (numel != prod)
        return frame__bad(
            p, "tensor numel %" JSON_INTEGER_FORMAT " does not match shape product %" PRId64, numel,
            prod);
    t->numel = numel;
    return 0;
}

/* The optional "hash_alg": absent is the protocol's first algorithm,
 * blake2b-128 (a runner from before the field); a name capd does not know
 * is refused, since its hashes could not be compared with anything. A
 * named algorithm's hash has its exact length. */
static int tensor_hash_alg(struct frame_parser *p, json_t *h, size_t hash_len)
{
    json_t *v;
    int rc;

    p->cur.tensor.hash_alg = FRAME_HASH_BLAKE2B_128;
    if ((rc = get_field(p, h, "tensor", "hash_alg", JSON_STRING, "string", false, &v)) || !v)
        return rc;
    int a = frame__hash_alg_of(json_string_value(v), json_string_length(v));
    if (a < 0)
        return frame__bad(p,
                          "tensor hash_alg must be \"blake2b-128\" or \"xxh3-128\", got \"%.32s\"",
                          json_string_value(v));
    if (hash_len != FRAME__HASH_ALG_DIGITS)
        return frame__bad(p, "tensor hash of hash_alg \"%s\" must be %d hex digits, got %zu",
                          hash_alg_names[a], FRAME__HASH_ALG_DIGITS, hash_len);
    p->cur.tensor.hash_alg = (enum frame_hash_alg)a;
    return 0;
}

/* What the tensor holds: its stats, its hash, and the capture level. */
static int tensor_content(struct frame_parser *p, json_t *h)
{
    struct frame_tensor *t = &p->cur.tensor;
    json_t *v;
    size_t n;
    const char *s;
    int rc;

    if ((rc = get_field(p, h, "tensor", "stats", JSON_OBJECT, "object", true, &v)))
        return rc;
    if ((rc = check_stats(p, v)))
        return rc;

    if ((rc = need_text(p, h, "tensor", "hash", &s, &n)))
        return rc;
    if (n < FRAME_HASH_MIN || n > FRAME_HASH_MAX)
        return frame__bad(p, "tensor hash must be %d..%d hex digits, got %zu", FRAME_HASH_MIN,
                          FRAME_HASH_MAX, n);
    if (!frame__hash_ok(s, n))
        return frame__bad(p, "tensor hash must be lowercase hex, got \"%.130s\"", s);
    t->hash = s;
    if ((rc = tensor_hash_alg(p, h, n)))
        return rc;

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
        return frame__bad(p, "tensor capture must be stats, sample or full, got \"%.32s\"", s);
    return 0;
}

/* The payload must be what the capture level says it is, so that a
 * comparison never reads a truncated or padded tensor. */
static int tensor_payload(struct frame_parser *p, uint64_t nbytes)
{
    const struct frame_tensor *t = &p->cur.tensor;
    unsigned isz = frame__dtype_size(t->dtype);
    uint64_t all = payload_full_size(t, isz);

    switch (frame__payload_check(t, isz, nbytes)) {
    case FRAME__PAY_OK:
        break;
    case FRAME__PAY_STATS_WITH_PAYLOAD:
        return frame__bad(
            p, "tensor with capture \"stats\" must not carry a payload (nbytes %" PRIu64 ")",
            nbytes);
    case FRAME__PAY_FULL_SIZE:
        return frame__bad(p,
                          "tensor with capture \"full\" needs nbytes %" PRIu64 " (%" PRId64
                          " x %s), got %" PRIu64,
                          all, t->numel, t->dtype, nbytes);
    case FRAME__PAY_SAMPLE_SIZE:
        return frame__bad(p,
                          "tensor with capture \"sample\" has nbytes %" PRIu64
                          ", not a multiple of %u up to %" PRIu64,
                          nbytes, isz, all);
    }
    return 0;
}

/* Descriptive fields: optional, but typed. */
static int tensor_descriptive(struct frame_parser *p, json_t *h)
{
    json_t *v;
    int rc;

    if ((rc = opt_str(p, h, "tensor", "module")) || (rc = opt_str(p, h, "tensor", "phase")) ||
        (rc = opt_str(p, h, "tensor", "role")) ||
        (rc = opt_str(p, h, "tensor", "sample_positions")) ||
        (rc = check_int(p, h, "tensor", "call", false, NULL)))
        return rc;
    v = json_object_get(h, "index");
    if (v && !json_is_integer(v) && !json_is_string(v))
        return frame__bad(p, "tensor field \"index\" must be an integer or a string, got %s",
                          type_name(v));
    return 0;
}

/* Checks a tensor header stage by stage and fills p->cur.tensor; the seq
 * becomes the one to beat only once the whole header is accepted. */
static int check_tensor(struct frame_parser *p, json_t *h, uint64_t nbytes)
{
    int rc;

    if (!p->saw_env)
        return frame__bad(p, "tensor before env");
    if ((rc = tensor_seq(p, h)) || (rc = tensor_key_dtype(p, h)) || (rc = tensor_shape(p, h)) ||
        (rc = tensor_content(p, h)) || (rc = tensor_payload(p, nbytes)) ||
        (rc = tensor_descriptive(p, h)))
        return rc;
    p->last_seq = p->cur.tensor.seq;
    return 0;
}

static const char *const phases[] = {"forward", "backward", NULL};
static const char *const levels[] = {"debug", "info", "warn", "error", NULL};
static const char *const statuses[] = {"ok", "unsupported", "failed", "oom", NULL};

/* The optional per-sample array NAME of a timing frame: as many as its N
 * samples_ns, each a non-negative integer, and with AT_MOST (own time) no
 * larger than the wall sample it is taken from. */
static int timing_per_sample(struct frame_parser *p, json_t *h, const char *name, json_t *wall,
                             bool at_most)
{
    json_t *v;
    int rc;
    size_t n = json_array_size(wall);

    if (!json_object_get(h, name))
        return 0;
    if ((rc = check_counts(p, h, "timing", name, FRAME_MAX_TIMING_SAMPLES, "timing",
                           "per-sample times", &v)))
        return rc;
    if (json_array_size(v) != n)
        return frame__bad(p, "timing %s has %zu samples, samples_ns %zu", name, json_array_size(v),
                          n);
    for (size_t i = 0; at_most && i < n; i++)
        if (json_integer_value(json_array_get(v, i)) > json_integer_value(json_array_get(wall, i)))
            return frame__bad(p, "timing %s[%zu] exceeds samples_ns[%zu]", name, i, i);
    return 0;
}

/* The optional totals of a timing frame: non-negative integers, and null
 * where the runner could not measure one (docs/protocol.md). */
static int timing_totals(struct frame_parser *p, json_t *h)
{
    static const char *const names[] = {"runqueue_ns", "cpu_ns", "steal_ns"};
    int rc;

    for (size_t i = 0; i < sizeof names / sizeof names[0]; i++)
        if (!json_is_null(json_object_get(h, names[i])) &&
            (rc = check_int(p, h, "timing", names[i], false, NULL)))
            return rc;
    if (json_object_get(h, "own_samples_ns") && !json_is_integer(json_object_get(h, "runqueue_ns")))
        return frame__bad(p, "timing own_samples_ns without runqueue_ns");
    return 0;
}

static int check_timing(struct frame_parser *p, json_t *h)
{
    json_t *v;
    int rc;

    if ((rc = check_enum(p, h, "timing", "phase", true, phases, NULL)))
        return rc;
    if ((rc = check_counts(p, h, "timing", "samples_ns", FRAME_MAX_TIMING_SAMPLES, "timing",
                           "samples", &v)))
        return rc;
    if ((rc = timing_per_sample(p, h, "cpu_samples_ns", v, false)) ||
        (rc = timing_per_sample(p, h, "own_samples_ns", v, true)) ||
        (rc = timing_per_sample(p, h, "device_samples_ns", v, false)) || (rc = timing_totals(p, h)))
        return rc;
    if ((rc = check_int(p, h, "timing", "warmup", true, NULL)) ||
        (rc = check_int(p, h, "timing", "iterations", true, NULL)) ||
        (rc = check_int(p, h, "timing", "threads", true, NULL)) ||
        (rc = check_int(p, h, "timing", "process", false, NULL)) ||
        (rc = check_int(p, h, "timing", "processes", false, NULL)))
        return rc;
    v = json_object_get(h, "cpus");
    if (v && (!json_is_array(v) || json_array_size(v) > FRAME_MAX_TIMING_CPUS))
        return frame__bad(p, "timing cpus must be an array of at most %d CPU numbers",
                          FRAME_MAX_TIMING_CPUS);
    return 0;
}

static const char *const sides[] = {"control", "head", NULL};

/* A profile frame's list NAME: objects named by a string KEY, each with a
 * non-negative integer self_ns; FRAME_MAX_PROFILE of them at most. */
static int profile_list(struct frame_parser *p, json_t *h, const char *name, const char *key)
{
    json_t *a, *e;
    size_t i;
    int rc = get_field(p, h, "profile", name, JSON_ARRAY, "array", true, &a);
    if (rc)
        return rc;
    if (json_array_size(a) > FRAME_MAX_PROFILE)
        return frame__bad(p, "profile %s has %zu entries, at most %d", name, json_array_size(a),
                          FRAME_MAX_PROFILE);
    json_array_foreach(a, i, e)
    {
        json_t *self = json_object_get(e, "self_ns");
        if (!json_is_object(e) || !json_is_string(json_object_get(e, key)) ||
            !json_is_integer(self) || json_integer_value(self) < 0)
            return frame__bad(p,
                              "profile %s[%zu] must be an object with a string \"%s\" and a "
                              "non-negative integer \"self_ns\"",
                              name, i, key);
    }
    return 0;
}

static int check_profile(struct frame_parser *p, json_t *h)
{
    int rc;
    if ((rc = check_enum(p, h, "profile", "phase", true, phases, NULL)) ||
        (rc = check_enum(p, h, "profile", "side", true, sides, NULL)) ||
        (rc = check_int(p, h, "profile", "iterations", true, NULL)) ||
        (rc = check_int(p, h, "profile", "total_ns", true, NULL)) ||
        (rc = check_int(p, h, "profile", "outside_ns", false, NULL)) ||
        (rc = check_int(p, h, "profile", "pair", false, NULL)) ||
        (rc = check_int(p, h, "profile", "modules_left_out", false, NULL)) ||
        (rc = check_int(p, h, "profile", "ops_left_out", false, NULL)) ||
        (rc = profile_list(p, h, "modules", "path")))
        return rc;
    return profile_list(p, h, "ops", "name");
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
            return frame__bad(p, "nondeterministic keys[%zu] must be a key string of 1..%d bytes",
                              i, FRAME_MAX_KEY);
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
        return frame__bad(p, "first frame must be hello, got kind \"%.32s\"",
                          json_string_value(json_object_get(h, "kind")));

    switch (kind) {
    case FRAME_TENSOR:
        return check_tensor(p, h, nbytes);
    case FRAME_HELLO:
        if (p->saw_hello)
            return frame__bad(p, "duplicate hello");
        if ((rc = check_int(p, h, "hello", "protocol", true, &proto)))
            return rc;
        if (proto != FRAME_PROTOCOL_VERSION)
            return frame__bad(p,
                              "unsupported protocol version %" JSON_INTEGER_FORMAT " (expected %d)",
                              proto, FRAME_PROTOCOL_VERSION);
        if ((rc = need_str(p, h, "hello", "runner", &v)))
            return rc;
        p->saw_hello = true;
        return 0;
    case FRAME_ENV:
        if (p->saw_env)
            return frame__bad(p, "duplicate env");
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
    case FRAME_PROFILE:
        return check_profile(p, h);
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

/* Parses the header with jansson and checks it; the authoritative path for
 * every kind, and the one that words every error. */
int frame__slow_header(struct frame_parser *p, const char *text, size_t len, uint64_t *nbytes_out)
{
    struct frame *f = &p->cur;
    json_error_t jerr;
    json_t *h, *v;
    uint64_t nbytes = 0;

    p->stats_fast = false;
    h = json_loadb(text, len, JSON_REJECT_DUPLICATES, &jerr);
    if (!h)
        return frame__bad(p, "header is not valid JSON: %s (column %d)", jerr.text, jerr.column);
    f->hdr_ = h; /* owned by p->cur from here; frame__bad() releases it */
    if (!json_is_object(h))
        return frame__bad(p, "header is not a JSON object (got %s)", type_name(h));
    v = json_object_get(h, "kind");
    if (!v)
        return frame__bad(p, "header missing string field \"kind\"");
    if (!json_is_string(v))
        return frame__bad(p, "header field \"kind\" must be a string, got %s", type_name(v));
    f->kind = kind_of(json_string_value(v));

    v = json_object_get(h, "nbytes");
    if (v) {
        if (!json_is_integer(v) || json_integer_value(v) < 0)
            return frame__bad(p, "field \"nbytes\" must be a non-negative integer");
        nbytes = (uint64_t)json_integer_value(v);
        if (nbytes > p->lim.max_payload)
            return frame__bad(p,
                              "nbytes %" PRIu64 " exceeds the payload limit of %" PRIu64 " bytes",
                              nbytes, p->lim.max_payload);
        if (nbytes > p->lim.max_total_payload - p->payload_announced)
            return frame__bad(
                p, "total payload limit exceeded: %" PRIu64 " + %" PRIu64 " bytes > %" PRIu64,
                p->payload_announced, nbytes, p->lim.max_total_payload);
    }

    *nbytes_out = nbytes;
    return check_header(p, h, f->kind, nbytes);
}

/* A frame the fast path accepted has no tree yet: it is parsed here on the
 * first call and released with the frame, like a tree the slow path built. */
json_t *frame_header(const struct frame *f)
{
    struct frame *m = (struct frame *)f; /* the parser's own, non-const frame */

    if (!m->hdr_)
        m->hdr_ = json_loadb(f->hdr_text, f->hdr_len, JSON_REJECT_DUPLICATES, NULL);
    return m->hdr_;
}
