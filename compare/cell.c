/*
 * compare/cell.c - building the input: sides, cells and their records.
 *
 * Storage loads a job record by record, so the builders append and copy: the
 * caller may free or reuse its strings as soon as a call returns. Strings go
 * into a per-cell arena (one malloc per 64 KiB instead of one per key), and
 * records into a growing array with a hard maximum. Payload bytes are the one
 * thing not copied: they can be a gigabyte, and storage already holds them.
 */
#include <errno.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "compare/cmp_int.h"

#define ARENA_CHUNK (64 * 1024)

struct cmp__chunk {
    struct cmp__chunk *next;
    size_t used, cap;
    char data[];
};

static const char *const dtype_names[CMP_DTYPE__COUNT] = {
    [CMP_DTYPE_FLOAT32] = "float32", [CMP_DTYPE_FLOAT64] = "float64",
    [CMP_DTYPE_FLOAT16] = "float16", [CMP_DTYPE_BFLOAT16] = "bfloat16",
    [CMP_DTYPE_INT8] = "int8",       [CMP_DTYPE_UINT8] = "uint8",
    [CMP_DTYPE_INT16] = "int16",     [CMP_DTYPE_INT32] = "int32",
    [CMP_DTYPE_INT64] = "int64",     [CMP_DTYPE_BOOL] = "bool",
    [CMP_DTYPE_OTHER] = "other",
};

static const char *const phase_names[] = {
    [CMP__PH_FORWARD] = "forward",
    [CMP__PH_BACKWARD] = "backward",
    [CMP__PH_INIT] = "init",
    [CMP__PH_OTHER] = "other",
};

static const char *const role_names[] = {
    [CMP__ROLE_INPUT] = "input",           [CMP__ROLE_OUTPUT] = "output",
    [CMP__ROLE_GRAD_INPUT] = "grad_input", [CMP__ROLE_GRAD_OUTPUT] = "grad_output",
    [CMP__ROLE_PARAM_GRAD] = "param_grad", [CMP__ROLE_PARAM] = "param",
    [CMP__ROLE_OTHER] = "other",
};

const char *cmp_dtype_name(enum cmp_dtype dt)
{
    if ((unsigned)dt >= CMP_DTYPE__COUNT)
        return "other";
    return dtype_names[dt];
}

/* "other" itself maps to OTHER too, so the options parser can name it. */
enum cmp_dtype cmp_dtype_from_name(const char *name)
{
    if (name == NULL)
        return CMP_DTYPE_OTHER;
    for (int i = 0; i < CMP_DTYPE__COUNT; i++)
        if (strcmp(name, dtype_names[i]) == 0)
            return (enum cmp_dtype)i;
    return CMP_DTYPE_OTHER;
}

const char *cmp__outcome_name(const struct cmp_cell *c)
{
    return c->has_outcome ? cell_state_name(c->outcome) : NULL;
}

bool cmp__outcome_is(const struct cmp_cell *c, enum cell_state st)
{
    return c->has_outcome && c->outcome == st;
}

const char *cmp__phase_name(enum cmp__phase p)
{
    return phase_names[p];
}

const char *cmp__role_name(enum cmp__role r)
{
    return role_names[r];
}

size_t cmp__dtype_size(enum cmp_dtype dt)
{
    switch (dt) {
    case CMP_DTYPE_FLOAT64:
    case CMP_DTYPE_INT64:
        return 8;
    case CMP_DTYPE_FLOAT32:
    case CMP_DTYPE_INT32:
        return 4;
    case CMP_DTYPE_FLOAT16:
    case CMP_DTYPE_BFLOAT16:
    case CMP_DTYPE_INT16:
        return 2;
    case CMP_DTYPE_INT8:
    case CMP_DTYPE_UINT8:
    case CMP_DTYPE_BOOL:
        return 1;
    default:
        return 0;
    }
}

static enum cmp__phase phase_from(const char *s, size_t len)
{
    for (int i = 0; i < CMP__PH_OTHER; i++)
        if (strlen(phase_names[i]) == len && memcmp(s, phase_names[i], len) == 0)
            return (enum cmp__phase)i;
    return CMP__PH_OTHER;
}

static enum cmp__role role_from(const char *s, size_t len)
{
    for (int i = 0; i < CMP__ROLE_OTHER; i++)
        if (strlen(role_names[i]) == len && memcmp(s, role_names[i], len) == 0)
            return (enum cmp__role)i;
    return CMP__ROLE_OTHER;
}

enum cmp__phase cmp__phase_from(const char *s, size_t n)
{
    return phase_from(s, n);
}

enum cmp__role cmp__role_from(const char *s, size_t n)
{
    return role_from(s, n);
}

/* ------------------------------------------------------------------ arena */

static void arena_free(struct cmp__arena *a)
{
    struct cmp__chunk *c = a->head;
    while (c) {
        struct cmp__chunk *next = c->next;
        free(c);
        c = next;
    }
    a->head = NULL;
}

/*
 * Copies len bytes plus a NUL. A string larger than a chunk gets a chunk of
 * its own, placed behind the current one so the current one keeps filling.
 */
static const char *arena_strndup(struct cmp__arena *a, const char *s, size_t len)
{
    struct cmp__chunk *c = a->head;
    if (c == NULL || c->cap - c->used < len + 1) {
        size_t cap = len + 1 > ARENA_CHUNK ? len + 1 : ARENA_CHUNK;
        struct cmp__chunk *n = malloc(sizeof(*n) + cap);
        if (n == NULL)
            return NULL;
        n->used = 0;
        n->cap = cap;
        if (c != NULL && cap > ARENA_CHUNK) {
            n->next = c->next;
            c->next = n;
        } else {
            n->next = c;
            a->head = n;
        }
        c = n;
    }
    char *p = c->data + c->used;
    memcpy(p, s, len);
    p[len] = '\0';
    c->used += len + 1;
    return p;
}

/*
 * Doubles an array's capacity, never past max elements. The arrays start
 * small because most cells hold hundreds of records, not millions.
 */
int cmp__grow(void **arr, size_t *cap, size_t need, size_t elem, size_t max)
{
    if (need <= *cap)
        return 0;
    if (need > max)
        return -E2BIG;
    size_t ncap = *cap ? *cap : 16;
    while (ncap < need)
        ncap *= 2;
    if (ncap > max)
        ncap = max;
    void *n = realloc(*arr, ncap * elem);
    if (n == NULL)
        return -ENOMEM;
    *arr = n;
    *cap = ncap;
    return 0;
}

/* ------------------------------------------------------------------- side */

int cmp_side_new(struct cmp_side **side_out)
{
    struct cmp_side *s = calloc(1, sizeof(*s));
    if (s == NULL)
        return -ENOMEM;
    *side_out = s;
    return 0;
}

static void cell_free(struct cmp_cell *c)
{
    if (c == NULL)
        return;
    free(c->model);
    free(c->width);
    free(c->pass);
    free(c->mode);
    free(c->effective_width);
    free(c->device);
    free(c->host_missing);
    free(c->timing);
    free(c->procs);
    free(c->recs);
    free(c->nondet_keys);
    json_decref(c->profile[0]);
    json_decref(c->profile[1]);
    arena_free(&c->arena);
    free(c);
}

void cmp_side_free(struct cmp_side *side)
{
    if (side == NULL)
        return;
    for (size_t i = 0; i < side->n_cells; i++)
        cell_free(side->cells[i]);
    free(side->cells);
    cmp__side_free_fingerprints(side);
    free(side);
}

static bool name_ok(const char *s)
{
    return s != NULL && s[0] != '\0' && strlen(s) < CMP_MAX_KEY;
}

int cmp_side_add_cell(struct cmp_side *side, const char *model, const char *width, const char *pass,
                      struct cmp_cell **cell_out)
{
    return cmp_side_add_cell_mode(side, model, width, pass, "eager", cell_out);
}

int cmp_side_add_cell_mode(struct cmp_side *side, const char *model, const char *width,
                           const char *pass, const char *mode, struct cmp_cell **cell_out)
{
    int rc = -EINVAL;
    struct cmp_cell *c = NULL;

    if (side == NULL || !name_ok(model) || !name_ok(width) || !name_ok(pass) || !name_ok(mode) ||
        strlen(width) >= CMP_MAX_WIDTH_NAME)
        goto out;
    /* A linear scan: sides hold at most CMP_MAX_CELLS and are built once. */
    for (size_t i = 0; i < side->n_cells; i++) {
        const struct cmp_cell *o = side->cells[i];
        if (strcmp(o->model, model) == 0 && strcmp(o->width, width) == 0 &&
            strcmp(o->pass, pass) == 0 && strcmp(o->mode, mode) == 0) {
            rc = -EEXIST;
            goto out;
        }
    }
    rc = cmp__grow((void **)&side->cells, &side->cap_cells, side->n_cells + 1, sizeof(*side->cells),
                   CMP_MAX_CELLS);
    if (rc < 0)
        goto out;
    rc = -ENOMEM;
    c = calloc(1, sizeof(*c));
    if (c == NULL)
        goto out;
    c->model = strdup(model);
    c->width = strdup(width);
    c->pass = strdup(pass);
    c->mode = strdup(mode);
    if (c->model == NULL || c->width == NULL || c->pass == NULL || c->mode == NULL)
        goto out;
    c->peak_rss = -1;
    c->device_peak = -1;
    c->compile_ns = -1;
    c->side = side;
    side->cells[side->n_cells++] = c;
    *cell_out = c;
    c = NULL;
    rc = 0;
out:
    cell_free(c);
    return rc;
}

/* ------------------------------------------------------------------- cell */

int cmp_cell_set_outcome(struct cmp_cell *cell, const char *outcome)
{
    enum cell_state st;
    if (cell == NULL || cell_state_parse(outcome, &st) != 0)
        return -EINVAL;
    cell->outcome = st;
    cell->has_outcome = true;
    return 0;
}

/* NULL keeps the current value: storage learns these from two places. */
static int replace_str(char **dst, const char *src)
{
    if (src == NULL)
        return 0;
    if (strlen(src) >= CMP_MAX_KEY)
        return -EINVAL;
    char *n = strdup(src);
    if (n == NULL)
        return -ENOMEM;
    free(*dst);
    *dst = n;
    return 0;
}

int cmp_cell_set_env(struct cmp_cell *cell, const char *effective_width, const char *device)
{
    if (cell == NULL)
        return -EINVAL;
    if ((effective_width && strlen(effective_width) >= CMP_MAX_KEY) ||
        (device && strlen(device) >= CMP_MAX_KEY))
        return -EINVAL;
    int rc = replace_str(&cell->effective_width, effective_width);
    if (rc == 0)
        rc = replace_str(&cell->device, device);
    return rc;
}

int cmp_cell_set_host_missing(struct cmp_cell *cell, const char *missing)
{
    if (cell == NULL || (missing && strlen(missing) >= CMP_MAX_KEY))
        return -EINVAL;
    if (missing == NULL || *missing == 0) {
        free(cell->host_missing);
        cell->host_missing = NULL;
        return 0;
    }
    return replace_str(&cell->host_missing, missing);
}

void cmp_cell_set_memory(struct cmp_cell *cell, int64_t peak_rss_bytes, int64_t device_peak_bytes)
{
    if (cell == NULL)
        return;
    cell->peak_rss = peak_rss_bytes < 0 ? -1 : peak_rss_bytes;
    cell->device_peak = device_peak_bytes < 0 ? -1 : device_peak_bytes;
}

void cmp_cell_set_compile(struct cmp_cell *cell, int64_t compile_ns)
{
    if (cell != NULL)
        cell->compile_ns = compile_ns < 0 ? -1 : compile_ns;
}

static bool all_digits(const char *s, size_t len)
{
    if (len == 0 || len > 18)
        return false;
    for (size_t i = 0; i < len; i++)
        if (s[i] < '0' || s[i] > '9')
            return false;
    return true;
}

/*
 * Splits <module>.<call>.<phase>.<role>.<index> when the caller did not give
 * the parts. Module names may contain digit segments ("layers.0") and, in
 * principle, an index could contain dots, so neither a left nor a right split
 * on a fixed count works; instead the leftmost place where a digit segment is
 * followed by a known phase and a known role is taken as the boundary.
 * Returns false when no such place exists.
 */
static bool parse_key(const char *key, size_t *module_len, int64_t *call, enum cmp__phase *phase,
                      enum cmp__role *role)
{
    for (const char *p = strchr(key, '.'); p != NULL; p = strchr(p + 1, '.')) {
        const char *c = p + 1, *ce = strchr(c, '.');
        if (ce == NULL)
            return false;
        if (!all_digits(c, (size_t)(ce - c)))
            continue;
        const char *ph = ce + 1, *phe = strchr(ph, '.');
        if (phe == NULL)
            return false;
        enum cmp__phase pv = phase_from(ph, (size_t)(phe - ph));
        if (pv == CMP__PH_OTHER)
            continue;
        const char *ro = phe + 1, *roe = strchr(ro, '.');
        if (roe == NULL || roe[1] == '\0')
            continue;
        enum cmp__role rv = role_from(ro, (size_t)(roe - ro));
        if (rv == CMP__ROLE_OTHER)
            continue;
        *module_len = (size_t)(p - key);
        *call = strtoll(c, NULL, 10);
        *phase = pv;
        *role = rv;
        return true;
    }
    return false;
}

/* A public record's strings within CMP_MAX_KEY and a shape whose product
 * (without overflow) is its element count. */
static bool tensor_ok(const struct cmp_tensor *t)
{
    if (t == NULL || !name_ok(t->key) || t->ndim < 0 || t->ndim > CMP_MAX_NDIM || t->numel < 0)
        return false;
    if (t->hash != NULL && strlen(t->hash) >= CMP_MAX_KEY)
        return false;
    if (t->hash_alg != NULL && strlen(t->hash_alg) >= CMP_MAX_KEY)
        return false;
    if (t->module != NULL && strlen(t->module) >= CMP_MAX_KEY)
        return false;
    if (t->dtype != NULL && strlen(t->dtype) >= CMP_MAX_KEY)
        return false;

    int64_t prod = 1;
    for (int i = 0; i < t->ndim; i++) {
        if (t->shape[i] < 0)
            return false;
        if (t->shape[i] != 0 && prod > INT64_MAX / t->shape[i])
            return false;
        prod *= t->shape[i];
    }
    return prod == t->numel;
}

/*
 * The record's module, call, phase and role: the parts the caller gave win,
 * the rest come from the key (a per-op key first, then the plain layout).
 * The module is returned as a pointer and length, into t->module or into
 * the key, NULL when neither names one.
 */
static void rec_key_parts(const struct cmp_tensor *t, struct cmp__rec *r, const char **module_out,
                          size_t *module_len_out)
{
    size_t mlen = 0;
    int64_t call = 0;
    enum cmp__phase ph = CMP__PH_OTHER;
    enum cmp__role ro = CMP__ROLE_OTHER;
    struct cmp__opkey ok;
    bool parsed = cmp__op_key(t->key, &ok);
    if (parsed) {
        mlen = ok.module_len;
        call = ok.call;
        ph = phase_from(ok.phase, ok.phase_len);
        ro = role_from(ok.role, ok.role_len);
    } else {
        parsed = parse_key(t->key, &mlen, &call, &ph, &ro);
    }
    if (t->module != NULL) {
        *module_out = t->module;
        *module_len_out = strlen(t->module);
        r->call = t->call;
    } else if (parsed) {
        *module_out = t->key;
        *module_len_out = mlen;
        r->call = call;
    } else {
        *module_out = NULL;
        *module_len_out = 0;
    }
    r->phase = t->phase ? phase_from(t->phase, strlen(t->phase)) : ph;
    r->role = t->role ? role_from(t->role, strlen(t->role)) : ro;
}

/*
 * The record's payload, checked against its dtype and element count. A
 * payload of a dtype we cannot decode is dropped, not rejected: the
 * record still takes part through its hash and statistics.
 */
static int rec_payload(const struct cmp_tensor *t, struct cmp__rec *r)
{
    size_t isz = cmp__dtype_size(r->dtype);
    r->capture = CMP_CAPTURE_NONE;
    if (t->capture != CMP_CAPTURE_NONE && isz > 0 && t->payload_len > 0) {
        if (t->payload == NULL || t->payload_len % isz != 0)
            return -EINVAL;
        uint64_t k = t->payload_len / isz;
        if (t->capture == CMP_CAPTURE_FULL && k != (uint64_t)t->numel)
            return -EINVAL;
        if (t->capture == CMP_CAPTURE_SAMPLE && k > (uint64_t)t->numel)
            return -EINVAL;
        if (t->capture != CMP_CAPTURE_FULL && t->capture != CMP_CAPTURE_SAMPLE)
            return -EINVAL;
        /* A sample that happens to hold every element is a full payload. */
        r->capture = k == (uint64_t)t->numel ? CMP_CAPTURE_FULL : t->capture;
        r->payload = t->payload;
        r->payload_len = t->payload_len;
    }
    return 0;
}

/*
 * Validates a public record and translates it. Shared by cmp_cell_add_tensor
 * and cmp_tensor_compare so both reject the same malformed input.
 */
int cmp__rec_from_tensor(const struct cmp_tensor *t, struct cmp__rec *r, const char **module_out,
                         size_t *module_len_out)
{
    if (!tensor_ok(t))
        return -EINVAL;

    memset(r, 0, sizeof(*r));
    r->key = t->key;
    r->seq = t->seq;
    r->dtype = cmp_dtype_from_name(t->dtype);
    r->dtype_name = t->dtype ? t->dtype : "other";
    r->ndim = t->ndim;
    memcpy(r->shape, t->shape, sizeof(r->shape[0]) * (size_t)t->ndim);
    r->numel = t->numel;
    r->stats = t->stats;
    r->hash = (t->hash && t->hash[0]) ? t->hash : NULL;
    r->hash_alg = (t->hash_alg && t->hash_alg[0]) ? t->hash_alg : CMP_HASH_ALG_DEFAULT;
    r->nondet = t->nondeterministic;
    const char *module;
    size_t module_len;
    rec_key_parts(t, r, &module, &module_len);
    if (module_out != NULL) {
        *module_out = module;
        *module_len_out = module_len;
    }
    return rec_payload(t, r);
}

int cmp_cell_add_tensor(struct cmp_cell *cell, const struct cmp_tensor *t)
{
    struct cmp__rec r;
    const char *module = NULL;
    size_t mlen = 0;
    int rc;

    if (cell == NULL)
        return -EINVAL;
    rc = cmp__rec_from_tensor(t, &r, &module, &mlen);
    if (rc < 0)
        return rc;
    rc = cmp__grow((void **)&cell->recs, &cell->cap_recs, cell->n_recs + 1, sizeof(*cell->recs),
                   CMP_MAX_TENSORS);
    if (rc < 0)
        return rc;
    /* Arena copies cannot be undone one by one; a failure here only wastes bytes. */
    r.key = arena_strndup(&cell->arena, r.key, strlen(r.key));
    if (r.key == NULL)
        return -ENOMEM;
    if (module != NULL) {
        /* module points into the caller's key when it was parsed from it */
        r.module = arena_strndup(&cell->arena, module, mlen);
        if (r.module == NULL)
            return -ENOMEM;
    }
    if (r.hash != NULL && (r.hash = arena_strndup(&cell->arena, r.hash, strlen(r.hash))) == NULL)
        return -ENOMEM;
    /* The caller's string is borrowed: the default becomes the literal, any
     * other name a copy in the arena. */
    if (strcmp(r.hash_alg, CMP_HASH_ALG_DEFAULT) == 0)
        r.hash_alg = CMP_HASH_ALG_DEFAULT;
    else if ((r.hash_alg = arena_strndup(&cell->arena, r.hash_alg, strlen(r.hash_alg))) == NULL)
        return -ENOMEM;
    struct cmp__opkey ok;
    if (cmp__op_key(r.key, &ok)) {
        r.op_index = ok.op_index;
        if ((r.op = arena_strndup(&cell->arena, ok.op, ok.op_len)) == NULL)
            return -ENOMEM;
    }
    r.dtype_name = r.dtype != CMP_DTYPE_OTHER
                       ? cmp_dtype_name(r.dtype)
                       : arena_strndup(&cell->arena, r.dtype_name, strlen(r.dtype_name));
    if (r.dtype_name == NULL)
        return -ENOMEM;
    cell->recs[cell->n_recs++] = r;
    return 0;
}

int cmp_cell_mark_nondeterministic(struct cmp_cell *cell, const char *key)
{
    if (cell == NULL || !name_ok(key))
        return -EINVAL;
    int rc = cmp__grow((void **)&cell->nondet_keys, &cell->cap_nondet, cell->n_nondet + 1,
                       sizeof(*cell->nondet_keys), CMP_MAX_TENSORS);
    if (rc < 0)
        return rc;
    const char *k = arena_strndup(&cell->arena, key, strlen(key));
    if (k == NULL)
        return -ENOMEM;
    cell->nondet_keys[cell->n_nondet++] = k;
    return 0;
}
