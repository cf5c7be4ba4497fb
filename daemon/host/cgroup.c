/*
 * daemon/host/cgroup.c - choosing how cells' memory is limited, and the cgroup
 * groups themselves (daemon/host/memlimit.h). The watchdog's sampling lives in
 * daemon/memwatch.c.
 *
 * Everything here is a few small reads and writes of cgroupfs files, made
 * on the loop thread when a cell starts and ends: the kernel enforces the
 * limit, so nothing runs while the cell does.
 */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "util/log.h"
#include "daemon/host/memlimit_int.h"
#include "util/err.h"

/* Groups that could not be removed yet (a process still dying in them):
 * retried when the next cell starts and at shutdown. */
#define MEM_PENDING_MAX 64

static struct {
    enum mem_mech mech;
    char parent[640]; /* where cell groups are made; "" for the watchdog */
    char own[640];    /* capd's subtree to remove at shutdown ("" none) */
    char reason[2200];
    uint64_t cell_limit, host_ram;
    uint64_t pids_max;
    char pending[MEM_PENDING_MAX][700];
    int npending;
} m;

static const char *const mech_names[] = {
    [MEM_WATCHDOG] = "watchdog", [MEM_CGROUP1] = "cgroup1", [MEM_CGROUP2] = "cgroup2"};

enum mem_mech mem_mechanism(void)
{
    return m.mech;
}

const char *mem_mechanism_name(void)
{
    return mech_names[m.mech];
}

/* ---- cgroupfs files ---- */

/* Writes to a limit file may be interrupted: cgroup v1's
 * memory.limit_in_bytes reclaims down to the new limit and gives up with
 * EINTR when a signal is pending (seen here: a new cell's group failed to
 * start while capd's children were exiting), SA_RESTART or not. Such a
 * write changed nothing, so it is tried again, WRITE_TRIES times at most. */
#define WRITE_TRIES 50

static int write_file(const char *dir, const char *name, const char *value)
{
    char path[760];
    snprintf(path, sizeof path, "%s/%s", dir, name);
    int fd = open(path, O_WRONLY | O_CLOEXEC);
    if (fd < 0)
        return -errno;
    ssize_t n = -1;
    for (int i = 0; i < WRITE_TRIES; i++) {
        n = write(fd, value, strlen(value));
        if (n >= 0 || errno != EINTR)
            break;
    }
    int rc = n == (ssize_t)strlen(value) ? 0 : n < 0 ? -errno : -EIO;
    close(fd);
    return rc;
}

static int read_file(const char *dir, const char *name, char *buf, size_t len)
{
    char path[760];
    snprintf(path, sizeof path, "%s/%s", dir, name);
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return -errno;
    ssize_t n = read(fd, buf, len - 1);
    int rc = n < 0 ? -errno : 0;
    buf[n > 0 ? n : 0] = 0;
    close(fd);
    return rc;
}

static bool has_file(const char *dir, const char *name)
{
    char path[760];
    snprintf(path, sizeof path, "%s/%s", dir, name);
    return access(path, F_OK) == 0;
}

/* A number file ("max" reads as -1), or -1. */
static int64_t read_num(const char *dir, const char *name)
{
    char buf[64];
    long long v;
    if (read_file(dir, name, buf, sizeof buf) != 0 || sscanf(buf, "%lld", &v) != 1)
        return -1;
    return (int64_t)v;
}

/* The value of "KEY N" in a flat-keyed file (memory.events, oom_control). */
static int64_t read_key(const char *dir, const char *name, const char *key)
{
    char buf[2048];
    if (read_file(dir, name, buf, sizeof buf) != 0)
        return -1;
    size_t kl = strlen(key);
    for (char *p = buf; p && *p; p = strchr(p, '\n') ? strchr(p, '\n') + 1 : NULL) {
        if (strncmp(p, key, kl) == 0 && p[kl] == ' ')
            return strtoll(p + kl + 1, NULL, 10);
    }
    return -1;
}

/* Whether WORD is one of the space-separated words of a controllers file. */
static bool has_word(const char *list, const char *word)
{
    size_t wl = strlen(word);
    for (const char *p = list; (p = strstr(p, word)) != NULL; p += wl)
        if ((p == list || p[-1] == ' ' || p[-1] == ',') &&
            (p[wl] == 0 || p[wl] == ' ' || p[wl] == '\n' || p[wl] == ','))
            return true;
    return false;
}

/* ---- where capd sits ---- */

/* The value PICK finds in a line of the /proc file PATH (a string inside
 * the line, or NULL for a line that is not the one sought), copied into OUT
 * from the first line whose value fits LEN; -ENOENT when none does. */
static int proc_value(const char *path, char *(*pick)(char *line, const void *arg), const void *arg,
                      char *out, size_t len)
{
    FILE *f = fopen(path, "re");
    char line[2048];
    int rc = -ENOENT;
    if (!f)
        return -errno;
    while (rc && fgets(line, sizeof line, f)) {
        const char *v = pick(line, arg);
        if (v && (size_t)snprintf(out, len, "%s", v) < len)
            rc = 0;
    }
    fclose(f);
    return rc;
}

/* The path of a /proc/self/cgroup line for the controller ARG names ("" is
 * the v2 line "0::"). */
static char *cgroup_path_of(char *line, const void *arg)
{
    const char *controller = arg;
    line[strcspn(line, "\n")] = 0;
    char *c1 = strchr(line, ':'), *c2 = c1 ? strchr(c1 + 1, ':') : NULL;
    if (!c2)
        return NULL;
    *c2 = 0;
    bool match = controller[0] ? has_word(c1 + 1, controller) : c1[1] == 0;
    return match ? c2 + 1 : NULL;
}

/* capd's cgroup path for CONTROLLER ("" means the v2 line "0::"). */
static int own_path(const char *controller, char *out, size_t len)
{
    return proc_value("/proc/self/cgroup", cgroup_path_of, controller, out, len);
}

/* A hierarchy sought in /proc/self/mountinfo: its FSTYPE and, for v1, a
 * super option that names its controller (NULL for v2). */
struct mount_want {
    const char *fstype, *option;
};

/* The mount point of a mountinfo line of the hierarchy ARG wants. */
static char *mount_point_of(char *line, const void *arg)
{
    const struct mount_want *w = arg;
    char type[64], src[256], sopts[512] = "";
    char *dash = strstr(line, " - ");
    int at = -1, end = -1;
    if (!dash || (sscanf(line, "%*s %*s %*s %*s %n%*s%n", &at, &end), end < 0) ||
        sscanf(dash + 3, "%63s %255s %511s", type, src, sopts) < 2 || strcmp(type, w->fstype) != 0)
        return NULL;
    if (w->option && !has_word(sopts, w->option))
        return NULL;
    line[end] = 0;
    return line + at;
}

/* The mount point of the v2 hierarchy (FSTYPE cgroup2) or of the v1
 * hierarchy whose super options name OPTION. */
static int mount_of(const char *fstype, const char *option, char *out, size_t len)
{
    struct mount_want w = {fstype, option};
    return proc_value("/proc/self/mountinfo", mount_point_of, &w, out, len);
}

/* Removes the capd.PID subtrees that capds no longer running left in DIR. */
static void sweep_stale(const char *dir)
{
    DIR *d = opendir(dir);
    struct dirent *e;
    if (!d)
        return;
    while ((e = readdir(d)) != NULL) {
        int pid = 0;
        if (sscanf(e->d_name, "capd.%d", &pid) != 1 || pid <= 0 || pid == getpid() ||
            kill(pid, 0) == 0 || errno != ESRCH)
            continue;
        char sub[1024];
        snprintf(sub, sizeof sub, "%s/%s", dir, e->d_name);
        DIR *s = opendir(sub);
        struct dirent *c;
        while (s && (c = readdir(s)) != NULL) {
            char cell[1400];
            snprintf(cell, sizeof cell, "%s/%s", sub, c->d_name);
            if (c->d_type == DT_DIR && c->d_name[0] != '.')
                rmdir(cell);
        }
        if (s)
            closedir(s);
        rmdir(sub);
    }
    closedir(d);
}

/* ---- choosing ---- */

/* A subtree for cells below DIR, which has no processes of its own and
 * offers memory: "+memory" (and "+pids") in its subtree_control. */
static int v2_enable(const char *dir, char *why, size_t wlen)
{
    char ctl[256] = "";
    read_file(dir, "cgroup.controllers", ctl, sizeof ctl);
    int rc = write_file(dir, "cgroup.subtree_control",
                        has_word(ctl, "pids") ? "+memory +pids" : "+memory");
    if (rc)
        snprintf(why, wlen, "cannot enable the memory controller in %s: %s", dir, strerror(-rc));
    return rc;
}

/*
 * cgroup v2. Delegated (capd alone in its cgroup, as systemd's Delegate=yes
 * leaves it): capd moves into DIR/daemon, since a cgroup with processes may
 * not hand controllers to its children, and cells go beside it. Otherwise,
 * as root, a capd.PID subtree below the hierarchy's root.
 */
static int try_cgroup2(char *why, size_t wlen)
{
    char mnt[256], own[256], dir[520], ctl[256] = "", procs[256] = "", self[32];
    if (mount_of("cgroup2", NULL, mnt, sizeof mnt) != 0)
        return snprintf(why, wlen, "no cgroup2 hierarchy is mounted"), -ENODEV;
    if (own_path("", own, sizeof own) != 0)
        return snprintf(why, wlen, "capd is in no cgroup2 group"), -ENODEV;
    snprintf(dir, sizeof dir, "%s%s", mnt, strcmp(own, "/") ? own : "");
    read_file(dir, "cgroup.controllers", ctl, sizeof ctl);
    if (!has_word(ctl, "memory"))
        return snprintf(why, wlen, "cgroup2 at %s offers no memory controller (controllers: %s)",
                        dir, ctl[0] ? strtok(ctl, "\n") : "none"),
               -ENODEV;
    snprintf(self, sizeof self, "%d\n", (int)getpid());
    read_file(dir, "cgroup.procs", procs, sizeof procs);
    int rc;
    if (strcmp(own, "/") != 0 && strcmp(procs, self) == 0) {
        char leaf[540];
        snprintf(leaf, sizeof leaf, "%s/daemon", dir);
        if ((mkdir(leaf, 0755) != 0 && errno != EEXIST) ||
            write_file(leaf, "cgroup.procs", "0") != 0)
            return snprintf(why, wlen, "cannot move capd into %s: %s", leaf, strerror(errno)),
                   -ENODEV;
        if ((rc = v2_enable(dir, why, wlen)) != 0)
            return -ENODEV;
        snprintf(m.parent, sizeof m.parent, "%s", dir);
        snprintf(m.reason, sizeof m.reason, "capd's cgroup %s is delegated to it", dir);
        return 0;
    }
    if (geteuid() != 0)
        return snprintf(why, wlen,
                        "cgroup2 group %s is not delegated to capd (other processes share it; "
                        "run capd from its systemd unit, Delegate=yes)",
                        dir),
               -ENODEV;
    snprintf(m.own, sizeof m.own, "%s/capd.%d", mnt, (int)getpid());
    sweep_stale(mnt);
    if ((mkdir(m.own, 0755) != 0 && errno != EEXIST) || v2_enable(mnt, why, wlen) != 0 ||
        v2_enable(m.own, why, wlen) != 0) {
        if (!why[0])
            snprintf(why, wlen, "cannot create %s: %s", m.own, strerror(errno));
        rmdir(m.own);
        m.own[0] = 0;
        return -ENODEV;
    }
    snprintf(m.parent, sizeof m.parent, "%s", m.own);
    snprintf(m.reason, sizeof m.reason,
             "capd runs as root and made its subtree below the cgroup2 root");
    return 0;
}

/* The v1 memory controller: capd.PID below capd's own memory cgroup. */
static int try_cgroup1(char *why, size_t wlen)
{
    char mnt[256], own[256], dir[520];
    if (mount_of("cgroup", "memory", mnt, sizeof mnt) != 0)
        return snprintf(why, wlen, "no cgroup v1 memory hierarchy is mounted"), -ENODEV;
    if (own_path("memory", own, sizeof own) != 0)
        return snprintf(why, wlen, "capd is in no v1 memory cgroup"), -ENODEV;
    snprintf(dir, sizeof dir, "%s%s", mnt, strcmp(own, "/") ? own : "");
    sweep_stale(dir);
    snprintf(m.own, sizeof m.own, "%s/capd.%d", dir, (int)getpid());
    if (mkdir(m.own, 0755) != 0 && errno != EEXIST) {
        snprintf(why, wlen, "cannot create %s: %s", m.own, strerror(errno));
        m.own[0] = 0;
        return -ENODEV;
    }
    if (!has_file(m.own, "memory.limit_in_bytes")) {
        snprintf(why, wlen, "%s has no memory.limit_in_bytes", m.own);
        rmdir(m.own);
        m.own[0] = 0;
        return -ENODEV;
    }
    snprintf(m.parent, sizeof m.parent, "%s", m.own);
    snprintf(m.reason, sizeof m.reason, "the cgroup v1 memory controller at %s", dir);
    return 0;
}

/* The host's RAM, or less when capd's own cgroup is limited below it. */
static uint64_t host_ram(void)
{
    long pages = sysconf(_SC_PHYS_PAGES), page = sysconf(_SC_PAGESIZE);
    uint64_t ram = pages > 0 && page > 0 ? (uint64_t)pages * (uint64_t)page : UINT64_C(1) << 32;
    char mnt[256], own[256], dir[520];
    if (mount_of("cgroup", "memory", mnt, sizeof mnt) == 0 &&
        own_path("memory", own, sizeof own) == 0) {
        snprintf(dir, sizeof dir, "%s%s", mnt, strcmp(own, "/") ? own : "");
        int64_t lim = read_num(dir, "memory.limit_in_bytes");
        if (lim > 0 && (uint64_t)lim < ram)
            ram = (uint64_t)lim;
    }
    if (mount_of("cgroup2", NULL, mnt, sizeof mnt) == 0 && own_path("", own, sizeof own) == 0) {
        snprintf(dir, sizeof dir, "%s%s", mnt, strcmp(own, "/") ? own : "");
        int64_t lim = read_num(dir, "memory.max");
        if (lim > 0 && (uint64_t)lim < ram)
            ram = (uint64_t)lim;
    }
    return ram;
}

static int resolve_limit(struct capd_config *cfg, char **err)
{
    m.host_ram = host_ram();
    if (!cfg->cell_memory_max_bytes)
        cfg->cell_memory_max_bytes =
            m.host_ram / MEM_AUTO_DEN * MEM_AUTO_NUM / (uint64_t)cfg->max_parallel;
    if (cfg->cell_memory_max_bytes < MEM_MIN_LIMIT)
        return util_errf(err, -EINVAL,
                         "cell_memory_max_bytes %llu is below the minimum of %llu bytes (host "
                         "memory %llu, max_parallel %d)",
                         (unsigned long long)cfg->cell_memory_max_bytes,
                         (unsigned long long)MEM_MIN_LIMIT, (unsigned long long)m.host_ram,
                         cfg->max_parallel);
    m.cell_limit = cfg->cell_memory_max_bytes;
    return 0;
}

int mem_init(struct capd_config *cfg, char **err)
{
    const char *want = cfg->cell_memory_mechanism;
    char why2[1024] = "", why1[1024] = "";
    memset(&m, 0, sizeof m);
    m.pids_max = cfg->rlimit_nproc;
    int rc = resolve_limit(cfg, err);
    if (rc)
        return rc;
    bool any = strcmp(want, "auto") == 0;
    if (!any && strcmp(want, "cgroup2") && strcmp(want, "cgroup1") && strcmp(want, "watchdog"))
        return util_errf(err, -EINVAL,
                         "cell_memory_mechanism must be auto, cgroup2, cgroup1 or watchdog, not "
                         "'%s'",
                         want);
    if ((any || strcmp(want, "cgroup2") == 0) && try_cgroup2(why2, sizeof why2) == 0) {
        m.mech = MEM_CGROUP2;
    } else if ((any || strcmp(want, "cgroup1") == 0) && try_cgroup1(why1, sizeof why1) == 0) {
        m.mech = MEM_CGROUP1;
    } else if (!any && strcmp(want, "watchdog") != 0) {
        return util_errf(err, -ENODEV,
                         "cell_memory_mechanism is %s, which this host cannot give capd: %s", want,
                         why2[0] ? why2 : why1);
    } else {
        m.mech = MEM_WATCHDOG;
        if (any)
            snprintf(m.reason, sizeof m.reason, "no cgroup capd may use (%s; %s)", why2, why1);
        else
            snprintf(m.reason, sizeof m.reason, "cell_memory_mechanism is watchdog");
    }
    /* A start-up that fails later (port taken, storage) leaves no subtree
     * behind either; after a normal stop this finds nothing left to do. */
    if (m.own[0])
        atexit(mem_shutdown);
    log_info("memory_mechanism",
             "mechanism=%s cell_memory_max_bytes=%llu host_memory_bytes=%llu "
             "cgroup=%s reason=%s",
             mem_mechanism_name(), (unsigned long long)m.cell_limit, (unsigned long long)m.host_ram,
             log_q(m.parent), log_q(m.reason));
    return 0;
}

void mem_start(uv_loop_t *loop)
{
    if (m.mech == MEM_WATCHDOG)
        mem__watch_start(loop);
}

json_t *mem_json(void)
{
    return json_pack("{s:s,s:s,s:s?,s:I,s:I,s:s,s:i}", "mechanism", mem_mechanism_name(), "reason",
                     m.reason, "cgroup", m.parent[0] ? m.parent : NULL, "cell_memory_max_bytes",
                     (json_int_t)m.cell_limit, "host_memory_bytes", (json_int_t)m.host_ram,
                     "default", "3/4 of host_memory_bytes / max_parallel", "watchdog_sample_ms",
                     MEM_WATCH_MS);
}

/* ---- one cell's group ---- */

/* SIGKILLs every process in the group DIR (cgroup.kill where the kernel has
 * it: 5.14+, cgroup v2) and tries to remove it. */
static int kill_and_remove(const char *dir)
{
    if (write_file(dir, "cgroup.kill", "1") != 0) {
        char buf[4096];
        if (read_file(dir, "cgroup.procs", buf, sizeof buf) == 0)
            for (char *p = buf; *p; p = strchr(p, '\n') ? strchr(p, '\n') + 1 : p + strlen(p)) {
                long pid = strtol(p, NULL, 10);
                if (pid > 1)
                    kill((pid_t)pid, SIGKILL);
            }
    }
    return rmdir(dir) == 0 || errno == ENOENT ? 0 : -errno;
}

static void retry_pending(void)
{
    int keep = 0;
    for (int i = 0; i < m.npending; i++)
        if (kill_and_remove(m.pending[i]) != 0)
            memmove(m.pending[keep++], m.pending[i], sizeof m.pending[i]);
    m.npending = keep;
}

/* Limits of a new group: memory, no swap beyond it, processes; a kernel
 * without the swap or pids files simply has no such limit to set. */
static int set_limits(const char *dir, uint64_t limit, char *why, size_t wlen)
{
    char v[32];
    int rc;
    snprintf(v, sizeof v, "%llu", (unsigned long long)limit);
    if (m.mech == MEM_CGROUP2) {
        if ((rc = write_file(dir, "memory.max", v)) != 0)
            return snprintf(why, wlen, "cannot set %s/memory.max: %s", dir, strerror(-rc)), rc;
        write_file(dir, "memory.swap.max", "0");
        /* The whole cell goes when the kernel kills one of its processes. */
        write_file(dir, "memory.oom.group", "1");
        if (m.pids_max) {
            char p[32];
            snprintf(p, sizeof p, "%llu", (unsigned long long)m.pids_max);
            write_file(dir, "pids.max", p);
        }
        return 0;
    }
    if ((rc = write_file(dir, "memory.limit_in_bytes", v)) != 0)
        return snprintf(why, wlen, "cannot set %s/memory.limit_in_bytes: %s", dir, strerror(-rc)),
               rc;
    if (has_file(dir, "memory.memsw.limit_in_bytes") &&
        (rc = write_file(dir, "memory.memsw.limit_in_bytes", v)) != 0)
        log_warn("cgroup_swap_limit", "dir=%s err=%s", log_q(dir), log_q(strerror(-rc)));
    return 0;
}

int mem_cell_new(const char *name, uint64_t limit, struct mem_cell **out, char *why, size_t wlen)
{
    struct mem_cell *c = calloc(1, sizeof *c);
    int rc;
    if (!c)
        return -ENOMEM;
    c->procs_fd = -1;
    c->slot = -1;
    c->peak = -1;
    c->limit = limit;
    if (m.mech == MEM_WATCHDOG) {
        *out = c;
        return 0;
    }
    retry_pending();
    if ((size_t)snprintf(c->dir, sizeof c->dir, "%s/%s", m.parent, name) >= sizeof c->dir) {
        snprintf(why, wlen, "cgroup path for cell %s is longer than %zu bytes", name,
                 sizeof c->dir - 1);
        rc = -ENAMETOOLONG;
        goto fail;
    }
    if (mkdir(c->dir, 0755) != 0 &&
        (errno != EEXIST || kill_and_remove(c->dir) != 0 || mkdir(c->dir, 0755) != 0)) {
        rc = -errno;
        snprintf(why, wlen, "cannot create the cell's cgroup %s: %s", c->dir, strerror(errno));
        c->dir[0] = 0;
        goto fail;
    }
    if ((rc = set_limits(c->dir, limit, why, wlen)) != 0)
        goto fail;
    char procs[720];
    snprintf(procs, sizeof procs, "%s/cgroup.procs", c->dir);
    if ((c->procs_fd = open(procs, O_WRONLY | O_CLOEXEC)) < 0) {
        rc = -errno;
        snprintf(why, wlen, "cannot open %s: %s", procs, strerror(errno));
        goto fail;
    }
    *out = c;
    return 0;
fail:
    mem_cell_free(c);
    return rc;
}

int mem_cell_procs_fd(const struct mem_cell *c)
{
    return c ? c->procs_fd : -1;
}

const char *mem_cell_dir(const struct mem_cell *c)
{
    return c ? c->dir : "";
}

uint64_t mem_cell_limit(const struct mem_cell *c)
{
    return c ? c->limit : 0;
}

int mem_cell_attach(struct mem_cell *c, pid_t pid)
{
    if (!c)
        return 0;
    if (m.mech == MEM_WATCHDOG) {
        c->pgid = pid;
        return mem__watch_add(c);
    }
    char v[32];
    snprintf(v, sizeof v, "%d", (int)pid);
    return write_file(c->dir, "cgroup.procs", v);
}

int mem_cell_adopt(struct mem_cell *c, pid_t pgid)
{
    if (!c || pgid <= 1)
        return c && pgid <= 1 ? -EINVAL : 0;
    if (m.mech == MEM_WATCHDOG)
        c->pgid2 = pgid;
    return 0;
}

void mem_cell_collect(struct mem_cell *c)
{
    if (!c)
        return;
    if (m.mech == MEM_WATCHDOG) {
        mem__watch_remove(c);
        return;
    }
    if (m.mech == MEM_CGROUP2) {
        c->oom = c->oom || read_key(c->dir, "memory.events", "oom_kill") > 0;
        c->peak = read_num(c->dir, "memory.peak");
    } else {
        int64_t kills = read_key(c->dir, "memory.oom_control", "oom_kill");
        /* Kernels before 4.13 do not count kills: hitting the limit then is
         * the best evidence there is. */
        c->oom = c->oom || kills > 0 || (kills < 0 && read_num(c->dir, "memory.failcnt") > 0);
        c->peak = read_num(c->dir, "memory.max_usage_in_bytes");
    }
}

bool mem_cell_oom(const struct mem_cell *c)
{
    return c && c->oom;
}

int64_t mem_cell_peak(const struct mem_cell *c)
{
    return c ? c->peak : -1;
}

void mem_cell_free(struct mem_cell *c)
{
    if (!c)
        return;
    mem__watch_remove(c);
    if (c->procs_fd >= 0)
        close(c->procs_fd);
    if (c->dir[0] && kill_and_remove(c->dir) != 0) {
        if (m.npending < MEM_PENDING_MAX)
            snprintf(m.pending[m.npending++], sizeof m.pending[0], "%s", c->dir);
        else
            log_warn("cgroup_left_behind", "dir=%s reason=%s", log_q(c->dir),
                     log_q("more than 64 cell groups wait to be removed"));
    }
    free(c);
}

void mem_shutdown(void)
{
    retry_pending();
    if (m.mech == MEM_CGROUP2 && !m.own[0])
        return; /* the delegated cgroup stays: capd itself lives in it */
    if (m.own[0] && rmdir(m.own) != 0 && errno != ENOENT && errno != EBUSY)
        log_warn("cgroup_left_behind", "dir=%s reason=%s", log_q(m.own), log_q(strerror(errno)));
}

void mem_cell_describe(const struct mem_cell *c, int64_t peak, char *buf, size_t len)
{
    mem_describe(mem_cell_limit(c), peak, buf, len);
}

void mem_describe(uint64_t lim, int64_t peak, char *buf, size_t len)
{
    if (peak >= 0)
        snprintf(buf, len, "limit %llu bytes (%.1f MiB), peak %lld bytes (%.1f MiB)",
                 (unsigned long long)lim, (double)lim / 1048576.0, (long long)peak,
                 (double)peak / 1048576.0);
    else
        snprintf(buf, len, "limit %llu bytes (%.1f MiB), peak unknown", (unsigned long long)lim,
                 (double)lim / 1048576.0);
}
