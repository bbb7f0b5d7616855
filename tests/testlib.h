/* testlib.h - shared by the CPU tests: a CHECK macro with pass/fail
 * counters and reference codecs written independently of src/ (from
 * docs/formats.md), plus a deterministic RNG.  Define TESTLIB_SEED before
 * including to choose the RNG stream. */
#ifndef NB_TESTLIB_H
#define NB_TESTLIB_H

#include "nibble.h"

#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#ifndef TESTLIB_SEED
#define TESTLIB_SEED 0x9E3779B97F4A7C15ull
#endif

#include "check.h"

static uint64_t g_rng = TESTLIB_SEED;

/* formats.md section 1, written out; -0.0 is the real negative zero. */
static const double k_e2m1[16] = {0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0,
                                  -0.0, -0.5, -1.0, -1.5, -2.0, -3.0, -4.0, -6.0};

/* formats.md 2.1: E = 0 -> M * 2^-9, else (1 + M/8) * 2^(E-7); S.1111.111 NaN. */
static inline double ref_e4m3(uint8_t b) {
    int s = b >> 7, e = (b >> 3) & 15, m = b & 7;
    if (e == 15 && m == 7) return NAN;
    double mag = e == 0 ? ldexp((double)m, -9) : ldexp(1.0 + m / 8.0, e - 7);
    return s ? -mag : mag;
}

/* formats.md 3.1: 2^(b-127), 0xFF NaN. */
static inline double ref_e8m0(uint8_t b) { return b == 0xFF ? NAN : ldexp(1.0, (int)b - 127); }

/* Round |x| (finite, double) to a binary format with `mbits` stored mantissa
 * bits and minimum normal exponent `emin`, nearest-even, in double:
 * returns the rounded magnitude (may exceed the format's maximum). */
static inline double round_mag(double a, int mbits, int emin) {
    if (a == 0.0) return 0.0;
    int e;
    frexp(a, &e);         /* a = f * 2^e, f in [0.5, 1): binade exponent e-1 */
    int be = e - 1 < emin ? emin : e - 1;
    double q = ldexp(1.0, be - mbits);
    return nearbyint(a / q) * q; /* a/q exact; nearbyint is RNE in the default mode */
}

/* float -> IEEE half, RNE, overflow to Inf. */
static inline uint16_t ref_f16(float f) {
    if (isnan(f)) return 0x7E00;
    uint16_t sign = signbit(f) ? 0x8000 : 0;
    if (isinf(f)) return sign | 0x7C00;
    double r = round_mag(fabs((double)f), 10, -14);
    if (r >= 65536.0) return sign | 0x7C00;
    if (r < ldexp(1.0, -14)) return sign | (uint16_t)(r / ldexp(1.0, -24));
    int e;
    frexp(r, &e);
    int be = e - 1;
    uint16_t mant = (uint16_t)((ldexp(r, -be) - 1.0) * 1024.0);
    return sign | (uint16_t)((be + 15) << 10) | mant;
}

/* float -> bfloat16, RNE, overflow to Inf. */
static inline uint16_t ref_bf16(float f) {
    if (isnan(f)) return 0x7FC0;
    uint16_t sign = signbit(f) ? 0x8000 : 0;
    if (isinf(f)) return sign | 0x7F80;
    double r = round_mag(fabs((double)f), 7, -126);
    if (r >= ldexp(1.0, 128)) return sign | 0x7F80;
    if (r < ldexp(1.0, -126)) return sign | (uint16_t)(r / ldexp(1.0, -133));
    int e;
    frexp(r, &e);
    int be = e - 1;
    uint16_t mant = (uint16_t)((ldexp(r, -be) - 1.0) * 128.0);
    return sign | (uint16_t)((be + 127) << 7) | mant;
}

/* IEEE half and bfloat16 bit patterns -> float, from their bit fields. */
static inline float ref_f16_to_f32(uint16_t h) {
    int s = h >> 15, e = (h >> 10) & 31, m = h & 1023;
    double v;
    if (e == 31) v = m ? NAN : INFINITY;
    else if (e == 0) v = ldexp((double)m, -24);
    else v = ldexp(1024.0 + m, e - 25);
    return (float)(s ? -v : v);
}

static inline float ref_bf16_to_f32(uint16_t h) {
    int s = h >> 15, e = (h >> 7) & 255, m = h & 127;
    double v;
    if (e == 255) v = m ? NAN : INFINITY;
    else if (e == 0) v = ldexp((double)m, -133);
    else v = ldexp(128.0 + m, e - 134);
    return (float)(s ? -v : v);
}

static inline uint64_t rnd_u64(void) {
    uint64_t z = (g_rng += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

static inline double rnd_unit(void) { return (double)(rnd_u64() >> 11) * 0x1p-53; } /* [0, 1) */

/* Half an ulp of type t at magnitude a (a >= 0), subnormals included: the
 * error of one rounding to t, for the GEMM bounds. */
static inline double half_ulp(nb_dtype t, double a) {
    int mbits = t == NB_DTYPE_F32 ? 23 : t == NB_DTYPE_F16 ? 10 : 7;
    int emin = t == NB_DTYPE_F16 ? -14 : -126;
    int e = emin;
    if (a > 0.0) {
        frexp(a, &e);
        e = e - 1 < emin ? emin : e - 1;
    }
    return ldexp(1.0, e - mbits - 1);
}

/* Store float values in a buffer of dtype t (independent encoders). */
static inline void store_as(nb_dtype t, void *p, size_t i, float v) {
    if (t == NB_DTYPE_F32) ((float *)p)[i] = v;
    else if (t == NB_DTYPE_F16) ((uint16_t *)p)[i] = ref_f16(v);
    else ((uint16_t *)p)[i] = ref_bf16(v);
}

static inline int nib(const uint8_t *codes, size_t idx) { return (codes[idx / 2] >> ((idx & 1) * 4)) & 15; }

#endif
