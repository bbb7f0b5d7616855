/* cuda_stub.c - linked instead of the kernels when no CUDA compiler was found:
 * every device entry point then reports NB_ERR_NO_DEVICE. */
#include "internal.h"

#include <stdio.h>

static int no_cuda(char *err) {
    if (err) snprintf(err, NB_ERRBUF, "built without CUDA");
    return 100; /* cudaErrorNoDevice */
}

int nbi_cuda_available(void) { return 0; }
const char *nbi_cuda_archs(void) { return ""; }
int nbi_cuda_device_count(int *count, char *err) {
    *count = 0;
    return no_cuda(err);
}
int nbi_cuda_device_info(int device, nb_device_info *info, char *err) {
    (void)device, (void)info;
    return no_cuda(err);
}
int nbi_cuda_dequantize(const nb_weight_desc *d, const uint8_t *codes, const uint8_t *scales, nb_dtype dst_dtype,
                        void *dst, void *stream, char *err) {
    (void)d, (void)codes, (void)scales, (void)dst_dtype, (void)dst, (void)stream;
    return no_cuda(err);
}
int nbi_cuda_pack(const nb_weight_desc *d, const uint8_t *codes, const uint8_t *scales, void *packed, int32_t *emin,
                  int32_t *emax, void *stream, char *err) {
    (void)d, (void)codes, (void)scales, (void)packed, (void)emin, (void)emax, (void)stream;
    return no_cuda(err);
}
int nbi_cuda_quantize_scan(const nb_weight_desc *d, nb_dtype src_dtype, const void *src, int64_t *bad, float *amax,
                           void *stream, char *err) {
    (void)d, (void)src_dtype, (void)src, (void)bad, (void)amax, (void)stream;
    return no_cuda(err);
}
int nbi_cuda_quantize(const nb_weight_desc *d, nb_dtype src_dtype, const void *src, uint8_t *codes, uint8_t *scales,
                      void *stream, char *err) {
    (void)d, (void)src_dtype, (void)src, (void)codes, (void)scales, (void)stream;
    return no_cuda(err);
}
int nbi_cuda_malloc(void **p, size_t bytes, char *err) {
    (void)bytes;
    *p = NULL;
    return no_cuda(err);
}
void nbi_cuda_free(void *p) { (void)p; }
int nbi_cuda_copy(void *dst, const void *src, size_t bytes, int to_device, void *stream, char *err) {
    (void)dst, (void)src, (void)bytes, (void)to_device, (void)stream;
    return no_cuda(err);
}
int nbi_cuda_gemm(const nbi_gemm_plan *p, const void *x, const void *packed, const void *bias, void *y,
                  void *workspace, void *stream, char *err) {
    (void)p, (void)x, (void)packed, (void)bias, (void)y, (void)workspace, (void)stream;
    return no_cuda(err);
}
int nbi_cuda_gemm_sm90(const nbi_gemm_plan *p, const void *x, const void *packed, const void *bias, void *y,
                       void *workspace, void *stream, char *err) {
    (void)p, (void)x, (void)packed, (void)bias, (void)y, (void)workspace, (void)stream;
    return no_cuda(err);
}
int nbi_cuda_has_sm90a(void) { return 0; }
int nbi_cuda_gemm_sm80(const nbi_gemm_plan *p, const void *x, const void *packed, const void *bias, void *y,
                       void *stream, char *err) {
    (void)p, (void)x, (void)packed, (void)bias, (void)y, (void)stream;
    return no_cuda(err);
}
int nbi_cuda_gemm_sm80_stages(int fmt, int bn, int want, size_t smem_limit, size_t *smem) {
    (void)fmt, (void)bn, (void)want, (void)smem_limit;
    *smem = 0;
    return 0;
}
int nbi_cuda_gemm_naive(const nb_gemm_desc *g, const void *x, const uint8_t *codes, const uint8_t *scales,
                        const void *bias, float *y, void *stream, char *err) {
    (void)g, (void)x, (void)codes, (void)scales, (void)bias, (void)y, (void)stream;
    return no_cuda(err);
}
int nbi_cuda_gemv_shape(int *warps, int *stages) {
    *warps = 8;
    *stages = 4;
    return 0;
}

size_t nbi_cuda_gemv_smem(int fmt, int xs, int rpw, int mt, int m) {
    (void)fmt, (void)xs, (void)rpw, (void)mt, (void)m;
    return 0;
}
