/* bench.c - `nibble bench`: nibble's GEMM (decode and tensor-core paths, as
 * nb_gemm dispatches them) against cuBLAS BF16, same inputs, same run.
 *
 * Method: weights rotated over enough packed copies to exceed L2 several
 * times (each call reads a cold copy, as in a real model where every layer's
 * weights are read once per token); every timed region is a CUDA graph of
 * many back-to-back calls replayed after a warm-up replay; CUDA events; the
 * median of several replays.  The same is done for cuBLAS BF16
 * (cublasGemmEx, BF16 in/out, FP32 compute) on rotated BF16 copies of the
 * same dequantized weights.  Copy bandwidth is measured in the same process
 * (device-to-device cudaMemcpy, bytes read + written).  Before timing, each
 * configuration's output is checked against the naive GPU reference. */
#include "nibble.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#ifndef NB_GIT_COMMIT
#define NB_GIT_COMMIT "unknown"
#endif

#include "benchlib.h"

#include <cublas_v2.h>

#define BL(call)                                                                                   \
    do {                                                                                           \
        cublasStatus_t s_ = (call);                                                                \
        if (s_ != CUBLAS_STATUS_SUCCESS) {                                                         \
            fprintf(stderr, "nibble bench: %s failed: cuBLAS status %d\n", #call, (int)s_);        \
            exit(3);                                                                               \
        }                                                                                          \
    } while (0)

static double copy_bandwidth(void) {
    const size_t bytes = (size_t)1 << 30;
    void *a, *b;
    CK(cudaMalloc(&a, bytes));
    CK(cudaMalloc(&b, bytes));
    CK(cudaMemset(a, 1, bytes));
    cudaEvent_t e0, e1;
    CK(cudaEventCreate(&e0));
    CK(cudaEventCreate(&e1));
    CK(cudaMemcpy(b, a, bytes, cudaMemcpyDeviceToDevice));
    float best = 1e30f;
    for (int r = 0; r < 5; r++) {
        float ms;
        CK(cudaEventRecord(e0, NULL));
        CK(cudaMemcpy(b, a, bytes, cudaMemcpyDeviceToDevice));
        CK(cudaEventRecord(e1, NULL));
        CK(cudaEventSynchronize(e1));
        CK(cudaEventElapsedTime(&ms, e0, e1));
        if (ms < best) best = ms;
    }
    CK(cudaFree(a));
    CK(cudaFree(b));
    CK(cudaEventDestroy(e0));
    CK(cudaEventDestroy(e1));
    return 2.0 * (double)bytes / (best * 1e-3) / 1e9; /* read + write */
}

static void help(void) {
    printf("usage: nibble bench [--shapes KxN,...] [--m 1,2,...] [--formats nvfp4,mxfp4] [--dtype bf16|f16]\n"
           "                    [--csv FILE] [--json FILE] [--min-bytes MB] [--tune-cache FILE]\n"
           "  Times Y[m,n] = X[m,k] . W[n,k]^T for each layer k -> n and each m, nibble's kernel vs\n"
           "  cuBLAS BF16 in the same run (CUDA graphs, weights rotated past L2, median of replays).\n"
           "  Prints us per call, GB/s (weights + scales + activations + output), fraction of\n"
           "  the measured copy bandwidth, TFLOP/s (2mnk), speedup over cuBLAS, and the\n"
           "  configuration nb_gemm ran.  m up to 16384.  --tune-cache loads a cache written by\n"
           "  `nibble tune` (nb_context_load_tuning), as NIBBLE_TUNE_CACHE would: configurations\n"
           "  it chose say \"tuned\".\n"
           "  defaults: --shapes 8192x8192,8192x57344,28672x8192,4096x6144,4096x4096\n"
           "            --m 1,2,4,8,16,32 --formats nvfp4,mxfp4 --dtype bf16 --min-bytes 240\n");
}

int nb_cli_bench(int argc, char **argv) {
    nbt_tool = "nibble bench";
    /* weights rotated over at least 240 MB: 4x the H200's 60 MB L2 */
    nbt_sweep sw = {.shapes = "8192x8192,8192x57344,28672x8192,4096x6144,4096x4096", .m = "1,2,4,8,16,32",
                    .formats = "nvfp4,mxfp4", .act = NB_DTYPE_BF16, .min_mb = 240};
    const char *csv = NULL, *json = NULL, *tune_cache = NULL;
    for (int i = 1; i < argc; i++) {
        const int taken = nbt_sweep_arg(&sw, "--dtype", argc, argv, &i);
        if (taken < 0) return 1;
        if (taken) continue;
        if (!strcmp(argv[i], "--help") || !strcmp(argv[i], "-h")) {
            help();
            return 0;
        } else if (i + 1 < argc && !strcmp(argv[i], "--csv")) csv = argv[++i];
        else if (i + 1 < argc && !strcmp(argv[i], "--json")) json = argv[++i];
        else if (i + 1 < argc && !strcmp(argv[i], "--tune-cache")) tune_cache = argv[++i];
        else {
            fprintf(stderr, "nibble bench: unknown option '%s' (see --help)\n", argv[i]);
            return 1;
        }
    }
    if (!nbt_sweep_parse(&sw)) return 1;
    if (!nbt_have_device()) return 3;
    const nb_dtype act = sw.act;
    const int nm = sw.nm, nkn = sw.nkn, nf = sw.nf;
    const int64_t *ms = sw.ms, *kn = sw.kn, mmax = sw.mmax;
    const nb_format *fmts = sw.fmts;
    const double min_mb = sw.min_mb;
    nb_context *ctx;
    NB(nb_context_create(0, &ctx));
    nb_device_info info;
    NB(nb_context_device_info(ctx, &info));
    if (tune_cache) {
        NB(nb_context_load_tuning(ctx, tune_cache));
        size_t all, mine;
        NB(nb_context_tuning_count(ctx, &all, &mine));
        printf("nibble bench: tuning cache %s: %zu entries, %zu for this GPU\n", tune_cache, all, mine);
    }
    cublasHandle_t blas;
    BL(cublasCreate(&blas));
    cudaStream_t s;
    CK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
    BL(cublasSetStream(blas, s));
    void *blas_ws;
    const size_t blas_ws_bytes = 64u << 20; /* explicit workspace: no allocation inside graph capture */
    CK(cudaMalloc(&blas_ws, blas_ws_bytes));
    BL(cublasSetWorkspace(blas, blas_ws, blas_ws_bytes));

    double bw = copy_bandwidth();
    time_t now = time(NULL);
    char date[32];
    strftime(date, sizeof date, "%Y-%m-%dT%H:%M:%SZ", gmtime(&now));
    printf("nibble bench: %s (%d SMs, L2 %.0f MB), copy bandwidth %.0f GB/s, commit %s, %s\n", info.name, info.sm_count,
           info.l2_bytes / 1e6, bw, NB_GIT_COMMIT, date);
    printf("%-6s %-13s %5s %10s %10s %9s %7s %7s %8s  %s\n", "format", "layer k->n", "m", "nibble-us", "cublas-us", "GB/s",
           "%copy", "TFLOP/s", "speedup", "config");
    FILE *fc = csv ? fopen(csv, "w") : NULL, *fj = json ? fopen(json, "w") : NULL;
    if ((csv && !fc) || (json && !fj)) {
        fprintf(stderr, "nibble bench: cannot open output file\n");
        return 3;
    }
    if (fc) fprintf(fc, "gpu,commit,date,format,dtype,k,n,m,nibble_us,cublas_us,gbps,copy_fraction,tflops,cublas_tflops,speedup,config\n");
    if (fj) fprintf(fj, "{\"gpu\": \"%s\", \"commit\": \"%s\", \"date\": \"%s\", \"copy_gbps\": %.1f, \"results\": [",
                    info.name, NB_GIT_COMMIT, date, bw);
    int first = 1, rc = 0;

    for (int si = 0; si < nkn; si += 2) {
        const int64_t k = kn[si], n = kn[si + 1];
        /* activations (shared by both libraries), random, BF16/FP16 */
        uint16_t *hx = nbt_random_activations(act, (size_t)(mmax * k));
        void *dx, *dy, *dyb;
        float *dref;
        CK(cudaMalloc(&dx, 2 * (size_t)(mmax * k)));
        CK(cudaMalloc(&dy, 2 * (size_t)(mmax * n)));
        CK(cudaMalloc(&dyb, 2 * (size_t)(mmax * n)));
        CK(cudaMalloc((void **)&dref, 4 * (size_t)(mmax * n)));
        CK(cudaMemcpy(dx, hx, 2 * (size_t)(mmax * k), cudaMemcpyHostToDevice));
        for (int fi = 0; fi < nf; fi++) {
            nbt_layer L;
            nbt_layer_make(ctx, fmts[fi], n, k, min_mb, s, &L);
            const nb_weight_desc d = L.desc, pd = L.packed;
            const nb_weight_sizes sz = L.sz;
            const int rot = L.rot;
            /* rotated BF16 copies of the dequantized weights for cuBLAS */
            const size_t wbytes_b = 2 * (size_t)(n * k);
            int rot_b = (int)ceil(min_mb * 1e6 / (double)wbytes_b);
            if (rot_b < 2) rot_b = 2;
            void **wb = calloc((size_t)rot_b, sizeof *wb);
            CK(cudaMalloc(&wb[0], wbytes_b));
            NB(nb_dequantize(ctx, &d, L.dc, L.ds, act, wb[0], s));
            for (int r = 1; r < rot_b; r++) {
                CK(cudaMalloc(&wb[r], wbytes_b));
                CK(cudaMemcpyAsync(wb[r], wb[0], wbytes_b, cudaMemcpyDeviceToDevice, s));
            }
            /* reference output for correctness (all mmax rows) */
            nb_gemm_desc rg;
            NB(nb_gemm_desc_init(&rg, &d, mmax, act, act));
            NB(nb_gemm_reference_device(ctx, &rg, dx, L.dc, L.ds, NULL, dref, s));
            float *href = malloc(4 * (size_t)(mmax * n));
            uint16_t *hy = malloc(2 * (size_t)(mmax * n));
            CK(cudaMemcpyAsync(href, dref, 4 * (size_t)(mmax * n), cudaMemcpyDeviceToHost, s));
            CK(cudaStreamSynchronize(s));
            size_t ws = 0;
            void *dws = NULL;
            nb_gemm_desc g;
            NB(nb_gemm_desc_init(&g, &pd, mmax, act, act));
            NB(nb_gemm_workspace_size(ctx, &g, &ws));
            if (ws) {
                CK(cudaMalloc(&dws, ws));
                CK(cudaMemset(dws, 0, ws));
            }
            for (int mi = 0; mi < nm; mi++) {
                const int64_t m = ms[mi];
                NB(nb_gemm_desc_init(&g, &pd, m, act, act));
                /* correctness first */
                CK(cudaMemsetAsync(dy, 0xFF, 2 * (size_t)(m * n), s));
                NB(nb_gemm(ctx, &g, dx, L.pk[0], NULL, dy, dws, ws, s));
                CK(cudaMemcpyAsync(hy, dy, 2 * (size_t)(m * n), cudaMemcpyDeviceToHost, s));
                CK(cudaStreamSynchronize(s));
                double e2 = 0, r2 = 0;
                for (int64_t i = 0; i < m * n; i++) {
                    const float v = nbt_float_of(act, hy[i]);
                    e2 += ((double)v - href[i]) * ((double)v - href[i]);
                    r2 += (double)href[i] * href[i];
                }
                double rel = sqrt(e2 / (r2 > 0 ? r2 : 1));
                if (!(rel < 1e-2)) {
                    fprintf(stderr, "nibble bench: WRONG RESULT %s k=%lld n=%lld m=%lld: rel err %.3g\n",
                            fmts[fi] == NB_FORMAT_NVFP4 ? "nvfp4" : "mxfp4", (long long)k, (long long)n, (long long)m, rel);
                    rc = 2;
                }
                char cfg[256];
                NB(nb_gemm_last_config(ctx, cfg, sizeof cfg));
                /* nibble graph: about 20 ms of work, at least one pass over the copies */
                const int calls = nbt_graph_calls(m, n, k, sz.packed_bytes, rot, 20000.0, 4, 40);
                const double t_nb = nbt_time_gemm(ctx, &g, dx, &L, dy, dws, ws, s, calls, 9);
                /* cuBLAS graph: Y^T[n,m] = W[n,k] . X^T[k,m] in column-major terms */
                const int calls_b = nbt_graph_calls(m, n, k, sz.packed_bytes, rot_b, 20000.0, 4, 40);
                cudaGraph_t gr;
                cudaGraphExec_t ex;
                float one = 1.0f, zero = 0.0f;
                cudaDataType dt = act == NB_DTYPE_BF16 ? CUDA_R_16BF : CUDA_R_16F;
                BL(cublasGemmEx(blas, CUBLAS_OP_T, CUBLAS_OP_N, (int)n, (int)m, (int)k, &one, wb[0], dt, (int)k, dx, dt,
                                (int)k, &zero, dyb, dt, (int)n, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
                CK(cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal));
                for (int c = 0; c < calls_b; c++)
                    BL(cublasGemmEx(blas, CUBLAS_OP_T, CUBLAS_OP_N, (int)n, (int)m, (int)k, &one, wb[c % rot_b], dt, (int)k,
                                    dx, dt, (int)k, &zero, dyb, dt, (int)n, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
                CK(cudaStreamEndCapture(s, &gr));
                CK(cudaGraphInstantiate(&ex, gr, 0));
                double t_bl = nbt_time_graph(ex, s, calls_b, 9);
                CK(cudaGraphExecDestroy(ex));
                CK(cudaGraphDestroy(gr));
                /* bytes: weights + scales (unpadded), activations read, output written */
                double bytes = (double)sz.codes_bytes + (double)sz.scales_bytes + 2.0 * m * k + 2.0 * m * n;
                double gbps = bytes / (t_nb * 1e-6) / 1e9;
                double tf = 2.0 * m * n * k / (t_nb * 1e-6) / 1e12, tf_b = 2.0 * m * n * k / (t_bl * 1e-6) / 1e12;
                const char *fname = fmts[fi] == NB_FORMAT_NVFP4 ? "nvfp4" : "mxfp4";
                char layer[32];
                snprintf(layer, sizeof layer, "%lld->%lld", (long long)k, (long long)n);
                printf("%-6s %-13s %5lld %10.2f %10.2f %9.0f %6.1f%% %7.1f %7.2fx  %s\n", fname, layer, (long long)m, t_nb,
                       t_bl, gbps, 100.0 * gbps / bw, tf, t_bl / t_nb, cfg);
                fflush(stdout);
                if (fc)
                    fprintf(fc, "\"%s\",%s,%s,%s,%s,%lld,%lld,%lld,%.3f,%.3f,%.1f,%.4f,%.2f,%.2f,%.4f,\"%s\"\n", info.name,
                            NB_GIT_COMMIT, date, fname, act == NB_DTYPE_BF16 ? "bf16" : "f16", (long long)k, (long long)n,
                            (long long)m, t_nb, t_bl, gbps, gbps / bw, tf, tf_b, t_bl / t_nb, cfg);
                if (fj)
                    fprintf(fj,
                            "%s\n  {\"format\": \"%s\", \"dtype\": \"%s\", \"k\": %lld, \"n\": %lld, \"m\": %lld, "
                            "\"nibble_us\": %.3f, \"cublas_us\": %.3f, \"gbps\": %.1f, \"copy_fraction\": %.4f, "
                            "\"tflops\": %.2f, \"cublas_tflops\": %.2f, \"speedup\": %.4f, \"config\": \"%s\"}",
                            first ? "" : ",", fname, act == NB_DTYPE_BF16 ? "bf16" : "f16", (long long)k, (long long)n,
                            (long long)m, t_nb, t_bl, gbps, gbps / bw, tf, tf_b, t_bl / t_nb, cfg);
                first = 0;
                /* each row reaches the files as it is measured: a run stopped
                 * part-way (a time limit) keeps the rows it finished */
                if (fc) fflush(fc);
                if (fj) fflush(fj);
            }
            nbt_layer_free(&L);
            for (int r = 0; r < rot_b; r++) CK(cudaFree(wb[r]));
            free(wb);
            free(href);
            free(hy);
            if (dws) CK(cudaFree(dws));
        }
        free(hx);
        CK(cudaFree(dx));
        CK(cudaFree(dy));
        CK(cudaFree(dyb));
        CK(cudaFree(dref));
    }
    if (fc) fclose(fc);
    if (fj) {
        fprintf(fj, "\n]}\n");
        fclose(fj);
    }
    cublasDestroy(blas);
    CK(cudaFree(blas_ws));
    CK(cudaStreamDestroy(s));
    nb_context_destroy(ctx);
    return rc;
}
