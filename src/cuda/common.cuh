/* common.cuh - helpers shared by the kernel files: error reporting, the
 * scalar codecs (identical arithmetic to src/formats.c), cache-hinted loads. */
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

#endif
