/*
 * daemon/prefork/zygote.h - prefork runners, the daemon side (docs/prefork.md).
 *
 * A build registered with "prefork": true gets a zygote: a long-lived
 * `python -m capd_runner.zygote` (started through capd-exec like a cell:
 * own session, parent-death signal, the cells' user, rlimits) that imports
 * the framework once and forks one child per cell. capd binds the zygote's
 * listening socket itself, in DATA/zygote/ (mode 0700), and hands it over
 * as fd 3; each prefork cell is still spawned as capd-exec by the
 * supervisor, with --zygote SOCKET, so the supervisor sees the same frames,
 * logs, exit status and rusage as for a fresh exec.
 *
 * The first zygote of a build that is not yet 'verified' proves that
 * forked captures equal fresh-exec captures hash for hash before serving;
 * the outcome ('verified' or 'refused' with the reason) is stored on the
 * build. A zygote that dies is replaced by the next cell that needs it;
 * one idle for 10 minutes exits on its own. Loop thread only.
 */
#ifndef CAPD_ZYGOTE_H
#define CAPD_ZYGOTE_H

#include <jansson.h>
#include <stddef.h>
#include <uv.h>

#include "daemon/config/config.h"
#include "storage/store.h"

/* At most this many zygotes live at once (each holds an imported framework,
 * a few hundred MB); cells of further builds run by fresh exec. */
#define ZYG_MAX 4

void zyg_init(uv_loop_t *loop, const struct capd_config *cfg, struct store *st);

/*
 * For a cell about to be spawned with environment ENV: when BUILD (the
 * store_cell_run's build: name, python, prefork, prefork_state, rev) opted
 * into prefork and was not refused, and SPEC (the run's spec) is a CPU
 * cell (GPU cells always run by fresh exec), makes sure a zygote for this build and
 * this environment (less the per-cell variables: spec path, HOME, the
 * width variables) runs, and writes its socket path to PATH. 0 then;
 * -ENOENT when the cell runs by fresh exec (no prefork, refused, no room,
 * or the zygote could not be set up: logged).
 */
int zyg_for_cell(const json_t *build, const json_t *spec, char *const *env, char *path, size_t len);

/*
 * The same for a paired cell's timing template of BUILD (daemon/
 * reference.h), whether or not BUILD opted into prefork: a build without
 * it gets a zygote that serves timing templates only (never a cell, never
 * a verification, and nothing of it is stored on the build), so that a
 * template costs a fork where it would cost an interpreter start and an
 * import of the framework. Unverified, it imports the framework in the
 * cell's whole environment, width variables included (one per build,
 * width and environment): what a build's start-up code reads of them is
 * what a fresh template's would. A prefork build's templates use its
 * zygote.
 */
int zyg_for_timing(const json_t *build, const json_t *spec, char *const *env, char *path,
                   size_t len);

/* Kills every zygote and closes their handles (daemon shutdown; the loop
 * must run once more for the closes). Their children die with them. */
void zyg_shutdown(void);

#endif
