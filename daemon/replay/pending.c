/*
 * daemon/replay/pending.c - the replay steps' loop over the jobs waiting
 * for them (pending.h).
 */
#include "daemon/replay/pending.h"

bool replay_each_pending(struct store *st, const struct capd_config *cfg, replay_pending_fn pending,
                         replay_one_fn one)
{
    json_t *ids = NULL, *id;
    size_t i;
    bool created = false;
    if (pending(st, &ids) != 0)
        return false;
    json_array_foreach(ids, i, id)
    {
        created |= one(st, cfg, json_string_value(id));
    }
    json_decref(ids);
    return created;
}
