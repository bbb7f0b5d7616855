/* plan_dump.c - every plan the planner (src/plan.c) makes over a grid of
 * layers, batch sizes and formats on a host context that plays an H100
 * (plan_host.h), one line each, so two versions of the planner can be
 * compared without a GPU: scripts/plan-diff builds this at two commits and
 * diffs the output.  A change meant to leave every plan alone (a refactor)
 * shows no line; a new rule shows exactly the layers it moves.
 *
 *   plan_dump [--m LO-HI] [--formats nvfp4,int4,...] [--shapes KxN,...] [--count]
 *
 * Defaults: m = 1..80 (every decode rule and the tensor core's first
 * tiles) and 96, 128, 160, 192, 256, 320, 384, 512, 768, 1024, 1025, 2048,
 * 4096, 8192 (its tile widths and k splits), the eight formats (the integer ones with groups of
 * 128 and F16 scales, the table ones with blocks of 64), 29 k x 39 n of
 * real-model and ragged layers.  Each line: format k n m, then the plan's
 * path, staged variant, warps, k splits and chunks per split, grid, n and m
 * tiles, kw, rows per warp, token tile, whether it is a stream-K grid,
 * kernel 1's row blocks a CTA (its balanced wave; 0: warps / kw) and the
 * decode kernels' cap of CTAs per SM (0: none).
 * --count prints only the number of plans.  Exit 0, or 1 when a valid
 * problem gets no plan (the planner must plan every one) or on bad usage. */
#include "plan_host.h"

#include <errno.h>

static const int64_t k_ks[] = {512,   1024,  1536,  2048,  2880,  3072,  3584,  4096,  4608,  5120,
                               6144,  7168,  8192,  9216,  10240, 12288, 13824, 14336, 16384, 18432,
                               18944, 20480, 24576, 25600, 27648, 28672, 29568, 32768, 36864};
static const int64_t k_ns[] = {256,   512,   768,   1024,  1536,  2048,  2880,  3072,  3584,  4096,
                               4608,  5120,  5760,  6144,  7168,  8192,  8448,  9216,  10240, 12288,
                               13824, 14336, 16384, 16896, 18432, 18944, 20480, 24576, 25600, 27648,
                               28672, 29568, 32768, 36864, 43008, 57344, 73728, 76808, 128256};

static const int64_t k_ms_tc[] = {96, 128, 160, 192, 256, 320, 384, 512, 768, 1024, 1025, 2048, 4096, 8192};

static int usage(void) {
    fprintf(stderr, "usage: plan_dump [--m LO-HI] [--formats nvfp4,int4,...] [--shapes KxN,...] [--count]\n");
    return 1;
}

static int parse_i64(const char *s, char **end, int64_t *out) {
    errno = 0;
    const long long v = strtoll(s, end, 10);
    if (errno || *end == s || v < 1) return 0;
    *out = v;
    return 1;
}

int main(int argc, char **argv) {
    int64_t m_lo = 1, m_hi = 80;
    int m_default = 1;
    nb_format fmts[NBI_FORMAT_COUNT];
    size_t nf = 0;
    int64_t (*shapes)[2] = NULL;
    size_t ns = 0;
    int count_only = 0;
    for (int i = 1; i < argc; i++) {
        char *end;
        if (!strcmp(argv[i], "--count")) {
            count_only = 1;
        } else if (!strcmp(argv[i], "--m") && i + 1 < argc) {
            const char *s = argv[++i];
            if (!parse_i64(s, &end, &m_lo)) return usage();
            m_hi = m_lo;
            if (*end == '-' && !parse_i64(end + 1, &end, &m_hi)) return usage();
            if (*end || m_hi < m_lo) return usage();
            m_default = 0;
        } else if (!strcmp(argv[i], "--formats") && i + 1 < argc) {
            char buf[256];
            snprintf(buf, sizeof buf, "%s", argv[++i]);
            for (char *t = strtok(buf, ","); t; t = strtok(NULL, ",")) {
                if (nf == NBI_FORMAT_COUNT || nb_format_from_name(t, &fmts[nf]) != NB_OK) {
                    fprintf(stderr, "plan_dump: unknown format '%s'\n", t);
                    return 1;
                }
                nf++;
            }
        } else if (!strcmp(argv[i], "--shapes") && i + 1 < argc) {
            const char *s = argv[++i];
            size_t cap = 1;
            for (const char *c = s; *c; c++) cap += *c == ',';
            free(shapes);
            shapes = calloc(cap, sizeof *shapes);
            if (!shapes) return 1;
            for (ns = 0; *s; ns++) {
                if (!parse_i64(s, &end, &shapes[ns][0]) || *end != 'x' || !parse_i64(end + 1, &end, &shapes[ns][1]) ||
                    (*end && *end != ','))
                    return free(shapes), usage();
                s = *end ? end + 1 : end;
            }
        } else {
            return free(shapes), usage();
        }
    }
    if (!nf) {
        static const nb_format all[] = {NB_FORMAT_NVFP4, NB_FORMAT_MXFP4, NB_FORMAT_INT4, NB_FORMAT_INT4_SYM,
                                        NB_FORMAT_INT8,  NB_FORMAT_NF4,   NB_FORMAT_BNB_FP4, NB_FORMAT_INT4_HQQ};
        for (nf = 0; nf < sizeof all / sizeof all[0]; nf++) fmts[nf] = all[nf];
    }
    nb_context *ctx = h100();
    long plans = 0, failed = 0;
    const size_t nk = shapes ? ns : sizeof k_ks / sizeof k_ks[0], nn = shapes ? 1 : sizeof k_ns / sizeof k_ns[0];
    for (size_t f = 0; f < nf; f++) {
        nb_format_info fi;
        if (nb_format_get_info(fmts[f], &fi) != NB_OK) continue;
        for (size_t a = 0; a < nk; a++)
            for (size_t b = 0; b < nn; b++) {
                const int64_t k = shapes ? shapes[a][0] : k_ks[a], n = shapes ? shapes[a][1] : k_ns[b];
                nb_weight_desc w;
                if (nb_weight_desc_init(&w, fmts[f], n, k) != NB_OK) continue;
                w.layout = NB_LAYOUT_PACKED;
                if (fmts[f] != NB_FORMAT_NVFP4 && fmts[f] != NB_FORMAT_MXFP4) {
                    const int table = fmts[f] == NB_FORMAT_NF4 || fmts[f] == NB_FORMAT_BNB_FP4;
                    w.group_size = table ? 64 : 128;
                    if (!table) w.scale_type = NB_SCALE_F16;
                    w.scale_exp_min = 0, w.scale_exp_max = fmts[f] == NB_FORMAT_INT4 ? 15 : -1;
                }
                if (k % w.group_size || nb_weight_desc_validate(&w) != NB_OK) continue;
                const int64_t m_count = m_hi - m_lo + 1 + (m_default ? (int64_t)(sizeof k_ms_tc / sizeof k_ms_tc[0]) : 0);
                for (int64_t mi = 0; mi < m_count; mi++) {
                    const int64_t m = mi <= m_hi - m_lo ? m_lo + mi : k_ms_tc[mi - (m_hi - m_lo + 1)];
                    nb_gemm_desc g;
                    if (nb_gemm_desc_init(&g, &w, m, NB_DTYPE_BF16, NB_DTYPE_BF16) != NB_OK) continue;
                    nbi_gemm_plan p;
                    memset(&p, 0, sizeof p);
                    if (nbi_plan(ctx, &g, NULL, &p) != NB_OK) {
                        printf("%s %lld %lld %lld: no plan (%s)\n", fi.name, (long long)k, (long long)n, (long long)m,
                               nb_last_error());
                        failed++;
                        continue;
                    }
                    plans++;
                    if (!count_only)
                        printf("%s %lld %lld %lld: path %d xsh %d warps %d splits %d x %d grid %d tiles %d x %d kw %d "
                               "rpw %d bn %d sk %d rows %d per_sm %d\n",
                               fi.name, (long long)k, (long long)n, (long long)m, p.path, p.xsh, p.warps, p.splits,
                               p.chunks_per_split, p.grid_x, p.tiles_n, p.tiles_m, p.kw, p.rpw, p.bn,
                               p.path == NBI_PATH_SM90 ? p.sk : nbi_plan_stream_k(&p), p.k1_rows, p.per_sm);
                }
            }
    }
    fprintf(stderr, "plan_dump: %ld plans, %ld problems without one\n", plans, failed);
    if (count_only) printf("%ld\n", plans);
    nb_context_destroy(ctx);
    free(shapes);
    return failed ? 1 : 0;
}
