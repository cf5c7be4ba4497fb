/*
 * api/host.c - which names a request may address capd by (the Host
 * header), and which web pages may make it change anything (the Origin
 * header): the defence against DNS rebinding and cross-site requests.
 *
 * A page on evil.example whose name is made to resolve to 127.0.0.1 talks
 * to capd from the browser with `Host: evil.example:PORT`; refusing every
 * name capd was not told about (421, before the body is read or anything
 * is looked up) takes that away. The names accepted are the listen
 * address, localhost, 127.0.0.1 and [::1], each with capd's own port, plus
 * the config's allowed_hosts: "NAME" (any port, as behind a proxy),
 * "NAME:PORT" (that port only) or "*" (any Host: the check is off).
 *
 * A browser marks a request a page makes with the page's Origin. A write
 * (anything but GET, HEAD and OPTIONS) whose Origin is not one of the
 * accepted names is 403: the dashboard, served by capd itself, sends its
 * own origin; curl, capctl and CI send none. capd sends no CORS headers,
 * so no other origin can read a reply either.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "api/api_int.h"
#include "util/log.h"

/* Splits AUTH ("name", "name:port", "[v6]", "[v6]:port") into the host
 * (brackets kept, *HLEN bytes) and the port (DEF_PORT when absent). False
 * for an empty host or a port that is not 1..65535. */
static bool split_authority(const char *auth, int def_port, size_t *hlen, long *port)
{
    const char *end = auth + strlen(auth);
    const char *colon = NULL;
    if (auth[0] == '[') {
        const char *rb = strchr(auth, ']');
        if (!rb)
            return false;
        colon = rb[1] == ':' ? rb + 1 : NULL;
        if (!colon && rb[1])
            return false;
    } else {
        colon = strchr(auth, ':');
        if (colon && strchr(colon + 1, ':'))
            return false;
    }
    *hlen = (size_t)((colon ? colon : end) - auth);
    *port = def_port;
    if (colon) {
        char *e;
        *port = strtol(colon + 1, &e, 10);
        if (*e || e == colon + 1 || *port < 1 || *port > 65535)
            return false;
    }
    return *hlen > 0;
}

static bool host_is(const char *host, size_t hlen, const char *name, size_t nlen)
{
    return hlen == nlen && strncasecmp(host, name, hlen) == 0;
}

/* Whether AUTH, an authority whose port defaults to DEF_PORT, names capd. */
static bool authority_allowed(struct api_req *r, const char *auth, int def_port)
{
    const struct capd_config *cfg = api_cfg(r);
    size_t hlen;
    long port;
    if (!split_authority(auth, def_port, &hlen, &port))
        return false;
    const char *defaults[] = {cfg->listen_addr, "localhost", "127.0.0.1", "[::1]"};
    for (size_t i = 0; i < sizeof defaults / sizeof defaults[0]; i++)
        if (port == api_bound_port(r) && host_is(auth, hlen, defaults[i], strlen(defaults[i])))
            return true;
    for (int i = 0; i < cfg->allowed_hosts_n; i++) {
        const char *a = cfg->allowed_hosts[i];
        size_t alen;
        long aport;
        if (strcmp(a, "*") == 0)
            return true;
        bool has_port = a[0] == '[' ? strstr(a, "]:") != NULL : strchr(a, ':') != NULL;
        if (!split_authority(a, 0, &alen, &aport))
            continue;
        if (host_is(auth, hlen, a, alen) && (!has_port || aport == port))
            return true;
    }
    return false;
}

static bool is_write(const char *m)
{
    return strcmp(m, "GET") != 0 && strcmp(m, "HEAD") != 0 && strcmp(m, "OPTIONS") != 0;
}

/* The Origin of a browser request: "null" (an opaque origin) or
 * "scheme://authority"; only http and https can name capd. */
static bool origin_allowed(struct api_req *r, const char *origin)
{
    if (strncasecmp(origin, "http://", 7) == 0)
        return authority_allowed(r, origin + 7, 80);
    if (strncasecmp(origin, "https://", 8) == 0)
        return authority_allowed(r, origin + 8, 443);
    return false;
}

bool api_host_refused(struct api_req *r, enum MHD_Result *ret)
{
    const char *host = api_header(r, "Host");
    int def_port = api_tls(r->api) ? 443 : 80;
    if (!host || !authority_allowed(r, host, def_port)) {
        log_info("host_refused", "method=%s url=%s host=%s", r->method, log_q(r->url),
                 log_q(host ? host : "(none)"));
        *ret = api_error(r, 421, "misdirected_request", NULL,
                         "capd does not answer to Host '%s'; add the name to allowed_hosts "
                         "(docs/configuration.md) to reach it by that name",
                         host ? host : "(none)");
        r->replied = true;
        return true;
    }
    const char *origin = api_header(r, "Origin");
    if (origin && is_write(r->method) && !origin_allowed(r, origin)) {
        log_info("origin_refused", "method=%s url=%s origin=%s", r->method, log_q(r->url),
                 log_q(origin));
        *ret = api_error(r, 403, "forbidden_origin", NULL,
                         "a page from origin '%s' may not change anything here; capd accepts "
                         "writes from its own names only (allowed_hosts)",
                         origin);
        r->replied = true;
        return true;
    }
    return false;
}
