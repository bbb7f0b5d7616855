/* cuda_stub.c - linked instead of the kernels when no CUDA compiler was found:
 * every device entry point then reports NB_ERR_NO_DEVICE. */
#include "internal.h"

static nb_status no_cuda(nb_context *ctx) {
    return nbi_fail(ctx, NB_ERR_NO_DEVICE, "libnibble was built without CUDA");
}

int nbi_cuda_available(void) { return 0; }
const char *nbi_cuda_archs(void) { return ""; }
int nbi_cuda_has_sm90a(void) { return 0; }
nb_status nbi_cuda_device_count(int *count) {
    *count = 0;
    return no_cuda(NULL);
}
nb_status nbi_cuda_device_info(int device, nb_device_info *info) {
    (void)device, (void)info;
    return no_cuda(NULL);
}
nb_status nbi_cuda_malloc(nb_context *ctx, void **p, size_t bytes) {
    (void)bytes;
    *p = NULL;
    return no_cuda(ctx);
}
void nbi_cuda_free(void *p) { (void)p; }
nb_status nbi_cuda_copy(nb_context *ctx, void *dst, const void *src, size_t bytes, int to_device, void *stream) {
    (void)dst, (void)src, (void)bytes, (void)to_device, (void)stream;
    return no_cuda(ctx);
}
nb_status nbi_cuda_dequantize(nb_context *ctx, const nb_weight_desc *d, const uint8_t *codes, const uint8_t *scales,
                              nb_dtype dst_dtype, void *dst, void *stream) {
    (void)d, (void)codes, (void)scales, (void)dst_dtype, (void)dst, (void)stream;
    return no_cuda(ctx);
}
nb_status nbi_cuda_pack(nb_context *ctx, const nb_weight_desc *d, const uint8_t *codes, const uint8_t *scales,
                        void *packed, int32_t *emin, int32_t *emax, void *stream) {
    (void)d, (void)codes, (void)scales, (void)packed, (void)emin, (void)emax, (void)stream;
    return no_cuda(ctx);
}
nb_status nbi_cuda_pack_int(nb_context *ctx, const nb_weight_desc *d, const uint8_t *codes, const uint8_t *scales,
                            const uint8_t *zeros, void *packed, int32_t *zmin, int32_t *zmax, void *stream) {
    (void)d, (void)codes, (void)scales, (void)zeros, (void)packed, (void)zmin, (void)zmax, (void)stream;
    return no_cuda(ctx);
}
nb_status nbi_cuda_quantize_scan(nb_context *ctx, const nb_weight_desc *d, nb_dtype src_dtype, const void *src,
                                 int64_t *bad, float *amax, void *stream) {
    (void)d, (void)src_dtype, (void)src, (void)bad, (void)amax, (void)stream;
    return no_cuda(ctx);
}
nb_status nbi_cuda_quantize(nb_context *ctx, const nb_weight_desc *d, nb_dtype src_dtype, const void *src,
                            uint8_t *codes, uint8_t *scales, void *stream) {
    (void)d, (void)src_dtype, (void)src, (void)codes, (void)scales, (void)stream;
    return no_cuda(ctx);
}
nb_status nbi_cuda_gemm_naive(nb_context *ctx, const nb_gemm_desc *g, const void *x, const uint8_t *codes,
                              const uint8_t *scales, const void *bias, float *y, void *stream) {
    (void)g, (void)x, (void)codes, (void)scales, (void)bias, (void)y, (void)stream;
    return no_cuda(ctx);
}
nb_status nbi_cuda_gemv(nb_context *ctx, const nbi_gemm_plan *p, const void *x, const void *packed, const void *bias,
                        void *y, void *workspace, void *stream) {
    (void)p, (void)x, (void)packed, (void)bias, (void)y, (void)workspace, (void)stream;
    return no_cuda(ctx);
}
nb_status nbi_cuda_gemm_sm90(nb_context *ctx, const nbi_gemm_plan *p, const void *x, const void *packed,
                             const void *bias, void *y, void *workspace, void *stream) {
    (void)p, (void)x, (void)packed, (void)bias, (void)y, (void)workspace, (void)stream;
    return no_cuda(ctx);
}
nb_status nbi_cuda_gemm_sm80(nb_context *ctx, const nbi_gemm_plan *p, const void *x, const void *packed,
                             const void *bias, void *y, void *stream) {
    (void)p, (void)x, (void)packed, (void)bias, (void)y, (void)stream;
    return no_cuda(ctx);
}
int nbi_cuda_capture_tip(void *stream, void **node, unsigned long long *id) {
    (void)stream, (void)node, (void)id;
    return -1;
}
int nbi_cuda_gemv_ctas_per_sm(nb_context *ctx, const nbi_gemm_plan *p, int cap, size_t *bytes) {
    (void)ctx, (void)p, (void)cap;
    *bytes = 0;
    return 0;
}
size_t nbi_cuda_gemv_smem(int fmt, int xs, int rpw, int mt, int m, size_t chunk_bytes, int warps) {
    (void)fmt, (void)xs, (void)rpw, (void)mt, (void)m, (void)chunk_bytes, (void)warps;
    return 0;
}
int nbi_cuda_gemm_sm80_stages(int fmt, int kg, int bn, int want, size_t smem_limit, size_t *smem) {
    (void)fmt, (void)kg, (void)bn, (void)want, (void)smem_limit;
    *smem = 0;
    return 0;
}
nb_status nbi_cuda_moe_align(nb_context *ctx, const nbi_moe_plan *p, const int32_t *ids, int32_t *sorted,
                             int32_t *blocks, int32_t *offsets, int32_t *counts, int32_t *ustart, void *stream) {
    (void)p, (void)ids, (void)sorted, (void)blocks, (void)offsets, (void)counts, (void)ustart, (void)stream;
    return no_cuda(ctx);
}
nb_status nbi_cuda_moe_sm90(nb_context *ctx, const nbi_moe_plan *p, int mode, const void *x,
                            const nb_moe_packed_weights *w, void *out, const int32_t *sorted, const int32_t *blockexp,
                            const int32_t *offsets, const int32_t *ustart, void *stream) {
    (void)p, (void)mode, (void)x, (void)w, (void)out, (void)sorted, (void)blockexp, (void)offsets, (void)ustart,
        (void)stream;
    return no_cuda(ctx);
}
nb_status nbi_cuda_moe_mlp(nb_context *ctx, const nbi_moe_plan *p, const void *x, const nb_moe_packed_weights *w,
                           const int32_t *ids, const float *tw, void *y, void *workspace, void *stream) {
    (void)p, (void)x, (void)w, (void)ids, (void)tw, (void)y, (void)workspace, (void)stream;
    return no_cuda(ctx);
}
nb_status nbi_cuda_glu(nb_context *ctx, const nb_glu_desc *d, const void *gu, void *h, int pdl, void *stream) {
    (void)d, (void)gu, (void)h, (void)pdl, (void)stream;
    return no_cuda(ctx);
}
int nbi_cuda_sm90_clusters(nb_context *ctx, int fmt, int act, int bn, int cwg, int kg, int s) {
    (void)ctx, (void)fmt, (void)act, (void)bn, (void)cwg, (void)kg, (void)s;
    return 0;
}
