/* gemv_step.cuh - the decode kernels' dequantize-and-multiply step over one
 * packed chunk (the layout at the top of gemv_fp4.cu): shared by the dense
 * decode kernels (gemv_fp4.cu) and the grouped MoE kernels (moe.cu). */
#pragma once
#include "common.cuh"

/* ---------------------------------------------------------- decode step */

/* q shifted left by D (right by -D where D < 0). */
template <int D>
__device__ __forceinline__ uint32_t nbc_shl(uint32_t q) {
    if constexpr (D >= 0) return q << D;
    else return q >> -D;
}

/* Pair I of a packed word (elements 2I, 2I+1 in its low and high halves,
 * internal.h NBI_E2M1_MAG / NBI_E2M1_SIGN, docs/formats.md 8.2) as a 16-bit
 * pair, unscaled: sign to bit 15, e1e0m to bits 8..6 (BF16) or 11..9 (FP16)
 * of each half.  Where the magnitude and the sign move by one shift (BF16
 * pairs 0 and 1) one shift and one mask, pair 0 only the mask; else a shift
 * and a mask each: 11 instructions per word of 8 codes with BF16, 13 with
 * FP16 (one shift shared), against 15 with the nibble order before
 * (NOTES.md, "An E2M1 word layout for fewer decode instructions"). */
template <int ACT, int I>
__device__ __forceinline__ uint32_t decode_pair(uint32_t q) {
    constexpr int DM = (ACT == NB_DTYPE_BF16 ? 6 : 9) - NBI_E2M1_MAG(I), DS = 15 - NBI_E2M1_SIGN(I);
    constexpr uint32_t MM = ACT == NB_DTYPE_BF16 ? 0x01C001C0u : 0x0E000E00u, MS = 0x80008000u;
    if constexpr (DM == DS) return nbc_shl<DM>(q) & (MM | MS);
    else return (nbc_shl<DM>(q) & MM) | (nbc_shl<DS>(q) & MS);
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

/* NVFP4's adjusted scales without the table (sm_89+): two E4M3 bytes to
 * FP16 by the hardware converter (exact; NaN stays NaN, zero and negative
 * scales keep their value), then to the table's values, s * 2^6 in FP16 or
 * s * 2^119 in BF16 (exact: powers of two inside both ranges), each
 * duplicated in both halves.  Four table lookups per lane and chunk, with
 * random bytes, conflict in the shared-memory banks; kernel 1 with this
 * conversion was 1.8-2.3% faster on the Llama-3.1-8B layers at m = 1 and 8
 * (H100, `nibble bench --sequence`, NOTES.md). */
template <int ACT>
__device__ __forceinline__ void e4m3_adjusted(uint32_t two, uint32_t &a, uint32_t &b) {
    uint32_t h2;
    asm("{.reg .b16 t; cvt.u16.u32 t, %1; cvt.rn.f16x2.e4m3x2 %0, t;}" : "=r"(h2) : "r"(two));
    if (ACT == NB_DTYPE_F16) {
        h2 = nbc_hmul2<ACT>(h2, 0x54005400u); /* 2^6 */
    } else {
        const __half2 hv = *reinterpret_cast<const __half2 *>(&h2);
        const float f0 = __low2float(hv) * 0x1p119f, f1 = __high2float(hv) * 0x1p119f;
        const __nv_bfloat162 bv = __floats2bfloat162_rn(f0, f1);
        h2 = *reinterpret_cast<const uint32_t *>(&bv);
    }
    a = __byte_perm(h2, 0, 0x1010);
    b = __byte_perm(h2, 0, 0x3232);
}

/* Whether chunk_scales_act reads the scale table: every E2M1 format but
 * NVFP4 where the GPU converts E4M3 (sm_89+). */
template <int FMT>
__device__ constexpr bool nbc_scales_use_table() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 890
    return nbc_fmt<FMT>::group != 16;
#else
    return true;
#endif
}

/* chunk_scales, NVFP4 through e4m3_adjusted where the GPU converts E4M3. */
template <int FMT, int ACT>
__device__ __forceinline__ void chunk_scales_act(uint32_t S, const uint32_t *stab, uint32_t (&sg)[2],
                                                 uint32_t (&sh)[2]) {
    if constexpr (!nbc_scales_use_table<FMT>()) {
        e4m3_adjusted<ACT>(S & 0xFFFFu, sg[0], sg[1]);
        e4m3_adjusted<ACT>(S >> 16, sh[0], sh[1]);
    } else {
        chunk_scales<FMT>(S, stab, sg, sh);
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


/* A lane's activations for step w of a chunk of its row block: the 16
 * bytes its MMAs take per token tile (E2M1: chunk k 32t + 8w; integer and
 * table formats: 32w + 8t; xp already points at the lane's k, kbase is
 * the chunk's k of step 0).  CHK (only the last chunk of k when k is not a
 * multiple of 128: nbc_walk_chunks) loads zeros for k past the end and
 * for a token row that does not exist; every other chunk loads without a
 * test: its k lie inside the row, and a missing token's pointer is row 0's
 * (its column of the result is never stored). */
template <int MT, bool INT, bool CHK>
__device__ __forceinline__ void chunk_x_step(const __nv_bfloat16 *const (&xp)[MT], const bool (&tok_ok)[MT], int i,
                                             int kbase, int k, int w, uint4 (&xv)[MT]) {
#pragma unroll
    for (int mt = 0; mt < MT; mt++) {
        if (CHK)
            xv[mt] = tok_ok[mt] && kbase + (INT ? 32 : 8) * w < k
                         ? __ldg((const uint4 *)(xp[mt] + i * NBI_CHUNK_K) + (INT ? 4 : 1) * w)
                         : make_uint4(0, 0, 0, 0);
        else
            xv[mt] = __ldg((const uint4 *)(xp[mt] + i * NBI_CHUNK_K) + (INT ? 4 : 1) * w);
    }
}

/* The decode loops' activations of a chunk.  With one token tile (MT = 1:
 * m <= 8, and the MoE decode kernels' routing blocks of 8 slots) chunk_x
 * loads all four steps' before the warp waits for the chunk's weights, so
 * the activations' L1/L2 round trip overlaps that wait instead of
 * following it (H100: m = 8 and MoE batch 1-32 up to 13% faster, MXFP4
 * m = 1 on 4096-wide layers 2.5-6% slower; NOTES.md, "Decode kernels: a
 * chunk's activations before its weights' wait"), and step_x hands them
 * out.  With more tiles chunk_x does nothing and step_x loads each step's
 * after the wait: loaded early there, MoE batch 128 (two tiles) ran 5-7%
 * slower. */
template <int MT, bool INT, bool CHK>
__device__ __forceinline__ void chunk_x(const __nv_bfloat16 *const (&xp)[MT], const bool (&tok_ok)[MT], int i,
                                        int kbase, int k, uint4 (&xv)[4][MT]) {
    if (MT == 1)
#pragma unroll
        for (int w = 0; w < 4; w++) chunk_x_step<MT, INT, CHK>(xp, tok_ok, i, kbase, k, w, xv[w]);
}
template <int MT, bool INT, bool CHK>
__device__ __forceinline__ void step_x(const uint4 (&pre)[4][MT], const __nv_bfloat16 *const (&xp)[MT],
                                       const bool (&tok_ok)[MT], int i, int kbase, int k, int w, uint4 (&xv)[MT]) {
    if (MT == 1) xv[0] = pre[w][0];
    else chunk_x_step<MT, INT, CHK>(xp, tok_ok, i, kbase, k, w, xv);
}

/* A decode warp's walk over its nchunks chunks (the last one k chunk c_end
 * - 1 of kchunks), unrolled by the ring depth STAGES so every slot address
 * is a constant offset: chunk(i, slot, flag) runs chunk i in ring slot
 * `slot`, its activation loads tested when the flag's value is true.
 * UNTESTED: the chunks inside k untested, then a partial last chunk (k not
 * a multiple of 128) tested, after them; else every chunk tested. */
template <int STAGES, bool UNTESTED, typename Chunk>
__device__ __forceinline__ void nbc_walk_chunks(int nchunks, int c_end, int kchunks, int k, const Chunk &chunk) {
    const int nfull =
        UNTESTED ? nchunks - (nchunks > 0 && c_end == kchunks && k % NBI_CHUNK_K != 0 ? 1 : 0) : nchunks;
    for (int i0 = 0; i0 < nfull; i0 += STAGES)
#pragma unroll
        for (int s = 0; s < STAGES; s++) {
            if (i0 + s >= nfull) break;
            chunk(i0 + s, s, nbc_flag<!UNTESTED>{});
        }
    if (UNTESTED && nfull < nchunks) chunk(nfull, nfull % STAGES, nbc_flag<true>{});
}

/* ------------------------------- integer and table formats (kernel 1) */

/* The packed chunk of an integer or table format with kernel group KG
 * (32, 64, 128; docs/formats.md 8.7 - 8.9): 1024 code bytes (2048 for
 * int8's 8-bit codes), then per lane group g the 2 x GPC scales (SB bytes:
 * F16/BF16 2, F32 4) of rows g and g+8, then their 2 x GPC zero points of
 * ZB bytes each (formats with zero points: a byte, or a 16-bit float of the
 * scales' type).  SW: the 32-bit words of a lane group's scales. */
template <int FMT>
constexpr bool nbc_is_table() {
    return nbc_fmt<FMT>::element == NB_ELEMENT_NF4 || nbc_fmt<FMT>::element == NB_ELEMENT_FP4_BNB;
}
template <int FMT, int KG>
struct nbc_int_chunk {
    static constexpr bool table = nbc_is_table<FMT>();
    static_assert((nbc_fmt<FMT>::element == NB_ELEMENT_UINT4 || nbc_fmt<FMT>::element == NB_ELEMENT_INT4 ||
                   nbc_fmt<FMT>::element == NB_ELEMENT_INT8 || table) &&
                      (KG == 32 || KG == 64 || KG == 128),
                  "the group-scaled decode step takes integer or table codes in kernel groups of 32, 64 or 128");
    static_assert(table ? nbc_fmt<FMT>::scale_types == NB_SCALE_BIT(NB_SCALE_F32) : nbc_fmt<FMT>::scale_bytes == 2,
                  "table formats have F32 scales only, integer formats 16-bit ones");
    static constexpr int gpc = NBI_CHUNK_K / KG; /* kernel groups per row of a chunk */
    static constexpr int zt = nbc_fmt<FMT>::zero_point; /* nb_zero_type */
    static constexpr int zp = zt != NB_ZERO_NONE;
    static constexpr int sb = nbc_fmt<FMT>::scale_bytes;
    static constexpr int zb = zt == NB_ZERO_FLOAT ? sb : zp; /* bytes per zero point: 0, 1 or 2 */
    static constexpr int sw = 2 * gpc * sb / 4;
    static constexpr bool i8 = nbc_fmt<FMT>::element_bits == 8;
    static constexpr int code = NBI_CHUNK_ROWS * NBI_CHUNK_K * nbc_fmt<FMT>::element_bits / 8; /* as nbi_code_bytes */
    static constexpr int bytes = code + NBI_CHUNK_ROWS * gpc * (sb + zb);
};

/* Bytes of a packed chunk: an E2M1 format's (KG = 0) or, with kernel group
 * KG, an integer or table format's; and of its codes. */
template <int FMT, int KG>
constexpr int nbc_chunk_bytes() {
    if constexpr (KG > 0) return nbc_int_chunk<FMT, KG>::bytes;
    else return nbc_fmt<FMT>::chunk_bytes;
}
template <int FMT, int KG>
constexpr int nbc_code_bytes() {
    if constexpr (KG > 0) return nbc_int_chunk<FMT, KG>::code;
    else return NBI_CHUNK_CODE_BYTES;
}

/* One lane's cp.async copies of a packed chunk of CB bytes (CODE of them
 * codes) from global src to shared d, as a warp streams a row block: the
 * code pieces at lane offsets 0, 512 (and 1024, 1536 for 8-bit codes), then
 * the first lanes the tail of scales and zero points.  The decode kernel,
 * the MoE decode kernels and the mma.sync kernel fetch their chunks with it. */
template <int CODE, int CB>
__device__ __forceinline__ void nbc_fetch_chunk(uint32_t d, const uint8_t *src, int lane, uint64_t pol) {
    nbc_cp_async16_s(d, src, pol);
    nbc_cp_async16_s(d + 512, src + 512, pol);
    if constexpr (CODE == 2048) {
        nbc_cp_async16_s(d + 1024, src + 1024, pol);
        nbc_cp_async16_s(d + 1536, src + 1536, pol);
    }
    if (lane < (CB - CODE) / 16) nbc_cp_async16_s(d + CODE, src + CODE, pol);
}

/* (a & B) ^ C, or with OR (a & B) | C, in one LOP3: written as one, since
 * the compiler splits the two constants into two (one immediate each). */
template <uint32_t B, uint32_t C>
__device__ __forceinline__ uint32_t nbc_and_xor(uint32_t a) {
    uint32_t d;
    asm("lop3.b32 %0, %1, %2, %3, 0x6A;" : "=r"(d) : "r"(a), "n"(B), "n"(C)); /* (0xF0 & 0xCC) ^ 0xAA */
    return d;
}
template <uint32_t B, uint32_t C>
__device__ __forceinline__ uint32_t nbc_and_or(uint32_t a) {
    uint32_t d;
    asm("lop3.b32 %0, %1, %2, %3, 0xEA;" : "=r"(d) : "r"(a), "n"(B), "n"(C)); /* (0xF0 & 0xCC) | 0xAA */
    return d;
}

/* 2 x 16-bit lanes of bytes 0 and 2 of y (the other bytes are ignored)
 * as the exact signed integers they hold (int8, docs/formats.md 8.9: a
 * word keeps elements e in byte [0,2,1,3][e], so bytes 0, 2 are elements
 * 0, 1 and, shifted by 8, bytes 1, 3 elements 2, 3).  FP16: the byte with
 * its sign bit flipped (q + 128) in the mantissa of 1024 (0x6400: last bit
 * weighs 1) is 1152 + q exactly, less 1152: one LOP3, one HSUB2.  BF16 has
 * 8 significant bits, too few for 1024 + 0..255: the low 7 bits in the
 * mantissa of 128 (0x4300) give 128 + (q & 127), and the sign bit in the
 * same place gives 128 or 256 (0x4380), the weight 128 carries in two's
 * complement plus 128; their difference is q: two LOP3, one HSUB2.  Every
 * value is an integer of at most 8 significant bits: exact. */
template <int ACT>
__device__ __forceinline__ uint32_t i8_pair(uint32_t y) {
    if (ACT == NB_DTYPE_BF16)
        return nbc_hsub2<ACT>(nbc_and_or<0x007F007Fu, 0x43004300u>(y), nbc_and_or<0x00800080u, 0x43004300u>(y));
    return nbc_hsub2<ACT>(nbc_and_xor<0x00FF00FFu, 0x64806480u>(y), 0x64806480u);
}

/* The A fragment of one tile of int8 (elements 0..3 of this lane's k in a
 * word: a_frag's registers) from word ql (row g) and qh (row g+8). */
template <int ACT>
__device__ __forceinline__ void a_frag_i8(uint32_t ql, uint32_t qh, uint32_t (&a)[4]) {
    a[0] = i8_pair<ACT>(ql);
    a[1] = i8_pair<ACT>(qh);
    a[2] = i8_pair<ACT>(ql >> 8);
    a[3] = i8_pair<ACT>(qh >> 8);
}

/* 2 x 16-bit lanes of word q's elements 2I, 2I+1 (nibbles I, I+4) as the
 * exact small integers q - z, in one LOP3 and one HSUB2: the nibble ORed
 * into the mantissa of a magic number M whose last mantissa bit weighs 1
 * (BF16 0x4300 = 128, FP16 0x6400 = 1024) is M + q exactly; subtracting
 * the 16-bit value M + z (zz: two copies) leaves q - z, exact because every
 * value involved is an integer below 2^8 (BF16: 8 significant bits, hence
 * z <= 127, checked by the planner) or 2^11 (FP16).  Two's complement codes
 * (ZT = NB_ZERO_NONE) flip bit 3 in the same LOP3: nibble ^ 8 = q + 8, and
 * zz is M + 8.  Float zero points (NB_ZERO_FLOAT, zz: z in ACT, two copies):
 * a second HSUB2, M + q - M = q exactly, then q - z rounded once to ACT. */
template <int ACT, int I, int ZT>
__device__ __forceinline__ uint32_t int_pair(uint32_t q, uint32_t zz) {
    constexpr uint32_t magic =
        (ACT == NB_DTYPE_BF16 ? 0x43004300u : 0x64006400u) | (ZT == NB_ZERO_NONE ? 0x00080008u : 0u);
    const uint32_t v = nbc_and_xor<0x000F000Fu, magic>(q >> (4 * I));
    if constexpr (ZT == NB_ZERO_FLOAT) return nbc_hsub2<ACT>(nbc_hsub2<ACT>(v, magic), zz);
    return nbc_hsub2<ACT>(v, zz);
}

/* FP16 only: pair I+1 (I even) from the same shifted word as pair I, its
 * nibbles masked in place (0x00F000F0): M + 16 c with M = 1024 (c the
 * nibble, or the nibble ^ 8 for two's complement codes, flipped in the same
 * LOP3), times 1/16 is 64 + c exactly, so one HFMA2 with -(64 + z) leaves
 * c - z exactly (every value an integer below 2^11; FP16 has 11 significant
 * bits).  -(64 + z) is 960 - zz (zz = M + z, int_zero): exact.  Float zero
 * points: 64 + c - 64 = c, then c - z as in int_pair.  Saves the shift of
 * the odd pairs (one shift per word instead of three).  BF16 keeps the
 * shifts: its 7 stored significand bits end at bit 6 (M = 128), so a nibble
 * masked at bits 4-7 would reach into the exponent. */
template <int I, int ZT>
__device__ __forceinline__ uint32_t int_pair_odd_f16(uint32_t q, uint32_t zz) {
    constexpr uint32_t magic = 0x64006400u | (ZT == NB_ZERO_NONE ? 0x00800080u : 0u);
    const uint32_t v = nbc_and_xor<0x00F000F0u, magic>(q >> (4 * I));
    constexpr uint32_t sixteenth = 0x2C002C00u; /* 1/16 */
    if constexpr (ZT == NB_ZERO_FLOAT)
        return nbc_hsub2<NB_DTYPE_F16>(nbc_hfma2_f16(v, sixteenth, 0xD400D400u /* -64 */), zz);
    if constexpr (ZT == NB_ZERO_NONE) return nbc_hfma2_f16(v, sixteenth, 0xD480D480u); /* -72: c - 8 */
    return nbc_hfma2_f16(v, sixteenth, nbc_hsub2<NB_DTYPE_F16>(0x63806380u /* 960 */, zz));
}

/* The A fragment of pairs I and I+1 (I even) of word ql (row g) and qh
 * (row g+8), as a_frag, with the rows' zero-point pairs zg and zh. */
template <int ACT, int I, int ZT>
__device__ __forceinline__ void a_frag_int(uint32_t ql, uint32_t qh, uint32_t zg, uint32_t zh, uint32_t (&a)[4]) {
    static_assert(I % 2 == 0, "pairs I, I + 1 of a word, I even");
    a[0] = int_pair<ACT, I, ZT>(ql, zg);
    a[1] = int_pair<ACT, I, ZT>(qh, zh);
    if constexpr (ACT == NB_DTYPE_F16) {
        a[2] = int_pair_odd_f16<I, ZT>(ql, zg);
        a[3] = int_pair_odd_f16<I, ZT>(qh, zh);
    } else {
        a[2] = int_pair<ACT, I + 1, ZT>(ql, zg);
        a[3] = int_pair<ACT, I + 1, ZT>(qh, zh);
    }
}

/* Lane group g's 2 x GPC 16-bit values (4 x GPC bytes at p) as GPC words of
 * w: the F16/BF16 scales of a chunk's tail, and float zero points, which
 * are laid out the same way after them.  One vector load. */
template <int GPC, int N>
__device__ __forceinline__ void tail_words16(const uint8_t *p, uint32_t (&w)[N]) {
    static_assert(N >= GPC, "GPC words");
    if constexpr (GPC == 4) {
        const uint4 v = *(const uint4 *)p;
        w[0] = v.x, w[1] = v.y, w[2] = v.z, w[3] = v.w;
    } else if constexpr (GPC == 2) {
        const uint2 v = *(const uint2 *)p;
        w[0] = v.x, w[1] = v.y;
    } else {
        w[0] = *(const uint32_t *)p;
    }
}

/* Lane group g's share of a chunk's tail (after the 1024 code bytes): the
 * 2 x GPC scales as 16-bit halves (F32: whole words) of sw (index h * GPC +
 * j: row g + 8h, kernel group j) and the zero points of zw (same index:
 * bytes, or 16-bit halves for float zero points).  One or two vector loads
 * from the chunk's shared-memory slot. */
template <int FMT, int KG>
__device__ __forceinline__ void int_tail(const uint4 *slot, int g, uint32_t (&sw)[nbc_int_chunk<FMT, KG>::sw],
                                         uint32_t (&zw)[4]) {
    constexpr int GPC = nbc_int_chunk<FMT, KG>::gpc;
    const uint8_t *tail = (const uint8_t *)(slot + nbc_int_chunk<FMT, KG>::code / 16);
    if constexpr (nbc_int_chunk<FMT, KG>::sb == 4) { /* F32 scales: 8 x GPC bytes per lane group */
        const uint4 *v = (const uint4 *)(tail + 8 * GPC * g);
        if constexpr (GPC == 1) {
            const uint2 u = *(const uint2 *)v;
            sw[0] = u.x, sw[1] = u.y;
        } else {
#pragma unroll
            for (int i = 0; i < GPC / 2; i++) {
                const uint4 u = v[i];
                sw[4 * i] = u.x, sw[4 * i + 1] = u.y, sw[4 * i + 2] = u.z, sw[4 * i + 3] = u.w;
            }
        }
    } else {
        tail_words16<GPC>(tail + 4 * GPC * g, sw);
    }
    zw[0] = zw[1] = zw[2] = zw[3] = 0;
    if constexpr (nbc_int_chunk<FMT, KG>::zb == 2) { /* float zero points: laid out as the 16-bit scales */
        tail_words16<GPC>(tail + 32 * GPC + 4 * GPC * g, zw);
    } else if (nbc_int_chunk<FMT, KG>::zp) {
        const uint8_t *z = tail + 32 * GPC + 2 * GPC * g;
        if (GPC == 4) {
            const uint2 v = *(const uint2 *)z;
            zw[0] = v.x, zw[1] = v.y;
        } else if (GPC == 2) {
            zw[0] = *(const uint32_t *)z;
        } else {
            zw[0] = *(const uint16_t *)z;
        }
    }
}

/* A 16-bit F16 or BF16 (bf16) value h as FP32 (exact). */
__device__ __forceinline__ float nbc_h16_float(uint32_t h, int bf16) {
    return bf16 ? __uint_as_float(h << 16) : __half2float(__ushort_as_half((unsigned short)h));
}

/* Scale i of sw as FP32 (exact: F16 and BF16 are subsets of FP32). */
template <int KG>
__device__ __forceinline__ float int_scale(const uint32_t (&sw)[NBI_CHUNK_K / KG], int i, int bf16) {
    return nbc_h16_float((sw[i >> 1] >> (16 * (i & 1))) & 0xFFFFu, bf16);
}

/* f rounded to ACT (to nearest even), two copies. */
template <int ACT>
__device__ __forceinline__ uint32_t nbc_act_pair(float f) {
    return (ACT == NB_DTYPE_BF16 ? (uint32_t)__bfloat16_as_ushort(__float2bfloat16_rn(f))
                                 : (uint32_t)__half_as_ushort(__float2half_rn(f))) * 0x10001u;
}

/* Index i of the 16-bit values of w (F16, or BF16 when bf16) as two copies
 * in ACT: the stored bits when that type is ACT's, else rounded to ACT (the
 * integer formats' scales on the tensor-core path, float zero points). */
template <int ACT, int N>
__device__ __forceinline__ uint32_t nbc_h16_pair(const uint32_t (&w)[N], int i, int bf16) {
    const uint32_t h = (w[i >> 1] >> (16 * (i & 1))) & 0xFFFFu;
    if ((ACT == NB_DTYPE_BF16) == (bf16 != 0)) return h * 0x10001u;
    return nbc_act_pair<ACT>(nbc_h16_float(h, bf16));
}

/* ------------------------------------------------ table formats (kernel 1) */

/* The table formats' 16 values as MMA operands (nbi_table_planes, built on
 * the host and passed in the kernel parameters): four byte planes of two
 * words, so that one PRMT looks up one byte of four codes at once.  lo[0..1]
 * hold the low bytes of codes 0..7 (code c in byte c of the pair), lo[2..3]
 * those of codes 8..15; hi[] the high bytes. */
struct nbc_table {
    uint32_t lo[4], hi[4];
};

/* PTX ISA "prmt": byte i of the result is byte sel[4i+2 : 4i] of the 8 bytes
 * {b, a} (a is bytes 0..3), or with sel bit 4i+3 set the sign of that byte
 * replicated: only the low 16 bits of sel count. */
__device__ __forceinline__ uint32_t nbc_prmt(uint32_t a, uint32_t b, uint32_t sel) {
    uint32_t d;
    asm("prmt.b32 %0, %1, %2, %3;" : "=r"(d) : "r"(a), "r"(b), "r"(sel));
    return d;
}

/* Elements 4H .. 4H+3 of word q (the table formats keep k order in a word:
 * element e in nibble e, docs/formats.md 8.8) as two 16-bit pairs p0 =
 * (4H, 4H+1), p1 = (4H+2, 4H+3): the A-fragment registers of one tile.
 * s: the word with bit 3 of every nibble cleared (PRMT's byte selectors,
 * 3 bits each; bit 3 would ask for a sign replication); m: byte i 0xFF
 * where element 4H+i has code bit 3 set (codes 8..15).  Four PRMT read the
 * low and high bytes from the planes of codes 0..7 and 8..15, two LOP3 keep
 * the right plane per byte, two PRMT interleave low and high bytes into
 * 16-bit values: 8 instructions per 4 elements. */
template <int H>
__device__ __forceinline__ void table_quad(uint32_t s, uint32_t m, const nbc_table &tab, uint32_t &p0, uint32_t &p1) {
    const uint32_t sel = H ? s >> 16 : s;
    const uint32_t la = nbc_prmt(tab.lo[0], tab.lo[1], sel), lb = nbc_prmt(tab.lo[2], tab.lo[3], sel);
    const uint32_t ha = nbc_prmt(tab.hi[0], tab.hi[1], sel), hb = nbc_prmt(tab.hi[2], tab.hi[3], sel);
    const uint32_t l = (la & ~m) | (lb & m), h = (ha & ~m) | (hb & m); /* one LOP3 each */
    p0 = nbc_prmt(l, h, 0x5140); /* lo0 hi0 lo1 hi1 */
    p1 = nbc_prmt(l, h, 0x7362); /* lo2 hi2 lo3 hi3 */
}

/* The byte masks of table_quad for elements 4H .. 4H+3 of q: bit 3 of
 * nibble e is the sign bit of byte e/2 of q (e odd) or of q << 4 (e even),
 * and a PRMT with sign replication spreads each to a whole byte. */
template <int H>
__device__ __forceinline__ uint32_t table_mask(uint32_t q, uint32_t q4) {
    return nbc_prmt(q4, q, H ? 0xFBEA : 0xD9C8);
}

/* The A fragments of tiles 2G (elements 0..3 of the words) and 2G+1 (4..7)
 * from word ql (row g) and qh (row g+8): a[0..3] and b[0..3] as a_frag's.
 * 21 instructions per word: 2 x 8 in table_quad, the shared selector (LOP3),
 * its upper half (SHF), q << 4 (SHF) and two mask PRMT. */
__device__ __forceinline__ void a_frag_table(uint32_t ql, uint32_t qh, const nbc_table &tab, uint32_t (&a)[4],
                                             uint32_t (&b)[4]) {
    const uint32_t sl = ql & 0x77777777u, sh = qh & 0x77777777u;
    const uint32_t l4 = ql << 4, h4 = qh << 4;
    table_quad<0>(sl, table_mask<0>(ql, l4), tab, a[0], a[2]);
    table_quad<0>(sh, table_mask<0>(qh, h4), tab, a[1], a[3]);
    table_quad<1>(sl, table_mask<1>(ql, l4), tab, b[0], b[2]);
    table_quad<1>(sh, table_mask<1>(qh, h4), tab, b[1], b[3]);
}

/* Kernel 1's pair table for the table formats (a_frag_lut; 32 KB of
 * static shared memory per CTA): entry v, a byte of codes (elements 2i and
 * 2i+1 in its low and high nibble, docs/formats.md 8.8), is the 32-bit MMA
 * operand pair r(value[v & 15]) | r(value[v >> 4]) << 16, the operand
 * planes' values, so the lookup gives a_frag_table's bits.  Each entry is
 * held once per lane, word 32 v + L for lane L: a warp's 32 lookups read 32
 * banks whatever bytes they name, one shared-memory cycle each. */
#define NBC_TABLE_LUT_WORDS (256 * 32)
#define NBC_TABLE_LUT_BYTES (NBC_TABLE_LUT_WORDS * 4)

/* The 16-bit operand of code c (0..15) from the planes: its low byte from
 * lo[], its high byte from hi[] (byte c & 7 of the pair of words c / 8). */
__device__ __forceinline__ uint32_t table_value(const nbc_table &tab, int c) {
    const bool h = c >= 8; /* (selected, not indexed: the planes stay in registers) */
    const uint32_t sel = (uint32_t)c & 7u;
    return (nbc_prmt(h ? tab.lo[2] : tab.lo[0], h ? tab.lo[3] : tab.lo[1], sel) & 0xFFu) |
           (nbc_prmt(h ? tab.hi[2] : tab.hi[0], h ? tab.hi[3] : tab.hi[1], sel) & 0xFFu) << 8;
}

/* Fill the pair table (NT = 256 threads, each writing 32 words: thread
 * tid's word 256 j + tid is entry v = tid / 32 + 8 j, lane copy tid % 32,
 * so a warp's stores are 32 consecutive words; v & 15 is tid / 32 + 8 (j &
 * 1) and v >> 4 is j / 2). */
template <int NT>
__device__ __forceinline__ void table_lut_fill(uint32_t *lut, const nbc_table &tab, int tid) {
    static_assert(NT == 256, "the pair table's fill assumes 256 threads");
    const int x = tid >> 5;
    const uint32_t lo[2] = {table_value(tab, x), table_value(tab, x + 8)};
#pragma unroll
    for (int j = 0; j < 32; j++) lut[256 * j + tid] = lo[j & 1] | table_value(tab, j >> 1) << 16;
}

/* One pair of the table: the byte of codes at bits 7..14 of s (the rest
 * masked off), plus lb = 4 * lane: (s & 0x7F80) | lb in one LOP3 (written
 * as one: the compiler would mask lb again in a second), then the load. */
__device__ __forceinline__ uint32_t table_pair(const uint32_t *lut, uint32_t s, uint32_t lb) {
    uint32_t off;
    asm("lop3.b32 %0, %1, 0x7F80, %2, 0xEA;" : "=r"(off) : "r"(s), "r"(lb)); /* (a & b) | c */
    return *(const uint32_t *)((const char *)lut + off);
}

/* a_frag_table's a[] and b[] from the pair table: bytes 0, 1 (a[0], a[2])
 * and 2, 3 (b[0], b[2]) of ql (row g), the same of qh (row g + 8); lb =
 * 4 * lane.  12 instructions per word (a shift, a LOP3 that masks the byte
 * and adds the lane's copy, a load per byte), against 21 with PRMT. */
__device__ __forceinline__ void a_frag_lut(uint32_t ql, uint32_t qh, const uint32_t *lut, uint32_t lb, uint32_t (&a)[4],
                                           uint32_t (&b)[4]) {
    a[0] = table_pair(lut, ql << 7, lb);
    a[1] = table_pair(lut, qh << 7, lb);
    a[2] = table_pair(lut, ql >> 1, lb);
    a[3] = table_pair(lut, qh >> 1, lb);
    b[0] = table_pair(lut, ql >> 9, lb);
    b[1] = table_pair(lut, qh >> 9, lb);
    b[2] = table_pair(lut, ql >> 17, lb);
    b[3] = table_pair(lut, qh >> 17, lb);
}

/* Scale i of a table format's sw: the F32 absmax, as stored. */
template <int N>
__device__ __forceinline__ float table_scale(const uint32_t (&sw)[N], int i) {
    return __uint_as_float(sw[i]);
}

/* The zero-point pair of index i for int_pair: M + z twice (U8), M + 8
 * (two's complement codes), or a float zero point z in ACT twice, its
 * stored bits when the scales' type (BF16 when sbf) is ACT's, else rounded
 * to ACT. */
template <int ACT, int ZT>
__device__ __forceinline__ uint32_t int_zero(const uint32_t (&zw)[4], int i, int sbf) {
    if constexpr (ZT == NB_ZERO_FLOAT) return nbc_h16_pair<ACT>(zw, i, sbf);
    const uint32_t m = ACT == NB_DTYPE_BF16 ? 0x4300u : 0x6400u;
    const uint32_t z = ZT == NB_ZERO_NONE ? 8u : (zw[i >> 2] >> (8 * (i & 3))) & 0xFFu;
    return (m | z) * 0x10001u;
}

/* In-CTA split-K of the decode kernels: the kw consecutive warps of a row
 * block each summed a slice of its k range; slices 1..kw-1 hand their
 * accumulators to slice 0 through red (the rings, idle by then), which adds
 * them in slice order.  Every thread of the CTA calls it (two barriers). */
template <int MT>
__device__ __forceinline__ void gemv_kw_reduce(float (&acc)[MT][4], float *red, int warp, int lane, int ks, int kw) {
    __syncthreads();
    if (ks) {
#pragma unroll
        for (int i = 0; i < MT; i++)
#pragma unroll
            for (int j = 0; j < 4; j++) red[((warp * MT + i) * 4 + j) * 32 + lane] = acc[i][j];
    }
    __syncthreads();
    if (!ks) {
        for (int o = 1; o < kw; o++)
#pragma unroll
            for (int i = 0; i < MT; i++)
#pragma unroll
                for (int j = 0; j < 4; j++) acc[i][j] += red[(((warp + o) * MT + i) * 4 + j) * 32 + lane];
    }
}
