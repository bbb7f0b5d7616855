/* convert.cu - device dequantize, device repack (checkpoint -> packed layout),
 * device facts.  Both kernels are bit-exact twins of src/formats.c: the tests
 * compare their bytes. */
#include "common.cuh"

#ifndef NB_CUDA_ARCHS
#define NB_CUDA_ARCHS "unknown"
#endif

extern "C" int nbi_cuda_available(void) { return 1; }
extern "C" const char *nbi_cuda_archs(void) { return NB_CUDA_ARCHS; }

extern "C" int nbi_cuda_device_count(int *count, char *err) {
    NBC_TRY(cudaGetDeviceCount(count), "cudaGetDeviceCount");
    return 0;
}

extern "C" int nbi_cuda_device_info(int device, nb_device_info *info, char *err) {
    cudaDeviceProp p;
    NBC_TRY(cudaGetDeviceProperties(&p, device), "cudaGetDeviceProperties");
    memset(info, 0, sizeof *info);
    info->device = device;
    snprintf(info->name, sizeof info->name, "%s", p.name);
    info->cc_major = p.major;
    info->cc_minor = p.minor;
    info->sm_count = p.multiProcessorCount;
    info->max_threads_per_sm = p.maxThreadsPerMultiProcessor;
    info->regs_per_sm = p.regsPerMultiprocessor;
    info->l2_bytes = (size_t)p.l2CacheSize;
    info->smem_per_block_optin = p.sharedMemPerBlockOptin;
    info->smem_per_sm = p.sharedMemPerMultiprocessor;
    info->global_mem_bytes = p.totalGlobalMem;
    int v = 0;
    if (cudaDeviceGetAttribute(&v, cudaDevAttrMemoryClockRate, device) == cudaSuccess) info->mem_clock_khz = v;
    if (cudaDeviceGetAttribute(&v, cudaDevAttrGlobalMemoryBusWidth, device) == cudaSuccess)
        info->mem_bus_width_bits = v;
    cudaGetLastError(); /* the attribute queries may be unsupported: not an error */
    return 0;
}

/* One thread per code byte (two elements). */
__global__ void dequant_kernel(int fmt, int64_t n, int64_t k, int group, float ts, const uint8_t *__restrict__ codes,
                               const uint8_t *__restrict__ scales, int dtype, void *__restrict__ dst) {
    int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n * k / 2) return;
    int64_t idx = 2 * i, row = idx / k, col = idx % k;
    uint32_t byte = codes[i];
    float s = nbc_scale(fmt, scales[row * (k / group) + col / group]);
    /* same association as the C reference: (e2m1 * s) * ts */
    nbc_store(dtype, dst, (size_t)idx, (nbc_e2m1(byte & 15) * s) * ts);
    nbc_store(dtype, dst, (size_t)idx + 1, (nbc_e2m1(byte >> 4) * s) * ts);
}

extern "C" int nbi_cuda_dequantize(const nb_weight_desc *d, const uint8_t *codes, const uint8_t *scales,
                                   nb_dtype dst_dtype, void *dst, void *stream, char *err) {
    int64_t bytes = d->n * d->k / 2;
    int64_t blocks = (bytes + 255) / 256;
    if (blocks > 0x7FFFFFFF) return nbc_err(cudaErrorInvalidValue, err, "dequantize: tensor too large for one grid");
    dequant_kernel<<<(unsigned)blocks, 256, 0, (cudaStream_t)stream>>>(d->format, d->n, d->k, d->group_size,
                                                                       d->tensor_scale, codes, scales, (int)dst_dtype,
                                                                       dst);
    NBC_LAUNCHED("dequantize kernel launch");
    return 0;
}

/* One thread per (chunk, lane): writes the lane's 2 x 16 code bytes and its
 * scale bytes exactly as nb_pack_host does (layout: gemv_fp4.cu). */
__global__ void pack_kernel(int64_t n, int64_t k, int group, int chunk_bytes, int64_t kchunks, int64_t total,
                            const uint8_t *__restrict__ codes, const uint8_t *__restrict__ scales,
                            uint8_t *__restrict__ out) {
    int64_t tid = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (tid >= total) return;
    const int lane = (int)(tid & 31);
    const int64_t chunk = tid >> 5, rb = chunk / kchunks, kc = chunk % kchunks;
    const int gi = lane >> 2, ti = lane & 3;
    uint8_t *c = out + chunk * chunk_bytes;
    for (int half = 0; half < 2; half++) {
        const int64_t row = rb * 16 + gi + 8 * half;
        uint32_t words[4];
        for (int w = 0; w < 4; w++) {
            uint32_t word = 0;
            for (int p = 0; p < 8; p++) {
                int e = p < 4 ? 2 * p : 2 * (p - 4) + 1;
                int64_t col = kc * NBI_CHUNK_K + 32 * ti + 8 * w + e;
                uint32_t v = 0;
                if (row < n && col < k) {
                    int64_t idx = row * k + col;
                    v = (codes[idx / 2] >> ((idx & 1) * 4)) & 15u;
                }
                word |= v << (4 * p);
            }
            words[w] = word;
        }
        *(uint4 *)(c + half * 512 + lane * 16) = make_uint4(words[0], words[1], words[2], words[3]);
    }
    const int gpc = NBI_CHUNK_K / group, per = gpc / 4, ng = (int)(k / group);
    uint8_t *s = c + NBI_CHUNK_CODE_BYTES + lane * per * 2;
    for (int half = 0; half < 2; half++)
        for (int q = 0; q < per; q++) {
            const int64_t row = rb * 16 + gi + 8 * half, grp = kc * gpc + ti * per + q;
            s[half * per + q] = (row < n && grp < ng) ? scales[row * ng + grp] : 0;
        }
}

__global__ void exp_range_kernel(const uint8_t *__restrict__ scales, int64_t count, int *range) {
    int lo = 256, hi = -1;
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < count; i += (int64_t)gridDim.x * blockDim.x) {
        int b = scales[i];
        if (b == 0xFF) continue;
        lo = min(lo, b);
        hi = max(hi, b);
    }
    if (hi >= 0) {
        atomicMin(&range[0], lo);
        atomicMax(&range[1], hi);
    }
}

extern "C" int nbi_cuda_pack(const nb_weight_desc *d, const uint8_t *codes, const uint8_t *scales, void *packed,
                             int32_t *emin, int32_t *emax, void *stream, char *err) {
    const nbi_format_traits *t = nbi_traits(d->format);
    const int64_t kchunks = (d->k + NBI_CHUNK_K - 1) / NBI_CHUNK_K, rbs = (d->n + 15) / 16;
    const int64_t total = rbs * kchunks * 32;
    cudaStream_t s = (cudaStream_t)stream;
    pack_kernel<<<(unsigned)((total + 255) / 256), 256, 0, s>>>(d->n, d->k, d->group_size, (int)nbi_chunk_bytes(t),
                                                                 kchunks, total, codes, scales, (uint8_t *)packed);
    NBC_LAUNCHED("pack kernel launch");
    *emin = *emax = -1;
    if (d->format == NB_FORMAT_MXFP4) {
        int *range = NULL, h[2] = {256, -1};
        NBC_TRY(cudaMalloc(&range, 2 * sizeof(int)), "pack: cudaMalloc");
        int rc = 0;
        if ((rc = nbc_err(cudaMemcpyAsync(range, h, sizeof h, cudaMemcpyHostToDevice, s), err, "pack: copy"))) goto out;
        exp_range_kernel<<<256, 256, 0, s>>>(scales, d->n * (d->k / d->group_size), range);
        if ((rc = nbc_err(cudaGetLastError(), err, "pack: range kernel launch"))) goto out;
        if ((rc = nbc_err(cudaMemcpyAsync(h, range, sizeof h, cudaMemcpyDeviceToHost, s), err, "pack: copy back")))
            goto out;
        if ((rc = nbc_err(cudaStreamSynchronize(s), err, "pack: synchronize"))) goto out;
        *emin = h[1] < 0 ? -1 : h[0];
        *emax = h[1];
    out:
        cudaFree(range);
        return rc;
    }
    return 0;
}

/* Naive reference GEMM: one thread per output element, float accumulation in
 * k order, reading the checkpoint layout.  Slow and obviously correct. */
__global__ void gemm_naive_kernel(int fmt, int64_t m, int64_t n, int64_t k, int group, float ts, int act,
                                  int64_t lda, const void *__restrict__ x, const uint8_t *__restrict__ codes,
                                  const uint8_t *__restrict__ scales, int out_dtype, const void *__restrict__ bias,
                                  float *__restrict__ y, int64_t ldc) {
    int64_t row = (int64_t)blockIdx.x * blockDim.x + threadIdx.x, tok = blockIdx.y;
    if (row >= n) return;
    float acc = 0.0f;
    for (int64_t j = 0; j < k; j++) {
        int64_t idx = row * k + j;
        float w = (nbc_e2m1((codes[idx / 2] >> ((idx & 1) * 4)) & 15) *
                   nbc_scale(fmt, scales[row * (k / group) + j / group])) * ts;
        acc += nbc_load(act, x, (size_t)(tok * lda + j)) * w;
    }
    if (bias) acc += nbc_load(out_dtype, bias, (size_t)row);
    y[tok * ldc + row] = acc;
}

extern "C" int nbi_cuda_gemm_naive(const nb_gemm_desc *g, const void *x, const uint8_t *codes, const uint8_t *scales,
                                   const void *bias, float *y, void *stream, char *err) {
    const nb_weight_desc *d = &g->weight;
    int64_t lda = g->lda ? g->lda : d->k, ldc = g->ldc ? g->ldc : d->n;
    for (int64_t m0 = 0; m0 < g->m; m0 += 65535) {
        int64_t mm = g->m - m0 < 65535 ? g->m - m0 : 65535;
        dim3 grid((unsigned)((d->n + 127) / 128), (unsigned)mm);
        gemm_naive_kernel<<<grid, 128, 0, (cudaStream_t)stream>>>(
            d->format, mm, d->n, d->k, d->group_size, d->tensor_scale, g->act_dtype, lda,
            (const char *)x + (size_t)(m0 * lda) * nbi_dtype_size(g->act_dtype), codes, scales, g->out_dtype, bias,
            y + m0 * ldc, ldc);
        NBC_LAUNCHED("reference gemm kernel launch");
    }
    return 0;
}
