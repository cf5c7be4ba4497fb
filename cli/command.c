/*
 * cli/command.c - how every capctl command runs: the one prologue (flags,
 * checks, client) and epilogue around a command's own work, a group's
 * choice of subcommand, and the clock and progress line of the commands
 * that poll (wait, diff --wait-timeout).
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "cli/capctl.h"

/* "list, register or show": the words of a group's subcommands, for the
 * message that names them. */
static void sub_words(const struct ctl_cmd *g, char *buf, size_t cap)
{
    size_t n = 0, len = strlen(g->name) + 1;
    buf[0] = 0;
    for (const struct ctl_cmd *const *s = g->subs; *s && n < cap; s++) {
        const char *sep = s == g->subs ? "" : s[1] ? ", " : " or ";
        int w = snprintf(buf + n, cap - n, "%s%s", sep, (*s)->name + len);
        n += w > 0 ? (size_t)w : 0;
    }
}

/* A group's first word names its subcommand; none, or a flag, is its
 * first one (capctl builds --json lists the builds). */
static int group_main(const struct ctl_cmd *g, int argc, char **argv)
{
    size_t len = strlen(g->name);
    if (argc == 0 || argv[0][0] == '-') {
        if (argc > 0 && (strcmp(argv[0], "--help") == 0 || strcmp(argv[0], "-h") == 0)) {
            fputs(g->usage, stdout);
            return 0;
        }
        return ctl_main(g->subs[0], argc, argv);
    }
    for (const struct ctl_cmd *const *s = g->subs; *s; s++)
        if (strcmp((*s)->name + len + 1, argv[0]) == 0)
            return ctl_main(*s, argc - 1, argv + 1);
    char words[256];
    sub_words(g, words, sizeof words);
    fprintf(stderr, "capctl %s: unknown subcommand '%s' (%s; see 'capctl %s --help')\n", g->name,
            argv[0], words, g->name);
    return CTL_EXIT_ERROR;
}

/* The run of a command without RUN: the GET its table names. */
static int show_run(const struct ctl_cmd *cmd, struct ctl_client *c, const struct ctl_args *a)
{
    if (cmd->show.print)
        return ctl_show_object(c, a, cmd->show.base, cmd->show.what, cmd->show.print);
    return ctl_show_list(c, a, cmd->list.path, cmd->list.key, cmd->list.print);
}

/* One order for every command, so flags are all checked before the
 * network is touched and whatever was opened is closed on every path. */
int ctl_main(const struct ctl_cmd *cmd, int argc, char **argv)
{
    if (cmd->subs)
        return group_main(cmd, argc, argv);
    struct ctl_args a;
    struct ctl_client c = {0};
    void *ctx = cmd->ctx_size ? calloc(1, cmd->ctx_size) : NULL;
    int rc;
    if (cmd->ctx_size && !ctx) {
        fprintf(stderr, "capctl: out of memory\n");
        return CTL_EXIT_ERROR;
    }
    if ((rc = ctl_parse(cmd, argc, argv, &a)) != 0) {
        rc = rc == 1 ? 0 : rc; /* 1: --help was printed */
        goto out;
    }
    if (cmd->check && (rc = cmd->check(&a, ctx)) != 0)
        goto out;
    if ((rc = ctl_client_open(&c, &a)) != 0)
        goto out;
    rc = cmd->run ? cmd->run(&c, &a, ctx) : show_run(cmd, &c, &a);
out:
    ctl_client_close(&c);
    ctl_args_free(&a);
    if (ctx && cmd->done)
        cmd->done(ctx);
    free(ctx);
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
