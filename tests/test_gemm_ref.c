/* test_gemm_ref.c - the host reference GEMMs and nb_pack_host.
 *
 *   1. nb_gemm_host_f64 against a double GEMM computed here straight from the
 *      checkpoint bytes (nibbles and scale bytes decoded by this file):
 *      relative error <= 1e-12 of sum |x_j w_j|.
 *   2. nb_gemm_host (float accumulation) against nb_gemm_host_f64 over
 *      m = 1..17, 31, 32, 33, 64, ragged n, k = odd and even multiples of the
 *      group, both formats, F32/F16/BF16 activations and outputs, bias or
 *      not, lda/ldc larger than k/n.  Bound per element:
 *        |y - ref| <= 2 k 2^-24 S + ulp_out(|ref| + 2 k 2^-24 S) / 2 + 1e-30,
 *      S = sum_j |x_j w_j| + |bias|: twice the classic bound for a k-term
 *      float dot product, plus the final rounding to the output type.  Gaps
 *      between rows of X hold NaN (reading them poisons the result) and gaps
 *      in Y must stay untouched.  No NaN/Inf may appear for finite inputs;
 *      a NaN scale byte makes exactly the outputs of its weight row NaN.
 *   3. nb_pack_host against an unpacker written from the layout comment at the
 *      top of src/cuda/gemv_fp4.cu: unpack(pack(codes, scales)) == (codes,
 *      scales) bit for bit, every padding nibble and padding scale byte zero,
 *      nothing written past packed_bytes, desc->layout PACKED and the MXFP4
 *      scale exponent range; the library's inverse, nb_unpack_host, returns
 *      the packed bytes exactly, and refuses what it should.
 *
 * Output: one line per failed check (worst index and both values), then
 * "N passed, M failed".  Exit status 0 only when nothing failed. */
#include <nibble.h>

#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define TESTLIB_SEED 0x243F6A8885A308D3ull
#include "testlib.h"

/* -------------------------------------------- independent reference codecs */

static double ref_f16_to_d(uint16_t h) {
    int s = h >> 15, e = (h >> 10) & 31, m = h & 1023;
    double v = e == 31 ? (m ? NAN : INFINITY) : e == 0 ? ldexp((double)m, -24) : ldexp(1024.0 + m, e - 25);
    return s ? -v : v;
}

static double ref_bf16_to_d(uint16_t h) {
    int s = h >> 15, e = (h >> 7) & 255, m = h & 127;
    double v = e == 255 ? (m ? NAN : INFINITY) : e == 0 ? ldexp((double)m, -133) : ldexp(128.0 + m, e - 134);
    return s ? -v : v;
}

static size_t dsize(nb_dtype t) { return t == NB_DTYPE_F32 ? 4 : 2; }
static const char *dname(nb_dtype t) {
    return t == NB_DTYPE_F32 ? "f32" : t == NB_DTYPE_F16 ? "f16" : t == NB_DTYPE_BF16 ? "bf16" : "?";
}
static const char *fname(nb_format f) { return f == NB_FORMAT_NVFP4 ? "nvfp4" : "mxfp4"; }

static double load_as(nb_dtype t, const void *p, size_t i) {
    if (t == NB_DTYPE_F32) return (double)((const float *)p)[i];
    if (t == NB_DTYPE_F16) return ref_f16_to_d(((const uint16_t *)p)[i]);
    return ref_bf16_to_d(((const uint16_t *)p)[i]);
}


/* --------------------------------------------------------------- RNG */

static float rnd_sym(double r) { return (float)((2.0 * rnd_unit() - 1.0) * r); }

/* ------------------------------------------------------------ GEMM cases */

typedef struct gcase {
    int64_t m, n, k;
    nb_format fmt;
    nb_dtype act, out;
    int bias;
    int64_t lda_pad, ldc_pad; /* lda = k + pad when pad > 0, else 0 (= k) */
    float ts;                 /* NVFP4 tensor scale (MXFP4 keeps 1.0) */
    int wide;                 /* MXFP4 scale bytes over a wide range (f64 check only) */
    int nan_row, nan_blk;     /* >= 0: put a NaN scale byte there */
    uint8_t nan_byte;
} gcase;

typedef struct problem {
    nb_weight_desc d;
    nb_gemm_desc g;
    int64_t lda, ldc;
    uint8_t *codes, *scales;
    void *x, *bias, *y;
    double *yd;
    float *w; /* dequantized weights, decoded here: [n, k] */
} problem;

/* The weight value at (r, j) by the header's rule: e2m1 * scale (exact, in
 * float) times the tensor scale, one rounding to float. */
static float ref_weight(const problem *p, int64_t r, int64_t j) {
    const int64_t k = p->d.k, g = p->d.group_size;
    int code = nib(p->codes, (size_t)(r * k + j));
    uint8_t sb = p->scales[r * (k / g) + j / g];
    double s = p->d.format == NB_FORMAT_NVFP4 ? ref_e4m3(sb) : ref_e8m0(sb);
    float prod = (float)(k_e2m1[code] * s);
    return (float)((double)prod * (double)p->d.tensor_scale);
}

static int make_problem(nb_context *ctx, const gcase *c, problem *p) {
    memset(p, 0, sizeof *p);
    if (nb_weight_desc_init(&p->d, c->fmt, c->n, c->k) != NB_OK) return 0;
    if (c->fmt == NB_FORMAT_NVFP4) p->d.tensor_scale = c->ts;
    nb_weight_sizes sz;
    nb_weight_get_sizes(&p->d, &sz);
    const int64_t m = c->m, n = c->n, k = c->k, ng = k / p->d.group_size;
    p->lda = c->lda_pad > 0 ? k + c->lda_pad : k;
    p->ldc = c->ldc_pad > 0 ? n + c->ldc_pad : n;
    p->codes = malloc(sz.codes_bytes);
    p->scales = malloc(sz.scales_bytes);
    for (size_t i = 0; i < sz.codes_bytes; i++) p->codes[i] = (uint8_t)rnd_u64();
    for (int64_t i = 0; i < n * ng; i++) {
        uint8_t b;
        if (c->fmt == NB_FORMAT_NVFP4) /* |s| < 2 (exponent field <= 7), zero and subnormals included */
            b = (uint8_t)((rnd_u64() % 64) | ((rnd_u64() & 1) << 7));
        else if (c->wide)
            b = (uint8_t)(60 + rnd_u64() % 140);
        else /* 2^-9 .. 2 */
            b = (uint8_t)(118 + rnd_u64() % 11);
        p->scales[i] = b;
    }
    if (c->nan_row >= 0) p->scales[c->nan_row * ng + c->nan_blk] = c->nan_byte;

    p->x = malloc((size_t)(m * p->lda) * dsize(c->act));
    for (int64_t i = 0; i < m; i++)
        for (int64_t j = 0; j < p->lda; j++)
            store_as(c->act, p->x, (size_t)(i * p->lda + j), j < k ? rnd_sym(1.0) : NAN);
    if (c->bias) {
        p->bias = malloc((size_t)n * dsize(c->out));
        for (int64_t r = 0; r < n; r++) store_as(c->out, p->bias, (size_t)r, rnd_sym(4.0));
    }
    p->y = malloc((size_t)(m * p->ldc) * dsize(c->out));
    memset(p->y, 0xA5, (size_t)(m * p->ldc) * dsize(c->out));
    p->yd = malloc((size_t)(m * p->ldc) * sizeof(double));
    memset(p->yd, 0xA5, (size_t)(m * p->ldc) * sizeof(double));
    p->w = malloc((size_t)(n * k) * sizeof(float));
    for (int64_t r = 0; r < n; r++)
        for (int64_t j = 0; j < k; j++) p->w[r * k + j] = ref_weight(p, r, j);

    nb_status st = nb_gemm_desc_init(&p->g, &p->d, m, c->act, c->out);
    if (st != NB_OK) {
        printf("nb_gemm_desc_init: %s\n", nb_last_error());
        return 0;
    }
    p->g.lda = c->lda_pad > 0 ? p->lda : 0;
    p->g.ldc = c->ldc_pad > 0 ? p->ldc : 0;
    (void)ctx;
    return 1;
}

static void free_problem(problem *p) {
    free(p->codes), free(p->scales), free(p->x), free(p->bias), free(p->y), free(p->yd), free(p->w);
}

static void describe(const gcase *c, char *buf, size_t len) {
    snprintf(buf, len, "%s m=%lld n=%lld k=%lld act=%s out=%s bias=%d lda+%lld ldc+%lld ts=%g", fname(c->fmt),
             (long long)c->m, (long long)c->n, (long long)c->k, dname(c->act), dname(c->out), c->bias,
             (long long)c->lda_pad, (long long)c->ldc_pad, (double)c->ts);
}

/* x_ij (decoded) */
static double xval(const problem *p, nb_dtype act, int64_t i, int64_t j) {
    return load_as(act, p->x, (size_t)(i * p->lda + j));
}

/* Gaps between rows of Y must be untouched (0xA5 fill). */
static int gaps_untouched(const problem *p, size_t es, const void *y) {
    const uint8_t *b = (const uint8_t *)y;
    for (int64_t i = 0; i < p->g.m; i++)
        for (int64_t r = p->d.n; r < p->ldc; r++)
            for (size_t q = 0; q < es; q++)
                if (b[(size_t)(i * p->ldc + r) * es + q] != 0xA5) return 0;
    return 1;
}

/* Part 1: nb_gemm_host_f64 against a double GEMM over the decoded bytes. */
static void run_f64_case(nb_context *ctx, const gcase *c) {
    problem p;
    char what[256];
    describe(c, what, sizeof what);
    if (!make_problem(ctx, c, &p)) {
        CHECK(0, "setup failed: %s", what);
        free_problem(&p);
        return;
    }
    nb_status st = nb_gemm_host_f64(ctx, &p.g, p.x, p.codes, p.scales, p.bias, p.yd);
    CHECK(st == NB_OK, "nb_gemm_host_f64 %s: %s", what, nb_last_error());
    if (st == NB_OK) {
        double worst = 0.0, wy = 0, wr = 0;
        int64_t wi = -1, wn = -1;
        for (int64_t i = 0; i < c->m; i++)
            for (int64_t r = 0; r < c->n; r++) {
                double acc = 0.0, mag = 0.0;
                for (int64_t j = 0; j < c->k; j++) {
                    double t = xval(&p, c->act, i, j) * (double)p.w[r * c->k + j];
                    acc += t;
                    mag += fabs(t);
                }
                double b = p.bias ? load_as(c->out, p.bias, (size_t)r) : 0.0;
                acc += b;
                mag += fabs(b);
                double y = p.yd[i * p.ldc + r];
                double ratio = fabs(y - acc) / (1e-12 * mag + 1e-300);
                if (!(ratio <= worst)) worst = ratio, wi = i, wn = r, wy = y, wr = acc;
            }
        CHECK(worst <= 1.0, "f64 vs independent %s: worst [%lld, %lld] got %.17g want %.17g (err/bound %.3g)", what,
              (long long)wi, (long long)wn, wy, wr, worst);
        CHECK(gaps_untouched(&p, sizeof(double), p.yd), "nb_gemm_host_f64 %s wrote between rows of y", what);
    }
    free_problem(&p);
}

/* Part 2: nb_gemm_host against nb_gemm_host_f64 with the stated bound. */
static void run_float_case(nb_context *ctx, const gcase *c) {
    problem p;
    char what[256];
    describe(c, what, sizeof what);
    if (!make_problem(ctx, c, &p)) {
        CHECK(0, "setup failed: %s", what);
        free_problem(&p);
        return;
    }
    nb_status st1 = nb_gemm_host_f64(ctx, &p.g, p.x, p.codes, p.scales, p.bias, p.yd);
    nb_status st2 = nb_gemm_host(ctx, &p.g, p.x, p.codes, p.scales, p.bias, p.y);
    CHECK(st1 == NB_OK && st2 == NB_OK, "gemm %s: %s", what, nb_last_error());
    if (st1 == NB_OK && st2 == NB_OK) {
        const double u = 0x1p-24;
        double worst = 0.0, wy = 0, wr = 0, wb = 0;
        int64_t wi = -1, wn = -1, nonfinite = 0, nf_i = -1, nf_r = -1;
        for (int64_t i = 0; i < c->m; i++)
            for (int64_t r = 0; r < c->n; r++) {
                double mag = 0.0;
                for (int64_t j = 0; j < c->k; j++) mag += fabs(xval(&p, c->act, i, j) * (double)p.w[r * c->k + j]);
                if (p.bias) mag += fabs(load_as(c->out, p.bias, (size_t)r));
                double ref = p.yd[i * p.ldc + r];
                double y = load_as(c->out, p.y, (size_t)(i * p.ldc + r));
                if (!isfinite(y) || !isfinite(ref)) {
                    if (!nonfinite++) nf_i = i, nf_r = r;
                    continue;
                }
                double acc_err = 2.0 * (double)c->k * u * mag;
                double bound = acc_err + half_ulp(c->out, fabs(ref) + acc_err) + 1e-30;
                double ratio = fabs(y - ref) / bound;
                if (ratio > worst) worst = ratio, wi = i, wn = r, wy = y, wr = ref, wb = bound;
            }
        CHECK(nonfinite == 0, "gemm %s: %lld non-finite outputs for finite inputs, first [%lld, %lld]", what,
              (long long)nonfinite, (long long)nf_i, (long long)nf_r);
        CHECK(worst <= 1.0, "gemm float vs f64 %s: worst [%lld, %lld] got %.9g ref %.17g |err| %.3g > bound %.3g",
              what, (long long)wi, (long long)wn, wy, wr, fabs(wy - wr), wb);
        CHECK(gaps_untouched(&p, dsize(c->out), p.y) && gaps_untouched(&p, sizeof(double), p.yd),
              "gemm %s wrote between rows of y", what);
    }
    free_problem(&p);
}

/* Part 2b: one NaN scale byte -> exactly the outputs of that weight row NaN,
 * in both GEMMs. */
static void run_nan_case(nb_context *ctx, const gcase *c) {
    problem p;
    char what[256];
    describe(c, what, sizeof what);
    if (!make_problem(ctx, c, &p)) {
        CHECK(0, "setup failed: %s", what);
        free_problem(&p);
        return;
    }
    nb_status st1 = nb_gemm_host_f64(ctx, &p.g, p.x, p.codes, p.scales, p.bias, p.yd);
    nb_status st2 = nb_gemm_host(ctx, &p.g, p.x, p.codes, p.scales, p.bias, p.y);
    CHECK(st1 == NB_OK && st2 == NB_OK, "gemm %s: %s", what, nb_last_error());
    int64_t bad = 0, bi = -1, br = -1;
    for (int64_t i = 0; i < c->m; i++)
        for (int64_t r = 0; r < c->n; r++) {
            int want_nan = r == c->nan_row;
            double y = load_as(c->out, p.y, (size_t)(i * p.ldc + r)), yd = p.yd[i * p.ldc + r];
            int ok = want_nan ? (isnan(y) && isnan(yd)) : (isfinite(y) && isfinite(yd));
            if (!ok && !bad++) bi = i, br = r;
        }
    CHECK(bad == 0, "NaN scale 0x%02X at row %d block %d, %s: %lld wrong outputs, first [%lld, %lld] = %g / %g",
          c->nan_byte, c->nan_row, c->nan_blk, what, (long long)bad, (long long)bi, (long long)br,
          bi < 0 ? 0.0 : load_as(c->out, p.y, (size_t)(bi * p.ldc + br)), bi < 0 ? 0.0 : p.yd[bi * p.ldc + br]);
    free_problem(&p);
}

static gcase mk(int64_t m, int64_t n, int64_t k, nb_format f, nb_dtype act, nb_dtype out, int bias, int64_t lp,
                int64_t cp, float ts) {
    gcase c = {m, n, k, f, act, out, bias, lp, cp, ts, 0, -1, 0, 0};
    return c;
}

static void test_gemm(nb_context *ctx) {
    static const nb_dtype dts[3] = {NB_DTYPE_F32, NB_DTYPE_F16, NB_DTYPE_BF16};

    /* 1. f64 vs the independent double GEMM */
    {
        gcase cs[] = {
            mk(3, 17, 144, NB_FORMAT_NVFP4, NB_DTYPE_F32, NB_DTYPE_F32, 1, 5, 3, 0.37f),
            mk(5, 33, 16 * 37, NB_FORMAT_NVFP4, NB_DTYPE_BF16, NB_DTYPE_BF16, 1, 0, 0, 1.0f),
            mk(1, 16, 1024, NB_FORMAT_NVFP4, NB_DTYPE_F16, NB_DTYPE_F16, 0, 8, 1, -0.75f),
            mk(2, 9, 48, NB_FORMAT_NVFP4, NB_DTYPE_BF16, NB_DTYPE_F16, 1, 0, 7, 2.5f),
            mk(3, 17, 32 * 7, NB_FORMAT_MXFP4, NB_DTYPE_F32, NB_DTYPE_F32, 1, 3, 2, 1.0f),
            mk(4, 9, 1024, NB_FORMAT_MXFP4, NB_DTYPE_BF16, NB_DTYPE_F16, 1, 0, 0, 1.0f),
            mk(2, 31, 96, NB_FORMAT_MXFP4, NB_DTYPE_F16, NB_DTYPE_BF16, 0, 1, 0, 1.0f),
            mk(6, 20, 320, NB_FORMAT_MXFP4, NB_DTYPE_F32, NB_DTYPE_F32, 1, 0, 0, 1.0f),
        };
        cs[7].wide = 1; /* scale bytes 60..199: 2^-67 .. 2^72 */
        for (size_t i = 0; i < sizeof cs / sizeof cs[0]; i++) run_f64_case(ctx, &cs[i]);
    }

    /* 2. float vs f64: m = 1..17, 31, 32, 33, 64, each for both formats and
     * every act/out pair; n, k, bias, strides and tensor scale cycle through
     * their lists (the cycle lengths are coprime, so the pairings vary) */
    {
        static const int64_t ms[] = {1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 17, 31, 32, 33, 64};
        static const int64_t ns[] = {1, 15, 17, 100, 257, 16, 33};
        static const int64_t kn[] = {16, 16 * 37, 32, 1024, 48, 144, 128, 16 * 7};   /* NVFP4 */
        static const int64_t kx[] = {32, 32 * 7, 64, 1024, 96, 160, 128, 32 * 37};    /* MXFP4 */
        static const float tss[] = {1.0f, 0.37f, -0.75f, 2.5f};
        int ci = 0;
        for (size_t mi = 0; mi < sizeof ms / sizeof ms[0]; mi++)
            for (int f = 0; f < 2; f++)
                for (int combo = 0; combo < 9; combo++, ci++) {
                    gcase c = mk(ms[mi], ns[ci % 7], f ? kx[ci % 8] : kn[ci % 8], f ? NB_FORMAT_MXFP4 : NB_FORMAT_NVFP4,
                                 dts[combo / 3], dts[combo % 3], ci % 3 != 0, ci % 4 == 0 ? 0 : 1 + ci % 9,
                                 ci % 5 == 1 ? 0 : 1 + ci % 6, tss[ci % 4]);
                    run_float_case(ctx, &c);
                }
        /* every act/out pair for both formats, with and without bias */
        for (int f = 0; f < 2; f++)
            for (int a = 0; a < 3; a++)
                for (int o = 0; o < 3; o++)
                    for (int b = 0; b < 2; b++) {
                        gcase c = mk(3 + b, 17, f ? 32 * 7 : 16 * 37, f ? NB_FORMAT_MXFP4 : NB_FORMAT_NVFP4, dts[a],
                                     dts[o], b, 3 * b, 2 * b, b ? 0.37f : 1.0f);
                        run_float_case(ctx, &c);
                    }
        /* every n and every k of each list at m = 4 */
        for (int f = 0; f < 2; f++) {
            for (size_t i = 0; i < sizeof ns / sizeof ns[0]; i++) {
                gcase c = mk(4, ns[i], f ? 96 : 80, f ? NB_FORMAT_MXFP4 : NB_FORMAT_NVFP4, NB_DTYPE_BF16,
                             NB_DTYPE_BF16, 1, 0, 0, 1.0f);
                run_float_case(ctx, &c);
            }
            for (size_t i = 0; i < 8; i++) {
                gcase c = mk(4, 15, f ? kx[i] : kn[i], f ? NB_FORMAT_MXFP4 : NB_FORMAT_NVFP4, NB_DTYPE_F16,
                             NB_DTYPE_F32, 0, 2, 0, 0.37f);
                run_float_case(ctx, &c);
            }
        }
    }

    /* 2b. NaN scale bytes */
    {
        gcase cs[4] = {
            mk(5, 19, 64, NB_FORMAT_NVFP4, NB_DTYPE_BF16, NB_DTYPE_BF16, 1, 0, 0, 0.37f),
            mk(3, 19, 64, NB_FORMAT_NVFP4, NB_DTYPE_F32, NB_DTYPE_F32, 0, 2, 3, 1.0f),
            mk(5, 19, 96, NB_FORMAT_MXFP4, NB_DTYPE_F16, NB_DTYPE_F16, 1, 0, 0, 1.0f),
            mk(2, 19, 96, NB_FORMAT_MXFP4, NB_DTYPE_F32, NB_DTYPE_BF16, 0, 0, 1, 1.0f),
        };
        static const uint8_t bytes[4] = {0x7F, 0xFF, 0xFF, 0xFF};
        for (int i = 0; i < 4; i++) {
            cs[i].nan_row = 7 + i;
            cs[i].nan_blk = 1 + (i & 1);
            cs[i].nan_byte = bytes[i];
            run_nan_case(ctx, &cs[i]);
        }
    }
}

/* ------------------------------------------------------------------ pack */

/* The packed layout, from the comment at the top of src/cuda/gemv_fp4.cu:
 *   chunks of 16 rows x 128 k, chunk (rb, kc) at (rb * kchunks + kc) * CB,
 *   CB = 1024 + 32 SB, SB = 4 (NVFP4) or 2 (MXFP4).  Lane L = 4g + t:
 *   bytes [16L, 16L+16) row 16rb+g, [512+16L, +16) row 16rb+g+8, k = 128kc +
 *   32t .. +31; four little-endian words, word w = elements 32t+8w .. +7,
 *   element e in half e % 2 (bits 16 (e % 2) ..) of the word, there with
 *   its bits e1 e0 m at [6, 3, 0, 9][e / 2] .. +2 and its sign at [15, 12,
 *   13, 14][e / 2] (docs/formats.md 8.2); scales at 1024 + SB L: NVFP4
 *   (row g: group 2t, 2t+1; row g+8: group 2t, 2t+1), MXFP4 (row g, row g+8:
 *   group t), groups counted in the chunk.  Padding: zero codes, scale 0.
 * Returns the number of layout violations; fills codes/scales and counts how
 * often each element / scale was seen (each must be seen exactly once). */
static int64_t unpack(nb_format fmt, int64_t n, int64_t k, const uint8_t *packed, uint8_t *codes, uint8_t *scales,
                      uint8_t *seen_c, uint8_t *seen_s, char *err, size_t errlen) {
    static const int mag_at[4] = {6, 3, 0, 9}, sign_at[4] = {15, 12, 13, 14};
    const int sb = fmt == NB_FORMAT_NVFP4 ? 4 : 2, g = fmt == NB_FORMAT_NVFP4 ? 16 : 32;
    const int64_t rbs = (n + 15) / 16, kcs = (k + 127) / 128, ng = k / g;
    const size_t cb = 1024 + 32 * (size_t)sb;
    int64_t bad = 0;
    for (int64_t rb = 0; rb < rbs; rb++)
        for (int64_t kc = 0; kc < kcs; kc++) {
            const uint8_t *ch = packed + (size_t)(rb * kcs + kc) * cb;
            for (int L = 0; L < 32; L++) {
                const int gi = L / 4, t = L % 4;
                for (int half = 0; half < 2; half++) {
                    const int64_t row = rb * 16 + gi + 8 * half;
                    const uint8_t *src = ch + 512 * half + 16 * L;
                    for (int w = 0; w < 4; w++) {
                        uint32_t word = (uint32_t)src[4 * w] | (uint32_t)src[4 * w + 1] << 8 |
                                        (uint32_t)src[4 * w + 2] << 16 | (uint32_t)src[4 * w + 3] << 24;
                        for (int e = 0; e < 8; e++) {
                            const int base = 16 * (e % 2);
                            int c = (int)((word >> (base + mag_at[e / 2])) & 7) |
                                    (int)((word >> (base + sign_at[e / 2])) & 1) << 3;
                            int64_t col = kc * 128 + 32 * t + 8 * w + e;
                            if (row < n && col < k) {
                                int64_t idx = row * k + col;
                                codes[idx / 2] = (uint8_t)(codes[idx / 2] | c << ((idx & 1) * 4));
                                seen_c[idx]++;
                            } else if (c != 0) {
                                if (!bad++)
                                    snprintf(err, errlen, "padding code nonzero: chunk (%lld,%lld) lane %d row %lld "
                                             "col %lld = 0x%X", (long long)rb, (long long)kc, L, (long long)row,
                                             (long long)col, c);
                            }
                        }
                    }
                }
                const uint8_t *ss = ch + 1024 + (size_t)sb * L;
                for (int q = 0; q < sb; q++) {
                    /* NVFP4 q: 0 (g, 2t) 1 (g, 2t+1) 2 (g+8, 2t) 3 (g+8, 2t+1); MXFP4 q: 0 (g, t) 1 (g+8, t) */
                    int half = sb == 4 ? q / 2 : q;
                    int64_t grp = sb == 4 ? kc * 8 + 2 * t + (q & 1) : kc * 4 + t;
                    int64_t row = rb * 16 + gi + 8 * half;
                    if (row < n && grp < ng) {
                        scales[row * ng + grp] = ss[q];
                        seen_s[row * ng + grp]++;
                    } else if (ss[q] != 0) {
                        if (!bad++)
                            snprintf(err, errlen, "padding scale nonzero: chunk (%lld,%lld) lane %d byte %d = 0x%02X",
                                     (long long)rb, (long long)kc, L, q, ss[q]);
                    }
                }
            }
        }
    return bad;
}

static void run_pack_case(nb_context *ctx, nb_format fmt, int64_t n, int64_t k, int scale_mode) {
    nb_weight_desc d;
    char what[128];
    snprintf(what, sizeof what, "%s n=%lld k=%lld scales=%d", fname(fmt), (long long)n, (long long)k, scale_mode);
    nb_status st = nb_weight_desc_init(&d, fmt, n, k);
    CHECK(st == NB_OK, "pack desc %s: %s", what, nb_last_error());
    if (st) return;
    nb_weight_sizes sz;
    nb_weight_get_sizes(&d, &sz);
    const int sb = fmt == NB_FORMAT_NVFP4 ? 4 : 2;
    const size_t want_bytes = (size_t)((n + 15) / 16) * (size_t)((k + 127) / 128) * (1024 + 32 * (size_t)sb);
    CHECK(sz.packed_bytes == want_bytes, "packed_bytes %s = %zu, want %zu", what, sz.packed_bytes, want_bytes);
    CHECK(sz.codes_bytes == (size_t)(n * k / 2) && sz.scales_bytes == (size_t)(n * k / d.group_size) &&
              sz.dense_elements == (size_t)(n * k),
          "sizes %s: codes %zu scales %zu dense %zu", what, sz.codes_bytes, sz.scales_bytes, sz.dense_elements);

    uint8_t *codes = malloc(sz.codes_bytes), *scales = malloc(sz.scales_bytes);
    for (size_t i = 0; i < sz.codes_bytes; i++) codes[i] = (uint8_t)rnd_u64();
    int lo = 256, hi = -1;
    for (size_t i = 0; i < sz.scales_bytes; i++) {
        uint8_t b;
        if (scale_mode == 1) b = 0xFF;                        /* every scale NaN */
        else b = (uint8_t)rnd_u64();
        if (scale_mode == 2) b = (uint8_t)(100 + b % 40);     /* narrow range */
        if (scale_mode == 0 && i == 0) b = 0xFF;
        if (scale_mode == 0 && i == 1) b = 0x00;
        scales[i] = b;
        if (b != 0xFF) {
            if (b < lo) lo = b;
            if (b > hi) hi = b;
        }
    }
    const size_t guard = 64;
    uint8_t *packed = malloc(sz.packed_bytes + guard);
    memset(packed, 0xA5, sz.packed_bytes + guard);
    d.scale_exp_min = d.scale_exp_max = -7;
    st = nb_pack_host(ctx, &d, codes, scales, packed, sz.packed_bytes + guard);
    CHECK(st == NB_OK, "nb_pack_host %s: %s", what, nb_last_error());
    if (st == NB_OK) {
        CHECK(d.layout == NB_LAYOUT_PACKED, "pack %s: layout %d, want PACKED", what, (int)d.layout);
        if (fmt == NB_FORMAT_MXFP4) {
            int wmin = hi < 0 ? -1 : lo, wmax = hi;
            CHECK(d.scale_exp_min == wmin && d.scale_exp_max == wmax, "pack %s: scale_exp [%d, %d], want [%d, %d]",
                  what, d.scale_exp_min, d.scale_exp_max, wmin, wmax);
        }
        int guard_ok = 1;
        for (size_t i = 0; i < guard; i++) guard_ok &= packed[sz.packed_bytes + i] == 0xA5;
        CHECK(guard_ok, "pack %s wrote past packed_bytes", what);

        uint8_t *c2 = calloc(sz.codes_bytes, 1), *s2 = calloc(sz.scales_bytes, 1);
        uint8_t *seen_c = calloc((size_t)(n * k), 1), *seen_s = calloc(sz.scales_bytes, 1);
        char err[256] = "";
        int64_t bad = unpack(fmt, n, k, packed, c2, s2, seen_c, seen_s, err, sizeof err);
        CHECK(bad == 0, "pack %s: %lld padding violations; first: %s", what, (long long)bad, err);
        int64_t miss = -1;
        for (int64_t i = 0; i < n * k && miss < 0; i++)
            if (seen_c[i] != 1) miss = i;
        for (size_t i = 0; i < sz.scales_bytes && miss < 0; i++)
            if (seen_s[i] != 1) miss = (int64_t)(n * k + (int64_t)i);
        CHECK(miss < 0, "pack %s: element/scale %lld not seen exactly once", what, (long long)miss);
        int64_t dc = -1, ds = -1;
        for (int64_t i = 0; i < n * k && dc < 0; i++)
            if (nib(c2, (size_t)i) != nib(codes, (size_t)i)) dc = i;
        for (size_t i = 0; i < sz.scales_bytes && ds < 0; i++)
            if (s2[i] != scales[i]) ds = (int64_t)i;
        CHECK(dc < 0, "pack %s: code [%lld, %lld] unpacks to 0x%X, want 0x%X", what, (long long)(dc / k),
              (long long)(dc % k), dc < 0 ? 0 : nib(c2, (size_t)dc), dc < 0 ? 0 : nib(codes, (size_t)dc));
        CHECK(ds < 0, "pack %s: scale %lld unpacks to 0x%02X, want 0x%02X", what, (long long)ds,
              ds < 0 ? 0 : s2[ds], ds < 0 ? 0 : scales[ds]);
        free(c2), free(s2), free(seen_c), free(seen_s);

        /* nb_unpack_host gives back exactly the bytes that were packed */
        nb_weight_desc u = d;
        uint8_t *c3 = malloc(sz.codes_bytes), *s3 = malloc(sz.scales_bytes);
        memset(c3, 0x5A, sz.codes_bytes), memset(s3, 0x5A, sz.scales_bytes);
        st = nb_unpack_host(ctx, &u, packed, sz.packed_bytes, c3, s3);
        CHECK(st == NB_OK, "nb_unpack_host %s: %s", what, nb_last_error());
        CHECK(st != NB_OK || u.layout == NB_LAYOUT_CHECKPOINT, "unpack %s: layout %d, want CHECKPOINT", what,
              (int)u.layout);
        CHECK(st != NB_OK || (!memcmp(c3, codes, sz.codes_bytes) && !memcmp(s3, scales, sz.scales_bytes)),
              "unpack(pack(codes, scales)) %s differs from codes, scales", what);
        free(c3), free(s3);
    }
    free(codes), free(scales), free(packed);
}

/* nb_unpack_host's refusals: each returns its status and leaves the
 * descriptor as it was. */
static void test_unpack_errors(nb_context *ctx) {
    nb_weight_desc ok, d, before;
    nb_weight_desc_init(&ok, NB_FORMAT_MXFP4, 16, 128);
    uint8_t codes[16 * 64], scales[16 * 4], packed[1088];
    memset(codes, 0x11, sizeof codes), memset(scales, 127, sizeof scales);
    CHECK(nb_pack_host(ctx, &ok, codes, scales, packed, sizeof packed) == NB_OK, "unpack errors: pack: %s",
          nb_last_error());
#define U(want, c_, desc_, ...)                                                                   \
    do {                                                                                          \
        d = (desc_), before = d;                                                                  \
        nb_status st_ = nb_unpack_host(c_, &d, __VA_ARGS__);                                      \
        CHECK(st_ == (want), "nb_unpack_host: %s, want %s (%s)", nb_status_name(st_), nb_status_name(want), \
              nb_last_error());                                                                   \
        CHECK(!memcmp(&d, &before, sizeof d), "a failed nb_unpack_host modified the descriptor"); \
    } while (0)
    U(NB_ERR_NULL_POINTER, NULL, ok, packed, sizeof packed, codes, scales);
    U(NB_ERR_NULL_POINTER, ctx, ok, NULL, sizeof packed, codes, scales);
    U(NB_ERR_NULL_POINTER, ctx, ok, packed, sizeof packed, NULL, scales);
    U(NB_ERR_NULL_POINTER, ctx, ok, packed, sizeof packed, codes, NULL);
    U(NB_ERR_BUFFER_TOO_SMALL, ctx, ok, packed, sizeof packed - 1, codes, scales);
    nb_weight_desc bad = ok;
    bad.layout = NB_LAYOUT_CHECKPOINT;                   /* not packed */
    U(NB_ERR_INVALID_ARGUMENT, ctx, bad, packed, sizeof packed, codes, scales);
    nb_weight_desc_init(&bad, NB_FORMAT_INT4, 16, 128);  /* no packed layout */
    bad.layout = NB_LAYOUT_PACKED;
    U(NB_ERR_UNSUPPORTED, ctx, bad, packed, sizeof packed, codes, scales);
#undef U
}

/* A hand-checked known answer for the byte order: one 16 x 128 NVFP4 chunk
 * whose only nonzero code is element (row 9, col 32*2 + 8*1 + 3) = 0xB, and
 * one scale (row 9, group 5) = 0x42.  Row 9 = g 1 + 8: lane L = 4*1 + 2 = 6
 * (t = 2), half 1 -> bytes [512 + 96, +16); word 1; element 3 -> pair 1,
 * high half: e1 e0 m = 011 at bits 16 + 3 .. 16 + 5, the sign at bit 16 +
 * 12 -> word 1 = 0x10180000: byte 512 + 96 + 4 + 2 = 0x18, the byte after it
 * 0x10.  Group 5 = 2t + 1 of row g+8 -> scale byte 1024 + 4*6 + 3. */
static void test_pack_known(nb_context *ctx) {
    nb_weight_desc d;
    nb_weight_desc_init(&d, NB_FORMAT_NVFP4, 16, 128);
    uint8_t codes[16 * 64] = {0}, scales[16 * 8] = {0};
    int64_t idx = 9 * 128 + 32 * 2 + 8 * 1 + 3;
    codes[idx / 2] = (uint8_t)(0xB << ((idx & 1) * 4));
    scales[9 * 8 + 5] = 0x42;
    uint8_t packed[1024 + 128];
    CHECK(nb_pack_host(ctx, &d, codes, scales, packed, sizeof packed) == NB_OK, "pack known: %s", nb_last_error());
    int others = 0;
    for (size_t i = 0; i < sizeof packed; i++)
        if (i != 512 + 96 + 6 && i != 512 + 96 + 7 && i != 1024 + 24 + 3) others += packed[i] != 0;
    CHECK(packed[512 + 96 + 6] == 0x18 && packed[512 + 96 + 7] == 0x10 && packed[1024 + 24 + 3] == 0x42 &&
              others == 0,
          "pack known answer: bytes 614, 615 = 0x%02X 0x%02X (want 0x18 0x10), byte 1051 = 0x%02X (want 0x42), "
          "%d other nonzero",
          packed[614], packed[615], packed[1051], others);
}

static void test_pack(nb_context *ctx) {
    static const int64_t ns[] = {1, 15, 16, 17, 33, 100};
    static const int64_t kn[] = {16, 112, 128, 144, 16 * 37};
    static const int64_t kx[] = {32, 96, 128, 32 * 7, 352};
    for (size_t i = 0; i < sizeof ns / sizeof ns[0]; i++)
        for (size_t j = 0; j < 5; j++) {
            run_pack_case(ctx, NB_FORMAT_NVFP4, ns[i], kn[j], 0);
            run_pack_case(ctx, NB_FORMAT_MXFP4, ns[i], kx[j], (int)((i + j) % 3));
        }
    test_pack_known(ctx);
    test_unpack_errors(ctx);
}

int main(void) {
    setvbuf(stdout, NULL, _IONBF, 0); /* FAIL lines survive a crash */
    nb_context *ctx = NULL;
    if (nb_context_create(NB_DEVICE_NONE, &ctx) != NB_OK) {
        printf("cannot create a host context: %s\n", nb_last_error());
        return 1;
    }
    /* the helpers this file trusts */
    CHECK(ref_f16(65520.0f) == 0x7C00 && ref_f16(1.0f + 0x3p-11f) == 0x3C02 && ref_bf16(1.0f + 0x1p-8f) == 0x3F80 &&
              ref_f16_to_d(0x3C01) == 1.0 + 0x1p-10 && ref_bf16_to_d(0x0001) == 0x1p-133 &&
              half_ulp(NB_DTYPE_F16, 1.0) == 0x1p-11 && half_ulp(NB_DTYPE_BF16, 0.0) == 0x1p-134,
          "reference helper self-check");

    test_gemm(ctx);
    test_pack(ctx);
    nb_context_destroy(ctx);
    printf("%d passed, %d failed\n", g_pass, g_fail);
    return g_fail ? 1 : 0;
}
