/* ckpt_convert.h - convert a 4-bit checkpoint between the layouts of
 * docs/formats.md sections 2 and 3 without touching a code or block-scale
 * byte.  Internal API of nibble_io; `nibble convert` is a thin wrapper.
 *
 * WHAT GOES WHERE (P = layer prefix; source layers as checkpoint.h detects them)
 *   target modelopt            from modelopt-nvfp4 (unchanged), ct-nvfp4
 *   target compressed-tensors  from ct-nvfp4, ct-mxfp4 (unchanged), modelopt-nvfp4,
 *                              quark-mxfp4, gptoss-mxfp4
 *   target quark               from quark-mxfp4 (unchanged), ct-mxfp4, gptoss-mxfp4
 * Anything else (NVFP4 to Quark, MXFP4 to ModelOpt, an inconsistent layer,
 * NVFP4 and MXFP4 layers in one compressed-tensors output, a checkpoint with
 * no 4-bit layer) is NB_ERR_UNSUPPORTED, named in the message, before OUT is
 * touched.
 *
 * RENAMES (codes and block scales are copied byte for byte, dtypes kept):
 *   modelopt  P.weight        P.weight_scale  P.weight_scale_2 F32 []   P.input_scale F32 []
 *   ct        P.weight_packed P.weight_scale  P.weight_global_scale F32 [1]
 *                                                                     P.input_global_scale F32 [1]
 *   quark     P.weight        P.weight_scale
 *   gptoss    P_blocks [E,R,K/32,16] / P_scales [E,R,K/32] (also P.blocks / P.scales)
 *             -> one layer per expert e, prefix Q(e) = P with "e." inserted
 *             before its last component ("model.layers.0.mlp.experts.3.down_proj"):
 *             codes [R,K/2] and scales [R,K/32] are expert e's bytes unchanged
 *             (gpt-oss packs the low nibble first, like the targets); a
 *             P_bias / P.bias [E,R] next to it becomes Q(e).bias [R].  The
 *             gate_up rows stay interleaved (gate = even rows, up = odd rows),
 *             as gpt-oss's swiglu reads them.  One way: there is no per-expert
 *             -> gpt-oss direction.
 *
 * THE RECIPROCAL TENSOR SCALE: compressed-tensors stores 1/weight_scale_2
 * (and 1/input_scale); nibble reads a ct layer's tensor scale as 1.0f / g.
 * ModelOpt -> ct writes g = fl(1/s); when fl(1/g) != s it tries the floats
 * within 8 ulps of g for one with fl(1/g) == s (nearest to 1/s wins).  Every
 * scale is counted as
 *   exact     fl(1/g) == s with g = fl(1/s): dequantization is identical and
 *             converting back restores the bytes;
 *   adjusted  dequantization is identical, but the stored value is not the
 *             plain reciprocal (ModelOpt -> ct), or converting back would not
 *             restore the source's bytes (ct -> ModelOpt);
 *   inexact   no float g has fl(1/g) == s (about one value in seven): g =
 *             fl(1/s) is written, and dequantized values can differ from the
 *             source's by the rounding of one float reciprocal (at most one
 *             unit in the last place of the tensor scale).  A warning names
 *             the tensor; opts.strict makes it NB_ERR_UNSUPPORTED instead.
 * ct -> ModelOpt writes s = fl(1/g), which is exactly the tensor scale nibble
 * reads from the ct layer, so dequantization is always identical.  A scale
 * that is zero, negative zero, NaN or infinite has no reciprocal in a valid
 * ct layer and is NB_ERR_UNSUPPORTED.
 *
 * CONFIGS: hf_quant_config.json is written for the modelopt target and not
 * copied otherwise; config.json (when the input has one) gets the target's
 * quantization_config (ckpt_out.c), whose exclude / ignore list names every
 * unquantized linear layer of the checkpoint explicitly (the source's
 * patterns are not carried over: they may not be expressible in the target's
 * syntax).  When the source already declares the target format, both files
 * are copied unchanged.  A KV-cache scheme is not translated (a warning says
 * so); k_scale / v_scale tensors are copied unchanged.
 *
 * GGUF INPUT (a file that starts with "GGUF"; ckpt_gguf.c): the tensors of
 * one GGUF file become OUT/model.safetensors, plus OUT/hf_quant_config.json
 * for the modelopt target.  The GGUF metadata is not converted (there is no
 * config.json; a note says so); tensor names stay GGUF's; shapes are ne in
 * reverse (row-major: ne = {K, N} -> [N, K]).  A 4-bit tensor T becomes layer
 * P = T without ".weight" (T itself without that suffix); expert e of a 3-D
 * tensor (ne = {K, N, E}) becomes layer P.e:
 *   MXFP4 (ggml type 39)  quark: P.weight U8 [N,K/2], P.weight_scale U8
 *                         [N,K/32]; ct: P.weight_packed, P.weight_scale;
 *   NVFP4 (type 40)       modelopt: P.weight, P.weight_scale F8_E4M3 [N,K/16],
 *                         P.weight_scale_2 F32 [] (the GGUF tensor P.scale,
 *                         one value or one per expert; 1 without it),
 *                         P.input_scale F32 [] (from P.input_scale, when
 *                         present); ct: P.weight_packed, P.weight_scale,
 *                         P.weight_global_scale [1], P.input_global_scale [1]
 *                         (reciprocals, classified as above).  P.scale and
 *                         P.input_scale are folded in, not copied.
 * Codes leave GGUF's per-block nibble order for the checkpoint order (low
 * nibble = element 2j); E8M0 bytes are copied; ggml's unsigned E4M3 bytes
 * become the E4M3 byte of the same value (bit 7 cleared, 0x7F -> 0x00:
 * counted in scale_bytes_remapped, one note), and 0xFF (480 to ggml, not an
 * E4M3 value) is NB_ERR_UNSUPPORTED while writing (OUT is then removed).  So
 * every converted layer dequantizes to the GGUF tensor's values bit for bit
 * (ct NVFP4: when its reciprocal scales are exact).  F32, F16, BF16, F64, I8,
 * I16, I32 and I64 tensors are copied byte for byte.  Any other type (Q4_0,
 * Q8_0, the K-, I- and T-quants, ...) has no lossless safetensors form: it is
 * NB_ERR_UNSUPPORTED naming the tensor and its type, unless
 * opts.skip_unsupported, which leaves it out, counts it in tensors_skipped
 * and passes its name to opts.skipped.  The target rules above hold (NVFP4 to
 * modelopt or ct, MXFP4 to quark or ct, not both in one ct output, at least
 * one 4-bit tensor).
 *
 * OUTPUT follows nb_ckpt_quantize: OUT must not exist or be empty; one output
 * file per input file with the same name, the index when the input is
 * sharded, every other regular file copied byte for byte, streaming one
 * tensor at a time, nothing left in OUT on failure.  Tensor files come out in
 * nb_st_write's layout, so converting A -> B -> A reproduces A's safetensors
 * files byte for byte when A was written in that layout and every scale was
 * exact (ModelOpt's weight_scale_2 comes back as shape []).
 */
#ifndef NB_IO_CKPT_CONVERT_H
#define NB_IO_CKPT_CONVERT_H

#include "ckpt_quantize.h" /* nb_ckpt_quantize_progress */
#include "nibble.h"

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* Explicit values, append only. */
typedef enum nb_ckpt_target {
    NB_CKPT_TARGET_MODELOPT = 1,
    NB_CKPT_TARGET_CT = 2,      /* compressed-tensors */
    NB_CKPT_TARGET_QUARK = 3
} nb_ckpt_target;

/* "modelopt", "compressed-tensors", "quark"; NULL for an unknown value.  Parse
 * accepts those and "ct"; NB_ERR_NOT_FOUND otherwise. */
const char *nb_ckpt_target_name(nb_ckpt_target t);
nb_status nb_ckpt_target_parse(const char *s, nb_ckpt_target *out);

/* One line per warning or note ("warning: ..." / "note: ..."). */
typedef void (*nb_ckpt_convert_warn)(void *user, const char *msg);
/* A GGUF tensor left out by skip_unsupported: its name and ggml type name. */
typedef void (*nb_ckpt_convert_skip)(void *user, const char *name, const char *type);

typedef struct nb_ckpt_convert_opts {
    nb_ckpt_target target;
    int strict;                          /* an inexact reciprocal fails the conversion */
    nb_ckpt_quantize_progress progress;  /* may be NULL; name = output tensor */
    void *progress_user;
    nb_ckpt_convert_warn warn;           /* may be NULL */
    void *warn_user;
    int skip_unsupported;                /* GGUF: leave out tensors of other quantized types */
    nb_ckpt_convert_skip skipped;        /* may be NULL */
    void *skipped_user;
} nb_ckpt_convert_opts;

/* target compressed-tensors, not strict, no callbacks. */
void nb_ckpt_convert_opts_init(nb_ckpt_convert_opts *o);

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
    int gguf;                   /* the input was a GGUF file */
    size_t tensors_skipped;     /* GGUF tensors left out (skip_unsupported) */
    size_t scale_bytes_remapped; /* GGUF NVFP4 scale bytes rewritten to the same value's E4M3 byte */
} nb_ckpt_convert_summary;

/* Convert checkpoint `in` (as nb_ckpt_open takes it, or a GGUF file) into directory `out`.
 * Errors (message in err): NB_ERR_UNSUPPORTED (see above), NB_ERR_INVALID_ARGUMENT
 * (bad options, OUT not empty, two output tensors with one name),
 * NB_ERR_IO / NB_ERR_NOT_FOUND / NB_ERR_CORRUPT / NB_ERR_OVERFLOW (input or
 * output files), NB_ERR_OUT_OF_MEMORY.  summary may be NULL. */
nb_status nb_ckpt_convert(const char *in, const char *out, const nb_ckpt_convert_opts *opts,
                          nb_ckpt_convert_summary *summary, char *err, size_t errlen);

/* Shared by ckpt_convert.c and ckpt_gguf.c (not exported). */
#define NB_CKPT_CONVERT_HIDDEN __attribute__((visibility("hidden")))
/* A "note: " / "warning: " line through o->warn, counted in sum->warnings. */
void nbio_convert_warn(const nb_ckpt_convert_opts *o, nb_ckpt_convert_summary *sum, const char *fmt, ...)
    __attribute__((format(printf, 3, 4))) NB_CKPT_CONVERT_HIDDEN;
/* The value to store for scale v (named `name`) in a compressed-tensors
 * layer (to_ct) or a ModelOpt one, classified and counted as above; with
 * o->strict an inexact one is NB_ERR_UNSUPPORTED. */
nb_status nbio_convert_recip(const nb_ckpt_convert_opts *o, nb_ckpt_convert_summary *sum, const char *name, float v,
                             int to_ct, float *r, char *err, size_t errlen) NB_CKPT_CONVERT_HIDDEN;
/* 1 when `path` is a readable file starting with "GGUF". */
int nbio_is_gguf(const char *path) NB_CKPT_CONVERT_HIDDEN;
/* nb_ckpt_convert for a GGUF file (summary already zeroed or NULL). */
nb_status nbio_convert_gguf(const char *in, const char *out, const nb_ckpt_convert_opts *opts,
                            nb_ckpt_convert_summary *summary, char *err, size_t errlen) NB_CKPT_CONVERT_HIDDEN;

#ifdef __cplusplus
}
#endif
#endif
