/*
 * daemon/host/memlimit.h - each cell's resident memory, limited and measured the
 * way service managers and schedulers do it (docs/configuration.md,
 * "Memory"). An address-space cap (rlimit_as_bytes) is not a memory limit:
 * a CUDA-built framework maps gigabytes of libraries and its allocators
 * and thread pools reserve address space they never touch, so that cap is
 * off by default and this module is what keeps a cell within its share.
 *
 * One mechanism serves the whole daemon, chosen once at start
 * (cell_memory_mechanism, "auto" tries them in this order):
 *
 *   cgroup2   capd's own cgroup v2 directory is delegated to it (systemd
 *             Delegate=yes) and offers the memory controller; capd moves
 *             itself into a leaf "daemon" below it, enables memory (and
 *             pids) for a "cells" child, and gives every cell attempt its own
 *             group there with memory.max, memory.swap.max 0 and pids.max.
 *             Run by hand as root, the same subtree is made below the
 *             hierarchy's root instead.
 *   cgroup1   the cgroup v1 memory controller (hosts that mount v2 without
 *             its memory controller and v1 beside it): capd.PID below
 *             capd's own memory cgroup, one group per cell attempt with
 *             memory.limit_in_bytes and memory.memsw.limit_in_bytes.
 *   watchdog  no cgroup capd may use: a 100 ms timer on the loop adds up
 *             the resident memory (/proc/PID/statm) of every process in the
 *             cell's process group and SIGKILLs the group past its limit.
 *
 * A cell's process enters its group before it execs (spawn.c writes "0" to
 * the group's cgroup.procs through mem_cell_procs_fd), so every page the
 * runner touches is charged there; capd-exec (prefork) is moved right
 * after its spawn and moves the zygote's child itself (--cgroup DIR).
 * Under the watchdog a prefork cell is two process groups, capd-exec's and
 * the zygote child's (forked into a session of its own): capd-exec names
 * the child on its rusage pipe and the cell adopts its group
 * (mem_cell_adopt), so both are summed and killed together.
 *
 * A cell killed for memory (memory.events oom_kill, v1 memory.oom_control
 * oom_kill, or the watchdog) ends "oom" with the limit and the peak in its
 * reason; the peak comes from the group (memory.peak, v1
 * memory.max_usage_in_bytes, the watchdog's highest sample) and is never
 * below the process's own ru_maxrss.
 *
 * The limit of a cell is options.memory_max_bytes when the job gives one
 * (validated against cell_memory_max_bytes), else cell_memory_max_bytes,
 * whose default (0, "auto") resolves to MEM_AUTO_NUM/MEM_AUTO_DEN of the
 * host's RAM divided by max_parallel.
 *
 * Conventions: 0 or -errno; loop thread only after mem_init.
 */
#ifndef CAPD_MEMLIMIT_H
#define CAPD_MEMLIMIT_H

#include <jansson.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>
#include <uv.h>

#include "daemon/config/config.h"

/* cell_memory_max_bytes "auto": three quarters of the host's RAM (the
 * rest is for capd, the page cache and the OS) shared by max_parallel. */
#define MEM_AUTO_NUM 3
#define MEM_AUTO_DEN 4
/* No cell limit, per job or configured, may be below this. */
#define MEM_MIN_LIMIT (UINT64_C(16) << 20)
/* The watchdog's sampling period, and how many cells it watches at most
 * (max_parallel's ceiling). */
#define MEM_WATCH_MS    100
#define MEM_WATCH_CELLS 1024

enum mem_mech { MEM_WATCHDOG, MEM_CGROUP1, MEM_CGROUP2 };

/*
 * Chooses the mechanism (cfg->cell_memory_mechanism), prepares capd's
 * subtree, resolves cell_memory_max_bytes 0 to its default and logs both
 * with why. Before any thread starts (cgroup2 moves the whole process).
 * -ENODEV with *err (malloc'd) when a forced cgroup mechanism is not
 * available, -EINVAL for a limit below MEM_MIN_LIMIT.
 */
int mem_init(struct capd_config *cfg, char **err);

/* Starts the watchdog's timer on LOOP (it never keeps the loop alive). */
void mem_start(uv_loop_t *loop);

/* Removes capd's subtree as far as it is empty (shutdown). */
void mem_shutdown(void);

enum mem_mech mem_mechanism(void);
const char *mem_mechanism_name(void);

/* The "memory" part of GET /v1/host: mechanism, why, where, the cell
 * limit, the host's RAM. A new reference. */
json_t *mem_json(void);

struct mem_cell;

/*
 * A group for one cell attempt named NAME (unique among live cells) with
 * LIMIT bytes. On failure WHY says what went wrong and the cell must not
 * start (running it unlimited would hide the failure).
 */
int mem_cell_new(const char *name, uint64_t limit, struct mem_cell **out, char *why, size_t wlen);

/* The group's cgroup.procs opened for writing (O_CLOEXEC), for the child to
 * write "0" to before it execs; -1 under the watchdog. */
int mem_cell_procs_fd(const struct mem_cell *c);
/* The group's directory ("" under the watchdog), for capd-exec --cgroup. */
const char *mem_cell_dir(const struct mem_cell *c);

/* Moves PID into the group (cgroup; a no-op when it is there already) and
 * starts watching its process group (watchdog). */
int mem_cell_attach(struct mem_cell *c, pid_t pid);

/* The process group PGID belongs to the cell too: the prefork zygote's
 * child, which is no descendant of the leader. The watchdog sums and kills
 * it with the leader's; the cgroup mechanisms have it already (capd-exec
 * moved it into the group). -EINVAL for no valid group. */
int mem_cell_adopt(struct mem_cell *c, pid_t pgid);

/* Once the cell's leader has exited, before it is reaped: stops watching
 * and reads what the group saw. Whether anything in it was killed for
 * memory, and its peak (-1 when the mechanism has none). */
void mem_cell_collect(struct mem_cell *c);
bool mem_cell_oom(const struct mem_cell *c);
int64_t mem_cell_peak(const struct mem_cell *c);
uint64_t mem_cell_limit(const struct mem_cell *c);

/* "limit N bytes (X MiB), peak M bytes (Y MiB)" with PEAK (bytes, -1
 * unknown) into BUF: what an oom reason says. */
void mem_cell_describe(const struct mem_cell *c, int64_t peak, char *buf, size_t len);
/* The same of a limit LIM held elsewhere (a remote cell's worker). */
void mem_describe(uint64_t lim, int64_t peak, char *buf, size_t len);

/* Kills whatever is left in the group, removes it (later, when it is not
 * empty yet) and frees C. NULL is fine. */
void mem_cell_free(struct mem_cell *c);

#endif
