/*
 * nibble.h - 4-bit weights (NVFP4, MXFP4) times BF16/FP16 activations on GPUs
 * without native FP4 arithmetic.  This header is the whole public API and its
 * documentation.
 *
 * OVERVIEW
 *   A linear layer computes  Y[m, n] = X[m, k] . W[n, k]^T (+ bias[n]).
 *   W is stored as 4-bit E2M1 codes plus one scale per block of K elements:
 *     NVFP4  block 16, FP8 E4M3 block scales, one FP32 tensor scale
 *            (NVIDIA ModelOpt semantics: weight_scale, weight_scale_2);
 *     MXFP4  block 32, E8M0 (power of two) block scales (OCP Microscaling).
 *   The host reference (quantize, dequantize, GEMM) also serves the integer
 *   formats of AWQ, GPTQ and compressed-tensors (int4 with zero points,
 *   int4_sym, int8) and bitsandbytes' nf4 and bnb_fp4 (NB_FORMAT_LIST, and
 *   the _v2 functions for zero points).  On the GPU, every one of them runs
 *   through nb_pack(_v2) and nb_gemm: the decode kernel for small batches
 *   (scales applied in FP32; nf4 and bnb_fp4 multiply by the table values
 *   rounded to the activation dtype) and the tensor-core kernels for larger
 *   ones (weights rounded to the activation dtype once dequantized,
 *   docs/formats.md section 8, DESIGN.md 4.2).
 *   Two memory layouts exist for a quantized weight:
 *     NB_LAYOUT_CHECKPOINT  what checkpoints store: codes [n, k/2] bytes, low
 *                           nibble = even element; scales [n, k/group] bytes;
 *     NB_LAYOUT_PACKED      what the GPU kernels read: one buffer produced by
 *                           nb_pack() from the checkpoint layout (byte
 *                           layout: docs/formats.md section 8).
 *   A mixture-of-experts MLP (nb_moe_*: E experts' gate_up and down weights,
 *   top-k routing, the activation, the weighted combine) has a host reference
 *   in float and double and the routing layout its grouped GEMM will read
 *   (nb_moe_align_host); on the GPU nb_moe_mlp (grouped decode kernels).
 *   A dense gated MLP's activation between its fused gate/up and down GEMMs
 *   is nb_glu (nb_glu_host its reference).
 *   Every operation has a plain-C reference (functions ending in _host, host
 *   memory) and, where it makes sense, a CUDA version (device memory, takes a
 *   stream).  The reference is the specification: dequantization and packing
 *   are bit-exact between the two.
 *
 * CONVENTIONS
 *   - Every function returns nb_status; NB_OK is 0.  nb_status_string() names
 *     a status; the detailed message of the last failure is kept in the
 *     context (nb_context_last_error) and, for every failure, in a thread-local
 *     buffer (nb_last_error).  Nothing aborts on bad input.
 *   - Sizes are int64_t and must be positive; byte counts are size_t.
 *   - "device" pointers are CUDA device (or managed) memory of the context's
 *     device; "host" pointers are ordinary memory.
 *   - Streams are passed as void* holding a cudaStream_t (NULL = legacy
 *     default stream), so this header needs no CUDA header.
 *   - Enum values are explicit and append-only; structs are only extended by
 *     new _v2 functions.
 *   - A library built without CUDA still provides every function; device
 *     functions then return NB_ERR_NO_DEVICE.
 *   - A context caches per-call state (last error, last configuration, scale
 *     tables): use one context per host thread, or serialize calls on it.
 *
 * EXAMPLE (complete; tests/test_example.c compiles and runs exactly this)
 *
 *   #include <nibble.h>
 *   #include <stdio.h>
 *   #include <stdlib.h>
 *
 *   int main(void) {
 *       enum { N = 64, K = 128, M = 2 };
 *       nb_context *ctx = NULL;
 *       nb_status st = nb_context_create(NB_DEVICE_NONE, &ctx);  // host only
 *       if (st != NB_OK) { printf("%s\n", nb_last_error()); return 1; }
 *
 *       float *w = malloc(sizeof(float) * N * K), *x = malloc(sizeof(float) * M * K);
 *       float *y = malloc(sizeof(float) * M * N);
 *       for (int i = 0; i < N * K; i++) w[i] = (float)((i * 37 % 101) - 50) / 50.0f;
 *       for (int i = 0; i < M * K; i++) x[i] = (float)((i * 11 % 13) - 6) / 6.0f;
 *
 *       nb_weight_desc desc;
 *       nb_weight_desc_init(&desc, NB_FORMAT_NVFP4, N, K);
 *       nb_weight_sizes sz;
 *       nb_weight_get_sizes(&desc, &sz);
 *       unsigned char *codes = malloc(sz.codes_bytes), *scales = malloc(sz.scales_bytes);
 *
 *       // quantize computes desc.tensor_scale (amax / (6*448)) because it is 0
 *       st = nb_quantize_host(ctx, &desc, NB_DTYPE_F32, w, codes, scales);
 *
 *       nb_gemm_desc g;
 *       nb_gemm_desc_init(&g, &desc, M, NB_DTYPE_F32, NB_DTYPE_F32);
 *       if (st == NB_OK)
 *           st = nb_gemm_host(ctx, &g, x, codes, scales, NULL, y);
 *       if (st != NB_OK) printf("error: %s\n", nb_context_last_error(ctx));
 *       else printf("y[0][0] = %f\n", y[0]);
 *
 *       free(w); free(x); free(y); free(codes); free(scales);
 *       nb_context_destroy(ctx);
 *       return st == NB_OK ? 0 : 1;
 *   }
 *
 *   On a GPU the same flow is: nb_context_create(0, &ctx); copy codes and
 *   scales to the device; nb_pack(ctx, &desc, codes, scales, packed, bytes,
 *   stream); nb_gemm_workspace_size(); nb_gemm(ctx, &g, x, packed, bias, y,
 *   workspace, workspace_bytes, stream) with BF16 or FP16 x and y.
 */
#ifndef NIBBLE_H
#define NIBBLE_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#if defined(_WIN32)
#define NB_API
#else
#define NB_API __attribute__((visibility("default")))
#endif

/* ---------------------------------------------------------------- version */

#define NB_VERSION_MAJOR 0
#define NB_VERSION_MINOR 1
#define NB_VERSION_PATCH 0
#define NB_VERSION ((NB_VERSION_MAJOR * 10000) + (NB_VERSION_MINOR * 100) + NB_VERSION_PATCH)

/* The library's NB_VERSION; compare with the header's to detect a mismatch. */
NB_API int nb_version(void);
/* "major.minor.patch" of the library. */
NB_API const char *nb_version_string(void);

/* ----------------------------------------------------------------- status */

/* X(name, value, message).  Append only; values never change. */
#define NB_STATUS_LIST(X)                                                                       \
    X(NB_OK, 0, "success")                                                                      \
    X(NB_ERR_INVALID_ARGUMENT, 1, "invalid argument")                                           \
    X(NB_ERR_NULL_POINTER, 2, "a required pointer is NULL")                                     \
    X(NB_ERR_BAD_SHAPE, 3, "invalid or inconsistent shape")                                     \
    X(NB_ERR_MISALIGNED, 4, "pointer or leading dimension is not suitably aligned")             \
    X(NB_ERR_UNSUPPORTED, 5, "unsupported format, data type or configuration")                  \
    X(NB_ERR_NO_DEVICE, 6, "no usable CUDA device (or the library was built without CUDA)")     \
    X(NB_ERR_CUDA, 7, "CUDA runtime error")                                                     \
    X(NB_ERR_OUT_OF_MEMORY, 8, "out of memory")                                                 \
    X(NB_ERR_OVERFLOW, 9, "size arithmetic overflows")                                          \
    X(NB_ERR_WORKSPACE, 10, "workspace missing or too small")                                   \
    X(NB_ERR_IO, 11, "file input/output error")                                                 \
    X(NB_ERR_CORRUPT, 12, "corrupt or malformed data")                                          \
    X(NB_ERR_NOT_FOUND, 13, "not found")                                                        \
    X(NB_ERR_BUFFER_TOO_SMALL, 14, "output buffer too small")                                   \
    X(NB_ERR_INTERNAL, 15, "internal error")

typedef enum nb_status {
#define NB_X_ENUM(name, value, msg) name = value,
    NB_STATUS_LIST(NB_X_ENUM)
#undef NB_X_ENUM
} nb_status;

/* A static description of a status ("unknown status" for other values). */
NB_API const char *nb_status_string(nb_status status);
/* The symbolic name of a status ("NB_ERR_BAD_SHAPE"), or "NB_UNKNOWN". */
NB_API const char *nb_status_name(nb_status status);
/* The detailed message of the last failure on this thread ("" if none). */
NB_API const char *nb_last_error(void);

/* ------------------------------------------------------------------ types */

typedef enum nb_dtype {
    NB_DTYPE_F32 = 1,  /* host reference only */
    NB_DTYPE_F16 = 2,
    NB_DTYPE_BF16 = 3
} nb_dtype;

/* The element codes a format stores (docs/formats.md sections 1, 4, 5).
 * Codes are element_bits wide, packed little-end first into bytes: two 4-bit
 * codes per byte (the even element in the low nibble), one 8-bit code per
 * byte. */
typedef enum nb_element_type {
    NB_ELEMENT_E2M1 = 1,   /* FP4: sign, 2 exponent bits, 1 mantissa bit: 0 .5 1 1.5 2 3 4 6 */
    NB_ELEMENT_UINT4 = 2,  /* unsigned integer 0..15, used with a zero point: (q - z) * s */
    NB_ELEMENT_INT4 = 3,   /* two's complement -8..7: q * s */
    NB_ELEMENT_INT8 = 4,   /* two's complement -128..127: q * s */
    NB_ELEMENT_NF4 = 5,    /* bitsandbytes NormalFloat4: a table of 16 float32 values in [-1, 1] */
    NB_ELEMENT_FP4_BNB = 6 /* bitsandbytes "fp4": a table of 16 float32 values (not E2M1), in [-1, 1] */
} nb_element_type;

/* The block (group) scales.  E4M3 and E8M0 take one byte per scale; F16 and
 * BF16 two and F32 four (little-endian IEEE / bfloat16 bit patterns).  A
 * scale is used as it is stored: a negative scale gives negated values, a
 * NaN scale NaN values, an infinite scale infinities (and NaN where the code
 * is zero, 0 x inf); nothing is clamped or replaced. */
typedef enum nb_scale_type {
    NB_SCALE_E4M3 = 1, /* FP8 E4M3FN byte: any sign, 0x7F/0xFF are NaN */
    NB_SCALE_E8M0 = 2, /* 2^(byte-127), 0xFF is NaN */
    NB_SCALE_F16 = 3,  /* IEEE half (AWQ, GPTQ, compressed-tensors) */
    NB_SCALE_BF16 = 4, /* bfloat16 (compressed-tensors) */
    NB_SCALE_F32 = 5   /* IEEE single (bitsandbytes absmax) */
} nb_scale_type;

/* Zero points.  A format with zero points stores one per group, in a buffer
 * of its own ("zeros", [n, k/group] in the checkpoint layout). */
typedef enum nb_zero_type {
    NB_ZERO_NONE = 0,
    NB_ZERO_U8 = 1,   /* one byte per group, an unsigned integer z: value = (q - z) * s
                       * (quantize writes 0 .. 2^element_bits - 1; any byte is read) */
    NB_ZERO_FLOAT = 2 /* one 16-bit float per group, of the scales' type (F16 or BF16), 2 bytes:
                       * value = r(r(q - z) * s), each step rounded to that type (HQQ's
                       * dequantization, docs/formats.md 5.5) */
} nb_zero_type;

/* Sets of groups (nb_format_info.groups): a format accepts a group size g
 * when the bit for g is set, and group_size = k (one group per row) when
 * NB_GROUPS_PER_CHANNEL is. */
#define NB_GROUPS_16 (1 << 4)
#define NB_GROUPS_32 (1 << 5)
#define NB_GROUPS_64 (1 << 6)
#define NB_GROUPS_128 (1 << 7)
#define NB_GROUPS_256 (1 << 8)
#define NB_GROUPS_512 (1 << 9)
#define NB_GROUPS_1024 (1 << 10)
#define NB_GROUPS_2048 (1 << 11)
#define NB_GROUPS_4096 (1 << 12)
#define NB_GROUPS_PER_CHANNEL (1 << 30)
/* Sets of scale types (nb_format_info.scale_types): bit t for nb_scale_type t. */
#define NB_SCALE_BIT(t) (1 << (t))

/* The weight formats, one row each: everything the library knows about a
 * format's storage follows from its row (nb_format_get_info returns it).
 *   X(NAME, value, "name", element, element_bits, group, groups, scale_type,
 *     scale_types, scale_bytes, tensor_scale, zero_point)
 *   element       nb_element_type of the codes, element_bits bits each;
 *   group         the default group: consecutive elements of a row (along k)
 *                 sharing a scale (nb_weight_desc_init's group_size);
 *   groups        the groups the format accepts (NB_GROUPS_*);
 *   scale_type    the default nb_scale_type of the group scales, scale_bytes
 *                 bytes each;
 *   scale_types   the scale types the format accepts (NB_SCALE_BIT(t) ...);
 *   tensor_scale  1: one FP32 scale multiplies every value (NVFP4's
 *                 weight_scale_2, nb_weight_desc.tensor_scale); 0: none
 *                 (tensor_scale is 1);
 *   zero_point    nb_zero_type: NB_ZERO_U8 or NB_ZERO_FLOAT when groups carry
 *                 a zero point
 *                 (the format is then used through the _v2 functions).
 * The rows:
 *   nvfp4     E2M1, groups of 16, E4M3 scales, FP32 tensor scale (ModelOpt);
 *   mxfp4     E2M1, groups of 32, E8M0 scales (OCP MX);
 *   int4      unsigned 4-bit codes with U8 zero points, (q - z) * s, F16 or
 *             BF16 scales, groups of 32, 64, 128 or one per row (AWQ, GPTQ,
 *             compressed-tensors asymmetric);
 *   int4_sym  signed 4-bit codes, q * s, the same groups and scales (GPTQ /
 *             compressed-tensors symmetric);
 *   int8      signed 8-bit codes, q * s, the same groups and scales;
 *   int4_hqq  unsigned 4-bit codes with a float zero point per group in the
 *             scales' type (F16 or BF16), r(r(q - z) * s) (HQQ, GemLite),
 *             groups of 32, 64 (default), 128 or one per row;
 *   nf4       bitsandbytes NF4: table codes times an F32 absmax per group of
 *             32 .. 4096 (default 64);
 *   bnb_fp4   bitsandbytes FP4, likewise.
 * Values are append-only. */
#define NB_FORMAT_LIST(X)                                                                                        \
    X(NVFP4, 1, "nvfp4", NB_ELEMENT_E2M1, 4, 16, NB_GROUPS_16, NB_SCALE_E4M3, NB_SCALE_BIT(NB_SCALE_E4M3), 1, 1,  \
      NB_ZERO_NONE)                                                                                              \
    X(MXFP4, 2, "mxfp4", NB_ELEMENT_E2M1, 4, 32, NB_GROUPS_32, NB_SCALE_E8M0, NB_SCALE_BIT(NB_SCALE_E8M0), 1, 0,  \
      NB_ZERO_NONE)                                                                                              \
    X(INT4, 3, "int4", NB_ELEMENT_UINT4, 4, 128, NB_GROUPS_INT, NB_SCALE_F16, NB_SCALES_INT, 2, 0, NB_ZERO_U8)      \
    X(INT4_SYM, 4, "int4_sym", NB_ELEMENT_INT4, 4, 128, NB_GROUPS_INT, NB_SCALE_F16, NB_SCALES_INT, 2, 0,          \
      NB_ZERO_NONE)                                                                                              \
    X(INT8, 5, "int8", NB_ELEMENT_INT8, 8, 128, NB_GROUPS_INT, NB_SCALE_F16, NB_SCALES_INT, 2, 0, NB_ZERO_NONE)    \
    X(NF4, 6, "nf4", NB_ELEMENT_NF4, 4, 64, NB_GROUPS_BNB, NB_SCALE_F32, NB_SCALE_BIT(NB_SCALE_F32), 4, 0,        \
      NB_ZERO_NONE)                                                                                              \
    X(BNB_FP4, 7, "bnb_fp4", NB_ELEMENT_FP4_BNB, 4, 64, NB_GROUPS_BNB, NB_SCALE_F32, NB_SCALE_BIT(NB_SCALE_F32),  \
      4, 0, NB_ZERO_NONE)                                                                                        \
    X(INT4_HQQ, 8, "int4_hqq", NB_ELEMENT_UINT4, 4, 64, NB_GROUPS_INT, NB_SCALE_F16, NB_SCALES_INT, 2, 0,         \
      NB_ZERO_FLOAT)
/* (the sets the integer and bitsandbytes rows share) */
#define NB_GROUPS_INT (NB_GROUPS_32 | NB_GROUPS_64 | NB_GROUPS_128 | NB_GROUPS_PER_CHANNEL)
#define NB_SCALES_INT (NB_SCALE_BIT(NB_SCALE_F16) | NB_SCALE_BIT(NB_SCALE_BF16))
#define NB_GROUPS_BNB                                                                                      \
    (NB_GROUPS_32 | NB_GROUPS_64 | NB_GROUPS_128 | NB_GROUPS_256 | NB_GROUPS_512 | NB_GROUPS_1024 |       \
     NB_GROUPS_2048 | NB_GROUPS_4096)

typedef enum nb_format {
#define NB_X_FORMAT(NAME, value, ...) NB_FORMAT_##NAME = value,
    NB_FORMAT_LIST(NB_X_FORMAT)
#undef NB_X_FORMAT
} nb_format;

/* One row of NB_FORMAT_LIST, and whether this build's kernels serve it. */
typedef struct nb_format_info {
    nb_format format;
    char name[16];        /* "nvfp4" */
    int32_t element;      /* nb_element_type */
    int32_t element_bits;
    int32_t group_size;   /* the default group */
    int32_t scale_type;   /* nb_scale_type: the default */
    int32_t scale_bytes;  /* bytes of a scale of the default type */
    int32_t tensor_scale; /* 1 when the format has a per-tensor FP32 scale */
    int32_t zero_point;   /* 1 when groups carry a zero point */
    int32_t kernels;      /* 1 when the GPU kernels (nb_pack, nb_gemm) serve it */
    int32_t groups;       /* the groups it accepts: NB_GROUPS_* bits */
    int32_t scale_types;  /* the scale types it accepts: NB_SCALE_BIT(t) bits */
    int32_t zero_type;    /* nb_zero_type of its zero points (NB_ZERO_NONE without) */
    int32_t reserved[3];
} nb_format_info;

/* The row of `format`; NB_ERR_UNSUPPORTED for a value that is not a format
 * of this library. */
NB_API nb_status nb_format_get_info(nb_format format, nb_format_info *out);
/* The formats of this library in NB_FORMAT_LIST order: *count receives how
 * many there are; at most `max` are written (formats may be NULL when max
 * is 0). */
NB_API nb_status nb_format_list(nb_format *formats, size_t max, size_t *count);
/* The format named `name` (exact and lower case: "nvfp4", "mxfp4");
 * NB_ERR_NOT_FOUND, with the known names in the message, otherwise. */
NB_API nb_status nb_format_from_name(const char *name, nb_format *out);

/* How nb_quantize picks an MXFP4 block exponent (formats.md 3.2). */
typedef enum nb_mx_scale_rule {
    NB_MX_SCALE_OCP = 0,      /* floor(log2 amax) - 2 (OCP spec, llama.cpp) */
    NB_MX_SCALE_ROUND_UP = 1, /* 2^ceil(log2(amax/6)) (triton_kernels default) */
    NB_MX_SCALE_EVEN = 2      /* Quark "even" / compressed-tensors */
} nb_mx_scale_rule;

/* How nb_quantize chooses each block's scale (nb_weight_desc.method). */
typedef enum nb_quant_method {
    NB_QUANT_RTN = 0, /* the format's rule: ModelOpt for NVFP4, scale_rule for MXFP4 */
    NB_QUANT_MSE = 1, /* among the rule's scale and its neighbours, the one whose dequantized block is closest to
                       * the input (least squared error; ties keep the rule's): NVFP4 the rule's E4M3 scale, the
                       * eight below it (down to half) and the one above; MXFP4 the rule's exponent and the two
                       * next to it.  Deterministic; the tensor scale is the rule's.  Never a larger block error
                       * than the rule's.  Host only for now (nb_quantize_host): the device
                       * quantizer returns NB_ERR_UNSUPPORTED for it. */
    NB_QUANT_HQQ = 2  /* int4_hqq only: HQQ's configuration for 4 bits (hqq 0.2.8's hqq_base_quant_config,
                       * transformers' HqqConfig): the round-to-nearest scale, the zero point rounded to an integer
                       * (round_zero), then its half-quadratic optimizer of the zero points
                       * (optimize_weights_proximal_legacy on the CPU: proximal steps with lp norm 0.7 and beta 10,
                       * at most 20, stopping when the mean
                       * reconstruction error over the whole weight stops falling), in float32 with the sums in
                       * double: the same iteration, not PyTorch's summation order, so a zero point can differ
                       * from hqq's in its last bits.  Host only (nb_quantize_host_v2); deterministic. */
} nb_quant_method;

typedef enum nb_layout {
    NB_LAYOUT_CHECKPOINT = 1,
    NB_LAYOUT_PACKED = 2
} nb_layout;

/* ---------------------------------------------------------------- context */

#define NB_DEVICE_NONE (-1)

typedef struct nb_context nb_context;

/* Facts about the context's device, read once at creation. */
typedef struct nb_device_info {
    int device;               /* CUDA ordinal, or NB_DEVICE_NONE */
    char name[256];
    int cc_major, cc_minor;   /* compute capability */
    int sm_count;
    int max_threads_per_sm;
    int regs_per_sm;
    size_t l2_bytes;
    size_t smem_per_block_optin; /* largest dynamic shared memory per block */
    size_t smem_per_sm;
    size_t global_mem_bytes;
    int mem_clock_khz;
    int mem_bus_width_bits;
} nb_device_info;

/* Create a context on CUDA device `device`, or a host-only one with
 * NB_DEVICE_NONE (the _host functions work with either). */
NB_API nb_status nb_context_create(int device, nb_context **out);
/* Destroy a context (NULL is accepted and ignored). */
NB_API nb_status nb_context_destroy(nb_context *ctx);
/* The detailed message of the last failure seen by this context. */
NB_API const char *nb_context_last_error(const nb_context *ctx);
NB_API nb_status nb_context_device_info(const nb_context *ctx, nb_device_info *out);

/* Number of CUDA devices (0 without CUDA or without a driver). */
NB_API nb_status nb_device_count(int *count);

typedef struct nb_build_info {
    int cuda;                 /* 1 if CUDA kernels are compiled in */
    char cuda_archs[128];     /* e.g. "80;89;90a" */
    char formats[128];        /* e.g. "nvfp4,mxfp4" */
    char version[32];
} nb_build_info;
NB_API nb_status nb_get_build_info(nb_build_info *out);

/* --------------------------------------------------------- weight descriptor */

typedef struct nb_weight_desc {
    nb_format format;
    nb_layout layout;
    int64_t n;                 /* rows = out_features */
    int64_t k;                 /* columns = in_features; multiple of group_size */
    /* One of the groups of the format's row (nb_format_info.groups): 16 for
     * NVFP4, 32 for MXFP4, 32/64/128 or k (one group per row) for the
     * integer formats, 32..4096 for NF4 and bitsandbytes FP4. */
    int32_t group_size;
    /* One of the row's scale types: E4M3 (NVFP4), E8M0 (MXFP4), F16 or BF16
     * (integer formats), F32 (NF4, bitsandbytes FP4). */
    nb_scale_type scale_type;
    nb_mx_scale_rule scale_rule;
    /* Multiplies every dequantized value: NVFP4 weight_scale_2 (any float,
     * NaN propagates).  1.0 for MXFP4 checkpoints.  nb_quantize computes it
     * when it is 0 on entry (NVFP4) and uses it as given otherwise; MXFP4
     * quantization requires 1 (or 0, read as 1). */
    float tensor_scale;
    /* Filled by nb_pack for MXFP4: smallest and largest non-NaN scale byte
     * (-1 when every scale is NaN).  The kernels use them to choose an exact
     * exponent offset.  For int4 (zero points) nb_pack_v2 fills them with
     * the smallest and largest zero-point byte: BF16 activations need
     * zero points up to 127. */
    int32_t scale_exp_min, scale_exp_max;
    int32_t method;            /* nb_quant_method, for nb_quantize*: 0 (RTN) by default */
    int32_t reserved[5];
} nb_weight_desc;

/* Defaults for a format: checkpoint layout, its default group and scale
 * type, tensor_scale 0 for NVFP4 (computed by quantize) and 1 for the others.
 * Set group_size and scale_type afterwards to choose another of the row's. */
NB_API nb_status nb_weight_desc_init(nb_weight_desc *desc, nb_format format, int64_t n, int64_t k);
/* Check a descriptor; NB_OK or the reason it is invalid (a group or scale
 * type the row does not accept is NB_ERR_UNSUPPORTED). */
NB_API nb_status nb_weight_desc_validate(const nb_weight_desc *desc);

typedef struct nb_weight_sizes {
    size_t codes_bytes;   /* checkpoint codes: n * k * element_bits / 8 */
    size_t scales_bytes;  /* checkpoint scales: n * k / group * bytes per scale */
    size_t packed_bytes;  /* nb_pack output (0 for formats without GPU kernels) */
    size_t dense_elements;/* n * k */
} nb_weight_sizes;
/* The sizes of a weight.  A format with zero points has a third buffer:
 * NB_ERR_UNSUPPORTED (naming nb_weight_get_sizes_v2) for it. */
NB_API nb_status nb_weight_get_sizes(const nb_weight_desc *desc, nb_weight_sizes *out);

/* ------------------------------------------------- the _v2 buffer functions
 *
 * A format with zero points (int4) stores three buffers: codes, scales and
 * zeros.  The functions of the first version take (codes, scales) only, so
 * they return NB_ERR_UNSUPPORTED for such a format, naming the _v2 function
 * that takes all three; the _v2 functions serve every format (zeros is NULL
 * for a format without zero points).  Checkpoint layout of the buffers:
 *   codes   [n, k] elements of element_bits, packed little-end first (4 bits:
 *           [n, k/2] bytes, even element in the low nibble; 8 bits: [n, k]);
 *   scales  [n, k/group] scales of desc->scale_type (1, 2 or 4 bytes each,
 *           little-endian);
 *   zeros   [n, k/group] zero points, for formats with zero points: bytes
 *           (NB_ZERO_U8) or 16-bit floats of desc->scale_type (NB_ZERO_FLOAT,
 *           little-endian). */

typedef struct nb_weight_sizes_v2 {
    size_t codes_bytes;    /* n * k * element_bits / 8 */
    size_t scales_bytes;   /* n * k / group * bytes per scale */
    size_t zeros_bytes;    /* n * k / group (NB_ZERO_U8; twice that with NB_ZERO_FLOAT), else 0 */
    size_t packed_bytes;   /* nb_pack output (0 for formats without GPU kernels) */
    size_t dense_elements; /* n * k */
    int32_t reserved[8];   /* zero on return */
} nb_weight_sizes_v2;
NB_API nb_status nb_weight_get_sizes_v2(const nb_weight_desc *desc, nb_weight_sizes_v2 *out);

/* Buffers a function writes (host memory, at least nb_weight_get_sizes_v2's
 * bytes each).  reserved must be NULL. */
typedef struct nb_weight_buffers {
    void *codes;
    void *scales;
    void *zeros;          /* NULL for a format without zero points */
    void *reserved[4];
} nb_weight_buffers;

/* Buffers a function reads (host memory); reserved must be NULL. */
typedef struct nb_weight_data {
    const void *codes;
    const void *scales;
    const void *zeros;    /* NULL for a format without zero points */
    const void *reserved[4];
} nb_weight_data;

/* ------------------------------------------------ quantize / dequantize */

/* Quantize a row-major [n, k] matrix (F32, F16 or BF16, host memory) into the
 * checkpoint layout.  NVFP4 follows ModelOpt exactly (tensor scale
 * amax/(6*448) unless desc->tensor_scale != 0; block scale clamped to
 * [2^-9, 448] and rounded to E4M3 RNE; codes E2M1 RNE with saturation).  MXFP4
 * uses desc->scale_rule.  desc->layout must be CHECKPOINT.  Non-finite inputs
 * are rejected with NB_ERR_INVALID_ARGUMENT. */
NB_API nb_status nb_quantize_host(nb_context *ctx, nb_weight_desc *desc, nb_dtype src_dtype,
                                  const void *src, uint8_t *codes, uint8_t *scales);
/* nb_quantize_host for every format, into `out` (codes, scales and, for a
 * format with zero points, zeros).  Round to nearest, in float32 arithmetic
 * (docs/formats.md sections 4.2 and 5.1):
 *   int4 (zero points; AWQ / GPTQ):  per group lo = min(0, min w), hi =
 *       max(0, max w); s = (hi - lo) / 15 rounded to the scale type; z =
 *       clamp(round(-lo / s), 0, 15); q = clamp(round(w / s) + z, 0, 15);
 *   int4_sym, int8 (GPTQ / compressed-tensors symmetric): s = amax /
 *       ((2^bits - 1) / 2) rounded to the scale type (amax / 7.5, amax /
 *       127.5); q = clamp(round(w / s), -2^(bits-1), 2^(bits-1) - 1);
 *   (round() is to nearest, ties to even; a scale that rounds to zero is
 *   stored as 1.0, one that overflows its type is NB_ERR_INVALID_ARGUMENT;)
 *   nf4, bnb_fp4 (bitsandbytes): s = amax (F32); q = the table entry nearest
 *       to clamp(w * (1 / max(s, 1e-38)), -1, 1), a tie going to the smaller
 *       value;
 *   int4_hqq (HQQ's quantizer without its optimizer): lo = min w, hi = max
 *       w, t = min(15 / (hi - lo), 2e4), z = -lo * t, q = clamp(round(w * t
 *       + z), 0, 15) (product and sum rounded separately); stored s = r(1 /
 *       t) and z rounded to the scale type (a zero point or scale that
 *       overflows it is NB_ERR_INVALID_ARGUMENT).
 * NVFP4 and MXFP4 write exactly what nb_quantize_host writes.  Non-finite
 * input is NB_ERR_INVALID_ARGUMENT. */
NB_API nb_status nb_quantize_host_v2(nb_context *ctx, nb_weight_desc *desc, nb_dtype src_dtype, const void *src,
                                     const nb_weight_buffers *out);
/* Device version: src, codes and scales are device memory (src aligned to its
 * element size, else NB_ERR_MISALIGNED; codes n*k/2 and scales n*k/group
 * bytes).  Same contract as nb_quantize_host: identical code and scale bytes
 * and, when desc->tensor_scale is 0, the identical tensor scale; non-finite
 * input is NB_ERR_INVALID_ARGUMENT with the same message (the first such
 * element), codes, scales and *desc then untouched.  The status depends on
 * the data, so the call reads back 16 bytes (the first non-finite element and
 * the absolute maximum, from which the tensor scale is computed on the host)
 * and synchronizes `stream` every time: a load-time call, not for CUDA-graph
 * capture.  The block pass that writes codes and scales is then enqueued on
 * `stream` and may still run when the call returns. */
NB_API nb_status nb_quantize(nb_context *ctx, nb_weight_desc *desc, nb_dtype src_dtype, const void *src,
                             uint8_t *codes, uint8_t *scales, void *stream);
/* nb_quantize for host buffers (src, codes, scales as nb_quantize_host takes
 * them, any alignment): they are staged through device memory allocated for
 * the call (the input plus its codes and scales: 2.6 bytes per element for
 * BF16/F16 input, 4.6 for F32) and freed before it returns, so it
 * synchronizes `stream`.  Same bytes, tensor scale, statuses and messages as
 * nb_quantize_host; NB_ERR_OUT_OF_MEMORY when the device memory cannot be
 * had.  For loaders that read weights into host memory (nibble quantize). */
NB_API nb_status nb_quantize_staged(nb_context *ctx, nb_weight_desc *desc, nb_dtype src_dtype, const void *src,
                                    uint8_t *codes, uint8_t *scales, void *stream);

/* Dequantize checkpoint-layout codes and scales to a row-major [n, k] matrix
 * (F32, F16 or BF16).  value = (element(code) * scale) * tensor_scale in
 * float32, then rounded to the destination type: E2M1 x E4M3/E8M0, integer
 * codes x F16/BF16 scales are exact in float32, so NVFP4, MXFP4 and the
 * integer formats round once (what PyTorch's half and bfloat16 arithmetic
 * gives); nf4 and bnb_fp4 round the float32 product table x absmax and then
 * to the destination, as bitsandbytes does.  A format with zero points is
 * NB_ERR_UNSUPPORTED here (nb_dequantize_host_v2). */
NB_API nb_status nb_dequantize_host(nb_context *ctx, const nb_weight_desc *desc, const uint8_t *codes,
                                    const uint8_t *scales, nb_dtype dst_dtype, void *dst);
/* nb_dequantize_host for every format: value = ((q - z) * s) * tensor_scale
 * for a format with U8 zero points (q - z an exact integer), r(r(q - z) *
 * s) with float zero points (int4_hqq: each step rounded to the scale type,
 * HQQ's own evaluation), as above otherwise. */
NB_API nb_status nb_dequantize_host_v2(nb_context *ctx, const nb_weight_desc *desc, const nb_weight_data *w,
                                       nb_dtype dst_dtype, void *dst);
/* Device version: all pointers are device memory; dst is F16, BF16 or F32;
 * the result equals nb_dequantize_host bit for bit. */
NB_API nb_status nb_dequantize(nb_context *ctx, const nb_weight_desc *desc, const uint8_t *codes,
                               const uint8_t *scales, nb_dtype dst_dtype, void *dst, void *stream);

/* ------------------------------------------------------------------- pack */

/* Convert checkpoint layout (codes, scales) into the kernel layout.  Only
 * the formats the GPU kernels serve (nb_format_info.kernels: NVFP4, MXFP4,
 * INT4 through nb_pack_v2, INT4_SYM, INT8, NF4, BNB_FP4) have one; another is
 * NB_ERR_UNSUPPORTED, named in the message, as it is for nb_gemm and the
 * tuning functions (nb_quantize, nb_dequantize and MoE serve NVFP4 and
 * MXFP4 only).
 * `packed_bytes` must be at least nb_weight_sizes.packed_bytes.  On success
 * desc->layout is set to NB_LAYOUT_PACKED and, for MXFP4,
 * desc->scale_exp_min/max are filled.  Host and device versions produce
 * identical bytes.  The device version reads back two integers, so it
 * synchronizes `stream` (it is a load-time operation, not a hot call). */
NB_API nb_status nb_pack_host(nb_context *ctx, nb_weight_desc *desc, const uint8_t *codes,
                              const uint8_t *scales, void *packed, size_t packed_bytes);
NB_API nb_status nb_pack(nb_context *ctx, nb_weight_desc *desc, const uint8_t *codes,
                         const uint8_t *scales, void *packed, size_t packed_bytes, void *stream);
/* nb_pack_host and nb_pack for every format with kernels (nb_format_info.
 * kernels: nvfp4, mxfp4, int4, int4_sym, int8, nf4, bnb_fp4), w holding
 * codes, scales and, for int4, zeros (docs/formats.md sections 8.7 - 8.9 for
 * the integer and table formats' layouts; nf4 / bnb_fp4 scales are the F32
 * absmax, a nested absmax resolved first as nb_ckpt_layer_weight_v2 does).
 * nb_pack_host_v2 reads host memory; nb_pack_v2 device memory (the
 * nb_weight_data pointers are device pointers there), and it reads back the
 * zero-point range (synchronizing `stream`).  For int4, desc->scale_exp_min
 * and scale_exp_max receive the smallest and largest zero-point byte.
 * nb_pack_host and nb_pack refuse int4 (NB_ERR_UNSUPPORTED, naming the _v2
 * function). */
NB_API nb_status nb_pack_host_v2(nb_context *ctx, nb_weight_desc *desc, const nb_weight_data *w, void *packed,
                                 size_t packed_bytes);
NB_API nb_status nb_pack_v2(nb_context *ctx, nb_weight_desc *desc, const nb_weight_data *w, void *packed,
                            size_t packed_bytes, void *stream);
/* The inverse of nb_pack_host (host memory): codes (codes_bytes) and scales
 * (scales_bytes) of a packed weight, exactly the bytes that were packed;
 * padding is dropped.  desc->layout must be PACKED (as nb_pack left it); on
 * success it is set to NB_LAYOUT_CHECKPOINT (scale_exp_min/max are kept).
 * For writing a checkpoint of weights that exist only packed (Python's
 * save_pretrained); a packed buffer on the device is copied to the host
 * first. */
NB_API nb_status nb_unpack_host(nb_context *ctx, nb_weight_desc *desc, const void *packed, size_t packed_bytes,
                                uint8_t *codes, uint8_t *scales);
/* nb_unpack_host for every format with kernels, into out's codes, scales
 * and (int4) zeros.  A scale or zero point shared by several packed chunks
 * (groups wider than 128, one group per row) is read from each: they are
 * equal when the buffer came from nb_pack_v2. */
NB_API nb_status nb_unpack_host_v2(nb_context *ctx, nb_weight_desc *desc, const void *packed, size_t packed_bytes,
                                   const nb_weight_buffers *out);

/* ------------------------------------------------------------------- gemm */

typedef struct nb_gemm_desc {
    int64_t m;               /* rows of X and Y (tokens), >= 1 */
    nb_weight_desc weight;   /* describes W (n, k, format, tensor scale) */
    nb_dtype act_dtype;      /* X: BF16 or F16 on the device; also F32 on the host */
    nb_dtype out_dtype;      /* Y: same choices; bias uses out_dtype */
    int64_t lda;             /* elements between rows of X; 0 = k */
    int64_t ldc;             /* elements between rows of Y; 0 = n */
    int32_t reserved[8];
} nb_gemm_desc;

NB_API nb_status nb_gemm_desc_init(nb_gemm_desc *g, const nb_weight_desc *w, int64_t m, nb_dtype act_dtype,
                                   nb_dtype out_dtype);

/* Reference GEMM on the host, checkpoint layout, float accumulation:
 * Y = X . dequant(W)^T (+ bias).  bias may be NULL. */
NB_API nb_status nb_gemm_host(nb_context *ctx, const nb_gemm_desc *g, const void *x, const uint8_t *codes,
                              const uint8_t *scales, const void *bias, void *y);

/* Same, accumulating in double and writing double output [m, ldc]; the
 * yardstick the tests measure every other GEMM against. */
NB_API nb_status nb_gemm_host_f64(nb_context *ctx, const nb_gemm_desc *g, const void *x, const uint8_t *codes,
                                  const uint8_t *scales, const void *bias, double *y);
/* nb_gemm_host and nb_gemm_host_f64 for every format (the weight's buffers
 * in w; the first version refuses formats with zero points). */
NB_API nb_status nb_gemm_host_v2(nb_context *ctx, const nb_gemm_desc *g, const void *x, const nb_weight_data *w,
                                 const void *bias, void *y);
NB_API nb_status nb_gemm_host_f64_v2(nb_context *ctx, const nb_gemm_desc *g, const void *x, const nb_weight_data *w,
                                     const void *bias, double *y);

/* NB_OK if nb_gemm can run this problem on the context's device, otherwise
 * the status and message nb_gemm would return. */
NB_API nb_status nb_gemm_can_implement(nb_context *ctx, const nb_gemm_desc *g);
/* Bytes of device workspace nb_gemm needs for this layer at any m (may be 0),
 * under the context's tuning table as it is now (a tuned configuration may
 * split k more than the heuristic does): load a tuning cache before sizing
 * workspaces. */
NB_API nb_status nb_gemm_workspace_size(nb_context *ctx, const nb_gemm_desc *g, size_t *bytes);

/* Y = X . W^T (+ bias) on the device.  W is packed (nb_pack).  X rows must be
 * 16-byte aligned (x pointer and lda*2 bytes multiples of 16).  m up to 32
 * runs one decode-kernel launch; larger m runs one launch per 32 rows (the
 * weights are re-read per launch).  The call allocates nothing and never synchronizes, so it can
 * be captured in a CUDA graph.  The workspace (device memory, 16-byte
 * aligned, at least nb_gemm_workspace_size bytes) must be zero-filled before
 * its first use (cudaMemset once); nb_gemm leaves the part it relies on
 * zeroed again, so one workspace of the largest size serves every layer and
 * every m.  One workspace must not be used by two calls that may run
 * concurrently.  Y and bias need 2-byte alignment.  Accuracy: FP32
 * accumulation; nf4 and bnb_fp4 also round each table value to the
 * activation dtype (relative 2^-8 BF16, 2^-11 FP16) and apply the absmax in
 * FP32, so |y - y_ref| may exceed accumulation error by up to the sum over
 * k of |x| |absmax| |r(v) - v| (DESIGN.md 4.2.2). */
NB_API nb_status nb_gemm(nb_context *ctx, const nb_gemm_desc *g, const void *x, const void *packed,
                         const void *bias, void *y, void *workspace, size_t workspace_bytes, void *stream);

/* The configuration the last successful nb_gemm on this context ran, e.g.
 * "gemv_fp4<nvfp4,bf16,mt=1> grid=64x4 split_k=4". */
NB_API nb_status nb_gemm_last_config(const nb_context *ctx, char *buf, size_t buf_bytes);

/* Naive GPU GEMM (one thread per output, checkpoint layout): slow, obviously
 * correct, for tests of large shapes.  Output F32. */
NB_API nb_status nb_gemm_reference_device(nb_context *ctx, const nb_gemm_desc *g, const void *x,
                                          const uint8_t *codes, const uint8_t *scales, const void *bias,
                                          float *y, void *stream);

/* ----------------------------------------------------------------- tuning */

/* nb_gemm picks a kernel configuration per call from one source, the first
 * that applies:
 *   1. a configuration given with the call (nb_gemm_ex);
 *   2. the NIBBLE_PATH environment variable read at context creation
 *      ("decode", "tc" or "mma": that path for every call, the rest of the
 *      configuration by the heuristic; another value fails a device
 *      context's nb_context_create with NB_ERR_INVALID_ARGUMENT);
 *   3. the context's tuning table: one entry per (GPU name, format,
 *      activation dtype, n, k, m bucket), loaded from a JSON cache written by
 *      `nibble tune` (nb_context_load_tuning, or the file named by the
 *      NIBBLE_TUNE_CACHE environment variable at context creation); an entry
 *      this device or build cannot run is passed over;
 *   4. the built-in heuristic (src/plan.c).
 * nb_gemm_last_config ends in " tuned" when a table entry decided, in
 * " (NIBBLE_PATH)" or " (given)" for sources 2 and 1.  Tuning (timing
 * candidates) never happens inside nb_gemm: `nibble tune` does it ahead of
 * time.
 *
 * On Hopper the tensor-core path sums a k split either in a thread block
 * cluster, through the CTAs' shared memory (no workspace; the configuration
 * reads "k-split=N (cluster)"), or through the workspace, as the planner
 * finds cheaper and the device's clusters allow; NIBBLE_SM90_CLUSTER=0 at
 * context creation keeps every split on the workspace.  Both give the same
 * bits, and nb_gemm_workspace_size covers either.
 *
 * On Hopper nb_gemm kernels launch with programmatic dependent launch:
 * the kernel requests its first weights before waiting for the previous
 * kernel in the stream and lets the next one start early.  That pays where
 * nibble calls follow each other and was measured to cost in a compiled
 * model step, where other kernels sit between them (NOTES.md).  So under
 * stream capture a call launches with it only when its launch follows the
 * same context's previous nb_gemm launch in that capture (the one node the
 * capture would make it depend on), or a kernel that was itself launched
 * with it (such as Inductor's Triton kernels under
 * TORCHINDUCTOR_ENABLE_PDL=1, which let the next kernel launch early); a
 * direct launch, which cannot see what precedes it, always does.  Decode
 * kernel 2's split grid at 2..8 tokens takes it only after the same plan.
 * NIBBLE_PDL at context creation: unset or "auto" that rule, "1" always,
 * "0" never; another value fails a device context's nb_context_create with
 * NB_ERR_INVALID_ARGUMENT.  The MoE calls keep it between their own
 * launches.
 *
 * m buckets (an entry tuned at one m serves every m of its bucket): 1, 2,
 * 3-4, 5-8, 9-16, 17-32, 33-64, 65-128, 129-256, 257-512, 513-1024,
 * 1025-2048, 2049-4096, 4097+. */

typedef enum nb_gemm_path {
    NB_GEMM_PATH_DECODE = 1,      /* gemv_fp4.cu: every GPU; one launch per 32 rows of X */
    NB_GEMM_PATH_TENSOR_CORE = 2, /* gemm_sm90.cu: Hopper (sm_90a build, compute capability 9.0) */
    NB_GEMM_PATH_MMA = 3          /* gemm_sm80.cu: mma.sync, compute capability 8.0 and later (the
                                   * prefill path of A100, L40S, ...; on Hopper only when forced) */
} nb_gemm_path;

/* One kernel configuration.  Fields of the other path are 0.  A tuning
 * entry gives every field of its path; a configuration passed to nb_gemm_ex
 * may leave kw, rpw, splits, bn, raster, stages and stream_k 0 for the
 * heuristic to choose (path and, for decode, variant are always as given). */
typedef struct nb_gemm_config {
    int32_t path;    /* nb_gemm_path */
    int32_t kw;      /* decode: warps of a CTA that split one 16-row block's k range: 1, 2, 4 or 8 */
    int32_t splits;  /* CTAs along k (more than 1 sums through the workspace, or for tc in a
                      * cluster where the planner chooses it): decode 1..64;
                      * tensor core 1..8, at most one CTA per SM in all (0 in a cache reads as 1);
                      * mma 1 */
    int32_t variant; /* decode: 0 "plain", activations loaded per warp; 1 "staged", loaded once
                      * per CTA into shared memory (kw = 1) */
    int32_t rpw;     /* decode, staged: 16-row blocks per warp, 1 or 2 (0 for plain), or 4: E2M1
                      * formats, 17..32 tokens, one stream-K wave of one CTA per SM (8 warps at
                      * 17..24 tokens, 7 at 25..32), no k split */
    int32_t bn;      /* tensor core: tokens per tile, 16, 32, 64, 128, 192 (NVFP4, MXFP4) or 256 (mma: 64 or 128) */
    int32_t raster;  /* tensor core, mma: n tiles walked together per raster group, 1..1024 */
    int32_t stages;  /* mma: pipeline depth, 2 or 3 (0: the deepest whose shared memory fits) */
    int32_t warps;   /* decode, staged: consumer warps per CTA, 8, or 12 for kernel 2's wide instance
                      * (E2M1 formats, rpw 2, 17..24 tokens, one CTA per SM on a stream-K grid, no
                      * k split), or 7 with rpw 4 at 25..32 tokens; 0: the planner's choice (caches
                      * from before the field) */
    int32_t stream_k; /* tensor core: 1 the stream-K grid (one CTA per SM walking an equal share of
                       * every tile's k chunks; splits 1; the 64-token tile at 33..64 tokens, the
                       * 128-token tile from 65, the 256-token tile from 256), -1 whole tiles only;
                       * 0 the planner's choice (caches from before the field).  NIBBLE_SM90_SK=0
                       * refuses 1. */
    int32_t reserved[2];
} nb_gemm_config;

/* nb_gemm with the configuration `cfg` instead of NIBBLE_PATH, the tuning
 * table and the heuristic (cfg NULL: exactly nb_gemm).  cfg is checked as a
 * tuning entry is, with open fields allowed (NB_ERR_INVALID_ARGUMENT and the
 * field named otherwise); a configuration this device or build cannot run
 * is NB_ERR_UNSUPPORTED.  Size the workspace with nb_gemm_workspace_size_ex
 * for the same cfg.  For tests, benchmarks and tuning; serving code calls
 * nb_gemm. */
NB_API nb_status nb_gemm_ex(nb_context *ctx, const nb_gemm_desc *g, const nb_gemm_config *cfg, const void *x,
                            const void *packed, const void *bias, void *y, void *workspace, size_t workspace_bytes,
                            void *stream);
/* The workspace nb_gemm_ex needs for g under cfg: with cfg NULL,
 * nb_gemm_workspace_size (every m); otherwise g->m itself. */
NB_API nb_status nb_gemm_workspace_size_ex(nb_context *ctx, const nb_gemm_desc *g, const nb_gemm_config *cfg,
                                           size_t *bytes);

/* The m bucket [*lo, *hi] of m >= 1 (*hi = INT64_MAX for the last one). */
NB_API nb_status nb_tuning_m_bucket(int64_t m, int64_t *lo, int64_t *hi);

/* Replace the context's tuning table with the JSON cache at `path`.  The file
 * is untrusted: every entry is validated (known format, dtype, path and
 * variant names; n, k, kw, splits, bn, raster in range; version 1), and any
 * invalid entry rejects the whole file, leaving the table as it was.  Entries
 * for other GPU names are kept (nb_context_save_tuning writes them back) but
 * never used.  NB_ERR_IO: missing or unreadable file; NB_ERR_CORRUPT:
 * malformed JSON or an invalid entry; NB_ERR_UNSUPPORTED: another version,
 * or a library built without cJSON.  The message names the file, the entry
 * and the problem. */
NB_API nb_status nb_context_load_tuning(nb_context *ctx, const char *path);
/* Write the context's whole table to `path` as JSON, atomically (a
 * temporary file in the same directory, then rename).  NB_ERR_UNSUPPORTED
 * without cJSON. */
NB_API nb_status nb_context_save_tuning(nb_context *ctx, const char *path);
/* Set the entry for g's format, activation dtype, n, k and m bucket on the
 * context's GPU to `cfg` (validated as a loaded entry is), measured at `us`
 * microseconds (>= 0; 0 when unknown); cfg NULL removes it.  Takes effect on
 * the next nb_gemm; size workspaces after it. */
NB_API nb_status nb_context_set_tuning(nb_context *ctx, const nb_gemm_desc *g, const nb_gemm_config *cfg, double us);
/* Entries in the table, and how many of them are for the context's GPU. */
NB_API nb_status nb_context_tuning_count(const nb_context *ctx, size_t *entries, size_t *for_device);
/* The configurations nb_gemm can run for this problem on the context's
 * device, as `nibble tune` tries them: configs[0] is what the heuristic picks
 * (knobs and table aside), the rest are distinct alternatives.  *count
 * receives how many there are; at most `max` are written (configs may be
 * NULL when max is 0).  Needs a device and a packed weight, like nb_gemm. */
NB_API nb_status nb_gemm_list_configs(nb_context *ctx, const nb_gemm_desc *g, nb_gemm_config *configs, size_t max,
                                      size_t *count);

/* ----------------------------------------------------- mixture of experts
 *
 * A mixture-of-experts (MoE) MLP holds E experts, each an MLP of its own; a
 * router picks top_k of them per token (topk_ids [m, top_k] int32) with a
 * weight each (topk_weights [m, top_k] float32), and the token's output is
 * the weighted sum of those experts' outputs.  For token t and slot s
 * (0 <= s < top_k), e = topk_ids[t, s]:
 *     gu  = x[t] . Wgu[e]^T (+ bgu[e])       Wgu[e]: [2I, H], gate and up rows
 *     h_i = act(gate_i, up_i)                i < I (rows of gu by gate_up_layout)
 *     o_s = h . Wd[e]^T (+ bd[e])            Wd[e]: [H, I]
 *   y[t]  = sum over s of topk_weights[t, s] * o_s
 * The router (logits, softmax or sigmoid, top-k, normalisation, DeepSeek's
 * routed scaling factor) and shared experts are the caller's: topk_weights
 * are used as given (any finite value, sums need not be 1).
 *
 * WEIGHTS: each expert's gate_up is one weight of nb_moe_desc.gate_up (n =
 * 2I, k = H) and its down one of nb_moe_desc.down (n = H, k = I), in the
 * checkpoint layout, stored expert-major: with one expert's sizes from
 * nb_weight_get_sizes_v2 (or nb_moe_get_sizes), expert e's codes start at
 * byte e * codes_bytes of one buffer, its scales at e * scales_bytes of
 * another, its zero points likewise.  gpt-oss stores its experts so
 * ([E, R, K/32, 16] blocks: nb_ckpt_moe_weights, nibble_io.h); per-expert
 * checkpoints are copied into this layout (nb_ckpt_moe_read).  Formats with
 * a tensor scale (NVFP4) take one per expert and projection, as arrays of E
 * floats in nb_moe_weights: each NVFP4 expert has its own weight_scale_2,
 * so the descriptors' tensor_scale fields are not used.  Biases (gpt-oss)
 * are [E, 2I] and [E, H] in act_dtype.
 *
 * ACTIVATIONS (nb_moe_activation), g the gate row and u the up row:
 *   SWIGLU      h = silu(g) * u, silu(g) = g / (1 + exp(-g)): Qwen3-MoE,
 *               DeepSeek-V3/R1, Mixtral, Llama-4 (limit and alpha 0);
 *   SWIGLU_OAI  gpt-oss: g' = min(g, limit), u' = min(max(u, -limit), limit),
 *               h = (u' + 1) * (g' / (1 + exp(-alpha * g'))); limit 7.0 and
 *               alpha 1.702 in gpt-oss (transformers' swiglu_limit,
 *               swiglu_alpha).  A NaN g or u stays NaN (not clamped away).
 * GATE/UP LAYOUTS of the 2I rows of Wgu[e] (nb_moe_gate_up_layout):
 *   CONCAT       rows 0 .. I-1 are gate, I .. 2I-1 up: Qwen3-MoE's fused
 *                gate_up_proj, vLLM's w13, and separate gate_proj / up_proj
 *                checkpoints read one after the other;
 *   INTERLEAVED  row 2i is gate i, row 2i+1 up i: gpt-oss.
 *
 * ARITHMETIC of nb_moe_mlp_host (the specification the GPU kernels will be
 * measured against).  Weights are dequantized to float32 as
 * nb_dequantize_host_v2 does, with expert e's tensor scale; x is read from
 * act_dtype; then, per slot:
 *   gu_r = the float32 dot product of x[t] and row r, summed in k order, plus
 *          the bias (float32);
 *   h_i  = the activation in float32 (expf), rounded to act_dtype: what a
 *          fused gate_up kernel writes as the down GEMM's input;
 *   o_s  = the float32 dot product of h and row c of Wd[e] in k order, plus
 *          the bias, rounded to act_dtype: what the down GEMM writes per slot;
 * and per token, acc = 0, then for s = 0, 1, .. top_k - 1: acc = acc +
 * topk_weights[t, s] * o_s (a float32 product and a float32 sum), and y[t] =
 * acc rounded to act_dtype.  Each slot is computed on its own and the
 * combine runs over the slots in top-k order, so the result does not depend
 * on how slots are grouped by expert or in which order experts or threads
 * run: it is deterministic, and a kernel that writes per-slot outputs and
 * then combines them in slot order can match it.  (F32 activations round
 * nothing.)  nb_moe_mlp_host_f64 computes the same in double (exp), without
 * rounding h, o_s or y; it is the yardstick, and tests/test_moe.c states and
 * checks the bound of the float version against it.
 *
 * ROUTING DATA is validated here, on the host (status and message naming the
 * token, slot and value):
 *   topk_ids[t, s] in [0, E)                              INVALID_ARGUMENT
 *   an expert twice within one token                      INVALID_ARGUMENT
 *     (top-k routing picks distinct experts; a repeat means the ids are
 *     wrong, and computing it would count that expert twice)
 *   topk_weights[t, s] not finite (NaN, inf)              INVALID_ARGUMENT
 * GPU functions cannot return a status that depends on the data without a
 * synchronization, so the device versions to come will not check these:
 * check routing with the host functions in tests. */

typedef enum nb_moe_activation {
    NB_MOE_ACT_SWIGLU = 1,    /* silu(gate) * up */
    NB_MOE_ACT_SWIGLU_OAI = 2 /* gpt-oss: clamped, (up + 1) * gate * sigmoid(alpha * gate) */
} nb_moe_activation;

typedef enum nb_moe_gate_up_layout {
    NB_MOE_GATE_UP_CONCAT = 1,     /* gate rows, then up rows */
    NB_MOE_GATE_UP_INTERLEAVED = 2 /* gate, up, gate, up, ... (gpt-oss) */
} nb_moe_gate_up_layout;

/* An MoE MLP problem: shapes, routing width, the two per-expert weights and
 * the activation.  nb_moe_desc_init fills every field; change the weight
 * descriptors' group or scale type, gate_up_layout, limit or alpha after it
 * when a checkpoint needs it, and nb_moe_desc_validate again. */
typedef struct nb_moe_desc {
    int64_t m;                /* tokens, >= 1 */
    int32_t experts;          /* E, >= 1 */
    int32_t top_k;            /* experts per token, 1 .. E */
    int64_t hidden;           /* H: columns of x and y */
    int64_t intermediate;     /* I: rows of gate (and of up) per expert */
    nb_weight_desc gate_up;   /* one expert's gate_up: n = 2I, k = H (tensor_scale not used) */
    nb_weight_desc down;      /* one expert's down: n = H, k = I (tensor_scale not used) */
    int32_t activation;       /* nb_moe_activation */
    int32_t gate_up_layout;   /* nb_moe_gate_up_layout */
    float limit;              /* SWIGLU_OAI: clamp limit > 0 (7.0); SWIGLU: 0 */
    float alpha;              /* SWIGLU_OAI: sigmoid slope > 0 (1.702); SWIGLU: 0 */
    nb_dtype act_dtype;       /* x, y and the biases: F32, F16 or BF16 on the host */
    int32_t reserved[9];      /* zero (nb_moe_desc_init); others are NB_ERR_INVALID_ARGUMENT */
} nb_moe_desc;

/* Fill *d: both weights of `format` with its default group and scale type
 * (nb_weight_desc_init: gate_up [2I, H], down [H, I], checkpoint layout);
 * SWIGLU with CONCAT, limit 0, alpha 0; SWIGLU_OAI with INTERLEAVED, limit
 * 7.0, alpha 1.702 (gpt-oss's); reserved zero.  Returns what
 * nb_moe_desc_validate says of the result. */
NB_API nb_status nb_moe_desc_init(nb_moe_desc *d, nb_format format, int64_t m, int32_t experts, int32_t top_k,
                                  int64_t hidden, int64_t intermediate, nb_moe_activation activation,
                                  nb_dtype act_dtype);
/* Check a descriptor: m in [1, 2^31], experts >= 1, top_k in [1, E]
 * (NB_ERR_BAD_SHAPE, top_k > E NB_ERR_INVALID_ARGUMENT); the weight
 * descriptors (nb_weight_desc_validate) with gate_up [2I, H] and down [H, I]
 * (NB_ERR_BAD_SHAPE naming both shapes); a known activation and layout, limit
 * and alpha positive and finite for SWIGLU_OAI and 0 for SWIGLU
 * (NB_ERR_INVALID_ARGUMENT); a known act_dtype (NB_ERR_UNSUPPORTED); m *
 * top_k slots and the padded routing below 2^31, m * H below 2^50 and E
 * experts' buffers within the address space (NB_ERR_OVERFLOW); reserved zero. */
NB_API nb_status nb_moe_desc_validate(const nb_moe_desc *d);

/* Bytes of the buffers of a problem (host layout). */
typedef struct nb_moe_sizes {
    nb_weight_sizes_v2 gate_up; /* ONE expert's gate_up buffers: the stride between experts */
    nb_weight_sizes_v2 down;    /* one expert's down buffers */
    size_t x_bytes;             /* x and y: m * H elements of act_dtype */
    size_t gate_up_bias_bytes;  /* E * 2I elements of act_dtype */
    size_t down_bias_bytes;     /* E * H elements of act_dtype */
    int32_t reserved[8];        /* zero on return */
} nb_moe_sizes;
NB_API nb_status nb_moe_get_sizes(const nb_moe_desc *d, nb_moe_sizes *out);

/* The weights of an MoE MLP on the host, expert-major (see WEIGHTS above):
 * gate_up.codes holds E * nb_moe_sizes.gate_up.codes_bytes bytes, and so on.
 * zeros is set only for a format with zero points.  reserved must be NULL. */
typedef struct nb_moe_weights {
    nb_weight_data gate_up;      /* E experts' [2I, H] weights */
    nb_weight_data down;         /* E experts' [H, I] weights */
    const float *gate_up_scales; /* [E] tensor scales for a format with one (NVFP4's weight_scale_2); else NULL */
    const float *down_scales;    /* [E], likewise */
    const void *gate_up_bias;    /* [E, 2I] of act_dtype, or NULL */
    const void *down_bias;       /* [E, H] of act_dtype, or NULL */
    const void *reserved[4];
} nb_moe_weights;

/* The MoE MLP on the host (ARITHMETIC above): x [m, H] and y [m, H] of
 * d->act_dtype, row-major; topk_ids and topk_weights [m, top_k].  Both
 * weight descriptors must be in the checkpoint layout.  Statuses: those of
 * nb_moe_desc_validate; NB_ERR_NULL_POINTER (ctx, d, x, w, its codes and
 * scales, topk_ids, topk_weights, y; zeros for a format with zero points;
 * the tensor-scale arrays of a format with a tensor scale);
 * NB_ERR_INVALID_ARGUMENT (routing data above; tensor scales or zeros given
 * for a format without; reserved pointers set; a packed layout);
 * NB_ERR_OUT_OF_MEMORY.  y is written only on success. */
NB_API nb_status nb_moe_mlp_host(nb_context *ctx, const nb_moe_desc *d, const void *x, const nb_moe_weights *w,
                                 const int32_t *topk_ids, const float *topk_weights, void *y);
/* The same in double, y [m, H] double, nothing rounded but the inputs' own
 * values: the yardstick. */
NB_API nb_status nb_moe_mlp_host_f64(nb_context *ctx, const nb_moe_desc *d, const void *x, const nb_moe_weights *w,
                                     const int32_t *topk_ids, const float *topk_weights, double *y);

/* ROUTING LAYOUT for a grouped GEMM that runs each expert's slots in tiles
 * of `block` rows (the kernel's tile along tokens).  Slot i = t * top_k + s
 * stands for token t = i / top_k with weight topk_weights[i] and expert
 * topk_ids[i].  With c[e] the slots of expert e and p[e] = c[e] rounded up
 * to a multiple of block (an expert without slots has p[e] = 0, no block):
 *   expert_offsets [E + 1]  offsets[0] = 0, offsets[e + 1] = offsets[e] +
 *                           p[e]; offsets[E], a multiple of block, is the
 *                           padded total;
 *   expert_counts  [E]      c[e] (optional: may be NULL);
 *   sorted_slots   [sorted_len]  entries offsets[e] .. offsets[e] + c[e] - 1
 *                           are expert e's slots in ascending order; every
 *                           other entry (the padding of each expert, and
 *                           everything from offsets[E] to the end) is the
 *                           sentinel m * top_k;
 *   block_experts  [blocks]  block b covers sorted_slots[b * block ..
 *                           b * block + block - 1] and holds its expert, the
 *                           e with offsets[e] <= b * block < offsets[e + 1];
 *                           -1 for every block from offsets[E] / block on.
 * The lengths (nb_moe_align_get_sizes) are the worst case over all routings,
 * sorted_len = m * top_k + E * (block - 1) and blocks = ceil(sorted_len /
 * block), so a launch over every block does not depend on the routing (it
 * can be captured in a CUDA graph) and its spare blocks see -1.  This is
 * vLLM's moe_align_block_size layout (sorted_token_ids, expert_ids,
 * num_tokens_post_padded = offsets[E]) with one difference: the order within
 * an expert is fixed (ascending slots), so every byte of every buffer is
 * determined by the routing and a device version must reproduce it. */
typedef struct nb_moe_align_sizes {
    int64_t slots;       /* m * top_k (also the sentinel) */
    int64_t sorted_len;  /* int32 elements of sorted_slots */
    int64_t blocks;      /* int32 elements of block_experts */
    int64_t offsets_len; /* int32 elements of expert_offsets: E + 1 (expert_counts: E) */
    int32_t reserved[8]; /* zero on return (and in a capacity passed in) */
} nb_moe_align_sizes;

/* The lengths for d (m, experts, top_k) and block in [1, 4096]
 * (NB_ERR_INVALID_ARGUMENT otherwise). */
NB_API nb_status nb_moe_align_get_sizes(const nb_moe_desc *d, int32_t block, nb_moe_align_sizes *out);
/* The routing layout of topk_ids (validated as nb_moe_mlp_host does) into
 * host buffers holding at least the elements `capacity` gives (filled by
 * nb_moe_align_get_sizes; NB_ERR_BUFFER_TOO_SMALL when one is short, naming
 * it; capacity->slots is not used).  expert_counts may be NULL. */
NB_API nb_status nb_moe_align_host(nb_context *ctx, const nb_moe_desc *d, int32_t block, const int32_t *topk_ids,
                                   int32_t *sorted_slots, int32_t *block_experts, int32_t *expert_offsets,
                                   int32_t *expert_counts, const nb_moe_align_sizes *capacity);

/* ---------------------------------------------- mixture of experts on the GPU
 *
 * nb_moe_mlp runs the whole MoE MLP above on the device, none of its
 * launches per expert: the routing layout (nb_moe_align), the gate_up
 * grouped GEMM with the activation applied in its epilogue (h [m * top_k,
 * I]), the down grouped GEMM (o [m * top_k, H]), and the combine in top-k
 * order.  Each launch covers the most routing blocks any routing can fill
 * (min(E, m * top_k) + m * top_k / block), so the work does not depend on
 * the routing on the host: no host synchronization, no allocation,
 * capturable in a CUDA graph.  An expert without tokens reads
 * none of its weights.  Two kernel paths, chosen from the average number of
 * slots per expert (m * top_k / E):
 *   - decode (fewer than 24): the decode kernels' tensor-core step
 *     (gemv_fp4.cu) applied to blocks of up to 8 * mt slots of one expert,
 *     so every active expert's weights stream once per block; when few
 *     experts are active (batch 1) two warps may split each row block's k;
 *   - tensor-core tiles (24 or more, Hopper sm_90a): the token rows are
 *     first gathered per expert (one more launch), then each tile of 128
 *     weight rows x 64, 128 or 192 tokens of one expert runs on wgmma with
 *     TMA loads, as nb_gemm's tensor-core path does (one CTA per SM, each
 *     walking tiles; the width with the fewest expected padded tiles times
 *     their cost).
 * At batch 1 (at most 8 slots, every CTA in one wave) the decode path runs
 * two launches: each CTA of gate_up and down computes its part of the
 * routing layout from topk_ids, and down's last CTA per group of columns
 * runs the combine; the output is bit for bit the four-launch one.
 * nb_gemm_last_config names the path, block, split and routing afterwards.
 * NIBBLE_MOE_PATH (decode, tc), NIBBLE_MOE_KW (1, 2, 4, 8),
 * NIBBLE_MOE_TC_BN (64, 128, 192) and NIBBLE_MOE_ROUTE (kernel, inline: up to
 * 64 slots), read at context creation, fix these choices for measurement
 * and tests; nb_context_create refuses other values.
 * NVFP4 and MXFP4, F16 and BF16 activations.
 *
 * WEIGHTS on the device are packed per expert (nb_moe_pack_host; the
 * layout of nb_pack with one change for gate_up: packed row block b holds
 * gate rows 8b .. 8b+7 then up rows 8b .. 8b+7, so one lane holds both
 * operands of the activation).  Packing sets both descriptors' layout to
 * NB_LAYOUT_PACKED and, for MXFP4, their scale exponent range over all
 * experts.
 *
 * ARITHMETIC: that of nb_moe_mlp_host (h, o_s and y rounded to act_dtype at
 * the same points, the combine in top-k order) with float32 dot products
 * summed in the tensor cores' order instead of k order, and the activation's
 * sigmoid by the hardware's approximate exponential and reciprocal (a few
 * ulps of float32 from expf and a division); tests/test_gpu_moe.c
 * checks every result of both paths against nb_moe_mlp_host_f64 with the
 * bound the host float version meets. Routing data is not validated on the device (see
 * ROUTING DATA): ids outside [0, E) are ignored (that slot contributes 0). */

/* Bytes of the packed weights: one expert's (the stride between experts)
 * and all E experts'. */
typedef struct nb_moe_packed_sizes {
    size_t gate_up_expert_bytes;
    size_t down_expert_bytes;
    size_t gate_up_bytes;        /* E * gate_up_expert_bytes */
    size_t down_bytes;           /* E * down_expert_bytes */
    int32_t reserved[8];         /* zero on return */
} nb_moe_packed_sizes;
/* d as nb_moe_desc_validate accepts it (either layout), with a format the
 * GPU kernels serve (NB_ERR_UNSUPPORTED otherwise). */
NB_API nb_status nb_moe_packed_get_sizes(const nb_moe_desc *d, nb_moe_packed_sizes *out);

/* Pack E experts' checkpoint-layout weights w (host memory, nb_moe_weights
 * as for nb_moe_mlp_host; the tensor scales and biases are not read here)
 * into gate_up_packed and down_packed (host memory of at least the
 * nb_moe_packed_get_sizes bytes, given as *_bytes).  On success d's weight
 * descriptors are marked packed (with the MXFP4 scale range); d is left
 * unchanged on failure. */
NB_API nb_status nb_moe_pack_host(nb_context *ctx, nb_moe_desc *d, const nb_moe_weights *w, void *gate_up_packed,
                                  size_t gate_up_bytes, void *down_packed, size_t down_bytes);

/* Device pointers of a packed MoE MLP. */
typedef struct nb_moe_packed_weights {
    const void *gate_up;         /* E experts' packed gate_up, 16-byte aligned */
    const void *down;            /* E experts' packed down, 16-byte aligned */
    const float *gate_up_scales; /* [E] tensor scales (NVFP4: required; MXFP4: NULL) */
    const float *down_scales;    /* [E] likewise */
    const void *gate_up_bias;    /* [E, 2I] of act_dtype in the checkpoint's row order, or NULL */
    const void *down_bias;       /* [E, H] of act_dtype, or NULL */
    const void *reserved[4];     /* NULL */
} nb_moe_packed_weights;

/* Device workspace of nb_moe_mlp for d (packed): the routing layout, the
 * per-slot intermediates h and o and, on the tensor-core path, the gathered
 * token rows [m * top_k, H]; it depends on m, E, top_k, H, I and the device
 * only (the routing does not change it). */
NB_API nb_status nb_moe_workspace_size(nb_context *ctx, const nb_moe_desc *d, size_t *bytes);

/* y [m, H] = the MoE MLP of x [m, H] (act_dtype F16 or BF16; rows of H
 * elements, 16-byte aligned, H and I multiples of 8) on ctx's device, in
 * stream.  topk_ids [m, top_k] int32 and topk_weights [m, top_k] float32 are
 * device memory.  Statuses: nb_moe_desc_validate's; NB_ERR_INVALID_ARGUMENT
 * (weights not packed by nb_moe_pack_host, reserved set, tensor scales given
 * or missing); NB_ERR_UNSUPPORTED (format, dtype, H or I not a multiple of 8,
 * an MXFP4 scale span the dtype cannot hold exactly); NB_ERR_NULL_POINTER;
 * NB_ERR_MISALIGNED; NB_ERR_WORKSPACE; NB_ERR_NO_DEVICE; NB_ERR_CUDA.
 * nb_gemm_last_config names the kernels and the block size afterwards. */
NB_API nb_status nb_moe_mlp(nb_context *ctx, const nb_moe_desc *d, const void *x, const nb_moe_packed_weights *w,
                            const int32_t *topk_ids, const float *topk_weights, void *y, void *workspace,
                            size_t workspace_bytes, void *stream);

/* The routing layout of nb_moe_align_host, computed on the device from
 * device topk_ids into device buffers (capacity from nb_moe_align_get_sizes;
 * block in [1, 1024]); byte for byte what nb_moe_align_host writes for valid
 * routing.  expert_counts may be NULL.  E at most 4096 (also for nb_moe_mlp). */
NB_API nb_status nb_moe_align(nb_context *ctx, const nb_moe_desc *d, int32_t block, const int32_t *topk_ids,
                              int32_t *sorted_slots, int32_t *block_experts, int32_t *expert_offsets,
                              int32_t *expert_counts, const nb_moe_align_sizes *capacity, void *stream);

/* ------------------------------------------ gated activations (dense MLPs)
 *
 * A dense gated MLP is down(act(gate(x), up(x))).  With gate and up fused
 * into one layer (one GEMM of 2I rows: gu [m, 2I]), nb_glu computes the
 * down projection's input h [m, I] from gu:
 *
 *   h[t, i] = act(gu[t, gi], gu[t, ui]),  gi, ui = i, I + i      (CONCAT)
 *                                                 2i, 2i + 1     (INTERLEAVED)
 *
 * with the activations of the MoE MLP above (nb_moe_activation: SWIGLU,
 * silu(g) * u; SWIGLU_OAI, gpt-oss's clamped variant with limit and alpha)
 * and its gate/up layouts (nb_moe_gate_up_layout).  Arithmetic: g and u read
 * from dtype, act evaluated in float32 (expf, IEEE division), rounded once
 * to dtype (RNE; a NaN stays NaN).  nb_glu_host is that specification; the
 * device's expf is within 2 float32 ulps of the host's, so a device result
 * equals the host's or, where the float32 value lies within a few ulps of a
 * dtype rounding boundary, differs from it by one dtype ulp
 * (tests/test_gpu_moe.c counts both).  An engine's "silu_and_mul".
 *
 * On the device nb_glu is one small kernel.  Launched after one of this
 * context's own kernels in the same stream capture (the gate_up nb_gemm),
 * it starts while that kernel ends, and the nb_gemm launched after it (the
 * down projection) starts its weight prefetch while it runs (programmatic
 * dependent launch, as between nb_gemm calls; nibble.h "tuning",
 * NIBBLE_PDL): in a compiled model step that replaces the framework's
 * activation kernel between two nibble calls. */

/* A gated activation problem.  nb_glu_desc_init fills every field; change
 * layout, limit or alpha after it when a model needs it. */
typedef struct nb_glu_desc {
    int64_t m;            /* rows, >= 1 */
    int64_t n;            /* I: columns of h; gu has 2I */
    int32_t activation;   /* nb_moe_activation */
    int32_t layout;       /* nb_moe_gate_up_layout of gu's 2I columns */
    float limit;          /* SWIGLU_OAI: clamp limit > 0 (7.0); SWIGLU: 0 */
    float alpha;          /* SWIGLU_OAI: sigmoid slope > 0 (1.702); SWIGLU: 0 */
    nb_dtype dtype;       /* gu and h: BF16 or F16 (F32 too on the host) */
    int32_t reserved[7];  /* zero (nb_glu_desc_init); others are NB_ERR_INVALID_ARGUMENT */
} nb_glu_desc;

/* Fill *d: SWIGLU with CONCAT, limit 0, alpha 0; SWIGLU_OAI with
 * INTERLEAVED, limit 7.0, alpha 1.702 (gpt-oss); reserved zero.  Returns
 * what nb_glu_desc_validate says of the result. */
NB_API nb_status nb_glu_desc_init(nb_glu_desc *d, nb_moe_activation activation, int64_t m, int64_t n, nb_dtype dtype);
/* Check a descriptor: m and n in [1, 2^31] and m x 2n below 2^50
 * (NB_ERR_BAD_SHAPE); a known activation and layout, limit and alpha as
 * nb_moe_desc_validate wants them (NB_ERR_INVALID_ARGUMENT); a known dtype
 * (NB_ERR_UNSUPPORTED); reserved zero. */
NB_API nb_status nb_glu_desc_validate(const nb_glu_desc *d);
/* The reference on the host: gu [m, 2n] and h [m, n] of dtype, row-major.
 * ctx may be NULL. */
NB_API nb_status nb_glu_host(nb_context *ctx, const nb_glu_desc *d, const void *gu, void *h);
/* The same on the device, on `stream`: gu and h device buffers of BF16 or
 * F16 (NB_ERR_UNSUPPORTED for F32), 2-byte aligned (NB_ERR_MISALIGNED), not
 * overlapping (NB_ERR_INVALID_ARGUMENT); no host sync, no allocation,
 * graph-capturable.  NB_ERR_NO_DEVICE for a host context. */
NB_API nb_status nb_glu(nb_context *ctx, const nb_glu_desc *d, const void *gu, void *h, void *stream);

/* ---------------------------------------------------- scalar conversions */

/* Exact decoders, exposed for tools and tests. */
NB_API float nb_e2m1_to_float(uint8_t code);  /* low 4 bits used */
/* The value of code `code` of element type `type` (low element_bits bits
 * used; NF4 and bitsandbytes FP4: the table's float32 value; the integer
 * types: the integer); NaN for a type that is not an nb_element_type. */
NB_API float nb_element_to_float(nb_element_type type, uint8_t code);
NB_API float nb_e4m3_to_float(uint8_t byte);  /* 0x7F, 0xFF -> NaN */
NB_API float nb_e8m0_to_float(uint8_t byte);  /* 0xFF -> NaN */
/* Round-to-nearest-even encoders with saturation.  NaN gives 0x7F (E4M3 NaN)
 * and 0x7 (+6: E2M1 has no NaN; nb_quantize rejects non-finite input). */
NB_API uint8_t nb_float_to_e2m1(float x);
NB_API uint8_t nb_float_to_e4m3(float x);

#ifdef __cplusplus
}
#endif
#endif /* NIBBLE_H */
