/*
 * daemon/config/executor.c - the table of executors (daemon/config/executor.h): each
 * row is defined by its executor's file.
 */
#include <stdio.h>
#include <string.h>

#include "daemon/config/executor.h"

extern const struct executor executor_local, executor_remote, executor_slurm;

static const struct executor *const executors[] = {
    &executor_local,
    &executor_remote,
    &executor_slurm,
};

#define N_EXECUTORS (sizeof executors / sizeof executors[0])

const struct executor *executor_find(const char *name)
{
    for (size_t i = 0; name && i < N_EXECUTORS; i++)
        if (strcmp(executors[i]->name, name) == 0)
            return executors[i];
    return NULL;
}

void executor_names(char *out, size_t n)
{
    size_t used = 0;
    if (n)
        out[0] = '\0';
    for (size_t i = 0; i < N_EXECUTORS && used < n; i++) {
        const char *sep = i == 0 ? "" : i + 1 == N_EXECUTORS ? " or " : ", ";
        int w = snprintf(out + used, n - used, "%s\"%s\"", sep, executors[i]->name);
        if (w < 0)
            break;
        used += (size_t)w;
    }
}
