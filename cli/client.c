/*
 * cli/client.c - capctl's HTTP client: one libcurl easy handle per run, so
 * polling reuses its keep-alive connection. Redirects are not followed
 * (they would carry the token elsewhere) and the token is never printed.
 * The base URL, the token's checks and its header are util/http.h's, as
 * for capd-cell (worker/http.c); a reply is read into a util/buf.h buffer
 * whose ceiling is CTL_MAX_RESPONSE.
 */
#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <unistd.h>

#include "cli/capctl.h"
#include "util/buf.h"
#include "util/http.h"

const char *ctl_global_server;
const char *ctl_global_token;
const char *ctl_global_cacert;
const char *ctl_global_data_dir;

/* Whether URL (http[s]://HOST[:PORT]...) names this machine's loopback. */
static bool server_is_local(const char *url)
{
    const char *h = strstr(url, "://");
    h = h ? h + 3 : url;
    static const char *const local[] = {"127.", "localhost:", "localhost/", "[::1]"};
    if (strcasecmp(h, "localhost") == 0)
        return true;
    for (size_t i = 0; i < sizeof local / sizeof local[0]; i++)
        if (strncasecmp(h, local[i], strlen(local[i])) == 0)
            return true;
    return false;
}

/*
 * The first admin token capd wrote to DATA/admin.token (daemon/admin/admin_token.h),
 * for a local capd used without --token or CAPD_TOKEN. DATA is --data-dir,
 * else CAPD_DATA_DIR, else CTL_DEFAULT_DATA_DIR; the default is used only
 * for a loopback server, so a token of this machine's capd is never sent
 * to another host unless asked for. A file that cannot be read is no
 * token (the server then says 401). Fills BUF (a line of at most N-1
 * bytes) and returns true when one was read.
 */
static bool token_from_file(const struct ctl_args *a, const char *server, char *buf, size_t n)
{
    char path[1100];
    const char *dir = ctl_arg(a, "data-dir");
    if (!dir)
        dir = ctl_global_data_dir;
    if (!dir && (dir = getenv("CAPD_DATA_DIR")) != NULL && !*dir)
        dir = NULL;
    if (!dir && !server_is_local(server))
        return false;
    snprintf(path, sizeof path, "%s/admin.token", dir ? dir : CTL_DEFAULT_DATA_DIR);
    FILE *f = fopen(path, "re");
    if (!f)
        return false;
    bool ok = fgets(buf, (int)n, f) != NULL;
    fclose(f);
    buf[ok ? strcspn(buf, "\r\n") : 0] = 0;
    return ok && buf[0];
}

int ctl_client_open(struct ctl_client *c, const struct ctl_args *a)
{
    const char *server = ctl_arg(a, "server");
    const char *token = ctl_arg(a, "token");
    const char *from = "--server";
    memset(c, 0, sizeof *c);
    if (!server) {
        server = ctl_global_server;
    }
    if (!server && (server = getenv("CAPD_SERVER")) != NULL && *server)
        from = "CAPD_SERVER";
    if (!server || !*server) {
        server = CTL_DEFAULT_SERVER;
        from = "the default server";
    }
    if (!token)
        token = ctl_global_token;
    if (!token)
        token = getenv("CAPD_TOKEN");
    char file_token[256];
    if ((!token || !*token) && token_from_file(a, server, file_token, sizeof file_token))
        token = file_token;
    const char *cacert = ctl_arg(a, "cacert");
    const char *cafrom = "--cacert";
    if (!cacert)
        cacert = ctl_global_cacert;
    if (!cacert && (cacert = getenv("CAPD_CACERT")) != NULL)
        cafrom = "CAPD_CACERT";
    /* A CA file is how a self-signed capd certificate is trusted; it is
     * checked here so a typo is a usage error, not a TLS failure. */
    if (cacert && *cacert) {
        if (strlen(cacert) >= sizeof c->cacert)
            return ctl_usage_error(a->cmd, "%s is too long", cafrom);
        if (access(cacert, R_OK) != 0)
            return ctl_usage_error(a->cmd, "%s '%s' cannot be read: %s", cafrom, cacert,
                                   strerror(errno));
        snprintf(c->cacert, sizeof c->cacert, "%s", cacert);
    }
    int urc = util_http_base(server, c->server, sizeof c->server);
    if (urc == -EINVAL)
        return ctl_usage_error(a->cmd, "%s must be an http:// or https:// URL, got '%s'", from,
                               server);
    if (urc != 0)
        return ctl_usage_error(a->cmd, "%s is too long", from);
    if (token && *token) {
        if (!util_http_token_ok(token))
            return ctl_usage_error(a->cmd, "the token must not hold spaces or control characters");
        c->auth = util_http_bearer(token);
        explicit_bzero(file_token, sizeof file_token);
        if (!c->auth) {
            fprintf(stderr, "capctl: out of memory\n");
            return CTL_EXIT_ERROR;
        }
    }
    c->h = curl_easy_init();
    if (!c->h) {
        fprintf(stderr, "capctl: cannot initialize libcurl\n");
        return CTL_EXIT_ERROR;
    }
    return 0;
}

void ctl_client_close(struct ctl_client *c)
{
    if (c->h)
        curl_easy_cleanup(c->h);
    util_http_secret_free(c->auth);
    c->h = NULL;
    c->auth = NULL;
}

/* Where a reply's body goes while it comes. */
struct sink {
    struct ubuf body; /* at most CTL_MAX_RESPONSE bytes */
    int rc;           /* the append that cut it short: -E2BIG or -ENOMEM */
};

static size_t on_body(char *d, size_t sz, size_t nm, void *ud)
{
    struct sink *s = ud;
    s->rc = ubuf_add(&s->body, d, sz * nm);
    return s->rc == 0 ? sz * nm : 0;
}

/* The options every request carries, re-armed after curl_easy_reset():
 * http(s) only, no redirects (they would carry the token elsewhere), and
 * bounded connect and transfer times. */
static void request_options(struct ctl_client *c, const char *url, const char *method,
                            struct sink *s, char *errbuf)
{
    curl_easy_reset(c->h);
    curl_easy_setopt(c->h, CURLOPT_URL, url);
    curl_easy_setopt(c->h, CURLOPT_PROTOCOLS_STR, "http,https");
    curl_easy_setopt(c->h, CURLOPT_CUSTOMREQUEST, method);
    curl_easy_setopt(c->h, CURLOPT_WRITEFUNCTION, on_body);
    curl_easy_setopt(c->h, CURLOPT_WRITEDATA, s);
    curl_easy_setopt(c->h, CURLOPT_ERRORBUFFER, errbuf);
    curl_easy_setopt(c->h, CURLOPT_CONNECTTIMEOUT, 10L);
    curl_easy_setopt(c->h, CURLOPT_TIMEOUT, 300L);
    curl_easy_setopt(c->h, CURLOPT_NOSIGNAL, 1L);
    curl_easy_setopt(c->h, CURLOPT_FOLLOWLOCATION, 0L);
    curl_easy_setopt(c->h, CURLOPT_USERAGENT, "capctl/" CAPD_VERSION);
    curl_easy_setopt(c->h, CURLOPT_ACCEPT_ENCODING, "");
    if (c->cacert[0])
        curl_easy_setopt(c->h, CURLOPT_CAINFO, c->cacert);
}

/* The header list (*HL, the caller frees it) and the JSON body (*PAYLOAD,
 * the caller frees it): -1 with r->err set when BODY cannot be encoded. */
static int request_content(struct ctl_client *c, const char *method, const json_t *body,
                           const char *const *headers, struct curl_slist **hl, char **payload,
                           struct ctl_resp *r)
{
    *hl = curl_slist_append(*hl, "Expect:");
    *hl = curl_slist_append(*hl, "Accept: application/json");
    if (c->auth)
        *hl = curl_slist_append(*hl, c->auth);
    if (body) {
        *payload = json_dumps(body, JSON_COMPACT | JSON_ENSURE_ASCII);
        if (!*payload) {
            snprintf(r->err, sizeof r->err, "cannot encode the request body");
            return -1;
        }
        *hl = curl_slist_append(*hl, "Content-Type: application/json");
        curl_easy_setopt(c->h, CURLOPT_POSTFIELDS, *payload);
        curl_easy_setopt(c->h, CURLOPT_POSTFIELDSIZE_LARGE, (curl_off_t)strlen(*payload));
    } else if (strcmp(method, "GET") == 0) {
        curl_easy_setopt(c->h, CURLOPT_HTTPGET, 1L);
    }
    for (int i = 0; headers && headers[i]; i++)
        *hl = curl_slist_append(*hl, headers[i]);
    curl_easy_setopt(c->h, CURLOPT_HTTPHEADER, *hl);
    return 0;
}

/* What the transfer left: the status, the content type and a body that is
 * never NULL; or -1 with r->err saying why no response came. */
static int request_result(struct ctl_client *c, CURLcode cc, struct sink *s, const char *errbuf,
                          struct ctl_resp *r)
{
    if (cc != CURLE_OK) {
        if (s->rc == -E2BIG)
            snprintf(r->err, sizeof r->err, "the response is larger than %u MiB",
                     CTL_MAX_RESPONSE >> 20);
        else
            snprintf(r->err, sizeof r->err, "%s", errbuf[0] ? errbuf : curl_easy_strerror(cc));
        return -1;
    }
    curl_easy_getinfo(c->h, CURLINFO_RESPONSE_CODE, &r->status);
    char *ct = NULL;
    curl_easy_getinfo(c->h, CURLINFO_CONTENT_TYPE, &ct);
    snprintf(r->ctype, sizeof r->ctype, "%s", ct ? ct : "");
    if (!(r->body = ubuf_take(&s->body, &r->len))) {
        snprintf(r->err, sizeof r->err, "out of memory");
        return -1;
    }
    return 0;
}

int ctl_request(struct ctl_client *c, const char *method, const char *path, const json_t *body,
                const char *const *headers, struct ctl_resp *r)
{
    char url[CTL_MAX_URL + 1100];
    char errbuf[CURL_ERROR_SIZE] = "";
    struct curl_slist *hl = NULL;
    struct sink s = {.rc = 0};
    char *payload = NULL;
    int rc = -1;

    memset(r, 0, sizeof *r);
    ubuf_init(&s.body, CTL_MAX_RESPONSE);
    snprintf(url, sizeof url, "%s%s", c->server, path);
    request_options(c, url, method, &s, errbuf);
    if (request_content(c, method, body, headers, &hl, &payload, r) != 0)
        goto out;
    rc = request_result(c, curl_easy_perform(c->h), &s, errbuf, r);
out:
    /* Dropping the handle's reference to the header list before it is
     * freed; reset re-arms everything on the next request. */
    curl_easy_setopt(c->h, CURLOPT_HTTPHEADER, NULL);
    curl_easy_setopt(c->h, CURLOPT_ERRORBUFFER, NULL);
    curl_slist_free_all(hl);
    free(payload);
    ubuf_free(&s.body); /* what request_result() did not take */
    if (rc != 0)
        r->status = 0;
    return rc;
}

void ctl_resp_free(struct ctl_resp *r)
{
    free(r->body);
    memset(r, 0, sizeof *r);
}

json_t *ctl_resp_json(const struct ctl_resp *r)
{
    if (!r->body || r->len == 0)
        return NULL;
    return json_loadb(r->body, r->len, 0, NULL);
}

static json_t *error_obj(const struct ctl_resp *r, json_t **root)
{
    *root = ctl_resp_json(r);
    json_t *e = json_object_get(*root, "error");
    return json_is_object(e) ? e : NULL;
}

char *ctl_resp_error_field(const struct ctl_resp *r)
{
    json_t *root;
    json_t *e = error_obj(r, &root);
    const char *f = json_string_value(json_object_get(e, "field"));
    char *out = f ? strdup(f) : NULL;
    json_decref(root);
    return out;
}

void ctl_resp_error_code(const struct ctl_resp *r, char *buf, size_t cap)
{
    json_t *root;
    json_t *e = error_obj(r, &root);
    const char *code = json_string_value(json_object_get(e, "code"));
    snprintf(buf, cap, "%s", code ? code : "");
    json_decref(root);
}

void ctl_report(const struct ctl_client *c, const struct ctl_resp *r)
{
    char m[1024], k[128], f[256];
    if (r->status == 0) {
        fprintf(stderr, "capctl: cannot reach capd at %s: %s\n", ctl_clean(c->server, m, sizeof m),
                r->err[0] ? r->err : "no response");
        return;
    }
    json_t *root;
    json_t *e = error_obj(r, &root);
    const char *msg = json_string_value(json_object_get(e, "message"));
    const char *code = json_string_value(json_object_get(e, "code"));
    const char *field = json_string_value(json_object_get(e, "field"));
    if (msg && field)
        fprintf(stderr, "capctl: %s (%s, field %s)\n", ctl_clean(msg, m, sizeof m),
                ctl_clean(code ? code : "error", k, sizeof k), ctl_clean(field, f, sizeof f));
    else if (msg)
        fprintf(stderr, "capctl: %s (%s)\n", ctl_clean(msg, m, sizeof m),
                ctl_clean(code ? code : "error", k, sizeof k));
    else {
        /* Not capd's error shape (a proxy, a crash): the status and the
         * start of the body is all there is to say. */
        char snippet[200];
        size_t n = r->body ? strcspn(r->body, "\r\n") : 0;
        if (n > sizeof snippet - 1)
            n = sizeof snippet - 1;
        memcpy(snippet, r->body ? r->body : "", n);
        snippet[n] = 0;
        fprintf(stderr, "capctl: the server answered HTTP %ld%s%s\n", r->status, n ? ": " : "",
                ctl_clean(snippet, m, sizeof m));
    }
    json_decref(root);
}

/* The flag that sets FIELD, when the command has one: its option named
 * like the field's last part (options.seed is set by --seed, control_width
 * by --control-width), else the first entry of CMD->fields that names the
 * field or a prefix of it followed by '.'. NULL when neither does. */
static const char *field_flag(const struct ctl_cmd *cmd, const char *field, char *buf, size_t cap)
{
    const char *last = strrchr(field, '.');
    snprintf(buf, cap, "--%s", last ? last + 1 : field);
    for (char *p = buf; *p; p++)
        *p = *p == '_' ? '-' : *p;
    for (const struct ctl_opt *o = ctl_opts_of(cmd); o && o->name; o++)
        if (strcmp(o->name, buf + 2) == 0)
            return buf;
    for (const struct ctl_field_flag *m = cmd->fields; m && m->field; m++) {
        size_t n = strlen(m->field);
        if (strncmp(field, m->field, n) == 0 && (field[n] == 0 || field[n] == '.'))
            return m->flag;
    }
    return NULL;
}

void ctl_report_fields(const struct ctl_client *c, const struct ctl_resp *r,
                       const struct ctl_cmd *cmd)
{
    ctl_report(c, r);
    char *field = r->status ? ctl_resp_error_field(r) : NULL;
    if (!field)
        return;
    char buf[256], named[256], same[256];
    const char *flag = field_flag(cmd, field, named, sizeof named);
    /* "--name" for field "name" says nothing new. */
    snprintf(same, sizeof same, "--%s", field);
    for (char *p = same; *p; p++)
        *p = *p == '_' ? '-' : *p;
    if (flag && strcmp(same, flag) != 0)
        fprintf(stderr, "capctl: %s is set by %s\n", ctl_clean(field, buf, sizeof buf), flag);
    free(field);
}

char *ctl_escape(struct ctl_client *c, const char *s)
{
    char *e = curl_easy_escape(c->h, s, 0);
    char *out = e ? strdup(e) : NULL;
    curl_free(e);
    return out;
}

void ctl_url_init(struct ctl_url *u, const char *path)
{
    memset(u, 0, sizeof *u);
    ctl_url_lit(u, path);
}

void ctl_url_lit(struct ctl_url *u, const char *text)
{
    size_t n = strlen(text);
    if (u->overflow || u->n + n + 1 > sizeof u->buf) {
        u->overflow = true;
        return;
    }
    memcpy(u->buf + u->n, text, n + 1);
    u->n += n;
}

void ctl_url_seg(struct ctl_client *c, struct ctl_url *u, const char *segment)
{
    char *e = ctl_escape(c, segment);
    if (!e) {
        u->overflow = true;
        return;
    }
    ctl_url_lit(u, "/");
    ctl_url_lit(u, e);
    free(e);
}

void ctl_url_query(struct ctl_client *c, struct ctl_url *u, const char *key, const char *val)
{
    char *e = ctl_escape(c, val);
    if (!e) {
        u->overflow = true;
        return;
    }
    ctl_url_lit(u, u->has_query ? "&" : "?");
    u->has_query = true;
    ctl_url_lit(u, key);
    ctl_url_lit(u, "=");
    ctl_url_lit(u, e);
    free(e);
}

void ctl_url_query_args(struct ctl_client *c, struct ctl_url *u, const struct ctl_args *a,
                        const char *const *keys)
{
    for (int i = 0; keys[i]; i++) {
        const char *v = ctl_arg(a, keys[i]);
        if (v)
            ctl_url_query(c, u, keys[i], v);
    }
}

/* Every command that expects one status of one request says why it did
 * not get it the same way. */
int ctl_call(struct ctl_client *c, const char *method, const char *path, const json_t *body,
             long want, json_t **out)
{
    struct ctl_resp r = {0};
    int rc = CTL_EXIT_ERROR;
    *out = NULL;
    if (ctl_request(c, method, path, body, NULL, &r) != 0 || r.status != want) {
        ctl_report(c, &r);
    } else {
        *out = ctl_resp_json(&r);
        rc = 0;
    }
    ctl_resp_free(&r);
    return rc;
}

int ctl_get_list(struct ctl_client *c, const char *path, const char *key, json_t **doc,
                 json_t **list)
{
    *list = NULL;
    if (ctl_call(c, "GET", path, NULL, 200, doc) != 0)
        return CTL_EXIT_ERROR;
    *list = key ? json_object_get(*doc, key) : *doc;
    if (key && !json_is_array(*list)) {
        fprintf(stderr, "capctl: unexpected reply from GET %s\n", path);
        return CTL_EXIT_ERROR;
    }
    return 0;
}

int ctl_get_object(struct ctl_client *c, const struct ctl_cmd *cmd, const char *base,
                   const char *id, const char *what, json_t **out)
{
    struct ctl_url u;
    ctl_url_init(&u, base);
    ctl_url_seg(c, &u, id);
    if (u.overflow)
        return ctl_usage_error(cmd, "the %s is too long", what);
    if (ctl_call(c, "GET", u.buf, NULL, 200, out) != 0)
        return CTL_EXIT_ERROR;
    if (!json_is_object(*out)) {
        fprintf(stderr, "capctl: unexpected reply from GET %s\n", u.buf);
        json_decref(*out);
        *out = NULL;
        return CTL_EXIT_ERROR;
    }
    return 0;
}

/* Showing one object (a job, a build) is the same for every command that
 * does it: only the printer differs. */
int ctl_show_object(struct ctl_client *c, const struct ctl_args *a, const char *base,
                    const char *what, void (*print)(json_t *obj))
{
    json_t *j = NULL;
    int rc = ctl_get_object(c, a->cmd, base, a->pos[0], what, &j);
    if (rc == 0 && ctl_has(a, "json"))
        ctl_print_json(stdout, j);
    else if (rc == 0)
        print(j);
    json_decref(j);
    return rc;
}

/* Listing (builds, widths, alerts) is the same for every command that does
 * it: only the printer differs. */
int ctl_show_list(struct ctl_client *c, const struct ctl_args *a, const char *path, const char *key,
                  int (*print)(struct ctl_client *c, const struct ctl_args *a, json_t *list))
{
    json_t *doc = NULL, *list;
    int rc = ctl_get_list(c, path, key, &doc, &list);
    if (rc == 0 && ctl_has(a, "json"))
        ctl_print_json(stdout, doc);
    else if (rc == 0)
        rc = print(c, a, list);
    json_decref(doc);
    return rc;
}
