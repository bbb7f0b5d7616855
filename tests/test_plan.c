/* test_plan.c - the tensor-core path's planner (src/plan.c, plan_tc) without
 * a device: the library's C sources are compiled in with the no-CUDA stubs,
 * except two hooks this file supplies, so a host-only context can play an
 * H100 (132 SMs, sm_90a, 227 KB of shared memory per block) whose clusters
 * of s CTAs of the tensor-core kernel fit as measured on one
 * (cudaOccupancyMaxActiveClusters, 2026-11-26: 66, 39, 30, 22, 17, 15, 15
 * clusters of 2..8).
 *
 *   test_plan     (exit 0 pass, 1 fail)
 *
 * - every plan of the bench layers and of ragged and real-model shapes at
 *   m = 33..8192 is valid: a k split never needs more than one wave (in a
 *   cluster: every tile's cluster fits at once; through the workspace: one
 *   CTA per SM), a cluster split needs no workspace, a workspace split fits
 *   in nbi_plan_workspace, the splits cover k;
 * - the choices measured fastest on the H100 (bench/RESULTS.md, NOTES.md):
 *   4096 -> 4096 at m = 256 in 2 splits of 128-token tiles summed in a
 *   cluster, 8192 -> 8192 at m = 256 in 2 of 256-token tiles in a cluster,
 *   m = 64 on 4096 -> 4096 in 4 splits through the workspace (the
 *   64-token tile's partials are small), m = 1024 unsplit;
 * - NIBBLE_SM90_CLUSTER=0 (env_no_cluster) and a GPU whose clusters do not
 *   fit never get a cluster split, and still get valid plans;
 * - a requested split that cannot run is clamped to the largest that can;
 *   one whose clusters do not all fit sums through the workspace;
 * - the cluster capacity is asked of the device once per instance and size;
 * - decode kernel 1 is held to two CTAs per SM exactly where three or more
 *   fit and take no wave off its grid.
 */
#include "plan_host.h"

#include "check.h"

/* The invariants of a tensor-core plan (see the top of this file). */
static void check_valid(nb_context *ctx, const nbi_gemm_plan *p, int64_t k, int64_t n, int64_t m) {
    const int64_t tiles = (int64_t)p->tiles_n * p->tiles_m;
    CHECK(p->path == NBI_PATH_SM90, "%lld -> %lld m = %lld: the tensor-core path (path %d)", (long long)k,
          (long long)n, (long long)m, p->path);
    if (p->path != NBI_PATH_SM90) return;
    CHECK(p->splits >= 1 && p->splits <= NBI_SM90_MAX_SPLITS && (int64_t)p->splits * p->chunks_per_split >= p->kchunks &&
              (int64_t)(p->splits - 1) * p->chunks_per_split < p->kchunks,
          "%lld -> %lld m = %lld: %d splits of %d chunks cover %lld chunks, each split non-empty", (long long)k,
          (long long)n, (long long)m, p->splits, p->chunks_per_split, (long long)p->kchunks);
    CHECK(tiles * p->bn >= m && (int64_t)p->tiles_n * 64 * p->cwg >= n, "%lld -> %lld m = %lld: the tiles cover the output",
          (long long)k, (long long)n, (long long)m);
    if (p->splits == 1 && p->tail_tiles) {
        const int64_t sms = ctx->info.sm_count, whole = tiles - p->tail_tiles;
        CHECK(!p->cluster && whole > 0 && whole % sms == 0 && p->tail_tiles < sms &&
                  (int64_t)p->tail_tiles * p->tail_splits <= sms && p->tail_splits >= 2 &&
                  p->tail_splits <= NBI_SM90_MAX_SPLITS && (int64_t)p->tail_splits * p->tail_cps >= p->kchunks &&
                  (int64_t)(p->tail_splits - 1) * p->tail_cps < p->kchunks,
              "%lld -> %lld m = %lld: whole waves (%lld tiles), then %d tiles x %d splits of %d chunks within one "
              "wave covering %lld chunks, each split non-empty", (long long)k, (long long)n, (long long)m,
              (long long)whole, p->tail_tiles, p->tail_splits, p->tail_cps, (long long)p->kchunks);
        CHECK(p->ws_partial_bytes == (size_t)p->tail_tiles * p->tail_splits * 64 * p->cwg * p->bn * sizeof(float) &&
                  p->ws_partial_bytes + p->ws_counter_bytes <= nbi_plan_workspace(ctx, p),
              "%lld -> %lld m = %lld: the tail's partials (%zu bytes) within the bound %zu", (long long)k,
              (long long)n, (long long)m, p->ws_partial_bytes, nbi_plan_workspace(ctx, p));
        return;
    }
    if (p->sk) { /* the stream-K grid: one CTA per SM, a partial slot each, two chunks or more per CTA */
        CHECK(p->splits == 1 && !p->cluster && p->tail_tiles == 0 && p->grid_x == ctx->info.sm_count &&
                  tiles <= NBI_MAX_SPLIT_COLUMNS && tiles * p->kchunks >= 2 * (int64_t)p->grid_x &&
                  (p->bn == 64 ? m > 32 && m <= 64 : p->bn == 128 ? m >= 65 : p->bn <= m) && (p->bn == 64 || p->bn == 128 || p->bn == 256) && p->cwg == 2 &&
                  p->ws_partial_bytes == (size_t)p->grid_x * 64 * p->cwg * p->bn * sizeof(float) &&
                  p->ws_counter_bytes > 0 && p->ws_partial_bytes + p->ws_counter_bytes <= nbi_plan_workspace(ctx, p),
              "%lld -> %lld m = %lld: stream-K grid of %d CTAs over %lld tiles x %lld chunks (bn %d), workspace %zu + "
              "%zu", (long long)k, (long long)n, (long long)m, p->grid_x, (long long)tiles, (long long)p->kchunks,
              p->bn, p->ws_partial_bytes, p->ws_counter_bytes);
        return;
    }
    if (p->splits == 1) {
        CHECK(!p->cluster && p->ws_partial_bytes == 0 && p->tail_tiles == 0,
              "%lld -> %lld m = %lld: no split, no cluster, no workspace", (long long)k, (long long)n, (long long)m);
        return;
    }
    CHECK(p->tail_tiles == 0, "%lld -> %lld m = %lld: a split grid has no tail split", (long long)k, (long long)n,
          (long long)m);
    if (p->cluster) {
        CHECK(tiles <= g_cap[p->splits] && p->ws_partial_bytes == 0 && p->ws_counter_bytes == 0,
              "%lld -> %lld m = %lld: %lld tiles x %d splits in clusters: all fit at once (%d), no workspace",
              (long long)k, (long long)n, (long long)m, (long long)tiles, p->splits, g_cap[p->splits]);
    } else {
        CHECK(tiles * p->splits <= ctx->info.sm_count && p->ws_partial_bytes > 0 &&
                  p->ws_partial_bytes + p->ws_counter_bytes <= nbi_plan_workspace(ctx, p),
              "%lld -> %lld m = %lld: %lld tiles x %d splits through the workspace: one wave, %zu bytes within "
              "the bound %zu", (long long)k, (long long)n, (long long)m, (long long)tiles, p->splits,
              p->ws_partial_bytes + p->ws_counter_bytes, nbi_plan_workspace(ctx, p));
    }
}

static int plan(nb_context *ctx, nb_format fmt, int64_t k, int64_t n, int64_t m, const nbi_request *rq,
                nbi_gemm_plan *p) {
    const nb_gemm_desc g = problem(fmt, k, n, m);
    const nb_status st = nbi_plan(ctx, &g, rq, p);
    CHECK(st == NB_OK, "plan %lld -> %lld m = %lld: %s", (long long)k, (long long)n, (long long)m,
          st ? nb_last_error() : "ok");
    return st == NB_OK;
}

static const int64_t k_shapes[][2] = {
    /* the bench set (k, n) */
    {4096, 4096}, {4096, 6144}, {4096, 28672}, {14336, 4096}, {8192, 8192}, {8192, 10240}, {8192, 57344},
    {28672, 8192}, {5120, 27648}, {27648, 5120},
    /* real models off the bench set: Qwen2.5-7B, Gemma-2-2B, Phi-3-mini, a GQA k/v projection; Qwen2.5-7B's
     * fused q/k/v, gpt-oss's attention (k off the chunk), Qwen2.5-72B, DeepSeek-V3's dense MLP, Qwen2.5-14B,
     * Qwen3-8B (the layers of the decode planner's measurements of 2026-11-29) */
    {3584, 18944}, {18944, 3584}, {2304, 9216}, {3072, 9216}, {4096, 1024}, {3584, 4608}, {2880, 5120},
    {8192, 29568}, {7168, 18432}, {5120, 13824}, {13824, 5120}, {12288, 4096}, {4096, 12288},
    /* ragged: n off the 16-row block and the tile, k off the chunk */
    {4096 + 96, 1000}, {1024 + 32, 6168}, {32 * 37, 17}};
static const int64_t k_ms[] = {33, 64, 100, 128, 200, 256, 384, 512, 1000, 1024, 2048, 4096, 8192};

static void test_every_plan_valid(void) {
    nb_context *ctx = h100();
    const nb_format fmts[2] = {NB_FORMAT_NVFP4, NB_FORMAT_MXFP4};
    int clusters = 0, workspace = 0;
    for (int f = 0; f < 2; f++)
        for (size_t s = 0; s < sizeof k_shapes / sizeof k_shapes[0]; s++)
            for (size_t i = 0; i < sizeof k_ms / sizeof k_ms[0]; i++) {
                nbi_gemm_plan p;
                if (!plan(ctx, fmts[f], k_shapes[s][0], k_shapes[s][1], k_ms[i], NULL, &p)) continue;
                check_valid(ctx, &p, k_shapes[s][0], k_shapes[s][1], k_ms[i]);
                clusters += p.splits > 1 && p.cluster;
                workspace += p.splits > 1 && !p.cluster;
            }
    printf("bench and real-model layers: %d cluster splits, %d workspace splits\n", clusters, workspace);
    CHECK(clusters > 0 && workspace > 0, "both kinds of k split are chosen somewhere (%d cluster, %d workspace)",
          clusters, workspace);
    nb_context_destroy(ctx);
}

/* The configurations measured fastest on the H100 (2026-11-26). */
static void test_measured_choices(void) {
    nb_context *ctx = h100();
    nbi_gemm_plan p;
    if (plan(ctx, NB_FORMAT_NVFP4, 4096, 4096, 256, NULL, &p))
        CHECK(p.bn == 128 && p.splits == 2 && p.cluster, "4096 -> 4096 m = 256: 128-token tiles, 2 splits in a cluster "
              "(got bn %d, %d splits, cluster %d)", p.bn, p.splits, p.cluster);
    if (plan(ctx, NB_FORMAT_NVFP4, 8192, 8192, 256, NULL, &p))
        CHECK(p.bn == 256 && p.splits == 2 && p.cluster, "8192 -> 8192 m = 256: 256-token tiles, 2 splits in a cluster "
              "(got bn %d, %d splits, cluster %d)", p.bn, p.splits, p.cluster);
    if (plan(ctx, NB_FORMAT_NVFP4, 14336, 4096, 512, NULL, &p))
        CHECK(p.bn == 256 && p.splits == 2 && p.cluster, "14336 -> 4096 m = 512: 256-token tiles, 2 splits in a "
              "cluster (got bn %d, %d splits, cluster %d)", p.bn, p.splits, p.cluster);
    if (plan(ctx, NB_FORMAT_NVFP4, 4096, 4096, 64, NULL, &p))
        CHECK(p.bn == 64 && p.splits == 4 && !p.cluster, "4096 -> 4096 m = 64: 64-token tiles, 4 splits through the "
              "workspace (got bn %d, %d splits, cluster %d)", p.bn, p.splits, p.cluster);
    if (plan(ctx, NB_FORMAT_NVFP4, 8192, 8192, 1024, NULL, &p))
        CHECK(p.bn == 256 && p.splits == 1, "8192 -> 8192 m = 1024: 256-token tiles, unsplit (got bn %d, %d splits)",
              p.bn, p.splits);
    nb_context_destroy(ctx);
}

/* No cluster split where clusters are off or do not fit; the plans stay valid. */
static void test_without_clusters(void) {
    for (int mode = 0; mode < 2; mode++) {
        nb_context *ctx = h100();
        int saved[NBI_SM90_MAX_SPLITS + 1];
        memcpy(saved, g_cap, sizeof saved);
        if (mode == 0) ctx->env_no_cluster = 1; /* NIBBLE_SM90_CLUSTER=0 */
        else memset(g_cap, 0, sizeof g_cap);    /* a device where no cluster of the kernel fits */
        int clusters = 0, splits = 0;
        for (size_t s = 0; s < sizeof k_shapes / sizeof k_shapes[0]; s++)
            for (size_t i = 0; i < sizeof k_ms / sizeof k_ms[0]; i++) {
                nbi_gemm_plan p;
                if (!plan(ctx, NB_FORMAT_NVFP4, k_shapes[s][0], k_shapes[s][1], k_ms[i], NULL, &p)) continue;
                check_valid(ctx, &p, k_shapes[s][0], k_shapes[s][1], k_ms[i]);
                clusters += p.cluster;
                splits += p.splits > 1;
            }
        CHECK(clusters == 0 && splits > 0, "%s: no cluster split (%d), workspace splits still used (%d)",
              mode == 0 ? "NIBBLE_SM90_CLUSTER=0" : "no cluster fits", clusters, splits);
        memcpy(g_cap, saved, sizeof saved);
        nb_context_destroy(ctx);
    }
}

/* NIBBLE_PDL: every path's plan allows programmatic dependent launch on
 * sm_90 (for the call's first launch and for those after it) unless the
 * context was created with NIBBLE_PDL=0, and the switch moves no other part
 * of a plan; before sm_90 never.  (Which launches take it under stream
 * capture is nb_gemm's choice at the call: test_gpu's capture test.) */
static void test_pdl_switch(void) {
    nb_context *on = h100(), *off = h100(), *sm80 = h100();
    off->env_pdl = 1;  /* NIBBLE_PDL=0 */
    on->env_pdl = 2;   /* NIBBLE_PDL=1: as unset */
    sm80->info.cc_major = 8;
    static const int64_t ms[] = {1, 8, 16, 25, 32, 64, 256, 1024}; /* (the decode paths too) */
    int n = 0, bad = 0;
    for (size_t s = 0; s < sizeof k_shapes / sizeof k_shapes[0]; s++)
        for (size_t i = 0; i < sizeof ms / sizeof ms[0]; i++) {
            nbi_gemm_plan a, b, c;
            if (!plan(on, NB_FORMAT_NVFP4, k_shapes[s][0], k_shapes[s][1], ms[i], NULL, &a) ||
                !plan(off, NB_FORMAT_NVFP4, k_shapes[s][0], k_shapes[s][1], ms[i], NULL, &b))
                continue;
            n++;
            const int was = b.pdl, was_own = b.pdl_own;
            b.pdl = a.pdl;
            b.pdl_own = a.pdl_own;
            bad += !(a.pdl == 1 && a.pdl_own == 1 && was == 0 && was_own == 0 &&
                     !memcmp(&a, &b, sizeof a)); /* (nbi_plan zeroes the plan first) */
            if (plan(sm80, NB_FORMAT_NVFP4, k_shapes[s][0], k_shapes[s][1], ms[i], NULL, &c))
                bad += c.pdl != 0 || c.pdl_own != 0;
        }
    CHECK(n > 0 && bad == 0, "NIBBLE_PDL=0 clears pdl and nothing else, sm_80 never sets it (%d plans, %d wrong)", n,
          bad);
    nb_context_destroy(on);
    nb_context_destroy(off);
    nb_context_destroy(sm80);
}

/* A requested split is the largest that can run, at most the one asked. */
static void test_requested_splits(void) {
    nb_context *ctx = h100();
    nbi_gemm_plan p;
    nbi_request rq;
    memset(&rq, 0, sizeof rq);
    rq.path = NB_GEMM_PATH_TENSOR_CORE;
    rq.bn = 256;
    rq.splits = 8; /* 8192 -> 8192 m = 256: 64 tiles; 8 clusters of 8 (15 fit) nor 512 CTAs fit one wave */
    if (plan(ctx, NB_FORMAT_NVFP4, 8192, 8192, 256, &rq, &p)) {
        check_valid(ctx, &p, 8192, 8192, 256);
        CHECK(p.bn == 256 && p.splits == 2, "8 splits asked where 2 is the most that runs: 2 (got bn %d, %d)", p.bn,
              p.splits);
    }
    rq.splits = 3; /* 32 tiles x 3: 39 clusters of 3 fit, and 96 CTAs one wave */
    if (plan(ctx, NB_FORMAT_NVFP4, 4096, 4096, 256, &rq, &p)) {
        check_valid(ctx, &p, 4096, 4096, 256);
        CHECK(p.splits == 3, "3 splits asked and possible: 3 (got %d)", p.splits);
    }
    rq.splits = 4; /* 32 tiles x 4: 30 clusters of 4 fit, but 128 CTAs fit one wave through the workspace */
    if (plan(ctx, NB_FORMAT_NVFP4, 4096, 4096, 256, &rq, &p)) {
        check_valid(ctx, &p, 4096, 4096, 256);
        CHECK(p.splits == 4 && !p.cluster, "4 splits where their clusters do not all fit: through the workspace "
              "(got %d, cluster %d)", p.splits, p.cluster);
    }
    nb_context_destroy(ctx);
}

/* The tail split (plan.c tc_tail): an unsplit grid of more than a wave
 * whose last wave is partial runs that wave's tiles split along k, where the
 * model charges less; NIBBLE_SM90_TAIL=0 keeps them unsplit; a grid of
 * whole waves or of less than one has none. */
static void test_tail_split(void) {
    for (int off = 0; off < 2; off++) {
        nb_context *ctx = h100();
        ctx->env_no_tail = off;
        nbi_gemm_plan p;
        int tails = 0;
        for (size_t s = 0; s < sizeof k_shapes / sizeof k_shapes[0]; s++)
            for (size_t i = 0; i < sizeof k_ms / sizeof k_ms[0]; i++)
                if (plan(ctx, NB_FORMAT_NVFP4, k_shapes[s][0], k_shapes[s][1], k_ms[i], NULL, &p)) {
                    check_valid(ctx, &p, k_shapes[s][0], k_shapes[s][1], k_ms[i]);
                    tails += p.tail_tiles > 0;
                }
        CHECK(off ? tails == 0 : tails > 0, "%s: %d plans with a tail split", off ? "NIBBLE_SM90_TAIL=0" : "default",
              tails);
        /* 27648 -> 5120 at m = 1024: 40 x 4 tiles of 256 tokens, 132 and 28 */
        if (plan(ctx, NB_FORMAT_NVFP4, 27648, 5120, 1024, NULL, &p))
            CHECK(off ? p.tail_tiles == 0 : p.bn == 256 && p.splits == 1 && p.tail_tiles == 28 && p.tail_splits == 4,
                  "27648 -> 5120 m = 1024%s: tail %d tiles x %d splits (bn %d)", off ? " (tail off)" : "",
                  p.tail_tiles, p.tail_splits, p.bn);
        /* 8192 -> 8192 at m = 1024: 64 x 4 = 256 tiles of 256 tokens, 132 and a tail of 124, which cannot
         * split within a wave */
        if (plan(ctx, NB_FORMAT_NVFP4, 8192, 8192, 1024, NULL, &p))
            CHECK(p.tail_tiles == 0, "8192 -> 8192 m = 1024: no tail split (%d tiles)", p.tail_tiles);
        nb_context_destroy(ctx);
    }
}

/* The device is asked once per context, instance and cluster size. */
static void test_capacity_cached(void) {
    nb_context *ctx = h100();
    nbi_gemm_plan p;
    g_queries = 0;
    plan(ctx, NB_FORMAT_NVFP4, 4096, 4096, 256, NULL, &p);
    const int first = g_queries;
    for (int i = 0; i < 5; i++) plan(ctx, NB_FORMAT_NVFP4, 4096, 4096, 256, NULL, &p);
    CHECK(first > 0 && g_queries == first, "cluster capacity asked %d times for the first plan, %d in all after 5 more",
          first, g_queries);
    nb_context_destroy(ctx);
}

/* The integer and table formats: the tensor-core kernel past m = 32, and
 * from 25 (table formats 17) on layers of fewer 128-row tiles than SMs and
 * k < 16384 (64-, 128- and 256-token tiles, valid plans on every layer and
 * group, the stream-K grid among them), the decode kernels below (the staged one with two row blocks per
 * warp on wide layers from 9 tokens) and for integer weights with BF16
 * scales and FP16 activations; a request for path tc where it does not
 * serve is refused. */
static void test_integer_formats(void) {
    nb_context *ctx = h100();
    static const nb_format fmts[5] = {NB_FORMAT_INT4, NB_FORMAT_INT4_SYM, NB_FORMAT_NF4, NB_FORMAT_BNB_FP4,
                                      NB_FORMAT_INT8};
    static const int groups[4] = {32, 64, 128, 0};
    static const int64_t ms[8] = {1, 16, 17, 23, 24, 33, 256, 4096};
    int tc = 0, sk = 0;
    for (int f = 0; f < 5; f++)
        for (int gi = 0; gi < 4; gi++)
            for (int a = 0; a < 3; a++) /* BF16 / F16 activations with F16 scales, F16 with BF16 scales */
                for (size_t s = 0; s < sizeof k_shapes / sizeof k_shapes[0]; s++)
                    for (int mi = 0; mi < 8; mi++) {
                        const int64_t k = k_shapes[s][0], n = k_shapes[s][1], m = ms[mi];
                        nb_weight_desc w;
                        nb_weight_desc_init(&w, fmts[f], n, k);
                        w.layout = NB_LAYOUT_PACKED;
                        w.group_size = groups[gi] ? groups[gi] : (int32_t)k;
                        const int tab = f == 2 || f == 3;
                        if (k % w.group_size || k % 8 || (tab && groups[gi] == 0)) continue;
                        if (tab) w.group_size = groups[gi] == 128 ? 256 : groups[gi]; /* (256: kernel group 128) */
                        if (k % w.group_size) continue;
                        if (!tab) w.scale_type = a == 2 ? NB_SCALE_BF16 : NB_SCALE_F16;
                        else if (a == 2) continue;
                        w.scale_exp_min = 0, w.scale_exp_max = f == 0 ? 15 : -1;
                        nb_gemm_desc g;
                        nb_gemm_desc_init(&g, &w, m, a == 0 ? NB_DTYPE_BF16 : NB_DTYPE_F16,
                                          a == 0 ? NB_DTYPE_BF16 : NB_DTYPE_F16);
                        nbi_gemm_plan p;
                        const nb_status st = nbi_plan(ctx, &g, NULL, &p);
                        CHECK(st == NB_OK, "fmt %d group %d act %d %lld -> %lld m = %lld: %s", (int)fmts[f],
                              groups[gi], a, (long long)k, (long long)n, (long long)m, st ? nb_last_error() : "");
                        if (st == NB_OK && p.sk) { /* the stream-K grid: valid as the E2M1 formats' */
                            check_valid(ctx, &p, k, n, m);
                            sk++;
                        }
                        if (st) continue;
                        /* past m = 32, and on layers of fewer 128-row tiles than SMs (132) and k < 16384
                         * from m = 17 where decode kernel 2, one CTA per SM over 256-row tiles, would run
                         * short: at 17..24 tokens under 6 chunks (the table formats: 16); at 25..32 always
                         * for the table formats and int8, under 16 chunks for int4 and int4_sym */
                        const int small = (n + 127) / 128 < 132 && k < 16384;
                        const int64_t per = 132 / (((n + 15) / 16 + 15) / 16), runs = per ? (k + 127) / 128 / per : 0;
                        const int want = a != 2 && (m > 32 || (small && m >= 17 && (m <= 24 ? runs < (tab ? 16 : 6)
                                                                                 : f >= 2 || runs < 16)));
                        CHECK((p.path == NBI_PATH_SM90) == want, "fmt %d group %d act %d %lld -> %lld m = %lld: path %d, "
                              "want %s", (int)fmts[f], groups[gi], a, (long long)k, (long long)n, (long long)m, p.path,
                              want ? "tc" : "decode");
                        /* the staged decode kernel on the wide layers (no k split) from 9 tokens */
                        if (!want && m > 8 && m <= 32 && n >= 28672 && k <= 8192)
                            CHECK(p.path == NBI_PATH_GEMV && p.xsh && p.rpw == 2 && (p.xsh == 2) == (m > 16),
                                  "fmt %d group %d act %d %lld -> %lld m = %lld: xsh %d rpw %d splits %d, want the "
                                  "staged kernel", (int)fmts[f], groups[gi], a, (long long)k, (long long)n,
                                  (long long)m, p.xsh, p.rpw, p.splits);
                        if (!want || p.path != NBI_PATH_SM90) continue;
                        tc++;
                        check_valid(ctx, &p, k, n, m);
                        /* 32-token tiles (two or four consumer warpgroups) at m <= 32, else 64..256 with two */
                        CHECK((m <= 32 ? p.bn == 32 || p.bn == 64 : p.bn >= 64 && p.bn <= 256) &&
                                  (p.cwg == 2 || (p.bn == 32 && p.cwg == 4)) && p.group == (groups[gi] ? groups[gi] : 128),
                              "fmt %d %lld -> %lld m = %lld: bn %d (32..256), cwg %d, kernel group %d",
                              (int)fmts[f], (long long)k, (long long)n, (long long)m, p.bn, p.cwg, p.group);
                    }
    printf("integer formats: %d tensor-core plans, %d on the stream-K grid\n", tc, sk);
    CHECK(sk > 0, "integer and table formats: some plans on the stream-K grid (%d)", sk);
    /* requests for path tc that it does not serve */
    nb_gemm_desc g = problem(NB_FORMAT_INT4, 4096, 4096, 16);
    g.weight.scale_exp_min = 0, g.weight.scale_exp_max = 15;
    const nbi_request tc_rq = {.path = NB_GEMM_PATH_TENSOR_CORE}, tc32 = {.path = NB_GEMM_PATH_TENSOR_CORE, .bn = 32};
    nbi_gemm_plan p;
    CHECK(nbi_plan(ctx, &g, &tc_rq, &p) == NB_ERR_UNSUPPORTED, "int4 m = 16, path tc: refused");
    g.m = 17;
    CHECK(nbi_plan(ctx, &g, &tc_rq, &p) == NB_OK && p.path == NBI_PATH_SM90 && p.bn == 32, "int4 m = 17, path tc: %s "
          "(bn %d, want the 32-token tile)", nb_last_error(), p.bn);
    g.m = 64;
    CHECK(nbi_plan(ctx, &g, &tc_rq, &p) == NB_OK && p.path == NBI_PATH_SM90, "int4 m = 64, path tc: %s", nb_last_error());
    CHECK(nbi_plan(ctx, &g, &tc32, &p) == NB_OK && p.path == NBI_PATH_SM90 && p.bn == 32 && p.tiles_m == 2,
          "int4 m = 64, path tc with 32-token tiles: two token tiles (%s)", nb_last_error());
    const nbi_request tc16 = {.path = NB_GEMM_PATH_TENSOR_CORE, .bn = 16};
    CHECK(nbi_plan(ctx, &g, &tc16, &p) == NB_ERR_UNSUPPORTED, "int4 m = 64, path tc with 16-token tiles: refused");
    /* int8: the 256-token tile (two stages) */
    g = problem(NB_FORMAT_INT8, 4096, 4096, 1024);
    const nbi_request tc256 = {.path = NB_GEMM_PATH_TENSOR_CORE, .bn = 256};
    CHECK(nbi_plan(ctx, &g, &tc256, &p) == NB_OK && p.path == NBI_PATH_SM90 && p.bn == 256,
          "int8 m = 1024, path tc with 256-token tiles: %s", nb_last_error());
    /* (path mma itself needs the device's kernel table: test_gpu_int with NIBBLE_PATH=mma) */
    const nbi_request mma_rq = {.path = NB_GEMM_PATH_MMA};
    g = problem(NB_FORMAT_NF4, 4096, 4096, 64);
    CHECK(nbi_plan(ctx, &g, &tc_rq, &p) == NB_OK && p.path == NBI_PATH_SM90, "nf4 m = 64, path tc: %s", nb_last_error());
    g.weight.scale_type = NB_SCALE_F32, g.act_dtype = g.out_dtype = NB_DTYPE_F16;
    CHECK(nbi_plan(ctx, &g, &tc_rq, &p) == NB_OK && p.path == NBI_PATH_SM90, "nf4 FP16 m = 64, path tc: %s",
          nb_last_error());
    g = problem(NB_FORMAT_INT4, 4096, 4096, 64);
    g.weight.scale_type = NB_SCALE_BF16, g.act_dtype = g.out_dtype = NB_DTYPE_F16;
    g.weight.scale_exp_min = 0, g.weight.scale_exp_max = 15;
    CHECK(nbi_plan(ctx, &g, &tc_rq, &p) == NB_ERR_UNSUPPORTED, "int4 BF16 scales, FP16 activations, path tc: refused");
    CHECK(nbi_plan(ctx, &g, &mma_rq, &p) == NB_ERR_UNSUPPORTED, "int4 BF16 scales, FP16 activations, path mma: refused");
    /* an A100 (compute capability 8.0): the decode kernel up to m = 32, as for E2M1 (the mma.sync kernel
     * past it, whose shared-memory sizes come from the device's kernel table) */
    ctx->info.cc_major = 8, ctx->info.smem_per_block_optin = 163 * 1024, ctx->info.sm_count = 108;
    g = problem(NB_FORMAT_INT4, 4096, 4096, 32);
    g.weight.scale_exp_min = 0, g.weight.scale_exp_max = 15;
    CHECK(nbi_plan(ctx, &g, NULL, &p) == NB_OK && p.path == NBI_PATH_GEMV, "A100 int4 m = 32: decode (%s)",
          nb_last_error());
    nb_context_destroy(ctx);
}

/* Kernel 2's stream-K grid: chosen where the column tiles (256 rows) are
 * more than one resident wave and the last wave would leave more than a
 * tenth of the slots idle, and (k2_wave) for the E2M1 formats on every
 * layer of 6 chunks per SM or more at 25..32 tokens (not where one wave of
 * tiles is 84% full unless the wave saves 7 chunks a CTA) and, with the
 * wide instance (12 consumer warps, 384-row tiles), at 17..24 on layers of
 * 8 row blocks per SM and 40 chunks, with 8 warps on the others where
 * the split grid would fill under nine tenths of its slots and a tile is
 * shared by at most three CTAs, and for the integer and table formats at
 * 17..32 where their split grid would leave a quarter of the SMs idle and
 * at 25..32 on layers of 40 chunks and two fifths of a tile per SM or more;
 * at 9..16 tokens, every format, the resident CTAs (here two per SM: the
 * host stub sizes no ring) where the split grid leaves a tenth of the
 * resident slots idle and a tile is shared by at most four CTAs; one wave
 * of CTAs, each with the same number of chunks (give or take one), and a
 * workspace for the partial tiles. */
static void test_stream_k(void) {
    nb_context *ctx = h100();
    static const struct {
        nb_format fmt;
        int64_t k, n, m;
        int sk, ctas, warps; /* stream-K expected, its CTAs, consumer warps */
        int rpw;             /* row blocks per warp: 0 (two, the rules) or 2 / 4 requested (tiles of 16 rpw rows a warp) */
    } cases[] = {
        {NB_FORMAT_NVFP4, 8192, 57344, 24, 1, 132, 8, 4}, /* 3584 row blocks, 64 chunks: four a warp (k2_rpw4) */
        {NB_FORMAT_NVFP4, 8192, 57344, 20, 1, 132, 8, 4},
        {NB_FORMAT_MXFP4, 8192, 57344, 32, 1, 132, 7, 4}, /* 128 tiles of 7 warps x 4, one CTA per SM */
        {NB_FORMAT_INT4_SYM, 8192, 57344, 32, 1, 132, 8, 0}, /* (the integer formats: two a warp) */
        {NB_FORMAT_INT4_SYM, 8192, 57344, 24, 1, 132, 8, 0}, /* (the integer formats: no wide instance) */
        {NB_FORMAT_NVFP4, 8192, 57344, 16, 1, 264, 8, 0},  /* 224 tiles in one wave of 264: 85% full */
        {NB_FORMAT_NVFP4, 4096, 128256, 32, 1, 132, 7, 4}, /* 8016 row blocks: the wave, four a warp */
        {NB_FORMAT_NVFP4, 4096, 128256, 24, 1, 132, 8, 4},
        {NB_FORMAT_NVFP4, 4096, 128256, 24, 0, 0, 8, 2}, /* (rpw 2 requested) 95% of four waves of 132 */
        {NB_FORMAT_NVFP4, 4096, 128256, 16, 0, 0, 8, 0},   /* 95% of two waves of 264 */
        {NB_FORMAT_NVFP4, 832, 76808, 9, 1, 264, 8, 0},    /* 301 tiles: 57% of two waves */
        {NB_FORMAT_NVFP4, 832, 76808, 24, 1, 132, 8, 0},   /* 76% of three waves (7 chunks: not wide, two a warp) */
        {NB_FORMAT_INT4_SYM, 896, 76808, 16, 0, 0, 8, 0},  /* the integer formats past one wave: 17..32 tokens only */
        {NB_FORMAT_INT4_SYM, 896, 76808, 24, 1, 132, 8, 0},
        {NB_FORMAT_NVFP4, 5120, 27648, 32, 1, 132, 8, 0},  /* 108 tiles, the wave at 25..32 tokens */
        {NB_FORMAT_NVFP4, 5120, 27648, 24, 1, 132, 12, 0}, /* 1728 row blocks, 40 chunks: 72 wide tiles */
        {NB_FORMAT_MXFP4, 5120, 27648, 17, 1, 132, 12, 0},
        {NB_FORMAT_NVFP4, 4096, 28672, 24, 1, 132, 8, 4}, /* 1792 row blocks, 32 chunks: four a warp */
        {NB_FORMAT_NVFP4, 4096, 28672, 24, 1, 132, 8, 2}, /* rpw 2: 112 tiles fill 85% of 132, the 8-warp wave */
        {NB_FORMAT_NVFP4, 3584, 18944, 20, 1, 132, 8, 0},  /* 74 tiles x 3 splits would fill 222 of 264 slots */
        {NB_FORMAT_MXFP4, 4096, 12288, 17, 1, 132, 8, 0},  /* 48 x 2 of 132 */
        {NB_FORMAT_NVFP4, 14336, 4096, 24, 0, 0, 8, 0},    /* 16 x 8 of 132: 97% */
        {NB_FORMAT_MXFP4, 28672, 8192, 20, 0, 0, 8, 0},    /* 32 x 8 of 264 */
        {NB_FORMAT_NVFP4, 8192, 10240, 24, 0, 0, 8, 0},    /* 40 x 3 of 132: 91% */
        {NB_FORMAT_NVFP4, 4096, 24576, 24, 1, 132, 8, 0},  /* 96 x 2 of 264 */
        {NB_FORMAT_NVFP4, 4096, 28672, 32, 1, 132, 7, 4},
        {NB_FORMAT_NVFP4, 4096, 28672, 32, 0, 0, 8, 2},  /* rpw 2: 112 tiles fill 85% of a wave, no stream-K */
        {NB_FORMAT_MXFP4, 4096, 28672, 28, 0, 0, 8, 2},
        {NB_FORMAT_NVFP4, 5120, 13824, 24, 1, 132, 8, 0},  /* 864 row blocks (not wide): 54 x 2 of 132, the wave */
        {NB_FORMAT_NVFP4, 4096, 7168, 20, 0, 0, 8, 0},     /* 28 x 4 of 132: a tile for more than three CTAs */
        {NB_FORMAT_MXFP4, 3072, 9216, 24, 0, 0, 8, 0},     /* 36 x 3 */
        {NB_FORMAT_NVFP4, 8192, 28672, 32, 1, 132, 7, 4},
        {NB_FORMAT_NVFP4, 8192, 28672, 32, 1, 132, 8, 2}, /* rpw 2: 112 tiles, 64 chunks: the wave saves 9.7 a CTA */
        {NB_FORMAT_MXFP4, 8192, 28672, 25, 1, 132, 8, 2},
        {NB_FORMAT_NVFP4, 8192, 29568, 28, 1, 132, 8, 2}, /* 116 tiles, 64 chunks: 7.8 */
        {NB_FORMAT_NVFP4, 8192, 29568, 28, 1, 132, 7, 4},
        /* the integer and table formats: the wave where the split grid leaves a quarter of the SMs idle */
        {NB_FORMAT_INT4_SYM, 7168, 18432, 24, 1, 132, 8, 0}, /* 72 tiles, one split: 72 CTAs */
        {NB_FORMAT_INT8, 7168, 18432, 32, 1, 132, 8, 0},
        {NB_FORMAT_NF4, 3584, 18944, 20, 1, 132, 8, 0},    /* 74 CTAs */
        {NB_FORMAT_INT4_SYM, 5120, 25600, 24, 0, 0, 8, 0}, /* 100 tiles: 76% of the SMs */
        {NB_FORMAT_INT4_SYM, 8192, 28672, 32, 1, 132, 8, 0}, /* 112 tiles (25..32 tokens, 64 chunks) */
        {NB_FORMAT_NF4, 5120, 27648, 28, 1, 132, 8, 0},      /* 108 tiles, 40 chunks */
        {NB_FORMAT_INT8, 5120, 27648, 32, 1, 132, 8, 0},
        {NB_FORMAT_INT4_SYM, 8192, 28672, 24, 0, 0, 8, 0},   /* (17..24 tokens: the quarter rule only) */
        {NB_FORMAT_INT4_SYM, 8192, 8192, 32, 0, 0, 8, 0},    /* 32 tiles */
        {NB_FORMAT_INT4_SYM, 18944, 3584, 28, 0, 0, 8, 0},   /* 14 tiles */
        /* 9..16 tokens: the resident CTAs where the split grid leaves a tenth of the slots idle and a
         * tile is shared by at most four CTAs */
        {NB_FORMAT_NVFP4, 7168, 18432, 16, 1, 264, 8, 0},  /* 72 tiles x 3 splits: 216 of 264 */
        {NB_FORMAT_MXFP4, 3584, 18944, 9, 1, 264, 8, 0},   /* 74 x 3 */
        {NB_FORMAT_INT4_SYM, 7168, 18432, 12, 1, 264, 8, 0},
        {NB_FORMAT_NF4, 8192, 57344, 16, 1, 264, 8, 0},
        {NB_FORMAT_INT8, 5120, 25600, 16, 1, 264, 8, 0},   /* 100 x 2 */
        {NB_FORMAT_NVFP4, 4096, 14336, 16, 0, 0, 8, 0},    /* 56 tiles: 4.7 CTAs a tile */
        {NB_FORMAT_NVFP4, 14336, 4096, 16, 0, 0, 8, 0},    /* 16 tiles */
        {NB_FORMAT_INT4_SYM, 8192, 8192, 16, 0, 0, 8, 0},  /* 32 x 8 splits fill 97% */
        {NB_FORMAT_NVFP4, 4096, 12288, 16, 0, 0, 8, 0},    /* 48 x 5: 91% */
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        nbi_gemm_plan p;
        const nbi_request want = {.rpw = cases[i].rpw};
        if (!plan(ctx, cases[i].fmt, cases[i].k, cases[i].n, cases[i].m, cases[i].rpw ? &want : NULL, &p)) continue;
        const int rpw = cases[i].rpw ? cases[i].rpw : 2;
        const int64_t rows = 16 * rpw * cases[i].warps, tiles = (cases[i].n + rows - 1) / rows;
        const int64_t units = tiles * ((cases[i].k + 127) / 128);
        const int sk = nbi_plan_stream_k(&p);
        CHECK(p.path == NBI_PATH_GEMV && p.xsh && p.tiles_n == tiles && sk == cases[i].sk && p.warps == cases[i].warps &&
                  p.rpw == rpw,
              "%lld -> %lld m = %lld: staged kernel over %d tiles (want %lld), stream-K %d (want %d), %d warps (want "
              "%d), rpw %d (want %d)", (long long)cases[i].k, (long long)cases[i].n, (long long)cases[i].m, p.tiles_n,
              (long long)tiles, sk, cases[i].sk, p.warps, cases[i].warps, p.rpw, rpw);
        /* the plan's configuration (what `nibble tune` records and nb_gemm_ex replays) gives it back */
        const nb_gemm_config cfg = nbi_config_of(&p);
        const nbi_request rq = nbi_request_of(&cfg);
        nbi_gemm_plan q;
        CHECK(plan(ctx, cases[i].fmt, cases[i].k, cases[i].n, cases[i].m, &rq, &q) && q.path == p.path &&
                  q.xsh == p.xsh && q.warps == p.warps && q.grid_x == p.grid_x && q.tiles_n == p.tiles_n &&
                  q.splits == p.splits && q.chunks_per_split == p.chunks_per_split,
              "%lld -> %lld m = %lld: its configuration replans to xsh %d warps %d grid %d tiles %d splits %d (want "
              "%d %d %d %d %d)", (long long)cases[i].k, (long long)cases[i].n, (long long)cases[i].m, q.xsh, q.warps,
              q.grid_x, q.tiles_n, q.splits, p.xsh, p.warps, p.grid_x, p.tiles_n, p.splits);
        if (!sk) continue;
        CHECK(p.grid_x == cases[i].ctas && p.splits == 1 && (int64_t)p.chunks_per_split * p.grid_x >= units &&
                  (int64_t)(p.chunks_per_split - 1) * p.grid_x < units && (p.xsh == 2) == (cases[i].m > 16),
              "%lld -> %lld m = %lld: %d CTAs (want %d) of %d chunks over %lld units, xsh %d",
              (long long)cases[i].k, (long long)cases[i].n, (long long)cases[i].m, p.grid_x, cases[i].ctas,
              p.chunks_per_split, (long long)units, p.xsh);
        /* slot b: a partial tile of 16 rpw rows per warp x 8 mt tokens per CTA */
        CHECK(p.ws_partial_bytes == (size_t)p.grid_x * (size_t)rows * (8 * p.mt) * sizeof(float) &&
                  p.ws_counter_bytes > 0 && p.ws_partial_bytes + p.ws_counter_bytes <= nbi_plan_workspace(ctx, &p),
              "%lld -> %lld m = %lld: stream-K workspace %zu + %zu", (long long)cases[i].k, (long long)cases[i].n,
              (long long)cases[i].m, p.ws_partial_bytes, p.ws_counter_bytes);
    }
    nb_context_destroy(ctx);
}

/* The tensor-core path's stream-K grid (plan.c tc_stream_k): where it was
 * measured faster on the H100 (2026-11-27; the 64-token tile on the H200,
 * 2026-12-01, and the 128-token tile below 128 tokens) and nowhere it lost;
 * never for a requested k split, m below 65 for the 128-token tile and
 * below the 256-token one (the 64-token tile: 33..64 only), activations past 60% of the L2 or
 * NIBBLE_SM90_SK=0; NIBBLE_SM90_SK=1 takes it wherever it can run, with
 * valid plans (the integer and table formats: test_integer_formats). */
static void test_tc_stream_k(void) {
    nb_context *ctx = h100();
    static const struct {
        nb_format fmt;
        int64_t k, n, m;
        int sk, bn;
    } cases[] = {
        {NB_FORMAT_NVFP4, 8192, 10240, 128, 1, 128},  /* 80 tiles: 55.9 -> 41.4 us */
        {NB_FORMAT_MXFP4, 8192, 10240, 256, 1, 256},  /* 80.1 -> 64.2 (nvfp4) */
        {NB_FORMAT_NVFP4, 27648, 5120, 512, 1, 256},  /* 80 tiles: 267.1 -> 228.4 */
        {NB_FORMAT_NVFP4, 4096, 6144, 384, 1, 128},   /* 144 tiles: 43.1 -> 37.5 (192-token tiles: 40.6) */
        {NB_FORMAT_NVFP4, 8192, 8192, 384, 0, 192},   /* 192-token tiles: 90.0 -> 85.1 */
        {NB_FORMAT_NVFP4, 8192, 57344, 384, 0, 192},  /* 707.4 -> 624.8 */
        {NB_FORMAT_NVFP4, 4096, 4096, 256, 0, 128},   /* five CTAs to a tile: 27.8 against 20.3 (cluster) */
        {NB_FORMAT_NVFP4, 8192, 8192, 512, 0, 256},   /* 128 tiles: within a wave */
        {NB_FORMAT_NVFP4, 28672, 8192, 1024, 0, 256}, /* 59 MB of activations: 793 against 659 */
        /* 128-token tiles at 65..127 tokens (H200, 2026-12-01, us, the plan
         * before -> the grid; NBI_SK128_PART_*) */
        {NB_FORMAT_NVFP4, 8192, 10240, 100, 1, 128},  /* 80 tiles: 57.1 -> 40.6 at m = 96 */
        {NB_FORMAT_MXFP4, 5120, 10240, 72, 1, 128},   /* 80 tiles: 37.4 -> 32.3 */
        {NB_FORMAT_NVFP4, 4096, 6144, 120, 1, 128},   /* 48 tiles x 2 splits on 96 SMs: 19.5 -> 17.8 */
        {NB_FORMAT_NVFP4, 8192, 5120, 96, 1, 128},    /* 40 x 3 on 120, 19.4 chunks a CTA: 25.8 -> 25.0 */
        {NB_FORMAT_NVFP4, 3072, 8192, 96, 0, 128},    /* 64 x 2 on 128: 16.8 against 17.9 */
        {NB_FORMAT_NVFP4, 5120, 5120, 72, 0, 128},    /* 40 x 3 on 120, 12.1 chunks: 19.5 against 20.6 */
        {NB_FORMAT_NF4, 3072, 8192, 72, 0, 128},      /* 18.2 against 19.4 */
        /* 64-token tiles at 33..64 tokens (H200, 2026-12-01, us, the plan
         * before -> the grid): 80 tiles x 64 chunks 46.4 -> 31.7 */
        {NB_FORMAT_NVFP4, 8192, 10240, 64, 1, 64},
        {NB_FORMAT_MXFP4, 5120, 10240, 48, 1, 64},    /* 28.6 -> 21.4 */
        {NB_FORMAT_NVFP4, 4096, 6144, 40, 1, 64},     /* 48 tiles x 2 splits: 16.0 -> 13.7 */
        {NB_FORMAT_NVFP4, 4096, 28672, 64, 1, 64},    /* 224 tiles, two waves: 49.2 -> 42.8 */
        {NB_FORMAT_NVFP4, 2048, 8192, 64, 0, 64},     /* 64 tiles x 2 splits: 11.0 against 11.4 */
        {NB_FORMAT_NVFP4, 3072, 8192, 48, 0, 64},     /* 13.7 against 13.9 */
        {NB_FORMAT_NVFP4, 8192, 2048, 64, 0, 64},     /* 16 tiles x 8 splits: 12.1 against 12.6 */
        {NB_FORMAT_NVFP4, 4096, 4096, 40, 0, 64},     /* 32 tiles x 4 splits: 11.2 against 11.3 */
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        nbi_gemm_plan p;
        if (!plan(ctx, cases[i].fmt, cases[i].k, cases[i].n, cases[i].m, NULL, &p)) continue;
        check_valid(ctx, &p, cases[i].k, cases[i].n, cases[i].m);
        CHECK(p.sk == cases[i].sk && (!cases[i].bn || p.bn == cases[i].bn),
              "%lld -> %lld m = %lld (%s): stream-K %d (want %d), bn %d (want %d)", (long long)cases[i].k,
              (long long)cases[i].n, (long long)cases[i].m, nbi_traits(cases[i].fmt)->name, p.sk, cases[i].sk, p.bn,
              cases[i].bn);
    }
    nbi_request rq;
    memset(&rq, 0, sizeof rq);
    rq.splits = 2; /* a requested k split that can run keeps it, even with the grid forced */
    nbi_gemm_plan p;
    ctx->env_sk = 1;
    if (plan(ctx, NB_FORMAT_NVFP4, 8192, 8192, 256, &rq, &p))
        CHECK(!p.sk && p.splits == 2, "8192 -> 8192 m = 256, 2 splits asked: %d splits, stream-K %d", p.splits, p.sk);
    for (int mode = 0; mode < 2; mode++) {
        ctx->env_sk = mode; /* NIBBLE_SM90_SK=0, =1 */
        int sks = 0, plans = 0;
        for (size_t s = 0; s < sizeof k_shapes / sizeof k_shapes[0]; s++)
            for (size_t i = 0; i < sizeof k_ms / sizeof k_ms[0]; i++) {
                if (!plan(ctx, NB_FORMAT_NVFP4, k_shapes[s][0], k_shapes[s][1], k_ms[i], NULL, &p)) continue;
                check_valid(ctx, &p, k_shapes[s][0], k_shapes[s][1], k_ms[i]);
                sks += p.sk, plans++;
            }
        CHECK(mode ? sks > plans / 2 : sks == 0, "NIBBLE_SM90_SK=%d: %d of %d plans on the stream-K grid", mode, sks,
              plans);
    }
    /* a configuration's stream_k (nbi_request.sk): 1 takes the grid where the
     * heuristic would not, -1 leaves it where it would, 1 where it cannot
     * run (below its tile's range, or NIBBLE_SM90_SK=0) is NB_ERR_UNSUPPORTED */
    ctx->env_sk = -1;
    memset(&rq, 0, sizeof rq);
    rq.path = NB_GEMM_PATH_TENSOR_CORE, rq.sk = 1;
    if (plan(ctx, NB_FORMAT_NVFP4, 3072, 8192, 96, &rq, &p)) {
        check_valid(ctx, &p, 3072, 8192, 96);
        CHECK(p.sk && p.bn == 128, "3072 -> 8192 m = 96, stream_k = 1: stream-K %d, bn %d", p.sk, p.bn);
    }
    rq.sk = -1;
    if (plan(ctx, NB_FORMAT_NVFP4, 8192, 10240, 96, &rq, &p))
        CHECK(!p.sk, "8192 -> 10240 m = 96, stream_k = -1: stream-K %d", p.sk);
    rq.sk = 1, rq.bn = 128;
    nb_gemm_desc g = problem(NB_FORMAT_NVFP4, 8192, 10240, 40);
    CHECK(nbi_plan(ctx, &g, &rq, &p) == NB_ERR_UNSUPPORTED && strstr(nb_last_error(), "stream_k = 1 does not run"),
          "stream_k = 1 with the 128-token tile at m = 40: %s", nb_last_error());
    ctx->env_sk = 0;
    rq.bn = 0;
    g = problem(NB_FORMAT_NVFP4, 8192, 10240, 96);
    CHECK(nbi_plan(ctx, &g, &rq, &p) == NB_ERR_UNSUPPORTED && strstr(nb_last_error(), "NIBBLE_SM90_SK=0"),
          "stream_k = 1 under NIBBLE_SM90_SK=0: %s", nb_last_error());
    nb_context_destroy(ctx);
}

/* The planner's MoE plan for a SwiGLU layer with BF16 activations and
 * packed expert weights; 0 (a failed check) where it has none. */
static int moe_plan(nb_context *ctx, nb_format fmt, const char *name, int m, int E, int K, int64_t H, int64_t I,
                    nbi_moe_plan *p) {
    nb_moe_desc d;
    CHECK(nb_moe_desc_init(&d, fmt, m, E, K, H, I, NB_MOE_ACT_SWIGLU, NB_DTYPE_BF16) == NB_OK, "moe desc %s: %s", name,
          nb_last_error());
    d.gate_up.layout = d.down.layout = NB_LAYOUT_PACKED;
    const nb_status st = nbi_moe_plan_make(ctx, &d, p, "test_plan");
    CHECK(st == NB_OK, "moe plan %s m=%d: %s", name, m, nb_last_error());
    return st == NB_OK;
}

/* The MoE decode kernels' k split (moe.c moe_kw, moe_down_kw4) and inline
 * routing on the four bench_moe layers: the choices measured fastest on an
 * H100 (bench/RESULTS.md, gate_up's k split; down launched early) and, for
 * down at batch 1 over four warps, on an H200; the rules' bounds on a
 * sweep. */
static void test_moe_kw(void) {
    static const struct {
        const char *name;
        int64_t H, I;
        int E, K, m, gu, dn, inl;
    } cases[] = {
        {"gpt-oss-120b", 2880, 2880, 128, 4, 1, 2, 4, 1},   {"gpt-oss-120b", 2880, 2880, 128, 4, 8, 1, 1, 0},
        {"gpt-oss-120b", 2880, 2880, 128, 4, 32, 1, 1, 0},  {"gpt-oss-20b", 2880, 2880, 32, 4, 1, 2, 4, 1},
        {"gpt-oss-20b", 2880, 2880, 32, 4, 8, 2, 1, 0},     {"gpt-oss-20b", 2880, 2880, 32, 4, 32, 1, 1, 0},
        {"qwen3-30b-a3b", 2048, 768, 128, 8, 1, 2, 2, 1},   {"qwen3-30b-a3b", 2048, 768, 128, 8, 8, 1, 1, 0},
        {"qwen3-30b-a3b", 2048, 768, 128, 8, 32, 1, 1, 0},  {"deepseek-v3", 7168, 2048, 256, 8, 1, 4, 1, 0},
        {"deepseek-v3", 7168, 2048, 256, 8, 8, 1, 1, 0},    {"deepseek-v3", 7168, 2048, 256, 8, 32, 1, 1, 0},
    };
    nb_context *ctx = h100();
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        for (int f = 0; f < 2; f++) {
            nbi_moe_plan p;
            if (!moe_plan(ctx, f ? NB_FORMAT_MXFP4 : NB_FORMAT_NVFP4, cases[i].name, cases[i].m, cases[i].E,
                          cases[i].K, cases[i].H, cases[i].I, &p))
                continue;
            CHECK(!p.tc && p.gu_kw == cases[i].gu && p.dn_kw == cases[i].dn && p.inline_route == cases[i].inl,
                  "moe %s %s m=%d: kw %d/%d inline %d, measured best %d/%d inline %d", cases[i].name,
                  f ? "mxfp4" : "nvfp4", cases[i].m, p.gu_kw, p.dn_kw, p.inline_route, cases[i].gu, cases[i].dn,
                  cases[i].inl);
        }
    }
    /* down over four warps at batch 1 where that grid is more than two and
     * at most three CTAs per SM (132 SMs; I = 2880, 23 chunks, 6 a warp):
     * hidden 2048, 2112, 2144, 3168, 3200 give 256, 264, 268, 396, 400 */
    static const struct {
        int64_t H;
        int dn;
    } edges[] = {{2048, 2}, {2112, 2}, {2144, 4}, {3168, 4}, {3200, 2}};
    for (size_t i = 0; i < sizeof edges / sizeof edges[0]; i++) {
        nbi_moe_plan p;
        if (!moe_plan(ctx, NB_FORMAT_MXFP4, "edge", 1, 128, 4, edges[i].H, 2880, &p)) continue;
        CHECK(!p.tc && p.inline_route && p.gu_kw == 2 && p.dn_kw == edges[i].dn &&
                  p.dn_groups == (p.dn_row_blocks + 8 / p.dn_kw - 1) / (8 / p.dn_kw),
              "moe H=%lld I=2880 m=1: kw %d/%d inline %d groups %lld, want down kw %d", (long long)edges[i].H, p.gu_kw,
              p.dn_kw, p.inline_route, (long long)p.dn_groups, edges[i].dn);
    }
    /* the bounds, over hidden 256..16384 and batch 1..64: kw is a power of
     * two up to 8, and a split never leaves a warp fewer than 3 chunks
     * (kw = 2) or 8 (more; gate_up's own split keeps 12, the cases above;
     * down's four warps at batch 1, 4) */
    static const int64_t Hs[] = {256, 1024, 2048, 2880, 4096, 7168, 16384};
    static const int ms[] = {1, 2, 4, 8, 16, 64};
    int n = 0;
    for (size_t h = 0; h < sizeof Hs / sizeof Hs[0]; h++)
        for (size_t j = 0; j < sizeof ms / sizeof ms[0]; j++) {
            nb_moe_desc d;
            nbi_moe_plan p;
            if (nb_moe_desc_init(&d, NB_FORMAT_NVFP4, ms[j], 64, 4, Hs[h], 1024, NB_MOE_ACT_SWIGLU, NB_DTYPE_BF16))
                continue;
            d.gate_up.layout = d.down.layout = NB_LAYOUT_PACKED;
            if (nbi_moe_plan_make(ctx, &d, &p, "test_moe_kw") || p.tc) continue;
            const int kws[2] = {p.gu_kw, p.dn_kw};
            const int64_t kc[2] = {p.gu_kchunks, p.dn_kchunks};
            for (int q = 0; q < 2; q++) {
                const int kw = kws[q];
                const int64_t per = (kc[q] + kw - 1) / kw;
                CHECK((kw == 1 || kw == 2 || kw == 4 || kw == 8) &&
                          (kw == 1 || (kw == 2 && per >= 3) || per >= 8 || (q && kw == 4 && per >= 4 && p.inline_route)),
                      "moe sweep H=%lld m=%d %s: kw %d for %lld chunks", (long long)Hs[h], ms[j],
                      q ? "down" : "gate_up", kw, (long long)kc[q]);
            }
            n++;
        }
    CHECK(n >= 30, "moe sweep planned %d problems", n);
    nb_context_destroy(ctx);
}

/* Kernel 1's occupancy rule (plan.c, plan_decode): two CTAs per SM,
 * held by dynamic shared memory past the ring, where the registers let
 * three or more fit and three take no wave off a grid of more CTAs than
 * SMs; else as many as fit (the H100 measurements behind it: NOTES.md,
 * "Decode kernels: untested activation loads, ..."). */
static void test_decode_occupancy(void) {
    nb_context *ctx = h100();
    static const struct {
        int64_t k, n;
        int m, fit, held; /* 1: held to two per SM */
        const char *why;
    } cases[] = {
        {4096, 4096, 1, 3, 1, "256 CTAs: one wave at two or three per SM"},
        {4096, 4096, 8, 3, 1, "256 CTAs at m = 8"},
        {8192, 3072, 8, 3, 1, "192 CTAs at m = 8"},
        {4096, 6144, 8, 3, 0, "384 CTAs (kw = 8 at every m of one token tile)"},
        {4096, 6144, 1, 3, 0, "384 CTAs (kw = 8 at one token): one wave at three, two at two"},
        {14336, 4096, 1, 3, 1, "256 CTAs"},
        {28672, 8192, 1, 3, 1, "256 CTAs"},
        {8192, 10240, 1, 3, 0, "320 CTAs: one wave at three, two at two"},
        {8192, 10240, 8, 3, 0, "320 CTAs at m = 8"},
        {8192, 28672, 1, 3, 0, "896 CTAs: 3 waves at three, 4 at two"},
        {4096, 28672, 1, 3, 1, "256 CTAs (kw = 1 at one token, a balanced wave): one wave at two or three"},
        {8192, 57344, 1, 3, 0, "1792 CTAs: 5 waves at three, 7 at two"},
        {4096, 4096, 1, 2, 0, "registers for two only: nothing to hold"},
        {4096, 4096, 1, 4, 1, "four fit: one wave either way"},
        {4096, 1600, 1, 3, 0, "100 CTAs: fewer than SMs"},
        {4096, 1024, 1, 3, 1, "64 row blocks split along k into 192 CTAs"},
        {4096, 4096, 16, 3, 0, "two tiles (their instances fit two)"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        g_k1_fit = cases[i].fit;
        nbi_gemm_plan p;
        if (!plan(ctx, NB_FORMAT_NVFP4, cases[i].k, cases[i].n, cases[i].m, NULL, &p)) continue;
        if (p.path != NBI_PATH_GEMV || p.xsh) {
            CHECK(!cases[i].held && p.per_sm == 0 && p.dyn_smem == 0,
                  "%lld -> %lld m = %d (%s): a plan off kernel 1 holds nothing", (long long)cases[i].k,
                  (long long)cases[i].n, cases[i].m, cases[i].why);
            continue;
        }
        const int64_t ctas = (int64_t)p.grid_x * p.splits;
        const size_t want = ctx->info.smem_per_sm / 3 + 1 - 1024 - 1152;
        if (cases[i].held)
            CHECK(p.per_sm == 2 && (size_t)p.dyn_smem == want,
                  "%lld -> %lld m = %d, %lld CTAs, %d fit (%s): held to two per SM with %zu bytes (per_sm %d, %d "
                  "bytes)", (long long)cases[i].k, (long long)cases[i].n, cases[i].m, (long long)ctas, cases[i].fit,
                  cases[i].why, want, p.per_sm, p.dyn_smem);
        else
            CHECK(p.per_sm == 0 && p.dyn_smem == 0, "%lld -> %lld m = %d, %lld CTAs, %d fit (%s): not held (per_sm "
                  "%d)", (long long)cases[i].k, (long long)cases[i].n, cases[i].m, (long long)ctas, cases[i].fit,
                  cases[i].why, p.per_sm);
    }
    g_k1_fit = 3;
    nb_context_destroy(ctx);
}

/* Kernel 1's balanced wave (plan.c): a one-wave grid without a k split
 * takes the fewest row blocks a CTA that keep it within the CTAs per SM of
 * its busiest SMs, where that takes row blocks off them; every plan of
 * kernel 1 covers the row blocks exactly once. */
static void test_decode_balanced_wave(void) {
    nb_context *ctx = h100();
    const int64_t sms = ctx->info.sm_count;
    static const struct {
        nb_format fmt;
        int64_t k, n;
        int m;
        int rows, grid; /* k1_rows (0: warps / kw), CTAs */
        const char *why;
    } cases[] = {
        {NB_FORMAT_NVFP4, 4096, 28672, 1, 7, 256, "224 CTAs of 8 at kw = 1: 7 a CTA, 14 row blocks on 124 SMs"},
        {NB_FORMAT_MXFP4, 4096, 28672, 1, 7, 256, "the same in MXFP4"},
        {NB_FORMAT_NVFP4, 4096 - 96, 28672 - 40, 1, 7, 256, "1790 row blocks (the last partial): 7 a CTA"},
        {NB_FORMAT_NVFP4, 4096, 43008, 1, 7, 384, "336 CTAs of 8 on three per SM: 7 a CTA"},
        {NB_FORMAT_NVFP4, 3584, 18944, 2, 3, 395, "296 CTAs of 4 at kw = 2 on three per SM: 3 a CTA"},
        {NB_FORMAT_NVFP4, 4096, 36864, 1, 6, 384, "one token: kw = 1's 288 CTAs of 8 (2.2 per SM): 6 a CTA"},
        {NB_FORMAT_NVFP4, 6144, 20480, 1, 0, 640, "one token: kw = 4, as kw = 2's 320 CTAs of 4 cannot be balanced"},
        {NB_FORMAT_NVFP4, 512, 18944, 1, 0, 296, "the same grid on 2 chunks a warp: left alone"},
        {NB_FORMAT_INT4_SYM, 4096, 28672, 1, 7, 256, "int4_sym at kw = 1"},
        {NB_FORMAT_NF4, 4096, 28672, 4, 7, 256, "nf4 at m = 4, two CTAs per SM"},
        {NB_FORMAT_NVFP4, 8192, 8192, 1, 0, 256, "256 CTAs of 2 (kw = 4): 2 a CTA is the fewest within two per SM"},
        {NB_FORMAT_NVFP4, 4096, 4096, 1, 0, 256, "kw = 8: one row block a CTA"},
        {NB_FORMAT_NVFP4, 8192, 57344, 1, 0, 1792, "several waves: left alone"},
        {NB_FORMAT_NVFP4, 4096, 1024, 1, 0, 0, "64 row blocks split along k: left alone"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        nbi_gemm_plan p;
        if (!plan(ctx, cases[i].fmt, cases[i].k, cases[i].n, cases[i].m, NULL, &p)) continue;
        const int kernel1 = p.path == NBI_PATH_GEMV && !p.xsh;
        CHECK(kernel1 && p.k1_rows == cases[i].rows && (cases[i].grid == 0 || p.grid_x == cases[i].grid) &&
                  (cases[i].rows == 0 || p.splits == 1),
              "%s %lld -> %lld m = %d (%s): kernel 1 with %d row blocks a CTA on %d CTAs (got kernel 1 %d, %d on %d, "
              "kw %d, %d splits)", nbi_traits(cases[i].fmt)->name, (long long)cases[i].k, (long long)cases[i].n,
              cases[i].m, cases[i].why, cases[i].rows, cases[i].grid, kernel1, p.k1_rows, p.grid_x, p.kw, p.splits);
    }
    /* every kernel-1 plan of the formats over the shapes at 1..8 tokens:
     * its CTAs cover the row blocks, none empty, and a balanced wave loads
     * the busiest SM less than the grid it replaced, with no more CTAs per
     * SM */
    static const nb_format fmts[4] = {NB_FORMAT_NVFP4, NB_FORMAT_MXFP4, NB_FORMAT_INT4_SYM, NB_FORMAT_NF4};
    int balanced = 0, bad = 0;
    for (int f = 0; f < 4; f++)
        for (size_t s = 0; s < sizeof k_shapes / sizeof k_shapes[0]; s++)
            for (int m = 1; m <= 8; m++) {
                nbi_gemm_plan p;
                if (f >= 2 && k_shapes[s][0] % 128) continue; /* (the integer and table formats' groups) */
                if (!plan(ctx, fmts[f], k_shapes[s][0], k_shapes[s][1], m, NULL, &p)) continue;
                if (p.path != NBI_PATH_GEMV || p.xsh) continue;
                const int64_t q0 = p.warps / p.kw, q = p.k1_rows ? p.k1_rows : q0;
                int ok = q >= 1 && q <= q0 && (int64_t)p.grid_x * q >= p.row_blocks &&
                         (int64_t)(p.grid_x - 1) * q < p.row_blocks;
                if (p.k1_rows) {
                    const int64_t g0 = (p.row_blocks + q0 - 1) / q0, w0 = (g0 + sms - 1) / sms,
                                  w = (p.grid_x + sms - 1) / sms;
                    ok = ok && p.splits == 1 && q < q0 && w <= w0 && w * q < w0 * q0 &&
                         (p.chunks_per_split + p.kw - 1) / p.kw > 8;
                    balanced++;
                }
                if (!ok && bad++ < 5)
                    printf("  %s %lld -> %lld m = %d: %d CTAs of %lld row blocks (kw %d) for %lld\n",
                           nbi_traits(fmts[f])->name, (long long)k_shapes[s][0], (long long)k_shapes[s][1], m,
                           p.grid_x, (long long)q, p.kw, (long long)p.row_blocks);
            }
    CHECK(bad == 0 && balanced > 0, "kernel 1's grids cover their row blocks, balanced waves load the SMs less (%d "
          "balanced, %d wrong)", balanced, bad);
    nb_context_destroy(ctx);
}

/* 2..8 tokens (plan.c, wave8): the E2M1 formats run kernel 2 on one
 * stream-K wave of two CTAs per SM wherever the 256-row tiles are at least
 * half the SMs and give every CTA 12 chunks or more; one token and other
 * layers keep their rules, as do the integer and table formats and
 * a request of plain, of one row block per warp or of a k split.  At two
 * tokens kernel 1 takes the layers where the one-token rule gives it a
 * plan (4096 -> 28672 kw 1, 7168 -> 18432 kw 2), the wave the others
 * (8192 -> 57344: kw 1 would be 448 CTAs, past one wave). */
static void test_decode_wave8(void) {
    nb_context *ctx = h100();
    const int sms = ctx->info.sm_count;
    static const struct {
        int64_t k, n;
        int m, wave;
    } cases[] = {
        {4096, 28672, 1, 0}, {4096, 28672, 2, 0},  {4096, 28672, 3, 1},  {4096, 28672, 5, 1},  {3584, 18944, 4, 0},
        {7168, 18432, 2, 0}, {8192, 28672, 2, 1},  {5120, 25600, 2, 1},
        {7168, 18432, 4, 1}, {5120, 27648, 3, 1},  {8192, 57344, 1, 0},  {8192, 57344, 2, 1},
        {8192, 28672, 1, 0}, {8192, 28672, 7, 1},  {4096, 16896, 4, 0},  {8192, 16896, 4, 1},
        {8192, 16384, 4, 0}, {8192, 8192, 2, 0},  {14336, 4096, 4, 0},  {28672, 8192, 8, 0},
        {4096, 4096, 1, 0},  {4096, 14336, 8, 0}, {27648, 5120, 6, 0},  {4096, 28672, 9, 0},
        {4192, 28768, 1, 0}, {4192, 28768, 2, 1}, {4192, 28768, 8, 1}, {7168, 18432, 1, 0},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++)
        for (int f = 0; f < 2; f++) {
            nbi_gemm_plan p;
            const nb_format fmt = f ? NB_FORMAT_MXFP4 : NB_FORMAT_NVFP4;
            if (!plan(ctx, fmt, cases[i].k, cases[i].n, cases[i].m, NULL, &p)) continue;
            const int wave = p.path == NBI_PATH_GEMV && p.xsh == 1 && p.rpw == 2 && p.splits == 1 &&
                             nbi_plan_stream_k(&p) && p.grid_x == 2 * sms && p.mt == 1;
            CHECK(wave == cases[i].wave, "%s %lld -> %lld m = %d: %s (path %d xsh %d rpw %d splits %d grid %d)",
                  f ? "mxfp4" : "nvfp4", (long long)cases[i].k, (long long)cases[i].n, cases[i].m,
                  cases[i].wave ? "kernel 2's wave" : "not the wave", p.path, p.xsh, p.rpw, p.splits, p.grid_x);
            if (wave) /* every chunk in some CTA's run, the workspace sized for the grid's slots */
                CHECK((int64_t)p.grid_x * p.chunks_per_split >= (int64_t)p.tiles_n * p.kchunks &&
                          p.ws_partial_bytes >= (size_t)p.grid_x * 256 * 8 * sizeof(float),
                      "%lld -> %lld m = %d: the wave's runs (%d x %d for %d x %lld) and workspace (%zu)",
                      (long long)cases[i].k, (long long)cases[i].n, cases[i].m, p.grid_x, p.chunks_per_split,
                      p.tiles_n, (long long)p.kchunks, p.ws_partial_bytes);
        }
    /* requests keep the rules: plain, one row block per warp, a k split */
    const nbi_request reqs[3] = {{.variant = 1}, {.rpw = 1}, {.splits = 2}};
    for (int r = 0; r < 3; r++) {
        nbi_gemm_plan p;
        if (!plan(ctx, NB_FORMAT_NVFP4, 4096, 28672, 4, &reqs[r], &p)) continue;
        CHECK(!nbi_plan_stream_k(&p), "4096 -> 28672 m = 4, request %d: no wave (xsh %d rpw %d splits %d grid %d)", r,
              p.xsh, p.rpw, p.splits, p.grid_x);
    }
    /* the integer and table formats keep kernel 1 at one token tile */
    const nb_format other[3] = {NB_FORMAT_INT4_SYM, NB_FORMAT_NF4, NB_FORMAT_INT8};
    for (int f = 0; f < 3; f++) {
        nbi_gemm_plan p;
        if (!plan(ctx, other[f], 4096, 28672, 4, NULL, &p)) continue;
        CHECK(!nbi_plan_stream_k(&p), "format %d 4096 -> 28672 m = 4: no wave (xsh %d grid %d)", (int)other[f], p.xsh,
              p.grid_x);
    }
    nb_context_destroy(ctx);
}

/* 8 tokens on layers whose column tiles leave SMs idle (plan.c,
 * plan_decode_split): the E2M1 formats run kernel 2 with the split that
 * puts two CTAs of 15 chunks or more on every SM (28672 -> 8192: 8), else
 * one of 12 or more (8192 -> 10240: 3 of 21 chunks), else splits of about
 * 10 chunks where the CTAs cover the SMs in full last waves; kernel 1 on
 * the 4096-wide layers and where that grid would leave a fifth of its last
 * CTA per SM's slots empty (3584 -> 18944: 74 tiles x 4 splits), and the
 * same splits where the tiles are more than the SMs but fewer than the
 * resident CTAs; nf4 keeps kernel 1, int4 kernel 2 with the split that
 * fills one resident wave. */
static void test_decode_m8(void) {
    nb_context *ctx = h100();
    static const struct {
        int64_t k, n;
        int splits; /* 0: kernel 1; -1: kernel 2's stream-K wave (test_decode_wave8) */
    } cases[] = {
        {4096, 4096, 0},   {4096, 6144, 0},   {14336, 4096, 8}, {8192, 8192, 4},   {4096, 28672, -1},
        {5120, 27648, -1}, {8192, 10240, 3}, {28672, 8192, 8}, {27648, 5120, 13}, {5120, 10240, 3},
        {13824, 5120, 6},  {4096, 14336, 2}, {4096, 22528, 4}, {3584, 18944, 0},  {18944, 3584, 0},
        {18432, 7168, 9},
        /* more tiles than SMs, fewer than two per SM: 224, 216, 144 tiles (two splits before the wave) */
        {8192, 57344, -1},  {5120, 55296, -1}, {7168, 36864, -1},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++)
        for (int f = 0; f < 2; f++) {
            nbi_gemm_plan p;
            if (!plan(ctx, f ? NB_FORMAT_MXFP4 : NB_FORMAT_NVFP4, cases[i].k, cases[i].n, 8, NULL, &p)) continue;
            if (cases[i].splits < 0)
                CHECK(p.path == NBI_PATH_GEMV && p.xsh == 1 && p.rpw == 2 && nbi_plan_stream_k(&p),
                      "%s %lld -> %lld m = 8: kernel 2's stream-K wave (path %d xsh %d rpw %d splits %d grid %d)",
                      f ? "mxfp4" : "nvfp4", (long long)cases[i].k, (long long)cases[i].n, p.path, p.xsh, p.rpw,
                      p.splits, p.grid_x);
            else if (cases[i].splits)
                CHECK(p.path == NBI_PATH_GEMV && p.xsh && p.rpw == 2 && p.splits == cases[i].splits,
                      "%s %lld -> %lld m = 8: kernel 2 with %d splits (path %d xsh %d rpw %d splits %d)",
                      f ? "mxfp4" : "nvfp4", (long long)cases[i].k, (long long)cases[i].n, cases[i].splits, p.path,
                      p.xsh, p.rpw, p.splits);
            else
                CHECK(p.path == NBI_PATH_GEMV && !p.xsh, "%s %lld -> %lld m = 8: kernel 1 (xsh %d splits %d)",
                      f ? "mxfp4" : "nvfp4", (long long)cases[i].k, (long long)cases[i].n, p.xsh, p.splits);
        }
    nb_context_destroy(ctx);
}

/* 5..8 tokens, the E2M1 formats (plan.c, k2_balanced_split): kernel 2's
 * split grid holds two CTAs per SM of at least 15 chunks each where k is
 * long (5..7 tokens take kernel 2 only there), else at 8 tokens one per SM
 * of at least 12 on layers of 16 tiles or more; every kernel-2 split grid
 * at 5..8 tokens fills at least four fifths of its last CTA per SM's
 * slots; kernel 1 takes the one-token rule's warps per row block at every
 * m of one token tile (4096 -> 6144: kw 8, 384 CTAs; 4096 -> 22528: kw 2);
 * requests keep their choices. */
static void test_decode_balanced_split(void) {
    nb_context *ctx = h100();
    const int64_t sms = ctx->info.sm_count;
    static const struct {
        int64_t k, n;
        int m, splits; /* 0: kernel 1 */
        int kw;        /* kernel 1's warps per row block (0: not checked) */
    } cases[] = {
        {28672, 8192, 5, 8, 0},  {28672, 8192, 7, 8, 0},  {25600, 5120, 6, 13, 0}, {18432, 7168, 5, 9, 0},
        {29568, 8192, 6, 8, 0},  {8192, 10240, 6, 0, 4},  {14336, 4096, 6, 0, 8},  {8192, 8192, 6, 0, 4},
        {13824, 5120, 6, 0, 8},  {13824, 5120, 8, 6, 0},  {14336, 5120, 8, 6, 0},  {8192, 5120, 8, 0, 8},
        {4096, 6144, 2, 0, 8},   {4096, 6144, 5, 0, 8},   {4096, 6144, 8, 0, 8},   {4096, 22528, 3, 0, 2},
        {4096, 22528, 7, 0, 2},  {4096, 24576, 4, 0, 2},  {28672, 8192, 4, 0, 4},  {28672, 8192, 1, 0, 0},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++)
        for (int f = 0; f < 2; f++) {
            nbi_gemm_plan p;
            const nb_format fmt = f ? NB_FORMAT_MXFP4 : NB_FORMAT_NVFP4;
            if (!plan(ctx, fmt, cases[i].k, cases[i].n, cases[i].m, NULL, &p)) continue;
            if (cases[i].splits)
                CHECK(p.path == NBI_PATH_GEMV && p.xsh && p.rpw == 2 && !nbi_plan_stream_k(&p) &&
                          p.splits == cases[i].splits,
                      "%s %lld -> %lld m = %d: kernel 2 with %d splits (xsh %d rpw %d splits %d grid %d)",
                      f ? "mxfp4" : "nvfp4", (long long)cases[i].k, (long long)cases[i].n, cases[i].m,
                      cases[i].splits, p.xsh, p.rpw, p.splits, p.grid_x);
            else
                CHECK(p.path == NBI_PATH_GEMV && !p.xsh && (!cases[i].kw || p.kw == cases[i].kw),
                      "%s %lld -> %lld m = %d: kernel 1 at kw %d (xsh %d kw %d splits %d grid %d)",
                      f ? "mxfp4" : "nvfp4", (long long)cases[i].k, (long long)cases[i].n, cases[i].m, cases[i].kw,
                      p.xsh, p.kw, p.splits, p.grid_x);
        }
    /* every kernel-2 split grid of the E2M1 formats at 5..8 tokens over the shapes */
    int grids = 0, bad = 0;
    for (int f = 0; f < 2; f++)
        for (size_t s = 0; s < sizeof k_shapes / sizeof k_shapes[0]; s++)
            for (int m = 5; m <= 8; m++) {
                nbi_gemm_plan p;
                if (!plan(ctx, f ? NB_FORMAT_MXFP4 : NB_FORMAT_NVFP4, k_shapes[s][0], k_shapes[s][1], m, NULL, &p))
                    continue;
                if (p.path != NBI_PATH_GEMV || !p.xsh || p.splits < 2 || nbi_plan_stream_k(&p)) continue;
                const int64_t ctas = (int64_t)p.grid_x * p.splits, c = (ctas + sms - 1) / sms;
                grids++;
                if (5 * ctas < 4 * c * sms && bad++ < 5)
                    printf("  %s %lld -> %lld m = %d: %lld CTAs (%d x %d) on %lld SMs\n", f ? "mxfp4" : "nvfp4",
                           (long long)k_shapes[s][0], (long long)k_shapes[s][1], m, (long long)ctas, p.grid_x,
                           p.splits, (long long)sms);
            }
    CHECK(grids > 0 && bad == 0, "kernel 2's split grids at 5..8 tokens fill their last CTA per SM (%d grids, %d not)",
          grids, bad);
    /* requests keep their choices: plain, a k split, one row block per warp, a kw */
    const nbi_request reqs[4] = {{.variant = 1}, {.splits = 4}, {.rpw = 1}, {.kw = 4}};
    for (int r = 0; r < 4; r++) {
        nbi_gemm_plan p;
        if (!plan(ctx, NB_FORMAT_NVFP4, 28672, 8192, 6, &reqs[r], &p)) continue;
        const int ok = r == 0   ? !p.xsh
                       : r == 1 ? p.splits == 4
                       : r == 2 ? !p.xsh || p.rpw == 1
                                : !p.xsh && p.kw == 4;
        CHECK(ok, "28672 -> 8192 m = 6, request %d kept (xsh %d rpw %d kw %d splits %d)", r, p.xsh, p.rpw, p.kw,
              p.splits);
    }
    /* kernel 2's split grids of one to two CTAs per SM held to two where
     * three fit; one CTA per SM, or more than two, left alone */
    static const struct {
        int64_t k, n;
        int m, held;
    } caps[] = {{28672, 8192, 6, 1}, {28672, 8192, 8, 1}, {15392, 8000, 5, 1}, {25600, 5120, 7, 1},
                {8192, 10240, 8, 0}, {4096, 22528, 8, 0}, {14336, 4096, 8, 0}};
    const size_t want = ctx->info.smem_per_sm / 3 + 1 - 1024 - 1152;
    for (size_t i = 0; i < sizeof caps / sizeof caps[0]; i++) {
        nbi_gemm_plan p;
        if (!plan(ctx, NB_FORMAT_NVFP4, caps[i].k, caps[i].n, caps[i].m, NULL, &p)) continue;
        const int64_t ctas = (int64_t)p.grid_x * p.splits;
        CHECK(p.xsh && p.splits > 1 &&
                  (caps[i].held ? p.per_sm == 2 && (size_t)p.dyn_smem == want : p.per_sm == 0 && p.dyn_smem == 0),
              "%lld -> %lld m = %d: kernel 2's split grid of %lld CTAs %s (xsh %d splits %d per_sm %d, %d bytes)",
              (long long)caps[i].k, (long long)caps[i].n, caps[i].m, (long long)ctas,
              caps[i].held ? "held to two per SM" : "not held", p.xsh, p.splits, p.per_sm, p.dyn_smem);
    }
    nbi_gemm_plan p;
    if (plan(ctx, NB_FORMAT_NVFP4, 4096, 6144, 4, &(nbi_request){.kw = 4}, &p))
        CHECK(!p.xsh && p.kw == 4 && p.grid_x == 192, "4096 -> 6144 m = 4 with kw 4 asked: kw %d, %d CTAs", p.kw,
              p.grid_x);
    nb_context_destroy(ctx);
}

/* Kernel 1 of the integer and table formats at one token tile.  The table
 * formats' rule (two CTAs per SM): twice the warps per row block where the
 * grid would be between one and one and a half resident waves (8192 ->
 * 10240: 320 CTAs at kw = 4 on 264 slots, so kw = 8), not elsewhere (8192
 * -> 28672: 3.4 waves at kw = 4; 4096 -> 4096: kw = 8 already), not for
 * int4_sym (three CTAs per SM: 320 of 396 slots).  The one-token rule
 * (three CTAs per SM for int4_sym and int8 with groups of 128, two for nf4
 * and bnb_fp4) on both sides of its bounds: one wave, 32 chunks a warp (64
 * for int4 / int4_sym, 40 for the table formats; one warp a row block past
 * 32 only within two CTAs per SM),
 * 2..2.5 CTAs per SM, and where it halves the warps at least 1.5 CTAs per
 * SM.  The table formats' kw = 2 past six resident waves at kw = 4 (and
 * 40 chunks or more), not at 4.4-4.5 waves.  None when kw is asked for. */
static void test_table_kw(void) {
    nb_context *ctx = h100();
    static const struct {
        nb_format f;
        int64_t k, n, m;
        int kw;
    } cases[] = {
        {NB_FORMAT_NF4, 8192, 10240, 1, 8},  {NB_FORMAT_NF4, 8192, 10240, 8, 8},
        {NB_FORMAT_BNB_FP4, 8192, 10240, 1, 8}, {NB_FORMAT_NF4, 8192, 28672, 1, 4},
        {NB_FORMAT_NF4, 4096, 4096, 1, 8},   {NB_FORMAT_NF4, 28672, 8192, 1, 4},
        {NB_FORMAT_INT4_SYM, 8192, 10240, 1, 4},
        /* the one-token rule */
        {NB_FORMAT_INT4_SYM, 4096, 14336, 1, 2}, /* 224 CTAs at kw = 2 (448 at 4) */
        {NB_FORMAT_INT4_SYM, 4096, 28672, 4, 1}, /* 224 CTAs at kw = 1, 32 chunks a warp */
        {NB_FORMAT_INT4_SYM, 4096, 6144, 1, 8},  /* 384 CTAs: one wave of three per SM */
        {NB_FORMAT_INT4_SYM, 4096, 36864, 2, 1}, /* 288 CTAs at kw = 1, balanced to 384 of 6 row blocks */
        {NB_FORMAT_INT4_SYM, 6144, 20480, 1, 4}, /* kw = 2: 320 CTAs on 132 SMs, which no balance evens out */
        /* past 32 chunks a warp: the 4-bit integer formats to 64, the table formats to 40 */
        {NB_FORMAT_INT4_SYM, 5120, 27648, 1, 1}, /* 40 chunks, 216 CTAs balanced to 247 */
        {NB_FORMAT_INT4_SYM, 8192, 28672, 4, 1}, /* 64 chunks, 224 CTAs */
        {NB_FORMAT_INT4_SYM, 12288, 18944, 1, 2}, /* 96 chunks: kw = 2, 296 CTAs balanced to 395 */
        {NB_FORMAT_INT4_SYM, 36864, 6144, 1, 8}, /* 288 chunks: kw = 8, 384 CTAs */
        {NB_FORMAT_INT4_SYM, 7168, 36864, 1, 4}, /* kw = 1: 288 CTAs, over two per SM, 56 chunks */
        {NB_FORMAT_INT4_SYM, 8192, 43008, 1, 4}, /* kw = 1: 336 CTAs */
        {NB_FORMAT_INT8, 5120, 27648, 1, 4},     /* int8: 32 chunks still */
        {NB_FORMAT_NVFP4, 5120, 27648, 1, 4},    /* the E2M1 formats: 32 chunks */
        {NB_FORMAT_NF4, 5120, 27648, 1, 1},      /* 40 chunks */
        {NB_FORMAT_NF4, 5120, 32768, 4, 1},      /* 40 chunks, 256 CTAs */
        {NB_FORMAT_INT8, 5120, 13824, 1, 2},     /* 216 CTAs at kw = 2 */
        {NB_FORMAT_NF4, 4096, 14336, 1, 2},      /* 224 CTAs: one wave of two per SM */
        {NB_FORMAT_NF4, 2048, 28672, 2, 1},      /* 224 CTAs at kw = 1 */
        {NB_FORMAT_BNB_FP4, 4096, 16896, 4, 2},  /* 264 CTAs at kw = 2 */
        {NB_FORMAT_NF4, 4096, 22528, 1, 4},      /* kw = 1 would leave 176 CTAs, 1.3 a SM */
        {NB_FORMAT_NF4, 3584, 18944, 1, 4},      /* kw = 1 would leave 148 CTAs */
        {NB_FORMAT_NF4, 4096, 6144, 1, 4},       /* 192 CTAs (kw = 8: 384 on 264 slots) */
        /* the table formats past six resident waves: kw = 2 */
        {NB_FORMAT_NF4, 8192, 57344, 1, 2},      /* 1792 CTAs at kw = 4 on 264 slots */
        {NB_FORMAT_NF4, 8192, 57344, 8, 2},
        {NB_FORMAT_BNB_FP4, 5120, 55296, 4, 2},  /* 1728 */
        {NB_FORMAT_NF4, 7168, 36864, 1, 4},      /* 1152: 4.4 waves */
        {NB_FORMAT_NF4, 3584, 37888, 8, 4},      /* 1184 */
        {NB_FORMAT_NF4, 2048, 57344, 1, 4},      /* 1792, but 16 chunks */
        {NB_FORMAT_INT4_SYM, 8192, 57344, 1, 4}, /* not the integer formats */
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        nbi_gemm_plan p;
        if (!plan(ctx, cases[i].f, cases[i].k, cases[i].n, cases[i].m, NULL, &p)) continue;
        const int64_t rows = p.k1_rows ? p.k1_rows : 8 / p.kw; /* (a balanced wave: fewer a CTA) */
        CHECK(p.path == NBI_PATH_GEMV && !p.xsh && p.kw == cases[i].kw && p.splits == 1 &&
                  p.grid_x == (int)((p.row_blocks + rows - 1) / rows),
              "%s %lld -> %lld m = %lld: kernel 1 with kw = %d (xsh %d kw %d splits %d grid %d)",
              nbi_traits(cases[i].f)->name, (long long)cases[i].k, (long long)cases[i].n, (long long)cases[i].m,
              cases[i].kw, p.xsh, p.kw, p.splits, p.grid_x);
    }
    const nbi_request rq = {.path = NB_GEMM_PATH_DECODE, .kw = 4};
    nbi_gemm_plan p;
    if (plan(ctx, NB_FORMAT_NF4, 8192, 10240, 1, &rq, &p))
        CHECK(p.kw == 4 && p.grid_x == 320, "nf4 8192 -> 10240 m = 1 with kw = 4 asked: kw %d grid %d", p.kw, p.grid_x);
    if (plan(ctx, NB_FORMAT_NF4, 4096, 14336, 1, &rq, &p))
        CHECK(p.kw == 4 && p.grid_x == 448, "nf4 4096 -> 14336 m = 1 with kw = 4 asked: kw %d grid %d", p.kw, p.grid_x);
    if (plan(ctx, NB_FORMAT_NF4, 8192, 57344, 1, &rq, &p))
        CHECK(p.kw == 4 && p.grid_x == 1792, "nf4 8192 -> 57344 m = 1 with kw = 4 asked: kw %d grid %d", p.kw, p.grid_x);
    nb_context_destroy(ctx);
}

/* The MoE tensor-core tile width (moe.c moe_tc) on the bench layers at
 * prefill batches: the widths measured fastest on an H200 where they were
 * measured (bench/RESULTS.md, MoE tensor-core tiles), the model's choice at
 * 256 slots per expert, and the decode kernels below 24 slots per expert.
 * Only where the build has the Hopper kernels (sm_90a). */
static void test_moe_tile_width(void) {
    if (!nbi_cuda_has_sm90a()) {
        printf("(no sm_90a kernels in this build: the MoE tile width is not planned)\n");
        return;
    }
    static const struct {
        const char *name;
        int64_t H, I;
        int E, K, m, bn; /* bn 0: decode kernels */
    } cases[] = {
        {"gpt-oss-120b", 2880, 2880, 128, 4, 128, 0},    /* 4 slots per expert */
        {"gpt-oss-120b", 2880, 2880, 128, 4, 1024, 64},  /* 32 */
        {"gpt-oss-120b", 2880, 2880, 128, 4, 4096, 192}, /* 128 */
        {"gpt-oss-20b", 2880, 2880, 32, 4, 256, 64},     /* 32 */
        {"gpt-oss-20b", 2880, 2880, 32, 4, 1024, 192},   /* 128: one 192-token tile each, not 1.5 of 128 */
        {"gpt-oss-20b", 2880, 2880, 32, 4, 4096, 192},   /* 512 */
        {"qwen3-30b-a3b", 2048, 768, 128, 8, 1024, 128}, /* 64 */
        {"qwen3-30b-a3b", 2048, 768, 128, 8, 4096, 128}, /* 256 */
        {"deepseek-v3", 7168, 2048, 256, 8, 1024, 64},   /* 32 */
        {"deepseek-v3", 7168, 2048, 256, 8, 4096, 192},  /* 128 */
    };
    nb_context *ctx = h100();
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        nbi_moe_plan p;
        if (!moe_plan(ctx, NB_FORMAT_NVFP4, cases[i].name, cases[i].m, cases[i].E, cases[i].K, cases[i].H, cases[i].I,
                      &p))
            continue;
        CHECK(p.tc == cases[i].bn && (!p.tc || p.block == p.tc), "moe %s m=%d: tile %d (block %d), want %d",
              cases[i].name, cases[i].m, p.tc, p.block, cases[i].bn);
    }
    nb_context_destroy(ctx);
}

/* The decode-range rules measured on layers off the bench set (plan.c,
 * plan_decode_split / plan_decode / plan_tc; H200, 2026-11-29 and -30,
 * NOTES.md): at one token the most warps per row block whose grid is one
 * resident wave, unless that gives a warp more than 32 chunks or 2..2.5
 * CTAs per SM (2..8 tokens: kw = 2 where kw = 4 would make 1-1.5 resident
 * waves); at
 * 9..16 tokens kernel 2 with one CTA per SM where kernel 1's grid would
 * spill just past one wave, and one CTA per SM where two would run fewer
 * than 8 chunks each; at 17..24 tokens kernel 2 with one CTA per SM on
 * small grids unless its runs would be under 6 chunks (then the tensor
 * core); at 25..32 the tensor core up to 1.25 tiles of 128 rows per SM,
 * except where kernel 2's stream-K wave is ahead (a 256-row tile for every
 * second SM, or 24 chunks per SM on up to 32 tiles and 40 above; k2_wave,
 * 2026-11-29).  Each with a layer on either side of the rule, both E2M1
 * formats; then the integer and table formats' cases (their kernel-1 kw:
 * test_table_kw). */
static void test_decode_rules(void) {
    nb_context *ctx = h100();
    static const struct {
        int64_t k, n;
        int m;
        int path; /* NBI_PATH_GEMV or NBI_PATH_SM90 */
        int xs;   /* decode: kernel 2 (1) or kernel 1 (0) */
        int kw, splits; /* decode: kernel 1's kw (0: any), splits (0: any) */
        int one_per_sm; /* decode: kernel 2's instance of one CTA per SM */
        const char *why;
    } cases[] = {
        {5120, 13824, 1, NBI_PATH_GEMV, 0, 2, 1, 0, "432 CTAs at kw = 4 (54 tiles: no wave): kw = 2"},
        {5120, 13824, 4, NBI_PATH_GEMV, 0, 2, 1, 0, "the same at m = 4"},
        {8192, 10240, 1, NBI_PATH_GEMV, 0, 4, 1, 0, "320 CTAs: one wave at kw = 4"},
        {8192, 57344, 1, NBI_PATH_GEMV, 0, 4, 1, 0, "1792 CTAs at kw = 4, 16 chunks a warp: kernel 1 at m = 1"},
        {4096, 28672, 1, NBI_PATH_GEMV, 0, 1, 1, 0, "one token: 224 CTAs at kw = 1, 32 chunks a warp"},
        {4096, 24576, 1, NBI_PATH_GEMV, 0, 2, 1, 0, "one token: 384 CTAs at kw = 2 (2.9 a SM)"},
        {4096, 6144, 1, NBI_PATH_GEMV, 0, 8, 1, 0, "one token: 384 CTAs at kw = 8"},
        {4096, 36864, 1, NBI_PATH_GEMV, 0, 1, 1, 0, "one token: kw = 1's 288 CTAs balanced to 384 of 6 row blocks"},
        {7168, 18432, 1, NBI_PATH_GEMV, 0, 2, 1, 0, "one token: kw = 2's 288 CTAs balanced to 384 of 3"},
        {3584, 18944, 1, NBI_PATH_GEMV, 0, 2, 1, 0, "one token: kw = 2's 296 CTAs balanced to 395 of 3"},
        {6144, 20480, 1, NBI_PATH_GEMV, 0, 4, 1, 0, "one token: kw = 2 would put 320 CTAs of 4 (no fewer fit) on 132 SMs"},
        {8192, 28672, 1, NBI_PATH_GEMV, 0, 4, 1, 0, "one token: kw = 1 would give 64 chunks a warp"},
        {5120, 27648, 1, NBI_PATH_GEMV, 0, 4, 1, 0, "one token: kw = 1 would give 40 chunks a warp"},
        {1024, 14336, 1, NBI_PATH_GEMV, 0, 2, 1, 0, "8 chunks (under 16): kw = 2 by the 2..8-token rule"},
        {3584, 4608, 16, NBI_PATH_GEMV, 1, 0, 7, 0, "kernel 1 would be 288 CTAs on 264 slots: 18 tiles x 7"},
        {3584, 4608, 12, NBI_PATH_GEMV, 1, 0, 7, 0, "the same at m = 12"},
        {4096, 4096, 16, NBI_PATH_GEMV, 0, 8, 1, 0, "kernel 1's 256 CTAs fit one wave"},
        {3584, 3584, 16, NBI_PATH_GEMV, 0, 8, 1, 0, "kernel 1's 224 CTAs fit one wave"},
        {14336, 4096, 16, NBI_PATH_GEMV, 1, 0, 8, 0, "16 tiles: 8 splits of 14 chunks, not 16 of 7"},
        {3072, 8192, 12, NBI_PATH_GEMV, 1, 0, 4, 0, "32 tiles: 4 splits of 6 chunks"},
        {28672, 8192, 16, NBI_PATH_GEMV, 1, 0, 8, 0, "8 splits of 28 chunks stay at two per SM"},
        {8192, 8192, 16, NBI_PATH_GEMV, 1, 0, 4, 0, "32 tiles: runs of exactly 8 -> 4 splits of 16, one per SM"},
        {16384, 4096, 12, NBI_PATH_GEMV, 1, 0, 8, 0, "16 tiles: 16 splits of 8 -> 8 of 16, one per SM"},
        {4096, 16896, 16, NBI_PATH_GEMV, 1, 0, 4, 0, "66 tiles: 4 splits of 8 stay at two per SM"},
        {8192, 10240, 16, NBI_PATH_GEMV, 1, 0, 6, 0, "one per SM would leave 12 SMs idle"},
        {8192, 8192, 20, NBI_PATH_GEMV, 1, 0, 4, 1, "17..24 tokens: 4 splits of 16 chunks, one per SM"},
        {4096, 14336, 24, NBI_PATH_GEMV, 1, 0, 1, 1, "56 tiles x 2 splits would fill 112 of 132: the wave"},
        {18944, 3584, 20, NBI_PATH_GEMV, 1, 0, 9, 1, "14 tiles: 9 splits of 17 chunks"},
        {27648, 5120, 20, NBI_PATH_GEMV, 1, 0, 13, 0, "runs of 36 at one per SM: two per SM"},
        {4096, 4096, 20, NBI_PATH_SM90, 0, 0, 0, 0, "runs of 4 at one per SM: the tensor core"},
        {8192, 3072, 24, NBI_PATH_SM90, 0, 0, 0, 0, "runs of 5.8: the tensor core"},
        {3584, 18944, 32, NBI_PATH_GEMV, 1, 0, 1, 1, "74 tiles of 256 rows at m = 32: kernel 2's wave"},
        {7168, 18432, 28, NBI_PATH_GEMV, 1, 0, 1, 1, "72 tiles at m = 28: kernel 2's wave"},
        {4096, 12288, 28, NBI_PATH_SM90, 0, 0, 0, 0, "48 tiles of 32 chunks: the tensor core"},
        {5120, 13824, 32, NBI_PATH_SM90, 0, 0, 0, 0, "54 tiles of 40 chunks: the tensor core"},
        {28672, 8192, 32, NBI_PATH_GEMV, 1, 0, 4, 1, "32 tiles x 4 splits of 56 chunks: one wave of kernel 2"},
        {8192, 10240, 32, NBI_PATH_SM90, 0, 0, 0, 0, "40 tiles of 64 chunks: the tensor core"},
        {8192, 8192, 32, NBI_PATH_SM90, 0, 0, 0, 0, "32 tiles of 64 chunks: the tensor core"},
        {14336, 4096, 28, NBI_PATH_SM90, 0, 0, 0, 0, "16 tiles of 112 chunks: the tensor core"},
        {16384, 4096, 32, NBI_PATH_SM90, 0, 0, 0, 0, "16 tiles of 128 chunks, 15.5 a SM: the tensor core"},
        {24576, 4096, 28, NBI_PATH_GEMV, 1, 0, 8, 1, "16 tiles x 8 splits of 24 chunks: one wave"},
        {28672, 4096, 25, NBI_PATH_GEMV, 1, 0, 8, 1, "16 tiles x 8 splits of 28 chunks: one wave"},
        {12288, 12288, 28, NBI_PATH_GEMV, 1, 0, 1, 1, "48 tiles, 35 chunks a SM: kernel 2's wave"},
        {10240, 10240, 32, NBI_PATH_GEMV, 1, 0, 1, 1, "40 tiles, 24.2 chunks a SM: kernel 2's wave"},
        {7168, 16384, 32, NBI_PATH_GEMV, 1, 0, 1, 1, "64 tiles: the wave, not 2 splits of 28"},
        {6144, 16384, 32, NBI_PATH_SM90, 0, 0, 0, 0, "64 tiles, 23.3 chunks a SM: the tensor core"},
        {20480, 5120, 32, NBI_PATH_GEMV, 1, 0, 1, 1, "20 tiles of 160 chunks, 24.2 a SM: kernel 2's wave"},
        {27648, 5120, 28, NBI_PATH_GEMV, 1, 0, 1, 1, "20 tiles of 216 chunks: kernel 2's wave"},
        {13824, 5120, 32, NBI_PATH_SM90, 0, 0, 0, 0, "20 tiles of 108 chunks, 16.4 a SM: the tensor core"},
        {3584, 18944, 24, NBI_PATH_GEMV, 1, 0, 0, 0, "148 tiles at m = 24: kernel 2"},
        {8192, 29568, 32, NBI_PATH_GEMV, 1, 0, 1, 1, "231 tiles: kernel 2"},
        {8192, 57344, 32, NBI_PATH_GEMV, 1, 0, 1, 1, "448 tiles: kernel 2's stream-K grid"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++)
        for (int f = 0; f < 2; f++) {
            nbi_gemm_plan p;
            const nb_format fmt = f ? NB_FORMAT_MXFP4 : NB_FORMAT_NVFP4;
            if (!plan(ctx, fmt, cases[i].k, cases[i].n, cases[i].m, NULL, &p)) continue;
            int ok = p.path == cases[i].path;
            if (ok && p.path == NBI_PATH_GEMV) {
                ok = !!p.xsh == cases[i].xs && (!cases[i].splits || p.splits == cases[i].splits);
                if (!cases[i].xs) ok = ok && (!cases[i].kw || p.kw == cases[i].kw);
                else if (cases[i].splits) ok = ok && (p.xsh == 2) == cases[i].one_per_sm;
            }
            CHECK(ok, "%s %lld -> %lld m = %d (%s): path %d xsh %d kw %d splits %d", f ? "mxfp4" : "nvfp4",
                  (long long)cases[i].k, (long long)cases[i].n, cases[i].m, cases[i].why, p.path, p.xsh, p.kw,
                  p.splits);
        }
    /* the integer and table formats (int4_sym: no zero-point range to record) */
    static const struct {
        nb_format f;
        int64_t k, n;
        int m, tc, splits; /* tc 1: the tensor-core kernel, 2: decode kernel 1; else kernel 2 with `splits` */
        const char *why;
    } ints[] = {
        {NB_FORMAT_INT4_SYM, 14336, 4096, 16, 0, 8, "16 tiles at 9..16 tokens: 8 splits of 14, not 16 of 7"},
        {NB_FORMAT_NF4, 12288, 4096, 12, 2, 0, "nf4 at 9..16: kernel 1's 256 CTAs fit a wave of two per SM"},
        {NB_FORMAT_NF4, 8192, 8192, 16, 2, 0, "nf4, 256 CTAs at kw = 4: kernel 1"},
        {NB_FORMAT_BNB_FP4, 4096, 6144, 16, 2, 0, "bnb_fp4, 192 CTAs at kw = 4: kernel 1"},
        {NB_FORMAT_NF4, 8192, 10240, 16, 0, 6, "nf4, 320 CTAs past a wave: kernel 2"},
        {NB_FORMAT_NF4, 3584, 4608, 16, 0, 7, "nf4, 288 CTAs past a wave: kernel 2"},
        {NB_FORMAT_INT4_SYM, 3584, 4608, 16, 0, 7, "kernel 1 would spill past one wave"},
        {NB_FORMAT_INT4_SYM, 3584, 4608, 20, 1, 0, "17..24 tokens, runs of 4: the tensor core, not kernel 1"},
        {NB_FORMAT_INT8, 4096, 4096, 20, 1, 0, "int8, runs of 4: the tensor core"},
        {NB_FORMAT_INT4_SYM, 12288, 4096, 20, 0, 8, "17..24 tokens, runs of 12: kernel 2"},
        {NB_FORMAT_NF4, 12288, 4096, 20, 1, 0, "nf4, runs of 12 (under 16): the tensor core"},
        {NB_FORMAT_NF4, 8192, 8192, 20, 0, 4, "nf4, runs of 16: kernel 2"},
        {NB_FORMAT_INT4_SYM, 8192, 10240, 32, 0, 3, "25..32 tokens, runs of 21: kernel 2"},
        {NB_FORMAT_INT4_SYM, 14336, 4096, 32, 1, 0, "25..32 tokens, runs of 14: the tensor core"},
        {NB_FORMAT_INT8, 8192, 10240, 32, 1, 0, "int8 at 25..32: the tensor core"},
        {NB_FORMAT_NF4, 8192, 10240, 32, 1, 0, "nf4 at 25..32: the tensor core"},
    };
    for (size_t i = 0; i < sizeof ints / sizeof ints[0]; i++) {
        nbi_gemm_plan q;
        if (!plan(ctx, ints[i].f, ints[i].k, ints[i].n, ints[i].m, NULL, &q)) continue;
        CHECK(ints[i].tc == 1   ? q.path == NBI_PATH_SM90
              : ints[i].tc == 2 ? q.path == NBI_PATH_GEMV && !q.xsh
                                : q.path == NBI_PATH_GEMV && q.xsh && q.splits == ints[i].splits,
              "%s %lld -> %lld m = %d (%s): path %d xsh %d splits %d", nbi_traits(ints[i].f)->name,
              (long long)ints[i].k, (long long)ints[i].n, ints[i].m, ints[i].why, q.path, q.xsh, q.splits);
    }
    /* int4 (zero points): kw = 2 on 3584 -> 18944, its 296 CTAs balanced to 395 of 3 row blocks */
    nbi_gemm_plan p;
    nb_gemm_desc g = problem(NB_FORMAT_INT4, 3584, 18944, 1);
    g.weight.scale_exp_min = 0, g.weight.scale_exp_max = 15; /* (the zero-point range nb_pack_v2 records) */
    const nb_status st = nbi_plan(ctx, &g, NULL, &p);
    CHECK(st == NB_OK && p.path == NBI_PATH_GEMV && !p.xsh && p.kw == 2 && p.k1_rows == 3 && p.grid_x == 395,
          "int4 3584 -> 18944 m = 1: kw = 2, 395 CTAs of 3 row blocks (%s, xsh %d kw %d, %d CTAs of %d)",
          st ? nb_last_error() : "ok", p.xsh, p.kw, p.grid_x, p.k1_rows);
    nb_context_destroy(ctx);
}

/* Every decode plan of the shapes above (and 17800 x 5216) at m = 1..32,
 * described as the configuration `nibble tune` records (nbi_config_of) and
 * replayed through nb_gemm_ex's request (nbi_request_of), gives the same
 * launch: kernel, warps, grid, splits, chunks per split. */
static void test_config_round_trip(void) {
    nb_context *ctx = h100();
    static const nb_format fmts[] = {NB_FORMAT_NVFP4, NB_FORMAT_MXFP4, NB_FORMAT_INT4_SYM, NB_FORMAT_NF4};
    int plans = 0, bad = 0;
    for (size_t f = 0; f < sizeof fmts / sizeof fmts[0]; f++)
        for (size_t i = 0; i <= sizeof k_shapes / sizeof k_shapes[0]; i++)
            for (int64_t m = 1; m <= 32; m++) {
                const int64_t k = i < sizeof k_shapes / sizeof k_shapes[0] ? k_shapes[i][0] : 5216;
                const int64_t n = i < sizeof k_shapes / sizeof k_shapes[0] ? k_shapes[i][1] : 17800;
                nbi_gemm_plan p, q;
                if (!nbi_traits(fmts[f])->every_kernel && k % 128) continue; /* (off the integer formats' group) */
                if (!plan(ctx, fmts[f], k, n, m, NULL, &p) || p.path != NBI_PATH_GEMV) continue;
                const nb_gemm_config cfg = nbi_config_of(&p);
                const nbi_request rq = nbi_request_of(&cfg);
                plans++;
                if (!plan(ctx, fmts[f], k, n, m, &rq, &q)) continue;
                const int same = q.path == p.path && q.xsh == p.xsh && q.warps == p.warps && q.kw == p.kw &&
                                 q.rpw == p.rpw && q.grid_x == p.grid_x && q.tiles_n == p.tiles_n &&
                                 q.splits == p.splits && q.chunks_per_split == p.chunks_per_split &&
                                 q.per_sm == p.per_sm;
                if (!same && bad++ < 8)
                    printf("  %s %lld -> %lld m = %lld: xsh %d/%d warps %d/%d kw %d/%d grid %d/%d splits %d/%d cps "
                           "%d/%d per_sm %d/%d\n",
                           nbi_traits(fmts[f])->name, (long long)k, (long long)n, (long long)m, p.xsh, q.xsh, p.warps,
                           q.warps, p.kw, q.kw, p.grid_x, q.grid_x, p.splits, q.splits, p.chunks_per_split,
                           q.chunks_per_split, p.per_sm, q.per_sm);
            }
    CHECK(bad == 0, "decode plans replayed from their configuration: %d of %d differ", bad, plans);
    nb_context_destroy(ctx);
}

/* nb_gemm_config.warps: kernel 2's instance on the stream-K wave, as a
 * request (`nibble tune` tries both): 12 takes the wave wherever it can
 * run, 8 takes it with 8 warps where the rules would; 12 where the wide
 * instance cannot run (16 tokens, a table format, a k split) is refused; a
 * configuration's warps are checked. */
static void test_warps_request(void) {
    nb_context *ctx = h100();
    nbi_gemm_plan p, q;
    /* 7168 -> 18432 (H200-measured rules): m = 24 runs 12 warps on the wave, m = 32 8 */
    if (plan(ctx, NB_FORMAT_NVFP4, 7168, 18432, 24, NULL, &p)) {
        CHECK(p.xsh && p.warps == NBI_GEMV_WIDE_WARPS && nbi_plan_stream_k(&p), "7168 -> 18432 m = 24: %d warps, wave %d",
              p.warps, nbi_plan_stream_k(&p));
        const nb_gemm_config c = nbi_config_of(&p);
        CHECK(c.warps == NBI_GEMV_WIDE_WARPS, "its configuration says warps = %d", (int)c.warps);
        nbi_request rq = nbi_request_of(&c);
        rq.warps = NBI_GEMV_WARPS;
        if (plan(ctx, NB_FORMAT_NVFP4, 7168, 18432, 24, &rq, &q))
            CHECK(q.warps == NBI_GEMV_WARPS && nbi_plan_stream_k(&q) && q.grid_x == p.grid_x,
                  "warps = 8 at m = 24: %d warps, wave %d, grid %d (12 warps: %d)", q.warps, nbi_plan_stream_k(&q),
                  q.grid_x, p.grid_x);
    }
    /* 4096 -> 12288 at m = 24 (48 tiles x 2 splits would fill 96 of 132
     * slots): the rules take the wave with 8 warps; 12 takes it with 12 */
    if (plan(ctx, NB_FORMAT_MXFP4, 4096, 12288, 24, NULL, &p)) {
        CHECK(p.warps == NBI_GEMV_WARPS && nbi_plan_stream_k(&p) && p.grid_x == 132,
              "4096 -> 12288 m = 24: %d warps, wave %d, grid %d", p.warps, nbi_plan_stream_k(&p), p.grid_x);
        nbi_request rq = nbi_request_of(&(nb_gemm_config){.path = NB_GEMM_PATH_DECODE, .variant = 1, .kw = 1,
                                                          .rpw = 2, .splits = 1, .warps = NBI_GEMV_WIDE_WARPS});
        if (plan(ctx, NB_FORMAT_MXFP4, 4096, 12288, 24, &rq, &q))
            CHECK(q.warps == NBI_GEMV_WIDE_WARPS && nbi_plan_stream_k(&q), "warps = 12 at m = 24: %d warps, wave %d",
                  q.warps, nbi_plan_stream_k(&q));
    }
    if (plan(ctx, NB_FORMAT_NVFP4, 7168, 18432, 32, NULL, &p))
        CHECK(p.warps == NBI_GEMV_WARPS && nbi_plan_stream_k(&p), "7168 -> 18432 m = 32: %d warps on the wave %d",
              p.warps, nbi_plan_stream_k(&p));
    /* where the wide instance cannot run: refused, not silently replaced */
    static const struct { nb_format fmt; int64_t k, n, m; int splits; } no[] = {
        {NB_FORMAT_NVFP4, 7168, 18432, 16, 1}, /* 16 tokens */
        {NB_FORMAT_NVFP4, 7168, 18432, 32, 1}, /* 25..32 tokens: no 12-warp instance of that token tile */
        {NB_FORMAT_NF4, 7168, 18432, 24, 1},   /* a table format (one kernel 2 per row block pair) */
        {NB_FORMAT_NVFP4, 7168, 18432, 24, 2}, /* a k split */
        {NB_FORMAT_NVFP4, 1024, 1024, 24, 1},  /* under 6 chunks per SM */
    };
    for (size_t i = 0; i < sizeof no / sizeof no[0]; i++) {
        const nbi_request rq = nbi_request_of(&(nb_gemm_config){.path = NB_GEMM_PATH_DECODE, .variant = 1, .kw = 1,
                                                                .rpw = 2, .splits = no[i].splits,
                                                                .warps = NBI_GEMV_WIDE_WARPS});
        const nb_gemm_desc g = problem(no[i].fmt, no[i].k, no[i].n, no[i].m);
        const nb_status st = nbi_plan(ctx, &g, &rq, &q);
        CHECK(st == NB_ERR_UNSUPPORTED && strstr(nb_last_error(), "warps = 12"),
              "%s %lld -> %lld m = %lld splits %d: warps = 12 gave %d (%s)", nbi_traits(no[i].fmt)->name,
              (long long)no[i].k, (long long)no[i].n, (long long)no[i].m, no[i].splits, (int)st,
              st ? nb_last_error() : "ok");
    }
    /* the configuration's own checks */
    char why[256];
    const nb_gemm_config staged = {.path = NB_GEMM_PATH_DECODE, .variant = 1, .kw = 1, .rpw = 2, .splits = 1};
    nb_gemm_config c = staged;
    c.warps = 10;
    CHECK(!nbi_config_check(&c, 17, 1, why, sizeof why) && strstr(why, "warps = 10"), "warps = 10: %s", why);
    c.warps = NBI_GEMV_WIDE_WARPS;
    CHECK(nbi_config_check(&c, 17, 1, why, sizeof why), "warps = 12 for 17..32: %s", why);
    CHECK(!nbi_config_check(&c, 9, 1, why, sizeof why) && strstr(why, "needs m >= 17"), "warps = 12 for 9..16: %s", why);
    c.rpw = 1;
    CHECK(!nbi_config_check(&c, 17, 1, why, sizeof why) && strstr(why, "needs rpw = 2"), "warps = 12, rpw 1: %s", why);
    c = staged, c.variant = 0, c.rpw = 0, c.warps = NBI_GEMV_WARPS;
    CHECK(!nbi_config_check(&c, 1, 1, why, sizeof why) && strstr(why, "staged decode variant only"), "plain: %s", why);
    c = (nb_gemm_config){.path = NB_GEMM_PATH_TENSOR_CORE, .bn = 64, .raster = 16, .splits = 1, .warps = 8};
    CHECK(!nbi_config_check(&c, 65, 1, why, sizeof why) && strstr(why, "staged decode variant only"), "tc: %s", why);
    c = staged;
    CHECK(nbi_config_check(&c, 17, 1, why, sizeof why), "warps = 0 (a cache from before the field): %s", why);
    nb_context_destroy(ctx);
}

/* Four row blocks per warp on kernel 2's 17..32-token wave (plan.c
 * k2_rpw4): the rule's edges (E2M1 layers of at least 13.5 row blocks per
 * SM and 28 k chunks), a request of rpw 4 (or of 7 warps) wherever the wave
 * can run and its refusal elsewhere, NIBBLE_K2_RPW, the configuration's
 * checks and `nibble tune`'s candidates. */
static void test_rpw4(void) {
    nb_context *ctx = h100();
    nbi_gemm_plan p, q;
    static const struct { nb_format fmt; int64_t k, n, m; int rpw, warps; } rule[] = {
        {NB_FORMAT_NVFP4, 4096, 28672, 17, 4, 8},    /* 1792 row blocks: 8 warps at 17..24 tokens */
        {NB_FORMAT_MXFP4, 4096, 28672, 25, 4, 7},    /* 7 at 25..32 */
        {NB_FORMAT_NVFP4, 4096, 28512, 32, 4, 7},    /* 1782 row blocks: the edge */
        {NB_FORMAT_NVFP4, 4096, 28496, 32, 2, 8},    /* 1781 */
        {NB_FORMAT_NVFP4, 5120, 27648, 32, 2, 8},    /* 1728 */
        {NB_FORMAT_NVFP4, 3584, 28672, 32, 4, 7},    /* 28 chunks */
        {NB_FORMAT_NVFP4, 3456, 28672, 32, 2, 8},    /* 27 */
        {NB_FORMAT_NVFP4, 8192, 57344, 16, 2, 8},    /* 16 tokens */
        {NB_FORMAT_INT4_SYM, 8192, 57344, 24, 2, 8}, /* the integer and table formats: two a warp */
        {NB_FORMAT_NF4, 8192, 57344, 32, 2, 8},
    };
    for (size_t i = 0; i < sizeof rule / sizeof rule[0]; i++)
        if (plan(ctx, rule[i].fmt, rule[i].k, rule[i].n, rule[i].m, NULL, &p))
            CHECK(p.rpw == rule[i].rpw && p.warps == rule[i].warps && (rule[i].rpw != 4 || nbi_plan_stream_k(&p)),
                  "%s %lld -> %lld m = %lld: rpw %d warps %d stream-K %d (want rpw %d, %d warps)",
                  nbi_traits(rule[i].fmt)->name, (long long)rule[i].k, (long long)rule[i].n, (long long)rule[i].m, p.rpw,
                  p.warps, nbi_plan_stream_k(&p), rule[i].rpw, rule[i].warps);
    /* a request of rpw 4 on a layer the rule leaves at two, and of 7 warps (rpw open) */
    const nb_gemm_config r4 = {.path = NB_GEMM_PATH_DECODE, .variant = 1, .kw = 1, .rpw = 4, .splits = 1};
    nbi_request rq = nbi_request_of(&r4);
    if (plan(ctx, NB_FORMAT_NVFP4, 5120, 27648, 24, &rq, &q))
        CHECK(q.rpw == 4 && q.warps == NBI_GEMV_WARPS && nbi_plan_stream_k(&q) && q.xsh == 2 && q.tiles_n == 54,
              "rpw 4 requested on 5120 -> 27648 m = 24: rpw %d, %d warps, stream-K %d, xsh %d, %d tiles", q.rpw, q.warps,
              nbi_plan_stream_k(&q), q.xsh, q.tiles_n);
    rq = (nbi_request){.path = NB_GEMM_PATH_DECODE, .variant = 2, .warps = NBI_GEMV_RPW4_WARPS};
    if (plan(ctx, NB_FORMAT_MXFP4, 7168, 18432, 32, &rq, &q))
        CHECK(q.rpw == 4 && q.warps == NBI_GEMV_RPW4_WARPS && q.tiles_n == 42, "7 warps requested: rpw %d, %d warps, %d tiles",
              q.rpw, q.warps, q.tiles_n);
    /* ... refused where it cannot run, not silently replaced */
    static const struct { nb_format fmt; int64_t k, n, m; int splits, warps; const char *what; } no[] = {
        {NB_FORMAT_NVFP4, 8192, 57344, 16, 1, 0, "rpw = 4"},           /* 16 tokens */
        {NB_FORMAT_INT4_SYM, 8192, 57344, 32, 1, 0, "rpw = 4"},        /* an integer format */
        {NB_FORMAT_NVFP4, 8192, 57344, 32, 2, 0, "rpw = 4"},           /* a k split */
        {NB_FORMAT_NVFP4, 1024, 1024, 24, 1, 0, "rpw = 4"},            /* under 6 chunks per SM */
        {NB_FORMAT_NVFP4, 8192, 57344, 32, 1, NBI_GEMV_WARPS, "7 at 25..32"}, /* 25..32 tokens take 7 warps */
        {NB_FORMAT_NVFP4, 8192, 57344, 24, 1, NBI_GEMV_RPW4_WARPS, "warps = 7"}, /* 17..24 take 8 */
    };
    for (size_t i = 0; i < sizeof no / sizeof no[0]; i++) {
        nb_gemm_config c = r4;
        c.splits = no[i].splits, c.warps = no[i].warps;
        rq = nbi_request_of(&c);
        const nb_gemm_desc g = problem(no[i].fmt, no[i].k, no[i].n, no[i].m);
        const nb_status st = nbi_plan(ctx, &g, &rq, &q);
        CHECK(st == NB_ERR_UNSUPPORTED && strstr(nb_last_error(), no[i].what), "%s %lld -> %lld m = %lld splits %d warps "
              "%d: rpw 4 gave %d (%s)", nbi_traits(no[i].fmt)->name, (long long)no[i].k, (long long)no[i].n,
              (long long)no[i].m, no[i].splits, no[i].warps, (int)st, st ? nb_last_error() : "ok");
    }
    /* NIBBLE_K2_RPW (read at context creation): 2 never, 4 wherever it can run */
    ctx->env_k2_rpw = 2;
    if (plan(ctx, NB_FORMAT_NVFP4, 8192, 57344, 32, NULL, &p))
        CHECK(p.rpw == 2 && p.warps == NBI_GEMV_WARPS, "NIBBLE_K2_RPW=2: rpw %d, %d warps", p.rpw, p.warps);
    ctx->env_k2_rpw = 4;
    if (plan(ctx, NB_FORMAT_NVFP4, 5120, 27648, 32, NULL, &p))
        CHECK(p.rpw == 4 && p.warps == NBI_GEMV_RPW4_WARPS, "NIBBLE_K2_RPW=4: rpw %d, %d warps", p.rpw, p.warps);
    ctx->env_k2_rpw = 0;
    /* the configuration's checks */
    char why[256];
    nb_gemm_config c = r4;
    CHECK(nbi_config_check(&c, 17, 1, why, sizeof why), "rpw 4 for 17..32: %s", why);
    c.warps = NBI_GEMV_RPW4_WARPS;
    CHECK(nbi_config_check(&c, 17, 1, why, sizeof why), "rpw 4, 7 warps for 17..32: %s", why);
    CHECK(!nbi_config_check(&c, 9, 1, why, sizeof why) && strstr(why, "needs m >= 17"), "rpw 4 for 9..16: %s", why);
    c.rpw = 2;
    CHECK(!nbi_config_check(&c, 17, 1, why, sizeof why) && strstr(why, "needs rpw = 4"), "7 warps, rpw 2: %s", why);
    c.rpw = 3;
    CHECK(!nbi_config_check(&c, 17, 1, why, sizeof why) && strstr(why, "rpw = 3"), "rpw 3: %s", why);
    c = r4, c.warps = NBI_GEMV_WIDE_WARPS;
    CHECK(!nbi_config_check(&c, 17, 1, why, sizeof why) && strstr(why, "needs rpw = 2"), "12 warps, rpw 4: %s", why);
    c = r4, c.splits = 2;
    CHECK(!nbi_config_check(&c, 17, 1, why, sizeof why) && strstr(why, "no k split"), "rpw 4, 2 splits: %s", why);
    /* `nibble tune` tries it where it can run (a layer the rule leaves at two) */
    const nb_gemm_desc g = problem(NB_FORMAT_NVFP4, 5120, 27648, 32);
    nb_gemm_config cands[64];
    size_t nc = 0;
    int found = 0;
    if (nb_gemm_list_configs(ctx, &g, cands, 64, &nc) == NB_OK)
        for (size_t i = 0; i < nc && i < 64; i++) found += cands[i].rpw == 4 && cands[i].warps == NBI_GEMV_RPW4_WARPS;
    CHECK(found == 1, "5120 -> 27648 m = 32: %d of %zu candidates with rpw 4 and 7 warps", found, nc);
    nb_context_destroy(ctx);
}

int main(void) {
    test_rpw4();
    test_config_round_trip();
    test_warps_request();
    test_moe_tile_width();
    test_decode_wave8();
    test_decode_m8();
    test_decode_balanced_split();
    test_decode_rules();
    test_decode_balanced_wave();
    test_table_kw();
    test_decode_occupancy();
    test_every_plan_valid();
    test_integer_formats();
    test_measured_choices();
    test_without_clusters();
    test_requested_splits();
    test_capacity_cached();
    test_tail_split();
    test_stream_k();
    test_tc_stream_k();
    test_moe_kw();
    test_pdl_switch();
    printf("%d passed, %d failed\n", g_pass, g_fail);
    return g_fail ? 1 : 0;
}
