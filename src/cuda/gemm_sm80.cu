/* gemm_sm80.cu - the tensor-core path with mma.sync, for GPUs without the
 * Hopper kernel (A100, A10/A40, L40S, RTX 30/40: sm_80, sm_86, sm_89; it
 * runs on Hopper too): Y[m, n] = X[m, k] . W[n, k]^T (+ bias) for m above
 * the decode range, W in NVFP4 or MXFP4 in the packed layout of
 * gemv_fp4.cu (the same bytes serve every path), or in an integer or table
 * format (int4, int4_sym, nf4, bnb_fp4; template parameter KG, the kernel
 * group, 0 for E2M1) in their group-aligned layout, X and Y in BF16 or FP16.
 * The integer and table formats' warps dequantize their half chunk from
 * the words 2kh, 2kh+1 of each of their rows' four pieces
 * (tc_dequant.cuh nbc_dequant_half_grp), rounding the weights to the
 * activation dtype as the Hopper kernel does (DESIGN.md 4.2.3).
 *
 * WHAT IT DOES
 *   A CTA (256 threads) owns a tile of 128 weight rows (8 row blocks of 16)
 *   x BN tokens (64 or 128) and walks k in chunks of 128, one packed chunk
 *   per row block.  STAGES chunks are in flight through a cp.async ring
 *   (16-byte cp.async.cg; weights with an L2 evict-first policy, as they are
 *   read once per tile): per stage the 8 packed chunks of the tile (warp w
 *   copies row block w's contiguous 1152 or 1088 bytes) and the activation
 *   tile, BN token rows x 256 bytes.  One __syncthreads per chunk: after it,
 *   the stage read in the previous step is refilled.
 *
 *   Warp w owns row blocks 2(w%4) and 2(w%4)+1 and half of every chunk's k:
 *   k16 tiles 4(w/4) .. 4(w/4)+3.  Per chunk it dequantizes its 2 row
 *   blocks x 4 tiles straight from the packed bytes in shared memory (the
 *   A fragments: tc_dequant.cuh, the code the Hopper kernel uses), loads
 *   the B fragments of all BN tokens with ldmatrix and issues 2 x 4 x BN/8
 *   mma.sync.m16n8k16 (FP32 accumulators, 2 x BN/8 x 4 per thread).  At the
 *   end the two warps of a row-block pair exchange their partial sums of one
 *   row block each through shared memory (the ring is idle by then; the sum
 *   of two terms does not depend on which warp adds), and each stores one
 *   row block: times 2^exp_shift * tensor_scale, plus the bias, BF16/FP16,
 *   only rows < n and tokens < m.
 *
 * WHY THIS WARP TILING (per k16 tile and MMA; shared memory in 128-byte
 * wavefronts, one per cycle per SM)
 *   An A100 SM completes one m16n8k16 every 2 cycles (each of its four
 *   schedulers one per 8): a chunk of a 128 x 128 tile is 1024 MMAs, 2048
 *   cycles, with 8 issue slots and 2 shared-memory cycles per MMA.  What
 *   the warp tiling changes is the decode work and the shared-memory
 *   traffic per MMA:
 *   - B (activations): a warp tile of R row blocks x N tokens reads N x 32
 *     bytes per k16 tile (N/16 ldmatrix.x4 of 4 wavefronts) for R x N/8
 *     MMAs: 2/R wavefronts per MMA -- all of the bandwidth with one row
 *     block per warp, half with two.
 *   - A (weights): a row block's 16 x 16 tile costs about 30 instructions
 *     to decode (SASS below) and about 8.5 wavefronts (16-byte reads that
 *     are 4-way broadcasts but 4 wavefronts each, scale-table reads that hit
 *     random banks); it serves N/8 MMAs.
 *   - the cp.async writes: (8 x 1152 + 256 N') bytes per chunk of a tile of
 *     N' tokens, for 8 N' MMAs.
 *   Options (R x N x share of k) at N' = 128, per MMA: decode instructions;
 *   wavefronts B + A + copies:
 *     1 x 128 x all  (one row block per warp)    1.9;  2.0 + 0.5 + 0.3 = 2.8
 *     2 x  64 x all  (both warps decode a block) 3.8;  1.0 + 1.1 + 0.3 = 2.4
 *     2 x 128 x half (this kernel)               1.9;  1.0 + 0.5 + 0.3 = 1.8
 *   Only the last stays under the A100's 2 cycles per MMA (an L40S SM's
 *   tensor cores take 4 cycles per MMA: there all three would do); its cost
 *   is 128 accumulator registers (one CTA of 8 warps per SM) and the
 *   exchange at the end (64 KB once per tile).  The 64-token tile with the
 *   same tiling: 3.8 instructions, 1.0 + 1.1 + 0.4 = 2.5 wavefronts per MMA
 *   (shared-memory bound on an A100 at about 80% of the tensor rate).
 *   SASS of the main loop (sm_80, NVFP4, per warp and chunk): 128-token
 *   tile 541 instructions for 128 HMMA (32 LDSM, 32 LDS, 32 HFMA2 for the
 *   scaling, about 280 integer); 64-token tile 402 for 64 HMMA.
 *
 * ACTIVATION TILE AND LDMATRIX
 *   X rows are k-contiguous, which is the column-major ("col") B operand:
 *   token n's 16 k of a k16 tile are two 16-byte rows of an 8x8 b16 matrix
 *   for ldmatrix (non-transposed), and thread (g, t) receives token g, k
 *   2t..2t+1 (b0) and 2t+8..2t+9 (b1): the mma B fragment (PTX ISA
 *   "ldmatrix", "Matrix Fragments for mma.m16n8k16").  ldmatrix.x4 reads
 *   16 tokens x 16 k: lanes 0-7 give the rows of tokens 0-7 at k 0-7, lanes
 *   8-15 tokens 0-7 at k 8-15, lanes 16-31 the same for tokens 8-15.  A
 *   token row holds 16 pieces of 16 bytes (8 k each); piece c of token n is
 *   stored at position c ^ (n & 7), so the 8 rows an 8x8 matrix reads (8
 *   consecutive tokens, one column c) fall in 8 different groups of 4 banks:
 *   conflict-free (the cp.async writes, runs of 4 or 8 pieces of a row per
 *   thread, conflict at most 2-way).  A lane's address for tile j is its base ^ 32j (the
 *   XOR only touches bits 5-6, which no other term sets).
 *
 * OUT OF RANGE
 *   Row blocks past n fetch the last row block instead (valid bytes, never
 *   stored); token rows past m read row m-1 (likewise); k past the end of a
 *   ragged last chunk is zero-filled (cp.async src-size 0) so that the zero
 *   weight codes there meet zeros, not whatever follows in memory.
 *
 * LIMITS  compute capability 8.0 or later; x rows 16-byte aligned (lda a
 *         multiple of 8, checked by nb_gemm); k a multiple of the group;
 *         m < 2^31 - 256.  Shared memory: 64 x 3 stages 78 KB (NVFP4), 128 x 2
 *         85 KB, 128 x 3 127 KB; the host picks the deepest that fits.
 * TEST    NIBBLE_PATH=mma build/tests/test_gpu --quick (scripts/device-check
 *         quick or mma runs it, and under compute-sanitizer memcheck and
 *         racecheck).
 * BENCH   NIBBLE_PATH=mma nibble bench (scripts/device-check bench or mma).
 */
#include "common.cuh"
#include "tc_dequant.cuh"

#define SM80_THREADS 256 /* 8 warps: 4 row-block pairs x 2 halves of each chunk's k */
/* One CTA per SM asked of the register allocator, for every tile: two
 * would let two 64-token CTAs share an A100 SM (shared memory allows it),
 * but cap registers at 128 where the loop wants 142, and ptxas then spills
 * a loop-invariant pointer (reloaded once per chunk). */

struct Sm80Params {
    const uint8_t *w;
    const uint16_t *x;
    void *y;
    const void *bias;
    int m, n, k;
    int64_t lda, ldc;
    int row_blocks, kchunks;
    int tiles_n, tiles_m, group; /* tile grid and its raster (group of n tiles walked together) */
    int exp_shift;
    float ts;
    uint32_t stab[128];
    int scale_bf16; /* integer formats: the scales are BF16 (else F16) */
};

/* Shared memory: STAGES activation tiles, STAGES x 8 packed chunks, the
 * scale table; 128 bytes to align the base (the swizzle and the XOR
 * addressing assume a 128-byte aligned base).  The exchange of partial sums
 * at the end reuses the stages. */
template <int FMT, int KG, int BN, int STAGES>
struct Sm80Smem {
    static constexpr int CB = nbc_chunk_bytes<FMT, KG>();
    static constexpr int X_STAGE = BN * 256; /* BN tokens x 128 k, 16-bit */
    static constexpr int W_STAGE = 8 * CB;
    static constexpr int X_OFF = 0;
    static constexpr int W_OFF = STAGES * X_STAGE;
    static constexpr int TAB_OFF = W_OFF + STAGES * W_STAGE;
    static constexpr int BYTES = TAB_OFF + 1024 + 128;
    static_assert(TAB_OFF >= 8 * 32 * (BN / 2) * 4, "the exchange of partial sums fits in the stages");
};

/* Four 8x8 b16 matrices from shared memory, each lane giving one 16-byte
 * row address (lanes 8i..8i+7: matrix i); lane (g, t) receives row g,
 * elements 2t, 2t+1 of each. */
__device__ __forceinline__ void ldmatrix_x4(uint32_t (&r)[4], uint32_t addr) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(addr));
}

/* k16 tile jj of the warp's two row blocks (A fragments a0, a1) times the
 * B fragments of all BN tokens (xa: this lane's ldmatrix row of the tile). */
template <int ACT, int BN>
__device__ __forceinline__ void sm80_mma_tile(uint32_t xa, const uint32_t (&a0)[4], const uint32_t (&a1)[4],
                                              float (&acc)[2][BN / 8][4]) {
#pragma unroll
    for (int nb = 0; nb < BN / 16; nb++) {
        uint32_t b[4];
        ldmatrix_x4(b, xa + nb * 4096);
        nbc_mma16816<ACT>(acc[0][2 * nb], a0[0], a0[1], a0[2], a0[3], b[0], b[1]);
        nbc_mma16816<ACT>(acc[0][2 * nb + 1], a0[0], a0[1], a0[2], a0[3], b[2], b[3]);
        nbc_mma16816<ACT>(acc[1][2 * nb], a1[0], a1[1], a1[2], a1[3], b[0], b[1]);
        nbc_mma16816<ACT>(acc[1][2 * nb + 1], a1[0], a1[1], a1[2], a1[3], b[2], b[3]);
    }
}

/* One chunk of a warp's work: its 2 row blocks x 4 k16 tiles (half kh of
 * the chunk's k), dequantized from the packed bytes of the stage (wst: row
 * block 2rp) into A fragments, times the B fragments of all BN tokens
 * loaded with ldmatrix from the staged activations (xst: this lane's row
 * address), into acc[row block][n8 tile].  t: the lane's index in its
 * quad; l: its E2M1 decode amounts (tc_dequant.cuh nbc_e2m1_lane_of). */
template <int FMT, int ACT, int KG, int BN>
__device__ __forceinline__ void sm80_mma_chunk(const uint8_t *wst, uint32_t xst, const uint32_t *stab, int g, int t,
                                               nbc_e2m1_lane l, int kh, int scale_bf16, float (&acc)[2][BN / 8][4]) {
    constexpr int CB = nbc_chunk_bytes<FMT, KG>();
    if constexpr (KG > 0) { /* an integer or table format: the half chunk's four tiles, then the MMAs */
        uint32_t a[2][4][4];
#pragma unroll
        for (int r = 0; r < 2; r++) nbc_dequant_half_grp<FMT, ACT, KG>(wst + r * CB, stab, g, t, kh,
                                                                      scale_bf16, a[r]);
#pragma unroll
        for (int jj = 0; jj < 4; jj++) sm80_mma_tile<ACT, BN>(xst ^ (32u * jj), a[0][jj], a[1][jj], acc);
    } else { /* E2M1 */
        uint32_t sw[2][2]; /* scale words of this half: row block r, tiles 2qq, 2qq+1 */
#pragma unroll
        for (int r = 0; r < 2; r++) {
            if (nbc_fmt<FMT>::group == 16) { /* words 2kh, 2kh+1 of the 16 bytes at 1024 + 16g */
                const uint2 v = *(const uint2 *)(wst + r * CB + 1024 + 16 * g + 8 * kh);
                sw[r][0] = v.x, sw[r][1] = v.y;
            } else { /* word kh of the 8 bytes at 1024 + 8g */
                sw[r][0] = sw[r][1] = *(const uint32_t *)(wst + r * CB + 1024 + 8 * g + 4 * kh);
            }
        }
        uint32_t a[2][4][4];
#pragma unroll
        for (int qq = 0; qq < 2; qq++) {
#pragma unroll
            for (int r = 0; r < 2; r++)
                nbc_dequant_tiles<FMT, ACT>(wst + r * CB + 32 * kh, stab, g, l, qq, sw[r][qq], a[r]);
#pragma unroll
            for (int jj = 2 * qq; jj < 2 * qq + 2; jj++)
                sm80_mma_tile<ACT, BN>(xst ^ (32u * jj), a[0][jj], a[1][jj], acc);
        }
    }
}

/* Warp (rp, kh) finishes row block 2rp + kh: acc[0] becomes that block's
 * partial sums, acc[1] the other block's, which the partner warp (rp,
 * 1 - kh) receives through shared memory (xch: the idle stages); after the
 * exchange acc[0] holds the block's whole sums (a sum of two terms, the
 * same whichever warp adds). */
template <int NT>
__device__ __forceinline__ void sm80_exchange(float (&acc)[2][NT][4], float4 *xch, int warp, int lane, int kh) {
    if (kh) {
#pragma unroll
        for (int i = 0; i < NT; i++)
#pragma unroll
            for (int e = 0; e < 4; e++) {
                const float v = acc[0][i][e];
                acc[0][i][e] = acc[1][i][e];
                acc[1][i][e] = v;
            }
    }
#pragma unroll
    for (int i = 0; i < NT; i++)
        xch[(warp * NT + i) * 32 + lane] = make_float4(acc[1][i][0], acc[1][i][1], acc[1][i][2], acc[1][i][3]);
    __syncthreads();
#pragma unroll
    for (int i = 0; i < NT; i++) {
        const float4 v = xch[((warp ^ 4) * NT + i) * 32 + lane];
        acc[0][i][0] += v.x, acc[0][i][1] += v.y, acc[0][i][2] += v.z, acc[0][i][3] += v.w;
    }
}

template <int FMT, int ACT, int KG, int BN, int STAGES>
__global__ void __launch_bounds__(SM80_THREADS, 1) gemm_sm80_kernel(const Sm80Params p) {
    if constexpr (KG == 0) NBC_CHECK_KERNEL_FORMAT(FMT);
    typedef Sm80Smem<FMT, KG, BN, STAGES> L;
    constexpr int CB = L::CB;
    constexpr int NT = BN / 8; /* n8 tiles per warp */
    extern __shared__ uint8_t smem_raw[];
    /* Align by offsetting smem_raw itself, so that the compiler still knows
     * every access is to shared memory. */
    uint8_t *smem = smem_raw + ((128u - (nbc_smem_u32(smem_raw) & 127u)) & 127u);
    uint32_t *stab = (uint32_t *)(smem + L::TAB_OFF);
    const uint32_t sbase = nbc_smem_u32(smem);
    const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31;
    const int g = lane >> 2, t = lane & 3;

    int tn, tm;
    nbc_raster(blockIdx.x, p.group, p.tiles_n, p.tiles_m, tn, tm);
    const int rb0 = tn * 8, tok0 = tm * BN;
    nbc_load_scale_table<SM80_THREADS>(stab, p.stab); /* (published by the first barrier of the loop) */

    /* Weights: warp w copies row block rb0 + w of each chunk, lane L its
     * pieces L, L + 32 (+ 64, + 96 for int8) and (first lanes) the scale bytes: one contiguous
     * stream per warp, the next chunk CB bytes on. */
    const uint64_t pol = nbc_policy_evict_first();
    const uint8_t *wnext = p.w + (size_t)min(rb0 + warp, p.row_blocks - 1) * p.kchunks * CB + 16 * lane;
    const uint32_t wdst = sbase + L::W_OFF + warp * CB + 16 * lane;
    auto fetch_w = [&](int s) {
        nbc_fetch_chunk<nbc_code_bytes<FMT, KG>(), CB>(wdst + s * L::W_STAGE, wnext, lane, pol);
        wnext += CB;
    };
    /* Activations: 256 / BN threads per token row, each copying a run of
     * PPT consecutive pieces (16 bytes, 8 k) of it: piece c of token n goes
     * to position c ^ (n & 7), i.e. the run's first position ^ v for piece
     * v of the run (the XOR stays within bits 4-6 of the address).  One
     * row pointer per thread; only the last chunk of a ragged k needs the
     * zero fill. */
    constexpr int PPT = 16 * BN / SM80_THREADS;
    const int xn = tid / (16 / PPT), x0 = PPT * (tid % (16 / PPT)); /* token row, first piece */
    const uint16_t *xrow = p.x + (size_t)min(tok0 + xn, p.m - 1) * p.lda + 8 * x0;
    const uint32_t xdst = sbase + L::X_OFF + xn * 256 + 16 * (x0 ^ (xn & 7));
    auto fetch_x = [&](int kc, int s) {
        const uint16_t *src = xrow + (size_t)kc * NBI_CHUNK_K;
        const uint32_t d = xdst + s * L::X_STAGE;
        const int left = (p.k - kc * NBI_CHUNK_K) / 8 - x0; /* pieces of the run inside k */
        if (left >= PPT) {
#pragma unroll
            for (int v = 0; v < PPT; v++) nbc_cp_async16_zfill(d ^ (16u * v), src + 8 * v, true);
        } else {
#pragma unroll
            for (int v = 0; v < PPT; v++) nbc_cp_async16_zfill(d ^ (16u * v), v < left ? src + 8 * v : xrow, v < left);
        }
    };

    /* Prologue: STAGES-1 chunks.  The weights do not depend on the previous
     * kernel in the stream, so they are requested before griddepcontrol.wait
     * (programmatic dependent launch); the first commit group holds them all. */
#pragma unroll
    for (int s = 0; s < STAGES - 1; s++)
        if (s < p.kchunks) fetch_w(s);
    nbc_grid_dependency_wait();
#pragma unroll
    for (int s = 0; s < STAGES - 1; s++) {
        if (s < p.kchunks) fetch_x(s, s);
        nbc_cp_async_commit();
    }

    const int rp = warp & 3, kh = warp >> 2; /* row blocks 2rp, 2rp+1; k16 tiles 4kh .. 4kh+3 */
    const nbc_e2m1_lane l = nbc_e2m1_lane_of<ACT>(t); /* (E2M1: this lane's pair of every word) */
    float acc[2][NT][4];
#pragma unroll
    for (int r = 0; r < 2; r++)
#pragma unroll
        for (int i = 0; i < NT; i++)
#pragma unroll
            for (int e = 0; e < 4; e++) acc[r][i][e] = 0.0f;
    /* this lane's ldmatrix row: token (lane & 7) + 8 (lane >> 4) of each 16,
     * piece 8kh + 2jj + ((lane >> 3) & 1) of tile jj, stored at that ^ (lane & 7) */
    const uint32_t xlane = sbase + L::X_OFF + ((lane & 7) + 8 * (lane >> 4)) * 256 + 128 * kh +
                           16 * (((lane >> 3) & 1) ^ (lane & 7));
    int rs = 0; /* the stage read in this step; the one refilled is the one before it */
    for (int kc = 0; kc < p.kchunks; kc++) {
        nbc_cp_async_wait<STAGES - 2>(); /* this thread's copies of chunk kc have landed */
        __syncthreads();                  /* ... and everyone's; stage fs is no longer read */
        if (kc + STAGES - 1 < p.kchunks) {
            const int fs = rs == 0 ? STAGES - 1 : rs - 1;
            fetch_w(fs);
            fetch_x(kc + STAGES - 1, fs);
        }
        nbc_cp_async_commit();

        const uint8_t *wst = smem + L::W_OFF + rs * L::W_STAGE + 2 * rp * CB;
        const uint32_t xst = xlane + rs * L::X_STAGE;
        rs = rs == STAGES - 1 ? 0 : rs + 1;
        sm80_mma_chunk<FMT, ACT, KG, BN>(wst, xst, stab, g, t, l, kh, p.scale_bf16, acc);
    }
    nbc_cp_async_wait<0>();
    __syncthreads(); /* every warp is past its last read of the stages */
    nbc_grid_dependents_launch();

    sm80_exchange<NT>(acc, (float4 *)smem, warp, lane, kh);
    /* Epilogue: accumulator (row, token) -> Y[token, row]. */
    nbc_store_block<ACT, NT>(&acc[0][0][0], (rb0 + 2 * rp + kh) * 16, tok0, g, t, p.m, p.n, p.ldc, p.y, p.bias,
                             p.exp_shift, p.ts);
}

/* ------------------------------------------------------------- dispatch */

typedef void (*sm80_fn)(const Sm80Params);

/* The instances, (tile width, stages), deepest first per width: 64 x 3
 * (78 KB with NVFP4: fits the 99 KB of sm_86/sm_89, and twice in an A100
 * SM), 128 x 3 (127 KB: A100, Hopper), 128 x 2 (85 KB: sm_86/sm_89). */
static const int k_shapes[3][2] = {{64, 3}, {128, 3}, {128, 2}};

template <int FMT, int ACT, int KG>
static sm80_fn sm80_pick_shape(int shape, size_t *smem) {
    switch (shape) {
    case 0: *smem = Sm80Smem<FMT, KG, 64, 3>::BYTES; return gemm_sm80_kernel<FMT, ACT, KG, 64, 3>;
    case 1: *smem = Sm80Smem<FMT, KG, 128, 3>::BYTES; return gemm_sm80_kernel<FMT, ACT, KG, 128, 3>;
    case 2: *smem = Sm80Smem<FMT, KG, 128, 2>::BYTES; return gemm_sm80_kernel<FMT, ACT, KG, 128, 2>;
    }
    return NULL;
}

/* An integer or table format's instances for its kernel group. */
template <int FMT, int ACT>
static sm80_fn sm80_pick_grp(int shape, int kg, size_t *smem) {
#define SM80_KG(KG) sm80_pick_shape<FMT, ACT, KG>(shape, smem)
    return NBC_KG_PICK(kg, SM80_KG);
#undef SM80_KG
}

static sm80_fn sm80_pick(int fmt, int act, int shape, int kg, size_t *smem) {
#define SM80_RUNG(F, A) return sm80_pick_shape<F, A, 0>(shape, smem);
    NBC_LADDER(fmt, act, SM80_RUNG)
#undef SM80_RUNG
#define SM80_GRP_RUNG(F, A) return sm80_pick_grp<F, A>(shape, kg, smem);
    NBC_DECODE_LADDER(fmt, act, SM80_GRP_RUNG)
#undef SM80_GRP_RUNG
    return NULL;
}

static int shape_of(int bn, int stages) {
    for (int i = 0; i < 3; i++)
        if (k_shapes[i][0] == bn && k_shapes[i][1] == stages) return i;
    return -1;
}

extern "C" int nbi_cuda_gemm_sm80_stages(int fmt, int kg, int bn, int want, size_t smem_limit, size_t *smem) {
    for (int i = 0; i < 3; i++) {
        size_t bytes = 0;
        if (k_shapes[i][0] != bn || (want && k_shapes[i][1] != want) || !sm80_pick(fmt, NB_DTYPE_BF16, i, kg, &bytes))
            continue;
        if (bytes <= smem_limit) {
            *smem = bytes;
            return k_shapes[i][1];
        }
    }
    return 0;
}

extern "C" nb_status nbi_cuda_gemm_sm80(nb_context *ctx, const nbi_gemm_plan *pl, const void *x, const void *packed,
                                        const void *bias, void *y, void *stream) {
    size_t smem = 0;
    const int shape = shape_of(pl->bn, pl->stages);
    sm80_fn f = shape < 0 ? NULL : sm80_pick(pl->fmt, pl->act, shape, pl->group, &smem);
    if (!f)
        return nbi_fail(ctx, NB_ERR_INTERNAL, "gemm_sm80: no kernel for %s, %s, %d-token tiles, %d stages",
                        nbi_traits((nb_format)pl->fmt)->name, nbi_dtype_name((nb_dtype)pl->act), pl->bn, pl->stages);
    Sm80Params p;
    NBC_SET_GEMM_PARAMS(p, pl, packed, y, bias);
    p.x = (const uint16_t *)x;
    p.lda = pl->lda;
    p.tiles_n = pl->tiles_n;
    p.tiles_m = pl->tiles_m;
    p.group = pl->raster_group;
    p.scale_bf16 = pl->scale_bf16;
    nb_status st = nbc_smem_opt_in(ctx, (const void *)f, smem);
    if (st) return st;
    cudaLaunchAttribute attr[1];
    const dim3 grid((unsigned)(pl->tiles_n * pl->tiles_m));
    cudaLaunchConfig_t cfg = nbc_launch_config(grid, dim3(SM80_THREADS), smem, stream, pl->pdl, attr);
    NBC_TRY(cudaLaunchKernelEx(&cfg, f, p), "gemm_sm80 kernel launch");
    return NB_OK;
}
