/*
 * cli/command.c - how every capctl command runs: the one prologue (flags,
 * checks, client) and epilogue around a command's own work, a group's
 * choice of subcommand, and the clock, progress line and pending-reply
 * polling of the commands that wait (wait, diff and widths check
 * --wait-timeout).
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "cli/capctl.h"
#include "util/clock.h"

/* "list, register or show": the words of a group's subcommands (the
 * first 15), for the message that names them. */
static void sub_words(const struct ctl_cmd *g, char *buf, size_t cap)
{
    const char *words[16];
    size_t n = 0, len = strlen(g->name) + 1;
    for (const struct ctl_cmd *const *s = g->subs; *s && n + 1 < 16; s++)
        words[n++] = (*s)->name + len;
    words[n] = NULL;
    ctl_or_list(words, buf, cap);
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
    return (double)util_mono_ns() / 1e9;
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

/* What a 409 pending reply waits for: "control job j.. (running), head job
 * j.. (queued)" for a comparison, "job j.. (running)" for one job, else the
 * server's message. */
static void pending_text(const struct ctl_resp *r, char *buf, size_t cap)
{
    json_t *j = ctl_resp_json(r);
    json_t *ctl = json_object_get(j, "control"), *head = json_object_get(j, "head");
    json_t *job = json_object_get(j, "job");
    char b1[64], b2[64], b3[64], b4[64];
    if (json_is_object(ctl) && json_is_object(head)) {
        snprintf(buf, cap, "waiting: control job %s (%s), head job %s (%s)",
                 ctl_jtext(json_object_get(ctl, "job"), b1, sizeof b1),
                 ctl_jtext(json_object_get(ctl, "state"), b2, sizeof b2),
                 ctl_jtext(json_object_get(head, "job"), b3, sizeof b3),
                 ctl_jtext(json_object_get(head, "state"), b4, sizeof b4));
    } else if (json_is_object(job)) {
        snprintf(buf, cap, "waiting: job %s (%s)",
                 ctl_jtext(json_object_get(job, "job"), b1, sizeof b1),
                 ctl_jtext(json_object_get(job, "state"), b2, sizeof b2));
    } else {
        char m[512];
        const char *msg =
            json_string_value(json_object_get(json_object_get(j, "error"), "message"));
        snprintf(buf, cap, "waiting: %s",
                 ctl_clean(msg ? msg : "a job has not finished", m, sizeof m));
    }
    json_decref(j);
}

int ctl_fetch_settled(struct ctl_client *c, const struct ctl_cmd *cmd, const char *url,
                      double wait_timeout, struct ctl_resp *r)
{
    struct ctl_progress p;
    char line[512], code[64];
    double t0 = ctl_now_s();
    ctl_progress_init(&p);
    for (;;) {
        if (ctl_request(c, "GET", url, NULL, NULL, r) != 0) {
            ctl_progress_end(&p);
            ctl_report(c, r);
            return CTL_EXIT_ERROR;
        }
        if (r->status == 200)
            break;
        ctl_resp_error_code(r, code, sizeof code);
        bool pending = r->status == 409 && strcmp(code, "pending") == 0;
        if (!pending || wait_timeout < 0 || ctl_now_s() - t0 >= wait_timeout) {
            ctl_progress_end(&p);
            ctl_report_fields(c, r, cmd);
            if (pending && wait_timeout < 0)
                fprintf(stderr, "capctl: add --wait-timeout SECONDS to wait for the jobs\n");
            else if (pending)
                fprintf(stderr, "capctl: still pending after %g s (--wait-timeout)\n",
                        wait_timeout);
            return CTL_EXIT_ERROR;
        }
        pending_text(r, line, sizeof line);
        ctl_progress_show(&p, line);
        ctl_resp_free(r);
        double left = wait_timeout - (ctl_now_s() - t0);
        ctl_sleep_s(left < CTL_POLL_S ? (left > 0 ? left : 0) : CTL_POLL_S);
    }
    ctl_progress_end(&p);
    return 0;
}

int ctl_print_url(struct ctl_client *c, const char *url, bool overflow)
{
    struct ctl_resp r = {0};
    int rc = CTL_EXIT_ERROR;
    if (overflow || ctl_request(c, "GET", url, NULL, NULL, &r) != 0 || r.status != 200) {
        ctl_report(c, &r);
    } else {
        ctl_print_report(r.body, r.len);
        rc = 0;
    }
    ctl_resp_free(&r);
    return rc;
}
