/*
 * cli/cmd_repro.c - capctl repro: a diverged cell's op, replayed, as a
 * standalone reproducer.
 *
 * POST /v1/jobs/{id}/cells/{cell}/replay (asking again answers the same
 * replay jobs), then GET .../replay?format=text, waiting out 409 pending
 * while the replay jobs run, and prints what the replay found (the verdict
 * per width and the conclusion); then GET /v1/jobs/{id}/cells/{cell}/repro and
 * writes the archive (a tar of repro/: repro.py, manifest.json, the inputs
 * and both sides' outputs) to --output (default repro.tar).
 */
#include <errno.h>
#include <stdio.h>
#include <string.h>

#include "cli/capctl.h"

/* Asks for the replay; prints which op and which jobs. */
static int ask(struct ctl_client *c, const struct ctl_args *a, const struct ctl_url *base)
{
    struct ctl_url u = *base;
    json_t *body = json_object(), *j = NULL;
    if (ctl_arg(a, "op"))
        json_object_set_new(body, "op", json_string(ctl_arg(a, "op")));
    ctl_url_lit(&u, "/replay");
    int rc = ctl_call(c, "POST", u.buf, body, 202, &j);
    json_decref(body);
    if (rc)
        return rc;
    char b1[64], b2[64];
    fprintf(stderr, "capctl: replaying %s: control job %s, head job %s\n",
            json_string_value(json_object_get(j, "op")),
            ctl_jtext(json_object_get(json_object_get(j, "control"), "job"), b1, sizeof b1),
            ctl_jtext(json_object_get(json_object_get(j, "head"), "job"), b2, sizeof b2));
    json_decref(j);
    return 0;
}

static int write_file(const char *path, const struct ctl_resp *r)
{
    FILE *f = fopen(path, "wb");
    if (!f || fwrite(r->body, 1, r->len, f) != r->len || fclose(f) != 0) {
        fprintf(stderr, "capctl: cannot write %s: %s\n", path, strerror(errno));
        if (f)
            fclose(f);
        return CTL_EXIT_ERROR;
    }
    return 0;
}

static int repro_run(struct ctl_client *c, const struct ctl_args *a, void *ctx)
{
    (void)ctx;
    double wait = -1;
    const char *wt = ctl_arg(a, "wait-timeout");
    const char *out = ctl_arg(a, "output") ? ctl_arg(a, "output") : "repro.tar";
    if (wt && ctl_seconds_arg(a->cmd, "wait-timeout", wt, &wait) != 0)
        return CTL_EXIT_ERROR;
    struct ctl_url u;
    ctl_url_init(&u, "/v1/jobs");
    ctl_url_seg(c, &u, a->pos[0]);
    ctl_url_lit(&u, "/cells");
    ctl_url_seg(c, &u, a->pos[1]);
    if (u.overflow)
        return ctl_usage_error(a->cmd, "the job or cell id is too long");
    int rc = ask(c, a, &u);
    if (rc)
        return rc;
    struct ctl_url report = u;
    ctl_url_lit(&u, "/repro");
    ctl_url_lit(&report, "/replay?format=text");
    struct ctl_resp r = {0}, found = {0};
    /* what the replay found, width by width, once its jobs (the model run
     * and the op alone on the control's inputs) are done */
    rc = ctl_fetch_settled(c, a->cmd, report.buf, wait < 0 ? 3600 : wait, &found);
    if (!rc && fwrite(found.body, 1, found.len, stdout) != found.len)
        rc = CTL_EXIT_ERROR;
    ctl_resp_free(&found);
    if (!rc)
        rc = ctl_fetch_settled(c, a->cmd, u.buf, wait < 0 ? 3600 : wait, &r);
    if (!rc)
        rc = write_file(out, &r);
    if (!rc)
        printf("wrote %s (%zu bytes): tar xf %s && python repro/repro.py\n", out, r.len, out);
    ctl_resp_free(&r);
    return rc;
}

static const struct ctl_opt repro_opts[] = {
    {"op", CTL_VALUE, "OP",
     "the op call to replay (<module>.<call>.<phase>/op.<aten name>.<n>); "
     "default: the cell's first error-introducing op"},
    {"output", CTL_VALUE, "FILE", "where to write the archive (default repro.tar)"},
    CTL_OPT_WAIT_TIMEOUT("while the replay jobs run: "),
    CTL_OPT_END,
};

const struct ctl_cmd ctl_cmd_repro = {
    .name = "repro",
    .usage = "JOB CELL [--op OP] [--output FILE] [--wait-timeout S]",
    .summary = "Replay a diverged cell's op on both builds and write a standalone reproducer.",
    .details =
        "JOB is a head job with a control (its control_commit or its branch's), CELL one\n"
        "of its cells captured at granularity op. capd runs the cell's model once more\n"
        "with each side's build, recording the op's inputs and outputs in full, and\n"
        "packs them with repro.py: run it under any torch to see which side it matches\n"
        "and each side's error against float64. It prints what the replay found at each\n"
        "width the host runs: kernel_changed (at which widths), inherited (from where)\n"
        "or not_reproducible (why).\n\n"
        "exit codes: 0 written, 2 error: no control, no per-op divergence\n"
        "(no_op_divergence), the replay recorded nothing (no_target_records), too large\n"
        "(repro_too_large), timeout, network.\n\n"
        "examples:\n"
        "  capctl repro j7c1f3a9e2b4d c0003\n"
        "  capctl repro j7c1f3a9e2b4d c0003 --op act.0.forward/op.aten::gelu.0 --output gelu.tar",
    .opts = repro_opts,
    .min_pos = 2,
    .max_pos = 2,
    .run = repro_run,
};
