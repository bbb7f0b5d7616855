/* test_ckpt_int.c - checkpoints of the layouts converted when read (AWQ
 * GEMM, GPTQ v1 and v2 with and without act-order, symmetric 8-bit GPTQ
 * (codes and scales also checked against the packed tensors), compressed-tensors
 * pack-quantized int4 / int4 symmetric / int8 with and without g_idx,
 * bitsandbytes nf4 and fp4 with plain and nested absmax, HQQ 4-bit with F16
 * and BF16 scales and zero points), written here with the packing formulas
 * of docs/formats.md sections 4.3 and 5, opened with
 * nb_ckpt_open and read through nb_ckpt_layer_weight_v2 and
 * nb_dequantize_host_v2: every value must equal the producer's own
 * dequantization, computed here from the logical codes, zero points and
 * scales the file was built from.  Inconsistent layers are reported with
 * their reason; the zero-copy function refuses these layouts by name.
 *
 * argv: [--keep DIR] keeps the fixtures (the CLI test runs `nibble inspect`
 * on them).  Output: "N passed, M failed". */
#define _POSIX_C_SOURCE 200809L /* mkdtemp */
#include <nibble.h>
#include <nibble_io.h>

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define TESTLIB_SEED 0x13198A2E03707344ull
#include "ckpt_testlib.h"

static const double k_nf4[16] = {-1.0, -0.6961928009986877, -0.5250730514526367, -0.39491748809814453,
                                 -0.28444138169288635, -0.18477343022823334, -0.09105003625154495, 0.0,
                                 0.07958029955625534, 0.16093020141124725, 0.24611230194568634, 0.33791524171829224,
                                 0.44070982933044434, 0.5626170039176941, 0.7229568362236023, 1.0};
static const float k_fp4[16] = {0, 0.0625f, 8, 12, 4, 6, 2, 3, 0, -0.0625f, -8, -12, -4, -6, -2, -3};
static float table(int fp4, int c) { return fp4 ? k_fp4[c] / 12.0f : (float)k_nf4[c]; }

/* A finite F16 or BF16 scale bit pattern, either sign, some subnormal. */
static uint16_t rnd_scale16(int bf16) {
    const float v = (float)ldexp(0.5 + rnd_unit(), (int)(rnd_u64() % 12) - 10) * (rnd_u64() & 1 ? -1 : 1);
    return rnd_u64() % 17 == 0 ? (uint16_t)(rnd_u64() % 0x3FF) : bf16 ? ref_bf16(v) : ref_f16(v);
}

static uint32_t *words(size_t n) { return (uint32_t *)calloc(n ? n : 1, 4); }

/* Layer `prefix` is of layout fmt, n x k, read by v2 and dequantized: each
 * value equals want[n * k] (F32 bits; NaN any NaN).  The zero-copy
 * function refuses it, naming the _v2 one. */
static void check_layer(nb_ckpt *c, const char *prefix, nb_ckpt_format fmt, int64_t n, int64_t k,
                        const float *want, int permuted) {
    size_t i = 0;
    nb_ckpt_layer L;
    if (!c || nb_ckpt_layer_find(c, prefix, &i) != NB_OK || nb_ckpt_layer_at(c, i, &L) != NB_OK) {
        CHECK(0, "%s: no layer", prefix);
        return;
    }
    CHECK(L.format == fmt && L.n == n && L.k == k && L.k_permuted == permuted && L.tensor_scale == 1.0f,
          "%s: %s %lld x %lld permuted %d (%s), want %s %lld x %lld permuted %d", prefix, fmt_name(L.format),
          (long long)L.n, (long long)L.k, L.k_permuted, L.problem, fmt_name(fmt), (long long)n, (long long)k,
          permuted);
    if (L.format != fmt) return;
    nb_weight_desc d;
    const uint8_t *pc, *ps;
    CHECK(nb_ckpt_layer_weight(c, i, 0, &d, &pc, &ps) == NB_ERR_UNSUPPORTED &&
              strstr(nb_last_error(), "nb_ckpt_layer_weight_v2"),
          "%s: zero-copy read: %s", prefix, nb_last_error());
    nb_status st = nb_ckpt_layer_weight_v2(c, i, 0, &d, NULL, NULL);
    nb_weight_sizes_v2 sz;
    if (st == NB_OK) st = nb_weight_get_sizes_v2(&d, &sz);
    CHECK(st == NB_OK, "%s: desc: %s", prefix, nb_last_error());
    if (st != NB_OK) return;
    uint8_t *codes = malloc(sz.codes_bytes), *scales = malloc(sz.scales_bytes);
    uint8_t *zeros = sz.zeros_bytes ? malloc(sz.zeros_bytes) : NULL;
    float *out = malloc(sizeof(float) * (size_t)(n * k));
    nb_weight_buffers b = {.codes = codes, .scales = scales, .zeros = zeros};
    st = nb_ckpt_layer_weight_v2(c, i, 0, &d, &b, &sz);
    CHECK(st == NB_OK, "%s: read: %s", prefix, nb_last_error());
    nb_context *ctx = NULL;
    nb_context_create(NB_DEVICE_NONE, &ctx);
    nb_weight_data w = {.codes = codes, .scales = scales, .zeros = zeros};
    if (st == NB_OK) st = nb_dequantize_host_v2(ctx, &d, &w, NB_DTYPE_F32, out);
    CHECK(st == NB_OK, "%s: dequantize: %s", prefix, nb_last_error());
    int64_t bad = 0, first = -1;
    for (int64_t e = 0; st == NB_OK && e < n * k; e++) {
        uint32_t a, bb;
        memcpy(&a, &out[e], 4), memcpy(&bb, &want[e], 4);
        if (!(isnan(want[e]) ? isnan(out[e]) : a == bb) && !bad++) first = e;
    }
    CHECK(bad == 0, "%s: %lld values differ, first [%lld, %lld]: %a, want %a", prefix, (long long)bad,
          (long long)(first / k), (long long)(first % k), first < 0 ? 0.0 : (double)out[first],
          first < 0 ? 0.0 : (double)want[first]);
    nb_context_destroy(ctx);
    free(codes), free(scales), free(zeros), free(out);
}

static void check_bad(nb_ckpt *c, const char *prefix, const char *part) {
    size_t i;
    nb_ckpt_layer L;
    if (!c || nb_ckpt_layer_find(c, prefix, &i) != NB_OK || nb_ckpt_layer_at(c, i, &L) != NB_OK) {
        CHECK(0, "%s: no layer", prefix);
        return;
    }
    CHECK(L.format == NB_CKPT_INCONSISTENT && strstr(L.problem, part), "%s: %s (\"%s\"), want inconsistent with \"%s\"",
          prefix, fmt_name(L.format), L.problem, part);
}

/* The order the weight's columns come back in (nibble_io.h, act-order): by
 * group, each group's columns in ascending order. */
static void stable_order(const int32_t *gidx, int64_t k, int64_t g, int32_t *perm) {
    int64_t pos = 0;
    for (int64_t b = 0; b < k / g; b++)
        for (int64_t kk = 0; kk < k; kk++)
            if (gidx[kk] == b) perm[pos++] = (int32_t)kk;
}

/* g_idx for groups of g over k columns: with act, the groups follow a random
 * permutation of k (g_idx = invperm / g, as GPTQ's act-order writes it),
 * else g_idx = k / g; perm: the column order the weight comes back in. */
static void act_order_gidx(int64_t k, int64_t g, int act, int32_t *gidx, int32_t *perm) {
    for (int64_t j = 0; j < k; j++) perm[j] = (int32_t)j;
    for (int64_t j = k - 1; act && j > 0; j--) {
        int64_t r = (int64_t)(rnd_u64() % (uint64_t)(j + 1));
        int32_t t = perm[j];
        perm[j] = perm[r], perm[r] = t;
    }
    for (int64_t j = 0; j < k; j++) gidx[perm[j]] = (int32_t)(j / g); /* column perm[j] is in group j / g */
    stable_order(gidx, k, g, perm);
}

/* ------------------------------------------------------------ AWQ, GPTQ */

/* One AWQ or GPTQ layer P of n x k with groups of g: tensors into s, the
 * expected values into want (column order of the weight v2 returns: the
 * groups' order when gidx is given).  v1: GPTQ's stored zero is z - 1. */
static void add_qweight_layer(tset *s, const char *P, int awq, int64_t n, int64_t k, int64_t g, int act_order,
                              int v1, int bf16, float *want, char names[][96]) {
    static const int order[8] = {0, 2, 4, 6, 1, 3, 5, 7}; /* AWQ: physical nibble i holds logical column order[i] */
    const int64_t G = k / g;
    uint8_t *q = malloc((size_t)(n * k)), *zs = malloc((size_t)(n * G));
    uint16_t *sc = malloc(2 * (size_t)(n * G));
    int32_t *gidx = malloc(4 * (size_t)k), *perm = malloc(4 * (size_t)k);
    for (int64_t i = 0; i < n * k; i++) q[i] = (uint8_t)(rnd_u64() & 15);
    for (int64_t i = 0; i < n * G; i++) zs[i] = (uint8_t)(rnd_u64() & 15), sc[i] = rnd_scale16(bf16);
    act_order_gidx(k, g, act_order, gidx, perm);
    uint32_t *qw = words((size_t)(n * k / 8)), *qz = words((size_t)(n * G / 8));
    for (int64_t r = 0; r < n; r++)
        for (int64_t kk = 0; kk < k; kk++) {
            if (awq) {
                int phys = 0;
                while (order[phys] != r % 8) phys++;
                qw[kk * (n / 8) + r / 8] |= (uint32_t)q[r * k + kk] << (4 * phys);
            } else {
                qw[(kk / 8) * n + r] |= (uint32_t)q[r * k + kk] << (4 * (kk % 8));
            }
        }
    for (int64_t r = 0; r < n; r++)
        for (int64_t b = 0; b < G; b++) {
            int phys = (int)(r % 8);
            if (awq)
                for (phys = 0; order[phys] != r % 8;) phys++;
            qz[b * (n / 8) + r / 8] |= (uint32_t)zs[r * G + b] << (4 * phys); /* stored nibble */
        }
    uint16_t *sct = malloc(2 * (size_t)(n * G)); /* [G, N] */
    for (int64_t r = 0; r < n; r++)
        for (int64_t b = 0; b < G; b++) sct[b * n + r] = sc[r * G + b];
    /* what the producer's reader computes: W[r][kk] = s[grp][r] * (q - z), z = stored (+1 & 15 for GPTQ v1) */
    for (int64_t r = 0; r < n; r++)
        for (int64_t j = 0; j < k; j++) {
            const int64_t kk = perm[j], grp = gidx[kk];
            const int zst = zs[r * G + grp], z = !awq && v1 ? (zst + 1) & 15 : zst;
            const float sv = bf16 ? ref_bf16_to_f32(sc[r * G + grp]) : ref_f16_to_f32(sc[r * G + grp]);
            want[r * k + j] = (float)((double)(q[r * k + kk] - z) * sv);
        }
    snprintf(names[0], 96, "%s.qweight", P);
    snprintf(names[1], 96, "%s.qzeros", P);
    snprintf(names[2], 96, "%s.scales", P);
    snprintf(names[3], 96, "%s.g_idx", P);
    const int64_t qshape[2] = {awq ? k : k / 8, awq ? n / 8 : n}, zshape[2] = {G, n / 8}, sshape[2] = {G, n};
    add(s, names[0], NB_ST_I32, 2, qshape, qw, 0, 0);
    add(s, names[1], NB_ST_I32, 2, zshape, qz, 0, 0);
    add(s, names[2], bf16 ? NB_ST_BF16 : NB_ST_F16, 2, sshape, sct, 0, 0);
    if (!awq) add(s, names[3], NB_ST_I32, 1, &k, gidx, 0, 0);
    free(q), free(zs), free(sc), free(gidx), free(perm), free(qw), free(qz), free(sct);
}

static void test_awq_gptq(void) {
    enum { N = 16, K = 256 };
    static char names[16][96];
    float *want[4];
    for (int i = 0; i < 4; i++) want[i] = malloc(sizeof(float) * N * K);
    tset s = {0};
    add_qweight_layer(&s, "model.layers.0.mlp.down_proj", 1, N, K, 64, 0, 0, 0, want[0], &names[0]);
    add_qweight_layer(&s, "model.layers.0.mlp.up_proj", 1, N, K, 128, 0, 0, 1, want[1], &names[4]);
    write_set(&s, "awq", "model.safetensors");
    write_text("awq", "config.json", "{\"quantization_config\": {\"quant_method\": \"awq\", \"bits\": 4, "
                                     "\"group_size\": 64, \"zero_point\": true, \"version\": \"gemm\"}}");
    free_set(&s);
    nb_ckpt *c = open_fixture("awq");
    check_layer(c, "model.layers.0.mlp.down_proj", NB_CKPT_AWQ_INT4, N, K, want[0], 0);
    check_layer(c, "model.layers.0.mlp.up_proj", NB_CKPT_AWQ_INT4, N, K, want[1], 0);
    size_t i;
    nb_ckpt_layer L;
    if (c && nb_ckpt_layer_find(c, "model.layers.0.mlp.up_proj", &i) == NB_OK && nb_ckpt_layer_at(c, i, &L) == NB_OK)
        CHECK(L.config_mismatch, "the config's group 64 against the tensors' 128 is a mismatch: \"%s\"", L.problem);
    nb_ckpt_close(c);

    /* GPTQ v1 (config default), one act-order layer, one with g_idx = k / g */
    add_qweight_layer(&s, "model.layers.0.self_attn.q_proj", 0, N, K, 32, 1, 1, 0, want[2], &names[8]);
    add_qweight_layer(&s, "model.layers.0.self_attn.k_proj", 0, N, K, 128, 0, 1, 0, want[3], &names[12]);
    write_set(&s, "gptq", "model.safetensors");
    write_text("gptq", "config.json", "{\"quantization_config\": {\"quant_method\": \"gptq\", \"bits\": 4, "
                                      "\"group_size\": 32, \"desc_act\": true, \"sym\": false}}");
    free_set(&s);
    c = open_fixture("gptq");
    check_layer(c, "model.layers.0.self_attn.q_proj", NB_CKPT_GPTQ_INT4, N, K, want[2], 1);
    check_layer(c, "model.layers.0.self_attn.k_proj", NB_CKPT_GPTQ_INT4, N, K, want[3], 0);
    if (c && nb_ckpt_layer_find(c, "model.layers.0.self_attn.q_proj", &i) == NB_OK) {
        int32_t perm[K];
        int ok = nb_ckpt_layer_perm(c, i, perm, K) == NB_OK, seen[K] = {0};
        nb_st_tensor gt;
        size_t ti;
        ok = ok && nb_ckpt_tensor_find(c, "model.layers.0.self_attn.q_proj.g_idx", &ti) == NB_OK &&
             nb_ckpt_tensor_at(c, ti, &gt, NULL) == NB_OK;
        for (int j = 0; ok && j < K; j++) {
            int32_t gv;
            memcpy(&gv, (const uint8_t *)gt.data + 4 * perm[j], 4);
            ok = perm[j] >= 0 && perm[j] < K && !seen[perm[j]]++ && gv == j / 32;
        }
        CHECK(ok, "act-order permutation: a permutation putting g_idx in order");
        nb_ckpt_layer_at(c, i, &L);
        CHECK(L.decided_by == NB_CKPT_SRC_CONFIG_JSON && !L.config_mismatch, "gptq decided by config.json");
    }
    nb_ckpt_close(c);

    /* GPTQ v2: zero points stored as they are */
    add_qweight_layer(&s, "model.layers.1.mlp.gate_proj", 0, N, K, 64, 0, 0, 1, want[0], &names[0]);
    write_set(&s, "gptq_v2", "model.safetensors");
    write_text("gptq_v2", "config.json", "{\"quantization_config\": {\"quant_method\": \"gptq\", \"bits\": 4, "
                                         "\"group_size\": 64, \"checkpoint_format\": \"gptq_v2\"}}");
    free_set(&s);
    c = open_fixture("gptq_v2");
    check_layer(c, "model.layers.1.mlp.gate_proj", NB_CKPT_GPTQ_INT4, N, K, want[0], 0);
    nb_ckpt_close(c);

    /* inconsistent: 3 bits declared (GPTQ), 8 bits declared (AWQ: 4-bit only); qzeros of the wrong shape; a
     * g_idx with an uneven group */
    static const struct { int awq; const char *dir, *config, *why; } bits[2] = {
        {0, "gptq_bits", "{\"quantization_config\": {\"quant_method\": \"gptq\", \"bits\": 3}}",
         "the config says 3 bits; nibble reads 4- and 8-bit GPTQ"},
        {1, "awq_bits", "{\"quantization_config\": {\"quant_method\": \"awq\", \"bits\": 8}}",
         "the config says 8 bits; nibble reads 4-bit AWQ"}};
    for (int j = 0; j < 2; j++) {
        add_qweight_layer(&s, "a", bits[j].awq, N, K, 64, 0, !bits[j].awq, 0, want[0], &names[0]);
        write_set(&s, bits[j].dir, "model.safetensors");
        write_text(bits[j].dir, "config.json", bits[j].config);
        free_set(&s);
        c = open_fixture(bits[j].dir);
        check_bad(c, "a", bits[j].why);
        nb_ckpt_close(c);
    }
    add_qweight_layer(&s, "b", 1, N, K, 64, 0, 0, 0, want[0], &names[0]);
    s.t[1].shape[0] = 2, s.t[1].shape[1] = 4, s.t[1].bytes = 32; /* qzeros [2, 4], want [4, 2] */
    add_qweight_layer(&s, "c", 0, N, K, 64, 0, 1, 0, want[0], &names[4]);
    ((int32_t *)s.own[6])[5] = 3; /* column 5 moves to group 3: 65 columns there */
    write_set(&s, "qweight_bad", "model.safetensors");
    free_set(&s);
    c = open_fixture("qweight_bad");
    check_bad(c, "b", "qzeros is [2, 4]");
    check_bad(c, "c", "more than 64 columns in group 3");
    nb_ckpt_close(c);
    for (int j = 0; j < 4; j++) free(want[j]);
}

/* ------------------------------------------------------------ GPTQ 8-bit */

/* One symmetric 8-bit GPTQ layer P of n x k with groups of g (g = k: per
 * channel, one scale row): qweight I32 [k/4, n] (unsigned code u of channel
 * kk at bits 8(kk%4) of word kk/4), qzeros I32 [k/g, n/4] (column r at bits
 * 8(r%4)), scales F16 [k/g, n], g_idx I32 [k].  Every zero point is 128,
 * stored as 127 (v1) or 128 (v2); asym puts zero point 100 at group 1,
 * column 5.  want: GPTQ's (u - z) * s in the column order v2 returns. */
static void add_gptq8_layer(tset *s, const char *P, int64_t n, int64_t k, int64_t g, int act_order, int v2, int asym,
                            float *want, char names[][96]) {
    const int64_t G = k / g;
    uint8_t *u = malloc((size_t)(n * k)), *zs = malloc((size_t)(n * G));
    uint16_t *sc = malloc(2 * (size_t)(n * G));
    int32_t *gidx = malloc(4 * (size_t)k), *perm = malloc(4 * (size_t)k);
    for (int64_t i = 0; i < n * k; i++) u[i] = (uint8_t)(rnd_u64() & 255); /* [n, k] */
    for (int64_t i = 0; i < n * G; i++) zs[i] = 128, sc[i] = rnd_scale16(0); /* [G, n] */
    if (asym) zs[1 * n + 5] = 100;
    act_order_gidx(k, g, act_order, gidx, perm);
    uint32_t *qw = words((size_t)(n * k / 4)), *qz = words((size_t)(n * G / 4));
    for (int64_t r = 0; r < n; r++)
        for (int64_t kk = 0; kk < k; kk++) qw[(kk / 4) * n + r] |= (uint32_t)u[r * k + kk] << (8 * (kk % 4));
    for (int64_t b = 0; b < G; b++)
        for (int64_t r = 0; r < n; r++)
            qz[b * (n / 4) + r / 4] |= (uint32_t)((zs[b * n + r] - (v2 ? 0 : 1)) & 255) << (8 * (r % 4));
    for (int64_t r = 0; r < n; r++)
        for (int64_t j = 0; j < k; j++) {
            const int64_t kk = perm[j], b = gidx[kk];
            want[r * k + j] = (float)((double)(u[r * k + kk] - zs[b * n + r]) * ref_f16_to_f32(sc[b * n + r]));
        }
    const char *suffix[4] = {"qweight", "qzeros", "scales", "g_idx"};
    for (int i = 0; i < 4; i++) snprintf(names[i], 96, "%s.%s", P, suffix[i]);
    const int64_t qshape[2] = {k / 4, n}, zshape[2] = {G, n / 4}, sshape[2] = {G, n};
    add(s, names[0], NB_ST_I32, 2, qshape, qw, 0, 0);
    add(s, names[1], NB_ST_I32, 2, zshape, qz, 0, 0);
    add(s, names[2], NB_ST_F16, 2, sshape, sc, 0, 0);
    add(s, names[3], NB_ST_I32, 1, &k, gidx, 0, 0);
    free(u), free(zs), free(sc), free(gidx), free(perm), free(qw), free(qz);
}

static uint32_t tensor_word(nb_ckpt *c, const char *P, const char *member, int64_t i) {
    char name[128];
    size_t ti;
    nb_st_tensor t;
    uint32_t w = 0;
    snprintf(name, sizeof name, "%s.%s", P, member);
    if (nb_ckpt_tensor_find(c, name, &ti) == NB_OK && nb_ckpt_tensor_at(c, ti, &t, NULL) == NB_OK)
        memcpy(&w, (const uint8_t *)t.data + 4 * i, 4);
    return w;
}

/* Layer P of gptq-int8, v1 or v2, read by v2 as int8: the codes and scales
 * equal what this function unpacks from the checkpoint's own tensors
 * (code = u - z as a two's-complement byte, columns in the g_idx order),
 * no zero points; then the dequantized values (check_layer). */
static void check_gptq8(nb_ckpt *c, const char *P, int64_t n, int64_t k, int64_t g, int v2, const float *want,
                        int permuted) {
    check_layer(c, P, NB_CKPT_GPTQ_INT8, n, k, want, permuted);
    size_t i;
    nb_ckpt_layer L;
    const char *name = "";
    nb_format f = (nb_format)0;
    nb_weight_desc d;
    nb_weight_sizes_v2 sz;
    if (!c || nb_ckpt_layer_find(c, P, &i) != NB_OK || nb_ckpt_layer_at(c, i, &L) != NB_OK ||
        L.format != NB_CKPT_GPTQ_INT8 || nb_ckpt_layer_weight_v2(c, i, 0, &d, NULL, NULL) != NB_OK ||
        nb_weight_get_sizes_v2(&d, &sz) != NB_OK)
        return; /* (check_layer said why) */
    CHECK(nb_ckpt_format_name(L.format, &name) == NB_OK && !strcmp(name, "gptq-int8") &&
              nb_ckpt_format_weight(L.format, &f) == NB_OK && f == NB_FORMAT_INT8,
          "%s: layout \"%s\" holds format %d, want gptq-int8 holding int8", P, name, (int)f);
    CHECK(d.format == NB_FORMAT_INT8 && d.group_size == g && d.scale_type == NB_SCALE_F16 && sz.zeros_bytes == 0 &&
              sz.codes_bytes == (size_t)(n * k) && sz.scales_bytes == (size_t)(2 * n * (k / g)),
          "%s: desc format %d group %d scale type %d, %zu zero bytes", P, (int)d.format, (int)d.group_size,
          (int)d.scale_type, sz.zeros_bytes);
    uint8_t *codes = malloc(sz.codes_bytes), *scales = malloc(sz.scales_bytes);
    int32_t *gidx = malloc(4 * (size_t)k), *perm = malloc(4 * (size_t)k);
    nb_weight_buffers b = {.codes = codes, .scales = scales};
    nb_status st = nb_ckpt_layer_weight_v2(c, i, 0, &d, &b, &sz);
    CHECK(st == NB_OK, "%s: read: %s", P, nb_last_error());
    for (int64_t kk = 0; kk < k; kk++) gidx[kk] = (int32_t)tensor_word(c, P, "g_idx", kk);
    stable_order(gidx, k, g, perm);
    int64_t bad = 0;
    for (int64_t r = 0; st == NB_OK && r < n; r++) {
        for (int64_t j = 0; j < k; j++) {
            const int64_t kk = perm[j], grp = gidx[kk];
            const unsigned q = (tensor_word(c, P, "qweight", (kk / 4) * n + r) >> (8 * (kk % 4))) & 255;
            const unsigned zst = (tensor_word(c, P, "qzeros", grp * (n / 4) + r / 4) >> (8 * (r % 4))) & 255;
            const unsigned z = v2 ? zst : (zst + 1) & 255;
            const int8_t want_code = (int8_t)(int)(q - z), got = (int8_t)codes[r * k + j];
            if (got != want_code && !bad++)
                CHECK(0, "%s: code [%lld, %lld] = %d, want %u - %u", P, (long long)r, (long long)j, got, q, z);
        }
        for (int64_t grp = 0; grp < k / g; grp++) {
            const int64_t e = grp * n + r, o = 2 * (r * (k / g) + grp); /* F16 [G, N], two per word; ours [N, G] */
            const uint16_t want_s = (uint16_t)(tensor_word(c, P, "scales", e / 2) >> (16 * (e % 2)));
            const uint16_t got = (uint16_t)(scales[o] | scales[o + 1] << 8);
            if (got != want_s && !bad++)
                CHECK(0, "%s: scale [%lld, %lld] = %#x, want %#x", P, (long long)r, (long long)grp, got, want_s);
        }
    }
    CHECK(bad == 0, "%s: %lld codes or scales differ from the checkpoint's", P, (long long)bad);
    free(codes), free(scales), free(gidx), free(perm);
}

static void test_gptq_int8(void) {
    enum { N = 16, K = 512 };
    static char names[16][96];
    float *want[4];
    for (int i = 0; i < 4; i++) want[i] = malloc(sizeof(float) * N * K);
    tset s = {0};
    /* v1 (the config's default): act-order, and g_idx = k / g */
    add_gptq8_layer(&s, "model.layers.0.mlp.down_proj", N, K, 128, 1, 0, 0, want[0], &names[0]);
    add_gptq8_layer(&s, "model.layers.0.mlp.up_proj", N, K, 128, 0, 0, 0, want[1], &names[4]);
    write_set(&s, "gptq8", "model.safetensors");
    write_text("gptq8", "config.json", "{\"quantization_config\": {\"quant_method\": \"gptq\", \"bits\": 8, "
                                       "\"group_size\": 128, \"desc_act\": true, \"sym\": true}}");
    free_set(&s);
    nb_ckpt *c = open_fixture("gptq8");
    check_gptq8(c, "model.layers.0.mlp.down_proj", N, K, 128, 0, want[0], 1);
    check_gptq8(c, "model.layers.0.mlp.up_proj", N, K, 128, 0, want[1], 0);
    nb_ckpt_config cfg;
    size_t i;
    nb_ckpt_layer L;
    CHECK(c && nb_ckpt_get_config(c, &cfg) == NB_OK && cfg.declared == NB_CKPT_GPTQ_INT8, "bits 8 declares gptq-int8");
    if (c && nb_ckpt_layer_find(c, "model.layers.0.mlp.up_proj", &i) == NB_OK && nb_ckpt_layer_at(c, i, &L) == NB_OK)
        CHECK(L.decided_by == NB_CKPT_SRC_CONFIG_JSON && !L.config_mismatch, "gptq-int8 decided by config.json (%s)",
              L.problem);
    nb_ckpt_close(c);

    /* v2: zero points stored as they are; per channel (G = 1); a layer stored as v1 is asymmetric under v2 */
    add_gptq8_layer(&s, "l.chan", N, K, K, 0, 1, 0, want[2], &names[0]);
    add_gptq8_layer(&s, "l.v1", N, K, 128, 0, 0, 0, want[3], &names[4]);
    write_set(&s, "gptq8_v2", "model.safetensors");
    write_text("gptq8_v2", "config.json", "{\"quantization_config\": {\"quant_method\": \"gptq\", \"bits\": 8, "
               "\"group_size\": -1, \"sym\": true, \"checkpoint_format\": \"gptq_v2\"}}");
    free_set(&s);
    c = open_fixture("gptq8_v2");
    check_gptq8(c, "l.chan", N, K, K, 1, want[2], 0);
    check_bad(c, "l.v1", "asymmetric 8-bit GPTQ (zero point 127 at group 0, column 0): no format holds 8-bit codes "
              "with zero points");
    nb_ckpt_close(c);

    /* asymmetric (v1); a group int8 does not take; qzeros at 4 bits per zero point */
    add_gptq8_layer(&s, "x.asym", N, K, 128, 1, 0, 1, want[0], &names[0]);
    add_gptq8_layer(&s, "x.group", N, K, 16, 0, 0, 0, want[1], &names[4]);
    add_gptq8_layer(&s, "x.zeros", N, K, 128, 0, 0, 0, want[2], &names[8]);
    s.t[s.n - 3].shape[1] = N / 8, s.t[s.n - 3].bytes /= 2; /* qzeros [4, 2], want [4, 4] */
    write_set(&s, "gptq8_bad", "model.safetensors");
    write_text("gptq8_bad", "config.json", "{\"quantization_config\": {\"quant_method\": \"gptq\", \"bits\": 8}}");
    free_set(&s);
    c = open_fixture("gptq8_bad");
    check_bad(c, "x.asym", "asymmetric 8-bit GPTQ (zero point 100 at group 1, column 5)");
    check_bad(c, "x.group", "group 16 (K = 512) is not one int8 takes");
    check_bad(c, "x.zeros", "qzeros is [4, 2], want [4, 4] ([K/G, N/4])");
    nb_ckpt_close(c);
    for (int j = 0; j < 4; j++) free(want[j]);
}

/* ------------------------------------------------------------ compressed-tensors */

/* bits 4 or 8; asym: with zero points; g = k: per channel; act: g_idx. */
static void add_ct_layer(tset *s, const char *P, int bits, int asym, int64_t n, int64_t k, int64_t g, int act,
                         float *want, char names[][96]) {
    const int64_t G = k / g, per = 32 / bits, off = 1 << (bits - 1);
    int8_t *q = malloc((size_t)(n * k)), *zp = malloc((size_t)(n * G));
    uint16_t *sc = malloc(2 * (size_t)(n * G));
    int32_t *gidx = malloc(4 * (size_t)k), *perm = malloc(4 * (size_t)k);
    for (int64_t i = 0; i < n * k; i++) q[i] = (int8_t)((int64_t)(rnd_u64() % (uint64_t)(2 * off)) - off);
    for (int64_t i = 0; i < n * G; i++) zp[i] = asym ? (int8_t)((int)(rnd_u64() % 16) - 8) : 0, sc[i] = rnd_scale16(1);
    act_order_gidx(k, g, act, gidx, perm);
    uint32_t *wp = words((size_t)(n * k / per)), *wz = words((size_t)((n + 7) / 8 * G));
    for (int64_t r = 0; r < n; r++)
        for (int64_t kk = 0; kk < k; kk++)
            wp[r * (k / per) + kk / per] |= (uint32_t)(q[r * k + kk] + off) << (bits * (kk % per));
    for (int64_t r = 0; r < n; r++)
        for (int64_t b = 0; b < G; b++) wz[(r / 8) * G + b] |= (uint32_t)(zp[r * G + b] + 8) << (4 * (r % 8));
    /* compressed-tensors' dequantize: (x_q - zero_point) * scale in the scale's dtype (BF16 here): exact in
     * float, then one rounding */
    for (int64_t r = 0; r < n; r++)
        for (int64_t j = 0; j < k; j++) {
            const int64_t kk = perm[j], grp = gidx[kk];
            want[r * k + j] = (float)((double)(q[r * k + kk] - zp[r * G + grp]) * ref_bf16_to_f32(sc[r * G + grp]));
        }
    const char *suffix[5] = {"weight_packed", "weight_scale", "weight_shape", "weight_zero_point", "weight_g_idx"};
    for (int i = 0; i < 5; i++) snprintf(names[i], 96, "%s.%s", P, suffix[i]);
    const int64_t pshape[2] = {n, k / per}, sshape[2] = {n, G}, two = 2, zshape[2] = {(n + 7) / 8, G};
    const int64_t wshape[2] = {n, k};
    add(s, names[0], NB_ST_I32, 2, pshape, wp, 0, 0);
    add(s, names[1], NB_ST_BF16, 2, sshape, sc, 0, 0);
    add(s, names[2], NB_ST_I64, 1, &two, wshape, 0, 0);
    if (asym) add(s, names[3], NB_ST_I32, 2, zshape, wz, 0, 0);
    if (act) add(s, names[4], NB_ST_I32, 1, &k, gidx, 0, 0);
    free(q), free(zp), free(sc), free(gidx), free(perm), free(wp), free(wz);
}

static void test_ct(void) {
    enum { N = 24, K = 256 };
    static char names[32][96];
    float *want[6];
    for (int i = 0; i < 6; i++) want[i] = malloc(sizeof(float) * N * K);
    tset s = {0};
    add_ct_layer(&s, "l.asym", 4, 1, N, K, 128, 0, want[0], &names[0]);
    add_ct_layer(&s, "l.sym", 4, 0, N, K, 32, 0, want[1], &names[5]);
    add_ct_layer(&s, "l.int8", 8, 0, N, K, K, 0, want[2], &names[10]); /* per channel: weight_scale [N, 1] */
    add_ct_layer(&s, "l.act", 4, 1, N, K, 64, 1, want[3], &names[15]);
    add_ct_layer(&s, "l.int8g", 8, 0, N, K, 64, 0, want[4], &names[20]);
    write_set(&s, "ct_int", "model.safetensors");
    write_text("ct_int", "config.json", "{\"quantization_config\": {\"quant_method\": \"compressed-tensors\", "
               "\"format\": \"pack-quantized\", \"config_groups\": {\"group_0\": {\"targets\": [\"Linear\"], "
               "\"weights\": {\"num_bits\": 4, \"type\": \"int\", \"symmetric\": false, \"strategy\": \"group\", "
               "\"group_size\": 128}}}}}");
    free_set(&s);
    nb_ckpt *c = open_fixture("ct_int");
    check_layer(c, "l.asym", NB_CKPT_CT_INT4, N, K, want[0], 0);
    check_layer(c, "l.sym", NB_CKPT_CT_INT4_SYM, N, K, want[1], 0);
    check_layer(c, "l.int8", NB_CKPT_CT_INT8, N, K, want[2], 0);
    check_layer(c, "l.act", NB_CKPT_CT_INT4, N, K, want[3], 1);
    nb_ckpt_close(c);
    /* the 8-bit layer in a file of its own: bits from the shapes, no config */
    add_ct_layer(&s, "l.int8g", 8, 0, N, K, 64, 0, want[4], &names[20]);
    add_ct_layer(&s, "l.missing", 4, 0, N, K, 64, 0, want[5], &names[25]);
    s.t[s.n - 1].name = "l.missing.weight_shap"; /* weight_shape is not there */
    write_set(&s, "ct_int8", "model.safetensors");
    free_set(&s);
    c = open_fixture("ct_int8");
    check_layer(c, "l.int8g", NB_CKPT_CT_INT8, N, K, want[4], 0);
    check_bad(c, "l.missing", "weight_shape is missing");
    nb_ckpt_close(c);
    for (int j = 0; j < 6; j++) free(want[j]);
}

/* ------------------------------------------------------------ bitsandbytes */

static void add_bnb_layer(tset *s, const char *P, int fp4, int64_t n, int64_t k, int B, int nested, float *want,
                          char names[][96], char *json) {
    const int64_t ne = n * k, nb = (ne + B - 1) / B, NBL = 256, nnb = (nb + NBL - 1) / NBL; /* bitsandbytes: ceil */
    uint8_t *c = malloc((size_t)ne), *w = malloc((size_t)(ne / 2)), *a8 = malloc((size_t)nb);
    float *absmax = malloc(4 * (size_t)nb), nabs[64], nmap[256], qmap[16];
    const float offset = 0.0123456789f;
    for (int64_t i = 0; i < ne; i++) c[i] = (uint8_t)(rnd_u64() & 15);
    for (int64_t b = 0; b < ne / 2; b++) w[b] = (uint8_t)(c[2 * b] << 4 | c[2 * b + 1]); /* first in the high nibble */
    for (int i = 0; i < 16; i++) qmap[i] = table(fp4, i);
    for (int i = 0; i < 256; i++) nmap[i] = (float)(rnd_unit() * 2 - 1);
    for (int64_t i = 0; i < nnb; i++) nabs[i] = (float)(rnd_unit() * 0.01 + 1e-3);
    for (int64_t i = 0; i < nb; i++) {
        a8[i] = (uint8_t)(rnd_u64() & 255);
        absmax[i] = nested ? (nmap[a8[i]] * nabs[i / NBL]) + offset : (float)(rnd_unit() * 2);
    }
    if (nested) absmax[0] = (nmap[a8[0]] * nabs[0]) + offset; /* (the same float32 expression) */
    for (int64_t i = 0; i < ne; i++) want[i] = (float)((double)table(fp4, c[i]) * absmax[i / B]);
    const char *qt = fp4 ? "fp4" : "nf4";
    snprintf(names[0], 96, "%s.weight", P);
    snprintf(names[1], 96, "%s.weight.absmax", P);
    snprintf(names[2], 96, "%s.weight.quant_map", P);
    snprintf(names[3], 96, "%s.weight.quant_state.bitsandbytes__%s", P, qt);
    snprintf(names[4], 96, "%s.weight.nested_absmax", P);
    snprintf(names[5], 96, "%s.weight.nested_quant_map", P);
    if (nested)
        snprintf(json, 400, "{\"quant_type\": \"%s\", \"blocksize\": %d, \"dtype\": \"bfloat16\", \"shape\": [%lld, "
                 "%lld], \"nested_blocksize\": 256, \"nested_dtype\": \"float32\", \"nested_offset\": %.9g}", qt, B,
                 (long long)n, (long long)k, (double)offset);
    else
        snprintf(json, 400, "{\"quant_type\": \"%s\", \"blocksize\": %d, \"dtype\": \"bfloat16\", \"shape\": [%lld, "
                 "%lld]}", qt, B, (long long)n, (long long)k);
    const int64_t wshape[2] = {ne / 2, 1}, sixteen = 16, jl = (int64_t)strlen(json), n256 = 256;
    add(s, names[0], NB_ST_U8, 2, wshape, w, 0, 0);
    if (nested) {
        add(s, names[1], NB_ST_U8, 1, &nb, a8, 0, 0);
        add(s, names[4], NB_ST_F32, 1, &nnb, nabs, 0, 0);
        add(s, names[5], NB_ST_F32, 1, &n256, nmap, 0, 0);
    } else {
        add(s, names[1], NB_ST_F32, 1, &nb, absmax, 0, 0);
    }
    add(s, names[2], NB_ST_F32, 1, &sixteen, qmap, 0, 0);
    add(s, names[3], NB_ST_U8, 1, &jl, json, 0, 0);
    free(c), free(w), free(a8), free(absmax);
}

static void test_bnb(void) {
    enum { N = 12, K = 256 };
    static char names[32][96], json[5][400];
    float *want[5];
    for (int i = 0; i < 5; i++) want[i] = malloc(sizeof(float) * N * K);
    tset s = {0};
    add_bnb_layer(&s, "m.nf4", 0, N, K, 64, 0, want[0], &names[0], json[0]);
    add_bnb_layer(&s, "m.nf4n", 0, N, K, 64, 1, want[1], &names[6], json[1]);
    add_bnb_layer(&s, "m.fp4", 1, N, K, 128, 1, want[2], &names[12], json[2]);
    write_set(&s, "bnb", "model.safetensors");
    write_text("bnb", "config.json", "{\"quantization_config\": {\"quant_method\": \"bitsandbytes\", "
               "\"load_in_4bit\": true, \"bnb_4bit_quant_type\": \"nf4\", \"bnb_4bit_use_double_quant\": true}}");
    free_set(&s);
    nb_ckpt *c = open_fixture("bnb");
    check_layer(c, "m.nf4", NB_CKPT_BNB_NF4, N, K, want[0], 0);
    check_layer(c, "m.nf4n", NB_CKPT_BNB_NF4, N, K, want[1], 0);
    check_layer(c, "m.fp4", NB_CKPT_BNB_FP4, N, K, want[2], 0);
    size_t i;
    nb_ckpt_layer L;
    if (c && nb_ckpt_layer_find(c, "m.fp4", &i) == NB_OK && nb_ckpt_layer_at(c, i, &L) == NB_OK)
        CHECK(L.config_mismatch && strstr(L.problem, "bnb-nf4"), "fp4 under an nf4 config: \"%s\"", L.problem);
    nb_ckpt_close(c);
    /* inconsistent: a quant_map that is not the table, blocks that do not divide K, not JSON */
    add_bnb_layer(&s, "x.map", 0, N, K, 64, 0, want[3], &names[0], json[3]);
    ((float *)s.own[2])[3] += 1e-6f;
    add_bnb_layer(&s, "x.block", 0, 3, 96, 64, 0, want[4], &names[6], json[4]); /* 64 does not divide K = 96 */
    add_bnb_layer(&s, "x.json", 0, N, K, 64, 0, want[4], &names[12], json[0]);
    ((uint8_t *)s.own[s.n - 1])[0] = '[';
    add_bnb_layer(&s, "x.huge", 0, N, K, 64, 0, want[4], &names[18], json[0]);
    static const char huge[] = "{\"quant_type\": \"nf4\", \"blocksize\": 64, \"shape\": [1e10, 1e10]}";
    s.t[s.n - 1].data = huge, s.t[s.n - 1].bytes = strlen(huge), s.t[s.n - 1].shape[0] = (int64_t)strlen(huge);
    write_set(&s, "bnb_bad", "model.safetensors");
    free_set(&s);
    c = open_fixture("bnb_bad");
    check_bad(c, "x.map", "quant_map[3]");
    check_bad(c, "x.block", "blocksize 64");
    check_bad(c, "x.json", "not a JSON object");
    check_bad(c, "x.huge", "shape [0, 0] does not fit"); /* dimensions past 2^31 are not read */
    nb_ckpt_close(c);
    for (int j = 0; j < 5; j++) free(want[j]);
}

/* ------------------------------------------------------------ HQQ */

/* v rounded to F16 (bf16 = 0) or BF16 and back, in double (testlib's RNE). */
static double r16d(int bf16, double v) {
    if (isnan(v) || isinf(v) || v == 0.0) return v;
    const double m = round_mag(fabs(v), bf16 ? 7 : 10, bf16 ? -126 : -14);
    const double big = bf16 ? ldexp(255.0 / 128.0, 127) : 65504.0;
    return (m > big ? INFINITY : m) * (v < 0 ? -1 : 1);
}

/* An HQQ layer as transformers saves hqq's state_dict (docs/formats.md 5.5):
 * W_q [N K / 2G, G] (high nibbles: rows 0 .. N K / 2G - 1 of the [N K / G,
 * G] view; low: the rest), scale and zero [N K / G, 1], the meta tensors;
 * want[] the values r(r(q - z) s).  The names live in names[0..19]. */
static void add_hqq_layer(tset *s, const char *P, int bf16, int64_t n, int64_t k, int64_t g, float *want,
                          char (*names)[96]) {
    const int64_t rows = n * k / g;
    uint8_t *q = rnd_bytes((size_t)(n * k), 0, 15), *wq = calloc((size_t)(n * k / 2), 1);
    uint16_t *sc = malloc(2 * (size_t)rows), *zp = malloc(2 * (size_t)rows);
    for (int64_t r = 0; r < rows; r++) {
        sc[r] = bf16 ? ref_bf16((float)(0.001 + 0.02 * rnd_unit())) : ref_f16((float)(0.001 + 0.02 * rnd_unit()));
        const float z = (float)(16.0 * rnd_unit() - 0.5);
        zp[r] = bf16 ? ref_bf16(z) : ref_f16(z);
    }
    for (int64_t i = 0; i < n * k; i++) {
        const int64_t half = n * k / 2;
        wq[i < half ? i : i - half] |= (uint8_t)(i < half ? q[i] << 4 : q[i]);
        const double sv = bf16 ? ref_bf16_to_f32(sc[i / g]) : ref_f16_to_f32(sc[i / g]);
        const double zv = bf16 ? ref_bf16_to_f32(zp[i / g]) : ref_f16_to_f32(zp[i / g]);
        want[i] = (float)r16d(bf16, r16d(bf16, q[i] - zv) * sv);
    }
    static const char *const meta[] = {"W_q", "scale", "zero", "nbits", "group_size", "shape", "axis", "packing",
                                       "view_as_float", "quant_scale", "quant_zero", "channel_wise", "optimize",
                                       "round_zero", "compute_dtype", "encoded_state_dict"};
    for (int i = 0; i < 16; i++) snprintf(names[i], 96, "%s.%s", P, meta[i]);
    const int64_t wsh[2] = {rows / 2, g}, ssh[2] = {rows, 1}, two[1] = {2}, pk[1] = {7}, cd[1] = {13};
    const int32_t nbits = 4, gs = (int32_t)g, axis = 1;
    const int64_t shape[2] = {n, k};
    const uint8_t zero = 0, one = 1;
    add(s, names[0], NB_ST_U8, 2, wsh, wq, 0, 0);
    add(s, names[1], bf16 ? NB_ST_BF16 : NB_ST_F16, 2, ssh, sc, 0, 0);
    add(s, names[2], bf16 ? NB_ST_BF16 : NB_ST_F16, 2, ssh, zp, 0, 0);
    add(s, names[3], NB_ST_I32, 0, NULL, &nbits, 0, 0);
    add(s, names[4], NB_ST_I32, 0, NULL, &gs, 0, 0);
    add(s, names[5], NB_ST_I64, 1, two, shape, 0, 0);
    add(s, names[6], NB_ST_I32, 0, NULL, &axis, 0, 0);
    add(s, names[7], NB_ST_U8, 1, pk, "4bit_u8", 0, 0);
    for (int i = 8; i <= 13; i++) add(s, names[i], NB_ST_U8, 0, NULL, i == 11 ? &one : &zero, 0, 0);
    add(s, names[14], NB_ST_U8, 1, cd, bf16 ? "torch.bfloat16" : "torch.float16", 0, 0);
    add(s, names[15], NB_ST_U8, 0, NULL, &one, 0, 0);
    free(q), free(wq), free(sc), free(zp);
}

static void test_hqq(void) {
    enum { N = 12, K = 256 };
    static char names[8][16][96];
    float *want[8];
    for (int i = 0; i < 8; i++) want[i] = malloc(sizeof(float) * N * K);
    tset s = {0};
    add_hqq_layer(&s, "m.h16", 0, N, K, 64, want[0], names[0]);
    add_hqq_layer(&s, "m.hb16", 1, N, K, 32, want[1], names[1]);
    add_hqq_layer(&s, "m.hrow", 0, N, K, K, want[2], names[2]); /* one group per row */
    write_set(&s, "hqq", "model.safetensors");
    write_text("hqq", "config.json", "{\"quantization_config\": {\"quant_method\": \"hqq\"}}");
    free_set(&s);
    nb_ckpt *c = open_fixture("hqq");
    check_layer(c, "m.h16", NB_CKPT_HQQ_INT4, N, K, want[0], 0);
    check_layer(c, "m.hb16", NB_CKPT_HQQ_INT4, N, K, want[1], 0);
    check_layer(c, "m.hrow", NB_CKPT_HQQ_INT4, N, K, want[2], 0);
    nb_ckpt_close(c);
    /* inconsistent: groups along axis 0, 2 bits, quantized zero points, a W_q of the wrong shape, scale and
     * zero of different types, a group that is not one int4_hqq takes, no zero */
    add_hqq_layer(&s, "x.axis", 0, N, K, 64, want[3], names[3]);
    ((int32_t *)s.own[s.n - 10])[0] = 0; /* axis */
    add_hqq_layer(&s, "x.bits", 0, N, K, 64, want[3], names[4]);
    ((int32_t *)s.own[s.n - 13])[0] = 2; /* nbits */
    add_hqq_layer(&s, "x.qz", 0, N, K, 64, want[3], names[5]);
    ((uint8_t *)s.own[s.n - 6])[0] = 1; /* quant_zero */
    add_hqq_layer(&s, "x.wq", 0, N, K, 64, want[3], names[6]);
    s.t[s.n - 16].shape[0] = N * K / 64 / 4, s.t[s.n - 16].shape[1] = 128, s.t[s.n - 16].bytes = N * K / 2;
    add_hqq_layer(&s, "x.mix", 0, N, K, 64, want[3], names[7]);
    s.t[s.n - 14].dtype = NB_ST_BF16; /* zero BF16 next to an F16 scale */
    write_set(&s, "hqq_bad", "model.safetensors");
    free_set(&s);
    c = open_fixture("hqq_bad");
    check_bad(c, "x.axis", "axis 0");
    check_bad(c, "x.bits", "nbits 2");
    check_bad(c, "x.qz", "quant_zero");
    check_bad(c, "x.wq", "W_q is U8 rank 2");
    check_bad(c, "x.mix", "both F16 or both BF16");
    nb_ckpt_close(c);
    for (int j = 0; j < 8; j++) free(want[j]);
}

int main(int argc, char **argv) {
    setvbuf(stdout, NULL, _IONBF, 0);
    int keep = fixture_dir_open(argc, argv, "nibble_ckpt_int");
    if (keep < 0) return 1;
    test_awq_gptq();
    test_gptq_int8();
    test_ct();
    test_bnb();
    test_hqq();
    return fixture_dir_close(keep);
}
