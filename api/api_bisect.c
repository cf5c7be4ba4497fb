/*
 * api/api_bisect.c - bisection over per-commit builds (docs/history.md):
 *
 *   POST /v1/bisect               start one (submit scope)
 *   GET  /v1/bisect[?state=&limit=]
 *   GET  /v1/bisect/{id}          its state, rounds, probes and result
 *   POST /v1/bisect/{id}/cancel   (submit scope: a submit token only its own)
 *
 * The request is checked completely here: its commits, its predicate, and
 * its cells through the job validator (the job of the good commit is the
 * template of every probe). The daemon loop runs it (daemon/bisect.h).
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "api/api_int.h"

#define BISECT_DEFAULT_THRESHOLD 0.05 /* perf: the slowdown that counts, as cmp's default */
#define BISECT_MAX_THRESHOLD     10.0 /* a slowdown of 11x is as far as a threshold goes */

static const char *const predicates[] = {"numerics", "outcome", "perf", NULL};

static bool has_commit(json_t *list, const char *c, size_t *at)
{
    size_t i;
    json_t *v;
    json_array_foreach(list, i, v)
    {
        if (strcmp(json_string_value(v), c) == 0) {
            *at = i;
            return true;
        }
    }
    return false;
}

/* The request's top level: known fields, good and bad, the predicate and
 * the threshold. Fills E and returns false on bad input. */
static bool check_fields(struct api_verr *e, json_t *body)
{
    static const char *const fields[] = {"project", "build",     "branch",    "commits",
                                         "good",    "bad",       "matrix",    "options",
                                         "labels",  "predicate", "threshold", NULL};
    if (!api_verr_fields_known(e, body, fields))
        return false;
    const char *good = json_string_value(json_object_get(body, "good"));
    const char *bad = json_string_value(json_object_get(body, "bad"));
    if (!api_valid_hex(good, 7, 64))
        return api_verr_set(e, "invalid_field", "good",
                            "good must be a commit: 7 to 64 hex digits");
    if (!api_valid_hex(bad, 7, 64))
        return api_verr_set(e, "invalid_field", "bad", "bad must be a commit: 7 to 64 hex digits");
    if (strcmp(good, bad) == 0)
        return api_verr_set(e, "invalid_field", "bad", "good and bad are the same commit %s", good);
    if (!api_one_of(json_string_value(json_object_get(body, "predicate")), predicates))
        return api_verr_set(e, "invalid_field", "predicate",
                            "predicate must be numerics, outcome or perf");
    json_t *t = json_object_get(body, "threshold");
    if (t && (!json_is_number(t) || json_number_value(t) <= 0 ||
              json_number_value(t) > BISECT_MAX_THRESHOLD))
        return api_verr_set(e, "invalid_field", "threshold",
                            "threshold must be a number in (0, %g] (0.05 = 5%% slower)",
                            BISECT_MAX_THRESHOLD);
    return true;
}

/* The commits to bisect, oldest first, from LIST (the request's, or the
 * branch's): good is put first and bad last when LIST leaves them out (as
 * git rev-list good..bad leaves out good), and the part between them is
 * kept. *OUT gets a new array. */
static bool commit_range(struct api_verr *e, json_t *list, const char *good, const char *bad,
                         const char *field, json_t **out)
{
    size_t i, g = 0, b = 0;
    json_t *v, *all = json_array();
    json_array_foreach(list, i, v)
    {
        size_t dup;
        if (!api_valid_hex(json_string_value(v), 7, 64) ||
            has_commit(all, json_string_value(v), &dup)) {
            json_decref(all);
            return api_verr_set(e, "invalid_field", field,
                                "%s[%zu] must be a commit (7 to 64 hex digits) listed once", field,
                                i);
        }
        json_array_append(all, v);
    }
    if (!has_commit(all, good, &g))
        json_array_insert_new(all, 0, json_string(good));
    if (!has_commit(all, bad, &b))
        json_array_append_new(all, json_string(bad));
    has_commit(all, good, &g);
    has_commit(all, bad, &b);
    if (g >= b) {
        json_decref(all);
        return api_verr_set(e, "good_not_before_bad", field,
                            "good %s comes after bad %s in %s (oldest first)", good, bad, field);
    }
    size_t n = b - g + 1;
    if (n > STORE_BISECT_MAX_COMMITS) {
        json_decref(all);
        return api_verr_set(e, "too_many_commits", field,
                            "%zu commits from good to bad; the limit is %d", n,
                            STORE_BISECT_MAX_COMMITS);
    }
    *out = json_array();
    for (i = g; i <= b; i++)
        json_array_append(*out, json_array_get(all, i));
    json_decref(all);
    return true;
}

/* The job of the good commit, as POST /v1/jobs would store it: the
 * template of every probe. */
static bool job_template(struct api_req *r, json_t *body, json_t *build, struct api_verr *e,
                         json_t **norm)
{
    json_t *jb =
        json_pack("{s:O,s:O,s:O,s:O}", "project", json_object_get(body, "project"), "commit",
                  json_object_get(body, "good"), "build", json_object_get(body, "build"), "matrix",
                  json_object_get(body, "matrix"));
    if (!jb)
        return api_verr_set(e, "invalid_field", "project",
                            "project, build and matrix are required");
    const char *keep[] = {"options", "labels", "branch"};
    for (size_t i = 0; i < sizeof keep / sizeof keep[0]; i++)
        if (json_object_get(body, keep[i]))
            json_object_set(jb, keep[i], json_object_get(body, keep[i]));
    int rc = api_validate_job_request(jb, build, api_cfg(r), norm, e);
    json_decref(jb);
    return rc == 0;
}

/* Checks BODY into N (its commits and job are new references); replies
 * and returns false on bad input. */
static bool bisect_request(struct api_req *r, json_t *body, struct store_bisect_new *n,
                           enum MHD_Result *ret)
{
    struct api_verr e = {0};
    json_t *build = NULL, *list = NULL;
    const char *bname = json_string_value(json_object_get(body, "build"));
    int rc = api_valid_name(bname, 64) ? store_build_get(api_store(r), bname, &build) : -ENOENT;
    bool ok = false;
    if (rc && rc != -ENOENT) {
        *ret = api_store_error(r, rc, "build");
        return false;
    }
    if (!check_fields(&e, body) || !job_template(r, body, build, &e, &n->job))
        goto out;
    const char *good = json_string_value(json_object_get(body, "good"));
    const char *bad = json_string_value(json_object_get(body, "bad"));
    json_t *cl = json_object_get(body, "commits");
    n->branch = json_string_value(json_object_get(body, "branch"));
    if (cl && !json_is_array(cl)) {
        api_verr_set(&e, "invalid_field", "commits", "commits must be an array, oldest first");
        goto out;
    }
    if (!cl && !n->branch) {
        api_verr_set(&e, "missing_field", "commits",
                     "name the commits (oldest first) or a branch whose history holds them");
        goto out;
    }
    if (!cl) {
        if ((rc = store_branch_commits(api_store(r),
                                       json_string_value(json_object_get(body, "project")),
                                       n->branch, &list)) != 0) {
            *ret = api_store_error(r, rc, "branch");
            goto fail;
        }
        size_t at;
        if (!has_commit(list, good, &at) || !has_commit(list, bad, &at)) {
            api_verr_set(&e, "not_in_branch", has_commit(list, good, &at) ? "bad" : "good",
                         "branch %s's history does not hold both %s and %s; send commits",
                         n->branch, good, bad);
            goto out;
        }
    }
    if (!commit_range(&e, cl ? cl : list, good, bad, cl ? "commits" : "branch", &n->commits))
        goto out;
    n->project = json_string_value(json_object_get(body, "project"));
    n->build = bname;
    n->predicate = json_string_value(json_object_get(body, "predicate"));
    json_t *t = json_object_get(body, "threshold");
    n->threshold = t ? json_number_value(t) : BISECT_DEFAULT_THRESHOLD;
    ok = true;
out:
    if (!ok)
        *ret = api_error(r, 400, e.code, e.has_field ? e.field : NULL, "%s", e.message);
fail:
    json_decref(build);
    json_decref(list);
    return ok;
}

enum MHD_Result api_bisect_create(struct api_req *r)
{
    enum MHD_Result ret;
    json_t *body = api_body_object(r, &ret), *out = NULL;
    if (!body)
        return ret;
    struct store_bisect_new n = {.token_id = r->token_id[0] ? r->token_id : NULL};
    if (!bisect_request(r, body, &n, &ret))
        goto out;
    int rc = store_bisect_create(api_store(r), &n, &out);
    if (rc == -EAGAIN)
        ret = api_error(r, 429, "too_many_bisections", NULL,
                        "%d bisections are already running; retry when one has ended",
                        STORE_BISECT_MAX_RUNNING);
    else if (rc)
        ret = api_store_error(r, rc, "bisect");
    else {
        capd_notify_work(api_daemon(r));
        ret = api_json(r, 201, out);
    }
out:
    json_decref(n.commits);
    json_decref(n.job);
    json_decref(body);
    return ret;
}

enum MHD_Result api_bisect_get(struct api_req *r)
{
    json_t *out = NULL;
    int rc = store_bisect_get(api_store(r), api_param(r, "id"), &out);
    return api_store_reply_etag(r, rc, "bisect", out);
}

enum MHD_Result api_bisect_list(struct api_req *r)
{
    static const char *const states[] = {"running", "done", "failed", "cancelled", NULL};
    const char *st = api_query(r, "state"), *lim = api_query(r, "limit");
    if (st && !api_one_of(st, states))
        return api_error(r, 400, "invalid_query", "state",
                         "state must be running, done, failed or cancelled");
    char *end = NULL;
    long limit = lim ? strtol(lim, &end, 10) : 50;
    if (lim && (!*lim || *end || limit < 1 || limit > STORE_ALERTS_MAX_LIMIT))
        return api_error(r, 400, "invalid_query", "limit", "limit must be 1 to %d",
                         STORE_ALERTS_MAX_LIMIT);
    json_t *out = NULL;
    int rc = store_bisect_list(api_store(r), st, (int)limit, &out);
    return api_store_reply_etag(r, rc, "bisect", out);
}

enum MHD_Result api_bisect_cancel(struct api_req *r)
{
    struct store *s = api_store(r);
    const char *id = api_param(r, "id");
    json_t *b = NULL, *jobs = NULL;
    char owner[16];
    int rc = store_bisect_owner(s, id, owner);
    if (rc)
        return api_store_error(r, rc, "bisect");
    /* Like a job: a submit token cancels only what it started. */
    if (r->scope < STORE_SCOPE_ADMIN && strcmp(owner, r->token_id) != 0)
        return api_error(r, 403, "forbidden", NULL,
                         "bisection %s was started by another token; only it or admin may "
                         "cancel it",
                         id);
    rc = store_bisect_cancel(s, id, &jobs);
    if (rc == -EALREADY)
        return api_error(r, 409, "bisect_finished", NULL, "bisection %s has already ended", id);
    if (rc)
        return api_store_error(r, rc, "bisect");
    size_t i;
    json_t *j;
    json_array_foreach(jobs, i, j)
    {
        capd_notify_cancel(api_daemon(r), json_string_value(j));
    }
    json_decref(jobs);
    if ((rc = store_bisect_get(s, id, &b)) != 0)
        return api_store_error(r, rc, "bisect");
    return api_json(r, 202, b);
}
