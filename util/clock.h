/*
 * util/clock.h - the two clocks capd reads.
 *
 * CLOCK_MONOTONIC for durations, deadlines and heartbeats (it never jumps
 * when the wall clock is set); CLOCK_REALTIME, in milliseconds since the
 * epoch, for what is stored or shown as a point in time (rows, log lines,
 * the device probe's age). The daemon loop uses libuv's cached uv_now()
 * for its own timers; these are for code off the loop or outside it.
 * A point in time is written for people and clients as RFC 3339 UTC with
 * milliseconds (util_time_text), the form of the API and the log lines.
 */
#ifndef CAPD_UTIL_CLOCK_H
#define CAPD_UTIL_CLOCK_H

#include <stddef.h>
#include <stdint.h>

/* CLOCK_MONOTONIC in nanoseconds. */
uint64_t util_mono_ns(void);

/* CLOCK_MONOTONIC in milliseconds. */
int64_t util_mono_ms(void);

/* CLOCK_REALTIME in milliseconds since the epoch. */
int64_t util_wall_ms(void);

#define UTIL_TIME_TEXT_MAX 40 /* bytes of util_time_text's OUT, NUL included */

/* MS (milliseconds since the epoch, >= 0) as "YYYY-MM-DDTHH:MM:SS.mmmZ"
 * into OUT; returns its length. */
size_t util_time_text(int64_t ms, char out[UTIL_TIME_TEXT_MAX]);

#endif
