/*
 * util/metrics.c - fixed-size counter arrays updated with relaxed atomics,
 * and their Prometheus text rendering. Every array is sized at compile time
 * (routes, status codes, buckets), so recording never allocates and a
 * scrape's size is bounded.
 */
#include <stdbool.h>

#include "util/cellstate.h"
#include "util/metrics.h"

/* ---- cells ---- */

/* Counted by state (util/cellstate.h), the final ones only; the last slot
 * is "other": no state, a word that names none, or queued and running. */
#define CELL_OTHER CELL_STATE_N

/* Upper bounds in seconds; a cell runs from well under a second (the fake
 * runner) to an hour (a big model's backward pass at the default width). */
static const double cell_buckets[] = {0.1, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300, 600, 1800, 3600};
#define N_CELL_BUCKETS (sizeof cell_buckets / sizeof cell_buckets[0])

static uint64_t cells_finished[CELL_STATE_N + 1];
static uint64_t cell_hist[N_CELL_BUCKETS + 1];
static uint64_t cell_sum_ms;

/* ---- ingest ---- */

static uint64_t ingest_records, ingest_bytes;

/* ---- HTTP ---- */

static const unsigned http_codes[] = {200, 201, 202, 204, 206, 301, 302, 304, 400, 401, 403, 404,
                                      405, 409, 413, 415, 416, 422, 429, 431, 500, 501, 503, 0};
#define N_HTTP_CODES    (sizeof http_codes / sizeof http_codes[0])
#define HTTP_CODE_OTHER N_HTTP_CODES

static const double http_buckets[] = {0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1,
                                      0.25,   0.5,   1,      2.5,   5,    10,    30,   60};
#define N_HTTP_BUCKETS (sizeof http_buckets / sizeof http_buckets[0])

struct route_stats {
    const char *method, *pattern;
    uint64_t by_code[N_HTTP_CODES + 1];
    uint64_t hist[N_HTTP_BUCKETS + 1];
    uint64_t sum_ns;
};
/* The last slot is for requests that matched no route. */
static struct route_stats routes[METRICS_MAX_ROUTES + 1];

static unsigned live_streams, live_waiters;

static inline void add(uint64_t *p, uint64_t v)
{
    __atomic_add_fetch(p, v, __ATOMIC_RELAXED);
}

static inline uint64_t get(const uint64_t *p)
{
    return __atomic_load_n(p, __ATOMIC_RELAXED);
}

void metrics_cell_finished(const char *state, int64_t duration_ms)
{
    enum cell_state st;
    size_t i = cell_state_parse(state, &st) == 0 && cell_state_final(st) ? (size_t)st : CELL_OTHER;
    add(&cells_finished[i], 1);
    if (duration_ms < 0)
        return;
    double s = (double)duration_ms / 1000.0;
    size_t b = 0;
    while (b < N_CELL_BUCKETS && s > cell_buckets[b])
        b++;
    add(&cell_hist[b], 1);
    add(&cell_sum_ms, (uint64_t)duration_ms);
}

void metrics_ingest(uint64_t records, uint64_t bytes)
{
    add(&ingest_records, records);
    add(&ingest_bytes, bytes);
}

void metrics_http(int route, const char *method, const char *pattern, unsigned status, uint64_t ns)
{
    struct route_stats *r =
        &routes[route >= 0 && route < METRICS_MAX_ROUTES ? route : METRICS_MAX_ROUTES];
    if (route >= 0 && route < METRICS_MAX_ROUTES &&
        !__atomic_load_n(&r->pattern, __ATOMIC_RELAXED)) {
        __atomic_store_n(&r->method, method, __ATOMIC_RELAXED);
        __atomic_store_n(&r->pattern, pattern, __ATOMIC_RELEASE);
    }
    size_t c = 0;
    while (c < N_HTTP_CODES && http_codes[c] != status)
        c++;
    add(&r->by_code[c], 1);
    double s = (double)ns / 1e9;
    size_t b = 0;
    while (b < N_HTTP_BUCKETS && s > http_buckets[b])
        b++;
    add(&r->hist[b], 1);
    add(&r->sum_ns, ns);
}

void metrics_live_set(unsigned streams, unsigned waiters)
{
    __atomic_store_n(&live_streams, streams, __ATOMIC_RELAXED);
    __atomic_store_n(&live_waiters, waiters, __ATOMIC_RELAXED);
}

/* Prometheus label values escape backslash, double quote and newline. */
static void label(FILE *f, const char *v)
{
    for (; v && *v; v++) {
        if (*v == '\\' || *v == '"')
            fputc('\\', f);
        if (*v == '\n') {
            fputs("\\n", f);
            continue;
        }
        fputc(*v, f);
    }
}

static void route_labels(FILE *f, const struct route_stats *r)
{
    const char *p = __atomic_load_n(&r->pattern, __ATOMIC_ACQUIRE);
    fputs("method=\"", f);
    label(f, p ? __atomic_load_n(&r->method, __ATOMIC_RELAXED) : "");
    fputs("\",route=\"", f);
    label(f, p ? p : "(unmatched)");
    fputc('"', f);
}

static bool route_used(const struct route_stats *r)
{
    for (size_t c = 0; c <= N_HTTP_CODES; c++)
        if (get(&r->by_code[c]))
            return true;
    return false;
}

/* Requests by route and status: only the pairs that were seen. */
static void write_http_requests(FILE *f)
{
    fputs("# HELP capd_http_requests_total HTTP requests by route and status.\n"
          "# TYPE capd_http_requests_total counter\n",
          f);
    for (size_t i = 0; i <= METRICS_MAX_ROUTES; i++) {
        const struct route_stats *r = &routes[i];
        for (size_t c = 0; c <= N_HTTP_CODES; c++) {
            uint64_t n = get(&r->by_code[c]);
            if (!n)
                continue;
            fputs("capd_http_requests_total{", f);
            route_labels(f, r);
            if (c == HTTP_CODE_OTHER)
                fputs(",status=\"other\"", f);
            else if (http_codes[c] == 0)
                fputs(",status=\"none\"", f);
            else
                fprintf(f, ",status=\"%u\"", http_codes[c]);
            fprintf(f, "} %llu\n", (unsigned long long)n);
        }
    }
}

/* Each route's latency histogram, for the routes that were asked for. */
static void write_http_durations(FILE *f)
{
    uint64_t cum;
    fputs("# HELP capd_http_request_duration_seconds HTTP request latency by route (first "
          "byte in to last byte out; event streams and long-polls count their whole life).\n"
          "# TYPE capd_http_request_duration_seconds histogram\n",
          f);
    for (size_t i = 0; i <= METRICS_MAX_ROUTES; i++) {
        const struct route_stats *r = &routes[i];
        if (!route_used(r))
            continue;
        cum = 0;
        for (size_t b = 0; b <= N_HTTP_BUCKETS; b++) {
            cum += get(&r->hist[b]);
            fputs("capd_http_request_duration_seconds_bucket{", f);
            route_labels(f, r);
            if (b < N_HTTP_BUCKETS)
                fprintf(f, ",le=\"%g\"} %llu\n", http_buckets[b], (unsigned long long)cum);
            else
                fprintf(f, ",le=\"+Inf\"} %llu\n", (unsigned long long)cum);
        }
        fputs("capd_http_request_duration_seconds_sum{", f);
        route_labels(f, r);
        fprintf(f, "} %.6f\n", (double)get(&r->sum_ns) / 1e9);
        fputs("capd_http_request_duration_seconds_count{", f);
        route_labels(f, r);
        fprintf(f, "} %llu\n", (unsigned long long)cum);
    }
}

void metrics_write(FILE *f)
{
    fputs("# HELP capd_cells_finished_total Cell attempts that ended, by outcome.\n"
          "# TYPE capd_cells_finished_total counter\n",
          f);
    for (size_t i = 0; i <= CELL_OTHER; i++)
        if (i == CELL_OTHER || cell_state_final((enum cell_state)i))
            fprintf(f, "capd_cells_finished_total{outcome=\"%s\"} %llu\n",
                    i == CELL_OTHER ? "other" : cell_state_name((enum cell_state)i),
                    (unsigned long long)get(&cells_finished[i]));

    fputs("# HELP capd_cell_duration_seconds Wall time of cell attempts, child start to end.\n"
          "# TYPE capd_cell_duration_seconds histogram\n",
          f);
    uint64_t cum = 0;
    for (size_t b = 0; b <= N_CELL_BUCKETS; b++) {
        cum += get(&cell_hist[b]);
        if (b < N_CELL_BUCKETS)
            fprintf(f, "capd_cell_duration_seconds_bucket{le=\"%g\"} %llu\n", cell_buckets[b],
                    (unsigned long long)cum);
        else
            fprintf(f, "capd_cell_duration_seconds_bucket{le=\"+Inf\"} %llu\n",
                    (unsigned long long)cum);
    }
    fprintf(f, "capd_cell_duration_seconds_sum %.3f\n", (double)get(&cell_sum_ms) / 1000.0);
    fprintf(f, "capd_cell_duration_seconds_count %llu\n", (unsigned long long)cum);

    fprintf(f,
            "# HELP capd_ingest_records_total Frames stored as records.\n"
            "# TYPE capd_ingest_records_total counter\n"
            "capd_ingest_records_total %llu\n"
            "# HELP capd_ingest_bytes_total Bytes of frames stored (headers and payloads).\n"
            "# TYPE capd_ingest_bytes_total counter\n"
            "capd_ingest_bytes_total %llu\n",
            (unsigned long long)get(&ingest_records), (unsigned long long)get(&ingest_bytes));

    fprintf(f,
            "# HELP capd_event_streams Open GET /v1/events streams.\n"
            "# TYPE capd_event_streams gauge\n"
            "capd_event_streams %u\n"
            "# HELP capd_long_polls Requests waiting in a long-poll.\n"
            "# TYPE capd_long_polls gauge\n"
            "capd_long_polls %u\n",
            __atomic_load_n(&live_streams, __ATOMIC_RELAXED),
            __atomic_load_n(&live_waiters, __ATOMIC_RELAXED));

    write_http_requests(f);
    write_http_durations(f);
}
