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
 *   - with --crosscheck FILE.gguf EXPECTED.f32 (tests/gguf_crosscheck.py,
 *     run when the gguf Python package is installed): every FP4 tensor of a
 *     file written by that package dequantizes bit for bit like
 *     gguf.quants.dequantize.
 */
#define _POSIX_C_SOURCE 200809L
#include "gguf.h"
#include "testlib.h"

#include <stdlib.h>
#include <unistd.h>

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

static nb_status open_img(const gb *b, nb_gguf_file **g, char *err, size_t errlen) {
    return nb_gguf_open_memory(b->p, b->n, "img.gguf", g, err, errlen);
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
    char err[512] = "";
    nb_status st = nb_gguf_fp4_info(g, i, &f, err, sizeof err);
    CHECK(st == NB_OK && f.format == (nv ? NB_FORMAT_NVFP4 : NB_FORMAT_MXFP4), "%s: fp4_info %s", name, err);
    if (st != NB_OK) return;
    uint8_t *c = (uint8_t *)malloc(f.codes_bytes), *s = (uint8_t *)malloc(f.scales_bytes);
    nb_weight_desc d;
    size_t rem = 99;
    st = nb_gguf_fp4_to_checkpoint(g, i, expert, &d, c, f.codes_bytes, s, f.scales_bytes, &rem, err, sizeof err);
    CHECK(st == NB_OK && rem == want_remapped && d.tensor_scale == ts, "%s: import %s, %zu remapped (want %zu), ts %g",
          name, err, rem, want_remapped, (double)d.tensor_scale);
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
        char err[512] = "";
        nb_status st = open_img(&b, &g, err, sizeof err);
        CHECK(st == NB_OK, "valid image (alignment %d): %s", al ? 64 : 32, err);
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
                      nb_gguf_fp4_info(g, i4, &f, err, sizeof err) == NB_ERR_UNSUPPORTED,
                  "F32 is not FP4");
            size_t i0;
            nb_gguf_tensor_find(g, "blk.0.ffn_down.weight", &i0);
            CHECK(nb_gguf_fp4_to_checkpoint(g, i0, 1, &d, c, sizeof c, s, sizeof s, NULL, err, sizeof err) ==
                      NB_ERR_INVALID_ARGUMENT,
                  "expert of a 2-D tensor");
            CHECK(nb_gguf_fp4_to_checkpoint(g, i0, 0, &d, c, 3, s, sizeof s, NULL, err, sizeof err) ==
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
            st = nb_gguf_open(path, &g, err, sizeof err);
            CHECK(st == NB_OK, "open %s: %s", path, err);
            if (g) check_import(g, "blk.0.attn_q.weight", 0, g_nv_codes, g_nv_d, 1, ts, 2);
            nb_gguf_close(g);
            remove(path);
            CHECK(nb_gguf_open(path, &g, err, sizeof err) == NB_ERR_IO && strstr(err, path), "missing file: %s", err);
        }
        free(b.p);
    }
    /* 0xFF: 480 to ggml, no E4M3 value */
    g_nv_d[5] = 0xFF;
    nv_blocks(g_nv_codes, g_nv_d, sizeof g_nv_d / 4, nv);
    gb b = build(t + 1, 1, 32);
    nb_gguf_file *g = NULL;
    char err[512] = "";
    CHECK(open_img(&b, &g, err, sizeof err) == NB_OK, "0xFF image opens: %s", err);
    if (g) {
        uint8_t c[NV_N * NV_K / 2], s[NV_N * NV_K / 16];
        nb_weight_desc d;
        CHECK(nb_gguf_fp4_to_checkpoint(g, 0, 0, &d, c, sizeof c, s, sizeof s, NULL, err, sizeof err) ==
                      NB_ERR_UNSUPPORTED && strstr(err, "0xFF"),
              "0xFF refused: %s", err);
    }
    nb_gguf_close(g);
    free(b.p);
}

/* ------------------------------------------------------------ malformed files */

static void expect(const gb *b, nb_status want, const char *part, const char *what) {
    nb_gguf_file *g = NULL;
    char err[512] = "";
    nb_status st = open_img(b, &g, err, sizeof err);
    int ok = want == NB_OK ? st == NB_OK && g : st == want && !g && strstr(err, "img.gguf") && (!part || strstr(err, part));
    CHECK(ok, "%s: %s (%s), want %s with '%s'", what, nb_status_name(st), err, nb_status_name(want), part ? part : "");
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
    CHECK(nb_gguf_open_memory(NULL, 4, "x", &g, NULL, 0) == NB_ERR_NULL_POINTER, "NULL data");
    CHECK(nb_gguf_open(NULL, &g, NULL, 0) == NB_ERR_NULL_POINTER && nb_gguf_close(NULL) == NB_OK, "NULL path");
    CHECK(!strcmp(nb_ggml_type_name(39), "MXFP4") && !nb_ggml_type_name(36) && !nb_ggml_type_name(1000),
          "type names");
}

/* ------------------------------------------------------------ cross-check */

/* Every MXFP4/NVFP4 tensor of `path` (a file written by the gguf Python
 * package), in file order, against `want` (float32, concatenated). */
static int crosscheck(const char *path, const char *want_path) {
    nb_gguf_file *g = NULL;
    char err[512] = "";
    nb_status st = nb_gguf_open(path, &g, err, sizeof err);
    CHECK(st == NB_OK, "open %s: %s", path, err);
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
        if (nb_gguf_fp4_info(g, i, &fp, NULL, 0) != NB_OK) continue;
        nb_gguf_tensor t;
        nb_gguf_tensor_at(g, i, &t);
        for (int64_t e = 0; e < (fp.experts ? fp.experts : 1); e++) {
            uint8_t *c = (uint8_t *)malloc(fp.codes_bytes), *s = (uint8_t *)malloc(fp.scales_bytes);
            size_t nel = (size_t)(fp.n * fp.k);
            float *y = (float *)malloc(nel * 4), *w = (float *)malloc(nel * 4);
            nb_weight_desc d;
            st = nb_gguf_fp4_to_checkpoint(g, i, e, &d, c, fp.codes_bytes, s, fp.scales_bytes, NULL, err, sizeof err);
            CHECK(st == NB_OK, "%s: %s", t.name, err);
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
    test_known_answers();
    test_malformed();
    printf("%d passed, %d failed\n", g_pass, g_fail);
    return g_fail ? 1 : 0;
}
