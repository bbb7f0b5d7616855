/* test_ckpt_quantize_moe.c - nb_ckpt_quantize of a gpt-oss checkpoint
 * (nibble_io.h, "quantize", GPT-OSS): a small BF16/F16/F32 checkpoint shaped
 * like gpt-oss (config.json model_type "gpt_oss"; experts as 3-D
 * G.gate_up_proj [E, H, 2I] and G.down_proj [E, I, H], their biases, a
 * router, attention projections, embeddings, head) is quantized to MXFP4 and
 * reopened with nb_ckpt_open:
 *   - each experts module must be a gpt-oss group (nb_ckpt_moe_at) whose
 *     blocks and scales equal, expert by expert, nb_quantize_host of the
 *     transposed [N, K] slice of the source (each scale rule, and method
 *     MSE), with the biases as they were;
 *   - every other tensor (the linear weights included) byte-identical;
 *   - config.json: quant_method "mxfp4", modules_to_not_convert naming every
 *     module left unquantized and no experts module, model_type kept;
 *   - an exclude pattern on one experts module keeps it, listed in
 *     modules_to_not_convert; an experts tensor whose K is no multiple of 32
 *     is copied;
 *   - NVFP4 of the same input copies the experts (no layout for them);
 *   - a gpt-oss checkpoint with every experts module excluded is refused
 *     (NB_ERR_UNSUPPORTED, the reason naming gpt-oss) before OUT exists;
 *   - the devices: AUTO, CPU and (with a GPU) GPU give the same bytes.
 *
 *   test_ckpt_quantize_moe               fixtures in a temporary directory
 *   test_ckpt_quantize_moe --keep DIR    fixtures kept in DIR
 */
#define _POSIX_C_SOURCE 200809L
#include "ckpt_testlib.h"

#include <cjson/cJSON.h>

#include <unistd.h>

enum { E = 4, H = 64, I = 32 };

typedef struct spec {
    const char *name;
    nb_st_dtype dt;
    int rank;
    int64_t shape[3];
} spec;

static const spec k_tensors[] = {
    {"lm_head.weight", NB_ST_BF16, 2, {40, H}},
    {"model.embed_tokens.weight", NB_ST_BF16, 2, {40, H}},
    {"model.layers.0.mlp.experts.down_proj", NB_ST_BF16, 3, {E, I, H}},
    {"model.layers.0.mlp.experts.down_proj_bias", NB_ST_BF16, 2, {E, H}},
    {"model.layers.0.mlp.experts.gate_up_proj", NB_ST_BF16, 3, {E, H, 2 * I}},
    {"model.layers.0.mlp.experts.gate_up_proj_bias", NB_ST_BF16, 2, {E, 2 * I}},
    {"model.layers.0.mlp.router.bias", NB_ST_BF16, 1, {E}},
    {"model.layers.0.mlp.router.weight", NB_ST_BF16, 2, {E, H}},
    {"model.layers.0.self_attn.q_proj.bias", NB_ST_BF16, 1, {H}},
    {"model.layers.0.self_attn.q_proj.weight", NB_ST_BF16, 2, {H, H}},
    {"model.layers.1.mlp.experts.down_proj", NB_ST_F16, 3, {E, I, H}},
    {"model.layers.1.mlp.experts.down_proj_bias", NB_ST_BF16, 2, {E, H}},
    {"model.layers.1.mlp.experts.gate_up_proj", NB_ST_F32, 3, {E, H, 2 * I}},
    {"model.layers.1.mlp.experts.gate_up_proj_bias", NB_ST_BF16, 2, {E, 2 * I}},
    {"model.layers.1.mlp.router.weight", NB_ST_BF16, 2, {E, H}},
    {"model.layers.2.mlp.experts.gate_up_proj", NB_ST_BF16, 3, {2, 48, 16}}, /* K = 48: copied */
    {"model.norm.weight", NB_ST_BF16, 1, {H}},
};
#define NT (sizeof k_tensors / sizeof k_tensors[0])
static void *g_data[NT];
static size_t g_bytes[NT];

static const char *k_config = "{\"model_type\": \"gpt_oss\", \"num_experts_per_tok\": 2, \"swiglu_limit\": 7.0,\n"
                              " \"hidden_size\": 64, \"rope_theta\": 150000.0, \"eps\": -1.5e-05,\n"
                              " \"name\": \"a \\\"quoted\\\" 3.0 string\", \"list\": [1, 2.50, {\"x\": 1E3}],\n"
                              " \"torch_dtype\": \"bfloat16\"}\n";

static size_t esize(nb_st_dtype d) { return d == NB_ST_F32 ? 4 : 2; }

static void make_data(void) {
    for (size_t i = 0; i < NT; i++) {
        const spec *s = &k_tensors[i];
        size_t e = 1;
        for (int d = 0; d < s->rank; d++) e *= (size_t)s->shape[d];
        g_bytes[i] = e * esize(s->dt);
        uint8_t *p = (uint8_t *)malloc(g_bytes[i]);
        for (size_t j = 0; j < e; j++) {
            float v = (float)((rnd_unit() + rnd_unit() + rnd_unit() - 1.5) * 2.0);
            if ((j / 40) % 7 == 3) v *= 23.0f; /* rows and experts of very different magnitude */
            if (j % 89 == 5) v = 0.0f;
            if (s->dt == NB_ST_F32) {
                memcpy(p + 4 * j, &v, 4);
            } else {
                const uint16_t h = s->dt == NB_ST_BF16 ? ref_bf16(v) : ref_f16(v);
                memcpy(p + 2 * j, &h, 2);
            }
        }
        g_data[i] = p;
    }
}

static void write_ckpt(const char *sub, const char *config) {
    nb_st_tensor t[NT];
    for (size_t i = 0; i < NT; i++) {
        memset(&t[i], 0, sizeof t[i]);
        t[i].name = k_tensors[i].name;
        t[i].dtype = k_tensors[i].dt;
        t[i].rank = k_tensors[i].rank;
        for (int d = 0; d < t[i].rank; d++) t[i].shape[d] = k_tensors[i].shape[d];
        t[i].data = g_data[i];
        t[i].bytes = g_bytes[i];
    }
    char path[1024];
    snprintf(path, sizeof path, "%s/%s", g_dir, sub);
    mkdir(path, 0755);
    snprintf(path, sizeof path, "%s/%s/model.safetensors", g_dir, sub);
    nb_status st = nb_st_write(path, t, NT, NULL, 0);
    CHECK(st == NB_OK, "write %s: %s", path, nb_last_error());
    write_text(sub, "config.json", config);
    write_text(sub, "tokenizer.json", "{\"version\": \"1.0\"}\n");
}

static size_t index_of(const char *name) {
    for (size_t i = 0; i < NT; i++)
        if (!strcmp(k_tensors[i].name, name)) return i;
    printf("FAIL: no fixture tensor %s\n", name);
    exit(1);
}

static nb_dtype nb_dt(nb_st_dtype d) {
    return d == NB_ST_F32 ? NB_DTYPE_F32 : d == NB_ST_F16 ? NB_DTYPE_F16 : NB_DTYPE_BF16;
}

/* What the output must hold for experts tensor `name` [E, K, N]: every
 * expert's [K, N] slice transposed and quantized by nb_quantize_host. */
static void expected_experts(nb_context *ctx, const char *name, nb_mx_scale_rule rule, int method, uint8_t **codes,
                             uint8_t **scales, int64_t *n, int64_t *k) {
    const size_t i = index_of(name);
    const spec *s = &k_tensors[i];
    const int64_t ne = s->shape[0], K = s->shape[1], N = s->shape[2];
    const size_t es = esize(s->dt);
    nb_weight_desc d;
    nb_weight_desc_init(&d, NB_FORMAT_MXFP4, N, K);
    d.scale_rule = rule;
    d.method = method;
    const size_t cb = (size_t)(N * K / 2), sb = (size_t)(N * K / 32);
    *codes = (uint8_t *)malloc(cb * (size_t)ne);
    *scales = (uint8_t *)malloc(sb * (size_t)ne);
    uint8_t *w = (uint8_t *)malloc((size_t)(N * K) * es);
    for (int64_t x = 0; x < ne; x++) {
        const uint8_t *src = (const uint8_t *)g_data[i] + (size_t)(x * K * N) * es;
        for (int64_t kk = 0; kk < K; kk++)
            for (int64_t nn = 0; nn < N; nn++)
                memcpy(w + (size_t)(nn * K + kk) * es, src + (size_t)(kk * N + nn) * es, es);
        nb_status st = nb_quantize_host(ctx, &d, nb_dt(s->dt), w, *codes + (size_t)x * cb, *scales + (size_t)x * sb);
        CHECK(st == NB_OK, "nb_quantize_host of %s expert %lld: %s", name, (long long)x, nb_last_error());
    }
    free(w);
    *n = N;
    *k = K;
}

static int json_array_has(const cJSON *a, const char *s) {
    const cJSON *it;
    cJSON_ArrayForEach(it, a) if (cJSON_IsString(it) && !strcmp(it->valuestring, s)) return 1;
    return 0;
}

static cJSON *read_config(const char *sub) {
    char path[1024];
    size_t n = 0;
    snprintf(path, sizeof path, "%s/%s/config.json", g_dir, sub);
    char *text = read_file_all(path, &n);
    cJSON *j = text ? cJSON_Parse(text) : NULL;
    free(text);
    CHECK(j != NULL, "%s/config.json parses", sub);
    return j;
}

/* Tensor `name` of the output is a byte-identical copy of the input's. */
static void check_copied(nb_ckpt *c, const char *sub, const char *name) {
    const size_t i = index_of(name);
    size_t j = 0;
    nb_st_tensor t;
    nb_status st = nb_ckpt_tensor_find(c, name, &j);
    if (st == NB_OK) st = nb_ckpt_tensor_at(c, j, &t, NULL);
    CHECK(st == NB_OK && t.dtype == k_tensors[i].dt && t.rank == k_tensors[i].rank && t.bytes == g_bytes[i] &&
              !memcmp(t.data, g_data[i], g_bytes[i]),
          "%s: %s copied byte for byte (%s)", sub, name, st == NB_OK ? "" : nb_last_error());
}

/* Group G of the output: a gpt-oss group whose blocks and scales are the
 * expected ones. */
static void check_group(nb_context *ctx, nb_ckpt *c, const char *sub, const char *G, nb_mx_scale_rule rule,
                        int method) {
    size_t g = 0;
    nb_ckpt_moe m;
    nb_status st = nb_ckpt_moe_find(c, G, &g);
    if (st == NB_OK) st = nb_ckpt_moe_at(c, g, &m);
    CHECK(st == NB_OK && m.format == NB_CKPT_GPTOSS_MXFP4 && m.experts == E && m.hidden == H && m.intermediate == I &&
              m.activation == NB_MOE_ACT_SWIGLU_OAI && m.gate_up_layout == NB_MOE_GATE_UP_INTERLEAVED &&
              m.top_k == 2 && m.gate_up_bias >= 0 && m.down_bias >= 0,
          "%s: %s is a gpt-oss MXFP4 group (%s; %s)", sub, G, st == NB_OK ? fmt_name(m.format) : nb_last_error(),
          st == NB_OK ? m.problem : "");
    if (st != NB_OK) return;
    static const struct {
        const char *proj;
        nb_ckpt_moe_proj p;
    } projs[2] = {{"gate_up_proj", NB_CKPT_MOE_GATE_UP}, {"down_proj", NB_CKPT_MOE_DOWN}};
    for (int p = 0; p < 2; p++) {
        char name[160];
        snprintf(name, sizeof name, "%s.%s", G, projs[p].proj);
        uint8_t *wc = NULL, *ws = NULL;
        int64_t n = 0, k = 0;
        expected_experts(ctx, name, rule, method, &wc, &ws, &n, &k);
        nb_weight_desc d;
        const uint8_t *pc = NULL, *ps = NULL;
        st = nb_ckpt_moe_weights(c, g, projs[p].p, &d, &pc, &ps);
        CHECK(st == NB_OK && d.n == n && d.k == k && d.format == NB_FORMAT_MXFP4 &&
                  !memcmp(pc, wc, (size_t)(E * n * k / 2)) && !memcmp(ps, ws, (size_t)(E * n * k / 32)),
              "%s: %s blocks and scales are nb_quantize_host's of each transposed expert (%s)", sub, name,
              st == NB_OK ? "" : nb_last_error());
        free(wc);
        free(ws);
        snprintf(name, sizeof name, "%s.%s_bias", G, projs[p].proj);
        check_copied(c, sub, name);
    }
}

static const char *const k_linears[] = {"model.layers.0.self_attn.q_proj.weight", "model.layers.0.mlp.router.weight",
                                        "model.layers.1.mlp.router.weight", "model.embed_tokens.weight",
                                        "lm_head.weight"};

static void run_gptoss(nb_context *ctx, const char *out, nb_mx_scale_rule rule, int method, nb_ckpt_device dev) {
    nb_ckpt_quantize_summary sum;
    nb_status st = quantize_fixture("gptoss", out, NB_FORMAT_MXFP4, rule, method, dev, 1, NULL, &sum);
    CHECK(st == NB_OK && sum.layers_quantized == 4 && sum.experts_quantized == 4 && sum.weights_excluded == 6 &&
              sum.tensors_copied == NT - 4,
          "%s: quantized (%s): %zu layers, %d experts tensors, %zu weights kept, %zu copied", out,
          st == NB_OK ? "" : nb_last_error(), sum.layers_quantized, (int)sum.experts_quantized, sum.weights_excluded,
          sum.tensors_copied);
    if (st != NB_OK) return;
    nb_ckpt *c = open_fixture(out);
    if (!c) return;
    check_group(ctx, c, out, "model.layers.0.mlp.experts", rule, method);
    check_group(ctx, c, out, "model.layers.1.mlp.experts", rule, method);
    for (size_t i = 0; i < NT; i++)
        if (k_tensors[i].rank != 3 || !strcmp(k_tensors[i].name, "model.layers.2.mlp.experts.gate_up_proj"))
            check_copied(c, out, k_tensors[i].name);
    size_t j = 0;
    CHECK(nb_ckpt_tensor_find(c, "model.layers.0.mlp.experts.gate_up_proj", &j) == NB_ERR_NOT_FOUND,
          "%s: the BF16 experts tensor is replaced by its blocks and scales", out);
    nb_ckpt_close(c);
    cJSON *cfg = read_config(out);
    const cJSON *qc = cJSON_GetObjectItemCaseSensitive(cfg, "quantization_config");
    const cJSON *qm = cJSON_GetObjectItemCaseSensitive(qc, "quant_method");
    const cJSON *keep = cJSON_GetObjectItemCaseSensitive(qc, "modules_to_not_convert");
    const cJSON *mt = cJSON_GetObjectItemCaseSensitive(cfg, "model_type");
    int named = cJSON_IsArray(keep) && cJSON_GetArraySize(keep) == 6 && json_array_has(keep, "model.layers.2.mlp.experts");
    for (size_t i = 0; i < sizeof k_linears / sizeof k_linears[0] && named; i++) {
        char mod[128];
        snprintf(mod, sizeof mod, "%.*s", (int)(strlen(k_linears[i]) - 7), k_linears[i]);
        named = json_array_has(keep, mod);
    }
    CHECK(cJSON_IsString(qm) && !strcmp(qm->valuestring, "mxfp4") && named && cJSON_IsString(mt) &&
              !strcmp(mt->valuestring, "gpt_oss") && !json_array_has(keep, "model.layers.0.mlp.experts"),
          "%s: config.json quant_method mxfp4, the 6 kept modules in modules_to_not_convert", out);
    cJSON_Delete(cfg);
    /* numbers keep their text: 7.0 stays 7.0 (typed config readers refuse an int there) */
    char path[1024];
    size_t n = 0;
    snprintf(path, sizeof path, "%s/%s/config.json", g_dir, out);
    char *text = read_file_all(path, &n);
    const char *at = text ? strstr(text, "\"swiglu_limit\"") : NULL;
    if (at) at += strlen("\"swiglu_limit\"");
    while (at && (*at == ' ' || *at == '\t' || *at == ':')) at++;
    CHECK(at && !strncmp(at, "7.0", 3) && !(at[3] >= '0' && at[3] <= '9'),
          "%s: config.json keeps swiglu_limit as 7.0 (%.12s)", out, at ? at : "(missing)");
    free(text);
}

int main(int argc, char **argv) {
    int keep = fixture_dir_open(argc, argv, "nb_ckptqm_test");
    if (keep < 0) return 2;
    make_data();
    write_ckpt("gptoss", k_config);
    nb_context *ctx = NULL;
    nb_status st = nb_context_create(NB_DEVICE_NONE, &ctx);
    CHECK(st == NB_OK, "host context: %s", nb_last_error());
    if (st != NB_OK) return fixture_dir_close(keep);
    nb_build_info b;
    nb_get_build_info(&b);
    int count = 0;
    if (b.cuda) nb_device_count(&count);

    run_gptoss(ctx, "q_even", NB_MX_SCALE_EVEN, NB_QUANT_RTN, NB_CKPT_DEVICE_AUTO);
    run_gptoss(ctx, "q_ocp_cpu", NB_MX_SCALE_OCP, NB_QUANT_RTN, NB_CKPT_DEVICE_CPU);
    run_gptoss(ctx, "q_roundup_cpu", NB_MX_SCALE_ROUND_UP, NB_QUANT_RTN, NB_CKPT_DEVICE_CPU);
    run_gptoss(ctx, "q_mse", NB_MX_SCALE_EVEN, NB_QUANT_MSE, NB_CKPT_DEVICE_CPU);
    if (b.cuda && count > 0) run_gptoss(ctx, "q_even_gpu", NB_MX_SCALE_EVEN, NB_QUANT_RTN, NB_CKPT_DEVICE_GPU);

    /* an excluded experts module is copied and listed */
    nb_ckpt_quantize_summary sum;
    st = quantize_fixture("gptoss", "q_excl", NB_FORMAT_MXFP4, NB_MX_SCALE_EVEN, NB_QUANT_RTN, NB_CKPT_DEVICE_CPU, 1,
                  "*.layers.1.mlp.experts", &sum);
    CHECK(st == NB_OK && sum.experts_quantized == 2 && sum.weights_excluded == 8,
          "exclude one experts module: %s (%d experts tensors, %zu kept)", st == NB_OK ? "ok" : nb_last_error(),
          (int)sum.experts_quantized, sum.weights_excluded);
    if (st == NB_OK) {
        nb_ckpt *c = open_fixture("q_excl");
        if (c) {
            check_group(ctx, c, "q_excl", "model.layers.0.mlp.experts", NB_MX_SCALE_EVEN, NB_QUANT_RTN);
            check_copied(c, "q_excl", "model.layers.1.mlp.experts.gate_up_proj");
            check_copied(c, "q_excl", "model.layers.1.mlp.experts.down_proj");
            nb_ckpt_close(c);
        }
        cJSON *cfg = read_config("q_excl");
        const cJSON *kept =
            cJSON_GetObjectItemCaseSensitive(cJSON_GetObjectItemCaseSensitive(cfg, "quantization_config"),
                                             "modules_to_not_convert");
        CHECK(json_array_has(kept, "model.layers.1.mlp.experts") && !json_array_has(kept, "model.layers.0.mlp.experts"),
              "q_excl: the excluded experts module is in modules_to_not_convert");
        cJSON_Delete(cfg);
    }

    /* NVFP4: no layout for gpt-oss experts here, so they are copied; the linears are quantized (ModelOpt) */
    st = quantize_fixture("gptoss", "q_nvfp4", NB_FORMAT_NVFP4, NB_MX_SCALE_EVEN, NB_QUANT_RTN, NB_CKPT_DEVICE_CPU, 1, NULL, &sum);
    CHECK(st == NB_OK && sum.experts_quantized == 0 && sum.layers_quantized == 3,
          "nvfp4 of gpt-oss: %s (%zu layers, %d experts tensors)", st == NB_OK ? "ok" : nb_last_error(),
          sum.layers_quantized, (int)sum.experts_quantized);
    if (st == NB_OK) {
        nb_ckpt *c = open_fixture("q_nvfp4");
        if (c) {
            check_copied(c, "q_nvfp4", "model.layers.0.mlp.experts.gate_up_proj");
            check_copied(c, "q_nvfp4", "model.layers.1.mlp.experts.down_proj");
            nb_ckpt_close(c);
        }
    }

    /* the same tensors without model_type gpt_oss: experts copied, linears quantized (Quark) */
    write_ckpt("plain", "{\"model_type\": \"llama\"}\n");
    st = quantize_fixture("plain", "q_plain", NB_FORMAT_MXFP4, NB_MX_SCALE_EVEN, NB_QUANT_RTN, NB_CKPT_DEVICE_CPU, 1, NULL, &sum);
    CHECK(st == NB_OK && sum.experts_quantized == 0 && sum.layers_quantized == 3,
          "mxfp4 without model_type gpt_oss: %s (%zu layers, %d experts tensors)", st == NB_OK ? "ok" : nb_last_error(),
          sum.layers_quantized, (int)sum.experts_quantized);

    /* every experts module excluded: nothing to quantize in gpt-oss's layout */
    char out[1024];
    snprintf(out, sizeof out, "%s/q_none", g_dir);
    st = quantize_fixture("gptoss", "q_none", NB_FORMAT_MXFP4, NB_MX_SCALE_EVEN, NB_QUANT_RTN, NB_CKPT_DEVICE_CPU, 1,
                  "*.experts", &sum);
    CHECK(st == NB_ERR_UNSUPPORTED && strstr(nb_last_error(), "gpt-oss") && access(out, F_OK) != 0,
          "gpt-oss with every experts module excluded: %s (%s)", nb_status_name(st), nb_last_error());

    /* the input is unchanged */
    char path[1024];
    size_t n = 0;
    snprintf(path, sizeof path, "%s/gptoss/config.json", g_dir);
    char *cfg = read_file_all(path, &n);
    CHECK(cfg && !strcmp(cfg, k_config), "the input config.json is unchanged");
    free(cfg);
    nb_context_destroy(ctx);
    for (size_t i = 0; i < NT; i++) free(g_data[i]);
    return fixture_dir_close(keep);
}
