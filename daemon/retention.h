/*
 * daemon/retention.h - the retention policy on a timer inside capd
 * (config retention_interval_s and retention_keep_heads_per_branch;
 * docs/operations.md). Each run is store_prune() on a libuv thread-pool
 * thread with its own SQLite connection, so the loop never waits on it.
 */
#ifndef CAPD_RETENTION_H
#define CAPD_RETENTION_H

#include <stdint.h>
#include <uv.h>

#include "daemon/config/config.h"
#include "storage/store.h"

struct retention;

/*
 * Starts the timer on LOOP when both settings are non-zero (otherwise
 * returns 0 with *out NULL; out may be NULL). The first run comes after
 * min(interval, 60 s), then every interval. The timer does not keep the
 * loop alive, and it stops by itself on SIGTERM/SIGINT (a run in progress
 * stops between two of its transactions), so starting it is the only hook
 * the daemon needs.
 */
int retention_start(uv_loop_t *loop, const struct capd_config *cfg, struct retention **out);

/* Stops it now (idempotent); its memory goes once a run in flight ends. */
void retention_stop(struct retention *r);

/* Completed runs so far and the last one's report (for tests and metrics);
 * loop thread only. */
unsigned retention_runs(const struct retention *r, struct store_prune_report *last);

#endif
