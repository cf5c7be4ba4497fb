/* api/api_compare.c - comparisons, branches and commits. */
#include <errno.h>
#include <string.h>

#include "api/api_int.h"

enum MHD_Result api_branch_put(struct api_req *r)
{
    enum MHD_Result ret;
    json_t *body = api_body_object(r, &ret);
    if (!body)
        return ret;
    const char *k;
    json_t *v;
    json_object_foreach(body, k, v)
    {
        if (strcmp(k, "control_commit") != 0) {
            json_decref(body);
            return api_error(r, 400, "unknown_field", k, "unknown field '%s'", k);
        }
    }
    json_t *cc = json_object_get(body, "control_commit");
    if (!api_valid_hex(json_string_value(cc), 7, 64)) {
        json_decref(body);
        return api_error(r, 400, "invalid_field", "control_commit",
                         "control_commit must be 7 to 64 hex digits");
    }
    if (!api_valid_text(r->seg[2], 255) || strstr(r->seg[2], "..")) {
        json_decref(body);
        return api_error(r, 400, "invalid_field", "name", "bad branch name");
    }
    json_t *out = NULL;
    struct store *s = api_store(r);
    int rc = s ? store_branch_put(s, r->seg[2], json_string_value(cc), &out) : -EIO;
    json_decref(body);
    if (rc)
        return api_store_error(r, rc, "branch");
    return api_json(r, 200, out);
}

enum MHD_Result api_branch_get(struct api_req *r)
{
    json_t *out = NULL;
    struct store *s = api_store(r);
    int rc = s ? store_branch_get(s, r->seg[2], &out) : -EIO;
    if (rc)
        return api_store_error(r, rc, "branch");
    return api_json(r, 200, out);
}

enum MHD_Result api_commit_get(struct api_req *r)
{
    if (!api_valid_hex(r->seg[2], 7, 64))
        return api_error(r, 400, "invalid_field", "sha", "a commit is 7 to 64 hex digits");
    json_t *out = NULL;
    struct store *s = api_store(r);
    int rc = s ? store_commit_jobs(s, r->seg[2], &out) : -EIO;
    if (rc)
        return api_store_error(r, rc, "commit");
    if (json_array_size(json_object_get(out, "jobs")) == 0) {
        json_decref(out);
        return api_error(r, 404, "not_found", NULL, "no job for commit %s", r->seg[2]);
    }
    json_object_set_new(out, "commit", json_string(r->seg[2]));
    return api_json(r, 200, out);
}

enum MHD_Result api_compare(struct api_req *r)
{
    return api_error(r, 503, "unavailable", NULL, "comparison engine not wired yet");
}

enum MHD_Result api_commit_diff(struct api_req *r)
{
    return api_error(r, 503, "unavailable", NULL, "comparison engine not wired yet");
}
