/* test_ckpt_quantize_int.c - nb_ckpt_quantize to int4 / int4_sym / int8 in
 * the compressed-tensors pack-quantized layout (nibble_io.h "quantize",
 * docs/formats.md 5.4).  A small BF16/F16/F32 checkpoint - rows that are not
 * a multiple of 8 (zero-point padding), a K that is not a multiple of 8
 * (4-bit weight_packed padding), an odd K (per channel: int8 only, 8-bit
 * padding), K that only some groups divide, a layer whose weight_shape is
 * already there - is quantized with every group (32, 64, 128, per channel)
 * and both scale types, then:
 *   - every tensor is checked against bytes packed here element by element
 *     from nb_quantize_host_v2's codes, scales and zero points (written from
 *     formats.md 5.4, independently of ckpt_quantize.c's word packing);
 *   - nb_ckpt_open must classify each quantized layer ct-int4 / ct-int4-sym
 *     / ct-int8 as declared by config.json, and nb_ckpt_layer_weight_v2 must
 *     return exactly the quantizer's codes, scales and zero points;
 *   - config.json's quantization_config holds the documented fields;
 *   - unquantized weights are byte-identical copies and listed in ignore;
 *   - refusals (MSE, device GPU, groups, scale types) leave no output. */
#define _POSIX_C_SOURCE 200809L
#include "ckpt_jsonlib.h"

#include <math.h>
#include <unistd.h>

static const ispec k_t[] = {
    {"lm_head.weight", NB_ST_BF16, 2, {8, 64}},                 /* default exclude */
    {"m.layers.0.c_proj.weight", NB_ST_BF16, 2, {8, 64}},       /* its weight_shape is already there */
    {"m.layers.0.c_proj.weight_shape", NB_ST_I64, 1, {2, 0}},
    {"m.layers.0.norm.weight", NB_ST_BF16, 1, {64, 0}},
    {"m.layers.0.o_proj.weight", NB_ST_F32, 2, {13, 128}},      /* N % 8 != 0 */
    {"m.layers.0.odd_proj.weight", NB_ST_BF16, 2, {5, 20}},     /* K % 8 != 0: per channel only */
    {"m.layers.0.q_proj.weight", NB_ST_BF16, 2, {24, 256}},
    {"m.layers.0.tail_proj.weight", NB_ST_F16, 2, {3, 21}},     /* K odd: int8 per channel only */
    {"m.layers.0.up_proj.weight", NB_ST_F16, 2, {16, 64}},
};
#define NI (sizeof k_t / sizeof k_t[0])
static void *g_src[NI];
static size_t g_nbytes[NI];

static const char *k_cfg = "{\"architectures\": [\"LlamaForCausalLM\"], \"hidden_size\": 64}\n";

static void make_fixture(void) { ckpt_float_fixture(k_t, NI, g_src, g_nbytes, k_cfg); }

/* The group of weight i in format fmt, or 0 when it is left unquantized
 * (written from the rules of nibble_io.h, not from ckpt_quantize.c). */
static int64_t expect_group(size_t i, nb_format fmt, int32_t group) {
    const ispec *p = &k_t[i];
    if (p->rank != 2 || !ends_with(p->name, ".weight") || strstr(p->name, "lm_head") || strstr(p->name, "c_proj"))
        return 0;
    const int64_t k = p->shape[1];
    if (group == NB_CKPT_GROUP_PER_CHANNEL) return k % 2 && fmt != NB_FORMAT_INT8 ? 0 : k;
    return k % (group ? group : 128) ? 0 : (group ? group : 128);
}

/* The layout nibble's reader names a compressed-tensors layer of format f. */
static nb_ckpt_format ct_layout(nb_format f) {
    return f == NB_FORMAT_INT4 ? NB_CKPT_CT_INT4 : f == NB_FORMAT_INT4_SYM ? NB_CKPT_CT_INT4_SYM : NB_CKPT_CT_INT8;
}

static uint32_t rd32(const uint8_t *p) {
    return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}

/* Layer i as written: every member tensor against formats.md 5.4 packed here
 * from the reference quantization, and the reader's conversion back. */
static void check_layer(const nb_st_file *f, nb_ckpt *c, nb_context *ctx, size_t i, nb_format fmt, int64_t g,
                        nb_scale_type sty, const char *out) {
    const ispec *p = &k_t[i];
    const int64_t n = p->shape[0], k = p->shape[1], ng = k / g;
    const int sym = fmt != NB_FORMAT_INT4, bits = fmt == NB_FORMAT_INT8 ? 8 : 4, per = 32 / bits;
    char prefix[256];
    snprintf(prefix, sizeof prefix, "%.*s", (int)(strlen(p->name) - 7), p->name);
    /* the reference */
    nb_weight_desc d;
    nb_weight_desc_init(&d, fmt, n, k);
    d.group_size = (int32_t)g;
    d.scale_type = sty;
    nb_weight_sizes_v2 sz;
    CHECK(nb_weight_desc_validate(&d) == NB_OK && nb_weight_get_sizes_v2(&d, &sz) == NB_OK, "%s: desc", prefix);
    uint8_t *rc = (uint8_t *)malloc(sz.codes_bytes), *rs = (uint8_t *)malloc(sz.scales_bytes);
    uint8_t *rz = sz.zeros_bytes ? (uint8_t *)malloc(sz.zeros_bytes) : NULL;
    const nb_weight_buffers rb = {.codes = rc, .scales = rs, .zeros = rz};
    nb_status st = nb_quantize_host_v2(ctx, &d, src_dtype(p->dt), g_src[i], &rb);
    CHECK(st == NB_OK, "%s: reference quantize: %s", prefix, nb_last_error());

    nb_st_tensor t;
    char name[320];
    snprintf(name, sizeof name, "%.255s.weight", prefix);
    CHECK(nb_st_tensor_find(f, name, &t) == NB_ERR_NOT_FOUND, "%s: %s is still there", out, name);
    /* weight_packed I32 [N, ceil(K/per)]: element j at bits b(j % per) of word j / per, offset 2^(b-1) when
     * symmetric (per = 32/b: 8 nibbles or 4 bytes) */
    const int64_t words = (k + per - 1) / per;
    if (find(f, prefix, ".weight_packed", &t)) {
        CHECK(t.dtype == NB_ST_I32 && t.rank == 2 && t.shape[0] == n && t.shape[1] == words, "%s: %s shape", out,
              t.name);
        int bad = 0;
        for (int64_t r = 0; r < n && !bad && t.shape[1] == words; r++)
            for (int64_t w = 0; w < words && !bad; w++) {
                uint32_t want = 0;
                for (int64_t e = 0; e < per && w * per + e < k; e++) {
                    const size_t j = (size_t)(r * k + w * per + e);
                    unsigned stored;
                    if (bits == 8) {
                        stored = (unsigned)((int)(int8_t)rc[j] + 128); /* signed q + 128 */
                    } else {
                        const unsigned q = (unsigned)nib(rc, j);
                        stored = sym ? (unsigned)((((int)q ^ 8) - 8) + 8) & 15 : q; /* signed q + 8 */
                    }
                    want |= (uint32_t)stored << (bits * e);
                }
                const uint32_t got = rd32((const uint8_t *)t.data + 4 * (r * words + w));
                if (got != want) {
                    CHECK(0, "%s: %s row %lld word %lld = %08x, want %08x", out, t.name, (long long)r, (long long)w,
                          got, want);
                    bad = 1;
                }
            }
        CHECK(!bad, "%s: %s", out, t.name);
    }
    if (find(f, prefix, ".weight_scale", &t))
        CHECK(t.dtype == (sty == NB_SCALE_BF16 ? NB_ST_BF16 : NB_ST_F16) && t.rank == 2 && t.shape[0] == n &&
                  t.shape[1] == ng && t.bytes == sz.scales_bytes && !memcmp(t.data, rs, sz.scales_bytes),
              "%s: %s differs from the quantizer's scales", out, t.name);
    if (find(f, prefix, ".weight_shape", &t)) {
        int64_t sh[2] = {0, 0};
        if (t.bytes == 16) memcpy(sh, t.data, 16);
        CHECK(t.dtype == NB_ST_I64 && t.rank == 1 && t.shape[0] == 2 && sh[0] == n && sh[1] == k, "%s: %s", out,
              t.name);
    }
    snprintf(name, sizeof name, "%.255s.weight_zero_point", prefix);
    const nb_status zst = nb_st_tensor_find(f, name, &t);
    if (sym) {
        CHECK(zst == NB_ERR_NOT_FOUND, "%s: a symmetric format wrote %s", out, name);
    } else if (zst != NB_OK) {
        CHECK(0, "%s: %s missing", out, name);
    } else {
        /* I32 [ceil(N/8), K/G]: row r at bits 4(r % 8) of word row r / 8, padding rows zero */
        const int64_t zr = (n + 7) / 8;
        CHECK(t.dtype == NB_ST_I32 && t.rank == 2 && t.shape[0] == zr && t.shape[1] == ng, "%s: %s shape", out, name);
        int bad = 0;
        for (int64_t w = 0; w < zr && !bad && t.shape[0] == zr && t.shape[1] == ng; w++)
            for (int64_t b = 0; b < ng && !bad; b++) {
                uint32_t want = 0;
                for (int64_t e = 0; e < 8 && w * 8 + e < n; e++) want |= (uint32_t)(rz[(w * 8 + e) * ng + b] & 15) << (4 * e);
                const uint32_t got = rd32((const uint8_t *)t.data + 4 * (w * ng + b));
                if (got != want) {
                    CHECK(0, "%s: %s word [%lld, %lld] = %08x, want %08x", out, name, (long long)w, (long long)b, got,
                          want);
                    bad = 1;
                }
            }
        for (int64_t r = 0; r < n && !bad; r++) /* the quantizer's zero points are 4-bit (packing keeps them) */
            for (int64_t b = 0; b < ng; b++) bad |= rz[r * ng + b] > 15;
        CHECK(!bad, "%s: %s", out, name);
    }

    /* the reader: ct-int4 / ct-int4-sym / ct-int8, declared by config.json, the same bytes back */
    check_read_back(c, out, prefix, ct_layout(fmt), &d, &sz, rc, rs, rz);
    free(rc);
    free(rs);
    free(rz);
}

static void check_config(const char *out, nb_format fmt, int32_t group) {
    const cJSON *qc;
    cJSON *j = read_config(out, &qc);
    if (!j) return;
    CHECK(jis(jget(qc, "quant_method", NULL, NULL), "compressed-tensors") &&
              jis(jget(qc, "format", NULL, NULL), "pack-quantized") &&
              jis(jget(qc, "quantization_status", NULL, NULL), "compressed") &&
              jis(jget(qc, "producer", "name", NULL), "nibble"),
          "%s: quant_method / format / status / producer", out);
    const cJSON *g0 = jget(qc, "config_groups", "group_0", NULL);
    const cJSON *w = jget(g0, "weights", NULL, NULL);
    CHECK(has(jget(g0, "targets", NULL, NULL), "Linear") && cJSON_IsNull(jget(g0, "input_activations", NULL, NULL)),
          "%s: targets / input_activations", out);
    CHECK(cJSON_GetNumberValue(jget(w, "num_bits", NULL, NULL)) == (fmt == NB_FORMAT_INT8 ? 8 : 4) &&
              jis(jget(w, "type", NULL, NULL), "int") && cJSON_IsBool(jget(w, "symmetric", NULL, NULL)) &&
              cJSON_IsTrue(jget(w, "symmetric", NULL, NULL)) == (fmt != NB_FORMAT_INT4) &&
              cJSON_IsFalse(jget(w, "dynamic", NULL, NULL)),
          "%s: weights num_bits / type / symmetric / dynamic", out);
    if (group == NB_CKPT_GROUP_PER_CHANNEL)
        CHECK(jis(jget(w, "strategy", NULL, NULL), "channel") && cJSON_IsNull(jget(w, "group_size", NULL, NULL)),
              "%s: per channel: strategy channel, group_size null", out);
    else
        CHECK(jis(jget(w, "strategy", NULL, NULL), "group") &&
                  cJSON_GetNumberValue(jget(w, "group_size", NULL, NULL)) == (group ? group : 128),
              "%s: strategy group, group_size %d", out, group ? group : 128);
    const cJSON *ig = jget(qc, "ignore", NULL, NULL);
    CHECK(has(ig, "lm_head") && has(ig, "m.layers.0.c_proj"), "%s: ignore lacks lm_head or c_proj", out);
    for (size_t i = 0; i < NI; i++) {
        if (k_t[i].rank != 2 || !ends_with(k_t[i].name, ".weight")) continue;
        char prefix[256];
        snprintf(prefix, sizeof prefix, "%.*s", (int)(strlen(k_t[i].name) - 7), k_t[i].name);
        CHECK(has(ig, prefix) == !expect_group(i, fmt, group), "%s: ignore and %s disagree", out, prefix);
    }
    cJSON_Delete(j);
}

static void run_int(const char *out, nb_format fmt, int32_t group, int32_t sty) {
    nb_ckpt_quantize_opts o;
    nb_ckpt_quantize_opts_init(&o);
    o.format = fmt;
    o.group_size = group;
    o.scale_type = sty;
    nb_ckpt_quantize_summary s;
    if (!quantize_in(out, &o, &s)) return;
    size_t nq = 0;
    for (size_t i = 0; i < NI; i++) nq += expect_group(i, fmt, group) != 0;
    check_summary(out, &s, k_t, NI, nq);
    nb_st_file *f;
    nb_ckpt *c;
    nb_context *ctx;
    if (ckpt_output_open(out, &f, &c, &ctx)) {
        nb_ckpt_config cfg;
        nb_ckpt_get_config(c, &cfg);
        CHECK(cfg.declared == ct_layout(fmt), "%s: config declares %s", out, fmt_name(cfg.declared));
        size_t count = 0;
        nb_st_count(f, &count);
        CHECK(count == NI + nq * (fmt == NB_FORMAT_INT4 ? 3 : 2), "%s: %zu tensors", out, count);
        for (size_t i = 0; i < NI; i++) {
            const int64_t g = expect_group(i, fmt, group);
            if (g) {
                check_layer(f, c, ctx, i, fmt, g, sty ? (nb_scale_type)sty : NB_SCALE_F16, out);
                continue;
            }
            check_copy(f, &k_t[i], g_src[i], g_nbytes[i], out);
        }
        /* the layer whose weight_shape was there is a float layer, not a broken ct one */
        size_t li = 0;
        nb_ckpt_layer L = {0};
        CHECK(nb_ckpt_layer_find(c, "m.layers.0.c_proj", &li) == NB_OK && nb_ckpt_layer_at(c, li, &L) == NB_OK &&
                  L.format == NB_CKPT_NONE,
              "%s: c_proj is %s (%s)", out, fmt_name(L.format), L.problem);
    }
    ckpt_output_close(f, c, ctx);
    check_config(out, fmt, group);
    check_tokenizer_copied(out);
}

/* The option refusals of integer format fmt: MSE, device GPU, group `group`
 * and scale type `sty` (neither of which it takes). */
static void refuse_opts(const char *in, const char *op, nb_format fmt, int32_t group, int32_t sty) {
    char says[4][32] = {"nearest", "device", "", "scale_type"};
    snprintf(says[2], sizeof says[2], "group_size %d", (int)group);
    for (int c = 0; c < 4; c++) {
        nb_ckpt_quantize_opts o;
        nb_ckpt_quantize_opts_init(&o);
        o.format = fmt;
        if (c == 0) o.method = NB_QUANT_MSE;
        if (c == 1) o.device = NB_CKPT_DEVICE_GPU;
        if (c == 2) o.group_size = group;
        if (c == 3) o.scale_type = sty;
        const nb_status st = nb_ckpt_quantize(in, op, &o, NULL);
        CHECK(st == (c < 2 ? NB_ERR_UNSUPPORTED : NB_ERR_INVALID_ARGUMENT) && strstr(nb_last_error(), says[c]),
              "format %d, refusal \"%s\": %s (%s)", (int)fmt, says[c], nb_status_name(st), nb_last_error());
    }
}

static void test_refusals(void) {
    char in[1024], op[1024];
    snprintf(in, sizeof in, "%s/in", g_dir);
    snprintf(op, sizeof op, "%s/refused", g_dir);
    refuse_opts(in, op, NB_FORMAT_INT4, 16, NB_SCALE_F32);
    refuse_opts(in, op, NB_FORMAT_INT8, 256, NB_SCALE_E4M3);
    /* nothing to quantize: the reason names the group */
    nb_ckpt_quantize_opts o;
    nb_ckpt_quantize_opts_init(&o);
    o.format = NB_FORMAT_INT4;
    const char *all[1] = {"m.*"};
    o.exclude = all;
    o.nexclude = 1;
    nb_status st = nb_ckpt_quantize(in, op, &o, NULL);
    CHECK(st == NB_ERR_UNSUPPORTED && strstr(nb_last_error(), "nothing to quantize to int4") &&
              strstr(nb_last_error(), "multiple of 128"),
          "nothing to quantize: %s (%s)", nb_status_name(st), nb_last_error());
    o.group_size = NB_CKPT_GROUP_PER_CHANNEL;
    st = nb_ckpt_quantize(in, op, &o, NULL);
    CHECK(st == NB_ERR_UNSUPPORTED && strstr(nb_last_error(), "an even K"), "nothing to quantize per channel: %s (%s)",
          nb_status_name(st), nb_last_error());
    o.format = NB_FORMAT_INT8; /* (per channel, 8 bits: no K parity) */
    st = nb_ckpt_quantize(in, op, &o, NULL);
    CHECK(st == NB_ERR_UNSUPPORTED && strstr(nb_last_error(), "nothing to quantize to int8") &&
              !strstr(nb_last_error(), "even K"),
          "int8 nothing to quantize per channel: %s (%s)", nb_status_name(st), nb_last_error());
    CHECK(access(op, F_OK) != 0, "a refused quantization created OUT");
}

int main(int argc, char **argv) {
    int keep = fixture_dir_open(argc, argv, "nb_ckptqi_test");
    if (keep < 0) return 2;
    make_fixture();
    run_int("i4_default", NB_FORMAT_INT4, 0, 0);
    run_int("i4_g32_bf16", NB_FORMAT_INT4, 32, NB_SCALE_BF16);
    run_int("i4_g64", NB_FORMAT_INT4, 64, NB_SCALE_F16);
    run_int("i4_channel_bf16", NB_FORMAT_INT4, NB_CKPT_GROUP_PER_CHANNEL, NB_SCALE_BF16);
    run_int("i4s_default", NB_FORMAT_INT4_SYM, 0, 0);
    run_int("i4s_g32", NB_FORMAT_INT4_SYM, 32, 0);
    run_int("i4s_g64_bf16", NB_FORMAT_INT4_SYM, 64, NB_SCALE_BF16);
    run_int("i4s_channel", NB_FORMAT_INT4_SYM, NB_CKPT_GROUP_PER_CHANNEL, NB_SCALE_F16);
    run_int("i8_default", NB_FORMAT_INT8, 0, 0);
    run_int("i8_g32", NB_FORMAT_INT8, 32, NB_SCALE_F16);
    run_int("i8_g32_bf16", NB_FORMAT_INT8, 32, NB_SCALE_BF16);
    run_int("i8_g64_bf16", NB_FORMAT_INT8, 64, NB_SCALE_BF16);
    run_int("i8_g128_bf16", NB_FORMAT_INT8, 128, NB_SCALE_BF16);
    run_int("i8_channel", NB_FORMAT_INT8, NB_CKPT_GROUP_PER_CHANNEL, 0);
    run_int("i8_channel_bf16", NB_FORMAT_INT8, NB_CKPT_GROUP_PER_CHANNEL, NB_SCALE_BF16);
    test_refusals();
    for (size_t i = 0; i < NI; i++) free(g_src[i]);
    return fixture_dir_close(keep);
}
