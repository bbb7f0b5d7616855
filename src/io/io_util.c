/* io_util.c - what every file of src/io shares: strings, the format table
 * as the checkpoint code reads it, and the struct sizes of nibble_io.h. */
#define _DEFAULT_SOURCE /* O_CLOEXEC, O_NOCTTY */
#include "io_internal.h"

#include <errno.h>
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

/* ------------------------------------------------------------ strings */

char *nbio_strdup(const char *s) {
    size_t n = strlen(s) + 1;
    char *p = (char *)malloc(n);
    if (p) memcpy(p, s, n);
    return p;
}

/* a + sep + b (sep may be ""), malloc'ed. */
static char *cat3(const char *a, const char *sep, const char *b) {
    size_t na = strlen(a), ns = strlen(sep), nb = strlen(b);
    char *p = (char *)malloc(na + ns + nb + 1);
    if (!p) return NULL;
    memcpy(p, a, na);
    memcpy(p + na, sep, ns);
    memcpy(p + na + ns, b, nb + 1);
    return p;
}

char *nbio_join(const char *a, const char *b) { return cat3(a, "/", b); }
char *nbio_concat(const char *a, const char *b) { return cat3(a, "", b); }

int nbio_ends_with(const char *s, const char *suffix) {
    size_t n = strlen(s), m = strlen(suffix);
    return n >= m && !memcmp(s + n - m, suffix, m);
}

int nbio_push_str(char ***arr, size_t *n, char *s) {
    if (!s) return 0;
    char **a = (char **)realloc(*arr, (*n + 1) * sizeof *a);
    if (!a) {
        free(s);
        return 0;
    }
    a[(*n)++] = s;
    *arr = a;
    return 1;
}

void nbio_free_strs(char **a, size_t n) {
    for (size_t i = 0; i < n; i++) free(a[i]);
    free(a);
}

/* ------------------------------------------------------------ input files */

static const char *file_kind(mode_t m) {
    return S_ISDIR(m)    ? "a directory"
           : S_ISFIFO(m) ? "a FIFO"
           : S_ISSOCK(m) ? "a socket"
           : S_ISCHR(m)  ? "a character device"
           : S_ISBLK(m)  ? "a block device"
                         : "not a plain file";
}

/* stat() first, so that a FIFO is refused without being opened (opening one
 * for reading waits for a writer); then open without waiting (O_NONBLOCK)
 * and check again on the descriptor, in case the path changed in between. */
nb_status nbio_open_regular(const char *path, int *fd_out, uint64_t *size) {
    *fd_out = -1;
    struct stat sb;
    if (stat(path, &sb) != 0) return nbi_fail(NULL, NB_ERR_IO, "%s: cannot open: %s", path, strerror(errno));
    if (!S_ISREG(sb.st_mode))
        return nbi_fail(NULL, NB_ERR_IO, "%s: not a regular file (%s)", path, file_kind(sb.st_mode));
    const int fd = open(path, O_RDONLY | O_CLOEXEC | O_NONBLOCK | O_NOCTTY);
    if (fd < 0) return nbi_fail(NULL, NB_ERR_IO, "%s: cannot open: %s", path, strerror(errno));
    if (fstat(fd, &sb) != 0 || !S_ISREG(sb.st_mode)) {
        close(fd);
        return nbi_fail(NULL, NB_ERR_IO, "%s: not a regular file (it changed while being opened)", path);
    }
    const int fl = fcntl(fd, F_GETFL);
    if (fl >= 0) (void)fcntl(fd, F_SETFL, fl & ~O_NONBLOCK);
    *fd_out = fd;
    if (size) *size = (uint64_t)sb.st_size;
    return NB_OK;
}

/* ------------------------------------------------------------ formats */

nb_status nbio_format_info(nb_format f, const char *what, nb_format_info *out) {
    if (nb_format_get_info(f, out) != NB_OK) {
        char names[128];
        nbi_format_names(names, sizeof names);
        return nbi_fail(NULL, NB_ERR_INVALID_ARGUMENT, "%s: %d is not a weight format (formats: %s)", what, (int)f,
                        names);
    }
    return NB_OK;
}

nb_st_dtype nbio_scale_dtype(int32_t scale_type) {
    switch (scale_type) {
    case NB_SCALE_E4M3: return NB_ST_F8_E4M3;
    case NB_SCALE_E8M0: return NB_ST_U8; /* as ModelOpt, Quark and compressed-tensors store E8M0 */
    }
    return (nb_st_dtype)0;
}

int nbio_reserved_zero(const int32_t *r, size_t n) {
    for (size_t i = 0; i < n; i++)
        if (r[i]) return 0;
    return 1;
}

/* ------------------------------------------------------------ ABI */

nb_status nb_io_struct_size(const char *name, size_t *bytes) {
    if (!name || !bytes) return nbi_fail(NULL, NB_ERR_NULL_POINTER, "nb_io_struct_size: name and bytes must not be NULL");
#define NBIO_SIZE(T) {#T, sizeof(T)}
    static const struct {
        const char *name;
        size_t size;
    } sizes[] = {
        NBIO_SIZE(nb_st_tensor),          NBIO_SIZE(nb_ckpt_layer),         NBIO_SIZE(nb_ckpt_config),
        NBIO_SIZE(nb_ckpt_quantize_opts), NBIO_SIZE(nb_ckpt_quantize_summary), NBIO_SIZE(nb_ckpt_convert_opts),
        NBIO_SIZE(nb_ckpt_convert_summary), NBIO_SIZE(nb_gguf_kv),        NBIO_SIZE(nb_gguf_tensor),
        NBIO_SIZE(nb_gguf_header),        NBIO_SIZE(nb_gguf_fp4),           NBIO_SIZE(nb_ckpt_moe),
    };
#undef NBIO_SIZE
    for (size_t i = 0; i < sizeof sizes / sizeof sizes[0]; i++)
        if (!strcmp(sizes[i].name, name)) {
            *bytes = sizes[i].size;
            return NB_OK;
        }
    return nbi_fail(NULL, NB_ERR_NOT_FOUND, "nb_io_struct_size: nibble_io.h has no struct \"%.64s\"", name);
}
