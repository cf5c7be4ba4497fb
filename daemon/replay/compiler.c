/*
 * daemon/replay/compiler.c - the compiler bisection follow-ups of a job
 * whose compiled cells depart from its eager cells (compiler.h).
 */
#include <errno.h>
#include <stdio.h>
#include <string.h>

#include "compare/cmp.h"
#include "daemon/replay/auto.h"
#include "daemon/replay/compiler.h"
#include "daemon/replay/pending.h"

/* JOB's cell of the compared cell RES (model, width, pass, mode), or NULL. */
static json_t *job_cell(json_t *job, json_t *res)
{
    static const char *const keys[] = {"model", "width", "pass", "mode"};
    json_t *c;
    size_t i;
    json_array_foreach(json_object_get(job, "cells"), i, c)
    {
        size_t k = 0;
        while (k < 4 && json_equal(json_object_get(c, keys[k]), json_object_get(res, keys[k])))
            k++;
        if (k == 4)
            return c;
    }
    return NULL;
}

/* The follow-up job's request: CELL of JOB alone, its options with
 * compiler_bisect run; labelled with OF, "<job>/<cell>". */
static json_t *bisect_request(json_t *job, json_t *cell, const char *of)
{
    json_t *opts = json_deep_copy(json_object_get(job, "options"));
    if (!json_is_object(opts)) {
        json_decref(opts);
        opts = json_object();
    }
    json_object_set_new(opts, "compiler_bisect", json_string("run"));
    json_object_set_new(opts, "iterations", json_integer(0));
    json_object_set_new(opts, "warmup", json_integer(0));
    json_object_set_new(opts, "replay", json_string("off"));
    return json_pack("{s:O, s:O, s:O, s:{s:[O], s:[O], s:[O], s:[O]}, s:o, s:{s:s, s:s}}",
                     "project", json_object_get(job, "project"), "commit",
                     json_object_get(job, "commit"), "build", json_object_get(job, "build"),
                     "matrix", "models", json_object_get(cell, "model"), "widths",
                     json_object_get(cell, "width"), "passes", json_object_get(cell, "pass"),
                     "modes", json_object_get(cell, "mode"), "options", opts, "labels",
                     "compiler_bisect_of", of, "replay_of", of);
}

/* Creates (or finds) the bisection job of JOB's CELL. */
static int submit(struct store *st, const struct capd_config *cfg, json_t *job, json_t *cell)
{
    char of[64], idem[96];
    snprintf(of, sizeof of, "%s/%s", json_string_value(json_object_get(job, "id")),
             json_string_value(json_object_get(cell, "id")));
    snprintf(idem, sizeof idem, "compiler_bisect:%s", of);
    json_t *req = bisect_request(job, cell, of), *out = NULL;
    struct store_job_new n = {
        .request = req, .idem_key = idem, .body_hash = of, .max_queued_jobs = cfg->max_queued_jobs};
    bool existed = false;
    int rc = req ? store_job_create(st, &n, &out, &existed) : -ENOMEM;
    json_decref(req);
    json_decref(out);
    return rc;
}

/* Follows JOB's cells of compiled MODE that the comparison with its eager
 * cells (on SIDE, the job's cells) finds diverged, while *N is below
 * COMPILER_BISECT_CELLS. */
static int follow_mode(struct store *st, const struct capd_config *cfg, json_t *job,
                       struct cmp_side *side, const char *mode, int *n)
{
    struct cmp_options o;
    json_t *res = NULL, *c;
    size_t i;
    replay_cmp_options(job, &o); /* overrides it refuses leave the defaults */
    o.perf_gate = false;
    o.bootstrap_resamples = 0;
    snprintf(o.control_mode, sizeof o.control_mode, "eager");
    snprintf(o.head_mode, sizeof o.head_mode, "%s", mode);
    int rc = cmp_compare(side, side, &o, &res);
    json_array_foreach(rc ? NULL : json_object_get(res, "cells"), i, c)
    {
        const char *status = json_string_value(json_object_get(c, "status"));
        json_t *cell = job_cell(job, c);
        if (rc || *n >= COMPILER_BISECT_CELLS || !cell || !status || strcmp(status, "diverged"))
            continue;
        if ((rc = submit(st, cfg, job, cell)) == 0)
            ++*n;
    }
    json_decref(res);
    return rc;
}

/* The compiled modes of JOB's matrix, eager's presence into *EAGER. */
static json_t *compiled_modes(json_t *job, bool *eager)
{
    json_t *modes = json_object_get(json_object_get(job, "matrix"), "modes"), *m;
    json_t *out = json_array();
    size_t i;
    *eager = !json_is_array(modes);
    json_array_foreach(modes, i, m)
    {
        if (strcmp(json_string_value(m), "eager") == 0)
            *eager = true;
        else
            json_array_append(out, m);
    }
    return out;
}

/* Looks at job ID: the label it leaves (in LABEL), 0 or a negative errno. */
static int look(struct store *st, const struct capd_config *cfg, const char *id, char *label,
                size_t len)
{
    json_t *job = NULL, *modes = NULL, *m;
    struct cmp_side *side = NULL;
    struct store_payloads *pl = NULL;
    struct store_cell_filter f = {NULL, NULL, NULL};
    bool eager = false;
    size_t i;
    int n = 0, rc = store_job_get(st, id, &job);
    if (!rc && !(modes = compiled_modes(job, &eager)))
        rc = -ENOMEM;
    if (!rc && json_array_size(modes) == 0) {
        snprintf(label, len, "no compiled mode");
        goto out;
    }
    if (!rc && !eager) {
        snprintf(label, len, "no eager cell");
        goto out;
    }
    if (!rc)
        rc = cmp_side_new(&side);
    if (!rc)
        rc = store_load_side(st, id, &f, side, &pl);
    json_array_foreach(rc ? NULL : modes, i, m)
    {
        if (!rc)
            rc = follow_mode(st, cfg, job, side, json_string_value(m), &n);
    }
    if (!rc)
        snprintf(label, len, n ? "bisecting %d" : "nothing diverged", n);
out:
    cmp_side_free(side);
    store_payloads_free(pl);
    json_decref(modes);
    json_decref(job);
    return rc;
}

/* Jobs are labelled compiler_bisect_auto: "bisecting N" when jobs were
 * created. */
static const struct replay_looker looker = {"compiler_bisect_auto", "bisecting",
                                            store_compiler_bisect_pending, look};

bool compiler_bisect_step(struct store *st, const struct capd_config *cfg)
{
    return replay_look_pending(st, cfg, &looker);
}
