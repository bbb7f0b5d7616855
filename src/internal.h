/* internal.h - shared by the host C files and the CUDA launchers (C linkage).
 * Nothing here is part of the public API. */
#ifndef NB_INTERNAL_H
#define NB_INTERNAL_H

#include "nibble.h"

#include <stdarg.h>
#include <stdbool.h>

#ifdef __cplusplus
extern "C" {
#endif

#define NB_INTERNAL __attribute__((visibility("hidden")))
#define NB_ERRBUF 512

/* ------------------------------------------------------------ context */
struct nb_context {
    nb_device_info info;
    int has_device;
    char last_error[NB_ERRBUF];
    char last_config[256];
    int table_shift[3][4];       /* [format][dtype]: shift of the cached table, INT32_MIN = none */
    uint32_t table[3][4][128];   /* cached adjusted scale tables (see gemv_fp4.cu) */
    int force_splits;            /* NIBBLE_SPLITS environment variable, 0 = heuristic */
    int force_kw;                /* NIBBLE_KW environment variable, 0 = heuristic */
    int force_xs;                /* NIBBLE_XS: 0 heuristic, 1 kernel 1 only, 2 staged-activation kernel for mt >= 2 */
    int force_rpw;               /* NIBBLE_RPW: row blocks per warp of that kernel (1, 2), 0 = heuristic */
    int force_path;              /* NIBBLE_PATH: 0 heuristic, 1 decode kernel, 2 tensor-core kernel (Hopper),
                                  * 3 mma.sync tensor-core kernel (gemm_sm80.cu) */
    int force_bn;                /* NIBBLE_BN: tensor-core tile width in tokens (64, 128, 256), 0 = heuristic */
    int force_stages;            /* NIBBLE_STAGES: pipeline depth of the mma kernel (2, 3), 0 = deepest that fits */
    int force_group;             /* NIBBLE_RASTER: n tiles per raster group, 0 = heuristic */
    struct nbi_tune_table *tune; /* tuning table (tune.c), NULL when empty */
};

/* Record a failure (context buffer when ctx != NULL, and the thread-local
 * buffer) and return `st`. */
NB_INTERNAL nb_status nbi_fail(nb_context *ctx, nb_status st, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

/* -------------------------------------------------------- format traits */
/* One row per format, generated from NB_FORMAT_LIST (nibble.h): a new format
 * is a new row there, its codec (formats.c), its kernels' instances
 * (NBI_KERNEL_FORMATS) and its tests -- not a new code path. */

/* Position of each format in NB_FORMAT_LIST: array sizes and caches. */
enum {
#define NBI_X_INDEX(NAME, ...) NBI_FORMAT_INDEX_##NAME,
    NB_FORMAT_LIST(NBI_X_INDEX)
#undef NBI_X_INDEX
    NBI_FORMAT_COUNT
};

/* The formats and activation dtypes the GPU kernels are instantiated for
 * (pack, the decode and tensor-core paths): X(NAME, A) for each, A passed
 * through.  A format outside this list is NB_ERR_UNSUPPORTED on the device. */
#define NBI_KERNEL_FORMATS(X, A) X(NVFP4, A) X(MXFP4, A)
#define NBI_KERNEL_DTYPES(X, A) X(BF16, A) X(F16, A)

typedef struct nbi_format_traits {
    nb_format format;
    const char *name;
    nb_element_type element;
    int element_bits;
    int group;             /* elements per block scale */
    nb_scale_type scale_type;
    int scale_bytes;       /* bytes per block scale */
    int tensor_scale;      /* 1: a per-tensor FP32 scale (computed by quantize when 0) */
    int zero_point;        /* 1: blocks carry a zero point */
    int index;             /* position in NB_FORMAT_LIST */
    int kernels;           /* in NBI_KERNEL_FORMATS */
    int chunk_scale_bytes; /* scale bytes in one packed chunk (16 rows x 128 k) */
} nbi_format_traits;

/* NULL for a value that is not a format of this library. */
NB_INTERNAL const nbi_format_traits *nbi_traits(nb_format f);

/* Packed (kernel) layout: chunks of 16 rows x 128 k; see gemv_fp4.cu. */
#define NBI_CHUNK_ROWS 16
#define NBI_CHUNK_K 128
#define NBI_CHUNK_CODE_BYTES 1024
/* Split-K arrival counters at the start of the gemm workspace. */
#define NBI_MAX_SPLIT_COLUMNS 4096
#define NBI_SM90_MAX_SPLITS 8 /* tensor-core path: CTAs per tile along k */

NB_INTERNAL size_t nbi_chunk_bytes(const nbi_format_traits *t);

/* Scalar codecs (formats.c). */
NB_INTERNAL float nbi_element(nb_element_type t, uint8_t code);       /* the value of a code */
NB_INTERNAL uint8_t nbi_to_element(nb_element_type t, float x);       /* round to nearest even, saturating */
NB_INTERNAL float nbi_element_max(nb_element_type t);                 /* largest magnitude */
NB_INTERNAL float nbi_e2m1(uint8_t code);
NB_INTERNAL float nbi_e4m3(uint8_t b);
NB_INTERNAL float nbi_e8m0(uint8_t b);
NB_INTERNAL float nbi_scale(nb_scale_type t, uint8_t b);
NB_INTERNAL float nbi_scale_max(nb_scale_type t);                    /* largest finite scale */
/* Checkpoint codes: element_bits per code, packed little-end first in each
 * byte (two 4-bit codes: the even element in the low nibble). */
NB_INTERNAL size_t nbi_codes_bytes(const nbi_format_traits *t, int64_t elements);
NB_INTERNAL uint8_t nbi_code_get(const nbi_format_traits *t, const uint8_t *codes, int64_t i);
NB_INTERNAL void nbi_code_put(const nbi_format_traits *t, uint8_t *codes, int64_t i, uint8_t c); /* ORs into zeroed bytes */
/* "nvfp4, mxfp4": the names of every format, for messages. */
NB_INTERNAL void nbi_format_names(char *buf, size_t len);
NB_INTERNAL uint8_t nbi_to_e2m1(float x);
NB_INTERNAL uint8_t nbi_to_e4m3(float x);

/* float <-> 16-bit storage, round to nearest even, NaN kept NaN. */
NB_INTERNAL uint16_t nbi_f32_to_bf16(float x);
NB_INTERNAL uint16_t nbi_f32_to_f16(float x);
NB_INTERNAL float nbi_bf16_to_f32(uint16_t h);
NB_INTERNAL float nbi_f16_to_f32(uint16_t h);
NB_INTERNAL size_t nbi_dtype_size(nb_dtype t);
NB_INTERNAL const char *nbi_dtype_name(nb_dtype t);
NB_INTERNAL float nbi_load(nb_dtype t, const void *p, size_t i);
NB_INTERNAL void nbi_store(nb_dtype t, void *p, size_t i, float v);

/* Validation shared by host and device entry points (ctx may be NULL). */
NB_INTERNAL nb_status nbi_check_desc(nb_context *ctx, const nb_weight_desc *d, nb_layout want);
NB_INTERNAL nb_status nbi_check_gemm(nb_context *ctx, const nb_gemm_desc *g, nb_layout want, bool host);

/* nb_pack and nb_pack_host: the format has a packed layout, *sz its sizes,
 * and packed_bytes holds it (the descriptor was checked). */
NB_INTERNAL nb_status nbi_packed_size(nb_context *ctx, const nb_weight_desc *d, size_t packed_bytes,
                                      nb_weight_sizes *sz, const char *fn);

/* MXFP4 scale-exponent range of checkpoint scales (bytes != 0xFF). */
NB_INTERNAL void nbi_scale_exp_range(const uint8_t *scales, size_t count, int32_t *emin, int32_t *emax);

/* ------------------------------------------------------------ gemm plan */
typedef struct nbi_gemm_plan {
    int fmt;            /* nb_format */
    int act;            /* nb_dtype of X, Y, bias (F16 or BF16) */
    int mt;             /* token tiles of 8: 1..4 */
    int warps;          /* warps per CTA */
    int kw;             /* warps sharing one 16-row block (in-CTA split of k) */
    int xsh;            /* kernel 2: activations staged per CTA in shared memory (mt >= 2; kw = 1) */
    int rpw;            /* kernel 2: row blocks per warp (1 or 2), sharing the activation fragments */
    int64_t m, n, k;
    int64_t lda, ldc;
    int64_t row_blocks; /* ceil(n / 16) */
    int64_t kchunks;    /* ceil(k / 128) */
    int grid_x;         /* CTAs along n */
    int splits;         /* CTAs along k (both paths) */
    int chunks_per_split;
    int exp_shift;      /* epilogue multiplies by 2^exp_shift ... */
    float tensor_scale; /* ... and by tensor_scale */
    int table_shift;    /* scale table entries are ldexp(scale, table_shift) */
    int pdl;            /* launch with programmatic dependent launch (sm_90+) */
    /* Tensor-core paths (gemm_sm90.cu, gemm_sm80.cu), when path != NBI_PATH_GEMV: */
    int path;           /* NBI_PATH_GEMV, NBI_PATH_SM90 or NBI_PATH_SM80 */
    int bn;             /* tokens per CTA tile: 64, 128 or 256 (sm80: 64, 128) */
    int stages;         /* sm80: chunks in the cp.async ring (chosen by the shared-memory limit) */
    int tiles_n, tiles_m, raster_group;
    int tuned;          /* a tuning-table entry chose this configuration (tune.c) */
    uint32_t scale_table[128]; /* 256 adjusted 16-bit scales, two per word */
    size_t ws_partial_bytes;
    size_t ws_counter_bytes;
} nbi_gemm_plan;

enum { NBI_PATH_GEMV = 0, NBI_PATH_SM90 = 1, NBI_PATH_SM80 = 2 };

/* The plan nb_gemm runs: the tuning table's entry for the problem when there
 * is one and no NIBBLE_* knob is set, else the knobs and the heuristic
 * (tune.c). */
NB_INTERNAL nb_status nbi_gemm_make_plan(nb_context *ctx, const nb_gemm_desc *g, nbi_gemm_plan *p);
/* The plan the ctx->force_* knobs and the heuristic give (device.c). */
NB_INTERNAL nb_status nbi_gemm_make_plan_knobs(nb_context *ctx, const nb_gemm_desc *g, nbi_gemm_plan *p);

/* ------------------------------------------------- tuning table (tune.c) */
typedef struct nbi_tune_table nbi_tune_table;
/* The entry for this problem on the context's GPU: 1 and *out, or 0. */
NB_INTERNAL int nbi_tune_lookup(const nb_context *ctx, int fmt, int act, int64_t n, int64_t k, int64_t m,
                                nb_gemm_config *out);
/* Append " tuned" to ctx->last_config when a table entry chose plan p. */
NB_INTERNAL void nbi_tune_label(nb_context *ctx, const nbi_gemm_plan *p);
/* The m values whose plans cover every m (1..32, then one per bucket): the
 * workspace must fit them all.  Returns how many were written (at most max). */
NB_INTERNAL int nbi_tune_workspace_ms(int64_t *ms, int max);
/* Context creation: load the file NIBBLE_TUNE_CACHE names, if it exists. */
NB_INTERNAL nb_status nbi_tune_load_env(nb_context *ctx);
NB_INTERNAL void nbi_tune_free(nb_context *ctx);
/* Parse a cache from memory (`name` for messages) into a new table; the
 * reason in err (NB_ERRBUF bytes) on failure. */
NB_INTERNAL nb_status nbi_tune_parse(const char *text, size_t len, const char *name, nbi_tune_table **out,
                                     char *err);
NB_INTERNAL void nbi_tune_table_free(nbi_tune_table *t);

/* ------------------------------------------ CUDA side (device.c stubs) */
/* Each returns 0 on success or a cudaError_t value; on failure `err`
 * (NB_ERRBUF bytes) holds a message. */
NB_INTERNAL int nbi_cuda_available(void);
NB_INTERNAL int nbi_cuda_device_count(int *count, char *err);
NB_INTERNAL int nbi_cuda_device_info(int device, nb_device_info *info, char *err);
NB_INTERNAL int nbi_cuda_dequantize(const nb_weight_desc *d, const uint8_t *codes, const uint8_t *scales,
                                    nb_dtype dst_dtype, void *dst, void *stream, char *err);
NB_INTERNAL int nbi_cuda_pack(const nb_weight_desc *d, const uint8_t *codes, const uint8_t *scales,
                              void *packed, int32_t *emin, int32_t *emax, void *stream, char *err);
/* Quantize (quantize.cu): the scan reads back the first non-finite element
 * index (-1 when none) and the absolute maximum, synchronizing `stream`; the
 * block pass is asynchronous.  d->tensor_scale is final for the block pass. */
NB_INTERNAL int nbi_cuda_quantize_scan(const nb_weight_desc *d, nb_dtype src_dtype, const void *src, int64_t *bad,
                                       float *amax, void *stream, char *err);
NB_INTERNAL int nbi_cuda_quantize(const nb_weight_desc *d, nb_dtype src_dtype, const void *src, uint8_t *codes,
                                  uint8_t *scales, void *stream, char *err);
/* Device memory for nb_quantize_staged (quantize.cu).  nbi_cuda_copy copies
 * host -> device (to_device 1) or device -> host on `stream` and waits. */
NB_INTERNAL int nbi_cuda_malloc(void **p, size_t bytes, char *err);
NB_INTERNAL void nbi_cuda_free(void *p);
NB_INTERNAL int nbi_cuda_copy(void *dst, const void *src, size_t bytes, int to_device, void *stream, char *err);
NB_INTERNAL int nbi_cuda_gemm(const nbi_gemm_plan *p, const void *x, const void *packed, const void *bias,
                              void *y, void *workspace, void *stream, char *err);
NB_INTERNAL int nbi_cuda_gemm_sm90(const nbi_gemm_plan *p, const void *x, const void *packed, const void *bias,
                                   void *y, void *workspace, void *stream, char *err);
NB_INTERNAL int nbi_cuda_has_sm90a(void);
NB_INTERNAL int nbi_cuda_gemm_sm80(const nbi_gemm_plan *p, const void *x, const void *packed, const void *bias,
                                   void *y, void *stream, char *err);
/* The mma.sync kernel (gemm_sm80.cu): the pipeline depth of the deepest
 * instance of tile width bn (and depth `want` when not 0) whose shared
 * memory fits smem_limit, its bytes in *smem; 0 when none does. */
NB_INTERNAL int nbi_cuda_gemm_sm80_stages(int fmt, int bn, int want, size_t smem_limit, size_t *smem);
NB_INTERNAL int nbi_cuda_gemm_naive(const nb_gemm_desc *g, const void *x, const uint8_t *codes,
                                    const uint8_t *scales, const void *bias, float *y, void *stream, char *err);
NB_INTERNAL const char *nbi_cuda_archs(void);
NB_INTERNAL int nbi_cuda_gemv_shape(int *warps, int *stages);
/* Shared memory per CTA of a decode kernel (static + dynamic), for occupancy. */
NB_INTERNAL size_t nbi_cuda_gemv_smem(int fmt, int xs, int rpw, int mt, int m);


#ifdef __cplusplus
}
#endif
#endif
