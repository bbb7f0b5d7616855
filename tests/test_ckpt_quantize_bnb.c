/* test_ckpt_quantize_bnb.c - nb_ckpt_quantize to nf4 / bnb_fp4 in
 * bitsandbytes' 4-bit serialization and to int4_hqq in hqq's (nibble_io.h
 * "quantize", docs/formats.md 4.3 and 5.5).  A small BF16/F16/F32 checkpoint - rows of every dtype, a K only
 * the smaller blocks divide, a layer whose absmax is already there, the
 * default excludes - is quantized with blocks of 32, 64 (the default), 128
 * and 256, then:
 *   - P.weight U8 [N*K/2, 1] against bytes packed here code by code from
 *     nb_quantize_host_v2's codes (the first code of each byte in the high
 *     nibble, row-major), P.weight.absmax F32 [N*K/B] against its absmax,
 *     P.weight.quant_map against the format's 16 values, and
 *     P.weight.quant_state.bitsandbytes__nf4 (__fp4) parsed as JSON
 *     (quant_type, blocksize, the weight's dtype, shape);
 *   - nb_ckpt_open must classify each quantized layer bnb-nf4 / bnb-fp4 as
 *     config.json declares, and nb_ckpt_layer_weight_v2 must return exactly
 *     the quantizer's codes and absmax;
 *   - config.json's quantization_config is transformers' BitsAndBytesConfig
 *     for 4 bits without double quantization, the compute dtype from
 *     torch_dtype, the unquantized modules in llm_int8_skip_modules;
 *   - unquantized weights are byte-identical copies;
 *   - refusals (MSE, device GPU, blocks, scale type) leave no output;
 *   - int4_hqq (groups 32 / 64 / 128, F16 / BF16, rounding to nearest and
 *     hqq's optimizer): the layers of an odd number of groups kept, W_q
 *     against bytes packed here from the quantizer's codes (group r in the
 *     high nibbles of row r, group R/2 + r in the low ones), scale and zero
 *     as the quantizer's, the meta values, the reader's hqq-int4 layers
 *     with exactly the quantizer's codes, scales and zero points, and
 *     config.json's HqqConfig.  (python/tests/test_hqq.py loads the same
 *     output into hqq's own HQQLinear.) */
#define _POSIX_C_SOURCE 200809L
#include "ckpt_jsonlib.h"

#include <math.h>
#include <unistd.h>

static const ispec k_t[] = {
    {"lm_head.weight", NB_ST_BF16, 2, {8, 64}},             /* default exclude */
    {"m.embed_tokens.weight", NB_ST_BF16, 2, {16, 64}},     /* default exclude */
    {"m.layers.0.c_proj.weight", NB_ST_BF16, 2, {8, 64}},   /* its absmax is already there */
    {"m.layers.0.c_proj.weight.absmax", NB_ST_F32, 1, {8, 0}},
    {"m.layers.0.norm.weight", NB_ST_BF16, 1, {64, 0}},
    {"m.layers.0.o_proj.weight", NB_ST_F32, 2, {13, 128}},  /* 13 rows: N K / B not a multiple of N */
    {"m.layers.0.odd_proj.weight", NB_ST_BF16, 2, {5, 96}}, /* K = 96: blocks of 32 only */
    {"m.layers.0.q_proj.weight", NB_ST_BF16, 2, {24, 256}},
    {"m.layers.0.up_proj.weight", NB_ST_F16, 2, {16, 64}},  /* K = 64: no blocks of 128, 256 */
};
#define NI (sizeof k_t / sizeof k_t[0])
static void *g_src[NI];
static size_t g_nbytes[NI];

static const char *k_cfg = "{\"architectures\": [\"LlamaForCausalLM\"], \"hidden_size\": 64, \"torch_dtype\": "
                           "\"float16\"}\n";

static void make_fixture(void) { ckpt_float_fixture(k_t, NI, g_src, g_nbytes, k_cfg); }

/* The block of weight i, or 0 when it is left unquantized (written from
 * the rules of nibble_io.h, not from ckpt_quantize.c). */
static int64_t expect_block(size_t i, int32_t block) {
    const ispec *p = &k_t[i];
    if (p->rank != 2 || !ends_with(p->name, ".weight") || strstr(p->name, "lm_head") ||
        strstr(p->name, "embed") || strstr(p->name, "c_proj"))
        return 0;
    const int64_t b = block ? block : 64;
    return p->shape[1] % b ? 0 : b;
}

static nb_ckpt_format bnb_layout(nb_format f) { return f == NB_FORMAT_NF4 ? NB_CKPT_BNB_NF4 : NB_CKPT_BNB_FP4; }

/* Layer i as written: every member tensor against bitsandbytes' layout
 * packed here from the reference quantization, and the reader's conversion
 * back. */
static void check_layer(const nb_st_file *f, nb_ckpt *c, nb_context *ctx, size_t i, nb_format fmt, int64_t b,
                        const char *out) {
    const ispec *p = &k_t[i];
    const int64_t n = p->shape[0], k = p->shape[1], e = n * k;
    char prefix[256];
    snprintf(prefix, sizeof prefix, "%.*s", (int)(strlen(p->name) - 7), p->name);
    nb_weight_desc d;
    nb_weight_desc_init(&d, fmt, n, k);
    d.group_size = (int32_t)b;
    nb_weight_sizes_v2 sz;
    CHECK(nb_weight_desc_validate(&d) == NB_OK && nb_weight_get_sizes_v2(&d, &sz) == NB_OK, "%s: desc", prefix);
    uint8_t *rc = (uint8_t *)malloc(sz.codes_bytes), *rs = (uint8_t *)malloc(sz.scales_bytes);
    const nb_weight_buffers rb = {.codes = rc, .scales = rs};
    CHECK(nb_quantize_host_v2(ctx, &d, src_dtype(p->dt), g_src[i], &rb) == NB_OK, "%s: reference quantize: %s",
          prefix, nb_last_error());

    nb_st_tensor t;
    /* weight U8 [N K / 2, 1]: byte j holds code 2j in its high nibble and 2j + 1 in its low one */
    if (find(f, prefix, ".weight", &t)) {
        CHECK(t.dtype == NB_ST_U8 && t.rank == 2 && t.shape[0] == e / 2 && t.shape[1] == 1, "%s: %s shape", out,
              t.name);
        int bad = 0;
        for (int64_t j = 0; j < e / 2 && !bad && t.bytes == (uint64_t)(e / 2); j++) {
            const uint8_t want = (uint8_t)(nib(rc, (size_t)(2 * j)) << 4 | nib(rc, (size_t)(2 * j + 1)));
            if (((const uint8_t *)t.data)[j] != want) {
                CHECK(0, "%s: %s byte %lld = %02x, want %02x", out, t.name, (long long)j,
                      ((const uint8_t *)t.data)[j], want);
                bad = 1;
            }
        }
    }
    if (find(f, prefix, ".weight.absmax", &t))
        CHECK(t.dtype == NB_ST_F32 && t.rank == 1 && t.shape[0] == e / b && t.bytes == sz.scales_bytes &&
                  !memcmp(t.data, rs, sz.scales_bytes),
              "%s: %s differs from the quantizer's absmax", out, t.name);
    if (find(f, prefix, ".weight.quant_map", &t)) {
        int same = t.dtype == NB_ST_F32 && t.rank == 1 && t.shape[0] == 16 && t.bytes == 64;
        for (int q = 0; q < 16 && same; q++) {
            float v;
            memcpy(&v, (const uint8_t *)t.data + 4 * q, 4);
            same = v == nb_element_to_float(fmt == NB_FORMAT_NF4 ? NB_ELEMENT_NF4 : NB_ELEMENT_FP4_BNB, (uint8_t)q);
        }
        CHECK(same, "%s: %s is not the format's table", out, t.name);
    }
    if (find(f, prefix, fmt == NB_FORMAT_NF4 ? ".weight.quant_state.bitsandbytes__nf4"
                                              : ".weight.quant_state.bitsandbytes__fp4",
             &t)) {
        char js[256] = "";
        if (t.bytes < sizeof js) memcpy(js, t.data, (size_t)t.bytes);
        cJSON *j = cJSON_Parse(js);
        const cJSON *sh = cJSON_GetObjectItemCaseSensitive(j, "shape");
        const char *dt = p->dt == NB_ST_F32 ? "float32" : p->dt == NB_ST_F16 ? "float16" : "bfloat16";
        const cJSON *qt = cJSON_GetObjectItemCaseSensitive(j, "quant_type"),
                    *bs = cJSON_GetObjectItemCaseSensitive(j, "blocksize"),
                    *dy = cJSON_GetObjectItemCaseSensitive(j, "dtype");
        CHECK(t.dtype == NB_ST_U8 && t.rank == 1 && j && cJSON_IsString(qt) &&
                  !strcmp(qt->valuestring, fmt == NB_FORMAT_NF4 ? "nf4" : "fp4") && cJSON_GetNumberValue(bs) == b &&
                  cJSON_IsString(dy) && !strcmp(dy->valuestring, dt) && cJSON_GetArraySize(sh) == 2 &&
                  cJSON_GetNumberValue(cJSON_GetArrayItem(sh, 0)) == n &&
                  cJSON_GetNumberValue(cJSON_GetArrayItem(sh, 1)) == k,
              "%s: %s = '%s'", out, t.name, js);
        cJSON_Delete(j);
    }
    /* no double quantization */
    char name[320];
    snprintf(name, sizeof name, "%.255s.weight.nested_absmax", prefix);
    CHECK(nb_st_tensor_find(f, name, &t) == NB_ERR_NOT_FOUND, "%s: %s written", out, name);

    /* the reader: bnb-nf4 / bnb-fp4, declared by config.json, the same bytes back */
    check_read_back(c, out, prefix, bnb_layout(fmt), &d, &sz, rc, rs, NULL);
    free(rc);
    free(rs);
}

static void check_config(const char *out, nb_format fmt, int32_t block) {
    const cJSON *qc;
    cJSON *j = read_config(out, &qc);
    if (!j) return;
    CHECK(jis(jget(qc, "quant_method", NULL, NULL), "bitsandbytes") &&
              cJSON_IsTrue(jget(qc, "load_in_4bit", NULL, NULL)) && cJSON_IsFalse(jget(qc, "load_in_8bit", NULL, NULL)) &&
              cJSON_IsTrue(jget(qc, "_load_in_4bit", NULL, NULL)) &&
              jis(jget(qc, "bnb_4bit_quant_type", NULL, NULL), fmt == NB_FORMAT_NF4 ? "nf4" : "fp4") &&
              cJSON_IsFalse(jget(qc, "bnb_4bit_use_double_quant", NULL, NULL)) &&
              jis(jget(qc, "bnb_4bit_compute_dtype", NULL, NULL), "float16") &&
              jis(jget(qc, "bnb_4bit_quant_storage", NULL, NULL), "uint8"),
          "%s: quant_method / load_in_4bit / quant type / double quant / compute dtype / storage", out);
    const cJSON *skip = jget(qc, "llm_int8_skip_modules", NULL, NULL);
    CHECK(has(skip, "lm_head") && has(skip, "m.embed_tokens") && has(skip, "m.layers.0.c_proj"),
          "%s: llm_int8_skip_modules lacks lm_head, embed_tokens or c_proj", out);
    for (size_t i = 0; i < NI; i++) {
        if (k_t[i].rank != 2 || !ends_with(k_t[i].name, ".weight")) continue;
        char prefix[256];
        snprintf(prefix, sizeof prefix, "%.*s", (int)(strlen(k_t[i].name) - 7), k_t[i].name);
        CHECK(has(skip, prefix) == !expect_block(i, block), "%s: llm_int8_skip_modules and %s disagree", out,
              prefix);
    }
    cJSON_Delete(j);
}

static void run_bnb(const char *out, nb_format fmt, int32_t block) {
    nb_ckpt_quantize_opts o;
    nb_ckpt_quantize_opts_init(&o);
    o.format = fmt;
    o.group_size = block;
    nb_ckpt_quantize_summary s;
    if (!quantize_in(out, &o, &s)) return;
    size_t nq = 0;
    for (size_t i = 0; i < NI; i++) nq += expect_block(i, block) != 0;
    check_summary(out, &s, k_t, NI, nq);
    nb_st_file *f;
    nb_ckpt *c;
    nb_context *ctx;
    if (ckpt_output_open(out, &f, &c, &ctx)) {
        nb_ckpt_config cfg;
        nb_ckpt_get_config(c, &cfg);
        CHECK(cfg.declared == bnb_layout(fmt), "%s: config declares %s", out, fmt_name(cfg.declared));
        size_t count = 0;
        nb_st_count(f, &count);
        CHECK(count == NI + nq * 3, "%s: %zu tensors (want %zu)", out, count, NI + nq * 3);
        for (size_t i = 0; i < NI; i++) {
            const int64_t b = expect_block(i, block);
            if (b) {
                check_layer(f, c, ctx, i, fmt, b, out);
                continue;
            }
            check_copy(f, &k_t[i], g_src[i], g_nbytes[i], out);
        }
    }
    ckpt_output_close(f, c, ctx);
    check_config(out, fmt, block);
    check_tokenizer_copied(out);
}

/* int4_hqq: the group of weight i, or 0 when it is kept (an odd number of
 * groups: hqq packs half of them over the other half).  c_proj's absmax is
 * no member of hqq's layout: quantized here. */
static int64_t expect_hqq(size_t i, int32_t group) {
    const ispec *p = &k_t[i];
    const int64_t g = group ? group : 64;
    if (p->rank != 2 || !ends_with(p->name, ".weight") || strstr(p->name, "lm_head") || strstr(p->name, "embed") ||
        p->shape[1] % g)
        return 0;
    return (p->shape[0] * (p->shape[1] / g)) % 2 == 0 ? g : 0;
}

static void check_hqq_layer(const nb_st_file *f, nb_ckpt *c, nb_context *ctx, size_t i, int64_t g, nb_scale_type sty,
                            int method, const char *out) {
    const ispec *p = &k_t[i];
    const int64_t n = p->shape[0], k = p->shape[1], rows = n * (k / g);
    char prefix[256];
    snprintf(prefix, sizeof prefix, "%.*s", (int)(strlen(p->name) - 7), p->name);
    nb_weight_desc d;
    nb_weight_desc_init(&d, NB_FORMAT_INT4_HQQ, n, k);
    d.group_size = (int32_t)g;
    d.scale_type = sty;
    d.method = method;
    nb_weight_sizes_v2 sz;
    CHECK(nb_weight_desc_validate(&d) == NB_OK && nb_weight_get_sizes_v2(&d, &sz) == NB_OK, "%s: desc", prefix);
    uint8_t *rc = (uint8_t *)malloc(sz.codes_bytes), *rs = (uint8_t *)malloc(sz.scales_bytes);
    uint8_t *rz = (uint8_t *)malloc(sz.zeros_bytes);
    const nb_weight_buffers rb = {.codes = rc, .scales = rs, .zeros = rz};
    CHECK(nb_quantize_host_v2(ctx, &d, src_dtype(p->dt), g_src[i], &rb) == NB_OK, "%s: reference quantize: %s", prefix,
          nb_last_error());
    nb_st_tensor t;
    if (find(f, prefix, ".W_q", &t)) {
        int same = t.dtype == NB_ST_U8 && t.rank == 2 && t.shape[0] == rows / 2 && t.shape[1] == g &&
                   t.bytes == (uint64_t)(rows / 2 * g);
        for (int64_t r = 0; r < rows / 2 && same; r++)
            for (int64_t col = 0; col < g && same; col++)
                same = ((const uint8_t *)t.data)[r * g + col] ==
                       (uint8_t)(nib(rc, (size_t)(r * g + col)) << 4 | nib(rc, (size_t)((rows / 2 + r) * g + col)));
        CHECK(same, "%s: %s is not the quantizer's codes in hqq's packing", out, t.name);
    }
    const nb_st_dtype sdt = sty == NB_SCALE_BF16 ? NB_ST_BF16 : NB_ST_F16;
    if (find(f, prefix, ".scale", &t))
        CHECK(t.dtype == sdt && t.rank == 2 && t.shape[0] == rows && t.shape[1] == 1 && t.bytes == sz.scales_bytes &&
                  !memcmp(t.data, rs, sz.scales_bytes),
              "%s: %s differs from the quantizer's scales", out, t.name);
    if (find(f, prefix, ".zero", &t))
        CHECK(t.dtype == sdt && t.rank == 2 && t.shape[0] == rows && t.bytes == sz.zeros_bytes &&
                  !memcmp(t.data, rz, sz.zeros_bytes),
              "%s: %s differs from the quantizer's zero points", out, t.name);
    int32_t v32 = 0;
    if (find(f, prefix, ".group_size", &t) && t.bytes == 4) memcpy(&v32, t.data, 4);
    CHECK(t.dtype == NB_ST_I32 && t.rank == 0 && v32 == g, "%s: %s.group_size %d", out, prefix, (int)v32);
    int64_t sh[2] = {0, 0};
    if (find(f, prefix, ".shape", &t) && t.bytes == 16) memcpy(sh, t.data, 16);
    CHECK(t.dtype == NB_ST_I64 && sh[0] == n && sh[1] == k, "%s: %s.shape", out, prefix);
    if (find(f, prefix, ".compute_dtype", &t)) {
        const char *want = sty == NB_SCALE_BF16 ? "torch.bfloat16" : "torch.float16";
        CHECK(t.bytes == strlen(want) && !memcmp(t.data, want, strlen(want)), "%s: %s", out, t.name);
    }
    /* the reader: hqq-int4, declared by config.json, the same bytes back */
    check_read_back(c, out, prefix, NB_CKPT_HQQ_INT4, &d, &sz, rc, rs, rz);
    free(rc);
    free(rs);
    free(rz);
}

static void run_hqq(const char *out, int32_t group, int32_t sty, int method) {
    nb_ckpt_quantize_opts o;
    nb_ckpt_quantize_opts_init(&o);
    o.format = NB_FORMAT_INT4_HQQ;
    o.group_size = group;
    o.scale_type = sty;
    o.method = method;
    nb_ckpt_quantize_summary s;
    if (!quantize_in(out, &o, &s)) return;
    size_t nq = 0;
    for (size_t i = 0; i < NI; i++) nq += expect_hqq(i, group) != 0;
    check_summary(out, &s, k_t, NI, nq);
    nb_st_file *f;
    nb_ckpt *c;
    nb_context *ctx;
    if (ckpt_output_open(out, &f, &c, &ctx)) {
        size_t count = 0;
        nb_st_count(f, &count);
        CHECK(count == NI + nq * 18, "%s: %zu tensors (want %zu)", out, count, NI + nq * 18);
        for (size_t i = 0; i < NI; i++) {
            const int64_t g = expect_hqq(i, group);
            if (g)
                check_hqq_layer(f, c, ctx, i, g, sty ? (nb_scale_type)sty : NB_SCALE_F16, method, out);
            else
                check_copy(f, &k_t[i], g_src[i], g_nbytes[i], out);
        }
    }
    ckpt_output_close(f, c, ctx);
    const cJSON *qc;
    cJSON *j = read_config(out, &qc);
    if (j) {
        const cJSON *w = jget(qc, "quant_config", "weight_quant_params", NULL);
        CHECK(jis(jget(qc, "quant_method", NULL, NULL), "hqq") &&
                  cJSON_GetNumberValue(jget(w, "nbits", NULL, NULL)) == 4 &&
                  cJSON_GetNumberValue(jget(w, "group_size", NULL, NULL)) == (group ? group : 64) &&
                  cJSON_GetNumberValue(jget(w, "axis", NULL, NULL)) == 1 &&
                  has(jget(qc, "skip_modules", NULL, NULL), "lm_head") &&
                  has(jget(qc, "skip_modules", NULL, NULL), "embed_tokens"),
              "%s: HqqConfig", out);
        cJSON_Delete(j);
    }
    check_tokenizer_copied(out);
}

static void test_refusals(void) {
    char in[1024], op[1024];
    snprintf(in, sizeof in, "%s/in", g_dir);
    snprintf(op, sizeof op, "%s/refused", g_dir);
    static const struct {
        nb_format fmt;
        int method, device, block, sty;
        nb_status want;
        const char *says;
    } cases[] = {
        {NB_FORMAT_NF4, NB_QUANT_MSE, 0, 0, 0, NB_ERR_UNSUPPORTED, "nearest"},
        {NB_FORMAT_BNB_FP4, 0, NB_CKPT_DEVICE_GPU, 0, 0, NB_ERR_UNSUPPORTED, "device"},
        {NB_FORMAT_NF4, 0, 0, 16, 0, NB_ERR_INVALID_ARGUMENT, "group_size 16"},
        {NB_FORMAT_NF4, 0, 0, 8192, 0, NB_ERR_INVALID_ARGUMENT, "group_size 8192"},
        {NB_FORMAT_NF4, 0, 0, 96, 0, NB_ERR_INVALID_ARGUMENT, "group_size 96"},
        {NB_FORMAT_BNB_FP4, 0, 0, NB_CKPT_GROUP_PER_CHANNEL, 0, NB_ERR_INVALID_ARGUMENT, "blocks of 32"},
        {NB_FORMAT_NF4, 0, 0, 0, NB_SCALE_F16, NB_ERR_INVALID_ARGUMENT, "absmax is F32"},
        {NB_FORMAT_NF4, NB_QUANT_HQQ, 0, 0, 0, NB_ERR_UNSUPPORTED, "serves int4_hqq only"},
        {NB_FORMAT_INT4_HQQ, NB_QUANT_MSE, 0, 0, 0, NB_ERR_UNSUPPORTED, "nearest"},
        {NB_FORMAT_INT4_HQQ, 0, NB_CKPT_DEVICE_GPU, 0, 0, NB_ERR_UNSUPPORTED, "device"},
        {NB_FORMAT_INT4_HQQ, 0, 0, 256, 0, NB_ERR_INVALID_ARGUMENT, "group_size 256"},
        {NB_FORMAT_INT4_HQQ, 0, 0, NB_CKPT_GROUP_PER_CHANNEL, 0, NB_ERR_INVALID_ARGUMENT, "group_size -1"},
        {NB_FORMAT_INT4_HQQ, 0, 0, 0, NB_SCALE_F32, NB_ERR_INVALID_ARGUMENT, "scale_type"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        nb_ckpt_quantize_opts o;
        nb_ckpt_quantize_opts_init(&o);
        o.format = cases[i].fmt;
        o.method = (nb_quant_method)cases[i].method;
        if (cases[i].device) o.device = (nb_ckpt_device)cases[i].device;
        o.group_size = cases[i].block;
        o.scale_type = cases[i].sty;
        const nb_status st = nb_ckpt_quantize(in, op, &o, NULL);
        CHECK(st == cases[i].want && strstr(nb_last_error(), cases[i].says), "refusal \"%s\": %s (%s)",
              cases[i].says, nb_status_name(st), nb_last_error());
    }
    CHECK(access(op, F_OK) != 0, "a refused quantization created OUT");
}

int main(int argc, char **argv) {
    int keep = fixture_dir_open(argc, argv, "nb_ckptqb_test");
    if (keep < 0) return 2;
    make_fixture();
    run_bnb("nf4_default", NB_FORMAT_NF4, 0);
    run_bnb("nf4_b32", NB_FORMAT_NF4, 32);
    run_bnb("nf4_b128", NB_FORMAT_NF4, 128);
    run_bnb("fp4_default", NB_FORMAT_BNB_FP4, 0);
    run_bnb("fp4_b32", NB_FORMAT_BNB_FP4, 32);
    run_bnb("fp4_b256", NB_FORMAT_BNB_FP4, 256);
    run_hqq("hqq_default", 0, 0, NB_QUANT_RTN);
    run_hqq("hqq_g32_bf16_opt", 32, NB_SCALE_BF16, NB_QUANT_HQQ);
    run_hqq("hqq_g128_opt", 128, NB_SCALE_F16, NB_QUANT_HQQ);
    test_refusals();
    for (size_t i = 0; i < NI; i++) free(g_src[i]);
    return fixture_dir_close(keep);
}
