/* test_gpu_moe.c - nb_moe_mlp and nb_moe_align on the GPU against the host
 * (nibble.h, "mixture of experts on the GPU"):
 *
 *   1. nb_moe_align on the device writes every byte nb_moe_align_host
 *      writes (blocks 1, 8, 32, 100; uniform, skewed and same-expert routing).
 *   2. nb_moe_mlp against the exact double MoE of test_moe.c (the problems,
 *      weights, routing and the error bound of its part 3, which the host
 *      float version meets): |y - y_exact| <= bound for every element;
 *      E = 8..128, top_k 1..8, m = 1..300 (routing blocks of 8, 16 and 32
 *      slots), experts with no token, NVFP4 (per-expert tensor scales) and
 *      MXFP4, SwiGLU concatenated and gpt-oss interleaved with biases, BF16
 *      and FP16; one gpt-oss-shaped layer (H = I = 2880, 8 experts); one with
 *      more tensor-core tiles holding tokens than the GPU has SMs (m = 1200,
 *      top-2, H = 768, I = 512: each CTA of the persistent grid walks
 *      several); one at m = 4096 (32 experts, top-4, skewed: 24 experts
 *      without a token).  Every
 *      problem runs through each kernel variant (k_variants: the planner's
 *      choice, the decode kernels with k split over warps, the tensor-core
 *      tiles of 64, 128 and 192 tokens, inline routing and the layout kernel
 *      forced).  Where inline routing runs (up to 64 slots: no layout or
 *      combine kernel), its output is bit for bit that of the four-kernel
 *      call with the same kernels otherwise.
 *   3. Captured in a CUDA graph and replayed after the routing buffers were
 *      rewritten on the device: bit for bit what a direct call gives (the
 *      planner's path, inline routing and the tensor-core tiles).
 *   4. A NaN in one token's activations makes that token's outputs NaN and
 *      no other's.  Routing ids outside [0, E) add nothing, inline as with
 *      the layout kernel (bit for bit), and with every id outside, y is 0.
 *   5. Refusals: a checkpoint-layout descriptor, a short workspace, NULL and
 *      misaligned pointers, missing tensor scales; nb_moe_align's capacity,
 *      block and NULL checks.
 *   6. nb_glu (dense gated activations) against nb_glu_host: both
 *      activations and layouts, BF16 and FP16, rows whose columns are a
 *      multiple of 8 (16-byte loads) and not, buffers 16-byte aligned and not,
 *      NaN and infinities among the inputs: NaN where the host has NaN, every
 *      other element equal or one ulp apart (counted), nothing written past h;
 *      its refusals.
 *
 *   test_gpu_moe [--quick] [--small]   exit 0 pass, 1 fail, 77 no device (skipped)
 *   (--small: without the gpt-oss-shaped layer, for compute-sanitizer)
 */
#define TEST_MOE_NO_MAIN
#pragma GCC diagnostic ignored "-Wunused-function"
#include "test_moe.c"

#include "gpu_testlib.h" /* GT_CUDA */

static void *dev_copy(const void *h, size_t n) {
    if (!h) return NULL;
    void *d = NULL;
    GT_CUDA(cudaMalloc(&d, n ? n : 1));
    GT_CUDA(cudaMemcpy(d, h, n, cudaMemcpyHostToDevice));
    return d;
}

/* ------------------------------------------------------ 1. routing layout */

static void check_align_gpu(nb_context *ctx, const mcase *c, int32_t block) {
    char what[160];
    case_name(c, what, sizeof what);
    mprob p;
    if (!make(c, &p)) return;
    nb_moe_align_sizes as;
    if (nb_moe_align_get_sizes(&p.d, block, &as) != NB_OK) {
        CHECK(0, "align sizes %s: %s", what, nb_last_error());
        release(&p);
        return;
    }
    const size_t ns = (size_t)as.sorted_len, nb = (size_t)as.blocks, no = (size_t)as.offsets_len;
    int32_t *hs = malloc(4 * ns), *hb = malloc(4 * nb), *ho = malloc(4 * no), *hc = malloc(4 * (no - 1));
    int32_t *gs = malloc(4 * ns), *gb = malloc(4 * nb), *go = malloc(4 * no), *gc = malloc(4 * (no - 1));
    nb_context *hctx = NULL;
    nb_context_create(NB_DEVICE_NONE, &hctx);
    CHECK(nb_moe_align_host(hctx, &p.d, block, p.ids, hs, hb, ho, hc, &as) == NB_OK, "align host %s: %s", what,
          nb_last_error());
    nb_context_destroy(hctx);
    int32_t *d_ids = dev_copy(p.ids, 4 * (size_t)as.slots), *ds, *db, *dof, *dc;
    GT_CUDA(cudaMalloc((void **)&ds, 4 * ns));
    GT_CUDA(cudaMalloc((void **)&db, 4 * nb));
    GT_CUDA(cudaMalloc((void **)&dof, 4 * no));
    GT_CUDA(cudaMalloc((void **)&dc, 4 * no));
    GT_CUDA(cudaMemset(ds, 0x7B, 4 * ns)); /* poison: every byte must be written */
    GT_CUDA(cudaMemset(db, 0x7B, 4 * nb));
    nb_status st = nb_moe_align(ctx, &p.d, block, d_ids, ds, db, dof, dc, &as, NULL);
    CHECK(st == NB_OK, "align %s block %d: %s", what, (int)block, nb_last_error());
    GT_CUDA(cudaMemcpy(gs, ds, 4 * ns, cudaMemcpyDeviceToHost));
    GT_CUDA(cudaMemcpy(gb, db, 4 * nb, cudaMemcpyDeviceToHost));
    GT_CUDA(cudaMemcpy(go, dof, 4 * no, cudaMemcpyDeviceToHost));
    GT_CUDA(cudaMemcpy(gc, dc, 4 * (no - 1), cudaMemcpyDeviceToHost));
    CHECK(!memcmp(gs, hs, 4 * ns) && !memcmp(gb, hb, 4 * nb) && !memcmp(go, ho, 4 * no) &&
              !memcmp(gc, hc, 4 * (no - 1)),
          "align %s block %d: device layout differs from nb_moe_align_host", what, (int)block);
    free(hs), free(hb), free(ho), free(hc), free(gs), free(gb), free(go), free(gc);
    cudaFree(d_ids), cudaFree(ds), cudaFree(db), cudaFree(dof), cudaFree(dc);
    release(&p);
}

/* --------------------------------------------------- 2-4. the MoE MLP */

typedef struct gpu_moe {
    nb_moe_desc d; /* packed */
    nb_moe_packed_weights w;
    void *x, *y, *ws;
    int32_t *ids;
    float *tw;
    size_t ws_bytes, y_bytes;
} gpu_moe;

static int gpu_setup(nb_context *ctx, mprob *p, gpu_moe *g, const char *what) {
    memset(g, 0, sizeof *g);
    nb_moe_packed_sizes ps;
    nb_status st = nb_moe_packed_get_sizes(&p->d, &ps);
    CHECK(st == NB_OK, "packed sizes %s: %s", what, nb_last_error());
    if (st) return 0;
    uint8_t *gp = malloc(ps.gate_up_bytes), *dp = malloc(ps.down_bytes);
    g->d = p->d;
    nb_context *hctx = NULL;
    nb_context_create(NB_DEVICE_NONE, &hctx);
    st = nb_moe_pack_host(hctx, &g->d, &p->w, gp, ps.gate_up_bytes, dp, ps.down_bytes);
    nb_context_destroy(hctx);
    CHECK(st == NB_OK, "pack %s: %s", what, nb_last_error());
    if (st) {
        free(gp), free(dp);
        return 0;
    }
    const size_t es = dsize(p->c.dt), E = (size_t)p->c.E;
    g->w.gate_up = dev_copy(gp, ps.gate_up_bytes);
    g->w.down = dev_copy(dp, ps.down_bytes);
    free(gp), free(dp);
    g->w.gate_up_scales = dev_copy(p->guts, p->guts ? 4 * E : 0);
    g->w.down_scales = dev_copy(p->dts, p->dts ? 4 * E : 0);
    g->w.gate_up_bias = dev_copy(p->gub, p->gub ? es * E * 2 * (size_t)p->c.I : 0);
    g->w.down_bias = dev_copy(p->db, p->db ? es * E * (size_t)p->c.H : 0);
    g->x = dev_copy(p->x, es * (size_t)(p->c.m * p->c.H));
    g->ids = dev_copy(p->ids, 4 * (size_t)(p->c.m * p->c.K));
    g->tw = dev_copy(p->tw, 4 * (size_t)(p->c.m * p->c.K));
    g->y_bytes = es * (size_t)(p->c.m * p->c.H);
    GT_CUDA(cudaMalloc(&g->y, g->y_bytes));
    st = nb_moe_workspace_size(ctx, &g->d, &g->ws_bytes);
    CHECK(st == NB_OK, "workspace %s: %s", what, nb_last_error());
    if (st) return 0;
    GT_CUDA(cudaMalloc(&g->ws, g->ws_bytes));
    GT_CUDA(cudaMemset(g->ws, 0x7B, g->ws_bytes)); /* nothing may depend on its contents */
    return 1;
}

static void gpu_release(gpu_moe *g) {
    cudaFree((void *)g->w.gate_up), cudaFree((void *)g->w.down), cudaFree((void *)g->w.gate_up_scales);
    cudaFree((void *)g->w.down_scales), cudaFree((void *)g->w.gate_up_bias), cudaFree((void *)g->w.down_bias);
    cudaFree(g->x), cudaFree(g->y), cudaFree(g->ws), cudaFree(g->ids), cudaFree(g->tw);
}

static nb_status run(nb_context *ctx, gpu_moe *g, cudaStream_t s) {
    return nb_moe_mlp(ctx, &g->d, g->x, &g->w, g->ids, g->tw, g->y, g->ws, g->ws_bytes, s);
}

static double g_worst_gpu;

/* The kernel variants every problem runs: the planner's choice, the decode
 * kernels with their k range split over 2, 4 and 8 warps (where a row block
 * has that many chunks), and the tensor-core path with 64-, 128- and
 * 192-token tiles (where the build and the GPU have it: sm_90a; elsewhere the decode
 * kernels run again).  Chosen through the variables the planner reads at
 * context creation. */
static const struct {
    const char *name, *path, *kw, *bn, *route;
} k_variants[] = {
    {"auto", NULL, NULL, NULL, NULL},
    {"inline routing", NULL, NULL, NULL, "inline"},
    {"layout kernel", NULL, NULL, NULL, "kernel"},
    {"decode kw 2", "decode", "2", NULL, NULL},
    {"decode kw 4", "decode", "4", NULL, NULL},
    {"decode kw 8", "decode", "8", NULL, NULL},
    {"tc 64", "tc", NULL, "64", NULL},
    {"tc 128", "tc", NULL, "128", NULL},
    {"tc 192", "tc", NULL, "192", NULL},
};
#define V_INLINE 1
#define V_LAYOUT_KERNEL 2
#define NVARIANTS ((int)(sizeof k_variants / sizeof k_variants[0]))

static void set_env(const char *name, const char *value) {
    if (value) setenv(name, value, 1);
    else unsetenv(name);
}
/* A context for variant v: the planner reads the variables at creation. */
static nb_context *variant_context(int v) {
    set_env("NIBBLE_MOE_PATH", k_variants[v].path);
    set_env("NIBBLE_MOE_KW", k_variants[v].kw);
    set_env("NIBBLE_MOE_TC_BN", k_variants[v].bn);
    set_env("NIBBLE_MOE_ROUTE", k_variants[v].route);
    nb_context *c = NULL;
    const nb_status st = nb_context_create(0, &c);
    CHECK(st == NB_OK, "context for variant %s: %s", k_variants[v].name, nb_last_error());
    unsetenv("NIBBLE_MOE_PATH");
    unsetenv("NIBBLE_MOE_KW");
    unsetenv("NIBBLE_MOE_TC_BN");
    unsetenv("NIBBLE_MOE_ROUTE");
    return st == NB_OK ? c : NULL;
}

/* The workspace of the variant now chosen (the tensor-core path also holds
 * the gathered token rows): reallocated when it grows. */
static void fit_workspace(nb_context *ctx, gpu_moe *g, const char *what) {
    size_t need = 0;
    CHECK(nb_moe_workspace_size(ctx, &g->d, &need) == NB_OK, "workspace size %s: %s", what, nb_last_error());
    if (need <= g->ws_bytes) return;
    GT_CUDA(cudaFree(g->ws));
    GT_CUDA(cudaMalloc(&g->ws, need));
    GT_CUDA(cudaMemset(g->ws, 0x7B, need)); /* nothing may depend on its contents */
    g->ws_bytes = need;
}

static void check_mlp(nb_context *ctx, const mcase *c, int graph) {
    char what[160];
    case_name(c, what, sizeof what);
    mprob p;
    if (!make(c, &p)) return;
    if (c->dt == NB_DTYPE_F16) /* x / 16 (exact): with H of 160..288, F16's 65504 would overflow in h and o_s */
        for (int64_t i = 0; i < c->m * c->H; i++) {
            p.xv[i] *= 0.0625f;
            store_as(c->dt, p.x, (size_t)i, p.xv[i]);
        }
    gpu_moe g;
    if (!gpu_setup(ctx, &p, &g, what)) {
        release(&p);
        return;
    }
    const int64_t mh = c->m * c->H;
    void *y = malloc(g.y_bytes);
    double *ref = malloc(sizeof(double) * (size_t)mh), *bound = malloc(sizeof(double) * (size_t)mh);
    moe_double(&p, 0x1p-24, 1, ref, bound);
    nb_status st = NB_OK;
    void *y0 = malloc(g.y_bytes);
    int inline1 = 0; /* the inline variant routed inline (at most 64 slots) */
    for (int v = 0; v < NVARIANTS; v++) { /* the planner's choice, then each kernel path forced */
        nb_context *vc = v == 0 ? ctx : variant_context(v);
        if (!vc) continue;
        fit_workspace(vc, &g, what);
        GT_CUDA(cudaMemset(g.y, 0xFF, g.y_bytes)); /* NaN poison */
        st = run(vc, &g, NULL);
        CHECK(st == NB_OK, "moe %s [%s]: %s", what, k_variants[v].name, nb_last_error());
        GT_CUDA(cudaDeviceSynchronize());
        GT_CUDA(cudaMemcpy(y, g.y, g.y_bytes, cudaMemcpyDeviceToHost));
        double worst = 0.0;
        int64_t wi = 0;
        for (int64_t i = 0; i < mh; i++) {
            const double got = (double)load_as(c->dt, y, (size_t)i);
            const double r = isfinite(got) ? fabs(got - ref[i]) / (bound[i] + 1e-12 * fabs(ref[i])) : INFINITY;
            if (!(r <= worst)) worst = r, wi = i;
        }
        if (worst > g_worst_gpu) g_worst_gpu = worst;
        if (v == V_INLINE) {
            char cfg[256];
            nb_gemm_last_config(vc, cfg, sizeof cfg);
            inline1 = strstr(cfg, "routing=inline") != NULL;
            memcpy(y0, y, g.y_bytes);
        }
        if (v == V_LAYOUT_KERNEL && inline1)
            CHECK(!memcmp(y0, y, g.y_bytes), "moe %s: inline routing differs from the layout and combine kernels",
                  what);
        CHECK(worst <= 1.0, "moe %s [%s]: worst [%lld, %lld] got %.9g exact %.17g bound %.3g (err/bound %.3g)", what,
              k_variants[v].name, (long long)(wi / c->H), (long long)(wi % c->H),
              (double)load_as(c->dt, y, (size_t)wi), ref[wi], bound[wi], worst);
        if (vc != ctx) nb_context_destroy(vc);
    }
    static const int graph_variants[3] = {0, V_INLINE, NVARIANTS - 2};
    for (int gv = 0; graph && gv < 3; gv++) { /* 3. a graph replays it after the routing changed on the device:
                                               * the planner's path, inline routing and tc */
        const int v = graph_variants[gv];
        nb_context *vc = v == 0 ? ctx : variant_context(v);
        if (!vc) continue;
        fit_workspace(vc, &g, what);
        cudaStream_t s;
        GT_CUDA(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
        int32_t *ids2 = malloc(4 * (size_t)(c->m * c->K));
        float *tw2 = malloc(4 * (size_t)(c->m * c->K));
        mcase c2 = *c;
        c2.route = (c->route + 1) % 3;
        route(&c2, ids2, tw2);
        /* the direct result of the second routing */
        GT_CUDA(cudaMemcpy(g.ids, ids2, 4 * (size_t)(c->m * c->K), cudaMemcpyHostToDevice));
        GT_CUDA(cudaMemcpy(g.tw, tw2, 4 * (size_t)(c->m * c->K), cudaMemcpyHostToDevice));
        CHECK(run(vc, &g, s) == NB_OK, "moe %s: direct call: %s", what, nb_last_error());
        void *y2 = malloc(g.y_bytes), *y3 = malloc(g.y_bytes);
        GT_CUDA(cudaStreamSynchronize(s));
        GT_CUDA(cudaMemcpy(y2, g.y, g.y_bytes, cudaMemcpyDeviceToHost));
        /* capture with the first routing in place, then rewrite the routing and replay */
        GT_CUDA(cudaMemcpy(g.ids, p.ids, 4 * (size_t)(c->m * c->K), cudaMemcpyHostToDevice));
        GT_CUDA(cudaMemcpy(g.tw, p.tw, 4 * (size_t)(c->m * c->K), cudaMemcpyHostToDevice));
        cudaGraph_t graph_;
        cudaGraphExec_t exec;
        GT_CUDA(cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal));
        st = run(vc, &g, s);
        GT_CUDA(cudaStreamEndCapture(s, &graph_));
        CHECK(st == NB_OK, "moe %s: capture: %s", what, nb_last_error());
        GT_CUDA(cudaGraphInstantiate(&exec, graph_, 0));
        GT_CUDA(cudaMemcpy(g.ids, ids2, 4 * (size_t)(c->m * c->K), cudaMemcpyHostToDevice));
        GT_CUDA(cudaMemcpy(g.tw, tw2, 4 * (size_t)(c->m * c->K), cudaMemcpyHostToDevice));
        GT_CUDA(cudaMemset(g.y, 0xFF, g.y_bytes));
        GT_CUDA(cudaGraphLaunch(exec, s));
        GT_CUDA(cudaStreamSynchronize(s));
        GT_CUDA(cudaMemcpy(y3, g.y, g.y_bytes, cudaMemcpyDeviceToHost));
        CHECK(!memcmp(y2, y3, g.y_bytes), "moe %s [%s]: graph replay after a routing change differs from a direct "
              "call", what, k_variants[v].name);
        GT_CUDA(cudaGraphExecDestroy(exec));
        GT_CUDA(cudaGraphDestroy(graph_));
        GT_CUDA(cudaStreamDestroy(s));
        free(ids2), free(tw2), free(y2), free(y3);
        if (vc != ctx) nb_context_destroy(vc);
    }
    free(y), free(y0), free(ref), free(bound);
    gpu_release(&g);
    release(&p);
}

/* 4. a NaN in token t's activations: token t's outputs all NaN, no other's */
static void check_nan_gpu(nb_context *ctx) {
    mcase c = {NB_FORMAT_MXFP4, 16, 4, 6, 128, 64, NB_MOE_ACT_SWIGLU, NB_DTYPE_BF16, 0, ROUTE_UNIFORM};
    mprob p;
    if (!make(&c, &p)) return;
    ((uint16_t *)p.x)[2 * c.H + 5] = 0x7FC0; /* token 2 */
    gpu_moe g;
    if (gpu_setup(ctx, &p, &g, "nan")) {
        CHECK(run(ctx, &g, NULL) == NB_OK, "nan: %s", nb_last_error());
        uint16_t *y = malloc(g.y_bytes);
        GT_CUDA(cudaMemcpy(y, g.y, g.y_bytes, cudaMemcpyDeviceToHost));
        int ok = 1;
        for (int64_t t = 0; t < c.m; t++)
            for (int64_t j = 0; j < c.H; j++) {
                const int nan = isnan(ref_bf16_to_f32(y[t * c.H + j]));
                if (nan != (t == 2)) ok = 0;
            }
        CHECK(ok, "nan: exactly token 2's outputs are NaN");
        free(y);
        gpu_release(&g);
    }
    release(&p);
}

/* 4b. routing ids outside [0, E): inline routing gives the four-kernel
 * call's bytes; with no id inside, y is 0 */
static void check_invalid_ids_gpu(nb_context *ctx) {
    mcase c = {NB_FORMAT_NVFP4, 16, 4, 3, 64, 32, NB_MOE_ACT_SWIGLU_OAI, NB_DTYPE_BF16, 1, ROUTE_UNIFORM};
    for (int all = 0; all < 2; all++) {
        mprob p;
        if (!make(&c, &p)) return;
        for (int64_t i = 0; i < c.m * c.K; i++)
            if (all || i % 5 == 1) p.ids[i] = i % 2 ? -1 : (int32_t)c.E + (int32_t)i; /* outside [0, E) */
        gpu_moe g;
        nb_context *ic = variant_context(V_INLINE), *kc = variant_context(V_LAYOUT_KERNEL);
        if (ic && kc && gpu_setup(ctx, &p, &g, "invalid ids")) {
            uint16_t *y[2] = {malloc(g.y_bytes), malloc(g.y_bytes)};
            for (int v = 0; v < 2; v++) {
                GT_CUDA(cudaMemset(g.y, 0xFF, g.y_bytes)); /* NaN poison */
                CHECK(run(v ? kc : ic, &g, NULL) == NB_OK, "invalid ids: %s", nb_last_error());
                char cfg[256];
                nb_gemm_last_config(v ? kc : ic, cfg, sizeof cfg);
                CHECK(strstr(cfg, v ? "routing=kernel" : "routing=inline") != NULL, "invalid ids: config %s", cfg);
                GT_CUDA(cudaMemcpy(y[v], g.y, g.y_bytes, cudaMemcpyDeviceToHost));
            }
            int finite = 1, zero = 1;
            for (int64_t i = 0; i < c.m * c.H; i++) {
                const float f = ref_bf16_to_f32(y[0][i]);
                finite &= isfinite(f);
                zero &= f == 0.0f;
            }
            CHECK(finite && !memcmp(y[0], y[1], g.y_bytes), "invalid ids (%s): inline routing gives the layout "
                  "kernel's bytes", all ? "all" : "some");
            if (all) CHECK(zero, "invalid ids: no id in [0, E): y is 0");
            free(y[0]), free(y[1]);
            gpu_release(&g);
        }
        if (ic) nb_context_destroy(ic);
        if (kc) nb_context_destroy(kc);
        release(&p);
    }
}

/* 5. refusals */
static void check_refusals(nb_context *ctx) {
    mcase c = {NB_FORMAT_NVFP4, 8, 2, 4, 64, 32, NB_MOE_ACT_SWIGLU, NB_DTYPE_BF16, 0, ROUTE_UNIFORM};
    mprob p;
    if (!make(&c, &p)) return;
    gpu_moe g;
    if (gpu_setup(ctx, &p, &g, "refusals")) {
        nb_moe_desc unpacked = p.d;
        CHECK(nb_moe_mlp(ctx, &unpacked, g.x, &g.w, g.ids, g.tw, g.y, g.ws, g.ws_bytes, NULL) ==
                  NB_ERR_INVALID_ARGUMENT, "refusals: checkpoint layout (%s)", nb_last_error());
        CHECK(nb_moe_mlp(ctx, &g.d, g.x, &g.w, g.ids, g.tw, g.y, g.ws, g.ws_bytes - 1, NULL) == NB_ERR_WORKSPACE,
              "refusals: short workspace (%s)", nb_last_error());
        CHECK(nb_moe_mlp(ctx, &g.d, NULL, &g.w, g.ids, g.tw, g.y, g.ws, g.ws_bytes, NULL) == NB_ERR_NULL_POINTER,
              "refusals: NULL x (%s)", nb_last_error());
        CHECK(nb_moe_mlp(ctx, &g.d, (char *)g.x + 2, &g.w, g.ids, g.tw, g.y, g.ws, g.ws_bytes, NULL) ==
                  NB_ERR_MISALIGNED, "refusals: misaligned x (%s)", nb_last_error());
        nb_moe_packed_weights w2 = g.w;
        w2.down_scales = NULL;
        CHECK(nb_moe_mlp(ctx, &g.d, g.x, &w2, g.ids, g.tw, g.y, g.ws, g.ws_bytes, NULL) == NB_ERR_NULL_POINTER,
              "refusals: NVFP4 without down tensor scales (%s)", nb_last_error());
        nb_moe_align_sizes as;
        nb_moe_align_get_sizes(&g.d, 8, &as);
        int32_t *buf;
        GT_CUDA(cudaMalloc((void **)&buf, 4 * (size_t)(as.sorted_len + as.blocks + as.offsets_len)));
        nb_moe_align_sizes small = as;
        small.blocks--;
        CHECK(nb_moe_align(ctx, &g.d, 8, g.ids, buf, buf + as.sorted_len, buf + as.sorted_len + as.blocks, NULL,
                           &small, NULL) == NB_ERR_BUFFER_TOO_SMALL, "refusals: align capacity short (%s)",
              nb_last_error());
        CHECK(nb_moe_align(ctx, &g.d, 0, g.ids, buf, buf + as.sorted_len, buf + as.sorted_len + as.blocks, NULL, &as,
                           NULL) == NB_ERR_INVALID_ARGUMENT, "refusals: align block 0 (%s)", nb_last_error());
        CHECK(nb_moe_align(ctx, &g.d, 8, NULL, buf, buf + as.sorted_len, buf + as.sorted_len + as.blocks, NULL, &as,
                           NULL) == NB_ERR_NULL_POINTER, "refusals: align without topk_ids (%s)", nb_last_error());
        GT_CUDA(cudaFree(buf));
        nb_moe_desc f32 = g.d;
        f32.act_dtype = NB_DTYPE_F32;
        CHECK(nb_moe_mlp(ctx, &f32, g.x, &g.w, g.ids, g.tw, g.y, g.ws, g.ws_bytes, NULL) == NB_ERR_UNSUPPORTED,
              "refusals: F32 activations (%s)", nb_last_error());
        gpu_release(&g);
    }
    release(&p);
}

/* ------------------------------------------------------ 6. nb_glu */

/* The 16-bit value v as an integer that orders like the value (for counting
 * ulps between two finite values of one dtype). */
static int32_t ordered16(uint16_t v) { return v & 0x8000 ? -(int32_t)(v & 0x7FFF) : (int32_t)v; }

static int64_t g_glu_elems, g_glu_ulp;

/* nb_glu against nb_glu_host on one problem (gu and h placed at byte offset
 * `off` of their buffers: 2 leaves the 16-byte loads for one value at a
 * time): NaN where the host has NaN, elsewhere equal or one ulp apart. */
static void check_glu_one(nb_context *ctx, nb_moe_activation act, int layout, nb_dtype dt, int64_t m, int64_t n,
                          int special, size_t off) {
    nb_glu_desc d;
    char what[112], suffix[32];
    snprintf(suffix, sizeof suffix, " off=%zu%s", off, special ? " +nan/inf" : "");
    if (!glu_desc(&d, act, layout, dt, m, n, "nb_glu", suffix, what, sizeof what)) return;
    const size_t gb = (size_t)(m * 2 * n) * 2, hb = (size_t)(m * n) * 2;
    uint16_t *gu = glu_input(&d, special), *want = malloc(hb), *got = malloc(hb);
    char *dgu = NULL, *dh = NULL;
    GT_CUDA(cudaMalloc((void **)&dgu, gb + 16));
    GT_CUDA(cudaMalloc((void **)&dh, hb + 16));
    GT_CUDA(cudaMemcpy(dgu + off, gu, gb, cudaMemcpyHostToDevice));
    GT_CUDA(cudaMemset(dh, 0xFF, hb + 16));
    nb_status st = nb_glu_host(ctx, &d, gu, want);
    CHECK(st == NB_OK, "%s: nb_glu_host: %s", what, nb_last_error());
    if (st == NB_OK) st = nb_glu(ctx, &d, dgu + off, dh + off, NULL);
    CHECK(st == NB_OK, "%s: %s", what, nb_last_error());
    if (st == NB_OK) {
        GT_CUDA(cudaDeviceSynchronize());
        GT_CUDA(cudaMemcpy(got, dh + off, hb, cudaMemcpyDeviceToHost));
        uint16_t edge[16];
        GT_CUDA(cudaMemcpy(edge, dh + off + hb, 16 - off, cudaMemcpyDeviceToHost));
        int untouched = 1;
        for (size_t i = 0; i < (16 - off) / 2; i++) untouched &= edge[i] == 0xFFFF;
        int64_t nan_wrong = 0, far = 0, ulp = 0;
        for (int64_t i = 0; i < m * n; i++) {
            const float a = load_as(dt, want, (size_t)i), b = load_as(dt, got, (size_t)i);
            if (isnan(a) || isnan(b)) {
                nan_wrong += isnan(a) != isnan(b);
                continue;
            }
            const int32_t dist = abs(ordered16(want[i]) - ordered16(got[i]));
            ulp += dist == 1;
            far += dist > 1 || (isinf(a) != isinf(b));
        }
        g_glu_elems += m * n;
        g_glu_ulp += ulp;
        CHECK(nan_wrong == 0 && far == 0 && untouched, "%s: %lld NaN mismatches, %lld elements more than one ulp from "
              "the host's, %s past h", what, (long long)nan_wrong, (long long)far, untouched ? "nothing written" :
              "bytes written");
    }
    GT_CUDA(cudaFree(dgu));
    GT_CUDA(cudaFree(dh));
    free(gu), free(want), free(got);
}

static void check_glu_gpu(nb_context *ctx) {
    static const nb_dtype dts[2] = {NB_DTYPE_BF16, NB_DTYPE_F16};
    /* n % 8 == 0 (16-byte loads) and not; an 8B MLP row (14336) and many rows */
    static const int64_t shapes[6][2] = {{1, 8}, {1, 14336}, {3, 1001}, {33, 2880}, {2, 12}, {300, 768}};
    for (int a = 0; a < 2; a++)
        for (int l = 0; l < 2; l++)
            for (int t = 0; t < 2; t++)
                for (int s = 0; s < 6; s++)
                    check_glu_one(ctx, a ? NB_MOE_ACT_SWIGLU_OAI : NB_MOE_ACT_SWIGLU,
                                  l ? NB_MOE_GATE_UP_INTERLEAVED : NB_MOE_GATE_UP_CONCAT, dts[t], shapes[s][0],
                                  shapes[s][1], s % 2, (size_t)((a + l + s) % 3 == 2 ? 2 : 0));
    /* refusals */
    nb_glu_desc d;
    nb_glu_desc_init(&d, NB_MOE_ACT_SWIGLU, 2, 64, NB_DTYPE_BF16);
    char *buf = NULL;
    GT_CUDA(cudaMalloc((void **)&buf, 4096));
    CHECK(nb_glu(ctx, &d, buf, buf + 1024 + 1, NULL) == NB_ERR_MISALIGNED, "nb_glu: odd h (%s)", nb_last_error());
    CHECK(nb_glu(ctx, &d, buf, buf + 256, NULL) == NB_ERR_INVALID_ARGUMENT, "nb_glu: h inside gu (%s)",
          nb_last_error());
    CHECK(nb_glu(ctx, &d, NULL, buf, NULL) == NB_ERR_NULL_POINTER, "nb_glu: NULL gu (%s)", nb_last_error());
    nb_glu_desc f32 = d;
    f32.dtype = NB_DTYPE_F32;
    CHECK(nb_glu(ctx, &f32, buf, buf + 2048, NULL) == NB_ERR_UNSUPPORTED, "nb_glu: F32 (%s)", nb_last_error());
    GT_CUDA(cudaFree(buf));
    printf("nb_glu: %lld elements, %lld one ulp from the host's (the rest equal)\n", (long long)g_glu_elems,
           (long long)g_glu_ulp);
}

int main(int argc, char **argv) {
    int quick = 0, small = 0;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--quick")) quick = 1;
        else if (!strcmp(argv[i], "--small")) small = 1;
        else {
            fprintf(stderr, "usage: test_gpu_moe [--quick] [--small]\n");
            return 2;
        }
    }
    gt_need_device("test_gpu_moe");
    nb_context *ctx = NULL;
    if (nb_context_create(0, &ctx) != NB_OK) {
        printf("test_gpu_moe: no device context (%s), skipped\n", nb_last_error());
        return 77;
    }
    static const int32_t blocks[4] = {1, 8, 32, 100};
    for (int r = 0; r < 3; r++)
        for (int b = 0; b < 4; b++) {
            mcase c = {NB_FORMAT_MXFP4, (int[]){8, 32, 128, 16}[b], (int[]){1, 4, 8, 2}[b],
                       (int64_t[]){1, 7, 300, 64}[b], 64, 32, NB_MOE_ACT_SWIGLU, NB_DTYPE_BF16, 0, r};
            check_align_gpu(ctx, &c, blocks[b]);
        }
    /* the sweep: m picks the routing block (8 slots per expert and less: 8; 16: 16; more: 32) */
    static const nb_format fmts[2] = {NB_FORMAT_NVFP4, NB_FORMAT_MXFP4};
    static const nb_dtype dts[2] = {NB_DTYPE_BF16, NB_DTYPE_F16};
    static const int Es[5] = {8, 16, 32, 64, 128};
    static const int Ks[4] = {1, 2, 4, 8};
    static const int64_t ms[7] = {1, 2, 5, 16, 33, 100, 300};
    static const int64_t shapes[4][2] = {{64, 32}, {288, 96}, {160, 64}, {256, 128}}; /* H, I */
    int n = 0;
    for (int i = 0; i < (quick ? 40 : 140); i++) {
        mcase c = {fmts[i % 2], Es[(i / 2) % 5], Ks[(i / 3) % 4], ms[(i / 5) % 7], 0, 0,
                   (i / 7) % 2 ? NB_MOE_ACT_SWIGLU_OAI : NB_MOE_ACT_SWIGLU, dts[(i / 11) % 2], (i / 13) % 2,
                   (i / 4) % 3};
        const int si = (i / 17) % 4;
        c.H = shapes[si][0];
        c.I = shapes[si][1];
        if (c.fmt == NB_FORMAT_NVFP4 && c.H == 288) c.H = 272; /* (any multiple of 16) */
        if (c.K > c.E) c.K = c.E;
        check_mlp(ctx, &c, i % 10 == 0);
        n++;
    }
    { /* more tensor-core tiles than SMs with tokens (the persistent grid: a CTA walks several tiles through one
       * ring, its epilogues staged in the held stage): 2400 slots over 8 experts, 3 (128-token) or 5 (64-token)
       * routing blocks each, gate_up 8 and down 6 row tiles */
        mcase c = {NB_FORMAT_NVFP4, 8, 2, 1200, 768, 512, NB_MOE_ACT_SWIGLU_OAI, NB_DTYPE_BF16, 1, ROUTE_UNIFORM};
        check_mlp(ctx, &c, 1);
        n++;
    }
    if (!small) { /* m = 4096 (the tensor-core tiles' largest routing here): 32 experts, top-4, skewed onto 8 of
                   * them (24 without a token, ragged counts); small H and I keep the host reference about 1.6 G
                   * double products */
        mcase c = {NB_FORMAT_NVFP4, 32, 4, 4096, 256, 128, NB_MOE_ACT_SWIGLU, NB_DTYPE_BF16, 0, ROUTE_SKEWED};
        check_mlp(ctx, &c, 1);
        n++;
    }
    if (!small) { /* gpt-oss's layer shape (H = I = 2880, top-4, interleaved with biases), 8 experts to keep the host reference small */
        mcase c = {NB_FORMAT_MXFP4, 8, 4, 3, 2880, 2880, NB_MOE_ACT_SWIGLU_OAI, NB_DTYPE_BF16, 1, ROUTE_UNIFORM};
        check_mlp(ctx, &c, 1);
        n++;
    }
    check_nan_gpu(ctx);
    check_invalid_ids_gpu(ctx);
    check_refusals(ctx);
    check_glu_gpu(ctx);
    char cfg[256];
    nb_gemm_last_config(ctx, cfg, sizeof cfg);
    printf("%d MoE problems on the GPU; largest error / bound %.3g; last: %s\n", n, g_worst_gpu, cfg);
    nb_context_destroy(ctx);
    printf("%d passed, %d failed\n", g_pass, g_fail);
    return g_fail ? 1 : 0;
}
