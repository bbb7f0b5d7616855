/* nibble - command-line tool over the public API.
 *
 *   nibble version | info | demo | bench | tune | inspect | quantize | convert   (each takes --help)
 *
 * Exit codes: 0 success, 1 usage error, 2 a check failed (wrong numbers),
 * 3 a library call failed. */
#define _POSIX_C_SOURCE 200809L
#include "nibble.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#ifdef NB_HAVE_CUDA
#include <cuda_runtime.h>
#endif
#ifdef NB_HAVE_IO
#include "checkpoint.h" /* nibble_io: internal, static */
#include "ckpt_convert.h"
#include "ckpt_quantize.h"
#include "gguf.h"

#include <unistd.h> /* isatty */

#include <cjson/cJSON.h>
#endif

#ifdef NB_HAVE_CUDA
int nb_cli_bench(int argc, char **argv); /* bench.c */
int nb_cli_tune(int argc, char **argv);  /* tune.c */
#else
/* `nibble bench` and `nibble tune` in a build without the CUDA kernels. */
static int cmd_needs_cuda(const char *cmd, int argc, char **argv) {
    for (int i = 1; i < argc; i++)
        if (!strcmp(argv[i], "--help")) {
            printf("usage: nibble %s [options]  (needs a CUDA build and a GPU)\n", cmd);
            return 0;
        }
    fprintf(stderr, "nibble %s: this build has no CUDA kernels (%s)\n", cmd, nb_status_string(NB_ERR_NO_DEVICE));
    return 3;
}
#define nb_cli_bench(argc, argv) cmd_needs_cuda("bench", argc, argv)
#define nb_cli_tune(argc, argv) cmd_needs_cuda("tune", argc, argv)
#endif

static int wants_help(int argc, char **argv) {
    for (int i = 1; i < argc; i++)
        if (!strcmp(argv[i], "--help") || !strcmp(argv[i], "-h")) return 1;
    return 0;
}

static void usage(FILE *f) {
    fprintf(f, "usage: nibble <command> [options]\n\n"
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
               "'nibble <command> --help' describes each command.\n");
}

static int cmd_version(int argc, char **argv) {
    if (wants_help(argc, argv)) {
        printf("usage: nibble version\n  Print the library version (and warn if it differs from the header's).\n");
        return 0;
    }
    printf("nibble %s\n", nb_version_string());
    if (nb_version() != NB_VERSION) {
        fprintf(stderr, "warning: header version %d, library version %d\n", NB_VERSION, nb_version());
        return 2;
    }
    return 0;
}

static int cmd_info(int argc, char **argv) {
    if (wants_help(argc, argv)) {
        printf("usage: nibble info\n  Print the build configuration and every CUDA device found.\n");
        return 0;
    }
    nb_build_info b;
    nb_get_build_info(&b);
    printf("nibble %s\n", b.version);
    printf("formats:            %s\n", b.formats);
    printf("CUDA kernels:       %s\n", b.cuda ? "yes" : "no (CPU-only build: the C reference runs everything)");
    if (b.cuda) printf("CUDA architectures: %s\n", b.cuda_archs);
    int count = 0;
    nb_device_count(&count);
    printf("devices:            %d\n", count);
    for (int d = 0; d < count; d++) {
        nb_context *ctx = NULL;
        if (nb_context_create(d, &ctx) != NB_OK) {
            printf("  [%d] unavailable: %s\n", d, nb_last_error());
            continue;
        }
        nb_device_info i;
        nb_context_device_info(ctx, &i);
        printf("  [%d] %s  sm_%d%d  %d SMs  L2 %.0f MB  %.1f GB  smem/block %zu KB\n", d, i.name, i.cc_major, i.cc_minor,
               i.sm_count, i.l2_bytes / 1e6, i.global_mem_bytes / 1e9, i.smem_per_block_optin / 1024);
        nb_context_destroy(ctx);
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

static double now_s(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec + t.tv_nsec * 1e-9;
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

#define TRY(call)                                                                                  \
    do {                                                                                           \
        nb_status s_ = (call);                                                                     \
        if (s_ != NB_OK) {                                                                         \
            fprintf(stderr, "error: %s: %s\n", nb_status_name(s_), nb_last_error());               \
            return 3;                                                                              \
        }                                                                                          \
    } while (0)

static int cmd_demo(int argc, char **argv) {
    int64_t k = 4096, n = 4096, m = 4;
    int force_cpu = 0;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--help") || !strcmp(argv[i], "-h")) {
            printf("usage: nibble demo [--cpu] [--m M] [--k K] [--n N]\n"
                   "  Quantizes a deterministic Gaussian layer (default k=%lld -> n=%lld, a Llama-3-8B\n"
                   "  attention projection) to NVFP4 and MXFP4, runs Y = X . W^T with m=%lld tokens on the\n"
                   "  GPU (or the C reference with --cpu or without a GPU) and prints the weight\n"
                   "  quantization error, the output error against float64 and the time.\n",
                   (long long)k, (long long)n, (long long)m);
            return 0;
        } else if (!strcmp(argv[i], "--cpu")) force_cpu = 1;
        else if (i + 1 < argc && !strcmp(argv[i], "--m")) m = atoll(argv[++i]);
        else if (i + 1 < argc && !strcmp(argv[i], "--k")) k = atoll(argv[++i]);
        else if (i + 1 < argc && !strcmp(argv[i], "--n")) n = atoll(argv[++i]);
        else {
            fprintf(stderr, "nibble demo: unknown option '%s' (see --help)\n", argv[i]);
            return 1;
        }
    }
    if (m <= 0 || n <= 0 || k <= 0 || k % 32 || m > 4096 || n * k > ((int64_t)1 << 28)) {
        fprintf(stderr, "nibble demo: need m in 1..4096, k a multiple of 32, n*k <= 2^28\n");
        return 1;
    }
    int devices = 0;
    nb_device_count(&devices);
    int gpu = devices > 0 && !force_cpu;
    nb_context *ctx = NULL;
    TRY(nb_context_create(gpu ? 0 : NB_DEVICE_NONE, &ctx));
    nb_device_info info;
    nb_context_device_info(ctx, &info);
    printf("nibble demo: layer k=%lld -> n=%lld, m=%lld tokens, on %s%s\n", (long long)k, (long long)n, (long long)m,
           gpu ? info.name : "the CPU (C reference)", gpu ? "" : (devices ? "" : "; no CUDA device found"));

    /* weights ~ N(0, 0.02) with a few outlier channels; activations ~ N(0, 1), BF16 */
    float *w = malloc(sizeof(float) * (size_t)(n * k));
    uint16_t *x = malloc(2 * (size_t)(m * k));
    if (!w || !x) return 3;
    for (int64_t i = 0; i < n * k; i++) w[i] = (float)(0.02 * demo_gauss() * ((i % k) % 97 == 0 ? 8.0 : 1.0));
    for (int64_t i = 0; i < m * k; i++) x[i] = f32_to_bf16((float)demo_gauss());
    /* float64 ground truth with the original weights */
    double *yt = malloc(sizeof(double) * (size_t)(m * n));
    for (int64_t i = 0; i < m; i++)
        for (int64_t j = 0; j < n; j++) {
            double a = 0;
            for (int64_t l = 0; l < k; l++) a += (double)bf16_to_f32(x[i * k + l]) * w[j * k + l];
            yt[i * n + j] = a;
        }
    printf("\n%-6s %12s %10s %14s %14s %12s  %s\n", "format", "weight-rel", "SQNR-dB", "out-vs-f64q", "out-vs-orig",
           "time-us", "ran on");
    int rc = 0;
    const nb_format fmts[2] = {NB_FORMAT_NVFP4, NB_FORMAT_MXFP4};
    for (int f = 0; f < 2; f++) {
        nb_weight_desc d;
        TRY(nb_weight_desc_init(&d, fmts[f], n, k));
        nb_weight_sizes sz;
        TRY(nb_weight_get_sizes(&d, &sz));
        uint8_t *codes = malloc(sz.codes_bytes), *scales = malloc(sz.scales_bytes);
        float *wq = malloc(sizeof(float) * (size_t)(n * k));
        TRY(nb_quantize_host(ctx, &d, NB_DTYPE_F32, w, codes, scales));
        TRY(nb_dequantize_host(ctx, &d, codes, scales, NB_DTYPE_F32, wq));
        double num = 0, den = 0;
        for (int64_t i = 0; i < n * k; i++) {
            num += ((double)w[i] - wq[i]) * ((double)w[i] - wq[i]);
            den += (double)w[i] * w[i];
        }
        double wrel = sqrt(num / den);
        /* float64 GEMM with the quantized weights: the yardstick for the kernel */
        nb_gemm_desc g;
        TRY(nb_gemm_desc_init(&g, &d, m, NB_DTYPE_BF16, NB_DTYPE_BF16));
        double *yq = malloc(sizeof(double) * (size_t)(m * n));
        TRY(nb_gemm_host_f64(ctx, &g, x, codes, scales, NULL, yq));
        uint16_t *y = malloc(2 * (size_t)(m * n));
        double t_us = 0;
        char where[300] = "C reference (float)";
        if (gpu) {
#ifdef NB_HAVE_CUDA
            void *dx, *dy, *dp, *dws = NULL;
            uint8_t *dc, *ds;
            size_t ws = 0;
            cudaMalloc(&dx, 2 * (size_t)(m * k));
            cudaMalloc(&dy, 2 * (size_t)(m * n));
            cudaMalloc(&dp, sz.packed_bytes);
            cudaMalloc((void **)&dc, sz.codes_bytes);
            cudaMalloc((void **)&ds, sz.scales_bytes);
            cudaMemcpy(dx, x, 2 * (size_t)(m * k), cudaMemcpyHostToDevice);
            cudaMemcpy(dc, codes, sz.codes_bytes, cudaMemcpyHostToDevice);
            cudaMemcpy(ds, scales, sz.scales_bytes, cudaMemcpyHostToDevice);
            nb_weight_desc pd = d;
            TRY(nb_pack(ctx, &pd, dc, ds, dp, sz.packed_bytes, NULL));
            TRY(nb_gemm_desc_init(&g, &pd, m, NB_DTYPE_BF16, NB_DTYPE_BF16));
            TRY(nb_gemm_workspace_size(ctx, &g, &ws));
            if (ws) {
                cudaMalloc(&dws, ws);
                cudaMemset(dws, 0, ws);
            }
            cudaEvent_t e0, e1;
            cudaEventCreate(&e0);
            cudaEventCreate(&e1);
            TRY(nb_gemm(ctx, &g, dx, dp, NULL, dy, dws, ws, NULL)); /* warm-up */
            const int iters = 50;
            cudaEventRecord(e0, NULL);
            for (int it = 0; it < iters; it++) TRY(nb_gemm(ctx, &g, dx, dp, NULL, dy, dws, ws, NULL));
            cudaEventRecord(e1, NULL);
            if (cudaEventSynchronize(e1) != cudaSuccess) {
                fprintf(stderr, "error: %s\n", cudaGetErrorString(cudaGetLastError()));
                return 3;
            }
            float ms = 0;
            cudaEventElapsedTime(&ms, e0, e1);
            t_us = ms * 1000.0 / iters;
            cudaMemcpy(y, dy, 2 * (size_t)(m * n), cudaMemcpyDeviceToHost);
            char cfg[256];
            nb_gemm_last_config(ctx, cfg, sizeof cfg);
            snprintf(where, sizeof where, "GPU %s (warm L2, no graph; see nibble bench)", cfg);
            cudaFree(dx);
            cudaFree(dy);
            cudaFree(dp);
            cudaFree(dc);
            cudaFree(ds);
            cudaFree(dws);
            cudaEventDestroy(e0);
            cudaEventDestroy(e1);
#endif
        } else {
            double t0 = now_s();
            TRY(nb_gemm_host(ctx, &g, x, codes, scales, NULL, y));
            t_us = (now_s() - t0) * 1e6;
        }
        double eq = 0, dq = 0, eo = 0, dn = 0;
        int nan = 0;
        for (int64_t i = 0; i < m * n; i++) {
            double v = bf16_to_f32(y[i]);
            if (isnan(v)) nan++;
            eq += (v - yq[i]) * (v - yq[i]);
            dq += yq[i] * yq[i];
            eo += (v - yt[i]) * (v - yt[i]);
            dn += yt[i] * yt[i];
        }
        double rq = sqrt(eq / dq), ro = sqrt(eo / dn);
        printf("%-6s %12.4f %10.2f %14.2e %14.4f %12.1f  %s\n", f ? "mxfp4" : "nvfp4", wrel, -20 * log10(wrel), rq, ro,
               t_us, where);
        /* BF16 output rounding alone gives ~2e-3; anything far above is a bug */
        if (nan || !(rq < 1e-2)) {
            fprintf(stderr, "error: %s output differs from the float64 reference (rel %.3g, %d NaN)\n",
                    f ? "mxfp4" : "nvfp4", rq, nan);
            rc = 2;
        }
        free(codes);
        free(scales);
        free(wq);
        free(yq);
        free(y);
    }
    printf("\nweight-rel: ||W - Q(W)|| / ||W||;  out-vs-f64q: output vs float64 GEMM with the quantized\n"
           "weights (kernel error, BF16 output);  out-vs-orig: vs float64 with the original weights.\n");
    free(w);
    free(x);
    free(yt);
    nb_context_destroy(ctx);
    return rc;
}

/* ---------------------------------------------------------------- inspect */

#ifdef NB_HAVE_IO
static void json_add_i64(cJSON *o, const char *key, int64_t v) { cJSON_AddNumberToObject(o, key, (double)v); }

/* Print a summary object on stdout and free it. */
static void print_json(cJSON *j) {
    char *txt = cJSON_Print(j);
    if (txt) printf("%s\n", txt);
    free(txt);
    cJSON_Delete(j);
}

/* A GGUF file: header, key/values, tensors with their ggml type and, for
 * MXFP4 / NVFP4, the weight nibble imports (n x k, experts, tensor scale). */
static void gguf_value(const nb_gguf_kv *kv, char *buf, size_t n) {
    const uint8_t *d = kv->data;
    uint64_t u = 0;
    int64_t i = 0;
    double f = 0;
    switch (kv->type) {
    case NB_GGUF_STRING: snprintf(buf, n, "\"%.60s%s\"", kv->str, strlen(kv->str) > 60 ? "..." : ""); return;
    case NB_GGUF_ARRAY: snprintf(buf, n, "[%s x %llu]", nb_gguf_vtype_name(kv->elem_type), (unsigned long long)kv->count); return;
    case NB_GGUF_FLOAT32: { float x; memcpy(&x, d, 4); f = x; snprintf(buf, n, "%.9g", f); return; }
    case NB_GGUF_FLOAT64: memcpy(&f, d, 8); snprintf(buf, n, "%.17g", f); return;
    case NB_GGUF_BOOL: snprintf(buf, n, "%s", d[0] ? "true" : "false"); return;
    case NB_GGUF_INT8: i = (int8_t)d[0]; break;
    case NB_GGUF_INT16: { int16_t x; memcpy(&x, d, 2); i = x; break; }
    case NB_GGUF_INT32: { int32_t x; memcpy(&x, d, 4); i = x; break; }
    case NB_GGUF_INT64: memcpy(&i, d, 8); break;
    default:
        memcpy(&u, d, (size_t)kv->bytes < 8 ? (size_t)kv->bytes : 8);
        snprintf(buf, n, "%llu", (unsigned long long)u);
        return;
    }
    snprintf(buf, n, "%lld", (long long)i);
}

static int cmd_inspect_gguf(const char *path, int json, int summary) {
    char err[1024] = "";
    nb_gguf_file *g = NULL;
    nb_status st = nb_gguf_open(path, &g, err, sizeof err);
    if (st != NB_OK) {
        fprintf(stderr, "nibble inspect: %s: %s\n", nb_status_name(st), err);
        return 3;
    }
    nb_gguf_header h;
    nb_gguf_get_header(g, &h);
    cJSON *root = json ? cJSON_CreateObject() : NULL, *jk = NULL, *jt = NULL;
    if (json) {
        cJSON_AddStringToObject(root, "path", path);
        cJSON_AddStringToObject(root, "container", "gguf");
        json_add_i64(root, "version", h.version);
        json_add_i64(root, "alignment", h.alignment);
        jk = cJSON_AddObjectToObject(root, "metadata");
        jt = cJSON_AddArrayToObject(root, "tensors");
    } else {
        printf("gguf %s\nversion %u, alignment %u, %zu keys, %zu tensors, data at byte %llu\n", path, h.version,
               h.alignment, h.n_kv, h.n_tensors, (unsigned long long)h.data_offset);
        if (!summary) printf("\nmetadata (%zu):\n", h.n_kv);
    }
    for (size_t i = 0; i < h.n_kv; i++) {
        nb_gguf_kv kv;
        nb_gguf_kv_at(g, i, &kv);
        char v[128];
        gguf_value(&kv, v, sizeof v);
        if (json) cJSON_AddStringToObject(jk, kv.key, v);
        else if (!summary) printf("  %-48s %-8s %s\n", kv.key, nb_gguf_vtype_name(kv.type), v);
    }
    if (!json) printf("\ntensors (%zu):\n  %-40s %-8s %-22s %12s  %s\n", h.n_tensors, "name", "type", "shape", "bytes",
                      "format");
    size_t nfmt[2] = {0, 0};
    uint64_t total = 0;
    for (size_t i = 0; i < h.n_tensors; i++) {
        nb_gguf_tensor t;
        nb_gguf_tensor_at(g, i, &t);
        total += t.bytes;
        nb_gguf_fp4 f;
        int fp4 = nb_gguf_fp4_info(g, i, &f, NULL, 0) == NB_OK;
        const char *fmt = fp4 ? (f.format == NB_FORMAT_NVFP4 ? "gguf-nvfp4" : "gguf-mxfp4") : "none";
        float ts = 1.0f;
        if (fp4) {
            nfmt[f.format == NB_FORMAT_NVFP4]++;
            if (f.scale_tensor >= 0) {
                nb_gguf_tensor s;
                nb_gguf_tensor_at(g, (size_t)f.scale_tensor, &s);
                memcpy(&ts, s.data, 4);
            }
        }
        if (json) {
            cJSON *o = cJSON_CreateObject(), *sh = cJSON_CreateArray();
            cJSON_AddStringToObject(o, "name", t.name);
            cJSON_AddStringToObject(o, "ggml_type", nb_ggml_type_name(t.type));
            for (int d = 0; d < t.n_dims; d++) cJSON_AddItemToArray(sh, cJSON_CreateNumber((double)t.shape[d]));
            cJSON_AddItemToObject(o, "shape", sh);
            json_add_i64(o, "bytes", (int64_t)t.bytes);
            cJSON_AddStringToObject(o, "format", fmt);
            if (fp4) {
                json_add_i64(o, "n", f.n);
                json_add_i64(o, "k", f.k);
                json_add_i64(o, "experts", f.experts);
                cJSON_AddNumberToObject(o, "tensor_scale", ts);
            }
            cJSON_AddItemToArray(jt, o);
            continue;
        }
        if (summary && !fp4) continue;
        char shape[96] = "[";
        size_t at = 1;
        for (int d = 0; d < t.n_dims; d++)
            at += (size_t)snprintf(shape + at, sizeof shape - at, "%s%lld", d ? ", " : "", (long long)t.shape[d]);
        snprintf(shape + at, sizeof shape - at, "]");
        char extra[96] = "";
        if (fp4)
            snprintf(extra, sizeof extra, "  %lld x %lld%s%.0lld%s, tensor scale %.6g", (long long)f.n, (long long)f.k,
                     f.experts ? " x " : "", (long long)f.experts, f.experts ? " exp" : "", (double)ts);
        printf("  %-40s %-8s %-22s %12llu  %s%s\n", t.name, nb_ggml_type_name(t.type), shape,
               (unsigned long long)t.bytes, fmt, extra);
    }
    if (json) {
        cJSON *tot = cJSON_AddObjectToObject(root, "totals");
        json_add_i64(tot, "tensors", (int64_t)h.n_tensors);
        json_add_i64(tot, "bytes", (int64_t)total);
        json_add_i64(tot, "gguf_mxfp4", (int64_t)nfmt[0]);
        json_add_i64(tot, "gguf_nvfp4", (int64_t)nfmt[1]);
        print_json(root);
    } else {
        printf("\ntotals: %zu tensors, %llu bytes; %zu gguf-mxfp4, %zu gguf-nvfp4 (importable into nibble's "
               "checkpoint layout)\n", h.n_tensors, (unsigned long long)total, nfmt[0], nfmt[1]);
    }
    nb_gguf_close(g);
    return 0;
}

static int is_gguf(const char *path) {
    size_t n = strlen(path);
    if (n > 5 && !strcmp(path + n - 5, ".gguf")) return 1;
    FILE *f = fopen(path, "rb");
    char m[4] = {0};
    int r = f && fread(m, 1, 4, f) == 4 && !memcmp(m, "GGUF", 4);
    if (f) fclose(f);
    return r;
}

static int cmd_inspect(int argc, char **argv) {
    const char *path = NULL;
    int json = 0, summary = 0;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--help") || !strcmp(argv[i], "-h")) {
            printf("usage: nibble inspect PATH [--summary] [--json]\n"
                   "  PATH is a .safetensors file, a directory (model.safetensors.index.json or\n"
                   "  model.safetensors inside) or an index file; config.json and\n"
                   "  hf_quant_config.json next to it are read when present.\n"
                   "  A GGUF file (*.gguf, or starting with \"GGUF\") lists its header, metadata,\n"
                   "  tensors with their ggml type and shape, and the MXFP4 / NVFP4 weights\n"
                   "  nibble imports (gguf-mxfp4, gguf-nvfp4).\n"
                   "  Prints the files, every tensor (name, dtype, shape, bytes; not with\n"
                   "  --summary), every linear layer with its detected format (modelopt-nvfp4,\n"
                   "  ct-nvfp4, ct-mxfp4, quark-mxfp4, gptoss-mxfp4, none = unquantized,\n"
                   "  inconsistent = breaks its layout's rules, with the reason), n x k,\n"
                   "  experts, tensor scale and what decided it (a layer named by the config's\n"
                   "  exclude / ignore list says so; a 4-bit layer it names is a WARNING), then totals.\n"
                   "  --json  the same as one JSON object on stdout.\n"
                   "  Exit: 0 read (even with inconsistent layers), 1 usage, 3 unreadable or corrupt.\n");
            return 0;
        } else if (!strcmp(argv[i], "--json")) json = 1;
        else if (!strcmp(argv[i], "--summary")) summary = 1;
        else if (argv[i][0] == '-' || path) {
            fprintf(stderr, "nibble inspect: unexpected argument '%s' (see --help)\n", argv[i]);
            return 1;
        } else path = argv[i];
    }
    if (!path) {
        fprintf(stderr, "nibble inspect: a checkpoint path is required (see --help)\n");
        return 1;
    }
    if (is_gguf(path)) return cmd_inspect_gguf(path, json, summary);
    char err[1024] = "";
    nb_ckpt *c = NULL;
    nb_status st = nb_ckpt_open(path, &c, err, sizeof err);
    if (st != NB_OK) {
        fprintf(stderr, "nibble inspect: %s: %s\n", nb_status_name(st), err);
        return 3;
    }
    size_t nf = 0, nt = 0, nl = 0;
    nb_ckpt_file_count(c, &nf);
    nb_ckpt_tensor_count(c, &nt);
    nb_ckpt_layer_count(c, &nl);
    nb_ckpt_config cfg;
    nb_ckpt_get_config(c, &cfg);

    /* totals: bytes and tensors by dtype; parameters of quantized layers
     * (n*k per expert) vs elements of every float tensor outside them
     * (inconsistent layers are not quantized layers) */
    enum { NDT = 32 };
    uint64_t dt_bytes[NDT] = {0}, dt_count[NDT] = {0}, total_bytes = 0;
    int64_t q_params = 0, u_params = 0;
    size_t nfmt[8] = {0};
    for (size_t i = 0; i < nt; i++) {
        nb_st_tensor t;
        int64_t layer;
        nb_ckpt_tensor_at(c, i, &t, &layer);
        if ((unsigned)t.dtype < NDT) {
            dt_bytes[t.dtype] += t.bytes;
            dt_count[t.dtype]++;
        }
        total_bytes += t.bytes;
        int in_quant = 0;
        if (layer >= 0) {
            nb_ckpt_layer L;
            nb_ckpt_layer_at(c, (size_t)layer, &L);
            in_quant = L.format != NB_CKPT_NONE && L.format != NB_CKPT_INCONSISTENT;
        }
        if (!in_quant && (t.dtype == NB_ST_BF16 || t.dtype == NB_ST_F16 || t.dtype == NB_ST_F32 ||
                          t.dtype == NB_ST_F64)) {
            int64_t e = 1;
            for (int d = 0; d < t.rank; d++) e *= t.shape[d];
            u_params += e;
        }
    }
    for (size_t i = 0; i < nl; i++) {
        nb_ckpt_layer L;
        nb_ckpt_layer_at(c, i, &L);
        if ((unsigned)L.format < 8) nfmt[L.format]++;
        if (L.format != NB_CKPT_NONE && L.format != NB_CKPT_INCONSISTENT)
            q_params += L.n * L.k * (L.experts ? L.experts : 1);
    }

    if (json) {
        cJSON *root = cJSON_CreateObject(), *a;
        cJSON_AddStringToObject(root, "path", path);
        cJSON *jc = cJSON_AddObjectToObject(root, "config");
        cJSON_AddBoolToObject(jc, "config_json", cfg.has_config_json);
        cJSON_AddBoolToObject(jc, "hf_quant_config_json", cfg.has_hf_quant_config);
        if (cfg.quant_method) cJSON_AddStringToObject(jc, "quant_method", cfg.quant_method);
        if (cfg.quant_algo) cJSON_AddStringToObject(jc, "quant_algo", cfg.quant_algo);
        if (cfg.ct_format) cJSON_AddStringToObject(jc, "format", cfg.ct_format);
        cJSON_AddStringToObject(jc, "declared", nb_ckpt_format_name(cfg.declared));
        cJSON_AddStringToObject(jc, "declared_by", nb_ckpt_source_name(cfg.source));
        cJSON *jx = cJSON_AddArrayToObject(jc, "exclude");
        for (size_t i = 0; i < cfg.nexclude; i++) {
            const char *pat, *where;
            int usable;
            nb_ckpt_exclude_at(c, i, &pat, &where, &usable);
            cJSON *o = cJSON_CreateObject();
            cJSON_AddStringToObject(o, "pattern", pat);
            cJSON_AddStringToObject(o, "from", where);
            if (!usable) cJSON_AddBoolToObject(o, "unusable", 1);
            cJSON_AddItemToArray(jx, o);
        }
        if (cfg.note) cJSON_AddStringToObject(jc, "note", cfg.note);
        a = cJSON_AddArrayToObject(root, "files");
        for (size_t i = 0; i < nf; i++) {
            const char *p;
            uint64_t b;
            nb_ckpt_file_at(c, i, &p, &b);
            cJSON *o = cJSON_CreateObject();
            cJSON_AddStringToObject(o, "path", p);
            json_add_i64(o, "bytes", (int64_t)b);
            cJSON_AddItemToArray(a, o);
        }
        if (!summary) {
            a = cJSON_AddArrayToObject(root, "tensors");
            for (size_t i = 0; i < nt; i++) {
                nb_st_tensor t;
                nb_ckpt_tensor_at(c, i, &t, NULL);
                const char *dn = "?";
                nb_st_dtype_info(t.dtype, &dn, NULL);
                cJSON *o = cJSON_CreateObject(), *sh = cJSON_CreateArray();
                cJSON_AddStringToObject(o, "name", t.name);
                cJSON_AddStringToObject(o, "dtype", dn);
                for (int d = 0; d < t.rank; d++) cJSON_AddItemToArray(sh, cJSON_CreateNumber((double)t.shape[d]));
                cJSON_AddItemToObject(o, "shape", sh);
                json_add_i64(o, "bytes", (int64_t)t.bytes);
                cJSON_AddItemToArray(a, o);
            }
        }
        a = cJSON_AddArrayToObject(root, "layers");
        for (size_t i = 0; i < nl; i++) {
            nb_ckpt_layer L;
            nb_ckpt_layer_at(c, i, &L);
            cJSON *o = cJSON_CreateObject();
            cJSON_AddStringToObject(o, "prefix", L.prefix);
            cJSON_AddStringToObject(o, "format", nb_ckpt_format_name(L.format));
            json_add_i64(o, "n", L.n);
            json_add_i64(o, "k", L.k);
            json_add_i64(o, "experts", L.experts);
            cJSON_AddNumberToObject(o, "tensor_scale", L.tensor_scale);
            json_add_i64(o, "bytes", (int64_t)L.bytes);
            cJSON_AddStringToObject(o, "decided_by", nb_ckpt_source_name(L.decided_by));
            if (L.excluded) {
                cJSON_AddBoolToObject(o, "excluded", 1);
                cJSON_AddStringToObject(o, "excluded_by", L.excluded_by);
            }
            if (L.config_mismatch) cJSON_AddBoolToObject(o, "config_mismatch", 1);
            if (L.problem[0]) cJSON_AddStringToObject(o, "problem", L.problem);
            cJSON_AddItemToArray(a, o);
        }
        cJSON *tot = cJSON_AddObjectToObject(root, "totals");
        json_add_i64(tot, "tensors", (int64_t)nt);
        json_add_i64(tot, "bytes", (int64_t)total_bytes);
        cJSON *bd = cJSON_AddObjectToObject(tot, "bytes_by_dtype");
        for (int d = 0; d < NDT; d++)
            if (dt_count[d]) {
                const char *dn = "?";
                nb_st_dtype_info((nb_st_dtype)d, &dn, NULL);
                json_add_i64(bd, dn, (int64_t)dt_bytes[d]);
            }
        json_add_i64(tot, "layers", (int64_t)nl);
        cJSON *lf = cJSON_AddObjectToObject(tot, "layers_by_format");
        for (int f = 0; f < 7; f++)
            if (nfmt[f]) json_add_i64(lf, nb_ckpt_format_name((nb_ckpt_format)f), (int64_t)nfmt[f]);
        json_add_i64(tot, "quantized_params", q_params);
        json_add_i64(tot, "unquantized_params", u_params);
        char *s = cJSON_Print(root);
        if (s) printf("%s\n", s);
        cJSON_free(s);
        cJSON_Delete(root);
        nb_ckpt_close(c);
        return s ? 0 : 3;
    }

    printf("checkpoint %s\n", path);
    printf("config: config.json %s, hf_quant_config.json %s", cfg.has_config_json ? "yes" : "no",
           cfg.has_hf_quant_config ? "yes" : "no");
    if (cfg.quant_method) printf(", quant_method %s", cfg.quant_method);
    if (cfg.quant_algo) printf(", quant_algo %s", cfg.quant_algo);
    if (cfg.ct_format) printf(", format %s", cfg.ct_format);
    printf("; declares %s (%s); %zu exclude entries\n",
           cfg.declared == NB_CKPT_NONE ? "nothing" : nb_ckpt_format_name(cfg.declared), nb_ckpt_source_name(cfg.source),
           cfg.nexclude);
    if (cfg.note) printf("config WARNING: %s\n", cfg.note);
    printf("\nfiles (%zu):\n", nf);
    for (size_t i = 0; i < nf; i++) {
        const char *p;
        uint64_t b;
        nb_ckpt_file_at(c, i, &p, &b);
        printf("  %12llu  %s\n", (unsigned long long)b, p);
    }
    if (!summary) {
        printf("\ntensors (%zu):\n", nt);
        for (size_t i = 0; i < nt; i++) {
            nb_st_tensor t;
            nb_ckpt_tensor_at(c, i, &t, NULL);
            const char *dn = "?";
            nb_st_dtype_info(t.dtype, &dn, NULL);
            char shape[160] = "[";
            size_t at = 1;
            for (int d = 0; d < t.rank && at < sizeof shape; d++)
                at += (size_t)snprintf(shape + at, sizeof shape - at, "%s%lld", d ? ", " : "", (long long)t.shape[d]);
            if (at < sizeof shape - 1) strcat(shape, "]");
            printf("  %-60s %-8s %-24s %12zu\n", t.name, dn, shape, t.bytes);
        }
    }
    size_t w = 6;
    for (size_t i = 0; i < nl; i++) {
        nb_ckpt_layer L;
        nb_ckpt_layer_at(c, i, &L);
        if (strlen(L.prefix) > w) w = strlen(L.prefix);
    }
    printf("\nlayers (%zu):\n  %-*s  %-14s  %-22s  %-12s  %12s  %s\n", nl, (int)w, "prefix", "format", "n x k",
           "tensor_scale", "bytes", "decided by");
    for (size_t i = 0; i < nl; i++) {
        nb_ckpt_layer L;
        nb_ckpt_layer_at(c, i, &L);
        char nk[64];
        if (L.experts)
            snprintf(nk, sizeof nk, "%lld x %lld x %lld exp", (long long)L.n, (long long)L.k, (long long)L.experts);
        else
            snprintf(nk, sizeof nk, "%lld x %lld", (long long)L.n, (long long)L.k);
        char ex[160] = "";
        if (L.excluded && !L.config_mismatch) snprintf(ex, sizeof ex, " (excluded: \"%.120s\")", L.excluded_by);
        printf("  %-*s  %-14s  %-22s  %-12.6g  %12llu  %s%s%s%s\n", (int)w, L.prefix, nb_ckpt_format_name(L.format),
               nk, (double)L.tensor_scale, (unsigned long long)L.bytes, nb_ckpt_source_name(L.decided_by), ex,
               L.problem[0] ? (L.config_mismatch ? "  WARNING: " : "  PROBLEM: ") : "", L.problem);
    }
    printf("\ntotals: %zu tensors, %llu bytes (", nt, (unsigned long long)total_bytes);
    int first = 1;
    for (int d = 0; d < NDT; d++)
        if (dt_count[d]) {
            const char *dn = "?";
            nb_st_dtype_info((nb_st_dtype)d, &dn, NULL);
            printf("%s%s %llu", first ? "" : ", ", dn, (unsigned long long)dt_bytes[d]);
            first = 0;
        }
    printf(")\nlayers: %zu (", nl);
    first = 1;
    for (int f = 0; f < 7; f++)
        if (nfmt[f]) {
            printf("%s%zu %s", first ? "" : ", ", nfmt[f], nb_ckpt_format_name((nb_ckpt_format)f));
            first = 0;
        }
    printf(")\nparameters: %lld quantized (4-bit), %lld unquantized (float tensors outside quantized layers)\n",
           (long long)q_params, (long long)u_params);
    nb_ckpt_close(c);
    return 0;
}

/* --------------------------------------------------------------- quantize */

static void quantize_progress(void *user, size_t i, size_t n, uint64_t done, uint64_t total, const char *name) {
    (void)user;
    if (name)
        fprintf(stderr, "\r\033[K[%zu/%zu] %.1f / %.1f MB  %.60s", i + 1, n, done / 1e6, total / 1e6, name);
    else
        fprintf(stderr, "\r\033[K[%zu/%zu] %.1f / %.1f MB  done\n", i, n, done / 1e6, total / 1e6);
    fflush(stderr);
}

static int cmd_quantize(int argc, char **argv) {
    const char *in = NULL, *out = NULL, *fmt = NULL, *rule = NULL, *device = NULL;
    int json = 0;
    nb_ckpt_quantize_opts o;
    nb_ckpt_quantize_opts_init(&o);
    const char **excl = (const char **)calloc((size_t)argc + 1, sizeof *excl);
    if (!excl) return 3;
    size_t nexcl = 0;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (!strcmp(a, "--help") || !strcmp(a, "-h")) {
            printf("usage: nibble quantize IN OUT --format nvfp4|mxfp4 [--exclude PATTERN]...\n"
                   "                       [--mx-rule ocp|even|round-up] [--no-default-excludes]\n"
                   "                       [--device auto|cpu|gpu] [--json]\n"
                   "  IN   a BF16/F16/F32 checkpoint: .safetensors file, directory (index or\n"
                   "       model.safetensors) or index file.  It is only read.\n"
                   "  OUT  a directory that must not exist or be empty.  It receives, per input\n"
                   "       file, a file of the same name; the index when IN is sharded;\n"
                   "       config.json with a quantization_config (ModelOpt for nvfp4, Quark for\n"
                   "       mxfp4); hf_quant_config.json (nvfp4); every other file of IN's directory\n"
                   "       byte for byte (not other *.safetensors, not subdirectories).\n"
                   "  Quantized: every 2-D BF16/F16/F32 tensor P.weight whose K is a multiple of the\n"
                   "  group (16 nvfp4, 32 mxfp4) and whose prefix P matches no exclude pattern\n"
                   "  (shell wildcards, fnmatch on P, '*' crosses dots: --exclude '*.mlp.gate').\n"
                   "  Excluded by default: '*lm_head' and '*embed*' (--no-default-excludes drops\n"
                   "  them).  Every other tensor is copied unchanged with its dtype.\n"
                   "  nvfp4: P.weight U8 [N,K/2], P.weight_scale F8_E4M3 [N,K/16], P.weight_scale_2\n"
                   "  F32 [] (ModelOpt numerics; no input_scale).  mxfp4: P.weight U8 [N,K/2],\n"
                   "  P.weight_scale U8 [N,K/32] (E8M0); --mx-rule picks the block exponent\n"
                   "  (default even, as Quark; ocp = floor(log2 amax)-2; round-up = triton).\n"
                   "  --device: where the weights are quantized: gpu (CUDA device 0: each tensor\n"
                   "  is copied to the GPU, quantized by nb_quantize and copied back), cpu (the C\n"
                   "  reference), or auto (default: the GPU when there is one).  The bytes are\n"
                   "  the same either way; the summary says which ran.\n"
                   "  Tensors are streamed one at a time.  Progress on stderr when it is a\n"
                   "  terminal; --json prints a summary on stdout.\n"
                   "  Exit: 0 written, 1 usage, 3 I/O error, corrupt input, OUT not empty or\n"
                   "  --device gpu without a GPU.\n");
            free(excl);
            return 0;
        } else if (!strcmp(a, "--json")) json = 1;
        else if (!strcmp(a, "--no-default-excludes")) o.no_default_excludes = 1;
        else if ((!strcmp(a, "--format") || !strcmp(a, "--exclude") || !strcmp(a, "--mx-rule") ||
                  !strcmp(a, "--device")) &&
                 i + 1 < argc) {
            const char *v = argv[++i];
            if (!strcmp(a, "--format")) fmt = v;
            else if (!strcmp(a, "--mx-rule")) rule = v;
            else if (!strcmp(a, "--device")) device = v;
            else excl[nexcl++] = v;
        } else if (a[0] == '-' || (in && out)) {
            fprintf(stderr, "nibble quantize: unexpected argument '%s' (see --help)\n", a);
            free(excl);
            return 1;
        } else if (!in) in = a;
        else out = a;
    }
    int bad = 0;
    if (!in || !out) {
        fprintf(stderr, "nibble quantize: IN and OUT are required (see --help)\n");
        bad = 1;
    } else if (!fmt || (strcmp(fmt, "nvfp4") && strcmp(fmt, "mxfp4"))) {
        fprintf(stderr, "nibble quantize: --format nvfp4 or --format mxfp4 is required\n");
        bad = 1;
    } else if (rule && strcmp(fmt, "mxfp4")) {
        fprintf(stderr, "nibble quantize: --mx-rule applies to --format mxfp4 only\n");
        bad = 1;
    } else if (rule && strcmp(rule, "ocp") && strcmp(rule, "even") && strcmp(rule, "round-up")) {
        fprintf(stderr, "nibble quantize: --mx-rule must be ocp, even or round-up\n");
        bad = 1;
    } else if (device && nb_ckpt_device_parse(device, &o.device) != NB_OK) {
        fprintf(stderr, "nibble quantize: --device must be auto, cpu or gpu\n");
        bad = 1;
    }
    if (bad) {
        free(excl);
        return 1;
    }
    o.format = !strcmp(fmt, "nvfp4") ? NB_FORMAT_NVFP4 : NB_FORMAT_MXFP4;
    if (rule) o.mx_rule = !strcmp(rule, "ocp") ? NB_MX_SCALE_OCP : !strcmp(rule, "even") ? NB_MX_SCALE_EVEN
                                                                                        : NB_MX_SCALE_ROUND_UP;
    o.exclude = excl;
    o.nexclude = nexcl;
    if (isatty(2)) o.progress = quantize_progress;
    char err[1024] = "";
    nb_ckpt_quantize_summary s;
    double t0 = now_s();
    nb_status st = nb_ckpt_quantize(in, out, &o, &s, err, sizeof err);
    free(excl);
    if (st != NB_OK) {
        if (o.progress) fprintf(stderr, "\n");
        fprintf(stderr, "nibble quantize: %s: %s\n", nb_status_name(st), err);
        return 3;
    }
    double secs = now_s() - t0;
    if (json) {
        cJSON *j = cJSON_CreateObject();
        cJSON_AddStringToObject(j, "input", in);
        cJSON_AddStringToObject(j, "output", out);
        cJSON_AddStringToObject(j, "format", fmt);
        if (o.format == NB_FORMAT_MXFP4)
            cJSON_AddStringToObject(j, "mx_rule", o.mx_rule == NB_MX_SCALE_OCP ? "ocp"
                                                  : o.mx_rule == NB_MX_SCALE_EVEN ? "even" : "round-up");
        json_add_i64(j, "tensors_in", (int64_t)s.tensors_in);
        json_add_i64(j, "layers_quantized", (int64_t)s.layers_quantized);
        json_add_i64(j, "tensors_copied", (int64_t)s.tensors_copied);
        json_add_i64(j, "weights_excluded", (int64_t)s.weights_excluded);
        json_add_i64(j, "shards", (int64_t)s.shards);
        json_add_i64(j, "files_copied", (int64_t)s.files_copied);
        json_add_i64(j, "bytes_in", (int64_t)s.bytes_in);
        json_add_i64(j, "bytes_out", (int64_t)s.bytes_out);
        cJSON_AddStringToObject(j, "device", nb_ckpt_device_name(s.device));
        cJSON_AddStringToObject(j, "device_name", s.device_name);
        cJSON_AddNumberToObject(j, "seconds", secs);
        print_json(j);
    } else {
        printf("%s -> %s: %zu layers quantized (%s), %zu tensors copied, %zu float weights left unquantized, "
               "%zu files copied; %.1f MB -> %.1f MB in %.1f s on %s%s%s\n",
               in, out, s.layers_quantized, fmt, s.tensors_copied, s.weights_excluded, s.files_copied,
               s.bytes_in / 1e6, s.bytes_out / 1e6, secs,
               s.device == NB_CKPT_DEVICE_GPU ? "the GPU (" : "the CPU (C reference)",
               s.device == NB_CKPT_DEVICE_GPU ? s.device_name : "", s.device == NB_CKPT_DEVICE_GPU ? ")" : "");
    }
    return 0;
}

/* ---------------------------------------------------------------- convert */

static void convert_warn(void *user, const char *msg) {
    cJSON *arr = (cJSON *)user;
    if (arr) cJSON_AddItemToArray(arr, cJSON_CreateString(msg));
    fprintf(stderr, "%s%s\n", isatty(2) ? "\r\033[K" : "", msg);
}

/* A GGUF tensor left out by --skip-unsupported: listed on stderr and in --json. */
static void convert_skipped(void *user, const char *name, const char *type) {
    cJSON *arr = (cJSON *)user;
    if (arr) {
        cJSON *o = cJSON_CreateObject();
        cJSON_AddStringToObject(o, "name", name);
        cJSON_AddStringToObject(o, "type", type);
        cJSON_AddItemToArray(arr, o);
    }
    fprintf(stderr, "%sskipped: %s (%s)\n", isatty(2) ? "\r\033[K" : "", name, type);
}

static int cmd_convert(int argc, char **argv) {
    const char *in = NULL, *out = NULL, *to = NULL;
    int json = 0;
    nb_ckpt_convert_opts o;
    nb_ckpt_convert_opts_init(&o);
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (!strcmp(a, "--help") || !strcmp(a, "-h")) {
            printf("usage: nibble convert IN OUT --to modelopt|compressed-tensors|quark [--strict]\n"
                   "                      [--skip-unsupported] [--json]\n"
                   "  IN   a 4-bit checkpoint (.safetensors file, directory or index file) in\n"
                   "       ModelOpt NVFP4, compressed-tensors nvfp4/mxfp4, Quark MXFP4 or gpt-oss\n"
                   "       MXFP4 layout, or a GGUF file with MXFP4 / NVFP4 tensors.  It is only read.\n"
                   "  OUT  a directory that must not exist or be empty: one file per input file,\n"
                   "       the index when IN is sharded, config.json / hf_quant_config.json with the\n"
                   "       target's quantization config, every other file of IN's directory.\n"
                   "  Codes and block scales are copied byte for byte; tensors are renamed:\n"
                   "    modelopt            P.weight, P.weight_scale, P.weight_scale_2 [], P.input_scale []\n"
                   "    compressed-tensors  P.weight_packed, P.weight_scale, P.weight_global_scale [1]\n"
                   "                        (= 1/weight_scale_2), P.input_global_scale [1]\n"
                   "    quark               P.weight, P.weight_scale (MXFP4)\n"
                   "  NVFP4 converts between modelopt and compressed-tensors, MXFP4 between quark\n"
                   "  and compressed-tensors; gpt-oss MXFP4 experts become one layer per expert\n"
                   "  (P = ...experts.gate_up_proj -> ...experts.E.gate_up_proj.weight).  Anything\n"
                   "  else is refused with the reason.\n"
                   "  GGUF: OUT/model.safetensors with GGUF's tensor names (shapes row-major); a\n"
                   "  4-bit tensor T becomes layer P = T without \".weight\" (P.E per expert of a\n"
                   "  3-D tensor), NVFP4's P.scale / P.input_scale become its tensor / input\n"
                   "  scale; F32/F16/BF16/F64/integer tensors are copied; any other GGUF type\n"
                   "  (Q4_0, Q8_0, K-quants...) is refused with its name, or left out and listed\n"
                   "  with --skip-unsupported.  The GGUF metadata is not converted.\n"
                   "  A weight_scale_2 whose float reciprocal does not round-trip cannot be held\n"
                   "  exactly by compressed-tensors: a warning names it (--strict: exit 2).\n"
                   "  Progress on stderr when it is a terminal; warnings always on stderr;\n"
                   "  --json prints a summary (with the warnings) on stdout.\n"
                   "  Exit: 0 written, 1 usage, 2 refused by --strict, 3 unsupported, I/O error,\n"
                   "  corrupt input or OUT not empty.\n");
            return 0;
        } else if (!strcmp(a, "--json")) json = 1;
        else if (!strcmp(a, "--strict")) o.strict = 1;
        else if (!strcmp(a, "--skip-unsupported")) o.skip_unsupported = 1;
        else if (!strcmp(a, "--to") && i + 1 < argc) to = argv[++i];
        else if (a[0] == '-' || (in && out)) {
            fprintf(stderr, "nibble convert: unexpected argument '%s' (see --help)\n", a);
            return 1;
        } else if (!in) in = a;
        else out = a;
    }
    if (!in || !out) {
        fprintf(stderr, "nibble convert: IN and OUT are required (see --help)\n");
        return 1;
    }
    if (!to || nb_ckpt_target_parse(to, &o.target) != NB_OK) {
        fprintf(stderr, "nibble convert: --to modelopt, --to compressed-tensors or --to quark is required\n");
        return 1;
    }
    cJSON *warnings = json ? cJSON_CreateArray() : NULL, *skipped = json ? cJSON_CreateArray() : NULL;
    o.warn = convert_warn;
    o.warn_user = warnings;
    o.skipped = convert_skipped;
    o.skipped_user = skipped;
    if (isatty(2)) o.progress = quantize_progress;
    char err[1024] = "";
    nb_ckpt_convert_summary s;
    double t0 = now_s();
    nb_status st = nb_ckpt_convert(in, out, &o, &s, err, sizeof err);
    if (st != NB_OK) {
        if (o.progress) fprintf(stderr, "\n");
        fprintf(stderr, "nibble convert: %s: %s\n", nb_status_name(st), err);
        cJSON_Delete(warnings);
        cJSON_Delete(skipped);
        return o.strict && st == NB_ERR_UNSUPPORTED && strstr(err, "(strict)") ? 2 : 3;
    }
    double secs = now_s() - t0;
    if (json) {
        cJSON *j = cJSON_CreateObject();
        cJSON_AddStringToObject(j, "input", in);
        cJSON_AddStringToObject(j, "output", out);
        cJSON_AddStringToObject(j, "to", nb_ckpt_target_name(o.target));
        cJSON_AddStringToObject(j, "source", s.gguf ? "gguf" : "safetensors");
        json_add_i64(j, "tensors_in", (int64_t)s.tensors_in);
        json_add_i64(j, "tensors_out", (int64_t)s.tensors_out);
        json_add_i64(j, "layers_converted", (int64_t)s.layers_converted);
        json_add_i64(j, "layers_unchanged", (int64_t)s.layers_unchanged);
        json_add_i64(j, "experts_split", (int64_t)s.experts_split);
        json_add_i64(j, "layers_unquantized", (int64_t)s.layers_unquantized);
        json_add_i64(j, "tensors_copied", (int64_t)s.tensors_copied);
        cJSON *sc = cJSON_AddObjectToObject(j, "reciprocal_scales");
        json_add_i64(sc, "exact", (int64_t)s.scales_exact);
        json_add_i64(sc, "adjusted", (int64_t)s.scales_adjusted);
        json_add_i64(sc, "inexact", (int64_t)s.scales_inexact);
        json_add_i64(j, "shards", (int64_t)s.shards);
        json_add_i64(j, "files_copied", (int64_t)s.files_copied);
        json_add_i64(j, "bytes_in", (int64_t)s.bytes_in);
        json_add_i64(j, "bytes_out", (int64_t)s.bytes_out);
        if (s.gguf) {
            json_add_i64(j, "scale_bytes_remapped", (int64_t)s.scale_bytes_remapped);
            json_add_i64(j, "tensors_skipped", (int64_t)s.tensors_skipped);
            cJSON_AddItemToObject(j, "skipped", skipped);
            skipped = NULL;
        }
        cJSON_AddItemToObject(j, "warnings", warnings);
        cJSON_AddNumberToObject(j, "seconds", secs);
        print_json(j);
    } else {
        printf("%s -> %s (%s): %zu layers converted, %zu already in the layout, %zu experts split, %zu unquantized "
               "layers; reciprocal scales %zu exact, %zu adjusted, %zu inexact; %zu tensors -> %zu, %zu files copied; "
               "%.1f MB -> %.1f MB in %.1f s\n",
               in, out, nb_ckpt_target_name(o.target), s.layers_converted, s.layers_unchanged, s.experts_split,
               s.layers_unquantized, s.scales_exact, s.scales_adjusted, s.scales_inexact, s.tensors_in, s.tensors_out,
               s.files_copied, s.bytes_in / 1e6, s.bytes_out / 1e6, secs);
        if (s.gguf)
            printf("  from GGUF: %zu tensors left out (--skip-unsupported), %zu NVFP4 scale bytes remapped\n",
                   s.tensors_skipped, s.scale_bytes_remapped);
    }
    cJSON_Delete(skipped);
    return 0;
}
#else
static int cmd_quantize(int argc, char **argv) {
    (void)argc;
    (void)argv;
    fprintf(stderr, "nibble quantize: unavailable: this nibble was built without the checkpoint module "
                    "(nibble_io needs cJSON: install libcjson-dev and rebuild)\n");
    return 3;
}
static int cmd_convert(int argc, char **argv) {
    (void)argc;
    (void)argv;
    fprintf(stderr, "nibble convert: unavailable: this nibble was built without the checkpoint module "
                    "(nibble_io needs cJSON: install libcjson-dev and rebuild)\n");
    return 3;
}
static int cmd_inspect(int argc, char **argv) {
    (void)argc;
    (void)argv;
    fprintf(stderr, "nibble inspect: unavailable: this nibble was built without the checkpoint module "
                    "(nibble_io needs cJSON: install libcjson-dev and rebuild)\n");
    return 3;
}
#endif

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
    if (!strcmp(c, "inspect")) return cmd_inspect(argc - 1, argv + 1);
    if (!strcmp(c, "quantize")) return cmd_quantize(argc - 1, argv + 1);
    if (!strcmp(c, "convert")) return cmd_convert(argc - 1, argv + 1);
    fprintf(stderr, "nibble: unknown command '%s'\n", c);
    usage(stderr);
    return 1;
}
