/* test_ckpt_convert.c - checkpoint layout conversion (src/io/ckpt_convert.c).
 * Small ModelOpt, compressed-tensors, Quark (sharded) and gpt-oss checkpoints
 * are written with nb_st_write, converted through nb_ckpt_convert, reopened
 * with nb_ckpt_open and checked:
 *   - every layer is detected in the target format (declared by the config);
 *   - every layer dequantizes (nb_dequantize_host) bit for bit like the
 *     source layer it came from (per expert for gpt-oss);
 *   - A -> B -> A reproduces A's safetensors files byte for byte;
 *   - reciprocal scales are classified exact / adjusted / inexact as the
 *     header says (an inexact one warns, or fails with strict);
 *   - configs name the target, excluded layers are listed, other files copied;
 *   - refusals (wrong family, inconsistent layer, BF16 input, name collision,
 *     OUT not empty) leave nothing behind.
 *
 *   test_ckpt_convert               fixtures in a temporary directory, removed on success
 *   test_ckpt_convert --keep DIR    fixtures kept in DIR (ctest then runs the CLI on them)
 */
#define _POSIX_C_SOURCE 200809L
#include "ckpt_testlib.h"

#include <cjson/cJSON.h>

#include <unistd.h>

#define E4M3_LO 0x20
#define E4M3_HI 0x58
#define E8M0_LO 118
#define E8M0_HI 134

static char g_warn[4096];
static int g_nwarn;

static void on_warn(void *user, const char *msg) {
    (void)user;
    g_nwarn++;
    size_t n = strlen(g_warn);
    snprintf(g_warn + n, sizeof g_warn - n, "%s\n", msg);
}

static nb_status convert(const char *from, const char *to, nb_ckpt_target tg, int strict, nb_ckpt_convert_summary *s) {
    char in[1024], out[1024];
    snprintf(in, sizeof in, "%s/%s", g_dir, from);
    snprintf(out, sizeof out, "%s/%s", g_dir, to);
    nb_ckpt_convert_opts o;
    nb_ckpt_convert_opts_init(&o);
    o.target = tg;
    o.strict = strict;
    o.warn = on_warn;
    g_warn[0] = 0;
    g_nwarn = 0;
    return nb_ckpt_convert(in, out, &o, s);
}

static nb_ckpt *open_sub(const char *sub) {
    char path[1024];
    snprintf(path, sizeof path, "%s/%s", g_dir, sub);
    nb_ckpt *c = NULL;
    nb_status st = nb_ckpt_open(path, &c);
    CHECK(st == NB_OK, "open %s: %s (%s)", sub, nb_status_name(st), nb_last_error());
    return c;
}

static int exists(const char *sub, const char *file) {
    char path[1024];
    snprintf(path, sizeof path, "%s/%s/%s", g_dir, sub, file);
    return access(path, F_OK) == 0;
}

/* Files a/fa and b/fb are byte-identical. */
static void check_same_file(const char *a, const char *fa, const char *b, const char *fb) {
    char pa[1024], pb[1024];
    snprintf(pa, sizeof pa, "%s/%s/%s", g_dir, a, fa);
    snprintf(pb, sizeof pb, "%s/%s/%s", g_dir, b, fb);
    size_t na = 0, nb = 0;
    char *x = read_file_all(pa, &na), *y = read_file_all(pb, &nb);
    CHECK(x && y && na == nb && !memcmp(x, y, na), "%s/%s and %s/%s differ (%zu vs %zu bytes)", a, fa, b, fb, na, nb);
    free(x);
    free(y);
}

/* Dequantize layer pa (expert ea) of ca and pb of cb; they must be equal bit
 * for bit (or, with ulps > 0, within that many units of the tensor scale's
 * last place).  Also checks the target format. */
static void check_layer(nb_ckpt *ca, const char *pa, int64_t ea, nb_ckpt *cb, const char *pb, nb_ckpt_format fb,
                        int ulps) {
    size_t ia, ib;
    if (nb_ckpt_layer_find(ca, pa, &ia) != NB_OK || nb_ckpt_layer_find(cb, pb, &ib) != NB_OK) {
        CHECK(0, "layer %s / %s not found", pa, pb);
        return;
    }
    nb_ckpt_layer L;
    nb_ckpt_layer_at(cb, ib, &L);
    CHECK(L.format == fb && !L.config_mismatch, "%s: %s (want %s) %s", pb, fmt_name(L.format),
          fmt_name(fb), L.problem);
    nb_weight_desc da, db;
    const uint8_t *ca_c, *ca_s, *cb_c, *cb_s;
    nb_status st = nb_ckpt_layer_weight(ca, ia, ea, &da, &ca_c, &ca_s);
    CHECK(st == NB_OK, "%s: %s", pa, nb_last_error());
    if (st == NB_OK) st = nb_ckpt_layer_weight(cb, ib, 0, &db, &cb_c, &cb_s);
    CHECK(st == NB_OK, "%s: %s", pb, nb_last_error());
    if (st != NB_OK) return;
    CHECK(da.n == db.n && da.k == db.k && da.format == db.format, "%s: descriptor %lld x %lld vs %lld x %lld", pb,
          (long long)da.n, (long long)da.k, (long long)db.n, (long long)db.k);
    if (da.n != db.n || da.k != db.k) return;
    nb_context *ctx = NULL;
    nb_context_create(NB_DEVICE_NONE, &ctx);
    size_t nel = (size_t)(da.n * da.k);
    float *x = (float *)malloc(nel * 4), *y = (float *)malloc(nel * 4);
    CHECK(nb_dequantize_host(ctx, &da, ca_c, ca_s, NB_DTYPE_F32, x) == NB_OK &&
              nb_dequantize_host(ctx, &db, cb_c, cb_s, NB_DTYPE_F32, y) == NB_OK,
          "%s: dequantize", pb);
    size_t bad = 0, first = 0;
    for (size_t i = 0; i < nel; i++) {
        int same = !memcmp(&x[i], &y[i], 4);
        if (!same && ulps) same = fabs((double)x[i] - y[i]) <= ulps * ldexp(fabs((double)x[i]), -23);
        if (!same && !bad++) first = i;
    }
    CHECK(bad == 0, "%s vs %s: %zu of %zu values differ, first at %zu: %.9g vs %.9g", pa, pb, bad, nel, first,
          (double)x[first], (double)y[first]);
    if (!ulps) CHECK(da.tensor_scale == db.tensor_scale, "%s: tensor scale %.9g vs %.9g", pb, da.tensor_scale,
                     db.tensor_scale);
    free(x);
    free(y);
    nb_context_destroy(ctx);
}

static cJSON *read_json_file(const char *sub, const char *file) {
    char path[1024];
    snprintf(path, sizeof path, "%s/%s/%s", g_dir, sub, file);
    size_t n = 0;
    char *t = read_file_all(path, &n);
    cJSON *j = t ? cJSON_Parse(t) : NULL;
    free(t);
    return j;
}

/* config.json quantization_config[key] (string) == want */
static void check_qc(const char *sub, const char *key, const char *want) {
    cJSON *j = read_json_file(sub, "config.json");
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(cJSON_GetObjectItemCaseSensitive(j, "quantization_config"), key);
    CHECK(cJSON_IsString(v) && !strcmp(v->valuestring, want), "%s: quantization_config.%s is %s, want %s", sub, key,
          cJSON_IsString(v) ? v->valuestring : "(absent)", want);
    cJSON_Delete(j);
}

/* The list `key` of config.json's quantization_config holds `name`. */
static int qc_list_has(const char *sub, const char *key, const char *name) {
    cJSON *j = read_json_file(sub, "config.json");
    const cJSON *a = cJSON_GetObjectItemCaseSensitive(cJSON_GetObjectItemCaseSensitive(j, "quantization_config"), key);
    int found = 0;
    const cJSON *e;
    cJSON_ArrayForEach(e, a) if (cJSON_IsString(e) && !strcmp(e->valuestring, name)) found = 1;
    cJSON_Delete(j);
    return found;
}

/* ------------------------------------------------------------ NVFP4 */

static const char *k_tok = "{\"version\": \"1.0\", \"model\": {\"type\": \"BPE\"}}\n";

/* ModelOpt checkpoint; ws2 values chosen by the caller. */
static void make_modelopt(const char *sub, float ws2a, float ws2b) {
    tset s = {0};
    int64_t w1[2] = {8, 32}, s1[2] = {8, 4}, w2[2] = {16, 16}, s2[2] = {16, 2}, emb[2] = {10, 32}, nrm[1] = {32};
    add(&s, "model.layers.0.mlp.down_proj.weight", NB_ST_U8, 2, w1, NULL, 0, 255);
    add(&s, "model.layers.0.mlp.down_proj.weight_scale", NB_ST_F8_E4M3, 2, s1, NULL, E4M3_LO, E4M3_HI);
    add_f32(&s, "model.layers.0.mlp.down_proj.weight_scale_2", 0, ws2a);
    add_f32(&s, "model.layers.0.mlp.down_proj.input_scale", 0, 0.5f);
    add(&s, "model.layers.0.self_attn.k_proj.weight", NB_ST_U8, 2, w2, NULL, 0, 255);
    add(&s, "model.layers.0.self_attn.k_proj.weight_scale", NB_ST_F8_E4M3, 2, s2, NULL, E4M3_LO, E4M3_HI);
    add_f32(&s, "model.layers.0.self_attn.k_proj.weight_scale_2", 0, ws2b);
    add_f32(&s, "model.layers.0.self_attn.k_proj.k_scale", 0, 2.0f);
    add(&s, "model.embed_tokens.weight", NB_ST_BF16, 2, emb, NULL, 0, 127);
    add(&s, "model.norm.weight", NB_ST_BF16, 1, nrm, NULL, 0, 127);
    add(&s, "lm_head.weight", NB_ST_BF16, 2, emb, NULL, 0, 127);
    write_set(&s, sub, "model.safetensors");
    free_set(&s);
    write_text(sub, "hf_quant_config.json",
               "{\"producer\": {\"name\": \"modelopt\", \"version\": \"0.29\"}, \"quantization\": {\"quant_algo\": "
               "\"NVFP4\", \"kv_cache_quant_algo\": null, \"group_size\": 16, \"exclude_modules\": [\"lm_head\"]}}\n");
    write_text(sub, "config.json",
               "{\"architectures\": [\"LlamaForCausalLM\"], \"quantization_config\": {\"quant_method\": \"modelopt\", "
               "\"quant_algo\": \"NVFP4\", \"ignore\": [\"lm_head\"]}}\n");
    write_text(sub, "tokenizer.json", k_tok);
}

static void test_nvfp4_roundtrip(void) {
    make_modelopt("mo", 0.0078125f, 0.375f); /* reciprocals 128 and 2.666..: both round-trip */
    nb_ckpt_convert_summary s;
    nb_status st = convert("mo", "mo_ct", NB_CKPT_TARGET_CT, 1, &s);
    CHECK(st == NB_OK, "mo -> ct: %s", nb_last_error());
    CHECK(s.layers_converted == 2 && s.layers_unchanged == 0 && s.layers_unquantized == 2 && s.scales_exact == 3 &&
              s.scales_adjusted == 0 && s.scales_inexact == 0 && s.tensors_in == 11 && s.tensors_out == 11 &&
              s.shards == 1 && s.files_copied == 1 && g_nwarn == 0,
          "mo -> ct summary: %zu conv %zu unch %zu unq, scales %zu/%zu/%zu, %zu -> %zu tensors, %zu files, %d warnings",
          s.layers_converted, s.layers_unchanged, s.layers_unquantized, s.scales_exact, s.scales_adjusted,
          s.scales_inexact, s.tensors_in, s.tensors_out, s.files_copied, g_nwarn);
    nb_ckpt *a = open_sub("mo"), *b = open_sub("mo_ct");
    if (a && b) {
        check_layer(a, "model.layers.0.mlp.down_proj", 0, b, "model.layers.0.mlp.down_proj", NB_CKPT_CT_NVFP4, 0);
        check_layer(a, "model.layers.0.self_attn.k_proj", 0, b, "model.layers.0.self_attn.k_proj", NB_CKPT_CT_NVFP4, 0);
        nb_ckpt_config cfg;
        nb_ckpt_get_config(b, &cfg);
        CHECK(cfg.declared == NB_CKPT_CT_NVFP4 && cfg.source == NB_CKPT_SRC_CONFIG_JSON, "mo_ct declares %s",
              fmt_name(cfg.declared));
        size_t ti;
        nb_st_tensor t;
        CHECK(nb_ckpt_tensor_find(b, "model.layers.0.mlp.down_proj.input_global_scale", &ti) == NB_OK &&
                  nb_ckpt_tensor_at(b, ti, &t, NULL) == NB_OK && t.rank == 1 && t.shape[0] == 1 &&
                  *(const float *)t.data == 2.0f,
              "input_global_scale = 1 / input_scale, shape [1]");
        CHECK(nb_ckpt_tensor_find(b, "model.layers.0.self_attn.k_proj.k_scale", &ti) == NB_OK, "k_scale copied");
        CHECK(nb_ckpt_tensor_find(b, "model.layers.0.mlp.down_proj.weight_scale_2", &ti) == NB_ERR_NOT_FOUND,
              "weight_scale_2 renamed");
    }
    nb_ckpt_close(a);
    nb_ckpt_close(b);
    CHECK(!exists("mo_ct", "hf_quant_config.json"), "hf_quant_config.json dropped for compressed-tensors");
    check_same_file("mo", "tokenizer.json", "mo_ct", "tokenizer.json");
    check_qc("mo_ct", "quant_method", "compressed-tensors");
    check_qc("mo_ct", "format", "nvfp4-pack-quantized");
    CHECK(qc_list_has("mo_ct", "ignore", "lm_head") && qc_list_has("mo_ct", "ignore", "model.embed_tokens") &&
              !qc_list_has("mo_ct", "ignore", "model.layers.0.mlp.down_proj"),
          "mo_ct: ignore lists the unquantized layers only");

    /* and back: byte for byte */
    st = convert("mo_ct", "mo_ct_mo", NB_CKPT_TARGET_MODELOPT, 1, &s);
    CHECK(st == NB_OK && s.scales_exact == 3 && s.layers_converted == 2, "ct -> mo: %s", nb_last_error());
    check_same_file("mo", "model.safetensors", "mo_ct_mo", "model.safetensors");
    CHECK(exists("mo_ct_mo", "hf_quant_config.json"), "hf_quant_config.json written for modelopt");
    check_qc("mo_ct_mo", "quant_method", "modelopt");
    nb_ckpt *c = open_sub("mo_ct_mo");
    if (c) {
        nb_ckpt_config cfg;
        nb_ckpt_get_config(c, &cfg);
        CHECK(cfg.declared == NB_CKPT_MODELOPT_NVFP4 && cfg.source == NB_CKPT_SRC_HF_QUANT_CONFIG,
              "mo_ct_mo declares %s", fmt_name(cfg.declared));
    }
    nb_ckpt_close(c);

    /* already in the target layout: files and configs copied unchanged */
    st = convert("mo", "mo_mo", NB_CKPT_TARGET_MODELOPT, 1, &s);
    CHECK(st == NB_OK && s.layers_unchanged == 2 && s.layers_converted == 0 && s.scales_exact == 0, "mo -> mo: %s",
          nb_last_error());
    check_same_file("mo", "model.safetensors", "mo_mo", "model.safetensors");
    check_same_file("mo", "config.json", "mo_mo", "config.json");
    check_same_file("mo", "hf_quant_config.json", "mo_mo", "hf_quant_config.json");
}

static void test_nvfp4_reciprocals(void) {
    /* 0.0123f: no float g has 1.0f / g == 0.0123f */
    float s0 = 0.0123f, g0 = 1.0f / s0;
    CHECK(1.0f / g0 != s0, "fixture: 0.0123f should not round-trip");
    make_modelopt("mo_inexact", s0, 0.25f);
    nb_ckpt_convert_summary s;
    nb_status st = convert("mo_inexact", "mo_inexact_strict", NB_CKPT_TARGET_CT, 1, &s);
    CHECK(st == NB_ERR_UNSUPPORTED && strstr(nb_last_error(), "down_proj.weight_scale_2") && strstr(nb_last_error(), "strict"),
          "strict inexact: %s (%s)", nb_status_name(st), nb_last_error());
    CHECK(!exists("mo_inexact_strict", "."), "strict failure left OUT behind");
    st = convert("mo_inexact", "mo_inexact_ct", NB_CKPT_TARGET_CT, 0, &s);
    CHECK(st == NB_OK && s.scales_inexact == 1 && s.scales_exact == 2 && g_nwarn == 1 &&
              strstr(g_warn, "warning: model.layers.0.mlp.down_proj.weight_scale_2"),
          "inexact: %s; %zu inexact, warnings: %s", nb_last_error(), s.scales_inexact, g_warn);
    nb_ckpt *a = open_sub("mo_inexact"), *b = open_sub("mo_inexact_ct");
    if (a && b) {
        /* one unit in the tensor scale's last place, at most two in a product */
        check_layer(a, "model.layers.0.mlp.down_proj", 0, b, "model.layers.0.mlp.down_proj", NB_CKPT_CT_NVFP4, 2);
        check_layer(a, "model.layers.0.self_attn.k_proj", 0, b, "model.layers.0.self_attn.k_proj", NB_CKPT_CT_NVFP4, 0);
    }
    nb_ckpt_close(a);
    nb_ckpt_close(b);

    /* a ct global scale g whose reciprocal s does not give g back: ct -> mo is
     * exact in dequantization (adjusted), and mo -> ct finds a g' with 1/g' == s */
    float g = 500.0f; /* mantissa near 2: where 1/(1/g) != g happens */
    for (int i = 0; i < 100000; i++, g = nextafterf(g, INFINITY))
        if (1.0f / (1.0f / g) != g) break;
    CHECK(1.0f / (1.0f / g) != g, "fixture: no irreversible global scale found");
    tset t = {0};
    int64_t w[2] = {8, 32}, sc[2] = {8, 4};
    add(&t, "model.layers.0.mlp.up_proj.weight_packed", NB_ST_U8, 2, w, NULL, 0, 255);
    add(&t, "model.layers.0.mlp.up_proj.weight_scale", NB_ST_F8_E4M3, 2, sc, NULL, E4M3_LO, E4M3_HI);
    add_f32(&t, "model.layers.0.mlp.up_proj.weight_global_scale", 1, g);
    write_set(&t, "ct_adj", "model.safetensors");
    free_set(&t);
    st = convert("ct_adj", "ct_adj_mo", NB_CKPT_TARGET_MODELOPT, 1, &s);
    CHECK(st == NB_OK && s.scales_adjusted == 1 && g_nwarn == 1 && strstr(g_warn, "note:"), "ct -> mo adjusted: %s %s",
          nb_last_error(), g_warn);
    /* the ModelOpt value is exactly the tensor scale read from the ct layer */
    CHECK(s.scales_exact == 0 && s.scales_inexact == 0, "ct -> mo is never inexact");
    st = convert("ct_adj_mo", "ct_adj_mo_ct", NB_CKPT_TARGET_CT, 1, &s);
    CHECK(st == NB_OK && s.scales_adjusted + s.scales_exact == 1 && s.scales_inexact == 0, "mo -> ct again: %s", nb_last_error());
    nb_ckpt *c0 = open_sub("ct_adj"), *c1 = open_sub("ct_adj_mo"), *c2 = open_sub("ct_adj_mo_ct");
    if (c0 && c1 && c2) {
        check_layer(c0, "model.layers.0.mlp.up_proj", 0, c1, "model.layers.0.mlp.up_proj", NB_CKPT_MODELOPT_NVFP4, 0);
        check_layer(c0, "model.layers.0.mlp.up_proj", 0, c2, "model.layers.0.mlp.up_proj", NB_CKPT_CT_NVFP4, 0);
    }
    nb_ckpt_close(c0);
    nb_ckpt_close(c1);
    nb_ckpt_close(c2);
}

/* ------------------------------------------------------------ MXFP4 */

static void test_mxfp4_sharded(void) {
    tset s1 = {0}, s2 = {0};
    int64_t w[2] = {12, 48}, sc[2] = {12, 3}, w2[2] = {4, 16}, sc2[2] = {4, 1}, e[2] = {6, 32};
    add(&s1, "model.layers.0.self_attn.o_proj.weight", NB_ST_U8, 2, w, NULL, 0, 255);
    add(&s1, "model.embed_tokens.weight", NB_ST_BF16, 2, e, NULL, 0, 127);
    add(&s2, "model.layers.0.self_attn.o_proj.weight_scale", NB_ST_U8, 2, sc, NULL, E8M0_LO, E8M0_HI);
    add(&s2, "model.layers.1.mlp.down_proj.weight", NB_ST_U8, 2, w2, NULL, 0, 255);
    add(&s2, "model.layers.1.mlp.down_proj.weight_scale", NB_ST_F8_E8M0, 2, sc2, NULL, E8M0_LO, E8M0_HI);
    write_set(&s1, "quark", "model-00001-of-00002.safetensors");
    write_set(&s2, "quark", "model-00002-of-00002.safetensors");
    free_set(&s1);
    free_set(&s2);
    write_text("quark", "model.safetensors.index.json",
               "{\"metadata\": {\"total_size\": 1}, \"weight_map\": {\n"
               " \"model.layers.0.self_attn.o_proj.weight\": \"model-00001-of-00002.safetensors\",\n"
               " \"model.embed_tokens.weight\": \"model-00001-of-00002.safetensors\",\n"
               " \"model.layers.0.self_attn.o_proj.weight_scale\": \"model-00002-of-00002.safetensors\",\n"
               " \"model.layers.1.mlp.down_proj.weight\": \"model-00002-of-00002.safetensors\",\n"
               " \"model.layers.1.mlp.down_proj.weight_scale\": \"model-00002-of-00002.safetensors\"}}\n");
    write_text("quark", "config.json",
               "{\"quantization_config\": {\"quant_method\": \"quark\", \"global_quant_config\": {\"weight\": "
               "{\"dtype\": \"fp4\", \"group_size\": 32}}, \"exclude\": [\"model.embed_tokens\"]}}\n");
    write_text("quark", "generation_config.json", "{\"do_sample\": true}\n");
    nb_ckpt_convert_summary s;
    nb_status st = convert("quark", "quark_ct", NB_CKPT_TARGET_CT, 1, &s);
    CHECK(st == NB_OK && s.layers_converted == 2 && s.shards == 2 && s.files_copied == 1 && s.scales_exact == 0,
          "quark -> ct: %s (%zu layers, %zu shards)", nb_last_error(), s.layers_converted, s.shards);
    CHECK(exists("quark_ct", "model.safetensors.index.json"), "index written for a sharded input");
    nb_ckpt *a = open_sub("quark"), *b = open_sub("quark_ct");
    if (a && b) {
        size_t nf = 0;
        nb_ckpt_file_count(b, &nf);
        CHECK(nf == 3, "quark_ct: %zu files (index + 2 shards)", nf);
        check_layer(a, "model.layers.0.self_attn.o_proj", 0, b, "model.layers.0.self_attn.o_proj", NB_CKPT_CT_MXFP4, 0);
        check_layer(a, "model.layers.1.mlp.down_proj", 0, b, "model.layers.1.mlp.down_proj", NB_CKPT_CT_MXFP4, 0);
        size_t ti;
        nb_st_tensor t;
        CHECK(nb_ckpt_tensor_find(b, "model.layers.1.mlp.down_proj.weight_scale", &ti) == NB_OK &&
                  nb_ckpt_tensor_at(b, ti, &t, NULL) == NB_OK && t.dtype == NB_ST_F8_E8M0,
              "scale dtype F8_E8M0 kept");
    }
    nb_ckpt_close(a);
    nb_ckpt_close(b);
    check_qc("quark_ct", "format", "mxfp4-pack-quantized");
    st = convert("quark_ct", "quark_ct_quark", NB_CKPT_TARGET_QUARK, 1, &s);
    CHECK(st == NB_OK && s.layers_converted == 2, "ct -> quark: %s", nb_last_error());
    check_same_file("quark", "model-00001-of-00002.safetensors", "quark_ct_quark", "model-00001-of-00002.safetensors");
    check_same_file("quark", "model-00002-of-00002.safetensors", "quark_ct_quark", "model-00002-of-00002.safetensors");
    check_same_file("quark", "generation_config.json", "quark_ct_quark", "generation_config.json");
    check_qc("quark_ct_quark", "quant_method", "quark");
    CHECK(qc_list_has("quark_ct_quark", "exclude", "model.embed_tokens"), "quark exclude list");
}

static void test_gptoss(void) {
    tset s = {0};
    enum { E = 3, R1 = 8, K1 = 64, R2 = 4, K2 = 32 };
    int64_t gb[4] = {E, R1, K1 / 32, 16}, gs[3] = {E, R1, K1 / 32}, db[4] = {E, R2, K2 / 32, 16}, ds[3] = {E, R2, K2 / 32};
    int64_t gbias[2] = {E, R1}, rt[2] = {E, K1};
    add(&s, "model.layers.0.mlp.experts.gate_up_proj_blocks", NB_ST_U8, 4, gb, NULL, 0, 255);
    add(&s, "model.layers.0.mlp.experts.gate_up_proj_scales", NB_ST_U8, 3, gs, NULL, E8M0_LO, E8M0_HI);
    const uint8_t *bias = add(&s, "model.layers.0.mlp.experts.gate_up_proj_bias", NB_ST_BF16, 2, gbias, NULL, 0, 255);
    add(&s, "model.layers.0.mlp.experts.down_proj_blocks", NB_ST_U8, 4, db, NULL, 0, 255);
    add(&s, "model.layers.0.mlp.experts.down_proj_scales", NB_ST_U8, 3, ds, NULL, E8M0_LO, E8M0_HI);
    add(&s, "model.layers.0.mlp.router.weight", NB_ST_BF16, 2, rt, NULL, 0, 127);
    write_set(&s, "gptoss", "model.safetensors");
    uint8_t bias_copy[E * R1 * 2];
    memcpy(bias_copy, bias, sizeof bias_copy);
    free_set(&s);
    write_text("gptoss", "config.json",
               "{\"model_type\": \"gpt_oss\", \"quantization_config\": {\"quant_method\": \"mxfp4\", "
               "\"modules_to_not_convert\": [\"model.layers.*.mlp.router\"]}}");
    for (int q = 0; q < 2; q++) {
        const char *out = q ? "gptoss_quark" : "gptoss_ct";
        nb_ckpt_convert_summary sm;
        nb_status st = convert("gptoss", out, q ? NB_CKPT_TARGET_QUARK : NB_CKPT_TARGET_CT, 1, &sm);
        CHECK(st == NB_OK && sm.layers_converted == 2 && sm.experts_split == 2 * E && sm.tensors_out == 5 * E + 1,
              "gptoss -> %s: %s (%zu experts, %zu tensors)", out, nb_last_error(), sm.experts_split, sm.tensors_out);
        nb_ckpt *a = open_sub("gptoss"), *b = open_sub(out);
        if (!a || !b) {
            nb_ckpt_close(a);
            nb_ckpt_close(b);
            continue;
        }
        size_t nl = 0;
        nb_ckpt_layer_count(b, &nl);
        CHECK(nl == 2 * E + 1, "%s: %zu layers, want %d", out, nl, 2 * E + 1);
        nb_ckpt_format f = q ? NB_CKPT_QUARK_MXFP4 : NB_CKPT_CT_MXFP4;
        for (int e = 0; e < E; e++) {
            char p1[128], p2[128], bn[160];
            snprintf(p1, sizeof p1, "model.layers.0.mlp.experts.%d.gate_up_proj", e);
            snprintf(p2, sizeof p2, "model.layers.0.mlp.experts.%d.down_proj", e);
            check_layer(a, "model.layers.0.mlp.experts.gate_up_proj", e, b, p1, f, 0);
            check_layer(a, "model.layers.0.mlp.experts.down_proj", e, b, p2, f, 0);
            snprintf(bn, sizeof bn, "%s.bias", p1);
            size_t ti;
            nb_st_tensor t;
            CHECK(nb_ckpt_tensor_find(b, bn, &ti) == NB_OK && nb_ckpt_tensor_at(b, ti, &t, NULL) == NB_OK &&
                      t.rank == 1 && t.shape[0] == R1 && !memcmp(t.data, bias_copy + e * R1 * 2, R1 * 2),
                  "%s: expert %d's bias row", bn, e);
        }
        nb_ckpt_close(a);
        nb_ckpt_close(b);
        CHECK(qc_list_has(out, q ? "exclude" : "ignore", "model.layers.0.mlp.router"), "%s: router excluded", out);
    }
    nb_ckpt_convert_summary sm;
    CHECK(convert("gptoss", "gptoss_mo", NB_CKPT_TARGET_MODELOPT, 0, &sm) == NB_ERR_UNSUPPORTED &&
              strstr(nb_last_error(), "gptoss-mxfp4"),
          "gptoss -> modelopt refused: %s", nb_last_error());
}

/* ------------------------------------------------------------ refusals */

static void test_refusals(void) {
    nb_ckpt_convert_summary s;
    CHECK(convert("mo", "x1", NB_CKPT_TARGET_QUARK, 0, &s) == NB_ERR_UNSUPPORTED &&
              strstr(nb_last_error(), "MXFP4 only") && !exists("x1", "."),
          "nvfp4 -> quark: %s", nb_last_error());
    tset t = {0};
    int64_t a[2] = {4, 32}, w[2] = {8, 32}, bad[2] = {8, 3};
    add(&t, "model.layers.0.mlp.up_proj.weight", NB_ST_BF16, 2, a, NULL, 0, 127);
    write_set(&t, "bf16", "model.safetensors");
    free_set(&t);
    CHECK(convert("bf16", "x2", NB_CKPT_TARGET_CT, 0, &s) == NB_ERR_UNSUPPORTED &&
              strstr(nb_last_error(), "no 4-bit layer") && !exists("x2", "."),
          "bf16 input: %s", nb_last_error());
    add(&t, "a.weight", NB_ST_U8, 2, w, NULL, 0, 255);
    add(&t, "a.weight_scale", NB_ST_F8_E4M3, 2, bad, NULL, E4M3_LO, E4M3_HI);
    add_f32(&t, "a.weight_scale_2", 0, 1.0f);
    write_set(&t, "incons", "model.safetensors");
    free_set(&t);
    CHECK(convert("incons", "x3", NB_CKPT_TARGET_CT, 0, &s) == NB_ERR_UNSUPPORTED &&
              strstr(nb_last_error(), "inconsistent") && !exists("x3", "."),
          "inconsistent: %s", nb_last_error());
    /* a converted name that is already taken: gpt-oss bias row 1 of c.experts.p */
    int64_t gb[4] = {2, 8, 1, 16}, gs[3] = {2, 8, 1}, gbias[2] = {2, 8}, row[1] = {8};
    add(&t, "c.experts.p_blocks", NB_ST_U8, 4, gb, NULL, 0, 255);
    add(&t, "c.experts.p_scales", NB_ST_U8, 3, gs, NULL, E8M0_LO, E8M0_HI);
    add(&t, "c.experts.p_bias", NB_ST_BF16, 2, gbias, NULL, 0, 127);
    add(&t, "c.experts.1.p.bias", NB_ST_BF16, 1, row, NULL, 0, 127);
    write_set(&t, "collide", "model.safetensors");
    free_set(&t);
    CHECK(convert("collide", "x4", NB_CKPT_TARGET_QUARK, 0, &s) == NB_ERR_INVALID_ARGUMENT &&
              strstr(nb_last_error(), "c.experts.1.p.bias") && !exists("x4", "."),
          "collision: %s", nb_last_error());
    /* OUT not empty */
    write_text("notempty", "keep.txt", "x\n");
    CHECK(convert("mo", "notempty", NB_CKPT_TARGET_CT, 0, &s) == NB_ERR_INVALID_ARGUMENT &&
              exists("notempty", "keep.txt") && !exists("notempty", "model.safetensors"),
          "OUT not empty: %s", nb_last_error());
    nb_ckpt_convert_opts o;
    nb_ckpt_convert_opts_init(&o);
    CHECK(nb_ckpt_convert(NULL, "x", &o, NULL) == NB_ERR_NULL_POINTER, "NULL in");
    o.target = (nb_ckpt_target)9;
    CHECK(nb_ckpt_convert("a", "b", &o, NULL) == NB_ERR_INVALID_ARGUMENT, "bad target");
    nb_ckpt_target tg;
    const char *name = NULL;
    CHECK(nb_ckpt_target_parse("ct", &tg) == NB_OK && tg == NB_CKPT_TARGET_CT &&
              nb_ckpt_target_parse("gguf", &tg) == NB_ERR_NOT_FOUND &&
              nb_ckpt_target_name((nb_ckpt_target)0, &name) == NB_ERR_INVALID_ARGUMENT && strstr(nb_last_error(), "0"),
          "target names");
}

int main(int argc, char **argv) {
    int keep = fixture_dir_open(argc, argv, "nb_convert_test");
    if (keep < 0) return 2;
    test_nvfp4_roundtrip();
    test_nvfp4_reciprocals();
    test_mxfp4_sharded();
    test_gptoss();
    test_refusals();
    return fixture_dir_close(keep);
}
