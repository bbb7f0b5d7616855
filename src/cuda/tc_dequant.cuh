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
 * k/8), and elements 2i, 2i+1 of a word sit at nibbles i and i+4.  Tile j
 * needs, per row, k = 16j + 2t, +1 (word 2j, nibbles t and t+4) and
 * 16j + 2t + 8, +9 (word 2j+1): shifting a word left by 12 - 4t puts both
 * codes at bits 12..15 and 28..31, where one mask keeps the signs and a
 * shift by 6 (BF16) or 3 (FP16) and a mask place the magnitudes.  The four
 * lanes of a row read the same 16 bytes (a broadcast).  The decoded value
 * times the adjusted block scale (one HMUL2) is exact: gemv_fp4.cu
 * "DEQUANTIZATION".  Scale bytes: NVFP4 group j of rows g / g+8 is byte
 * 4(j/2) + (j&1) / +2 of the 16 bytes at 1024 + 16g; MXFP4 group j/2 is
 * byte 2(j/2) / +1 of the 8 bytes at 1024 + 8g. */
#ifndef NB_TC_DEQUANT_CUH
#define NB_TC_DEQUANT_CUH

#include "common.cuh"

/* One pair of E2M1 codes already at bits 12..15 and 28..31 (the word
 * shifted left by 12 - 4t) as a 16-bit pair with the sign at bit 15 and
 * e1e0m at the low exponent bits: two masks and a shift. */
template <int ACT>
__device__ __forceinline__ uint32_t nbc_decode_pair_hi(uint32_t a) {
    if (ACT == NB_DTYPE_BF16) return (a & 0x80008000u) | ((a >> 6) & 0x01C001C0u);
    return (a & 0x80008000u) | ((a >> 3) & 0x0E000E00u);
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
 * MXFP4: word q/2 of the 8 bytes at 1024 + 8g).  sh = 12 - 4t.  wsm may
 * start 32 bytes per skipped pair of q into the chunk, with a and q
 * counted from there (a kernel that dequantizes half a chunk).  q must be
 * a constant after unrolling. */
template <int FMT, int ACT, int N>
__device__ __forceinline__ void nbc_dequant_tiles(const uint8_t *wsm, const uint32_t *stab, int g, int sh, int q,
                                                  uint32_t w, uint32_t (&a)[N][4]) {
    const uint4 lo = *(const uint4 *)(wsm + 64 * g + 16 * q);
    const uint4 hi = *(const uint4 *)(wsm + 512 + 64 * g + 16 * q);
    const uint32_t wl[4] = {lo.x << sh, lo.y << sh, lo.z << sh, lo.w << sh};
    const uint32_t wh[4] = {hi.x << sh, hi.y << sh, hi.z << sh, hi.w << sh};
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
        a[j][0] = nbc_hmul2_ptx<ACT>(nbc_decode_pair_hi<ACT>(wl[2 * jj]), sg);
        a[j][1] = nbc_hmul2_ptx<ACT>(nbc_decode_pair_hi<ACT>(wh[2 * jj]), sh8);
        a[j][2] = nbc_hmul2_ptx<ACT>(nbc_decode_pair_hi<ACT>(wl[2 * jj + 1]), sg);
        a[j][3] = nbc_hmul2_ptx<ACT>(nbc_decode_pair_hi<ACT>(wh[2 * jj + 1]), sh8);
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
    const int sh = 12 - 4 * t; /* nibbles t, t+4 to bits 12..15, 28..31 */
#pragma unroll
    for (int q = 0; q < 4; q++) /* tiles 2q, 2q+1 */
        nbc_dequant_tiles<FMT, ACT>(wsm, stab, g, sh, q, nbc_fmt<FMT>::group == 16 ? sc[q >> 1][q & 1] : sc[0][q >> 1], a);
}

#endif
