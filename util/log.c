#include <stdarg.h>
#include <stdio.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "util/clock.h"
#include "util/log.h"

static enum log_level min_level = LOG_INFO;
static const char *const names[] = {"debug", "info", "warn", "error"};

void log_set_level(enum log_level l)
{
    min_level = l;
}

int log_parse_level(const char *s, enum log_level *out)
{
    for (int i = 0; i < 4; i++)
        if (strcmp(s, names[i]) == 0) {
            *out = (enum log_level)i;
            return 0;
        }
    return -1;
}

const char *log_q(const char *v)
{
    static _Thread_local char slots[4][512];
    static _Thread_local int next;
    char *b = slots[next++ & 3];
    if (!v)
        return "-";
    if (*v && !strpbrk(v, " \"=\t\n\\")) {
        snprintf(b, 512, "%s", v);
        return b;
    }
    size_t o = 0;
    b[o++] = '"';
    for (; *v && o < 506; v++) {
        unsigned char c = (unsigned char)*v;
        if (c == '"' || c == '\\') {
            b[o++] = '\\';
            b[o++] = (char)c;
        } else if (c == '\n') {
            b[o++] = '\\';
            b[o++] = 'n';
        } else if (c < 0x20) {
            b[o++] = '?';
        } else {
            b[o++] = (char)c;
        }
    }
    b[o++] = '"';
    b[o] = 0;
    return b;
}

void log_event(enum log_level l, const char *event, const char *fmt, ...)
{
    if (l < min_level)
        return;
    char line[2048];
    size_t n = util_time_text(util_wall_ms(), line);
    n += (size_t)snprintf(line + n, sizeof line - n, " level=%s event=%s", names[l], event);
    if (fmt && *fmt && n < sizeof line - 2) {
        line[n++] = ' ';
        va_list ap;
        va_start(ap, fmt);
        int w = vsnprintf(line + n, sizeof line - n, fmt, ap);
        va_end(ap);
        n = w < 0 ? n : n + (size_t)w;
    }
    if (n > sizeof line - 2)
        n = sizeof line - 2;
    line[n++] = '\n';
    ssize_t wr = write(STDERR_FILENO, line, n);
    (void)wr;
}
