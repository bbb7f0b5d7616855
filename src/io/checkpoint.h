/* checkpoint.h - open a Hugging Face style checkpoint (one safetensors file,
 * a directory, or a sharded index), read its quantization config, and
 * classify every linear layer by the tensor names, dtypes and shapes of
 * docs/formats.md sections 2 and 3.  Internal API of the static library
 * nibble_io (like safetensors.h); needs cJSON.
 *
 * WHAT IS A LAYER (prefix P; the tensor that anchors the layer in brackets):
 *   modelopt-nvfp4 [P.weight]         P.weight U8 [N,K/2], P.weight_scale F8_E4M3
 *                                     [N,K/16], P.weight_scale_2 F32 scalar,
 *                                     optional P.input_scale F32 scalar
 *   ct-nvfp4       [P.weight_packed]  P.weight_packed U8 [N,K/2], P.weight_scale
 *                                     F8_E4M3 [N,K/16], P.weight_global_scale F32 [1]
 *   ct-mxfp4       [P.weight_packed]  P.weight_packed U8 [N,K/2], P.weight_scale
 *                                     U8 [N,K/32], no global scale
 *   quark-mxfp4    [P.weight]         P.weight U8 [N,K/2], P.weight_scale U8 [N,K/32]
 *   gptoss-mxfp4   [P_blocks/P.blocks] P_blocks U8 [E,R,K/32,16], P_scales U8
 *                                     [E,R,K/32]  (n = R, experts = E)
 *   none           [P.weight]         BF16/F16/F32, rank 2, no P.weight_scale
 *                                     (unquantized linear; embeddings count too)
 * "Scalar" accepts shape [] or [1].  MXFP4 scale bytes may also be typed
 * F8_E8M0.  Anything else that claims one of these layouts (a U8 P.weight or
 * a P.weight_scale, a P.weight_packed, a P_blocks or P_scales) and breaks a
 * rule - a missing member, a wrong dtype, K/2 vs K/16 or K/32 columns that do
 * not agree, rows that differ, K not a multiple of the group, a zero or
 * non-finite weight_global_scale - is NB_CKPT_INCONSISTENT, with the reason
 * in `problem`.  Nothing is guessed.  Other tensors (norms, biases, 1-D
 * weights, FP8 k_scale, ...) belong to no layer.
 *
 * CONFIG: hf_quant_config.json ("quantization.quant_algo") and config.json
 * ("quantization_config": quant_method, quant_algo, format) next to the
 * checkpoint are read when present (at most NB_CKPT_MAX_CONFIG bytes each;
 * larger or malformed JSON fails the open with NB_ERR_CORRUPT).  They give a
 * declared format; the tensors still decide every layer, and the config only
 * cross-checks: a quantized layer whose format differs from the declared one
 * has config_mismatch set and a note in `problem`; `decided_by` says whether
 * the decision rests on the tensors alone or on tensors confirmed by a config
 * file.
 *
 * ERRORS follow safetensors.h: nb_status plus an (err, errlen) message.
 */
#ifndef NB_IO_CHECKPOINT_H
#define NB_IO_CHECKPOINT_H

#include "nibble.h"
#include "safetensors.h"

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#define NB_CKPT_MAX_CONFIG (16u << 20) /* bytes of config.json / hf_quant_config.json */

/* Explicit values, append only. */
typedef enum nb_ckpt_format {
    NB_CKPT_NONE = 0,           /* unquantized (BF16/F16/F32) linear */
    NB_CKPT_MODELOPT_NVFP4 = 1,
    NB_CKPT_CT_NVFP4 = 2,       /* compressed-tensors nvfp4-pack-quantized */
    NB_CKPT_CT_MXFP4 = 3,       /* compressed-tensors mxfp4-pack-quantized */
    NB_CKPT_QUARK_MXFP4 = 4,
    NB_CKPT_GPTOSS_MXFP4 = 5,
    NB_CKPT_INCONSISTENT = 6
} nb_ckpt_format;

/* Where a decision (or the declared format) comes from. */
typedef enum nb_ckpt_source {
    NB_CKPT_SRC_TENSORS = 0,          /* names, dtypes and shapes only (no config says) */
    NB_CKPT_SRC_HF_QUANT_CONFIG = 1,  /* tensors, confirmed by hf_quant_config.json */
    NB_CKPT_SRC_CONFIG_JSON = 2       /* tensors, confirmed by config.json */
} nb_ckpt_source;

/* "none", "modelopt-nvfp4", "ct-nvfp4", "ct-mxfp4", "quark-mxfp4",
 * "gptoss-mxfp4", "inconsistent"; "unknown" otherwise. */
const char *nb_ckpt_format_name(nb_ckpt_format f);
/* "tensors", "hf_quant_config.json", "config.json". */
const char *nb_ckpt_source_name(nb_ckpt_source s);

typedef struct nb_ckpt_layer {
    const char *prefix;       /* "model.layers.0.mlp.down_proj"; valid until close */
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
    const char *excluded_by;  /* the entry that does (valid until close); NULL otherwise */
    nb_ckpt_source excluded_src;
} nb_ckpt_layer;

typedef struct nb_ckpt nb_ckpt;

/* Open `path`: a .safetensors file, a directory holding
 * model.safetensors.index.json (preferred) or model.safetensors, or an index
 * file (*.json).  Reads the configs next to it and classifies every layer. */
nb_status nb_ckpt_open(const char *path, nb_ckpt **out, char *err, size_t errlen);
nb_status nb_ckpt_close(nb_ckpt *c); /* NULL accepted */

/* Files: the index first (when sharded), then every safetensors file, in
 * order of name; bytes from stat. */
nb_status nb_ckpt_file_count(const nb_ckpt *c, size_t *count);
nb_status nb_ckpt_file_at(const nb_ckpt *c, size_t i, const char **path, uint64_t *bytes);

/* Every tensor of the checkpoint, in order of name; `layer` (may be NULL)
 * receives the index of the layer it belongs to, or -1. */
nb_status nb_ckpt_tensor_count(const nb_ckpt *c, size_t *count);
nb_status nb_ckpt_tensor_at(const nb_ckpt *c, size_t i, nb_st_tensor *out, int64_t *layer);

/* Index of the tensor called `name` (NB_ERR_NOT_FOUND when absent). */
nb_status nb_ckpt_tensor_find(const nb_ckpt *c, const char *name, size_t *index);
/* The safetensors files that hold the tensors: one for a single file, the
 * shards (in order of name) for an index; *name is the base name, *file is
 * owned by the checkpoint.  *sharded (may be NULL) says whether an index was
 * opened (nb_ckpt_file_at(c, 0) is then the index file). */
nb_status nb_ckpt_shard_count(const nb_ckpt *c, size_t *count, int *sharded);
nb_status nb_ckpt_shard_at(const nb_ckpt *c, size_t i, const char **name, const nb_st_file **file);
/* The directory the checkpoint (and its configs) lives in; valid until close. */
const char *nb_ckpt_dir(const nb_ckpt *c);

/* Layers, in order of their anchor tensor's name. */
nb_status nb_ckpt_layer_count(const nb_ckpt *c, size_t *count);
nb_status nb_ckpt_layer_at(const nb_ckpt *c, size_t i, nb_ckpt_layer *out);
nb_status nb_ckpt_layer_find(const nb_ckpt *c, const char *prefix, size_t *index);

/* The config: the format it declares (NB_CKPT_NONE when none, or when it
 * names something this module does not map, e.g. MIXED_PRECISION), the file
 * it came from, and the raw strings (NULL when absent; valid until close). */
typedef struct nb_ckpt_config {
    nb_ckpt_format declared;
    nb_ckpt_source source;    /* NB_CKPT_SRC_TENSORS when no config declares */
    const char *quant_method; /* config.json quantization_config.quant_method */
    const char *quant_algo;   /* hf_quant_config.json, else config.json */
    const char *ct_format;    /* config.json quantization_config.format */
    int has_config_json, has_hf_quant_config;
    size_t nexclude;          /* exclude-list entries read (nb_ckpt_exclude_at) */
    const char *note;         /* entries that could not be used, or NULL */
} nb_ckpt_config;
nb_status nb_ckpt_get_config(const nb_ckpt *c, nb_ckpt_config *out);
/* Exclude-list entry i: the pattern as written, where it was read
 * ("config.json quantization_config.ignore"), and whether it is used (a
 * regex regcomp rejects is not). */
nb_status nb_ckpt_exclude_at(const nb_ckpt *c, size_t i, const char **pattern, const char **where, int *usable);
/* The config reading of nb_ckpt_open on texts in memory (either may be NULL
 * with length 0), then whether each of prefixes[0..n) is excluded (for the
 * fuzzer and tests).  Same statuses as nb_ckpt_open's config part. */
nb_status nb_ckpt_config_check_memory(const char *hf_json, size_t hf_len, const char *cfg_json, size_t cfg_len,
                                      const char *const *prefixes, size_t n, int *excluded, char *err,
                                      size_t errlen);

/* The weight of layer i (expert `expert` for gpt-oss, else 0) in nibble's
 * checkpoint layout, zero copy: *codes and *scales point into the file
 * mapping (valid until close) and desc is ready for nb_dequantize_host /
 * nb_pack (format, n, k, group, scale type, tensor_scale; MXFP4 scale_rule
 * says how the producer chose exponents: EVEN for Quark and
 * compressed-tensors, ROUND_UP for gpt-oss - informative only).
 * NB_ERR_UNSUPPORTED for NONE and INCONSISTENT layers, NB_ERR_INVALID_ARGUMENT
 * for an expert out of range, NB_ERR_NOT_FOUND for i out of range. */
nb_status nb_ckpt_layer_weight(const nb_ckpt *c, size_t i, int64_t expert, nb_weight_desc *desc,
                               const uint8_t **codes, const uint8_t **scales, char *err, size_t errlen);

#ifdef __cplusplus
}
#endif
#endif
