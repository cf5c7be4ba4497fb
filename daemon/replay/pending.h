/*
 * daemon/replay/pending.h - the loop the replay steps share: the
 * automatic replay (auto.h, replay_auto_step), the isolated pair
 * (isolate.h, replay_step) and the compiler bisection (compiler.h,
 * compiler_bisect_step) each take the ids of the jobs waiting for them
 * from the store and do their step on each one. The automatic replay and
 * the compiler bisection look at each job and label it with what came of
 * it, the same way (struct replay_looker).
 */
#ifndef CAPD_DAEMON_REPLAY_PENDING_H
#define CAPD_DAEMON_REPLAY_PENDING_H

#include <jansson.h>
#include <stdbool.h>
#include <stddef.h>

#include "daemon/config/config.h"
#include "storage/store.h"

/* The ids of the jobs waiting for a step, as the array *IDS (owned by the
 * caller): store_replays_auto_pending, store_replays_pending or
 * store_compiler_bisect_pending. 0, else a negative errno. */
typedef int (*replay_pending_fn)(struct store *st, json_t **ids);

/* A step on job ID, with the step's ARG; true when it created jobs. */
typedef bool (*replay_one_fn)(struct store *st, const struct capd_config *cfg, const char *id,
                              const void *arg);

/* Calls ONE with ARG on each id PENDING gives, in its order; true when a
 * call created jobs (the caller then runs the scheduler). False, calling
 * nothing, when PENDING fails. */
bool replay_each_pending(struct store *st, const struct capd_config *cfg, replay_pending_fn pending,
                         replay_one_fn one, const void *arg);

/* A step that looks at each job PENDING gives and labels it. LOOK writes
 * into LABEL (LEN bytes) what came of job ID and returns 0; or 1, or
 * -EAGAIN (the queue is full), to look at the job again at a later pass;
 * or another negative errno, which the label then gives ("refused: why").
 * The label goes to the job's label KEY and to a log line named KEY; one
 * that starts with CREATED says the look created jobs. */
struct replay_looker {
    const char *key, *created;
    replay_pending_fn pending;
    int (*look)(struct store *st, const struct capd_config *cfg, const char *id, char *label,
                size_t len);
};

/* Runs looker K over its pending jobs; true when a look created jobs. */
bool replay_look_pending(struct store *st, const struct capd_config *cfg,
                         const struct replay_looker *k);

#endif
