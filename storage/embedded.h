/* storage/embedded.h - files from schema/ compiled into the binary. */
#ifndef CAPD_EMBEDDED_H
#define CAPD_EMBEDDED_H
#include <stddef.h>

struct embedded_file {
    const char *name;
    const char *data; /* NUL-terminated */
    size_t size;
};

/* Terminated by an entry whose name is NULL. */
extern const struct embedded_file embedded_files[];

/* Finds a file by name; NULL when absent. */
const struct embedded_file *embedded_find(const char *name);

#endif
