/*
 * tests/helpers/common/text_want.h - checking a rendered text (a report, a
 * log, a validator's output) for the strings it must hold, for the
 * Criterion tests: each call fails the running test at the first string
 * missing, naming it and showing the whole text.
 */
#ifndef CAPD_TESTS_TEXT_WANT_H
#define CAPD_TESTS_TEXT_WANT_H

/* Fails the test unless TEXT holds each of the strings that follow, the
 * list ended by NULL. */
void tw_expect_has(const char *text, ...) __attribute__((sentinel));

#endif
