/* test_gpu.c - correctness of the device path on a real GPU.
 *
 *   test_gpu [--quick] [--no-cublas] [--max-m N] [--staged] [--format nvfp4|mxfp4]
 *                           exit 0 pass, 1 fail, 77 no device (skipped)
 *
 * For every format (NVFP4, MXFP4) and activation type (BF16, FP16):
 *   - nb_pack on the device produces the same bytes as nb_pack_host;
 *   - nb_dequantize on the device equals nb_dequantize_host bit for bit;
 *   - nb_gemm for every m in 1..32 and m in {33, 64, 100, 128, 256, 1000,
 *     1024, 4096} (the tensor-core path on Hopper) against the naive GPU
 *     reference (same exact weights, float accumulation) and, at m = 32 and
 *     the largest m, against dequantize-then-cuBLAS; small shapes also
 *     against the float64 host reference.  Outputs are poisoned (NaN) before each run, so an
 *     unwritten element fails;
 *   - NaN scales give NaN rows and only those; negative scales; bias;
 *   - two runs are bitwise identical and a CUDA-graph replay equals a direct
 *     call (split-K reduction is deterministic, workspace left zeroed);
 *   - decode kernel 2 on its stream-K waves (2..8, 9..16, 17..24 tokens with
 *     8 or 12 warps, 25..32) and with four row blocks per warp (28680 rows;
 *     NIBBLE_K2_RPW=4 puts every call at 17..32 tokens it can take on it);
 *   - a layer of 133 128-row tiles, whose last tile runs as the tensor-core
 *     path's tail split (a second launch), one of 81 on the stream-K
 *     grid (NIBBLE_SM90_SK=1 puts every call it can take on it), and one of
 *     65 at m = 300 and 384 in 192-token tiles;
 *   - output layouts (test_out_layout): ldc above n and y off 16-byte
 *     alignment give the same bits as ldc = n and write nothing else;
 *   - under stream capture, programmatic dependent launch only after the
 *     context's own nb_gemm launch with NIBBLE_PDL unset (test_pdl_capture).
 * With NIBBLE_PATH=mma in the environment every call runs the mma.sync
 * kernel (gemm_sm80.cu), whatever the GPU, and the test adds m in {32, 33,
 * 64, 100, 128, 256, 1000, 1024, 4096} on a ragged layer (n = 1000, k = 4192)
 * and on a Llama layer (4096 -> 4096), and the ragged layer again on a
 * configuration that fits 99 KB of shared memory ({mma, bn 128, stages 2},
 * what an L40S runs) given with each call.  --staged gives every call of
 * m <= 32 the staged decode kernel ({decode, variant 1}: every shape through
 * it, split-K included).  --max-m leaves out larger m (the compute-sanitizer
 * runs); --format runs one of the two formats (so that two sanitizer runs
 * can share the work).
 * Error rule: |y - ref| <= ulp_out(|ref|) + 2^-14 * max|ref| per element
 * (output rounding plus float accumulation over k in another order). */
#define _POSIX_C_SOURCE 200809L /* setenv */
#include "nibble.h"
#include "gpu_testlib.h"

#include <cublas_v2.h>
#include <cuda_runtime.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int g_fail = 0, g_pass = 0;
static int g_tc_runs = 0, g_tc_split_runs = 0; /* tensor-core path calls, and those with a k split */
static int g_tc_layout_runs = 0; /* test_out_layout: configurations that ran gemm_sm90 */
static int g_tc_tail_runs = 0;   /* tensor-core calls with a tail split (a second launch) */
static int g_tc_sk_runs = 0;     /* tensor-core calls on the stream-K grid */
static int g_tc_sk64_runs = 0;   /* those of 64-token tiles */
static int g_tc_sk128p_runs = 0; /* those of 128-token tiles below a full tile (65..127 tokens) */
static int g_tc_192_runs = 0;    /* tensor-core calls of 192-token tiles */
static int g_k1_cap_runs = 0;    /* decode kernel 1 calls held to two CTAs per SM (plan.c) */
static int g_k2_wave_runs = 0;   /* decode kernel 2 calls on its stream-K wave at 25..32 tokens (plan.c, k2_wave) */
static int g_k2_wide_runs = 0;   /* ... and of its wide instance (12 consumer warps, 17..24 tokens) */
static int g_k2_wave24_runs = 0; /* ... at 17..24 tokens with 8 warps, more CTAs than tiles (plan.c) */
static int g_k2_wave16_runs = 0; /* ... and at 9..16 tokens, the resident CTAs (more CTAs than tiles) */
static int g_k2_rpw4_runs = 0;   /* ... with four row blocks per warp (plan.c, k2_rpw4) */
static int g_k2_wave8_runs = 0;  /* ... and at 2..8 tokens (plan.c, wave8), the resident CTAs */
static int g_k2_split8_runs = 0;   /* decode kernel 2 on a k-split grid at 5..8 tokens (plan.c, k2_balanced_split) */
static int g_k2_cap_runs = 0;      /* ... held to two CTAs per SM */
static int g_k1_balanced_runs = 0; /* decode kernel 1 on a balanced wave (plan.c: CTAs with warps idle) */
static int g_k1_balanced_kw2 = 0;  /* ... of them with kw = 2 and 3 row blocks a CTA (idle warp pairs) */
static int g_no_cublas = 0; /* --no-cublas: racecheck reports hazards inside cuBLAS itself */
static int g_max_m = 0;      /* --max-m: leave out larger m (0: none left out) */
static int g_min_m = 0;      /* --min-m: leave out smaller m (a sanitizer run split by m) */
/* Whether m (and everything below it) was left in by --max-m. */
static int m_ran(int m) { return (!g_max_m || m <= g_max_m) && m >= g_min_m; }
static int g_mma = 0;        /* NIBBLE_PATH=mma: every call runs the mma.sync kernel */
/* A configuration given with every call of m <= g_force_max_m (nb_gemm_ex):
 * --staged (the staged decode kernel for m <= 32), test_mma_small_smem. */
static nb_gemm_config g_force;
static int64_t g_force_max_m = -1;

static const nb_gemm_config *forced(int64_t m) { return m <= g_force_max_m ? &g_force : NULL; }

#define CK(call)                                                                                   \
    do {                                                                                           \
        cudaError_t e_ = (call);                                                                   \
        if (e_ != cudaSuccess) {                                                                   \
            fprintf(stderr, "%s:%d CUDA error %s: %s\n", __FILE__, __LINE__, #call, cudaGetErrorString(e_)); \
            exit(1);                                                                               \
        }                                                                                          \
    } while (0)
#define NB(call)                                                                                   \
    do {                                                                                           \
        nb_status s_ = (call);                                                                     \
        if (s_ != NB_OK) {                                                                         \
            fprintf(stderr, "%s:%d %s -> %s: %s\n", __FILE__, __LINE__, #call, nb_status_name(s_), nb_last_error()); \
            exit(1);                                                                               \
        }                                                                                          \
    } while (0)

static void check(int ok, const char *what) {
    if (ok) g_pass++;
    else {
        g_fail++;
        fprintf(stderr, "FAIL: %s\n", what);
    }
}

/* xorshift: deterministic data */
static uint64_t rng = 0x9E3779B97F4A7C15ull;
static uint32_t rnd(void) {
    rng ^= rng << 13;
    rng ^= rng >> 7;
    rng ^= rng << 17;
    return (uint32_t)(rng >> 32);
}
static float frand(void) { return (float)rnd() / 4294967296.0f * 2.0f - 1.0f; }

static uint16_t to16(nb_dtype t, float v) {
    /* RNE via the library's own dequantize path is not exposed; do it here */
    uint32_t u;
    memcpy(&u, &v, 4);
    if (t == NB_DTYPE_BF16) return (uint16_t)((u + 0x7FFFu + ((u >> 16) & 1u)) >> 16);
    /* f16: values used here are normal and small */
    int e = (int)((u >> 23) & 255) - 127 + 15;
    uint32_t sign = (u >> 16) & 0x8000u, mant = u & 0x7FFFFFu;
    if (e <= 0) return (uint16_t)sign;
    uint32_t h = ((uint32_t)e << 10) | (mant >> 13), rem = mant & 0x1FFFu;
    if (rem > 0x1000u || (rem == 0x1000u && (h & 1u))) h++;
    return (uint16_t)(sign | h);
}
static float ulp_out(nb_dtype t, float a) {
    int e;
    frexpf(a, &e);
    int mbits = t == NB_DTYPE_BF16 ? 8 : 11;
    int minexp = t == NB_DTYPE_BF16 ? -133 : -24;
    int q = e - mbits;
    if (q < minexp) q = minexp;
    return ldexpf(1.0f, q);
}

typedef struct {
    nb_format fmt;
    int64_t n, k;
    uint8_t *codes, *scales;       /* host, checkpoint */
    uint8_t *d_codes, *d_scales;   /* device */
    void *d_packed;
    nb_weight_desc desc;           /* packed */
    nb_weight_sizes sz;
} weight_t;

/* Random codes and realistic scales (NVFP4: E4M3 around 2^-3..2^3 with a few
 * negatives when asked; MXFP4: exponents 118..127). */
static void make_weight(nb_context *ctx, weight_t *w, nb_format fmt, int64_t n, int64_t k, int neg_scales,
                        int compare_host_pack) {
    memset(w, 0, sizeof *w);
    w->fmt = fmt;
    w->n = n;
    w->k = k;
    NB(nb_weight_desc_init(&w->desc, fmt, n, k));
    w->desc.tensor_scale = fmt == NB_FORMAT_NVFP4 ? 0.0123f : 1.0f;
    NB(nb_weight_get_sizes(&w->desc, &w->sz));
    w->codes = malloc(w->sz.codes_bytes);
    w->scales = malloc(w->sz.scales_bytes);
    for (size_t i = 0; i < w->sz.codes_bytes; i++) w->codes[i] = (uint8_t)rnd();
    for (size_t i = 0; i < w->sz.scales_bytes; i++) {
        uint32_t r = rnd();
        if (fmt == NB_FORMAT_NVFP4) {
            uint8_t b = (uint8_t)(0x20 + (r % 0x30)); /* exponents 4..9 */
            if (neg_scales && (r >> 16) % 5 == 0) b |= 0x80;
            w->scales[i] = b;
        } else {
            w->scales[i] = (uint8_t)(118 + r % 10);
        }
    }
    CK(cudaMalloc((void **)&w->d_codes, w->sz.codes_bytes));
    CK(cudaMalloc((void **)&w->d_scales, w->sz.scales_bytes));
    CK(cudaMalloc(&w->d_packed, w->sz.packed_bytes));
    CK(cudaMemcpy(w->d_codes, w->codes, w->sz.codes_bytes, cudaMemcpyHostToDevice));
    CK(cudaMemcpy(w->d_scales, w->scales, w->sz.scales_bytes, cudaMemcpyHostToDevice));
    nb_weight_desc hd = w->desc;
    NB(nb_pack(ctx, &w->desc, w->d_codes, w->d_scales, w->d_packed, w->sz.packed_bytes, NULL));
    if (compare_host_pack) {
        uint8_t *hp = malloc(w->sz.packed_bytes), *dp = malloc(w->sz.packed_bytes);
        NB(nb_pack_host(ctx, &hd, w->codes, w->scales, hp, w->sz.packed_bytes));
        CK(cudaMemcpy(dp, w->d_packed, w->sz.packed_bytes, cudaMemcpyDeviceToHost));
        char what[128];
        snprintf(what, sizeof what, "device pack == host pack (%s %lldx%lld)", fmt == NB_FORMAT_NVFP4 ? "nvfp4" : "mxfp4",
                 (long long)n, (long long)k);
        check(memcmp(hp, dp, w->sz.packed_bytes) == 0 && hd.scale_exp_min == w->desc.scale_exp_min &&
                  hd.scale_exp_max == w->desc.scale_exp_max,
              what);
        free(hp);
        free(dp);
    }
}

static void free_weight(weight_t *w) {
    free(w->codes);
    free(w->scales);
    cudaFree(w->d_codes);
    cudaFree(w->d_scales);
    cudaFree(w->d_packed);
}

/* Compare y (16-bit, [m, n]) to ref (float, [m, n]); prints the worst element. */
static int compare(const char *what, nb_dtype t, const uint16_t *y, const float *ref, int64_t m, int64_t n, int64_t ldr) {
    float maxref = 0.0f;
    for (int64_t i = 0; i < m; i++)
        for (int64_t j = 0; j < n; j++) maxref = fmaxf(maxref, fabsf(ref[i * ldr + j]));
    double worst = -1.0;
    int64_t wi = -1, wj = -1;
    int bad = 0;
    for (int64_t i = 0; i < m; i++)
        for (int64_t j = 0; j < n; j++) {
            float r = ref[i * ldr + j], v = gt_from16(t, y[i * n + j]);
            float tol = ulp_out(t, fabsf(r)) + ldexpf(maxref, -14);
            double err = isnan(v) || isnan(r) ? INFINITY : fabs((double)v - (double)r);
            if (isnan(v) && isnan(r)) err = 0.0;
            if (!(err <= tol)) bad++;
            if (err / tol > worst) {
                worst = err / tol;
                wi = i;
                wj = j;
            }
        }
    if (bad) fprintf(stderr, "%s: %d bad, worst at [%lld,%lld] got %g want %g (err/tol %.3g)\n", what, bad, (long long)wi,
                     (long long)wj, gt_from16(t, y[wi * n + wj]), ref[wi * ldr + wj], worst);
    check(!bad, what);
    return !bad;
}

typedef struct {
    nb_context *ctx;
    cublasHandle_t blas;
    void *ws;
    size_t ws_bytes;
} env_t;

static void ensure_ws(env_t *e, size_t bytes) {
    if (bytes <= e->ws_bytes) return;
    cudaFree(e->ws);
    CK(cudaMalloc(&e->ws, bytes));
    CK(cudaMemset(e->ws, 0, bytes));
    e->ws_bytes = bytes;
}

static void run_gemm(env_t *e, weight_t *w, nb_dtype act, int64_t m, const void *d_x, const void *d_bias, uint16_t *d_y,
                     uint16_t *h_y, int64_t n) {
    nb_gemm_desc g;
    NB(nb_gemm_desc_init(&g, &w->desc, m, act, act));
    size_t ws = 0;
    NB(nb_gemm_workspace_size_ex(e->ctx, &g, forced(m), &ws));
    ensure_ws(e, ws);
    CK(cudaMemset(d_y, 0xFF, (size_t)(m * n) * 2)); /* poison: 0xFFFF is NaN in BF16 and FP16 */
    NB(nb_gemm_ex(e->ctx, &g, forced(m), d_x, w->d_packed, d_bias, d_y, e->ws, e->ws_bytes, NULL));
    CK(cudaDeviceSynchronize());
    CK(cudaMemcpy(h_y, d_y, (size_t)(m * n) * 2, cudaMemcpyDeviceToHost));
}

/* Against dequantize-then-cuBLAS at m (relative Frobenius error: cuBLAS sees
 * weights rounded to 16 bits), then determinism and CUDA-graph capture. */
static void check_cublas_graph(env_t *e, weight_t *w, nb_format fmt, nb_dtype act, int64_t n, int64_t k, int64_t m,
                               void *dx, void *db, const uint16_t *hb, int use_bias, uint16_t *dy, uint16_t *hy) {
    char what[256];
    const char *fn = fmt == NB_FORMAT_NVFP4 ? "nvfp4" : "mxfp4", *an = act == NB_DTYPE_BF16 ? "bf16" : "f16";
    nb_weight_desc cd = w->desc;
    cd.layout = NB_LAYOUT_CHECKPOINT;
    void *dw;
    float *dc;
    CK(cudaMalloc(&dw, (size_t)(n * k) * 2));
    CK(cudaMalloc((void **)&dc, (size_t)(m * n) * 4));
    NB(nb_dequantize(e->ctx, &cd, w->d_codes, w->d_scales, act, dw, NULL));
    float one = 1.0f, zero = 0.0f;
    cudaDataType dt = act == NB_DTYPE_BF16 ? CUDA_R_16BF : CUDA_R_16F;
    cublasStatus_t bs = cublasGemmEx(e->blas, CUBLAS_OP_T, CUBLAS_OP_N, (int)n, (int)m, (int)k, &one, dw, dt, (int)k,
                                     dx, dt, (int)k, &zero, dc, CUDA_R_32F, (int)n, CUBLAS_COMPUTE_32F,
                                     CUBLAS_GEMM_DEFAULT);
    check(bs == CUBLAS_STATUS_SUCCESS, "cublasGemmEx");
    float *hc = malloc((size_t)(m * n) * 4);
    CK(cudaMemcpy(hc, dc, (size_t)(m * n) * 4, cudaMemcpyDeviceToHost));
    if (use_bias)
        for (int64_t i = 0; i < m; i++)
            for (int64_t j = 0; j < n; j++) hc[i * n + j] += gt_from16(act, hb[j]);
    run_gemm(e, w, act, m, dx, use_bias ? db : NULL, dy, hy, n);
    /* cuBLAS sees weights rounded to 16 bits (x tensor scale): relative
     * Frobenius error bound instead of per element */
    double num = 0, den = 0;
    for (int64_t i = 0; i < m * n; i++) {
        double d = (double)gt_from16(act, hy[i]) - hc[i];
        num += d * d;
        den += (double)hc[i] * hc[i];
    }
    double rel = sqrt(num / (den > 0 ? den : 1));
    snprintf(what, sizeof what, "gemm %s %s n=%lld k=%lld m=%lld vs dequantize+cuBLAS: rel err %.2e", fn, an,
             (long long)n, (long long)k, (long long)m, rel);
    check(rel < (act == NB_DTYPE_BF16 ? 8e-3 : 2e-3), what);
    if (!(rel < (act == NB_DTYPE_BF16 ? 8e-3 : 2e-3))) fprintf(stderr, "  %s\n", what);
    /* determinism and graph capture */
    nb_gemm_desc g;
    NB(nb_gemm_desc_init(&g, &w->desc, m, act, act));
    uint16_t *hy2 = malloc((size_t)(m * n) * 2);
    memcpy(hy2, hy, (size_t)(m * n) * 2);
    cudaStream_t s;
    CK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
    cudaGraph_t graph;
    cudaGraphExec_t exec;
    CK(cudaMemset(dy, 0xFF, (size_t)(m * n) * 2));
    CK(cudaStreamBeginCapture(s, cudaStreamCaptureModeGlobal));
    nb_status st = nb_gemm_ex(e->ctx, &g, forced(m), dx, w->d_packed, use_bias ? db : NULL, dy, e->ws, e->ws_bytes, s);
    CK(cudaStreamEndCapture(s, &graph));
    check(st == NB_OK, "nb_gemm under stream capture");
    CK(cudaGraphInstantiate(&exec, graph, 0));
    for (int r = 0; r < 3; r++) CK(cudaGraphLaunch(exec, s));
    CK(cudaStreamSynchronize(s));
    CK(cudaMemcpy(hy, dy, (size_t)(m * n) * 2, cudaMemcpyDeviceToHost));
    snprintf(what, sizeof what, "graph replay bitwise equal to direct call (%s %s n=%lld k=%lld m=%lld)", fn, an,
             (long long)n, (long long)k, (long long)m);
    check(memcmp(hy, hy2, (size_t)(m * n) * 2) == 0, what);
    CK(cudaGraphExecDestroy(exec));
    CK(cudaGraphDestroy(graph));
    CK(cudaStreamDestroy(s));
    free(hy2);
    free(hc);
    cudaFree(dw);
    cudaFree(dc);
}

/* The reference Y[m, n] (float) for problems too large for the naive kernel
 * (minutes at m = 4096 on a Llama layer): the weights dequantized on the
 * device with tensor scale 1 to the activation type, which is exact (an
 * E2M1 value times a block scale has at most 6 significant bits, and the
 * test's scales keep it in range), then cuBLAS with FP32 accumulation and
 * alpha = the tensor scale; the bias added here. */
static void reference_blas(env_t *e, const weight_t *w, nb_dtype act, int64_t m, const void *dx, const uint16_t *hb,
                           float *href) {
    const int64_t n = w->n, k = w->k;
    nb_weight_desc cd = w->desc;
    cd.layout = NB_LAYOUT_CHECKPOINT;
    cd.tensor_scale = 1.0f;
    void *dw;
    float *dc;
    CK(cudaMalloc(&dw, (size_t)(n * k) * 2));
    CK(cudaMalloc((void **)&dc, (size_t)(m * n) * 4));
    NB(nb_dequantize(e->ctx, &cd, w->d_codes, w->d_scales, act, dw, NULL));
    const float alpha = w->desc.tensor_scale, zero = 0.0f;
    const cudaDataType dt = act == NB_DTYPE_BF16 ? CUDA_R_16BF : CUDA_R_16F;
    cublasStatus_t bs = cublasGemmEx(e->blas, CUBLAS_OP_T, CUBLAS_OP_N, (int)n, (int)m, (int)k, &alpha, dw, dt, (int)k,
                                     dx, dt, (int)k, &zero, dc, CUDA_R_32F, (int)n, CUBLAS_COMPUTE_32F,
                                     CUBLAS_GEMM_DEFAULT);
    check(bs == CUBLAS_STATUS_SUCCESS, "cublasGemmEx (reference)");
    CK(cudaMemcpy(href, dc, (size_t)(m * n) * 4, cudaMemcpyDeviceToHost));
    if (hb)
        for (int64_t i = 0; i < m; i++)
            for (int64_t j = 0; j < n; j++) href[i * n + j] += gt_from16(act, hb[j]);
    cudaFree(dw);
    cudaFree(dc);
}

/* One shape: weights, all m in ms[] (those up to --max-m), references: the
 * naive GPU kernel, or with blas_ref (and cuBLAS allowed) reference_blas. */
static void test_shape_ref(env_t *e, nb_format fmt, nb_dtype act, int64_t n, int64_t k, const int *ms_all,
                           int nms_all, int full_checks, int blas_ref) {
    char what[256];
    int ms[64], nms = 0;
    for (int i = 0; i < nms_all && nms < 64; i++)
        if (m_ran(ms_all[i])) ms[nms++] = ms_all[i];
    if (!nms) return;
    const char *fn = fmt == NB_FORMAT_NVFP4 ? "nvfp4" : "mxfp4", *an = act == NB_DTYPE_BF16 ? "bf16" : "f16";
    weight_t w;
    int small = n * k <= (int64_t)4096 * 4096;
    make_weight(e->ctx, &w, fmt, n, k, full_checks, small);
    int64_t mmax = 0;
    for (int i = 0; i < nms; i++) mmax = ms[i] > mmax ? ms[i] : mmax;
    /* activations, bias */
    uint16_t *hx = malloc((size_t)(mmax * k) * 2), *hb = malloc((size_t)n * 2);
    for (int64_t i = 0; i < mmax * k; i++) hx[i] = to16(act, frand());
    for (int64_t i = 0; i < n; i++) hb[i] = to16(act, frand());
    void *dx, *db;
    uint16_t *dy;
    float *dref;
    CK(cudaMalloc(&dx, (size_t)(mmax * k) * 2));
    CK(cudaMalloc(&db, (size_t)n * 2));
    CK(cudaMalloc((void **)&dy, (size_t)(mmax * n) * 2));
    CK(cudaMalloc((void **)&dref, (size_t)(mmax * n) * 4));
    CK(cudaMemcpy(dx, hx, (size_t)(mmax * k) * 2, cudaMemcpyHostToDevice));
    CK(cudaMemcpy(db, hb, (size_t)n * 2, cudaMemcpyHostToDevice));
    /* GPU reference over all mmax rows (rows are independent) */
    nb_weight_desc cd = w.desc;
    cd.layout = NB_LAYOUT_CHECKPOINT;
    nb_gemm_desc rg;
    NB(nb_gemm_desc_init(&rg, &cd, mmax, act, act));
    int use_bias = full_checks;
    float *href = malloc((size_t)(mmax * n) * 4);
    if (blas_ref && !g_no_cublas) {
        reference_blas(e, &w, act, mmax, dx, use_bias ? hb : NULL, href);
    } else {
        NB(nb_gemm_reference_device(e->ctx, &rg, dx, w.d_codes, w.d_scales, use_bias ? db : NULL, dref, NULL));
        CK(cudaMemcpy(href, dref, (size_t)(mmax * n) * 4, cudaMemcpyDeviceToHost));
    }
    uint16_t *hy = malloc((size_t)(mmax * n) * 2);
    for (int i = 0; i < nms; i++) {
        int64_t m = ms[i];
        run_gemm(e, &w, act, m, dx, use_bias ? db : NULL, dy, hy, n);
        char cfg[256] = "";
        nb_gemm_last_config(e->ctx, cfg, sizeof cfg);
        g_tc_runs += strstr(cfg, "gemm_sm90") != NULL;
        g_tc_split_runs += strstr(cfg, "gemm_sm90") && !strstr(cfg, "k-split=1 ");
        g_tc_tail_runs += strstr(cfg, "gemm_sm90") && strstr(cfg, " tail=");
        g_tc_sk_runs += strstr(cfg, "gemm_sm90") && strstr(cfg, " stream-k ");
        g_tc_sk64_runs += strstr(cfg, "gemm_sm90") && strstr(cfg, "x64>") && strstr(cfg, " stream-k ");
        g_tc_sk128p_runs += m < 128 && strstr(cfg, "gemm_sm90") && strstr(cfg, "x128>") && strstr(cfg, " stream-k ");
        g_tc_192_runs += strstr(cfg, "gemm_sm90") && strstr(cfg, "x192>");
        g_k1_cap_runs += strstr(cfg, "gemv_fp4<") && strstr(cfg, ",ctas/sm=2>");
        g_k2_cap_runs += strstr(cfg, "gemv_fp4_xs<") && strstr(cfg, ",ctas/sm=2>");
        g_k2_wave_runs += strstr(cfg, "gemv_fp4_xs<") && strstr(cfg, "mt=4,") && strstr(cfg, " stream-k ");
        g_k2_wide_runs += strstr(cfg, "gemv_fp4_xs<") && strstr(cfg, " stream-k ") && strstr(cfg, " warps=12 ");
        g_k2_wave24_runs += gt_is_k2_wave(cfg, 3, 8);
        g_k2_wave16_runs += gt_is_k2_wave(cfg, 2, 0);
        g_k2_wave8_runs += gt_is_k2_wave(cfg, 1, 0);
        g_k2_rpw4_runs += strstr(cfg, "gemv_fp4_xs<") && strstr(cfg, ",rows/warp=64") && strstr(cfg, " stream-k ");
        g_k2_split8_runs += m >= 5 && m <= 8 && strstr(cfg, "gemv_fp4_xs<") && strstr(cfg, ",mt=1,") &&
                            !strstr(cfg, " stream-k ") && !strstr(cfg, " k-split=1x1 ");
        g_k1_balanced_runs += gt_is_k1_balanced(cfg);
        g_k1_balanced_kw2 += gt_is_k1_balanced(cfg) && strstr(cfg, " (6 active) k-split=2x1 ");
        snprintf(what, sizeof what, "gemm %s %s n=%lld k=%lld m=%lld%s vs GPU reference", fn, an, (long long)n,
                 (long long)k, (long long)m, use_bias ? " +bias" : "");
        compare(what, act, hy, href, m, n, n);
    }
    /* float64 host reference for small problems */
    if (small && mmax <= 64) {
        double *r64 = malloc((size_t)(mmax * n) * 8);
        NB(nb_gemm_host_f64(e->ctx, &rg, hx, w.codes, w.scales, use_bias ? hb : NULL, r64));
        float *rf = malloc((size_t)(mmax * n) * 4);
        for (int64_t i = 0; i < mmax * n; i++) rf[i] = (float)r64[i];
        int64_t m = mmax;
        run_gemm(e, &w, act, m, dx, use_bias ? db : NULL, dy, hy, n);
        snprintf(what, sizeof what, "gemm %s %s n=%lld k=%lld m=%lld vs float64 host reference", fn, an, (long long)n,
                 (long long)k, (long long)m);
        compare(what, act, hy, rf, m, n, n);
        free(r64);
        free(rf);
    }
    if (full_checks && !g_no_cublas) {
        check_cublas_graph(e, &w, fmt, act, n, k, mmax < 32 ? mmax : 32, dx, db, hb, use_bias, dy, hy);
        if (mmax > 32) check_cublas_graph(e, &w, fmt, act, n, k, mmax, dx, db, hb, use_bias, dy, hy);
    }
    free(hx);
    free(hb);
    free(href);
    free(hy);
    cudaFree(dx);
    cudaFree(db);
    cudaFree(dy);
    cudaFree(dref);
    free_weight(&w);
}

static void test_shape(env_t *e, nb_format fmt, nb_dtype act, int64_t n, int64_t k, const int *ms, int nms,
                       int full_checks) {
    test_shape_ref(e, fmt, act, n, k, ms, nms, full_checks, 0);
}

/* Every configuration nb_gemm_list_configs offers for a ragged layer (the
 * candidates `nibble tune` times: each decode variant, kw, rows per warp and
 * split, each tensor-core tile, split and raster) given with the call
 * (nb_gemm_ex), against the GPU reference, and labelled " (given)". */
static void test_every_config(env_t *e, nb_format fmt, nb_dtype act, int quick) {
    static const int all_ms[] = {1, 5, 16, 24, 33, 100}, quick_ms[] = {1, 9, 24, 33};
    const int *ms = quick ? quick_ms : all_ms;
    const size_t nms = quick ? 4 : 6;
    const int64_t n = 1000, k = 4096 + 96, mmax = 100;
    weight_t w;
    make_weight(e->ctx, &w, fmt, n, k, 0, 0);
    uint16_t *hx = malloc((size_t)(mmax * k) * 2), *hy = malloc((size_t)(mmax * n) * 2);
    for (int64_t i = 0; i < mmax * k; i++) hx[i] = to16(act, frand());
    void *dx;
    uint16_t *dy;
    float *dref, *href = malloc((size_t)(mmax * n) * 4);
    CK(cudaMalloc(&dx, (size_t)(mmax * k) * 2));
    CK(cudaMalloc((void **)&dy, (size_t)(mmax * n) * 2));
    CK(cudaMalloc((void **)&dref, (size_t)(mmax * n) * 4));
    CK(cudaMemcpy(dx, hx, (size_t)(mmax * k) * 2, cudaMemcpyHostToDevice));
    nb_weight_desc cd = w.desc;
    cd.layout = NB_LAYOUT_CHECKPOINT;
    nb_gemm_desc rg;
    NB(nb_gemm_desc_init(&rg, &cd, mmax, act, act));
    NB(nb_gemm_reference_device(e->ctx, &rg, dx, w.d_codes, w.d_scales, NULL, dref, NULL));
    CK(cudaMemcpy(href, dref, (size_t)(mmax * n) * 4, cudaMemcpyDeviceToHost));
    const nb_gemm_config saved = g_force;
    const int64_t saved_max = g_force_max_m;
    int tried = 0;
    for (size_t i = 0; i < nms; i++) {
        nb_gemm_desc g;
        NB(nb_gemm_desc_init(&g, &w.desc, ms[i], act, act));
        nb_gemm_config cfgs[64];
        size_t count = 0;
        NB(nb_gemm_list_configs(e->ctx, &g, cfgs, 64, &count));
        check(count >= 1, "nb_gemm_list_configs offers at least the heuristic's configuration");
        for (size_t c = 0; c < count && c < 64; c++) {
            g_force = cfgs[c];
            g_force_max_m = INT64_MAX;
            run_gemm(e, &w, act, ms[i], dx, NULL, dy, hy, n);
            char cfg[256] = "", what[512];
            nb_gemm_last_config(e->ctx, cfg, sizeof cfg);
            snprintf(what, sizeof what, "gemm %s %s n=%lld k=%lld m=%d, configuration %zu of %zu (%s) vs GPU reference",
                     fmt == NB_FORMAT_NVFP4 ? "nvfp4" : "mxfp4", act == NB_DTYPE_BF16 ? "bf16" : "f16", (long long)n,
                     (long long)k, ms[i], c, count, cfg);
            compare(what, act, hy, href, ms[i], n, n);
            check(strstr(cfg, " (given)") != NULL, "a configuration given with the call is labelled \" (given)\"");
            tried++;
        }
    }
    printf("every offered configuration: %d runs (%s, %s)\n", tried, fmt == NB_FORMAT_NVFP4 ? "nvfp4" : "mxfp4",
           act == NB_DTYPE_BF16 ? "bf16" : "f16");
    g_force = saved;
    g_force_max_m = saved_max;
    free(hx);
    free(hy);
    free(href);
    cudaFree(dx);
    cudaFree(dy);
    cudaFree(dref);
    free_weight(&w);
}

/* The output's layout: an ldc above n and an output pointer off 16-byte
 * alignment.  The tensor-core epilogue stores whole 16-byte pieces of 8 rows
 * through shared memory where y is 16-byte aligned and ldc a multiple of 8
 * (element by element in the pieces that run past n), and element by element
 * otherwise; the decode kernels always element by element.  On a layer whose
 * n is not a multiple of 8 (n = 263: 2 tiles of 128 rows and 7 rows), every
 * offered configuration at every m, with a bias: ldc = n (odd: element by
 * element), ldc = 272 (pieces, the last one partial), ldc = 272 one element
 * past an aligned address (element by element) give the same bits in the
 * n columns and leave the padding and the rest of the buffer as they were;
 * ldc = 272 without bias also against the naive GPU reference. */
static void test_out_layout(env_t *e, nb_format fmt, nb_dtype act) {
    static const int ms[] = {1, 9, 33, 64, 100, 256};
    const int64_t n = 263, k = 1024, ldc = 272, mmax = 256, cap = mmax * ldc + 16;
    const char *fn = fmt == NB_FORMAT_NVFP4 ? "nvfp4" : "mxfp4", *an = act == NB_DTYPE_BF16 ? "bf16" : "f16";
    weight_t w;
    make_weight(e->ctx, &w, fmt, n, k, 0, 0);
    uint16_t *hx = malloc((size_t)(mmax * k) * 2), *hb = malloc((size_t)n * 2);
    uint16_t *y0 = malloc((size_t)(mmax * n) * 2), *hy = malloc((size_t)cap * 2), *hc = malloc((size_t)(mmax * n) * 2);
    for (int64_t i = 0; i < mmax * k; i++) hx[i] = to16(act, frand());
    for (int64_t i = 0; i < n; i++) hb[i] = to16(act, frand());
    void *dx, *db;
    uint16_t *dy;
    float *dref, *href = malloc((size_t)(mmax * n) * 4);
    CK(cudaMalloc(&dx, (size_t)(mmax * k) * 2));
    CK(cudaMalloc(&db, (size_t)n * 2));
    CK(cudaMalloc((void **)&dy, (size_t)cap * 2));
    CK(cudaMalloc((void **)&dref, (size_t)(mmax * n) * 4));
    CK(cudaMemcpy(dx, hx, (size_t)(mmax * k) * 2, cudaMemcpyHostToDevice));
    CK(cudaMemcpy(db, hb, (size_t)n * 2, cudaMemcpyHostToDevice));
    nb_weight_desc cd = w.desc;
    cd.layout = NB_LAYOUT_CHECKPOINT;
    int runs = 0, pieces = 0;
    for (size_t i = 0; i < sizeof ms / sizeof ms[0]; i++) {
        const int64_t m = ms[i];
        if (!m_ran(m)) continue;
        nb_gemm_desc rg;
        NB(nb_gemm_desc_init(&rg, &cd, m, act, act));
        NB(nb_gemm_reference_device(e->ctx, &rg, dx, w.d_codes, w.d_scales, NULL, dref, NULL));
        CK(cudaMemcpy(href, dref, (size_t)(m * n) * 4, cudaMemcpyDeviceToHost));
        nb_gemm_desc g;
        NB(nb_gemm_desc_init(&g, &w.desc, m, act, act));
        nb_gemm_config cfgs[64];
        size_t count = 0;
        NB(nb_gemm_list_configs(e->ctx, &g, cfgs, 64, &count));
        for (size_t c = 0; c < count && c < 64; c++) {
            /* (ldc, element offset, bias): the first is the reference layout */
            static const int64_t lay[4][3] = {{0, 0, 1}, {272, 0, 1}, {272, 1, 1}, {272, 0, 0}};
            char cfg[256] = "";
            for (int l = 0; l < 4; l++) {
                const int64_t ld = lay[l][0] ? lay[l][0] : n, off = lay[l][1];
                g.ldc = ld;
                size_t ws = 0;
                NB(nb_gemm_workspace_size_ex(e->ctx, &g, &cfgs[c], &ws));
                ensure_ws(e, ws);
                CK(cudaMemset(dy, 0xFF, (size_t)cap * 2));
                NB(nb_gemm_ex(e->ctx, &g, &cfgs[c], dx, w.d_packed, lay[l][2] ? db : NULL, dy + off, e->ws, e->ws_bytes,
                              NULL));
                CK(cudaDeviceSynchronize());
                CK(cudaMemcpy(hy, dy, (size_t)cap * 2, cudaMemcpyDeviceToHost));
                nb_gemm_last_config(e->ctx, cfg, sizeof cfg);
                int same = 1, kept = 1;
                for (int64_t q = 0; q < cap; q++) {
                    const int64_t r = q - off, tok = r / ld, col = r % ld;
                    const int out = r >= 0 && tok < m && col < n;
                    if (!out) kept &= hy[q] == 0xFFFF;
                    else if (l == 0) y0[tok * n + col] = hy[q];
                    else if (l < 3) same &= hy[q] == y0[tok * n + col];
                    else hc[tok * n + col] = hy[q];
                }
                char what[512];
                snprintf(what, sizeof what, "gemm %s %s n=%lld m=%lld ldc=%lld y+%lld%s (%s): nothing written outside "
                         "the output", fn, an, (long long)n, (long long)m, (long long)ld, (long long)off,
                         lay[l][2] ? " bias" : "", cfg);
                check(kept, what);
                if (l == 1 || l == 2) {
                    snprintf(what, sizeof what, "gemm %s %s n=%lld m=%lld ldc=%lld y+%lld bias (%s) == ldc=n", fn, an,
                             (long long)n, (long long)m, (long long)ld, (long long)off, cfg);
                    check(same, what);
                }
                if (l == 3) {
                    snprintf(what, sizeof what, "gemm %s %s n=%lld m=%lld ldc=%lld (%s) vs GPU reference", fn, an,
                             (long long)n, (long long)m, (long long)ld, cfg);
                    compare(what, act, hc, href, m, n, n);
                }
                runs++;
            }
            pieces += strstr(cfg, "gemm_sm90") != NULL;
        }
    }
    g_tc_layout_runs += pieces;
    printf("output layouts: %d runs (%s, %s)\n", runs, fn, an);
    free(hx);
    free(hb);
    free(y0);
    free(hy);
    free(hc);
    free(href);
    cudaFree(dx);
    cudaFree(db);
    cudaFree(dy);
    cudaFree(dref);
    free_weight(&w);
}

/* The configuration the last nb_gemm on ctx ran contains `want`. */
static void check_config(nb_context *ctx, const char *want, const char *what) {
    char cfg[256], msg[512];
    NB(nb_gemm_last_config(ctx, cfg, sizeof cfg));
    snprintf(msg, sizeof msg, "%s: the last call ran %s (%s)", what, want, cfg);
    check(strstr(cfg, want) != NULL, msg);
}

/* NIBBLE_PATH=mma: the mma kernel on the configuration that fits 99 KB of
 * shared memory (sm_86, sm_89: 128-token tiles, two stages), which a GPU
 * with more picks only when told: given with every call (nb_gemm_ex). */
static void test_mma_small_smem(env_t *e) {
    const nb_gemm_config saved = g_force;
    const int64_t saved_max = g_force_max_m;
    memset(&g_force, 0, sizeof g_force);
    g_force.path = NB_GEMM_PATH_MMA;
    g_force.bn = 128;
    g_force.stages = 2;
    g_force_max_m = INT64_MAX;
    static const int ms[] = {1, 33, 100, 256};
    const nb_format fmts[2] = {NB_FORMAT_NVFP4, NB_FORMAT_MXFP4};
    const nb_dtype acts[2] = {NB_DTYPE_BF16, NB_DTYPE_F16};
    for (int f = 0; f < 2; f++)
        for (int a = 0; a < 2; a++) test_shape(e, fmts[f], acts[a], 1000, 4096 + 96, ms, 4, a == 0);
    check_config(e->ctx, "128x128,stages=2", "a configuration {mma, bn 128, stages 2} given with the call");
    check_config(e->ctx, " (given)", "a configuration given with the call is labelled so");
    g_force = saved;
    g_force_max_m = saved_max;
}

/* Device dequantize equals the host reference, bit for bit, every dtype. */
static void test_dequant(env_t *e, nb_format fmt) {
    weight_t w;
    make_weight(e->ctx, &w, fmt, 48, 256, 1, 0);
    /* make every scale byte appear, NaN ones included */
    for (size_t i = 0; i < w.sz.scales_bytes; i++) w.scales[i] = (uint8_t)i;
    CK(cudaMemcpy(w.d_scales, w.scales, w.sz.scales_bytes, cudaMemcpyHostToDevice));
    nb_weight_desc cd = w.desc;
    cd.layout = NB_LAYOUT_CHECKPOINT;
    cd.tensor_scale = fmt == NB_FORMAT_NVFP4 ? -0.37f : 1.0f;
    nb_dtype ts[3] = {NB_DTYPE_F32, NB_DTYPE_BF16, NB_DTYPE_F16};
    for (int i = 0; i < 3; i++) {
        size_t bytes = w.sz.dense_elements * (ts[i] == NB_DTYPE_F32 ? 4 : 2);
        void *h = malloc(bytes), *hd = malloc(bytes), *d;
        CK(cudaMalloc(&d, bytes));
        NB(nb_dequantize_host(e->ctx, &cd, w.codes, w.scales, ts[i], h));
        NB(nb_dequantize(e->ctx, &cd, w.d_codes, w.d_scales, ts[i], d, NULL));
        CK(cudaMemcpy(hd, d, bytes, cudaMemcpyDeviceToHost));
        char what[96];
        snprintf(what, sizeof what, "device dequantize == host (%s, dtype %d)", fmt == NB_FORMAT_NVFP4 ? "nvfp4" : "mxfp4",
                 (int)ts[i]);
        check(memcmp(h, hd, bytes) == 0, what);
        free(h);
        free(hd);
        cudaFree(d);
    }
    free_weight(&w);
}

/* NaN scale bytes: exactly the rows that hold one become NaN. */
static void test_nan_scales(env_t *e, nb_format fmt, nb_dtype act) {
    const int64_t n = 64, k = 512, m = 5;
    weight_t w;
    make_weight(e->ctx, &w, fmt, n, k, 0, 0);
    const int64_t ng = k / w.desc.group_size;
    w.scales[7 * ng + 3] = fmt == NB_FORMAT_NVFP4 ? 0x7F : 0xFF;
    w.scales[40 * ng + ng - 1] = 0xFF; /* E4M3 0xFF is NaN too */
    CK(cudaMemcpy(w.d_scales, w.scales, w.sz.scales_bytes, cudaMemcpyHostToDevice));
    w.desc.layout = NB_LAYOUT_CHECKPOINT;
    NB(nb_pack(e->ctx, &w.desc, w.d_codes, w.d_scales, w.d_packed, w.sz.packed_bytes, NULL));
    uint16_t *hx = malloc((size_t)(m * k) * 2), *hy = malloc((size_t)(m * n) * 2);
    for (int64_t i = 0; i < m * k; i++) hx[i] = to16(act, frand());
    void *dx;
    uint16_t *dy;
    CK(cudaMalloc(&dx, (size_t)(m * k) * 2));
    CK(cudaMalloc((void **)&dy, (size_t)(m * n) * 2));
    CK(cudaMemcpy(dx, hx, (size_t)(m * k) * 2, cudaMemcpyHostToDevice));
    run_gemm(e, &w, act, m, dx, NULL, dy, hy, n);
    int ok = 1;
    for (int64_t i = 0; i < m; i++)
        for (int64_t j = 0; j < n; j++) {
            int want_nan = j == 7 || j == 40;
            if ((isnan(gt_from16(act, hy[i * n + j])) != 0) != want_nan) ok = 0;
        }
    char what[96];
    snprintf(what, sizeof what, "NaN scales give NaN rows only (%s %s)", fmt == NB_FORMAT_NVFP4 ? "nvfp4" : "mxfp4",
             act == NB_DTYPE_BF16 ? "bf16" : "f16");
    check(ok, what);
    free(hx);
    free(hy);
    cudaFree(dx);
    cudaFree(dy);
    free_weight(&w);
}

/* MXFP4 with FP16 activations: a scale range too wide to be exact is refused. */
static void test_mx_range(env_t *e) {
    weight_t w;
    make_weight(e->ctx, &w, NB_FORMAT_MXFP4, 32, 256, 0, 0);
    w.scales[0] = 90;
    w.scales[1] = 127;
    CK(cudaMemcpy(w.d_scales, w.scales, w.sz.scales_bytes, cudaMemcpyHostToDevice));
    w.desc.layout = NB_LAYOUT_CHECKPOINT;
    NB(nb_pack(e->ctx, &w.desc, w.d_codes, w.d_scales, w.d_packed, w.sz.packed_bytes, NULL));
    nb_gemm_desc g;
    NB(nb_gemm_desc_init(&g, &w.desc, 1, NB_DTYPE_F16, NB_DTYPE_F16));
    check(nb_gemm_can_implement(e->ctx, &g) == NB_ERR_UNSUPPORTED, "MXFP4 FP16 with 37-binade scales -> UNSUPPORTED");
    NB(nb_gemm_desc_init(&g, &w.desc, 1, NB_DTYPE_BF16, NB_DTYPE_BF16));
    check(nb_gemm_can_implement(e->ctx, &g) == NB_OK, "MXFP4 BF16 with 37-binade scales is fine");
    free_weight(&w);
}

/* Device entry points reject bad input with their documented status. */
#if CUDART_VERSION >= 13000
/* The one node after `from` in a captured graph and the type of that edge
 * (NULL when `from` has no or several dependents). */
static cudaGraphNode_t next_node(cudaGraphNode_t from, int *type) {
    cudaGraphNode_t to[4];
    cudaGraphEdgeData ed[4];
    size_t n = 4;
    memset(ed, 0, sizeof ed);
    if (cudaGraphNodeGetDependentNodes(from, to, ed, &n) != cudaSuccess || n != 1) return NULL;
    *type = ed[0].type;
    return to[0];
}

/* The graph's one root node (NULL when not exactly one). */
static cudaGraphNode_t root_node(cudaGraph_t graph) {
    cudaGraphNode_t r[4];
    size_t n = 4;
    return cudaGraphGetRootNodes(graph, r, &n) == cudaSuccess && n == 1 ? r[0] : NULL;
}

/* Another library's kernel that takes programmatic dependent launch, as
 * Inductor's Triton kernels do under TORCHINDUCTOR_ENABLE_PDL=1: it waits
 * for the grid before it, then lets the next one launch (sm_90, loaded from
 * PTX by the driver). */
static const char pdl_noop_ptx[] = ".version 7.8\n.target sm_90\n.address_size 64\n"
                                   ".visible .entry nb_test_pdl_noop()\n{\n"
                                   "griddepcontrol.wait;\ngriddepcontrol.launch_dependents;\nret;\n}\n";

static cudaError_t launch_pdl_noop(cudaKernel_t kern, cudaStream_t s) {
    cudaLaunchAttribute at;
    memset(&at, 0, sizeof at);
    at.id = cudaLaunchAttributeProgrammaticStreamSerialization;
    at.val.programmaticStreamSerializationAllowed = 1;
    cudaLaunchConfig_t cfg;
    memset(&cfg, 0, sizeof cfg);
    cfg.gridDim.x = cfg.gridDim.y = cfg.gridDim.z = 1;
    cfg.blockDim.x = 32, cfg.blockDim.y = cfg.blockDim.z = 1;
    cfg.stream = s;
    cfg.attrs = &at;
    cfg.numAttrs = 1;
    return cudaLaunchKernelExC(&cfg, (const void *)kern, NULL);
}

/* Captures [nb_dequantize of cd, the noop with programmatic dependent
 * launch, nb_gemm g of x and packed into y] on s into *graph (*le: the
 * noop's launch); the first failing status. */
static nb_status capture_after_pdl(nb_context *c, const nb_weight_desc *cd, const weight_t *w, void *ddq,
                                   cudaKernel_t noop, const nb_gemm_desc *g, const void *x, const void *packed,
                                   void *y, env_t *e, cudaStream_t s, cudaGraph_t *graph, cudaError_t *le) {
    CK(cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal));
    nb_status st = nb_dequantize(c, cd, w->d_codes, w->d_scales, NB_DTYPE_BF16, ddq, s);
    *le = st ? cudaSuccess : launch_pdl_noop(noop, s);
    if (!st && *le == cudaSuccess) st = nb_gemm(c, g, x, packed, NULL, y, e->ws, e->ws_bytes, s);
    CK(cudaStreamEndCapture(s, graph));
    return st;
}

/* Instantiates graph, fills out (bytes) and, when given, scratch (scratch_bytes)
 * with 0xFF, replays the graph once on s and tells whether out then holds
 * ref's bytes (host copy in host); destroys the graph. */
static int replay_equals(cudaGraph_t graph, cudaStream_t s, void *out, size_t bytes, void *scratch,
                         size_t scratch_bytes, void *host, const void *ref) {
    cudaGraphExec_t exec;
    CK(cudaGraphInstantiate(&exec, graph, 0));
    CK(cudaMemsetAsync(out, 0xFF, bytes, s));
    if (scratch) CK(cudaMemsetAsync(scratch, 0xFF, scratch_bytes, s));
    CK(cudaGraphLaunch(exec, s));
    CK(cudaStreamSynchronize(s));
    CK(cudaMemcpy(host, out, bytes, cudaMemcpyDeviceToHost));
    CK(cudaGraphExecDestroy(exec));
    CK(cudaGraphDestroy(graph));
    return memcmp(host, ref, bytes) == 0;
}
#endif

/* Programmatic dependent launch under stream capture (device.c pdl_head).
 * Captured [nb_dequantize, nb_gemm A, nb_gemm B] in a context of each
 * NIBBLE_PDL setting: with it unset or "auto" the edge A -> B is
 * programmatic and dequantize -> A (a kernel not nb_gemm's) plain; with
 * NIBBLE_PDL=1 both programmatic, with 0 neither; before sm_90 neither.
 * Each graph's replay gives the direct call's bits.  After another
 * library's kernel that took programmatic dependent launch itself
 * (pdl_noop, on sm_90+): [nb_dequantize, noop, nb_gemm] has the edge noop
 * -> nb_gemm programmatic unless NIBBLE_PDL=0, and kernel 2's split grid
 * after the noop a plain edge but with NIBBLE_PDL=1; a noop at the root
 * (no programmatic edge into it) is followed by a plain edge in "auto".
 * And a tensor-core call with a tail split (two launches) after a memset
 * node: plain into its first launch, programmatic between its two (unless
 * NIBBLE_PDL=0). */
static void test_pdl_capture(env_t *e, int cc_major) {
#if CUDART_VERSION >= 13000
    const char *was = getenv("NIBBLE_PDL");
    char keep[16] = "";
    if (was) snprintf(keep, sizeof keep, "%s", was);
    const int64_t n = 256, k = 1024, m = 1;
    weight_t w;
    make_weight(e->ctx, &w, NB_FORMAT_NVFP4, n, k, 0, 0);
    nb_weight_desc cd = w.desc;
    cd.layout = NB_LAYOUT_CHECKPOINT;
    uint16_t *hx = malloc((size_t)(m * k) * 2), *href = malloc((size_t)(m * n) * 2), *hy = malloc((size_t)(m * n) * 2);
    for (int64_t i = 0; i < m * k; i++) hx[i] = to16(NB_DTYPE_BF16, frand());
    void *dx, *dy, *ddq;
    CK(cudaMalloc(&dx, (size_t)(m * k) * 2));
    CK(cudaMalloc(&dy, (size_t)(m * n) * 2));
    CK(cudaMalloc(&ddq, (size_t)(n * k) * 2));
    CK(cudaMemcpy(dx, hx, (size_t)(m * k) * 2, cudaMemcpyHostToDevice));
    nb_gemm_desc g;
    NB(nb_gemm_desc_init(&g, &w.desc, m, NB_DTYPE_BF16, NB_DTYPE_BF16));
    size_t ws = 0;
    NB(nb_gemm_workspace_size(e->ctx, &g, &ws));
    ensure_ws(e, ws);
    NB(nb_gemm(e->ctx, &g, dx, w.d_packed, NULL, dy, e->ws, e->ws_bytes, NULL));
    CK(cudaDeviceSynchronize());
    CK(cudaMemcpy(href, dy, (size_t)(m * n) * 2, cudaMemcpyDeviceToHost));
    /* the dense MLP's chain: gate_up (n = 256 rows: I = 128) -> nb_glu -> down (k = 128) */
    weight_t wd;
    make_weight(e->ctx, &wd, NB_FORMAT_NVFP4, 256, 128, 0, 0);
    nb_gemm_desc gd;
    NB(nb_gemm_desc_init(&gd, &wd.desc, m, NB_DTYPE_BF16, NB_DTYPE_BF16));
    NB(nb_gemm_workspace_size(e->ctx, &gd, &ws));
    ensure_ws(e, ws);
    nb_glu_desc gl;
    NB(nb_glu_desc_init(&gl, NB_MOE_ACT_SWIGLU, m, n / 2, NB_DTYPE_BF16));
    void *dh, *dz;
    uint16_t *hzref = malloc((size_t)(m * 256) * 2), *hz = malloc((size_t)(m * 256) * 2);
    CK(cudaMalloc(&dh, (size_t)(m * n / 2) * 2));
    CK(cudaMalloc(&dz, (size_t)(m * 256) * 2));
    NB(nb_gemm(e->ctx, &g, dx, w.d_packed, NULL, dy, e->ws, e->ws_bytes, NULL));
    NB(nb_glu(e->ctx, &gl, dy, dh, NULL));
    NB(nb_gemm(e->ctx, &gd, dh, wd.d_packed, NULL, dz, e->ws, e->ws_bytes, NULL));
    CK(cudaDeviceSynchronize());
    CK(cudaMemcpy(hzref, dz, (size_t)(m * 256) * 2, cudaMemcpyDeviceToHost));
    /* decode kernel 2's split grid at 8 tokens (14336 -> 4096, as Llama-3 8B's down projection) */
    weight_t wk;
    make_weight(e->ctx, &wk, NB_FORMAT_NVFP4, 4096, 14336, 0, 0);
    nb_gemm_desc gk;
    NB(nb_gemm_desc_init(&gk, &wk.desc, 8, NB_DTYPE_BF16, NB_DTYPE_BF16));
    NB(nb_gemm_workspace_size(e->ctx, &gk, &ws));
    ensure_ws(e, ws);
    void *kx, *ky;
    CK(cudaMalloc(&kx, (size_t)(8 * wk.k) * 2));
    CK(cudaMalloc(&ky, (size_t)(8 * wk.n) * 2));
    CK(cudaMemset(kx, 0, (size_t)(8 * wk.k) * 2));
    char kcfg[256] = "";
    NB(nb_gemm(e->ctx, &gk, kx, wk.d_packed, NULL, ky, e->ws, e->ws_bytes, NULL));
    NB(nb_gemm_last_config(e->ctx, kcfg, sizeof kcfg));
    const int k2 = strstr(kcfg, "gemv_fp4_xs") && !strstr(kcfg, "stream-k");
    if (!k2) printf("test_pdl_capture: 14336 -> 4096 at m = 8 ran %s, not kernel 2's split grid: its edges not "
                    "checked\n", kcfg);
    cudaStream_t s;
    CK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
    const int P = cudaGraphDependencyTypeProgrammatic, D = cudaGraphDependencyTypeDefault;
    cudaLibrary_t noop_lib = NULL;
    cudaKernel_t noop = NULL;
    if (cc_major >= 9) {
        const int ok = cudaLibraryLoadData(&noop_lib, pdl_noop_ptx, NULL, NULL, 0, NULL, NULL, 0) == cudaSuccess &&
                       cudaLibraryGetKernel(&noop, noop_lib, "nb_test_pdl_noop") == cudaSuccess;
        check(ok, "test_pdl_capture: the PTX of another library's kernel with programmatic dependent launch loads");
        if (!ok) (void)cudaGetLastError(), noop = NULL;
    }
    static const char *const modes[4] = {NULL, "0", "1", "auto"};
    for (int i = 0; i < 4; i++) {
        if (modes[i]) setenv("NIBBLE_PDL", modes[i], 1);
        else unsetenv("NIBBLE_PDL");
        nb_context *c;
        NB(nb_context_create(0, &c));
        const int on = cc_major >= 9 && !(modes[i] && !strcmp(modes[i], "0"));
        const int always = on && modes[i] && !strcmp(modes[i], "1");
        cudaGraph_t graph;
        CK(cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal));
        nb_status st = nb_dequantize(c, &cd, w.d_codes, w.d_scales, NB_DTYPE_BF16, ddq, s);
        if (!st) st = nb_gemm(c, &g, dx, w.d_packed, NULL, dy, e->ws, e->ws_bytes, s);
        if (!st) st = nb_gemm(c, &g, dx, w.d_packed, NULL, dy, e->ws, e->ws_bytes, s);
        CK(cudaStreamEndCapture(s, &graph));
        char what[200];
        int t1 = -1, t2 = -1;
        cudaGraphNode_t r = root_node(graph), a = r ? next_node(r, &t1) : NULL, b = a ? next_node(a, &t2) : NULL;
        snprintf(what, sizeof what, "NIBBLE_PDL=%s: captured dequantize -> nb_gemm -> nb_gemm: edges %d, %d (want %d, "
                 "%d; 1 programmatic), status %s", modes[i] ? modes[i] : "(unset)", t1, t2, always ? P : D,
                 on ? P : D, nb_status_name(st));
        check(st == NB_OK && b && t1 == (always ? P : D) && t2 == (on ? P : D), what);
        snprintf(what, sizeof what, "NIBBLE_PDL=%s: the captured graph's result equals the direct call's bits",
                 modes[i] ? modes[i] : "(unset)");
        check(replay_equals(graph, s, dy, (size_t)(m * n) * 2, NULL, 0, hy, href), what);
        /* nb_gemm -> nb_glu -> nb_gemm: nb_glu takes nb_gemm's rule both ways */
        CK(cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal));
        st = nb_gemm(c, &g, dx, w.d_packed, NULL, dy, e->ws, e->ws_bytes, s);
        if (!st) st = nb_glu(c, &gl, dy, dh, s);
        if (!st) st = nb_gemm(c, &gd, dh, wd.d_packed, NULL, dz, e->ws, e->ws_bytes, s);
        CK(cudaStreamEndCapture(s, &graph));
        t1 = t2 = -1;
        r = root_node(graph), a = r ? next_node(r, &t1) : NULL, b = a ? next_node(a, &t2) : NULL;
        snprintf(what, sizeof what, "NIBBLE_PDL=%s: captured nb_gemm -> nb_glu -> nb_gemm: edges %d, %d (want %d, "
                 "%d; 1 programmatic), status %s", modes[i] ? modes[i] : "(unset)", t1, t2, on ? P : D, on ? P : D,
                 nb_status_name(st));
        check(st == NB_OK && b && t1 == (on ? P : D) && t2 == (on ? P : D), what);
        snprintf(what, sizeof what, "NIBBLE_PDL=%s: the captured gemm -> glu -> gemm graph equals the direct calls' bits",
                 modes[i] ? modes[i] : "(unset)");
        check(replay_equals(graph, s, dz, (size_t)(m * 256) * 2, dh, (size_t)(m * n / 2) * 2, hz, hzref), what);
        /* after another library's kernel that took programmatic dependent launch (device.c pdl_head) */
        if (noop) {
            cudaError_t le;
            st = capture_after_pdl(c, &cd, &w, ddq, noop, &g, dx, w.d_packed, dy, e, s, &graph, &le);
            t1 = t2 = -1;
            r = root_node(graph), a = r ? next_node(r, &t1) : NULL, b = a ? next_node(a, &t2) : NULL;
            snprintf(what, sizeof what, "NIBBLE_PDL=%s: captured dequantize -> PDL kernel -> nb_gemm: edges %d, %d "
                     "(want %d, %d; 1 programmatic), status %s, launch %s", modes[i] ? modes[i] : "(unset)", t1, t2, P,
                     on ? P : D, nb_status_name(st), cudaGetErrorString(le));
            check(st == NB_OK && le == cudaSuccess && b && t1 == P && t2 == (on ? P : D), what);
            snprintf(what, sizeof what, "NIBBLE_PDL=%s: nb_gemm after a PDL kernel: the graph equals the direct "
                     "call's bits", modes[i] ? modes[i] : "(unset)");
            check(replay_equals(graph, s, dy, (size_t)(m * n) * 2, NULL, 0, hy, href), what);
            /* the same kernel at the root (nothing before it, so no programmatic edge into it) */
            CK(cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal));
            le = launch_pdl_noop(noop, s);
            st = le == cudaSuccess ? nb_gemm(c, &g, dx, w.d_packed, NULL, dy, e->ws, e->ws_bytes, s) : NB_OK;
            CK(cudaStreamEndCapture(s, &graph));
            t1 = -1;
            r = root_node(graph), a = r ? next_node(r, &t1) : NULL;
            snprintf(what, sizeof what, "NIBBLE_PDL=%s: captured PDL kernel (root) -> nb_gemm: edge %d (want %d), "
                     "status %s, launch %s", modes[i] ? modes[i] : "(unset)", t1, always ? P : D, nb_status_name(st),
                     cudaGetErrorString(le));
            check(st == NB_OK && le == cudaSuccess && a && t1 == (always ? P : D), what);
            CK(cudaGraphDestroy(graph));
            /* kernel 2's split grid after it: plain but with NIBBLE_PDL=1 (device.c pdl_k2_ok) */
            if (k2) {
                st = capture_after_pdl(c, &cd, &w, ddq, noop, &gk, kx, wk.d_packed, ky, e, s, &graph, &le);
                t1 = t2 = -1;
                r = root_node(graph), a = r ? next_node(r, &t1) : NULL, b = a ? next_node(a, &t2) : NULL;
                snprintf(what, sizeof what, "NIBBLE_PDL=%s: dequantize -> PDL kernel -> kernel 2 split (m = 8): "
                         "edges %d, %d (want %d, %d), status %s", modes[i] ? modes[i] : "(unset)", t1, t2, P,
                         always ? P : D, nb_status_name(st));
                check(st == NB_OK && le == cudaSuccess && b && t1 == P && t2 == (always ? P : D), what);
                CK(cudaGraphDestroy(graph));
            }
        }
        /* kernel 2's split grid at 8 tokens after another kernel, after itself, and before another: a
         * programmatic edge only between the two calls of the same plan, but with NIBBLE_PDL=1 everywhere
         * (device.c pdl_k2) */
        if (k2) {
            CK(cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal));
            st = nb_gemm(c, &g, dx, w.d_packed, NULL, dy, e->ws, e->ws_bytes, s);
            if (!st) st = nb_gemm(c, &gk, kx, wk.d_packed, NULL, ky, e->ws, e->ws_bytes, s);
            if (!st) st = nb_gemm(c, &gk, kx, wk.d_packed, NULL, ky, e->ws, e->ws_bytes, s);
            if (!st) st = nb_gemm(c, &g, dx, w.d_packed, NULL, dy, e->ws, e->ws_bytes, s);
            CK(cudaStreamEndCapture(s, &graph));
            int t3 = -1;
            t1 = t2 = -1;
            r = root_node(graph), a = r ? next_node(r, &t1) : NULL, b = a ? next_node(a, &t2) : NULL;
            cudaGraphNode_t c4 = b ? next_node(b, &t3) : NULL;
            snprintf(what, sizeof what, "NIBBLE_PDL=%s: nb_gemm -> kernel 2 split (m = 8) -> the same -> nb_gemm: edges "
                     "%d, %d, %d (want %d, %d, %d), status %s", modes[i] ? modes[i] : "(unset)", t1, t2, t3,
                     always ? P : D, on ? P : D, always ? P : D, nb_status_name(st));
            check(st == NB_OK && c4 && t1 == (always ? P : D) && t2 == (on ? P : D) && t3 == (always ? P : D), what);
            CK(cudaGraphDestroy(graph));
        }
        nb_context_destroy(c);
    }
    if (noop_lib) cudaLibraryUnload(noop_lib);
    cudaFree(kx);
    cudaFree(ky);
    free_weight(&wk);
    free(hz);
    free(hzref);
    cudaFree(dh);
    cudaFree(dz);
    free_weight(&wd);
    if (keep[0]) setenv("NIBBLE_PDL", keep, 1);
    else unsetenv("NIBBLE_PDL");
    /* a tail split: 133 tiles of 128 rows at m = 1000 (as test_shape's 17016 rows) */
    weight_t t;
    make_weight(e->ctx, &t, NB_FORMAT_NVFP4, 17016, 4096 + 96, 0, 0);
    const int64_t tm = 1000;
    void *tx, *ty;
    CK(cudaMalloc(&tx, (size_t)(tm * t.k) * 2));
    CK(cudaMalloc(&ty, (size_t)(tm * t.n) * 2));
    NB(nb_gemm_desc_init(&g, &t.desc, tm, NB_DTYPE_BF16, NB_DTYPE_BF16));
    NB(nb_gemm_workspace_size(e->ctx, &g, &ws));
    ensure_ws(e, ws);
    cudaGraph_t graph;
    CK(cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal));
    cudaError_t me = cudaMemsetAsync(tx, 0, (size_t)(tm * t.k) * 2, s);
    nb_status st = nb_gemm(e->ctx, &g, tx, t.d_packed, NULL, ty, e->ws, e->ws_bytes, s);
    CK(cudaStreamEndCapture(s, &graph));
    char cfg[256] = "";
    nb_gemm_last_config(e->ctx, cfg, sizeof cfg);
    if (st == NB_OK && me == cudaSuccess && strstr(cfg, "gemm_sm90") && strstr(cfg, " tail=")) {
        const int off = keep[0] && !strcmp(keep, "0"); /* (a memset node never takes a programmatic edge) */
        int t1 = -1, t2 = -1;
        cudaGraphNode_t r = root_node(graph), a = r ? next_node(r, &t1) : NULL, b = a ? next_node(a, &t2) : NULL;
        char what[200];
        snprintf(what, sizeof what, "a tail split captured after a memset: edges %d, %d (want %d, %d; 1 "
                 "programmatic)", t1, t2, D, off ? D : P);
        check(b && t1 == D && t2 == (off ? D : P), what);
    } else {
        check(st == NB_OK && me == cudaSuccess, "nb_gemm of 17016 rows at m = 1000 under capture");
        printf("test_pdl_capture: no tail split here (%s): its edges not checked\n", cfg);
    }
    CK(cudaGraphDestroy(graph));
    cudaFree(tx);
    cudaFree(ty);
    free_weight(&t);
    CK(cudaStreamDestroy(s));
    cudaFree(dx);
    cudaFree(dy);
    cudaFree(ddq);
    free(hx);
    free(href);
    free(hy);
    free_weight(&w);
#else
    (void)e, (void)cc_major;
    printf("test_pdl_capture: needs CUDA 13's graph edge queries (not checked)\n");
#endif
}

static void test_device_errors(env_t *e) {
    weight_t w;
    make_weight(e->ctx, &w, NB_FORMAT_NVFP4, 64, 4096, 0, 0); /* narrow: split-K, so a workspace */
    nb_gemm_desc g;
    NB(nb_gemm_desc_init(&g, &w.desc, 4, NB_DTYPE_BF16, NB_DTYPE_BF16));
    size_t ws = 0;
    NB(nb_gemm_workspace_size(e->ctx, &g, &ws));
    ensure_ws(e, ws);
    char *dx, *dy;
    CK(cudaMalloc((void **)&dx, 32 * 4096 * 2 + 64)); /* room for m = 32 */
    CK(cudaMalloc((void **)&dy, 32 * 64 * 2 + 64));
    check(nb_gemm(e->ctx, &g, dx + 2, w.d_packed, NULL, dy, e->ws, e->ws_bytes, NULL) == NB_ERR_MISALIGNED,
          "nb_gemm: x not 16-byte aligned -> NB_ERR_MISALIGNED");
    check(nb_gemm(e->ctx, &g, dx, (char *)w.d_packed + 8, NULL, dy, e->ws, e->ws_bytes, NULL) == NB_ERR_MISALIGNED,
          "nb_gemm: packed not 16-byte aligned -> NB_ERR_MISALIGNED");
    check(nb_gemm(e->ctx, &g, dx, w.d_packed, NULL, dy + 1, e->ws, e->ws_bytes, NULL) == NB_ERR_MISALIGNED,
          "nb_gemm: y not 2-byte aligned -> NB_ERR_MISALIGNED");
    check(nb_gemm(e->ctx, &g, NULL, w.d_packed, NULL, dy, e->ws, e->ws_bytes, NULL) == NB_ERR_NULL_POINTER,
          "nb_gemm: x NULL -> NB_ERR_NULL_POINTER");
    /* configurations given with the call: checked like tuning entries */
    nb_gemm_config bad;
    memset(&bad, 0, sizeof bad);
    bad.path = NB_GEMM_PATH_DECODE, bad.kw = 3;
    check(nb_gemm_ex(e->ctx, &g, &bad, dx, w.d_packed, NULL, dy, e->ws, e->ws_bytes, NULL) == NB_ERR_INVALID_ARGUMENT &&
              strstr(nb_last_error(), "kw = 3"),
          "nb_gemm_ex: kw = 3 -> NB_ERR_INVALID_ARGUMENT naming the field");
    memset(&bad, 0, sizeof bad);
    bad.path = NB_GEMM_PATH_TENSOR_CORE, bad.bn = 512;
    check(nb_gemm_ex(e->ctx, &g, &bad, dx, w.d_packed, NULL, dy, e->ws, e->ws_bytes, NULL) == NB_ERR_INVALID_ARGUMENT,
          "nb_gemm_ex: bn = 512 -> NB_ERR_INVALID_ARGUMENT");
    memset(&bad, 0, sizeof bad);
    bad.path = 9;
    check(nb_gemm_ex(e->ctx, &g, &bad, dx, w.d_packed, NULL, dy, e->ws, e->ws_bytes, NULL) == NB_ERR_INVALID_ARGUMENT,
          "nb_gemm_ex: path 9 -> NB_ERR_INVALID_ARGUMENT");
    memset(&bad, 0, sizeof bad);
    bad.path = NB_GEMM_PATH_DECODE, bad.variant = 0, bad.rpw = 2;
    check(nb_gemm_ex(e->ctx, &g, &bad, dx, w.d_packed, NULL, dy, e->ws, e->ws_bytes, NULL) == NB_ERR_INVALID_ARGUMENT,
          "nb_gemm_ex: rpw on the plain decode kernel -> NB_ERR_INVALID_ARGUMENT");
    memset(&bad, 0, sizeof bad);
    bad.path = NB_GEMM_PATH_DECODE, bad.stages = 2;
    check(nb_gemm_ex(e->ctx, &g, &bad, dx, w.d_packed, NULL, dy, e->ws, e->ws_bytes, NULL) == NB_ERR_INVALID_ARGUMENT,
          "nb_gemm_ex: stages on the decode path -> NB_ERR_INVALID_ARGUMENT");
    nb_device_info di;
    NB(nb_context_device_info(e->ctx, &di));
    if (!(di.cc_major == 9 && di.cc_minor == 0)) {
        memset(&bad, 0, sizeof bad);
        bad.path = NB_GEMM_PATH_TENSOR_CORE;
        check(nb_gemm_ex(e->ctx, &g, &bad, dx, w.d_packed, NULL, dy, e->ws, e->ws_bytes, NULL) == NB_ERR_UNSUPPORTED,
              "nb_gemm_ex: path tc off Hopper -> NB_ERR_UNSUPPORTED");
    }
    size_t wsx = 0;
    check(nb_gemm_workspace_size_ex(e->ctx, &g, NULL, NULL) == NB_ERR_NULL_POINTER,
          "nb_gemm_workspace_size_ex: bytes NULL -> NB_ERR_NULL_POINTER");
    memset(&bad, 0, sizeof bad);
    bad.path = NB_GEMM_PATH_DECODE, bad.kw = 1, bad.splits = 64;
    check(nb_gemm_workspace_size_ex(e->ctx, &g, &bad, &wsx) == NB_OK && wsx > 0,
          "nb_gemm_workspace_size_ex: a 64-way split needs a workspace");
    /* The workspace size covers every m; m = 32 on this narrow layer needs
     * all of it on most GPUs. */
    nb_gemm_desc g32;
    NB(nb_gemm_desc_init(&g32, &w.desc, 32, NB_DTYPE_BF16, NB_DTYPE_BF16));
    size_t ws32 = 0;
    NB(nb_gemm_workspace_size(e->ctx, &g32, &ws32));
    if (!g_mma) check(ws > 0, "a 64-row layer with k = 4096 is planned with a k split (workspace > 0)");
    check(ws32 == ws, "nb_gemm_workspace_size does not depend on m");
    if (ws) {
        check(nb_gemm(e->ctx, &g32, dx, w.d_packed, NULL, dy, e->ws, ws, NULL) == NB_OK,
              "nb_gemm: m = 32 runs in the reported workspace");
        /* a k split summed through the workspace (the decode kernels' always
         * is; the tensor-core path's only where its splits cannot form a
         * cluster) with too little of it */
        nb_gemm_config dsplit;
        memset(&dsplit, 0, sizeof dsplit);
        dsplit.path = NB_GEMM_PATH_DECODE, dsplit.kw = 1, dsplit.splits = 8;
        check(nb_gemm_ex(e->ctx, &g32, &dsplit, dx, w.d_packed, NULL, dy, e->ws, 64, NULL) == NB_ERR_WORKSPACE,
              "nb_gemm_ex: a 64-byte workspace where the decode k split needs more -> NB_ERR_WORKSPACE");
        char cfg[256] = "";
        const nb_status st64 = nb_gemm(e->ctx, &g32, dx, w.d_packed, NULL, dy, e->ws, 64, NULL);
        nb_gemm_last_config(e->ctx, cfg, sizeof cfg);
        if (strstr(cfg, "(cluster)"))
            check(st64 == NB_OK, "nb_gemm: a tensor-core k split summed in a cluster needs no workspace");
        else
            check(st64 == NB_ERR_WORKSPACE, "nb_gemm: a 64-byte workspace where the k split needs more -> "
                  "NB_ERR_WORKSPACE");
    }
    nb_gemm_desc h = g;
    h.lda = 4100; /* rows no longer 16-byte aligned */
    check(nb_gemm(e->ctx, &h, dx, w.d_packed, NULL, dy, e->ws, e->ws_bytes, NULL) == NB_ERR_MISALIGNED,
          "nb_gemm: lda not a multiple of 8 -> NB_ERR_MISALIGNED");
    h = g;
    h.weight.layout = NB_LAYOUT_CHECKPOINT;
    check(nb_gemm(e->ctx, &h, dx, w.d_packed, NULL, dy, e->ws, e->ws_bytes, NULL) == NB_ERR_INVALID_ARGUMENT,
          "nb_gemm: checkpoint layout -> NB_ERR_INVALID_ARGUMENT");
    h = g;
    h.act_dtype = h.out_dtype = NB_DTYPE_F32;
    check(nb_gemm_can_implement(e->ctx, &h) == NB_ERR_UNSUPPORTED, "nb_gemm: F32 activations -> NB_ERR_UNSUPPORTED");
    nb_weight_desc cd = w.desc;
    cd.layout = NB_LAYOUT_CHECKPOINT;
    check(nb_pack(e->ctx, &cd, w.d_codes, w.d_scales, w.d_packed, w.sz.packed_bytes - 1, NULL) ==
              NB_ERR_BUFFER_TOO_SMALL,
          "nb_pack: buffer one byte short -> NB_ERR_BUFFER_TOO_SMALL");
    check(nb_pack(e->ctx, &cd, w.d_codes, w.d_scales, (char *)w.d_packed + 4, w.sz.packed_bytes, NULL) ==
              NB_ERR_MISALIGNED,
          "nb_pack: packed not 16-byte aligned -> NB_ERR_MISALIGNED");
    check(nb_context_last_error(e->ctx)[0] != 0, "device errors leave a message in the context");
    CK(cudaFree(dx));
    CK(cudaFree(dy));
    free_weight(&w);
}

int main(int argc, char **argv) {
    int quick = 0;
    const char *only_fmt = NULL; /* --format: one of the two formats (the sanitizer runs, in parallel) */
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--quick")) quick = 1;
        else if (!strcmp(argv[i], "--no-cublas")) g_no_cublas = 1;
        else if (i + 1 < argc && !strcmp(argv[i], "--max-m")) g_max_m = atoi(argv[++i]);
        else if (i + 1 < argc && !strcmp(argv[i], "--min-m")) g_min_m = atoi(argv[++i]);
        else if (i + 1 < argc && !strcmp(argv[i], "--format")) {
            only_fmt = argv[++i];
            if (strcmp(only_fmt, "nvfp4") && strcmp(only_fmt, "mxfp4")) {
                fprintf(stderr, "test_gpu: --format takes nvfp4 or mxfp4\n");
                return 1;
            }
        }
        else if (!strcmp(argv[i], "--staged")) {
            g_force.path = NB_GEMM_PATH_DECODE;
            g_force.variant = 1; /* the staged-activation kernel; rows per warp and splits by the planner */
            g_force_max_m = 32;
        } else {
            fprintf(stderr, "usage: test_gpu [--quick] [--no-cublas] [--min-m N] [--max-m N] [--staged] [--format nvfp4|mxfp4]\n");
            return 1;
        }
    }
    gt_need_device("test_gpu");
    const char *path = getenv("NIBBLE_PATH");
    g_mma = path && !strcmp(path, "mma");
    env_t e = {0};
    NB(nb_context_create(0, &e.ctx));
    nb_device_info info;
    NB(nb_context_device_info(e.ctx, &info));
    printf("test_gpu on %s (sm_%d%d, %d SMs)%s%s%s\n", info.name, info.cc_major, info.cc_minor, info.sm_count,
           quick ? " quick" : "", g_mma ? ", NIBBLE_PATH=mma" : "",
           g_force_max_m >= 0 ? ", the staged decode kernel given with every call of m <= 32" : "");
    if (cublasCreate(&e.blas) != CUBLAS_STATUS_SUCCESS) {
        fprintf(stderr, "cublasCreate failed\n");
        return 1;
    }
    static const int all_m[] = {1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 17, 18, 19, 20, 21, 22,
                                23, 24, 25, 26, 27, 28, 29, 30, 31, 32, 33, 64};
    static const int few_m[] = {1, 3, 8, 9, 16, 17, 32, 33};
    static const int wave8_m[] = {1, 2, 5, 8};
    /* the tensor-core path on Hopper (m > 32, and 17..32 on narrow layers; decode slices elsewhere) */
    static const int tc_m[] = {1, 17, 32, 33, 64, 100, 128, 256, 1000};
    static const int sk_m[] = {40, 64, 100, 128, 200, 256}, m192[] = {300, 384};
    static const int big_m[] = {1,  2,  3,  4,  5,  6,  7,  8,  9,  10, 11, 12, 13,  14,  15,   16,   17,  18,  19,
                                20, 21, 22, 23, 24, 25, 26, 27, 28, 29, 30, 31, 32, 33, 64, 100, 128, 256, 1000, 1024, 4096};
    /* NIBBLE_PATH=mma: the mma kernel's tile edges (64 / 128 tokens, 128 rows) */
    static const int mma_m[] = {32, 33, 64, 100, 128, 256, 1000, 1024, 4096};
    static const int llama_m[] = {33, 256, 1024, 4096};
    const nb_format fmts[2] = {NB_FORMAT_NVFP4, NB_FORMAT_MXFP4};
    const nb_dtype acts[2] = {NB_DTYPE_BF16, NB_DTYPE_F16};
    for (int f = 0; f < 2; f++) {
        if (only_fmt && strcmp(only_fmt, f == 0 ? "nvfp4" : "mxfp4")) continue;
        test_dequant(&e, fmts[f]);
        for (int a = 0; a < 2; a++) {
            test_nan_scales(&e, fmts[f], acts[a]);
            /* ragged: n not a multiple of 16 or of the CTA, k odd multiples of the group */
            test_shape(&e, fmts[f], acts[a], 17, fmts[f] == NB_FORMAT_NVFP4 ? 16 * 37 : 32 * 7, few_m, 8, 1);
            test_shape(&e, fmts[f], acts[a], 1000, 4096 + 96, few_m, 8, 1);
            /* 256 row blocks: kernel 1 at m = 1..8 on 256 CTAs, held to two
             * per SM where its registers allow three (plan.c), over a k whose
             * last chunk is partial (its activation loads tested, the others
             * not: gemv_step.cuh chunk_x_step) */
            test_shape(&e, fmts[f], acts[a], 4096, 4096 + 96, few_m, 8, 0);
            test_shape(&e, fmts[f], acts[a], 300, 64 * 3 * 16, all_m, 34, 1);
            /* wide and short: the staged-activation kernel (m = 9..32; k long
             * enough for it, with a ragged tail; at 17..24 tokens its 8-warp
             * stream-K wave: 94 tiles x 2 splits would fill 188 of 264 slots)
             * and kernel 1 (k too short) */
            test_shape(&e, fmts[f], acts[a], 24000 + 8, 1536 + 64, few_m, 8, 0);
            test_shape(&e, fmts[f], acts[a], 24000 + 8, 256 + 64, few_m, 8, 0);
            /* more 256-row tiles (301, of 7 chunks) than a wave of kernel 2's
             * CTAs: its stream-K grid, runs over tile ends, whole tiles between
             * partial ones (m = 17..32: 16 chunks a CTA) */
            test_shape(&e, fmts[f], acts[a], 76800 + 8, 832, few_m, 8, 0);
            /* a layer of 1113 row blocks (the last partial) and 41 chunks (a
             * ragged tail): kernel 2 on its stream-K wave at 17..32 tokens,
             * the wide instance (12 consumer warps) at 17..24 (plan.c,
             * k2_wave), two CTAs per SM at 9..16 (70 tiles in 3 splits
             * would fill 210 of 264 slots: wave16) */
            test_shape(&e, fmts[f], acts[a], 17800, 5120 + 96, few_m, 8, 0);
            /* 1793 row blocks (the last of 8 rows) over 29 chunks (the last
             * of 96 columns): kernel 2 on its stream-K wave with four row
             * blocks per warp at 17..32 tokens (plan.c k2_rpw4), 8 warps at
             * 17 (57 tiles of 512 rows), 7 at 32 (65 of 448, the last with
             * one row block): 13-15 chunks a CTA, each tile shared by two
             * or three CTAs */
            test_shape(&e, fmts[f], acts[a], 28672 + 8, 3584 + 96, few_m, 8, 0);
            /* 113 tiles of 256 rows (the last of 96) over 33 chunks (the
             * last partial): kernel 2 on its stream-K wave at 2..8 tokens,
             * two CTAs per SM (plan.c, wave8) */
            test_shape(&e, fmts[f], acts[a], 28672 + 96, 4096 + 96, wave8_m, 4, 0);
            /* 1790 row blocks (the last of 8 rows) over 32 chunks (the last
             * partial): kernel 1 at one token with kw = 1 would put 224 CTAs
             * of 8 row blocks on 132 SMs; its balanced wave (plan.c) takes 7 a
             * CTA (256 CTAs, the last with 5: warps idle by rule and past n) */
            test_shape(&e, fmts[f], acts[a], 28672 - 40, 4000, wave8_m, 4, 0);
            /* 1183 row blocks (the last of 8 rows) over 28 chunks at one
             * token: kw = 2 (296 CTAs of 4 row blocks, 2.2 per SM) balanced
             * to 395 CTAs of 3, the last with one: idle warp pairs inside the
             * in-CTA k sum */
            test_shape(&e, fmts[f], acts[a], 18944 - 24, 3584 - 64, wave8_m, 1, 0);
            /* 500 row blocks (32 tiles of 256 rows, the last of 4) over 121
             * chunks (the last of 32 columns): at 5..8 tokens kernel 2 on 8
             * splits of 16 chunks, two CTAs per SM (plan.c,
             * k2_balanced_split; held to two by its dynamic shared memory),
             * the last split of 9; 326 row blocks (21
             * tiles, the last of 6) at 8 tokens: 6 splits, one CTA per SM */
            test_shape(&e, fmts[f], acts[a], 8000, 15392, wave8_m + 2, 2, 0);
            test_shape(&e, fmts[f], acts[a], 5120 + 96, 15392, wave8_m + 3, 1, 0);
            test_shape(&e, fmts[f], acts[a], 1000 + 24, 4096 + 96, tc_m, 9, 1);
            /* the 16- and 32-token tiles with four consumer warpgroups (layers
             * of >= 48 128-row tiles: here 49, so 25 tiles of 256 rows, the
             * last with 2 of its 16 row blocks) */
            test_shape(&e, fmts[f], acts[a], 6144 + 24, 1024 + 96, tc_m, 9, 0);
            test_shape(&e, fmts[f], acts[a], 129, 16 * 9 * (fmts[f] == NB_FORMAT_NVFP4 ? 1 : 2), tc_m, 9, 0);
            /* 133 tiles of 128 rows (the last of 120): a wave of 132 and a
             * tail split (plan.c tc_tail) of 1..4 tiles over 33 chunks (7
             * splits of 5, the last of 3) */
            test_shape(&e, fmts[f], acts[a], 17016, 4096 + 96, tc_m, 9, 0);
            /* 81 tiles of 128 rows (the last of 8) over 33 chunks: the stream-K
             * grid (plan.c tc_stream_k) at m = 40 and 64 (one 64-token tile,
             * at 40 part empty), 128 and 200 (128-token tiles, the second of
             * 72 tokens moved back to rows 72..199) and 256 (one 256-token
             * tile), one CTA per SM, tiles shared by two or three CTAs; m =
             * 100 likewise on one 128-token tile of 100 tokens */
            test_shape(&e, fmts[f], acts[a], 10240 + 8, 4096 + 96, sk_m, 6, 1);
            /* 65 tiles of 128 rows (the last of 8) at m = 300 and 384: the
             * 192-token tile (at 300 the second moved back to rows 108..299) */
            test_shape(&e, fmts[f], acts[a], 8192 + 8, 8192, m192, 2, 1);
            if (g_force_max_m < 0 && !g_mma) test_every_config(&e, fmts[f], acts[a], quick);
            if (g_force_max_m < 0) test_out_layout(&e, fmts[f], acts[a]);
            if (g_mma) { /* a ragged layer and a Llama layer (4096 -> 4096) up to m = 4096 */
                test_shape_ref(&e, fmts[f], acts[a], 1000, 4096 + 96, mma_m, 9, 1, 1);
                if (quick && !g_no_cublas) test_shape_ref(&e, fmts[f], acts[a], 4096, 4096, llama_m, 4, a == 0, 1);
                check_config(e.ctx, "gemm_sm80<", "NIBBLE_PATH=mma");
            }
            if (!quick) {
                static const int64_t shapes[][2] = {{4096, 4096}, {6144, 4096},  {28672, 4096}, {4096, 14336},
                                                    {8192, 8192}, {10240, 8192}, {57344, 8192}, {8192, 28672}};
                /* m = 4096 on the two smallest layers only (host memory and time) */
                for (int s = 0; s < 8; s++)
                    test_shape(&e, fmts[f], acts[a], shapes[s][0], shapes[s][1], big_m, s <= 1 || s == 4 ? 40 : 39, s == 4);
            }
        }
    }
    if (g_mma) test_mma_small_smem(&e);
    test_mx_range(&e);
    test_pdl_capture(&e, info.cc_major);
    test_device_errors(&e);
    printf("tensor-core path: %d calls, %d with a k split, %d with a tail split, %d on the stream-K grid (%d of "
           "64-token tiles, %d of 128-token tiles below 128 tokens), %d of 192-token tiles\n", g_tc_runs,
           g_tc_split_runs, g_tc_tail_runs, g_tc_sk_runs, g_tc_sk64_runs, g_tc_sk128p_runs, g_tc_192_runs);
    printf("decode kernel 1: %d calls held to two CTAs per SM, %d on a balanced wave; kernel 2 on a k-split grid at "
           "5..8 tokens: %d calls, %d held to two CTAs per SM\n", g_k1_cap_runs, g_k1_balanced_runs, g_k2_split8_runs,
           g_k2_cap_runs);
    printf("decode kernel 2 on its stream-K wave: %d calls at 25..32 tokens, %d at 17..24 (12 warps), %d at 17..24 (8 "
           "warps), %d at 9..16, %d at 2..8; %d with four row blocks per warp\n",
           g_k2_wave_runs, g_k2_wide_runs, g_k2_wave24_runs, g_k2_wave16_runs, g_k2_wave8_runs, g_k2_rpw4_runs);
    /* (on a GPU of at least 129 SMs whose registers fit three kernel 1 CTAs
     * per SM, as the H100 and H200 do) */
    if (g_force_max_m < 0 && !g_mma && info.sm_count >= 129 && info.sm_count <= 255 && (m_ran(1) || m_ran(8)))
        check(g_k1_cap_runs > 0, "kernel 1 ran held to two CTAs per SM (4096 rows: 256 CTAs)");
    /* (on a GPU of 129..255 SMs; each where --min-m / --max-m let its m run) */
    if (g_force_max_m < 0 && !g_mma && info.sm_count >= 129 && info.sm_count <= 255) {
        if (m_ran(32))
            check(g_k2_wave_runs > 0, "kernel 2 ran on its stream-K wave at 25..32 tokens (17800 rows, m = 32)");
        /* (NIBBLE_K2_RPW=2: never four row blocks per warp; =4: they replace the wide instance too) */
        const char *rw = getenv("NIBBLE_K2_RPW");
        if ((!rw || strcmp(rw, "2")) && (m_ran(17) || m_ran(32)))
            check(g_k2_rpw4_runs > 0, "kernel 2 ran with four row blocks per warp (28680 rows, k = 3680, m = 17 and 32)");
        if (m_ran(17)) {
            if (!rw || strcmp(rw, "4")) check(g_k2_wide_runs > 0, "kernel 2's wide instance ran (17800 rows, k = 5216, m = 17)");
            check(g_k2_wave24_runs > 0, "kernel 2 ran on its 8-warp stream-K wave at 17..24 tokens (24008 rows, k = 1600)");
        }
        if (m_ran(9) || m_ran(16))
            check(g_k2_wave16_runs > 0, "kernel 2 ran on its stream-K wave at 9..16 tokens (17800 rows, m = 9 and 16)");
        if (m_ran(1)) {
            check(g_k1_balanced_runs > 0, "kernel 1 ran on a balanced wave at one token (28632 rows, k = 4000)");
            check(g_k1_balanced_kw2 > 0, "kernel 1 ran on a balanced wave with kw = 2 (18920 rows, k = 3520)");
        }
        if (m_ran(5) || m_ran(8)) {
            check(g_k2_split8_runs > 0, "kernel 2 ran a k-split grid at 5..8 tokens (8000 rows, k = 15392)");
            check(g_k2_cap_runs > 0, "kernel 2 ran a k-split grid held to two CTAs per SM (8000 rows: 256 CTAs)");
        }
        if (m_ran(2) || m_ran(5) || m_ran(8))
            check(g_k2_wave8_runs > 0, "kernel 2 ran on its stream-K wave at 2..8 tokens (28768 rows, m = 2, 5, 8)");
    }
    if (g_tc_runs && m_ran(64)) check(g_tc_split_runs > 0, "the tensor-core path ran with a k split (small layers at m = 64)");
    /* (--staged leaves test_out_layout out; --min-m / --max-m may leave out every m it runs on the tensor core) */
    if (g_tc_runs && !g_mma && g_force_max_m < 0 && (m_ran(33) || m_ran(64) || m_ran(100) || m_ran(256)))
        check(g_tc_layout_runs > 0, "the output-layout test ran gemm_sm90 configurations");
    /* (each only where --max-m let its m run: a sanitizer run at small m
     * leaves these plans out) */
    if (g_tc_runs && !g_mma && !getenv("NIBBLE_SM90_TAIL") && m_ran(1000))
        check(g_tc_tail_runs > 0, "the tensor-core path ran a tail split (17016 rows: 133 tiles)");
    if (g_tc_runs && !g_mma && !getenv("NIBBLE_SM90_SK") && m_ran(256))
        check(g_tc_sk_runs > 0, "the tensor-core path ran the stream-K grid (10248 rows, m = 128..256)");
    if (g_tc_runs && !g_mma && !getenv("NIBBLE_SM90_SK") && (m_ran(40) || m_ran(64)))
        check(g_tc_sk64_runs > 0, "the tensor-core path ran the stream-K grid of 64-token tiles (10248 rows, m = 40, 64)");
    if (g_tc_runs && !g_mma && !getenv("NIBBLE_SM90_SK") && m_ran(100))
        check(g_tc_sk128p_runs > 0, "the tensor-core path ran the stream-K grid of 128-token tiles below 128 tokens (10248 rows, m = 100)");
    if (g_tc_runs && !g_mma && !getenv("NIBBLE_SM90_SK") && m_ran(384))
        check(g_tc_192_runs > 0, "the tensor-core path ran 192-token tiles (8200 rows, m = 300, 384)");
    char cfg[256];
    NB(nb_gemm_last_config(e.ctx, cfg, sizeof cfg));
    printf("last config: %s\n", cfg);
    cublasDestroy(e.blas);
    cudaFree(e.ws);
    nb_context_destroy(e.ctx);
    printf("%d passed, %d failed\n", g_pass, g_fail);
    return g_fail ? 1 : 0;
}
