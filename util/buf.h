/*
 * util/buf.h - the one growing byte buffer of capd, with a ceiling.
 *
 * Modelled on curl's dynbuf: every buffer is given its maximum when it is
 * initialised, and an append that would take it past that maximum fails
 * with -E2BIG instead of growing. A failed append (-E2BIG, or -ENOMEM when
 * realloc fails) leaves the buffer exactly as it was, so a caller may drop
 * the piece, note it and go on, or give up. The contents are always
 * NUL-terminated once anything was added (p[len] == 0), so a text buffer
 * can be handed to string functions; binary contents may hold NULs too.
 *
 * The struct is public so that it can live inside another one, but only
 * these functions change it. p is NULL until the first append; max counts
 * content bytes, the terminating NUL comes on top (cap <= max + 1).
 *
 *     struct ubuf b;
 *     ubuf_init(&b, 1 << 20);
 *     if ((rc = ubuf_addf(&b, "%d cells", n)) != 0)   // -E2BIG or -ENOMEM
 *         goto out;
 *     char *s = ubuf_take(&b, &len);                  // the caller owns s
 *
 * Nothing here is thread-safe: a buffer belongs to one thread at a time.
 */
#ifndef CAPD_UTIL_BUF_H
#define CAPD_UTIL_BUF_H

#include <stdarg.h>
#include <stddef.h>

struct ubuf {
    char *p;    /* NULL until the first append */
    size_t len; /* content bytes */
    size_t cap; /* allocated bytes, at most max + 1 */
    size_t max; /* the ceiling on len */
};

/* An empty buffer that will never hold more than MAX bytes. Allocates
 * nothing. */
void ubuf_init(struct ubuf *b, size_t max);

/* Frees the contents and leaves an empty buffer with the same maximum. */
void ubuf_free(struct ubuf *b);

/* Empties the buffer but keeps its memory for the next appends. */
void ubuf_reset(struct ubuf *b);

/* Appends N bytes of P (P may be NULL when N is 0). 0, -E2BIG when len + N
 * would pass max, or -ENOMEM; the buffer is unchanged on failure. */
int ubuf_add(struct ubuf *b, const void *p, size_t n);

/* Appends the NUL-terminated string S, like ubuf_add. */
int ubuf_adds(struct ubuf *b, const char *s);

/* Appends the one byte C, like ubuf_add. */
int ubuf_addc(struct ubuf *b, char c);

/* Appends printf-formatted text, like ubuf_add: all of it or nothing. */
int ubuf_addf(struct ubuf *b, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
int ubuf_vaddf(struct ubuf *b, const char *fmt, va_list ap) __attribute__((format(printf, 2, 0)));

/* Makes room for N more bytes without adding them (for a caller that
 * writes into p + len itself and then calls ubuf_setlen). 0, -E2BIG or
 * -ENOMEM, like ubuf_add. */
int ubuf_reserve(struct ubuf *b, size_t n);

/* Cuts the contents back to their first LEN bytes (LEN <= len), or, after
 * ubuf_reserve, extends them to LEN bytes written into the reserved room. */
void ubuf_setlen(struct ubuf *b, size_t len);

/* Drops the first N bytes (N <= len), moving the rest to the front. */
void ubuf_shift(struct ubuf *b, size_t n);

/* Hands the contents to the caller (free() them) and leaves an empty
 * buffer. LEN_OUT (may be NULL) gets the length. A buffer to which nothing
 * was added gives a malloc'd "", so NULL means only that memory ran out. */
char *ubuf_take(struct ubuf *b, size_t *len_out);

#endif
