/*
 * api/api_metrics.c - GET /metrics in the Prometheus text format 0.0.4.
 *
 * Two sources: what lives in SQLite (jobs and cells by state, the queue) is
 * counted at scrape time with two GROUP BYs over the state indexes, and
 * what the process counts as it goes (cells finished and their durations,
 * ingest, HTTP requests and latencies, SQLite errors, live connections)
 * comes from util/metrics.c and storage's error counters. Every state is
 * always listed, zero or not, so a series never disappears.
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>

#include "api/api_int.h"
#include "daemon/host/devices.h"
#include "util/cellstate.h"
#include "util/metrics.h"

static const char *const job_states[] = {"queued", "running", "done", "cancelled", NULL};

static void state_line(FILE *f, const char *name, json_t *counts, const char *state)
{
    fprintf(f, "%s{state=\"%s\"} %lld\n", name, state,
            (long long)json_integer_value(json_object_get(counts, state)));
}

static void by_state(FILE *f, const char *name, const char *help, json_t *counts,
                     const char *const *states)
{
    fprintf(f, "# HELP %s %s\n# TYPE %s gauge\n", name, help, name);
    for (const char *const *s = states; *s; s++)
        state_line(f, name, counts, *s);
}

/* Cells by state: every state of util/cellstate.h, in its order. */
static void cells_by_state(FILE *f, json_t *counts)
{
    fputs("# HELP capd_cells Cells by state.\n# TYPE capd_cells gauge\n", f);
    for (unsigned i = 0; i < CELL_STATE_N; i++)
        state_line(f, "capd_cells", counts, cell_state_name((enum cell_state)i));
}

static const char *const alert_states[] = {"open", "acknowledged", "false_positive", "expected",
                                           NULL};

/*
 * Alerts by status, and the precision of the ones people marked: an
 * acknowledged or expected alert was a real change, a false_positive was
 * not (docs/history.md, "Alerts"). No precision line while none is
 * marked: a ratio of nothing is no figure.
 */
static void alert_metrics(FILE *f, struct store *s)
{
    json_t *a = NULL;
    if (store_alert_counts(s, &a) != 0)
        return;
    by_state(f, "capd_alerts", "Alerts along branches by status.", a, alert_states);
    long long real = json_integer_value(json_object_get(a, "acknowledged")) +
                     json_integer_value(json_object_get(a, "expected"));
    long long fp = json_integer_value(json_object_get(a, "false_positive"));
    fprintf(f,
            "# HELP capd_alerts_marked Alerts marked acknowledged, expected or false_positive.\n"
            "# TYPE capd_alerts_marked gauge\ncapd_alerts_marked %lld\n",
            real + fp);
    if (real + fp > 0)
        fprintf(f,
                "# HELP capd_alert_precision Of the marked alerts, the share that were real "
                "changes: (acknowledged + expected) / (acknowledged + expected + "
                "false_positive).\n# TYPE capd_alert_precision gauge\ncapd_alert_precision %.6g\n",
                (double)real / (double)(real + fp));
    json_decref(a);
}

enum MHD_Result api_metrics(struct api_req *r)
{
    char *buf = NULL;
    size_t len = 0;
    json_t *counts = NULL;
    struct store *s = api_store(r);
    int rc = store_state_counts(s, &counts);
    FILE *f = open_memstream(&buf, &len);
    if (!f) {
        json_decref(counts);
        return api_error(r, 500, "internal", NULL, "out of memory");
    }
    fprintf(f,
            "# HELP capd_build_info The running capd.\n# TYPE capd_build_info gauge\n"
            "capd_build_info{version=\"%s\"} 1\n"
            "# HELP capd_store_up Whether the database answered this scrape.\n"
            "# TYPE capd_store_up gauge\ncapd_store_up %d\n",
            CAPD_VERSION, rc == 0);
    if (rc == 0) {
        json_t *cells = json_object_get(counts, "cells");
        by_state(f, "capd_jobs", "Jobs by state.", json_object_get(counts, "jobs"), job_states);
        cells_by_state(f, cells);
        fprintf(
            f,
            "# HELP capd_queue_depth Cells waiting for a child.\n"
            "# TYPE capd_queue_depth gauge\ncapd_queue_depth %lld\n",
            (long long)json_integer_value(json_object_get(cells, cell_state_name(CELL_QUEUED))));
        alert_metrics(f, s);
    }
    fprintf(f,
            "# HELP capd_running_children Cells with a live child process.\n"
            "# TYPE capd_running_children gauge\ncapd_running_children %u\n",
            capd_running_cells(api_daemon(r)));
    struct store_errors e;
    store_errors_get(&e);
    fprintf(f,
            "# HELP capd_sqlite_errors_total SQLite calls that failed, by class (storage "
            "faults; a duplicate name is counted in capd_store_conflicts_total).\n"
            "# TYPE capd_sqlite_errors_total counter\n"
            "capd_sqlite_errors_total{kind=\"busy\"} %llu\n"
            "capd_sqlite_errors_total{kind=\"constraint\"} %llu\n"
            "capd_sqlite_errors_total{kind=\"nomem\"} %llu\n"
            "capd_sqlite_errors_total{kind=\"io\"} %llu\n"
            "capd_sqlite_errors_total{kind=\"other\"} %llu\n",
            (unsigned long long)e.busy, (unsigned long long)e.constraint,
            (unsigned long long)e.nomem, (unsigned long long)e.io, (unsigned long long)e.other);
    /* A client's conflict (409: a build or job key that exists) is not a
     * storage error: an alert on capd_sqlite_errors_total must not fire
     * because a CI script registered its build twice. */
    fprintf(f,
            "# HELP capd_store_conflicts_total Writes refused because what they name already "
            "exists (UNIQUE or PRIMARY KEY; answered 409, a client error).\n"
            "# TYPE capd_store_conflicts_total counter\n"
            "capd_store_conflicts_total %llu\n",
            (unsigned long long)e.conflict);
    devices_metrics(capd_devices(api_daemon(r)), f);
    metrics_write(f);
    json_decref(counts);
    if (fclose(f) != 0 || !buf) {
        free(buf);
        return api_error(r, 500, "internal", NULL, "the metrics could not be rendered");
    }
    return api_text(r, 200, "text/plain; version=0.0.4; charset=utf-8", buf, len);
}
