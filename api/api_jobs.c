/*
 * api/api_jobs.c - /v1/jobs: posting capture jobs, listing, reading,
 * cancelling, and the per-cell views (outcome, records, log).
 *
 * A job request is validated completely before anything is stored: every
 * field is known, typed and in range, the build is registered, every width
 * is in the width table and every model is a zoo name or a user model the
 * build allows. The stored request is the normalized one (defaults filled).
 */
#include <errno.h>
#include <fcntl.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "api/api_int.h"
#include "api/repro.h"
#include "compare/cmp.h"
#include "daemon/host/devices.h"
#include "daemon/host/memlimit.h"
#include "daemon/attempt/sup.h"
#include "daemon/cpu/widths.h"
#include "storage/layout.h"

#define JOB_MAX_LABELS    32
#define JOB_MAX_AXIS      64
#define JOB_RETRY_AFTER_S "30"

static const char *const passes[] = {"forward", "backward", NULL};
static const char *const mode_names[] = {"eager", "aot_eager", "inductor", NULL};

/* User models are "package.module:factory": importable names only, so no
 * path can be smuggled in; the runner also checks the module's file lies
 * under one of the build's model roots. */
static bool valid_user_model(const char *s)
{
    const char *colon = strchr(s, ':');
    if (!colon || strchr(colon + 1, ':'))
        return false;
    for (const char *c = s; *c; c++) {
        bool ident = (*c >= 'A' && *c <= 'Z') || (*c >= 'a' && *c <= 'z') ||
                     (*c >= '0' && *c <= '9') || *c == '_';
        if (c == s || c == colon + 1 || c[-1] == '.') {
            if (!ident || (*c >= '0' && *c <= '9'))
                return false;
        } else if (!ident && *c != '.' && c != colon) {
            return false;
        }
    }
    return colon > s && colon[1] && colon[-1] != '.' && strlen(s) <= 128;
}

/* Checks one matrix axis: a non-empty array of unique strings, each
 * accepted by CHECK. Fills E and returns false on bad input. */
static bool check_axis(struct api_verr *e, json_t *m, const char *axis, json_t *build)
{
    char field[64];
    snprintf(field, sizeof field, "matrix.%s", axis);
    json_t *a = json_object_get(m, axis);
    if (!json_is_array(a) || json_array_size(a) == 0 || json_array_size(a) > JOB_MAX_AXIS) {
        api_verr_set(e, "invalid_field", field,
                     "%s must be a non-empty array of at most %d strings", field, JOB_MAX_AXIS);
        return false;
    }
    size_t i, j;
    json_t *v, *w;
    json_array_foreach(a, i, v)
    {
        const char *s = json_string_value(v);
        if (!s) {
            api_verr_set(e, "invalid_field", field, "%s[%zu] must be a string", field, i);
            return false;
        }
        for (j = 0; j < i; j++) {
            w = json_array_get(a, j);
            if (strcmp(json_string_value(w), s) == 0) {
                api_verr_set(e, "duplicate", field, "%s lists '%s' twice", field, s);
                return false;
            }
        }
        if (strcmp(axis, "widths") == 0 && !width_env(s)) {
            api_verr_set(e, "invalid_field", field, "unknown width '%s' (see GET /v1/widths)", s);
            return false;
        }
        if (strcmp(axis, "passes") == 0 && !api_one_of(s, passes)) {
            api_verr_set(e, "invalid_field", field, "unknown pass '%s' (forward or backward)", s);
            return false;
        }
        if (strcmp(axis, "modes") == 0 && !api_one_of(s, mode_names)) {
            api_verr_set(e, "invalid_field", field,
                         "unknown mode '%s' (eager, aot_eager or inductor)", s);
            return false;
        }
        if (strcmp(axis, "models") == 0 && !model_in_zoo(s)) {
            if (!valid_user_model(s)) {
                api_verr_set(e, "invalid_field", field,
                             "unknown model '%s': not in the zoo (GET /v1/models) and not a "
                             "user model package.module:factory",
                             s);
                return false;
            }
            if (json_array_size(json_object_get(build, "model_roots")) == 0) {
                api_verr_set(e, "invalid_field", field,
                             "user model '%s' needs a build with model_roots; build '%s' "
                             "has none",
                             s, json_string_value(json_object_get(build, "name")));
                return false;
            }
        }
    }
    return true;
}

/* options.memory_max_bytes: a cell's memory limit below the daemon's
 * cell_memory_max_bytes (daemon/host/memlimit.h), never above it. */
static bool check_memory_option(struct api_verr *err, json_t *o, json_t *out, uint64_t max)
{
    json_t *x = json_object_get(o, "memory_max_bytes");
    if (!x)
        return true;
    json_int_t v = json_is_integer(x) ? json_integer_value(x) : -1;
    uint64_t top = max ? max : (uint64_t)INT64_MAX;
    if (v < (json_int_t)MEM_MIN_LIMIT || (uint64_t)v > top)
        return api_verr_set(
            err, "invalid_field", "options.memory_max_bytes",
            "options.memory_max_bytes must be an integer in [%llu, %llu] (this capd's "
            "cell_memory_max_bytes, GET /v1/host memory)",
            (unsigned long long)MEM_MIN_LIMIT, (unsigned long long)top);
    json_object_set(out, "memory_max_bytes", x);
    return true;
}

/* options.target_op: one op call (at granularity op) or one module's
 * forward call whose inputs and outputs the runner records in full
 * (api/api_replay.c). */
static bool check_target_op(struct api_verr *err, json_t *o, json_t *out)
{
    json_t *x = json_object_get(o, "target_op");
    if (!x)
        return true;
    enum api_target kind =
        json_is_string(x) ? api_target_kind(json_string_value(x)) : API_TARGET_NONE;
    if (kind == API_TARGET_NONE)
        return api_verr_set(err, "invalid_field", "options.target_op",
                            "options.target_op must name one op call, "
                            "<module>.<call>.<phase>/op.<aten name>.<n>, or one module's forward "
                            "call, <module>.<call>.forward, at most %d bytes",
                            API_TARGET_OP_MAX);
    const char *g = json_string_value(json_object_get(out, "granularity"));
    if (kind == API_TARGET_OP && (!g || strcmp(g, "op") != 0))
        return api_verr_set(err, "invalid_field", "options.target_op",
                            "options.target_op names an op call: it needs options.granularity op");
    json_object_set(out, "target_op", x);
    return true;
}

static json_t *validate_options(struct api_verr *err, json_t *o, uint64_t mem_max)
{
    const char *k;
    json_t *v;
    json_t *out = json_object();
    if (o && !json_is_object(o)) {
        api_verr_set(err, "invalid_field", "options", "options must be an object");
        goto bad;
    }
    json_object_foreach(o, k, v)
    {
        if (!api_option_known(k) && strcmp(k, "compare") && strcmp(k, "memory_max_bytes") &&
            strcmp(k, "target_op")) {
            char f[160];
            snprintf(f, sizeof f, "options.%s", k);
            api_verr_set(err, "unknown_field", f, "unknown option '%s'", k);
            goto bad;
        }
    }
    if (!check_memory_option(err, o, out, mem_max) || api_options_resolve(o, out, err) != 0 ||
        !check_target_op(err, o, out))
        goto bad;
    json_t *cmpo = json_object_get(o, "compare");
    if (cmpo) {
        /* Comparison thresholds for this job, checked now so a typo fails
         * the submission rather than every later comparison. */
        struct cmp_options co;
        struct cmp_err e = {{0}, {0}};
        cmp_options_init(&co);
        if (!json_is_object(cmpo) || cmp_options_apply_json(&co, cmpo, &e) != 0) {
            char f[200];
            snprintf(f, sizeof f, "options.compare%s%s", e.field[0] ? "." : "", e.field);
            api_verr_set(err, "invalid_field", f, "options.compare: %s",
                         e.message[0] ? e.message : "must be an object");
            goto bad;
        }
        json_object_set(out, "compare", cmpo);
    }
    return out;
bad:
    json_decref(out);
    return NULL;
}

static uint64_t fnv1a(const char *p, size_t n)
{
    uint64_t h = 1469598103934665603ULL;
    for (size_t i = 0; i < n; i++) {
        h ^= (unsigned char)p[i];
        h *= 1099511628211ULL;
    }
    return h;
}

/* The top level of a job request: an object of known fields only, so a
 * misspelt field fails the submission instead of being ignored. */
static bool check_job_fields(struct api_verr *err, json_t *body)
{
    static const char *const fields[] = {"project",        "commit",      "branch",  "build",
                                         "control_commit", "matrix",      "options", "labels",
                                         "provenance",     "commit_time", "parents", NULL};
    if (!json_is_object(body))
        return api_verr_set(err, "invalid_json", NULL, "the body must be a JSON object");
    return api_verr_fields_known(err, body, fields);
}

/* What the job captures: project, commits, branch and a registered build
 * (BUILD is NULL when it is not), checked in that order so the first bad
 * field is the one reported. */
static bool check_job_source(struct api_verr *err, json_t *body, json_t *build)
{
    const char *project = json_string_value(json_object_get(body, "project"));
    if (!api_valid_name(project, 128))
        return api_verr_set(err, "invalid_field", "project",
                            "project must match ^[A-Za-z0-9._-]{1,128}$");
    const char *commit = json_string_value(json_object_get(body, "commit"));
    if (!api_valid_hex(commit, 7, 64))
        return api_verr_set(err, "invalid_field", "commit", "commit must be 7 to 64 hex digits");
    json_t *cc = json_object_get(body, "control_commit");
    if (cc && !json_is_null(cc) && !api_valid_hex(json_string_value(cc), 7, 64))
        return api_verr_set(err, "invalid_field", "control_commit",
                            "control_commit must be 7 to 64 hex digits");
    json_t *br = json_object_get(body, "branch");
    if (br && !json_is_null(br) &&
        (!api_valid_text(json_string_value(br), 255) || strstr(json_string_value(br), "..")))
        return api_verr_set(
            err, "invalid_field", "branch",
            "branch must be a string of 1 to 255 printable characters without '..'");
    const char *bname = json_string_value(json_object_get(body, "build"));
    if (!api_valid_name(bname, 64))
        return api_verr_set(err, "invalid_field", "build", "build must name a registered build");
    if (!build)
        return api_verr_set(err, "unknown_build", "build",
                            "build '%s' is not registered (POST /v1/builds)", bname);
    return true;
}

/* The matrix: the three axes and optionally modes (eager when absent), each
 * valid, and a product no larger than the daemon's max_cells_per_job, so a
 * job never stores more cells than the scheduler will take. */
static bool check_job_matrix(struct api_verr *err, json_t *m, json_t *build, int max_cells)
{
    const char *k;
    json_t *v;
    if (!json_is_object(m))
        return api_verr_set(err, "invalid_field", "matrix",
                            "matrix must be an object with models, widths and passes (and "
                            "optionally modes)");
    json_object_foreach(m, k, v)
    {
        if (strcmp(k, "models") && strcmp(k, "widths") && strcmp(k, "passes") &&
            strcmp(k, "modes")) {
            char f[160];
            snprintf(f, sizeof f, "matrix.%s", k);
            return api_verr_set(err, "unknown_field", f, "unknown field '%s'", f);
        }
    }
    if (!check_axis(err, m, "models", build) || !check_axis(err, m, "widths", build) ||
        !check_axis(err, m, "passes", build) ||
        (json_object_get(m, "modes") && !check_axis(err, m, "modes", build)))
        return false;
    size_t nmodes = json_object_get(m, "modes") ? json_array_size(json_object_get(m, "modes")) : 1;
    size_t ncells = json_array_size(json_object_get(m, "models")) *
                    json_array_size(json_object_get(m, "widths")) *
                    json_array_size(json_object_get(m, "passes")) * nmodes;
    if (ncells > (size_t)max_cells)
        return api_verr_set(err, "too_many_cells", "matrix",
                            "the matrix expands to %zu cells; the limit is %d", ncells, max_cells);
    return true;
}

/* Labels (a bounded map of short strings) and provenance (any object):
 * free-form data the job carries but capd does not interpret. */
static bool check_job_labels(struct api_verr *err, json_t *labels, json_t *prov)
{
    const char *k;
    json_t *v;
    if (labels && (!json_is_object(labels) || json_object_size(labels) > JOB_MAX_LABELS))
        return api_verr_set(err, "invalid_field", "labels",
                            "labels must be an object of at most %d strings", JOB_MAX_LABELS);
    json_object_foreach(labels, k, v)
    {
        if (!api_valid_name(k, 64) || !json_is_string(v) || json_string_length(v) > 256)
            return api_verr_set(
                err, "invalid_field", "labels",
                "label '%s' must have a name like ^[A-Za-z0-9._-]{1,64}$ and a string value of "
                "at most 256 bytes",
                k);
    }
    if (prov && !json_is_object(prov))
        return api_verr_set(err, "invalid_field", "provenance", "provenance must be an object");
    return true;
}

/* The request as stored: every field present (null or empty where the
 * client left it out) and OPTS, the options with defaults filled in. */
static json_t *normalize_job(struct api_verr *err, json_t *body, json_t *opts)
{
    json_t *m = json_object_get(body, "matrix");
    json_t *br = json_object_get(body, "branch"), *cc = json_object_get(body, "control_commit");
    json_t *labels = json_object_get(body, "labels"), *prov = json_object_get(body, "provenance");
    json_t *modes = json_object_get(m, "modes");
    json_t *norm = json_pack(
        "{s:s,s:s,s:O,s:s,s:O,s:{s:O,s:O,s:O,s:o},s:O,s:o}", "project",
        json_string_value(json_object_get(body, "project")), "commit",
        json_string_value(json_object_get(body, "commit")), "branch", br ? br : json_null(),
        "build", json_string_value(json_object_get(body, "build")), "control_commit",
        cc ? cc : json_null(), "matrix", "models", json_object_get(m, "models"), "widths",
        json_object_get(m, "widths"), "passes", json_object_get(m, "passes"), "modes",
        modes ? json_incref(modes) : json_pack("[s]", "eager"), "options", opts, "labels",
        labels ? json_incref(labels) : json_object());
    if (!norm) {
        api_verr_set(err, "invalid_json", NULL, "the request could not be normalized");
        return NULL;
    }
    if (prov)
        json_object_set(norm, "provenance", prov);
    return norm;
}

/*
 * Everything about a job request that needs no HTTP and no database: the
 * caller looked the build up (BUILD is NULL when it is not registered).
 * Kept apart from the handler so the fuzzer (tests/fuzz/fuzz_job_request.c)
 * drives exactly the code that guards POST /v1/jobs. The stages run in the
 * order of the fields, and the first failure is the one reported.
 */
int api_validate_job_request(json_t *body, json_t *build, const struct capd_config *cfg,
                             json_t **normalized, struct api_verr *err)
{
    int rc = -EINVAL;
    json_t *opts = NULL, *norm = NULL;
    *normalized = NULL;
    if (!check_job_fields(err, body) || !check_job_source(err, body, build) ||
        !check_job_matrix(err, json_object_get(body, "matrix"), build, cfg->max_cells_per_job))
        goto out;
    if (!(opts =
              validate_options(err, json_object_get(body, "options"), cfg->cell_memory_max_bytes)))
        goto out;
    if (!check_job_labels(err, json_object_get(body, "labels"),
                          json_object_get(body, "provenance")))
        goto out;
    if (!(norm = normalize_job(err, body, opts)))
        goto out;
    if (api_history_order(body, norm, err) != 0) {
        json_decref(norm);
        goto out;
    }
    *normalized = norm;
    rc = 0;
out:
    json_decref(opts);
    return rc;
}

/* Looks up the build the request names into *BUILD (left NULL when the
 * name is malformed or not registered: the validator then says which);
 * true, having replied, when the store fails. */
static bool build_lookup_refused(struct api_req *r, json_t *body, json_t **build,
                                 enum MHD_Result *ret)
{
    const char *bname = json_string_value(json_object_get(body, "build"));
    if (!api_valid_name(bname, 64))
        return false;
    int rc = store_build_get(api_store(r), bname, build);
    if (rc && rc != -ENOENT) {
        *ret = api_store_error(r, rc, "build");
        return true;
    }
    return false;
}

/* A GPU job on a host without a GPU fails now, not cell by cell later.
 * This is the one check that needs the daemon, so it is not in the
 * validator. True, having replied, when it refuses NORM. */
static bool gpu_refused(struct api_req *r, json_t *norm, enum MHD_Result *ret)
{
    const char *device =
        json_string_value(json_object_get(json_object_get(norm, "options"), "device"));
    struct devices *dv = capd_devices(api_daemon(r));
    if (!device || strcmp(device, "gpu") != 0 || devices_count(dv) != 0)
        return false;
    json_t *dj = devices_json(dv);
    const char *why = json_string_value(json_object_get(dj, "reason"));
    *ret = api_error(r, 400, "no_gpu", "options.device",
                     "options.device is gpu but this capd has no GPU device (%s); see GET "
                     "/v1/devices, and POST /v1/devices/refresh after adding one",
                     why ? why : "no device found");
    json_decref(dj);
    return true;
}

/* The reply for a store_job_create failure RC. Both queue limits clear as
 * jobs finish; Retry-After is a hint, not a promise (a cell may run for
 * minutes). */
static enum MHD_Result job_create_error(struct api_req *r, int rc, const char *idem)
{
    if (rc == -EEXIST)
        return api_error(r, 409, "idempotency_conflict", "Idempotency-Key",
                         "Idempotency-Key '%s' was used for a different request", idem);
    if (rc == -EAGAIN) {
        api_reply_header(r, "Retry-After", JOB_RETRY_AFTER_S);
        return api_error(r, 429, "too_many_jobs", NULL,
                         "%d jobs are already queued or running; retry later",
                         api_cfg(r)->max_queued_jobs);
    }
    if (rc == -EDQUOT) {
        api_reply_header(r, "Retry-After", JOB_RETRY_AFTER_S);
        return api_error(r, 429, "too_many_jobs_for_token", NULL,
                         "token %s already has %d jobs queued or running "
                         "(max_queued_jobs_per_token); retry when one has finished",
                         r->token_id, api_cfg(r)->max_queued_jobs_per_token);
    }
    return api_store_error(r, rc, "job");
}

/* Stores the validated job request NORM under idempotency key IDEM (may be
 * NULL) and body hash HASH, within the queue's and the caller's token's
 * quotas: store_job_create's result, *JOB and *EXISTED. */
static int job_store(struct api_req *r, json_t *norm, const char *idem, const char *hash,
                     json_t **job, bool *existed)
{
    struct store_job_new n = {.request = norm,
                              .idem_key = idem,
                              .body_hash = hash,
                              .max_queued_jobs = api_cfg(r)->max_queued_jobs,
                              .token_id = r->token_id[0] ? r->token_id : NULL,
                              .max_queued_per_token = api_cfg(r)->max_queued_jobs_per_token};
    return store_job_create(api_store(r), &n, job, existed);
}

/* POST /v1/jobs: validate, check the host can run it, then store it under
 * its Idempotency-Key (a repeat of the same request answers 200 with the
 * job it created) and wake the scheduler. */
enum MHD_Result api_jobs_create(struct api_req *r)
{
    enum MHD_Result ret;
    struct api_verr verror = {0};
    json_t *body = api_body_object(r, &ret), *build = NULL, *norm = NULL;
    if (!body)
        return ret;
    if (build_lookup_refused(r, body, &build, &ret))
        goto out;
    if (api_validate_job_request(body, build, api_cfg(r), &norm, &verror) != 0) {
        ret = api_error(r, 400, verror.code, verror.has_field ? verror.field : NULL, "%s",
                        verror.message);
        goto out;
    }
    if (gpu_refused(r, norm, &ret))
        goto out;
    char hash[24];
    snprintf(hash, sizeof hash, "%016llx", (unsigned long long)fnv1a(r->body.p, r->body.len));
    const char *idem = api_header(r, "Idempotency-Key");
    if (idem && !api_valid_text(idem, 200)) {
        ret = api_error(r, 400, "invalid_header", "Idempotency-Key",
                        "Idempotency-Key must be 1 to 200 printable characters");
        goto out;
    }
    json_t *job = NULL;
    bool existed = false;
    int rc = job_store(r, norm, idem, hash, &job, &existed);
    if (rc) {
        ret = job_create_error(r, rc, idem);
        goto out;
    }
    if (!existed)
        capd_notify_work(api_daemon(r));
    ret = api_json(r, existed ? 200 : 201, job);
out:
    json_decref(body);
    json_decref(build);
    json_decref(norm);
    return ret;
}

static bool parse_cursor(const char *c, char prefix, int64_t *out)
{
    char *end;
    if (!c || c[0] != prefix)
        return false;
    long long v = strtoll(c + 1, &end, 10);
    if (*end || end == c + 1 || v < 0)
        return false;
    *out = v;
    return true;
}

enum MHD_Result api_jobs_list(struct api_req *r)
{
    static const char *const states[] = {"queued", "running", "done", "cancelled", NULL};
    enum MHD_Result ret;
    struct store_job_filter f = {0};
    f.commit = api_query(r, "commit");
    f.branch = api_query(r, "branch");
    f.build = api_query(r, "build");
    f.state = api_query(r, "state");
    f.project = api_query(r, "project");
    if (f.state && !api_one_of(f.state, states))
        return api_error(r, 400, "invalid_query", "state",
                         "state must be queued, running, done or cancelled");
    if (api_limit_refused(r, 50, 200, &f.limit, &ret))
        return ret;
    const char *c = api_query(r, "cursor");
    if (c && !parse_cursor(c, 's', &f.before_seq))
        return api_error(r, 400, "invalid_query", "cursor", "cursor is not one this server gave");
    if (api_not_modified_counter(r, "jobs", &ret))
        return ret;
    json_t *out = NULL;
    struct store *s = api_store(r);
    int rc = store_job_list(s, &f, &out);
    return api_store_reply(r, rc, "jobs", out);
}

enum MHD_Result api_jobs_get(struct api_req *r)
{
    enum MHD_Result ret;
    if (api_jobs_live_replied(r, &ret)) /* ETag, 304, ?wait=N long-poll */
        return ret;
    return api_store_get(r, store_job_get, "id", "job");
}

enum MHD_Result api_jobs_cancel(struct api_req *r)
{
    enum MHD_Result ret;
    if (api_cancel_refused(r, api_param(r, "id"), &ret))
        return ret;
    struct store *s = api_store(r);
    int rc = store_job_cancel(s, api_param(r, "id"));
    if (rc == -EALREADY)
        return api_error(r, 409, "job_finished", NULL, "job %s has already ended",
                         api_param(r, "id"));
    if (rc)
        return api_store_error(r, rc, "job");
    capd_notify_cancel(api_daemon(r), api_param(r, "id"));
    json_t *out = NULL;
    rc = store_job_get(s, api_param(r, "id"), &out);
    if (rc)
        return api_store_error(r, rc, "job");
    return api_json(r, 202, out);
}

enum MHD_Result api_cell_get(struct api_req *r)
{
    enum MHD_Result ret;
    if (api_not_modified_cell(r, &ret))
        return ret;
    json_t *out = NULL;
    struct store *s = api_store(r);
    int rc = store_cell_get(s, api_param(r, "id"), api_param(r, "cell"), &out);
    return api_store_reply(r, rc, "cell", out);
}

enum MHD_Result api_cell_records(struct api_req *r)
{
    static const char *const kinds[] = {
        "hello", "env", "tensor", "nondeterministic", "timing", "memory", "note", "end", NULL};
    enum MHD_Result ret;
    int limit;
    int64_t after = -1;
    const char *kind = api_query(r, "kind");
    if (kind && !api_one_of(kind, kinds))
        return api_error(r, 400, "invalid_query", "kind", "unknown record kind '%s'", kind);
    if (api_limit_refused(r, 100, 1000, &limit, &ret))
        return ret;
    const char *c = api_query(r, "cursor");
    if (c && !parse_cursor(c, 'r', &after))
        return api_error(r, 400, "invalid_query", "cursor", "cursor is not one this server gave");
    json_t *out = NULL;
    struct store *s = api_store(r);
    int rc =
        store_records_list(s, api_param(r, "id"), api_param(r, "cell"), kind, after, limit, &out);
    if (rc)
        return api_store_error(r, rc, "cell");
    api_etag_by_body(r);
    return api_json(r, 200, out);
}

/* The log file is written by the loop while the cell runs and renamed into
 * place at the end; while running, the in-progress part is served. */
enum MHD_Result api_cell_log(struct api_req *r)
{
    json_t *cell = NULL;
    struct store *s = api_store(r);
    int rc = store_cell_get(s, api_param(r, "id"), api_param(r, "cell"), &cell);
    if (rc)
        return api_store_error(r, rc, "cell");
    json_decref(cell);
    char path[LAYOUT_PATH_MAX], part[LAYOUT_PATH_MAX + 8];
    if (layout_cell_log(path, sizeof path, api_cfg(r)->data_dir, api_param(r, "id"),
                        api_param(r, "cell")) != 0)
        return api_error(r, 500, "internal", NULL, "the cell's log path is too long");
    snprintf(part, sizeof part, "%s.part", path);
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        fd = open(part, O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return api_text(r, 200, "text/plain; charset=utf-8", strdup(""), 0);
    struct stat sb;
    fstat(fd, &sb);
    struct MHD_Response *resp = MHD_create_response_from_fd((uint64_t)sb.st_size, fd);
    if (!resp) {
        close(fd);
        return MHD_NO;
    }
    MHD_add_response_header(resp, "Content-Type", "text/plain; charset=utf-8");
    r->status = 200;
    enum MHD_Result ret2 = MHD_queue_response(r->conn, 200, resp);
    MHD_destroy_response(resp);
    return ret2;
}
