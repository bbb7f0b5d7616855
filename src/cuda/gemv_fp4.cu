/* gemv_fp4.cu - the decode path: Y[m, n] = X[m, k] . W[n, k]^T for m <= 32,
 * W in NVFP4 or MXFP4 (packed layout below), X and Y in BF16 or FP16.
 *
 * WHAT IT DOES
 *   Memory-bound: every weight byte is read once from HBM and dequantized in
 *   registers.  The tensor cores run mma.sync.m16n8k16 with the operands
 *   swapped: the dequantized weights are the 16-row A operand and the tokens
 *   the 8-wide B operand, so m = 1..8 costs one MMA per 16x16 weight tile and
 *   m = 32 four.  A CTA has 8 warps; each warp streams one 16-row block's
 *   chunks through its own shared-memory ring (cp.async, STAGES deep).  kw
 *   warps may share a row block and split its k range (summed in shared
 *   memory), and CTAs along grid.y may split k further (partials in the
 *   workspace, summed in split order by the last CTA to arrive: the result
 *   does not depend on timing).  For 9..32 tokens on layers wide enough, the
 *   XSH variant stages each chunk's activations once per CTA in a second
 *   shared ring and all 8 warps walk the same k range; otherwise each lane
 *   loads its activations through L1.  The host (src/device.c) picks kw, the
 *   split and XSH from the shape and the SM count.
 *
 * PACKED LAYOUT (nb_pack; src/formats.c nb_pack_host is the specification)
 *   The weight is cut into chunks of 16 rows x 128 k, stored row-block major:
 *   chunk (rb, kc) at byte (rb * kchunks + kc) * CB, CB = 1024 + 32 * SB,
 *   SB = 4 (NVFP4) or 2 (MXFP4).  Lane L = 4g + t of the warp that owns the
 *   row block reads
 *     bytes [16L, 16L+16)        row 16rb+g,   k = 128kc + 32t .. +31
 *     bytes [512+16L, 512+16L+16) row 16rb+g+8, same k
 *     bytes [1024+SB*L, +SB)     its scales: NVFP4 (row g: group 2t, 2t+1;
 *                                 row g+8: group 2t, 2t+1), MXFP4 (row g,
 *                                 row g+8: group t), groups counted in chunk.
 *   Each 16 bytes is four little-endian words; word w holds the 8 elements
 *   k0 = 32t + 8w .. +7 with element e in nibble [0,4,1,5,2,6,3,7][e], so that
 *   (q >> 4i) puts elements 2i and 2i+1 at bits 0..3 and 16..19: one shift and
 *   two masks build a 16-bit pair.  Rows past n and k past the end are zero
 *   codes with scale byte 0 (a zero weight for every format).
 *
 * WHY THIS K ORDER
 *   An MMA sums over its 16 k-slots in any order, so the layout assigns lane
 *   t the contiguous k-range 32t..32t+31 of each chunk: tile j (0..7) gives
 *   k-slots {2t, 2t+1} -> k 32t + 4j + {0, 1} and {2t+8, 2t+9} -> 32t + 4j +
 *   {2, 3}.  Activations for a lane are then 64 contiguous bytes per token
 *   (four 16-byte loads), and each lane's scales are distinct bytes.
 *
 * DEQUANTIZATION (exact)
 *   E2M1 s.e1e0.m is placed with its sign at bit 15 and e1e0m at the low
 *   exponent / top mantissa bits: in BF16 that is the value v * 2^-126, in
 *   FP16 v * 2^-14 (code 1 = 0.5 lands on a subnormal, which HMUL2 handles).
 *   One HMUL2 by an adjusted block scale gives the MMA operand
 *     A = v * s * 2^-c,  exact in 16 bits (E2M1 x E4M3 needs 5 significant
 *   bits; c keeps every product in the normal range), and the epilogue
 *   multiplies the FP32 accumulator by 2^c * tensor_scale.  The adjusted
 *   scales come from a 256-entry table (built on the host, passed as a
 *   kernel parameter, copied to shared memory by each CTA), which
 *   handles negative, zero and NaN scale bytes with no special code: NaN
 *   scales give NaN outputs.  c: NVFP4 BF16 7, FP16 8; MXFP4 BF16 emax-127
 *   (needs emax - emin <= 125), FP16 emax-128 (needs emax - emin <= 24).
 *
 * LIMITS  m <= 32 per launch (nb_gemm slices larger m); x rows 16-byte
 *   aligned; k a multiple of the group.
 * TEST    build/tests/test_gpu (scripts/device-check runs it under
 *         compute-sanitizer too).  BENCH  nibble bench.
 */
#include "common.cuh"

/* Build-time variants, for measuring (scripts/device-check builds several):
 * NB_GEMV_STAGES weight chunks in each warp's shared-memory ring (so
 * STAGES-1 in flight); NB_MINB minimum CTAs per SM asked of the register
 * allocator. */
#ifndef NB_GEMV_STAGES
#define NB_GEMV_STAGES 4
#endif
#ifndef NB_MINB
#define NB_MINB 1
#endif
#define XROW 20 /* uint4 per staged activation row: 256 bytes + 64 of padding */

struct GemvParams {
    const uint8_t *w;
    const void *x;
    void *y;
    const void *bias;
    float *partial;
    int *counters;
    int m, n, k;
    int64_t lda, ldc;
    int row_blocks, kchunks, cps, splits;
    int kw;          /* warps of a CTA that split one row block's k range (1, 2, 4, 8) */
    int exp_shift;   /* epilogue: ldexp(acc, exp_shift) * ts */
    float ts;
    uint32_t stab[128]; /* scale byte b -> adjusted 16-bit scale, two per word (built on the host) */
};

/* ------------------------------------------------------------ PTX helpers */

/* An L2 policy that evicts the streamed weights first: they are read once,
 * while activations and partial sums should stay in L2. */
__device__ __forceinline__ uint64_t policy_evict_first() {
    uint64_t p;
    asm("createpolicy.fractional.L2::evict_first.b64 %0, 1.0;" : "=l"(p));
    return p;
}

/* 16-byte weight load: read-only path, no L1 allocation (no reuse), L2
 * evict-first. */
__device__ __forceinline__ uint4 ld_weights16(const void *ptr, uint64_t pol) {
    uint4 r;
    asm("ld.global.nc.L1::no_allocate.L2::cache_hint.v4.u32 {%0,%1,%2,%3}, [%4], %5;"
        : "=r"(r.x), "=r"(r.y), "=r"(r.z), "=r"(r.w)
        : "l"(ptr), "l"(pol));
    return r;
}

/* Programmatic dependent launch (sm_90): wait until the previous grid in
 * the stream has finished and its writes are visible; let the next grid
 * start its prologue early. */
__device__ __forceinline__ void grid_dependency_wait() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    asm volatile("griddepcontrol.wait;" ::: "memory");
#endif
}
__device__ __forceinline__ void grid_dependents_launch() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
#endif
}

/* 16-byte global -> shared copy; src_size 0 writes zeros (k past the end). */
__device__ __forceinline__ void cp_async16_zfill(void *smem, const void *gmem, bool in) {
    const uint32_t sa = (uint32_t)__cvta_generic_to_shared(smem);
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;" ::"r"(sa), "l"(gmem), "r"(in ? 16 : 0));
}

/* 16-byte global -> shared copy that bypasses registers, with an L2 policy. */
__device__ __forceinline__ void cp_async16_hint(void *smem, const void *gmem, uint64_t pol) {
    const uint32_t sa = (uint32_t)__cvta_generic_to_shared(smem);
    asm volatile("cp.async.cg.shared.global.L2::cache_hint [%0], [%1], 16, %2;" ::"r"(sa), "l"(gmem), "l"(pol));
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;" ::: "memory"); }
template <int N>
__device__ __forceinline__ void cp_async_wait() { asm volatile("cp.async.wait_group %0;" ::"n"(N) : "memory"); }

template <int SB>
__device__ __forceinline__ uint32_t ld_scales(const void *ptr, uint64_t pol) {
    uint32_t r;
    if (SB == 4) {
        asm("ld.global.nc.L1::no_allocate.L2::cache_hint.u32 %0, [%1], %2;" : "=r"(r) : "l"(ptr), "l"(pol));
    } else {
        unsigned short h;
        asm("ld.global.nc.L1::no_allocate.L2::cache_hint.u16 %0, [%1], %2;" : "=h"(h) : "l"(ptr), "l"(pol));
        r = h;
    }
    return r;
}

/* Elements 2i, 2i+1 of a packed word as a 16-bit pair, unscaled: sign to
 * bit 15, e1e0m to bits 8..6 (BF16) or 11..9 (FP16) of each half. */
template <int ACT, int I>
__device__ __forceinline__ uint32_t decode_pair(uint32_t q) {
    const uint32_t t = q >> (4 * I);
    if (ACT == NB_DTYPE_BF16) return ((t << 12) & 0x80008000u) | ((t << 6) & 0x01C001C0u);
    return ((t << 12) & 0x80008000u) | ((t << 9) & 0x0E000E00u);
}

template <int ACT>
__device__ __forceinline__ uint32_t hmul2(uint32_t a, uint32_t b) {
    uint32_t r;
    if (ACT == NB_DTYPE_BF16) {
        __nv_bfloat162 x = *reinterpret_cast<__nv_bfloat162 *>(&a), y = *reinterpret_cast<__nv_bfloat162 *>(&b);
        __nv_bfloat162 z = __hmul2(x, y);
        r = *reinterpret_cast<uint32_t *>(&z);
    } else {
        __half2 x = *reinterpret_cast<__half2 *>(&a), y = *reinterpret_cast<__half2 *>(&b);
        __half2 z = __hmul2(x, y);
        r = *reinterpret_cast<uint32_t *>(&z);
    }
    return r;
}

/* D += A . B, m16n8k16, FP32 accumulate (PTX ISA "Matrix Fragments for
 * mma.m16n8k16": a0..a3 rows g/g+8, k-slots 2t..2t+1 and 2t+8..2t+9). */
template <int ACT>
__device__ __forceinline__ void mma16816(float (&d)[4], uint32_t a0, uint32_t a1, uint32_t a2, uint32_t a3,
                                         uint32_t b0, uint32_t b1) {
    if (ACT == NB_DTYPE_BF16) {
        asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
                     "{%0,%1,%2,%3};"
                     : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
                     : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
    } else {
        asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
                     "{%0,%1,%2,%3};"
                     : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
                     : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
    }
}

/* ----------------------------------------------------------------- kernel */

template <int FMT, int ACT, int MT, int WARPS, int STAGES, bool XSH>
__global__ void __launch_bounds__(WARPS * 32, NB_MINB) gemv_fp4_kernel(const GemvParams p) {
    constexpr int SB = FMT == NB_FORMAT_NVFP4 ? 4 : 2; /* scale bytes per lane */
    constexpr int CB = NBI_CHUNK_CODE_BYTES + 32 * SB;  /* bytes per chunk */
    __shared__ uint32_t stab[256];                       /* scale byte -> adjusted 16-bit pair */
    __shared__ int is_last;

    for (int i = threadIdx.x; i < 128; i += WARPS * 32) {
        const uint32_t v = p.stab[i];
        stab[2 * i] = (v & 0xFFFFu) * 0x10001u; /* broadcast to both halves */
        stab[2 * i + 1] = (v >> 16) * 0x10001u;
    }
    /* (the barrier that publishes stab comes after the weight prologue) */

    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int g = lane >> 2, t = lane & 3;
    /* warp -> (row block, k slice): the kw warps of a row block split the
     * CTA's k range and are summed through shared memory at the end. */
    const int ks = warp % p.kw;
    const int rb = blockIdx.x * (WARPS / p.kw) + warp / p.kw;
    const bool valid = rb < p.row_blocks;
    const int cta_begin = blockIdx.y * p.cps, cta_end = min(cta_begin + p.cps, p.kchunks);
    const int per_warp = (cta_end - cta_begin + p.kw - 1) / p.kw;
    const int c_begin = cta_begin + ks * per_warp;
    const int c_end = min(c_begin + per_warp, cta_end);
    const int nchunks = valid ? max(c_end - c_begin, 0) : 0;
    /* XSH (9..32 tokens on layers wide enough): activations are staged once
     * per CTA in shared memory; the CTA's warps then walk the same k range
     * (kw = 1) in step. */
    static_assert(!XSH || MT >= 2, "staged activations are for two or more token tiles");
    const int cta_n = max(cta_end - cta_begin, 0);

    /* Two accumulator sets (even and odd tiles) so consecutive MMAs do not
     * wait on each other. */
    float acc[MT][4], acc2[MT][4];
#pragma unroll
    for (int i = 0; i < MT; i++)
#pragma unroll
        for (int j = 0; j < 4; j++) acc[i][j] = acc2[i][j] = 0.0f;

    /* Weights stream through a per-warp ring of STAGES chunks in shared
     * memory, filled by cp.async STAGES-1 chunks ahead: many bytes in flight
     * per warp without holding them in registers.  Each lane copies 16-byte
     * segments lane, lane+32, ... of a chunk; cp.async.wait_group plus
     * __syncwarp make the whole chunk visible to every lane.  The chunks of
     * one row block are contiguous, so a warp reads one sequential stream.
     * The weights do not depend on the previous kernel in the stream, so the
     * prologue runs before griddepcontrol.wait (programmatic dependent
     * launch). */
    extern __shared__ uint4 ring_all[];
    uint4 *ring = ring_all + (size_t)warp * STAGES * (CB / 16);
    const uint64_t pol = policy_evict_first();
    const uint4 *wsrc = (const uint4 *)(p.w + ((size_t)(valid ? rb : 0) * p.kchunks + c_begin) * CB);
    auto fetch = [&](int i, int slot) { /* chunk i of this warp's range into slot (== i % STAGES) */
        if (i < nchunks) {
            uint4 *dst = ring + slot * (CB / 16);
            const uint4 *src = wsrc + (size_t)i * (CB / 16);
#pragma unroll
            for (int j = 0; j < (CB / 16 + 31) / 32; j++)
                if (lane + 32 * j < CB / 16) cp_async16_hint(dst + lane + 32 * j, src + lane + 32 * j, pol);
        }
    };
    /* XSH: the activation ring follows the weight rings.  Slot = m_rows rows
     * of 320 bytes (256 of data, 64 of padding); within a row the 16-byte
     * segment holding k = 32t + 8w .. +7 sits at position 4w + t, so a
     * quarter-warp (two tokens x four lanes) reads eight distinct bank
     * groups.  k past the end is zero-filled. */
    uint4 *xring = ring_all + (size_t)WARPS * STAGES * (CB / 16);
    const int m_rows = min(p.m, 8 * MT);
    const __nv_bfloat16 *xg = (const __nv_bfloat16 *)p.x;
    auto fetch_x = [&](int i, int slot) {
        if (XSH && i < cta_n) {
            for (int q = threadIdx.x; q < m_rows * 16; q += WARPS * 32) {
                const int row = q >> 4, seg = q & 15, kk = (cta_begin + i) * NBI_CHUNK_K + 8 * seg;
                const bool in = kk < p.k;
                cp_async16_zfill(xring + (size_t)(slot * m_rows + row) * XROW + (seg & 3) * 4 + (seg >> 2),
                                 in ? xg + (size_t)row * p.lda + kk : xg, in);
            }
        }
    };
    if (XSH) grid_dependency_wait(); /* activations are read from the first copy on */
#pragma unroll
    for (int s = 0; s < STAGES - 1; s++) {
        fetch(s, s);
        fetch_x(s, s);
        cp_async_commit();
    }
    if (!XSH) grid_dependency_wait();
    __syncthreads(); /* scale table ready */

    /* X rows of this lane's tokens */
    const __nv_bfloat16 *xp[MT];
#pragma unroll
    for (int mt = 0; mt < MT; mt++)
        xp[mt] = (const __nv_bfloat16 *)p.x + (size_t)(mt * 8 + g < p.m ? mt * 8 + g : 0) * p.lda +
                 (size_t)c_begin * NBI_CHUNK_K + 32 * t;

    bool tok_ok[MT]; /* this lane's token rows exist */
#pragma unroll
    for (int mt = 0; mt < MT; mt++) tok_ok[mt] = mt * 8 + g < p.m;

    /* The loop is unrolled by the ring depth so every slot address is a
     * constant offset. */
    const int loop_n = XSH ? cta_n : nchunks; /* XSH: every warp joins every barrier */
    for (int i0 = 0; i0 < loop_n; i0 += STAGES)
#pragma unroll
    for (int s = 0; s < STAGES; s++) {
        const int i = i0 + s;
        if (i >= loop_n) break;
        uint4 L, H;
        uint32_t S;
        const uint4 *xslot = xring + (size_t)s * m_rows * XROW;
        if (XSH) {
            cp_async_wait<STAGES - 2>(); /* chunk i's copies by this thread have landed */
            __syncthreads();             /* everyone's; and slot s-1 is free everywhere */
            fetch(i + STAGES - 1, (s + STAGES - 1) % STAGES);
            fetch_x(i + STAGES - 1, (s + STAGES - 1) % STAGES);
            cp_async_commit();
            if (!valid) continue;
            const uint4 *slot = ring + s * (CB / 16);
            L = slot[lane];
            H = slot[32 + lane];
            S = SB == 4 ? ((const uint32_t *)(slot + 64))[lane] : ((const uint16_t *)(slot + 64))[lane];
        } else {
            fetch(i + STAGES - 1, (s + STAGES - 1) % STAGES); /* slot released by the __syncwarp of chunk i-1 */
            cp_async_commit();
            cp_async_wait<STAGES - 1>(); /* this lane's part of chunk i has landed */
            __syncwarp();                /* ... and every other lane's */
            const uint4 *slot = ring + s * (CB / 16);
            L = slot[lane];
            H = slot[32 + lane];
            S = SB == 4 ? ((const uint32_t *)(slot + 64))[lane] : ((const uint16_t *)(slot + 64))[lane];
            __syncwarp(); /* slot s may now be refilled */
        }
        const int kbase = (c_begin + i) * NBI_CHUNK_K + 32 * t;
        /* adjusted scales: rows g and g+8, first and second 16 k of the lane */
        uint32_t sg0, sg1, sh0, sh1;
        if (FMT == NB_FORMAT_NVFP4) {
            sg0 = stab[S & 0xFF];
            sg1 = stab[(S >> 8) & 0xFF];
            sh0 = stab[(S >> 16) & 0xFF];
            sh1 = stab[S >> 24];
        } else {
            sg0 = sg1 = stab[S & 0xFF];
            sh0 = sh1 = stab[(S >> 8) & 0xFF];
        }
        const uint32_t ql[4] = {L.x, L.y, L.z, L.w}, qh[4] = {H.x, H.y, H.z, H.w};
#pragma unroll
        for (int w = 0; w < 4; w++) {
            uint4 xv[MT];
#pragma unroll
            for (int mt = 0; mt < MT; mt++) {
                if (XSH)
                    xv[mt] = tok_ok[mt] ? xslot[(mt * 8 + g) * XROW + 4 * w + t] : make_uint4(0, 0, 0, 0);
                else
                    xv[mt] = tok_ok[mt] && kbase + 8 * w < p.k ? __ldg((const uint4 *)(xp[mt] + i * NBI_CHUNK_K) + w)
                                                               : make_uint4(0, 0, 0, 0);
            }
            const uint32_t sg = w < 2 ? sg0 : sg1, sh = w < 2 ? sh0 : sh1;
            /* tile 2w: elements 0..3 of the word */
            uint32_t a0 = hmul2<ACT>(decode_pair<ACT, 0>(ql[w]), sg);
            uint32_t a1 = hmul2<ACT>(decode_pair<ACT, 0>(qh[w]), sh);
            uint32_t a2 = hmul2<ACT>(decode_pair<ACT, 1>(ql[w]), sg);
            uint32_t a3 = hmul2<ACT>(decode_pair<ACT, 1>(qh[w]), sh);
#pragma unroll
            for (int mt = 0; mt < MT; mt++) mma16816<ACT>(acc[mt], a0, a1, a2, a3, xv[mt].x, xv[mt].y);
            /* tile 2w+1: elements 4..7 */
            a0 = hmul2<ACT>(decode_pair<ACT, 2>(ql[w]), sg);
            a1 = hmul2<ACT>(decode_pair<ACT, 2>(qh[w]), sh);
            a2 = hmul2<ACT>(decode_pair<ACT, 3>(ql[w]), sg);
            a3 = hmul2<ACT>(decode_pair<ACT, 3>(qh[w]), sh);
#pragma unroll
            for (int mt = 0; mt < MT; mt++) mma16816<ACT>(acc2[mt], a0, a1, a2, a3, xv[mt].z, xv[mt].w);
        }
    }
    cp_async_wait<0>();
#pragma unroll
    for (int i = 0; i < MT; i++)
#pragma unroll
        for (int j = 0; j < 4; j++) acc[i][j] += acc2[i][j];

    if (p.kw > 1) { /* in-CTA split-K: slices 1..kw-1 hand their sums to slice 0, in order */
        float *red = (float *)ring_all; /* the rings are idle now */
        __syncthreads();
        if (ks) {
#pragma unroll
            for (int i = 0; i < MT; i++)
#pragma unroll
                for (int j = 0; j < 4; j++) red[((warp * MT + i) * 4 + j) * 32 + lane] = acc[i][j];
        }
        __syncthreads();
        if (!ks) {
            for (int o = 1; o < p.kw; o++)
#pragma unroll
                for (int i = 0; i < MT; i++)
#pragma unroll
                    for (int j = 0; j < 4; j++) acc[i][j] += red[(((warp + o) * MT + i) * 4 + j) * 32 + lane];
        }
    }
    const bool owner = valid && ks == 0; /* this warp writes the row block's result */

    grid_dependents_launch();
    const int rows_pad = p.row_blocks * 16;
    if (p.splits > 1) {
        /* Deterministic split-K: every CTA stores its partial tile; the last
         * to arrive (per column of CTAs) sums all partials in split order. */
        if (owner) {
#pragma unroll
            for (int mt = 0; mt < MT; mt++)
#pragma unroll
                for (int h = 0; h < 2; h++) {
                    const size_t idx = ((size_t)blockIdx.y * rows_pad + rb * 16 + g + 8 * h) * (MT * 8) + mt * 8 + 2 * t;
                    __stcg((float2 *)(p.partial + idx), make_float2(acc[mt][2 * h], acc[mt][2 * h + 1]));
                }
        }
        __threadfence();
        __syncthreads();
        if (threadIdx.x == 0) is_last = atomicAdd(&p.counters[blockIdx.x], 1) == p.splits - 1;
        __syncthreads();
        if (!is_last) return;
        __threadfence();
        if (owner) {
#pragma unroll
            for (int mt = 0; mt < MT; mt++)
#pragma unroll
                for (int h = 0; h < 2; h++) {
                    float s0 = 0.0f, s1 = 0.0f;
                    for (int s = 0; s < p.splits; s++) {
                        const size_t idx = ((size_t)s * rows_pad + rb * 16 + g + 8 * h) * (MT * 8) + mt * 8 + 2 * t;
                        const float2 v = __ldcg((const float2 *)(p.partial + idx));
                        s0 += v.x;
                        s1 += v.y;
                    }
                    acc[mt][2 * h] = s0;
                    acc[mt][2 * h + 1] = s1;
                }
        }
        if (threadIdx.x == 0) p.counters[blockIdx.x] = 0; /* leave the workspace zeroed for the next call */
    }
    if (!owner) return;

    /* Epilogue: accumulator (row, token) -> Y[token, row]. */
#pragma unroll
    for (int mt = 0; mt < MT; mt++)
#pragma unroll
        for (int h = 0; h < 2; h++)
#pragma unroll
            for (int j = 0; j < 2; j++) {
                const int tok = mt * 8 + 2 * t + j, row = rb * 16 + g + 8 * h;
                if (tok < p.m && row < p.n) {
                    float v = ldexpf(acc[mt][2 * h + j], p.exp_shift) * p.ts;
                    if (p.bias) v += nbc_load(ACT, p.bias, (size_t)row);
                    nbc_store(ACT, p.y, (size_t)tok * p.ldc + row, v);
                }
            }
}

/* ------------------------------------------------------------- dispatch */

#define NB_GEMV_WARPS 8

typedef void (*gemv_fn)(const GemvParams);

/* Dynamic shared memory: one ring of NB_GEMV_STAGES chunks per warp (4
 * stages, 8 warps: 36 KB for NVFP4, under the 48 KB default limit; it also
 * holds the in-CTA split-K exchange, at most 8 x 32 x 16 floats). */
static size_t gemv_smem_bytes(int fmt, int mt, int xsh, int m) {
    const size_t cb = NBI_CHUNK_CODE_BYTES + 32 * (fmt == NB_FORMAT_NVFP4 ? 4 : 2);
    const size_t rows = xsh ? (size_t)(m < 8 * mt ? m : 8 * mt) : 0; /* staged activation rows */
    return (size_t)NB_GEMV_WARPS * NB_GEMV_STAGES * cb + (size_t)NB_GEMV_STAGES * rows * XROW * 16;
}

template <int FMT, int ACT>
static gemv_fn pick_mt(int mt, int xsh) {
    switch (mt * 2 + (xsh ? 1 : 0)) {
    case 2: return gemv_fp4_kernel<FMT, ACT, 1, NB_GEMV_WARPS, NB_GEMV_STAGES, false>;
    case 4: return gemv_fp4_kernel<FMT, ACT, 2, NB_GEMV_WARPS, NB_GEMV_STAGES, false>;
    case 5: return gemv_fp4_kernel<FMT, ACT, 2, NB_GEMV_WARPS, NB_GEMV_STAGES, true>;
    case 6: return gemv_fp4_kernel<FMT, ACT, 3, NB_GEMV_WARPS, NB_GEMV_STAGES, false>;
    case 7: return gemv_fp4_kernel<FMT, ACT, 3, NB_GEMV_WARPS, NB_GEMV_STAGES, true>;
    case 8: return gemv_fp4_kernel<FMT, ACT, 4, NB_GEMV_WARPS, NB_GEMV_STAGES, false>;
    case 9: return gemv_fp4_kernel<FMT, ACT, 4, NB_GEMV_WARPS, NB_GEMV_STAGES, true>;
    }
    return NULL; /* mt = 1 has no staged variant */
}

static gemv_fn pick_kernel(int fmt, int act, int mt, int xsh) {
    if (fmt == NB_FORMAT_NVFP4) return act == NB_DTYPE_BF16 ? pick_mt<NB_FORMAT_NVFP4, NB_DTYPE_BF16>(mt, xsh)
                                                             : pick_mt<NB_FORMAT_NVFP4, NB_DTYPE_F16>(mt, xsh);
    if (fmt == NB_FORMAT_MXFP4) return act == NB_DTYPE_BF16 ? pick_mt<NB_FORMAT_MXFP4, NB_DTYPE_BF16>(mt, xsh)
                                                             : pick_mt<NB_FORMAT_MXFP4, NB_DTYPE_F16>(mt, xsh);
    return NULL;
}

extern "C" int nbi_cuda_gemv_shape(int *warps, int *stages) {
    *warps = NB_GEMV_WARPS;
    *stages = NB_GEMV_STAGES;
    return 0;
}

extern "C" int nbi_cuda_gemm(const nbi_gemm_plan *pl, const void *x, const void *packed, const void *bias, void *y,
                             void *workspace, void *stream, char *err) {
    gemv_fn f = pick_kernel(pl->fmt, pl->act, pl->mt, pl->xsh);
    if (!f) return nbc_err(cudaErrorInvalidValue, err, "gemv: no kernel for this format/dtype/m");
    GemvParams p;
    p.w = (const uint8_t *)packed;
    p.x = x;
    p.y = y;
    p.bias = bias;
    p.counters = (int *)workspace;
    p.partial = (float *)((char *)workspace + pl->ws_counter_bytes);
    p.m = (int)pl->m;
    p.n = (int)pl->n;
    p.k = (int)pl->k;
    p.lda = pl->lda;
    p.ldc = pl->ldc;
    p.row_blocks = (int)pl->row_blocks;
    p.kchunks = (int)pl->kchunks;
    p.cps = pl->chunks_per_split;
    p.splits = pl->splits;
    p.kw = pl->kw;
    p.exp_shift = pl->exp_shift;
    memcpy(p.stab, pl->scale_table, sizeof p.stab);
    p.ts = pl->tensor_scale;
    dim3 grid((unsigned)pl->grid_x, (unsigned)pl->splits);
    const size_t smem = gemv_smem_bytes(pl->fmt, pl->mt, pl->xsh, (int)pl->m);
    /* With staged activations the CTA can exceed the 48 KB default (static +
     * dynamic): opt in once per kernel, for its largest launch. */
    static int opted_in[3][4][5];
    if (pl->xsh && !opted_in[pl->fmt][pl->act][pl->mt]) {
        NBC_TRY(cudaFuncSetAttribute(f, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                     (int)gemv_smem_bytes(pl->fmt, pl->mt, 1, 8 * pl->mt)),
                "cudaFuncSetAttribute(max dynamic shared memory)");
        opted_in[pl->fmt][pl->act][pl->mt] = 1; /* idempotent: a race only repeats the call */
    }
    cudaLaunchAttribute attr[1];
    cudaLaunchConfig_t cfg = nbc_launch_config(grid, dim3(NB_GEMV_WARPS * 32), smem, stream, pl->pdl, attr);
    NBC_TRY(cudaLaunchKernelEx(&cfg, f, p), "gemv kernel launch");
    return 0;
}
