/*
 * daemon/attempt/sup.h - the supervisor of one cell attempt: starts the child (by
 * fresh exec, or through capd-exec and the build's prefork zygote),
 * streams its frames into storage, caps its log, enforces its timeout and
 * stores how it ended (daemon/attempt/outcome.h). Runs on the daemon loop only.
 * daemon/attempt/sup_int.h says how sup.c, cellproc.c and cellstart.c share it.
 */
#ifndef CAPD_SUP_H
#define CAPD_SUP_H

#include <stdbool.h>
#include <uv.h>

#include "daemon/config/config.h"
#include "storage/store.h"

struct sup;

/* Called once when the attempt has ended and its outcome is stored; the
 * sup is freed right after the callback returns. */
typedef void (*sup_done_cb)(void *ud, struct sup *s);

/*
 * Starts the cell described by RUN (ownership of its json moves to the sup).
 * On a set-up failure (no interpreter, unwritable data dir...) the cell is
 * finished as failed with the reason and -errno is returned; DONE is not
 * called then.
 */
int sup_start(uv_loop_t *loop, const struct capd_config *cfg, struct store *st,
              struct store_cell_run *run, sup_done_cb done, void *ud, struct sup **out);

/*
 * Takes up again RUN, a remote attempt start-up recovery kept open
 * (store_remote_reattach; SLURM its Slurm job, job 0 for none): its spool
 * is read anew from its first byte and its worker's uploads go on. On
 * failure the cell is finished as failed and -errno returned.
 */
int sup_reattach(uv_loop_t *loop, const struct capd_config *cfg, struct store *st,
                 struct store_cell_run *run, struct store_slurm_job slurm, sup_done_cb done,
                 void *ud, struct sup **out);

/*
 * Asked when the outcome is about to be stored: whether the scheduler will
 * claim another cell once this one is gone, and which GPU cell that claim
 * may take (GPU_SEQ, store_cell_claim_filtered's). If it will, the claim is made in the
 * transaction that stores the outcome (store_cell_finish_claim) and DONE
 * takes the claimed cell with sup_take_next.
 */
typedef bool (*sup_next_cb)(void *ud, struct sup *s, int64_t *gpu_seq);
void sup_set_next_cb(struct sup *s, sup_next_cb cb);
/* The cell claimed with the outcome, if any (ownership moves to NEXT);
 * false, with NEXT zeroed, when none was. */
bool sup_take_next(struct sup *s, struct store_cell_run *next);

/*
 * Ends RUN, a claimed cell that no attempt ran (a width this host cannot
 * run, no GPU for it, a set-up that failed): its outcome O stored, the
 * reason logged as EVENT (info for unsupported, else error), counted in
 * capd_cells_finished_total. With an attempt's own end (daemon/attempt/cellend.c),
 * the one way a cell ends. 0 or what store_cell_finish returned.
 */
int sup_end_unrun(struct store *st, const struct store_cell_run *run, const char *event,
                  const struct store_outcome *o);

/* Stops the cell: SIGTERM to its group, SIGKILL after the grace period.
 * The outcome becomes cancelled. */
void sup_cancel(struct sup *s);

/* Kills the group at once and forgets the attempt without storing an
 * outcome (daemon shutdown: start-up recovery re-queues the cell). */
void sup_abandon(struct sup *s);

const char *sup_job_id(const struct sup *s);
const char *sup_cell_id(const struct sup *s);
/* Why the attempt's GPU failed under it (the runtime said so: outcome.h's
 * device_error), or NULL; set once its outcome is stored. */
const char *sup_device_failed(const struct sup *s);

#endif
