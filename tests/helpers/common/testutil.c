#include <curl/curl.h>
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdbool.h>
#include <spawn.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "tests/helpers/common/testutil.h"

extern char **environ;

char *tu_tmpdir(void)
{
    const char *t = getenv("TMPDIR");
    char *p;
    if (asprintf(&p, "%s/capd-test-XXXXXX", t && *t ? t : "/tmp") < 0)
        return NULL;
    if (!mkdtemp(p)) {
        free(p);
        return NULL;
    }
    return p;
}

const char *tu_bin(const char *env)
{
    const char *v = getenv(env);
    return v ? v : "";
}

char *tu_helper(const char *name)
{
    char *p;
    if (asprintf(&p, "%s/%s", tu_bin("CAPD_HELPER_DIR"), name) < 0)
        return NULL;
    return p;
}

/* capd writes its first admin token before it prints the listening line,
 * so the file, when there is one, is complete by now. */
static void read_admin_token(struct tu_capd *c)
{
    char p[400];
    snprintf(p, sizeof p, "%s/data/admin.token", c->dir);
    c->token[0] = 0;
    FILE *f = fopen(p, "re");
    if (!f)
        return;
    if (!fgets(c->token, sizeof c->token, f))
        c->token[0] = 0;
    fclose(f);
    c->token[strcspn(c->token, "\n")] = 0;
}

void tu_anonymous(struct tu_capd *c)
{
    c->token[0] = 0;
}

/*
 * Every capd a test started and has not stopped yet. Criterion ends a test
 * at its first failed assertion, before the test's own tu_capd_stop; the
 * test's process then exits, and this kills what is left so that a failed
 * run leaves no daemon behind (capd's cells die with it: parent-death
 * signal). A test process killed outright (a timeout) runs no atexit: its
 * capd was started through die_with_parent, which the kernel then kills.
 */
#define TU_MAX_LIVE 64
static pid_t live[TU_MAX_LIVE];

static void live_reap(void)
{
    for (int i = 0; i < TU_MAX_LIVE; i++) {
        if (live[i] > 0) {
            kill(live[i], SIGKILL);
            waitpid(live[i], NULL, 0);
            live[i] = 0;
        }
    }
}

static int live_add(pid_t pid)
{
    static bool hooked;
    if (!hooked && atexit(live_reap) == 0)
        hooked = true;
    for (int i = 0; i < TU_MAX_LIVE; i++) {
        if (live[i] <= 0) {
            live[i] = pid;
            return 0;
        }
    }
    fprintf(stderr, "testutil: more than %d capd processes at once; refusing another\n",
            TU_MAX_LIVE);
    return -1;
}

static void live_del(pid_t pid)
{
    for (int i = 0; i < TU_MAX_LIVE; i++)
        if (live[i] == pid)
            live[i] = 0;
}

int tu_capd_start(struct tu_capd *c, const char *dir, const char *const *extra)
{
    memset(c, 0, sizeof *c);
    if (dir) {
        snprintf(c->dir, sizeof c->dir, "%s", dir);
    } else {
        char *d = tu_tmpdir();
        if (!d)
            return -1;
        snprintf(c->dir, sizeof c->dir, "%s", d);
        free(d);
    }
    /* capd running as root runs cells as run_as_user (nobody), which must
     * be able to search down to DIR/data/scratch; mkdtemp made DIR 0700.
     * Tests register DIR as a model root too, which the cell user must be
     * able to list (capd checks at registration): 0755. */
    chmod(c->dir, 0755);
    snprintf(c->errlog, sizeof c->errlog, "%s/capd.stderr", c->dir);
    int out[2];
    if (pipe2(out, O_CLOEXEC) != 0)
        return -1;
    const char *argv[64];
    int a = 0;
    char datadir[300];
    snprintf(datadir, sizeof datadir, "%s/data", c->dir);
    /* through die_with_parent: a test killed at its timeout runs no
     * atexit, and its capd must die with it all the same */
    static char guard[600], me[32];
    snprintf(guard, sizeof guard, "%s/die_with_parent", tu_bin("CAPD_HELPER_DIR"));
    snprintf(me, sizeof me, "%ld", (long)getpid());
    argv[a++] = guard;
    argv[a++] = me;
    argv[a++] = tu_bin("CAPD_BIN");
    argv[a++] = "--listen";
    argv[a++] = "127.0.0.1:0";
    argv[a++] = "--data-dir";
    argv[a++] = datadir;
    for (int i = 0; extra && extra[i] && a < 63; i++)
        argv[a++] = extra[i];
    argv[a] = NULL;
    const struct tu_fd fds[3] = {
        {0}, {.from = out[1]}, {.path = c->errlog, .flags = O_WRONLY | O_CREAT | O_APPEND}};
    int rc = tu_spawn(&c->pid, argv, NULL, fds);
    close(out[1]);
    if (rc != 0) {
        close(out[0]);
        return -1;
    }
    if (live_add(c->pid) != 0) {
        close(out[0]);
        kill(c->pid, SIGKILL);
        waitpid(c->pid, NULL, 0);
        c->pid = 0;
        return -1;
    }
    /* Read the "capd listening on ADDR:PORT" line. */
    char line[256];
    size_t n = 0;
    while (n < sizeof line - 1) {
        ssize_t r = read(out[0], line + n, 1);
        if (r <= 0)
            break;
        if (line[n] == '\n')
            break;
        n++;
    }
    line[n] = 0;
    close(out[0]);
    char *colon = strrchr(line, ':');
    if (!colon || strncmp(line, "capd listening on", 17) != 0) {
        int st;
        waitpid(c->pid, &st, 0);
        live_del(c->pid);
        c->pid = 0;
        return -1;
    }
    c->port = atoi(colon + 1);
    read_admin_token(c);
    snprintf(c->base, sizeof c->base, "%s://127.0.0.1:%d",
             strstr(line, "https://") ? "https" : "http", c->port);
    return 0;
}

static int wait_status(pid_t pid)
{
    int st = 0;
    while (waitpid(pid, &st, 0) < 0 && errno == EINTR)
        ;
    return WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
}

int tu_capd_stop(struct tu_capd *c)
{
    if (c->pid <= 0)
        return -1;
    kill(c->pid, SIGTERM);
    int rc = wait_status(c->pid);
    live_del(c->pid);
    c->pid = 0;
    return rc;
}

void tu_capd_kill9(struct tu_capd *c)
{
    if (c->pid <= 0)
        return;
    kill(c->pid, SIGKILL);
    wait_status(c->pid);
    live_del(c->pid);
    c->pid = 0;
}

void tu_resp_free(struct tu_resp *r)
{
    free(r->body);
    free(r->headers);
    memset(r, 0, sizeof *r);
}

struct buf {
    char *p;
    size_t n;
};

int tu_append(char **text, size_t *len, const char *d, size_t n)
{
    char *t = realloc(*text, *len + n + 1);
    if (!t)
        return -ENOMEM;
    memcpy(t + *len, d, n);
    *text = t;
    *len += n;
    t[*len] = 0;
    return 0;
}

static size_t on_data(char *d, size_t sz, size_t nm, void *ud)
{
    struct buf *b = ud;
    size_t n = sz * nm;
    return tu_append(&b->p, &b->n, d, n) == 0 ? n : 0;
}

int tu_http(const struct tu_capd *c, const char *method, const char *path, const char *body,
            size_t body_len, const char *const *headers, struct tu_resp *out)
{
    CURL *h = curl_easy_init();
    struct buf b = {0}, hb = {0};
    struct curl_slist *hl = NULL;
    char url[2048];
    memset(out, 0, sizeof *out);
    if (!h)
        return -1;
    snprintf(url, sizeof url, "%s%s", c->base, path);
    curl_easy_setopt(h, CURLOPT_URL, url);
    curl_easy_setopt(h, CURLOPT_CUSTOMREQUEST, method);
    curl_easy_setopt(h, CURLOPT_WRITEFUNCTION, on_data);
    curl_easy_setopt(h, CURLOPT_WRITEDATA, &b);
    curl_easy_setopt(h, CURLOPT_HEADERFUNCTION, on_data);
    curl_easy_setopt(h, CURLOPT_HEADERDATA, &hb);
    curl_easy_setopt(h, CURLOPT_TIMEOUT, 120L);
    curl_easy_setopt(h, CURLOPT_NOSIGNAL, 1L);
    if (c->cacert[0])
        curl_easy_setopt(h, CURLOPT_CAINFO, c->cacert);
    if (body) {
        curl_easy_setopt(h, CURLOPT_POSTFIELDS, body);
        curl_easy_setopt(h, CURLOPT_POSTFIELDSIZE_LARGE, (curl_off_t)body_len);
    }
    hl = curl_slist_append(hl, "Expect:");
    bool has_auth = false;
    for (int i = 0; headers && headers[i]; i++) {
        hl = curl_slist_append(hl, headers[i]);
        has_auth = has_auth || strncasecmp(headers[i], "Authorization:", 14) == 0;
    }
    char auth[200];
    if (c->token[0] && !has_auth) {
        snprintf(auth, sizeof auth, "Authorization: Bearer %s", c->token);
        hl = curl_slist_append(hl, auth);
    }
    curl_easy_setopt(h, CURLOPT_HTTPHEADER, hl);
    CURLcode cc = curl_easy_perform(h);
    curl_easy_getinfo(h, CURLINFO_RESPONSE_CODE, &out->status);
    curl_slist_free_all(hl);
    curl_easy_cleanup(h);
    out->body = b.p ? b.p : strdup("");
    out->len = b.n;
    out->headers = hb.p ? hb.p : strdup("");
    return cc == CURLE_OK ? 0 : -1;
}

json_t *tu_json(const struct tu_capd *c, const char *method, const char *path, const char *body,
                long *status)
{
    const char *hdr[] = {"Content-Type: application/json", NULL};
    struct tu_resp r;
    tu_http(c, method, path, body, body ? strlen(body) : 0, body ? hdr : NULL, &r);
    if (status)
        *status = r.status;
    json_t *j = json_loadb(r.body, r.len, 0, NULL);
    tu_resp_free(&r);
    return j ? j : json_null();
}

char *tu_vfmt(const char *fmt, va_list ap)
{
    char *s = NULL;
    if (vasprintf(&s, fmt, ap) < 0)
        s = NULL;
    return s;
}

json_t *tu_jsonf(const struct tu_capd *c, const char *method, const char *path, long *status,
                 const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    char *body = tu_vfmt(fmt, ap);
    va_end(ap);
    json_t *j = tu_json(c, method, path, body, status);
    free(body);
    return j;
}

json_t *tu_wait_job(const struct tu_capd *c, const char *job_id, int timeout_s)
{
    char path[128];
    snprintf(path, sizeof path, "/v1/jobs/%s", job_id);
    struct timespec t0, now;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    for (;;) {
        json_t *j = tu_json(c, "GET", path, NULL, NULL);
        const char *st = json_string_value(json_object_get(j, "state"));
        if (st && (strcmp(st, "done") == 0 || strcmp(st, "cancelled") == 0))
            return j;
        json_decref(j);
        clock_gettime(CLOCK_MONOTONIC, &now);
        if (now.tv_sec - t0.tv_sec > timeout_s)
            return NULL;
        usleep(50 * 1000);
    }
}

bool tu_width_runnable(const struct tu_capd *c, const char *width)
{
    json_t *w = tu_json(c, "GET", "/v1/widths", NULL, NULL);
    bool ok = false;
    size_t i;
    json_t *row;
    json_array_foreach(json_object_get(w, "widths"), i, row)
    {
        if (!strcmp(json_string_value(json_object_get(row, "name")), width))
            ok = json_is_true(json_object_get(row, "runnable_here"));
    }
    json_decref(w);
    return ok;
}

const char *tu_widest_width(const struct tu_capd *c)
{
    return tu_width_runnable(c, "avx512") ? "avx512"
           : tu_width_runnable(c, "avx2") ? "avx2"
                                          : "default";
}

long tu_fake_build(const struct tu_capd *c, const char *name, const char *env_json)
{
    long status = 0;
    char *fake = tu_helper("fake_runner");
    json_t *j = tu_jsonf(c, "POST", "/v1/builds", &status,
                         "{\"name\":\"%s\",\"python\":\"%s\",\"env\":%s,"
                         "\"model_roots\":[\"%s\"]}",
                         name, fake, env_json ? env_json : "{}", c->dir);
    json_decref(j);
    free(fake);
    return status;
}

char *tu_submit(const struct tu_capd *c, const char *build, const char *model, const char *options)
{
    long status = 0;
    json_t *j = tu_jsonf(c, "POST", "/v1/jobs", &status,
                         "{\"project\":\"t\",\"commit\":\"abcdef1\",\"build\":\"%s\","
                         "\"matrix\":{\"models\":[\"%s\"],\"widths\":[\"avx2\"],"
                         "\"passes\":[\"forward\"]},\"options\":%s}",
                         build, model, options ? options : "{}");
    const char *id = json_string_value(json_object_get(j, "id"));
    char *r = status == 201 && id ? strdup(id) : NULL;
    json_decref(j);
    return r;
}

int tu_count_fds(pid_t pid)
{
    char p[64];
    snprintf(p, sizeof p, "/proc/%d/fd", (int)pid);
    DIR *d = opendir(p);
    int n = 0;
    if (!d)
        return -1;
    struct dirent *e;
    while ((e = readdir(d)) != NULL)
        if (e->d_name[0] != '.')
            n++;
    closedir(d);
    return n;
}

int tu_count_zombies(pid_t ppid)
{
    DIR *d = opendir("/proc");
    int n = 0;
    struct dirent *e;
    while (d && (e = readdir(d)) != NULL) {
        char p[300], buf[512];
        snprintf(p, sizeof p, "/proc/%s/stat", e->d_name);
        FILE *f = fopen(p, "r");
        if (!f)
            continue;
        if (fgets(buf, sizeof buf, f)) {
            char *rp = strrchr(buf, ')');
            char state;
            int pp;
            if (rp && sscanf(rp + 2, "%c %d", &state, &pp) == 2 && pp == ppid && state == 'Z')
                n++;
        }
        fclose(f);
    }
    if (d)
        closedir(d);
    return n;
}

int tu_spawn_to_files(pid_t *pid, const char *const *argv, const char *const *envp, const char *out,
                      const char *err)
{
    const struct tu_fd fds[3] = {{.path = "/dev/null", .flags = O_RDONLY},
                                 {.path = out, .flags = O_WRONLY | O_CREAT | O_TRUNC},
                                 {.path = err, .flags = O_WRONLY | O_CREAT | O_TRUNC}};
    return tu_spawn(pid, argv, envp, fds);
}

int tu_spawn(pid_t *pid, const char *const *argv, const char *const *envp,
             const struct tu_fd fds[3])
{
    posix_spawn_file_actions_t fa;
    posix_spawn_file_actions_init(&fa);
    for (int fd = 0; fd < 3; fd++) {
        if (fds[fd].from)
            posix_spawn_file_actions_adddup2(&fa, fds[fd].from, fd);
        else if (fds[fd].path)
            posix_spawn_file_actions_addopen(&fa, fd, fds[fd].path, fds[fd].flags, 0644);
    }
    int rc = posix_spawn(pid, argv[0], &fa, NULL, (char *const *)argv,
                         envp ? (char *const *)envp : environ);
    posix_spawn_file_actions_destroy(&fa);
    return rc;
}

int tu_sh(const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    char *cmd = tu_vfmt(fmt, ap);
    va_end(ap);
    if (!cmd)
        return -1;
    pid_t pid;
    const char *argv[] = {"/bin/sh", "-c", cmd, NULL};
    int rc = posix_spawn(&pid, "/bin/sh", NULL, NULL, (char *const *)argv, environ);
    free(cmd);
    if (rc != 0)
        return -1;
    return wait_status(pid);
}

char *tu_slurp(const char *path)
{
    FILE *f = fopen(path, "rb");
    if (!f)
        return strdup("");
    char *buf = NULL;
    size_t n = 0, cap = 0, r;
    char chunk[4096];
    while ((r = fread(chunk, 1, sizeof chunk, f)) > 0) {
        if (n + r + 1 > cap) {
            cap = (n + r + 1) * 2;
            char *nb = realloc(buf, cap);
            if (!nb)
                break;
            buf = nb;
        }
        memcpy(buf + n, chunk, r);
        n += r;
    }
    fclose(f);
    if (!buf)
        return strdup("");
    buf[n] = 0;
    return buf;
}

double tu_now_s(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + (double)t.tv_nsec / 1e9;
}

const char *tu_jstr(json_t *j, const char *key)
{
    return json_string_value(json_object_get(j, key));
}

const char *tu_str(json_t *j, const char *key)
{
    const char *v = json_string_value(json_object_get(j, key));
    return v ? v : "";
}

double tu_metric(const struct tu_capd *c, const char *series)
{
    struct tu_resp r;
    tu_http(c, "GET", "/metrics", NULL, 0, NULL, &r);
    double v = -1;
    size_t n = strlen(series);
    for (char *l = r.body; l && *l;) {
        char *e = strchr(l, '\n');
        if (strncmp(l, series, n) == 0 && l[n] == ' ')
            v = strtod(l + n + 1, NULL);
        l = e ? e + 1 : NULL;
    }
    tu_resp_free(&r);
    return v;
}

const char *tu_python(void)
{
    const char *p = getenv("CAPD_PYTHON");
    return p && *p ? p : "/usr/bin/python3";
}

struct tu_sse {
    const char *until;
    char *text;
    size_t len;
};

static size_t sse_write(char *d, size_t sz, size_t nm, void *ud)
{
    struct tu_sse *s = ud;
    size_t n = sz * nm;
    char *t = realloc(s->text, s->len + n + 1);
    if (!t)
        return 0;
    s->text = t;
    memcpy(s->text + s->len, d, n);
    s->len += n;
    s->text[s->len] = 0;
    return strstr(s->text, s->until) ? 0 : n; /* enough: abort the transfer */
}

char *tu_events_until(const struct tu_capd *c, const char *path, const char *until, int timeout_ms)
{
    struct tu_sse s = {.until = until};
    CURL *h = curl_easy_init();
    char url[512], auth[200];
    struct curl_slist *hl = NULL;
    snprintf(url, sizeof url, "%s%s", c->base, path);
    if (c->token[0]) {
        snprintf(auth, sizeof auth, "Authorization: Bearer %s", c->token);
        hl = curl_slist_append(hl, auth);
    }
    hl = curl_slist_append(hl, "Last-Event-ID: 0");
    curl_easy_setopt(h, CURLOPT_URL, url);
    curl_easy_setopt(h, CURLOPT_HTTPHEADER, hl);
    curl_easy_setopt(h, CURLOPT_WRITEFUNCTION, sse_write);
    curl_easy_setopt(h, CURLOPT_WRITEDATA, &s);
    curl_easy_setopt(h, CURLOPT_TIMEOUT_MS, (long)timeout_ms);
    curl_easy_setopt(h, CURLOPT_NOSIGNAL, 1L);
    if (c->cacert[0])
        curl_easy_setopt(h, CURLOPT_CAINFO, c->cacert);
    curl_easy_perform(h);
    curl_slist_free_all(hl);
    curl_easy_cleanup(h);
    return s.text ? s.text : strdup("");
}
