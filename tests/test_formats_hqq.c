/* test_formats_hqq.c - int4_hqq (unsigned 4-bit codes with a float zero
 * point and a scale per group, both of the scale type: HQQ's layout) through
 * the _v2 host functions, against values derived independently from
 * docs/formats.md 5.5.
 *
 * Nothing here asks the library for an expected value: F16 and BF16 are
 * decoded from their bit fields (testlib.h), the roundings are done in
 * double with round_mag, and HQQ's quantizer is re-implemented below from
 * the formulas of formats.md 5.5 (float32, product and sum rounded apart).
 *   - the row: name, element, zero type, groups, default group, sizes;
 *   - dequantize: every code x zero points (integers, fractions, negative,
 *     subnormal, large, infinite, NaN) x scales (normal, subnormal, zero,
 *     negative, infinite, NaN) of both types, to F32, and to the scale type
 *     itself (bit for bit);
 *   - quantize: byte for byte against the re-implementation on Gaussian
 *     data, edge groups (constant, all zero, one outlier), every group size
 *     and both scale types, per-channel included; the round trip within half
 *     a step; a zero point that overflows F16 refused with the group named;
 *   - pack and unpack (host) give the buffers back; the reference GEMMs
 *     against the dequantized weights in double.
 *
 * Output: one line per failed check, then "N passed, M failed". */
#include <nibble.h>

#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define TESTLIB_SEED 0x452821E638D01377ull
#include "testlib.h"

/* v (double) rounded to the 16-bit scale type: nearest even, subnormals,
 * overflow to infinity; NaN and infinities as they are. */
static double r16(nb_scale_type st, double v) {
    if (isnan(v) || isinf(v) || v == 0.0) return v;
    const int f16 = st == NB_SCALE_F16;
    const double m = round_mag(fabs(v), f16 ? 10 : 7, f16 ? -14 : -126);
    const double big = f16 ? 65504.0 : ldexp(255.0 / 128.0, 127);
    const double r = m > big ? INFINITY : m;
    return v < 0 ? -r : r;
}

static double from16(nb_scale_type st, uint16_t h) {
    return st == NB_SCALE_F16 ? (double)ref_f16_to_f32(h) : (double)ref_bf16_to_f32(h);
}
static uint16_t to16(nb_scale_type st, float f) { return st == NB_SCALE_F16 ? ref_f16(f) : ref_bf16(f); }

/* formats.md 5.5: r(r(q - z) s), each step rounded to the scale type. */
static double ref_value(nb_scale_type st, int q, double z, double s) {
    return r16(st, r16(st, (double)q - z) * s);
}

static void test_row(void) {
    nb_format f;
    CHECK(nb_format_from_name("int4_hqq", &f) == NB_OK && f == NB_FORMAT_INT4_HQQ, "int4_hqq is a format name");
    nb_format_info fi;
    CHECK(nb_format_get_info(NB_FORMAT_INT4_HQQ, &fi) == NB_OK, "info: %s", nb_last_error());
    CHECK(fi.element == NB_ELEMENT_UINT4 && fi.element_bits == 4 && fi.zero_point == 1 &&
              fi.zero_type == NB_ZERO_FLOAT && fi.group_size == 64 && fi.scale_type == NB_SCALE_F16 &&
              fi.kernels == 1 && (fi.groups & NB_GROUPS_32) && (fi.groups & NB_GROUPS_128) &&
              (fi.groups & NB_GROUPS_PER_CHANNEL) && (fi.scale_types & NB_SCALE_BIT(NB_SCALE_BF16)),
          "int4_hqq row: element %d zero type %d group %d kernels %d", fi.element, fi.zero_type, fi.group_size,
          fi.kernels);
    nb_weight_desc d;
    CHECK(nb_weight_desc_init(&d, NB_FORMAT_INT4_HQQ, 48, 256) == NB_OK, "desc");
    nb_weight_sizes_v2 sz;
    CHECK(nb_weight_get_sizes_v2(&d, &sz) == NB_OK && sz.codes_bytes == 48 * 128 && sz.scales_bytes == 48 * 4 * 2 &&
              sz.zeros_bytes == 48 * 4 * 2,
          "sizes: codes %zu scales %zu zeros %zu (want 6144, 384, 384)", sz.codes_bytes, sz.scales_bytes,
          sz.zeros_bytes);
    nb_weight_sizes s1;
    CHECK(nb_weight_get_sizes(&d, &s1) == NB_ERR_UNSUPPORTED && strstr(nb_last_error(), "_v2"),
          "nb_weight_get_sizes refuses a format with zero points: %s", nb_last_error());
    d.scale_type = NB_SCALE_E4M3;
    CHECK(nb_weight_desc_validate(&d) == NB_ERR_UNSUPPORTED, "int4_hqq takes F16 / BF16 scales only");
}

/* Every code x the zero points x the scales of one scale type, one group of
 * 16 per (zero, scale) pair, dequantized to F32 and to the scale type. */
static void test_dequant(nb_context *ctx, nb_scale_type st) {
    const int f16 = st == NB_SCALE_F16;
    const float zs[] = {0.0f, 1.0f, 7.5f, 8.0f, 15.0f, 3.3333f, -2.25f, 0.1f, 1e-6f, 300.0f, 1e5f, -0.0f};
    const float ss[] = {1.0f, 0.0123f, 3e-6f, 1e-8f, 0.0f, -0.5f, 900.0f, 1e5f};
    const size_t nz = sizeof zs / sizeof zs[0] + 2, ns = sizeof ss / sizeof ss[0] + 2; /* + inf, NaN */
    const int64_t n = (int64_t)(nz * ns), k = 16;
    nb_weight_desc d;
    nb_weight_desc_init(&d, NB_FORMAT_INT4_HQQ, n, k);
    d.group_size = (int32_t)k; /* one group per row (per channel) */
    d.scale_type = st;
    uint8_t *codes = calloc((size_t)(n * k / 2), 1);
    uint16_t *scales = calloc((size_t)n, 2), *zeros = calloc((size_t)n, 2), *out16 = calloc((size_t)(n * k), 2);
    float *out = calloc((size_t)(n * k), sizeof(float));
    for (int64_t r = 0; r < n; r++) {
        const size_t zi = (size_t)r / ns, si = (size_t)r % ns;
        const float z = zi < nz - 2 ? zs[zi] : zi == nz - 2 ? INFINITY : NAN;
        const float s = si < ns - 2 ? ss[si] : si == ns - 2 ? -INFINITY : NAN;
        zeros[r] = to16(st, z), scales[r] = to16(st, s);
        for (int j = 0; j < 16; j++) codes[(r * k + j) / 2] |= (uint8_t)(j << (4 * (j & 1)));
    }
    const nb_weight_data w = {.codes = codes, .scales = scales, .zeros = zeros};
    CHECK(nb_dequantize_host_v2(ctx, &d, &w, NB_DTYPE_F32, out) == NB_OK, "dequantize %s: %s", f16 ? "f16" : "bf16",
          nb_last_error());
    CHECK(nb_dequantize_host_v2(ctx, &d, &w, f16 ? NB_DTYPE_F16 : NB_DTYPE_BF16, out16) == NB_OK, "dequantize to %s",
          f16 ? "f16" : "bf16");
    int bad = 0;
    for (int64_t r = 0; r < n; r++)
        for (int j = 0; j < 16; j++) {
            const double want = ref_value(st, j, from16(st, zeros[r]), from16(st, scales[r]));
            const double got = out[r * k + j];
            const int same = (isnan(want) && isnan(got)) || want == got;
            const uint16_t wb = to16(st, (float)want);
            const int same16 = isnan(want) ? (out16[r * k + j] & 0x7FFF) > (f16 ? 0x7C00 : 0x7F80)
                                           : out16[r * k + j] == wb;
            if ((!same || !same16) && bad++ < 5)
                CHECK(0, "%s: q %d z %g s %g: got %.9g (16-bit 0x%04x), want %.9g (0x%04x)", f16 ? "f16" : "bf16", j,
                      from16(st, zeros[r]), from16(st, scales[r]), got, out16[r * k + j], want, wb);
        }
    CHECK(bad == 0, "%s dequantize: %d of %lld values differ", f16 ? "f16" : "bf16", bad, (long long)(n * k));
    free(codes), free(scales), free(zeros), free(out), free(out16);
}

/* formats.md 5.5, HQQ's quantizer without the optimizer, in float32. */
static int ref_quantize(nb_scale_type st, const float *w, int64_t n, int64_t k, int64_t g, uint8_t *codes,
                        uint16_t *scales, uint16_t *zeros) {
    memset(codes, 0, (size_t)(n * k / 2));
    for (int64_t r = 0; r < n; r++)
        for (int64_t b = 0; b < k / g; b++) {
            const float *v = w + r * k + b * g;
            float lo = v[0], hi = v[0];
            for (int64_t j = 1; j < g; j++) lo = v[j] < lo ? v[j] : lo, hi = v[j] > hi ? v[j] : hi;
            volatile float den = hi - lo, rec = 1.0f / den;      /* (PyTorch's 15 / tensor: 15 * (1 / tensor)) */
            float t = fabsf(den) <= 1e-4f ? 1.0f : 15.0f * rec; /* (hqq 0.2.8: 1 for a range of 1e-4 or less) */
            if (t > 2e4f) t = 2e4f;
            const float z = -lo * t;
            const size_t gi = (size_t)(r * (k / g) + b);
            scales[gi] = to16(st, 1.0f / t), zeros[gi] = to16(st, z);
            if (isinf(from16(st, zeros[gi]))) return -1;
            for (int64_t j = 0; j < g; j++) {
                volatile float p = v[j] * t;
                float q = rintf(p + z);
                q = q < 0 ? 0 : q > 15 ? 15 : q;
                const size_t i = (size_t)(r * k + b * g + j);
                codes[i / 2] |= (uint8_t)((int)q << (4 * (i & 1)));
            }
        }
    return 0;
}

static double gauss(void) {
    const double u = rnd_unit() + 1e-12, v = rnd_unit();
    return sqrt(-2.0 * log(u)) * cos(6.283185307179586 * v);
}

static void test_quantize(nb_context *ctx, nb_scale_type st, int64_t n, int64_t k, int g, int edges) {
    const char *sn = st == NB_SCALE_F16 ? "f16" : "bf16";
    const int64_t gs = g ? g : k, ng = k / gs;
    float *w = malloc(sizeof(float) * (size_t)(n * k));
    for (int64_t i = 0; i < n * k; i++) w[i] = (float)(0.02 * gauss());
    if (edges) {
        for (int64_t j = 0; j < gs; j++) w[j] = 0.5f;                    /* constant group */
        for (int64_t j = 0; j < gs; j++) w[gs * (ng > 1) + k * (ng == 1) + j] = 0.0f; /* all-zero group */
        w[2 * k + 3] = 4.0f;                                             /* one outlier */
        for (int64_t j = 0; j < gs; j++) w[3 * k + j] = (float)j - 7.0f; /* an exact grid */
    }
    nb_weight_desc d;
    nb_weight_desc_init(&d, NB_FORMAT_INT4_HQQ, n, k);
    d.group_size = (int32_t)gs, d.scale_type = st;
    nb_weight_sizes_v2 sz;
    nb_weight_get_sizes_v2(&d, &sz);
    uint8_t *codes = malloc(sz.codes_bytes), *rc = malloc(sz.codes_bytes);
    uint16_t *scales = malloc(sz.scales_bytes), *zeros = malloc(sz.zeros_bytes);
    uint16_t *rs = malloc(sz.scales_bytes), *rz = malloc(sz.zeros_bytes);
    float *back = malloc(sizeof(float) * (size_t)(n * k));
    const nb_weight_buffers out = {.codes = codes, .scales = scales, .zeros = zeros};
    nb_status s = nb_quantize_host_v2(ctx, &d, NB_DTYPE_F32, w, &out);
    CHECK(s == NB_OK, "quantize %s %lldx%lld g%d: %s", sn, (long long)n, (long long)k, g, nb_last_error());
    CHECK(ref_quantize(st, w, n, k, gs, rc, rs, rz) == 0, "reference quantize");
    CHECK(!memcmp(codes, rc, sz.codes_bytes) && !memcmp(scales, rs, sz.scales_bytes) &&
              !memcmp(zeros, rz, sz.zeros_bytes),
          "quantize %s g%d: bytes differ from the formula (codes %d scales %d zeros %d)", sn, g,
          memcmp(codes, rc, sz.codes_bytes) != 0, memcmp(scales, rs, sz.scales_bytes) != 0,
          memcmp(zeros, rz, sz.zeros_bytes) != 0);
    /* the round trip: within half a step, plus the roundings of z, q - z and the product */
    const nb_weight_data wd = {.codes = codes, .scales = scales, .zeros = zeros};
    CHECK(nb_dequantize_host_v2(ctx, &d, &wd, NB_DTYPE_F32, back) == NB_OK, "dequantize back");
    int worst = 0;
    double wr = 0;
    for (int64_t i = 0; i < n * k; i++) {
        const size_t gi = (size_t)(i / k * ng + i % k / gs);
        const double sc = from16(st, scales[gi]), z = fabs(from16(st, zeros[gi]));
        const double u = st == NB_SCALE_F16 ? 0x1p-11 : 0x1p-8;
        const double lim = 0.5 * fabs(sc) * (1.0 + 4 * u) + 2 * u * (z + 16.0) * fabs(sc) + 1e-30;
        const double e = fabs((double)back[i] - (double)w[i]);
        if (e > lim) worst++, wr = e / lim;
    }
    CHECK(worst == 0, "round trip %s g%d: %d values past half a step (last %.3g x the limit)", sn, g, worst, wr);
    free(w), free(codes), free(rc), free(scales), free(zeros), free(rs), free(rz), free(back);
}

/* hqq 0.2.8's scale rule at the edges: a range of 1e-4 or less takes t = 1
 * (a constant group is then exact: q = 0, z = -w), a range just above it
 * t = 2e4 (the clamp), and the stored values say so. */
static void test_scale_edges(nb_context *ctx) {
    float w[3 * 64];
    for (int i = 0; i < 64; i++) {
        w[i] = 0.5f;                                    /* constant */
        w[64 + i] = 0.25f + (i & 1 ? 5e-5f : 0.0f);     /* range 5e-5: t = 1 */
        w[128 + i] = 0.25f + (i & 1 ? 2e-4f : 0.0f);    /* range 2e-4: 15 / 2e-4 = 75000, clamped to 2e4 */
    }
    nb_weight_desc d;
    nb_weight_desc_init(&d, NB_FORMAT_INT4_HQQ, 3, 64);
    d.scale_type = NB_SCALE_F16;
    uint8_t codes[3 * 32];
    uint16_t scales[3], zeros[3];
    const nb_weight_buffers out = {.codes = codes, .scales = scales, .zeros = zeros};
    CHECK(nb_quantize_host_v2(ctx, &d, NB_DTYPE_F32, w, &out) == NB_OK, "edge groups: %s", nb_last_error());
    CHECK(from16(NB_SCALE_F16, scales[0]) == 1.0f && from16(NB_SCALE_F16, zeros[0]) == -0.5f && codes[0] == 0,
          "constant 0.5: scale 1, zero -0.5, codes 0 (got %g, %g, %u)", (double)from16(NB_SCALE_F16, scales[0]),
          (double)from16(NB_SCALE_F16, zeros[0]), codes[0]);
    CHECK(from16(NB_SCALE_F16, scales[1]) == 1.0f && from16(NB_SCALE_F16, zeros[1]) == -0.25f,
          "range 5e-5: scale 1, zero -0.25 (got %g, %g)", (double)from16(NB_SCALE_F16, scales[1]),
          (double)from16(NB_SCALE_F16, zeros[1]));
    CHECK(from16(NB_SCALE_F16, scales[2]) == from16(NB_SCALE_F16, to16(NB_SCALE_F16, 1.0f / 2e4f)),
          "range 2e-4: scale r(1 / 2e4) (got %g)", (double)from16(NB_SCALE_F16, scales[2]));
    const nb_weight_data wd = {.codes = codes, .scales = scales, .zeros = zeros};
    float back[3 * 64];
    CHECK(nb_dequantize_host_v2(ctx, &d, &wd, NB_DTYPE_F32, back) == NB_OK && back[7] == 0.5f && back[70] == 0.25f,
          "constant and tiny groups back exactly: %g %g", (double)back[7], (double)back[70]);
}

/* NB_QUANT_HQQ (HQQ's optimizer; checked against hqq itself in
 * python/tests/test_hqq.py): the scales are round to nearest's, the zero
 * points move, the mean reconstruction error falls, the result is the same
 * on a second run; refused for formats without float zero points and by
 * the device quantizer. */
static void test_optimizer(nb_context *ctx) {
    const int64_t n = 32, k = 256;
    float *w = malloc(sizeof(float) * (size_t)(n * k)), *back = malloc(sizeof(float) * (size_t)(n * k));
    for (int64_t i = 0; i < n * k; i++) w[i] = (float)(0.5 * gauss());
    nb_weight_desc d;
    nb_weight_desc_init(&d, NB_FORMAT_INT4_HQQ, n, k);
    nb_weight_sizes_v2 sz;
    nb_weight_get_sizes_v2(&d, &sz);
    uint8_t *c[3];
    uint16_t *sc[3], *zs[3];
    double err[3];
    for (int v = 0; v < 3; v++) { /* rtn, hqq, hqq again */
        c[v] = malloc(sz.codes_bytes), sc[v] = malloc(sz.scales_bytes), zs[v] = malloc(sz.zeros_bytes);
        d.method = v ? NB_QUANT_HQQ : NB_QUANT_RTN;
        const nb_weight_buffers out = {.codes = c[v], .scales = sc[v], .zeros = zs[v]};
        CHECK(nb_quantize_host_v2(ctx, &d, NB_DTYPE_F32, w, &out) == NB_OK, "quantize method %d: %s", (int)d.method,
              nb_last_error());
        const nb_weight_data wd = {.codes = c[v], .scales = sc[v], .zeros = zs[v]};
        CHECK(nb_dequantize_host_v2(ctx, &d, &wd, NB_DTYPE_F32, back) == NB_OK, "dequantize");
        err[v] = 0.0;
        for (int64_t i = 0; i < n * k; i++) err[v] += fabs((double)back[i] - (double)w[i]);
        err[v] /= (double)(n * k);
    }
    CHECK(!memcmp(sc[0], sc[1], sz.scales_bytes), "the optimizer keeps round to nearest's scales");
    CHECK(memcmp(zs[0], zs[1], sz.zeros_bytes) != 0, "the optimizer moves zero points");
    CHECK(err[1] < 0.99 * err[0], "mean error %.5g with the optimizer, %.5g without", err[1], err[0]);
    CHECK(!memcmp(c[1], c[2], sz.codes_bytes) && !memcmp(zs[1], zs[2], sz.zeros_bytes), "the optimizer is deterministic");
    const nb_weight_buffers out = {.codes = c[0], .scales = sc[0], .zeros = zs[0]};
    nb_weight_desc_init(&d, NB_FORMAT_INT4, n, k);
    d.method = NB_QUANT_HQQ;
    CHECK(nb_quantize_host_v2(ctx, &d, NB_DTYPE_F32, w, &out) == NB_ERR_UNSUPPORTED && strstr(nb_last_error(), "int4_hqq"),
          "int4 with method hqq refused: %s", nb_last_error());
    nb_weight_desc_init(&d, NB_FORMAT_INT4_HQQ, n, k);
    d.method = 3;
    CHECK(nb_quantize_host_v2(ctx, &d, NB_DTYPE_F32, w, &out) == NB_ERR_INVALID_ARGUMENT, "method 3 refused: %s",
          nb_last_error());
    for (int v = 0; v < 3; v++) free(c[v]), free(sc[v]), free(zs[v]);
    free(w), free(back);
}

static void test_refusals(nb_context *ctx) {
    /* a group of 5.0 and 5.001: t = 15 / 0.001, z = -5 t = -75000, past F16 (and fine in BF16) */
    float w[64];
    for (int i = 0; i < 64; i++) w[i] = i & 1 ? 5.001f : 5.0f;
    nb_weight_desc d;
    nb_weight_desc_init(&d, NB_FORMAT_INT4_HQQ, 1, 64);
    uint8_t codes[32];
    uint16_t scales[1], zeros[1];
    const nb_weight_buffers out = {.codes = codes, .scales = scales, .zeros = zeros};
    CHECK(nb_quantize_host_v2(ctx, &d, NB_DTYPE_F32, w, &out) == NB_ERR_INVALID_ARGUMENT &&
              strstr(nb_last_error(), "zero point") && strstr(nb_last_error(), "group 0"),
          "F16 zero point overflow refused: %s", nb_last_error());
    d.scale_type = NB_SCALE_BF16;
    CHECK(nb_quantize_host_v2(ctx, &d, NB_DTYPE_F32, w, &out) == NB_OK, "BF16 takes it: %s", nb_last_error());
    const nb_weight_data wd = {.codes = codes, .scales = scales, .zeros = zeros};
    float back[64];
    CHECK(nb_dequantize_host_v2(ctx, &d, &wd, NB_DTYPE_F32, back) == NB_OK && fabsf(back[5] - 5.001f) < 0.05f,
          "the group back: %g", (double)back[5]);
    w[9] = NAN;
    CHECK(nb_quantize_host_v2(ctx, &d, NB_DTYPE_F32, w, &out) == NB_ERR_INVALID_ARGUMENT, "NaN input refused");
    /* the v1 functions name the _v2 ones; zeros must be given */
    CHECK(nb_quantize_host(ctx, &d, NB_DTYPE_F32, w, codes, (uint8_t *)scales) == NB_ERR_UNSUPPORTED &&
              strstr(nb_last_error(), "_v2"),
          "nb_quantize_host refuses int4_hqq: %s", nb_last_error());
    const nb_weight_data nz = {.codes = codes, .scales = scales};
    float dst[64];
    CHECK(nb_dequantize_host_v2(ctx, &d, &nz, NB_DTYPE_F32, dst) == NB_ERR_NULL_POINTER, "zeros NULL refused");
}

/* pack and unpack on the host give the buffers back; the reference GEMMs
 * against the dequantized weights in double. */
static void test_pack_gemm(nb_context *ctx, nb_scale_type st, int64_t n, int64_t k, int g) {
    nb_weight_desc d;
    nb_weight_desc_init(&d, NB_FORMAT_INT4_HQQ, n, k);
    d.group_size = g ? g : (int32_t)k, d.scale_type = st;
    nb_weight_sizes_v2 sz;
    nb_weight_get_sizes_v2(&d, &sz);
    uint8_t *codes = malloc(sz.codes_bytes), *c2 = calloc(sz.codes_bytes, 1), *packed = malloc(sz.packed_bytes);
    uint16_t *scales = malloc(sz.scales_bytes), *zeros = malloc(sz.zeros_bytes);
    uint16_t *s2 = calloc(sz.scales_bytes, 1), *z2 = calloc(sz.zeros_bytes, 1);
    for (size_t i = 0; i < sz.codes_bytes; i++) codes[i] = (uint8_t)rnd_u64();
    for (size_t i = 0; i < sz.scales_bytes / 2; i++) {
        scales[i] = to16(st, (float)(0.001 + 0.01 * rnd_unit()));
        zeros[i] = to16(st, (float)(16.0 * rnd_unit() - 0.5));
    }
    const nb_weight_data w = {.codes = codes, .scales = scales, .zeros = zeros};
    nb_weight_desc pd = d;
    CHECK(nb_pack_host_v2(ctx, &pd, &w, packed, sz.packed_bytes) == NB_OK, "pack: %s", nb_last_error());
    const nb_weight_buffers ub = {.codes = c2, .scales = s2, .zeros = z2};
    CHECK(nb_unpack_host_v2(ctx, &pd, packed, sz.packed_bytes, &ub) == NB_OK, "unpack: %s", nb_last_error());
    CHECK(!memcmp(codes, c2, sz.codes_bytes) && !memcmp(scales, s2, sz.scales_bytes) &&
              !memcmp(zeros, z2, sz.zeros_bytes),
          "pack then unpack %lldx%lld g%d: buffers differ", (long long)n, (long long)k, g);
    /* the float zero points sit after the scales, two bytes each, row g's at 16 sb gpc + 4 gpc g */
    const int gpc = 128 / (g == 32 || g == 64 || g == 128 ? g : 128);
    if (k >= 128 && n >= 16 && d.group_size <= 128) {
        const uint8_t *z0 = packed + 1024 + 32 * gpc; /* chunk (0, 0), lane group 0, row 0, kernel group 0 */
        CHECK((uint16_t)(z0[0] | z0[1] << 8) == zeros[0], "packed zero point of row 0 at byte %d", 1024 + 32 * gpc);
    }
    /* reference GEMMs */
    const int64_t m = 3;
    uint16_t *x = malloc(2 * (size_t)(m * k));
    for (int64_t i = 0; i < m * k; i++) x[i] = ref_bf16((float)gauss());
    nb_gemm_desc gd;
    nb_gemm_desc_init(&gd, &d, m, NB_DTYPE_BF16, NB_DTYPE_BF16);
    double *y = malloc(sizeof(double) * (size_t)(m * n));
    float *deq = malloc(sizeof(float) * (size_t)(n * k));
    CHECK(nb_gemm_host_f64_v2(ctx, &gd, x, &w, NULL, y) == NB_OK, "gemm f64: %s", nb_last_error());
    CHECK(nb_dequantize_host_v2(ctx, &d, &w, NB_DTYPE_F32, deq) == NB_OK, "dequantize");
    double worst = 0;
    for (int64_t i = 0; i < m; i++)
        for (int64_t r = 0; r < n; r++) {
            double want = 0, mag = 0;
            for (int64_t j = 0; j < k; j++) {
                const double t = (double)ref_bf16_to_f32(x[i * k + j]) * deq[r * k + j];
                want += t, mag += fabs(t);
            }
            const double e = fabs(y[i * n + r] - want) / (mag + 1e-300);
            worst = e > worst ? e : worst;
        }
    CHECK(worst < 1e-12, "gemm f64 against the dequantized weights: relative %.3g", worst);
    free(codes), free(c2), free(packed), free(scales), free(zeros), free(s2), free(z2), free(x), free(y), free(deq);
}

int main(void) {
    setvbuf(stdout, NULL, _IONBF, 0);
    nb_context *ctx = NULL;
    if (nb_context_create(NB_DEVICE_NONE, &ctx) != NB_OK) {
        printf("context: %s\n", nb_last_error());
        return 1;
    }
    test_row();
    for (int t = 0; t < 2; t++) {
        const nb_scale_type st = t ? NB_SCALE_BF16 : NB_SCALE_F16;
        test_dequant(ctx, st);
        static const int groups[4] = {32, 64, 128, 0};
        for (int gi = 0; gi < 4; gi++) {
            test_quantize(ctx, st, 37, 256, groups[gi], 1);
            test_quantize(ctx, st, 5, 384, groups[gi], 0);
            test_pack_gemm(ctx, st, 35, 384, groups[gi]);
        }
        test_pack_gemm(ctx, st, 16, 200, 0); /* k not a multiple of 128 */
    }
    test_scale_edges(ctx);
    test_optimizer(ctx);
    test_refusals(ctx);
    nb_context_destroy(ctx);
    printf("%d passed, %d failed\n", g_pass, g_fail);
    return g_fail ? 1 : 0;
}
