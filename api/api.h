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

#include <stdbool.h>

#include "daemon/capd.h"

struct api;

/* Binds and starts serving; *port gets the bound port (useful with 0).
 * With tls_cert/tls_key configured it serves HTTPS only (GnuTLS through
 * libmicrohttpd); a missing TLS feature, an unreadable or non-PEM file, or
 * a pair GnuTLS refuses is an error with a message naming the file. */
int api_start(struct capd *d, struct api **out, int *port, char **err);
/* Whether A serves HTTPS. */
bool api_tls(const struct api *a);
/* Stops accepting new connections; in-flight requests continue. */
void api_quiesce(struct api *a);
/* Requests currently being served. */
unsigned api_inflight(struct api *a);
/* Stops the server (joins its threads) and frees it. */
void api_stop(struct api *a);

#endif
