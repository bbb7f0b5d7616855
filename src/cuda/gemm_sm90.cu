/* gemm_sm90.cu - the tensor-core path on Hopper (sm_90a):
 * Y[m, n] = X[m, k] . W[n, k]^T for m above the decode range, W in NVFP4 or
 * MXFP4 in the packed layout of gemv_fp4.cu (the same bytes serve both
 * paths), X and Y in BF16 or FP16.
 *
 * WHAT IT DOES
 *   A CTA owns a tile of 128 weight rows x BN tokens and walks k in chunks
 *   of 128 (one packed chunk per 16-row block).  Three warpgroups:
 *     WG0, the producer: one thread issues, per chunk, two TMA loads of the
 *         activation tile (BN rows x 64 k each, 128-byte swizzle) and eight
 *         bulk copies of packed chunks (one per row block, contiguous), all
 *         completing on the stage's "full" mbarrier, STAGES chunks ahead;
 *     WG1, WG2, the consumers: 64 weight rows each.  Per k16 tile a thread
 *         dequantizes its A fragment (4 registers) straight from the packed
 *         chunk in shared memory and issues wgmma m64nBNk16 with A from
 *         registers and B (the activations) from shared memory.  The
 *         wgmma is asynchronous: the next tile's dequantization overlaps it.
 *         After a chunk's last wgmma has retired every consumer thread
 *         arrives on the stage's "empty" mbarrier, which frees it for the
 *         producer.  The 256-token tile (three stages) fills and frees each
 *         64-k half of a stage on barriers of its own (SM90_HALF).
 *   When the tiles leave SMs idle (m <= 256 on 8192-row layers), `splits`
 *   CTAs share a tile, each walking its own range of chunks; they store FP32
 *   partials in the workspace and the last to arrive sums them in split
 *   order (deterministic) and runs the epilogue.
 *   The epilogue multiplies by 2^exp_shift * tensor_scale, adds the bias and
 *   stores BF16/FP16 (rows past n and tokens past m are not stored).
 *
 * HOW THE DECODE LAYOUT FEEDS WGMMA
 *   wgmma takes B from shared memory in natural k order (8 consecutive k per
 *   16-byte core-matrix row), so tile j of a chunk is k = 16j .. 16j+15 and
 *   a thread (g = lane/4, t = lane%4) needs, per tile, the pairs k = 16j+2t,
 *   +1 and 16j+2t+8, +9 of rows g and g+8.  In the packed chunk row g's 128
 *   codes are the 64 bytes at 64g (row g+8 at 512+64g), eight k per word
 *   (word G = k/8), and elements 2i, 2i+1 of a word sit at nibbles i and
 *   i+4.  So the thread reads the four 16-byte words of rows g and g+8 that
 *   hold tiles 2q, 2q+1, shifts each word left by 12 - 4t and decodes to
 *   the same 16-bit values as the decode kernel (two shifts and two masks
 *   per pair, one HMUL2 by the adjusted block scale: gemv_fp4.cu
 *   "DEQUANTIZATION").  The four
 *   lanes of a row read the same 16 bytes (a broadcast).  Scales: NVFP4
 *   group j of rows g / g+8 is byte 4(j/2)+(j&1) / +2 of the 16 bytes at
 *   1024+16g; MXFP4 group j/2 is byte 2(j/2) / +1 of the 8 bytes at
 *   1024+8g.
 *
 * LIMITS  sm_90a only (the host checks); x rows 16-byte aligned (TMA); k a
 *         multiple of the group; m < 2^31.
 * TEST    build/tests/test_gpu (m in 33..4096).  BENCH  nibble bench.
 */
#include "common.cuh"
#include "tc_dequant.cuh"
#include "wgmma_ops.cuh"

#include <cudaTypedefs.h>

#define SM90_THREADS 384 /* producer warpgroup + two consumer warpgroups */
#define SM90_ROWS 128    /* weight rows per CTA: 8 row blocks */
/* Whether a tile width releases each stage's two 64-k halves on barriers
 * of their own, so the producer refills half 0 (with the weights) half a
 * chunk sooner: the 256-token tile, whose 74 KB stages leave room for only
 * three (H100, nvfp4, 8192 -> 8192, interleaved runs: m = 256 62.1 -> 58.8
 * us, 1024 193.7 -> 184.6, 4096 855.1 -> 813.6).  The 64- and 128-token
 * tiles have six and four stages and lost with it (m = 64: 8192 -> 8192
 * 29.5 -> 30.8 us, 28672 -> 8192 85.2 -> 91.3).  Build knob
 * NB_SM90_HALF: -1 as measured, 0 never, 1 always. */
#ifndef NB_SM90_HALF
#define NB_SM90_HALF -1
#endif
#define SM90_HALF(BN) (NB_SM90_HALF < 0 ? (BN) == 256 : NB_SM90_HALF != 0)

struct Sm90Params {
    const uint8_t *w;
    void *y;
    const void *bias;
    int m, n, k;
    int64_t ldc;
    int row_blocks, kchunks;
    int tiles_n, tiles_m, group; /* tile grid and its raster (group of n tiles walked together) */
    int splits, cps;             /* CTAs per tile along k, chunks per split */
    float *partial;              /* split-K: per split and tile, the consumers' accumulators */
    int *counters;               /* split-K: arrivals per tile (left zero) */
    int exp_shift;
    float ts;
    uint32_t stab[128];
};

#if defined(__CUDA_ARCH__) && defined(__CUDA_ARCH_FEAT_SM90_ALL)
#define NB_SM90_DEVICE 1
#endif

/* ------------------------------------------------------------ PTX helpers */
#ifdef NB_SM90_DEVICE
__device__ __forceinline__ uint32_t smem_addr(const void *p) { return (uint32_t)__cvta_generic_to_shared(p); }

__device__ __forceinline__ void mbar_init(uint32_t bar, uint32_t count) {
    asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;" ::"r"(bar), "r"(count) : "memory");
}
/* Arrive and announce the bytes the copy engine will deliver for this phase. */
__device__ __forceinline__ void mbar_expect_tx(uint32_t bar, uint32_t bytes) {
    asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" ::"r"(bar), "r"(bytes) : "memory");
}
__device__ __forceinline__ void mbar_arrive(uint32_t bar) {
    asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];" ::"r"(bar) : "memory");
}
__device__ __forceinline__ void mbar_wait(uint32_t bar, uint32_t parity) {
    uint32_t done;
    do {
        asm volatile("{\n.reg .pred p;\nmbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2;\nselp.u32 %0, 1, 0, p;\n}"
                     : "=r"(done)
                     : "r"(bar), "r"(parity)
                     : "memory");
    } while (!done);
}

/* TMA: a 2-D box of the activation tensor map into shared memory. */
__device__ __forceinline__ void tma_load_2d(uint32_t dst, const CUtensorMap *map, int c0, int c1, uint32_t bar) {
    asm volatile("cp.async.bulk.tensor.2d.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1, {%2, %3}], [%4];"
                 ::"r"(dst), "l"((uint64_t)map), "r"(c0), "r"(c1), "r"(bar)
                 : "memory");
}
/* Bulk copy of contiguous bytes (a packed chunk), evict-first in L2: the
 * weights are read once per tile row and must not push the activations out. */
__device__ __forceinline__ void bulk_load(uint32_t dst, const void *src, uint32_t bytes, uint32_t bar, uint64_t pol) {
    asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes.L2::cache_hint [%0], [%1], %2, [%3], %4;"
                 ::"r"(dst), "l"(src), "r"(bytes), "r"(bar), "l"(pol)
                 : "memory");
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
        if constexpr (BN == 64) wgmma_m64n64k16_bf16(d, a0, a1, a2, a3, desc, scale_d);
        if constexpr (BN == 128) wgmma_m64n128k16_bf16(d, a0, a1, a2, a3, desc, scale_d);
        if constexpr (BN == 256) wgmma_m64n256k16_bf16(d, a0, a1, a2, a3, desc, scale_d);
    } else {
        if constexpr (BN == 64) wgmma_m64n64k16_f16(d, a0, a1, a2, a3, desc, scale_d);
        if constexpr (BN == 128) wgmma_m64n128k16_f16(d, a0, a1, a2, a3, desc, scale_d);
        if constexpr (BN == 256) wgmma_m64n256k16_f16(d, a0, a1, a2, a3, desc, scale_d);
    }
}

#endif

/* Shared memory: STAGES activation tiles (two 128-byte-swizzled halves of
 * BN x 64 each; 1024-byte aligned as the swizzle requires), STAGES x 8
 * packed chunks, the scale table, the mbarriers; plus 1 KB to align. */
template <int FMT, int BN, int STAGES>
struct Sm90Smem {
    static constexpr int CB = NBI_CHUNK_CODE_BYTES + 32 * (FMT == NB_FORMAT_NVFP4 ? 4 : 2);
    static constexpr int X_STAGE = BN * 256;
    static constexpr int W_STAGE = 8 * CB;
    static constexpr int X_OFF = 0;
    static constexpr int W_OFF = STAGES * X_STAGE;
    static constexpr int TAB_OFF = W_OFF + STAGES * W_STAGE;
    static constexpr int BAR_OFF = TAB_OFF + 1024;
    static constexpr int FLAG_OFF = BAR_OFF + 16 * STAGES * (SM90_HALF(BN) ? 2 : 1); /* split-K: "this CTA sums the tile" */
    static constexpr int BYTES = FLAG_OFF + 16 + 1024;
};

template <int FMT, int ACT, int BN, int STAGES>
__global__ void __launch_bounds__(SM90_THREADS, 1)
    gemm_sm90_kernel(const __grid_constant__ CUtensorMap xmap, const Sm90Params p) {
#ifdef NB_SM90_DEVICE
    typedef Sm90Smem<FMT, BN, STAGES> L;
    constexpr int CB = L::CB;
    constexpr bool HALF = SM90_HALF(BN);
    extern __shared__ uint8_t smem_raw[];
    /* Align by offsetting smem_raw itself, so that the compiler still knows
     * every access is to shared memory (LDS, not generic loads). */
    uint8_t *smem = smem_raw + ((1024u - (smem_addr(smem_raw) & 1023u)) & 1023u);
    uint32_t *stab = (uint32_t *)(smem + L::TAB_OFF);
    const uint32_t bar0 = smem_addr(smem + L::BAR_OFF); /* full[s] at bar0 + 8s, empty[s] at bar0 + 8(STAGES + s) */

    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    const int wg = warp >> 2;

    /* tile: groups of `group` n tiles walk every m tile, so the weights of a
     * group and the activations of an m tile stay in L2 together. */
    const int tile = blockIdx.x / p.splits, split = blockIdx.x % p.splits;
    const int per_group = p.group * p.tiles_m;
    const int gi = tile / per_group, gr = tile % per_group;
    const int first_n = gi * p.group;
    const int gsize = min(p.group, p.tiles_n - first_n);
    const int tn = first_n + gr % gsize, tm = gr / gsize;
    const int rb0 = tn * 8;
    const int nrb = min(8, p.row_blocks - rb0);
    /* this CTA's k chunks (the planner gives each split at least one) */
    const int c0 = split * p.cps, nch = min(p.cps, p.kchunks - c0);

    for (int i = threadIdx.x; i < 128; i += SM90_THREADS) {
        const uint32_t v = p.stab[i];
        stab[2 * i] = (v & 0xFFFFu) * 0x10001u;
        stab[2 * i + 1] = (v >> 16) * 0x10001u;
    }
    if (threadIdx.x == 0) {
        if constexpr (HALF) { /* full[h][s] at bar0 + 8(h STAGES + s), empty[h][s] at bar0 + 8((2 + h) STAGES + s) */
            for (int s = 0; s < 4 * STAGES; s++) mbar_init(bar0 + 8 * s, s < 2 * STAGES ? 1 : 256);
        } else {
            for (int s = 0; s < STAGES; s++) {
                mbar_init(bar0 + 8 * s, 1);                 /* the producer's arrive + the copy bytes */
                mbar_init(bar0 + 8 * (STAGES + s), 256);    /* every consumer thread arrives */
            }
        }
        asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
    }
    __syncthreads();

    if (wg == 0) {
        /* Producer warpgroup: give registers to the consumers. */
        asm volatile("setmaxnreg.dec.sync.aligned.u32 40;");
        if (warp == 0 && lane == 0) {
            const uint64_t pol = nbc_policy_evict_first();
            const uint32_t bytes = (uint32_t)(L::X_STAGE + nrb * CB);
            asm volatile("griddepcontrol.wait;" ::: "memory"); /* X comes from the previous kernel */
            if constexpr (HALF) for (int i = 0; i < nch; i++) {
                const int s = i % STAGES, kc = c0 + i;
                const uint32_t ph = ((i / STAGES) - 1) & 1;
                const uint32_t xs = smem_addr(smem + L::X_OFF + s * L::X_STAGE);
                /* half 0: the weights and k 0..63 of the activations */
                if (i >= STAGES) mbar_wait(bar0 + 8 * (2 * STAGES + s), ph);
                const uint32_t full0 = bar0 + 8 * s;
                mbar_expect_tx(full0, (uint32_t)(L::X_STAGE / 2 + nrb * CB));
                tma_load_2d(xs, &xmap, kc * NBI_CHUNK_K, tm * BN, full0);
                const uint32_t ws = smem_addr(smem + L::W_OFF + s * L::W_STAGE);
                for (int r = 0; r < nrb; r++)
                    bulk_load(ws + r * CB, p.w + ((size_t)(rb0 + r) * p.kchunks + kc) * CB, CB, full0, pol);
                /* half 1: k 64..127 */
                if (i >= STAGES) mbar_wait(bar0 + 8 * (3 * STAGES + s), ph);
                const uint32_t full1 = bar0 + 8 * (STAGES + s);
                mbar_expect_tx(full1, (uint32_t)(L::X_STAGE / 2));
                tma_load_2d(xs + BN * 128, &xmap, kc * NBI_CHUNK_K + 64, tm * BN, full1);
            }
            else for (int i = 0; i < nch; i++) {
                const int s = i % STAGES, kc = c0 + i;
                if (i >= STAGES) mbar_wait(bar0 + 8 * (STAGES + s), ((i / STAGES) - 1) & 1);
                const uint32_t full = bar0 + 8 * s;
                mbar_expect_tx(full, bytes);
                const uint32_t xs = smem_addr(smem + L::X_OFF + s * L::X_STAGE);
                tma_load_2d(xs, &xmap, kc * NBI_CHUNK_K, tm * BN, full);
                tma_load_2d(xs + BN * 128, &xmap, kc * NBI_CHUNK_K + 64, tm * BN, full);
                const uint32_t ws = smem_addr(smem + L::W_OFF + s * L::W_STAGE);
                for (int r = 0; r < nrb; r++)
                    bulk_load(ws + r * CB, p.w + ((size_t)(rb0 + r) * p.kchunks + kc) * CB, CB, full, pol);
            }
        }
        return;
    }

    /* Consumers. */
    asm volatile("setmaxnreg.inc.sync.aligned.u32 232;");
    const int g = lane >> 2, t = lane & 3;
    const int rbl = 4 * (wg - 1) + (warp & 3); /* row block within the tile */
    float acc[BN / 2];
#pragma unroll
    for (int i = 0; i < BN / 2; i++) acc[i] = 0.0f;

    /* Two register sets of A fragments: chunk c's wgmmas read one set while
     * chunk c+1 is dequantized into the other; wgmma.wait_group 1 after
     * issuing chunk c+1 retires chunk c, which frees its set and its stage.
     * The loop is unrolled by two so that both sets are plain registers. */
    uint32_t fa[8][4], fb[8][4];
    if constexpr (HALF) {
        /* Each chunk issues two wgmma groups, one per 64-k half; after issuing
         * half h, wgmma.wait_group 2 retires the previous chunk's half h, which
         * frees that half of its stage. */
        auto chunk = [&](int i, uint32_t (&a)[8][4]) { /* the CTA's chunk i (stage i % STAGES) */
            const int s = i % STAGES, prev = (i + STAGES - 1) % STAGES;
            const uint32_t ph = (i / STAGES) & 1;
            mbar_wait(bar0 + 8 * s, ph);
            nbc_dequant_chunk<FMT, ACT>(smem + L::W_OFF + s * L::W_STAGE + rbl * CB, stab, g, t, a);
            const uint32_t xs = smem_addr(smem + L::X_OFF + s * L::X_STAGE);
#pragma unroll
            for (int h = 0; h < 2; h++) {
                if (h == 1) mbar_wait(bar0 + 8 * (STAGES + s), ph);
                wgmma_fence();
#pragma unroll
                for (int j = 4 * h; j < 4 * h + 4; j++)
                    wgmma_tile<ACT, BN>(acc, a[j][0], a[j][1], a[j][2], a[j][3],
                                        desc_sw128(xs + h * (BN * 128) + (j & 3) * 32), 1);
                wgmma_commit();
                if (i > 0) { /* the previous chunk's half h is done: release it (each thread, after its reads) */
                    wgmma_wait<2>();
                    mbar_arrive(bar0 + 8 * ((2 + h) * STAGES + prev));
                }
            }
        };
        for (int i = 0; i < nch; i += 2) {
            chunk(i, fa);
            if (i + 1 < nch) chunk(i + 1, fb);
        }
    } else {
        auto chunk = [&](int i, uint32_t (&a)[8][4]) { /* the CTA's chunk i (stage i % STAGES) */
            const int s = i % STAGES;
            mbar_wait(bar0 + 8 * s, (i / STAGES) & 1);
            nbc_dequant_chunk<FMT, ACT>(smem + L::W_OFF + s * L::W_STAGE + rbl * CB, stab, g, t, a);
            const uint32_t xs = smem_addr(smem + L::X_OFF + s * L::X_STAGE);
            wgmma_fence();
#pragma unroll
            for (int j = 0; j < 8; j++)
                wgmma_tile<ACT, BN>(acc, a[j][0], a[j][1], a[j][2], a[j][3],
                                    desc_sw128(xs + (j >> 2) * (BN * 128) + (j & 3) * 32), 1);
            wgmma_commit();
        };
        auto retire = [&](int i) { /* chunk i's wgmmas are done: release its stage */
            mbar_arrive(bar0 + 8 * (STAGES + i % STAGES)); /* each thread, after its own reads */
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
    asm volatile("griddepcontrol.launch_dependents;" ::: "memory");

    /* Split-K: each CTA of the tile stores its accumulators (float4 i of
     * consumer thread c at 4 (256 i + c): coalesced), and the last to arrive
     * sums them in split order, so the result does not depend on timing. */
    if (p.splits > 1) {
        const int c = threadIdx.x - 128;
        const int ntiles = p.tiles_n * p.tiles_m;
        float4 *mine = (float4 *)p.partial + ((size_t)split * ntiles + tile) * (32 * BN) + c;
#pragma unroll
        for (int i = 0; i < BN / 8; i++)
            __stcg(mine + 256 * i, make_float4(acc[4 * i], acc[4 * i + 1], acc[4 * i + 2], acc[4 * i + 3]));
        __threadfence();
        int *last = (int *)(smem + L::FLAG_OFF);
        asm volatile("bar.sync 1, 256;" ::: "memory"); /* the consumer warpgroups */
        if (c == 0) *last = atomicAdd(&p.counters[tile], 1) == p.splits - 1;
        asm volatile("bar.sync 1, 256;" ::: "memory");
        if (!*last) return;
        __threadfence();
#pragma unroll
        for (int i = 0; i < BN / 2; i++) acc[i] = 0.0f;
        for (int s = 0; s < p.splits; s++) {
            const float4 *part = (const float4 *)p.partial + ((size_t)s * ntiles + tile) * (32 * BN) + c;
#pragma unroll
            for (int i = 0; i < BN / 8; i++) {
                const float4 v = __ldcg(part + 256 * i);
                acc[4 * i] += v.x, acc[4 * i + 1] += v.y, acc[4 * i + 2] += v.z, acc[4 * i + 3] += v.w;
            }
        }
        if (c == 0) p.counters[tile] = 0; /* ready for the next call */
    }

    /* Epilogue: accumulator (row, token) -> Y[token, row]. */
    const int rb = rb0 + rbl;
#pragma unroll
    for (int i = 0; i < BN / 8; i++)
#pragma unroll
        for (int h = 0; h < 2; h++)
#pragma unroll
            for (int j = 0; j < 2; j++) {
                const int tok = tm * BN + 8 * i + 2 * t + j, row = rb * 16 + g + 8 * h;
                if (tok < p.m && row < p.n) {
                    float v = ldexpf(acc[4 * i + 2 * h + j], p.exp_shift) * p.ts;
                    if (p.bias) v += nbc_load(ACT, p.bias, (size_t)row);
                    nbc_store(ACT, p.y, (size_t)tok * p.ldc + row, v);
                }
            }
#endif
}

/* ------------------------------------------------------------- dispatch */

typedef void (*sm90_fn)(const CUtensorMap, const Sm90Params);

/* Pipeline depth per tile width (build-time, for scripts/device-check
 * variants); 3 is the most the 256-token tile's 74 KB stages allow. */
#ifndef NB_SM90_STAGES64
#define NB_SM90_STAGES64 6
#endif
#ifndef NB_SM90_STAGES128
#define NB_SM90_STAGES128 4
#endif
#define SM90_STAGES(BN) ((BN) == 256 ? 3 : (BN) == 128 ? NB_SM90_STAGES128 : NB_SM90_STAGES64)
#define SM90_K(BN) gemm_sm90_kernel<FMT, ACT, BN, SM90_STAGES(BN)>

template <int FMT, int ACT>
static sm90_fn sm90_pick_bn(int bn, size_t *smem) {
    switch (bn) {
    case 64: *smem = Sm90Smem<FMT, 64, SM90_STAGES(64)>::BYTES; return SM90_K(64);
    case 128: *smem = Sm90Smem<FMT, 128, SM90_STAGES(128)>::BYTES; return SM90_K(128);
    case 256: *smem = Sm90Smem<FMT, 256, SM90_STAGES(256)>::BYTES; return SM90_K(256);
    }
    return NULL;
}

static sm90_fn sm90_pick(int fmt, int act, int bn, size_t *smem) {
    if (fmt == NB_FORMAT_NVFP4)
        return act == NB_DTYPE_BF16 ? sm90_pick_bn<NB_FORMAT_NVFP4, NB_DTYPE_BF16>(bn, smem)
                                    : sm90_pick_bn<NB_FORMAT_NVFP4, NB_DTYPE_F16>(bn, smem);
    if (fmt == NB_FORMAT_MXFP4)
        return act == NB_DTYPE_BF16 ? sm90_pick_bn<NB_FORMAT_MXFP4, NB_DTYPE_BF16>(bn, smem)
                                    : sm90_pick_bn<NB_FORMAT_MXFP4, NB_DTYPE_F16>(bn, smem);
    return NULL;
}

/* Whether this build carries the sm_90a kernels (the architecture list has
 * 90a; plain sm_90 cannot run wgmma). */
extern "C" int nbi_cuda_has_sm90a(void) {
#ifdef NB_HAVE_SM90A
    return 1;
#else
    return 0;
#endif
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

extern "C" int nbi_cuda_gemm_sm90(const nbi_gemm_plan *pl, const void *x, const void *packed, const void *bias,
                                  void *y, void *workspace, void *stream, char *err) {
    size_t smem = 0;
    sm90_fn f = sm90_pick(pl->fmt, pl->act, pl->bn, &smem);
    if (!f) return nbc_err(cudaErrorInvalidValue, err, "gemm_sm90: no kernel for this format/dtype/tile");
    PFN_cuTensorMapEncodeTiled_v12000 encode = tensor_map_encoder(err);
    if (!encode) return (int)cudaErrorNotSupported;

    CUtensorMap map;
    const cuuint64_t dims[2] = {(cuuint64_t)pl->k, (cuuint64_t)pl->m};
    const cuuint64_t strides[1] = {(cuuint64_t)pl->lda * 2};
    const cuuint32_t box[2] = {64, (cuuint32_t)pl->bn};
    const cuuint32_t estr[2] = {1, 1};
    CUresult r = encode(&map, pl->act == NB_DTYPE_BF16 ? CU_TENSOR_MAP_DATA_TYPE_BFLOAT16 : CU_TENSOR_MAP_DATA_TYPE_FLOAT16,
                        2, (void *)x, dims, strides, box, estr, CU_TENSOR_MAP_INTERLEAVE_NONE,
                        CU_TENSOR_MAP_SWIZZLE_128B, CU_TENSOR_MAP_L2_PROMOTION_L2_256B,
                        CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
    if (r != CUDA_SUCCESS) {
        snprintf(err, NB_ERRBUF, "gemm_sm90: cuTensorMapEncodeTiled failed (CUresult %d)", (int)r);
        return (int)cudaErrorInvalidValue;
    }

    Sm90Params p;
    NBC_SET_GEMM_PARAMS(p, pl, packed, y, bias);
    p.tiles_n = pl->tiles_n;
    p.tiles_m = pl->tiles_m;
    p.group = pl->raster_group;
    p.splits = pl->splits;
    p.cps = pl->chunks_per_split;
    p.counters = (int *)workspace;
    p.partial = (float *)((char *)workspace + pl->ws_counter_bytes);

    static int opted_in[3][4][3];
    const int bi = pl->bn == 64 ? 0 : pl->bn == 128 ? 1 : 2;
    if (!opted_in[pl->fmt][pl->act][bi]) {
        NBC_TRY(cudaFuncSetAttribute(f, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem),
                "cudaFuncSetAttribute(max dynamic shared memory)");
        opted_in[pl->fmt][pl->act][bi] = 1;
    }
    cudaLaunchAttribute attr[1];
    const dim3 grid((unsigned)(pl->tiles_n * pl->tiles_m * pl->splits));
    cudaLaunchConfig_t cfg = nbc_launch_config(grid, dim3(SM90_THREADS), smem, stream, pl->pdl, attr);
    NBC_TRY(cudaLaunchKernelEx(&cfg, f, map, p), "gemm_sm90 kernel launch");
    return 0;
}
