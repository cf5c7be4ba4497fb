/*
 * daemon/attempt/cellbase.c - what every cell attempt has, whatever its executor
 * (daemon/config/executor.h): the capped log, the handles whose last close frees
 * the attempt, the read buffer every cell shares, and the
 * SIGTERM-then-SIGKILL sequence, which asks the executor's stop.
 */
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "daemon/config/executor.h"
#include "daemon/attempt/sup_int.h"

/* ---- the capped log: tail kept ----
 * Output goes to LOG.part; when that reaches half the cap it becomes
 * LOG.prev (replacing the older one) and a new part starts, so the last
 * cap/2..cap bytes always survive. At the end the two are joined. */

int sup__log_open(struct sup *s)
{
    char part[1100];
    snprintf(part, sizeof part, "%s.part", s->log_path);
    s->log_fd = open(part, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0640);
    return s->log_fd < 0 ? -errno : 0;
}

void sup__log_write(struct sup *s, const char *data, size_t n)
{
    if (s->log_fd < 0)
        return;
    uint64_t half = s->cfg->cell_log_max_bytes / 2;
    while (n > 0) {
        if (s->log_part_bytes >= half) {
            char prev[1100], part[1100];
            snprintf(prev, sizeof prev, "%s.prev", s->log_path);
            snprintf(part, sizeof part, "%s.part", s->log_path);
            struct stat sb;
            if (stat(prev, &sb) == 0)
                s->log_dropped += (uint64_t)sb.st_size;
            close(s->log_fd);
            rename(part, prev);
            s->log_fd = open(part, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0640);
            s->log_part_bytes = 0;
            if (s->log_fd < 0)
                return;
        }
        size_t room = half - s->log_part_bytes;
        size_t w = n < room ? n : room;
        ssize_t r = write(s->log_fd, data, w);
        if (r <= 0)
            return;
        s->log_part_bytes += (uint64_t)r;
        data += r;
        n -= (size_t)r;
    }
}

void sup__log_finish(struct sup *s)
{
    char prev[1100], part[1100];
    snprintf(prev, sizeof prev, "%s.prev", s->log_path);
    snprintf(part, sizeof part, "%s.part", s->log_path);
    if (s->log_fd >= 0)
        close(s->log_fd);
    s->log_fd = -1;
    int in = open(prev, O_RDONLY | O_CLOEXEC);
    if (in < 0) {
        rename(part, s->log_path);
        return;
    }
    int out = open(s->log_path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0640);
    if (out >= 0) {
        char note[160];
        int nn = snprintf(note, sizeof note,
                          "[capd: log over its %llu-byte cap; %llu earlier bytes dropped, the "
                          "tail follows]\n",
                          (unsigned long long)s->cfg->cell_log_max_bytes,
                          (unsigned long long)s->log_dropped);
        ssize_t wr = write(out, note, (size_t)nn);
        (void)wr;
        for (int pass = 0; pass < 2; pass++) {
            ssize_t r;
            while ((r = read(in, s->buf, SUP__READ_BUF)) > 0)
                if (write(out, s->buf, (size_t)r) != r)
                    break;
            close(in);
            in = pass == 0 ? open(part, O_RDONLY | O_CLOEXEC) : -1;
            if (in < 0)
                break;
        }
        close(out);
    }
    if (in >= 0)
        close(in);
    unlink(prev);
    unlink(part);
}

/* The last handle's close frees S. */
static void on_close(uv_handle_t *h)
{
    struct sup *s = h->data;
    if (--s->handles_open > 0)
        return;
    sup__free(s);
}

void sup__close_handle(struct sup *s, uv_handle_t *h)
{
    if (!uv_is_closing(h))
        uv_close(h, on_close);
}

void sup__free(struct sup *s)
{
    if (s->exec->release)
        s->exec->release(s); /* its state, S->ex */
    store_cell_run_clear(&s->run);
    store_cell_run_clear(&s->next);
    frame_parser_free(s->fp);
    free(s->fail_state);
    free(s->fail_reason);
    free(s->log_path);
    free(s);
}

void sup__fail(struct sup *s, enum cell_state state, const char *reason)
{
    if (s->fail_state)
        return;
    s->fail_state = strdup(cell_state_name(state));
    s->fail_reason = strdup(reason);
}

/* ---- the end asked of the executor ---- */

static void on_kill_timer(uv_timer_t *t)
{
    struct sup *s = t->data;
    s->exec->stop(s, SIGKILL);
}

void sup__terminate(struct sup *s)
{
    if (s->kill_sent || s->exited)
        return;
    s->kill_sent = true;
    s->exec->stop(s, SIGTERM);
    uv_timer_stop(&s->timer);
    uv_timer_start(&s->timer, on_kill_timer, (uint64_t)s->cfg->kill_grace_ms, 0);
}

/*
 * The read buffer of every cell: all reads happen on the loop thread and
 * each is consumed (parsed, or written to the log) before the callback
 * returns, so one buffer serves them all. Allocated once: a 1 MiB malloc
 * per cell is an mmap and a munmap, and the munmap of a multi-threaded
 * process interrupts every CPU that runs one of its threads.
 */
char *sup__read_buffer(void)
{
    static char *buf;
    if (!buf)
        buf = malloc(SUP__READ_BUF);
    return buf;
}
