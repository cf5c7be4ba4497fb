/*
 * util/http.c - the base URL and the bearer token of capd's HTTP clients
 * (util/http.h).
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "util/http.h"

int util_http_base(const char *url, char *out, size_t cap)
{
    if (cap > 0)
        out[0] = 0;
    if (strncasecmp(url, "http://", 7) != 0 && strncasecmp(url, "https://", 8) != 0)
        return -EINVAL;
    size_t n = strlen(url);
    while (n > 0 && url[n - 1] == '/')
        n--;
    if (n >= cap)
        return -ENAMETOOLONG;
    memcpy(out, url, n);
    out[n] = 0;
    return 0;
}

bool util_http_token_ok(const char *token)
{
    for (const char *p = token; *p; p++)
        if ((unsigned char)*p < 0x21 || *p == 0x7f)
            return false;
    return true;
}

char *util_http_bearer(const char *token)
{
    char *h;
    return asprintf(&h, "Authorization: Bearer %s", token) < 0 ? NULL : h;
}

void util_http_secret_free(char *s)
{
    if (!s)
        return;
    /* explicit_bzero: a memset of memory about to be freed may be dropped
     * by the compiler as a dead store. */
    explicit_bzero(s, strlen(s));
    free(s);
}
