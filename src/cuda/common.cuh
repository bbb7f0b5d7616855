/* common.cuh - helpers shared by the kernel files: error reporting, the
 * scalar codecs (identical arithmetic to src/formats.c), cache-hinted loads,
 * cp.async copies, programmatic dependent launch, mma.sync. */
#ifndef NB_COMMON_CUH
#define NB_COMMON_CUH

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include "../internal.h"

/* Record a CUDA failure into err (NB_ERRBUF bytes) and return its code. */
static inline int nbc_err(cudaError_t e, char *err, const char *what) {
    if (e != cudaSuccess && err) snprintf(err, NB_ERRBUF, "%s: %s (%s)", what, cudaGetErrorString(e), cudaGetErrorName(e));
    return (int)e;
}
#define NBC_TRY(call, what)                                  \
    do {                                                     \
        cudaError_t e_ = (call);                             \
        if (e_ != cudaSuccess) return nbc_err(e_, err, what); \
    } while (0)
/* After a launch: configuration errors surface here. */
#define NBC_LAUNCHED(what) NBC_TRY(cudaGetLastError(), what)

/* Launch settings shared by the kernels; `pdl` adds programmatic dependent
 * launch (sm_90+: the kernel's prologue may overlap the previous kernel,
 * whose results it waits for with griddepcontrol.wait). */
static inline cudaLaunchConfig_t nbc_launch_config(dim3 grid, dim3 block, size_t smem, void *stream, int pdl,
                                                   cudaLaunchAttribute *attr) {
    cudaLaunchConfig_t cfg;
    memset(&cfg, 0, sizeof cfg);
    cfg.gridDim = grid;
    cfg.blockDim = block;
    cfg.dynamicSmemBytes = smem;
    cfg.stream = (cudaStream_t)stream;
    attr[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
    attr[0].val.programmaticStreamSerializationAllowed = 1;
    cfg.attrs = attr;
    cfg.numAttrs = pdl ? 1 : 0;
    return cfg;
}

/* The fields every GEMM kernel's parameter block shares (the decode kernels,
 * gemm_sm90, gemm_sm80), filled from the plan on the host. */
#define NBC_SET_GEMM_PARAMS(p, pl, packed, y_, bias_)          \
    do {                                                       \
        (p).w = (const uint8_t *)(packed);                     \
        (p).y = (y_);                                          \
        (p).bias = (bias_);                                    \
        (p).m = (int)(pl)->m;                                  \
        (p).n = (int)(pl)->n;                                  \
        (p).k = (int)(pl)->k;                                  \
        (p).ldc = (pl)->ldc;                                   \
        (p).row_blocks = (int)(pl)->row_blocks;                \
        (p).kchunks = (int)(pl)->kchunks;                      \
        (p).exp_shift = (pl)->exp_shift;                       \
        (p).ts = (pl)->tensor_scale;                           \
        memcpy((p).stab, (pl)->scale_table, sizeof (p).stab);  \
    } while (0)

#define NBC_NAN_BITS 0x7FC00000u

__device__ __forceinline__ float nbc_e2m1(uint32_t c) {
    /* 0 .5 1 1.5 2 3 4 6: e = bits 2..1, m = bit 0; subnormal (e = 0) is m/2 */
    int e = (c >> 1) & 3, m = c & 1;
    float v = e == 0 ? 0.5f * (float)m : ldexpf(1.0f + 0.5f * (float)m, e - 1);
    return (c & 8) ? -v : v;
}

__device__ __forceinline__ float nbc_e4m3(uint32_t b) {
    int e = (b >> 3) & 15, m = b & 7;
    if (e == 15 && m == 7) return __int_as_float(NBC_NAN_BITS);
    float v = e == 0 ? ldexpf((float)m, -9) : ldexpf(1.0f + (float)m / 8.0f, e - 7);
    return (b & 0x80) ? -v : v;
}

__device__ __forceinline__ float nbc_e8m0(uint32_t b) {
    return b == 0xFF ? __int_as_float(NBC_NAN_BITS) : ldexpf(1.0f, (int)b - 127);
}

__device__ __forceinline__ float nbc_scale(int fmt, uint32_t b) {
    return fmt == NB_FORMAT_NVFP4 ? nbc_e4m3(b) : nbc_e8m0(b);
}

/* Store a float as dtype with the same rounding as the C reference (RNE) and
 * a canonical NaN. */
__device__ __forceinline__ void nbc_store(int dtype, void *p, size_t i, float v) {
    if (dtype == NB_DTYPE_F32) {
        ((float *)p)[i] = isnan(v) ? __int_as_float(NBC_NAN_BITS) : v;
    } else if (dtype == NB_DTYPE_BF16) {
        ((__nv_bfloat16 *)p)[i] = isnan(v) ? __ushort_as_bfloat16(0x7FC0) : __float2bfloat16_rn(v);
    } else {
        ((__half *)p)[i] = isnan(v) ? __ushort_as_half(0x7E00) : __float2half_rn(v);
    }
}

__device__ __forceinline__ float nbc_load(int dtype, const void *p, size_t i) {
    if (dtype == NB_DTYPE_F32) return ((const float *)p)[i];
    if (dtype == NB_DTYPE_BF16) return __bfloat162float(((const __nv_bfloat16 *)p)[i]);
    return __half2float(((const __half *)p)[i]);
}

/* An L2 policy that evicts streamed weights first: they are read once, while
 * activations and partial sums should stay in L2. */
__device__ __forceinline__ uint64_t nbc_policy_evict_first() {
    uint64_t p;
    asm("createpolicy.fractional.L2::evict_first.b64 %0, 1.0;" : "=l"(p));
    return p;
}

/* Two 16-bit products in one instruction (HMUL2): a dequantized weight pair
 * times its adjusted block scale, BF16 or FP16 (ACT is the nb_dtype). */
template <int ACT>
__device__ __forceinline__ uint32_t nbc_hmul2(uint32_t a, uint32_t b) {
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

/* ------------------------------------------------ PTX shared by the kernels */

__device__ __forceinline__ uint32_t nbc_smem_u32(const void *p) { return (uint32_t)__cvta_generic_to_shared(p); }

/* Programmatic dependent launch (sm_90): wait until the previous grid in
 * the stream has finished and its writes are visible; let the next grid
 * start its prologue early.  No-ops before sm_90 (the host launches without
 * the attribute there). */
__device__ __forceinline__ void nbc_grid_dependency_wait() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    asm volatile("griddepcontrol.wait;" ::: "memory");
#endif
}
__device__ __forceinline__ void nbc_grid_dependents_launch() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
#endif
}

/* 16-byte global -> shared copy (sa: shared address); src_size 0 writes
 * zeros and reads nothing (k past the end). */
__device__ __forceinline__ void nbc_cp_async16_zfill(uint32_t sa, const void *gmem, bool in) {
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;" ::"r"(sa), "l"(gmem), "r"(in ? 16 : 0));
}

/* 16-byte global -> shared copy that bypasses registers, with an L2 policy;
 * a 32-bit shared-memory address (callers keep one base register and add
 * constant offsets). */
__device__ __forceinline__ void nbc_cp_async16_s(uint32_t sa, const void *gmem, uint64_t pol) {
    asm volatile("cp.async.cg.shared.global.L2::cache_hint [%0], [%1], 16, %2;" ::"r"(sa), "l"(gmem), "l"(pol));
}
__device__ __forceinline__ void nbc_cp_async_commit() { asm volatile("cp.async.commit_group;" ::: "memory"); }
template <int N>
__device__ __forceinline__ void nbc_cp_async_wait() { asm volatile("cp.async.wait_group %0;" ::"n"(N) : "memory"); }

/* D += A . B, m16n8k16, FP32 accumulate, A row-major (16 x 16), B
 * column-major (16 x 8) (PTX ISA "Matrix Fragments for mma.m16n8k16":
 * a0..a3 rows g/g+8, k-slots 2t..2t+1 and 2t+8..2t+9; b0, b1 column g,
 * k-slots 2t..2t+1 and 2t+8..2t+9; d0, d1 row g, columns 2t, 2t+1; d2, d3
 * row g+8). */
template <int ACT>
__device__ __forceinline__ void nbc_mma16816(float (&d)[4], uint32_t a0, uint32_t a1, uint32_t a2, uint32_t a3,
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

#endif
