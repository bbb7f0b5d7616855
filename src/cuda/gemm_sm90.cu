/* gemm_sm90.cu - the tensor-core path on Hopper (sm_90a):
 * Y[m, n] = X[m, k] . W[n, k]^T for m above the decode range, W in NVFP4 or
 * MXFP4 in the packed layout of gemv_fp4.cu (the same bytes serve both
 * paths), or in a 4-bit integer (int4, int4_sym) or table format (nf4,
 * bnb_fp4) in their group-aligned layout (docs/formats.md 8.7, 8.8: the
 * template parameter KG, the kernel group; 0 for E2M1), X and Y in BF16 or
 * FP16.
 *
 * WHAT IT DOES
 *   A CTA owns a tile of 128 weight rows x BN tokens (BN = 64, 128, 192, 256;
 *   256 rows for BN = 16 and 32) and walks k in chunks of 128 (one packed
 *   chunk per 16-row block).  Warpgroups:
 *     WG0, the producer: one thread issues, per chunk, two TMA loads of the
 *         activation tile (BN rows x 64 k each, 128-byte swizzle) and one
 *         bulk copy per row block of its packed chunk (contiguous), all
 *         completing on the stage's "full" mbarrier, STAGES chunks ahead;
 *     WG1, WG2 (WG1..WG4 for BN <= 32), the consumers: 64 weight rows each.  Per k16 tile a thread
 *         dequantizes its A fragment (4 registers) straight from the packed
 *         chunk in shared memory and issues wgmma m64nBNk16 with A from
 *         registers and B (the activations) from shared memory.  The
 *         wgmma is asynchronous: the next tile's dequantization overlaps it.
 *         After a chunk's last wgmma has retired every consumer thread
 *         arrives on the stage's "empty" mbarrier, which frees it for the
 *         producer.  The 256-token tile (three stages) fills and frees each
 *         64-k half of a stage on barriers of its own (SM90_HALF).
 *   When the tiles leave SMs idle (m <= 256 on 8192-row layers), `splits`
 *   CTAs share a tile, each walking its own range of chunks, and their FP32
 *   partials are summed in split order (deterministic) one of two ways,
 *   the planner's choice: the tile's CTAs form a thread block cluster and
 *   each sums a share of the tile from all of their shared memory
 *   (sm90_cluster_reduce), or they store the partials in the workspace and
 *   the last to arrive sums them and runs the epilogue (sm90_split_reduce).
 *   Both give the same bits.  Where whole tiles leave a third of the SMs
 *   or more idle, a stream-K grid (gemm_sm90_sk_kernel) runs one CTA per SM
 *   over an equal share of all the tiles' chunks instead.
 *   The epilogue multiplies by 2^exp_shift * tensor_scale, adds the bias and
 *   stores BF16/FP16 (rows past n and tokens past m are not stored).  The
 *   last token tile of a batch that does not fill it reads the activations
 *   from row m - BN on (sm90_x0), so no TMA box runs past m.
 *
 * HOW THE DECODE LAYOUT FEEDS WGMMA
 *   wgmma takes B from shared memory in natural k order (8 consecutive k per
 *   16-byte core-matrix row), so tile j of a chunk is k = 16j .. 16j+15 and
 *   a thread (g = lane/4, t = lane%4) needs, per tile, the pairs k = 16j+2t,
 *   +1 and 16j+2t+8, +9 of rows g and g+8.  In the packed chunk row g's 128
 *   codes are the 64 bytes at 64g (row g+8 at 512+64g), eight k per word
 *   (word G = k/8), and elements 2i, 2i+1 of a word are its pair i.  So
 *   the thread reads the four 16-byte words of rows g and g+8 that hold
 *   tiles 2q, 2q+1 and decodes pair t of each to the same 16-bit values as
 *   the decode kernel (a rotation and a multiply by per-lane amounts, two
 *   masks, one HMUL2 by the adjusted block scale: tc_dequant.cuh
 *   nbc_decode_pair_lane, gemv_fp4.cu "DEQUANTIZATION").  The four
 *   lanes of a row read the same 16 bytes (a broadcast).  Scales: NVFP4
 *   group j of rows g / g+8 is byte 4(j/2)+(j&1) / +2 of the 16 bytes at
 *   1024+16g; MXFP4 group j/2 is byte 2(j/2) / +1 of the 8 bytes at
 *   1024+8g.  The integer and table formats keep the decode kernel's k
 *   order inside a chunk; the thread reads its rows' four 16-byte pieces
 *   and takes each tile's words from them, and their weights are rounded
 *   to the activation dtype once dequantized (tc_dequant.cuh; DESIGN.md
 *   4.2.3), where their decode kernel applies the scale in FP32.
 *
 * LIMITS  sm_90a only (the host checks); x rows 16-byte aligned (TMA); k a
 *         multiple of the group; m < 2^31.
 * TEST    build/tests/test_gpu (m in 33..4096; NIBBLE_SM90_CLUSTER=0 for
 *         the workspace sum everywhere, NIBBLE_SM90_SK=1 for the stream-K
 *         grid wherever it runs), build/tests/test_gpu_int (the
 *         integer and table formats), build/tests/test_plan (the planner's
 *         choices, no GPU).  BENCH  nibble bench.
 */
#include "common.cuh"
#include "tc_dequant.cuh"
#include "wgmma_ops.cuh"

#include <cudaTypedefs.h>

/* CWG, the consumer warpgroups per CTA, 64 weight rows each: two (128-row
 * tiles) for every tile width; four (256-row tiles) for the 16- and 32-token
 * tiles on layers with enough rows (the planner's choice, plan.c), whose
 * accumulators are small (8 or 16 registers): half as many tiles leave room
 * for a k split (8192 -> 10240, m = 32: 33.3 us with 3 splits against 44.8
 * with two warpgroups). */
#define SM90_THREADS(CWG) (128 * ((CWG) + 1)) /* + the producer warpgroup */
#define SM90_ROWS(CWG) (64 * (CWG))            /* weight rows per CTA */
/* Whether a tile width releases each stage's two 64-k halves on barriers
 * of their own, so the producer refills half 0 (with the weights) half a
 * chunk sooner: the 256-token tile, whose 74 KB stages leave room for only
 * three (H100, nvfp4, 8192 -> 8192, interleaved runs: m = 256 62.1 -> 58.8
 * us, 1024 193.7 -> 184.6, 4096 855.1 -> 813.6).  The 64- and 128-token
 * tiles have six and four stages and lost with it (m = 64: 8192 -> 8192
 * 29.5 -> 30.8 us, 28672 -> 8192 85.2 -> 91.3). */
#define SM90_HALF(BN) ((BN) == 256)

struct Sm90Params {
    const uint8_t *w;
    void *y;
    const void *bias;
    int m, n, k;
    int64_t ldc;
    int row_blocks, kchunks;
    int tiles_n, tiles_m, group; /* tile grid and its raster (group of n tiles walked together) */
    int splits, cps;             /* CTAs per tile along k, chunks per split */
    int tile0, ws_tiles;         /* this launch's first tile; the tiles it splits (workspace rows) */
    float *partial;              /* split-K: per split and tile, the consumers' accumulators */
    int *counters;               /* split-K: arrivals per tile (left zero) */
    int cluster;                 /* split-K: a tile's CTAs are a cluster and sum through shared memory */
    int exp_shift;
    float ts;
    uint32_t stab[128];
    int scale_bf16;              /* integer formats: the scales are BF16 (else F16) */
};

#if defined(__CUDA_ARCH__) && defined(__CUDA_ARCH_FEAT_SM90_ALL)
#define NB_SM90_DEVICE 1
#endif

/* ------------------------------------------------------------ PTX helpers */
#ifdef NB_SM90_DEVICE
/* TMA: a 2-D box of the activation tensor map into shared memory. */
__device__ __forceinline__ void tma_load_2d(uint32_t dst, const CUtensorMap *map, int c0, int c1, uint32_t bar) {
    asm volatile("cp.async.bulk.tensor.2d.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1, {%2, %3}], [%4];"
                 ::"r"(dst), "l"((uint64_t)map), "r"(c0), "r"(c1), "r"(bar)
                 : "memory");
}

/* Thread block clusters (PTX ISA "Distributed Shared Memory",
 * "barrier.cluster"): the address of the same shared location in CTA `rank`
 * of the cluster, a 16-byte load from there, and a barrier of every
 * non-exited thread of the cluster (release / acquire: shared-memory writes
 * before it are visible to every CTA of the cluster after it). */
__device__ __forceinline__ uint32_t cluster_map(uint32_t addr, int rank) {
    uint32_t r;
    asm volatile("mapa.shared::cluster.u32 %0, %1, %2;" : "=r"(r) : "r"(addr), "r"(rank));
    return r;
}
__device__ __forceinline__ float4 cluster_ld16(uint32_t cluster_addr) {
    float4 v;
    asm volatile("ld.shared::cluster.v4.f32 {%0, %1, %2, %3}, [%4];"
                 : "=f"(v.x), "=f"(v.y), "=f"(v.z), "=f"(v.w)
                 : "r"(cluster_addr)
                 : "memory");
    return v;
}
__device__ __forceinline__ void cluster_sync() {
    asm volatile("barrier.cluster.arrive.release;\nbarrier.cluster.wait.acquire;" ::: "memory");
}

/* wgmma shared-memory descriptor (PTX ISA "Matrix Descriptor Format"): a
 * K-major tile with 128-byte swizzle, rows of 128 bytes, 8-row core-matrix
 * groups 1024 bytes apart (SBO); LBO is unused for this layout. */
__device__ __forceinline__ uint64_t desc_sw128(uint32_t saddr) {
    return (uint64_t)((saddr & 0x3FFFF) >> 4) | ((uint64_t)1 << 16) | ((uint64_t)(1024 >> 4) << 32) |
           ((uint64_t)1 << 62);
}
__device__ __forceinline__ void wgmma_fence() { asm volatile("wgmma.fence.sync.aligned;" ::: "memory"); }
__device__ __forceinline__ void wgmma_commit() { asm volatile("wgmma.commit_group.sync.aligned;" ::: "memory"); }
template <int N>
__device__ __forceinline__ void wgmma_wait() { asm volatile("wgmma.wait_group.sync.aligned %0;" ::"n"(N) : "memory"); }

template <int ACT, int BN>
__device__ __forceinline__ void wgmma_tile(float (&d)[BN / 2], uint32_t a0, uint32_t a1, uint32_t a2, uint32_t a3,
                                           uint64_t desc, int scale_d) {
    if constexpr (ACT == NB_DTYPE_BF16) {
        if constexpr (BN == 16) wgmma_m64n16k16_bf16(d, a0, a1, a2, a3, desc, scale_d);
        if constexpr (BN == 32) wgmma_m64n32k16_bf16(d, a0, a1, a2, a3, desc, scale_d);
        if constexpr (BN == 64) wgmma_m64n64k16_bf16(d, a0, a1, a2, a3, desc, scale_d);
        if constexpr (BN == 128) wgmma_m64n128k16_bf16(d, a0, a1, a2, a3, desc, scale_d);
        if constexpr (BN == 192) wgmma_m64n192k16_bf16(d, a0, a1, a2, a3, desc, scale_d);
        if constexpr (BN == 256) wgmma_m64n256k16_bf16(d, a0, a1, a2, a3, desc, scale_d);
    } else {
        if constexpr (BN == 16) wgmma_m64n16k16_f16(d, a0, a1, a2, a3, desc, scale_d);
        if constexpr (BN == 32) wgmma_m64n32k16_f16(d, a0, a1, a2, a3, desc, scale_d);
        if constexpr (BN == 64) wgmma_m64n64k16_f16(d, a0, a1, a2, a3, desc, scale_d);
        if constexpr (BN == 128) wgmma_m64n128k16_f16(d, a0, a1, a2, a3, desc, scale_d);
        if constexpr (BN == 192) wgmma_m64n192k16_f16(d, a0, a1, a2, a3, desc, scale_d);
        if constexpr (BN == 256) wgmma_m64n256k16_f16(d, a0, a1, a2, a3, desc, scale_d);
    }
}

#endif

/* Shared memory: STAGES activation tiles (two 128-byte-swizzled halves of
 * BN x 64 each; 1024-byte aligned as the swizzle requires), STAGES x 8
 * packed chunks, the scale table, the mbarriers; plus 1 KB to align. */
template <int FMT, int KG, int BN, int STAGES, int CWG>
struct Sm90Smem {
    static constexpr int CB = nbc_chunk_bytes<FMT, KG>();
    static constexpr int X_STAGE = BN * 256;
    static constexpr int W_STAGE = SM90_ROWS(CWG) / 16 * CB;
    static constexpr int X_OFF = 0;
    static constexpr int W_OFF = STAGES * X_STAGE;
    static constexpr int TAB_OFF = W_OFF + STAGES * W_STAGE;
    static constexpr int BAR_OFF = TAB_OFF + 1024;
    static constexpr int FLAG_OFF = BAR_OFF + 16 * STAGES * (SM90_HALF(BN) ? 2 : 1); /* split-K: "this CTA sums the tile" */
    static constexpr int BYTES = FLAG_OFF + 16 + 1024;
    /* cluster split-K: the consumers' FP32 accumulators, over the (then idle) stages */
    static_assert(128 * CWG * BN / 2 * 4 <= W_OFF + STAGES * W_STAGE, "the partials fit the stages");
    /* sm90_store_tile: the tile rounded to 16 bits, token-major */
    static_assert(BN * SM90_ROWS(CWG) * 2 <= W_OFF + STAGES * W_STAGE, "the output tile fits the stages");
    /* sm90_cluster_reduce: the partials, then a share of at most half the tile rounded to 16 bits */
    static_assert(128 * CWG * BN / 2 * 4 + BN / 2 * SM90_ROWS(CWG) * 2 <= W_OFF + STAGES * W_STAGE,
                  "the partials and a staged share fit the stages");
};

#ifdef NB_SM90_DEVICE
/* The producer (one thread): per chunk i of the CTA's range, wait until its
 * stage is free, announce the bytes, and issue the TMA loads of the
 * activation tile and the bulk copies of the tile's nrb packed chunks, all
 * completing on the stage's "full" barrier.  Barriers: full[s] at bar0 + 8s,
 * empty[s] at bar0 + 8(STAGES + s); with HALF, full[h][s] at
 * bar0 + 8(h STAGES + s) and empty[h][s] at bar0 + 8((2 + h) STAGES + s),
 * half 0 carrying the weights and k 0..63, half 1 k 64..127.  The weights
 * are p.w's (GROUPED: a MoE tile, wg's), the activations BN rows from xrow;
 * the ring goes on from position `base` (the stream-K grid's segments).  */
template <int FMT, int KG, int BN, int STAGES, int CWG, bool GROUPED>
__device__ __forceinline__ void sm90_produce(const CUtensorMap *xmap, const Sm90Params &p, const uint8_t *wg, uint8_t *smem,
                                             uint32_t bar0, int c0, int nch, int rb0, int nrb, int xrow, int base) {
    typedef Sm90Smem<FMT, KG, BN, STAGES, CWG> L;
    constexpr int CB = L::CB;
    const uint64_t pol = nbc_policy_evict_first();
    const uint32_t bytes = (uint32_t)(L::X_STAGE + nrb * CB);
    asm volatile("griddepcontrol.wait;" ::: "memory"); /* X comes from the previous kernel */
    if constexpr (SM90_HALF(BN)) for (int i = 0; i < nch; i++) {
        const int r = base + i, s = r % STAGES, kc = c0 + i;
        const uint32_t ph = ((r / STAGES) - 1) & 1;
        const uint32_t xs = nbc_smem_u32(smem + L::X_OFF + s * L::X_STAGE);
        /* half 0: the weights and k 0..63 of the activations */
        if (r >= STAGES) nbc_mbar_wait(bar0 + 8 * (2 * STAGES + s), ph);
        const uint32_t full0 = bar0 + 8 * s;
        nbc_mbar_expect_tx(full0, (uint32_t)(L::X_STAGE / 2 + nrb * CB));
        tma_load_2d(xs, xmap, kc * NBI_CHUNK_K, xrow, full0);
        const uint32_t ws = nbc_smem_u32(smem + L::W_OFF + s * L::W_STAGE);
        for (int r = 0; r < nrb; r++)
            nbc_bulk_load(ws + r * CB, (GROUPED ? wg : p.w) + ((size_t)(rb0 + r) * p.kchunks + kc) * CB, CB, full0, pol);
        /* half 1: k 64..127 */
        if (r >= STAGES) nbc_mbar_wait(bar0 + 8 * (3 * STAGES + s), ph);
        const uint32_t full1 = bar0 + 8 * (STAGES + s);
        nbc_mbar_expect_tx(full1, (uint32_t)(L::X_STAGE / 2));
        tma_load_2d(xs + BN * 128, xmap, kc * NBI_CHUNK_K + 64, xrow, full1);
    }
    else for (int i = 0; i < nch; i++) {
        const int r = base + i, s = r % STAGES, kc = c0 + i;
        if (r >= STAGES) nbc_mbar_wait(bar0 + 8 * (STAGES + s), ((r / STAGES) - 1) & 1);
        const uint32_t full = bar0 + 8 * s;
        nbc_mbar_expect_tx(full, bytes);
        const uint32_t xs = nbc_smem_u32(smem + L::X_OFF + s * L::X_STAGE);
        tma_load_2d(xs, xmap, kc * NBI_CHUNK_K, xrow, full);
        tma_load_2d(xs + BN * 128, xmap, kc * NBI_CHUNK_K + 64, xrow, full);
        const uint32_t ws = nbc_smem_u32(smem + L::W_OFF + s * L::W_STAGE);
        for (int r = 0; r < nrb; r++)
            nbc_bulk_load(ws + r * CB, (GROUPED ? wg : p.w) + ((size_t)(rb0 + r) * p.kchunks + kc) * CB, CB, full, pol);
    }
}

/* A consumer warpgroup's main loop over the CTA's nch chunks: row block rbl
 * of the tile, accumulators acc.  Two register sets of A fragments: chunk
 * c's wgmmas read one set while chunk c+1 is dequantized into the other;
 * wgmma.wait_group 1 after issuing chunk c+1 retires chunk c, which frees
 * its set and its stage.  The loop is unrolled by two so that both sets are
 * plain registers. */
template <int FMT, int ACT, int KG, int BN, int STAGES, int CWG>
__device__ __forceinline__ void sm90_consume(uint8_t *smem, const uint32_t *stab, int scale_bf16, uint32_t bar0, int nch,
                                             int rbl, int g, int t, float (&acc)[BN / 2], int base) {
    typedef Sm90Smem<FMT, KG, BN, STAGES, CWG> L;
    constexpr int CB = L::CB;
    uint32_t fa[8][4], fb[8][4];
    if constexpr (SM90_HALF(BN)) {
        /* Each chunk issues two wgmma groups, one per 64-k half; after issuing
         * half h, wgmma.wait_group 2 retires the previous chunk's half h, which
         * frees that half of its stage. */
        auto chunk = [&](int i, uint32_t (&a)[8][4]) { /* the CTA's chunk i (stage (base + i) % STAGES) */
            const int r = base + i, s = r % STAGES, prev = (r + STAGES - 1) % STAGES;
            const uint32_t ph = (r / STAGES) & 1;
            nbc_mbar_wait(bar0 + 8 * s, ph);
            nbc_dequant_any<FMT, ACT, KG>(smem + L::W_OFF + s * L::W_STAGE + rbl * CB, stab, g, t, scale_bf16, a);
            const uint32_t xs = nbc_smem_u32(smem + L::X_OFF + s * L::X_STAGE);
#pragma unroll
            for (int h = 0; h < 2; h++) {
                if (h == 1) nbc_mbar_wait(bar0 + 8 * (STAGES + s), ph);
                wgmma_fence();
#pragma unroll
                for (int j = 4 * h; j < 4 * h + 4; j++)
                    wgmma_tile<ACT, BN>(acc, a[j][0], a[j][1], a[j][2], a[j][3],
                                        desc_sw128(xs + h * (BN * 128) + (j & 3) * 32), 1);
                wgmma_commit();
                if (i > 0) { /* the previous chunk's half h is done: release it (each thread, after its reads) */
                    wgmma_wait<2>();
                    nbc_mbar_arrive(bar0 + 8 * ((2 + h) * STAGES + prev));
                }
            }
        };
        for (int i = 0; i < nch; i += 2) {
            chunk(i, fa);
            if (i + 1 < nch) chunk(i + 1, fb);
        }
    } else {
        auto chunk = [&](int i, uint32_t (&a)[8][4]) { /* the CTA's chunk i (stage (base + i) % STAGES) */
            const int r = base + i, s = r % STAGES;
            nbc_mbar_wait(bar0 + 8 * s, (r / STAGES) & 1);
            nbc_dequant_any<FMT, ACT, KG>(smem + L::W_OFF + s * L::W_STAGE + rbl * CB, stab, g, t, scale_bf16, a);
            const uint32_t xs = nbc_smem_u32(smem + L::X_OFF + s * L::X_STAGE);
            wgmma_fence();
#pragma unroll
            for (int j = 0; j < 8; j++)
                wgmma_tile<ACT, BN>(acc, a[j][0], a[j][1], a[j][2], a[j][3],
                                    desc_sw128(xs + (j >> 2) * (BN * 128) + (j & 3) * 32), 1);
            wgmma_commit();
        };
        auto retire = [&](int i) { /* chunk i's wgmmas are done: release its stage */
            nbc_mbar_arrive(bar0 + 8 * (STAGES + (base + i) % STAGES)); /* each thread, after its own reads */
        };
        for (int i = 0; i < nch; i += 2) {
            chunk(i, fa);
            if (i > 0) {
                wgmma_wait<1>();
                retire(i - 1);
            }
            if (i + 1 < nch) {
                chunk(i + 1, fb);
                wgmma_wait<1>();
                retire(i);
            }
        }
    }
    wgmma_wait<0>();
}

/* A consumer thread releases stage s, held past its last chunk for an
 * epilogue staged there (the stream-K segments, the MoE tiles), after its
 * own reads and writes of it: the proxy fence orders those before the
 * producer's next TMA write to the stage. */
template <int BN, int STAGES>
__device__ __forceinline__ void sm90_release_held(uint32_t bar0, int s) {
    asm volatile("fence.proxy.async.shared::cta;" ::: "memory");
    if constexpr (SM90_HALF(BN)) {
        nbc_mbar_arrive(bar0 + 8 * (2 * STAGES + s));
        nbc_mbar_arrive(bar0 + 8 * (3 * STAGES + s));
    } else {
        nbc_mbar_arrive(bar0 + 8 * (STAGES + s));
    }
}

/* Thread 0 initializes the stages' mbarriers (see sm90_produce for their
 * places); the caller's __syncthreads publishes them. */
template <int BN, int STAGES, int CWG>
__device__ __forceinline__ void sm90_init_barriers(uint32_t bar0) {
    if (threadIdx.x != 0) return;
    if constexpr (SM90_HALF(BN)) {
        for (int s = 0; s < 4 * STAGES; s++) nbc_mbar_init(bar0 + 8 * s, s < 2 * STAGES ? 1 : 256);
    } else {
        for (int s = 0; s < STAGES; s++) {
            nbc_mbar_init(bar0 + 8 * s, 1);                    /* the producer's arrive + the copy bytes */
            nbc_mbar_init(bar0 + 8 * (STAGES + s), 128 * CWG); /* every consumer thread arrives */
        }
    }
    nbc_mbar_init_fence();
}

/* Split-K: each CTA of the tile stores its accumulators (float4 i of
 * consumer thread c at 4 (256 i + c): coalesced), and the last to arrive
 * sums them in split order, so the result does not depend on timing.
 * Returns false in every CTA but that one. */
template <int BN, int CWG>
__device__ __forceinline__ bool sm90_split_reduce(const Sm90Params &p, int tile, int split, int *flag,
                                                  float (&acc)[BN / 2]) {
    constexpr int NC = 128 * CWG; /* consumer threads */
    const int c = threadIdx.x - 128;
    const int ntiles = p.ws_tiles;
    tile -= p.tile0; /* (a tail launch's tiles: their own rows of the workspace and counters) */
    float4 *mine = (float4 *)p.partial + ((size_t)split * ntiles + tile) * (NC * BN / 8) + c;
#pragma unroll
    for (int i = 0; i < BN / 8; i++)
        __stcg(mine + NC * i, make_float4(acc[4 * i], acc[4 * i + 1], acc[4 * i + 2], acc[4 * i + 3]));
    if (!nbc_split_last<NC>(&p.counters[tile], p.splits, flag, c == 0)) return false; /* the consumer warpgroups */
#pragma unroll
    for (int i = 0; i < BN / 2; i++) acc[i] = 0.0f;
    for (int s = 0; s < p.splits; s++) {
        const float4 *part = (const float4 *)p.partial + ((size_t)s * ntiles + tile) * (NC * BN / 8) + c;
#pragma unroll
        for (int i = 0; i < BN / 8; i++) {
            const float4 v = __ldcg(part + NC * i);
            acc[4 * i] += v.x, acc[4 * i + 1] += v.y, acc[4 * i + 2] += v.z, acc[4 * i + 3] += v.w;
        }
    }
    if (c == 0) p.counters[tile] = 0; /* ready for the next call */
    return true;
}

/* stmatrix .x4 .trans (PTX ISA "Warp-level matrix store instruction:
 * stmatrix"): four 8x8 matrices of 16-bit values held in the mma fragment
 * layout (r[q]: matrix q), each stored transposed, its eight rows at the
 * addresses lanes 8q .. 8q + 7 give. */
__device__ __forceinline__ void stsm_x4_trans(uint32_t a, const uint32_t (&r)[4]) {
    asm volatile("stmatrix.sync.aligned.m8n8.x4.trans.shared.b16 [%0], {%1, %2, %3, %4};"
                 ::"r"(a), "r"(r[0]), "r"(r[1]), "r"(r[2]), "r"(r[3])
                 : "memory");
}

/* A thread's BN / 2 accumulators into a tile staged as token rows of ROWB
 * bytes (16-byte pieces, XOR-swizzled by token), by stmatrix .x4 .trans:
 * matrix q = (token group i + q / 2, rows g + 8 (q & 1)); lane L gives the
 * address of row L & 7 of matrix L / 8, which .trans makes token
 * 8 (i + L / 16) + (L & 7), piece 2 rbl + (L / 8 & 1).  pack(e, h): the
 * 16-bit pair of accumulators e and e + 1 (h: of row g + 8).  Used by
 * sm90_store_tile and sm90_moe_store_staged (down). */
template <int BN, int ROWB, class Pack>
__device__ __forceinline__ void stsm_tile_rows(uint32_t base, int rbl, Pack &&pack) {
    const int lane = threadIdx.x & 31;
#pragma unroll
    for (int i = 0; i < BN / 8; i += 2) {
        uint32_t r[4];
#pragma unroll
        for (int q = 0; q < 4; q++) r[q] = pack(4 * (i + q / 2) + 2 * (q & 1), q & 1);
        const int tk = 8 * (i + (lane >> 4)) + (lane & 7), c = 2 * rbl + ((lane >> 3) & 1);
        stsm_x4_trans(base + (uint32_t)(tk * ROWB + ((c ^ (tk & 7)) << 4)), r);
    }
}

/* The staged epilogue's pieces (sm90_store_tile, sm90_cluster_reduce): a
 * thread's scale and the bias of its rows g and g + 8 (of its warp's 16),
 * set once; the packing of two tokens of one row; the stmatrix of one group
 * of 8 tokens (two 8x8 matrices, rows g and g + 8: lanes 0..15 give the
 * addresses of their token rows); the 16-byte stores of ntok staged token
 * rows. */
template <int CWG>
struct Sm90Stage {
    static constexpr int ROWB = SM90_ROWS(CWG) * 2; /* bytes of one token row of the tile */
    float p2, ts, b[2];
    bool has_bias;
    template <int ACT>
    __device__ __forceinline__ void init(const Sm90Params &p, int row_t0, int rbl, int g) {
        p2 = ldexpf(1.0f, p.exp_shift);
        ts = p.ts;
        has_bias = p.bias != NULL;
        const int r0 = row_t0 + 16 * rbl + g;
        b[0] = has_bias && r0 < p.n ? nbc_load(ACT, p.bias, (size_t)r0) : 0.0f;
        b[1] = has_bias && r0 + 8 < p.n ? nbc_load(ACT, p.bias, (size_t)r0 + 8) : 0.0f;
    }
    template <int ACT>
    __device__ __forceinline__ uint32_t pack(float a, float c, int h) const {
        return nbc_pack2<ACT>(nbc_epi(a, p2, ts, has_bias, b[h]), nbc_epi(c, p2, ts, has_bias, b[h]));
    }
    template <int ACT>
    __device__ __forceinline__ void put8(uint32_t base, int tk0, int rbl, float v0, float v1, float v2, float v3) const {
        const uint32_t r0 = pack<ACT>(v0, v1, 0), r1 = pack<ACT>(v2, v3, 1);
        const int lane = threadIdx.x & 31, tk = tk0 + (lane & 7), c = 2 * rbl + ((lane >> 3) & 1);
        const uint32_t a = base + (uint32_t)(tk * ROWB + ((c ^ (tk & 7)) << 4));
        asm volatile("stmatrix.sync.aligned.m8n8.x2.trans.shared.b16 [%0], {%1, %2};" ::"r"(a), "r"(r0), "r"(r1)
                     : "memory");
    }
};

template <int ACT, int CWG>
__device__ __forceinline__ void sm90_store_staged(const Sm90Params &p, uint32_t base, int ntok, int row_t0, int tok0,
                                                  int lo) {
    constexpr int NC = 128 * CWG, ROWB = Sm90Stage<CWG>::ROWB, CH = ROWB / 16; /* 16-byte pieces per token row */
    typedef uint16_t T;
#pragma unroll 4
    for (int idx = threadIdx.x - 128; idx < ntok * CH; idx += NC) {
        const int tk = idx / CH, c = idx % CH;
        const int tok = tok0 + tk, row = row_t0 + 8 * c;
        if (tok < lo || tok >= p.m || row >= p.n) continue;
        uint4 v;
        asm volatile("ld.shared.v4.u32 {%0, %1, %2, %3}, [%4];"
                     : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
                     : "r"(base + (uint32_t)(tk * ROWB + ((c ^ (tk & 7)) << 4))));
        T *dst = (T *)p.y + (int64_t)tok * p.ldc + row;
        if (row + 8 <= p.n) {
            *(uint4 *)dst = v;
        } else {
            for (int e = 0; e < p.n - row; e++) { /* (no indexed array: it would live on the stack) */
                const uint32_t w = e < 2 ? v.x : e < 4 ? v.y : e < 6 ? v.z : v.w;
                dst[e] = (T)(w >> (16 * (e & 1)));
            }
        }
    }
}

/* Split-K within a cluster (p.cluster): the `splits` CTAs of a tile are one
 * cluster, co-scheduled by the hardware, so they can wait for each other.
 * Each puts its accumulators in its own shared memory (float4 i of consumer
 * thread c at 16 (NC i + c), over the stages, idle once every consumer
 * warpgroup's wgmmas have retired); after a cluster barrier it sums its
 * share of the tile, the float4s [i0, i1) of every thread, reading the
 * splits' partials from their shared memory in split order (the same
 * additions in the same order as sm90_split_reduce: the same bits), and
 * stores it; a second cluster barrier keeps every CTA's shared memory alive
 * until the others have read it.  The producer warpgroup has exited by then
 * (barrier.cluster counts the non-exited threads).  No workspace, and the
 * sum is spread over the tile's CTAs instead of falling on the last one.
 * Every consumer thread calls it; rank (the CTA's rank in the cluster, whose
 * CTAs are consecutive along x) is its split. */
template <int ACT, int BN, int CWG>
__device__ __forceinline__ void sm90_cluster_reduce(const Sm90Params &p, uint8_t *smem, int rank, float (&acc)[BN / 2],
                                                    int rbl, int row_t0, int tok0, int lo, int g, int t, bool staged) {
    constexpr int NC = 128 * CWG, NV = BN / 8; /* consumer threads; float4s per thread */
    typedef Sm90Stage<CWG> St;
    const int c = threadIdx.x - 128, S = p.splits;
    nbc_split_barrier<NC>(); /* every consumer warpgroup is past its last wgmma: the stages are free */
    float4 *mine = (float4 *)smem + c;
#pragma unroll
    for (int i = 0; i < NV; i++) mine[NC * i] = make_float4(acc[4 * i], acc[4 * i + 1], acc[4 * i + 2], acc[4 * i + 3]);
    cluster_sync(); /* every split's partial is in place */
    const int i0 = rank * NV / S, i1 = (rank + 1) * NV / S;
    const uint32_t base = nbc_smem_u32(smem) + 16u * (uint32_t)c;
    /* staged: the share rounded to 16 bits, token-major past the partials (which the other CTAs still read) */
    const uint32_t sbase = nbc_smem_u32(smem) + (uint32_t)(NC * NV * 16);
    St st;
    st.template init<ACT>(p, row_t0, rbl, g);
    for (int i = i0; i < i1; i++) {
        float v[4] = {0.0f, 0.0f, 0.0f, 0.0f};
        for (int r = 0; r < S; r++) {
            const float4 q = cluster_ld16(cluster_map(base + 16u * NC * (uint32_t)i, r));
            v[0] += q.x, v[1] += q.y, v[2] += q.z, v[3] += q.w;
        }
        if (staged)
            st.template put8<ACT>(sbase, 8 * (i - i0), rbl, v[0], v[1], v[2], v[3]);
        else
            nbc_store_block<ACT, 1>(v, row_t0 + 16 * rbl, tok0 + 8 * i, g, t, p.m, p.n, p.ldc, p.y, p.bias, p.exp_shift,
                                    p.ts);
    }
    if (staged) {
        nbc_split_barrier<NC>(); /* the share is in shared memory */
        sm90_store_staged<ACT, CWG>(p, sbase, 8 * (i1 - i0), row_t0, tok0 + 8 * i0, lo);
    }
    cluster_sync(); /* no CTA reads this one's shared memory any more */
}

/* The epilogue through shared memory (y 16-byte aligned and ldc a multiple
 * of 8: the caller checks).  Each consumer warp rounds its 16 rows x BN
 * tokens to ACT and writes them transposed with stmatrix.trans into a
 * token-major copy of the tile over the stages (idle once every consumer
 * warpgroup's wgmmas have retired): token row tk holds the tile's rows as
 * 16-byte pieces of 8, piece c at (c ^ (tk & 7)) so that the eight token
 * rows an 8x8 matrix writes fall in eight bank groups.  Then the consumer
 * threads store it, 16 bytes each (a warp: two whole token rows of the
 * tile), where the element-wise epilogue spent a 2-byte store, a 64-bit
 * address and ldexpf per element.  Pieces that run past n are stored
 * element by element.  The cluster split stages its share of the tile the
 * same way (sm90_cluster_reduce). */
template <int ACT, int BN, int CWG>
__device__ __forceinline__ void sm90_store_tile(const Sm90Params &p, uint8_t *smem, const float (&acc)[BN / 2], int rbl,
                                                int row_t0, int tok0, int lo, int g, int t) {
    constexpr int NC = 128 * CWG;            /* consumer threads */
    typedef Sm90Stage<CWG> St;
    St st;
    st.template init<ACT>(p, row_t0, rbl, g);
    const uint32_t base = nbc_smem_u32(smem);
    nbc_split_barrier<NC>(); /* every consumer warpgroup is past its last wgmma: the stages are free */
    stsm_tile_rows<BN, St::ROWB>(base, rbl, [&](int e, int h) { return st.template pack<ACT>(acc[e], acc[e + 1], h); });
    nbc_split_barrier<NC>(); /* the whole tile is in shared memory */
    sm90_store_staged<ACT, CWG>(p, base, BN, row_t0, tok0, lo);
}

/* The start of every kernel here: its shared memory aligned to 1024 bytes
 * (the 128-byte swizzle) by offsetting smem_raw itself, so that the compiler
 * still knows every access is to shared memory (LDS, not generic loads); the
 * scale table and the barriers in it (layout L); the thread's warp, lane
 * and warpgroup. */
#define SM90_KERNEL_START(L)                                                              \
    extern __shared__ uint8_t smem_raw[];                                                 \
    uint8_t *smem = smem_raw + ((1024u - (nbc_smem_u32(smem_raw) & 1023u)) & 1023u);      \
    uint32_t *stab = (uint32_t *)(smem + L::TAB_OFF);                                     \
    const uint32_t bar0 = nbc_smem_u32(smem + L::BAR_OFF);                                \
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;                           \
    const int wg = warp >> 2

/* The producer warpgroup gives registers to the consumers (640 threads of
 * four consumer warpgroups start at 96 registers; with the producer at 24
 * they fit 112 in the 64K of the SM). */
template <int CWG>
__device__ __forceinline__ void sm90_producer_regs() {
    if constexpr (CWG == 4) asm volatile("setmaxnreg.dec.sync.aligned.u32 24;");
    else asm volatile("setmaxnreg.dec.sync.aligned.u32 40;");
}
template <int CWG>
__device__ __forceinline__ void sm90_consumer_regs() {
    if constexpr (CWG == 4) asm volatile("setmaxnreg.inc.sync.aligned.u32 112;");
    else asm volatile("setmaxnreg.inc.sync.aligned.u32 232;");
}

/* A finished tile's epilogue, accumulator (row, token) -> Y[token, row]:
 * through shared memory at `stage` (staged) or element by element.  Its
 * activation rows started at x0, its own tokens at tm * BN. */
template <int ACT, int BN, int CWG>
__device__ __forceinline__ void sm90_store_result(const Sm90Params &p, uint8_t *stage, const float (&acc)[BN / 2],
                                                  int rbl, int rb0, int x0, int tm, int g, int t, bool staged) {
    if (staged)
        sm90_store_tile<ACT, BN, CWG>(p, stage, acc, rbl, rb0 * 16, x0, tm * BN, g, t);
    else
        nbc_store_block<ACT, BN / 8>(acc, (rb0 + rbl) * 16, tm * BN, g, t, p.m, p.n, p.ldc, p.y, p.bias, p.exp_shift,
                                     p.ts);
}

/* The first activation row of token tile tm: tm * BN, except that the last
 * tile of a batch that does not fill it moves back inside m (m > BN), so
 * that no TMA box runs past the activations' rows: the tile recomputes the
 * previous tile's last tokens and stores from tm * BN on only (lo).  Boxes
 * that ran past the end cost the whole call 8-14% on an H100 (m = 384 in
 * 256-token tiles took longer than m = 512: 8192 -> 57344 708 against 651
 * us, 4096 -> 28672 198 against 174; NOTES.md).  Only where the output is
 * stored through shared memory (sm90_store_staged, which has the lower
 * bound); the element-wise store keeps tm * BN. */
template <int BN>
__device__ __forceinline__ int sm90_x0(const Sm90Params &p, int tm) {
    const bool staged = (((uintptr_t)p.y & 15) | (p.ldc & 7)) == 0;
    return staged && p.m > BN ? min(tm * BN, p.m - BN) : tm * BN;
}
#endif

template <int FMT, int ACT, int KG, int BN, int STAGES, int CWG>
__global__ void __launch_bounds__(SM90_THREADS(CWG), 1)
    gemm_sm90_kernel(const __grid_constant__ CUtensorMap xmap, const Sm90Params p) {
#ifdef NB_SM90_DEVICE
    if constexpr (KG == 0) NBC_CHECK_KERNEL_FORMAT(FMT);
    typedef Sm90Smem<FMT, KG, BN, STAGES, CWG> L;
    SM90_KERNEL_START(L);
    const int tile = p.tile0 + blockIdx.x / p.splits, split = blockIdx.x % p.splits;
    int tn, tm;
    nbc_raster(tile, p.group, p.tiles_n, p.tiles_m, tn, tm);
    constexpr int RB = SM90_ROWS(CWG) / 16; /* row blocks per tile */
    const int rb0 = tn * RB;
    const int nrb = min(RB, p.row_blocks - rb0);
    /* this CTA's k chunks (the planner gives each split at least one) */
    const int c0 = split * p.cps, nch = min(p.cps, p.kchunks - c0);
    const int x0 = sm90_x0<BN>(p, tm); /* the tile's first activation row */

    nbc_load_scale_table<SM90_THREADS(CWG)>(stab, p.stab);
    sm90_init_barriers<BN, STAGES, CWG>(bar0);
    __syncthreads();

    if (wg == 0) {
        sm90_producer_regs<CWG>();
        if (warp == 0 && lane == 0)
            sm90_produce<FMT, KG, BN, STAGES, CWG, false>(&xmap, p, NULL, smem, bar0, c0, nch, rb0, nrb, x0, 0);
        return;
    }

    /* Consumers. */
    sm90_consumer_regs<CWG>();
    const int g = lane >> 2, t = lane & 3;
    const int rbl = 4 * (wg - 1) + (warp & 3); /* row block within the tile */
    float acc[BN / 2];
#pragma unroll
    for (int i = 0; i < BN / 2; i++) acc[i] = 0.0f;
    sm90_consume<FMT, ACT, KG, BN, STAGES, CWG>(smem, stab, p.scale_bf16, bar0, nch, rbl, g, t, acc, 0);
    asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
    const bool staged = (((uintptr_t)p.y & 15) | (p.ldc & 7)) == 0; /* 16-byte stores of the output */
    if (p.cluster) {
        sm90_cluster_reduce<ACT, BN, CWG>(p, smem, split, acc, rbl, rb0 * 16, x0, tm * BN, g, t, staged);
        return;
    }
    if (p.splits > 1 && !sm90_split_reduce<BN, CWG>(p, tile, split, (int *)(smem + L::FLAG_OFF), acc)) return;
    sm90_store_result<ACT, BN, CWG>(p, smem, acc, rbl, rb0, x0, tm, g, t, staged);
#endif
}

/* ------------------------------------------------ stream-K schedule */

/* The stream-K grid (the planner's choice where the tiles leave a wave
 * partly idle, plan.c tc_stream_k): a layer's tiles times its k chunks are
 * units numbered tile-major (the raster order), and CTA b of the G in the
 * grid (G at most one per SM: every CTA resident at once) walks units
 * [b U / G, (b + 1) U / G), every CTA the same number of chunks give or
 * take one.  Its range falls into segments, one per tile it touches, which
 * run one after another through the same ring of stages (the ring position
 * carries on: sm90_produce / sm90_consume's base), so the producer loads
 * the next segment while the consumers finish the last.  A segment is
 *   - a whole tile: stored as gemm_sm90_kernel stores one;
 *   - the start of a tile (k from 0, the CTA's last segment): the tile's
 *     owner.  It waits until the CTAs after it that hold the rest of the
 *     tile have left their partials in the workspace, adds them to its own
 *     in k order (the result does not depend on timing), stores the tile
 *     and zeroes the tile's counter for the next call;
 *   - the rest of a tile (k from the middle, the CTA's first segment): its
 *     FP32 accumulators go to workspace slot b (one per CTA: only a first
 *     segment starts in the middle of a tile), then it counts itself in.
 * An owner waits only for other CTAs' first segments, which wait for
 * nothing, and all G CTAs are resident together, so the wait always ends.
 * The epilogue of a segment that is not the CTA's last stages its tile in
 * the activation part of the stage its last chunk used (BN x 128 rows x 2
 * bytes: exactly that part), so that stage is released only after the
 * epilogue; the producer meanwhile fills the others. */
#ifdef NB_SM90_DEVICE
/* Owner of a split tile: wait for the partials of the `need` CTAs after
 * b, then add them to acc in CTA order (k order). */
template <int BN, int CWG>
__device__ __forceinline__ void sm90_sk_gather(const Sm90Params &p, int tile, int b, int need, float (&acc)[BN / 2]) {
    constexpr int NC = 128 * CWG; /* consumer threads */
    const int c = threadIdx.x - 128;
    if (c == 0) {
        int got;
        for (;;) {
            asm volatile("ld.acquire.gpu.global.s32 %0, [%1];" : "=r"(got) : "l"(p.counters + tile) : "memory");
            if (got >= need) break;
            __nanosleep(32);
        }
        p.counters[tile] = 0; /* every partial is in: ready for the next call */
    }
    nbc_split_barrier<NC>(); /* (after the acquire load: the partials before every thread's loads) */
    for (int j = 1; j <= need; j++) {
        const float4 *part = (const float4 *)p.partial + (size_t)(b + j) * (NC * BN / 8) + c;
#pragma unroll
        for (int i = 0; i < BN / 8; i++) {
            const float4 v = __ldcg(part + NC * i);
            acc[4 * i] += v.x, acc[4 * i + 1] += v.y, acc[4 * i + 2] += v.z, acc[4 * i + 3] += v.w;
        }
    }
}

/* The rest of a tile: this CTA's partial to slot b, then count it in. */
template <int BN, int CWG>
__device__ __forceinline__ void sm90_sk_leave(const Sm90Params &p, int tile, int b, const float (&acc)[BN / 2]) {
    constexpr int NC = 128 * CWG;
    const int c = threadIdx.x - 128;
    float4 *mine = (float4 *)p.partial + (size_t)b * (NC * BN / 8) + c;
#pragma unroll
    for (int i = 0; i < BN / 8; i++)
        __stcg(mine + NC * i, make_float4(acc[4 * i], acc[4 * i + 1], acc[4 * i + 2], acc[4 * i + 3]));
    nbc_split_barrier<NC>();
    if (c == 0) {
        nbc_fence_acq_rel_gpu(); /* release: every consumer thread's partial, then the count */
        atomicAdd(p.counters + tile, 1);
    }
}
#endif

template <int FMT, int ACT, int KG, int BN, int STAGES, int CWG>
__global__ void __launch_bounds__(SM90_THREADS(CWG), 1)
    gemm_sm90_sk_kernel(const __grid_constant__ CUtensorMap xmap, const Sm90Params p) {
#ifdef NB_SM90_DEVICE
    if constexpr (KG == 0) NBC_CHECK_KERNEL_FORMAT(FMT);
    typedef Sm90Smem<FMT, KG, BN, STAGES, CWG> L;
    SM90_KERNEL_START(L);
    constexpr int RB = SM90_ROWS(CWG) / 16; /* row blocks per tile */
    const int b = blockIdx.x, G = gridDim.x;
    const int64_t K = p.kchunks, U = (int64_t)p.tiles_n * p.tiles_m * K;
    const int64_t u0 = (int64_t)b * U / G, u1 = (int64_t)(b + 1) * U / G;

    nbc_load_scale_table<SM90_THREADS(CWG)>(stab, p.stab);
    sm90_init_barriers<BN, STAGES, CWG>(bar0);
    __syncthreads();

    if (wg == 0) {
        sm90_producer_regs<CWG>();
        if (warp == 0 && lane == 0) {
            int base = 0;
            for (int64_t u = u0; u < u1;) {
                const int tile = (int)(u / K), kc0 = (int)(u - tile * K), nch = (int)min(K - kc0, u1 - u);
                int tn, tm;
                nbc_raster(tile, p.group, p.tiles_n, p.tiles_m, tn, tm);
                const int rb0 = tn * RB, nrb = min(RB, p.row_blocks - rb0);
                sm90_produce<FMT, KG, BN, STAGES, CWG, false>(&xmap, p, NULL, smem, bar0, kc0, nch, rb0, nrb,
                                                              sm90_x0<BN>(p, tm), base);
                base += nch, u += nch;
            }
        }
        return;
    }

    sm90_consumer_regs<CWG>();
    const int g = lane >> 2, t = lane & 3;
    const int rbl = 4 * (wg - 1) + (warp & 3);
    const bool staged = (((uintptr_t)p.y & 15) | (p.ldc & 7)) == 0;
    int base = 0;
    for (int64_t u = u0; u < u1;) {
        const int tile = (int)(u / K), kc0 = (int)(u - tile * K), nch = (int)min(K - kc0, u1 - u);
        const bool last = u + nch == u1;
        int tn, tm;
        nbc_raster(tile, p.group, p.tiles_n, p.tiles_m, tn, tm);
        const int rb0 = tn * RB;
        float acc[BN / 2];
#pragma unroll
        for (int i = 0; i < BN / 2; i++) acc[i] = 0.0f;
        sm90_consume<FMT, ACT, KG, BN, STAGES, CWG>(smem, stab, p.scale_bf16, bar0, nch, rbl, g, t, acc, base);
        if (last) asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
        const int sl = (base + nch - 1) % STAGES; /* the stage of this segment's last chunk, still held */
        if (kc0 > 0) {
            sm90_sk_leave<BN, CWG>(p, tile, b, acc);
        } else {
            if (nch < K) { /* the tile's owner: the CTAs after it hold the rest */
                const int64_t end = (int64_t)(tile + 1) * K;
                int need = 0;
                while (b + need + 1 < G && (int64_t)(b + need + 1) * U / G < end) need++;
                sm90_sk_gather<BN, CWG>(p, tile, b, need, acc);
            }
            sm90_store_result<ACT, BN, CWG>(p, smem + L::X_OFF + sl * L::X_STAGE, acc, rbl, rb0, sm90_x0<BN>(p, tm),
                                            tm, g, t, staged);
        }
        if (!last) sm90_release_held<BN, STAGES>(bar0, sl);
        base += nch, u += nch;
    }
#endif
}

/* ------------------------------------------------- grouped tiles (MoE) */

/* The mixture-of-experts projections at prefill batch sizes (moe.cu): the
 * same producer and consumers over one expert's packed weight per tile.
 * The routing layout is padded to the tile width (nb_moe_align with block
 * BN), so each token tile tm belongs to one expert e = blockexp[tm]; its
 * activations are BN consecutive rows of a compact input (the gathered
 * token rows xg for gate_up, h for down: expert e's rows start at
 * ustart[e], without padding), loaded by TMA from row
 * ustart[e] + tm * BN - offsets[e].  Rows past the expert's count belong to
 * the next expert (or are TMA's zeros past the end): they are multiplied
 * and never stored, because the epilogue stores only the columns whose
 * layout entry is a slot.  gate_up: h [ustart[e] + j, i] = act(gate i,
 * up i) (the packed row block holds gate rows then up rows, so a thread's
 * rows g and g+8 are gate i and up i); down: o [slot, c] = dot + bias. */
struct Sm90MoeParams {
    Sm90Params g;      /* w: expert 0's packed weight; row_blocks, kchunks, tiles_n, exp_shift, stab */
    size_t stride;     /* packed bytes per expert */
    const float *tscale;
    nbc_moe_epi epi;   /* h [slots, I] (compact rows) or o [slots, H], biases, activation */
    const int32_t *sorted, *blockexp, *offsets, *ustart;
    int sentinel;
    int tiles; /* routing blocks the grid walks (the planner's bound on those a routing can fill) */
};

#ifdef NB_SM90_DEVICE
/* The MoE tiles' epilogue through shared memory (out 16-byte aligned and
 * ldo a multiple of 8: the caller checks), as sm90_store_tile's: the
 * consumer warps round their results to ACT and write them token-major with
 * stmatrix.trans over the idle stages, then every consumer thread stores
 * 16-byte pieces to the token's output row.  gate_up (MODE 0): a warp's 8
 * outputs i = 8 rb + g per token, act(gate + bias, up + bias), one 8x8
 * matrix per 8 tokens, token rows of 64 outputs (the CTA's), compact output
 * rows xrow + token; down (MODE 1): rows 16 rb + g and + 8 plus the bias,
 * token rows of 128 outputs, output row = the token's slot.  Padding tokens
 * (slot >= sentinel), outputs past n_out and row blocks past the weight's
 * are not stored; a piece that runs past n_out is stored element by
 * element.  Every consumer thread calls it (two barriers). */
template <int ACT, int BN, int MODE>
__device__ __forceinline__ void sm90_moe_store_staged(const Sm90MoeParams &q, uint8_t *smem, const float (&acc)[BN / 2],
                                                      int rbl, int rb0, int e, int xrow, const int32_t *srt, float sc,
                                                      int g) {
    constexpr int NC = 256;                      /* consumer threads */
    constexpr int OUT = MODE == 0 ? 8 : 16;      /* outputs of a row block per token */
    constexpr int ROWB = 8 * OUT * 2, CH = ROWB / 16; /* a token row: the CTA's 8 row blocks, 16-byte pieces */
    const nbc_moe_epi &ep = q.epi;
    const int lane = threadIdx.x & 31, rb = rb0 + rbl, n_out = ep.n_out;
    const bool live = rb < q.g.row_blocks;
    const uint32_t base = nbc_smem_u32(smem);
    float b[2] = {0.0f, 0.0f}; /* gate_up: the gate and up biases of output i; down: rows c and c + 8 */
    if (ep.bias && live) {
        if (MODE == 0) {
            const int i = 8 * rb + g;
            if (i < n_out) {
                const int64_t I = n_out, rg = ep.interleaved ? 2 * i : i, ru = ep.interleaved ? 2 * i + 1 : I + i;
                b[0] = nbc_load(ACT, ep.bias, (size_t)(e * 2 * I + rg));
                b[1] = nbc_load(ACT, ep.bias, (size_t)(e * 2 * I + ru));
            }
        } else {
#pragma unroll
            for (int h = 0; h < 2; h++) {
                const int c = 16 * rb + g + 8 * h;
                if (c < n_out) b[h] = nbc_load(ACT, ep.bias, (size_t)e * n_out + c);
            }
        }
    }
    nbc_split_barrier<NC>(); /* every consumer warpgroup is past its last wgmma: the stages are free */
    if (MODE == 0) {
        /* stmatrix .x4: matrix q = token group i + q; lane L: token 8 (i + L / 8) + (L & 7), piece rbl;
         * one instance of the loop per activation (no branch per element) */
        const float nc = nbc_moe_act_c(ep.activation, ep.alpha);
        auto stage = [&](auto swiglu) {
            constexpr int AV = decltype(swiglu)::value ? NB_MOE_ACT_SWIGLU : NB_MOE_ACT_SWIGLU_OAI;
#pragma unroll
            for (int i = 0; i < BN / 8; i += 4) {
                uint32_t r[4];
#pragma unroll
                for (int m = 0; m < 4; m++) {
                    float v[2];
#pragma unroll
                    for (int j = 0; j < 2; j++) {
                        float gate = acc[4 * (i + m) + j] * sc, up = acc[4 * (i + m) + 2 + j] * sc;
                        if (ep.bias) gate += b[0], up += b[1];
                        v[j] = nbc_moe_act_k<AV>(ep.limit, nc, gate, up);
                    }
                    r[m] = nbc_pack2<ACT>(v[0], v[1]);
                }
                const int tk = 8 * (i + (lane >> 3)) + (lane & 7);
                const uint32_t a = base + (uint32_t)(tk * ROWB + ((rbl ^ (tk & 7)) << 4));
                stsm_x4_trans(a, r);
            }
        };
        if (ep.activation == NB_MOE_ACT_SWIGLU) stage(nbc_flag<true>{});
        else stage(nbc_flag<false>{});
    } else {
        stsm_tile_rows<BN, ROWB>(base, rbl, [&](int x, int h) {
            float lo = acc[x] * sc, hi = acc[x + 1] * sc;
            if (ep.bias) lo += b[h], hi += b[h];
            return nbc_pack2<ACT>(lo, hi);
        });
    }
    nbc_split_barrier<NC>(); /* the whole tile is in shared memory */
    typedef uint16_t T;
#pragma unroll 4
    for (int idx = threadIdx.x - 128; idx < BN * CH; idx += NC) {
        const int tk = idx / CH, c = idx % CH;
        const int slot = srt[tk];
        const int o0 = MODE == 0 ? 8 * (rb0 + c) : 16 * rb0 + 8 * c; /* the piece's first output */
        if (slot >= q.sentinel || o0 >= n_out || rb0 + (MODE == 0 ? c : c / 2) >= q.g.row_blocks) continue;
        uint4 v;
        asm volatile("ld.shared.v4.u32 {%0, %1, %2, %3}, [%4];"
                     : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
                     : "r"(base + (uint32_t)(tk * ROWB + ((c ^ (tk & 7)) << 4))));
        const int64_t row = MODE == 0 ? (int64_t)xrow + tk : (int64_t)slot;
        T *dst = (T *)ep.out + row * ep.ldo + o0;
        if (o0 + 8 <= n_out) {
            *(uint4 *)dst = v;
        } else {
            for (int x = 0; x < n_out - o0; x++) { /* (no indexed array: it would live on the stack) */
                const uint32_t w = x < 2 ? v.x : x < 4 ? v.y : x < 6 ? v.z : v.w;
                dst[x] = (T)(w >> (16 * (x & 1)));
            }
        }
    }
}
#endif

template <int FMT, int ACT, int BN, int STAGES, int MODE>
__global__ void __launch_bounds__(SM90_THREADS(2), 1)
    moe_sm90_kernel(const __grid_constant__ CUtensorMap xmap, const Sm90MoeParams q) {
#ifdef NB_SM90_DEVICE
    NBC_CHECK_KERNEL_FORMAT(FMT);
    constexpr int CWG = 2;
    typedef Sm90Smem<FMT, 0, BN, STAGES, CWG> L;
    const Sm90Params &p = q.g;
    constexpr int RB = SM90_ROWS(CWG) / 16;
    /* Persistent: CTA b of G walks tiles b, b + G, ... (token-tile major:
     * tile / tiles_n is the routing block) until the first routing block
     * past the padded total (expert -1; every later one is too), all of
     * them through one ring of stages (the ring position `base` carries
     * on), so the producer loads the next tile while the consumers finish
     * one, and a CTA pays its prologue once.  (The layout is complete
     * before this grid starts: the kernel before it lets it launch only
     * after its own griddepcontrol.wait; the producer waits for that
     * kernel's output before its first load.) */
    const int G = gridDim.x;
    const int64_t ntiles = (int64_t)q.tiles * p.tiles_n;
    auto expert_of = [&](int64_t tile) { return tile < ntiles ? q.blockexp[tile / p.tiles_n] : -1; };
    int64_t tile = blockIdx.x;
    int e = expert_of(tile);
    if (e < 0) return;
    SM90_KERNEL_START(L);

    nbc_load_scale_table<SM90_THREADS(CWG)>(stab, p.stab);
    sm90_init_barriers<BN, STAGES, CWG>(bar0);
    __syncthreads();
    if (wg == 0) {
        sm90_producer_regs<2>();
        if (warp == 0 && lane == 0)
            for (int base = 0; e >= 0; base += p.kchunks) {
                const int tm = (int)(tile / p.tiles_n), tn = (int)(tile % p.tiles_n);
                const int rb0 = tn * RB, nrb = min(RB, p.row_blocks - rb0);
                const int xrow = q.ustart[e] + tm * BN - q.offsets[e];
                sm90_produce<FMT, 0, BN, STAGES, CWG, true>(&xmap, p, p.w + (size_t)e * q.stride, smem, bar0, 0,
                                                         p.kchunks, rb0, nrb, xrow, base);
                tile += G;
                e = expert_of(tile);
            }
        return;
    }
    sm90_consumer_regs<2>();
    const int g = lane >> 2, t = lane & 3;
    const int rbl = 4 * (wg - 1) + (warp & 3); /* this warp's row block within the tile */
    const bool staged = (((uintptr_t)q.epi.out & 15) | (q.epi.ldo & 7)) == 0; /* 16-byte stores (every warp: barriers) */
    for (int base = 0; e >= 0; base += p.kchunks) {
        const int tm = (int)(tile / p.tiles_n), tn = (int)(tile % p.tiles_n);
        const int rb0 = tn * RB, rb = rb0 + rbl;
        const int xrow = q.ustart[e] + tm * BN - q.offsets[e];
        const int next = expert_of(tile + G); /* (the layout is read-only here) */
        float acc[BN / 2];
#pragma unroll
        for (int i = 0; i < BN / 2; i++) acc[i] = 0.0f;
        sm90_consume<FMT, ACT, 0, BN, STAGES, CWG>(smem, stab, 0, bar0, p.kchunks, rbl, g, t, acc, base);
        if (next < 0) asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
        /* epilogue: acc[4i + j] is row g at token column 8i + 2t + j, acc[4i + 2 + j] row g + 8; the tile is
         * staged in the activation part of the stage its last chunk used, still held (BN x 256 bytes: down's
         * token rows of 256 bytes exactly, gate_up's of 128 half of it) */
        const int sl = (base + p.kchunks - 1) % STAGES;
        const float sc = ldexpf(1.0f, p.exp_shift) * (q.tscale ? q.tscale[e] : 1.0f);
        const int32_t *srt = q.sorted + (int64_t)tm * BN;
        if (staged) {
            sm90_moe_store_staged<ACT, BN, MODE>(q, smem + L::X_OFF + sl * L::X_STAGE, acc, rbl, rb0, e, xrow, srt,
                                                 sc, g);
        } else if (rb < p.row_blocks) {
#pragma unroll
            for (int i = 0; i < BN / 8; i++)
#pragma unroll
                for (int j = 0; j < 2; j++) {
                    const int col = 8 * i + 2 * t + j, slot = srt[col];
                    if (slot >= q.sentinel) continue; /* padding */
                    const float lo = acc[4 * i + j] * sc, hi = acc[4 * i + 2 + j] * sc;
                    nbc_moe_store<ACT, MODE == 0>(q.epi, e, rb, g, MODE == 0 ? xrow + col : slot, lo, hi);
                }
        }
        if (next >= 0) sm90_release_held<BN, STAGES>(bar0, sl);
        tile += G;
        e = next;
    }
#endif
}

/* ------------------------------------------------------------- dispatch */

typedef void (*sm90_fn)(const CUtensorMap, const Sm90Params);

/* Pipeline depth per tile width: 6, 4, 3, 3 for 64, 128, 192, 256 tokens,
 * the most the 227 KB of an H100 SM allow (the 256-token tile's 74 KB stages
 * leave room for three, the 192-token tile's 57 KB too; deeper 64/128 rings
 * measured no faster: DESIGN.md); 8 for
 * the 16- and 32-token tiles (13-17 KB stages with two consumer warpgroups,
 * 22-27 KB with four), which serve batches of up to 32 tokens on narrow
 * layers. */
#define SM90_STAGES(BN) ((BN) == 256 || (BN) == 192 ? 3 : (BN) == 128 ? 4 : (BN) == 64 ? 6 : 8)
/* The depth of format FMT's instances: int8's 2 KB chunks make a 256-token
 * stage 82 KB, so two of them (the 4-bit formats' 74 KB stages: three);
 * the integer and table formats' 32-token tiles as many of the eight as
 * fit 227 KB (int8 with four consumer warpgroups: 43 KB stages, five; the
 * 4-bit formats' 27-28 KB: eight). */
template <int FMT, int KG>
constexpr int sm90_stages(int bn, int cwg) {
    if constexpr (KG > 0) {
        if (nbc_int_chunk<FMT, KG>::i8 && bn == 256) return 2;
        if (bn <= 32) {
            const int per = bn * 256 + SM90_ROWS(cwg) / 16 * nbc_chunk_bytes<FMT, KG>(), fit = (227 * 1024 - 2200) / per;
            return fit < 8 ? fit : 8;
        }
    }
    return SM90_STAGES(bn);
}
#define SM90_K(BN, CWG) gemm_sm90_kernel<FMT, ACT, KG, BN, sm90_stages<FMT, KG>(BN, CWG), CWG>
#define SM90_CASE(BN, CWG) *smem = Sm90Smem<FMT, KG, BN, sm90_stages<FMT, KG>(BN, CWG), CWG>::BYTES; return SM90_K(BN, CWG)

/* The instances: two consumer warpgroups for every tile width, four for 16
 * and 32 tokens (E2M1 formats, KG = 0; they also have a 192-token tile, for
 * batches of 129..192 or 257..384 tokens: two tiles of 192 where 256-token
 * tiles would leave a third idle); the integer and table formats (kernel
 * group KG) have the 32-token tile (two or four consumer warpgroups: they
 * take the tensor-core path from 17 tokens only) and the 64-, 128- and
 * 256-token tiles. */
template <int FMT, int ACT, int KG>
static sm90_fn sm90_pick_bn(int bn, int cwg, size_t *smem) {
    if constexpr (KG > 0) {
        if (cwg == 4) {
            if (bn == 32) { SM90_CASE(32, 4); }
            return NULL;
        }
        if (cwg != 2) return NULL;
        switch (bn) {
        case 32: SM90_CASE(32, 2);
        case 64: SM90_CASE(64, 2);
        case 128: SM90_CASE(128, 2);
        case 256: SM90_CASE(256, 2);
        }
        return NULL;
    } else {
        if (cwg == 4) {
            if (bn == 16) { SM90_CASE(16, 4); }
            if (bn == 32) { SM90_CASE(32, 4); }
            return NULL;
        }
        if (cwg != 2) return NULL;
        switch (bn) {
        case 16: SM90_CASE(16, 2);
        case 32: SM90_CASE(32, 2);
        case 64: SM90_CASE(64, 2);
        case 128: SM90_CASE(128, 2);
        case 192: SM90_CASE(192, 2);
        case 256: SM90_CASE(256, 2);
        }
        return NULL;
    }
}

/* An integer or table format's instances for its kernel group. */
template <int FMT, int ACT>
static sm90_fn sm90_pick_int(int bn, int cwg, int kg, size_t *smem) {
#define SM90_KG(KG) sm90_pick_bn<FMT, ACT, KG>(bn, cwg, smem)
    return NBC_KG_PICK(kg, SM90_KG);
#undef SM90_KG
}

static sm90_fn sm90_pick(int fmt, int act, int bn, int cwg, int kg, size_t *smem) {
#define SM90_RUNG(F, A) return sm90_pick_bn<F, A, 0>(bn, cwg, smem);
    NBC_LADDER(fmt, act, SM90_RUNG)
#undef SM90_RUNG
#define SM90_INT_RUNG(F, A) return sm90_pick_int<F, A>(bn, cwg, kg, smem);
    NBC_DECODE_LADDER(fmt, act, SM90_INT_RUNG)
#undef SM90_INT_RUNG
    return NULL;
}

/* The stream-K instances: every format's 64-, 128- and 256-token tiles with
 * two consumer warpgroups (the integer and table formats per kernel group). */
template <int FMT, int ACT, int KG>
static sm90_fn sm90_pick_sk_bn(int bn, size_t *smem) {
    if (bn == 64) {
        *smem = Sm90Smem<FMT, KG, 64, sm90_stages<FMT, KG>(64, 2), 2>::BYTES;
        return gemm_sm90_sk_kernel<FMT, ACT, KG, 64, sm90_stages<FMT, KG>(64, 2), 2>;
    }
    if (bn == 128) {
        *smem = Sm90Smem<FMT, KG, 128, sm90_stages<FMT, KG>(128, 2), 2>::BYTES;
        return gemm_sm90_sk_kernel<FMT, ACT, KG, 128, sm90_stages<FMT, KG>(128, 2), 2>;
    }
    if (bn == 256) {
        *smem = Sm90Smem<FMT, KG, 256, sm90_stages<FMT, KG>(256, 2), 2>::BYTES;
        return gemm_sm90_sk_kernel<FMT, ACT, KG, 256, sm90_stages<FMT, KG>(256, 2), 2>;
    }
    return NULL;
}

template <int FMT, int ACT>
static sm90_fn sm90_pick_sk_int(int bn, int kg, size_t *smem) {
#define SM90_SK_KG(KG) sm90_pick_sk_bn<FMT, ACT, KG>(bn, smem)
    return NBC_KG_PICK(kg, SM90_SK_KG);
#undef SM90_SK_KG
}

static sm90_fn sm90_pick_sk(int fmt, int act, int bn, int cwg, int kg, size_t *smem) {
    if (cwg != 2) return NULL;
#define SM90_SK_RUNG(F, A) return sm90_pick_sk_bn<F, A, 0>(bn, smem);
    NBC_LADDER(fmt, act, SM90_SK_RUNG)
#undef SM90_SK_RUNG
#define SM90_SK_INT_RUNG(F, A) return sm90_pick_sk_int<F, A>(bn, kg, smem);
    NBC_DECODE_LADDER(fmt, act, SM90_SK_INT_RUNG)
#undef SM90_SK_INT_RUNG
    return NULL;
}

/* cuTensorMapEncodeTiled through the runtime's driver entry point (no
 * link-time dependency on libcuda). */
static PFN_cuTensorMapEncodeTiled_v12000 tensor_map_encoder(char *err) {
    static PFN_cuTensorMapEncodeTiled_v12000 fn;
    if (fn) return fn;
    void *f = NULL;
    cudaDriverEntryPointQueryResult q;
    cudaError_t e = cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &f, 12000, cudaEnableDefault, &q);
    if (e != cudaSuccess || q != cudaDriverEntryPointSuccess || !f) {
        snprintf(err, NB_ERRBUF, "cuTensorMapEncodeTiled is not available from the driver (%s)", cudaGetErrorString(e));
        return NULL;
    }
    fn = (PFN_cuTensorMapEncodeTiled_v12000)f;
    return fn;
}

/* The launch attribute that makes every s consecutive CTAs one cluster. */
static cudaLaunchAttribute sm90_cluster_attr(int s) {
    cudaLaunchAttribute a;
    memset(&a, 0, sizeof a);
    a.id = cudaLaunchAttributeClusterDimension;
    a.val.clusterDim.x = (unsigned)s;
    a.val.clusterDim.y = 1;
    a.val.clusterDim.z = 1;
    return a;
}

/* The TMA map of the activations: rows x k elements of act (BF16 or F16),
 * ld elements apart, read in boxes of 64 k x bn rows with the 128-byte
 * swizzle; boxes past the edges read zeros. */
static nb_status sm90_xmap(nb_context *ctx, int act, const void *x, int64_t k, int64_t rows, int64_t ld, int bn,
                           CUtensorMap *map, const char *who) {
    char err[NB_ERRBUF] = "";
    PFN_cuTensorMapEncodeTiled_v12000 encode = tensor_map_encoder(err);
    if (!encode) return nbi_fail(ctx, NB_ERR_CUDA, "%s: %s", who, err);
    const cuuint64_t dims[2] = {(cuuint64_t)k, (cuuint64_t)rows};
    const cuuint64_t strides[1] = {(cuuint64_t)ld * 2};
    const cuuint32_t box[2] = {64, (cuuint32_t)bn};
    const cuuint32_t estr[2] = {1, 1};
    CUresult r = encode(map, act == NB_DTYPE_BF16 ? CU_TENSOR_MAP_DATA_TYPE_BFLOAT16 : CU_TENSOR_MAP_DATA_TYPE_FLOAT16, 2,
                        (void *)x, dims, strides, box, estr, CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_128B,
                        CU_TENSOR_MAP_L2_PROMOTION_L2_256B, CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
    if (r != CUDA_SUCCESS)
        return nbi_fail(ctx, NB_ERR_CUDA, "%s: cuTensorMapEncodeTiled failed (CUresult %d)", who, (int)r);
    return NB_OK;
}

extern "C" nb_status nbi_cuda_gemm_sm90(nb_context *ctx, const nbi_gemm_plan *pl, const void *x, const void *packed,
                                        const void *bias, void *y, void *workspace, void *stream) {
    size_t smem = 0;
    sm90_fn f = pl->sk ? sm90_pick_sk(pl->fmt, pl->act, pl->bn, pl->cwg, pl->group, &smem)
                       : sm90_pick(pl->fmt, pl->act, pl->bn, pl->cwg, pl->group, &smem);
    if (!f)
        return nbi_fail(ctx, NB_ERR_INTERNAL, "gemm_sm90: no kernel for %s, %s, %d-token tiles, %d consumer warpgroups, "
                        "group %d%s", nbi_traits((nb_format)pl->fmt)->name, nbi_dtype_name((nb_dtype)pl->act), pl->bn,
                        pl->cwg, pl->group, pl->sk ? ", stream-K" : "");
    CUtensorMap map;
    nb_status st = sm90_xmap(ctx, pl->act, x, pl->k, pl->m, pl->lda, pl->bn, &map, "gemm_sm90");
    if (st) return st;

    Sm90Params p;
    NBC_SET_GEMM_PARAMS(p, pl, packed, y, bias);
    p.tiles_n = pl->tiles_n;
    p.tiles_m = pl->tiles_m;
    p.group = pl->raster_group;
    p.splits = pl->splits;
    p.cps = pl->chunks_per_split;
    p.counters = (int *)workspace;
    p.partial = (float *)((char *)workspace + pl->ws_counter_bytes);
    p.cluster = pl->cluster;
    p.scale_bf16 = pl->scale_bf16;
    const int tiles = pl->tiles_n * pl->tiles_m, whole = tiles - pl->tail_tiles;
    p.tile0 = 0;
    p.ws_tiles = tiles;

    st = nbc_smem_opt_in(ctx, (const void *)f, smem);
    if (st) return st;
    cudaLaunchAttribute attr[2];
    const int threads = SM90_THREADS(pl->cwg);
    /* the stream-K grid: grid_x CTAs over the tiles' chunks (gemm_sm90_sk_kernel) */
    const unsigned grid = pl->sk ? (unsigned)pl->grid_x : (unsigned)(whole * pl->splits);
    cudaLaunchConfig_t cfg = nbc_launch_config(dim3(grid), dim3(threads), smem, stream, pl->pdl, attr);
    if (pl->cluster) attr[cfg.numAttrs++] = sm90_cluster_attr(pl->splits); /* a tile's splits (consecutive CTAs) */
    NBC_TRY(cudaLaunchKernelEx(&cfg, f, map, p), "gemm_sm90 kernel launch");
    if (pl->tail_tiles) {
        /* The tail split (plan.c tc_tail): the last tiles, split along k and
         * summed through the workspace.  With programmatic dependent launch
         * its CTAs take the SMs the whole waves free, and its producers wait
         * (griddepcontrol.wait) until that launch is complete, so a kernel
         * waiting on this one also waits on both. */
        p.tile0 = whole;
        p.ws_tiles = pl->tail_tiles;
        p.splits = pl->tail_splits;
        p.cps = pl->tail_cps;
        cfg = nbc_launch_config(dim3((unsigned)(pl->tail_tiles * pl->tail_splits)), dim3(threads), smem, stream,
                                pl->pdl_own, attr);
        NBC_TRY(cudaLaunchKernelEx(&cfg, f, map, p), "gemm_sm90 kernel launch (tail)");
    }
    return NB_OK;
}

/* How many clusters of s CTAs of the tensor-core kernel for a tile width
 * and consumer warpgroups can run at once (cudaOccupancyMaxActiveClusters;
 * clusters are placed within a GPC, so this can be less than SMs / s);
 * 0 where it cannot run or the query fails.  The planner's one-wave rule
 * for cluster split-K. */
extern "C" int nbi_cuda_sm90_clusters(nb_context *ctx, int fmt, int act, int bn, int cwg, int kg, int s) {
    size_t smem = 0;
    sm90_fn f = sm90_pick(fmt, act, bn, cwg, kg, &smem);
    if (!f || s < 2 || s > NBI_SM90_MAX_SPLITS) return 0;
    if (nbc_smem_opt_in(ctx, (const void *)f, smem)) return 0;
    cudaLaunchAttribute attr[1];
    cudaLaunchConfig_t cfg = nbc_launch_config(dim3((unsigned)s), dim3(SM90_THREADS(cwg)), smem, NULL, 0, attr);
    attr[cfg.numAttrs++] = sm90_cluster_attr(s);
    int n = 0;
    if (cudaOccupancyMaxActiveClusters(&n, (const void *)f, &cfg) != cudaSuccess) {
        cudaGetLastError();
        return 0;
    }
    return n;
}

/* ---------------------------------------------- grouped tiles: dispatch */

typedef void (*moe_sm90_fn)(const CUtensorMap, const Sm90MoeParams);

template <int FMT, int ACT>
static moe_sm90_fn moe_sm90_pick_bn(int bn, int mode, size_t *smem) {
#define MOE_SM90_CASE(BN)                                                                   \
    *smem = Sm90Smem<FMT, 0, BN, SM90_STAGES(BN), 2>::BYTES;                                \
    return mode ? moe_sm90_kernel<FMT, ACT, BN, SM90_STAGES(BN), 1> : moe_sm90_kernel<FMT, ACT, BN, SM90_STAGES(BN), 0>
    if (bn == 64) { MOE_SM90_CASE(64); }
    if (bn == 128) { MOE_SM90_CASE(128); }
    if (bn == 192) { MOE_SM90_CASE(192); }
#undef MOE_SM90_CASE
    return NULL;
}

static moe_sm90_fn moe_sm90_pick(int fmt, int act, int bn, int mode, size_t *smem) {
#define MOE_SM90_RUNG(F, A) return moe_sm90_pick_bn<F, A>(bn, mode, smem);
    NBC_LADDER(fmt, act, MOE_SM90_RUNG)
#undef MOE_SM90_RUNG
    return NULL;
}

extern "C" nb_status nbi_cuda_moe_sm90(nb_context *ctx, const nbi_moe_plan *pl, int mode, const void *x,
                                       const nb_moe_packed_weights *w, void *out, const int32_t *sorted,
                                       const int32_t *blockexp, const int32_t *offsets, const int32_t *ustart,
                                       void *stream) {
    size_t smem = 0;
    moe_sm90_fn f = moe_sm90_pick(pl->fmt, pl->act, pl->block, mode, &smem);
    if (!f)
        return nbi_fail(ctx, NB_ERR_INTERNAL, "moe_sm90: no kernel for %s, %s, %d-token tiles",
                        nbi_traits((nb_format)pl->fmt)->name, nbi_dtype_name((nb_dtype)pl->act), pl->block);
    const bool gu = mode == 0;
    const int64_t k = gu ? pl->hidden : pl->inter;
    CUtensorMap map;
    nb_status st = sm90_xmap(ctx, pl->act, x, k, pl->slots, k, pl->block, &map, "moe_sm90");
    if (st) return st;

    Sm90MoeParams q;
    memset(&q, 0, sizeof q);
    q.g.w = (const uint8_t *)(gu ? w->gate_up : w->down);
    q.g.k = (int)k;
    q.g.row_blocks = (int)(gu ? pl->gu_row_blocks : pl->dn_row_blocks);
    q.g.kchunks = (int)(gu ? pl->gu_kchunks : pl->dn_kchunks);
    q.g.tiles_n = (q.g.row_blocks + SM90_ROWS(2) / 16 - 1) / (SM90_ROWS(2) / 16);
    q.g.exp_shift = gu ? pl->gu_exp_shift : pl->dn_exp_shift;
    memcpy(q.g.stab, gu ? pl->gu_table : pl->dn_table, sizeof q.g.stab);
    q.stride = gu ? pl->gu_stride : pl->dn_stride;
    q.tscale = gu ? w->gate_up_scales : w->down_scales;
    q.epi = nbc_moe_epilogue(pl, gu, out, w);
    q.sorted = sorted;
    q.blockexp = blockexp;
    q.offsets = offsets;
    q.ustart = ustart;
    q.sentinel = (int)pl->slots;

    st = nbc_smem_opt_in(ctx, (const void *)f, smem);
    if (st) return st;
    q.tiles = (int)pl->launch_blocks;
    cudaLaunchAttribute attr[2];
    /* one CTA per SM (the stages take most of its shared memory), each walking tiles (bounded by moe_plan) */
    const int64_t tiles = pl->launch_blocks * q.g.tiles_n;
    const dim3 grid((unsigned)(tiles < ctx->info.sm_count ? tiles : ctx->info.sm_count));
    cudaLaunchConfig_t cfg = nbc_launch_config(grid, dim3(SM90_THREADS(2)), smem, stream, pl->pdl, attr);
    NBC_TRY(cudaLaunchKernelEx(&cfg, f, map, q), gu ? "moe_sm90 gate_up kernel launch" : "moe_sm90 down kernel launch");
    return NB_OK;
}
