/* test_safetensors.c - the safetensors module (src/io/safetensors.h).
 *
 *   - round trip: nb_st_write -> nb_st_open of U8, F8_E4M3, an F32 scalar,
 *     BF16, a zero-size F16, F4 and I64 tensors plus metadata, byte-exact,
 *     with the layout the writer documents (header padded to 8, descending
 *     element size, natural alignment, no temporary file left behind);
 *   - a corpus of malformed files built here, one broken rule each: every one
 *     must fail with its status and a message naming the file and the rule,
 *     both from a file (nb_st_open, mmap) and from an exact-size heap copy
 *     (nb_st_open_memory, so AddressSanitizer sees any read past the end);
 *   - sharded checkpoints: a valid index, then bad shard names, a tensor
 *     missing from its shard, a tensor in two shards, a name listed twice;
 *   - writer argument errors.
 *
 * `test_safetensors --write-corpus DIR` writes the fuzzer's seed files
 * (tests/corpus/safetensors/ holds the committed copy).
 * Output: one line per failed check, then "N passed, M failed". */
#define _POSIX_C_SOURCE 200809L
#include "nibble_io.h"

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <dirent.h>
#include <sys/stat.h>
#include <unistd.h>

#include "check.h"

static char g_dir[256];

/* nb_status_name without linking libnibble: nibble_io needs only the header. */
static const char *sname(nb_status st) {
    switch (st) {
#define NB_X_NAME(name, value, msg) case name: return #name;
        NB_STATUS_LIST(NB_X_NAME)
#undef NB_X_NAME
    }
    return "NB_UNKNOWN";
}

static void path_in(char *out, size_t len, const char *name) { snprintf(out, len, "%s/%s", g_dir, name); }

static void write_file(const char *path, const void *p, size_t n) {
    FILE *fp = fopen(path, "wb");
    if (!fp) { printf("cannot write %s\n", path); exit(2); }
    if (n) fwrite(p, 1, n, fp);
    fclose(fp);
}

/* An image: u64 N (or hlen_override when != UINT64_MAX... see below), the
 * header text, then `data_len` bytes 0xA5. */
typedef struct image {
    unsigned char *p;
    size_t n;
} image;

static image make_image(const char *header, size_t header_len, uint64_t n_field, size_t data_len) {
    image im;
    im.n = 8 + header_len + data_len;
    im.p = (unsigned char *)malloc(im.n);
    for (int i = 0; i < 8; i++) im.p[i] = (unsigned char)(n_field >> (8 * i));
    memcpy(im.p + 8, header, header_len);
    memset(im.p + 8 + header_len, 0xA5, data_len);
    return im;
}
static image img(const char *header, size_t data_len) {
    return make_image(header, strlen(header), strlen(header), data_len);
}

/* Both paths must fail with `want` and a message that names the file and
 * contains `rule`. */
static void expect_bad(const char *what, image im, nb_status want, const char *rule) {
    char path[512];
    snprintf(path, sizeof path, "%s/bad-%s.safetensors", g_dir, what);
    for (char *c = path + strlen(g_dir) + 1; *c; c++)
        if (*c == ' ' || *c == '/') *c = '_';
    write_file(path, im.p, im.n);
    nb_st_file *f = (nb_st_file *)(uintptr_t)1;
    nb_status st = nb_st_open(path, &f);
    CHECK(st == want, "%s (file): status %s, want %s: %s", what, sname(st), sname(want), nb_last_error());
    CHECK(f == NULL, "%s: out not cleared on failure", what);
    CHECK(strstr(nb_last_error(), path) != NULL, "%s: message does not name the file: %s", what, nb_last_error());
    CHECK(strstr(nb_last_error(), rule) != NULL, "%s: message does not say \"%s\": %s", what, rule, nb_last_error());
    if (st == NB_OK) nb_st_close(f);

    unsigned char *copy = (unsigned char *)malloc(im.n ? im.n : 1);
    memcpy(copy, im.p, im.n);
    st = nb_st_open_memory(copy, im.n, "mem-image", &f);
    CHECK(st == want, "%s (memory): status %s, want %s: %s", what, sname(st), sname(want), nb_last_error());
    CHECK(strstr(nb_last_error(), "mem-image") && strstr(nb_last_error(), rule), "%s (memory): message: %s", what, nb_last_error());
    if (st == NB_OK) nb_st_close(f);
    free(copy);
    free(im.p);
}

static void expect_ok_image(const char *what, image im, size_t want_tensors) {
    nb_st_file *f = NULL;
    nb_status st = nb_st_open_memory(im.p, im.n, what, &f);
    CHECK(st == NB_OK, "%s: %s: %s", what, sname(st), nb_last_error());
    if (st == NB_OK) {
        size_t n = 99;
        nb_st_count(f, &n);
        CHECK(n == want_tensors, "%s: %zu tensors, want %zu", what, n, want_tensors);
        nb_st_close(f);
    }
    free(im.p);
}

/* ------------------------------------------------------------ round trip */

static void fill(unsigned char *p, size_t n, unsigned seed) {
    for (size_t i = 0; i < n; i++) p[i] = (unsigned char)(seed * 131 + i * 7 + (i >> 3));
}

static nb_st_tensor tensor(const char *name, nb_st_dtype t, int rank, const int64_t *shape, const void *data,
                           size_t bytes) {
    nb_st_tensor x;
    memset(&x, 0, sizeof x);
    x.name = name;
    x.dtype = t;
    x.rank = rank;
    for (int i = 0; i < rank; i++) x.shape[i] = shape[i];
    x.data = data;
    x.bytes = bytes;
    return x;
}

static unsigned char u8d[15], e4d[16], f32d[4], bf16d[24], f4d[6], i64d[24];

static size_t roundtrip_tensors(nb_st_tensor *t) {
    static const int64_t s_u8[] = {3, 5}, s_e4[] = {2, 8}, s_bf[] = {4, 3}, s_zero[] = {0, 7}, s_f4[] = {2, 6},
                         s_i64[] = {3};
    fill(u8d, sizeof u8d, 1);
    fill(e4d, sizeof e4d, 2);
    fill(f32d, sizeof f32d, 3);
    fill(bf16d, sizeof bf16d, 4);
    fill(f4d, sizeof f4d, 5);
    fill(i64d, sizeof i64d, 6);
    size_t n = 0;
    t[n++] = tensor("model.layers.0.weight_u8", NB_ST_U8, 2, s_u8, u8d, sizeof u8d);
    t[n++] = tensor("w.e4m3", NB_ST_F8_E4M3, 2, s_e4, e4d, sizeof e4d);
    t[n++] = tensor("scalar.f32", NB_ST_F32, 0, NULL, f32d, sizeof f32d);
    t[n++] = tensor("bf16", NB_ST_BF16, 2, s_bf, bf16d, sizeof bf16d);
    t[n++] = tensor("empty\"quoted\\name", NB_ST_F16, 2, s_zero, NULL, 0);
    t[n++] = tensor("codes.f4", NB_ST_F4, 2, s_f4, f4d, sizeof f4d);
    t[n++] = tensor("ids", NB_ST_I64, 1, s_i64, i64d, sizeof i64d);
    return n;
}

static void test_roundtrip(void) {
    nb_st_tensor t[8];
    size_t n = roundtrip_tensors(t);
    const char *meta[] = {"producer", "nibble test", "note", "tab\tquote\"back\\slash\nnewline \xc3\xa9"};
    char path[512];
    path_in(path, sizeof path, "roundtrip.safetensors");
    nb_status st = nb_st_write(path, t, n, meta, 2);
    CHECK(st == NB_OK, "write: %s: %s", sname(st), nb_last_error());

    nb_st_file *f = NULL;
    st = nb_st_open(path, &f);
    CHECK(st == NB_OK, "open: %s: %s", sname(st), nb_last_error());
    if (st != NB_OK) return;
    size_t cnt = 0;
    nb_st_count(f, &cnt);
    CHECK(cnt == n, "count %zu want %zu", cnt, n);
    uint64_t prev_bits = 64, prev_end = 0;
    for (size_t i = 0; i < n; i++) {
        nb_st_tensor r;
        st = nb_st_tensor_find(f, t[i].name, &r);
        CHECK(st == NB_OK, "find %s: %s", t[i].name, nb_last_error());
        if (st != NB_OK) continue;
        CHECK(!strcmp(r.name, t[i].name) && r.dtype == t[i].dtype && r.rank == t[i].rank && r.bytes == t[i].bytes,
              "%s: metadata differs (dtype %d rank %d bytes %zu)", t[i].name, r.dtype, r.rank, r.bytes);
        CHECK(!memcmp(r.shape, t[i].shape, sizeof r.shape), "%s: shape differs", t[i].name);
        CHECK(r.bytes == 0 || !memcmp(r.data, t[i].data, r.bytes), "%s: data differs", t[i].name);
        int bits = 0;
        nb_st_dtype_info(r.dtype, NULL, &bits);
        size_t align = bits >= 8 ? (size_t)bits / 8 : 1;
        CHECK(((uintptr_t)r.data) % align == 0, "%s: data not %zu-aligned", t[i].name, align);
    }
    /* layout: by offset, element size never increases and there are no gaps */
    nb_st_tensor all[8];
    for (size_t i = 0; i < cnt && i < 8; i++) nb_st_tensor_at(f, i, &all[i]);
    for (size_t i = 0; i < cnt && i < 8; i++)
        for (size_t j = 0; j < cnt && j < 8; j++) {
            int bi = 0, bj = 0;
            nb_st_dtype_info(all[i].dtype, NULL, &bi);
            nb_st_dtype_info(all[j].dtype, NULL, &bj);
            if (all[i].bytes && all[j].bytes && all[i].offset < all[j].offset)
                CHECK(bi >= bj, "%s (%d bits) before %s (%d bits)", all[i].name, bi, all[j].name, bj);
        }
    for (size_t i = 0; i < cnt && i < 8; i++)
        if (all[i].offset + all[i].bytes > prev_end) prev_end = all[i].offset + all[i].bytes;
    (void)prev_bits;
    FILE *fp = fopen(path, "rb");
    unsigned char len8[8] = {0};
    CHECK(fp && fread(len8, 1, 8, fp) == 8, "reread header length");
    if (fp) fclose(fp);
    uint64_t hl = 0;
    for (int i = 7; i >= 0; i--) hl = (hl << 8) | len8[i];
    CHECK(hl % 8 == 0, "header length %llu not a multiple of 8", (unsigned long long)hl);

    const char *v = NULL;
    CHECK(nb_st_metadata_get(f, "format", &v) == NB_OK && v && !strcmp(v, "pt"), "format != pt");
    CHECK(nb_st_metadata_get(f, "producer", &v) == NB_OK && !strcmp(v, "nibble test"), "producer");
    CHECK(nb_st_metadata_get(f, "note", &v) == NB_OK && !strcmp(v, meta[3]), "escaped metadata");
    size_t nm = 0;
    nb_st_metadata_count(f, &nm);
    CHECK(nm == 3, "metadata count %zu", nm);
    st = nb_st_metadata_get(f, "absent", &v);
    CHECK(st == NB_ERR_NOT_FOUND && strstr(nb_last_error(), path), "missing metadata key: %s %s", sname(st), nb_last_error());
    nb_st_tensor r;
    st = nb_st_tensor_find(f, "absent", &r);
    CHECK(st == NB_ERR_NOT_FOUND && strstr(nb_last_error(), "absent"), "missing tensor: %s %s", sname(st), nb_last_error());
    st = nb_st_tensor_at(f, 99, &r);
    CHECK(st == NB_ERR_NOT_FOUND, "tensor_at out of range: %s", sname(st));
    nb_st_close(f);

    /* no temporary left behind */
    DIR *d = opendir(g_dir);
    int tmp_left = 0;
    for (struct dirent *e; d && (e = readdir(d));)
        if (strstr(e->d_name, ".tmp.")) tmp_left = 1;
    if (d) closedir(d);
    CHECK(!tmp_left, "temporary file left behind");

    /* caller's "format" replaces "pt"; empty file (no tensors) */
    const char *meta2[] = {"format", "mlx"};
    path_in(path, sizeof path, "empty.safetensors");
    st = nb_st_write(path, NULL, 0, meta2, 1);
    CHECK(st == NB_OK, "write empty: %s", nb_last_error());
    st = nb_st_open(path, &f);
    CHECK(st == NB_OK, "open empty: %s", nb_last_error());
    if (st == NB_OK) {
        nb_st_count(f, &cnt);
        CHECK(cnt == 0 && nb_st_metadata_get(f, "format", &v) == NB_OK && !strcmp(v, "mlx"),
              "empty file content");
        nb_st_close(f);
    }
}

/* ------------------------------------------------------ malformed corpus */

static void test_malformed(void) {
    static const char ok1[] = "{\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]}}";
    char big[6000];

    expect_bad("header length 0", make_image("", 0, 0, 0), NB_ERR_CORRUPT, "valid JSON");
    {
        image im = make_image("", 0, 0, 0);
        im.n = 5;
        expect_bad("truncated 5", im, NB_ERR_CORRUPT, "HeaderTooSmall");
    }
    {
        image im = make_image("", 0, 0, 0);
        im.n = 0;
        expect_bad("empty file", im, NB_ERR_CORRUPT, "HeaderTooSmall");
    }
    expect_bad("header beyond file", make_image(ok1, strlen(ok1), 1000, 4), NB_ERR_CORRUPT, "InvalidHeaderLength");
    expect_bad("header too large", make_image(ok1, strlen(ok1), 100000001ull, 4), NB_ERR_CORRUPT, "HeaderTooLarge");
    expect_bad("header length 2^64-1", make_image(ok1, strlen(ok1), UINT64_MAX, 4), NB_ERR_CORRUPT,
               "HeaderTooLarge");
    expect_bad("invalid utf8", img("{\"a\xff\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]}}", 4),
               NB_ERR_CORRUPT, "UTF-8");
    expect_bad("overlong utf8", img("{\"a\xc0\xaf\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]}}", 4),
               NB_ERR_CORRUPT, "UTF-8");
    expect_bad("surrogate utf8", img("{\"a\xed\xa0\x80\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]}}", 4),
               NB_ERR_CORRUPT, "UTF-8");
    expect_bad("invalid json", img("{\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]}", 4),
               NB_ERR_CORRUPT, "valid JSON");
    expect_bad("truncated json", img("{\"a\":", 0), NB_ERR_CORRUPT, "valid JSON");
    expect_bad("unterminated string", img("{\"a\\", 0), NB_ERR_CORRUPT, "unterminated");
    expect_bad("json then garbage", img("{} x", 0), NB_ERR_CORRUPT, "padded with whitespace");
    expect_bad("json array", img("[]", 0), NB_ERR_CORRUPT, "not a JSON object");
    expect_bad("bom", img("\xef\xbb\xbf{}", 0), NB_ERR_CORRUPT, "outside a string");
    expect_bad("nul padding", make_image("{}\0\0\0\0\0\0", 8, 8, 0), NB_ERR_CORRUPT, "outside a string");
    expect_bad("control in string", img("{\"a\x01\":{}}", 0), NB_ERR_CORRUPT, "control character");
    expect_bad("escaped nul", img("{\"a\\u0000b\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]}}", 4),
               NB_ERR_CORRUPT, "\\u0000");
    expect_bad("unknown dtype", img("{\"a\":{\"dtype\":\"F128\",\"shape\":[1],\"data_offsets\":[0,4]}}", 4),
               NB_ERR_CORRUPT, "unknown dtype");
    expect_bad("dtype not string", img("{\"a\":{\"dtype\":5,\"shape\":[1],\"data_offsets\":[0,4]}}", 4),
               NB_ERR_CORRUPT, "unknown dtype");
    expect_bad("negative shape", img("{\"a\":{\"dtype\":\"F32\",\"shape\":[-1],\"data_offsets\":[0,4]}}", 4),
               NB_ERR_CORRUPT, "negative");
    expect_bad("fractional shape", img("{\"a\":{\"dtype\":\"F32\",\"shape\":[1.5],\"data_offsets\":[0,4]}}", 4),
               NB_ERR_CORRUPT, "plain integer");
    expect_bad("exponent shape", img("{\"a\":{\"dtype\":\"F32\",\"shape\":[1e0],\"data_offsets\":[0,4]}}", 4),
               NB_ERR_CORRUPT, "plain integer");
    expect_bad("1.0 shape", img("{\"a\":{\"dtype\":\"F32\",\"shape\":[1.0],\"data_offsets\":[0,4]}}", 4),
               NB_ERR_CORRUPT, "plain integer");
    expect_bad("leading zero", img("{\"a\":{\"dtype\":\"F32\",\"shape\":[01],\"data_offsets\":[0,4]}}", 4),
               NB_ERR_CORRUPT, "leading zero");
    expect_bad("dim too large", img("{\"a\":{\"dtype\":\"U8\",\"shape\":[1000000000000000],\"data_offsets\":[0,4]}}", 4),
               NB_ERR_CORRUPT, "2^48-1");
    expect_bad("dim 2^48", img("{\"a\":{\"dtype\":\"U8\",\"shape\":[281474976710656],\"data_offsets\":[0,4]}}", 4),
               NB_ERR_CORRUPT, "[0, 2^48-1]");
    expect_bad("shape not integer", img("{\"a\":{\"dtype\":\"F32\",\"shape\":[true],\"data_offsets\":[0,4]}}", 4),
               NB_ERR_CORRUPT, "non-negative integers");
    expect_bad("shape product overflow",
               img("{\"a\":{\"dtype\":\"U8\",\"shape\":[281474976710655,281474976710655],\"data_offsets\":[0,4]}}", 4),
               NB_ERR_OVERFLOW, "ValidationOverflow");
    expect_bad("shape x bits overflow",
               img("{\"a\":{\"dtype\":\"F64\",\"shape\":[281474976710655,65536],\"data_offsets\":[0,4]}}", 4),
               NB_ERR_OVERFLOW, "ValidationOverflow");
    expect_bad("wrong byte count", img("{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,4]}}", 4),
               NB_ERR_CORRUPT, "TensorInvalidInfo");
    expect_bad("gap", img("{\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]},"
                          "\"b\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[8,12]}}", 12),
               NB_ERR_CORRUPT, "gap");
    expect_bad("overlap", img("{\"a\":{\"dtype\":\"U8\",\"shape\":[8],\"data_offsets\":[0,8]},"
                              "\"b\":{\"dtype\":\"U8\",\"shape\":[8],\"data_offsets\":[4,12]}}", 12),
               NB_ERR_CORRUPT, "overlap");
    expect_bad("first begin not 0", img("{\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[4,8]}}", 8),
               NB_ERR_CORRUPT, "not 0");
    expect_bad("end before begin", img("{\"a\":{\"dtype\":\"U8\",\"shape\":[0],\"data_offsets\":[4,0]}}", 4),
               NB_ERR_CORRUPT, "end >= begin");
    expect_bad("trailing bytes", img(ok1, 6), NB_ERR_CORRUPT, "trailing bytes");
    expect_bad("data missing", img(ok1, 2), NB_ERR_CORRUPT, "data missing");
    expect_bad("no tensors trailing", img("{}", 1), NB_ERR_CORRUPT, "MetadataIncompleteBuffer");
    expect_bad("odd F4", img("{\"a\":{\"dtype\":\"F4\",\"shape\":[3],\"data_offsets\":[0,1]}}", 1), NB_ERR_CORRUPT,
               "MisalignedSlice");
    expect_bad("F6 not bytes", img("{\"a\":{\"dtype\":\"F6_E2M3\",\"shape\":[3],\"data_offsets\":[0,2]}}", 2),
               NB_ERR_CORRUPT, "MisalignedSlice");
    expect_bad("duplicate name", img("{\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]},"
                                     "\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[4,8]}}", 8),
               NB_ERR_CORRUPT, "duplicate tensor names");
    expect_bad("duplicate name escaped", img("{\"A\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]},"
                                             "\"\\u0041\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[4,8]}}", 8),
               NB_ERR_CORRUPT, "duplicate tensor names");
    expect_bad("duplicate field", img("{\"a\":{\"dtype\":\"F32\",\"dtype\":\"F32\",\"shape\":[1],"
                                      "\"data_offsets\":[0,4]}}", 4), NB_ERR_CORRUPT, "appears twice");
    expect_bad("unknown field", img("{\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4],\"x\":\"y\"}}", 4),
               NB_ERR_CORRUPT, "unknown field");
    expect_bad("missing field", img("{\"a\":{\"dtype\":\"F32\",\"shape\":[1]}}", 0), NB_ERR_CORRUPT, "missing field");
    expect_bad("tensor not object", img("{\"a\":\"x\"}", 0), NB_ERR_CORRUPT, "not an object");
    expect_bad("offsets three", img("{\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4,8]}}", 4),
               NB_ERR_CORRUPT, "two integers");
    expect_bad("rank 9", img("{\"a\":{\"dtype\":\"U8\",\"shape\":[1,1,1,1,1,1,1,1,1],\"data_offsets\":[0,1]}}", 1),
               NB_ERR_CORRUPT, "rank limit");
    expect_bad("metadata non-string", img("{\"__metadata__\":{\"format\":\"pt\",\"k\":1}}", 0), NB_ERR_CORRUPT,
               "strings to strings");
    expect_bad("metadata nested", img("{\"__metadata__\":{\"k\":{}}}", 0), NB_ERR_CORRUPT, "strings to strings");
    expect_bad("metadata not object", img("{\"__metadata__\":\"pt\"}", 0), NB_ERR_CORRUPT, "not an object");
    expect_bad("metadata twice", img("{\"__metadata__\":{},\"__metadata__\":{}}", 0), NB_ERR_CORRUPT, "twice");
    expect_bad("metadata dup key", img("{\"__metadata__\":{\"k\":\"a\",\"k\":\"b\"}}", 0), NB_ERR_CORRUPT,
               "no duplicate keys");
    expect_bad("deep nesting", img("{\"a\":[[[[[[[[[[[[]]]]]]]]]]]]}", 0), NB_ERR_CORRUPT, "nesting limit");
    expect_bad("unbalanced", img("{]", 0), NB_ERR_CORRUPT, "unbalanced");
    big[0] = '{';
    big[1] = '"';
    memset(big + 2, 'n', 5000);
    snprintf(big + 5002, sizeof big - 5002, "\":{\"dtype\":\"U8\",\"shape\":[0],\"data_offsets\":[0,0]}}");
    expect_bad("name too long", img(big, 0), NB_ERR_CORRUPT, "name length limit");

    /* accepted edge cases */
    expect_ok_image("empty header", img("{}", 0), 0);
    expect_ok_image("whitespace around header", img("  \n{}\t   ", 0), 0);
    expect_ok_image("zero-size and scalar",
                    img("{\"z\":{\"dtype\":\"F16\",\"shape\":[0,4],\"data_offsets\":[0,0]},"
                        "\"s\":{\"dtype\":\"F32\",\"shape\":[],\"data_offsets\":[0,4]},"
                        "\"z2\":{\"dtype\":\"U8\",\"shape\":[3,0],\"data_offsets\":[4,4]}}", 4), 3);
    expect_ok_image("even F4 and F6", img("{\"a\":{\"dtype\":\"F4\",\"shape\":[4],\"data_offsets\":[0,2]},"
                                          "\"b\":{\"dtype\":\"F6_E3M2\",\"shape\":[4],\"data_offsets\":[2,5]}}", 5), 2);
    expect_ok_image("max dim zero product",
                    img("{\"a\":{\"dtype\":\"U8\",\"shape\":[281474976710655,0],\"data_offsets\":[0,0]}}", 0), 1);

    /* unreadable files */
    char path[512];
    nb_st_file *f = NULL;
    path_in(path, sizeof path, "does-not-exist.safetensors");
    nb_status st = nb_st_open(path, &f);
    CHECK(st == NB_ERR_IO && strstr(nb_last_error(), path), "missing file: %s %s", sname(st), nb_last_error());
    st = nb_st_open(g_dir, &f);
    CHECK(st == NB_ERR_IO && strstr(nb_last_error(), "regular"), "directory: %s %s", sname(st), nb_last_error());
    st = nb_st_open(NULL, &f);
    CHECK(st == NB_ERR_NULL_POINTER, "NULL path: %s", sname(st));
    st = nb_st_open(path, NULL);
    CHECK(st == NB_ERR_NULL_POINTER, "NULL out: %s", sname(st));
    CHECK(nb_st_close(NULL) == NB_OK, "close NULL");
    nb_st_dtype d;
    CHECK(nb_st_dtype_parse("F8_E4M3FNUZ", &d) == NB_OK && d == NB_ST_F8_E4M3FNUZ, "dtype parse");
    CHECK(nb_st_dtype_parse("f32", &d) == NB_ERR_NOT_FOUND, "dtype parse is case sensitive");
    CHECK(nb_st_dtype_info((nb_st_dtype)99, NULL, NULL) == NB_ERR_INVALID_ARGUMENT, "dtype info unknown");
}

/* ---------------------------------------------------------------- writer */

static void test_writer_errors(void) {
    static const int64_t s2[] = {2}, s3[] = {3}, sneg[] = {-1};
    unsigned char buf[16] = {0};
    char path[512];
    path_in(path, sizeof path, "werr.safetensors");
    nb_st_tensor t[2];
    t[0] = tensor("a", NB_ST_U8, 1, s2, buf, 2);
    t[1] = tensor("a", NB_ST_F32, 1, s2, buf, 8);
    nb_status st = nb_st_write(path, t, 2, NULL, 0);
    CHECK(st == NB_ERR_INVALID_ARGUMENT && strstr(nb_last_error(), "twice"), "dup names: %s %s", sname(st), nb_last_error());
    t[0] = tensor("a", NB_ST_U8, 1, s2, buf, 3);
    st = nb_st_write(path, t, 1, NULL, 0);
    CHECK(st == NB_ERR_INVALID_ARGUMENT && strstr(nb_last_error(), "need"), "bytes mismatch: %s %s", sname(st), nb_last_error());
    t[0] = tensor("a", NB_ST_F4, 1, s3, buf, 1);
    st = nb_st_write(path, t, 1, NULL, 0);
    CHECK(st == NB_ERR_INVALID_ARGUMENT && strstr(nb_last_error(), "whole bytes"), "odd F4: %s %s", sname(st), nb_last_error());
    t[0] = tensor("a", NB_ST_U8, 1, sneg, buf, 0);
    st = nb_st_write(path, t, 1, NULL, 0);
    CHECK(st == NB_ERR_INVALID_ARGUMENT, "negative dim: %s %s", sname(st), nb_last_error());
    t[0] = tensor("__metadata__", NB_ST_U8, 1, s2, buf, 2);
    st = nb_st_write(path, t, 1, NULL, 0);
    CHECK(st == NB_ERR_INVALID_ARGUMENT, "name __metadata__: %s", sname(st));
    t[0] = tensor("bad\xff", NB_ST_U8, 1, s2, buf, 2);
    st = nb_st_write(path, t, 1, NULL, 0);
    CHECK(st == NB_ERR_INVALID_ARGUMENT, "non-UTF-8 name: %s", sname(st));
    t[0] = tensor("a", NB_ST_U8, 1, s2, NULL, 2);
    st = nb_st_write(path, t, 1, NULL, 0);
    CHECK(st == NB_ERR_NULL_POINTER, "NULL data: %s", sname(st));
    const char *meta[] = {"k", "1", "k", "2"};
    t[0] = tensor("a", NB_ST_U8, 1, s2, buf, 2);
    st = nb_st_write(path, t, 1, meta, 2);
    CHECK(st == NB_ERR_INVALID_ARGUMENT, "dup metadata: %s", sname(st));
    path_in(path, sizeof path, "no-such-dir/x.safetensors");
    st = nb_st_write(path, t, 1, NULL, 0);
    CHECK(st == NB_ERR_IO && strstr(nb_last_error(), path), "unwritable: %s %s", sname(st), nb_last_error());
    CHECK(access(path, F_OK) != 0, "nothing written on failure");
}

/* ----------------------------------------------------------------- index */

static void write_text(const char *name, const char *text) {
    char path[512];
    path_in(path, sizeof path, name);
    write_file(path, text, strlen(text));
}

static void expect_index(const char *what, const char *index_json, nb_status want, const char *rule) {
    char path[512];
    snprintf(path, sizeof path, "%s/idx-%s.json", g_dir, what);
    for (char *c = path + strlen(g_dir) + 1; *c; c++)
        if (*c == ' ' || *c == '/') *c = '_';
    write_file(path, index_json, strlen(index_json));
    nb_st_index *x = NULL;
    nb_status st = nb_st_index_open(path, &x);
    CHECK(st == want, "index %s: %s, want %s: %s", what, sname(st), sname(want), nb_last_error());
    CHECK(want == NB_OK || (x == NULL && strstr(nb_last_error(), rule)), "index %s: message lacks \"%s\": %s", what, rule, nb_last_error());
    nb_st_index_close(x);
}

static void test_index(void) {
    static const int64_t s2[] = {2}, s4[] = {4};
    unsigned char a[2] = {1, 2}, b[16], c[4] = {9, 8, 7, 6}, e[2] = {5, 5};
    fill(b, sizeof b, 7);
    char path[512];
    nb_st_tensor t[2];
    t[0] = tensor("a", NB_ST_U8, 1, s2, a, 2);
    t[1] = tensor("b", NB_ST_F32, 1, s4, b, 16);
    path_in(path, sizeof path, "model-00001-of-00002.safetensors");
    CHECK(nb_st_write(path, t, 2, NULL, 0) == NB_OK, "shard 1: %s", nb_last_error());
    t[0] = tensor("c", NB_ST_U8, 1, s4, c, 4);
    path_in(path, sizeof path, "model-00002-of-00002.safetensors");
    CHECK(nb_st_write(path, t, 1, NULL, 0) == NB_OK, "shard 2: %s", nb_last_error());
    t[0] = tensor("a", NB_ST_U8, 1, s2, a, 2); /* "a" again: a tensor in two shards */
    t[1] = tensor("e", NB_ST_U8, 1, s2, e, 2);
    path_in(path, sizeof path, "extra.safetensors");
    CHECK(nb_st_write(path, t, 2, NULL, 0) == NB_OK, "shard 3: %s", nb_last_error());

    static const char good[] =
        "{\"metadata\": {\"total_size\": 22}, \"weight_map\": {\"a\": \"model-00001-of-00002.safetensors\", "
        "\"b\": \"model-00001-of-00002.safetensors\", \"c\": \"model-00002-of-00002.safetensors\"}}";
    write_text("model.safetensors.index.json", good);
    nb_st_index *x = NULL;
    nb_status st = nb_st_index_open(g_dir, &x);
    CHECK(st == NB_OK, "index by directory: %s: %s", sname(st), nb_last_error());
    if (st == NB_OK) {
        size_t n = 0, ns = 0;
        nb_st_index_count(x, &n);
        nb_st_index_shard_count(x, &ns);
        CHECK(n == 3 && ns == 2, "index: %zu tensors, %zu shards", n, ns);
        nb_st_tensor r;
        st = nb_st_index_tensor_find(x, "c", &r);
        CHECK(st == NB_OK && r.bytes == 4 && !memcmp(r.data, c, 4), "index find c: %s", nb_last_error());
        st = nb_st_index_tensor_find(x, "b", &r);
        CHECK(st == NB_OK && r.bytes == 16 && !memcmp(r.data, b, 16), "index find b: %s", nb_last_error());
        st = nb_st_index_tensor_at(x, 0, &r);
        CHECK(st == NB_OK && !strcmp(r.name, "a"), "index tensor_at 0");
        st = nb_st_index_tensor_find(x, "zz", &r);
        CHECK(st == NB_ERR_NOT_FOUND, "index find missing: %s", sname(st));
        nb_st_index_close(x);
    }
    expect_index("good by file", good, NB_OK, "");
    expect_index("dotdot shard", "{\"weight_map\": {\"a\": \"../x.safetensors\"}}", NB_ERR_CORRUPT, "basename");
    expect_index("absolute shard", "{\"weight_map\": {\"a\": \"/abs\"}}", NB_ERR_CORRUPT, "basename");
    expect_index("empty shard", "{\"weight_map\": {\"a\": \"\"}}", NB_ERR_CORRUPT, "is empty");
    expect_index("backslash shard", "{\"weight_map\": {\"a\": \"x\\\\y.safetensors\"}}", NB_ERR_CORRUPT, "'\\'");
    expect_index("shard not string", "{\"weight_map\": {\"a\": 1}}", NB_ERR_CORRUPT, "not a string");
    expect_index("missing from shard",
                 "{\"weight_map\": {\"a\": \"model-00001-of-00002.safetensors\", \"b\": "
                 "\"model-00001-of-00002.safetensors\", \"c\": \"model-00002-of-00002.safetensors\", "
                 "\"d\": \"model-00002-of-00002.safetensors\"}}",
                 NB_ERR_NOT_FOUND, "not in its shard");
    expect_index("in two shards",
                 "{\"weight_map\": {\"a\": \"model-00001-of-00002.safetensors\", \"b\": "
                 "\"model-00001-of-00002.safetensors\", \"e\": \"extra.safetensors\"}}",
                 NB_ERR_CORRUPT, "none in two");
    expect_index("unlisted tensor", "{\"weight_map\": {\"a\": \"model-00001-of-00002.safetensors\"}}", NB_ERR_CORRUPT,
                 "not in weight_map");
    expect_index("listed twice",
                 "{\"weight_map\": {\"c\": \"model-00002-of-00002.safetensors\", "
                 "\"c\": \"model-00002-of-00002.safetensors\"}}", NB_ERR_CORRUPT, "listed twice");
    expect_index("missing shard file", "{\"weight_map\": {\"q\": \"model-00009-of-00009.safetensors\"}}", NB_ERR_IO,
                 "cannot open");
    expect_index("no weight_map", "{\"metadata\": {}}", NB_ERR_CORRUPT, "weight_map");
    expect_index("bad json", "{\"weight_map\": {", NB_ERR_CORRUPT, "valid JSON");
    path_in(path, sizeof path, "no-index-here");
    mkdir(path, 0755);
    st = nb_st_index_open(path, &x);
    CHECK(st == NB_ERR_IO && strstr(nb_last_error(), "model.safetensors.index.json"), "directory without index: %s %s",
          sname(st), nb_last_error());
}

/* ------------------------------------------------------------ seed corpus */

static int write_corpus(const char *dir) {
    char path[512];
    nb_st_tensor t[8];
    size_t n = roundtrip_tensors(t);
    const char *meta[] = {"producer", "nibble"};
    snprintf(path, sizeof path, "%s/roundtrip.safetensors", dir);
    if (nb_st_write(path, t, n, meta, 1)) { printf("%s\n", nb_last_error()); return 1; }
    snprintf(path, sizeof path, "%s/empty.safetensors", dir);
    if (nb_st_write(path, NULL, 0, NULL, 0)) { printf("%s\n", nb_last_error()); return 1; }
    static const struct { const char *name, *hdr; size_t data; } raw[] = {
        {"scalar_zero", "{\"s\":{\"dtype\":\"F32\",\"shape\":[],\"data_offsets\":[0,4]},"
                        "\"z\":{\"dtype\":\"F16\",\"shape\":[0,3],\"data_offsets\":[4,4]}}", 4},
        {"f4_f6", "{\"a\":{\"dtype\":\"F4\",\"shape\":[4],\"data_offsets\":[0,2]},"
                  "\"b\":{\"dtype\":\"F6_E3M2\",\"shape\":[4],\"data_offsets\":[2,5]}}", 5},
        {"overlap", "{\"a\":{\"dtype\":\"U8\",\"shape\":[8],\"data_offsets\":[0,8]},"
                    "\"b\":{\"dtype\":\"U8\",\"shape\":[8],\"data_offsets\":[4,12]}}", 12},
        {"escapes", "{\"\\u0041\\n\":{\"dtype\":\"BOOL\",\"shape\":[1],\"data_offsets\":[0,1]},"
                    "\"__metadata__\":{\"k\":\"\\ud83d\\ude00\"}}", 1},
    };
    for (size_t i = 0; i < sizeof raw / sizeof raw[0]; i++) {
        image im = img(raw[i].hdr, raw[i].data);
        snprintf(path, sizeof path, "%s/%s.safetensors", dir, raw[i].name);
        write_file(path, im.p, im.n);
        free(im.p);
    }
    return 0;
}

int main(int argc, char **argv) {
    if (argc == 3 && !strcmp(argv[1], "--write-corpus")) return write_corpus(argv[2]);
    const char *tmp = getenv("TMPDIR");
    snprintf(g_dir, sizeof g_dir, "%s/nb_st_test.XXXXXX", tmp && tmp[0] ? tmp : "/tmp");
    if (!mkdtemp(g_dir)) {
        printf("cannot create a temporary directory\n");
        return 2;
    }
    test_roundtrip();
    test_malformed();
    test_writer_errors();
    test_index();
    if (g_fail == 0) { /* keep the directory for inspection on failure */
        char cmd[600];
        snprintf(cmd, sizeof cmd, "rm -rf '%s'", g_dir);
        if (system(cmd) != 0) printf("note: could not remove %s\n", g_dir);
    } else {
        printf("files kept in %s\n", g_dir);
    }
    printf("%d passed, %d failed\n", g_pass, g_fail);
    return g_fail ? 1 : 0;
}
