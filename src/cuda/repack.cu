/* repack.cu - nb_pack on the device: checkpoint codes and scales into the
 * packed layout the GEMM kernels read (docs/formats.md section 8, the
 * comment at the top of gemv_fp4.cu), byte for byte what nb_pack_host
 * (src/formats.c, the specification) writes; tests/test_gpu.c compares the
 * bytes.  For E8M0 scales it also finds the smallest and largest scale byte,
 * from which the GEMM kernels choose an exact exponent offset; for zero
 * points, their range (BF16 activations need them below 128). */
#include "common.cuh"

/* A lane's 2 x 16 code bytes of chunk (rb, kc) at c: word w of row g
 * (bytes 16 lane..) and row g+8 (512 + 16 lane..) holds k = 32t + 8w ..
 * +7 (E2M1: element e's bits where NBI_E2M1_PUT puts them) or 32w + 8t ..
 * +7 (int_order: the integer and table formats, element e in nibble
 * [0,4,1,5,2,6,3,7][e]; plain: in nibble e, the table formats). */
__device__ __forceinline__ void pack_lane_codes(int64_t n, int64_t k, int64_t rb, int64_t kc, int lane,
                                                const uint8_t *__restrict__ codes, uint8_t *c, bool int_order,
                                                bool plain = false) {
    const int gi = lane >> 2, ti = lane & 3;
    for (int half = 0; half < 2; half++) {
        const int64_t row = rb * 16 + gi + 8 * half;
        uint32_t words[4];
        for (int w = 0; w < 4; w++) {
            uint32_t word = 0;
            for (int p = 0; p < 8; p++) {
                int e = plain || !int_order ? p : p < 4 ? 2 * p : 2 * (p - 4) + 1;
                int64_t col = kc * NBI_CHUNK_K + (int_order ? 32 * w + 8 * ti : 32 * ti + 8 * w) + e;
                uint32_t v = 0;
                if (row < n && col < k) {
                    int64_t idx = row * k + col;
                    v = (codes[idx / 2] >> ((idx & 1) * 4)) & 15u;
                }
                word |= int_order ? v << (4 * p) : NBI_E2M1_PUT(p, v);
            }
            words[w] = word;
        }
        *(uint4 *)(c + half * 512 + lane * 16) = make_uint4(words[0], words[1], words[2], words[3]);
    }
}

/* A lane's 4 x 16 bytes of 8-bit codes (int8, docs/formats.md 8.9) of
 * chunk (rb, kc) at c: row half h and piece P at 1024 h + 512 P + 16 lane,
 * word w holding elements e = 4 (w / 2) .. +3 of k = 32 G + 8 t + e, G = 2P
 * + w % 2, element e in byte [0, 2, 1, 3][e % 4]. */
__device__ __forceinline__ void pack_lane_bytes(int64_t n, int64_t k, int64_t rb, int64_t kc, int lane,
                                                const uint8_t *__restrict__ codes, uint8_t *c) {
    const int gi = lane >> 2, ti = lane & 3;
    for (int h = 0; h < 2; h++) {
        const int64_t row = rb * 16 + gi + 8 * h;
        for (int P = 0; P < 2; P++) {
            uint32_t words[4];
            for (int w = 0; w < 4; w++) {
                uint32_t word = 0;
                for (int e4 = 0; e4 < 4; e4++) {
                    const int64_t col = kc * NBI_CHUNK_K + 32 * (2 * P + w % 2) + 8 * ti + 4 * (w / 2) + e4;
                    const uint32_t v = row < n && col < k ? codes[row * k + col] : 0u;
                    word |= v << (8 * (e4 == 1 ? 2 : e4 == 2 ? 1 : e4));
                }
                words[w] = word;
            }
            *(uint4 *)(c + 1024 * h + 512 * P + lane * 16) = make_uint4(words[0], words[1], words[2], words[3]);
        }
    }
}

/* One thread per (chunk, lane): writes the lane's 2 x 16 code bytes and its
 * scale bytes exactly as nb_pack_host does. */
__global__ void pack_kernel(int64_t n, int64_t k, int group, int chunk_bytes, int64_t kchunks, int64_t total,
                            const uint8_t *__restrict__ codes, const uint8_t *__restrict__ scales,
                            uint8_t *__restrict__ out) {
    int64_t tid = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (tid >= total) return;
    const int lane = (int)(tid & 31);
    const int64_t chunk = tid >> 5, rb = chunk / kchunks, kc = chunk % kchunks;
    const int gi = lane >> 2, ti = lane & 3;
    uint8_t *c = out + chunk * chunk_bytes;
    pack_lane_codes(n, k, rb, kc, lane, codes, c, false);
    const int gpc = NBI_CHUNK_K / group, per = gpc / 4, ng = (int)(k / group);
    uint8_t *s = c + NBI_CHUNK_CODE_BYTES + lane * per * 2;
    for (int half = 0; half < 2; half++)
        for (int q = 0; q < per; q++) {
            const int64_t row = rb * 16 + gi + 8 * half, grp = kc * gpc + ti * per + q;
            s[half * per + q] = (row < n && grp < ng) ? scales[row * ng + grp] : 0;
        }
}

/* The range of bytes other than `skip` (E8M0 scales: 0xFF, NaN; zero
 * points: -1, none). */
__global__ void exp_range_kernel(const uint8_t *__restrict__ scales, int64_t count, int skip, int *range) {
    int lo = 256, hi = -1;
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < count; i += (int64_t)gridDim.x * blockDim.x) {
        int b = scales[i];
        if (b == skip) continue;
        lo = min(lo, b);
        hi = max(hi, b);
    }
    if (hi >= 0) {
        atomicMin(&range[0], lo);
        atomicMax(&range[1], hi);
    }
}

/* The E8M0 scale-byte range (skip 0xFF) or the zero-point range (skip
 * -1), read back (so the call synchronizes). */
static nb_status exp_range(nb_context *ctx, const nb_weight_desc *d, const uint8_t *scales, int skip, int32_t *emin,
                           int32_t *emax, cudaStream_t s) {
    int *range = NULL, h[2] = {256, -1};
    NBC_TRY(cudaMalloc(&range, 2 * sizeof(int)), "pack: cudaMalloc");
    nb_status st = NB_OK;
    cudaError_t e = cudaMemcpyAsync(range, h, sizeof h, cudaMemcpyHostToDevice, s);
    if (e != cudaSuccess) {
        st = nbc_fail(ctx, e, "pack: copy");
    } else {
        exp_range_kernel<<<256, 256, 0, s>>>(scales, d->n * (d->k / d->group_size), skip, range);
        if ((e = cudaGetLastError()) != cudaSuccess) st = nbc_fail(ctx, e, "pack: range kernel launch");
        else if ((e = cudaMemcpyAsync(h, range, sizeof h, cudaMemcpyDeviceToHost, s)) != cudaSuccess)
            st = nbc_fail(ctx, e, "pack: copy back");
        else if ((e = cudaStreamSynchronize(s)) != cudaSuccess) st = nbc_fail(ctx, e, "pack: synchronize");
    }
    if (st == NB_OK) {
        *emin = h[1] < 0 ? -1 : h[0];
        *emax = h[1];
    }
    cudaFree(range);
    return st;
}

extern "C" nb_status nbi_cuda_pack(nb_context *ctx, const nb_weight_desc *d, const uint8_t *codes,
                                   const uint8_t *scales, void *packed, int32_t *emin, int32_t *emax, void *stream) {
    const nbi_format_traits *t = nbi_traits(d->format);
    const int64_t kchunks = (d->k + NBI_CHUNK_K - 1) / NBI_CHUNK_K, rbs = (d->n + 15) / 16;
    const int64_t total = rbs * kchunks * 32;
    cudaStream_t s = (cudaStream_t)stream;
    pack_kernel<<<(unsigned)((total + 255) / 256), 256, 0, s>>>(d->n, d->k, d->group_size, (int)nbi_chunk_bytes(t),
                                                                 kchunks, total, codes, scales, (uint8_t *)packed);
    NBC_LAUNCHED("pack kernel launch");
    *emin = *emax = -1;
    return t->scale_type == NB_SCALE_E8M0 ? exp_range(ctx, d, scales, 0xFF, emin, emax, s) : NB_OK;
}

/* The integer and table formats (docs/formats.md 8.7 - 8.9;
 * nb_pack_host_v2 is the specification): one thread per (chunk, lane)
 * writes the lane's 2 x 16 code bytes, word w holding k = 32w + 8t .. +7
 * (plain: element e in nibble e, the table formats), or with 8-bit codes
 * (bytes) its 4 x 16; lane 4g also writes lane group g's scales (rows g,
 * g+8: 2 x gpc of sb bytes) and zero points (zb bytes each) after the code
 * bytes cb. */
__global__ void pack_int_kernel(int64_t n, int64_t k, int group, int kg, int sb, int zb, bool plain, bool bytes, int cb,
                                int chunk_bytes, int64_t kchunks, int64_t total, const uint8_t *__restrict__ codes,
                                const uint8_t *__restrict__ scales, const uint8_t *__restrict__ zeros,
                                uint8_t *__restrict__ out) {
    int64_t tid = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (tid >= total) return;
    const int lane = (int)(tid & 31);
    const int64_t chunk = tid >> 5, rb = chunk / kchunks, kc = chunk % kchunks;
    const int gi = lane >> 2, ti = lane & 3;
    uint8_t *c = out + chunk * chunk_bytes;
    if (bytes) pack_lane_bytes(n, k, rb, kc, lane, codes, c);
    else pack_lane_codes(n, k, rb, kc, lane, codes, c, true, plain);
    if (ti) return;
    const int gpc = NBI_CHUNK_K / kg;
    const int64_t ng = k / group;
    for (int half = 0; half < 2; half++)
        for (int j = 0; j < gpc; j++) {
            const int64_t row = rb * 16 + gi + 8 * half, col = kc * NBI_CHUNK_K + (int64_t)kg * j;
            const bool in = row < n && col < k;
            const int64_t src = in ? row * ng + col / group : 0;
            const int at = half * gpc + j;
            for (int b = 0; b < sb; b++)
                c[cb + 2 * sb * gpc * gi + sb * at + b] = in ? scales[sb * src + b] : 0;
            for (int b = 0; zeros && b < zb; b++)
                c[cb + 16 * sb * gpc + 2 * zb * gpc * gi + zb * at + b] = in ? zeros[zb * src + b] : 0;
        }
}

extern "C" nb_status nbi_cuda_pack_int(nb_context *ctx, const nb_weight_desc *d, const uint8_t *codes,
                                       const uint8_t *scales, const uint8_t *zeros, void *packed, int32_t *zmin,
                                       int32_t *zmax, void *stream) {
    const int64_t kchunks = (d->k + NBI_CHUNK_K - 1) / NBI_CHUNK_K, rbs = (d->n + 15) / 16;
    const int64_t total = rbs * kchunks * 32;
    cudaStream_t s = (cudaStream_t)stream;
    const nbi_format_traits *t = nbi_traits(d->format);
    pack_int_kernel<<<(unsigned)((total + 255) / 256), 256, 0, s>>>(
        d->n, d->k, d->group_size, nbi_kernel_group(d), nbi_scale_bytes(d->scale_type),
        nbi_zero_bytes(t, d->scale_type), nbi_is_table(t),
        t->element_bits == 8, (int)nbi_code_bytes(t),
        (int)nbi_packed_chunk_bytes(d), kchunks, total, codes, scales, zeros, (uint8_t *)packed);
    NBC_LAUNCHED("pack kernel launch");
    *zmin = *zmax = -1; /* (the range of U8 zero points; float ones have none to check) */
    return zeros && t->zero_point == NB_ZERO_U8 ? exp_range(ctx, d, zeros, -1, zmin, zmax, s) : NB_OK;
}
