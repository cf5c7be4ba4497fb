/* api/api_int.h - what the endpoint files of api/ share. */
#ifndef CAPD_API_INT_H
#define CAPD_API_INT_H

#include <jansson.h>
#include <microhttpd.h>
#include <stdbool.h>

#include "api/api.h"
#include "storage/store.h"

#define API_MAX_SEGS 8

struct api_req {
    struct api *api;
    struct MHD_Connection *conn;
    const char *method;
    const char *url;
    int nseg;
    char *seg[API_MAX_SEGS]; /* URL path segments, percent-decoded */
    char *body;
    size_t body_len, body_cap;
    bool too_large;
    bool counted;
    int pass; /* access-handler calls so far */
};

typedef enum MHD_Result (*api_handler)(struct api_req *r);

struct capd *api_daemon(struct api_req *r);
const struct capd_config *api_cfg(struct api_req *r);

/* The calling worker thread's own connection (opened on first use). */
struct store *api_store(struct api_req *r);

/* Replies. Every error reaching a client goes through api_error:
 * {"error":{"code","message","field"}} with the right status. */
enum MHD_Result api_json(struct api_req *r, unsigned status, json_t *body /* stolen */);
enum MHD_Result api_error(struct api_req *r, unsigned status, const char *code,
                          const char *field, const char *fmt, ...)
    __attribute__((format(printf, 5, 6)));
enum MHD_Result api_text(struct api_req *r, unsigned status, const char *ctype, char *body,
                         size_t len /* body is malloc'd and stolen */);
/* Maps a store error to a reply (404 for -ENOENT with WHAT named, ...). */
enum MHD_Result api_store_error(struct api_req *r, int rc, const char *what);

/* Parses the body as a JSON object; on failure it has already replied and
 * returns NULL with *ret set. */
json_t *api_body_object(struct api_req *r, enum MHD_Result *ret);
const char *api_query(struct api_req *r, const char *key);
const char *api_header(struct api_req *r, const char *key);

/* Validation helpers shared by endpoints. */
bool api_valid_name(const char *s, size_t max);          /* ^[A-Za-z0-9._-]{1,max}$ */
bool api_valid_hex(const char *s, size_t min, size_t max); /* hex digits only */
bool api_valid_text(const char *s, size_t max);           /* UTF-8 checked by jansson; no controls */

/* Endpoints, one file each group. */
enum MHD_Result api_healthz(struct api_req *r);
enum MHD_Result api_models(struct api_req *r);
enum MHD_Result api_widths(struct api_req *r);
enum MHD_Result api_builds_list(struct api_req *r);
enum MHD_Result api_builds_create(struct api_req *r);
enum MHD_Result api_builds_get(struct api_req *r);
enum MHD_Result api_builds_put(struct api_req *r);
enum MHD_Result api_jobs_create(struct api_req *r);
enum MHD_Result api_jobs_list(struct api_req *r);
enum MHD_Result api_jobs_get(struct api_req *r);
enum MHD_Result api_jobs_cancel(struct api_req *r);
enum MHD_Result api_cell_get(struct api_req *r);
enum MHD_Result api_cell_records(struct api_req *r);
enum MHD_Result api_cell_log(struct api_req *r);
enum MHD_Result api_compare(struct api_req *r);
enum MHD_Result api_branch_put(struct api_req *r);
enum MHD_Result api_branch_get(struct api_req *r);
enum MHD_Result api_commit_get(struct api_req *r);
enum MHD_Result api_commit_diff(struct api_req *r);

#endif
