/*
 * daemon/prefork/exec_zygote.c - capd-exec's side of a prefork cell: one request to
 * the zygote, then a stand-in for the forked child (see exec_zygote.h and
 * docs/prefork.md for the wire format).
 *
 * capd-exec links no JSON library, and the zygote's replies are compact
 * JSON objects it writes itself, so replies are read with a few exact
 * field lookups; the request is written with a small string escaper.
 */
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <unistd.h>

#include "daemon/prefork/exec_zygote.h"
#include "util/buf.h"
#include "util/fs.h"

#define ZC_MAX_REQUEST (4u << 20) /* the zygote's own limit */
#define ZC_MAX_REPLY   65536

extern char **environ;

static volatile sig_atomic_t zc_child = 0;   /* the cell's pid (its group) */
static volatile sig_atomic_t zc_pending = 0; /* a signal that came before it */

static void zc_forward(int sig)
{
    if (zc_child > 0)
        kill(-(pid_t)zc_child, sig);
    else
        zc_pending = sig;
}

/* A JSON string. Bytes that are not valid UTF-8 would make the zygote's
 * decoder fail, which only costs the fallback to fresh exec. */
static int zc_str(struct ubuf *b, const char *s, size_t n)
{
    int rc = ubuf_addc(b, '"');
    for (size_t i = 0; i < n && rc == 0; i++) {
        unsigned char c = (unsigned char)s[i];
        if (c == '"' || c == '\\') {
            char e[2] = {'\\', (char)c};
            rc = ubuf_add(b, e, 2);
        } else if (c < 0x20) {
            rc = ubuf_addf(b, "\\u%04x", c);
        } else {
            rc = ubuf_addc(b, (char)c);
        }
    }
    return rc ? rc : ubuf_addc(b, '"');
}

/* The request, with fds 0-3 riding on its first byte. */
static int zc_send_request(int sock, char *const argv[], const struct zc_limits *lim)
{
    /* 4 bytes of length, then at most the zygote's limit of JSON. */
    struct ubuf b;
    ubuf_init(&b, 4 + ZC_MAX_REQUEST);
    char cwd[4096];
    if (!getcwd(cwd, sizeof cwd))
        return -1;
    static const char head[] = "\0\0\0\0{\"v\":1,\"argv\":[";
    int rc = ubuf_add(&b, head, sizeof head - 1);
    for (int i = 0; argv[i] && rc == 0; i++) {
        if (i)
            rc = ubuf_addc(&b, ',');
        if (rc == 0)
            rc = zc_str(&b, argv[i], strlen(argv[i]));
    }
    if (rc == 0)
        rc = ubuf_adds(&b, "],\"env\":{");
    int first = 1;
    for (char **e = environ; *e && rc == 0; e++) {
        const char *eq = strchr(*e, '=');
        if (!eq)
            continue;
        if (!first)
            rc = ubuf_addc(&b, ',');
        first = 0;
        if (rc == 0)
            rc = zc_str(&b, *e, (size_t)(eq - *e));
        if (rc == 0)
            rc = ubuf_addc(&b, ':');
        if (rc == 0)
            rc = zc_str(&b, eq + 1, strlen(eq + 1));
    }
    if (rc == 0)
        rc = ubuf_adds(&b, "},\"cwd\":");
    if (rc == 0)
        rc = zc_str(&b, cwd, strlen(cwd));
    if (rc == 0)
        rc = ubuf_addf(&b, ",\"rlimits\":{\"as\":%llu,\"cpu\":%llu,", lim->as, lim->cpu);
    if (rc == 0)
        rc = ubuf_addf(&b, "\"nofile\":%llu,\"nproc\":%llu},", lim->nofile, lim->nproc);
    if (rc == 0)
        rc = ubuf_addf(&b, "\"uid\":%ld}", lim->uid);
    if (rc) {
        ubuf_free(&b);
        return -1;
    }
    uint32_t len = (uint32_t)(b.len - 4);
    b.p[0] = (char)(len >> 24);
    b.p[1] = (char)(len >> 16);
    b.p[2] = (char)(len >> 8);
    b.p[3] = (char)len;

    int fds[4] = {0, 1, 2, 3};
    union {
        char buf[CMSG_SPACE(sizeof fds)];
        struct cmsghdr align;
    } u;
    memset(&u, 0, sizeof u);
    struct iovec iov = {.iov_base = b.p, .iov_len = 1};
    struct msghdr m = {
        .msg_iov = &iov, .msg_iovlen = 1, .msg_control = u.buf, .msg_controllen = sizeof u.buf};
    struct cmsghdr *c = CMSG_FIRSTHDR(&m);
    c->cmsg_level = SOL_SOCKET;
    c->cmsg_type = SCM_RIGHTS;
    c->cmsg_len = CMSG_LEN(sizeof fds);
    memcpy(CMSG_DATA(c), fds, sizeof fds);
    ssize_t w;
    while ((w = sendmsg(sock, &m, MSG_NOSIGNAL)) < 0 && errno == EINTR)
        ;
    rc = w == 1 && util_write_all(sock, b.p + 1, b.len - 1) == 0 ? 0 : -1;
    ubuf_free(&b);
    return rc;
}

/* One reply: 4-byte big-endian length, then that much JSON. 0 on EOF
 * before it, -1 on error, else 1. */
static int zc_read_reply(int sock, char *out, size_t cap)
{
    unsigned char hdr[4];
    size_t got = 0;
    while (got < 4) {
        ssize_t r = read(sock, hdr + got, 4 - got);
        if (r < 0 && errno == EINTR)
            continue;
        if (r <= 0)
            return got == 0 && r == 0 ? 0 : -1;
        got += (size_t)r;
    }
    size_t n = (size_t)hdr[0] << 24 | (size_t)hdr[1] << 16 | (size_t)hdr[2] << 8 | hdr[3];
    if (n >= cap)
        return -1;
    got = 0;
    while (got < n) {
        ssize_t r = read(sock, out + got, n - got);
        if (r < 0 && errno == EINTR)
            continue;
        if (r <= 0)
            return -1;
        got += (size_t)r;
    }
    out[n] = 0;
    return 1;
}

/* The integer after "KEY": in a compact JSON object the zygote wrote. */
static int zc_field(const char *json, const char *key, long long *v)
{
    char pat[64];
    snprintf(pat, sizeof pat, "\"%s\":", key);
    const char *p = strstr(json, pat);
    if (!p)
        return -1;
    char *end;
    errno = 0;
    *v = strtoll(p + strlen(pat), &end, 10);
    return errno || end == p + strlen(pat) ? -1 : 0;
}

/* Moves the zygote's child PID into the cell's memory group (capd moved
 * this shim there; the child is the zygote's, not ours). A cell that
 * cannot be moved runs without its limit, so it is killed instead. */
static void zc_enter_cgroup(const char *dir, pid_t pid)
{
    char path[600], v[32];
    if (!dir)
        return;
    snprintf(path, sizeof path, "%s/cgroup.procs", dir);
    snprintf(v, sizeof v, "%d", (int)pid);
    int fd = open(path, O_WRONLY | O_CLOEXEC);
    ssize_t n = fd >= 0 ? write(fd, v, strlen(v)) : -1;
    if (fd >= 0)
        close(fd);
    if (n != (ssize_t)strlen(v)) {
        fprintf(stderr, "capd-exec: cannot move the cell into %s: %s\n", dir, strerror(errno));
        kill(-pid, SIGKILL);
    }
}

/* Writes LINE to the rusage pipe, if there is one. */
static void zc_rusage_line(int rusage_fd, const char *line)
{
    if (rusage_fd < 0)
        return;
    ssize_t w = write(rusage_fd, line, strlen(line));
    (void)w;
}

/* The zygote has forked the cell PID: this shim stands in for it until
 * it ends, then reports its rusage and leaves like it. */
static _Noreturn void zc_stand_in(int sock, long long pid, const struct zc_limits *lim,
                                  int rusage_fd)
{
    char reply[ZC_MAX_REPLY], line[96];
    zc_child = (sig_atomic_t)pid;
    zc_enter_cgroup(lim->cgroup, (pid_t)pid);
    /* capd learns which group is the cell (its memory watchdog sums it
     * with this shim's): "pid N" comes first on the rusage pipe. */
    snprintf(line, sizeof line, "pid %lld\n", pid);
    zc_rusage_line(rusage_fd, line);
    if (zc_pending)
        kill(-(pid_t)pid, zc_pending);

    int r = zc_read_reply(sock, reply, sizeof reply);
    long long status = 0, maxrss = 0, ut = 0, st = 0;
    if (r <= 0 || zc_field(reply, "status", &status) != 0) {
        /* The zygote died; its parent-death signal took the cell along. */
        fprintf(stderr, "capd-exec: the prefork zygote died while the cell ran; the cell was "
                        "killed with it\n");
        signal(SIGKILL, SIG_DFL);
        raise(SIGKILL);
        _exit(126);
    }
    zc_field(reply, "maxrss_kb", &maxrss);
    zc_field(reply, "utime_us", &ut);
    zc_field(reply, "stime_us", &st);
    close(sock);
    snprintf(line, sizeof line, "%lld %lld %lld\n", maxrss, ut, st);
    zc_rusage_line(rusage_fd, line);
    if (rusage_fd >= 0)
        close(rusage_fd);
    _exit(shim_exit_like((int)status));
}

/* Connects to the zygote at PATH and hands it the cell; the forked cell's
 * pid, or 0 (having said why) when the cell must be started by fresh exec. */
static long long zc_hand_over(int sock, const char *path, char *const argv[],
                              const struct zc_limits *lim)
{
    char reply[ZC_MAX_REPLY];
    struct sockaddr_un sa = {.sun_family = AF_UNIX};
    memcpy(sa.sun_path, path, strlen(path) + 1);
    if (sock < 0 || connect(sock, (struct sockaddr *)&sa, sizeof sa) != 0) {
        fprintf(stderr, "capd-exec: prefork zygote not reachable (%s); fresh exec\n",
                strerror(errno));
        return 0;
    }
    if (zc_send_request(sock, argv, lim) != 0) {
        fprintf(stderr, "capd-exec: cannot send the cell to the prefork zygote; fresh exec\n");
        return 0;
    }
    long long pid = 0;
    if (zc_read_reply(sock, reply, sizeof reply) <= 0) {
        /* The zygote went away first (it refused the build, or died). */
        fprintf(stderr, "capd-exec: the prefork zygote closed the connection; fresh exec\n");
        return 0;
    }
    if (strstr(reply, "\"refused\":")) {
        fprintf(stderr, "capd-exec: prefork refused this cell: %s; fresh exec\n", reply);
        return 0;
    }
    if (zc_field(reply, "pid", &pid) != 0 || pid <= 1) {
        fprintf(stderr, "capd-exec: bad reply from the prefork zygote: %s; fresh exec\n", reply);
        return 0;
    }
    return pid;
}

void zygote_client_run(const char *path, char *const argv[], const struct zc_limits *lim,
                       int rusage_fd)
{
    if (strlen(path) >= sizeof((struct sockaddr_un *)0)->sun_path) {
        fprintf(stderr, "capd-exec: prefork socket path too long; fresh exec\n");
        return;
    }
    /* Signals from capd (SIGTERM to this group on timeout or cancel) go on
     * to the cell's own group once it exists; before that they are kept. */
    struct sigaction act;
    memset(&act, 0, sizeof act);
    act.sa_handler = zc_forward;
    sigemptyset(&act.sa_mask);
    sigaction(SIGTERM, &act, NULL);
    sigaction(SIGINT, &act, NULL);

    int sock = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    long long pid = zc_hand_over(sock, path, argv, lim);
    if (pid > 0)
        zc_stand_in(sock, pid, lim, rusage_fd);
    if (sock >= 0)
        close(sock);
    signal(SIGTERM, SIG_DFL);
    signal(SIGINT, SIG_DFL);
    if (zc_pending)
        raise(zc_pending);
}
