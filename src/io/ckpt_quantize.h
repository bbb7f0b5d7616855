/* ckpt_quantize.h - quantize a BF16/F16/F32 safetensors checkpoint into a
 * ModelOpt-compatible NVFP4 or a Quark-compatible MXFP4 checkpoint
 * (docs/formats.md 2.2-2.3 and 3.3).  Internal API of nibble_io; `nibble
 * quantize` is a thin wrapper over nb_ckpt_quantize.
 *
 * WHAT IS QUANTIZED: a tensor named "P.weight" (P not empty) of rank 2, dtype
 * BF16, F16 or F32, with N, K > 0 and K a multiple of the group (16 NVFP4, 32
 * MXFP4), whose prefix P matches no exclude pattern, and for which the input
 * has no P.weight_scale / P.weight_scale_2 already.  Patterns are shell
 * wildcards matched with fnmatch(pattern, P, 0) ('*' also crosses dots).
 * Unless no_default_excludes is set, "*lm_head" and "*embed*" are excluded
 * (output head and embeddings).  Every other tensor is copied unchanged.
 *
 * OUTPUT (directory `out`, which must not exist or be empty; created 0755):
 *   NVFP4: P.weight U8 [N,K/2], P.weight_scale F8_E4M3 [N,K/16],
 *          P.weight_scale_2 F32 [] (nb_quantize_host's tensor scale);
 *          hf_quant_config.json; config.json (when the input has one) with a
 *          ModelOpt quantization_config.  No P.input_scale is written (there is
 *          no activation calibration).
 *   MXFP4: P.weight U8 [N,K/2], P.weight_scale U8 [N,K/32] (E8M0);
 *          config.json (when the input has one) with a Quark
 *          quantization_config whose scale_calculation_mode names the rule.
 *   One output safetensors file per input file, with the same base name, and
 *   the index (same base name as the input's) when the input is sharded.
 *   Every other regular file in the input's directory (tokenizer files,
 *   generation_config.json, ...) is copied byte for byte, except other
 *   *.safetensors / *.safetensors.index.json files and an input
 *   hf_quant_config.json (replaced or dropped); subdirectories are skipped.
 *   The input is never modified.  On failure every file this call created is
 *   removed (and `out` itself when this call created it).
 *
 * MEMORY: tensors are streamed one at a time (see ckpt_quantize.c): each
 * output file's header is computed from shapes alone, then every tensor is
 * quantized (or copied) from the input mapping and pwrite'n at its offset, so
 * at most one source tensor's codes and scales are held; the source pages are
 * dropped from the mapping after use.
 *
 * DEVICE: opts.device picks where each weight is quantized: the C reference
 * (nb_quantize_host) on the CPU, or CUDA device 0 (nb_quantize_staged: the
 * tensor is copied from the mapping to device memory, quantized by
 * nb_quantize, and its codes and scales copied back; device memory for one
 * tensor at a time).  Both write the same bytes (tests/test_gpu_quantize.c).
 * AUTO takes the GPU when libnibble was built with CUDA and a device can be
 * opened, the CPU otherwise; GPU without one is NB_ERR_NO_DEVICE before OUT
 * is touched.  summary.device says which ran.
 */
#ifndef NB_IO_CKPT_QUANTIZE_H
#define NB_IO_CKPT_QUANTIZE_H

#include "nibble.h"

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* Called before each input tensor (i counts from 0) and once at the end with
 * i == n; bytes are input tensor bytes processed so far and in total. */
typedef void (*nb_ckpt_quantize_progress)(void *user, size_t i, size_t n, uint64_t bytes_done,
                                          uint64_t bytes_total, const char *name);

/* Where nb_ckpt_quantize quantizes (explicit values, append only). */
typedef enum nb_ckpt_device {
    NB_CKPT_DEVICE_AUTO = 0, /* CUDA device 0 when there is one (and libnibble has CUDA), else the CPU */
    NB_CKPT_DEVICE_CPU = 1,  /* nb_quantize_host, the C reference */
    NB_CKPT_DEVICE_GPU = 2   /* nb_quantize_staged on CUDA device 0, or NB_ERR_NO_DEVICE */
} nb_ckpt_device;

/* "auto", "cpu", "gpu" (NULL for another value); parse: NB_ERR_NOT_FOUND for
 * another string. */
const char *nb_ckpt_device_name(nb_ckpt_device d);
nb_status nb_ckpt_device_parse(const char *s, nb_ckpt_device *out);

typedef struct nb_ckpt_quantize_opts {
    nb_format format;              /* NB_FORMAT_NVFP4 or NB_FORMAT_MXFP4 */
    nb_mx_scale_rule mx_rule;      /* MXFP4 only; NB_MX_SCALE_EVEN is Quark's default */
    const char *const *exclude;    /* fnmatch patterns on the layer prefix; may be NULL */
    size_t nexclude;
    int no_default_excludes;       /* 1: do not add "*lm_head" and "*embed*" */
    nb_ckpt_quantize_progress progress; /* may be NULL */
    void *progress_user;
    nb_ckpt_device device;         /* where to quantize (AUTO) */
} nb_ckpt_quantize_opts;

/* format NVFP4, mx_rule EVEN, no extra excludes, defaults on, no progress,
 * device AUTO. */
void nb_ckpt_quantize_opts_init(nb_ckpt_quantize_opts *o);

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
} nb_ckpt_quantize_summary;

/* Quantize checkpoint `in` (a .safetensors file, a directory holding
 * model.safetensors.index.json or model.safetensors, or an index *.json) into
 * directory `out`.  Errors (message in err):
 *   NB_ERR_INVALID_ARGUMENT  bad options, `out` exists and is not an empty
 *                            directory, a tensor with a non-finite value;
 *   NB_ERR_NO_DEVICE         device GPU without a usable CUDA device;
 *   NB_ERR_CUDA              a CUDA failure on the GPU path;
 *   NB_ERR_IO / NB_ERR_NOT_FOUND  `in` missing or unreadable, `out` not writable;
 *   NB_ERR_CORRUPT / NB_ERR_OVERFLOW  malformed input (safetensors or config.json);
 *   NB_ERR_OUT_OF_MEMORY     host memory, or device memory for one tensor.
 * summary may be NULL. */
nb_status nb_ckpt_quantize(const char *in, const char *out, const nb_ckpt_quantize_opts *opts,
                           nb_ckpt_quantize_summary *summary, char *err, size_t errlen);

#ifdef __cplusplus
}
#endif
#endif
