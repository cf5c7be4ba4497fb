/*
 * util/str.h - a list of names built in the caller's fixed buffer, a name
 * at a time: "avx512f,avx512bw", "avx512f&avx512bw".
 *
 * A name is added whole or not at all, like an append to a ubuf
 * (util/buf.h): a list that does not fit ends at its last whole name,
 * never in the middle of one, which a reader would take for another name
 * (a Slurm constraint naming a feature cut short sends the cell to the
 * wrong node). The caller decides what a list that does not fit means:
 * shown as far as it goes, or refused.
 *
 *     char out[64] = "";
 *     size_t len = 0;
 *     for (i = 0; i < n; i++)
 *         if (util_join(out, sizeof out, &len, ",", names[i]) != 0)
 *             break;                            // -E2BIG: out is whole names
 */
#ifndef CAPD_UTIL_STR_H
#define CAPD_UTIL_STR_H

#include <stddef.h>

/* Appends SEP, unless the list is still empty (*LEN is 0), and S (NULL
 * counts as "") to the string in OUT, CAP bytes with the NUL, whose length
 * *LEN is kept. OUT starts as "" with *LEN 0. 0, or -E2BIG with OUT and
 * *LEN as they were when the two do not fit. */
int util_join(char *out, size_t cap, size_t *len, const char *sep, const char *s);

#endif
