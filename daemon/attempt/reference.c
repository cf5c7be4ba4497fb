/* daemon/attempt/reference.c - the control build of a paired head cell (reference.h). */
#include <errno.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "daemon/child/cellenv.h"
#include "util/log.h"
#include "daemon/attempt/reference.h"
#include "daemon/cpu/widths.h"
#include "daemon/prefork/zygote.h"

/* The control commit of HEAD: its own control_commit, else its branch's;
 * a copy in OUT, false when there is none. */
static bool control_commit(struct store *st, json_t *head, char *out, size_t len)
{
    const char *c = json_string_value(json_object_get(head, "control_commit"));
    json_t *branch = NULL;
    const char *bn = json_string_value(json_object_get(head, "branch"));
    if (!c && bn && store_branch_get(st, bn, &branch) == 0)
        c = json_string_value(json_object_get(branch, "control_commit"));
    bool ok = c && strlen(c) < len;
    if (ok)
        snprintf(out, len, "%s", c);
    json_decref(branch);
    return ok;
}

/* The control job of HEAD (finished, same project, not HEAD itself). */
static json_t *control_job(struct store *st, json_t *head, char *commit, size_t clen, char *why,
                           size_t wlen)
{
    char id[16];
    json_t *job = NULL;
    if (!control_commit(st, head, commit, clen)) {
        snprintf(why, wlen, "no control (the job names no control_commit, its branch none)");
        return NULL;
    }
    if (store_job_for_commit(st, commit, true, id) != 0 || store_job_get(st, id, &job) != 0) {
        snprintf(why, wlen, "control commit %s has no finished job", commit);
        return NULL;
    }
    const char *hp = json_string_value(json_object_get(head, "project"));
    const char *cp = json_string_value(json_object_get(job, "project"));
    if (strcmp(id, json_string_value(json_object_get(head, "id"))) == 0 ||
        (hp && cp && strcmp(hp, cp) != 0)) {
        snprintf(why, wlen, "the newest finished job of control commit %s is %s, %s", commit, id,
                 hp && cp && strcmp(hp, cp) != 0 ? "of another project" : "this job");
        json_decref(job);
        return NULL;
    }
    return job;
}

/* The control job's build, as it ran: registered, not replaced since the
 * job was submitted, interpreter executable, width runnable here. */
static json_t *control_build(struct store *st, json_t *job, const char *width, char *why,
                             size_t wlen)
{
    const char *name = json_string_value(json_object_get(job, "build"));
    json_t *b = NULL;
    if (!name || store_build_get(st, name, &b) != 0) {
        snprintf(why, wlen, "the control's build '%s' is no longer registered", name ? name : "?");
        return NULL;
    }
    /* A template build runs as the control commit's build. */
    if (store_build_expand(b, json_string_value(json_object_get(job, "commit"))) != 0) {
        snprintf(why, wlen, "out of memory");
        json_decref(b);
        return NULL;
    }
    const char *upd = json_string_value(json_object_get(b, "updated_at"));
    const char *sub = json_string_value(json_object_get(job, "created_at"));
    const char *py = json_string_value(json_object_get(b, "python"));
    char wwhy[256] = "", miss[128];
    /* Both times are fixed-width ISO 8601 UTC strings (store_col_time). */
    if (!upd || !sub || strcmp(upd, sub) > 0)
        snprintf(why, wlen, "the control's build '%s' was replaced (%s) after the control job %s",
                 name, upd ? upd : "?", json_string_value(json_object_get(job, "id")));
    else if (!py || access(py, X_OK) != 0)
        snprintf(why, wlen, "the control's build '%s': interpreter %s is not executable", name,
                 py ? py : "?");
    else if (!width_runnable(width, wwhy, sizeof wwhy, miss, sizeof miss))
        snprintf(why, wlen, "width %s does not run here: %s", width, wwhy);
    else
        return b;
    json_decref(b);
    return NULL;
}

/*
 * A side's timing template starts in its build's zygote for this
 * environment (zyg_for_timing: the prefork zygote, or one that serves
 * timing templates only): the side names the socket and capd-exec, which
 * hands the template to the zygote or, when the zygote cannot serve it,
 * execs it afresh. Without one the runner starts the build's interpreter
 * itself.
 */
static void add_zygote(const struct capd_config *cfg, struct store *st, json_t *b,
                       const json_t *spec, json_t *ref)
{
    char sock[128]; /* as the head's own (sup_int.h zsock) */
    int64_t rev = 0;
    if (store_build_rev(st, json_string_value(json_object_get(b, "name")), &rev) != 0)
        return;
    json_object_set_new(b, "rev", json_integer((json_int_t)rev));
    char **env = cellenv_strv(json_object_get(ref, "env"));
    if (env && zyg_for_timing(b, spec, env, sock, sizeof sock) == 0)
        json_object_set_new(ref, "zygote",
                            json_pack("{s:s,s:s}", "socket", sock, "exec", cfg->exec_bin));
    cellenv_free(env);
}

/* How a timing template of build B starts for the cell RUN: its
 * interpreter, user models, the environment a cell of B gets and, where B
 * has a zygote for it, the zygote. */
static json_t *template_side(const struct capd_config *cfg, struct store *st, json_t *b,
                             const struct store_cell_run *run, const char *scratch,
                             const char *spec_path)
{
    json_t *env = cellenv_object(cfg, b, run->spec, scratch, spec_path);
    json_t *out = env ? json_pack("{s:O,s:O,s:o}", "python", json_object_get(b, "python"),
                                  "model_roots", json_object_get(b, "model_roots"), "env", env)
                      : NULL;
    if (out)
        add_zygote(cfg, st, b, run->spec, out);
    return out;
}

/* The head build's own side, started exactly as the control's is (the
 * runner's timing templates, docs/runner.md "Paired timing"). */
static json_t *head_side(const struct capd_config *cfg, struct store *st, json_t *head,
                         const struct store_cell_run *run, const char *scratch,
                         const char *spec_path, char *why, size_t wlen)
{
    const char *name = json_string_value(json_object_get(head, "build"));
    json_t *b = NULL, *out = NULL;
    if (!name || store_build_get(st, name, &b) != 0)
        snprintf(why, wlen, "the head's build '%s' is no longer registered", name ? name : "?");
    else if (store_build_expand(b, json_string_value(json_object_get(head, "commit"))) != 0 ||
             !(out = template_side(cfg, st, b, run, scratch, spec_path)))
        snprintf(why, wlen, "out of memory");
    json_decref(b);
    return out;
}

json_t *ref_for_cell(const struct capd_config *cfg, struct store *st,
                     const struct store_cell_run *run, const char *scratch, const char *spec_path,
                     char *why, size_t wlen)
{
    json_t *head = NULL, *job = NULL, *b = NULL, *out = NULL, *own = NULL;
    char commit[72];
    const char *width = json_string_value(json_object_get(run->spec, "width"));
    if (store_job_get(st, run->job_id, &head) != 0) {
        snprintf(why, wlen, "cannot read job %s", run->job_id);
        return NULL;
    }
    if (!(job = control_job(st, head, commit, sizeof commit, why, wlen)) ||
        !(b = control_build(st, job, width ? width : "", why, wlen)) ||
        !(own = head_side(cfg, st, head, run, scratch, spec_path, why, wlen)))
        goto out;
    out = template_side(cfg, st, b, run, scratch, spec_path);
    /* Both sides' templates start alike: from zygotes, or both afresh
     * (one side without a zygote: a full pool, a GPU cell). */
    if (out && !json_object_get(out, "zygote") != !json_object_get(own, "zygote")) {
        json_object_del(out, "zygote");
        json_object_del(own, "zygote");
        log_info("cell_templates_fresh", "job=%s cell=%s reason=%s", run->job_id, run->cell_id,
                 log_q("only one side's build has a zygote for this cell"));
    }
    if (!out || json_object_set_new(out, "build", json_incref(json_object_get(b, "name"))) ||
        json_object_set_new(out, "job", json_incref(json_object_get(job, "id"))) ||
        json_object_set_new(out, "commit", json_string(commit)) ||
        json_object_set_new(out, "head", json_incref(own))) {
        snprintf(why, wlen, "out of memory");
        json_decref(out);
        out = NULL;
    }
out:
    json_decref(own);
    json_decref(head);
    json_decref(job);
    json_decref(b);
    return out;
}

void ref_add_to_spec(const struct capd_config *cfg, struct store *st,
                     const struct store_cell_run *run, json_t *spec, const char *scratch,
                     const char *spec_path)
{
    json_t *o = json_object_get(run->spec, "options");
    json_t *pairs = json_object_get(o, "timing_pairs");
    char why[600] = "";
    /* A job stored before pairs existed has no timing_pairs: 0, no pairs. */
    if (json_integer_value(json_object_get(o, "iterations")) <= 0 || json_integer_value(pairs) <= 0)
        return;
    json_t *ref = ref_for_cell(cfg, st, run, scratch, spec_path, why, sizeof why);
    if (!ref) {
        log_info("cell_unpaired", "job=%s cell=%s reason=%s", run->job_id, run->cell_id,
                 log_q(why));
        return;
    }
    log_info("cell_paired", "job=%s cell=%s control_job=%s build=%s", run->job_id, run->cell_id,
             json_string_value(json_object_get(ref, "job")),
             log_q(json_string_value(json_object_get(ref, "build"))));
    json_object_set_new(spec, "reference", ref);
}
