/* tune.c - `nibble tune`: measure every configuration nb_gemm can run for
 * each layer, format and m, and write the fastest to a tuning cache that
 * nb_gemm then follows (nb_context_load_tuning, NIBBLE_TUNE_CACHE).
 *
 * For each problem the library lists its candidates (nb_gemm_list_configs:
 * the heuristic's choice first, then the alternatives of one table in
 * src/tune.c, so the tool and the dispatcher agree on what can run).  Each
 * candidate is installed as the table entry for the problem
 * (nb_context_set_tuning), run once on poisoned output and compared element
 * by element with the heuristic's output on the same input (a candidate
 * that differs is reported and never recorded), then timed as `nibble
 * bench` times (benchlib.h: CUDA graph over weight copies rotated past L2,
 * median of replays).  The fastest is recorded unless it is within 3% of
 * the heuristic's time (noise), in which case the heuristic's configuration
 * is.  The cache file is read first (entries for other layers and GPUs are
 * kept) and rewritten atomically after each layer and format.
 *
 * The NIBBLE_* knobs and NIBBLE_TUNE_CACHE are ignored (unset for this
 * process): the knobs would override every candidate, and the baseline must
 * be the heuristic. */
#define _POSIX_C_SOURCE 200809L
#include "nibble.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "benchlib.h"

#include <time.h>
#include <unistd.h>

static void help(void) {
    printf("usage: nibble tune [--shapes KxN,...] [--m 1,4,...] [--formats nvfp4,mxfp4] [--act bf16|f16]\n"
           "                   [--out FILE] [--min-bytes MB]\n"
           "  For each layer k -> n, format and m: times every kernel configuration nb_gemm can run\n"
           "  (decode kernel: warps per row block, k splits, staged activations; Hopper tensor-core\n"
           "  kernel, or the mma.sync kernel on other GPUs: tile width, raster group), each checked\n"
           "  against the heuristic's output first, and writes the fastest per (GPU, format, dtype,\n"
           "  n, k, m bucket) to FILE, merged with the entries already there.  nb_gemm follows the\n"
           "  file when NIBBLE_TUNE_CACHE names it or after nb_context_load_tuning; `nibble bench\n"
           "  --tune-cache FILE` shows the effect.\n"
           "  An entry serves its whole m bucket: 1, 2, 3-4, 5-8, ..., 2049-4096, 4097+.\n"
           "  defaults: --shapes 8192x8192,8192x57344,28672x8192,4096x6144,4096x4096\n"
           "            --m 1,4,16,32,64,128,256,1024 --formats nvfp4,mxfp4 --act bf16 --min-bytes 240\n"
           "            --out $NIBBLE_TUNE_CACHE, or nibble-tune.json when it is not set\n"
           "  Exit: 0 written, 1 usage, 2 a candidate's output differed (not recorded; the rest is\n"
           "  written), 3 no GPU, a library, CUDA or file error.\n");
}

/* Candidate output a against the heuristic's b (largest |b|: big): each
 * element within two units in the last place of the output type (at most
 * 2^(2 - significand bits) of its magnitude) plus 2^-12 big: different k
 * splits sum in a different order before the rounding. */
static int same_output(nb_dtype t, const uint16_t *a, const uint16_t *b, size_t count, float big, char *why,
                       size_t wn) {
    const float rel = t == NB_DTYPE_BF16 ? 0x1p-6f : 0x1p-9f, floor_ = big * 0x1p-12f;
    for (size_t i = 0; i < count; i++) {
        const float x = nbt_float_of(t, a[i]), y = nbt_float_of(t, b[i]);
        if (!(fabsf(x - y) <= rel * fmaxf(fabsf(x), fabsf(y)) + floor_)) {
            snprintf(why, wn, "element %zu is %g, the heuristic's %g", i, x, y);
            return 0;
        }
    }
    return 1;
}

static void config_text(const nb_gemm_config *c, char *buf, size_t n) {
    if (c->path == NB_GEMM_PATH_TENSOR_CORE || c->path == NB_GEMM_PATH_MMA)
        snprintf(buf, n, "%s bn=%d splits=%d raster=%d", c->path == NB_GEMM_PATH_MMA ? "mma" : "tc", c->bn,
                 c->splits ? c->splits : 1, c->raster);
    else if (c->variant) snprintf(buf, n, "decode staged rpw=%d splits=%d", c->rpw, c->splits);
    else snprintf(buf, n, "decode kw=%d splits=%d", c->kw, c->splits);
}

int nb_cli_tune(int argc, char **argv) {
    nbt_tool = "nibble tune";
    nbt_sweep sw = {.shapes = "8192x8192,8192x57344,28672x8192,4096x6144,4096x4096", .m = "1,4,16,32,64,128,256,1024",
                    .formats = "nvfp4,mxfp4", .act = NB_DTYPE_BF16, .min_mb = 240 /* as nibble bench */};
    const char *out = getenv("NIBBLE_TUNE_CACHE");
    if (!out || !out[0]) out = "nibble-tune.json";
    for (int i = 1; i < argc; i++) {
        const int taken = nbt_sweep_arg(&sw, "--act", argc, argv, &i);
        if (taken < 0) return 1;
        if (taken) continue;
        if (!strcmp(argv[i], "--help") || !strcmp(argv[i], "-h")) {
            help();
            return 0;
        } else if (i + 1 < argc && !strcmp(argv[i], "--out")) out = argv[++i];
        else {
            fprintf(stderr, "nibble tune: unknown option '%s' (see --help)\n", argv[i]);
            return 1;
        }
    }
    if (!nbt_sweep_parse(&sw)) return 1;
    for (int i = 0; i < sw.nm; i++)
        for (int j = 0; j < i; j++) {
            int64_t lo, hi, lo2, hi2;
            nb_tuning_m_bucket(sw.ms[i], &lo, &hi);
            nb_tuning_m_bucket(sw.ms[j], &lo2, &hi2);
            if (lo == lo2) {
                fprintf(stderr, "nibble tune: m = %lld and %lld share the bucket %lld..%lld; give one of them\n",
                        (long long)sw.ms[j], (long long)sw.ms[i], (long long)lo, (long long)hi);
                return 1;
            }
        }
    static const char *const knobs[] = {"NIBBLE_PATH", "NIBBLE_KW",     "NIBBLE_SPLITS", "NIBBLE_XS",        "NIBBLE_RPW",
                                        "NIBBLE_BN",   "NIBBLE_RASTER", "NIBBLE_STAGES", "NIBBLE_TUNE_CACHE"};
    for (size_t i = 0; i < sizeof knobs / sizeof knobs[0]; i++)
        if (getenv(knobs[i])) {
            if (i + 1 < sizeof knobs / sizeof knobs[0])
                fprintf(stderr, "nibble tune: ignoring %s (the candidates are set per problem)\n", knobs[i]);
            unsetenv(knobs[i]);
        }
    if (!nbt_have_device()) return 3;
    const nb_dtype act = sw.act;
    nb_context *ctx;
    NB(nb_context_create(0, &ctx));
    nb_device_info info;
    NB(nb_context_device_info(ctx, &info));
    /* merge: start from the file's entries (a malformed file stops us here,
     * before minutes of measuring) */
    if (access(out, F_OK) == 0) NB(nb_context_load_tuning(ctx, out));
    size_t all, mine;
    NB(nb_context_tuning_count(ctx, &all, &mine));
    cudaStream_t s;
    CK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
    const int tty = isatty(fileno(stderr));
    printf("nibble tune: %s (%d SMs), %s activations, cache %s (%zu entries, %zu for this GPU)\n", info.name,
           info.sm_count, act == NB_DTYPE_BF16 ? "bf16" : "f16", out, all, mine);
    printf("%-7s %-6s %-13s %5s %-9s %5s %12s %10s %6s  %s\n", "#", "format", "layer k->n", "m", "bucket", "tried",
           "heuristic-us", "tuned-us", "gain", "chosen");
    fflush(stdout);
    const int problems = sw.nkn / 2 * sw.nf * sw.nm;
    int done = 0, rc = 0;
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    const double start = ts.tv_sec + ts.tv_nsec * 1e-9;
    void *dws = NULL;
    size_t ws_bytes = 0;
    const int64_t mmax = sw.mmax;
    for (int si = 0; si < sw.nkn; si += 2) {
        const int64_t k = sw.kn[si], n = sw.kn[si + 1];
        uint16_t *hx = nbt_random_activations(act, (size_t)(mmax * k));
        uint16_t *href = malloc(2 * (size_t)(mmax * n)), *hy = malloc(2 * (size_t)(mmax * n));
        void *dx, *dy;
        CK(cudaMalloc(&dx, 2 * (size_t)(mmax * k)));
        CK(cudaMalloc(&dy, 2 * (size_t)(mmax * n)));
        CK(cudaMemcpy(dx, hx, 2 * (size_t)(mmax * k), cudaMemcpyHostToDevice));
        for (int fi = 0; fi < sw.nf; fi++) {
            nbt_layer L;
            nbt_layer_make(ctx, sw.fmts[fi], n, k, sw.min_mb, s, &L);
            const char *fname = sw.fmts[fi] == NB_FORMAT_NVFP4 ? "nvfp4" : "mxfp4";
            for (int mi = 0; mi < sw.nm; mi++) {
                const int64_t m = sw.ms[mi];
                const size_t outs = (size_t)(m * n);
                nb_gemm_desc g;
                NB(nb_gemm_desc_init(&g, &L.packed, m, act, act));
                size_t nc = 0;
                NB(nb_gemm_list_configs(ctx, &g, NULL, 0, &nc));
                nb_gemm_config *cand = calloc(nc, sizeof *cand);
                double *us = calloc(nc, sizeof *us);
                NB(nb_gemm_list_configs(ctx, &g, cand, nc, &nc));
                done++;
                float big = 0.0f; /* largest |output| of the heuristic */
                for (size_t c = 0; c < nc; c++) {
                    if (tty)
                        fprintf(stderr, "\r[%d/%d] %s %lld->%lld m=%lld: candidate %zu/%zu  ", done, problems, fname,
                                (long long)k, (long long)n, (long long)m, c + 1, nc);
                    us[c] = -1.0; /* not usable */
                    NB(nb_context_set_tuning(ctx, &g, &cand[c], 0.0));
                    size_t need;
                    NB(nb_gemm_workspace_size(ctx, &g, &need));
                    if (need > ws_bytes) {
                        if (dws) CK(cudaFree(dws));
                        CK(cudaMalloc(&dws, need));
                        CK(cudaMemset(dws, 0, need));
                        ws_bytes = need;
                    }
                    CK(cudaMemsetAsync(dy, 0xFF, 2 * outs, s)); /* NaN: an unwritten element fails */
                    nb_status st = nb_gemm(ctx, &g, dx, L.pk[0], NULL, dy, dws, ws_bytes, s);
                    char text[96], cfg[256] = "", why[160] = "";
                    config_text(&cand[c], text, sizeof text);
                    if (st == NB_OK) nb_gemm_last_config(ctx, cfg, sizeof cfg);
                    if (st != NB_OK || !strstr(cfg, " tuned")) {
                        fprintf(stderr, "%snibble tune: %s %lld->%lld m=%lld, %s: %s\n", tty ? "\n" : "", fname,
                                (long long)k, (long long)n, (long long)m, text,
                                st ? nb_last_error() : "the table entry was not applied");
                        rc = 2;
                        if (c == 0) return 3; /* the heuristic's own configuration */
                        continue;
                    }
                    CK(cudaMemcpyAsync(c ? hy : href, dy, 2 * outs, cudaMemcpyDeviceToHost, s));
                    CK(cudaStreamSynchronize(s));
                    if (c == 0) {
                        for (size_t i = 0; i < outs; i++) {
                            const float v = fabsf(nbt_float_of(act, href[i]));
                            big = v > big ? v : big;
                            if (!isfinite(v)) {
                                fprintf(stderr, "%snibble tune: %s %lld->%lld m=%lld: the heuristic's output has a "
                                        "non-finite element (%zu)\n", tty ? "\n" : "", fname, (long long)k,
                                        (long long)n, (long long)m, i);
                                return 2;
                            }
                        }
                    } else if (!same_output(act, hy, href, outs, big, why, sizeof why)) {
                        fprintf(stderr, "%snibble tune: WRONG RESULT %s %lld->%lld m=%lld, %s (%s): %s; not recorded\n",
                                tty ? "\n" : "", fname, (long long)k, (long long)n, (long long)m, text, cfg, why);
                        rc = 2;
                        continue;
                    }
                    /* about 2 ms of work per graph, 7 replays: a few ms per candidate */
                    const int calls = nbt_graph_calls(m, n, k, L.sz.packed_bytes, L.rot, 2000.0, 2, 40);
                    us[c] = nbt_time_gemm(ctx, &g, dx, &L, dy, dws, ws_bytes, s, calls, 7);
                }
                size_t best = 0;
                for (size_t c = 1; c < nc; c++)
                    if (us[c] >= 0 && us[c] < us[best]) best = c;
                if (us[best] > 0.97 * us[0]) best = 0; /* within noise of the heuristic: keep its choice */
                NB(nb_context_set_tuning(ctx, &g, &cand[best], us[best]));
                char text[96], layer[40];
                int64_t lo, hi;
                nb_tuning_m_bucket(m, &lo, &hi);
                char bucket[32];
                if (lo == hi) snprintf(bucket, sizeof bucket, "%lld", (long long)lo);
                else if (hi == INT64_MAX) snprintf(bucket, sizeof bucket, "%lld+", (long long)lo);
                else snprintf(bucket, sizeof bucket, "%lld-%lld", (long long)lo, (long long)hi);
                config_text(&cand[best], text, sizeof text);
                snprintf(layer, sizeof layer, "%lld->%lld", (long long)k, (long long)n);
                char progress[32];
                snprintf(progress, sizeof progress, "%d/%d", done, problems);
                if (tty) fprintf(stderr, "\r%60s\r", "");
                printf("%-7s %-6s %-13s %5lld %-9s %5zu %12.2f %10.2f %5.2fx  %s%s\n", progress, fname, layer,
                       (long long)m, bucket, nc, us[0], us[best], us[0] / us[best], text,
                       best == 0 ? " (heuristic)" : "");
                fflush(stdout);
                free(cand);
                free(us);
            }
            nbt_layer_free(&L);
            NB(nb_context_save_tuning(ctx, out)); /* after every layer and format: progress survives */
        }
        free(hx);
        free(href);
        free(hy);
        CK(cudaFree(dx));
        CK(cudaFree(dy));
    }
    clock_gettime(CLOCK_MONOTONIC, &ts);
    NB(nb_context_tuning_count(ctx, &all, &mine));
    printf("nibble tune: wrote %s (%zu entries, %zu for this GPU) in %.0f s%s\n", out, all, mine,
           ts.tv_sec + ts.tv_nsec * 1e-9 - start, rc ? "; some candidates failed (see above), not recorded" : "");
    if (dws) CK(cudaFree(dws));
    CK(cudaStreamDestroy(s));
    nb_context_destroy(ctx);
    return rc;
}
