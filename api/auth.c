/*
 * api/auth.c - who may do what over HTTP: bearer tokens and scopes, and the
 * /v1/tokens endpoints.
 *
 * Scopes are ordered, each including the ones below it:
 *   read    every GET (unless public_reads makes them open)
 *   submit  POST /v1/jobs, and cancelling the jobs this token created
 *   admin   everything else: builds, branches, tokens, cancelling any job
 * /healthz is always open; /metrics is open when metrics_public is set.
 * The route table (api/server.c) states each route's access (enum
 * api_access), which this file maps to a scope; both checks run when the
 * request's headers are in, before a byte of its body is read. A path no
 * route takes is checked as an admin route: a write needs a valid token.
 *
 * auth_required is on by default (the first admin token is made at the
 * first start, daemon/admin/admin_token.h). Off, which capd allows only on a
 * loopback address and warns about at every start, every request is admin
 * and the Authorization header is ignored.
 *
 * Nothing here ever logs or echoes the token: refusals log the reason, the
 * method, the path and the client address only.
 */
#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <stdio.h>
#include <string.h>
#include <strings.h>

#include "api/api_int.h"
#include "util/log.h"
#include "util/clock.h"

#define AUTH_MAX_NAME     64
#define AUTH_MAX_EXPIRY_S (10LL * 366 * 86400)

static bool is_read_method(const char *m)
{
    return strcmp(m, "GET") == 0 || strcmp(m, "HEAD") == 0;
}

/* The scope ACCESS (the route table's word) needs under this config. */
static int required_scope(const struct capd_config *cfg, enum api_access access)
{
    switch (access) {
    case API_OPEN:
    case API_WORKER:
        return STORE_SCOPE_NONE;
    case API_READ:
        return cfg->public_reads ? STORE_SCOPE_NONE : STORE_SCOPE_READ;
    case API_METRICS:
        return cfg->metrics_public ? STORE_SCOPE_NONE : STORE_SCOPE_READ;
    case API_SUBMIT:
        return STORE_SCOPE_SUBMIT;
    case API_ADMIN:
        break;
    }
    return STORE_SCOPE_ADMIN;
}

static const char *client_addr(struct api_req *r, char *buf, size_t n)
{
    const union MHD_ConnectionInfo *ci =
        MHD_get_connection_info(r->conn, MHD_CONNECTION_INFO_CLIENT_ADDRESS);
    snprintf(buf, n, "?");
    if (ci && ci->client_addr && ci->client_addr->sa_family == AF_INET)
        inet_ntop(AF_INET, &((const struct sockaddr_in *)ci->client_addr)->sin_addr, buf,
                  (socklen_t)n);
    else if (ci && ci->client_addr && ci->client_addr->sa_family == AF_INET6)
        inet_ntop(AF_INET6, &((const struct sockaddr_in6 *)ci->client_addr)->sin6_addr, buf,
                  (socklen_t)n);
    return buf;
}

/* The 401 for a request without a usable token. RFC 6750: the challenge
 * names the realm, and the error when a token was presented but refused. */
static enum MHD_Result unauthorized(struct api_req *r)
{
    const char *why, *err = NULL;
    char addr[64];
    switch (r->auth_rc) {
    case -EIO:
        return api_error(r, 500, "internal", NULL, "the token store could not be read");
    case -ENOSPC:
        return api_store_error(r, r->auth_rc, "token check");
    case -EBUSY:
        return api_error(r, 503, "busy", NULL, "the database is busy; retry");
    case -EINVAL:
        why = "the Authorization header must be 'Bearer <token>'";
        err = "invalid_request";
        break;
    case -EKEYEXPIRED:
        why = "the bearer token has expired";
        err = "invalid_token";
        break;
    case -EKEYREVOKED:
        why = "the bearer token has been revoked";
        err = "invalid_token";
        break;
    case -ENOENT:
        why = "the bearer token is not valid";
        err = "invalid_token";
        break;
    default:
        why = "this request needs an API token (Authorization: Bearer <token>; an admin "
              "creates one with `capd token create`)";
        break;
    }
    log_info("auth_refused", "method=%s url=%s client=%s reason=%s", r->method, log_q(r->url),
             client_addr(r, addr, sizeof addr), log_q(why));
    char challenge[96];
    if (err)
        snprintf(challenge, sizeof challenge, "Bearer realm=\"capd\", error=\"%s\"", err);
    else
        snprintf(challenge, sizeof challenge, "Bearer realm=\"capd\"");
    api_reply_header(r, "WWW-Authenticate", challenge);
    return api_error(r, 401, "unauthorized", NULL, "%s", why);
}

bool api_auth_refused(struct api_req *r, enum api_access access, enum MHD_Result *ret)
{
    const struct capd_config *cfg = api_cfg(r);
    r->token_id[0] = 0;
    r->auth_rc = 0;
    /* A worker's route takes its attempt's own token, never an API one. */
    if (access == API_WORKER)
        return api_attempt_auth_refused(r, ret);
    if (!cfg->auth_required) {
        r->scope = STORE_SCOPE_ADMIN;
        return false;
    }
    r->scope = STORE_SCOPE_NONE;
    const char *h = api_header(r, "Authorization");
    if (h) {
        r->has_token = true;
        if (strncasecmp(h, "Bearer ", 7) != 0) {
            r->auth_rc = -EINVAL;
        } else {
            const char *t = h + 7;
            while (*t == ' ')
                t++;
            struct store *s = api_store(r);
            int rc = s ? store_token_check(s, t, r->token_id, &r->scope) : -EIO;
            if (rc) {
                r->auth_rc = rc;
                r->scope = STORE_SCOPE_NONE;
                r->token_id[0] = 0;
            }
        }
    }
    /* A read is decided once its route is known (it may be public). A write
     * always needs a valid token, so it is refused before its body is read:
     * an anonymous client cannot make capd buffer megabytes. */
    if (is_read_method(r->method) || r->scope >= STORE_SCOPE_READ)
        return false;
    if (!h)
        r->auth_rc = 1; /* no token at all */
    *ret = unauthorized(r);
    r->replied = true;
    return true;
}

bool api_scope_refused(struct api_req *r, enum api_access access, enum MHD_Result *ret)
{
    int need = required_scope(api_cfg(r), access);
    const char *method = r->route_method, *pattern = r->route_pattern;
    if (need == STORE_SCOPE_NONE || r->scope >= need)
        return false;
    if (r->scope == STORE_SCOPE_NONE) {
        if (!r->has_token)
            r->auth_rc = 1;
        *ret = unauthorized(r);
        return true;
    }
    char addr[64];
    log_info("auth_forbidden", "method=%s url=%s client=%s token_id=%s scope=%s needs=%s",
             r->method, log_q(r->url), client_addr(r, addr, sizeof addr), r->token_id,
             store_scope_name(r->scope), store_scope_name(need));
    *ret =
        api_error(r, 403, "forbidden", NULL, "token %s has scope %s; %s %s needs scope %s",
                  r->token_id, store_scope_name(r->scope), method, pattern, store_scope_name(need));
    return true;
}

bool api_cancel_refused(struct api_req *r, const char *job_id, enum MHD_Result *ret)
{
    char owner[16] = "";
    if (r->scope >= STORE_SCOPE_ADMIN)
        return false;
    struct store *s = api_store(r);
    int rc = store_job_token(s, job_id, owner);
    if (rc == -ENOENT)
        return false; /* the handler answers 404 */
    if (rc) {
        *ret = api_store_error(r, rc, "job");
        return true;
    }
    if (owner[0] && strcmp(owner, r->token_id) == 0)
        return false;
    *ret = api_error(r, 403, "forbidden", NULL,
                     "job %s was not submitted by token %s; a submit token may cancel only "
                     "its own jobs",
                     job_id, r->token_id);
    return true;
}

/* ---- /v1/tokens (admin) ---- */

enum MHD_Result api_tokens_list(struct api_req *r)
{
    json_t *out = NULL;
    struct store *s = api_store(r);
    int rc = store_token_list(s, &out);
    return api_store_reply(r, rc, "tokens", out);
}

/* POST /v1/tokens {"scope":"submit","name":"ci","expires_in_s":2592000}:
 * 201 with the token's description and, this once, "token": the secret. */
enum MHD_Result api_tokens_create(struct api_req *r)
{
    enum MHD_Result ret;
    const char *k;
    json_t *v, *info = NULL;
    json_t *body = api_body_object(r, &ret);
    if (!body)
        return ret;
    json_object_foreach(body, k, v)
    {
        if (strcmp(k, "scope") && strcmp(k, "name") && strcmp(k, "expires_in_s")) {
            ret = api_error(r, 400, "unknown_field", k, "unknown field '%s'", k);
            goto out;
        }
    }
    int scope = store_scope_parse(json_string_value(json_object_get(body, "scope")));
    if (scope < 0) {
        ret = api_error(r, 400, "invalid_field", "scope", "scope must be read, submit or admin");
        goto out;
    }
    json_t *name = json_object_get(body, "name");
    if (name && (!json_is_string(name) || json_string_length(name) > AUTH_MAX_NAME ||
                 (json_string_length(name) > 0 &&
                  !api_valid_text(json_string_value(name), AUTH_MAX_NAME)))) {
        ret = api_error(r, 400, "invalid_field", "name",
                        "name must be a string of at most %d printable characters", AUTH_MAX_NAME);
        goto out;
    }
    json_t *exp = json_object_get(body, "expires_in_s");
    if (exp && !json_is_null(exp) &&
        (!json_is_integer(exp) || json_integer_value(exp) < 1 ||
         json_integer_value(exp) > AUTH_MAX_EXPIRY_S)) {
        ret = api_error(r, 400, "invalid_field", "expires_in_s",
                        "expires_in_s must be null or an integer in [1, %lld]",
                        (long long)AUTH_MAX_EXPIRY_S);
        goto out;
    }
    int64_t expires_at =
        exp && json_is_integer(exp) ? util_wall_ms() + json_integer_value(exp) * 1000 : 0;
    char token[STORE_TOKEN_LEN + 1];
    struct store *s = api_store(r);
    int rc =
        store_token_create(s, scope, name ? json_string_value(name) : "", expires_at, token, &info);
    if (rc) {
        ret = api_store_error(r, rc, "token");
        goto out;
    }
    json_object_set_new(info, "token", json_string(token));
    memset(token, 0, sizeof token);
    log_info("token_created", "id=%s scope=%s by=%s",
             json_string_value(json_object_get(info, "id")), store_scope_name(scope),
             r->token_id[0] ? r->token_id : "-");
    ret = api_json(r, 201, info);
out:
    json_decref(body);
    return ret;
}

enum MHD_Result api_tokens_revoke(struct api_req *r)
{
    const char *id = api_param(r, "id");
    struct store *s = api_store(r);
    int rc = store_token_revoke(s, id);
    if (rc && rc != -EALREADY)
        return api_store_error(r, rc, "token");
    log_info("token_revoked", "id=%s by=%s", log_q(id), r->token_id[0] ? r->token_id : "-");
    return api_json(r, 200, json_pack("{s:s,s:b}", "id", id, "revoked", 1));
}
