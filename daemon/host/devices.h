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
 * Placement (daemon/host/devplace.c). A GPU cell (options.device "gpu")
 * that times (options.iterations > 0) holds a device alone: it starts only
 * on a device no other cell holds, and nothing joins it there. A
 * numerics-only GPU cell (iterations 0: nothing timed) shares a device
 * with other such cells, of any job, within the device's budget: at most
 * gpu_cells_per_device of them, whose reservations add up to at most
 * gpu_memory_fraction of the device's total_memory_bytes. A shared cell
 * reserves the largest device_peak_bytes an earlier cell of its build,
 * model, width, pass and mode recorded plus DEVICES_CONTEXT_BYTES (what the
 * runtime's context holds beside the tensors), or else an even share, the
 * budget / gpu_cells_per_device. A probe that gives no memory figure
 * leaves only the count. A shared cell whose reservation is above the
 * whole budget takes a device alone, so it never waits forever. Among the
 * devices that can take a cell it goes to the one with the fewest
 * holders, then the most budget left, then the first listed, so cells
 * spread over every device. The scheduler asks devices_room() before it
 * claims, acquires after the claim and releases when the cell ends.
 *
 * Threads: the list is read by HTTP threads (devices_json, devices_count)
 * under the module's lock; everything else runs on the daemon loop.
 */
#ifndef CAPD_DEVICES_H
#define CAPD_DEVICES_H

#include <jansson.h>
#include <stdbool.h>
#include <stdio.h>
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

/* What the runtime's context, its kernels and its libraries' workspaces
 * hold on the device beside the tensors the framework's allocator counts
 * (device_peak_bytes is torch.cuda.max_memory_allocated()): an allowance
 * added to a recorded peak, not a measured figure. */
#define DEVICES_CONTEXT_BYTES (INT64_C(512) << 20)

/* Whether the GPU cell C (storage's store_gpu_cell) could start now: a
 * device can take it (see above), or there is no device at all (such a
 * cell is then failed at once rather than queued forever). */
bool devices_room(struct devices *dv, const struct store_gpu_cell *c);

/*
 * For a claimed cell whose GPU facts are C (NULL for a CPU cell). A CPU
 * cell: *index = -1, returns 0. A GPU cell: takes the device devices_room
 * would pick, puts the child's visibility variables in run->spec as
 * "device_env" (sup.c adds them to the child's environment) and whether it
 * shares the device as "device_share" ("shared" or "alone"), and the
 * device's index in *index. -ENODEV (no device can take it now, or none
 * exists) or -ENOMEM with REASON: the cell must not be started; the
 * scheduler ends it (sup_end_unrun).
 */
int devices_acquire(struct devices *dv, struct store_cell_run *run, const struct store_gpu_cell *c,
                    int *index, char *reason, size_t rlen);
/* Takes cell CELL_ID off device INDEX (INDEX < 0: nothing). */
void devices_release(struct devices *dv, int index, const char *cell_id);

/* Takes device INDEX out of the pool for WHY (a cell's device error: the
 * runtime said the device failed): no cell is placed on it until a probe
 * answers again (POST /v1/devices/refresh). While every device is out,
 * GPU cells fail at once with the reasons rather than wait. */
void devices_fail(struct devices *dv, int index, const char *why);

/* /metrics: capd_gpu_device_holders and capd_gpu_device_failed (with its
 * reason) per device, in Prometheus text; thread-safe. */
void devices_metrics(struct devices *dv, FILE *f);

#endif
