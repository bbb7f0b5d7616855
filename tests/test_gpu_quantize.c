/* test_gpu_quantize.c - nb_quantize (the device quantizer) against
 * nb_quantize_host, byte for byte, on a real GPU.
 *
 *   test_gpu_quantize [--quick] [--small]   exit 0 pass, 1 fail, 77 no device (skipped)
 *   (--small: the ragged shapes up to 129 rows only, no Llama shapes: for
 *   compute-sanitizer's racecheck, which is slow on large grids)
 *
 * For NVFP4 (computed and given tensor scales) and MXFP4 (rules OCP,
 * ROUND_UP, EVEN), each with F32, F16 and BF16 input, on ragged shapes (n =
 * 1, 3, 17, 1000; k an odd multiple of the group) and Llama shapes (4096 x
 * 4096, and 4096 x 14336 without --quick), the code bytes, scale bytes and
 * tensor scale of nb_quantize (device buffers) and nb_quantize_staged (host
 * buffers) must equal nb_quantize_host's.  The data:
 *   - Gaussian with several seeds; heavy-tailed (Gaussian times e^(3 g));
 *   - values exactly on the E2M1 tie points of their block (0.25, 0.75,
 *     1.25, 1.75, 2.5, 3.5, 5 times the block's scale, both signs), with a
 *     given tensor scale so that the scales are exact;
 *   - all-zero blocks, all-zero rows and an all-zero tensor; negative zeros;
 *   - subnormal inputs (F32, F16 and BF16 subnormals; a tensor of
 *     subnormals only, whose NVFP4 tensor scale underflows);
 *   - huge values near each dtype's limit (FLT_MAX, 65504, BF16's max);
 *   - random finite bit patterns over every exponent of the dtype;
 *   - NVFP4 tensor scales given far too small or large (clamped block scales,
 *     underflowing denominators).
 * Errors: every argument check returns its status with a message; a
 * non-finite element gives NB_ERR_INVALID_ARGUMENT with the host's message,
 * leaves the device buffers and the descriptor untouched; bad tensor scales
 * are refused like on the host; a host-only context is NB_ERR_NO_DEVICE.
 * Device buffers are allocated at their exact sizes, so the test is also
 * meant to run under compute-sanitizer --tool memcheck (--quick). */
#include "nibble.h"

#include <cuda_runtime.h>
#include <float.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "gpu_testlib.h" /* gt_need_device */

#define CK(call)                                                                                             \
    do {                                                                                                     \
        cudaError_t e_ = (call);                                                                             \
        if (e_ != cudaSuccess) {                                                                             \
            fprintf(stderr, "%s:%d CUDA error %s: %s\n", __FILE__, __LINE__, #call, cudaGetErrorString(e_)); \
            exit(1);                                                                                         \
        }                                                                                                    \
    } while (0)

/* splitmix64: deterministic data per seed */
static uint64_t g_rng;
static uint64_t rnd(void) {
    uint64_t z = (g_rng += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}
static double unit(void) { return (double)(rnd() >> 11) * 0x1p-53; }
static double gauss(void) {
    double u = unit() + 0x1p-60, v = unit();
    return sqrt(-2.0 * log(u)) * cos(6.283185307179586 * v);
}

/* ------------------------------------------------------------ storage */

static size_t esize(nb_dtype t) { return t == NB_DTYPE_F32 ? 4 : 2; }
static const char *dname(nb_dtype t) { return t == NB_DTYPE_F32 ? "f32" : t == NB_DTYPE_F16 ? "f16" : "bf16"; }

/* float -> F16 / BF16 bits, round to nearest even (finite inputs; F16
 * overflow saturates to 65504 so that the data stay finite). */
static uint16_t to_f16(float f) {
    uint32_t u;
    memcpy(&u, &f, 4);
    uint16_t sign = (uint16_t)((u >> 16) & 0x8000u);
    float a = fabsf(f);
    if (a >= 65504.0f) return sign | 0x7BFF;
    if (a < 0x1p-14f) return sign | (uint16_t)lrintf(a * 0x1p24f); /* subnormal grid 2^-24, RNE */
    int e;
    frexpf(a, &e);
    float q = ldexpf(1.0f, e - 11); /* 11 significant bits */
    float r = rintf(a / q) * q;
    if (r >= 65504.0f) return sign | 0x7BFF;
    frexpf(r, &e);
    uint32_t mant = (uint32_t)(ldexpf(r, 11 - e)) - 1024u;
    return sign | (uint16_t)((uint32_t)(e - 1 + 15) << 10 | mant);
}
static uint16_t to_bf16(float f) {
    uint32_t u;
    memcpy(&u, &f, 4);
    uint32_t r = u + 0x7FFFu + ((u >> 16) & 1u);
    if (((r >> 23) & 0xFF) == 0xFF) r = (u & 0x80000000u) | 0x7F7F0000u; /* stay finite */
    return (uint16_t)(r >> 16);
}
static void store(nb_dtype t, void *p, size_t i, float v) {
    if (t == NB_DTYPE_F32) ((float *)p)[i] = v;
    else if (t == NB_DTYPE_F16) ((uint16_t *)p)[i] = to_f16(v);
    else ((uint16_t *)p)[i] = to_bf16(v);
}

/* Element i of a dtype-t buffer set to the raw bits `bits`. */
static void set_bits(nb_dtype t, void *p, size_t i, uint32_t bits) {
    if (t == NB_DTYPE_F32) memcpy((float *)p + i, &bits, 4);
    else ((uint16_t *)p)[i] = (uint16_t)bits;
}

/* A random finite bit pattern of dtype t (every exponent, subnormals too). */
static void store_bits(nb_dtype t, void *p, size_t i) {
    for (;;) {
        uint64_t r = rnd();
        if (t == NB_DTYPE_F32) {
            uint32_t u = (uint32_t)r;
            if (((u >> 23) & 0xFF) == 0xFF) continue;
            memcpy((float *)p + i, &u, 4);
        } else {
            uint16_t h = (uint16_t)r;
            if (t == NB_DTYPE_F16 ? ((h >> 10) & 31) == 31 : ((h >> 7) & 0xFF) == 0xFF) continue;
            ((uint16_t *)p)[i] = h;
        }
        return;
    }
}

/* ------------------------------------------------------------ data sets */

enum {
    D_GAUSS, D_HEAVY, D_TIES, D_ZERO_BLOCKS, D_ALL_ZERO, D_SUBNORMAL, D_SUBNORMAL_ONLY, D_HUGE, D_BITS, D_COUNT
};
static const char *const k_data_name[D_COUNT] = {"gaussian", "heavy-tailed", "ties", "zero blocks", "all zero",
                                                "subnormals", "subnormals only", "huge", "random bits"};

/* the largest finite value and the smallest subnormal of each dtype */
static float dtype_max(nb_dtype t) {
    return t == NB_DTYPE_F32 ? FLT_MAX : t == NB_DTYPE_F16 ? 65504.0f : 0x1.FEp127f;
}
static float dtype_min_sub(nb_dtype t) {
    return t == NB_DTYPE_F32 ? 0x1p-149f : t == NB_DTYPE_F16 ? 0x1p-24f : 0x1p-133f;
}

/* Fill src (n x k of dtype t) with data set `kind`.  D_TIES puts each
 * block's maximum at 6 times a chosen scale and the other elements at tie
 * points (or codes) times that scale.  NVFP4: scale = an E4M3 value times the
 * given tensor scale ts, which the quantizer recovers exactly when ts is a
 * power of two.  MXFP4: scale 2^e, which every rule picks for a block
 * maximum of 6 * 2^e (OCP: floor(log2 6) - 2 = 0; ROUND_UP: 6 * 2^e / 6 is
 * already a power of two; EVEN: 1.5 is below the 1.75 round-up point). */
static void fill(nb_dtype t, void *src, int64_t n, int64_t k, int group, int kind, int nvfp4, float ts) {
    static const float ties[7] = {0.25f, 0.75f, 1.25f, 1.75f, 2.5f, 3.5f, 5.0f};
    const size_t nk = (size_t)(n * k);
    for (size_t i = 0; i < nk; i++) {
        float v = 0.0f;
        switch (kind) {
        case D_GAUSS: v = (float)(0.02 * gauss()); break;
        case D_HEAVY: v = (float)(gauss() * exp(3.0 * gauss())); break;
        case D_ZERO_BLOCKS: v = (float)gauss(); break;
        case D_SUBNORMAL:
            v = (rnd() & 1) ? (float)gauss() * 0.01f : (float)((int)(rnd() % 2001) - 1000) * dtype_min_sub(t);
            break;
        case D_SUBNORMAL_ONLY: v = (float)((int)(rnd() % 21) - 10) * dtype_min_sub(t); break;
        case D_HUGE: v = (float)(unit() * 2.0 - 1.0) * dtype_max(t); break;
        default: break;
        }
        if (kind == D_BITS) store_bits(t, src, i);
        else if (kind != D_TIES) store(t, src, i, v);
    }
    if (kind == D_ZERO_BLOCKS) { /* every 3rd block, every 5th row zero; some negative zeros */
        for (int64_t r = 0; r < n; r++)
            for (int64_t j = 0; j < k; j++)
                if (r % 5 == 2 || (j / group) % 3 == 1) store(t, src, (size_t)(r * k + j), (rnd() & 1) ? -0.0f : 0.0f);
    }
    if (kind == D_HUGE) /* the largest finite value itself, both signs */
        for (size_t i = 0; i < nk; i += 97) store(t, src, i, (i / 97) & 1 ? -dtype_max(t) : dtype_max(t));
    if (kind == D_TIES) {
        for (int64_t b = 0; b < n * k / group; b++) {
            float s;
            if (nvfp4) {
                /* an E4M3 block scale 2^-4 .. 2^3 with a 3-bit mantissa, times ts */
                int e = (int)(rnd() % 8) - 4, m = (int)(rnd() % 8);
                s = ldexpf(1.0f + (float)m / 8.0f, e) * ts;
            } else {
                s = ldexpf(1.0f, (int)(rnd() % 16) - 8);
            }
            for (int j = 0; j < group; j++) {
                float q = j == 0 ? 6.0f : ties[rnd() % 7];
                if (j != 0 && rnd() % 4 == 0) q = (float)(rnd() % 7); /* some representable values too */
                float v = q * s;
                store(t, src, (size_t)(b * group + j), (rnd() & 1) ? -v : v);
            }
        }
    }
}

/* ------------------------------------------------------------ one case */

typedef struct env {
    nb_context *ctx;
    cudaStream_t stream;
} env;

static const char *rule_name(nb_mx_scale_rule r) {
    return r == NB_MX_SCALE_OCP ? "ocp" : r == NB_MX_SCALE_ROUND_UP ? "round-up" : "even";
}

/* Quantize src (host) on both sides; compare status, message, bytes and the
 * descriptor.  given_ts 0: computed (NVFP4). */
static void compare(env *e, nb_format fmt, nb_mx_scale_rule rule, nb_dtype t, int64_t n, int64_t k, float given_ts,
                    const void *src, const char *label) {
    char what[384];
    nb_weight_desc d;
    if (nb_weight_desc_init(&d, fmt, n, k) != NB_OK) {
        CHECK(0, "nb_weight_desc_init");
        return;
    }
    d.scale_rule = rule;
    if (fmt == NB_FORMAT_NVFP4) d.tensor_scale = given_ts;
    nb_weight_sizes sz;
    nb_weight_get_sizes(&d, &sz);
    const size_t sbytes = sz.dense_elements * esize(t);
    uint8_t *hc = malloc(sz.codes_bytes), *hs = malloc(sz.scales_bytes);
    uint8_t *gc = malloc(sz.codes_bytes), *gs = malloc(sz.scales_bytes);
    void *dsrc;
    uint8_t *dc, *ds;
    CK(cudaMalloc(&dsrc, sbytes));
    CK(cudaMalloc((void **)&dc, sz.codes_bytes));
    CK(cudaMalloc((void **)&ds, sz.scales_bytes));
    CK(cudaMemcpy(dsrc, src, sbytes, cudaMemcpyHostToDevice));
    CK(cudaMemset(dc, 0xA5, sz.codes_bytes));
    CK(cudaMemset(ds, 0xA5, sz.scales_bytes));
    memset(hc, 0xA5, sz.codes_bytes);
    memset(hs, 0xA5, sz.scales_bytes);
    nb_weight_desc hd = d, gd = d;
    nb_status hst = nb_quantize_host(e->ctx, &hd, t, src, hc, hs);
    char hmsg[512];
    snprintf(hmsg, sizeof hmsg, "%s", nb_context_last_error(e->ctx));
    nb_status gst = nb_quantize(e->ctx, &gd, t, dsrc, dc, ds, e->stream);
    char gmsg[512];
    snprintf(gmsg, sizeof gmsg, "%s", nb_context_last_error(e->ctx));
    CK(cudaStreamSynchronize(e->stream));
    CK(cudaMemcpy(gc, dc, sz.codes_bytes, cudaMemcpyDeviceToHost));
    CK(cudaMemcpy(gs, ds, sz.scales_bytes, cudaMemcpyDeviceToHost));
    /* the same through host buffers (nb_quantize_staged) */
    uint8_t *sc = malloc(sz.codes_bytes), *ss = malloc(sz.scales_bytes);
    memset(sc, 0xA5, sz.codes_bytes);
    memset(ss, 0xA5, sz.scales_bytes);
    nb_weight_desc sd = d;
    nb_status sst = nb_quantize_staged(e->ctx, &sd, t, src, sc, ss, e->stream);
    snprintf(what, sizeof what, "%s %s %s %lldx%lld ts=%g (%s)", fmt == NB_FORMAT_NVFP4 ? "nvfp4" : "mxfp4",
             fmt == NB_FORMAT_MXFP4 ? rule_name(rule) : "-", dname(t), (long long)n, (long long)k, (double)given_ts,
             label);
    const char *smsg = nb_context_last_error(e->ctx);
    if (hst != gst || hst != sst || (hst != NB_OK && (strcmp(hmsg, gmsg) || strcmp(hmsg, smsg)))) {
        fprintf(stderr, "  %s: host %s \"%s\", device %s \"%s\", staged %s \"%s\"\n", what, nb_status_name(hst), hmsg,
                nb_status_name(gst), gmsg, nb_status_name(sst), smsg);
        CHECK(0, "%s", what);
    } else {
        size_t bad_c = 0, bad_s = 0, first_c = 0, first_s = 0;
        for (size_t i = 0; i < sz.codes_bytes; i++)
            if (hc[i] != gc[i] && !bad_c++) first_c = i;
        for (size_t i = 0; i < sz.scales_bytes; i++)
            if (hs[i] != gs[i] && !bad_s++) first_s = i;
        int ts_ok = !memcmp(&hd, &gd, sizeof hd) && !memcmp(&hd, &sd, sizeof hd);
        int staged_ok = !memcmp(hc, sc, sz.codes_bytes) && !memcmp(hs, ss, sz.scales_bytes);
        if (!staged_ok) fprintf(stderr, "  %s: nb_quantize_staged bytes differ from the host's\n", what);
        if (bad_c || bad_s || !ts_ok) {
            fprintf(stderr, "  %s: %zu code bytes differ (first %zu: host %02x device %02x), %zu scale bytes differ "
                            "(first %zu: host %02x device %02x), tensor scale host %.9g device %.9g\n",
                    what, bad_c, first_c, hc[first_c], gc[first_c], bad_s, first_s, hs[first_s], gs[first_s],
                    (double)hd.tensor_scale, (double)gd.tensor_scale);
        }
        CHECK(!bad_c && !bad_s && ts_ok && staged_ok, "%s", what);
    }
    free(sc);
    free(ss);
    free(hc);
    free(hs);
    free(gc);
    free(gs);
    CK(cudaFree(dsrc));
    CK(cudaFree(dc));
    CK(cudaFree(ds));
}

/* Every format/rule/dtype (and, for NVFP4, computed and given tensor
 * scales) on one data set and shape. */
static void sweep(env *e, int64_t n, int64_t k, int kind, uint64_t seed) {
    const nb_dtype dts[3] = {NB_DTYPE_F32, NB_DTYPE_F16, NB_DTYPE_BF16};
    const nb_mx_scale_rule rules[3] = {NB_MX_SCALE_OCP, NB_MX_SCALE_ROUND_UP, NB_MX_SCALE_EVEN};
    char label[96];
    for (int di = 0; di < 3; di++) {
        const nb_dtype t = dts[di];
        void *src = malloc((size_t)(n * k) * esize(t));
        for (int f = 0; f < 2; f++) {
            const nb_format fmt = f ? NB_FORMAT_MXFP4 : NB_FORMAT_NVFP4;
            if (k % (f ? 32 : 16)) continue;
            /* NVFP4: the computed tensor scale, then given ones (ties need an exact one) */
            const float given[4] = {0.0f, 0.0123f, 0x1p-100f, 0x1p+100f};
            for (int gi = 0; gi < (f ? 3 : 4); gi++) {
                const float ts = f ? 0.0f : kind == D_TIES ? (gi == 0 ? 1.0f : given[gi]) : given[gi];
                g_rng = seed;
                fill(t, src, n, k, f ? 32 : 16, kind, !f, ts == 0.0f ? 1.0f : ts);
                snprintf(label, sizeof label, "%s, seed %llu", k_data_name[kind], (unsigned long long)seed);
                if (f) compare(e, fmt, rules[gi], t, n, k, 0.0f, src, label);
                else compare(e, fmt, NB_MX_SCALE_OCP, t, n, k, ts, src, label);
            }
        }
        free(src);
    }
}

/* ------------------------------------------------------------ errors */

#define EXPECT(want, call, what)                                                                            \
    do {                                                                                                    \
        nb_status s_ = (call);                                                                              \
        char w_[256];                                                                                       \
        snprintf(w_, sizeof w_, "%s -> %s (got %s: %s)", what, nb_status_name(want), nb_status_name(s_),   \
                 nb_last_error());                                                                          \
        CHECK(s_ == (want) && (s_ == NB_OK || nb_last_error()[0]), "%s", w_);                              \
    } while (0)

static void test_errors(env *e) {
    enum { N = 8, K = 64 };
    nb_weight_desc ok, d;
    nb_weight_desc_init(&ok, NB_FORMAT_NVFP4, N, K);
    float *w = malloc(sizeof(float) * N * K);
    g_rng = 7;
    for (int i = 0; i < N * K; i++) w[i] = (float)gauss();
    float *dw;
    uint8_t *dc, *ds;
    CK(cudaMalloc((void **)&dw, sizeof(float) * N * K + 16));
    CK(cudaMalloc((void **)&dc, N * K / 2));
    CK(cudaMalloc((void **)&ds, N * K / 16));
    CK(cudaMemcpy(dw, w, sizeof(float) * N * K, cudaMemcpyHostToDevice));
    nb_context *host = NULL;
    nb_context_create(NB_DEVICE_NONE, &host);
    d = ok;
    EXPECT(NB_ERR_NULL_POINTER, nb_quantize(NULL, &d, NB_DTYPE_F32, dw, dc, ds, NULL), "ctx NULL");
    EXPECT(NB_ERR_NO_DEVICE, nb_quantize(host, &d, NB_DTYPE_F32, dw, dc, ds, NULL), "host-only context");
    EXPECT(NB_ERR_NULL_POINTER, nb_quantize(e->ctx, NULL, NB_DTYPE_F32, dw, dc, ds, NULL), "desc NULL");
    EXPECT(NB_ERR_NULL_POINTER, nb_quantize(e->ctx, &d, NB_DTYPE_F32, NULL, dc, ds, NULL), "src NULL");
    EXPECT(NB_ERR_NULL_POINTER, nb_quantize(e->ctx, &d, NB_DTYPE_F32, dw, NULL, ds, NULL), "codes NULL");
    EXPECT(NB_ERR_NULL_POINTER, nb_quantize(e->ctx, &d, NB_DTYPE_F32, dw, dc, NULL, NULL), "scales NULL");
    EXPECT(NB_ERR_UNSUPPORTED, nb_quantize(e->ctx, &d, (nb_dtype)7, dw, dc, ds, NULL), "unknown dtype");
    d.method = NB_QUANT_MSE; /* host only */
    EXPECT(NB_ERR_UNSUPPORTED, nb_quantize(e->ctx, &d, NB_DTYPE_F32, dw, dc, ds, NULL), "method mse on the device");
    EXPECT(NB_ERR_UNSUPPORTED, nb_quantize_staged(e->ctx, &d, NB_DTYPE_F32, w, (uint8_t *)w, (uint8_t *)w, NULL),
           "method mse, staged");
    d = ok;
    EXPECT(NB_ERR_MISALIGNED, nb_quantize(e->ctx, &d, NB_DTYPE_F32, (char *)dw + 2, dc, ds, NULL), "F32 src + 2");
    EXPECT(NB_ERR_MISALIGNED, nb_quantize(e->ctx, &d, NB_DTYPE_BF16, (char *)dw + 1, dc, ds, NULL), "BF16 src + 1");
    EXPECT(NB_ERR_NULL_POINTER, nb_quantize_staged(NULL, &d, NB_DTYPE_F32, w, (uint8_t *)w, (uint8_t *)w, NULL),
           "staged: ctx NULL");
    EXPECT(NB_ERR_NO_DEVICE, nb_quantize_staged(host, &d, NB_DTYPE_F32, w, (uint8_t *)w, (uint8_t *)w, NULL),
           "staged: host-only context");
    EXPECT(NB_ERR_NULL_POINTER, nb_quantize_staged(e->ctx, &d, NB_DTYPE_F32, NULL, (uint8_t *)w, (uint8_t *)w, NULL),
           "staged: src NULL");
    d = ok, d.layout = NB_LAYOUT_PACKED;
    EXPECT(NB_ERR_INVALID_ARGUMENT, nb_quantize(e->ctx, &d, NB_DTYPE_F32, dw, dc, ds, NULL), "packed layout");
    d = ok, d.k = 40;
    EXPECT(NB_ERR_BAD_SHAPE, nb_quantize(e->ctx, &d, NB_DTYPE_F32, dw, dc, ds, NULL), "k not a multiple of 16");
    d = ok, d.n = 0;
    EXPECT(NB_ERR_BAD_SHAPE, nb_quantize(e->ctx, &d, NB_DTYPE_F32, dw, dc, ds, NULL), "n = 0");
    nb_weight_desc mx;
    nb_weight_desc_init(&mx, NB_FORMAT_MXFP4, N, K);
    d = mx, d.scale_rule = (nb_mx_scale_rule)3;
    EXPECT(NB_ERR_INVALID_ARGUMENT, nb_quantize(e->ctx, &d, NB_DTYPE_F32, dw, dc, ds, NULL), "MXFP4 rule 3");
    d = mx, d.tensor_scale = 2.0f;
    EXPECT(NB_ERR_INVALID_ARGUMENT, nb_quantize(e->ctx, &d, NB_DTYPE_F32, dw, dc, ds, NULL), "MXFP4 tensor_scale 2");
    const float bad_ts[3] = {NAN, INFINITY, -1.0f};
    for (int i = 0; i < 3; i++) {
        d = ok, d.tensor_scale = bad_ts[i];
        EXPECT(NB_ERR_INVALID_ARGUMENT, nb_quantize(e->ctx, &d, NB_DTYPE_F32, dw, dc, ds, NULL), "bad tensor_scale");
    }
    /* non-finite input: the host's status and message; nothing written */
    struct {
        nb_dtype t;
        size_t at;
        uint32_t bits;
    } nf[5] = {{NB_DTYPE_F32, 77, 0x7FC00000u},  {NB_DTYPE_F32, 3, 0xFF800000u}, {NB_DTYPE_F16, N * K - 1, 0x7C00u},
               {NB_DTYPE_BF16, 0, 0x7FC1u},      {NB_DTYPE_BF16, 200, 0xFF80u}};
    for (int i = 0; i < 5; i++)
        for (int f = 0; f < 2; f++) {
            nb_dtype t = nf[i].t;
            uint8_t *h = calloc(N * K, 4);
            for (int j = 0; j < N * K; j++) store(t, h, (size_t)j, w[j]);
            set_bits(t, h, nf[i].at, nf[i].bits);
            if (nf[i].at != 3) /* a second non-finite element later: the first one is reported */
                set_bits(t, h, N * K - 2, t == NB_DTYPE_F32 ? 0x7F800000u : t == NB_DTYPE_F16 ? 0x7C00u : 0x7F80u);
            CK(cudaMemcpy(dw, h, (size_t)(N * K) * esize(t), cudaMemcpyHostToDevice));
            CK(cudaMemset(dc, 0x5A, N * K / 2));
            CK(cudaMemset(ds, 0x5A, N * K / 16));
            nb_weight_desc hd = f ? mx : ok, gd = hd, before = hd;
            uint8_t hc[N * K / 2], hs[N * K / 16], gc[N * K / 2], gs[N * K / 16];
            nb_status hst = nb_quantize_host(e->ctx, &hd, t, h, hc, hs);
            char hmsg[512];
            snprintf(hmsg, sizeof hmsg, "%s", nb_last_error());
            nb_status gst = nb_quantize(e->ctx, &gd, t, dw, dc, ds, e->stream);
            CK(cudaStreamSynchronize(e->stream));
            CK(cudaMemcpy(gc, dc, sizeof gc, cudaMemcpyDeviceToHost));
            CK(cudaMemcpy(gs, ds, sizeof gs, cudaMemcpyDeviceToHost));
            int untouched = 1;
            for (size_t j = 0; j < sizeof gc; j++) untouched &= gc[j] == 0x5A;
            for (size_t j = 0; j < sizeof gs; j++) untouched &= gs[j] == 0x5A;
            char what[1200];
            snprintf(what, sizeof what, "non-finite %s element %zu (%s): host %s \"%s\", device %s \"%s\"", dname(t),
                     nf[i].at, f ? "mxfp4" : "nvfp4", nb_status_name(hst), hmsg, nb_status_name(gst), nb_last_error());
            CHECK(hst == NB_ERR_INVALID_ARGUMENT && gst == hst && !strcmp(hmsg, nb_last_error()) && untouched &&
                      !memcmp(&gd, &before, sizeof gd),
                  "%s", what);
            free(h);
        }
    CHECK(nb_context_last_error(e->ctx)[0] != 0, "errors leave a message in the context");
    nb_context_destroy(host);
    free(w);
    CK(cudaFree(dw));
    CK(cudaFree(dc));
    CK(cudaFree(ds));
}

/* The legacy default stream (NULL) works too, and a second call on the same
 * buffers gives the same bytes (no state carried between calls). */
static void test_default_stream(env *e) {
    enum { N = 33, K = 96 };
    float *w = malloc(sizeof(float) * N * K);
    g_rng = 11;
    for (int i = 0; i < N * K; i++) w[i] = (float)gauss();
    float *dw;
    uint8_t *dc, *ds, c1[N * K / 2], s1[N * K / 32], c2[N * K / 2], s2[N * K / 32];
    CK(cudaMalloc((void **)&dw, sizeof(float) * N * K));
    CK(cudaMalloc((void **)&dc, N * K / 2));
    CK(cudaMalloc((void **)&ds, N * K / 32));
    CK(cudaMemcpy(dw, w, sizeof(float) * N * K, cudaMemcpyHostToDevice));
    nb_weight_desc d;
    nb_weight_desc_init(&d, NB_FORMAT_MXFP4, N, K);
    d.scale_rule = NB_MX_SCALE_EVEN;
    nb_weight_desc d2 = d;
    nb_status st = nb_quantize(e->ctx, &d, NB_DTYPE_F32, dw, dc, ds, NULL);
    CK(cudaDeviceSynchronize());
    CK(cudaMemcpy(c1, dc, sizeof c1, cudaMemcpyDeviceToHost));
    CK(cudaMemcpy(s1, ds, sizeof s1, cudaMemcpyDeviceToHost));
    nb_status st2 = nb_quantize(e->ctx, &d2, NB_DTYPE_F32, dw, dc, ds, NULL);
    CK(cudaDeviceSynchronize());
    CK(cudaMemcpy(c2, dc, sizeof c2, cudaMemcpyDeviceToHost));
    CK(cudaMemcpy(s2, ds, sizeof s2, cudaMemcpyDeviceToHost));
    nb_weight_desc hd = d2;
    hd.tensor_scale = 1.0f;
    uint8_t hc[N * K / 2], hs[N * K / 32];
    nb_status hst = nb_quantize_host(e->ctx, &hd, NB_DTYPE_F32, w, hc, hs);
    CHECK(st == NB_OK && st2 == NB_OK && hst == NB_OK && !memcmp(c1, c2, sizeof c1) && !memcmp(s1, s2, sizeof s1) &&
              !memcmp(c1, hc, sizeof c1) && !memcmp(s1, hs, sizeof s1),
          "default stream, repeated call: same bytes as the host");
    free(w);
    CK(cudaFree(dw));
    CK(cudaFree(dc));
    CK(cudaFree(ds));
}

/* Host and device time on one Llama-sized tensor (information only). */
static void time_one(env *e, int64_t n, int64_t k) {
    nb_weight_desc d;
    nb_weight_desc_init(&d, NB_FORMAT_NVFP4, n, k);
    nb_weight_sizes sz;
    nb_weight_get_sizes(&d, &sz);
    uint16_t *h = malloc(sz.dense_elements * 2);
    g_rng = 3;
    for (size_t i = 0; i < sz.dense_elements; i++) h[i] = to_bf16((float)(0.02 * gauss()));
    void *dsrc;
    uint8_t *dc, *ds;
    CK(cudaMalloc(&dsrc, sz.dense_elements * 2));
    CK(cudaMalloc((void **)&dc, sz.codes_bytes));
    CK(cudaMalloc((void **)&ds, sz.scales_bytes));
    CK(cudaMemcpy(dsrc, h, sz.dense_elements * 2, cudaMemcpyHostToDevice));
    nb_weight_desc gd = d;
    nb_quantize(e->ctx, &gd, NB_DTYPE_BF16, dsrc, dc, ds, e->stream); /* warm-up */
    cudaEvent_t a, b;
    CK(cudaEventCreate(&a));
    CK(cudaEventCreate(&b));
    CK(cudaEventRecord(a, e->stream));
    const int reps = 5;
    for (int r = 0; r < reps; r++) {
        gd = d;
        nb_quantize(e->ctx, &gd, NB_DTYPE_BF16, dsrc, dc, ds, e->stream);
    }
    CK(cudaEventRecord(b, e->stream));
    CK(cudaEventSynchronize(b));
    float ms = 0;
    CK(cudaEventElapsedTime(&ms, a, b));
    printf("nb_quantize nvfp4 bf16 %lldx%lld: %.3f ms per call (%.0f GB/s of input, scan and read-back included)\n",
           (long long)n, (long long)k, ms / reps, (double)sz.dense_elements * 2 / (ms / reps * 1e6));
    CK(cudaEventDestroy(a));
    CK(cudaEventDestroy(b));
    free(h);
    CK(cudaFree(dsrc));
    CK(cudaFree(dc));
    CK(cudaFree(ds));
}

int main(int argc, char **argv) {
    int quick = 0, small = 0;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--quick")) quick = 1;
        else if (!strcmp(argv[i], "--small")) small = quick = 1;
        else {
            fprintf(stderr, "usage: test_gpu_quantize [--quick] [--small]\n");
            return 1;
        }
    }
    gt_need_device("test_gpu_quantize"); /* (stdout line-buffered from here) */
    env e = {0};
    if (nb_context_create(0, &e.ctx) != NB_OK) {
        fprintf(stderr, "nb_context_create: %s\n", nb_last_error());
        return 1;
    }
    nb_device_info info;
    nb_context_device_info(e.ctx, &info);
    printf("test_gpu_quantize on %s (sm_%d%d)%s\n", info.name, info.cc_major, info.cc_minor,
           small ? " small" : quick ? " quick" : "");
    CK(cudaStreamCreateWithFlags(&e.stream, cudaStreamNonBlocking));
    /* ragged shapes: every data set, three seeds for the random ones */
    static const int64_t ragged[][2] = {{1, 32}, {3, 96}, {17, 32 * 7}, {1000, 4096 + 96}, {129, 16 * 9}};
    const int nr = quick && !small ? 4 : 5;
    for (int s = 0; s < nr; s++) {
        if (small && ragged[s][0] > 129) continue;
        for (int kind = 0; kind < D_COUNT; kind++)
            for (uint64_t seed = 1; seed <= (kind == D_GAUSS || kind == D_HEAVY || kind == D_BITS ? 3u : 1u); seed++)
                sweep(&e, ragged[s][0], ragged[s][1], kind, seed);
    }
    /* Llama shapes */
    if (!small) {
        sweep(&e, 4096, 4096, D_GAUSS, 1);
        sweep(&e, 4096, 4096, D_HEAVY, 2);
    }
    if (!quick) {
        sweep(&e, 4096, 4096, D_BITS, 3);
        sweep(&e, 4096, 14336, D_GAUSS, 4);
        sweep(&e, 14336, 4096, D_TIES, 5);
    }
    test_errors(&e);
    test_default_stream(&e);
    if (!quick) time_one(&e, 14336, 4096);
    CK(cudaStreamDestroy(e.stream));
    nb_context_destroy(e.ctx);
    printf("%d passed, %d failed\n", g_pass, g_fail);
    return g_fail ? 1 : 0;
}
