/* gguf.h - hardened reader for GGUF files (llama.cpp / ggml), and import of
 * its 4-bit float tensors (MXFP4, type 39; NVFP4, type 40) into nibble's
 * checkpoint layout.  Internal API of nibble_io, like safetensors.h.
 *
 * FORMAT (little-endian): "GGUF", u32 version (2 or 3), u64 n_tensors, u64
 * n_kv; n_kv key/value pairs (string key, u32 value type, value); n_tensors
 * tensor infos (string name, u32 n_dims, u64 ne[n_dims], u32 ggml type, u64
 * offset); padding to the alignment (general.alignment, default 32); the
 * data section.  A string is u64 length + bytes (no NUL).  ne[0] is the
 * contiguous dimension: a [N, K] weight has ne = {K, N}; `shape` below is
 * the row-major order (shape[0] = ne[n_dims-1]).
 *
 * RULES (each failure: a status and a message naming the file, the key or
 * tensor, and the rule):
 *   NB_ERR_CORRUPT      shorter than the header; bad magic; a count, string,
 *                       array or tensor info running past the end of the
 *                       file; a key that is empty, longer than
 *                       NB_GGUF_MAX_KEY, not UTF-8 or given twice; a value
 *                       type outside 0..12; an array of arrays; a string
 *                       value that is not UTF-8; general.alignment not a
 *                       UINT32 power of two; a tensor name that is empty,
 *                       longer than NB_GGUF_MAX_NAME or given twice; n_dims
 *                       outside 1..4; a negative dimension; an unknown or
 *                       retired ggml type; ne[0] not a multiple of the
 *                       type's block; an offset that is not a multiple of the
 *                       alignment; data past the end of the file; tensors
 *                       that overlap or leave a gap larger than the padding
 *                       (in offset order each starts at the aligned end of
 *                       the previous one, the first at 0); bytes after the
 *                       last tensor beyond its padding;
 *   NB_ERR_OVERFLOW     element or byte counts that overflow 64 bits;
 *   NB_ERR_UNSUPPORTED  version 1, a version above 3, a big-endian file;
 *   NB_ERR_IO, NB_ERR_NULL_POINTER, NB_ERR_OUT_OF_MEMORY.
 * Tensor data is not validated (like ggml, which checks E8M0 0xFF only in
 * an optional pass); the import below says what it does with every byte.
 *
 * MEMORY: nb_gguf_open maps the file read-only; data pointers point into the
 * mapping until nb_gguf_close (same caveats as safetensors.h).  Keys, names
 * and scalar string values are copied (NUL-terminated).
 */
#ifndef NB_IO_GGUF_H
#define NB_IO_GGUF_H

#include "nibble.h"

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#define NB_GGUF_MAX_DIMS 4
#define NB_GGUF_MAX_NAME 63     /* bytes of a tensor name (ggml's GGML_MAX_NAME - 1) */
#define NB_GGUF_MAX_KEY 65535   /* bytes of a key */
#define NB_GGUF_DEFAULT_ALIGNMENT 32

/* GGUF value types (gguf.h). */
typedef enum nb_gguf_vtype {
    NB_GGUF_UINT8 = 0, NB_GGUF_INT8 = 1, NB_GGUF_UINT16 = 2, NB_GGUF_INT16 = 3, NB_GGUF_UINT32 = 4,
    NB_GGUF_INT32 = 5, NB_GGUF_FLOAT32 = 6, NB_GGUF_BOOL = 7, NB_GGUF_STRING = 8, NB_GGUF_ARRAY = 9,
    NB_GGUF_UINT64 = 10, NB_GGUF_INT64 = 11, NB_GGUF_FLOAT64 = 12
} nb_gguf_vtype;

/* The ggml types this module imports. */
#define NB_GGML_TYPE_F32 0
#define NB_GGML_TYPE_F16 1
#define NB_GGML_TYPE_BF16 30
#define NB_GGML_TYPE_MXFP4 39
#define NB_GGML_TYPE_NVFP4 40

typedef struct nb_gguf_kv {
    const char *key;
    nb_gguf_vtype type;
    nb_gguf_vtype elem_type;  /* arrays: the element type */
    uint64_t count;           /* arrays: elements; 1 otherwise */
    const char *str;          /* STRING: the value, NUL-terminated copy; NULL otherwise */
    const uint8_t *data;      /* the raw little-endian value (arrays: the first element) */
    uint64_t bytes;           /* bytes of the raw value */
} nb_gguf_kv;

typedef struct nb_gguf_tensor {
    const char *name;
    uint32_t type;                   /* ggml type */
    int n_dims;
    int64_t ne[NB_GGUF_MAX_DIMS];    /* ggml order; 1 past n_dims */
    int64_t shape[NB_GGUF_MAX_DIMS]; /* row-major order; 0 past n_dims */
    uint64_t offset;                 /* in the data section */
    const void *data;
    uint64_t bytes;
} nb_gguf_tensor;

typedef struct nb_gguf_file nb_gguf_file;

typedef struct nb_gguf_header {
    uint32_t version, alignment;
    uint64_t data_offset; /* file offset of the data section (may be past the end without tensors) */
    size_t n_kv, n_tensors;
} nb_gguf_header;

/* ggml type name ("MXFP4"; NULL for an unknown or retired type) and block
 * size / bytes per block (NB_ERR_NOT_FOUND for an unknown or retired type). */
const char *nb_ggml_type_name(uint32_t type);
nb_status nb_ggml_type_size(uint32_t type, int64_t *block, int64_t *bytes);
const char *nb_gguf_vtype_name(nb_gguf_vtype t);

nb_status nb_gguf_open(const char *path, nb_gguf_file **out, char *err, size_t errlen);
/* Validate an image in memory (no copy: data must outlive the handle). */
nb_status nb_gguf_open_memory(const void *data, size_t size, const char *label, nb_gguf_file **out, char *err,
                              size_t errlen);
nb_status nb_gguf_close(nb_gguf_file *g); /* NULL accepted */

nb_status nb_gguf_get_header(const nb_gguf_file *g, nb_gguf_header *out);
/* Key/value pairs in file order; find by key (NB_ERR_NOT_FOUND). */
nb_status nb_gguf_kv_at(const nb_gguf_file *g, size_t i, nb_gguf_kv *out);
nb_status nb_gguf_kv_find(const nb_gguf_file *g, const char *key, nb_gguf_kv *out);
/* Tensors in file (info) order; find by name (NB_ERR_NOT_FOUND). */
nb_status nb_gguf_tensor_at(const nb_gguf_file *g, size_t i, nb_gguf_tensor *out);
nb_status nb_gguf_tensor_find(const nb_gguf_file *g, const char *name, size_t *index);

/* ---------------------------------------------------------------- import
 * A type-39 or type-40 tensor with n_dims 2 (ne = {K, N}: one weight) or 3
 * (ne = {K, N, E}: E experts) becomes nibble's checkpoint layout (codes
 * [N, K/2], low nibble = element 2j; scales [N, K/group]):
 *   MXFP4  block {u8 e; u8 qs[16]} per 32 elements: qs[j] holds element j
 *          (low nibble) and j+16 (high); e is E8M0 and is copied as is (0xFF
 *          stays NaN, which llama.cpp's validation rejects).  tensor_scale 1.
 *   NVFP4  block {u8 d[4]; u8 qs[32]} per 64 elements: qs[8s+j] holds element
 *          16s+j (low) and 16s+j+8 (high); d[s] is ggml's unsigned E4M3,
 *          whose value nibble's E4M3 byte keeps: bit 7 (ignored by ggml) is
 *          cleared and 0x7F (ggml: zero) becomes 0x00; both are counted in
 *          *remapped.  0xFF (ggml: 480, not an E4M3 value) is
 *          NB_ERR_UNSUPPORTED.  tensor_scale: the F32 tensor named like the
 *          weight with ".weight" replaced by ".scale" (llama.cpp's
 *          converter), one value or one per expert; 1 when there is none.
 * Other types: NB_ERR_UNSUPPORTED. */
typedef struct nb_gguf_fp4 {
    nb_format format;
    int64_t n, k, experts;  /* experts 0 for a 2-D tensor */
    int64_t scale_tensor;   /* index of the ".scale" tensor, -1 when none (tensor scale 1) */
    size_t codes_bytes, scales_bytes; /* per expert */
} nb_gguf_fp4;

nb_status nb_gguf_fp4_info(const nb_gguf_file *g, size_t i, nb_gguf_fp4 *out, char *err, size_t errlen);
/* Expert `expert` (0 for a 2-D tensor) of tensor i into codes / scales
 * (capacities in bytes; NB_ERR_BUFFER_TOO_SMALL when short); desc is ready
 * for nb_dequantize_host.  remapped may be NULL. */
nb_status nb_gguf_fp4_to_checkpoint(const nb_gguf_file *g, size_t i, int64_t expert, nb_weight_desc *desc,
                                    uint8_t *codes, size_t codes_cap, uint8_t *scales, size_t scales_cap,
                                    size_t *remapped, char *err, size_t errlen);

#ifdef __cplusplus
}
#endif
#endif
