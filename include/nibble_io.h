/*
 * nibble_io.h - checkpoint I/O for nibble: safetensors files and sharded
 * checkpoints, per-layer detection of 4-bit checkpoint layouts, quantizing a
 * BF16/F16/F32 checkpoint, converting between 4-bit layouts, and GGUF import.
 * This header is the whole public checkpoint API and its documentation; the
 * weights it hands out are used with nibble.h (nb_dequantize_host, nb_pack).
 *
 * OVERVIEW
 *   A Hugging Face style checkpoint is one .safetensors file or a directory
 *   of shards listed by model.safetensors.index.json, with config.json and,
 *   for ModelOpt, hf_quant_config.json next to it.  Five 4-bit layouts exist
 *   in the wild (nb_ckpt_format): ModelOpt NVFP4, compressed-tensors nvfp4
 *   and mxfp4, Quark MXFP4 and gpt-oss MXFP4 experts; each stores the codes
 *   and block scales of nibble's checkpoint layout (nibble.h) under its own
 *   tensor names, dtypes and shapes.  The integer and bitsandbytes layouts
 *   (AWQ, GPTQ, compressed-tensors pack-quantized, bitsandbytes, HQQ) are
 *   converted into it when read (nb_ckpt_layer_weight_v2).
 *     nb_st_*     the safetensors container: a hardened reader (every rule of
 *                 the reference parser, and stricter), the sharded index,
 *                 an atomic writer;
 *     nb_ckpt_*   a checkpoint: its files, tensors, configs, and every linear
 *                 layer classified by tensor names, dtypes and shapes, with
 *                 zero-copy access to each layer's codes and scales as an
 *                 nb_weight_desc (nb_ckpt_layer_weight);
 *     nb_ckpt_moe_*  mixture-of-experts layers as expert groups: gpt-oss's
 *                 expert-major tensors and per-expert layers, each group an
 *                 nb_moe_desc with its experts' weights (zero copy where
 *                 the layout allows);
 *     nb_ckpt_quantize  BF16/F16/F32 checkpoint -> ModelOpt NVFP4, Quark
 *                 MXFP4, compressed-tensors pack-quantized int4 /
 *                 int4_sym / int8, bitsandbytes nf4 / bnb_fp4 or HQQ
 *                 int4_hqq checkpoint (what `nibble quantize` runs);
 *     nb_ckpt_convert   4-bit checkpoint (or GGUF file) -> another 4-bit
 *                 layout, codes and block scales byte for byte (`nibble
 *                 convert`);
 *     nb_gguf_*   a hardened GGUF reader and the import of its MXFP4 / NVFP4
 *                 tensors into nibble's checkpoint layout.
 *   The checkpoint API is built into libnibble when cJSON was found at build
 *   time (the same condition as nb_context_load_tuning); a libnibble built
 *   without it lacks these symbols.
 *
 * CONVENTIONS (those of nibble.h, plus)
 *   - Every function returns nb_status.  On failure the detailed message
 *     (naming the file, the tensor or key, and the rule broken) is in the
 *     thread-local buffer nb_last_error(); there is no context here.  Nothing
 *     aborts on bad input, and no input is read past its end.
 *   - Every pointer here is host memory.  Handles (nb_st_file, nb_st_index,
 *     nb_ckpt, nb_gguf_file) own a read-only MAP_PRIVATE mapping of their
 *     files; tensor data and the strings they return point into the handle
 *     and stay valid until it is closed.  A handle is not modified after it
 *     is opened, so several threads may read one; close it once, after them.
 *     A file truncated by another process while mapped raises SIGBUS on
 *     access, as with any mmap reader: copy the data if that can happen.
 *   - Sizes are bytes (size_t, uint64_t) unless named elements; shapes are
 *     int64_t, row-major (shape[0] is the slowest dimension).
 *   - Enums have explicit values and are append-only.  Public structs end in
 *     `reserved` fields: an output struct comes back with them zero; an input
 *     struct (options, tensors given to the writer) must have them zero (the
 *     _init functions do it), else NB_ERR_INVALID_ARGUMENT.  A struct grows
 *     only through new _v2 functions.  nb_io_struct_size() gives each
 *     struct's size to bindings without a C compiler.
 *   - Name functions (nb_ckpt_format_name, ...) return static strings.
 *
 * EXAMPLE (complete; tests/test_io_example.c compiles and runs exactly this)
 *
 *   #include <nibble.h>
 *   #include <nibble_io.h>
 *   #include <stdio.h>
 *
 *   int main(void) {
 *       enum { N = 32, K = 64 };
 *       static float w[N * K], back[N * K];
 *       static unsigned char codes[N * K / 2], scales[N * K / 16];
 *       for (int i = 0; i < N * K; i++) w[i] = (float)((i * 37 % 101) - 50) / 50.0f;
 *
 *       // quantize one layer to NVFP4 and write it in the ModelOpt layout
 *       nb_context *ctx = NULL;
 *       nb_weight_desc desc;
 *       nb_status st = nb_context_create(NB_DEVICE_NONE, &ctx);
 *       if (st == NB_OK) st = nb_weight_desc_init(&desc, NB_FORMAT_NVFP4, N, K);
 *       if (st == NB_OK) st = nb_quantize_host(ctx, &desc, NB_DTYPE_F32, w, codes, scales);
 *       nb_st_tensor t[3] = {
 *           {.name = "proj.weight", .dtype = NB_ST_U8, .rank = 2, .shape = {N, K / 2},
 *            .data = codes, .bytes = sizeof codes},
 *           {.name = "proj.weight_scale", .dtype = NB_ST_F8_E4M3, .rank = 2, .shape = {N, K / 16},
 *            .data = scales, .bytes = sizeof scales},
 *           {.name = "proj.weight_scale_2", .dtype = NB_ST_F32, .rank = 0,
 *            .data = &desc.tensor_scale, .bytes = 4},
 *       };
 *       if (st == NB_OK) st = nb_st_write("example.safetensors", t, 3, NULL, 0);
 *
 *       // open it as a checkpoint: the layer is detected and read back
 *       nb_ckpt *ck = NULL;
 *       nb_ckpt_layer layer;
 *       const char *format = "";
 *       nb_weight_desc d;
 *       const uint8_t *c = NULL, *s = NULL;
 *       if (st == NB_OK) st = nb_ckpt_open("example.safetensors", &ck);
 *       if (st == NB_OK) st = nb_ckpt_layer_at(ck, 0, &layer);
 *       if (st == NB_OK) st = nb_ckpt_format_name(layer.format, &format);
 *       if (st == NB_OK) st = nb_ckpt_layer_weight(ck, 0, 0, &d, &c, &s);
 *       if (st == NB_OK) st = nb_dequantize_host(ctx, &d, c, s, NB_DTYPE_F32, back);
 *       if (st != NB_OK) printf("error: %s: %s\n", nb_status_name(st), nb_last_error());
 *       else printf("%s: %s, %lld x %lld, w[0] %g -> %g\n", layer.prefix, format,
 *                   (long long)layer.n, (long long)layer.k, w[0], back[0]);
 *
 *       nb_ckpt_close(ck);
 *       nb_context_destroy(ctx);
 *       remove("example.safetensors");
 *       return st == NB_OK ? 0 : 1;
 *   }
 *
 * ERRORS (by section below; each message names the file and what broke)
 *   NB_ERR_CORRUPT     malformed content (headers, JSON, offsets, configs);
 *   NB_ERR_OVERFLOW    size arithmetic of a file overflows 64 bits;
 *   NB_ERR_IO          a file cannot be opened, read, mapped or written;
 *   NB_ERR_NOT_FOUND   a tensor, key, index or name that is not there;
 *   NB_ERR_UNSUPPORTED a layout, version, type or format this module does
 *                      not read or write (never run as another one);
 *   NB_ERR_NULL_POINTER / NB_ERR_INVALID_ARGUMENT  caller mistakes;
 *   NB_ERR_OUT_OF_MEMORY.
 */
#ifndef NIBBLE_IO_H
#define NIBBLE_IO_H

#include "nibble.h"

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* The size of the public struct named `name` ("nb_st_tensor",
 * "nb_ckpt_layer", ... every struct of this header): bindings that mirror a
 * struct compare it with their own.  NB_ERR_NOT_FOUND for another name. */
NB_API nb_status nb_io_struct_size(const char *name, size_t *bytes);

/* ============================================================= safetensors
 *
 * FORMAT (docs/formats.md section 6): u64 N (little-endian), N bytes of UTF-8
 * JSON, then the data buffer.  The reader checks, in order (status in
 * brackets; the message quotes the rule, e.g. "HeaderTooLarge"):
 *   1. size >= 8                                        [CORRUPT]
 *   2. N <= NB_ST_MAX_HEADER                            [CORRUPT]
 *   3. 8 + N <= size                                    [CORRUPT]
 *   4. the header is strict UTF-8                       [CORRUPT]
 *   5. JSON nesting <= NB_ST_MAX_DEPTH; no raw control characters or \u0000
 *      in strings; integers written as plain digits (no sign, fraction,
 *      exponent or leading zero) of at most 2^48-1        [CORRUPT]
 *   6. one JSON object followed only by whitespace      [CORRUPT]
 *   7. "__metadata__" (once) maps strings to strings; every other entry
 *      holds exactly dtype (a known string), shape (at most NB_ST_MAX_RANK
 *      integers) and data_offsets [begin, end]; names are at most
 *      NB_ST_MAX_NAME bytes                              [CORRUPT]
 *      product(shape) x bits fits 64 bits               [OVERFLOW]
 *      whole bytes, and end - begin == bytes            [CORRUPT]
 *   8. no tensor or metadata name twice                 [CORRUPT]
 *   9. sorted by offset, tensors are contiguous from 0 (gaps and overlaps
 *      named as such)                                   [CORRUPT]
 *  10. the last tensor ends exactly at the end of the file [CORRUPT]
 * Tensor data pointers are aligned only if the writer aligned them (this
 * module's writer aligns every tensor naturally). */

#define NB_ST_MAX_RANK 8                /* dimensions per tensor */
#define NB_ST_MAX_HEADER 100000000ull   /* bytes of the JSON header, as the reference reader */
#define NB_ST_MAX_DIM ((1ull << 48) - 1) /* largest integer (dimension, offset) in a header */
#define NB_ST_MAX_NAME 4096             /* bytes of a tensor name or metadata key */
#define NB_ST_MAX_DEPTH 8               /* JSON nesting (a valid header needs 3) */

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
    NB_ST_F4 = 20,      /* the shape counts 4-bit elements: bytes = count / 2 */
    NB_ST_F6_E2M3 = 21, /* 6 bits per element */
    NB_ST_F6_E3M2 = 22
} nb_st_dtype;

/* One tensor.  Filled by the reader (name and data point into the handle);
 * given to the writer (data: `bytes` bytes of host memory, NULL only when
 * bytes is 0; reserved zero). */
typedef struct nb_st_tensor {
    const char *name;
    nb_st_dtype dtype;
    int rank;                      /* 0 (a scalar) .. NB_ST_MAX_RANK */
    int64_t shape[NB_ST_MAX_RANK]; /* elements per dimension; entries past rank are 0 */
    const void *data;
    size_t bytes;                  /* product(shape) x bits / 8 */
    uint64_t offset;               /* reader: begin offset in the data buffer */
    int32_t reserved[4];
} nb_st_tensor;

typedef struct nb_st_file nb_st_file;
typedef struct nb_st_index nb_st_index;

/* "BF16" -> NB_ST_BF16 (NB_ERR_NOT_FOUND for an unknown string); and the
 * string and bits per element (4, 6, 8, 16, 32 or 64) of a dtype
 * (NB_ERR_INVALID_ARGUMENT for an unknown value; name and bits may be NULL). */
NB_API nb_status nb_st_dtype_parse(const char *s, nb_st_dtype *out);
NB_API nb_status nb_st_dtype_info(nb_st_dtype t, const char **name, int *bits);

/* Map and validate a file; on success *out owns the mapping (*out is NULL
 * on failure).  NB_ERR_IO: missing, unreadable, or not a regular file (a
 * FIFO, socket, device or directory is refused by name without being read
 * or waited on; this holds for every file this header opens). */
NB_API nb_status nb_st_open(const char *path, nb_st_file **out);
/* Validate a file image in memory without copying it: `data` must outlive
 * the handle.  `label` names it in messages (NULL: "<memory>"). */
NB_API nb_status nb_st_open_memory(const void *data, size_t size, const char *label, nb_st_file **out);
/* Release a handle (NULL is accepted). */
NB_API nb_status nb_st_close(nb_st_file *f);

/* Tensors, in order of name (bytewise); _at: NB_ERR_NOT_FOUND past the end;
 * _find: NB_ERR_NOT_FOUND when absent. */
NB_API nb_status nb_st_count(const nb_st_file *f, size_t *count);
NB_API nb_status nb_st_tensor_at(const nb_st_file *f, size_t i, nb_st_tensor *out);
NB_API nb_status nb_st_tensor_find(const nb_st_file *f, const char *name, nb_st_tensor *out);
/* __metadata__ entries in key order: count, entry i (key and value may be
 * NULL), lookup by key (NB_ERR_NOT_FOUND when absent). */
NB_API nb_status nb_st_metadata_count(const nb_st_file *f, size_t *count);
NB_API nb_status nb_st_metadata_at(const nb_st_file *f, size_t i, const char **key, const char **value);
NB_API nb_status nb_st_metadata_get(const nb_st_file *f, const char *key, const char **value);

/* Write `count` tensors and `npairs` metadata pairs (meta[2i] = key,
 * meta[2i+1] = value; meta may be NULL when npairs is 0) to `path`:
 *   - "__metadata__" comes first and holds "format": "pt" unless a "format"
 *     pair replaces it;
 *   - tensors are laid out as the reference writer does: by descending bits
 *     per element, then by name bytewise; the data follows in that order;
 *   - the header is padded with spaces to a multiple of 8, so every tensor is
 *     naturally aligned in the file;
 *   - the file is written to "<path>.tmp.XXXXXX" next to it, fsync'ed and
 *     renamed over `path` (mode 0644): a reader never sees a partial file.
 * NB_ERR_INVALID_ARGUMENT: a duplicate, empty, over-long or non-UTF-8 name,
 * the name "__metadata__", an unknown dtype, rank > NB_ST_MAX_RANK, a
 * dimension outside [0, 2^48-1], bytes that do not match the shape, a
 * sub-byte tensor that is not whole bytes (odd F4), a duplicate or non-UTF-8
 * metadata key, reserved fields not zero; NB_ERR_NULL_POINTER: NULL data with
 * bytes > 0; NB_ERR_OVERFLOW: sizes past 2^48-1; NB_ERR_IO. */
NB_API nb_status nb_st_write(const char *path, const nb_st_tensor *tensors, size_t count, const char *const *meta,
                             size_t npairs);

/* A sharded checkpoint: `path` is a directory holding
 * model.safetensors.index.json, or the index file itself.  The index is
 * {"metadata": {...} (optional, any content), "weight_map": {tensor: shard}};
 * every shard name must be a plain base name (not empty, no '/', '\\' or
 * "..": never outside the index's directory); every shard is opened with
 * nb_st_open's rules; each listed tensor must be in the shard named for it
 * (NB_ERR_NOT_FOUND otherwise), no name may be listed twice, and no shard may
 * hold a tensor the map does not assign to it (NB_ERR_CORRUPT). */
NB_API nb_status nb_st_index_open(const char *path, nb_st_index **out);
NB_API nb_status nb_st_index_close(nb_st_index *x); /* NULL accepted */
/* Tensors of the whole checkpoint, in order of name. */
NB_API nb_status nb_st_index_count(const nb_st_index *x, size_t *count);
NB_API nb_status nb_st_index_tensor_at(const nb_st_index *x, size_t i, nb_st_tensor *out);
NB_API nb_status nb_st_index_tensor_find(const nb_st_index *x, const char *name, nb_st_tensor *out);
/* Shards, in order of name; *name and *file are owned by the index (either
 * may be NULL). */
NB_API nb_status nb_st_index_shard_count(const nb_st_index *x, size_t *count);
NB_API nb_status nb_st_index_shard_at(const nb_st_index *x, size_t i, const char **name, const nb_st_file **file);

/* ============================================================= checkpoints
 *
 * WHAT IS A LAYER (prefix P; the tensor that anchors the layer in brackets;
 * G is the group of the layout's nb_format, nb_format_get_info):
 *   modelopt-nvfp4 [P.weight]          P.weight U8 [N,K/2], P.weight_scale F8_E4M3
 *                                      [N,K/G], P.weight_scale_2 F32 scalar,
 *                                      optional P.input_scale F32 scalar
 *   ct-nvfp4       [P.weight_packed]   P.weight_packed U8 [N,K/2], P.weight_scale
 *                                      F8_E4M3 [N,K/G], P.weight_global_scale F32 [1]
 *   ct-mxfp4       [P.weight_packed]   P.weight_packed U8 [N,K/2], P.weight_scale
 *                                      U8 [N,K/G], no global scale
 *   quark-mxfp4    [P.weight]          P.weight U8 [N,K/2], P.weight_scale U8 [N,K/G]
 *   gptoss-mxfp4   [P_blocks/P.blocks] P_blocks U8 [E,R,K/32,16], P_scales U8
 *                                      [E,R,K/32]  (n = R, experts = E)
 *   awq-int4, gptq-int4, gptq-int8 [P.qweight]  with P.qzeros, P.scales (and
 *                                      g_idx): see nb_ckpt_layer_weight_v2 for
 *                                      every layout below
 *   ct-int4, ct-int4-sym, ct-int8 [P.weight_packed of dtype I32]
 *   bnb-nf4, bnb-fp4 [P.weight]        with P.weight.quant_state.bitsandbytes__nf4/fp4
 *   none           [P.weight]          BF16/F16/F32, rank 2, no P.weight_scale
 *                                      (an unquantized linear; embeddings count too)
 * "Scalar" accepts shape [] or [1].  MXFP4 scale bytes may also be typed
 * F8_E8M0.  Anything else that claims one of these layouts (a U8 P.weight or
 * a P.weight_scale, a P.weight_packed, a P_blocks or P_scales) and breaks a
 * rule - a missing member, a wrong dtype, K/2 and K/G columns that do not
 * agree, rows that differ, K not a multiple of G, a zero or non-finite
 * weight_global_scale - is NB_CKPT_INCONSISTENT, with the reason in
 * `problem`; so is each layer of a prefix that two layouts claim (P.weight
 * and P_blocks, P_blocks and P.blocks, ...: two layers, one prefix, and
 * nb_ckpt_layer_find gives the first).  Nothing is guessed.  Other tensors (norms, biases, 1-D weights,
 * FP8 k_scale, ...) belong to no layer.
 *
 * CONFIG: hf_quant_config.json ("quantization.quant_algo") and config.json
 * ("quantization_config": quant_method, quant_algo, format; for awq, gptq,
 * compressed-tensors pack-quantized and bitsandbytes also bits, group_size,
 * sym, checkpoint_format, version, config_groups' weights, bnb_4bit_quant_type
 * and load_in_4bit) next to the
 * checkpoint are read when present (at most NB_CKPT_MAX_CONFIG bytes each;
 * larger or malformed JSON fails the open with NB_ERR_CORRUPT).  They give a
 * declared format; the tensors still decide every layer, and the config only
 * cross-checks: a quantized layer whose format differs from the declared one
 * has config_mismatch set and a note in `problem`.  Exclude lists (ModelOpt
 * exclude_modules in either file, compressed-tensors ignore, Quark exclude,
 * gpt-oss modules_to_not_convert) are applied: shell wildcards match the
 * prefix or one of its parent modules; "re:" entries are Python regexes
 * anchored at the start as re.match does (refused, and reported in the
 * config's note, when ERE cannot say them or they would expand too much). */

#define NB_CKPT_MAX_CONFIG (16u << 20) /* bytes of config.json / hf_quant_config.json */

/* Explicit values, append only. */
typedef enum nb_ckpt_format {
    NB_CKPT_NONE = 0,           /* unquantized (BF16/F16/F32) linear */
    NB_CKPT_MODELOPT_NVFP4 = 1,
    NB_CKPT_CT_NVFP4 = 2,       /* compressed-tensors nvfp4-pack-quantized */
    NB_CKPT_CT_MXFP4 = 3,       /* compressed-tensors mxfp4-pack-quantized */
    NB_CKPT_QUARK_MXFP4 = 4,
    NB_CKPT_GPTOSS_MXFP4 = 5,
    NB_CKPT_INCONSISTENT = 6,
    /* converted into nibble's checkpoint layout when read (nb_ckpt_layer_weight_v2): */
    NB_CKPT_AWQ_INT4 = 7,       /* AutoAWQ GEMM: qweight [K, N/8], qzeros, scales -> int4 */
    NB_CKPT_GPTQ_INT4 = 8,      /* GPTQ: qweight [K/8, N], qzeros, scales, g_idx -> int4 */
    NB_CKPT_CT_INT4 = 9,        /* compressed-tensors pack-quantized, asymmetric -> int4 */
    NB_CKPT_CT_INT4_SYM = 10,   /* compressed-tensors pack-quantized, symmetric -> int4_sym */
    NB_CKPT_CT_INT8 = 11,       /* compressed-tensors pack-quantized, 8 bits, symmetric -> int8 */
    NB_CKPT_BNB_NF4 = 12,       /* bitsandbytes 4-bit serialized weights -> nf4 */
    NB_CKPT_BNB_FP4 = 13,       /* the same with quant_type fp4 -> bnb_fp4 */
    NB_CKPT_GPTQ_INT8 = 14,     /* GPTQ 8 bits, symmetric: qweight [K/4, N], qzeros, scales, g_idx -> int8 */
    NB_CKPT_HQQ_INT4 = 15       /* HQQ 4 bits (hqq's HQQLinear state_dict): W_q, scale, zero, meta -> int4_hqq */
} nb_ckpt_format;

/* Where a decision (or the declared format) comes from.  Append only. */
typedef enum nb_ckpt_source {
    NB_CKPT_SRC_TENSORS = 0,         /* names, dtypes and shapes only (no config says) */
    NB_CKPT_SRC_HF_QUANT_CONFIG = 1, /* tensors, confirmed by hf_quant_config.json */
    NB_CKPT_SRC_CONFIG_JSON = 2      /* tensors, confirmed by config.json */
} nb_ckpt_source;

/* "none", "modelopt-nvfp4", "ct-nvfp4", "ct-mxfp4", "quark-mxfp4",
 * "gptoss-mxfp4", "inconsistent", "awq-int4", "gptq-int4", "ct-int4",
 * "ct-int4-sym", "ct-int8", "bnb-nf4", "bnb-fp4", "gptq-int8"; and "tensors",
 * "hf_quant_config.json", "config.json".  NB_ERR_INVALID_ARGUMENT for
 * another value. */
NB_API nb_status nb_ckpt_format_name(nb_ckpt_format f, const char **name);
NB_API nb_status nb_ckpt_source_name(nb_ckpt_source s, const char **name);
/* The nb_format of a quantized layout (NVFP4 for modelopt-nvfp4 and
 * ct-nvfp4, MXFP4 for ct-mxfp4, quark-mxfp4 and gptoss-mxfp4, INT4 for
 * awq-int4, gptq-int4 and ct-int4, INT4_SYM for ct-int4-sym, INT8 for ct-int8
 * and gptq-int8, NF4 and BNB_FP4 for the bitsandbytes ones);
 * NB_ERR_UNSUPPORTED for none and inconsistent. */
NB_API nb_status nb_ckpt_format_weight(nb_ckpt_format f, nb_format *out);

typedef struct nb_ckpt_layer {
    const char *prefix;       /* "model.layers.0.mlp.down_proj"; owned by the checkpoint */
    nb_ckpt_format format;
    int64_t n, k;             /* out x in features (per expert); 0 when unknown */
    int64_t experts;          /* gpt-oss: E; 0 for a dense layer */
    /* NVFP4: ModelOpt weight_scale_2, or 1.0f / weight_global_scale
     * (compressed-tensors); 1 for MXFP4; 0 otherwise. */
    float tensor_scale;
    uint64_t bytes;           /* bytes of every tensor of the layer */
    nb_st_dtype weight_dtype; /* dtype of the anchor tensor */
    nb_ckpt_source decided_by;
    int config_mismatch;      /* quantized, and the config declares another format or excludes it */
    char problem[256];        /* why INCONSISTENT, or the mismatch note; "" otherwise */
    int excluded;             /* a config's exclude / ignore list names it */
    const char *excluded_by;  /* the entry that does (owned by the checkpoint); NULL otherwise */
    nb_ckpt_source excluded_src;
    /* 1 when the layer's k is reordered so that its groups are contiguous
     * (GPTQ or compressed-tensors act-order, a g_idx that is not k / group):
     * the weight nb_ckpt_layer_weight_v2 returns multiplies permuted
     * activations, x'[j] = x[perm[j]] (nb_ckpt_layer_perm). */
    int32_t k_permuted;
    int32_t reserved[7];
} nb_ckpt_layer;

/* The config as read: the format it declares (NB_CKPT_NONE when none, or
 * when it names something this module does not map, e.g. MIXED_PRECISION),
 * the file it came from, and the raw strings (NULL when absent; owned by the
 * checkpoint). */
typedef struct nb_ckpt_config {
    nb_ckpt_format declared;
    nb_ckpt_source source;    /* NB_CKPT_SRC_TENSORS when no config declares */
    const char *quant_method; /* config.json quantization_config.quant_method */
    const char *quant_algo;   /* hf_quant_config.json, else config.json */
    const char *ct_format;    /* config.json quantization_config.format */
    int has_config_json, has_hf_quant_config;
    size_t nexclude;          /* exclude-list entries read (nb_ckpt_exclude_at) */
    const char *note;         /* entries that could not be used, or NULL */
    int32_t reserved[8];
} nb_ckpt_config;

typedef struct nb_ckpt nb_ckpt;

/* Open `path`: a .safetensors file, a directory holding
 * model.safetensors.index.json (preferred) or model.safetensors
 * (NB_ERR_NOT_FOUND when it holds neither), or an index file (*.json).
 * Reads the configs next to it and classifies every layer. */
NB_API nb_status nb_ckpt_open(const char *path, nb_ckpt **out);
NB_API nb_status nb_ckpt_close(nb_ckpt *c); /* NULL accepted */

/* Files: the index first (when sharded), then every safetensors file, in
 * order of name; bytes from stat (path and bytes may be NULL). */
NB_API nb_status nb_ckpt_file_count(const nb_ckpt *c, size_t *count);
NB_API nb_status nb_ckpt_file_at(const nb_ckpt *c, size_t i, const char **path, uint64_t *bytes);
/* Every tensor, in order of name; *layer (may be NULL) receives the index of
 * the layer it belongs to, or -1.  _find: the index of tensor `name`. */
NB_API nb_status nb_ckpt_tensor_count(const nb_ckpt *c, size_t *count);
NB_API nb_status nb_ckpt_tensor_at(const nb_ckpt *c, size_t i, nb_st_tensor *out, int64_t *layer);
NB_API nb_status nb_ckpt_tensor_find(const nb_ckpt *c, const char *name, size_t *index);
/* The safetensors files that hold the tensors: one for a single file, the
 * shards (in order of name) for an index; *name is the base name, *file is
 * owned by the checkpoint.  *sharded (may be NULL) says whether an index was
 * opened (nb_ckpt_file_at(c, 0) is then the index file). */
NB_API nb_status nb_ckpt_shard_count(const nb_ckpt *c, size_t *count, int *sharded);
NB_API nb_status nb_ckpt_shard_at(const nb_ckpt *c, size_t i, const char **name, const nb_st_file **file);
/* The directory the checkpoint and its configs live in (owned by it). */
NB_API nb_status nb_ckpt_get_dir(const nb_ckpt *c, const char **dir);

/* Layers, in order of their anchor tensor's name. */
NB_API nb_status nb_ckpt_layer_count(const nb_ckpt *c, size_t *count);
NB_API nb_status nb_ckpt_layer_at(const nb_ckpt *c, size_t i, nb_ckpt_layer *out);
NB_API nb_status nb_ckpt_layer_find(const nb_ckpt *c, const char *prefix, size_t *index);
NB_API nb_status nb_ckpt_get_config(const nb_ckpt *c, nb_ckpt_config *out);
/* Exclude-list entry i: the pattern as written, where it was read
 * ("config.json quantization_config.ignore"), and whether it is used (a
 * regex that cannot be used is not); where and usable may be NULL. */
NB_API nb_status nb_ckpt_exclude_at(const nb_ckpt *c, size_t i, const char **pattern, const char **where,
                                    int *usable);

/* The weight of layer i (expert `expert` for gpt-oss, else 0) in nibble's
 * checkpoint layout, zero copy: *codes and *scales point into the file
 * mapping (host memory, valid until close) and *desc is ready for
 * nb_dequantize_host / nb_pack (format, n, k, group, scale type,
 * tensor_scale; the MXFP4 scale_rule says how the producer chose exponents:
 * EVEN for Quark and compressed-tensors, ROUND_UP for gpt-oss; informative).
 * NB_ERR_UNSUPPORTED for none and inconsistent layers, NB_ERR_INVALID_ARGUMENT
 * for an expert out of range, NB_ERR_NOT_FOUND for i out of range. */
NB_API nb_status nb_ckpt_layer_weight(const nb_ckpt *c, size_t i, int64_t expert, nb_weight_desc *desc,
                                      const uint8_t **codes, const uint8_t **scales);

/* The weight of layer i, any quantized layout, copied into the caller's
 * buffers in nibble's checkpoint layout (nibble.h, "the _v2 buffer
 * functions"): codes, scales and, for int4, zeros.  With out NULL only *desc
 * is filled (format, n, k, group, scale type): size the buffers with
 * nb_weight_get_sizes_v2(desc) and call again; capacity gives the bytes each
 * buffer holds (NB_ERR_BUFFER_TOO_SMALL when short; may be NULL only with
 * out NULL).  nb_ckpt_layer_weight (zero copy) serves the FP4 layouts; the
 * layouts below are converted, so it refuses them and names this function.
 * Each is read bit for bit as its producer dequantizes it
 * (docs/formats.md sections 4 and 5):
 *   awq-int4   AutoAWQ GEMM: P.qweight I32 [K, N/8] (eight output columns per
 *              word, logical column j at nibble [0,4,1,5,2,6,3,7][j]),
 *              P.qzeros I32 [K/G, N/8] packed alike, P.scales F16/BF16
 *              [K/G, N] -> int4 codes, zeros and scales, transposed to [N, .];
 *   gptq-int4  P.qweight I32 [K/8, N] (input channel k at bits 4(k%8) of word
 *              k/8), P.qzeros I32 [K/G, N/8], P.scales [K/G, N], optional
 *              P.g_idx I32 [K]; a stored zero point is z - 1 unless the
 *              config says checkpoint_format "gptq_v2" ((stored + 1) & 15, as
 *              GPTQ's reader computes); a g_idx whose groups are not
 *              contiguous reorders k (k_permuted, nb_ckpt_layer_perm) ->
 *              int4;
 *   gptq-int8  GPTQ with "bits": 8 in the config (the shapes alone read as
 *              4-bit): P.qweight I32 [K/4, N] (input channel k at bits
 *              8(k%4) of word k/4), P.qzeros I32 [K/G, N/4] (eight bits per
 *              zero point, along N), P.scales [K/G, N], optional P.g_idx as
 *              gptq-int4's; zero points as gptq-int4's ((stored + 1) & 255
 *              for v1) and every one must be 128 (sym=True; int8 holds no
 *              zero points, so an asymmetric layer is inconsistent) -> int8
 *              codes q - 128 (the stored byte ^ 0x80) and scales;
 *   ct-int4, ct-int4-sym, ct-int8  compressed-tensors pack-quantized:
 *              P.weight_packed I32 [N, K*bits/32] (element k at bits
 *              bits*(k % (32/bits)), offset by 2^(bits-1)), P.weight_scale
 *              F16/BF16 [N, K/G] (G = K: per channel), P.weight_shape I32 or
 *              I64 [2] = [N, K], P.weight_zero_point I32 [N/8, K/G] (packed
 *              along N, offset by 8) for the asymmetric one, optional
 *              P.weight_g_idx I32 [K] as GPTQ's -> int4 (zeros = stored),
 *              int4_sym or int8 (codes = stored - offset);
 *   bnb-nf4, bnb-fp4  bitsandbytes: P.weight [ceil(N*K/2) bytes, any dtype]
 *              (the first element of a pair in the high nibble),
 *              P.weight.absmax F32 [N*K/B] or U8 with P.weight.nested_absmax
 *              F32 and P.weight.nested_quant_map F32 [256],
 *              P.weight.quant_map F32 [16] (must be the format's table),
 *              P.weight.quant_state.bitsandbytes__nf4 (or __fp4) U8 JSON
 *              {quant_type, blocksize B, shape [N, K], nested_blocksize,
 *              nested_offset, ...}; B must divide K (blocks run over the
 *              flattened tensor); a nested absmax becomes
 *              fl(fl(nested_quant_map[a] * nested_absmax[i / nested_blocksize])
 *              + nested_offset), bitsandbytes' float32 arithmetic -> nf4 or
 *              bnb_fp4 with F32 scales.
 * NB_ERR_UNSUPPORTED for none and inconsistent layers, NB_ERR_INVALID_ARGUMENT
 * for an expert out of range or buffers that do not fit the format (zeros
 * for a format without, reserved pointers not NULL), NB_ERR_NULL_POINTER,
 * NB_ERR_NOT_FOUND for i out of range. */
NB_API nb_status nb_ckpt_layer_weight_v2(const nb_ckpt *c, size_t i, int64_t expert, nb_weight_desc *desc,
                                         const nb_weight_buffers *out, const nb_weight_sizes_v2 *capacity);
/* The k permutation of layer i: perm[j] (j < k) is the input feature that
 * column j of the weight nb_ckpt_layer_weight_v2 returns multiplies, so
 * Y = x[:, perm] . W^T; the identity when layer.k_permuted is 0.  count must
 * be at least k (NB_ERR_BUFFER_TOO_SMALL). */
NB_API nb_status nb_ckpt_layer_perm(const nb_ckpt *c, size_t i, int32_t *perm, size_t count);

/* =========================================================== expert groups
 *
 * A mixture-of-experts checkpoint stores a layer's experts either as one
 * tensor per projection holding every expert (gpt-oss) or as one linear
 * layer per expert and projection (ModelOpt, compressed-tensors and Quark
 * exports of Qwen3-MoE, DeepSeek-V3/R1, Llama-4, Mixtral ...).  nb_ckpt_open
 * finds these sets and makes each an expert group: one MoE MLP of nibble.h
 * (nb_moe_desc), E experts' gate_up [2I, H] and down [H, I] weights.  The
 * layers a group is made of stay layers (nb_ckpt_layer_at lists them;
 * nb_ckpt_layer_moe says which group, projection and expert each is), and
 * `nibble inspect` shows the group in their place.
 *
 * WHAT IS A GROUP (prefix G, e.g. "model.layers.0.mlp.experts"):
 *   gpt-oss    G.gate_up_proj and G.down_proj, two gptoss-mxfp4 layers (the
 *              G.gate_up_proj_blocks / _scales tensors) with the same E:
 *              gate_up [E, 2I, H], its rows interleaved (row 2i gate i, row
 *              2i+1 up i), and down [E, H, I], expert-major and read zero copy
 *              (nb_ckpt_moe_weights); biases G.gate_up_proj_bias [E, 2I] and
 *              G.down_proj_bias [E, H] (or G.gate_up_proj.bias ...), BF16,
 *              F16 or F32, when present.  Activation SWIGLU_OAI, limit and
 *              alpha from config.json's swiglu_limit and swiglu_alpha (7 and
 *              1.702 when absent).
 *   per expert G.e.gate_proj, G.e.up_proj and G.e.down_proj (or Mixtral's
 *              G.e.w1, G.e.w3, G.e.w2) for every e in 0 .. E-1, G's last
 *              component being "experts" and e written in decimal without
 *              leading zeros: 3E layers of one FP4 layout (modelopt-nvfp4,
 *              ct-nvfp4, ct-mxfp4, quark-mxfp4), gate and up [I, H], down
 *              [H, I].  gate_up is gate's rows then up's (CONCAT), copied into
 *              one weight per expert by nb_ckpt_moe_read; activation SWIGLU.
 *              Every expert has its own tensor scales (NVFP4 weight_scale_2);
 *              when an expert's gate and up scales differ, gate_up_scales_differ
 *              is set and gate_up cannot be read as one weight (GATE and UP
 *              can).
 *   per expert, fused  G.e.gate_up_proj [2I, H] and G.e.down_proj (what
 *              `nibble convert` writes from gpt-oss): grouped as gpt-oss
 *              (INTERLEAVED, SWIGLU_OAI) when config.json's model_type is
 *              "gpt_oss"; otherwise the row order is unknown and the group is
 *              inconsistent.
 * top_k is config.json's num_experts_per_tok (or text_config's), 0 when
 * absent.  A set that names experts but breaks a rule - an expert or
 * projection missing, members of different layouts or shapes, an
 * unquantized or inconsistent member, experts in a layout converted when read
 * (awq-int4 ... gptq-int8: not grouped yet), a bias of the wrong shape - is a
 * group with format NB_CKPT_INCONSISTENT and the reason in `problem`; its
 * layers are still read one by one.  Experts that are all unquantized
 * (a BF16 checkpoint) form no group.  Biases of per-expert layers are not
 * grouped (read them as tensors).  Dense layers and shared experts
 * ("shared_experts.gate_proj", no index) are not experts. */

/* Explicit values, append only. */
typedef enum nb_ckpt_moe_proj {
    NB_CKPT_MOE_GATE_UP = 1, /* [2I, H]: gate and up rows in the group's gate_up_layout */
    NB_CKPT_MOE_DOWN = 2,    /* [H, I] */
    NB_CKPT_MOE_GATE = 3,    /* [I, H]: groups of separate gate and up layers only */
    NB_CKPT_MOE_UP = 4       /* [I, H]: likewise */
} nb_ckpt_moe_proj;

typedef struct nb_ckpt_moe {
    const char *prefix;        /* G; owned by the checkpoint */
    nb_ckpt_format format;     /* every member's layout, or NB_CKPT_INCONSISTENT (see problem) */
    int64_t experts;           /* E (0 when not known) */
    int64_t hidden;            /* H (0 when not known) */
    int64_t intermediate;      /* I (0 when not known) */
    int32_t activation;        /* nb_moe_activation: SWIGLU_OAI (gpt-oss) or SWIGLU */
    int32_t gate_up_layout;    /* nb_moe_gate_up_layout of gate_up as it is read */
    int32_t per_expert;        /* 1: a layer per expert and projection; 0: one per projection (gpt-oss) */
    int32_t fused;             /* 1: gate_up is stored as one weight per expert (gpt-oss, per expert fused) */
    int32_t top_k;             /* config.json num_experts_per_tok; 0 when absent */
    float limit, alpha;        /* SWIGLU_OAI's clamp limit and sigmoid slope; 0 for SWIGLU */
    int64_t gate_up_bias;      /* tensor index (nb_ckpt_tensor_at) of the [E, 2I] bias, -1 when none */
    int64_t down_bias;         /* tensor index of the [E, H] bias, -1 when none */
    int32_t gate_up_scales_differ; /* 1: some expert's gate and up tensor scales differ (read GATE and UP) */
    int32_t layers;            /* member layers: 2 (gpt-oss), 2E (fused) or 3E */
    uint64_t bytes;            /* bytes of the member layers' tensors and the biases */
    char problem[256];         /* why INCONSISTENT; "" otherwise */
    int32_t reserved[8];
} nb_ckpt_moe;

/* Groups, in order of prefix; _find: the group with prefix G. */
NB_API nb_status nb_ckpt_moe_count(const nb_ckpt *c, size_t *count);
NB_API nb_status nb_ckpt_moe_at(const nb_ckpt *c, size_t i, nb_ckpt_moe *out);
NB_API nb_status nb_ckpt_moe_find(const nb_ckpt *c, const char *prefix, size_t *index);
/* The group layer `layer` belongs to: *group its index, or -1 (NB_OK) when
 * none; *proj its projection and *expert its expert (-1 for a gpt-oss
 * layer, which holds every expert).  proj and expert may be NULL. */
NB_API nb_status nb_ckpt_layer_moe(const nb_ckpt *c, size_t layer, int64_t *group, nb_ckpt_moe_proj *proj,
                                   int64_t *expert);
/* The nb_moe_desc of group i for m tokens: E, H, I, the members' format,
 * group and scale type, activation, gate_up_layout, limit, alpha; top_k 0
 * takes the group's (config.json), and NB_ERR_INVALID_ARGUMENT when it has
 * none.  NB_ERR_UNSUPPORTED for an inconsistent group (the reason in the
 * message); otherwise what nb_moe_desc_validate says. */
NB_API nb_status nb_ckpt_moe_desc(const nb_ckpt *c, size_t i, int64_t m, int32_t top_k, nb_dtype act_dtype,
                                  nb_moe_desc *out);
/* Expert `expert`'s weight of projection `proj`, zero copy as
 * nb_ckpt_layer_weight gives it: *desc carries that expert's tensor scale.
 * gpt-oss and fused groups: GATE_UP and DOWN; separate gate and up layers:
 * GATE, UP and DOWN (GATE_UP is two layers: nb_ckpt_moe_read copies them
 * into one).  A projection the group does not store, or an inconsistent
 * group, is NB_ERR_UNSUPPORTED; an expert out of range
 * NB_ERR_INVALID_ARGUMENT; i out of range NB_ERR_NOT_FOUND. */
NB_API nb_status nb_ckpt_moe_expert(const nb_ckpt *c, size_t i, nb_ckpt_moe_proj proj, int64_t expert,
                                    nb_weight_desc *desc, const uint8_t **codes, const uint8_t **scales);
/* Every expert's weight of `proj` at once, expert-major as nb_moe_mlp_host
 * reads it, zero copy: gpt-oss groups only (their tensors are laid out so);
 * per-expert groups are NB_ERR_UNSUPPORTED (their experts are separate
 * tensors: nb_ckpt_moe_read).  *desc describes one expert (tensor scale 1). */
NB_API nb_status nb_ckpt_moe_weights(const nb_ckpt *c, size_t i, nb_ckpt_moe_proj proj, nb_weight_desc *desc,
                                     const uint8_t **codes, const uint8_t **scales);
/* Every expert's weight of `proj` copied into the caller's buffers,
 * expert-major (expert e at e times one expert's nb_weight_get_sizes_v2(desc)
 * bytes), for any group that is not inconsistent: GATE_UP of separate gate
 * and up layers is each expert's gate codes then its up codes (and scales
 * likewise), which is the CONCAT row order.  *desc describes one expert, with
 * expert 0's tensor scale; tensor_scales (may be NULL; at least E floats,
 * `count`) receives every expert's (1 for a format without one), which is
 * what nb_moe_weights.gate_up_scales / down_scales take for NVFP4.  With out
 * NULL only *desc and tensor_scales are filled; capacity gives the bytes of
 * each buffer (NB_ERR_BUFFER_TOO_SMALL below E experts'; may be NULL only
 * with out NULL).  GATE_UP of an expert whose gate and up tensor scales
 * differ is NB_ERR_UNSUPPORTED, naming the expert and both scales, before
 * anything is written. */
NB_API nb_status nb_ckpt_moe_read(const nb_ckpt *c, size_t i, nb_ckpt_moe_proj proj, nb_weight_desc *desc,
                                  const nb_weight_buffers *out, const nb_weight_sizes_v2 *capacity,
                                  float *tensor_scales, size_t count);

/* ================================================================ quantize
 *
 * nb_ckpt_quantize writes a BF16/F16/F32 checkpoint as a 4-bit or 8-bit one,
 * in the checkpoint layout of opts.format: NVFP4 as ModelOpt
 * (docs/formats.md 2.2-2.3), MXFP4 as Quark (3.3), INT4, INT4_SYM and INT8
 * as compressed-tensors pack-quantized (5.4; opts.group_size and
 * opts.scale_type choose the group and the scales' dtype).  A format of nibble.h's table that has no such
 * layout here is NB_ERR_UNSUPPORTED.
 *
 * WHAT IS QUANTIZED: a tensor "P.weight" (P not empty) of rank 2, dtype
 * BF16, F16 or F32, with N, K > 0 and K a multiple of the format's group
 * (the chosen one for the integer formats; one group per row takes any even
 * K, any K for INT8), whose prefix P matches no exclude pattern, and for which the input has
 * none of the tensors the layout writes for P besides P.weight
 * (P.weight_scale, P.weight_scale_2 for formats with a tensor scale;
 * P.weight_packed, P.weight_scale, P.weight_shape, P.weight_zero_point and
 * P.weight_g_idx for compressed-tensors) already.  Patterns are shell wildcards matched with fnmatch(pattern, P, 0)
 * ('*' also crosses dots).  Unless no_default_excludes is set, "*lm_head"
 * and "*embed*" are excluded (output head and embeddings).  Every other
 * tensor is copied unchanged; rank-2 "*.weight" tensors of any other dtype
 * (F64, I32, U8, ...) are counted in summary.weights_unsupported.
 * GPT-OSS: with format MXFP4 and a config.json whose model_type is
 * "gpt_oss", the output is gpt-oss's own MXFP4 layout (the one its
 * published checkpoints, transformers and vLLM read): the experts are
 * quantized and every linear weight stays as it is.  An experts tensor is
 * "G.gate_up_proj" [E, H, 2I] or "G.down_proj" [E, I, H] (rank 3, BF16, F16
 * or F32, G's last component "experts"; transformers' GptOssExperts
 * multiplies x [T, K] by the expert's [K, N] slice), quantized when K is a
 * multiple of 32, gate_up's 2I is even, no exclude pattern matches G and
 * neither output tensor exists yet: expert e's slice is transposed to the
 * [N, K] weight and quantized as any weight (opts.mx_rule, opts.method),
 * its rows in the input's order (gate_up's interleaved gate and up rows
 * stay interleaved), and written as G.gate_up_proj_blocks U8 [E, N, K/32,
 * 16] (the codes, expert-major) and G.gate_up_proj_scales U8 [E, N, K/32]
 * (E8M0); likewise G.down_proj_blocks / _scales.  The biases
 * (G.gate_up_proj_bias, G.down_proj_bias) and every other tensor are
 * copied; the rank-2 weights left as they are count in weights_excluded.
 * config.json gets quantization_config {"quant_method": "mxfp4",
 * "modules_to_not_convert": [every module whose weight was left
 * unquantized, sorted]}.  Read back, each G is a gpt-oss group
 * (nb_ckpt_moe_at) whose experts are exactly the quantizer's codes and
 * scales.  The whole tensor need not fit twice in memory: one expert's
 * slice, codes and scales are held at a time.  Other formats copy gpt-oss
 * experts unchanged (there is no NVFP4 layout of them here).
 * NOTHING TO QUANTIZE: when no tensor qualifies, the call fails with
 * NB_ERR_UNSUPPORTED before `out` is touched, saying why (the dtypes found,
 * with tensor names; how many weights the patterns, K or existing scales
 * excluded), unless opts.allow_empty, which writes the copy (configs
 * included) anyway.
 *
 * OUTPUT (directory `out`, which must not exist or be empty; created 0755):
 *   NVFP4: P.weight U8 [N,K/2], P.weight_scale F8_E4M3 [N,K/16],
 *          P.weight_scale_2 F32 [] (nb_quantize_host's tensor scale; with
 *          opts.fused_scales, for the quantized members of each group
 *          M.q_proj / M.k_proj / M.v_proj and M.gate_proj / M.up_proj, the
 *          one their largest magnitude gives: amax / (6 * 448) over the
 *          group, found by reading those weights once more before OUT is
 *          written);
 *          hf_quant_config.json; config.json (when the input has one) with a
 *          ModelOpt quantization_config.  No P.input_scale (there is no
 *          activation calibration).
 *   MXFP4: P.weight U8 [N,K/2], P.weight_scale U8 [N,K/32] (E8M0);
 *          config.json (when the input has one) with a Quark
 *          quantization_config whose scale_calculation_mode names the rule.
 *   INT4, INT4_SYM, INT8 (compressed-tensors pack-quantized,
 *          docs/formats.md 5.4):
 *          P.weight_packed I32 [N, ceil(K/8)] (element k at bits 4(k % 8) of
 *          word k / 8: the bytes of nb_quantize_host_v2's codes, with
 *          int4_sym's codes offset by 8, i.e. each nibble's bit 3 flipped;
 *          INT8: I32 [N, ceil(K/4)], element k at bits 8(k % 4) of word
 *          k / 4, each code byte with bit 7 flipped, the two's-complement
 *          code plus 128; a row whose K is not a multiple of 32/bits is
 *          padded with zero bits),
 *          P.weight_scale F16 or BF16 [N, K/G] (the scales as they are),
 *          P.weight_shape I64 [2] = {N, K}, and for int4
 *          P.weight_zero_point I32 [ceil(N/8), K/G] (the zero points as they
 *          are, 0..15, which is compressed-tensors' signed zero point plus 8;
 *          row n at bits 4(n % 8) of word row n / 8, padding rows zero);
 *          config.json (when the input has one) with a compressed-tensors
 *          quantization_config: format "pack-quantized", config_groups
 *          group_0 {targets ["Linear"], weights {num_bits 4 (INT8: 8),
 *          type "int", symmetric (true but for INT4), strategy "group"
 *          with group_size G, or "channel" with group_size null, dynamic
 *          false, observer "minmax", actorder null}, input_activations
 *          null}, ignore (the unquantized weights),
 *          quantization_status "compressed", producer nibble.  Read back,
 *          these are the ct-int4 / ct-int4-sym / ct-int8 layers of
 *          nb_ckpt_layer_weight_v2 with exactly the quantizer's codes, scales
 *          and zero points.
 *   NF4, BNB_FP4 (K a multiple of the block B: opts.group_size 32, 64,
 *          ..., 4096, default 64): bitsandbytes' 4-bit serialization without
 *          double quantization, as transformers saves a Linear4bit
 *          (docs/formats.md 4.3): P.weight U8 [N*K/2, 1] (the codes in
 *          row-major order, the first of each byte in its high nibble),
 *          P.weight.absmax F32 [N*K/B] (the absmax as it is: B divides K,
 *          so bitsandbytes' blocks of the flattened weight are the rows'
 *          blocks), P.weight.quant_map F32 [16] (the format's values) and
 *          P.weight.quant_state.bitsandbytes__nf4 (__fp4) U8, the JSON
 *          {"quant_type": "nf4", "blocksize": B, "dtype": the weight's
 *          ("bfloat16", "float16", "float32"), "shape": [N, K]} as
 *          bitsandbytes writes it; config.json's quantization_config is
 *          transformers' BitsAndBytesConfig (quant_method "bitsandbytes",
 *          load_in_4bit, bnb_4bit_quant_type, bnb_4bit_use_double_quant
 *          false, bnb_4bit_compute_dtype from the input's torch_dtype when
 *          it is float16 or float32, else "bfloat16",
 *          bnb_4bit_quant_storage "uint8", llm_int8_skip_modules the
 *          unquantized weights).  Every tensor equals what bitsandbytes'
 *          own quantize_4bit and QuantState.as_dict(packed=True) give for
 *          the same weight (quant_state's dtype aside), but for codes of
 *          weights at a midpoint between two table values to within
 *          float32 rounding (nb_quantize_host rounds those its own way);
 *          read back, these are the bnb-nf4 / bnb-fp4 layers with exactly
 *          the quantizer's codes and absmax.
 *   INT4_HQQ (groups G of 32, 64 (default) or 128 dividing K, R = N K / G
 *          even; opts.scale_type F16 (default) or BF16; opts.method RTN or
 *          NB_QUANT_HQQ, hqq's optimizer): hqq 0.2.8's HQQLinear.state_dict
 *          for 4 bits along axis 1 as its encode_safetensor_type writes it
 *          (docs/formats.md 5.5): P.W_q U8 [R/2, G] (group r's codes in the
 *          high nibbles of row r, group R/2 + r's in the low ones), P.scale
 *          and P.zero [R, 1] in the scale type, and the meta values P.nbits
 *          (I32 4), P.group_size (I32 G), P.shape (I64 [N, K]), P.axis (I32
 *          1), P.packing ("4bit_u8"), P.unpack_view_dtype ("torch.uint8"),
 *          P.compute_dtype ("torch.float16" or "torch.bfloat16"), and U8 0-d
 *          flags view_as_float, quant_scale, quant_zero, offload_meta,
 *          optimize, round_zero 0 and encoded_state_dict,
 *          stores_quant_config, channel_wise 1; config.json's
 *          quantization_config is transformers' HqqConfig (quant_method
 *          "hqq", weight_quant_params {nbits 4, group_size G, axis 1, ...},
 *          skip_modules the unquantized modules' last name components).
 *          hqq's HQQLinear.load_state_dict takes each layer and dequantizes
 *          it to nibble's dequantization bit for bit; read back, these are
 *          the hqq-int4 layers with exactly the quantizer's codes, scales and
 *          zero points.
 *   config.json is the input's with quantization_config set; every other
 *   key and value is kept as the input wrote it (numbers with their text:
 *   7.0 stays 7.0), the indentation is cJSON's.
 *   One output safetensors file per input file, with the same base name, and
 *   the index (same base name as the input's) when the input is sharded.
 *   Every other regular file in the input's directory (tokenizer files,
 *   generation_config.json, ...) is copied byte for byte, except other
 *   *.safetensors / *.safetensors.index.json files and an input
 *   hf_quant_config.json (replaced or dropped); subdirectories are skipped.
 *   The input is never modified.
 *   CRASH CONSISTENCY: everything is written into a staging directory next
 *   to `out` (".<out>.nibble-staging-XXXXXX", with a marker file of that
 *   name plus ".lock" that the writer holds locked), fsync'ed, and published
 *   with one rename over `out` (an empty `out` is replaced by it and its
 *   permission bits are kept).  So `out` is either as it was or complete: a
 *   failure, a signal or a SIGKILL at any point never leaves a partial
 *   checkpoint in it, and a rerun into the same `out` works.  A failed call
 *   removes its staging directory; one left by a killed run is removed by the
 *   next call that writes the same `out` (only when its marker is unlocked,
 *   holds what this module writes, and the directory holds nothing but
 *   regular files).  Writing needs write access to `out`'s parent directory;
 *   `out` may not be a mount point.
 *
 * MEMORY: tensors are streamed one at a time: each output file's header is
 * computed from shapes alone, then every tensor is quantized (or copied)
 * from the input mapping and written at its offset, so at most one source
 * tensor's codes and scales are held; the source pages are dropped after use.
 *
 * DEVICE: opts.device picks where each weight is quantized: the C reference
 * (nb_quantize_host) on the CPU, or CUDA device 0 (nb_quantize_staged;
 * device memory for one tensor at a time).  Both write the same bytes.  AUTO
 * takes the GPU when libnibble was built with CUDA and a device can be
 * opened, the CPU otherwise; GPU without one is NB_ERR_NO_DEVICE before OUT
 * is touched.  summary.device says which ran.  The integer and table
 * formats have no device quantizer: AUTO quantizes them on the CPU
 * (nb_quantize_host_v2), GPU is NB_ERR_UNSUPPORTED. */

/* Called before each input tensor (i counts from 0) and once at the end with
 * i == n and name NULL; bytes are input tensor bytes processed so far and in
 * total.  `user` is the opts' progress_user. */
typedef void (*nb_ckpt_progress)(void *user, size_t i, size_t n, uint64_t bytes_done, uint64_t bytes_total,
                                 const char *name);

/* Where nb_ckpt_quantize quantizes.  Explicit values, append only. */
typedef enum nb_ckpt_device {
    NB_CKPT_DEVICE_AUTO = 0, /* CUDA device 0 when there is one (and libnibble has CUDA), else the CPU */
    NB_CKPT_DEVICE_CPU = 1,  /* nb_quantize_host, the C reference */
    NB_CKPT_DEVICE_GPU = 2   /* nb_quantize_staged on CUDA device 0, or NB_ERR_NO_DEVICE */
} nb_ckpt_device;

/* "auto", "cpu", "gpu" (NB_ERR_INVALID_ARGUMENT for another value); parse:
 * NB_ERR_NOT_FOUND for another string. */
NB_API nb_status nb_ckpt_device_name(nb_ckpt_device d, const char **name);
NB_API nb_status nb_ckpt_device_parse(const char *s, nb_ckpt_device *out);

typedef struct nb_ckpt_quantize_opts {
    nb_format format;             /* a format with a checkpoint layout: NVFP4, MXFP4, INT4, INT4_SYM, INT8, NF4,
                                   * BNB_FP4, INT4_HQQ */
    nb_mx_scale_rule mx_rule;     /* formats with E8M0 scales (MXFP4); EVEN is Quark's default */
    const char *const *exclude;   /* fnmatch patterns on the layer prefix; may be NULL when nexclude is 0 */
    size_t nexclude;
    int no_default_excludes;      /* 1: do not add "*lm_head" and "*embed*" */
    nb_ckpt_progress progress;    /* may be NULL */
    void *progress_user;
    nb_ckpt_device device;        /* where to quantize */
    int32_t allow_empty;          /* 1: a checkpoint with nothing to quantize is copied (else refused) */
    int32_t method;               /* nb_quant_method: RTN, or MSE (host only: device AUTO then quantizes on
                                   * the CPU, device GPU is NB_ERR_UNSUPPORTED; FP4 formats only), or HQQ
                                   * (INT4_HQQ only: hqq's optimizer) */
    /* Integer formats (int4, int4_sym, int8): the group, 0 for the format's default
     * (128), 32, 64, 128, or NB_CKPT_GROUP_PER_CHANNEL (one group per row,
     * compressed-tensors' "channel" strategy); INT4_HQQ: 0 for 64, 32 or
     * 128; NF4 / BNB_FP4: the block, 0 for 64, or 32, 128, 256, ..., 4096;
     * must be 0 for the FP4 formats, whose group is fixed. */
    int32_t group_size;
    /* Integer formats (and INT4_HQQ): the scales' nb_scale_type, 0 for the
     * default (F16), NB_SCALE_F16 or NB_SCALE_BF16; must be 0 for the FP4 and
     * table formats. */
    int32_t scale_type;
    /* Formats with a tensor scale (NVFP4): 1 (the default): the projections
     * engines fuse (P.q_proj / P.k_proj / P.v_proj, P.gate_proj / P.up_proj
     * of one module P) share one tensor scale, the one their rows quantized
     * as one weight would get (ModelOpt's export does the same), so they can
     * run as one layer; 0: each layer its own. */
    int32_t fused_scales;
    int32_t reserved[3];
} nb_ckpt_quantize_opts;

/* nb_ckpt_quantize_opts.group_size: one group per row (group = K of each weight). */
#define NB_CKPT_GROUP_PER_CHANNEL (-1)

/* format NVFP4, mx_rule EVEN, no extra excludes, default excludes on, no
 * progress, device AUTO, allow_empty 0, method RTN, group_size and
 * scale_type 0 (the format's defaults), fused_scales 1, reserved zero. */
NB_API nb_status nb_ckpt_quantize_opts_init(nb_ckpt_quantize_opts *o);

typedef struct nb_ckpt_quantize_summary {
    size_t tensors_in;        /* input tensors */
    size_t layers_quantized;  /* P.weight tensors quantized */
    size_t tensors_copied;    /* input tensors copied unchanged */
    size_t weights_excluded;  /* float rank-2 *.weight left unquantized (pattern, K, collision) */
    size_t shards;            /* safetensors files written */
    size_t files_copied;      /* other files copied byte for byte */
    uint64_t bytes_in;        /* tensor data bytes read */
    uint64_t bytes_out;       /* bytes of the safetensors files written */
    nb_ckpt_device device;    /* where the weights were quantized: CPU or GPU */
    char device_name[256];    /* "host" or the GPU's name */
    int32_t weights_unsupported; /* rank-2 *.weight tensors of a dtype that is not quantized (copied) */
    int32_t experts_quantized;   /* gpt-oss experts tensors quantized (also counted in layers_quantized) */
    int32_t reserved[6];
} nb_ckpt_quantize_summary;

/* Quantize checkpoint `in` (as nb_ckpt_open takes it) into directory `out`.
 *   NB_ERR_INVALID_ARGUMENT  bad options (a value that is not a format, an
 *                            unknown rule or device, a group or scale type
 *                            the format does not take, reserved not zero),
 *                            `out` exists and is not an empty directory, a
 *                            tensor with a non-finite value;
 *   NB_ERR_UNSUPPORTED       a format without a checkpoint layout here;
 *                            method MSE or device GPU with an integer format;
 *                            nothing to quantize (without allow_empty);
 *   NB_ERR_NO_DEVICE         device GPU without a usable CUDA device;
 *   NB_ERR_CUDA              a CUDA failure on the GPU path;
 *   NB_ERR_IO / NB_ERR_NOT_FOUND  `in` missing or unreadable, `out` not writable;
 *   NB_ERR_CORRUPT / NB_ERR_OVERFLOW  malformed input (safetensors or config.json);
 *   NB_ERR_OUT_OF_MEMORY     host memory, or device memory for one tensor.
 * summary may be NULL; it is filled on success only. */
NB_API nb_status nb_ckpt_quantize(const char *in, const char *out, const nb_ckpt_quantize_opts *opts,
                                  nb_ckpt_quantize_summary *summary);
/* The formats nb_ckpt_quantize writes a checkpoint layout for (ModelOpt
 * NVFP4, Quark MXFP4, compressed-tensors INT4, INT4_SYM and INT8): *count receives how many, at most `max` are written
 * (formats may be NULL when max is 0). */
NB_API nb_status nb_ckpt_quantize_formats(nb_format *formats, size_t max, size_t *count);

/* ================================================================= convert
 *
 * nb_ckpt_convert rewrites a 4-bit checkpoint in another layout without
 * touching a code or block-scale byte.
 *
 * WHAT GOES WHERE (source layers as nb_ckpt_open detects them)
 *   target modelopt            from modelopt-nvfp4 (unchanged), ct-nvfp4
 *   target compressed-tensors  from ct-nvfp4, ct-mxfp4 (unchanged), modelopt-nvfp4,
 *                              quark-mxfp4, gptoss-mxfp4
 *   target quark               from quark-mxfp4 (unchanged), ct-mxfp4, gptoss-mxfp4
 * Anything else (NVFP4 to Quark, MXFP4 to ModelOpt, an inconsistent layer,
 * NVFP4 and MXFP4 layers in one compressed-tensors output, a checkpoint with
 * no 4-bit layer) is NB_ERR_UNSUPPORTED, named in the message, before OUT is
 * touched.
 *
 * RENAMES (P = layer prefix; dtypes kept):
 *   modelopt  P.weight        P.weight_scale  P.weight_scale_2 F32 []   P.input_scale F32 []
 *   ct        P.weight_packed P.weight_scale  P.weight_global_scale F32 [1]
 *                                                                     P.input_global_scale F32 [1]
 *   quark     P.weight        P.weight_scale
 *   gptoss    P_blocks [E,R,K/32,16] / P_scales [E,R,K/32] (also P.blocks / P.scales)
 *             -> one layer per expert e, prefix Q(e) = P with "e." inserted
 *             before its last component ("model.layers.0.mlp.experts.3.down_proj"):
 *             codes [R,K/2] and scales [R,K/32] are expert e's bytes unchanged;
 *             a P_bias / P.bias [E,R] next to it becomes Q(e).bias [R].  The
 *             gate_up rows stay interleaved (gate = even rows, up = odd rows),
 *             as gpt-oss's swiglu reads them.  There is no way back to gpt-oss.
 *
 * THE RECIPROCAL TENSOR SCALE: compressed-tensors stores 1/weight_scale_2
 * (and 1/input_scale); nibble reads a ct layer's tensor scale as 1.0f / g.
 * ModelOpt -> ct writes g = fl(1/s); when fl(1/g) != s it tries the floats
 * within 8 ulps of g for one with fl(1/g) == s (nearest to 1/s wins).  Each
 * scale counts as
 *   exact     fl(1/g) == s with g = fl(1/s): dequantization is identical and
 *             converting back restores the bytes;
 *   adjusted  dequantization is identical, but the stored value is not the
 *             plain reciprocal (ModelOpt -> ct), or converting back would not
 *             restore the source's bytes (ct -> ModelOpt);
 *   inexact   no float g has fl(1/g) == s (about one value in seven): g =
 *             fl(1/s) is written, and dequantized values can differ from the
 *             source's by the rounding of one float reciprocal.  A warning
 *             names the tensor; opts.strict makes it NB_ERR_UNSUPPORTED with
 *             "(strict)" in the message.
 * ct -> ModelOpt writes s = fl(1/g), exactly the tensor scale nibble reads
 * from the ct layer.  A scale that is zero, NaN or infinite has no
 * reciprocal and is NB_ERR_UNSUPPORTED.
 *
 * CONFIGS: hf_quant_config.json is written for the modelopt target and not
 * copied otherwise; config.json (when the input has one) gets the target's
 * quantization_config, whose exclude / ignore list names every unquantized
 * linear layer explicitly (the source's patterns are not carried over).  When
 * the source already declares the target format, both files are copied
 * unchanged.  A KV-cache scheme is not translated (a warning says so).
 *
 * GGUF INPUT (a file that starts with "GGUF"): the tensors of one GGUF file
 * become OUT/model.safetensors, plus OUT/hf_quant_config.json for the
 * modelopt target.  The GGUF metadata is not converted (no config.json; a
 * note says so); tensor names stay GGUF's; shapes are row-major.  A 4-bit
 * tensor T becomes layer P = T without ".weight"; expert e of a 3-D tensor
 * becomes layer P.e:
 *   MXFP4 (ggml type 39)  quark: P.weight U8 [N,K/2], P.weight_scale U8
 *                         [N,K/32]; ct: P.weight_packed, P.weight_scale;
 *   NVFP4 (type 40)       modelopt: P.weight, P.weight_scale F8_E4M3 [N,K/16],
 *                         P.weight_scale_2 F32 [] (the GGUF tensor P.scale,
 *                         one value or one per expert; 1 without it),
 *                         P.input_scale F32 [] (from P.input_scale, when
 *                         present); ct: P.weight_packed, P.weight_scale,
 *                         P.weight_global_scale [1], P.input_global_scale [1]
 *                         (reciprocals, classified as above).
 * Codes and scales are imported as nb_gguf_fp4_to_checkpoint does (below).
 * F32, F16, BF16, F64, I8, I16, I32 and I64 tensors are copied byte for
 * byte.  Any other type (Q4_0, Q8_0, the K-, I- and T-quants, ...) has no
 * lossless safetensors form: NB_ERR_UNSUPPORTED naming the tensor and its
 * type, unless opts.skip_unsupported, which leaves it out, counts it in
 * tensors_skipped and passes its name to opts.skipped.
 *
 * OUTPUT follows nb_ckpt_quantize (crash consistency included): OUT must not
 * exist or be empty; one output file per input file with the same name, the
 * index when the input is sharded, every other regular file copied byte for
 * byte, streaming one tensor at a time; OUT is as it was or complete.  Tensor files come out in
 * nb_st_write's layout, so converting A -> B -> A reproduces A's files byte
 * for byte when A was written in that layout and every scale was exact. */

/* Explicit values, append only. */
typedef enum nb_ckpt_target {
    NB_CKPT_TARGET_MODELOPT = 1,
    NB_CKPT_TARGET_CT = 2, /* compressed-tensors */
    NB_CKPT_TARGET_QUARK = 3
} nb_ckpt_target;

/* "modelopt", "compressed-tensors", "quark" (NB_ERR_INVALID_ARGUMENT for
 * another value).  Parse accepts those and "ct"; NB_ERR_NOT_FOUND otherwise. */
NB_API nb_status nb_ckpt_target_name(nb_ckpt_target t, const char **name);
NB_API nb_status nb_ckpt_target_parse(const char *s, nb_ckpt_target *out);

/* One line per warning or note ("warning: ..." / "note: ..."). */
typedef void (*nb_ckpt_warn)(void *user, const char *msg);
/* A GGUF tensor left out by skip_unsupported: its name and ggml type name. */
typedef void (*nb_ckpt_skip)(void *user, const char *name, const char *type);

typedef struct nb_ckpt_convert_opts {
    nb_ckpt_target target;
    int strict;                  /* an inexact reciprocal fails the conversion */
    nb_ckpt_progress progress;   /* may be NULL; name = output tensor */
    void *progress_user;
    nb_ckpt_warn warn;           /* may be NULL */
    void *warn_user;
    int skip_unsupported;        /* GGUF: leave out tensors of other quantized types */
    nb_ckpt_skip skipped;        /* may be NULL */
    void *skipped_user;
    int32_t reserved[8];
} nb_ckpt_convert_opts;

/* target compressed-tensors, not strict, no callbacks, reserved zero. */
NB_API nb_status nb_ckpt_convert_opts_init(nb_ckpt_convert_opts *o);

typedef struct nb_ckpt_convert_summary {
    size_t tensors_in, tensors_out;
    size_t layers_converted;   /* 4-bit layers renamed into the target layout (gpt-oss: per input layer) */
    size_t layers_unchanged;   /* 4-bit layers already in the target layout */
    size_t experts_split;      /* per-expert layers written from gpt-oss layers */
    size_t layers_unquantized; /* unquantized linear layers (copied, listed as excluded) */
    size_t tensors_copied;     /* input tensors copied unchanged under their own name */
    size_t scales_exact, scales_adjusted, scales_inexact; /* reciprocal tensor / input scales */
    size_t warnings;
    size_t shards, files_copied;
    uint64_t bytes_in, bytes_out;
    int gguf;                    /* the input was a GGUF file */
    size_t tensors_skipped;      /* GGUF tensors left out (skip_unsupported) */
    size_t scale_bytes_remapped; /* GGUF NVFP4 scale bytes rewritten to the same value's E4M3 byte */
    int32_t reserved[8];
} nb_ckpt_convert_summary;

/* Convert checkpoint `in` (as nb_ckpt_open takes it, or a GGUF file) into
 * directory `out`.  NB_ERR_UNSUPPORTED (see above), NB_ERR_INVALID_ARGUMENT
 * (bad options, OUT not empty, two output tensors with one name),
 * NB_ERR_IO / NB_ERR_NOT_FOUND / NB_ERR_CORRUPT / NB_ERR_OVERFLOW (input or
 * output files), NB_ERR_OUT_OF_MEMORY.  summary may be NULL; it is filled on
 * success only. */
NB_API nb_status nb_ckpt_convert(const char *in, const char *out, const nb_ckpt_convert_opts *opts,
                                 nb_ckpt_convert_summary *summary);

/* ==================================================================== GGUF
 *
 * FORMAT (llama.cpp / ggml; little-endian): "GGUF", u32 version (2 or 3),
 * u64 n_tensors, u64 n_kv; n_kv key/value pairs (string key, u32 value type,
 * value); n_tensors tensor infos (string name, u32 n_dims, u64 ne[n_dims],
 * u32 ggml type, u64 offset); padding to the alignment (general.alignment,
 * default 32); the data section.  A string is u64 length + bytes (no NUL).
 * ne[0] is the contiguous dimension: a [N, K] weight has ne = {K, N}; `shape`
 * is the row-major order (shape[0] = ne[n_dims-1]).
 *
 * RULES (each failure names the file, the key or tensor, and the rule):
 *   NB_ERR_CORRUPT      shorter than the header; bad magic; a count, string,
 *                       array or tensor info running past the end; a key that
 *                       is empty, longer than NB_GGUF_MAX_KEY, not UTF-8 or
 *                       given twice; a value type outside 0..12; an array of
 *                       arrays; a string value that is not UTF-8;
 *                       general.alignment not a UINT32 power of two; a tensor
 *                       name that is empty, longer than NB_GGUF_MAX_NAME or
 *                       given twice; n_dims outside 1..4; a negative
 *                       dimension; an unknown or retired ggml type; ne[0] not
 *                       a multiple of the type's block; an offset that is not
 *                       a multiple of the alignment; data past the end;
 *                       tensors that overlap or leave a gap larger than the
 *                       padding; bytes after the last tensor's padding;
 *   NB_ERR_OVERFLOW     element or byte counts that overflow 64 bits;
 *   NB_ERR_UNSUPPORTED  version 1, a version above 3, a big-endian file.
 * Tensor data is not validated (as in ggml); the import says what it does
 * with every byte.  Keys, names and scalar string values are copied
 * (NUL-terminated) into the handle. */

#define NB_GGUF_MAX_DIMS 4
#define NB_GGUF_MAX_NAME 63   /* bytes of a tensor name (ggml's GGML_MAX_NAME - 1) */
#define NB_GGUF_MAX_KEY 65535 /* bytes of a key */
#define NB_GGUF_DEFAULT_ALIGNMENT 32

/* GGUF value types (their values in the file). */
typedef enum nb_gguf_vtype {
    NB_GGUF_UINT8 = 0, NB_GGUF_INT8 = 1, NB_GGUF_UINT16 = 2, NB_GGUF_INT16 = 3, NB_GGUF_UINT32 = 4,
    NB_GGUF_INT32 = 5, NB_GGUF_FLOAT32 = 6, NB_GGUF_BOOL = 7, NB_GGUF_STRING = 8, NB_GGUF_ARRAY = 9,
    NB_GGUF_UINT64 = 10, NB_GGUF_INT64 = 11, NB_GGUF_FLOAT64 = 12
} nb_gguf_vtype;

/* ggml type numbers this module names (ggml.h's enum ggml_type). */
#define NB_GGML_TYPE_F32 0
#define NB_GGML_TYPE_F16 1
#define NB_GGML_TYPE_BF16 30
#define NB_GGML_TYPE_MXFP4 39
#define NB_GGML_TYPE_NVFP4 40

typedef struct nb_gguf_kv {
    const char *key;
    nb_gguf_vtype type;
    nb_gguf_vtype elem_type; /* arrays: the element type; else type */
    uint64_t count;          /* arrays: elements; 1 otherwise */
    const char *str;         /* STRING: the value, a NUL-terminated copy; NULL otherwise */
    const uint8_t *data;     /* the raw little-endian value in the file (arrays: the first element) */
    uint64_t bytes;          /* bytes of the raw value */
    int32_t reserved[4];
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
    int32_t reserved[4];
} nb_gguf_tensor;

typedef struct nb_gguf_header {
    uint32_t version, alignment;
    uint64_t data_offset; /* file offset of the data section (may be past the end without tensors) */
    size_t n_kv, n_tensors;
    int32_t reserved[4];
} nb_gguf_header;

typedef struct nb_gguf_file nb_gguf_file;

/* ggml type name ("MXFP4") and block size / bytes per block;
 * NB_ERR_NOT_FOUND for an unknown or retired type.  name, block, bytes may
 * be NULL. */
NB_API nb_status nb_ggml_type_name(uint32_t type, const char **name);
NB_API nb_status nb_ggml_type_size(uint32_t type, int64_t *block, int64_t *bytes);
/* The nibble format a ggml type imports as (39 -> MXFP4, 40 -> NVFP4);
 * NB_ERR_UNSUPPORTED for any other type. */
NB_API nb_status nb_ggml_type_format(uint32_t type, nb_format *out);
/* "UINT8" ... "FLOAT64"; NB_ERR_INVALID_ARGUMENT for another value. */
NB_API nb_status nb_gguf_vtype_name(nb_gguf_vtype t, const char **name);

NB_API nb_status nb_gguf_open(const char *path, nb_gguf_file **out);
/* Validate an image in memory without copying it (data must outlive the
 * handle); label names it in messages (NULL: "<memory>"). */
NB_API nb_status nb_gguf_open_memory(const void *data, size_t size, const char *label, nb_gguf_file **out);
NB_API nb_status nb_gguf_close(nb_gguf_file *g); /* NULL accepted */

NB_API nb_status nb_gguf_get_header(const nb_gguf_file *g, nb_gguf_header *out);
/* Key/value pairs in file order; find by key (NB_ERR_NOT_FOUND). */
NB_API nb_status nb_gguf_kv_at(const nb_gguf_file *g, size_t i, nb_gguf_kv *out);
NB_API nb_status nb_gguf_kv_find(const nb_gguf_file *g, const char *key, nb_gguf_kv *out);
/* Tensors in file (info) order; find by name (NB_ERR_NOT_FOUND). */
NB_API nb_status nb_gguf_tensor_at(const nb_gguf_file *g, size_t i, nb_gguf_tensor *out);
NB_API nb_status nb_gguf_tensor_find(const nb_gguf_file *g, const char *name, size_t *index);

/* IMPORT: a type-39 or type-40 tensor with n_dims 2 (ne = {K, N}: one
 * weight) or 3 (ne = {K, N, E}: E experts) becomes nibble's checkpoint
 * layout (codes [N, K/2], low nibble = element 2j; scales [N, K/group]):
 *   MXFP4  block {u8 e; u8 qs[16]} per 32 elements: qs[j] holds element j
 *          (low nibble) and j+16 (high); e is E8M0 and is copied as is (0xFF
 *          stays NaN).  tensor_scale 1.
 *   NVFP4  block {u8 d[4]; u8 qs[32]} per 64 elements: qs[8s+j] holds element
 *          16s+j (low) and 16s+j+8 (high); d[s] is ggml's unsigned E4M3,
 *          whose value nibble's E4M3 byte keeps: bit 7 (ignored by ggml) is
 *          cleared and 0x7F (ggml: zero) becomes 0x00; both are counted in
 *          *remapped.  0xFF (ggml: 480, not an E4M3 value) is
 *          NB_ERR_UNSUPPORTED.  tensor_scale: the F32 tensor named like the
 *          weight with ".weight" replaced by ".scale" (llama.cpp's
 *          converter), one value or one per expert; 1 when there is none.
 * Other types, and other ranks: NB_ERR_UNSUPPORTED. */
typedef struct nb_gguf_fp4 {
    nb_format format;
    int64_t n, k, experts;            /* experts 0 for a 2-D tensor */
    int64_t scale_tensor;             /* index of the ".scale" tensor, -1 when none (tensor scale 1) */
    size_t codes_bytes, scales_bytes; /* per expert */
    int32_t reserved[4];
} nb_gguf_fp4;

NB_API nb_status nb_gguf_fp4_info(const nb_gguf_file *g, size_t i, nb_gguf_fp4 *out);
/* Expert `expert` (0 for a 2-D tensor) of tensor i into codes / scales (host
 * buffers of codes_cap / scales_cap bytes; NB_ERR_BUFFER_TOO_SMALL when
 * short); *desc is ready for nb_dequantize_host.  remapped may be NULL. */
NB_API nb_status nb_gguf_fp4_to_checkpoint(const nb_gguf_file *g, size_t i, int64_t expert, nb_weight_desc *desc,
                                           uint8_t *codes, size_t codes_cap, uint8_t *scales, size_t scales_cap,
                                           size_t *remapped);

#ifdef __cplusplus
}
#endif
#endif /* NIBBLE_IO_H */
