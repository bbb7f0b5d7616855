/* device.c - the device entry points: argument checks, where a GEMM's
 * configuration comes from (a per-call configuration, NIBBLE_PATH, the
 * tuning table or the heuristic; precedence in nibble.h "tuning"), the plan
 * (plan.c), the launch of the kernel family it names (src/cuda), and what
 * ran (nb_gemm_last_config). */
#include "internal.h"

#include <stdio.h>
#include <string.h>

/* Checks the device calls on a checkpoint-layout weight share; `every`:
 * the call needs a kernel family only NBI_KERNEL_FORMATS have (dequantize),
 * else nb_pack's (NBI_DECODE_FORMATS too). */
static nb_status device_args(nb_context *ctx, const nb_weight_desc *desc, const void *a, const void *b, const void *c,
                             const char *fn, const char *names, int every) {
    nb_status st = nbi_need_device(ctx, fn);
    if (st) return st;
    if ((st = nbi_check_desc(ctx, desc, NB_LAYOUT_CHECKPOINT))) return st;
    if (!a || !b || !c) return nbi_fail(ctx, NB_ERR_NULL_POINTER, "%s: %s must not be NULL", fn, names);
    const nbi_format_traits *t = nbi_traits(desc->format);
    if (every ? !t->every_kernel : !t->kernels)
        return nbi_fail(ctx, NB_ERR_UNSUPPORTED, "%s: no GPU kernel serves %s weights%s", fn, t->name,
                        t->kernels ? " here (nb_pack and nb_gemm do)" : "");
    return NB_OK;
}

nb_status nb_dequantize(nb_context *ctx, const nb_weight_desc *desc, const uint8_t *codes, const uint8_t *scales,
                        nb_dtype dst_dtype, void *dst, void *stream) {
    static const char fn[] = "nb_dequantize";
    nb_status st = device_args(ctx, desc, codes, scales, dst, fn, "codes, scales and dst", 1);
    if (st) return st;
    if (!nbi_dtype_size(dst_dtype))
        return nbi_fail(ctx, NB_ERR_UNSUPPORTED, "nb_dequantize: unknown destination dtype %d", (int)dst_dtype);
    if ((st = nbi_cuda_dequantize(ctx, desc, codes, scales, dst_dtype, dst, stream))) return nbi_reraise(ctx, st, fn);
    return NB_OK;
}

static nb_status pack_common(nb_context *ctx, nb_weight_desc *desc, const nb_weight_data *w, void *packed,
                             size_t packed_bytes, void *stream, const char *fn) {
    if ((uintptr_t)packed % 16) return nbi_fail(ctx, NB_ERR_MISALIGNED, "%s: packed must be 16-byte aligned", fn);
    nb_weight_sizes_v2 sz;
    nb_status st = nbi_packed_size(ctx, desc, packed_bytes, &sz, fn);
    if (st) return st;
    const nbi_format_traits *t = nbi_traits(desc->format);
    const uint8_t *codes = (const uint8_t *)w->codes, *scales = (const uint8_t *)w->scales;
    int32_t emin = -1, emax = -1;
    if (t->element == NB_ELEMENT_E2M1)
        st = nbi_cuda_pack(ctx, desc, codes, scales, packed, &emin, &emax, stream);
    else
        st = nbi_cuda_pack_int(ctx, desc, codes, scales, (const uint8_t *)w->zeros, packed, &emin, &emax, stream);
    if (st) return nbi_reraise(ctx, st, fn);
    desc->layout = NB_LAYOUT_PACKED;
    if (desc->scale_type == NB_SCALE_E8M0 || t->zero_point == NB_ZERO_U8) { /* scale exponent or zero-point range */
        desc->scale_exp_min = emin;
        desc->scale_exp_max = emax;
    }
    return NB_OK;
}

nb_status nb_pack(nb_context *ctx, nb_weight_desc *desc, const uint8_t *codes, const uint8_t *scales, void *packed,
                  size_t packed_bytes, void *stream) {
    static const char fn[] = "nb_pack";
    nb_status st = device_args(ctx, desc, codes, scales, packed, fn, "codes, scales and packed", 0);
    if (st) return st;
    const nbi_format_traits *t = nbi_traits(desc->format);
    if (t->zero_point != NB_ZERO_NONE)
        return nbi_fail(ctx, NB_ERR_UNSUPPORTED, "%s: %s weights carry zero points; use %s_v2", fn, t->name, fn);
    const nb_weight_data w = {.codes = codes, .scales = scales};
    return pack_common(ctx, desc, &w, packed, packed_bytes, stream, fn);
}

nb_status nb_pack_v2(nb_context *ctx, nb_weight_desc *desc, const nb_weight_data *w, void *packed,
                     size_t packed_bytes, void *stream) {
    static const char fn[] = "nb_pack_v2";
    if (!w) {
        nb_status st = nbi_need_device(ctx, fn);
        return st ? st : nbi_fail(ctx, NB_ERR_NULL_POINTER, "%s: w is NULL", fn);
    }
    nb_status st = device_args(ctx, desc, w->codes, w->scales, packed, fn, "codes, scales and packed", 0);
    if (st) return st;
    const nbi_format_traits *t = nbi_traits(desc->format);
    for (int i = 0; i < 4; i++)
        if (w->reserved[i])
            return nbi_fail(ctx, NB_ERR_INVALID_ARGUMENT, "%s: the buffers' reserved pointers must be NULL", fn);
    if ((t->zero_point != NB_ZERO_NONE) != (w->zeros != NULL))
        return nbi_fail(ctx, w->zeros ? NB_ERR_INVALID_ARGUMENT : NB_ERR_NULL_POINTER,
                        "%s: %s weights %s: zeros must %sbe NULL", fn, t->name,
                        w->zeros ? "have no zero points" : "carry zero points", w->zeros ? "" : "not ");
    return pack_common(ctx, desc, w, packed, packed_bytes, stream, fn);
}

/* ------------------------------------------------------------------ gemm */

/* The plan for g: the request from the first source that applies (cfg, the
 * environment, the table), else the heuristic.  A table entry this device
 * cannot run gives way to the heuristic; a configuration the caller or the
 * environment asked for is an error when it cannot run. */
static nb_status plan_for(nb_context *ctx, const nb_gemm_desc *g, const nb_gemm_config *cfg, nbi_gemm_plan *p,
                          const char *fn) {
    nb_status st = nbi_need_device(ctx, fn);
    if (st) return st;
    if (!g) return nbi_fail(ctx, NB_ERR_NULL_POINTER, "%s: gemm descriptor is NULL", fn);
    if (cfg) {
        char why[200];
        if (!nbi_config_check(cfg, 0, 0, why, sizeof why))
            return nbi_fail(ctx, NB_ERR_INVALID_ARGUMENT, "%s: configuration: %s", fn, why);
        const nbi_request rq = nbi_request_of(cfg);
        st = nbi_plan(ctx, g, &rq, p);
        p->source = NBI_FROM_CALL;
        return st;
    }
    if (ctx->env_path) {
        const nbi_request rq = {.path = ctx->env_path};
        st = nbi_plan(ctx, g, &rq, p);
        p->source = NBI_FROM_ENV;
        return st;
    }
    nb_gemm_config entry;
    if (g->m >= 1 && nbi_tune_lookup(ctx, g->weight.format, g->act_dtype, g->weight.n, g->weight.k, g->m, &entry)) {
        const nbi_request rq = nbi_request_of(&entry);
        if (nbi_plan(ctx, g, &rq, p) == NB_OK) {
            p->source = NBI_FROM_TABLE;
            return NB_OK;
        }
    }
    st = nbi_plan(ctx, g, NULL, p);
    p->source = NBI_FROM_HEURISTIC;
    return st;
}

nb_status nb_gemm_can_implement(nb_context *ctx, const nb_gemm_desc *g) {
    nbi_gemm_plan p;
    return plan_for(ctx, g, NULL, &p, "nb_gemm");
}

nb_status nb_gemm_workspace_size_ex(nb_context *ctx, const nb_gemm_desc *g, const nb_gemm_config *cfg,
                                    size_t *bytes) {
    static const char fn[] = "nb_gemm_workspace_size";
    if (!bytes) return nbi_fail(ctx, NB_ERR_NULL_POINTER, "%s: bytes is NULL", fn);
    nbi_gemm_plan p;
    nb_status st = plan_for(ctx, g, cfg, &p, fn); /* the real m: report its own errors */
    if (st) return st;
    size_t most = nbi_plan_workspace(ctx, &p);
    /* Without a configuration: the largest need over every m, so that one
     * workspace serves a layer at any batch size (the split depends on the
     * kernel chosen for m, and a table entry may choose per m bucket).  With
     * one: g->m, and the last slice of 32 rows the decode path runs
     * separately. */
    int64_t ms[64];
    int count = 0;
    if (!cfg) count = nbi_tune_workspace_ms(ms, 64);
    else if (p.path == NBI_PATH_GEMV && g->m > 32 && g->m % 32) ms[count++] = g->m % 32;
    for (int i = 0; i < count; i++) {
        nb_gemm_desc h = *g;
        h.m = ms[i];
        if (plan_for(ctx, &h, cfg, &p, fn) != NB_OK) continue;
        const size_t need = nbi_plan_workspace(ctx, &p);
        if (need > most) most = need;
    }
    *bytes = most;
    return NB_OK;
}

nb_status nb_gemm_workspace_size(nb_context *ctx, const nb_gemm_desc *g, size_t *bytes) {
    return nb_gemm_workspace_size_ex(ctx, g, NULL, bytes);
}

/* ctx->last_config: the kernel, its template parameters and grid, and who
 * chose it. */
static void describe(nb_context *ctx, const nbi_gemm_plan *p, int64_t m) {
    const nbi_format_traits *t = nbi_traits(p->fmt);
    const char *act = nbi_dtype_name(p->act);
    char fmt[40]; /* the integer formats' kernel group is a template parameter too */
    if (t->element == NB_ELEMENT_E2M1) snprintf(fmt, sizeof fmt, "%s", t->name);
    else snprintf(fmt, sizeof fmt, "%s,group=%d", t->name, p->group);
    char rows[32] = ""; /* kernel 1's balanced wave */
    if (p->k1_rows) snprintf(rows, sizeof rows, " (%d active)", p->k1_rows * p->kw);
    char *b = ctx->last_config;
    const size_t n = sizeof ctx->last_config;
    if (p->path == NBI_PATH_SM80)
        snprintf(b, n, "gemm_sm80<%s,%s,128x%d,stages=%d> tiles=%dx%d raster=%d launches=1", fmt, act, p->bn,
                 p->stages, p->tiles_n, p->tiles_m, p->raster_group);
    else if (p->path == NBI_PATH_SM90) {
        char tail[64] = "";
        if (p->tail_tiles)
            snprintf(tail, sizeof tail, " tail=%d tiles x k-split %d", p->tail_tiles, p->tail_splits);
        else if (p->sk)
            snprintf(tail, sizeof tail, " stream-k ctas=%d", p->grid_x);
        snprintf(b, n, "gemm_sm90<%s,%s,%dx%d> tiles=%dx%d k-split=%d%s%s raster=%d launches=%d", fmt, act,
                 64 * p->cwg, p->bn, p->tiles_n, p->tiles_m, p->splits, p->cluster ? " (cluster)" : "", tail,
                 p->raster_group, p->tail_tiles ? 2 : 1);
    } else if (nbi_plan_stream_k(p))
        snprintf(b, n, "gemv_fp4_xs<%s,%s,mt=%d,rows/warp=%d%s> stream-k ctas=%d over tiles=%d x kchunks=%lld "
                 "warps=%d chunks/cta=%d launches=%lld", fmt, act, p->mt, p->rpw * 16, p->xsh == 2 ? ",cta/sm=1" : "",
                 p->grid_x, p->tiles_n, (long long)p->kchunks, p->warps, p->chunks_per_split,
                 (long long)((m + 31) / 32));
    else if (p->xsh)
        snprintf(b, n, "gemv_fp4_xs<%s,%s,mt=%d,rows/warp=%d%s> grid=%dx%d warps=%d k-split=1x%d chunks/cta=%d "
                 "launches=%lld", fmt, act, p->mt, p->rpw * 16,
                 p->xsh == 2 ? ",cta/sm=1" : p->per_sm == 2 ? ",ctas/sm=2" : "", p->grid_x, p->splits,
                 p->warps, p->splits,
                 p->chunks_per_split, (long long)((m + 31) / 32));
    else
        snprintf(b, n, "gemv_fp4<%s,%s,mt=%d%s> grid=%dx%d warps=%d%s k-split=%dx%d chunks/warp=%d launches=%lld",
                 fmt, act, p->mt, p->per_sm == 2 ? ",ctas/sm=2" : "", p->grid_x, p->splits, p->warps,
                 rows, p->kw, p->splits, (p->chunks_per_split + p->kw - 1) / p->kw,
                 (long long)((m + 31) / 32));
    static const char *const from[4] = {"", " tuned", " (NIBBLE_PATH)", " (given)"};
    const size_t len = strlen(b);
    snprintf(b + len, n - len, "%s", from[p->source]);
}

/* The decode kernels for m > 32: one launch per slice of 32 rows (the
 * weights are re-read per slice; the tensor-core paths are the right tool
 * there); a short last slice gets its own plan (kernel and split depend on
 * m). */
static nb_status run_decode(nb_context *ctx, const nb_gemm_desc *g, const nb_gemm_config *cfg, const nbi_gemm_plan *p,
                            const void *x, const void *packed, const void *bias, void *y, void *workspace,
                            void *stream) {
    const size_t es = nbi_dtype_size(g->act_dtype);
    for (int64_t m0 = 0; m0 < g->m; m0 += 32) {
        nbi_gemm_plan q = *p;
        if (g->m - m0 < 32) {
            nb_gemm_desc h = *g;
            h.m = g->m - m0;
            nb_status st = plan_for(ctx, &h, cfg, &q, "nb_gemm");
            if (st) return st;
        }
        q.pdl = m0 ? q.pdl_own : p->pdl; /* the first launch the call's choice, the others after its own */
        nb_status st = nbi_cuda_gemv(ctx, &q, (const char *)x + (size_t)(m0 * p->lda) * es, packed, bias,
                                     (char *)y + (size_t)(m0 * p->ldc) * es, workspace, stream);
        if (st) return nbi_reraise(ctx, st, "nb_gemm");
    }
    return NB_OK;
}

/* Programmatic dependent launch for a call's first launch.  It lets the
 * kernel start (request its first weights) while the kernel before it ends,
 * which pays between nibble's own calls (q, k and v back to back) but was
 * measured to cost where the kernel before is another library's: in a
 * compiled model step each fused projection sits between Inductor kernels,
 * and launching those calls without it made the step 1.9% faster (H200,
 * 8B shape, batch 1; NOTES.md, "Programmatic dependent launch in the model
 * step").  Under stream capture the graph says which node the launch will
 * follow: with NIBBLE_PDL unset or "auto" the call launches with it after
 * this context's own last launch (the one node it depends on), and after a
 * kernel that was itself launched with it (a programmatic edge into it), as
 * Inductor launches its Triton kernels under TORCHINDUCTOR_ENABLE_PDL=1:
 * those let their dependents launch once their loads are issued, so the
 * call's weight prologue overlaps them (the compiled 8B step with that
 * switch at batch 1 2.443 -> 2.398 ms, H200; NOTES.md "Inductor's
 * programmatic dependent launch").  A direct launch cannot know what
 * precedes it and keeps it.  Returns 0 (without), 1 (with: after an own
 * launch, or direct) or 2 (with: after another kernel that took it);
 * *capturing is set when the stream captures, so that the caller notes its
 * launch (note_own).  nb_glu takes the same rule (nbi_pdl_begin). */
static int pdl_head(nb_context *ctx, void *stream, int *capturing) {
    *capturing = 0;
    if (ctx->env_pdl == 2) return 1; /* NIBBLE_PDL=1 (with 0 the plan has no pdl: not called) */
    void *node = NULL;
    unsigned long long id = 0;
    const int tip = nbi_cuda_capture_tip(stream, &node, &id);
    if (tip < 0) return 1;
    *capturing = 1;
    if (tip >= 1 && node == ctx->own_node && id == ctx->own_capture) return 1;
    return tip == 2 ? 2 : 0;
}

/* Decode kernel 2 on its split grid (not its stream-K wave) at 2..8 tokens
 * (the m = 8 plans of 8192 -> 8192, 14336 -> 4096, 28672 -> 8192) was
 * measured slower with programmatic dependent launch where it meets another
 * kernel: the 8B set back to back at m = 8 took 67.6 us a pass with it and
 * 56.7 without (H200, NOTES.md "nb_glu, and programmatic dependent launch
 * around kernel 2's split grid"), where kernel 1 and the wave gain from it
 * and the same split grid repeated gains 5%.  So such a launch takes it only
 * after itself (the same plan: a signature, nonzero), and the launch after
 * it only if it is that same plan again; NIBBLE_PDL=1 takes it everywhere.
 * Returns the plan's signature, or 0 for every other plan. */
static int pdl_k2(const nbi_gemm_plan *p) {
    if (!(p->path == NBI_PATH_GEMV && p->xsh && !nbi_plan_stream_k(p) && p->m <= 8)) return 0;
    const int64_t f[12] = {p->fmt, p->act, p->m, p->n, p->k, p->grid_x, p->splits, p->xsh, p->rpw, p->mt, p->lda,
                           p->ldc};
    uint32_t h = 2166136261u;
    for (int i = 0; i < 12; i++) {
        h = (h ^ (uint32_t)f[i]) * 16777619u;
        h = (h ^ (uint32_t)((uint64_t)f[i] >> 32)) * 16777619u;
    }
    return (int)(h >> 1) | 1;
}

/* Whether a launch of signature sig (pdl_k2) may take programmatic
 * dependent launch after what precedes it (head: pdl_head's answer): after
 * this context's last launch under capture, when both signatures agree (0
 * and 0: neither is kernel 2's split grid); after another library's kernel,
 * or directly (which cannot see what precedes it), when sig is 0. */
static int pdl_k2_ok(const nb_context *ctx, int capturing, int head, int sig) {
    if (ctx->env_pdl == 2) return 1;
    return capturing && head == 1 ? ctx->own_k2 == sig : sig == 0;
}

/* After a call's launches under capture: the node the next call would
 * follow is this call's last (or none, after a failure). */
static void note_own(nb_context *ctx, void *stream, nb_status st) {
    void *node = NULL;
    unsigned long long id = 0;
    if (st || nbi_cuda_capture_tip(stream, &node, &id) < 1) node = NULL, id = 0;
    ctx->own_node = node;
    ctx->own_capture = id;
}

/* The two halves of the rules above around a call's launches (nb_gemm's,
 * nb_glu's): whether its first launch takes programmatic dependent launch
 * (want: the call would, sm_90+ and NIBBLE_PDL not 0; sig: its pdl_k2
 * signature, 0 for nb_glu), *capturing set when the stream captures; then,
 * after the launches, the call recorded as the context's last own launch. */
int nbi_pdl_begin(nb_context *ctx, void *stream, int want, int sig, int *capturing) {
    *capturing = 0;
    if (!want) return 0;
    const int head = pdl_head(ctx, stream, capturing);
    return head && pdl_k2_ok(ctx, *capturing, head, sig);
}

void nbi_pdl_end(nb_context *ctx, void *stream, int capturing, int sig, nb_status st) {
    if (!capturing) return;
    note_own(ctx, stream, st);
    ctx->own_k2 = sig;
}

nb_status nb_gemm_ex(nb_context *ctx, const nb_gemm_desc *g, const nb_gemm_config *cfg, const void *x,
                     const void *packed, const void *bias, void *y, void *workspace, size_t workspace_bytes,
                     void *stream) {
    static const char fn[] = "nb_gemm";
    nbi_gemm_plan p;
    nb_status st = plan_for(ctx, g, cfg, &p, fn);
    if (st) return st;
    if (!x || !packed || !y) return nbi_fail(ctx, NB_ERR_NULL_POINTER, "nb_gemm: x, packed and y must not be NULL");
    if ((uintptr_t)x % 16 || (uintptr_t)packed % 16)
        return nbi_fail(ctx, NB_ERR_MISALIGNED, "nb_gemm: x and packed must be 16-byte aligned");
    if ((uintptr_t)y % 2 || (bias && (uintptr_t)bias % 2))
        return nbi_fail(ctx, NB_ERR_MISALIGNED, "nb_gemm: y and bias must be 2-byte aligned");
    const size_t need = p.ws_partial_bytes + p.ws_counter_bytes;
    if (need && (!workspace || workspace_bytes < need))
        return nbi_fail(ctx, NB_ERR_WORKSPACE, "nb_gemm: workspace of %zu bytes needed, %zu given%s", need,
                        workspace_bytes, workspace ? "" : " (NULL)");
    if (need && (uintptr_t)workspace % 16)
        return nbi_fail(ctx, NB_ERR_MISALIGNED, "nb_gemm: workspace must be 16-byte aligned");
    int capturing = 0;
    const int sig = pdl_k2(&p);
    p.pdl = nbi_pdl_begin(ctx, stream, p.pdl, sig, &capturing);
    if (p.path == NBI_PATH_SM80) st = nbi_cuda_gemm_sm80(ctx, &p, x, packed, bias, y, stream);
    else if (p.path == NBI_PATH_SM90) st = nbi_cuda_gemm_sm90(ctx, &p, x, packed, bias, y, workspace, stream);
    else st = run_decode(ctx, g, cfg, &p, x, packed, bias, y, workspace, stream);
    nbi_pdl_end(ctx, stream, capturing, sig, st);
    if (st) return p.path == NBI_PATH_GEMV ? st : nbi_reraise(ctx, st, fn);
    describe(ctx, &p, g->m);
    return NB_OK;
}

nb_status nb_gemm(nb_context *ctx, const nb_gemm_desc *g, const void *x, const void *packed, const void *bias, void *y,
                  void *workspace, size_t workspace_bytes, void *stream) {
    return nb_gemm_ex(ctx, g, NULL, x, packed, bias, y, workspace, workspace_bytes, stream);
}

nb_status nb_gemm_last_config(const nb_context *ctx, char *buf, size_t buf_bytes) {
    if (!ctx || !buf) return nbi_fail(NULL, NB_ERR_NULL_POINTER, "nb_gemm_last_config: NULL argument");
    if (buf_bytes == 0) return nbi_fail(NULL, NB_ERR_BUFFER_TOO_SMALL, "nb_gemm_last_config: buf_bytes is 0");
    const char *cfg = ctx->last_config[0] ? ctx->last_config : "none";
    snprintf(buf, buf_bytes, "%s", cfg);
    if (strlen(cfg) >= buf_bytes)
        return nbi_fail(NULL, NB_ERR_BUFFER_TOO_SMALL, "nb_gemm_last_config: %zu bytes needed, %zu given (truncated)",
                        strlen(cfg) + 1, buf_bytes);
    return NB_OK;
}

nb_status nb_gemm_reference_device(nb_context *ctx, const nb_gemm_desc *g, const void *x, const uint8_t *codes,
                                   const uint8_t *scales, const void *bias, float *y, void *stream) {
    static const char fn[] = "nb_gemm_reference_device";
    nb_status st = nbi_need_device(ctx, fn);
    if (st) return st;
    if ((st = nbi_check_gemm(ctx, g, NB_LAYOUT_CHECKPOINT, true))) return st;
    if (!x || !codes || !scales || !y)
        return nbi_fail(ctx, NB_ERR_NULL_POINTER, "%s: x, codes, scales and y must not be NULL", fn);
    if (!nbi_traits(g->weight.format)->every_kernel)
        return nbi_fail(ctx, NB_ERR_UNSUPPORTED, "%s: no GPU kernel serves %s weights here", fn,
                        nbi_traits(g->weight.format)->name);
    if ((st = nbi_cuda_gemm_naive(ctx, g, x, codes, scales, bias, y, stream))) return nbi_reraise(ctx, st, fn);
    return NB_OK;
}
