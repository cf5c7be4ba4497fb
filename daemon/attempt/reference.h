/*
 * daemon/attempt/reference.h - the control build a head cell times its own build
 * against, interleaved (docs/compare.md, "Paired timing").
 *
 * A head job's control is its control_commit or, without one, its branch's
 * (PUT /v1/branches/{name}), resolved like GET /v1/commits/{sha}/diff does:
 * the newest finished job of that commit. Its build is the reference when
 * it is still registered as the control job ran it (not replaced by a PUT
 * since the control job was submitted), its interpreter is executable and
 * the cell's width runs on this host. The head cell's spec then carries
 * "reference": {build, job, commit, python, model_roots, env, zygote?,
 * head}, env being exactly what a cell of the control build would get
 * (daemon/child/cellenv.h), and head the same {python, model_roots, env,
 * zygote?} for the head's own build: the runner starts both sides' timing
 * templates the same way, so identical builds time identical processes,
 * alternates their timing processes and marks the control's "reference":
 * true in their timing frames.
 */
#ifndef CAPD_REFERENCE_H
#define CAPD_REFERENCE_H

#include <jansson.h>
#include <stddef.h>

#include "daemon/config/config.h"
#include "storage/store.h"

/*
 * The reference object for the cell RUN, or NULL with WHY saying why there
 * is none ("no control", "build 'x' was replaced after the control job
 * ...", ...). SCRATCH and SPEC_PATH are the head cell's.
 */
json_t *ref_for_cell(const struct capd_config *cfg, struct store *st,
                     const struct store_cell_run *run, const char *scratch, const char *spec_path,
                     char *why, size_t wlen);

/* Sets SPEC's "reference" from ref_for_cell for a timing cell whose job
 * asks for pairs (options.timing_pairs > 0, iterations > 0); logs why
 * not otherwise. */
void ref_add_to_spec(const struct capd_config *cfg, struct store *st,
                     const struct store_cell_run *run, json_t *spec, const char *scratch,
                     const char *spec_path);

#endif
