/* safetensors.h - hardened reader and writer for safetensors files and
 * sharded checkpoints (model.safetensors.index.json).  Internal API of the
 * static library nibble_io; the core library (libnibble) does not depend on
 * it, and it needs nothing from libnibble but the nb_status enum of nibble.h.
 *
 * FORMAT (docs/formats.md section 6): u64 N (little-endian), N bytes of UTF-8
 * JSON, then the data buffer.  Every rule of the reference reader is enforced
 * (see safetensors.c for the list and the status each violation returns):
 *   NB_ERR_CORRUPT    malformed content (bad header, offsets, dtype, ...);
 *   NB_ERR_OVERFLOW   shape x bits or offset arithmetic overflows 64 bits;
 *   NB_ERR_IO         the file cannot be opened, read, mapped or written;
 *   NB_ERR_NOT_FOUND  a tensor or metadata key that is not there (also a
 *                     tensor the index names but its shard lacks);
 *   NB_ERR_NULL_POINTER / NB_ERR_INVALID_ARGUMENT  caller mistakes;
 *   NB_ERR_OUT_OF_MEMORY.
 * Stricter than the reference where the reference is lax: a tensor entry may
 * hold only "dtype", "shape" and "data_offsets"; integers must be written as
 * plain digits (no sign, fraction, exponent or leading zero) and be at most
 * 2^48-1; strings may not contain raw control characters or \u0000; JSON
 * nesting is limited to NB_ST_MAX_DEPTH and names to NB_ST_MAX_NAME bytes.
 *
 * ERRORS: every function returns nb_status.  Functions that can fail take
 * (err, errlen): on failure a NUL-terminated message naming the file, the
 * tensor (when there is one) and the rule broken is written there (err may be
 * NULL; messages are truncated to errlen).  Nothing aborts on bad input.
 *
 * MEMORY: nb_st_open maps the file read-only (MAP_PRIVATE) and copies only
 * the header; tensor data pointers point into the mapping and stay valid until
 * nb_st_close.  They are not aligned unless the writer aligned them (this
 * module's writer does: see nb_st_write).  A file truncated by another
 * process while mapped raises SIGBUS on access, as with any mmap reader: copy
 * the data if the file may change underneath (outside the reference's threat
 * model too).
 */
#ifndef NB_IO_SAFETENSORS_H
#define NB_IO_SAFETENSORS_H

#include "nibble.h"

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#define NB_ST_MAX_RANK 8                       /* dimensions per tensor */
#define NB_ST_MAX_HEADER 100000000ull          /* N cap, as the reference */
#define NB_ST_MAX_DIM ((1ull << 48) - 1)       /* schema maximum of any integer */
#define NB_ST_MAX_NAME 4096                    /* bytes of a tensor name or metadata key */
#define NB_ST_MAX_DEPTH 8                      /* JSON nesting (a valid header needs 3) */

/* The safetensors dtypes.  Explicit values, append only. */
typedef enum nb_st_dtype {
    NB_ST_BOOL = 1,
    NB_ST_U8 = 2,
    NB_ST_I8 = 3,
    NB_ST_F8_E5M2 = 4,
    NB_ST_F8_E4M3 = 5,
    NB_ST_F8_E8M0 = 6,
    NB_ST_F8_E4M3FNUZ = 7,
    NB_ST_F8_E5M2FNUZ = 8,
    NB_ST_I16 = 9,
    NB_ST_U16 = 10,
    NB_ST_F16 = 11,
    NB_ST_BF16 = 12,
    NB_ST_I32 = 13,
    NB_ST_U32 = 14,
    NB_ST_F32 = 15,
    NB_ST_C64 = 16,
    NB_ST_F64 = 17,
    NB_ST_I64 = 18,
    NB_ST_U64 = 19,
    NB_ST_F4 = 20,      /* shape counts 4-bit elements: bytes = count / 2 */
    NB_ST_F6_E2M3 = 21, /* 6 bits per element */
    NB_ST_F6_E3M2 = 22
} nb_st_dtype;

/* One tensor.  Filled by the reader (pointers into the file's mapping and
 * header, valid until close); given to the writer (data: bytes bytes of host
 * memory, may be NULL when bytes is 0). */
typedef struct nb_st_tensor {
    const char *name;
    nb_st_dtype dtype;
    int rank;                         /* 0 (scalar) .. NB_ST_MAX_RANK */
    int64_t shape[NB_ST_MAX_RANK];    /* entries past rank are 0 */
    const void *data;
    size_t bytes;                     /* = product(shape) * bits / 8 */
    uint64_t offset;                  /* reader: begin offset in the data buffer */
} nb_st_tensor;

typedef struct nb_st_file nb_st_file;
typedef struct nb_st_index nb_st_index;

/* dtype <-> string ("BF16") and bits per element (4, 6, 8, 16, 32 or 64).
 * NB_ERR_NOT_FOUND for an unknown string, NB_ERR_INVALID_ARGUMENT for an
 * unknown enum value; name and bits may be NULL. */
nb_status nb_st_dtype_parse(const char *s, nb_st_dtype *out);
nb_status nb_st_dtype_info(nb_st_dtype t, const char **name, int *bits);

/* Open and validate a file.  On success *out owns the mapping. */
nb_status nb_st_open(const char *path, nb_st_file **out, char *err, size_t errlen);
/* Validate a file image already in memory (no copy: `data` must outlive the
 * handle).  `label` names it in messages (NULL: "<memory>").  Used by the
 * fuzzer, where AddressSanitizer then sees any read past `size` exactly. */
nb_status nb_st_open_memory(const void *data, size_t size, const char *label, nb_st_file **out, char *err,
                            size_t errlen);
/* Release a handle (NULL is accepted). */
nb_status nb_st_close(nb_st_file *f);

/* Number of tensors. */
nb_status nb_st_count(const nb_st_file *f, size_t *count);
/* Tensor i, in order of name (bytewise); NB_ERR_NOT_FOUND past the end. */
nb_status nb_st_tensor_at(const nb_st_file *f, size_t i, nb_st_tensor *out, char *err, size_t errlen);
/* Tensor by name: NB_ERR_NOT_FOUND when absent. */
nb_status nb_st_tensor_find(const nb_st_file *f, const char *name, nb_st_tensor *out, char *err, size_t errlen);
/* __metadata__ entries: count, entry i (key order bytewise), lookup by key
 * (NB_ERR_NOT_FOUND when absent).  Strings live until close. */
nb_status nb_st_metadata_count(const nb_st_file *f, size_t *count);
nb_status nb_st_metadata_at(const nb_st_file *f, size_t i, const char **key, const char **value, char *err,
                            size_t errlen);
nb_status nb_st_metadata_get(const nb_st_file *f, const char *key, const char **value, char *err,
                             size_t errlen);

/* Write `count` tensors and metadata pairs (meta[2*i] = key, meta[2*i+1] =
 * value; npairs may be 0 with meta NULL) to `path`.
 *   - "__metadata__" comes first and always holds "format": "pt" unless the
 *     caller passes its own "format" pair, which replaces it;
 *   - tensors are laid out like the reference writer: by descending bits per
 *     element (the reference's descending dtype order, which is by size),
 *     then by name bytewise; the data follows in the same order;
 *   - the header is padded with spaces to a multiple of 8, so the data buffer
 *     starts 8-aligned and every tensor is naturally aligned within it;
 *   - the file is written to "<path>.tmp.XXXXXX" in the same directory,
 *     fsync'ed, then renamed over `path` (mode 0644), so a reader never sees
 *     a partial file.
 * Rejected (NB_ERR_INVALID_ARGUMENT): duplicate or over-long names, the name
 * "__metadata__", names or metadata that are not valid UTF-8, unknown dtypes,
 * rank > NB_ST_MAX_RANK, negative or > 2^48-1 dimensions, bytes that do not
 * match the shape, non-byte-sized tensors (odd F4), NULL data with bytes > 0,
 * duplicate metadata keys; NB_ERR_OVERFLOW for overflowing sizes. */
nb_status nb_st_write(const char *path, const nb_st_tensor *tensors, size_t count, const char *const *meta,
                      size_t npairs, char *err, size_t errlen);

/* Sharded checkpoint: `path` is a directory holding
 * model.safetensors.index.json, or the index file itself.  Validates the
 * index ({"metadata": {...} (optional, any content), "weight_map":
 * {tensor: shard}}), that every shard name is a plain basename (not empty, no
 * '/', '\\' or "..", hence never absolute), opens every shard (nb_st_open
 * rules), and checks that each listed tensor is in the shard named for it
 * (NB_ERR_NOT_FOUND otherwise), that no name is listed twice, and that no
 * shard holds a tensor that the map does not assign to it (a tensor in two
 * shards, or unlisted: NB_ERR_CORRUPT). */
nb_status nb_st_open_index(const char *path, nb_st_index **out, char *err, size_t errlen);
nb_status nb_st_index_close(nb_st_index *x);
/* The index rules that need no shard (text, JSON, weight_map, shard names,
 * no name twice) on `len` bytes in memory; the counts of tensors and
 * distinct shards (either may be NULL).  For the fuzzer and tests. */
nb_status nb_st_index_check_memory(const char *text, size_t len, const char *label, size_t *ntensors,
                                   size_t *nshards, char *err, size_t errlen);
/* Tensors of the whole checkpoint, in order of name. */
nb_status nb_st_index_count(const nb_st_index *x, size_t *count);
nb_status nb_st_index_tensor_at(const nb_st_index *x, size_t i, nb_st_tensor *out, char *err, size_t errlen);
nb_status nb_st_index_tensor_find(const nb_st_index *x, const char *name, nb_st_tensor *out, char *err,
                                  size_t errlen);
/* Shards, in order of name; *file is owned by the index. */
nb_status nb_st_index_shard_count(const nb_st_index *x, size_t *count);
nb_status nb_st_index_shard_at(const nb_st_index *x, size_t i, const char **name, const nb_st_file **file,
                               char *err, size_t errlen);

#ifdef __cplusplus
}
#endif
#endif
