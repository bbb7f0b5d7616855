/* test_formats_int.c - the integer formats (int4 with zero points, int4_sym,
 * int8) and bitsandbytes' nf4 and bnb_fp4 through nb_element_to_float and the
 * _v2 host functions, against values derived independently from
 * docs/formats.md sections 4 and 5.
 *
 * Nothing here asks the library for an expected value: the tables are
 * written out (NF4 as bitsandbytes lists it, FP4 as [0, 0.0625, 8, 12, 4, 6,
 * 2, 3] / 12), F16 and BF16 scales are decoded from their bit fields, and the
 * quantizers are re-implemented below from the formulas of formats.md 4.2
 * and 5.1 (float32 arithmetic, as the document states it).
 *   - dequantize: every code x every F16 and BF16 scale bit pattern (normal,
 *     subnormal, zero, infinity, NaN) x zero points 0, 1, 7, 8, 15 and 255,
 *     to F32, F16 and BF16; the tables x F32 absmax classes;
 *   - encoders: the tie cases of each (round half to even, then add the zero
 *     point; the bitsandbytes midpoints go to the smaller value);
 *   - quantize: byte for byte against the reference on Gaussian data, edge
 *     groups and every group size and scale type a row accepts, per-channel
 *     included; round trips; scale overflow refused;
 *   - the first-version functions against the _v2 ones where both apply,
 *     and the reference GEMMs on these formats.
 *
 * Output: one line per failed check, then "N passed, M failed". */
#include <nibble.h>

#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define TESTLIB_SEED 0x243F6A8885A308D3ull
#include "testlib.h"

static uint32_t f2u(float f) {
    uint32_t u;
    memcpy(&u, &f, 4);
    return u;
}
static float u2f(uint32_t u) {
    float f;
    memcpy(&f, &u, 4);
    return f;
}

/* ---------------------------------------------------- the tables, written out */

/* formats.md 4.1: bitsandbytes' NF4 values (each decimal is a float32). */
static const double k_nf4_ref[16] = {-1.0, -0.6961928009986877, -0.5250730514526367, -0.39491748809814453,
                                     -0.28444138169288635, -0.18477343022823334, -0.09105003625154495, 0.0,
                                     0.07958029955625534, 0.16093020141124725, 0.24611230194568634,
                                     0.33791524171829224, 0.44070982933044434, 0.5626170039176941,
                                     0.7229568362236023, 1.0};
static const float k_fp4_raw[16] = {0, 0.0625f, 8, 12, 4, 6, 2, 3, 0, -0.0625f, -8, -12, -4, -6, -2, -3};

static float ref_table(nb_element_type t, int code) {
    return t == NB_ELEMENT_NF4 ? (float)k_nf4_ref[code] : k_fp4_raw[code] / 12.0f;
}

/* The value of an integer code (two's complement for the signed types). */
static int ref_int(nb_element_type t, int code) {
    if (t == NB_ELEMENT_UINT4) return code;
    if (t == NB_ELEMENT_INT4) return code >= 8 ? code - 16 : code;
    return code >= 128 ? code - 256 : code;
}

typedef struct fmt_case {
    nb_format f;
    const char *name;
    nb_element_type el;
    int bits, zp, table;
} fmt_case;

static const fmt_case k_cases[5] = {
    {NB_FORMAT_INT4, "int4", NB_ELEMENT_UINT4, 4, 1, 0},    {NB_FORMAT_INT4_SYM, "int4_sym", NB_ELEMENT_INT4, 4, 0, 0},
    {NB_FORMAT_INT8, "int8", NB_ELEMENT_INT8, 8, 0, 0},     {NB_FORMAT_NF4, "nf4", NB_ELEMENT_NF4, 4, 0, 1},
    {NB_FORMAT_BNB_FP4, "bnb_fp4", NB_ELEMENT_FP4_BNB, 4, 0, 1},
};

/* A descriptor with group g and scale type st (nb_weight_desc_init
 * validates with the row's default group, which need not divide k). */
static nb_status desc_for(nb_weight_desc *d, nb_format f, int64_t n, int64_t k, int64_t g, nb_scale_type st) {
    nb_weight_desc_init(d, f, n, k);
    d->group_size = (int32_t)g;
    if (st) d->scale_type = st;
    return nb_weight_desc_validate(d);
}

static const char *dt_name(nb_dtype t) { return t == NB_DTYPE_F32 ? "f32" : t == NB_DTYPE_F16 ? "f16" : "bf16"; }

static int get_code(const uint8_t *codes, int bits, size_t i) { return bits == 8 ? codes[i] : nib(codes, i); }
static void put_code(uint8_t *codes, int bits, size_t i, int c) {
    if (bits == 8) codes[i] = (uint8_t)c;
    else codes[i / 2] = (uint8_t)((codes[i / 2] & (i & 1 ? 0x0F : 0xF0)) | (c & 15) << (i & 1 ? 4 : 0));
}

static float scale_value(nb_scale_type t, const uint8_t *scales, size_t i) {
    if (t == NB_SCALE_F32) {
        uint32_t u;
        memcpy(&u, scales + 4 * i, 4);
        return u2f(u);
    }
    uint16_t h = (uint16_t)(scales[2 * i] | scales[2 * i + 1] << 8);
    return t == NB_SCALE_F16 ? ref_f16_to_f32(h) : ref_bf16_to_f32(h);
}

/* Equal as stored in dtype dt (NaN matches any NaN). */
static int same_as(nb_dtype dt, const void *out, size_t i, float want) {
    if (dt == NB_DTYPE_F32) {
        float got = ((const float *)out)[i];
        return isnan(want) ? isnan(got) : f2u(got) == f2u(want);
    }
    uint16_t got = ((const uint16_t *)out)[i];
    if (isnan(want)) return dt == NB_DTYPE_F16 ? (got & 0x7C00) == 0x7C00 && (got & 0x3FF) : (got & 0x7F80) == 0x7F80 && (got & 0x7F);
    return got == (dt == NB_DTYPE_F16 ? ref_f16(want) : ref_bf16(want));
}

/* ------------------------------------------------------------ the decoders */

static void test_element_values(void) {
    int bad = 0;
    for (int c = 0; c < 256; c++) {
        bad += f2u(nb_element_to_float(NB_ELEMENT_INT8, (uint8_t)c)) != f2u((float)ref_int(NB_ELEMENT_INT8, c));
        bad += f2u(nb_element_to_float(NB_ELEMENT_UINT4, (uint8_t)c)) != f2u((float)(c & 15));
        bad += f2u(nb_element_to_float(NB_ELEMENT_INT4, (uint8_t)c)) != f2u((float)ref_int(NB_ELEMENT_INT4, c & 15));
        bad += f2u(nb_element_to_float(NB_ELEMENT_NF4, (uint8_t)c)) != f2u(ref_table(NB_ELEMENT_NF4, c & 15));
        bad += f2u(nb_element_to_float(NB_ELEMENT_FP4_BNB, (uint8_t)c)) != f2u(ref_table(NB_ELEMENT_FP4_BNB, c & 15));
    }
    CHECK(bad == 0, "nb_element_to_float: %d codes differ from the tables", bad);
    /* the bitsandbytes tables as their float32 bit patterns (the quant_map a checkpoint stores) */
    static const uint32_t nf4_bits[16] = {0xBF800000, 0xBF3239B1, 0xBF066B30, 0xBECA32A0, 0xBE91A24D, 0xBE3D353F,
                                          0xBDBA7871, 0x00000000, 0x3DA2FAFF, 0x3E24CAE3, 0x3E7C04DD, 0x3EAD033A,
                                          0x3EE1A4B8, 0x3F1007AB, 0x3F3913B3, 0x3F800000};
    static const uint32_t fp4_bits[16] = {0x00000000, 0x3BAAAAAB, 0x3F2AAAAB, 0x3F800000, 0x3EAAAAAB, 0x3F000000,
                                          0x3E2AAAAB, 0x3E800000, 0x00000000, 0xBBAAAAAB, 0xBF2AAAAB, 0xBF800000,
                                          0xBEAAAAAB, 0xBF000000, 0xBE2AAAAB, 0xBE800000};
    for (int c = 0; c < 16; c++) {
        CHECK(f2u(nb_element_to_float(NB_ELEMENT_NF4, (uint8_t)c)) == nf4_bits[c], "nf4 code %d: 0x%08X, want 0x%08X",
              c, f2u(nb_element_to_float(NB_ELEMENT_NF4, (uint8_t)c)), nf4_bits[c]);
        CHECK(f2u(nb_element_to_float(NB_ELEMENT_FP4_BNB, (uint8_t)c)) == fp4_bits[c],
              "bnb_fp4 code %d: 0x%08X, want 0x%08X", c, f2u(nb_element_to_float(NB_ELEMENT_FP4_BNB, (uint8_t)c)),
              fp4_bits[c]);
    }
    CHECK(isnan(nb_element_to_float((nb_element_type)0, 1)) && isnan(nb_element_to_float((nb_element_type)7, 1)),
          "an unknown element type decodes as NaN");
}

/* Every code x every 16-bit scale pattern (one per group: n * k / g groups
 * cover the 65536 patterns) x zero points, to each destination dtype. */
static void test_dequant_int_exhaustive(nb_context *ctx, const fmt_case *fc, nb_scale_type stype, nb_dtype dt) {
    const int g = 32, codes_per = 1 << fc->bits;
    const int64_t k = fc->bits == 8 ? 256 : 64, ng = k / g, n = 65536 / ng;
    nb_weight_desc d;
    nb_status st = desc_for(&d, fc->f, n, k, g, stype);
    CHECK(st == NB_OK, "%s desc: %s", fc->name, nb_last_error());
    nb_weight_sizes_v2 sz;
    nb_weight_get_sizes_v2(&d, &sz);
    uint8_t *codes = calloc(sz.codes_bytes, 1), *scales = malloc(sz.scales_bytes), *zeros = NULL;
    void *out = malloc((size_t)(n * k) * 4);
    static const uint8_t zps[6] = {0, 1, 7, 8, 15, 255};
    if (fc->zp) zeros = malloc(sz.zeros_bytes);
    for (int64_t r = 0; r < n; r++)
        for (int64_t j = 0; j < k; j++) put_code(codes, fc->bits, (size_t)(r * k + j), (int)((j + r) % codes_per));
    for (int64_t gi = 0; gi < n * ng; gi++) {
        scales[2 * gi] = (uint8_t)gi, scales[2 * gi + 1] = (uint8_t)(gi >> 8);
        if (zeros) zeros[gi] = zps[gi % 6];
    }
    nb_weight_data w = {.codes = codes, .scales = scales, .zeros = zeros};
    st = nb_dequantize_host_v2(ctx, &d, &w, dt, out);
    CHECK(st == NB_OK, "dequantize %s %s -> %s: %s", fc->name, stype == NB_SCALE_F16 ? "f16" : "bf16", dt_name(dt),
          nb_last_error());
    int64_t bad = 0, first = -1, nans = 0;
    for (int64_t i = 0; st == NB_OK && i < n * k; i++) {
        const int64_t gi = i / g;
        const double q = ref_int(fc->el, get_code(codes, fc->bits, (size_t)i)) - (zeros ? zeros[gi] : 0);
        const double s = stype == NB_SCALE_F16 ? ref_f16_to_f32((uint16_t)gi) : ref_bf16_to_f32((uint16_t)gi);
        const float want = (float)(q * s); /* exact in double; float rounds once */
        nans += isnan(want);
        if (!same_as(dt, out, (size_t)i, want) && !bad++) first = i;
    }
    CHECK(bad == 0, "dequantize %s %s -> %s: %lld mismatches, first element %lld (group %lld)", fc->name,
          stype == NB_SCALE_F16 ? "f16" : "bf16", dt_name(dt), (long long)bad, (long long)first,
          (long long)(first / g));
    CHECK(nans > 0, "the scale patterns include NaN and infinity (0 x inf)");
    free(codes), free(scales), free(zeros), free(out);
}

/* The tables x F32 absmax classes (the absmax is used as stored: zero,
 * negative zero, subnormal, infinity and NaN included). */
static void test_dequant_table(nb_context *ctx, const fmt_case *fc, nb_dtype dt) {
    static const uint32_t sbits[] = {0x00000000, 0x80000000, 0x00000001, 0x00400000, 0x00800000, 0x3F800000,
                                     0x3EBD70A4, 0x7F7FFFFF, 0x7F000000, 0x7F800000, 0xFF800000, 0x7FC00000,
                                     0xC0490FDB, 0x3AAAAAAB, 0x477FE000, 0x38800000, 0x33800000, 0x4B000001};
    enum { NS = sizeof sbits / sizeof sbits[0], G = 32, EXTRA = 14 };
    const int64_t ng = NS + EXTRA, n = 2, k = ng * G / n;
    nb_weight_desc d;
    nb_weight_desc_init(&d, fc->f, n, k);
    d.group_size = G;
    uint8_t codes[NS + EXTRA][G / 2];
    float scales[NS + EXTRA];
    for (int i = 0; i < NS + EXTRA; i++) scales[i] = u2f(i < NS ? sbits[i] : (uint32_t)rnd_u64());
    for (size_t i = 0; i < sizeof codes; i++) ((uint8_t *)codes)[i] = (uint8_t)(i * 7 + 3 * (i >> 4));
    float *out = malloc(sizeof(float) * (size_t)(n * k));
    nb_weight_data w = {.codes = codes, .scales = scales};
    nb_status st = nb_dequantize_host_v2(ctx, &d, &w, dt, out);
    CHECK(st == NB_OK, "dequantize %s -> %s: %s", fc->name, dt_name(dt), nb_last_error());
    int64_t bad = 0, first = -1;
    for (int64_t i = 0; st == NB_OK && i < n * k; i++) {
        /* float32 product (exact in double, then one rounding to float), then the destination */
        const float want = (float)((double)ref_table(fc->el, nib((const uint8_t *)codes, (size_t)i)) * scales[i / G]);
        if (!same_as(dt, out, (size_t)i, want) && !bad++) first = i;
    }
    CHECK(bad == 0, "dequantize %s -> %s: %lld mismatches, first %lld (absmax 0x%08X)", fc->name, dt_name(dt),
          (long long)bad, (long long)first, first < 0 ? 0 : f2u(scales[first / G]));
    free(out);
}

/* ------------------------------------------------- the reference quantizers */

/* formats.md 5.1 in float32: the codes (one per element), scale bits and
 * zero points of a [n, k] matrix with group g. */
static int ref_quant_int(const fmt_case *fc, nb_scale_type stype, int64_t n, int64_t k, int64_t g, const float *w,
                         uint8_t *codes, uint16_t *sbits, uint8_t *zeros) {
    const float levels = (float)((1 << fc->bits) - 1), div = fc->zp ? levels : levels / 2.0f;
    const int qlo = fc->zp ? 0 : -(1 << (fc->bits - 1)), qhi = fc->zp ? (int)levels : (1 << (fc->bits - 1)) - 1;
    for (int64_t r = 0; r < n; r++)
        for (int64_t b = 0; b < k / g; b++) {
            const float *v = w + r * k + b * g;
            float lo = 0, hi = 0, amax = 0;
            for (int64_t j = 0; j < g; j++) {
                lo = v[j] < lo ? v[j] : lo;
                hi = v[j] > hi ? v[j] : hi;
                amax = fabsf(v[j]) > amax ? fabsf(v[j]) : amax;
            }
            const float s32 = (fc->zp ? hi - lo : amax) / div;
            uint16_t h = stype == NB_SCALE_F16 ? ref_f16(s32) : ref_bf16(s32);
            float s = stype == NB_SCALE_F16 ? ref_f16_to_f32(h) : ref_bf16_to_f32(h);
            if (isinf(s)) return 0;
            if (s == 0.0f) h = stype == NB_SCALE_F16 ? 0x3C00 : 0x3F80, s = 1.0f;
            const int64_t gi = r * (k / g) + b;
            sbits[gi] = h;
            float z = 0;
            if (fc->zp) {
                z = nearbyintf(-lo / s);
                z = z > levels ? levels : z;
                zeros[gi] = (uint8_t)z;
            }
            for (int64_t j = 0; j < g; j++) {
                float q = nearbyintf(v[j] / s) + z;
                int qi = q < (float)qlo ? qlo : q > (float)qhi ? qhi : (int)q;
                codes[r * k + b * g + j] = (uint8_t)(qi & ((1 << fc->bits) - 1));
            }
        }
    return 1;
}

/* formats.md 4.2: absmax, x = clamp(w * fl(1 / max(absmax, 1e-38)), -1, 1),
 * the first sorted value whose midpoint with the next is >= x. */
static void ref_quant_table(const fmt_case *fc, int64_t n, int64_t k, int64_t g, const float *w, uint8_t *codes,
                            float *absmax) {
    int order[16];
    for (int i = 0; i < 16; i++) order[i] = i;
    for (int i = 1; i < 16; i++) /* stable insertion sort by value: FP4's +0 (code 0) before code 8 */
        for (int j = i; j > 0 && ref_table(fc->el, order[j - 1]) > ref_table(fc->el, order[j]); j--) {
            int t = order[j];
            order[j] = order[j - 1], order[j - 1] = t;
        }
    for (int64_t gi = 0; gi < n * k / g; gi++) {
        const float *v = w + gi * g;
        float a = 0;
        for (int64_t j = 0; j < g; j++) a = fabsf(v[j]) > a ? fabsf(v[j]) : a;
        absmax[gi] = a;
        const float inv = 1.0f / (a > 1e-38f ? a : 1e-38f);
        for (int64_t j = 0; j < g; j++) {
            float x = v[j] * inv;
            x = x < -1 ? -1 : x > 1 ? 1 : x;
            int i = 0;
            while (i < 15 && (ref_table(fc->el, order[i]) + ref_table(fc->el, order[i + 1])) / 2.0f < x) i++;
            codes[gi * g + j] = (uint8_t)order[i];
        }
    }
}

/* Gaussian values (Box-Muller), each row at its own scale, with edge groups
 * mixed in: all zero, all positive, all negative, one non-zero value, ties. */
static void fill_weights(float *w, int64_t n, int64_t k, int64_t g) {
    for (int64_t r = 0; r < n; r++) {
        const double rs = ldexp(1.0, (int)(r % 9) - 4);
        for (int64_t j = 0; j < k; j++) {
            double u1 = rnd_unit(), u2 = rnd_unit();
            w[r * k + j] = (float)(rs * sqrt(-2.0 * log(u1 + 1e-300)) * cos(6.283185307179586 * u2));
        }
        const int64_t b = (r % (k / g)) * g, kind = r % 6;
        for (int64_t j = 0; j < g; j++) {
            float *v = &w[r * k + b + j];
            if (kind == 1) *v = 0.0f;
            else if (kind == 2) *v = fabsf(*v);
            else if (kind == 3) *v = -fabsf(*v);
            else if (kind == 4) *v = j == 3 ? (float)rs : 0.0f;
            else if (kind == 5) *v = (float)((int)(j % 31) - 15) * 0.5f; /* x.5 ties at scale 1 */
        }
    }
}

/* Quantize with the library (v2) and the reference; compare every byte. */
static void check_quantize(nb_context *ctx, const fmt_case *fc, nb_scale_type stype, int64_t n, int64_t k, int64_t g,
                           nb_dtype src_dt, const char *what) {
    float *w = malloc(sizeof(float) * (size_t)(n * k));
    void *src = malloc((size_t)(n * k) * 4);
    fill_weights(w, n, k, g);
    for (int64_t i = 0; i < n * k; i++) store_as(src_dt, src, (size_t)i, w[i]);
    /* the reference sees the values the library reads */
    for (int64_t i = 0; i < n * k && src_dt != NB_DTYPE_F32; i++)
        w[i] = src_dt == NB_DTYPE_F16 ? ref_f16_to_f32(((uint16_t *)src)[i]) : ref_bf16_to_f32(((uint16_t *)src)[i]);
    nb_weight_desc d;
    nb_status st = desc_for(&d, fc->f, n, k, g, stype);
    nb_weight_sizes_v2 sz;
    if (st == NB_OK) st = nb_weight_get_sizes_v2(&d, &sz);
    CHECK(st == NB_OK, "%s %s: %s", fc->name, what, nb_last_error());
    if (st != NB_OK) {
        free(w), free(src);
        return;
    }
    uint8_t *codes = malloc(sz.codes_bytes), *scales = malloc(sz.scales_bytes);
    uint8_t *zeros = sz.zeros_bytes ? malloc(sz.zeros_bytes) : NULL;
    uint8_t *rc = malloc((size_t)(n * k)), *rz = malloc((size_t)(n * k / g));
    float *rs = malloc(sizeof(float) * (size_t)(n * k / g));
    uint16_t *rh = malloc(2 * (size_t)(n * k / g));
    nb_weight_buffers out = {.codes = codes, .scales = scales, .zeros = zeros};
    st = nb_quantize_host_v2(ctx, &d, src_dt, src, &out);
    CHECK(st == NB_OK, "quantize %s %s: %s", fc->name, what, nb_last_error());
    int64_t bad_c = -1, bad_s = -1, bad_z = -1;
    if (st == NB_OK) {
        if (fc->table) ref_quant_table(fc, n, k, g, w, rc, rs);
        else CHECK(ref_quant_int(fc, stype, n, k, g, w, rc, rh, rz), "reference: scale overflow");
        for (int64_t i = 0; i < n * k && bad_c < 0; i++)
            if (get_code(codes, fc->bits, (size_t)i) != rc[i]) bad_c = i;
        for (int64_t i = 0; i < n * k / g; i++) {
            const int same = fc->table ? f2u(scale_value(stype, scales, (size_t)i)) == f2u(rs[i])
                                       : (uint16_t)(scales[2 * i] | scales[2 * i + 1] << 8) == rh[i];
            if (!same && bad_s < 0) bad_s = i;
            if (zeros && zeros[i] != rz[i] && bad_z < 0) bad_z = i;
        }
    }
    CHECK(bad_c < 0, "quantize %s %s: code [%lld, %lld] %d, want %d (w %.9g, scale %g)", fc->name, what,
          (long long)(bad_c / k), (long long)(bad_c % k), bad_c < 0 ? 0 : get_code(codes, fc->bits, (size_t)bad_c),
          bad_c < 0 ? 0 : rc[bad_c], bad_c < 0 ? 0.0 : (double)w[bad_c],
          bad_c < 0 ? 0.0 : (double)scale_value(stype, scales, (size_t)(bad_c / g)));
    CHECK(bad_s < 0, "quantize %s %s: scale of group %lld differs", fc->name, what, (long long)bad_s);
    CHECK(bad_z < 0, "quantize %s %s: zero point of group %lld is %d, want %d", fc->name, what, (long long)bad_z,
          bad_z < 0 ? 0 : zeros[bad_z], bad_z < 0 ? 0 : rz[bad_z]);
    free(w), free(src), free(codes), free(scales), free(zeros), free(rc), free(rz), free(rs), free(rh);
}

/* --------------------------------------------------------- known answers */

static void quantize_one_group(nb_context *ctx, nb_format f, const float *v, int g, uint8_t *codes, uint8_t *scales,
                               uint8_t *zeros) {
    nb_weight_desc d;
    nb_weight_desc_init(&d, f, 1, g);
    d.group_size = g;
    nb_weight_buffers out = {.codes = codes, .scales = scales, .zeros = zeros};
    nb_status st = nb_quantize_host_v2(ctx, &d, NB_DTYPE_F32, v, &out);
    CHECK(st == NB_OK, "quantize one group: %s", nb_last_error());
}

static void test_known_answers(nb_context *ctx) {
    float v[32];
    uint8_t codes[32], scales[8], zeros[1];
    /* int4 with zero points: lo = -5, hi = 10 -> s = 15/15 = 1, z = 5; 0.5 -> round(0.5) + 5 = 5 (adding
     * before rounding would give round(5.5) = 6), 1.5 -> 2 + 5 = 7, -0.5 -> 5, -2.5 -> -2 + 5 = 3,
     * 10 -> 15, -5 -> 0 */
    static const float a[8] = {-5, 10, 0.5f, 1.5f, -0.5f, -2.5f, 2.5f, 0};
    static const int qa[8] = {0, 15, 5, 7, 5, 3, 7, 5};
    for (int j = 0; j < 32; j++) v[j] = a[j % 8];
    quantize_one_group(ctx, NB_FORMAT_INT4, v, 32, codes, scales, zeros);
    CHECK(scales[0] == 0x00 && scales[1] == 0x3C && zeros[0] == 5, "int4: scale 0x%02X%02X (want 0x3C00), zero %d",
          scales[1], scales[0], zeros[0]);
    for (int j = 0; j < 8; j++) CHECK(nib(codes, (size_t)j) == qa[j], "int4: %g -> %d, want %d", (double)a[j], nib(codes, (size_t)j), qa[j]);
    /* all zero: scale stored as 1.0, zero point 0, codes 0 */
    memset(v, 0, sizeof v);
    quantize_one_group(ctx, NB_FORMAT_INT4, v, 32, codes, scales, zeros);
    CHECK(scales[0] == 0x00 && scales[1] == 0x3C && zeros[0] == 0 && codes[0] == 0, "int4 zero group");
    /* all positive: lo = 0 -> z = 0; 3 values: 0, 7.5, 15 at s = 1 -> 0, 8 (7.5 -> even), 15 */
    for (int j = 0; j < 32; j++) v[j] = j % 3 == 0 ? 0.0f : j % 3 == 1 ? 7.5f : 15.0f;
    quantize_one_group(ctx, NB_FORMAT_INT4, v, 32, codes, scales, zeros);
    CHECK(zeros[0] == 0 && nib(codes, 0) == 0 && nib(codes, 1) == 8 && nib(codes, 2) == 15, "int4 positive group");
    /* a range F16 cannot hold as a scale: refused */
    v[0] = 65504.0f * 16;
    nb_weight_desc d;
    nb_weight_desc_init(&d, NB_FORMAT_INT4, 1, 32);
    d.group_size = 32;
    nb_weight_buffers out = {.codes = codes, .scales = scales, .zeros = zeros};
    CHECK(nb_quantize_host_v2(ctx, &d, NB_DTYPE_F32, v, &out) == NB_ERR_INVALID_ARGUMENT &&
              strstr(nb_last_error(), "f16"),
          "int4 scale overflow: %s", nb_last_error());
    d.scale_type = NB_SCALE_BF16; /* BF16 holds it */
    CHECK(nb_quantize_host_v2(ctx, &d, NB_DTYPE_F32, v, &out) == NB_OK, "int4 bf16 scale: %s", nb_last_error());
    /* tiny values: the scale underflows F16 to zero and is stored as 1.0 */
    for (int j = 0; j < 32; j++) v[j] = j % 2 ? 1e-9f : -2e-9f;
    quantize_one_group(ctx, NB_FORMAT_INT4_SYM, v, 32, codes, scales, NULL);
    CHECK(scales[0] == 0x00 && scales[1] == 0x3C && codes[0] == 0, "int4_sym underflow: scale 0x%02X%02X", scales[1],
          scales[0]);

    /* int4_sym: amax 7.5 -> s = 1; 2.5 -> 2, -2.5 -> -2, 3.5 -> 4, 7.5 -> 8 -> 7, -7.5 -> -8, -0.4 -> -0 -> 0 */
    static const float b[8] = {7.5f, -7.5f, 2.5f, -2.5f, 3.5f, -0.4f, 0.5f, -1.5f};
    static const int qb[8] = {7, -8, 2, -2, 4, 0, 0, -2};
    for (int j = 0; j < 32; j++) v[j] = b[j % 8];
    quantize_one_group(ctx, NB_FORMAT_INT4_SYM, v, 32, codes, scales, NULL);
    CHECK(scales[0] == 0x00 && scales[1] == 0x3C, "int4_sym scale 0x%02X%02X", scales[1], scales[0]);
    for (int j = 0; j < 8; j++)
        CHECK(nib(codes, (size_t)j) == (qb[j] & 15), "int4_sym: %g -> 0x%X, want %d", (double)b[j], nib(codes, (size_t)j), qb[j]);
    /* int8: amax 127.5 -> s = 1; 127.5 -> 128 -> 127, -127.5 -> -128, 0.5 -> 0, 1.5 -> 2 */
    static const float c8[4] = {127.5f, -127.5f, 0.5f, 1.5f};
    static const int q8[4] = {127, -128, 0, 2};
    for (int j = 0; j < 32; j++) v[j] = c8[j % 4];
    quantize_one_group(ctx, NB_FORMAT_INT8, v, 32, codes, scales, NULL);
    for (int j = 0; j < 4; j++) CHECK(codes[j] == (uint8_t)q8[j], "int8: %g -> %d, want %d", (double)c8[j], (int8_t)codes[j], q8[j]);

    /* nf4 / bnb_fp4 ties: with absmax 1 (the group holds 1.0) x = w; a value on a float32 midpoint goes to the
     * smaller neighbour, the next float up to the larger */
    for (int t = 0; t < 2; t++) {
        const fmt_case *fc = &k_cases[3 + t];
        int order[16];
        for (int i = 0; i < 16; i++) order[i] = i;
        for (int i = 1; i < 16; i++)
            for (int j = i; j > 0 && ref_table(fc->el, order[j - 1]) > ref_table(fc->el, order[j]); j--) {
                int tmp = order[j];
                order[j] = order[j - 1], order[j - 1] = tmp;
            }
        for (int i = 0; i < 15; i++) {
            const float mid = (ref_table(fc->el, order[i]) + ref_table(fc->el, order[i + 1])) / 2.0f;
            for (int j = 0; j < 32; j++) v[j] = j == 0 ? 1.0f : j % 2 ? mid : nextafterf(mid, 2.0f);
            quantize_one_group(ctx, fc->f, v, 32, codes, scales, NULL);
            CHECK(nib(codes, 1) == order[i] && nib(codes, 2) == order[i + 1],
                  "%s midpoint %d (%a): codes %d, %d, want %d, %d", fc->name, i, (double)mid, nib(codes, 1),
                  nib(codes, 2), order[i], order[i + 1]);
        }
        /* an all-zero group: absmax 0, every code the table's (first) zero */
        memset(v, 0, sizeof v);
        quantize_one_group(ctx, fc->f, v, 32, codes, scales, NULL);
        CHECK(!memcmp(scales, "\0\0\0\0", 4) && nib(codes, 5) == (t ? 0 : 7), "%s zero group: code %d", fc->name,
              nib(codes, 5));
    }
}

/* int4: codes on the grid of an exact scale, with both ends of the range
 * in every group, quantize back to themselves (scales and zeros too); nf4
 * and bnb_fp4 round trip whole (FP4's two zero codes both come back as
 * code 0 from zero values). */
static void test_round_trips(nb_context *ctx) {
    const int64_t n = 8, k = 256, g = 64;
    float *w = malloc(sizeof(float) * (size_t)(n * k)), *back = malloc(sizeof(float) * (size_t)(n * k));
    uint8_t c1[8 * 256], c2[8 * 256], s1[4 * 32], s2[4 * 32], z1[32], z2[32];
    for (int64_t gi = 0; gi < n * k / g; gi++) {
        const int z = (int)(gi * 5 % 16);
        const float s = ldexpf(1.0f, (int)(gi % 7) - 3);
        for (int64_t j = 0; j < g; j++) {
            const int q = j == 0 ? 0 : j == 1 ? 15 : (int)(rnd_u64() % 16);
            w[gi * g + j] = (float)(q - z) * s;
        }
    }
    nb_weight_desc d;
    nb_weight_desc_init(&d, NB_FORMAT_INT4, n, k);
    d.group_size = (int32_t)g;
    nb_weight_buffers o1 = {.codes = c1, .scales = s1, .zeros = z1}, o2 = {.codes = c2, .scales = s2, .zeros = z2};
    nb_weight_data r1 = {.codes = c1, .scales = s1, .zeros = z1};
    CHECK(nb_quantize_host_v2(ctx, &d, NB_DTYPE_F32, w, &o1) == NB_OK, "%s", nb_last_error());
    CHECK(nb_dequantize_host_v2(ctx, &d, &r1, NB_DTYPE_F32, back) == NB_OK, "%s", nb_last_error());
    CHECK(!memcmp(w, back, sizeof(float) * (size_t)(n * k)), "int4: grid values do not dequantize to themselves");
    CHECK(nb_quantize_host_v2(ctx, &d, NB_DTYPE_F32, back, &o2) == NB_OK, "%s", nb_last_error());
    CHECK(!memcmp(c1, c2, (size_t)(n * k / 2)) && !memcmp(s1, s2, (size_t)(n * k / g * 2)) &&
              !memcmp(z1, z2, (size_t)(n * k / g)),
          "int4 round trip changed the bytes");
    for (int t = 0; t < 2; t++) {
        const fmt_case *fc = &k_cases[3 + t];
        fill_weights(w, n, k, g);
        nb_weight_desc_init(&d, fc->f, n, k);
        d.group_size = (int32_t)g;
        nb_weight_buffers p1 = {.codes = c1, .scales = s1}, p2 = {.codes = c2, .scales = s2};
        nb_weight_data q1 = {.codes = c1, .scales = s1};
        CHECK(nb_quantize_host_v2(ctx, &d, NB_DTYPE_F32, w, &p1) == NB_OK, "%s", nb_last_error());
        CHECK(nb_dequantize_host_v2(ctx, &d, &q1, NB_DTYPE_F32, back) == NB_OK, "%s", nb_last_error());
        CHECK(nb_quantize_host_v2(ctx, &d, NB_DTYPE_F32, back, &p2) == NB_OK, "%s", nb_last_error());
        int64_t bad = -1;
        for (int64_t i = 0; i < n * k && bad < 0; i++) {
            const int a = nib(c1, (size_t)i), b = nib(c2, (size_t)i);
            if (b != (t && a == 8 ? 0 : a)) bad = i;
        }
        CHECK(bad < 0 && !memcmp(s1, s2, (size_t)(n * k / g * 4)), "%s round trip: code %lld %d -> %d", fc->name,
              (long long)bad, bad < 0 ? 0 : nib(c1, (size_t)bad), bad < 0 ? 0 : nib(c2, (size_t)bad));
    }
    free(w), free(back);
}

/* Formats without zero points: the first-version functions give the same
 * bytes and values as the _v2 ones (NVFP4 and MXFP4 included). */
static void test_v1_equals_v2(nb_context *ctx) {
    static const nb_format fs[6] = {NB_FORMAT_NVFP4, NB_FORMAT_MXFP4, NB_FORMAT_INT4_SYM, NB_FORMAT_INT8,
                                    NB_FORMAT_NF4, NB_FORMAT_BNB_FP4};
    const int64_t n = 5, k = 256, m = 3;
    float *w = malloc(sizeof(float) * (size_t)(n * k)), *x = malloc(sizeof(float) * (size_t)(m * k));
    fill_weights(w, n, k, 128);
    for (int64_t i = 0; i < m * k; i++) x[i] = (float)(rnd_unit() - 0.5);
    for (int f = 0; f < 6; f++) {
        nb_weight_desc d1, d2;
        nb_weight_desc_init(&d1, fs[f], n, k);
        d2 = d1;
        nb_weight_sizes sz;
        nb_weight_sizes_v2 sz2;
        CHECK(nb_weight_get_sizes(&d1, &sz) == NB_OK && nb_weight_get_sizes_v2(&d1, &sz2) == NB_OK &&
                  sz.codes_bytes == sz2.codes_bytes && sz.scales_bytes == sz2.scales_bytes &&
                  sz.packed_bytes == sz2.packed_bytes && sz2.zeros_bytes == 0,
              "format %d: sizes v1 and v2 differ", (int)fs[f]);
        uint8_t *c1 = malloc(sz.codes_bytes), *s1 = malloc(sz.scales_bytes);
        uint8_t *c2 = malloc(sz.codes_bytes), *s2 = malloc(sz.scales_bytes);
        float *o1 = malloc(sizeof(float) * (size_t)(n * k)), *o2 = malloc(sizeof(float) * (size_t)(n * k));
        double *y1 = malloc(sizeof(double) * (size_t)(m * n)), *y2 = malloc(sizeof(double) * (size_t)(m * n));
        nb_weight_buffers b = {.codes = c2, .scales = s2};
        nb_weight_data wd = {.codes = c2, .scales = s2};
        nb_gemm_desc g;
        CHECK(nb_quantize_host(ctx, &d1, NB_DTYPE_F32, w, c1, s1) == NB_OK &&
                  nb_quantize_host_v2(ctx, &d2, NB_DTYPE_F32, w, &b) == NB_OK,
              "format %d quantize: %s", (int)fs[f], nb_last_error());
        CHECK(!memcmp(c1, c2, sz.codes_bytes) && !memcmp(s1, s2, sz.scales_bytes) &&
                  f2u(d1.tensor_scale) == f2u(d2.tensor_scale),
              "format %d: quantize v1 and v2 differ", (int)fs[f]);
        CHECK(nb_dequantize_host(ctx, &d1, c1, s1, NB_DTYPE_F32, o1) == NB_OK &&
                  nb_dequantize_host_v2(ctx, &d1, &wd, NB_DTYPE_F32, o2) == NB_OK &&
                  !memcmp(o1, o2, sizeof(float) * (size_t)(n * k)),
              "format %d: dequantize v1 and v2 differ", (int)fs[f]);
        nb_gemm_desc_init(&g, &d1, m, NB_DTYPE_F32, NB_DTYPE_F32);
        CHECK(nb_gemm_host_f64(ctx, &g, x, c1, s1, NULL, y1) == NB_OK &&
                  nb_gemm_host_f64_v2(ctx, &g, x, &wd, NULL, y2) == NB_OK && !memcmp(y1, y2, sizeof(double) * (size_t)(m * n)),
              "format %d: gemm f64 v1 and v2 differ", (int)fs[f]);
        free(c1), free(s1), free(c2), free(s2), free(o1), free(o2), free(y1), free(y2);
    }
    free(w), free(x);
}

/* The reference GEMMs on int4 (zero points): float64 accumulation of the
 * dequantized weights, term for term; the float GEMM within its rounding. */
static void test_gemm_int4(nb_context *ctx) {
    const int64_t m = 4, n = 9, k = 192, g = 64;
    float *w = malloc(sizeof(float) * (size_t)(n * k)), *wq = malloc(sizeof(float) * (size_t)(n * k));
    float *x = malloc(sizeof(float) * (size_t)(m * k)), *y = malloc(sizeof(float) * (size_t)(m * n)), bias[9];
    double *y64 = malloc(sizeof(double) * (size_t)(m * n));
    uint8_t codes[9 * 96], scales[9 * 3 * 2], zeros[9 * 3];
    fill_weights(w, n, k, g);
    for (int64_t i = 0; i < m * k; i++) x[i] = (float)(rnd_unit() * 2 - 1);
    for (int i = 0; i < 9; i++) bias[i] = (float)i / 4 - 1;
    nb_weight_desc d;
    nb_weight_desc_init(&d, NB_FORMAT_INT4, n, k);
    d.group_size = (int32_t)g, d.scale_type = NB_SCALE_BF16;
    nb_weight_buffers o = {.codes = codes, .scales = scales, .zeros = zeros};
    nb_weight_data wd = {.codes = codes, .scales = scales, .zeros = zeros};
    CHECK(nb_quantize_host_v2(ctx, &d, NB_DTYPE_F32, w, &o) == NB_OK, "%s", nb_last_error());
    CHECK(nb_dequantize_host_v2(ctx, &d, &wd, NB_DTYPE_F32, wq) == NB_OK, "%s", nb_last_error());
    nb_gemm_desc gd;
    CHECK(nb_gemm_desc_init(&gd, &d, m, NB_DTYPE_F32, NB_DTYPE_F32) == NB_OK, "%s", nb_last_error());
    CHECK(nb_gemm_host_f64_v2(ctx, &gd, x, &wd, bias, y64) == NB_OK, "%s", nb_last_error());
    CHECK(nb_gemm_host_v2(ctx, &gd, x, &wd, bias, y) == NB_OK, "%s", nb_last_error());
    int bad64 = 0, badf = 0;
    for (int64_t i = 0; i < m; i++)
        for (int64_t r = 0; r < n; r++) {
            double acc = 0, mag = 0;
            for (int64_t j = 0; j < k; j++) acc += (double)x[i * k + j] * wq[r * k + j], mag += fabs((double)x[i * k + j] * wq[r * k + j]);
            bad64 += y64[i * n + r] != acc + bias[r];
            badf += fabs(y[i * n + r] - (acc + bias[r])) > 1e-6 * (mag + 1);
        }
    CHECK(bad64 == 0 && badf == 0, "int4 gemm: %d float64 and %d float results off", bad64, badf);
    free(w), free(wq), free(x), free(y), free(y64);
}

int main(void) {
    setvbuf(stdout, NULL, _IONBF, 0);
    nb_context *ctx = NULL;
    if (nb_context_create(NB_DEVICE_NONE, &ctx) != NB_OK) {
        printf("cannot create a host context: %s\n", nb_last_error());
        return 1;
    }
    static const nb_dtype dts[3] = {NB_DTYPE_F32, NB_DTYPE_F16, NB_DTYPE_BF16};
    test_element_values();
    for (int c = 0; c < 3; c++)
        for (int di = 0; di < 3; di++) {
            test_dequant_int_exhaustive(ctx, &k_cases[c], NB_SCALE_F16, dts[di]);
            test_dequant_int_exhaustive(ctx, &k_cases[c], NB_SCALE_BF16, dts[di]);
        }
    for (int c = 3; c < 5; c++)
        for (int di = 0; di < 3; di++) test_dequant_table(ctx, &k_cases[c], dts[di]);
    test_known_answers(ctx);

    /* every group a row accepts (per channel: g = k), each scale type, each source dtype */
    for (int c = 0; c < 5; c++) {
        const fmt_case *fc = &k_cases[c];
        nb_format_info fi;
        nb_format_get_info(fc->f, &fi);
        const int64_t n = 13, k = 768;
        for (int g = 32; g <= 4096; g *= 2) {
            if (!(fi.groups & g) || k % g) continue;
            for (int st = 3; st <= 5; st++) {
                if (!(fi.scale_types & NB_SCALE_BIT(st))) continue;
                for (int di = 0; di < 3; di++) {
                    char what[64];
                    snprintf(what, sizeof what, "g%d %s from %s", g, st == 3 ? "f16" : st == 4 ? "bf16" : "f32",
                             dt_name(dts[di]));
                    check_quantize(ctx, fc, (nb_scale_type)st, n, k, g, dts[di], what);
                }
            }
        }
        if (fi.groups & NB_GROUPS_PER_CHANNEL) check_quantize(ctx, fc, NB_SCALE_F16, n, 320, 320, NB_DTYPE_F32, "per channel");
        else CHECK(!(fc->zp), "%s: per channel", fc->name);
    }
    test_round_trips(ctx);
    test_v1_equals_v2(ctx);
    test_gemm_int4(ctx);

    nb_context_destroy(ctx);
    printf("%d passed, %d failed\n", g_pass, g_fail);
    return g_fail ? 1 : 0;
}
