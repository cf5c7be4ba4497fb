/*
 * daemon/replay/compiler.h - compiler bisection follow-ups (docs/api.md,
 * "Compiled cells"): a compiled cell that departs from its job's eager cell
 * is followed by a job that runs Inductor's compiler bisector over the
 * cell's model and pass.
 *
 * compiler_bisect_step looks at every finished job whose option
 * compiler_bisect is auto (the default) and that it has not looked at (no
 * label compiler_bisect_auto). It compares each compiled mode of the job
 * with the job's eager cells as the mode self-check does (GET
 * /v1/jobs/{id}/modes: cross-mode, the job's reference arbiter and
 * tolerances, no perf), and follows each diverged compiled cell, the first
 * COMPILER_BISECT_CELLS in the job's order, with a job of that one cell:
 * the same project, commit, build, model, width, pass and mode, the job's
 * options with compiler_bisect run (the runner bisects instead of
 * capturing: docs/runner.md), iterations and warmup 0, replay off. Its
 * labels: compiler_bisect_of "<job>/<cell>", and replay_of the same (a
 * follow-up job stands for no commit: storage/jobs.c), under the
 * idempotency key "compiler_bisect:<job>/<cell>". The job's label
 * compiler_bisect_auto then says what it did: "bisecting N", "nothing
 * diverged", "no compiled mode", "no eager cell", or "refused: why".
 */
#ifndef CAPD_DAEMON_REPLAY_COMPILER_H
#define CAPD_DAEMON_REPLAY_COMPILER_H

#include <stdbool.h>

#include "daemon/config/config.h"
#include "storage/store.h"

/* The compiled cells one job follows with a bisection, at most. */
#define COMPILER_BISECT_CELLS 4

/* Looks at every finished job the option compiler_bisect asks it to; true
 * when it created jobs (the caller then runs the scheduler). */
bool compiler_bisect_step(struct store *st, const struct capd_config *cfg);

#endif
