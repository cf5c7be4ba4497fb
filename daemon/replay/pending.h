/*
 * daemon/replay/pending.h - the loop the two replay steps share: the
 * automatic replay (auto.h, replay_auto_step) and the isolated pair
 * (isolate.h, replay_step) each take the ids of the jobs waiting for them
 * from the store and do their step on each one.
 */
#ifndef CAPD_DAEMON_REPLAY_PENDING_H
#define CAPD_DAEMON_REPLAY_PENDING_H

#include <jansson.h>
#include <stdbool.h>

#include "daemon/config/config.h"
#include "storage/store.h"

/* The ids of the jobs waiting for a step, as the array *IDS (owned by the
 * caller): store_replays_auto_pending or store_replays_pending. 0, else a
 * negative errno. */
typedef int (*replay_pending_fn)(struct store *st, json_t **ids);

/* A step on job ID; true when it created jobs. */
typedef bool (*replay_one_fn)(struct store *st, const struct capd_config *cfg, const char *id);

/* Calls ONE on each id PENDING gives, in its order; true when a call
 * created jobs (the caller then runs the scheduler). False, calling
 * nothing, when PENDING fails. */
bool replay_each_pending(struct store *st, const struct capd_config *cfg, replay_pending_fn pending,
                         replay_one_fn one);

#endif
