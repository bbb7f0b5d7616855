/* moe_bench.c - nb_moe_mlp against the BF16 MoE a user has today: the same
 * routed computation with BF16 weights, one cuBLAS GEMM per active expert
 * and projection (gate_up [c_e, H] x [H, 2I], down [c_e, I] x [I, H]).
 *
 *   bench_moe [--formats nvfp4,mxfp4] [--batches 1,8,32,128,1024] [--iters N]
 *
 * Layers (one MoE MLP each): gpt-oss-120b (H 2880, I 2880, 128 experts,
 * top-4), gpt-oss-20b (32 experts), Qwen3-30B-A3B (2048, 768, 128, top-8),
 * DeepSeek-V3 (7168, 2048, 256, top-8).  Weights: one expert quantized from
 * random normal values (nb_quantize_host, packed by nb_moe_pack_host) and
 * copied to all E slots, so every expert has its own bytes in memory; BF16
 * weights random.  Routing: R = 8 uniform random routings per problem (top-k
 * distinct experts per token), so consecutive calls touch different experts
 * (weights rotate through L2).  Each side is captured in one CUDA graph that
 * runs the R routings; the time per call is the graph's time over R (CUDA
 * events, warm-up, median of 5 measurements of --iters replays, fewer when
 * a replay is long).
 *
 * The baseline is favoured: its tokens are gathered per expert beforehand and
 * neither its activation nor its combine is timed, only its GEMMs; nibble's
 * time is the whole MLP (routing layout, both projections with the
 * activation, combine).  GB/s counts the packed bytes of the experts a
 * routing activates, averaged over the R routings. */
#include "nibble.h"
#include "../tests/gpu_testlib.h" /* GT_CUDA, GT_NB, gt_rand */

#include <cublas_v2.h>
#include <cuda_bf16.h>
#include <cuda_runtime.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define CB(call)                                                                                               \
    do {                                                                                                       \
        cublasStatus_t s_ = (call);                                                                            \
        if (s_ != CUBLAS_STATUS_SUCCESS) {                                                                     \
            fprintf(stderr, "%s:%d %s: cuBLAS status %d\n", __FILE__, __LINE__, #call, (int)s_);             \
            exit(1);                                                                                           \
        }                                                                                                      \
    } while (0)

enum { R = 8 };

typedef struct layer {
    const char *name;
    int64_t H, I;
    int E, K;
} layer;

static const layer k_layers[] = {
    {"gpt-oss-120b", 2880, 2880, 128, 4},
    {"gpt-oss-20b", 2880, 2880, 32, 4},
    {"qwen3-30b-a3b", 2048, 768, 128, 8},
    {"deepseek-v3", 7168, 2048, 256, 8},
};

static uint64_t g_rng = 0x243F6A8885A308D3ull;
static uint64_t rnd(void) { return gt_rand(&g_rng); }
static double unit(void) { return (double)(rnd() >> 11) * 0x1p-53; }
static float normal(void) { return (float)(sqrt(-2.0 * log(unit() + 1e-300)) * cos(6.283185307179586 * unit())); }

static void route(const layer *L, int64_t m, int32_t *ids, float *tw) {
    int *perm = malloc(sizeof(int) * (size_t)L->E);
    for (int64_t t = 0; t < m; t++) {
        for (int e = 0; e < L->E; e++) perm[e] = e;
        for (int s = 0; s < L->K; s++) {
            int j = s + (int)(rnd() % (uint64_t)(L->E - s)), tmp = perm[s];
            perm[s] = perm[j];
            perm[j] = tmp;
            ids[t * L->K + s] = perm[s];
            tw[t * L->K + s] = 1.0f / (float)L->K;
        }
    }
    free(perm);
}

/* random BF16 in [-1/32, 1/32) on the device: a kernel-free fill from a host pattern */
static void fill_bf16(void *d, size_t n) {
    const size_t chunk = (size_t)1 << 24;
    uint16_t *h = malloc(2 * chunk);
    for (size_t i = 0; i < chunk; i++) {
        float v = (float)((unit() * 2.0 - 1.0) / 32.0);
        uint32_t b;
        memcpy(&b, &v, 4);
        h[i] = (uint16_t)((b + 0x7FFF + ((b >> 16) & 1)) >> 16);
    }
    for (size_t off = 0; off < n; off += chunk)
        GT_CUDA(cudaMemcpy((uint16_t *)d + off, h, 2 * (n - off < chunk ? n - off : chunk), cudaMemcpyHostToDevice));
    free(h);
}

static float time_graph(cudaGraphExec_t g, cudaStream_t s, int iters) {
    cudaEvent_t a, b;
    GT_CUDA(cudaEventCreate(&a));
    GT_CUDA(cudaEventCreate(&b));
    for (int i = 0; i < 2; i++) GT_CUDA(cudaGraphLaunch(g, s));
    /* replays per measurement: --iters, fewer when one launch is long (about 0.1 s per measurement) */
    float one;
    GT_CUDA(cudaEventRecord(a, s));
    GT_CUDA(cudaGraphLaunch(g, s));
    GT_CUDA(cudaEventRecord(b, s));
    GT_CUDA(cudaEventSynchronize(b));
    GT_CUDA(cudaEventElapsedTime(&one, a, b));
    if (one * (float)iters > 100.0f) iters = one > 100.0f ? 1 : (int)(100.0f / one);
    float best[5];
    for (int r = 0; r < 5; r++) {
        GT_CUDA(cudaEventRecord(a, s));
        for (int i = 0; i < iters; i++) GT_CUDA(cudaGraphLaunch(g, s));
        GT_CUDA(cudaEventRecord(b, s));
        GT_CUDA(cudaEventSynchronize(b));
        GT_CUDA(cudaEventElapsedTime(&best[r], a, b));
    }
    for (int i = 0; i < 5; i++) /* median */
        for (int j = i + 1; j < 5; j++)
            if (best[j] < best[i]) {
                float t = best[i];
                best[i] = best[j];
                best[j] = t;
            }
    GT_CUDA(cudaEventDestroy(a));
    GT_CUDA(cudaEventDestroy(b));
    return best[2] * 1000.0f / (float)(iters * R); /* us per call */
}

static void parse_list(const char *s, int64_t *out, int *n) {
    *n = 0;
    while (*s && *n < 16) {
        char *end;
        long long v = strtoll(s, &end, 10);
        if (end == s || v <= 0) {
            fprintf(stderr, "bench_moe: bad number list '%s'\n", s);
            exit(2);
        }
        out[(*n)++] = v;
        s = *end == ',' ? end + 1 : end;
        if (*end && *end != ',') {
            fprintf(stderr, "bench_moe: bad number list\n");
            exit(2);
        }
    }
}

int main(int argc, char **argv) {
    int64_t batches[16] = {1, 8, 32, 128, 1024};
    int nbatch = 5, iters = 20;
    int use_nv = 1, use_mx = 1;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--batches") && i + 1 < argc) parse_list(argv[++i], batches, &nbatch);
        else if (!strcmp(argv[i], "--iters") && i + 1 < argc) iters = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--formats") && i + 1 < argc) {
            const char *f = argv[++i];
            use_nv = strstr(f, "nvfp4") != NULL;
            use_mx = strstr(f, "mxfp4") != NULL;
        } else {
            fprintf(stderr, "usage: bench_moe [--formats nvfp4,mxfp4] [--batches 1,8,...] [--iters N]\n");
            return 2;
        }
    }
    if (iters < 1) iters = 1;
    nb_context *ctx = NULL, *hctx = NULL;
    if (nb_context_create(0, &ctx) != NB_OK) {
        fprintf(stderr, "bench_moe: no device (%s)\n", nb_last_error());
        return 77;
    }
    GT_NB(nb_context_create(NB_DEVICE_NONE, &hctx));
    cudaStream_t s;
    GT_CUDA(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
    cublasHandle_t cb;
    CB(cublasCreate(&cb));
    CB(cublasSetStream(cb, s));
    struct cudaDeviceProp prop;
    GT_CUDA(cudaGetDeviceProperties(&prop, 0));
    printf("bench_moe on %s; R = %d routings per graph, %d replays x 5\n", prop.name, R, iters);
    printf("%-14s %-6s %5s %10s %10s %8s %8s  %s\n", "layer", "format", "batch", "nibble_us", "bf16_us", "speedup",
           "GB/s", "config");
    for (size_t li = 0; li < sizeof k_layers / sizeof k_layers[0]; li++) {
        const layer *L = &k_layers[li];
        const int64_t H = L->H, I = L->I, E = L->E;
        /* BF16 baseline weights: [E, 2I, H] and [E, H, I] */
        void *bgu, *bdn;
        GT_CUDA(cudaMalloc(&bgu, (size_t)E * 2 * I * H * 2));
        GT_CUDA(cudaMalloc(&bdn, (size_t)E * H * I * 2));
        fill_bf16(bgu, (size_t)E * 2 * I * H);
        fill_bf16(bdn, (size_t)E * H * I);
        for (int fi = 0; fi < 2; fi++) {
            const nb_format fmt = fi == 0 ? NB_FORMAT_NVFP4 : NB_FORMAT_MXFP4;
            if ((fmt == NB_FORMAT_NVFP4 && !use_nv) || (fmt == NB_FORMAT_MXFP4 && !use_mx)) continue;
            /* one expert quantized on the host, packed, copied to E slots */
            nb_moe_desc d1, d;
            GT_NB(nb_moe_desc_init(&d1, fmt, 1, 1, 1, H, I, NB_MOE_ACT_SWIGLU, NB_DTYPE_BF16));
            nb_weight_sizes sgu, sdn;
            GT_NB(nb_weight_get_sizes(&d1.gate_up, &sgu));
            GT_NB(nb_weight_get_sizes(&d1.down, &sdn));
            float *w = malloc(sizeof(float) * (size_t)(2 * I * H));
            uint8_t *guc = malloc(sgu.codes_bytes), *gus = malloc(sgu.scales_bytes);
            uint8_t *dnc = malloc(sdn.codes_bytes), *dns = malloc(sdn.scales_bytes);
            for (int64_t i = 0; i < 2 * I * H; i++) w[i] = normal() * 0.02f;
            GT_NB(nb_quantize_host(hctx, &d1.gate_up, NB_DTYPE_F32, w, guc, gus));
            for (int64_t i = 0; i < H * I; i++) w[i] = normal() * 0.02f;
            GT_NB(nb_quantize_host(hctx, &d1.down, NB_DTYPE_F32, w, dnc, dns));
            free(w);
            const float ts_gu = d1.gate_up.tensor_scale, ts_dn = d1.down.tensor_scale;
            nb_moe_weights hw;
            memset(&hw, 0, sizeof hw);
            hw.gate_up.codes = guc;
            hw.gate_up.scales = gus;
            hw.down.codes = dnc;
            hw.down.scales = dns;
            nb_moe_packed_sizes ps1;
            GT_NB(nb_moe_packed_get_sizes(&d1, &ps1));
            uint8_t *pg = malloc(ps1.gate_up_bytes), *pd = malloc(ps1.down_bytes);
            GT_NB(nb_moe_pack_host(hctx, &d1, &hw, pg, ps1.gate_up_bytes, pd, ps1.down_bytes));
            free(guc), free(gus), free(dnc), free(dns);
            uint8_t *dgu, *ddn;
            GT_CUDA(cudaMalloc((void **)&dgu, ps1.gate_up_expert_bytes * (size_t)E));
            GT_CUDA(cudaMalloc((void **)&ddn, ps1.down_expert_bytes * (size_t)E));
            for (int64_t e = 0; e < E; e++) {
                GT_CUDA(cudaMemcpy(dgu + (size_t)e * ps1.gate_up_expert_bytes, pg, ps1.gate_up_expert_bytes,
                              cudaMemcpyHostToDevice));
                GT_CUDA(cudaMemcpy(ddn + (size_t)e * ps1.down_expert_bytes, pd, ps1.down_expert_bytes,
                              cudaMemcpyHostToDevice));
            }
            free(pg), free(pd);
            float *tsh = malloc(sizeof(float) * 2 * (size_t)E), *dts = NULL;
            for (int64_t e = 0; e < E; e++) tsh[e] = ts_gu, tsh[E + e] = ts_dn;
            if (fmt == NB_FORMAT_NVFP4) {
                GT_CUDA(cudaMalloc((void **)&dts, sizeof(float) * 2 * (size_t)E));
                GT_CUDA(cudaMemcpy(dts, tsh, sizeof(float) * 2 * (size_t)E, cudaMemcpyHostToDevice));
            }
            free(tsh);
            for (int bi = 0; bi < nbatch; bi++) {
                const int64_t m = batches[bi];
                GT_NB(nb_moe_desc_init(&d, fmt, m, L->E, L->K, H, I, NB_MOE_ACT_SWIGLU, NB_DTYPE_BF16));
                d.gate_up.layout = d.down.layout = NB_LAYOUT_PACKED;
                d.gate_up.scale_exp_min = d1.gate_up.scale_exp_min;
                d.gate_up.scale_exp_max = d1.gate_up.scale_exp_max;
                d.down.scale_exp_min = d1.down.scale_exp_min;
                d.down.scale_exp_max = d1.down.scale_exp_max;
                nb_moe_packed_weights pw;
                memset(&pw, 0, sizeof pw);
                pw.gate_up = dgu;
                pw.down = ddn;
                pw.gate_up_scales = dts;
                pw.down_scales = dts ? dts + E : NULL;
                size_t wsb;
                GT_NB(nb_moe_workspace_size(ctx, &d, &wsb));
                void *ws, *x, *y, *xg, *hg, *og;
                GT_CUDA(cudaMalloc(&ws, wsb));
                GT_CUDA(cudaMalloc(&x, (size_t)m * H * 2));
                GT_CUDA(cudaMalloc(&y, (size_t)m * H * 2));
                fill_bf16(x, (size_t)(m * H));
                /* the baseline's gathered inputs and outputs: m * K rows each */
                GT_CUDA(cudaMalloc(&xg, (size_t)m * L->K * H * 2));
                GT_CUDA(cudaMalloc(&hg, (size_t)m * L->K * 2 * I * 2));
                GT_CUDA(cudaMalloc(&og, (size_t)m * L->K * H * 2));
                fill_bf16(xg, (size_t)(m * L->K * H));
                fill_bf16(hg, (size_t)(m * L->K * 2 * I));
                int32_t *ids[R];
                float *tw[R];
                int32_t *hid = malloc(sizeof(int32_t) * (size_t)(m * L->K));
                float *htw = malloc(sizeof(float) * (size_t)(m * L->K));
                int64_t *cnt = malloc(sizeof(int64_t) * (size_t)E * R);
                double active_bytes = 0.0;
                for (int r = 0; r < R; r++) {
                    route(L, m, hid, htw);
                    GT_CUDA(cudaMalloc((void **)&ids[r], sizeof(int32_t) * (size_t)(m * L->K)));
                    GT_CUDA(cudaMalloc((void **)&tw[r], sizeof(float) * (size_t)(m * L->K)));
                    GT_CUDA(cudaMemcpy(ids[r], hid, sizeof(int32_t) * (size_t)(m * L->K), cudaMemcpyHostToDevice));
                    GT_CUDA(cudaMemcpy(tw[r], htw, sizeof(float) * (size_t)(m * L->K), cudaMemcpyHostToDevice));
                    for (int64_t e = 0; e < E; e++) cnt[r * E + e] = 0;
                    for (int64_t i = 0; i < m * L->K; i++) cnt[r * E + hid[i]]++;
                    for (int64_t e = 0; e < E; e++)
                        if (cnt[r * E + e]) active_bytes += (double)(ps1.gate_up_expert_bytes + ps1.down_expert_bytes);
                }
                active_bytes /= R;
                /* nibble: the whole MLP, R routings in one graph */
                cudaGraph_t g1, g2;
                cudaGraphExec_t e1, e2;
                GT_CUDA(cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal));
                for (int r = 0; r < R; r++) GT_NB(nb_moe_mlp(ctx, &d, x, &pw, ids[r], tw[r], y, ws, wsb, s));
                GT_CUDA(cudaStreamEndCapture(s, &g1));
                GT_CUDA(cudaGraphInstantiate(&e1, g1, 0));
                char cfg[256];
                nb_gemm_last_config(ctx, cfg, sizeof cfg);
                /* baseline: per active expert, gate_up then down (cuBLAS, column-major views of row-major data) */
                const float one = 1.0f, zero = 0.0f;
                GT_CUDA(cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal));
                for (int r = 0; r < R; r++) {
                    int64_t row = 0;
                    for (int64_t e = 0; e < E; e++) {
                        const int64_t c = cnt[r * E + e];
                        if (!c) continue;
                        /* gu[c, 2I] = xg[c, H] . Wgu[e]^T: column-major gu^T [2I, c] = Wgu[e] (as [H, 2I])^T . xg^T */
                        CB(cublasGemmEx(cb, CUBLAS_OP_T, CUBLAS_OP_N, (int)(2 * I), (int)c, (int)H, &one,
                                        (const uint16_t *)bgu + (size_t)e * 2 * I * H, CUDA_R_16BF, (int)H,
                                        (const uint16_t *)xg + (size_t)row * H, CUDA_R_16BF, (int)H, &zero,
                                        (uint16_t *)hg + (size_t)row * 2 * I, CUDA_R_16BF, (int)(2 * I),
                                        CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
                        CB(cublasGemmEx(cb, CUBLAS_OP_T, CUBLAS_OP_N, (int)H, (int)c, (int)I, &one,
                                        (const uint16_t *)bdn + (size_t)e * H * I, CUDA_R_16BF, (int)I,
                                        (const uint16_t *)hg + (size_t)row * 2 * I, CUDA_R_16BF, (int)(2 * I), &zero,
                                        (uint16_t *)og + (size_t)row * H, CUDA_R_16BF, (int)H, CUBLAS_COMPUTE_32F,
                                        CUBLAS_GEMM_DEFAULT));
                        row += c;
                    }
                }
                GT_CUDA(cudaStreamEndCapture(s, &g2));
                GT_CUDA(cudaGraphInstantiate(&e2, g2, 0));
                const float tn = time_graph(e1, s, iters), tb = time_graph(e2, s, iters);
                printf("%-14s %-6s %5lld %10.1f %10.1f %7.2fx %8.0f  %s\n", L->name,
                       fmt == NB_FORMAT_NVFP4 ? "nvfp4" : "mxfp4", (long long)m, tn, tb, tb / tn,
                       active_bytes / (tn * 1e-6) / 1e9, cfg);
                fflush(stdout);
                GT_CUDA(cudaGraphExecDestroy(e1));
                GT_CUDA(cudaGraphExecDestroy(e2));
                GT_CUDA(cudaGraphDestroy(g1));
                GT_CUDA(cudaGraphDestroy(g2));
                for (int r = 0; r < R; r++) cudaFree(ids[r]), cudaFree(tw[r]);
                free(hid), free(htw), free(cnt);
                cudaFree(ws), cudaFree(x), cudaFree(y), cudaFree(xg), cudaFree(hg), cudaFree(og);
            }
            cudaFree(dgu), cudaFree(ddn), cudaFree(dts);
        }
        cudaFree(bgu), cudaFree(bdn);
    }
    cublasDestroy(cb);
    cudaStreamDestroy(s);
    nb_context_destroy(ctx);
    nb_context_destroy(hctx);
    return 0;
}
