/* gemv_fp4.cu - the decode path: Y[m, n] = X[m, k] . W[n, k]^T for m <= 32,
 * W in NVFP4 or MXFP4 (packed layout below), X and Y in BF16 or FP16.
 *
 * WHAT IT DOES
 *   Memory-bound: every weight byte is read once from HBM and dequantized in
 *   registers.  The tensor cores run mma.sync.m16n8k16 with the operands
 *   swapped: the dequantized weights are the 16-row A operand and the tokens
 *   the 8-wide B operand, so m = 1..8 costs one MMA per 16x16 weight tile and
 *   m = 32 four.  Two kernels:
 *   - kernel 1 (gemv_fp4_kernel; m = 1..8, and 9..32 on layers too narrow
 *     for kernel 2): a CTA has 8 warps; each warp streams one 16-row block's
 *     chunks through its own shared-memory ring (cp.async, STAGES deep) and
 *     each lane loads its activations through L1.  kw warps may share a row
 *     block and split its k range (summed in shared memory); where a
 *     one-wave grid would leave some SMs with one CTA fewer than the rest,
 *     a CTA takes fewer row blocks and its last warps idle (the planner's
 *     balanced wave, p.rpc);
 *   - kernel 2 (gemv_fp4_xs_kernel; m = 9..32, and 8 on wide layers): 8
 *     consumer warps (12 in the wide instance, 17..24 tokens on large
 *     layers) walk one k range, each owning RPW = 2 row blocks that share
 *     its B fragments (RPW = 4 with 8 warps at 17..24 tokens and 7 at
 *     25..32 on the widest layers' stream-K wave: plan.c k2_rpw4), and
 *     one more warp stages each chunk's activations
 *     once per CTA in a shared ring synchronized by mbarriers (no CTA-wide
 *     barrier in the loop).
 *   CTAs along grid.y may split k further (partials in the workspace, summed
 *   in split order by the last CTA to arrive: the result does not depend on
 *   timing).  Where kernel 2's column tiles alone are more than one resident
 *   wave, its grid is one wave over which the tiles' k chunks spread evenly
 *   (stream-K, gemv_xs_sk_body; a tile shared by CTAs is summed the same
 *   way).  The planner (src/plan.c) picks the kernel, kw, RPW and the grid
 *   from the shape and the device.
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
 *   k0 = 32t + 8w .. +7, elements 2i and 2i+1 (pair i) in its low and high
 *   16-bit halves, where their bits e1 e0 m sit at [6,3,0,9][i] .. +2 and
 *   their signs at [15,12,13,14][i] (internal.h NBI_E2M1_MAG / _SIGN): pair
 *   0 is already a BF16 operand's bit pattern, pair 1 one shift from it,
 *   pairs 2 and 3 two (gemv_step.cuh decode_pair; 11 instructions per word
 *   with BF16).  Rows past n and k past the end are zero codes with scale
 *   byte 0 (a zero weight for every format).
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
 *   scales give NaN outputs.  (Kernel 1 converts NVFP4's E4M3 bytes with
 *   cvt.rn.f16x2.e4m3x2 instead on sm_89+, the same values:
 *   gemv_step.cuh e4m3_adjusted.)  c: NVFP4 BF16 7, FP16 8; MXFP4 BF16 emax-127
 *   (needs emax - emin <= 125), FP16 emax-128 (needs emax - emin <= 24).
 *
 * INTEGER FORMATS (int4 with zero points, int4_sym, int8; kernel 1
 *   gemv_int4_kernel<FMT, ACT, MT, KG> and kernel 2 gemv_int_xs_kernel
 *   <FMT, ACT, MT, KG, MINB>, KG the kernel group 32, 64 or 128)
 *   Their scales are F16/BF16 per group of 32..128 (or one per row), too
 *   many distinct values for a table and (q - z) * s is not exact in 16
 *   bits, so the scale is applied after the MMA, in FP32.  The packed
 *   layout (docs/formats.md 8.7) puts k = 32G + 8t + e in word G of lane t,
 *   so tiles 2G and 2G+1 lie in the 32-wide sub-range G and inside one
 *   kernel group.  The MMA operand is the exact integer q - z built in 16
 *   bits with a magic number (gemv_step.cuh int_pair: one LOP3, one HSUB2;
 *   int8's q in i8_pair, docs/formats.md 8.9: a chunk holds 2048 code
 *   bytes, two 16-byte pieces per lane and row, the same k per word pair);
 *   each kernel group's MMAs accumulate into zeroed FP32 tiles, which then
 *   enter the accumulators times the group's scale (one FFMA per element).
 *   The only roundings are FP32 accumulation and the final one to ACT.
 *   A NaN scale gives NaN; an infinite one gives inf (NaN where the group's
 *   sum is 0), where the reference's per-element products give NaN for
 *   every element with q = z: infinite scales are not matched.
 *   Kernel 2 stages a chunk's activations in k order (word G of lane t at
 *   position 4G + t) and runs the same step per row block (xs_step_int).
 *   Larger m runs on the Hopper tensor-core kernel (gemm_sm90.cu, past m =
 *   32, or from 25 on small layers: plan.c); elsewhere, and for BF16 scales
 *   with FP16 activations, one launch per 32 rows (weights re-read).
 *
 * TABLE FORMATS (bitsandbytes nf4 and fp4; kernel 1 gemv_table_kernel
 *   <FMT, ACT, MT, KG>, kernel 2 gemv_int_xs_kernel as the integers)
 *   A code indexes a table of 16 float32 values; each block of 32..4096
 *   (default 64) has an F32 absmax (a nested absmax is resolved by the
 *   checkpoint reader, as bitsandbytes does).  The same group-aligned chunks
 *   as the integer formats (docs/formats.md 8.8: F32 scales, and a word's
 *   nibbles in k order), so the absmax is applied in FP32 per kernel group
 *   exactly as the integer scales are.  The MMA operand is the table value
 *   rounded to ACT (round to nearest even, on the host: nbi_table_planes),
 *   looked up by kernel 1 in a table of operand pairs in shared memory, one
 *   copy per lane (gemv_step.cuh a_frag_lut, 12 instructions per word of 8
 *   codes; where two CTAs with the table fit an SM, gemv_table_lut_fits),
 *   else and by kernel 2 in registers with PRMT (a_frag_table, 21; about 12
 *   for the integers' magic numbers and 20 for E2M1's decode and HMUL2;
 *   DESIGN.md 4.2.2).  That rounding is
 *   the one difference from the reference's fl32(v * absmax): at most
 *   |x| |absmax| |r(v) - v| per term, r(v) within 2^-8 (BF16) or 2^-11
 *   (FP16) of v relative (DESIGN.md 4.2.2; bitsandbytes itself rounds
 *   fl32(v * absmax) to ACT, an error of the same size).  Padding codes
 *   (0, a table value of -1 in nf4) meet a scale of 0 or activations read
 *   as zero.  A NaN absmax gives NaN in its row.
 *
 * LIMITS  m <= 32 per launch (nb_gemm slices larger m); x rows 16-byte
 *   aligned; k a multiple of the group.
 * TEST    build/tests/test_gpu, build/tests/test_gpu_int (the integer and
 *         table formats; scripts/device-check runs both under
 *         compute-sanitizer too).  BENCH  nibble bench (--formats nf4 ...).
 */
#include "common.cuh"
#include "gemv_step.cuh"

/* Weight chunks in each warp's shared-memory ring (STAGES-1 in flight) and
 * the CTAs per SM asked of the register allocator: measured on an H100
 * (DESIGN.md, decode kernels). */
#define GEMV_STAGES 4
#define GEMV_MINB 1
/* Kernel 1 lets the next grid launch once a warp has issued its last loads
 * when its stream is at most this many chunks, else after its loop (the
 * EARLY instances; common.cuh).  H100, nvfp4, m = 1, against the late
 * trigger: 4096 -> 4096 (4 chunks a warp) -12%, 4096 -> 6144 (8) -9%,
 * 4096 -> 28672 (8) -5%; the early trigger on every stream cost 8192 ->
 * 8192 (16) 15% and 14336 -> 4096 (14) 10% (NOTES.md). */
#define GEMV_EARLY_CHUNKS 8
#define XROW 20 /* uint4 per staged activation row of a chunk: 256 bytes + 64 of padding */
#define GEMV_STATIC_SMEM (256 * 4 + 16) /* static shared memory: the scale table, is_last (kernel 2: + barriers) */
/* kernel 1's: + its ring barriers (8 bytes per warp and slot) */
#define GEMV_K1_BARRIERS (NBI_GEMV_WARPS * GEMV_STAGES)
#define GEMV_K1_STATIC_SMEM (GEMV_STATIC_SMEM + 8 * GEMV_K1_BARRIERS)
/* static bytes as they are laid out: the dynamic ring starts at the next 128-byte boundary (kernel 1, ring_all) */
#define GEMV_SMEM_ALIGN(b) (((size_t)(b) + 127) / 128 * 128)

struct GemvParams {
    const uint8_t *w;
    const void *x;
    void *y;
    const void *bias;
    float *partial;
    int *counters;
    int m, n, k;
    int tiles; /* kernel 2's stream-K grid: column tiles of WARPS * rpw row blocks (in the padding before lda) */
    int64_t lda, ldc;
    int row_blocks, kchunks, cps, splits;
    int kw;          /* warps of a CTA that split one row block's k range (1, 2, 4, 8) */
    int rpc;         /* kernel 1: row blocks per CTA, at most WARPS / kw (fewer: the warps past them idle) */
    int exp_shift;   /* epilogue: ldexp(acc, exp_shift) * ts */
    float ts;
    uint32_t stab[128]; /* scale byte b -> adjusted 16-bit scale, two per word (built on the host) */
    int scale_bf16;     /* integer formats: the 16-bit scales are BF16 (else F16) */
};

/* Epilogue of one 16-row block (acc[MT][4]: MT tiles of 8 tokens). */
template <int ACT, int MT>
__device__ __forceinline__ void store_block(const GemvParams &p, const float (&acc)[MT][4], int rb, int g, int t) {
    nbc_store_block<ACT, MT>(&acc[0][0], rb * 16, 0, g, t, p.m, p.n, p.ldc, p.y, p.bias, p.exp_shift, p.ts);
}

/* Deterministic split-K over the CTAs of one grid column (grid.y): every
 * CTA stores its partial tiles in the workspace; the last to arrive sums
 * all partials in split order (so the result does not depend on timing),
 * resets the column's counter (one zeroed workspace serves every call) and
 * returns true with acc holding the sums; the others return false.  Every
 * thread of the CTA must call it.  own[r]: this warp holds row block rb[r]. */
template <int MT, int R>
__device__ __forceinline__ bool split_k_reduce(const GemvParams &p, float (&acc)[R][MT][4], const int (&rb)[R],
                                               const bool (&own)[R], int g, int t, int *is_last) {
    const size_t rows_pad = (size_t)p.row_blocks * 16;
#pragma unroll
    for (int r = 0; r < R; r++)
        if (own[r]) {
#pragma unroll
            for (int mt = 0; mt < MT; mt++)
#pragma unroll
                for (int h = 0; h < 2; h++) {
                    const size_t idx = ((size_t)blockIdx.y * rows_pad + rb[r] * 16 + g + 8 * h) * (MT * 8) + mt * 8 + 2 * t;
                    __stcg((float2 *)(p.partial + idx), make_float2(acc[r][mt][2 * h], acc[r][mt][2 * h + 1]));
                }
        }
    if (!nbc_split_last<0>(&p.counters[blockIdx.x], p.splits, is_last, threadIdx.x == 0)) return false;
    /* Split-major: one split's values are independent loads, so the sum
     * waits one L2 round trip per split (or fewer, unrolled), not one per
     * value and split; each value still adds the splits in order. */
#pragma unroll
    for (int r = 0; r < R; r++)
#pragma unroll
        for (int mt = 0; mt < MT; mt++)
#pragma unroll
            for (int j = 0; j < 4; j++) acc[r][mt][j] = 0.0f;
    /* Unconditional loads (a branch per row block would end the batch):
     * a row block this warp does not own but lists (past the end of the
     * layer) reads the last one's sums, which are never stored; only a warp
     * that owns none skips the loop. */
    bool any = false;
#pragma unroll
    for (int r = 0; r < R; r++) any = any || own[r];
    for (int s = 0; any && s < p.splits; s++) {
#pragma unroll
        for (int r = 0; r < R; r++) {
            const int rbc = min(rb[r], p.row_blocks - 1);
#pragma unroll
            for (int mt = 0; mt < MT; mt++)
#pragma unroll
                for (int h = 0; h < 2; h++) {
                    const size_t idx = ((size_t)s * rows_pad + rbc * 16 + g + 8 * h) * (MT * 8) + mt * 8 + 2 * t;
                    const float2 v = __ldcg((const float2 *)(p.partial + idx));
                    acc[r][mt][2 * h] += v.x;
                    acc[r][mt][2 * h + 1] += v.y;
                }
        }
    }
    if (threadIdx.x == 0) p.counters[blockIdx.x] = 0;
    return true;
}

/* ------------------------------------------- kernel 1: per-warp streams */

/* The A fragment of tile 2G + T (T = 0: elements 0..3 of the words, 1:
 * 4..7) of an integer format's sub-range G from this lane's pieces L (row
 * g) and H (row g+8) of a chunk: int8 keeps tile 2G in word G % 2 of piece
 * G / 2 and 2G+1 in word 2 + G % 2; the 4-bit integers subtract the zero
 * points of kernel group j (zw). */
template <int FMT, int ACT, int KG, int ZT, int NP, int T>
__device__ __forceinline__ void int_frag(const uint4 (&L)[NP], const uint4 (&H)[NP], const uint32_t (&zw)[4], int G,
                                         int j, int sbf, uint32_t (&a)[4]) {
    if constexpr (nbc_int_chunk<FMT, KG>::i8) {
        a_frag_i8<ACT>(word(L[G / 2 % NP], 2 * T + G % 2), word(H[G / 2 % NP], 2 * T + G % 2), a);
    } else {
        constexpr int GPC = NBI_CHUNK_K / KG;
        const uint32_t zg = int_zero<ACT, ZT>(zw, j, sbf), zh = int_zero<ACT, ZT>(zw, GPC + j, sbf);
        a_frag_int<ACT, 2 * T, ZT>(word(L[0], G), word(H[0], G), zg, zh, a);
    }
}

/* Both tiles' fragments (a: 2G, b: 2G+1) of an integer or table format
 * (the table formats' from the operand planes tab, in one lookup). */
template <int FMT, int ACT, int KG, int ZT, int NP>
__device__ __forceinline__ void int_frags(const uint4 (&L)[NP], const uint4 (&H)[NP], const uint32_t (&zw)[4],
                                          const nbc_table &tab, int G, int j, int sbf, uint32_t (&a)[4],
                                          uint32_t (&b)[4]) {
    if constexpr (nbc_int_chunk<FMT, KG>::table) {
        a_frag_table(word(L[0], G), word(H[0], G), tab, a, b);
    } else {
        int_frag<FMT, ACT, KG, ZT, NP, 0>(L, H, zw, G, j, sbf, a);
        int_frag<FMT, ACT, KG, ZT, NP, 1>(L, H, zw, G, j, sbf, b);
    }
}

/* The FP32 scales of kernel group j for rows g (sg) and g+8 (sh). */
template <int FMT, int KG>
__device__ __forceinline__ void int_group_scales(const uint32_t (&sw)[nbc_int_chunk<FMT, KG>::sw], int j, int bf16,
                                                 float &sg, float &sh) {
    constexpr int GPC = NBI_CHUNK_K / KG;
    if constexpr (nbc_int_chunk<FMT, KG>::table) sg = table_scale(sw, j), sh = table_scale(sw, GPC + j);
    else sg = int_scale<KG>(sw, j, bf16), sh = int_scale<KG>(sw, GPC + j, bf16);
}

/* Kernel 1's pair table (gemv_step.cuh a_frag_lut) in the table formats'
 * LUT instances: static shared memory, none in the others. */
template <int FMT, bool LUT>
__device__ __forceinline__ uint32_t *gemv_table_lut() {
    if constexpr (nbc_is_table<FMT>() && LUT) {
        __shared__ uint32_t lut[NBC_TABLE_LUT_WORDS];
        return lut;
    } else {
        return nullptr;
    }
}

/* One chunk of an integer format in kernel 1 (see "INTEGER FORMATS"):
 * word G (0..3) of this lane's 16 bytes of row g (L) and row g+8 (H) holds
 * k = 32G + 8t .. +7 of the chunk, so tiles 2G (elements 0..3) and 2G+1
 * (4..7) lie in sub-range G, inside one kernel group; its activations are
 * the 16 bytes at chunk k 32G + 8t.  The MMAs of a kernel group accumulate
 * the exact integers (q - z) times x into tA (even tiles) and tB (odd,
 * independent of tA), which then enter acc and acc2 times the group's
 * FP32 scale (rows g and g+8 are accumulator elements {0,1} and {2,3}). */
template <int FMT, int ACT, int MT, int KG, int ZT, int NP, bool CHK, bool LUT>
__device__ __forceinline__ void int_step(const uint4 (&L)[NP], const uint4 (&H)[NP],
                                         const uint32_t (&sw)[nbc_int_chunk<FMT, KG>::sw], const uint32_t (&zw)[4],
                                         const nbc_table &tab, const uint32_t *lut, uint32_t lb,
                                         const uint4 (&xv4)[4][MT],
                                         const __nv_bfloat16 *const (&xp)[MT], const bool (&tok_ok)[MT], int i,
                                         int kbase, const GemvParams &p, float (&acc)[MT][4], float (&acc2)[MT][4]) {
    constexpr int SPG = KG / 32; /* sub-ranges per kernel group */
    float tA[MT][4], tB[MT][4];
#pragma unroll
    for (int G = 0; G < 4; G++) {
        const int j = G / SPG;
        if (G % SPG == 0) {
#pragma unroll
            for (int mt = 0; mt < MT; mt++)
#pragma unroll
                for (int e = 0; e < 4; e++) tA[mt][e] = tB[mt][e] = 0.0f;
        }
        uint4 xv[MT];
        step_x<MT, true, CHK>(xv4, xp, tok_ok, i, kbase, p.k, G, xv);
        uint32_t a[4], b[4];
        if constexpr (nbc_int_chunk<FMT, KG>::table && LUT) /* both tiles' operands from the pair table (see "TABLE FORMATS") */
            a_frag_lut(word(L[0], G), word(H[0], G), lut, lb, a, b);
        else if constexpr (nbc_int_chunk<FMT, KG>::table) /* ... or from the planes in registers */
            a_frag_table(word(L[0], G), word(H[0], G), tab, a, b);
        else /* (tile 2G+1's fragment after tile 2G's MMAs are issued) */
            int_frag<FMT, ACT, KG, ZT, NP, 0>(L, H, zw, G, j, p.scale_bf16, a);
#pragma unroll
        for (int mt = 0; mt < MT; mt++) nbc_mma16816<ACT>(tA[mt], a[0], a[1], a[2], a[3], xv[mt].x, xv[mt].y);
        if constexpr (!nbc_int_chunk<FMT, KG>::table) int_frag<FMT, ACT, KG, ZT, NP, 1>(L, H, zw, G, j, p.scale_bf16, b);
#pragma unroll
        for (int mt = 0; mt < MT; mt++) nbc_mma16816<ACT>(tB[mt], b[0], b[1], b[2], b[3], xv[mt].z, xv[mt].w);
        if (G % SPG == SPG - 1) { /* the group's scale, in FP32 */
            float sg, sh;
            int_group_scales<FMT, KG>(sw, j, p.scale_bf16, sg, sh);
#pragma unroll
            for (int mt = 0; mt < MT; mt++) {
                acc[mt][0] = fmaf(sg, tA[mt][0], acc[mt][0]);
                acc[mt][1] = fmaf(sg, tA[mt][1], acc[mt][1]);
                acc[mt][2] = fmaf(sh, tA[mt][2], acc[mt][2]);
                acc[mt][3] = fmaf(sh, tA[mt][3], acc[mt][3]);
                acc2[mt][0] = fmaf(sg, tB[mt][0], acc2[mt][0]);
                acc2[mt][1] = fmaf(sg, tB[mt][1], acc2[mt][1]);
                acc2[mt][2] = fmaf(sh, tB[mt][2], acc2[mt][2]);
                acc2[mt][3] = fmaf(sh, tB[mt][3], acc2[mt][3]);
            }
        }
    }
}

/* A measurement build only (-DNB_GEMV_TRACE; scripts/trace-k1): kernel 1
 * records per CTA, by thread 0, the global timer (ns) at its start, once
 * the scale table is ready (after the prologue's fetches and the grid
 * dependency wait), when warp 0's first chunk has landed, after warp 0's
 * loop, after the in-CTA k sum and after the store, and its SM, into the
 * workspace (8 words a CTA at p.partial: the plans traced have no k split,
 * so it is otherwise unused).  Without the macro nothing of it is
 * compiled. */
#ifdef NB_GEMV_TRACE
__device__ __forceinline__ unsigned long long k1_now() {
    unsigned long long t;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
    return t;
}
#define K1_TRACE(i) (threadIdx.x == 0 ? (void)(k1_tr[i] = k1_now()) : (void)0)
#else
#define K1_TRACE(i) ((void)0)
#endif

/* m = 1..32 with each lane loading its activations through L1: the kernel
 * for 1..8 tokens, and for more tokens on layers too narrow for kernel 2;
 * KG > 0: an integer or table format's kernel group (see "INTEGER FORMATS"
 * above).  The body of gemv_fp4_kernel, gemv_int4_kernel and
 * gemv_table_kernel. */
template <int FMT, int ACT, int MT, int WARPS, int STAGES, int KG, bool EARLY, bool LUT>
__device__ __forceinline__ void gemv_kernel1(const GemvParams &p) {
    constexpr bool INT = KG > 0;
    constexpr int ZT = nbc_fmt<FMT>::zero_point; /* (integer formats: NB_ZERO_NONE, two's complement codes) */
    constexpr int SB = INT ? 0 : nbc_fmt<FMT>::lane_scale_bytes;  /* E2M1 scale bytes per lane: 4 or 2 */
    constexpr int CB = nbc_chunk_bytes<FMT, KG>();           /* bytes per chunk */
    constexpr int CODE = nbc_code_bytes<FMT, KG>();          /* of which codes: 1024, or 2048 (int8) */
    constexpr int NP = CODE / 1024;                          /* 16-byte pieces a lane holds per row */
    constexpr int KG1 = INT ? KG : 128;                           /* (a valid group for the E2M1 instances' dead code) */
    __shared__ uint32_t stab[256];                       /* scale byte -> adjusted 16-bit pair */
    __shared__ int is_last;
    static_assert(WARPS * STAGES <= GEMV_K1_BARRIERS, "kernel 1's ring barriers");
    __shared__ __align__(8) uint64_t ring_bar[WARPS * STAGES]; /* BULK: slot s of warp w's ring at w * STAGES + s */
#ifdef NB_GEMV_TRACE
    unsigned long long k1_tr[6] = {0, 0, 0, 0, 0, 0};
#endif
    K1_TRACE(0);

    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int g = lane >> 2, t = lane & 3;
    /* warp -> (row block, k slice): the kw warps of a row block split the
     * CTA's k range and are summed through shared memory at the end. */
    const int ks = warp % p.kw;
    const int rb = blockIdx.x * p.rpc + warp / p.kw;
    const bool valid = warp / p.kw < p.rpc && rb < p.row_blocks;
    const int cta_begin = blockIdx.y * p.cps, cta_end = min(cta_begin + p.cps, p.kchunks);
    const int per_warp = (cta_end - cta_begin + p.kw - 1) / p.kw;
    const int c_begin = cta_begin + ks * per_warp;
    const int c_end = min(c_begin + per_warp, cta_end);
    const int nchunks = valid ? max(c_end - c_begin, 0) : 0;

    /* Two accumulator sets (even and odd tiles) so consecutive MMAs do not
     * wait on each other. */
    float acc[1][MT][4], acc2[MT][4];
#pragma unroll
    for (int i = 0; i < MT; i++)
#pragma unroll
        for (int j = 0; j < 4; j++) acc[0][i][j] = acc2[i][j] = 0.0f;
    /* the table formats' operand planes, from the parameters to registers
     * (in the LUT instances the pair table is built from them after the
     * weight prologue, below; the planes then leave the loop) */
    uint32_t *lut = gemv_table_lut<FMT, LUT>();
    const uint32_t lb = 4u * (uint32_t)lane;
    nbc_table tab;
    if constexpr (nbc_is_table<FMT>()) {
#pragma unroll
        for (int i = 0; i < 4; i++) tab.lo[i] = p.stab[i], tab.hi[i] = p.stab[4 + i];
    }

    /* Weights stream through a per-warp ring of STAGES chunks in shared
     * memory, filled by cp.async STAGES-1 chunks ahead: many bytes in flight
     * per warp without holding them in registers.  Each lane copies 16-byte
     * segments lane, lane+32, ... of a chunk; cp.async.wait_group plus
     * __syncwarp make the whole chunk visible to every lane.  The chunks of
     * one row block are contiguous, so a warp reads one sequential stream.
     * The weights do not depend on the previous kernel in the stream, so the
     * prologue runs before griddepcontrol.wait (programmatic dependent
     * launch).  The ring starts on a 128-byte boundary of shared memory
     * (the dynamic bytes otherwise follow the static ones, 16 bytes here):
     * a cp.async whose shared destination is 16 bytes off its 32-byte global
     * sector makes the L2 serve two sectors for each (ncu: twice the L2
     * sectors for the same instructions and DRAM bytes); 128-byte aligned
     * rings made kernel 1 8-16% faster at m = 1 on an H200 (NOTES.md).
     * BULK (sm_90, the short streams of the EARLY instances): lane 0 fetches
     * a whole chunk with one cp.async.bulk that completes on the slot's
     * mbarrier, instead of 72 16-byte cp.async spread over the lanes.  H200,
     * against cp.async: the 4096-wide layers at m = 1..8 3-6% faster (NVFP4;
     * MXFP4 1-4%), but streams of 14 chunks a warp or more 2-5% slower at
     * m = 1 with every format, nf4 included (NOTES.md, "Kernel 1's chunks by
     * bulk copy"). */
    constexpr bool BULK = EARLY && nbc_bulk_copies();
    extern __shared__ __align__(128) uint4 ring_all[];
    uint4 *ring = ring_all + (size_t)warp * STAGES * (CB / 16);
    const uint64_t pol = nbc_policy_evict_first();
    /* this lane's 16 bytes of the next chunk to fetch (BULK: the chunk's
     * start), and of slot 0 (a shared address: every copy is one base
     * register plus a constant) */
    const uint8_t *gnext = p.w + ((size_t)(valid ? rb : 0) * p.kchunks + c_begin) * CB + (BULK ? 0 : 16 * lane);
    const uint32_t ring_s = nbc_smem_u32(ring) + (BULK ? 0 : 16 * lane);
    const uint32_t bar0 = nbc_smem_u32(&ring_bar[warp * STAGES]);
    if constexpr (BULK) {
        if (lane == 0) {
#pragma unroll
            for (int s = 0; s < STAGES; s++) nbc_mbar_init(bar0 + 8 * s, 1);
            nbc_mbar_init_fence();
        }
        __syncwarp();
    }
    auto fetch = [&](int slot) { /* the next chunk of this warp's range into slot */
        if constexpr (BULK) {
            if (lane == 0) {
                nbc_mbar_expect_tx(bar0 + 8 * slot, CB);
                nbc_bulk_load(ring_s + slot * CB, gnext, CB, bar0 + 8 * slot, pol);
            }
        } else {
            nbc_fetch_chunk<CODE, CB>(ring_s + slot * CB, gnext, lane, pol);
        }
        gnext += CB;
    };
#pragma unroll
    for (int s = 0; s < STAGES - 1; s++) {
        if (s < nchunks) fetch(s);
        nbc_cp_async_commit();
    }
    /* The CTA's shared tables, once its first weight loads are in flight
     * (their DRAM round trip covers the stores), published by the barrier
     * below: the E2M1 scale table where the decode reads it
     * (chunk_scales_act), the table formats' pair table in the LUT
     * instances.  Neither depends on the previous kernel.  Written before
     * the copies, the pair table delayed every CTA's first request: nf4 /
     * bnb_fp4 at m = 1 are 2-4% faster this way on one-wave grids (H200;
     * NOTES.md, "Kernel 1's shared tables after the weight prologue"). */
    if constexpr (!INT && nbc_scales_use_table<FMT>()) nbc_load_scale_table<WARPS * 32>(stab, p.stab);
    if constexpr (nbc_is_table<FMT>() && LUT) table_lut_fill<WARPS * 32>(lut, tab, threadIdx.x);
    nbc_grid_dependency_wait();
    /* EARLY (short streams): let the next grid launch once this warp's last
     * loads are issued; else after the loop (common.cuh) */
    if (EARLY && nchunks > 0 && nchunks <= STAGES - 1) nbc_grid_dependents_launch();
    __syncthreads(); /* the shared tables ready */
    K1_TRACE(1);

    /* X rows of this lane's tokens */
    const __nv_bfloat16 *xp[MT];
    bool tok_ok[MT]; /* this lane's token rows exist */
#pragma unroll
    for (int mt = 0; mt < MT; mt++) {
        tok_ok[mt] = mt * 8 + g < p.m;
        xp[mt] = (const __nv_bfloat16 *)p.x + (size_t)(tok_ok[mt] ? mt * 8 + g : 0) * p.lda +
                 (size_t)c_begin * NBI_CHUNK_K + (INT ? 8 : 32) * t;
    }

    /* One chunk of the warp's range in ring slot s; chk: its activation
     * loads test k and the token (chunk_x_step). */
    auto chunk = [&](int i, int s, auto chk) {
        constexpr bool CHK = decltype(chk)::value;
        uint4 xv[4][MT]; /* one token tile: before the weights' wait (chunk_x) */
        chunk_x<MT, INT, CHK>(xp, tok_ok, i, (c_begin + i) * NBI_CHUNK_K + (INT ? 8 : 32) * t, p.k, xv);
        if (i + STAGES - 1 < nchunks) {
            fetch((s + STAGES - 1) % STAGES); /* slot released by the __syncwarp of chunk i-1 */
            if (EARLY && i + STAGES == nchunks) nbc_grid_dependents_launch(); /* this warp's last loads are in flight */
        }
        if constexpr (BULK) {
            nbc_mbar_wait(bar0 + 8 * s, (uint32_t)(i / STAGES) & 1u); /* chunk i has landed */
        } else {
            nbc_cp_async_commit();
            nbc_cp_async_wait<STAGES - 1>(); /* this lane's part of chunk i has landed */
            __syncwarp();                    /* ... and every other lane's */
        }
        if (i == 0) K1_TRACE(2);
        const uint4 *slot = ring + s * (CB / 16);
        if constexpr (INT) { /* piece j of row g at 512 j, of row g+8 at CODE / 2 + 512 j */
            uint4 Lp[NP], Hp[NP];
#pragma unroll
            for (int j = 0; j < NP; j++) Lp[j] = slot[32 * j + lane], Hp[j] = slot[32 * (NP + j) + lane];
            uint32_t sw[nbc_int_chunk<FMT, KG1>::sw], zw[4];
            int_tail<FMT, KG1>(slot, g, sw, zw);
            __syncwarp(); /* slot s may now be refilled */
            int_step<FMT, ACT, MT, KG1, ZT, NP, CHK, LUT>(Lp, Hp, sw, zw, tab, lut, lb, xv, xp, tok_ok, i,
                                                      (c_begin + i) * NBI_CHUNK_K + 8 * t, p, acc[0], acc2);
            return;
        }
        const uint4 L = slot[lane], H = slot[32 + lane];
        const uint32_t S = SB == 4 ? ((const uint32_t *)(slot + 64))[lane] : ((const uint16_t *)(slot + 64))[lane];
        __syncwarp(); /* slot s may now be refilled */
        const int kbase = (c_begin + i) * NBI_CHUNK_K + 32 * t;
        uint32_t sg[2], sh[2];
        chunk_scales_act<FMT, ACT>(S, stab, sg, sh);
#pragma unroll
        for (int w = 0; w < 4; w++) {
            uint4 xw[MT];
            step_x<MT, INT, CHK>(xv, xp, tok_ok, i, kbase, p.k, w, xw);
            uint32_t a[4];
            a_frag<ACT, 0>(word(L, w), word(H, w), sg[w >> 1], sh[w >> 1], a); /* tile 2w: elements 0..3 */
#pragma unroll
            for (int mt = 0; mt < MT; mt++) nbc_mma16816<ACT>(acc[0][mt], a[0], a[1], a[2], a[3], xw[mt].x, xw[mt].y);
            a_frag<ACT, 2>(word(L, w), word(H, w), sg[w >> 1], sh[w >> 1], a); /* tile 2w+1: elements 4..7 */
#pragma unroll
            for (int mt = 0; mt < MT; mt++) nbc_mma16816<ACT>(acc2[mt], a[0], a[1], a[2], a[3], xw[mt].z, xw[mt].w);
        }
    };
    /* One token tile: the chunks inside k load their activations
     * untested and only a partial last chunk tests them (fewer
     * instructions per chunk, 70-77 registers instead of 84-88: H100, m =
     * 1 up to 8% faster with the planner's occupancy, NOTES.md, "Decode
     * kernels: untested activation loads"); more tiles test every load:
     * untested there, the registers rose (MT = 2: 96-103 to 104-114) and
     * m = 16 on 4096 -> 4096 ran 2% slower. */
    nbc_walk_chunks<STAGES, MT == 1>(nchunks, c_end, p.kchunks, p.k, chunk);
    nbc_cp_async_wait<0>();
    K1_TRACE(3);
#pragma unroll
    for (int i = 0; i < MT; i++)
#pragma unroll
        for (int j = 0; j < 4; j++) acc[0][i][j] += acc2[i][j];

    if (p.kw > 1) /* in-CTA split-K: slices 1..kw-1 hand their sums to slice 0, in order */
        gemv_kw_reduce<MT>(acc[0], (float *)ring_all, warp, lane, ks, p.kw);
    K1_TRACE(4);
    const int rbs[1] = {rb};
    const bool own[1] = {valid && ks == 0}; /* this warp writes the row block's result */
    /* (a warp without chunks, e.g. one left idle by a balanced wave, does
     * not trigger: the first trigger of any thread stands for the CTA's) */
    if (!EARLY && nchunks > 0) nbc_grid_dependents_launch();
    if (p.splits > 1 && !split_k_reduce<MT, 1>(p, acc, rbs, own, g, t, &is_last)) return;
    if (own[0]) store_block<ACT, MT>(p, acc[0], rb, g, t);
#ifdef NB_GEMV_TRACE
    K1_TRACE(5);
    if (threadIdx.x == 0 && p.splits == 1) {
        unsigned smid;
        asm volatile("mov.u32 %0, %%smid;" : "=r"(smid));
        unsigned long long *o = (unsigned long long *)p.partial + 8 * (size_t)blockIdx.x;
        for (int j = 0; j < 6; j++) o[j] = k1_tr[j];
        o[6] = smid;
        o[7] = 1;
    }
#endif
}

template <int FMT, int ACT, int MT, int WARPS, int STAGES, bool EARLY>
__global__ void __launch_bounds__(WARPS * 32, GEMV_MINB) gemv_fp4_kernel(const GemvParams p) {
    NBC_CHECK_KERNEL_FORMAT(FMT);
    gemv_kernel1<FMT, ACT, MT, WARPS, STAGES, 0, EARLY, false>(p);
}

/* The integer formats, kernel group KG (32, 64 or 128). */
template <int FMT, int ACT, int MT, int KG, int WARPS, int STAGES>
__global__ void __launch_bounds__(WARPS * 32, GEMV_MINB) gemv_int4_kernel(const GemvParams p) {
    static_assert(KG == 32 || KG == 64 || KG == 128, "kernel groups of 32, 64 or 128");
    gemv_kernel1<FMT, ACT, MT, WARPS, STAGES, KG, false, false>(p);
}

/* The table formats (nf4, bnb_fp4), kernel group KG (32, 64 or 128); LUT:
 * the operands from the pair table in shared memory, else from the planes
 * in registers (GPUs whose shared memory would then hold one CTA per SM:
 * gemv_table_lut_fits). */
template <int FMT, int ACT, int MT, int KG, int WARPS, int STAGES, bool LUT>
__global__ void __launch_bounds__(WARPS * 32, GEMV_MINB) gemv_table_kernel(const GemvParams p) {
    static_assert(nbc_int_chunk<FMT, KG>::table, "the table formats' instances");
    gemv_kernel1<FMT, ACT, MT, WARPS, STAGES, KG, false, LUT>(p);
}

/* ------------------------------------ kernel 2: staged activations, 8..32 */

/* The shape of kernel 2, measured on an H100 (DESIGN.md, decode kernels):
 * XS_STAGES weight ring depth per warp, in steps of RPW chunks; XS_SEG
 * chunks per activation segment; XS_XSEGS segments in the activation ring;
 * XS_MINB CTAs per SM asked of the register allocator. */
#define XS_STAGES 3
#define XS_SEG 1
#define XS_XSEGS 5
#define XS_MINB 2
#define XS_THREADS(XW) (((XW) + 1) * 32) /* XW consumer warps + the activation producer warp */

/* The producer warp: segment s of the CTA's nch chunks of activations
 * (k chunk kc0 first; WRAP: back to 0 where a tile ends) into slot
 * s % XSEGS once every consumer warp has released the slot's previous
 * segment (barrier `empty` + 8 slot), then signals the slot's `full`
 * barrier when its copies land; k past the end is zero-filled. */
template <int SEG, int XSEGS, bool INT, bool WRAP>
__device__ __forceinline__ void xs_stage_activations(const GemvParams &p, uint4 *xring, uint32_t full, uint32_t empty,
                                                     int kc0, int nch, int m_rows, int xchunk, int lane) {
    const __nv_bfloat16 *xg = (const __nv_bfloat16 *)p.x;
    int kc = kc0;
    for (int s = 0; s < (nch + SEG - 1) / SEG; s++) {
        const int slot = s % XSEGS;
        if (s >= XSEGS) nbc_mbar_wait(empty + 8 * slot, (uint32_t)((s / XSEGS - 1) & 1));
        for (int c = 0; c < SEG; c++) {
            const int ch = s * SEG + c;
            if (ch >= nch) break;
            uint4 *dst = xring + (size_t)(slot * SEG + c) * xchunk;
            for (int q = lane; q < m_rows * 16; q += 32) {
                /* pos = 4w + t holds k = 32t + 8w (E2M1), 32w + 8t (integer formats: the chunk's k in order) */
                const int row = q >> 4, pos = q & 15;
                const int kk = (WRAP ? kc : kc0 + ch) * NBI_CHUNK_K + 8 * (INT ? pos : 4 * (pos & 3) + (pos >> 2));
                const bool in = kk < p.k;
                nbc_cp_async16_zfill(nbc_smem_u32(dst + row * XROW + pos), in ? xg + (size_t)row * p.lda + kk : xg, in);
            }
            if (WRAP) kc = kc == p.kchunks - 1 ? 0 : kc + 1;
        }
        nbc_mbar_arrive_cp_async(full + 8 * slot);
    }
    nbc_cp_async_wait<0>();
}

/* One step of a consumer warp: its RPW row blocks' chunks in the weight
 * slot wsl times the staged activations xsl of the same chunk. */
template <int FMT, int ACT, int MT, int RPW>
__device__ __forceinline__ void xs_step(const uint4 *wsl, const uint4 *xsl, const int (&xrow)[MT], const uint32_t *stab,
                                        int lane, float (&acc)[RPW][MT][4]) {
    constexpr int SB = nbc_fmt<FMT>::lane_scale_bytes;
    constexpr int CB = nbc_fmt<FMT>::chunk_bytes;
    uint4 L[RPW], H[RPW];
    uint32_t S[RPW];
#pragma unroll
    for (int r = 0; r < RPW; r++) {
        L[r] = wsl[r * (CB / 16) + lane];
        H[r] = wsl[r * (CB / 16) + 32 + lane];
        S[r] = SB == 4 ? ((const uint32_t *)(wsl + r * (CB / 16) + 64))[lane]
                       : ((const uint16_t *)(wsl + r * (CB / 16) + 64))[lane];
    }
    uint32_t sg[RPW][2], sh[RPW][2];
#pragma unroll
    for (int r = 0; r < RPW; r++) chunk_scales<FMT>(S[r], stab, sg[r], sh[r]);
#pragma unroll
    for (int w = 0; w < 4; w++) {
        uint4 xv[MT];
#pragma unroll
        for (int mt = 0; mt < MT; mt++) xv[mt] = xsl[xrow[mt] + 4 * w];
#pragma unroll
        for (int r = 0; r < RPW; r++) {
            uint32_t a[4];
            a_frag<ACT, 0>(word(L[r], w), word(H[r], w), sg[r][w >> 1], sh[r][w >> 1], a);
#pragma unroll
            for (int mt = 0; mt < MT; mt++) nbc_mma16816<ACT>(acc[r][mt], a[0], a[1], a[2], a[3], xv[mt].x, xv[mt].y);
            a_frag<ACT, 2>(word(L[r], w), word(H[r], w), sg[r][w >> 1], sh[r][w >> 1], a);
#pragma unroll
            for (int mt = 0; mt < MT; mt++) nbc_mma16816<ACT>(acc[r][mt], a[0], a[1], a[2], a[3], xv[mt].z, xv[mt].w);
        }
    }
}

/* The same step for an integer or table format (kernel group KG; see
 * "INTEGER FORMATS"): word G of a row's piece holds k = 32G + 8t .. +7, at
 * staged position 4G + t, so each sub-range G shares its B fragments
 * between the RPW row blocks as xs_step's words do.  A kernel group's MMAs
 * (both tiles of each sub-range) accumulate into zeroed FP32 tiles, which
 * then enter acc times the group's FP32 scale. */
template <int FMT, int ACT, int MT, int RPW, int KG>
__device__ __forceinline__ void xs_step_int(const uint4 *wsl, const uint4 *xsl, const int (&xrow)[MT],
                                            const nbc_table &tab, const GemvParams &p, int g, int lane,
                                            float (&acc)[RPW][MT][4]) {
    using C = nbc_int_chunk<FMT, KG>;
    constexpr int CB = C::bytes, NP = C::code / 1024, SPG = KG / 32;
    constexpr int ZT = nbc_fmt<FMT>::zero_point;
    uint4 L[RPW][NP], H[RPW][NP];
    uint32_t sw[RPW][C::sw], zw[RPW][4];
#pragma unroll
    for (int r = 0; r < RPW; r++) {
#pragma unroll
        for (int j = 0; j < NP; j++) L[r][j] = wsl[r * (CB / 16) + 32 * j + lane], H[r][j] = wsl[r * (CB / 16) + 32 * (NP + j) + lane];
        int_tail<FMT, KG>(wsl + r * (CB / 16), g, sw[r], zw[r]);
    }
    float tq[RPW][MT][4];
#pragma unroll
    for (int G = 0; G < 4; G++) {
        const int j = G / SPG;
        if (G % SPG == 0) {
#pragma unroll
            for (int r = 0; r < RPW; r++)
#pragma unroll
                for (int mt = 0; mt < MT; mt++)
#pragma unroll
                    for (int e = 0; e < 4; e++) tq[r][mt][e] = 0.0f;
        }
        uint4 xv[MT];
#pragma unroll
        for (int mt = 0; mt < MT; mt++) xv[mt] = xsl[xrow[mt] + 4 * G];
#pragma unroll
        for (int r = 0; r < RPW; r++) {
            uint32_t a[4], b[4];
            int_frags<FMT, ACT, KG, ZT, NP>(L[r], H[r], zw[r], tab, G, j, p.scale_bf16, a, b);
#pragma unroll
            for (int mt = 0; mt < MT; mt++) nbc_mma16816<ACT>(tq[r][mt], a[0], a[1], a[2], a[3], xv[mt].x, xv[mt].y);
#pragma unroll
            for (int mt = 0; mt < MT; mt++) nbc_mma16816<ACT>(tq[r][mt], b[0], b[1], b[2], b[3], xv[mt].z, xv[mt].w);
        }
        if (G % SPG == SPG - 1) { /* the group's scale, in FP32 */
#pragma unroll
            for (int r = 0; r < RPW; r++) {
                float sg, sh;
                int_group_scales<FMT, KG>(sw[r], j, p.scale_bf16, sg, sh);
#pragma unroll
                for (int mt = 0; mt < MT; mt++) {
                    acc[r][mt][0] = fmaf(sg, tq[r][mt][0], acc[r][mt][0]);
                    acc[r][mt][1] = fmaf(sg, tq[r][mt][1], acc[r][mt][1]);
                    acc[r][mt][2] = fmaf(sh, tq[r][mt][2], acc[r][mt][2]);
                    acc[r][mt][3] = fmaf(sh, tq[r][mt][3], acc[r][mt][3]);
                }
            }
        }
    }
}

/* Kernel 2's stream-K grid (the planner's choice where the column tiles
 * alone are more than one resident wave): the layer's column tiles (8 *
 * RPW row blocks each) times its k chunks are units numbered tile-major,
 * and CTA b of the G in the grid takes units [b U / G, (b+1) U / G): every
 * CTA the same number of chunks, one wave, whatever the shape.  A whole
 * tile is stored directly.  A tile split among CTAs has an owner, the CTA
 * whose range holds its first chunk (that CTA's last segment); the others
 * hold the rest of it in their first segments, which each leave in
 * workspace slot b (only a first segment starts mid-tile, so one slot per
 * CTA) and count in, warp by warp, as soon as they end; after its loop the
 * owner adds them to its own part in CTA order (the result does not depend
 * on timing) and stores the tile.  A CTA sums at most one tile, and only
 * owners wait. */
struct xs_range {
    int64_t u0, u1; /* this CTA's units */
};
__device__ __forceinline__ xs_range xs_units(int64_t U, int b, int G) {
    return {(int64_t)b * U / G, (int64_t)(b + 1) * U / G};
}
/* The CTA whose range holds unit u. */
__device__ __forceinline__ int xs_owner(int64_t u, int64_t U, int G) { return (int)(((u + 1) * G - 1) / U); }

/* The partial tile set of warp `warp` to workspace slot `slot` (RPW row
 * blocks of 16 rows x 8 MT tokens, FP32). */
template <int MT, int RPW, int XW>
__device__ __forceinline__ float *xs_slot(const GemvParams &p, int64_t slot, int warp, int r, int h, int g) {
    return p.partial + ((size_t)slot * (XW * RPW * 16) + (warp * RPW + r) * 16 + g + 8 * h) * (MT * 8);
}

/* Shared by both kernel-2 bodies (gemv_xs_body, gemv_xs_sk_body). The
 * CTA's shared state: the E2M1 scale table, and the activation ring's
 * barriers ("full": the producer warp's lanes; "empty": every consumer
 * thread, each read ordered). */
template <int XSEGS, bool INT, int XW>
__device__ __forceinline__ void xs_init(const GemvParams &p, uint32_t *stab, uint64_t *full, uint64_t *empty) {
    if constexpr (!INT) nbc_load_scale_table<XS_THREADS(XW)>(stab, p.stab);
    if (threadIdx.x < XSEGS) {
        nbc_mbar_init(nbc_smem_u32(&full[threadIdx.x]), 32);
        nbc_mbar_init(nbc_smem_u32(&empty[threadIdx.x]), XW * 32);
    }
}

/* Step i of a consumer warp's nch: wait until its weights (this lane's
 * cp.async group, then the warp) and the segment's activations have
 * landed, multiply, and release the weight slot and, at a segment's end,
 * the activation slot. */
template <int FMT, int ACT, int MT, int RPW, int STAGES, int SEG, int XSEGS, int KG>
__device__ __forceinline__ void xs_consume(const GemvParams &p, const uint4 *wring, const uint4 *xring, int xchunk,
                                           const int (&xrow)[MT], const uint32_t *stab, const nbc_table &tab,
                                           uint64_t *full, uint64_t *empty, int i, int nch, int g, int lane, int &c,
                                           int &seg, int &xs, uint32_t &read, float (&acc)[RPW][MT][4]) {
    constexpr int CB = nbc_chunk_bytes<FMT, KG>();
    nbc_cp_async_commit();
    nbc_cp_async_wait<STAGES - 1>(); /* this lane's part of step i has landed */
    if (c == 0) nbc_mbar_wait(nbc_smem_u32(&full[xs]), (uint32_t)((seg / XSEGS) & 1));
    __syncwarp(); /* ... and every other lane's */
    if constexpr (KG > 0)
        xs_step_int<FMT, ACT, MT, RPW, KG>(wring + read / 16, xring + (size_t)(xs * SEG + c) * xchunk, xrow, tab, p, g,
                                           lane, acc);
    else
        xs_step<FMT, ACT, MT, RPW>(wring + read / 16, xring + (size_t)(xs * SEG + c) * xchunk, xrow, stab, lane, acc);
    __syncwarp(); /* weight slot and (at a segment's end) activation slot read by every lane */
    read = read == (STAGES - 1) * RPW * CB ? 0 : read + RPW * CB;
    if (++c == SEG || i == nch - 1) {
        nbc_mbar_arrive(nbc_smem_u32(&empty[xs]));
        c = 0;
        seg++;
        xs = xs == XSEGS - 1 ? 0 : xs + 1;
    }
}

/* The start of both kernel-2 bodies: zeroed accumulators; the consumer
 * warps' first STAGES-1 weight steps fetched (fetch(s) for step s: weights
 * do not depend on the previous kernel, so before griddepcontrol.wait);
 * the table formats' operand planes from the parameters to registers; then
 * the wait for the previous kernel and a CTA barrier (scale table and
 * barriers initialized). */
template <int FMT, int KG, int RPW, int MT, int STAGES, class Fetch>
__device__ __forceinline__ void xs_start(const GemvParams &p, bool producer, int nch, Fetch &fetch, nbc_table &tab,
                                         float (&acc)[RPW][MT][4]) {
#pragma unroll
    for (int r = 0; r < RPW; r++)
#pragma unroll
        for (int i = 0; i < MT; i++)
#pragma unroll
            for (int j = 0; j < 4; j++) acc[r][i][j] = 0.0f;
    if (!producer) {
#pragma unroll
        for (int s = 0; s < STAGES - 1; s++) {
            if (s < nch) fetch(s);
            nbc_cp_async_commit();
        }
    }
    if constexpr (KG > 0 && nbc_is_table<FMT>()) {
#pragma unroll
        for (int i = 0; i < 4; i++) tab.lo[i] = p.stab[i], tab.hi[i] = p.stab[4 + i];
    }
    nbc_grid_dependency_wait();
    __syncthreads();
}

/* A consumer lane's staged token rows, one per tile of 8 tokens: rows
 * past m read a staged row (row g when m > 8, else row 0: valid, never
 * stored). */
template <int MT>
__device__ __forceinline__ void xs_token_rows(int (&xrow)[MT], int m_rows, int g, int t) {
#pragma unroll
    for (int mt = 0; mt < MT; mt++) xrow[mt] = (mt * 8 + g < m_rows ? mt * 8 + g : g < m_rows ? g : 0) * XROW + t;
}

/* 9..32 tokens (and 8 where the planner says; any m <= 32 works).  The
 * CTA's WARPS consumer warps (8; the wide instance 12) walk one k range; each owns RPW row blocks,
 * streams their chunks through its own cp.async ring (no CTA barrier for
 * weights) and multiplies them with the same B fragments (RPW = 2 halves the
 * shared-memory reads of activations per weight).  One more warp stages each
 * segment of SEG chunks of activations (m x 128 per chunk, BF16/FP16) once
 * per CTA into a ring of XSEGS segments: it signals a segment's "full"
 * mbarrier through cp.async.mbarrier.arrive, and every consumer thread
 * arrives on the segment's "empty" mbarrier when done with it (one arrival
 * per warp after __syncwarp would do, but then compute-sanitizer's racecheck
 * cannot see the ordering).  No CTA-wide barrier in the main loop: a warp
 * delayed by its weights holds up nobody until the activation ring runs
 * dry.  Staged token row r of a chunk: XROW uint4 (256 bytes of data, 64 of
 * padding so the two tokens of a quarter-warp land in different bank
 * halves), the uint4 holding k = 32t + 8w .. +7 at position 4w + t.
 *
 * The loop is written for few instructions outside the decode: every
 * shared address is one base register plus a constant, global pointers
 * advance by a chunk per step, and out-of-range row blocks and tokens read
 * valid data (row block n-1, token row g) that is never stored instead of
 * branching. */
template <int FMT, int ACT, int MT, int RPW, int STAGES, int SEG, int XSEGS, int KG, int WARPS>
__device__ __forceinline__ void gemv_xs_body(const GemvParams &p) {
    /* WARPS consumer warps; warp WARPS is the producer */
    constexpr bool INT = KG > 0;
    constexpr int CB = nbc_chunk_bytes<FMT, KG>();     /* bytes per packed chunk */
    constexpr int CODE = nbc_code_bytes<FMT, KG>();    /* of which codes */
    static_assert(MT >= 1 && MT <= 4, "kernel 2 serves up to 32 tokens");
    __shared__ uint32_t stab[256];
    __shared__ uint64_t full[XSEGS], empty[XSEGS];
    __shared__ int is_last;
    xs_init<XSEGS, INT, WARPS>(p, stab, full, empty);

    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int g = lane >> 2, t = lane & 3;
    const bool producer = warp == WARPS;
    const int rb0 = (blockIdx.x * WARPS + (producer ? 0 : warp)) * RPW;
    const int c0 = blockIdx.y * p.cps;
    const int nch = max(min(c0 + p.cps, p.kchunks) - c0, 0);
    const int m_rows = min(p.m, 8 * MT);
    const int xchunk = m_rows * XROW; /* uint4 per staged chunk of activations */

    extern __shared__ __align__(128) uint4 smem[]; /* (128-byte aligned: kernel 1's ring) */
    uint4 *xring = smem + (size_t)WARPS * STAGES * RPW * (CB / 16);
    const uint64_t pol = nbc_policy_evict_first();
    bool rvalid[RPW];
    const uint8_t *gw[RPW]; /* this lane's 16 bytes of the next chunk to fetch, per row block */
#pragma unroll
    for (int r = 0; r < RPW; r++) {
        rvalid[r] = !producer && rb0 + r < p.row_blocks;
        const int rb = min(rb0 + r, p.row_blocks - 1);
        gw[r] = p.w + ((size_t)rb * p.kchunks + c0) * CB + 16 * lane;
    }
    /* this lane's 16 bytes of slot 0 (shared address), and the slot being filled / read */
    const uint32_t ring_s = nbc_smem_u32(smem) + (uint32_t)(warp * STAGES * RPW * CB + 16 * lane);
    uint32_t fill = 0, read = 0;
    auto fetch = [&](int) { /* the next step's chunks into slot `fill` */
#pragma unroll
        for (int r = 0; r < RPW; r++) {
            nbc_fetch_chunk<CODE, CB>(ring_s + fill + r * CB, gw[r], lane, pol);
            gw[r] += CB;
        }
        fill = fill == (STAGES - 1) * RPW * CB ? 0 : fill + RPW * CB;
    };
    float acc[RPW][MT][4];
    nbc_table tab;
    xs_start<FMT, KG, RPW, MT, STAGES>(p, producer, nch, fetch, tab, acc);

    if (producer) {
        xs_stage_activations<SEG, XSEGS, INT, false>(p, xring, nbc_smem_u32(full), nbc_smem_u32(empty), c0, nch, m_rows, xchunk,
                                              lane);
    } else {
        int xrow[MT];
        xs_token_rows<MT>(xrow, m_rows, g, t);
        const uint4 *wring = smem + (size_t)warp * STAGES * RPW * (CB / 16);
        int c = 0, seg = 0, xs = 0;
        for (int i = 0; i < nch; i++) {
            if (i + STAGES - 1 < nch) fetch(i + STAGES - 1); /* into the slot released by step i-1 */
            xs_consume<FMT, ACT, MT, RPW, STAGES, SEG, XSEGS, KG>(p, wring, xring, xchunk, xrow, stab, tab, full, empty, i,
                                                                 nch, g, lane, c, seg, xs, read, acc);
        }
        nbc_cp_async_wait<0>();
    }

    int rbs[RPW];
#pragma unroll
    for (int r = 0; r < RPW; r++) rbs[r] = rb0 + r;
    nbc_grid_dependents_launch();
    if (p.splits > 1 && !split_k_reduce<MT, RPW>(p, acc, rbs, rvalid, g, t, &is_last)) return;
#pragma unroll
    for (int r = 0; r < RPW; r++)
        if (rvalid[r]) store_block<ACT, MT>(p, acc[r], rbs[r], g, t);
}

/* Kernel 2 on a stream-K grid (xs_units): the body above, but a CTA's
 * units may run over the end of a tile into the next ones.  Its weight
 * pointers are set again where a tile ends (the tile found again from the
 * unit: rare), and each tile's part is finished where it ends: stored when
 * whole, else left in the workspace for the arrival at the end. */
template <int FMT, int ACT, int MT, int RPW, int STAGES, int SEG, int XSEGS, int KG, int WARPS>
__device__ __forceinline__ void gemv_xs_sk_body(const GemvParams &p) {
    /* WARPS consumer warps; warp WARPS is the producer */
    constexpr bool INT = KG > 0;
    constexpr int CB = nbc_chunk_bytes<FMT, KG>();     /* bytes per packed chunk */
    constexpr int CODE = nbc_code_bytes<FMT, KG>();    /* of which codes */
    static_assert(MT >= 1 && MT <= 4, "kernel 2 serves up to 32 tokens");
    __shared__ uint32_t stab[256];
    __shared__ uint64_t full[XSEGS], empty[XSEGS];
    xs_init<XSEGS, INT, WARPS>(p, stab, full, empty);

    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int g = lane >> 2, t = lane & 3;
    const bool producer = warp == WARPS;
    const int K = p.kchunks, G = (int)gridDim.x;
    const int64_t U = (int64_t)p.tiles * K;
    const xs_range rg = xs_units(U, (int)blockIdx.x, G);
    const int nch = (int)(rg.u1 - rg.u0);
    const int tile0 = (int)(rg.u0 / K), kc0 = (int)(rg.u0 - (int64_t)tile0 * K);
    const int m_rows = min(p.m, 8 * MT);
    const int xchunk = m_rows * XROW; /* uint4 per staged chunk of activations */

    extern __shared__ __align__(128) uint4 smem[]; /* (128-byte aligned: kernel 1's ring) */
    uint4 *xring = smem + (size_t)WARPS * STAGES * RPW * (CB / 16);
    const uint64_t pol = nbc_policy_evict_first();
    const int wrb = (producer ? 0 : warp) * RPW; /* this warp's first row block within a tile */
    /* this lane's 16 bytes of chunk kc of row block r of tile `tile` (row blocks past n read row block n-1:
     * valid, never stored) */
    auto chunk_ptr = [&](int tile, int kc, int r) {
        const int rb = min(tile * (WARPS * RPW) + wrb + r, p.row_blocks - 1);
        return p.w + ((size_t)rb * K + kc) * CB + 16 * lane;
    };
    const uint8_t *gw[RPW]; /* the next chunk to fetch, per row block */
#pragma unroll
    for (int r = 0; r < RPW; r++) gw[r] = chunk_ptr(tile0, kc0, r);
    int fleft = K - kc0; /* fetches left in the tile of the next fetch */
    /* this lane's 16 bytes of slot 0 (shared address), and the slot being filled / read */
    const uint32_t ring_s = nbc_smem_u32(smem) + (uint32_t)(warp * STAGES * RPW * CB + 16 * lane);
    uint32_t fill = 0, read = 0;
    auto fetch = [&](int f) { /* unit u0 + f: the next step's chunks into slot `fill` */
#pragma unroll
        for (int r = 0; r < RPW; r++) {
            nbc_fetch_chunk<CODE, CB>(ring_s + fill + r * CB, gw[r], lane, pol);
            gw[r] += CB;
        }
        fill = fill == (STAGES - 1) * RPW * CB ? 0 : fill + RPW * CB;
        if (--fleft == 0) { /* the next tile's row blocks (rare: the tile found again from the unit) */
            fleft = K;
            const int ft = (int)((xs_units(U, (int)blockIdx.x, G).u0 + f + 1) / K);
#pragma unroll
            for (int r = 0; r < RPW; r++) gw[r] = chunk_ptr(ft, 0, r);
        }
    };
    float acc[RPW][MT][4];
    nbc_table tab;
    xs_start<FMT, KG, RPW, MT, STAGES>(p, producer, nch, fetch, tab, acc);

    if (producer) {
        xs_stage_activations<SEG, XSEGS, INT, true>(p, xring, nbc_smem_u32(full), nbc_smem_u32(empty), kc0, nch, m_rows,
                                              xchunk, lane);
    } else {
        int xrow[MT];
        xs_token_rows<MT>(xrow, m_rows, g, t);
        const uint4 *wring = smem + (size_t)warp * STAGES * RPW * (CB / 16);
        /* the end of this CTA's part of `tile`, one of three: the whole
         * tile, stored; the rest of a tile that began in an earlier CTA
         * (only a first segment starts mid-tile), a partial in slot b, then
         * this warp counts itself in at the tile; or the start of a tile
         * that ends in later CTAs (only a last segment), kept in acc for
         * the gather after the loop */
        auto finish = [&](int tile, bool whole, bool rest) {
            if (!whole && !rest) return;
#pragma unroll
            for (int r = 0; r < RPW; r++) {
                const int rb = tile * (WARPS * RPW) + wrb + r;
                if (rb < p.row_blocks) {
                    if (whole) {
                        store_block<ACT, MT>(p, acc[r], rb, g, t);
                    } else {
#pragma unroll
                        for (int h = 0; h < 2; h++) {
                            float *d = xs_slot<MT, RPW, WARPS>(p, (int64_t)blockIdx.x, warp, r, h, g);
#pragma unroll
                            for (int mt = 0; mt < MT; mt++)
                                __stcg((float2 *)(d + mt * 8 + 2 * t), make_float2(acc[r][mt][2 * h], acc[r][mt][2 * h + 1]));
                        }
                    }
                }
#pragma unroll
                for (int mt = 0; mt < MT; mt++)
#pragma unroll
                    for (int j = 0; j < 4; j++) acc[r][mt][j] = 0.0f;
            }
            if (rest) { /* release: the warp's stores, then its count (a release reduction: no L1 invalidation
                         * mid-loop, which a fence.acq_rel would add) */
                __syncwarp();
                if (lane == 0) asm volatile("red.release.gpu.global.add.s32 [%0], 1;" ::"l"(p.counters + tile) : "memory");
            }
        };
        int c = 0, seg = 0, xs = 0;
        int left = min(K - kc0, nch); /* steps left in this CTA's part of the current tile */
        for (int i = 0; i < nch; i++) {
            if (i + STAGES - 1 < nch) fetch(i + STAGES - 1); /* into the slot released by step i-1 */
            xs_consume<FMT, ACT, MT, RPW, STAGES, SEG, XSEGS, KG>(p, wring, xring, xchunk, xrow, stab, tab, full, empty, i,
                                                                 nch, g, lane, c, seg, xs, read, acc);
            if (--left == 0) { /* the end of this CTA's part of the tile (rare: the unit found again) */
                const int64_t u = xs_units(U, (int)blockIdx.x, G).u0 + i;
                const int tile = (int)(u / K);
                /* whole when it ran K steps: ending at chunk K - 1, it began at chunk 0; the rest of a tile
                 * when it is the first segment and began mid-tile */
                finish(tile, u - (int64_t)tile * K == K - 1 && i >= K - 1, kc0 != 0 && i == min(K - kc0, nch) - 1);
                left = min(K, nch - i - 1);
            }
        }
        nbc_cp_async_wait<0>();
    }

    nbc_grid_dependents_launch();
    /* The owner of a split tile: this CTA's last segment began the tile
     * (k from 0) and the CTAs after it hold the rest, each in its first
     * segment, which waits for nothing (so, all G CTAs being resident at
     * once, the wait ends).  Each warp waits until every consumer warp of
     * those CTAs has counted itself in, adds their partials of its rows to
     * its own in CTA order (k order: the result does not depend on timing)
     * and stores them; then the counter is zeroed for the next call. */
    const int tile1 = (int)((rg.u1 - 1) / K);
    const bool own = rg.u1 != (int64_t)(tile1 + 1) * K && (tile1 != tile0 || kc0 == 0);
    if (!own) return;
    if (!producer) {
        const int need = xs_owner((int64_t)(tile1 + 1) * K - 1, U, G) - (int)blockIdx.x;
        if (lane == 0) {
            int got;
            for (;;) {
                asm volatile("ld.acquire.gpu.global.s32 %0, [%1];" : "=r"(got) : "l"(p.counters + tile1) : "memory");
                if (got >= need * WARPS) break;
                __nanosleep(32);
            }
        }
        __syncwarp(); /* (after the acquire load: the partials before every lane's loads) */
#pragma unroll
        for (int r = 0; r < RPW; r++) {
            const int rb = tile1 * (WARPS * RPW) + wrb + r;
            if (rb >= p.row_blocks) continue;
            for (int b = 1; b <= need; b++) {
#pragma unroll
                for (int h = 0; h < 2; h++) {
                    const float *sl = xs_slot<MT, RPW, WARPS>(p, (int64_t)blockIdx.x + b, warp, r, h, g);
#pragma unroll
                    for (int mt = 0; mt < MT; mt++) {
                        const float2 v = __ldcg((const float2 *)(sl + mt * 8 + 2 * t));
                        acc[r][mt][2 * h] += v.x;
                        acc[r][mt][2 * h + 1] += v.y;
                    }
                }
            }
            store_block<ACT, MT>(p, acc[r], rb, g, t);
        }
    }
    __syncthreads(); /* every warp has seen the count */
    if (threadIdx.x == 0) p.counters[tile1] = 0;
}

template <int FMT, int ACT, int MT, int RPW, int STAGES, int SEG, int XSEGS, int MINB, bool SK, int XW>
__global__ void __launch_bounds__(XS_THREADS(XW), MINB) gemv_fp4_xs_kernel(const GemvParams p) {
    NBC_CHECK_KERNEL_FORMAT(FMT);
    if constexpr (SK) gemv_xs_sk_body<FMT, ACT, MT, RPW, STAGES, SEG, XSEGS, 0, XW>(p);
    else gemv_xs_body<FMT, ACT, MT, RPW, STAGES, SEG, XSEGS, 0, XW>(p);
}

/* The integer and table formats, kernel group KG (32, 64 or 128): two row
 * blocks per warp. */
template <int FMT, int ACT, int MT, int KG, int MINB, bool SK>
__global__ void __launch_bounds__(XS_THREADS(NBI_GEMV_WARPS), MINB) gemv_int_xs_kernel(const GemvParams p) {
    static_assert(KG == 32 || KG == 64 || KG == 128, "kernel groups of 32, 64 or 128");
    if constexpr (SK) gemv_xs_sk_body<FMT, ACT, MT, 2, XS_STAGES, XS_SEG, XS_XSEGS, KG, NBI_GEMV_WARPS>(p);
    else gemv_xs_body<FMT, ACT, MT, 2, XS_STAGES, XS_SEG, XS_XSEGS, KG, NBI_GEMV_WARPS>(p);
}

/* ------------------------------------------------------------- dispatch */

typedef void (*gemv_fn)(const GemvParams);

/* Dynamic shared memory.  Kernel 1: one ring of GEMV_STAGES chunks per
 * warp (8 warps x 4 stages: 36 KB for NVFP4, under the 48 KB default; it
 * also holds the in-CTA split-K exchange, at most 8 x 32 x 16 floats).
 * Kernel 2: the weight rings (RPW chunks per stage) and the activation
 * segments (m rows x 256 bytes per chunk). */
static size_t gemv_smem_bytes(int fmt, int xs, int rpw, int mt, int m, size_t cb, int warps) {
    if (!cb) cb = nbi_chunk_bytes(nbi_traits((nb_format)fmt)); /* (0: the E2M1 formats' chunk) */
    if (!xs) return (size_t)NBI_GEMV_WARPS * GEMV_STAGES * cb;
    const size_t rows = (size_t)(m < 8 * mt ? m : 8 * mt);
    return (size_t)warps * XS_STAGES * rpw * cb + (size_t)XS_XSEGS * XS_SEG * rows * XROW * 16;
}

/* The instances of one format and dtype: kernel 1 for mt = 1..4 tiles of 8
 * tokens (each with the early and the late trigger), kernel 2 for mt x rows
 * per warp (1, 2). */
template <int FMT, int ACT, bool EARLY>
static gemv_fn pick_k1(int mt) {
    switch (mt) {
    case 1: return gemv_fp4_kernel<FMT, ACT, 1, NBI_GEMV_WARPS, GEMV_STAGES, EARLY>;
    case 2: return gemv_fp4_kernel<FMT, ACT, 2, NBI_GEMV_WARPS, GEMV_STAGES, EARLY>;
    case 3: return gemv_fp4_kernel<FMT, ACT, 3, NBI_GEMV_WARPS, GEMV_STAGES, EARLY>;
    case 4: return gemv_fp4_kernel<FMT, ACT, 4, NBI_GEMV_WARPS, GEMV_STAGES, EARLY>;
    }
    return NULL;
}
template <int FMT, int ACT>
static gemv_fn pick_mt(int mt, int xs, int rpw, int early, int sk, int warps) {
    if (!xs) return early ? pick_k1<FMT, ACT, true>(mt) : pick_k1<FMT, ACT, false>(mt);
    /* the wide instance (plan.c, k2_wave): NBI_GEMV_WIDE_WARPS consumer warps, one CTA
     * per SM, 17..24 tokens, two row blocks per warp; on the stream-K grid,
     * or the split grid where the tiles are exactly one wave */
    if (warps == NBI_GEMV_WIDE_WARPS) {
        if (xs != 2 || rpw != 2 || mt != 3) return NULL;
        return sk ? gemv_fp4_xs_kernel<FMT, ACT, 3, 2, XS_STAGES, XS_SEG, XS_XSEGS, 1, true, NBI_GEMV_WIDE_WARPS>
                  : gemv_fp4_xs_kernel<FMT, ACT, 3, 2, XS_STAGES, XS_SEG, XS_XSEGS, 1, false, NBI_GEMV_WIDE_WARPS>;
    }
    /* four row blocks per warp (plan.c, k2_rpw4): the stream-K wave of one
     * CTA per SM, 17..24 tokens with 8 consumer warps, 25..32 with 7 (8
     * would cap the registers at 224 a thread: it spills) */
    if (rpw == 4) {
        if (!sk || xs != 2) return NULL;
        if (mt == 3 && warps == NBI_GEMV_WARPS)
            return gemv_fp4_xs_kernel<FMT, ACT, 3, 4, XS_STAGES, XS_SEG, XS_XSEGS, 1, true, NBI_GEMV_WARPS>;
        if (mt == 4 && warps == NBI_GEMV_RPW4_WARPS)
            return gemv_fp4_xs_kernel<FMT, ACT, 4, 4, XS_STAGES, XS_SEG, XS_XSEGS, 1, true, NBI_GEMV_RPW4_WARPS>;
        return NULL;
    }
    if (warps != NBI_GEMV_WARPS) return NULL;
#define XS_KERNEL(MT, R) gemv_fp4_xs_kernel<FMT, ACT, MT, R, XS_STAGES, XS_SEG, XS_XSEGS, XS_MINB, false, NBI_GEMV_WARPS>
#define XS_SK(MT, MINB) gemv_fp4_xs_kernel<FMT, ACT, MT, 2, XS_STAGES, XS_SEG, XS_XSEGS, MINB, true, NBI_GEMV_WARPS>
    /* stream-K (two row blocks per warp): 17..32 tokens at one CTA per SM
     * (the planner's wave for them), fewer at two */
    if (sk) {
        if (rpw != 2) return NULL;
        switch (mt) {
        case 1: return xs == 1 ? XS_SK(1, XS_MINB) : NULL;
        case 2: return xs == 1 ? XS_SK(2, XS_MINB) : NULL;
        case 3: return xs == 2 ? XS_SK(3, 1) : NULL;
        case 4: return xs == 2 ? XS_SK(4, 1) : NULL;
        }
        return NULL;
    }
#undef XS_SK
    /* xs = 2: a grid of at most one CTA per SM, where the register cap of two
     * (XS_MINB) buys nothing: 17..32 tokens without it (at 25..32 tokens the
     * two-CTA instance spills) */
    if (xs == 2 && rpw == 2 && mt == 3)
        return gemv_fp4_xs_kernel<FMT, ACT, 3, 2, XS_STAGES, XS_SEG, XS_XSEGS, 1, false, NBI_GEMV_WARPS>;
    if (xs == 2 && rpw == 2 && mt == 4)
        return gemv_fp4_xs_kernel<FMT, ACT, 4, 2, XS_STAGES, XS_SEG, XS_XSEGS, 1, false, NBI_GEMV_WARPS>;
    switch (mt * 4 + rpw) {
    case 5: return XS_KERNEL(1, 1);
    case 6: return XS_KERNEL(1, 2);
    case 9: return XS_KERNEL(2, 1);
    case 10: return XS_KERNEL(2, 2);
    case 13: return XS_KERNEL(3, 1);
    case 14: return XS_KERNEL(3, 2);
    case 17: return XS_KERNEL(4, 1);
    case 18: return XS_KERNEL(4, 2);
    }
#undef XS_KERNEL
    return NULL; /* kernel 2 needs rpw 1 or 2 */
}

/* The instance of an integer or table format: kernel 1, or kernel 2 (xs)
 * with two row blocks per warp, 17..32 tokens only with one CTA per SM
 * (under the register cap of two every such instance spills, 88 to 1268
 * bytes; ptxas, sm_90a); stream-K (sk) only for 9..32 tokens. */
template <int FMT, int ACT, int MT, int KG>
static gemv_fn int_instance(int xs, int sk, int lut) {
    if (sk) {
        if constexpr (MT >= 2) return xs ? gemv_int_xs_kernel<FMT, ACT, MT, KG, MT <= 2 ? XS_MINB : 1, true> : NULL;
        return NULL;
    }
    if (xs) return gemv_int_xs_kernel<FMT, ACT, MT, KG, MT <= 2 ? XS_MINB : 1, false>;
    if constexpr (nbc_is_table<FMT>())
        return lut ? gemv_table_kernel<FMT, ACT, MT, KG, NBI_GEMV_WARPS, GEMV_STAGES, true>
                   : gemv_table_kernel<FMT, ACT, MT, KG, NBI_GEMV_WARPS, GEMV_STAGES, false>;
    else return gemv_int4_kernel<FMT, ACT, MT, KG, NBI_GEMV_WARPS, GEMV_STAGES>;
}

/* The integer and table formats' instances for mt x kernel group. */
template <int FMT, int ACT>
static gemv_fn pick_int(int mt, int kg, int xs, int sk, int lut) {
#define INT_MT(KG)                                                    \
    switch (mt) {                                                     \
    case 1: return int_instance<FMT, ACT, 1, KG>(xs, sk, lut);        \
    case 2: return int_instance<FMT, ACT, 2, KG>(xs, sk, lut);        \
    case 3: return int_instance<FMT, ACT, 3, KG>(xs, sk, lut);        \
    case 4: return int_instance<FMT, ACT, 4, KG>(xs, sk, lut);        \
    }                                                                 \
    return NULL;
    if (kg == 32) { INT_MT(32) }
    if (kg == 64) { INT_MT(64) }
    if (kg == 128) { INT_MT(128) }
#undef INT_MT
    return NULL;
}

static gemv_fn pick_kernel(int fmt, int act, int mt, int xs, int rpw, int kg, int early, int sk, int lut, int warps) {
#define GEMV_RUNG(F, A) return pick_mt<F, A>(mt, xs, rpw, early, sk, warps);
    NBC_LADDER(fmt, act, GEMV_RUNG)
#undef GEMV_RUNG
#define INT_RUNG(F, A) \
    return warps == NBI_GEMV_WARPS && (!xs || (rpw == 2 && (mt <= 2 || xs == 2))) ? pick_int<F, A>(mt, kg, xs, sk, lut) : NULL;
    NBC_DECODE_LADDER(fmt, act, INT_RUNG)
#undef INT_RUNG
    return NULL;
}

extern "C" size_t nbi_cuda_gemv_smem(int fmt, int xs, int rpw, int mt, int m, size_t chunk_bytes, int warps) {
    /* + static: + kernel 2's barriers */
    return gemv_smem_bytes(fmt, xs, rpw, mt, m, chunk_bytes, warps) + GEMV_SMEM_ALIGN(GEMV_STATIC_SMEM + 16 * XS_XSEGS);
}

/* Whether kernel 1 of a table format takes its operands from the pair
 * table on ctx's GPU: where two CTAs with it still fit an SM's shared
 * memory (H100/H200 228 KB, A100 164 KB: 70-76 KB each with the ring); on
 * GPUs of 100 KB per SM (sm_86, sm_89) the table would leave one CTA per SM
 * (two without it), so they keep the planes in registers. */
static int gemv_table_lut_fits(const nb_context *ctx, const nbi_gemm_plan *pl) {
    if (pl->xsh || !nbi_is_table(nbi_traits((nb_format)pl->fmt))) return 0;
    const size_t cta = gemv_smem_bytes(pl->fmt, 0, pl->rpw, pl->mt, (int)pl->m, (size_t)pl->chunk_bytes, pl->warps) +
                       GEMV_SMEM_ALIGN(GEMV_K1_STATIC_SMEM + NBC_TABLE_LUT_BYTES) + 1024; /* + the runtime's reserve */
    return 2 * cta <= ctx->info.smem_per_sm;
}

/* The kernel plan pl launches on ctx's GPU. */
static gemv_fn plan_kernel(const nb_context *ctx, const nbi_gemm_plan *pl) {
    /* kernel 1's early trigger for streams of at most GEMV_EARLY_CHUNKS chunks a warp */
    const int early = !pl->xsh && (pl->chunks_per_split + pl->kw - 1) / pl->kw <= GEMV_EARLY_CHUNKS;
    const int sk = nbi_plan_stream_k(pl); /* kernel 2's stream-K grid */
    return pick_kernel(pl->fmt, pl->act, pl->mt, pl->xsh, pl->rpw, pl->group, early, sk,
                       gemv_table_lut_fits(ctx, pl), pl->warps);
}

/* Kernel 1's static shared memory (pl->xsh 0): the scale table, is_last and
 * the ring barriers, and in the table formats' LUT instances the pair
 * table. */
static size_t gemv_static_smem(const nb_context *ctx, const nbi_gemm_plan *pl) {
    if (pl->xsh) return GEMV_SMEM_ALIGN(GEMV_STATIC_SMEM + 16 * XS_XSEGS); /* (kernel 2: + its barriers) */
    return GEMV_SMEM_ALIGN(GEMV_K1_STATIC_SMEM + (gemv_table_lut_fits(ctx, pl) ? NBC_TABLE_LUT_BYTES : 0));
}

/* The occupancy cap of kernel 1: dynamic shared memory past its ring, so
 * that at most cap CTAs fit on an SM (the planner's choice, plan.c): from
 * an even share of the SM's shared memory among cap + 1 CTAs less the
 * runtime's 1 KB per CTA and the static bytes, up in 1 KB steps until the
 * occupancy calculator agrees (at most a few steps). */
extern "C" int nbi_cuda_gemv_ctas_per_sm(nb_context *ctx, const nbi_gemm_plan *pl, int cap, size_t *bytes) {
    const gemv_fn f = plan_kernel(ctx, pl);
    const size_t ring = gemv_smem_bytes(pl->fmt, pl->xsh, pl->rpw, pl->mt, (int)pl->m, (size_t)pl->chunk_bytes, pl->warps);
    const int threads = pl->xsh ? XS_THREADS(pl->warps) : NBI_GEMV_WARPS * 32;
    *bytes = ring;
    if (!f) return 0;
    /* past 48 KB with its static bytes the calculator counts a kernel only
     * once it has opted in, which its launch does anyway (nbi_cuda_gemv):
     * kernel 1 of the table formats (the pair table) and of int8 (2 KB
     * chunks, 68 KB), kernel 2 (asked for its cap, plan.c) */
    if (ring + gemv_static_smem(ctx, pl) > 48 * 1024 && nbc_smem_opt_in(ctx, (const void *)f, ring)) return 0;
    int c = nbc_ctas_per_sm(ctx, (const void *)f, threads, ring);
    if (cap <= 0 || c <= cap) return c;
    const size_t sm = ctx->info.smem_per_sm, optin = ctx->info.smem_per_block_optin;
    const size_t st = gemv_static_smem(ctx, pl);
    size_t b = sm / (size_t)(cap + 1) + 1 > 1024 + st ? sm / (size_t)(cap + 1) + 1 - 1024 - st : 0;
    if (b < ring) b = ring;
    for (int i = 0; i < 8 && b + st <= optin; i++, b += 1024) {
        if (b + st > 48 * 1024 && nbc_smem_opt_in(ctx, (const void *)f, b)) break;
        c = nbc_ctas_per_sm(ctx, (const void *)f, threads, b);
        if (c > 0 && c <= cap) {
            *bytes = b;
            return c;
        }
    }
    *bytes = ring; /* (not reached on the GPUs measured: no cap) */
    return nbc_ctas_per_sm(ctx, (const void *)f, threads, ring);
}

extern "C" nb_status nbi_cuda_gemv(nb_context *ctx, const nbi_gemm_plan *pl, const void *x, const void *packed,
                                   const void *bias, void *y, void *workspace, void *stream) {
    gemv_fn f = plan_kernel(ctx, pl);
    const int sk = nbi_plan_stream_k(pl); /* kernel 2's stream-K grid */
    if (!f)
        return nbi_fail(ctx, NB_ERR_INTERNAL, "gemv: no kernel for %s, %s, mt = %d, staged %d, rows per warp %d, "
                        "group %d, stream-K %d", nbi_traits((nb_format)pl->fmt)->name, nbi_dtype_name((nb_dtype)pl->act),
                        pl->mt, pl->xsh, pl->rpw, pl->group, sk);
    GemvParams p;
    NBC_SET_GEMM_PARAMS(p, pl, packed, y, bias);
    p.x = x;
    p.counters = (int *)workspace;
    p.partial = (float *)((char *)workspace + pl->ws_counter_bytes);
    p.lda = pl->lda;
    p.cps = pl->chunks_per_split;
    p.splits = pl->splits;
    p.kw = pl->kw;
    p.rpc = pl->k1_rows > 0 ? pl->k1_rows : NBI_GEMV_WARPS / pl->kw;
    p.tiles = pl->tiles_n;
    p.scale_bf16 = pl->scale_bf16;
    /* grid_x CTAs along n times `splits` along k; kernel 2's stream-K grid:
     * grid_x CTAs over tiles_n column tiles x kchunks (gemv_xs_sk_body) */
    dim3 grid((unsigned)pl->grid_x, sk ? 1u : (unsigned)pl->splits);
    size_t smem = gemv_smem_bytes(pl->fmt, pl->xsh, pl->rpw, pl->mt, (int)pl->m, (size_t)pl->chunk_bytes, pl->warps);
    if ((size_t)pl->dyn_smem > smem) smem = (size_t)pl->dyn_smem; /* the occupancy cap (kernels 1 and 2) */
    /* Kernel 2 can exceed the 48 KB default (static + dynamic): opt in, for
     * its largest launch. */
    if (pl->xsh) {
        const size_t most = gemv_smem_bytes(pl->fmt, 1, pl->rpw, pl->mt, 8 * pl->mt, (size_t)pl->chunk_bytes, pl->warps);
        nb_status st = nbc_smem_opt_in(ctx, (const void *)f, most > smem ? most : smem);
        if (st) return st;
    } else if (smem + gemv_static_smem(ctx, pl) > 48 * 1024) { /* past the default: kernel 1 of int8 (2 KB chunks, 68 KB), of
                                                            * the table formats (the pair table), the cap */
        nb_status st = nbc_smem_opt_in(ctx, (const void *)f, smem);
        if (st) return st;
    }
    cudaLaunchAttribute attr[1];
    cudaLaunchConfig_t cfg =
        nbc_launch_config(grid, dim3(pl->xsh ? XS_THREADS(pl->warps) : NBI_GEMV_WARPS * 32), smem, stream, pl->pdl, attr);
    NBC_TRY(cudaLaunchKernelEx(&cfg, f, p), "gemv kernel launch");
    return NB_OK;
}
