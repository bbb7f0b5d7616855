/* runtime.cu - the library's use of the CUDA runtime outside the kernels:
 * whether CUDA is compiled in and for which architectures, device facts for
 * the context, device memory and copies (nb_quantize_staged), and the
 * record of kernels opted into large dynamic shared memory. */
#include <pthread.h>

#include "common.cuh"

#ifndef NB_CUDA_ARCHS
#define NB_CUDA_ARCHS "unknown"
#endif

extern "C" int nbi_cuda_available(void) { return 1; }
extern "C" const char *nbi_cuda_archs(void) { return NB_CUDA_ARCHS; }

/* Whether this build carries the sm_90a kernels (the architecture list has
 * 90a; plain sm_90 cannot run wgmma). */
extern "C" int nbi_cuda_has_sm90a(void) {
#ifdef NB_HAVE_SM90A
    return 1;
#else
    return 0;
#endif
}

/* The capture state of `stream` and, when it captures, the node its next
 * launch will depend on (internal.h; device.c pdl_head). */
extern "C" int nbi_cuda_capture_tip(void *stream, void **node, unsigned long long *id) {
    cudaStreamCaptureStatus cs = cudaStreamCaptureStatusNone;
    unsigned long long cid = 0;
    const cudaGraphNode_t *deps = NULL;
    size_t n = 0;
#if CUDART_VERSION >= 13000
    const cudaError_t e = cudaStreamGetCaptureInfo((cudaStream_t)stream, &cs, &cid, NULL, &deps, NULL, &n);
#else
    const cudaError_t e = cudaStreamGetCaptureInfo_v2((cudaStream_t)stream, &cs, &cid, NULL, &deps, &n);
#endif
    if (e != cudaSuccess) {
        (void)cudaGetLastError(); /* (not sticky: clear it) */
        return -1;
    }
    if (cs != cudaStreamCaptureStatusActive) return -1;
    if (n != 1 || !deps) return 0;
    *node = (void *)deps[0];
    *id = cid;
#if CUDART_VERSION >= 13000
    /* 2: the node is a kernel that was itself launched with programmatic
     * dependent launch (an edge into it is programmatic), as Inductor's
     * Triton kernels are under TORCHINDUCTOR_ENABLE_PDL=1 */
    cudaGraphNodeType type;
    if (cudaGraphNodeGetType(deps[0], &type) != cudaSuccess) {
        (void)cudaGetLastError();
        return 1;
    }
    if (type != cudaGraphNodeTypeKernel) return 1;
    cudaGraphNode_t in[8];
    cudaGraphEdgeData ed[8];
    size_t nin = 8;
    memset(ed, 0, sizeof ed);
    if (cudaGraphNodeGetDependencies(deps[0], in, ed, &nin) != cudaSuccess) {
        (void)cudaGetLastError();
        return 1;
    }
    for (size_t i = 0; i < nin && i < 8; i++)
        if (ed[i].type == cudaGraphDependencyTypeProgrammatic) return 2;
#endif
    return 1;
}

extern "C" nb_status nbi_cuda_device_count(int *count) {
    nb_context *ctx = NULL; /* (for NBC_TRY: no context yet) */
    NBC_TRY(cudaGetDeviceCount(count), "cudaGetDeviceCount");
    return NB_OK;
}

extern "C" nb_status nbi_cuda_device_info(int device, nb_device_info *info) {
    nb_context *ctx = NULL;
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
    return NB_OK;
}

/* ------------------------------------------------ memory (load time only) */

extern "C" nb_status nbi_cuda_malloc(nb_context *ctx, void **p, size_t bytes) {
    *p = NULL;
    const cudaError_t e = cudaMalloc(p, bytes ? bytes : 1);
    if (e != cudaSuccess) {
        char what[64];
        snprintf(what, sizeof what, "cudaMalloc(%zu bytes)", bytes);
        return nbc_fail(ctx, e, what);
    }
    return NB_OK;
}

extern "C" void nbi_cuda_free(void *p) {
    if (p) cudaFree(p);
}

extern "C" nb_status nbi_cuda_copy(nb_context *ctx, void *dst, const void *src, size_t bytes, int to_device,
                                   void *stream) {
    cudaStream_t s = (cudaStream_t)stream;
    NBC_TRY(cudaMemcpyAsync(dst, src, bytes, to_device ? cudaMemcpyHostToDevice : cudaMemcpyDeviceToHost, s),
            to_device ? "copy to the device" : "copy from the device");
    NBC_TRY(cudaStreamSynchronize(s), "synchronize");
    return NB_OK;
}

/* ---------------------------------------------- dynamic shared memory */

/* The attribute belongs to a kernel on one device, so the record is per
 * (kernel, device), under a lock: contexts on several threads and devices
 * launch the same kernels.  A few dozen entries at most (one per kernel
 * instance that needs over 48 KB, per device). */
static struct {
    const void *fn;
    int device;
    size_t bytes;
} g_opted[1024];
static int g_nopted;
static pthread_mutex_t g_opt_lock = PTHREAD_MUTEX_INITIALIZER;

extern "C" nb_status nbc_smem_opt_in(nb_context *ctx, const void *fn, size_t bytes) {
    const int dev = ctx->info.device;
    pthread_mutex_lock(&g_opt_lock);
    for (int i = 0; i < g_nopted; i++)
        if (g_opted[i].fn == fn && g_opted[i].device == dev && g_opted[i].bytes >= bytes) {
            pthread_mutex_unlock(&g_opt_lock);
            return NB_OK;
        }
    const cudaError_t e = cudaFuncSetAttribute(fn, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)bytes);
    if (e == cudaSuccess && g_nopted < (int)(sizeof g_opted / sizeof g_opted[0]))
        g_opted[g_nopted++] = {fn, dev, bytes};
    pthread_mutex_unlock(&g_opt_lock);
    if (e != cudaSuccess) return nbc_fail(ctx, e, "cudaFuncSetAttribute(max dynamic shared memory)");
    return NB_OK;
}

/* -------------------------------------------------- resident CTAs per SM */

/* How many CTAs of kernel `fn` (threads per CTA, dynamic shared memory
 * bytes) one SM of the context's device holds at once, by the occupancy
 * calculator: a record per (kernel, device, bytes), under a lock as above.
 * 0 where the runtime cannot tell (the caller then plans as if unknown). */
static struct {
    const void *fn;
    int device, threads;
    size_t bytes;
    int ctas;
} g_occ[1024];
static int g_nocc;
static pthread_mutex_t g_occ_lock = PTHREAD_MUTEX_INITIALIZER;

extern "C" int nbc_ctas_per_sm(nb_context *ctx, const void *fn, int threads, size_t bytes) {
    const int dev = ctx->info.device;
    pthread_mutex_lock(&g_occ_lock);
    for (int i = 0; i < g_nocc; i++)
        if (g_occ[i].fn == fn && g_occ[i].device == dev && g_occ[i].threads == threads && g_occ[i].bytes == bytes) {
            const int c = g_occ[i].ctas;
            pthread_mutex_unlock(&g_occ_lock);
            return c;
        }
    int c = 0;
    if (cudaOccupancyMaxActiveBlocksPerMultiprocessor(&c, fn, threads, bytes) != cudaSuccess) {
        (void)cudaGetLastError(); /* (not sticky: clear it) */
        c = 0;
    }
    if (g_nocc < (int)(sizeof g_occ / sizeof g_occ[0])) g_occ[g_nocc++] = {fn, dev, threads, bytes, c};
    pthread_mutex_unlock(&g_occ_lock);
    return c;
}
