/*
 * tests/helpers/common/jobs.h - posting jobs whose body a test writes out
 * in full, and waiting for a batch of them, for the history suites (each
 * call fails the running Criterion test on a miss).
 */
#ifndef CAPD_TESTS_JOBS_H
#define CAPD_TESTS_JOBS_H

#include "tests/helpers/common/testutil.h"

/* POSTs the body FMT... to /v1/jobs of capd C; fails the test, with the
 * reply, unless it is 201 with an id, which it returns (owned). */
char *jobs_post(const struct tu_capd *c, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));
/* Waits up to TIMEOUT_S for each of the N jobs IDS to end, failing the test
 * if one does not, or, with WANT_CELL non-NULL, if its first cell did not
 * end in that state; frees the ids. */
void jobs_wait_all(const struct tu_capd *c, char **ids, int n, int timeout_s,
                   const char *want_cell);

#endif
