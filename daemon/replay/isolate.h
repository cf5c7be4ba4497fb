/*
 * daemon/replay/isolate.h - the replay step: the unit (an op call, or a
 * module's forward call) alone on the control's recorded inputs
 * (docs/api.md, "Replay and repro").
 *
 * A replay (api/api_replay.c) runs the cell's model once per build at
 * every width with the target unit recorded in full. Once the control's
 * replay job has finished, replay_step writes the unit's recorded inputs
 * (daemon/replay/bundle.h, the control's side alone) into
 * <data_dir>/replays/<control replay job>/ and submits the isolated pair:
 * one job per build (the replay jobs' commit, build and widths; pass
 * forward; labels replay_side control_isolated and head_isolated) with
 * options target_inputs naming that folder, reference float64 and
 * target_op naming the unit in the isolated cells: for an op call the op
 * model's one call (model.0.forward/op.<aten name>.0: docs/runner.md, "Op
 * replay on recorded inputs"), the runner running that op alone on the
 * recorded arguments; for a module call the same call of the cell's own
 * model, whose module the runner hands the recorded inputs instead of its
 * own. Each width runs in a process of its own, beside a float64
 * evaluation.
 *
 * The control's replay job's label replay_isolated says how the step went:
 * "submitted", or "refused: <why>" (no full records of the unit's inputs,
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
