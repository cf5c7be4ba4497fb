/*
 * util/metrics.h - process-wide counters and histograms behind GET /metrics.
 *
 * They are updated from the daemon loop (cells, ingest) and from every HTTP
 * worker thread (requests) with relaxed atomic adds: no lock, no allocation,
 * nothing that can slow the hot paths. Readers see each number current on
 * its own; a scrape is not a consistent snapshot across numbers, which
 * Prometheus does not need. Gauges that live in SQLite (jobs and cells by
 * state, queue depth) are read by api/api_metrics.c at scrape time.
 */
#ifndef CAPD_UTIL_METRICS_H
#define CAPD_UTIL_METRICS_H

#include <stdint.h>
#include <stdio.h>

#define METRICS_MAX_ROUTES 64

/* A cell ended with outcome STATE after DURATION_MS of its attempt; a
 * negative DURATION_MS is a cell that no attempt ran (unsupported here, no
 * GPU, a set-up that failed): counted by outcome, not in the durations. */
void metrics_cell_finished(const char *state, int64_t duration_ms);

/* RECORDS frames of BYTES (header plus payload) were stored. */
void metrics_ingest(uint64_t records, uint64_t bytes);

/*
 * One HTTP request ended. ROUTE indexes the caller's route table (-1: no
 * route matched); METHOD and PATTERN name it and must be static strings.
 * STATUS 0 means the connection ended without a reply. NS is the time from
 * the request's first byte to its last reply byte.
 */
void metrics_http(int route, const char *method, const char *pattern, unsigned status, uint64_t ns);

/* Event streams and long-polls held open right now. */
void metrics_live_set(unsigned streams, unsigned waiters);

/* Writes every metric above in the Prometheus text format 0.0.4. */
void metrics_write(FILE *f);

#endif
