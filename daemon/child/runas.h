/*
 * daemon/child/runas.h - the unprivileged user cells run as when capd itself runs
 * as root (config run_as_user, default "nobody"; ignored when capd is not
 * root). The cell's clone child (daemon/child/spawn.c), or capd-exec for a prefork
 * cell, switches to it (setgroups/setgid/setuid, then PR_SET_NO_NEW_PRIVS)
 * right before exec; these helpers resolve the user and
 * make each cell's scratch directory, and only that, reachable and
 * writable by it. See docs/security.md.
 */
#ifndef CAPD_RUNAS_H
#define CAPD_RUNAS_H

#include <stddef.h>

#include "daemon/config/config.h"

/* Fills c->run_uid/run_gid (-1 when children keep capd's own user).
 * -EINVAL with *err set for an unknown user or one that is uid 0. */
int runas_resolve(struct capd_config *c, char **err);

/* Start-up check: the user can reach DATA/scratch (every ancestor of the
 * data dir searchable by it; the data dir itself is made o+x, never o+r).
 * -EACCES with *err naming the directory that blocks it. Logs the user. */
int runas_check(const struct capd_config *c, char **err);

/* Per cell, before spawning: DATA/scratch is 0711, and the scratch dir and
 * the spec file inside it belong to the user. 0 or -errno with REASON set. */
int runas_prepare_cell(const struct capd_config *c, const char *scratch, const char *spec,
                       char *reason, size_t rlen);

/*
 * Whether the cell user can use PATH as NEED says: an interpreter it may
 * execute (a regular file with an x bit for its class), or a model root it
 * may read (a directory it may list and search). Every ancestor of the
 * resolved path must be searchable by it. The user is run_uid/run_gid
 * when set (capd is root; capd-exec drops supplementary groups, so the
 * mode bits and owners decide, as the kernel does without ACLs), else capd's
 * own user, checked by the kernel (faccessat). 0, or -ENOENT, -ENOTDIR,
 * -EINVAL (not a regular file) or -EACCES with WHY saying which path blocks and what is missing.
 */
enum runas_need { RUNAS_EXEC, RUNAS_DIR };
int runas_can_use(const struct capd_config *c, const char *path, enum runas_need need, char *why,
                  size_t wlen);
/* The cell user in words, e.g. "nobody (uid 65534, gid 65534)". */
void runas_describe(const struct capd_config *c, char *buf, size_t len);

#endif
