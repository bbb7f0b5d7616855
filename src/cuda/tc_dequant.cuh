/* tc_dequant.cuh - dequantization for the tensor-core kernels (gemm_sm90.cu,
 * gemm_sm80.cu): a packed chunk in shared memory -> the A fragments of its
 * eight k16 tiles in natural k order (tile j = k 16j .. 16j+15).
 *
 * The fragment is the A operand of mma.sync.m16n8k16.row (PTX ISA "Matrix
 * Fragments for mma.m16n8k16"), which is also the register A operand of
 * wgmma m64nNk16 for the warp's 16 rows: lane (g = lane/4, t = lane%4)
 * holds a0 = row g, k 2t..2t+1; a1 = row g+8, same k; a2 = row g,
 * k 2t+8..2t+9; a3 = row g+8, same k.  Derivation from the packed layout
 * (gemv_fp4.cu "PACKED LAYOUT"): row g's 128 codes are the 64 bytes at 64g
 * of the chunk (row g+8 at 512 + 64g), eight k per 32-bit word (word
 * k/8), and elements 2i, 2i+1 of a word are pair i, in its low and high
 * halves (internal.h NBI_E2M1_MAG / NBI_E2M1_SIGN).  Tile j needs, per
 * row, k = 16j + 2t, +1 (word 2j, pair t) and 16j + 2t + 8, +9 (word 2j+1,
 * pair t): a rotation by a per-lane amount and a mask place pair t's
 * magnitudes, a multiply by a per-lane power of two and a mask its signs
 * (nbc_e2m1_lane).  The four lanes of a row read the same 16 bytes (a
 * broadcast).  The decoded value
 * times the adjusted block scale (one HMUL2) is exact: gemv_fp4.cu
 * "DEQUANTIZATION".  Scale bytes: NVFP4 group j of rows g / g+8 is byte
 * 4(j/2) + (j&1) / +2 of the 16 bytes at 1024 + 16g; MXFP4 group j/2 is
 * byte 2(j/2) / +1 of the 8 bytes at 1024 + 8g. */
#ifndef NB_TC_DEQUANT_CUH
#define NB_TC_DEQUANT_CUH

#include "common.cuh"
#include "gemv_step.cuh" /* the integer formats' chunk tail and q - z pairs */

/* What lane t (of its quad) does to decode pair t of a packed word:
 * rotate left by rm to bring the magnitudes to bits 8..6 (BF16) or 11..9
 * (FP16) of each half, multiply by sm = 2^ds to bring the signs to bits 15
 * and 31 (every sign moves left; the multiply runs beside the rotation,
 * on the FMA pipe).  Computed once per thread. */
struct nbc_e2m1_lane {
    uint32_t rm, sm;
};
template <int ACT>
__device__ __forceinline__ nbc_e2m1_lane nbc_e2m1_lane_of(int t) {
    const int mag = NBI_E2M1_MAG(t), sign = NBI_E2M1_SIGN(t);
    return {(uint32_t)((ACT == NB_DTYPE_BF16 ? 6 : 9) - mag) & 31u, 1u << (15 - sign)};
}

/* Pair t of word q (lane t's, l = nbc_e2m1_lane_of(t)) as a 16-bit pair
 * with the sign at bit 15 and e1e0m at the low exponent bits: a rotation,
 * a multiply and two masks, as many as the nibble order before needed. */
template <int ACT>
__device__ __forceinline__ uint32_t nbc_decode_pair_lane(uint32_t q, nbc_e2m1_lane l) {
    const uint32_t mm = ACT == NB_DTYPE_BF16 ? 0x01C001C0u : 0x0E000E00u;
    return (__funnelshift_l(q, q, l.rm) & mm) | ((q * l.sm) & 0x80008000u);
}

/* bf16x2 / f16x2 multiply as PTX (not common.cuh's nbc_hmul2 intrinsic,
 * which compiles to the same HMUL2 but lets the scheduler reorder the
 * Hopper kernel's measured code: unify after the next GPU measurement).
 * mul.bf16x2 needs sm_90; before it the same exact product is an FMA with
 * -0.0 (what cuda_bf16.hpp does: x * y + -0 keeps the sign of a zero
 * product). */
template <int ACT>
__device__ __forceinline__ uint32_t nbc_hmul2_ptx(uint32_t a, uint32_t b) {
    uint32_t r;
    if (ACT == NB_DTYPE_BF16) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
        asm("mul.rn.bf16x2 %0, %1, %2;" : "=r"(r) : "r"(a), "r"(b));
#else
        asm("fma.rn.bf16x2 %0, %1, %2, %3;" : "=r"(r) : "r"(a), "r"(b), "r"(0x80008000u));
#endif
    } else {
        asm("mul.rn.f16x2 %0, %1, %2;" : "=r"(r) : "r"(a), "r"(b));
    }
    return r;
}

/* Tiles 2q and 2q+1 (k = 32q .. 32q+31) into a[2q] and a[2q+1]: the four
 * words of rows g and g+8 at byte 16q of each row, and w, the scale word
 * that holds their groups (NVFP4: word q of the 16 bytes at 1024 + 16g;
 * MXFP4: word q/2 of the 8 bytes at 1024 + 8g).  l: the lane's
 * nbc_e2m1_lane_of(t).  wsm may start 32 bytes per skipped pair of q into
 * the chunk, with a and q counted from there (a kernel that dequantizes
 * half a chunk).  q must be a constant after unrolling. */
template <int FMT, int ACT, int N>
__device__ __forceinline__ void nbc_dequant_tiles(const uint8_t *wsm, const uint32_t *stab, int g, nbc_e2m1_lane l,
                                                  int q, uint32_t w, uint32_t (&a)[N][4]) {
    const uint4 lo = *(const uint4 *)(wsm + 64 * g + 16 * q);
    const uint4 hi = *(const uint4 *)(wsm + 512 + 64 * g + 16 * q);
#pragma unroll
    for (int jj = 0; jj < 2; jj++) {
        const int j = 2 * q + jj;
        uint32_t sg, sh8; /* adjusted scales of rows g and g+8 for tile j */
        if (nbc_fmt<FMT>::group == 16) { /* group j: byte 4(j/2) + (j&1), +2 for row g+8 */
            sg = stab[(w >> (8 * jj)) & 0xFF];
            sh8 = stab[(w >> (8 * (2 + jj))) & 0xFF];
        } else { /* group j/2 = q: bytes 2q, 2q+1 */
            sg = stab[(w >> (16 * (q & 1))) & 0xFF];
            sh8 = stab[(w >> (16 * (q & 1) + 8)) & 0xFF];
        }
        a[j][0] = nbc_hmul2_ptx<ACT>(nbc_decode_pair_lane<ACT>(word(lo, 2 * jj), l), sg);
        a[j][1] = nbc_hmul2_ptx<ACT>(nbc_decode_pair_lane<ACT>(word(hi, 2 * jj), l), sh8);
        a[j][2] = nbc_hmul2_ptx<ACT>(nbc_decode_pair_lane<ACT>(word(lo, 2 * jj + 1), l), sg);
        a[j][3] = nbc_hmul2_ptx<ACT>(nbc_decode_pair_lane<ACT>(word(hi, 2 * jj + 1), l), sh8);
    }
}

/* A fragments of the eight k16 tiles of one packed chunk (wsm) for rows g,
 * g+8 of its 16-row block. */
template <int FMT, int ACT>
__device__ __forceinline__ void nbc_dequant_chunk(const uint8_t *wsm, const uint32_t *stab, int g, int t,
                                                  uint32_t (&a)[8][4]) {
    uint32_t sc[2][2]; /* scale bytes: NVFP4 16 (two words per half), MXFP4 8 */
    if (nbc_fmt<FMT>::group == 16) {
        const uint4 v = *(const uint4 *)(wsm + 1024 + 16 * g);
        sc[0][0] = v.x, sc[0][1] = v.y, sc[1][0] = v.z, sc[1][1] = v.w;
    } else {
        const uint2 v = *(const uint2 *)(wsm + 1024 + 8 * g);
        sc[0][0] = v.x, sc[0][1] = v.y, sc[1][0] = sc[1][1] = 0;
    }
    const nbc_e2m1_lane l = nbc_e2m1_lane_of<ACT>(t);
#pragma unroll
    for (int q = 0; q < 4; q++) /* tiles 2q, 2q+1 */
        nbc_dequant_tiles<FMT, ACT>(wsm, stab, g, l, q, nbc_fmt<FMT>::group == 16 ? sc[q >> 1][q & 1] : sc[0][q >> 1], a);
}

/* ------------------------------------------ 4-bit integer formats (sm90) */

/* A group's scale (index i of a lane group's tail, int_tail) as two copies
 * in ACT: the stored bits when the scale type is ACT's, else rounded to ACT
 * (F16 scales with BF16 activations: the planner sends no other mix). */
template <int ACT, int KG>
__device__ __forceinline__ uint32_t nbc_int_scale_pair(const uint32_t (&sw)[NBI_CHUNK_K / KG], int i, int scale_bf16) {
    return nbc_h16_pair<ACT>(sw, i, scale_bf16);
}

/* One A register of an integer format: elements 2t, 2t+1 of word w (at
 * nibbles t, t+4; sh = 4t) as r((q - z) s): int_pair's LOP3 + HSUB2 give
 * the exact q - z (zz: M + z twice), one HMUL2 the product (ss: the scale
 * twice, in ACT). */
template <int ACT, int ZT>
__device__ __forceinline__ uint32_t nbc_int_reg(uint32_t w, int sh, uint32_t zz, uint32_t ss) {
    return nbc_hmul2_ptx<ACT>(int_pair<ACT, 0, ZT>(w >> sh, zz), ss);
}

/* A fragments of the eight k16 tiles of one packed chunk of a 4-bit integer
 * format (int4, int4_sym; kernel group KG: docs/formats.md 8.7) for rows g,
 * g+8, in natural k order, as dequantized weights r((q - z) s) in ACT.
 * The chunk keeps k = 32G + 8t' + e in word G of lane t' (the decode
 * kernel's order), so row g's 64 bytes at 64g hold the word of k/8 = w at
 * position 4 (w % 4) + w / 4: the thread reads all four 16-byte pieces of
 * each row and takes tile j's words 2j, 2j+1 from there (a transposition in
 * registers, no extra loads).  Elements 2t, 2t+1 of a word sit at nibbles
 * t and t+4, as in E2M1's order: one shift and int_pair's LOP3 + HSUB2
 * give the exact q - z, one HMUL2 by the group's scale rounds it once
 * (when the scale type is ACT's; F16 scales with BF16 activations are
 * rounded to BF16 first).  Every 32-wide sub-range lies in one kernel
 * group. */
template <int FMT, int ACT, int KG>
__device__ __forceinline__ void nbc_dequant_chunk_int(const uint8_t *wsm, int g, int t, int scale_bf16,
                                                      uint32_t (&a)[8][4]) {
    typedef nbc_int_chunk<FMT, KG> C;
    constexpr int SPG = KG / 32; /* sub-ranges per kernel group */
    constexpr int ZT = C::zt;
    static_assert(!C::table, "the table formats are not decoded here");
    uint32_t sw[C::sw], zw[4];
    int_tail<FMT, KG>((const uint4 *)wsm, g, sw, zw);
    uint4 L[4], H[4]; /* piece p of rows g, g+8: word G holds k/8 = 4G + p */
#pragma unroll
    for (int p = 0; p < 4; p++) {
        L[p] = *(const uint4 *)(wsm + 64 * g + 16 * p);
        H[p] = *(const uint4 *)(wsm + 512 + 64 * g + 16 * p);
    }
    const int sh = 4 * t;
    uint32_t sg = 0, s8 = 0, zg = 0, z8 = 0;
#pragma unroll
    for (int q = 0; q < 4; q++) { /* sub-range q: tiles 2q, 2q+1, words 4q .. 4q+3 */
        if (q % SPG == 0) {
            const int j = q / SPG, gpc = C::gpc;
            sg = nbc_int_scale_pair<ACT, KG>(sw, j, scale_bf16);
            s8 = nbc_int_scale_pair<ACT, KG>(sw, gpc + j, scale_bf16);
            zg = int_zero<ACT, ZT>(zw, j, scale_bf16);
            z8 = int_zero<ACT, ZT>(zw, gpc + j, scale_bf16);
        }
#pragma unroll
        for (int p = 0; p < 4; p++) { /* word 4q + p: tile 2q + p / 2, registers 2 (p % 2) and +1 */
            a[2 * q + p / 2][2 * (p % 2)] = nbc_int_reg<ACT, ZT>(word(L[p], q), sh, zg, sg);
            a[2 * q + p / 2][2 * (p % 2) + 1] = nbc_int_reg<ACT, ZT>(word(H[p], q), sh, z8, s8);
        }
    }
}

/* ------------------------------------- int8 (both tensor-core kernels) */

/* One A register of int8: bytes sh/8 and sh/8 + 2 of word w (elements 2t,
 * 2t+1 of the tile, sh = 8 (t % 2)) as r(q s): i8_pair's exact q, one
 * HMUL2 by the scale pair ss (in ACT). */
template <int ACT>
__device__ __forceinline__ uint32_t nbc_i8_reg(uint32_t w, int sh, uint32_t ss) {
    return nbc_hmul2_ptx<ACT>(i8_pair<ACT>(w >> sh), ss);
}

/* Tiles 4P .. 4P+3 (sub-ranges G = 2P, 2P+1: k = 64P .. 64P+63 of the
 * chunk) of an int8 chunk (docs/formats.md 8.9) for rows g, g+8 into
 * a[a0 .. a0+3] (a0 a constant after unrolling), as r(q s) in ACT.  The
 * chunk keeps the decode kernel's k order: piece P of lane 4g + t' holds,
 * for row g at 512P + 64g + 16t' (row g+8 1024 further), k = 32G + 8t' + e
 * of G = 2P, 2P+1 in word 2 (e / 4) + G % 2, element e in byte
 * [0,2,1,3][e % 4].  Tile 2G + jj's registers 0, 1
 * need elements 2t, 2t+1 of piece t' = 2jj, registers 2, 3 those of piece
 * 2jj + 1: words 2 (t / 2) + G % 2, bytes t % 2 and t % 2 + 2.  So the
 * thread reads 8 bytes per piece and row (words 2 (t / 2), + 1: G = 2P,
 * 2P + 1) and shifts each word by 8 (t % 2).  sc: the scale pairs in ACT,
 * row g at index j, row g+8 at GPC + j, per kernel group j. */
template <int ACT, int KG, int N>
__device__ __forceinline__ void nbc_i8_half(const uint8_t *wsm, int g, int t, int P,
                                            const uint32_t (&sc)[2 * (NBI_CHUNK_K / KG)], uint32_t (&a)[N][4], int a0) {
    constexpr int GPC = NBI_CHUNK_K / KG, SPG = KG / 32;
    const int sh = 8 * (t & 1);
    const uint8_t *base = wsm + 512 * P + 64 * g + 8 * (t >> 1);
#pragma unroll
    for (int tp = 0; tp < 4; tp++) { /* piece t' */
        const uint2 l = *(const uint2 *)(base + 16 * tp), h = *(const uint2 *)(base + 1024 + 16 * tp);
#pragma unroll
        for (int gg = 0; gg < 2; gg++) { /* G = 2P + gg: tile 2G + tp / 2, local 2 gg + tp / 2 */
            const int j = (2 * P + gg) / SPG;
            uint32_t(&r)[4] = a[a0 + 2 * gg + tp / 2];
            r[2 * (tp & 1)] = nbc_i8_reg<ACT>(gg ? l.y : l.x, sh, sc[j]);
            r[2 * (tp & 1) + 1] = nbc_i8_reg<ACT>(gg ? h.y : h.x, sh, sc[GPC + j]);
        }
    }
}

/* The scale pairs in ACT of a lane group's tail (int_tail): row g at
 * index j, row g+8 at gpc + j. */
template <int FMT, int ACT, int KG>
__device__ __forceinline__ void nbc_int_scale_pairs(const uint8_t *wsm, int g, int scale_bf16,
                                                    uint32_t (&sc)[2 * (NBI_CHUNK_K / KG)]) {
    uint32_t sw[nbc_int_chunk<FMT, KG>::sw], zw[4];
    int_tail<FMT, KG>((const uint4 *)wsm, g, sw, zw);
#pragma unroll
    for (int i = 0; i < 2 * (NBI_CHUNK_K / KG); i++) sc[i] = nbc_int_scale_pair<ACT, KG>(sw, i, scale_bf16);
}

/* A fragments of the eight k16 tiles of an int8 chunk (rows g, g+8, natural
 * k order), both halves of nbc_i8_half. */
template <int FMT, int ACT, int KG>
__device__ __forceinline__ void nbc_dequant_chunk_i8(const uint8_t *wsm, int g, int t, int scale_bf16,
                                                     uint32_t (&a)[8][4]) {
    uint32_t sc[2 * (NBI_CHUNK_K / KG)];
    nbc_int_scale_pairs<FMT, ACT, KG>(wsm, g, scale_bf16, sc);
    nbc_i8_half<ACT, KG>(wsm, g, t, 0, sc, a, 0);
    nbc_i8_half<ACT, KG>(wsm, g, t, 1, sc, a, 4);
}

/* ------------------------------------ bitsandbytes' table formats (sm90) */

/* The planes of a table format's values (the first eight words of the
 * kernel's parameter table), read back from stab, the table in shared
 * memory that nbc_load_scale_table expands to a 16-bit half per word. */
__device__ __forceinline__ nbc_table nbc_table_from_stab(const uint32_t *stab) {
    nbc_table tab;
#pragma unroll
    for (int i = 0; i < 8; i++) {
        const uint2 v = *(const uint2 *)(stab + 2 * i);
        const uint32_t w = (v.x & 0xFFFFu) | (v.y << 16);
        if (i < 4) tab.lo[i] = w;
        else tab.hi[i - 4] = w;
    }
    return tab;
}

/* One k16 tile of a table format: words l0, h0 (rows g, g+8, k/8 = 2j) and
 * l1, h1 (2j + 1); byte t of each (bsel) gathered into one word of eight
 * codes, looked up four at a time, times the absmax pairs sg, s8. */
template <int ACT>
__device__ __forceinline__ void nbc_table_tile(uint32_t l0, uint32_t h0, uint32_t l1, uint32_t h1, uint32_t bsel,
                                               const nbc_table &tab, uint32_t sg, uint32_t s8, uint32_t (&a)[4]) {
    const uint32_t lo = nbc_prmt(l0, h0, bsel); /* a0, a1 codes */
    const uint32_t hi = nbc_prmt(l1, h1, bsel); /* a2, a3 codes */
    const uint32_t Q = nbc_prmt(lo, hi, 0x5410);
    const uint32_t sel = Q & 0x77777777u, q4 = Q << 4;
    uint32_t r[4];
    table_quad<0>(sel, table_mask<0>(Q, q4), tab, r[0], r[1]);
    table_quad<1>(sel, table_mask<1>(Q, q4), tab, r[2], r[3]);
    a[0] = nbc_hmul2_ptx<ACT>(r[0], sg);
    a[1] = nbc_hmul2_ptx<ACT>(r[1], s8);
    a[2] = nbc_hmul2_ptx<ACT>(r[2], sg);
    a[3] = nbc_hmul2_ptx<ACT>(r[3], s8);
}

/* A table format's absmax (index i of a lane group's tail) rounded to ACT,
 * twice. */
template <int ACT, int N>
__device__ __forceinline__ uint32_t nbc_absmax_pair(const uint32_t (&sw)[N], int i) {
    return nbc_act_pair<ACT>(table_scale(sw, i));
}

/* A fragments of the eight k16 tiles of one packed chunk of a table format
 * (nf4, bnb_fp4; kernel group KG: docs/formats.md 8.8) for rows g, g+8, in
 * natural k order, as r(r(v) r(absmax)) in ACT: v the table value, r the
 * rounding to ACT.  The chunk's k order is the integer formats' (word 4q+p
 * of a row at piece p, word q), but a word keeps its elements in nibble
 * order, so elements 2t, 2t+1 are byte t.  Per tile the thread gathers
 * byte t of its four words (rows g, g+8 at k/8 = 2j and 2j+1) into one word
 * Q (three PRMT) whose nibbles are the eight codes of its four A registers
 * in order, and looks them up four at a time with the decode kernel's PRMT
 * table (gemv_step.cuh table_quad: the table's byte planes are the first
 * eight words of the kernel's parameter table, which stab holds expanded,
 * a 16-bit half per word); one HMUL2 by the kernel group's absmax rounded
 * to ACT. */
template <int FMT, int ACT, int KG>
__device__ __forceinline__ void nbc_dequant_chunk_table(const uint8_t *wsm, const uint32_t *stab, int g, int t,
                                                        uint32_t (&a)[8][4]) {
    typedef nbc_int_chunk<FMT, KG> C;
    static_assert(C::table, "the table formats");
    constexpr int SPG = KG / 32;
    uint32_t sw[C::sw], zw[4];
    int_tail<FMT, KG>((const uint4 *)wsm, g, sw, zw);
    const nbc_table tab = nbc_table_from_stab(stab);
    const uint32_t bsel = (uint32_t)t | (uint32_t)(t + 4) << 4; /* byte t of each of two words */
    uint32_t sc[2 * C::gpc]; /* the absmax pairs in ACT: row g (index j), row g+8 (gpc + j) */
#pragma unroll
    for (int i = 0; i < 2 * C::gpc; i++) sc[i] = nbc_absmax_pair<ACT>(sw, i);
    /* Half the code pieces at a time (tiles 2q + h read pieces 2h, 2h+1):
     * 16 registers of codes live instead of 32 (the 256-token tile with
     * blocks of 32 spilled with all of them). */
#pragma unroll
    for (int h = 0; h < 2; h++) {
        const uint4 L0 = *(const uint4 *)(wsm + 64 * g + 32 * h), L1 = *(const uint4 *)(wsm + 64 * g + 32 * h + 16);
        const uint4 H0 = *(const uint4 *)(wsm + 512 + 64 * g + 32 * h),
                    H1 = *(const uint4 *)(wsm + 512 + 64 * g + 32 * h + 16);
#pragma unroll
        for (int q = 0; q < 4; q++) { /* tile 2q + h: words 4q + 2h (registers 0, 1) and 4q + 2h + 1 (2, 3) */
            const int j = q / SPG;
            nbc_table_tile<ACT>(word(L0, q), word(H0, q), word(L1, q), word(H1, q), bsel, tab, sc[j], sc[C::gpc + j],
                                a[2 * q + h]);
        }
    }
}

/* ------------------------- integer and table formats, half a chunk (sm80) */

/* Tiles 4kh .. 4kh+3 (sub-ranges 2kh, 2kh+1: k = 64kh .. 64kh+63 of the
 * chunk) of an integer or table format (kernel group KG) for rows g, g+8
 * into a[0..3], as the whole-chunk functions above compute them: words
 * 2kh, 2kh+1 of each of the rows' four pieces (one 8-byte load per piece
 * and row), the scales and zero points of the lane group's tail.  The
 * mma.sync kernel (gemm_sm80.cu) gives each warp half a chunk. */
template <int FMT, int ACT, int KG>
__device__ __forceinline__ void nbc_dequant_half_grp(const uint8_t *wsm, const uint32_t *stab, int g, int t, int kh,
                                                     int scale_bf16, uint32_t (&a)[4][4]) {
    typedef nbc_int_chunk<FMT, KG> C;
    if constexpr (C::i8) { /* int8: the half is piece kh */
        uint32_t sc[2 * C::gpc];
        nbc_int_scale_pairs<FMT, ACT, KG>(wsm, g, scale_bf16, sc);
        nbc_i8_half<ACT, KG>(wsm, g, t, kh, sc, a, 0);
        return;
    }
    constexpr int SPG = KG / 32;
    uint32_t sw[C::sw], zw[4];
    int_tail<FMT, KG>((const uint4 *)wsm, g, sw, zw);
    uint2 L[4], H[4]; /* piece p of rows g, g+8: words 2kh (x) and 2kh + 1 (y) */
#pragma unroll
    for (int p = 0; p < 4; p++) {
        L[p] = *(const uint2 *)(wsm + 64 * g + 16 * p + 8 * kh);
        H[p] = *(const uint2 *)(wsm + 512 + 64 * g + 16 * p + 8 * kh);
    }
    nbc_table tab = {};
    if constexpr (C::table) tab = nbc_table_from_stab(stab);
    const uint32_t bsel = (uint32_t)t | (uint32_t)(t + 4) << 4; /* (the table formats) */
#pragma unroll
    for (int qq = 0; qq < 2; qq++) { /* sub-range q = 2kh + qq: tiles 2qq, 2qq + 1 of a */
        const int j = (2 * kh + qq) / SPG;
        if constexpr (C::table) {
            const uint32_t sg = nbc_absmax_pair<ACT>(sw, j), s8 = nbc_absmax_pair<ACT>(sw, C::gpc + j);
#pragma unroll
            for (int h = 0; h < 2; h++)
                nbc_table_tile<ACT>(qq ? L[2 * h].y : L[2 * h].x, qq ? H[2 * h].y : H[2 * h].x,
                                    qq ? L[2 * h + 1].y : L[2 * h + 1].x, qq ? H[2 * h + 1].y : H[2 * h + 1].x, bsel,
                                    tab, sg, s8, a[2 * qq + h]);
        } else {
            constexpr int ZT = C::zt;
            const uint32_t sg = nbc_int_scale_pair<ACT, KG>(sw, j, scale_bf16);
            const uint32_t s8 = nbc_int_scale_pair<ACT, KG>(sw, C::gpc + j, scale_bf16);
            const uint32_t zg = int_zero<ACT, ZT>(zw, j, scale_bf16), z8 = int_zero<ACT, ZT>(zw, C::gpc + j, scale_bf16);
#pragma unroll
            for (int p = 0; p < 4; p++) {
                a[2 * qq + p / 2][2 * (p % 2)] = nbc_int_reg<ACT, ZT>(qq ? L[p].y : L[p].x, 4 * t, zg, sg);
                a[2 * qq + p / 2][2 * (p % 2) + 1] = nbc_int_reg<ACT, ZT>(qq ? H[p].y : H[p].x, 4 * t, z8, s8);
            }
        }
    }
}

/* The A fragments of a chunk for any kind of format: E2M1 (KG = 0, the
 * scale table), a 4-bit integer format or a table format of kernel group
 * KG. */
template <int FMT, int ACT, int KG>
__device__ __forceinline__ void nbc_dequant_any(const uint8_t *wsm, const uint32_t *stab, int g, int t, int scale_bf16,
                                                uint32_t (&a)[8][4]) {
    if constexpr (KG == 0) nbc_dequant_chunk<FMT, ACT>(wsm, stab, g, t, a);
    else if constexpr (nbc_int_chunk<FMT, KG>::i8) nbc_dequant_chunk_i8<FMT, ACT, KG>(wsm, g, t, scale_bf16, a);
    else if constexpr (nbc_is_table<FMT>()) nbc_dequant_chunk_table<FMT, ACT, KG>(wsm, stab, g, t, a);
    else nbc_dequant_chunk_int<FMT, ACT, KG>(wsm, g, t, scale_bf16, a);
}

#endif
