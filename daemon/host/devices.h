/*
 * daemon/host/devices.h - the GPUs capd may give to cells: discovery through the
 * probe child (capd-gpuinfo, gpu/gpuinfo.c), the device list, and which
 * device each running GPU cell holds.
 *
 * capd never loads a GPU runtime itself (a runtime context holds device
 * memory and does not survive fork). It runs the probe at start-up, before
 * the first cell is scheduled, and again on POST /v1/devices/refresh, and
 * keeps what the probe printed. No GPU is not an error: the list is empty
 * and "reason" says why (the runtime's answer, or what went wrong with the
 * probe).
 *
 * A GPU cell (options.device "gpu") holds one whole device for its
 * lifetime, so timings never share a device; the scheduler asks for a
 * device before it starts the cell and gives it back when the cell ends.
 *
 * Threads: the list is read by HTTP threads (devices_json, devices_count)
 * under the module's lock; everything else runs on the daemon loop.
 */
#ifndef CAPD_DEVICES_H
#define CAPD_DEVICES_H

#include <jansson.h>
#include <stdbool.h>
#include <uv.h>

#include "daemon/config/config.h"
#include "storage/store.h"

#define DEVICES_MAX        64           /* devices kept from one probe */
#define DEVICES_MAX_OUTPUT (256 * 1024) /* bytes of probe output read */

struct devices;

int devices_new(const struct capd_config *cfg, struct devices **out);
/* Kills a probe still running and frees everything. */
void devices_free(struct devices *dv);

/* Start-up: runs the probe to completion on a private loop. The outcome
 * (devices or reason) is kept; only allocation failure is an error. */
int devices_probe_now(struct devices *dv);

/*
 * Runs the probe again on LOOP without waiting (daemon loop only); CHANGED
 * is called on the loop once its answer is kept. A refresh asked for while
 * one runs is run once more after it. A probe that fails (missing, crashed,
 * timed out, unreadable output) keeps the previous good list and reports
 * the failure as "probe_error".
 */
void devices_refresh(struct devices *dv, uv_loop_t *loop, void (*changed)(void *ud), void *ud);

/* Kills a probe in flight and closes its handles (daemon shutdown). */
void devices_stop(struct devices *dv);

/* GET /v1/devices: a new object (docs/gpu.md); thread-safe. */
json_t *devices_json(struct devices *dv);
/* Devices in the current list; thread-safe. */
int devices_count(struct devices *dv);

/* ---- the scheduler's hooks (daemon loop only) ---- */

/* Whether the scheduler may claim a GPU cell now: a device is free, or
 * there is no device at all (such a cell is then failed at once rather
 * than queued forever). */
bool devices_may_claim_gpu(struct devices *dv);

/*
 * For a claimed cell. A CPU cell: *index = -1, returns 0. A GPU cell: takes
 * the lowest free device, puts the child's visibility variables in
 * run->spec as "device_env" (sup.c adds them to the child's environment)
 * and its index in *index. -ENODEV (no device is free, or none exists) or
 * -ENOMEM with REASON: the cell must not be started; the scheduler ends it
 * (sup_end_unrun).
 */
int devices_acquire(struct devices *dv, struct store_cell_run *run, int *index, char *reason,
                    size_t rlen);
/* Gives the device back (INDEX < 0: nothing). */
void devices_release(struct devices *dv, int index);

#endif
