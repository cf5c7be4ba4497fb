/*
 * tests/helpers/common/cmp_records.h - the comparison engine's inputs built
 * by hand, for the suites that test it without a capd (test_compare_*.c,
 * test_reference.c): a cell that ended ok, and a 1-D float64 record. The
 * engine borrows payloads, so crec_add_f64 copies them into a pool of
 * CREC_POOL_DOUBLES values that lives as long as the test's process
 * (Criterion runs each test in its own). Each call fails the running test
 * when the engine refuses, or when the pool is full (it says so).
 */
#ifndef CAPD_TESTS_CMP_RECORDS_H
#define CAPD_TESTS_CMP_RECORDS_H

#include <stddef.h>
#include <stdint.h>

#include "compare/cmp.h"

#define CREC_POOL_DOUBLES (1 << 16)

/* Cell MODEL/WIDTH/PASS of side S, its outcome already "ok". */
struct cmp_cell *crec_cell(struct cmp_side *s, const char *model, const char *width,
                           const char *pass);

/* Record KEY at SEQ: float64 of shape [N] with statistics ST and hash
 * HASH, captured as CAP; the N values V are its payload (copied into the
 * pool) only when CAP is CMP_CAPTURE_FULL. */
struct cmp_tensor crec_f64(const char *key, int64_t seq, const double *v, size_t n,
                           struct cmp_stats st, const char *hash, enum cmp_capture cap);
/* crec_f64's record, added to cell C. */
void crec_add_f64(struct cmp_cell *c, const char *key, int64_t seq, const double *v, size_t n,
                  struct cmp_stats st, const char *hash, enum cmp_capture cap);
/* The result of comparing control side SC with head side SH at the
 * default options (the test fails where the engine refuses); both sides
 * are freed. */
json_t *crec_compare(struct cmp_side *sc, struct cmp_side *sh);
/* Empties the pool, for a suite's init when its tests share one process
 * (--no-fork): no payload handed out before may be compared after. */
void crec_reset(void);

#endif
