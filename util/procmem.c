/*
 * util/procmem.c - process groups' resident memory from /proc (procmem.h).
 */
#include <ctype.h>
#include <dirent.h>
#include <fcntl.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "util/procmem.h"

/* Reads a small /proc file into BUF; its length or -1. */
static ssize_t read_small(const char *path, char *buf, size_t len)
{
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return -1;
    ssize_t n = read(fd, buf, len - 1);
    close(fd);
    if (n < 0)
        return -1;
    buf[n] = 0;
    return n;
}

/* The process group of PID from /proc/PID/stat ("pid (comm) S ppid pgrp"),
 * or -1. The command may hold spaces and parentheses: parse after the last
 * ')'. */
static pid_t proc_pgrp(const char *pid)
{
    char path[64], buf[512];
    snprintf(path, sizeof path, "/proc/%s/stat", pid);
    if (read_small(path, buf, sizeof buf) <= 0)
        return -1;
    const char *p = strrchr(buf, ')');
    int ppid = 0, pgrp = -1;
    char state = 0;
    if (!p || sscanf(p + 1, " %c %d %d", &state, &ppid, &pgrp) != 3)
        return -1;
    return (pid_t)pgrp;
}

static int64_t proc_rss(const char *pid)
{
    char path[64], buf[256];
    long long size = 0, resident = 0;
    snprintf(path, sizeof path, "/proc/%s/statm", pid);
    if (read_small(path, buf, sizeof buf) <= 0 || sscanf(buf, "%lld %lld", &size, &resident) != 2)
        return 0;
    return (int64_t)resident * sysconf(_SC_PAGESIZE);
}

void util_pgrp_rss_sum(const pid_t *pgids, int n, int64_t *sum)
{
    DIR *d = opendir("/proc");
    struct dirent *e;
    if (!d)
        return;
    while ((e = readdir(d)) != NULL) {
        if (!isdigit((unsigned char)e->d_name[0]))
            continue;
        pid_t g = proc_pgrp(e->d_name);
        for (int i = 0; g > 0 && i < n; i++) {
            if (pgids[i] == g) {
                sum[i] += proc_rss(e->d_name);
                break;
            }
        }
    }
    closedir(d);
}

int64_t util_pgrp_rss(pid_t pgid)
{
    int64_t sum = 0;
    util_pgrp_rss_sum(&pgid, 1, &sum);
    return sum;
}
