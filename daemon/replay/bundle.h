/*
 * daemon/replay/bundle.h - the files of a replayed unit's reproducer (an
 * op call, or a module's forward call), from the replay jobs' target
 * records (docs/api.md, "Replay and repro").
 *
 * A bundle is these files, named relative to its folder:
 *
 *   repro.py                      the runner's runner/repro/repro.py
 *   manifest.json                 the unit ("op": its op_call; "module":
 *                                 its module and call), its inputs, the
 *                                 expected outputs, the cell, the width's
 *                                 environment, both builds
 *   inputs/arg.<i>.npy            the control's recorded inputs (an op's
 *                                 arguments, role arg; a module's, input)
 *   expected/<side>.<role>.<i>.npy each side's recorded outputs
 *
 * .npy files are version 1.0, C-contiguous, little-endian (bfloat16 as
 * '<u2' raw bits, named bfloat16 in the manifest). A sink receives each
 * file whole: the API packs them into a ustar archive (repro_tar), the
 * replay step writes them into a folder a cell reads (repro_write_dir).
 * At most MAX bytes in all (the configuration's repro_max_bytes): a larger
 * bundle is -E2BIG, never cut.
 */
#ifndef CAPD_DAEMON_REPLAY_BUNDLE_H
#define CAPD_DAEMON_REPLAY_BUNDLE_H

#include <jansson.h>
#include <stdint.h>

#include "storage/store.h"
#include "util/buf.h"

/* One side of a bundle: a finished replay job (its first cell, the
 * replayed cell's width) and the unit's key its records carry. */
struct repro_side {
    json_t *job;
    const char *target;
};

struct repro_bundle {
    struct store *st;
    const char *runner_dir; /* repro.py is read from <runner_dir>/repro/ */
    struct repro_side ctl;  /* the inputs and the control's outputs */
    struct repro_side head; /* job NULL: a bundle of the control alone */
    uint64_t max_bytes;
    char why[320]; /* the reason of -EINVAL, -EIO */
};

/* The bundle as a ustar archive of folder repro/ into *TAR (initialised
 * here; the caller frees it). 0; -EINVAL (b->why: the records lack what
 * it needs), -E2BIG past b->max_bytes, -EIO (b->why), or another negative
 * errno. */
int repro_tar(struct repro_bundle *b, struct ubuf *tar);

/* The bundle written into DIR (made, mode 0755, files 0644: a cell that
 * runs as another user reads it by name). The same returns. */
int repro_write_dir(struct repro_bundle *b, const char *dir);

#endif
