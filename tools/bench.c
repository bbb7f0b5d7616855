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
 * configuration's output is checked against the naive GPU reference.
 * --sequence adds, per format and m, one graph that calls every layer once
 * per pass in order (a model step: each kernel follows a different one),
 * for nibble and for cuBLAS. */
#include "nibble.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "nb_commit.h" /* NB_GIT_COMMIT, written at build time (cmake/commit.cmake) */

#include "benchlib.h"
#include "cli.h"

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
    printf("usage: nibble bench [--shapes KxN,...] [--m 1,2,...] [--formats nvfp4,mxfp4,...] [--dtype bf16|f16]\n"
           "                    [--csv FILE] [--json FILE] [--min-bytes MB] [--sustain S] [--tune-cache FILE]\n"
           "                    [--sequence [--between]]\n"
           "  Times Y[m,n] = X[m,k] . W[n,k]^T for each layer k -> n and each m, nibble's kernel vs\n"
           "  cuBLAS BF16 in the same run (CUDA graphs, weights rotated past L2, median of replays).\n"
           "  Prints us per call, GB/s (weights + scales + activations + output), fraction of\n"
           "  the measured copy bandwidth, TFLOP/s (2mnk), speedup over cuBLAS, and the\n"
           "  configuration nb_gemm ran.  m up to 16384.  --tune-cache loads a cache written by\n"
           "  `nibble tune` (nb_context_load_tuning), as NIBBLE_TUNE_CACHE would: configurations\n"
           "  it chose say \"tuned\".  --sequence also times the layers as one model step: a graph of\n"
           "  passes that call every layer once in --shapes order (as a forward pass runs them, each\n"
           "  kernel after a different one), per format and m, against cuBLAS BF16's same sequence, next\n"
           "  to the sum of the layers timed alone (printed, not in --csv / --json).  --between puts a small\n"
           "  cuBLAS kernel (an SSCAL of 4096 floats, launched as a framework's kernels are, without\n"
           "  programmatic dependent launch) after every layer in both sequences, as a model step's norms\n"
           "  and activations sit between its linears, and prints what those kernels take alone.\n"
           "  --sustain S replays each graph S seconds (0..60) without a pause before timing it: the\n"
           "  clocks a GPU holds under sustained work, lower where it reaches its power limit.\n"
           "  defaults: --shapes 8192x8192,8192x57344,28672x8192,4096x6144,4096x4096\n"
           "            --m 1,2,4,8,16,32 --formats nvfp4,mxfp4 --dtype bf16 --min-bytes 240\n"
           "  Exit: 0 measured, 1 usage, 2 a configuration's output was wrong, 3 no GPU, a library,\n"
           "  CUDA, cuBLAS or file error.\n");
}

/* Everything a run shares: options, context, cuBLAS, stream, output files. */
typedef struct bench {
    nbt_sweep sw;
    const char *csv, *json, *tune_cache;
    nb_context *ctx;
    nb_device_info info;
    cublasHandle_t blas;
    cudaStream_t s;
    void *blas_ws;
    double bw; /* device-to-device copy bandwidth, GB/s */
    char date[32];
    FILE *fc, *fj;
    int first; /* no JSON row written yet */
    int rc;    /* 2 once a configuration gave a wrong result */
    int sequence; /* --sequence */
    int between;  /* --between: a small cuBLAS kernel after every layer of the sequences */
    nbt_between after; /* that kernel (benchlib.h) */
} bench;

/* What one layer k -> n in one format needs for its rows: the activations
 * and outputs (shared by the layer's formats), nibble's rotated packed
 * weights and the reference output, cuBLAS's rotated BF16 copies. */
typedef struct bench_layer {
    int64_t k, n;
    void *dx, *dy, *dyb;
    float *dref, *href;
    uint16_t *hy;
    nbt_layer L;
    void **wb; /* rotated BF16 copies of the dequantized weights */
    int rot_b;
    void *dws;
    size_t ws;
    char fname[32]; /* the format's name */
} bench_layer;

/* Stage 1: the options: 0 to go on, -1 after --help, 1 on a usage error. */
static int bench_parse(bench *b, int argc, char **argv) {
    nba_opt o[NBT_SWEEP_OPTS + 5] = {
        {.name = "--csv", .kind = NBA_STRING, .dst = &b->csv},
        {.name = "--json", .kind = NBA_STRING, .dst = &b->json},
        {.name = "--tune-cache", .kind = NBA_STRING, .dst = &b->tune_cache},
        {.name = "--sequence", .kind = NBA_FLAG, .dst = &b->sequence},
        {.name = "--between", .kind = NBA_FLAG, .dst = &b->between},
    };
    nbt_sweep_opts(&b->sw, "--dtype", o + 5);
    const int rc = nba_parse("bench", argc, argv, o, sizeof o / sizeof o[0], NULL, help);
    if (rc) return rc;
    if (b->between && !b->sequence) {
        fprintf(stderr, "nibble bench: --between applies to --sequence only\n");
        return 1;
    }
    return nbt_sweep_parse(&b->sw, "bench") ? 0 : 1;
}

/* Stage 2: context (and tuning cache), cuBLAS with an explicit workspace on
 * a non-blocking stream, the copy bandwidth, the header lines and files. */
static int bench_setup(bench *b) {
    NB(nb_context_create(0, &b->ctx));
    NB(nb_context_device_info(b->ctx, &b->info));
    if (b->tune_cache) {
        NB(nb_context_load_tuning(b->ctx, b->tune_cache));
        size_t all, mine;
        NB(nb_context_tuning_count(b->ctx, &all, &mine));
        printf("nibble bench: tuning cache %s: %zu entries, %zu for this GPU\n", b->tune_cache, all, mine);
    }
    BL(cublasCreate(&b->blas));
    CK(cudaStreamCreateWithFlags(&b->s, cudaStreamNonBlocking));
    BL(cublasSetStream(b->blas, b->s));
    const size_t blas_ws_bytes = 64u << 20; /* explicit workspace: no allocation inside graph capture */
    CK(cudaMalloc(&b->blas_ws, blas_ws_bytes));
    BL(cublasSetWorkspace(b->blas, b->blas_ws, blas_ws_bytes));
    if (b->between) nbt_between_init(&b->after, b->s);

    b->bw = copy_bandwidth();
    time_t now = time(NULL);
    strftime(b->date, sizeof b->date, "%Y-%m-%dT%H:%M:%SZ", gmtime(&now));
    printf("nibble bench: %s (%d SMs, L2 %.0f MB), copy bandwidth %.0f GB/s, commit %s, %s\n", b->info.name,
           b->info.sm_count, b->info.l2_bytes / 1e6, b->bw, NB_GIT_COMMIT, b->date);
    const char *pdl = getenv("NIBBLE_PDL"); /* (nb_context_create has checked the value) */
    if (pdl && pdl[0])
        printf("nibble bench: NIBBLE_PDL=%s: nb_gemm %s programmatic dependent launch\n", pdl,
               !strcmp(pdl, "0")   ? "without"
               : !strcmp(pdl, "1") ? "with"
                                   : "with, in graphs only after its own launches,");
    printf("%-6s %-13s %5s %10s %10s %9s %7s %7s %8s  %s\n", "format", "layer k->n", "m", "nibble-us", "cublas-us", "GB/s",
           "%copy", "TFLOP/s", "speedup", "config");
    b->fc = b->csv ? fopen(b->csv, "w") : NULL;
    b->fj = b->json ? fopen(b->json, "w") : NULL;
    if ((b->csv && !b->fc) || (b->json && !b->fj)) {
        fprintf(stderr, "nibble bench: cannot open output file\n");
        return 3;
    }
    if (b->fc)
        fprintf(b->fc, "gpu,commit,date,format,dtype,k,n,m,nibble_us,cublas_us,gbps,copy_fraction,tflops,cublas_tflops,"
                       "speedup,config\n");
    if (b->fj)
        fprintf(b->fj, "{\"gpu\": \"%s\", \"commit\": \"%s\", \"date\": \"%s\", \"copy_gbps\": %.1f, \"results\": [",
                b->info.name, NB_GIT_COMMIT, b->date, b->bw);
    b->first = 1;
    return 0;
}

/* One cuBLAS BF16/FP16 GEMM of layer l on its BF16 copy w:
 * Y^T[n,m] = W[n,k] . X^T[k,m] in column-major terms. */
static void blas_gemm(bench *b, const bench_layer *l, int64_t m, const void *w) {
    const float one = 1.0f, zero = 0.0f;
    const int n = (int)l->n, k = (int)l->k;
    const cudaDataType dt = b->sw.act == NB_DTYPE_BF16 ? CUDA_R_16BF : CUDA_R_16F;
    BL(cublasGemmEx(b->blas, CUBLAS_OP_T, CUBLAS_OP_N, n, (int)m, k, &one, w, dt, k, l->dx, dt, k, &zero, l->dyb, dt, n,
                    CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
}

/* cuBLAS graph of `calls` GEMMs over the rotated copies; median us per call. */
static double bench_cublas(bench *b, const bench_layer *l, int64_t m, int calls) {
    blas_gemm(b, l, m, l->wb[0]);
    CK(cudaStreamBeginCapture(b->s, cudaStreamCaptureModeThreadLocal));
    for (int c = 0; c < calls; c++) blas_gemm(b, l, m, l->wb[c % l->rot_b]);
    return nbt_time_capture(b->s, calls, 9);
}

/* nb_gemm's output for m rows against the naive reference (all mmax rows
 * were computed): a wrong result is reported and sets rc = 2. */
static void bench_check(bench *b, bench_layer *l, const nb_gemm_desc *g, int64_t m) {
    const int64_t n = l->n;
    CK(cudaMemsetAsync(l->dy, 0xFF, 2 * (size_t)(m * n), b->s));
    NB(nb_gemm(b->ctx, g, l->dx, l->L.pk[0], NULL, l->dy, l->dws, l->ws, b->s));
    CK(cudaMemcpyAsync(l->hy, l->dy, 2 * (size_t)(m * n), cudaMemcpyDeviceToHost, b->s));
    CK(cudaStreamSynchronize(b->s));
    double e2 = 0, r2 = 0, emax = 0, rmax = 0;
    int64_t at = 0;
    for (int64_t i = 0; i < m * n; i++) {
        const float v = nbt_float_of(b->sw.act, l->hy[i]);
        const double e = fabs((double)v - l->href[i]);
        e2 += e * e;
        r2 += (double)l->href[i] * l->href[i];
        rmax = fabs(l->href[i]) > rmax ? fabs(l->href[i]) : rmax;
        if (!(e <= emax)) emax = e, at = i; /* (NaN sticks) */
    }
    double rel = sqrt(e2 / (r2 > 0 ? r2 : 1)), worst = emax / (rmax > 0 ? rmax : 1);
    /* the RMS error and the worst element against the largest output: the
     * tensor-core kernels round each weight to 16 bits (2^-9 relative in
     * BF16), far below either bound */
    if (!(rel < 1e-2) || !(worst < 1e-2)) {
        fprintf(stderr, "nibble bench: WRONG RESULT %s k=%lld n=%lld m=%lld: rel err %.3g, element %lld off by %.3g of "
                "the largest output\n", l->fname, (long long)l->k, (long long)n, (long long)m, rel, (long long)at, worst);
        b->rc = 2;
    }
}

/* Stage 4: one row - correctness first, then nibble's and cuBLAS's graphs;
 * the line, the CSV row and the JSON object, flushed as they are measured (a
 * run stopped part-way by a time limit keeps the rows it finished). */
static void bench_row(bench *b, bench_layer *l, int64_t m, double *us_nibble, double *us_cublas) {
    const int64_t k = l->k, n = l->n;
    const nb_dtype act = b->sw.act;
    nb_gemm_desc g;
    NB(nb_gemm_desc_init(&g, &l->L.packed, m, act, act));
    bench_check(b, l, &g, m);
    char cfg[256];
    NB(nb_gemm_last_config(b->ctx, cfg, sizeof cfg));
    /* nibble graph: about 20 ms of work, at least one pass over the copies */
    const nb_weight_sizes_v2 sz = l->L.sz;
    const int calls = nbt_graph_calls(m, n, k, sz.packed_bytes, l->L.rot, 20000.0, 4, 40);
    const double t_nb = nbt_time_gemm(b->ctx, &g, NULL, l->dx, &l->L, l->dy, l->dws, l->ws, b->s, calls, 9);
    const int calls_b = nbt_graph_calls(m, n, k, sz.packed_bytes, l->rot_b, 20000.0, 4, 40);
    const double t_bl = bench_cublas(b, l, m, calls_b);
    /* bytes: weights + scales (unpadded), activations read, output written */
    double bytes = (double)sz.codes_bytes + (double)sz.scales_bytes + (double)sz.zeros_bytes + 2.0 * m * k + 2.0 * m * n;
    double gbps = bytes / (t_nb * 1e-6) / 1e9;
    double tf = 2.0 * m * n * k / (t_nb * 1e-6) / 1e12, tf_b = 2.0 * m * n * k / (t_bl * 1e-6) / 1e12;
    const char *dname = act == NB_DTYPE_BF16 ? "bf16" : "f16";
    char layer[32];
    snprintf(layer, sizeof layer, "%lld->%lld", (long long)k, (long long)n);
    printf("%-6s %-13s %5lld %10.2f %10.2f %9.0f %6.1f%% %7.1f %7.2fx  %s\n", l->fname, layer, (long long)m, t_nb,
           t_bl, gbps, 100.0 * gbps / b->bw, tf, t_bl / t_nb, cfg);
    fflush(stdout);
    if (b->fc)
        fprintf(b->fc, "\"%s\",%s,%s,%s,%s,%lld,%lld,%lld,%.3f,%.3f,%.1f,%.4f,%.2f,%.2f,%.4f,\"%s\"\n", b->info.name,
                NB_GIT_COMMIT, b->date, l->fname, dname, (long long)k, (long long)n, (long long)m, t_nb, t_bl, gbps,
                gbps / b->bw, tf, tf_b, t_bl / t_nb, cfg);
    if (b->fj)
        fprintf(b->fj,
                "%s\n  {\"format\": \"%s\", \"dtype\": \"%s\", \"k\": %lld, \"n\": %lld, \"m\": %lld, "
                "\"nibble_us\": %.3f, \"cublas_us\": %.3f, \"gbps\": %.1f, \"copy_fraction\": %.4f, "
                "\"tflops\": %.2f, \"cublas_tflops\": %.2f, \"speedup\": %.4f, \"config\": \"%s\"}",
                b->first ? "" : ",", l->fname, dname, (long long)k, (long long)n, (long long)m, t_nb, t_bl, gbps,
                gbps / b->bw, tf, tf_b, t_bl / t_nb, cfg);
    b->first = 0;
    if (b->fc) fflush(b->fc);
    if (b->fj) fflush(b->fj);
    *us_nibble = t_nb;
    *us_cublas = t_bl;
}

/* Stage 3: one layer in one format - the packed copies, cuBLAS's BF16
 * copies of the dequantized weights, the reference output for all mmax
 * rows, the workspace (released by bench_release). */
static void bench_prepare(bench *b, bench_layer *l, nb_format fmt) {
    const int64_t k = l->k, n = l->n, mmax = b->sw.mmax;
    const nb_dtype act = b->sw.act;
    nb_format_info fi;
    NB(nb_format_get_info(fmt, &fi));
    snprintf(l->fname, sizeof l->fname, "%s", fi.name);
    nbt_layer_make(b->ctx, fmt, n, k, b->sw.min_mb, b->s, &l->L);
    const size_t wbytes_b = 2 * (size_t)(n * k);
    l->rot_b = (int)ceil(b->sw.min_mb * 1e6 / (double)wbytes_b);
    if (l->rot_b < 2) l->rot_b = 2;
    l->wb = nbt_calloc((size_t)l->rot_b, sizeof *l->wb);
    CK(cudaMalloc(&l->wb[0], wbytes_b));
    /* the integer and table formats have no device dequantizer or naive GPU
     * reference: the host dequantizes (exact or, for the tables, float32,
     * then rounded to act) and the reference is cuBLAS on those weights with
     * FP32 output (its weight rounding, at most 2^-8 relative, and the
     * table formats' own operand rounding are well inside the check's 1e-2) */
    const int host_ref = fi.element != NB_ELEMENT_E2M1;
    if (host_ref) {
        void *hw = nbt_calloc((size_t)(n * k), 2);
        const nb_weight_data hd = {.codes = l->L.hc, .scales = l->L.hs, .zeros = l->L.hz};
        NB(nb_dequantize_host_v2(b->ctx, &l->L.desc, &hd, act, hw));
        CK(cudaMemcpy(l->wb[0], hw, wbytes_b, cudaMemcpyHostToDevice));
        free(hw);
    } else {
        NB(nb_dequantize(b->ctx, &l->L.desc, l->L.dc, l->L.ds, act, l->wb[0], b->s));
    }
    for (int r = 1; r < l->rot_b; r++) {
        CK(cudaMalloc(&l->wb[r], wbytes_b));
        CK(cudaMemcpyAsync(l->wb[r], l->wb[0], wbytes_b, cudaMemcpyDeviceToDevice, b->s));
    }
    nb_gemm_desc rg, g;
    NB(nb_gemm_desc_init(&rg, &l->L.desc, mmax, act, act));
    if (host_ref) {
        const float one = 1.0f, zero = 0.0f;
        const cudaDataType dt = act == NB_DTYPE_BF16 ? CUDA_R_16BF : CUDA_R_16F;
        BL(cublasGemmEx(b->blas, CUBLAS_OP_T, CUBLAS_OP_N, (int)n, (int)mmax, (int)k, &one, l->wb[0], dt, (int)k, l->dx,
                        dt, (int)k, &zero, l->dref, CUDA_R_32F, (int)n, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
    } else {
        NB(nb_gemm_reference_device(b->ctx, &rg, l->dx, l->L.dc, l->L.ds, NULL, l->dref, b->s));
    }
    l->href = nbt_calloc((size_t)(mmax * n), 4);
    l->hy = nbt_calloc((size_t)(mmax * n), 2);
    CK(cudaMemcpyAsync(l->href, l->dref, 4 * (size_t)(mmax * n), cudaMemcpyDeviceToHost, b->s));
    CK(cudaStreamSynchronize(b->s));
    l->ws = 0;
    l->dws = NULL;
    NB(nb_gemm_desc_init(&g, &l->L.packed, mmax, act, act));
    NB(nb_gemm_workspace_size(b->ctx, &g, &l->ws));
    if (l->ws) {
        CK(cudaMalloc(&l->dws, l->ws));
        CK(cudaMemset(l->dws, 0, l->ws));
    }
}

static void bench_release(bench_layer *l) {
    nbt_layer_free(&l->L);
    for (int r = 0; r < l->rot_b; r++) CK(cudaFree(l->wb[r]));
    free(l->wb);
    free(l->href);
    free(l->hy);
    if (l->dws) CK(cudaFree(l->dws));
}

/* A layer k -> n's activations (shared by both libraries and the layer's
 * formats, random, BF16/FP16) and output buffers. */
static void shape_alloc(bench *b, bench_layer *l, int64_t k, int64_t n) {
    const int64_t mmax = b->sw.mmax;
    memset(l, 0, sizeof *l);
    l->k = k;
    l->n = n;
    l->dx = nbt_device_activations(b->sw.act, (size_t)(mmax * k));
    CK(cudaMalloc(&l->dy, 2 * (size_t)(mmax * n)));
    CK(cudaMalloc(&l->dyb, 2 * (size_t)(mmax * n)));
    CK(cudaMalloc((void **)&l->dref, 4 * (size_t)(mmax * n)));
}

static void shape_free(bench_layer *l) {
    CK(cudaFree(l->dx));
    CK(cudaFree(l->dy));
    CK(cudaFree(l->dyb));
    CK(cudaFree(l->dref));
}

/* One layer k -> n: every format, every m. */
static void bench_shape(bench *b, int64_t k, int64_t n) {
    bench_layer l;
    shape_alloc(b, &l, k, n);
    for (int fi = 0; fi < b->sw.nf; fi++) {
        bench_prepare(b, &l, b->sw.fmts[fi]);
        for (int mi = 0; mi < b->sw.nm; mi++) {
            double t_nb, t_bl;
            bench_row(b, &l, b->sw.ms[mi], &t_nb, &t_bl);
        }
        bench_release(&l);
    }
    shape_free(&l);
}

/* --between: the small kernel after each layer (benchlib.h, nbt_between). */
static void between_kernel(bench *b) {
    if (b->between) nbt_between_kernel(&b->after);
}

/* --sequence, one format and m: graphs of `passes` passes, each calling
 * every layer once in order (pass p on copy p of each layer's rotation, so
 * a layer is read cold), nibble's and cuBLAS's; us per pass, printed next
 * to the sums of the layers' rows (sum_nb, sum_bl).  With --between each
 * call is followed by between_kernel, and a third graph times those kernels
 * alone. */
static void bench_seq_row(bench *b, bench_layer *ls, int nl, int64_t m, double sum_nb, double sum_bl) {
    const nb_dtype act = b->sw.act;
    nb_gemm_desc *g = nbt_calloc((size_t)nl, sizeof *g);
    for (int i = 0; i < nl; i++) NB(nb_gemm_desc_init(&g[i], &ls[i].L.packed, m, act, act));
    /* about 20 ms of cuBLAS work per graph, 2 to 200 passes */
    int passes = (int)ceil(20000.0 / (sum_bl > 1.0 ? sum_bl : 1.0));
    passes = passes < 2 ? 2 : passes > 200 ? 200 : passes;
    CK(cudaStreamBeginCapture(b->s, cudaStreamCaptureModeThreadLocal));
    for (int p = 0; p < passes; p++)
        for (int i = 0; i < nl; i++) {
            NB(nb_gemm(b->ctx, &g[i], ls[i].dx, ls[i].L.pk[p % ls[i].L.rot], NULL, ls[i].dy, ls[i].dws, ls[i].ws,
                       b->s));
            between_kernel(b);
        }
    const double t_nb = nbt_time_capture(b->s, passes, 9);
    CK(cudaStreamBeginCapture(b->s, cudaStreamCaptureModeThreadLocal));
    for (int p = 0; p < passes; p++)
        for (int i = 0; i < nl; i++) {
            blas_gemm(b, &ls[i], m, ls[i].wb[p % ls[i].rot_b]);
            between_kernel(b);
        }
    const double t_bl = nbt_time_capture(b->s, passes, 9);
    double t_between = 0.0;
    if (b->between) {
        CK(cudaStreamBeginCapture(b->s, cudaStreamCaptureModeThreadLocal));
        for (int p = 0; p < passes * nl; p++) between_kernel(b);
        t_between = nbt_time_capture(b->s, passes, 9);
    }
    printf("sequence %s m=%lld, %d layers: nibble %.2f us per pass (layers alone %.2f), cuBLAS %.2f (%.2f), "
           "speedup %.2fx (alone %.2fx)", ls[0].fname, (long long)m, nl, t_nb, sum_nb, t_bl, sum_bl, t_bl / t_nb,
           sum_bl / sum_nb);
    if (b->between) printf("; with a cuBLAS kernel after each layer (those kernels alone %.2f us per pass)", t_between);
    printf("\n");
    fflush(stdout);
    free(g);
}

/* --sequence: per format, every layer prepared at once; per m, each layer's
 * row (checked and timed alone), then the sequence. */
static void bench_sequence(bench *b) {
    const int nl = b->sw.nkn / 2;
    bench_layer *ls = nbt_calloc((size_t)nl, sizeof *ls);
    for (int fi = 0; fi < b->sw.nf; fi++) {
        for (int i = 0; i < nl; i++) {
            shape_alloc(b, &ls[i], b->sw.kn[2 * i], b->sw.kn[2 * i + 1]);
            bench_prepare(b, &ls[i], b->sw.fmts[fi]);
        }
        for (int mi = 0; mi < b->sw.nm; mi++) {
            double sum_nb = 0.0, sum_bl = 0.0;
            for (int i = 0; i < nl; i++) {
                double t_nb, t_bl;
                bench_row(b, &ls[i], b->sw.ms[mi], &t_nb, &t_bl);
                sum_nb += t_nb;
                sum_bl += t_bl;
            }
            bench_seq_row(b, ls, nl, b->sw.ms[mi], sum_nb, sum_bl);
        }
        for (int i = 0; i < nl; i++) {
            bench_release(&ls[i]);
            shape_free(&ls[i]);
        }
    }
    free(ls);
}

int nb_cli_bench(int argc, char **argv) {
    nbt_tool = "nibble bench";
    /* weights rotated over at least 240 MB: 4x the H200's 60 MB L2 */
    bench b = {.sw = {.shapes = "8192x8192,8192x57344,28672x8192,4096x6144,4096x4096", .m = "1,2,4,8,16,32",
                      .formats = "nvfp4,mxfp4", .act_name = "bf16", .min_mb = 240}};
    int rc = bench_parse(&b, argc, argv);
    if (rc) return rc < 0 ? 0 : rc;
    if (!nbt_have_device()) return 3;
    if ((rc = bench_setup(&b)) != 0) return rc;
    if (b.sequence) bench_sequence(&b);
    else
        for (int si = 0; si < b.sw.nkn; si += 2) bench_shape(&b, b.sw.kn[si], b.sw.kn[si + 1]);
    if (b.fc && fclose(b.fc)) fprintf(stderr, "nibble bench: writing %s failed\n", b.csv), b.rc = 3;
    if (b.fj) {
        fprintf(b.fj, "\n]}\n");
        if (fclose(b.fj)) fprintf(stderr, "nibble bench: writing %s failed\n", b.json), b.rc = 3;
    }
    BL(cublasDestroy(b.blas));
    CK(cudaFree(b.blas_ws));
    if (b.between) nbt_between_free(&b.after);
    CK(cudaStreamDestroy(b.s));
    NB(nb_context_destroy(b.ctx));
    return b.rc;
}
