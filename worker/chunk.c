/*
 * worker/chunk.c - the chunk bookkeeping of a stream (worker.h): what to
 * POST next, and where the stream stands after capd's answer. No I/O, so
 * tests/test_capd_cell.c checks every case from a table.
 */
#include "worker/worker.h"

bool worker_chunk_next(const struct worker_window *w, size_t chunk, bool due, bool flush,
                       struct worker_chunk *c)
{
    if (w->buffered == 0 || chunk == 0)
        return false;
    if (w->buffered < chunk && !due && !flush)
        return false;
    c->offset = w->acked;
    c->len = w->buffered < chunk ? w->buffered : chunk;
    return true;
}

/* RECEIVED before ACKED would mean capd lost bytes it acknowledged, which
 * the worker no longer holds; past ACKED + BUFFERED it names bytes the
 * runner never wrote. Either is capd's error, not something to resend. */
enum worker_ack worker_chunk_ack(struct worker_window *w, uint64_t received, size_t *drop)
{
    if (received < w->acked)
        return WORKER_ACK_BEHIND;
    if (received - w->acked > w->buffered)
        return WORKER_ACK_AHEAD;
    *drop = (size_t)(received - w->acked);
    w->acked = received;
    w->buffered -= *drop;
    return WORKER_ACK_OK;
}
