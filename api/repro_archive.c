/*
 * api/repro_archive.c - the reproducer of a replayed op (api/repro.h has
 * its layout): the target records of the two replay jobs' cells read from
 * storage, each written as a .npy file, a manifest that says what they are,
 * and the runner's repro.py, into one ustar archive.
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "api/api_int.h"
#include "api/repro.h"
#include "daemon/cpu/widths.h"
#include "util/buf.h"

/* ------------------------------------------------------------------ tar */

/* Appends file NAME (at most 99 bytes) of N bytes at P: a ustar header,
 * the bytes, and zeros to the next 512. */
static int tar_add(struct ubuf *b, const char *name, const void *p, size_t n)
{
    unsigned char h[512] = {0};
    static const unsigned char zeros[512];
    snprintf((char *)h, 100, "%s", name);
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
    int rc = ubuf_add(b, h, sizeof h);
    if (!rc && n)
        rc = ubuf_add(b, p, n);
    if (!rc && n % 512)
        rc = ubuf_add(b, zeros, 512 - n % 512);
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
 * N bytes at P, appended to the archive as NAME. */
static int npy_add(struct ubuf *tar, const char *name, const json_t *header, const char *descr,
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
    ubuf_init(&f, tar->max);
    uint16_t hl = (uint16_t)(len + pad + 1);
    unsigned char pre[10] = {
        0x93, 'N', 'U', 'M', 'P', 'Y', 1, 0, (unsigned char)(hl & 0xff), (unsigned char)(hl >> 8)};
    int rc = ubuf_add(&f, pre, sizeof pre);
    if (!rc)
        rc = ubuf_addf(&f, "%s%*s\n", dict, (int)pad, "");
    if (!rc && n)
        rc = ubuf_add(&f, p, n);
    if (!rc)
        rc = tar_add(tar, name, f.p, f.len);
    ubuf_free(&f);
    return rc;
}

/* ------------------------------------------------------------- records */

/* What one side gave the archive. */
struct side {
    const char *name;           /* "control", "head" */
    json_t *job, *cell, *files; /* files: the manifest's list of this side's arrays */
};

struct repro {
    struct api_req *r;
    const char *target;
    json_t *op_call, *args;
    struct ubuf tar;
    const char *why; /* a refusal's reason, with rc -EINVAL */
    char whybuf[256];
};

/* Writes record HEADER (of TARGET's op call) into the archive, listed in
 * ENTRIES; -EINVAL with x->why when its values are not all there. */
static int add_record(struct repro *x, json_t *header, const char *file, json_t *entries)
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
    if (!descr || !blob || !cap || strcmp(cap, "full") != 0) {
        snprintf(x->whybuf, sizeof x->whybuf, "%s holds no full values (dtype %s, capture %s)",
                 key ? key : "?", dtype ? dtype : "?", cap ? cap : "none");
        x->why = x->whybuf;
        return -EINVAL;
    }
    int rc = store_blob_get(api_store(x->r), blob, &data, &len);
    if (!rc && len != (size_t)numel * item) {
        snprintf(x->whybuf, sizeof x->whybuf, "%s holds %zu bytes, not %lld values of %s", key, len,
                 (long long)numel, dtype);
        x->why = x->whybuf;
        rc = -EINVAL;
    }
    if (!rc)
        rc = npy_add(&x->tar, file, header, descr, data, len);
    free(data);
    if (!rc)
        rc =
            json_array_append_new(
                entries,
                json_pack("{s:O, s:O, s:s, s:O, s:O, s:O}", "index",
                          json_object_get(header, "index"), "role", json_object_get(header, "role"),
                          "file", file + 6, "dtype", json_object_get(header, "dtype"), "shape",
                          json_object_get(header, "shape"), "key", json_object_get(header, "key")))
                ? -ENOMEM
                : 0;
    return rc;
}

/* One tensor record of the target op call: its arguments (the control's
 * only: the reproducer runs on the control's inputs) and results. */
static int take_record(struct repro *x, struct side *sd, json_t *h)
{
    const char *key = json_string_value(json_object_get(h, "key"));
    size_t tl = strlen(x->target);
    if (!key || strncmp(key, x->target, tl) != 0 || key[tl] != '.')
        return 0;
    const char *role = json_string_value(json_object_get(h, "role"));
    bool arg = role && strcmp(role, "arg") == 0;
    if (!x->op_call && json_is_object(json_object_get(h, "op_call")))
        x->op_call = json_incref(json_object_get(h, "op_call"));
    if (arg && strcmp(sd->name, "head") == 0)
        return 0;
    char file[100];
    long long idx = json_integer_value(json_object_get(h, "index"));
    if (arg)
        snprintf(file, sizeof file, "repro/inputs/arg.%lld.npy", idx);
    else
        snprintf(file, sizeof file, "repro/expected/%s.%s.%lld.npy", sd->name,
                 role ? role : "output", idx);
    return add_record(x, h, file, arg ? x->args : sd->files);
}

/* Every record page of SD's cell, each target record taken. */
static int read_side(struct repro *x, struct side *sd)
{
    struct store *s = api_store(x->r);
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
                rc = take_record(x, sd, h);
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
    json_t *fp = json_object_get(sd->cell, "env");
    return json_pack("{s:O, s:O, s:O, s:O*, s:O*}", "build", json_object_get(sd->job, "build"),
                     "commit", json_object_get(sd->job, "commit"), "job",
                     json_object_get(sd->job, "id"), "fingerprint", fp, "provenance",
                     json_object_get(sd->job, "provenance"));
}

static int add_manifest(struct repro *x, const struct side *c, const struct side *h)
{
    const char *width = json_string_value(json_object_get(c->cell, "width"));
    json_t *env = width ? width_env(width) : NULL;
    json_t *opts = json_object_get(c->job, "options");
    json_t *m = json_pack(
        "{s:i, s:s, s:O, s:O, s:{s:O, s:O, s:O, s:O*, s:O*}, s:{s:O, s:O}, s:o, s:{s:o, s:o}}",
        "format", 1, "key", x->target, "op_call", x->op_call, "args", x->args, "cell", "model",
        json_object_get(c->cell, "model"), "width", json_object_get(c->cell, "width"), "pass",
        json_object_get(c->cell, "pass"), "dtype", json_object_get(opts, "dtype"), "seed",
        json_object_get(opts, "seed"), "expected", "control", c->files, "head", h->files,
        "width_env", env ? json_deep_copy(env) : json_object(), "builds", "control",
        build_identity(c), "head", build_identity(h));
    char *text = m ? json_dumps(m, JSON_INDENT(2) | JSON_SORT_KEYS) : NULL;
    int rc = text ? tar_add(&x->tar, "repro/manifest.json", text, strlen(text)) : -ENOMEM;
    free(text);
    json_decref(m);
    json_decref(env);
    return rc;
}

/* The runner's repro.py, read from the runner directory capd runs. */
static int add_script(struct repro *x)
{
    char path[4200];
    snprintf(path, sizeof path, "%s/repro/repro.py", api_cfg(x->r)->runner_dir);
    FILE *f = fopen(path, "rb");
    if (!f) {
        int e = errno;
        snprintf(x->whybuf, sizeof x->whybuf, "the runner's repro/repro.py under runner_dir ");
        size_t l = strlen(x->whybuf);
        snprintf(x->whybuf + l, sizeof x->whybuf - l, "cannot be read: %s", strerror(e));
        x->why = x->whybuf;
        return -EIO;
    }
    struct ubuf b;
    ubuf_init(&b, 1 << 20);
    char chunk[8192];
    size_t n;
    int rc = 0;
    while (!rc && (n = fread(chunk, 1, sizeof chunk, f)) > 0)
        rc = ubuf_add(&b, chunk, n);
    fclose(f);
    if (!rc)
        rc = tar_add(&x->tar, "repro/repro.py", b.p, b.len);
    ubuf_free(&b);
    return rc;
}

static int build(struct repro *x, struct side *c, struct side *h)
{
    int rc = read_side(x, c);
    if (!rc)
        rc = read_side(x, h);
    if (rc)
        return rc;
    if (!x->op_call || json_array_size(c->files) == 0 || json_array_size(h->files) == 0) {
        snprintf(x->whybuf, sizeof x->whybuf,
                 "the replay jobs hold no records of %s's call with its arguments (did the op "
                 "run at this cell's width and pass? see the replay jobs' cell notes)",
                 x->target);
        x->why = x->whybuf;
        return -EINVAL;
    }
    rc = add_manifest(x, c, h);
    if (!rc)
        rc = add_script(x);
    static const unsigned char end[1024];
    if (!rc)
        rc = ubuf_add(&x->tar, end, sizeof end);
    return rc;
}

enum MHD_Result api_repro_reply(struct api_req *r, json_t *ctl, json_t *head)
{
    struct side c = {"control", ctl, NULL, json_array()};
    struct side h = {"head", head, NULL, json_array()};
    struct repro x = {.r = r, .args = json_array()};
    x.target = json_string_value(json_object_get(json_object_get(ctl, "labels"), "replay_op"));
    uint64_t max = api_cfg(r)->repro_max_bytes;
    ubuf_init(&x.tar, (size_t)max);
    enum MHD_Result ret;
    int rc = x.target && c.files && h.files && x.args ? build(&x, &c, &h) : -ENOMEM;
    if (rc == -EINVAL) {
        ret = api_error(r, 422, "no_target_records", NULL, "%s", x.why);
    } else if (rc == -E2BIG) {
        ret = api_error(r, 422, "repro_too_large", NULL,
                        "the reproducer would be larger than repro_max_bytes (%llu bytes); its "
                        "records are in GET /v1/jobs/{id}/cells/{cell}/records of the replay jobs",
                        (unsigned long long)max);
    } else if (rc) {
        ret = api_error(r, 500, "internal", NULL, "the reproducer could not be written: %s",
                        x.why ? x.why : strerror(-rc));
    } else {
        size_t len = 0;
        char *body = ubuf_take(&x.tar, &len);
        api_reply_header(r, "Content-Disposition", "attachment; filename=\"repro.tar\"");
        ret = api_text(r, 200, "application/x-tar", body, len);
    }
    ubuf_free(&x.tar);
    json_decref(c.cell);
    json_decref(h.cell);
    json_decref(c.files);
    json_decref(h.files);
    json_decref(x.args);
    json_decref(x.op_call);
    return ret;
}
