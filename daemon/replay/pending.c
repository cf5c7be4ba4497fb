/*
 * daemon/replay/pending.c - the replay steps' loop over the jobs waiting
 * for them (pending.h).
 */
#include "daemon/replay/pending.h"

#include <errno.h>
#include <stdio.h>
#include <string.h>

#include "util/log.h"

bool replay_each_pending(struct store *st, const struct capd_config *cfg, replay_pending_fn pending,
                         replay_one_fn one, const void *arg)
{
    json_t *ids = NULL, *id;
    size_t i;
    bool created = false;
    if (pending(st, &ids) != 0)
        return false;
    json_array_foreach(ids, i, id)
    {
        created |= one(st, cfg, json_string_value(id), arg);
    }
    json_decref(ids);
    return created;
}

/* Looks at job ID with the looker ARG and labels it with what came of it,
 * unless it is to be looked at again. */
static bool look_one(struct store *st, const struct capd_config *cfg, const char *id,
                     const void *arg)
{
    const struct replay_looker *k = arg;
    char label[160] = "";
    int rc = k->look(st, cfg, id, label, sizeof label);
    if (rc == 1 || rc == -EAGAIN)
        return false; /* again at a later pass */
    if (rc < 0)
        snprintf(label, sizeof label, "refused: %s", strerror(-rc));
    if (label[0])
        store_job_label(st, id, k->key, label);
    log_info(k->key, "job=%s result=%s", id, log_q(label));
    return strncmp(label, k->created, strlen(k->created)) == 0;
}

bool replay_look_pending(struct store *st, const struct capd_config *cfg,
                         const struct replay_looker *k)
{
    return replay_each_pending(st, cfg, k->pending, look_one, k);
}
