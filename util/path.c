/*
 * util/path.c - util_path_join (util/path.h).
 */
#include <errno.h>
#include <string.h>

#include "util/path.h"

int util_path_join(char out[UTIL_PATH_MAX], const char *dir, const char *name)
{
    size_t d = strlen(dir), n = strlen(name);
    if (d + 1 + n >= UTIL_PATH_MAX) {
        out[0] = 0;
        return -ENAMETOOLONG;
    }
    memmove(out, dir, d);
    out[d] = '/';
    memmove(out + d + 1, name, n + 1);
    return 0;
}
