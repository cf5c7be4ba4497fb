/*
 * util/http.h - the curl-free half of capd's two HTTP clients, capctl's
 * (cli/client.c) and capd-cell's (worker/http.c): what they take from the
 * command line before libcurl is involved, and the bearer token's care.
 *
 * Both talk to capd at a base URL given by the user, http:// or https://
 * only, to which they append paths ("/v1/jobs"); both send a token as
 * "Authorization: Bearer TOKEN", a token that must be one header word,
 * and neither leaves it behind in freed memory. The transfers themselves
 * (libcurl) stay in each client: util/ depends on nothing but the C
 * library.
 */
#ifndef CAPD_UTIL_HTTP_H
#define CAPD_UTIL_HTTP_H

#include <stdbool.h>
#include <stddef.h>

/* Writes URL, which must start with http:// or https:// (in any case),
 * into OUT (CAP bytes) without its trailing '/'s. 0; -EINVAL for another
 * scheme; -ENAMETOOLONG when it does not fit. OUT is "" on failure. */
int util_http_base(const char *url, char *out, size_t cap);

/* Whether TOKEN can be sent as a bearer token: no space and no control
 * character (no byte below 0x21, nor 0x7f). */
bool util_http_token_ok(const char *token);

/* "Authorization: Bearer TOKEN", malloc'd (util_http_secret_free() it);
 * NULL when memory runs out. */
char *util_http_bearer(const char *token);

/* Zeroes the string S, a token or a header that holds one, and frees it,
 * so the token does not linger in freed memory. S may be NULL. */
void util_http_secret_free(char *s);

#endif
