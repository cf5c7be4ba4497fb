/*
 * util/err.h - the message half of capd's error convention.
 *
 * A function that fails returns a negative errno and, for a person, may
 * fill a `char **err` with a malloc'd sentence. util_errf() is that whole
 * idiom in one call, so the return and the message stay on one line:
 *
 *     if (port > 65535)
 *         return util_errf(err, -EINVAL, "port %d is out of range", port);
 *
 * ERR may be NULL (the caller wants no message). When memory runs out the
 * message is lost (*err is NULL) but RC is still returned.
 */
#ifndef CAPD_UTIL_ERR_H
#define CAPD_UTIL_ERR_H

/* Sets *ERR (when ERR is not NULL) to the formatted message, which the
 * caller frees, and returns RC. */
int util_errf(char **err, int rc, const char *fmt, ...) __attribute__((format(printf, 3, 4)));

#endif
