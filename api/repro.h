/*
 * api/repro.h - a diverged op's replay and its standalone reproducer
 * (api/api_replay.c: the routes; api/check.c: the target_op option's shape;
 * api/replay_report.c: what the replay found).
 *
 * The reproducer archive is an uncompressed POSIX tar (ustar) of one
 * folder, repro/, holding the bundle daemon/replay/bundle.h describes. At
 * most the configuration's repro_max_bytes in all: a larger one is refused
 * out loud (422 repro_too_large, naming the limit), never cut.
 */
#ifndef CAPD_API_REPRO_H
#define CAPD_API_REPRO_H

#include <jansson.h>
#include <microhttpd.h>
#include <stdbool.h>

struct api_req;

/* The longest target_op (and body "op") accepted. */
#define API_TARGET_OP_MAX 512

/* What S names, printable and at most API_TARGET_OP_MAX bytes (api/check.c,
 * with the other checks of a request's words): one op call,
 * "<module>.<call>.<phase>/op.<aten name>.<n>" (phase forward or backward),
 * or one module's forward call, "<module>.<call>.forward"; else none. */
enum api_target { API_TARGET_NONE, API_TARGET_OP, API_TARGET_MODULE };
enum api_target api_target_kind(const char *s);

/* A replay's finished jobs: the control's and the head's (the model run
 * at every width), and the isolated pair (the op alone on the control's
 * recorded arguments under each build at every width), or the reason
 * there is none (the replay step's, daemon/replay/isolate.h). */
struct api_replay_jobs {
    json_t *ctl, *head;
    json_t *ictl, *ihead; /* NULL with refused */
    const char *refused;
};

/* 200 with what the replay jobs J found, width by width, and its
 * conclusion (api/replay_report.c); WIDTH is the replayed cell's own.
 * JSON, or Markdown or text (?format). */
enum MHD_Result api_replay_report(struct api_req *r, const struct api_replay_jobs *j,
                                  const char *width);

#endif
