/* dequant.cu - nb_dequantize on the device: checkpoint codes and scales to
 * F32/F16/BF16, bit for bit the values of nb_dequantize_host (src/formats.c;
 * tests/test_gpu.c compares the bytes). */
#include "common.cuh"

/* One thread per code byte (two elements); st is the nb_scale_type. */
__global__ void dequant_kernel(int st, int64_t n, int64_t k, int group, float ts, const uint8_t *__restrict__ codes,
                               const uint8_t *__restrict__ scales, int dtype, void *__restrict__ dst) {
    int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n * k / 2) return;
    int64_t idx = 2 * i, row = idx / k, col = idx % k;
    uint32_t byte = codes[i];
    float s = nbc_scale(st, scales[row * (k / group) + col / group]);
    /* same association as the C reference: (e2m1 * s) * ts */
    nbc_store(dtype, dst, (size_t)idx, (nbc_e2m1(byte & 15) * s) * ts);
    nbc_store(dtype, dst, (size_t)idx + 1, (nbc_e2m1(byte >> 4) * s) * ts);
}

extern "C" nb_status nbi_cuda_dequantize(nb_context *ctx, const nb_weight_desc *d, const uint8_t *codes,
                                         const uint8_t *scales, nb_dtype dst_dtype, void *dst, void *stream) {
    /* the kernel decodes two 4-bit E2M1 codes per byte (the formats with kernels, NBI_KERNEL_FORMATS) */
    int64_t bytes = d->n * d->k / 2;
    int64_t blocks = (bytes + 255) / 256;
    if (blocks > 0x7FFFFFFF)
        return nbi_fail(ctx, NB_ERR_BAD_SHAPE, "dequantize: %lld code bytes are too many for one grid", (long long)bytes);
    dequant_kernel<<<(unsigned)blocks, 256, 0, (cudaStream_t)stream>>>(d->scale_type, d->n, d->k, d->group_size,
                                                                       d->tensor_scale, codes, scales, (int)dst_dtype,
                                                                       dst);
    NBC_LAUNCHED("dequantize kernel launch");
    return NB_OK;
}
