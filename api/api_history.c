/*
 * api/api_history.c - history along a branch (docs/history.md):
 *
 *   GET  /v1/history?project=&branch=&model=&width=&pass=[&limit=]
 *   GET  /v1/alerts[?project=&branch=&kind=&status=&limit=]
 *   POST /v1/alerts/{id}   {"status": "acknowledged"|..., "note": "..."}
 *
 * and the commit-order fields of a job request (commit_time, parents),
 * which api/api_jobs.c's validator hands to api_history_order(). Reads
 * drain the history queue first, so a job that has just finished is in
 * the answer even if the daemon loop has not got to it yet.
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "api/api_int.h"

#define HIST_MAX_PARENTS     16 /* parents of one commit (an octopus merge has many) */
#define HIST_MAX_COMMIT_TIME 40 /* bytes of an RFC 3339 time */

static bool digits(const char *s, int n)
{
    for (int i = 0; i < n; i++)
        if (s[i] < '0' || s[i] > '9')
            return false;
    return true;
}

/* RFC 3339 date-time: YYYY-MM-DDTHH:MM:SS[.frac](Z|+HH:MM|-HH:MM), which
 * SQLite's date functions read as is (storage/history.c orders by it). */
static bool valid_rfc3339(const char *s)
{
    size_t n = strlen(s);
    if (n < 20 || n > HIST_MAX_COMMIT_TIME || !digits(s, 4) || s[4] != '-' || !digits(s + 5, 2) ||
        s[7] != '-' || !digits(s + 8, 2) || (s[10] != 'T' && s[10] != 't') || !digits(s + 11, 2) ||
        s[13] != ':' || !digits(s + 14, 2) || s[16] != ':' || !digits(s + 17, 2))
        return false;
    const char *p = s + 19;
    if (*p == '.') {
        const char *f = ++p;
        while (*p >= '0' && *p <= '9')
            p++;
        if (p == f)
            return false;
    }
    if ((*p == 'Z' || *p == 'z') && p[1] == 0)
        return true;
    return (*p == '+' || *p == '-') && strlen(p) == 6 && digits(p + 1, 2) && p[3] == ':' &&
           digits(p + 4, 2);
}

static int order_err(struct api_verr *err, const char *field, const char *msg)
{
    err->code = "invalid_field";
    err->has_field = true;
    snprintf(err->field, sizeof err->field, "%s", field);
    snprintf(err->message, sizeof err->message, "%s", msg);
    return -EINVAL;
}

int api_history_order(json_t *body, json_t *norm, struct api_verr *err)
{
    json_t *t = json_object_get(body, "commit_time");
    if (t && !json_is_null(t)) {
        if (!json_is_string(t) || !valid_rfc3339(json_string_value(t)))
            return order_err(err, "commit_time",
                             "commit_time must be an RFC 3339 time such as "
                             "2024-05-01T12:00:00Z or 2024-05-01T14:00:00+02:00");
        json_object_set(norm, "commit_time", t);
    }
    json_t *p = json_object_get(body, "parents"), *v;
    if (!p || json_is_null(p))
        return 0;
    if (!json_is_array(p) || json_array_size(p) > HIST_MAX_PARENTS) {
        char m[128];
        snprintf(m, sizeof m, "parents must be an array of at most %d commits", HIST_MAX_PARENTS);
        return order_err(err, "parents", m);
    }
    size_t i;
    json_array_foreach(p, i, v)
    {
        if (!api_valid_hex(json_string_value(v), 7, 64)) {
            char f[32];
            snprintf(f, sizeof f, "parents[%zu]", i);
            return order_err(err, f, "a parent must be 7 to 64 hex digits");
        }
    }
    json_object_set(norm, "parents", p);
    return 0;
}

/* The caller's store with the history queue drained. */
static struct store *drained_store(struct api_req *r)
{
    struct store *s = api_store(r);
    if (s && store_history_drain(s, NULL) != 0)
        return NULL;
    return s;
}

enum MHD_Result api_history_get(struct api_req *r)
{
    static const char *const names[] = {"project", "branch", "model", "width", "pass"};
    const char *v[5];
    enum MHD_Result ret;
    for (int i = 0; i < 5; i++)
        if (!(v[i] = api_query(r, names[i])) || !api_valid_text(v[i], 255))
            return api_error(r, 400, "invalid_query", names[i],
                             "%s is required (1 to 255 printable characters)", names[i]);
    struct store_history_query q = {v[0], v[1], v[2], v[3], v[4], 0};
    if (api_limit_refused(r, 200, STORE_HISTORY_MAX_LIMIT, &q.limit, &ret))
        return ret;
    json_t *out = NULL;
    int rc = store_history_get(drained_store(r), &q, &out);
    return api_store_reply_etag(r, rc, "history of that cell", out);
}

static const char *const statuses[] = {"open", "acknowledged", "false_positive", "expected", NULL};

enum MHD_Result api_alerts_list(struct api_req *r)
{
    static const char *const kinds[] = {"perf", "memory", "numerics", "outcome", NULL};
    enum MHD_Result ret;
    struct store_alert_filter f = {"open", api_query(r, "project"), api_query(r, "branch"),
                                   api_query(r, "kind"), 0};
    const char *st = api_query(r, "status");
    if (st && strcmp(st, "all") == 0)
        f.status = NULL;
    else if (st && !api_one_of(st, statuses))
        return api_error(r, 400, "invalid_query", "status",
                         "status must be open, acknowledged, false_positive, expected or all");
    else if (st)
        f.status = st;
    if (f.kind && !api_one_of(f.kind, kinds))
        return api_error(r, 400, "invalid_query", "kind",
                         "kind must be perf, memory, numerics or outcome");
    if (api_limit_refused(r, 100, STORE_ALERTS_MAX_LIMIT, &f.limit, &ret))
        return ret;
    json_t *out = NULL;
    int rc = store_alerts_list(drained_store(r), &f, &out);
    return api_store_reply_etag(r, rc, "alerts", out);
}

enum MHD_Result api_alert_post(struct api_req *r)
{
    enum MHD_Result ret;
    json_t *body = api_body_object(r, &ret), *v;
    if (!body)
        return ret;
    const char *k, *status = NULL, *note = NULL;
    json_object_foreach(body, k, v)
    {
        if (strcmp(k, "status") && strcmp(k, "note")) {
            ret = api_error(r, 400, "unknown_field", k, "unknown field '%s'", k);
            goto out;
        }
    }
    status = json_string_value(json_object_get(body, "status"));
    if (!status || !api_one_of(status, statuses)) {
        ret = api_error(r, 400, "invalid_field", "status",
                        "status must be open, acknowledged, false_positive or expected");
        goto out;
    }
    v = json_object_get(body, "note");
    if (v && (!json_is_string(v) || !api_valid_text(json_string_value(v), 1024))) {
        ret = api_error(r, 400, "invalid_field", "note",
                        "note must be a string of 1 to 1024 printable characters");
        goto out;
    }
    note = json_string_value(v);
    json_t *out = NULL;
    struct store *s = api_store(r);
    int rc = store_alert_set(s, api_param(r, "id"), status, note, &out);
    ret = rc ? api_store_error(r, rc, "alert") : api_json(r, 200, out);
out:
    json_decref(body);
    return ret;
}
