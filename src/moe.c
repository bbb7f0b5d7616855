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
#include <stdio.h>
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

/* The activation rules of nb_moe_desc_validate and nb_glu_desc_validate. */
static nb_status check_act(nb_context *ctx, int activation, int layout, const char *layout_name, float limit,
                           float alpha, const char *fn) {
    if (activation != NB_MOE_ACT_SWIGLU && activation != NB_MOE_ACT_SWIGLU_OAI)
        return nbi_fail(ctx, NB_ERR_INVALID_ARGUMENT, "%s: activation %d is not %d (swiglu) or %d (swiglu_oai)", fn,
                        activation, NB_MOE_ACT_SWIGLU, NB_MOE_ACT_SWIGLU_OAI);
    if (layout != NB_MOE_GATE_UP_CONCAT && layout != NB_MOE_GATE_UP_INTERLEAVED)
        return nbi_fail(ctx, NB_ERR_INVALID_ARGUMENT, "%s: %s %d is not %d (concat) or %d (interleaved)", fn,
                        layout_name, layout, NB_MOE_GATE_UP_CONCAT, NB_MOE_GATE_UP_INTERLEAVED);
    if (activation == NB_MOE_ACT_SWIGLU_OAI) {
        if (!(limit > 0.0f && isfinite(limit)) || !(alpha > 0.0f && isfinite(alpha)))
            return nbi_fail(ctx, NB_ERR_INVALID_ARGUMENT, "%s: swiglu_oai needs a positive finite limit and alpha "
                            "(got %g and %g; gpt-oss: 7 and 1.702)", fn, (double)limit, (double)alpha);
    } else if (limit != 0.0f || alpha != 0.0f) {
        return nbi_fail(ctx, NB_ERR_INVALID_ARGUMENT, "%s: swiglu has no limit or alpha (got %g and %g; they must be "
                        "0)", fn, (double)limit, (double)alpha);
    }
    return NB_OK;
}

/* The defaults nibble.h gives an activation: SWIGLU concatenated, limit
 * and alpha 0; SWIGLU_OAI interleaved, gpt-oss's limit 7 and alpha 1.702
 * (nb_moe_desc_init, nb_glu_desc_init). */
static void act_defaults(int activation, int32_t *layout, float *limit, float *alpha) {
    const int oai = activation == NB_MOE_ACT_SWIGLU_OAI;
    *layout = oai ? NB_MOE_GATE_UP_INTERLEAVED : NB_MOE_GATE_UP_CONCAT;
    *limit = oai ? 7.0f : 0.0f;
    *alpha = oai ? 1.702f : 0.0f;
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
    if ((st = check_act(ctx, d->activation, d->gate_up_layout, "gate_up_layout", d->limit, d->alpha, fn))) return st;
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
    act_defaults(activation, &d->gate_up_layout, &d->limit, &d->alpha);
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

/* The lengths of the routing layout for a valid d and block (no checks). */
static nb_status align_lengths(nb_context *ctx, const nb_moe_desc *d, int32_t block, nb_moe_align_sizes *out,
                               const char *fn) {
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

/* nb_moe_align_get_sizes' rules, messages starting with fn. */
static nb_status align_sizes(nb_context *ctx, const nb_moe_desc *d, int32_t block, nb_moe_align_sizes *out,
                             const char *fn) {
    nb_status st = check_moe(ctx, d, fn);
    return st ? st : align_lengths(ctx, d, block, out, fn);
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
static float act_f3(int activation, float L, float alpha, float g, float u) {
    if (activation == NB_MOE_ACT_SWIGLU) return g / (1.0f + expf(-g)) * u;
    g = g > L ? L : g;
    u = u > L ? L : u < -L ? -L : u;
    return (u + 1.0f) * (g / (1.0f + expf(-(alpha * g))));
}

static float act_f(const nb_moe_desc *d, float g, float u) { return act_f3(d->activation, d->limit, d->alpha, g, u); }

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

/* ------------------------------------------------------ packed (GPU) weights */

/* The packed gate_up of one expert is a weight of 16 * ceil(I / 8) rows:
 * row block b holds gate rows 8b .. 8b+7, then up rows 8b .. 8b+7 (rows
 * past I are zero codes with scale byte 0, a zero weight). */
static int64_t gate_up_packed_rows(const nb_moe_desc *d) { return 16 * ((d->intermediate + 7) / 8); }

/* One expert's descriptors as nb_pack_host sees them (checkpoint layout). */
static void packed_descs(const nb_moe_desc *d, nb_weight_desc *gu, nb_weight_desc *dn) {
    *gu = d->gate_up;
    *dn = d->down;
    gu->n = gate_up_packed_rows(d);
    gu->layout = dn->layout = NB_LAYOUT_CHECKPOINT;
    gu->tensor_scale = dn->tensor_scale = 1.0f;
}

static nb_status packed_sizes(nb_context *ctx, const nb_moe_desc *d, nb_moe_packed_sizes *out, const char *fn) {
    nb_status st = check_moe(ctx, d, fn);
    if (st) return st;
    const nbi_format_traits *t = nbi_traits(d->gate_up.format);
    if (!t->every_kernel || d->down.format != d->gate_up.format)
        return nbi_fail(ctx, NB_ERR_UNSUPPORTED, "%s: no GPU kernel serves %s MoE weights (nvfp4 and mxfp4 do; gate_up "
                        "and down of one format)", fn, t->name);
    nb_weight_desc gu, dn;
    packed_descs(d, &gu, &dn);
    nb_weight_sizes sg, sd;
    if ((st = nb_weight_get_sizes(&gu, &sg)) || (st = nb_weight_get_sizes(&dn, &sd)))
        return nbi_fail(ctx, st, "%s: %s", fn, nb_last_error());
    memset(out, 0, sizeof *out);
    out->gate_up_expert_bytes = sg.packed_bytes;
    out->down_expert_bytes = sd.packed_bytes;
    out->gate_up_bytes = (size_t)d->experts * sg.packed_bytes; /* (bounded by check_moe's 2^50 elements) */
    out->down_bytes = (size_t)d->experts * sd.packed_bytes;
    return NB_OK;
}

nb_status nb_moe_packed_get_sizes(const nb_moe_desc *d, nb_moe_packed_sizes *out) {
    static const char fn[] = "nb_moe_packed_get_sizes";
    if (!out) return nbi_fail(NULL, NB_ERR_NULL_POINTER, "%s: out is NULL", fn);
    return packed_sizes(NULL, d, out, fn);
}

nb_status nb_moe_pack_host(nb_context *ctx, nb_moe_desc *d, const nb_moe_weights *w, void *gate_up_packed,
                           size_t gate_up_bytes, void *down_packed, size_t down_bytes) {
    static const char fn[] = "nb_moe_pack_host";
    if (!ctx) return nbi_fail(NULL, NB_ERR_NULL_POINTER, "%s: ctx is NULL", fn);
    nb_moe_packed_sizes ps;
    nb_status st = packed_sizes(ctx, d, &ps, fn);
    if (st) return st;
    if (d->gate_up.layout != NB_LAYOUT_CHECKPOINT || d->down.layout != NB_LAYOUT_CHECKPOINT)
        return nbi_fail(ctx, NB_ERR_INVALID_ARGUMENT, "%s: the weights are packed already (the descriptors' layout)",
                        fn);
    if (!w || !gate_up_packed || !down_packed)
        return nbi_fail(ctx, NB_ERR_NULL_POINTER, "%s: w, gate_up_packed and down_packed must not be NULL", fn);
    for (int i = 0; i < 4; i++)
        if (w->reserved[i] || w->gate_up.reserved[i] || w->down.reserved[i])
            return nbi_fail(ctx, NB_ERR_INVALID_ARGUMENT, "%s: reserved pointers must be NULL", fn);
    if (!w->gate_up.codes || !w->gate_up.scales || !w->down.codes || !w->down.scales)
        return nbi_fail(ctx, NB_ERR_NULL_POINTER, "%s: gate_up and down codes and scales must not be NULL", fn);
    if (gate_up_bytes < ps.gate_up_bytes || down_bytes < ps.down_bytes)
        return nbi_fail(ctx, NB_ERR_BUFFER_TOO_SMALL, "%s: packed buffers of %zu and %zu bytes needed, %zu and %zu "
                        "given", fn, ps.gate_up_bytes, ps.down_bytes, gate_up_bytes, down_bytes);
    nb_weight_desc gu, dn;
    packed_descs(d, &gu, &dn);
    const int64_t E = d->experts, H = d->hidden, I = d->intermediate, rows = gu.n;
    const size_t crow = (size_t)H / 2, srow = (size_t)(H / d->gate_up.group_size); /* bytes per row (4-bit codes) */
    const size_t ecodes = (size_t)(2 * I) * crow, escales = (size_t)(2 * I) * srow;
    nb_weight_sizes sd; /* one expert's down (checkpoint layout) */
    if ((st = nb_weight_get_sizes(&dn, &sd))) return nbi_fail(ctx, st, "%s: %s", fn, nb_last_error());
    uint8_t *tc = (uint8_t *)calloc((size_t)rows, crow), *ts = (uint8_t *)calloc((size_t)rows, srow);
    if (!tc || !ts) {
        free(tc);
        free(ts);
        return nbi_fail(ctx, NB_ERR_OUT_OF_MEMORY, "%s: out of host memory", fn);
    }
    for (int64_t e = 0; e < E && !st; e++) {
        const uint8_t *c = (const uint8_t *)w->gate_up.codes + (size_t)e * ecodes;
        const uint8_t *s = (const uint8_t *)w->gate_up.scales + (size_t)e * escales;
        for (int64_t r = 0; r < rows; r++) { /* packed row r: gate (j < 8) or up of i = 8 (r / 16) + j % 8 */
            const int64_t i = 8 * (r / 16) + (r % 16) % 8;
            if (i >= I) continue; /* (zero rows, from calloc) */
            int64_t rg, ru;
            gate_up_rows(d, i, &rg, &ru);
            const int64_t src = (r % 16) < 8 ? rg : ru;
            memcpy(tc + (size_t)r * crow, c + (size_t)src * crow, crow);
            memcpy(ts + (size_t)r * srow, s + (size_t)src * srow, srow);
        }
        nb_weight_desc g1 = gu, d1 = dn;
        st = nb_pack_host(ctx, &g1, tc, ts, (uint8_t *)gate_up_packed + (size_t)e * ps.gate_up_expert_bytes,
                          ps.gate_up_expert_bytes);
        if (!st)
            st = nb_pack_host(ctx, &d1, (const uint8_t *)w->down.codes + (size_t)e * sd.codes_bytes,
                              (const uint8_t *)w->down.scales + (size_t)e * sd.scales_bytes,
                              (uint8_t *)down_packed + (size_t)e * ps.down_expert_bytes, ps.down_expert_bytes);
    }
    free(tc);
    free(ts);
    if (st) return nbi_fail(ctx, st, "%s: %s", fn, nb_last_error());
    /* the scale exponent range over every expert (the real scales only: padding rows do not count) */
    if (nbi_traits(d->gate_up.format)->scale_type == NB_SCALE_E8M0) {
        nbi_scale_exp_range((const uint8_t *)w->gate_up.scales, (size_t)E * escales, &d->gate_up.scale_exp_min,
                            &d->gate_up.scale_exp_max);
        nbi_scale_exp_range((const uint8_t *)w->down.scales, (size_t)E * sd.scales_bytes, &d->down.scale_exp_min,
                            &d->down.scale_exp_max);
    }
    d->gate_up.layout = d->down.layout = NB_LAYOUT_PACKED;
    return NB_OK;
}

/* ------------------------------------------------------------ on the GPU */

static size_t align256(size_t v) { return (v + 255) & ~(size_t)255; }

/* The routing block: 8 slots of one expert per CTA row when experts see few
 * tokens (decode), up to 32 when they see many (each block re-reads its
 * expert's weights, so fewer, fuller blocks read less). */
static int moe_mt(const nb_moe_desc *d) {
    const double per_expert = (double)d->m * (double)d->top_k / (double)d->experts;
    return per_expert <= 8.0 ? 1 : per_expert <= 16.0 ? 2 : 4;
}

/* Tiles of `bn` tokens an expert is expected to need with uniform top-k
 * routing: its slot count n is binomial (slots, 1 / E), taken as normal
 * (mean mu, variance mu (1 - 1 / E)), and it pads to ceil(n / bn) tiles.
 * With 128 slots per expert on average about half the experts see more than
 * 128 and need a second 128-token tile (1.5 per expert), where one
 * 192-token tile holds every expert (1.0). */
static double moe_tiles_per_expert(double mu, double experts, int bn) {
    const double sd = sqrt(mu * (1.0 - 1.0 / experts));
    if (sd < 0.5) return ceil(mu / bn);
    const long lo = (long)fmax(0.0, floor(mu - 6.0 * sd)), hi = (long)ceil(mu + 6.0 * sd);
    double w = 0.0, t = 0.0;
    for (long n = lo; n <= hi; n++) {
        const double z = ((double)n - mu) / sd, pn = exp(-0.5 * z * z);
        w += pn;
        t += pn * (double)((n + bn - 1) / bn);
    }
    return t / w;
}

/* The tensor-core path for the projections (Hopper): when experts see many
 * tokens each (prefill), a tile of 64, 128 or 192 tokens of one expert reads
 * its weights once per tile instead of once per 32 slots, on the tensor
 * cores' wgmma.  Returns the tile width, 0 for the decode kernels.  The rule:
 * at least NBI_MOE_TC_MIN slots per expert on average (at 16 the two paths
 * are within 12% of each other, each ahead on some layers; at 32 the tiles
 * are 1.5-2x faster; bench/HISTORY.md, mixture of experts), then the width
 * with the least expected tiles per expert (moe_tiles_per_expert) times the
 * time of a tile's chunk (the dense kernel's, nbi_sm90_chunk_us: 0.68, 0.80
 * and 1.08 us for 64, 128 and 192 tokens; the grid is persistent, so a
 * tile's fill is not charged).  Measured on an H200 (bench/RESULTS.md,
 * mixture of experts): at 32 slots per expert it takes 64 (1.4x faster than
 * 128), at 64 128 (64 within 2%), at 128 and 512 192 (6-8% faster than
 * 128), at 256 128 (192 not measured there).  NIBBLE_MOE_PATH=decode / tc and
 * NIBBLE_MOE_TC_BN=64 / 128 / 192 at context creation override it
 * (measurement, tests). */
#define NBI_MOE_TC_MIN 24.0
static int moe_tc(const nb_context *ctx, const nb_moe_desc *d) {
    const int can = nbi_cuda_has_sm90a() && ctx->info.cc_major == 9 && ctx->info.cc_minor == 0 &&
                    (int64_t)d->m * d->top_k <= INT32_MAX - 256;
    if (!can) return 0;
    const double per_expert = (double)d->m * (double)d->top_k / (double)d->experts;
    const int tc = ctx->env_moe_path ? ctx->env_moe_path == 2 : per_expert >= NBI_MOE_TC_MIN;
    if (!tc) return 0;
    if (ctx->env_moe_bn) return ctx->env_moe_bn;
    static const int widths[3] = {64, 128, 192};
    int bn = 64;
    double best = 0.0;
    for (int i = 0; i < 3; i++) {
        const double cost =
            moe_tiles_per_expert(per_expert, (double)d->experts, widths[i]) * nbi_sm90_chunk_us(widths[i]);
        if (i == 0 || cost < best) best = cost, bn = widths[i];
    }
    return bn;
}

/* Warps per row block along k for one projection of the decode kernels
 * (1, 2, 4, 8): at batch 1 only top_k experts have tokens, and one warp per
 * row block leaves much of the GPU idle (gpt-oss-120b down: 4 experts x 180
 * row blocks = 720 warps for 132 SMs), so the kw warps of a CTA split each
 * row block's chunks while fewer than 16 warps per SM would stream, keeping
 * at least 3 chunks per warp for kw = 2 and 8 for more (each CTA's fixed
 * cost, scale table, routing reads and the in-CTA sum, is paid for fewer
 * row blocks).  Measured on an H100 at batch 1 (bench/HISTORY.md): kw = 2
 * gains 6-19% where fewer than 2100 row blocks have tokens, kw = 4 and 8
 * lose.  gate_up splits further while fewer than 64 row blocks per SM have
 * tokens: to the most warps that keep 12 chunks each.  Measured on an H100
 * (bench/HISTORY.md, gate_up's k split): DeepSeek-V3's gate_up (k = 7168,
 * 56 chunks) at batch 1 13-15% faster as 4 warps of 14 than as 2 of 28;
 * at batch 8, 2 warps 1-3% faster than 1 on gpt-oss (12 chunks each) and
 * DeepSeek-V3 but 2-3% slower on Qwen3-30B-A3B (8 each); from about 80 row
 * blocks per SM (batch 32 and up) 1-2% slower everywhere, so the bound
 * of 64 also leaves gpt-oss-120b's and DeepSeek-V3's batch 8 (78 and 111
 * row blocks per SM) unsplit, forgoing their 1-3%.  down lost with
 * any split past the first rule's.  The routing blocks with tokens are
 * estimated from the expected number of experts a uniform router picks.
 * NIBBLE_MOE_KW at context creation overrides both where a row block has
 * that many chunks (measurement, tests). */
static int moe_kw(const nb_context *ctx, const nb_moe_desc *d, int block, int64_t row_blocks, int64_t kchunks,
                  int gate_up) {
    if (ctx->env_moe_kw) return kchunks >= ctx->env_moe_kw ? ctx->env_moe_kw : 1;
    const double E = (double)d->experts, slots = (double)d->m * (double)d->top_k;
    const double active = E * (1.0 - pow(1.0 - (double)d->top_k / E, (double)d->m)); /* experts with tokens */
    const double blocks = fmax(active, ceil(slots / (double)block));
    const double sms = (double)ctx->info.sm_count, want = 16.0 * sms; /* warps streaming */
    int kw = 1;
    while (kw < 8 && blocks * (double)row_blocks * kw < want && kchunks >= (kw == 1 ? 6 : 16 * kw)) kw *= 2;
    if (gate_up && blocks * (double)row_blocks < 64.0 * sms)
        while (kw < 8 && (kchunks + 2 * kw - 1) / (2 * kw) >= 12) kw *= 2;
    return kw;
}

/* Few slots (decode at batch 1): two kernels instead of four.  Each CTA of
 * gate_up and down computes its routing block of the layout from topk_ids
 * itself (every slot against every other in shared memory), and the last
 * CTA of down to finish a group of row blocks sums the top-k outputs of
 * those columns for every token (nbi_moe_plan.inline_route).  The layout
 * and the sums are those of the layout and combine kernels, so the output
 * is bit for bit the same.  Measured on an H100 (bench/HISTORY.md, mixture
 * of experts; us, layout kernel -> inline): batch 1, 4 or 8 slots, gpt-oss
 * 37.6 -> 36.5, Qwen3-30B-A3B 26.0 -> 22.9, but DeepSeek-V3 109.7 -> 112.0,
 * and batch 8 (32 or 64 slots) 3-19% slower on every layer.  Each CTA pays
 * the routing before its first weight fetch, so the rule takes inline
 * routing where it won: at most 8 slots, and every CTA both projections
 * launch (launch_blocks x groups, a bound on the working ones) in one
 * resident wave (three CTAs per SM: the decode kernels' 78-80 registers;
 * DeepSeek-V3's gate_up launches 576 for 396).
 * NBI_MOE_INLINE_SLOTS bounds what a CTA can route (shared memory, one
 * thread per slot).  NIBBLE_MOE_ROUTE=kernel / inline at context creation
 * overrides the rule (measurement, tests; inline still needs at most
 * NBI_MOE_INLINE_SLOTS slots). */
#define NBI_MOE_INLINE_SLOTS 64
static int moe_inline(const nb_context *ctx, const nbi_moe_plan *p, int64_t gu_groups) {
    if (p->tc || p->slots > NBI_MOE_INLINE_SLOTS || p->block > 32) return 0;
    if (ctx->env_moe_route) return ctx->env_moe_route == 2;
    const int64_t groups = gu_groups > p->dn_groups ? gu_groups : p->dn_groups;
    return p->slots <= 8 && p->launch_blocks * groups <= 3 * (int64_t)ctx->info.sm_count;
}

/* The decode kernels' CTAs per routing block (the grid's groups): a CTA's
 * 8 warps take 8 / kw row blocks. */
static int64_t moe_groups(int64_t row_blocks, int kw) { return (row_blocks + 8 / kw - 1) / (8 / kw); }

/* down at one token per routing block with inline routing: the k range of
 * a row block over 4 warps instead of 2 where that grid is more than two
 * and at most three CTAs per SM.  The decode kernels stream each warp's
 * chunks one after the other and a chunk's instructions wait on each other,
 * so at batch 1 a warp's chain, not DRAM, sets down's time (ncu, gpt-oss
 * MXFP4: 18.7 us alone for 17.6 MB, 20% of DRAM bandwidth, 11 warps per
 * SM).  Four warps halve the chain; the kernel then runs its lean instance
 * (moe.cu: the combine four slots at a time, 72-74 registers instead of 90,
 * so three CTAs fit an SM and the grid is one wave).  Measured on an H200
 * (NOTES.md, "MoE down at batch 1 over four warps"): gpt-oss-120b / 20b
 * 26.7 -> 25.0 us NVFP4, 27.1 -> 25.2 MXFP4.  Grids of at most two CTAs
 * per SM keep kw = 2 and the 90-register instance: with 72 registers at kw
 * = 2 the same grids ran 11-13% slower (the hardware then packs three CTAs
 * on the SMs that free first; Qwen3-30B-A3B's 288 CTAs 15.8 -> 17.9 us). */
static int moe_down_kw4(const nb_context *ctx, const nbi_moe_plan *p) {
    if (ctx->env_moe_kw || p->dn_kw != 2 || p->dn_kchunks < 16) return 0;
    const int64_t ctas = p->launch_blocks * moe_groups(p->dn_row_blocks, 4), sms = ctx->info.sm_count;
    return ctas > 2 * sms && ctas <= 3 * sms;
}

/* The scale handling of one packed projection: nbi_plan's, for a GEMM of
 * that weight (it also checks the MXFP4 exponent span against the dtype). */
static nb_status moe_scales(nb_context *ctx, const nb_moe_desc *d, const nb_weight_desc *w, int *exp_shift,
                            uint32_t *table) {
    nb_gemm_desc g;
    memset(&g, 0, sizeof g);
    g.m = 1;
    g.weight = *w;
    g.weight.tensor_scale = 1.0f;
    g.act_dtype = g.out_dtype = d->act_dtype;
    nbi_gemm_plan p;
    nb_status st = nbi_plan(ctx, &g, NULL, &p);
    if (st) return st;
    *exp_shift = p.exp_shift;
    memcpy(table, p.scale_table, sizeof p.scale_table);
    return NB_OK;
}

nb_status nbi_moe_plan_make(nb_context *ctx, const nb_moe_desc *d, nbi_moe_plan *p, const char *fn) {
    nb_status st = nbi_need_device(ctx, fn);
    if (st) return st;
    nb_moe_packed_sizes ps;
    if ((st = packed_sizes(ctx, d, &ps, fn))) return st;
    if (d->gate_up.layout != NB_LAYOUT_PACKED || d->down.layout != NB_LAYOUT_PACKED)
        return nbi_fail(ctx, NB_ERR_INVALID_ARGUMENT, "%s: the weights must be packed by nb_moe_pack_host (the "
                        "descriptors' layout is the checkpoint's)", fn);
    if (d->act_dtype != NB_DTYPE_BF16 && d->act_dtype != NB_DTYPE_F16)
        return nbi_fail(ctx, NB_ERR_UNSUPPORTED, "%s: act_dtype %s: the GPU kernels take bf16 or f16", fn,
                        nbi_dtype_name(d->act_dtype));
    if (d->hidden % 8 || d->intermediate % 8)
        return nbi_fail(ctx, NB_ERR_UNSUPPORTED, "%s: hidden = %lld and intermediate = %lld must be multiples of 8 "
                        "(16-byte rows)", fn, (long long)d->hidden, (long long)d->intermediate);
    memset(p, 0, sizeof *p);
    p->fmt = d->gate_up.format;
    p->act = d->act_dtype;
    p->mt = moe_mt(d);
    p->block = 8 * p->mt;
    p->tc = moe_tc(ctx, d);
    p->pdl = ctx->info.cc_major >= 9;
    if (p->tc) p->block = p->tc;
    p->activation = d->activation;
    p->interleaved = d->gate_up_layout == NB_MOE_GATE_UP_INTERLEAVED;
    p->limit = d->limit;
    p->alpha = d->alpha;
    p->m = d->m;
    p->experts = d->experts;
    p->top_k = d->top_k;
    p->hidden = d->hidden;
    p->inter = d->intermediate;
    nb_moe_align_sizes as = {0};
    if ((st = align_lengths(ctx, d, p->block, &as, fn))) return st; /* (d validated by packed_sizes) */
    p->slots = as.slots;
    p->sorted_len = as.sorted_len;
    p->blocks = as.blocks;
    /* The grids cover the routing blocks any routing can fill: each expert
     * with c > 0 slots pads to ceil(c / block) <= 1 + (c - 1) / block blocks,
     * so the padded total is at most min(E, slots) + slots / block blocks
     * (the layout's buffers keep nb_moe_align_get_sizes' looser count).  At
     * batch 1 with 128 experts and top-4 that is 4 blocks of 113: the CTAs
     * past it would only exit. */
    {
        const int64_t active = p->slots < p->experts ? p->slots : p->experts;
        const int64_t bound = active + p->slots / p->block;
        p->launch_blocks = bound < p->blocks ? bound : p->blocks;
    }
    if (d->experts > 4096)
        return nbi_fail(ctx, NB_ERR_UNSUPPORTED, "%s: %d experts (at most 4096 on the device)", fn, (int)d->experts);
    p->gu_row_blocks = gate_up_packed_rows(d) / 16;
    p->gu_kchunks = (d->hidden + NBI_CHUNK_K - 1) / NBI_CHUNK_K;
    p->dn_row_blocks = (d->hidden + 15) / 16;
    p->dn_kchunks = (d->intermediate + NBI_CHUNK_K - 1) / NBI_CHUNK_K;
    p->gu_stride = ps.gate_up_expert_bytes;
    p->dn_stride = ps.down_expert_bytes;
    p->gu_kw = moe_kw(ctx, d, p->block, p->gu_row_blocks, p->gu_kchunks, 1);
    p->dn_kw = moe_kw(ctx, d, p->block, p->dn_row_blocks, p->dn_kchunks, 0);
    /* the decode kernels' 1-D grids: routing blocks x groups of row blocks */
    const int64_t gu_groups = moe_groups(p->gu_row_blocks, p->gu_kw);
    p->dn_groups = moe_groups(p->dn_row_blocks, p->dn_kw);
    p->inline_route = moe_inline(ctx, p, gu_groups);
    if (p->inline_route && p->mt == 1 && moe_down_kw4(ctx, p)) {
        p->dn_kw = 4;
        p->dn_groups = moe_groups(p->dn_row_blocks, p->dn_kw);
    }
    const int64_t dn_ctas = p->launch_blocks * p->dn_groups;
    if (p->launch_blocks * gu_groups > INT32_MAX || dn_ctas > INT32_MAX)
        return nbi_fail(ctx, NB_ERR_UNSUPPORTED, "%s: m = %lld, hidden = %lld and intermediate = %lld with %d experts "
                        "need more CTAs than one launch has", fn, (long long)d->m, (long long)d->hidden,
                        (long long)d->intermediate, (int)d->experts);
    nb_weight_desc gu, dn;
    packed_descs(d, &gu, &dn);
    gu.layout = dn.layout = NB_LAYOUT_PACKED;
    if ((st = moe_scales(ctx, d, &gu, &p->gu_exp_shift, p->gu_table)) ||
        (st = moe_scales(ctx, d, &dn, &p->dn_exp_shift, p->dn_table)))
        return nbi_reraise(ctx, st, fn);
    const size_t es = nbi_dtype_size(d->act_dtype);
    size_t off = 0;
    p->off_sorted = off;
    off += align256((size_t)p->sorted_len * 4);
    p->off_blocks = off;
    off += align256((size_t)p->blocks * 4);
    p->off_offsets = off;
    off += align256((size_t)(p->experts + 1) * 4);
    p->off_counts = off;
    off += align256((size_t)p->experts * 4);
    p->off_ustart = off;
    off += align256((size_t)p->experts * 4);
    p->off_xg = off;
    if (p->tc) off += align256((size_t)p->slots * (size_t)p->hidden * es);
    p->off_h = off;
    off += align256((size_t)p->slots * (size_t)p->inter * es);
    p->off_o = off;
    off += align256((size_t)p->slots * (size_t)p->hidden * es);
    p->off_arrive = off; /* inline routing: down's arrivals per group of row blocks (gate_up zeroes them) */
    off += align256((size_t)p->dn_groups * 4);
    p->ws_bytes = off;
    return NB_OK;
}

nb_status nb_moe_workspace_size(nb_context *ctx, const nb_moe_desc *d, size_t *bytes) {
    static const char fn[] = "nb_moe_workspace_size";
    if (!bytes) return nbi_fail(ctx, NB_ERR_NULL_POINTER, "%s: bytes is NULL", fn);
    nbi_moe_plan p;
    nb_status st = nbi_moe_plan_make(ctx, d, &p, fn);
    if (st) return st;
    *bytes = p.ws_bytes;
    return NB_OK;
}

nb_status nb_moe_mlp(nb_context *ctx, const nb_moe_desc *d, const void *x, const nb_moe_packed_weights *w,
                     const int32_t *topk_ids, const float *topk_weights, void *y, void *workspace,
                     size_t workspace_bytes, void *stream) {
    static const char fn[] = "nb_moe_mlp";
    nbi_moe_plan p;
    nb_status st = nbi_moe_plan_make(ctx, d, &p, fn);
    if (st) return st;
    if (!x || !w || !topk_ids || !topk_weights || !y)
        return nbi_fail(ctx, NB_ERR_NULL_POINTER, "%s: x, w, topk_ids, topk_weights and y must not be NULL", fn);
    for (int i = 0; i < 4; i++)
        if (w->reserved[i])
            return nbi_fail(ctx, NB_ERR_INVALID_ARGUMENT, "%s: the weights' reserved pointers must be NULL", fn);
    if (!w->gate_up || !w->down)
        return nbi_fail(ctx, NB_ERR_NULL_POINTER, "%s: the packed gate_up and down must not be NULL", fn);
    const int ts = nbi_traits(d->gate_up.format)->tensor_scale;
    if (ts && (!w->gate_up_scales || !w->down_scales))
        return nbi_fail(ctx, NB_ERR_NULL_POINTER, "%s: %s needs per-expert tensor scales (gate_up_scales, "
                        "down_scales: E floats each)", fn, nbi_traits(d->gate_up.format)->name);
    if (!ts && (w->gate_up_scales || w->down_scales))
        return nbi_fail(ctx, NB_ERR_INVALID_ARGUMENT, "%s: %s has no tensor scale: gate_up_scales and down_scales "
                        "must be NULL", fn, nbi_traits(d->gate_up.format)->name);
    if ((uintptr_t)x % 16 || (uintptr_t)w->gate_up % 16 || (uintptr_t)w->down % 16)
        return nbi_fail(ctx, NB_ERR_MISALIGNED, "%s: x and the packed weights must be 16-byte aligned", fn);
    if ((uintptr_t)y % 4 || (uintptr_t)topk_ids % 4 || (uintptr_t)topk_weights % 4 ||
        (w->gate_up_bias && (uintptr_t)w->gate_up_bias % 2) || (w->down_bias && (uintptr_t)w->down_bias % 2) ||
        (w->gate_up_scales && (uintptr_t)w->gate_up_scales % 4) || (w->down_scales && (uintptr_t)w->down_scales % 4))
        return nbi_fail(ctx, NB_ERR_MISALIGNED, "%s: y, topk_ids, topk_weights and the tensor scales must be 4-byte "
                        "aligned, the biases 2-byte", fn);
    if (!workspace || workspace_bytes < p.ws_bytes)
        return nbi_fail(ctx, NB_ERR_WORKSPACE, "%s: workspace of %zu bytes needed (nb_moe_workspace_size), %zu given%s",
                        fn, p.ws_bytes, workspace_bytes, workspace ? "" : " (NULL)");
    if ((uintptr_t)workspace % 256)
        return nbi_fail(ctx, NB_ERR_MISALIGNED, "%s: workspace must be 256-byte aligned", fn);
    if ((st = nbi_cuda_moe_mlp(ctx, &p, x, w, topk_ids, topk_weights, y, workspace, stream)))
        return nbi_reraise(ctx, st, fn);
    snprintf(ctx->last_config, sizeof ctx->last_config, "moe<%s,%s> %s block=%d routing_blocks=%lld kw=%d/%d "
             "routing=%s gate_up=%lldx%lld down=%lldx%lld", nbi_traits(d->gate_up.format)->name,
             nbi_dtype_name(d->act_dtype), p.tc ? "tc" : "decode", p.block, (long long)p.launch_blocks, p.gu_kw,
             p.dn_kw, p.inline_route ? "inline" : "kernel", (long long)(2 * p.inter), (long long)p.hidden,
             (long long)p.hidden, (long long)p.inter);
    return NB_OK;
}

nb_status nb_moe_align(nb_context *ctx, const nb_moe_desc *d, int32_t block, const int32_t *topk_ids,
                       int32_t *sorted_slots, int32_t *block_experts, int32_t *expert_offsets, int32_t *expert_counts,
                       const nb_moe_align_sizes *capacity, void *stream) {
    static const char fn[] = "nb_moe_align";
    nb_status st = nbi_need_device(ctx, fn);
    if (st) return st;
    if ((st = check_moe(ctx, d, fn))) return st;
    if (block < 1 || block > 1024)
        return nbi_fail(ctx, NB_ERR_INVALID_ARGUMENT, "%s: block = %d must be in [1, 1024]", fn, (int)block);
    if (d->experts > 4096)
        return nbi_fail(ctx, NB_ERR_UNSUPPORTED, "%s: %d experts (at most 4096 on the device)", fn, (int)d->experts);
    if (!topk_ids || !sorted_slots || !block_experts || !expert_offsets || !capacity)
        return nbi_fail(ctx, NB_ERR_NULL_POINTER, "%s: topk_ids, sorted_slots, block_experts, expert_offsets and "
                        "capacity must not be NULL", fn);
    nb_moe_align_sizes as = {0};
    if ((st = align_lengths(ctx, d, block, &as, fn))) return st;
    if (capacity->sorted_len < as.sorted_len || capacity->blocks < as.blocks || capacity->offsets_len < as.offsets_len)
        return nbi_fail(ctx, NB_ERR_BUFFER_TOO_SMALL, "%s: capacity (sorted %lld, blocks %lld, offsets %lld) is below "
                        "the %lld, %lld and %lld elements needed", fn, (long long)capacity->sorted_len,
                        (long long)capacity->blocks, (long long)capacity->offsets_len, (long long)as.sorted_len,
                        (long long)as.blocks, (long long)as.offsets_len);
    if ((uintptr_t)topk_ids % 4 || (uintptr_t)sorted_slots % 4 || (uintptr_t)block_experts % 4 ||
        (uintptr_t)expert_offsets % 4 || (uintptr_t)expert_counts % 4)
        return nbi_fail(ctx, NB_ERR_MISALIGNED, "%s: the int32 buffers must be 4-byte aligned", fn);
    nbi_moe_plan p;
    memset(&p, 0, sizeof p);
    p.block = block;
    p.m = d->m;
    p.experts = d->experts;
    p.top_k = d->top_k;
    p.slots = as.slots;
    p.sorted_len = as.sorted_len;
    p.blocks = as.blocks;
    if ((st = nbi_cuda_moe_align(ctx, &p, topk_ids, sorted_slots, block_experts, expert_offsets, expert_counts,
                                 NULL, stream)))
        return nbi_reraise(ctx, st, fn);
    return NB_OK;
}

/* ------------------------------------------------------------ nb_glu */

static nb_status check_glu(nb_context *ctx, const nb_glu_desc *d, const char *fn) {
    if (!d) return nbi_fail(ctx, NB_ERR_NULL_POINTER, "%s: the descriptor is NULL", fn);
    if (!reserved_zero(d->reserved, sizeof d->reserved / sizeof d->reserved[0]))
        return nbi_fail(ctx, NB_ERR_INVALID_ARGUMENT, "%s: reserved fields must be zero (nb_glu_desc_init)", fn);
    if (d->m <= 0 || d->m > NB_MOE_MAX_DIM || d->n <= 0 || d->n > NB_MOE_MAX_DIM)
        return nbi_fail(ctx, NB_ERR_BAD_SHAPE, "%s: m = %lld and n = %lld must be in [1, 2^31]", fn, (long long)d->m,
                        (long long)d->n);
    if ((double)d->m * 2.0 * (double)d->n > NB_MOE_MAX_ELEMS)
        return nbi_fail(ctx, NB_ERR_BAD_SHAPE, "%s: m x 2n = %.0f elements exceed 2^50", fn,
                        (double)d->m * 2.0 * (double)d->n);
    nb_status st = check_act(ctx, d->activation, d->layout, "layout", d->limit, d->alpha, fn);
    if (st) return st;
    if (!nbi_dtype_size(d->dtype)) return nbi_fail(ctx, NB_ERR_UNSUPPORTED, "%s: unknown dtype %d", fn, (int)d->dtype);
    return NB_OK;
}

nb_status nb_glu_desc_validate(const nb_glu_desc *d) { return check_glu(NULL, d, "nb_glu_desc_validate"); }

nb_status nb_glu_desc_init(nb_glu_desc *d, nb_moe_activation activation, int64_t m, int64_t n, nb_dtype dtype) {
    if (!d) return nbi_fail(NULL, NB_ERR_NULL_POINTER, "nb_glu_desc_init: d is NULL");
    memset(d, 0, sizeof *d);
    d->m = m;
    d->n = n;
    d->activation = activation;
    d->dtype = dtype;
    act_defaults(activation, &d->layout, &d->limit, &d->alpha);
    return check_glu(NULL, d, "nb_glu_desc_init");
}

/* The buffer rules nb_glu_host and nb_glu share (d validated): gu and h
 * not NULL and not overlapping. */
static nb_status check_glu_buffers(nb_context *ctx, const nb_glu_desc *d, const void *gu, const void *h,
                                   const char *fn) {
    if (!gu || !h) return nbi_fail(ctx, NB_ERR_NULL_POINTER, "%s: gu and h must not be NULL", fn);
    const size_t es = nbi_dtype_size(d->dtype);
    const uintptr_t a = (uintptr_t)gu, b = (uintptr_t)h;
    const uintptr_t gub = (uintptr_t)(d->m * 2 * d->n) * es, hb = (uintptr_t)(d->m * d->n) * es;
    if (a < b + hb && b < a + gub)
        return nbi_fail(ctx, NB_ERR_INVALID_ARGUMENT, "%s: gu and h overlap (h is written while gu is read)", fn);
    return NB_OK;
}

nb_status nb_glu_host(nb_context *ctx, const nb_glu_desc *d, const void *gu, void *h) {
    static const char fn[] = "nb_glu_host";
    nb_status st = check_glu(ctx, d, fn);
    if (st || (st = check_glu_buffers(ctx, d, gu, h, fn))) return st;
    const int64_t I = d->n;
    const int il = d->layout == NB_MOE_GATE_UP_INTERLEAVED;
    for (int64_t t = 0; t < d->m; t++)
        for (int64_t i = 0; i < I; i++) {
            const size_t row = (size_t)(t * 2 * I);
            const float g = nbi_load(d->dtype, gu, row + (size_t)(il ? 2 * i : i));
            const float u = nbi_load(d->dtype, gu, row + (size_t)(il ? 2 * i + 1 : I + i));
            nbi_store(d->dtype, h, (size_t)(t * I + i), act_f3(d->activation, d->limit, d->alpha, g, u));
        }
    return NB_OK;
}

nb_status nb_glu(nb_context *ctx, const nb_glu_desc *d, const void *gu, void *h, void *stream) {
    static const char fn[] = "nb_glu";
    nb_status st = nbi_need_device(ctx, fn);
    if (st) return st;
    if ((st = check_glu(ctx, d, fn))) return st;
    if (d->dtype != NB_DTYPE_BF16 && d->dtype != NB_DTYPE_F16)
        return nbi_fail(ctx, NB_ERR_UNSUPPORTED, "%s: the device takes BF16 or F16, not %s (F32: nb_glu_host)", fn,
                        nbi_dtype_name(d->dtype));
    if ((uintptr_t)gu % 2 || (uintptr_t)h % 2) /* (NULL passes here: check_glu_buffers names it) */
        return nbi_fail(ctx, NB_ERR_MISALIGNED, "%s: gu and h must be 2-byte aligned", fn);
    if ((st = check_glu_buffers(ctx, d, gu, h, fn))) return st;
    int capturing = 0;
    const int pdl = nbi_pdl_begin(ctx, stream, ctx->info.cc_major >= 9 && ctx->env_pdl != 1, 0, &capturing);
    st = nbi_cuda_glu(ctx, d, gu, h, pdl, stream);
    nbi_pdl_end(ctx, stream, capturing, 0, st);
    return st ? nbi_reraise(ctx, st, fn) : NB_OK;
}
