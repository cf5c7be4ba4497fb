/*
 * tests/helpers/die_with_parent.c - die_with_parent PPID PROGRAM [ARG...]
 *
 * Becomes PROGRAM (execv, so the pid the test holds is PROGRAM's) after
 * asking the kernel to SIGKILL it when its parent dies. Tests start capd
 * through it: a test process that Criterion or ctest kills at a timeout
 * runs no atexit handler, and without this its capd would outlive it.
 * PPID is the parent that must still be there; when it is already gone
 * the helper exits 2 instead of starting an orphan.
 */
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/prctl.h>
#include <unistd.h>

int main(int argc, char **argv)
{
    if (argc < 3) {
        fprintf(stderr, "usage: die_with_parent PPID PROGRAM [ARG...]\n");
        return 2;
    }
    if (prctl(PR_SET_PDEATHSIG, SIGKILL) != 0) {
        perror("die_with_parent: prctl(PR_SET_PDEATHSIG)");
        return 2;
    }
    if (getppid() != (pid_t)atol(argv[1])) {
        fprintf(stderr, "die_with_parent: parent %s is gone\n", argv[1]);
        return 2;
    }
    execv(argv[2], argv + 2);
    perror(argv[2]);
    return 127;
}
