/*
 * daemon/slurm/slurm_run.c - the runner of Slurm's commands and the calls built
 * on it (slurm.h). posix_spawn, pipes with O_CLOEXEC (another thread's
 * child inherits none of them) and a pidfd to wait on the one child, so
 * no SIGCHLD handler and no global state.
 */
#include "daemon/slurm/slurm.h"

#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <spawn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "util/clock.h"
#include "util/err.h"

extern char **environ;

/* The environment for the child: ours, with SLURM_CONF replaced when the
 * ctx names one. The strings stay the parent's; only the array is new. */
static char **child_env(const struct slurm_ctx *ctx, char *conf_kv)
{
    size_t n = 0;
    while (environ[n])
        n++;
    char **env = calloc(n + 2, sizeof(*env));
    if (!env)
        return NULL;
    size_t j = 0;
    for (size_t i = 0; i < n; i++)
        if (!ctx->slurm_conf || strncmp(environ[i], "SLURM_CONF=", 11) != 0)
            env[j++] = environ[i];
    if (ctx->slurm_conf)
        env[j++] = conf_kv;
    env[j] = NULL;
    return env;
}

static int spawn(struct slurm_ctx *ctx, const struct slurm_argv *a, int out_fd, int err_fd,
                 pid_t *pid, char **err)
{
    char path[SLURM_STR_MAX + 64];
    char conf_kv[SLURM_STR_MAX + 16];
    if (ctx->bin_dir &&
        (size_t)snprintf(path, sizeof(path), "%s/%s", ctx->bin_dir, a->argv[0]) >= sizeof(path))
        return util_errf(err, -ENAMETOOLONG, "the Slurm bin dir is too long");
    if (ctx->slurm_conf && (size_t)snprintf(conf_kv, sizeof(conf_kv), "SLURM_CONF=%s",
                                            ctx->slurm_conf) >= sizeof(conf_kv))
        return util_errf(err, -ENAMETOOLONG, "SLURM_CONF is too long");
    char **env = child_env(ctx, conf_kv);
    if (!env)
        return util_errf(err, -ENOMEM, "out of memory starting %s", a->argv[0]);
    posix_spawn_file_actions_t fa;
    posix_spawnattr_t at;
    posix_spawn_file_actions_init(&fa);
    posix_spawnattr_init(&at);
    posix_spawn_file_actions_addopen(&fa, 0, "/dev/null", O_RDONLY, 0);
    posix_spawn_file_actions_adddup2(&fa, out_fd, 1);
    posix_spawn_file_actions_adddup2(&fa, err_fd, 2);
    /* The child starts with every signal at its default and none blocked,
     * whatever the calling thread (a libuv worker) has set. */
    sigset_t all, none;
    sigfillset(&all);
    sigemptyset(&none);
    posix_spawnattr_setsigdefault(&at, &all);
    posix_spawnattr_setsigmask(&at, &none);
    posix_spawnattr_setflags(&at, POSIX_SPAWN_SETSIGDEF | POSIX_SPAWN_SETSIGMASK);
    int rc = ctx->bin_dir ? posix_spawn(pid, path, &fa, &at, a->argv, env)
                          : posix_spawnp(pid, a->argv[0], &fa, &at, a->argv, env);
    posix_spawn_file_actions_destroy(&fa);
    posix_spawnattr_destroy(&at);
    free(env);
    if (rc != 0)
        return util_errf(err, -rc, "cannot start %s: %s", ctx->bin_dir ? path : a->argv[0],
                         strerror(rc));
    atomic_fetch_add(&ctx->spawns, 1);
    return 0;
}

/* Reads what is there on FD into R; false at end of file. */
static bool drain(int fd, struct slurm_result *r, bool is_out, int *rc)
{
    char buf[8192];
    ssize_t got = read(fd, buf, sizeof(buf));
    if (got < 0)
        return errno == EINTR || errno == EAGAIN;
    if (got == 0)
        return false;
    if (is_out) {
        if (ubuf_add(&r->out, buf, (size_t)got) != 0)
            *rc = -E2BIG;
    } else {
        size_t have = strlen(r->errtext);
        size_t room = SLURM_STDERR_MAX - have;
        size_t n = (size_t)got < room ? (size_t)got : room;
        memcpy(r->errtext + have, buf, n);
        r->errtext[have + n] = '\0';
    }
    return true;
}

/* Waits for the child's pipes to close and the child to end, killing it
 * at the deadline or when its stdout passes the ceiling. */
static int wait_child(const struct slurm_ctx *ctx, pid_t pid, int pfd, int ofd, int efd,
                      struct slurm_result *r)
{
    int rc = 0;
    int64_t deadline = util_mono_ms() + ctx->timeout_ms;
    bool out_open = true, err_open = true, ended = false;
    while (!ended || out_open || err_open) {
        int64_t left = deadline - util_mono_ms();
        if (left <= 0 && rc == 0)
            rc = -ETIMEDOUT;
        if (rc != 0) {
            kill(pid, SIGKILL);
            break;
        }
        struct pollfd p[3] = {{.fd = out_open ? ofd : -1, .events = POLLIN},
                              {.fd = err_open ? efd : -1, .events = POLLIN},
                              {.fd = ended ? -1 : pfd, .events = POLLIN}};
        int n = poll(p, 3, left > 1000 ? 1000 : (int)left);
        if (n < 0 && errno != EINTR) {
            rc = -errno;
            continue;
        }
        if (out_open && (p[0].revents & (POLLIN | POLLHUP | POLLERR)))
            out_open = drain(ofd, r, true, &rc);
        if (err_open && (p[1].revents & (POLLIN | POLLHUP | POLLERR)))
            err_open = drain(efd, r, false, &rc);
        if (!ended && (p[2].revents & POLLIN))
            ended = true;
    }
    int st = 0;
    while (waitpid(pid, &st, 0) < 0 && errno == EINTR)
        ;
    if (rc == 0) {
        r->status = WIFEXITED(st) ? WEXITSTATUS(st) : -1;
        r->sig = WIFSIGNALED(st) ? WTERMSIG(st) : 0;
    }
    return rc;
}

int slurm_run(struct slurm_ctx *ctx, const struct slurm_argv *a, struct slurm_result *r, char **err)
{
    memset(r, 0, sizeof(*r));
    ubuf_init(&r->out, ctx->out_max);
    if (a->argc < 1 || strchr(a->argv[0], '/'))
        return util_errf(err, -EINVAL, "a Slurm command is named by its program alone");
    int op[2] = {-1, -1}, ep[2] = {-1, -1}, pfd = -1, rc;
    pid_t pid = -1;
    if (pipe2(op, O_CLOEXEC) != 0 || pipe2(ep, O_CLOEXEC) != 0) {
        rc = util_errf(err, -errno, "pipe: %s", strerror(errno));
        goto out;
    }
    if ((rc = spawn(ctx, a, op[1], ep[1], &pid, err)) != 0)
        goto out;
    close(op[1]);
    close(ep[1]);
    op[1] = ep[1] = -1;
    pfd = (int)syscall(SYS_pidfd_open, pid, 0);
    if (pfd < 0) {
        rc = util_errf(err, -errno, "pidfd_open: %s", strerror(errno));
        kill(pid, SIGKILL);
        waitpid(pid, NULL, 0);
        goto out;
    }
    rc = wait_child(ctx, pid, pfd, op[0], ep[0], r);
    if (rc == -ETIMEDOUT)
        util_errf(err, rc, "%s was killed after %ld ms", a->argv[0], ctx->timeout_ms);
    else if (rc == -E2BIG)
        util_errf(err, rc, "%s printed more than %zu bytes and was killed", a->argv[0],
                  ctx->out_max);
    else if (rc)
        util_errf(err, rc, "waiting for %s: %s", a->argv[0], strerror(-rc));
out:
    for (int i = 0; i < 2; i++) {
        if (op[i] >= 0)
            close(op[i]);
        if (ep[i] >= 0)
            close(ep[i]);
    }
    if (pfd >= 0)
        close(pfd);
    return rc;
}

/* stderr's first line, for a message. */
static const char *first_line(struct slurm_result *r)
{
    char *nl = strchr(r->errtext, '\n');
    if (nl)
        *nl = '\0';
    return r->errtext[0] ? r->errtext : "(nothing on stderr)";
}

int slurm_submit(struct slurm_ctx *ctx, const struct slurm_submit *s, uint32_t *job_id, char **err)
{
    struct slurm_argv a;
    struct slurm_result r;
    int rc = slurm_sbatch_argv(s, &a, err);
    memset(&r, 0, sizeof(r));
    if (rc == 0 && (rc = slurm_run(ctx, &a, &r, err)) == 0) {
        if (r.status != 0 && strstr(r.errtext, "Invalid feature specification"))
            rc = util_errf(err, -ENOTSUP, "no Slurm node has the features '%s': %s",
                           s->constraint ? s->constraint : "", first_line(&r));
        else if (r.status != 0)
            rc = util_errf(err, -EIO, "sbatch exited %d: %s", r.status, first_line(&r));
        else
            rc = slurm_parse_parsable(r.out.p ? r.out.p : "", job_id, err);
    }
    ubuf_free(&r.out);
    slurm_argv_free(&a);
    return rc;
}

static struct slurm_job_state *find(struct slurm_job_state *rows, size_t n, uint32_t job,
                                    int32_t task)
{
    for (size_t i = 0; i < n; i++)
        if (rows[i].job_id == job && rows[i].task_id == task)
            return &rows[i];
    return NULL;
}

/* Runs A and parses its stdout with PARSE into ROWS; squeue's "Invalid
 * job id specified" (every id gone) is an empty list. */
static int listing(struct slurm_ctx *ctx, struct slurm_argv *a,
                   int (*parse)(const char *, struct slurm_job_state *, size_t, size_t *, char **),
                   struct slurm_job_state *rows, size_t max, size_t *n, char **err)
{
    struct slurm_result r;
    int rc = slurm_run(ctx, a, &r, err);
    *n = 0;
    if (rc == 0) {
        if (r.status != 0 && strstr(r.errtext, "Invalid job id specified"))
            rc = 0;
        else if (r.status != 0)
            rc = util_errf(err, -EIO, "%s exited %d: %s", a->argv[0], r.status, first_line(&r));
        else
            rc = parse(r.out.p ? r.out.p : "", rows, max, n, err);
    }
    ubuf_free(&r.out);
    return rc;
}

/* The fallback for the rows squeue left out: one scontrol of every job
 * the controller keeps. */
static int query_scontrol(struct slurm_ctx *ctx, struct slurm_job_state *want, size_t n, char **err)
{
    struct slurm_argv a;
    size_t got = 0, max = 4 * SLURM_QUERY_MAX;
    struct slurm_job_state *rows = calloc(max, sizeof(*rows));
    if (!rows)
        return util_errf(err, -ENOMEM, "out of memory querying Slurm");
    slurm_argv_init(&a);
    int rc = slurm_argv_addf(&a, err, "scontrol");
    if (!rc && !(rc = slurm_argv_addf(&a, err, "-o")) && !(rc = slurm_argv_addf(&a, err, "show")) &&
        !(rc = slurm_argv_addf(&a, err, "job")))
        rc = listing(ctx, &a, slurm_parse_scontrol, rows, max, &got, err);
    for (size_t i = 0; rc == 0 && i < n; i++) {
        struct slurm_job_state *f =
            want[i].known ? NULL : find(rows, got, want[i].job_id, want[i].task_id);
        if (f)
            want[i] = *f;
    }
    free(rows);
    slurm_argv_free(&a);
    return rc;
}

int slurm_query(struct slurm_ctx *ctx, struct slurm_job_state *want, size_t n, char **err)
{
    if (n > SLURM_QUERY_MAX)
        return util_errf(err, -E2BIG, "a Slurm query has at most %d jobs, not %zu", SLURM_QUERY_MAX,
                         n);
    if (n == 0)
        return 0;
    struct ubuf ids;
    struct slurm_argv a;
    size_t got = 0;
    int rc = 0;
    struct slurm_job_state *rows = calloc(4 * SLURM_QUERY_MAX, sizeof(*rows));
    ubuf_init(&ids, (size_t)SLURM_QUERY_MAX * 12);
    slurm_argv_init(&a);
    if (!rows) {
        rc = util_errf(err, -ENOMEM, "out of memory querying Slurm");
        goto out;
    }
    for (size_t i = 0; i < n && rc == 0; i++) {
        want[i].known = false;
        /* the tasks of one array share its id: each id once */
        bool seen = false;
        for (size_t j = 0; j < i && !seen; j++)
            seen = want[j].job_id == want[i].job_id;
        if (!seen)
            rc = ubuf_addf(&ids, "%s%u", ids.len ? "," : "", want[i].job_id);
    }
    if (rc || (rc = slurm_argv_addf(&a, err, "squeue")) || (rc = slurm_argv_addf(&a, err, "-h")) ||
        (rc = slurm_argv_addf(&a, err, "-a")) || (rc = slurm_argv_addf(&a, err, "-r")) ||
        (rc = slurm_argv_addf(&a, err, "-j")) || (rc = slurm_argv_addf(&a, err, "%s", ids.p)) ||
        (rc = slurm_argv_addf(&a, err, "-o")) || (rc = slurm_argv_addf(&a, err, "%%i|%%T|%%r")))
        goto out;
    if ((rc = listing(ctx, &a, slurm_parse_squeue, rows, 4 * SLURM_QUERY_MAX, &got, err)) != 0)
        goto out;
    bool missing = false;
    for (size_t i = 0; i < n; i++) {
        struct slurm_job_state *f = find(rows, got, want[i].job_id, want[i].task_id);
        if (f)
            want[i] = *f;
        else
            missing = true;
    }
    if (missing)
        rc = query_scontrol(ctx, want, n, err);
out:
    free(rows);
    ubuf_free(&ids);
    slurm_argv_free(&a);
    return rc;
}

int slurm_cancel(struct slurm_ctx *ctx, const uint32_t *ids, const int32_t *tasks, size_t n,
                 char **err)
{
    struct slurm_argv a;
    struct slurm_result r;
    slurm_argv_init(&a);
    memset(&r, 0, sizeof(r));
    int rc = slurm_argv_addf(&a, err, "scancel");
    for (size_t i = 0; i < n && rc == 0; i++)
        rc = tasks && tasks[i] >= 0 ? slurm_argv_addf(&a, err, "%u_%d", ids[i], tasks[i])
                                    : slurm_argv_addf(&a, err, "%u", ids[i]);
    if (rc == 0 && (rc = slurm_run(ctx, &a, &r, err)) == 0) {
        if (r.status != 0)
            rc = util_errf(err, -EIO, "scancel exited %d: %s", r.status, first_line(&r));
    }
    ubuf_free(&r.out);
    slurm_argv_free(&a);
    return rc;
}
