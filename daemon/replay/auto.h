/*
 * daemon/replay/auto.h - replays asked for and replays capd starts itself
 * (docs/api.md, "Replay and repro").
 *
 * A replay of a head job's cell replays one unit: an op call
 * ("<module>.<call>.<phase>/op.<aten name>.<n>") or, where the cell's
 * divergence names no op (a job at granularity module), the forward call
 * of the module it names ("<module>.<call>.forward"). It is two jobs (the
 * model run): the cell's model and pass at the cell's width and at every
 * other width this host runs (native aside), once with the control job's
 * build at its commit and once with the head's, with the job's options
 * plus target_op naming the unit (and granularity op for an op call),
 * iterations and warmup 0. Their labels say what
 * they replay (replay_of "<job>/<cell>", replay_side control|head,
 * replay_op); each is created under the idempotency key
 * "replay:<job>/<cell>:<side>" with the op as its body hash, so asking
 * again, by the API or by the step below, answers the same jobs and
 * another unit is -EEXIST. The replay step (isolate.h) then runs the unit
 * alone on the control's inputs.
 *
 * replay_auto_step starts replays by itself: for every finished head job
 * whose option replay is not off (auto, the default, or always) and that has not been looked at (no
 * label replay_auto), once its control job (control_commit, else its branch's) has finished, it
 * compares the two on the loop thread, at the head's reference and
 * tolerances, and replays the cells that have a unit to replay
 * (replay_unit_of): the first REPLAY_AUTO_CELLS in the comparison's order
 * under auto, every one under always; a unit of the forward pass once per
 * model and width (a backward cell whose error came in during its forward
 * pass replays what the forward cell does). The head job's label replay_auto
 * then says what it did: "replayed N", "nothing to replay", "no control
 * job", or "refused: why".
 */
#ifndef CAPD_DAEMON_REPLAY_AUTO_H
#define CAPD_DAEMON_REPLAY_AUTO_H

#include <jansson.h>
#include <stdbool.h>

#include "daemon/config/config.h"
#include "storage/store.h"

/* The cells option replay auto replays in one job, at most. */
#define REPLAY_AUTO_CELLS 4

/* The longest unit a replay names (target_op's limit). */
#define REPLAY_OP_MAX 512

/* The unit to replay of a compared cell CELL (a comparison's cell result)
 * into OUT: the op of its first_introduced row, else of its
 * first_divergence's; else, where neither is a per-op record, the forward
 * call of the module of its first_introduced row, else of its
 * first_divergence's, when that row is of the forward phase. False when
 * there is none (no divergence, or one first seen in the backward pass of
 * a job at granularity module) and for a compiled cell (mode other than
 * eager), which is not replayed. */
bool replay_unit_of(json_t *cell, char *out, size_t n);

/* What one replay asks: the control and head jobs (as store_job_get gives
 * them), the head's cell (its id, model, width and pass) and the unit; the
 * asking token (NULL: capd itself) and its queue quota (0: none). */
struct replay_ask {
    json_t *ctl, *head, *cell;
    const char *op;
    const char *token_id;
    int max_queued_per_token;
};

/* Creates (or finds) the two replay jobs of A into JOBS[0] (control) and
 * JOBS[1] (head). 0; -EEXIST when the cell's replay names another unit;
 * -EAGAIN past max_queued_jobs, -EDQUOT past the token's quota; another
 * negative errno. */
int replay_submit(struct store *st, const struct capd_config *cfg, const struct replay_ask *a,
                  json_t *jobs[2]);

/* The comparison options a job's options ask for (its reference and its
 * compare overrides) into O, as GET /v1/compare takes them; 0, or the
 * overrides' negative errno (O then holds the defaults and reference). */
struct cmp_options;
int replay_cmp_options(json_t *job, struct cmp_options *o);

/* Looks at every finished head job the option replay asks it to; true
 * when it created jobs (the caller then runs the scheduler). */
bool replay_auto_step(struct store *st, const struct capd_config *cfg);

#endif
