/*
 * daemon/capd.h - the daemon: one libuv loop on the main thread that owns
 * signals, timers, the scheduler, every cell's child process and the ingest
 * writer's SQLite connection.
 *
 * HTTP threads talk to it only through the capd_notify_* calls, which are
 * thread-safe and never block: they queue a message and wake the loop with
 * uv_async_send.
 */
#ifndef CAPD_CAPD_H
#define CAPD_CAPD_H

#include "daemon/config/config.h"

struct capd;

/* What the loop calls when a shutdown signal arrives, so the HTTP front end
 * (which depends on the daemon, not the other way round) can quiesce. */
struct capd_http_hooks {
    void *ud;
    void (*quiesce)(void *ud);      /* stop accepting connections */
    unsigned (*inflight)(void *ud); /* requests still being served */
    void (*stop)(void *ud);         /* stop the HTTP server */
};

int capd_new(const struct capd_config *cfg, struct capd **out, char **err);
void capd_set_http_hooks(struct capd *d, const struct capd_http_hooks *h);
/* Runs until SIGTERM/SIGINT (or capd_stop) and a clean shutdown. */
int capd_run(struct capd *d);
void capd_free(struct capd *d);
const struct capd_config *capd_cfg(const struct capd *d);
/* The port the HTTP server bound (listen port 0 picks one), set once it
 * listens and before capd_run: what remote workers are told to reach. */
void capd_set_bound_port(struct capd *d, int port);

/* Thread-safe wake-ups from HTTP handlers. */
void capd_notify_work(struct capd *d);
void capd_notify_cancel(struct capd *d, const char *job_id);

/* The GPUs (daemon/host/devices.h: its readers are thread-safe), and a
 * thread-safe request to run the GPU probe again. */
struct devices *capd_devices(struct capd *d);
void capd_notify_devices_refresh(struct capd *d);

/* Number of cells with a live child right now (for /healthz and metrics);
 * read without a lock, so only approximately current. */
unsigned capd_running_cells(const struct capd *d);

#endif
