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

/* Offset of the first byte that breaks strict UTF-8, or n when all is valid. */
size_t nbio_utf8_bad(const unsigned char *s, size_t n) __attribute__((visibility("hidden")));
/* Map a regular file read-only (MAP_PRIVATE); files shorter than min_size
 * (or empty) are not mapped (*map NULL, *size set).  munmap(*map, *size). */
nb_status nbio_map_file(const char *path, size_t min_size, void **map, size_t *size, char *err, size_t errlen)
    __attribute__((visibility("hidden")));

/* a + "/" + b, malloc'ed (NULL when out of memory). */
char *nbio_join(const char *a, const char *b) __attribute__((visibility("hidden")));
int nbio_ends_with(const char *s, const char *suffix) __attribute__((visibility("hidden")));
/* Resolve a checkpoint path (a .safetensors file, a directory holding
 * model.safetensors.index.json or model.safetensors, or an index file) to its
 * directory and the file to open; both malloc'ed.  Sets *sharded for an
 * index. */
nb_status nbio_resolve_checkpoint(const char *path, char **dir, char **file, int *sharded, char *err, size_t errlen)
    __attribute__((visibility("hidden")));

/* ------------------------------------------------------------------ ckpt_out.c
 * Writing a checkpoint directory, shared by nb_ckpt_quantize and
 * nb_ckpt_convert.  Files are registered as they are created so that a
 * failure removes every one of them (and OUT when this module created it).
 * Shards are streamed: their header is computed from the tensor list alone
 * (layout of nb_st_write: descending bits per element, then name; header
 * space-padded to a multiple of 8), written to a temporary file, then the
 * caller pwrites each tensor at its offset and commits (fsync + rename). */
#include "safetensors.h"

#include <stdint.h>

typedef struct cJSON cJSON;

typedef struct nbio_out {
    const char *dir;
    int created_dir;
    char **created;             /* files written so far */
    size_t ncreated;
    char **wm_name, **wm_shard; /* weight map of every committed shard */
    size_t nwm;
    uint64_t data_bytes;        /* tensor bytes written (the index's total_size) */
    uint64_t file_bytes;        /* bytes of the safetensors files written */
    size_t shards, files_copied;
    char *err;
    size_t errlen;
} nbio_out;

/* One output tensor.  The caller fills name (malloc'ed; freed by
 * nbio_oents_free), dtype, rank, shape, bytes and its own src/role/expert;
 * nbio_shard_begin sorts the array into file order and sets bits and off. */
typedef struct nbio_oent {
    char *name;
    nb_st_dtype dtype;
    int rank;
    int64_t shape[NB_ST_MAX_RANK];
    uint64_t bytes, off;
    int bits;
    size_t src;     /* caller's: input tensor index */
    int role;       /* caller's */
    int64_t expert; /* caller's */
} nbio_oent;

typedef struct nbio_shard {
    nbio_out *o;
    const char *name;
    char *tmp, *final;
    int fd;
    uint64_t base, data_bytes;
} nbio_shard;

#define NBIO_HIDDEN __attribute__((visibility("hidden")))

/* OUT must not exist (it is created 0755) or be an empty directory. */
nb_status nbio_out_open(nbio_out *o, const char *dir, char *err, size_t errlen) NBIO_HIDDEN;
/* ok == 0: remove every file created (and OUT if created).  Frees all. */
void nbio_out_close(nbio_out *o, int ok) NBIO_HIDDEN;
/* OUT/name from a cJSON tree (printed, newline-terminated). */
nb_status nbio_out_write_json(nbio_out *o, const char *name, const cJSON *j) NBIO_HIDDEN;
/* Copy every regular file of src_dir except *.safetensors,
 * *.safetensors.index.json and the names in skip[0..nskip). */
nb_status nbio_out_copy_others(nbio_out *o, const char *src_dir, const char *const *skip, size_t nskip) NBIO_HIDDEN;
/* OUT/name: {"metadata": {"total_size": ...}, "weight_map": {...}} sorted by name. */
nb_status nbio_out_write_index(nbio_out *o, const char *name) NBIO_HIDDEN;

/* Lay out ents (sorted in place), write the header with meta_src's
 * __metadata__ (plus "format": "pt" when absent; meta_src may be NULL) to a
 * temporary file OUT/.<name>.tmp.XXXXXX sized for the data. */
nb_status nbio_shard_begin(nbio_out *o, nbio_shard *s, const char *name, const nb_st_file *meta_src, nbio_oent *ents,
                           size_t ne) NBIO_HIDDEN;
/* n bytes of p at byte `at` of tensor e. */
nb_status nbio_shard_write(nbio_shard *s, const nbio_oent *e, const void *p, size_t n, uint64_t at) NBIO_HIDDEN;
/* All of e's bytes from a read-only file mapping, in chunks, dropping the
 * source pages after each (they are re-read from the file if touched again). */
nb_status nbio_shard_copy(nbio_shard *s, const nbio_oent *e, const void *src) NBIO_HIDDEN;
/* fsync, rename to OUT/<name>, add ents to the weight map.  On failure the
 * temporary file stays registered for removal. */
nb_status nbio_shard_commit(nbio_shard *s, const nbio_oent *ents, size_t ne) NBIO_HIDDEN;
/* Close a shard that was not committed (safe after commit or on a zeroed one). */
void nbio_shard_end(nbio_shard *s) NBIO_HIDDEN;
void nbio_oents_free(nbio_oent *ents, size_t ne) NBIO_HIDDEN;
/* Drop the pages of [p, p+n) of a read-only MAP_PRIVATE file mapping. */
void nbio_drop_pages(const void *p, size_t n) NBIO_HIDDEN;

/* dir/name as a JSON object (NULL with NB_OK when the file does not exist);
 * at most max bytes, else NB_ERR_CORRUPT; malformed JSON: NB_ERR_CORRUPT
 * naming the file and the byte. */
nb_status nbio_read_json(const char *dir, const char *name, size_t max, cJSON **out, char *err, size_t errlen) NBIO_HIDDEN;
/* n bytes of text (not NUL-terminated) as a JSON object; label names it. */
nb_status nbio_parse_json(const char *label, const char *text, size_t n, cJSON **out, char *err, size_t errlen) NBIO_HIDDEN;
/* Quantization configs (docs/formats.md 2.3, 2.4, 3.3, 3.5) naming nibble as
 * the producer; excl[0..n) is the list of unquantized modules.  NULL only
 * when out of memory (cJSON_Add* then ignore it, and the writer reports it). */
cJSON *nbio_hf_quant_config(const char *const *excl, size_t n, const char *kv_cache_algo) NBIO_HIDDEN;
cJSON *nbio_qc_modelopt(const char *const *excl, size_t n) NBIO_HIDDEN;
cJSON *nbio_qc_quark(const char *mode, const char *const *excl, size_t n) NBIO_HIDDEN;
/* compressed-tensors: nvfp4 (else mxfp4); input_acts 0: weight-only
 * (input_activations null), else the preset's dynamic activation scheme. */
cJSON *nbio_qc_ct(int nvfp4, int input_acts, const char *const *ignore, size_t n) NBIO_HIDDEN;

/* Append s (malloc'ed; freed on failure) to a growable array: 1 on success. */
int nbio_push_str(char ***arr, size_t *n, char *s) NBIO_HIDDEN;
void nbio_free_strs(char **a, size_t n) NBIO_HIDDEN;
/* malloc'ed a + b (NULL when out of memory). */
char *nbio_concat(const char *a, const char *b) NBIO_HIDDEN;

#endif
