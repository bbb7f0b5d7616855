/* test_gpu_threads.c - nb_pack and nb_gemm from several host threads at once,
 * each with its own context and stream, give bit for bit what one thread
 * gives alone.
 *
 *   test_gpu_threads [--threads N] [--rounds R]
 *       exit 0 pass, 1 fail, 77 no device (skipped); N 8 and R 3 by default
 *
 * The problems mix formats (NVFP4, MXFP4), activation types (BF16, FP16),
 * shapes (Llama layers and ragged ones) and m (1 .. 1024, so the decode
 * kernels, the split-K variants and the tensor-core kernel all run).  The
 * main thread first runs every problem alone (one context, the default
 * stream): its outputs, packed weights and nb_gemm_last_config strings are
 * the reference.  Then N threads start together; each creates its own
 * context (nb_context_create(0)), non-blocking stream and zeroed workspace,
 * packs every weight itself from the shared checkpoint bytes (nb_pack on its
 * stream), and runs every problem R times in its own order (rotated by the
 * thread's index): round 0 direct calls, round 1 a CUDA graph captured in
 * thread-local mode and replayed, later rounds direct again.  After each
 * call it checks, bit for bit, the packed bytes, the output (poisoned with
 * NaN before) and its context's nb_gemm_last_config against the reference.
 * Messages name the thread, round and problem.  Meant to run under
 * compute-sanitizer too (make test-gpu-sanitize). */
#define _POSIX_C_SOURCE 200809L
#include "gpu_testlib.h"

#include <pthread.h>

enum { MAX_THREADS = 64, NP = 12 };

static const gt_shape k_problems[NP] = {
    {NB_FORMAT_NVFP4, NB_DTYPE_BF16, 4096, 4096, 1},   {NB_FORMAT_MXFP4, NB_DTYPE_BF16, 4096, 4096, 3},
    {NB_FORMAT_NVFP4, NB_DTYPE_F16, 1024, 4096, 8},    {NB_FORMAT_MXFP4, NB_DTYPE_F16, 14336, 512, 16},
    {NB_FORMAT_NVFP4, NB_DTYPE_BF16, 1000, 4192, 17},  {NB_FORMAT_MXFP4, NB_DTYPE_BF16, 300, 3072, 32},
    {NB_FORMAT_NVFP4, NB_DTYPE_BF16, 129, 144, 33},    {NB_FORMAT_MXFP4, NB_DTYPE_F16, 2048, 2048, 64},
    {NB_FORMAT_NVFP4, NB_DTYPE_F16, 1000, 4096, 100},  {NB_FORMAT_MXFP4, NB_DTYPE_BF16, 17, 224, 5},
    {NB_FORMAT_NVFP4, NB_DTYPE_BF16, 4096, 1024, 256}, {NB_FORMAT_MXFP4, NB_DTYPE_BF16, 512, 1024, 1024},
};

typedef struct reference {
    gt_problem p;
    uint8_t *packed;  /* host copy of the reference's packed weights */
    uint16_t *y;      /* host copy of its output */
    char config[256]; /* nb_gemm_last_config after it */
} reference;

static reference g_ref[NP];
static int g_rounds = 3;
static size_t g_ws_max;
static pthread_mutex_t g_lock = PTHREAD_MUTEX_INITIALIZER;
static pthread_barrier_t g_start;
static int g_fail, g_pass;

static void check(int ok, int thread, int round, int pi, const char *what) {
    pthread_mutex_lock(&g_lock);
    if (ok) {
        g_pass++;
    } else {
        char name[96];
        g_fail++;
        fprintf(stderr, "FAIL: thread %d, round %d, %s: %s\n", thread, round, gt_name(&g_ref[pi].p, name, sizeof name),
                what);
    }
    pthread_mutex_unlock(&g_lock);
}

/* The output bytes of problem pi in y equal the reference; the first
 * differing element is named. */
static void check_output(const uint16_t *y, int thread, int round, int pi, const char *how) {
    const reference *r = &g_ref[pi];
    const size_t count = (size_t)(r->p.m * r->p.n);
    size_t bad = 0, first = count;
    for (size_t i = 0; i < count; i++)
        if (y[i] != r->y[i] && bad++ == 0) first = i;
    char what[256];
    if (bad)
        snprintf(what, sizeof what, "%s: %zu elements differ, first [%zu, %zu]: 0x%04x, alone 0x%04x", how, bad,
                 first / (size_t)r->p.n, first % (size_t)r->p.n, y[first], r->y[first]);
    else
        snprintf(what, sizeof what, "%s", how);
    check(!bad, thread, round, pi, what);
}

typedef struct worker {
    int index;
} worker;

static void *run_worker(void *arg) {
    const worker *w = (const worker *)arg;
    GT_CUDA(cudaSetDevice(0));
    nb_context *ctx = NULL;
    cudaStream_t s;
    void *ws = NULL, *packed[NP], *y = NULL;
    uint8_t *hp = NULL;
    uint16_t *hy = NULL;
    size_t ymax = 0, pmax = 0;
    for (int i = 0; i < NP; i++) {
        const size_t yb = (size_t)(g_ref[i].p.m * g_ref[i].p.n) * 2;
        ymax = yb > ymax ? yb : ymax;
        pmax = g_ref[i].p.sz.packed_bytes > pmax ? g_ref[i].p.sz.packed_bytes : pmax;
    }
    pthread_barrier_wait(&g_start); /* every thread creates its context at once */
    GT_NB(nb_context_create(0, &ctx));
    GT_CUDA(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
    GT_CUDA(cudaMalloc(&ws, g_ws_max ? g_ws_max : 1));
    GT_CUDA(cudaMemsetAsync(ws, 0, g_ws_max ? g_ws_max : 1, s));
    GT_CUDA(cudaMalloc(&y, ymax));
    hp = (uint8_t *)malloc(pmax);
    hy = (uint16_t *)malloc(ymax);
    if (!hp || !hy) {
        fprintf(stderr, "out of host memory\n");
        exit(1);
    }
    /* this thread's own packed weights, from the shared checkpoint bytes */
    for (int i = 0; i < NP; i++) {
        const reference *r = &g_ref[i];
        nb_weight_desc d = r->p.ckpt;
        GT_CUDA(cudaMalloc(&packed[i], r->p.sz.packed_bytes));
        GT_NB(nb_pack(ctx, &d, r->p.d_codes, r->p.d_scales, packed[i], r->p.sz.packed_bytes, s));
        GT_CUDA(cudaMemcpyAsync(hp, packed[i], r->p.sz.packed_bytes, cudaMemcpyDeviceToHost, s));
        GT_CUDA(cudaStreamSynchronize(s));
        check(!memcmp(hp, r->packed, r->p.sz.packed_bytes) && d.scale_exp_min == r->p.packed.scale_exp_min &&
                  d.scale_exp_max == r->p.packed.scale_exp_max,
              w->index, -1, i, "nb_pack: packed bytes and scale range as alone");
    }
    for (int round = 0; round < g_rounds; round++)
        for (int j = 0; j < NP; j++) {
            const int i = (j + w->index) % NP; /* each thread in its own order */
            const reference *r = &g_ref[i];
            const size_t yb = (size_t)(r->p.m * r->p.n) * 2;
            GT_CUDA(cudaMemsetAsync(y, 0xFF, yb, s)); /* NaN: an element not written fails */
            if (round == 1) { /* a graph captured on this thread only */
                cudaGraph_t graph;
                cudaGraphExec_t exec;
                GT_CUDA(cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal));
                const nb_status st = gt_gemm(ctx, &r->p, packed[i], y, ws, g_ws_max, s);
                GT_CUDA(cudaStreamEndCapture(s, &graph));
                check(st == NB_OK, w->index, round, i, st == NB_OK ? "captured" : nb_context_last_error(ctx));
                GT_CUDA(cudaGraphInstantiate(&exec, graph, 0));
                GT_CUDA(cudaGraphLaunch(exec, s));
                GT_CUDA(cudaGraphLaunch(exec, s));
                GT_CUDA(cudaStreamSynchronize(s));
                GT_CUDA(cudaGraphExecDestroy(exec));
                GT_CUDA(cudaGraphDestroy(graph));
            } else {
                const nb_status st = gt_gemm(ctx, &r->p, packed[i], y, ws, g_ws_max, s);
                check(st == NB_OK, w->index, round, i, st == NB_OK ? "nb_gemm" : nb_context_last_error(ctx));
            }
            GT_CUDA(cudaMemcpyAsync(hy, y, yb, cudaMemcpyDeviceToHost, s));
            GT_CUDA(cudaStreamSynchronize(s));
            check_output(hy, w->index, round, i, round == 1 ? "graph replay output as alone" : "output as alone");
            char cfg[256];
            GT_NB(nb_gemm_last_config(ctx, cfg, sizeof cfg));
            char what[600];
            snprintf(what, sizeof what, "configuration \"%s\", alone \"%s\"", cfg, r->config);
            check(!strcmp(cfg, r->config), w->index, round, i, what);
        }
    for (int i = 0; i < NP; i++) GT_CUDA(cudaFree(packed[i]));
    GT_CUDA(cudaFree(ws));
    GT_CUDA(cudaFree(y));
    GT_CUDA(cudaStreamDestroy(s));
    GT_NB(nb_context_destroy(ctx));
    free(hp);
    free(hy);
    return NULL;
}

/* The reference: every problem alone on the main thread. */
static void make_references(nb_context *ctx) {
    for (int i = 0; i < NP; i++) {
        reference *r = &g_ref[i];
        gt_problem_make(ctx, &r->p, &k_problems[i], 1000 + (uint64_t)i);
        g_ws_max = r->p.ws > g_ws_max ? r->p.ws : g_ws_max;
    }
    void *ws = NULL, *y = NULL;
    GT_CUDA(cudaMalloc(&ws, g_ws_max ? g_ws_max : 1));
    GT_CUDA(cudaMemset(ws, 0, g_ws_max ? g_ws_max : 1));
    for (int i = 0; i < NP; i++) {
        reference *r = &g_ref[i];
        const size_t yb = (size_t)(r->p.m * r->p.n) * 2;
        r->packed = (uint8_t *)malloc(r->p.sz.packed_bytes);
        r->y = (uint16_t *)malloc(yb);
        if (!r->packed || !r->y) {
            fprintf(stderr, "out of host memory\n");
            exit(1);
        }
        GT_CUDA(cudaMalloc(&y, yb));
        GT_CUDA(cudaMemset(y, 0xFF, yb));
        GT_NB(gt_gemm(ctx, &r->p, r->p.d_packed, y, ws, g_ws_max, NULL));
        GT_CUDA(cudaDeviceSynchronize());
        GT_CUDA(cudaMemcpy(r->y, y, yb, cudaMemcpyDeviceToHost));
        GT_CUDA(cudaMemcpy(r->packed, r->p.d_packed, r->p.sz.packed_bytes, cudaMemcpyDeviceToHost));
        GT_NB(nb_gemm_last_config(ctx, r->config, sizeof r->config));
        GT_CUDA(cudaFree(y));
        size_t nan = 0; /* the reference itself wrote every element (0xFFFF is NaN in both types) */
        for (size_t e = 0; e < yb / 2; e++) nan += r->y[e] == 0xFFFF;
        check(nan == 0, -1, -1, i, "the single-threaded run wrote every element");
    }
    GT_CUDA(cudaFree(ws));
}

int main(int argc, char **argv) {
    int64_t nthreads = 8, rounds = 3;
    for (int i = 1; i < argc; i++) {
        const int th = !strcmp(argv[i], "--threads"), ro = !strcmp(argv[i], "--rounds");
        if (!(th || ro) || !gt_arg_int(argc, argv, &i, 1, th ? MAX_THREADS : 100, th ? &nthreads : &rounds)) {
            fprintf(stderr, "usage: test_gpu_threads [--threads 1..%d] [--rounds 1..100]\n", MAX_THREADS);
            return 1;
        }
    }
    g_rounds = (int)rounds;
    gt_need_device("test_gpu_threads");
    nb_context *ctx = NULL;
    GT_NB(nb_context_create(0, &ctx));
    nb_device_info info;
    GT_NB(nb_context_device_info(ctx, &info));
    printf("test_gpu_threads on %s: %d problems, %lld threads x %d rounds, one context and stream each\n", info.name,
           NP, (long long)nthreads, g_rounds);
    make_references(ctx);
    pthread_t tid[MAX_THREADS];
    worker w[MAX_THREADS];
    pthread_barrier_init(&g_start, NULL, (unsigned)nthreads);
    for (int t = 0; t < nthreads; t++) {
        w[t].index = t;
        if (pthread_create(&tid[t], NULL, run_worker, &w[t]) != 0) {
            fprintf(stderr, "pthread_create failed\n");
            return 1;
        }
    }
    for (int t = 0; t < nthreads; t++) pthread_join(tid[t], NULL);
    pthread_barrier_destroy(&g_start);
    for (int i = 0; i < NP; i++) {
        printf("  %-36s %s\n", gt_name(&g_ref[i].p, (char[96]){0}, 96), g_ref[i].config);
        gt_problem_free(&g_ref[i].p);
        free(g_ref[i].packed);
        free(g_ref[i].y);
    }
    GT_NB(nb_context_destroy(ctx));
    printf("%d passed, %d failed\n", g_pass, g_fail);
    return g_fail ? 1 : 0;
}
