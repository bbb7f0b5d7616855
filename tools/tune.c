/* tune.c - `nibble tune`: measure every configuration nb_gemm can run for
 * each layer, format and m, and write the fastest to a tuning cache that
 * nb_gemm then follows (nb_context_load_tuning, NIBBLE_TUNE_CACHE).
 *
 * For each problem the library lists its candidates (nb_gemm_list_configs:
 * the heuristic's choice first, then the alternatives of one table in
 * src/plan.c, so the tool and the planner agree on what can run).  Each
 * candidate is given with the call (nb_gemm_ex, which bypasses NIBBLE_PATH
 * and the table), run once on poisoned output and compared element
 * by element with the heuristic's output on the same input (a candidate
 * that differs is reported and never recorded), then timed as `nibble
 * bench` times (benchlib.h: CUDA graph over weight copies rotated past L2,
 * median of replays; with --between each call after a small cuBLAS kernel,
 * nbt_between).  The fastest is recorded unless it is within 3% of
 * the heuristic's time (noise), in which case the heuristic's configuration
 * is.  The cache file is read first (entries for other layers and GPUs are
 * kept) and rewritten atomically after each layer and format; NIBBLE_TUNE_CACHE
 * names it when --out does not. */
#define _POSIX_C_SOURCE 200809L
#include "nibble.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "benchlib.h"
#include "cli.h"

#include <unistd.h>

static void help(void) {
    printf("usage: nibble tune [--shapes KxN,...] [--m 1,4,...] [--formats nvfp4,mxfp4] [--act bf16|f16]\n"
           "                   [--out FILE] [--min-bytes MB] [--sustain S] [--all] [--between]\n"
           "  For each layer k -> n, format and m: times every kernel configuration nb_gemm can run\n"
           "  (decode kernel: warps per row block, k splits, staged activations and their CTA's\n"
           "  8 or 12 warps at 17..24 tokens; Hopper tensor-core\n"
           "  kernel: tile width, k split, raster group, whole tiles or the stream-K grid; the\n"
           "  mma.sync kernel on other GPUs: tile width, raster group), each checked\n"
           "  against the heuristic's output first, and writes the fastest per (GPU, format, dtype,\n"
           "  n, k, m bucket) to FILE, merged with the entries already there.  nb_gemm follows the\n"
           "  file when NIBBLE_TUNE_CACHE names it or after nb_context_load_tuning; `nibble bench\n"
           "  --tune-cache FILE` shows the effect.  --all also prints every candidate's time.\n"
           "  --between times each call after a small cuBLAS kernel (its own time taken off), as a\n"
           "  model step runs its linears after other kernels; without it calls run back to back.\n"
           "  --sustain S replays each candidate's graph S seconds (0..60) without a pause before\n"
           "  timing it (the clocks of sustained work, lower where the GPU reaches its power limit).\n"
           "  An entry serves its whole m bucket: 1, 2, 3-4, 5-8, ..., 2049-4096, 4097+.\n"
           "  defaults: --shapes 8192x8192,8192x57344,28672x8192,4096x6144,4096x4096\n"
           "            --m 1,4,16,32,64,128,256,1024 --formats nvfp4,mxfp4 --act bf16 --min-bytes 240\n"
           "            --out $NIBBLE_TUNE_CACHE, or nibble-tune.json when it is not set\n"
           "  Exit: 0 written, 1 usage, 2 a candidate's output differed (not recorded; the rest is\n"
           "  written), 3 no GPU, a library, CUDA or file error.\n");
}

/* A run: options, context, stream, the shared workspace, progress. */
typedef struct tune {
    nbt_sweep sw;
    const char *out;
    nb_context *ctx;
    cudaStream_t s;
    void *dws;
    size_t ws_bytes;
    int tty;
    int all; /* --all: every candidate's time, not only the winner */
    int between; /* --between: each call after a small foreign kernel (benchlib.h, nbt_between) */
    nbt_between bw;
    int problems, done;
    int rc; /* 2 once a candidate failed or differed */
} tune;

/* One problem: a layer in one format at one m, with its activations and
 * output buffers (device and host). */
typedef struct tune_problem {
    int64_t k, n, m;
    const char *fname;
    int rounded; /* integer or table format (same_output) */
    const nbt_layer *L;
    void *dx, *dy;
    uint16_t *href, *hy;
    nb_gemm_desc g;
} tune_problem;

/* Stage 1: the options and the sweep (m values in distinct buckets):
 * 0 to go on, -1 after --help, 1 on a usage error. */
static int tune_parse(tune *t, int argc, char **argv) {
    nba_opt o[NBT_SWEEP_OPTS + 3] = {{.name = "--out", .kind = NBA_STRING, .dst = &t->out},
                                     {.name = "--all", .kind = NBA_FLAG, .dst = &t->all},
                                     {.name = "--between", .kind = NBA_FLAG, .dst = &t->between}};
    nbt_sweep_opts(&t->sw, "--act", o + 3);
    const int rc = nba_parse("tune", argc, argv, o, sizeof o / sizeof o[0], NULL, help);
    if (rc) return rc;
    if (!nbt_sweep_parse(&t->sw, "tune")) return 1;
    for (int i = 0; i < t->sw.nm; i++)
        for (int j = 0; j < i; j++) {
            int64_t lo, hi, lo2, hi2;
            NB(nb_tuning_m_bucket(t->sw.ms[i], &lo, &hi));
            NB(nb_tuning_m_bucket(t->sw.ms[j], &lo2, &hi2));
            if (lo == lo2)
                return nba_usage("tune", "--m: %lld and %lld share the bucket %lld..%lld; give one of them",
                                 (long long)t->sw.ms[j], (long long)t->sw.ms[i], (long long)lo, (long long)hi);
        }
    return 0;
}

/* Stage 2: the context, the cache merged in (a malformed file stops us here,
 * before minutes of measuring), the stream, the header lines. */
static void tune_setup(tune *t) {
    nb_device_info info;
    NB(nb_context_create(0, &t->ctx));
    NB(nb_context_device_info(t->ctx, &info));
    if (access(t->out, F_OK) == 0) NB(nb_context_load_tuning(t->ctx, t->out));
    size_t all, mine;
    NB(nb_context_tuning_count(t->ctx, &all, &mine));
    CK(cudaStreamCreateWithFlags(&t->s, cudaStreamNonBlocking));
    t->tty = isatty(fileno(stderr));
    printf("nibble tune: %s (%d SMs), %s activations, cache %s (%zu entries, %zu for this GPU)\n", info.name,
           info.sm_count, t->sw.act == NB_DTYPE_BF16 ? "bf16" : "f16", t->out, all, mine);
    if (t->between) {
        nbt_between_init(&t->bw, t->s);
        printf("nibble tune: each call after a cuBLAS kernel (%.2f us alone, taken off the times)\n", t->bw.alone_us);
    }
    printf("%-7s %-6s %-13s %5s %-9s %5s %12s %10s %6s  %s\n", "#", "format", "layer k->n", "m", "bucket", "tried",
           "heuristic-us", "tuned-us", "gain", "chosen");
    fflush(stdout);
    t->problems = t->sw.nkn / 2 * t->sw.nf * t->sw.nm;
}

/* Candidate c of problem p, given with each call (nb_gemm_ex): run once on
 * poisoned output and compared with the heuristic's (candidate 0, which
 * sets *big and fills p->href), then timed.  The median us, or -1 when the
 * candidate failed or differed (reported, rc = 2); the heuristic itself
 * failing is fatal (exit 3, or 2 for non-finite output). */
static double tune_candidate(tune *t, tune_problem *p, const nb_gemm_config *cand, size_t c, float *big) {
    const size_t outs = (size_t)(p->m * p->n);
    size_t need;
    NB(nb_gemm_workspace_size_ex(t->ctx, &p->g, cand, &need));
    if (need > t->ws_bytes) {
        if (t->dws) CK(cudaFree(t->dws));
        CK(cudaMalloc(&t->dws, need));
        CK(cudaMemset(t->dws, 0, need));
        t->ws_bytes = need;
    }
    CK(cudaMemsetAsync(p->dy, 0xFF, 2 * outs, t->s)); /* NaN: an unwritten element fails */
    nb_status st = nb_gemm_ex(t->ctx, &p->g, cand, p->dx, p->L->pk[0], NULL, p->dy, t->dws, t->ws_bytes, t->s);
    char text[96], cfg[256] = "", why[160] = "";
    nbt_config_text(cand, text, sizeof text);
    if (st == NB_OK) NB(nb_gemm_last_config(t->ctx, cfg, sizeof cfg));
    if (st != NB_OK || !strstr(cfg, " (given)")) {
        fprintf(stderr, "%snibble tune: %s %lld->%lld m=%lld, %s: %s\n", t->tty ? "\n" : "", p->fname, (long long)p->k,
                (long long)p->n, (long long)p->m, text, st ? nb_last_error() : "the configuration was not applied");
        t->rc = 2;
        if (c == 0) exit(3); /* the heuristic's own configuration */
        return -1.0;
    }
    CK(cudaMemcpyAsync(c ? p->hy : p->href, p->dy, 2 * outs, cudaMemcpyDeviceToHost, t->s));
    CK(cudaStreamSynchronize(t->s));
    const nb_dtype act = t->sw.act;
    if (c == 0) {
        for (size_t i = 0; i < outs; i++) {
            const float v = fabsf(nbt_float_of(act, p->href[i]));
            *big = v > *big ? v : *big;
            if (!isfinite(v)) {
                fprintf(stderr, "%snibble tune: %s %lld->%lld m=%lld: the heuristic's output has a non-finite element "
                        "(%zu)\n", t->tty ? "\n" : "", p->fname, (long long)p->k, (long long)p->n, (long long)p->m, i);
                exit(2);
            }
        }
    } else if (!nbt_same_output(act, p->hy, p->href, outs, *big, p->rounded, why, sizeof why)) {
        fprintf(stderr, "%snibble tune: WRONG RESULT %s %lld->%lld m=%lld, %s (%s): %s; not recorded\n",
                t->tty ? "\n" : "", p->fname, (long long)p->k, (long long)p->n, (long long)p->m, text, cfg, why);
        t->rc = 2;
        return -1.0;
    }
    /* about 2 ms of work per graph, 7 replays: a few ms per candidate */
    const int calls = nbt_graph_calls(p->m, p->n, p->k, p->L->sz.packed_bytes, p->L->rot, 2000.0, 2, 40);
    return nbt_time_gemm_after(t->ctx, &p->g, cand, p->dx, p->L, p->dy, t->dws, t->ws_bytes, t->s, calls, 7,
                               t->between ? &t->bw : NULL);
}

/* The row of a tuned problem: progress, bucket, times, gain, choice. */
static void tune_print(const tune *t, const tune_problem *p, size_t tried, double us0, double us_best,
                       const nb_gemm_config *best, int heuristic) {
    char text[96], layer[40], bucket[32], progress[32];
    int64_t lo, hi;
    NB(nb_tuning_m_bucket(p->m, &lo, &hi));
    if (lo == hi) snprintf(bucket, sizeof bucket, "%lld", (long long)lo);
    else if (hi == INT64_MAX) snprintf(bucket, sizeof bucket, "%lld+", (long long)lo);
    else snprintf(bucket, sizeof bucket, "%lld-%lld", (long long)lo, (long long)hi);
    nbt_config_text(best, text, sizeof text);
    snprintf(layer, sizeof layer, "%lld->%lld", (long long)p->k, (long long)p->n);
    snprintf(progress, sizeof progress, "%d/%d", t->done, t->problems);
    if (t->tty) fprintf(stderr, "\r%60s\r", "");
    printf("%-7s %-6s %-13s %5lld %-9s %5zu %12.2f %10.2f %5.2fx  %s%s\n", progress, p->fname, layer, (long long)p->m,
           bucket, tried, us0, us_best, us0 / us_best, text, heuristic ? " (heuristic)" : "");
    fflush(stdout);
}

/* Stage 4: one problem - every candidate the library lists, the fastest
 * recorded unless within 3% (noise) of the heuristic's time. */
static void tune_one(tune *t, tune_problem *p) {
    NB(nb_gemm_desc_init(&p->g, &p->L->packed, p->m, t->sw.act, t->sw.act));
    size_t nc = 0;
    NB(nb_gemm_list_configs(t->ctx, &p->g, NULL, 0, &nc));
    nb_gemm_config *cand = nbt_calloc(nc, sizeof *cand);
    double *us = nbt_calloc(nc, sizeof *us);
    NB(nb_gemm_list_configs(t->ctx, &p->g, cand, nc, &nc));
    t->done++;
    float big = 0.0f; /* largest |output| of the heuristic */
    for (size_t c = 0; c < nc; c++) {
        if (t->tty)
            fprintf(stderr, "\r[%d/%d] %s %lld->%lld m=%lld: candidate %zu/%zu  ", t->done, t->problems, p->fname,
                    (long long)p->k, (long long)p->n, (long long)p->m, c + 1, nc);
        us[c] = tune_candidate(t, p, &cand[c], c, &big);
    }
    size_t best = 0;
    for (size_t c = 1; c < nc; c++)
        if (us[c] >= 0 && us[c] < us[best]) best = c;
    if (us[best] > 0.97 * us[0]) best = 0; /* within noise of the heuristic: keep its choice */
    NB(nb_context_set_tuning(t->ctx, &p->g, &cand[best], us[best]));
    tune_print(t, p, nc, us[0], us[best], &cand[best], best == 0);
    for (size_t c = 0; t->all && c < nc; c++) {
        char text[96];
        nbt_config_text(&cand[c], text, sizeof text);
        if (us[c] >= 0) printf("        candidate %-38s %10.2f us %6.3f of the heuristic's\n", text, us[c], us[c] / us[0]);
        else printf("        candidate %-38s failed\n", text);
    }
    free(cand);
    free(us);
}

/* Stage 3: one layer k -> n - its activations and output buffers, then per
 * format the layer and every m; the cache is rewritten after each format
 * (progress survives an interrupted run). */
static void tune_shape(tune *t, int64_t k, int64_t n) {
    const int64_t mmax = t->sw.mmax;
    tune_problem p;
    memset(&p, 0, sizeof p);
    p.k = k;
    p.n = n;
    p.dx = nbt_device_activations(t->sw.act, (size_t)(mmax * k));
    p.href = nbt_calloc((size_t)(mmax * n), 2);
    p.hy = nbt_calloc((size_t)(mmax * n), 2);
    CK(cudaMalloc(&p.dy, 2 * (size_t)(mmax * n)));
    for (int fi = 0; fi < t->sw.nf; fi++) {
        nbt_layer L;
        nb_format_info info;
        NB(nb_format_get_info(t->sw.fmts[fi], &info));
        nbt_layer_make(t->ctx, t->sw.fmts[fi], n, k, t->sw.min_mb, t->s, &L);
        p.fname = info.name;
        p.rounded = info.element != NB_ELEMENT_E2M1;
        p.L = &L;
        for (int mi = 0; mi < t->sw.nm; mi++) {
            p.m = t->sw.ms[mi];
            tune_one(t, &p);
        }
        nbt_layer_free(&L);
        NB(nb_context_save_tuning(t->ctx, t->out)); /* after every layer and format: progress survives */
    }
    free(p.href);
    free(p.hy);
    CK(cudaFree(p.dx));
    CK(cudaFree(p.dy));
}

int nb_cli_tune(int argc, char **argv) {
    nbt_tool = "nibble tune";
    tune t = {.sw = {.shapes = "8192x8192,8192x57344,28672x8192,4096x6144,4096x4096", .m = "1,4,16,32,64,128,256,1024",
                     .formats = "nvfp4,mxfp4", .act_name = "bf16", .min_mb = 240 /* as nibble bench */}};
    t.out = getenv("NIBBLE_TUNE_CACHE");
    if (!t.out || !t.out[0]) t.out = "nibble-tune.json";
    int rc = tune_parse(&t, argc, argv);
    if (rc) return rc < 0 ? 0 : rc;
    if (!nbt_have_device()) return 3;
    tune_setup(&t);
    const double start = nb_cli_now();
    for (int si = 0; si < t.sw.nkn; si += 2) tune_shape(&t, t.sw.kn[si], t.sw.kn[si + 1]);
    size_t all, mine;
    NB(nb_context_tuning_count(t.ctx, &all, &mine));
    printf("nibble tune: wrote %s (%zu entries, %zu for this GPU) in %.0f s%s\n", t.out, all, mine,
           nb_cli_now() - start, t.rc ? "; some candidates failed (see above), not recorded" : "");
    if (t.dws) CK(cudaFree(t.dws));
    if (t.between) nbt_between_free(&t.bw);
    CK(cudaStreamDestroy(t.s));
    NB(nb_context_destroy(t.ctx));
    return t.rc;
}
