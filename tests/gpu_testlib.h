/* gpu_testlib.h - what the GPU tests share: a GEMM problem on the device
 * (random checkpoint codes and scales in realistic ranges, packed; random
 * activations), one nb_gemm call of it, the checks of CUDA and nibble
 * calls, and readings of nb_gemm_last_config.  Single-threaded setup:
 * every function here is called from the main thread except gt_gemm. */
#ifndef NB_GPU_TESTLIB_H
#define NB_GPU_TESTLIB_H

#include "nibble.h"

#include <cuda_runtime.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* A failed CUDA or nibble call is a failed test (exit 1), whichever thread. */
#define GT_CUDA(call)                                                                                           \
    do {                                                                                                        \
        cudaError_t e_ = (call);                                                                                \
        if (e_ != cudaSuccess) {                                                                                \
            fprintf(stderr, "%s:%d %s: CUDA error %s\n", __FILE__, __LINE__, #call, cudaGetErrorString(e_));   \
            exit(1);                                                                                            \
        }                                                                                                       \
    } while (0)
#define GT_NB(call)                                                                                             \
    do {                                                                                                        \
        nb_status s_ = (call);                                                                                  \
        if (s_ != NB_OK) {                                                                                      \
            fprintf(stderr, "%s:%d %s: %s: %s\n", __FILE__, __LINE__, #call, nb_status_name(s_), nb_last_error()); \
            exit(1);                                                                                            \
        }                                                                                                       \
    } while (0)

/* What a problem is: Y[m, n] = X[m, k] . W[n, k]^T, weights in fmt,
 * activations and output in act. */
typedef struct gt_shape {
    nb_format fmt;
    nb_dtype act;
    int64_t n, k, m;
} gt_shape;

/* One GEMM problem on the device. */
typedef struct gt_problem {
    nb_format fmt;
    nb_dtype act;
    int64_t n, k, m;
    nb_weight_desc ckpt, packed; /* the descriptor before and after nb_pack */
    nb_weight_sizes sz;
    uint8_t *d_codes, *d_scales; /* checkpoint layout (device) */
    void *d_packed;              /* kernel layout (device) */
    void *d_x;                   /* activations (device) */
    size_t ws;                   /* workspace bytes nb_gemm needs */
} gt_problem;

static inline uint64_t gt_rand(uint64_t *s) { /* splitmix64 */
    uint64_t z = (*s += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

/* A uniform value in (-1, 1) as BF16 or FP16 bits: 8 significant bits and an
 * exponent in -8..-1, exact in both types. */
static inline uint16_t gt_act16(nb_dtype t, uint64_t r) {
    const int e = -1 - (int)(r % 8), mant = 128 + (int)((r >> 8) % 128), neg = (int)((r >> 16) & 1);
    if (t == NB_DTYPE_BF16) return (uint16_t)(neg << 15 | (127 + e) << 7 | (mant - 128));
    return (uint16_t)(neg << 15 | (15 + e) << 10 | (mant - 128) << 3);
}

/* The problem's device data from `seed`, packed with ctx on the default
 * stream; the workspace it needs. */
static inline void gt_problem_make(nb_context *ctx, gt_problem *p, const gt_shape *shape, uint64_t seed) {
    memset(p, 0, sizeof *p);
    const nb_format fmt = p->fmt = shape->fmt;
    const nb_dtype act = p->act = shape->act;
    const int64_t n = p->n = shape->n, k = p->k = shape->k, m = p->m = shape->m;
    GT_NB(nb_weight_desc_init(&p->ckpt, fmt, n, k));
    nb_format_info fi;
    GT_NB(nb_format_get_info(fmt, &fi));
    if (fi.tensor_scale) p->ckpt.tensor_scale = 0.0123f;
    GT_NB(nb_weight_get_sizes(&p->ckpt, &p->sz));
    uint8_t *codes = (uint8_t *)malloc(p->sz.codes_bytes), *scales = (uint8_t *)malloc(p->sz.scales_bytes);
    uint16_t *x = (uint16_t *)malloc((size_t)(m * k) * 2);
    if (!codes || !scales || !x) {
        fprintf(stderr, "out of host memory\n");
        exit(1);
    }
    for (size_t i = 0; i < p->sz.codes_bytes; i++) codes[i] = (uint8_t)gt_rand(&seed);
    for (size_t i = 0; i < p->sz.scales_bytes; i++) /* E4M3 exponents 4..9, or E8M0 2^-9..2^0 */
        scales[i] = (uint8_t)(fi.scale_type == NB_SCALE_E4M3 ? 0x20 + gt_rand(&seed) % 0x30 : 118 + gt_rand(&seed) % 10);
    for (int64_t i = 0; i < m * k; i++) x[i] = gt_act16(act, gt_rand(&seed));
    GT_CUDA(cudaMalloc((void **)&p->d_codes, p->sz.codes_bytes));
    GT_CUDA(cudaMalloc((void **)&p->d_scales, p->sz.scales_bytes));
    GT_CUDA(cudaMalloc(&p->d_packed, p->sz.packed_bytes));
    GT_CUDA(cudaMalloc(&p->d_x, (size_t)(m * k) * 2));
    GT_CUDA(cudaMemcpy(p->d_codes, codes, p->sz.codes_bytes, cudaMemcpyHostToDevice));
    GT_CUDA(cudaMemcpy(p->d_scales, scales, p->sz.scales_bytes, cudaMemcpyHostToDevice));
    GT_CUDA(cudaMemcpy(p->d_x, x, (size_t)(m * k) * 2, cudaMemcpyHostToDevice));
    p->packed = p->ckpt;
    GT_NB(nb_pack(ctx, &p->packed, p->d_codes, p->d_scales, p->d_packed, p->sz.packed_bytes, NULL));
    GT_CUDA(cudaDeviceSynchronize());
    nb_gemm_desc g;
    GT_NB(nb_gemm_desc_init(&g, &p->packed, m, act, act));
    GT_NB(nb_gemm_workspace_size(ctx, &g, &p->ws));
    free(codes);
    free(scales);
    free(x);
}

static inline void gt_problem_free(gt_problem *p) {
    GT_CUDA(cudaFree(p->d_codes));
    GT_CUDA(cudaFree(p->d_scales));
    GT_CUDA(cudaFree(p->d_packed));
    GT_CUDA(cudaFree(p->d_x));
}

/* nb_gemm of the problem with `packed` weights into y (m x n, the
 * activation type) on `stream`; ws is zeroed device memory of ws_bytes >=
 * p->ws. */
static inline nb_status gt_gemm(nb_context *ctx, const gt_problem *p, const void *packed, void *y, void *ws,
                                size_t ws_bytes, cudaStream_t stream) {
    nb_gemm_desc g;
    nb_status st = nb_gemm_desc_init(&g, &p->packed, p->m, p->act, p->act);
    if (st == NB_OK) st = nb_gemm(ctx, &g, p->d_x, packed, NULL, y, ws, ws_bytes, stream);
    return st;
}

/* "nvfp4 bf16 n=4096 k=4096 m=8" */
static inline const char *gt_name(const gt_problem *p, char *buf, size_t n) {
    nb_format_info fi;
    snprintf(buf, n, "%s %s n=%lld k=%lld m=%lld", nb_format_get_info(p->fmt, &fi) == NB_OK ? fi.name : "?",
             p->act == NB_DTYPE_BF16 ? "bf16" : "f16", (long long)p->n, (long long)p->k, (long long)p->m);
    return buf;
}

/* The value after argv[*i] as a whole integer in lo..hi (*i moves onto
 * it): 1, or 0 when it is missing or not one. */
static inline int gt_arg_int(int argc, char **argv, int *i, int64_t lo, int64_t hi, int64_t *out) {
    if (*i + 1 >= argc) return 0;
    const char *s = argv[++*i];
    char *end = NULL;
    const long long v = strtoll(s, &end, 10);
    if (end == s || *end || s[0] == ' ' || v < lo || v > hi) return 0;
    *out = v;
    return 1;
}

/* Exit 77 (ctest's "skipped") when there is no CUDA device. */
/* The value of a BF16 or FP16 bit pattern (t: NB_DTYPE_BF16 or _F16). */
static inline float gt_from16(nb_dtype t, uint16_t h) {
    if (t == NB_DTYPE_BF16) {
        uint32_t u = (uint32_t)h << 16;
        float f;
        memcpy(&f, &u, 4);
        return f;
    }
    int e = (h >> 10) & 31;
    uint32_t m = h & 0x3FF;
    float v = e == 0 ? ldexpf((float)m, -24) : e == 31 ? (m ? NAN : INFINITY) : ldexpf((float)(m | 0x400), e - 25);
    return (h & 0x8000) ? -v : v;
}

/* Whether cfg (nb_gemm_last_config) is decode kernel 2 at token tile mt
 * (8 mt tokens) with `warps` consumer warps (0: any) on a stream-K wave of
 * more CTAs than tiles (plan.c: the waves of 9..16 tokens, wave16, and of
 * 17..24 with 8 warps; layers of more tiles than a wave run the stream-K
 * grid of fewer CTAs than tiles). */
static inline int gt_is_k2_wave(const char *cfg, int mt, int warps) {
    char tile[16], width[16];
    snprintf(tile, sizeof tile, ",mt=%d,", mt);
    snprintf(width, sizeof width, " warps=%d ", warps);
    const char *sk = strstr(cfg, " stream-k ctas=");
    int ctas = 0, tiles = 0;
    return strstr(cfg, "gemv_fp4_xs<") && strstr(cfg, tile) && (!warps || strstr(cfg, width)) && sk &&
           sscanf(sk, " stream-k ctas=%d over tiles=%d", &ctas, &tiles) == 2 && tiles < ctas;
}

/* Whether cfg (nb_gemm_last_config) is decode kernel 1 on a balanced wave
 * (plan.c: CTAs that take fewer row blocks than their warps hold, the rest
 * idle; described as "warps=8 (N active)"). */
static inline int gt_is_k1_balanced(const char *cfg) {
    return strstr(cfg, "gemv_fp4<") && strstr(cfg, " active) ");
}

/* Exit 77 (skipped) without a device.  Also makes stdout line-buffered: a
 * run stopped by a timeout or a tool (compute-sanitizer) keeps its progress
 * in the log. */
static inline void gt_need_device(const char *test) {
    setvbuf(stdout, NULL, _IOLBF, 0);
    int count = 0;
    if (nb_device_count(&count) != NB_OK || count == 0) {
        printf("%s: no CUDA device, skipped\n", test);
        exit(77);
    }
}

#endif
