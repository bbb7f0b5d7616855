/* k1_trace.cu - where a decode kernel-1 call's time goes, from a library
 * built with -DNB_GEMV_TRACE (scripts/trace-k1 builds both).
 *
 *   k1_trace K N [M] [FORMAT]
 *
 * One layer K -> N (NVFP4 unless FORMAT), M tokens (default 1), its weights
 * in as many copies as fill 240 MB (so each call reads them from DRAM, as
 * in a model step).  Two CUDA graphs of 16 calls, each call on its own
 * copy and its own part of the workspace:
 *   foreign  every call after a one-thread kernel of this program (a
 *            framework's kernel: no programmatic dependent launch), which
 *            records the global timer when it runs;
 *   nibble   the calls back to back (each after the previous nb_gemm, with
 *            programmatic dependent launch where nb_gemm takes it).
 * The traced kernel records per CTA the global timer at its start, when the
 * scale table is ready (after the weight prologue and the grid dependency
 * wait), when warp 0's first chunk has landed, after warp 0's loop, after
 * the in-CTA k sum, after the store, and its SM (gemv_fp4.cu, K1_TRACE).
 * Printed per scenario, in us, the median over the 16 calls of: the gap
 * from the previous kernel (the marker's timer, or the previous call's last
 * CTA end) to the first CTA's start; how long the CTAs take to start (the
 * last start after the first); per CTA (median over CTAs) the prologue,
 * the first chunk's wait, the loop after it, the k sum and the store; the
 * call's span (first start to last end) and its tail (last end after the
 * median end); and the graph's time per call with CUDA events (the trace's
 * stores included).  Exit 0, 3 on a CUDA or library error. */
#include <cuda_runtime.h>

#include "nibble.h"
extern "C" {
#include "benchlib.h"
}

#include <algorithm>
#include <string.h>
#include <vector>

#define CALLS 16

__global__ void k1_marker(unsigned long long *t) {
    unsigned long long v;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(v));
    *t = v;
}

static double median(std::vector<double> v) {
    if (v.empty()) return 0.0;
    std::sort(v.begin(), v.end());
    return v[v.size() / 2];
}

int main(int argc, char **argv) {
    nbt_tool = "k1_trace";
    if (argc < 3) {
        fprintf(stderr, "usage: k1_trace K N [M] [FORMAT]\n");
        return 1;
    }
    const int64_t k = atoll(argv[1]), n = atoll(argv[2]), m = argc > 3 ? atoll(argv[3]) : 1;
    nb_format fmt = NB_FORMAT_NVFP4;
    if (argc > 4) NB(nb_format_from_name(argv[4], &fmt));
    if (k <= 0 || n <= 0 || m <= 0) return 1;
    nb_context *ctx = NULL;
    NB(nb_context_create(0, &ctx));
    cudaStream_t s;
    CK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
    nbt_layer L;
    nbt_layer_make(ctx, fmt, n, k, 240, s, &L);
    const int R = L.rot < CALLS ? L.rot : CALLS;
    void *x = nbt_device_activations(NB_DTYPE_BF16, (size_t)(m * k));
    void *y;
    CK(cudaMalloc(&y, 2 * (size_t)(m * n)));
    nb_gemm_desc g;
    NB(nb_gemm_desc_init(&g, &L.packed, m, NB_DTYPE_BF16, NB_DTYPE_BF16));
    size_t need = 0;
    NB(nb_gemm_workspace_size(ctx, &g, &need));
    const size_t stride = std::max(need, (size_t)(1 << 20)) + 4096; /* 8 words for each of up to 16384 CTAs */
    char *ws;
    CK(cudaMalloc((void **)&ws, stride * R));
    CK(cudaMemset(ws, 0, stride * R));
    unsigned long long *marks;
    CK(cudaMalloc((void **)&marks, sizeof *marks * R));
    NB(nb_gemm(ctx, &g, x, L.pk[0], NULL, y, ws, stride, s));
    CK(cudaStreamSynchronize(s));
    char cfg[512];
    NB(nb_gemm_last_config(ctx, cfg, sizeof cfg));
    printf("k1_trace: %s %lld -> %lld, m = %lld, %d calls a graph: %s\n", argc > 4 ? argv[4] : "nvfp4",
           (long long)k, (long long)n, (long long)m, R, cfg);
    if (!strstr(cfg, "gemv_fp4<") || strstr(cfg, "staged")) {
        fprintf(stderr, "k1_trace: the plan is not decode kernel 1: nothing is traced\n");
        return 1;
    }
    std::vector<unsigned long long> h(stride / 8 * R);
    std::vector<unsigned long long> hm(R);
    for (int sc = 0; sc < 2; sc++) {
        cudaGraph_t graph;
        cudaGraphExec_t exec;
        CK(cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal));
        for (int r = 0; r < R; r++) {
            if (sc == 0) k1_marker<<<1, 1, 0, s>>>(marks + r);
            NB(nb_gemm(ctx, &g, x, L.pk[r], NULL, y, ws + stride * r, stride, s));
        }
        CK(cudaStreamEndCapture(s, &graph));
        CK(cudaGraphInstantiate(&exec, graph, 0));
        for (int i = 0; i < 3; i++) CK(cudaGraphLaunch(exec, s));
        CK(cudaMemsetAsync(ws, 0, stride * R, s));
        CK(cudaGraphLaunch(exec, s));
        CK(cudaStreamSynchronize(s));
        CK(cudaMemcpy(h.data(), ws, stride * R, cudaMemcpyDeviceToHost));
        CK(cudaMemcpy(hm.data(), marks, sizeof *marks * R, cudaMemcpyDeviceToHost));
        const double per_call = nbt_time_graph(exec, s, R, 20);
        std::vector<double> gap, ramp, pro, first, loop, ksum, store, span, tail;
        unsigned long long prev_end = 0;
        int ctas = 0;
        for (int r = 0; r < R; r++) {
            const unsigned long long *o = h.data() + stride / 8 * r;
            unsigned long long t0 = ~0ull, t0max = 0, t5 = 0;
            std::vector<double> e5;
            int c = 0;
            for (; c < (int)(stride / 64) && o[8 * c + 7] == 1; c++) {
                const unsigned long long *q = o + 8 * c;
                t0 = std::min(t0, q[0]), t0max = std::max(t0max, q[0]), t5 = std::max(t5, q[5]);
                pro.push_back((q[1] - q[0]) * 1e-3);
                first.push_back((q[2] - q[1]) * 1e-3);
                loop.push_back((q[3] - q[2]) * 1e-3);
                ksum.push_back((q[4] - q[3]) * 1e-3);
                store.push_back((q[5] - q[4]) * 1e-3);
                e5.push_back((double)q[5]);
            }
            if (!c) {
                fprintf(stderr, "k1_trace: call %d recorded no CTA (a library built without NB_GEMV_TRACE?)\n", r);
                return 1;
            }
            ctas = c;
            const unsigned long long before = sc == 0 ? hm[r] : prev_end;
            if (before) gap.push_back(((double)t0 - (double)before) * 1e-3);
            ramp.push_back((t0max - t0) * 1e-3);
            span.push_back((t5 - t0) * 1e-3);
            tail.push_back(((double)t5 - median(e5)) * 1e-3);
            prev_end = t5;
        }
        printf("%-8s %d CTAs: gap %.2f  CTA starts over %.2f  per CTA: prologue %.2f, first chunk %.2f, loop %.2f, "
               "k sum %.2f, store %.2f  span %.2f, tail %.2f  graph %.2f us a call\n",
               sc == 0 ? "foreign" : "nibble", ctas, median(gap), median(ramp), median(pro), median(first), median(loop),
               median(ksum), median(store), median(span), median(tail), per_call);
        CK(cudaGraphExecDestroy(exec));
        CK(cudaGraphDestroy(graph));
    }
    nb_context_destroy(ctx);
    return 0;
}
