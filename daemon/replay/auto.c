/*
 * daemon/replay/auto.c - the replay jobs of a cell, asked for (the API) or
 * started by capd itself when a comparison finds where the error came in
 * (auto.h).
 */
#include <errno.h>
#include <stdio.h>
#include <string.h>

#include "compare/cmp.h"
#include "daemon/cpu/widths.h"
#include "daemon/replay/auto.h"
#include "daemon/replay/pending.h"

/* ------------------------------------------------------------ the op */

/* The op prefix of a per-op record key (its "<op>.<role>.<i>" less the last
 * two parts) into OUT; false when KEY is not one. */
static bool op_prefix(const char *key, char *out, size_t n)
{
    const char *a = key ? strrchr(key, '.') : NULL;
    if (a == NULL || !strstr(key, "/op."))
        return false;
    const char *b = a;
    while (b > key && b[-1] != '.')
        b--;
    if (b == key || (size_t)(b - 1 - key) >= n || (size_t)(b - 1 - key) > REPLAY_OP_MAX)
        return false;
    snprintf(out, n, "%.*s", (int)(b - 1 - key), key);
    return strstr(out, "/op.") != NULL;
}

static bool row_op(json_t *cell, const char *field, char *out, size_t n)
{
    json_t *row = json_object_get(cell, field);
    return json_is_string(json_object_get(row, "op")) &&
           op_prefix(json_string_value(json_object_get(row, "key")), out, n);
}

/* The forward call of the module a module record names (no op record),
 * "<module>.<call>.forward", into OUT. */
static bool row_module(json_t *cell, const char *field, char *out, size_t n)
{
    json_t *row = json_object_get(cell, field);
    const char *mod = json_string_value(json_object_get(row, "module"));
    const char *phase = json_string_value(json_object_get(row, "phase"));
    json_t *call = json_object_get(row, "call");
    if (!mod || !phase || strcmp(phase, "forward") != 0 || !json_is_integer(call) ||
        json_object_get(row, "op") || strncmp(mod, "ref.", 4) == 0)
        return false;
    int len = snprintf(out, n, "%s.%lld.forward", mod, (long long)json_integer_value(call));
    return len > 0 && (size_t)len < n && len <= REPLAY_OP_MAX && !strchr(out, '/');
}

bool replay_unit_of(json_t *cell, char *out, size_t n)
{
    const char *mode = json_string_value(json_object_get(cell, "mode"));
    if (mode && strcmp(mode, "eager") != 0) /* compiled cells are not replayed (yet) */
        return false;
    return row_op(cell, "first_introduced", out, n) || row_op(cell, "first_divergence", out, n) ||
           row_module(cell, "first_introduced", out, n) ||
           row_module(cell, "first_divergence", out, n);
}

/* ------------------------------------------------------------ submit */

/* The cell's width, then every other width this host runs (but native,
 * which is whatever the framework picks). */
static json_t *replay_widths(json_t *cell)
{
    json_t *w = json_array(), *table = widths_table_here(), *row;
    size_t i;
    const char *own = json_string_value(json_object_get(cell, "width"));
    json_array_append_new(w, json_string(own));
    json_array_foreach(table, i, row)
    {
        const char *name = json_string_value(json_object_get(row, "name"));
        if (name && strcmp(name, own) != 0 && strcmp(name, "native") != 0 &&
            json_is_true(json_object_get(row, "runnable_here")))
            json_array_append_new(w, json_string(name));
    }
    json_decref(table);
    return w;
}

/* One side's replay job request: JOB's project, commit and build, CELL's
 * model and pass at its width and every other width the host runs, JOB's
 * options with TARGET (at granularity op for an op call). */
static json_t *replay_request(json_t *job, json_t *cell, const char *of, const char *side,
                              const char *target)
{
    json_t *opts = json_deep_copy(json_object_get(job, "options"));
    if (!json_is_object(opts)) {
        json_decref(opts);
        opts = json_object();
    }
    if (strstr(target, "/op."))
        json_object_set_new(opts, "granularity", json_string("op"));
    json_object_set_new(opts, "target_op", json_string(target));
    json_object_set_new(opts, "iterations", json_integer(0));
    json_object_set_new(opts, "warmup", json_integer(0));
    /* a replay job's comparison is the replay's own business */
    json_object_set_new(opts, "replay", json_string("off"));
    return json_pack("{s:O, s:O, s:O, s:{s:[O], s:o, s:[O]}, s:o, s:{s:s, s:s, s:s}}", "project",
                     json_object_get(job, "project"), "commit", json_object_get(job, "commit"),
                     "build", json_object_get(job, "build"), "matrix", "models",
                     json_object_get(cell, "model"), "widths", replay_widths(cell), "passes",
                     json_object_get(cell, "pass"), "options", opts, "labels", "replay_of", of,
                     "replay_side", side, "replay_op", target);
}

int replay_submit(struct store *st, const struct capd_config *cfg, const struct replay_ask *a,
                  json_t *jobs[2])
{
    static const char *const sides[2] = {"control", "head"};
    char of[64], idem[160];
    int rc = 0;
    snprintf(of, sizeof of, "%s/%s", json_string_value(json_object_get(a->head, "id")),
             json_string_value(json_object_get(a->cell, "id")));
    for (int i = 0; i < 2 && !rc; i++) {
        json_t *req = replay_request(i ? a->head : a->ctl, a->cell, of, sides[i], a->op);
        snprintf(idem, sizeof idem, "replay:%s:%s", of, sides[i]);
        struct store_job_new n = {.request = req,
                                  .idem_key = idem,
                                  .body_hash = a->op,
                                  .max_queued_jobs = cfg->max_queued_jobs,
                                  .token_id = a->token_id,
                                  .max_queued_per_token = a->max_queued_per_token};
        bool existed = false;
        rc = req ? store_job_create(st, &n, &jobs[i], &existed) : -ENOMEM;
        json_decref(req);
    }
    return rc;
}

/* ------------------------------------------------------------ auto */

/* The head job's control job (its control_commit's, else its branch's
 * control's newest job) into *CTL; -ENOENT when there is none. */
static int control_job(struct store *st, json_t *head, json_t **ctl)
{
    json_t *branch = NULL;
    char id[16];
    const char *control = json_string_value(json_object_get(head, "control_commit"));
    const char *bn = json_string_value(json_object_get(head, "branch"));
    if (!control && bn && store_branch_get(st, bn, &branch) == 0)
        control = json_string_value(json_object_get(branch, "control_commit"));
    int rc = control ? store_job_for_commit(st, control, false, id) : -ENOENT;
    json_decref(branch);
    return rc ? rc : store_job_get(st, id, ctl);
}

int replay_cmp_options(json_t *job, struct cmp_options *o)
{
    struct cmp_err e = {{0}, {0}};
    json_t *opts = json_object_get(job, "options");
    cmp_options_init(o);
    if (cmp_reference_from_name(json_string_value(json_object_get(opts, "reference")),
                                &o->reference) < 0)
        o->reference = CMP_REF_NONE;
    return json_object_get(opts, "compare")
               ? cmp_options_apply_json(o, json_object_get(opts, "compare"), &e)
               : 0;
}

/* The comparison of CTL and HEAD at the head job's reference and
 * tolerances, as GET /v1/compare gives it, into *OUT. */
static int compare_jobs(struct store *st, json_t *ctl, json_t *head, json_t **out)
{
    struct cmp_side *cs = NULL, *hs = NULL;
    struct store_payloads *pl = NULL;
    struct store_cell_filter f = {NULL, NULL, NULL};
    struct cmp_options o;
    int rc = replay_cmp_options(head, &o);
    if (!rc)
        rc = cmp_side_new(&cs);
    if (!rc)
        rc = cmp_side_new(&hs);
    if (!rc)
        rc = store_load_side(st, json_string_value(json_object_get(ctl, "id")), &f, cs, &pl);
    if (!rc)
        rc = store_load_side(st, json_string_value(json_object_get(head, "id")), &f, hs, &pl);
    if (!rc)
        rc = cmp_compare(cs, hs, &o, out);
    cmp_side_free(cs);
    cmp_side_free(hs);
    store_payloads_free(pl);
    return rc;
}

/* HEAD's cell of the compared cell RES (by model, width, pass and mode). */
static json_t *head_cell(json_t *head, json_t *res)
{
    json_t *c;
    size_t i;
    json_array_foreach(json_object_get(head, "cells"), i, c)
    {
        if (json_equal(json_object_get(c, "model"), json_object_get(res, "model")) &&
            json_equal(json_object_get(c, "width"), json_object_get(res, "width")) &&
            json_equal(json_object_get(c, "pass"), json_object_get(res, "pass")) &&
            json_equal(json_object_get(c, "mode"), json_object_get(res, "mode")))
            return c;
    }
    return NULL;
}

/* Whether the unit OP of compared cell RES was replayed already in this
 * look, for another pass of the same model and width (a forward unit
 * replays the same in a backward cell): remembered in SEEN. */
static bool seen_before(json_t *seen, json_t *res, const char *op)
{
    if (strstr(op, ".backward/op.")) /* module units are all forward */
        return false;
    char k[REPLAY_OP_MAX + 200];
    snprintf(k, sizeof k, "%s\x1f%s\x1f%s", json_string_value(json_object_get(res, "model")),
             json_string_value(json_object_get(res, "width")), op);
    if (json_object_get(seen, k))
        return true;
    json_object_set_new(seen, k, json_true());
    return false;
}

/* Replays the cells of the comparison CMP that have a unit to replay, a
 * forward unit once per model and width; their number into *N. */
static int replay_cells(struct store *st, const struct capd_config *cfg, json_t *ctl, json_t *head,
                        json_t *cmp, int *n)
{
    const char *mode =
        json_string_value(json_object_get(json_object_get(head, "options"), "replay"));
    bool all = mode && strcmp(mode, "always") == 0;
    json_t *res, *seen = json_object();
    size_t i;
    int rc = seen ? 0 : -ENOMEM;
    *n = 0;
    json_array_foreach(json_object_get(cmp, "cells"), i, res)
    {
        char op[REPLAY_OP_MAX + 1];
        json_t *cell = head_cell(head, res), *jobs[2] = {NULL, NULL};
        if (rc || (!all && *n >= REPLAY_AUTO_CELLS) || !cell ||
            !replay_unit_of(res, op, sizeof op) || seen_before(seen, res, op))
            continue;
        struct replay_ask a = {ctl, head, cell, op, NULL, 0};
        rc = replay_submit(st, cfg, &a, jobs);
        if (rc == -EEXIST) /* replayed already, for another unit: by hand */
            rc = 0;
        else if (!rc)
            ++*n;
        json_decref(jobs[0]);
        json_decref(jobs[1]);
    }
    json_decref(seen);
    return rc;
}

/* Looks at head job ID: the label it leaves, or 1 while its control is
 * still to finish, -EAGAIN while the queue is full. */
static int look(struct store *st, const struct capd_config *cfg, const char *id, char *label,
                size_t len)
{
    json_t *head = NULL, *ctl = NULL, *cmp = NULL;
    int n = 0, rc = store_job_get(st, id, &head);
    if (!rc && (rc = control_job(st, head, &ctl)) == -ENOENT) {
        snprintf(label, len, "no control job");
        rc = 0;
        goto out;
    }
    const char *state = json_string_value(json_object_get(ctl, "state"));
    if (!rc && state && strcmp(state, "done") != 0 && strcmp(state, "cancelled") != 0) {
        rc = 1;
        goto out;
    }
    if (!rc)
        rc = compare_jobs(st, ctl, head, &cmp);
    if (!rc)
        rc = replay_cells(st, cfg, ctl, head, cmp, &n);
    if (!rc && n)
        snprintf(label, len, "replayed %d", n);
    else if (!rc)
        snprintf(label, len, "nothing to replay");
out:
    json_decref(head);
    json_decref(ctl);
    json_decref(cmp);
    return rc;
}

/* Head jobs are labelled replay_auto: "replayed N" when jobs were created. */
static const struct replay_looker looker = {"replay_auto", "replayed", store_replays_auto_pending,
                                            look};

bool replay_auto_step(struct store *st, const struct capd_config *cfg)
{
    return replay_look_pending(st, cfg, &looker);
}
