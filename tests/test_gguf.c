/* test_gguf.c - the GGUF reader and FP4 import (src/io/gguf.c).
 *
 * GGUF images are built here byte by byte (header, key/values, tensor
 * infos, padding, data), so the test needs nothing but this file:
 *   - known answers: MXFP4 (type 39) and NVFP4 (type 40) blocks written from
 *     the formulas of docs/formats.md 2.5 / 3.6 (codes and scales chosen at
 *     random), imported into nibble's checkpoint layout and dequantized with
 *     nb_dequantize_host, compared bit for bit with values computed here;
 *     the NVFP4 tensor scale from the ".scale" tensor; experts of a 3-D
 *     tensor; the remapped UE4M3 bytes (0x7F, bit 7) and the refused 0xFF;
 *   - every rule of gguf.h broken once, each rejected with its status and a
 *     message naming the file;
 *   - GGUF -> safetensors (nb_ckpt_convert): NVFP4 files to ModelOpt and
 *     compressed-tensors, MXFP4 files to Quark and compressed-tensors (2-D and
 *     expert tensors, per-expert tensor scales, input scales, remapped UE4M3
 *     bytes); the output reopened with nb_ckpt_open, every layer detected and
 *     dequantized bit for bit like the GGUF tensor, copied tensors byte for
 *     byte with row-major shapes; refusals (other quantized types unless
 *     skipped, wrong target, both formats to compressed-tensors, no 4-bit
 *     tensor, inexact reciprocal with --strict, 0xFF scale) leave no OUT;
 *     `test_gguf --keep DIR` leaves DIR/nv.gguf and DIR/nv_q8.gguf (with a
 *     Q8_0 tensor) for the CLI tests;
 *   - with --crosscheck FILE.gguf EXPECTED.f32 (tests/gguf_crosscheck.py,
 *     run when the gguf Python package is installed): every FP4 tensor of a
 *     file written by that package dequantizes bit for bit like
 *     gguf.quants.dequantize.
 */
#define _POSIX_C_SOURCE 200809L
#include "nibble_io.h"
#include "testlib.h"

#include <stdlib.h>
#include <sys/stat.h>
#include <unistd.h>

/* Names of library enum values for messages ("?" for one without a name). */
static const char *fmt_name(nb_ckpt_format f) { const char *s; return nb_ckpt_format_name(f, &s) ? "?" : s; }
static const char *target_str(nb_ckpt_target t) { const char *s; return nb_ckpt_target_name(t, &s) ? "?" : s; }

/* ------------------------------------------------------------ image builder */

typedef struct gb {
    uint8_t *p;
    size_t n, cap;
} gb;

static void put(gb *b, const void *s, size_t n) {
    if (b->n + n > b->cap) {
        b->cap = (b->n + n) * 2 + 64;
        b->p = (uint8_t *)realloc(b->p, b->cap);
    }
    memcpy(b->p + b->n, s, n);
    b->n += n;
}
static void u32(gb *b, uint32_t v) {
    uint8_t x[4] = {(uint8_t)v, (uint8_t)(v >> 8), (uint8_t)(v >> 16), (uint8_t)(v >> 24)};
    put(b, x, 4);
}
static void u64(gb *b, uint64_t v) {
    u32(b, (uint32_t)v);
    u32(b, (uint32_t)(v >> 32));
}
static void str(gb *b, const char *s) {
    u64(b, strlen(s));
    put(b, s, strlen(s));
}
static void pad(gb *b, size_t al) {
    static const uint8_t z[64] = {0};
    while (b->n % al) put(b, z, 1);
}
static void header(gb *b, uint32_t version, uint64_t nt, uint64_t nkv) {
    put(b, "GGUF", 4);
    u32(b, version);
    u64(b, nt);
    u64(b, nkv);
}
static void kv_str(gb *b, const char *k, const char *v) {
    str(b, k);
    u32(b, NB_GGUF_STRING);
    str(b, v);
}
static void kv_u32(gb *b, const char *k, uint32_t v) {
    str(b, k);
    u32(b, NB_GGUF_UINT32);
    u32(b, v);
}
static void tinfo(gb *b, const char *name, int nd, const int64_t *ne, uint32_t type, uint64_t off) {
    str(b, name);
    u32(b, (uint32_t)nd);
    for (int d = 0; d < nd; d++) u64(b, (uint64_t)ne[d]);
    u32(b, type);
    u64(b, off);
}

typedef struct tspec {
    const char *name;
    int nd;
    int64_t ne[4];
    uint32_t type;
    const uint8_t *data;
    size_t bytes;
} tspec;

/* A valid file: the KVs of the fixture, then tensors laid out contiguously
 * with padding to `al` (general.alignment written when al != 32). */
static gb build(const tspec *t, size_t nt, uint32_t al) {
    gb b = {0};
    header(&b, 3, nt, al != 32 ? 4 : 3);
    kv_str(&b, "general.architecture", "llama");
    str(&b, "tokenizer.ggml.tokens");
    u32(&b, NB_GGUF_ARRAY);
    u32(&b, NB_GGUF_STRING);
    u64(&b, 2);
    str(&b, "a");
    str(&b, "bc");
    str(&b, "llama.rope.freq_base");
    u32(&b, NB_GGUF_FLOAT32);
    float fb = 10000.0f;
    put(&b, &fb, 4);
    if (al != 32) kv_u32(&b, "general.alignment", al);
    uint64_t off = 0;
    for (size_t i = 0; i < nt; i++) {
        tinfo(&b, t[i].name, t[i].nd, t[i].ne, t[i].type, off);
        off += (t[i].bytes + al - 1) / al * al;
    }
    pad(&b, al);
    for (size_t i = 0; i < nt; i++) {
        put(&b, t[i].data, t[i].bytes);
        pad(&b, al);
    }
    return b;
}

static nb_status open_img(const gb *b, nb_gguf_file **g) {
    return nb_gguf_open_memory(b->p, b->n, "img.gguf", g);
}

/* ------------------------------------------------------------ known answers */

enum { MX_N = 3, MX_K = 64, NV_N = 2, NV_K = 128, EX_E = 3, EX_N = 2, EX_K = 32 };

static uint8_t g_mx_codes[MX_N * MX_K], g_mx_e[MX_N * MX_K / 32];
static uint8_t g_nv_codes[NV_N * NV_K], g_nv_d[NV_N * NV_K / 16];
static uint8_t g_ex_codes[EX_E * EX_N * EX_K], g_ex_e[EX_E * EX_N * EX_K / 32];

/* formats.md 3.6: {e, qs[16]}: qs[j] = element j | element j+16 << 4 */
static void mx_blocks(const uint8_t *codes, const uint8_t *e, size_t nblocks, uint8_t *out) {
    for (size_t b = 0; b < nblocks; b++) {
        out[b * 17] = e[b];
        for (int j = 0; j < 16; j++) out[b * 17 + 1 + j] = (uint8_t)(codes[b * 32 + j] | codes[b * 32 + j + 16] << 4);
    }
}

/* formats.md 2.5: {d[4], qs[32]}: qs[8s+j] = element 16s+j | element 16s+j+8 << 4 */
static void nv_blocks(const uint8_t *codes, const uint8_t *d, size_t nblocks, uint8_t *out) {
    for (size_t b = 0; b < nblocks; b++) {
        for (int s = 0; s < 4; s++) {
            out[b * 36 + s] = d[b * 4 + s];
            for (int j = 0; j < 8; j++)
                out[b * 36 + 4 + 8 * s + j] =
                    (uint8_t)(codes[b * 64 + 16 * s + j] | codes[b * 64 + 16 * s + j + 8] << 4);
        }
    }
}

/* ggml's UE4M3 value: 0 and 0x7F are zero, bit 7 ignored */
static double ue4m3(uint8_t d) { return d == 0 || d == 0x7F ? 0.0 : ref_e4m3((uint8_t)(d & 0x7F)); }

static void check_import(const nb_gguf_file *g, const char *name, int64_t expert, const uint8_t *codes,
                         const uint8_t *sc, int nv, float ts, size_t want_remapped) {
    size_t i;
    CHECK(nb_gguf_tensor_find(g, name, &i) == NB_OK, "%s not found", name);
    nb_gguf_fp4 f;
    nb_status st = nb_gguf_fp4_info(g, i, &f);
    CHECK(st == NB_OK && f.format == (nv ? NB_FORMAT_NVFP4 : NB_FORMAT_MXFP4), "%s: fp4_info %s", name, nb_last_error());
    if (st != NB_OK) return;
    uint8_t *c = (uint8_t *)malloc(f.codes_bytes), *s = (uint8_t *)malloc(f.scales_bytes);
    nb_weight_desc d;
    size_t rem = 99;
    st = nb_gguf_fp4_to_checkpoint(g, i, expert, &d, c, f.codes_bytes, s, f.scales_bytes, &rem);
    CHECK(st == NB_OK && rem == want_remapped && d.tensor_scale == ts, "%s: import %s, %zu remapped (want %zu), ts %g",
          name, nb_last_error(), rem, want_remapped, (double)d.tensor_scale);
    if (st == NB_OK) {
        int64_t n = f.n, k = f.k, group = nv ? 16 : 32;
        const uint8_t *ec = codes + (size_t)(expert * n * k);
        const uint8_t *es = sc + (size_t)(expert * n * k / group);
        size_t bad_codes = 0;
        for (int64_t j = 0; j < n * k / 2; j++)
            bad_codes += c[j] != (uint8_t)(ec[2 * j] | ec[2 * j + 1] << 4);
        CHECK(bad_codes == 0, "%s: %zu code bytes not in checkpoint order", name, bad_codes);
        nb_context *ctx = NULL;
        nb_context_create(NB_DEVICE_NONE, &ctx);
        float *y = (float *)malloc(sizeof(float) * (size_t)(n * k));
        CHECK(nb_dequantize_host(ctx, &d, c, s, NB_DTYPE_F32, y) == NB_OK, "%s: dequantize", name);
        size_t bad = 0, first = 0;
        float fw = 0;
        for (int64_t j = 0; j < n * k; j++) {
            double q = k_e2m1[ec[j]];
            uint8_t sb = es[j / group];
            float want = nv ? (float)(q * ue4m3(sb)) * ts : (float)(q * ref_e8m0(sb));
            if (memcmp(&want, &y[j], 4) && !bad++) {
                first = (size_t)j;
                fw = want;
            }
        }
        CHECK(bad == 0, "%s expert %lld: %zu values differ, first at %zu: %g vs %g", name, (long long)expert, bad, first,
              (double)y[first], (double)fw);
        free(y);
        nb_context_destroy(ctx);
    }
    free(c);
    free(s);
}

static void test_known_answers(void) {
    for (size_t i = 0; i < sizeof g_mx_codes; i++) g_mx_codes[i] = (uint8_t)(rnd_u64() & 15);
    for (size_t i = 0; i < sizeof g_mx_e; i++) g_mx_e[i] = (uint8_t)(118 + rnd_u64() % 17);
    for (size_t i = 0; i < sizeof g_nv_codes; i++) g_nv_codes[i] = (uint8_t)(rnd_u64() & 15);
    for (size_t i = 0; i < sizeof g_nv_d; i++) g_nv_d[i] = (uint8_t)(0x20 + rnd_u64() % 0x38);
    g_nv_d[3] = 0x7F; /* ggml: zero */
    g_nv_d[9] = 0x88; /* ggml ignores bit 7: 0x08 */
    for (size_t i = 0; i < sizeof g_ex_codes; i++) g_ex_codes[i] = (uint8_t)(rnd_u64() & 15);
    for (size_t i = 0; i < sizeof g_ex_e; i++) g_ex_e[i] = (uint8_t)(120 + rnd_u64() % 13);
    uint8_t mx[MX_N * MX_K / 32 * 17], nv[NV_N * NV_K / 64 * 36], ex[EX_E * EX_N * EX_K / 32 * 17];
    mx_blocks(g_mx_codes, g_mx_e, sizeof g_mx_e, mx);
    nv_blocks(g_nv_codes, g_nv_d, sizeof g_nv_d / 4, nv);
    mx_blocks(g_ex_codes, g_ex_e, sizeof g_ex_e, ex);
    float ts = 0.375f, norm[64];
    for (int i = 0; i < 64; i++) norm[i] = (float)i;
    const tspec t[5] = {
        {"blk.0.ffn_down.weight", 2, {MX_K, MX_N, 1, 1}, NB_GGML_TYPE_MXFP4, mx, sizeof mx},
        {"blk.0.attn_q.weight", 2, {NV_K, NV_N, 1, 1}, NB_GGML_TYPE_NVFP4, nv, sizeof nv},
        {"blk.0.attn_q.scale", 1, {1, 1, 1, 1}, NB_GGML_TYPE_F32, (const uint8_t *)&ts, 4},
        {"blk.0.ffn_down_exps.weight", 3, {EX_K, EX_N, EX_E, 1}, NB_GGML_TYPE_MXFP4, ex, sizeof ex},
        {"output_norm.weight", 1, {64, 1, 1, 1}, NB_GGML_TYPE_F32, (const uint8_t *)norm, sizeof norm},
    };
    for (int al = 0; al < 2; al++) {
        gb b = build(t, 5, al ? 64 : 32);
        nb_gguf_file *g = NULL;
        nb_status st = open_img(&b, &g);
        CHECK(st == NB_OK, "valid image (alignment %d): %s", al ? 64 : 32, nb_last_error());
        if (g) {
            nb_gguf_header h;
            nb_gguf_get_header(g, &h);
            CHECK(h.version == 3 && h.alignment == (al ? 64u : 32u) && h.n_kv == (al ? 4u : 3u) && h.n_tensors == 5 &&
                      h.data_offset % h.alignment == 0,
                  "header: v%u al %u kv %zu t %zu", h.version, h.alignment, h.n_kv, h.n_tensors);
            nb_gguf_kv kv;
            CHECK(nb_gguf_kv_find(g, "general.architecture", &kv) == NB_OK && kv.type == NB_GGUF_STRING &&
                      !strcmp(kv.str, "llama"),
                  "architecture");
            CHECK(nb_gguf_kv_find(g, "tokenizer.ggml.tokens", &kv) == NB_OK && kv.type == NB_GGUF_ARRAY &&
                      kv.elem_type == NB_GGUF_STRING && kv.count == 2 && kv.bytes == 8 + 1 + 8 + 2,
                  "string array");
            CHECK(nb_gguf_kv_find(g, "nope", &kv) == NB_ERR_NOT_FOUND, "missing key");
            nb_gguf_tensor tt;
            CHECK(nb_gguf_tensor_at(g, 3, &tt) == NB_OK && tt.n_dims == 3 && tt.shape[0] == EX_E &&
                      tt.shape[1] == EX_N && tt.shape[2] == EX_K && tt.bytes == sizeof ex &&
                      !memcmp(tt.data, ex, sizeof ex),
                  "3-D tensor info and data");
            CHECK(nb_gguf_tensor_at(g, 4, &tt) == NB_OK && !memcmp(tt.data, norm, sizeof norm), "F32 data");
            check_import(g, "blk.0.ffn_down.weight", 0, g_mx_codes, g_mx_e, 0, 1.0f, 0);
            check_import(g, "blk.0.attn_q.weight", 0, g_nv_codes, g_nv_d, 1, ts, 2);
            for (int e = 0; e < EX_E; e++) check_import(g, "blk.0.ffn_down_exps.weight", e, g_ex_codes, g_ex_e, 0, 1.0f, 0);
            size_t i4;
            nb_gguf_fp4 f;
            nb_weight_desc d;
            uint8_t c[64], s[8];
            CHECK(nb_gguf_tensor_find(g, "output_norm.weight", &i4) == NB_OK &&
                      nb_gguf_fp4_info(g, i4, &f) == NB_ERR_UNSUPPORTED,
                  "F32 is not FP4");
            size_t i0;
            nb_gguf_tensor_find(g, "blk.0.ffn_down.weight", &i0);
            CHECK(nb_gguf_fp4_to_checkpoint(g, i0, 1, &d, c, sizeof c, s, sizeof s, NULL) ==
                      NB_ERR_INVALID_ARGUMENT,
                  "expert of a 2-D tensor");
            CHECK(nb_gguf_fp4_to_checkpoint(g, i0, 0, &d, c, 3, s, sizeof s, NULL) ==
                      NB_ERR_BUFFER_TOO_SMALL,
                  "short buffer");
        }
        nb_gguf_close(g);
        if (al) { /* the same through a file and mmap */
            const char *tmp = getenv("TMPDIR");
            char path[512];
            snprintf(path, sizeof path, "%s/nb_gguf_test_%d.gguf", tmp && tmp[0] ? tmp : "/tmp", (int)getpid());
            FILE *fp = fopen(path, "wb");
            if (fp) {
                fwrite(b.p, 1, b.n, fp);
                fclose(fp);
            }
            st = nb_gguf_open(path, &g);
            CHECK(st == NB_OK, "open %s: %s", path, nb_last_error());
            if (g) check_import(g, "blk.0.attn_q.weight", 0, g_nv_codes, g_nv_d, 1, ts, 2);
            nb_gguf_close(g);
            remove(path);
            CHECK(nb_gguf_open(path, &g) == NB_ERR_IO && strstr(nb_last_error(), path), "missing file: %s", nb_last_error());
        }
        free(b.p);
    }
    /* 0xFF: 480 to ggml, no E4M3 value */
    g_nv_d[5] = 0xFF;
    nv_blocks(g_nv_codes, g_nv_d, sizeof g_nv_d / 4, nv);
    gb b = build(t + 1, 1, 32);
    nb_gguf_file *g = NULL;
    CHECK(open_img(&b, &g) == NB_OK, "0xFF image opens: %s", nb_last_error());
    if (g) {
        uint8_t c[NV_N * NV_K / 2], s[NV_N * NV_K / 16];
        nb_weight_desc d;
        CHECK(nb_gguf_fp4_to_checkpoint(g, 0, 0, &d, c, sizeof c, s, sizeof s, NULL) ==
                      NB_ERR_UNSUPPORTED && strstr(nb_last_error(), "0xFF"),
              "0xFF refused: %s", nb_last_error());
    }
    nb_gguf_close(g);
    free(b.p);
}

/* ------------------------------------------------------------ malformed files */

static void expect(const gb *b, nb_status want, const char *part, const char *what) {
    nb_gguf_file *g = NULL;
    nb_status st = open_img(b, &g);
    int ok = want == NB_OK ? st == NB_OK && g : st == want && !g && strstr(nb_last_error(), "img.gguf") && (!part || strstr(nb_last_error(), part));
    CHECK(ok, "%s: %s (%s), want %s with '%s'", what, nb_status_name(st), nb_last_error(), nb_status_name(want), part ? part : "");
    nb_gguf_close(g);
}

/* A one-tensor image (F32 [8]) with an optional twist to its infos. */
static gb one_tensor(const char *name, int nd, const int64_t *ne, uint32_t type, uint64_t off, size_t data_bytes,
                     size_t extra) {
    gb b = {0};
    header(&b, 3, 1, 0);
    tinfo(&b, name, nd, ne, type, off);
    pad(&b, 32);
    uint8_t z[256] = {0};
    put(&b, z, data_bytes);
    pad(&b, 32);
    put(&b, z, extra);
    return b;
}

static void test_malformed(void) {
    int64_t ne8[1] = {8};
    gb b = one_tensor("t", 1, ne8, NB_GGML_TYPE_F32, 0, 32, 0);
    expect(&b, NB_OK, NULL, "baseline");
    gb c = {0};
    put(&c, b.p, 10);
    expect(&c, NB_ERR_CORRUPT, "header", "truncated header");
    free(c.p);
    c = (gb){0};
    put(&c, b.p, b.n);
    c.p[0] = 'X';
    expect(&c, NB_ERR_CORRUPT, "magic", "bad magic");
    uint32_t vers[3] = {1, 4, 0x03000000};
    const char *vw[3] = {"version 1", "version 4", "big-endian"};
    for (int i = 0; i < 3; i++) {
        memcpy(c.p, "GGUF", 4);
        memcpy(c.p + 4, &vers[i], 4);
        expect(&c, NB_ERR_UNSUPPORTED, vw[i], vw[i]);
    }
    free(c.p);
    /* counts */
    c = (gb){0};
    header(&c, 3, 0, (uint64_t)1 << 60);
    kv_u32(&c, "a", 1);
    expect(&c, NB_ERR_CORRUPT, "n_kv", "huge n_kv");
    free(c.p);
    c = (gb){0};
    header(&c, 3, (uint64_t)1 << 60, 0);
    u64(&c, 0);
    expect(&c, NB_ERR_CORRUPT, "n_tensors", "huge n_tensors");
    free(c.p);
    /* keys and values */
    c = (gb){0};
    header(&c, 3, 0, 1);
    u64(&c, (uint64_t)1 << 63);
    u32(&c, 0);
    u32(&c, 0);
    expect(&c, NB_ERR_CORRUPT, "key", "key length 2^63");
    free(c.p);
    c = (gb){0};
    header(&c, 3, 0, 1);
    kv_u32(&c, "", 1);
    expect(&c, NB_ERR_CORRUPT, "empty", "empty key");
    free(c.p);
    c = (gb){0};
    header(&c, 3, 0, 2);
    kv_u32(&c, "k", 1);
    kv_u32(&c, "k", 2);
    expect(&c, NB_ERR_CORRUPT, "twice", "duplicate key");
    free(c.p);
    c = (gb){0};
    header(&c, 3, 0, 1);
    str(&c, "k");
    u32(&c, 13);
    u32(&c, 0);
    u32(&c, 0);
    expect(&c, NB_ERR_CORRUPT, "value type", "value type 13");
    free(c.p);
    c = (gb){0};
    header(&c, 3, 0, 1);
    str(&c, "k");
    u32(&c, NB_GGUF_ARRAY);
    u32(&c, NB_GGUF_ARRAY);
    u64(&c, 0);
    expect(&c, NB_ERR_CORRUPT, "not arrays", "nested array");
    free(c.p);
    c = (gb){0};
    header(&c, 3, 0, 1);
    str(&c, "k");
    u32(&c, NB_GGUF_ARRAY);
    u32(&c, NB_GGUF_UINT64);
    u64(&c, (uint64_t)1 << 62);
    expect(&c, NB_ERR_OVERFLOW, "overflows", "array size overflow");
    free(c.p);
    c = (gb){0};
    header(&c, 3, 0, 1);
    str(&c, "k");
    u32(&c, NB_GGUF_ARRAY);
    u32(&c, NB_GGUF_UINT32);
    u64(&c, 1000);
    u32(&c, 0);
    expect(&c, NB_ERR_CORRUPT, "past the end", "array past the end");
    free(c.p);
    c = (gb){0};
    header(&c, 3, 0, 1);
    kv_str(&c, "k", "\xC3\x28");
    expect(&c, NB_ERR_CORRUPT, "UTF-8", "invalid UTF-8 value");
    free(c.p);
    uint32_t als[2] = {48, 0};
    for (int i = 0; i < 2; i++) {
        c = (gb){0};
        header(&c, 3, 0, 1);
        kv_u32(&c, "general.alignment", als[i]);
        expect(&c, NB_ERR_CORRUPT, "alignment", als[i] ? "alignment 48" : "alignment 0");
        free(c.p);
    }
    c = (gb){0};
    header(&c, 3, 0, 1);
    str(&c, "general.alignment");
    u32(&c, NB_GGUF_UINT64);
    u64(&c, 64);
    expect(&c, NB_ERR_CORRUPT, "UINT32", "alignment as UINT64");
    free(c.p);
    /* tensor infos */
    char longname[80];
    memset(longname, 'a', 64);
    longname[64] = 0;
    c = one_tensor(longname, 1, ne8, NB_GGML_TYPE_F32, 0, 32, 0);
    expect(&c, NB_ERR_CORRUPT, "longer", "64-byte tensor name");
    free(c.p);
    c = (gb){0};
    header(&c, 3, 2, 0);
    tinfo(&c, "t", 1, ne8, NB_GGML_TYPE_F32, 0);
    tinfo(&c, "t", 1, ne8, NB_GGML_TYPE_F32, 32);
    pad(&c, 32);
    uint8_t z[64] = {0};
    put(&c, z, 64);
    expect(&c, NB_ERR_CORRUPT, "twice", "duplicate tensor name");
    free(c.p);
    int64_t ne5[5] = {8, 1, 1, 1, 1};
    c = one_tensor("t", 0, ne8, NB_GGML_TYPE_F32, 0, 32, 0);
    expect(&c, NB_ERR_CORRUPT, "n_dims", "n_dims 0");
    free(c.p);
    c = one_tensor("t", 5, ne5, NB_GGML_TYPE_F32, 0, 32, 0);
    expect(&c, NB_ERR_CORRUPT, "n_dims", "n_dims 5");
    free(c.p);
    int64_t neg[1] = {INT64_MIN};
    c = one_tensor("t", 1, neg, NB_GGML_TYPE_F32, 0, 32, 0);
    expect(&c, NB_ERR_CORRUPT, "negative", "negative dimension");
    free(c.p);
    c = one_tensor("t", 1, ne8, 4, 0, 32, 0);
    expect(&c, NB_ERR_CORRUPT, "retired", "retired type 4");
    free(c.p);
    c = one_tensor("t", 1, ne8, 77, 0, 32, 0);
    expect(&c, NB_ERR_CORRUPT, "unknown", "type 77");
    free(c.p);
    int64_t ne48[2] = {48, 1};
    c = one_tensor("t", 2, ne48, NB_GGML_TYPE_MXFP4, 0, 32, 0);
    expect(&c, NB_ERR_CORRUPT, "block", "ne[0] not whole MXFP4 blocks");
    free(c.p);
    int64_t big[2] = {(int64_t)1 << 40, (int64_t)1 << 40};
    c = one_tensor("t", 2, big, NB_GGML_TYPE_F32, 0, 32, 0);
    expect(&c, NB_ERR_OVERFLOW, "overflows", "shape overflow");
    free(c.p);
    c = one_tensor("t", 1, ne8, NB_GGML_TYPE_F32, 16, 64, 0);
    expect(&c, NB_ERR_CORRUPT, "alignment", "misaligned offset");
    free(c.p);
    int64_t ne64[1] = {64};
    c = one_tensor("t", 1, ne64, NB_GGML_TYPE_F32, 0, 32, 0);
    expect(&c, NB_ERR_CORRUPT, "past the end", "data past the end");
    free(c.p);
    c = one_tensor("t", 1, ne8, NB_GGML_TYPE_F32, 32, 64, 0);
    expect(&c, NB_ERR_CORRUPT, "gap", "gap before the first tensor");
    free(c.p);
    c = one_tensor("t", 1, ne8, NB_GGML_TYPE_F32, 0, 32, 32);
    expect(&c, NB_ERR_CORRUPT, "trailing", "trailing bytes");
    free(c.p);
    c = (gb){0};
    header(&c, 3, 2, 0);
    tinfo(&c, "t", 1, ne8, NB_GGML_TYPE_F32, 0);
    tinfo(&c, "u", 1, ne8, NB_GGML_TYPE_F32, 0);
    pad(&c, 32);
    put(&c, z, 64);
    expect(&c, NB_ERR_CORRUPT, "overlaps", "overlapping tensors");
    free(c.p);
    c = one_tensor("a_rather_long_tensor_name_x", 1, ne8, NB_GGML_TYPE_F32, 0, 32, 0);
    c.n = 24 + 50; /* cut inside the tensor info, after the count check */
    expect(&c, NB_ERR_CORRUPT, "past the end", "truncated tensor info");
    free(c.p);
    c = (gb){0};
    header(&c, 3, 0, 0);
    put(&c, z, 16);
    expect(&c, NB_ERR_CORRUPT, "trailing", "bytes after an empty file's header");
    free(c.p);
    free(b.p);
    nb_gguf_file *g = NULL;
    CHECK(nb_gguf_open_memory(NULL, 4, "x", &g) == NB_ERR_NULL_POINTER, "NULL data");
    CHECK(nb_gguf_open(NULL, &g) == NB_ERR_NULL_POINTER && nb_gguf_close(NULL) == NB_OK, "NULL path");
    const char *tn = NULL;
    CHECK(nb_ggml_type_name(39, &tn) == NB_OK && !strcmp(tn, "MXFP4") && nb_ggml_type_name(36, &tn) == NB_ERR_NOT_FOUND &&
              nb_ggml_type_name(1000, &tn) == NB_ERR_NOT_FOUND && strstr(nb_last_error(), "1000"),
          "type names");
}

/* ------------------------------------------------------------ conversion */

static char g_dir[512]; /* where the GGUF files and the outputs go */

static void write_img(const gb *b, const char *name, char *path, size_t n) {
    snprintf(path, n, "%s/%s", g_dir, name);
    FILE *f = fopen(path, "wb");
    CHECK(f && fwrite(b->p, 1, b->n, f) == b->n, "write %s", path);
    if (f) fclose(f);
}

static void rm_tree(const char *dir) {
    const char *files[] = {"model.safetensors", "hf_quant_config.json"};
    char p[2048];
    for (int i = 0; i < 2; i++) {
        snprintf(p, sizeof p, "%s/%s", dir, files[i]);
        remove(p);
    }
    rmdir(dir);
}

typedef struct conv_log {
    int skipped, warnings, remap_note, metadata_note;
    char skipped_name[128];
} conv_log;

static void log_warn(void *user, const char *msg) {
    conv_log *l = (conv_log *)user;
    l->warnings++;
    if (strstr(msg, "rewritten from ggml's unsigned E4M3")) l->remap_note++;
    if (strstr(msg, "GGUF metadata")) l->metadata_note++;
}
static void log_skip(void *user, const char *name, const char *type) {
    conv_log *l = (conv_log *)user;
    l->skipped++;
    snprintf(l->skipped_name, sizeof l->skipped_name, "%s:%s", name, type);
}

static nb_status convert(const char *gguf, const char *out_name, nb_ckpt_target tg, int skip, int strict,
                         nb_ckpt_convert_summary *sum, conv_log *log) {
    char out[1024];
    snprintf(out, sizeof out, "%s/%s", g_dir, out_name);
    rm_tree(out);
    nb_ckpt_convert_opts o;
    nb_ckpt_convert_opts_init(&o);
    o.target = tg;
    o.skip_unsupported = skip;
    o.strict = strict;
    memset(log, 0, sizeof *log);
    o.warn = log_warn;
    o.warn_user = log;
    o.skipped = log_skip;
    o.skipped_user = log;
    return nb_ckpt_convert(gguf, out, &o, sum);
}

static int exists(const char *out_name, const char *file) {
    char p[1024];
    snprintf(p, sizeof p, "%s/%s%s%s", g_dir, out_name, file ? "/" : "", file ? file : "");
    return access(p, F_OK) == 0;
}

/* Every expert of GGUF tensor `name` against layer(s) of the converted
 * checkpoint: detected as `want`, dequantized bit for bit alike. */
static void check_layer(const nb_gguf_file *g, nb_ckpt *c, const char *name, const char *prefix, nb_ckpt_format want) {
    size_t ti;
    nb_gguf_fp4 f;
    if (nb_gguf_tensor_find(g, name, &ti) != NB_OK || nb_gguf_fp4_info(g, ti, &f) != NB_OK) {
        CHECK(0, "%s: not a GGUF FP4 tensor (%s)", name, nb_last_error());
        return;
    }
    nb_context *ctx = NULL;
    nb_context_create(NB_DEVICE_NONE, &ctx);
    const size_t nel = (size_t)(f.n * f.k);
    float *a = (float *)malloc(nel * 4), *b = (float *)malloc(nel * 4);
    uint8_t *gc = (uint8_t *)malloc(f.codes_bytes), *gs = (uint8_t *)malloc(f.scales_bytes);
    for (int64_t e = 0; e < (f.experts ? f.experts : 1); e++) {
        char lp[256];
        if (f.experts) snprintf(lp, sizeof lp, "%s.%lld", prefix, (long long)e);
        else snprintf(lp, sizeof lp, "%s", prefix);
        size_t li;
        nb_ckpt_layer L;
        memset(&L, 0, sizeof L);
        nb_status st = nb_ckpt_layer_find(c, lp, &li);
        if (st == NB_OK) nb_ckpt_layer_at(c, li, &L);
        CHECK(st == NB_OK && L.format == want && L.n == f.n && L.k == f.k, "%s: layer %s, %s, %lld x %lld (want %s)",
              name, lp, fmt_name(L.format), (long long)L.n, (long long)L.k, fmt_name(want));
        if (st != NB_OK || L.format != want) continue;
        nb_weight_desc dg, dc;
        const uint8_t *cc, *cs;
        CHECK(nb_gguf_fp4_to_checkpoint(g, ti, e, &dg, gc, f.codes_bytes, gs, f.scales_bytes, NULL) ==
                      NB_OK &&
                  nb_ckpt_layer_weight(c, li, 0, &dc, &cc, &cs) == NB_OK,
              "%s: %s", lp, nb_last_error());
        CHECK(nb_dequantize_host(ctx, &dg, gc, gs, NB_DTYPE_F32, a) == NB_OK &&
                  nb_dequantize_host(ctx, &dc, cc, cs, NB_DTYPE_F32, b) == NB_OK,
              "%s: dequantize", lp);
        size_t bad = 0, first = 0;
        for (size_t j = 0; j < nel; j++)
            if (memcmp(&a[j], &b[j], 4) && !bad++) first = j;
        CHECK(bad == 0 && dg.tensor_scale == dc.tensor_scale, "%s: %zu of %zu values differ (first %zu: %g vs %g), "
              "tensor scale %g vs %g", lp, bad, nel, first, (double)a[first], (double)b[first],
              (double)dg.tensor_scale, (double)dc.tensor_scale);
    }
    free(a);
    free(b);
    free(gc);
    free(gs);
    nb_context_destroy(ctx);
}

/* A copied tensor: same bytes, dtype, row-major shape. */
static void check_copy(const nb_gguf_file *g, nb_ckpt *c, const char *name, nb_st_dtype dt) {
    size_t gi, ci;
    nb_gguf_tensor t;
    nb_st_tensor s;
    int ok = nb_gguf_tensor_find(g, name, &gi) == NB_OK && nb_ckpt_tensor_find(c, name, &ci) == NB_OK;
    if (ok) {
        nb_gguf_tensor_at(g, gi, &t);
        nb_ckpt_tensor_at(c, ci, &s, NULL);
        ok = s.dtype == dt && s.rank == t.n_dims && s.bytes == t.bytes && !memcmp(s.data, t.data, s.bytes);
        for (int d = 0; ok && d < t.n_dims; d++) ok = s.shape[d] == t.ne[t.n_dims - 1 - d];
    }
    CHECK(ok, "%s: not copied byte for byte with a row-major shape", name);
}

static nb_ckpt *open_out(const char *out_name) {
    char p[1024];
    snprintf(p, sizeof p, "%s/%s", g_dir, out_name);
    nb_ckpt *c = NULL;
    CHECK(nb_ckpt_open(p, &c) == NB_OK, "open %s: %s", p, nb_last_error());
    return c;
}

static float f32_of(nb_ckpt *c, const char *name, int *rank) {
    size_t i;
    nb_st_tensor t;
    float v = -1.0f;
    *rank = -1;
    if (nb_ckpt_tensor_find(c, name, &i) == NB_OK) {
        nb_ckpt_tensor_at(c, i, &t, NULL);
        memcpy(&v, t.data, 4);
        *rank = t.rank;
    }
    return v;
}

static void test_convert(void) {
    /* NVFP4: a 2-D weight with a tensor and an input scale, a 3-D one with
     * one tensor scale per expert, float and integer tensors, a Q8_0 one */
    enum { QN = 3, QK = 128, XE = 3, XN = 2, XK = 64 };
    static uint8_t qc[QN * QK], qd[QN * QK / 16], xc[XE * XN * XK], xd[XE * XN * XK / 16];
    static uint8_t qb[QN * QK / 64 * 36], xb[XE * XN * XK / 64 * 36], mb[QN * QK / 32 * 17], eb[XE * XN * XK / 32 * 17];
    static uint8_t me[QN * QK / 32], ee[XE * XN * XK / 32];
    for (size_t i = 0; i < sizeof qc; i++) qc[i] = (uint8_t)(rnd_u64() & 15);
    for (size_t i = 0; i < sizeof xc; i++) xc[i] = (uint8_t)(rnd_u64() & 15);
    for (size_t i = 0; i < sizeof qd; i++) qd[i] = (uint8_t)(0x20 + rnd_u64() % 0x38);
    for (size_t i = 0; i < sizeof xd; i++) xd[i] = (uint8_t)(0x28 + rnd_u64() % 0x30);
    for (size_t i = 0; i < sizeof me; i++) me[i] = (uint8_t)(118 + rnd_u64() % 17);
    for (size_t i = 0; i < sizeof ee; i++) ee[i] = (uint8_t)(120 + rnd_u64() % 13);
    qd[1] = 0x7F; /* ggml zero */
    qd[5] = 0x9A; /* bit 7 ignored by ggml */
    xd[2] = 0xC0;
    nv_blocks(qc, qd, sizeof qd / 4, qb);
    nv_blocks(xc, xd, sizeof xd / 4, xb);
    mx_blocks(qc, me, sizeof me, mb);
    mx_blocks(xc, ee, sizeof ee, eb);
    float ts = 0.375f, is = 0.5f, xts[XE] = {0.25f, 0.125f, 2.0f}, norm[XK];
    for (int i = 0; i < XK; i++) norm[i] = 1.0f + (float)i / 64.0f;
    uint16_t emb[5 * XK], out[4 * XK];
    for (size_t i = 0; i < 5 * XK; i++) emb[i] = (uint16_t)(0x3C00 + i);
    for (size_t i = 0; i < 4 * XK; i++) out[i] = (uint16_t)(0x3F80 + i);
    int32_t pos[3] = {7, -1, 42};
    uint8_t q8[2 * 34];
    memset(q8, 0x11, sizeof q8);
    const tspec nvt[9] = {
        {"blk.0.attn_q.weight", 2, {QK, QN, 1, 1}, NB_GGML_TYPE_NVFP4, qb, sizeof qb},
        {"blk.0.attn_q.scale", 1, {1, 1, 1, 1}, NB_GGML_TYPE_F32, (const uint8_t *)&ts, 4},
        {"blk.0.attn_q.input_scale", 1, {1, 1, 1, 1}, NB_GGML_TYPE_F32, (const uint8_t *)&is, 4},
        {"blk.0.ffn_down_exps.weight", 3, {XK, XN, XE, 1}, NB_GGML_TYPE_NVFP4, xb, sizeof xb},
        {"blk.0.ffn_down_exps.scale", 1, {XE, 1, 1, 1}, NB_GGML_TYPE_F32, (const uint8_t *)xts, sizeof xts},
        {"blk.0.ffn_norm.weight", 1, {XK, 1, 1, 1}, NB_GGML_TYPE_F32, (const uint8_t *)norm, sizeof norm},
        {"token_embd.weight", 2, {XK, 5, 1, 1}, NB_GGML_TYPE_F16, (const uint8_t *)emb, sizeof emb},
        {"output.weight", 2, {XK, 4, 1, 1}, NB_GGML_TYPE_BF16, (const uint8_t *)out, sizeof out},
        {"blk.0.attn_k.weight", 2, {32, 2, 1, 1}, 8 /* Q8_0 */, q8, sizeof q8},
    };
    const tspec pos_t = {"blk.0.pos", 1, {3, 1, 1, 1}, 26 /* I32 */, (const uint8_t *)pos, sizeof pos};
    tspec nvall[10];
    memcpy(nvall, nvt, sizeof nvt);
    nvall[9] = pos_t;
    char nvp[1024], nvq8p[1024], mxp[1024], mixp[1024], inexp[1024], ffp[1024], f16p[1024];
    gb b = build(nvall, 10, 32);
    write_img(&b, "nv_q8.gguf", nvq8p, sizeof nvq8p);
    free(b.p);
    b = build(nvall, 8, 32); /* without the Q8_0 tensor: the CLI fixture */
    write_img(&b, "nv.gguf", nvp, sizeof nvp);
    free(b.p);
    const tspec mxt[3] = {
        {"blk.0.ffn_up.weight", 2, {QK, QN, 1, 1}, NB_GGML_TYPE_MXFP4, mb, sizeof mb},
        {"blk.0.ffn_gate_exps.weight", 3, {XK, XN, XE, 1}, NB_GGML_TYPE_MXFP4, eb, sizeof eb},
        {"output_norm.weight", 1, {XK, 1, 1, 1}, NB_GGML_TYPE_F32, (const uint8_t *)norm, sizeof norm},
    };
    b = build(mxt, 3, 32);
    write_img(&b, "mx.gguf", mxp, sizeof mxp);
    free(b.p);
    const tspec mixt[2] = {nvt[0], mxt[0]};
    b = build(mixt, 2, 32);
    write_img(&b, "mix.gguf", mixp, sizeof mixp);
    free(b.p);
    float bad_ts = 0.0123f; /* no float g has 1/g == 0.0123f */
    const tspec inext[2] = {nvt[0], {"blk.0.attn_q.scale", 1, {1, 1, 1, 1}, NB_GGML_TYPE_F32,
                                     (const uint8_t *)&bad_ts, 4}};
    b = build(inext, 2, 32);
    write_img(&b, "inexact.gguf", inexp, sizeof inexp);
    free(b.p);
    qd[7] = 0xFF; /* 480 to ggml: refused */
    nv_blocks(qc, qd, sizeof qd / 4, qb);
    b = build(nvt, 1, 32);
    write_img(&b, "ff.gguf", ffp, sizeof ffp);
    free(b.p);
    qd[7] = 0x30;
    nv_blocks(qc, qd, sizeof qd / 4, qb);
    b = build(nvt + 5, 3, 32); /* floats only */
    write_img(&b, "f16.gguf", f16p, sizeof f16p);
    free(b.p);

    nb_ckpt_convert_summary sum;
    conv_log log;
    nb_gguf_file *g = NULL;
    CHECK(nb_gguf_open(nvq8p, &g) == NB_OK, "open %s: %s", nvq8p, nb_last_error());

    /* Q8_0 refused by name, then skipped */
    nb_status st = convert(nvq8p, "o_mo", NB_CKPT_TARGET_MODELOPT, 0, 0, &sum, &log);
    CHECK(st == NB_ERR_UNSUPPORTED && strstr(nb_last_error(), "blk.0.attn_k.weight") && strstr(nb_last_error(), "Q8_0") &&
              !exists("o_mo", NULL),
          "Q8_0 refused: %s (%s)", nb_status_name(st), nb_last_error());
    st = convert(nvq8p, "o_mo", NB_CKPT_TARGET_MODELOPT, 1, 0, &sum, &log);
    CHECK(st == NB_OK && sum.gguf && sum.tensors_skipped == 1 && log.skipped == 1 &&
              !strcmp(log.skipped_name, "blk.0.attn_k.weight:Q8_0"),
          "Q8_0 skipped: %s (%s) %zu %s", nb_status_name(st), nb_last_error(), sum.tensors_skipped, log.skipped_name);
    CHECK(st == NB_OK && sum.tensors_in == 10 && sum.layers_converted == 2 && sum.experts_split == 3 &&
              sum.layers_unquantized == 2 && sum.tensors_copied == 4 && sum.scale_bytes_remapped == 3 &&
              log.remap_note == 1 && log.metadata_note == 1 && exists("o_mo", "hf_quant_config.json") &&
              sum.tensors_out == 4 + 3 * 3 + 4, /* attn_q 4, 3 experts x 3, 4 copies */
          "modelopt summary: in %zu conv %zu exp %zu unq %zu copied %zu remapped %zu out %zu", sum.tensors_in,
          sum.layers_converted, sum.experts_split, sum.layers_unquantized, sum.tensors_copied,
          sum.scale_bytes_remapped, sum.tensors_out);
    nb_ckpt *c = st == NB_OK ? open_out("o_mo") : NULL;
    if (c) {
        check_layer(g, c, "blk.0.attn_q.weight", "blk.0.attn_q", NB_CKPT_MODELOPT_NVFP4);
        check_layer(g, c, "blk.0.ffn_down_exps.weight", "blk.0.ffn_down_exps", NB_CKPT_MODELOPT_NVFP4);
        check_copy(g, c, "blk.0.ffn_norm.weight", NB_ST_F32);
        check_copy(g, c, "token_embd.weight", NB_ST_F16);
        check_copy(g, c, "output.weight", NB_ST_BF16);
        check_copy(g, c, "blk.0.pos", NB_ST_I32);
        int r1, r2, r3;
        CHECK(f32_of(c, "blk.0.attn_q.input_scale", &r1) == is && r1 == 0 &&
                  f32_of(c, "blk.0.ffn_down_exps.2.weight_scale_2", &r2) == xts[2] && r2 == 0 &&
                  f32_of(c, "blk.0.attn_q.scale", &r3) == -1.0f,
              "modelopt scalars (input scale, expert tensor scale, .scale folded in)");
        size_t li;
        nb_ckpt_layer L;
        CHECK(nb_ckpt_layer_find(c, "token_embd", &li) == NB_OK && nb_ckpt_layer_at(c, li, &L) == NB_OK &&
                  L.format == NB_CKPT_NONE,
              "token_embd: an unquantized layer");
        nb_ckpt_config cfg;
        nb_ckpt_get_config(c, &cfg);
        CHECK(cfg.declared == NB_CKPT_MODELOPT_NVFP4 && cfg.nexclude == 2, "hf_quant_config.json: declared %s, %zu "
              "excluded", fmt_name(cfg.declared), cfg.nexclude);
        nb_ckpt_close(c);
    }
    nb_gguf_close(g);
    g = NULL;
    CHECK(nb_gguf_open(nvp, &g) == NB_OK, "open %s: %s", nvp, nb_last_error());
    /* NVFP4 to compressed-tensors: reciprocal scales, all exact here */
    st = convert(nvp, "o_ct", NB_CKPT_TARGET_CT, 0, 0, &sum, &log);
    CHECK(st == NB_OK && sum.scales_exact == 1 + 1 + 3 && !sum.scales_inexact && !sum.scales_adjusted,
          "nvfp4 -> ct: %s (%s), %zu exact", nb_status_name(st), nb_last_error(), sum.scales_exact);
    c = st == NB_OK ? open_out("o_ct") : NULL;
    if (c) {
        check_layer(g, c, "blk.0.attn_q.weight", "blk.0.attn_q", NB_CKPT_CT_NVFP4);
        check_layer(g, c, "blk.0.ffn_down_exps.weight", "blk.0.ffn_down_exps", NB_CKPT_CT_NVFP4);
        int r;
        CHECK(f32_of(c, "blk.0.attn_q.input_global_scale", &r) == 2.0f && r == 1 &&
                  !exists("o_ct", "hf_quant_config.json"),
              "ct input_global_scale = 1 / input_scale, shape [1]");
        nb_ckpt_close(c);
    }
    st = convert(nvp, "o_quark", NB_CKPT_TARGET_QUARK, 0, 0, &sum, &log);
    CHECK(st == NB_ERR_UNSUPPORTED && strstr(nb_last_error(), "NVFP4") && !exists("o_quark", NULL), "nvfp4 -> quark: %s (%s)",
          nb_status_name(st), nb_last_error());
    nb_gguf_close(g);
    /* MXFP4 to Quark and compressed-tensors; not to ModelOpt */
    g = NULL;
    CHECK(nb_gguf_open(mxp, &g) == NB_OK, "open %s: %s", mxp, nb_last_error());
    const nb_ckpt_target mt[2] = {NB_CKPT_TARGET_QUARK, NB_CKPT_TARGET_CT};
    const nb_ckpt_format mf[2] = {NB_CKPT_QUARK_MXFP4, NB_CKPT_CT_MXFP4};
    for (int i = 0; i < 2; i++) {
        st = convert(mxp, i ? "o_mx_ct" : "o_mx_quark", mt[i], 0, 0, &sum, &log);
        CHECK(st == NB_OK && sum.layers_converted == 2 && sum.experts_split == 3 && sum.scale_bytes_remapped == 0 &&
                  !log.remap_note,
              "mxfp4 -> %s: %s (%s)", target_str(mt[i]), nb_status_name(st), nb_last_error());
        c = st == NB_OK ? open_out(i ? "o_mx_ct" : "o_mx_quark") : NULL;
        if (c) {
            check_layer(g, c, "blk.0.ffn_up.weight", "blk.0.ffn_up", mf[i]);
            check_layer(g, c, "blk.0.ffn_gate_exps.weight", "blk.0.ffn_gate_exps", mf[i]);
            check_copy(g, c, "output_norm.weight", NB_ST_F32);
            nb_ckpt_close(c);
        }
    }
    nb_gguf_close(g);
    /* refusals: NB_ERR_UNSUPPORTED with the reason, nothing left in OUT */
    static const struct {
        int file; /* 0 mx, 1 mix, 2 floats only, 3 0xFF scale, 4 inexact reciprocal */
        nb_ckpt_target tg;
        int strict;
        const char *reason, *what;
    } refusals[] = {
        {0, NB_CKPT_TARGET_MODELOPT, 0, "MXFP4", "mxfp4 -> modelopt"},
        {1, NB_CKPT_TARGET_CT, 0, "both", "nvfp4 + mxfp4 -> ct"},
        {2, NB_CKPT_TARGET_CT, 0, "no MXFP4 or NVFP4", "no 4-bit tensor"},
        {3, NB_CKPT_TARGET_MODELOPT, 0, "0xFF", "0xFF scale"},
        {4, NB_CKPT_TARGET_CT, 1, "(strict)", "inexact reciprocal, strict"},
    };
    const char *const files[5] = {mxp, mixp, f16p, ffp, inexp};
    for (size_t i = 0; i < sizeof refusals / sizeof refusals[0]; i++) {
        st = convert(files[refusals[i].file], "o_refused", refusals[i].tg, 0, refusals[i].strict, &sum, &log);
        CHECK(st == NB_ERR_UNSUPPORTED && strstr(nb_last_error(), refusals[i].reason) && !exists("o_refused", NULL),
              "%s: %s (%s)", refusals[i].what, nb_status_name(st), nb_last_error());
    }
    st = convert(inexp, "o_inexact", NB_CKPT_TARGET_CT, 0, 0, &sum, &log);
    CHECK(st == NB_OK && sum.scales_inexact + sum.scales_adjusted == 1 && log.warnings >= 2,
          "inexact reciprocal: %s (%s), %zu inexact, %zu adjusted", nb_status_name(st), nb_last_error(), sum.scales_inexact,
          sum.scales_adjusted);
    const char *outs[] = {"o_mo", "o_ct", "o_mx_quark", "o_mx_ct", "o_inexact"};
    for (size_t i = 0; i < sizeof outs / sizeof outs[0]; i++) {
        char p[1024];
        snprintf(p, sizeof p, "%s/%s", g_dir, outs[i]);
        rm_tree(p);
    }
    remove(mxp);
    remove(mixp);
    remove(inexp);
    remove(ffp);
    remove(f16p);
}

/* ------------------------------------------------------------ cross-check */

/* Every MXFP4/NVFP4 tensor of `path` (a file written by the gguf Python
 * package), in file order, against `want` (float32, concatenated). */
static int crosscheck(const char *path, const char *want_path) {
    nb_gguf_file *g = NULL;
    nb_status st = nb_gguf_open(path, &g);
    CHECK(st == NB_OK, "open %s: %s", path, nb_last_error());
    FILE *f = fopen(want_path, "rb");
    CHECK(f != NULL, "cannot read %s", want_path);
    if (!g || !f) {
        if (f) fclose(f);
        nb_gguf_close(g);
        return 1;
    }
    nb_gguf_header h;
    nb_gguf_get_header(g, &h);
    nb_context *ctx = NULL;
    nb_context_create(NB_DEVICE_NONE, &ctx);
    size_t checked = 0;
    for (size_t i = 0; i < h.n_tensors; i++) {
        nb_gguf_fp4 fp;
        if (nb_gguf_fp4_info(g, i, &fp) != NB_OK) continue;
        nb_gguf_tensor t;
        nb_gguf_tensor_at(g, i, &t);
        for (int64_t e = 0; e < (fp.experts ? fp.experts : 1); e++) {
            uint8_t *c = (uint8_t *)malloc(fp.codes_bytes), *s = (uint8_t *)malloc(fp.scales_bytes);
            size_t nel = (size_t)(fp.n * fp.k);
            float *y = (float *)malloc(nel * 4), *w = (float *)malloc(nel * 4);
            nb_weight_desc d;
            st = nb_gguf_fp4_to_checkpoint(g, i, e, &d, c, fp.codes_bytes, s, fp.scales_bytes, NULL);
            CHECK(st == NB_OK, "%s: %s", t.name, nb_last_error());
            CHECK(fread(w, 4, nel, f) == nel, "%s: expected values missing", t.name);
            if (st == NB_OK && nb_dequantize_host(ctx, &d, c, s, NB_DTYPE_F32, y) == NB_OK) {
                size_t bad = 0, first = 0;
                for (size_t j = 0; j < nel; j++)
                    if (memcmp(&y[j], &w[j], 4) && !(y[j] == 0 && w[j] == 0) && !bad++) first = j;
                CHECK(bad == 0, "%s expert %lld: %zu of %zu differ from gguf.quants, first at %zu: %g vs %g", t.name,
                      (long long)e, bad, nel, first, (double)y[first], (double)w[first]);
                checked++;
            }
            free(c);
            free(s);
            free(y);
            free(w);
        }
    }
    CHECK(checked > 0, "no FP4 tensor in %s", path);
    printf("cross-checked %zu FP4 matrices of %s against the gguf package\n", checked, path);
    fclose(f);
    nb_context_destroy(ctx);
    nb_gguf_close(g);
    printf("%d passed, %d failed\n", g_pass, g_fail);
    return g_fail ? 1 : 0;
}

int main(int argc, char **argv) {
    if (argc == 4 && !strcmp(argv[1], "--crosscheck")) return crosscheck(argv[2], argv[3]);
    const char *keep = argc == 3 && !strcmp(argv[1], "--keep") ? argv[2] : NULL;
    if (keep) {
        mkdir(keep, 0755);
        snprintf(g_dir, sizeof g_dir, "%s", keep);
    } else {
        const char *tmp = getenv("TMPDIR");
        snprintf(g_dir, sizeof g_dir, "%s/nb_gguf_conv_%d", tmp && tmp[0] ? tmp : "/tmp", (int)getpid());
        mkdir(g_dir, 0755);
    }
    test_known_answers();
    test_malformed();
    test_convert();
    if (!keep) { /* nv.gguf and nv_q8.gguf stay for the CLI tests when kept */
        char p[1024];
        snprintf(p, sizeof p, "%s/nv.gguf", g_dir);
        remove(p);
        snprintf(p, sizeof p, "%s/nv_q8.gguf", g_dir);
        remove(p);
        rmdir(g_dir);
    }
    printf("%d passed, %d failed\n", g_pass, g_fail);
    return g_fail ? 1 : 0;
}
