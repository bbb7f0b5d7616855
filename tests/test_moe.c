/* test_moe.c - the mixture-of-experts host reference (nibble.h, "mixture of
 * experts"), against implementations written here from the header's words:
 *
 *   1. nb_moe_mlp_host_f64 against a double MoE computed token by token from
 *      the checkpoint bytes (decoded by testlib's codecs, not src/):
 *      |err| <= the bound of part 3 with the unit 2^-52 (both sides' double
 *      rounding), no act_dtype rounding.
 *   2. nb_moe_mlp_host against a float MoE written from the header's
 *      ARITHMETIC paragraph (token-major, slots in top-k order, h and o_s
 *      rounded to act_dtype, one float combine): bit for bit.
 *   3. nb_moe_mlp_host against nb_moe_mlp_host_f64 within this bound, per
 *      output element (u = 2^-24; all magnitudes from the double values):
 *        gate_up row r:  d_r = 2 H u S_r,  S_r = sum_j |x_j W_rj| + |b_r|
 *        h_i = f(g, v):  D = 1.1 (|v| + dv) dg + (|g| + dg) dv       (swiglu)
 *                        D = 1.1 (min(|v| + dv, L) + 1) dg + (|g| + dg) dv  (gpt-oss)
 *                        (|silu'| <= 1.1; |silu(g)| <= |g|; the clamps are
 *                        1-Lipschitz), then + (16 + 2 (alpha + 1) |g|) u
 *                        (|h| + D) for evaluating f in float (the host's
 *                        expf and division, alpha * g rounded; the GPU's
 *                        ex2.approx of x log2(e), its product rounded too,
 *                        and approximate reciprocal: a few ulps each),
 *                        + half an ulp of act_dtype at |h| + D;
 *        o_c:            do = sum_j |Wd_cj| dh_j + 2 I u (sum_j (|h_j| + dh_j)
 *                        |Wd_cj| + |b_c|) + half an ulp of act_dtype;
 *        y = sum_s w_s o_s:  sum_s |w_s| do_s + 2 top_k u sum_s |w_s| (|o_s| +
 *                        do_s) + half an ulp of act_dtype (F32: no act_dtype
 *                        rounding anywhere), + 1e-30.
 *      That is the classic bound of a float dot product, doubled as in
 *      test_gemm_ref, carried through the activation by its Lipschitz
 *      constants, plus each rounding the header specifies.
 *   4. The combine runs in top-k order, not expert order: outputs chosen so
 *      that the two orders round differently.
 *   5. nb_moe_align_host against the layout built here from the header's
 *      words (every entry of every buffer; capacity past the sizes untouched),
 *      and a grouped GEMM simulated from that layout (blocks, sentinels,
 *      -1 blocks skipped) reproduces nb_moe_mlp_host bit for bit.
 *   6. A NaN scale byte of one expert makes NaN exactly the outputs of the
 *      tokens routed to it.
 *   7. nb_moe_pack_host (below main's sweep).
 *   8. nb_glu_host (dense gated activations): every element bit for bit the
 *      header's float formula written here, within part 3's activation term
 *      of the double value; NaN gate or up values give NaN through the
 *      clamps; the descriptor's defaults and refusals.
 * Sweep: E = 8, 16, 32, 64, 128; top_k 1..8; m = 1..17, 31, 64, 100, 257;
 * routings uniform, skewed (three quarters of the experts get no token) and
 * all on the same experts; NVFP4 (a tensor scale per expert), MXFP4 and int4
 * (zero points); SwiGLU concatenated and gpt-oss interleaved, with and
 * without biases; F32, F16 and BF16 activations.
 *
 *   test_moe              run the checks
 *   test_moe --dump DIR   also write cases for tests/moe_crosscheck.py
 *
 * Output: one line per failed check (the worst element and both values),
 * then "N passed, M failed". */
#define _POSIX_C_SOURCE 200809L
#include <nibble.h>

#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#define TESTLIB_SEED 0x13198A2E03707344ull
#include "testlib.h"

/* ------------------------------------------------------------ helpers */

static const char *dname(nb_dtype t) { return t == NB_DTYPE_F32 ? "f32" : t == NB_DTYPE_F16 ? "f16" : "bf16"; }
static const char *fname(nb_format f) {
    return f == NB_FORMAT_NVFP4 ? "nvfp4" : f == NB_FORMAT_MXFP4 ? "mxfp4" : f == NB_FORMAT_INT4 ? "int4" : "?";
}
static size_t dsize(nb_dtype t) { return t == NB_DTYPE_F32 ? 4 : 2; }

/* The value a buffer of type t holds for v (testlib's encoders). */
static float round_as(nb_dtype t, float v) {
    if (t == NB_DTYPE_F16) return ref_f16_to_f32(ref_f16(v));
    if (t == NB_DTYPE_BF16) return ref_bf16_to_f32(ref_bf16(v));
    return v;
}

static float load_as(nb_dtype t, const void *p, size_t i) {
    if (t == NB_DTYPE_F32) return ((const float *)p)[i];
    if (t == NB_DTYPE_F16) return ref_f16_to_f32(((const uint16_t *)p)[i]);
    return ref_bf16_to_f32(((const uint16_t *)p)[i]);
}


static float rnd_sym(double r) { return (float)((2.0 * rnd_unit() - 1.0) * r); }

/* A value every activation dtype holds exactly: a bfloat16 of magnitude at
 * least 2^-6 (F16's normal range), in [-r, r]. */
static float rnd_act(double r) {
    float v = rnd_sym(r);
    if (fabsf(v) < 0x1p-6f) v = copysignf(0x1p-6f, v);
    return ref_bf16_to_f32(ref_bf16(v));
}

/* ------------------------------------------------------------ problems */

enum { ROUTE_UNIFORM = 0, ROUTE_SKEWED = 1, ROUTE_SAME = 2 };

typedef struct mcase {
    nb_format fmt;
    int E, K;
    int64_t m, H, I;
    nb_moe_activation act;
    nb_dtype dt;
    int bias;
    int route;
} mcase;

typedef struct mprob {
    mcase c;
    nb_moe_desc d;
    nb_moe_sizes sz;
    uint8_t *guc, *gus, *guz, *dc, *ds, *dz; /* expert-major checkpoint bytes */
    float *guts, *dts;                       /* per-expert tensor scales (NVFP4), else NULL */
    void *gub, *db;                          /* biases in act_dtype, or NULL */
    void *x;                                 /* [m, H] act_dtype */
    int32_t *ids;
    float *tw;
    /* decoded here: weights [E, 2I, H] and [E, H, I], x and biases as values */
    float *wgu, *wd, *xv, *gubv, *dbv;
    nb_moe_weights w;
} mprob;

/* One expert's weight, element (r, j), decoded from the bytes by
 * docs/formats.md: e2m1 x E4M3/E8M0 (exact in float) times the tensor
 * scale, or (q - z) x F16 scale. */
static float decode(nb_format f, const uint8_t *codes, const uint8_t *scales, const uint8_t *zeros, float ts,
                    int64_t k, int g, int64_t r, int64_t j) {
    const size_t idx = (size_t)(r * k + j), gi = (size_t)(r * (k / g) + j / g);
    int q = nib(codes, idx);
    if (f == NB_FORMAT_INT4) {
        uint16_t s16 = (uint16_t)(scales[2 * gi] | scales[2 * gi + 1] << 8);
        return (float)((double)(q - zeros[gi]) * (double)ref_f16_to_f32(s16));
    }
    double s = f == NB_FORMAT_NVFP4 ? ref_e4m3(scales[gi]) : ref_e8m0(scales[gi]);
    float prod = (float)(k_e2m1[q] * s);
    return (float)((double)prod * (double)ts);
}

/* Random bytes for E experts of weight desc wd. */
static void fill_weight(nb_format f, const nb_weight_sizes_v2 *s, int E, uint8_t **c, uint8_t **sc, uint8_t **z) {
    const size_t nc = s->codes_bytes * (size_t)E, ns = s->scales_bytes * (size_t)E, nz = s->zeros_bytes * (size_t)E;
    *c = malloc(nc);
    *sc = malloc(ns);
    *z = nz ? malloc(nz) : NULL;
    for (size_t i = 0; i < nc; i++) (*c)[i] = (uint8_t)rnd_u64();
    if (f == NB_FORMAT_NVFP4) /* |s| < 2 (exponent field <= 7): zero, subnormals, both signs */
        for (size_t i = 0; i < ns; i++) (*sc)[i] = (uint8_t)((rnd_u64() % 64) | ((rnd_u64() & 1) << 7));
    else if (f == NB_FORMAT_MXFP4) /* 2^-3 .. 2^1 */
        for (size_t i = 0; i < ns; i++) (*sc)[i] = (uint8_t)(124 + rnd_u64() % 5);
    else /* F16 scales of either sign, |s| in [1/64, 1/4] */
        for (size_t i = 0; i < ns / 2; i++) {
            uint16_t h = ref_f16((float)((rnd_u64() & 1 ? -1.0 : 1.0) * (1.0 / 64 + rnd_unit() * (0.25 - 1.0 / 64))));
            (*sc)[2 * i] = (uint8_t)(h & 0xFF);
            (*sc)[2 * i + 1] = (uint8_t)(h >> 8);
        }
    for (size_t i = 0; i < nz; i++) (*z)[i] = (uint8_t)(rnd_u64() % 16);
}

/* topk ids and weights for c->route: distinct experts per token in random order. */
static void route(const mcase *c, int32_t *ids, float *tw) {
    int *perm = malloc(sizeof(int) * (size_t)c->E);
    const int pool = c->route == ROUTE_SKEWED ? (c->E / 4 > c->K ? c->E / 4 : c->K) : c->E;
    int same[8];
    for (int s = 0; s < c->K; s++) same[s] = (int)((size_t)s * (size_t)c->E / (size_t)c->K);
    for (int64_t t = 0; t < c->m; t++) {
        if (c->route == ROUTE_SAME) {
            for (int s = 0; s < c->K; s++) perm[s] = same[s];
            for (int s = c->K - 1; s > 0; s--) { /* the same experts, in a token's own order */
                int j = (int)(rnd_u64() % (uint64_t)(s + 1)), tmp = perm[s];
                perm[s] = perm[j];
                perm[j] = tmp;
            }
        } else {
            for (int e = 0; e < pool; e++) perm[e] = e;
            for (int s = 0; s < c->K; s++) { /* partial Fisher-Yates over the pool */
                int j = s + (int)(rnd_u64() % (uint64_t)(pool - s)), tmp = perm[s];
                perm[s] = perm[j];
                perm[j] = tmp;
            }
        }
        double sum = 0.0, l[8];
        for (int s = 0; s < c->K; s++) sum += (l[s] = exp(2.0 * rnd_unit()));
        for (int s = 0; s < c->K; s++) {
            ids[t * c->K + s] = perm[s];
            /* softmax weights; the skewed routing also gets negative and unnormalised ones */
            tw[t * c->K + s] = c->route == ROUTE_SKEWED ? rnd_sym(1.5) : (float)(l[s] / sum);
        }
    }
    free(perm);
}

static int make(const mcase *c, mprob *p) {
    memset(p, 0, sizeof *p);
    p->c = *c;
    nb_status st = nb_moe_desc_init(&p->d, c->fmt, c->m, c->E, c->K, c->H, c->I, c->act, c->dt);
    if (c->fmt == NB_FORMAT_INT4) { /* groups of 32 (the default, 128, is more than some H and I here) */
        p->d.gate_up.group_size = p->d.down.group_size = 32;
        st = nb_moe_desc_validate(&p->d);
    }
    if (st == NB_OK) st = nb_moe_get_sizes(&p->d, &p->sz);
    CHECK(st == NB_OK, "case %s E%d K%d m%lld: %s", fname(c->fmt), c->E, c->K, (long long)c->m, nb_last_error());
    if (st != NB_OK) return 0;
    const int E = c->E;
    const int64_t H = c->H, I = c->I, m = c->m;
    fill_weight(c->fmt, &p->sz.gate_up, E, &p->guc, &p->gus, &p->guz);
    fill_weight(c->fmt, &p->sz.down, E, &p->dc, &p->ds, &p->dz);
    if (c->fmt == NB_FORMAT_NVFP4) {
        p->guts = malloc(sizeof(float) * (size_t)E);
        p->dts = malloc(sizeof(float) * (size_t)E);
        for (int e = 0; e < E; e++) {
            p->guts[e] = (float)(0.25 + 1.75 * rnd_unit());
            p->dts[e] = (float)(0.25 + 1.75 * rnd_unit());
        }
    }
    const size_t es = dsize(c->dt);
    p->xv = malloc(sizeof(float) * (size_t)(m * H));
    p->x = malloc(es * (size_t)(m * H));
    for (int64_t i = 0; i < m * H; i++) {
        p->xv[i] = rnd_act(1.0);
        store_as(c->dt, p->x, (size_t)i, p->xv[i]);
    }
    if (c->bias) {
        const double gr = c->act == NB_MOE_ACT_SWIGLU_OAI ? 10.0 : 2.0; /* gpt-oss: past the clamps too */
        p->gubv = malloc(sizeof(float) * (size_t)(E * 2 * I));
        p->dbv = malloc(sizeof(float) * (size_t)(E * H));
        p->gub = malloc(es * (size_t)(E * 2 * I));
        p->db = malloc(es * (size_t)(E * H));
        for (int64_t i = 0; i < E * 2 * I; i++) {
            p->gubv[i] = rnd_act(gr);
            store_as(c->dt, p->gub, (size_t)i, p->gubv[i]);
        }
        for (int64_t i = 0; i < E * H; i++) {
            p->dbv[i] = rnd_act(2.0);
            store_as(c->dt, p->db, (size_t)i, p->dbv[i]);
        }
    }
    p->ids = malloc(sizeof(int32_t) * (size_t)(m * c->K));
    p->tw = malloc(sizeof(float) * (size_t)(m * c->K));
    route(c, p->ids, p->tw);
    /* decode every expert here */
    p->wgu = malloc(sizeof(float) * (size_t)(E * 2 * I * H));
    p->wd = malloc(sizeof(float) * (size_t)(E * H * I));
    const int g1 = p->d.gate_up.group_size, g2 = p->d.down.group_size;
    for (int e = 0; e < E; e++) {
        for (int64_t r = 0; r < 2 * I; r++)
            for (int64_t j = 0; j < H; j++)
                p->wgu[(e * 2 * I + r) * H + j] =
                    decode(c->fmt, p->guc + e * p->sz.gate_up.codes_bytes, p->gus + e * p->sz.gate_up.scales_bytes,
                           p->guz ? p->guz + e * p->sz.gate_up.zeros_bytes : NULL, p->guts ? p->guts[e] : 1.0f, H, g1,
                           r, j);
        for (int64_t r = 0; r < H; r++)
            for (int64_t j = 0; j < I; j++)
                p->wd[(e * H + r) * I + j] =
                    decode(c->fmt, p->dc + e * p->sz.down.codes_bytes, p->ds + e * p->sz.down.scales_bytes,
                           p->dz ? p->dz + e * p->sz.down.zeros_bytes : NULL, p->dts ? p->dts[e] : 1.0f, I, g2, r, j);
    }
    p->w.gate_up.codes = p->guc;
    p->w.gate_up.scales = p->gus;
    p->w.gate_up.zeros = p->guz;
    p->w.down.codes = p->dc;
    p->w.down.scales = p->ds;
    p->w.down.zeros = p->dz;
    p->w.gate_up_scales = p->guts;
    p->w.down_scales = p->dts;
    p->w.gate_up_bias = p->gub;
    p->w.down_bias = p->db;
    return 1;
}

static void release(mprob *p) {
    void *all[] = {p->guc, p->gus, p->guz, p->dc, p->ds, p->dz, p->guts, p->dts, p->gub, p->db, p->x,
                   p->ids, p->tw,  p->wgu, p->wd, p->xv, p->gubv, p->dbv};
    for (size_t i = 0; i < sizeof all / sizeof all[0]; i++) free(all[i]);
    memset(p, 0, sizeof *p);
}

/* ------------------------------------------------------------ the references written here */

static void rows_of(const mprob *p, int64_t i, int64_t *rg, int64_t *ru) {
    if (p->d.gate_up_layout == NB_MOE_GATE_UP_INTERLEAVED) *rg = 2 * i, *ru = 2 * i + 1;
    else *rg = i, *ru = p->c.I + i;
}

/* The activation as the header words it, in float and in double. */
static float act3f(int act, float L, float alpha, float g, float u) {
    if (act == NB_MOE_ACT_SWIGLU) return g / (1.0f + expf(-g)) * u;
    if (g > L) g = L;
    if (u > L) u = L;
    if (u < -L) u = -L;
    return (u + 1.0f) * (g / (1.0f + expf(-(alpha * g))));
}

static double act3d(int act, double L, double alpha, double g, double u) {
    if (act == NB_MOE_ACT_SWIGLU) return g / (1.0 + exp(-g)) * u;
    if (g > L) g = L;
    if (u > L) u = L;
    if (u < -L) u = -L;
    return (u + 1.0) * (g / (1.0 + exp(-(alpha * g))));
}

static float actf(const mprob *p, float g, float u) { return act3f(p->c.act, p->d.limit, p->d.alpha, g, u); }
static double actd(const mprob *p, double g, double u) {
    return act3d(p->c.act, (double)p->d.limit, (double)p->d.alpha, g, u);
}

/* One slot in float, by the ARITHMETIC paragraph: o[H]. */
static void slot_float(const mprob *p, int64_t t, int e, float *o) {
    const int64_t H = p->c.H, I = p->c.I;
    const nb_dtype dt = p->c.dt;
    float *gu = malloc(sizeof(float) * (size_t)(2 * I)), *h = malloc(sizeof(float) * (size_t)I);
    const float *x = p->xv + t * H;
    for (int64_t r = 0; r < 2 * I; r++) {
        const float *w = p->wgu + ((int64_t)e * 2 * I + r) * H;
        float acc = 0.0f;
        for (int64_t j = 0; j < H; j++) acc = acc + x[j] * w[j];
        gu[r] = acc + (p->gubv ? p->gubv[e * 2 * I + r] : 0.0f);
    }
    for (int64_t i = 0; i < I; i++) {
        int64_t rg, ru;
        rows_of(p, i, &rg, &ru);
        h[i] = round_as(dt, actf(p, gu[rg], gu[ru]));
    }
    for (int64_t c = 0; c < H; c++) {
        const float *w = p->wd + ((int64_t)e * H + c) * I;
        float acc = 0.0f;
        for (int64_t j = 0; j < I; j++) acc = acc + h[j] * w[j];
        o[c] = round_as(dt, acc + (p->dbv ? p->dbv[e * H + c] : 0.0f));
    }
    free(gu);
    free(h);
}

/* The whole MoE in float, token by token, into y (act_dtype values). */
static void moe_float(const mprob *p, float *y) {
    const int64_t H = p->c.H, K = p->c.K;
    float *o = malloc(sizeof(float) * (size_t)H), *acc = malloc(sizeof(float) * (size_t)H);
    for (int64_t t = 0; t < p->c.m; t++) {
        for (int64_t c = 0; c < H; c++) acc[c] = 0.0f;
        for (int64_t s = 0; s < K; s++) {
            slot_float(p, t, p->ids[t * K + s], o);
            for (int64_t c = 0; c < H; c++) acc[c] = acc[c] + p->tw[t * K + s] * o[c];
        }
        for (int64_t c = 0; c < H; c++) y[t * H + c] = round_as(p->c.dt, acc[c]);
    }
    free(o);
    free(acc);
}

/* The MoE in double, token by token, with the error bound of part 3 for
 * rounding unit `u` (rnd_act: the act_dtype roundings of the float version
 * are counted).  y[m, H] and bound[m, H]. */
static void moe_double(const mprob *p, double u, int rnd_act, double *y, double *bound) {
    const int64_t H = p->c.H, I = p->c.I, K = p->c.K;
    const nb_dtype dt = p->c.dt;
    const double L = (double)p->d.limit, alpha = (double)p->d.alpha;
    double *gu = malloc(sizeof(double) * (size_t)(2 * I)), *dgu = malloc(sizeof(double) * (size_t)(2 * I));
    double *h = malloc(sizeof(double) * (size_t)I), *dh = malloc(sizeof(double) * (size_t)I);
    double *acc = malloc(sizeof(double) * (size_t)H), *B = malloc(sizeof(double) * (size_t)H);
    double *S = malloc(sizeof(double) * (size_t)H);
    for (int64_t t = 0; t < p->c.m; t++) {
        const float *x = p->xv + t * H;
        for (int64_t c = 0; c < H; c++) acc[c] = B[c] = S[c] = 0.0;
        for (int64_t s = 0; s < K; s++) {
            const int e = p->ids[t * K + s];
            const double w = (double)p->tw[t * K + s];
            for (int64_t r = 0; r < 2 * I; r++) {
                const float *wr = p->wgu + ((int64_t)e * 2 * I + r) * H;
                const double b = p->gubv ? (double)p->gubv[e * 2 * I + r] : 0.0;
                double a = 0.0, mag = fabs(b);
                for (int64_t j = 0; j < H; j++) {
                    a += (double)x[j] * (double)wr[j];
                    mag += fabs((double)x[j] * (double)wr[j]);
                }
                gu[r] = a + b;
                dgu[r] = 2.0 * (double)H * u * mag;
            }
            for (int64_t i = 0; i < I; i++) {
                int64_t rg, ru;
                rows_of(p, i, &rg, &ru);
                const double g = gu[rg], v = gu[ru], dg = dgu[rg], dv = dgu[ru];
                h[i] = actd(p, g, v);
                const double up = p->c.act == NB_MOE_ACT_SWIGLU ? fabs(v) + dv : fmin(fabs(v) + dv, L) + 1.0;
                double D = 1.1 * up * dg + (fabs(g) + dg) * dv;
                D += (16.0 + 2.0 * (alpha + 1.0) * (fabs(g) + dg)) * u * (fabs(h[i]) + D) + 1e-30;
                if (rnd_act) D += half_ulp(dt, fabs(h[i]) + D);
                dh[i] = D;
            }
            for (int64_t c = 0; c < H; c++) {
                const float *wr = p->wd + ((int64_t)e * H + c) * I;
                const double b = p->dbv ? (double)p->dbv[e * H + c] : 0.0;
                double a = 0.0, mag = fabs(b), prop = 0.0;
                for (int64_t j = 0; j < I; j++) {
                    a += h[j] * (double)wr[j];
                    mag += (fabs(h[j]) + dh[j]) * fabs((double)wr[j]);
                    prop += dh[j] * fabs((double)wr[j]);
                }
                const double o = a + b;
                double d = prop + 2.0 * (double)I * u * mag + 1e-30;
                if (rnd_act) d += half_ulp(dt, fabs(o) + d);
                acc[c] += w * o;
                B[c] += fabs(w) * d;
                S[c] += fabs(w) * (fabs(o) + d);
            }
        }
        for (int64_t c = 0; c < H; c++) {
            double b = B[c] + 2.0 * (double)K * u * S[c] + 1e-30;
            if (rnd_act) b += half_ulp(dt, fabs(acc[c]) + b);
            y[t * H + c] = acc[c];
            bound[t * H + c] = b;
        }
    }
    free(gu);
    free(dgu);
    free(h);
    free(dh);
    free(acc);
    free(B);
    free(S);
}

/* ------------------------------------------------------------ checks */

static void case_name(const mcase *c, char *buf, size_t n) {
    snprintf(buf, n, "%s E%d K%d m%lld H%lld I%lld %s %s%s route %d", fname(c->fmt), c->E, c->K, (long long)c->m,
             (long long)c->H, (long long)c->I, c->act == NB_MOE_ACT_SWIGLU ? "swiglu" : "gpt-oss", dname(c->dt),
             c->bias ? " bias" : "", c->route);
}

static double g_worst_f32; /* the largest error/bound of part 3 over every case, reported */

/* Parts 1-3 on one problem. */
static void check_case(nb_context *ctx, const mcase *c) {
    char what[160];
    case_name(c, what, sizeof what);
    mprob p;
    if (!make(c, &p)) return;
    const int64_t mh = c->m * c->H;
    void *y = malloc(dsize(c->dt) * (size_t)mh);
    double *y64 = malloc(sizeof(double) * (size_t)mh), *ref = malloc(sizeof(double) * (size_t)mh);
    double *bound = malloc(sizeof(double) * (size_t)mh);
    float *yf = malloc(sizeof(float) * (size_t)mh);
    nb_status s1 = nb_moe_mlp_host(ctx, &p.d, p.x, &p.w, p.ids, p.tw, y);
    nb_status s2 = nb_moe_mlp_host_f64(ctx, &p.d, p.x, &p.w, p.ids, p.tw, y64);
    CHECK(s1 == NB_OK && s2 == NB_OK, "%s: %s", what, nb_last_error());
    if (s1 == NB_OK && s2 == NB_OK) {
        /* 1. f64 against the double computed here */
        moe_double(&p, 0x1p-52, 0, ref, bound);
        double worst = 0.0;
        int64_t wi = 0;
        for (int64_t i = 0; i < mh; i++) {
            double r = fabs(y64[i] - ref[i]) / bound[i];
            if (!(r <= worst)) worst = r, wi = i;
        }
        CHECK(worst <= 1.0, "f64 vs double here %s: worst [%lld, %lld] %.17g vs %.17g (err/bound %.3g)", what,
              (long long)(wi / c->H), (long long)(wi % c->H), y64[wi], ref[wi], worst);
        /* 2. float against the float computed here, bit for bit */
        moe_float(&p, yf);
        int64_t bad = 0, first = -1;
        for (int64_t i = 0; i < mh; i++) {
            float got = load_as(c->dt, y, (size_t)i);
            if (memcmp(&got, &yf[i], 4) && !(isnan(got) && isnan(yf[i])) && !bad++) first = i;
        }
        CHECK(bad == 0, "float vs float here %s: %lld differ, first [%lld, %lld] %.9g vs %.9g", what, (long long)bad,
              (long long)(first / c->H), (long long)(first % c->H),
              first >= 0 ? (double)load_as(c->dt, y, (size_t)first) : 0.0, first >= 0 ? (double)yf[first] : 0.0);
        /* 3. float against f64 within the stated bound; everything finite */
        moe_double(&p, 0x1p-24, c->dt != NB_DTYPE_F32, ref, bound);
        worst = 0.0;
        wi = 0;
        int64_t nonfinite = 0;
        for (int64_t i = 0; i < mh; i++) {
            double got = (double)load_as(c->dt, y, (size_t)i);
            nonfinite += !isfinite(got) || !isfinite(y64[i]);
            double r = fabs(got - y64[i]) / (bound[i] + 1e-12 * fabs(y64[i]));
            if (!(r <= worst)) worst = r, wi = i;
        }
        CHECK(nonfinite == 0, "%s: %lld outputs not finite", what, (long long)nonfinite);
        if (worst > g_worst_f32) g_worst_f32 = worst;
        CHECK(worst <= 1.0, "float vs f64 %s: worst [%lld, %lld] got %.9g ref %.17g |err| %.3g > bound %.3g", what,
              (long long)(wi / c->H), (long long)(wi % c->H), (double)load_as(c->dt, y, (size_t)wi), y64[wi],
              fabs((double)load_as(c->dt, y, (size_t)wi) - y64[wi]), bound[wi]);
    }
    free(y);
    free(y64);
    free(ref);
    free(bound);
    free(yf);
    release(&p);
}

/* 5. The routing layout, built here from the header's words. */
static void check_align(nb_context *ctx, const mcase *c, int32_t block) {
    char what[160];
    case_name(c, what, sizeof what);
    mprob p;
    if (!make(c, &p)) return;
    nb_moe_align_sizes sz;
    nb_status st = nb_moe_align_get_sizes(&p.d, block, &sz);
    CHECK(st == NB_OK, "align sizes %s block %d: %s", what, block, nb_last_error());
    if (st != NB_OK) {
        release(&p);
        return;
    }
    const int64_t n = c->m * c->K, E = c->E;
    CHECK(sz.slots == n && sz.sorted_len == n + E * (block - 1) && sz.blocks == (sz.sorted_len + block - 1) / block &&
              sz.offsets_len == E + 1 && sz.reserved[0] == 0,
          "align sizes %s block %d: %lld %lld %lld %lld", what, block, (long long)sz.slots, (long long)sz.sorted_len,
          (long long)sz.blocks, (long long)sz.offsets_len);
    /* expected buffers */
    int32_t *es = malloc(sizeof(int32_t) * (size_t)sz.sorted_len), *eb = malloc(sizeof(int32_t) * (size_t)sz.blocks);
    int32_t *eo = malloc(sizeof(int32_t) * (size_t)(E + 1)), *ec = malloc(sizeof(int32_t) * (size_t)E);
    for (int64_t i = 0; i < sz.sorted_len; i++) es[i] = (int32_t)n;
    for (int64_t b = 0; b < sz.blocks; b++) eb[b] = -1;
    int64_t off = 0;
    for (int64_t e = 0; e < E; e++) {
        int64_t cnt = 0;
        eo[e] = (int32_t)off;
        for (int64_t i = 0; i < n; i++)
            if (p.ids[i] == e) es[off + cnt++] = (int32_t)i;
        ec[e] = (int32_t)cnt;
        const int64_t padded = (cnt + block - 1) / block * block;
        for (int64_t r = off; r < off + padded; r += block) eb[r / block] = (int32_t)e;
        off += padded;
    }
    eo[E] = (int32_t)off;
    /* the library's, into buffers 3 entries longer than needed and poisoned */
    const int32_t poison = 0x7A7A7A7A;
    int32_t *gs = malloc(sizeof(int32_t) * (size_t)(sz.sorted_len + 3));
    int32_t *gb = malloc(sizeof(int32_t) * (size_t)(sz.blocks + 3));
    int32_t *go = malloc(sizeof(int32_t) * (size_t)(E + 4)), *gc = malloc(sizeof(int32_t) * (size_t)(E + 3));
    for (int64_t i = 0; i < sz.sorted_len + 3; i++) gs[i] = poison;
    for (int64_t i = 0; i < sz.blocks + 3; i++) gb[i] = poison;
    for (int64_t i = 0; i < E + 4; i++) go[i] = poison;
    for (int64_t i = 0; i < E + 3; i++) gc[i] = poison;
    nb_moe_align_sizes cap = sz;
    cap.sorted_len += 3;
    cap.blocks += 3;
    cap.offsets_len += 3;
    st = nb_moe_align_host(ctx, &p.d, block, p.ids, gs, gb, go, gc, &cap);
    CHECK(st == NB_OK, "align %s block %d: %s", what, block, nb_last_error());
    if (st == NB_OK) {
        CHECK(!memcmp(gs, es, sizeof(int32_t) * (size_t)sz.sorted_len), "align %s block %d: sorted_slots differ", what,
              block);
        CHECK(!memcmp(gb, eb, sizeof(int32_t) * (size_t)sz.blocks), "align %s block %d: block_experts differ", what,
              block);
        CHECK(!memcmp(go, eo, sizeof(int32_t) * (size_t)(E + 1)), "align %s block %d: expert_offsets differ", what,
              block);
        CHECK(!memcmp(gc, ec, sizeof(int32_t) * (size_t)E), "align %s block %d: expert_counts differ", what, block);
        int untouched = 1;
        for (int i = 0; i < 3; i++)
            untouched &= gs[sz.sorted_len + i] == poison && gb[sz.blocks + i] == poison && go[E + 1 + i] == poison &&
                         gc[E + i] == poison;
        CHECK(untouched, "align %s block %d: wrote past the sizes", what, block);
        int64_t idle = 0;
        for (int64_t e = 0; e < E; e++) idle += ec[e] == 0;
        if (c->route != ROUTE_UNIFORM)
            CHECK(idle > 0, "align %s: the routing left no expert idle", what);
        /* without expert_counts */
        CHECK(nb_moe_align_host(ctx, &p.d, block, p.ids, gs, gb, go, NULL, &sz) == NB_OK &&
                  !memcmp(gs, es, sizeof(int32_t) * (size_t)sz.sorted_len),
              "align %s block %d without counts: %s", what, block, nb_last_error());

        /* a grouped GEMM driven by the layout: every block of the launch, its
         * expert (-1: nothing), each row's slot (the sentinel: nothing) */
        const int64_t H = c->H;
        float *o = malloc(sizeof(float) * (size_t)(n * H)), *acc = malloc(sizeof(float) * (size_t)H);
        char *seen = calloc((size_t)n, 1);
        for (int64_t b = 0; b < sz.blocks; b++) {
            const int32_t e = gb[b];
            if (e < 0) continue;
            for (int32_t r = 0; r < block; r++) {
                const int32_t slot = gs[b * block + r];
                if (slot == n) continue;
                seen[slot]++;
                CHECK(p.ids[slot] == e, "align %s: slot %d of expert %d sits in a block of expert %d", what, slot,
                      p.ids[slot], e);
                slot_float(&p, slot / c->K, e, o + (int64_t)slot * H);
            }
        }
        int64_t missing = 0;
        for (int64_t i = 0; i < n; i++) missing += seen[i] != 1;
        CHECK(missing == 0, "align %s block %d: %lld slots not visited exactly once", what, block, (long long)missing);
        void *y = malloc(dsize(c->dt) * (size_t)(c->m * H));
        st = nb_moe_mlp_host(ctx, &p.d, p.x, &p.w, p.ids, p.tw, y);
        int64_t bad = 0;
        for (int64_t t = 0; t < c->m && st == NB_OK; t++) {
            for (int64_t k = 0; k < H; k++) acc[k] = 0.0f;
            for (int64_t s = 0; s < c->K; s++)
                for (int64_t k = 0; k < H; k++) acc[k] = acc[k] + p.tw[t * c->K + s] * o[(t * c->K + s) * H + k];
            for (int64_t k = 0; k < H; k++) {
                float want = round_as(c->dt, acc[k]), got = load_as(c->dt, y, (size_t)(t * H + k));
                bad += memcmp(&want, &got, 4) != 0;
            }
        }
        CHECK(st == NB_OK && bad == 0, "grouped GEMM from the layout %s block %d: %lld outputs differ from "
              "nb_moe_mlp_host (%s)", what, block, (long long)bad, st == NB_OK ? "" : nb_last_error());
        free(o);
        free(acc);
        free(seen);
        free(y);
    }
    free(es);
    free(eb);
    free(eo);
    free(ec);
    free(gs);
    free(gb);
    free(go);
    free(gc);
    release(&p);
}

/* 4. The combine order: zero weights, so o_s is expert e's down bias
 * exactly; slots [1e8, -1e8, 1] sum to 1 in slot order, to 0 in expert
 * order (experts 2, 0, 1). */
static void check_combine_order(nb_context *ctx) {
    mcase c = {NB_FORMAT_MXFP4, 3, 3, 2, 32, 32, NB_MOE_ACT_SWIGLU, NB_DTYPE_F32, 1, ROUTE_UNIFORM};
    mprob p;
    if (!make(&c, &p)) return;
    memset(p.guc, 0, p.sz.gate_up.codes_bytes * 3);
    memset(p.dc, 0, p.sz.down.codes_bytes * 3);
    const float bias[3] = {-1e8f, 1.0f, 1e8f};
    for (int e = 0; e < 3; e++)
        for (int64_t k = 0; k < c.H; k++) ((float *)p.db)[e * c.H + k] = bias[e];
    const int32_t ids[6] = {2, 0, 1, 1, 2, 0}; /* token 1: [1, 1e8, -1e8] -> fl(fl(1 + 1e8) - 1e8) = 0 */
    const float tw[6] = {1, 1, 1, 1, 1, 1};
    float y[64];
    nb_status st = nb_moe_mlp_host(ctx, &p.d, p.x, &p.w, ids, tw, y);
    CHECK(st == NB_OK && y[0] == 1.0f && y[31] == 1.0f && y[32] == 0.0f && y[63] == 0.0f,
          "combine in top-k order: y = %g, %g (want 1, 0): %s", (double)y[0], (double)y[32],
          st == NB_OK ? "" : nb_last_error());
    release(&p);
}

/* 6. A NaN block scale of expert 1's down weight: NaN exactly where expert 1
 * was routed (its row 0, so column 0 of those tokens' outputs). */
static void check_nan(nb_context *ctx) {
    mcase c = {NB_FORMAT_MXFP4, 8, 2, 40, 64, 32, NB_MOE_ACT_SWIGLU_OAI, NB_DTYPE_BF16, 1, ROUTE_UNIFORM};
    mprob p;
    if (!make(&c, &p)) return;
    p.ds[1 * p.sz.down.scales_bytes] = 0xFF; /* expert 1, row 0, group 0 */
    uint16_t *y = malloc(sizeof(uint16_t) * (size_t)(c.m * c.H));
    nb_status st = nb_moe_mlp_host(ctx, &p.d, p.x, &p.w, p.ids, p.tw, y);
    int64_t wrong = 0, routed = 0;
    for (int64_t t = 0; t < c.m && st == NB_OK; t++) {
        int hit = p.ids[t * 2] == 1 || p.ids[t * 2 + 1] == 1;
        routed += hit;
        for (int64_t k = 0; k < c.H; k++)
            wrong += isnan(ref_bf16_to_f32(y[t * c.H + k])) != (hit && k == 0);
    }
    CHECK(st == NB_OK && wrong == 0 && routed > 0, "NaN scale of expert 1: %lld outputs wrong (%lld tokens routed): %s",
          (long long)wrong, (long long)routed, st == NB_OK ? "" : nb_last_error());
    free(y);
    release(&p);
}

/* ------------------------------------------------------------ dump for moe_crosscheck.py */

static void dump_file(const char *dir, const char *name, const void *p, size_t n) {
    char path[1024];
    snprintf(path, sizeof path, "%s/%s", dir, name);
    FILE *f = fopen(path, "wb");
    CHECK(f && fwrite(p, 1, n, f) == n, "dump %s", path);
    if (f) fclose(f);
}

/* One case: the checkpoint bytes, routing, x (F32 values), and nibble's
 * outputs: y64 (f64), y32 (F32 activations), ybf16 (BF16 activations). */
static void dump_case(nb_context *ctx, const char *root, int idx, const mcase *c0) {
    char dir[900];
    snprintf(dir, sizeof dir, "%s/case%d", root, idx);
    mkdir(dir, 0755);
    mcase c = *c0;
    c.dt = NB_DTYPE_F32;
    mprob p;
    if (!make(&c, &p)) return;
    const int64_t mh = c.m * c.H;
    double *y64 = malloc(sizeof(double) * (size_t)mh);
    float *y32 = malloc(sizeof(float) * (size_t)mh);
    uint16_t *ybf = malloc(sizeof(uint16_t) * (size_t)mh);
    nb_status st = nb_moe_mlp_host_f64(ctx, &p.d, p.x, &p.w, p.ids, p.tw, y64);
    if (st == NB_OK) st = nb_moe_mlp_host(ctx, &p.d, p.x, &p.w, p.ids, p.tw, y32);
    if (st == NB_OK) { /* the same values in BF16 (x and biases are bf16 values already) */
        nb_moe_desc d = p.d;
        d.act_dtype = NB_DTYPE_BF16;
        uint16_t *xb = malloc(2 * (size_t)mh), *gb = NULL, *db = NULL;
        for (int64_t i = 0; i < mh; i++) xb[i] = ref_bf16(p.xv[i]);
        nb_moe_weights w = p.w;
        if (c.bias) {
            gb = malloc(2 * (size_t)(c.E * 2 * c.I));
            db = malloc(2 * (size_t)(c.E * c.H));
            for (int64_t i = 0; i < c.E * 2 * c.I; i++) gb[i] = ref_bf16(p.gubv[i]);
            for (int64_t i = 0; i < c.E * c.H; i++) db[i] = ref_bf16(p.dbv[i]);
            w.gate_up_bias = gb;
            w.down_bias = db;
        }
        st = nb_moe_mlp_host(ctx, &d, xb, &w, p.ids, p.tw, ybf);
        free(xb);
        free(gb);
        free(db);
    }
    CHECK(st == NB_OK, "dump case %d: %s", idx, nb_last_error());
    char meta[512];
    snprintf(meta, sizeof meta,
             "format %s\nexperts %d\ntop_k %d\nm %lld\nhidden %lld\nintermediate %lld\nactivation %s\nlayout %s\n"
             "limit %.17g\nalpha %.17g\nbias %d\n",
             fname(c.fmt), c.E, c.K, (long long)c.m, (long long)c.H, (long long)c.I,
             c.act == NB_MOE_ACT_SWIGLU ? "swiglu" : "swiglu_oai",
             p.d.gate_up_layout == NB_MOE_GATE_UP_CONCAT ? "concat" : "interleaved", (double)p.d.limit,
             (double)p.d.alpha, c.bias);
    dump_file(dir, "meta.txt", meta, strlen(meta));
    dump_file(dir, "gate_up_codes.u8", p.guc, p.sz.gate_up.codes_bytes * (size_t)c.E);
    dump_file(dir, "gate_up_scales.u8", p.gus, p.sz.gate_up.scales_bytes * (size_t)c.E);
    dump_file(dir, "down_codes.u8", p.dc, p.sz.down.codes_bytes * (size_t)c.E);
    dump_file(dir, "down_scales.u8", p.ds, p.sz.down.scales_bytes * (size_t)c.E);
    if (p.guts) dump_file(dir, "gate_up_ts.f32", p.guts, sizeof(float) * (size_t)c.E);
    if (p.dts) dump_file(dir, "down_ts.f32", p.dts, sizeof(float) * (size_t)c.E);
    if (c.bias) {
        dump_file(dir, "gate_up_bias.f32", p.gubv, sizeof(float) * (size_t)(c.E * 2 * c.I));
        dump_file(dir, "down_bias.f32", p.dbv, sizeof(float) * (size_t)(c.E * c.H));
    }
    dump_file(dir, "x.f32", p.xv, sizeof(float) * (size_t)mh);
    dump_file(dir, "topk_ids.i32", p.ids, sizeof(int32_t) * (size_t)(c.m * c.K));
    dump_file(dir, "topk_weights.f32", p.tw, sizeof(float) * (size_t)(c.m * c.K));
    dump_file(dir, "y64.f64", y64, sizeof(double) * (size_t)mh);
    dump_file(dir, "y32.f32", y32, sizeof(float) * (size_t)mh);
    dump_file(dir, "ybf16.u16", ybf, sizeof(uint16_t) * (size_t)mh);
    free(y64);
    free(y32);
    free(ybf);
    release(&p);
}

/* ------------------------------------------------------------ 8. nb_glu_host */

/* A gu value: mostly in [-8, 8] (both sides of gpt-oss's clamp at 7), some
 * up to 120 in magnitude (expf overflows past 88.7), zeros, and with
 * `special` NaN and infinities; every value exact in dtype t. */
static float glu_value(nb_dtype t, int special) {
    const double r = rnd_unit();
    float v;
    if (special && r < 0.02) v = NAN;
    else if (special && r < 0.04) v = r < 0.03 ? INFINITY : -INFINITY;
    else if (r < 0.07) v = 0.0f;
    else if (r < 0.15) v = rnd_sym(120.0);
    else v = rnd_sym(8.0);
    return round_as(t, v);
}

/* The activation of a glu descriptor as nibble.h words it, in float and in
 * double. */
static float glu_actf(const nb_glu_desc *d, float g, float u) { return act3f(d->activation, d->limit, d->alpha, g, u); }
static double glu_actd(const nb_glu_desc *d, double g, double u) {
    return act3d(d->activation, (double)d->limit, (double)d->alpha, g, u);
}

/* Columns of gate i and up i in a row of gu. */
static void glu_cols(const nb_glu_desc *d, int64_t i, int64_t *cg, int64_t *cu) {
    if (d->layout == NB_MOE_GATE_UP_INTERLEAVED) *cg = 2 * i, *cu = 2 * i + 1;
    else *cg = i, *cu = d->n + i;
}

/* A random gu [m, 2n] of d's dtype (NULL when out of memory). */
static void *glu_input(const nb_glu_desc *d, int special) {
    const size_t cnt = (size_t)(d->m * 2 * d->n);
    void *gu = malloc(dsize(d->dtype) * cnt);
    if (gu)
        for (size_t i = 0; i < cnt; i++) store_as(d->dtype, gu, i, glu_value(d->dtype, special));
    return gu;
}

/* A glu descriptor of act, layout, dt, m and n, and its name (prefix, then
 * the fields, then suffix) in what; 0 (a failed check) when the
 * descriptor is refused. */
static int glu_desc(nb_glu_desc *d, nb_moe_activation act, int layout, nb_dtype dt, int64_t m, int64_t n,
                    const char *prefix, const char *suffix, char *what, size_t what_n) {
    nb_status st = nb_glu_desc_init(d, act, m, n, dt);
    d->layout = layout;
    snprintf(what, what_n, "%s %s %s %s m=%lld n=%lld%s", prefix, act == NB_MOE_ACT_SWIGLU ? "swiglu" : "oai",
             layout == NB_MOE_GATE_UP_INTERLEAVED ? "interleaved" : "concat", dname(dt), (long long)m, (long long)n,
             suffix);
    CHECK(st == NB_OK, "%s: nb_glu_desc_init: %s", what, nb_last_error());
    return st == NB_OK;
}

/* nb_glu_host on one problem: every element bit for bit the float formula
 * written here (a NaN where it gives NaN), and within the bound of part 3's
 * activation term of the double value: (16 + 2 (a + 1) |g|) u |h| (a = 1
 * for SwiGLU, alpha for gpt-oss's; u = 2^-24) + half an ulp of dtype + 1e-30. */
static void check_glu_case(nb_context *ctx, nb_moe_activation act, int layout, nb_dtype dt, int64_t m, int64_t n,
                           int special) {
    nb_glu_desc d;
    char what[112];
    if (!glu_desc(&d, act, layout, dt, m, n, "nb_glu_host", special ? " +nan/inf" : "", what, sizeof what)) return;
    void *gu = glu_input(&d, special), *h = malloc(dsize(dt) * (size_t)(m * n));
    if (!gu || !h) {
        free(gu), free(h);
        CHECK(0, "%s: out of host memory", what);
        return;
    }
    nb_status st = nb_glu_host(ctx, &d, gu, h);
    CHECK(st == NB_OK, "%s: %s", what, nb_last_error());
    int64_t wrong = 0, over = 0, nans = 0, worst_i = -1;
    double worst = 0.0;
    const double a = act == NB_MOE_ACT_SWIGLU ? 1.0 : (double)d.alpha;
    for (int64_t t = 0; t < m && st == NB_OK; t++)
        for (int64_t i = 0; i < n; i++) {
            int64_t cg, cu;
            glu_cols(&d, i, &cg, &cu);
            const float g = load_as(dt, gu, (size_t)(t * 2 * n + cg)), u = load_as(dt, gu, (size_t)(t * 2 * n + cu));
            const float want = round_as(dt, glu_actf(&d, g, u)), got = load_as(dt, h, (size_t)(t * n + i));
            if (isnan(want) || isnan(got)) {
                wrong += isnan(want) != isnan(got);
                nans += isnan(got);
                continue;
            }
            wrong += memcmp(&want, &got, sizeof got) != 0;
            const double ref = glu_actd(&d, g, u);
            if (!isfinite(ref)) continue;
            const double bound = (16.0 + 2.0 * (a + 1.0) * fabs(g)) * 0x1p-24 * fabs(ref) +
                                 half_ulp(dt, fabs(ref) * (1.0 + 0x1p-16)) + 1e-30;
            const double err = fabs((double)got - ref);
            over += err > bound;
            if (err / bound > worst) worst = err / bound, worst_i = t * n + i;
        }
    CHECK(st != NB_OK || wrong == 0, "%s: %lld elements differ from the float formula", what, (long long)wrong);
    CHECK(st != NB_OK || over == 0, "%s: %lld elements past the bound of the double value (worst %.3g at %lld)", what,
          (long long)over, worst, (long long)worst_i);
    CHECK(st != NB_OK || !special || nans > 0, "%s: no NaN output from NaN inputs", what);
    free(gu);
    free(h);
}

/* The descriptor's defaults and rules, nb_glu_host's argument checks, and a
 * NaN gate or up that the clamps must not turn into a number. */
static void check_glu_host(nb_context *ctx) {
    nb_glu_desc d;
    CHECK(nb_glu_desc_init(&d, NB_MOE_ACT_SWIGLU, 3, 16, NB_DTYPE_BF16) == NB_OK && d.layout ==
              NB_MOE_GATE_UP_CONCAT && d.limit == 0.0f && d.alpha == 0.0f, "nb_glu_desc_init swiglu: concat, 0, 0");
    CHECK(nb_glu_desc_init(&d, NB_MOE_ACT_SWIGLU_OAI, 3, 16, NB_DTYPE_F16) == NB_OK && d.layout ==
              NB_MOE_GATE_UP_INTERLEAVED && d.limit == 7.0f && d.alpha == 1.702f,
          "nb_glu_desc_init swiglu_oai: interleaved, 7, 1.702");
    CHECK(nb_glu_desc_init(NULL, NB_MOE_ACT_SWIGLU, 1, 1, NB_DTYPE_F32) == NB_ERR_NULL_POINTER, "glu: NULL desc");
    CHECK(nb_glu_desc_init(&d, NB_MOE_ACT_SWIGLU, 0, 16, NB_DTYPE_F32) == NB_ERR_BAD_SHAPE, "glu: m = 0");
    CHECK(nb_glu_desc_init(&d, NB_MOE_ACT_SWIGLU, 1, 0, NB_DTYPE_F32) == NB_ERR_BAD_SHAPE, "glu: n = 0");
    CHECK(nb_glu_desc_init(&d, NB_MOE_ACT_SWIGLU, ((int64_t)1 << 31) + 1, 1, NB_DTYPE_F32) == NB_ERR_BAD_SHAPE,
          "glu: m = 2^31 + 1");
    CHECK(nb_glu_desc_init(&d, NB_MOE_ACT_SWIGLU, (int64_t)1 << 31, (int64_t)1 << 20, NB_DTYPE_F32) ==
              NB_ERR_BAD_SHAPE, "glu: m x 2n = 2^52 elements");
    CHECK(nb_glu_desc_init(&d, (nb_moe_activation)7, 1, 8, NB_DTYPE_F32) == NB_ERR_INVALID_ARGUMENT,
          "glu: unknown activation");
    CHECK(nb_glu_desc_init(&d, NB_MOE_ACT_SWIGLU, 1, 8, (nb_dtype)99) == NB_ERR_UNSUPPORTED, "glu: unknown dtype");
    static const struct {
        int act, layout;
        float limit, alpha;
        int reserved;
        const char *what;
    } bad[6] = {{NB_MOE_ACT_SWIGLU, 9, 0, 0, 0, "layout 9"},
                {NB_MOE_ACT_SWIGLU, NB_MOE_GATE_UP_CONCAT, 7.0f, 0, 0, "swiglu with a limit"},
                {NB_MOE_ACT_SWIGLU_OAI, NB_MOE_GATE_UP_INTERLEAVED, 0.0f, 1.702f, 0, "swiglu_oai with limit 0"},
                {NB_MOE_ACT_SWIGLU_OAI, NB_MOE_GATE_UP_INTERLEAVED, 7.0f, NAN, 0, "swiglu_oai with alpha NaN"},
                {NB_MOE_ACT_SWIGLU_OAI, NB_MOE_GATE_UP_INTERLEAVED, INFINITY, 1.702f, 0, "swiglu_oai, limit inf"},
                {NB_MOE_ACT_SWIGLU, NB_MOE_GATE_UP_CONCAT, 0, 0, 1, "a reserved field set"}};
    for (int i = 0; i < 6; i++) {
        nb_glu_desc_init(&d, NB_MOE_ACT_SWIGLU, 2, 8, NB_DTYPE_F32);
        d.activation = bad[i].act, d.layout = bad[i].layout, d.limit = bad[i].limit, d.alpha = bad[i].alpha;
        d.reserved[6] = bad[i].reserved;
        CHECK(nb_glu_desc_validate(&d) == NB_ERR_INVALID_ARGUMENT, "glu: %s refused", bad[i].what);
    }
    float gu[2 * 2 * 8], h[2 * 8];
    for (int i = 0; i < 32; i++) gu[i] = (float)(i % 7) - 3.0f;
    nb_glu_desc_init(&d, NB_MOE_ACT_SWIGLU, 2, 8, NB_DTYPE_F32);
    CHECK(nb_glu_host(ctx, &d, NULL, h) == NB_ERR_NULL_POINTER, "glu: NULL gu");
    CHECK(nb_glu_host(ctx, &d, gu, NULL) == NB_ERR_NULL_POINTER, "glu: NULL h");
    CHECK(nb_glu_host(ctx, &d, gu, gu + 31) == NB_ERR_INVALID_ARGUMENT, "glu: h overlapping gu's last element");
    CHECK(nb_glu_host(NULL, &d, gu, h) == NB_OK, "glu: nb_glu_host without a context");
    CHECK(nb_glu(ctx, &d, gu, h, NULL) == NB_ERR_NO_DEVICE, "glu: nb_glu on a host context (%s)", nb_last_error());
    /* NaN through both activations and layouts: h is NaN exactly where its gate or up is */
    for (int v = 0; v < 4; v++) {
        nb_glu_desc_init(&d, v & 1 ? NB_MOE_ACT_SWIGLU_OAI : NB_MOE_ACT_SWIGLU, 2, 8, NB_DTYPE_F32);
        d.layout = v & 2 ? NB_MOE_GATE_UP_INTERLEAVED : NB_MOE_GATE_UP_CONCAT;
        for (int i = 0; i < 32; i++) gu[i] = (float)(i % 7) - 3.0f;
        int64_t cg, cu;
        glu_cols(&d, 3, &cg, &cu);
        gu[cg] = NAN;          /* row 0, column 3: the gate */
        glu_cols(&d, 5, &cg, &cu);
        gu[16 + cu] = NAN;     /* row 1, column 5: the up value (past the clamp's limit either way) */
        nb_status st = nb_glu_host(ctx, &d, gu, h);
        int bad_nan = 0;
        for (int i = 0; i < 16; i++) bad_nan += isnan(h[i]) != (i == 3 || i == 8 + 5);
        CHECK(st == NB_OK && bad_nan == 0, "glu NaN %s %s: %d outputs wrong", v & 1 ? "oai" : "swiglu",
              v & 2 ? "interleaved" : "concat", bad_nan);
    }
    /* the sweep */
    static const nb_dtype dts[3] = {NB_DTYPE_F32, NB_DTYPE_BF16, NB_DTYPE_F16};
    static const int64_t shapes[4][2] = {{1, 8}, {3, 1001}, {17, 96}, {2, 2880}};
    for (int a = 0; a < 2; a++)
        for (int l = 0; l < 2; l++)
            for (int t = 0; t < 3; t++)
                for (int s = 0; s < 4; s++)
                    check_glu_case(ctx, a ? NB_MOE_ACT_SWIGLU_OAI : NB_MOE_ACT_SWIGLU,
                                   l ? NB_MOE_GATE_UP_INTERLEAVED : NB_MOE_GATE_UP_CONCAT, dts[t], shapes[s][0],
                                   shapes[s][1], s % 2);
}

/* ------------------------------------------------------------ main */

#ifndef TEST_MOE_NO_MAIN

/* 7. nb_moe_pack_host: each expert's packed gate_up unpacks (nb_unpack_host)
 * to gate rows 8b..8b+7 then up rows 8b..8b+7 per row block, its down to the
 * checkpoint bytes; the descriptors end packed with the MXFP4 scale range;
 * refusals leave them unchanged. */
static void check_pack(nb_context *ctx, const mcase *c) {
    char what[160];
    case_name(c, what, sizeof what);
    mprob p;
    if (!make(c, &p)) return;
    nb_moe_packed_sizes ps;
    nb_status st = nb_moe_packed_get_sizes(&p.d, &ps);
    CHECK(st == NB_OK, "packed sizes %s: %s", what, nb_last_error());
    if (st) {
        release(&p);
        return;
    }
    uint8_t *gp = malloc(ps.gate_up_bytes), *dp = malloc(ps.down_bytes);
    nb_moe_desc d = p.d;
    CHECK(nb_moe_pack_host(ctx, &d, &p.w, gp, ps.gate_up_bytes - 1, dp, ps.down_bytes) == NB_ERR_BUFFER_TOO_SMALL &&
              d.gate_up.layout == NB_LAYOUT_CHECKPOINT,
          "pack %s: a short buffer is refused and d unchanged", what);
    st = nb_moe_pack_host(ctx, &d, &p.w, gp, ps.gate_up_bytes, dp, ps.down_bytes);
    CHECK(st == NB_OK && d.gate_up.layout == NB_LAYOUT_PACKED && d.down.layout == NB_LAYOUT_PACKED,
          "pack %s: %s", what, nb_last_error());
    CHECK(nb_moe_pack_host(ctx, &d, &p.w, gp, ps.gate_up_bytes, dp, ps.down_bytes) == NB_ERR_INVALID_ARGUMENT,
          "pack %s: packing packed weights is refused", what);
    {
        nb_moe_desc d2 = p.d;
        CHECK(nb_moe_packed_get_sizes(&d2, NULL) == NB_ERR_NULL_POINTER, "packed sizes %s: NULL out is refused", what);
        CHECK(nb_moe_pack_host(ctx, &d2, NULL, gp, ps.gate_up_bytes, dp, ps.down_bytes) == NB_ERR_NULL_POINTER &&
                  nb_moe_pack_host(ctx, &d2, &p.w, NULL, ps.gate_up_bytes, dp, ps.down_bytes) == NB_ERR_NULL_POINTER &&
                  nb_moe_pack_host(NULL, &d2, &p.w, gp, ps.gate_up_bytes, dp, ps.down_bytes) == NB_ERR_NULL_POINTER &&
                  d2.gate_up.layout == NB_LAYOUT_CHECKPOINT,
              "pack %s: NULL weights, buffers or ctx are refused and d unchanged", what);
        nb_moe_align_sizes as;
        CHECK(nb_moe_align_get_sizes(&d2, 8, &as) == NB_OK &&
                  nb_moe_align(ctx, &d2, 8, p.ids, NULL, NULL, NULL, NULL, &as, NULL) == NB_ERR_NO_DEVICE,
              "align %s: nb_moe_align on a host context is NB_ERR_NO_DEVICE (%s)", what, nb_last_error());
    }
    if (c->fmt == NB_FORMAT_MXFP4) {
        int lo = 256, hi = -1;
        for (size_t i = 0; i < p.sz.gate_up.scales_bytes * (size_t)c->E; i++)
            if (p.gus[i] != 0xFF) lo = p.gus[i] < lo ? p.gus[i] : lo, hi = p.gus[i] > hi ? p.gus[i] : hi;
        CHECK(d.gate_up.scale_exp_min == lo && d.gate_up.scale_exp_max == hi, "pack %s: scale range %d..%d, want "
              "%d..%d", what, d.gate_up.scale_exp_min, d.gate_up.scale_exp_max, lo, hi);
    }
    const int64_t H = c->H, I = c->I, rows = 16 * ((I + 7) / 8);
    const size_t crow = (size_t)H / 2, srow = (size_t)(H / p.d.gate_up.group_size);
    uint8_t *uc = malloc((size_t)rows * crow), *us = malloc((size_t)rows * srow);
    int bad = 0;
    for (int e = 0; e < c->E && !bad; e++) {
        nb_weight_desc wd = p.d.gate_up;
        wd.n = rows;
        wd.layout = NB_LAYOUT_PACKED;
        nb_weight_sizes sz;
        nb_weight_get_sizes(&wd, &sz);
        if (nb_unpack_host(ctx, &wd, gp + (size_t)e * ps.gate_up_expert_bytes, sz.packed_bytes, uc, us)) bad = 1;
        for (int64_t r = 0; r < rows && !bad; r++) {
            const int64_t i = 8 * (r / 16) + r % 8;
            int64_t rg, ru;
            rows_of(&p, i, &rg, &ru);
            const int64_t src = r % 16 < 8 ? rg : ru;
            const uint8_t *ec = p.guc + (size_t)e * p.sz.gate_up.codes_bytes + (size_t)src * crow;
            const uint8_t *es = p.gus + (size_t)e * p.sz.gate_up.scales_bytes + (size_t)src * srow;
            if (memcmp(uc + (size_t)r * crow, ec, crow) || memcmp(us + (size_t)r * srow, es, srow)) bad = 2;
        }
        nb_weight_desc dd = p.d.down;
        dd.layout = NB_LAYOUT_PACKED;
        uint8_t *dc = malloc(p.sz.down.codes_bytes), *ds = malloc(p.sz.down.scales_bytes);
        nb_weight_get_sizes(&dd, &sz);
        if (!bad && nb_unpack_host(ctx, &dd, dp + (size_t)e * ps.down_expert_bytes, sz.packed_bytes, dc, ds)) bad = 3;
        if (!bad && (memcmp(dc, p.dc + (size_t)e * p.sz.down.codes_bytes, p.sz.down.codes_bytes) ||
                     memcmp(ds, p.ds + (size_t)e * p.sz.down.scales_bytes, p.sz.down.scales_bytes)))
            bad = 4;
        free(dc);
        free(ds);
    }
    CHECK(!bad, "pack %s: unpacked bytes differ from the checkpoint's (%d): %s", what, bad, nb_last_error());
    /* the device entry points refuse a host context before touching anything */
    size_t ws = 0;
    CHECK(nb_moe_workspace_size(ctx, &d, &ws) == NB_ERR_NO_DEVICE, "pack %s: nb_moe_workspace_size on a host "
          "context is NB_ERR_NO_DEVICE (%s)", what, nb_last_error());
    free(uc);
    free(us);
    free(gp);
    free(dp);
    release(&p);
}

int main(int argc, char **argv) {
    const char *dump = argc == 3 && !strcmp(argv[1], "--dump") ? argv[2] : NULL;
    if (argc != 1 && !dump) {
        printf("usage: test_moe [--dump DIR]\n");
        return 2;
    }
    nb_context *ctx = NULL;
    if (nb_context_create(NB_DEVICE_NONE, &ctx) != NB_OK) {
        printf("cannot create a host context: %s\n", nb_last_error());
        return 1;
    }
    const nb_format fmts[3] = {NB_FORMAT_NVFP4, NB_FORMAT_MXFP4, NB_FORMAT_INT4};
    const nb_dtype dts[3] = {NB_DTYPE_F32, NB_DTYPE_BF16, NB_DTYPE_F16};
    const nb_moe_activation acts[2] = {NB_MOE_ACT_SWIGLU, NB_MOE_ACT_SWIGLU_OAI};
    int ncases = 0;
    /* m = 1..17 one by one, with E and top_k cycling */
    static const int Es[5] = {8, 16, 32, 64, 128}, Ks[8] = {1, 2, 3, 4, 5, 6, 7, 8};
    for (int m = 1; m <= 17; m++) {
        mcase c = {fmts[m % 3], Es[m % 5], Ks[m % 8], m, 64, 32, acts[m % 2], dts[m % 3], m % 3 != 0, m % 3};
        check_case(ctx, &c);
        ncases++;
    }
    /* larger m: every E with top-k up to 8, every format, activation and dtype */
    static const int64_t ms[4] = {31, 64, 100, 257};
    static const int64_t shapes[4][2] = {{64, 32}, {32, 64}, {96, 32}, {128, 64}}; /* H, I */
    int i = 0;
    for (int ei = 0; ei < 5; ei++)
        for (int ki = 0; ki < 4; ki++, i++) {
            static const int kk[4] = {1, 2, 4, 8};
            mcase c = {fmts[i % 3], Es[ei], kk[ki], ms[i % 4], shapes[i % 4][0], shapes[i % 4][1], acts[i % 2],
                       dts[(i / 2) % 3], (i / 3) % 2, i % 3};
            check_case(ctx, &c);
            ncases++;
        }
    /* the routing layout: blocks 1, 16, 64, 128 over the three routings */
    static const int32_t blocks[4] = {1, 16, 64, 128};
    for (int r = 0; r < 3; r++)
        for (int b = 0; b < 4; b++) {
            mcase c = {NB_FORMAT_MXFP4, Es[(r + b) % 5], Ks[(r * 4 + b) % 8], ms[b], 64, 32, acts[b % 2], dts[r],
                       b % 2, r};
            if (c.K > c.E) c.K = c.E;
            check_align(ctx, &c, blocks[b]);
        }
    {
        mcase c = {NB_FORMAT_NVFP4, 128, 8, 5, 32, 16, NB_MOE_ACT_SWIGLU, NB_DTYPE_BF16, 0, ROUTE_UNIFORM};
        check_align(ctx, &c, 64); /* 40 slots, 128 experts: most idle, one block per routed expert */
    }
    check_combine_order(ctx);
    check_nan(ctx);
    check_glu_host(ctx);
    {
        /* 7. packing for the GPU: both formats and layouts, H not a multiple of 128, 8 warps' worth of row blocks and less */
        const mcase packs[4] = {
            {NB_FORMAT_MXFP4, 4, 2, 3, 288, 96, NB_MOE_ACT_SWIGLU_OAI, NB_DTYPE_BF16, 1, ROUTE_UNIFORM},
            {NB_FORMAT_NVFP4, 3, 2, 3, 160, 48, NB_MOE_ACT_SWIGLU, NB_DTYPE_BF16, 0, ROUTE_UNIFORM},
            {NB_FORMAT_NVFP4, 2, 1, 1, 64, 144, NB_MOE_ACT_SWIGLU_OAI, NB_DTYPE_F16, 0, ROUTE_UNIFORM},
            {NB_FORMAT_MXFP4, 2, 2, 2, 256, 32, NB_MOE_ACT_SWIGLU, NB_DTYPE_F16, 0, ROUTE_SAME},
        };
        for (int k = 0; k < 4; k++) check_pack(ctx, &packs[k]);
        mcase ci = {NB_FORMAT_INT4, 2, 1, 1, 64, 32, NB_MOE_ACT_SWIGLU, NB_DTYPE_BF16, 0, ROUTE_UNIFORM};
        mprob p;
        if (make(&ci, &p)) {
            nb_moe_packed_sizes ps;
            CHECK(nb_moe_packed_get_sizes(&p.d, &ps) == NB_ERR_UNSUPPORTED, "int4 MoE weights have no GPU packing");
            release(&p);
        }
    }
    printf("%d MoE problems checked; float against f64: largest error / bound %.3g\n", ncases, g_worst_f32);
    if (dump) {
        mkdir(dump, 0755);
        /* gpt-oss (MXFP4, interleaved, biases) and Qwen3-MoE (NVFP4, concatenated) shaped, for the cross-check */
        const mcase cases[6] = {
            {NB_FORMAT_MXFP4, 8, 4, 37, 64, 32, NB_MOE_ACT_SWIGLU_OAI, NB_DTYPE_F32, 1, ROUTE_UNIFORM},
            {NB_FORMAT_MXFP4, 32, 4, 120, 96, 64, NB_MOE_ACT_SWIGLU_OAI, NB_DTYPE_F32, 1, ROUTE_SKEWED},
            {NB_FORMAT_MXFP4, 128, 8, 3, 64, 32, NB_MOE_ACT_SWIGLU_OAI, NB_DTYPE_F32, 1, ROUTE_UNIFORM},
            {NB_FORMAT_NVFP4, 16, 8, 50, 64, 48, NB_MOE_ACT_SWIGLU, NB_DTYPE_F32, 0, ROUTE_UNIFORM},
            {NB_FORMAT_NVFP4, 128, 8, 200, 32, 16, NB_MOE_ACT_SWIGLU, NB_DTYPE_F32, 0, ROUTE_SKEWED},
            {NB_FORMAT_NVFP4, 8, 1, 17, 48, 32, NB_MOE_ACT_SWIGLU, NB_DTYPE_F32, 0, ROUTE_SAME},
        };
        for (int k = 0; k < 6; k++) dump_case(ctx, dump, k, &cases[k]);
        printf("cases written to %s\n", dump);
    }
    nb_context_destroy(ctx);
    printf("%d passed, %d failed\n", g_pass, g_fail);
    return g_fail ? 1 : 0;
}
#endif /* TEST_MOE_NO_MAIN */
