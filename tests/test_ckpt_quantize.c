/* test_ckpt_quantize.c - checkpoint quantization (src/io/ckpt_quantize.c):
 * small BF16/F16/F32 checkpoints (one file and sharded) with a config.json
 * and tokenizer files are written with nb_st_write, quantized through
 * nb_ckpt_quantize to NVFP4 and MXFP4 (each scale rule), and reopened with
 * nb_ckpt_open: every quantized layer must be detected as modelopt-nvfp4 or
 * quark-mxfp4 and its codes, scales and tensor scale must equal bit for bit
 * what nb_quantize_host gives on the same source tensor in memory; every
 * other tensor must be a byte-identical copy; extra files copied; configs
 * parse and hold the documented fields; error cases leave no output behind.
 * Devices: AUTO (the GPU when there is one), CPU and GPU give the same bytes
 * (each compared with nb_quantize_host); without a GPU, device GPU is
 * NB_ERR_NO_DEVICE before OUT is created.
 *
 *   test_ckpt_quantize               fixtures in a temporary directory, removed on success
 *   test_ckpt_quantize --keep DIR    fixtures kept in DIR (ctest then runs the CLI on DIR/bf16)
 */
#define _POSIX_C_SOURCE 200809L
#include "ckpt_testlib.h"

#include <cjson/cJSON.h>

#include <errno.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <unistd.h>


/* ------------------------------------------------------------ fixtures */

typedef struct spec {
    const char *name;
    nb_st_dtype dt;
    int rank;
    int64_t shape[2];
    int shard; /* 0 or 1 in the sharded fixture */
} spec;

/* Quantized by default (NVFP4 and MXFP4): the linear weights with K % 32 == 0
 * that are not lm_head / embeddings. */
static const spec k_tensors[] = {
    {"lm_head.weight", NB_ST_BF16, 2, {40, 64}, 1},
    {"model.embed_tokens.weight", NB_ST_BF16, 2, {40, 64}, 0},
    {"model.layers.0.input_layernorm.weight", NB_ST_BF16, 1, {64, 0}, 0},
    {"model.layers.0.mlp.down_proj.weight", NB_ST_BF16, 2, {48, 128}, 0},
    {"model.layers.0.mlp.gate_proj.weight", NB_ST_F32, 2, {32, 64}, 0},
    {"model.layers.0.mlp.up_proj.weight", NB_ST_F16, 2, {32, 64}, 1},
    {"model.layers.0.self_attn.k_proj.weight", NB_ST_BF16, 2, {16, 64}, 1},
    {"model.layers.0.self_attn.odd_proj.weight", NB_ST_BF16, 2, {8, 24}, 1}, /* K % 16 != 0 */
    {"model.layers.0.self_attn.q_proj.bias", NB_ST_BF16, 1, {64, 0}, 0},
    {"model.layers.0.self_attn.q_proj.weight", NB_ST_BF16, 2, {64, 64}, 0},
    {"model.layers.0.self_attn.rotary.inv_freq", NB_ST_F32, 1, {16, 0}, 1},
    {"model.layers.0.step", NB_ST_I32, 1, {3, 0}, 1},
    {"model.norm.weight", NB_ST_BF16, 1, {64, 0}, 1},
};
#define NT (sizeof k_tensors / sizeof k_tensors[0])
static void *g_data[NT];
static size_t g_bytes[NT];

static const char *k_config = "{\"architectures\": [\"LlamaForCausalLM\"], \"hidden_size\": 64,\n"
                              " \"rms_norm_eps\": 1e-05, \"torch_dtype\": \"bfloat16\"}\n";
static const char *k_tokenizer = "{\"version\": \"1.0\", \"model\": {\"type\": \"BPE\", \"vocab\": {\"a\": 0}}}\n";
static const char *k_genconfig = "{\"bos_token_id\": 1,\n \"eos_token_id\": 2}\n";

static void make_data(void) {
    for (size_t i = 0; i < NT; i++) {
        const spec *s = &k_tensors[i];
        int bits = 8;
        nb_st_dtype_info(s->dt, NULL, &bits);
        size_t e = (size_t)s->shape[0] * (s->rank == 2 ? (size_t)s->shape[1] : 1);
        g_bytes[i] = e * (size_t)bits / 8;
        uint8_t *p = (uint8_t *)malloc(g_bytes[i]);
        for (size_t j = 0; j < e; j++) {
            /* gaussian-ish values with a few rows of very different magnitude */
            float v = (float)((rnd_unit() + rnd_unit() + rnd_unit() - 1.5) * 2.0);
            if ((j / 64) % 5 == 3) v *= 37.0f;
            if (j % 97 == 5) v = 0.0f;
            if (s->dt == NB_ST_BF16) {
                uint16_t h = ref_bf16(v);
                memcpy(p + 2 * j, &h, 2);
            } else if (s->dt == NB_ST_F16) {
                uint16_t h = ref_f16(v);
                memcpy(p + 2 * j, &h, 2);
            } else if (s->dt == NB_ST_F32) {
                memcpy(p + 4 * j, &v, 4);
            } else {
                int32_t x = (int32_t)(j * 7 - 3);
                memcpy(p + 4 * j, &x, 4);
            }
        }
        g_data[i] = p;
    }
}

static void path_of(char *buf, size_t n, const char *sub, const char *file) {
    if (file) snprintf(buf, n, "%s/%s/%s", g_dir, sub, file);
    else snprintf(buf, n, "%s/%s", g_dir, sub);
}


static void fill_tensor(nb_st_tensor *t, size_t i) {
    memset(t, 0, sizeof *t);
    t->name = k_tensors[i].name;
    t->dtype = k_tensors[i].dt;
    t->rank = k_tensors[i].rank;
    for (int d = 0; d < t->rank; d++) t->shape[d] = k_tensors[i].shape[d];
    t->data = g_data[i];
    t->bytes = g_bytes[i];
}

/* sub/model.safetensors (shard < 0) or the two-shard layout with an index */
static void write_ckpt(const char *sub, int sharded) {
    char path[1024];
    path_of(path, sizeof path, sub, NULL);
    mkdir(path, 0755);
    nb_st_tensor t[NT];
    if (!sharded) {
        for (size_t i = 0; i < NT; i++) fill_tensor(&t[i], i);
        path_of(path, sizeof path, sub, "model.safetensors");
        nb_status st = nb_st_write(path, t, NT, NULL, 0);
        CHECK(st == NB_OK, "write %s: %s", path, nb_last_error());
    } else {
        char idx[8192] = "{\"metadata\": {\"total_size\": 1}, \"weight_map\": {";
        for (int s = 0; s < 2; s++) {
            size_t n = 0;
            char shard[64];
            snprintf(shard, sizeof shard, "model-0000%d-of-00002.safetensors", s + 1);
            for (size_t i = 0; i < NT; i++)
                if (k_tensors[i].shard == s) {
                    fill_tensor(&t[n++], i);
                    size_t l = strlen(idx);
                    snprintf(idx + l, sizeof idx - l, "%s\"%s\": \"%s\"", l > 50 ? ", " : "", k_tensors[i].name, shard);
                }
            path_of(path, sizeof path, sub, shard);
            nb_status st = nb_st_write(path, t, n, NULL, 0);
            CHECK(st == NB_OK, "write %s: %s", path, nb_last_error());
        }
        strcat(idx, "}}\n");
        write_text(sub, "model.safetensors.index.json", idx);
    }
    write_text(sub, "config.json", k_config);
    write_text(sub, "tokenizer.json", k_tokenizer);
    write_text(sub, "generation_config.json", k_genconfig);
}

/* ------------------------------------------------------------ checks */

/* Expected decision, written independently of ckpt_quantize.c. */
static int expect_quantized(size_t i, nb_format fmt, const char *extra_exclude_substr) {
    const spec *s = &k_tensors[i];
    int64_t g = fmt == NB_FORMAT_NVFP4 ? 16 : 32;
    if (s->rank != 2 || !ends_with(s->name, ".weight")) return 0;
    if (s->dt != NB_ST_BF16 && s->dt != NB_ST_F16 && s->dt != NB_ST_F32) return 0;
    if (s->shape[1] % g) return 0;
    if (strstr(s->name, "lm_head") || strstr(s->name, "embed")) return 0;
    if (extra_exclude_substr && strstr(s->name, extra_exclude_substr)) return 0;
    return 1;
}

/* The fused group of fixture tensor i ("M.member.weight"): 0 for q/k/v, 1
 * for gate/up, -1 for none; *mlen the length of M.  Written independently of
 * ckpt_quantize.c. */
static int fused_group(size_t i, size_t *mlen) {
    static const char *const members[2][3] = {{".q_proj.weight", ".k_proj.weight", ".v_proj.weight"},
                                              {".gate_proj.weight", ".up_proj.weight", NULL}};
    const char *n = k_tensors[i].name;
    for (int g = 0; g < 2; g++)
        for (int j = 0; j < 3 && members[g][j]; j++)
            if (ends_with(n, members[g][j])) {
                *mlen = strlen(n) - strlen(members[g][j]);
                return g;
            }
    return -1;
}

static int g_fused = 1; /* opts.fused_scales of the next run_case */

/* The NVFP4 tensor scale the output must hold for fixture tensor i: with
 * fused scales, the largest of the tensor scales nb_quantize_host computes
 * for the group's quantized members alone (amax / (6 * 448) is monotonic in
 * amax, so that is the scale of their rows together); 0 otherwise (the
 * quantizer computes the layer's own). */
static float expected_tensor_scale(nb_context *ctx, size_t i, nb_format fmt, const char *extra_substr) {
    size_t mi = 0;
    const int g = fmt == NB_FORMAT_NVFP4 && g_fused ? fused_group(i, &mi) : -1;
    float ts = 0.0f;
    for (size_t j = 0; g >= 0 && j < NT; j++) {
        size_t mj = 0;
        if (fused_group(j, &mj) != g || mj != mi || strncmp(k_tensors[i].name, k_tensors[j].name, mi) ||
            !expect_quantized(j, fmt, extra_substr))
            continue;
        const spec *sp = &k_tensors[j];
        nb_weight_desc d;
        nb_weight_desc_init(&d, fmt, sp->shape[0], sp->shape[1]);
        nb_weight_sizes sz;
        nb_weight_get_sizes(&d, &sz);
        uint8_t *c = (uint8_t *)malloc(sz.codes_bytes), *sc = (uint8_t *)malloc(sz.scales_bytes);
        const nb_dtype dt = sp->dt == NB_ST_F32 ? NB_DTYPE_F32 : sp->dt == NB_ST_F16 ? NB_DTYPE_F16 : NB_DTYPE_BF16;
        if (nb_quantize_host(ctx, &d, dt, g_data[j], c, sc) == NB_OK && d.tensor_scale > ts) ts = d.tensor_scale;
        free(c);
        free(sc);
    }
    return ts;
}

static int json_array_has(const cJSON *a, const char *s) {
    const cJSON *e;
    cJSON_ArrayForEach(e, a) if (cJSON_IsString(e) && !strcmp(e->valuestring, s)) return 1;
    return 0;
}

static cJSON *parse_file(const char *sub, const char *file) {
    char path[1024];
    path_of(path, sizeof path, sub, file);
    size_t n = 0;
    char *txt = read_file_all(path, &n);
    CHECK(txt != NULL, "%s missing", path);
    cJSON *j = txt ? cJSON_Parse(txt) : NULL;
    CHECK(!txt || j != NULL, "%s does not parse", path);
    free(txt);
    return j;
}

static const char *jstr(const cJSON *o, const char *path0, const char *path1, const char *path2) {
    const cJSON *x = cJSON_GetObjectItemCaseSensitive(o, path0);
    if (path1) x = cJSON_GetObjectItemCaseSensitive(x, path1);
    if (path2) x = cJSON_GetObjectItemCaseSensitive(x, path2);
    return cJSON_IsString(x) ? x->valuestring : NULL;
}

static double jnum(const cJSON *o, const char *a, const char *b, const char *c, const char *d) {
    const cJSON *x = cJSON_GetObjectItemCaseSensitive(o, a);
    if (b) x = cJSON_GetObjectItemCaseSensitive(x, b);
    if (c) x = cJSON_GetObjectItemCaseSensitive(x, c);
    if (d) x = cJSON_GetObjectItemCaseSensitive(x, d);
    return cJSON_IsNumber(x) ? x->valuedouble : -1;
}

static void check_configs(const char *out, nb_format fmt, nb_mx_scale_rule rule, const char *extra) {
    cJSON *c = parse_file(out, "config.json");
    if (c) {
        CHECK(jnum(c, "hidden_size", NULL, NULL, NULL) == 64, "%s: config.json lost hidden_size", out);
        CHECK(jstr(c, "torch_dtype", NULL, NULL) && !strcmp(jstr(c, "torch_dtype", NULL, NULL), "bfloat16"),
              "%s: config.json lost torch_dtype", out);
        const cJSON *qc = cJSON_GetObjectItemCaseSensitive(c, "quantization_config");
        CHECK(cJSON_IsObject(qc), "%s: no quantization_config", out);
        if (fmt == NB_FORMAT_NVFP4) {
            const char *m = jstr(qc, "quant_method", NULL, NULL), *a = jstr(qc, "quant_algo", NULL, NULL);
            CHECK(m && !strcmp(m, "modelopt"), "%s: quant_method %s", out, m ? m : "(none)");
            CHECK(a && !strcmp(a, "NVFP4"), "%s: quant_algo %s", out, a ? a : "(none)");
            CHECK(jnum(qc, "config_groups", "group_0", "weights", "group_size") == 16, "%s: group_size", out);
            CHECK(jnum(qc, "config_groups", "group_0", "weights", "num_bits") == 4, "%s: num_bits", out);
            const char *ty = jstr(cJSON_GetObjectItemCaseSensitive(
                                      cJSON_GetObjectItemCaseSensitive(qc, "config_groups"), "group_0"),
                                  "weights", "type", NULL);
            CHECK(ty && !strcmp(ty, "float"), "%s: weights.type", out);
            const cJSON *ig = cJSON_GetObjectItemCaseSensitive(qc, "ignore");
            CHECK(json_array_has(ig, "lm_head") && json_array_has(ig, "model.embed_tokens") &&
                      json_array_has(ig, "model.layers.0.self_attn.odd_proj"),
                  "%s: ignore list incomplete", out);
            CHECK(cJSON_IsNull(cJSON_GetObjectItemCaseSensitive(qc, "kv_cache_scheme")), "%s: kv_cache_scheme", out);
            const char *pn = jstr(qc, "producer", "name", NULL);
            CHECK(pn && !strcmp(pn, "nibble"), "%s: producer", out);
        } else {
            const char *m = jstr(qc, "quant_method", NULL, NULL);
            CHECK(m && !strcmp(m, "quark"), "%s: quant_method %s", out, m ? m : "(none)");
            const cJSON *w = cJSON_GetObjectItemCaseSensitive(
                cJSON_GetObjectItemCaseSensitive(qc, "global_quant_config"), "weight");
            const char *mode = jstr(w, "scale_calculation_mode", NULL, NULL);
            const char *want = rule == NB_MX_SCALE_EVEN ? "even" : rule == NB_MX_SCALE_OCP ? "floor" : "round_up";
            CHECK(mode && !strcmp(mode, want), "%s: scale_calculation_mode %s, want %s", out, mode ? mode : "-", want);
            CHECK(jnum(w, "group_size", NULL, NULL, NULL) == 32, "%s: group_size", out);
            const char *dt = jstr(w, "dtype", NULL, NULL), *sf = jstr(w, "scale_format", NULL, NULL);
            CHECK(dt && !strcmp(dt, "fp4") && sf && !strcmp(sf, "e8m0"), "%s: dtype/scale_format", out);
            CHECK(json_array_has(cJSON_GetObjectItemCaseSensitive(qc, "exclude"), "lm_head"), "%s: exclude", out);
            const char *wf = jstr(qc, "export", "weight_format", NULL);
            CHECK(wf && !strcmp(wf, "real_quantized"), "%s: export.weight_format", out);
        }
        if (extra) {
            const cJSON *ig = cJSON_GetObjectItemCaseSensitive(qc, fmt == NB_FORMAT_NVFP4 ? "ignore" : "exclude");
            CHECK(json_array_has(ig, "model.layers.0.self_attn.k_proj"), "%s: --exclude not listed", out);
        }
        cJSON_Delete(c);
    }
    char path[1024];
    path_of(path, sizeof path, out, "hf_quant_config.json");
    if (fmt == NB_FORMAT_NVFP4) {
        cJSON *h = parse_file(out, "hf_quant_config.json");
        if (h) {
            const char *pn = jstr(h, "producer", "name", NULL), *qa = jstr(h, "quantization", "quant_algo", NULL);
            CHECK(pn && !strcmp(pn, "nibble"), "%s: hf_quant_config producer", out);
            CHECK(jstr(h, "producer", "version", NULL) != NULL, "%s: producer.version", out);
            CHECK(qa && !strcmp(qa, "NVFP4"), "%s: hf_quant_config quant_algo", out);
            CHECK(jnum(h, "quantization", "group_size", NULL, NULL) == 16, "%s: hf group_size", out);
            const cJSON *qz = cJSON_GetObjectItemCaseSensitive(h, "quantization");
            CHECK(cJSON_IsNull(cJSON_GetObjectItemCaseSensitive(qz, "kv_cache_quant_algo")), "%s: kv_cache", out);
            CHECK(json_array_has(cJSON_GetObjectItemCaseSensitive(qz, "exclude_modules"), "lm_head"),
                  "%s: exclude_modules", out);
            cJSON_Delete(h);
        }
    } else {
        CHECK(access(path, F_OK) != 0, "%s: MXFP4 output has an hf_quant_config.json", out);
    }
    /* the extra files, byte for byte */
    const char *extras[2][2] = {{"tokenizer.json", k_tokenizer}, {"generation_config.json", k_genconfig}};
    for (int i = 0; i < 2; i++) {
        path_of(path, sizeof path, out, extras[i][0]);
        size_t n = 0;
        char *p = read_file_all(path, &n);
        CHECK(p && n == strlen(extras[i][1]) && !memcmp(p, extras[i][1], n), "%s: %s not copied", out, extras[i][0]);
        free(p);
    }
}

/* Quantize sub -> out and check everything against the in-memory sources. */
static int g_have_gpu; /* libnibble has CUDA and a device is present */
static int g_method;   /* nb_quant_method of the next run_case */

static void run_case(const char *sub, const char *out, int sharded, nb_format fmt, nb_mx_scale_rule rule,
                     const char *extra_pattern, const char *extra_substr, nb_ckpt_device dev) {
    nb_ckpt_quantize_summary s;
    nb_status st = quantize_fixture(sub, out, fmt, rule, g_method, dev, g_fused, extra_pattern, &s);
    CHECK(st == NB_OK, "quantize %s -> %s: %s %s", sub, out, nb_status_name(st), nb_last_error());
    if (st != NB_OK) return;

    size_t nq = 0;
    for (size_t i = 0; i < NT; i++) nq += (size_t)expect_quantized(i, fmt, extra_substr);
    CHECK(s.tensors_in == NT && s.layers_quantized == nq && s.tensors_copied == NT - nq,
          "%s: summary %zu in, %zu quantized, %zu copied (want %zu, %zu)", out, s.tensors_in, s.layers_quantized,
          s.tensors_copied, (size_t)NT, nq);
    CHECK(s.shards == (sharded ? 2u : 1u) && s.files_copied == 2, "%s: %zu shards, %zu files copied", out, s.shards,
          s.files_copied);
    /* (MSE runs on the CPU: auto picks it) */
    nb_ckpt_device wdev = dev == NB_CKPT_DEVICE_AUTO ? (g_have_gpu && g_method == NB_QUANT_RTN ? NB_CKPT_DEVICE_GPU
                                                                                              : NB_CKPT_DEVICE_CPU)
                                                     : dev;
    CHECK(s.device == wdev && s.device_name[0] && (wdev == NB_CKPT_DEVICE_GPU) == !!strcmp(s.device_name, "host"),
          "%s: ran on %s (%s), want %s", out, dev_name(s.device), s.device_name,
          dev_name(wdev));

    nb_ckpt *c = open_fixture(out);
    if (!c) return;
    nb_ckpt_config cfg;
    nb_ckpt_get_config(c, &cfg);
    nb_ckpt_format want = fmt == NB_FORMAT_NVFP4 ? NB_CKPT_MODELOPT_NVFP4 : NB_CKPT_QUARK_MXFP4;
    CHECK(cfg.declared == want, "%s: config declares %s", out, fmt_name(cfg.declared));
    size_t ntens = 0;
    nb_ckpt_tensor_count(c, &ntens);
    CHECK(ntens == NT + nq * (fmt == NB_FORMAT_NVFP4 ? 2 : 1), "%s: %zu tensors", out, ntens);
    nb_context *ctx = NULL;
    nb_context_create(NB_DEVICE_NONE, &ctx);
    for (size_t i = 0; i < NT; i++) {
        const spec *sp = &k_tensors[i];
        if (expect_quantized(i, fmt, extra_substr)) {
            char prefix[256];
            snprintf(prefix, sizeof prefix, "%.*s", (int)(strlen(sp->name) - 7), sp->name);
            size_t li = 0;
            st = nb_ckpt_layer_find(c, prefix, &li);
            CHECK(st == NB_OK, "%s: layer %s missing", out, prefix);
            if (st != NB_OK) continue;
            nb_ckpt_layer L;
            nb_ckpt_layer_at(c, li, &L);
            CHECK(L.format == want && L.n == sp->shape[0] && L.k == sp->shape[1] && !L.config_mismatch,
                  "%s: %s is %s %lldx%lld (%s)", out, prefix, fmt_name(L.format), (long long)L.n,
                  (long long)L.k, L.problem);
            CHECK(L.decided_by != NB_CKPT_SRC_TENSORS, "%s: %s decided by tensors only", out, prefix);
            nb_weight_desc got;
            const uint8_t *codes = NULL, *scales = NULL;
            st = nb_ckpt_layer_weight(c, li, 0, &got, &codes, &scales);
            CHECK(st == NB_OK, "%s: %s weight: %s", out, prefix, nb_last_error());
            if (st != NB_OK) continue;
            /* the reference: nb_quantize_host on the source in memory */
            nb_weight_desc d;
            nb_weight_desc_init(&d, fmt, sp->shape[0], sp->shape[1]);
            d.scale_rule = rule;
            d.method = g_method;
            d.tensor_scale = expected_tensor_scale(ctx, i, fmt, extra_substr);
            nb_weight_sizes sz;
            nb_weight_get_sizes(&d, &sz);
            uint8_t *rc = (uint8_t *)malloc(sz.codes_bytes), *rs = (uint8_t *)malloc(sz.scales_bytes);
            nb_dtype sdt = sp->dt == NB_ST_F32 ? NB_DTYPE_F32 : sp->dt == NB_ST_F16 ? NB_DTYPE_F16 : NB_DTYPE_BF16;
            st = nb_quantize_host(ctx, &d, sdt, g_data[i], rc, rs);
            CHECK(st == NB_OK, "reference quantize %s", prefix);
            CHECK(!memcmp(rc, codes, sz.codes_bytes), "%s: %s codes differ from nb_quantize_host", out, prefix);
            CHECK(!memcmp(rs, scales, sz.scales_bytes), "%s: %s scales differ from nb_quantize_host", out, prefix);
            CHECK(!memcmp(&d.tensor_scale, &got.tensor_scale, 4), "%s: %s tensor scale %.9g, want %.9g", out, prefix,
                  (double)got.tensor_scale, (double)d.tensor_scale);
            free(rc);
            free(rs);
            /* dtypes and shapes of the members, as formats.md 2.2 / 3.3 */
            for (size_t ti = 0; ti < ntens; ti++) {
                nb_st_tensor t;
                nb_ckpt_tensor_at(c, ti, &t, NULL);
                if (strncmp(t.name, prefix, strlen(prefix)) || t.name[strlen(prefix)] != '.') continue;
                const char *suf = t.name + strlen(prefix);
                if (!strcmp(suf, ".weight"))
                    CHECK(t.dtype == NB_ST_U8 && t.rank == 2 && t.shape[1] == sp->shape[1] / 2, "%s: %s", out, t.name);
                else if (!strcmp(suf, ".weight_scale"))
                    CHECK(t.dtype == (fmt == NB_FORMAT_NVFP4 ? NB_ST_F8_E4M3 : NB_ST_U8) && t.rank == 2 &&
                              t.shape[1] == sp->shape[1] / (fmt == NB_FORMAT_NVFP4 ? 16 : 32),
                          "%s: %s", out, t.name);
                else if (!strcmp(suf, ".weight_scale_2"))
                    CHECK(fmt == NB_FORMAT_NVFP4 && t.dtype == NB_ST_F32 && t.rank == 0, "%s: %s", out, t.name);
            }
        } else {
            /* copied: same dtype, shape and bytes */
            int found = 0;
            for (size_t ti = 0; ti < ntens; ti++) {
                nb_st_tensor t;
                int64_t layer;
                nb_ckpt_tensor_at(c, ti, &t, &layer);
                if (strcmp(t.name, sp->name)) continue;
                found = 1;
                CHECK(t.dtype == sp->dt && t.rank == sp->rank && t.shape[0] == sp->shape[0] &&
                          (sp->rank < 2 || t.shape[1] == sp->shape[1]) && t.bytes == g_bytes[i] &&
                          !memcmp(t.data, g_data[i], g_bytes[i]),
                      "%s: %s is not a byte-identical copy", out, sp->name);
                if (layer >= 0) {
                    nb_ckpt_layer L;
                    nb_ckpt_layer_at(c, (size_t)layer, &L);
                    CHECK(L.format == NB_CKPT_NONE, "%s: %s in a %s layer", out, sp->name, fmt_name(L.format));
                }
            }
            CHECK(found, "%s: %s missing", out, sp->name);
        }
    }
    nb_context_destroy(ctx);
    nb_ckpt_close(c);

    /* sharded: same shard names, each holding what its input shard held */
    if (sharded) {
        for (size_t i = 0; i < NT; i++) {
            char shard[1024];
            snprintf(shard, sizeof shard, "%s/%s/model-0000%d-of-00002.safetensors", g_dir, out, k_tensors[i].shard + 1);
            nb_st_file *f = NULL;
            nb_st_tensor t;
            CHECK(nb_st_open(shard, &f) == NB_OK &&
                      nb_st_tensor_find(f, k_tensors[i].name, &t) == NB_OK,
                  "%s: %s not in its shard (%s)", out, k_tensors[i].name, nb_last_error());
            nb_st_close(f);
        }
    } else {
        char p[1024];
        path_of(p, sizeof p, out, "model.safetensors.index.json");
        CHECK(access(p, F_OK) != 0, "%s: unsharded output has an index", out);
    }
    check_configs(out, fmt, rule, extra_substr);
}

static void check_input_unchanged(const char *sub, const char *file, const char *before, size_t nbefore) {
    char p[1024];
    path_of(p, sizeof p, sub, file);
    size_t n = 0;
    char *now = read_file_all(p, &n);
    CHECK(now && n == nbefore && !memcmp(now, before, n), "%s/%s was modified", sub, file);
    free(now);
}

static nb_status quant_simple(const char *in, const char *out) {
    nb_ckpt_quantize_opts o;
    nb_ckpt_quantize_opts_init(&o);
    return nb_ckpt_quantize(in, out, &o, NULL);
}

static void test_errors(void) {
    char in[1024], out[1024], p[1024];
    path_of(in, sizeof in, "bf16", NULL);
    /* OUT not empty: refused, its file untouched */
    path_of(out, sizeof out, "out_busy", NULL);
    mkdir(out, 0755);
    write_text("out_busy", "keep.txt", "mine\n");
    nb_status st = quant_simple(in, out);
    CHECK(st == NB_ERR_INVALID_ARGUMENT && strstr(nb_last_error(), "not empty"), "OUT non-empty: %s (%s)", nb_status_name(st), nb_last_error());
    path_of(p, sizeof p, "out_busy", "keep.txt");
    size_t n = 0;
    char *k = read_file_all(p, &n);
    CHECK(k && !strcmp(k, "mine\n"), "OUT non-empty: its file was changed");
    free(k);
    path_of(p, sizeof p, "out_busy", "model.safetensors");
    CHECK(access(p, F_OK) != 0, "OUT non-empty: something was written");
    /* OUT is a file */
    path_of(p, sizeof p, "out_busy", "keep.txt");
    st = quant_simple(in, p);
    CHECK(st == NB_ERR_INVALID_ARGUMENT, "OUT a file: %s (%s)", nb_status_name(st), nb_last_error());
    /* IN missing: NB_ERR_IO, OUT not created */
    path_of(in, sizeof in, "no_such_ckpt", NULL);
    path_of(out, sizeof out, "out_missing", NULL);
    st = quant_simple(in, out);
    CHECK(st == NB_ERR_IO && strstr(nb_last_error(), "no_such_ckpt"), "IN missing: %s (%s)", nb_status_name(st), nb_last_error());
    CHECK(access(out, F_OK) != 0, "IN missing: OUT created");
    /* a directory without a checkpoint */
    path_of(in, sizeof in, "empty_in", NULL);
    mkdir(in, 0755);
    st = quant_simple(in, out);
    CHECK(st == NB_ERR_NOT_FOUND, "IN without checkpoint: %s (%s)", nb_status_name(st), nb_last_error());
    /* IN corrupt */
    path_of(in, sizeof in, "corrupt", NULL);
    mkdir(in, 0755);
    {
        /* header length 16, then 16 bytes that are not JSON */
        static const char bad[] = "\x10\0\0\0\0\0\0\0{\"a\": oops}     ";
        path_of(p, sizeof p, "corrupt", "model.safetensors");
        FILE *f = fopen(p, "wb");
        CHECK(f && fwrite(bad, 1, sizeof bad - 1, f) == 24, "write corrupt");
        if (f) fclose(f);
    }
    st = quant_simple(in, out);
    CHECK(st == NB_ERR_CORRUPT, "IN corrupt: %s (%s)", nb_status_name(st), nb_last_error());
    CHECK(access(out, F_OK) != 0, "IN corrupt: OUT created");
    /* corrupt config.json next to a good file */
    path_of(in, sizeof in, "badconfig", NULL);
    mkdir(in, 0755);
    {
        nb_st_tensor t;
        fill_tensor(&t, 3);
        path_of(p, sizeof p, "badconfig", "model.safetensors");
        CHECK(nb_st_write(p, &t, 1, NULL, 0) == NB_OK, "write badconfig");
        write_text("badconfig", "config.json", "{\"hidden_size\": ");
    }
    st = quant_simple(in, out);
    CHECK(st == NB_ERR_CORRUPT && strstr(nb_last_error(), "config.json"), "bad config.json: %s (%s)", nb_status_name(st), nb_last_error());
    CHECK(access(out, F_OK) != 0, "bad config.json: OUT created");
    /* a non-finite weight: fails mid-way, everything written is removed */
    path_of(in, sizeof in, "nonfinite", NULL);
    mkdir(in, 0755);
    {
        nb_st_tensor t[2];
        fill_tensor(&t[0], 9); /* q_proj, quantized */
        fill_tensor(&t[1], 3); /* down_proj, quantized first (name order) */
        uint16_t *w = (uint16_t *)malloc(t[0].bytes);
        memcpy(w, t[0].data, t[0].bytes);
        w[77] = 0x7F80; /* +Inf */
        t[0].data = w;
        path_of(p, sizeof p, "nonfinite", "model.safetensors");
        CHECK(nb_st_write(p, t, 2, NULL, 0) == NB_OK, "write nonfinite");
        free(w);
        write_text("nonfinite", "tokenizer.json", k_tokenizer);
    }
    st = quant_simple(in, out);
    CHECK(st == NB_ERR_INVALID_ARGUMENT && strstr(nb_last_error(), "q_proj"), "Inf weight: %s (%s)", nb_status_name(st), nb_last_error());
    CHECK(access(out, F_OK) != 0, "Inf weight: OUT left behind");
    /* into an existing empty directory: the directory stays on failure */
    path_of(out, sizeof out, "out_empty", NULL);
    mkdir(out, 0755);
    st = quant_simple(in, out);
    CHECK(st == NB_ERR_INVALID_ARGUMENT, "Inf weight (empty OUT): %s", nb_status_name(st));
    path_of(p, sizeof p, "out_empty", "model.safetensors");
    CHECK(access(out, F_OK) == 0 && access(p, F_OK) != 0, "Inf weight: empty OUT not left empty");
    /* nothing to quantize: F64 and I32 weights (and a BF16 one the patterns
     * exclude) are refused with their names before OUT exists, unless
     * allow_empty, which copies them and counts them */
    path_of(in, sizeof in, "f64", NULL);
    mkdir(in, 0755);
    {
        tset ts = {.n = 0};
        const int64_t shape[2] = {16, 64};
        add(&ts, "model.layers.0.mlp.down_proj.weight", NB_ST_F64, 2, shape, NULL, 0, 0);
        add(&ts, "model.layers.0.mlp.up_proj.weight", NB_ST_I32, 2, shape, NULL, 0, 0);
        add(&ts, "lm_head.weight", NB_ST_BF16, 2, shape, NULL, 0, 0);
        write_set(&ts, "f64", "model.safetensors");
        free_set(&ts);
        write_text("f64", "config.json", k_config);
    }
    path_of(out, sizeof out, "out_f64", NULL);
    nb_ckpt_quantize_summary qs;
    st = quant_simple(in, out);
    CHECK(st == NB_ERR_UNSUPPORTED && strstr(nb_last_error(), "nothing to quantize") &&
              strstr(nb_last_error(), "down_proj.weight F64") && strstr(nb_last_error(), "up_proj.weight I32") &&
              strstr(nb_last_error(), "2 weights of another dtype") && strstr(nb_last_error(), "1 excluded by a pattern"),
          "F64/I32 weights: %s (%s)", nb_status_name(st), nb_last_error());
    CHECK(access(out, F_OK) != 0, "nothing to quantize: OUT created");
    nb_ckpt_quantize_opts o;
    nb_ckpt_quantize_opts_init(&o);
    o.allow_empty = 1;
    st = nb_ckpt_quantize(in, out, &o, &qs);
    CHECK(st == NB_OK && qs.layers_quantized == 0 && qs.weights_unsupported == 2 && qs.weights_excluded == 1 &&
              qs.tensors_copied == 3,
          "allow_empty: %s (%s), %zu quantized, %d unsupported", nb_status_name(st), nb_last_error(),
          qs.layers_quantized, (int)qs.weights_unsupported);
    /* bad options */
    nb_ckpt_quantize_opts_init(&o);
    o.format = (nb_format)42;
    path_of(in, sizeof in, "bf16", NULL);
    st = nb_ckpt_quantize(in, out, &o, NULL);
    CHECK(st == NB_ERR_INVALID_ARGUMENT, "bad format: %s", nb_status_name(st));
    CHECK(nb_ckpt_quantize(NULL, out, &o, NULL) == NB_ERR_NULL_POINTER, "NULL in");
    nb_ckpt_quantize_opts_init(&o);
    o.device = (nb_ckpt_device)3;
    st = nb_ckpt_quantize(in, out, &o, NULL);
    CHECK(st == NB_ERR_INVALID_ARGUMENT && strstr(nb_last_error(), "device"), "bad device: %s (%s)", nb_status_name(st), nb_last_error());
    /* device GPU: without one, refused before OUT exists; with one, the
     * non-finite weight is reported like on the CPU */
    o.device = NB_CKPT_DEVICE_GPU;
    path_of(out, sizeof out, "out_gpu", NULL);
    st = nb_ckpt_quantize(in, out, &o, NULL);
    if (g_have_gpu) {
        CHECK(st == NB_OK, "device gpu: %s (%s)", nb_status_name(st), nb_last_error());
        path_of(in, sizeof in, "nonfinite", NULL);
        path_of(out, sizeof out, "out_gpu_inf", NULL);
        st = nb_ckpt_quantize(in, out, &o, NULL);
        CHECK(st == NB_ERR_INVALID_ARGUMENT && strstr(nb_last_error(), "q_proj") && strstr(nb_last_error(), "[1, 13] is not finite"),
              "Inf weight on the GPU: %s (%s)", nb_status_name(st), nb_last_error());
    } else {
        CHECK(st == NB_ERR_NO_DEVICE && strstr(nb_last_error(), "device gpu"), "device gpu without a GPU: %s (%s)",
              nb_status_name(st), nb_last_error());
    }
    CHECK(access(out, F_OK) != 0 || g_have_gpu, "device gpu without a GPU: OUT created");
    nb_ckpt_device dv;
    const char *name = NULL;
    CHECK(nb_ckpt_device_parse("gpu", &dv) == NB_OK && dv == NB_CKPT_DEVICE_GPU &&
              nb_ckpt_device_parse("cuda", &dv) == NB_ERR_NOT_FOUND &&
              !strcmp(dev_name(NB_CKPT_DEVICE_AUTO), "auto") &&
              nb_ckpt_device_name((nb_ckpt_device)9, &name) == NB_ERR_INVALID_ARGUMENT && strstr(nb_last_error(), "9"),
          "device names");
}

int main(int argc, char **argv) {
    int keep = fixture_dir_open(argc, argv, "nb_ckptq_test");
    if (keep < 0) return 2;
    make_data();
    write_ckpt("bf16", 0);
    write_ckpt("sharded", 1);
    char p[1024];
    size_t nb = 0, ni = 0;
    path_of(p, sizeof p, "bf16", "model.safetensors");
    char *before = read_file_all(p, &nb);
    path_of(p, sizeof p, "sharded", "model.safetensors.index.json");
    char *before_idx = read_file_all(p, &ni);

    nb_build_info b;
    nb_get_build_info(&b);
    int count = 0;
    nb_device_count(&count);
    g_have_gpu = b.cuda && count > 0;
    const nb_ckpt_device A = NB_CKPT_DEVICE_AUTO;
    run_case("bf16", "q_nvfp4", 0, NB_FORMAT_NVFP4, NB_MX_SCALE_EVEN, NULL, NULL, A);
    run_case("sharded", "q_nvfp4_sharded", 1, NB_FORMAT_NVFP4, NB_MX_SCALE_EVEN, "*.k_proj", "k_proj", A);
    run_case("bf16", "q_mxfp4_even", 0, NB_FORMAT_MXFP4, NB_MX_SCALE_EVEN, NULL, NULL, A);
    run_case("sharded", "q_mxfp4_ocp_sharded", 1, NB_FORMAT_MXFP4, NB_MX_SCALE_OCP, NULL, NULL, A);
    run_case("bf16", "q_mxfp4_roundup", 0, NB_FORMAT_MXFP4, NB_MX_SCALE_ROUND_UP, "model.layers.?.self_attn.k*",
             "k_proj", A);
    /* NVFP4 with each layer's own tensor scale (fused_scales 0); the runs
     * above gave q/k (and gate/up) one scale, checked against the reference */
    g_fused = 0;
    run_case("sharded", "q_nvfp4_separate", 1, NB_FORMAT_NVFP4, NB_MX_SCALE_EVEN, NULL, NULL, A);
    g_fused = 1;
    /* each device explicitly (the GPU only when there is one) */
    run_case("sharded", "q_nvfp4_cpu", 1, NB_FORMAT_NVFP4, NB_MX_SCALE_EVEN, NULL, NULL, NB_CKPT_DEVICE_CPU);
    run_case("bf16", "q_mxfp4_cpu", 0, NB_FORMAT_MXFP4, NB_MX_SCALE_OCP, NULL, NULL, NB_CKPT_DEVICE_CPU);
    if (g_have_gpu) {
        run_case("sharded", "q_nvfp4_gpu", 1, NB_FORMAT_NVFP4, NB_MX_SCALE_EVEN, NULL, NULL, NB_CKPT_DEVICE_GPU);
        for (int r = NB_MX_SCALE_OCP; r <= NB_MX_SCALE_EVEN; r++)
            run_case("bf16", r == 0 ? "q_mxfp4_gpu0" : r == 1 ? "q_mxfp4_gpu1" : "q_mxfp4_gpu2", 0, NB_FORMAT_MXFP4,
                     (nb_mx_scale_rule)r, NULL, NULL, NB_CKPT_DEVICE_GPU);
    }
    /* method MSE: the bytes of nb_quantize_host with NB_QUANT_MSE, on the CPU
     * whatever the machine has; device GPU refused */
    g_method = NB_QUANT_MSE;
    run_case("sharded", "q_nvfp4_mse", 1, NB_FORMAT_NVFP4, NB_MX_SCALE_EVEN, NULL, NULL, A);
    run_case("bf16", "q_mxfp4_mse", 0, NB_FORMAT_MXFP4, NB_MX_SCALE_EVEN, NULL, NULL, NB_CKPT_DEVICE_CPU);
    g_method = NB_QUANT_RTN;
    {
        nb_ckpt_quantize_opts o;
        char in[1024], out[1024];
        path_of(in, sizeof in, "bf16", NULL);
        path_of(out, sizeof out, "q_mse_gpu", NULL);
        nb_ckpt_quantize_opts_init(&o);
        o.method = NB_QUANT_MSE;
        o.device = NB_CKPT_DEVICE_GPU;
        nb_status st = nb_ckpt_quantize(in, out, &o, NULL);
        CHECK(st == NB_ERR_UNSUPPORTED && strstr(nb_last_error(), "mse") && access(out, F_OK) != 0,
              "method mse on device gpu: %s (%s)", nb_status_name(st), nb_last_error());
        o.device = NB_CKPT_DEVICE_AUTO;
        o.method = 7;
        st = nb_ckpt_quantize(in, out, &o, NULL);
        CHECK(st == NB_ERR_INVALID_ARGUMENT && strstr(nb_last_error(), "method 7") && access(out, F_OK) != 0,
              "method 7: %s (%s)", nb_status_name(st), nb_last_error());
    }
    test_errors();
    check_input_unchanged("bf16", "model.safetensors", before, nb);
    check_input_unchanged("sharded", "model.safetensors.index.json", before_idx, ni);
    check_input_unchanged("bf16", "config.json", k_config, strlen(k_config));
    free(before);
    free(before_idx);
    for (size_t i = 0; i < NT; i++) free(g_data[i]);

    return fixture_dir_close(keep);
}
