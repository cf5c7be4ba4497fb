/*
 * daemon/config/executor.h - where a cell attempt's process runs. The attempt
 * (daemon/attempt/sup.c, daemon/attempt/cellend.c) owns its lifecycle: set-up, frames,
 * log, outcome, end. It asks the executor for what only the executor
 * knows through one table row, struct executor, and never by its name.
 *
 *   row      file          a cell runs
 *   local    cellstart.c   as a child of capd: fresh exec, or forked by
 *                          its build's prefork zygote (the start-up
 *                          backends of cellstart.c), on capd's CPUs,
 *                          GPUs and memory groups, as the cell user
 *   remote   cellremote.c  on a worker's host: remote_launch starts
 *                          capd-cell, which fetches the spec and uploads
 *                          frames, log and finish over the API
 *   slurm    cellslurm.c   remote, its worker an sbatch job array task
 *                          whose state capd polls (on top of remote: its
 *                          row is remote's with the launch hooks of Slurm)
 *
 * Each executor keeps its own state behind its operations; the attempt
 * calls them only through S->exec. A new executor is one file with its
 * row and one line in executor.c's table (HACKING.md, "A new executor").
 * Loop thread only.
 */
#ifndef CAPD_EXECUTOR_H
#define CAPD_EXECUTOR_H

#include <stdbool.h>
#include <stddef.h>

#include "storage/store.h"

struct capd_config;
struct sup;

struct executor {
    const char *name; /* config's "executor" */
    /* Its cells run on capd's host: capd's CPU sets, GPU devices, memory
     * groups and cell user apply to them. Otherwise a worker's host holds
     * the cell to the job's own memory limit (capd-cell's watchdog). */
    bool on_host;
    /* capd refuses a width its own CPU lacks (daemon/cpu/widths.h); false
     * where the executor's scheduler places the cell on a host that has
     * it (Slurm's node features). */
    bool host_widths;

    /* A config problem of this executor, or NULL (config.c asks). */
    const char *(*config_problem)(const struct capd_config *cfg);

    /* Starts attempt S, its spec at SPEC_PATH, its environment ENV. 0: it
     * runs. -errno with REASON: nothing runs, S is the caller's to fail.
     * -errno with S->finished set: the executor ended the attempt itself
     * (stored as failed), and S goes once its handles have closed. */
    int (*start)(struct sup *s, char *const *env, const char *spec_path, char *reason, size_t rlen);
    /* Takes up again attempt S that a stopped capd left running (its
     * Slurm job JOB, job 0 for none); same returns as start. NULL: an
     * executor whose attempts end with capd (start-up recovery requeues
     * them). */
    int (*reattach)(struct sup *s, char *const *env, const char *spec_path,
                    struct store_slurm_job job, char *reason, size_t rlen);
    /* Signal SIG to the cell (SIGTERM first, SIGKILL after the grace). */
    void (*stop)(struct sup *s, int sig);
    /* The attempt has ended: its own handles close (its last close frees
     * S: sup__close_handle). */
    void (*close)(struct sup *s);
    /* What it holds outside the loop, let go right before S is freed. */
    void (*release)(struct sup *s);
    /* capd stops: what outlives the attempts (launchers) lets go. */
    void (*shutdown)(void);

    /* The remote family (cellremote.c): how the worker is started with
     * capd's URL and the attempt's TOKEN (0, or -errno with WHY). */
    int (*launch)(struct sup *s, const char *url, const char *token, char *why, size_t wlen);
    /* Its launch taken up again after a restart (JOB), stopped, forgotten. */
    void (*launch_adopt)(struct sup *s, struct store_slurm_job job);
    void (*launch_stop)(struct sup *s);
    void (*launch_forget)(struct sup *s);
    /* The worker was stopped from outside capd: whether the launcher's
     * scheduler can say why (the outcome then waits for its word). */
    bool (*knows_why_stopped)(const struct sup *s);
};

/* The executor named NAME, or NULL. */
const struct executor *executor_find(const char *name);

/* The names, quoted and joined ("\"local\", \"remote\" or \"slurm\"") for
 * an error message, into OUT. */
void executor_names(char *out, size_t n);

#endif
