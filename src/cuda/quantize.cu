/* quantize.cu - device quantization into the checkpoint layout, the twin of
 * nb_quantize_host (src/formats.c), byte for byte.
 *
 * Two kernels:
 *   quantize_scan_kernel   over all n*k elements: the absolute maximum (an
 *                          atomicMax on the bits of non-negative floats, which
 *                          order like unsigned integers, so the result does
 *                          not depend on the order) and the smallest index of
 *                          a non-finite element (atomicMin).  The launcher
 *                          reads both back and synchronizes: the status and
 *                          the tensor scale are decided on the host by the
 *                          same C code as nb_quantize_host.
 *   quantize_block_kernel  one thread per block of 16 (NVFP4) or 32 (MXFP4)
 *                          elements (the format is a template parameter): block amax, scale byte, 8 or 16 code
 *                          bytes.  Blocks never share a code byte (k is a
 *                          multiple of the group, the group is even).
 *
 * Exactness.  Every float operation of the host reference is repeated here
 * with the same operands in the same order, each rounded once: __fdiv_rn and
 * __fmul_rn name the IEEE operations explicitly, so nvcc cannot contract or
 * approximate them.  The host's frexpf/ldexpf/rintf steps are exact
 * power-of-two scalings and an exact binade exponent, written here with
 * integer bit operations that give the same values (subnormals included, so
 * this file must not be compiled with -ftz=true or --use_fast_math).  The
 * loads are exact conversions (BF16, F16 -> float).
 *
 * Bounds: both kernels walk their index range with grid-stride loops over
 * int64 counts, so any n*k accepted by nbi_check_desc is covered by a capped
 * grid and no thread reads or writes past n*k elements, n*k/2 code bytes or
 * n*k/group scale bytes.
 *
 * Test: tests/test_gpu_quantize.c (device vs nb_quantize_host on every format,
 * rule and dtype; also under compute-sanitizer).  Time: `nibble quantize
 * --device gpu` on a checkpoint (the kernels are a small part of a load). */
#include "common.cuh"

#ifdef __USE_FAST_MATH__
#error "quantize.cu must keep IEEE division and denormals (no --use_fast_math)"
#endif

/* floor(log2(a)) of a finite a > 0, exactly (the host: frexpf(a, &e), e - 1). */
__device__ __forceinline__ int nbq_floor_log2(float a) {
    const uint32_t u = __float_as_uint(a);
    const int e = (int)(u >> 23);
    if (e) return e - 127;
    return (31 - __clz((int)(u & 0x7FFFFFu))) - 149; /* subnormal: m * 2^-149 */
}

/* 2^e for e in [-126, 127] (a normal float, exact). */
__device__ __forceinline__ float nbq_pow2(int e) { return __uint_as_float((uint32_t)(e + 127) << 23); }

/* nbi_to_e2m1: E2M1 round to nearest even with saturation; sign from x < 0. */
__device__ __forceinline__ uint32_t nbq_to_e2m1(float x) {
    if (isnan(x)) return 7;
    const float a = fabsf(x);
    uint32_t c;
    if (a <= 0.25f) c = 0;
    else if (a < 0.75f) c = 1;
    else if (a <= 1.25f) c = 2;
    else if (a < 1.75f) c = 3;
    else if (a <= 2.5f) c = 4;
    else if (a < 3.5f) c = 5;
    else if (a <= 5.0f) c = 6;
    else c = 7;
    return c | (x < 0.0f ? 8u : 0u);
}

/* nbi_to_e4m3: E4M3FN round to nearest even, saturating to +-448, NaN 0x7F. */
__device__ __forceinline__ uint32_t nbq_to_e4m3(float x) {
    if (isnan(x)) return 0x7F;
    const uint32_t sign = signbit(x) ? 0x80u : 0u;
    const float a = fabsf(x);
    if (a >= 448.0f) return sign | 0x7E;
    if (a == 0.0f) return sign; /* the host rounds 0 to r == 0: the same byte */
    int be = nbq_floor_log2(a);
    if (be < -6) be = -6;
    const float q = nbq_pow2(be - 3);            /* quantum of a's binade: 2^-9 .. 2^5 */
    const float r = __fmul_rn(rintf(__fdiv_rn(a, q)), q); /* a/q exact, rintf RNE */
    if (r >= 448.0f) return sign | 0x7E;
    if (r == 0.0f) return sign;
    const int rbe = nbq_floor_log2(r);
    if (rbe < -6) return sign | (uint32_t)(int)__fmul_rn(r, 512.0f); /* subnormal: r = m * 2^-9 */
    const int m = (int)__fmul_rn(__fmul_rn(r, nbq_pow2(-rbe)), 8.0f) - 8; /* r = (1 + m/8) 2^rbe */
    return sign | (uint32_t)(((rbe + 7) << 3) | m);
}

/* mx_scale_byte of formats.c: the MXFP4 block exponent for each rule. */
__device__ __forceinline__ uint32_t nbq_mx_scale_byte(float amax, int rule) {
    int e;
    if (rule == NB_MX_SCALE_ROUND_UP) {
        const uint32_t b = (__float_as_uint(__fdiv_rn(amax, 6.0f)) + 0x7FFFFFu) & 0x7F800000u;
        return b >> 23 > 254 ? 254 : b >> 23;
    }
    if (rule == NB_MX_SCALE_EVEN) {
        const uint32_t b = (__float_as_uint(amax) + (1u << 21)) & 0x7F800000u;
        if (b == 0) return 0;
        e = (int)(b >> 23) - 127 - 2;
    } else {
        if (amax == 0.0f) return 0;
        e = nbq_floor_log2(amax) - 2;
    }
    e = e < -127 ? -127 : e > 127 ? 127 : e;
    return (uint32_t)(e + 127);
}

struct nbq_scan_result {
    unsigned int amax_bits;     /* bits of the largest |v| (non-negative floats order as integers) */
    unsigned int pad;
    unsigned long long first_bad; /* smallest index of a non-finite element, ~0 when none */
};

__global__ void quantize_scan_kernel(int dtype, const void *__restrict__ src, int64_t count,
                                     nbq_scan_result *__restrict__ out) {
    unsigned int amax = 0;
    unsigned long long bad = ~0ull;
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < count; i += (int64_t)gridDim.x * blockDim.x) {
        const float v = nbc_load(dtype, src, (size_t)i);
        if (!isfinite(v)) {
            bad = (unsigned long long)i; /* the first one this thread sees is its smallest */
            break;
        }
        amax = max(amax, __float_as_uint(fabsf(v)));
    }
    /* warp reduction, then one atomic per warp */
    amax = __reduce_max_sync(0xFFFFFFFFu, amax);
    for (int o = 16; o; o >>= 1) bad = min(bad, __shfl_xor_sync(0xFFFFFFFFu, bad, o));
    if ((threadIdx.x & 31) == 0) {
        atomicMax(&out->amax_bits, amax);
        if (bad != ~0ull) atomicMin(&out->first_bad, bad);
    }
}

/* FMT: a format of NBI_KERNEL_FORMATS: E2M1 codes in blocks of G with E4M3
 * scales and a tensor scale (NVFP4) or E8M0 scales (MXFP4). */
template <int FMT>
__global__ void quantize_block_kernel(int rule, int dtype, float ts, const void *__restrict__ src, int64_t blocks,
                                      uint8_t *__restrict__ codes, uint8_t *__restrict__ scales) {
    NBC_CHECK_KERNEL_FORMAT(FMT);
    constexpr int G = nbc_fmt<FMT>::group;
    for (int64_t blk = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; blk < blocks;
         blk += (int64_t)gridDim.x * blockDim.x) {
        /* block blk holds elements blk*G .. blk*G+G-1 of the row-major matrix
         * (k is a multiple of G, so a block never crosses a row) */
        const int64_t base = blk * G;
        float v[G];
        float bmax = 0.0f;
#pragma unroll
        for (int j = 0; j < G; j++) {
            v[j] = nbc_load(dtype, src, (size_t)(base + j));
            if (fabsf(v[j]) > bmax) bmax = fabsf(v[j]);
        }
        uint32_t sb;
        float denom;
        if (nbc_fmt<FMT>::scale_type == NB_SCALE_E4M3) {
            /* s = block_amax / (6 * ts); 0 -> 1; clamp [2^-9, 448]; E4M3 RNE */
            float s = ts > 0.0f ? __fdiv_rn(bmax, __fmul_rn(6.0f, ts)) : 1.0f;
            if (s == 0.0f) s = 1.0f;
            if (s < 0x1p-9f) s = 0x1p-9f;
            if (s > 448.0f) s = 448.0f;
            sb = nbq_to_e4m3(s);
            denom = __fmul_rn(nbc_e4m3(sb), ts);
        } else {
            sb = nbq_mx_scale_byte(bmax, rule);
            denom = nbc_e8m0(sb);
        }
        scales[blk] = (uint8_t)sb;
        uint8_t *c = codes + base / 2;
#pragma unroll
        for (int j = 0; j < G; j += 2) {
            const uint32_t lo = denom > 0.0f ? nbq_to_e2m1(__fdiv_rn(v[j], denom)) : 0;
            const uint32_t hi = denom > 0.0f ? nbq_to_e2m1(__fdiv_rn(v[j + 1], denom)) : 0;
            c[j / 2] = (uint8_t)(lo | hi << 4); /* low nibble = even element */
        }
    }
}

/* A grid for a grid-stride loop over `count` items: at most 2^16 CTAs of 256. */
static unsigned grid_for(int64_t count) {
    const int64_t ctas = (count + 255) / 256;
    return (unsigned)(ctas < 1 ? 1 : ctas > 65536 ? 65536 : ctas);
}

extern "C" nb_status nbi_cuda_quantize_scan(nb_context *ctx, const nb_weight_desc *d, nb_dtype src_dtype,
                                            const void *src, int64_t *bad, float *amax, void *stream) {
    cudaStream_t s = (cudaStream_t)stream;
    nbq_scan_result h = {0u, 0u, ~0ull}, *dev = NULL;
    NBC_TRY(cudaMalloc((void **)&dev, sizeof h), "quantize: cudaMalloc");
    nb_status st = NB_OK;
    cudaError_t e = cudaMemcpyAsync(dev, &h, sizeof h, cudaMemcpyHostToDevice, s);
    if (e != cudaSuccess) {
        st = nbc_fail(ctx, e, "quantize: copy");
    } else {
        quantize_scan_kernel<<<grid_for(d->n * d->k), 256, 0, s>>>((int)src_dtype, src, d->n * d->k, dev);
        if ((e = cudaGetLastError()) != cudaSuccess) st = nbc_fail(ctx, e, "quantize: scan kernel launch");
        else if ((e = cudaMemcpyAsync(&h, dev, sizeof h, cudaMemcpyDeviceToHost, s)) != cudaSuccess)
            st = nbc_fail(ctx, e, "quantize: copy back");
        else if ((e = cudaStreamSynchronize(s)) != cudaSuccess) st = nbc_fail(ctx, e, "quantize: synchronize");
    }
    if (st == NB_OK) {
        *bad = h.first_bad == ~0ull ? -1 : (int64_t)h.first_bad;
        memcpy(amax, &h.amax_bits, 4);
    }
    cudaFree(dev);
    return st;
}

extern "C" nb_status nbi_cuda_quantize(nb_context *ctx, const nb_weight_desc *d, nb_dtype src_dtype, const void *src,
                                       uint8_t *codes, uint8_t *scales, void *stream) {
    const int64_t blocks = d->n * (d->k / d->group_size);
    cudaStream_t s = (cudaStream_t)stream;
#define QUANTIZE_RUNG(F)                                                                                          \
    quantize_block_kernel<F><<<grid_for(blocks), 256, 0, s>>>((int)d->scale_rule, (int)src_dtype, d->tensor_scale, \
                                                              src, blocks, codes, scales);                         \
    NBC_LAUNCHED("quantize: block kernel launch");                                                                \
    return NB_OK;
    NBC_FORMAT_LADDER(d->format, QUANTIZE_RUNG)
#undef QUANTIZE_RUNG
    return nbi_fail(ctx, NB_ERR_UNSUPPORTED, "quantize: no device quantizer for %s", nbi_traits(d->format)->name);
}
