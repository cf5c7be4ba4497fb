/*
 * worker/spec.c - capd's spec reply taken apart for the worker's own
 * scratch dir (worker.h). capd made the attempt on its host: its env
 * values and the cell spec name capd's scratch path, which on the
 * worker's host is the worker's scratch dir instead.
 */
#include <errno.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "util/err.h"
#include "util/path.h"
#include "worker/worker.h"

/* V with its prefix FROM replaced by TO, where FROM is all of V or is
 * followed by '/' (so "/s/12" is not under "/s/1"); else a copy of V.
 * NULL when memory runs out. */
static char *rewrite_value(const char *v, const char *from, const char *to)
{
    size_t n = strlen(from);
    if (strncmp(v, from, n) != 0 || (v[n] != 0 && v[n] != '/'))
        return strdup(v);
    char *out = NULL;
    return asprintf(&out, "%s%s", to, v + n) < 0 ? NULL : out;
}

/* A string without NULs inside (an env value or an argv word cannot hold
 * one), or NULL. */
static const char *plain_string(const json_t *v)
{
    const char *s = json_string_value(v);
    return s && strlen(s) == json_string_length(v) ? s : NULL;
}

/* A non-negative integer member KEY of O into *OUT; absent is DEF. */
static int get_count(const json_t *o, const char *key, long long def, long long min, long long *out,
                     char **err)
{
    const json_t *v = json_object_get(o, key);
    if (!v) {
        *out = def;
        return 0;
    }
    if (!json_is_integer(v) || json_integer_value(v) < min)
        return util_errf(err, -EINVAL, "the spec reply's '%s' must be an integer >= %lld", key,
                         min);
    *out = (long long)json_integer_value(v);
    return 0;
}

/* A NULL-terminated array for the N items of the reply's FIELD (SPARE
 * more slots, the NULL among them) into *OUT, once it is OK (else it must
 * be SHAPE) and N is at most MAX (of UNIT). 0, -EINVAL, -E2BIG or -ENOMEM. */
static int room_for(const char *field, bool ok, const char *shape, size_t n, size_t max,
                    const char *unit, size_t spare, char ***out, char **err)
{
    if (!ok)
        return util_errf(err, -EINVAL, "the spec reply's '%s' must be %s", field, shape);
    if (n > max)
        return util_errf(err, -E2BIG, "the spec reply's '%s' has %zu %s, more than %zu", field, n,
                         unit, max);
    return (*out = calloc(n + spare, sizeof **out)) ? 0 : -ENOMEM;
}

static int take_argv(const json_t *a, struct worker_spec *out, char **err)
{
    size_t n = json_array_size(a);
    int rc = room_for("argv", json_is_array(a) && n > 0, "a non-empty array", n, WORKER_ARGV_MAX,
                      "words", 1, &out->argv, err);
    if (rc)
        return rc;
    for (size_t i = 0; i < n; i++) {
        const char *s = plain_string(json_array_get(a, i));
        if (!s || (i == 0 && !*s))
            return util_errf(err, -EINVAL, "the spec reply's argv[%zu] must be a %sstring", i,
                             i == 0 ? "non-empty " : "");
        if (!(out->argv[i] = strdup(s)))
            return -ENOMEM;
    }
    return 0;
}

/* What a node's scheduler says of its GPUs (Slurm's --gres sets
 * CUDA_VISIBLE_DEVICES): passed to the runner where E does not set it. */
static const char *const gpu_vars[] = {"CUDA_VISIBLE_DEVICES", "ROCR_VISIBLE_DEVICES",
                                       "HIP_VISIBLE_DEVICES", "GPU_DEVICE_ORDINAL"};
#define NGPU_VARS (sizeof gpu_vars / sizeof gpu_vars[0])

/* The env object E as "K=V" strings, each value rewritten, the worker's
 * own gpu_vars that E lacks, and CAPD_CELL_SPEC=SPEC_PATH last (whatever E
 * says for it). */
static int take_env(const json_t *e, const char *from, const char *to, const char *spec_path,
                    struct worker_spec *out, char **err)
{
    const char *k;
    const json_t *v;
    size_t n = json_object_size(e), i = 0;
    int rc = room_for("env", json_is_object(e), "an object", n, WORKER_ENV_MAX, "variables",
                      2 + NGPU_VARS, &out->env, err);
    if (rc)
        return rc;
    json_object_foreach((json_t *)e, k, v)
    {
        const char *s = plain_string(v);
        if (!*k || strchr(k, '='))
            return util_errf(err, -EINVAL, "the spec reply's env has a bad name '%s'", k);
        if (!s)
            return util_errf(err, -EINVAL, "the spec reply's env.%s must be a string", k);
        if (strcmp(k, "CAPD_CELL_SPEC") == 0)
            continue;
        char *nv = rewrite_value(s, from, to);
        int w = nv ? asprintf(&out->env[i], "%s=%s", k, nv) : -1;
        free(nv);
        if (w < 0) {
            out->env[i] = NULL;
            return -ENOMEM;
        }
        i++;
    }
    for (size_t g = 0; g < NGPU_VARS; g++) {
        const char *have = getenv(gpu_vars[g]);
        if (!have || json_object_get(e, gpu_vars[g]))
            continue;
        if (asprintf(&out->env[i], "%s=%s", gpu_vars[g], have) < 0) {
            out->env[i] = NULL;
            return -ENOMEM;
        }
        i++;
    }
    if (asprintf(&out->env[i], "CAPD_CELL_SPEC=%s", spec_path) < 0) {
        out->env[i] = NULL;
        return -ENOMEM;
    }
    return 0;
}

/* The cell spec SPEC pointed at TO: frame_fd 3, scratch TO, and the
 * paired control build's env values (spec.reference.env) rewritten like
 * the cell's own. */
static int take_cell_json(const json_t *spec, const char *from, const char *to,
                          struct worker_spec *out, char **err)
{
    if (!json_is_object(spec))
        return util_errf(err, -EINVAL, "the spec reply's 'spec' must be an object");
    int rc = -ENOMEM;
    json_t *c = json_deep_copy(spec);
    if (!c || json_object_set_new(c, "frame_fd", json_integer(3)) != 0 ||
        json_object_set_new(c, "scratch", json_string(to)) != 0)
        goto out;
    const char *k;
    json_t *v;
    json_t *renv = json_object_get(json_object_get(c, "reference"), "env");
    json_object_foreach(renv, k, v)
    {
        const char *s = plain_string(v);
        if (!s)
            continue;
        char *nv = rewrite_value(s, from, to);
        if (!nv || json_object_set_new(renv, k, json_string(nv)) != 0) {
            free(nv);
            goto out;
        }
        free(nv);
    }
    out->cell_json = json_dumps(c, JSON_INDENT(2));
    rc = out->cell_json ? 0 : -ENOMEM;
out:
    json_decref(c);
    return rc;
}

static int take_counts(const json_t *r, struct worker_spec *out, char **err)
{
    long long v;
    int rc;
    if ((rc = get_count(r, "attempt", -1, 1, &out->attempt, err)) != 0)
        return rc;
    if (!json_object_get(r, "attempt"))
        return util_errf(err, -EINVAL, "the spec reply has no 'attempt'");
    if ((rc = get_count(r, "timeout_s", 0, 0, &out->timeout_s, err)) != 0 ||
        (rc = get_count(r, "memory_max_bytes", 0, 0, &out->memory_max_bytes, err)) != 0 ||
        (rc = get_count(r, "chunk_max_bytes", 0, 1, &v, err)) != 0)
        return rc;
    out->chunk_max_bytes = (size_t)v;
    if ((rc = get_count(r, "frames_received", 0, 0, &v, err)) != 0)
        return rc;
    out->frames_received = (uint64_t)v;
    if ((rc = get_count(r, "log_received", 0, 0, &v, err)) != 0)
        return rc;
    out->log_received = (uint64_t)v;
    return 0;
}

int worker_spec_rewrite(const char *reply, size_t len, const char *scratch, struct worker_spec *out,
                        char **err)
{
    char spec_path[UTIL_PATH_MAX];
    json_error_t je;
    json_t *r = NULL;
    int rc;
    memset(out, 0, sizeof *out);
    if (len > WORKER_SPEC_MAX)
        return util_errf(err, -E2BIG, "the spec reply is %zu bytes, more than %u", len,
                         WORKER_SPEC_MAX);
    if (scratch[0] != '/')
        return util_errf(err, -EINVAL, "the scratch dir '%s' is not an absolute path", scratch);
    if (util_path_join(spec_path, scratch, "cell.json") != 0)
        return util_errf(err, -ENAMETOOLONG, "the scratch dir's path is too long");
    if (!(r = json_loadb(reply, len, JSON_REJECT_DUPLICATES, &je)) || !json_is_object(r)) {
        rc = util_errf(err, -EINVAL, "the spec reply is not a JSON object%s%s", r ? "" : ": ",
                       r ? "" : je.text);
        goto out;
    }
    const char *from = plain_string(json_object_get(r, "scratch"));
    if (!from || from[0] != '/') {
        rc = util_errf(err, -EINVAL, "the spec reply's 'scratch' must be an absolute path");
        goto out;
    }
    if ((rc = take_counts(r, out, err)) != 0 ||
        (rc = take_argv(json_object_get(r, "argv"), out, err)) != 0 ||
        (rc = take_env(json_object_get(r, "env"), from, scratch, spec_path, out, err)) != 0 ||
        (rc = take_cell_json(json_object_get(r, "spec"), from, scratch, out, err)) != 0)
        goto out;
out:
    json_decref(r);
    if (rc != 0)
        worker_spec_free(out);
    return rc;
}

static void free_strv(char **v)
{
    for (size_t i = 0; v && v[i]; i++)
        free(v[i]);
    free(v);
}

void worker_spec_free(struct worker_spec *s)
{
    free_strv(s->argv);
    free_strv(s->env);
    free(s->cell_json);
    memset(s, 0, sizeof *s);
}
