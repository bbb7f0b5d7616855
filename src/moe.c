/* moe.c - mixture-of-experts on the host: the problem descriptor and its
 * validation, the routing layout (nb_moe_align_host) and the reference MoE
 * MLP in float and in double (nibble.h, "mixture of experts", is the
 * specification; this file follows it step by step).
 *
 * The reference runs expert by expert, as the grouped GEMM will: each
 * routed expert is dequantized once, every slot routed to it is computed
 * into its own row of a per-slot buffer, and the combine then walks each
 * token's slots in top-k order.  So the result is the same whatever order
 * the experts run in, which is the determinism the kernels must keep. */
#include "internal.h"

#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

/* Largest m, H, I: the bound of nbi_check_desc's dimensions. */
#define NB_MOE_MAX_DIM ((int64_t)1 << 31)
#define NB_MOE_MAX_ELEMS ((double)((int64_t)1 << 50))
#define NB_MOE_MAX_BLOCK 4096

/* ------------------------------------------------------------ descriptor */

static int reserved_zero(const int32_t *r, size_t n) {
    for (size_t i = 0; i < n; i++)
        if (r[i]) return 0;
    return 1;
}

/* Every rule of nb_moe_desc_validate; messages start with fn. */
static nb_status check_moe(nb_context *ctx, const nb_moe_desc *d, const char *fn) {
    if (!d) return nbi_fail(ctx, NB_ERR_NULL_POINTER, "%s: the MoE descriptor is NULL", fn);
    if (!reserved_zero(d->reserved, sizeof d->reserved / sizeof d->reserved[0]))
        return nbi_fail(ctx, NB_ERR_INVALID_ARGUMENT, "%s: reserved fields must be zero (nb_moe_desc_init)", fn);
    if (d->m <= 0 || d->m > NB_MOE_MAX_DIM)
        return nbi_fail(ctx, NB_ERR_BAD_SHAPE, "%s: m = %lld must be in [1, 2^31]", fn, (long long)d->m);
    if (d->experts <= 0)
        return nbi_fail(ctx, NB_ERR_BAD_SHAPE, "%s: experts = %d must be positive", fn, (int)d->experts);
    if (d->top_k <= 0) return nbi_fail(ctx, NB_ERR_BAD_SHAPE, "%s: top_k = %d must be positive", fn, (int)d->top_k);
    if (d->top_k > d->experts)
        return nbi_fail(ctx, NB_ERR_INVALID_ARGUMENT, "%s: top_k = %d is larger than experts = %d (a token's experts "
                        "are distinct)", fn, (int)d->top_k, (int)d->experts);
    if (d->hidden <= 0 || d->intermediate <= 0 || d->hidden > NB_MOE_MAX_DIM || 2 * d->intermediate > NB_MOE_MAX_DIM)
        return nbi_fail(ctx, NB_ERR_BAD_SHAPE, "%s: hidden = %lld and intermediate = %lld must be in [1, 2^31] (2 x "
                        "intermediate too)", fn, (long long)d->hidden, (long long)d->intermediate);
    nb_status st = nbi_check_desc(ctx, &d->gate_up, 0);
    if (st) return nbi_fail(ctx, st, "%s: gate_up: %s", fn, nb_last_error());
    if ((st = nbi_check_desc(ctx, &d->down, 0))) return nbi_fail(ctx, st, "%s: down: %s", fn, nb_last_error());
    const int64_t H = d->hidden, I = d->intermediate;
    if (d->gate_up.n != 2 * I || d->gate_up.k != H || d->down.n != H || d->down.k != I)
        return nbi_fail(ctx, NB_ERR_BAD_SHAPE, "%s: gate_up is [%lld, %lld] and down [%lld, %lld]; hidden %lld and "
                        "intermediate %lld need [%lld, %lld] and [%lld, %lld]", fn, (long long)d->gate_up.n,
                        (long long)d->gate_up.k, (long long)d->down.n, (long long)d->down.k, (long long)H,
                        (long long)I, (long long)(2 * I), (long long)H, (long long)H, (long long)I);
    if (d->activation != NB_MOE_ACT_SWIGLU && d->activation != NB_MOE_ACT_SWIGLU_OAI)
        return nbi_fail(ctx, NB_ERR_INVALID_ARGUMENT, "%s: activation %d is not %d (swiglu) or %d (swiglu_oai)", fn,
                        (int)d->activation, NB_MOE_ACT_SWIGLU, NB_MOE_ACT_SWIGLU_OAI);
    if (d->gate_up_layout != NB_MOE_GATE_UP_CONCAT && d->gate_up_layout != NB_MOE_GATE_UP_INTERLEAVED)
        return nbi_fail(ctx, NB_ERR_INVALID_ARGUMENT, "%s: gate_up_layout %d is not %d (concat) or %d (interleaved)",
                        fn, (int)d->gate_up_layout, NB_MOE_GATE_UP_CONCAT, NB_MOE_GATE_UP_INTERLEAVED);
    if (d->activation == NB_MOE_ACT_SWIGLU_OAI) {
        if (!(d->limit > 0.0f && isfinite(d->limit)) || !(d->alpha > 0.0f && isfinite(d->alpha)))
            return nbi_fail(ctx, NB_ERR_INVALID_ARGUMENT, "%s: swiglu_oai needs a positive finite limit and alpha "
                            "(got %g and %g; gpt-oss: 7 and 1.702)", fn, (double)d->limit, (double)d->alpha);
    } else if (d->limit != 0.0f || d->alpha != 0.0f) {
        return nbi_fail(ctx, NB_ERR_INVALID_ARGUMENT, "%s: swiglu has no limit or alpha (got %g and %g; they must be "
                        "0)", fn, (double)d->limit, (double)d->alpha);
    }
    if (!nbi_dtype_size(d->act_dtype))
        return nbi_fail(ctx, NB_ERR_UNSUPPORTED, "%s: unknown act_dtype %d", fn, (int)d->act_dtype);
    const double slots = (double)d->m * (double)d->top_k;
    if (slots > (double)INT32_MAX)
        return nbi_fail(ctx, NB_ERR_OVERFLOW, "%s: m x top_k = %.0f slots do not fit int32 routing indices", fn, slots);
    if (slots * (double)H > NB_MOE_MAX_ELEMS || (double)d->experts * 2.0 * (double)I > NB_MOE_MAX_ELEMS)
        return nbi_fail(ctx, NB_ERR_OVERFLOW, "%s: m x top_k x hidden or experts x 2 x intermediate exceeds 2^50 "
                        "elements", fn);
    /* one expert's buffers are at most 2^50 elements (nbi_check_desc); E of them must fit a size_t */
    if ((double)d->experts * (double)d->gate_up.n * (double)d->gate_up.k > NB_MOE_MAX_ELEMS ||
        (double)d->experts * (double)d->down.n * (double)d->down.k > NB_MOE_MAX_ELEMS)
        return nbi_fail(ctx, NB_ERR_OVERFLOW, "%s: %d experts of [%lld, %lld] weights exceed 2^50 elements", fn,
                        (int)d->experts, (long long)(2 * I), (long long)H);
    return NB_OK;
}

nb_status nb_moe_desc_validate(const nb_moe_desc *d) { return check_moe(NULL, d, "nb_moe_desc_validate"); }

nb_status nb_moe_desc_init(nb_moe_desc *d, nb_format format, int64_t m, int32_t experts, int32_t top_k,
                           int64_t hidden, int64_t intermediate, nb_moe_activation activation, nb_dtype act_dtype) {
    static const char fn[] = "nb_moe_desc_init";
    if (!d) return nbi_fail(NULL, NB_ERR_NULL_POINTER, "%s: d is NULL", fn);
    if (!nbi_traits(format)) return nbi_fail(NULL, NB_ERR_UNSUPPORTED, "%s: unknown format %d", fn, (int)format);
    memset(d, 0, sizeof *d);
    d->m = m;
    d->experts = experts;
    d->top_k = top_k;
    d->hidden = hidden;
    d->intermediate = intermediate;
    /* (the weight descriptors are filled whatever their shapes; validation below names the problem) */
    nb_weight_desc_init(&d->gate_up, format, intermediate > 0 && intermediate <= NB_MOE_MAX_DIM ? 2 * intermediate : 0,
                        hidden);
    nb_weight_desc_init(&d->down, format, hidden, intermediate);
    d->activation = activation;
    d->gate_up_layout = activation == NB_MOE_ACT_SWIGLU_OAI ? NB_MOE_GATE_UP_INTERLEAVED : NB_MOE_GATE_UP_CONCAT;
    if (activation == NB_MOE_ACT_SWIGLU_OAI) {
        d->limit = 7.0f;
        d->alpha = 1.702f;
    }
    d->act_dtype = act_dtype;
    return check_moe(NULL, d, fn);
}

nb_status nb_moe_get_sizes(const nb_moe_desc *d, nb_moe_sizes *out) {
    static const char fn[] = "nb_moe_get_sizes";
    nb_status st = check_moe(NULL, d, fn);
    if (st) return st;
    if (!out) return nbi_fail(NULL, NB_ERR_NULL_POINTER, "%s: out is NULL", fn);
    nb_moe_sizes s;
    memset(&s, 0, sizeof s);
    if ((st = nb_weight_get_sizes_v2(&d->gate_up, &s.gate_up)) || (st = nb_weight_get_sizes_v2(&d->down, &s.down)))
        return nbi_fail(NULL, st, "%s: %s", fn, nb_last_error());
    const size_t es = nbi_dtype_size(d->act_dtype);
    s.x_bytes = (size_t)d->m * (size_t)d->hidden * es; /* (bounded by check_moe) */
    s.gate_up_bias_bytes = (size_t)d->experts * (size_t)(2 * d->intermediate) * es;
    s.down_bias_bytes = (size_t)d->experts * (size_t)d->hidden * es;
    *out = s;
    return NB_OK;
}

/* ------------------------------------------------------------ routing */

/* topk_ids and (when given) topk_weights by the rules of nibble.h: ids in
 * [0, E), none twice in a token, weights finite. */
static nb_status check_routing(nb_context *ctx, const nb_moe_desc *d, const int32_t *ids, const float *w,
                               const char *fn) {
    const int64_t K = d->top_k;
    for (int64_t t = 0; t < d->m; t++) {
        const int32_t *row = ids + t * K;
        for (int64_t s = 0; s < K; s++) {
            if (row[s] < 0 || row[s] >= d->experts)
                return nbi_fail(ctx, NB_ERR_INVALID_ARGUMENT, "%s: topk_ids[%lld, %lld] = %d is not an expert of [0, "
                                "%d)", fn, (long long)t, (long long)s, (int)row[s], (int)d->experts);
            for (int64_t r = 0; r < s; r++)
                if (row[r] == row[s])
                    return nbi_fail(ctx, NB_ERR_INVALID_ARGUMENT, "%s: token %lld names expert %d twice (slots %lld "
                                    "and %lld): top-k routing picks distinct experts", fn, (long long)t, (int)row[s],
                                    (long long)r, (long long)s);
            if (w && !isfinite(w[t * K + s]))
                return nbi_fail(ctx, NB_ERR_INVALID_ARGUMENT, "%s: topk_weights[%lld, %lld] = %g is not finite", fn,
                                (long long)t, (long long)s, (double)w[t * K + s]);
        }
    }
    return NB_OK;
}

/* Counting sort of the slots by expert, ascending within an expert:
 * start[e] .. start[e+1]-1 of order[] are expert e's slots (no padding). */
static void sort_slots(const nb_moe_desc *d, const int32_t *ids, int64_t *start, int32_t *order) {
    const int64_t E = d->experts, n = d->m * d->top_k;
    for (int64_t e = 0; e <= E; e++) start[e] = 0;
    for (int64_t i = 0; i < n; i++) start[ids[i] + 1]++;
    for (int64_t e = 0; e < E; e++) start[e + 1] += start[e];
    int64_t *next = start + E + 1; /* E more entries: the fill position of each expert */
    for (int64_t e = 0; e < E; e++) next[e] = start[e];
    for (int64_t i = 0; i < n; i++) order[next[ids[i]]++] = (int32_t)i;
}

/* nb_moe_align_get_sizes' rules, messages starting with fn. */
static nb_status align_sizes(nb_context *ctx, const nb_moe_desc *d, int32_t block, nb_moe_align_sizes *out,
                             const char *fn) {
    nb_status st = check_moe(ctx, d, fn);
    if (st) return st;
    if (block < 1 || block > NB_MOE_MAX_BLOCK)
        return nbi_fail(ctx, NB_ERR_INVALID_ARGUMENT, "%s: block = %d must be in [1, %d]", fn, (int)block,
                        NB_MOE_MAX_BLOCK);
    const int64_t slots = d->m * d->top_k, len = slots + (int64_t)d->experts * (block - 1);
    if (len > INT32_MAX)
        return nbi_fail(ctx, NB_ERR_OVERFLOW, "%s: m x top_k + experts x (block - 1) = %lld entries do not fit "
                        "int32 indices", fn, (long long)len);
    memset(out, 0, sizeof *out);
    out->slots = slots;
    out->sorted_len = len;
    out->blocks = (len + block - 1) / block;
    out->offsets_len = (int64_t)d->experts + 1;
    return NB_OK;
}

nb_status nb_moe_align_get_sizes(const nb_moe_desc *d, int32_t block, nb_moe_align_sizes *out) {
    static const char fn[] = "nb_moe_align_get_sizes";
    if (!out) {
        nb_status st = check_moe(NULL, d, fn);
        return st ? st : nbi_fail(NULL, NB_ERR_NULL_POINTER, "%s: out is NULL", fn);
    }
    return align_sizes(NULL, d, block, out, fn);
}

nb_status nb_moe_align_host(nb_context *ctx, const nb_moe_desc *d, int32_t block, const int32_t *topk_ids,
                            int32_t *sorted_slots, int32_t *block_experts, int32_t *expert_offsets,
                            int32_t *expert_counts, const nb_moe_align_sizes *capacity) {
    static const char fn[] = "nb_moe_align_host";
    if (!ctx) return nbi_fail(NULL, NB_ERR_NULL_POINTER, "%s: ctx is NULL", fn);
    nb_moe_align_sizes need;
    nb_status st = align_sizes(ctx, d, block, &need, fn);
    if (st) return st;
    if (!topk_ids || !sorted_slots || !block_experts || !expert_offsets || !capacity)
        return nbi_fail(ctx, NB_ERR_NULL_POINTER, "%s: topk_ids, sorted_slots, block_experts, expert_offsets and "
                        "capacity must not be NULL", fn);
    if (!reserved_zero(capacity->reserved, sizeof capacity->reserved / sizeof capacity->reserved[0]))
        return nbi_fail(ctx, NB_ERR_INVALID_ARGUMENT, "%s: capacity's reserved fields must be zero", fn);
    const char *shortb = capacity->sorted_len < need.sorted_len ? "sorted_slots"
                         : capacity->blocks < need.blocks       ? "block_experts"
                         : capacity->offsets_len < need.offsets_len ? "expert_offsets (and expert_counts)"
                                                                    : NULL;
    if (shortb)
        return nbi_fail(ctx, NB_ERR_BUFFER_TOO_SMALL, "%s: %s is too short: the capacity holds %lld, %lld and %lld "
                        "entries, %lld, %lld and %lld are needed (nb_moe_align_get_sizes)", fn, shortb,
                        (long long)capacity->sorted_len, (long long)capacity->blocks, (long long)capacity->offsets_len,
                        (long long)need.sorted_len, (long long)need.blocks, (long long)need.offsets_len);
    if ((st = check_routing(ctx, d, topk_ids, NULL, fn))) return st;
    const int64_t E = d->experts, n = need.slots;
    int64_t *start = (int64_t *)malloc(sizeof(int64_t) * (size_t)(2 * E + 1));
    int32_t *order = (int32_t *)malloc(sizeof(int32_t) * (size_t)n);
    if (!start || !order) {
        free(start);
        free(order);
        return nbi_fail(ctx, NB_ERR_OUT_OF_MEMORY, "%s: out of host memory", fn);
    }
    sort_slots(d, topk_ids, start, order);
    for (int64_t i = 0; i < need.sorted_len; i++) sorted_slots[i] = (int32_t)n; /* the sentinel */
    for (int64_t b = 0; b < need.blocks; b++) block_experts[b] = -1;
    int64_t off = 0;
    for (int64_t e = 0; e < E; e++) {
        const int64_t c = start[e + 1] - start[e], p = (c + block - 1) / block * block;
        expert_offsets[e] = (int32_t)off;
        if (expert_counts) expert_counts[e] = (int32_t)c;
        memcpy(sorted_slots + off, order + start[e], sizeof(int32_t) * (size_t)c);
        for (int64_t b = off / block; b < (off + p) / block; b++) block_experts[b] = (int32_t)e;
        off += p;
    }
    expert_offsets[E] = (int32_t)off;
    free(start);
    free(order);
    return NB_OK;
}

/* ------------------------------------------------------------ the MLP */

/* A weight's buffers: non-NULL codes and scales, zeros exactly for a format
 * with zero points, reserved NULL; a tensor-scale array exactly for a
 * format with a tensor scale. */
static nb_status check_weight(nb_context *ctx, const nb_weight_desc *wd, const nb_weight_data *w, const float *ts,
                              const char *which, const char *fn) {
    const nbi_format_traits *t = nbi_traits(wd->format);
    for (int i = 0; i < 4; i++)
        if (w->reserved[i])
            return nbi_fail(ctx, NB_ERR_INVALID_ARGUMENT, "%s: %s's reserved pointers must be NULL", fn, which);
    if (!w->codes || !w->scales)
        return nbi_fail(ctx, NB_ERR_NULL_POINTER, "%s: %s codes and scales must not be NULL", fn, which);
    if ((t->zero_point != NB_ZERO_NONE) != (w->zeros != NULL))
        return nbi_fail(ctx, w->zeros ? NB_ERR_INVALID_ARGUMENT : NB_ERR_NULL_POINTER, "%s: %s is %s, which %s zero "
                        "points: zeros must %sbe NULL", fn, which, t->name, w->zeros ? "has no" : "carries",
                        w->zeros ? "" : "not ");
    if (t->tensor_scale && !ts)
        return nbi_fail(ctx, NB_ERR_NULL_POINTER, "%s: %s is %s: its per-expert tensor scales (%s_scales, E floats) "
                        "must not be NULL", fn, which, t->name, which);
    if (!t->tensor_scale && ts)
        return nbi_fail(ctx, NB_ERR_INVALID_ARGUMENT, "%s: %s is %s, which has no tensor scale: %s_scales must be "
                        "NULL", fn, which, t->name, which);
    return NB_OK;
}

/* Expert e's weight, dequantized to float32 rows [n, k] by nbi_dequant_row
 * with its own tensor scale. */
static void dequant_expert(const nb_weight_desc *wd, const nb_weight_data *w, const float *ts, int64_t e,
                           const nb_weight_sizes_v2 *sz, float *out) {
    nb_weight_desc de = *wd;
    de.layout = NB_LAYOUT_CHECKPOINT;
    de.tensor_scale = ts ? ts[e] : 1.0f;
    const nb_weight_data we = {
        .codes = (const uint8_t *)w->codes + (size_t)e * sz->codes_bytes,
        .scales = (const uint8_t *)w->scales + (size_t)e * sz->scales_bytes,
        .zeros = w->zeros ? (const uint8_t *)w->zeros + (size_t)e * sz->zeros_bytes : NULL,
    };
    for (int64_t r = 0; r < de.n; r++) nbi_dequant_row(&de, &we, r, out + r * de.k);
}

/* The value act_dtype stores for v (float: unchanged). */
static float round_to(nb_dtype t, float v) {
    if (t == NB_DTYPE_F16) return nbi_f16_to_f32(nbi_f32_to_f16(v));
    if (t == NB_DTYPE_BF16) return nbi_bf16_to_f32(nbi_f32_to_bf16(v));
    return v;
}

/* The activations of nibble.h, in float and in double.  Comparisons keep a
 * NaN (fminf would replace it by the limit). */
static float act_f(const nb_moe_desc *d, float g, float u) {
    if (d->activation == NB_MOE_ACT_SWIGLU) return g / (1.0f + expf(-g)) * u;
    const float L = d->limit;
    g = g > L ? L : g;
    u = u > L ? L : u < -L ? -L : u;
    return (u + 1.0f) * (g / (1.0f + expf(-(d->alpha * g))));
}

static double act_d(const nb_moe_desc *d, double g, double u) {
    if (d->activation == NB_MOE_ACT_SWIGLU) return g / (1.0 + exp(-g)) * u;
    const double L = (double)d->limit;
    g = g > L ? L : g;
    u = u > L ? L : u < -L ? -L : u;
    return (u + 1.0) * (g / (1.0 + exp(-((double)d->alpha * g))));
}

/* Row indices of gate i and up i within the 2I rows of gate_up. */
static void gate_up_rows(const nb_moe_desc *d, int64_t i, int64_t *g, int64_t *u) {
    if (d->gate_up_layout == NB_MOE_GATE_UP_INTERLEAVED) {
        *g = 2 * i;
        *u = 2 * i + 1;
    } else {
        *g = i;
        *u = d->intermediate + i;
    }
}

/* One slot: o[H] (float or double) from x [H] through expert e's
 * dequantized weights wgu [2I, H] and wd [H, I]; gu [2I] and h [I] are
 * scratch.  The float version holds float values in them (exactly) and
 * rounds where nibble.h says; the double one rounds nothing. */
static void slot(const nb_moe_desc *d, const nb_moe_weights *w, int64_t e, const float *x, const float *wgu,
                 const float *wd, double *gu, double *h, void *o, int f64) {
    const int64_t H = d->hidden, I = d->intermediate;
    const nb_dtype at = d->act_dtype;
    for (int64_t r = 0; r < 2 * I; r++) {
        const float *row = wgu + r * H;
        const float b = w->gate_up_bias ? nbi_load(at, w->gate_up_bias, (size_t)(e * 2 * I + r)) : 0.0f;
        float accf = 0.0f;
        double accd = 0.0;
        if (f64)
            for (int64_t j = 0; j < H; j++) accd += (double)x[j] * (double)row[j];
        else
            for (int64_t j = 0; j < H; j++) accf += x[j] * row[j];
        gu[r] = f64 ? accd + (double)b : (double)(accf + b);
    }
    for (int64_t i = 0; i < I; i++) {
        int64_t rg, ru;
        gate_up_rows(d, i, &rg, &ru);
        h[i] = f64 ? act_d(d, gu[rg], gu[ru]) : (double)round_to(at, act_f(d, (float)gu[rg], (float)gu[ru]));
    }
    for (int64_t c = 0; c < H; c++) {
        const float *row = wd + c * I;
        const float b = w->down_bias ? nbi_load(at, w->down_bias, (size_t)(e * H + c)) : 0.0f;
        float accf = 0.0f;
        double accd = 0.0;
        if (f64) {
            for (int64_t j = 0; j < I; j++) accd += h[j] * (double)row[j];
            ((double *)o)[c] = accd + (double)b;
        } else {
            for (int64_t j = 0; j < I; j++) accf += (float)h[j] * row[j];
            ((float *)o)[c] = round_to(at, accf + b);
        }
    }
}

static nb_status moe_mlp(nb_context *ctx, const nb_moe_desc *d, const void *x, const nb_moe_weights *w,
                         const int32_t *ids, const float *tw, void *y, int f64, const char *fn) {
    if (!ctx) return nbi_fail(NULL, NB_ERR_NULL_POINTER, "%s: ctx is NULL", fn);
    nb_status st = check_moe(ctx, d, fn);
    if (st) return st;
    if (d->gate_up.layout != NB_LAYOUT_CHECKPOINT || d->down.layout != NB_LAYOUT_CHECKPOINT)
        return nbi_fail(ctx, NB_ERR_INVALID_ARGUMENT, "%s: the host reference reads the checkpoint layout (gate_up "
                        "and down must not be packed)", fn);
    if (!x || !w || !ids || !tw || !y)
        return nbi_fail(ctx, NB_ERR_NULL_POINTER, "%s: x, w, topk_ids, topk_weights and y must not be NULL", fn);
    for (int i = 0; i < 4; i++)
        if (w->reserved[i])
            return nbi_fail(ctx, NB_ERR_INVALID_ARGUMENT, "%s: the weights' reserved pointers must be NULL", fn);
    if ((st = check_weight(ctx, &d->gate_up, &w->gate_up, w->gate_up_scales, "gate_up", fn)) ||
        (st = check_weight(ctx, &d->down, &w->down, w->down_scales, "down", fn)) ||
        (st = check_routing(ctx, d, ids, tw, fn)))
        return st;
    nb_weight_sizes_v2 sgu, sd;
    if ((st = nb_weight_get_sizes_v2(&d->gate_up, &sgu)) || (st = nb_weight_get_sizes_v2(&d->down, &sd)))
        return nbi_fail(ctx, st, "%s: %s", fn, nb_last_error());

    const int64_t m = d->m, K = d->top_k, E = d->experts, H = d->hidden, I = d->intermediate, n = m * K;
    const size_t vs = f64 ? sizeof(double) : sizeof(float);
    int64_t *start = (int64_t *)malloc(sizeof(int64_t) * (size_t)(2 * E + 1));
    int32_t *order = (int32_t *)malloc(sizeof(int32_t) * (size_t)n);
    float *wgu = (float *)malloc(sizeof(float) * (size_t)(2 * I * H));
    float *wd = (float *)malloc(sizeof(float) * (size_t)(H * I));
    float *xf = (float *)malloc(sizeof(float) * (size_t)H);
    double *gu = (double *)malloc(sizeof(double) * (size_t)(2 * I)), *h = (double *)malloc(sizeof(double) * (size_t)I);
    void *o = malloc(vs * (size_t)n * (size_t)H); /* per-slot outputs, [m * top_k, H] */
    if (!start || !order || !wgu || !wd || !xf || !gu || !h || !o) {
        st = nbi_fail(ctx, NB_ERR_OUT_OF_MEMORY, "%s: out of host memory", fn);
        goto done;
    }
    sort_slots(d, ids, start, order);
    for (int64_t e = 0; e < E; e++) {
        if (start[e] == start[e + 1]) continue; /* an expert without tokens costs nothing */
        dequant_expert(&d->gate_up, &w->gate_up, w->gate_up_scales, e, &sgu, wgu);
        dequant_expert(&d->down, &w->down, w->down_scales, e, &sd, wd);
        for (int64_t p = start[e]; p < start[e + 1]; p++) {
            const int64_t i = order[p], t = i / K;
            for (int64_t j = 0; j < H; j++) xf[j] = nbi_load(d->act_dtype, x, (size_t)(t * H + j));
            slot(d, w, e, xf, wgu, wd, gu, h, (char *)o + (size_t)(i * H) * vs, f64);
        }
    }
    /* the combine: each token's slots in top-k order */
    for (int64_t t = 0; t < m; t++)
        for (int64_t c = 0; c < H; c++) {
            if (f64) {
                double acc = 0.0;
                for (int64_t s = 0; s < K; s++) acc += (double)tw[t * K + s] * ((const double *)o)[(t * K + s) * H + c];
                ((double *)y)[t * H + c] = acc;
            } else {
                float acc = 0.0f;
                for (int64_t s = 0; s < K; s++) acc += tw[t * K + s] * ((const float *)o)[(t * K + s) * H + c];
                nbi_store(d->act_dtype, y, (size_t)(t * H + c), acc);
            }
        }
done:
    free(start);
    free(order);
    free(wgu);
    free(wd);
    free(xf);
    free(gu);
    free(h);
    free(o);
    return st;
}

nb_status nb_moe_mlp_host(nb_context *ctx, const nb_moe_desc *d, const void *x, const nb_moe_weights *w,
                          const int32_t *topk_ids, const float *topk_weights, void *y) {
    return moe_mlp(ctx, d, x, w, topk_ids, topk_weights, y, 0, "nb_moe_mlp_host");
}

nb_status nb_moe_mlp_host_f64(nb_context *ctx, const nb_moe_desc *d, const void *x, const nb_moe_weights *w,
                              const int32_t *topk_ids, const float *topk_weights, double *y) {
    return moe_mlp(ctx, d, x, w, topk_ids, topk_weights, y, 1, "nb_moe_mlp_host_f64");
}
