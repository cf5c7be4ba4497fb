/*
 * util/err.c - util_errf (util/err.h).
 */
#include <stdarg.h>
#include <stdio.h>

#include "util/err.h"

int util_errf(char **err, int rc, const char *fmt, ...)
{
    if (!err)
        return rc;
    va_list ap;
    va_start(ap, fmt);
    if (vasprintf(err, fmt, ap) < 0)
        *err = NULL;
    va_end(ap);
    return rc;
}
