/*
 * daemon/attempt/sup.c - one cell attempt's set-up and its public face: the
 * scratch dir, the cell spec and environment, the start through the
 * configured executor (daemon/config/executor.h), cancel and abandon. The stream
 * and the end are daemon/attempt/cellend.c's; daemon/attempt/sup_int.h says how the files
 * of the attempt and its executors share the work.
 */
#include <errno.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "daemon/child/cellenv.h"
#include "daemon/config/executor.h"
#include "util/fs.h"
#include "daemon/child/runas.h"
#include "daemon/attempt/sup.h"
#include "daemon/attempt/sup_int.h"
#include "daemon/cpu/widths.h"
#include "storage/layout.h"

void sup_set_next_cb(struct sup *s, sup_next_cb cb)
{
    s->next_cb = cb;
}

bool sup_take_next(struct sup *s, struct store_cell_run *next)
{
    *next = s->next;
    memset(&s->next, 0, sizeof s->next);
    return next->cell_seq != 0;
}

const char *sup_job_id(const struct sup *s)
{
    return s->run.job_id;
}

const char *sup_cell_id(const struct sup *s)
{
    return s->run.cell_id;
}

const char *sup_device_failed(const struct sup *s)
{
    return s->device_failed[0] ? s->device_failed : NULL;
}

void sup_cancel(struct sup *s)
{
    if (s->exited)
        return;
    s->cancelled = true;
    sup__terminate(s);
}

void sup_abandon(struct sup *s)
{
    s->abandoned = true;
    s->exec->stop(s, SIGKILL);
}

/* ---- start ---- */

/* The child's environment: daemon/cellenv.h. */
static char **build_env(struct sup *s, const char *spec_path)
{
    json_t *env = cellenv_object(s->cfg, s->run.build, s->run.spec, s->scratch, spec_path);
    char **out = env ? cellenv_strv(env) : NULL;
    json_decref(env);
    return out;
}

static int write_spec(struct sup *s, const char *path)
{
    /* the job's options as stored (the runner fills what an old job lacks
     * from schema/options.json), and the payload limits, which capd sets */
    json_t *o = json_deep_copy(json_object_get(s->run.spec, "options"));
    json_object_set_new(o, "max_one_payload_bytes",
                        json_integer((json_int_t)s->cfg->frame_max_payload));
    json_object_set_new(o, "max_payload_bytes",
                        json_integer((json_int_t)s->cfg->frame_max_total_payload));
    json_t *spec =
        json_pack("{s:i,s:s,s:s,s:i,s:O,s:O,s:O*,s:O,s:s,s:i,s:s,s:O,s:o}", "protocol",
                  FRAME_PROTOCOL_VERSION, "job", s->run.job_id, "cell", s->run.cell_id, "attempt",
                  s->run.attempt, "model", json_object_get(s->run.spec, "model"), "width",
                  json_object_get(s->run.spec, "width"), "width_requires",
                  width_requires(json_string_value(json_object_get(s->run.spec, "width"))), "pass",
                  json_object_get(s->run.spec, "pass"), "device", s->run.opts.device, "frame_fd", 3,
                  "scratch", s->scratch, "model_roots",
                  json_object_get(s->run.build, "model_roots"), "options", o);
    /* What the runner checks the libraries against (docs/widths.md): the
     * ATen capability to read back and the widest level any may run. */
    const char *wname = json_string_value(json_object_get(s->run.spec, "width"));
    json_t *isa = width_field(wname, "isa"), *eff = width_field(wname, "effective");
    if (spec) {
        json_object_set_new(spec, "width_isa", isa ? json_incref(isa) : json_null());
        json_object_set_new(spec, "width_effective", eff ? json_incref(eff) : json_null());
    }
    /* The cell's compile mode (docs/runner.md, "Compiled cells"). */
    if (spec && json_is_string(json_object_get(s->run.spec, "mode")))
        json_object_set(spec, "mode", json_object_get(s->run.spec, "mode"));
    /* The cell's CPU set (daemon/host/cpus.h), when the scheduler gave one. */
    if (spec && json_is_array(json_object_get(s->run.spec, "cpus")))
        json_object_set(spec, "cpus", json_object_get(s->run.spec, "cpus"));
    /* Whether a GPU cell shares its device or holds it alone
     * (daemon/host/devices.h), for the runner's fingerprint. */
    if (spec && json_is_string(json_object_get(s->run.spec, "device_share")))
        json_object_set(spec, "device_share", json_object_get(s->run.spec, "device_share"));
    /* The control build to time interleaved with this head, which the
     * scheduler resolved (daemon/attempt/reference.h). */
    if (spec && json_object_get(s->run.spec, "reference"))
        json_object_set(spec, "reference", json_object_get(s->run.spec, "reference"));
    int rc = spec && json_dump_file(spec, path, JSON_INDENT(2)) == 0 ? 0 : -EIO;
    json_decref(spec);
    return rc;
}

/* A new attempt of RUN (its ownership moves here) with nothing made yet. */
static struct sup *sup_new(uv_loop_t *loop, const struct capd_config *cfg, struct store *st,
                           struct store_cell_run *run, sup_done_cb done, void *ud)
{
    /* config.c refused any executor its table does not name */
    const struct executor *exec = executor_find(cfg->executor);
    struct sup *s = exec ? calloc(1, sizeof *s) : NULL;
    if (!s)
        return NULL;
    s->exec = exec;
    s->loop = loop;
    s->cfg = cfg;
    s->st = st;
    s->run = *run;
    memset(run, 0, sizeof *run);
    s->done = done;
    s->ud = ud;
    s->log_fd = -1;
    s->t0 = uv_hrtime();
    s->losses0 = store_batch_losses(st);
    s->buf = sup__read_buffer();
    return s;
}

/*
 * The cell's files: the interpreter checked as the cell user sees it, the
 * scratch dir (emptied), the log dir, the spec (*SPEC_PATH, caller frees)
 * and the hand-over to run_as_user. 0, or -errno with REASON (left empty
 * for want of memory).
 */
static int prepare_files(struct sup *s, char **spec_path, char *reason, size_t rlen)
{
    const struct capd_config *cfg = s->cfg;
    const char *python = json_string_value(json_object_get(s->run.build, "python"));
    char why[768];
    int rc = -ENOMEM;
    if (!python || runas_can_use(cfg, python, RUNAS_EXEC, why, sizeof why) != 0) {
        snprintf(reason, rlen, "build '%s': interpreter %s",
                 json_string_value(json_object_get(s->run.build, "name")),
                 python ? why : "(build no longer registered) is not executable");
        return -ENOENT;
    }
    char logdir[LAYOUT_PATH_MAX], logp[LAYOUT_PATH_MAX];
    if (layout_cell_scratch(s->scratch, sizeof s->scratch, cfg->data_dir, s->run.cell_id,
                            s->run.attempt) != 0 ||
        layout_job_logs(logdir, sizeof logdir, cfg->data_dir, s->run.job_id) != 0 ||
        layout_cell_log(logp, sizeof logp, cfg->data_dir, s->run.job_id, s->run.cell_id) != 0) {
        rc = -ENAMETOOLONG;
        snprintf(reason, rlen, "the cell's scratch dir or log path below %s is too long",
                 cfg->data_dir);
        goto out;
    }
    char spec[LAYOUT_PATH_MAX];
    if (layout_cell_spec(spec, sizeof spec, cfg->data_dir, s->run.cell_id, s->run.attempt) != 0 ||
        !(s->log_path = strdup(logp)) || !(*spec_path = strdup(spec))) {
        *spec_path = NULL;
        goto out;
    }
    util_rm_tree(s->scratch);
    if ((rc = util_mkdir_p(s->scratch, 0700)) != 0 || (rc = util_mkdir_p(logdir, 0750)) != 0) {
        snprintf(reason, rlen, "cannot create %s: %s", s->scratch, strerror(-rc));
        goto out;
    }
    if ((rc = write_spec(s, *spec_path)) != 0) {
        snprintf(reason, rlen, "cannot write the cell spec %s", *spec_path);
        goto out;
    }
    /* A remote attempt's scratch holds capd's spool, not the cell's files. */
    rc = !s->exec->on_host ? 0 : runas_prepare_cell(cfg, s->scratch, *spec_path, reason, rlen);
out:
    return rc;
}

/*
 * A set-up failure before any process: the cell is finished as failed
 * with REASON (a generic one when none was given) and everything made so
 * far goes, the scratch dir included. The executor's start cleaned up
 * its own.
 */
static void setup_failed(struct sup *s, char *reason, size_t rlen, int rc)
{
    if (!reason[0])
        snprintf(reason, rlen, "capd could not prepare the cell (error %d)", rc);
    sup__store_setup_failure(s->st, &s->run, reason);
    if (s->log_fd >= 0)
        close(s->log_fd);
    if (s->scratch[0] && !s->cfg->keep_scratch)
        util_rm_tree(s->scratch);
    mem_cell_free(s->mem);
    sup__free(s);
}

int sup_reattach(uv_loop_t *loop, const struct capd_config *cfg, struct store *st,
                 struct store_cell_run *run, struct store_slurm_job slurm, sup_done_cb done,
                 void *ud, struct sup **out)
{
    char logp[LAYOUT_PATH_MAX], spec_path[LAYOUT_PATH_MAX], reason[1200] = "";
    char **env = NULL;
    struct sup *s = sup_new(loop, cfg, st, run, done, ud);
    if (!s)
        return -ENOMEM;
    int rc = sup__parser_new(s);
    if (rc == 0 &&
        (layout_cell_scratch(s->scratch, sizeof s->scratch, cfg->data_dir, s->run.cell_id,
                             s->run.attempt) != 0 ||
         layout_cell_log(logp, sizeof logp, cfg->data_dir, s->run.job_id, s->run.cell_id) != 0 ||
         layout_cell_spec(spec_path, sizeof spec_path, cfg->data_dir, s->run.cell_id,
                          s->run.attempt) != 0))
        rc = -ENAMETOOLONG;
    if (rc == 0 && !(s->log_path = strdup(logp)))
        rc = -ENOMEM;
    if (rc == 0 && !(env = build_env(s, spec_path)))
        rc = -ENOMEM;
    if (rc == 0 && !s->exec->reattach)
        rc = -ENOTSUP;
    if (rc == 0)
        rc = s->exec->reattach(s, env, spec_path, slurm, reason, sizeof reason);
    cellenv_free(env);
    if (rc) {
        if (!reason[0])
            snprintf(reason, sizeof reason, "capd could not take the attempt up again (%d)", rc);
        sup__store_setup_failure(st, &s->run, reason);
        if (s->log_fd >= 0)
            close(s->log_fd);
        sup__free(s);
        return rc;
    }
    *out = s;
    return 0;
}

int sup_start(uv_loop_t *loop, const struct capd_config *cfg, struct store *st,
              struct store_cell_run *run, sup_done_cb done, void *ud, struct sup **out)
{
    int rc = -ENOMEM;
    char **env = NULL, *spec_path = NULL, reason[1200] = "";
    struct sup *s = sup_new(loop, cfg, st, run, done, ud);
    if (!s)
        return -ENOMEM;
    if (sup__parser_new(s) != 0)
        goto fail;
    if ((rc = prepare_files(s, &spec_path, reason, sizeof reason)) != 0)
        goto fail;
    rc = -ENOMEM;
    if (!(env = build_env(s, spec_path)))
        goto fail;
    rc = s->exec->start(s, env, spec_path, reason, sizeof reason);
    if (rc == 0)
        *out = s;
    else if (!s->finished)
        goto fail;
    cellenv_free(env);
    free(spec_path);
    return rc;
fail:
    setup_failed(s, reason, sizeof reason, rc);
    cellenv_free(env);
    free(spec_path);
    return rc ? rc : -EIO;
}
