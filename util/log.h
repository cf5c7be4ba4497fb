/*
 * util/log.h - one line per event on stderr:
 *   2026-11-30T03:14:31.123Z level=info event=listening addr=127.0.0.1 port=8080
 * Values with spaces, quotes or '=' are quoted, so journald and grep both
 * read the lines. Safe to call from any thread (one write(2) per line).
 */
#ifndef CAPD_UTIL_LOG_H
#define CAPD_UTIL_LOG_H

enum log_level { LOG_DEBUG, LOG_INFO, LOG_WARN, LOG_ERROR };

void log_set_level(enum log_level l);
int log_parse_level(const char *s, enum log_level *out);

/* FMT is a list of key=value fields; a value given as %s is quoted when it
 * needs to be (use log_q() for that). */
void log_event(enum log_level l, const char *event, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

/* Quotes V for a key=value field into a thread-local buffer (one of 4
 * rotating slots, so up to 4 may appear in one call). */
const char *log_q(const char *v);

#define log_debug(ev, ...) log_event(LOG_DEBUG, ev, __VA_ARGS__)
#define log_info(ev, ...)  log_event(LOG_INFO, ev, __VA_ARGS__)
#define log_warn(ev, ...)  log_event(LOG_WARN, ev, __VA_ARGS__)
#define log_error(ev, ...) log_event(LOG_ERROR, ev, __VA_ARGS__)

#endif
