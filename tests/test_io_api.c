/* test_io_api.c - every public function of nibble_io.h fed bad input
 * returns its documented status and leaves a fresh, non-empty message in
 * nb_last_error() (the thread-local buffer the core library uses too).
 *
 * "Fresh" as in test_api.c: before each failing call the thread-local
 * message is primed with a marker from a different failure; afterwards
 * nb_last_error() must differ from it (a second marker is tried when the
 * call's own message equals the first).  So a path that returns an error
 * without recording why is caught.
 *
 * Also: nb_io_struct_size agrees with sizeof for every public struct; the
 * _init functions zero the reserved fields and options with reserved fields
 * set are refused; name lookups of every valid value succeed.
 *
 *   test_io_api [DIR]   fixtures in DIR (default: a temporary directory)
 *
 * Output: one line per failed check, then "N passed, M failed". */
#define _POSIX_C_SOURCE 200809L
#include <nibble.h>
#include <nibble_io.h>

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include "check.h"

/* ---------------------------------------------------- fresh-message check */

static char g_marker[1024];

static void prime(int which) {
    size_t bytes;
    if (which == 1) nb_io_struct_size("no such struct", &bytes);
    else nb_st_dtype_parse("NO_SUCH_DTYPE", (nb_st_dtype *)&bytes);
    snprintf(g_marker, sizeof g_marker, "%s", nb_last_error());
}

static int fresh(void) { return nb_last_error()[0] && strcmp(nb_last_error(), g_marker); }

/* EXPECT(want, call): the status, and a fresh message when it fails. */
#define EXPECT(want_, call_)                                                                               \
    do {                                                                                                   \
        prime(1);                                                                                          \
        nb_status st_ = (call_);                                                                           \
        int fr_ = fresh();                                                                                 \
        if (st_ != NB_OK && !fr_) {                                                                        \
            prime(2);                                                                                      \
            st_ = (call_);                                                                                 \
            fr_ = fresh();                                                                                 \
        }                                                                                                  \
        CHECK(st_ == (want_) && ((want_) == NB_OK || fr_), "%s: returned %s, want %s%s (\"%s\")", #call_, \
              nb_status_name(st_), nb_status_name(want_), fr_ || st_ == NB_OK ? "" : "; message not recorded", \
              nb_last_error());                                                                            \
    } while (0)

/* ---------------------------------------------------------------- fixtures */

static char g_dir[512];

/* One ModelOpt NVFP4 layer "proj" (32 x 64, quantized here) and one BF16
 * linear "lm" in g_dir/one.safetensors; returns 1 on success. */
static int write_fixture(char *path, size_t n) {
    enum { N = 32, K = 64 };
    static float w[N * K];
    static unsigned char codes[N * K / 2], scales[N * K / 16];
    static uint16_t lm[4 * 16];
    for (int i = 0; i < N * K; i++) w[i] = (float)((i * 37 % 101) - 50) / 50.0f;
    nb_context *ctx = NULL;
    nb_weight_desc d;
    if (nb_context_create(NB_DEVICE_NONE, &ctx) != NB_OK || nb_weight_desc_init(&d, NB_FORMAT_NVFP4, N, K) != NB_OK ||
        nb_quantize_host(ctx, &d, NB_DTYPE_F32, w, codes, scales) != NB_OK) {
        printf("fixture: %s\n", nb_last_error());
        nb_context_destroy(ctx);
        return 0;
    }
    nb_context_destroy(ctx);
    nb_st_tensor t[4] = {
        {.name = "proj.weight", .dtype = NB_ST_U8, .rank = 2, .shape = {N, K / 2}, .data = codes, .bytes = sizeof codes},
        {.name = "proj.weight_scale", .dtype = NB_ST_F8_E4M3, .rank = 2, .shape = {N, K / 16}, .data = scales,
         .bytes = sizeof scales},
        {.name = "proj.weight_scale_2", .dtype = NB_ST_F32, .rank = 0, .data = &d.tensor_scale, .bytes = 4},
        {.name = "lm.weight", .dtype = NB_ST_BF16, .rank = 2, .shape = {4, 16}, .data = lm, .bytes = sizeof lm},
    };
    snprintf(path, n, "%s/one.safetensors", g_dir);
    nb_status st = nb_st_write(path, t, 4, NULL, 0);
    CHECK(st == NB_OK, "write the fixture: %s", nb_last_error());
    return st == NB_OK;
}

/* The smallest valid GGUF file: header only, no key, no tensor. */
static const uint8_t k_empty_gguf[24] = {'G', 'G', 'U', 'F', 3, 0, 0, 0};

/* ------------------------------------------------------------------ tests */

static void test_struct_sizes(void) {
    static const struct {
        const char *name;
        size_t size;
    } k[] = {
        {"nb_st_tensor", sizeof(nb_st_tensor)},
        {"nb_ckpt_layer", sizeof(nb_ckpt_layer)},
        {"nb_ckpt_config", sizeof(nb_ckpt_config)},
        {"nb_ckpt_quantize_opts", sizeof(nb_ckpt_quantize_opts)},
        {"nb_ckpt_quantize_summary", sizeof(nb_ckpt_quantize_summary)},
        {"nb_ckpt_convert_opts", sizeof(nb_ckpt_convert_opts)},
        {"nb_ckpt_convert_summary", sizeof(nb_ckpt_convert_summary)},
        {"nb_gguf_kv", sizeof(nb_gguf_kv)},
        {"nb_gguf_tensor", sizeof(nb_gguf_tensor)},
        {"nb_gguf_header", sizeof(nb_gguf_header)},
        {"nb_gguf_fp4", sizeof(nb_gguf_fp4)},
        {"nb_ckpt_moe", sizeof(nb_ckpt_moe)},
    };
    for (size_t i = 0; i < sizeof k / sizeof k[0]; i++) {
        size_t got = 0;
        CHECK(nb_io_struct_size(k[i].name, &got) == NB_OK && got == k[i].size, "nb_io_struct_size(%s) = %zu, want %zu",
              k[i].name, got, k[i].size);
    }
    size_t b;
    EXPECT(NB_ERR_NOT_FOUND, nb_io_struct_size("nb_weight_desc", &b)); /* nibble.h's: not this header's */
    EXPECT(NB_ERR_NULL_POINTER, nb_io_struct_size(NULL, &b));
    EXPECT(NB_ERR_NULL_POINTER, nb_io_struct_size("nb_st_tensor", NULL));
}

static void test_names(void) {
    const char *s = NULL;
    nb_st_dtype dt;
    int bits;
    for (int v = NB_ST_BOOL; v <= NB_ST_F6_E3M2; v++) {
        CHECK(nb_st_dtype_info((nb_st_dtype)v, &s, &bits) == NB_OK && nb_st_dtype_parse(s, &dt) == NB_OK && (int)dt == v,
              "dtype %d round trip", v);
    }
    EXPECT(NB_ERR_INVALID_ARGUMENT, nb_st_dtype_info((nb_st_dtype)0, &s, &bits));
    EXPECT(NB_ERR_INVALID_ARGUMENT, nb_st_dtype_info((nb_st_dtype)99, NULL, NULL));
    EXPECT(NB_ERR_NOT_FOUND, nb_st_dtype_parse("bf16", &dt)); /* names are upper case */
    EXPECT(NB_ERR_NULL_POINTER, nb_st_dtype_parse(NULL, &dt));
    EXPECT(NB_ERR_NULL_POINTER, nb_st_dtype_parse("BF16", NULL));

    for (int v = NB_CKPT_NONE; v <= NB_CKPT_HQQ_INT4; v++)
        CHECK(nb_ckpt_format_name((nb_ckpt_format)v, &s) == NB_OK && s[0], "nb_ckpt_format_name(%d)", v);
    EXPECT(NB_ERR_INVALID_ARGUMENT, nb_ckpt_format_name((nb_ckpt_format)(NB_CKPT_HQQ_INT4 + 1), &s));
    EXPECT(NB_ERR_INVALID_ARGUMENT, nb_ckpt_format_name((nb_ckpt_format)-1, &s));
    EXPECT(NB_ERR_NULL_POINTER, nb_ckpt_format_name(NB_CKPT_NONE, NULL));
    for (int v = NB_CKPT_SRC_TENSORS; v <= NB_CKPT_SRC_CONFIG_JSON; v++)
        CHECK(nb_ckpt_source_name((nb_ckpt_source)v, &s) == NB_OK && s[0], "nb_ckpt_source_name(%d)", v);
    EXPECT(NB_ERR_INVALID_ARGUMENT, nb_ckpt_source_name((nb_ckpt_source)3, &s));
    EXPECT(NB_ERR_NULL_POINTER, nb_ckpt_source_name(NB_CKPT_SRC_TENSORS, NULL));

    nb_format f = (nb_format)0;
    CHECK(nb_ckpt_format_weight(NB_CKPT_CT_NVFP4, &f) == NB_OK && f == NB_FORMAT_NVFP4, "ct-nvfp4 holds nvfp4");
    CHECK(nb_ckpt_format_weight(NB_CKPT_GPTOSS_MXFP4, &f) == NB_OK && f == NB_FORMAT_MXFP4, "gptoss holds mxfp4");
    static const nb_format conv_formats[8] = {NB_FORMAT_INT4, NB_FORMAT_INT4, NB_FORMAT_INT4, NB_FORMAT_INT4_SYM,
                                              NB_FORMAT_INT8, NB_FORMAT_NF4, NB_FORMAT_BNB_FP4, NB_FORMAT_INT8};
    for (int v = NB_CKPT_AWQ_INT4; v <= NB_CKPT_GPTQ_INT8; v++)
        CHECK(nb_ckpt_format_weight((nb_ckpt_format)v, &f) == NB_OK && f == conv_formats[v - NB_CKPT_AWQ_INT4],
              "layout %d holds format %d", v, (int)f);
    EXPECT(NB_ERR_UNSUPPORTED, nb_ckpt_format_weight(NB_CKPT_NONE, &f));
    EXPECT(NB_ERR_UNSUPPORTED, nb_ckpt_format_weight(NB_CKPT_INCONSISTENT, &f));
    EXPECT(NB_ERR_INVALID_ARGUMENT, nb_ckpt_format_weight((nb_ckpt_format)40, &f));
    EXPECT(NB_ERR_NULL_POINTER, nb_ckpt_format_weight(NB_CKPT_CT_NVFP4, NULL));

    nb_ckpt_device dev;
    for (int v = NB_CKPT_DEVICE_AUTO; v <= NB_CKPT_DEVICE_GPU; v++)
        CHECK(nb_ckpt_device_name((nb_ckpt_device)v, &s) == NB_OK && nb_ckpt_device_parse(s, &dev) == NB_OK && (int)dev == v,
              "device %d round trip", v);
    EXPECT(NB_ERR_INVALID_ARGUMENT, nb_ckpt_device_name((nb_ckpt_device)3, &s));
    EXPECT(NB_ERR_NULL_POINTER, nb_ckpt_device_name(NB_CKPT_DEVICE_CPU, NULL));
    EXPECT(NB_ERR_NOT_FOUND, nb_ckpt_device_parse("tpu", &dev));
    EXPECT(NB_ERR_NULL_POINTER, nb_ckpt_device_parse(NULL, &dev));

    nb_ckpt_target tg;
    for (int v = NB_CKPT_TARGET_MODELOPT; v <= NB_CKPT_TARGET_QUARK; v++)
        CHECK(nb_ckpt_target_name((nb_ckpt_target)v, &s) == NB_OK && nb_ckpt_target_parse(s, &tg) == NB_OK && (int)tg == v,
              "target %d round trip", v);
    EXPECT(NB_ERR_INVALID_ARGUMENT, nb_ckpt_target_name((nb_ckpt_target)0, &s));
    EXPECT(NB_ERR_NULL_POINTER, nb_ckpt_target_name(NB_CKPT_TARGET_CT, NULL));
    EXPECT(NB_ERR_NOT_FOUND, nb_ckpt_target_parse("gguf", &tg));
    EXPECT(NB_ERR_NULL_POINTER, nb_ckpt_target_parse("ct", NULL));

    int64_t block, bytes;
    CHECK(nb_ggml_type_name(NB_GGML_TYPE_NVFP4, &s) == NB_OK && !strcmp(s, "NVFP4"), "ggml type 40");
    CHECK(nb_ggml_type_size(NB_GGML_TYPE_MXFP4, &block, &bytes) == NB_OK && block == 32 && bytes == 17,
          "ggml MXFP4 block");
    CHECK(nb_ggml_type_format(NB_GGML_TYPE_MXFP4, &f) == NB_OK && f == NB_FORMAT_MXFP4 &&
              nb_ggml_type_format(NB_GGML_TYPE_NVFP4, &f) == NB_OK && f == NB_FORMAT_NVFP4,
          "ggml types 39 and 40 import as MXFP4 and NVFP4");
    EXPECT(NB_ERR_NOT_FOUND, nb_ggml_type_name(4, &s)); /* retired */
    EXPECT(NB_ERR_NULL_POINTER, nb_ggml_type_name(0, NULL));
    EXPECT(NB_ERR_NOT_FOUND, nb_ggml_type_size(1000, &block, &bytes));
    EXPECT(NB_ERR_UNSUPPORTED, nb_ggml_type_format(NB_GGML_TYPE_BF16, &f));
    EXPECT(NB_ERR_UNSUPPORTED, nb_ggml_type_format(1000, &f));
    EXPECT(NB_ERR_NULL_POINTER, nb_ggml_type_format(NB_GGML_TYPE_NVFP4, NULL));
    for (int v = NB_GGUF_UINT8; v <= NB_GGUF_FLOAT64; v++)
        CHECK(nb_gguf_vtype_name((nb_gguf_vtype)v, &s) == NB_OK && s[0], "nb_gguf_vtype_name(%d)", v);
    EXPECT(NB_ERR_INVALID_ARGUMENT, nb_gguf_vtype_name((nb_gguf_vtype)13, &s));
    EXPECT(NB_ERR_NULL_POINTER, nb_gguf_vtype_name(NB_GGUF_STRING, NULL));
}

static void test_safetensors(const char *path) {
    nb_st_file *f = NULL;
    nb_st_tensor t;
    size_t n;
    const char *k, *v;
    char missing[600];
    snprintf(missing, sizeof missing, "%s/missing.safetensors", g_dir);
    EXPECT(NB_ERR_IO, nb_st_open(missing, &f));
    EXPECT(NB_ERR_NULL_POINTER, nb_st_open(NULL, &f));
    EXPECT(NB_ERR_NULL_POINTER, nb_st_open(path, NULL));
    EXPECT(NB_ERR_CORRUPT, nb_st_open_memory("1234", 4, "tiny", &f));
    EXPECT(NB_ERR_NULL_POINTER, nb_st_open_memory(NULL, 8, "x", &f));
    EXPECT(NB_ERR_NULL_POINTER, nb_st_open_memory("12345678", 8, "x", NULL));
    CHECK(nb_st_close(NULL) == NB_OK, "nb_st_close(NULL)");
    if (nb_st_open(path, &f) != NB_OK) {
        CHECK(0, "open %s: %s", path, nb_last_error());
        return;
    }
    EXPECT(NB_ERR_NULL_POINTER, nb_st_count(NULL, &n));
    EXPECT(NB_ERR_NULL_POINTER, nb_st_count(f, NULL));
    EXPECT(NB_ERR_NOT_FOUND, nb_st_tensor_at(f, 4, &t));
    EXPECT(NB_ERR_NULL_POINTER, nb_st_tensor_at(f, 0, NULL));
    EXPECT(NB_ERR_NOT_FOUND, nb_st_tensor_find(f, "nope", &t));
    EXPECT(NB_ERR_NULL_POINTER, nb_st_tensor_find(f, NULL, &t));
    EXPECT(NB_ERR_NULL_POINTER, nb_st_metadata_count(NULL, &n));
    EXPECT(NB_ERR_NOT_FOUND, nb_st_metadata_at(f, 1, &k, &v)); /* one entry: "format" */
    EXPECT(NB_ERR_NULL_POINTER, nb_st_metadata_at(NULL, 0, &k, &v));
    EXPECT(NB_ERR_NOT_FOUND, nb_st_metadata_get(f, "producer", &v));
    EXPECT(NB_ERR_NULL_POINTER, nb_st_metadata_get(f, "format", NULL));
    CHECK(nb_st_tensor_at(f, 0, &t) == NB_OK && t.reserved[0] == 0 && t.reserved[3] == 0, "reader zeroes reserved");
    nb_st_close(f);

    /* the writer: reserved fields, names, sizes */
    char out[600];
    snprintf(out, sizeof out, "%s/w.safetensors", g_dir);
    float x = 1.0f;
    nb_st_tensor w = {.name = "x", .dtype = NB_ST_F32, .rank = 0, .data = &x, .bytes = 4};
    w.reserved[2] = 1;
    EXPECT(NB_ERR_INVALID_ARGUMENT, nb_st_write(out, &w, 1, NULL, 0));
    w.reserved[2] = 0;
    EXPECT(NB_OK, nb_st_write(out, &w, 1, NULL, 0));
    w.bytes = 8;
    EXPECT(NB_ERR_INVALID_ARGUMENT, nb_st_write(out, &w, 1, NULL, 0));
    EXPECT(NB_ERR_NULL_POINTER, nb_st_write(NULL, &w, 1, NULL, 0));
    EXPECT(NB_ERR_NULL_POINTER, nb_st_write(out, NULL, 1, NULL, 0));
    EXPECT(NB_ERR_NULL_POINTER, nb_st_write(out, &w, 0, NULL, 1));

    /* the sharded index */
    nb_st_index *x_ = NULL;
    EXPECT(NB_ERR_IO, nb_st_index_open(missing, &x_));
    EXPECT(NB_ERR_IO, nb_st_index_open(g_dir, &x_)); /* a directory without model.safetensors.index.json */
    EXPECT(NB_ERR_NULL_POINTER, nb_st_index_open(NULL, &x_));
    EXPECT(NB_ERR_NULL_POINTER, nb_st_index_open(g_dir, NULL));
    CHECK(nb_st_index_close(NULL) == NB_OK, "nb_st_index_close(NULL)");
    EXPECT(NB_ERR_NULL_POINTER, nb_st_index_count(NULL, &n));
    EXPECT(NB_ERR_NULL_POINTER, nb_st_index_tensor_at(NULL, 0, &t));
    EXPECT(NB_ERR_NULL_POINTER, nb_st_index_tensor_find(NULL, "x", &t));
    EXPECT(NB_ERR_NULL_POINTER, nb_st_index_shard_count(NULL, &n));
    EXPECT(NB_ERR_NULL_POINTER, nb_st_index_shard_at(NULL, 0, &k, NULL));
}

static void test_checkpoint(const char *path) {
    nb_ckpt *c = NULL;
    char missing[600];
    snprintf(missing, sizeof missing, "%s/missing", g_dir);
    EXPECT(NB_ERR_IO, nb_ckpt_open(missing, &c));
    EXPECT(NB_ERR_NULL_POINTER, nb_ckpt_open(NULL, &c));
    EXPECT(NB_ERR_NULL_POINTER, nb_ckpt_open(path, NULL));
    CHECK(nb_ckpt_close(NULL) == NB_OK, "nb_ckpt_close(NULL)");
    if (nb_ckpt_open(path, &c) != NB_OK) {
        CHECK(0, "open %s: %s", path, nb_last_error());
        return;
    }
    size_t n, idx;
    uint64_t bytes;
    int64_t layer;
    int sharded, usable;
    const char *p, *w, *name;
    const nb_st_file *sf;
    nb_st_tensor t;
    nb_ckpt_layer L;
    nb_ckpt_config cfg;
    nb_weight_desc d;
    const uint8_t *codes, *scales;
    CHECK(nb_ckpt_layer_count(c, &n) == NB_OK && n == 2, "two layers, %zu", n);
    EXPECT(NB_ERR_NULL_POINTER, nb_ckpt_file_count(NULL, &n));
    EXPECT(NB_ERR_NOT_FOUND, nb_ckpt_file_at(c, 1, &p, &bytes));
    EXPECT(NB_ERR_NULL_POINTER, nb_ckpt_file_at(NULL, 0, &p, &bytes));
    EXPECT(NB_ERR_NULL_POINTER, nb_ckpt_tensor_count(c, NULL));
    EXPECT(NB_ERR_NOT_FOUND, nb_ckpt_tensor_at(c, 4, &t, &layer));
    EXPECT(NB_ERR_NULL_POINTER, nb_ckpt_tensor_at(c, 0, NULL, &layer));
    EXPECT(NB_ERR_NOT_FOUND, nb_ckpt_tensor_find(c, "proj", &idx));
    EXPECT(NB_ERR_NULL_POINTER, nb_ckpt_tensor_find(c, NULL, &idx));
    EXPECT(NB_ERR_NULL_POINTER, nb_ckpt_shard_count(NULL, &n, &sharded));
    EXPECT(NB_ERR_NOT_FOUND, nb_ckpt_shard_at(c, 1, &name, &sf));
    EXPECT(NB_ERR_NULL_POINTER, nb_ckpt_shard_at(c, 0, NULL, &sf));
    EXPECT(NB_ERR_NULL_POINTER, nb_ckpt_get_dir(c, NULL));
    EXPECT(NB_ERR_NULL_POINTER, nb_ckpt_layer_count(NULL, &n));
    EXPECT(NB_ERR_NOT_FOUND, nb_ckpt_layer_at(c, 2, &L));
    EXPECT(NB_ERR_NULL_POINTER, nb_ckpt_layer_at(c, 0, NULL));
    EXPECT(NB_ERR_NOT_FOUND, nb_ckpt_layer_find(c, "proj.weight", &idx));
    EXPECT(NB_ERR_NULL_POINTER, nb_ckpt_layer_find(c, "proj", NULL));
    EXPECT(NB_ERR_NULL_POINTER, nb_ckpt_get_config(NULL, &cfg));
    EXPECT(NB_ERR_NOT_FOUND, nb_ckpt_exclude_at(c, 0, &p, &w, &usable)); /* no config: no entries */
    EXPECT(NB_ERR_NULL_POINTER, nb_ckpt_exclude_at(c, 0, NULL, &w, &usable));
    CHECK(nb_ckpt_get_config(c, &cfg) == NB_OK && cfg.reserved[0] == 0 && cfg.reserved[7] == 0, "config reserved");
    size_t lm = 9, proj = 9;
    CHECK(nb_ckpt_layer_find(c, "lm", &lm) == NB_OK && nb_ckpt_layer_find(c, "proj", &proj) == NB_OK, "layers found");
    CHECK(nb_ckpt_layer_at(c, proj, &L) == NB_OK && L.format == NB_CKPT_MODELOPT_NVFP4 && L.reserved[0] == 0,
          "proj is modelopt-nvfp4");
    EXPECT(NB_ERR_UNSUPPORTED, nb_ckpt_layer_weight(c, lm, 0, &d, &codes, &scales)); /* BF16: no 4-bit weight */
    EXPECT(NB_ERR_INVALID_ARGUMENT, nb_ckpt_layer_weight(c, proj, 1, &d, &codes, &scales)); /* dense: expert 0 */
    EXPECT(NB_ERR_NOT_FOUND, nb_ckpt_layer_weight(c, 2, 0, &d, &codes, &scales));
    EXPECT(NB_ERR_NULL_POINTER, nb_ckpt_layer_weight(c, proj, 0, &d, NULL, &scales));
    EXPECT(NB_OK, nb_ckpt_layer_weight(c, proj, 0, &d, &codes, &scales));
    /* _v2: copies into the caller's buffers (every layout; this one is zero-copy too) */
    {
        uint8_t cb[4096], sb[512];
        int32_t perm[256];
        static int sentinel;
        nb_weight_sizes_v2 cap = {.codes_bytes = sizeof cb, .scales_bytes = sizeof sb};
        nb_weight_buffers out = {.codes = cb, .scales = sb}, bad;
        nb_weight_desc d2;
        EXPECT(NB_OK, nb_ckpt_layer_weight_v2(c, proj, 0, &d2, NULL, NULL));
        CHECK(!memcmp(&d2, &d, sizeof d), "v2 descriptor = v1 descriptor");
        EXPECT(NB_OK, nb_ckpt_layer_weight_v2(c, proj, 0, &d2, &out, &cap));
        nb_weight_sizes sz;
        CHECK(nb_weight_get_sizes(&d, &sz) == NB_OK && !memcmp(cb, codes, sz.codes_bytes) &&
                  !memcmp(sb, scales, sz.scales_bytes),
              "v2 copies the bytes v1 points at");
        EXPECT(NB_ERR_NULL_POINTER, nb_ckpt_layer_weight_v2(NULL, proj, 0, &d2, NULL, NULL));
        EXPECT(NB_ERR_NULL_POINTER, nb_ckpt_layer_weight_v2(c, proj, 0, NULL, NULL, NULL));
        EXPECT(NB_ERR_NULL_POINTER, nb_ckpt_layer_weight_v2(c, proj, 0, &d2, &out, NULL));
        EXPECT(NB_ERR_NOT_FOUND, nb_ckpt_layer_weight_v2(c, 2, 0, &d2, NULL, NULL));
        EXPECT(NB_ERR_UNSUPPORTED, nb_ckpt_layer_weight_v2(c, lm, 0, &d2, NULL, NULL));
        EXPECT(NB_ERR_INVALID_ARGUMENT, nb_ckpt_layer_weight_v2(c, proj, 1, &d2, NULL, NULL));
        bad = out, bad.codes = NULL;
        EXPECT(NB_ERR_NULL_POINTER, nb_ckpt_layer_weight_v2(c, proj, 0, &d2, &bad, &cap));
        bad = out, bad.zeros = sb;
        EXPECT(NB_ERR_INVALID_ARGUMENT, nb_ckpt_layer_weight_v2(c, proj, 0, &d2, &bad, &cap));
        bad = out, bad.reserved[2] = &sentinel;
        EXPECT(NB_ERR_INVALID_ARGUMENT, nb_ckpt_layer_weight_v2(c, proj, 0, &d2, &bad, &cap));
        nb_weight_sizes_v2 small = cap;
        small.scales_bytes = 1;
        EXPECT(NB_ERR_BUFFER_TOO_SMALL, nb_ckpt_layer_weight_v2(c, proj, 0, &d2, &out, &small));
        /* the permutation: the identity for a layer whose k is not reordered */
        CHECK(L.k_permuted == 0 && L.k <= 256, "proj: k_permuted 0");
        EXPECT(NB_OK, nb_ckpt_layer_perm(c, proj, perm, 256));
        int ident = 1;
        for (int64_t j = 0; j < L.k; j++) ident &= perm[j] == j;
        CHECK(ident, "identity permutation");
        EXPECT(NB_ERR_BUFFER_TOO_SMALL, nb_ckpt_layer_perm(c, proj, perm, (size_t)L.k - 1));
        EXPECT(NB_ERR_NULL_POINTER, nb_ckpt_layer_perm(c, proj, NULL, 256));
        EXPECT(NB_ERR_NULL_POINTER, nb_ckpt_layer_perm(NULL, proj, perm, 256));
        EXPECT(NB_ERR_NOT_FOUND, nb_ckpt_layer_perm(c, 2, perm, 256));
    }
    nb_ckpt_close(c);
}

static void test_quantize_convert(const char *path) {
    nb_ckpt_quantize_opts q;
    nb_ckpt_convert_opts v;
    nb_ckpt_quantize_summary qs;
    nb_ckpt_convert_summary cs;
    char out[600];
    snprintf(out, sizeof out, "%s/out", g_dir);
    EXPECT(NB_ERR_NULL_POINTER, nb_ckpt_quantize_opts_init(NULL));
    {
        nb_format qf[8];
        size_t qn = 0;
        EXPECT(NB_ERR_NULL_POINTER, nb_ckpt_quantize_formats(NULL, 2, &qn));
        EXPECT(NB_ERR_NULL_POINTER, nb_ckpt_quantize_formats(qf, 8, NULL));
        CHECK(nb_ckpt_quantize_formats(NULL, 0, &qn) == NB_OK && qn == 8, "quantize formats: %zu", qn);
        CHECK(nb_ckpt_quantize_formats(qf, 8, &qn) == NB_OK && qf[0] == NB_FORMAT_NVFP4 && qf[1] == NB_FORMAT_MXFP4 &&
                  qf[2] == NB_FORMAT_INT4 && qf[3] == NB_FORMAT_INT4_SYM && qf[4] == NB_FORMAT_INT8 &&
                  qf[5] == NB_FORMAT_NF4 && qf[6] == NB_FORMAT_BNB_FP4 && qf[7] == NB_FORMAT_INT4_HQQ,
              "quantize formats: nvfp4, mxfp4, int4, int4_sym, int8, nf4, bnb_fp4, int4_hqq");
        CHECK(nb_ckpt_quantize_formats(qf, 1, &qn) == NB_OK && qn == 8 && qf[0] == NB_FORMAT_NVFP4,
              "quantize formats: max 1 writes one, counts all");
    }
    EXPECT(NB_ERR_NULL_POINTER, nb_ckpt_convert_opts_init(NULL));
    memset(&q, 0x5A, sizeof q);
    memset(&v, 0x5A, sizeof v);
    CHECK(nb_ckpt_quantize_opts_init(&q) == NB_OK && q.allow_empty == 0 && q.method == NB_QUANT_RTN && q.reserved[0] == 0 &&
              q.reserved[2] == 0 && q.group_size == 0 && q.scale_type == 0 && q.fused_scales == 1 && !q.exclude,
          "quantize opts init");
    CHECK(nb_ckpt_convert_opts_init(&v) == NB_OK && v.reserved[0] == 0 && v.reserved[7] == 0 && !v.warn,
          "convert opts init");

    EXPECT(NB_ERR_NULL_POINTER, nb_ckpt_quantize(NULL, out, &q, &qs));
    EXPECT(NB_ERR_NULL_POINTER, nb_ckpt_quantize(path, out, NULL, &qs));
    q.reserved[2] = 1;
    EXPECT(NB_ERR_INVALID_ARGUMENT, nb_ckpt_quantize(path, out, &q, &qs));
    q.reserved[2] = 0;
    q.fused_scales = 2;
    EXPECT(NB_ERR_INVALID_ARGUMENT, nb_ckpt_quantize(path, out, &q, &qs));
    q.fused_scales = 1;
    /* group and scale type: the integer formats' choices, refused for the FP4 ones */
    q.group_size = 64;
    EXPECT(NB_ERR_INVALID_ARGUMENT, nb_ckpt_quantize(path, out, &q, &qs));
    q.group_size = 0;
    q.scale_type = NB_SCALE_BF16;
    EXPECT(NB_ERR_INVALID_ARGUMENT, nb_ckpt_quantize(path, out, &q, &qs));
    q.scale_type = 0;
    q.format = NB_FORMAT_INT4;
    {
        static const int32_t bad_groups[] = {16, 48, 256, -2, 8192, 1 << 30};
        for (size_t i = 0; i < sizeof bad_groups / sizeof bad_groups[0]; i++) {
            q.group_size = bad_groups[i];
            EXPECT(NB_ERR_INVALID_ARGUMENT, nb_ckpt_quantize(path, out, &q, &qs));
        }
        q.group_size = 0;
        static const int32_t bad_scales[] = {NB_SCALE_E4M3, NB_SCALE_E8M0, NB_SCALE_F32, 9, -1};
        for (size_t i = 0; i < sizeof bad_scales / sizeof bad_scales[0]; i++) {
            q.scale_type = bad_scales[i];
            EXPECT(NB_ERR_INVALID_ARGUMENT, nb_ckpt_quantize(path, out, &q, &qs));
        }
        q.scale_type = 0;
    }
    q.method = NB_QUANT_MSE; /* the MSE search serves the FP4 formats */
    EXPECT(NB_ERR_UNSUPPORTED, nb_ckpt_quantize(path, out, &q, &qs));
    q.method = NB_QUANT_RTN;
    q.device = NB_CKPT_DEVICE_GPU; /* no device quantizer for the integer formats */
    EXPECT(NB_ERR_UNSUPPORTED, nb_ckpt_quantize(path, out, &q, &qs));
    q.device = NB_CKPT_DEVICE_AUTO;
    q.format = NB_FORMAT_INT8; /* no layout is written for it */
    EXPECT(NB_ERR_UNSUPPORTED, nb_ckpt_quantize(path, out, &q, &qs));
    q.format = NB_FORMAT_NVFP4;
    q.format = (nb_format)0; /* not a format of the table */
    EXPECT(NB_ERR_INVALID_ARGUMENT, nb_ckpt_quantize(path, out, &q, &qs));
    q.format = NB_FORMAT_MXFP4;
    q.mx_rule = (nb_mx_scale_rule)7;
    EXPECT(NB_ERR_INVALID_ARGUMENT, nb_ckpt_quantize(path, out, &q, &qs));
    q.mx_rule = NB_MX_SCALE_EVEN;
    q.device = (nb_ckpt_device)5;
    EXPECT(NB_ERR_INVALID_ARGUMENT, nb_ckpt_quantize(path, out, &q, &qs));
    q.device = NB_CKPT_DEVICE_CPU;
    q.allow_empty = 2;
    EXPECT(NB_ERR_INVALID_ARGUMENT, nb_ckpt_quantize(path, out, &q, &qs));
    q.allow_empty = 0;
    q.nexclude = 1;
    EXPECT(NB_ERR_NULL_POINTER, nb_ckpt_quantize(path, out, &q, &qs));
    q.nexclude = 0;
    CHECK(access(out, F_OK) != 0, "refused quantizations leave no OUT");

    EXPECT(NB_ERR_NULL_POINTER, nb_ckpt_convert(path, NULL, &v, &cs));
    EXPECT(NB_ERR_NULL_POINTER, nb_ckpt_convert(path, out, NULL, &cs));
    v.reserved[1] = -1;
    EXPECT(NB_ERR_INVALID_ARGUMENT, nb_ckpt_convert(path, out, &v, &cs));
    v.reserved[1] = 0;
    v.target = (nb_ckpt_target)4;
    EXPECT(NB_ERR_INVALID_ARGUMENT, nb_ckpt_convert(path, out, &v, &cs));
    v.target = NB_CKPT_TARGET_QUARK; /* an NVFP4 layer: the Quark layout holds MXFP4 only */
    EXPECT(NB_ERR_UNSUPPORTED, nb_ckpt_convert(path, out, &v, &cs));
    CHECK(access(out, F_OK) != 0, "refused conversions leave no OUT");
    v.target = NB_CKPT_TARGET_CT;
    EXPECT(NB_OK, nb_ckpt_convert(path, out, &v, &cs));
    CHECK(cs.layers_converted == 1 && cs.reserved[0] == 0, "convert to ct: %zu layers", cs.layers_converted);
}

/* Inputs that are not regular files are refused by name without blocking
 * (a FIFO opened for reading would wait for a writer; SIGALRM fails the test
 * instead of hanging it), and a message about a very long path keeps its
 * reason. */
static void test_inputs(const char *path) {
    alarm(60);
    char fifo[600], sock[600], dir[600], p[700], out[600];
    snprintf(fifo, sizeof fifo, "%s/fifo.safetensors", g_dir);
    snprintf(sock, sizeof sock, "%s/sock.safetensors", g_dir);
    snprintf(dir, sizeof dir, "%s/fifo_config", g_dir);
    snprintf(out, sizeof out, "%s/out_fifo", g_dir);
    CHECK(mkfifo(fifo, 0644) == 0, "mkfifo %s", fifo);
    nb_st_file *f = NULL;
    nb_st_index *x = NULL;
    nb_ckpt *c = NULL;
    nb_gguf_file *g = NULL;
    nb_context *ctx = NULL;
    nb_ckpt_quantize_opts q;
    nb_ckpt_convert_opts v;
    nb_ckpt_quantize_opts_init(&q);
    nb_ckpt_convert_opts_init(&v);
    EXPECT(NB_ERR_IO, nb_st_open(fifo, &f));
    CHECK(strstr(nb_last_error(), "not a regular file (a FIFO)") != NULL, "FIFO named: %s", nb_last_error());
    EXPECT(NB_ERR_IO, nb_st_index_open(fifo, &x));
    EXPECT(NB_ERR_IO, nb_ckpt_open(fifo, &c));
    EXPECT(NB_ERR_IO, nb_gguf_open(fifo, &g));
    EXPECT(NB_ERR_IO, nb_ckpt_quantize(fifo, out, &q, NULL));
    EXPECT(NB_ERR_IO, nb_ckpt_convert(fifo, out, &v, NULL));
    CHECK(access(out, F_OK) != 0, "a FIFO input left an OUT");
    if (nb_context_create(NB_DEVICE_NONE, &ctx) == NB_OK) {
        EXPECT(NB_ERR_IO, nb_context_load_tuning(ctx, fifo));
        CHECK(strstr(nb_last_error(), "not a regular file") != NULL, "tuning cache FIFO: %s", nb_last_error());
    }
    /* a FIFO config.json next to a good checkpoint */
    mkdir(dir, 0755);
    snprintf(p, sizeof p, "%s/model.safetensors", dir);
    CHECK(link(path, p) == 0 || symlink(path, p) == 0, "link %s", p);
    snprintf(p, sizeof p, "%s/config.json", dir);
    CHECK(mkfifo(p, 0644) == 0, "mkfifo %s", p);
    EXPECT(NB_ERR_IO, nb_ckpt_open(dir, &c));
    CHECK(strstr(nb_last_error(), "config.json") && strstr(nb_last_error(), "FIFO"), "FIFO config: %s", nb_last_error());
    /* a socket, a character device, a directory */
    const int sfd = socket(AF_UNIX, SOCK_STREAM, 0);
    struct sockaddr_un sa;
    memset(&sa, 0, sizeof sa);
    sa.sun_family = AF_UNIX;
    const int fits = strlen(sock) < sizeof sa.sun_path;
    if (fits) memcpy(sa.sun_path, sock, strlen(sock) + 1);
    if (sfd >= 0 && fits && bind(sfd, (struct sockaddr *)&sa, sizeof sa) == 0) {
        EXPECT(NB_ERR_IO, nb_st_open(sock, &f));
        CHECK(strstr(nb_last_error(), "a socket") != NULL, "socket named: %s", nb_last_error());
        EXPECT(NB_ERR_IO, nb_ckpt_open(sock, &c));
    } else {
        printf("note: no UNIX socket under %s; that case is skipped\n", g_dir);
    }
    if (sfd >= 0) close(sfd);
    EXPECT(NB_ERR_IO, nb_st_open("/dev/null", &f));
    CHECK(strstr(nb_last_error(), "a character device") != NULL, "device named: %s", nb_last_error());
    EXPECT(NB_ERR_IO, nb_gguf_open("/dev/zero", &g));
    EXPECT(NB_ERR_IO, nb_st_open(g_dir, &f));
    CHECK(strstr(nb_last_error(), "a directory") != NULL, "directory named: %s", nb_last_error());
    if (ctx) EXPECT(NB_ERR_IO, nb_context_load_tuning(ctx, "/dev/null"));
    alarm(0);

    /* a path of 5,000 characters: the message keeps its start and its reason */
    static char lp[5200];
    size_t n = (size_t)snprintf(lp, sizeof lp, "%s", g_dir);
    while (n < 5000) n += (size_t)snprintf(lp + n, sizeof lp - n, "/%0200d", 7);
    snprintf(lp + n, sizeof lp - n, "/model.safetensors");
    EXPECT(NB_ERR_IO, nb_st_open(lp, &f));
    const char *m = nb_last_error();
    CHECK(strlen(m) < 512 && !strncmp(m, g_dir, strlen(g_dir)) && strstr(m, "...") &&
              strstr(m, "/model.safetensors: cannot open: File name too long"),
          "long path message: %s", m);
    EXPECT(NB_ERR_IO, nb_ckpt_quantize(lp, out, &q, NULL));
    CHECK(strstr(nb_last_error(), "File name too long") != NULL, "long path, quantize: %s", nb_last_error());
    EXPECT(NB_ERR_IO, nb_ckpt_convert(path, lp, &v, NULL));
    CHECK(strstr(nb_last_error(), "File name too long") != NULL, "long OUT, convert: %s", nb_last_error());
    if (ctx) {
        EXPECT(NB_ERR_IO, nb_context_load_tuning(ctx, lp));
        CHECK(strstr(nb_last_error(), "File name too long") != NULL, "long path, tuning: %s", nb_last_error());
    }
    nb_context_destroy(ctx);
}

static void test_gguf(void) {
    nb_gguf_file *g = NULL;
    nb_gguf_header h;
    nb_gguf_kv kv;
    nb_gguf_tensor t;
    nb_gguf_fp4 f;
    nb_weight_desc d;
    size_t i;
    uint8_t buf[16];
    char missing[600];
    snprintf(missing, sizeof missing, "%s/missing.gguf", g_dir);
    EXPECT(NB_ERR_IO, nb_gguf_open(missing, &g));
    EXPECT(NB_ERR_NULL_POINTER, nb_gguf_open(NULL, &g));
    EXPECT(NB_ERR_CORRUPT, nb_gguf_open_memory("GGUF", 4, "short", &g));
    EXPECT(NB_ERR_NULL_POINTER, nb_gguf_open_memory(k_empty_gguf, sizeof k_empty_gguf, "x", NULL));
    CHECK(nb_gguf_close(NULL) == NB_OK, "nb_gguf_close(NULL)");
    if (nb_gguf_open_memory(k_empty_gguf, sizeof k_empty_gguf, "empty.gguf", &g) != NB_OK) {
        CHECK(0, "the empty GGUF image: %s", nb_last_error());
        return;
    }
    CHECK(nb_gguf_get_header(g, &h) == NB_OK && h.version == 3 && h.n_kv == 0 && h.n_tensors == 0 &&
              h.reserved[0] == 0,
          "empty GGUF header");
    EXPECT(NB_ERR_NULL_POINTER, nb_gguf_get_header(NULL, &h));
    EXPECT(NB_ERR_NOT_FOUND, nb_gguf_kv_at(g, 0, &kv));
    EXPECT(NB_ERR_NULL_POINTER, nb_gguf_kv_at(g, 0, NULL));
    EXPECT(NB_ERR_NOT_FOUND, nb_gguf_kv_find(g, "general.alignment", &kv));
    EXPECT(NB_ERR_NULL_POINTER, nb_gguf_kv_find(g, NULL, &kv));
    EXPECT(NB_ERR_NOT_FOUND, nb_gguf_tensor_at(g, 0, &t));
    EXPECT(NB_ERR_NULL_POINTER, nb_gguf_tensor_at(NULL, 0, &t));
    EXPECT(NB_ERR_NOT_FOUND, nb_gguf_tensor_find(g, "w", &i));
    EXPECT(NB_ERR_NULL_POINTER, nb_gguf_tensor_find(g, "w", NULL));
    EXPECT(NB_ERR_NOT_FOUND, nb_gguf_fp4_info(g, 0, &f));
    EXPECT(NB_ERR_NULL_POINTER, nb_gguf_fp4_info(g, 0, NULL));
    EXPECT(NB_ERR_NOT_FOUND, nb_gguf_fp4_to_checkpoint(g, 0, 0, &d, buf, sizeof buf, buf, sizeof buf, NULL));
    EXPECT(NB_ERR_NULL_POINTER, nb_gguf_fp4_to_checkpoint(g, 0, 0, NULL, buf, sizeof buf, buf, sizeof buf, NULL));
    nb_gguf_close(g);
}

/* Expert groups: a ModelOpt NVFP4 group "moe.experts" (E 2, H 32, I 16), a
 * gpt-oss one "oss.experts" (E 2, H 32, I 32) and an inconsistent one
 * "bad.experts" (expert 1 has no down_proj); no config, so no top_k. */
static void test_moe(void) {
    static uint8_t codes[2 * 64 * 16], scales[2 * 64]; /* the largest tensor: oss gate_up blocks and scales */
    static nb_st_tensor t[64];
    static char names[64][64];
    const float ts = 0.5f;
    size_t n = 0;
    memset(scales, 0x38, sizeof scales);
#define T(dt_, rank_, d0_, d1_, d2_, d3_, data_, bytes_, ...)                                                     \
    do {                                                                                                      \
        snprintf(names[n], sizeof names[n], __VA_ARGS__);                                                     \
        t[n] = (nb_st_tensor){.name = names[n], .dtype = dt_, .rank = rank_, .shape = {d0_, d1_, d2_, d3_},   \
                              .data = data_, .bytes = bytes_};                                                \
        n++;                                                                                                  \
    } while (0)
    static const char *const pj[3] = {"gate_proj", "up_proj", "down_proj"};
    for (int g = 0; g < 2; g++)
        for (int e = 0; e < 2; e++)
            for (int p = 0; p < 3; p++) {
                if (g == 1 && e == 1 && p == 2) continue; /* bad.experts.1 has no down_proj */
                const char *G = g ? "bad" : "moe";
                const int64_t rows = p == 2 ? 32 : 16, k = p == 2 ? 16 : 32;
                const size_t cb = (size_t)(rows * k / 2), sb = (size_t)(rows * k / 16);
                T(NB_ST_U8, 2, rows, k / 2, 0, 0, codes, cb, "%s.experts.%d.%s.weight", G, e, pj[p]);
                T(NB_ST_F8_E4M3, 2, rows, k / 16, 0, 0, scales, sb, "%s.experts.%d.%s.weight_scale", G, e, pj[p]);
                T(NB_ST_F32, 0, 0, 0, 0, 0, &ts, 4, "%s.experts.%d.%s.weight_scale_2", G, e, pj[p]);
            }
    T(NB_ST_U8, 4, 2, 64, 1, 16, codes, 2 * 64 * 16, "oss.experts.gate_up_proj_blocks");
    T(NB_ST_U8, 3, 2, 64, 1, 0, scales, 2 * 64, "oss.experts.gate_up_proj_scales");
    T(NB_ST_U8, 4, 2, 32, 1, 16, codes, 2 * 32 * 16, "oss.experts.down_proj_blocks");
    T(NB_ST_U8, 3, 2, 32, 1, 0, scales, 2 * 32, "oss.experts.down_proj_scales");
#undef T
    char path[600];
    snprintf(path, sizeof path, "%s/moe.safetensors", g_dir);
    nb_ckpt *c = NULL;
    if (nb_st_write(path, t, n, NULL, 0) != NB_OK || nb_ckpt_open(path, &c) != NB_OK) {
        CHECK(0, "the MoE fixture: %s", nb_last_error());
        return;
    }
    size_t cnt = 0, gm = 9, go = 9, gb = 9, li = 0;
    nb_ckpt_moe m;
    EXPECT(NB_ERR_NULL_POINTER, nb_ckpt_moe_count(NULL, &cnt));
    EXPECT(NB_ERR_NULL_POINTER, nb_ckpt_moe_count(c, NULL));
    EXPECT(NB_OK, nb_ckpt_moe_count(c, &cnt));
    CHECK(cnt == 3, "%zu groups, want 3", cnt);
    EXPECT(NB_ERR_NOT_FOUND, nb_ckpt_moe_at(c, 3, &m));
    EXPECT(NB_ERR_NULL_POINTER, nb_ckpt_moe_at(c, 0, NULL));
    EXPECT(NB_ERR_NOT_FOUND, nb_ckpt_moe_find(c, "moe", &gm));
    EXPECT(NB_ERR_NULL_POINTER, nb_ckpt_moe_find(c, NULL, &gm));
    EXPECT(NB_ERR_NULL_POINTER, nb_ckpt_moe_find(c, "moe.experts", NULL));
    EXPECT(NB_OK, nb_ckpt_moe_find(c, "moe.experts", &gm));
    EXPECT(NB_OK, nb_ckpt_moe_find(c, "oss.experts", &go));
    EXPECT(NB_OK, nb_ckpt_moe_find(c, "bad.experts", &gb));
    CHECK(nb_ckpt_moe_at(c, gm, &m) == NB_OK && m.format == NB_CKPT_MODELOPT_NVFP4 && m.reserved[0] == 0 &&
              m.reserved[7] == 0 && m.top_k == 0,
          "moe.experts: %s (%s)", m.prefix, m.problem);
    int64_t grp;
    nb_ckpt_moe_proj proj;
    EXPECT(NB_ERR_NULL_POINTER, nb_ckpt_layer_moe(NULL, 0, &grp, &proj, NULL));
    EXPECT(NB_ERR_NULL_POINTER, nb_ckpt_layer_moe(c, 0, NULL, &proj, NULL));
    EXPECT(NB_ERR_NOT_FOUND, nb_ckpt_layer_moe(c, 99, &grp, NULL, NULL));
    EXPECT(NB_OK, nb_ckpt_layer_moe(c, 0, &grp, NULL, NULL));

    nb_moe_desc d;
    EXPECT(NB_ERR_NULL_POINTER, nb_ckpt_moe_desc(NULL, gm, 1, 1, NB_DTYPE_F32, &d));
    EXPECT(NB_ERR_NULL_POINTER, nb_ckpt_moe_desc(c, gm, 1, 1, NB_DTYPE_F32, NULL));
    EXPECT(NB_ERR_NOT_FOUND, nb_ckpt_moe_desc(c, 3, 1, 1, NB_DTYPE_F32, &d));
    EXPECT(NB_ERR_INVALID_ARGUMENT, nb_ckpt_moe_desc(c, gm, 1, 0, NB_DTYPE_F32, &d)); /* no top_k anywhere */
    EXPECT(NB_ERR_INVALID_ARGUMENT, nb_ckpt_moe_desc(c, gm, 1, -1, NB_DTYPE_F32, &d));
    EXPECT(NB_ERR_INVALID_ARGUMENT, nb_ckpt_moe_desc(c, gm, 1, 3, NB_DTYPE_F32, &d)); /* top_k > E */
    EXPECT(NB_ERR_BAD_SHAPE, nb_ckpt_moe_desc(c, gm, 0, 1, NB_DTYPE_F32, &d));
    EXPECT(NB_ERR_UNSUPPORTED, nb_ckpt_moe_desc(c, gm, 1, 1, (nb_dtype)9, &d));
    EXPECT(NB_ERR_UNSUPPORTED, nb_ckpt_moe_desc(c, gb, 1, 1, NB_DTYPE_F32, &d));
    EXPECT(NB_OK, nb_ckpt_moe_desc(c, gm, 1, 2, NB_DTYPE_F32, &d));
    EXPECT(NB_OK, nb_ckpt_moe_desc(c, go, 1, 2, NB_DTYPE_BF16, &d));

    nb_weight_desc w;
    const uint8_t *pc, *ps;
    EXPECT(NB_ERR_NULL_POINTER, nb_ckpt_moe_expert(NULL, gm, NB_CKPT_MOE_GATE, 0, &w, &pc, &ps));
    EXPECT(NB_ERR_NULL_POINTER, nb_ckpt_moe_expert(c, gm, NB_CKPT_MOE_GATE, 0, NULL, &pc, &ps));
    EXPECT(NB_ERR_NULL_POINTER, nb_ckpt_moe_expert(c, gm, NB_CKPT_MOE_GATE, 0, &w, &pc, NULL));
    EXPECT(NB_ERR_NOT_FOUND, nb_ckpt_moe_expert(c, 3, NB_CKPT_MOE_GATE, 0, &w, &pc, &ps));
    EXPECT(NB_ERR_INVALID_ARGUMENT, nb_ckpt_moe_expert(c, gm, (nb_ckpt_moe_proj)0, 0, &w, &pc, &ps));
    EXPECT(NB_ERR_INVALID_ARGUMENT, nb_ckpt_moe_expert(c, gm, (nb_ckpt_moe_proj)5, 0, &w, &pc, &ps));
    EXPECT(NB_ERR_UNSUPPORTED, nb_ckpt_moe_expert(c, gm, NB_CKPT_MOE_GATE_UP, 0, &w, &pc, &ps));
    EXPECT(NB_ERR_UNSUPPORTED, nb_ckpt_moe_expert(c, go, NB_CKPT_MOE_UP, 0, &w, &pc, &ps));
    EXPECT(NB_ERR_UNSUPPORTED, nb_ckpt_moe_expert(c, gb, NB_CKPT_MOE_GATE, 0, &w, &pc, &ps));
    EXPECT(NB_ERR_INVALID_ARGUMENT, nb_ckpt_moe_expert(c, gm, NB_CKPT_MOE_GATE, -1, &w, &pc, &ps));
    EXPECT(NB_ERR_INVALID_ARGUMENT, nb_ckpt_moe_expert(c, gm, NB_CKPT_MOE_GATE, 2, &w, &pc, &ps));
    EXPECT(NB_ERR_INVALID_ARGUMENT, nb_ckpt_moe_expert(c, go, NB_CKPT_MOE_DOWN, 2, &w, &pc, &ps));
    EXPECT(NB_OK, nb_ckpt_moe_expert(c, gm, NB_CKPT_MOE_UP, 1, &w, &pc, &ps));
    CHECK(w.tensor_scale == ts && w.n == 16 && w.k == 32, "moe expert 1 up: [%lld, %lld] ts %g", (long long)w.n,
          (long long)w.k, (double)w.tensor_scale);
    EXPECT(NB_OK, nb_ckpt_moe_expert(c, go, NB_CKPT_MOE_DOWN, 1, &w, &pc, &ps));

    EXPECT(NB_ERR_NULL_POINTER, nb_ckpt_moe_weights(NULL, go, NB_CKPT_MOE_DOWN, &w, &pc, &ps));
    EXPECT(NB_ERR_NULL_POINTER, nb_ckpt_moe_weights(c, go, NB_CKPT_MOE_DOWN, &w, NULL, &ps));
    EXPECT(NB_ERR_NOT_FOUND, nb_ckpt_moe_weights(c, 3, NB_CKPT_MOE_DOWN, &w, &pc, &ps));
    EXPECT(NB_ERR_INVALID_ARGUMENT, nb_ckpt_moe_weights(c, go, (nb_ckpt_moe_proj)9, &w, &pc, &ps));
    EXPECT(NB_ERR_UNSUPPORTED, nb_ckpt_moe_weights(c, gm, NB_CKPT_MOE_DOWN, &w, &pc, &ps));
    EXPECT(NB_ERR_UNSUPPORTED, nb_ckpt_moe_weights(c, go, NB_CKPT_MOE_GATE, &w, &pc, &ps));
    EXPECT(NB_ERR_UNSUPPORTED, nb_ckpt_moe_weights(c, gb, NB_CKPT_MOE_DOWN, &w, &pc, &ps));
    EXPECT(NB_OK, nb_ckpt_moe_weights(c, go, NB_CKPT_MOE_GATE_UP, &w, &pc, &ps));

    static uint8_t cb[2048], sb[256];
    static int sentinel;
    float tsv[2];
    const nb_weight_sizes_v2 cap = {.codes_bytes = sizeof cb, .scales_bytes = sizeof sb};
    nb_weight_sizes_v2 small = cap;
    small.codes_bytes = 2 * 32 * 16 - 1; /* gate_up: 2 experts x [32, 32] x 1/2 bytes, one byte short */
    nb_weight_buffers out = {.codes = cb, .scales = sb}, bad;
    EXPECT(NB_ERR_NULL_POINTER, nb_ckpt_moe_read(NULL, gm, NB_CKPT_MOE_DOWN, &w, NULL, NULL, NULL, 0));
    EXPECT(NB_ERR_NULL_POINTER, nb_ckpt_moe_read(c, gm, NB_CKPT_MOE_DOWN, NULL, NULL, NULL, NULL, 0));
    EXPECT(NB_ERR_NULL_POINTER, nb_ckpt_moe_read(c, gm, NB_CKPT_MOE_DOWN, &w, &out, NULL, NULL, 0));
    EXPECT(NB_ERR_NOT_FOUND, nb_ckpt_moe_read(c, 3, NB_CKPT_MOE_DOWN, &w, NULL, NULL, NULL, 0));
    EXPECT(NB_ERR_INVALID_ARGUMENT, nb_ckpt_moe_read(c, gm, (nb_ckpt_moe_proj)0, &w, NULL, NULL, NULL, 0));
    EXPECT(NB_ERR_UNSUPPORTED, nb_ckpt_moe_read(c, go, NB_CKPT_MOE_GATE, &w, NULL, NULL, NULL, 0));
    EXPECT(NB_ERR_UNSUPPORTED, nb_ckpt_moe_read(c, gb, NB_CKPT_MOE_GATE, &w, NULL, NULL, NULL, 0));
    EXPECT(NB_ERR_BUFFER_TOO_SMALL, nb_ckpt_moe_read(c, gm, NB_CKPT_MOE_DOWN, &w, NULL, NULL, tsv, 1));
    bad = out, bad.codes = NULL;
    EXPECT(NB_ERR_NULL_POINTER, nb_ckpt_moe_read(c, gm, NB_CKPT_MOE_GATE_UP, &w, &bad, &cap, tsv, 2));
    bad = out, bad.zeros = sb;
    EXPECT(NB_ERR_INVALID_ARGUMENT, nb_ckpt_moe_read(c, gm, NB_CKPT_MOE_GATE_UP, &w, &bad, &cap, tsv, 2));
    bad = out, bad.reserved[1] = &sentinel;
    EXPECT(NB_ERR_INVALID_ARGUMENT, nb_ckpt_moe_read(c, gm, NB_CKPT_MOE_GATE_UP, &w, &bad, &cap, tsv, 2));
    EXPECT(NB_ERR_BUFFER_TOO_SMALL, nb_ckpt_moe_read(c, gm, NB_CKPT_MOE_GATE_UP, &w, &out, &small, tsv, 2));
    EXPECT(NB_OK, nb_ckpt_moe_read(c, gm, NB_CKPT_MOE_GATE_UP, &w, &out, &cap, tsv, 2));
    CHECK(w.n == 32 && w.k == 32 && tsv[0] == ts && tsv[1] == ts, "moe read GATE_UP: [%lld, %lld], scales %g %g",
          (long long)w.n, (long long)w.k, (double)tsv[0], (double)tsv[1]);
    EXPECT(NB_OK, nb_ckpt_moe_read(c, go, NB_CKPT_MOE_GATE_UP, &w, &out, &cap, NULL, 0));
    CHECK(nb_ckpt_layer_find(c, "bad.experts.0.gate_proj", &li) == NB_OK &&
              nb_ckpt_layer_moe(c, li, &grp, &proj, NULL) == NB_OK && grp == (int64_t)gb && proj == NB_CKPT_MOE_GATE,
          "bad.experts.0.gate_proj is in group %lld", (long long)grp);
    nb_ckpt_close(c);
}

int main(int argc, char **argv) {
    if (argc > 1) {
        snprintf(g_dir, sizeof g_dir, "%s", argv[1]);
        mkdir(g_dir, 0755);
    } else {
        const char *tmp = getenv("TMPDIR");
        snprintf(g_dir, sizeof g_dir, "%s/nb_io_api.XXXXXX", tmp && tmp[0] ? tmp : "/tmp");
        if (!mkdtemp(g_dir)) {
            printf("cannot create a temporary directory\n");
            return 2;
        }
    }
    char cmd[700];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'/*", g_dir); /* outputs of a previous run */
    if (system(cmd) != 0) printf("note: could not clear %s\n", g_dir);
    char path[600];
    test_struct_sizes();
    test_names();
    if (write_fixture(path, sizeof path)) {
        test_safetensors(path);
        test_checkpoint(path);
        test_quantize_convert(path);
        test_inputs(path);
    }
    test_gguf();
    test_moe();
    if (argc <= 1 && g_fail == 0) {
        snprintf(cmd, sizeof cmd, "rm -rf '%s'", g_dir);
        if (system(cmd) != 0) printf("note: could not remove %s\n", g_dir);
    }
    printf("%d passed, %d failed\n", g_pass, g_fail);
    return g_fail ? 1 : 0;
}
