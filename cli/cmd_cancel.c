/*
 * cli/cmd_cancel.c - capctl cancel: POST /v1/jobs/{id}/cancel.
 *
 * Queued cells end cancelled at once; running ones are stopped (SIGTERM,
 * then SIGKILL to the group after kill_grace_ms) and end cancelled when
 * their child is gone. The command returns once capd has accepted the
 * cancellation (202); --wait also waits for the job to end.
 */
#include <stdio.h>
#include <string.h>

#include "cli/capctl.h"

/* POST the cancellation; with --wait, the job once every cell has stopped
 * is what gets printed. */
static int cancel_run(struct ctl_client *c, const struct ctl_args *a, void *ctx)
{
    (void)ctx;
    json_t *j = NULL;
    struct ctl_url u;
    ctl_url_init(&u, "/v1/jobs");
    ctl_url_seg(c, &u, a->pos[0]);
    ctl_url_lit(&u, "/cancel");
    if (u.overflow)
        return ctl_usage_error(a->cmd, "the job id is too long");
    int rc = CTL_EXIT_ERROR;
    if (ctl_call(c, "POST", u.buf, NULL, 202, &j) != 0)
        goto out;
    /* The cells were cancelled, not failed: only an error says 2. */
    if (ctl_has(a, "wait")) {
        json_decref(j);
        if (ctl_wait_job(c, a->pos[0], 0, &j) == CTL_EXIT_ERROR)
            goto out;
    }
    if (ctl_has(a, "json")) {
        ctl_print_json(stdout, j);
    } else {
        char b[64];
        printf("job %s: %s\n", a->pos[0], ctl_jtext(json_object_get(j, "state"), b, sizeof b));
    }
    rc = CTL_EXIT_OK;
out:
    json_decref(j);
    return rc;
}

static const struct ctl_opt cancel_opts[] = {
    CTL_OPT_WAIT("wait until every cell has stopped"),
    CTL_OPT_JSON_HELP("print the job as JSON"),
    CTL_OPT_END,
};

const struct ctl_cmd ctl_cmd_cancel = {
    .name = "cancel",
    .usage = "JOB [--wait] [--json]",
    .summary = "Cancel a job: its queued cells end cancelled, its running cells are stopped.",
    .details = "exit codes: 0 cancelled (or being cancelled), 2 error: no such job, the job\n"
               "has already ended (job_finished), not allowed, network.\n\n"
               "examples:\n"
               "  capctl cancel j7c1f3a9e2b4d\n"
               "  capctl cancel j7c1f3a9e2b4d --wait",
    .opts = cancel_opts,
    .min_pos = 1,
    .max_pos = 1,
    .run = cancel_run,
};
