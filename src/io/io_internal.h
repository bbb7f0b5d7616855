/* io_internal.h - helpers shared by the files of nibble_io (not installed). */
#ifndef NB_IO_INTERNAL_H
#define NB_IO_INTERNAL_H

#include "nibble.h"

#include <stddef.h>

/* Format a message into err (errlen bytes; either may be 0/NULL) and return st. */
nb_status nbio_fail(char *err, size_t errlen, nb_status st, const char *fmt, ...)
    __attribute__((format(printf, 4, 5), visibility("hidden")));
/* malloc'ed copy of s, NULL when out of memory. */
char *nbio_strdup(const char *s) __attribute__((visibility("hidden")));

/* a + "/" + b, malloc'ed (NULL when out of memory). */
char *nbio_join(const char *a, const char *b) __attribute__((visibility("hidden")));
int nbio_ends_with(const char *s, const char *suffix) __attribute__((visibility("hidden")));
/* Resolve a checkpoint path (a .safetensors file, a directory holding
 * model.safetensors.index.json or model.safetensors, or an index file) to its
 * directory and the file to open; both malloc'ed.  Sets *sharded for an
 * index. */
nb_status nbio_resolve_checkpoint(const char *path, char **dir, char **file, int *sharded, char *err, size_t errlen)
    __attribute__((visibility("hidden")));

#endif
