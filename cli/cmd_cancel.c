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

static const struct ctl_opt cancel_opts[] = {
    {"wait", CTL_FLAG, NULL, "wait until every cell has stopped"},
    {"json", CTL_FLAG, NULL, "print the job as JSON"},
    {NULL, CTL_FLAG, NULL, NULL},
};

static const struct ctl_cmd cmd_cancel = {
    "cancel",
    "JOB [--wait] [--json]",
    "Cancel a job: its queued cells end cancelled, its running cells are stopped.",
    "exit codes: 0 cancelled (or being cancelled), 2 error: no such job, the job\n"
    "has already ended (job_finished), not allowed, network.\n\n"
    "examples:\n"
    "  capctl cancel j7c1f3a9e2b4d\n"
    "  capctl cancel j7c1f3a9e2b4d --wait",
    cancel_opts,
    1,
    1,
};

int ctl_cmd_cancel(int argc, char **argv)
{
    struct ctl_args a;
    struct ctl_client c = {0};
    struct ctl_resp r = {0};
    json_t *j = NULL;
    struct ctl_url u;
    int rc = ctl_parse(&cmd_cancel, argc, argv, &a);
    if (rc) {
        rc = rc == 1 ? 0 : rc; /* 1: --help was printed */
        goto out;
    }
    if ((rc = ctl_client_open(&c, &a)) != 0)
        goto out;
    ctl_url_init(&u, "/v1/jobs");
    ctl_url_seg(&c, &u, a.pos[0]);
    ctl_url_lit(&u, "/cancel");
    if (u.overflow) {
        rc = ctl_usage_error(&cmd_cancel, "the job id is too long");
        goto out;
    }
    rc = CTL_EXIT_ERROR;
    if (ctl_request(&c, "POST", u.buf, NULL, NULL, &r) != 0 || r.status != 202) {
        ctl_report(&c, &r);
        goto out;
    }
    if (ctl_has(&a, "wait")) {
        /* The cells were cancelled, not failed: only an error says 2. */
        json_decref(j);
        j = NULL;
        if (ctl_wait_job(&c, a.pos[0], 0, &j) == CTL_EXIT_ERROR)
            goto out;
    } else {
        j = ctl_resp_json(&r);
    }
    if (ctl_has(&a, "json")) {
        ctl_print_json(stdout, j);
    } else {
        char b[64];
        printf("job %s: %s\n", a.pos[0], ctl_jtext(json_object_get(j, "state"), b, sizeof b));
    }
    rc = CTL_EXIT_OK;
out:
    json_decref(j);
    ctl_resp_free(&r);
    ctl_client_close(&c);
    ctl_args_free(&a);
    return rc;
}
