/*
 * cli/capctl.c - capctl, the command-line client of capd for CI and
 * reviewers: register builds, submit capture jobs, wait for them, and turn
 * a comparison's verdict into an exit code. Usage and exit codes are in
 * docs/capctl.md.
 */
#include <stdlib.h>
#include <string.h>

#include "cli/capctl.h"

/* The commands in the order capctl --help lists them, each with the line
 * it says there. */
static const struct {
    const struct ctl_cmd *cmd;
    const char *summary;
} commands[] = {
    {&ctl_cmd_builds, "list, register and show builds (how the framework is run)"},
    {&ctl_cmd_submit, "submit a capture job (optionally wait for it)"},
    {&ctl_cmd_status, "show a job and the state of its cells"},
    {&ctl_cmd_wait, "wait for a job to finish; exit 3 when a cell is not ok"},
    {&ctl_cmd_cancel, "cancel a job: stop its running cells, drop its queued ones"},
    {&ctl_cmd_diff, "compare a control and a head; exit 1 on a regression"},
    {&ctl_cmd_widths, "list the widths capd's host runs; check a job's widths against default"},
    {&ctl_cmd_modes, "check a job's compiled modes against its eager cells"},
    {&ctl_cmd_history, "show one cell's series along a branch, with change points"},
    {&ctl_cmd_bisect, "find the first bad commit between a good and a bad one"},
    {&ctl_cmd_repro, "replay a diverged cell's op on both builds: a standalone reproducer"},
    {&ctl_cmd_alerts, "list change points and numerics/outcome events; give feedback"},
};

static void usage(FILE *f)
{
    fprintf(f, "usage: capctl [--server URL] [--token T] [--data-dir DIR] [--cacert FILE] COMMAND "
               "[ARGS...]\n"
               "       capctl --help | --version | help COMMAND\n\n"
               "capctl talks to a capd daemon: it registers builds, submits model x width x pass\n"
               "capture jobs, waits for them, and compares a control against a branch head.\n\n"
               "commands:\n");
    for (size_t i = 0; i < sizeof commands / sizeof commands[0]; i++)
        fprintf(f, "  %-8s  %s\n", commands[i].cmd->name, commands[i].summary);
    fprintf(f,
            "\nglobal options (also accepted after the command):\n"
            "  --server URL  capd to talk to (default: $CAPD_SERVER, else %s)\n"
            "  --token T     bearer token (default: $CAPD_TOKEN; the variable keeps it out of "
            "ps)\n"
            "  --data-dir DIR  without a token, use DIR/admin.token, the admin token capd\n"
            "                made at its first start (default: $CAPD_DATA_DIR, else %s\n"
            "                for a server on this machine)\n"
            "  --cacert FILE PEM CA certificate(s) to verify an https:// server against\n"
            "                (default: $CAPD_CACERT, else the system's CAs)\n"
            "  --help        this text; 'capctl COMMAND --help' for a command\n"
            "  --version     print capctl's version\n\n"
            "exit codes: 0 ok, 1 regression (diff), a diverged width or mode (widths check,\n"
            "modes check), 2 error,\n"
            "3 a cell was not ok (wait)\n",
            CTL_DEFAULT_SERVER, CTL_DEFAULT_DATA_DIR);
}

/* Takes --server/--token given before the command name; returns the index
 * of the command word, or -1 after printing a usage error, or 0 when it
 * printed help or the version. */
static int globals(int argc, char **argv, int *exit_code)
{
    int i = 1;
    for (; i < argc && argv[i][0] == '-'; i++) {
        const char *w = argv[i];
        if (strcmp(w, "--help") == 0 || strcmp(w, "-h") == 0) {
            usage(stdout);
            *exit_code = 0;
            return 0;
        }
        if (strcmp(w, "--version") == 0) {
            printf("capctl %s\n", CAPD_VERSION);
            *exit_code = 0;
            return 0;
        }
        const char **dst = NULL;
        const char *name = NULL;
        if (strncmp(w, "--server", 8) == 0 && (w[8] == 0 || w[8] == '=')) {
            dst = &ctl_global_server;
            name = "--server";
        } else if (strncmp(w, "--token", 7) == 0 && (w[7] == 0 || w[7] == '=')) {
            dst = &ctl_global_token;
            name = "--token";
        } else if (strncmp(w, "--data-dir", 10) == 0 && (w[10] == 0 || w[10] == '=')) {
            dst = &ctl_global_data_dir;
            name = "--data-dir";
        } else if (strncmp(w, "--cacert", 8) == 0 && (w[8] == 0 || w[8] == '=')) {
            dst = &ctl_global_cacert;
            name = "--cacert";
        }
        if (!dst) {
            fprintf(stderr, "capctl: unknown flag '%s' before the command (see 'capctl --help')\n",
                    w);
            *exit_code = CTL_EXIT_ERROR;
            return -1;
        }
        const char *eq = strchr(w, '=');
        if (eq) {
            *dst = eq + 1;
        } else if (i + 1 < argc && strncmp(argv[i + 1], "--", 2) != 0) {
            *dst = argv[++i];
        } else {
            fprintf(stderr, "capctl: flag %s needs a value (see 'capctl --help')\n", name);
            *exit_code = CTL_EXIT_ERROR;
            return -1;
        }
    }
    if (i == argc) {
        usage(stderr);
        *exit_code = CTL_EXIT_ERROR;
        return -1;
    }
    return i;
}

int main(int argc, char **argv)
{
    int code = CTL_EXIT_ERROR;
    int i = globals(argc, argv, &code);
    if (i <= 0)
        return code;
    const char *cmd = argv[i];
    if (strcmp(cmd, "version") == 0) {
        printf("capctl %s\n", CAPD_VERSION);
        return 0;
    }
    if (strcmp(cmd, "help") == 0) {
        if (i + 1 >= argc) {
            usage(stdout);
            return 0;
        }
        cmd = argv[i + 1];
        for (size_t k = 0; k < sizeof commands / sizeof commands[0]; k++) {
            if (strcmp(commands[k].cmd->name, cmd) == 0) {
                char help[] = "--help";
                char *hv[] = {help, NULL};
                /* "help builds register" shows the subcommand's help. */
                if (i + 2 < argc) {
                    char *sv[] = {argv[i + 2], help, NULL};
                    return ctl_main(commands[k].cmd, 2, sv);
                }
                return ctl_main(commands[k].cmd, 1, hv);
            }
        }
        fprintf(stderr, "capctl: unknown command '%s' (see 'capctl --help')\n", cmd);
        return CTL_EXIT_ERROR;
    }
    for (size_t k = 0; k < sizeof commands / sizeof commands[0]; k++) {
        if (strcmp(commands[k].cmd->name, cmd) == 0) {
            if (curl_global_init(CURL_GLOBAL_DEFAULT) != CURLE_OK) {
                fprintf(stderr, "capctl: cannot initialize libcurl\n");
                return CTL_EXIT_ERROR;
            }
            code = ctl_main(commands[k].cmd, argc - i - 1, argv + i + 1);
            curl_global_cleanup();
            return code;
        }
    }
    fprintf(stderr, "capctl: unknown command '%s' (see 'capctl --help')\n", cmd);
    return CTL_EXIT_ERROR;
}
