/*
 * daemon/prefork/zygote.c - the pool of prefork zygotes (see zygote.h and
 * docs/prefork.md).
 *
 * A zygote is keyed by its build (name and revision: replacing a build
 * starts a new one) and by the environment it imported the framework
 * under: the cell's environment less the per-cell variables. A cell whose
 * environment differs (another thread count, say) gets its own zygote, and
 * the zygote checks the same equality again on every request, so a cell is
 * only ever forked from a process that imported the framework exactly as a
 * fresh exec of that cell would have.
 */
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include "daemon/child/cellenv.h"
#include "daemon/child/launch.h"
#include "storage/layout.h"
#include "util/log.h"
#include "daemon/child/runas.h"
#include "daemon/cpu/widths.h"
#include "daemon/prefork/zygote.h"

#define ZYG_IDLE_EXIT_S 600
#define ZYG_LINE_MAX    8192
#define ZYG_LOG_MAX     (4u << 20)
#define ZYG_MAX_KEYS    64

struct zyg {
    struct zyg *next;
    char build[72];
    int64_t rev;
    uint64_t key;
    char sock[sizeof(((struct sockaddr_un *)0)->sun_path)];
    char scratch[700];
    uv_process_t proc;
    uv_pipe_t status;
    int handles;
    bool exited, ready, refused;
    bool timing_only; /* of a build without prefork: serves paired cells' timing templates */
    char line[ZYG_LINE_MAX];
    size_t linelen;
};

static struct {
    uv_loop_t *loop;
    const struct capd_config *cfg;
    struct store *st;
    struct zyg *list;
    unsigned gen;
    int nkeys;
    char keys[ZYG_MAX_KEYS][64]; /* per-cell variables: never part of the key */
    char keys_csv[ZYG_MAX_KEYS * 64];
} Z;

static void add_key(const char *k)
{
    for (int i = 0; i < Z.nkeys; i++)
        if (strcmp(Z.keys[i], k) == 0)
            return;
    if (Z.nkeys >= ZYG_MAX_KEYS || strlen(k) >= sizeof Z.keys[0]) {
        /* Then the variable would be part of the zygote's identity: one
         * zygote per value, correct but slow, and a bug of the width table. */
        log_error("zygote_cell_key_refused", "key=%s max_keys=%d max_len=%zu", log_q(k),
                  ZYG_MAX_KEYS, sizeof Z.keys[0] - 1);
        return;
    }
    snprintf(Z.keys[Z.nkeys++], sizeof Z.keys[0], "%s", k);
    size_t o = strlen(Z.keys_csv);
    snprintf(Z.keys_csv + o, sizeof Z.keys_csv - o, "%s%s", o ? "," : "", k);
}

/* The per-cell variables: the spec path, HOME (a cell running as
 * run_as_user has its scratch dir as HOME), the width's name and every
 * width variable. */
void zyg_init(uv_loop_t *loop, const struct capd_config *cfg, struct store *st)
{
    Z.loop = loop;
    Z.cfg = cfg;
    Z.st = st;
    add_key("CAPD_CELL_SPEC");
    add_key("HOME");
    add_key("CAPD_WIDTH");
    size_t i;
    json_t *w;
    json_array_foreach(json_object_get(widths_table(), "widths"), i, w)
    {
        const char *k;
        json_t *v;
        json_object_foreach(json_object_get(w, "env"), k, v)
        {
            add_key(k);
        }
    }
}

static bool is_cell_key(const char *kv)
{
    const char *eq = strchr(kv, '=');
    size_t n = eq ? (size_t)(eq - kv) : strlen(kv);
    for (int i = 0; i < Z.nkeys; i++)
        if (strlen(Z.keys[i]) == n && strncmp(Z.keys[i], kv, n) == 0)
            return true;
    return false;
}

/* What differs between any two attempts whatever their width: the spec
 * path and HOME, the per-cell variables of a timing-only zygote. */
#define ATTEMPT_KEYS "CAPD_CELL_SPEC,HOME"

static bool is_attempt_key(const char *kv)
{
    return strncmp(kv, "CAPD_CELL_SPEC=", 15) == 0 || strncmp(kv, "HOME=", 5) == 0;
}

static int cmp_str(const void *a, const void *b)
{
    return strcmp(*(char *const *)a, *(char *const *)b);
}

static uint64_t fnv(uint64_t h, const void *p, size_t n)
{
    const unsigned char *c = p;
    for (size_t i = 0; i < n; i++) {
        h ^= c[i];
        h *= 0x100000001b3ull;
    }
    return h;
}

/* The zygote's environment (the cell's less its per-cell variables, in a
 * stable order) and its hash. A TIMING_ONLY zygote keeps the width's
 * variables: a build's start-up code that reads them (CAPD_WIDTH, a width
 * variable) runs in the zygote, unverified, so it must see the cell's.
 * Caller frees the array, not the strings. */
static char **zygote_env(char *const *env, bool timing_only, uint64_t *key)
{
    size_t k;
    char **out = cellenv_without(env, timing_only ? is_attempt_key : is_cell_key, 0, &k);
    if (!out)
        return NULL;
    qsort(out, k, sizeof *out, cmp_str);
    uint64_t h = 0xcbf29ce484222325ull;
    for (size_t i = 0; i < k; i++)
        h = fnv(h, out[i], strlen(out[i]) + 1);
    *key = h;
    return out;
}

static void on_closed(uv_handle_t *h)
{
    struct zyg *z = h->data;
    if (--z->handles > 0)
        return;
    for (struct zyg **pp = &Z.list; *pp; pp = &(*pp)->next)
        if (*pp == z) {
            *pp = z->next;
            break;
        }
    free(z);
}

static void zyg_close(struct zyg *z)
{
    if (!uv_is_closing((uv_handle_t *)&z->status))
        uv_close((uv_handle_t *)&z->status, on_closed);
    if (!uv_is_closing((uv_handle_t *)&z->proc))
        uv_close((uv_handle_t *)&z->proc, on_closed);
}

/* The status pipe is closed at its EOF (on_status), not here, so a last
 * status line written just before exiting is still read. */
static void on_exit_cb(uv_process_t *p, int64_t status, int sig)
{
    struct zyg *z = p->data;
    z->exited = true;
    unlink(z->sock);
    if (z->refused || (status == 0 && sig == 0))
        log_info("zygote_exited", "build=%s pid=%d status=%lld", log_q(z->build), p->pid,
                 (long long)status);
    else
        log_warn("zygote_died",
                 "build=%s pid=%d status=%lld signal=%d (the next prefork cell "
                 "starts a new one)",
                 log_q(z->build), p->pid, (long long)status, sig);
    uv_close((uv_handle_t *)p, on_closed);
}

/* One status line from the zygote: {"event":"ready",...} or
 * {"event":"refused","reason":...}. The outcome of a verification is
 * stored on the build (for the revision that was verified only). */
static void on_line(struct zyg *z, const char *line)
{
    json_t *j = json_loads(line, 0, NULL);
    const char *ev = json_string_value(json_object_get(j, "event"));
    if (ev && strcmp(ev, "ready") == 0) {
        z->ready = true;
        bool verified = json_is_true(json_object_get(j, "verified"));
        log_info("zygote_ready", "build=%s pid=%d import_s=%.2f verified=%s verify_s=%.2f",
                 log_q(z->build), z->proc.pid, json_number_value(json_object_get(j, "import_s")),
                 verified ? "yes" : "no", json_number_value(json_object_get(j, "verify_s")));
        if (verified && !z->timing_only &&
            store_build_prefork_set(Z.st, z->build, z->rev, "verified", NULL) != 0)
            log_error("zygote_store_failed", "build=%s err=%s", log_q(z->build),
                      log_q(store_errmsg(Z.st)));
    } else if (ev && strcmp(ev, "refused") == 0) {
        const char *reason = json_string_value(json_object_get(j, "reason"));
        z->refused = true;
        log_warn("prefork_refused", "build=%s reason=%s", log_q(z->build), log_q(reason));
        if (!z->timing_only && store_build_prefork_set(Z.st, z->build, z->rev, "refused",
                                                       reason ? reason : "refused") != 0)
            log_error("zygote_store_failed", "build=%s err=%s", log_q(z->build),
                      log_q(store_errmsg(Z.st)));
    } else {
        log_warn("zygote_bad_status", "build=%s line=%s", log_q(z->build), log_q(line));
    }
    json_decref(j);
}

static void on_alloc(uv_handle_t *h, size_t suggested, uv_buf_t *b)
{
    static char buf[4096];
    (void)h;
    (void)suggested;
    b->base = buf;
    b->len = sizeof buf;
}

static void on_status(uv_stream_t *h, ssize_t n, const uv_buf_t *b)
{
    struct zyg *z = h->data;
    if (n < 0) {
        uv_read_stop(h);
        if (!uv_is_closing((uv_handle_t *)h))
            uv_close((uv_handle_t *)h, on_closed);
        return;
    }
    for (ssize_t i = 0; i < n; i++) {
        char c = b->base[i];
        if (c == '\n') {
            z->line[z->linelen] = 0;
            on_line(z, z->line);
            z->linelen = 0;
        } else if (z->linelen + 1 < sizeof z->line) {
            z->line[z->linelen++] = c;
        }
    }
}

static int mkdir_mode(const char *p, mode_t m)
{
    if (mkdir(p, m) != 0 && errno != EEXIST)
        return -errno;
    return 0;
}

/*
 * What the zygote checks before serving: the build's cells at every width
 * this host can run (its arch and CPU features, daemon/cpu/widths.h), forward
 * and backward, on the smallest zoo model, each forked and by fresh exec.
 * The full matrix is proven by tests/test_prefork.c and bench/run; this is
 * the per-build guard.
 */
static int write_verify(const char *path, const char *scratch, char *const *zenv)
{
    json_t *widths = json_object();
    size_t i;
    json_t *w;
    json_array_foreach(json_object_get(widths_table(), "widths"), i, w)
    {
        const char *name = json_string_value(json_object_get(w, "name"));
        char why[300], missing[256];
        if (json_is_null(json_object_get(w, "effective")) ||
            !width_runnable(name, why, sizeof why, missing, sizeof missing))
            continue;
        json_object_set(widths, name, json_object_get(w, "env"));
    }
    long threads = 1;
    for (char *const *e = zenv; *e; e++)
        if (strncmp(*e, "OMP_NUM_THREADS=", 16) == 0)
            threads = strtol(*e + 16, NULL, 10) > 0 ? strtol(*e + 16, NULL, 10) : 1;
    char vdir[800];
    snprintf(vdir, sizeof vdir, "%s/verify", scratch);
    long ncpu = sysconf(_SC_NPROCESSORS_ONLN);
    json_t *o = json_pack("{s:o,s:[s],s:[s,s],s:s,s:{s:i,s:i,s:I,s:s,s:i,s:i,s:s},s:I}", "widths",
                          widths, "models", "mlp", "passes", "forward", "backward", "scratch", vdir,
                          "options", "iterations", 0, "warmup", 0, "threads", (json_int_t)threads,
                          "capture", "stats", "seed", 0, "batch", 2, "dtype", "float32", "parallel",
                          (json_int_t)(ncpu > 0 ? ncpu : 1));
    int rc = o && json_dump_file(o, path, JSON_COMPACT) == 0 ? 0 : -EIO;
    json_decref(o);
    return rc;
}

/* What spawn() sets up for one zygote: the descriptors it closes at the
 * end (the zygote holds its own copies), the paths, and the command line
 * and HOME, whose strings must live as long as the arrays that point at
 * them. */
struct zyg_setup {
    int lfd, logfd, sp[2];
    char dir[600], logp[700], vpath[800], reason[2048];
    char me[24], cells[24], idle[16], home[720];
    struct launch_argv la;
};

/* The zygote's socket path (unique per zygote and per capd) under
 * DATA_DIR/zygote, and its scratch directory with the verify file's path;
 * the socket path must fit sun_path, so a long data_dir fails here. */
static int zyg_paths(struct zyg *z, struct zyg_setup *s)
{
    const struct capd_config *cfg = Z.cfg;
    int rc;
    struct launch_limits cells;
    launch_zygote_limits(cfg, &cells);
    snprintf(s->dir, sizeof s->dir, "%s/zygote", cfg->data_dir);
    if ((rc = mkdir_mode(s->dir, 0700)) != 0)
        return rc;
    /* Cells of another user (run_as_user) reach the sockets too: a paired
     * cell hands its control build's timing template to that build's
     * zygote (daemon/attempt/reference.h), which forks only its own runner, in its
     * own environment, as that same user. The directory is searchable, not
     * listable, for their group. */
    if (cells.gid >= 0 && chown(s->dir, (uid_t)-1, (gid_t)cells.gid) == 0)
        chmod(s->dir, 0710);
    else
        chmod(s->dir, 0700);
    Z.gen++;
    if ((size_t)snprintf(z->sock, sizeof z->sock, "%s/%u-%d.sock", s->dir, Z.gen, (int)getpid()) >=
        sizeof z->sock) {
        snprintf(s->reason, sizeof s->reason, "socket path under %s is too long for a unix socket",
                 s->dir);
        return -ENAMETOOLONG;
    }
    char sdir[LAYOUT_PATH_MAX];
    if (layout_zygote_scratch(z->scratch, sizeof z->scratch, cfg->data_dir, Z.gen) != 0 ||
        layout_dir(sdir, sizeof sdir, cfg->data_dir, "scratch") != 0) {
        snprintf(s->reason, sizeof s->reason, "the zygote's scratch dir below %s is too long",
                 cfg->data_dir);
        return -ENAMETOOLONG;
    }
    snprintf(s->vpath, sizeof s->vpath, "%s/verify.json", z->scratch);
    if ((rc = mkdir_mode(sdir, 0700)) != 0 || (rc = mkdir_mode(z->scratch, 0700)) != 0)
        return rc;
    return 0;
}

/* The descriptors the zygote inherits: the listening socket it serves
 * cells on, its log (appended to, started afresh past ZYG_LOG_MAX) and the
 * pipe it reports its status lines on. */
static int zyg_open_fds(struct zyg *z, struct zyg_setup *s)
{
    struct sockaddr_un sa = {.sun_family = AF_UNIX};
    memcpy(sa.sun_path, z->sock, strlen(z->sock) + 1);
    unlink(z->sock);
    s->lfd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (s->lfd < 0 || bind(s->lfd, (struct sockaddr *)&sa, sizeof sa) != 0 ||
        listen(s->lfd, 128) != 0) {
        int rc = -errno;
        snprintf(s->reason, sizeof s->reason, "cannot listen on %s: %s", z->sock, strerror(-rc));
        return rc;
    }
    struct launch_limits cells;
    launch_zygote_limits(Z.cfg, &cells);
    if (cells.gid >= 0 && chown(z->sock, (uid_t)-1, (gid_t)cells.gid) == 0)
        chmod(z->sock, 0660);
    if (layout_zygote_log(s->logp, sizeof s->logp, Z.cfg->data_dir, z->build) != 0) {
        snprintf(s->reason, sizeof s->reason, "the zygote's log path below %s is too long",
                 Z.cfg->data_dir);
        return -ENAMETOOLONG;
    }
    struct stat sb;
    bool trunc = stat(s->logp, &sb) == 0 && (uint64_t)sb.st_size > ZYG_LOG_MAX;
    s->logfd =
        open(s->logp, O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC | (trunc ? O_TRUNC : 0), 0640);
    if (s->logfd < 0 || pipe2(s->sp, O_CLOEXEC) != 0) {
        int rc = -errno;
        snprintf(s->reason, sizeof s->reason, "cannot open %s or a pipe: %s", s->logp,
                 strerror(-rc));
        return rc;
    }
    return 0;
}

/* The zygote's command line, through capd-exec with the cells' own limits
 * but CPU seconds (daemon/child/launch.h). */
static int zyg_argv(struct zyg_setup *s, const json_t *build, bool verify, bool timing_only)
{
    const char *python = json_string_value(json_object_get(build, "python"));
    struct launch_exec le = {.rusage_fd = -1};
    launch_zygote_limits(Z.cfg, &le.lim);
    /* capd's own user, and the cells' when they run as another (see zyg_paths) */
    snprintf(s->me, sizeof s->me, "%u", (unsigned)geteuid());
    snprintf(s->cells, sizeof s->cells, "%ld", le.lim.uid >= 0 ? le.lim.uid : (long)geteuid());
    snprintf(s->idle, sizeof s->idle, "%d", ZYG_IDLE_EXIT_S);
    char *prog[] = {(char *)python,
                    "-m",
                    "capd_runner.zygote",
                    "--listen-fd",
                    "3",
                    "--cell-keys",
                    timing_only ? ATTEMPT_KEYS : Z.keys_csv,
                    "--allow-uid",
                    s->me,
                    "--allow-uid",
                    s->cells,
                    "--idle-exit-s",
                    s->idle,
                    verify ? "--verify" : NULL,
                    s->vpath,
                    NULL}; /* a NULL ends it early */
    int rc = launch_exec_argv(Z.cfg->exec_bin, &le, prog, &s->la);
    if (rc != 0)
        snprintf(s->reason, sizeof s->reason, "the capd-exec command line is too long");
    return rc;
}

/* Starts the zygote in its own session with the status pipe on stdout,
 * the log on stderr and the socket on fd 3, and starts reading its status.
 * From uv_pipe_init on, z->handles counts the initialised handles, which
 * the caller closes when uv_spawn fails. */
static int zyg_start(struct zyg *z, struct zyg_setup *s, char **zenv)
{
    const struct capd_config *cfg = Z.cfg;
    /* HOME: a zygote running as run_as_user gets its scratch dir, as a cell
     * does; the cells' own HOME is applied in each child. */
    size_t n = 0;
    while (zenv[n])
        n++;
    if (cfg->run_uid >= 0) {
        snprintf(s->home, sizeof s->home, "HOME=%s", z->scratch);
        zenv[n++] = s->home;
        zenv[n] = NULL;
    }

    uv_stdio_container_t stdio[4];
    stdio[0].flags = UV_IGNORE;
    stdio[1].flags = UV_INHERIT_FD;
    stdio[1].data.fd = s->sp[1];
    stdio[2].flags = UV_INHERIT_FD;
    stdio[2].data.fd = s->logfd;
    stdio[3].flags = UV_INHERIT_FD;
    stdio[3].data.fd = s->lfd;
    uv_process_options_t po = {
        .exit_cb = on_exit_cb,
        .file = cfg->exec_bin,
        .args = s->la.argv,
        .env = zenv,
        .cwd = z->scratch,
        .flags = UV_PROCESS_DETACHED,
        .stdio_count = 4,
        .stdio = stdio,
    };
    uv_pipe_init(Z.loop, &z->status, 0);
    z->status.data = z->proc.data = z;
    z->handles = 1;
    uv_pipe_open(&z->status, s->sp[0]);
    s->sp[0] = -1;
    int urc = uv_spawn(Z.loop, &z->proc, &po);
    z->handles++;
    if (urc != 0) {
        snprintf(s->reason, sizeof s->reason, "cannot spawn %s: %s", cfg->exec_bin,
                 uv_strerror(urc));
        z->exited = true;
        return urc;
    }
    uv_read_start((uv_stream_t *)&z->status, on_alloc, on_status);
    return 0;
}

/* Starts zygote Z for BUILD with environment ZENV (verifying the build
 * first when VERIFY). A failure with a reason is logged here; the caller
 * closes Z's handles when any were initialised. */
static int spawn(struct zyg *z, const json_t *build, char **zenv, bool verify)
{
    struct zyg_setup s = {.lfd = -1, .logfd = -1, .sp = {-1, -1}};
    int rc;
    if ((rc = zyg_paths(z, &s)) != 0)
        goto out;
    if (verify ? write_verify(s.vpath, z->scratch, zenv) != 0
               : (close(open(s.vpath, O_WRONLY | O_CREAT | O_CLOEXEC, 0600)), 0)) {
        snprintf(s.reason, sizeof s.reason, "cannot write %s", s.vpath);
        goto out;
    }
    if ((rc = runas_prepare_cell(Z.cfg, z->scratch, s.vpath, s.reason, sizeof s.reason)) != 0 ||
        (rc = zyg_open_fds(z, &s)) != 0 ||
        (rc = zyg_argv(&s, build, verify, z->timing_only)) != 0 ||
        (rc = zyg_start(z, &s, zenv)) != 0)
        goto out;
    log_info("zygote_started", "build=%s pid=%d socket=%s verify=%s log=%s", log_q(z->build),
             z->proc.pid, log_q(z->sock), verify ? "yes" : "no", log_q(s.logp));
    rc = 0;
out:
    if (s.lfd >= 0)
        close(s.lfd);
    if (s.logfd >= 0)
        close(s.logfd);
    for (int i = 0; i < 2; i++)
        if (s.sp[i] >= 0)
            close(s.sp[i]);
    if (rc && s.reason[0])
        log_warn("zygote_setup_failed", "build=%s reason=%s", log_q(z->build), log_q(s.reason));
    return rc;
}

/* zyg_for_cell, and with TIMING zyg_for_timing (zygote.h). */
static int zyg_get(const json_t *build, const json_t *spec, char *const *env, char *path,
                   size_t len, bool timing)
{
    const char *name = json_string_value(json_object_get(build, "name"));
    const char *state = json_string_value(json_object_get(build, "prefork_state"));
    const char *device =
        json_string_value(json_object_get(json_object_get(spec, "options"), "device"));
    int64_t rev = json_integer_value(json_object_get(build, "rev"));
    bool prefork = json_is_true(json_object_get(build, "prefork"));
    if (!Z.loop || !name || (!prefork && !timing) ||
        (prefork && state && strcmp(state, "refused") == 0) ||
        (device && strcmp(device, "gpu") == 0))
        return -ENOENT;
    uint64_t key;
    char **zenv = zygote_env(env, !prefork, &key);
    if (!zenv)
        return -ENOENT;
    int live = 0, rc = -ENOENT;
    for (struct zyg *z = Z.list; z; z = z->next) {
        if (z->exited)
            continue;
        live++;
        if (z->rev == rev && z->key == key && strcmp(z->build, name) == 0) {
            if (!z->refused && strlen(z->sock) < len) {
                snprintf(path, len, "%s", z->sock);
                rc = 0;
            }
            goto out;
        }
    }
    if (live >= ZYG_MAX) {
        log_debug("zygote_pool_full", "build=%s max=%d", log_q(name), ZYG_MAX);
        goto out;
    }
    struct zyg *z = calloc(1, sizeof *z);
    if (!z)
        goto out;
    snprintf(z->build, sizeof z->build, "%s", name);
    z->rev = rev;
    z->key = key;
    z->timing_only = !prefork;
    bool verify = prefork && (!state || strcmp(state, "verified") != 0);
    int src = spawn(z, build, zenv, verify);
    if (src == 0 && strlen(z->sock) < len) {
        snprintf(path, len, "%s", z->sock);
        rc = 0;
    }
    if (z->handles > 0) {
        /* Handles were initialised: the pool owns it, and the close
         * callbacks free it (at once when the spawn failed). */
        z->next = Z.list;
        Z.list = z;
        if (src != 0)
            zyg_close(z);
    } else {
        free(z);
    }
out:
    free(zenv);
    return rc;
}

int zyg_for_cell(const json_t *build, const json_t *spec, char *const *env, char *path, size_t len)
{
    return zyg_get(build, spec, env, path, len, false);
}

int zyg_for_timing(const json_t *build, const json_t *spec, char *const *env, char *path,
                   size_t len)
{
    return zyg_get(build, spec, env, path, len, true);
}

void zyg_shutdown(void)
{
    for (struct zyg *z = Z.list; z; z = z->next) {
        if (!z->exited && z->proc.pid > 0)
            kill(-z->proc.pid, SIGKILL);
        if (!z->exited)
            unlink(z->sock);
        zyg_close(z);
    }
}
