/*
 * daemon/executors/cellremote.h - the remote executors' own state and functions,
 * shared by cellremote.c (executor "remote": the spool, the token, the
 * worker's launch and finish) and cellslurm.c (executor "slurm", built on
 * it with its own launch hooks and state behind LAUNCH), and seen by no
 * other file: the attempt (daemon/attempt/sup_int.h) holds it as S->ex. Loop
 * thread only.
 */
#ifndef CAPD_CELLREMOTE_H
#define CAPD_CELLREMOTE_H

#include "daemon/executors/remote.h"
#include "daemon/attempt/sup_int.h"

/* Polls a deferred attempt waits for its launcher's word (Slurm's final
 * state of the job) on why its worker was stopped from outside. */
#define SUP__DEFER_POLLS 10

struct sup__remote {
    /* its spool table entry and the handle the API wakes the loop with;
     * no pid, pipes or exit watch */
    struct remote_att *remote;
    uv_async_t wake;
    bool running; /* the worker has started: the timeout runs */
    /* The attempt was stopped from outside (the worker got a signal, or
     * the runner a SIGTERM or SIGKILL the worker did not send): the outcome waits
     * for the launcher's word (executor.h knows_why_stopped), at most
     * SUP__DEFER_POLLS polls, then the worker's report. */
    bool deferred;
    bool decided; /* the launcher's word (or the wait's end) was applied */
    struct remote_exit report;
    void *launch; /* the launcher's own state (cellslurm.c), or NULL */
};

/* S's remote state (S->ex). */
static inline struct sup__remote *sup__rem(const struct sup *s)
{
    return (struct sup__remote *)s->ex;
}

/* ---- a remote attempt (cellremote.c) ---- */

/* Starts remote attempt S, whose spec is at SPEC_PATH and environment ENV:
 * its spool, its token, the launcher, the start timeout. 0, or -errno
 * with REASON (S is then the caller's to fail). */
int sup__remote_start(struct sup *s, char *const *env, const char *spec_path, char *reason,
                      size_t rlen);
/* sup_reattach's remote side: the spool reopened, the Slurm job SLURM
 * (job 0: none) polled again, the timeout restarted. */
int sup__remote_reattach(struct sup *s, char *const *env, const char *spec_path,
                         struct store_slurm_job slurm, char *reason, size_t rlen);
/* Ends a deferred attempt with the worker's report, after Slurm's state
 * (applied by the caller) or the wait for it. */
void sup__remote_conclude(struct sup *s);
/* Tells the worker the attempt is over. */
void sup__remote_stop(struct sup *s);
/* The remote executors' stop: sup__remote_stop, whatever SIG. */
void sup__remote_kill(struct sup *s, int sig);
/* Unregisters the attempt and closes its handles (finish_tail's side). */
void sup__remote_close(struct sup *s);
/* The remote executors' release: their state. */
void sup__remote_release(struct sup *s);

#endif
