/*
 * util/buf.c - the growing buffer with a ceiling (util/buf.h).
 *
 * Capacity doubles from UBUF_MIN and is clamped at max + 1, so a buffer
 * never allocates more than its ceiling allows, and the check against the
 * ceiling comes before any allocation: an append that cannot fit costs
 * nothing and changes nothing.
 */
#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "util/buf.h"

#define UBUF_MIN 256

void ubuf_init(struct ubuf *b, size_t max)
{
    b->p = NULL;
    b->len = b->cap = 0;
    b->max = max;
}

void ubuf_free(struct ubuf *b)
{
    free(b->p);
    b->p = NULL;
    b->len = b->cap = 0;
}

void ubuf_reset(struct ubuf *b)
{
    b->len = 0;
    if (b->p)
        b->p[0] = 0;
}

int ubuf_reserve(struct ubuf *b, size_t n)
{
    if (n > b->max || b->len > b->max - n)
        return -E2BIG;
    size_t need = b->len + n + 1;
    if (need <= b->cap)
        return 0;
    size_t cap = b->cap ? b->cap : UBUF_MIN;
    while (cap < need)
        cap = cap > SIZE_MAX / 2 ? SIZE_MAX : cap * 2;
    if (cap > b->max + 1)
        cap = b->max + 1;
    char *p = realloc(b->p, cap);
    if (!p)
        return -ENOMEM;
    if (!b->p)
        p[0] = 0;
    b->p = p;
    b->cap = cap;
    return 0;
}

int ubuf_add(struct ubuf *b, const void *p, size_t n)
{
    int rc = ubuf_reserve(b, n);
    if (rc)
        return rc;
    if (n)
        memcpy(b->p + b->len, p, n);
    b->len += n;
    b->p[b->len] = 0;
    return 0;
}

int ubuf_adds(struct ubuf *b, const char *s)
{
    return ubuf_add(b, s, strlen(s));
}

int ubuf_addc(struct ubuf *b, char c)
{
    return ubuf_add(b, &c, 1);
}

/* Formats into the room already there; only when the text does not fit is
 * the buffer grown and the text formatted again. A first attempt that did
 * not fit wrote over the terminating NUL, which a failure puts back. */
int ubuf_vaddf(struct ubuf *b, const char *fmt, va_list ap)
{
    va_list ap2;
    va_copy(ap2, ap);
    size_t room = b->cap ? b->cap - b->len : 0;
    int n = vsnprintf(room ? b->p + b->len : NULL, room, fmt, ap2);
    va_end(ap2);
    if (n < 0) {
        if (b->p)
            b->p[b->len] = 0;
        return -EINVAL;
    }
    if ((size_t)n < room) { /* cap <= max + 1, so it is within max too */
        b->len += (size_t)n;
        return 0;
    }
    int rc = ubuf_reserve(b, (size_t)n);
    if (rc) {
        if (b->p)
            b->p[b->len] = 0;
        return rc;
    }
    vsnprintf(b->p + b->len, (size_t)n + 1, fmt, ap);
    b->len += (size_t)n;
    return 0;
}

int ubuf_addf(struct ubuf *b, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    int rc = ubuf_vaddf(b, fmt, ap);
    va_end(ap);
    return rc;
}

void ubuf_setlen(struct ubuf *b, size_t len)
{
    b->len = len;
    if (b->p)
        b->p[len] = 0;
}

void ubuf_shift(struct ubuf *b, size_t n)
{
    if (n == 0)
        return;
    memmove(b->p, b->p + n, b->len - n);
    ubuf_setlen(b, b->len - n);
}

char *ubuf_take(struct ubuf *b, size_t *len_out)
{
    char *p = b->p ? b->p : calloc(1, 1);
    if (len_out)
        *len_out = p ? b->len : 0;
    b->p = NULL;
    b->len = b->cap = 0;
    return p;
}
