/* test_ckpt_moe.c - expert groups (nibble_io.h, "expert groups"): synthetic
 * mixture-of-experts checkpoints written here with nb_st_write, opened, and
 * their groups checked against what was written:
 *
 *   modelopt   ModelOpt NVFP4, one layer per expert and projection (Qwen3-MoE
 *              naming), a dense layer, a router and shared experts next to
 *              them (not grouped), a second layer whose expert 2 has different
 *              gate and up tensor scales; config.json num_experts_per_tok;
 *   ct         compressed-tensors NVFP4 (reciprocal global scales), top_k
 *              under text_config;
 *   mixtral    Quark MXFP4 with Mixtral's w1 / w3 / w2 names, and a
 *              compressed-tensors MXFP4 layer; no top_k in any config;
 *   mixtral_nvfp4  Mixtral's names with ModelOpt NVFP4 (as ModelOpt exports
 *              Mixtral) and compressed-tensors NVFP4, a router and an
 *              attention layer next to them, config.json num_experts_per_tok;
 *   gptoss     gpt-oss MXFP4 (expert-major blocks and scales, biases), and
 *              the same converted by nb_ckpt_convert to compressed-tensors and
 *              Quark (one fused gate_up layer per expert): the groups read the
 *              same bytes;
 *   bad        one inconsistent group per rule (an expert missing, a
 *              projection missing, mixed layouts, a wrong shape, fused
 *              per-expert layers of a model that is not gpt-oss, gpt-oss
 *              without down_proj, a bias of the wrong shape, mixed names, an
 *              inconsistent member), BF16 experts (no group) and an expert
 *              index with a leading zero (not an expert);
 *   bf16       BF16 experts (no group), quantized by nb_ckpt_quantize into
 *              ModelOpt layers per expert, which form a group.
 * Every expert of every consistent group is dequantized through the
 * descriptor and pointers nb_ckpt_moe_expert returns and compared bit for
 * bit with values decoded here from the bytes written (testlib's codecs);
 * nb_ckpt_moe_read's expert-major buffers are compared byte for byte with
 * the written bytes; nb_moe_mlp_host run on a group's buffers and
 * nb_ckpt_moe_desc equals the same run on buffers assembled here.
 *
 *   test_ckpt_moe                  fixtures in a temporary directory
 *   test_ckpt_moe --keep DIR       fixtures kept in DIR (ctest then runs
 *                                  `nibble inspect` on them)
 */
#define _POSIX_C_SOURCE 200809L
#include "ckpt_testlib.h"

#include <stdarg.h>

/* ------------------------------------------------------------ fixture helpers */

static char g_names[TSET_MAX][200];
static int g_nn;

/* A tensor name that lives until the next fixture. */
static const char *nm(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
static const char *nm(const char *fmt, ...) {
    char *p = g_names[g_nn++ % TSET_MAX];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(p, sizeof g_names[0], fmt, ap);
    va_end(ap);
    return p;
}

/* What a fixture wrote for one weight: its bytes and tensor scale. */
typedef struct wrec {
    const uint8_t *codes, *scales;
    float ts;
    int64_t n, k;
} wrec;

enum { L_MODELOPT, L_CT_NV, L_QUARK, L_CT_MX };

/* One quantized linear P in layout `lay` (n x k, random codes and finite
 * scales; NVFP4 tensor scale ts, stored as 1/ts by compressed-tensors). */
static wrec add_linear(tset *s, int lay, const char *P, int64_t n, int64_t k, float ts) {
    wrec w = {NULL, NULL, ts, n, k};
    const int nv = lay == L_MODELOPT || lay == L_CT_NV, g = nv ? 16 : 32;
    int64_t cs[2] = {n, k / 2}, ss[2] = {n, k / g};
    const int ct = lay == L_CT_NV || lay == L_CT_MX;
    w.codes = add(s, nm("%s.%s", P, ct ? "weight_packed" : "weight"), NB_ST_U8, 2, cs, NULL, 0, 255);
    if (nv) {
        w.scales = add(s, nm("%s.weight_scale", P), NB_ST_F8_E4M3, 2, ss, NULL, 0, 0x77); /* finite */
        if (ct) add_f32(s, nm("%s.weight_global_scale", P), 1, 1.0f / ts);
        else add_f32(s, nm("%s.weight_scale_2", P), 0, ts);
        add_f32(s, nm("%s.input_scale", P), 0, 1.0f);
    } else {
        w.scales = add(s, nm("%s.weight_scale", P), NB_ST_U8, 2, ss, NULL, 118, 134);
        w.ts = 1.0f;
    }
    return w;
}

/* Per-expert layers G.e.{names[0..2]} for e < E (gate [I, H], up, down [H, I]);
 * w[e * 3 + p] records them (p: gate, up, down). */
static void add_experts(tset *s, int lay, const char *G, int E, int64_t H, int64_t I, const char *const names[3],
                        wrec *w) {
    for (int e = 0; e < E; e++) {
        const float ts = (float)ldexp(1.0, -(int)(rnd_u64() % 6)); /* powers of two: exact reciprocals */
        for (int p = 0; p < 3; p++) /* gate and up share a tensor scale, down has its own */
            w[e * 3 + p] = add_linear(s, lay, nm("%s.%d.%s", G, e, names[p]), p == 2 ? H : I, p == 2 ? I : H,
                                      p == 2 ? ts * 0.5f : ts);
    }
}

static const char *const k_hf[3] = {"gate_proj", "up_proj", "down_proj"};
static const char *const k_mixtral[3] = {"w1", "w3", "w2"};

static nb_ckpt_moe get_group(const nb_ckpt *c, const char *prefix, size_t *gi) {
    nb_ckpt_moe m;
    memset(&m, 0, sizeof m);
    m.format = (nb_ckpt_format)-1;
    size_t i = 0;
    nb_status st = nb_ckpt_moe_find(c, prefix, &i);
    CHECK(st == NB_OK, "group %s: %s", prefix, nb_last_error());
    if (st == NB_OK) nb_ckpt_moe_at(c, i, &m);
    if (gi) *gi = i;
    return m;
}

/* ------------------------------------------------------------ checks */

/* The weight (desc, codes, scales) dequantized, against wr decoded here. */
static int same_weight(nb_context *ctx, const nb_weight_desc *d, const uint8_t *c, const uint8_t *s, const wrec *wr,
                       const char *what) {
    const int nv = d->format == NB_FORMAT_NVFP4, g = nv ? 16 : 32;
    if (d->n != wr->n || d->k != wr->k || d->tensor_scale != wr->ts || d->layout != NB_LAYOUT_CHECKPOINT) {
        CHECK(0, "%s: descriptor [%lld, %lld] ts %g, want [%lld, %lld] ts %g", what, (long long)d->n,
              (long long)d->k, (double)d->tensor_scale, (long long)wr->n, (long long)wr->k, (double)wr->ts);
        return 0;
    }
    float *out = malloc(sizeof(float) * (size_t)(wr->n * wr->k));
    nb_status st = nb_dequantize_host(ctx, d, c, s, NB_DTYPE_F32, out);
    size_t bad = 0;
    for (int64_t r = 0; r < wr->n && st == NB_OK; r++)
        for (int64_t j = 0; j < wr->k; j++) {
            const size_t idx = (size_t)(r * wr->k + j);
            const uint8_t sb = wr->scales[r * (wr->k / g) + j / g];
            const double q = k_e2m1[nib(wr->codes, idx)];
            const float want = nv ? (float)(q * ref_e4m3(sb)) * wr->ts : (float)(q * ref_e8m0(sb));
            bad += memcmp(&want, &out[idx], 4) != 0;
        }
    free(out);
    CHECK(st == NB_OK && bad == 0, "%s: %zu values differ (%s)", what, bad, st == NB_OK ? "" : nb_last_error());
    return st == NB_OK && bad == 0;
}

/* Every expert of a per-expert group (separate gate and up) through
 * nb_ckpt_moe_expert, and nb_ckpt_moe_read's buffers, against w. */
static void check_split_group(nb_context *ctx, const nb_ckpt *c, size_t gi, int64_t E, const wrec *w, int differ) {
    static const nb_ckpt_moe_proj pj[3] = {NB_CKPT_MOE_GATE, NB_CKPT_MOE_UP, NB_CKPT_MOE_DOWN};
    char what[128];
    for (int64_t e = 0; e < E; e++)
        for (int p = 0; p < 3; p++) {
            nb_weight_desc d;
            const uint8_t *pc = NULL, *ps = NULL;
            snprintf(what, sizeof what, "group %zu expert %lld proj %d", gi, (long long)e, (int)pj[p]);
            nb_status st = nb_ckpt_moe_expert(c, gi, pj[p], e, &d, &pc, &ps);
            CHECK(st == NB_OK, "%s: %s", what, nb_last_error());
            if (st == NB_OK) same_weight(ctx, &d, pc, ps, &w[e * 3 + p], what);
        }
    nb_weight_desc d;
    const uint8_t *pc, *ps;
    CHECK(nb_ckpt_moe_expert(c, gi, NB_CKPT_MOE_GATE_UP, 0, &d, &pc, &ps) == NB_ERR_UNSUPPORTED,
          "group %zu: GATE_UP of separate layers read zero copy", gi);
    CHECK(nb_ckpt_moe_weights(c, gi, NB_CKPT_MOE_DOWN, &d, &pc, &ps) == NB_ERR_UNSUPPORTED &&
              strstr(nb_last_error(), "nb_ckpt_moe_read"),
          "group %zu: per-expert weights handed out as one buffer: %s", gi, nb_last_error());
    CHECK(nb_ckpt_moe_expert(c, gi, NB_CKPT_MOE_DOWN, E, &d, &pc, &ps) == NB_ERR_INVALID_ARGUMENT,
          "group %zu: expert E accepted", gi);
    /* the expert-major copies: gate_up = gate then up, per expert */
    for (int which = 0; which < 4; which++) {
        static const nb_ckpt_moe_proj rp[4] = {NB_CKPT_MOE_GATE_UP, NB_CKPT_MOE_DOWN, NB_CKPT_MOE_GATE, NB_CKPT_MOE_UP};
        float *ts = malloc(sizeof(float) * (size_t)E);
        nb_status st = nb_ckpt_moe_read(c, gi, rp[which], &d, NULL, NULL, ts, (size_t)E);
        if (which == 0 && differ) {
            CHECK(st == NB_ERR_UNSUPPORTED && strstr(nb_last_error(), "differ"),
                  "group %zu: GATE_UP with differing scales: %s", gi, nb_last_error());
            free(ts);
            continue;
        }
        CHECK(st == NB_OK, "group %zu read %d (sizes): %s", gi, (int)rp[which], nb_last_error());
        if (st != NB_OK) {
            free(ts);
            continue;
        }
        nb_weight_sizes_v2 sz, cap;
        nb_weight_get_sizes_v2(&d, &sz);
        cap = sz;
        cap.codes_bytes *= (size_t)E;
        cap.scales_bytes *= (size_t)E;
        uint8_t *bc = malloc(cap.codes_bytes), *bs = malloc(cap.scales_bytes);
        const nb_weight_buffers out = {.codes = bc, .scales = bs};
        nb_weight_sizes_v2 shortc = cap;
        shortc.codes_bytes--;
        CHECK(nb_ckpt_moe_read(c, gi, rp[which], &d, &out, &shortc, NULL, 0) == NB_ERR_BUFFER_TOO_SMALL,
              "group %zu read: a short buffer accepted", gi);
        st = nb_ckpt_moe_read(c, gi, rp[which], &d, &out, &cap, ts, (size_t)E);
        CHECK(st == NB_OK, "group %zu read %d: %s", gi, (int)rp[which], nb_last_error());
        size_t bad = 0;
        for (int64_t e = 0; e < E && st == NB_OK; e++) {
            const int parts = which == 0 ? 2 : 1, first = which == 0 ? 0 : which == 1 ? 2 : which - 2;
            size_t oc = 0, os = 0;
            for (int q = 0; q < parts; q++) {
                const wrec *r = &w[e * 3 + first + q];
                const size_t ncb = (size_t)(r->n * r->k / 2), nsb = (size_t)(r->n * r->k) / (size_t)d.group_size;
                bad += memcmp(bc + (size_t)e * sz.codes_bytes + oc, r->codes, ncb) != 0;
                bad += memcmp(bs + (size_t)e * sz.scales_bytes + os, r->scales, nsb) != 0;
                oc += ncb;
                os += nsb;
            }
            bad += ts[e] != w[e * 3 + first].ts;
        }
        CHECK(bad == 0, "group %zu read %d: %zu experts' bytes or scales differ from the file", gi, (int)rp[which],
              bad);
        free(bc);
        free(bs);
        free(ts);
    }
}

/* nb_moe_mlp_host on group gi's buffers (nb_ckpt_moe_read, nb_ckpt_moe_desc)
 * against the same run on buffers assembled here from what was written. */
static void check_run(nb_context *ctx, const nb_ckpt *c, size_t gi, int64_t E, const wrec *w, int32_t top_k) {
    nb_moe_desc d;
    const int64_t m = 7;
    nb_status st = nb_ckpt_moe_desc(c, gi, m, top_k, NB_DTYPE_F32, &d);
    CHECK(st == NB_OK, "group %zu desc: %s", gi, nb_last_error());
    if (st != NB_OK) return;
    nb_moe_sizes sz;
    nb_moe_get_sizes(&d, &sz);
    const size_t gc = sz.gate_up.codes_bytes * (size_t)E, gs = sz.gate_up.scales_bytes * (size_t)E;
    const size_t dc = sz.down.codes_bytes * (size_t)E, ds = sz.down.scales_bytes * (size_t)E;
    uint8_t *b[8];
    for (int i = 0; i < 8; i++) b[i] = malloc(i % 4 == 0 ? gc : i % 4 == 1 ? gs : i % 4 == 2 ? dc : ds);
    float *ts[4];
    for (int i = 0; i < 4; i++) ts[i] = malloc(sizeof(float) * (size_t)E);
    nb_weight_desc wd;
    const nb_weight_buffers o1 = {.codes = b[0], .scales = b[1]}, o2 = {.codes = b[2], .scales = b[3]};
    const nb_weight_sizes_v2 c1 = {.codes_bytes = gc, .scales_bytes = gs}, c2 = {.codes_bytes = dc, .scales_bytes = ds};
    st = nb_ckpt_moe_read(c, gi, NB_CKPT_MOE_GATE_UP, &wd, &o1, &c1, ts[0], (size_t)E);
    if (st == NB_OK) st = nb_ckpt_moe_read(c, gi, NB_CKPT_MOE_DOWN, &wd, &o2, &c2, ts[1], (size_t)E);
    CHECK(st == NB_OK, "group %zu read for the run: %s", gi, nb_last_error());
    /* here: gate then up, down, from the records */
    for (int64_t e = 0; e < E; e++) {
        const wrec *g = &w[e * 3], *u = &w[e * 3 + 1], *dn = &w[e * 3 + 2];
        const size_t hc = sz.gate_up.codes_bytes / 2, hs = sz.gate_up.scales_bytes / 2;
        memcpy(b[4] + (size_t)e * sz.gate_up.codes_bytes, g->codes, hc);
        memcpy(b[4] + (size_t)e * sz.gate_up.codes_bytes + hc, u->codes, hc);
        memcpy(b[5] + (size_t)e * sz.gate_up.scales_bytes, g->scales, hs);
        memcpy(b[5] + (size_t)e * sz.gate_up.scales_bytes + hs, u->scales, hs);
        memcpy(b[6] + (size_t)e * sz.down.codes_bytes, dn->codes, sz.down.codes_bytes);
        memcpy(b[7] + (size_t)e * sz.down.scales_bytes, dn->scales, sz.down.scales_bytes);
        ts[2][e] = g->ts;
        ts[3][e] = dn->ts;
    }
    const int nv = d.gate_up.format == NB_FORMAT_NVFP4;
    nb_moe_weights w1 = {.gate_up = {b[0], b[1], NULL, {0}}, .down = {b[2], b[3], NULL, {0}},
                         .gate_up_scales = nv ? ts[0] : NULL, .down_scales = nv ? ts[1] : NULL};
    nb_moe_weights w2 = {.gate_up = {b[4], b[5], NULL, {0}}, .down = {b[6], b[7], NULL, {0}},
                         .gate_up_scales = nv ? ts[2] : NULL, .down_scales = nv ? ts[3] : NULL};
    const int64_t H = d.hidden, K = d.top_k;
    float *x = malloc(sizeof(float) * (size_t)(m * H)), *y1 = malloc(sizeof(float) * (size_t)(m * H));
    float *y2 = malloc(sizeof(float) * (size_t)(m * H)), *tw = malloc(sizeof(float) * (size_t)(m * K));
    int32_t *ids = malloc(sizeof(int32_t) * (size_t)(m * K));
    for (int64_t i = 0; i < m * H; i++) x[i] = (float)(2.0 * rnd_unit() - 1.0);
    for (int64_t t = 0; t < m; t++)
        for (int64_t s = 0; s < K; s++) {
            ids[t * K + s] = (int32_t)((t + s * 3) % E); /* distinct: K <= E and 3 coprime to E here */
            tw[t * K + s] = 1.0f / (float)K;
        }
    if (st == NB_OK) st = nb_moe_mlp_host(ctx, &d, x, &w1, ids, tw, y1);
    if (st == NB_OK) st = nb_moe_mlp_host(ctx, &d, x, &w2, ids, tw, y2);
    CHECK(st == NB_OK && !memcmp(y1, y2, sizeof(float) * (size_t)(m * H)),
          "group %zu: the MoE run on the group's buffers differs from the written bytes' (%s)", gi,
          st == NB_OK ? "" : nb_last_error());
    for (int i = 0; i < 8; i++) free(b[i]);
    for (int i = 0; i < 4; i++) free(ts[i]);
    free(x);
    free(y1);
    free(y2);
    free(tw);
    free(ids);
}

/* ------------------------------------------------------------ fixtures */

static void test_modelopt(nb_context *ctx) {
    tset s = {.n = 0};
    g_nn = 0;
    static wrec w0[8 * 3], w1[4 * 3];
    add_experts(&s, L_MODELOPT, "model.layers.0.mlp.experts", 8, 64, 32, k_hf, w0);
    add_experts(&s, L_MODELOPT, "model.layers.1.mlp.experts", 4, 32, 16, k_hf, w1);
    /* layer 1, expert 2: up's tensor scale differs from gate's */
    for (size_t i = 0; i < s.n; i++)
        if (!strcmp(s.t[i].name, "model.layers.1.mlp.experts.2.up_proj.weight_scale_2")) {
            float v = 3.0f;
            memcpy((void *)s.t[i].data, &v, 4);
            w1[2 * 3 + 1].ts = v;
        }
    add_linear(&s, L_MODELOPT, "model.layers.0.self_attn.q_proj", 64, 64, 0.5f);
    for (int p = 0; p < 3; p++)
        add_linear(&s, L_MODELOPT, nm("model.layers.0.mlp.shared_experts.%s", k_hf[p]), p == 2 ? 64 : 32,
                   p == 2 ? 32 : 64, 0.25f);
    int64_t rs[2] = {8, 64};
    add(&s, "model.layers.0.mlp.gate.weight", NB_ST_BF16, 2, rs, NULL, 0, 127);
    write_set(&s, "modelopt", "model.safetensors");
    write_text("modelopt", "config.json",
               "{\"model_type\": \"qwen3_moe\", \"num_experts_per_tok\": 2, \"quantization_config\": "
               "{\"quant_method\": \"modelopt\", \"quant_algo\": \"NVFP4\"}}");
    write_text("modelopt", "hf_quant_config.json",
               "{\"quantization\": {\"quant_algo\": \"NVFP4\", \"exclude_modules\": [\"*mlp.gate\"]}}");
    nb_ckpt *c = open_fixture("modelopt");
    if (!c) return;
    size_t n = 0;
    CHECK(nb_ckpt_moe_count(c, &n) == NB_OK && n == 2, "modelopt: %zu groups, want 2", n);
    size_t g0, g1;
    nb_ckpt_moe m = get_group(c, "model.layers.0.mlp.experts", &g0);
    uint64_t bytes = 0;
    for (int i = 0; i < 24; i++) {
        size_t li;
        nb_ckpt_layer L;
        char pre[160];
        snprintf(pre, sizeof pre, "model.layers.0.mlp.experts.%d.%s", i / 3, k_hf[i % 3]);
        if (nb_ckpt_layer_find(c, pre, &li) == NB_OK && nb_ckpt_layer_at(c, li, &L) == NB_OK) bytes += L.bytes;
    }
    CHECK(m.format == NB_CKPT_MODELOPT_NVFP4 && m.experts == 8 && m.hidden == 64 && m.intermediate == 32 &&
              m.activation == NB_MOE_ACT_SWIGLU && m.gate_up_layout == NB_MOE_GATE_UP_CONCAT && m.per_expert == 1 &&
              m.fused == 0 && m.top_k == 2 && m.limit == 0.0f && m.alpha == 0.0f && m.gate_up_bias == -1 &&
              m.down_bias == -1 && m.gate_up_scales_differ == 0 && m.layers == 24 && m.bytes == bytes &&
              m.problem[0] == 0 && m.reserved[0] == 0,
          "modelopt group 0: %s E %lld H %lld I %lld act %d layout %d top_k %d layers %d bytes %llu/%llu (%s)",
          fmt_name(m.format), (long long)m.experts, (long long)m.hidden, (long long)m.intermediate, m.activation,
          m.gate_up_layout, m.top_k, m.layers, (unsigned long long)m.bytes, (unsigned long long)bytes, m.problem);
    m = get_group(c, "model.layers.1.mlp.experts", &g1);
    CHECK(m.format == NB_CKPT_MODELOPT_NVFP4 && m.experts == 4 && m.gate_up_scales_differ == 1,
          "modelopt group 1: %s E %lld differ %d", fmt_name(m.format), (long long)m.experts, m.gate_up_scales_differ);
    /* membership */
    size_t li;
    int64_t grp = 7, ex = 7;
    nb_ckpt_moe_proj pj = (nb_ckpt_moe_proj)0;
    CHECK(nb_ckpt_layer_find(c, "model.layers.0.mlp.experts.3.up_proj", &li) == NB_OK &&
              nb_ckpt_layer_moe(c, li, &grp, &pj, &ex) == NB_OK && grp == (int64_t)g0 && pj == NB_CKPT_MOE_UP &&
              ex == 3,
          "modelopt: experts.3.up_proj in group %lld proj %d expert %lld", (long long)grp, (int)pj, (long long)ex);
    CHECK(nb_ckpt_layer_find(c, "model.layers.0.mlp.shared_experts.gate_proj", &li) == NB_OK &&
              nb_ckpt_layer_moe(c, li, &grp, &pj, &ex) == NB_OK && grp == -1 && pj == 0 && ex == -1,
          "modelopt: a shared expert in group %lld", (long long)grp);
    CHECK(nb_ckpt_layer_find(c, "model.layers.0.self_attn.q_proj", &li) == NB_OK &&
              nb_ckpt_layer_moe(c, li, &grp, NULL, NULL) == NB_OK && grp == -1,
          "modelopt: q_proj in group %lld", (long long)grp);
    check_split_group(ctx, c, g0, 8, w0, 0);
    check_split_group(ctx, c, g1, 4, w1, 1);
    check_run(ctx, c, g0, 8, w0, 0);
    nb_moe_desc d;
    CHECK(nb_ckpt_moe_desc(c, g0, 5, 0, NB_DTYPE_BF16, &d) == NB_OK && d.m == 5 && d.experts == 8 && d.top_k == 2 &&
              d.hidden == 64 && d.intermediate == 32 && d.gate_up.format == NB_FORMAT_NVFP4 && d.gate_up.n == 64 &&
              d.down.n == 64 && d.down.k == 32 && d.activation == NB_MOE_ACT_SWIGLU &&
              d.gate_up_layout == NB_MOE_GATE_UP_CONCAT && d.act_dtype == NB_DTYPE_BF16,
          "modelopt desc: %s", nb_last_error());
    CHECK(nb_ckpt_moe_desc(c, g0, 5, 4, NB_DTYPE_BF16, &d) == NB_OK && d.top_k == 4, "modelopt desc top_k 4");
    nb_ckpt_close(c);
    free_set(&s);
}

static void test_ct(nb_context *ctx) {
    tset s = {.n = 0};
    g_nn = 0;
    static wrec w[4 * 3];
    add_experts(&s, L_CT_NV, "model.language_model.layers.0.mlp.experts", 4, 32, 16, k_hf, w);
    write_set(&s, "ct", "model.safetensors");
    write_text("ct", "config.json",
               "{\"text_config\": {\"num_experts_per_tok\": 3}, \"quantization_config\": {\"quant_method\": "
               "\"compressed-tensors\", \"format\": \"nvfp4-pack-quantized\"}}");
    nb_ckpt *c = open_fixture("ct");
    if (!c) return;
    size_t g;
    nb_ckpt_moe m = get_group(c, "model.language_model.layers.0.mlp.experts", &g);
    CHECK(m.format == NB_CKPT_CT_NVFP4 && m.experts == 4 && m.hidden == 32 && m.intermediate == 16 && m.top_k == 3,
          "ct group: %s E %lld top_k %d (%s)", fmt_name(m.format), (long long)m.experts, m.top_k, m.problem);
    check_split_group(ctx, c, g, 4, w, 0);
    check_run(ctx, c, g, 4, w, 0);
    nb_ckpt_close(c);
    free_set(&s);
}

static void test_mixtral(nb_context *ctx) {
    tset s = {.n = 0};
    g_nn = 0;
    static wrec w0[4 * 3], w1[4 * 3];
    add_experts(&s, L_QUARK, "model.layers.0.block_sparse_moe.experts", 4, 64, 32, k_mixtral, w0);
    add_experts(&s, L_CT_MX, "model.layers.1.block_sparse_moe.experts", 4, 32, 64, k_hf, w1);
    write_set(&s, "mixtral", "model.safetensors");
    nb_ckpt *c = open_fixture("mixtral");
    if (!c) return;
    size_t g0, g1;
    nb_ckpt_moe m = get_group(c, "model.layers.0.block_sparse_moe.experts", &g0);
    CHECK(m.format == NB_CKPT_QUARK_MXFP4 && m.experts == 4 && m.hidden == 64 && m.intermediate == 32 &&
              m.top_k == 0 && m.activation == NB_MOE_ACT_SWIGLU,
          "mixtral group: %s (%s)", fmt_name(m.format), m.problem);
    m = get_group(c, "model.layers.1.block_sparse_moe.experts", &g1);
    CHECK(m.format == NB_CKPT_CT_MXFP4 && m.hidden == 32 && m.intermediate == 64, "ct-mxfp4 group: %s (%s)",
          fmt_name(m.format), m.problem);
    check_split_group(ctx, c, g0, 4, w0, 0);
    check_split_group(ctx, c, g1, 4, w1, 0);
    nb_moe_desc d;
    CHECK(nb_ckpt_moe_desc(c, g0, 3, 0, NB_DTYPE_F32, &d) == NB_ERR_INVALID_ARGUMENT &&
              strstr(nb_last_error(), "num_experts_per_tok"),
          "mixtral: top_k 0 without a config: %s", nb_last_error());
    check_run(ctx, c, g0, 4, w0, 2);
    check_run(ctx, c, g1, 4, w1, 3);
    nb_ckpt_close(c);
    free_set(&s);
}

/* Mixtral's names with NVFP4, as ModelOpt exports Mixtral (and as
 * compressed-tensors names it): w1 is gate, w3 up, w2 down, whatever order
 * the names sort in; the router (block_sparse_moe.gate) and the attention
 * stay out of the groups. */
static void test_mixtral_nvfp4(nb_context *ctx) {
    tset s = {.n = 0};
    g_nn = 0;
    static wrec w0[4 * 3], w1[4 * 3];
    add_experts(&s, L_MODELOPT, "model.layers.0.block_sparse_moe.experts", 4, 64, 32, k_mixtral, w0);
    add_experts(&s, L_CT_NV, "model.layers.1.block_sparse_moe.experts", 4, 64, 32, k_mixtral, w1);
    add_linear(&s, L_MODELOPT, "model.layers.0.self_attn.q_proj", 64, 64, 0.5f);
    int64_t rs[2] = {4, 64};
    add(&s, "model.layers.0.block_sparse_moe.gate.weight", NB_ST_BF16, 2, rs, NULL, 0, 127);
    write_set(&s, "mixtral_nvfp4", "model.safetensors");
    write_text("mixtral_nvfp4", "config.json",
               "{\"model_type\": \"mixtral\", \"num_experts_per_tok\": 2, \"num_local_experts\": 4}");
    nb_ckpt *c = open_fixture("mixtral_nvfp4");
    if (!c) return;
    size_t n = 0, g0, g1;
    CHECK(nb_ckpt_moe_count(c, &n) == NB_OK && n == 2, "mixtral nvfp4: %zu groups, want 2", n);
    nb_ckpt_moe m = get_group(c, "model.layers.0.block_sparse_moe.experts", &g0);
    CHECK(m.format == NB_CKPT_MODELOPT_NVFP4 && m.experts == 4 && m.hidden == 64 && m.intermediate == 32 &&
              m.top_k == 2 && m.activation == NB_MOE_ACT_SWIGLU && m.gate_up_layout == NB_MOE_GATE_UP_CONCAT &&
              m.per_expert == 1 && m.fused == 0 && m.layers == 12 && m.problem[0] == 0,
          "mixtral modelopt group: %s E %lld H %lld I %lld top_k %d layers %d (%s)", fmt_name(m.format),
          (long long)m.experts, (long long)m.hidden, (long long)m.intermediate, m.top_k, m.layers, m.problem);
    m = get_group(c, "model.layers.1.block_sparse_moe.experts", &g1);
    CHECK(m.format == NB_CKPT_CT_NVFP4 && m.experts == 4 && m.hidden == 64 && m.intermediate == 32 && m.top_k == 2,
          "mixtral ct-nvfp4 group: %s (%s)", fmt_name(m.format), m.problem);
    /* membership: w1 gate, w3 up, w2 down */
    const struct {
        const char *name;
        nb_ckpt_moe_proj proj;
    } want[3] = {{"w1", NB_CKPT_MOE_GATE}, {"w3", NB_CKPT_MOE_UP}, {"w2", NB_CKPT_MOE_DOWN}};
    for (int p = 0; p < 3; p++) {
        size_t li;
        int64_t grp = 7, ex = 7;
        nb_ckpt_moe_proj pj = (nb_ckpt_moe_proj)0;
        const char *pre = nm("model.layers.1.block_sparse_moe.experts.3.%s", want[p].name);
        CHECK(nb_ckpt_layer_find(c, pre, &li) == NB_OK && nb_ckpt_layer_moe(c, li, &grp, &pj, &ex) == NB_OK &&
                  grp == (int64_t)g1 && pj == want[p].proj && ex == 3,
              "mixtral: %s in group %lld proj %d expert %lld", pre, (long long)grp, (int)pj, (long long)ex);
    }
    size_t li;
    int64_t grp = 7;
    CHECK(nb_ckpt_layer_find(c, "model.layers.0.self_attn.q_proj", &li) == NB_OK &&
              nb_ckpt_layer_moe(c, li, &grp, NULL, NULL) == NB_OK && grp == -1,
          "mixtral: q_proj in group %lld", (long long)grp);
    check_split_group(ctx, c, g0, 4, w0, 0);
    check_split_group(ctx, c, g1, 4, w1, 0);
    check_run(ctx, c, g0, 4, w0, 0);
    check_run(ctx, c, g1, 4, w1, 0);
    nb_ckpt_close(c);
    free_set(&s);
}

/* gpt-oss: expert-major tensors; then converted to per-expert layers. */
static void test_gptoss(nb_context *ctx) {
    enum { E = 4, H = 64, I = 32 };
    tset s = {.n = 0};
    g_nn = 0;
    const int64_t gb[4] = {E, 2 * I, H / 32, 16}, gs[3] = {E, 2 * I, H / 32}, gbias[2] = {E, 2 * I};
    const int64_t db[4] = {E, H, I / 32, 16}, ds[3] = {E, H, I / 32}, dbias[2] = {E, H};
    const char *P = "model.layers.0.mlp.experts";
    const uint8_t *guc = add(&s, nm("%s.gate_up_proj_blocks", P), NB_ST_U8, 4, gb, NULL, 0, 255);
    const uint8_t *gus = add(&s, nm("%s.gate_up_proj_scales", P), NB_ST_U8, 3, gs, NULL, 118, 130);
    add(&s, nm("%s.gate_up_proj_bias", P), NB_ST_BF16, 2, gbias, NULL, 0, 63);
    const uint8_t *dc = add(&s, nm("%s.down_proj_blocks", P), NB_ST_U8, 4, db, NULL, 0, 255);
    const uint8_t *dsc = add(&s, nm("%s.down_proj_scales", P), NB_ST_U8, 3, ds, NULL, 118, 130);
    add(&s, nm("%s.down_proj_bias", P), NB_ST_BF16, 2, dbias, NULL, 0, 63);
    int64_t rs[2] = {E, H}, rb[1] = {E};
    add(&s, "model.layers.0.mlp.router.weight", NB_ST_BF16, 2, rs, NULL, 0, 63);
    add(&s, "model.layers.0.mlp.router.bias", NB_ST_BF16, 1, rb, NULL, 0, 63);
    write_set(&s, "gptoss", "model.safetensors");
    write_text("gptoss", "config.json",
               "{\"model_type\": \"gpt_oss\", \"num_experts_per_tok\": 2, \"swiglu_limit\": 6.5, "
               "\"quantization_config\": {\"quant_method\": \"mxfp4\", \"modules_to_not_convert\": "
               "[\"model.layers.*.mlp.router\"]}}");
    nb_ckpt *c = open_fixture("gptoss");
    if (!c) return;
    size_t g, jb;
    nb_ckpt_moe m = get_group(c, P, &g);
    nb_ckpt_tensor_find(c, "model.layers.0.mlp.experts.gate_up_proj_bias", &jb);
    size_t jd = 0;
    nb_ckpt_tensor_find(c, "model.layers.0.mlp.experts.down_proj_bias", &jd);
    CHECK(m.format == NB_CKPT_GPTOSS_MXFP4 && m.experts == E && m.hidden == H && m.intermediate == I &&
              m.activation == NB_MOE_ACT_SWIGLU_OAI && m.gate_up_layout == NB_MOE_GATE_UP_INTERLEAVED &&
              m.per_expert == 0 && m.fused == 1 && m.top_k == 2 && m.limit == 6.5f && m.alpha == 1.702f &&
              m.gate_up_bias == (int64_t)jb && m.down_bias == (int64_t)jd && m.layers == 2,
          "gptoss group: %s E %lld H %lld I %lld limit %g bias %lld/%lld (%s)", fmt_name(m.format),
          (long long)m.experts, (long long)m.hidden, (long long)m.intermediate, (double)m.limit,
          (long long)m.gate_up_bias, (long long)m.down_bias, m.problem);
    /* zero copy: the tensors of the file mapping themselves */
    const void *mapped[4];
    static const char *const tn[4] = {"gate_up_proj_blocks", "gate_up_proj_scales", "down_proj_blocks",
                                      "down_proj_scales"};
    for (int i = 0; i < 4; i++) {
        char name[128];
        size_t j = 0;
        nb_st_tensor t;
        snprintf(name, sizeof name, "%s.%s", P, tn[i]);
        mapped[i] = nb_ckpt_tensor_find(c, name, &j) == NB_OK && nb_ckpt_tensor_at(c, j, &t, NULL) == NB_OK ? t.data
                                                                                                         : NULL;
    }
    nb_weight_desc d;
    const uint8_t *pc = NULL, *ps = NULL;
    nb_status st = nb_ckpt_moe_weights(c, g, NB_CKPT_MOE_GATE_UP, &d, &pc, &ps);
    CHECK(st == NB_OK && pc == mapped[0] && ps == mapped[1] && d.n == 2 * I && d.k == H &&
              d.format == NB_FORMAT_MXFP4 && !memcmp(pc, guc, (size_t)(E * 2 * I * H / 2)),
          "gptoss weights GATE_UP: zero copy of the file's tensors (%s)", nb_last_error());
    st = nb_ckpt_moe_weights(c, g, NB_CKPT_MOE_DOWN, &d, &pc, &ps);
    CHECK(st == NB_OK && pc == mapped[2] && ps == mapped[3] && !memcmp(ps, dsc, (size_t)(E * H * I / 32)),
          "gptoss weights DOWN: %s", nb_last_error());
    CHECK(nb_ckpt_moe_expert(c, g, NB_CKPT_MOE_GATE, 0, &d, &pc, &ps) == NB_ERR_UNSUPPORTED &&
              strstr(nb_last_error(), "interleaved"),
          "gptoss: GATE of interleaved rows: %s", nb_last_error());
    for (int e = 0; e < E; e++) {
        wrec r1 = {guc + (size_t)e * (2 * I * H / 2), gus + (size_t)e * (2 * I * H / 32), 1.0f, 2 * I, H};
        wrec r2 = {dc + (size_t)e * (H * I / 2), dsc + (size_t)e * (H * I / 32), 1.0f, H, I};
        char what[64];
        snprintf(what, sizeof what, "gptoss expert %d", e);
        st = nb_ckpt_moe_expert(c, g, NB_CKPT_MOE_GATE_UP, e, &d, &pc, &ps);
        if (st == NB_OK) same_weight(ctx, &d, pc, ps, &r1, what);
        else CHECK(0, "%s: %s", what, nb_last_error());
        st = nb_ckpt_moe_expert(c, g, NB_CKPT_MOE_DOWN, e, &d, &pc, &ps);
        if (st == NB_OK) same_weight(ctx, &d, pc, ps, &r2, what);
        else CHECK(0, "%s down: %s", what, nb_last_error());
    }
    nb_moe_desc md;
    CHECK(nb_ckpt_moe_desc(c, g, 3, 0, NB_DTYPE_BF16, &md) == NB_OK && md.activation == NB_MOE_ACT_SWIGLU_OAI &&
              md.gate_up_layout == NB_MOE_GATE_UP_INTERLEAVED && md.limit == 6.5f && md.alpha == 1.702f &&
              md.top_k == 2 && md.gate_up.format == NB_FORMAT_MXFP4,
          "gptoss desc: %s", nb_last_error());
    /* the MLP straight from the mapping: weights zero copy, the BF16 biases as they are */
    const uint8_t *c1, *s1, *c2, *s2;
    nb_st_tensor tb1, tb2;
    nb_ckpt_tensor_at(c, jb, &tb1, NULL);
    nb_ckpt_tensor_at(c, jd, &tb2, NULL);
    nb_ckpt_moe_weights(c, g, NB_CKPT_MOE_GATE_UP, &d, &c1, &s1);
    nb_ckpt_moe_weights(c, g, NB_CKPT_MOE_DOWN, &d, &c2, &s2);
    nb_moe_weights w = {.gate_up = {c1, s1, NULL, {0}}, .down = {c2, s2, NULL, {0}}, .gate_up_bias = tb1.data,
                        .down_bias = tb2.data};
    uint16_t x[3 * H], y[3 * H];
    for (int i = 0; i < 3 * H; i++) x[i] = ref_bf16((float)(2.0 * rnd_unit() - 1.0));
    const int32_t ids[6] = {0, 3, 2, 1, 1, 3};
    const float tw[6] = {0.5f, 0.5f, 0.75f, 0.25f, 0.6f, 0.4f};
    st = nb_moe_mlp_host(ctx, &md, x, &w, ids, tw, y);
    CHECK(st == NB_OK, "gptoss: nb_moe_mlp_host on the checkpoint's buffers: %s", nb_last_error());
    nb_ckpt_close(c);

    /* converted: one fused gate_up layer per expert, the same bytes */
    static const nb_ckpt_target targets[2] = {NB_CKPT_TARGET_CT, NB_CKPT_TARGET_QUARK};
    static const char *const subs[2] = {"gptoss_ct", "gptoss_quark"};
    for (int t = 0; t < 2; t++) {
        char in[1024], out[1024];
        snprintf(in, sizeof in, "%s/gptoss", g_dir);
        snprintf(out, sizeof out, "%s/%s", g_dir, subs[t]);
        nb_ckpt_convert_opts o;
        nb_ckpt_convert_opts_init(&o);
        o.target = targets[t];
        st = nb_ckpt_convert(in, out, &o, NULL);
        CHECK(st == NB_OK, "convert gptoss to %s: %s", subs[t], nb_last_error());
        if (st != NB_OK) continue;
        nb_ckpt *cc = open_fixture(subs[t]);
        if (!cc) continue;
        size_t gc;
        m = get_group(cc, P, &gc);
        CHECK(m.format == (t ? NB_CKPT_QUARK_MXFP4 : NB_CKPT_CT_MXFP4) && m.per_expert == 1 && m.fused == 1 &&
                  m.experts == E && m.activation == NB_MOE_ACT_SWIGLU_OAI &&
                  m.gate_up_layout == NB_MOE_GATE_UP_INTERLEAVED && m.limit == 6.5f && m.layers == 2 * E &&
                  m.gate_up_bias == -1,
              "%s group: %s per_expert %d fused %d E %lld (%s)", subs[t], fmt_name(m.format), m.per_expert, m.fused,
              (long long)m.experts, m.problem);
        uint8_t *bc = malloc(sizeof(uint8_t) * (size_t)(E * 2 * I * H / 2)), *bs = malloc((size_t)(E * 2 * I * H / 32));
        const nb_weight_buffers ob = {.codes = bc, .scales = bs};
        const nb_weight_sizes_v2 cap = {.codes_bytes = (size_t)(E * 2 * I * H / 2),
                                        .scales_bytes = (size_t)(E * 2 * I * H / 32)};
        st = nb_ckpt_moe_read(cc, gc, NB_CKPT_MOE_GATE_UP, &d, &ob, &cap, NULL, 0);
        CHECK(st == NB_OK && !memcmp(bc, guc, cap.codes_bytes) && !memcmp(bs, gus, cap.scales_bytes),
              "%s: gate_up read back differs from gpt-oss's (%s)", subs[t], st == NB_OK ? "" : nb_last_error());
        CHECK(nb_ckpt_moe_expert(cc, gc, NB_CKPT_MOE_UP, 1, &d, &pc, &ps) == NB_ERR_UNSUPPORTED,
              "%s: UP of fused layers", subs[t]);
        CHECK(nb_ckpt_moe_weights(cc, gc, NB_CKPT_MOE_GATE_UP, &d, &pc, &ps) == NB_ERR_UNSUPPORTED,
              "%s: per-expert tensors handed out as one", subs[t]);
        free(bc);
        free(bs);
        nb_ckpt_close(cc);
    }
    free_set(&s);
}

/* One inconsistent group per rule. */
static void test_bad(void) {
    tset s = {.n = 0};
    g_nn = 0;
    const char *const fused_names[3] = {"gate_up_proj", "gate_up_proj", "down_proj"};
    /* L0: expert 2 missing */
    for (int e = 0; e < 4; e++)
        for (int p = 0; p < 3 && e != 2; p++)
            add_linear(&s, L_MODELOPT, nm("model.layers.0.mlp.experts.%d.%s", e, k_hf[p]), p == 2 ? 32 : 16,
                       p == 2 ? 16 : 32, 1.0f);
    /* L1: expert 1 has no up_proj */
    for (int e = 0; e < 2; e++)
        for (int p = 0; p < 3; p++)
            if (!(e == 1 && p == 1))
                add_linear(&s, L_MODELOPT, nm("model.layers.1.mlp.experts.%d.%s", e, k_hf[p]), p == 2 ? 32 : 16,
                           p == 2 ? 16 : 32, 1.0f);
    /* L2: expert 1's down is Quark MXFP4 */
    for (int e = 0; e < 2; e++)
        for (int p = 0; p < 3; p++)
            add_linear(&s, e == 1 && p == 2 ? L_QUARK : L_MODELOPT, nm("model.layers.2.mlp.experts.%d.%s", e, k_hf[p]),
                       p == 2 ? 64 : 32, p == 2 ? 32 : 64, 1.0f);
    /* L3: expert 1's down has I/2 columns */
    for (int e = 0; e < 2; e++)
        for (int p = 0; p < 3; p++)
            add_linear(&s, L_MODELOPT, nm("model.layers.3.mlp.experts.%d.%s", e, k_hf[p]), p == 2 ? 32 : 32,
                       p == 2 ? (e == 1 ? 16 : 32) : 32, 1.0f);
    /* L4: fused per-expert gate_up_proj, but the model is not gpt-oss */
    for (int e = 0; e < 2; e++)
        for (int p = 1; p < 3; p++)
            add_linear(&s, L_QUARK, nm("model.layers.4.mlp.experts.%d.%s", e, fused_names[p]), p == 2 ? 32 : 64, 32,
                       1.0f);
    /* L5: gpt-oss gate_up without down; L6: gpt-oss with a bias of the wrong shape */
    const int64_t gb[4] = {2, 64, 1, 16}, gs[3] = {2, 64, 1}, db[4] = {2, 32, 1, 16}, ds[3] = {2, 32, 1};
    const int64_t bb[2] = {2, 9};
    add(&s, "model.layers.5.mlp.experts.gate_up_proj_blocks", NB_ST_U8, 4, gb, NULL, 0, 255);
    add(&s, "model.layers.5.mlp.experts.gate_up_proj_scales", NB_ST_U8, 3, gs, NULL, 120, 130);
    add(&s, "model.layers.6.mlp.experts.gate_up_proj_blocks", NB_ST_U8, 4, gb, NULL, 0, 255);
    add(&s, "model.layers.6.mlp.experts.gate_up_proj_scales", NB_ST_U8, 3, gs, NULL, 120, 130);
    add(&s, "model.layers.6.mlp.experts.gate_up_proj_bias", NB_ST_BF16, 2, bb, NULL, 0, 63);
    add(&s, "model.layers.6.mlp.experts.down_proj_blocks", NB_ST_U8, 4, db, NULL, 0, 255);
    add(&s, "model.layers.6.mlp.experts.down_proj_scales", NB_ST_U8, 3, ds, NULL, 120, 130);
    /* L7: BF16 experts: no group */
    for (int e = 0; e < 2; e++)
        for (int p = 0; p < 3; p++) {
            int64_t sh[2] = {p == 2 ? 32 : 16, p == 2 ? 16 : 32};
            add(&s, nm("model.layers.7.mlp.experts.%d.%s.weight", e, k_hf[p]), NB_ST_BF16, 2, sh, NULL, 0, 63);
        }
    /* L8: expert 0 with Hugging Face names, expert 1 with Mixtral's */
    for (int e = 0; e < 2; e++)
        for (int p = 0; p < 3; p++)
            add_linear(&s, L_MODELOPT, nm("model.layers.8.mlp.experts.%d.%s", e, e ? k_mixtral[p] : k_hf[p]),
                       p == 2 ? 32 : 16, p == 2 ? 16 : 32, 1.0f);
    /* L9: an index with a leading zero is not an expert */
    add_linear(&s, L_MODELOPT, "model.layers.9.mlp.experts.01.gate_proj", 16, 32, 1.0f);
    /* L10: expert 1's up_proj has no weight_scale_2 (an inconsistent layer) */
    for (int e = 0; e < 2; e++)
        for (int p = 0; p < 3; p++) {
            const char *P = nm("model.layers.10.mlp.experts.%d.%s", e, k_hf[p]);
            if (e == 1 && p == 1) {
                int64_t cs[2] = {16, 16}, ss[2] = {16, 2};
                add(&s, nm("%s.weight", P), NB_ST_U8, 2, cs, NULL, 0, 255);
                add(&s, nm("%s.weight_scale", P), NB_ST_F8_E4M3, 2, ss, NULL, 0, 0x77);
            } else {
                add_linear(&s, L_MODELOPT, P, p == 2 ? 32 : 16, p == 2 ? 16 : 32, 1.0f);
            }
        }
    write_set(&s, "bad", "model.safetensors");
    write_text("bad", "config.json", "{\"model_type\": \"qwen3_moe\", \"num_experts_per_tok\": 1}");
    nb_ckpt *c = open_fixture("bad");
    if (!c) return;
    static const struct {
        const char *prefix, *problem;
    } k[] = {
        {"model.layers.0.mlp.experts", "expert 2 is missing"},
        {"model.layers.1.mlp.experts", "expert 1 has no up_proj"},
        {"model.layers.2.mlp.experts", "model.layers.2.mlp.experts.1.down_proj is quark-mxfp4"},
        {"model.layers.3.mlp.experts", "model.layers.3.mlp.experts.1.down_proj is [32, 16], not [32, 32]"},
        {"model.layers.4.mlp.experts", "known only for gpt-oss"},
        {"model.layers.5.mlp.experts", "model.layers.5.mlp.experts.down_proj is missing"},
        {"model.layers.6.mlp.experts", "gate_up_proj_bias is BF16 rank 2 [2, 9]"},
        {"model.layers.8.mlp.experts", "mixes gate_proj / up_proj / down_proj names with w1 / w3 / w2"},
        {"model.layers.10.mlp.experts", "model.layers.10.mlp.experts.1.up_proj is inconsistent"},
    };
    size_t n = 0;
    nb_ckpt_moe_count(c, &n);
    CHECK(n == sizeof k / sizeof k[0], "bad: %zu groups, want %zu", n, sizeof k / sizeof k[0]);
    for (size_t i = 0; i < sizeof k / sizeof k[0]; i++) {
        size_t g;
        nb_ckpt_moe m = get_group(c, k[i].prefix, &g);
        CHECK(m.format == NB_CKPT_INCONSISTENT && strstr(m.problem, k[i].problem), "%s: %s \"%s\", want \"%s\"",
              k[i].prefix, fmt_name(m.format), m.problem, k[i].problem);
        nb_moe_desc d;
        nb_weight_desc wd;
        const uint8_t *pc, *ps;
        CHECK(nb_ckpt_moe_desc(c, g, 1, 1, NB_DTYPE_F32, &d) == NB_ERR_UNSUPPORTED &&
                  strstr(nb_last_error(), k[i].problem),
              "%s: desc of an inconsistent group: %s", k[i].prefix, nb_last_error());
        CHECK(nb_ckpt_moe_expert(c, g, NB_CKPT_MOE_DOWN, 0, &wd, &pc, &ps) == NB_ERR_UNSUPPORTED,
              "%s: expert of an inconsistent group", k[i].prefix);
        CHECK(nb_ckpt_moe_read(c, g, NB_CKPT_MOE_DOWN, &wd, NULL, NULL, NULL, 0) == NB_ERR_UNSUPPORTED,
              "%s: read of an inconsistent group", k[i].prefix);
    }
    size_t li;
    int64_t grp = 0;
    CHECK(nb_ckpt_layer_find(c, "model.layers.9.mlp.experts.01.gate_proj", &li) == NB_OK &&
              nb_ckpt_layer_moe(c, li, &grp, NULL, NULL) == NB_OK && grp == -1,
          "experts.01 grouped (%lld)", (long long)grp);
    CHECK(nb_ckpt_moe_find(c, "model.layers.7.mlp.experts", &li) == NB_ERR_NOT_FOUND, "BF16 experts grouped");
    /* the layers of an inconsistent group name it, even when an expert is missing */
    size_t g0 = 0;
    nb_ckpt_moe_proj pj = (nb_ckpt_moe_proj)0;
    int64_t ex = 0;
    nb_ckpt_moe_find(c, "model.layers.0.mlp.experts", &g0);
    CHECK(nb_ckpt_layer_find(c, "model.layers.0.mlp.experts.3.up_proj", &li) == NB_OK &&
              nb_ckpt_layer_moe(c, li, &grp, &pj, &ex) == NB_OK && grp == (int64_t)g0 && pj == NB_CKPT_MOE_UP &&
              ex == 3,
          "experts.3.up_proj of a group missing expert 2: group %lld proj %d expert %lld", (long long)grp, (int)pj,
          (long long)ex);
    nb_ckpt_moe_find(c, "model.layers.5.mlp.experts", &g0);
    CHECK(nb_ckpt_layer_find(c, "model.layers.5.mlp.experts.gate_up_proj", &li) == NB_OK &&
              nb_ckpt_layer_moe(c, li, &grp, &pj, &ex) == NB_OK && grp == (int64_t)g0 && pj == NB_CKPT_MOE_GATE_UP &&
              ex == -1,
          "gpt-oss gate_up without down: group %lld proj %d expert %lld", (long long)grp, (int)pj, (long long)ex);
    /* the members of an inconsistent group stay layers of their own */
    nb_weight_desc wd;
    const uint8_t *pc, *ps;
    CHECK(nb_ckpt_layer_find(c, "model.layers.0.mlp.experts.3.down_proj", &li) == NB_OK &&
              nb_ckpt_layer_weight(c, li, 0, &wd, &pc, &ps) == NB_OK,
          "a member of an inconsistent group: %s", nb_last_error());
    nb_ckpt_close(c);
    free_set(&s);
}

/* A BF16 checkpoint's experts form no group; quantized by nb_ckpt_quantize
 * (one ModelOpt layer per expert and projection) they do. */
static void test_quantized_bf16(void) {
    enum { E = 4, H = 64, I = 32 };
    tset s = {.n = 0};
    g_nn = 0;
    for (int e = 0; e < E; e++)
        for (int p = 0; p < 3; p++) {
            int64_t sh[2] = {p == 2 ? H : I, p == 2 ? I : H};
            add(&s, nm("model.layers.0.mlp.experts.%d.%s.weight", e, k_hf[p]), NB_ST_BF16, 2, sh, NULL, 0, 0x3F);
        }
    write_set(&s, "bf16", "model.safetensors");
    write_text("bf16", "config.json", "{\"model_type\": \"qwen3_moe\", \"num_experts_per_tok\": 2}");
    nb_ckpt *c = open_fixture("bf16");
    size_t n = 9;
    CHECK(c && nb_ckpt_moe_count(c, &n) == NB_OK && n == 0, "BF16 experts: %zu groups", n);
    nb_ckpt_close(c);
    char in[1024], out[1024];
    snprintf(in, sizeof in, "%s/bf16", g_dir);
    snprintf(out, sizeof out, "%s/bf16_nvfp4", g_dir);
    nb_ckpt_quantize_opts o;
    nb_ckpt_quantize_opts_init(&o);
    o.device = NB_CKPT_DEVICE_CPU;
    nb_status st = nb_ckpt_quantize(in, out, &o, NULL);
    CHECK(st == NB_OK, "quantize BF16 experts: %s", nb_last_error());
    if (st == NB_OK && (c = open_fixture("bf16_nvfp4"))) {
        size_t g;
        nb_ckpt_moe m = get_group(c, "model.layers.0.mlp.experts", &g);
        CHECK(m.format == NB_CKPT_MODELOPT_NVFP4 && m.experts == E && m.hidden == H && m.intermediate == I &&
                  m.top_k == 2 && m.layers == 3 * E,
              "quantized experts: %s E %lld (%s)", fmt_name(m.format), (long long)m.experts, m.problem);
        nb_ckpt_close(c);
    }
    free_set(&s);
}

int main(int argc, char **argv) {
    const int keep = fixture_dir_open(argc, argv, "nibble_moe");
    if (keep < 0) return 1;
    nb_context *ctx = NULL;
    if (nb_context_create(NB_DEVICE_NONE, &ctx) != NB_OK) {
        printf("cannot create a host context: %s\n", nb_last_error());
        return 1;
    }
    test_modelopt(ctx);
    test_ct(ctx);
    test_mixtral(ctx);
    test_mixtral_nvfp4(ctx);
    test_gptoss(ctx);
    test_bad();
    test_quantized_bf16();
    nb_context_destroy(ctx);
    return fixture_dir_close(keep);
}
