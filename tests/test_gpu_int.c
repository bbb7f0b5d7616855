/* test_gpu_int.c - the integer formats (int4 with zero points, int4_sym,
 * int8) and bitsandbytes' table formats (nf4, bnb_fp4) on a real GPU:
 * nb_pack_v2 and nb_gemm's decode kernel (gemv_fp4.cu "INTEGER FORMATS",
 * "TABLE FORMATS").
 *
 *   test_gpu_int [--quick] [--format NAME] [--m-max M]    exit 0 pass, 1 fail, 77 no device (skipped)
 *   (--format: only the cases of one format, --m-max: only batch sizes up
 *   to M, e.g. under compute-sanitizer)
 *
 * For each format, activation type (BF16, FP16), scale type (integers: F16,
 * BF16; tables: F32) and group (integers: 32, 64, 128, one per row; tables:
 * bitsandbytes' blocks 32, 64, 128, 256, 1024), on ragged layers (n not a
 * multiple of 16, k not a multiple of 128):
 *   - nb_pack_v2 on the device writes the bytes of nb_pack_host_v2 and the
 *     zero-point range into the descriptor;
 *   - nb_gemm for m = 1..32 and larger m (on Hopper the tensor-core
 *     kernel, except integer weights with BF16 scales and F16 activations:
 *     several launches of the decode kernel) against
 *     nb_gemm_host_f64_v2 with the rule of test_gpu.c: |y - ref| <=
 *     ulp_out(|ref|) + 2^-14 * max|ref| per element (output rounding plus
 *     float accumulation in another order; the decode kernel's weight
 *     operands q - z are exact and its scales FP32); the tensor-core kernel
 *     adds the rounding of its weights (DESIGN.md 4.2.3): sum over k of |x|
 *     |w16 - w|, w16 = r16((q - z) r16(s)) (s rounded only when the scale
 *     type differs) or r16(r16(v) r16(absmax)) + 2^-24 |v absmax|, r16 the
 *     rounding to the activation dtype, v the table value; the decode
 *     kernel's table formats add the rounding of their operands (DESIGN.md
 *     4.2.2): sum over k of |x| |absmax| (|r16(v) - v| + 2^-24 |v|), 2^-24
 *     |v| |absmax| the reference's own float32 product;
 *   - the staged decode kernel (kernel 2) forced at every m = 5..32 where
 *     the planner chose kernel 1, the tensor-core kernel's 32-token tile
 *     (Hopper) at every m = 17..32 where it chose another kernel, and every
 *     decode configuration offered at
 *     m = 5, 16 and 27 (the sweep);
 *   - the path: the tensor-core kernel runs exactly where it should
 *     (Hopper, m >= 25 on these layers, the table formats m >= 17; not for integer weights with BF16
 *     scales and F16 activations); with NIBBLE_PATH=mma every call runs the
 *     mma.sync kernel (same weight rounding and bound) or is refused for
 *     that mix, and the refusal checks are left out;
 *     on the middle layer every configuration nb_gemm_list_configs offers
 *     at m = 64 and 300 (tile widths, k splits, both split sums; the table
 *     formats in blocks of 64);
 *     outputs are poisoned (NaN) first, so an unwritten element fails;
 *   - zero points at their extremes: rows with z = 0 and z = 15, and with
 *     FP16 activations z = 255 (any byte; BF16 takes z <= 127 and nb_gemm
 *     refuses more with NB_ERR_UNSUPPORTED);
 *   - a NaN scale (absmax) gives NaN in its row and only there;
 *   - the refusals: nb_pack for int4 (zero points need nb_pack_v2), the
 *     tensor-core path for m <= 16, 16-token tiles and F16 activations
 *     with BF16 scales, the mma and staged paths, k not a multiple of 8;
 *     nb_dequantize and the naive reference for the table formats. */
#include "nibble.h"
#include "check.h"
#include "gpu_testlib.h"

#include <math.h>

static double ulp_out(nb_dtype t, double a) {
    int e;
    frexp(a, &e);
    int q = e - (t == NB_DTYPE_BF16 ? 8 : 11), minexp = t == NB_DTYPE_BF16 ? -133 : -24;
    return ldexp(1.0, q < minexp ? minexp : q);
}

/* v rounded to the 16-bit dtype t, to nearest even (subnormals, overflow
 * to infinity). */
static double round16(nb_dtype t, double v) {
    if (v == 0 || !isfinite(v)) return v;
    int e;
    frexp(v, &e);
    const int bits = t == NB_DTYPE_BF16 ? 8 : 11, minq = t == NB_DTYPE_BF16 ? -133 : -24;
    const double q = ldexp(1.0, e - bits < minq ? minq : e - bits), r = nearbyint(v / q) * q;
    const double big = t == NB_DTYPE_BF16 ? ldexp(255.0 / 128.0, 127) : 65504.0;
    return fabs(r) > big ? copysign(INFINITY, v) : r;
}

/* The bit pattern of v rounded to the 16-bit dtype t (v finite). */
static uint16_t gt_to16(nb_dtype t, double v) {
    const double r = round16(t, v);
    if (t == NB_DTYPE_BF16) {
        const float f = (float)r;
        uint32_t u;
        memcpy(&u, &f, 4);
        return (uint16_t)(u >> 16);
    }
    const uint16_t sgn = r < 0 ? 0x8000 : 0;
    const double a = fabs(r);
    if (isinf(a)) return sgn | 0x7C00;
    if (a < ldexp(1.0, -14)) return sgn | (uint16_t)(a / ldexp(1.0, -24));
    int e;
    const double f = frexp(a, &e);
    return sgn | (uint16_t)((e - 1 + 15) << 10) | (uint16_t)((f * 2.0 - 1.0) * 1024.0);
}

/* Whether the tensor-core path is there for the integer formats (Hopper
 * with an sm_90a build): path tc accepted at m = 64 on a small int4 layer.
 * g_mma: NIBBLE_PATH=mma, every call on the mma.sync kernel. */
static int g_tc_int = -1, g_mma;
static int64_t g_mmax = INT64_MAX; /* --m-max: the batch sizes run stop here */
static int64_t g_mmin = 1;         /* --m-min: and start here (a sanitizer run split by m) */
static int g_wave16; /* calls on kernel 2's stream-K wave at 9..16 tokens (gt_is_k2_wave) */
static int g_balanced; /* calls of kernel 1 on a balanced wave (plan.c: CTAs with warps idle) */
static int tc_for_int(nb_context *ctx) {
    if (g_tc_int >= 0) return g_tc_int;
    nb_weight_desc d;
    nb_weight_desc_init(&d, NB_FORMAT_INT4, 128, 256);
    d.layout = NB_LAYOUT_PACKED;
    d.scale_exp_min = d.scale_exp_max = 8;
    nb_gemm_desc g;
    nb_gemm_config cfg;
    memset(&cfg, 0, sizeof cfg);
    cfg.path = NB_GEMM_PATH_TENSOR_CORE;
    size_t ws = 0;
    g_tc_int = nb_gemm_desc_init(&g, &d, 64, NB_DTYPE_BF16, NB_DTYPE_BF16) == NB_OK &&
               nb_gemm_workspace_size_ex(ctx, &g, &cfg, &ws) == NB_OK;
    printf("tensor-core path for the integer formats: %s\n", g_tc_int ? "yes" : "no (decode kernel for every m)");
    return g_tc_int;
}

typedef struct tcase {
    nb_format fmt;
    nb_dtype act;
    nb_scale_type st;
    int64_t n, k;
    int group; /* 0: one per row */
} tcase;

static int is_table(nb_format f) { return f == NB_FORMAT_NF4 || f == NB_FORMAT_BNB_FP4; }

/* Per k of row r: |absmax| (|r16(v) - v| + 2^-24 |v|), the table formats'
 * weight term of the bound (see the top). */
static void table_terms(const tcase *c, const nb_weight_desc *d, const uint8_t *codes, const uint8_t *scales,
                        int64_t r, double *out) {
    const nb_element_type e = c->fmt == NB_FORMAT_NF4 ? NB_ELEMENT_NF4 : NB_ELEMENT_FP4_BNB;
    double dv[16];
    for (int q = 0; q < 16; q++) { /* r16: round to 8 (BF16) or 11 (FP16) significant bits, to nearest even */
        const double v = nb_element_to_float(e, (uint8_t)q);
        int ex = 0;
        frexp(v, &ex);
        const double ulp = ldexp(1.0, ex - (c->act == NB_DTYPE_BF16 ? 8 : 11)); /* (every value is normal) */
        const double v16 = v == 0 ? 0 : nearbyint(v / ulp) * ulp;
        dv[q] = fabs(v16 - v) + ldexp(fabs(v), -24);
    }
    const int64_t k = d->k, ng = k / d->group_size;
    for (int64_t j = 0; j < k; j++) {
        float a;
        memcpy(&a, scales + 4 * (size_t)(r * ng + j / d->group_size), 4);
        const size_t i = (size_t)(r * k + j);
        out[j] = fabs((double)a) * dv[(codes[i / 2] >> (4 * (i & 1))) & 15];
    }
}

/* Per k of row r: the tensor-core kernel's weight term of the bound (see
 * the top): integers |r16((q - z) r16(s)) - (q - z) s| (s rounded only when
 * its type is not the activation dtype), tables |r16(r16(v) r16(absmax)) -
 * v absmax| + 2^-24 |v absmax|. */
static void tc_terms(const tcase *c, const nb_weight_desc *d, const uint8_t *codes, const uint8_t *scales,
                     const uint8_t *zeros, int64_t r, double *out) {
    const int64_t k = d->k, ng = k / d->group_size;
    if (is_table(c->fmt)) {
        const nb_element_type e = c->fmt == NB_FORMAT_NF4 ? NB_ELEMENT_NF4 : NB_ELEMENT_FP4_BNB;
        for (int64_t j = 0; j < k; j++) {
            float a;
            memcpy(&a, scales + 4 * (size_t)(r * ng + j / d->group_size), 4);
            const size_t i = (size_t)(r * k + j);
            const double v = nb_element_to_float(e, (uint8_t)((codes[i / 2] >> (4 * (i & 1))) & 15)), va = v * a;
            out[j] = fabs(round16(c->act, round16(c->act, v) * round16(c->act, a)) - va) + ldexp(fabs(va), -24);
        }
        return;
    }
    const nb_dtype st = c->st == NB_SCALE_BF16 ? NB_DTYPE_BF16 : NB_DTYPE_F16;
    for (int64_t j = 0; j < k; j++) {
        const size_t gi = (size_t)(r * ng + j / d->group_size), i = (size_t)(r * k + j);
        const double sc = gt_from16(st, (uint16_t)(scales[2 * gi] | scales[2 * gi + 1] << 8));
        const int nib = (codes[i / 2] >> (4 * (i & 1))) & 15;
        const int q = c->fmt == NB_FORMAT_INT8       ? (int)(int8_t)codes[i]
                      : c->fmt == NB_FORMAT_INT4_SYM ? (nib >= 8 ? nib - 16 : nib)
                                                     : nib - zeros[gi];
        const double s16 = st == c->act ? sc : round16(c->act, sc);
        out[j] = fabs(round16(c->act, q * s16) - q * sc);
    }
}

/* Per k of row r of int4_hqq: the kernels' weight against the format's value
 * v = r(r(q - z) s) (each step in the scale type T, docs/formats.md 5.5):
 * the operand o = r16(q - z16) (z16: z, rounded to the activation dtype
 * when T is not it), then the decode kernel's o s in FP32 (|o s - v| +
 * 2^-24 |o s|) or the tensor-core kernel's r16(o s16) (|r16(o s16) - v|). */
static void hqq_terms(const tcase *c, const nb_weight_desc *d, const uint8_t *codes, const uint8_t *scales,
                      const uint8_t *zeros, int64_t r, int tc, double *out) {
    const int64_t k = d->k, ng = k / d->group_size;
    const nb_dtype st = c->st == NB_SCALE_BF16 ? NB_DTYPE_BF16 : NB_DTYPE_F16;
    for (int64_t j = 0; j < k; j++) {
        const size_t gi = (size_t)(r * ng + j / d->group_size), i = (size_t)(r * k + j);
        const double sc = gt_from16(st, (uint16_t)(scales[2 * gi] | scales[2 * gi + 1] << 8));
        const double z = gt_from16(st, (uint16_t)(zeros[2 * gi] | zeros[2 * gi + 1] << 8));
        const int q = (codes[i / 2] >> (4 * (i & 1))) & 15;
        const double v = round16(st, round16(st, q - z) * sc);
        const double z16 = st == c->act ? z : round16(c->act, z), o = round16(c->act, q - z16);
        if (tc) {
            const double s16 = st == c->act ? sc : round16(c->act, sc);
            out[j] = fabs(round16(c->act, o * s16) - v);
        } else {
            out[j] = fabs(o * sc - v) + ldexp(fabs(o * sc), -24);
        }
    }
}

/* sum over k of |x[i, j]| * per-k term of row r, for every row i < m and
 * output row r: the weight term of the bound per output element. */
static double *weight_term(const tcase *c, const nb_weight_desc *d, const uint8_t *codes, const uint8_t *scales,
                           const uint8_t *zeros, const uint16_t *x, int64_t m, int tc) {
    const int64_t n = d->n, k = d->k;
    double *w = calloc((size_t)(m * n), sizeof *w), *row = malloc(sizeof(double) * (size_t)k);
    for (int64_t r = 0; r < n; r++) {
        if (c->fmt == NB_FORMAT_INT4_HQQ) hqq_terms(c, d, codes, scales, zeros, r, tc, row);
        else if (tc) tc_terms(c, d, codes, scales, zeros, r, row);
        else table_terms(c, d, codes, scales, r, row);
        for (int64_t i = 0; i < m; i++) {
            double sum = 0;
            for (int64_t j = 0; j < k; j++) sum += fabs((double)gt_from16(c->act, x[i * k + j])) * row[j];
            w[i * n + r] = sum;
        }
    }
    free(row);
    return w;
}

/* y (m x n, from the device) against the float64 reference under the rule
 * at the top; wterm may be NULL.  Returns the number of bad elements. */
static int check_out(const tcase *c, const char *what, const char *cfg, int64_t m, int64_t n, const uint16_t *y,
                     const double *ref, const double *wterm) {
    double maxref = 0;
    for (int64_t i = 0; i < m * n; i++)
        if (isfinite(ref[i]) && fabs(ref[i]) > maxref) maxref = fabs(ref[i]);
    int bad = 0;
    int64_t wi = -1;
    double worst = 0;
    for (int64_t i = 0; i < m * n; i++) {
        const double v = gt_from16(c->act, y[i]), r = ref[i];
        int ok;
        double e = 0;
        if (isnan(r)) ok = isnan(v); /* the NaN-scale row */
        else {
            const double tol = ulp_out(c->act, fabs(r)) + ldexp(maxref, -14) + (wterm ? wterm[i] : 0);
            e = fabs(v - r) / tol;
            ok = e <= 1.0; /* (NaN fails) */
        }
        if (!ok) bad++;
        if (!ok && (wi < 0 || e > worst)) worst = e, wi = i;
    }
    CHECK(bad == 0, "%s m=%lld [%s]: %d bad, worst at [%lld,%lld] got %g want %g (err/tol %.3g)", what, (long long)m,
          cfg, bad, wi < 0 ? -1LL : (long long)(wi / n), wi < 0 ? -1LL : (long long)(wi % n),
          wi < 0 ? 0.0 : (double)gt_from16(c->act, y[wi]), wi < 0 ? 0.0 : ref[wi], worst);
    return bad;
}

/* NIBBLE_PATH=mma with BF16 scales and F16 activations: nb_gemm refuses
 * the layer, naming the reason. */
static void mma_refused(nb_context *ctx, const tcase *c) {
    nb_weight_desc d;
    nb_weight_desc_init(&d, c->fmt, c->n, c->k);
    d.group_size = c->group ? c->group : (int32_t)c->k;
    d.scale_type = c->st;
    d.layout = NB_LAYOUT_PACKED;
    d.scale_exp_min = 0, d.scale_exp_max = 15;
    nb_gemm_desc g;
    size_t ws = 0;
    GT_NB(nb_gemm_desc_init(&g, &d, 64, c->act, c->act));
    CHECK(nb_gemm_workspace_size(ctx, &g, &ws) == NB_ERR_UNSUPPORTED && strstr(nb_last_error(), "BF16 scales"),
          "NIBBLE_PATH=mma, BF16 scales with F16 activations: refused: %s", nb_last_error());
}

/* ms: the batch sizes run with the planner's choice (ascending); sweep: the
 * ones also run with every configuration nb_gemm_list_configs offers. */
static void run_case(nb_context *ctx, const tcase *c, const int64_t *ms, int nms, const int64_t *sweep, int nsweep,
                     uint64_t seed) {
    const int hqq = c->fmt == NB_FORMAT_INT4_HQQ, zp = c->fmt == NB_FORMAT_INT4 || hqq, tab = is_table(c->fmt);
    nb_weight_desc d;
    nb_weight_desc_init(&d, c->fmt, c->n, 128);
    d.k = c->k;
    d.group_size = c->group ? c->group : (int32_t)c->k;
    d.scale_type = c->st;
    char what[128];
    snprintf(what, sizeof what, "%s %s scales=%s n=%lld k=%lld group=%d",
             hqq ? "int4_hqq" : zp ? "int4" : c->fmt == NB_FORMAT_INT4_SYM ? "int4_sym" : c->fmt == NB_FORMAT_INT8 ? "int8"
                 : c->fmt == NB_FORMAT_NF4 ? "nf4" : "bnb_fp4",
             c->act == NB_DTYPE_BF16 ? "bf16" : "f16",
             c->st == NB_SCALE_BF16 ? "bf16" : c->st == NB_SCALE_F32 ? "f32" : "f16", (long long)c->n,
             (long long)c->k, (int)d.group_size);
    nb_weight_sizes_v2 sz;
    GT_NB(nb_weight_get_sizes_v2(&d, &sz));
    const int64_t n = c->n, k = c->k, ng = k / d.group_size;
    int64_t mmax = ms[nms - 1];
    for (int i = 0; i < nsweep; i++) mmax = sweep[i] > mmax ? sweep[i] : mmax;
    uint8_t *codes = malloc(sz.codes_bytes), *scales = malloc(sz.scales_bytes), *zeros = zp ? malloc(sz.zeros_bytes) : NULL;
    uint8_t *hp = malloc(sz.packed_bytes), *dp_h = malloc(sz.packed_bytes);
    uint16_t *x = malloc(2 * (size_t)(mmax * k)), *y = malloc(2 * (size_t)(mmax * n));
    double *ref = malloc(sizeof(double) * (size_t)(mmax * n));
    for (size_t i = 0; i < sz.codes_bytes; i++) codes[i] = (uint8_t)gt_rand(&seed);
    for (int64_t i = 0; i < n * ng && tab; i++) { /* absmax: 2^-6 .. 2^2, one in eight negative */
        const uint32_t e = 121 + (uint32_t)(gt_rand(&seed) % 8), neg = (gt_rand(&seed) % 8) == 0;
        const uint32_t bits = neg << 31 | e << 23 | (uint32_t)(gt_rand(&seed) & 0x7FFFFF);
        memcpy(scales + 4 * i, &bits, 4);
    }
    for (int64_t i = 0; i < n * ng && !tab; i++) { /* +-2^-8 .. 2^-4 in the scale type */
        const int e = -8 + (int)(gt_rand(&seed) % 4), neg = (int)(gt_rand(&seed) & 1);
        const uint16_t mant = (uint16_t)(gt_rand(&seed) & 0x7F);
        const uint16_t h = c->st == NB_SCALE_BF16 ? (uint16_t)(neg << 15 | (127 + e) << 7 | mant)
                                                  : (uint16_t)(neg << 15 | (15 + e) << 10 | mant << 3);
        scales[2 * i] = (uint8_t)h, scales[2 * i + 1] = (uint8_t)(h >> 8);
    }
    if (hqq) /* float zero points in the scale type: 0, 15, 7.5, -3.25, 100 on some rows, else -0.5 .. 15.5 */
        for (int64_t r = 0; r < n; r++)
            for (int64_t j = 0; j < ng; j++) {
                static const float fixed[5] = {0.0f, 15.0f, 7.5f, -3.25f, 100.0f};
                const int kind = (int)(r % 8);
                const float z = kind < 5 ? fixed[kind] : -0.5f + 16.0f * (float)(gt_rand(&seed) % 65536) / 65536.0f;
                const uint16_t h = gt_to16(c->st == NB_SCALE_BF16 ? NB_DTYPE_BF16 : NB_DTYPE_F16, z);
                zeros[2 * (r * ng + j)] = (uint8_t)h, zeros[2 * (r * ng + j) + 1] = (uint8_t)(h >> 8);
            }
    else if (zp)
        for (int64_t r = 0; r < n; r++)
            for (int64_t j = 0; j < ng; j++) { /* extremes on some rows: 0, 15, and 255 where FP16 takes it */
                const int kind = (int)(r % 5);
                zeros[r * ng + j] = kind == 0 ? 0 : kind == 1 ? 15 : kind == 2 && c->act == NB_DTYPE_F16 ? 255
                                                                                 : (uint8_t)(gt_rand(&seed) % 16);
            }
    const int nan_row = (int)(n / 2); /* one NaN scale: its row's outputs are NaN */
    if (tab) {
        const uint32_t qnan = 0x7FC00001u;
        memcpy(scales + 4 * (size_t)(nan_row * ng), &qnan, 4);
    } else {
        scales[2 * (nan_row * ng)] = 0x01, scales[2 * (nan_row * ng) + 1] = c->st == NB_SCALE_BF16 ? 0x7F : 0x7E;
        if (c->st == NB_SCALE_BF16) scales[2 * (nan_row * ng)] = 0xC1;
    }
    for (int64_t i = 0; i < mmax * k; i++) x[i] = gt_act16(c->act, gt_rand(&seed));

    uint8_t *dc, *ds, *dz = NULL;
    void *dpk, *dx, *dy;
    GT_CUDA(cudaMalloc((void **)&dc, sz.codes_bytes));
    GT_CUDA(cudaMalloc((void **)&ds, sz.scales_bytes));
    if (zp) GT_CUDA(cudaMalloc((void **)&dz, sz.zeros_bytes));
    GT_CUDA(cudaMalloc(&dpk, sz.packed_bytes));
    GT_CUDA(cudaMalloc(&dx, 2 * (size_t)(mmax * k)));
    GT_CUDA(cudaMalloc(&dy, 2 * (size_t)(mmax * n)));
    GT_CUDA(cudaMemcpy(dc, codes, sz.codes_bytes, cudaMemcpyHostToDevice));
    GT_CUDA(cudaMemcpy(ds, scales, sz.scales_bytes, cudaMemcpyHostToDevice));
    if (zp) GT_CUDA(cudaMemcpy(dz, zeros, sz.zeros_bytes, cudaMemcpyHostToDevice));
    GT_CUDA(cudaMemcpy(dx, x, 2 * (size_t)(mmax * k), cudaMemcpyHostToDevice));

    /* pack: device bytes = host bytes, and the zero-point range */
    const nb_weight_data hw = {.codes = codes, .scales = scales, .zeros = zeros};
    const nb_weight_data dw = {.codes = dc, .scales = ds, .zeros = dz};
    nb_weight_desc hd = d, dd = d;
    GT_NB(nb_pack_host_v2(ctx, &hd, &hw, hp, sz.packed_bytes));
    GT_CUDA(cudaMemset(dpk, 0xA5, sz.packed_bytes)); /* every byte must be written */
    GT_NB(nb_pack_v2(ctx, &dd, &dw, dpk, sz.packed_bytes, NULL));
    GT_CUDA(cudaMemcpy(dp_h, dpk, sz.packed_bytes, cudaMemcpyDeviceToHost));
    CHECK(!memcmp(hp, dp_h, sz.packed_bytes), "%s: nb_pack_v2 bytes differ from nb_pack_host_v2", what);
    CHECK(dd.layout == NB_LAYOUT_PACKED && dd.scale_exp_min == hd.scale_exp_min && dd.scale_exp_max == hd.scale_exp_max,
          "%s: descriptor after nb_pack_v2 (zero range %d..%d, host %d..%d)", what, (int)dd.scale_exp_min,
          (int)dd.scale_exp_max, (int)hd.scale_exp_min, (int)hd.scale_exp_max);

    /* the float64 reference for all mmax rows */
    nb_gemm_desc gr;
    GT_NB(nb_gemm_desc_init(&gr, &d, mmax, c->act, c->act));
    GT_NB(nb_gemm_host_f64_v2(ctx, &gr, x, &hw, NULL, ref));
    size_t ws = 0;
    void *dws = NULL;
    nb_gemm_desc g;
    GT_NB(nb_gemm_desc_init(&g, &dd, 1, c->act, c->act));
    GT_NB(nb_gemm_workspace_size(ctx, &g, &ws));
    if (ws) {
        GT_CUDA(cudaMalloc(&dws, ws));
        GT_CUDA(cudaMemset(dws, 0, ws));
    }
    /* the weight terms of the bound, per output element: the table formats'
     * operands, the integer formats' tensor-core weights */
    double *wtab = tab || hqq ? weight_term(c, &d, codes, scales, zeros, x, mmax, 0) : NULL;
    double *wtc = NULL;
    const int served = !(c->act == NB_DTYPE_F16 && c->st == NB_SCALE_BF16); /* by the tensor-core kernels */
    const int tc_here = tc_for_int(ctx) && served && !g_mma;
    nb_device_info info;
    GT_NB(nb_context_device_info(ctx, &info));
    const int small = (c->n + 127) / 128 < info.sm_count && c->k < 16384;
    if ((tc_here && mmax >= 17) || (g_mma && served)) wtc = weight_term(c, &d, codes, scales, zeros, x, mmax, 1);
    char cfgs[512];
    for (int mi = 0; mi < nms && ms[mi] <= g_mmax; mi++) {
        if (ms[mi] < g_mmin) continue;
        const int64_t m = ms[mi];
        g.m = m;
        GT_CUDA(cudaMemset(dy, 0xFF, 2 * (size_t)(m * n)));
        nb_status st = nb_gemm(ctx, &g, dx, dpk, NULL, dy, dws, ws, NULL);
        CHECK(st == NB_OK, "%s m=%lld: nb_gemm: %s", what, (long long)m, nb_last_error());
        if (st != NB_OK) continue;
        GT_NB(nb_gemm_last_config(ctx, cfgs, sizeof cfgs));
        g_wave16 += gt_is_k2_wave(cfgs, 2, 0);
        g_balanced += gt_is_k1_balanced(cfgs);
        const int on_tc = strstr(cfgs, "gemm_sm90<") != NULL || strstr(cfgs, "gemm_sm80<") != NULL;
        /* (the planner's rule, plan.c int_tc_auto: past m = 32, and on layers of fewer 128-row tiles than
         * SMs (and k < 16384) from m = 17 where decode kernel 2, one CTA per SM over 256-row tiles, would
         * run short: at 17..24 tokens under 6 chunks a CTA (the table formats: 16), at 25..32 always for
         * the table formats, int8 and int4_hqq, under 16 chunks for int4 and int4_sym; every m with
         * NIBBLE_PATH=mma) */
        const int64_t per = info.sm_count / (((c->n + 15) / 16 + 15) / 16), runs = per ? (c->k + 127) / 128 / per : 0;
        const int int4 = c->fmt == NB_FORMAT_INT4 || c->fmt == NB_FORMAT_INT4_SYM;
        const int want_tc =
            g_mma || (tc_here && (m > 32 || (small && m >= 17 && (m <= 24 ? runs < (tab ? 16 : 6) : !int4 || runs < 16))));
        CHECK(on_tc == want_tc && (!g_mma || strstr(cfgs, "gemm_sm80<")), "%s m=%lld: %s, expected the %s", what,
              (long long)m, cfgs, g_mma ? "mma.sync kernel" : want_tc ? "tensor-core kernel" : "decode kernel");
        GT_CUDA(cudaMemcpy(y, dy, 2 * (size_t)(m * n), cudaMemcpyDeviceToHost));
        check_out(c, what, cfgs, m, n, y, ref, on_tc ? wtc : wtab);
        /* the staged decode kernel (kernel 2) as well, where the planner chose kernel 1 */
        if (m <= 32 && !g_mma && !strstr(cfgs, "gemv_fp4_xs<")) {
            nb_gemm_config sc;
            memset(&sc, 0, sizeof sc);
            sc.path = NB_GEMM_PATH_DECODE, sc.variant = 1, sc.kw = 1, sc.rpw = 2;
            size_t need = 0;
            st = nb_gemm_workspace_size_ex(ctx, &g, &sc, &need);
            CHECK(st == NB_OK, "%s m=%lld: staged variant: %s", what, (long long)m, nb_last_error());
            void *sws = NULL;
            if (st == NB_OK && need) {
                GT_CUDA(cudaMalloc(&sws, need));
                GT_CUDA(cudaMemset(sws, 0, need));
            }
            GT_CUDA(cudaMemset(dy, 0xFF, 2 * (size_t)(m * n)));
            if (st == NB_OK) st = nb_gemm_ex(ctx, &g, &sc, dx, dpk, NULL, dy, sws, need, NULL);
            CHECK(st == NB_OK, "%s m=%lld: staged variant run: %s", what, (long long)m, nb_last_error());
            if (st == NB_OK) {
                GT_NB(nb_gemm_last_config(ctx, cfgs, sizeof cfgs));
                CHECK(strstr(cfgs, "gemv_fp4_xs<") != NULL, "%s m=%lld: %s, expected the staged kernel", what,
                      (long long)m, cfgs);
                GT_CUDA(cudaMemcpy(y, dy, 2 * (size_t)(m * n), cudaMemcpyDeviceToHost));
                check_out(c, what, cfgs, m, n, y, ref, wtab);
            }
            if (sws) GT_CUDA(cudaFree(sws));
        }
        /* the tensor-core kernel's 32-token tile at 17..32 tokens, where the planner chose another kernel */
        if (tc_here && m >= 17 && m <= 32 && !strstr(cfgs, "gemm_sm90<")) {
            nb_gemm_config tcf;
            memset(&tcf, 0, sizeof tcf);
            tcf.path = NB_GEMM_PATH_TENSOR_CORE, tcf.bn = 32;
            size_t need = 0;
            st = nb_gemm_workspace_size_ex(ctx, &g, &tcf, &need);
            CHECK(st == NB_OK, "%s m=%lld: path tc, 32-token tile: %s", what, (long long)m, nb_last_error());
            void *tws = NULL;
            if (st == NB_OK && need) {
                GT_CUDA(cudaMalloc(&tws, need));
                GT_CUDA(cudaMemset(tws, 0, need));
            }
            GT_CUDA(cudaMemset(dy, 0xFF, 2 * (size_t)(m * n)));
            if (st == NB_OK) st = nb_gemm_ex(ctx, &g, &tcf, dx, dpk, NULL, dy, tws, need, NULL);
            CHECK(st == NB_OK, "%s m=%lld: path tc, 32-token tile run: %s", what, (long long)m, nb_last_error());
            if (st == NB_OK) {
                GT_NB(nb_gemm_last_config(ctx, cfgs, sizeof cfgs));
                CHECK(strstr(cfgs, "gemm_sm90<") != NULL && (strstr(cfgs, "x32>") != NULL), "%s m=%lld: %s, expected the "
                      "tensor-core kernel's 32-token tile", what, (long long)m, cfgs);
                GT_CUDA(cudaMemcpy(y, dy, 2 * (size_t)(m * n), cudaMemcpyDeviceToHost));
                check_out(c, what, cfgs, m, n, y, ref, wtc);
            }
            if (tws) GT_CUDA(cudaFree(tws));
        }
    }
    /* every configuration offered at the sweep's batch sizes */
    for (int si = 0; si < nsweep && sweep[si] <= g_mmax; si++) {
        if (sweep[si] < g_mmin) continue;
        const int64_t m = sweep[si];
        g.m = m;
        nb_gemm_config cf[64];
        size_t ncf = 0;
        GT_NB(nb_gemm_list_configs(ctx, &g, cf, 64, &ncf));
        int ntc = 0, nxs = 0;
        for (size_t ci = 0; ci < ncf && ci < 64; ci++) {
            size_t need = 0;
            if (nb_gemm_workspace_size_ex(ctx, &g, &cf[ci], &need) != NB_OK) {
                CHECK(0, "%s m=%lld: offered configuration %zu refused: %s", what, (long long)m, ci, nb_last_error());
                continue;
            }
            void *cws = NULL;
            if (need) {
                GT_CUDA(cudaMalloc(&cws, need));
                GT_CUDA(cudaMemset(cws, 0, need));
            }
            GT_CUDA(cudaMemset(dy, 0xFF, 2 * (size_t)(m * n)));
            nb_status st = nb_gemm_ex(ctx, &g, &cf[ci], dx, dpk, NULL, dy, cws, need, NULL);
            CHECK(st == NB_OK, "%s m=%lld: configuration %zu: %s", what, (long long)m, ci, nb_last_error());
            if (st == NB_OK) {
                GT_NB(nb_gemm_last_config(ctx, cfgs, sizeof cfgs));
                const int on_tc = strstr(cfgs, "gemm_sm90<") != NULL || strstr(cfgs, "gemm_sm80<") != NULL;
                ntc += on_tc;
                nxs += strstr(cfgs, "gemv_fp4_xs<") != NULL;
                GT_CUDA(cudaMemcpy(y, dy, 2 * (size_t)(m * n), cudaMemcpyDeviceToHost));
                check_out(c, what, cfgs, m, n, y, ref, on_tc ? wtc : wtab);
            }
            if (cws) GT_CUDA(cudaFree(cws));
        }
        CHECK(!tc_here || m < 17 || ntc >= 3, "%s m=%lld: %d tensor-core configurations offered (want several)", what,
              (long long)m, ntc);
        CHECK(g_mma || m < 5 || m > 32 || nxs >= 2, "%s m=%lld: %d staged decode configurations offered (want several)",
              what, (long long)m, nxs);
    }
    if (dws) GT_CUDA(cudaFree(dws));
    GT_CUDA(cudaFree(dc));
    GT_CUDA(cudaFree(ds));
    GT_CUDA(cudaFree(dpk));
    GT_CUDA(cudaFree(dx));
    GT_CUDA(cudaFree(dy));
    if (dz) GT_CUDA(cudaFree(dz));
    free(codes), free(scales), free(zeros), free(hp), free(dp_h), free(x), free(y), free(ref), free(wtab), free(wtc);
}

/* What nb_gemm and nb_pack refuse for the integer formats. */
static void test_refusals(nb_context *ctx) {
    enum { N = 32, K = 256 };
    nb_weight_desc d;
    nb_weight_desc_init(&d, NB_FORMAT_INT4, N, K);
    nb_weight_sizes_v2 sz;
    GT_NB(nb_weight_get_sizes_v2(&d, &sz));
    uint8_t *dc, *ds, *dz;
    void *dpk, *dx, *dy;
    GT_CUDA(cudaMalloc((void **)&dc, sz.codes_bytes));
    GT_CUDA(cudaMalloc((void **)&ds, sz.scales_bytes));
    GT_CUDA(cudaMalloc((void **)&dz, sz.zeros_bytes));
    GT_CUDA(cudaMalloc(&dpk, sz.packed_bytes));
    GT_CUDA(cudaMalloc(&dx, 2 * 64 * K));
    GT_CUDA(cudaMalloc(&dy, 2 * 64 * N));
    GT_CUDA(cudaMemset(dc, 0, sz.codes_bytes));
    GT_CUDA(cudaMemset(ds, 0, sz.scales_bytes));
    GT_CUDA(cudaMemset(dz, 200, sz.zeros_bytes)); /* zero points above 127 */
    nb_weight_desc p = d;
    CHECK(nb_pack(ctx, &p, dc, ds, dpk, sz.packed_bytes, NULL) == NB_ERR_UNSUPPORTED &&
              strstr(nb_last_error(), "nb_pack_v2"), "nb_pack refuses int4: %s", nb_last_error());
    const nb_weight_data w = {.codes = dc, .scales = ds, .zeros = dz};
    GT_NB(nb_pack_v2(ctx, &p, &w, dpk, sz.packed_bytes, NULL));
    CHECK(p.scale_exp_min == 200 && p.scale_exp_max == 200, "zero range %d..%d", (int)p.scale_exp_min,
          (int)p.scale_exp_max);
    nb_gemm_desc g;
    GT_NB(nb_gemm_desc_init(&g, &p, 4, NB_DTYPE_BF16, NB_DTYPE_BF16));
    CHECK(nb_gemm_can_implement(ctx, &g) == NB_ERR_UNSUPPORTED, "bf16 with zero points 200: %s", nb_last_error());
    g.act_dtype = g.out_dtype = NB_DTYPE_F16;
    CHECK(nb_gemm_can_implement(ctx, &g) == NB_OK, "f16 with zero points 200: %s", nb_last_error());
    size_t ws = 1;
    nb_gemm_config cfg;
    memset(&cfg, 0, sizeof cfg);
    cfg.path = NB_GEMM_PATH_TENSOR_CORE;
    const int tc = tc_for_int(ctx);
    g.m = 64;
    CHECK((nb_gemm_workspace_size_ex(ctx, &g, &cfg, &ws) == NB_OK) == tc, "path tc at m = 64 %s: %s",
          tc ? "accepted" : "refused", nb_last_error());
    g.m = 16;
    CHECK(nb_gemm_workspace_size_ex(ctx, &g, &cfg, &ws) == NB_ERR_UNSUPPORTED && strstr(nb_last_error(), "m >= 17"),
          "path tc at m = 16 refused: %s", nb_last_error());
    g.m = 64, cfg.bn = 16;
    CHECK(nb_gemm_workspace_size_ex(ctx, &g, &cfg, &ws) == NB_ERR_UNSUPPORTED && strstr(nb_last_error(), "bn = 16"),
          "path tc with 16-token tiles refused: %s", nb_last_error());
    cfg.bn = 0;
    nb_gemm_desc gb = g;
    gb.weight.scale_type = NB_SCALE_BF16; /* FP16 activations with BF16 scales: decode kernel only */
    CHECK(nb_gemm_workspace_size_ex(ctx, &gb, &cfg, &ws) == NB_ERR_UNSUPPORTED && strstr(nb_last_error(), "BF16 scales"),
          "path tc with BF16 scales and FP16 activations refused: %s", nb_last_error());
    cfg.path = NB_GEMM_PATH_MMA;
    CHECK(nb_gemm_workspace_size_ex(ctx, &g, &cfg, &ws) == NB_OK, "path mma accepted: %s", nb_last_error());
    CHECK(nb_gemm_workspace_size_ex(ctx, &gb, &cfg, &ws) == NB_ERR_UNSUPPORTED && strstr(nb_last_error(), "BF16 scales"),
          "path mma with BF16 scales and FP16 activations refused: %s", nb_last_error());
    memset(&cfg, 0, sizeof cfg);
    cfg.path = NB_GEMM_PATH_DECODE, cfg.variant = 1, cfg.kw = 1;
    g.m = 16;
    CHECK(nb_gemm_workspace_size_ex(ctx, &g, &cfg, &ws) == NB_OK, "staged variant accepted: %s", nb_last_error());
    cfg.rpw = 1;
    CHECK(nb_gemm_workspace_size_ex(ctx, &g, &cfg, &ws) == NB_ERR_UNSUPPORTED && strstr(nb_last_error(), "rpw = 2"),
          "staged variant with one row block per warp refused: %s", nb_last_error());
    CHECK(nb_gemm_workspace_size(ctx, &g, &ws) == NB_OK, "workspace size: %s", nb_last_error());
    char cfgs[256];
    void *dws = NULL;
    if (ws) {
        GT_CUDA(cudaMalloc(&dws, ws));
        GT_CUDA(cudaMemset(dws, 0, ws));
    }
    g.m = 64; /* the tensor-core kernel once, or two launches of 32 of the decode kernel */
    CHECK(nb_gemm(ctx, &g, dx, dpk, NULL, dy, dws, ws, NULL) == NB_OK && nb_gemm_last_config(ctx, cfgs, sizeof cfgs) == NB_OK &&
              (tc ? strstr(cfgs, "gemm_sm90<int4,") && strstr(cfgs, "launches=1")
                  : strstr(cfgs, "int4,group=128") && strstr(cfgs, "launches=2")),
          "m = 64 runs the %s: %s", tc ? "tensor-core kernel once" : "decode kernel twice", cfgs);
    nb_weight_desc pb = p;
    pb.scale_type = NB_SCALE_BF16; /* (the same bytes: every scale is 0) */
    GT_NB(nb_gemm_desc_init(&gb, &pb, 64, NB_DTYPE_F16, NB_DTYPE_F16));
    CHECK(nb_gemm(ctx, &gb, dx, dpk, NULL, dy, dws, ws, NULL) == NB_OK && nb_gemm_last_config(ctx, cfgs, sizeof cfgs) == NB_OK &&
              strstr(cfgs, "int4,group=128") && strstr(cfgs, "launches=2"),
          "m = 64 with BF16 scales and FP16 activations runs the decode kernel twice: %s", cfgs);
    /* int8: every tile width on the tensor-core kernel (256 tokens with two stages) */
    nb_weight_desc i8;
    nb_weight_desc_init(&i8, NB_FORMAT_INT8, N, K);
    i8.layout = NB_LAYOUT_PACKED;
    GT_NB(nb_gemm_desc_init(&g, &i8, 300, NB_DTYPE_BF16, NB_DTYPE_BF16));
    memset(&cfg, 0, sizeof cfg);
    cfg.path = NB_GEMM_PATH_TENSOR_CORE;
    for (int bn = 64; bn <= 256; bn *= 2) {
        cfg.bn = bn;
        CHECK((nb_gemm_workspace_size_ex(ctx, &g, &cfg, &ws) == NB_OK) == tc, "int8: path tc, %d-token tiles %s: %s",
              bn, tc ? "accepted" : "refused", nb_last_error());
    }
    nb_weight_desc k12;
    nb_weight_desc_init(&k12, NB_FORMAT_INT4_SYM, 16, 128);
    k12.k = 36, k12.group_size = 36; /* one group per row, k not a multiple of 8 */
    k12.layout = NB_LAYOUT_PACKED;
    GT_NB(nb_gemm_desc_init(&g, &k12, 1, NB_DTYPE_F16, NB_DTYPE_F16));
    g.lda = 40;
    CHECK(nb_gemm_can_implement(ctx, &g) == NB_ERR_UNSUPPORTED, "k = 36 refused: %s", nb_last_error());
    GT_CUDA(cudaDeviceSynchronize());
    if (dws) GT_CUDA(cudaFree(dws));
    GT_CUDA(cudaFree(dc));
    GT_CUDA(cudaFree(ds));
    GT_CUDA(cudaFree(dz));
    GT_CUDA(cudaFree(dpk));
    GT_CUDA(cudaFree(dx));
    GT_CUDA(cudaFree(dy));
}

/* The table formats: nb_pack (first version) writes nb_pack_v2's bytes;
 * what no kernel serves for them is refused by name; m = 64 runs the
 * tensor-core kernel (Hopper) or the decode kernel twice, with the kernel
 * group in the configuration. */
static void test_table_refusals(nb_context *ctx) {
    enum { N = 48, K = 512 };
    nb_weight_desc d;
    nb_weight_desc_init(&d, NB_FORMAT_NF4, N, K);
    nb_weight_sizes_v2 sz;
    GT_NB(nb_weight_get_sizes_v2(&d, &sz));
    CHECK(sz.packed_bytes == (size_t)(N / 16) * (K / 128) * 1152, "nf4 %dx%d blocks of 64: packed %zu", N, K,
          sz.packed_bytes);
    uint8_t *hc = malloc(sz.codes_bytes), *hs = malloc(sz.scales_bytes), *h1 = malloc(sz.packed_bytes),
            *h2 = malloc(sz.packed_bytes);
    uint64_t seed = 99;
    for (size_t i = 0; i < sz.codes_bytes; i++) hc[i] = (uint8_t)gt_rand(&seed);
    for (size_t i = 0; i < sz.scales_bytes / 4; i++) {
        const float a = (float)(gt_rand(&seed) % 1000 + 1) / 1000.0f;
        memcpy(hs + 4 * i, &a, 4);
    }
    uint8_t *dc, *ds;
    void *p1, *p2, *dx, *dy, *dw;
    GT_CUDA(cudaMalloc((void **)&dc, sz.codes_bytes));
    GT_CUDA(cudaMalloc((void **)&ds, sz.scales_bytes));
    GT_CUDA(cudaMalloc(&p1, sz.packed_bytes));
    GT_CUDA(cudaMalloc(&p2, sz.packed_bytes));
    GT_CUDA(cudaMalloc(&dx, 2 * 64 * K));
    GT_CUDA(cudaMalloc(&dy, 2 * 64 * N));
    GT_CUDA(cudaMalloc(&dw, 4 * (size_t)N * K));
    GT_CUDA(cudaMemcpy(dc, hc, sz.codes_bytes, cudaMemcpyHostToDevice));
    GT_CUDA(cudaMemcpy(ds, hs, sz.scales_bytes, cudaMemcpyHostToDevice));
    GT_CUDA(cudaMemset(dx, 0, 2 * 64 * K));
    nb_weight_desc a = d, b = d;
    const nb_weight_data w = {.codes = dc, .scales = ds};
    GT_NB(nb_pack(ctx, &a, dc, ds, p1, sz.packed_bytes, NULL));
    GT_NB(nb_pack_v2(ctx, &b, &w, p2, sz.packed_bytes, NULL));
    GT_CUDA(cudaMemcpy(h1, p1, sz.packed_bytes, cudaMemcpyDeviceToHost));
    GT_CUDA(cudaMemcpy(h2, p2, sz.packed_bytes, cudaMemcpyDeviceToHost));
    CHECK(!memcmp(h1, h2, sz.packed_bytes) && a.layout == NB_LAYOUT_PACKED, "nf4: nb_pack equals nb_pack_v2");
    CHECK(nb_dequantize(ctx, &d, dc, ds, NB_DTYPE_F32, dw, NULL) == NB_ERR_UNSUPPORTED &&
              strstr(nb_last_error(), "nb_pack and nb_gemm do"), "nf4: nb_dequantize refused: %s", nb_last_error());
    nb_gemm_desc g;
    GT_NB(nb_gemm_desc_init(&g, &d, 4, NB_DTYPE_BF16, NB_DTYPE_BF16));
    CHECK(nb_gemm_reference_device(ctx, &g, dx, dc, ds, NULL, dy, NULL) == NB_ERR_UNSUPPORTED,
          "nf4: naive GPU reference refused: %s", nb_last_error());
    GT_NB(nb_gemm_desc_init(&g, &a, 64, NB_DTYPE_BF16, NB_DTYPE_BF16));
    size_t ws = 1;
    nb_gemm_config cfg;
    memset(&cfg, 0, sizeof cfg);
    cfg.path = NB_GEMM_PATH_TENSOR_CORE;
    const int tc = tc_for_int(ctx);
    CHECK((nb_gemm_workspace_size_ex(ctx, &g, &cfg, &ws) == NB_OK) == tc, "nf4: path tc at m = 64 %s: %s",
          tc ? "accepted" : "refused", nb_last_error());
    g.m = 16;
    CHECK(nb_gemm_workspace_size_ex(ctx, &g, &cfg, &ws) == NB_ERR_UNSUPPORTED, "nf4: path tc at m = 16 refused: %s",
          nb_last_error());
    cfg.path = NB_GEMM_PATH_MMA, g.m = 64;
    CHECK(nb_gemm_workspace_size_ex(ctx, &g, &cfg, &ws) == NB_OK, "nf4: path mma accepted: %s", nb_last_error());
    memset(&cfg, 0, sizeof cfg);
    cfg.path = NB_GEMM_PATH_DECODE, cfg.variant = 1, cfg.kw = 1;
    g.m = 16;
    CHECK(nb_gemm_workspace_size_ex(ctx, &g, &cfg, &ws) == NB_OK, "nf4: staged variant accepted: %s", nb_last_error());
    cfg.rpw = 1;
    CHECK(nb_gemm_workspace_size_ex(ctx, &g, &cfg, &ws) == NB_ERR_UNSUPPORTED && strstr(nb_last_error(), "rpw = 2"),
          "nf4: staged variant with one row block per warp refused: %s", nb_last_error());
    GT_NB(nb_gemm_workspace_size(ctx, &g, &ws));
    void *dws = NULL;
    if (ws) {
        GT_CUDA(cudaMalloc(&dws, ws));
        GT_CUDA(cudaMemset(dws, 0, ws));
    }
    char cfgs[256] = "";
    g.m = 64;
    CHECK(nb_gemm(ctx, &g, dx, p1, NULL, dy, dws, ws, NULL) == NB_OK &&
              nb_gemm_last_config(ctx, cfgs, sizeof cfgs) == NB_OK && strstr(cfgs, "nf4,group=64") &&
              strstr(cfgs, tc ? "gemm_sm90<" : "launches=2"), "nf4: m = 64 runs the %s: %s",
          tc ? "tensor-core kernel" : "decode kernel twice", cfgs);
    GT_CUDA(cudaDeviceSynchronize());
    if (dws) GT_CUDA(cudaFree(dws));
    GT_CUDA(cudaFree(dc));
    GT_CUDA(cudaFree(ds));
    GT_CUDA(cudaFree(p1));
    GT_CUDA(cudaFree(p2));
    GT_CUDA(cudaFree(dx));
    GT_CUDA(cudaFree(dy));
    GT_CUDA(cudaFree(dw));
    free(hc), free(hs), free(h1), free(h2);
}

int main(int argc, char **argv) {
    gt_need_device("test_gpu_int");
    int quick = 0;
    nb_format only = (nb_format)0; /* --format: 0 for every format */
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--quick")) quick = 1;
        else if (!strcmp(argv[i], "--format") && i + 1 < argc && nb_format_from_name(argv[i + 1], &only) == NB_OK) i++;
        else if (!strcmp(argv[i], "--m-max") && i + 1 < argc && atoll(argv[i + 1]) > 0) g_mmax = atoll(argv[++i]);
        else if (!strcmp(argv[i], "--m-min") && i + 1 < argc && atoll(argv[i + 1]) > 0) g_mmin = atoll(argv[++i]);
        else {
            printf("usage: test_gpu_int [--quick] [--format NAME] [--m-min M] [--m-max M]\n");
            return 1;
        }
    }
    const char *path = getenv("NIBBLE_PATH");
    g_mma = path && !strcmp(path, "mma");
    nb_context *ctx = NULL;
    GT_NB(nb_context_create(0, &ctx));
    int64_t all[40];
    int nall = 0;
    for (int m = 1; m <= 32; m++) all[nall++] = m;
    all[nall++] = 33, all[nall++] = 45, all[nall++] = 64, all[nall++] = 100, all[nall++] = 128, all[nall++] = 200;
    static const int64_t few[8] = {1, 7, 8, 16, 32, 45, 64, 300}, sweep[5] = {5, 16, 27, 64, 300}, big[10] = {1, 7, 8, 12, 16, 20, 28, 32, 45, 100};
    static const int groups[4] = {32, 64, 128, 0};
    static const int64_t shapes[3][2] = {{37, 640}, {1000, 1152}, {4100, 4096}}; /* ragged n; k off 128 by 0 / 1 chunk */
    uint64_t seed = 1;
    static const nb_format ints[4] = {NB_FORMAT_INT4, NB_FORMAT_INT4_SYM, NB_FORMAT_INT8, NB_FORMAT_INT4_HQQ};
    for (int f = 0; f < 4; f++)
        for (int a = 0; a < 2; a++)
            for (int s = 0; s < 2; s++)
                for (int gi = 0; gi < 4; gi++)
                    for (int sh = 0; sh < (quick ? 2 : 3); sh++) {
                        const tcase c = {ints[f], a ? NB_DTYPE_F16 : NB_DTYPE_BF16,
                                         s ? NB_SCALE_BF16 : NB_SCALE_F16, shapes[sh][0], shapes[sh][1], groups[gi]};
                        if ((c.group && c.k % c.group) || (only && c.fmt != only)) continue;
                        if (g_mma && a && s) { /* NIBBLE_PATH=mma refuses BF16 scales with F16 activations */
                            mma_refused(ctx, &c);
                            continue;
                        }
                        /* every m on the small layer, a few (and every configuration at two) on the others */
                        if (sh == 0) run_case(ctx, &c, all, nall, NULL, 0, seed++);
                        else if (sh == 1) run_case(ctx, &c, few, 8, sweep, 5, seed++);
                        else run_case(ctx, &c, big, 10, NULL, 0, seed++);
                    }
    /* k not a multiple of 128 with one group per row (a padded kernel group) */
    const tcase odd[3] = {{NB_FORMAT_INT4, NB_DTYPE_F16, NB_SCALE_F16, 21, 200, 0},
                          {NB_FORMAT_INT4_SYM, NB_DTYPE_BF16, NB_SCALE_BF16, 5, 72, 0},
                          {NB_FORMAT_INT8, NB_DTYPE_BF16, NB_SCALE_F16, 19, 168, 0}};
    for (int i = 0; i < 3; i++)
        if (!only || odd[i].fmt == only) run_case(ctx, &odd[i], all, nall, NULL, 0, seed++);
    /* the table formats: bitsandbytes' blocks (F32 absmax; 256 and 1024 are
     * stored once per chunk) */
    static const int tgroups[5] = {32, 64, 128, 256, 1024};
    for (int f = 0; f < 2; f++)
        for (int a = 0; a < 2; a++)
            for (int gi = 0; gi < 5; gi++)
                for (int sh = 0; sh < (quick ? 2 : 3); sh++) {
                    const tcase c = {f ? NB_FORMAT_BNB_FP4 : NB_FORMAT_NF4, a ? NB_DTYPE_F16 : NB_DTYPE_BF16,
                                     NB_SCALE_F32, shapes[sh][0], shapes[sh][1], tgroups[gi]};
                    if (c.k % c.group || (only && c.fmt != only)) continue;
                    if (sh == 0) run_case(ctx, &c, all, nall, NULL, 0, seed++);
                    else if (sh == 1) run_case(ctx, &c, few, 8, gi == 1 ? sweep : NULL, gi == 1 ? 5 : 0, seed++);
                    else run_case(ctx, &c, big, 10, NULL, 0, seed++);
                }
    /* k not a multiple of 128: kernel groups past k in the last chunk */
    const tcase todd[2] = {{NB_FORMAT_NF4, NB_DTYPE_BF16, NB_SCALE_F32, 21, 192, 64},
                           {NB_FORMAT_BNB_FP4, NB_DTYPE_F16, NB_SCALE_F32, 5, 96, 32}};
    for (int i = 0; i < 2; i++)
        if (!only || todd[i].fmt == only) run_case(ctx, &todd[i], all, nall, NULL, 0, seed++);
    /* more 256-row tiles (301, of 7 chunks) than a wave of one CTA per SM at
     * 17..32 tokens: the staged kernel's stream-K grid (runs over tile ends,
     * whole tiles between partial ones); 16 tokens its plain split */
    static const int64_t skm[3] = {16, 17, 32};
    const tcase sk[3] = {{NB_FORMAT_INT4, NB_DTYPE_BF16, NB_SCALE_F16, 76808, 896, 128},
                         {NB_FORMAT_INT8, NB_DTYPE_F16, NB_SCALE_BF16, 76808, 896, 64},
                         {NB_FORMAT_NF4, NB_DTYPE_BF16, NB_SCALE_F32, 76808, 896, 64}};
    for (int i = 0; i < 3; i++)
        if (!only || sk[i].fmt == only) run_case(ctx, &sk[i], skm, 3, NULL, 0, seed++);
    /* fewer tiles than SMs: 70 of 12 chunks, whose one-split grid would
     * leave 62 of 132 SMs idle, so 17..32 tokens take the stream-K wave
     * (plan.c k2_wave), where every tile spans two or three CTAs and some
     * CTAs hold only the middle of one */
    static const int64_t wm[3] = {17, 24, 32};
    const tcase wave[2] = {{NB_FORMAT_INT4, NB_DTYPE_BF16, NB_SCALE_F16, 17900, 1536, 128},
                           {NB_FORMAT_NF4, NB_DTYPE_F16, NB_SCALE_F32, 17900, 1536, 64}};
    for (int i = 0; i < 2; i++)
        if (!only || wave[i].fmt == only) run_case(ctx, &wave[i], wm, 3, NULL, 0, seed++);
    /* 9..16 tokens on the same 70 tiles, of 24 chunks: the split grid (3
     * splits at two CTAs per SM, 210 of 264 slots; int8, one per SM, 70 of
     * 132) leaves a fifth idle or more, so kernel 2 runs on a stream-K wave
     * of the resident CTAs, every tile in two to four pieces (plan.c,
     * wave16) */
    static const int64_t w16m[2] = {9, 16};
    const tcase w16[3] = {{NB_FORMAT_INT4, NB_DTYPE_BF16, NB_SCALE_F16, 17900, 3072, 128},
                          {NB_FORMAT_INT8, NB_DTYPE_F16, NB_SCALE_BF16, 17900, 3072, 64},
                          {NB_FORMAT_NF4, NB_DTYPE_BF16, NB_SCALE_F32, 17900, 3072, 64}};
    for (int i = 0; i < 3; i++)
        if (!only || w16[i].fmt == only) run_case(ctx, &w16[i], w16m, 2, NULL, 0, seed++);
    /* 1790 row blocks (the last of 8 rows): kernel 1 at kw = 1 would put 224
     * CTAs of 8 row blocks on 132 SMs; its balanced wave takes 7 a CTA (256
     * CTAs, the last with 5; plan.c) */
    static const int64_t bm[2] = {1, 4};
    const tcase bal[3] = {{NB_FORMAT_INT4, NB_DTYPE_BF16, NB_SCALE_F16, 28632, 4096, 128},
                          {NB_FORMAT_NF4, NB_DTYPE_F16, NB_SCALE_F32, 28632, 4096, 64},
                          /* 1183 row blocks: kw = 2's 296 CTAs balanced to 395 of 3 (idle warp pairs) */
                          {NB_FORMAT_INT4, NB_DTYPE_F16, NB_SCALE_BF16, 18920, 3584, 128}};
    for (int i = 0; i < 3; i++)
        if (!only || bal[i].fmt == only) run_case(ctx, &bal[i], bm, 2, NULL, 0, seed++);
    {
        nb_device_info info;
        GT_NB(nb_context_device_info(ctx, &info));
        if (!g_mma && g_mmin <= 1 && (!only || only == NB_FORMAT_INT4 || only == NB_FORMAT_NF4) &&
            info.sm_count >= 129 && info.sm_count <= 255)
            CHECK(g_balanced > 0, "kernel 1 ran on a balanced wave (28632 rows, k = 4096): %d calls", g_balanced);
        printf("decode kernel 1 on a balanced wave: %d calls\n", g_balanced);
        /* (on a GPU of 129..255 SMs, as the H100 and H200, where two CTAs fit an SM) */
        const int fmt_run = !only || only == NB_FORMAT_INT4 || only == NB_FORMAT_INT8 || only == NB_FORMAT_NF4;
        if (!g_mma && g_mmax >= 9 && g_mmin <= 16 && fmt_run && info.sm_count >= 129 && info.sm_count <= 255)
            CHECK(g_wave16 > 0, "kernel 2 ran on its stream-K wave at 9..16 tokens (17900 rows, k = 3072): %d calls",
                  g_wave16);
        printf("decode kernel 2 on its stream-K wave at 9..16 tokens: %d calls\n", g_wave16);
    }
    if (!g_mma) {
        test_refusals(ctx);
        test_table_refusals(ctx);
    } else
        printf("NIBBLE_PATH=mma: the refusal checks are left out\n");
    nb_context_destroy(ctx);
    printf("%d passed, %d failed\n", g_pass, g_fail);
    return g_fail ? 1 : 0;
}
