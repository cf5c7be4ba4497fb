/*
 * util/cpuwrap.c - util_cpuwrap_peel (util/cpuwrap.h).
 */
#include <stdbool.h>
#include <string.h>

#include "util/cpuwrap.h"

/* Whether the N bytes at S are a capability name: [A-Z][A-Z0-9_]*. */
static bool capability(const char *s, size_t n)
{
    if (n == 0 || !(s[0] >= 'A' && s[0] <= 'Z'))
        return false;
    for (size_t i = 1; i < n; i++)
        if (!((s[i] >= 'A' && s[i] <= 'Z') || (s[i] >= '0' && s[i] <= '9') || s[i] == '_'))
            return false;
    return true;
}

/* Each peel takes ".CAP.cpp" off the end while what is left still ends in
 * ".cpp" with a non-empty stem. A '/' ends the scan for CAP, which never
 * holds one, so a directory of a path is never taken for a wrapping. */
size_t util_cpuwrap_peel(const char *path, int *depth)
{
    size_t n = strlen(path);
    int d = 0;
    while (n > 4 && memcmp(path + n - 4, ".cpp", 4) == 0) {
        size_t e = n - 4, b = e;
        while (b > 0 && path[b - 1] != '.' && path[b - 1] != '/')
            b--;
        if (b == 0 || path[b - 1] != '.' || !capability(path + b, e - b))
            break;
        size_t rest = b - 1; /* the length of what precedes ".CAP.cpp" */
        if (rest < 5 || memcmp(path + rest - 4, ".cpp", 4) != 0)
            break;
        d++;
        n = rest;
    }
    if (depth)
        *depth = d;
    return n;
}
