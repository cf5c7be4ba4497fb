/*
 * daemon/replay/bundle.c - a replayed op's reproducer (bundle.h): the
 * target records of the replay jobs' cells read from storage, each written
 * as a .npy file, a manifest that says what they are, and the runner's
 * repro.py, handed one by one to a sink (a ustar archive or a folder).
 */
#include <errno.h>
#include <stdarg.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "daemon/cpu/widths.h"
#include "daemon/replay/bundle.h"
#include "util/fs.h"

/* Where the files go: a ustar archive, or a folder. */
struct sink {
    int (*add)(struct sink *k, const char *name, const void *p, size_t n);
    struct ubuf *tar;
    const char *dir;
    uint64_t used, max;
};

/* ------------------------------------------------------------------ tar */

/* Appends file repro/NAME (at most 93 bytes) of N bytes at P: a ustar
 * header, the bytes, and zeros to the next 512. */
static int tar_add(struct sink *k, const char *name, const void *p, size_t n)
{
    unsigned char h[512] = {0};
    static const unsigned char zeros[512];
    snprintf((char *)h, 100, "repro/%s", name);
    snprintf((char *)h + 100, 8, "%07o", 0644);
    snprintf((char *)h + 108, 8, "%07o", 0);
    snprintf((char *)h + 116, 8, "%07o", 0);
    snprintf((char *)h + 124, 12, "%011llo", (unsigned long long)n);
    snprintf((char *)h + 136, 12, "%011o", 0);
    h[156] = '0';
    memcpy(h + 257, "ustar", 6);
    memcpy(h + 263, "00", 2);
    memset(h + 148, ' ', 8);
    unsigned sum = 0;
    for (size_t i = 0; i < sizeof h; i++)
        sum += h[i];
    snprintf((char *)h + 148, 8, "%06o", sum);
    int rc = ubuf_add(k->tar, h, sizeof h);
    if (!rc && n)
        rc = ubuf_add(k->tar, p, n);
    if (!rc && n % 512)
        rc = ubuf_add(k->tar, zeros, 512 - n % 512);
    return rc;
}

/* --------------------------------------------------------------- folder */

/* Writes DIR/NAME (its folder made first), counting the bytes against the
 * ceiling: past it -E2BIG before anything is written. */
static int dir_add(struct sink *k, const char *name, const void *p, size_t n)
{
    char path[4200];
    if (k->used + n > k->max)
        return -E2BIG;
    k->used += n;
    if ((size_t)snprintf(path, sizeof path, "%s/%s", k->dir, name) >= sizeof path)
        return -ENAMETOOLONG;
    char *slash = strrchr(path, '/');
    *slash = '\0';
    /* capd's umask (027) would keep the cell's user out */
    int rc = util_mkdir_p(path, 0755);
    if (!rc && chmod(path, 0755) != 0)
        rc = -errno;
    *slash = '/';
    if (rc)
        return rc;
    int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC | O_NOFOLLOW, 0644);
    if (fd < 0)
        return -errno;
    rc = util_write_all(fd, p, n);
    if (fchmod(fd, 0644) != 0 && !rc)
        rc = -errno;
    if (close(fd) != 0 && !rc)
        rc = -errno;
    return rc;
}

/* ------------------------------------------------------------------ npy */

/* numpy's descr of a capd dtype name, and its item size; NULL when none. */
static const char *npy_descr(const char *dtype, size_t *item)
{
    static const struct {
        const char *dtype, *descr;
        size_t item;
    } t[] = {
        {"float32", "<f4", 4}, {"float64", "<f8", 8}, {"float16", "<f2", 2}, {"bfloat16", "<u2", 2},
        {"int64", "<i8", 8},   {"int32", "<i4", 4},   {"int16", "<i2", 2},   {"int8", "|i1", 1},
        {"uint8", "|u1", 1},   {"bool", "|b1", 1},
    };
    for (size_t i = 0; i < sizeof t / sizeof t[0]; i++)
        if (dtype && strcmp(dtype, t[i].dtype) == 0) {
            *item = t[i].item;
            return t[i].descr;
        }
    return NULL;
}

/* A .npy file (version 1.0) of the record's HEADER shape and DESCR over
 * N bytes at P, handed to the sink as NAME. */
static int npy_add(struct sink *k, const char *name, const json_t *header, const char *descr,
                   const void *p, size_t n)
{
    char shape[256] = "";
    size_t i, used = 0;
    json_t *d;
    json_array_foreach(json_object_get(header, "shape"), i, d)
    {
        used += (size_t)snprintf(shape + used, sizeof shape - used, "%lld, ",
                                 (long long)json_integer_value(d));
        if (used >= sizeof shape)
            return -E2BIG;
    }
    if (i == 1)
        shape[used - 1] = '\0'; /* (n,) keeps its comma, drops the space */
    else if (i > 1)
        shape[used - 2] = '\0';
    char dict[384];
    int len = snprintf(dict, sizeof dict,
                       "{'descr': '%s', 'fortran_order': False, 'shape': (%s), }", descr, shape);
    size_t total = 10 + (size_t)len + 1, pad = (64 - total % 64) % 64;
    struct ubuf f;
    ubuf_init(&f, (size_t)k->max + 4096);
    uint16_t hl = (uint16_t)(len + pad + 1);
    unsigned char pre[10] = {
        0x93, 'N', 'U', 'M', 'P', 'Y', 1, 0, (unsigned char)(hl & 0xff), (unsigned char)(hl >> 8)};
    int rc = ubuf_add(&f, pre, sizeof pre);
    if (!rc)
        rc = ubuf_addf(&f, "%s%*s\n", dict, (int)pad, "");
    if (!rc && n)
        rc = ubuf_add(&f, p, n);
    if (!rc)
        rc = k->add(k, name, f.p, f.len);
    ubuf_free(&f);
    return rc;
}

/* ------------------------------------------------------------- records */

/* What one side gave the bundle. */
struct side {
    const char *name;           /* "control", "head" */
    const char *target;         /* the unit's key its records carry */
    json_t *job, *cell, *files; /* files: the manifest's list of this side's arrays */
};

struct gather {
    struct repro_bundle *b;
    struct sink *k;
    json_t *op_call, *args;
};

static int refuse(struct repro_bundle *b, int rc, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
static int refuse(struct repro_bundle *b, int rc, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(b->why, sizeof b->why, fmt, ap);
    va_end(ap);
    return rc;
}

/* Writes record HEADER into the bundle as FILE, listed in ENTRIES; -EINVAL
 * with the reason when its values are not all there. */
static int add_record(struct gather *g, json_t *header, const char *file, json_t *entries)
{
    size_t item = 0;
    const char *dtype = json_string_value(json_object_get(header, "dtype"));
    const char *descr = npy_descr(dtype, &item);
    const char *blob = json_string_value(json_object_get(header, "blob"));
    const char *cap = json_string_value(json_object_get(header, "capture"));
    const char *key = json_string_value(json_object_get(header, "key"));
    json_int_t numel = json_integer_value(json_object_get(header, "numel"));
    void *data = NULL;
    size_t len = 0;
    if (!descr || !blob || !cap || strcmp(cap, "full") != 0)
        return refuse(g->b, -EINVAL, "%s holds no full values (dtype %s, capture %s)",
                      key ? key : "?", dtype ? dtype : "?", cap ? cap : "none");
    int rc = store_blob_get(g->b->st, blob, &data, &len);
    if (!rc && len != (size_t)numel * item)
        rc = refuse(g->b, -EINVAL, "%s holds %zu bytes, not %lld values of %s", key, len,
                    (long long)numel, dtype);
    if (!rc)
        rc = npy_add(g->k, file, header, descr, data, len);
    free(data);
    if (!rc)
        rc = json_array_append_new(entries, json_pack("{s:O, s:O, s:s, s:O, s:O, s:O}", "index",
                                                      json_object_get(header, "index"), "role",
                                                      json_object_get(header, "role"), "file", file,
                                                      "dtype", json_object_get(header, "dtype"),
                                                      "shape", json_object_get(header, "shape"),
                                                      "key", json_object_get(header, "key")))
                 ? -ENOMEM
                 : 0;
    return rc;
}

/* One tensor record of the target unit: its inputs (an op call's
 * arguments, a module call's inputs: the control's only, the reproducer
 * runs on the control's inputs) and results. */
static int take_record(struct gather *g, struct side *sd, json_t *h)
{
    const char *key = json_string_value(json_object_get(h, "key"));
    size_t tl = strlen(sd->target);
    if (!key || strncmp(key, sd->target, tl) != 0 || key[tl] != '.')
        return 0;
    const char *role = json_string_value(json_object_get(h, "role"));
    /* an op call's arguments, a module call's inputs */
    bool arg = role && (strcmp(role, "arg") == 0 || strcmp(role, "input") == 0);
    bool ctl = strcmp(sd->name, "control") == 0;
    if (ctl && !g->op_call && json_is_object(json_object_get(h, "op_call")))
        g->op_call = json_incref(json_object_get(h, "op_call"));
    if (arg && !ctl)
        return 0;
    char file[100];
    long long idx = json_integer_value(json_object_get(h, "index"));
    if (arg)
        snprintf(file, sizeof file, "inputs/arg.%lld.npy", idx);
    else
        snprintf(file, sizeof file, "expected/%s.%s.%lld.npy", sd->name, role ? role : "output",
                 idx);
    return add_record(g, h, file, arg ? g->args : sd->files);
}

/* Every record page of SD's cell, each target record taken. */
static int read_side(struct gather *g, struct side *sd)
{
    struct store *s = g->b->st;
    const char *job = json_string_value(json_object_get(sd->job, "id"));
    json_t *cells = json_object_get(sd->job, "cells");
    const char *cell = json_string_value(json_object_get(json_array_get(cells, 0), "id"));
    int64_t after = -1;
    int rc = store_cell_get(s, job, cell, &sd->cell);
    while (!rc) {
        json_t *page = NULL, *h;
        size_t i;
        rc = store_records_list(s, job, cell, "tensor", after, 1000, &page);
        json_array_foreach(json_object_get(page, "records"), i, h)
        {
            after = json_integer_value(json_object_get(h, "record"));
            if (!rc)
                rc = take_record(g, sd, h);
        }
        bool more = json_is_string(json_object_get(page, "next_cursor"));
        json_decref(page);
        if (!more)
            break;
    }
    return rc;
}

/* ------------------------------------------------------------ manifest */

static json_t *build_identity(const struct side *sd)
{
    if (!sd->job)
        return json_null();
    json_t *fp = json_object_get(sd->cell, "env");
    return json_pack("{s:O, s:O, s:O, s:O*, s:O*}", "build", json_object_get(sd->job, "build"),
                     "commit", json_object_get(sd->job, "commit"), "job",
                     json_object_get(sd->job, "id"), "fingerprint", fp, "provenance",
                     json_object_get(sd->job, "provenance"));
}

/* What the manifest says of the unit: an op call's op_call, or a module
 * call's module and call (its key "<module>.<call>.forward"). */
static int add_unit(json_t *m, const char *key, json_t *op_call)
{
    if (strstr(key, "/op."))
        return json_object_set_new(m, "unit", json_string("op")) ||
               json_object_set(m, "op_call", op_call);
    const char *end = strrchr(key, '.'), *dot = end;
    while (dot > key && dot[-1] != '.')
        dot--;
    if (dot <= key + 1)
        return -1;
    return json_object_set_new(m, "unit", json_string("module")) ||
           json_object_set_new(m, "module", json_stringn(key, (size_t)(dot - 1 - key))) ||
           json_object_set_new(m, "call", json_integer(strtoll(dot, NULL, 10)));
}

static int add_manifest(struct gather *g, const struct side *c, const struct side *h)
{
    const char *width = json_string_value(json_object_get(c->cell, "width"));
    json_t *env = width ? width_env(width) : NULL; /* borrowed */
    json_t *opts = json_object_get(c->job, "options");
    json_t *m =
        json_pack("{s:i, s:s, s:O, s:{s:O, s:O, s:O, s:O*, s:O*}, s:{s:O, s:O}, s:o, s:{s:o, s:o}}",
                  "format", 1, "key", c->target, "args", g->args, "cell", "model",
                  json_object_get(c->cell, "model"), "width", json_object_get(c->cell, "width"),
                  "pass", json_object_get(c->cell, "pass"), "dtype", json_object_get(opts, "dtype"),
                  "seed", json_object_get(opts, "seed"), "expected", "control", c->files, "head",
                  h->files, "width_env", env ? json_deep_copy(env) : json_object(), "builds",
                  "control", build_identity(c), "head", build_identity(h));
    if (m && add_unit(m, c->target, g->op_call) != 0) {
        json_decref(m);
        m = NULL;
    }
    char *text = m ? json_dumps(m, JSON_INDENT(2) | JSON_SORT_KEYS) : NULL;
    int rc = text ? g->k->add(g->k, "manifest.json", text, strlen(text)) : -ENOMEM;
    free(text);
    json_decref(m);
    return rc;
}

/* The runner's repro.py, read from the runner directory capd runs. */
static int add_script(struct gather *g)
{
    char path[4200], *text = NULL;
    size_t len = 0;
    snprintf(path, sizeof path, "%s/repro/repro.py", g->b->runner_dir);
    int rc = util_slurp(path, 1 << 20, &text, &len);
    if (rc)
        return refuse(g->b, -EIO, "the runner's repro/repro.py under runner_dir cannot be read: %s",
                      strerror(-rc));
    rc = g->k->add(g->k, "repro.py", text, len);
    free(text);
    return rc;
}

static int gather(struct repro_bundle *b, struct sink *k)
{
    struct side c = {"control", b->ctl.target, b->ctl.job, NULL, json_array()};
    struct side h = {"head", b->head.target, b->head.job, NULL, json_array()};
    struct gather g = {b, k, NULL, json_array()};
    int rc = c.files && h.files && g.args && c.target ? 0 : -ENOMEM;
    if (!rc)
        rc = read_side(&g, &c);
    if (!rc && h.job)
        rc = read_side(&g, &h);
    bool op = strstr(c.target, "/op.") != NULL;
    if (!rc && ((op && !g.op_call) || json_array_size(c.files) == 0 ||
                (h.job && json_array_size(h.files) == 0)))
        rc = refuse(b, -EINVAL,
                    "the replay jobs hold no records of %s's call with its inputs (did the %s "
                    "run at this cell's width and pass? see the replay jobs' cell notes)",
                    c.target, op ? "op" : "module");
    if (!rc)
        rc = add_manifest(&g, &c, &h);
    if (!rc)
        rc = add_script(&g);
    json_decref(c.cell);
    json_decref(h.cell);
    json_decref(c.files);
    json_decref(h.files);
    json_decref(g.args);
    json_decref(g.op_call);
    return rc;
}

int repro_tar(struct repro_bundle *b, struct ubuf *tar)
{
    struct sink k = {.add = tar_add, .tar = tar, .max = b->max_bytes};
    static const unsigned char end[1024];
    ubuf_init(tar, (size_t)b->max_bytes);
    int rc = gather(b, &k);
    return rc ? rc : ubuf_add(tar, end, sizeof end);
}

int repro_write_dir(struct repro_bundle *b, const char *dir)
{
    struct sink k = {.add = dir_add, .dir = dir, .max = b->max_bytes};
    int rc = util_mkdir_p(dir, 0755);
    if (!rc && chmod(dir, 0755) != 0)
        rc = -errno;
    return rc ? rc : gather(b, &k);
}
