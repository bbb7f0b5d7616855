/* nibble - command-line tool over the public API.
 *
 *   nibble version | info | demo | bench | tune | inspect | quantize | convert   (each takes --help)
 *
 * Exit codes: 0 success, 1 usage error, 2 a check failed (wrong numbers),
 * 3 a library call failed.  This file holds main, version, info and demo;
 * cli.h lists where the other commands live. */
#define _POSIX_C_SOURCE 200809L
#include "args.h"
#include "cli.h"
#include "nb_commit.h" /* NB_GIT_COMMIT, written at build time (cmake/commit.cmake) */
#include "nibble.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#ifdef NB_HAVE_CUDA
#include <cuda_runtime.h>
#endif

#if !defined(NB_HAVE_CUDA) || !defined(NB_HAVE_IO)
/* A command this build lacks: its --help says what it needs; anything else
 * prints why it is unavailable and exits 3. */
static int cmd_unavailable(const char *cmd, const char *needs, const char *why, int argc, char **argv) {
    for (int i = 1; i < argc; i++)
        if (!strcmp(argv[i], "--help") || !strcmp(argv[i], "-h")) {
            printf("usage: nibble %s [options]  (needs %s)\n"
                   "  Exit: 3 in this build (the command is unavailable).\n", cmd, needs);
            return 0;
        }
    fprintf(stderr, "nibble %s: %s\n", cmd, why);
    return 3;
}
#endif

#ifndef NB_HAVE_CUDA
/* `nibble bench` and `nibble tune` in a build without the CUDA kernels. */
static int cmd_needs_cuda(const char *cmd, int argc, char **argv) {
    char why[160];
    snprintf(why, sizeof why, "this build has no CUDA kernels (%s)", nb_status_string(NB_ERR_NO_DEVICE));
    return cmd_unavailable(cmd, "a CUDA build and a GPU", why, argc, argv);
}
int nb_cli_bench(int argc, char **argv) { return cmd_needs_cuda("bench", argc, argv); }
int nb_cli_tune(int argc, char **argv) { return cmd_needs_cuda("tune", argc, argv); }
#endif

#ifndef NB_HAVE_IO
/* The checkpoint commands in a build without the checkpoint API (no cJSON). */
static int cmd_needs_io(const char *cmd, int argc, char **argv) {
    return cmd_unavailable(cmd, "libnibble's checkpoint API, built with cJSON",
                           "unavailable: this libnibble was built without the checkpoint API (nibble_io.h needs "
                           "cJSON: install libcjson-dev and rebuild)", argc, argv);
}
int nb_cli_inspect(int argc, char **argv) { return cmd_needs_io("inspect", argc, argv); }
int nb_cli_quantize(int argc, char **argv) { return cmd_needs_io("quantize", argc, argv); }
int nb_cli_convert(int argc, char **argv) { return cmd_needs_io("convert", argc, argv); }
#endif

double nb_cli_now(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec + t.tv_nsec * 1e-9;
}

/* A nibble call in a function that returns an exit code. */
#define TRY(call)                                                                                  \
    do {                                                                                           \
        nb_status s_ = (call);                                                                     \
        if (s_ != NB_OK) {                                                                         \
            fprintf(stderr, "error: %s: %s\n", nb_status_name(s_), nb_last_error());               \
            return 3;                                                                              \
        }                                                                                          \
    } while (0)

static void usage(FILE *f) {
    fprintf(f, "usage: nibble <command> [options]   (options: --name value or --name=value, each once)\n\n"
               "commands:\n"
               "  version   print the library version\n"
               "  info      build configuration (formats, CUDA architectures) and devices found\n"
               "  demo      quantize a built-in Llama-shaped layer to NVFP4 and MXFP4, run the GEMM\n"
               "            (GPU when present, C reference otherwise), print errors and time\n"
               "  bench     time the decode GEMM against cuBLAS BF16 (GPU only)\n"
               "  tune      measure every kernel configuration per layer and m, write the fastest to a\n"
               "            tuning cache that nb_gemm follows (GPU only)\n"
               "  inspect   list a safetensors checkpoint's files, tensors and linear layers with\n"
               "            their detected 4-bit format (ModelOpt, compressed-tensors, Quark, gpt-oss),\n"
               "            or a GGUF file's metadata and tensors (MXFP4, NVFP4 found)\n"
               "  quantize  write a BF16/F16/F32 checkpoint as a ModelOpt NVFP4 or Quark MXFP4 checkpoint\n"
               "  convert   rewrite a 4-bit checkpoint in another layout (ModelOpt, compressed-tensors,\n"
               "            Quark), codes and block scales unchanged\n\n"
               "'nibble <command> --help' describes each command.\n"
               "Exit codes: 0 success, 1 usage error, 2 a check failed (wrong numbers; convert --strict),\n"
               "3 a library, CUDA or file call failed.\n");
}

static void version_help(void) {
    printf("usage: nibble version\n"
           "  Print the library version and the commit this tool was built from (and warn if the\n"
           "  library's version differs from the header's).\n"
           "  Exit: 0 printed, 1 usage, 2 the header and library versions differ.\n");
}

static void info_help(void) {
    printf("usage: nibble info\n"
           "  Print the build configuration and every CUDA device found.\n"
           "  Exit: 0 printed, 1 usage, 3 a library call failed.\n");
}

static int cmd_version(int argc, char **argv) {
    const int rc = nba_parse("version", argc, argv, NULL, 0, NULL, version_help);
    if (rc) return rc < 0 ? 0 : rc;
    printf("nibble %s (commit %s)\n", nb_version_string(), NB_GIT_COMMIT);
    if (nb_version() != NB_VERSION) {
        fprintf(stderr, "warning: header version %d, library version %d\n", NB_VERSION, nb_version());
        return 2;
    }
    return 0;
}

static int cmd_info(int argc, char **argv) {
    const int rc = nba_parse("info", argc, argv, NULL, 0, NULL, info_help);
    if (rc) return rc < 0 ? 0 : rc;
    nb_build_info b;
    TRY(nb_get_build_info(&b));
    printf("nibble %s\n", b.version);
    printf("formats:            %s\n", b.formats);
    printf("CUDA kernels:       %s\n", b.cuda ? "yes" : "no (CPU-only build: the C reference runs everything)");
    if (b.cuda) printf("CUDA architectures: %s\n", b.cuda_archs);
    int count = 0;
    TRY(nb_device_count(&count));
    printf("devices:            %d\n", count);
    for (int d = 0; d < count; d++) {
        nb_context *ctx = NULL;
        nb_device_info i;
        if (nb_context_create(d, &ctx) != NB_OK || nb_context_device_info(ctx, &i) != NB_OK) {
            printf("  [%d] unavailable: %s\n", d, nb_last_error());
            nb_context_destroy(ctx); /* NULL accepted */
            continue;
        }
        printf("  [%d] %s  sm_%d%d  %d SMs  L2 %.0f MB  %.1f GB  smem/block %zu KB\n", d, i.name, i.cc_major, i.cc_minor,
               i.sm_count, i.l2_bytes / 1e6, i.global_mem_bytes / 1e9, i.smem_per_block_optin / 1024);
        TRY(nb_context_destroy(ctx));
    }
    return 0;
}

/* ------------------------------------------------------------------ demo */

static uint64_t demo_rng = 0x2545F4914F6CDD1Dull;
static double demo_gauss(void) {
    /* Box-Muller over a xorshift: deterministic on every machine */
    double u[2];
    for (int i = 0; i < 2; i++) {
        demo_rng ^= demo_rng << 13;
        demo_rng ^= demo_rng >> 7;
        demo_rng ^= demo_rng << 17;
        u[i] = ((demo_rng >> 11) + 0.5) / 9007199254740992.0;
    }
    return sqrt(-2.0 * log(u[0])) * cos(6.283185307179586 * u[1]);
}

static uint16_t f32_to_bf16(float v) {
    uint32_t u;
    memcpy(&u, &v, 4);
    return (uint16_t)((u + 0x7FFFu + ((u >> 16) & 1u)) >> 16);
}
static float bf16_to_f32(uint16_t h) {
    uint32_t u = (uint32_t)h << 16;
    float f;
    memcpy(&f, &u, 4);
    return f;
}

/* What every format's row of the demo shares. */
typedef struct demo {
    int64_t k, n, m;
    int gpu;
    nb_context *ctx;
    float *w;    /* the layer, n x k */
    uint16_t *x; /* activations, m x k, BF16 */
    double *yt;  /* X . W^T in float64 with the original weights */
} demo;

/* The smallest k that every format's group divides (128: the integer formats' largest group). */
static int64_t demo_k_unit(void) {
    nb_format all[16];
    size_t count = 0;
    int64_t unit = 1;
    if (nb_format_list(all, 16, &count) != NB_OK) return 32;
    for (size_t i = 0; i < count && i < 16; i++) {
        nb_format_info fi;
        if (nb_format_get_info(all[i], &fi) != NB_OK) continue;
        int64_t a = unit, b = fi.group_size;
        while (b) { /* gcd */
            int64_t t = a % b;
            a = b;
            b = t;
        }
        unit = unit / a * fi.group_size;
    }
    return unit;
}

enum { DEMO_K = 4096, DEMO_N = 4096, DEMO_M = 4 };

static void demo_help(void) {
    printf("usage: nibble demo [--cpu] [--m M] [--k K] [--n N]\n"
           "  Quantizes a deterministic Gaussian layer (default k=%d -> n=%d, a Llama-3-8B\n"
           "  attention projection) to NVFP4 and MXFP4, runs Y = X . W^T with m=%d tokens on the\n"
           "  GPU (or the C reference with --cpu or without a GPU) and prints the weight\n"
           "  quantization error, the output error against float64 and the time.\n"
           "  --m 1..4096; --k a multiple of %lld (every format's group); n*k at most 2^28.\n"
           "  Exit: 0 correct, 1 usage, 2 an output differs from the float64 reference,\n"
           "  3 a library or CUDA call failed.\n",
           DEMO_K, DEMO_N, DEMO_M, (long long)demo_k_unit());
}

/* Stage 1: the options: 0 to go on, -1 after --help, 1 on a usage error. */
static int demo_parse(int argc, char **argv, demo *d, int *force_cpu) {
    const int64_t most = (int64_t)1 << 28;
    nba_opt o[] = {
        {.name = "--cpu", .kind = NBA_FLAG, .dst = force_cpu},
        {.name = "--m", .kind = NBA_INT, .dst = &d->m, .lo = 1, .hi = 4096},
        {.name = "--k", .kind = NBA_INT, .dst = &d->k, .lo = 1, .hi = most},
        {.name = "--n", .kind = NBA_INT, .dst = &d->n, .lo = 1, .hi = most},
    };
    const int rc = nba_parse("demo", argc, argv, o, sizeof o / sizeof o[0], NULL, demo_help);
    if (rc) return rc;
    const int64_t unit = demo_k_unit();
    if (d->k % unit)
        return nba_usage("demo", "--k: %lld is not a multiple of %lld (the group of every format)", (long long)d->k,
                         (long long)unit);
    if (d->n > most / d->k)
        return nba_usage("demo", "--n %lld with --k %lld: %lld weights, more than 2^28", (long long)d->n,
                         (long long)d->k, (long long)(d->n * d->k));
    return 0;
}

/* Stage 2: weights ~ N(0, 0.02) with a few outlier channels, activations
 * ~ N(0, 1) in BF16, and the float64 ground truth with the original weights. */
static int demo_data(demo *d) {
    const int64_t n = d->n, k = d->k, m = d->m;
    d->w = malloc(sizeof(float) * (size_t)(n * k));
    d->x = malloc(2 * (size_t)(m * k));
    d->yt = malloc(sizeof(double) * (size_t)(m * n));
    if (!d->w || !d->x || !d->yt) {
        fprintf(stderr, "error: out of host memory\n");
        return 3;
    }
    for (int64_t i = 0; i < n * k; i++) d->w[i] = (float)(0.02 * demo_gauss() * ((i % k) % 97 == 0 ? 8.0 : 1.0));
    for (int64_t i = 0; i < m * k; i++) d->x[i] = f32_to_bf16((float)demo_gauss());
    for (int64_t i = 0; i < m; i++)
        for (int64_t j = 0; j < n; j++) {
            double a = 0;
            for (int64_t l = 0; l < k; l++) a += (double)bf16_to_f32(d->x[i * k + l]) * d->w[j * k + l];
            d->yt[i * n + j] = a;
        }
    return 0;
}

#ifdef NB_HAVE_CUDA
/* In demo_gpu, which frees its device buffers on the way out. */
#define GPU_NB(call)                                                                               \
    do {                                                                                           \
        nb_status s_ = (call);                                                                     \
        if (s_ != NB_OK) {                                                                         \
            fprintf(stderr, "error: %s: %s\n", nb_status_name(s_), nb_last_error());               \
            rc = 3;                                                                                \
            goto done;                                                                             \
        }                                                                                          \
    } while (0)
#define GPU_CUDA(call)                                                                             \
    do {                                                                                           \
        cudaError_t e_ = (call);                                                                   \
        if (e_ != cudaSuccess) {                                                                   \
            fprintf(stderr, "error: %s failed: %s\n", #call, cudaGetErrorString(e_));              \
            rc = 3;                                                                                \
            goto done;                                                                             \
        }                                                                                          \
    } while (0)

/* A release call on demo_gpu's way out: its failure is exit code 3 (the
 * first failure's message is the one printed). */
static int demo_cuda_release(cudaError_t e, const char *what, int rc) {
    if (e == cudaSuccess || rc) return rc;
    fprintf(stderr, "error: %s failed: %s\n", what, cudaGetErrorString(e));
    return 3;
}

/* Stage 3 on the GPU: pack, then time 50 back-to-back nb_gemm calls (warm
 * L2, no graph: `nibble bench` is the benchmark); y and the configuration. */
static int demo_gpu(const demo *d, const nb_weight_desc *desc, const nb_weight_sizes *sz, const uint8_t *codes,
                    const uint8_t *scales, uint16_t *y, double *t_us, char *where, size_t where_len) {
    const int64_t m = d->m, n = d->n, k = d->k;
    void *dx = NULL, *dy = NULL, *dp = NULL, *dws = NULL;
    uint8_t *dc = NULL, *ds = NULL;
    cudaEvent_t e0 = NULL, e1 = NULL;
    size_t ws = 0;
    int rc = 0;
    nb_weight_desc pd = *desc;
    nb_gemm_desc g;
    GPU_CUDA(cudaMalloc(&dx, 2 * (size_t)(m * k)));
    GPU_CUDA(cudaMalloc(&dy, 2 * (size_t)(m * n)));
    GPU_CUDA(cudaMalloc(&dp, sz->packed_bytes));
    GPU_CUDA(cudaMalloc((void **)&dc, sz->codes_bytes));
    GPU_CUDA(cudaMalloc((void **)&ds, sz->scales_bytes));
    GPU_CUDA(cudaMemcpy(dx, d->x, 2 * (size_t)(m * k), cudaMemcpyHostToDevice));
    GPU_CUDA(cudaMemcpy(dc, codes, sz->codes_bytes, cudaMemcpyHostToDevice));
    GPU_CUDA(cudaMemcpy(ds, scales, sz->scales_bytes, cudaMemcpyHostToDevice));
    GPU_NB(nb_pack(d->ctx, &pd, dc, ds, dp, sz->packed_bytes, NULL));
    GPU_NB(nb_gemm_desc_init(&g, &pd, m, NB_DTYPE_BF16, NB_DTYPE_BF16));
    GPU_NB(nb_gemm_workspace_size(d->ctx, &g, &ws));
    if (ws) {
        GPU_CUDA(cudaMalloc(&dws, ws));
        GPU_CUDA(cudaMemset(dws, 0, ws));
    }
    GPU_CUDA(cudaEventCreate(&e0));
    GPU_CUDA(cudaEventCreate(&e1));
    GPU_NB(nb_gemm(d->ctx, &g, dx, dp, NULL, dy, dws, ws, NULL)); /* warm-up */
    const int iters = 50;
    GPU_CUDA(cudaEventRecord(e0, NULL));
    for (int it = 0; it < iters; it++) GPU_NB(nb_gemm(d->ctx, &g, dx, dp, NULL, dy, dws, ws, NULL));
    GPU_CUDA(cudaEventRecord(e1, NULL));
    GPU_CUDA(cudaEventSynchronize(e1));
    float ms = 0;
    GPU_CUDA(cudaEventElapsedTime(&ms, e0, e1));
    *t_us = ms * 1000.0 / iters;
    GPU_CUDA(cudaMemcpy(y, dy, 2 * (size_t)(m * n), cudaMemcpyDeviceToHost));
    char cfg[256];
    GPU_NB(nb_gemm_last_config(d->ctx, cfg, sizeof cfg));
    snprintf(where, where_len, "GPU %s (warm L2, no graph; see nibble bench)", cfg);
done: /* every buffer and event released (cudaFree(NULL) is a no-op); a failure is reported once */
    rc = demo_cuda_release(cudaFree(dx), "cudaFree", rc);
    rc = demo_cuda_release(cudaFree(dy), "cudaFree", rc);
    rc = demo_cuda_release(cudaFree(dp), "cudaFree", rc);
    rc = demo_cuda_release(cudaFree(dc), "cudaFree", rc);
    rc = demo_cuda_release(cudaFree(ds), "cudaFree", rc);
    rc = demo_cuda_release(cudaFree(dws), "cudaFree", rc);
    if (e0) rc = demo_cuda_release(cudaEventDestroy(e0), "cudaEventDestroy", rc);
    if (e1) rc = demo_cuda_release(cudaEventDestroy(e1), "cudaEventDestroy", rc);
    return rc;
}
#endif

/* Relative Frobenius error of got against want (n values): sqrt(sum (g-w)^2 / sum w^2). */
static double rel_err(const float *got, const float *want, int64_t n) {
    double num = 0, den = 0;
    for (int64_t i = 0; i < n; i++) {
        num += ((double)want[i] - got[i]) * ((double)want[i] - got[i]);
        den += (double)want[i] * want[i];
    }
    return sqrt(num / den);
}

/* Stage 3: one format's row - quantize, weight error, float64 GEMM with the
 * quantized weights, the GEMM on the GPU (formats with kernels) or the C
 * reference, its error against both references.  *rc becomes 2 when the
 * output is wrong; the return value is 3 when a call failed. */
static int demo_format(const demo *d, nb_format fmt, int *rc) {
    const int64_t m = d->m, n = d->n, k = d->k;
    nb_format_info fi;
    nb_weight_desc desc;
    nb_weight_sizes sz = {0};
    nb_weight_sizes_v2 sz2;
    nb_gemm_desc g;
    TRY(nb_format_get_info(fmt, &fi));
    TRY(nb_weight_desc_init(&desc, fmt, n, k));
    TRY(nb_weight_get_sizes_v2(&desc, &sz2));
    const int gpu_ok = fi.kernels && !fi.zero_point; /* (demo_gpu packs with nb_pack: no zero points) */
    if (gpu_ok) TRY(nb_weight_get_sizes(&desc, &sz)); /* (the packed size, for the GPU) */
    uint8_t *codes = malloc(sz2.codes_bytes), *scales = malloc(sz2.scales_bytes);
    uint8_t *zeros = sz2.zeros_bytes ? malloc(sz2.zeros_bytes) : NULL;
    const nb_weight_buffers wb = {.codes = codes, .scales = scales, .zeros = zeros};
    const nb_weight_data wd = {.codes = codes, .scales = scales, .zeros = zeros};
    float *wq = malloc(sizeof(float) * (size_t)(n * k));
    double *yq = malloc(sizeof(double) * (size_t)(m * n));
    uint16_t *y = malloc(2 * (size_t)(m * n));
    double t_us = 0;
    char where[300] = "C reference (float)";
    nb_status st = codes && scales && wq && yq && y && (zeros || !sz2.zeros_bytes) ? NB_OK : NB_ERR_OUT_OF_MEMORY;
    if (st != NB_OK) fprintf(stderr, "error: out of host memory\n");
    if (st == NB_OK) st = nb_quantize_host_v2(d->ctx, &desc, NB_DTYPE_F32, d->w, &wb);
    if (st == NB_OK) st = nb_dequantize_host_v2(d->ctx, &desc, &wd, NB_DTYPE_F32, wq);
    /* float64 GEMM with the quantized weights: the yardstick for the kernel */
    if (st == NB_OK) st = nb_gemm_desc_init(&g, &desc, m, NB_DTYPE_BF16, NB_DTYPE_BF16);
    if (st == NB_OK) st = nb_gemm_host_f64_v2(d->ctx, &g, d->x, &wd, NULL, yq);
    int failed = st != NB_OK;
    if (failed && st != NB_ERR_OUT_OF_MEMORY) fprintf(stderr, "error: %s: %s\n", nb_status_name(st), nb_last_error());
    if (!failed && d->gpu && gpu_ok) {
#ifdef NB_HAVE_CUDA
        failed = demo_gpu(d, &desc, &sz, codes, scales, y, &t_us, where, sizeof where) != 0;
#endif
    } else if (!failed) {
        const double t0 = nb_cli_now();
        st = nb_gemm_host_v2(d->ctx, &g, d->x, &wd, NULL, y);
        t_us = (nb_cli_now() - t0) * 1e6;
        if (st != NB_OK) {
            fprintf(stderr, "error: %s: %s\n", nb_status_name(st), nb_last_error());
            failed = 1;
        }
    }
    if (!failed) {
        const double wrel = rel_err(wq, d->w, n * k);
        double eq = 0, dq = 0, eo = 0, dn = 0;
        int nan = 0;
        for (int64_t i = 0; i < m * n; i++) {
            double v = bf16_to_f32(y[i]);
            if (isnan(v)) nan++;
            eq += (v - yq[i]) * (v - yq[i]);
            dq += yq[i] * yq[i];
            eo += (v - d->yt[i]) * (v - d->yt[i]);
            dn += d->yt[i] * d->yt[i];
        }
        double rq = sqrt(eq / dq), ro = sqrt(eo / dn);
        printf("%-8s %12.4f %10.2f %14.2e %14.4f %12.1f  %s\n", fi.name, wrel, -20 * log10(wrel), rq, ro, t_us, where);
        /* BF16 output rounding alone gives ~2e-3; anything far above is a bug */
        if (nan || !(rq < 1e-2)) {
            fprintf(stderr, "error: %s output differs from the float64 reference (rel %.3g, %d NaN)\n", fi.name, rq,
                    nan);
            *rc = 2;
        }
    }
    free(codes);
    free(scales);
    free(zeros);
    free(wq);
    free(yq);
    free(y);
    return failed ? 3 : 0;
}

static int cmd_demo(int argc, char **argv) {
    demo d = {.k = DEMO_K, .n = DEMO_N, .m = DEMO_M};
    int force_cpu = 0, devices = 0, rc = demo_parse(argc, argv, &d, &force_cpu);
    if (rc) return rc < 0 ? 0 : rc;
    TRY(nb_device_count(&devices));
    d.gpu = devices > 0 && !force_cpu;
    TRY(nb_context_create(d.gpu ? 0 : NB_DEVICE_NONE, &d.ctx));
    nb_device_info info;
    nb_format fmts[16];
    size_t nf = 0;
    nb_status st = nb_context_device_info(d.ctx, &info);
    if (st == NB_OK) st = nb_format_list(fmts, 16, &nf);
    if (st != NB_OK) {
        fprintf(stderr, "error: %s: %s\n", nb_status_name(st), nb_last_error());
        nb_context_destroy(d.ctx);
        return 3;
    }
    printf("nibble demo: layer k=%lld -> n=%lld, m=%lld tokens, on %s%s\n", (long long)d.k, (long long)d.n,
           (long long)d.m, d.gpu ? info.name : "the CPU (C reference)",
           d.gpu ? "" : (devices ? "" : "; no CUDA device found"));
    rc = demo_data(&d);
    if (rc == 0)
        printf("\n%-8s %12s %10s %14s %14s %12s  %s\n", "format", "weight-rel", "SQNR-dB", "out-vs-f64q", "out-vs-orig",
               "time-us", "ran on");
    int wrong = 0;
    for (size_t f = 0; f < nf && f < 16 && rc == 0; f++) rc = demo_format(&d, fmts[f], &wrong);
    if (rc == 0)
        printf("\nweight-rel: ||W - Q(W)|| / ||W||;  out-vs-f64q: output vs float64 GEMM with the quantized\n"
               "weights (kernel error, BF16 output);  out-vs-orig: vs float64 with the original weights.\n");
    free(d.w);
    free(d.x);
    free(d.yt);
    if (nb_context_destroy(d.ctx) != NB_OK && rc == 0) rc = 3;
    return rc ? rc : wrong;
}

int main(int argc, char **argv) {
    if (argc < 2) {
        usage(stderr);
        return 1;
    }
    const char *c = argv[1];
    if (!strcmp(c, "--help") || !strcmp(c, "-h") || !strcmp(c, "help")) {
        usage(stdout);
        return 0;
    }
    if (!strcmp(c, "version") || !strcmp(c, "--version")) return cmd_version(argc - 1, argv + 1);
    if (!strcmp(c, "info")) return cmd_info(argc - 1, argv + 1);
    if (!strcmp(c, "demo")) return cmd_demo(argc - 1, argv + 1);
    if (!strcmp(c, "bench")) return nb_cli_bench(argc - 1, argv + 1);
    if (!strcmp(c, "tune")) return nb_cli_tune(argc - 1, argv + 1);
    if (!strcmp(c, "inspect")) return nb_cli_inspect(argc - 1, argv + 1);
    if (!strcmp(c, "quantize")) return nb_cli_quantize(argc - 1, argv + 1);
    if (!strcmp(c, "convert")) return nb_cli_convert(argc - 1, argv + 1);
    fprintf(stderr, "nibble: unknown command '%s'\n", c);
    usage(stderr);
    return 1;
}
