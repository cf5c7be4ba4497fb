/*
 * util/str.c - util_join (util/str.h).
 */
#include <errno.h>
#include <string.h>

#include "util/str.h"

int util_join(char *out, size_t cap, size_t *len, const char *sep, const char *s)
{
    size_t ns = *len ? strlen(sep) : 0, n = s ? strlen(s) : 0;
    if (*len + ns + n >= cap)
        return -E2BIG;
    memcpy(out + *len, sep, ns);
    memcpy(out + *len + ns, s ? s : "", n);
    *len += ns + n;
    out[*len] = 0;
    return 0;
}
