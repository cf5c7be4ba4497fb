/*
 * daemon/replay/isolate.c - the replay step (isolate.h): the control's
 * recorded inputs of the unit (an op call's arguments, a module call's
 * inputs) into a folder a cell reads, then the isolated pair of jobs.
 */
#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>

#include "daemon/replay/bundle.h"
#include "daemon/replay/isolate.h"
#include "daemon/replay/pending.h"
#include "util/fs.h"
#include "util/log.h"

/* The key of the unit TARGET names in the isolated cells: an op call
 * ("<module>.<call>.<phase>/op.<aten name>.<n>") is the op model's one
 * call, "model.0.forward/op.<aten name>.0"; a module's forward call
 * ("<module>.<call>.forward") is itself (the cell runs its own model). */
static bool isolated_key(const char *target, char *out, size_t n)
{
    const char *op = strstr(target, "/op.");
    if (!op)
        return (size_t)snprintf(out, n, "%s", target) < n;
    const char *dot = strrchr(op, '.');
    if (dot <= op + 4)
        return false;
    return (size_t)snprintf(out, n, "model.0.forward/op.%.*s.0", (int)(dot - op - 4), op + 4) < n;
}

/* SIDE's isolated job request, from its model run's request REQ. */
static json_t *isolated_request(json_t *req, const char *side, const char *dir, const char *key)
{
    json_t *r = json_deep_copy(req);
    json_t *o = json_object_get(r, "options"), *labels = json_object_get(r, "labels");
    if (!json_is_object(o) || !json_is_object(labels) ||
        !json_is_object(json_object_get(r, "matrix"))) {
        json_decref(r);
        return NULL;
    }
    json_object_set_new(o, "target_op", json_string(key));
    json_object_set_new(o, "target_inputs", json_string(dir));
    json_object_set_new(o, "reference", json_string("float64"));
    json_object_set_new(json_object_get(r, "matrix"), "passes", json_pack("[s]", "forward"));
    json_object_set_new(labels, "replay_side", json_string(side));
    return r;
}

/* Creates (or finds) the isolated job of SIDE from job NATURAL's request. */
static int submit(struct store *st, const struct capd_config *cfg, const char *natural,
                  const char *of, const char *side, const char *dir, const char *key)
{
    json_t *req = NULL, *job = NULL;
    char idem[160];
    int rc = store_job_request(st, natural, &req);
    json_t *iso = rc ? NULL : isolated_request(req, side, dir, key);
    snprintf(idem, sizeof idem, "replay:%s:%s", of, side);
    struct store_job_new jn = {.request = iso,
                               .idem_key = idem,
                               .body_hash = "isolated",
                               .max_queued_jobs = cfg->max_queued_jobs};
    bool existed = false;
    if (!rc)
        rc = iso ? store_job_create(st, &jn, &job, &existed) : -EINVAL;
    if (!rc)
        log_info("replay_isolated", "of=%s side=%s job=%s", of, side,
                 json_string_value(json_object_get(job, "id")));
    json_decref(job);
    json_decref(iso);
    json_decref(req);
    return rc;
}

struct prep {
    const char *id, *of, *op;
    char dir[600], key[600], head[16];
    char why[400];
};

static int refuse(struct prep *p, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static int refuse(struct prep *p, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(p->why, sizeof p->why, fmt, ap);
    va_end(ap);
    return -EINVAL;
}

/* The unit's recorded inputs into P's folder; -EINVAL with the reason when
 * there are none to write. */
static int write_inputs(struct store *st, const struct capd_config *cfg, struct prep *p,
                        json_t *job)
{
    char root[600];
    struct repro_bundle b = {.st = st,
                             .runner_dir = cfg->runner_dir,
                             .ctl = {job, p->op},
                             .max_bytes = cfg->repro_max_bytes};
    snprintf(root, sizeof root, "%s/replays", cfg->data_dir);
    if ((size_t)snprintf(p->dir, sizeof p->dir, "%s/%s", root, p->id) >= sizeof p->dir)
        return refuse(p, "the data dir's path is too long for %s", p->id);
    int rc = util_mkdir_p(root, 0711);
    if (!rc && chmod(root, 0711) != 0)
        rc = -errno;
    if (!rc)
        rc = util_rm_tree(p->dir);
    if (!rc)
        rc = repro_write_dir(&b, p->dir);
    if (rc == -EINVAL)
        return refuse(p, "%s", b.why);
    if (rc == -E2BIG)
        return refuse(p, "the recorded inputs are larger than repro_max_bytes (%llu bytes)",
                      (unsigned long long)cfg->repro_max_bytes);
    if (rc)
        return refuse(p, "cannot write %s: %s", p->dir, b.why[0] ? b.why : strerror(-rc));
    return 0;
}

/* The control replay job P->id: its folder and the isolated pair; -EAGAIN
 * while the queue is full, -EINVAL with P->why when it has none. */
static int prepare(struct store *st, const struct capd_config *cfg, struct prep *p)
{
    json_t *job = NULL;
    int rc = store_job_get(st, p->id, &job);
    json_t *labels = json_object_get(job, "labels");
    p->of = json_string_value(json_object_get(labels, "replay_of"));
    p->op = json_string_value(json_object_get(labels, "replay_op"));
    if (!rc && (!p->of || !p->op || !isolated_key(p->op, p->key, sizeof p->key)))
        rc = refuse(p, "the replay job names no op or module call");
    else if (!rc && strcmp(json_string_value(json_object_get(job, "state")), "done") != 0)
        rc = refuse(p, "the control's replay job was cancelled");
    else if (!rc && store_job_replay(st, p->of, "head", p->head) != 0)
        rc = refuse(p, "the head's replay job is gone");
    if (!rc)
        rc = write_inputs(st, cfg, p, job);
    if (!rc)
        rc = submit(st, cfg, p->id, p->of, "control_isolated", p->dir, p->key);
    if (!rc)
        rc = submit(st, cfg, p->head, p->of, "head_isolated", p->dir, p->key);
    if (!rc)
        rc = store_job_label(st, p->id, "replay_isolated", "submitted");
    json_decref(job);
    return rc;
}

/* Prepares control replay job ID, or labels it with the refusal; true
 * when it created the isolated pair. */
static bool prepare_one(struct store *st, const struct capd_config *cfg, const char *id,
                        const void *arg)
{
    (void)arg;
    struct prep p = {.id = id};
    int rc = prepare(st, cfg, &p);
    if (rc && rc != -EAGAIN) {
        /* said once, on the job, not tried again at every pass */
        char label[sizeof p.why + 16];
        snprintf(label, sizeof label, "refused: %s", p.why[0] ? p.why : strerror(-rc));
        log_warn("replay_isolated_refused", "job=%s reason=%s", p.id, log_q(label + 9));
        store_job_label(st, p.id, "replay_isolated", label);
    }
    return rc == 0;
}

bool replay_step(struct store *st, const struct capd_config *cfg)
{
    return replay_each_pending(st, cfg, store_replays_pending, prepare_one, NULL);
}
