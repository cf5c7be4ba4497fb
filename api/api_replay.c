/*
 * api/api_replay.c - from "this op diverged" to a reproducer (docs/api.md,
 * "Replay and repro"; docs/compare.md, "Targeted capture and the
 * reproducer").
 *
 * POST /v1/jobs/{id}/cells/{cell}/replay takes a head job's cell, finds its
 * control (the job's control_commit, else its branch's, as the commit diff
 * does), picks the unit to replay (the body's "op", else the cell's
 * divergence as daemon/replay/auto.h's replay_unit_of picks it from the
 * comparison at the job's options: an op call, or a module's forward call)
 * and submits two replay jobs: the cell's model, width and pass, once with
 * the control's build at the control's commit and once with the head's,
 * each with option target_op naming the unit (at granularity op for an op
 * call), and iterations 0 (numerics only). Their labels say what they replay
 * (replay_of "<job>/<cell>", replay_side, replay_op); a replay job stands
 * for no commit (storage/jobs.c). Each side's job is created under the
 * idempotency key "replay:<job>/<cell>:<side>", so asking again answers the
 * same jobs, and asking for another op is 409 idempotency_conflict.
 *
 * Once the control's replay job is done, the daemon's replay step
 * (daemon/replay/isolate.h) writes the unit's recorded inputs into a
 * folder and submits the isolated pair: the op (or module) alone on those
 * inputs under each build at every width (replay_side control_isolated,
 * head_isolated).
 *
 * GET /v1/jobs/{id}/cells/{cell}/replay answers once all are done
 * (api/replay_report.c). GET .../repro answers, once both replay jobs are
 * done, the reproducer (daemon/replay/bundle.h): a tar of repro.py, the
 * control's recorded inputs of the unit and both sides' outputs.
 */
#include <errno.h>
#include <stdio.h>
#include <string.h>

#include "api/api_int.h"
#include "api/repro.h"
#include "compare/cmp.h"
#include "daemon/replay/auto.h"
#include "daemon/replay/bundle.h"

/* The compared cell of MODE among RES's cells (the filter leaves one per
 * mode), or NULL. */
static json_t *cell_of_mode(json_t *res, json_t *mode)
{
    json_t *c;
    size_t i;
    json_array_foreach(json_object_get(res, "cells"), i, c)
    {
        if (json_equal(json_object_get(c, "mode"), mode))
            return c;
    }
    return NULL;
}

/* The op call or module call to replay in the comparison of CTL and HEAD's
 * cell F of MODE (daemon/replay/auto.h, replay_unit_of); 0, -ENOENT when
 * the cell has none, another negative errno when the comparison failed. */
static int divergent_op(struct store *s, json_t *ctl, json_t *head,
                        const struct store_cell_filter *f, json_t *mode, char *out, size_t n)
{
    struct api_cmp_input in = {0};
    struct cmp_options o;
    json_t *res = NULL, *c = NULL;
    cmp_options_init(&o);
    int rc = api_cmp_load(s, ctl, head, f, &in);
    if (!rc)
        rc = api_cmp_run(&in, head, &o, &res);
    if (!rc)
        rc = (c = cell_of_mode(res, mode)) && replay_unit_of(c, out, n) ? 0 : -ENOENT;
    json_decref(res);
    api_cmp_input_free(&in);
    return rc;
}

/* The head job {id}, its cell {cell} and its control job; false, having
 * replied, when one is missing or has not finished. */
static bool replay_sides(struct api_req *r, json_t **head, json_t **cell, json_t **ctl,
                         enum MHD_Result *ret)
{
    struct store *s = api_store(r);
    int rc = store_job_get(s, api_param(r, "id"), head);
    if (rc) {
        *ret = api_store_error(r, rc, "job");
        return false;
    }
    rc = store_cell_get(s, api_param(r, "id"), api_param(r, "cell"), cell);
    if (rc) {
        *ret = api_store_error(r, rc, "cell");
        return false;
    }
    if (!api_control_of(r, s, *head, ctl, NULL, ret))
        return false;
    if (!api_job_finished(*ctl) || !api_job_finished(*head)) {
        *ret = api_error(r, 409, "pending", NULL,
                         "the job or its control has not finished; retry when both have");
        return false;
    }
    return true;
}

/* The op the body names, else the cell's divergent op, into OP. */
static bool replay_op(struct api_req *r, json_t *body, json_t *ctl, json_t *head, json_t *cell,
                      char *op, size_t n, enum MHD_Result *ret)
{
    json_t *named = json_object_get(body, "op");
    if (named) {
        const char *v = json_string_value(named);
        if (!v || api_target_kind(v) == API_TARGET_NONE) {
            *ret = api_error(r, 400, "invalid_field", "op",
                             "op must name one op call, <module>.<call>.<phase>/op.<aten "
                             "name>.<n>, or one module's forward call, <module>.<call>.forward, "
                             "at most %d bytes",
                             API_TARGET_OP_MAX);
            return false;
        }
        snprintf(op, n, "%s", v);
        return true;
    }
    struct store_cell_filter f = {json_string_value(json_object_get(cell, "model")),
                                  json_string_value(json_object_get(cell, "width")),
                                  json_string_value(json_object_get(cell, "pass"))};
    int rc = divergent_op(api_store(r), ctl, head, &f, json_object_get(cell, "mode"), op, n);
    if (rc == -ENOENT)
        *ret = api_error(r, 409, "no_op_divergence", NULL,
                         "cell %s has no divergence to replay (none, or only in the backward "
                         "pass of a job at granularity module: compare it at granularity op), or "
                         "name the op or module call in the body",
                         api_param(r, "cell"));
    else if (rc)
        *ret = api_cmp_failed(r, rc);
    return rc == 0;
}

/* Whether CELL runs eagerly; false, having replied 409, for a compiled
 * cell (replay runs one op or module eagerly: daemon/replay/auto.h). */
static bool replay_eager(struct api_req *r, json_t *cell, enum MHD_Result *ret)
{
    const char *mode = json_string_value(json_object_get(cell, "mode"));
    if (!mode || strcmp(mode, "eager") == 0)
        return true;
    *ret = api_error(r, 409, "compiled_cell", NULL,
                     "cell %s runs mode %s; a replay runs one op or module eagerly, so it replays "
                     "eager cells only: replay the eager cell of the same model, width and pass",
                     api_param(r, "cell"), mode);
    return false;
}

enum MHD_Result api_cell_replay(struct api_req *r)
{
    enum MHD_Result ret;
    json_t *body = api_body_object(r, &ret), *head = NULL, *cell = NULL, *ctl = NULL;
    json_t *jobs[2] = {NULL, NULL};
    char op[API_TARGET_OP_MAX + 1];
    if (!body)
        return ret;
    if (!replay_sides(r, &head, &cell, &ctl, &ret) || !replay_eager(r, cell, &ret) ||
        !replay_op(r, body, ctl, head, cell, op, sizeof op, &ret))
        goto out;
    struct replay_ask a = {ctl,
                           head,
                           cell,
                           op,
                           r->token_id[0] ? r->token_id : NULL,
                           api_cfg(r)->max_queued_jobs_per_token};
    int rc = replay_submit(api_store(r), api_cfg(r), &a, jobs);
    if (rc == -EEXIST) {
        ret = api_error(
            r, 409, "idempotency_conflict", "op",
            "cell %s/%s already has a replay of another op or module call (GET .../repro)",
            api_param(r, "id"), api_param(r, "cell"));
    } else if (rc) {
        ret = api_store_error(r, rc, "replay job");
    } else {
        capd_notify_work(api_daemon(r));
        ret = api_json(r, 202,
                       json_pack("{s:s, s:o, s:o}", "op", op, "control", api_job_summary(jobs[0]),
                                 "head", api_job_summary(jobs[1])));
    }
out:
    json_decref(body);
    json_decref(head);
    json_decref(cell);
    json_decref(ctl);
    json_decref(jobs[0]);
    json_decref(jobs[1]);
    return ret;
}

/* SIDE's replay job of OF into *JOB; false, having replied, when there is
 * none or it has not finished. */
static bool replay_done(struct api_req *r, const char *of, const char *side, json_t **job,
                        enum MHD_Result *ret)
{
    char id[16];
    struct store *s = api_store(r);
    int rc = store_job_replay(s, of, side, id);
    if (rc == -ENOENT) {
        *ret = api_error(r, 404, "no_replay", NULL,
                         "cell %s has no replay: POST /v1/jobs/{id}/cells/{cell}/replay first", of);
        return false;
    }
    if (!rc)
        rc = store_job_get(s, id, job);
    if (rc) {
        *ret = api_store_error(r, rc, "replay job");
        return false;
    }
    if (!api_job_finished(*job)) {
        json_t *b = json_pack("{s:{s:s, s:s, s:n}, s:o}", "error", "code", "pending", "message",
                              "a replay job has not finished; retry when it has", "field", "replay",
                              api_job_summary(*job));
        *ret = api_json(r, 409, b);
        return false;
    }
    return true;
}

/* The isolated pair of OF (daemon/replay/isolate.h), once the control's
 * replay job CTL says how its step went: both finished jobs into *ICTL and
 * *IHEAD, or *REFUSED the reason there is none; false, having replied,
 * while the step or the jobs are still to come. */
static bool isolated_done(struct api_req *r, const char *of, json_t *ctl, json_t **ictl,
                          json_t **ihead, const char **refused, enum MHD_Result *ret)
{
    const char *st =
        json_string_value(json_object_get(json_object_get(ctl, "labels"), "replay_isolated"));
    if (!st) {
        *ret = api_error(r, 409, "pending", "replay",
                         "the op's isolated replay is being prepared; retry in a moment");
        return false;
    }
    if (strcmp(st, "submitted") != 0) {
        *refused = st;
        return true;
    }
    return replay_done(r, of, "control_isolated", ictl, ret) &&
           replay_done(r, of, "head_isolated", ihead, ret);
}

enum MHD_Result api_cell_replay_get(struct api_req *r)
{
    enum MHD_Result ret;
    json_t *ctl = NULL, *head = NULL, *ictl = NULL, *ihead = NULL;
    const char *refused = NULL;
    char of[64];
    snprintf(of, sizeof of, "%s/%s", api_param(r, "id"), api_param(r, "cell"));
    if (replay_done(r, of, "control", &ctl, &ret) && replay_done(r, of, "head", &head, &ret) &&
        isolated_done(r, of, ctl, &ictl, &ihead, &refused, &ret)) {
        /* the replayed cell's own width comes first in the jobs' matrix */
        const char *width = json_string_value(
            json_array_get(json_object_get(json_object_get(ctl, "matrix"), "widths"), 0));
        struct api_replay_jobs j = {ctl, head, ictl, ihead, refused};
        ret = api_replay_report(r, &j, width ? width : "");
    }
    json_decref(ctl);
    json_decref(head);
    json_decref(ictl);
    json_decref(ihead);
    return ret;
}

/* The reproducer of the two finished replay jobs CTL and HEAD. */
static enum MHD_Result repro_reply(struct api_req *r, json_t *ctl, json_t *head)
{
    const char *op =
        json_string_value(json_object_get(json_object_get(ctl, "labels"), "replay_op"));
    struct repro_bundle b = {.st = api_store(r),
                             .runner_dir = api_cfg(r)->runner_dir,
                             .ctl = {ctl, op},
                             .head = {head, op},
                             .max_bytes = api_cfg(r)->repro_max_bytes};
    struct ubuf tar;
    enum MHD_Result ret;
    int rc = op ? repro_tar(&b, &tar) : -EINVAL;
    if (rc == -EINVAL) {
        ret = api_error(r, 422, "no_target_records", NULL, "%s",
                        op ? b.why : "the replay job names no op");
    } else if (rc == -E2BIG) {
        ret = api_error(r, 422, "repro_too_large", NULL,
                        "the reproducer would be larger than repro_max_bytes (%llu bytes); its "
                        "records are in GET /v1/jobs/{id}/cells/{cell}/records of the replay jobs",
                        (unsigned long long)b.max_bytes);
    } else if (rc) {
        ret = api_error(r, 500, "internal", NULL, "the reproducer could not be written: %s",
                        b.why[0] ? b.why : strerror(-rc));
    } else {
        size_t len = 0;
        char *body = ubuf_take(&tar, &len);
        api_reply_header(r, "Content-Disposition", "attachment; filename=\"repro.tar\"");
        ret = api_text(r, 200, "application/x-tar", body, len);
    }
    if (op)
        ubuf_free(&tar);
    return ret;
}

enum MHD_Result api_cell_repro(struct api_req *r)
{
    enum MHD_Result ret;
    json_t *ctl = NULL, *head = NULL;
    char of[64];
    snprintf(of, sizeof of, "%s/%s", api_param(r, "id"), api_param(r, "cell"));
    if (replay_done(r, of, "control", &ctl, &ret) && replay_done(r, of, "head", &head, &ret))
        ret = repro_reply(r, ctl, head);
    json_decref(ctl);
    json_decref(head);
    return ret;
}
