/*
 * util/fs.h - the few file-system operations every part of capd repeats.
 *
 * All return 0 or a negative errno. Paths are at most UTIL_PATH_MAX bytes
 * (util/path.h); a longer one is -ENAMETOOLONG, never truncated. Every fd
 * these functions open is O_CLOEXEC and closed before they return.
 */
#ifndef CAPD_UTIL_FS_H
#define CAPD_UTIL_FS_H

#include <stddef.h>
#include <sys/types.h>

/* Creates PATH and any missing parents with MODE (an existing directory is
 * fine). The common case, a new directory in an existing one, is a single
 * mkdir(2); the walk from the root is only taken when a parent is missing. */
int util_mkdir_p(const char *path, mode_t mode);

/* Removes DIR and everything below it, depth first, never following a
 * symbolic link out of the tree. Entries that cannot be removed are left
 * and the walk goes on; a DIR that does not exist is not an error. Returns
 * 0, or the first error the walk itself met. */
int util_rm_tree(const char *dir);

/* The bytes of the regular files in and below DIR, never following a
 * symbolic link; 0 when DIR cannot be walked. */
long long util_tree_bytes(const char *dir);

/* Reads the whole file PATH, or what is left of the open FD, into a
 * malloc'd, NUL-terminated buffer (*OUT, its length in *LEN_OUT, which may
 * be NULL). A regular file's buffer is sized once from its length, so its
 * bytes are not copied through freed memory as it grows. -E2BIG when
 * there are more than MAX bytes; *OUT is NULL on every error. */
int util_slurp(const char *path, size_t max, char **out, size_t *len_out);
int util_slurp_fd(int fd, size_t max, char **out, size_t *len_out);

/* Writes all N bytes of P to FD, retrying short writes and EINTR. A write
 * that makes no progress is -EIO. */
int util_write_all(int fd, const void *p, size_t n);

/* Ends a file written through the temporary TMP beside PATH, so PATH is
 * whole or as it was: FD (ignored when negative) is closed, then TMP is
 * renamed over PATH when RC, the writing's result, is 0, and removed when
 * RC or the close or the rename failed. RC or the first -errno. */
int util_tmp_finish(int fd, int rc, const char *tmp, const char *path);

#endif
