/* gemv_step.cuh - the decode kernels' dequantize-and-multiply step over one
 * packed chunk (the layout at the top of gemv_fp4.cu): shared by the dense
 * decode kernels (gemv_fp4.cu) and the grouped MoE kernels (moe.cu). */
#pragma once
#include "common.cuh"

/* ---------------------------------------------------------- decode step */

/* Elements 2i, 2i+1 of a packed word as a 16-bit pair, unscaled: sign to
 * bit 15, e1e0m to bits 8..6 (BF16) or 11..9 (FP16) of each half. */
template <int ACT, int I>
__device__ __forceinline__ uint32_t decode_pair(uint32_t q) {
    const uint32_t t = q >> (4 * I);
    if (ACT == NB_DTYPE_BF16) return ((t << 12) & 0x80008000u) | ((t << 6) & 0x01C001C0u);
    return ((t << 12) & 0x80008000u) | ((t << 9) & 0x0E000E00u);
}

/* Adjusted scales of a lane's share of a chunk: rows g (sg) and g+8 (sh),
 * for its first and second 16 k. */
template <int FMT>
__device__ __forceinline__ void chunk_scales(uint32_t S, const uint32_t *stab, uint32_t (&sg)[2], uint32_t (&sh)[2]) {
    if (nbc_fmt<FMT>::group == 16) { /* two groups per 16 k: a byte each, rows g then g+8 */
        sg[0] = stab[S & 0xFF];
        sg[1] = stab[(S >> 8) & 0xFF];
        sh[0] = stab[(S >> 16) & 0xFF];
        sh[1] = stab[S >> 24];
    } else { /* groups of 32: one byte per row */
        sg[0] = sg[1] = stab[S & 0xFF];
        sh[0] = sh[1] = stab[(S >> 8) & 0xFF];
    }
}

/* The A fragment (PTX ISA, mma.m16n8k16 fragments: a0..a3 = rows g, g+8
 * at k-slots 2t..2t+1, then 2t+8..2t+9) built from pairs I and I+1 of word
 * ql (row g) and qh (row g+8). */
template <int ACT, int I>
__device__ __forceinline__ void a_frag(uint32_t ql, uint32_t qh, uint32_t sg, uint32_t sh, uint32_t (&a)[4]) {
    a[0] = nbc_hmul2<ACT>(decode_pair<ACT, I>(ql), sg);
    a[1] = nbc_hmul2<ACT>(decode_pair<ACT, I>(qh), sh);
    a[2] = nbc_hmul2<ACT>(decode_pair<ACT, I + 1>(ql), sg);
    a[3] = nbc_hmul2<ACT>(decode_pair<ACT, I + 1>(qh), sh);
}

__device__ __forceinline__ uint32_t word(const uint4 &v, int w) { return w == 0 ? v.x : w == 1 ? v.y : w == 2 ? v.z : v.w; }

