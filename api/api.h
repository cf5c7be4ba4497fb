/*
 * api/api.h - the HTTP front end (REST API v1) on libmicrohttpd.
 *
 * Threading: MHD's internal thread pool over epoll (http_threads workers).
 * Each worker thread opens its own SQLite connection on first use and
 * closes it when the thread exits; nothing is shared between threads but the
 * daemon's thread-safe notify calls. See docs/architecture.md.
 */
#ifndef CAPD_API_H
#define CAPD_API_H

#include "daemon/capd.h"

struct api;

/* Binds and starts serving; *port gets the bound port (useful with 0). */
int api_start(struct capd *d, struct api **out, int *port, char **err);
/* Stops accepting new connections; in-flight requests continue. */
void api_quiesce(struct api *a);
/* Requests currently being served. */
unsigned api_inflight(struct api *a);
/* Stops the server (joins its threads) and frees it. */
void api_stop(struct api *a);

#endif
