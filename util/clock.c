/*
 * util/clock.c - monotonic and wall-clock time (util/clock.h).
 */
#include <stdio.h>
#include <time.h>

#include "util/clock.h"

uint64_t util_mono_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

int64_t util_mono_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

int64_t util_wall_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

size_t util_time_text(int64_t ms, char out[UTIL_TIME_TEXT_MAX])
{
    time_t t = (time_t)(ms / 1000);
    struct tm tm;
    size_t n;

    gmtime_r(&t, &tm);
    n = strftime(out, UTIL_TIME_TEXT_MAX, "%Y-%m-%dT%H:%M:%S", &tm);
    n += (size_t)snprintf(out + n, UTIL_TIME_TEXT_MAX - n, ".%03dZ", (int)(ms % 1000));
    return n;
}
