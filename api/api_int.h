/* api/api_int.h - what the endpoint files of api/ share. */
#ifndef CAPD_API_INT_H
#define CAPD_API_INT_H

#include <jansson.h>
#include <microhttpd.h>
#include <stdbool.h>

#include "api/api.h"
#include "storage/store.h"
#include "util/buf.h"

#define API_MAX_SEGS 8
/* Distinct query keys one request's handler decodes; extra reply headers. */
#define API_MAX_QUERY_KEYS 24
#define API_MAX_XHDR       4

struct api_req {
    struct api *api;
    struct MHD_Connection *conn;
    const char *method;
    const char *url;
    int nseg;
    char *seg[API_MAX_SEGS]; /* URL path segments, percent-decoded */
    struct ubuf body;        /* at most its route's limit (body.max); NULL p until a byte */
    bool too_large;          /* the body passed that limit: 413 once it has arrived */
    int nq;
    /* Decoded query values handed out by api_query, one per key asked for
     * (a handler asks for a fixed set of keys: API_MAX_QUERY_KEYS bounds
     * it, and a handler past it is logged as the bug it is). */
    struct {
        const char *key;
        char *value;
    } qcache[API_MAX_QUERY_KEYS];
    bool counted;
    int pass; /* access-handler calls so far */
    /* Who is asking (api/auth.c): set on the first access-handler call. */
    int scope;         /* enum store_scope granted to this request */
    int auth_rc;       /* 0, or why the presented token was refused */
    bool has_token;    /* an Authorization header was presented */
    bool replied;      /* a reply was queued before the body was read */
    bool handled;      /* its handler has run (again only on a live route) */
    char token_id[16]; /* "" when no token (or auth disabled) */
    /* A remote attempt's worker (/v1/attempts/..., api/api_attempts.c):
     * its token's check (0, -ESTALE, -EKEYEXPIRED) and the attempt. */
    int attempt_rc;
    struct store_attempt_ref att;
    /* Extra headers for the next reply (WWW-Authenticate, Retry-After). */
    int nxhdr;
    char xhdr[API_MAX_XHDR][2][96];
    /* ETags, live updates and metrics (api/etag.c, api/live_int.h). */
    int route; /* index in server.c's routes[], found on the first call; -1: none */
    const char *route_method, *route_pattern;
    unsigned status;          /* status of the reply queued; 0: none yet */
    uint64_t t0_ns;           /* arrival (CLOCK_MONOTONIC), for the latency */
    char etag[64];            /* quoted; sent with a 2xx reply when set */
    bool etag_body;           /* derive the ETag from the reply body */
    struct live_waiter *poll; /* a long-poll in progress (api/api_jobs_live.c) */
};

/* An endpoint's handler: it answers R and returns the MHD_Result of
 * queueing its reply. The endpoints are declared below through this type
 * and defined with its signature written out; server.c's route table
 * holds api_handler pointers to them. */
typedef enum MHD_Result api_endpoint(struct api_req *r);
typedef api_endpoint *api_handler;

struct capd *api_daemon(struct api_req *r);
int api_bound_port(struct api_req *r);
const struct capd_config *api_cfg(struct api_req *r);

/* The calling worker thread's own connection (opened on first use). */
struct store *api_store(struct api_req *r);
/* The same, for code that runs on a worker thread without a request at
 * hand (an event stream's content reader). */
struct store *api_thread_store(const struct capd_config *cfg);

/* Replies. Every error reaching a client goes through api_error:
 * {"error":{"code","message","field"}} with the right status. */
enum MHD_Result api_json(struct api_req *r, unsigned status, json_t *body /* stolen */);
enum MHD_Result api_error(struct api_req *r, unsigned status, const char *code, const char *field,
                          const char *fmt, ...) __attribute__((format(printf, 5, 6)));
enum MHD_Result api_text(struct api_req *r, unsigned status, const char *ctype, char *body,
                         size_t len /* body is malloc'd and stolen */);
/* Adds a header to the next reply of R (at most two; names and values of
 * at most 95 bytes). */
void api_reply_header(struct api_req *r, const char *name, const char *value);
/* Maps a store error to a reply (404 for -ENOENT with WHAT named, ...;
 * -ENOSPC, storage unavailable, is 503 storage_unavailable with
 * Retry-After: API_STORAGE_RETRY_AFTER_S). */
enum MHD_Result api_store_error(struct api_req *r, int rc, const char *what);
/* The reply to a store call that returned RC and filled OUT (taken): OUT
 * with 200, or api_store_error's about WHAT. */
enum MHD_Result api_store_reply(struct api_req *r, int rc, const char *what, json_t *out);
/* api_store_reply for a read that has no cheap version: a 200 gets the
 * ETag of its body (api_etag_by_body), so a client may revalidate it. */
enum MHD_Result api_store_reply_etag(struct api_req *r, int rc, const char *what, json_t *out);
/* The reply to GET of one WHAT named by the path parameter PARAM, which
 * GET reads from the store. */
enum MHD_Result api_store_get(struct api_req *r,
                              int (*get)(struct store *s, const char *key, json_t **out),
                              const char *param, const char *what);
/* The path segment the matched route names ":NAME" (percent-decoded). */
const char *api_param(struct api_req *r, const char *name);
#define API_STORAGE_RETRY_AFTER_S "10"

/* Parses the body as a JSON object; on failure it has already replied and
 * returns NULL with *ret set. */
json_t *api_body_object(struct api_req *r, enum MHD_Result *ret);
const char *api_query(struct api_req *r, const char *key);
const char *api_header(struct api_req *r, const char *key);

/* Validation helpers shared by endpoints (api/check.c). */
bool api_valid_name(const char *s, size_t max);            /* ^[A-Za-z0-9._-]{1,max}$ */
bool api_valid_hex(const char *s, size_t min, size_t max); /* hex digits only */
bool api_valid_text(const char *s, size_t max); /* UTF-8 checked by jansson; no controls */
/* Whether the JSON array of strings LIST holds S (api/api_filter.c). */
bool api_in_list(json_t *list, const char *s);

/* Whether R's route may hold its connection open, waiting (the route
 * table's LIVE: GET /v1/events, the ?wait= long-poll of GET /v1/jobs/{id}). */
bool api_route_live(const struct api_req *r);

/* What a route needs of its caller: the route table (api/server.c) says it
 * for each route, api_scope_refused maps it to a token scope under the
 * config. A new route states its access; nothing falls to one by accident. */
enum api_access {
    API_OPEN,    /* nobody's data: /healthz, the dashboard's files */
    API_READ,    /* scope read, or none with public_reads */
    API_METRICS, /* scope read, or none with metrics_public */
    API_SUBMIT,  /* scope submit: jobs, bisections and their cancels */
    API_ADMIN,   /* scope admin: builds changed, tokens, branches, alerts, devices */
    API_WORKER,  /* an attempt's own token, checked before (api_attempt_auth_refused) */
};
/* Authentication and scopes (api/auth.c), both on the first access-handler
 * call, once the route is known and before any body is read.
 * api_auth_refused identifies the caller by the token ACCESS (the route's)
 * calls for, an attempt's own for API_WORKER, else an API token, and
 * refuses at once (401) a write without a valid one. api_scope_refused
 * then checks that the token's scope allows ACCESS. Like every helper here
 * that takes enum MHD_Result *RET, they return true when they have replied
 * (RET is what the handler returns), false to go on. */
bool api_auth_refused(struct api_req *r, enum api_access access, enum MHD_Result *ret);
bool api_scope_refused(struct api_req *r, enum api_access access, enum MHD_Result *ret);
/* The Host and Origin checks (api/host.c), before anything else: a Host
 * capd was not told it has is 421, a write from a foreign Origin 403. */
bool api_host_refused(struct api_req *r, enum MHD_Result *ret);
/* For POST /v1/jobs/{id}/cancel: a submit token may cancel only the jobs it
 * created; admin may cancel any (403 otherwise). */
bool api_cancel_refused(struct api_req *r, const char *job_id, enum MHD_Result *ret);

/* The job-request validator, without HTTP (api/api_jobs.c): checks BODY
 * completely against BUILD (the registered build named by body.build, or
 * NULL when there is none) and CFG. On success *normalized gets the request
 * to store (defaults filled) and 0 is returned; on failure -EINVAL and ERR
 * says what (every such error is a 400). */
struct api_verr {
    const char *code; /* stable machine-readable code: invalid_field, ... */
    bool has_field;   /* field is meaningful (it may be "": a key named "") */
    char field[160];
    char message[1024];
};
int api_validate_job_request(json_t *body, json_t *build, const struct capd_config *cfg,
                             json_t **normalized, struct api_verr *err);
/* Fills E (a 400) and returns false: for validators' one-line failures. */
bool api_verr_set(struct api_verr *e, const char *code, const char *field, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));
/* Whether S (NULL: no) is one of SET, a NULL-terminated list of words
 * (api/check.c). */
bool api_one_of(const char *s, const char *const *set);
/* Whether every member of the object BODY is named in FIELDS (NULL-
 * terminated), so that a misspelt field fails the request instead of being
 * ignored; fills E (unknown_field, naming it) and returns false otherwise. */
bool api_verr_fields_known(struct api_verr *e, json_t *body, const char *const *fields);
/* A list's ?limit= into *OUT: DFLT when absent, else an integer in [1,
 * MAX]; anything else is refused with a 400 invalid_query naming "limit". */
bool api_limit_refused(struct api_req *r, int dflt, int max, int *out, enum MHD_Result *ret);
/* Cell options (api/api_options.c, schema/options.json): whether a job may
 * set option K; and O's integer and enum options checked into OUT, every
 * one the job leaves out at its default (-EINVAL with ERR). */
bool api_option_known(const char *k);
int api_options_resolve(json_t *o, json_t *out, struct api_verr *err);

/* A job request's commit_time and parents, checked and copied into NORM
 * (api/api_history.c); -EINVAL with ERR filled. */
int api_history_order(json_t *body, json_t *norm, struct api_verr *err);

/* Endpoints, one declaration a file, in this order: api/api_meta.c,
 * api/api_builds.c, api/api_jobs.c (jobs and their cells),
 * api/api_selfcheck.c (the width and mode self-checks), api/api_compare.c
 * (comparisons, branches and commits), api/auth.c
 * (tokens), api/api_devices.c, api/api_events.c, api/api_metrics.c,
 * api/api_history.c (history and alerts), api/api_bisect.c,
 * api/api_attempts.c (a remote attempt's worker) and api/api_static.c. */
api_endpoint api_healthz, api_models, api_widths, api_host;
api_endpoint api_builds_list, api_builds_create, api_builds_get, api_builds_put;
api_endpoint api_jobs_create, api_jobs_list, api_jobs_get, api_jobs_cancel, api_cell_get,
    api_cell_records, api_cell_log;
api_endpoint api_jobs_widths, api_jobs_modes;
api_endpoint api_cell_replay, api_cell_replay_get, api_cell_repro; /* api/api_replay.c */
api_endpoint api_cell_compiler_bisect;                             /* api/api_compbisect.c */
api_endpoint api_compare, api_branch_put, api_branch_get, api_commit_get, api_commit_diff;
api_endpoint api_tokens_list, api_tokens_create, api_tokens_revoke;
api_endpoint api_devices_list, api_devices_refresh;
api_endpoint api_events;
api_endpoint api_metrics;
api_endpoint api_history_get, api_alerts_list, api_alert_post;
api_endpoint api_bisect_create, api_bisect_list, api_bisect_get, api_bisect_cancel;
api_endpoint api_attempt_spec, api_attempt_frames, api_attempt_log, api_attempt_finish;
api_endpoint api_static_index, api_static_file;
/* A request to /v1/attempts/... (api/api_attempts.c): its attempt token is
 * checked before the body is read (401 without a valid one, whatever
 * auth_required says). */
bool api_attempt_auth_refused(struct api_req *r, enum MHD_Result *ret);

/* ETags (api/etag.c). api_set_etag formats the opaque part (quotes are
 * added); api_if_none_match tells whether the request's If-None-Match
 * matches r->etag; api_not_modified replies 304 with it. The
 * api_not_modified_* hooks sit at the top of GET handlers: they set r->etag
 * from a version that is cheap to read and return true, having replied 304,
 * when the client's copy is current; false means "build the body" (or, when
 * they could not read a version, "answer as usual", without an ETag). */
void api_set_etag(struct api_req *r, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
bool api_if_none_match(struct api_req *r);
enum MHD_Result api_not_modified(struct api_req *r);
/* COUNTER: "jobs" for job lists, "builds" for the build list. */
bool api_not_modified_counter(struct api_req *r, const char *counter, enum MHD_Result *ret);
/* GET /v1/jobs/{id}/cells/{cell}: the job's version. */
bool api_not_modified_cell(struct api_req *r, enum MHD_Result *ret);
/* A comparison of CTL and HEAD (job objects); EXTRA is what the endpoint
 * adds to the result (may be NULL). */
bool api_not_modified_compare(struct api_req *r, json_t *ctl, json_t *head, json_t *extra,
                              enum MHD_Result *ret);
/* No cheap version: the ETag is a hash of the 200 body (send_buf). */
void api_etag_by_body(struct api_req *r);
bool api_etag_body_match(struct api_req *r, const char *body, size_t len);

/* HTTPS (api/tls.c): the PEM text of cfg's tls_cert and tls_key into *CERT
 * and *KEY (malloc'd; NULL on failure), each checked to hold what its name
 * says; 0 or a negative errno with ERR naming the file. api_tls_free frees
 * them, the key wiped first. */
int api_tls_load(const struct capd_config *cfg, char **cert, char **key, char **err);
void api_tls_free(char *cert, char *key);

/* Live updates (api/live_int.h): the notifier thread (api/api_live.c),
 * GET /v1/events (api/api_events.c) and the long-poll (api/api_jobs_live.c).
 * api_jobs_live_replied is the front half of GET /v1/jobs/{id} (ETag, 304,
 * ?wait=N, the rendered-body cache): true when it has replied or suspended
 * the request, false when the handler should answer. */
struct live_waiter;
int api_live_start(const struct capd_config *cfg);
void api_live_close(void); /* ends streams, answers long-polls, refuses new ones */
void api_live_stop(void);  /* close, then stop the notifier thread */
void api_live_free(void);  /* after MHD has stopped */
void api_live_request_done(struct api_req *r);
bool api_jobs_live_replied(struct api_req *r, enum MHD_Result *ret);

/* A comparison's filters (api/api_filter.c). FIELD is the query
 * parameter as the client named it, DIM the cell column it filters. */
struct api_filter {
    const char *field, *dim, *value; /* VALUE NULL or "": not given */
};
/* Each given filter must match a cell of CTL or HEAD (and a width must be
 * in the width table); else replies 400 naming the values that exist and
 * returns true. */
bool api_filters_refused(struct api_req *r, struct store *s, json_t *ctl, json_t *head,
                         const struct api_filter *f, size_t n, enum MHD_Result *ret);
/* The 400 for a comparison that paired no cell at all. */
enum MHD_Result api_no_cells(struct api_req *r, json_t *result, const struct api_filter *f,
                             size_t n);

/* What the comparison endpoints (api/api_compare.c) share with the
 * self-checks (api/api_selfcheck.c). */
struct cmp_options;
/* A job id, or a commit (its newest finished job), into *JOB (owned); a
 * missing REF is 400 missing_query, an unknown one 404, a commit whose jobs
 * have not finished 409 pending, each naming FIELD. */
bool api_job_ref_refused(struct api_req *r, struct store *s, const char *ref, const char *field,
                         json_t **job, enum MHD_Result *ret);
/* HEAD's control job (its control_commit, else its branch's) into *CTL and,
 * when EXTRA is not NULL, {control_source, control_commit} into *EXTRA;
 * false, having replied (404 no_control, or as api_job_ref_refused), when
 * there is none. */
bool api_control_of(struct api_req *r, struct store *s, json_t *head, json_t **ctl, json_t **extra,
                    enum MHD_Result *ret);
/* Whether the job has ended (done or cancelled): only then is it compared. */
bool api_job_finished(json_t *job);
/* {job, commit, branch, build, state, finished_at} of a job object. */
json_t *api_job_summary(json_t *job);
/* The job's own comparison options onto O: its option "reference" and its
 * "compare" thresholds (400 invalid_field naming options.compare). */
bool api_job_options_refused(struct api_req *r, json_t *job, struct cmp_options *o,
                             enum MHD_Result *ret);
/* A report's format: ?format=json|md|text, else Markdown when Accept names
 * text/markdown, else JSON; another format is 400 invalid_query. */
enum api_format { API_FORMAT_JSON, API_FORMAT_MD, API_FORMAT_TEXT };
bool api_format_refused(struct api_req *r, enum api_format *fmt, enum MHD_Result *ret);
/* 200 with REPORT (malloc'd, taken) as Markdown or text; NULL (it could not
 * be rendered) is a 500. */
enum MHD_Result api_report_reply(struct api_req *r, enum api_format fmt, char *report);
/* The cells of a comparison, loaded once and compared as often as asked:
 * CTL's cells, and HEAD's when the head is another job (NULL: two widths
 * of CTL's one job), with the payloads the engine borrows. */
struct api_cmp_input {
    struct cmp_side *ctl, *head;
    struct store_payloads *pl;
};
/* Loads the cells of job objects CTL and HEAD (the same object: one job)
 * that F lets through into IN (zeroed); api_cmp_input_free frees it, also
 * after a failure. 0 or a negative errno. */
int api_cmp_load(struct store *s, json_t *ctl, json_t *head, const struct store_cell_filter *f,
                 struct api_cmp_input *in);
/* cmp_compare of IN under O, with the CPU kernel of each first divergent
 * op named from the table and HEAD's (the head job's) provenance. */
int api_cmp_run(const struct api_cmp_input *in, json_t *head, const struct cmp_options *o,
                json_t **result);
void api_cmp_input_free(struct api_cmp_input *in);
/* The reply to a comparison that failed with RC: 400 for options the
 * engine refused (-EINVAL), else 500. */
enum MHD_Result api_cmp_failed(struct api_req *r, int rc);

/* GET /v1/jobs/{id}/widths and /modes (api/api_selfcheck.c): the result
 * of the self-check along AXIS ("width" or "mode") rendered as Markdown or
 * text (api/api_selfcheck_render.c); NULL when memory runs out. */
char *api_selfcheck_render(const json_t *check, const char *axis, bool md);

#endif
