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

#endif
