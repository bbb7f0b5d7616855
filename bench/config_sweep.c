/* config_sweep.c - every configuration nb_gemm can run for a layer at one
 * exact m, timed: what `nibble tune --all` does per m bucket, but for each
 * m given and with more k splits, to see where the planner's rules stand
 * between buckets (the data behind plan.c's decode-range rules).
 *
 *   config_sweep --format nvfp4 --shapes KxN,... --m 12,16,... [--min-bytes MB] [--between] [--heuristic]
 *
 * Per (layer, m): the heuristic's time and configuration, then each
 * candidate's time: nb_gemm_list_configs' list, plus the staged decode
 * kernel (one and two row blocks per warp) at 3, 5, 6, 7, 8, 12, 16,
 * kchunks / 4 and kchunks / 6 splits and at those that put one, two or
 * three CTAs on every SM, and the tensor-core tiles of 16, 32
 * (m <= 32) and 64 tokens at 1..4 splits; configurations this device or
 * build cannot run are left out.  Every candidate runs first on poisoned
 * output and is compared with the heuristic's as `nibble tune` compares
 * (nbt_same_output; exit 2 if one differs).  Timing as `nibble bench`
 * (tools/benchlib.h): CUDA graphs over rotated weight copies, median of
 * replays; with --between each call is followed by a small cuBLAS kernel
 * (as `nibble bench --sequence --between`: a model's norms and
 * activations, which take no programmatic dependent launch) and the time
 * of those kernels alone is subtracted, so a configuration is not credited
 * with starting while the previous call of the same layer finishes;
 * --heuristic times the heuristic's plan alone (two libraries' plans
 * compared layer by layer).  Exit: 0 measured, 1 usage, 2 a candidate's output differed, 3
 * no GPU or a library / CUDA error. */
#include "args.h"
#include "benchlib.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* Y of one call under cfg (NULL: the heuristic) on poisoned output (NaN:
 * an unwritten element fails the comparison), in hy; the call's status (a
 * configuration this device or build cannot run is not an error here). */
static nb_status run_once(nb_context *ctx, const nb_gemm_desc *g, const nb_gemm_config *cfg, const void *x,
                          const void *w, void *y, void *ws, size_t wsb, cudaStream_t s, size_t count, uint16_t *hy) {
    CK(cudaMemsetAsync(y, 0xFF, count * 2, s));
    const nb_status st = nb_gemm_ex(ctx, g, cfg, x, w, NULL, y, ws, wsb, s);
    if (st) return st;
    CK(cudaStreamSynchronize(s));
    CK(cudaMemcpy(hy, y, count * 2, cudaMemcpyDeviceToHost));
    return NB_OK;
}

static void help(void) {
    printf("usage: config_sweep --format F --shapes KxN,... --m M,... [--min-bytes MB] [--between] [--heuristic]\n"
           "  every configuration nb_gemm can run for each layer and exact m, timed (bench/config_sweep.c);\n"
           "  --between: a small cuBLAS kernel after every call, its own time subtracted;\n"
           "  --heuristic: the heuristic's plan only\n");
}

int main(int argc, char **argv) {
    const char *fmt_name = "nvfp4", *shapes = NULL, *ms = NULL;
    double min_mb = 240;
    int use_between = 0, only_heuristic = 0;
    nbt_tool = "config_sweep";
    nba_opt opts[] = {
        {.name = "--format", .kind = NBA_STRING, .dst = &fmt_name},
        {.name = "--shapes", .kind = NBA_STRING, .dst = &shapes},
        {.name = "--m", .kind = NBA_STRING, .dst = &ms},
        {.name = "--min-bytes", .kind = NBA_REAL, .dst = &min_mb, .rlo = 0, .rhi = 1e6},
        {.name = "--between", .kind = NBA_FLAG, .dst = &use_between},
        {.name = "--heuristic", .kind = NBA_FLAG, .dst = &only_heuristic},
    };
    const int r = nba_parse("config_sweep", argc, argv, opts, sizeof opts / sizeof opts[0], NULL, help);
    if (r) return r < 0 ? 0 : 1;
    nb_format fmt;
    int64_t kn[128], mv[64];
    if (!shapes || !ms) return nba_usage("config_sweep", "--shapes and --m are required");
    if (nb_format_from_name(fmt_name, &fmt) != NB_OK) return nba_usage("config_sweep", "--format: %s", nb_last_error());
    const int nkn = nba_int_list("config_sweep", "--shapes", shapes, 1, 1 << 20, 1, kn, 128);
    const int nm = nba_int_list("config_sweep", "--m", ms, 1, 16384, 0, mv, 64);
    if (nkn < 0 || nm < 0) return 1;
    nb_format_info info;
    NB(nb_format_get_info(fmt, &info));
    const int rounded = info.element != NB_ELEMENT_E2M1; /* (nbt_same_output, as nibble tune) */
    if (!nbt_have_device()) return 3;
    nb_context *ctx;
    NB(nb_context_create(0, &ctx));
    nb_device_info dev;
    NB(nb_context_device_info(ctx, &dev));
    const int sms = dev.sm_count;
    cudaStream_t s;
    CK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
    nbt_between bws, *bw = NULL;
    if (use_between) {
        nbt_between_init(&bws, s);
        bw = &bws;
        printf("--between: a cuBLAS kernel after every call, %.2f us alone, subtracted\n", bws.alone_us);
    }
    int wrong = 0;
    for (int si = 0; si < nkn / 2; si++) {
        const long long k = kn[2 * si], n = kn[2 * si + 1];
        nbt_layer l;
        nbt_layer_make(ctx, fmt, n, k, min_mb, s, &l);
        for (int mi = 0; mi < nm; mi++) {
            const int m = (int)mv[mi];
            nb_gemm_desc g;
            NB(nb_gemm_desc_init(&g, &l.packed, m, NB_DTYPE_BF16, NB_DTYPE_BF16));
            void *x = nbt_device_activations(NB_DTYPE_BF16, (size_t)m * k), *y, *ws = NULL;
            const size_t count = (size_t)m * n;
            CK(cudaMalloc(&y, count * 2));
            nb_gemm_config cf[128];
            size_t nc = 0;
            if (!only_heuristic) NB(nb_gemm_list_configs(ctx, &g, cf, 64, &nc));
            if (nc > 64) nc = 64;
            const int kc = (int)((k + 127) / 128);
            /* (and the splits that put one, two or three CTAs of 256-row tiles on every SM) */
            const int tiles = (int)((n + 255) / 256);
            const int extra_s[] = {3, 5, 6, 7, 8, 12, 16, kc / 4, kc / 6, sms / tiles, 2 * sms / tiles, 3 * sms / tiles};
            for (int r = 1; r <= 2 && m >= 2 && !only_heuristic; r++)
                for (size_t e = 0; e < sizeof extra_s / sizeof extra_s[0]; e++)
                    if (extra_s[e] >= 1)
                        cf[nc++] = (nb_gemm_config){
                            .path = NB_GEMM_PATH_DECODE, .variant = 1, .kw = 1, .rpw = r, .splits = extra_s[e]};
            for (int bn = 16; bn <= 64; bn *= 2)
                for (int sp = 1; sp <= 4 && (bn == 64 || m <= 32) && !only_heuristic; sp++)
                    cf[nc++] = (nb_gemm_config){.path = NB_GEMM_PATH_TENSOR_CORE, .bn = bn, .splits = sp};
            size_t wsb = 0;
            NB(nb_gemm_workspace_size(ctx, &g, &wsb));
            for (size_t i = 0; i < nc; i++) {
                size_t b = 0;
                if (nb_gemm_workspace_size_ex(ctx, &g, &cf[i], &b) == NB_OK && b > wsb) wsb = b;
            }
            if (wsb) {
                CK(cudaMalloc(&ws, wsb));
                CK(cudaMemset(ws, 0, wsb));
            }
            uint16_t *href = nbt_calloc(count, 2), *hy = nbt_calloc(count, 2);
            NB(run_once(ctx, &g, NULL, x, l.pk[0], y, ws, wsb, s, count, href));
            float big = 0.0f;
            for (size_t i = 0; i < count; i++) big = fmaxf(big, fabsf(nbt_float_of(NB_DTYPE_BF16, href[i])));
            const int calls = nbt_graph_calls(m, n, k, l.sz.packed_bytes, l.rot, 400, 8, 200);
            const double th = nbt_time_gemm_after(ctx, &g, NULL, x, &l, y, ws, wsb, s, calls, 7, bw);
            char hb[256] = "", bb[96] = "";
            nb_gemm_last_config(ctx, hb, sizeof hb);
            double best = th;
            snprintf(bb, sizeof bb, "the heuristic's");
            printf("%lldx%lld m=%d heuristic %.2f us (%s)\n ", k, n, m, th, hb);
            for (size_t i = 0; i < nc; i++) {
                if (run_once(ctx, &g, &cf[i], x, l.pk[0], y, ws, wsb, s, count, hy) != NB_OK) continue;
                char cb[96], why[160];
                nbt_config_text(&cf[i], cb, sizeof cb);
                if (!nbt_same_output(NB_DTYPE_BF16, hy, href, count, big, rounded, why, sizeof why)) {
                    printf(" [%s: output differs from the heuristic's: %s]", cb, why);
                    wrong = 1;
                    continue;
                }
                const double t = nbt_time_gemm_after(ctx, &g, &cf[i], x, &l, y, ws, wsb, s, calls, 7, bw);
                if (t < best) best = t, snprintf(bb, sizeof bb, "%s", cb);
                printf(" [%s %.2f]", cb, t);
            }
            printf("\n best %.2f us (%s), %.2fx the heuristic's\n", best, bb, th / best);
            fflush(stdout);
            free(href), free(hy);
            CK(cudaFree(x));
            CK(cudaFree(y));
            if (ws) CK(cudaFree(ws));
        }
        nbt_layer_free(&l);
    }
    if (bw) nbt_between_free(bw);
    return wrong ? 2 : 0;
}
