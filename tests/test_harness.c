/*
 * tests/test_harness.c - the harness's own promise that a test leaves no
 * process behind: tu_capd_start starts capd through die_with_parent, so a
 * test process killed outright (Criterion's or ctest's timeout, which runs
 * no atexit handler) takes its capd with it.
 */
#include <criterion/criterion.h>

#include <errno.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "tests/helpers/common/testutil.h"

/* Whether PID is gone or a zombie nobody has reaped yet. */
static bool dead(pid_t pid)
{
    char path[64], buf[256];
    snprintf(path, sizeof path, "/proc/%ld/stat", (long)pid);
    FILE *f = fopen(path, "r");
    if (f == NULL)
        return true;
    bool z = false;
    if (fgets(buf, sizeof buf, f)) {
        char *rp = strrchr(buf, ')');
        z = rp && rp[1] == ' ' && rp[2] == 'Z';
    }
    fclose(f);
    return z;
}

/* A shell starts a capd through the guard, then is killed with SIGKILL:
 * the capd must die too. */
Test(harness, capd_dies_with_a_killed_test_process, .timeout = 60)
{
    char *dir = tu_tmpdir(), *guard = tu_helper("die_with_parent");
    cr_assert(dir && guard);
    cr_assert_eq(tu_sh("sh -c '\"%s\" $$ \"%s\" --listen 127.0.0.1:0 --data-dir \"%s/data\" "
                       ">/dev/null 2>&1 & echo $! > \"%s/pid\"; sleep 1; kill -9 $$'",
                       guard, tu_bin("CAPD_BIN"), dir, dir),
                 128 + SIGKILL, "the starting shell ends by SIGKILL");
    char path[400];
    snprintf(path, sizeof path, "%s/pid", dir);
    char *text = tu_slurp(path);
    cr_assert_not_null(text);
    pid_t pid = (pid_t)atol(text);
    cr_assert_gt(pid, 1);
    bool gone = false;
    for (int i = 0; i < 200 && !(gone = dead(pid)); i++)
        usleep(50 * 1000);
    if (!gone)
        kill(pid, SIGKILL); /* leave nothing behind even when the check fails */
    cr_assert(gone, "capd %ld outlived the process that started it", (long)pid);
    free(text);
    tu_sh("rm -rf '%s'", dir);
    free(dir);
    free(guard);
}

/* A guard whose parent is not the one named starts nothing. */
Test(harness, guard_refuses_when_its_parent_is_gone)
{
    char *guard = tu_helper("die_with_parent");
    cr_assert_eq(tu_sh("\"%s\" 1 /bin/true 2>/dev/null", guard), 2);
    cr_assert_eq(tu_sh("\"%s\" 2>/dev/null", guard), 2, "usage");
    free(guard);
}
