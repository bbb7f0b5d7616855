/* test_checkpoint.c - checkpoint detection (src/io/checkpoint.c): tiny
 * synthetic checkpoints of every layout in docs/formats.md sections 2-3 are
 * written with nb_st_write, opened, classified, and every quantized layer is
 * dequantized through nb_dequantize_host from the descriptor and pointers
 * returned, then compared bit for bit with values computed here from the
 * bytes the test wrote (testlib's independent decoders).
 *
 *   test_checkpoint                  fixtures in a temporary directory, removed on success
 *   test_checkpoint --keep DIR       fixtures written to DIR and kept (ctest runs
 *                                    `nibble inspect` on them afterwards)
 */
#define _POSIX_C_SOURCE 200809L
#include "io_internal.h" /* nbio_ckpt_config_check_memory: linked from nibble_internal */
#include "ckpt_testlib.h"

#include <errno.h>
#include <stdlib.h>
#include <sys/stat.h>


/* ------------------------------------------------------------ fixture helpers */

static nb_ckpt *open_sub(const char *sub, nb_status want) {
    char path[1024];
    snprintf(path, sizeof path, "%s/%s", g_dir, sub);
    nb_ckpt *c = NULL;
    size_t unused;
    nbio_st_index_check_memory(NULL, 1, "marker", &unused, &unused); /* a known message: the open must replace it */
    char marker[512];
    snprintf(marker, sizeof marker, "%s", nb_last_error());
    nb_status st = nb_ckpt_open(path, &c);
    CHECK(st == want, "open %s: %s, want %s (%s)", sub, nb_status_name(st), nb_status_name(want), nb_last_error());
    if (want != NB_OK) CHECK(nb_last_error()[0] != 0 && strcmp(nb_last_error(), marker), "open %s: no message", sub);
    return st == NB_OK ? c : NULL;
}

static nb_ckpt_layer get_layer(nb_ckpt *c, const char *prefix, size_t *idx) {
    nb_ckpt_layer L;
    memset(&L, 0, sizeof L);
    L.format = (nb_ckpt_format)-1;
    size_t i = 0;
    nb_status st = nb_ckpt_layer_find(c, prefix, &i);
    CHECK(st == NB_OK, "layer %s not found", prefix);
    if (st == NB_OK) nb_ckpt_layer_at(c, i, &L);
    if (idx) *idx = i;
    return L;
}

/* The layer's format, shape and scale; then, per expert, dequantize through
 * the returned descriptor and pointers and compare with the value computed
 * here from the bytes written (codes: low nibble first; scales per group). */
static void check_quant(nb_ckpt *c, const char *prefix, nb_ckpt_format fmt, int64_t n, int64_t k, int64_t experts,
                        float ts, const uint8_t *codes, const uint8_t *scales, nb_ckpt_source by) {
    size_t li;
    nb_ckpt_layer L = get_layer(c, prefix, &li);
    CHECK(L.format == fmt, "%s: format %s, want %s (%s)", prefix, fmt_name(L.format),
          fmt_name(fmt), L.problem);
    CHECK(L.n == n && L.k == k && L.experts == experts, "%s: %lld x %lld x %lld, want %lld x %lld x %lld", prefix,
          (long long)L.n, (long long)L.k, (long long)L.experts, (long long)n, (long long)k, (long long)experts);
    CHECK(L.tensor_scale == ts, "%s: tensor scale %.9g, want %.9g", prefix, L.tensor_scale, ts);
    CHECK(L.decided_by == by, "%s: decided by %s, want %s", prefix, src_name(L.decided_by),
          src_name(by));
    if (L.format != fmt) return;
    int nv = fmt == NB_CKPT_MODELOPT_NVFP4 || fmt == NB_CKPT_CT_NVFP4;
    int group = nv ? 16 : 32;
    nb_context *ctx = NULL;
    nb_context_create(NB_DEVICE_NONE, &ctx);
    float *out = (float *)malloc(sizeof(float) * (size_t)(n * k));
    for (int64_t e = 0; e < (experts ? experts : 1); e++) {
        nb_weight_desc d;
        const uint8_t *pc = NULL, *ps = NULL;
        nb_status st = nb_ckpt_layer_weight(c, li, e, &d, &pc, &ps);
        CHECK(st == NB_OK, "%s: layer_weight: %s", prefix, nb_last_error());
        if (st != NB_OK) break;
        CHECK(d.format == (nv ? NB_FORMAT_NVFP4 : NB_FORMAT_MXFP4) && d.group_size == group &&
                  d.layout == NB_LAYOUT_CHECKPOINT && d.tensor_scale == ts,
              "%s: descriptor", prefix);
        st = nb_dequantize_host(ctx, &d, pc, ps, NB_DTYPE_F32, out);
        CHECK(st == NB_OK, "%s: dequantize: %s", prefix, nb_last_error());
        const uint8_t *ec = codes + (size_t)e * (size_t)(n * k / 2), *es = scales + (size_t)e * (size_t)(n * k / group);
        size_t bad = 0, first = 0;
        float first_want = 0.0f;
        for (int64_t r = 0; r < n; r++)
            for (int64_t j = 0; j < k; j++) {
                size_t idx = (size_t)(r * k + j);
                double q = k_e2m1[nib(ec, idx)];
                uint8_t sb = es[(size_t)(r * (k / group) + j / group)];
                float want = nv ? (float)(q * ref_e4m3(sb)) * ts : (float)(q * ref_e8m0(sb));
                if (memcmp(&want, &out[idx], 4) && !bad++) {
                    first = idx;
                    first_want = want;
                }
            }
        CHECK(bad == 0, "%s expert %lld: %zu values differ, first at %zu: %g vs %g", prefix, (long long)e, bad, first,
              (double)out[first], (double)first_want);
    }
    if (experts) {
        nb_weight_desc d;
        const uint8_t *pc, *ps;
        CHECK(nb_ckpt_layer_weight(c, li, experts, &d, &pc, &ps) == NB_ERR_INVALID_ARGUMENT,
              "%s: expert out of range accepted", prefix);
    }
    free(out);
    nb_context_destroy(ctx);
}

static void check_kind(nb_ckpt *c, const char *prefix, nb_ckpt_format fmt, const char *problem_part) {
    size_t li;
    nb_ckpt_layer L = get_layer(c, prefix, &li);
    CHECK(L.format == fmt, "%s: format %s, want %s (%s)", prefix, fmt_name(L.format),
          fmt_name(fmt), L.problem);
    if (problem_part) CHECK(strstr(L.problem, problem_part) != NULL, "%s: problem '%s' lacks '%s'", prefix, L.problem,
                            problem_part);
    if (fmt == NB_CKPT_INCONSISTENT || fmt == NB_CKPT_NONE) {
        nb_weight_desc d;
        const uint8_t *pc, *ps;
        CHECK(nb_ckpt_layer_weight(c, li, 0, &d, &pc, &ps) == NB_ERR_UNSUPPORTED,
              "%s: layer_weight on a %s layer", prefix, fmt_name(fmt));
    }
}

static size_t layer_count(nb_ckpt *c) {
    size_t n = 0;
    nb_ckpt_layer_count(c, &n);
    return n;
}

/* ------------------------------------------------------------ fixtures + checks */

/* NVFP4 E4M3 scale bytes: positive normals, never NaN; MXFP4 bytes near 127. */
#define E4M3_LO 0x20
#define E4M3_HI 0x58
#define E8M0_LO 118
#define E8M0_HI 134

static void test_modelopt(void) {
    tset s = {0};
    int64_t w1[2] = {8, 32}, s1[2] = {8, 4};  /* N 8, K 64 */
    int64_t w2[2] = {16, 16}, s2[2] = {16, 2}; /* N 16, K 32 */
    int64_t emb[2] = {10, 32}, nrm[1] = {32};
    const uint8_t *c1 = add(&s, "model.layers.0.mlp.down_proj.weight", NB_ST_U8, 2, w1, NULL, 0, 255);
    const uint8_t *sc1 = add(&s, "model.layers.0.mlp.down_proj.weight_scale", NB_ST_F8_E4M3, 2, s1, NULL, E4M3_LO, E4M3_HI);
    add_f32(&s, "model.layers.0.mlp.down_proj.weight_scale_2", 0, 0.0123f);
    add_f32(&s, "model.layers.0.mlp.down_proj.input_scale", 0, 0.5f);
    const uint8_t *c2 = add(&s, "model.layers.0.self_attn.q_proj.weight", NB_ST_U8, 2, w2, NULL, 0, 255);
    const uint8_t *sc2 = add(&s, "model.layers.0.self_attn.q_proj.weight_scale", NB_ST_F8_E4M3, 2, s2, NULL, E4M3_LO, E4M3_HI);
    add_f32(&s, "model.layers.0.self_attn.q_proj.weight_scale_2", 1, 3.0e-4f); /* [1] is accepted too */
    add(&s, "model.embed_tokens.weight", NB_ST_BF16, 2, emb, NULL, 0, 127);
    add(&s, "model.norm.weight", NB_ST_BF16, 1, nrm, NULL, 0, 127);
    add(&s, "lm_head.weight", NB_ST_BF16, 2, emb, NULL, 0, 127);
    write_set(&s, "modelopt", "model.safetensors");
    write_text("modelopt", "hf_quant_config.json",
               "{\"producer\": {\"name\": \"modelopt\", \"version\": \"0.29\"},\n"
               " \"quantization\": {\"quant_algo\": \"NVFP4\", \"kv_cache_quant_algo\": null,\n"
               "                  \"group_size\": 16, \"exclude_modules\": [\"lm_head\"]}}\n");
    nb_ckpt *c = open_sub("modelopt", NB_OK);
    if (c) {
        CHECK(layer_count(c) == 4, "modelopt: %zu layers, want 4", layer_count(c));
        check_quant(c, "model.layers.0.mlp.down_proj", NB_CKPT_MODELOPT_NVFP4, 8, 64, 0, 0.0123f, c1, sc1,
                    NB_CKPT_SRC_HF_QUANT_CONFIG);
        check_quant(c, "model.layers.0.self_attn.q_proj", NB_CKPT_MODELOPT_NVFP4, 16, 32, 0, 3.0e-4f, c2, sc2,
                    NB_CKPT_SRC_HF_QUANT_CONFIG);
        check_kind(c, "lm_head", NB_CKPT_NONE, NULL);
        nb_ckpt_layer L = get_layer(c, "model.embed_tokens", NULL);
        CHECK(L.format == NB_CKPT_NONE && L.n == 10 && L.k == 32 && L.decided_by == NB_CKPT_SRC_TENSORS,
              "embed_tokens");
        L = get_layer(c, "model.layers.0.mlp.down_proj", NULL);
        CHECK(L.bytes == 8 * 32 + 8 * 4 + 4 + 4, "down_proj bytes %llu", (unsigned long long)L.bytes);
        size_t dummy;
        CHECK(nb_ckpt_layer_find(c, "model.norm", &dummy) == NB_ERR_NOT_FOUND, "a 1-D weight is not a layer");
        nb_ckpt_config cfg;
        nb_ckpt_get_config(c, &cfg);
        CHECK(cfg.declared == NB_CKPT_MODELOPT_NVFP4 && cfg.source == NB_CKPT_SRC_HF_QUANT_CONFIG &&
                  cfg.has_hf_quant_config && !cfg.has_config_json && cfg.quant_algo && !strcmp(cfg.quant_algo, "NVFP4"),
              "modelopt config");
        /* every tensor of a quantized layer belongs to it; the norm to none */
        size_t nt = 0;
        nb_ckpt_tensor_count(c, &nt);
        CHECK(nt == 10, "modelopt: %zu tensors", nt);
        for (size_t i = 0; i < nt; i++) {
            nb_st_tensor t;
            int64_t layer;
            nb_ckpt_tensor_at(c, i, &t, &layer);
            CHECK((layer < 0) == (strcmp(t.name, "model.norm.weight") == 0), "%s: layer %lld", t.name, (long long)layer);
        }
        /* the same file opened by its path gives the same answer */
        char path[1024];
        snprintf(path, sizeof path, "%s/modelopt/model.safetensors", g_dir);
        nb_ckpt *c2o = NULL;
        CHECK(nb_ckpt_open(path, &c2o) == NB_OK && layer_count(c2o) == 4, "open by file path");
        if (c2o) { /* and reads the config next to the file */
            nb_ckpt_layer L2;
            nb_ckpt_layer_at(c2o, 2, &L2);
            CHECK(L2.format == NB_CKPT_MODELOPT_NVFP4 && L2.decided_by == NB_CKPT_SRC_HF_QUANT_CONFIG,
                  "open by file path: %s by %s", fmt_name(L2.format), src_name(L2.decided_by));
        }
        nb_ckpt_close(c2o);
    }
    nb_ckpt_close(c);
    free_set(&s);
}

static void test_ct(void) {
    tset s = {0};
    int64_t w[2] = {8, 32}, sn[2] = {8, 4}, sm[2] = {8, 2};
    const uint8_t *c1 = add(&s, "model.layers.0.mlp.up_proj.weight_packed", NB_ST_U8, 2, w, NULL, 0, 255);
    const uint8_t *s1 = add(&s, "model.layers.0.mlp.up_proj.weight_scale", NB_ST_F8_E4M3, 2, sn, NULL, E4M3_LO, E4M3_HI);
    add_f32(&s, "model.layers.0.mlp.up_proj.weight_global_scale", 1, 300.0f);
    add_f32(&s, "model.layers.0.mlp.up_proj.input_global_scale", 1, 100.0f);
    /* an MXFP4 layer in an NVFP4 checkpoint: detected as such, flagged */
    const uint8_t *c2 = add(&s, "model.layers.0.mlp.down_proj.weight_packed", NB_ST_U8, 2, w, NULL, 0, 255);
    const uint8_t *s2 = add(&s, "model.layers.0.mlp.down_proj.weight_scale", NB_ST_U8, 2, sm, NULL, E8M0_LO, E8M0_HI);
    write_set(&s, "ct_nvfp4", "model.safetensors");
    write_text("ct_nvfp4", "config.json",
               "{\"architectures\": [\"LlamaForCausalLM\"], \"quantization_config\": {\n"
               "  \"quant_method\": \"compressed-tensors\", \"format\": \"nvfp4-pack-quantized\",\n"
               "  \"config_groups\": {\"group_0\": {\"weights\": {\"num_bits\": 4, \"type\": \"float\",\n"
               "  \"strategy\": \"tensor_group\", \"group_size\": 16}}}, \"ignore\": [\"lm_head\"]}}\n");
    nb_ckpt *c = open_sub("ct_nvfp4", NB_OK);
    if (c) {
        CHECK(layer_count(c) == 2, "ct: %zu layers", layer_count(c));
        check_quant(c, "model.layers.0.mlp.up_proj", NB_CKPT_CT_NVFP4, 8, 64, 0, 1.0f / 300.0f, c1, s1,
                    NB_CKPT_SRC_CONFIG_JSON);
        check_quant(c, "model.layers.0.mlp.down_proj", NB_CKPT_CT_MXFP4, 8, 64, 0, 1.0f, c2, s2, NB_CKPT_SRC_TENSORS);
        nb_ckpt_layer L = get_layer(c, "model.layers.0.mlp.down_proj", NULL);
        CHECK(L.config_mismatch && strstr(L.problem, "ct-nvfp4"), "ct: mismatch not flagged (%s)", L.problem);
        L = get_layer(c, "model.layers.0.mlp.up_proj", NULL);
        CHECK(!L.config_mismatch && L.bytes == 8 * 32 + 8 * 4 + 4 + 4, "ct up_proj bytes %llu",
              (unsigned long long)L.bytes);
    }
    nb_ckpt_close(c);
    free_set(&s);
}

static void test_quark(void) {
    tset s = {0};
    int64_t w[2] = {12, 48}, sc[2] = {12, 3}; /* N 12, K 96 */
    const uint8_t *c1 = add(&s, "model.layers.3.self_attn.o_proj.weight", NB_ST_U8, 2, w, NULL, 0, 255);
    const uint8_t *s1 = add(&s, "model.layers.3.self_attn.o_proj.weight_scale", NB_ST_U8, 2, sc, NULL, E8M0_LO, E8M0_HI);
    write_set(&s, "quark", "model.safetensors");
    write_text("quark", "config.json",
               "{\"quantization_config\": {\"quant_method\": \"quark\", \"global_quant_config\": {\"weight\": "
               "{\"dtype\": \"fp4\", \"qscheme\": \"per_group\", \"group_size\": 32, \"scale_format\": \"e8m0\"}},"
               " \"exclude\": [\"lm_head\"]}}");
    nb_ckpt *c = open_sub("quark", NB_OK);
    if (c) {
        CHECK(layer_count(c) == 1, "quark: %zu layers", layer_count(c));
        check_quant(c, "model.layers.3.self_attn.o_proj", NB_CKPT_QUARK_MXFP4, 12, 96, 0, 1.0f, c1, s1,
                    NB_CKPT_SRC_CONFIG_JSON);
    }
    nb_ckpt_close(c);
    free_set(&s);
}

static void test_gptoss(void) {
    tset s = {0};
    int64_t gb[4] = {2, 8, 2, 16}, gs[3] = {2, 8, 2}; /* E 2, 2I 8, H 64 */
    int64_t db[4] = {2, 4, 1, 16}, ds[3] = {2, 4, 1}; /* E 2, H 4, I 32 */
    int64_t bias[2] = {2, 8};
    const uint8_t *c1 = add(&s, "model.layers.0.mlp.experts.gate_up_proj_blocks", NB_ST_U8, 4, gb, NULL, 0, 255);
    const uint8_t *s1 = add(&s, "model.layers.0.mlp.experts.gate_up_proj_scales", NB_ST_U8, 3, gs, NULL, E8M0_LO, E8M0_HI);
    add(&s, "model.layers.0.mlp.experts.gate_up_proj_bias", NB_ST_BF16, 2, bias, NULL, 0, 127);
    const uint8_t *c2 = add(&s, "model.layers.0.mlp.experts.down_proj_blocks", NB_ST_U8, 4, db, NULL, 0, 255);
    const uint8_t *s2 = add(&s, "model.layers.0.mlp.experts.down_proj_scales", NB_ST_U8, 3, ds, NULL, E8M0_LO, E8M0_HI);
    write_set(&s, "gptoss", "model.safetensors");
    write_text("gptoss", "config.json",
               "{\"model_type\": \"gpt_oss\", \"quantization_config\": {\"quant_method\": \"mxfp4\", "
               "\"modules_to_not_convert\": [\"model.layers.*.self_attn\", \"lm_head\"]}}");
    nb_ckpt *c = open_sub("gptoss", NB_OK);
    if (c) {
        CHECK(layer_count(c) == 2, "gptoss: %zu layers", layer_count(c));
        check_quant(c, "model.layers.0.mlp.experts.gate_up_proj", NB_CKPT_GPTOSS_MXFP4, 8, 64, 2, 1.0f, c1, s1,
                    NB_CKPT_SRC_CONFIG_JSON);
        check_quant(c, "model.layers.0.mlp.experts.down_proj", NB_CKPT_GPTOSS_MXFP4, 4, 32, 2, 1.0f, c2, s2,
                    NB_CKPT_SRC_CONFIG_JSON);
    }
    nb_ckpt_close(c);
    free_set(&s);
}

static void test_bf16(void) {
    tset s = {0};
    int64_t a[2] = {4, 8}, b[2] = {6, 4}, v[1] = {8};
    add(&s, "model.layers.0.self_attn.q_proj.weight", NB_ST_BF16, 2, a, NULL, 0, 127);
    add(&s, "model.layers.0.self_attn.k_proj.weight", NB_ST_F16, 2, b, NULL, 0, 127);
    add(&s, "model.layers.0.self_attn.v_proj.weight", NB_ST_F32, 2, b, NULL, 0, 127);
    add(&s, "model.layers.0.self_attn.q_proj.bias", NB_ST_BF16, 1, v, NULL, 0, 127);
    write_set(&s, "bf16", "model.safetensors");
    nb_ckpt *c = open_sub("bf16", NB_OK);
    if (c) {
        CHECK(layer_count(c) == 3, "bf16: %zu layers", layer_count(c));
        nb_ckpt_layer L = get_layer(c, "model.layers.0.self_attn.q_proj", NULL);
        CHECK(L.format == NB_CKPT_NONE && L.n == 4 && L.k == 8 && L.weight_dtype == NB_ST_BF16 &&
                  L.decided_by == NB_CKPT_SRC_TENSORS && L.bytes == 64,
              "bf16 q_proj");
        check_kind(c, "model.layers.0.self_attn.k_proj", NB_CKPT_NONE, NULL);
        check_kind(c, "model.layers.0.self_attn.v_proj", NB_CKPT_NONE, NULL);
        nb_ckpt_config cfg;
        nb_ckpt_get_config(c, &cfg);
        CHECK(cfg.declared == NB_CKPT_NONE && !cfg.has_config_json && !cfg.quant_method, "bf16: no config");
    }
    nb_ckpt_close(c);
    free_set(&s);
}

static void test_sharded(void) {
    /* a ModelOpt layer split across two shards, plus a BF16 layer */
    tset s1 = {0}, s2 = {0};
    int64_t w[2] = {8, 32}, sc[2] = {8, 4}, e[2] = {4, 16};
    const uint8_t *c1 = add(&s1, "model.layers.1.mlp.gate_proj.weight", NB_ST_U8, 2, w, NULL, 0, 255);
    add(&s1, "model.embed_tokens.weight", NB_ST_BF16, 2, e, NULL, 0, 127);
    const uint8_t *k1 = add(&s2, "model.layers.1.mlp.gate_proj.weight_scale", NB_ST_F8_E4M3, 2, sc, NULL, E4M3_LO, E4M3_HI);
    add_f32(&s2, "model.layers.1.mlp.gate_proj.weight_scale_2", 0, 0.25f);
    write_set(&s1, "sharded", "model-00001-of-00002.safetensors");
    write_set(&s2, "sharded", "model-00002-of-00002.safetensors");
    write_text("sharded", "model.safetensors.index.json",
               "{\"metadata\": {\"total_size\": 648}, \"weight_map\": {\n"
               " \"model.layers.1.mlp.gate_proj.weight\": \"model-00001-of-00002.safetensors\",\n"
               " \"model.embed_tokens.weight\": \"model-00001-of-00002.safetensors\",\n"
               " \"model.layers.1.mlp.gate_proj.weight_scale\": \"model-00002-of-00002.safetensors\",\n"
               " \"model.layers.1.mlp.gate_proj.weight_scale_2\": \"model-00002-of-00002.safetensors\"}}\n");
    for (int via_index = 0; via_index < 2; via_index++) {
        nb_ckpt *c = open_sub(via_index ? "sharded/model.safetensors.index.json" : "sharded", NB_OK);
        if (!c) continue;
        size_t nf = 0;
        nb_ckpt_file_count(c, &nf);
        CHECK(nf == 3, "sharded: %zu files, want index + 2 shards", nf);
        const char *p = NULL;
        uint64_t bytes = 0;
        nb_ckpt_file_at(c, 0, &p, &bytes);
        CHECK(p && strstr(p, "index.json") && bytes > 0, "sharded: first file %s", p ? p : "(null)");
        CHECK(layer_count(c) == 2, "sharded: %zu layers", layer_count(c));
        check_quant(c, "model.layers.1.mlp.gate_proj", NB_CKPT_MODELOPT_NVFP4, 8, 64, 0, 0.25f, c1, k1,
                    NB_CKPT_SRC_TENSORS);
        check_kind(c, "model.embed_tokens", NB_CKPT_NONE, NULL);
        nb_ckpt_close(c);
    }
    free_set(&s1);
    free_set(&s2);
}

static void test_inconsistent(void) {
    tset s = {0};
    int64_t w[2] = {8, 32}, s16[2] = {8, 4}, s32[2] = {8, 2}, bad_cols[2] = {8, 3}, bad_rows[2] = {7, 4};
    int64_t odd[2] = {8, 4}, odd_s[2] = {8, 1}; /* K = 8: not a multiple of 16 */
    int64_t gb[4] = {2, 8, 2, 16}, gs_bad[3] = {2, 8, 3}, bf[2] = {4, 4};
    add(&s, "a.weight", NB_ST_U8, 2, w, NULL, 0, 255);
    add(&s, "a.weight_scale", NB_ST_F8_E4M3, 2, bad_cols, NULL, E4M3_LO, E4M3_HI);
    add_f32(&s, "a.weight_scale_2", 0, 1.0f);
    add(&s, "b.weight", NB_ST_U8, 2, w, NULL, 0, 255);
    add(&s, "b.weight_scale", NB_ST_F8_E4M3, 2, bad_rows, NULL, E4M3_LO, E4M3_HI);
    add_f32(&s, "b.weight_scale_2", 0, 1.0f);
    add(&s, "c.weight", NB_ST_U8, 2, w, NULL, 0, 255); /* no weight_scale */
    add(&s, "d.weight_packed", NB_ST_U8, 2, w, NULL, 0, 255); /* no weight_scale */
    add(&s, "e.weight", NB_ST_U8, 2, w, NULL, 0, 255);
    add(&s, "e.weight_scale", NB_ST_F8_E4M3, 2, s16, NULL, E4M3_LO, E4M3_HI); /* no weight_scale_2 */
    add(&s, "f.weight", NB_ST_U8, 2, w, NULL, 0, 255);
    add(&s, "f.weight_scale", NB_ST_U8, 2, s16, NULL, E8M0_LO, E8M0_HI); /* U8 with K/16 columns */
    add(&s, "g_blocks", NB_ST_U8, 4, gb, NULL, 0, 255);
    add(&s, "g_scales", NB_ST_U8, 3, gs_bad, NULL, E8M0_LO, E8M0_HI);
    add(&s, "h_scales", NB_ST_U8, 3, gs_bad, NULL, E8M0_LO, E8M0_HI); /* no blocks */
    add(&s, "i.weight_packed", NB_ST_U8, 2, w, NULL, 0, 255);
    add(&s, "i.weight_scale", NB_ST_F8_E4M3, 2, s16, NULL, E4M3_LO, E4M3_HI);
    add_f32(&s, "i.weight_global_scale", 1, 0.0f);
    add(&s, "j.weight", NB_ST_BF16, 2, bf, NULL, 0, 127);
    add(&s, "j.weight_scale", NB_ST_F8_E4M3, 2, s16, NULL, E4M3_LO, E4M3_HI); /* BF16 weight with block scales */
    add(&s, "k.weight_scale", NB_ST_U8, 2, s32, NULL, E8M0_LO, E8M0_HI);      /* no weight */
    add(&s, "l.weight", NB_ST_U8, 2, odd, NULL, 0, 255);
    add(&s, "l.weight_scale", NB_ST_F8_E4M3, 2, odd_s, NULL, E4M3_LO, E4M3_HI);
    add_f32(&s, "l.weight_scale_2", 0, 1.0f);
    /* one module in two layouts: a BF16 m.weight and gpt-oss's m_blocks / m_scales */
    int64_t gs[3] = {2, 8, 2};
    add(&s, "m.weight", NB_ST_BF16, 2, bf, NULL, 0, 127);
    add(&s, "m_blocks", NB_ST_U8, 4, gb, NULL, 0, 255);
    add(&s, "m_scales", NB_ST_U8, 3, gs, NULL, E8M0_LO, E8M0_HI);
    write_set(&s, "bad", "model.safetensors");
    nb_ckpt *c = open_sub("bad", NB_OK);
    if (c) {
        CHECK(layer_count(c) == 14, "bad: %zu layers, want 14", layer_count(c));
        int shared = 0;
        for (size_t i = 0; i < layer_count(c); i++) {
            nb_ckpt_layer L;
            nb_ckpt_layer_at(c, i, &L);
            if (strcmp(L.prefix, "m")) continue;
            shared++;
            nb_weight_desc d;
            const uint8_t *pc, *ps;
            CHECK(L.format == NB_CKPT_INCONSISTENT && strstr(L.problem, "cannot be told") &&
                      nb_ckpt_layer_weight(c, i, 0, &d, &pc, &ps) == NB_ERR_UNSUPPORTED,
                  "m (two layouts): %s, '%s'", fmt_name(L.format), L.problem);
        }
        CHECK(shared == 2, "m: %d layers, want 2 (m.weight and m_blocks), both inconsistent", shared);
        check_kind(c, "a", NB_CKPT_INCONSISTENT, "columns");
        check_kind(c, "b", NB_CKPT_INCONSISTENT, "rows");
        check_kind(c, "c", NB_CKPT_INCONSISTENT, "c.weight_scale is missing");
        check_kind(c, "d", NB_CKPT_INCONSISTENT, "d.weight_scale is missing");
        check_kind(c, "e", NB_CKPT_INCONSISTENT, "weight_scale_2 is missing");
        check_kind(c, "f", NB_CKPT_INCONSISTENT, "K/32");
        check_kind(c, "g", NB_CKPT_INCONSISTENT, "scales shape");
        check_kind(c, "h", NB_CKPT_INCONSISTENT, "h_blocks is missing");
        check_kind(c, "i", NB_CKPT_INCONSISTENT, "weight_global_scale is 0");
        check_kind(c, "j", NB_CKPT_INCONSISTENT, "U8");
        check_kind(c, "k", NB_CKPT_INCONSISTENT, "k.weight is missing");
        check_kind(c, "l", NB_CKPT_INCONSISTENT, "multiple of the group");
        nb_weight_desc d;
        const uint8_t *pc, *ps;
        CHECK(nb_ckpt_layer_weight(c, 99, 0, &d, &pc, &ps) == NB_ERR_NOT_FOUND, "layer out of range");
    }
    nb_ckpt_close(c);
    free_set(&s);
}

/* Exclude lists: ModelOpt wildcards (both files), compressed-tensors "re:"
 * entries, gpt-oss modules_to_not_convert; unquantized layers they name are
 * reported excluded, 4-bit ones they name are flagged. */
static void check_excl(nb_ckpt *c, const char *prefix, int excluded, const char *by, int mismatch) {
    nb_ckpt_layer L = get_layer(c, prefix, NULL);
    CHECK(L.excluded == excluded && (!by || (L.excluded_by && !strcmp(L.excluded_by, by))) &&
              L.config_mismatch == mismatch,
          "%s: excluded %d by %s, mismatch %d (%s); want %d by %s, %d", prefix, L.excluded,
          L.excluded_by ? L.excluded_by : "-", L.config_mismatch, L.problem, excluded, by ? by : "-", mismatch);
    if (mismatch) CHECK(strstr(L.problem, "excludes it") != NULL, "%s: problem '%s'", prefix, L.problem);
}

static void test_excludes(void) {
    tset s = {0};
    int64_t w[2] = {8, 32}, sc[2] = {8, 4}, bf[2] = {8, 64};
    add(&s, "model.layers.0.self_attn.q_proj.weight", NB_ST_U8, 2, w, NULL, 0, 255);
    add(&s, "model.layers.0.self_attn.q_proj.weight_scale", NB_ST_F8_E4M3, 2, sc, NULL, E4M3_LO, E4M3_HI);
    add_f32(&s, "model.layers.0.self_attn.q_proj.weight_scale_2", 0, 0.5f);
    add(&s, "model.layers.0.mlp.up_proj.weight", NB_ST_U8, 2, w, NULL, 0, 255);
    add(&s, "model.layers.0.mlp.up_proj.weight_scale", NB_ST_F8_E4M3, 2, sc, NULL, E4M3_LO, E4M3_HI);
    add_f32(&s, "model.layers.0.mlp.up_proj.weight_scale_2", 0, 0.5f);
    add(&s, "model.layers.1.self_attn.o_proj.weight", NB_ST_BF16, 2, bf, NULL, 0, 127);
    add(&s, "model.layers.1.mlp.gate.weight", NB_ST_BF16, 2, bf, NULL, 0, 127);
    add(&s, "model.layers.1.mlp.down_proj.weight", NB_ST_BF16, 2, bf, NULL, 0, 127);
    add(&s, "lm_head.weight", NB_ST_BF16, 2, bf, NULL, 0, 127);
    write_set(&s, "excl_mo", "model.safetensors");
    write_text("excl_mo", "hf_quant_config.json",
               "{\"quantization\": {\"quant_algo\": \"NVFP4\", \"exclude_modules\": [\"lm_head\", "
               "\"model.layers.*.self_attn\"]}}\n");
    write_text("excl_mo", "config.json",
               "{\"quantization_config\": {\"quant_method\": \"modelopt\", \"quant_algo\": \"NVFP4\", "
               "\"exclude_modules\": [\"*.mlp.gate\"]}}\n");
    nb_ckpt *c = open_sub("excl_mo", NB_OK);
    if (c) {
        check_excl(c, "lm_head", 1, "lm_head", 0);
        check_excl(c, "model.layers.1.self_attn.o_proj", 1, "model.layers.*.self_attn", 0); /* parent module */
        check_excl(c, "model.layers.0.self_attn.q_proj", 1, "model.layers.*.self_attn", 1); /* 4-bit, excluded */
        check_excl(c, "model.layers.1.mlp.gate", 1, "*.mlp.gate", 0);                        /* config.json list */
        check_excl(c, "model.layers.1.mlp.down_proj", 0, NULL, 0);
        check_excl(c, "model.layers.0.mlp.up_proj", 0, NULL, 0);
        nb_ckpt_layer L = get_layer(c, "lm_head", NULL);
        CHECK(L.decided_by == NB_CKPT_SRC_HF_QUANT_CONFIG && L.excluded_src == NB_CKPT_SRC_HF_QUANT_CONFIG,
              "lm_head decided by %s", src_name(L.decided_by));
        L = get_layer(c, "model.layers.1.mlp.gate", NULL);
        CHECK(L.decided_by == NB_CKPT_SRC_CONFIG_JSON, "gate decided by %s", src_name(L.decided_by));
        L = get_layer(c, "model.layers.0.self_attn.q_proj", NULL);
        CHECK(L.format == NB_CKPT_MODELOPT_NVFP4 && strstr(L.problem, "hf_quant_config.json"),
              "q_proj still modelopt-nvfp4, problem names the file: %s", L.problem);
        nb_ckpt_config cfg;
        nb_ckpt_get_config(c, &cfg);
        const char *pat = NULL, *where = NULL;
        int usable = 0;
        CHECK(cfg.nexclude == 3 && !cfg.note && nb_ckpt_exclude_at(c, 2, &pat, &where, &usable) == NB_OK &&
                  !strcmp(pat, "*.mlp.gate") && strstr(where, "config.json") && usable &&
                  nb_ckpt_exclude_at(c, 3, &pat, NULL, NULL) == NB_ERR_NOT_FOUND,
              "modelopt exclude list: %zu entries", cfg.nexclude);
    }
    nb_ckpt_close(c);

    /* compressed-tensors ignore with regexes; the same tensors renamed */
    free_set(&s);
    add(&s, "model.layers.0.mlp.down_proj.weight_packed", NB_ST_U8, 2, w, NULL, 0, 255);
    add(&s, "model.layers.0.mlp.down_proj.weight_scale", NB_ST_F8_E4M3, 2, sc, NULL, E4M3_LO, E4M3_HI);
    add_f32(&s, "model.layers.0.mlp.down_proj.weight_global_scale", 1, 2.0f);
    add(&s, "model.layers.0.mlp.gate_proj.weight_packed", NB_ST_U8, 2, w, NULL, 0, 255);
    add(&s, "model.layers.0.mlp.gate_proj.weight_scale", NB_ST_F8_E4M3, 2, sc, NULL, E4M3_LO, E4M3_HI);
    add_f32(&s, "model.layers.0.mlp.gate_proj.weight_global_scale", 1, 2.0f);
    add(&s, "model.layers.12.mlp.gate.weight", NB_ST_BF16, 2, bf, NULL, 0, 127);
    add(&s, "model.embed_tokens.weight", NB_ST_BF16, 2, bf, NULL, 0, 127);
    add(&s, "lm_head.weight", NB_ST_BF16, 2, bf, NULL, 0, 127);
    add(&s, "model.layers.0.self_attn.v_proj.weight", NB_ST_BF16, 2, bf, NULL, 0, 127);
    write_set(&s, "excl_ct", "model.safetensors");
    write_text("excl_ct", "config.json",
               "{\"quantization_config\": {\"quant_method\": \"compressed-tensors\", \"format\": "
               "\"nvfp4-pack-quantized\", \"ignore\": [\"re:.*lm_head\", \"re:model\\\\.layers\\\\.\\\\d+\\\\.mlp\\\\.gate$\", "
               "\"model.embed_tokens\", \"re:.*down_proj\", \"re:self_attn\", \"re:(?<=x)y\", 5, \"re:a+++\", "
               "\"re:((a{30}){30}){30}\", \"re:(a)\\\\1\", \"re:.*+?x\"]}}\n");
    c = open_sub("excl_ct", NB_OK);
    if (c) {
        check_excl(c, "lm_head", 1, "re:.*lm_head", 0);
        check_excl(c, "model.layers.12.mlp.gate", 1, "re:model\\.layers\\.\\d+\\.mlp\\.gate$", 0);
        check_excl(c, "model.layers.0.mlp.gate_proj", 0, NULL, 0); /* "$": gate, not gate_proj */
        check_excl(c, "model.embed_tokens", 1, "model.embed_tokens", 0);
        check_excl(c, "model.layers.0.mlp.down_proj", 1, "re:.*down_proj", 1);
        check_excl(c, "model.layers.0.self_attn.v_proj", 0, NULL, 0); /* re.match anchors at the start */
        nb_ckpt_config cfg;
        nb_ckpt_get_config(c, &cfg);
        CHECK(cfg.nexclude == 10 && cfg.note && strstr(cfg.note, "(?<=x)y") && strstr(cfg.note, "[6] is not a string") &&
                  strstr(cfg.note, "stacked") && strstr(cfg.note, "256 times") && strstr(cfg.note, "backreference"),
              "ct ignore: %zu entries, note %s", cfg.nexclude, cfg.note ? cfg.note : "(none)");
        int usable = 0;
        const char *pat = NULL;
        CHECK(nb_ckpt_exclude_at(c, 9, &pat, NULL, &usable) == NB_OK && usable == 0 && !strcmp(pat, "re:.*+?x"),
              "stacked quantifiers after a lazy one are refused too");
    }
    nb_ckpt_close(c);
    free_set(&s);

    /* the in-memory reader: gpt-oss modules_to_not_convert, a list that is not one */
    const char *cfg = "{\"quantization_config\": {\"quant_method\": \"mxfp4\", \"modules_to_not_convert\": "
                      "[\"model.layers.*.self_attn\", \"model.layers.*.mlp.router\", \"lm_head\"], \"ignore\": 3}}";
    const char *pre[5] = {"model.layers.3.self_attn.q_proj", "model.layers.3.mlp.router", "lm_head",
                          "model.layers.3.mlp.experts.down_proj", "lm_head_2"};
    int ex[5] = {-1, -1, -1, -1, -1};
    nb_status st = nbio_ckpt_config_check_memory(NULL, 0, cfg, strlen(cfg), pre, 5, ex);
    CHECK(st == NB_OK && ex[0] == 1 && ex[1] == 1 && ex[2] == 1 && ex[3] == 0 && ex[4] == 0,
          "gpt-oss modules_to_not_convert: %s %d %d %d %d %d", nb_last_error(), ex[0], ex[1], ex[2], ex[3], ex[4]);
    st = nbio_ckpt_config_check_memory("{\"quantization\": [", 18, NULL, 0, NULL, 0, NULL);
    CHECK(st == NB_ERR_CORRUPT && strstr(nb_last_error(), "hf_quant_config.json"), "bad JSON in memory: %s", nb_last_error());
    CHECK(nbio_ckpt_config_check_memory(NULL, 3, NULL, 0, NULL, 0, NULL) == NB_ERR_NULL_POINTER, "NULL text");
}

static void test_errors(void) {
    /* corrupt safetensors, missing path, empty directory, bad and huge configs */
    char path[1024];
    snprintf(path, sizeof path, "%s/corrupt.safetensors", g_dir);
    FILE *f = fopen(path, "wb");
    if (f) { /* header length 16, then a truncated JSON header */
        fwrite("\x10\0\0\0\0\0\0\0{\"a\": {\"dtype\"", 1, 21, f);
        fclose(f);
    }
    open_sub("corrupt.safetensors", NB_ERR_CORRUPT);
    open_sub("no_such_dir", NB_ERR_IO);
    write_text("empty", "README", "nothing here\n");
    open_sub("empty", NB_ERR_NOT_FOUND);

    tset s = {0};
    int64_t a[2] = {2, 2};
    add(&s, "x.weight", NB_ST_BF16, 2, a, NULL, 0, 127);
    write_set(&s, "badcfg", "model.safetensors");
    write_text("badcfg", "config.json", "{\"quantization_config\": {");
    open_sub("badcfg", NB_ERR_CORRUPT);
    write_set(&s, "hugecfg", "model.safetensors");
    snprintf(path, sizeof path, "%s/hugecfg/config.json", g_dir);
    f = fopen(path, "wb");
    if (f) {
        fputc('{', f);
        for (unsigned i = 0; i < NB_CKPT_MAX_CONFIG; i++) fputc(' ', f);
        fputc('}', f);
        fclose(f);
    }
    open_sub("hugecfg", NB_ERR_CORRUPT);
    free_set(&s);

    nb_ckpt *c = NULL;
    CHECK(nb_ckpt_open(NULL, &c) == NB_ERR_NULL_POINTER, "NULL path");
    CHECK(nb_ckpt_close(NULL) == NB_OK, "close NULL");
    const char *nm = NULL;
    CHECK(nb_ckpt_format_name(NB_CKPT_QUARK_MXFP4, &nm) == NB_OK && !strcmp(nm, "quark-mxfp4") &&
              nb_ckpt_format_name((nb_ckpt_format)77, &nm) == NB_ERR_INVALID_ARGUMENT &&
              strstr(nb_last_error(), "77") && !strcmp(nm, "quark-mxfp4"),
          "format names: %s", nb_last_error());
}

int main(int argc, char **argv) {
    int keep = fixture_dir_open(argc, argv, "nb_ckpt_test");
    if (keep < 0) return 2;
    test_modelopt();
    test_ct();
    test_quark();
    test_gptoss();
    test_bf16();
    test_sharded();
    test_inconsistent();
    test_excludes();
    test_errors();
    return fixture_dir_close(keep);
}
