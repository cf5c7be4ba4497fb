/*
 * api/repro.h - a diverged op's replay and its standalone reproducer
 * (api/api_replay.c: the routes; api/check.c: the target_op option's shape;
 * api/repro_archive.c: the archive).
 *
 * The archive is an uncompressed POSIX tar (ustar) of one folder, repro/:
 *
 *   repro/repro.py                      the runner's runner/repro/repro.py
 *   repro/manifest.json                 the op call, its arguments, the
 *                                       expected outputs, the cell, the
 *                                       width's environment, both builds
 *   repro/inputs/arg.<i>.npy            the control's recorded inputs
 *   repro/expected/<side>.<role>.<i>.npy each side's recorded outputs
 *
 * .npy files are version 1.0, C-contiguous, little-endian (bfloat16 as
 * '<u2' raw bits, named bfloat16 in the manifest). At most the
 * configuration's repro_max_bytes in all: a larger one is refused out loud
 * (422 repro_too_large, naming the limit), never cut.
 */
#ifndef CAPD_API_REPRO_H
#define CAPD_API_REPRO_H

#include <jansson.h>
#include <microhttpd.h>
#include <stdbool.h>

struct api_req;

/* The longest target_op (and body "op") accepted. */
#define API_TARGET_OP_MAX 512

/* Whether S names one op call: "<module>.<call>.<phase>/op.<aten name>.<n>",
 * phase forward or backward, printable, at most API_TARGET_OP_MAX bytes
 * (api/check.c, with the other checks of a request's words). */
bool api_target_op_valid(const char *s);

/* 200 with what the control's and the head's finished replay jobs CTL and
 * HEAD found, width by width, and its conclusion (api/replay_report.c);
 * WIDTH is the replayed cell's own. JSON, or Markdown or text (?format). */
enum MHD_Result api_replay_report(struct api_req *r, json_t *ctl, json_t *head, const char *width);

/* 200 with the reproducer of the control's and the head's finished replay
 * jobs CTL and HEAD (one cell each), or the error that says why there is
 * none (422 no_target_records, 422 repro_too_large, 500). */
enum MHD_Result api_repro_reply(struct api_req *r, json_t *ctl, json_t *head);

#endif
