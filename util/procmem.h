/*
 * util/procmem.h - the resident memory of process groups, from /proc: what
 * a memory watchdog samples where no cgroup limits a cell (capd's own,
 * daemon/host/memwatch.c, and capd-cell's on a remote worker).
 *
 * One walk of /proc serves every group asked: each process's group comes
 * from /proc/PID/stat, and the resident pages of those in an asked group
 * from /proc/PID/statm (anonymous, file and shared pages together, as the
 * kernel's RSS counts them; /proc/PID/smaps_rollup would say the same at
 * many times the cost). A process that exits during the walk counts 0.
 */
#ifndef CAPD_UTIL_PROCMEM_H
#define CAPD_UTIL_PROCMEM_H

#include <stdint.h>
#include <sys/types.h>

/* Adds to SUM[i] the resident bytes of every process in group PGIDS[i]
 * (a pgid of 0 or less matches no process). */
void util_pgrp_rss_sum(const pid_t *pgids, int n, int64_t *sum);

/* The resident bytes of process group PGID. */
int64_t util_pgrp_rss(pid_t pgid);

#endif
