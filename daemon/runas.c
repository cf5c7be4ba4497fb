/*
 * daemon/runas.c - resolving run_as_user and preparing what a cell running
 * as that user must reach. The switch itself happens in capd-exec
 * (daemon/exec_shim.c), after the rlimits and right before exec, so the
 * daemon never changes its own credentials.
 */
#include <errno.h>
#include <limits.h>
#include <pwd.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "daemon/log.h"
#include "daemon/runas.h"

int runas_resolve(struct capd_config *c, char **err)
{
    c->run_uid = c->run_gid = -1;
    if (geteuid() != 0)
        return 0;
    /* Cells as root is never what an empty string should mean by
     * accident: it takes a second, explicit setting. */
    if (c->run_as_user[0] == 0 && !c->allow_root_cells) {
        if (asprintf(err, "run_as_user is \"\" while capd runs as root, so cells would run as "
                          "root; name an unprivileged user (the default is \"nobody\"), or set "
                          "\"allow_root_cells\": true as well to run them as root on purpose "
                          "(docs/security.md)") < 0)
            *err = NULL;
        return -EINVAL;
    }
    if (c->run_as_user[0] == 0)
        return 0;
    struct passwd *pw = getpwnam(c->run_as_user);
    if (!pw) {
        if (asprintf(err,
                     "run_as_user '%s' does not exist (create it, or set run_as_user to \"\" to "
                     "run cells as root, which docs/security.md advises against)",
                     c->run_as_user) < 0)
            *err = NULL;
        return -EINVAL;
    }
    if (pw->pw_uid == 0 || pw->pw_gid == 0) {
        if (asprintf(err,
                     "run_as_user '%s' has uid or gid 0; name an unprivileged user, or \"\" to "
                     "run cells as root on purpose",
                     c->run_as_user) < 0)
            *err = NULL;
        return -EINVAL;
    }
    c->run_uid = (long)pw->pw_uid;
    c->run_gid = (long)pw->pw_gid;
    return 0;
}

/* Whether UID/GID (no supplementary groups: capd-exec drops them) may
 * search directory SB, by the kernel's rule: the owner class is used when
 * the uid owns it, else the group class when the gid matches, else other. */
static bool can_search(const struct stat *sb, long uid, long gid)
{
    if ((long)sb->st_uid == uid)
        return sb->st_mode & S_IXUSR;
    if ((long)sb->st_gid == gid)
        return sb->st_mode & S_IXGRP;
    return sb->st_mode & S_IXOTH;
}

int runas_check(const struct capd_config *c, char **err)
{
    char path[PATH_MAX];
    struct stat sb;
    if (c->run_uid < 0) {
        if (geteuid() == 0) {
            /* Said on stderr too: whoever starts capd by hand sees it. */
            fprintf(stderr, "capd: WARNING: allow_root_cells is set and run_as_user is \"\": "
                            "every cell runs as root\n");
            log_warn("cells_run_as_root", "reason=%s",
                     log_q("allow_root_cells is true and run_as_user is empty: every cell, and "
                           "so every registered build, runs as root"));
        }
        return 0;
    }
    if (!realpath(c->data_dir, path)) {
        if (asprintf(err, "cannot resolve data dir %s: %s", c->data_dir, strerror(errno)) < 0)
            *err = NULL;
        return -errno;
    }
    /* The data dir is capd's own: it gets o+x (search, never list) so the
     * user can reach its scratch dir by name. The database files are
     * created under umask 027 and stay unreadable to it. */
    if (stat(path, &sb) == 0 && !can_search(&sb, c->run_uid, c->run_gid) &&
        chmod(path, (sb.st_mode & 07777) | S_IXOTH) != 0) {
        if (asprintf(err, "cannot make data dir %s searchable: %s", path, strerror(errno)) < 0)
            *err = NULL;
        return -errno;
    }
    /* Its ancestors are not capd's to change: say which one blocks. */
    for (char *slash = strrchr(path, '/'); slash && slash > path; slash = strrchr(path, '/')) {
        *slash = 0;
        if (stat(path, &sb) == 0 && !can_search(&sb, c->run_uid, c->run_gid)) {
            if (asprintf(err,
                         "run_as_user '%s' (uid %ld) cannot reach the data dir: %s is mode %04o "
                         "owned by uid %ld; allow it to be searched (chmod o+x %s), move "
                         "data_dir, or set run_as_user",
                         c->run_as_user, c->run_uid, path, (unsigned)(sb.st_mode & 07777),
                         (long)sb.st_uid, path) < 0)
                *err = NULL;
            return -EACCES;
        }
    }
    log_info("cells_run_as", "user=%s uid=%ld gid=%ld", log_q(c->run_as_user), c->run_uid,
             c->run_gid);
    return 0;
}

int runas_prepare_cell(const struct capd_config *c, const char *scratch, const char *spec,
                       char *reason, size_t rlen)
{
    char root[1100];
    if (c->run_uid < 0)
        return 0;
    snprintf(root, sizeof root, "%s/scratch", c->data_dir);
    if (chmod(root, 0711) != 0 || chown(scratch, (uid_t)c->run_uid, (gid_t)c->run_gid) != 0 ||
        chown(spec, (uid_t)c->run_uid, (gid_t)c->run_gid) != 0) {
        int e = errno;
        snprintf(reason, rlen, "cannot hand the scratch dir %s to run_as_user '%s': %s", scratch,
                 c->run_as_user, strerror(e));
        return -e;
    }
    return 0;
}
