/* moe.cu - the mixture-of-experts MLP on the GPU (nb_moe_mlp, nb_moe_align;
 * nibble.h "mixture of experts on the GPU" and src/moe.c, whose host
 * reference is the specification).  No launch per expert:
 *
 *   1. moe_align_kernel: the routing layout of nb_moe_align_host (vLLM's
 *      moe_align_block_size with slots ascending within an expert), one CTA
 *      per expert: every CTA counts all experts' slots (a shared histogram),
 *      sums the padded counts before its own for its offset, and writes its
 *      slots in ascending order with a block-wide ballot scan.  No atomics
 *      decide an order, so every byte is determined by the routing.
 *   Decode path (few slots per expert):
 *   2. moe_gemv_kernel<.., GATE_UP>: per routing block (8 * MT slots of one
 *      expert; blocks past the padded total, expert -1, exit at once, so
 *      inactive experts cost nothing) a row of CTAs, each of 8 warps
 *      streaming 8 / kw 16-row blocks of that expert's packed gate_up
 *      through cp.async rings (kw warps split a row block's k and are summed
 *      in shared memory) and multiplying them with the block's token rows by
 *      mma.m16n8k16 (the step of the dense decode kernel, gemv_step.cuh).
 *      The gate_up weights are packed with gate rows 8b..8b+7 and up rows
 *      8b..8b+7 in row block b, so a lane's accumulators hold gate i and up
 *      i of the same tokens: the activation runs in registers and h [slot,
 *      i] is stored rounded.
 *   3. moe_gemv_kernel<.., DOWN>: the same over the down weights with h's
 *      rows as tokens, o [slot, c] = dot + bias, rounded.
 *   Tensor-core path (prefill, Hopper):
 *   2. moe_gather_kernel: each expert's token rows, compact (no padding),
 *      into xg [slots, H];
 *   3. gemm_sm90.cu moe_sm90_kernel, gate_up then down: tiles of 128 weight
 *      rows x 64, 128 or 192 tokens of one expert, h in the compact row
 *      order; one CTA per SM, each walking tiles through one ring.
 *   4. moe_combine_kernel: y[t] = sum over s in top-k order of w[t, s] *
 *      o[t * top_k + s], float products and sums as the host does.
 *   Inline routing (decode at batch 1; moe.c moe_inline has the rule):
 *   two kernels.  Each CTA of gate_up and down computes its routing block
 *   of the layout from topk_ids in shared memory (moe_route_inline: the
 *   same positions moe_align_kernel gives), and the last CTA of down to
 *   finish a group of row blocks (an arrival counter per group, zeroed by
 *   gate_up's first CTA) runs step 4 for those columns of every token.
 *
 * Every launch covers the worst case of its grid (nb_moe_align_get_sizes),
 * so nothing on the host depends on the routing: capturable in a graph.
 * Launches after the layout use programmatic dependent launch (sm_90): each
 * waits (griddepcontrol.wait) before it reads what the previous one wrote,
 * and lets the next one launch only after that wait, so a kernel may read
 * the layout before its own wait (the down kernels fetch their first weight
 * chunks while gate_up finishes). */
#include "common.cuh"
#include "gemv_step.cuh"

#define MOE_STAGES 4      /* weight chunks in each warp's ring (6, or 4 CTAs per SM, measured no faster: NOTES.md) */
#define MOE_ALIGN_THREADS 512

enum { MOE_GATE_UP = 0, MOE_DOWN = 1 };

struct MoeParams {
    const uint8_t *w;        /* expert 0's packed weight; expert e at + e * stride */
    size_t stride;
    const void *x;           /* token rows: x [m, H] (GATE_UP, row slot / top_k) or h [slots, I] (DOWN, row slot) */
    int64_t lda;
    nbc_moe_epi epi;         /* h [slots, I] or o [slots, H], biases, activation */
    const float *tscale;     /* [E] or NULL */
    const int32_t *sorted;   /* routing layout */
    const int32_t *blockexp;
    int sentinel, top_k, block;
    int k, row_blocks, kchunks;
    int exp_shift;
    int kw;                  /* warps of a CTA that split one row block's k range (1, 2, 4, 8) */
    int groups;              /* CTAs per routing block: row_blocks / (8 / kw), rounded up */
    /* inline routing (ids != NULL): the routing from topk_ids [slots]; gate_up
     * zeroes arrive[0 .. dn_groups); down counts its CTAs per group there and
     * the last one combines its columns into y */
    const int32_t *ids;
    int experts, slots, dn_groups;
    int *arrive;
    const float *tw;
    void *y;
    int64_t m, hidden;
    uint32_t stab[128];
};

#define MOE_INLINE_SLOTS 64 /* moe.c NBI_MOE_INLINE_SLOTS */
#define MOE_INLINE_BLOCK 32 /* the largest routing block of the decode kernels */

/* ------------------------------------------------------------- routing */

__global__ void __launch_bounds__(MOE_ALIGN_THREADS) moe_align_kernel(const int32_t *__restrict__ ids, int slots,
                                                                        int experts, int block, int sorted_len,
                                                                        int nblocks, int32_t *sorted,
                                                                        int32_t *blockexp, int32_t *offsets,
                                                                        int32_t *counts, int32_t *ustart) {
    extern __shared__ int hist[]; /* [experts] */
    __shared__ int red[3][MOE_ALIGN_THREADS / 32];
    __shared__ int warp_sum[MOE_ALIGN_THREADS / 32];
    const int e = blockIdx.x, tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    constexpr int NW = MOE_ALIGN_THREADS / 32;
    nbc_grid_dependents_launch(); /* the next kernel may start; it waits for this one before reading the layout */
    for (int j = tid; j < experts; j += MOE_ALIGN_THREADS) hist[j] = 0;
    __syncthreads();
    for (int i = tid; i < slots; i += MOE_ALIGN_THREADS) {
        const int id = ids[i];
        if ((unsigned)id < (unsigned)experts) atomicAdd(&hist[id], 1);
    }
    __syncthreads();
    /* offset of e: the padded counts of the experts before it; the total;
     * and (the tensor-core path's compact rows) the counts before it */
    int before = 0, total = 0, ubefore = 0;
    for (int j = tid; j < experts; j += MOE_ALIGN_THREADS) {
        const int p = (hist[j] + block - 1) / block * block;
        total += p;
        if (j < e) before += p, ubefore += hist[j];
    }
    for (int o = 16; o; o >>= 1) {
        before += __shfl_xor_sync(0xFFFFFFFFu, before, o);
        total += __shfl_xor_sync(0xFFFFFFFFu, total, o);
        ubefore += __shfl_xor_sync(0xFFFFFFFFu, ubefore, o);
    }
    if (lane == 0) red[0][warp] = before, red[1][warp] = total, red[2][warp] = ubefore;
    __syncthreads();
    before = total = ubefore = 0;
    for (int w = 0; w < NW; w++) before += red[0][w], total += red[1][w], ubefore += red[2][w];
    const int c = hist[e], pc = (c + block - 1) / block * block;
    if (tid == 0) {
        offsets[e] = before;
        if (counts) counts[e] = c;
        if (ustart) ustart[e] = ubefore;
        if (e == experts - 1) offsets[experts] = total;
    }
    /* e's slots in ascending order: a ballot scan per chunk of the slots */
    int base = 0;
    for (int start = 0; c > 0 && start < slots; start += MOE_ALIGN_THREADS) {
        const int i = start + tid;
        const bool f = i < slots && ids[i] == e;
        const unsigned bal = __ballot_sync(0xFFFFFFFFu, f);
        if (lane == 0) warp_sum[warp] = __popc(bal);
        __syncthreads();
        int pre = 0, all = 0;
        for (int w = 0; w < NW; w++) {
            pre += w < warp ? warp_sum[w] : 0;
            all += warp_sum[w];
        }
        if (f) sorted[before + base + pre + __popc(bal & ((1u << lane) - 1u))] = i;
        base += all;
        __syncthreads(); /* warp_sum is rewritten by the next chunk */
    }
    for (int j = c + tid; j < pc; j += MOE_ALIGN_THREADS) sorted[before + j] = slots; /* padding: the sentinel */
    for (int b = before / block + tid; b < (before + pc) / block; b += MOE_ALIGN_THREADS) blockexp[b] = e;
    if (e == experts - 1) { /* everything past the padded total */
        for (int j = total + tid; j < sorted_len; j += MOE_ALIGN_THREADS) sorted[j] = slots;
        for (int b = total / block + tid; b < nblocks; b += MOE_ALIGN_THREADS) blockexp[b] = -1;
    }
}

/* The tensor-core path's input rows: xg [slots, H] holds, for each expert in
 * order, the token rows of its slots in the layout's order (compact: no
 * padding), so a tile's activations are consecutive rows for TMA.  One warp
 * per entry of the layout (grid-stride); the padding is skipped. */
__global__ void __launch_bounds__(256) moe_gather_kernel(const uint4 *__restrict__ x, int64_t row16, int top_k,
                                                         const int32_t *__restrict__ sorted,
                                                         const int32_t *__restrict__ blockexp,
                                                         const int32_t *__restrict__ offsets,
                                                         const int32_t *__restrict__ ustart, int sentinel, int block,
                                                         int64_t sorted_len, uint4 *__restrict__ xg) {
    const int lane = threadIdx.x & 31;
    const int64_t nw = (int64_t)gridDim.x * 8;
    nbc_grid_dependency_wait(); /* the layout */
    nbc_grid_dependents_launch();
    for (int64_t i = (int64_t)blockIdx.x * 8 + (threadIdx.x >> 5); i < sorted_len; i += nw) {
        const int slot = sorted[i];
        if (slot >= sentinel) continue; /* padding, or past the total */
        const int e = blockexp[i / block];
        const int64_t pos = ustart[e] + (i - offsets[e]);
        const uint4 *src = x + (int64_t)(slot / top_k) * row16;
        uint4 *dst = xg + pos * row16;
#pragma unroll 1
        for (int j = lane; j < (int)row16; j += 32) dst[j] = __ldg(src + j);
    }
}

/* y[t, c .. c+7] = sum over s (top-k order) of w[t, s] * o[t * top_k + s,
 * c .. c+7]; a slot whose id is outside [0, E) adds nothing.  o through L2
 * (written by other CTAs of the same kernel in the inline case).  NB (8 or
 * 4) slots at a time: their ids, weights and rows are independent loads (one
 * L2 round trip, not two per slot: at batch 1 a few threads run this after
 * the rest of the layer is done), a row read whatever its id and used only
 * when the id is valid; the sums still run in top-k order.  NB = 4 holds 16
 * fewer registers live (down's lean instance). */
template <int ACT, int NB>
__device__ __forceinline__ void moe_combine8(const void *o, const int32_t *ids, const float *tw, void *y,
                                             int64_t tok, int64_t c, int64_t hidden, int top_k, int experts) {
    float acc[8] = {0.0f, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f};
    for (int s0 = 0; s0 < top_k; s0 += NB) {
        bool ok[NB];
        float w[NB];
        uint4 v[NB];
#pragma unroll
        for (int i = 0; i < NB; i++) {
            const int64_t slot = tok * top_k + min(s0 + i, top_k - 1); /* (past top_k: a valid slot, not added) */
            ok[i] = s0 + i < top_k && (unsigned)ids[slot] < (unsigned)experts;
            w[i] = tw[slot];
            v[i] = __ldcg((const uint4 *)((const uint16_t *)o + slot * hidden + c));
        }
#pragma unroll
        for (int i = 0; i < NB; i++) {
            if (!ok[i]) continue;
            const uint32_t q[4] = {v[i].x, v[i].y, v[i].z, v[i].w};
#pragma unroll
            for (int j = 0; j < 8; j++) {
                const unsigned short b = (unsigned short)(q[j / 2] >> (16 * (j & 1)));
                const float x = ACT == NB_DTYPE_BF16 ? __bfloat162float(__ushort_as_bfloat16(b)) : __half2float(__ushort_as_half(b));
                acc[j] = __fadd_rn(acc[j], __fmul_rn(w[i], x));
            }
        }
    }
#pragma unroll
    for (int j = 0; j < 8; j++) nbc_store(ACT, y, (size_t)(tok * hidden + c + j), acc[j]);
}

/* One routing block of the layout moe_align_kernel writes, computed by a
 * CTA from topk_ids (at most MOE_INLINE_SLOTS slots, thread i holding slot
 * i): an expert's padded offset is the sum of the padded counts of the
 * smaller expert ids with slots, and a slot's position is that offset plus
 * the number of earlier slots with its expert.  Fills slot[0 .. block) with
 * block b's slots (the sentinel for padding), e with its expert (-1: past
 * the padded total) and nblocks with the routing blocks that have an
 * expert.  Every thread of the CTA calls it. */
struct MoeRoute {
    int slot[MOE_INLINE_BLOCK];
    int e, nblocks;
};
__device__ __forceinline__ void moe_route_inline(const MoeParams &p, int b, MoeRoute &r) {
    __shared__ int rid[MOE_INLINE_SLOTS], rpad[MOE_INLINE_SLOTS];
    const int tid = threadIdx.x, S = p.slots, B = p.block;
    int id = -1;
    if (tid < S) {
        const int v = p.ids[tid];
        id = (unsigned)v < (unsigned)p.experts ? v : -1;
        rid[tid] = id;
    }
    if (tid < B) r.slot[tid] = p.sentinel;
    if (tid == 0) r.e = -1;
    __syncthreads();
    int rank = 0, cnt = 0;
    if (id >= 0)
        for (int j = 0; j < S; j++) {
            const int same = rid[j] == id;
            cnt += same;
            rank += same & (j < tid);
        }
    if (tid < S) rpad[tid] = id >= 0 && rank == 0 ? (cnt + B - 1) / B * B : 0; /* an expert's first slot holds its padded count */
    __syncthreads();
    if (id >= 0) {
        int off = 0;
        for (int j = 0; j < S; j++) off += rid[j] < id ? rpad[j] : 0;
        const int pos = off + rank;
        if (pos / B == b) r.slot[pos - b * B] = tid;
        if (rank == 0 && off <= b * B && b * B < off + rpad[tid]) r.e = id;
    }
    if (tid == 0) {
        int total = 0;
        for (int j = 0; j < S; j++) total += rpad[j];
        r.nblocks = total / B;
    }
    __syncthreads();
}

/* down's columns of row-block group grp (16 * 8 / kw of them), combined
 * into y for every token (inline routing; the CTA's threads share the work),
 * NB slots at a time. */
template <int ACT, int NB>
__device__ __forceinline__ void moe_fold_columns(const MoeParams &p, int grp) {
    const int64_t rpc = 16 * (NBI_GEMV_WARPS / p.kw), c0 = grp * rpc;
    const int64_t c1 = c0 + rpc < p.hidden ? c0 + rpc : p.hidden, w8 = (c1 - c0) / 8;
    for (int64_t it = threadIdx.x; it < p.m * w8; it += NBI_GEMV_WARPS * 32)
        moe_combine8<ACT, NB>(p.epi.out, p.ids, p.tw, p.y, it / w8, c0 + it % w8 * 8, p.hidden, p.top_k, p.experts);
}

/* ------------------------------------------------------ grouped GEMMs */

/* INL: inline routing (p.ids set: the routing block from topk_ids, and
 * down's last CTA per group combines).  A separate instance, so the layout
 * path (batch 2 and up) carries none of it: down with the combine's eight
 * slots in flight needs 90 registers, two CTAs per SM, and ran 15% longer
 * at batch 8-128 than at its 80 (three per SM; ncu, NOTES.md).  LEAN
 * (inline down, one token tile, kw = 4: moe.c moe_down_kw4): the combine
 * four slots at a time, at most 80 registers, three CTAs per SM; the
 * inline down of kw = 2 keeps its 90 registers, which spread its grid of
 * at most two CTAs per SM evenly over the SMs (NOTES.md). */
template <int FMT, int ACT, int MT, int MODE, bool INL, bool LEAN>
__global__ void __launch_bounds__(NBI_GEMV_WARPS * 32, LEAN ? 3 : 1) moe_gemv_kernel(const MoeParams p) {
    NBC_CHECK_KERNEL_FORMAT(FMT);
    static_assert(!LEAN || (INL && MT == 1 && MODE == MOE_DOWN), "the lean instance is inline down's, one tile");
    constexpr int SB = nbc_fmt<FMT>::lane_scale_bytes;
    constexpr int CB = nbc_fmt<FMT>::chunk_bytes;
    __shared__ uint32_t stab[256];
    __shared__ MoeRoute route;
    __shared__ int is_last;
    /* CTA -> (routing block, group of row blocks), the groups of a routing
     * block consecutive: the CTAs of the active blocks (the first ones of
     * the layout) come first in the grid, the ones that exit at once last. */
    const int b = blockIdx.x / p.groups, grp = blockIdx.x % p.groups;
    /* Programmatic dependent launch: gate_up waits for the routing layout
     * (or topk_ids) before it reads it.  down reads the layout (topk_ids)
     * before it waits (complete: gate_up let down launch only after its own
     * wait) and fetches its first weight chunks, then waits for h. */
    if (MODE == MOE_GATE_UP) nbc_grid_dependency_wait();
    /* Inline routing: down may launch now (it launches once every gate_up
     * CTA has triggered, and at batch 1 all of them are resident at once,
     * moe.c moe_inline): its CTAs take the SMs' free slots as gate_up's
     * finish, route, fetch their first chunks and wait for h, instead of
     * launching once the last gate_up CTA has left its main loop (gpt-oss
     * batch 1 4-5% faster, NOTES.md v8).  The layout path keeps the later
     * trigger: the early one was not measured there. */
    if (INL && MODE == MOE_GATE_UP) nbc_grid_dependents_launch();
    if (INL && MODE == MOE_GATE_UP && blockIdx.x == 0) /* down's arrival counters, for this call */
        for (int i = threadIdx.x; i < p.dn_groups; i += NBI_GEMV_WARPS * 32) p.arrive[i] = 0;
    int e;
    if (INL) {
        moe_route_inline(p, b, route);
        e = route.e;
    } else {
        e = p.blockexp[b];
    }
    if (e < 0) {
        /* past the padded total (uniform over the CTA); with no slot routed
         * at all, the first routing block's CTAs write y (zeros) */
        if (INL && MODE == MOE_DOWN && route.nblocks == 0 && b == 0) {
            nbc_grid_dependency_wait();
            moe_fold_columns<ACT, LEAN ? 4 : 8>(p, grp);
        }
        return;
    }
    auto slot_at = [&](int i) { return INL ? route.slot[i] : p.sorted[b * p.block + i]; };
    nbc_load_scale_table<NBI_GEMV_WARPS * 32>(stab, p.stab);

    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int g = lane >> 2, t = lane & 3;
    /* warp -> (row block, k slice): the kw warps of a row block split its k
     * range and are summed through shared memory at the end */
    const int ks = warp % p.kw;
    const int rb = grp * (NBI_GEMV_WARPS / p.kw) + warp / p.kw;
    const bool valid = rb < p.row_blocks;
    const int per_warp = (p.kchunks + p.kw - 1) / p.kw;
    const int c_begin = ks * per_warp, c_end = min(c_begin + per_warp, p.kchunks);
    const int nchunks = valid ? max(c_end - c_begin, 0) : 0;

    float acc[MT][4], acc2[MT][4];
#pragma unroll
    for (int i = 0; i < MT; i++)
#pragma unroll
        for (int j = 0; j < 4; j++) acc[i][j] = acc2[i][j] = 0.0f;

    extern __shared__ __align__(128) uint4 ring_all[]; /* (128-byte aligned: gemv_fp4.cu, kernel 1's ring) */
    uint4 *ring = ring_all + (size_t)warp * MOE_STAGES * (CB / 16);
    const uint64_t pol = nbc_policy_evict_first();
    const uint8_t *gnext =
        p.w + (size_t)e * p.stride + ((size_t)(valid ? rb : 0) * p.kchunks + c_begin) * CB + 16 * lane;
    const uint32_t ring_s = nbc_smem_u32(ring) + 16 * lane;
    auto fetch = [&](int slot) {
        nbc_fetch_chunk<nbc_code_bytes<FMT, 0>(), CB>(ring_s + slot * CB, gnext, lane, pol);
        gnext += CB;
    };
#pragma unroll
    for (int s = 0; s < MOE_STAGES - 1; s++) {
        if (s < nchunks) fetch(s);
        nbc_cp_async_commit();
    }

    if (MODE == MOE_DOWN) nbc_grid_dependency_wait(); /* h */
    /* this lane's token rows (B operand column g of each tile), from its k slice */
    const __nv_bfloat16 *xp[MT];
    bool tok_ok[MT];
#pragma unroll
    for (int mt = 0; mt < MT; mt++) {
        const int slot = slot_at(mt * 8 + g);
        tok_ok[mt] = slot < p.sentinel;
        const int64_t row = !tok_ok[mt] ? 0 : MODE == MOE_GATE_UP ? slot / p.top_k : slot;
        xp[mt] = (const __nv_bfloat16 *)p.x + row * p.lda + (size_t)c_begin * NBI_CHUNK_K + 32 * t;
    }
    __syncthreads(); /* scale table ready */

    /* one chunk of the warp's range in ring slot s; chk: its activation
     * loads test k and the token (chunk_x_step) */
    auto chunk = [&](int i, int s, auto chk) {
        constexpr bool CHK = decltype(chk)::value;
        uint4 xv[4][MT]; /* one token tile: before the weights' wait (chunk_x) */
        chunk_x<MT, false, CHK>(xp, tok_ok, i, (c_begin + i) * NBI_CHUNK_K + 32 * t, p.k, xv);
        if (i + MOE_STAGES - 1 < nchunks) fetch((s + MOE_STAGES - 1) % MOE_STAGES);
        nbc_cp_async_commit();
        nbc_cp_async_wait<MOE_STAGES - 1>();
        __syncwarp();
        const uint4 *slotp = ring + s * (CB / 16);
        const uint4 L = slotp[lane], H = slotp[32 + lane];
        const uint32_t S = SB == 4 ? ((const uint32_t *)(slotp + 64))[lane] : ((const uint16_t *)(slotp + 64))[lane];
        __syncwarp();
        const int kbase = (c_begin + i) * NBI_CHUNK_K + 32 * t;
        uint32_t sg[2], sh[2];
        /* NVFP4's scales by cvt in the inline instances (batch 1; Qwen3 1.4%
         * faster); the layout instances keep the table, with cvt gate_up's
         * needed 83 registers (NOTES.md, MoE v10) */
        if (INL) chunk_scales_act<FMT, ACT>(S, stab, sg, sh);
        else chunk_scales<FMT>(S, stab, sg, sh);
#pragma unroll
        for (int w = 0; w < 4; w++) {
            uint4 xw[MT];
            step_x<MT, false, CHK>(xv, xp, tok_ok, i, kbase, p.k, w, xw);
            uint32_t a[4];
            a_frag<ACT, 0>(word(L, w), word(H, w), sg[w >> 1], sh[w >> 1], a);
#pragma unroll
            for (int mt = 0; mt < MT; mt++) nbc_mma16816<ACT>(acc[mt], a[0], a[1], a[2], a[3], xw[mt].x, xw[mt].y);
            a_frag<ACT, 2>(word(L, w), word(H, w), sg[w >> 1], sh[w >> 1], a);
#pragma unroll
            for (int mt = 0; mt < MT; mt++) nbc_mma16816<ACT>(acc2[mt], a[0], a[1], a[2], a[3], xw[mt].z, xw[mt].w);
        }
    };
    /* The inline instances of one token tile load the activations of the
     * chunks inside k untested and test only a partial last chunk's (batch
     * 1 up to 0.9% faster); the others test every load: untested, the
     * layout instances' registers fell from 80-83 to 74-78, three CTAs
     * shared an SM where two had, and DeepSeek-V3 at batch 1 and
     * gpt-oss-20b and Qwen3 at batch 8 ran 4-8% slower (H100, NOTES.md,
     * MoE v11). */
    nbc_walk_chunks<MOE_STAGES, INL && MT == 1>(nchunks, c_end, p.kchunks, p.k, chunk);
    nbc_cp_async_wait<0>();
    if (!(INL && MODE == MOE_GATE_UP)) nbc_grid_dependents_launch();
#pragma unroll
    for (int i = 0; i < MT; i++)
#pragma unroll
        for (int j = 0; j < 4; j++) acc[i][j] += acc2[i][j];
    if (p.kw > 1) gemv_kw_reduce<MT>(acc, (float *)ring_all, warp, lane, ks, p.kw); /* slices summed in order */

    /* epilogue: acc[mt][0, 1] are row g at tokens 2t, 2t+1 of tile mt, acc[mt][2, 3] row g+8 */
    if (valid && !ks) {
        const float sc = ldexpf(1.0f, p.exp_shift), ts = p.tscale ? p.tscale[e] : 1.0f;
#pragma unroll
        for (int mt = 0; mt < MT; mt++)
#pragma unroll
            for (int j = 0; j < 2; j++) {
                const int slot = slot_at(mt * 8 + 2 * t + j);
                if (slot >= p.sentinel) continue;
                const float lo = acc[mt][j] * sc * ts, hi = acc[mt][2 + j] * sc * ts;
                nbc_moe_store<ACT, MODE == MOE_GATE_UP>(p.epi, e, rb, g, slot, lo, hi);
            }
    }
    /* inline routing: the last of the group's CTAs (one per routing block
     * with an expert) to store its o combines the group's columns */
    if (INL && MODE == MOE_DOWN && nbc_split_last<0>(&p.arrive[grp], route.nblocks, &is_last, threadIdx.x == 0))
        moe_fold_columns<ACT, LEAN ? 4 : 8>(p, grp);
}

/* y[t, c] = sum over s (top-k order) of w[t, s] * o[t * top_k + s, c]; a slot
 * whose id is outside [0, E) adds nothing.  A thread owns 8 consecutive
 * columns of a token (hidden is a multiple of 8, o's rows are 16-byte
 * aligned): one 16-byte load per slot. */
template <int ACT>
__global__ void moe_combine_kernel(const void *o, const int32_t *__restrict__ ids, const float *__restrict__ tw,
                                   void *y, int64_t m, int64_t hidden, int top_k, int experts) {
    nbc_grid_dependency_wait(); /* o */
    const int64_t h8 = hidden / 8, idx = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (idx >= m * h8) return;
    moe_combine8<ACT, 8>(o, ids, tw, y, idx / h8, idx % h8 * 8, hidden, top_k, experts);
}

/* ------------------------------------------------------------ dispatch */

typedef void (*moe_fn)(const MoeParams);

template <int FMT, int ACT>
static moe_fn pick_moe_mt(int mt, int mode, bool inl, bool lean) {
#define MOE_K2(MT, I) (mode == MOE_GATE_UP ? moe_gemv_kernel<FMT, ACT, MT, MOE_GATE_UP, I, false> \
                                           : moe_gemv_kernel<FMT, ACT, MT, MOE_DOWN, I, false>)
#define MOE_K(MT) (inl ? MOE_K2(MT, true) : MOE_K2(MT, false))
    switch (mt) {
    case 1: return lean ? moe_gemv_kernel<FMT, ACT, 1, MOE_DOWN, true, true> : MOE_K(1);
    case 2: return MOE_K(2);
    case 4: return MOE_K(4);
    }
#undef MOE_K
#undef MOE_K2
    return NULL;
}

/* lean: inline down with one token tile over 4 or more warps per row block. */
static moe_fn pick_moe(int fmt, int act, int mt, int mode, bool inl, bool lean) {
#define MOE_RUNG(F, A) return pick_moe_mt<F, A>(mt, mode, inl, lean);
    NBC_LADDER(fmt, act, MOE_RUNG)
#undef MOE_RUNG
    return NULL;
}

extern "C" nb_status nbi_cuda_moe_align(nb_context *ctx, const nbi_moe_plan *p, const int32_t *ids, int32_t *sorted,
                                        int32_t *blocks, int32_t *offsets, int32_t *counts, int32_t *ustart,
                                        void *stream) {
    const size_t smem = (size_t)p->experts * sizeof(int); /* (E <= 4096: 16 KB, under the default limit) */
    moe_align_kernel<<<(unsigned)p->experts, MOE_ALIGN_THREADS, smem, (cudaStream_t)stream>>>(
        ids, (int)p->slots, (int)p->experts, p->block, (int)p->sorted_len, (int)p->blocks, sorted, blocks, offsets,
        counts, ustart);
    NBC_TRY(cudaGetLastError(), "moe align kernel launch");
    return NB_OK;
}

extern "C" nb_status nbi_cuda_moe_mlp(nb_context *ctx, const nbi_moe_plan *p, const void *x,
                                      const nb_moe_packed_weights *w, const int32_t *ids, const float *tw, void *y,
                                      void *workspace, void *stream) {
    char *ws = (char *)workspace;
    int32_t *sorted = (int32_t *)(ws + p->off_sorted), *blockexp = (int32_t *)(ws + p->off_blocks);
    int32_t *offsets = (int32_t *)(ws + p->off_offsets), *ustart = (int32_t *)(ws + p->off_ustart);
    nb_status st = NB_OK;
    if (!p->inline_route &&
        (st = nbi_cuda_moe_align(ctx, p, ids, sorted, blockexp, offsets, (int32_t *)(ws + p->off_counts), ustart,
                                 stream)))
        return st;
    if (p->tc) { /* prefill: the token rows gathered per expert, two grouped tensor-core GEMMs */
        const int64_t row16 = p->hidden * (int64_t)nbi_dtype_size((nb_dtype)p->act) / 16;
        cudaLaunchAttribute attr[1];
        cudaLaunchConfig_t cfg = nbc_launch_config(dim3(1024), dim3(256), 0, stream, p->pdl, attr);
        NBC_TRY(cudaLaunchKernelEx(&cfg, moe_gather_kernel, (const uint4 *)x, row16, (int)p->top_k,
                                   (const int32_t *)sorted, (const int32_t *)blockexp, (const int32_t *)offsets,
                                   (const int32_t *)ustart, (int)p->slots, p->block, p->sorted_len,
                                   (uint4 *)(ws + p->off_xg)),
                "moe gather kernel launch");
        if ((st = nbi_cuda_moe_sm90(ctx, p, 0, ws + p->off_xg, w, ws + p->off_h, sorted, blockexp, offsets, ustart,
                                    stream)) ||
            (st = nbi_cuda_moe_sm90(ctx, p, 1, ws + p->off_h, w, ws + p->off_o, sorted, blockexp, offsets, ustart,
                                    stream)))
            return st;
    }
    const size_t cb = nbi_chunk_bytes(nbi_traits((nb_format)p->fmt));
    const size_t smem = (size_t)NBI_GEMV_WARPS * MOE_STAGES * cb;
    for (int mode = MOE_GATE_UP; mode <= MOE_DOWN && !p->tc; mode++) {
        const bool lean = p->inline_route && p->mt == 1 && mode == MOE_DOWN && p->dn_kw >= 4;
        moe_fn f = pick_moe(p->fmt, p->act, p->mt, mode, p->inline_route != 0, lean);
        if (!f)
            return nbi_fail(ctx, NB_ERR_INTERNAL, "moe: no kernel for %s, %s, mt = %d",
                            nbi_traits((nb_format)p->fmt)->name, nbi_dtype_name((nb_dtype)p->act), p->mt);
        MoeParams q;
        memset(&q, 0, sizeof q);
        const bool gu = mode == MOE_GATE_UP;
        q.w = (const uint8_t *)(gu ? w->gate_up : w->down);
        q.stride = gu ? p->gu_stride : p->dn_stride;
        q.x = gu ? x : ws + p->off_h;
        q.lda = gu ? p->hidden : p->inter;
        q.epi = nbc_moe_epilogue(p, gu, gu ? ws + p->off_h : ws + p->off_o, w);
        q.tscale = gu ? w->gate_up_scales : w->down_scales;
        q.sorted = sorted;
        q.blockexp = blockexp;
        q.sentinel = (int)p->slots;
        q.top_k = (int)p->top_k;
        q.block = p->block;
        q.k = (int)(gu ? p->hidden : p->inter);
        q.row_blocks = (int)(gu ? p->gu_row_blocks : p->dn_row_blocks);
        q.kchunks = (int)(gu ? p->gu_kchunks : p->dn_kchunks);
        q.exp_shift = gu ? p->gu_exp_shift : p->dn_exp_shift;
        memcpy(q.stab, gu ? p->gu_table : p->dn_table, sizeof q.stab);
        q.kw = gu ? p->gu_kw : p->dn_kw;
        if (p->inline_route) {
            q.ids = ids;
            q.experts = (int)p->experts;
            q.slots = (int)p->slots;
            q.dn_groups = (int)p->dn_groups;
            q.arrive = (int *)(ws + p->off_arrive);
            q.tw = tw;
            q.y = y;
            q.m = p->m;
            q.hidden = p->hidden;
        }
        const int rbs_per_cta = NBI_GEMV_WARPS / q.kw;
        q.groups = (q.row_blocks + rbs_per_cta - 1) / rbs_per_cta;
        const dim3 grid((unsigned)(p->launch_blocks * q.groups)); /* (bounded by moe_plan) */
        cudaLaunchAttribute attr[1]; /* (smem, 37 KB at most, is under the default limit: no opt-in) */
        cudaLaunchConfig_t cfg = nbc_launch_config(grid, dim3(NBI_GEMV_WARPS * 32), smem, stream, p->pdl, attr);
        NBC_TRY(cudaLaunchKernelEx(&cfg, f, q), gu ? "moe gate_up kernel launch" : "moe down kernel launch");
    }
    if (p->inline_route) return NB_OK; /* down combined y */
    const int64_t total = p->m * (p->hidden / 8); /* (threads: 8 columns each) */
    const unsigned cgrid = (unsigned)((total + 255) / 256);
    cudaLaunchAttribute attr[1];
    cudaLaunchConfig_t cfg = nbc_launch_config(dim3(cgrid), dim3(256), 0, stream, p->pdl, attr);
    NBC_TRY(cudaLaunchKernelEx(&cfg, p->act == NB_DTYPE_BF16 ? moe_combine_kernel<NB_DTYPE_BF16>
                                                              : moe_combine_kernel<NB_DTYPE_F16>,
                               (const void *)(ws + p->off_o), ids, tw, y, (int64_t)p->m, (int64_t)p->hidden,
                               (int)p->top_k, (int)p->experts),
            "moe combine kernel launch");
    return NB_OK;
}

/* ------------------------------------------------------------- nb_glu */

/* nibble.h's gated activations as nb_glu_host evaluates them: expf and IEEE
 * division (not the MoE epilogue's approximations, nbc_moe_act: the result
 * is h rounded to BF16 / FP16, held to the host's within one ulp). */
template <int AV>
__device__ __forceinline__ float glu_act(float limit, float alpha, float g, float u) {
    if (AV == NB_MOE_ACT_SWIGLU) return g / (1.0f + expf(-g)) * u;
    g = g > limit ? limit : g;
    u = u > limit ? limit : u < -limit ? -limit : u;
    return (u + 1.0f) * (g / (1.0f + expf(-(alpha * g))));
}

/* Eight 16-bit values of a 16-byte word as floats. */
template <int ACT>
__device__ __forceinline__ void glu_unpack8(uint4 v, float (&f)[8]) {
    const uint32_t w[4] = {v.x, v.y, v.z, v.w};
#pragma unroll
    for (int j = 0; j < 4; j++) {
        if (ACT == NB_DTYPE_BF16) {
            f[2 * j] = __uint_as_float(w[j] << 16);
            f[2 * j + 1] = __uint_as_float(w[j] & 0xFFFF0000u);
        } else {
            f[2 * j] = __half2float(__ushort_as_half((unsigned short)(w[j] & 0xFFFFu)));
            f[2 * j + 1] = __half2float(__ushort_as_half((unsigned short)(w[j] >> 16)));
        }
    }
}

/* h [m, n] = act(gate, up) from gu [m, 2n].  VEC: a thread owns 8
 * consecutive columns of a row (n a multiple of 8, gu and h 16-byte aligned:
 * 16-byte loads and one 16-byte store); otherwise one column.  It lets the
 * next kernel launch at once (the down GEMM's CTAs request their first
 * weights, which this kernel does not write) and waits for gu's writer
 * before it reads or writes anything. */
template <int ACT, int AV, bool VEC>
__global__ void glu_kernel(const void *__restrict__ gu, void *__restrict__ h, int64_t m, int64_t n, int interleaved,
                           float limit, float alpha) {
    nbc_grid_dependents_launch();
    nbc_grid_dependency_wait(); /* gu */
    const int64_t step = (int64_t)gridDim.x * blockDim.x;
    if (VEC) {
        const int64_t n8 = n / 8, total = m * n8;
        for (int64_t idx = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; idx < total; idx += step) {
            const int64_t t = idx / n8, i = idx % n8 * 8;
            const uint16_t *row = (const uint16_t *)gu + t * 2 * n;
            float g[8], u[8];
            if (interleaved) { /* gate i, up i, gate i+1, ...: 16 values from 2i */
                float a[8], b[8];
                glu_unpack8<ACT>(__ldg((const uint4 *)(row + 2 * i)), a);
                glu_unpack8<ACT>(__ldg((const uint4 *)(row + 2 * i + 8)), b);
#pragma unroll
                for (int j = 0; j < 4; j++) g[j] = a[2 * j], u[j] = a[2 * j + 1], g[4 + j] = b[2 * j], u[4 + j] = b[2 * j + 1];
            } else {
                glu_unpack8<ACT>(__ldg((const uint4 *)(row + i)), g);
                glu_unpack8<ACT>(__ldg((const uint4 *)(row + n + i)), u);
            }
            uint32_t o[4];
#pragma unroll
            for (int j = 0; j < 4; j++)
                o[j] = nbc_pack2<ACT>(glu_act<AV>(limit, alpha, g[2 * j], u[2 * j]),
                                      glu_act<AV>(limit, alpha, g[2 * j + 1], u[2 * j + 1]));
            *(uint4 *)((uint16_t *)h + t * n + i) = make_uint4(o[0], o[1], o[2], o[3]);
        }
    } else {
        for (int64_t idx = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; idx < m * n; idx += step) {
            const int64_t t = idx / n, i = idx % n, row = t * 2 * n;
            const float g = nbc_load(ACT, gu, (size_t)(row + (interleaved ? 2 * i : i)));
            const float u = nbc_load(ACT, gu, (size_t)(row + (interleaved ? 2 * i + 1 : n + i)));
            nbc_store(ACT, h, (size_t)idx, glu_act<AV>(limit, alpha, g, u));
        }
    }
}

template <int ACT, int AV>
static void *pick_glu2(bool vec) {
    return vec ? (void *)glu_kernel<ACT, AV, true> : (void *)glu_kernel<ACT, AV, false>;
}

extern "C" nb_status nbi_cuda_glu(nb_context *ctx, const nb_glu_desc *d, const void *gu, void *h, int pdl,
                                  void *stream) {
    const bool vec = d->n % 8 == 0 && (uintptr_t)gu % 16 == 0 && (uintptr_t)h % 16 == 0;
    const bool swi = d->activation == NB_MOE_ACT_SWIGLU;
    void *f = d->dtype == NB_DTYPE_BF16
                  ? (swi ? pick_glu2<NB_DTYPE_BF16, NB_MOE_ACT_SWIGLU>(vec) : pick_glu2<NB_DTYPE_BF16, NB_MOE_ACT_SWIGLU_OAI>(vec))
                  : (swi ? pick_glu2<NB_DTYPE_F16, NB_MOE_ACT_SWIGLU>(vec) : pick_glu2<NB_DTYPE_F16, NB_MOE_ACT_SWIGLU_OAI>(vec));
    const int64_t items = vec ? d->m * (d->n / 8) : d->m * d->n;
    int64_t blocks = (items + 255) / 256;
    const int64_t cap = (int64_t)ctx->info.sm_count * 8; /* a grid-stride loop beyond a few waves */
    if (blocks > cap) blocks = cap;
    int64_t m = d->m, n = d->n;
    int il = d->layout == NB_MOE_GATE_UP_INTERLEAVED;
    float limit = d->limit, alpha = d->alpha;
    void *args[] = {(void *)&gu, (void *)&h, &m, &n, &il, &limit, &alpha};
    cudaLaunchAttribute attr[1];
    cudaLaunchConfig_t cfg = nbc_launch_config(dim3((unsigned)blocks), dim3(256), 0, stream, pdl, attr);
    NBC_TRY(cudaLaunchKernelExC(&cfg, f, args), "glu kernel launch");
    return NB_OK;
}
