/*
 * cli/command.c - how every capctl command runs: the one prologue (flags,
 * checks, client) and epilogue around a command's own work, and the clock
 * and progress line of the commands that poll (wait, diff --wait-timeout).
 */
#include <errno.h>
#include <stdio.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "cli/capctl.h"

/* One order for every command, so flags are all checked before the
 * network is touched and whatever was opened is closed on every path; a
 * command without RUN is the GET its table names. */
int ctl_main(const struct ctl_cmd *cmd, int argc, char **argv, void *ctx)
{
    struct ctl_args a;
    struct ctl_client c = {0};
    int rc = ctl_parse(cmd, argc, argv, &a);
    if (rc) {
        rc = rc == 1 ? 0 : rc; /* 1: --help was printed */
        goto out;
    }
    if (cmd->check && (rc = cmd->check(&a, ctx)) != 0)
        goto out;
    if ((rc = ctl_client_open(&c, &a)) != 0)
        goto out;
    if (cmd->run)
        rc = cmd->run(&c, &a, ctx);
    else if (cmd->show.print)
        rc = ctl_show_object(&c, &a, cmd->show.base, cmd->show.what, cmd->show.print);
    else
        rc = ctl_show_list(&c, &a, cmd->list.path, cmd->list.key, cmd->list.print);
out:
    ctl_client_close(&c);
    ctl_args_free(&a);
    return rc;
}

double ctl_now_s(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + (double)t.tv_nsec / 1e9;
}

void ctl_sleep_s(double s)
{
    struct timespec t = {(time_t)s, (long)((s - (double)(time_t)s) * 1e9)};
    while (nanosleep(&t, &t) != 0 && errno == EINTR)
        ;
}

void ctl_progress_init(struct ctl_progress *p)
{
    p->tty = isatty(STDERR_FILENO);
    p->last[0] = 0;
}

/* An unchanged line is not written again: a CI log gets one line per
 * change, and a terminal already shows it. */
void ctl_progress_show(struct ctl_progress *p, const char *line)
{
    if (strcmp(line, p->last) != 0) {
        fprintf(stderr, p->tty ? "\r%s\033[K" : "%s\n", line);
        fflush(stderr);
    }
    snprintf(p->last, sizeof p->last, "%s", line);
}

void ctl_progress_end(struct ctl_progress *p)
{
    if (p->tty && p->last[0])
        fputc('\n', stderr);
    p->last[0] = 0;
}
