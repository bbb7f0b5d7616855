/* plan_host.h - the planner (src/plan.c) on a host context that plays an
 * H100 SXM (132 SMs, sm_90a, 227 KB of shared memory per block), for
 * test_plan.c and plan_dump.c.  The library's C sources are compiled into
 * the executable with the no-CUDA stubs, except the hooks defined here: the
 * sm_90a build, the tensor-core kernel's cluster capacity as measured on an
 * H100 (cudaOccupancyMaxActiveClusters, 2026-11-26: 66, 39, 30, 22, 17, 15,
 * 15 clusters of 2..8) and decode kernel 1's occupancy.  Include it once per
 * executable, first: it includes src/cuda_stub.c and defines functions. */
#ifndef NB_TESTS_PLAN_HOST_H
#define NB_TESTS_PLAN_HOST_H

#define _POSIX_C_SOURCE 200809L
#define nbi_cuda_has_sm90a nbi_stub_has_sm90a
#define nbi_cuda_sm90_clusters nbi_stub_sm90_clusters
#define nbi_cuda_available nbi_stub_cuda_available
#define nbi_cuda_gemv_ctas_per_sm nbi_stub_gemv_ctas_per_sm
#include "../src/cuda_stub.c"
#undef nbi_cuda_has_sm90a
#undef nbi_cuda_sm90_clusters
#undef nbi_cuda_available
#undef nbi_cuda_gemv_ctas_per_sm

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

int nbi_cuda_has_sm90a(void);
int nbi_cuda_sm90_clusters(nb_context *ctx, int fmt, int act, int bn, int cwg, int kg, int s);

int nbi_cuda_has_sm90a(void) { return 1; }
int nbi_cuda_available(void);
int nbi_cuda_available(void) { return 1; } /* (the MoE planner asks; nothing here launches) */

/* clusters of s (index) CTAs that fit at once; g_queries counts the asks */
static int g_cap[NBI_SM90_MAX_SPLITS + 1] = {0, 132, 66, 39, 30, 22, 17, 15, 15};
static int g_queries;
int nbi_cuda_sm90_clusters(nb_context *ctx, int fmt, int act, int bn, int cwg, int kg, int s) {
    (void)ctx, (void)fmt, (void)act, (void)bn, (void)cwg, (void)kg;
    g_queries++;
    return s >= 2 && s <= NBI_SM90_MAX_SPLITS ? g_cap[s] : 0;
}

/* Decode kernel 1's occupancy as the H100's calculator gives it for the
 * one-tile FP4 and integer instances (70-80 registers: three CTAs of 256
 * threads per SM) and the others (two; the table formats' one-tile
 * instances have 96 registers at blocks of 64, int4_hqq's 82-96 at groups
 * of 128), kernel 2's (three for the E2M1 formats' one-tile split instance,
 * 72 registers, two for the rest), and the cap: with the least dynamic
 * shared memory past (228 KB / 3 less the runtime's and the static bytes)
 * two. */
static int g_k1_fit = 3;
int nbi_cuda_gemv_ctas_per_sm(nb_context *ctx, const nbi_gemm_plan *p, int cap, size_t *bytes);
int nbi_cuda_gemv_ctas_per_sm(nb_context *ctx, const nbi_gemm_plan *p, int cap, size_t *bytes) {
    const size_t ring = (size_t)NBI_GEMV_WARPS * 4 * (size_t)p->chunk_bytes;
    const int fit = p->xsh ? (p->mt == 1 && p->rpw == 2 && nbi_traits(p->fmt)->every_kernel ? 3 : 2)
                   : p->mt == 1 && !nbi_is_table(nbi_traits(p->fmt)) && p->fmt != NB_FORMAT_INT4_HQQ ? g_k1_fit
                                                                                                   : 2;
    *bytes = ring;
    if (cap <= 0 || fit <= cap) return fit;
    *bytes = ctx->info.smem_per_sm / (size_t)(cap + 1) + 1 - 1024 - 1152;
    return cap;
}

/* A host context with the device facts of an H100 SXM. */
static inline nb_context *h100(void) {
    nb_context *c = NULL;
    if (nb_context_create(NB_DEVICE_NONE, &c) != NB_OK) {
        printf("nb_context_create failed: %s\n", nb_last_error());
        exit(1);
    }
    snprintf(c->info.name, sizeof c->info.name, "NVIDIA H100 80GB HBM3 (test)");
    c->info.device = 0;
    c->info.cc_major = 9, c->info.cc_minor = 0;
    c->info.sm_count = 132;
    c->info.max_threads_per_sm = 2048;
    c->info.regs_per_sm = 65536;
    c->info.l2_bytes = 50u << 20;
    c->info.smem_per_block_optin = 227 * 1024;
    c->info.smem_per_sm = 228 * 1024;
    c->has_device = 1;
    for (int f = 0; f < NBI_FORMAT_COUNT; f++)
        for (int t = 0; t < 4; t++) c->table_shift[f][t] = INT32_MIN;
    return c;
}

static inline nb_gemm_desc problem(nb_format fmt, int64_t k, int64_t n, int64_t m) {
    nb_weight_desc w;
    nb_gemm_desc g;
    nb_weight_desc_init(&w, fmt, n, k);
    w.layout = NB_LAYOUT_PACKED;
    nb_gemm_desc_init(&g, &w, m, NB_DTYPE_BF16, NB_DTYPE_BF16);
    return g;
}

#endif
