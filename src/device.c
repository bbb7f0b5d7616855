/* device.c - device entry points: validation, the gemm plan (kernel choice,
 * split-K, workspace) and the calls into the CUDA launchers. */
#include "internal.h"

#include <math.h>
#include <stdio.h>
#include <string.h>

static nb_status need_device(nb_context *ctx, const char *fn) {
    if (!ctx) return nbi_fail(NULL, NB_ERR_NULL_POINTER, "%s: ctx is NULL", fn);
    if (!nbi_cuda_available())
        return nbi_fail(ctx, NB_ERR_NO_DEVICE, "%s: libnibble was built without CUDA", fn);
    if (!ctx->has_device)
        return nbi_fail(ctx, NB_ERR_NO_DEVICE, "%s: the context is host-only (created with NB_DEVICE_NONE)", fn);
    return NB_OK;
}

static nb_status cuda_failed(nb_context *ctx, const char *fn, const char *err) {
    return nbi_fail(ctx, NB_ERR_CUDA, "%s: %s", fn, err);
}

nb_status nb_dequantize(nb_context *ctx, const nb_weight_desc *desc, const uint8_t *codes, const uint8_t *scales,
                        nb_dtype dst_dtype, void *dst, void *stream) {
    nb_status st = need_device(ctx, "nb_dequantize");
    if (st) return st;
    if ((st = nbi_check_desc(ctx, desc, NB_LAYOUT_CHECKPOINT))) return st;
    if (!codes || !scales || !dst)
        return nbi_fail(ctx, NB_ERR_NULL_POINTER, "nb_dequantize: codes, scales and dst must not be NULL");
    if (!nbi_dtype_size(dst_dtype))
        return nbi_fail(ctx, NB_ERR_UNSUPPORTED, "nb_dequantize: unknown destination dtype %d", (int)dst_dtype);
    char err[NB_ERRBUF] = "";
    if (nbi_cuda_dequantize(desc, codes, scales, dst_dtype, dst, stream, err))
        return cuda_failed(ctx, "nb_dequantize", err);
    return NB_OK;
}

nb_status nb_pack(nb_context *ctx, nb_weight_desc *desc, const uint8_t *codes, const uint8_t *scales, void *packed,
                  size_t packed_bytes, void *stream) {
    nb_status st = need_device(ctx, "nb_pack");
    if (st) return st;
    if ((st = nbi_check_desc(ctx, desc, NB_LAYOUT_CHECKPOINT))) return st;
    if (!codes || !scales || !packed)
        return nbi_fail(ctx, NB_ERR_NULL_POINTER, "nb_pack: codes, scales and packed must not be NULL");
    if ((uintptr_t)packed % 16)
        return nbi_fail(ctx, NB_ERR_MISALIGNED, "nb_pack: packed must be 16-byte aligned");
    nb_weight_sizes sz;
    if ((st = nbi_packed_size(ctx, desc, packed_bytes, &sz, "nb_pack"))) return st;
    char err[NB_ERRBUF] = "";
    int32_t emin = -1, emax = -1;
    if (nbi_cuda_pack(desc, codes, scales, packed, &emin, &emax, stream, err)) return cuda_failed(ctx, "nb_pack", err);
    desc->layout = NB_LAYOUT_PACKED;
    if (desc->format == NB_FORMAT_MXFP4) {
        desc->scale_exp_min = emin;
        desc->scale_exp_max = emax;
    }
    return NB_OK;
}

/* Split the plan's k chunks about s ways (s >= 1) so that every split gets
 * work: as many splits as ceil(kchunks / s) chunks each need, then the
 * chunks spread evenly over them. */
static void set_splits(nbi_gemm_plan *p, int64_t s) {
    const int64_t cps = (p->kchunks + s - 1) / s;
    p->splits = (int)((p->kchunks + cps - 1) / cps);
    p->chunks_per_split = (int)((p->kchunks + p->splits - 1) / p->splits);
}

/* Spread the work so the GPU fills.
 *
 * Kernel 1 (per-warp streams; every m = 1..8, and 9..32 where kernel 2
 * does not fit): kw warps of a CTA share one row block and split its k
 * range (summed in shared memory, cheap); `splits` CTAs share a row block
 * along k (summed through the workspace by the last CTA, which costs a
 * global round trip).  Measured on an H100 (bench/RESULTS.md, sweep of kw x
 * splits on five Llama layers, m = 1 and 16): a global split never paid
 * once the grid had about one CTA per SM, kw = 4 was best or within 3%
 * everywhere, and kw = 8 won when kw = 4 left fewer than about 1.4 CTAs per
 * SM.
 *
 * Kernel 2 (staged activations, 9..32 tokens, and 8 on wide layers): the
 * CTA's 8 warps walk one k range (kw = 1) and each owns rpw row blocks, so
 * a CTA covers 8 * rpw row blocks; narrow layers are split along k until
 * one resident wave of CTAs fills the GPU (the partial sums stay in L2).
 *
 * NIBBLE_KW, NIBBLE_SPLITS, NIBBLE_XS and NIBBLE_RPW override the rules for
 * tuning. */
static int64_t choose_split(const nb_context *ctx, nbi_gemm_plan *p, int warps) {
    const int sms = ctx->info.sm_count;
    /* kernel 2 at 8 tokens too, on layers wide enough for no k split (below) */
    int xs = ctx->force_xs == 2 || (ctx->force_xs != 1 && (p->mt >= 2 || p->m == 8));
    int rpw = ctx->force_rpw == 1 || ctx->force_rpw == 2 ? ctx->force_rpw : 2;
    size_t smem = 0;
    if (xs) {
        smem = nbi_cuda_gemv_smem(p->fmt, 1, rpw, p->mt, 8 * p->mt);
        if (smem > ctx->info.smem_per_block_optin && rpw == 2)
            smem = nbi_cuda_gemv_smem(p->fmt, 1, rpw = 1, p->mt, 8 * p->mt);
        if (smem > ctx->info.smem_per_block_optin) xs = 0; /* (smaller GPUs) */
    }
    int64_t grid_x, s = 1;
    if (xs) {
        int per_sm = (int)(ctx->info.smem_per_sm / (smem + 1024)); /* + the runtime's reserve per CTA */
        per_sm = per_sm < 1 ? 1 : per_sm > 2 ? 2 : per_sm;         /* registers allow two (launch bounds) */
        const int64_t resident = (int64_t)sms * per_sm;
        p->kw = 1;
        p->rpw = rpw;
        grid_x = (p->row_blocks + warps * rpw - 1) / (warps * rpw);
        if (grid_x < resident) s = resident / grid_x;
        /* A CTA needs a run of chunks to fill its pipelines: with fewer than
         * 6 per split (narrow layers with short k, e.g. 4096 -> 4096) kernel
         * 1 with its in-CTA k split was faster in every case measured. */
        if (p->kchunks / s < 6 && ctx->force_xs != 2) xs = 0;
        /* 8 tokens: kernel 1 costs 13-18% more than at 7 on 8192 -> 57344
         * (121 vs 107 us, H100), kernel 2 110 us; with a k split kernel 2
         * lost (8192 -> 8192: 23.8 vs 21.5 us). */
        if (p->mt == 1 && s > 1 && ctx->force_xs != 2) xs = 0;
    }
    if (!xs) {
        s = 1;
        const double want = 1.4 * (double)sms; /* CTAs */
        int kw = warps / 2;
        if ((double)p->row_blocks * kw / warps < want) kw = warps;
        const int fk = ctx->force_kw;
        if (fk == 1 || fk == 2 || fk == 4 || fk == 8) kw = fk <= warps ? fk : warps;
        p->kw = kw;
        p->rpw = 1;
        grid_x = (p->row_blocks * kw + warps - 1) / warps;
        if ((double)grid_x < 0.5 * sms) s = (int64_t)ceil(want / (double)grid_x); /* narrow layer */
    }
    p->xsh = xs;
    if (ctx->force_splits > 0) s = ctx->force_splits;
    if (grid_x > NBI_MAX_SPLIT_COLUMNS) s = 1;
    const int64_t per_split_min = p->kw; /* at least one chunk per warp */
    if (s > p->kchunks / per_split_min) s = p->kchunks / per_split_min > 1 ? p->kchunks / per_split_min : 1;
    if (s > 64) s = 64;
    set_splits(p, s);
    return grid_x; /* CTAs along n (range-checked by the caller) */
}

/* The tensor-core path (gemm_sm90.cu) on Hopper for batches past the decode
 * range: one launch for every m, weights read once per 128-row x bn-token
 * tile.  Returns 1 when it takes the call (p filled).
 *
 * It also takes 17..32 tokens on layers with fewer 128-row tiles than SMs
 * (it then splits k to fill the GPU): its time does not grow with m below
 * 64 while the decode kernels' does.  Measured on an H100 (nvfp4, us,
 * decode / tensor core): m = 32: 8192 -> 8192 36.3 / 28.5, 28672 -> 8192
 * 90.0 / 82.9, 4096 -> 4096 18.1 / 12.0, 14336 -> 4096 43.1 / 25.8; m = 24:
 * the same layers 29.6 / 28.4, 73.3 / 83.1, 13.1 / 12.0, 29.1 / 25.7, so at
 * 17..24 tokens only layers with k < 16384 switch; m = 16 and 8192 -> 57344
 * (448 tiles) stay with the decode kernels at every m <= 32. */
static int choose_tc(nb_context *ctx, const nb_gemm_desc *g, nbi_gemm_plan *p) {
    const int can = nbi_cuda_has_sm90a() && ctx->info.cc_major == 9 && ctx->info.cc_minor == 0 && g->m <= INT32_MAX &&
                    ctx->info.smem_per_block_optin >= 227 * 1024;
    const int64_t tn = (p->row_blocks + 7) / 8; /* 128-row tiles */
    const int small_grid = tn < ctx->info.sm_count;
    int use = can && (g->m > 32 || (g->m > 16 && small_grid && (g->m > 24 || g->weight.k < 16384)));
    if (ctx->force_path == 1 || ctx->force_path == 3) use = 0;
    if (ctx->force_path == 2) use = can;
    if (!use) return 0;
    /* Tile width and k split: the pair with the least waves x time per k
     * chunk x chunks per CTA.  Time per chunk measured on an H100
     * (bench/RESULTS.md, 8192 -> 8192 and 8192 -> 57344): about 0.75, 0.9
     * and 1.5 us for 64, 128 and 256 tokens.  Narrow tiles win while the
     * wider ones leave SMs idle (m = 128: 48 us with 64, 58 us with 128),
     * wide ones once every SM has work (m = 1024: 204 us with 256, 259 us
     * with 128).  A k split fills the SMs the tiles leave idle (m <= 256 on
     * 8192-wide layers: 64 tiles of 128 rows for 132 SMs), never past one
     * CTA per SM, which bounds the workspace (sm90_workspace_bound);
     * its CTAs sum through the workspace (in L2), charged here as 5% per
     * extra split. */
    static const int widths[3] = {64, 128, 256};
    static const double chunk_us[3] = {0.75, 0.9, 1.5};
    const int fb = ctx->force_bn == 64 || ctx->force_bn == 128 || ctx->force_bn == 256 ? ctx->force_bn : 0;
    int bn = 64, splits = 1;
    double best = 0.0;
    for (int i = 0; i < 3; i++) {
        if (fb && fb != widths[i]) continue;
        const int64_t tiles = tn * ((g->m + widths[i] - 1) / widths[i]);
        int64_t most = tiles > NBI_MAX_SPLIT_COLUMNS ? 1 : ctx->info.sm_count / tiles;
        if (most > NBI_SM90_MAX_SPLITS) most = NBI_SM90_MAX_SPLITS;
        if (most > p->kchunks) most = p->kchunks;
        if (most < 1) most = 1; /* (a forced split is clamped to this too) */
        for (int64_t s = 1; s <= most; s++) {
            if (ctx->force_splits > 0 && s != (ctx->force_splits < most ? ctx->force_splits : most)) continue;
            const int64_t cps = (p->kchunks + s - 1) / s;
            const double cost = (double)((tiles * s + ctx->info.sm_count - 1) / ctx->info.sm_count) *
                                chunk_us[i] * (double)cps * (1.0 + 0.05 * (double)(s - 1));
            if (best == 0.0 || cost < best) best = cost, bn = widths[i], splits = (int)s;
        }
    }
    const int64_t tm = (g->m + bn - 1) / bn;
    if (tn * tm > INT32_MAX / NBI_SM90_MAX_SPLITS) return 0;
    set_splits(p, splits);
    p->path = NBI_PATH_SM90;
    p->m = g->m;
    p->mt = 0;
    p->bn = bn;
    p->tiles_n = (int)tn;
    p->tiles_m = (int)tm;
    p->raster_group = ctx->force_group > 0 ? ctx->force_group : 16;
    p->grid_x = (int)(tn * tm);
    if (p->splits > 1) {
        p->ws_counter_bytes = NBI_MAX_SPLIT_COLUMNS * sizeof(int);
        p->ws_partial_bytes = (size_t)p->splits * (size_t)(tn * tm) * 128 * (size_t)bn * sizeof(float);
    }
    return 1;
}

/* The most workspace the tensor-core path takes for any m: splits x tiles
 * stays within one CTA per SM, each 128 x 256 FP32 partials at most. */
static size_t sm90_workspace_bound(const nb_context *ctx) {
    return NBI_MAX_SPLIT_COLUMNS * sizeof(int) + (size_t)ctx->info.sm_count * 128 * 256 * sizeof(float);
}

/* The mma.sync tensor-core path (gemm_sm80.cu) for batches past the decode
 * range where the Hopper kernel does not run: compute capability 8.x (A100,
 * A10/A40, L40S, RTX 30/40) and 9.x without it (a build without sm_90a).
 * NIBBLE_PATH=mma forces it on any GPU from compute capability 8.0, Hopper
 * included (that is how it is tested), for every m.  Returns 1 when it takes
 * the call (p filled). */
static int choose_mma(nb_context *ctx, const nb_gemm_desc *g, nbi_gemm_plan *p) {
    const int cc = ctx->info.cc_major;
    int use = (cc == 8 || cc == 9) && g->m > 32;
    if (ctx->force_path == 1 || ctx->force_path == 2) use = 0;
    if (ctx->force_path == 3) use = cc >= 8;
    if (!use || g->m > INT32_MAX - 256) return 0;
    /* Tile width: the one with the least waves x time per k chunk.  Time per
     * chunk predicted for an A100 (gemm_sm80.cu, NOTES.md; to be replaced by
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
    if (ctx->force_bn == 64 || ctx->force_bn == 128) bn = ctx->force_bn;
    /* the deepest pipeline whose shared memory fits (NIBBLE_STAGES: that
     * depth if it fits); the narrow tile when the wide one fits no depth */
    const size_t limit = ctx->info.smem_per_block_optin;
    const int want = ctx->force_stages == 2 || ctx->force_stages == 3 ? ctx->force_stages : 0;
    size_t smem = 0;
    int stages = nbi_cuda_gemm_sm80_stages(p->fmt, bn, want, limit, &smem);
    if (!stages) stages = nbi_cuda_gemm_sm80_stages(p->fmt, bn, 0, limit, &smem);
    if (!stages && bn == 128) stages = nbi_cuda_gemm_sm80_stages(p->fmt, bn = 64, 0, limit, &smem);
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
    p->raster_group = ctx->force_group > 0 ? ctx->force_group : 16;
    if (p->raster_group > p->tiles_n) p->raster_group = p->tiles_n;
    p->splits = 1;
    p->grid_x = (int)(tn * tm);
    return 1;
}

nb_status nbi_gemm_make_plan_knobs(nb_context *ctx, const nb_gemm_desc *g, nbi_gemm_plan *p) {
    nb_status st = need_device(ctx, "nb_gemm");
    if (st) return st;
    if ((st = nbi_check_gemm(ctx, g, NB_LAYOUT_PACKED, false))) return st;
    const nb_weight_desc *d = &g->weight;
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
    if (d->format == NB_FORMAT_NVFP4) {
        p->exp_shift = g->act_dtype == NB_DTYPE_BF16 ? 7 : 8;
        p->table_shift = g->act_dtype == NB_DTYPE_BF16 ? 119 : 6;
    } else {
        int emin = d->scale_exp_min, emax = d->scale_exp_max;
        if (emax < 0) emin = emax = 127; /* every scale is NaN: any offset works */
        int span = emax - emin, limit = g->act_dtype == NB_DTYPE_BF16 ? 125 : 24;
        if (emin < 0 || emax > 254 || span < 0)
            return nbi_fail(ctx, NB_ERR_INVALID_ARGUMENT, "nb_gemm: MXFP4 scale range [%d, %d] is not set; pack the "
                            "weight with nb_pack or nb_pack_host", emin, emax);
        if (span > limit)
            return nbi_fail(ctx, NB_ERR_UNSUPPORTED, "nb_gemm: MXFP4 scale exponents span %d binades (bytes %d..%d); "
                            "%s activations are exact only up to %d%s", span, emin, emax,
                            nbi_dtype_name(g->act_dtype), limit,
                            g->act_dtype == NB_DTYPE_F16 ? ": use BF16 activations" : "");
        if (g->act_dtype == NB_DTYPE_BF16) {
            p->exp_shift = emax - 127;
            p->table_shift = 253 - emax;
        } else {
            p->exp_shift = emax - 128;
            p->table_shift = 142 - emax;
        }
    }
    p->tensor_scale = d->tensor_scale;
    /* The 256-entry table scale byte -> 16-bit adjusted scale, cached per
     * context (NVFP4 has one shift per dtype; MXFP4 one per emax). */
    if (ctx->table_shift[p->fmt][p->act] != p->table_shift) {
        uint16_t h[256];
        for (int b = 0; b < 256; b++) {
            float v = ldexpf(nbi_scale(d->scale_type, (uint8_t)b), p->table_shift);
            h[b] = g->act_dtype == NB_DTYPE_BF16 ? nbi_f32_to_bf16(v) : nbi_f32_to_f16(v);
        }
        for (int i = 0; i < 128; i++) ctx->table[p->fmt][p->act][i] = (uint32_t)h[2 * i] | ((uint32_t)h[2 * i + 1] << 16);
        ctx->table_shift[p->fmt][p->act] = p->table_shift;
    }
    memcpy(p->scale_table, ctx->table[p->fmt][p->act], sizeof p->scale_table);
    p->pdl = ctx->info.cc_major >= 9;
    p->row_blocks = (d->n + 15) / 16;
    p->kchunks = (d->k + NBI_CHUNK_K - 1) / NBI_CHUNK_K;
    if (choose_tc(ctx, g, p) || choose_mma(ctx, g, p)) return NB_OK;
    int warps = 8, stages = 4;
    nbi_cuda_gemv_shape(&warps, &stages);
    p->warps = warps;
    /* The split-K arrival counters live at a fixed place (the first
     * NBI_MAX_SPLIT_COLUMNS ints of the workspace), so one workspace serves
     * layers of every shape: each call leaves them zero. */
    const int64_t grid_x = choose_split(ctx, p, warps);
    if (grid_x > 0x7FFFFFFF)
        return nbi_fail(ctx, NB_ERR_BAD_SHAPE, "nb_gemm: n = %lld needs too many CTAs", (long long)d->n);
    p->grid_x = (int)grid_x;
    if (p->splits > 1) {
        p->ws_counter_bytes = NBI_MAX_SPLIT_COLUMNS * sizeof(int);
        p->ws_partial_bytes = (size_t)p->splits * (size_t)p->row_blocks * 16 * 32 * sizeof(float);
    }
    return NB_OK;
}

nb_status nb_gemm_can_implement(nb_context *ctx, const nb_gemm_desc *g) {
    nbi_gemm_plan p;
    return nbi_gemm_make_plan(ctx, g, &p);
}

nb_status nb_gemm_workspace_size(nb_context *ctx, const nb_gemm_desc *g, size_t *bytes) {
    if (!bytes) return nbi_fail(ctx, NB_ERR_NULL_POINTER, "nb_gemm_workspace_size: bytes is NULL");
    nbi_gemm_plan p;
    nb_status st = nbi_gemm_make_plan(ctx, g, &p); /* the real m: report its own errors */
    if (st) return st;
    /* The largest need over every m: one workspace then serves a layer at any
     * batch size (the split count depends on the kernel chosen for m, and a
     * tuning-table entry may choose per m bucket). */
    size_t most = p.ws_partial_bytes + p.ws_counter_bytes;
    int64_t ms[64];
    const int count = nbi_tune_workspace_ms(ms, 64);
    for (int i = 0; i < count; i++) {
        nb_gemm_desc h = *g;
        h.m = ms[i];
        if (nbi_gemm_make_plan(ctx, &h, &p) != NB_OK) continue;
        size_t need = p.ws_partial_bytes + p.ws_counter_bytes;
        if (p.path == NBI_PATH_SM90) need = sm90_workspace_bound(ctx); /* (its split depends on m within a bucket) */
        if (need > most) most = need;
    }
    *bytes = most;
    return NB_OK;
}

static const char *fmt_name(int f) { return f == NB_FORMAT_NVFP4 ? "nvfp4" : "mxfp4"; }

nb_status nb_gemm(nb_context *ctx, const nb_gemm_desc *g, const void *x, const void *packed, const void *bias, void *y,
                  void *workspace, size_t workspace_bytes, void *stream) {
    nbi_gemm_plan p;
    nb_status st = nbi_gemm_make_plan(ctx, g, &p);
    if (st) return st;
    if (!x || !packed || !y) return nbi_fail(ctx, NB_ERR_NULL_POINTER, "nb_gemm: x, packed and y must not be NULL");
    if ((uintptr_t)x % 16 || (uintptr_t)packed % 16)
        return nbi_fail(ctx, NB_ERR_MISALIGNED, "nb_gemm: x and packed must be 16-byte aligned");
    if ((uintptr_t)y % 2 || (bias && (uintptr_t)bias % 2))
        return nbi_fail(ctx, NB_ERR_MISALIGNED, "nb_gemm: y and bias must be 2-byte aligned");
    size_t need = p.ws_partial_bytes + p.ws_counter_bytes;
    if (need && (!workspace || workspace_bytes < need))
        return nbi_fail(ctx, NB_ERR_WORKSPACE, "nb_gemm: workspace of %zu bytes needed, %zu given%s", need,
                        workspace_bytes, workspace ? "" : " (NULL)");
    if (need && (uintptr_t)workspace % 16)
        return nbi_fail(ctx, NB_ERR_MISALIGNED, "nb_gemm: workspace must be 16-byte aligned");
    const size_t es = nbi_dtype_size(g->act_dtype);
    char err[NB_ERRBUF] = "";
    if (p.path == NBI_PATH_SM80) {
        if (nbi_cuda_gemm_sm80(&p, x, packed, bias, y, stream, err)) return cuda_failed(ctx, "nb_gemm", err);
        snprintf(ctx->last_config, sizeof ctx->last_config,
                 "gemm_sm80<%s,%s,128x%d,stages=%d> tiles=%dx%d raster=%d launches=1", fmt_name(p.fmt),
                 nbi_dtype_name(g->act_dtype), p.bn, p.stages, p.tiles_n, p.tiles_m, p.raster_group);
        nbi_tune_label(ctx, &p);
        return NB_OK;
    }
    if (p.path == NBI_PATH_SM90) {
        if (nbi_cuda_gemm_sm90(&p, x, packed, bias, y, workspace, stream, err))
            return cuda_failed(ctx, "nb_gemm", err);
        snprintf(ctx->last_config, sizeof ctx->last_config,
                 "gemm_sm90<%s,%s,128x%d> tiles=%dx%d k-split=%d raster=%d launches=1", fmt_name(p.fmt),
                 nbi_dtype_name(g->act_dtype), p.bn, p.tiles_n, p.tiles_m, p.splits, p.raster_group);
        nbi_tune_label(ctx, &p);
        return NB_OK;
    }
    /* m > 32: the decode kernel runs once per slice of 32 rows (the weights
     * are re-read per slice; the tensor-core path is the right tool there). */
    for (int64_t m0 = 0; m0 < g->m; m0 += 32) {
        nbi_gemm_plan q = p;
        if (g->m - m0 < 32) { /* a short last slice gets its own plan (kernel and split depend on m) */
            nb_gemm_desc h = *g;
            h.m = g->m - m0;
            if ((st = nbi_gemm_make_plan(ctx, &h, &q))) return st;
            q.lda = p.lda;
            q.ldc = p.ldc;
        }
        if (nbi_cuda_gemm(&q, (const char *)x + (size_t)(m0 * p.lda) * es, packed, bias,
                          (char *)y + (size_t)(m0 * p.ldc) * es, workspace, stream, err))
            return cuda_failed(ctx, "nb_gemm", err);
    }
    if (p.xsh)
        snprintf(ctx->last_config, sizeof ctx->last_config,
                 "gemv_fp4_xs<%s,%s,mt=%d,rows/warp=%d> grid=%dx%d warps=%d k-split=1x%d chunks/cta=%d launches=%lld",
                 fmt_name(p.fmt), nbi_dtype_name(g->act_dtype), p.mt, p.rpw * 16, p.grid_x, p.splits, p.warps,
                 p.splits, p.chunks_per_split, (long long)((g->m + 31) / 32));
    else
        snprintf(ctx->last_config, sizeof ctx->last_config,
                 "gemv_fp4<%s,%s,mt=%d> grid=%dx%d warps=%d k-split=%dx%d chunks/warp=%d launches=%lld",
                 fmt_name(p.fmt), nbi_dtype_name(g->act_dtype), p.mt, p.grid_x, p.splits, p.warps, p.kw,
                 p.splits, (p.chunks_per_split + p.kw - 1) / p.kw, (long long)((g->m + 31) / 32));
    nbi_tune_label(ctx, &p);
    return NB_OK;
}

nb_status nb_gemm_last_config(const nb_context *ctx, char *buf, size_t buf_bytes) {
    if (!ctx || !buf) return nbi_fail(NULL, NB_ERR_NULL_POINTER, "nb_gemm_last_config: NULL argument");
    if (buf_bytes == 0) return nbi_fail(NULL, NB_ERR_BUFFER_TOO_SMALL, "nb_gemm_last_config: buf_bytes is 0");
    const char *cfg = ctx->last_config[0] ? ctx->last_config : "none";
    snprintf(buf, buf_bytes, "%s", cfg);
    if (strlen(cfg) >= buf_bytes)
        return nbi_fail(NULL, NB_ERR_BUFFER_TOO_SMALL, "nb_gemm_last_config: %zu bytes needed, %zu given (truncated)",
                        strlen(cfg) + 1, buf_bytes);
    return NB_OK;
}

nb_status nb_gemm_reference_device(nb_context *ctx, const nb_gemm_desc *g, const void *x, const uint8_t *codes,
                                   const uint8_t *scales, const void *bias, float *y, void *stream) {
    nb_status st = need_device(ctx, "nb_gemm_reference_device");
    if (st) return st;
    if ((st = nbi_check_gemm(ctx, g, NB_LAYOUT_CHECKPOINT, true))) return st;
    if (!x || !codes || !scales || !y)
        return nbi_fail(ctx, NB_ERR_NULL_POINTER, "nb_gemm_reference_device: x, codes, scales and y must not be NULL");
    char err[NB_ERRBUF] = "";
    if (nbi_cuda_gemm_naive(g, x, codes, scales, bias, y, stream, err))
        return cuda_failed(ctx, "nb_gemm_reference_device", err);
    return NB_OK;
}
