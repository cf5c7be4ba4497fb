/*
 * util/path.h - joining path names without truncating them.
 *
 * A path that does not fit is an error (-ENAMETOOLONG), never a silently
 * shortened name that would then be created, opened or removed. Every
 * caller's buffer holds UTIL_PATH_MAX bytes, the kernel's own limit on a
 * path handed to a system call, so one constant sizes them all.
 */
#ifndef CAPD_UTIL_PATH_H
#define CAPD_UTIL_PATH_H

#include <limits.h>

#define UTIL_PATH_MAX PATH_MAX /* bytes, the terminating NUL included */

/* Writes DIR "/" NAME into OUT (UTIL_PATH_MAX bytes), exactly that: the
 * same string as snprintf("%s/%s"), or an error. OUT may be DIR itself.
 * 0, or -ENAMETOOLONG with OUT set to "" when the result does not fit. */
int util_path_join(char out[UTIL_PATH_MAX], const char *dir, const char *name);

#endif
