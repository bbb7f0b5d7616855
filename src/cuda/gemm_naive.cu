/* gemm_naive.cu - nb_gemm_reference_device: the naive reference GEMM, one
 * thread per output element, float accumulation in k order, reading the
 * checkpoint layout.  Slow and obviously correct: the yardstick of the GPU
 * tests for shapes too large for the host reference. */
#include "common.cuh"

__global__ void gemm_naive_kernel(int st, int64_t m, int64_t n, int64_t k, int group, float ts, int act,
                                  int64_t lda, const void *__restrict__ x, const uint8_t *__restrict__ codes,
                                  const uint8_t *__restrict__ scales, int out_dtype, const void *__restrict__ bias,
                                  float *__restrict__ y, int64_t ldc) {
    int64_t row = (int64_t)blockIdx.x * blockDim.x + threadIdx.x, tok = blockIdx.y;
    if (row >= n) return;
    float acc = 0.0f;
    for (int64_t j = 0; j < k; j++) {
        int64_t idx = row * k + j;
        float w = (nbc_e2m1((codes[idx / 2] >> ((idx & 1) * 4)) & 15) *
                   nbc_scale(st, scales[row * (k / group) + j / group])) * ts;
        acc += nbc_load(act, x, (size_t)(tok * lda + j)) * w;
    }
    if (bias) acc += nbc_load(out_dtype, bias, (size_t)row);
    y[tok * ldc + row] = acc;
}

extern "C" nb_status nbi_cuda_gemm_naive(nb_context *ctx, const nb_gemm_desc *g, const void *x, const uint8_t *codes,
                                         const uint8_t *scales, const void *bias, float *y, void *stream) {
    const nb_weight_desc *d = &g->weight;
    int64_t lda = g->lda ? g->lda : d->k, ldc = g->ldc ? g->ldc : d->n;
    for (int64_t m0 = 0; m0 < g->m; m0 += 65535) {
        int64_t mm = g->m - m0 < 65535 ? g->m - m0 : 65535;
        dim3 grid((unsigned)((d->n + 127) / 128), (unsigned)mm);
        gemm_naive_kernel<<<grid, 128, 0, (cudaStream_t)stream>>>(
            d->scale_type, mm, d->n, d->k, d->group_size, d->tensor_scale, g->act_dtype, lda,
            (const char *)x + (size_t)(m0 * lda) * nbi_dtype_size(g->act_dtype), codes, scales, g->out_dtype, bias,
            y + m0 * ldc, ldc);
        NBC_LAUNCHED("reference gemm kernel launch");
    }
    return NB_OK;
}
