/* test_pack_int.c - the packed layout of the integer formats (int4 with
 * zero points, int4_sym; docs/formats.md section 8.7; int8, section 8.9)
 * and of bitsandbytes' table formats (nf4, bnb_fp4; section 8.8), on the
 * CPU; and the E2M1 word (section 8.2) against the kernels' decoders.
 *
 *   - nb_pack_host_v2's bytes against the layout written out here from the
 *     document (element (r, c) -> chunk, lane, word, nibble; scale and zero
 *     point (r, kernel group) -> byte), for every group (32, 64, 128, 256,
 *     one per row) and scale type, ragged n and k, padding zero;
 *   - nb_unpack_host_v2 gives the checkpoint buffers back exactly;
 *   - the decode kernel's arithmetic emulated from the packed bytes, in
 *     double: integers: the 16-bit magic-number operand (q - z) for BF16
 *     and FP16 and one FP32-exact scale per kernel group, equal to
 *     nb_gemm_host_f64_v2 within rounding of the double sums; tables: the
 *     operand is the table value rounded to the activation dtype (the
 *     planes nbi_table_planes builds, read by byte as the kernel's PRMT
 *     lookup reads them) and the F32 absmax per kernel group, equal to the
 *     same sum written from the checkpoint buffers within rounding of the
 *     double sums, and within the stated bound of nb_gemm_host_f64_v2
 *     (DESIGN.md 4.2.2: per element |x| |absmax| |r16(v) - v| plus the
 *     reference's own float32 rounding of v * absmax);
 *   - the E2M1 word (internal.h NBI_E2M1_PUT / GET): every bit of a word
 *     belongs to one element, and both decoders the kernels run
 *     (gemv_step.cuh decode_pair: compile-time shifts per pair;
 *     tc_dequant.cuh nbc_decode_pair_lane: a rotation and a multiply per
 *     lane), written out here, turn every code in every position, beside
 *     random neighbours, into the 16-bit BF16 / FP16 pattern whose value is
 *     the code's times 2^-126 / 2^-14;
 *   - the zero-point range nb_pack_host_v2 stores in the descriptor; the
 *     first-version functions refuse int4 and take int4_sym, nf4, bnb_fp4;
 *     the argument checks of the _v2 functions.
 * Output: one line per failed check, then "N passed, M failed". */
#include <nibble.h>

#include "internal.h" /* nbi_table_planes (this test compiles the library's C sources in) */

#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define TESTLIB_SEED 0x13198A2E03707344ull
#include "testlib.h"

/* The document's kernel group: the group when 32, 64 or 128, else 128. */
static int kgroup(int group) { return group == 32 || group == 64 || group == 128 ? group : 128; }

/* Code bytes of one chunk: 16 x 128 codes of 4 bits, or of 8 (int8). */
static size_t code_bytes(nb_format f) { return f == NB_FORMAT_INT8 ? 2048 : 1024; }
/* Bytes of one chunk: the codes, 16 rows x (128 / kg) x (sb scale bytes + 1 zero byte with zero points). */
static size_t chunk_bytes(nb_format f, int group, int zp, int sb) {
    return code_bytes(f) + 16 * (size_t)(128 / kgroup(group)) * (sb + zp);
}

static int is_table(nb_format f) { return f == NB_FORMAT_NF4 || f == NB_FORMAT_BNB_FP4; }
static const char *fname(nb_format f) {
    return f == NB_FORMAT_INT4 ? "int4" : f == NB_FORMAT_INT4_SYM ? "int4_sym" : f == NB_FORMAT_INT8 ? "int8"
           : f == NB_FORMAT_NF4 ? "nf4" : "bnb_fp4";
}

/* The table value of code c rounded to the activation dtype (to nearest
 * even: testlib's rounding, not the library's), as a float. */
static float table16(nb_format f, nb_dtype act, int c) {
    const float v = nb_element_to_float(f == NB_FORMAT_NF4 ? NB_ELEMENT_NF4 : NB_ELEMENT_FP4_BNB, (uint8_t)c);
    return act == NB_DTYPE_BF16 ? ref_bf16_to_f32(ref_bf16(v)) : ref_f16_to_f32(ref_f16(v));
}

typedef struct layout_case {
    nb_format f;
    int64_t n, k;
    int group;
    nb_scale_type st;
} layout_case;

/* Random checkpoint buffers (zero points over every byte value, scales any
 * finite 16-bit pattern; F32 absmax of either sign, 2^-20 .. 2^12). */
static void fill(const nb_weight_sizes_v2 *sz, int sb, uint8_t *codes, uint8_t *scales, uint8_t *zeros) {
    for (size_t i = 0; i < sz->codes_bytes; i++) codes[i] = (uint8_t)rnd_u64();
    for (size_t i = 0; i < sz->scales_bytes; i++) scales[i] = (uint8_t)rnd_u64();
    if (sb == 2)
        for (size_t i = 1; i < sz->scales_bytes; i += 2) scales[i] &= 0x3F; /* positive, finite in F16 and BF16 */
    else
        for (size_t i = 3; i < sz->scales_bytes; i += 4) scales[i] = (uint8_t)((scales[i] & 0x80) | (0x35 + scales[i] % 0x10));
    if (zeros)
        for (size_t i = 0; i < sz->zeros_bytes; i++) zeros[i] = (uint8_t)rnd_u64();
}

/* The packed bytes as the document states them, built element by element. */
static void expected_bytes(const layout_case *c, int zp, int sb, const uint8_t *codes, const uint8_t *scales,
                           const uint8_t *zeros, uint8_t *out, size_t bytes) {
    const int64_t n = c->n, k = c->k, kchunks = (k + 127) / 128, ng = k / c->group;
    const int kg = kgroup(c->group), gpc = 128 / kg;
    const size_t cb = chunk_bytes(c->f, c->group, zp, sb), code = code_bytes(c->f);
    memset(out, 0, bytes);
    static const int nibble_of[8] = {0, 4, 1, 5, 2, 6, 3, 7}, byte_of[4] = {0, 2, 1, 3};
    for (int64_t r = 0; r < n && c->f == NB_FORMAT_INT8; r++) /* int8 (8.9): byte (r, col) */
        for (int64_t col = 0; col < k; col++) {
            const int64_t rb = r / 16, kc = col / 128;
            const int rr = (int)(r % 16), kk = (int)(col % 128);
            const int g = rr % 8, h = rr / 8, G = kk / 32, t = (kk % 32) / 8, e = kk % 8;
            const int P = G / 2, w = 2 * (e / 4) + G % 2; /* piece, word */
            out[(size_t)(rb * kchunks + kc) * cb + 1024 * h + 512 * P + 16 * (4 * g + t) + 4 * w + byte_of[e % 4]] =
                codes[r * k + col];
        }
    for (int64_t r = 0; r < n && c->f != NB_FORMAT_INT8; r++)
        for (int64_t col = 0; col < k; col++) {
            const int64_t rb = r / 16, kc = col / 128;
            const int rr = (int)(r % 16), kk = (int)(col % 128);
            const int g = rr % 8, h = rr / 8, G = kk / 32, t = (kk % 32) / 8, e = kk % 8;
            const int lane = 4 * g + t, nib_pos = is_table(c->f) ? e : nibble_of[e]; /* tables: k order (8.8) */
            uint8_t *word = out + (size_t)(rb * kchunks + kc) * cb + 512 * h + 16 * lane + 4 * G;
            word[nib_pos / 2] |= (uint8_t)(nib(codes, (size_t)(r * k + col)) << (4 * (nib_pos % 2)));
        }
    for (int64_t r = 0; r < n; r++)
        for (int64_t kc = 0; kc < kchunks; kc++)
            for (int j = 0; j < gpc; j++) {
                const int64_t col = kc * 128 + (int64_t)kg * j;
                if (col >= k) continue;
                const int rr = (int)(r % 16), g = rr % 8, h = rr / 8;
                uint8_t *chunk = out + (size_t)((r / 16) * kchunks + kc) * cb;
                const size_t src = (size_t)(r * ng + col / c->group);
                memcpy(chunk + code + 2 * sb * gpc * g + sb * (h * gpc + j), scales + sb * src, (size_t)sb);
                if (zp) chunk[code + 16 * sb * gpc + 2 * gpc * g + h * gpc + j] = zeros[src];
            }
}

/* The decode kernel's arithmetic from the packed bytes, in double: per
 * chunk, lane, word G and element, the operand built the way the kernel
 * builds it (16-bit magic-number value minus the 16-bit value of magic +
 * z), per kernel group the sum times the scale.  Returns the largest
 * relative difference to ref [m, n]. */
static double emulate(const layout_case *c, int zp, nb_dtype act, const uint8_t *packed, const float *x, int64_t m,
                      const double *ref) {
    const int64_t n = c->n, k = c->k, kchunks = (k + 127) / 128;
    const int kg = kgroup(c->group), gpc = 128 / kg;
    const size_t cb = chunk_bytes(c->f, c->group, zp, 2), code = code_bytes(c->f);
    const int bf16 = act == NB_DTYPE_BF16, i8 = c->f == NB_FORMAT_INT8;
    const uint16_t magic = bf16 ? 0x4300 : 0x6400; /* 128 + q, 1024 + q */
    double worst = 0;
    for (int64_t r = 0; r < n; r++) {
        const int rr = (int)(r % 16), g = rr % 8, h = rr / 8;
        for (int64_t i = 0; i < m; i++) {
            double acc = 0, mag = 0;
            for (int64_t kc = 0; kc < kchunks; kc++) {
                const uint8_t *chunk = packed + (size_t)((r / 16) * kchunks + kc) * cb;
                for (int j = 0; j < gpc; j++) {
                    uint16_t sbits;
                    memcpy(&sbits, chunk + code + 4 * gpc * g + 2 * (h * gpc + j), 2);
                    const double s = c->st == NB_SCALE_BF16 ? ref_bf16_to_f32(sbits) : ref_f16_to_f32(sbits);
                    const int z = zp ? chunk[1024 + 32 * gpc + 2 * gpc * g + h * gpc + j] : 8;
                    const uint16_t zbits = (uint16_t)(magic | z);
                    double sum = 0;
                    for (int kk = kg * j; kk < kg * (j + 1); kk++) {
                        const int G = kk / 32, t = (kk % 32) / 8, e = kk % 8;
                        const int64_t col = kc * 128 + kk;
                        if (i8) { /* the byte (8.9), then the kernel's two 16-bit values (gemv_step.cuh i8_pair) */
                            static const int byte_of[4] = {0, 2, 1, 3};
                            const uint8_t b = chunk[1024 * h + 512 * (G / 2) + 16 * (4 * g + t) +
                                                    4 * (2 * (e / 4) + G % 2) + byte_of[e % 4]];
                            const uint16_t ab = bf16 ? (uint16_t)(0x4300 | (b & 0x7F)) : (uint16_t)(0x6400 | (b ^ 0x80));
                            const uint16_t bb = bf16 ? (uint16_t)(0x4300 | (b & 0x80)) : (uint16_t)0x6480;
                            const float a = bf16 ? ref_bf16_to_f32(ab) : ref_f16_to_f32(ab);
                            const float bv = bf16 ? ref_bf16_to_f32(bb) : ref_f16_to_f32(bb);
                            if (col < k) sum += (double)(a - bv) * x[i * k + col];
                            continue;
                        }
                        const int p = e % 2 ? 4 + e / 2 : e / 2; /* nibble of element e */
                        const uint32_t word = (uint32_t)chunk[512 * h + 16 * (4 * g + t) + 4 * G] |
                                              (uint32_t)chunk[512 * h + 16 * (4 * g + t) + 4 * G + 1] << 8 |
                                              (uint32_t)chunk[512 * h + 16 * (4 * g + t) + 4 * G + 2] << 16 |
                                              (uint32_t)chunk[512 * h + 16 * (4 * g + t) + 4 * G + 3] << 24;
                        /* one LOP3: mask the nibble, OR the magic, XOR 8 for two's complement codes */
                        const uint16_t qbits = (uint16_t)((magic | ((word >> (4 * p)) & 15)) ^ (zp ? 0 : 8));
                        const float a = bf16 ? ref_bf16_to_f32(qbits) : ref_f16_to_f32(qbits);
                        const float b = bf16 ? ref_bf16_to_f32(zbits) : ref_f16_to_f32(zbits);
                        if (col < k) sum += (double)(a - b) * x[i * k + col];
                    }
                    acc += s * sum;
                    mag += fabs(s * sum);
                }
            }
            const double d = fabs(acc - ref[i * n + r]) / (mag > 0 ? mag : 1);
            if (!(d <= worst)) worst = d; /* (a NaN difference stays as the worst) */
        }
    }
    return worst;
}

/* The table formats' kernel arithmetic from the packed bytes, in double:
 * per chunk, lane, word G and element e (nibble e), the operand is the
 * 16-bit value whose low byte is byte (c & 7) of planes word (c >> 2 & 2)
 * .. and high byte the same of the high planes (what the kernel's PRMT
 * lookup reads), and each kernel group's sum is multiplied by the F32
 * absmax of the packed tail.  out [m, n]. */
static void emulate_table(const layout_case *c, nb_dtype act, const uint32_t planes[8], const uint8_t *packed,
                          const float *x, int64_t m, double *out) {
    const int64_t n = c->n, k = c->k, kchunks = (k + 127) / 128;
    const int kg = kgroup(c->group), gpc = 128 / kg;
    const size_t cb = chunk_bytes(c->f, c->group, 0, 4);
    (void)act;
    for (int64_t r = 0; r < n; r++) {
        const int rr = (int)(r % 16), g = rr % 8, h = rr / 8;
        for (int64_t i = 0; i < m; i++) {
            double acc = 0;
            for (int64_t kc = 0; kc < kchunks; kc++) {
                const uint8_t *chunk = packed + (size_t)((r / 16) * kchunks + kc) * cb;
                for (int j = 0; j < gpc; j++) {
                    float a;
                    memcpy(&a, chunk + 1024 + 8 * gpc * g + 4 * (h * gpc + j), 4);
                    double sum = 0;
                    for (int kk = kg * j; kk < kg * (j + 1); kk++) {
                        const int G = kk / 32, t = (kk % 32) / 8, e = kk % 8;
                        const uint8_t byte = chunk[512 * h + 16 * (4 * g + t) + 4 * G + e / 2];
                        const int code = (byte >> (4 * (e % 2))) & 15;
                        const int w = code >> 2, b = code & 3; /* plane word and byte of the code */
                        const uint16_t bits = (uint16_t)(((planes[w] >> (8 * b)) & 0xFF) |
                                                         ((planes[4 + w] >> (8 * b)) & 0xFF) << 8);
                        const float v = act == NB_DTYPE_BF16 ? ref_bf16_to_f32(bits) : ref_f16_to_f32(bits);
                        const int64_t col = kc * 128 + kk;
                        if (col < k) sum += (double)v * x[i * k + col];
                    }
                    acc += (double)a * sum;
                }
            }
            out[i * n + r] = acc;
        }
    }
}

/* The table formats: the emulated kernel against (1) the same arithmetic
 * written from the checkpoint buffers (operand: table value rounded to act
 * by testlib; the documented absmax of the element's group), within
 * rounding of the double sums, and (2) the float64 reference within the
 * bound of DESIGN.md 4.2.2. */
static void check_table(const layout_case *c, const nb_weight_data *w, const uint8_t *packed, const float *x,
                        int64_t m, const double *ref, const char *what) {
    const int64_t n = c->n, k = c->k, ng = k / c->group;
    double *emu = malloc(sizeof(double) * (size_t)(m * n));
    for (int a = 0; a < 2; a++) {
        const nb_dtype act = a ? NB_DTYPE_F16 : NB_DTYPE_BF16;
        uint32_t planes[8];
        /* the planes the planner hands the kernel, checked against testlib's rounding first */
        nbi_table_planes(c->f == NB_FORMAT_NF4 ? NB_ELEMENT_NF4 : NB_ELEMENT_FP4_BNB, act, planes);
        int planes_ok = 1;
        for (int cd = 0; cd < 16; cd++) {
            const int wd = cd >> 2, b = cd & 3;
            const uint16_t bits = (uint16_t)(((planes[wd] >> (8 * b)) & 0xFF) | ((planes[4 + wd] >> (8 * b)) & 0xFF) << 8);
            const uint16_t want = act == NB_DTYPE_BF16 ? ref_bf16(nb_element_to_float(
                                                             c->f == NB_FORMAT_NF4 ? NB_ELEMENT_NF4 : NB_ELEMENT_FP4_BNB, (uint8_t)cd))
                                                       : ref_f16(nb_element_to_float(
                                                             c->f == NB_FORMAT_NF4 ? NB_ELEMENT_NF4 : NB_ELEMENT_FP4_BNB, (uint8_t)cd));
            if (bits != want) planes_ok = 0;
        }
        CHECK(planes_ok, "%s %s: the table planes hold the table rounded to the activation dtype", what,
              a ? "f16" : "bf16");
        emulate_table(c, act, planes, packed, x, m, emu);
        double worst_same = 0, worst_bound = 0;
        for (int64_t r = 0; r < n; r++)
            for (int64_t i = 0; i < m; i++) {
                double same = 0, mag = 0, bound = 0;
                for (int64_t col = 0; col < k; col++) {
                    float s;
                    memcpy(&s, (const uint8_t *)w->scales + 4 * (size_t)(r * ng + col / c->group), 4);
                    const int code = nib((const uint8_t *)w->codes, (size_t)(r * k + col));
                    const double v = nb_element_to_float(c->f == NB_FORMAT_NF4 ? NB_ELEMENT_NF4 : NB_ELEMENT_FP4_BNB,
                                                         (uint8_t)code);
                    const double v16 = table16(c->f, act, code), xv = x[i * k + col];
                    same += xv * v16 * s;
                    mag += fabs(xv * v16 * s);
                    /* the operand's rounding, and the reference's float32 product v * absmax */
                    bound += fabs(xv) * fabs((double)s) * (fabs(v16 - v) + ldexp(fabs(v), -24));
                }
                const double e = emu[i * n + r], tol = 1e-12 * (mag > 0 ? mag : 1);
                const double d1 = fabs(e - same) / tol, d2 = fabs(e - ref[i * n + r]) / (bound + tol);
                if (!(d1 <= worst_same)) worst_same = d1;
                if (!(d2 <= worst_bound)) worst_bound = d2;
            }
        CHECK(worst_same <= 1.0, "%s %s: the emulated kernel differs from the sum of table16 x absmax by %g of "
              "1e-12 of the sum of magnitudes", what, a ? "f16" : "bf16", worst_same);
        CHECK(worst_bound <= 1.0, "%s %s: the emulated kernel is %g x its stated bound from the float64 reference",
              what, a ? "f16" : "bf16", worst_bound);
    }
    free(emu);
}

static void check_case(nb_context *ctx, const layout_case *c) {
    nb_weight_desc d;
    nb_weight_desc_init(&d, c->f, c->n, 128); /* (k below: the default group need not divide it) */
    d.k = c->k;
    d.group_size = c->group;
    d.scale_type = c->st;
    nb_weight_sizes_v2 sz;
    nb_status st = nb_weight_get_sizes_v2(&d, &sz);
    char what[96];
    snprintf(what, sizeof what, "%s n=%lld k=%lld group=%d %s", fname(c->f), (long long)c->n, (long long)c->k,
             c->group, c->st == NB_SCALE_BF16 ? "bf16" : c->st == NB_SCALE_F32 ? "f32" : "f16");
    CHECK(st == NB_OK, "%s: sizes: %s", what, nb_last_error());
    if (st != NB_OK) return;
    const int zp = c->f == NB_FORMAT_INT4, sb = is_table(c->f) ? 4 : 2;
    const size_t want_bytes =
        (size_t)((c->n + 15) / 16) * (size_t)((c->k + 127) / 128) * chunk_bytes(c->f, c->group, zp, sb);
    CHECK(sz.packed_bytes == want_bytes, "%s: packed_bytes %zu, want %zu", what, sz.packed_bytes, want_bytes);
    uint8_t *codes = malloc(sz.codes_bytes), *scales = malloc(sz.scales_bytes), *zeros = zp ? malloc(sz.zeros_bytes) : NULL;
    uint8_t *packed = malloc(sz.packed_bytes), *want = malloc(sz.packed_bytes);
    uint8_t *codes2 = malloc(sz.codes_bytes), *scales2 = malloc(sz.scales_bytes), *zeros2 = zp ? malloc(sz.zeros_bytes) : NULL;
    const int64_t m = 3;
    float *x = malloc(sizeof(float) * (size_t)(m * c->k));
    double *ref = malloc(sizeof(double) * (size_t)(m * c->n));
    fill(&sz, sb, codes, scales, zeros);
    for (int64_t i = 0; i < m * c->k; i++) x[i] = ref_bf16_to_f32(ref_bf16((float)(rnd_unit() * 2 - 1)));
    const nb_weight_data w = {.codes = codes, .scales = scales, .zeros = zeros};
    nb_weight_desc p = d;
    st = nb_pack_host_v2(ctx, &p, &w, packed, sz.packed_bytes);
    CHECK(st == NB_OK && p.layout == NB_LAYOUT_PACKED, "%s: nb_pack_host_v2: %s", what, nb_last_error());
    if (st == NB_OK) {
        expected_bytes(c, zp, sb, codes, scales, zeros, want, sz.packed_bytes);
        size_t first = sz.packed_bytes;
        for (size_t i = 0; i < sz.packed_bytes && first == sz.packed_bytes; i++)
            if (packed[i] != want[i]) first = i;
        CHECK(first == sz.packed_bytes, "%s: packed byte %zu is 0x%02x, the layout says 0x%02x", what, first,
              first < sz.packed_bytes ? packed[first] : 0, first < sz.packed_bytes ? want[first] : 0);
        if (zp) { /* the zero-point range */
            int lo = 256, hi = -1;
            for (size_t i = 0; i < sz.zeros_bytes; i++) lo = zeros[i] < lo ? zeros[i] : lo, hi = zeros[i] > hi ? zeros[i] : hi;
            CHECK(p.scale_exp_min == lo && p.scale_exp_max == hi, "%s: zero range %d..%d, want %d..%d", what,
                  (int)p.scale_exp_min, (int)p.scale_exp_max, lo, hi);
        }
        /* unpack: the checkpoint buffers back */
        nb_weight_desc u = p;
        const nb_weight_buffers out = {.codes = codes2, .scales = scales2, .zeros = zeros2};
        st = nb_unpack_host_v2(ctx, &u, packed, sz.packed_bytes, &out);
        CHECK(st == NB_OK && u.layout == NB_LAYOUT_CHECKPOINT && !memcmp(codes, codes2, sz.codes_bytes) &&
                  !memcmp(scales, scales2, sz.scales_bytes) && (!zp || !memcmp(zeros, zeros2, sz.zeros_bytes)),
              "%s: nb_unpack_host_v2 does not give the buffers back (%s)", what, nb_status_name(st));
        if (is_table(c->f)) { /* the table formats' kernel arithmetic */
            nb_gemm_desc g;
            nb_gemm_desc_init(&g, &d, m, NB_DTYPE_F32, NB_DTYPE_F32);
            st = nb_gemm_host_f64_v2(ctx, &g, x, &w, NULL, ref);
            CHECK(st == NB_OK, "%s: reference: %s", what, nb_last_error());
            if (st == NB_OK) check_table(c, &w, packed, x, m, ref, what);
        }
        /* the kernel's arithmetic on the packed bytes; BF16 needs zero points up to 127 */
        for (int a = 0; a < 2 && !is_table(c->f); a++) {
            const nb_dtype act = a ? NB_DTYPE_F16 : NB_DTYPE_BF16;
            if (zp && act == NB_DTYPE_BF16)
                for (size_t i = 0; i < sz.zeros_bytes; i++) zeros[i] &= 0x7F;
            nb_weight_desc dp = d;
            if (nb_pack_host_v2(ctx, &dp, &w, packed, sz.packed_bytes) != NB_OK) continue;
            nb_gemm_desc g;
            nb_gemm_desc_init(&g, &d, m, NB_DTYPE_F32, NB_DTYPE_F32);
            st = nb_gemm_host_f64_v2(ctx, &g, x, &w, NULL, ref);
            const double e = st == NB_OK ? emulate(c, zp, act, packed, x, m, ref) : NAN;
            CHECK(e <= 1e-12, "%s: the emulated kernel (%s operands) differs from the float64 reference by %g "
                  "(relative to the sum of magnitudes)", what, a ? "f16" : "bf16", e);
        }
    }
    free(codes), free(scales), free(zeros), free(packed), free(want), free(codes2), free(scales2), free(zeros2);
    free(x), free(ref);
}

static void test_args(nb_context *ctx) {
    nb_weight_desc d;
    nb_weight_desc_init(&d, NB_FORMAT_INT4, 16, 128);
    nb_weight_sizes_v2 sz;
    nb_weight_get_sizes_v2(&d, &sz);
    uint8_t codes[1024], scales[64], zeros[32], packed[2048], c2[1024], s2[64];
    memset(codes, 0, sizeof codes), memset(scales, 0, sizeof scales), memset(zeros, 0, sizeof zeros);
    CHECK(sz.packed_bytes == 1024 + 48, "int4 16x128 g128 packed_bytes %zu", sz.packed_bytes);
    nb_weight_data w = {.codes = codes, .scales = scales, .zeros = zeros};
    nb_weight_desc p = d;
    CHECK(nb_pack_host(ctx, &p, codes, scales, packed, sizeof packed) == NB_ERR_UNSUPPORTED &&
              strstr(nb_last_error(), "nb_pack_host_v2"), "nb_pack_host refuses int4, naming the _v2 function: %s",
          nb_last_error());
    CHECK(nb_pack_host_v2(NULL, &p, &w, packed, sizeof packed) == NB_ERR_NULL_POINTER, "pack_v2: NULL ctx");
    CHECK(nb_pack_host_v2(ctx, &p, NULL, packed, sizeof packed) == NB_ERR_NULL_POINTER, "pack_v2: NULL w");
    CHECK(nb_pack_host_v2(ctx, &p, &w, NULL, sizeof packed) == NB_ERR_NULL_POINTER, "pack_v2: NULL packed");
    w.zeros = NULL;
    CHECK(nb_pack_host_v2(ctx, &p, &w, packed, sizeof packed) == NB_ERR_NULL_POINTER, "pack_v2: int4 without zeros");
    w.zeros = zeros;
    w.reserved[0] = codes;
    CHECK(nb_pack_host_v2(ctx, &p, &w, packed, sizeof packed) == NB_ERR_INVALID_ARGUMENT, "pack_v2: reserved set");
    w.reserved[0] = NULL;
    CHECK(nb_pack_host_v2(ctx, &p, &w, packed, sz.packed_bytes - 1) == NB_ERR_BUFFER_TOO_SMALL, "pack_v2: short buffer");
    CHECK(p.layout == NB_LAYOUT_CHECKPOINT, "pack_v2: failures leave the layout");
    CHECK(nb_pack_host_v2(ctx, &p, &w, packed, sizeof packed) == NB_OK, "pack_v2: %s", nb_last_error());
    CHECK(nb_pack_host_v2(ctx, &p, &w, packed, sizeof packed) == NB_ERR_INVALID_ARGUMENT, "pack_v2: packed twice");
    nb_weight_buffers out = {.codes = c2, .scales = s2, .zeros = NULL};
    CHECK(nb_unpack_host_v2(ctx, &p, packed, sizeof packed, &out) == NB_ERR_NULL_POINTER, "unpack_v2: int4 without zeros");
    CHECK(nb_unpack_host(ctx, &p, packed, sizeof packed, c2, s2) == NB_ERR_UNSUPPORTED, "nb_unpack_host refuses int4");
    CHECK(nb_unpack_host_v2(ctx, &p, packed, sizeof packed, NULL) == NB_ERR_NULL_POINTER, "unpack_v2: NULL out");
    /* int4_sym through the first version: the same bytes as the second */
    nb_weight_desc s1, s2d;
    nb_weight_desc_init(&s1, NB_FORMAT_INT4_SYM, 16, 128);
    s2d = s1;
    uint8_t pk2[2048];
    const nb_weight_data ws = {.codes = codes, .scales = scales};
    for (int i = 0; i < 1024; i++) codes[i] = (uint8_t)rnd_u64();
    CHECK(nb_pack_host(ctx, &s1, codes, scales, packed, sizeof packed) == NB_OK &&
              nb_pack_host_v2(ctx, &s2d, &ws, pk2, sizeof pk2) == NB_OK && !memcmp(packed, pk2, 1024 + 32),
          "int4_sym: nb_pack_host equals nb_pack_host_v2");
    CHECK(nb_unpack_host(ctx, &s1, packed, sizeof packed, c2, s2) == NB_OK && !memcmp(c2, codes, 1024),
          "int4_sym: nb_unpack_host");
    /* int8 through the first version: the same bytes as the second, 2048 code bytes per chunk */
    nb_weight_desc i1, i2;
    nb_weight_desc_init(&i1, NB_FORMAT_INT8, 16, 128);
    i2 = i1;
    uint8_t codes8[2048], pk8[2 * 2048], pk8b[2 * 2048];
    for (int i = 0; i < 2048; i++) codes8[i] = (uint8_t)rnd_u64();
    const nb_weight_data w8 = {.codes = codes8, .scales = scales};
    CHECK(nb_weight_get_sizes_v2(&i1, &sz) == NB_OK && sz.packed_bytes == 2048 + 32,
          "int8 16x128 g128: packed_bytes %zu", sz.packed_bytes);
    CHECK(nb_pack_host(ctx, &i1, codes8, scales, pk8, sizeof pk8) == NB_OK &&
              nb_pack_host_v2(ctx, &i2, &w8, pk8b, sizeof pk8b) == NB_OK && !memcmp(pk8, pk8b, 2048 + 32),
          "int8: nb_pack_host equals nb_pack_host_v2");
    nb_format_info fi;
    nb_format_get_info(NB_FORMAT_INT4, &fi);
    CHECK(fi.kernels == 1, "int4: kernels");
    nb_format_get_info(NB_FORMAT_NF4, &fi);
    CHECK(fi.kernels == 1, "nf4: kernels");
    nb_format_get_info(NB_FORMAT_BNB_FP4, &fi);
    CHECK(fi.kernels == 1, "bnb_fp4: kernels");
    nb_format_get_info(NB_FORMAT_INT8, &fi);
    CHECK(fi.kernels == 1, "int8: kernels");
    /* nf4 through the first version: the same bytes as the second, 16 rows x 128 in blocks of 64 */
    nb_weight_desc n1, n2;
    nb_weight_desc_init(&n1, NB_FORMAT_NF4, 16, 128);
    n2 = n1;
    float absmax[32];
    for (int i = 0; i < 32; i++) absmax[i] = (float)(i + 1) / 8;
    const nb_weight_data wn = {.codes = codes, .scales = absmax};
    CHECK(nb_weight_get_sizes_v2(&n1, &sz) == NB_OK && sz.packed_bytes == 1024 + 128,
          "nf4 16x128 blocks of 64: packed_bytes %zu (0.5625 bytes per weight)", sz.packed_bytes);
    CHECK(nb_pack_host(ctx, &n1, codes, (const uint8_t *)absmax, packed, sizeof packed) == NB_OK &&
              nb_pack_host_v2(ctx, &n2, &wn, pk2, sizeof pk2) == NB_OK && !memcmp(packed, pk2, 1024 + 128),
          "nf4: nb_pack_host equals nb_pack_host_v2");
    CHECK(n1.scale_exp_min == -1 && n1.scale_exp_max == -1, "nf4: no range recorded (%d..%d)", (int)n1.scale_exp_min,
          (int)n1.scale_exp_max);
    float back[32];
    CHECK(nb_unpack_host(ctx, &n1, packed, sizeof packed, c2, (uint8_t *)back) == NB_OK && !memcmp(c2, codes, 1024) &&
              !memcmp(back, absmax, sizeof absmax), "nf4: nb_unpack_host");
    CHECK(nb_pack_host_v2(ctx, &n2, &wn, pk2, sizeof pk2) == NB_ERR_INVALID_ARGUMENT, "nf4: packed twice");
    nb_weight_desc_init(&n2, NB_FORMAT_BNB_FP4, 16, 128);
    CHECK(nb_pack_host_v2(ctx, &n2, &wn, pk2, 1024 + 127) == NB_ERR_BUFFER_TOO_SMALL, "bnb_fp4: short buffer");
    const nb_weight_data wz = {.codes = codes, .scales = absmax, .zeros = zeros};
    CHECK(nb_pack_host_v2(ctx, &n2, &wz, pk2, sizeof pk2) == NB_ERR_INVALID_ARGUMENT, "bnb_fp4: zeros given");
}

/* The E2M1 word (docs/formats.md 8.2) and the kernels' two decoders of it. */
static uint32_t shl(uint32_t q, int d) { return d >= 0 ? q << d : q >> -d; }
static uint32_t rotl(uint32_t q, unsigned d) { return d & 31 ? q << (d & 31) | q >> (32 - (d & 31)) : q; }
static float half_bits_value(uint32_t h, int bf16) { /* a 16-bit pattern's value, subnormals included */
    if (bf16) {
        uint32_t u = h << 16;
        float f;
        memcpy(&f, &u, sizeof f);
        return f;
    }
    const int e = (int)(h >> 10) & 31, m = (int)(h & 1023);
    const float v = e ? ldexpf(1.0f + (float)m / 1024.0f, e - 15) : ldexpf((float)m, -24);
    return h & 0x8000 ? -v : v;
}
static void test_e2m1_word(void) {
    uint32_t seen = 0;
    int overlap = 0;
    for (int e = 0; e < 8; e++) { /* every bit of a word is one element's */
        const uint32_t b = NBI_E2M1_PUT(e, 15);
        overlap |= (b & seen) != 0 || __builtin_popcount(b) != 4;
        seen |= b;
    }
    CHECK(!overlap && seen == 0xFFFFFFFFu, "E2M1 word: the elements' bits overlap or leave bits unused (0x%08X)", seen);
    uint32_t rng = 12345u;
    int bad_get = 0, bad_dec = 0, bad_lane = 0, bad_val = 0;
    for (int bf16 = 0; bf16 < 2; bf16++) {
        const int tm = bf16 ? 6 : 9; /* where e1e0m goes: the low exponent bits and the top mantissa bit */
        const uint32_t mm = bf16 ? 0x01C001C0u : 0x0E000E00u, ms = 0x80008000u;
        for (int e = 0; e < 8; e++)
            for (int c = 0; c < 16; c++)
                for (int rep = 0; rep < 16; rep++) {
                    uint8_t codes[8];
                    uint32_t q = 0;
                    for (int i = 0; i < 8; i++) {
                        rng = rng * 1664525u + 1013904223u;
                        codes[i] = i == e ? (uint8_t)c : (uint8_t)(rng >> 28);
                        q |= NBI_E2M1_PUT(i, codes[i]);
                    }
                    for (int i = 0; i < 8; i++) bad_get += NBI_E2M1_GET(q, i) != codes[i];
                    const int p = e / 2, h = e % 2;
                    const int dm = tm - NBI_E2M1_MAG(p), ds = 15 - NBI_E2M1_SIGN(p);
                    /* decode_pair: one shift and mask where magnitude and sign move alike */
                    const uint32_t r = dm == ds ? shl(q, dm) & (mm | ms) : (shl(q, dm) & mm) | (shl(q, ds) & ms);
                    /* nbc_decode_pair_lane: rotate the magnitudes, multiply the signs */
                    const uint32_t rl = (rotl(q, (unsigned)dm & 31u) & mm) | ((q * (1u << ds)) & ms);
                    const uint32_t want = (uint32_t)(c >> 3) << 15 | (uint32_t)(c & 7) << tm;
                    bad_dec += (r >> (16 * h) & 0xFFFF) != want;
                    bad_lane += (rl >> (16 * h) & 0xFFFF) != want;
                    const float v = ldexpf(half_bits_value(r >> (16 * h) & 0xFFFF, bf16), bf16 ? 126 : 14);
                    bad_val += v != nbi_e2m1((uint8_t)c) || (signbit(v) != 0) != (c >> 3);
                }
    }
    CHECK(!bad_get, "E2M1 word: NBI_E2M1_GET gave back %d wrong codes", bad_get);
    CHECK(!bad_dec, "E2M1 word: the decode kernels' pairs wrong %d times", bad_dec);
    CHECK(!bad_lane, "E2M1 word: the tensor-core lanes' pairs wrong %d times", bad_lane);
    CHECK(!bad_val, "E2M1 word: %d decoded values differ from nbi_e2m1 times 2^-126 / 2^-14", bad_val);
}

int main(void) {
    nb_context *ctx = NULL;
    if (nb_context_create(NB_DEVICE_NONE, &ctx) != NB_OK) {
        printf("cannot create a context: %s\n", nb_last_error());
        return 1;
    }
    static const int groups[4] = {32, 64, 128, 0}; /* 0: one group per row (k: the scale repeats per chunk) */
    static const int64_t shapes[4][2] = {{16, 128}, {37, 512}, {1, 768}, {50, 1280}};
    static const nb_format ints[3] = {NB_FORMAT_INT4, NB_FORMAT_INT4_SYM, NB_FORMAT_INT8};
    for (int f = 0; f < 3; f++)
        for (int gi = 0; gi < 4; gi++)
            for (int s = 0; s < 4; s++)
                for (int st = 0; st < 2; st++) {
                    layout_case c = {ints[f], shapes[s][0], shapes[s][1],
                                     groups[gi], st ? NB_SCALE_BF16 : NB_SCALE_F16};
                    if (!c.group) c.group = (int)c.k;
                    if (c.k % c.group) continue;
                    check_case(ctx, &c);
                }
    /* the table formats: bitsandbytes' blocks 32 .. 4096 (F32 absmax); 256
     * and 1024 are multiples of 128, stored once per chunk */
    static const int tgroups[5] = {32, 64, 128, 256, 1024};
    static const int64_t tshapes[4][2] = {{16, 128}, {37, 512}, {3, 1024}, {50, 1280}};
    for (int f = 0; f < 2; f++)
        for (int gi = 0; gi < 5; gi++)
            for (int s = 0; s < 4; s++) {
                layout_case c = {f ? NB_FORMAT_BNB_FP4 : NB_FORMAT_NF4, tshapes[s][0], tshapes[s][1], tgroups[gi],
                                 NB_SCALE_F32};
                if (c.k % c.group) continue;
                check_case(ctx, &c);
            }
    /* one group per row with k not a multiple of 128 (a padded kernel group) */
    const layout_case odd[3] = {{NB_FORMAT_INT4, 21, 200, 200, NB_SCALE_F16},
                                {NB_FORMAT_INT4_SYM, 5, 72, 72, NB_SCALE_BF16},
                                {NB_FORMAT_INT8, 19, 168, 168, NB_SCALE_BF16}};
    for (int i = 0; i < 3; i++) check_case(ctx, &odd[i]);
    /* a table format whose last chunk is half padding (k = 192, blocks of 64 and 32) */
    const layout_case todd[2] = {{NB_FORMAT_NF4, 21, 192, 64, NB_SCALE_F32}, {NB_FORMAT_BNB_FP4, 5, 96, 32, NB_SCALE_F32}};
    for (int i = 0; i < 2; i++) check_case(ctx, &todd[i]);
    test_args(ctx);
    test_e2m1_word();
    nb_context_destroy(ctx);
    printf("%d passed, %d failed\n", g_pass, g_fail);
    return g_fail ? 1 : 0;
}
