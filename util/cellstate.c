/*
 * util/cellstate.c - the one table of cell state names.
 */
#include <errno.h>
#include <string.h>

#include "util/cellstate.h"

static const char *const names[CELL_STATE_N] = {
    [CELL_QUEUED] = "queued",
    [CELL_RUNNING] = "running",
    [CELL_OK] = "ok",
    [CELL_FAILED] = "failed",
    [CELL_CRASHED] = "crashed",
    [CELL_TIMEOUT] = "timeout",
    [CELL_CANCELLED] = "cancelled",
    [CELL_UNSUPPORTED] = "unsupported",
    [CELL_PROTOCOL_ERROR] = "protocol_error",
    [CELL_INTERRUPTED] = "interrupted",
    [CELL_OOM] = "oom",
};

const char *cell_state_name(enum cell_state st)
{
    return (unsigned)st < CELL_STATE_N ? names[st] : NULL;
}

int cell_state_parse(const char *s, enum cell_state *out)
{
    if (!s)
        return -EINVAL;
    for (unsigned i = 0; i < CELL_STATE_N; i++) {
        if (strcmp(s, names[i]) == 0) {
            *out = (enum cell_state)i;
            return 0;
        }
    }
    return -EINVAL;
}

bool cell_state_is(const char *s, enum cell_state st)
{
    return s && (unsigned)st < CELL_STATE_N && strcmp(s, names[st]) == 0;
}

bool cell_state_final(enum cell_state st)
{
    return (unsigned)st < CELL_STATE_N && st != CELL_QUEUED && st != CELL_RUNNING;
}

bool cell_state_failure(enum cell_state st)
{
    switch (st) {
    case CELL_FAILED:
    case CELL_CRASHED:
    case CELL_TIMEOUT:
    case CELL_PROTOCOL_ERROR:
    case CELL_OOM:
        return true;
    default:
        return false;
    }
}
