/* api/api_compare.c - comparisons, branches and commits. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "api/api_int.h"
#include "compare/cmp.h"
#include "storage/embedded.h"

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
            /* K lives in BODY: reply before freeing it. */
            ret = api_error(r, 400, "unknown_field", k, "unknown field '%s'", k);
            json_decref(body);
            return ret;
        }
    }
    json_t *cc = json_object_get(body, "control_commit");
    if (!api_valid_hex(json_string_value(cc), 7, 64)) {
        json_decref(body);
        return api_error(r, 400, "invalid_field", "control_commit",
                         "control_commit must be 7 to 64 hex digits");
    }
    if (!api_valid_text(api_param(r, "name"), 255) || strstr(api_param(r, "name"), "..")) {
        json_decref(body);
        return api_error(r, 400, "invalid_field", "name", "bad branch name");
    }
    json_t *out = NULL;
    struct store *s = api_store(r);
    int rc = store_branch_put(s, api_param(r, "name"), json_string_value(cc), &out);
    json_decref(body);
    return api_store_reply(r, rc, "branch", out);
}

enum MHD_Result api_branch_get(struct api_req *r)
{
    return api_store_get(r, store_branch_get, "name", "branch");
}

enum MHD_Result api_commit_get(struct api_req *r)
{
    if (!api_valid_hex(api_param(r, "sha"), 7, 64))
        return api_error(r, 400, "invalid_field", "sha", "a commit is 7 to 64 hex digits");
    enum MHD_Result ret;
    if (api_not_modified_counter(r, "jobs", &ret))
        return ret;
    json_t *out = NULL;
    struct store *s = api_store(r);
    int rc = store_commit_jobs(s, api_param(r, "sha"), &out);
    if (rc)
        return api_store_error(r, rc, "commit");
    if (json_array_size(json_object_get(out, "jobs")) == 0) {
        json_decref(out);
        return api_error(r, 404, "not_found", NULL, "no job for commit %s", api_param(r, "sha"));
    }
    json_object_set_new(out, "commit", json_string(api_param(r, "sha")));
    return api_json(r, 200, out);
}

bool api_job_ref_refused(struct api_req *r, struct store *s, const char *ref, const char *field,
                         json_t **job, enum MHD_Result *ret)
{
    int rc = -ENOENT;
    if (!ref || !*ref) {
        *ret = api_error(r, 400, "missing_query", field, "%s is required (a job id or a commit)",
                         field);
        return true;
    }
    if (ref[0] == 'j')
        rc = store_job_get(s, ref, job);
    if (rc == -ENOENT && api_valid_hex(ref, 7, 64)) {
        char id[16];
        rc = store_job_for_commit(s, ref, true, id);
        if (rc == -ENOENT && store_job_for_commit(s, ref, false, id) == 0) {
            *ret = api_error(r, 409, "pending", field,
                             "commit %s has no finished job yet (its newest is %s); retry when "
                             "it is done",
                             ref, id);
            return true;
        }
        if (rc == 0)
            rc = store_job_get(s, id, job);
    }
    if (rc == -ENOENT) {
        *ret = api_error(r, 404, "not_found", field, "no job or commit '%s'", ref);
        return true;
    }
    if (rc) {
        *ret = api_store_error(r, rc, field);
        return true;
    }
    return false;
}

bool api_job_finished(json_t *job)
{
    const char *st = json_string_value(json_object_get(job, "state"));
    return st && (strcmp(st, "done") == 0 || strcmp(st, "cancelled") == 0);
}

json_t *api_job_summary(json_t *job)
{
    return json_pack("{s:O,s:O,s:O,s:O,s:O,s:O}", "job", json_object_get(job, "id"), "commit",
                     json_object_get(job, "commit"), "branch", json_object_get(job, "branch"),
                     "build", json_object_get(job, "build"), "state", json_object_get(job, "state"),
                     "finished_at", json_object_get(job, "finished_at"));
}

/* Provenance findings of a job (stored at submit) become warnings on every
 * comparison that involves it. */
static void add_warnings(json_t *result, json_t *job, const char *side)
{
    json_t *w = json_object_get(json_object_get(job, "provenance"), "findings");
    size_t i;
    json_t *f;
    json_t *arr = json_object_get(result, "warnings");
    if (!arr) {
        arr = json_array();
        json_object_set_new(result, "warnings", arr);
    }
    json_array_foreach(w, i, f)
    {
        json_t *c = json_deep_copy(f);
        json_object_set_new(c, "side", json_string(side));
        json_object_set_new(c, "job", json_incref(json_object_get(job, "id")));
        json_array_append_new(arr, c);
    }
}

/* The first divergent op's CPU kernel, from the table compiled into capd
 * (schema/kernels.json) and the head job's provenance (compare/kernels.c).
 * A table that does not parse leaves the result as it was. */
static void attribute_kernels(json_t *result, json_t *head)
{
    const struct embedded_file *kf = embedded_find("kernels.json");
    json_t *table = kf ? json_loadb(kf->data, kf->size, 0, NULL) : NULL;
    json_t *prov = json_object_get(head, "provenance");
    if (table)
        cmp_attribute_kernels(result, table, json_is_object(prov) ? prov : NULL);
    json_decref(table);
}

bool api_format_refused(struct api_req *r, enum api_format *fmt, enum MHD_Result *ret)
{
    const char *q = api_query(r, "format");
    const char *accept = api_header(r, "Accept");
    *fmt = API_FORMAT_JSON;
    if (!q) {
        if (accept && strstr(accept, "text/markdown"))
            *fmt = API_FORMAT_MD;
    } else if (strcmp(q, "md") == 0) {
        *fmt = API_FORMAT_MD;
    } else if (strcmp(q, "text") == 0) {
        *fmt = API_FORMAT_TEXT;
    } else if (strcmp(q, "json") != 0) {
        *ret = api_error(r, 400, "invalid_query", "format", "format must be json, md or text");
        return true;
    }
    return false;
}

enum MHD_Result api_report_reply(struct api_req *r, enum api_format fmt, char *report)
{
    if (!report)
        return api_error(r, 500, "internal", NULL, "could not render the report");
    return api_text(
        r, 200, fmt == API_FORMAT_MD ? "text/markdown; charset=utf-8" : "text/plain; charset=utf-8",
        report, strlen(report));
}

/* Provenance warnings lead a rendered comparison: they explain everything
 * below them. Takes OUT; NULL when memory runs out. */
static char *with_warnings(char *out, json_t *warn, bool md)
{
    char *pre = NULL;
    size_t n = 0, i;
    json_t *w;
    FILE *f = out ? open_memstream(&pre, &n) : NULL;
    if (!f) {
        free(out);
        return NULL;
    }
    fprintf(f, md ? "> **Warning: build provenance**\n" : "WARNING: build provenance\n");
    json_array_foreach(warn, i, w)
    {
        fprintf(f, md ? "> - %s (%s job %s)\n" : "  - %s (%s job %s)\n",
                json_string_value(json_object_get(w, "message")),
                json_string_value(json_object_get(w, "side")),
                json_string_value(json_object_get(w, "job")));
    }
    fprintf(f, "\n%s", out);
    fclose(f);
    free(out);
    return pre;
}

static enum MHD_Result reply_result(struct api_req *r, json_t *result, enum api_format fmt)
{
    if (fmt == API_FORMAT_JSON)
        return api_json(r, 200, result);
    bool md = fmt == API_FORMAT_MD;
    char *out = md ? cmp_result_to_markdown(result) : cmp_result_to_text(result);
    json_t *warn = json_object_get(result, "warnings");
    if (out && json_array_size(warn) > 0)
        out = with_warnings(out, warn, md);
    json_decref(result);
    return api_report_reply(r, fmt, out);
}

/* The query's reference (the arbiter, docs/compare.md "Reference
 * arbiter") over everything else; replies and returns false when it is
 * none of the names. */
static bool apply_reference_query(struct api_req *r, struct cmp_options *o, enum MHD_Result *ret)
{
    const char *q = api_query(r, "reference");
    if (q && cmp_reference_from_name(q, &o->reference) < 0) {
        *ret = api_error(r, 400, "invalid_query", "reference",
                         "reference must be one of: none, float64, default-width");
        return false;
    }
    return true;
}

bool api_job_options_refused(struct api_req *r, json_t *job, struct cmp_options *o,
                             enum MHD_Result *ret)
{
    struct cmp_err e = {{0}, {0}};
    /* The job option is validated at submission; an older job has none. */
    if (cmp_reference_from_name(
            json_string_value(json_object_get(json_object_get(job, "options"), "reference")),
            &o->reference) < 0)
        o->reference = CMP_REF_NONE;
    json_t *jo = json_object_get(json_object_get(job, "options"), "compare");
    if (jo && cmp_options_apply_json(o, jo, &e) != 0) {
        *ret = api_error(r, 400, "invalid_field", "options.compare", "%s: %s", e.field, e.message);
        return true;
    }
    return false;
}

/* The head job's reference and "compare" options, then the request's
 * overrides and reference, onto O; replies and returns false when one is
 * invalid. */
static bool apply_options(struct api_req *r, json_t *head, struct cmp_options *o,
                          enum MHD_Result *ret)
{
    struct cmp_err e = {{0}, {0}};
    if (api_job_options_refused(r, head, o, ret))
        return false;
    const char *q = api_query(r, "overrides");
    if (!q)
        return apply_reference_query(r, o, ret);
    json_error_t je;
    json_t *ovr = json_loads(q, JSON_REJECT_DUPLICATES, &je);
    bool ok = false;
    if (!json_is_object(ovr))
        *ret = api_error(r, 400, "invalid_query", "overrides",
                         "overrides must be a JSON object: %s", ovr ? "not an object" : je.text);
    else if (cmp_options_apply_json(o, ovr, &e) != 0)
        *ret = api_error(r, 400, "invalid_query", "overrides", "%s: %s", e.field, e.message);
    else
        ok = apply_reference_query(r, o, ret);
    json_decref(ovr);
    return ok;
}

int api_cmp_load(struct store *s, json_t *ctl, json_t *head, const struct store_cell_filter *f,
                 struct api_cmp_input *in)
{
    int rc = cmp_side_new(&in->ctl);
    if (!rc && ctl != head)
        rc = cmp_side_new(&in->head);
    if (!rc)
        rc = store_load_side(s, json_string_value(json_object_get(ctl, "id")), f, in->ctl, &in->pl);
    if (!rc && in->head)
        rc = store_load_side(s, json_string_value(json_object_get(head, "id")), f, in->head,
                             &in->pl);
    return rc;
}

int api_cmp_run(const struct api_cmp_input *in, json_t *head, const struct cmp_options *o,
                json_t **result)
{
    int rc = cmp_compare(in->ctl, in->head ? in->head : in->ctl, o, result);
    if (!rc)
        attribute_kernels(*result, head);
    return rc;
}

void api_cmp_input_free(struct api_cmp_input *in)
{
    cmp_side_free(in->ctl);
    cmp_side_free(in->head);
    store_payloads_free(in->pl);
    *in = (struct api_cmp_input){0};
}

enum MHD_Result api_cmp_failed(struct api_req *r, int rc)
{
    return api_error(r, rc == -EINVAL ? 400 : 500, rc == -EINVAL ? "invalid_query" : "internal",
                     NULL, "comparison failed (%d)", rc);
}

/* Loads both jobs, applies options (defaults, then the head job's
 * "compare" option, then the request's overrides) and runs the engine. */
static enum MHD_Result run_compare(struct api_req *r, struct store *s, json_t *ctl, json_t *head,
                                   const char *ctl_width, const char *head_width, json_t *extra)
{
    struct api_cmp_input in = {0};
    json_t *result = NULL;
    enum MHD_Result ret;
    enum api_format fmt;
    struct cmp_options o;
    struct store_cell_filter f = {api_query(r, "model"), api_query(r, "width"),
                                  api_query(r, "pass")};
    const struct api_filter af[] = {
        {"model", "model", f.model},
        {"width", "width", ctl_width ? NULL : f.width},
        {"pass", "pass", f.pass},
        {"control_width", "width", ctl_width},
        {"head_width", "width", head_width},
    };
    const size_t naf = sizeof af / sizeof af[0];
    cmp_options_init(&o);
    /* 304 before anything is loaded or computed (api/etag.c). */
    if (api_not_modified_compare(r, ctl, head, extra, &ret))
        return ret;
    /* A filter that matches nothing is a typo, never a pass. */
    if (api_filters_refused(r, s, ctl, head, af, naf, &ret))
        return ret;
    if (api_format_refused(r, &fmt, &ret) || !apply_options(r, head, &o, &ret))
        return ret;
    const char *it = api_query(r, "tensors");
    if (it && strcmp(it, "1") == 0)
        o.include_tensors = true;
    if (ctl_width) {
        snprintf(o.control_width, sizeof o.control_width, "%s", ctl_width);
        snprintf(o.head_width, sizeof o.head_width, "%s", head_width);
        f.width = NULL;
    }
    int rc = api_cmp_load(s, ctl, head, &f, &in);
    if (!rc)
        rc = api_cmp_run(&in, head, &o, &result);
    if (rc) {
        ret = api_cmp_failed(r, rc);
        goto out;
    }
    if (json_integer_value(json_object_get(json_object_get(result, "counts"), "cells")) == 0) {
        ret = api_no_cells(r, result, af, naf);
        goto out;
    }
    json_object_set_new(result, "control", api_job_summary(ctl));
    json_object_set_new(result, "head", api_job_summary(head));
    add_warnings(result, ctl, ctl == head ? "job" : "control");
    if (ctl != head)
        add_warnings(result, head, "head");
    if (extra)
        json_object_update(result, extra);
    ret = reply_result(r, result, fmt);
    result = NULL;
out:
    json_decref(result);
    api_cmp_input_free(&in);
    return ret;
}

static enum MHD_Result pending(struct api_req *r, json_t *ctl, json_t *head)
{
    json_t *b = json_pack("{s:{s:s,s:s,s:n},s:s,s:o,s:o}", "error", "code", "pending", "message",
                          "a job of this comparison has not finished; retry when it has", "field",
                          "verdict", "pending", "control", api_job_summary(ctl), "head",
                          api_job_summary(head));
    return api_json(r, 409, b);
}

enum MHD_Result api_compare(struct api_req *r)
{
    struct store *s = api_store(r);
    json_t *ctl = NULL, *head = NULL;
    enum MHD_Result ret;
    const char *job = api_query(r, "job");
    const char *cw = api_query(r, "control_width"), *hw = api_query(r, "head_width");
    if (job || cw || hw) {
        /* Cross-width: two widths of one job. */
        if (!job || !cw || !hw)
            return api_error(r, 400, "missing_query",
                             !job  ? "job"
                             : !cw ? "control_width"
                                   : "head_width",
                             "cross-width comparison needs job, control_width and head_width");
        if (api_job_ref_refused(r, s, job, "job", &ctl, &ret))
            return ret;
        ret = api_job_finished(ctl) ? run_compare(r, s, ctl, ctl, cw, hw, NULL)
                                    : pending(r, ctl, ctl);
        json_decref(ctl);
        return ret;
    }
    if (api_job_ref_refused(r, s, api_query(r, "control"), "control", &ctl, &ret))
        return ret;
    if (api_job_ref_refused(r, s, api_query(r, "head"), "head", &head, &ret)) {
        json_decref(ctl);
        return ret;
    }
    if (!api_job_finished(ctl) || !api_job_finished(head))
        ret = pending(r, ctl, head);
    else
        ret = run_compare(r, s, ctl, head, NULL, NULL, NULL);
    json_decref(ctl);
    json_decref(head);
    return ret;
}

bool api_control_of(struct api_req *r, struct store *s, json_t *head, json_t **ctl, json_t **extra,
                    enum MHD_Result *ret)
{
    json_t *branch = NULL;
    const char *control = json_string_value(json_object_get(head, "control_commit"));
    const char *source = "job";
    bool ok = false;
    if (!control) {
        const char *bn = json_string_value(json_object_get(head, "branch"));
        if (bn && store_branch_get(s, bn, &branch) == 0)
            control = json_string_value(json_object_get(branch, "control_commit"));
        source = "branch";
    }
    if (!control) {
        *ret = api_error(r, 404, "no_control", NULL,
                         "commit %s has no control: its job names no control_commit and its "
                         "branch has none (PUT /v1/branches/{name})",
                         json_string_value(json_object_get(head, "commit")));
    } else if (!api_job_ref_refused(r, s, control, "control_commit", ctl, ret)) {
        if (extra)
            *extra = json_pack("{s:s,s:s}", "control_source", source, "control_commit", control);
        ok = true;
    }
    json_decref(branch);
    return ok;
}

enum MHD_Result api_commit_diff(struct api_req *r)
{
    struct store *s = api_store(r);
    json_t *ctl = NULL, *head = NULL, *extra = NULL;
    enum MHD_Result ret;
    char id[16];
    if (!api_valid_hex(api_param(r, "sha"), 7, 64))
        return api_error(r, 400, "invalid_field", "sha", "a commit is 7 to 64 hex digits");
    int rc = store_job_for_commit(s, api_param(r, "sha"), false, id);
    if (rc)
        return api_store_error(r, rc, "commit");
    if ((rc = store_job_get(s, id, &head)) != 0)
        return api_store_error(r, rc, "job");
    if (!api_control_of(r, s, head, &ctl, &extra, &ret))
        goto out;
    if (!api_job_finished(ctl) || !api_job_finished(head)) {
        ret = pending(r, ctl, head);
        goto out;
    }
    ret = run_compare(r, s, ctl, head, NULL, NULL, extra);
out:
    json_decref(extra);
    json_decref(ctl);
    json_decref(head);
    return ret;
}
