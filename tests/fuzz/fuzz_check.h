/*
 * tests/fuzz/fuzz_check.h - the one check every fuzz target makes of the
 * promises of the code it drives: a broken promise names the target and
 * the condition on stderr and aborts, which libFuzzer reports as a crash
 * with the input that caused it. A target defines FUZZ_TARGET, its name,
 * before including this.
 */
#ifndef CAPD_FUZZ_CHECK_H
#define CAPD_FUZZ_CHECK_H

#include <stdio.h>
#include <stdlib.h>

#define CHECK(c)                                                                                   \
    do {                                                                                           \
        if (!(c)) {                                                                                \
            fprintf(stderr, FUZZ_TARGET ": check failed: %s\n", #c);                               \
            abort();                                                                               \
        }                                                                                          \
    } while (0)

#endif
