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
/* The formats that nb_pack, the decode kernel 1 and (NBI_TC_FORMATS) the
 * tensor-core kernels serve (the integer formats and bitsandbytes' table
 * formats: gemv_fp4.cu "INTEGER FORMATS" and "TABLE FORMATS"); where the
 * tensor-core kernels do not run, nb_gemm runs every m through the decode
 * kernel, 32 rows per launch.  Not in NBI_KERNEL_FORMATS: no other kernel
 * family (quantize, dequantize, MoE) decodes them. */
#define NBI_DECODE_FORMATS(X, A) X(INT4, A) X(INT4_SYM, A) X(INT8, A) X(NF4, A) X(BNB_FP4, A) X(INT4_HQQ, A)
/* Of those, the ones the tensor-core kernels (Hopper's, mma.sync) also
 * serve for larger m (tc_dequant.cuh "integer formats", "table formats"). */
#define NBI_TC_FORMATS(X, A) X(INT4, A) X(INT4_SYM, A) X(INT8, A) X(NF4, A) X(BNB_FP4, A) X(INT4_HQQ, A)

typedef struct nbi_format_traits {
    nb_format format;
    const char *name;
    nb_element_type element;
    int element_bits;
    int group;             /* elements per block scale: the default */
    int groups;            /* the groups accepted (NB_GROUPS_* bits) */
    nb_scale_type scale_type; /* the default */
    int scale_types;       /* the scale types accepted (NB_SCALE_BIT bits) */
    int scale_bytes;       /* bytes per block scale of the default type */
    int tensor_scale;      /* 1: a per-tensor FP32 scale (computed by quantize when 0) */
    int zero_point;        /* nb_zero_type: NB_ZERO_U8 or NB_ZERO_FLOAT when groups carry a zero point */
    int index;             /* position in NB_FORMAT_LIST */
    int kernels;           /* in NBI_KERNEL_FORMATS or NBI_DECODE_FORMATS: nb_pack and nb_gemm serve it */
    int every_kernel;      /* in NBI_KERNEL_FORMATS: every kernel family serves it */
    int tensor_core;       /* in NBI_KERNEL_FORMATS or NBI_TC_FORMATS: the Hopper tensor-core kernel serves it */
    int chunk_scale_bytes; /* scale bytes in one packed chunk (16 rows x 128 k) */
    int code_shift;        /* log2 of the codes per byte (8 / element_bits: 2, 4, 8 bits) */
} nbi_format_traits;

/* NULL for a value that is not a format of this library. */
NB_INTERNAL const nbi_format_traits *nbi_traits(nb_format f);
/* The row at position index of NB_FORMAT_LIST; NULL past the end. */
NB_INTERNAL const nbi_format_traits *nbi_traits_at(int index);

/* ------------------------------------------------------------ context */
#define NBI_SM90_MAX_SPLITS 8 /* tensor-core path: CTAs per tile along k */
#define NBI_SM90_INSTANCES 8  /* tensor-core kernel shapes: bn 16..256 with 2 consumer warpgroups, 16 and 32 with 4,
                                 192 with 2 */

struct nb_context {
    nb_device_info info;
    int has_device;
    char last_error[NB_ERRBUF];
    char last_config[256];
    /* the adjusted scale table of the last plan per format and dtype (plan.c):
     * its shift (INT32_MIN = none) and its 128 words */
    int table_shift[NBI_FORMAT_COUNT][4];
    uint32_t table[NBI_FORMAT_COUNT][4][128];
    int env_path;                /* NIBBLE_PATH at creation: an nb_gemm_path, 0 when unset */
    int env_no_cluster;          /* NIBBLE_SM90_CLUSTER=0 at creation: tensor-core split-K through the workspace */
    int env_no_tail;             /* NIBBLE_SM90_TAIL=0 at creation: no split of the tensor-core kernel's last wave */
    int env_sk;                  /* NIBBLE_SM90_SK at creation: 0 never the tensor-core stream-K grid, 1 wherever
                                    it can run, -1 (unset) where the planner's model charges less */
    int env_k2_rpw;              /* NIBBLE_K2_RPW at creation: 2 or 4 row blocks per warp on decode kernel 2's
                                    17..32-token wave wherever it can run; 0 (unset) the planner's rule
                                    (plan.c k2_rpw4) */
    int env_moe_path;            /* NIBBLE_MOE_PATH at creation: 1 decode, 2 tc, 0 when unset */
    int env_moe_kw;              /* NIBBLE_MOE_KW at creation: 1, 2, 4 or 8; 0 when unset */
    int env_moe_bn;              /* NIBBLE_MOE_TC_BN at creation: 64 or 128; 0 when unset */
    int env_moe_route;           /* NIBBLE_MOE_ROUTE at creation: 1 kernel, 2 inline; 0 when unset */
    int env_pdl;                 /* NIBBLE_PDL at creation: 1 ("0") nb_gemm launches without programmatic
                                  * dependent launch, 2 ("1") with it, 3 ("auto") or 0 (unset) with it where
                                  * it follows one of this context's own launches or a kernel that took
                                  * it itself (device.c pdl_head) */
    /* under stream capture, the graph node of this context's last nb_gemm
     * or nb_glu launch and its capture's id (device.c nbi_pdl_end; NULL / 0: none) */
    void *own_node;
    unsigned long long own_capture;
    int own_k2;                  /* that launch's pdl_k2 signature (0: not kernel 2's split grid at
                                  * 2..8 tokens; nb_glu: 0) */
    /* clusters of s CTAs of the tensor-core kernel that run at once, per
     * instance (plan.c sm90_instance) and s (plan.c asks nbi_cuda_sm90_clusters
     * once and keeps the answer + 1 here; 0: not asked yet) */
    int sm90_clusters[NBI_SM90_INSTANCES][NBI_SM90_MAX_SPLITS + 1];
    struct nbi_tune_table *tune; /* tuning table (tune.c), NULL when empty */
};

/* Record a failure (context buffer when ctx != NULL, and the thread-local
 * buffer) and return `st`.  A message longer than NB_ERRBUF - 1 bytes keeps
 * its head and its tail (where the reason is) around "...". */
NB_INTERNAL nb_status nbi_fail(nb_context *ctx, nb_status st, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
/* s for a message, in buf (cap bytes): s itself when it fits, else its head
 * and tail around "..." (a long path keeps its start and its file name). */
NB_INTERNAL const char *nbi_elide(const char *s, char *buf, size_t cap);

/* Packed (kernel) layout: chunks of 16 rows x 128 k (docs/formats.md
 * section 8, the comment at the top of gemv_fp4.cu). */
#define NBI_CHUNK_ROWS 16
#define NBI_CHUNK_K 128
#define NBI_CHUNK_CODE_BYTES 1024 /* 4-bit codes; 8-bit codes (int8) take twice as many */
/* E2M1 codes in a packed word (docs/formats.md 8.2): element e (0..7, in k
 * order) is pair p = e / 2's low (e even) or high (e odd) 16-bit half, and
 * in its half the code's bits e1 e0 m (code & 7) occupy NBI_E2M1_MAG(p) ..
 * +2 and its sign (code bit 3) bit NBI_E2M1_SIGN(p): pair 0 at 6..8 and 15
 * (already where a BF16 operand wants them), pair 1 at 3..5 and 12, pair 2
 * at 0..2 and 13, pair 3 at 9..11 and 14.  Macros, so that the C packer and
 * the kernels (src/cuda) read one definition. */
#define NBI_E2M1_MAG(p) ((p) == 0 ? 6 : (p) == 1 ? 3 : (p) == 2 ? 0 : 9)
#define NBI_E2M1_SIGN(p) ((p) == 0 ? 15 : (p) == 1 ? 12 : (p) == 2 ? 13 : 14)
/* The bits of E2M1 code c as element e of a packed word, and back. */
#define NBI_E2M1_PUT(e, c)                                                   \
    ((((uint32_t)(c) & 7u) << (NBI_E2M1_MAG((e) >> 1) + 16 * ((e) & 1))) | \
     ((((uint32_t)(c) >> 3) & 1u) << (NBI_E2M1_SIGN((e) >> 1) + 16 * ((e) & 1))))
#define NBI_E2M1_GET(word, e)                                                       \
    ((((uint32_t)(word) >> (NBI_E2M1_MAG((e) >> 1) + 16 * ((e) & 1))) & 7u) |     \
     ((((uint32_t)(word) >> (NBI_E2M1_SIGN((e) >> 1) + 16 * ((e) & 1))) & 1u) << 3))
/* Split-K arrival counters at the start of the gemm workspace. */
#define NBI_MAX_SPLIT_COLUMNS 4096

#define NBI_GEMV_WARPS 8      /* decode kernels: (consumer) warps per CTA */
#define NBI_GEMV_WIDE_WARPS 12 /* kernel 2's wide instance: consumer warps (one CTA per SM, 17..32 tokens) */
#define NBI_GEMV_RPW4_WARPS 7  /* kernel 2 with four row blocks per warp at 25..32 tokens: consumer warps */

NB_INTERNAL size_t nbi_chunk_bytes(const nbi_format_traits *t);
/* Code bytes of a packed chunk: 16 x 128 codes, 1024 bytes of 4-bit codes,
 * 2048 of 8-bit ones. */
NB_INTERNAL size_t nbi_code_bytes(const nbi_format_traits *t);
/* The packed layout of a weight (checked descriptor, a format with
 * kernels): bytes per chunk, and the kernel group (k per scale within a
 * chunk).  E2M1 formats: nbi_chunk_bytes and the format's group.  Integer
 * and table formats (docs/formats.md sections 8.7 - 8.9): the group when it
 * is 32, 64 or 128, else 128 (one scale per row, or a group a multiple of
 * 128: the scale repeats per chunk); 1024 code bytes (2048 for int8), then
 * the scale bytes (2 for F16/BF16, 4 for F32) and 1 zero byte with zero
 * points per row and kernel group. */
NB_INTERNAL int nbi_kernel_group(const nb_weight_desc *d);
NB_INTERNAL size_t nbi_packed_chunk_bytes(const nb_weight_desc *d);
/* Bytes of one zero point of a weight with scale type st: 0 without zero
 * points, 1 (NB_ZERO_U8), or a scale's (NB_ZERO_FLOAT: 16-bit floats of the
 * scales' type). */
NB_INTERNAL int nbi_zero_bytes(const nbi_format_traits *t, nb_scale_type st);
/* Whether t is one of bitsandbytes' table formats (nf4, bnb_fp4: codes
 * index a 16-value table, docs/formats.md 8.8). */
NB_INTERNAL int nbi_is_table(const nbi_format_traits *t);
/* The table formats' MMA operands (docs/formats.md 8.8): the 16 table
 * values rounded to the activation dtype act (BF16 or F16, to nearest even)
 * as four byte planes of two words each: words 0-1 the low bytes of codes
 * 0..7 (code c in byte c of the pair), 2-3 of codes 8..15, 4-5 and 6-7 the
 * high bytes.  What the kernel's PRMT lookup reads (gemv_step.cuh). */
NB_INTERNAL void nbi_table_planes(nb_element_type e, nb_dtype act, uint32_t planes[8]);

/* Scalar codecs (formats.c). */
NB_INTERNAL float nbi_element(nb_element_type t, uint8_t code);       /* the value of a code */
NB_INTERNAL uint8_t nbi_to_element(nb_element_type t, float x);       /* round to nearest even, saturating */
NB_INTERNAL float nbi_element_max(nb_element_type t);                 /* largest magnitude */
NB_INTERNAL float nbi_e2m1(uint8_t code);
NB_INTERNAL float nbi_e4m3(uint8_t b);
NB_INTERNAL float nbi_e8m0(uint8_t b);
NB_INTERNAL float nbi_scale(nb_scale_type t, uint8_t b);              /* one-byte scale types */
NB_INTERNAL float nbi_scale_max(nb_scale_type t);                    /* largest finite scale */
NB_INTERNAL int nbi_scale_bytes(nb_scale_type t);                    /* 1, 2 or 4; 0 for another value */
NB_INTERNAL const char *nbi_scale_name(nb_scale_type t);             /* "e4m3", "f16", ... */
/* Scale i of a buffer of scales of type t (little-endian), and storing v
 * there rounded to the type (F16/BF16 to nearest even; F32 as is). */
NB_INTERNAL float nbi_scale_at(nb_scale_type t, const void *scales, size_t i);
NB_INTERNAL void nbi_scale_put(nb_scale_type t, void *scales, size_t i, float v);
/* Checkpoint codes: element_bits per code, packed little-end first in each
 * byte (two 4-bit codes: the even element in the low nibble). */
NB_INTERNAL size_t nbi_codes_bytes(const nbi_format_traits *t, int64_t elements);
NB_INTERNAL uint8_t nbi_code_get(const nbi_format_traits *t, const uint8_t *codes, int64_t i);
NB_INTERNAL void nbi_code_put(const nbi_format_traits *t, uint8_t *codes, int64_t i, uint8_t c); /* ORs into zeroed bytes */
/* Row r of a checked checkpoint-layout weight dequantized into out[0..k)
 * as float32 (the arithmetic of nb_dequantize_host_v2 before the final
 * rounding to the destination type). */
NB_INTERNAL void nbi_dequant_row(const nb_weight_desc *d, const nb_weight_data *w, int64_t r, float *out);
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

/* The descriptor's group is one its row accepts (t->groups), and its scale
 * type; for messages, the list of what the row accepts. */
NB_INTERNAL int nbi_group_ok(const nbi_format_traits *t, int64_t group, int64_t k);
NB_INTERNAL void nbi_groups_text(const nbi_format_traits *t, char *buf, size_t len);

/* Validation shared by host and device entry points (ctx may be NULL). */
NB_INTERNAL nb_status nbi_check_desc(nb_context *ctx, const nb_weight_desc *d, nb_layout want);
NB_INTERNAL nb_status nbi_check_gemm(nb_context *ctx, const nb_gemm_desc *g, nb_layout want, bool host);

/* nb_pack and nb_pack_host: the format has a packed layout, *sz its sizes,
 * and packed_bytes holds it (the descriptor was checked). */
NB_INTERNAL nb_status nbi_packed_size(nb_context *ctx, const nb_weight_desc *d, size_t packed_bytes,
                                      nb_weight_sizes_v2 *sz, const char *fn);

/* MXFP4 scale-exponent range of checkpoint scales (bytes != 0xFF). */
NB_INTERNAL void nbi_scale_exp_range(const uint8_t *scales, size_t count, int32_t *emin, int32_t *emax);

/* ------------------------------------------------------------ gemm plan */
typedef struct nbi_gemm_plan {
    int fmt;            /* nb_format */
    int act;            /* nb_dtype of X, Y, bias (F16 or BF16) */
    int mt;             /* token tiles of 8: 1..4 */
    int warps;          /* warps per CTA */
    int kw;             /* warps sharing one 16-row block (in-CTA split of k) */
    int xsh;            /* kernel 2: activations staged per CTA in shared memory (mt >= 2; kw = 1);
                           2: its instance for at most one CTA per SM (mt 3..4, rpw 2) */
    int rpw;            /* kernel 2: row blocks per warp (1 or 2), sharing the activation fragments */
    int64_t m, n, k;
    int64_t lda, ldc;
    int64_t row_blocks; /* ceil(n / 16) */
    int64_t kchunks;    /* ceil(k / 128) */
    int grid_x;         /* CTAs along n (kernel 2's stream-K grid: all its CTAs, fewer than tiles_n) */
    int splits;         /* CTAs along k (both paths) */
    int chunks_per_split;
    int exp_shift;      /* epilogue multiplies by 2^exp_shift ... */
    float tensor_scale; /* ... and by tensor_scale */
    int table_shift;    /* scale table entries are ldexp(scale, table_shift) */
    int group;          /* kernel group (nbi_kernel_group): the integer formats' template parameter */
    int chunk_bytes;    /* bytes per packed chunk (nbi_packed_chunk_bytes) */
    int scale_bf16;     /* the integer formats' 16-bit scales are BF16 (else F16) */
    int pdl;            /* launch with programmatic dependent launch (sm_90+); nb_gemm clears it for the
                           call's first launch where that follows a kernel not its own (device.c pdl_head) */
    int pdl_own;        /* the launches after the call's first (gemm_sm90's tail) with it (sm_90+) */
    int k1_rows;        /* kernel 1: row blocks a CTA takes (0: warps / kw); fewer leave warps idle so that
                           a one-wave grid loads every SM alike (plan.c, "balanced wave") */
    int per_sm;         /* kernels 1 and 2: at most this many CTAs share an SM (0: as many as fit), held by */
    int dyn_smem;       /* the launch's dynamic shared memory, more than the ring needs (0: the ring's) */
    /* Tensor-core paths (gemm_sm90.cu, gemm_sm80.cu), when path != NBI_PATH_GEMV: */
    int path;           /* NBI_PATH_GEMV, NBI_PATH_SM90 or NBI_PATH_SM80 */
    int bn;             /* tokens per CTA tile: 16, 32, 64, 128 or 256 (sm80: 64, 128) */
    int cwg;            /* sm90: consumer warpgroups per CTA, 64 weight rows each (2, or 4 for bn <= 32) */
    int stages;         /* sm80: chunks in the cp.async ring (chosen by the shared-memory limit) */
    int tiles_n, tiles_m, raster_group; /* (tiles_n also kernel 2's column tiles of warps * rpw row blocks) */
    int cluster;        /* sm90 split-K: a tile's `splits` CTAs are one cluster and sum through their shared
                           memory (no workspace); else the last CTA sums the partials in the workspace */
    int tail_tiles;     /* sm90, splits = 1: the last tiles (fewer than a wave) run in a second launch, */
    int tail_splits;    /* split along k over the SMs the whole waves leave idle (through the workspace), */
    int tail_cps;       /* tail_cps chunks per CTA; 0 tail tiles: one launch */
    int sk;             /* sm90: a stream-K grid of grid_x CTAs over the tiles' chunks (gemm_sm90_sk_kernel) */
    int source;         /* who chose: NBI_FROM_* (device.c) */
    uint32_t scale_table[128]; /* 256 adjusted 16-bit scales, two per word */
    size_t ws_partial_bytes;
    size_t ws_counter_bytes;
} nbi_gemm_plan;

enum { NBI_PATH_GEMV = 0, NBI_PATH_SM90 = 1, NBI_PATH_SM80 = 2 };
enum { NBI_FROM_HEURISTIC = 0, NBI_FROM_TABLE = 1, NBI_FROM_ENV = 2, NBI_FROM_CALL = 3 };

/* ------------------------------------------------------- planner (plan.c) */
/* What a caller asks of the planner: 0 in a field leaves the choice to the
 * heuristic.  nb_gemm builds it from one source, in this order: a per-call
 * configuration (nb_gemm_ex), NIBBLE_PATH, the tuning table's entry. */
typedef struct nbi_request {
    int path;    /* nb_gemm_path */
    int variant; /* decode: 1 plain, 2 staged (nb_gemm_config.variant + 1) */
    int kw, rpw, splits, bn, raster, stages;
    int warps;   /* decode, staged: kernel 2's consumer warps (0: the rules') */
    int sk;      /* tensor core: 1 the stream-K grid, -1 never, 0 the planner's choice */
} nbi_request;

/* The request for a configuration (complete or partial: 0 fields open). */
NB_INTERNAL nbi_request nbi_request_of(const nb_gemm_config *c);
/* The plan for problem g on ctx's device under request rq (NULL: the
 * heuristic alone).  Validates g (packed weight, device dtypes, lda); a
 * request the device or build cannot run is NB_ERR_UNSUPPORTED. */
NB_INTERNAL nb_status nbi_plan(nb_context *ctx, const nb_gemm_desc *g, const nbi_request *rq, nbi_gemm_plan *p);
/* What a plan runs, as a configuration. */
NB_INTERNAL nb_gemm_config nbi_config_of(const nbi_gemm_plan *p);
/* Whether c is a configuration the planner can take for m >= m_lo (a tuning
 * entry's bucket; 0: any m, as a per-call configuration is taken); with
 * `complete` every field of its path must be given (a tuning entry), else 0
 * leaves a field to the heuristic.  0 with the reason in why otherwise. */
NB_INTERNAL int nbi_config_check(const nb_gemm_config *c, int64_t m_lo, int complete, char *why, size_t wn);
/* Workspace bytes plan p needs, enough for every m that shares its tiles
 * and splits rule (the tensor-core bound covers any m). */
NB_INTERNAL size_t nbi_plan_workspace(const nb_context *ctx, const nbi_gemm_plan *p);
/* The Hopper tensor-core kernel's time for one 128-k chunk of a 128-row tile
 * of bn tokens (16, 32, 64, 128, 192, 256), in us, as the planner charges
 * it (measured on an H100); 0 for another width.  The MoE tile width uses
 * it too. */
NB_INTERNAL double nbi_sm90_chunk_us(int bn);
/* Whether plan p runs decode kernel 2 on its stream-K grid (grid_x CTAs
 * over tiles_n column tiles, fewer CTAs than tiles; plan.c). */
static inline int nbi_plan_stream_k(const nbi_gemm_plan *p) {
    return p->path == NBI_PATH_GEMV && p->xsh && p->grid_x != p->tiles_n;
}

/* ------------------------------------------------- tuning table (tune.c) */
typedef struct nbi_tune_table nbi_tune_table;
/* The entry for this problem on the context's GPU: 1 and *out, or 0. */
NB_INTERNAL int nbi_tune_lookup(const nb_context *ctx, int fmt, int act, int64_t n, int64_t k, int64_t m,
                                nb_gemm_config *out);
/* The first m of the bucket holding m. */
NB_INTERNAL int64_t nbi_tune_bucket_lo(int64_t m);
/* The m values whose plans cover every m (1..32, then the first of each
 * bucket past 32): a workspace for every m must fit them all.  Returns how
 * many were written (at most max). */
NB_INTERNAL int nbi_tune_workspace_ms(int64_t *ms, int max);
/* Context creation: load the file NIBBLE_TUNE_CACHE names, if it exists. */
NB_INTERNAL nb_status nbi_tune_load_env(nb_context *ctx);
NB_INTERNAL void nbi_tune_free(nb_context *ctx);
/* Parse a cache from memory (`name` for messages) into a new table; the
 * reason in err (NB_ERRBUF bytes) on failure. */
NB_INTERNAL nb_status nbi_tune_parse(const char *text, size_t len, const char *name, nbi_tune_table **out,
                                     char *err);
NB_INTERNAL void nbi_tune_table_free(nbi_tune_table *t);

/* ------------------------------------------------ CUDA side (src/cuda) */
/* Linked from the src/cuda files, or from cuda_stub.c in a build without CUDA
 * (every call then fails with NB_ERR_NO_DEVICE).  Each returns NB_OK or the
 * failure, already recorded with nbi_fail(ctx, ...): the status comes from
 * nbi_cuda_status and the message names the CUDA call and its error.  The
 * public entry point prefixes its own name (nbi_reraise). */

/* The one map from a cudaError_t value to a status: out of device memory is
 * NB_ERR_OUT_OF_MEMORY, no device or driver NB_ERR_NO_DEVICE, anything else
 * NB_ERR_CUDA. */
NB_INTERNAL nb_status nbi_cuda_status(int cuda_error);
/* Record "fn: <the message just recorded>" and return st. */
NB_INTERNAL nb_status nbi_reraise(nb_context *ctx, nb_status st, const char *fn);
/* NB_OK when device calls can run on ctx (a CUDA build and a device context). */
NB_INTERNAL nb_status nbi_need_device(nb_context *ctx, const char *fn);

NB_INTERNAL int nbi_cuda_available(void);
NB_INTERNAL const char *nbi_cuda_archs(void);
NB_INTERNAL int nbi_cuda_has_sm90a(void); /* the build carries the Hopper kernels */
NB_INTERNAL nb_status nbi_cuda_device_count(int *count);
NB_INTERNAL nb_status nbi_cuda_device_info(int device, nb_device_info *info);
/* Device memory for nb_quantize_staged.  nbi_cuda_copy copies host ->
 * device (to_device 1) or device -> host on `stream` and waits. */
NB_INTERNAL nb_status nbi_cuda_malloc(nb_context *ctx, void **p, size_t bytes);
NB_INTERNAL void nbi_cuda_free(void *p);
NB_INTERNAL nb_status nbi_cuda_copy(nb_context *ctx, void *dst, const void *src, size_t bytes, int to_device,
                                    void *stream);

NB_INTERNAL nb_status nbi_cuda_dequantize(nb_context *ctx, const nb_weight_desc *d, const uint8_t *codes,
                                          const uint8_t *scales, nb_dtype dst_dtype, void *dst, void *stream);
NB_INTERNAL nb_status nbi_cuda_pack(nb_context *ctx, const nb_weight_desc *d, const uint8_t *codes,
                                    const uint8_t *scales, void *packed, int32_t *emin, int32_t *emax, void *stream);
/* The integer and table formats' packing (docs/formats.md 8.7, 8.8); zeros NULL without
 * zero points, whose byte range (*zmin, *zmax) it reads back then. */
NB_INTERNAL nb_status nbi_cuda_pack_int(nb_context *ctx, const nb_weight_desc *d, const uint8_t *codes,
                                        const uint8_t *scales, const uint8_t *zeros, void *packed, int32_t *zmin,
                                        int32_t *zmax, void *stream);
/* Quantize (quantize.cu): the scan reads back the first non-finite element
 * index (-1 when none) and the absolute maximum, synchronizing `stream`; the
 * block pass is asynchronous.  d->tensor_scale is final for the block pass. */
NB_INTERNAL nb_status nbi_cuda_quantize_scan(nb_context *ctx, const nb_weight_desc *d, nb_dtype src_dtype,
                                             const void *src, int64_t *bad, float *amax, void *stream);
NB_INTERNAL nb_status nbi_cuda_quantize(nb_context *ctx, const nb_weight_desc *d, nb_dtype src_dtype,
                                        const void *src, uint8_t *codes, uint8_t *scales, void *stream);
/* The naive reference GEMM (gemm_naive.cu), F32 output. */
NB_INTERNAL nb_status nbi_cuda_gemm_naive(nb_context *ctx, const nb_gemm_desc *g, const void *x,
                                          const uint8_t *codes, const uint8_t *scales, const void *bias, float *y,
                                          void *stream);

/* The three GEMM kernel families, each running a plan (plan.c). */
NB_INTERNAL nb_status nbi_cuda_gemv(nb_context *ctx, const nbi_gemm_plan *p, const void *x, const void *packed,
                                    const void *bias, void *y, void *workspace, void *stream);
NB_INTERNAL nb_status nbi_cuda_gemm_sm90(nb_context *ctx, const nbi_gemm_plan *p, const void *x, const void *packed,
                                         const void *bias, void *y, void *workspace, void *stream);
NB_INTERNAL nb_status nbi_cuda_gemm_sm80(nb_context *ctx, const nbi_gemm_plan *p, const void *x, const void *packed,
                                         const void *bias, void *y, void *stream);
/* Whether `stream` is capturing, and then the one graph node the next launch
 * on it will depend on: -1 not capturing (or the query failed: its error is
 * cleared), 0 capturing with no or several nodes to depend on, 1 with one
 * (*node, and the capture's *id, set), 2 with one that is a kernel launched
 * with programmatic dependent launch itself (an edge into it is
 * programmatic; CUDA 13 builds). */
NB_INTERNAL int nbi_cuda_capture_tip(void *stream, void **node, unsigned long long *id);
/* Programmatic dependent launch around a call's launches (device.c): before
 * them, whether its first launch takes it (want: the call would; sig: the
 * plan's signature when it is decode kernel 2's split grid at 2..8 tokens,
 * which takes it only next to the same plan, else 0; under capture only
 * after this context's own last launch or a kernel that took it itself),
 * *capturing set when the stream captures; after them, the call recorded
 * as the context's last. */
NB_INTERNAL int nbi_pdl_begin(nb_context *ctx, void *stream, int want, int sig, int *capturing);
NB_INTERNAL void nbi_pdl_end(nb_context *ctx, void *stream, int capturing, int sig, nb_status st);
/* nb_glu's kernel (moe.cu): d validated, BF16 or F16, gu and h 2-byte aligned. */
NB_INTERNAL nb_status nbi_cuda_glu(nb_context *ctx, const nb_glu_desc *d, const void *gu, void *h, int pdl,
                                   void *stream);
/* ------------------------------------------------ MoE on the GPU (moe.c, moe.cu) */
/* One MoE MLP call: shapes, the routing block (8 * mt slots of one expert
 * per CTA row), the two projections' scale handling (as nbi_plan computes
 * it for a GEMM of that weight) and the workspace carve-up. */
typedef struct nbi_moe_plan {
    int fmt, act, mt, block;  /* block: 8 * mt (decode kernels) or the tensor-core tile width (tc) */
    int tc;                   /* the projections run on the tensor-core path (gemm_sm90.cu moe_sm90_kernel) */
    int pdl;                  /* kernels after the routing layout launch with programmatic dependent launch */
    int activation, interleaved;
    float limit, alpha;
    int64_t m, experts, top_k, hidden, inter;
    int64_t slots, sorted_len, blocks;
    int64_t launch_blocks;        /* routing blocks the projections' grids cover (a bound on the padded total) */
    int inline_route;             /* decode kernels with few slots: no layout kernel (each CTA computes its
                                   * routing block from topk_ids) and no combine kernel (down's last CTA per
                                   * group of row blocks sums the top-k outputs); moe.c moe_inline */
    int64_t dn_groups;            /* CTAs of down per routing block (groups of row blocks) */
    int64_t gu_row_blocks, gu_kchunks, dn_row_blocks, dn_kchunks;
    size_t gu_stride, dn_stride;  /* packed bytes per expert */
    int gu_exp_shift, dn_exp_shift;
    int gu_kw, dn_kw;             /* decode kernels: warps splitting a row block's k range (1, 2, 4, 8) */
    uint32_t gu_table[128], dn_table[128];
    size_t off_sorted, off_blocks, off_offsets, off_counts, off_ustart, off_xg, off_h, off_o, off_arrive, ws_bytes;
} nbi_moe_plan;
/* The MoE launch plan for descriptor d (packed weights): path, routing
 * block, kw of each projection, inline routing (moe.c; fn names the caller
 * in messages).  Needs a context with a device (or one playing it). */
NB_INTERNAL nb_status nbi_moe_plan_make(nb_context *ctx, const nb_moe_desc *d, nbi_moe_plan *p, const char *fn);

NB_INTERNAL nb_status nbi_cuda_moe_align(nb_context *ctx, const nbi_moe_plan *p, const int32_t *ids, int32_t *sorted,
                                         int32_t *blocks, int32_t *offsets, int32_t *counts, int32_t *ustart,
                                         void *stream);
/* One projection (mode 0 gate_up, 1 down) of the MoE MLP on the Hopper
 * tensor-core path, over the compact rows x (gathered tokens or h). */
NB_INTERNAL nb_status nbi_cuda_moe_sm90(nb_context *ctx, const nbi_moe_plan *p, int mode, const void *x,
                                        const nb_moe_packed_weights *w, void *out, const int32_t *sorted,
                                        const int32_t *blockexp, const int32_t *offsets, const int32_t *ustart,
                                        void *stream);
NB_INTERNAL nb_status nbi_cuda_moe_mlp(nb_context *ctx, const nbi_moe_plan *p, const void *x,
                                       const nb_moe_packed_weights *w, const int32_t *ids, const float *tw, void *y,
                                       void *workspace, void *stream);

/* What the planner asks of the kernels' shapes.  Shared memory per CTA of a
 * decode kernel (static + dynamic; chunk_bytes of the packed weight, 0 for
 * an E2M1 format's), for occupancy; the pipeline depth of the
 * deepest mma.sync instance of tile width bn (and depth `want` when not 0)
 * whose shared memory fits smem_limit, its bytes in *smem, 0 when none does. */
NB_INTERNAL size_t nbi_cuda_gemv_smem(int fmt, int xs, int rpw, int mt, int m, size_t chunk_bytes, int warps);
/* Decode kernel 1 of plan p: how many CTAs share an SM (0 when the runtime
 * cannot tell) with the dynamic shared memory *bytes, the ring's (cap = 0)
 * or the least past it with which at most cap CTAs fit. */
NB_INTERNAL int nbi_cuda_gemv_ctas_per_sm(nb_context *ctx, const nbi_gemm_plan *p, int cap, size_t *bytes);
/* Clusters of s CTAs of the tensor-core kernel (format, dtype, tile width,
 * consumer warpgroups) that can run at once on the current device; 0 when
 * none can or the build has no Hopper kernels. */
NB_INTERNAL int nbi_cuda_sm90_clusters(nb_context *ctx, int fmt, int act, int bn, int cwg, int kg, int s);
NB_INTERNAL int nbi_cuda_gemm_sm80_stages(int fmt, int kg, int bn, int want, size_t smem_limit, size_t *smem);

#ifdef __cplusplus
}
#endif
#endif
