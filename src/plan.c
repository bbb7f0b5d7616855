/* plan.c - the planner: every decision about how nb_gemm runs a problem --
 * the path (decode kernels, Hopper tensor-core kernel, mma.sync kernel), the
 * kernel variant, tile width, k split, raster group and pipeline depth, and
 * the workspace they need -- from the device facts cached in the context,
 * the problem, and a request that may fix some of those choices.
 *
 * Where a request comes from (a per-call configuration, NIBBLE_PATH, the
 * tuning table) is decided by the caller (device.c); the planner reads no
 * environment and no table, and changes nothing in the context but its
 * cache of scale tables: the same inputs give the same plan.  The constants
 * of the heuristic are measured (H100, bench/RESULTS.md) and cited where
 * they are used.
 *
 * The configurations `nibble tune` tries (nb_gemm_list_configs) are listed
 * here too: they are the requests this planner accepts.
 * Test: tests/test_plan.c (the tensor-core path's plans on a host context
 * with an H100's device facts and cluster capacity), tests/test_tune.c,
 * tests/test_gpu.c (every offered configuration against the reference). */
#include "internal.h"

#include <math.h>
#include <stdio.h>
#include <string.h>

nbi_request nbi_request_of(const nb_gemm_config *c) {
    nbi_request r;
    memset(&r, 0, sizeof r);
    r.path = c->path;
    r.splits = c->splits;
    if (c->path == NB_GEMM_PATH_DECODE) {
        r.variant = c->variant + 1;
        r.kw = c->kw;
        r.rpw = c->rpw;
        r.warps = c->warps;
    } else {
        r.bn = c->bn;
        r.raster = c->raster;
        r.stages = c->stages;
        r.sk = c->stream_k;
    }
    return r;
}

/* Split the plan's k chunks about s ways (s >= 1) so that every split gets
 * work: as many splits as ceil(kchunks / s) chunks each need, then the
 * chunks spread evenly over them. */
static void even_split(int64_t kchunks, int64_t s, int *splits, int *cps) {
    const int64_t c = (kchunks + s - 1) / s;
    *splits = (int)((kchunks + c - 1) / c);
    *cps = (int)((kchunks + *splits - 1) / *splits);
}
static void set_splits(nbi_gemm_plan *p, int64_t s) { even_split(p->kchunks, s, &p->splits, &p->chunks_per_split); }

/* The workspace partials of a tensor-core k split: `splits` FP32 tiles of
 * 64 cwg rows x bn tokens for each of `tiles` tiles. */
static size_t tc_partial_bytes(int64_t splits, int64_t tiles, int cwg, int bn) {
    return (size_t)splits * (size_t)tiles * (size_t)(64 * cwg) * (size_t)bn * sizeof(float);
}

/* ------------------------------------------------------- decode kernels */

/* Kernel 2's column tiles of 256 rows (8 warps x 2 row blocks of 16), the
 * unit of the decode rules below and of plan_tc's comparisons with it. */
static int64_t k2_tiles256(const nbi_gemm_plan *p) { return (p->row_blocks + 15) / 16; }

/* Kernel 1's CTAs along n with kw of its `warps` warps on each row block. */
static int64_t k1_grid(const nbi_gemm_plan *p, int kw, int warps) { return (p->row_blocks * kw + warps - 1) / warps; }

/* Kernel 1's resident CTAs: the CTAs of its instance an SM fits (no cap)
 * times the SMs. */
static int64_t k1_slots(nb_context *ctx, const nbi_gemm_plan *p) {
    size_t bytes = 0;
    return (int64_t)nbi_cuda_gemv_ctas_per_sm(ctx, p, 0, &bytes) * ctx->info.sm_count;
}

/* Kernel 1's balanced wave (nbi_plan, where it is explained): the row
 * blocks a CTA takes, fewer than warps / kw, so that a one-wave grid of
 * `grid` CTAs at kw, without a k split, loads every SM alike; 0 where that
 * cannot take a row block off the busiest SMs, the grid is more than one
 * wave of `fit` CTAs per SM, or a warp streams at most 8 chunks. */
static int64_t k1_balanced_rows(const nbi_gemm_plan *p, int kw, int64_t grid, int fit, int64_t sms) {
    const int64_t q0 = p->warps / kw, w = (grid + sms - 1) / sms;
    if ((p->chunks_per_split + kw - 1) / kw <= 8 || fit <= 0 || w > fit || q0 < 2) return 0;
    const int64_t q = (p->row_blocks + w * sms - 1) / (w * sms);
    return q < q0 ? q : 0;
}

/* Whether the request fixes kernel 1's kw (which the rules then leave). */
static int kw_given(int kw) { return kw == 1 || kw == 2 || kw == 4 || kw == 8; }

/* The 4-bit integer formats with a byte zero point or none (int4,
 * int4_sym): not E2M1, no table, no float zero points. */
static int int4_family(const nbi_format_traits *t) {
    return !t->every_kernel && !nbi_is_table(t) && t->element_bits == 4 && t->zero_point != NB_ZERO_FLOAT;
}

/* The most chunks a warp streams under the one-token rule: 32 (E2M1: kw 1
 * lost with 40 and 64), 64 for the 4-bit integer formats with a byte zero
 * point or none and 40 for the table formats (H200, `nibble tune --all`,
 * m = 1, us, the rule's kw 4 -> kw 1: int4 5120 -> 27648 (40 chunks) 25.74
 * -> 23.04, 8192 -> 28672 (64) 38.04 -> 35.76; nf4 5120 -> 27648 27.86 ->
 * 26.37, 8192 -> 28672 40.88 against 41.16; NOTES.md, "Kernel 1's
 * one-token rule: longer streams for the integer and table formats"). */
static int64_t k1_one_token_chunks(const nbi_gemm_plan *p) {
    const nbi_format_traits *t = nbi_traits(p->fmt);
    return int4_family(t) ? 64 : nbi_is_table(t) ? 40 : 32;
}

/* Kernel 1's one-token rule (plan_decode, where it is explained and
 * measured) for plan p (kernel 1, no k split): 0 where it does not look
 * (fewer than three CTAs an SM fit, two for the integer and table formats,
 * or k under 16 chunks), 1 where it looks but leaves the plan to the rules
 * after it, 2 where it applies: then *kw and *grid are its warps per row
 * block and CTAs. */
static int k1_one_token(nb_context *ctx, const nbi_gemm_plan *p, int e2m1, int *kw_out, int64_t *grid_out) {
    const int64_t sms = ctx->info.sm_count, res = k1_slots(ctx, p);
    if (res < (e2m1 ? 3 : 2) * sms || p->kchunks < 16) return 0;
    int kw = p->warps;
    while (kw > 1 && k1_grid(p, kw, p->warps) > res) kw /= 2;
    const int64_t grid = k1_grid(p, kw, p->warps);
    /* (2..2.5 CTAs per SM are left only where the balanced wave below
     * cannot even them out) */
    const int third = grid > 2 * sms && 2 * grid <= 5 * sms && !k1_balanced_rows(p, kw, grid, (int)(res / sms), sms);
    /* (past 32 chunks a warp, one warp per row block only within two CTAs per SM: int4 7168 -> 36864 and
     * 8192 -> 43008, 288 and 336 CTAs at kw 1, ran 1.5-3.5% slower than at kw 4) */
    const int64_t most = kw == 1 && grid > 2 * sms ? 32 : k1_one_token_chunks(p);
    if (grid > res || p->kchunks > most * (int64_t)kw || third || (kw != p->warps && 2 * grid <= 3 * sms)) return 1;
    *kw_out = kw;
    *grid_out = grid;
    return 2;
}

/* Kernel 2's split at 5..8 tokens (E2M1 formats, two row blocks per warp):
 * the split s that puts c CTAs on every SM, for c = 2 where each still
 * streams at least 15 chunks, else (with c1, at 8 tokens) for c = 1 where
 * each streams at least 12 on a layer of at least 16 tiles, and the grid
 * of tiles x s covers at least four fifths of those slots; 0 where none
 * does.  A grid of just over c CTAs per SM ends with the SMs that hold
 * c + 1 (the block scheduler fills every SM to c before it starts on
 * c + 1); more, shorter CTAs per SM only add their prologues.  H200, the
 * library before and this alternated twice, NVFP4 (MXFP4 alike), us, each
 * call after a foreign kernel (`bench/config_sweep --between --heuristic`)
 * / repeated (`nibble bench`); NOTES.md, "Kernel 2's split at 5..8
 * tokens, and kernel 1 at 2..8 tokens": at m = 8, 5120 -> 10240 (40 tiles)
 * 4 -> 3 splits 17.80 / 17.84 -> 14.80 / 17.18; 13824 -> 5120 (20 tiles)
 * 16 -> 6 20.81 / 19.23 -> 17.71 / 16.15; 8192 -> 10240 8 -> 3 21.80 /
 * 20.66 -> 20.34 / 18.82 (MXFP4 repeated 20.15 -> 23.97, its one loss);
 * 27648 -> 5120 16 -> 13 32.70 / 30.95 -> 28.19 / 25.91; 28672 -> 8192 (32
 * tiles, 224 chunks) 16 -> 8 43.12 / 40.04 -> 41.68 / 38.39; at m = 5 / 6
 * kernel 1 -> kernel 2 with c = 2 (c = 1 lost there to kernel 1's grids
 * of two CTAs per SM, 5-12% after a foreign kernel): 28672 -> 8192 m = 6
 * 44.76 / 43.18 -> 41.46 / 38.25, 25600 -> 5120 (13 splits) 31.05 / 30.22
 * -> 27.05 / 24.45, 18432 -> 7168 (9 splits) m = 5 29.41 / 28.83 -> 26.33
 * / 24.16.  With 14 tiles (18944 -> 3584, 9 splits at m = 8) c = 1 was 4%
 * ahead after a foreign kernel and 25% behind kernel 1 repeated. */
static int64_t k2_balanced_split(const nbi_gemm_plan *p, int64_t tiles, int64_t sms, int c1) {
    for (int64_t c = 2; c >= (c1 ? 1 : 2); c--) {
        const int64_t s = c * sms / tiles;
        if (s >= 2 && 5 * tiles * s >= 4 * c * sms && p->kchunks / s >= (c == 2 ? 15 : 12) && (c == 2 || tiles >= 16))
            return s;
    }
    return 0;
}

/* Kernel 1's warps per row block by its rule (plan_decode_split): half the
 * CTA's warps, all of them where half leave fewer than 1.4 CTAs per SM -
 * but not for the integer and table formats at 17..32 tokens (kw = 4 beat
 * 8 on 4096 -> 4096 by 14-26%, H200, int4 / nf4 / int8 at m = 20 and 24,
 * `nibble tune`). */
static int k1_kw(const nbi_gemm_plan *p, int warps, int sms, int rpw2) {
    const int half = warps / 2;
    return (double)p->row_blocks * half / warps < 1.4 * (double)sms && !(rpw2 && p->mt >= 3) ? warps : half;
}

/* 25..32 tokens (E2M1 formats), layers of at most 32 tiles: a split grid of
 * exactly one wave of one CTA per SM, s = SMs / tiles splits of 24 chunks
 * or more covering 95% of the SMs, instead of kernel 2's stream-K wave or
 * the tensor core (H200, `nibble bench`, the library with and without it
 * alternated twice, NVFP4 / MXFP4, m = 25 / 28 / 32, new / old time:
 * 28672 -> 4096, 16 tiles x 8 splits of 28 chunks, 0.93-0.96 of the
 * wave's; 24576 -> 4096, 8 of 24, 0.92-0.98 of the tensor core's; 27648 ->
 * 3584, 14 x 9 of 24, 0.84-0.89; 32768 -> 3584 0.96-0.98; 36864 -> 4608,
 * 18 x 7, 0.96-0.98; 16384 -> 8192, 32 x 4 of 32, 0.92-0.96; 14336 ->
 * 8192, 32 x 4 of 28, 0.95-1.01; 28672 -> 8192 and 29568 -> 8192 0.95-1.00;
 * geometric mean 0.953 over 78 cells of 10 layers, none above 1.009).
 * Shorter splits lost to the tensor core in `nibble tune` (16384 -> 4096,
 * 8 of 16; 14336 -> 4096, 8 of 14).  On 64 tiles two splits of 28 chunks
 * lost at m = 28 / 32 (7168 -> 16384: 39.4-40.8 us against the tensor
 * core's 38.3-39.4 and the wave's 37.2-38.3), so wider layers keep the
 * wave (plan_tc's long-k rule).  NOTES.md, "One wave of splits at 25..32
 * tokens".
 * Returns the splits, or 0. */
static int64_t k2_one_wave_split(const nbi_gemm_plan *p, int64_t sms, int rpw2) {
    if (rpw2 || p->mt != 4) return 0;
    const int64_t tiles = k2_tiles256(p);
    if (tiles > 32 || tiles >= sms) return 0;
    const int64_t s = sms / tiles;
    return s >= 2 && 20 * tiles * s >= 19 * sms && p->kchunks / s >= 24 ? s : 0;
}

/* Kernel 2 (two row blocks per warp) at 17..32 tokens on one wave of one
 * CTA per SM over a stream-K grid, whatever the shape: the consumer warps
 * of that instance (NBI_GEMV_WARPS, or the E2M1 formats' wide instance's
 * NBI_GEMV_WIDE_WARPS), or 0 where the rules of plan_decode_split apply.
 * H200, nvfp4, `nibble bench` with the decode path given, us, the rules
 * before it -> this (NOTES.md, "Kernel 2 on one stream-K wave"):
 * - 25..32 tokens, 8 warps: replaces two CTAs per SM under the register cap
 *   (which spills) and split grids that leave SMs idle; m = 32: 7168 ->
 *   18432 63.7 -> 45.9, 8192 -> 28672 86.9 -> 70.8, 5120 -> 25600 53.1 ->
 *   45.9, 4096 -> 12288 32.5 -> 22.7, 8192 -> 10240 42.0 -> 32.0, 8192 ->
 *   57344 133.6 -> 130.2.  (Twelve warps there: 1-7% behind eight on four
 *   of those five layers.)  Not where the tiles alone make one wave at
 *   least 84% full: 4096 -> 28672, 112 tiles, 39.6 / 38.9 us at m = 28
 *   (NVFP4 / MXFP4) against 41.4 / 40.9 on the wave (5120 -> 27648, 108
 *   tiles, 82%: 53.9 / 52.3 -> 48.3 / 48.0), unless the wave saves 7 or
 *   more chunks a CTA, k chunks x idle SMs >= 7 x SMs (H200, m = 25 / 28 /
 *   32, NVFP4, one wave of 112 and 116 tiles -> the stream-K wave: 8192 ->
 *   28672 76.0 / 81.1 / 86.5 -> 70.4 / 71.4 / 71.1, 8192 -> 29568 76.5 /
 *   81.6 / 87.6 -> 72.7 / 73.4 / 73.9; MXFP4 the same within 1%;
 *   4096 -> 28672, 32 chunks, keeps its grid).  Nor where one wave of
 *   splits runs instead (k2_one_wave_split).
 * - The integer and table formats, 17..32 tokens, 8 warps, where the split
 *   grid (tiles x the splits that fit one wave) leaves a quarter of the
 *   SMs idle (H200, int4 / int8 / nf4, m = 20..32, us, split grid -> the
 *   wave: 7168 -> 18432, 72 CTAs, m = 24 53.4 / 64.4 / 70.9 -> 41.2 /
 *   47.4 / 50.6; 3584 -> 18944, 74, 28.2 / 33.9 / 36.8 -> 26.8 / 30.3 /
 *   31.6; 4096 -> 12288, 96, 19.7 / 23.3 / 24.6 -> 19.2 / 22.1 / 22.5).
 *   Fuller split grids keep them: 5120 -> 25600 (100 CTAs) int4 39.3 ->
 *   41.0, 8192 -> 28672 (112) int4 61.4 -> 64.2, 8192 -> 8192 (128) 20.6
 *   -> 23.2, 14336 -> 4096 (128) 20.2 -> 27.6.
 * - 17..24 tokens, 12 warps, on layers of at least 8 row blocks per SM and
 *   40 k chunks: m = 24, 7168 -> 18432 48.5 -> 40.9, 8192 -> 28672 71.5 ->
 *   61.5, 5120 -> 25600 46.6 -> 40.6, 8192 -> 57344 117.7 -> 109.1 (eight
 *   warps: 41.3, 63.8, 41.3, 118.1).  Shorter k or fewer rows lose to the
 *   split grids: 4096 -> 28672 36.4 -> 37.6, 5120 -> 13824 26.0 -> 28.9,
 *   8192 -> 10240 27.1 -> 32.2, 14336 -> 4096 20.7 -> 25.3.
 * Layers of under 6 chunks per SM (256-row tiles x k chunks), a request's
 * k split (more than one) or one row block per warp keep the rules; a
 * request of one split, as nbi_config_of describes this plan, gets it back.
 * A request of 12 warps takes the wave wherever it can run (17..24 tokens,
 * the wide instance's only token tile; `nibble tune` tries both widths),
 * one of 8 takes it with 8 warps where the rules would take it. */
static int k2_wave(const nbi_gemm_plan *p, int sms, int rpw, int rpw2, const nbi_request *rq) {
    if (rpw != 2 || p->mt < 3 || rq->splits > 1) return 0;
    if (k2_tiles256(p) * p->kchunks < 6 * (int64_t)sms) return 0;
    if (rq->warps == NBI_GEMV_WIDE_WARPS) return p->mt == 3 && !rpw2 ? NBI_GEMV_WIDE_WARPS : 0; /* (its only instance: 17..24) */
    if (rq->warps == NBI_GEMV_WARPS) {
        const nbi_request rules = {.splits = rq->splits};
        return k2_wave(p, sms, rpw, rpw2, &rules) ? NBI_GEMV_WARPS : 0;
    }
    const int64_t tiles = k2_tiles256(p);
    /* The integer and table formats: 8 warps where the split grid (tiles x
     * the splits that fit) leaves a quarter of the SMs idle, and at 25..32
     * tokens where one wave holds every tile, they are at least two fifths
     * of the SMs, and k has 40 chunks or more (H200, `nibble bench`, us at
     * m = 28 / 32, split grid -> wave, int4 / int8 / nf4: 8192 -> 28672,
     * 112 tiles, 67.6 / 73.9 / 92.0 -> 63.7 / 69.7 / 84.0 at m = 28;
     * 5120 -> 27648, 108, 43.6 / 47.8 / 58.9 -> 40.8 / 44.9 / 53.0; int4
     * 5120 -> 13824, 54, 26.3 -> 25.0.  Fewer tiles or chunks lost: int4
     * 8192 -> 8192, 32 tiles, 23.5 -> 25.0; 18944 -> 3584, 14, 27.0 ->
     * 27.8; 28672 -> 8192 2%; 4096 -> 14336, 32 chunks, 1-2%). */
    if (rpw2)
        return (tiles <= sms && 4 * tiles * (sms / tiles) < 3 * (int64_t)sms) ||
                       (p->mt == 4 && tiles <= sms && 5 * tiles >= 2 * (int64_t)sms && p->kchunks >= 40)
                   ? NBI_GEMV_WARPS
                   : 0;
    if (p->mt == 4) /* not where the tiles fill 84% of one wave and the wave would save under 7 chunks a CTA */
        return (tiles <= sms && 25 * tiles >= 21 * (int64_t)sms && p->kchunks * (sms - tiles) < 7 * (int64_t)sms) ||
                       k2_one_wave_split(p, sms, rpw2)
                   ? 0
                   : NBI_GEMV_WARPS;
    return p->row_blocks >= 8 * (int64_t)sms && p->kchunks >= 40 ? NBI_GEMV_WIDE_WARPS : 0;
}

/* Kernel 2 at 17..32 tokens (E2M1 formats) on its stream-K wave of one
 * CTA per SM with four row blocks per warp instead of two, whatever
 * k2_wave and the split-grid rules would run: each B fragment read from
 * shared memory feeds twice the MMAs.  8 consumer warps at 17..24 tokens
 * (154-162 registers), 7 at 25..32 (198; 8 would cap them at 224 and
 * spill), so a column tile is 32 or 28 row blocks (NBI_GEMV_RPW4_WARPS).
 * The tiles are twice the size, so each is shared by about twice the CTAs:
 * it pays on layers of at least 13.5 row blocks per SM (1782 on 132 SMs,
 * n >= 28512).  H200, `nibble bench`, the rules -> four row blocks,
 * alternated twice, NVFP4 (MXFP4 alike), us at m = 24 / 32: 8192 -> 57344
 * 104.3 / 127.7 -> 98.9 / 119.5 (m = 28: 128.1 -> 113.2); 8192 -> 128256
 * 241.4 / 295.0 -> 218.6 / 267.8; 7168 -> 36864 60.9 / 73.3 -> 59.1 /
 * 70.3; 5120 -> 55296 64.9 / 80.4 -> 62.6 / 74.7; 4096 -> 128256 121.1 /
 * 145.5 -> 111.7 / 131.7; 8192 -> 29568 68.2 -> 63.0 at 32; 8192 -> 28672
 * 56.1 / 67.3 -> 55.3 / 63.8; 3584 -> 37888 38.5 / 43.4 -> 35.2 / 41.6;
 * 4096 -> 28672 33.4 / 38.6 -> 33.3 / 37.5.  Narrower layers lost: 5120
 * -> 27648 (1728 row blocks) 0.99-1.04 of the time, 5120 -> 25600 1.00-1.02,
 * 4096 -> 24576 1.02-1.06, 7168 -> 18432 1.02-1.06, 3584 -> 18944
 * 1.09-1.17, 28672 -> 8192 up to 1.08, 8192 -> 8192 and 14336 -> 4096 at
 * 17..24 tokens 1.3-1.5 (NOTES.md, "Four row blocks per warp at 17..32
 * tokens").  Not on layers of under 28 k chunks (the shortest measured)
 * or 6 chunks per SM (256-row tiles x k chunks), or with a k split
 * requested.  A request of rpw 4 (or of 7 warps)
 * takes it wherever it can run, one of rpw 1 or 2 or of other warps keeps
 * the rules; NIBBLE_K2_RPW=4 / 2 at context creation: wherever it can run /
 * never (to measure).  Returns the consumer warps, or 0. */
static int k2_rpw4(const nb_context *ctx, const nbi_gemm_plan *p, const nbi_request *rq, int sms) {
    const int w4 = p->mt == 3 ? NBI_GEMV_WARPS : NBI_GEMV_RPW4_WARPS;
    if (!nbi_traits(p->fmt)->every_kernel || p->mt < 3 || rq->splits > 1 ||
        k2_tiles256(p) * p->kchunks < 6 * (int64_t)sms)
        return 0;
    if (rq->rpw == 4 || (rq->rpw == 0 && rq->warps == NBI_GEMV_RPW4_WARPS))
        return !rq->warps || rq->warps == w4 ? w4 : 0;
    if (rq->rpw || rq->warps || ctx->env_k2_rpw == 2) return 0;
    return ctx->env_k2_rpw == 4 || (2 * p->row_blocks >= 27 * (int64_t)sms && p->kchunks >= 28) ? w4 : 0;
}

/* Whether kernel 2's split grid (tiles x s CTAs on `slots` resident
 * slots) leaves more than a tenth of the slots idle where a stream-K wave
 * of `ctas` CTAs would share each tile among at most `share` CTAs and give
 * each CTA 6 chunks or more: the shape of the 9..16-token rule (wave16: the
 * resident CTAs, four a tile) and of the 17..24-token one (one CTA per SM,
 * three a tile) in plan_decode_split. */
static int split_grid_short(int64_t tiles, int64_t s, int64_t slots, int64_t ctas, int share, int64_t kchunks) {
    return tiles <= NBI_MAX_SPLIT_COLUMNS && 10 * tiles * s < 9 * slots && share * tiles >= ctas &&
           tiles * kchunks >= 6 * ctas;
}

/* CTAs of kernel 2 with `smem` bytes of shared memory that share an SM: as
 * many as its shared memory fits (plus the runtime's 1 KB reserve per CTA),
 * at least one, at most two (the launch bounds' register cap). */
static int k2_per_sm(const nb_context *ctx, size_t smem) {
    const size_t fit = ctx->info.smem_per_sm / (smem + 1024);
    return fit < 1 ? 1 : fit > 2 ? 2 : (int)fit;
}

/* Spread the work so the GPU fills.
 *
 * Kernel 1 (per-warp streams; m = 1..8 but kernel 2's wave at 2..8 on wide layers, and 9..32 where kernel 2
 * does not fit): kw warps of a CTA share one row block and split its k
 * range (summed in shared memory, cheap); `splits` CTAs share a row block
 * along k (summed through the workspace by the last CTA, which costs a
 * global round trip).  Measured on an H100 (bench/RESULTS.md, sweep of kw x
 * splits on five Llama layers, m = 1): a global split never paid
 * once the grid had about one CTA per SM, kw = 4 was best or within 3%
 * everywhere, and kw = 8 won when kw = 4 left fewer than about 1.4 CTAs per
 * SM.
 *
 * Kernel 2 (staged activations, 9..32 tokens, and 8 on wide layers): the
 * CTA's 8 warps (12: k2_wave) walk one k range (kw = 1) and each owns rpw
 * row blocks, so a CTA covers 8 * rpw row blocks; narrow layers are split
 * along k until one resident wave of CTAs fills the GPU (the partial sums
 * stay in L2).
 *
 * A request's variant, kw, rpw and splits replace the rules. */
static int64_t plan_decode_split(const nb_context *ctx, const nbi_request *rq, nbi_gemm_plan *p) {
    const int sms = ctx->info.sm_count;
    int warps = NBI_GEMV_WARPS;
    const int staged = rq->variant == 2, plain = rq->variant == 1;
    /* the integer and table formats' kernel 2 has two row blocks per warp only */
    const int rpw2 = !nbi_traits(p->fmt)->every_kernel;
    /* kernel 2 at 8 tokens too, on layers wide enough for no k split (below),
     * but not for the table formats (H200, nf4 8192 -> 57344: kernel 2 128.4
     * us, kernel 1 117.4; int4 88.8 / 93.7, int8 130.9 / 152.5) */
    const int table = nbi_is_table(nbi_traits(p->fmt));
    int xs = staged || (!plain && (p->mt >= 2 || (p->m == 8 && !table)));
    int rpw = rpw2 ? 2 : rq->rpw == 1 || rq->rpw == 2 ? rq->rpw : 2;
    /* 2..8 tokens (one token tile), the E2M1 formats: kernel 2 on one
     * stream-K wave of two CTAs per SM where the layer has at least half as
     * many 256-row tiles as SMs and 12 chunks or more for every CTA, and k
     * at least 24 chunks (the layers measured have 28 to 64).  Kernel
     * 1's time grows with the tokens (each lane loads its token's
     * activations), the wave's hardly.  H200, NVFP4 (MXFP4 alike), the rules
     * before -> the wave, us at m = 2 / 4 / 8.  A layer repeated (`nibble
     * bench`, old and new library alternated, two rounds within 1.2%): 4096
     * -> 28672 (112 tiles x 32 chunks) 25.0 / 26.9 / 27.8 -> 22.5 / 22.9 /
     * 23.5; 7168 -> 18432 (72 x 56) 29.1 / 31.7 / 30.2 -> 25.1 / 25.6 /
     * 26.3; 5120 -> 27648 (108 x 40) 27.4 / 29.8 / 30.2 -> 25.8 / 26.3 /
     * 27.2; 8192 -> 57344 74.7 / 83.3 / 81.5 -> 72.4 / 73.7 / 76.2; 8192 ->
     * 28672 39.5 / 43.3 / 43.6 -> 39.0 / 39.5 / 40.8.  After another
     * library's kernel, as in a model step (`nibble bench --sequence
     * --between`, the layer and a cuBLAS kernel of 1 us a pass), the wave's
     * start costs about 1.6 us more than kernel 1's, which leaves 4096 ->
     * 28672 26.7 / 28.5 / 27.7 -> 25.7 / 26.1 / 27.0, 7168 -> 18432 30.6 /
     * 33.4 / 35.9 -> 28.5 / 28.9 / 29.7, 8192 -> 57344 at m = 4 / 8 85.2 /
     * 87.5 -> 80.8 / 84.4; at m = 1 it takes that gain away (4096 -> 28672
     * 25.3 -> 25.4 a pass, 23.7 -> 22.3 repeated; the 8B model's compiled
     * step at batch 1 1.5% slower with it), so one token stays on kernel 1.
     * With 8 chunks a CTA the wave lost even repeated (4096 -> 16896, 66 x
     * 32: 13.5 -> 16.6 at m = 2, 14.7 -> 17.4 at 8), and fewer tiles share
     * each among more CTAs and lose at every m (8192 -> 8192, 32 tiles,
     * 13.1 -> 16.2 at m = 2; 14336 -> 4096, 16, 11.6 -> 15.8).  With one
     * CTA per SM the wave was behind two.  NOTES.md, "Kernel 2's stream-K
     * wave at 2..8 tokens".  A request of plain, of one row block per warp
     * or of a k split keeps the rules. */
    const int64_t tiles8 = k2_tiles256(p);
    int wave8 = !plain && !rpw2 && p->mt == 1 && rq->splits <= 1 && rq->rpw != 1 && 2 * tiles8 >= sms &&
                tiles8 * p->kchunks >= 24 * (int64_t)sms && p->kchunks >= 24 && p->m >= 2;
    if (wave8) { /* two CTAs of the instance per SM */
        const size_t b8 = nbi_cuda_gemv_smem(p->fmt, 1, 2, 1, 8, (size_t)p->chunk_bytes, NBI_GEMV_WARPS);
        wave8 = b8 <= ctx->info.smem_per_block_optin && k2_per_sm(ctx, b8) == 2;
    }
    if (wave8) xs = 1;
    /* 5..7 tokens: kernel 2 on a grid of two CTAs per SM where its streams
     * are long (k2_balanced_split; 8 tokens take kernel 2 by the rules
     * below) */
    if (!xs && !plain && !rpw2 && !table && p->mt == 1 && p->m >= 5 && rq->splits <= 0 && rq->rpw != 1 &&
        !kw_given(rq->kw) && k2_balanced_split(p, k2_tiles256(p), sms, 0))
        xs = 1;
    size_t smem = 0;
    /* one wave of one CTA per SM on a stream-K grid (k2_wave), with its consumer warps */
    int wave = xs ? k2_wave(p, sms, rpw, rpw2, rq) : 0;
    const int w4 = xs ? k2_rpw4(ctx, p, rq, sms) : 0; /* four row blocks per warp, where they fit */
    if (w4 && nbi_cuda_gemv_smem(p->fmt, 1, 4, p->mt, 8 * p->mt, (size_t)p->chunk_bytes, w4) <= ctx->info.smem_per_block_optin)
        rpw = 4, wave = w4;
    if (wave) {
        smem = nbi_cuda_gemv_smem(p->fmt, 1, rpw, p->mt, 8 * p->mt, (size_t)p->chunk_bytes, wave);
        if (smem > ctx->info.smem_per_block_optin) wave = 0; /* (smaller GPUs: the rules below) */
        else warps = wave;
    }
    if (xs && !wave) {
        smem = nbi_cuda_gemv_smem(p->fmt, 1, rpw, p->mt, 8 * p->mt, (size_t)p->chunk_bytes, warps);
        if (smem > ctx->info.smem_per_block_optin && rpw == 2 && !rpw2)
            smem = nbi_cuda_gemv_smem(p->fmt, 1, rpw = 1, p->mt, 8 * p->mt, (size_t)p->chunk_bytes, warps);
        if (smem > ctx->info.smem_per_block_optin) xs = 0; /* (smaller GPUs) */
    }
    int64_t grid_x, s = 1, resident = 0;
    if (xs) {
        int per_sm = k2_per_sm(ctx, smem);
        if (rpw2 && p->mt >= 3) per_sm = 1; /* (the integer and table formats' only instances at 17..32 tokens) */
        p->kw = 1;
        p->rpw = rpw;
        grid_x = (p->row_blocks + warps * rpw - 1) / (warps * rpw); /* column tiles */
        /* 17..32 tokens on a layer whose tiles already fill three quarters
         * of the SMs: one CTA per SM, the instance with the registers it
         * needs (H100, nvfp4, m = 32: 5120 -> 27648 59.1 us against 77.8
         * with 2 splits, 4096 -> 28672 42.5 against 58.1; m = 24: 52.5
         * against 61.5, 38.8 against 51.5).  Otherwise two CTAs per SM: two
         * resident CTAs hide more latency than one, even past the cost of
         * partial tiles (m = 16: 5120 -> 27648 48.9 us with 2 splits, 55.6
         * without; 14336 -> 4096 with 16 splits of 7 chunks, 14 of 8:
         * 1.18x). */
        if (p->mt >= 3 && 4 * grid_x >= 3 * sms) per_sm = 1;
        if (!wave && rpw == 2 && rq->splits <= 1 && k2_one_wave_split(p, sms, rpw2)) per_sm = 1; /* one wave of splits */
        /* 17..24 tokens (E2M1 formats) on layers of at most half a wave of
         * tiles: one CTA per SM too, where that gives runs of at most 32
         * chunks (H200, nvfp4, m = 18 / 20 / 24, us, splits filling two
         * CTAs per SM -> one: 8192 -> 8192, 32 tiles, 8 -> 4 splits, 23.6
         * / 23.6 / 25.7 -> 21.1 / 21.3 / 22.1; 14336 -> 4096 16 -> 8, 24.2
         * / 24.4 / 26.8 -> 20.4 / 20.5 / 20.6; 4096 -> 14336 4 -> 2, 23.3 /
         * 24.9 / 24.7 -> 20.6 / 21.3 / 21.1; 27648 -> 5120, 36 chunks a
         * run at one per SM, 41.0 / 41.5 / 43.3 -> 39.5 / 40.1 / 40.6, is
         * left at two; NOTES.md).  Where such runs are short the
         * tensor-core kernel takes these batches instead (plan_tc). */
        if (p->mt == 3 && !rpw2 && 2 * grid_x <= sms && p->kchunks <= 32 * (sms / grid_x)) per_sm = 1;
        if (wave) per_sm = 1;
        resident = (int64_t)sms * per_sm;
        if (grid_x < resident) s = resident / grid_x;
        /* 17..24 tokens, the E2M1 formats where k2_wave takes no wave: the
         * 8-warp stream-K wave (one CTA per SM) where the split grid fills
         * under nine tenths of its slots and a tile is shared by at most
         * three CTAs (H200, `nibble bench`, us at m = 17 / 20 / 24, NVFP4,
         * split grid -> wave: 3584 -> 18944, 74 tiles x 3 splits on 264
         * slots, 25.1 / 25.8 / 26.1 -> 21.6 / 21.8 / 22.1; 4096 -> 24576,
         * 96 x 2 on 264, 34.1 / 35.2 / 35.8 -> 29.1 / 29.5 / 29.4; 3584 ->
         * 28672, 112 on 132, 32.2 / 32.9 / 34.5 -> 29.4 / 29.8 / 29.9; 4096
         * -> 12288, 48 x 2 on 132, 19.6 / 19.9 / 20.0 -> 18.5 / 18.7 / 18.6;
         * 5120 -> 13824 3-4%; 4096 -> 28672 and 4096 -> 14336 within 3%;
         * MXFP4 alike).  More CTAs a tile lost: 4096 -> 7168, 28 tiles x 4,
         * 13.1 / 13.4 / 13.5 -> 14.2 / 14.4 / 14.5; 3072 -> 9216, 36 x 3,
         * 5-7%; 5120 -> 7168 3-5%; 14336 -> 4096, 16 x 8, 20.2 -> 21.7.
         * Fuller grids lost or were level: 28672 -> 8192, 32 x 8 on 264,
         * 58.1 / 59.8 -> 60.7 / 60.4 at m = 20 / 24; 8192 -> 10240, 40 x 3
         * on 132, level.  NOTES.md, "The integer codes' LOP3, and the 8-warp
         * wave at 17..24 tokens"). */
        if (!wave && p->mt == 3 && !rpw2 && rpw == 2 && rq->splits <= 1 &&
            split_grid_short(grid_x, s, resident, sms, 3, p->kchunks)) {
            wave = warps; /* (8: the smem above is the wave's) */
            resident = sms, s = 1;
        }
        /* 9..16 tokens: where two CTAs per SM get runs of fewer than 8
         * chunks, one CTA per SM with twice the run, if that still covers
         * 95% of the SMs with runs of 6 or more (H200, nvfp4,
         * `nibble bench`, us at m = 12 / 16, two per SM -> one: 14336 ->
         * 4096, 16 -> 8 splits, 19.1 / 19.7 -> 17.2 / 17.6; 12288 -> 4096
         * 17.7 / 18.2 -> 15.6 / 16.4; 3072 -> 8192, 32 tiles, 8 splits of 3
         * chunks (kernel 1's rule below made them 3 of 8) -> 4 of 6, 11.0 /
         * 11.1 -> 10.8 / 10.9).  Runs of 8 or more keep two per SM: 28672 ->
         * 8192 at 8 splits of 28 chunks 50.7 us, at 4 of 56 77.6; 18944 ->
         * 3584 at 17 of 8.7 21.5, at 9 of 16.4 27.7; 8192 -> 8192, 8 of 8,
         * 19.0 / 20.8 against 18.4 / 19.2 at 4 of 16, is left at two.
         * Where one per SM leaves a tenth of the SMs idle two stay ahead
         * (8192 -> 10240, 40 tiles: 3 splits 28.7 us, 6 splits 22.4).
         * The integer and table formats likewise (int4 12288 -> 4096 18.3
         * -> 15.7 us at m = 16, nf4 22.3 -> 20.2).  NOTES.md. */
        if (p->mt == 2 && !staged && (p->kchunks < 8 * s || (p->kchunks == 8 * s && 4 * grid_x <= sms))) {
            const int64_t s1 = sms / grid_x;
            if (s1 >= 2 && 20 * grid_x * s1 >= 19 * (int64_t)sms && p->kchunks / s1 >= 6) s = s1;
        }
        /* A CTA needs a run of chunks to fill its pipelines: with fewer than
         * 6 per split kernel 1 (its in-CTA k split) was faster in every case
         * measured, unless splits of 8 chunks still fill 70% of the SMs
         * (4096 -> 6144, m = 16: 24 CTAs x 4 splits 14.1 us, kernel 1 15.5;
         * 4096 -> 4096 with 16 CTAs stays with kernel 1). */
        if (p->kchunks / s < 6 && !staged && !wave) {
            const int64_t s8 = p->kchunks / 8;
            /* kernel 1's grid at 9..16 tokens (two CTAs per SM; kw by its
             * rule, k1_kw): past one wave it leaves a short second one, so
             * kernel 2 runs instead with one CTA per SM and runs of at
             * least 4 chunks (H200, nvfp4, us,
             * m = 12 / 16: 3584 -> 4608, kernel 1's 288 CTAs 12.2 / 14.5,
             * 18 tiles x 7 splits 9.2 / 9.5; 2880 -> 5120, 320 CTAs 10.9 /
             * 12.2, 20 x 5 splits 9.1 / 9.3; int4 10.2 -> 9.2 and nf4 13.5
             * -> 10.8 on 3584 -> 4608 at m = 16; NOTES.md) */
            const int64_t k1 = k1_grid(p, k1_kw(p, warps, sms, rpw2), warps);
            const int64_t s1 = sms / grid_x < p->kchunks / 4 ? sms / grid_x : p->kchunks / 4;
            if (s8 >= 1 && 10 * grid_x * s8 >= 7 * (int64_t)sms) s = s8;
            else if (p->mt == 2 && k1 > 2 * (int64_t)sms && s1 >= 2) s = s1;
            else xs = 0;
        }
        /* 8 tokens: kernel 1 costs 13-18% more than at 7 on 8192 -> 57344
         * (121 vs 107 us, H100), kernel 2 110 us.  With a k split kernel 2
         * won for the integer formats (H200, int4, us, kernel 2 / kernel 1:
         * 8192 -> 8192 16.5 / 18.0 with 4 splits, 28672 -> 8192 42.7 / 52.2
         * with 8; int8 21.8 / 24.5, 63.2 / 73.2) with the split above; for
         * the E2M1 formats (with the word layout of 2026-11-28) it wins with
         * splits of about 10 chunks or more: the largest power of two that
         * leaves 10, doubled where it would put just over one CTA on each SM
         * (the SMs with two would finish last), and only where the CTAs
         * cover nine tenths of the SMs (H200, NVFP4 / MXFP4, `nibble tune`,
         * kernel 1 -> kernel 2, us: 14336 -> 4096 16.7 -> 14.4 with 8
         * splits, 8192 -> 8192 17.2 -> 15.7 with 4, 5120 -> 27648 36.7 ->
         * 32.6 (MXFP4 38.1 -> 31.4) with 4, 8192 -> 10240 23.1 -> 21.3 with 8,
         * 28672 -> 8192 50.9 -> 45.1 with 16, 27648 -> 5120 35.8 -> 33.1
         * with 16, 4096 -> 28672 31.7 -> 31.6 (MXFP4 33.7 -> 30.7) with 2;
         * 4096 -> 4096 and 4096 -> 6144 stay on kernel 1, 6.8 / 9.0 us
         * against 7.3 / 9.2 at best; NOTES.md).  The table formats keep
         * kernel 1.  That split now only where k2_balanced_split finds no
         * grid of one or two CTAs per SM (5..7 tokens: none, kernel 1),
         * and not where its grid leaves a fifth of its last CTA per SM's
         * slots empty. */
        /* ... and, for the E2M1 formats, two splits of at least 10 chunks
         * where the tiles are more than the SMs but fewer than the resident
         * CTAs (unsplit, the SMs holding two CTAs finish last): H200, `nibble
         * bench` at m = 8, us, unsplit -> 2 splits, NVFP4 / MXFP4: 8192 ->
         * 57344 (224 tiles, 64 chunks) 97.1 / 94.6 -> 80.5 / 81.2, 7168 ->
         * 36864 70.3 / 69.3 -> 58.8 / 61.2, 3584 -> 37888 37.5 / 37.6 ->
         * 32.4 / 34.0, 5120 -> 55296 60.8 / 55.0 -> 55.2 / 55.8; five layers
         * it leaves alone within 0.8%; NOTES.md, "Two k splits at 8 tokens, and
         * kernel 2 at 9..16 tokens on a stream-K wave"). */
        if (p->mt == 1 && s == 1 && !staged && !rpw2 && grid_x > sms && grid_x < resident && p->kchunks >= 20) s = 2;
        else if (p->mt == 1 && s > 1 && !staged) {
            const int64_t sb = rpw2 ? 0 : k2_balanced_split(p, grid_x, sms, p->m == 8);
            if (sb) {
                s = sb;
            } else if (!rpw2 && p->m < 8) {
                xs = 0;
            } else if (!rpw2) {
                int64_t s2 = 1;
                while (2 * s2 * 10 <= p->kchunks) s2 *= 2;
                if (s2 * grid_x > sms && 2 * s2 * grid_x < 3 * (int64_t)sms && p->kchunks / (2 * s2) >= 6) s2 *= 2;
                /* (and not a grid that leaves a fifth of its last CTA per
                 * SM's slots empty: 3584 -> 18944, 74 tiles x 4 splits on
                 * 132 SMs, 19.07 us at m = 8 against kernel 1's 16.96) */
                const int64_t ctas = s2 * grid_x, c = (ctas + sms - 1) / sms;
                if (s2 > 1 && 10 * ctas >= 9 * (int64_t)sms && 5 * ctas >= 4 * c * sms) s = s2;
                else xs = 0;
            } else if (table) {
                xs = 0;
            }
        }
        if (wave8) { /* (the 8-token rules above may have turned it off; s = 1 below) */
            xs = 1;
            resident = 2 * (int64_t)sms;
        }
    }
    /* 9..16 tokens, the table formats: kernel 1 wherever its grid (kw by
     * k1_kw) fits one wave of two CTAs per SM (H200, nf4, m = 16, us,
     * kernel 1 / kernel 2 at its best split, `nibble tune`-style sweep:
     * 8192 -> 8192, 256 CTAs, 22.6 / 24.5; 12288 -> 4096 18.4 / 20.2;
     * 14336 -> 4096 21.6 / 22.6; 28672 -> 8192 67.5 / 70.1; 4096 -> 6144,
     * 192 CTAs, 12.6 / 13.6; past one wave kernel 2: 3584 -> 4608, 288,
     * 13.5 / 10.8; 27648 -> 5120, 320, 69.1 / 46.1; NOTES.md) */
    if (xs && table && p->mt == 2 && !staged &&
        k1_grid(p, k1_kw(p, NBI_GEMV_WARPS, sms, rpw2), NBI_GEMV_WARPS) <= 2 * (int64_t)sms)
        xs = 0;
    if (!xs) {
        warps = NBI_GEMV_WARPS;
        s = 1;
        const double want = 1.4 * (double)sms; /* CTAs */
        int kw = k1_kw(p, warps, sms, rpw2);
        const int fk = rq->kw;
        if (kw_given(fk)) kw = fk <= warps ? fk : warps;
        p->kw = kw;
        p->rpw = 1;
        grid_x = k1_grid(p, kw, warps);
        if ((double)grid_x < 0.5 * sms) s = (int64_t)ceil(want / (double)grid_x); /* narrow layer */
    }
    p->xsh = xs;
    /* 9..16 tokens: one wave of the resident CTAs (two per SM; int8, whose
     * ring takes more than half an SM's shared memory, one) on a stream-K
     * grid where the split grid leaves more than a tenth of the resident
     * slots idle and each tile is shared by at most four CTAs (H200,
     * `nibble bench`, us at m = 16, split grid -> the wave, NVFP4 / int4 /
     * nf4: 8192 -> 57344, 224 tiles unsplit, 107.3 / 103.8 / 148.4 -> 91.1
     * / 95.3 / 136.9; 7168 -> 18432, 72 tiles x 3 splits, 35.8 / 34.8 /
     * 48.1 -> 31.8 / 32.4 / 44.5; 5120 -> 25600, 100 x 2, 35.5 / 35.8 /
     * 50.2 -> 31.2 / 31.9 / 43.9; 3584 -> 18944, 74 x 3, 22.9 / 21.0 / 27.8
     * -> 20.7 / 20.7 / 25.7; MXFP4 8192 -> 57344 108.5 -> 87.0, int8 7168
     * -> 18432 (72 CTAs on 132 SMs) 61.3 -> 40.8.  More CTAs a tile lost:
     * 4096 -> 14336, 56 tiles, NVFP4 18.2 -> 19.1; 14336 -> 4096, 16 tiles,
     * 17.3 -> 20.7.  Where the split grid fills nine tenths the wave was
     * level: 8192 -> 8192, 4096 -> 12288, 28672 -> 8192; NOTES.md, "Two k
     * splits at 8 tokens, and kernel 2 at 9..16 tokens on a stream-K
     * wave").  A request of one split, as nbi_config_of describes this
     * plan, gets it back. */
    const int wave16 = xs && p->mt == 2 && rq->splits <= 1 && p->rpw == 2 &&
                       split_grid_short(grid_x, s, resident, resident, 4, p->kchunks);
    if ((wave || wave16 || wave8) && xs) s = 1; /* (the stream-K grid below) */
    if (rq->splits > 0) s = rq->splits;
    if (grid_x > NBI_MAX_SPLIT_COLUMNS) s = 1;
    const int64_t per_split_min = p->kw; /* at least one chunk per warp */
    if (s > p->kchunks / per_split_min) s = p->kchunks / per_split_min > 1 ? p->kchunks / per_split_min : 1;
    if (s > 64) s = 64;
    set_splits(p, s);
    if (xs) {
        /* Kernel 2: `splits` CTAs per column tile, each a k range of one
         * tile; or, where the tiles alone are more than one resident wave
         * and the last wave would leave more than a tenth of the slots idle
         * (splits = 1), stream-K: one wave of CTAs over which the tiles'
         * chunks spread evenly (gemv_fp4.cu, gemv_xs_sk_body).  H100, the
         * same run: 8192 -> 57344 (224 tiles, 132 slots at 17..32 tokens)
         * nvfp4 m = 24 128.8 us against 143.8, m = 32 147.7 against 164.2
         * (int4 123.2 / 126.8, 136.1 / 141.4); 4096 -> 128256 (501 tiles,
         * 95% of four waves) lost 2-8% with it, and with one wave holding
         * every tile it lost 2-12% (4096 -> 28672, 28672 -> 8192, 27648 ->
         * 5120 at m = 16 / 24; NOTES.md). */
        const int64_t tiles = grid_x, units = tiles * p->kchunks, waves = (tiles + resident - 1) / resident;
        int64_t ctas = tiles * p->splits;
        /* (the stream-K instances: two row blocks per warp; the integer and
         * table formats' for 9..32 tokens only) */
        const int sk = p->splits == 1 && tiles <= NBI_MAX_SPLIT_COLUMNS && (p->rpw == 2 || p->rpw == 4) &&
                       (wave || wave16 || wave8 || (tiles > resident && 10 * tiles < 9 * waves * resident && units >= 6 * resident &&
                                 (!rpw2 || p->mt >= 3)));
        p->tiles_n = (int)tiles;
        if (sk) { /* (fewer CTAs than tiles_n: the stream-K grid) */
            ctas = resident;
            p->chunks_per_split = (int)((units + ctas - 1) / ctas);
            grid_x = ctas;
        }
        /* At most one CTA per SM: kernel 2's instance without the register
         * cap of two CTAs per SM (17..32 tokens, two row blocks per warp; at
         * 25..32 the capped instance spills) */
        if (p->mt >= 3 && (p->rpw == 2 || p->rpw == 4) && (ctas <= sms || rpw2 || wave)) p->xsh = 2;
    }
    p->warps = warps;
    return grid_x; /* CTAs along n (kernel 2's stream-K grid: all of them; range-checked by the caller) */
}

static nb_status plan_decode(nb_context *ctx, const nbi_request *rq, nbi_gemm_plan *p) {
    p->path = NBI_PATH_GEMV;
    p->warps = NBI_GEMV_WARPS;
    /* The split-K arrival counters live at a fixed place (the first
     * NBI_MAX_SPLIT_COLUMNS ints of the workspace), so one workspace serves
     * layers of every shape: each call leaves them zero. */
    const nbi_gemm_plan p0 = *p;
    int64_t grid_x = plan_decode_split(ctx, rq, p);
    /* Two tokens (E2M1 formats): kernel 1 where the one-token rule below
     * gives it a plan, instead of kernel 2's stream-K wave, whose start
     * costs more after another library's kernel than kernel 1's (H200,
     * NVFP4, m = 2, `bench/config_sweep --between`, the wave -> kernel 1,
     * us: 4096 -> 28672 (kw 1) 25.08 -> 23.41, 3584 -> 37888 27.62 ->
     * 25.45, 7168 -> 18432 (kw 2) 27.09 -> 25.24; the same calls repeated
     * 22.58 -> 22.21, 25.45 -> 24.00, 25.35 -> 24.63, MXFP4 within 2%
     * either way; at m = 4 the wave was still ahead repeated, by up to 3%;
     * NOTES.md, "Kernel 2's split at 5..8 tokens, and kernel 1 at 2..8
     * tokens"). */
    const int wave_at_two = p->m == 2 && p->xsh && grid_x != p->tiles_n; /* (kernel 2's stream-K grid) */
    if (wave_at_two && nbi_traits(p->fmt)->every_kernel && rq->variant == 0 && rq->splits <= 0 && rq->rpw == 0 &&
        rq->warps == 0 && !kw_given(rq->kw)) {
        nbi_gemm_plan q = p0;
        nbi_request r = *rq;
        r.variant = 1; /* (plain: kernel 1 by the rules) */
        const int64_t g1 = plan_decode_split(ctx, &r, &q);
        int kw = 0;
        int64_t grid = 0;
        if (g1 <= 0x7FFFFFFF && !q.xsh && q.splits == 1) {
            q.grid_x = (int)g1;
            if (k1_one_token(ctx, &q, 1, &kw, &grid) == 2) { /* (applied below, as to every kernel-1 plan) */
                *p = q;
                grid_x = g1;
            }
        }
    }
    if (grid_x > 0x7FFFFFFF)
        return nbi_fail(ctx, NB_ERR_BAD_SHAPE, "nb_gemm: n = %lld needs too many CTAs", (long long)p->n);
    p->grid_x = (int)grid_x;
    /* Kernel 1 of the table formats (96 registers at one token tile since
     * the pair table: two CTAs per SM): where its grid is between one and
     * one and a half resident waves, twice the warps per row block, so the
     * second wave is not a short tail of whole row blocks (H200, the
     * kernels of 2026-11-28: 8192 -> 10240, 320 CTAs on 264 slots, 640
     * with it; `nibble bench` against the plan without it, alternated
     * twice: nf4 25.41 -> 20.42 us at m = 1 and 29.33 -> 27.45 at m = 8,
     * bnb_fp4 25.38 -> 20.50 and 29.24 -> 27.41; the six other layers of
     * the set within 0.4%: no other has such a grid at kw = 4, and the
     * other formats fit three CTAs per SM there; NOTES.md). */
    if (!p->xsh && p->mt == 1 && nbi_is_table(nbi_traits(p->fmt)) && p->splits == 1 && p->kw < p->warps &&
        !kw_given(rq->kw) && p->kchunks >= 8 * (int64_t)p->kw) {
        const int64_t res = k1_slots(ctx, p);
        if (res > 0 && p->grid_x > res && 2 * (int64_t)p->grid_x <= 3 * res) {
            p->kw *= 2;
            p->grid_x = (int)k1_grid(p, p->kw, p->warps);
        }
    }
    /* Kernel 1 at one token tile (every format, 1..8 tokens, where kernel
     * 1 runs; for the E2M1 formats at 2..8 since 2026-11-30: H200, each
     * call after a foreign kernel, `bench/config_sweep --between
     * --heuristic`, alternated twice, NVFP4, kw 4 -> the rule's: 4096 ->
     * 6144 kw 8 (384 CTAs) 8.43 / 9.50 -> 7.88 / 8.66 us at m = 2 / 8,
     * 4096 -> 22528 kw 2 (352) 24.17 -> 20.48 at m = 4, 4096 -> 24576
     * 24.46 -> 20.76; repeated level on 4096 -> 6144 (NVFP4 0.99-1.01,
     * MXFP4 0.95-0.98), 0.89-0.97 on the others): the
     * most warps per row block whose grid is one resident wave, where that
     * leaves every warp at most 32 chunks, does not put a third CTA on a
     * few SMs only (2..2.5 CTAs per SM) and, where it halves the warps,
     * keeps more than 1.5 CTAs per SM (with two CTAs per SM a grid halved
     * below that starves the SMs of warps); else the rules above.  H200,
     * NVFP4, `nibble tune --all` over 38 layers, us, the rules before ->
     * this: 4096 -> 28672 kw 4 -> 1 (896
     * -> 224 CTAs) 23.7 -> 22.0, 4096 -> 32768 24.1 -> 22.2, 4096 -> 22528
     * kw 4 -> 2 (704 -> 352) 19.0 -> 17.7, 4096 -> 24576 19.0 -> 18.0, 4096
     * -> 6144 kw 4 -> 8 (192 -> 384) 6.83 -> 6.60, 7168 -> 18432 and 3584
     * -> 18944 kw 2 -> 4 (288 and 296 CTAs at kw 2: the third CTA on some
     * SMs) 27.6 -> 24.8 and 15.6 -> 14.5.  The bounds are where the data
     * turned: kw 1 lost with 40 and 64 chunks a warp (5120 -> 27648 26.9
     * against kw 4's 25.7, 8192 -> 28672 41.4 / 37.5; NVFP4: the integer
     * and table formats' bounds are k1_one_token_chunks') and with 272-296 CTAs
     * (4096 -> 36864 30.7 / 26.8, 3584 -> 37888 27.3 / 24.6), kw 2 won with
     * 352 and 384.  The integer and table formats (H200, the same tuner,
     * 26 layers at m = 1, int4 and nf4 also at 2 and 4; int4 / int4_sym /
     * int8 with groups of 128 fit three CTAs per SM, nf4 / bnb_fp4 /
     * int4_hqq two): 94 of 135 cells moved, at 0.89 of the time
     * (geometric mean), the worst 1.009 (int8 4096 -> 6144): 4096 ->
     * 14336 kw 4 -> 2 int4 13.1 -> 11.3, nf4 14.7 -> 13.1, int8 22.1 ->
     * 15.8; 2048 -> 28672 kw 4 -> 1 nf4 15.9 -> 12.6; with two CTAs per SM
     * kw 1 on 4096 -> 22528 (176 CTAs) lost (nf4 20.8 -> 22.6), hence the
     * floor.  Measured against the rules before (`nibble bench`, six
     * formats, 16 layers, m = 1..8): 194 cells moved at 0.89 of the time,
     * the worst int8 4096 -> 6144 at m = 4 (1.04).  NOTES.md, "Kernel 1's
     * warps per row block at one token" and "Kernel 1's one-token rule for
     * the integer and table formats".  The 2..2.5 CTAs per SM stay out
     * only where kernel 1's balanced wave (below) cannot even them out:
     * with it, 4096 -> 36864 kw 1 (384 CTAs of 6 row blocks) 26.74 -> 26.10
     * us, 3584 -> 37888 kw 1 24.33 -> 22.94, 3584 -> 18944 kw 2 (395 of 3)
     * 14.49 -> 13.76, 7168 -> 18432 24.85 -> 23.88, int4 3584 -> 18944
     * 16.07 -> 12.45 (H200, NVFP4 at m = 1 unless named, alternated twice;
     * NOTES.md, "Kernel 1's balanced wave"), while 6144 -> 20480 at kw 2
     * (320 CTAs, 4 row blocks each already the fewest within three per SM)
     * lost 5-7% and keeps kw 4. */
    int one_token = 0;
    const int e2m1 = nbi_traits(p->fmt)->every_kernel;
    if (!p->xsh && p->mt == 1 && p->splits == 1 && !kw_given(rq->kw)) {
        int kw = 0;
        int64_t grid = 0;
        const int r = k1_one_token(ctx, p, e2m1, &kw, &grid);
        one_token = r > 0;
        if (r == 2) {
            p->kw = kw;
            p->grid_x = (int)grid;
        }
    }
    /* ... and at 2..8 tokens (and at one where fewer than three CTAs fit or
     * k is under 16 chunks, which the rule above leaves):
     * where kw = 4 makes a grid of one to one and a half resident waves,
     * half the warps per row block, so every CTA runs in the first wave
     * (H200, nvfp4, m = 1 then, us, kw = 4 -> 2: 3584 -> 18944, 592 CTAs on
     * 396 slots, 18.2 -> 16.5; 7168 -> 18432, 576, 31.2 -> 28.6; 5120 ->
     * 13824, 432, 18.6 -> 16.2; no layer of the bench set has such a grid;
     * NOTES.md).
     * And the table formats (nf4, bnb_fp4) at 1..8 tokens on grids of more
     * than six resident waves at kw = 4: kw = 2, half as many CTAs, each
     * with its own 1 KB pair table to fill, streaming twice as long (H200,
     * `nibble tune --all`, nf4, us, kw 4 -> 2 at m = 1 / 4 / 8: 8192 ->
     * 57344, 1792 CTAs on 264 slots, 79.1 -> 76.3, 85.8 -> 83.4, 97.7 ->
     * 93.4; 8192 -> 59136 80.1 -> 76.2, 86.7 -> 84.0, 100.5 -> 95.2; 5120 ->
     * 55296 52.5 -> 49.6, 56.5 -> 53.8, 61.4 -> 58.4; each call after a
     * foreign kernel at m = 1 the same, bnb_fp4 alike; at 4.4-4.5 waves kw 4
     * stays ahead: 7168 -> 36864, 3584 -> 37888, and 8192 -> 28672 at 3.4;
     * NOTES.md, "nf4 at one token on many waves"). */
    if (!p->xsh && p->mt == 1 && p->splits == 1 && p->kw == 4 && !kw_given(rq->kw) &&
        ((e2m1 && !one_token) || nbi_is_table(nbi_traits(p->fmt)))) {
        const int64_t res = k1_slots(ctx, p), grid = p->grid_x;
        const int take = e2m1 ? grid > res && 2 * grid <= 3 * res
                              : grid > 6 * res && p->kchunks >= 40; /* (measured from 40 chunks) */
        if (res > 0 && take) {
            p->kw = 2;
            p->grid_x = (int)k1_grid(p, p->kw, p->warps);
        }
    }
    /* Kernel 1's balanced wave: a grid of one resident wave puts w =
     * ceil(grid / SMs) CTAs on the busiest SMs and one fewer on the rest,
     * and the call ends with the busiest (4096 -> 28672 at m = 1: 224 CTAs
     * of 8 row blocks, 92 SMs with two and 40 with one; the last CTA ended
     * 3.1 us after the median one, H200, NOTES.md "Where a small layer's
     * microseconds go").  The fewest row blocks per CTA that keep the grid
     * within w CTAs per SM, ceil(row_blocks / (w SMs)), load every SM
     * within one CTA's share of the mean (there 7: 256 CTAs, 124 SMs with
     * 14 row blocks and 8 with 7, against 16 on 92 SMs); the CTA's other
     * warps idle.  Only without a k split (the split grids' columns are
     * summed per CTA column), on streams of more than 8 chunks a warp (on
     * 512 -> 18944, 2 chunks a warp, 395 CTAs of 3 row blocks ran 2-4%
     * slower than 296 of 4: there a CTA's fixed cost outweighs the
     * imbalance) and where it takes a row block off the busiest SMs.
     * Measured (H200, the library before alternated twice, 39 cells of
     * six layers and four formats at m = 1..8): 0.943 of the time,
     * 4096 -> 18432 and 3584 -> 18944 at m = 2 / 4 (kw = 2, 288 and 296
     * CTAs -> 384 and 395 of 6 warps) 0.85-0.87, 4096 -> 28672 at m = 1
     * 0.95-0.96 (NVFP4 22.05 -> 21.18 us), nf4 2048 -> 28672 0.91. */
    /* Kernel 1's occupancy: where its registers let three or more CTAs
     * share an SM, they do only where that takes a wave off the grid
     * (H100, m = 1 / 8: 8192 -> 10240, 320 CTAs, 22.0 / 23.6 us with three
     * against 27.4 / 32.4 with two; 4096 -> 28672, 896 CTAs, 30.2 / 34.6
     * against 31.5 / 35.8); else at most two do, held by dynamic shared
     * memory past the ring (256-CTA layers at m = 8: 4-10% faster with two,
     * 14336 -> 4096 18.8 -> 17.5 us, 8192 -> 8192 19.6 -> 18.1; NOTES.md).
     * The balanced wave first: both ask the occupancy of the same instance
     * (the grid does not choose it), so it is asked once. */
    p->k1_rows = 0;
    p->per_sm = 0;
    p->dyn_smem = 0;
    if (!p->xsh) {
        size_t bytes = 0;
        const int c = nbi_cuda_gemv_ctas_per_sm(ctx, p, 0, &bytes);
        const int64_t q = p->splits == 1 ? k1_balanced_rows(p, p->kw, p->grid_x, c, ctx->info.sm_count) : 0;
        if (q > 0) {
            p->k1_rows = (int)q;
            p->grid_x = (int)((p->row_blocks + q - 1) / q);
        }
        const int64_t ctas = (int64_t)p->grid_x * p->splits, sms = ctx->info.sm_count;
        if (c > 2 && ctas > sms && (ctas + c * sms - 1) / (c * sms) >= (ctas + 2 * sms - 1) / (2 * sms) &&
            nbi_cuda_gemv_ctas_per_sm(ctx, p, 2, &bytes) == 2) {
            p->per_sm = 2;
            p->dyn_smem = (int)bytes;
        }
    } else if (p->mt == 1 && p->splits > 1 && p->grid_x == p->tiles_n && nbi_traits(p->fmt)->every_kernel) {
        /* Kernel 2's split grid at 2..8 tokens (E2M1 formats) of one to two
         * CTAs per SM, where three fit (72 registers): held to two, like
         * kernel 1 above.  One call's CTAs land two per SM either way (the
         * block scheduler fills every SM to one before any takes a second);
         * what the cap changes is the next call's, which under programmatic
         * dependent launch start in the third slots while this call runs
         * and then take its slots as they free, three on some SMs and one
         * on others: back to back, 29568 -> 8192 at m = 8 (32 tiles x 8
         * splits) ran 41.5 us in one run and 47.3 in the next, MXFP4 28672
         * -> 8192 46.4-46.7 against 38.5-40.2 NVFP4.  Held (H200, `nibble
         * bench`, without and with, alternated twice, eight layers at m =
         * 5 / 6 / 8, both formats): 36 cells at 0.833 of the time, 27648 ->
         * 5120 m = 8 32.68 -> 25.83 us, MXFP4 28672 -> 8192 49.74 -> 40.13;
         * after a foreign kernel level (`--sequence --between`, 238-240 us
         * a pass either way).  NOTES.md, "Kernel 2's split at 5..8 tokens,
         * and kernel 1 at 2..8 tokens". */
        const int64_t ctas = (int64_t)p->grid_x * p->splits, sms = ctx->info.sm_count;
        size_t bytes = 0;
        if (ctas > sms && ctas <= 2 * sms && nbi_cuda_gemv_ctas_per_sm(ctx, p, 0, &bytes) > 2 &&
            nbi_cuda_gemv_ctas_per_sm(ctx, p, 2, &bytes) == 2) {
            p->per_sm = 2;
            p->dyn_smem = (int)bytes;
        }
    }
    if (nbi_plan_stream_k(p)) {
        /* kernel 2's stream-K partial tiles: slot b for CTA b's first
         * segment (gemv_fp4.cu, xs_slot), warps * rpw row blocks x 8 mt
         * tokens each */
        p->ws_counter_bytes = NBI_MAX_SPLIT_COLUMNS * sizeof(int);
        p->ws_partial_bytes = (size_t)p->grid_x * (size_t)(p->warps * p->rpw * 16) * (size_t)(8 * p->mt) * sizeof(float);
    } else if (p->splits > 1) {
        p->ws_counter_bytes = NBI_MAX_SPLIT_COLUMNS * sizeof(int);
        p->ws_partial_bytes = (size_t)p->splits * (size_t)p->row_blocks * 16 * 32 * sizeof(float);
    }
    return NB_OK;
}

/* ----------------------------------------- Hopper tensor-core kernel */

/* The tensor-core tile widths plan_tc weighs (tokens), and per width the
 * time of one 128-k chunk of a two-warpgroup (128-row) tile and a CTA's
 * pipeline fill and epilogue, in us, measured on an H100 (plan_tc says
 * where each comes from). */
static const int k_tc_widths[6] = {64, 128, 256, 16, 32, 192};
static const double k_tc_chunk_us[6] = {0.68, 0.80, 1.16, 0.67, 0.69, 1.08};
static const double k_tc_fill_us[6] = {3.5, 5.0, 7.0, 0.0, 0.0, 6.0};

double nbi_sm90_chunk_us(int bn) {
    for (int i = 0; i < 6; i++)
        if (k_tc_widths[i] == bn) return k_tc_chunk_us[i];
    return 0.0;
}

/* Consumer warpgroups of the tensor-core kernel for a tile width (64 weight
 * rows each, gemm_sm90.cu): four (256-row tiles) for the 16- and 32-token
 * tiles on layers of at least 48 128-row tiles, where half as many tiles
 * leave room for a k split; else two (128-row tiles).  Measured on an H100
 * (nvfp4, m = 32, us, two / four warpgroups at the split the planner
 * gives): 8192 -> 10240 (80 tiles) 44.8 / 33.3, 4096 -> 6144 (48) 15.2 /
 * 14.6, 8192 -> 8192 (64) 25.9 / 25.9; with 32 tiles (4096 -> 4096,
 * 14336 -> 4096) two warpgroups and 4 splits ran 10.2 and 23.4 us, while
 * the four-warpgroup tile there was not measured. */
static int tc_cwg(const nbi_gemm_plan *p, int bn) {
    return bn <= 32 && (p->row_blocks + 7) / 8 >= 48 ? 4 : 2;
}

static int64_t tc_tiles_n(const nbi_gemm_plan *p, int bn) {
    const int64_t rb = 4 * tc_cwg(p, bn); /* row blocks per tile */
    return (p->row_blocks + rb - 1) / rb;
}

/* The instance index of a tile width and consumer warpgroups (the rows of
 * ctx->sm90_clusters: 0..NBI_SM90_INSTANCES-1). */
static int sm90_instance(int bn, int cwg) {
    const int i = bn == 16 ? 0 : bn == 32 ? 1 : bn == 64 ? 2 : bn == 128 ? 3 : bn == 192 ? 7 : 4;
    return cwg == 4 ? 5 + i : i;
}

/* Clusters of s CTAs of that instance that run at once (0: none, or cluster
 * split-K turned off by NIBBLE_SM90_CLUSTER=0); asked of the device once per
 * context, for the first format that asks (every instance runs one CTA per
 * SM, whose shared memory the integer formats' larger chunks, at most 1.5 KB
 * more per stage, do not change). */
static int tc_clusters(nb_context *ctx, const nbi_gemm_plan *p, int bn, int cwg, int s) {
    if (ctx->env_no_cluster || s < 2 || s > NBI_SM90_MAX_SPLITS) return 0;
    int *slot = &ctx->sm90_clusters[sm90_instance(bn, cwg)][s];
    if (!*slot) *slot = 1 + nbi_cuda_sm90_clusters(ctx, p->fmt, p->act, bn, cwg, p->group, s);
    return *slot - 1;
}

/* What summing a tile's s k splits costs, in us, fitted to 48 split
 * configurations measured on an H100 (nvfp4; 4096 -> 4096, 4096 -> 6144,
 * 8192 -> 8192, 14336 -> 4096, 27648 -> 5120 at m = 128, 256, 512; the
 * time over the unsplit model of the same chunks; NOTES.md).  Each CTA's
 * partial is KB = cwg x bn / 4 KB of FP32 (128 for the 256-token tile).
 * Through the workspace (sm90_split_reduce) every CTA writes it and the last
 * to arrive reads all s; in a cluster (sm90_cluster_reduce) each CTA writes
 * it to its own shared memory and sums 1/s of the tile from every CTA's, at
 * the price of two cluster barriers.  Measured, the cluster is 3-4 us
 * cheaper for the 256-token tile, even at 2 splits of the 128-token one,
 * and about 1 us dearer for the 64-token one. */
static double tc_reduce_us(int s, int bn, int cwg, int cluster) {
    if (s <= 1) return 0.0;
    const double kb = 256.0 * cwg * bn / 1024.0;
    return cluster ? 1.9 + kb * (0.018 + 0.011 * s) : 1.8 + kb * (0.028 + 0.007 * s);
}

/* The last wave of an unsplit tensor-core grid.  When the tiles are more
 * than a wave and the last wave is partial (tiles % SMs), its tiles can run
 * as a second launch of the same kernel, split along k over the SMs the
 * whole waves leave idle and summed through the workspace (the tail split):
 * 8192 -> 10240 at m = 512 is 160 tiles of 256 tokens, a full wave of 132
 * and 28 left, which unsplit cost a second wave as long as the first.
 * Returns the cost of the unsplit grid (`unsplit`, in the model's us) or,
 * where the model charges less, of the whole waves plus the split tail, in
 * which case *tail_s is the tail's split (else 0).  The tail's splits keep
 * it within one wave (tail x s <= SMs: the workspace bound of
 * nbi_plan_workspace holds). */
static double tc_tail(const nb_context *ctx, const nbi_gemm_plan *p, int64_t tiles, double chunk, double fill, int bn,
                      int cwg, double unsplit, int *tail_s) {
    *tail_s = 0;
    const int64_t sms = ctx->info.sm_count, tail = tiles % sms, full = tiles / sms;
    if (ctx->env_no_tail || full == 0 || tail == 0) return unsplit;
    const double whole = (double)full * (chunk * (double)p->kchunks + fill);
    double best = unsplit;
    for (int64_t s = 2; s <= NBI_SM90_MAX_SPLITS && s <= p->kchunks && tail * s <= sms; s++) {
        const double c = whole + chunk * (double)((p->kchunks + s - 1) / s) + fill + tc_reduce_us((int)s, bn, cwg, 0);
        if (c < best) best = c, *tail_s = (int)s;
    }
    return best;
}

/* The stream-K grid (gemm_sm90.cu, gemm_sm90_sk_kernel): one CTA per SM
 * walking an equal share of the tiles' k chunks, a tile that two or more
 * CTAs share summed by the one holding its start from the others' partials
 * in the workspace.  Where the tiles leave part of a wave idle it gives
 * every SM the same work, which no split of whole tiles does.  Returns its
 * cost in the model's us, or 0 where it does not run: the 64-, 128- and
 * 256-token tiles (two consumer warpgroups; every format), at most
 * NBI_MAX_SPLIT_COLUMNS tiles (a counter each), at least two chunks per CTA
 * and a batch that fills most of a tile (m >= bn for the 256-token tile;
 * the 128-token tile from 65 tokens, the 64-token tile at 33..64 only,
 * where it is the one tile of tokens),
 * activations of at most 60% of the L2 (a CTA's k range starts anywhere,
 * so the CTAs do not walk k together as a wave of tiles does: what they
 * read of X must stay in the L2; 27648 -> 5120 at m = 1024, 57 MB, ran 49%
 * slower on it), not on request of a k split or with
 * NIBBLE_SM90_SK=0.  Its costs were fitted to 56 runs on an H100 (nvfp4,
 * 2026-11-27, NOTES.md): 0.93 / 1.55 us per chunk for the 128- / 256-token
 * tile, 7 us per call, and where a tile is shared by more than two CTAs
 * 0.015 us per KB of each further partial the owner adds (4096 -> 4096 at
 * m = 256: 32 tiles of 256 tokens over 132 CTAs, five to a tile, ran 37%
 * slower than two splits of the 128-token tile in a cluster).  Its chunks
 * cost more than the model's chunks of one CTA per tile (0.80 / 1.16),
 * which were measured where the tiles leave SMs idle: with every SM busy a
 * chunk takes longer (a whole-wave grid of 256-token tiles measured
 * 1.35-1.55 us per chunk too; ncu: SM throughput 85%, L2 40%), so the grid
 * pays where the waves of whole tiles leave a third or more of the SMs
 * idle.  The 64-token tile's grid was measured on an H200 (nvfp4,
 * 2026-12-01, NOTES.md "The 64-token tile on the stream-K grid"): over 30
 * layers at m = 40, 48, 64, forced against none, about 0.67 us per chunk a
 * CTA and 6.7 us per call (the unsplit tiles' chunks cost the same 0.68
 * there: a 64-token chunk does not slow down with every SM busy), ahead
 * wherever the split grids leave 4 or more SMs idle (8192 -> 10240, 80
 * tiles: 46.4 -> 31.7 us) and 1-4% behind on the short layers whose splits
 * fill 128 of 132 SMs (2048 -> 8192, 8192 -> 2048), which these costs
 * leave to the splits. */
#define NBI_SK64_MIN_M 33
/* The 128-token tile's grid below a full tile (65..127 tokens): H200,
 * 2026-12-01, NOTES.md "The 128-token tile on the stream-K grid below 128
 * tokens".  Its chunks cost what the model charges from m = 128 (27 layers
 * at m = 72 / 96 / 120 forced: 0.926 us per chunk a CTA + 7.0 us), but on
 * short layers whose whole tiles a k split spreads over all but a few SMs
 * the split stays ahead (3072 -> 8192: 64 tiles, two splits on 128 SMs,
 * 16.7 against 17.9 us; 5120 -> 5120: 40 tiles x 3 on 120, 1-6%), so there
 * the grid needs NBI_SK128_PART_IDLE SMs left idle by the fullest split or
 * NBI_SK128_PART_W chunks a CTA (8192 -> 5120: 19.4 chunks, 120 SMs
 * filled, 2-3% ahead). */
#define NBI_SK128_MIN_M 65
#define NBI_SK128_PART_IDLE 16
#define NBI_SK128_PART_W 16.0
/* chunks a CTA: measured from 7.6 (3584 -> 4608); below, the fixed costs decide, unmeasured */
#define NBI_SK64_MIN_W 7.5
#define NBI_SK64_CHUNK_US 0.67
#define NBI_SK64_FIXED_US 6.7
/* The grid asked for wherever it can run: NIBBLE_SM90_SK=1, or a
 * configuration's stream_k = 1. */
static int sk_forced(const nb_context *ctx, const nbi_request *rq) { return ctx->env_sk == 1 || rq->sk == 1; }
static double tc_stream_k(const nb_context *ctx, const nbi_gemm_plan *p, const nbi_request *rq, int64_t tiles, int bn,
                          int cwg, int64_t m) {
    const int64_t G = ctx->info.sm_count, K = p->kchunks, U = tiles * K;
    const int forced = sk_forced(ctx, rq);
    const int b64 = bn == 64, m_ok = b64 ? m >= NBI_SK64_MIN_M && m <= 64 : m >= (bn == 128 ? NBI_SK128_MIN_M : bn);
    if (ctx->env_sk == 0 || rq->sk < 0 || cwg != 2 || (!b64 && bn != 128 && bn != 256) ||
        tiles > NBI_MAX_SPLIT_COLUMNS || G < 2 || U < 2 * G || rq->splits > 1 || !m_ok ||
        (double)m * (double)p->k * 2.0 > 0.6 * (double)ctx->info.l2_bytes)
        return 0.0;
    const double w = (double)U / (double)G, parts = (double)K / w + 1.0; /* chunks per CTA; CTAs per tile */
    if (b64 && w < NBI_SK64_MIN_W) return 0.0;
    if (bn == 128 && m < 128 && !forced && w < NBI_SK128_PART_W) { /* the SMs a split of whole tiles fills */
        int64_t fill = 0;
        for (int64_t s = 1; s <= NBI_SM90_MAX_SPLITS && s <= K && tiles * s <= G; s++) fill = tiles * s;
        if (G - fill < NBI_SK128_PART_IDLE) return 0.0;
    }
    const double gather = parts > 2.0 ? (parts - 2.0) * 0.015 * (256.0 * cwg * bn / 1024.0) : 0.0;
    return w * (b64 ? NBI_SK64_CHUNK_US : bn == 128 ? 0.93 : 1.55) + (b64 ? NBI_SK64_FIXED_US : 7.0) + gather;
}

/* The integer and table formats on the tensor-core kernel: from m =
 * NBI_INT_TC_MIN on request; by the heuristic past the decode range (m >
 * 32), and from m = 17 on layers with fewer 128-row tiles than SMs (tn),
 * where the tensor-core kernel splits k and its time does not grow with m,
 * as far as the rules below give it.  Otherwise the staged decode kernel
 * (kernel 2) runs.  Measured first on an H200 (2026-11-26, int4 groups of 128 / nf4 blocks
 * of 64, us, staged decode / tensor core): m = 20: 8192 -> 28672 65.2 /
 * 95.9, nf4 89.7 / 105.2; 8192 -> 57344 130.0 / 193.8, nf4 178.7 / 209.8;
 * 8192 -> 8192 25.7 / 29.4, nf4 31.6 / 31.0; 4096 -> 14336 25.7 / 25.4, nf4
 * 31.7 / 28.3; m = 32 (tensor core as at 24): 8192 -> 28672 70.6 / 95.1,
 * 8192 -> 8192 29.0 / 28.1, 4096 -> 14336 29.1 / 25.4, nf4 34.4 / 28.3.
 * Layers of k >= 16384 keep the decode kernel to m = 32 (28672 -> 8192, 64
 * tiles: m = 32 int4 70.5 / 84.0, int8 84.8 / 91.3, nf4 88.5 / 93.2; m = 20
 * nf4 85.1 / 92.3; nibble tune, H200). */
#define NBI_INT_TC_MIN 17
/* Decode kernel 2's runs where it would split k over one CTA per SM on a
 * layer of row_blocks: chunks per CTA over its 256-row tiles (0 past one
 * tile per SM). */
static int64_t k2_runs(const nb_context *ctx, const nbi_gemm_plan *p) {
    const int64_t t2 = k2_tiles256(p), per = ctx->info.sm_count / (t2 > 0 ? t2 : 1);
    return per > 0 ? p->kchunks / per : 0;
}
/* Re-measured on an H200 (2026-11-29, NOTES.md "The decode planner off the
 * bench set", us, kernel 2 at one CTA per SM / tensor core): at 17..24
 * tokens kernel 2 wherever its runs are 6 chunks or more for the integer
 * formats (int4 m = 20: 12288 -> 4096, runs of 12, 18.9 / 20.8; 4096 ->
 * 6144, 6.4, 13.3 / 15.3), 16 or more for the table formats (nf4 m = 24:
 * 8192 -> 8192 25.6 / 28.1, 8192 -> 10240 32.3 / 36.2, 4096 -> 12288 24.8
 * / 27.4; 12288 -> 4096, runs of 12, 22.3 / 21.8), the tensor core where
 * they are shorter (int4 m = 20: 3584 -> 4608 10.8, where kernel 1 ran
 * at 15.2); at 25..32 the 4-bit integer formats (zero points of a byte or
 * none) keep kernel 2 where its runs are 16 chunks or more (int4 m = 32:
 * 8192 -> 8192 24.5 / 26.2, 8192 -> 10240 29.8 / 34.0, 4096 -> 12288 23.2
 * / 26.0; 14336 -> 4096, runs of 14, 24.5 / 23.7). */
static int int_tc_auto(const nb_context *ctx, const nb_gemm_desc *g, const nbi_gemm_plan *p, int64_t tn) {
    const nbi_format_traits *t = nbi_traits(g->weight.format);
    if (g->m > 32) return 1;
    if (!(tn < ctx->info.sm_count && g->weight.k < 16384 && g->m >= NBI_INT_TC_MIN)) return 0;
    const int64_t runs = k2_runs(ctx, p);
    if (g->m <= 24) return runs < (nbi_is_table(t) ? 16 : 6);
    return !int4_family(t) || runs < 16; /* (only integer and table formats come here) */
}

/* Whether the tensor-core kernels (Hopper's and mma.sync) serve these
 * weights and activations: every E2M1 format, and the integer and table
 * formats of NBI_TC_FORMATS except integer weights with BF16 scales and FP16
 * activations, where the scale rounded to FP16 (tc_dequant.cuh) could
 * overflow: those keep the decode kernel, which applies the scale in FP32. */
static int tc_serves(const nb_gemm_desc *g, const nbi_format_traits *t) {
    if (t->every_kernel) return 1;
    return t->tensor_core && !(g->act_dtype == NB_DTYPE_F16 && g->weight.scale_type == NB_SCALE_BF16);
}

/* The tensor-core path (gemm_sm90.cu) on Hopper for batches past the decode
 * range: one launch for every m, weights read once per 128-row (tc_cwg:
 * 256-row) x bn-token tile.  Returns 1 when it takes the call (p filled).
 *
 * It also takes 25..32 tokens on layers of up to 1.25 128-row tiles per SM
 * (splitting k to fill the GPU where they are fewer than SMs): its time
 * does not grow with m below 64 while the decode kernels' does.  Measured
 * first on an H100 (2026-11-22, nvfp4, us, decode / tensor core): m = 32:
 * 8192 -> 8192 36.3 / 28.5, 28672 -> 8192 90.0 / 82.9, 4096 -> 4096 18.1 /
 * 12.0, 14336 -> 4096 43.1 / 25.8; 8192 -> 57344 (448 tiles) stays with
 * the decode kernels at every m <= 32.  At 17..24 tokens it took the
 * layers with fewer tiles than SMs and k < 16384; with the decode kernels
 * of 2026-11-28 it keeps only those where decode kernel 2 would run short
 * (below; H200, 2026-11-29). */
static int plan_tc(nb_context *ctx, const nb_gemm_desc *g, const nbi_request *rq, nbi_gemm_plan *p) {
    const nbi_format_traits *t = nbi_traits(p->fmt);
    if (!tc_serves(g, t)) return 0;
    const int can = nbi_cuda_has_sm90a() && ctx->info.cc_major == 9 && ctx->info.cc_minor == 0 && g->m <= INT32_MAX &&
                    ctx->info.smem_per_block_optin >= 227 * 1024;
    const int integer = !t->every_kernel; /* (32-, 64-, 128-, 256-token tiles, m >= NBI_INT_TC_MIN) */
    const int64_t tn = (p->row_blocks + 7) / 8; /* 128-row tiles */
    const int small_grid = tn < ctx->info.sm_count;
    /* (25..32 tokens also on layers of up to 1.25 tiles per SM: H200, nvfp4,
     * m = 28 / 32, us, decode kernel 2 / tensor core: 3584 -> 18944, 148
     * tiles, 38.8 / 31.2 and 39.6 / 31.3; 7168 -> 18432, 144 tiles, 56.4 /
     * 52.2 and 59.3 / 52.2; at 200-231 tiles the two are within 3%, at 448
     * (8192 -> 57344) the decode kernel is 20% ahead; NOTES.md) */
    const int mid_grid = 4 * tn <= 5 * (int64_t)ctx->info.sm_count;
    /* (17..24 tokens on small grids: only where decode kernel 2, one CTA
     * per SM over its 256-row tiles, would run fewer than 6 chunks each;
     * elsewhere it is ahead (H200, nvfp4, us at m = 20, kernel 2 / tensor
     * core: 8192 -> 8192 21.3 / 25.1, 8192 -> 10240 27.2 / 32.2, 4096 ->
     * 14336 21.3 / 24.6, 4096 -> 12288 20.9 / 24.8, 12288 -> 4096 18.7 /
     * 20.3, 4096 -> 6144 13.4 / 14.0; with runs of 4 the tensor core:
     * 4096 -> 4096 11.9 / 9.5, 3584 -> 4608 11.5 / 10.6; NOTES.md) */
    const int short_runs = k2_runs(ctx, p) < 6;
    /* (25..32 tokens: decode kernel 2 on its stream-K wave (k2_wave) where
     * the layer has a 256-row tile for every second SM, or 24 chunks per
     * SM (below), or its split grid where k2_one_wave_split takes one:
     * H200, nvfp4, m = 32, us,
     * tensor core / kernel 2: 7168 -> 18432
     * 52.0 / 45.9, 28672 -> 8192 81.7 / 73.6, 3584 -> 18944 31.3 / 30.7;
     * the tensor core on the rest: 8192 -> 8192 25.2 / 29.3, 14336 -> 4096
     * 23.1 / 34.1, 8192 -> 10240 32.3 / 32.0, and in between, 48-56 tiles,
     * 5120 -> 13824 30.2 / 31.3 (MXFP4 29.2 / 31.4), 4096 -> 14336 24.9 /
     * 24.7 (24.2 / 25.1), though 4096 -> 12288 24.9 / 22.8; NOTES.md) */
    /* (Long k on few tiles: 24 chunks per SM or more, not 40 (H200,
     * `nibble tune`, NVFP4 / MXFP4, us at m = 32, tensor core / the wave:
     * 27648 -> 5120, 20 tiles, 33 chunks per SM, 53.8 / 46.2 and 50.9 /
     * 45.1; 25600 -> 5120 50.6 / 43.9, 47.4 / 42.9; 20480 -> 5120, 24 a
     * SM, 41.3 / 37.2, 39.0 / 36.4; 28672 -> 4096 and 14336 -> 8192, 27 a
     * SM, 42.8 / 41.7, 40.2 / 40.6 and 40.2 / 39.4, 39.0 / 38.4; m = 25 and
     * 28 alike.  Under 24 the tensor core: 24576 -> 4096, 23 a SM, 37.3 /
     * 37.1, 35.1 / 36.1; 16384 -> 4096, 16 a SM, 26.1 / 28.2; 13824 ->
     * 5120 and 18944 -> 3584 within 2%; NOTES.md "Long k on few tiles").
     * From 33 tiles up to half the SMs likewise (H200, `nibble bench`, the
     * wave forced by a tuning cache against the tensor core, alternated
     * twice, m = 25 / 28 / 32, both formats: 12288 -> 12288, 48 tiles, 35
     * a SM, 0.69-0.72 of the tensor core's time; 9216 -> 12288 0.72-0.75;
     * 13824 -> 10240 0.87-0.90; 10240 -> 10240, 40 tiles, 24.2 a SM,
     * 0.90-0.93; 8192 -> 16384 and 7168 -> 16384, 64 tiles, 0.94-0.97;
     * NOTES.md "One wave of splits at 25..32 tokens") */
    const int64_t t2 = k2_tiles256(p);
    const int64_t sms = ctx->info.sm_count;
    const int k2_wave_ahead = (2 * t2 >= sms && t2 * p->kchunks >= 6 * sms) ||
                              t2 * p->kchunks >= 24 * sms ||
                              k2_one_wave_split(p, sms, 0); /* (kernel 2's split grid) */
    int use = can && (integer ? int_tc_auto(ctx, g, p, tn)
                              : g->m > 32 ||
                                    (g->m > 16 && g->m <= 24 && small_grid && g->weight.k < 16384 && short_runs) ||
                                    (g->m > 24 && mid_grid && !k2_wave_ahead));
    if (rq->path == NB_GEMM_PATH_DECODE || rq->path == NB_GEMM_PATH_MMA) use = 0;
    if (rq->path == NB_GEMM_PATH_TENSOR_CORE) use = can;
    if (!use) return 0;
    /* Tile width and k split: the pair with the least waves x time per CTA
     * plus the cost of summing the splits (tc_reduce_us).  A CTA of the 64-,
     * 128- and 256-token tiles costs 0.68, 0.80 and 1.16 us per k chunk plus
     * 3.5, 5 and 7 us of pipeline fill and epilogue (H100, nvfp4, unsplit
     * one-wave runs of 32 to 216 chunks on the layers of tc_reduce_us: within
     * 5% of each; two-wave runs measured up to 10% more; fitted before the
     * epilogue moved to shared memory, which took 1-13% off those calls).
     * The 192-token tile (E2M1 formats) 1.08 us and 6 us: 4096 -> 6144 at
     * m = 384, 96 tiles in one wave, 40.5 us (2026-11-27); it serves
     * 257..384 tokens in two tiles where 256-token tiles compute 512.
     * An unsplit grid's partial last wave may be split on its own
     * (tc_tail), or the whole grid may run on the stream-K grid
     * (tc_stream_k).  Narrow tiles win
     * while the wider ones leave SMs idle, wide ones once every SM has work
     * (m = 1024: 178 us with 256 tokens, 231 with 128 on 8192 -> 8192).  A k split fills the SMs the tiles
     * leave idle (m <= 256 on 8192-wide layers: 64 tiles of 128 rows for 132
     * SMs), never past one wave: the splits of a tile may form a cluster and
     * sum through their shared memory where all the tiles' clusters fit at
     * once (tc_clusters), or sum through the workspace within one CTA per SM
     * (which bounds the workspace: nbi_plan_workspace), whichever costs less.
     * The 16- and 32-token tiles serve batches that fit one of them (m <= 32
     * on narrow layers), charged as measured before this model: 0.67 / 0.69
     * us per chunk with 128-row tiles (8-12% under the 64-token tile:
     * 8192 -> 8192, m = 32, 2 splits, 25.9 against 28.2 us), 1.3 with
     * 256-row tiles (tc_cwg; 1.4 measured unsplit: 8192 -> 8192, m = 32, 91
     * us for 64 chunks), and 5% of the time per extra split. */
    const int *const widths = k_tc_widths;
    const double *const chunk_us = k_tc_chunk_us, *const fill_us = k_tc_fill_us;
    const int nwidths = integer ? 5 : 6; /* (integer: no 192-token tile, and no 16-token one: m >= 17) */
    int fb = 0; /* a requested tile width (one of widths[]) */
    for (int i = 0; i < 6; i++)
        if (rq->bn == widths[i]) fb = rq->bn;
    if (integer && (fb == 16 || fb == 192 || g->m < NBI_INT_TC_MIN)) return 0; /* (nbi_plan says why) */
    int bn = 64, splits = 1, cluster = 0, tail_splits = 0, sk = 0;
    double best = 0.0;
    for (int i = 0; i < nwidths; i++) {
        if (integer && widths[i] == 16) continue;
        if (fb ? fb != widths[i] : i >= 3 && i <= 4 && g->m > widths[i]) continue; /* 16, 32: one tile of tokens */
        const int cwg = tc_cwg(p, widths[i]);
        const int64_t tiles = tc_tiles_n(p, widths[i]) * ((g->m + widths[i] - 1) / widths[i]);
        for (int64_t s = 1; s <= NBI_SM90_MAX_SPLITS && s <= p->kchunks; s++) {
            if (rq->splits > 0 && s != rq->splits) continue; /* (one that cannot run: below) */
            int can_cl = 0, can_ws = 1;
            if (s > 1) {
                can_cl = tiles <= tc_clusters(ctx, p, widths[i], cwg, (int)s);
                can_ws = tiles <= NBI_MAX_SPLIT_COLUMNS && tiles * s <= ctx->info.sm_count;
                if (!can_cl && !can_ws) continue;
            }
            const int64_t cps = (p->kchunks + s - 1) / s;
            const double waves = (double)((tiles * s + ctx->info.sm_count - 1) / ctx->info.sm_count);
            double cost;
            int cl = 0, tail_s = 0, use_sk = 0;
            if (i == 3 || i == 4) { /* the 16- and 32-token tiles */
                cost = waves * (cwg == 4 ? 1.3 : chunk_us[i]) * (double)cps * (1.0 + 0.05 * (double)(s - 1));
                cl = can_cl && (!can_ws || tc_reduce_us((int)s, widths[i], cwg, 1) <
                                               tc_reduce_us((int)s, widths[i], cwg, 0));
            } else {
                const double ws = can_ws ? tc_reduce_us((int)s, widths[i], cwg, 0) : 1e30,
                             cs = can_cl ? tc_reduce_us((int)s, widths[i], cwg, 1) : 1e30;
                cl = cs < ws;
                cost = waves * (chunk_us[i] * (double)cps + fill_us[i]) + (cl ? cs : ws);
                if (s == 1) {
                    cost = tc_tail(ctx, p, tiles, chunk_us[i], fill_us[i], widths[i], cwg, cost, &tail_s);
                    const double skc = tc_stream_k(ctx, p, rq, tiles, widths[i], cwg, g->m);
                    const int forced = sk_forced(ctx, rq);
                    if (skc > 0.0 && (forced || skc < cost)) /* (forced: ahead of every other plan) */
                        cost = forced ? skc - 1e6 : skc, use_sk = 1, tail_s = 0;
                }
            }
            if (best == 0.0 || cost < best)
                best = cost, bn = widths[i], splits = (int)s, cluster = cl, tail_splits = tail_s, sk = use_sk;
        }
    }
    if (best == 0.0) { /* a requested split that cannot run: the largest that can, at or below it */
        nbi_request r2 = *rq;
        r2.splits = rq->splits > 1 ? rq->splits - 1 : 0;
        return plan_tc(ctx, g, &r2, p);
    }
    const int64_t tm = (g->m + bn - 1) / bn, tnb = tc_tiles_n(p, bn);
    if (tnb * tm > INT32_MAX / NBI_SM90_MAX_SPLITS) return 0;
    set_splits(p, splits);
    p->path = NBI_PATH_SM90;
    p->m = g->m;
    p->mt = 0;
    p->bn = bn;
    p->cwg = tc_cwg(p, bn);
    p->tiles_n = (int)tnb;
    p->tiles_m = (int)tm;
    p->raster_group = rq->raster > 0 ? rq->raster : 16;
    p->grid_x = (int)(tnb * tm);
    /* set_splits may merge splits (k chunks spread evenly): the cluster is the split count it gives */
    p->cluster = p->splits > 1 && cluster && tnb * tm <= tc_clusters(ctx, p, bn, p->cwg, p->splits);
    if (p->splits > 1 && !p->cluster) {
        p->ws_counter_bytes = NBI_MAX_SPLIT_COLUMNS * sizeof(int);
        p->ws_partial_bytes = tc_partial_bytes(p->splits, tnb * tm, p->cwg, bn);
    }
    p->tail_tiles = p->tail_splits = p->tail_cps = 0;
    p->sk = 0;
    if (sk && p->splits == 1) { /* grid_x CTAs, a partial slot each (gemm_sm90.cu, sm90_sk_leave) */
        p->sk = 1;
        p->grid_x = ctx->info.sm_count;
        p->ws_counter_bytes = NBI_MAX_SPLIT_COLUMNS * sizeof(int);
        p->ws_partial_bytes = tc_partial_bytes(1, p->grid_x, p->cwg, bn);
    } else if (p->splits == 1 && tail_splits > 1) {
        p->tail_tiles = (int)(tnb * tm % ctx->info.sm_count);
        even_split(p->kchunks, tail_splits, &p->tail_splits, &p->tail_cps); /* (no empty split) */
        p->ws_counter_bytes = NBI_MAX_SPLIT_COLUMNS * sizeof(int);
        p->ws_partial_bytes = tc_partial_bytes(p->tail_splits, p->tail_tiles, p->cwg, bn);
    }
    return 1;
}

/* ------------------------------------------------- mma.sync kernel */

/* The mma.sync tensor-core path (gemm_sm80.cu) for batches past the decode
 * range where the Hopper kernel does not run: compute capability 8.x (A100,
 * A10/A40, L40S, RTX 30/40) and 9.x without it (a build without sm_90a).
 * A request for path mma runs it on any GPU from compute capability 8.0,
 * Hopper included (that is how it is tested), for every m.  Returns 1 when
 * it takes the call (p filled). */
static int plan_mma(const nb_context *ctx, const nb_gemm_desc *g, const nbi_request *rq, nbi_gemm_plan *p) {
    const int cc = ctx->info.cc_major;
    if (!tc_serves(g, nbi_traits(p->fmt))) return 0;
    int use = (cc == 8 || cc == 9) && g->m > 32;
    if (rq->path == NB_GEMM_PATH_DECODE || rq->path == NB_GEMM_PATH_TENSOR_CORE) use = 0;
    if (rq->path == NB_GEMM_PATH_MMA) use = cc >= 8;
    if (!use || g->m > INT32_MAX - 256) return 0;
    /* Tile width: the one with the least waves x time per k chunk.  Time per
     * chunk predicted for an A100 (gemm_sm80.cu, DESIGN.md; to be replaced by
     * measurements): 0.95 us for 64 tokens (shared-memory bound: 2.5 cycles
     * per MMA where the tensor cores need 2), 1.7 us for 128 (tensor-bound,
     * at about 85%). */
    const int64_t tn = (p->row_blocks + 7) / 8;
    static const int widths[2] = {64, 128};
    static const double chunk_us[2] = {0.95, 1.7};
    int bn = 64;
    double best = 0.0;
    for (int i = 0; i < 2; i++) {
        const int64_t tiles = tn * ((g->m + widths[i] - 1) / widths[i]);
        const double cost = (double)((tiles + ctx->info.sm_count - 1) / ctx->info.sm_count) * chunk_us[i];
        if (i == 0 || cost < best) best = cost, bn = widths[i];
    }
    if (rq->bn == 64 || rq->bn == 128) bn = rq->bn;
    /* the deepest pipeline whose shared memory fits (a requested depth if it
     * fits); the narrow tile when the wide one fits no depth */
    const size_t limit = ctx->info.smem_per_block_optin;
    const int want = rq->stages == 2 || rq->stages == 3 ? rq->stages : 0;
    size_t smem = 0;
    int stages = nbi_cuda_gemm_sm80_stages(p->fmt, p->group, bn, want, limit, &smem);
    if (!stages) stages = nbi_cuda_gemm_sm80_stages(p->fmt, p->group, bn, 0, limit, &smem);
    if (!stages && bn == 128) stages = nbi_cuda_gemm_sm80_stages(p->fmt, p->group, bn = 64, 0, limit, &smem);
    const int64_t tm = (g->m + bn - 1) / bn;
    if (!stages || tn * tm > INT32_MAX) return 0;
    p->path = NBI_PATH_SM80;
    p->m = g->m;
    p->mt = 0;
    p->bn = bn;
    p->stages = stages;
    p->tiles_n = (int)tn;
    p->tiles_m = (int)tm;
    /* a group wider than the tile grid walks it the same way (and keeps
     * group x tiles_m within an int) */
    p->raster_group = rq->raster > 0 ? rq->raster : 16;
    if (p->raster_group > p->tiles_n) p->raster_group = p->tiles_n;
    p->splits = 1;
    p->grid_x = (int)(tn * tm);
    return 1;
}

/* ----------------------------------------------------------- the plan */

/* The epilogue's exponent offset and the scale table's shift: every
 * dequantized product v * s * 2^-c must be exact in 16 bits (gemv_fp4.cu
 * "DEQUANTIZATION"), so c depends on the scale type, the activation dtype
 * and, for power-of-two scales, the range the weight's scales span. */
static nb_status plan_scales(nb_context *ctx, const nb_gemm_desc *g, const nbi_format_traits *t, nbi_gemm_plan *p) {
    const nb_weight_desc *d = &g->weight;
    const int bf16 = g->act_dtype == NB_DTYPE_BF16;
    switch (t->element == NB_ELEMENT_E2M1 ? t->scale_type : d->scale_type) {
    case NB_SCALE_E4M3:
        p->exp_shift = bf16 ? 7 : 8;
        p->table_shift = bf16 ? 119 : 6;
        break;
    case NB_SCALE_E8M0: {
        int emin = d->scale_exp_min, emax = d->scale_exp_max;
        if (emax < 0) emin = emax = 127; /* every scale is NaN: any offset works */
        const int span = emax - emin, limit = bf16 ? 125 : 24;
        if (emin < 0 || emax > 254 || span < 0)
            return nbi_fail(ctx, NB_ERR_INVALID_ARGUMENT, "nb_gemm: %s scale range [%d, %d] is not set; pack the "
                            "weight with nb_pack or nb_pack_host", t->name, emin, emax);
        if (span > limit)
            return nbi_fail(ctx, NB_ERR_UNSUPPORTED, "nb_gemm: %s scale exponents span %d binades (bytes %d..%d); "
                            "%s activations are exact only up to %d%s", t->name, span, emin, emax,
                            nbi_dtype_name(g->act_dtype), limit, bf16 ? "" : ": use BF16 activations");
        p->exp_shift = bf16 ? emax - 127 : emax - 128;
        p->table_shift = bf16 ? 253 - emax : 142 - emax;
        break;
    }
    case NB_SCALE_F16:
    case NB_SCALE_BF16:
        /* The integer formats (gemv_fp4.cu "INTEGER FORMATS"): the scale is
         * applied in FP32 and needs no table.  The MMA operand q - z is
         * exact when 128 + z is (BF16: z <= 127; FP16 1024 + z always). */
        if (t->zero_point == NB_ZERO_U8 && bf16 && d->scale_exp_max < 0)
            return nbi_fail(ctx, NB_ERR_INVALID_ARGUMENT, "nb_gemm: %s zero-point range is not set; pack the weight "
                            "with nb_pack_v2 or nb_pack_host_v2", t->name);
        if (t->zero_point == NB_ZERO_U8 && bf16 && d->scale_exp_max > 127)
            return nbi_fail(ctx, NB_ERR_UNSUPPORTED, "nb_gemm: %s zero points up to %d: BF16 activations take zero "
                            "points up to 127 (use FP16 activations)", t->name, (int)d->scale_exp_max);
        p->exp_shift = 0;
        p->table_shift = 0;
        p->tensor_scale = d->tensor_scale;
        return NB_OK;
    case NB_SCALE_F32:
        /* The table formats (gemv_fp4.cu "TABLE FORMATS"): the absmax is
         * applied in FP32; the MMA operands are the table values rounded to
         * the activation dtype, passed as byte planes in the first words of
         * the scale table. */
        nbi_table_planes(t->element, (nb_dtype)p->act, p->scale_table);
        p->exp_shift = 0;
        p->table_shift = 0;
        p->tensor_scale = d->tensor_scale;
        return NB_OK;
    }
    p->tensor_scale = d->tensor_scale;
    /* The 256-entry table scale byte -> 16-bit adjusted scale, cached per
     * context (one shift per dtype for E4M3 scales, one per emax for E8M0). */
    int *cached = &ctx->table_shift[t->index][p->act];
    uint32_t *table = ctx->table[t->index][p->act];
    if (*cached != p->table_shift) {
        uint16_t h[256];
        for (int b = 0; b < 256; b++) {
            const float v = ldexpf(nbi_scale(t->scale_type, (uint8_t)b), p->table_shift);
            h[b] = bf16 ? nbi_f32_to_bf16(v) : nbi_f32_to_f16(v);
        }
        for (int i = 0; i < 128; i++) table[i] = (uint32_t)h[2 * i] | ((uint32_t)h[2 * i + 1] << 16);
        *cached = p->table_shift;
    }
    memcpy(p->scale_table, table, sizeof p->scale_table);
    return NB_OK;
}

static const char *path_name(int path) {
    return path == NB_GEMM_PATH_DECODE ? "decode" : path == NB_GEMM_PATH_TENSOR_CORE ? "tc" : "mma";
}

nb_status nbi_plan(nb_context *ctx, const nb_gemm_desc *g, const nbi_request *rq, nbi_gemm_plan *p) {
    static const nbi_request heuristic;
    if (!rq) rq = &heuristic;
    nb_status st = nbi_check_gemm(ctx, g, NB_LAYOUT_PACKED, false);
    if (st) return st;
    const nb_weight_desc *d = &g->weight;
    const nbi_format_traits *t = nbi_traits(d->format);
    if (!t->kernels)
        return nbi_fail(ctx, NB_ERR_UNSUPPORTED, "nb_gemm: no GPU kernel serves %s weights", t->name);
    memset(p, 0, sizeof *p);
    p->fmt = d->format;
    p->act = g->act_dtype;
    p->m = g->m < 32 ? g->m : 32; /* per launch; nb_gemm slices larger m */
    p->mt = (int)((p->m + 7) / 8);
    p->n = d->n;
    p->k = d->k;
    p->lda = g->lda ? g->lda : d->k;
    p->ldc = g->ldc ? g->ldc : d->n;
    if (p->lda % 8)
        return nbi_fail(ctx, NB_ERR_MISALIGNED, "nb_gemm: lda = %lld must be a multiple of 8 (16-byte rows)",
                        (long long)p->lda);
    p->group = nbi_kernel_group(d);
    p->chunk_bytes = (int)nbi_packed_chunk_bytes(d);
    p->scale_bf16 = d->scale_type == NB_SCALE_BF16;
    if (!t->every_kernel) { /* the decode kernels (NBI_DECODE_FORMATS), and for some the tensor-core kernels */
        const int tc = rq->path == NB_GEMM_PATH_TENSOR_CORE, mma = rq->path == NB_GEMM_PATH_MMA;
        if ((tc || mma) && !t->tensor_core)
            return nbi_fail(ctx, NB_ERR_UNSUPPORTED, "nb_gemm: %s weights run on the decode kernels only (path "
                            "decode), not %s", t->name, path_name(rq->path));
        if (rq->variant == 2 && rq->rpw == 1)
            return nbi_fail(ctx, NB_ERR_UNSUPPORTED, "nb_gemm: %s weights run the staged decode variant with rpw = 2 "
                            "only, not 1", t->name);
        if ((tc || mma) && !tc_serves(g, t))
            return nbi_fail(ctx, NB_ERR_UNSUPPORTED, "nb_gemm: %s with BF16 scales and FP16 activations runs on the "
                            "decode kernel only (a BF16 scale rounded to FP16 could overflow)", t->name);
        if (tc && (g->m < NBI_INT_TC_MIN || rq->bn == 16 || rq->bn == 192))
            return nbi_fail(ctx, NB_ERR_UNSUPPORTED, "nb_gemm: %s takes path tc for m >= %d with 32-, 64-, 128- or 256-token "
                            "tiles (m = %lld, bn = %d)", t->name, NBI_INT_TC_MIN, (long long)g->m, (int)rq->bn);
        if (d->k % 8)
            return nbi_fail(ctx, NB_ERR_UNSUPPORTED, "nb_gemm: %s with k = %lld: the decode kernel reads activations "
                            "in pieces of 8 and needs k a multiple of 8", t->name, (long long)d->k);
    }
    if ((st = plan_scales(ctx, g, t, p))) return st;
    p->pdl = ctx->info.cc_major >= 9 && ctx->env_pdl != 1; /* NIBBLE_PDL=0: without (nibble.h, "tuning") */
    p->pdl_own = p->pdl;
    p->row_blocks = (d->n + 15) / 16;
    p->kchunks = (d->k + NBI_CHUNK_K - 1) / NBI_CHUNK_K;
    if (plan_tc(ctx, g, rq, p) || plan_mma(ctx, g, rq, p)) {
        if (rq->sk == 1 && !p->sk)
            return nbi_fail(ctx, NB_ERR_UNSUPPORTED, "nb_gemm: stream_k = 1 does not run %s %lld -> %lld at m = %lld%s: "
                            "the stream-K grid takes the 64-token tile at 33..64 tokens, the 128-token tile from 65, "
                            "the 256-token tile from 256, at most %d tiles, two or more k chunks per CTA, activations "
                            "within 60%% of the L2 and no k split%s", t->name, (long long)d->k, (long long)d->n,
                            (long long)g->m, rq->bn ? " with that tile" : "", NBI_MAX_SPLIT_COLUMNS,
                            ctx->env_sk == 0 ? " (and NIBBLE_SM90_SK=0 refuses it)" : "");
        return NB_OK;
    }
    if (rq->path == NB_GEMM_PATH_TENSOR_CORE || rq->path == NB_GEMM_PATH_MMA)
        return nbi_fail(ctx, NB_ERR_UNSUPPORTED, "nb_gemm: path %s cannot run on %s (compute capability %d.%d%s)",
                        path_name(rq->path), ctx->info.name, ctx->info.cc_major, ctx->info.cc_minor,
                        rq->path == NB_GEMM_PATH_TENSOR_CORE && !nbi_cuda_has_sm90a() ? ", a build without sm_90a" : "");
    if ((st = plan_decode(ctx, rq, p))) return st;
    if (rq->variant == 2 && !p->xsh)
        return nbi_fail(ctx, NB_ERR_UNSUPPORTED, "nb_gemm: the staged decode kernel does not fit the shared memory "
                        "of %s at m = %lld", ctx->info.name, (long long)g->m);
    if (rq->warps && (!p->xsh || p->warps != rq->warps))
        return nbi_fail(ctx, NB_ERR_UNSUPPORTED, "nb_gemm: warps = %d does not run %s %lld -> %lld at m = %lld: the "
                        "12-warp instance is kernel 2 on one stream-K wave (E2M1 formats, rpw 2, 17..24 tokens, no k "
                        "split, at least 6 chunks of 256-row tiles per SM, and its shared memory); with rpw 4 the "
                        "wave takes 8 warps at 17..24 tokens and 7 at 25..32", rq->warps,
                        t->name, (long long)d->k, (long long)d->n, (long long)g->m);
    if (rq->rpw == 4 && p->rpw != 4)
        return nbi_fail(ctx, NB_ERR_UNSUPPORTED, "nb_gemm: rpw = 4 does not run %s %lld -> %lld at m = %lld: four "
                        "row blocks per warp are kernel 2 on one stream-K wave (E2M1 formats, 17..32 tokens, no k "
                        "split, at least 6 chunks of 256-row tiles per SM, and its shared memory) with 8 warps at "
                        "17..24 tokens and 7 at 25..32", t->name,
                        (long long)d->k, (long long)d->n, (long long)g->m);
    return NB_OK;
}

/* The most workspace the tensor-core path takes for any m: splits x tiles
 * stays within one CTA per SM, each 128 x 256 FP32 partials at most (the
 * 256-row tiles hold 16 or 32 tokens). */
size_t nbi_plan_workspace(const nb_context *ctx, const nbi_gemm_plan *p) {
    if (p->path == NBI_PATH_SM90)
        return NBI_MAX_SPLIT_COLUMNS * sizeof(int) + (size_t)ctx->info.sm_count * 128 * 256 * sizeof(float);
    return p->ws_partial_bytes + p->ws_counter_bytes;
}

/* ------------------------------------------------------ configurations */

nb_gemm_config nbi_config_of(const nbi_gemm_plan *p) {
    nb_gemm_config c;
    memset(&c, 0, sizeof c);
    if (p->path == NBI_PATH_SM90 || p->path == NBI_PATH_SM80) {
        c.path = p->path == NBI_PATH_SM80 ? NB_GEMM_PATH_MMA : NB_GEMM_PATH_TENSOR_CORE;
        c.bn = p->bn;
        c.raster = p->raster_group;
        c.splits = p->splits;
        if (p->path == NBI_PATH_SM90) c.stream_k = p->sk ? 1 : -1; /* (what ran: a tuning entry repeats it) */
    } else {
        c.path = NB_GEMM_PATH_DECODE;
        c.kw = p->kw;
        c.splits = p->splits;
        c.variant = p->xsh ? 1 : 0;
        c.rpw = p->xsh ? (p->rpw ? p->rpw : 1) : 0; /* (a planner that leaves it 0 runs one) */
        c.warps = p->xsh ? p->warps : 0;
    }
    return c;
}

/* `v` is 0 (open, when the configuration may be partial) or one of `ok`. */
static int one_of(int v, const int *ok, int n, int open) {
    if (open && v == 0) return 1;
    for (int i = 0; i < n; i++)
        if (v == ok[i]) return 1;
    return 0;
}

int nbi_config_check(const nb_gemm_config *c, int64_t m_lo, int complete, char *why, size_t wn) {
    const int open = !complete;
    for (int i = 0; i < 2; i++)
        if (c->reserved[i]) return snprintf(why, wn, "reserved[%d] = %d must be 0", i, (int)c->reserved[i]), 0;
    if (c->stream_k && c->path != NB_GEMM_PATH_TENSOR_CORE)
        return snprintf(why, wn, "stream_k = %d is for path tc only", (int)c->stream_k), 0;
    if (c->stream_k < -1 || c->stream_k > 1)
        return snprintf(why, wn, "stream_k = %d is not 1 (the stream-K grid), -1 (whole tiles) or 0 (the planner's "
                        "choice)", (int)c->stream_k), 0;
    if (c->stream_k == 1 && c->splits > 1)
        return snprintf(why, wn, "stream_k = 1 takes no k split (splits = %d)", (int)c->splits), 0;
    if (c->warps && (c->path != NB_GEMM_PATH_DECODE || c->variant != 1))
        return snprintf(why, wn, "warps = %d is for the staged decode variant only", (int)c->warps), 0;
    if (c->path == NB_GEMM_PATH_DECODE) {
        static const int kws[4] = {1, 2, 4, 8}, rpws[3] = {1, 2, 4};
        if (!one_of(c->kw, kws, 4, open)) return snprintf(why, wn, "kw = %d is not 1, 2, 4 or 8", (int)c->kw), 0;
        if (!(c->splits >= 1 && c->splits <= 64) && !(open && c->splits == 0))
            return snprintf(why, wn, "splits = %d is not in 1..64", (int)c->splits), 0;
        if (c->variant != 0 && c->variant != 1)
            return snprintf(why, wn, "variant = %d is not 0 (plain) or 1 (staged)", (int)c->variant), 0;
        if (c->variant == 1 && c->kw != 1 && !(open && c->kw == 0))
            return snprintf(why, wn, "the staged variant needs kw = 1, not %d", (int)c->kw), 0;
        if (c->variant == 1 && !one_of(c->rpw, rpws, 3, open))
            return snprintf(why, wn, "rpw = %d is not 1, 2 or 4 (the staged variant's row blocks per warp)", (int)c->rpw), 0;
        if (c->variant == 0 && c->rpw) return snprintf(why, wn, "rpw = %d is for the staged variant only", (int)c->rpw), 0;
        if (c->warps && c->warps != NBI_GEMV_WARPS && c->warps != NBI_GEMV_WIDE_WARPS && c->warps != NBI_GEMV_RPW4_WARPS)
            return snprintf(why, wn, "warps = %d is not %d, %d or %d (0: the planner's choice)", (int)c->warps,
                            NBI_GEMV_RPW4_WARPS, NBI_GEMV_WARPS, NBI_GEMV_WIDE_WARPS), 0;
        if (c->warps == NBI_GEMV_WIDE_WARPS && m_lo > 0 && m_lo < 17)
            return snprintf(why, wn, "warps = %d needs m >= 17", (int)c->warps), 0;
        if (c->warps == NBI_GEMV_WIDE_WARPS && (c->rpw == 1 || c->rpw == 4))
            return snprintf(why, wn, "warps = %d needs rpw = 2", (int)c->warps), 0;
        if (c->warps == NBI_GEMV_RPW4_WARPS && c->rpw != 4 && !(open && c->rpw == 0))
            return snprintf(why, wn, "warps = %d needs rpw = 4", (int)c->warps), 0;
        if (c->rpw == 4 && m_lo > 0 && m_lo < 17) return snprintf(why, wn, "rpw = 4 needs m >= 17"), 0;
        if (c->rpw == 4 && c->splits > 1)
            return snprintf(why, wn, "rpw = 4 takes no k split (splits = %d)", (int)c->splits), 0;
        if (c->bn || c->raster || c->stages) return snprintf(why, wn, "bn, raster and stages are for paths tc and mma, not decode"), 0;
        return 1;
    }
    if (c->path == NB_GEMM_PATH_TENSOR_CORE || c->path == NB_GEMM_PATH_MMA) {
        const int mma = c->path == NB_GEMM_PATH_MMA;
        static const int bns[6] = {64, 128, 256, 16, 32, 192}, depths[2] = {2, 3};
        if (!one_of(c->bn, bns, mma ? 2 : 6, open))
            return snprintf(why, wn, "bn = %d is not 64, 128%s", (int)c->bn, mma ? " (path mma)" : ", 192, 256, 16 or 32"),
                   0;
        if (!(c->raster >= 1 && c->raster <= 1024) && !(open && c->raster == 0))
            return snprintf(why, wn, "raster = %d is not in 1..1024", (int)c->raster), 0;
        if (c->splits < 0 || c->splits > (mma ? 1 : NBI_SM90_MAX_SPLITS)) /* 0: read as 1 (caches from before the tc split) */
            return snprintf(why, wn, "splits = %d is not in 1..%d (path %s)", (int)c->splits,
                            mma ? 1 : NBI_SM90_MAX_SPLITS, mma ? "mma" : "tc"), 0;
        if (c->stages && (!mma || !one_of(c->stages, depths, 2, 0)))
            return snprintf(why, wn, "stages = %d: %s", (int)c->stages, mma ? "not 2 or 3" : "path tc has no stages"), 0;
        if (c->kw || c->variant || c->rpw)
            return snprintf(why, wn, "kw, variant and rpw are for path decode, not %s", mma ? "mma" : "tc"), 0;
        return 1;
    }
    return snprintf(why, wn, "path = %d is not %d (decode), %d (tc) or %d (mma)", (int)c->path, NB_GEMM_PATH_DECODE,
                    NB_GEMM_PATH_TENSOR_CORE, NB_GEMM_PATH_MMA), 0;
}

/* The configurations `nibble tune` tries, one row per kernel and parameter
 * sweep: a new decode variant or tile is a new row.  Each row is tried for
 * m_min <= m <= m_max (decode rows stop at 64 where a tensor-core path
 * exists: past that it is the faster path and the decode kernel runs once
 * per 32 rows), over every combination of its non-empty lists (0-ended).
 * The mma row applies where the heuristic itself may choose that path (GPUs
 * without the Hopper kernel); on Hopper it runs only when requested.  The
 * tensor-core rows try each tile without a k split both on whole tiles and
 * on the stream-K grid (stream_k -1 and 1; the grid where it can run).
 * Kept small: about 50 candidates at most, so that tuning 5 layers x 8 m
 * takes minutes. */
static const struct cand_row {
    int path, variant;
    int64_t m_min, m_max;
    int kw[5], rpw[3], splits[7], bn[6], raster[5], warps[3], sk[3];
} k_rows[] = {
    {NB_GEMM_PATH_DECODE, 0, 1, 64, {1, 2, 4, 8}, {0}, {1, 2, 4, 8, 16}, {0}, {0}, {0}, {0}},
    {NB_GEMM_PATH_DECODE, 1, 1, 64, {1}, {1, 2}, {1, 2, 4, 8, 16}, {0}, {0}, {0}, {0}},
    /* kernel 2 on the stream-K wave with either instance (k2_wave), and with four row blocks per warp (k2_rpw4) */
    {NB_GEMM_PATH_DECODE, 1, 17, 32, {1}, {2}, {1}, {0}, {0}, {NBI_GEMV_WARPS, NBI_GEMV_WIDE_WARPS}, {0}},
    {NB_GEMM_PATH_DECODE, 1, 17, 32, {1}, {4}, {1}, {0}, {0}, {0}, {0}},
    {NB_GEMM_PATH_TENSOR_CORE, 0, 9, 32, {0}, {0}, {1, 2, 3, 4}, {16, 32, 64}, {16}, {0}, {-1}},
    {NB_GEMM_PATH_TENSOR_CORE, 0, 33, INT64_MAX, {0}, {0}, {1, 2, 3, 4}, {64, 128, 256}, {16, 4, 8, 32}, {0}, {-1, 1}},
    {NB_GEMM_PATH_MMA, 0, 17, INT64_MAX, {0}, {0}, {1}, {64, 128}, {16, 4, 8, 32}, {0}, {0}},
};
#define MAX_CANDS 64

static int list_len(const int *v, int cap) {
    int n = 0;
    while (n < cap && v[n]) n++;
    return n ? n : 1; /* an empty list is the single value 0 */
}

/* Equal as far as the kernel can tell: a raster group wider than the tile
 * grid, or any group when there is one m tile, walks the tiles the same way. */
static int same_run(const nb_gemm_config *a, const nb_gemm_config *b, const nbi_gemm_plan *pb) {
    if (a->path != b->path) return 0;
    if (a->path == NB_GEMM_PATH_DECODE)
        return a->kw == b->kw && a->splits == b->splits && a->variant == b->variant && a->rpw == b->rpw &&
               a->warps == b->warps;
    if (a->bn != b->bn || a->splits != b->splits || a->stream_k != b->stream_k) return 0;
    if (pb->tiles_m == 1) return 1;
    const int ra = a->raster < pb->tiles_n ? a->raster : pb->tiles_n, rb = b->raster < pb->tiles_n ? b->raster : pb->tiles_n;
    return ra == rb;
}

nb_status nb_gemm_list_configs(nb_context *ctx, const nb_gemm_desc *g, nb_gemm_config *configs, size_t max,
                               size_t *count) {
    if (ctx && (!count || (!configs && max)))
        return nbi_fail(ctx, NB_ERR_NULL_POINTER, "nb_gemm_list_configs: count (and configs when max > 0) must not be NULL");
    nb_status st = nbi_need_device(ctx, "nb_gemm_list_configs");
    if (st) return st;
    nb_gemm_config c[MAX_CANDS];
    nbi_gemm_plan p, tc;
    if ((st = nbi_plan(ctx, g, NULL, &p))) return st;
    int n = 0;
    c[n++] = nbi_config_of(&p);
    const nbi_request tc_only = {.path = NB_GEMM_PATH_TENSOR_CORE}, mma_only = {.path = NB_GEMM_PATH_MMA};
    const int tc_ok = nbi_plan(ctx, g, &tc_only, &tc) == NB_OK;
    const int mma_ok = !tc_ok && nbi_plan(ctx, g, &mma_only, &tc) == NB_OK;
    const int sms = ctx->info.sm_count;
    for (size_t r = 0; r < sizeof k_rows / sizeof k_rows[0]; r++) {
        const struct cand_row *row = &k_rows[r];
        const int fast = row->path == NB_GEMM_PATH_TENSOR_CORE || row->path == NB_GEMM_PATH_MMA;
        if (g->m < row->m_min || (row->path == NB_GEMM_PATH_TENSOR_CORE && !tc_ok) ||
            (row->path == NB_GEMM_PATH_MMA && !mma_ok))
            continue;
        if (g->m > row->m_max && (fast || tc_ok || mma_ok)) continue;
        const int nkw = list_len(row->kw, 5), nrpw = list_len(row->rpw, 3), ns = list_len(row->splits, 7),
                  nbn = list_len(row->bn, 6), nr = list_len(row->raster, 5), nwp = list_len(row->warps, 3),
                  nsk = list_len(row->sk, 3);
        for (int a = 0; a < nkw; a++)
            for (int b = 0; b < nrpw; b++)
                for (int s = 0; s < ns; s++)
                    for (int w = 0; w < nbn; w++)
                        for (int q = 0; q < nr * nwp * nsk; q++) {
                            nb_gemm_config want;
                            memset(&want, 0, sizeof want);
                            want.path = row->path;
                            want.variant = row->variant;
                            want.kw = row->kw[a], want.rpw = row->rpw[b], want.splits = row->splits[s];
                            want.bn = row->bn[w], want.raster = row->raster[q % nr];
                            want.warps = row->warps[q / nr % nwp], want.stream_k = row->sk[q / (nr * nwp)];
                            if (want.stream_k == 1 && want.splits > 1) continue; /* (no split on the grid) */
                            /* a tile at most half empty */
                            if (want.bn > 64 && want.bn >= 2 * g->m) continue;
                            const nbi_request rq = nbi_request_of(&want);
                            if (nbi_plan(ctx, g, &rq, &p) != NB_OK) continue;
                            const nb_gemm_config got = nbi_config_of(&p);
                            /* a global split only while the grid is small: past a few CTAs
                             * per SM it only adds the workspace round trip */
                            if (got.path == NB_GEMM_PATH_DECODE && got.splits > 1 &&
                                (int64_t)p.grid_x * got.splits > 4 * (int64_t)sms)
                                continue;
                            int dup = 0;
                            for (int i = 0; i < n && !dup; i++) dup = same_run(&c[i], &got, &p);
                            if (!dup && n < MAX_CANDS) c[n++] = got;
                        }
    }
    *count = (size_t)n;
    for (int i = 0; i < n && (size_t)i < max; i++) configs[i] = c[i];
    return NB_OK;
}
