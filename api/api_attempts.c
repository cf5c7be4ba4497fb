/*
 * api/api_attempts.c - the endpoints of a remote attempt's worker
 * (capd-cell; docs/api.md "Remote attempts", docs/scale.md):
 *
 *   GET  /v1/attempts/{attempt}/spec            what to run, and how
 *   POST /v1/attempts/{attempt}/frames?offset=N the frame stream's next bytes
 *   POST /v1/attempts/{attempt}/log?offset=N    the runner's output
 *   POST /v1/attempts/{attempt}/finish          how the runner ended
 *
 * Every request carries the attempt's own token ("Bearer capd_at_..."),
 * checked before the body is read, whatever auth_required says: no token,
 * a malformed, unknown or wrong one is 401; a valid token of another
 * attempt 403; an attempt that has ended or a token past its expiry 410.
 * Uploads are idempotent by offset (daemon/executors/remote.h): the bytes before
 * what capd holds are not written again, an offset past it is 409 with
 * "received", so a worker that retried after a network error resends
 * from there and nothing is duplicated or lost.
 */
#include <errno.h>
#include <inttypes.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "api/api_int.h"
#include "daemon/executors/remote.h"
#include "util/log.h"

bool api_attempt_auth_refused(struct api_req *r, enum MHD_Result *ret)
{
    const char *h = api_header(r, "Authorization");
    const char *t = h && strncasecmp(h, "Bearer ", 7) == 0 ? h + 7 : NULL;
    while (t && *t == ' ')
        t++;
    r->scope = STORE_SCOPE_NONE;
    r->has_token = h != NULL;
    struct store *s = api_store(r);
    int rc = !t || !store_attempt_token_shaped(t) ? -ENOENT
             : s                                  ? store_attempt_token_check(s, t, &r->att)
                                                  : -EIO;
    r->attempt_rc = rc;
    if (rc == 0 || rc == -ESTALE || rc == -EKEYEXPIRED)
        return false;
    api_reply_header(r, "WWW-Authenticate", "Bearer realm=\"capd\"");
    if (rc == -ENOENT)
        *ret =
            api_error(r, 401, "unauthorized", NULL,
                      "%s: /v1/attempts needs the attempt's own token, 'Bearer capd_at_...' "
                      "(docs/scale.md)",
                      t ? "the attempt token is malformed, unknown or wrong" : "no attempt token");
    else
        *ret = api_store_error(r, rc, "attempt token check");
    r->replied = true;
    return true;
}

/* The 410 of an ended attempt, naming how it ended. */
static enum MHD_Result gone(struct api_req *r, const char *state)
{
    json_t *b = json_pack("{s:{s:s,s:s+,s:n},s:s}", "error", "code", "attempt_ended", "message",
                          "the attempt has ended: ", state, "field", "state", state);
    return api_json(r, 410, b);
}

/* The path's attempt, once its token is known to be this attempt's and
 * still good; false when it has replied. */
static bool attempt_of(struct api_req *r, int64_t *id, enum MHD_Result *ret)
{
    const char *p = api_param(r, "attempt");
    char *end = NULL;
    long long v = p ? strtoll(p, &end, 10) : 0;
    if (!p || !*p || *end || v <= 0) {
        *ret = api_error(r, 404, "not_found", "attempt", "no attempt '%s'", p ? p : "");
        return false;
    }
    if (v != r->att.attempt_id) {
        *ret = api_error(r, 403, "forbidden", NULL, "this token is for attempt %lld, not %lld",
                         (long long)r->att.attempt_id, v);
        return false;
    }
    if (r->attempt_rc == -ESTALE) {
        *ret = gone(r, r->att.cell_state);
        return false;
    }
    if (r->attempt_rc == -EKEYEXPIRED) {
        *ret = gone(r, "its token expired");
        return false;
    }
    *id = v;
    return true;
}

/* A remote_* error: 410, 404 (this capd does not hold it: it restarted),
 * 409 with what capd holds, or 500. */
static enum MHD_Result remote_error(struct api_req *r, int rc, const char *state,
                                    const uint64_t received[REMOTE_STREAMS])
{
    if (rc == -ESTALE && strcmp(state, REMOTE_STATE_STOPPING) == 0) {
        api_reply_header(r, "Retry-After", "5");
        return api_error(r, 503, "shutting_down", NULL,
                         "capd is stopping; retry: the next capd takes this attempt up again");
    }
    if (rc == -ESTALE)
        return gone(r, state);
    if (rc == -ENOENT)
        return gone(r, "capd holds no such running attempt (it restarted)");
    if (rc == -ERANGE) {
        json_t *b = json_pack("{s:{s:s,s:s,s:s},s:I,s:I}", "error", "code", "gap", "message",
                              "capd does not hold every byte before this point; resend from "
                              "what it holds (frames_received, log_received)",
                              "field", "offset", "frames_received", (json_int_t)received[0],
                              "log_received", (json_int_t)received[1]);
        return api_json(r, 409, b);
    }
    return api_error(r, 500, "internal", NULL, "the attempt's spool could not be written: %s",
                     strerror(-rc));
}

enum MHD_Result api_attempt_spec(struct api_req *r)
{
    enum MHD_Result ret;
    int64_t id;
    char state[96] = "";
    if (!attempt_of(r, &id, &ret))
        return ret;
    json_t *out = NULL;
    int rc = remote_spec(id, &out, state, sizeof state);
    if (rc)
        return remote_error(r, rc, state, (const uint64_t[REMOTE_STREAMS]){0, 0});
    return api_json(r, 200, out);
}

static enum MHD_Result append(struct api_req *r, enum remote_stream which)
{
    enum MHD_Result ret;
    int64_t id;
    char state[96] = "";
    if (!attempt_of(r, &id, &ret))
        return ret;
    const char *o = api_query(r, "offset");
    char *end = NULL;
    unsigned long long off = o ? strtoull(o, &end, 10) : 0;
    if (!o || !*o || *end || o[0] == '-')
        return api_error(r, 400, "invalid_query", "offset",
                         "offset=N is required: the stream byte this body starts at");
    uint64_t received[REMOTE_STREAMS] = {0, 0};
    int rc = remote_append(id, which, off, r->body.p ? r->body.p : "", r->body.len, received, state,
                           sizeof state);
    if (rc)
        return remote_error(r, rc, state, received);
    return api_json(r, 200, json_pack("{s:I}", "received", (json_int_t)received[which]));
}

enum MHD_Result api_attempt_frames(struct api_req *r)
{
    return append(r, REMOTE_FRAMES);
}

enum MHD_Result api_attempt_log(struct api_req *r)
{
    return append(r, REMOTE_LOG);
}

/* The finish body: every field known, each of its type. */
static bool exit_of(struct api_req *r, json_t *b, struct remote_exit *ex, enum MHD_Result *ret)
{
    static const char *const fields[] = {
        "exit_status", "signal",        "frames_bytes",   "log_bytes",  "peak_rss_bytes",
        "cpu_time_ms", "worker_signal", "worker_timeout", "worker_oom", NULL};
    struct api_verr e = {0};
    if (!api_verr_fields_known(&e, b, fields)) {
        *ret = api_error(r, 400, e.code, e.field, "%s", e.message);
        return false;
    }
    memset(ex, 0, sizeof *ex);
    for (int i = 0; i < 6; i++) {
        json_t *v = json_object_get(b, fields[i]);
        bool nullable = i < 2;
        if ((!v && !nullable) || (v && !json_is_null(v) && !json_is_integer(v)) ||
            (json_is_integer(v) && json_integer_value(v) < 0 && i != 0)) {
            *ret = api_error(r, 400, "invalid_field", fields[i], "%s must be %s", fields[i],
                             nullable ? "an integer or null" : "a non-negative integer");
            return false;
        }
    }
    ex->exit_status = json_integer_value(json_object_get(b, "exit_status"));
    ex->signal = (int)json_integer_value(json_object_get(b, "signal"));
    ex->bytes[REMOTE_FRAMES] = (uint64_t)json_integer_value(json_object_get(b, "frames_bytes"));
    ex->bytes[REMOTE_LOG] = (uint64_t)json_integer_value(json_object_get(b, "log_bytes"));
    ex->peak_rss_bytes = json_integer_value(json_object_get(b, "peak_rss_bytes"));
    ex->cpu_time_ms = json_integer_value(json_object_get(b, "cpu_time_ms"));
    json_t *ws = json_object_get(b, "worker_signal"), *wt = json_object_get(b, "worker_timeout");
    json_t *wo = json_object_get(b, "worker_oom");
    bool bad_ws =
        ws && !json_is_null(ws) &&
        (!json_is_integer(ws) || json_integer_value(ws) < 0 || json_integer_value(ws) > 64);
    const char *bad = bad_ws                       ? "worker_signal"
                      : wt && !json_is_boolean(wt) ? "worker_timeout"
                      : wo && !json_is_boolean(wo) ? "worker_oom"
                                                   : NULL;
    if (bad) {
        *ret = api_error(r, 400, "invalid_field", bad, "%s",
                         bad_ws ? "worker_signal must be a signal number (1 to 64) or null"
                                : "must be a boolean");
        return false;
    }
    ex->worker_signal = (int)json_integer_value(ws);
    ex->worker_timeout = json_is_true(wt);
    ex->worker_oom = json_is_true(wo);
    return true;
}

enum MHD_Result api_attempt_finish(struct api_req *r)
{
    enum MHD_Result ret;
    int64_t id;
    char state[96] = "";
    struct remote_exit ex;
    if (!attempt_of(r, &id, &ret))
        return ret;
    json_t *b = api_body_object(r, &ret);
    if (!b)
        return ret;
    bool ok = exit_of(r, b, &ex, &ret);
    json_decref(b);
    if (!ok)
        return ret;
    uint64_t received[REMOTE_STREAMS] = {0, 0};
    int rc = remote_finish(id, &ex, received, state, sizeof state);
    if (rc)
        return remote_error(r, rc, state, received);
    log_info("cell_remote_finished", "attempt=%lld exit=%lld signal=%d", (long long)id,
             (long long)ex.exit_status, ex.signal);
    return api_json(r, 200, json_pack("{s:s}", "state", "finished"));
}
