/*
 * daemon/child/runas.c - resolving run_as_user and preparing what a cell running
 * as that user must reach. The switch itself happens in capd-exec
 * (daemon/prefork/exec_shim.c), after the rlimits and right before exec, so the
 * daemon never changes its own credentials.
 */
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <pwd.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "util/log.h"
#include "daemon/child/runas.h"
#include "storage/layout.h"
#include "util/err.h"

int runas_resolve(struct capd_config *c, char **err)
{
    c->run_uid = c->run_gid = -1;
    if (geteuid() != 0)
        return 0;
    /* Cells as root is never what an empty string should mean by
     * accident: it takes a second, explicit setting. */
    if (c->run_as_user[0] == 0 && !c->allow_root_cells)
        return util_errf(err, -EINVAL,
                         "run_as_user is \"\" while capd runs as root, so cells would run as "
                         "root; name an unprivileged user (the default is \"nobody\"), or set "
                         "\"allow_root_cells\": true as well to run them as root on purpose "
                         "(docs/security.md)");
    if (c->run_as_user[0] == 0)
        return 0;
    struct passwd *pw = getpwnam(c->run_as_user);
    if (!pw)
        return util_errf(
            err, -EINVAL,
            "run_as_user '%s' does not exist (create it, or set run_as_user to \"\" to "
            "run cells as root, which docs/security.md advises against)",
            c->run_as_user);
    if (pw->pw_uid == 0 || pw->pw_gid == 0)
        return util_errf(err, -EINVAL,
                         "run_as_user '%s' has uid or gid 0; name an unprivileged user, or \"\" to "
                         "run cells as root on purpose",
                         c->run_as_user);
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
    if (!realpath(c->data_dir, path))
        return util_errf(err, -errno, "cannot resolve data dir %s: %s", c->data_dir,
                         strerror(errno));
    /* The data dir is capd's own: it gets o+x (search, never list) so the
     * user can reach its scratch dir by name. The database files are
     * created under umask 027 and stay unreadable to it. */
    if (stat(path, &sb) == 0 && !can_search(&sb, c->run_uid, c->run_gid) &&
        chmod(path, (sb.st_mode & 07777) | S_IXOTH) != 0)
        return util_errf(err, -errno, "cannot make data dir %s searchable: %s", path,
                         strerror(errno));
    /* Its ancestors are not capd's to change: say which one blocks. */
    for (char *slash = strrchr(path, '/'); slash && slash > path; slash = strrchr(path, '/')) {
        *slash = 0;
        if (stat(path, &sb) == 0 && !can_search(&sb, c->run_uid, c->run_gid))
            return util_errf(
                err, -EACCES,
                "run_as_user '%s' (uid %ld) cannot reach the data dir: %s is mode %04o "
                "owned by uid %ld; allow it to be searched (chmod o+x %s), move "
                "data_dir, or set run_as_user",
                c->run_as_user, c->run_uid, path, (unsigned)(sb.st_mode & 07777), (long)sb.st_uid,
                path);
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
    layout_dir(root, sizeof root, c->data_dir, "scratch");
    if (chmod(root, 0711) != 0 || chown(scratch, (uid_t)c->run_uid, (gid_t)c->run_gid) != 0 ||
        chown(spec, (uid_t)c->run_uid, (gid_t)c->run_gid) != 0) {
        int e = errno;
        snprintf(reason, rlen, "cannot hand the scratch dir %s to run_as_user '%s': %s", scratch,
                 c->run_as_user, strerror(e));
        return -e;
    }
    return 0;
}

void runas_describe(const struct capd_config *c, char *buf, size_t len)
{
    if (c->run_uid >= 0) {
        snprintf(buf, len, "%s (uid %ld, gid %ld)", c->run_as_user, c->run_uid, c->run_gid);
        return;
    }
    struct passwd *pw = getpwuid(geteuid());
    snprintf(buf, len, "%s (uid %ld, gid %ld; capd's own user)", pw ? pw->pw_name : "?",
             (long)geteuid(), (long)getegid());
}

/* The class bits of SB that apply to UID/GID: 4 read, 2 write, 1 x. */
static unsigned class_bits(const struct stat *sb, long uid, long gid)
{
    if ((long)sb->st_uid == uid)
        return (sb->st_mode >> 6) & 7;
    if ((long)sb->st_gid == gid)
        return (sb->st_mode >> 3) & 7;
    return sb->st_mode & 7;
}

/* Whether the cell user has every bit of WANT on P (stat SB). */
static bool user_may(const struct capd_config *c, const char *p, const struct stat *sb,
                     unsigned want)
{
    if (c->run_uid < 0) {
        int mode = (want & 4 ? R_OK : 0) | (want & 1 ? X_OK : 0);
        return faccessat(AT_FDCWD, p, mode, AT_EACCESS) == 0;
    }
    return (class_bits(sb, c->run_uid, c->run_gid) & want) == want;
}

static int blocked(const struct capd_config *c, char *why, size_t wlen, const char *path,
                   const char *at, const struct stat *sb, const char *what)
{
    char who[160];
    runas_describe(c, who, sizeof who);
    snprintf(why, wlen,
             "%s: %s is mode %04o owned by uid %ld gid %ld, so the cell user %s cannot %s it", path,
             at, (unsigned)(sb->st_mode & 07777), (long)sb->st_uid, (long)sb->st_gid, who, what);
    return -EACCES;
}

/* Each ancestor of REAL (an absolute path), from / down, must let the
 * cell user search it: 0, or -EACCES with WHY naming the first that does
 * not. */
static int ancestors_blocked(const struct capd_config *c, const char *path, const char *real,
                             char *why, size_t wlen)
{
    char at[PATH_MAX];
    for (const char *slash = real; slash; slash = strchr(slash + 1, '/')) {
        size_t n = (size_t)(slash - real);
        struct stat ab;
        snprintf(at, sizeof at, "%.*s", n ? (int)n : 1, n ? real : "/");
        if (stat(at, &ab) != 0) {
            snprintf(why, wlen, "%s: cannot stat %s: %s", path, at, strerror(errno));
            return -EACCES;
        }
        if (!user_may(c, at, &ab, 1))
            return blocked(c, why, wlen, path, at, &ab, "search");
    }
    return 0;
}

int runas_can_use(const struct capd_config *c, const char *path, enum runas_need need, char *why,
                  size_t wlen)
{
    char real[PATH_MAX];
    struct stat sb;
    if (!realpath(path, real) || stat(real, &sb) != 0) {
        int e = errno;
        /* A directory capd's own user cannot search hides the rest (capd
         * runs cells as itself): name it as the cell user sees it. */
        if (e == EACCES && path[0] == '/' && ancestors_blocked(c, path, path, why, wlen) != 0)
            return -EACCES;
        snprintf(why, wlen, "%s: %s", path, e == ENOENT ? "does not exist" : strerror(e));
        return -e;
    }
    int rc = ancestors_blocked(c, path, real, why, wlen);
    if (rc != 0)
        return rc;
    if (need == RUNAS_DIR && !S_ISDIR(sb.st_mode)) {
        snprintf(why, wlen, "%s is not a directory", path);
        return -ENOTDIR;
    }
    if (need == RUNAS_EXEC && !S_ISREG(sb.st_mode)) {
        snprintf(why, wlen, "%s is not a regular file", path);
        return -EINVAL;
    }
    if (need == RUNAS_EXEC && !(sb.st_mode & 0111)) {
        snprintf(why, wlen, "%s is mode %04o: not executable by anyone", path,
                 (unsigned)(sb.st_mode & 07777));
        return -EINVAL;
    }
    if (!user_may(c, real, &sb, need == RUNAS_DIR ? 5 : 1))
        return blocked(c, why, wlen, path, real, &sb,
                       need == RUNAS_DIR ? "list and search" : "execute");
    return 0;
}
