/* test_gpu_soak.c - a million nb_gemm launches through CUDA graphs, the
 * outputs checked against the first run at intervals.
 *
 *   test_gpu_soak [--launches N] [--check-every M]
 *       exit 0 pass, 1 fail, 77 no device (skipped); N 1,000,000 and M
 *       100,000 by default (ctest label "soak": not in `make test`;
 *       `make test-gpu-soak` runs it)
 *
 * Six problems (NVFP4 and MXFP4, BF16 and FP16, decode m = 1..16 with and
 * without a k split, tensor-core m = 64 and 256, a ragged layer) are each run
 * once directly: that output is the reference.  Then one CUDA graph holds
 * GRAPH_CALLS nb_gemm calls cycling over the problems (each into its own
 * output; the workspace is shared, as split-K counters are left at zero by
 * every call) and is replayed until N launches have run.  Every M launches,
 * and after the last, the outputs are poisoned (NaN), the graph replayed
 * once more, and every output compared bit for bit with the reference; a
 * CUDA error at any point (a launch failure, a fault) fails the test.  What
 * this finds: state that drifts over many launches (a counter not reset, a
 * race that shows once in 10^5 runs, a leak that ends in an allocation
 * failure), none of which a single call shows. */
#define _POSIX_C_SOURCE 200809L
#include "gpu_testlib.h"

#include <time.h>

enum { NP = 6, GRAPH_CALLS = 600 };

static const gt_shape k_problems[NP] = {
    {NB_FORMAT_NVFP4, NB_DTYPE_BF16, 4096, 4096, 1}, {NB_FORMAT_MXFP4, NB_DTYPE_BF16, 1024, 4096, 4},
    {NB_FORMAT_NVFP4, NB_DTYPE_F16, 256, 8192, 16},  {NB_FORMAT_MXFP4, NB_DTYPE_F16, 1000, 4192, 9},
    {NB_FORMAT_NVFP4, NB_DTYPE_BF16, 1024, 1024, 64}, {NB_FORMAT_MXFP4, NB_DTYPE_BF16, 512, 2048, 256},
};

static double now(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + (double)t.tv_nsec * 1e-9;
}

int main(int argc, char **argv) {
    int64_t launches = 1000000, every = 100000;
    for (int i = 1; i < argc; i++) {
        const int l = !strcmp(argv[i], "--launches"), c = !strcmp(argv[i], "--check-every");
        if (!(l || c) || !gt_arg_int(argc, argv, &i, 1, (int64_t)1 << 40, l ? &launches : &every)) {
            fprintf(stderr, "usage: test_gpu_soak [--launches N] [--check-every M]\n");
            return 1;
        }
    }
    gt_need_device("test_gpu_soak");
    nb_context *ctx = NULL;
    GT_NB(nb_context_create(0, &ctx));
    nb_device_info info;
    GT_NB(nb_context_device_info(ctx, &info));
    cudaStream_t s;
    GT_CUDA(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
    gt_problem p[NP];
    void *y[NP];
    uint16_t *ref[NP], *got = NULL;
    size_t yb[NP], ws_bytes = 1, ymax = 0;
    for (int i = 0; i < NP; i++) {
        gt_problem_make(ctx, &p[i], &k_problems[i], 77 + (uint64_t)i);
        ws_bytes = p[i].ws > ws_bytes ? p[i].ws : ws_bytes;
        yb[i] = (size_t)(p[i].m * p[i].n) * 2;
        ymax = yb[i] > ymax ? yb[i] : ymax;
        GT_CUDA(cudaMalloc(&y[i], yb[i]));
        ref[i] = (uint16_t *)malloc(yb[i]);
    }
    got = (uint16_t *)malloc(ymax);
    void *ws = NULL;
    GT_CUDA(cudaMalloc(&ws, ws_bytes));
    GT_CUDA(cudaMemset(ws, 0, ws_bytes));
    /* the first run: each problem once, directly */
    printf("test_gpu_soak on %s: %lld launches in graphs of %d, checked every %lld\n", info.name, (long long)launches,
           GRAPH_CALLS, (long long)every);
    for (int i = 0; i < NP; i++) {
        char name[96], cfg[256];
        GT_CUDA(cudaMemsetAsync(y[i], 0xFF, yb[i], s));
        GT_NB(gt_gemm(ctx, &p[i], p[i].d_packed, y[i], ws, ws_bytes, s));
        GT_CUDA(cudaMemcpyAsync(ref[i], y[i], yb[i], cudaMemcpyDeviceToHost, s));
        GT_CUDA(cudaStreamSynchronize(s));
        GT_NB(nb_gemm_last_config(ctx, cfg, sizeof cfg));
        printf("  %-36s %s\n", gt_name(&p[i], name, sizeof name), cfg);
    }
    /* the graph */
    cudaGraph_t graph;
    cudaGraphExec_t exec;
    GT_CUDA(cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal));
    for (int c = 0; c < GRAPH_CALLS; c++) GT_NB(gt_gemm(ctx, &p[c % NP], p[c % NP].d_packed, y[c % NP], ws, ws_bytes, s));
    GT_CUDA(cudaStreamEndCapture(s, &graph));
    GT_CUDA(cudaGraphInstantiate(&exec, graph, 0));
    int fail = 0, checks = 0;
    int64_t done = NP, next_check = every;
    const double t0 = now();
    for (int more = 1; more && !fail; more = done < launches) { /* (at least one replay, checked) */
        const int check = done + GRAPH_CALLS >= next_check || done + GRAPH_CALLS >= launches;
        if (check)
            for (int i = 0; i < NP; i++) GT_CUDA(cudaMemsetAsync(y[i], 0xFF, yb[i], s));
        GT_CUDA(cudaGraphLaunch(exec, s));
        done += GRAPH_CALLS;
        if (!check) continue;
        GT_CUDA(cudaStreamSynchronize(s));
        GT_CUDA(cudaGetLastError());
        checks++;
        for (int i = 0; i < NP; i++) {
            GT_CUDA(cudaMemcpy(got, y[i], yb[i], cudaMemcpyDeviceToHost));
            size_t bad = 0, first = 0;
            for (size_t e = 0; e < yb[i] / 2; e++)
                if (got[e] != ref[i][e] && bad++ == 0) first = e;
            if (bad) {
                char name[96];
                fprintf(stderr, "FAIL: after %lld launches, %s: %zu elements differ from the first run, first "
                        "[%lld, %lld]: 0x%04x, first run 0x%04x\n", (long long)done, gt_name(&p[i], name, sizeof name),
                        bad, (long long)(first / (size_t)p[i].n), (long long)(first % (size_t)p[i].n), got[first],
                        ref[i][first]);
                fail = 1;
            }
        }
        const double t = now() - t0;
        printf("  %lld launches, %.1f s, %.0f launches/s: outputs %s\n", (long long)done, t, (double)done / t,
               fail ? "DIFFER" : "equal to the first run");
        fflush(stdout);
        while (next_check <= done) next_check += every;
    }
    GT_CUDA(cudaGraphExecDestroy(exec));
    GT_CUDA(cudaGraphDestroy(graph));
    for (int i = 0; i < NP; i++) {
        GT_CUDA(cudaFree(y[i]));
        free(ref[i]);
        gt_problem_free(&p[i]);
    }
    free(got);
    GT_CUDA(cudaFree(ws));
    GT_CUDA(cudaStreamDestroy(s));
    GT_NB(nb_context_destroy(ctx));
    printf("%d passed, %d failed (%lld launches, %d checks)\n", fail ? 0 : checks, fail, (long long)done, checks);
    return fail;
}
