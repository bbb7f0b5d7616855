/* test_tune.c - the tuning table and its cache file (src/tune.c), without a
 * device: the library's C sources are compiled into this test (with the
 * no-CUDA stubs), so the internal lookup is reachable on a host-only context.
 *
 *   test_tune DIR     (scratch files go to DIR; exit 0 pass, 1 fail)
 *
 * - the m buckets cover every m once, in order;
 * - round trip: entries of each path (decode, tc, mma) set through
 *   nb_context_set_tuning, written by
 *   nb_context_save_tuning (what `nibble tune` writes with), loaded into a
 *   fresh context: lookups hit for every m of the right bucket and miss for
 *   another bucket, shape, format, dtype or GPU name; other GPUs' entries
 *   survive a save; duplicates replace;
 * - malformed caches (truncated JSON, trailing text, wrong types, out-of-range
 *   kw/splits/bn/raster, unknown names, huge numbers, wrong version, fields of
 *   the other path, duplicate keys, ...) are each rejected with their status
 *   and a message naming the file, the entry and the field, and the table is
 *   left as it was;
 * - NIBBLE_TUNE_CACHE at context creation: missing file ignored, valid file
 *   loaded, malformed file refused;
 * - bad arguments of every tuning function.
 * Built a second time without cJSON (test_tune_nocjson): the files are then
 * refused with NB_ERR_UNSUPPORTED and the table still works. */
#define _POSIX_C_SOURCE 200809L
#include "internal.h"

#include <dirent.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "check.h"

static const char *g_dir;

static const char *path_of(const char *name) {
    static char buf[4][1024];
    static int i;
    i = (i + 1) % 4;
    snprintf(buf[i], sizeof buf[i], "%s/%s", g_dir, name);
    return buf[i];
}

static void write_file(const char *path, const char *text) {
    FILE *f = fopen(path, "wb");
    if (!f) {
        printf("cannot write %s\n", path);
        exit(1);
    }
    fputs(text, f);
    fclose(f);
}

static nb_gemm_desc problem(nb_format fmt, nb_dtype act, int64_t n, int64_t k, int64_t m) {
    nb_weight_desc w;
    nb_gemm_desc g;
    nb_weight_desc_init(&w, fmt, n, k);
    nb_gemm_desc_init(&g, &w, m, act, act);
    return g;
}

static nb_gemm_config decode_cfg(int kw, int splits, int variant, int rpw) {
    nb_gemm_config c;
    memset(&c, 0, sizeof c);
    c.path = NB_GEMM_PATH_DECODE, c.kw = kw, c.splits = splits, c.variant = variant, c.rpw = rpw;
    return c;
}

static nb_gemm_config tc_cfg(int bn, int raster, int splits) {
    nb_gemm_config c;
    memset(&c, 0, sizeof c);
    c.path = NB_GEMM_PATH_TENSOR_CORE, c.bn = bn, c.raster = raster, c.splits = splits;
    return c;
}

static nb_gemm_config mma_cfg(int bn, int raster) {
    nb_gemm_config c = tc_cfg(bn, raster, 1); /* (the mma path does not split k) */
    c.path = NB_GEMM_PATH_MMA;
    return c;
}

static size_t count_of(const nb_context *ctx, size_t *mine) {
    size_t all = 0, dev = 0;
    nb_context_tuning_count(ctx, &all, &dev);
    if (mine) *mine = dev;
    return all;
}

static int lookup(const nb_context *ctx, nb_format fmt, nb_dtype act, int64_t n, int64_t k, int64_t m,
                  nb_gemm_config *out) {
    nb_gemm_config dummy;
    return nbi_tune_lookup(ctx, fmt, act, n, k, m, out ? out : &dummy);
}

static void test_buckets(void) {
    int64_t lo, hi, prev_hi = 0;
    int buckets = 0;
    for (int64_t m = 1; m <= 20000; m++) {
        if (nb_tuning_m_bucket(m, &lo, &hi) != NB_OK) {
            CHECK(0, "nb_tuning_m_bucket(%lld) failed", (long long)m);
            return;
        }
        CHECK(lo <= m && m <= hi, "m = %lld outside its bucket [%lld, %lld]", (long long)m, (long long)lo,
              (long long)hi);
        if (lo == m) {
            CHECK(lo == prev_hi + 1, "bucket [%lld, %lld] does not follow %lld", (long long)lo, (long long)hi,
                  (long long)prev_hi);
            prev_hi = hi;
            buckets++;
        }
    }
    CHECK(buckets == 14 && prev_hi == INT64_MAX, "%d buckets up to 20000, last hi %lld", buckets, (long long)prev_hi);
    static const int64_t expect[][3] = {{1, 1, 1},       {2, 2, 2},           {4, 3, 4},          {7, 5, 8},
                                        {16, 9, 16},     {17, 17, 32},        {64, 33, 64},       {100, 65, 128},
                                        {1024, 513, 1024}, {4096, 2049, 4096}, {4097, 4097, INT64_MAX},
                                        {(int64_t)1 << 40, 4097, INT64_MAX}};
    for (size_t i = 0; i < sizeof expect / sizeof expect[0]; i++) {
        nb_tuning_m_bucket(expect[i][0], &lo, &hi);
        CHECK(lo == expect[i][1] && hi == expect[i][2], "bucket of %lld: [%lld, %lld]", (long long)expect[i][0],
              (long long)lo, (long long)hi);
    }
    /* the workspace is sized over m = 1..32 and one m per larger bucket */
    int64_t ms[64];
    const int n = nbi_tune_workspace_ms(ms, 64);
    CHECK(n == 32 + 8 && ms[0] == 1 && ms[31] == 32 && ms[32] == 33 && ms[39] == 4097, "workspace m list: %d", n);
}

/* The members every valid test entry starts with. */
#define GOOD_HEAD "\"gpu\": \"host\", \"format\": \"nvfp4\", \"act\": \"bf16\", \"k\": 8192, \"n\": 8192, "

#ifdef NB_HAVE_CJSON
/* Entries on a host-only context (GPU name "host"), saved, then read back. */
static void test_round_trip(void) {
    nb_context *a = NULL, *b = NULL;
    if (nb_context_create(NB_DEVICE_NONE, &a) != NB_OK) {
        CHECK(0, "context: %s", nb_last_error());
        return;
    }
    const nb_gemm_desc g16 = problem(NB_FORMAT_NVFP4, NB_DTYPE_BF16, 57344, 8192, 16);
    const nb_gemm_desc g1 = problem(NB_FORMAT_NVFP4, NB_DTYPE_BF16, 57344, 8192, 1);
    const nb_gemm_desc g1k = problem(NB_FORMAT_MXFP4, NB_DTYPE_F16, 8192, 8192, 1000);
    const nb_gemm_desc g300 = problem(NB_FORMAT_NVFP4, NB_DTYPE_F16, 28672, 8192, 300);
    const nb_gemm_config c16 = decode_cfg(1, 4, 1, 2), c1 = decode_cfg(8, 2, 0, 0), c1k = tc_cfg(128, 8, 2),
                         c300 = mma_cfg(64, 4);
    CHECK(nb_context_set_tuning(a, &g16, &c16, 167.25) == NB_OK, "set: %s", nb_last_error());
    CHECK(nb_context_set_tuning(a, &g1, &c1, 101.5) == NB_OK, "set: %s", nb_last_error());
    CHECK(nb_context_set_tuning(a, &g1k, &c1k, 512.125) == NB_OK, "set: %s", nb_last_error());
    CHECK(nb_context_set_tuning(a, &g300, &c300, 95.0) == NB_OK, "set: %s", nb_last_error());
    CHECK(count_of(a, NULL) == 4, "4 entries, got %zu", count_of(a, NULL));
    const nb_gemm_config c16b = decode_cfg(2, 1, 0, 0);
    CHECK(nb_context_set_tuning(a, &g16, &c16b, 170.0) == NB_OK, "replace: %s", nb_last_error());
    CHECK(count_of(a, NULL) == 4, "a second set for the same bucket replaces: %zu entries", count_of(a, NULL));
    nb_gemm_config got;
    CHECK(lookup(a, NB_FORMAT_NVFP4, NB_DTYPE_BF16, 57344, 8192, 12, &got) && got.kw == 2 && got.variant == 0,
          "replaced entry not found");
    CHECK(nb_context_set_tuning(a, &g16, &c16, 167.25) == NB_OK, "set: %s", nb_last_error());

    const char *file = path_of("cache.json");
    remove(file);
    CHECK(nb_context_save_tuning(a, file) == NB_OK, "save: %s", nb_last_error());
    /* no temporary file left behind */
    DIR *d = opendir(g_dir);
    int stray = 0;
    for (struct dirent *e; d && (e = readdir(d));) stray += strstr(e->d_name, ".tmp.") != NULL;
    if (d) closedir(d);
    CHECK(stray == 0, "%d temporary files left in %s", stray, g_dir);

    nb_context_create(NB_DEVICE_NONE, &b);
    CHECK(nb_context_load_tuning(b, file) == NB_OK, "load: %s", nb_last_error());
    size_t mine;
    CHECK(count_of(b, &mine) == 4 && mine == 4, "loaded %zu entries, %zu for this GPU", count_of(b, NULL), mine);
    /* every m of the bucket 9-16 hits, its neighbours do not */
    for (int64_t m = 9; m <= 16; m++) {
        memset(&got, 0, sizeof got);
        CHECK(lookup(b, NB_FORMAT_NVFP4, NB_DTYPE_BF16, 57344, 8192, m, &got) && !memcmp(&got, &c16, sizeof got),
              "m = %lld: no entry, or not the one written (path %d kw %d splits %d variant %d rpw %d)", (long long)m,
              got.path, got.kw, got.splits, got.variant, got.rpw);
    }
    CHECK(!lookup(b, NB_FORMAT_NVFP4, NB_DTYPE_BF16, 57344, 8192, 8, NULL), "m = 8 hit the 9-16 entry");
    CHECK(!lookup(b, NB_FORMAT_NVFP4, NB_DTYPE_BF16, 57344, 8192, 17, NULL), "m = 17 hit the 9-16 entry");
    CHECK(lookup(b, NB_FORMAT_NVFP4, NB_DTYPE_BF16, 57344, 8192, 1, &got) && !memcmp(&got, &c1, sizeof got),
          "m = 1 entry");
    CHECK(!lookup(b, NB_FORMAT_NVFP4, NB_DTYPE_BF16, 57344, 8192, 2, NULL), "m = 2 hit the m = 1 entry");
    CHECK(lookup(b, NB_FORMAT_MXFP4, NB_DTYPE_F16, 8192, 8192, 513, &got) && !memcmp(&got, &c1k, sizeof got),
          "tensor-core entry at m = 513");
    CHECK(lookup(b, NB_FORMAT_MXFP4, NB_DTYPE_F16, 8192, 8192, 1024, NULL), "m = 1024");
    CHECK(!lookup(b, NB_FORMAT_MXFP4, NB_DTYPE_F16, 8192, 8192, 1025, NULL), "m = 1025 hit the 513-1024 entry");
    CHECK(lookup(b, NB_FORMAT_NVFP4, NB_DTYPE_F16, 28672, 8192, 257, &got) && !memcmp(&got, &c300, sizeof got),
          "mma entry at m = 257 (path %d bn %d raster %d)", got.path, got.bn, got.raster);
    /* other shape, format, dtype */
    CHECK(!lookup(b, NB_FORMAT_NVFP4, NB_DTYPE_BF16, 8192, 57344, 16, NULL), "n and k swapped hit");
    CHECK(!lookup(b, NB_FORMAT_MXFP4, NB_DTYPE_BF16, 57344, 8192, 16, NULL), "other format hit");
    CHECK(!lookup(b, NB_FORMAT_NVFP4, NB_DTYPE_F16, 57344, 8192, 16, NULL), "other dtype hit");
    CHECK(!lookup(b, NB_FORMAT_MXFP4, NB_DTYPE_BF16, 8192, 8192, 1000, NULL), "other dtype hit (tc)");

    /* another GPU: nothing hits, but the entries are kept and written back */
    nb_context *c = NULL;
    nb_context_create(NB_DEVICE_NONE, &c);
    snprintf(c->info.name, sizeof c->info.name, "NVIDIA H100 80GB HBM3");
    CHECK(nb_context_load_tuning(c, file) == NB_OK, "load: %s", nb_last_error());
    CHECK(count_of(c, &mine) == 4 && mine == 0, "another GPU: %zu entries, %zu for it", count_of(c, NULL), mine);
    CHECK(!lookup(c, NB_FORMAT_NVFP4, NB_DTYPE_BF16, 57344, 8192, 16, NULL), "an entry for \"host\" hit on an H100");
    const nb_gemm_config own = tc_cfg(256, 16, 1);
    const nb_gemm_desc gown = problem(NB_FORMAT_NVFP4, NB_DTYPE_BF16, 57344, 8192, 4096);
    CHECK(nb_context_set_tuning(c, &gown, &own, 2500) == NB_OK, "set: %s", nb_last_error());
    const char *file2 = path_of("cache2.json");
    CHECK(nb_context_save_tuning(c, file2) == NB_OK, "save: %s", nb_last_error());
    CHECK(nb_context_load_tuning(b, file2) == NB_OK, "load: %s", nb_last_error());
    CHECK(count_of(b, &mine) == 5 && mine == 4, "merged file: %zu entries, %zu for host", count_of(b, NULL), mine);
    CHECK(!lookup(b, NB_FORMAT_NVFP4, NB_DTYPE_BF16, 57344, 8192, 4096, NULL), "the H100 entry hit on host");
    CHECK(lookup(c, NB_FORMAT_NVFP4, NB_DTYPE_BF16, 57344, 8192, 3000, &got) && got.bn == 256, "H100 entry");
    /* save is a replacement: the same table written twice gives the same bytes */
    const char *file3 = path_of("cache3.json");
    CHECK(nb_context_save_tuning(b, file3) == NB_OK && nb_context_save_tuning(b, file2) == NB_OK, "save twice");
    FILE *f2 = fopen(file2, "rb"), *f3 = fopen(file3, "rb");
    char t2[8192] = "", t3[8192] = "";
    if (f2) t2[fread(t2, 1, sizeof t2 - 1, f2)] = 0;
    if (f3) t3[fread(t3, 1, sizeof t3 - 1, f3)] = 0;
    if (f2) fclose(f2);
    if (f3) fclose(f3);
    CHECK(t2[0] && !strcmp(t2, t3), "saving the same table twice differs");
    CHECK(strstr(t2, "\"version\": 1") && strstr(t2, "\"m\":\"9-16\"") && strstr(t2, "\"variant\":\"staged\"") &&
              strstr(t2, "\"us\":167.25") && strstr(t2, "\"path\":\"tc\"") &&
              strstr(t2, "\"path\":\"mma\",\"bn\":64,\"raster\":4"),
          "file text:\n%s", t2);

    /* removing an entry */
    CHECK(nb_context_set_tuning(b, &g16, NULL, 0) == NB_OK, "remove: %s", nb_last_error());
    CHECK(!lookup(b, NB_FORMAT_NVFP4, NB_DTYPE_BF16, 57344, 8192, 16, NULL) && count_of(b, NULL) == 4, "removed");
    CHECK(nb_context_set_tuning(b, &g16, NULL, 0) == NB_OK, "removing twice");

    /* without a device the planner still refuses cleanly, table or not */
    nb_gemm_desc gp = g16;
    gp.weight.layout = NB_LAYOUT_PACKED;
    CHECK(nb_gemm_can_implement(a, &gp) == NB_ERR_NO_DEVICE, "can_implement on a host context");
    size_t nconf = 7;
    CHECK(nb_gemm_list_configs(a, &gp, NULL, 0, &nconf) == NB_ERR_NO_DEVICE && nb_context_last_error(a)[0],
          "list_configs on a host context");
    nb_context_destroy(a);
    nb_context_destroy(b);
    nb_context_destroy(c);
}

/* One malformed (or odd) cache: its status and words of its message. */
static void expect_load(const char *name, const char *text, nb_status want, const char *words) {
    nb_context *ctx = NULL;
    nb_context_create(NB_DEVICE_NONE, &ctx);
    const nb_gemm_desc g = problem(NB_FORMAT_NVFP4, NB_DTYPE_BF16, 4096, 4096, 1);
    const nb_gemm_config c = decode_cfg(4, 1, 0, 0);
    nb_context_set_tuning(ctx, &g, &c, 10.0); /* a table that must survive a failed load */
    const char *file = path_of(name);
    write_file(file, text);
    const nb_status st = nb_context_load_tuning(ctx, file);
    const char *msg = nb_context_last_error(ctx);
    CHECK(st == want, "%s: %s, want %s (%s)", name, nb_status_name(st), nb_status_name(want), msg);
    if (want != NB_OK) {
        CHECK(strstr(msg, file) != NULL, "%s: the message does not name the file: %s", name, msg);
        CHECK(strstr(msg, words) != NULL, "%s: the message lacks \"%s\": %s", name, words, msg);
        CHECK(!strcmp(msg, nb_last_error()), "%s: context and thread messages differ", name);
        CHECK(count_of(ctx, NULL) == 1 && lookup(ctx, NB_FORMAT_NVFP4, NB_DTYPE_BF16, 4096, 4096, 1, NULL),
              "%s: a failed load changed the table", name);
    }
    nb_context_destroy(ctx);
}

/* Two host contexts (0 and both NULL on failure, reported). */
static int two_contexts(nb_context **a, nb_context **b) {
    if (nb_context_create(NB_DEVICE_NONE, a) == NB_OK && nb_context_create(NB_DEVICE_NONE, b) == NB_OK) return 1;
    CHECK(0, "context: %s", nb_last_error());
    nb_context_destroy(*a);
    *a = *b = NULL;
    return 0;
}

/* Save a's table to file (replacing it) and read the file back as text. */
static void save_text(nb_context *a, const char *file, char *text, size_t n) {
    remove(file);
    CHECK(nb_context_save_tuning(a, file) == NB_OK, "save: %s", nb_last_error());
    text[0] = 0;
    FILE *f = fopen(file, "rb");
    if (f) {
        text[fread(text, 1, n - 1, f)] = 0;
        fclose(f);
    }
}

/* Two entries through a cache file: set in a, saved to `name` (whose text
 * must hold both `words`), loaded into b and looked up at m_at[i] (another
 * m of each entry's bucket): each configuration read back equal. */
static void round_trip(nb_context *a, nb_context *b, const char *name, const nb_gemm_desc g[2],
                       const nb_gemm_config c[2], const double us[2], const int64_t m_at[2], const char *words[2]) {
    for (int i = 0; i < 2; i++)
        CHECK(nb_context_set_tuning(a, &g[i], &c[i], us[i]) == NB_OK, "%s: set %s: %s", name, words[i], nb_last_error());
    const char *file = path_of(name);
    char text[4096];
    save_text(a, file, text, sizeof text);
    CHECK(strstr(text, words[0]) && strstr(text, words[1]), "%s: the file names %s and %s: %s", name, words[0],
          words[1], text);
    CHECK(nb_context_load_tuning(b, file) == NB_OK, "%s: load: %s", name, nb_last_error());
    for (int i = 0; i < 2; i++) {
        nb_gemm_config got;
        memset(&got, 0, sizeof got);
        CHECK(lookup(b, g[i].weight.format, g[i].act_dtype, g[i].weight.n, g[i].weight.k, m_at[i], &got) &&
                  !memcmp(&got, &c[i], sizeof got),
              "%s: m = %lld: %s not read back equal (warps %d, stream_k %d)", name, (long long)m_at[i], words[i],
              (int)got.warps, (int)got.stream_k);
    }
}

/* nb_gemm_config.warps through a cache: written as "warps" where set, read
 * back equal; an entry without it (a cache from before the field) reads
 * as 0, the planner's choice. */
static void test_warps_round_trip(void) {
    nb_context *a = NULL, *b = NULL;
    if (!two_contexts(&a, &b)) return;
    const nb_gemm_desc g[2] = {problem(NB_FORMAT_NVFP4, NB_DTYPE_BF16, 18432, 7168, 24),
                               problem(NB_FORMAT_NVFP4, NB_DTYPE_BF16, 18432, 7168, 12)};
    nb_gemm_config c[2] = {decode_cfg(1, 1, 1, 2), decode_cfg(1, 2, 1, 2)};
    c[0].warps = 12, c[1].warps = 8;
    const double us[2] = {40.875, 30.5};
    const int64_t m_at[2] = {20, 12};
    const char *words[2] = {"\"warps\":12", "\"warps\":8"};
    round_trip(a, b, "warps.json", g, c, us, m_at, words);
    nb_gemm_config got;
    /* a cache from before the field */
    const char *old = path_of("warps_old.json");
    write_file(old, "{\"version\": 1, \"entries\": [{\"gpu\": \"host\", \"format\": \"nvfp4\", \"act\": \"bf16\", "
                    "\"k\": 7168, \"n\": 18432, \"m\": \"17-32\", \"path\": \"decode\", \"kw\": 1, \"splits\": 1, "
                    "\"variant\": \"staged\", \"rpw\": 2, \"us\": 41}]}");
    CHECK(nb_context_load_tuning(b, old) == NB_OK, "load a cache without warps: %s", nb_last_error());
    memset(&got, 0xff, sizeof got);
    CHECK(lookup(b, NB_FORMAT_NVFP4, NB_DTYPE_BF16, 18432, 7168, 24, &got) && got.warps == 0 && got.rpw == 2,
          "an entry without warps reads as warps = 0 (got %d)", (int)got.warps);
    nb_context_destroy(a);
    nb_context_destroy(b);
}

/* nb_gemm_config.stream_k through a cache: 1 and -1 written as "stream_k"
 * and read back equal; an entry without it reads as 0 (the planner's
 * choice); set_tuning refuses it with a k split or off the tc path. */
static void test_stream_k_round_trip(void) {
    nb_context *a = NULL, *b = NULL;
    if (!two_contexts(&a, &b)) return;
    const nb_gemm_desc g[2] = {problem(NB_FORMAT_NVFP4, NB_DTYPE_BF16, 10240, 8192, 96),
                               problem(NB_FORMAT_MXFP4, NB_DTYPE_BF16, 10240, 8192, 256)};
    nb_gemm_config c[2] = {tc_cfg(128, 16, 1), tc_cfg(256, 8, 1)};
    c[0].stream_k = 1, c[1].stream_k = -1;
    const double us[2] = {40.625, 64.5};
    const int64_t m_at[2] = {72, 200};
    const char *words[2] = {"\"stream_k\":1", "\"stream_k\":-1"};
    round_trip(a, b, "stream_k.json", g, c, us, m_at, words);
    const nb_gemm_desc g96 = g[0];
    nb_gemm_config got;
    const char *old = path_of("stream_k_old.json");
    write_file(old, "{\"version\": 1, \"entries\": [{\"gpu\": \"host\", \"format\": \"nvfp4\", \"act\": \"bf16\", "
                    "\"k\": 8192, \"n\": 10240, \"m\": \"65-128\", \"path\": \"tc\", \"bn\": 128, \"raster\": 16, "
                    "\"splits\": 1, \"us\": 41}]}");
    CHECK(nb_context_load_tuning(b, old) == NB_OK, "load a cache without stream_k: %s", nb_last_error());
    memset(&got, 0xff, sizeof got);
    CHECK(lookup(b, NB_FORMAT_NVFP4, NB_DTYPE_BF16, 10240, 8192, 100, &got) && got.stream_k == 0 && got.bn == 128,
          "an entry without stream_k reads as 0 (got %d)", (int)got.stream_k);
    nb_gemm_config bad = tc_cfg(128, 16, 2);
    bad.stream_k = 1;
    CHECK(nb_context_set_tuning(a, &g96, &bad, 40.0) == NB_ERR_INVALID_ARGUMENT &&
              strstr(nb_last_error(), "takes no k split"),
          "stream_k = 1 with two splits refused: %s", nb_last_error());
    bad = decode_cfg(4, 1, 0, 0);
    bad.stream_k = -1;
    CHECK(nb_context_set_tuning(a, &g96, &bad, 40.0) == NB_ERR_INVALID_ARGUMENT &&
              strstr(nb_last_error(), "for path tc only"),
          "stream_k on the decode path refused: %s", nb_last_error());
    nb_context_destroy(a);
    nb_context_destroy(b);
}

/* An entry (JSON members) inside a valid file. */
static void expect_entry(const char *name, const char *members, nb_status want, const char *words) {
    char text[2048];
    snprintf(text, sizeof text, "{\"version\": 1, \"entries\": [\n {%s}\n]}\n", members);
    expect_load(name, text, want, words);
}

static void test_malformed(void) {
    /* the baseline: accepted */
    expect_entry("ok_decode.json", GOOD_HEAD "\"m\": \"1\", \"path\": \"decode\", \"kw\": 4, \"splits\": 1, "
                 "\"variant\": \"plain\", \"us\": 19.5, \"note\": \"unknown keys are ignored\"", NB_OK, "");
    expect_entry("ok_tc.json", GOOD_HEAD "\"m\": \"4097+\", \"m_tuned\": 8192, \"path\": \"tc\", \"bn\": 256, "
                 "\"raster\": 1024, \"us\": 0", NB_OK, "");
    expect_entry("ok_mma.json", GOOD_HEAD "\"m\": \"257-512\", \"path\": \"mma\", \"bn\": 128, \"raster\": 16, "
                 "\"us\": 40", NB_OK, "");
    expect_load("ok_empty.json", "{\"version\": 1, \"entries\": []}", NB_OK, "");

    {
        nb_context *ctx = NULL;
        nb_context_create(NB_DEVICE_NONE, &ctx);
        const char *file = path_of("does-not-exist.json");
        remove(file);
        CHECK(nb_context_load_tuning(ctx, file) == NB_ERR_IO && strstr(nb_context_last_error(ctx), file) &&
                  strstr(nb_context_last_error(ctx), "No such file"),
              "missing file: %s", nb_context_last_error(ctx));
        CHECK(nb_context_load_tuning(ctx, g_dir) == NB_ERR_IO, "a directory: %s", nb_context_last_error(ctx));
        nb_context_destroy(ctx);
    }
    /* JSON syntax */
    expect_load("empty.json", "", NB_ERR_CORRUPT, "not valid JSON");
    expect_load("truncated.json", "{\"version\": 1, \"entries\": [{\"gpu\": \"host\", \"format\": \"nv", NB_ERR_CORRUPT,
                "not valid JSON (line 1, column 55");
    expect_load("truncated2.json", "{\"version\": 1,\n \"entries\": [\n", NB_ERR_CORRUPT, "line 2, column 14: the text ends early");
    expect_load("trailing.json", "{\"version\": 1, \"entries\": []} {}", NB_ERR_CORRUPT, "text after");
    expect_load("trailing_space.json", "{\"version\": 1, \"entries\": []}\n", NB_OK, "");
    expect_load("array.json", "[1, 2]", NB_ERR_CORRUPT, "top level must be an object");
    expect_load("no_version.json", "{\"entries\": []}", NB_ERR_CORRUPT, "\"version\" is missing");
    expect_load("version_string.json", "{\"version\": \"1\", \"entries\": []}", NB_ERR_CORRUPT, "not a number");
    expect_load("version2.json", "{\"version\": 2, \"entries\": []}", NB_ERR_UNSUPPORTED, "version 2");
    expect_load("version_huge.json", "{\"version\": 1e999, \"entries\": []}", NB_ERR_UNSUPPORTED, "version");
    expect_load("version_twice.json", "{\"version\": 1, \"version\": 2, \"entries\": []}", NB_ERR_CORRUPT, "twice");
    expect_load("entries_object.json", "{\"version\": 1, \"entries\": {}}", NB_ERR_CORRUPT, "not an array");
    expect_load("entry_number.json", "{\"version\": 1, \"entries\": [5]}", NB_ERR_CORRUPT, "entry 0: is not an object");
    /* wrong types */
    expect_entry("n_string.json", "\"gpu\": \"host\", \"format\": \"nvfp4\", \"act\": \"bf16\", \"k\": 8192, "
                 "\"n\": \"8192\", \"m\": \"1\", \"path\": \"decode\", \"kw\": 4, \"splits\": 1, \"variant\": \"plain\", "
                 "\"us\": 1", NB_ERR_CORRUPT, "\"n\" must be a number");
    expect_entry("gpu_number.json", "\"gpu\": 7, \"format\": \"nvfp4\", \"act\": \"bf16\", \"k\": 8192, \"n\": 8192, "
                 "\"m\": \"1\", \"path\": \"decode\", \"kw\": 4, \"splits\": 1, \"variant\": \"plain\", \"us\": 1",
                 NB_ERR_CORRUPT, "\"gpu\" must be a string");
    expect_entry("m_number.json", GOOD_HEAD "\"m\": 1, \"path\": \"decode\", \"kw\": 4, \"splits\": 1, "
                 "\"variant\": \"plain\", \"us\": 1", NB_ERR_CORRUPT, "\"m\" must be a string");
    expect_entry("kw_bool.json", GOOD_HEAD "\"m\": \"1\", \"path\": \"decode\", \"kw\": true, \"splits\": 1, "
                 "\"variant\": \"plain\", \"us\": 1", NB_ERR_CORRUPT, "\"kw\" must be a number");
    expect_entry("us_null.json", GOOD_HEAD "\"m\": \"1\", \"path\": \"decode\", \"kw\": 4, \"splits\": 1, "
                 "\"variant\": \"plain\", \"us\": null", NB_ERR_CORRUPT, "\"us\"");
    expect_entry("kw_fraction.json", GOOD_HEAD "\"m\": \"1\", \"path\": \"decode\", \"kw\": 4.5, \"splits\": 1, "
                 "\"variant\": \"plain\", \"us\": 1", NB_ERR_CORRUPT, "not an integer");
    /* out of range */
    expect_entry("kw3.json", GOOD_HEAD "\"m\": \"1\", \"path\": \"decode\", \"kw\": 3, \"splits\": 1, "
                 "\"variant\": \"plain\", \"us\": 1", NB_ERR_CORRUPT, "kw = 3 is not 1, 2, 4 or 8");
    expect_entry("kw_negative.json", GOOD_HEAD "\"m\": \"1\", \"path\": \"decode\", \"kw\": -4, \"splits\": 1, "
                 "\"variant\": \"plain\", \"us\": 1", NB_ERR_CORRUPT, "\"kw\"");
    expect_entry("splits0.json", GOOD_HEAD "\"m\": \"1\", \"path\": \"decode\", \"kw\": 4, \"splits\": 0, "
                 "\"variant\": \"plain\", \"us\": 1", NB_ERR_CORRUPT, "splits = 0 is not in 1..64");
    expect_entry("splits65.json", GOOD_HEAD "\"m\": \"1\", \"path\": \"decode\", \"kw\": 4, \"splits\": 65, "
                 "\"variant\": \"plain\", \"us\": 1", NB_ERR_CORRUPT, "splits = 65");
    expect_entry("mma_bn256.json", GOOD_HEAD "\"m\": \"65-128\", \"path\": \"mma\", \"bn\": 256, \"raster\": 16, "
                 "\"us\": 1", NB_ERR_CORRUPT, "bn = 256 is not 64, 128 (path mma)");
    expect_entry("mma_kw.json", GOOD_HEAD "\"m\": \"65-128\", \"path\": \"mma\", \"bn\": 64, \"raster\": 16, \"kw\": 4, "
                 "\"us\": 1", NB_ERR_CORRUPT, "\"kw\" is not a field of path mma");
    expect_entry("mma_rpw.json", GOOD_HEAD "\"m\": \"65-128\", \"path\": \"mma\", \"bn\": 64, \"raster\": 16, \"rpw\": 1, "
                 "\"us\": 1", NB_ERR_CORRUPT, "\"rpw\" is not a field of path mma");
    expect_entry("mma_no_bn.json", GOOD_HEAD "\"m\": \"65-128\", \"path\": \"mma\", \"raster\": 16, \"us\": 1",
                 NB_ERR_CORRUPT, "\"bn\" is missing (path mma)");
    expect_entry("bn96.json", GOOD_HEAD "\"m\": \"65-128\", \"path\": \"tc\", \"bn\": 96, \"raster\": 16, \"us\": 1",
                 NB_ERR_CORRUPT, "bn = 96 is not 64, 128, 192, 256, 16 or 32");
    expect_entry("raster0.json", GOOD_HEAD "\"m\": \"65-128\", \"path\": \"tc\", \"bn\": 64, \"raster\": 0, \"us\": 1",
                 NB_ERR_CORRUPT, "raster = 0");
    expect_entry("raster_big.json", GOOD_HEAD "\"m\": \"65-128\", \"path\": \"tc\", \"bn\": 64, \"raster\": 5000, "
                 "\"us\": 1", NB_ERR_CORRUPT, "raster = 5000");
    expect_entry("rpw3.json", GOOD_HEAD "\"m\": \"17-32\", \"path\": \"decode\", \"kw\": 1, \"splits\": 1, "
                 "\"variant\": \"staged\", \"rpw\": 3, \"us\": 1", NB_ERR_CORRUPT, "rpw = 3");
    expect_entry("staged_kw4.json", GOOD_HEAD "\"m\": \"17-32\", \"path\": \"decode\", \"kw\": 4, \"splits\": 1, "
                 "\"variant\": \"staged\", \"rpw\": 1, \"us\": 1", NB_ERR_CORRUPT, "needs kw = 1");
    expect_entry("staged_m1.json", GOOD_HEAD "\"m\": \"1\", \"path\": \"decode\", \"kw\": 1, \"splits\": 1, "
                 "\"variant\": \"staged\", \"rpw\": 2, \"us\": 1", NB_OK, "");
    expect_entry("warps10.json", GOOD_HEAD "\"m\": \"17-32\", \"path\": \"decode\", \"kw\": 1, \"splits\": 1, "
                 "\"variant\": \"staged\", \"rpw\": 2, \"warps\": 10, \"us\": 1", NB_ERR_CORRUPT, "warps = 10 is not 7, 8 or 12");
    /* four row blocks per warp (7 warps at 25..32 tokens): an entry of the 17..32 bucket loads, one
     * of 7 warps with rpw 2, of rpw 4 below 17 tokens or with a k split does not */
    expect_entry("rpw4.json", GOOD_HEAD "\"m\": \"17-32\", \"path\": \"decode\", \"kw\": 1, \"splits\": 1, "
                 "\"variant\": \"staged\", \"rpw\": 4, \"warps\": 7, \"us\": 1", NB_OK, "");
    expect_entry("warps7_rpw2.json", GOOD_HEAD "\"m\": \"17-32\", \"path\": \"decode\", \"kw\": 1, \"splits\": 1, "
                 "\"variant\": \"staged\", \"rpw\": 2, \"warps\": 7, \"us\": 1", NB_ERR_CORRUPT, "needs rpw = 4");
    expect_entry("rpw4_m16.json", GOOD_HEAD "\"m\": \"9-16\", \"path\": \"decode\", \"kw\": 1, \"splits\": 1, "
                 "\"variant\": \"staged\", \"rpw\": 4, \"us\": 1", NB_ERR_CORRUPT, "rpw = 4 needs m >= 17");
    expect_entry("rpw4_split.json", GOOD_HEAD "\"m\": \"17-32\", \"path\": \"decode\", \"kw\": 1, \"splits\": 2, "
                 "\"variant\": \"staged\", \"rpw\": 4, \"us\": 1", NB_ERR_CORRUPT, "no k split");
    expect_entry("warps12_m16.json", GOOD_HEAD "\"m\": \"9-16\", \"path\": \"decode\", \"kw\": 1, \"splits\": 1, "
                 "\"variant\": \"staged\", \"rpw\": 2, \"warps\": 12, \"us\": 1", NB_ERR_CORRUPT, "needs m >= 17");
    expect_entry("warps_plain.json", GOOD_HEAD "\"m\": \"17-32\", \"path\": \"decode\", \"kw\": 1, \"splits\": 1, "
                 "\"variant\": \"plain\", \"warps\": 8, \"us\": 1", NB_ERR_CORRUPT, "staged decode variant only");
    expect_entry("warps_tc.json", GOOD_HEAD "\"m\": \"65-128\", \"path\": \"tc\", \"bn\": 64, \"raster\": 16, "
                 "\"warps\": 8, \"us\": 1", NB_ERR_CORRUPT, "\"warps\" is not a field of path tc");
    expect_entry("stream_k2.json", GOOD_HEAD "\"m\": \"65-128\", \"path\": \"tc\", \"bn\": 128, \"raster\": 16, "
                 "\"stream_k\": 2, \"us\": 1", NB_ERR_CORRUPT, "\"stream_k\" = 2 is not an integer in [-1, 1]");
    expect_entry("stream_k_split.json", GOOD_HEAD "\"m\": \"65-128\", \"path\": \"tc\", \"bn\": 128, \"raster\": 16, "
                 "\"splits\": 3, \"stream_k\": 1, \"us\": 1", NB_ERR_CORRUPT, "takes no k split");
    expect_entry("stream_k_decode.json", GOOD_HEAD "\"m\": \"1\", \"path\": \"decode\", \"kw\": 4, \"splits\": 1, "
                 "\"variant\": \"plain\", \"stream_k\": 1, \"us\": 1", NB_ERR_CORRUPT,
                 "\"stream_k\" is not a field of path decode");
    expect_entry("stream_k_mma.json", GOOD_HEAD "\"m\": \"65-128\", \"path\": \"mma\", \"bn\": 128, \"raster\": 16, "
                 "\"stream_k\": -1, \"us\": 1", NB_ERR_CORRUPT, "\"stream_k\" is not a field of path mma");
    expect_entry("staged_no_rpw.json", GOOD_HEAD "\"m\": \"17-32\", \"path\": \"decode\", \"kw\": 1, \"splits\": 1, "
                 "\"variant\": \"staged\", \"us\": 1", NB_ERR_CORRUPT, "\"rpw\" is missing");
    expect_entry("us_negative.json", GOOD_HEAD "\"m\": \"1\", \"path\": \"decode\", \"kw\": 4, \"splits\": 1, "
                 "\"variant\": \"plain\", \"us\": -1", NB_ERR_CORRUPT, "\"us\"");
    expect_entry("k_group.json", "\"gpu\": \"host\", \"format\": \"mxfp4\", \"act\": \"bf16\", \"k\": 48, \"n\": 8, "
                 "\"m\": \"1\", \"path\": \"decode\", \"kw\": 4, \"splits\": 1, \"variant\": \"plain\", \"us\": 1",
                 NB_ERR_CORRUPT, "k = 48 is not a multiple of 32");
    expect_entry("n0.json", "\"gpu\": \"host\", \"format\": \"nvfp4\", \"act\": \"bf16\", \"k\": 64, \"n\": 0, "
                 "\"m\": \"1\", \"path\": \"decode\", \"kw\": 4, \"splits\": 1, \"variant\": \"plain\", \"us\": 1",
                 NB_ERR_CORRUPT, "\"n\" = 0");
    expect_entry("m_tuned_outside.json", GOOD_HEAD "\"m\": \"9-16\", \"m_tuned\": 17, \"path\": \"decode\", \"kw\": 4, "
                 "\"splits\": 1, \"variant\": \"plain\", \"us\": 1", NB_ERR_CORRUPT, "\"m_tuned\" = 17");
    /* huge numbers */
    expect_entry("n_huge.json", "\"gpu\": \"host\", \"format\": \"nvfp4\", \"act\": \"bf16\", \"k\": 8192, "
                 "\"n\": 1e300, \"m\": \"1\", \"path\": \"decode\", \"kw\": 4, \"splits\": 1, \"variant\": \"plain\", "
                 "\"us\": 1", NB_ERR_CORRUPT, "\"n\" = 1.0000000000000001e+300");
    expect_entry("k_huge.json", "\"gpu\": \"host\", \"format\": \"nvfp4\", \"act\": \"bf16\", "
                 "\"k\": 99999999999999999999999999, \"n\": 8192, \"m\": \"1\", \"path\": \"decode\", \"kw\": 4, "
                 "\"splits\": 1, \"variant\": \"plain\", \"us\": 1", NB_ERR_CORRUPT, "\"k\"");
    expect_entry("n_2pow31p1.json", "\"gpu\": \"host\", \"format\": \"nvfp4\", \"act\": \"bf16\", \"k\": 8192, "
                 "\"n\": 2147483649, \"m\": \"1\", \"path\": \"decode\", \"kw\": 4, \"splits\": 1, "
                 "\"variant\": \"plain\", \"us\": 1", NB_ERR_CORRUPT, "\"n\"");
    expect_entry("kw_huge.json", GOOD_HEAD "\"m\": \"1\", \"path\": \"decode\", \"kw\": 1e30, \"splits\": 1, "
                 "\"variant\": \"plain\", \"us\": 1", NB_ERR_CORRUPT, "\"kw\" = 1e+30 is not an integer");
    expect_entry("splits_inf.json", GOOD_HEAD "\"m\": \"1\", \"path\": \"decode\", \"kw\": 4, \"splits\": 1e999, "
                 "\"variant\": \"plain\", \"us\": 1", NB_ERR_CORRUPT, "\"splits\"");
    expect_entry("us_huge.json", GOOD_HEAD "\"m\": \"1\", \"path\": \"decode\", \"kw\": 4, \"splits\": 1, "
                 "\"variant\": \"plain\", \"us\": 1e300", NB_ERR_CORRUPT, "\"us\"");
    /* unknown names */
    expect_entry("path_fast.json", GOOD_HEAD "\"m\": \"1\", \"path\": \"fast\", \"kw\": 4, \"splits\": 1, "
                 "\"variant\": \"plain\", \"us\": 1", NB_ERR_CORRUPT, "\"path\" is \"fast\"");
    expect_entry("format_int2.json", "\"gpu\": \"host\", \"format\": \"int2\", \"act\": \"bf16\", \"k\": 64, "
                 "\"n\": 64, \"m\": \"1\", \"path\": \"decode\", \"kw\": 4, \"splits\": 1, \"variant\": \"plain\", "
                 "\"us\": 1", NB_ERR_CORRUPT, "\"format\" is \"int2\", not one of \"nvfp4\", \"mxfp4\", \"int4\", "
                 "\"int4_sym\", \"int8\", \"nf4\", \"bnb_fp4\"");
    expect_entry("act_f32.json", "\"gpu\": \"host\", \"format\": \"nvfp4\", \"act\": \"f32\", \"k\": 64, \"n\": 64, "
                 "\"m\": \"1\", \"path\": \"decode\", \"kw\": 4, \"splits\": 1, \"variant\": \"plain\", \"us\": 1",
                 NB_ERR_CORRUPT, "\"act\" is \"f32\"");
    expect_entry("bucket_3_5.json", GOOD_HEAD "\"m\": \"3-5\", \"path\": \"decode\", \"kw\": 4, \"splits\": 1, "
                 "\"variant\": \"plain\", \"us\": 1", NB_ERR_CORRUPT, "\"m\" is \"3-5\"");
    expect_entry("variant_x.json", GOOD_HEAD "\"m\": \"9-16\", \"path\": \"decode\", \"kw\": 4, \"splits\": 1, "
                 "\"variant\": \"turbo\", \"us\": 1", NB_ERR_CORRUPT, "\"variant\" is \"turbo\"");
    expect_entry("gpu_empty.json", "\"gpu\": \"\", \"format\": \"nvfp4\", \"act\": \"bf16\", \"k\": 64, \"n\": 64, "
                 "\"m\": \"1\", \"path\": \"decode\", \"kw\": 4, \"splits\": 1, \"variant\": \"plain\", \"us\": 1",
                 NB_ERR_CORRUPT, "\"gpu\" must have 1 to 255 bytes");
    /* structure of an entry */
    expect_entry("bn_on_decode.json", GOOD_HEAD "\"m\": \"1\", \"path\": \"decode\", \"kw\": 4, \"splits\": 1, "
                 "\"variant\": \"plain\", \"bn\": 64, \"us\": 1", NB_ERR_CORRUPT, "\"bn\" is not a field of path decode");
    expect_entry("kw_on_tc.json", GOOD_HEAD "\"m\": \"65-128\", \"path\": \"tc\", \"bn\": 64, \"raster\": 8, \"kw\": 4, "
                 "\"us\": 1", NB_ERR_CORRUPT, "\"kw\" is not a field of path tc");
    expect_entry("ok_tc_split.json", GOOD_HEAD "\"m\": \"33-64\", \"path\": \"tc\", \"bn\": 64, \"raster\": 16, "
                 "\"splits\": 2, \"us\": 1", NB_OK, "");
    expect_entry("tc_split_9.json", GOOD_HEAD "\"m\": \"33-64\", \"path\": \"tc\", \"bn\": 64, \"raster\": 16, "
                 "\"splits\": 9, \"us\": 1", NB_ERR_CORRUPT, "splits = 9 is not in 1..8");
    expect_entry("tc_no_raster.json", GOOD_HEAD "\"m\": \"65-128\", \"path\": \"tc\", \"bn\": 64, \"us\": 1",
                 NB_ERR_CORRUPT, "\"raster\" is missing");
    expect_entry("no_us.json", GOOD_HEAD "\"m\": \"1\", \"path\": \"decode\", \"kw\": 4, \"splits\": 1, "
                 "\"variant\": \"plain\"", NB_ERR_CORRUPT, "\"us\" is missing");
    expect_entry("kw_twice.json", GOOD_HEAD "\"m\": \"1\", \"path\": \"decode\", \"kw\": 4, \"kw\": 8, \"splits\": 1, "
                 "\"variant\": \"plain\", \"us\": 1", NB_ERR_CORRUPT, "\"kw\" appears twice");
    /* the entry is named by its index and key */
    expect_load("second_entry.json",
                "{\"version\": 1, \"entries\": [{" GOOD_HEAD "\"m\": \"1\", \"path\": \"decode\", \"kw\": 4, "
                "\"splits\": 1, \"variant\": \"plain\", \"us\": 1},\n {" GOOD_HEAD "\"m\": \"2\", \"path\": \"decode\", "
                "\"kw\": 5, \"splits\": 1, \"variant\": \"plain\", \"us\": 1}]}",
                NB_ERR_CORRUPT, "entry 1 (nvfp4 8192x8192 m 2): kw = 5");
    /* a later entry with the same key replaces the earlier one */
    {
        const char *file = path_of("dup_key.json");
        write_file(file, "{\"version\": 1, \"entries\": [{" GOOD_HEAD "\"m\": \"1\", \"path\": \"decode\", \"kw\": 4, "
                         "\"splits\": 1, \"variant\": \"plain\", \"us\": 1},\n {" GOOD_HEAD "\"m\": \"1\", "
                         "\"path\": \"decode\", \"kw\": 8, \"splits\": 2, \"variant\": \"plain\", \"us\": 1}]}");
        nb_context *ctx = NULL;
        nb_context_create(NB_DEVICE_NONE, &ctx);
        nb_gemm_config got;
        CHECK(nb_context_load_tuning(ctx, file) == NB_OK && count_of(ctx, NULL) == 1 &&
                  lookup(ctx, NB_FORMAT_NVFP4, NB_DTYPE_BF16, 8192, 8192, 1, &got) && got.kw == 8 && got.splits == 2,
              "duplicate key: %s", nb_context_last_error(ctx));
        nb_context_destroy(ctx);
    }
}

#endif

static void test_env(void) {
    nb_context *ctx = NULL;
    const char *good = path_of("env_good.json"), *bad = path_of("env_bad.json"), *none = path_of("env_none.json");
    write_file(good, "{\"version\": 1, \"entries\": [{" GOOD_HEAD "\"m\": \"1\", \"path\": \"decode\", \"kw\": 4, "
                     "\"splits\": 1, \"variant\": \"plain\", \"us\": 1}]}");
    write_file(bad, "{\"version\": 1, \"entries\": [{" GOOD_HEAD "\"m\": \"1\", \"path\": \"decode\", \"kw\": 3, "
                    "\"splits\": 1, \"variant\": \"plain\", \"us\": 1}]}");
    remove(none);
    setenv("NIBBLE_TUNE_CACHE", none, 1);
    CHECK(nb_context_create(NB_DEVICE_NONE, &ctx) == NB_OK && count_of(ctx, NULL) == 0,
          "NIBBLE_TUNE_CACHE naming a missing file: %s", nb_last_error());
    nb_context_destroy(ctx);
#ifdef NB_HAVE_CJSON
    ctx = NULL;
    setenv("NIBBLE_TUNE_CACHE", good, 1);
    CHECK(nb_context_create(NB_DEVICE_NONE, &ctx) == NB_OK && count_of(ctx, NULL) == 1 &&
              lookup(ctx, NB_FORMAT_NVFP4, NB_DTYPE_BF16, 8192, 8192, 1, NULL),
          "NIBBLE_TUNE_CACHE with a valid file: %s", nb_last_error());
    nb_context_destroy(ctx);
    ctx = (nb_context *)(uintptr_t)1;
    setenv("NIBBLE_TUNE_CACHE", bad, 1);
    CHECK(nb_context_create(NB_DEVICE_NONE, &ctx) == NB_ERR_CORRUPT && ctx == NULL &&
              strstr(nb_last_error(), "NIBBLE_TUNE_CACHE") && strstr(nb_last_error(), bad) &&
              strstr(nb_last_error(), "kw = 3"),
          "NIBBLE_TUNE_CACHE with a malformed file: %s", nb_last_error());
#endif
    setenv("NIBBLE_TUNE_CACHE", "", 1);
    CHECK(nb_context_create(NB_DEVICE_NONE, &ctx) == NB_OK && count_of(ctx, NULL) == 0, "empty NIBBLE_TUNE_CACHE");
    nb_context_destroy(ctx);
    unsetenv("NIBBLE_TUNE_CACHE");
}

/* `call` fails with `want` and leaves a message (the thread's buffer is
 * emptied first). */
#define EXPECT_FAIL(want, call)                                                                            \
    do {                                                                                                   \
        nbi_fail(NULL, NB_OK, "%s", "");                                                                   \
        const nb_status st_ = (call);                                                                      \
        CHECK(st_ == (want) && nb_last_error()[0], "%s: %s, want %s; message \"%s\"", #call, nb_status_name(st_), \
              nb_status_name(want), nb_last_error());                                                      \
    } while (0)

static void test_arguments(void) {
    nb_context *ctx = NULL;
    nb_context_create(NB_DEVICE_NONE, &ctx);
    const nb_gemm_desc g = problem(NB_FORMAT_NVFP4, NB_DTYPE_BF16, 4096, 4096, 4);
    nb_gemm_config c = decode_cfg(4, 1, 0, 0);
    size_t a, b, n;
    int64_t lo, hi;
    EXPECT_FAIL(NB_ERR_INVALID_ARGUMENT, nb_tuning_m_bucket(0, &lo, &hi));
    EXPECT_FAIL(NB_ERR_INVALID_ARGUMENT, nb_tuning_m_bucket(-5, &lo, &hi));
    EXPECT_FAIL(NB_ERR_NULL_POINTER, nb_tuning_m_bucket(1, NULL, &hi));
    EXPECT_FAIL(NB_ERR_NULL_POINTER, nb_context_set_tuning(NULL, &g, &c, 1));
    EXPECT_FAIL(NB_ERR_NULL_POINTER, nb_context_set_tuning(ctx, NULL, &c, 1));
    EXPECT_FAIL(NB_ERR_INVALID_ARGUMENT, nb_context_set_tuning(ctx, &g, &c, NAN));
    EXPECT_FAIL(NB_ERR_INVALID_ARGUMENT, nb_context_set_tuning(ctx, &g, &c, -1));
    c.kw = 3;
    EXPECT_FAIL(NB_ERR_INVALID_ARGUMENT, nb_context_set_tuning(ctx, &g, &c, 1));
    CHECK(strstr(nb_last_error(), "kw = 3") != NULL, "set: kw 3: %s", nb_last_error());
    c = decode_cfg(1, 1, 1, 2); /* staged at m = 4: kernel 2 runs every m since its stream-K wave at 1..8 tokens */
    CHECK(nb_context_set_tuning(ctx, &g, &c, 1) == NB_OK, "set: staged at m = 4 accepted: %s", nb_last_error());
    CHECK(nb_context_set_tuning(ctx, &g, NULL, 0) == NB_OK, "set: staged at m = 4 removed: %s", nb_last_error());
    c = decode_cfg(2, 1, 1, 2); /* staged with kw 2 */
    EXPECT_FAIL(NB_ERR_INVALID_ARGUMENT, nb_context_set_tuning(ctx, &g, &c, 1));
    CHECK(strstr(nb_last_error(), "needs kw = 1") != NULL, "set: staged with kw 2: %s", nb_last_error());
    c = tc_cfg(64, 16, 1);
    c.reserved[1] = 1;
    EXPECT_FAIL(NB_ERR_INVALID_ARGUMENT, nb_context_set_tuning(ctx, &g, &c, 1));
    CHECK(strstr(nb_last_error(), "reserved[1]") != NULL, "set: reserved[1]: %s", nb_last_error());
    c = tc_cfg(64, 16, 1);
    c.stream_k = 2;
    EXPECT_FAIL(NB_ERR_INVALID_ARGUMENT, nb_context_set_tuning(ctx, &g, &c, 1));
    CHECK(strstr(nb_last_error(), "stream_k = 2") != NULL, "set: stream_k 2: %s", nb_last_error());
    c = tc_cfg(64, 16, 1);
    c.splits = 9;
    EXPECT_FAIL(NB_ERR_INVALID_ARGUMENT, nb_context_set_tuning(ctx, &g, &c, 1));
    CHECK(strstr(nb_last_error(), "splits = 9") != NULL, "set: tc splits 9: %s", nb_last_error());
    c.splits = 0;
    c.path = 4;
    EXPECT_FAIL(NB_ERR_INVALID_ARGUMENT, nb_context_set_tuning(ctx, &g, &c, 1));
    CHECK(strstr(nb_last_error(), "or 3 (mma)") != NULL, "set: path 4: %s", nb_last_error());
    c = mma_cfg(256, 16);
    EXPECT_FAIL(NB_ERR_INVALID_ARGUMENT, nb_context_set_tuning(ctx, &g, &c, 1));
    CHECK(strstr(nb_last_error(), "bn = 256") != NULL, "set: mma bn 256: %s", nb_last_error());
    c = mma_cfg(64, 16);
    c.kw = 4;
    EXPECT_FAIL(NB_ERR_INVALID_ARGUMENT, nb_context_set_tuning(ctx, &g, &c, 1));
    CHECK(strstr(nb_last_error(), "not mma") != NULL, "set: mma with kw: %s", nb_last_error());
    const nb_gemm_desc g32 = problem(NB_FORMAT_NVFP4, NB_DTYPE_F32, 4096, 4096, 4);
    c = decode_cfg(4, 1, 0, 0);
    EXPECT_FAIL(NB_ERR_UNSUPPORTED, nb_context_set_tuning(ctx, &g32, &c, 1));
    CHECK(count_of(ctx, NULL) == 0, "failed sets left entries");
    EXPECT_FAIL(NB_ERR_NULL_POINTER, nb_context_tuning_count(NULL, &a, &b));
    EXPECT_FAIL(NB_ERR_NULL_POINTER, nb_context_tuning_count(ctx, NULL, &b));
    EXPECT_FAIL(NB_ERR_NULL_POINTER, nb_context_load_tuning(ctx, NULL));
    EXPECT_FAIL(NB_ERR_NULL_POINTER, nb_context_load_tuning(NULL, "x"));
    EXPECT_FAIL(NB_ERR_NULL_POINTER, nb_context_save_tuning(ctx, NULL));
#ifdef NB_HAVE_CJSON
    EXPECT_FAIL(NB_ERR_IO, nb_context_save_tuning(ctx, path_of("no/such/dir/x.json")));
#else
    EXPECT_FAIL(NB_ERR_UNSUPPORTED, nb_context_save_tuning(ctx, path_of("no/such/dir/x.json")));
#endif
    EXPECT_FAIL(NB_ERR_NULL_POINTER, nb_gemm_list_configs(NULL, &g, NULL, 0, &n));
    EXPECT_FAIL(NB_ERR_NULL_POINTER, nb_gemm_list_configs(ctx, &g, NULL, 0, NULL));
    EXPECT_FAIL(NB_ERR_NULL_POINTER, nb_gemm_list_configs(ctx, &g, NULL, 4, &n));
    EXPECT_FAIL(NB_ERR_NO_DEVICE, nb_gemm_list_configs(ctx, &g, NULL, 0, &n));
    nb_context_destroy(ctx);
}

#ifndef NB_HAVE_CJSON
static void test_without_cjson(void) {
    nb_context *ctx = NULL;
    nb_context_create(NB_DEVICE_NONE, &ctx);
    const char *file = path_of("nocjson.json");
    write_file(file, "{\"version\": 1, \"entries\": []}");
    CHECK(nb_context_load_tuning(ctx, file) == NB_ERR_UNSUPPORTED && strstr(nb_last_error(), "cJSON"),
          "load without cJSON: %s", nb_last_error());
    CHECK(nb_context_save_tuning(ctx, file) == NB_ERR_UNSUPPORTED && strstr(nb_last_error(), "cJSON"),
          "save without cJSON: %s", nb_last_error());
    /* the table itself works */
    const nb_gemm_desc g = problem(NB_FORMAT_MXFP4, NB_DTYPE_BF16, 4096, 4096, 100);
    const nb_gemm_config c = tc_cfg(128, 16, 1);
    CHECK(nb_context_set_tuning(ctx, &g, &c, 5) == NB_OK && lookup(ctx, NB_FORMAT_MXFP4, NB_DTYPE_BF16, 4096, 4096, 128, NULL),
          "set and look up without cJSON: %s", nb_last_error());
    setenv("NIBBLE_TUNE_CACHE", file, 1);
    nb_context *c2 = NULL;
    CHECK(nb_context_create(NB_DEVICE_NONE, &c2) == NB_ERR_UNSUPPORTED, "NIBBLE_TUNE_CACHE without cJSON");
    unsetenv("NIBBLE_TUNE_CACHE");
    nb_context_destroy(ctx);
}
#endif

int main(int argc, char **argv) {
    if (argc < 2) {
        printf("usage: test_tune SCRATCH_DIR\n");
        return 1;
    }
    g_dir = argv[1];
    mkdir(g_dir, 0755);
    unsetenv("NIBBLE_TUNE_CACHE");
    test_buckets();
    test_arguments();
    test_env();
#ifdef NB_HAVE_CJSON
    test_round_trip();
    test_warps_round_trip();
    test_stream_k_round_trip();
    test_malformed();
#else
    test_without_cjson();
#endif
    printf("%d passed, %d failed\n", g_pass, g_fail);
    return g_fail ? 1 : 0;
}
