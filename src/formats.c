/* formats.c - the plain-C reference for every format: scalar codecs,
 * quantize, dequantize and the packed-layout repack.  Semantics follow
 * docs/formats.md (NVIDIA ModelOpt for NVFP4, OCP MX v1.0 for MXFP4, AWQ /
 * GPTQ / compressed-tensors for the integer formats, bitsandbytes for NF4
 * and its FP4).  Every function here dispatches on the row's element, scale
 * and zero-point types, never on which format it is.
 * nb_quantize (the device quantizer) is here too: it shares the host's
 * argument checks, status messages and tensor-scale expression. */
#include "internal.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ----------------------------------------------------------- traits table */

/* Codes pack whole into bytes (2, 4 or 8 bits), the default group divides
 * the 128 k of a packed chunk or is a multiple of it and is one of the
 * row's groups, and so is its default scale type. */
#define NBI_X_CHECK(NAME, value, str, elem, bits, grp, grps, st, sts, ...)                               \
    _Static_assert((bits) == 2 || (bits) == 4 || (bits) == 8, #NAME ": element_bits must be 2, 4 or 8"); \
    _Static_assert((grp) > 0 && (NBI_CHUNK_K % (grp) == 0 || (grp) % NBI_CHUNK_K == 0), #NAME ": group"); \
    _Static_assert(((grps) & (grp)) != 0, #NAME ": the default group is one of its groups");             \
    _Static_assert(((sts) & NB_SCALE_BIT(st)) != 0, #NAME ": the default scale type is one of its types");
NB_FORMAT_LIST(NBI_X_CHECK)
#undef NBI_X_CHECK

static const nbi_format_traits k_traits[NBI_FORMAT_COUNT] = {
#define NBI_X_ROW(NAME, value, str, elem, bits, grp, grps, st, sts, sbytes, ts, zp)                          \
    {.format = NB_FORMAT_##NAME, .name = str, .element = elem, .element_bits = bits, .group = grp,             \
     .groups = grps, .scale_type = st, .scale_types = sts, .scale_bytes = sbytes, .tensor_scale = ts,          \
     .zero_point = zp,                                                                                         \
     .index = NBI_FORMAT_INDEX_##NAME,                                                                         \
     .kernels = 0 NBI_KERNEL_FORMATS(NBI_X_IS, NAME) NBI_DECODE_FORMATS(NBI_X_IS, NAME),                       \
     .every_kernel = 0 NBI_KERNEL_FORMATS(NBI_X_IS, NAME),                                                     \
     .tensor_core = 0 NBI_KERNEL_FORMATS(NBI_X_IS, NAME) NBI_TC_FORMATS(NBI_X_IS, NAME),                       \
     .chunk_scale_bytes = NBI_CHUNK_ROWS * NBI_CHUNK_K / (grp) * (sbytes),                                    \
     .code_shift = (bits) == 2 ? 2 : (bits) == 4 ? 1 : 0},
#define NBI_X_IS(K, NAME) || NBI_FORMAT_INDEX_##K == NBI_FORMAT_INDEX_##NAME
    NB_FORMAT_LIST(NBI_X_ROW)
#undef NBI_X_IS
#undef NBI_X_ROW
};

const nbi_format_traits *nbi_traits(nb_format f) {
    for (size_t i = 0; i < NBI_FORMAT_COUNT; i++)
        if (k_traits[i].format == f) return &k_traits[i];
    return NULL;
}

const nbi_format_traits *nbi_traits_at(int index) {
    return index >= 0 && index < NBI_FORMAT_COUNT ? &k_traits[index] : NULL;
}

size_t nbi_code_bytes(const nbi_format_traits *t) {
    return (size_t)(NBI_CHUNK_ROWS * NBI_CHUNK_K * t->element_bits / 8);
}

size_t nbi_chunk_bytes(const nbi_format_traits *t) {
    return NBI_CHUNK_CODE_BYTES + (size_t)t->chunk_scale_bytes;
}

int nbi_kernel_group(const nb_weight_desc *d) {
    const nbi_format_traits *t = nbi_traits(d->format);
    if (t->element == NB_ELEMENT_E2M1) return t->group;
    const int g = d->group_size;
    return g == 32 || g == 64 || g == 128 ? g : NBI_CHUNK_K;
}

int nbi_is_table(const nbi_format_traits *t) {
    return t->element == NB_ELEMENT_NF4 || t->element == NB_ELEMENT_FP4_BNB;
}

int nbi_zero_bytes(const nbi_format_traits *t, nb_scale_type st) {
    return t->zero_point == NB_ZERO_U8 ? 1 : t->zero_point == NB_ZERO_FLOAT ? nbi_scale_bytes(st) : 0;
}

size_t nbi_packed_chunk_bytes(const nb_weight_desc *d) {
    const nbi_format_traits *t = nbi_traits(d->format);
    if (t->element == NB_ELEMENT_E2M1) return nbi_chunk_bytes(t);
    const size_t gpc = (size_t)(NBI_CHUNK_K / nbi_kernel_group(d)); /* kernel groups per chunk row */
    const size_t sb = (size_t)nbi_scale_bytes(d->scale_type);
    return nbi_code_bytes(t) + NBI_CHUNK_ROWS * gpc * (sb + (size_t)nbi_zero_bytes(t, d->scale_type));
}

void nbi_table_planes(nb_element_type e, nb_dtype act, uint32_t planes[8]) {
    memset(planes, 0, 8 * sizeof *planes);
    for (int c = 0; c < 16; c++) {
        const float v = nbi_element(e, (uint8_t)c);
        const uint32_t h = act == NB_DTYPE_BF16 ? nbi_f32_to_bf16(v) : nbi_f32_to_f16(v);
        const int w = c / 4; /* codes 0..3 in word 0, 4..7 in word 1, 8..11 in 2, 12..15 in 3 */
        planes[w] |= (h & 0xFFu) << (8 * (c % 4));
        planes[4 + w] |= (h >> 8) << (8 * (c % 4));
    }
}

nb_status nb_format_get_info(nb_format format, nb_format_info *out) {
    const nbi_format_traits *t = nbi_traits(format);
    if (!t) return nbi_fail(NULL, NB_ERR_UNSUPPORTED, "nb_format_get_info: %d is not a weight format of this library",
                            (int)format);
    if (!out) return nbi_fail(NULL, NB_ERR_NULL_POINTER, "nb_format_get_info: out is NULL");
    memset(out, 0, sizeof *out);
    out->format = t->format;
    snprintf(out->name, sizeof out->name, "%s", t->name);
    out->element = t->element;
    out->element_bits = t->element_bits;
    out->group_size = t->group;
    out->scale_type = t->scale_type;
    out->scale_bytes = t->scale_bytes;
    out->tensor_scale = t->tensor_scale;
    out->zero_point = t->zero_point != NB_ZERO_NONE;
    out->kernels = t->kernels;
    out->groups = t->groups;
    out->scale_types = t->scale_types;
    out->zero_type = t->zero_point;
    return NB_OK;
}

nb_status nb_format_list(nb_format *formats, size_t max, size_t *count) {
    if (!count || (!formats && max))
        return nbi_fail(NULL, NB_ERR_NULL_POINTER, "nb_format_list: count (and formats when max > 0) must not be NULL");
    for (size_t i = 0; i < NBI_FORMAT_COUNT && i < max; i++) formats[i] = k_traits[i].format;
    *count = NBI_FORMAT_COUNT;
    return NB_OK;
}

void nbi_format_names(char *buf, size_t len) {
    size_t used = 0;
    buf[0] = 0;
    for (size_t i = 0; i < NBI_FORMAT_COUNT && used < len; i++)
        used += (size_t)snprintf(buf + used, len - used, "%s%s", i ? ", " : "", k_traits[i].name);
}

nb_status nb_format_from_name(const char *name, nb_format *out) {
    if (!name || !out) return nbi_fail(NULL, NB_ERR_NULL_POINTER, "nb_format_from_name: name and out must not be NULL");
    for (size_t i = 0; i < NBI_FORMAT_COUNT; i++)
        if (!strcmp(k_traits[i].name, name)) {
            *out = k_traits[i].format;
            return NB_OK;
        }
    char names[128];
    nbi_format_names(names, sizeof names);
    return nbi_fail(NULL, NB_ERR_NOT_FOUND, "nb_format_from_name: no format named \"%.64s\" (formats: %s)", name, names);
}

/* ---------------------------------------------------------- scalar codecs */

static const float k_e2m1[16] = {0.0f,  0.5f,  1.0f,  1.5f,  2.0f,  3.0f,  4.0f,  6.0f,
                                 -0.0f, -0.5f, -1.0f, -1.5f, -2.0f, -3.0f, -4.0f, -6.0f};

float nbi_e2m1(uint8_t code) { return k_e2m1[code & 15]; }

float nbi_e4m3(uint8_t b) {
    int sign = b >> 7, e = (b >> 3) & 15, m = b & 7;
    float v;
    if (e == 15 && m == 7) return NAN;       /* E4M3FN: no Inf, S.1111.111 is NaN */
    if (e == 0) v = ldexpf((float)m, -9);    /* subnormal: m * 2^-6 * 2^-3 */
    else v = ldexpf(1.0f + (float)m / 8.0f, e - 7);
    return sign ? -v : v;
}

float nbi_e8m0(uint8_t b) {
    if (b == 0xFF) return NAN;
    return ldexpf(1.0f, (int)b - 127);       /* 2^-127 is a float subnormal: exact */
}

float nbi_scale(nb_scale_type t, uint8_t b) {
    switch (t) {
    case NB_SCALE_E4M3: return nbi_e4m3(b);
    case NB_SCALE_E8M0: return nbi_e8m0(b);
    case NB_SCALE_F16:
    case NB_SCALE_BF16:
    case NB_SCALE_F32: break;
    }
    return NAN; /* (wider scales are read with nbi_scale_at) */
}

float nbi_scale_max(nb_scale_type t) {
    switch (t) {
    case NB_SCALE_E4M3: return 448.0f;
    case NB_SCALE_E8M0: return 0x1p127f;
    case NB_SCALE_F16: return 65504.0f;
    case NB_SCALE_BF16: return 0x1.FEp127f;
    case NB_SCALE_F32: return 0x1.FFFFFEp127f;
    }
    return NAN;
}

int nbi_scale_bytes(nb_scale_type t) {
    switch (t) {
    case NB_SCALE_E4M3:
    case NB_SCALE_E8M0: return 1;
    case NB_SCALE_F16:
    case NB_SCALE_BF16: return 2;
    case NB_SCALE_F32: return 4;
    }
    return 0;
}

const char *nbi_scale_name(nb_scale_type t) {
    switch (t) {
    case NB_SCALE_E4M3: return "e4m3";
    case NB_SCALE_E8M0: return "e8m0";
    case NB_SCALE_F16: return "f16";
    case NB_SCALE_BF16: return "bf16";
    case NB_SCALE_F32: return "f32";
    }
    return "unknown";
}

size_t nbi_codes_bytes(const nbi_format_traits *t, int64_t elements) {
    return (size_t)((elements * t->element_bits + 7) / 8);
}

uint8_t nbi_code_get(const nbi_format_traits *t, const uint8_t *codes, int64_t i) {
    const int64_t in_byte = i & ((1 << t->code_shift) - 1);
    return (uint8_t)((codes[i >> t->code_shift] >> (in_byte * t->element_bits)) & ((1u << t->element_bits) - 1u));
}

void nbi_code_put(const nbi_format_traits *t, uint8_t *codes, int64_t i, uint8_t c) {
    const int64_t in_byte = i & ((1 << t->code_shift) - 1);
    codes[i >> t->code_shift] |= (uint8_t)(c << (in_byte * t->element_bits));
}

/* bitsandbytes' 4-bit tables (docs/formats.md section 4.1): the float32
 * values of functional.get_4bit_type, which checkpoints store as quant_map.
 * NF4 as bitsandbytes writes them (each decimal is a float32 exactly); FP4
 * is [0, 0.0625, 8, 12, 4, 6, 2, 3] / 12 and the same negated, divided in
 * float32 (code 8 is +0: Python's -0 is the integer 0). */
static const float k_nf4[16] = {
    -1.0f, -0.6961928009986877f, -0.5250730514526367f, -0.39491748809814453f, -0.28444138169288635f,
    -0.18477343022823334f, -0.09105003625154495f, 0.0f, 0.07958029955625534f, 0.16093020141124725f,
    0.24611230194568634f, 0.33791524171829224f, 0.44070982933044434f, 0.5626170039176941f, 0.7229568362236023f, 1.0f};
static const float k_fp4_bnb[16] = {0.0f,   0x1.555556p-8f,  0x1.555556p-1f,  1.0f,  0x1.555556p-2f,  0.5f,
                                    0x1.555556p-3f,  0.25f,  0.0f,  -0x1.555556p-8f, -0x1.555556p-1f, -1.0f,
                                    -0x1.555556p-2f, -0.5f, -0x1.555556p-3f, -0.25f};
/* The codes in ascending order of value (bitsandbytes sorts the table the
 * same way before it bucketizes; of FP4's two zeros, code 0 comes first). */
static const uint8_t k_nf4_order[16] = {0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15};
static const uint8_t k_fp4_bnb_order[16] = {11, 10, 13, 12, 15, 14, 9, 0, 8, 1, 6, 7, 4, 5, 2, 3};

float nbi_element(nb_element_type t, uint8_t code) {
    switch (t) {
    case NB_ELEMENT_E2M1: return nbi_e2m1(code);
    case NB_ELEMENT_UINT4: return (float)(code & 15);
    case NB_ELEMENT_INT4: return (float)((int)(code & 15) - ((code & 8) << 1)); /* sign bit 3 */
    case NB_ELEMENT_INT8: return (float)(int8_t)code;
    case NB_ELEMENT_NF4: return k_nf4[code & 15];
    case NB_ELEMENT_FP4_BNB: return k_fp4_bnb[code & 15];
    }
    return NAN;
}

float nbi_element_max(nb_element_type t) {
    switch (t) {
    case NB_ELEMENT_E2M1: return 6.0f;
    case NB_ELEMENT_UINT4: return 15.0f;
    case NB_ELEMENT_INT4: return 8.0f;
    case NB_ELEMENT_INT8: return 128.0f;
    case NB_ELEMENT_NF4:
    case NB_ELEMENT_FP4_BNB: return 1.0f;
    }
    return NAN;
}

/* The table code of x (already divided by the absmax and clamped to
 * [-1, 1]) as bitsandbytes' quantize_4bit buckets it: the bounds are the
 * float32 midpoints of consecutive sorted values, and x goes to the first
 * bucket whose upper bound is >= x (torch.bucketize, right=False), so a tie
 * takes the smaller value. */
static uint8_t table_code(const float *v, const uint8_t *order, float x) {
    int i = 0;
    while (i < 15 && (v[order[i]] + v[order[i + 1]]) / 2.0f < x) i++;
    return order[i];
}

/* E2M1 round to nearest, ties to even, saturating at 6.  The tie points are
 * the midpoints 0.25 0.75 1.25 1.75 2.5 3.5 5; at a tie the code with an even
 * mantissa bit wins (0.25->0, 0.75->1, 1.25->1, 1.75->2, 2.5->2, 3.5->4, 5->4).
 * Sign from x < 0, as ModelOpt does, so -0.1 gives 0x8 (negative zero). */
uint8_t nbi_to_e2m1(float x) {
    if (isnan(x)) return 7; /* E2M1 has no NaN: the documented stand-in is +6 */
    float a = fabsf(x);
    uint8_t c;
    if (a <= 0.25f) c = 0;
    else if (a < 0.75f) c = 1;
    else if (a <= 1.25f) c = 2;
    else if (a < 1.75f) c = 3;
    else if (a <= 2.5f) c = 4;
    else if (a < 3.5f) c = 5;
    else if (a <= 5.0f) c = 6;
    else c = 7;
    return (uint8_t)(c | (x < 0.0f ? 8 : 0));
}

/* Round x (in code units: already divided by the scale) to a code: E2M1 as
 * above; integers to nearest even, saturating, as two's complement bits;
 * the bitsandbytes tables by their bucket rule (x in [-1, 1]). */
uint8_t nbi_to_element(nb_element_type t, float x) {
    if (isnan(x) && t != NB_ELEMENT_E2M1) return 0; /* (the quantizers refuse non-finite input first) */
    switch (t) {
    case NB_ELEMENT_E2M1: return nbi_to_e2m1(x);
    case NB_ELEMENT_UINT4: {
        const float r = rintf(x);
        return (uint8_t)(r <= 0.0f ? 0 : r >= 15.0f ? 15 : (int)r);
    }
    case NB_ELEMENT_INT4: {
        const float r = rintf(x);
        return (uint8_t)((r <= -8.0f ? -8 : r >= 7.0f ? 7 : (int)r) & 15);
    }
    case NB_ELEMENT_INT8: {
        const float r = rintf(x);
        return (uint8_t)(r <= -128.0f ? -128 : r >= 127.0f ? 127 : (int)r);
    }
    case NB_ELEMENT_NF4: return table_code(k_nf4, k_nf4_order, x);
    case NB_ELEMENT_FP4_BNB: return table_code(k_fp4_bnb, k_fp4_bnb_order, x);
    }
    return 0;
}

/* E4M3FN round to nearest even with saturation to +-448; NaN -> 0x7F. */
uint8_t nbi_to_e4m3(float x) {
    if (isnan(x)) return 0x7F;
    uint8_t sign = signbit(x) ? 0x80 : 0;
    float a = fabsf(x);
    if (a >= 448.0f) return sign | 0x7E;
    /* Quantum of the binade holding a: 2^(e-3) for normals (e >= -6), 2^-9 below. */
    int e;
    frexpf(a, &e);           /* a = f * 2^e, f in [0.5, 1) -> binade exponent e-1 */
    int be = e - 1;
    if (be < -6) be = -6;
    float q = ldexpf(1.0f, be - 3);
    float r = rintf(a / q) * q;  /* a/q exact (power-of-two), rintf is RNE */
    if (r >= 448.0f) return sign | 0x7E;
    if (r == 0.0f) return sign;
    int re;
    frexpf(r, &re);
    int rbe = re - 1;
    if (rbe < -6) {              /* subnormal: r = m * 2^-9 */
        return sign | (uint8_t)(int)ldexpf(r, 9);
    }
    int m = (int)(ldexpf(r, -rbe) * 8.0f) - 8;  /* r = (1 + m/8) 2^rbe */
    return sign | (uint8_t)(((rbe + 7) << 3) | m);
}

/* ------------------------------------------------- 16-bit float storage */

static uint32_t f2u(float f) { uint32_t u; memcpy(&u, &f, 4); return u; }
static float u2f(uint32_t u) { float f; memcpy(&f, &u, 4); return f; }

uint16_t nbi_f32_to_bf16(float x) {
    uint32_t u = f2u(x);
    if ((u & 0x7FFFFFFFu) > 0x7F800000u) return (uint16_t)((u >> 16) | 0x40); /* quiet NaN */
    u += 0x7FFFu + ((u >> 16) & 1u);
    return (uint16_t)(u >> 16);
}

float nbi_bf16_to_f32(uint16_t h) { return u2f((uint32_t)h << 16); }

uint16_t nbi_f32_to_f16(float x) {
    uint32_t u = f2u(x);
    uint16_t sign = (uint16_t)((u >> 16) & 0x8000u);
    uint32_t a = u & 0x7FFFFFFFu;
    if (a > 0x7F800000u) return sign | 0x7E00;            /* NaN */
    if (a >= 0x477FF000u) return sign | 0x7C00;           /* >= 65520 rounds to Inf */
    if (a < 0x38800000u) {                                /* below 2^-14: subnormal */
        /* value in units of 2^-24, rounded to nearest even */
        float v = u2f(a) * 16777216.0f;                   /* exact scaling */
        float r = rintf(v);
        return sign | (uint16_t)(int)r;                   /* r <= 1024 -> may carry into normal */
    }
    uint32_t mant = a & 0x7FFFFFu;
    int e = (int)(a >> 23) - 127 + 15;
    uint32_t h = ((uint32_t)e << 10) | (mant >> 13);
    uint32_t rem = mant & 0x1FFFu;
    if (rem > 0x1000u || (rem == 0x1000u && (h & 1u))) h++;
    return sign | (uint16_t)h;
}

float nbi_f16_to_f32(uint16_t h) {
    uint32_t sign = (uint32_t)(h & 0x8000u) << 16;
    int e = (h >> 10) & 31;
    uint32_t m = h & 0x3FFu;
    float v;
    if (e == 31) return u2f(sign | 0x7F800000u | (m << 13) | (m ? 0x400000u : 0));
    if (e == 0) v = ldexpf((float)m, -24);
    else v = ldexpf((float)(m | 0x400u), e - 25);
    return (sign ? -v : v);
}

float nbi_scale_at(nb_scale_type t, const void *scales, size_t i) {
    const uint8_t *p = (const uint8_t *)scales;
    switch (t) {
    case NB_SCALE_E4M3:
    case NB_SCALE_E8M0: return nbi_scale(t, p[i]);
    case NB_SCALE_F16: return nbi_f16_to_f32((uint16_t)(p[2 * i] | p[2 * i + 1] << 8));
    case NB_SCALE_BF16: return nbi_bf16_to_f32((uint16_t)(p[2 * i] | p[2 * i + 1] << 8));
    case NB_SCALE_F32: {
        const uint32_t u = (uint32_t)p[4 * i] | (uint32_t)p[4 * i + 1] << 8 | (uint32_t)p[4 * i + 2] << 16 |
                           (uint32_t)p[4 * i + 3] << 24;
        return u2f(u);
    }
    }
    return NAN;
}

void nbi_scale_put(nb_scale_type t, void *scales, size_t i, float v) {
    uint8_t *p = (uint8_t *)scales;
    uint32_t u = 0;
    switch (t) {
    case NB_SCALE_E4M3: p[i] = nbi_to_e4m3(v); return;
    case NB_SCALE_E8M0: return; /* (E8M0 bytes come from the MX rules, never from a value) */
    case NB_SCALE_F16: u = nbi_f32_to_f16(v); break;
    case NB_SCALE_BF16: u = nbi_f32_to_bf16(v); break;
    case NB_SCALE_F32:
        u = f2u(v);
        for (int b = 0; b < 4; b++) p[4 * i + (size_t)b] = (uint8_t)(u >> (8 * b));
        return;
    }
    p[2 * i] = (uint8_t)u;
    p[2 * i + 1] = (uint8_t)(u >> 8);
}

size_t nbi_dtype_size(nb_dtype t) {
    switch (t) {
    case NB_DTYPE_F32: return 4;
    case NB_DTYPE_F16: return 2;
    case NB_DTYPE_BF16: return 2;
    }
    return 0;
}

const char *nbi_dtype_name(nb_dtype t) {
    switch (t) {
    case NB_DTYPE_F32: return "f32";
    case NB_DTYPE_F16: return "f16";
    case NB_DTYPE_BF16: return "bf16";
    }
    return "unknown";
}

float nbi_load(nb_dtype t, const void *p, size_t i) {
    switch (t) {
    case NB_DTYPE_F32: return ((const float *)p)[i];
    case NB_DTYPE_F16: return nbi_f16_to_f32(((const uint16_t *)p)[i]);
    case NB_DTYPE_BF16: return nbi_bf16_to_f32(((const uint16_t *)p)[i]);
    }
    return NAN;
}

void nbi_store(nb_dtype t, void *p, size_t i, float v) {
    switch (t) {
    case NB_DTYPE_F32: ((float *)p)[i] = v; break;
    case NB_DTYPE_F16: ((uint16_t *)p)[i] = nbi_f32_to_f16(v); break;
    case NB_DTYPE_BF16: ((uint16_t *)p)[i] = nbi_f32_to_bf16(v); break;
    }
}

/* ------------------------------------------------------------- quantize */

/* floor(log2(a)) for finite a > 0, exactly (log2f may round up near 2^e). */
static int floor_log2(float a) {
    int e;
    frexpf(a, &e);
    return e - 1;
}

/* MXFP4 scale byte for a block with absolute maximum amax (formats.md 3.2). */
static uint8_t mx_scale_byte(float amax, nb_mx_scale_rule rule) {
    int e;
    switch (rule) {
    case NB_MX_SCALE_ROUND_UP: {
        /* triton_kernels: 2^ceil(log2(amax/6)) by rounding the FP32 bits up */
        uint32_t b = (f2u(amax / 6.0f) + 0x7FFFFFu) & 0x7F800000u;
        return (uint8_t)(b >> 23 > 254 ? 254 : b >> 23);
    }
    case NB_MX_SCALE_EVEN: {
        /* Quark "even": round amax up to a power of two when its mantissa is
         * >= 1.75, then floor(log2) - 2, clamped to [-127, 127]. */
        uint32_t b = (f2u(amax) + (1u << 21)) & 0x7F800000u;
        if (b == 0) return 0;
        e = (int)(b >> 23) - 127 - 2;
        if (e < -127) e = -127;
        if (e > 127) e = 127;
        return (uint8_t)(e + 127);
    }
    case NB_MX_SCALE_OCP:
    default:
        if (amax == 0.0f) return 0;
        e = floor_log2(amax) - 2;
        if (e < -127) e = -127;
        if (e > 127) e = 127;
        return (uint8_t)(e + 127);
    }
}

/* After the scan over the whole input (first non-finite element, absolute
 * maximum): the status and the tensor scale.  nb_quantize_host and
 * nb_quantize share it, so both report the same element and compute the same
 * tensor scale by the same expression.  A format with a tensor scale gets
 * amax / (largest element x largest block scale) when it is 0 on entry
 * (ModelOpt: amax / (6 * 448) for NVFP4); one without must have 1. */
static nb_status quantize_finish_scan(nb_context *ctx, const nbi_format_traits *t, nb_weight_desc *d, int64_t bad,
                                      float amax) {
    if (bad >= 0)
        return nbi_fail(ctx, NB_ERR_INVALID_ARGUMENT, "quantize: element [%lld, %lld] is not finite",
                        (long long)(bad / d->k), (long long)(bad % d->k));
    if (t->tensor_scale) {
        if (d->tensor_scale == 0.0f) d->tensor_scale = amax / (nbi_element_max(t->element) * nbi_scale_max(t->scale_type));
    } else {
        if (d->tensor_scale == 0.0f) d->tensor_scale = 1.0f;
        if (d->tensor_scale != 1.0f)
            return nbi_fail(ctx, NB_ERR_INVALID_ARGUMENT, "quantize: %s has no tensor scale; tensor_scale must be 1 "
                            "(or 0), got %g", t->name, (double)d->tensor_scale);
    }
    if (!isfinite(d->tensor_scale) || d->tensor_scale < 0.0f)
        return nbi_fail(ctx, NB_ERR_INVALID_ARGUMENT, "quantize: tensor_scale %g is not a finite non-negative value",
                        (double)d->tensor_scale);
    return NB_OK;
}

/* The scale byte of a block whose largest magnitude is bmax, and in *denom
 * the divisor that maps its values onto element codes. */
static uint8_t block_scale(const nbi_format_traits *t, const nb_weight_desc *d, float bmax, float *denom) {
    const float ts = d->tensor_scale;
    uint8_t sb = 0;
    switch (t->scale_type) {
    case NB_SCALE_E4M3: {
        /* ModelOpt: s = block_amax / (6 * ts); 0 -> 1; clamp [2^-9, 448]; E4M3 RNE.
         * An all-zero tensor (ts == 0) gets scale 1 and zero codes. */
        float s = ts > 0.0f ? bmax / (nbi_element_max(t->element) * ts) : 1.0f;
        if (s == 0.0f) s = 1.0f;
        if (s < 0x1p-9f) s = 0x1p-9f;
        if (s > 448.0f) s = 448.0f;
        sb = nbi_to_e4m3(s);
        *denom = nbi_e4m3(sb) * ts;
        break;
    }
    case NB_SCALE_E8M0:
        sb = mx_scale_byte(bmax, d->scale_rule);
        *denom = nbi_e8m0(sb);
        break;
    case NB_SCALE_F16: /* (the E2M1 rows have one-byte scales; wider ones are quantize_int_rows') */
    case NB_SCALE_BF16:
    case NB_SCALE_F32:
        *denom = 0.0f;
        break;
    }
    return sb;
}

/* The divisor that maps a block's values onto element codes under scale
 * byte sb (the tensor scale included). */
static float block_denom(const nbi_format_traits *t, const nb_weight_desc *d, uint8_t sb) {
    return t->scale_type == NB_SCALE_E4M3 ? nbi_e4m3(sb) * d->tensor_scale : nbi_e8m0(sb);
}

/* The squared error of a block encoded under scale byte sb against its
 * values: every term (w - (element * scale) * ts) in double, summed in
 * element order, each operation its own statement so that no compiler fuses
 * them (quantize.cu does the same with explicit roundings). */
static double block_error(const nbi_format_traits *t, const nb_weight_desc *d, const float *blk, int64_t g,
                          uint8_t sb, float denom) {
    const float sv = nbi_scale(t->scale_type, sb), ts = t->scale_type == NB_SCALE_E4M3 ? d->tensor_scale : 1.0f;
    double err = 0.0;
    for (int64_t j = 0; j < g; j++) {
        const uint8_t c = nbi_to_element(t->element, blk[j] / denom);
        const float deq = (nbi_element(t->element, c) * sv) * ts;
        const double diff = (double)blk[j] - (double)deq;
        const double sq = diff * diff;
        err = err + sq;
    }
    return err;
}

/* NB_QUANT_MSE: the candidate scale byte with the least block error, the
 * rule's byte sb first so that it wins ties; candidates whose divisor is
 * not a positive finite number are skipped.  E4M3: sb, the eight bytes below
 * it (down to half the scale: three mantissa bits per binade) and the one
 * above; E8M0: sb, sb - 1, sb + 1. */
static uint8_t mse_scale(const nbi_format_traits *t, const nb_weight_desc *d, const float *blk, int64_t g,
                         uint8_t sb, float *denom) {
    int cand[10], nc = 0;
    cand[nc++] = sb;
    if (t->scale_type == NB_SCALE_E4M3) {
        for (int i = 1; i <= 8; i++) cand[nc++] = sb - i;
        cand[nc++] = sb + 1;
    } else {
        cand[nc++] = sb - 1;
        cand[nc++] = sb + 1;
    }
    /* positive finite scale bytes: E4M3 0x01..0x7E, E8M0 0x00 (2^-127)..0xFE */
    const int bottom = t->scale_type == NB_SCALE_E4M3 ? 1 : 0, top = t->scale_type == NB_SCALE_E4M3 ? 0x7E : 0xFE;
    uint8_t best = sb;
    double best_err = block_error(t, d, blk, g, sb, *denom);
    for (int i = 1; i < nc; i++) {
        if (cand[i] < bottom || cand[i] > top) continue;
        const float dn = block_denom(t, d, (uint8_t)cand[i]);
        if (!(dn > 0.0f) || !isfinite(dn)) continue;
        const double err = block_error(t, d, blk, g, (uint8_t)cand[i], dn);
        if (err < best_err) best_err = err, best = (uint8_t)cand[i], *denom = dn;
    }
    return best;
}

/* The scan over the whole input (first non-finite element, absolute
 * maximum), then the status and tensor scale of quantize_finish_scan. */
static nb_status quantize_scan(nb_context *ctx, const nbi_format_traits *t, nb_weight_desc *d, nb_dtype st,
                               const void *src) {
    float amax = 0.0f;
    int64_t bad = -1;
    for (int64_t i = 0; i < d->n * d->k && bad < 0; i++) {
        float v = nbi_load(st, src, (size_t)i);
        if (!isfinite(v)) bad = i;
        else if (fabsf(v) > amax) amax = fabsf(v);
    }
    return quantize_finish_scan(ctx, t, d, bad, amax);
}

/* E2M1 codes with E4M3 / E8M0 scales (NVFP4, MXFP4).  The arithmetic below
 * is mirrored operation for operation by the device kernel
 * (src/cuda/quantize.cu): change both or neither. */
static nb_status quantize_e2m1_rows(nb_context *ctx, const nbi_format_traits *t, nb_weight_desc *d, nb_dtype st,
                                    const void *src, uint8_t *codes, uint8_t *scales) {
    const int64_t n = d->n, k = d->k, g = d->group_size, ng = k / g;
    float *blk = (float *)malloc(sizeof(float) * (size_t)g); /* one block's values (groups of any size) */
    if (!blk) return nbi_fail(ctx, NB_ERR_OUT_OF_MEMORY, "quantize: out of host memory");
    memset(codes, 0, nbi_codes_bytes(t, n * k));
    for (int64_t r = 0; r < n; r++) {
        for (int64_t b = 0; b < ng; b++) {
            const int64_t first = r * k + b * g;
            float bmax = 0.0f;
            for (int64_t j = 0; j < g; j++) {
                blk[j] = nbi_load(st, src, (size_t)(first + j));
                if (fabsf(blk[j]) > bmax) bmax = fabsf(blk[j]);
            }
            float denom = 0.0f;
            uint8_t sb = block_scale(t, d, bmax, &denom);
            if (d->method == NB_QUANT_MSE && bmax > 0.0f && denom > 0.0f && isfinite(denom))
                sb = mse_scale(t, d, blk, g, sb, &denom);
            scales[r * ng + b] = sb;
            for (int64_t j = 0; j < g; j++) {
                const uint8_t c = denom > 0.0f ? nbi_to_element(t->element, blk[j] / denom) : 0;
                nbi_code_put(t, codes, first + j, c);
            }
        }
    }
    free(blk);
    return NB_OK;
}

/* Integer codes with F16 / BF16 group scales (docs/formats.md 5.1), in
 * float32: with zero points (unsigned codes, AWQ / GPTQ round to nearest)
 * lo = min(0, min w), hi = max(0, max w), s = (hi - lo) / (2^bits - 1), z =
 * clamp(round(-lo / s)), q = clamp(round(w / s) + z); symmetric (signed
 * codes, GPTQ / compressed-tensors) s = amax / ((2^bits - 1) / 2), q =
 * clamp(round(w / s)).  s is rounded to the scale type first and the codes
 * and zero point use the stored value; a stored 0 becomes 1.0 (the group is
 * all zeros, or too small for the type: its codes then give zero). */
/* v rounded to the 16-bit scale type st (F16 or BF16) and back. */
static float round_to_scale(nb_scale_type st, float v) {
    uint8_t b[2];
    nbi_scale_put(st, b, 0, v);
    return nbi_scale_at(st, b, 0);
}

/* a * b + c with each operation rounded (never fused), as PyTorch's
 * separate tensor operations compute it. */
static float mul_add_unfused(float a, float b, float c) {
    volatile float p = a * b;
    return p + c;
}

/* HQQ's quantizer without its optimizer (docs/formats.md 5.5; hqq 0.2.8's
 * Quantizer.quantize with optimize=False, round_zero=False, axis=1), in
 * float32: per group lo = min w, hi = max w, t = 15 * r(1 / (hi - lo)) (two
 * roundings, as PyTorch divides a number by a tensor), 1 where |hi - lo| <=
 * 1e-4, at most 2e4; z = -lo * t, q = clamp(round(w * t + z), 0, 15) (the
 * product and the sum rounded separately); stored: the scale r(1 / t) and
 * the zero point r(z) in the scale type.  A zero point that overflows the
 * type is refused, naming the group. */
static float hqq_inverse_scale(float lo, float hi) {
    const volatile float den = hi - lo, rec = 1.0f / den; /* (PyTorch's 15 / tensor: reciprocal, then times 15) */
    float t = fabsf(den) <= 1e-4f ? 1.0f : 15.0f * rec;
    return t > 2e4f ? 2e4f : t;
}
/* q = clamp(round(w * t + z), 0, 15), the product and the sum rounded
 * separately. */
static float hqq_code(float w, float t, float z) {
    const float q = rintf(mul_add_unfused(w, t, z));
    return q < 0.0f ? 0.0f : q > 15.0f ? 15.0f : q;
}

/* NB_QUANT_HQQ: hqq 0.2.8's optimize_weights_proximal_legacy on the CPU
 * (float32), its default, over the whole weight: with t the inverse scales
 * of round to nearest and z its zero points rounded to integers (hqq's
 * round_zero, on in its configuration for 4 bits), each step takes per
 * element q = clamp(round(w t + z)), w_r = (q - z) / t, e = shrink(w - w_r) with
 * shrink(x) = sign(x) max(|x| - |x|^(p-1) / beta, 0) (p = 0.7, beta = 10:
 * the legacy loop never raises beta), and per group z' = mean(q - (w - e) t);
 * the step's error is the mean of |w - w_r| over the weight (with the z it
 * started from), and the loop ends after 20 steps or at the first step whose
 * error is not below the best so far, keeping that step's z' as hqq does.
 * The sums run in double (PyTorch's reductions in float32 sum in another
 * order, so a zero point can differ from hqq's in its last bits). */
static nb_status hqq_optimize(nb_context *ctx, const nb_weight_desc *d, const float *w, const float *t, float *z) {
    const int64_t n = d->n, k = d->k, g = d->group_size, ng = k / g, count = n * k;
    double best = INFINITY;
    float *znew = (float *)malloc(sizeof(float) * (size_t)(n * ng));
    if (!znew) return nbi_fail(ctx, NB_ERR_OUT_OF_MEMORY, "quantize: out of host memory");
    for (int it = 0; it < 20; it++) {
        double err = 0.0;
        for (int64_t gi = 0; gi < n * ng; gi++) {
            const float *v = w + gi * g;
            double zsum = 0.0;
            for (int64_t j = 0; j < g; j++) {
                const float q = hqq_code(v[j], t[gi], z[gi]);
                const volatile float wr = (q - z[gi]) / t[gi], x = v[j] - wr;
                const float a = fabsf(x);
                const volatile float sub = 0.1f * powf(a, -0.3f);
                float e = a - sub;
                e = e > 0.0f ? e : 0.0f;
                e = x > 0.0f ? e : x < 0.0f ? -e : e * 0.0f;
                const volatile float kept = v[j] - e, prod = kept * t[gi];
                zsum += (double)(q - prod);
                err += (double)a;
            }
            znew[gi] = (float)(zsum / (double)g);
        }
        memcpy(z, znew, sizeof(float) * (size_t)(n * ng));
        const double cur = (double)(float)(err / (double)count);
        if (cur < best) best = cur;
        else break;
    }
    free(znew);
    return NB_OK;
}

static nb_status quantize_hqq_rows(nb_context *ctx, const nbi_format_traits *t, nb_weight_desc *d, nb_dtype st,
                                   const void *src, const nb_weight_buffers *out) {
    const int64_t n = d->n, k = d->k, g = d->group_size, ng = k / g;
    uint8_t *codes = (uint8_t *)out->codes;
    memset(codes, 0, nbi_codes_bytes(t, n * k));
    /* per group: the inverse scale and zero point of round to nearest, then (NB_QUANT_HQQ) the optimizer's */
    float *ts = (float *)malloc(sizeof(float) * (size_t)(n * ng)), *zs = (float *)malloc(sizeof(float) * (size_t)(n * ng));
    float *wf = d->method == NB_QUANT_HQQ ? (float *)malloc(sizeof(float) * (size_t)(n * k)) : NULL;
    if (!ts || !zs || (d->method == NB_QUANT_HQQ && !wf)) {
        free(ts), free(zs), free(wf);
        return nbi_fail(ctx, NB_ERR_OUT_OF_MEMORY, "quantize: out of host memory");
    }
    for (int64_t gi = 0; gi < n * ng; gi++) {
        float lo = INFINITY, hi = -INFINITY;
        for (int64_t j = 0; j < g; j++) {
            const float v = nbi_load(st, src, (size_t)(gi * g + j));
            if (wf) wf[gi * g + j] = v;
            if (v < lo) lo = v;
            if (v > hi) hi = v;
        }
        ts[gi] = hqq_inverse_scale(lo, hi);
        zs[gi] = -lo * ts[gi];
    }
    if (wf) { /* hqq's configuration for 4 bits (hqq_base_quant_config, transformers' HqqConfig): round_zero, then the optimizer */
        for (int64_t gi = 0; gi < n * ng; gi++) zs[gi] = rintf(zs[gi]);
        const nb_status s = hqq_optimize(ctx, d, wf, ts, zs);
        free(wf);
        if (s) {
            free(ts), free(zs);
            return s;
        }
    }
    for (int64_t r = 0; r < n; r++)
        for (int64_t b = 0; b < ng; b++) {
            const int64_t first = r * k + b * g, gi = r * ng + b;
            const float inv = ts[gi], z = zs[gi];
            nbi_scale_put(d->scale_type, out->scales, (size_t)gi, 1.0f / inv);
            nbi_scale_put(d->scale_type, out->zeros, (size_t)gi, z);
            const int zbad = !isfinite(nbi_scale_at(d->scale_type, out->zeros, (size_t)gi));
            if (zbad || !isfinite(nbi_scale_at(d->scale_type, out->scales, (size_t)gi))) {
                free(ts), free(zs);
                return nbi_fail(ctx, NB_ERR_INVALID_ARGUMENT, "quantize: group %lld of row %lld needs a %s of %g, "
                                "beyond %s (largest %g)", (long long)b, (long long)r, zbad ? "zero point" : "scale",
                                zbad ? (double)z : 1.0 / (double)inv, nbi_scale_name(d->scale_type),
                                (double)nbi_scale_max(d->scale_type));
            }
            for (int64_t j = 0; j < g; j++)
                nbi_code_put(t, codes, first + j, (uint8_t)hqq_code(nbi_load(st, src, (size_t)(first + j)), inv, z));
        }
    free(ts), free(zs);
    return NB_OK;
}

static nb_status quantize_int_rows(nb_context *ctx, const nbi_format_traits *t, nb_weight_desc *d, nb_dtype st,
                                   const void *src, const nb_weight_buffers *out) {
    const int64_t n = d->n, k = d->k, g = d->group_size, ng = k / g;
    if (t->zero_point == NB_ZERO_FLOAT) return quantize_hqq_rows(ctx, t, d, st, src, out);
    const int zp = t->zero_point != NB_ZERO_NONE;
    const float levels = (float)((1 << t->element_bits) - 1); /* 15 or 255 */
    const float div = zp ? levels : levels / 2.0f;              /* 15; 7.5 or 127.5 */
    uint8_t *codes = (uint8_t *)out->codes, *zeros = (uint8_t *)out->zeros;
    memset(codes, 0, nbi_codes_bytes(t, n * k));
    for (int64_t r = 0; r < n; r++) {
        for (int64_t b = 0; b < ng; b++) {
            const int64_t first = r * k + b * g, gi = r * ng + b;
            float lo = 0.0f, hi = 0.0f, amax = 0.0f;
            for (int64_t j = 0; j < g; j++) {
                const float v = nbi_load(st, src, (size_t)(first + j));
                if (v < lo) lo = v;
                if (v > hi) hi = v;
                if (fabsf(v) > amax) amax = fabsf(v);
            }
            nbi_scale_put(d->scale_type, out->scales, (size_t)gi, (zp ? hi - lo : amax) / div);
            float s = nbi_scale_at(d->scale_type, out->scales, (size_t)gi);
            if (!isfinite(s))
                return nbi_fail(ctx, NB_ERR_INVALID_ARGUMENT, "quantize: group %lld of row %lld needs a scale of %g, "
                                "beyond %s (largest %g)", (long long)b, (long long)r,
                                (double)((zp ? hi - lo : amax) / div), nbi_scale_name(d->scale_type),
                                (double)nbi_scale_max(d->scale_type));
            if (s == 0.0f) {
                s = 1.0f;
                nbi_scale_put(d->scale_type, out->scales, (size_t)gi, s);
            }
            float z = 0.0f;
            if (zp) {
                z = rintf(-lo / s);
                z = z > levels ? levels : z;
                zeros[gi] = (uint8_t)z;
            }
            for (int64_t j = 0; j < g; j++) {
                const float v = nbi_load(st, src, (size_t)(first + j));
                nbi_code_put(t, codes, first + j, nbi_to_element(t->element, rintf(v / s) + z));
            }
        }
    }
    return NB_OK;
}

/* bitsandbytes' table codes with an F32 absmax per group (docs/formats.md
 * 4.2): s = amax, x = clamp(w * fl(1 / max(s, 1e-38)), -1, 1), the code of
 * x's bucket (nbi_to_element). */
static nb_status quantize_table_rows(const nbi_format_traits *t, nb_weight_desc *d, nb_dtype st, const void *src,
                                     const nb_weight_buffers *out) {
    const int64_t n = d->n, k = d->k, g = d->group_size, ng = k / g;
    uint8_t *codes = (uint8_t *)out->codes;
    memset(codes, 0, nbi_codes_bytes(t, n * k));
    for (int64_t r = 0; r < n; r++) {
        for (int64_t b = 0; b < ng; b++) {
            const int64_t first = r * k + b * g;
            float amax = 0.0f;
            for (int64_t j = 0; j < g; j++) {
                const float v = fabsf(nbi_load(st, src, (size_t)(first + j)));
                if (v > amax) amax = v;
            }
            nbi_scale_put(d->scale_type, out->scales, (size_t)(r * ng + b), amax);
            const float inv = 1.0f / (amax > 1e-38f ? amax : 1e-38f);
            for (int64_t j = 0; j < g; j++) {
                float x = nbi_load(st, src, (size_t)(first + j)) * inv;
                x = x < -1.0f ? -1.0f : x > 1.0f ? 1.0f : x;
                nbi_code_put(t, codes, first + j, nbi_to_element(t->element, x));
            }
        }
    }
    return NB_OK;
}

/* The quantizer of the row's element type (after the scan). */
static nb_status quantize_any(nb_context *ctx, const nbi_format_traits *t, nb_weight_desc *d, nb_dtype st,
                              const void *src, const nb_weight_buffers *out) {
    nb_status status = quantize_scan(ctx, t, d, st, src);
    if (status) return status;
    switch (t->element) {
    case NB_ELEMENT_E2M1: return quantize_e2m1_rows(ctx, t, d, st, src, (uint8_t *)out->codes, (uint8_t *)out->scales);
    case NB_ELEMENT_UINT4:
    case NB_ELEMENT_INT4:
    case NB_ELEMENT_INT8: return quantize_int_rows(ctx, t, d, st, src, out);
    case NB_ELEMENT_NF4:
    case NB_ELEMENT_FP4_BNB: return quantize_table_rows(t, d, st, src, out);
    }
    return nbi_fail(ctx, NB_ERR_INTERNAL, "quantize: no quantizer for element type %d", (int)t->element);
}

/* Reserved pointers of an input struct must be NULL. */
static int reserved_null(const void *const *r, size_t n) {
    for (size_t i = 0; i < n; i++)
        if (r[i]) return 0;
    return 1;
}

/* The v1 functions take (codes, scales): a format with zero points needs
 * the _v2 function, named in the message. */
static nb_status need_v2(nb_context *ctx, const nb_weight_desc *d, const char *fn) {
    const nbi_format_traits *t = nbi_traits(d->format);
    if (t->zero_point != NB_ZERO_NONE)
        return nbi_fail(ctx, NB_ERR_UNSUPPORTED, "%s: %s weights carry zero points; use %s_v2", fn, t->name, fn);
    return NB_OK;
}

/* Checks shared by nb_quantize_host and nb_quantize (after the context). */
static nb_status quantize_args(nb_context *ctx, const nb_weight_desc *desc, nb_dtype src_dtype, const void *src,
                               const uint8_t *codes, const uint8_t *scales, const char *fn) {
    nb_status st = nbi_check_desc(ctx, desc, NB_LAYOUT_CHECKPOINT);
    if (st) return st;
    if (!src || !codes || !scales)
        return nbi_fail(ctx, NB_ERR_NULL_POINTER, "%s: src, codes and scales must not be NULL", fn);
    if (!nbi_dtype_size(src_dtype))
        return nbi_fail(ctx, NB_ERR_UNSUPPORTED, "%s: unknown source dtype %d", fn, (int)src_dtype);
    if (desc->scale_type == NB_SCALE_E8M0 &&
        (desc->scale_rule < NB_MX_SCALE_OCP || desc->scale_rule > NB_MX_SCALE_EVEN))
        return nbi_fail(ctx, NB_ERR_INVALID_ARGUMENT, "%s: unknown E8M0 scale rule %d", fn, (int)desc->scale_rule);
    if (desc->method == NB_QUANT_MSE && nbi_traits(desc->format)->element != NB_ELEMENT_E2M1)
        return nbi_fail(ctx, NB_ERR_UNSUPPORTED, "%s: the MSE scale search serves the E2M1 formats (nvfp4, mxfp4), "
                        "not %s", fn, nbi_traits(desc->format)->name);
    if (desc->method == NB_QUANT_HQQ && nbi_traits(desc->format)->zero_point != NB_ZERO_FLOAT)
        return nbi_fail(ctx, NB_ERR_UNSUPPORTED, "%s: HQQ's optimizer serves int4_hqq (float zero points), not %s", fn,
                        nbi_traits(desc->format)->name);
    return NB_OK;
}

/* The buffers of a _v2 call: codes and scales always, zeros exactly when
 * the format has zero points, reserved NULL. */
static nb_status buffers_args(nb_context *ctx, const nb_weight_desc *d, const void *codes, const void *scales,
                              const void *zeros, const void *const *reserved, const char *fn) {
    const nbi_format_traits *t = nbi_traits(d->format);
    if (!reserved_null(reserved, 4))
        return nbi_fail(ctx, NB_ERR_INVALID_ARGUMENT, "%s: the buffers' reserved pointers must be NULL", fn);
    if (!codes || !scales)
        return nbi_fail(ctx, NB_ERR_NULL_POINTER, "%s: codes and scales must not be NULL", fn);
    if (t->zero_point != NB_ZERO_NONE && !zeros)
        return nbi_fail(ctx, NB_ERR_NULL_POINTER, "%s: %s weights carry zero points: zeros must not be NULL", fn,
                        t->name);
    if (t->zero_point == NB_ZERO_NONE && zeros)
        return nbi_fail(ctx, NB_ERR_INVALID_ARGUMENT, "%s: %s weights have no zero points: zeros must be NULL", fn,
                        t->name);
    return NB_OK;
}

nb_status nb_quantize_host(nb_context *ctx, nb_weight_desc *desc, nb_dtype src_dtype, const void *src,
                           uint8_t *codes, uint8_t *scales) {
    if (!ctx) return nbi_fail(NULL, NB_ERR_NULL_POINTER, "nb_quantize_host: ctx is NULL");
    nb_status st = quantize_args(ctx, desc, src_dtype, src, codes, scales, "nb_quantize_host");
    if (st || (st = need_v2(ctx, desc, "nb_quantize_host"))) return st;
    /* Work on a copy of the descriptor: on failure the caller's is unchanged. */
    nb_weight_desc d = *desc;
    const nb_weight_buffers out = {.codes = codes, .scales = scales};
    st = quantize_any(ctx, nbi_traits(d.format), &d, src_dtype, src, &out);
    if (st == NB_OK) *desc = d;
    return st;
}

nb_status nb_quantize_host_v2(nb_context *ctx, nb_weight_desc *desc, nb_dtype src_dtype, const void *src,
                              const nb_weight_buffers *out) {
    static const char fn[] = "nb_quantize_host_v2";
    if (!ctx) return nbi_fail(NULL, NB_ERR_NULL_POINTER, "%s: ctx is NULL", fn);
    if (!out) return nbi_fail(ctx, NB_ERR_NULL_POINTER, "%s: out is NULL", fn);
    nb_status st = quantize_args(ctx, desc, src_dtype, src, (const uint8_t *)out->codes,
                                 (const uint8_t *)out->scales, fn);
    if (st || (st = buffers_args(ctx, desc, out->codes, out->scales, out->zeros, (const void *const *)out->reserved,
                                 fn)))
        return st;
    nb_weight_desc d = *desc;
    st = quantize_any(ctx, nbi_traits(d.format), &d, src_dtype, src, out);
    if (st == NB_OK) *desc = d;
    return st;
}

/* What the device quantizer serves: the formats with kernels, round to
 * nearest. */
static nb_status device_quantizable(nb_context *ctx, const nb_weight_desc *desc, const char *fn) {
    const nbi_format_traits *t = nbi_traits(desc->format);
    if (!t->every_kernel) return nbi_fail(ctx, NB_ERR_UNSUPPORTED, "%s: no GPU kernel serves %s weights", fn, t->name);
    if (desc->method != NB_QUANT_RTN)
        return nbi_fail(ctx, NB_ERR_UNSUPPORTED, "%s: the device quantizer rounds to nearest only; the %s (method %d) "
                        "runs on the host (nb_quantize_host)", fn,
                        desc->method == NB_QUANT_HQQ ? "HQQ optimizer" : "MSE scale search", (int)desc->method);
    return NB_OK;
}

/* The device version: the scan (a max reduction and the first non-finite
 * index, read back) and the block loop run on the GPU; the status and the
 * tensor scale come from quantize_finish_scan, as on the host. */
nb_status nb_quantize(nb_context *ctx, nb_weight_desc *desc, nb_dtype src_dtype, const void *src, uint8_t *codes,
                      uint8_t *scales, void *stream) {
    static const char fn[] = "nb_quantize";
    nb_status st = nbi_need_device(ctx, fn);
    if (st) return st;
    if ((st = quantize_args(ctx, desc, src_dtype, src, codes, scales, fn))) return st;
    if ((uintptr_t)src % nbi_dtype_size(src_dtype))
        return nbi_fail(ctx, NB_ERR_MISALIGNED, "nb_quantize: src must be aligned to its element size (%zu bytes)",
                        nbi_dtype_size(src_dtype));
    if ((st = device_quantizable(ctx, desc, fn))) return st;
    const nbi_format_traits *t = nbi_traits(desc->format);
    nb_weight_desc d = *desc;
    int64_t bad = -1;
    float amax = 0.0f;
    if ((st = nbi_cuda_quantize_scan(ctx, &d, src_dtype, src, &bad, &amax, stream))) return nbi_reraise(ctx, st, fn);
    if ((st = quantize_finish_scan(ctx, t, &d, bad, amax))) return st;
    if ((st = nbi_cuda_quantize(ctx, &d, src_dtype, src, codes, scales, stream))) return nbi_reraise(ctx, st, fn);
    *desc = d;
    return NB_OK;
}

/* Host buffers through device memory: upload, nb_quantize, download. */
nb_status nb_quantize_staged(nb_context *ctx, nb_weight_desc *desc, nb_dtype src_dtype, const void *src,
                             uint8_t *codes, uint8_t *scales, void *stream) {
    static const char fn[] = "nb_quantize_staged";
    nb_status st = nbi_need_device(ctx, fn);
    if (st) return st;
    if ((st = quantize_args(ctx, desc, src_dtype, src, codes, scales, fn))) return st;
    if ((st = device_quantizable(ctx, desc, fn))) return st;
    nb_weight_sizes sz;
    nb_weight_get_sizes(desc, &sz); /* cannot fail: the descriptor was checked */
    const size_t src_bytes = sz.dense_elements * nbi_dtype_size(src_dtype);
    void *dsrc = NULL, *dcodes = NULL, *dscales = NULL;
    if ((st = nbi_cuda_malloc(ctx, &dsrc, src_bytes)) || (st = nbi_cuda_malloc(ctx, &dcodes, sz.codes_bytes)) ||
        (st = nbi_cuda_malloc(ctx, &dscales, sz.scales_bytes)) || (st = nbi_cuda_copy(ctx, dsrc, src, src_bytes, 1, stream))) {
        st = nbi_reraise(ctx, st, fn);
    } else {
        nb_weight_desc d = *desc;
        st = nb_quantize(ctx, &d, src_dtype, dsrc, (uint8_t *)dcodes, (uint8_t *)dscales, stream); /* (its own message) */
        if (st == NB_OK) {
            if ((st = nbi_cuda_copy(ctx, codes, dcodes, sz.codes_bytes, 0, stream)) ||
                (st = nbi_cuda_copy(ctx, scales, dscales, sz.scales_bytes, 0, stream)))
                st = nbi_reraise(ctx, st, fn);
            else
                *desc = d;
        }
    }
    nbi_cuda_free(dsrc);
    nbi_cuda_free(dcodes);
    nbi_cuda_free(dscales);
    return st;
}

/* ----------------------------------------------------------- dequantize */

/* Row r of a checkpoint-layout weight into out[0..k) as float32:
 * (element(q) - z) * s * tensor_scale (no z without zero points).  element
 * x scale is exact in float for E2M1 x E4M3/E8M0 and the integers x
 * F16/BF16, rounded once for the bitsandbytes tables x F32; one rounding for
 * the tensor scale (a multiplication by 1 for formats without one).  Float
 * zero points (NB_ZERO_FLOAT, HQQ): r(r(q - z) s), each step rounded to
 * the scale type (q - z is exact in float32 where rounding it matters, the
 * product of two 16-bit values always). */
void nbi_dequant_row(const nb_weight_desc *d, const nb_weight_data *w, int64_t r, float *out) {
    const nbi_format_traits *t = nbi_traits(d->format);
    const int64_t k = d->k, g = d->group_size, ng = k / g;
    const uint8_t *zeros = (const uint8_t *)w->zeros;
    for (int64_t j = 0; j < k; j++) {
        const int64_t gi = r * ng + j / g;
        float e = nbi_element(t->element, nbi_code_get(t, (const uint8_t *)w->codes, r * k + j));
        const float s = nbi_scale_at(d->scale_type, w->scales, (size_t)gi);
        if (t->zero_point == NB_ZERO_FLOAT) {
            const float dq = round_to_scale(d->scale_type, e - nbi_scale_at(d->scale_type, zeros, (size_t)gi));
            out[j] = round_to_scale(d->scale_type, dq * s) * d->tensor_scale;
            continue;
        }
        if (t->zero_point != NB_ZERO_NONE) e -= (float)zeros[gi]; /* integers: exact */
        out[j] = (e * s) * d->tensor_scale;
    }
}

static nb_status dequantize_args(nb_context *ctx, const nb_weight_desc *desc, nb_dtype dst_dtype, const void *dst,
                                 const char *fn) {
    nb_status st = nbi_check_desc(ctx, desc, NB_LAYOUT_CHECKPOINT);
    if (st) return st;
    if (!dst) return nbi_fail(ctx, NB_ERR_NULL_POINTER, "%s: dst must not be NULL", fn);
    if (!nbi_dtype_size(dst_dtype))
        return nbi_fail(ctx, NB_ERR_UNSUPPORTED, "%s: unknown destination dtype %d", fn, (int)dst_dtype);
    return NB_OK;
}

static nb_status dequantize_rows(nb_context *ctx, const nb_weight_desc *desc, const nb_weight_data *w,
                                 nb_dtype dst_dtype, void *dst, const char *fn) {
    float *row = (float *)malloc(sizeof(float) * (size_t)desc->k);
    if (!row) return nbi_fail(ctx, NB_ERR_OUT_OF_MEMORY, "%s: out of host memory", fn);
    for (int64_t r = 0; r < desc->n; r++) {
        nbi_dequant_row(desc, w, r, row);
        for (int64_t j = 0; j < desc->k; j++) nbi_store(dst_dtype, dst, (size_t)(r * desc->k + j), row[j]);
    }
    free(row);
    return NB_OK;
}

nb_status nb_dequantize_host(nb_context *ctx, const nb_weight_desc *desc, const uint8_t *codes,
                             const uint8_t *scales, nb_dtype dst_dtype, void *dst) {
    static const char fn[] = "nb_dequantize_host";
    if (!ctx) return nbi_fail(NULL, NB_ERR_NULL_POINTER, "nb_dequantize_host: ctx is NULL");
    nb_status st = nbi_check_desc(ctx, desc, NB_LAYOUT_CHECKPOINT);
    if (st) return st;
    if (!codes || !scales || !dst)
        return nbi_fail(ctx, NB_ERR_NULL_POINTER, "nb_dequantize_host: codes, scales and dst must not be NULL");
    if ((st = dequantize_args(ctx, desc, dst_dtype, dst, fn)) || (st = need_v2(ctx, desc, fn))) return st;
    const nb_weight_data w = {.codes = codes, .scales = scales};
    return dequantize_rows(ctx, desc, &w, dst_dtype, dst, fn);
}

nb_status nb_dequantize_host_v2(nb_context *ctx, const nb_weight_desc *desc, const nb_weight_data *w,
                                nb_dtype dst_dtype, void *dst) {
    static const char fn[] = "nb_dequantize_host_v2";
    if (!ctx) return nbi_fail(NULL, NB_ERR_NULL_POINTER, "%s: ctx is NULL", fn);
    nb_status st = nbi_check_desc(ctx, desc, NB_LAYOUT_CHECKPOINT);
    if (st) return st;
    if (!w) return nbi_fail(ctx, NB_ERR_NULL_POINTER, "%s: w is NULL", fn);
    if ((st = buffers_args(ctx, desc, w->codes, w->scales, w->zeros, w->reserved, fn)) ||
        (st = dequantize_args(ctx, desc, dst_dtype, dst, fn)))
        return st;
    return dequantize_rows(ctx, desc, w, dst_dtype, dst, fn);
}

/* ---------------------------------------------------------------- pack */

void nbi_scale_exp_range(const uint8_t *scales, size_t count, int32_t *emin, int32_t *emax) {
    int lo = 256, hi = -1;
    for (size_t i = 0; i < count; i++) {
        int b = scales[i];
        if (b == 0xFF) continue;
        if (b < lo) lo = b;
        if (b > hi) hi = b;
    }
    *emin = hi < 0 ? -1 : lo;
    *emax = hi;
}

/* The integer and table formats' scales and zero points in chunk (rb, kc)
 * (docs/formats.md sections 8.7, 8.8), both directions as pack_walk: per
 * lane group g, the 2 x gpc scales of sb bytes of rows g and g+8 (index h *
 * gpc + j for row g + 8h, kernel group j), and after all scales their zero
 * points in the same order. */
static void pack_int_scales(const nb_weight_desc *desc, uint8_t *chunk, int64_t kc, int64_t rb, uint8_t *scales,
                            uint8_t *zeros, int to_packed) {
    const int64_t n = desc->n, k = desc->k, group = desc->group_size, ng = k / group;
    const nbi_format_traits *t = nbi_traits(desc->format);
    const int kg = nbi_kernel_group(desc), gpc = NBI_CHUNK_K / kg, sb = nbi_scale_bytes(desc->scale_type);
    const int zb = nbi_zero_bytes(t, desc->scale_type);
    const size_t cb = nbi_code_bytes(t);
    for (int gi = 0; gi < 8; gi++)
        for (int half = 0; half < 2; half++)
            for (int j = 0; j < gpc; j++) {
                const int64_t row = rb * 16 + gi + 8 * half, col = kc * NBI_CHUNK_K + (int64_t)kg * j;
                if (row >= n || col >= k) continue; /* padding: scale 0, zero point 0 */
                const size_t src = (size_t)(row * ng + col / group), at = (size_t)(half * gpc + j);
                uint8_t *sd = chunk + cb + (size_t)(2 * sb * gpc * gi) + sb * at;
                uint8_t *zd = chunk + cb + (size_t)(16 * sb * gpc + 2 * zb * gpc * gi) + (size_t)zb * at;
                for (int b = 0; b < sb; b++) {
                    if (to_packed) sd[b] = scales[sb * src + b];
                    else scales[sb * src + b] = sd[b];
                }
                for (int b = 0; zeros && b < zb; b++) {
                    if (to_packed) zd[b] = zeros[(size_t)zb * src + b];
                    else zeros[(size_t)zb * src + b] = zd[b];
                }
            }
}

/* The 8-bit codes of chunk (rb, kc) (docs/formats.md 8.9), both
 * directions as pack_walk: lane L = 4g + t, row half h (rows g, g+8) and
 * piece P own the 16 bytes at 1024 h + 512 P + 16 L; their word w holds
 * elements e = 4 (w / 2) .. +3 of sub-range G = 2P + w % 2 (k = 32 G + 8 t
 * + e of the chunk), element e in byte [0, 2, 1, 3][e % 4]. */
static void pack_walk_bytes(const nb_weight_desc *desc, uint8_t *chunk, int64_t kc, int64_t rb, uint8_t *codes,
                            int to_packed) {
    static const int byte_of[4] = {0, 2, 1, 3};
    const int64_t n = desc->n, k = desc->k;
    for (int lane = 0; lane < 32; lane++)
        for (int h = 0; h < 2; h++)
            for (int P = 0; P < 2; P++)
                for (int w = 0; w < 4; w++)
                    for (int e4 = 0; e4 < 4; e4++) {
                        const int G = 2 * P + w % 2, e = 4 * (w / 2) + e4;
                        const int64_t row = rb * 16 + (lane >> 2) + 8 * h;
                        const int64_t col = kc * NBI_CHUNK_K + 32 * G + 8 * (lane & 3) + e;
                        if (row >= n || col >= k) continue; /* padding: code 0 */
                        uint8_t *b = chunk + 1024 * h + 512 * P + 16 * lane + 4 * w + byte_of[e4];
                        if (to_packed) *b = codes[row * k + col];
                        else codes[row * k + col] = *b;
                    }
}

/* One walk over the packed layout (documented at the top of
 * src/cuda/gemv_fp4.cu and in docs/formats.md section 8; the integer
 * formats' k order and scales in section 8.7) for both
 * directions, so that nb_pack_host and nb_unpack_host cannot disagree about
 * where an element lives.  to_packed: codes/scales -> packed (padding written
 * as zeros; `packed` pre-zeroed by the caller), else packed -> codes/scales
 * (codes pre-zeroed: nbi_code_put ORs; padding skipped). */
static void pack_walk(const nbi_format_traits *t, const nb_weight_desc *desc, uint8_t *codes, uint8_t *scales,
                      uint8_t *zeros, uint8_t *out, int to_packed) {
    const int64_t n = desc->n, k = desc->k, g = desc->group_size, ng = k / g;
    const int64_t rb_count = (n + 15) / 16, kc_count = (k + NBI_CHUNK_K - 1) / NBI_CHUNK_K;
    const size_t cb = nbi_packed_chunk_bytes(desc);
    const int e2m1 = t->element == NB_ELEMENT_E2M1;
    const int table = nbi_is_table(t);
    const int gpc = NBI_CHUNK_K / (int)g; /* E2M1: groups per chunk, 8 or 4 */
    for (int64_t rb = 0; rb < rb_count; rb++)
        for (int64_t kc = 0; kc < kc_count; kc++) {
            uint8_t *chunk = out + (size_t)(rb * kc_count + kc) * cb;
            if (t->element_bits == 8) { /* int8 (docs/formats.md 8.9) */
                pack_walk_bytes(desc, chunk, kc, rb, codes, to_packed);
                pack_int_scales(desc, chunk, kc, rb, scales, zeros, to_packed);
                continue;
            }
            for (int lane = 0; lane < 32; lane++) {
                const int gi = lane >> 2, ti = lane & 3;
                for (int half = 0; half < 2; half++) {
                    const int64_t row = rb * 16 + gi + 8 * half;
                    uint8_t *dst = chunk + half * 512 + lane * 16;
                    for (int w = 0; w < 4; w++) {
                        uint32_t word = 0;
                        if (!to_packed)
                            for (int b = 0; b < 4; b++) word |= (uint32_t)dst[4 * w + b] << (8 * b);
                        for (int p = 0; p < 8; p++) {
                            /* E2M1: element p's bits where NBI_E2M1_PUT puts them (docs/formats.md
                             * 8.2); integers: nibble p holds element 2p (p < 4) or 2(p-4)+1; the
                             * table formats' element p in nibble p (8.8) */
                            int e = table || e2m1 ? p : p < 4 ? 2 * p : 2 * (p - 4) + 1;
                            /* E2M1: lane t holds k = 32t..32t+31; integers: word w holds 32w + 8t.. */
                            int64_t col = kc * NBI_CHUNK_K + (e2m1 ? 32 * ti + 8 * w : 32 * w + 8 * ti) + e;
                            if (row >= n || col >= k) continue; /* padding: code 0 */
                            if (to_packed) {
                                const uint32_t c = nbi_code_get(t, codes, row * k + col);
                                word |= e2m1 ? NBI_E2M1_PUT(p, c) : c << (4 * p);
                            } else {
                                const uint32_t c = e2m1 ? NBI_E2M1_GET(word, p) : (word >> (4 * p)) & 0xF;
                                nbi_code_put(t, codes, row * k + col, (uint8_t)c);
                            }
                        }
                        if (to_packed)
                            for (int b = 0; b < 4; b++) dst[4 * w + b] = (uint8_t)(word >> (8 * b));
                    }
                }
                if (!e2m1) continue; /* (the integer formats' scales: below) */
                /* scales: 4 bytes per lane for groups of 16, 2 for groups of 32 */
                const int spl = gpc / 4 * 2; /* scale bytes per lane */
                uint8_t *sdst = chunk + NBI_CHUNK_CODE_BYTES + lane * spl;
                for (int half = 0; half < 2; half++)
                    for (int q = 0; q < gpc / 4; q++) {
                        const int64_t row = rb * 16 + gi + 8 * half;
                        const int64_t grp = kc * gpc + ti * (gpc / 4) + q;
                        if (row >= n || grp >= ng) continue; /* padding: scale byte 0 */
                        if (to_packed) sdst[half * (gpc / 4) + q] = scales[row * ng + grp];
                        else scales[row * ng + grp] = sdst[half * (gpc / 4) + q];
                    }
            }
            if (!e2m1) pack_int_scales(desc, chunk, kc, rb, scales, zeros, to_packed);
        }
}

/* The byte range of zero points (-1, -1 for none): what the planner checks
 * for BF16 activations (gemv_fp4.cu "INTEGER FORMATS"). */
static void zero_range(const uint8_t *zeros, size_t count, int32_t *zmin, int32_t *zmax) {
    int lo = 256, hi = -1;
    for (size_t i = 0; i < count; i++) {
        if (zeros[i] < lo) lo = zeros[i];
        if (zeros[i] > hi) hi = zeros[i];
    }
    *zmin = hi < 0 ? -1 : lo;
    *zmax = hi;
}

static nb_status pack_host_common(nb_context *ctx, nb_weight_desc *desc, const nb_weight_data *w, void *packed,
                                  size_t packed_bytes, const char *fn) {
    nb_weight_sizes_v2 sz;
    nb_status st = nbi_packed_size(ctx, desc, packed_bytes, &sz, fn);
    if (st) return st;
    const nbi_format_traits *t = nbi_traits(desc->format);
    memset(packed, 0, sz.packed_bytes);
    /* (read only in this direction) */
    pack_walk(t, desc, (uint8_t *)(uintptr_t)w->codes, (uint8_t *)(uintptr_t)w->scales,
              (uint8_t *)(uintptr_t)w->zeros, (uint8_t *)packed, 1);
    desc->layout = NB_LAYOUT_PACKED;
    if (t->scale_type == NB_SCALE_E8M0)
        nbi_scale_exp_range((const uint8_t *)w->scales, (size_t)(desc->n * (desc->k / desc->group_size)),
                            &desc->scale_exp_min, &desc->scale_exp_max);
    if (t->zero_point == NB_ZERO_U8) /* (float zero points have no range to check) */
        zero_range((const uint8_t *)w->zeros, sz.zeros_bytes, &desc->scale_exp_min, &desc->scale_exp_max);
    return NB_OK;
}

nb_status nb_pack_host(nb_context *ctx, nb_weight_desc *desc, const uint8_t *codes, const uint8_t *scales,
                       void *packed, size_t packed_bytes) {
    static const char fn[] = "nb_pack_host";
    if (!ctx) return nbi_fail(NULL, NB_ERR_NULL_POINTER, "%s: ctx is NULL", fn);
    nb_status st = nbi_check_desc(ctx, desc, NB_LAYOUT_CHECKPOINT);
    if (st) return st;
    if (!codes || !scales || !packed)
        return nbi_fail(ctx, NB_ERR_NULL_POINTER, "%s: codes, scales and packed must not be NULL", fn);
    if ((st = need_v2(ctx, desc, fn))) return st;
    const nb_weight_data w = {.codes = codes, .scales = scales};
    return pack_host_common(ctx, desc, &w, packed, packed_bytes, fn);
}

nb_status nb_pack_host_v2(nb_context *ctx, nb_weight_desc *desc, const nb_weight_data *w, void *packed,
                          size_t packed_bytes) {
    static const char fn[] = "nb_pack_host_v2";
    if (!ctx) return nbi_fail(NULL, NB_ERR_NULL_POINTER, "%s: ctx is NULL", fn);
    nb_status st = nbi_check_desc(ctx, desc, NB_LAYOUT_CHECKPOINT);
    if (st) return st;
    if (!w || !packed) return nbi_fail(ctx, NB_ERR_NULL_POINTER, "%s: w and packed must not be NULL", fn);
    if ((st = buffers_args(ctx, desc, w->codes, w->scales, w->zeros, w->reserved, fn))) return st;
    return pack_host_common(ctx, desc, w, packed, packed_bytes, fn);
}

static nb_status unpack_host_common(nb_context *ctx, nb_weight_desc *desc, const void *packed, size_t packed_bytes,
                                    const nb_weight_buffers *out, const char *fn) {
    nb_weight_sizes_v2 sz;
    nb_status st = nbi_packed_size(ctx, desc, packed_bytes, &sz, fn);
    if (st) return st;
    const nbi_format_traits *t = nbi_traits(desc->format);
    memset(out->codes, 0, sz.codes_bytes);
    memset(out->scales, 0, sz.scales_bytes);
    if (out->zeros) memset(out->zeros, 0, sz.zeros_bytes);
    pack_walk(t, desc, (uint8_t *)out->codes, (uint8_t *)out->scales, (uint8_t *)out->zeros,
              (uint8_t *)(uintptr_t)packed, 0);
    desc->layout = NB_LAYOUT_CHECKPOINT;
    return NB_OK;
}

nb_status nb_unpack_host(nb_context *ctx, nb_weight_desc *desc, const void *packed, size_t packed_bytes,
                         uint8_t *codes, uint8_t *scales) {
    static const char fn[] = "nb_unpack_host";
    if (!ctx) return nbi_fail(NULL, NB_ERR_NULL_POINTER, "%s: ctx is NULL", fn);
    nb_status st = nbi_check_desc(ctx, desc, NB_LAYOUT_PACKED);
    if (st) return st;
    if (!codes || !scales || !packed)
        return nbi_fail(ctx, NB_ERR_NULL_POINTER, "%s: packed, codes and scales must not be NULL", fn);
    if ((st = need_v2(ctx, desc, fn))) return st;
    const nb_weight_buffers out = {.codes = codes, .scales = scales};
    return unpack_host_common(ctx, desc, packed, packed_bytes, &out, fn);
}

nb_status nb_unpack_host_v2(nb_context *ctx, nb_weight_desc *desc, const void *packed, size_t packed_bytes,
                            const nb_weight_buffers *out) {
    static const char fn[] = "nb_unpack_host_v2";
    if (!ctx) return nbi_fail(NULL, NB_ERR_NULL_POINTER, "%s: ctx is NULL", fn);
    nb_status st = nbi_check_desc(ctx, desc, NB_LAYOUT_PACKED);
    if (st) return st;
    if (!out || !packed) return nbi_fail(ctx, NB_ERR_NULL_POINTER, "%s: packed and out must not be NULL", fn);
    if ((st = buffers_args(ctx, desc, out->codes, out->scales, out->zeros, (const void *const *)out->reserved, fn)))
        return st;
    return unpack_host_common(ctx, desc, packed, packed_bytes, out, fn);
}
