/* ckpt_int.c - the checkpoint layouts whose weight is converted into
 * nibble's checkpoint layout when it is read: AWQ (GEMM), GPTQ,
 * compressed-tensors pack-quantized integers and bitsandbytes 4-bit
 * (docs/formats.md sections 4.3, 5.2-5.4; nibble_io.h,
 * nb_ckpt_layer_weight_v2).  checkpoint.c finds the anchor tensor and calls
 * the classifiers here; they check every member's dtype and shape against
 * the others (and against the config where it says something), record the
 * reason when a rule breaks (an inconsistent layer: nothing is guessed), and
 * keep an nbio_conv saying how the layer is read.  Reading transposes,
 * unpacks and re-packs into the caller's buffers; the values are those the
 * producer's own dequantization gives, bit for bit (tests/test_checkpoint.c
 * builds every layout from the packing formulas of formats.md). */
#include "io_internal.h"

#include <cjson/cJSON.h>

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ------------------------------------------------------------ config */

static const char *jstr(const cJSON *o, const char *key) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, key);
    return cJSON_IsString(v) ? v->valuestring : NULL;
}

/* An integer-valued JSON number at key, or `def`. */
static int jint(const cJSON *o, const char *key, int def) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, key);
    if (!cJSON_IsNumber(v) || v->valuedouble != floor(v->valuedouble) || fabs(v->valuedouble) > 1e9) return def;
    return (int)v->valuedouble;
}

/* A JSON boolean at key: 1, 0, or def when absent or not a boolean. */
static int jbool(const cJSON *o, const char *key, int def) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, key);
    return cJSON_IsBool(v) ? cJSON_IsTrue(v) : def;
}

/* ASCII case-insensitive equality (a may be NULL: not equal). */
int nbio_ieq(const char *a, const char *b) {
    if (!a) return 0;
    for (; *a && *b; a++, b++) {
        char x = *a, y = *b;
        if (x >= 'A' && x <= 'Z') x = (char)(x - 'A' + 'a');
        if (y >= 'A' && y <= 'Z') y = (char)(y - 'A' + 'a');
        if (x != y) return 0;
    }
    return *a == *b;
}

nb_ckpt_format nbio_qcfg_read(const cJSON *qc, nbio_qcfg *q) {
    memset(q, 0, sizeof *q);
    q->sym = -1;
    const char *method = jstr(qc, "quant_method");
    if (!method) return NB_CKPT_NONE;
    q->bits = jint(qc, "bits", 0);
    q->group_size = jint(qc, "group_size", 0);
    if (nbio_ieq(method, "awq")) {
        const int zp = jbool(qc, "zero_point", -1);
        q->sym = zp < 0 ? -1 : !zp;
        const char *v = jstr(qc, "version");
        if (v) snprintf(q->awq_version, sizeof q->awq_version, "%s", v);
        q->awq_not_gemm = v && !nbio_ieq(v, "gemm");
        return NB_CKPT_AWQ_INT4;
    }
    if (nbio_ieq(method, "gptq")) {
        q->sym = jbool(qc, "sym", -1);
        q->gptq_v2 = nbio_ieq(jstr(qc, "checkpoint_format"), "gptq_v2");
        return q->bits == 8 ? NB_CKPT_GPTQ_INT8 : NB_CKPT_GPTQ_INT4;
    }
    if (nbio_ieq(method, "bitsandbytes")) {
        if (!jbool(qc, "load_in_4bit", 0)) return NB_CKPT_NONE;
        const char *t = jstr(qc, "bnb_4bit_quant_type");
        return nbio_ieq(t, "fp4") ? NB_CKPT_BNB_FP4 : NB_CKPT_BNB_NF4; /* nf4 is the default of transformers */
    }
    if (nbio_ieq(method, "hqq")) return NB_CKPT_HQQ_INT4;
    if (nbio_ieq(method, "compressed-tensors")) {
        /* the first config group's weight scheme; its format, else the top-level one */
        const cJSON *groups = cJSON_GetObjectItemCaseSensitive(qc, "config_groups");
        const cJSON *g0 = cJSON_IsObject(groups) ? groups->child : NULL;
        const cJSON *w = cJSON_GetObjectItemCaseSensitive(g0, "weights");
        const char *fmt = jstr(g0, "format") ? jstr(g0, "format") : jstr(qc, "format");
        if (!nbio_ieq(fmt, "pack-quantized") || !cJSON_IsObject(w)) return NB_CKPT_NONE;
        q->bits = jint(w, "num_bits", 0);
        q->sym = jbool(w, "symmetric", -1);
        const char *strategy = jstr(w, "strategy");
        q->group_size = nbio_ieq(strategy, "channel") ? -1 : jint(w, "group_size", 0);
        if (q->bits == 8 && q->sym != 0) return NB_CKPT_CT_INT8;
        if (q->bits == 4) return q->sym == 0 ? NB_CKPT_CT_INT4 : NB_CKPT_CT_INT4_SYM;
    }
    return NB_CKPT_NONE;
}

/* ------------------------------------------------------------ helpers */

static int32_t rd32(const void *p, size_t i) {
    const uint8_t *b = (const uint8_t *)p + 4 * i;
    return (int32_t)((uint32_t)b[0] | (uint32_t)b[1] << 8 | (uint32_t)b[2] << 16 | (uint32_t)b[3] << 24);
}

static const char *dt_name(nb_st_dtype d) {
    const char *s = "?";
    nb_st_dtype_info(d, &s, NULL);
    return s;
}

static nb_scale_type scale_type_of(nb_st_dtype d) {
    return d == NB_ST_F16 ? NB_SCALE_F16 : d == NB_ST_BF16 ? NB_SCALE_BF16 : d == NB_ST_F32 ? NB_SCALE_F32 : 0;
}

/* Whether format f takes group g with k columns and scale type st (the row's
 * sets, nb_format_info): "" when it does, else why not. */
static const char *row_refuses(nb_format f, int64_t g, int64_t k, nb_scale_type st, char *why, size_t n) {
    nb_format_info fi;
    why[0] = 0;
    if (nb_format_get_info(f, &fi) != NB_OK) return snprintf(why, n, "no weight format for it"), why;
    const int pow2 = g > 0 && g <= 4096 && (g & (g - 1)) == 0 && (fi.groups & g);
    if (g <= 0 || k % g || !(pow2 || (g == k && (fi.groups & NB_GROUPS_PER_CHANNEL))))
        snprintf(why, n, "group %lld (K = %lld) is not one %s takes", (long long)g, (long long)k, fi.name);
    else if (!st || !(fi.scale_types & NB_SCALE_BIT(st)))
        snprintf(why, n, "%s takes no such scales", fi.name);
    return why;
}

static nbio_conv *new_conv(nb_ckpt_format layout, nb_format f) {
    nbio_conv *cv = (nbio_conv *)calloc(1, sizeof *cv);
    if (!cv) return NULL;
    cv->layout = layout;
    cv->format = f;
    cv->codes = cv->scales = cv->zeros = cv->gidx = cv->absmax = cv->nested_absmax = cv->nested_map = -1;
    return cv;
}

/* A g_idx tensor (I32 [k]) for groups of g: every value in [0, k/g), each
 * group exactly g columns; *permuted when they are not contiguous.  "" or
 * why not. */
static const char *check_gidx(const nb_st_tensor *t, int64_t k, int64_t g, int *permuted, char *why, size_t n) {
    why[0] = 0;
    *permuted = 0;
    if (t->dtype != NB_ST_I32 || t->rank != 1 || t->shape[0] != k)
        return snprintf(why, n, "g_idx must be I32 [%lld], is %s rank %d", (long long)k, dt_name(t->dtype), t->rank),
               why;
    const int64_t ng = k / g;
    int64_t *count = (int64_t *)calloc((size_t)ng, sizeof *count);
    if (!count) return snprintf(why, n, "out of memory reading g_idx"), why;
    for (int64_t j = 0; j < k && !why[0]; j++) {
        const int32_t v = rd32(t->data, (size_t)j);
        if (v < 0 || v >= ng) snprintf(why, n, "g_idx[%lld] = %d is not a group in [0, %lld)", (long long)j, v, (long long)ng);
        else if (++count[v] > g) snprintf(why, n, "g_idx puts more than %lld columns in group %d", (long long)g, v);
        else if (v != j / g) *permuted = 1;
    }
    free(count);
    return why;
}

/* ------------------------------------------------------------ AWQ, GPTQ */

nb_status nbio_classify_qweight(nb_ckpt *c, size_t ti) {
    const nb_st_tensor *w = nbio_ck_tensor(c, (int64_t)ti);
    size_t li;
    nb_status st = nbio_ck_add_layer(c, w->name, strlen(w->name) - strlen(".qweight"), &li);
    if (st != NB_OK) return st;
    const char *P = nbio_ck_prefix(c, li);
    int oom = 0;
    const int64_t jz = nbio_ck_member(c, P, ".qzeros", &oom), js = nbio_ck_member(c, P, ".scales", &oom);
    const int64_t jg = nbio_ck_member(c, P, ".g_idx", &oom);
    if (oom) return NB_ERR_OUT_OF_MEMORY;
    nb_ckpt_layer *L = nbio_ck_pub(c, li);
    L->weight_dtype = w->dtype;
    nbio_ck_own(c, (int64_t)ti, li), nbio_ck_own(c, jz, li), nbio_ck_own(c, js, li), nbio_ck_own(c, jg, li);
    if (jz < 0 || js < 0) return nbio_ck_bad(c, li, "%s.%s is missing", P, jz < 0 ? "qzeros" : "scales"), NB_OK;
    const nb_st_tensor *z = nbio_ck_tensor(c, jz), *s = nbio_ck_tensor(c, js);
    if (w->dtype != NB_ST_I32 || w->rank != 2 || z->dtype != NB_ST_I32 || z->rank != 2)
        return nbio_ck_bad(c, li, "qweight and qzeros must be I32 rank 2, are %s rank %d and %s rank %d",
                           dt_name(w->dtype), w->rank, dt_name(z->dtype), z->rank), NB_OK;
    if (s->rank != 2) return nbio_ck_bad(c, li, "scales must be rank 2, is rank %d", s->rank), NB_OK;
    const nbio_qcfg *q = nbio_ck_qcfg(c);
    const int64_t G = s->shape[0], N = s->shape[1];
    /* GPTQ's shapes cannot tell [K/8, N] at 4 bits from [K/4, N] at 8: only the config says 8 (AWQ is 4-bit) */
    const int bits = q->bits == 8 ? 8 : 4, per = 32 / bits;
    int64_t K;
    nb_ckpt_format layout;
    if (w->shape[1] == N) { /* GPTQ: [K/per, N] */
        layout = bits == 8 ? NB_CKPT_GPTQ_INT8 : NB_CKPT_GPTQ_INT4;
        K = w->shape[0] * per;
    } else if (w->shape[1] * 8 == N) { /* AWQ: [K, N/8] */
        layout = NB_CKPT_AWQ_INT4;
        K = w->shape[0];
    } else {
        return nbio_ck_bad(c, li, "qweight [%lld, %lld] is neither GPTQ's [K/%d, N] nor AWQ's [K, N/8] for scales "
                           "[%lld, %lld]", (long long)w->shape[0], (long long)w->shape[1], per, (long long)G,
                           (long long)N), NB_OK;
    }
    L->n = N, L->k = K;
    if (layout == NB_CKPT_AWQ_INT4 && jg >= 0) return nbio_ck_bad(c, li, "g_idx next to an AWQ qweight"), NB_OK;
    if (q->bits && q->bits != 4 && !(q->bits == 8 && layout == NB_CKPT_GPTQ_INT8))
        return nbio_ck_bad(c, li, "the config says %d bits; nibble reads %s", q->bits,
                           layout == NB_CKPT_AWQ_INT4 ? "4-bit AWQ" : "4- and 8-bit GPTQ"), NB_OK;
    if (layout == NB_CKPT_AWQ_INT4 && q->awq_not_gemm)
        return nbio_ck_bad(c, li, "AWQ version \"%s\": only the GEMM layout is read", q->awq_version), NB_OK;
    if (N <= 0 || K <= 0 || G <= 0 || N % per || K % G)
        return nbio_ck_bad(c, li, "N = %lld must be a positive multiple of %d and K = %lld one of the %lld groups",
                           (long long)N, per, (long long)K, (long long)G), NB_OK;
    if (z->shape[0] != G || z->shape[1] != N / per)
        return nbio_ck_bad(c, li, "qzeros is [%lld, %lld], want [%lld, %lld] ([K/G, N/%d])", (long long)z->shape[0],
                           (long long)z->shape[1], (long long)G, (long long)(N / per), per), NB_OK;
    const int64_t g = K / G;
    const nb_format f = bits == 8 ? NB_FORMAT_INT8 : NB_FORMAT_INT4;
    char why[200];
    if (q->group_size > 0 && q->group_size != g && !(G == 1 && q->group_size >= K)) { /* the tensors decide */
        L->config_mismatch = 1;
        snprintf(L->problem, sizeof L->problem, "config.json says group_size %d; the tensors have groups of %lld",
                 q->group_size, (long long)g);
    }
    if (row_refuses(f, g, K, scale_type_of(s->dtype), why, sizeof why)[0])
        return nbio_ck_bad(c, li, "%s (scales %s)", why, dt_name(s->dtype)), NB_OK;
    int permuted = 0;
    if (jg >= 0 && check_gidx(nbio_ck_tensor(c, jg), K, g, &permuted, why, sizeof why)[0])
        return nbio_ck_bad(c, li, "%s", why), NB_OK;
    const int zero_plus_one = layout != NB_CKPT_AWQ_INT4 && !q->gptq_v2;
    /* int8 has no zero points: 8-bit GPTQ is read when every one is 128 (sym=True), codes q - 128 */
    for (int64_t b = 0; bits == 8 && b < G; b++)
        for (int64_t r = 0; r < N; r++) {
            const unsigned zst = ((uint32_t)rd32(z->data, (size_t)(b * (N / 4) + r / 4)) >> (8 * (r % 4))) & 255;
            const unsigned zv = zero_plus_one ? (zst + 1) & 255 : zst;
            if (zv != 128)
                return nbio_ck_bad(c, li, "asymmetric 8-bit GPTQ (zero point %u at group %lld, column %lld): no "
                                   "format holds 8-bit codes with zero points", zv, (long long)b, (long long)r), NB_OK;
        }
    nbio_conv *cv = new_conv(layout, f);
    if (!cv) return NB_ERR_OUT_OF_MEMORY;
    cv->group = (int32_t)g, cv->scale_type = scale_type_of(s->dtype), cv->bits = bits;
    cv->codes = (int64_t)ti, cv->scales = js, cv->zeros = bits == 8 ? -1 : jz, cv->gidx = permuted ? jg : -1;
    cv->zero_plus_one = zero_plus_one;
    cv->k_permuted = permuted;
    nbio_ck_set_conv(c, li, cv);
    L->format = layout, L->tensor_scale = 1.0f, L->k_permuted = permuted;
    return NB_OK;
}

/* ------------------------------------------------------------ compressed-tensors */

nb_status nbio_classify_ct_int(nb_ckpt *c, size_t ti) {
    const nb_st_tensor *w = nbio_ck_tensor(c, (int64_t)ti);
    size_t li;
    nb_status st = nbio_ck_add_layer(c, w->name, strlen(w->name) - strlen(".weight_packed"), &li);
    if (st != NB_OK) return st;
    const char *P = nbio_ck_prefix(c, li);
    int oom = 0;
    const int64_t js = nbio_ck_member(c, P, ".weight_scale", &oom), jz = nbio_ck_member(c, P, ".weight_zero_point", &oom);
    const int64_t jsh = nbio_ck_member(c, P, ".weight_shape", &oom), jg = nbio_ck_member(c, P, ".weight_g_idx", &oom);
    if (oom) return NB_ERR_OUT_OF_MEMORY;
    nb_ckpt_layer *L = nbio_ck_pub(c, li);
    L->weight_dtype = w->dtype;
    nbio_ck_own(c, (int64_t)ti, li), nbio_ck_own(c, js, li), nbio_ck_own(c, jz, li), nbio_ck_own(c, jsh, li);
    nbio_ck_own(c, jg, li);
    if (js < 0 || jsh < 0)
        return nbio_ck_bad(c, li, "%s.%s is missing", P, js < 0 ? "weight_scale" : "weight_shape"), NB_OK;
    const nb_st_tensor *s = nbio_ck_tensor(c, js), *sh = nbio_ck_tensor(c, jsh);
    if ((sh->dtype != NB_ST_I32 && sh->dtype != NB_ST_I64) || sh->rank != 1 || sh->shape[0] != 2)
        return nbio_ck_bad(c, li, "weight_shape must be I32 or I64 [2]"), NB_OK;
    int64_t N, K;
    if (sh->dtype == NB_ST_I32) N = rd32(sh->data, 0), K = rd32(sh->data, 1);
    else memcpy(&N, sh->data, 8), memcpy(&K, (const uint8_t *)sh->data + 8, 8);
    L->n = N, L->k = K;
    if (w->rank != 2 || s->rank != 2 || N <= 0 || K <= 0 || K > ((int64_t)1 << 40) || w->shape[0] != N ||
        s->shape[0] != N || s->shape[1] <= 0 || K % s->shape[1])
        return nbio_ck_bad(c, li, "weight_shape [%lld, %lld] does not fit weight_packed (rank %d) and weight_scale "
                           "(rank %d, [%lld, %lld])", (long long)N, (long long)K, w->rank, s->rank,
                           (long long)s->shape[0], (long long)s->shape[1]), NB_OK;
    /* the bits from the shapes (a checkpoint may mix 4 and 8 bits; its config names one scheme) */
    const int bits = w->shape[1] == (K + 7) / 8 ? 4 : w->shape[1] == (K + 3) / 4 ? 8 : 0;
    if ((bits != 4 && bits != 8) || w->shape[1] != (K * bits + 31) / 32)
        return nbio_ck_bad(c, li, "weight_packed has %lld words per row; K = %lld at %d bits needs %lld",
                           (long long)w->shape[1], (long long)K, bits, (long long)((K * bits + 31) / 32)), NB_OK;
    const int64_t G = s->shape[1], g = K / G;
    const nb_format f = jz >= 0 ? NB_FORMAT_INT4 : bits == 4 ? NB_FORMAT_INT4_SYM : NB_FORMAT_INT8;
    const nb_ckpt_format layout = jz >= 0 ? NB_CKPT_CT_INT4 : bits == 4 ? NB_CKPT_CT_INT4_SYM : NB_CKPT_CT_INT8;
    if (jz >= 0 && bits != 4) return nbio_ck_bad(c, li, "asymmetric %d-bit weights: no format holds them", bits), NB_OK;
    if (jz >= 0) {
        const nb_st_tensor *z = nbio_ck_tensor(c, jz);
        if (z->dtype != NB_ST_I32 || z->rank != 2 || z->shape[0] != (N + 7) / 8 || z->shape[1] != G)
            return nbio_ck_bad(c, li, "weight_zero_point must be I32 [%lld, %lld] ([N/8, K/G])", (long long)((N + 7) / 8),
                               (long long)G), NB_OK;
    }
    char why[200];
    if (row_refuses(f, g, K, scale_type_of(s->dtype), why, sizeof why)[0])
        return nbio_ck_bad(c, li, "%s (weight_scale %s)", why, dt_name(s->dtype)), NB_OK;
    int permuted = 0;
    if (jg >= 0 && check_gidx(nbio_ck_tensor(c, jg), K, g, &permuted, why, sizeof why)[0])
        return nbio_ck_bad(c, li, "weight_%s", why), NB_OK;
    nbio_conv *cv = new_conv(layout, f);
    if (!cv) return NB_ERR_OUT_OF_MEMORY;
    cv->group = (int32_t)g, cv->scale_type = scale_type_of(s->dtype), cv->bits = bits;
    cv->codes = (int64_t)ti, cv->scales = js, cv->zeros = jz, cv->gidx = permuted ? jg : -1;
    cv->k_permuted = permuted;
    nbio_ck_set_conv(c, li, cv);
    L->format = layout, L->tensor_scale = 1.0f, L->k_permuted = permuted;
    return NB_OK;
}

/* ------------------------------------------------------------ HQQ */

/* hqq's encode_safetensor_type of a meta value: an integer as a tensor of
 * rank 0 (or one element) of I32, I64 or U8 (bools as U8).  1 and *v, or 0. */
static int hqq_int(const nb_st_tensor *t, int64_t *v) {
    if (!t || (t->rank != 0 && !(t->rank == 1 && t->shape[0] == 1))) return 0;
    const uint8_t *b = (const uint8_t *)t->data;
    if (t->dtype == NB_ST_U8) return *v = b[0], 1;
    if (t->dtype == NB_ST_I32) return *v = rd32(b, 0), 1;
    if (t->dtype == NB_ST_I64) return memcpy(v, b, 8), 1;
    return 0;
}

/* A string meta value (U8 [len], one character a byte) equal to s. */
static int hqq_str_is(const nb_st_tensor *t, const char *s) {
    const size_t n = strlen(s);
    return t && t->dtype == NB_ST_U8 && t->rank == 1 && t->shape[0] == (int64_t)n && !memcmp(t->data, s, n);
}

/* The members hqq's HQQLinear.state_dict writes next to W_q besides scale
 * and zero (owned by the layer so that none is reported as left over). */
static const char *const k_hqq_meta[] = {".nbits", ".group_size", ".shape", ".axis", ".packing", ".unpack_view_dtype",
                                         ".view_as_float", ".quant_scale", ".quant_zero", ".compute_dtype",
                                         ".offload_meta", ".encoded_state_dict", ".stores_quant_config",
                                         ".channel_wise", ".optimize", ".round_zero"};
#define N_HQQ_META (sizeof k_hqq_meta / sizeof k_hqq_meta[0])

nb_status nbio_classify_hqq(nb_ckpt *c, size_t ti) {
    const nb_st_tensor *w = nbio_ck_tensor(c, (int64_t)ti);
    size_t li;
    nb_status st = nbio_ck_add_layer(c, w->name, strlen(w->name) - strlen(".W_q"), &li);
    if (st != NB_OK) return st;
    const char *P = nbio_ck_prefix(c, li);
    int oom = 0;
    const int64_t js = nbio_ck_member(c, P, ".scale", &oom), jz = nbio_ck_member(c, P, ".zero", &oom);
    int64_t jm[N_HQQ_META];
    for (size_t i = 0; i < N_HQQ_META; i++) jm[i] = nbio_ck_member(c, P, k_hqq_meta[i], &oom);
    if (oom) return NB_ERR_OUT_OF_MEMORY;
    nb_ckpt_layer *L = nbio_ck_pub(c, li);
    L->weight_dtype = w->dtype;
    nbio_ck_own(c, (int64_t)ti, li), nbio_ck_own(c, js, li), nbio_ck_own(c, jz, li);
    for (size_t i = 0; i < N_HQQ_META; i++) nbio_ck_own(c, jm[i], li);
    const nb_st_tensor *m[N_HQQ_META];
    for (size_t i = 0; i < N_HQQ_META; i++) m[i] = jm[i] >= 0 ? nbio_ck_tensor(c, jm[i]) : NULL;
    if (js < 0 || jz < 0 || !m[0] || !m[2] || !m[3] || !m[4])
        return nbio_ck_bad(c, li, "%s: W_q needs scale, zero, nbits, shape, axis and packing (hqq's state_dict); "
                           "%s is missing", P, js < 0 ? "scale" : jz < 0 ? "zero" : !m[0] ? "nbits" : !m[2] ? "shape"
                           : !m[3] ? "axis" : "packing"), NB_OK;
    int64_t nbits = 0, axis = -1, g = 0, flag = 0;
    if (!hqq_int(m[0], &nbits) || nbits != 4 || !hqq_str_is(m[4], "4bit_u8"))
        return nbio_ck_bad(c, li, "HQQ weights of nbits %lld or packing other than \"4bit_u8\": int4_hqq reads 4-bit "
                           "weights packed as 4bit_u8", (long long)nbits), NB_OK;
    if (!hqq_int(m[3], &axis) || axis != 1)
        return nbio_ck_bad(c, li, "HQQ groups along axis %lld: int4_hqq takes groups along K (axis 1)", (long long)axis),
               NB_OK;
    for (int i = 6; i <= 8; i++) /* view_as_float, quant_scale, quant_zero */
        if (m[i] && (!hqq_int(m[i], &flag) || flag))
            return nbio_ck_bad(c, li, "HQQ %s is set: W_q viewed as floats and quantized scales or zero points are "
                               "not read", k_hqq_meta[i] + 1), NB_OK;
    const nb_st_tensor *sh = m[2], *s = nbio_ck_tensor(c, js), *z = nbio_ck_tensor(c, jz);
    if ((sh->dtype != NB_ST_I64 && sh->dtype != NB_ST_I32) || sh->rank != 1 || sh->shape[0] != 2)
        return nbio_ck_bad(c, li, "HQQ shape must be I64 or I32 [2]"), NB_OK;
    int64_t N, K;
    if (sh->dtype == NB_ST_I32) N = rd32(sh->data, 0), K = rd32(sh->data, 1);
    else memcpy(&N, sh->data, 8), memcpy(&K, (const uint8_t *)sh->data + 8, 8);
    L->n = N, L->k = K;
    if (N <= 0 || K <= 0 || K > ((int64_t)1 << 40) || N > (((int64_t)1 << 62) / K))
        return nbio_ck_bad(c, li, "HQQ shape [%lld, %lld] is not a weight's", (long long)N, (long long)K), NB_OK;
    if (!m[1] || !hqq_int(m[1], &g)) g = K; /* (group_size None: one group per row) */
    if (g <= 0 || K % g || (N * (K / g)) % 2)
        return nbio_ck_bad(c, li, "HQQ group_size %lld does not divide K = %lld into an even number of groups",
                           (long long)g, (long long)K), NB_OK;
    const int64_t rows = N * (K / g);
    if (w->dtype != NB_ST_U8 || w->rank != 2 || w->shape[0] != rows / 2 || w->shape[1] != g)
        return nbio_ck_bad(c, li, "HQQ W_q is %s rank %d, want U8 [%lld, %lld] for [%lld, %lld] in groups of %lld",
                           dt_name(w->dtype), w->rank, (long long)(rows / 2), (long long)g, (long long)N, (long long)K,
                           (long long)g), NB_OK;
    int64_t sn = 1, zn = 1;
    for (int i = 0; i < s->rank; i++) sn *= s->shape[i];
    for (int i = 0; i < z->rank; i++) zn *= z->shape[i];
    if (s->dtype != z->dtype || (s->dtype != NB_ST_F16 && s->dtype != NB_ST_BF16) || sn != rows || zn != rows)
        return nbio_ck_bad(c, li, "HQQ scale and zero must be both F16 or both BF16 with %lld values ([N K / G, 1]); "
                           "are %s (%lld) and %s (%lld)", (long long)rows, dt_name(s->dtype), (long long)sn,
                           dt_name(z->dtype), (long long)zn), NB_OK;
    char why[200];
    if (row_refuses(NB_FORMAT_INT4_HQQ, g, K, scale_type_of(s->dtype), why, sizeof why)[0])
        return nbio_ck_bad(c, li, "%s (scale %s)", why, dt_name(s->dtype)), NB_OK;
    nbio_conv *cv = new_conv(NB_CKPT_HQQ_INT4, NB_FORMAT_INT4_HQQ);
    if (!cv) return NB_ERR_OUT_OF_MEMORY;
    cv->group = (int32_t)g, cv->scale_type = scale_type_of(s->dtype), cv->bits = 4;
    cv->codes = (int64_t)ti, cv->scales = js, cv->zeros = jz;
    nbio_ck_set_conv(c, li, cv);
    L->format = NB_CKPT_HQQ_INT4, L->tensor_scale = 1.0f;
    return NB_OK;
}

/* ------------------------------------------------------------ bitsandbytes */

nb_status nbio_classify_bnb(nb_ckpt *c, size_t ti, int64_t jstate) {
    const nb_st_tensor *w = nbio_ck_tensor(c, (int64_t)ti), *qs = nbio_ck_tensor(c, jstate);
    size_t li;
    nb_status st = nbio_ck_add_layer(c, w->name, strlen(w->name) - strlen(".weight"), &li);
    if (st != NB_OK) return st;
    const char *P = nbio_ck_prefix(c, li);
    int oom = 0;
    const int64_t ja = nbio_ck_member(c, P, ".weight.absmax", &oom), jm = nbio_ck_member(c, P, ".weight.quant_map", &oom);
    const int64_t jna = nbio_ck_member(c, P, ".weight.nested_absmax", &oom);
    const int64_t jnm = nbio_ck_member(c, P, ".weight.nested_quant_map", &oom);
    if (oom) return NB_ERR_OUT_OF_MEMORY;
    nb_ckpt_layer *L = nbio_ck_pub(c, li);
    L->weight_dtype = w->dtype;
    nbio_ck_own(c, (int64_t)ti, li), nbio_ck_own(c, jstate, li), nbio_ck_own(c, ja, li), nbio_ck_own(c, jm, li);
    nbio_ck_own(c, jna, li), nbio_ck_own(c, jnm, li);
    const int fp4 = nbio_ends_with(qs->name, "__fp4");
    const nb_format f = fp4 ? NB_FORMAT_BNB_FP4 : NB_FORMAT_NF4;
    if (qs->dtype != NB_ST_U8 || qs->rank != 1) return nbio_ck_bad(c, li, "quant_state must be U8 [bytes] (JSON)"), NB_OK;
    cJSON *j = cJSON_ParseWithLength((const char *)qs->data, qs->bytes); /* (a probe: records no message) */
    if (!cJSON_IsObject(j)) {
        cJSON_Delete(j);
        return nbio_ck_bad(c, li, "quant_state is not a JSON object"), NB_OK;
    }
    const cJSON *shape = cJSON_GetObjectItemCaseSensitive(j, "shape");
    char qt[16] = "";
    if (jstr(j, "quant_type")) snprintf(qt, sizeof qt, "%s", jstr(j, "quant_type"));
    const int B = jint(j, "blocksize", 0), NB = jint(j, "nested_blocksize", 0);
    const cJSON *off = cJSON_GetObjectItemCaseSensitive(j, "nested_offset");
    int64_t N = 0, K = 0;
    if (cJSON_GetArraySize(shape) == 2 && cJSON_IsNumber(cJSON_GetArrayItem(shape, 0)) &&
        cJSON_IsNumber(cJSON_GetArrayItem(shape, 1)) && cJSON_GetArrayItem(shape, 0)->valuedouble < 0x1p31 &&
        cJSON_GetArrayItem(shape, 1)->valuedouble < 0x1p31) { /* (so that N * K cannot overflow) */
        N = (int64_t)cJSON_GetArrayItem(shape, 0)->valuedouble;
        K = (int64_t)cJSON_GetArrayItem(shape, 1)->valuedouble;
    }
    const double offset = cJSON_IsNumber(off) ? off->valuedouble : NAN;
    cJSON_Delete(j);
    L->n = N, L->k = K;
    char why[200];
    if (strcmp(qt, fp4 ? "fp4" : "nf4"))
        return nbio_ck_bad(c, li, "quant_state says quant_type \"%s\" under the name of %s", qt, fp4 ? "fp4" : "nf4"),
               NB_OK;
    if (N <= 0 || K <= 0 || w->bytes != (uint64_t)((N * K + 1) / 2))
        return nbio_ck_bad(c, li, "quant_state shape [%lld, %lld] does not fit weight's %zu bytes", (long long)N,
                           (long long)K, w->bytes), NB_OK;
    if (row_refuses(f, B, K, NB_SCALE_F32, why, sizeof why)[0])
        return nbio_ck_bad(c, li, "blocksize %d: %s (blocks run over the flattened tensor; nibble reads them when "
                           "they divide K)", B, why), NB_OK;
    if (ja < 0 || jm < 0) return nbio_ck_bad(c, li, "%s.weight.%s is missing", P, ja < 0 ? "absmax" : "quant_map"), NB_OK;
    const nb_st_tensor *a = nbio_ck_tensor(c, ja), *m = nbio_ck_tensor(c, jm);
    const int64_t nblocks = N * K / B;
    if (m->dtype != NB_ST_F32 || m->bytes != 64) return nbio_ck_bad(c, li, "quant_map must be F32 [16]"), NB_OK;
    for (int i = 0; i < 16; i++) {
        const float v = nb_element_to_float(fp4 ? NB_ELEMENT_FP4_BNB : NB_ELEMENT_NF4, (uint8_t)i);
        if (memcmp(&v, (const uint8_t *)m->data + 4 * i, 4))
            return nbio_ck_bad(c, li, "quant_map[%d] is not the %s table's value (%a)", i, fp4 ? "fp4" : "nf4",
                               (double)v), NB_OK;
    }
    nbio_conv *cv = new_conv(fp4 ? NB_CKPT_BNB_FP4 : NB_CKPT_BNB_NF4, f);
    if (!cv) return NB_ERR_OUT_OF_MEMORY;
    cv->group = B, cv->scale_type = NB_SCALE_F32, cv->bits = 4, cv->codes = (int64_t)ti, cv->absmax = ja;
    const char *bad = NULL;
    if (a->dtype == NB_ST_F32) {
        if (a->bytes != (uint64_t)nblocks * 4) bad = "absmax must be F32 [N*K/blocksize]";
        else if (jna >= 0 || jnm >= 0) bad = "nested_absmax next to an F32 absmax";
    } else if (a->dtype == NB_ST_U8) {
        const nb_st_tensor *na = nbio_ck_tensor(c, jna), *nm = nbio_ck_tensor(c, jnm);
        if (a->bytes != (uint64_t)nblocks) bad = "absmax must be U8 [N*K/blocksize] (nested)";
        else if (!na || !nm) bad = "nested_absmax and nested_quant_map are needed with a U8 absmax";
        else if (NB <= 0 || na->dtype != NB_ST_F32 || na->bytes != (uint64_t)((nblocks + NB - 1) / NB) * 4)
            bad = "nested_absmax must be F32 [ceil(blocks / nested_blocksize)]";
        else if (nm->dtype != NB_ST_F32 || nm->bytes != 256 * 4) bad = "nested_quant_map must be F32 [256]";
        else if (!isfinite(offset)) bad = "quant_state has no finite nested_offset";
        cv->nested_absmax = jna, cv->nested_map = jnm, cv->nested_block = NB, cv->nested_offset = (float)offset;
    } else {
        bad = "absmax must be F32, or U8 when nested";
    }
    if (bad) {
        free(cv);
        return nbio_ck_bad(c, li, "%s", bad), NB_OK;
    }
    nbio_ck_set_conv(c, li, cv);
    L->format = cv->layout, L->tensor_scale = 1.0f;
    return NB_OK;
}

/* ------------------------------------------------------------ reading */

/* perm[j] for j < k: the stable order of the columns by group (identity
 * without a permuting g_idx). */
static nb_status make_perm(const nb_ckpt *c, const nbio_conv *cv, int64_t k, int32_t *perm) {
    if (!cv || cv->gidx < 0) {
        for (int64_t j = 0; j < k; j++) perm[j] = (int32_t)j;
        return NB_OK;
    }
    const nb_st_tensor *t = nbio_ck_tensor(c, cv->gidx);
    const int64_t ng = k / cv->group;
    int64_t *next = (int64_t *)malloc(sizeof(int64_t) * (size_t)ng);
    if (!next) return nbi_fail(NULL, NB_ERR_OUT_OF_MEMORY, "out of memory");
    for (int64_t b = 0; b < ng; b++) next[b] = b * cv->group; /* (classification checked every group's count) */
    for (int64_t j = 0; j < k; j++) perm[next[rd32(t->data, (size_t)j)]++] = (int32_t)j;
    free(next);
    return NB_OK;
}

static void put_code(uint8_t *codes, int bits, int64_t i, unsigned q) {
    if (bits == 8) codes[i] = (uint8_t)q;
    else codes[i >> 1] |= (uint8_t)((q & 15) << (4 * (i & 1)));
}

nb_status nbio_conv_read(const nb_ckpt *c, const char *prefix, const nbio_conv *cv, int64_t n, int64_t k,
                         nb_weight_desc *desc, const nb_weight_buffers *out, const nb_weight_sizes_v2 *cap) {
    static const char fn[] = "nb_ckpt_layer_weight_v2";
    memset(desc, 0, sizeof *desc);
    desc->format = cv->format, desc->layout = NB_LAYOUT_CHECKPOINT, desc->n = n, desc->k = k;
    desc->group_size = cv->group, desc->scale_type = cv->scale_type, desc->scale_rule = NB_MX_SCALE_OCP;
    desc->tensor_scale = 1.0f, desc->scale_exp_min = desc->scale_exp_max = -1;
    nb_weight_sizes_v2 sz;
    nb_status st = nb_weight_get_sizes_v2(desc, &sz);
    if (st != NB_OK) return nbi_fail(NULL, st, "%s: %s", prefix, nb_last_error());
    if (!out) return NB_OK;
    if (!out->codes || !out->scales || (sz.zeros_bytes && !out->zeros))
        return nbi_fail(NULL, NB_ERR_NULL_POINTER, "%s: codes, scales%s must not be NULL", fn,
                        sz.zeros_bytes ? " and zeros" : "");
    if ((!sz.zeros_bytes && out->zeros) || out->reserved[0] || out->reserved[1] || out->reserved[2] || out->reserved[3])
        return nbi_fail(NULL, NB_ERR_INVALID_ARGUMENT, "%s: %s: zeros%s must be NULL", fn, prefix,
                        sz.zeros_bytes ? " (has zero points): the reserved pointers" : " and the reserved pointers");
    if (cap->codes_bytes < sz.codes_bytes || cap->scales_bytes < sz.scales_bytes || cap->zeros_bytes < sz.zeros_bytes)
        return nbi_fail(NULL, NB_ERR_BUFFER_TOO_SMALL, "%s: %s needs %zu, %zu and %zu bytes of codes, scales and "
                        "zeros; the buffers hold %zu, %zu and %zu", fn, prefix, sz.codes_bytes, sz.scales_bytes,
                        sz.zeros_bytes, cap->codes_bytes, cap->scales_bytes, cap->zeros_bytes);
    int32_t *perm = (int32_t *)malloc(sizeof(int32_t) * (size_t)k);
    if (!perm) return nbi_fail(NULL, NB_ERR_OUT_OF_MEMORY, "%s: out of memory", fn);
    if ((st = make_perm(c, cv, k, perm)) != NB_OK) {
        free(perm);
        return st;
    }
    static const int awq_nibble[8] = {0, 4, 1, 5, 2, 6, 3, 7}; /* logical column j -> nibble (AWQ_REVERSE_ORDER) */
    const nb_st_tensor *qt = nbio_ck_tensor(c, cv->codes), *zt = nbio_ck_tensor(c, cv->zeros);
    const nb_st_tensor *stt = nbio_ck_tensor(c, cv->scales);
    const int64_t g = cv->group, ng = k / g;
    uint8_t *codes = (uint8_t *)out->codes, *scales = (uint8_t *)out->scales, *zeros = (uint8_t *)out->zeros;
    memset(codes, 0, sz.codes_bytes);
    switch (cv->layout) {
    case NB_CKPT_AWQ_INT4:    /* qweight [K, N/8], qzeros [K/G, N/8], scales [K/G, N] */
    case NB_CKPT_GPTQ_INT4:   /* qweight [K/8, N], qzeros [K/G, N/8], scales [K/G, N] */
    case NB_CKPT_GPTQ_INT8: { /* qweight [K/4, N]; zero points all 128 (classification): code q - 128 = q ^ 0x80 */
        const int awq = cv->layout == NB_CKPT_AWQ_INT4, bits = cv->bits, per = 32 / bits;
        const unsigned mask = (1u << bits) - 1, flip = bits == 8 ? 0x80 : 0;
        for (int64_t r = 0; r < n; r++) {
            for (int64_t j = 0; j < k; j++) {
                const int64_t src = perm[j];
                const uint32_t word = (uint32_t)(awq ? rd32(qt->data, (size_t)(src * (n / 8) + r / 8))
                                                     : rd32(qt->data, (size_t)((src / per) * n + r)));
                const int shift = bits * (awq ? awq_nibble[r % 8] : (int)(src % per));
                put_code(codes, bits, r * k + j, ((word >> shift) & mask) ^ flip);
            }
            for (int64_t b = 0; b < ng; b++) {
                memcpy(scales + 2 * (r * ng + b), (const uint8_t *)stt->data + 2 * (b * n + r), 2);
                if (!zt) continue; /* 8 bits: no zero points */
                const uint32_t zw = (uint32_t)rd32(zt->data, (size_t)(b * (n / 8) + r / 8));
                const unsigned z = (zw >> (4 * (awq ? awq_nibble[r % 8] : (int)(r % 8)))) & 15;
                zeros[r * ng + b] = (uint8_t)(cv->zero_plus_one ? (z + 1) & 15 : z);
            }
        }
        break;
    }
    case NB_CKPT_CT_INT4:     /* weight_packed [N, K*bits/32], offset 2^(bits-1); weight_scale [N, K/G] */
    case NB_CKPT_CT_INT4_SYM: /* weight_zero_point [N/8, K/G] (asymmetric), packed along N, offset 8 */
    case NB_CKPT_CT_INT8: {
        const int bits = cv->bits, per = 32 / bits, words = (int)((k * bits + 31) / 32);
        const unsigned mask = (1u << bits) - 1, flip = cv->layout == NB_CKPT_CT_INT4 ? 0 : 1u << (bits - 1);
        for (int64_t r = 0; r < n; r++)
            for (int64_t j = 0; j < k; j++) {
                const int64_t src = perm[j];
                const uint32_t word = (uint32_t)rd32(qt->data, (size_t)(r * words + src / per));
                put_code(codes, bits, r * k + j, ((word >> (bits * (src % per))) & mask) ^ flip);
            }
        memcpy(scales, stt->data, sz.scales_bytes); /* [N, K/G], as nibble stores them */
        for (int64_t r = 0; zt && r < n; r++)
            for (int64_t b = 0; b < ng; b++)
                zeros[r * ng + b] = (uint8_t)(((uint32_t)rd32(zt->data, (size_t)((r / 8) * ng + b)) >> (4 * (r % 8))) & 15);
        break;
    }
    case NB_CKPT_HQQ_INT4: { /* W_q [N K / 2G, G]: the high nibbles rows 0 .. of [N K / G, G], the low the rest */
        const uint8_t *w = (const uint8_t *)qt->data;
        const int64_t half = n * ng / 2 * g; /* elements in each half */
        for (int64_t i = 0; i < n * k; i++) {
            const uint8_t b = w[i < half ? i : i - half];
            put_code(codes, 4, i, i < half ? (unsigned)(b >> 4) : (unsigned)(b & 15));
        }
        memcpy(scales, stt->data, sz.scales_bytes); /* [N K / G, 1] = [N, K / G], 16-bit */
        memcpy(zeros, zt->data, sz.zeros_bytes);
        break;
    }
    case NB_CKPT_BNB_NF4: /* the first element of a pair in the high nibble */
    case NB_CKPT_BNB_FP4: {
        const uint8_t *w = (const uint8_t *)qt->data;
        for (size_t i = 0; i < sz.codes_bytes; i++) codes[i] = (uint8_t)(w[i] >> 4 | w[i] << 4);
        const nb_st_tensor *a = nbio_ck_tensor(c, cv->absmax);
        if (cv->nested_absmax < 0) {
            memcpy(scales, a->data, sz.scales_bytes);
        } else { /* bitsandbytes: dequantize_blockwise in float32, then += offset */
            const nb_st_tensor *na = nbio_ck_tensor(c, cv->nested_absmax), *nm = nbio_ck_tensor(c, cv->nested_map);
            const uint8_t *q = (const uint8_t *)a->data;
            for (int64_t i = 0; i < n * ng; i++) {
                float code, amax;
                memcpy(&code, (const uint8_t *)nm->data + 4 * (size_t)q[i], 4);
                memcpy(&amax, (const uint8_t *)na->data + 4 * (size_t)(i / cv->nested_block), 4);
                const float v = code * amax;
                const float s = v + cv->nested_offset;
                memcpy(scales + 4 * i, &s, 4);
            }
        }
        break;
    }
    default:
        free(perm);
        return nbi_fail(NULL, NB_ERR_INTERNAL, "%s: %s: no reader for its layout", fn, prefix);
    }
    free(perm);
    return NB_OK;
}

nb_status nb_ckpt_layer_perm(const nb_ckpt *c, size_t i, int32_t *perm, size_t count) {
    if (!c || !perm) return nbi_fail(NULL, NB_ERR_NULL_POINTER, "nb_ckpt_layer_perm: a required pointer is NULL");
    const nb_ckpt_layer *L = nbio_ckpt_layer_ref(c, i);
    if (!L) return nbi_fail(NULL, NB_ERR_NOT_FOUND, "nb_ckpt_layer_perm: layer %zu out of range", i);
    if (L->k <= 0)
        return nbi_fail(NULL, NB_ERR_UNSUPPORTED, "nb_ckpt_layer_perm: %s has no known k (%s)", L->prefix,
                        L->problem[0] ? L->problem : "no weight");
    if (count < (size_t)L->k)
        return nbi_fail(NULL, NB_ERR_BUFFER_TOO_SMALL, "nb_ckpt_layer_perm: %s has k = %lld, perm holds %zu",
                        L->prefix, (long long)L->k, count);
    return make_perm(c, nbio_ck_conv(c, i), L->k, perm);
}
