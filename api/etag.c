/*
 * api/etag.c - ETags and If-None-Match for the GET endpoints.
 *
 * Each ETag is made from a version that is cheaper to read than the body it
 * stands for, so a matching If-None-Match is answered 304 before the body
 * is built: a job's version column (bumped by triggers on every change to
 * the job or its cells), the "jobs"/"builds" collection counters, and for
 * a comparison both jobs' versions, the payload counter and everything in
 * the request that shapes the result. Where no such version exists (a
 * cell's records) the ETag is a hash of the body, which still saves the
 * transfer. Versions are read before the body, so an ETag is never newer
 * than the body it is sent with.
 *
 * The ETag goes out only on 2xx replies (server.c's send_buf), with
 * Cache-Control: no-cache so browsers revalidate instead of reusing.
 */
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "api/api_int.h"

#define FNV_OFFSET 1469598103934665603ULL
#define FNV_PRIME  1099511628211ULL

static uint64_t fnv(uint64_t h, const char *p, size_t n)
{
    for (size_t i = 0; i < n; i++)
        h = (h ^ (unsigned char)p[i]) * FNV_PRIME;
    return h;
}

static uint64_t fnv_str(uint64_t h, const char *s)
{
    /* The terminating 0 separates fields, so "ab"+"c" differs from "a"+"bc". */
    return s ? fnv(h, s, strlen(s) + 1) : fnv(h, "\xff", 1);
}

void api_set_etag(struct api_req *r, const char *fmt, ...)
{
    char tag[sizeof r->etag - 2];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(tag, sizeof tag, fmt, ap);
    va_end(ap);
    snprintf(r->etag, sizeof r->etag, "\"%s\"", tag);
}

/* If-None-Match: "*" or a comma-separated list of entity tags, each
 * possibly weak (W/"..."); the comparison is the weak one (RFC 9110
 * 13.1.2), on the opaque part between the quotes. */
bool api_if_none_match(struct api_req *r)
{
    const char *h = api_header(r, "If-None-Match");
    const char *mine = r->etag;
    size_t mlen = strlen(mine);
    if (!h || !mlen)
        return false;
    for (const char *p = h; *p;) {
        while (*p == ' ' || *p == '\t' || *p == ',')
            p++;
        if (!*p)
            break;
        if (*p == '*')
            return true;
        if (p[0] == 'W' && p[1] == '/')
            p += 2;
        const char *e = p;
        if (*p == '"') {
            e = strchr(p + 1, '"');
            e = e ? e + 1 : p + strlen(p);
        } else {
            while (*e && *e != ',')
                e++;
        }
        if ((size_t)(e - p) == mlen && memcmp(p, mine, mlen) == 0)
            return true;
        p = e;
    }
    return false;
}

enum MHD_Result api_not_modified(struct api_req *r)
{
    static char empty[] = "";
    struct MHD_Response *resp = MHD_create_response_from_buffer(0, empty, MHD_RESPMEM_PERSISTENT);
    if (!resp)
        return MHD_NO;
    MHD_add_response_header(resp, "ETag", r->etag);
    MHD_add_response_header(resp, "Cache-Control", "no-cache");
    r->status = 304;
    enum MHD_Result ret = MHD_queue_response(r->conn, 304, resp);
    MHD_destroy_response(resp);
    return ret;
}

static enum MHD_Result hash_arg(void *cls, enum MHD_ValueKind kind, const char *key,
                                const char *value)
{
    uint64_t *h = cls;
    (void)kind;
    *h = fnv_str(*h, key);
    *h = fnv_str(*h, value);
    return MHD_YES;
}

/* The path and every query argument, in the order sent. */
static uint64_t request_hash(struct api_req *r, uint64_t h)
{
    h = fnv_str(h, r->url);
    MHD_get_connection_values(r->conn, MHD_GET_ARGUMENT_KIND, hash_arg, &h);
    return h;
}

bool api_not_modified_counter(struct api_req *r, const char *counter, enum MHD_Result *ret)
{
    int64_t v = 0;
    struct store *s = api_store(r);
    if (!s || store_counter(s, counter, &v) != 0)
        return false; /* no ETag; the handler answers as it would */
    api_set_etag(r, "%c%lld-%016llx", counter[0], (long long)v,
                 (unsigned long long)request_hash(r, FNV_OFFSET));
    if (!api_if_none_match(r))
        return false;
    *ret = api_not_modified(r);
    return true;
}

bool api_not_modified_cell(struct api_req *r, enum MHD_Result *ret)
{
    int64_t v = 0;
    struct store *s = api_store(r);
    if (!s || store_job_version(s, api_param(r, "id"), &v, NULL) != 0)
        return false; /* the handler answers 404 or the error */
    api_set_etag(r, "%s.%lld-%016llx", api_param(r, "cell"), (long long)v,
                 (unsigned long long)request_hash(r, FNV_OFFSET));
    if (!api_if_none_match(r))
        return false;
    *ret = api_not_modified(r);
    return true;
}

void api_etag_by_body(struct api_req *r)
{
    r->etag_body = true;
}

bool api_etag_body_match(struct api_req *r, const char *body, size_t len)
{
    uint64_t h = fnv(FNV_OFFSET, body, len);
    api_set_etag(r, "b%016llx", (unsigned long long)h);
    return api_if_none_match(r);
}

bool api_not_modified_compare(struct api_req *r, json_t *ctl, json_t *head, json_t *extra,
                              enum MHD_Result *ret)
{
    struct store *s = api_store(r);
    int64_t vc = 0, vh = 0, payloads = 0;
    const char *ic = json_string_value(json_object_get(ctl, "id"));
    const char *ih = json_string_value(json_object_get(head, "id"));
    if (!s || !ic || !ih || store_job_version(s, ic, &vc, NULL) != 0 ||
        store_job_version(s, ih, &vh, NULL) != 0 || store_counter(s, "payloads", &payloads) != 0)
        return false;
    /* Whatever decides the bytes of the result: the engine's version, both
     * jobs as they are now, retention, the query, the Accept header (JSON
     * or Markdown) and what the endpoint adds (the control's source). */
    uint64_t h = fnv_str(FNV_OFFSET, CAPD_VERSION);
    char num[64];
    snprintf(num, sizeof num, "%s.%lld/%s.%lld/%lld", ic, (long long)vc, ih, (long long)vh,
             (long long)payloads);
    h = fnv_str(h, num);
    h = request_hash(r, h);
    h = fnv_str(h, api_header(r, "Accept"));
    if (extra) {
        char *x = json_dumps(extra, JSON_COMPACT | JSON_SORT_KEYS);
        h = fnv_str(h, x);
        free(x);
    }
    api_set_etag(r, "c%016llx", (unsigned long long)h);
    if (!api_if_none_match(r))
        return false;
    *ret = api_not_modified(r);
    return true;
}
