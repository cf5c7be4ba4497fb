/*
 * daemon/runas.h - the unprivileged user cells run as when capd itself runs
 * as root (config run_as_user, default "nobody"; ignored when capd is not
 * root). The cell's clone child (daemon/spawn.c), or capd-exec for a prefork
 * cell, switches to it (setgroups/setgid/setuid, then PR_SET_NO_NEW_PRIVS)
 * right before exec; these helpers resolve the user and
 * make each cell's scratch directory, and only that, reachable and
 * writable by it. See docs/security.md.
 */
#ifndef CAPD_RUNAS_H
#define CAPD_RUNAS_H

#include <stddef.h>

#include "daemon/config.h"

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

#endif
