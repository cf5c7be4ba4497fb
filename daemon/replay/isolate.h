/*
 * daemon/replay/isolate.h - the replay step: the op alone on the control's
 * recorded arguments (docs/api.md, "Replay and repro").
 *
 * A replay (api/api_replay.c) runs the cell's model once per build at
 * every width with the target op recorded in full. Once the control's
 * replay job has finished, replay_step writes the op's recorded arguments
 * (daemon/replay/bundle.h, the control's side alone) into
 * <data_dir>/replays/<control replay job>/ and submits the isolated pair:
 * one job per build (the replay jobs' commit, build and widths; pass
 * forward; labels replay_side control_isolated and head_isolated) with
 * options target_inputs naming that folder, target_op naming the op model's
 * one call (model.0.forward/op.<aten name>.0: docs/runner.md, "Op replay on
 * recorded inputs") and reference float64. The runner then runs that op
 * alone on those arguments, at each width in a process of its own, beside a
 * float64 evaluation of it.
 *
 * The control's replay job's label replay_isolated says how the step went:
 * "submitted", or "refused: <why>" (no full records of the op's arguments,
 * larger than repro_max_bytes, the job cancelled), which the report shows.
 * Everything is written before it is acted on and the jobs are created
 * under idempotency keys ("replay:<job>/<cell>:<side>_isolated"), so the
 * loop may call it at any time and a restarted capd carries on.
 */
#ifndef CAPD_DAEMON_REPLAY_ISOLATE_H
#define CAPD_DAEMON_REPLAY_ISOLATE_H

#include <stdbool.h>

#include "daemon/config/config.h"
#include "storage/store.h"

/* Prepares every finished control replay job not yet prepared; true when
 * it created jobs (the caller then runs the scheduler). */
bool replay_step(struct store *st, const struct capd_config *cfg);

#endif
