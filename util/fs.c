/*
 * util/fs.c - mkdir -p, rm -r, whole-file reads and full writes
 * (util/fs.h).
 */
#include <errno.h>
#include <fcntl.h>
#include <ftw.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "util/fs.h"
#include "util/path.h"

int util_mkdir_p(const char *path, mode_t mode)
{
    size_t n = strlen(path);
    if (n >= UTIL_PATH_MAX)
        return -ENAMETOOLONG;
    if (mkdir(path, mode) == 0 || errno == EEXIST)
        return 0;
    if (errno != ENOENT)
        return -errno;
    char tmp[UTIL_PATH_MAX];
    memcpy(tmp, path, n + 1);
    for (char *c = tmp + 1; *c; c++) {
        if (*c != '/')
            continue;
        *c = 0;
        if (mkdir(tmp, mode) != 0 && errno != EEXIST)
            return -errno;
        *c = '/';
    }
    if (mkdir(tmp, mode) != 0 && errno != EEXIST)
        return -errno;
    return 0;
}

static int rm_entry(const char *path, const struct stat *sb, int flag, struct FTW *ftw)
{
    (void)sb;
    (void)flag;
    (void)ftw;
    remove(path);
    return 0;
}

/* nftw's callbacks take no context: util_tree_bytes's sum, one walk at a
 * time per thread. */
static _Thread_local long long tree_bytes;

static int add_bytes(const char *path, const struct stat *sb, int type, struct FTW *ftw)
{
    (void)path;
    (void)ftw;
    if (type == FTW_F && S_ISREG(sb->st_mode))
        tree_bytes += (long long)sb->st_size;
    return 0;
}

long long util_tree_bytes(const char *dir)
{
    tree_bytes = 0;
    if (strlen(dir) >= UTIL_PATH_MAX || nftw(dir, add_bytes, 16, FTW_PHYS) != 0)
        return 0;
    return tree_bytes;
}

int util_rm_tree(const char *dir)
{
    if (strlen(dir) >= UTIL_PATH_MAX)
        return -ENAMETOOLONG;
    if (nftw(dir, rm_entry, 16, FTW_DEPTH | FTW_PHYS) != 0)
        return errno == ENOENT ? 0 : -errno;
    return 0;
}

/* read(2) retried when a signal interrupts it: bytes read, 0 at the end,
 * or -errno. */
static ssize_t read_some(int fd, void *p, size_t n)
{
    for (;;) {
        ssize_t r = read(fd, p, n);
        if (r >= 0 || errno != EINTR)
            return r < 0 ? -errno : r;
    }
}

int util_slurp_fd(int fd, size_t max, char **out, size_t *len_out)
{
    *out = NULL;
    struct stat sb;
    size_t cap = 4096;
    if (fstat(fd, &sb) == 0 && S_ISREG(sb.st_mode)) {
        if ((unsigned long long)sb.st_size > max)
            return -E2BIG;
        cap = (size_t)sb.st_size + 1;
    }
    if (cap > max + 1)
        cap = max + 1;
    char *buf = malloc(cap);
    if (!buf)
        return -ENOMEM;
    size_t len = 0;
    int rc = 0;
    for (;;) {
        if (len + 1 == cap) {
            /* Full: one more byte tells a file that grew past MAX (or a
             * pipe) from one that ends here. */
            char probe;
            ssize_t r = read_some(fd, &probe, 1);
            if (r < 0) {
                rc = (int)r;
                goto out;
            }
            if (r == 0)
                break;
            if (len == max) {
                rc = -E2BIG;
                goto out;
            }
            size_t ncap = cap * 2 > max + 1 || cap * 2 < cap ? max + 1 : cap * 2;
            char *nb = realloc(buf, ncap);
            if (!nb) {
                rc = -ENOMEM;
                goto out;
            }
            buf = nb;
            cap = ncap;
            buf[len++] = probe;
            continue;
        }
        ssize_t r = read_some(fd, buf + len, cap - 1 - len);
        if (r < 0) {
            rc = (int)r;
            goto out;
        }
        if (r == 0)
            break;
        len += (size_t)r;
    }
    buf[len] = 0;
    *out = buf;
    buf = NULL;
    if (len_out)
        *len_out = len;
out:
    free(buf);
    return rc;
}

int util_slurp(const char *path, size_t max, char **out, size_t *len_out)
{
    *out = NULL;
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return -errno;
    int rc = util_slurp_fd(fd, max, out, len_out);
    close(fd);
    return rc;
}

int util_write_all(int fd, const void *p, size_t n)
{
    const char *c = p;
    while (n > 0) {
        ssize_t w = write(fd, c, n);
        if (w < 0 && errno == EINTR)
            continue;
        if (w < 0)
            return -errno;
        if (w == 0)
            return -EIO;
        c += w;
        n -= (size_t)w;
    }
    return 0;
}

int util_tmp_finish(int fd, int rc, const char *tmp, const char *path)
{
    if (fd >= 0 && close(fd) != 0 && rc == 0)
        rc = -errno;
    if (rc == 0 && rename(tmp, path) != 0)
        rc = -errno;
    if (rc)
        unlink(tmp);
    return rc;
}
