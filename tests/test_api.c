/* test_api.c - every public function of nibble.h fed bad input returns its
 * documented status and leaves a fresh, non-empty message behind.
 *
 * "Fresh": before each failing call the thread-local message (and, for calls
 * that take a context, the context's message) is primed with a marker from a
 * different failure; afterwards nb_last_error() must differ from the marker
 * and nb_context_last_error(ctx) must equal nb_last_error().  If the call's own
 * message happens to equal the marker, a second marker is tried.  So a path
 * that returns an error without recording why is caught.
 *
 * Also: the status list (X-macro) round trips through nb_status_string and
 * nb_status_name; version; the thread-local error buffer is per thread; device
 * entry points on a host-only context say NB_ERR_NO_DEVICE; descriptors are
 * not modified by a failed quantize or pack.
 *
 * Output: one line per failed check, then "N passed, M failed". */
#define _POSIX_C_SOURCE 200809L /* setenv */
#include <nibble.h>

#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#if defined(__unix__) || defined(__APPLE__)
#include <pthread.h>
#define HAVE_PTHREAD 1
#endif

#include "check.h"

/* ---------------------------------------------------- fresh-message check */

static char g_marker[1024];

/* Put a known message in the thread-local buffer and, if ctx, the context. */
static void prime(nb_context *ctx, int which) {
    uint8_t dummy[16] = {0};
    if (which == 1) nb_gemm_workspace_size(ctx, NULL, NULL);     /* "...: bytes is NULL" */
    else nb_pack_host(ctx, NULL, dummy, dummy, dummy, sizeof dummy); /* ctx NULL / desc NULL */
    snprintf(g_marker, sizeof g_marker, "%s", nb_last_error());
}

static int fresh(const nb_context *ctx) {
    const char *tls = nb_last_error();
    if (!tls[0] || !strcmp(tls, g_marker)) return 0;
    if (ctx && strcmp(nb_context_last_error(ctx), tls)) return 0;
    return 1;
}

static void report(nb_context *ctx, nb_status got, nb_status want, int is_fresh, const char *call, int line) {
    if (got == want && (want == NB_OK || is_fresh)) {
        g_pass++;
        return;
    }
    g_fail++;
    printf("FAIL %s:%d: %s\n    returned %s, want %s", __FILE__, line, call, nb_status_name(got),
           nb_status_name(want));
    if (want != NB_OK && !is_fresh)
        printf("; message not recorded (thread: \"%s\", context: \"%s\")", nb_last_error(),
               ctx ? nb_context_last_error(ctx) : "-");
    printf("\n");
}

/* EXPECT(ctx, want, call): ctx is the context whose message must also be set
 * (NULL when the call has none or takes it as const). */
#define EXPECT(ctx_, want_, call_)                                       \
    do {                                                                 \
        prime((ctx_), 1);                                                \
        nb_status st_ = (call_);                                         \
        int fr_ = fresh(ctx_);                                           \
        if (st_ != NB_OK && !fr_) {                                      \
            prime((ctx_), 2);                                            \
            st_ = (call_);                                               \
            fr_ = fresh(ctx_);                                           \
        }                                                                \
        report((ctx_), st_, (want_), fr_, #call_, __LINE__);             \
    } while (0)

/* ------------------------------------------------------------------ tests */

static void test_status_and_version(void) {
    /* every listed status: its value, message and name */
#define X(name, value, msg)                                                                                   \
    CHECK((int)name == value, #name " = %d, want %d", (int)name, value);                                      \
    CHECK(!strcmp(nb_status_string(name), msg), "nb_status_string(" #name ") = \"%s\"", nb_status_string(name)); \
    CHECK(!strcmp(nb_status_name(name), #name), "nb_status_name(" #name ") = \"%s\"", nb_status_name(name));
    NB_STATUS_LIST(X)
#undef X
    static const int others[] = {-1, 16, 17, 100, 1 << 20};
    for (size_t i = 0; i < sizeof others / sizeof others[0]; i++) {
        nb_status s = (nb_status)others[i];
        CHECK(!strcmp(nb_status_string(s), "unknown status"), "nb_status_string(%d) = \"%s\"", others[i],
              nb_status_string(s));
        CHECK(!strcmp(nb_status_name(s), "NB_UNKNOWN"), "nb_status_name(%d) = \"%s\"", others[i],
              nb_status_name(s));
    }
    CHECK(nb_version() == NB_VERSION, "nb_version() = %d, header NB_VERSION = %d", nb_version(), NB_VERSION);
    char v[64];
    snprintf(v, sizeof v, "%d.%d.%d", NB_VERSION_MAJOR, NB_VERSION_MINOR, NB_VERSION_PATCH);
    CHECK(!strcmp(nb_version_string(), v), "nb_version_string() = \"%s\", want \"%s\"", nb_version_string(), v);
}

#ifdef HAVE_PTHREAD
static void *thread_body(void *arg) {
    int *res = (int *)arg;
    res[0] = nb_last_error()[0] == '\0'; /* a new thread starts with "" */
    nb_weight_desc_validate(NULL);
    res[1] = nb_last_error()[0] != '\0';
    return NULL;
}
#endif

static void test_thread_local(void) {
#ifdef HAVE_PTHREAD
    nb_context_create(-5, NULL); /* NULL out: NB_ERR_NULL_POINTER, message on this thread */
    char before[1024];
    snprintf(before, sizeof before, "%s", nb_last_error());
    int res[2] = {0, 0};
    pthread_t th;
    if (pthread_create(&th, NULL, thread_body, res) == 0) {
        pthread_join(th, NULL);
        CHECK(res[0], "nb_last_error() on a new thread is not empty");
        CHECK(res[1], "a failure on the other thread left no message there");
        CHECK(!strcmp(before, nb_last_error()), "a failure on another thread changed this thread's message: "
              "\"%s\" -> \"%s\"", before, nb_last_error());
    }
#endif
}

static void test_context(void) {
    nb_context *c = (nb_context *)(uintptr_t)1;
    EXPECT(NULL, NB_ERR_NULL_POINTER, nb_context_create(NB_DEVICE_NONE, NULL));
    EXPECT(NULL, NB_ERR_INVALID_ARGUMENT, nb_context_create(-5, &c));
    EXPECT(NULL, NB_ERR_INVALID_ARGUMENT, nb_context_create(-2, &c));
    EXPECT(NULL, NB_ERR_NO_DEVICE, nb_context_create(1 << 30, &c)); /* no machine has that many GPUs */
    int count = -1;
    EXPECT(NULL, NB_ERR_NULL_POINTER, nb_device_count(NULL));
    EXPECT(NULL, NB_OK, nb_device_count(&count));
    CHECK(count >= 0, "nb_device_count = %d", count);
    nb_build_info bi;
    EXPECT(NULL, NB_ERR_NULL_POINTER, nb_get_build_info(NULL));
    EXPECT(NULL, NB_OK, nb_get_build_info(&bi));
    CHECK(!strcmp(bi.version, nb_version_string()) && strstr(bi.formats, "nvfp4") && strstr(bi.formats, "mxfp4"),
          "build info: version \"%s\", formats \"%s\"", bi.version, bi.formats);
    CHECK(bi.cuda || count == 0, "build without CUDA reports %d devices", count);
    if (count == 0) {
        c = (nb_context *)(uintptr_t)1;
        EXPECT(NULL, NB_ERR_NO_DEVICE, nb_context_create(0, &c));
    }
    EXPECT(NULL, NB_OK, nb_context_destroy(NULL));
    /* NIBBLE_PATH: decode, tc or mma; anything else refused for a device
     * context, with the value named (a host context ignores it) */
    setenv("NIBBLE_PATH", "fast", 1);
    EXPECT(NULL, NB_ERR_INVALID_ARGUMENT, nb_context_create(0, &c));
    CHECK(strstr(nb_last_error(), "NIBBLE_PATH=\"fast\"") != NULL, "the message names the value: \"%s\"",
          nb_last_error());
    nb_context *h = NULL;
    EXPECT(NULL, NB_OK, nb_context_create(NB_DEVICE_NONE, &h));
    nb_context_destroy(h);
    if (count == 0) {
        setenv("NIBBLE_PATH", "mma", 1);
        EXPECT(NULL, NB_ERR_NO_DEVICE, nb_context_create(0, &c)); /* a valid value: on to the device check */
    }
    unsetenv("NIBBLE_PATH");
    /* the MoE planner's switches and NIBBLE_PDL: refused the same way, the
     * accepted values listed in the message */
    static const char *const env_switches[4][3] = {{"NIBBLE_MOE_PATH", "fast", "decode or tc"},
                                                   {"NIBBLE_MOE_KW", "3", "1, 2, 4 or 8"},
                                                   {"NIBBLE_MOE_TC_BN", "256", "64, 128 or 192"},
                                                   {"NIBBLE_PDL", "yes", "0, 1 or auto"}};
    for (int i = 0; i < 4; i++) {
        setenv(env_switches[i][0], env_switches[i][1], 1);
        EXPECT(NULL, NB_ERR_INVALID_ARGUMENT, nb_context_create(0, &c));
        char want[64];
        snprintf(want, sizeof want, "%s=\"%s\" is not %s", env_switches[i][0], env_switches[i][1],
                 env_switches[i][2]);
        CHECK(strstr(nb_last_error(), want) != NULL, "the message names %s: \"%s\"", env_switches[i][0],
              nb_last_error());
        unsetenv(env_switches[i][0]);
    }
    if (count == 0) { /* valid values: on to the device check */
        setenv("NIBBLE_MOE_PATH", "tc", 1);
        setenv("NIBBLE_MOE_KW", "8", 1);
        setenv("NIBBLE_MOE_TC_BN", "64", 1);
        setenv("NIBBLE_PDL", "0", 1);
        EXPECT(NULL, NB_ERR_NO_DEVICE, nb_context_create(0, &c));
        setenv("NIBBLE_PDL", "auto", 1); /* (the default's own name) */
        EXPECT(NULL, NB_ERR_NO_DEVICE, nb_context_create(0, &c));
        unsetenv("NIBBLE_MOE_PATH");
        unsetenv("NIBBLE_MOE_KW");
        unsetenv("NIBBLE_MOE_TC_BN");
        unsetenv("NIBBLE_PDL");
    }

    nb_context *ctx = NULL;
    EXPECT(NULL, NB_OK, nb_context_create(NB_DEVICE_NONE, &ctx));
    CHECK(ctx != NULL, "host context is NULL");
    if (!ctx) return;
    CHECK(nb_context_last_error(ctx) && nb_context_last_error(ctx)[0] == '\0',
          "a new context has the message \"%s\"", nb_context_last_error(ctx));
    nb_device_info info;
    /* nb_context_device_info takes a const context: only the thread-local message */
    EXPECT(NULL, NB_ERR_NULL_POINTER, nb_context_device_info(NULL, &info));
    EXPECT(NULL, NB_ERR_NULL_POINTER, nb_context_device_info(ctx, NULL));
    EXPECT(NULL, NB_OK, nb_context_device_info(ctx, &info));
    CHECK(info.device == NB_DEVICE_NONE, "host context device = %d", info.device);
    nb_context_destroy(ctx);
}

/* The format table: every row of NB_FORMAT_LIST through nb_format_get_info,
 * nb_format_list and nb_format_from_name, the descriptor defaults it implies,
 * and unknown values and names refused. */
static void test_format_table(void) {
    size_t count = 0;
    EXPECT(NULL, NB_OK, nb_format_list(NULL, 0, &count));
    nb_format all[16];
    CHECK(count >= 2 && count <= 16, "nb_format_list count = %zu", count);
    EXPECT(NULL, NB_OK, nb_format_list(all, 16, &count));
    size_t row = 0;
#define X(NAME, value, str, elem, bits, grp, grps, st, sts, sbytes, ts, zp)                                       \
    {                                                                                                              \
        nb_format_info fi;                                                                                         \
        nb_format f = (nb_format)0;                                                                                \
        EXPECT(NULL, NB_OK, nb_format_get_info(NB_FORMAT_##NAME, &fi));                                            \
        CHECK(fi.format == NB_FORMAT_##NAME && !strcmp(fi.name, str) && fi.element == (elem) &&                    \
                  fi.element_bits == (bits) && fi.group_size == (grp) && fi.scale_type == (st) &&                  \
                  fi.scale_bytes == (sbytes) && fi.tensor_scale == (ts) && fi.zero_point == ((zp) != 0) &&         \
                  fi.groups == (grps) && fi.scale_types == (sts) && fi.zero_type == (zp) &&                        \
                  fi.reserved[0] == 0 && fi.reserved[1] == 0 && fi.reserved[2] == 0,                               \
              "nb_format_get_info(" #NAME ") differs from its row");                                               \
        CHECK(row < count && all[row] == NB_FORMAT_##NAME, "nb_format_list[%zu] is not " #NAME, row);              \
        EXPECT(NULL, NB_OK, nb_format_from_name(str, &f));                                                         \
        CHECK(f == NB_FORMAT_##NAME, "nb_format_from_name(\"%s\") = %d", str, (int)f);                             \
        nb_weight_desc d;                                                                                          \
        EXPECT(NULL, NB_OK, nb_weight_desc_init(&d, NB_FORMAT_##NAME, 16, 4 * (grp)));                             \
        CHECK(d.group_size == (grp) && (int)d.scale_type == (st) && d.tensor_scale == ((ts) ? 0.0f : 1.0f),        \
              #NAME " descriptor defaults follow its row");                                                        \
        row++;                                                                                                     \
    }
    NB_FORMAT_LIST(X)
#undef X
    CHECK(row == count, "NB_FORMAT_LIST has %zu rows, nb_format_list %zu", row, count);
    nb_format two[1];
    EXPECT(NULL, NB_OK, nb_format_list(two, 1, &count)); /* max below the count: one written, count still all */
    CHECK(count == row && two[0] == all[0], "nb_format_list(max 1): count %zu, first %d", count, (int)two[0]);
    nb_format_info fi;
    nb_format f;
    EXPECT(NULL, NB_ERR_UNSUPPORTED, nb_format_get_info((nb_format)0, &fi));
    EXPECT(NULL, NB_ERR_UNSUPPORTED, nb_format_get_info((nb_format)99, &fi));
    EXPECT(NULL, NB_ERR_NULL_POINTER, nb_format_get_info(NB_FORMAT_NVFP4, NULL));
    EXPECT(NULL, NB_ERR_NULL_POINTER, nb_format_list(NULL, 2, &count));
    EXPECT(NULL, NB_ERR_NULL_POINTER, nb_format_list(all, 2, NULL));
    EXPECT(NULL, NB_ERR_NOT_FOUND, nb_format_from_name("NVFP4", &f)); /* exact, lower case */
    EXPECT(NULL, NB_ERR_NOT_FOUND, nb_format_from_name("nvfp5", &f));
    EXPECT(NULL, NB_ERR_NOT_FOUND, nb_format_from_name("", &f));
    CHECK(strstr(nb_last_error(), "nvfp4") && strstr(nb_last_error(), "mxfp4"),
          "the not-found message lists the formats: \"%s\"", nb_last_error());
    EXPECT(NULL, NB_ERR_NULL_POINTER, nb_format_from_name(NULL, &f));
    EXPECT(NULL, NB_ERR_NULL_POINTER, nb_format_from_name("nvfp4", NULL));
    nb_build_info bi;
    EXPECT(NULL, NB_OK, nb_get_build_info(&bi));
    CHECK(!strcmp(bi.formats, "nvfp4,mxfp4,int4,int4_sym,int8,nf4,bnb_fp4,int4_hqq"), "build info formats \"%s\"", bi.formats);
}

static void test_weight_desc(void) {
    nb_weight_desc d;
    const int64_t big = ((int64_t)1 << 31);
    EXPECT(NULL, NB_ERR_NULL_POINTER, nb_weight_desc_init(NULL, NB_FORMAT_NVFP4, 16, 16));
    EXPECT(NULL, NB_ERR_UNSUPPORTED, nb_weight_desc_init(&d, (nb_format)0, 16, 64));
    EXPECT(NULL, NB_ERR_UNSUPPORTED, nb_weight_desc_init(&d, (nb_format)9, 16, 64));
    EXPECT(NULL, NB_ERR_UNSUPPORTED, nb_weight_desc_init(&d, (nb_format)-1, 16, 64));
    EXPECT(NULL, NB_ERR_BAD_SHAPE, nb_weight_desc_init(&d, NB_FORMAT_NVFP4, 0, 64));
    EXPECT(NULL, NB_ERR_BAD_SHAPE, nb_weight_desc_init(&d, NB_FORMAT_NVFP4, -3, 64));
    EXPECT(NULL, NB_ERR_BAD_SHAPE, nb_weight_desc_init(&d, NB_FORMAT_NVFP4, 16, 0));
    EXPECT(NULL, NB_ERR_BAD_SHAPE, nb_weight_desc_init(&d, NB_FORMAT_MXFP4, 16, -32));
    EXPECT(NULL, NB_ERR_BAD_SHAPE, nb_weight_desc_init(&d, NB_FORMAT_NVFP4, 16, 8));
    EXPECT(NULL, NB_ERR_BAD_SHAPE, nb_weight_desc_init(&d, NB_FORMAT_NVFP4, 16, 24));
    EXPECT(NULL, NB_ERR_BAD_SHAPE, nb_weight_desc_init(&d, NB_FORMAT_NVFP4, 16, 17));
    EXPECT(NULL, NB_ERR_BAD_SHAPE, nb_weight_desc_init(&d, NB_FORMAT_MXFP4, 16, 48));
    EXPECT(NULL, NB_ERR_BAD_SHAPE, nb_weight_desc_init(&d, NB_FORMAT_MXFP4, 16, 16));
    EXPECT(NULL, NB_ERR_OVERFLOW, nb_weight_desc_init(&d, NB_FORMAT_NVFP4, big + 1, 16));
    EXPECT(NULL, NB_ERR_OVERFLOW, nb_weight_desc_init(&d, NB_FORMAT_NVFP4, 16, big + 16));
    EXPECT(NULL, NB_ERR_OVERFLOW, nb_weight_desc_init(&d, NB_FORMAT_MXFP4, INT64_MAX, 32));
    EXPECT(NULL, NB_ERR_OVERFLOW, nb_weight_desc_init(&d, NB_FORMAT_MXFP4, big, big)); /* 2^62 elements */
    EXPECT(NULL, NB_OK, nb_weight_desc_init(&d, NB_FORMAT_NVFP4, big, 16));             /* 2^31 itself is fine */

    /* defaults */
    EXPECT(NULL, NB_OK, nb_weight_desc_init(&d, NB_FORMAT_NVFP4, 17, 144));
    CHECK(d.format == NB_FORMAT_NVFP4 && d.layout == NB_LAYOUT_CHECKPOINT && d.n == 17 && d.k == 144 &&
              d.group_size == 16 && d.scale_type == NB_SCALE_E4M3 && d.tensor_scale == 0.0f,
          "NVFP4 defaults");
    nb_weight_sizes sz;
    EXPECT(NULL, NB_OK, nb_weight_get_sizes(&d, &sz));
    CHECK(sz.codes_bytes == 17 * 72 && sz.scales_bytes == 17 * 9 && sz.packed_bytes == 2 * 2 * (1024 + 128) &&
              sz.dense_elements == 17 * 144,
          "NVFP4 17x144 sizes: %zu %zu %zu %zu", sz.codes_bytes, sz.scales_bytes, sz.packed_bytes, sz.dense_elements);
    EXPECT(NULL, NB_OK, nb_weight_desc_init(&d, NB_FORMAT_MXFP4, 17, 160));
    CHECK(d.group_size == 32 && d.scale_type == NB_SCALE_E8M0 && d.tensor_scale == 1.0f &&
              d.scale_rule == NB_MX_SCALE_OCP && d.layout == NB_LAYOUT_CHECKPOINT,
          "MXFP4 defaults");
    EXPECT(NULL, NB_OK, nb_weight_get_sizes(&d, &sz));
    CHECK(sz.codes_bytes == 17 * 80 && sz.scales_bytes == 17 * 5 && sz.packed_bytes == 2 * 2 * (1024 + 64),
          "MXFP4 17x160 sizes: %zu %zu %zu", sz.codes_bytes, sz.scales_bytes, sz.packed_bytes);

    /* validate */
    nb_weight_desc ok;
    nb_weight_desc_init(&ok, NB_FORMAT_NVFP4, 32, 64);
    EXPECT(NULL, NB_OK, nb_weight_desc_validate(&ok));
    EXPECT(NULL, NB_ERR_NULL_POINTER, nb_weight_desc_validate(NULL));
    d = ok, d.format = (nb_format)10;
    EXPECT(NULL, NB_ERR_UNSUPPORTED, nb_weight_desc_validate(&d));
    d = ok, d.layout = (nb_layout)0;
    EXPECT(NULL, NB_ERR_INVALID_ARGUMENT, nb_weight_desc_validate(&d));
    d = ok, d.layout = (nb_layout)3;
    EXPECT(NULL, NB_ERR_INVALID_ARGUMENT, nb_weight_desc_validate(&d));
    d = ok, d.layout = NB_LAYOUT_PACKED;
    EXPECT(NULL, NB_OK, nb_weight_desc_validate(&d)); /* any known layout is valid */
    d = ok, d.n = 0;
    EXPECT(NULL, NB_ERR_BAD_SHAPE, nb_weight_desc_validate(&d));
    d = ok, d.k = -64;
    EXPECT(NULL, NB_ERR_BAD_SHAPE, nb_weight_desc_validate(&d));
    d = ok, d.k = 72;
    EXPECT(NULL, NB_ERR_BAD_SHAPE, nb_weight_desc_validate(&d));
    d = ok, d.n = big + 1;
    EXPECT(NULL, NB_ERR_OVERFLOW, nb_weight_desc_validate(&d));
    d = ok, d.group_size = 32;
    EXPECT(NULL, NB_ERR_UNSUPPORTED, nb_weight_desc_validate(&d));
    d = ok, d.scale_type = NB_SCALE_E8M0;
    EXPECT(NULL, NB_ERR_UNSUPPORTED, nb_weight_desc_validate(&d));

    /* sizes */
    EXPECT(NULL, NB_ERR_NULL_POINTER, nb_weight_get_sizes(NULL, &sz));
    EXPECT(NULL, NB_ERR_NULL_POINTER, nb_weight_get_sizes(&ok, NULL));
    d = ok, d.k = 40;
    EXPECT(NULL, NB_ERR_BAD_SHAPE, nb_weight_get_sizes(&d, &sz));
    d = ok, d.format = (nb_format)9;
    EXPECT(NULL, NB_ERR_UNSUPPORTED, nb_weight_get_sizes(&d, &sz));
    d = ok, d.k = big + 16;
    EXPECT(NULL, NB_ERR_OVERFLOW, nb_weight_get_sizes(&d, &sz));
}

static void test_quantize_dequantize(nb_context *ctx) {
    enum { N = 4, K = 64 };
    float w[N * K];
    for (int i = 0; i < N * K; i++) w[i] = (float)((i * 37) % 101 - 50) / 25.0f;
    uint8_t codes[N * K / 2], scales[N * K / 16];
    float out[N * K];
    nb_weight_desc ok, d, before;
    nb_weight_desc_init(&ok, NB_FORMAT_NVFP4, N, K);
    d = ok;

    /* quantize: every failure leaves *desc exactly as it was */
#define Q(want, desc_, ...)                                                                             \
    do {                                                                                                \
        d = (desc_), before = d;                                                                        \
        EXPECT(ctx, want, nb_quantize_host(ctx, &d, __VA_ARGS__));                                      \
        CHECK(!memcmp(&d, &before, sizeof d), "a failed nb_quantize_host modified the descriptor");     \
    } while (0)
    EXPECT(NULL, NB_ERR_NULL_POINTER, nb_quantize_host(NULL, &d, NB_DTYPE_F32, w, codes, scales));
    EXPECT(ctx, NB_ERR_NULL_POINTER, nb_quantize_host(ctx, NULL, NB_DTYPE_F32, w, codes, scales));
    Q(NB_ERR_NULL_POINTER, ok, NB_DTYPE_F32, NULL, codes, scales);
    Q(NB_ERR_NULL_POINTER, ok, NB_DTYPE_F32, w, NULL, scales);
    Q(NB_ERR_NULL_POINTER, ok, NB_DTYPE_F32, w, codes, NULL);
    Q(NB_ERR_UNSUPPORTED, ok, (nb_dtype)0, w, codes, scales);
    Q(NB_ERR_UNSUPPORTED, ok, (nb_dtype)4, w, codes, scales);
    {
        nb_weight_desc bad = ok;
        bad.layout = NB_LAYOUT_PACKED;
        Q(NB_ERR_INVALID_ARGUMENT, bad, NB_DTYPE_F32, w, codes, scales);
        bad = ok, bad.n = 0;
        Q(NB_ERR_BAD_SHAPE, bad, NB_DTYPE_F32, w, codes, scales);
        bad = ok, bad.k = 40;
        Q(NB_ERR_BAD_SHAPE, bad, NB_DTYPE_F32, w, codes, scales);
        bad = ok, bad.format = (nb_format)11;
        Q(NB_ERR_UNSUPPORTED, bad, NB_DTYPE_F32, w, codes, scales);
        bad = ok, bad.k = ((int64_t)1 << 31) + 16;
        Q(NB_ERR_OVERFLOW, bad, NB_DTYPE_F32, w, codes, scales);
        /* a given tensor scale that cannot be used */
        bad = ok, bad.tensor_scale = (float)NAN;
        Q(NB_ERR_INVALID_ARGUMENT, bad, NB_DTYPE_F32, w, codes, scales);
        bad = ok, bad.tensor_scale = (float)INFINITY;
        Q(NB_ERR_INVALID_ARGUMENT, bad, NB_DTYPE_F32, w, codes, scales);
        bad = ok, bad.tensor_scale = -1.0f;
        Q(NB_ERR_INVALID_ARGUMENT, bad, NB_DTYPE_F32, w, codes, scales);
        /* MXFP4 with an unknown scale rule */
        nb_weight_desc_init(&bad, NB_FORMAT_MXFP4, N, K);
        bad.scale_rule = (nb_mx_scale_rule)3;
        Q(NB_ERR_INVALID_ARGUMENT, bad, NB_DTYPE_F32, w, codes, scales);
        bad.scale_rule = (nb_mx_scale_rule)-1;
        Q(NB_ERR_INVALID_ARGUMENT, bad, NB_DTYPE_F32, w, codes, scales);
        /* non-finite input */
        float keep = w[77];
        w[77] = (float)NAN;
        Q(NB_ERR_INVALID_ARGUMENT, ok, NB_DTYPE_F32, w, codes, scales);
        w[77] = (float)-INFINITY;
        Q(NB_ERR_INVALID_ARGUMENT, ok, NB_DTYPE_F32, w, codes, scales);
        w[77] = keep;
        uint16_t h[N * K];
        memset(h, 0, sizeof h);
        h[N * K - 1] = 0x7C00; /* F16 +Inf */
        Q(NB_ERR_INVALID_ARGUMENT, ok, NB_DTYPE_F16, h, codes, scales);
        h[N * K - 1] = 0x7FC1; /* BF16 NaN */
        Q(NB_ERR_INVALID_ARGUMENT, ok, NB_DTYPE_BF16, h, codes, scales);
    }
#undef Q
    d = ok;
    EXPECT(ctx, NB_OK, nb_quantize_host(ctx, &d, NB_DTYPE_F32, w, codes, scales));
    CHECK(d.tensor_scale > 0.0f, "quantize did not compute tensor_scale");
    nb_weight_desc q = d; /* a valid quantized descriptor */

    /* dequantize */
    EXPECT(NULL, NB_ERR_NULL_POINTER, nb_dequantize_host(NULL, &q, codes, scales, NB_DTYPE_F32, out));
    EXPECT(ctx, NB_ERR_NULL_POINTER, nb_dequantize_host(ctx, NULL, codes, scales, NB_DTYPE_F32, out));
    EXPECT(ctx, NB_ERR_NULL_POINTER, nb_dequantize_host(ctx, &q, NULL, scales, NB_DTYPE_F32, out));
    EXPECT(ctx, NB_ERR_NULL_POINTER, nb_dequantize_host(ctx, &q, codes, NULL, NB_DTYPE_F32, out));
    EXPECT(ctx, NB_ERR_NULL_POINTER, nb_dequantize_host(ctx, &q, codes, scales, NB_DTYPE_F32, NULL));
    EXPECT(ctx, NB_ERR_UNSUPPORTED, nb_dequantize_host(ctx, &q, codes, scales, (nb_dtype)0, out));
    EXPECT(ctx, NB_ERR_UNSUPPORTED, nb_dequantize_host(ctx, &q, codes, scales, (nb_dtype)99, out));
    d = q, d.layout = NB_LAYOUT_PACKED;
    EXPECT(ctx, NB_ERR_INVALID_ARGUMENT, nb_dequantize_host(ctx, &d, codes, scales, NB_DTYPE_F32, out));
    d = q, d.n = -1;
    EXPECT(ctx, NB_ERR_BAD_SHAPE, nb_dequantize_host(ctx, &d, codes, scales, NB_DTYPE_F32, out));
    d = q, d.k = 8;
    EXPECT(ctx, NB_ERR_BAD_SHAPE, nb_dequantize_host(ctx, &d, codes, scales, NB_DTYPE_F32, out));
    d = q, d.format = (nb_format)0;
    EXPECT(ctx, NB_ERR_UNSUPPORTED, nb_dequantize_host(ctx, &d, codes, scales, NB_DTYPE_F32, out));
    d = q, d.n = ((int64_t)1 << 31) + 1;
    EXPECT(ctx, NB_ERR_OVERFLOW, nb_dequantize_host(ctx, &d, codes, scales, NB_DTYPE_F32, out));
    EXPECT(ctx, NB_OK, nb_dequantize_host(ctx, &q, codes, scales, NB_DTYPE_BF16, out));

    /* device versions on a host-only context */
    EXPECT(NULL, NB_ERR_NULL_POINTER, nb_dequantize(NULL, &q, codes, scales, NB_DTYPE_BF16, out, NULL));
    EXPECT(ctx, NB_ERR_NO_DEVICE, nb_dequantize(ctx, &q, codes, scales, NB_DTYPE_BF16, out, NULL));
    d = ok, before = d;
    EXPECT(NULL, NB_ERR_NULL_POINTER, nb_quantize(NULL, &d, NB_DTYPE_F32, w, codes, scales, NULL));
    EXPECT(ctx, NB_ERR_NO_DEVICE, nb_quantize(ctx, &d, NB_DTYPE_F32, w, codes, scales, NULL));
    EXPECT(NULL, NB_ERR_NULL_POINTER, nb_quantize_staged(NULL, &d, NB_DTYPE_F32, w, codes, scales, NULL));
    EXPECT(ctx, NB_ERR_NO_DEVICE, nb_quantize_staged(ctx, &d, NB_DTYPE_F32, w, codes, scales, NULL));
    CHECK(!memcmp(&d, &before, sizeof d), "a failed nb_quantize modified the descriptor");
}

static void test_pack(nb_context *ctx) {
    enum { N = 20, K = 160 };
    uint8_t codes[N * K / 2], scales[N * K / 16];
    memset(codes, 0x21, sizeof codes);
    memset(scales, 0x38, sizeof scales);
    nb_weight_desc ok, d, before;
    nb_weight_desc_init(&ok, NB_FORMAT_NVFP4, N, K);
    ok.tensor_scale = 1.0f;
    nb_weight_sizes sz;
    nb_weight_get_sizes(&ok, &sz);
    void *packed = malloc(sz.packed_bytes);

#define P(want, desc_, ...)                                                                       \
    do {                                                                                          \
        d = (desc_), before = d;                                                                  \
        EXPECT(ctx, want, nb_pack_host(ctx, &d, __VA_ARGS__));                                    \
        CHECK(!memcmp(&d, &before, sizeof d), "a failed nb_pack_host modified the descriptor");  \
    } while (0)
    EXPECT(NULL, NB_ERR_NULL_POINTER, nb_pack_host(NULL, &d, codes, scales, packed, sz.packed_bytes));
    EXPECT(ctx, NB_ERR_NULL_POINTER, nb_pack_host(ctx, NULL, codes, scales, packed, sz.packed_bytes));
    P(NB_ERR_NULL_POINTER, ok, NULL, scales, packed, sz.packed_bytes);
    P(NB_ERR_NULL_POINTER, ok, codes, NULL, packed, sz.packed_bytes);
    P(NB_ERR_NULL_POINTER, ok, codes, scales, NULL, sz.packed_bytes);
    P(NB_ERR_BUFFER_TOO_SMALL, ok, codes, scales, packed, sz.packed_bytes - 1);
    P(NB_ERR_BUFFER_TOO_SMALL, ok, codes, scales, packed, 0);
    {
        nb_weight_desc bad = ok;
        bad.layout = NB_LAYOUT_PACKED;
        P(NB_ERR_INVALID_ARGUMENT, bad, codes, scales, packed, sz.packed_bytes);
        bad = ok, bad.k = 0;
        P(NB_ERR_BAD_SHAPE, bad, codes, scales, packed, sz.packed_bytes);
        bad = ok, bad.k = 168;
        P(NB_ERR_BAD_SHAPE, bad, codes, scales, packed, sz.packed_bytes);
        bad = ok, bad.format = (nb_format)12;
        P(NB_ERR_UNSUPPORTED, bad, codes, scales, packed, sz.packed_bytes);
        bad = ok, bad.n = ((int64_t)1 << 32);
        P(NB_ERR_OVERFLOW, bad, codes, scales, packed, sz.packed_bytes);
    }
#undef P
    d = ok;
    EXPECT(ctx, NB_OK, nb_pack_host(ctx, &d, codes, scales, packed, sz.packed_bytes));
    CHECK(d.layout == NB_LAYOUT_PACKED, "pack did not set the layout");
    /* packing twice is a layout error */
    before = d;
    EXPECT(ctx, NB_ERR_INVALID_ARGUMENT, nb_pack_host(ctx, &d, codes, scales, packed, sz.packed_bytes));
    CHECK(!memcmp(&d, &before, sizeof d), "a failed nb_pack_host modified the descriptor");

    /* device pack on a host-only context */
    d = ok;
    EXPECT(NULL, NB_ERR_NULL_POINTER, nb_pack(NULL, &d, codes, scales, packed, sz.packed_bytes, NULL));
    EXPECT(ctx, NB_ERR_NO_DEVICE, nb_pack(ctx, &d, codes, scales, packed, sz.packed_bytes, NULL));
    CHECK(!memcmp(&d, &ok, sizeof d), "a failed nb_pack modified the descriptor");
    free(packed);
}

static void test_gemm(nb_context *ctx) {
    enum { M = 3, N = 20, K = 64 };
    uint8_t codes[N * K / 2], scales[N * K / 16];
    float x[M * (K + 8)], bias[N];
    double yd[M * (N + 4)];
    float y[M * (N + 4)];
    for (size_t i = 0; i < sizeof codes; i++) codes[i] = (uint8_t)(i * 7);
    memset(scales, 0x38, sizeof scales);
    for (size_t i = 0; i < sizeof x / sizeof x[0]; i++) x[i] = 0.25f;
    for (int i = 0; i < N; i++) bias[i] = 1.0f;
    nb_weight_desc w;
    nb_weight_desc_init(&w, NB_FORMAT_NVFP4, N, K);
    w.tensor_scale = 1.0f;
    nb_gemm_desc ok, g;
    const int64_t big = (int64_t)1 << 31;

    /* descriptor init */
    EXPECT(NULL, NB_ERR_NULL_POINTER, nb_gemm_desc_init(NULL, &w, M, NB_DTYPE_F32, NB_DTYPE_F32));
    EXPECT(NULL, NB_ERR_NULL_POINTER, nb_gemm_desc_init(&g, NULL, M, NB_DTYPE_F32, NB_DTYPE_F32));
    EXPECT(NULL, NB_ERR_BAD_SHAPE, nb_gemm_desc_init(&g, &w, 0, NB_DTYPE_F32, NB_DTYPE_F32));
    EXPECT(NULL, NB_ERR_BAD_SHAPE, nb_gemm_desc_init(&g, &w, -2, NB_DTYPE_F32, NB_DTYPE_F32));
    EXPECT(NULL, NB_ERR_BAD_SHAPE, nb_gemm_desc_init(&g, &w, big + 1, NB_DTYPE_F32, NB_DTYPE_F32));
    EXPECT(NULL, NB_ERR_UNSUPPORTED, nb_gemm_desc_init(&g, &w, M, (nb_dtype)0, NB_DTYPE_F32));
    EXPECT(NULL, NB_ERR_UNSUPPORTED, nb_gemm_desc_init(&g, &w, M, NB_DTYPE_F32, (nb_dtype)9));
    {
        nb_weight_desc bw = w;
        bw.k = 72;
        EXPECT(NULL, NB_ERR_BAD_SHAPE, nb_gemm_desc_init(&g, &bw, M, NB_DTYPE_F32, NB_DTYPE_F32));
        bw = w, bw.format = (nb_format)13;
        EXPECT(NULL, NB_ERR_UNSUPPORTED, nb_gemm_desc_init(&g, &bw, M, NB_DTYPE_F32, NB_DTYPE_F32));
        bw = w, bw.n = big * 2;
        EXPECT(NULL, NB_ERR_OVERFLOW, nb_gemm_desc_init(&g, &bw, M, NB_DTYPE_F32, NB_DTYPE_F32));
    }
    EXPECT(NULL, NB_OK, nb_gemm_desc_init(&ok, &w, M, NB_DTYPE_F32, NB_DTYPE_F32));
    CHECK(ok.m == M && ok.lda == 0 && ok.ldc == 0 && ok.act_dtype == NB_DTYPE_F32 && ok.out_dtype == NB_DTYPE_F32 &&
              !memcmp(&ok.weight, &w, sizeof w),
          "nb_gemm_desc_init fields");

    /* both host GEMMs: the same validation */
    for (int f64 = 0; f64 < 2; f64++) {
#define GH(ctx_, g_, x_, c_, s_, b_)                                                      \
    (f64 ? nb_gemm_host_f64((ctx_), (g_), (x_), (c_), (s_), (b_), (ctx_) ? yd : NULL) \
         : nb_gemm_host((ctx_), (g_), (x_), (c_), (s_), (b_), (ctx_) ? (void *)y : NULL))
        EXPECT(NULL, NB_ERR_NULL_POINTER, GH(NULL, &ok, x, codes, scales, bias));
        EXPECT(ctx, NB_ERR_NULL_POINTER, GH(ctx, NULL, x, codes, scales, bias));
        EXPECT(ctx, NB_ERR_NULL_POINTER, GH(ctx, &ok, NULL, codes, scales, bias));
        EXPECT(ctx, NB_ERR_NULL_POINTER, GH(ctx, &ok, x, NULL, scales, bias));
        EXPECT(ctx, NB_ERR_NULL_POINTER, GH(ctx, &ok, x, codes, NULL, bias));
        EXPECT(ctx, NB_ERR_NULL_POINTER,
               f64 ? nb_gemm_host_f64(ctx, &ok, x, codes, scales, bias, NULL)
                   : nb_gemm_host(ctx, &ok, x, codes, scales, bias, NULL));
        EXPECT(ctx, NB_OK, GH(ctx, &ok, x, codes, scales, NULL)); /* bias may be NULL */
        EXPECT(ctx, NB_OK, GH(ctx, &ok, x, codes, scales, bias));
        g = ok, g.lda = K - 1;
        EXPECT(ctx, NB_ERR_BAD_SHAPE, GH(ctx, &g, x, codes, scales, bias));
        g = ok, g.lda = -1;
        EXPECT(ctx, NB_ERR_BAD_SHAPE, GH(ctx, &g, x, codes, scales, bias));
        g = ok, g.ldc = N - 1;
        EXPECT(ctx, NB_ERR_BAD_SHAPE, GH(ctx, &g, x, codes, scales, bias));
        g = ok, g.ldc = -5;
        EXPECT(ctx, NB_ERR_BAD_SHAPE, GH(ctx, &g, x, codes, scales, bias));
        g = ok, g.lda = K + 8, g.ldc = N + 4;
        EXPECT(ctx, NB_OK, GH(ctx, &g, x, codes, scales, bias));
        g = ok, g.m = 0;
        EXPECT(ctx, NB_ERR_BAD_SHAPE, GH(ctx, &g, x, codes, scales, bias));
        g = ok, g.m = -1;
        EXPECT(ctx, NB_ERR_BAD_SHAPE, GH(ctx, &g, x, codes, scales, bias));
        g = ok, g.act_dtype = (nb_dtype)7;
        EXPECT(ctx, NB_ERR_UNSUPPORTED, GH(ctx, &g, x, codes, scales, bias));
        g = ok, g.out_dtype = (nb_dtype)0;
        EXPECT(ctx, NB_ERR_UNSUPPORTED, GH(ctx, &g, x, codes, scales, bias));
        g = ok, g.weight.layout = NB_LAYOUT_PACKED;
        EXPECT(ctx, NB_ERR_INVALID_ARGUMENT, GH(ctx, &g, x, codes, scales, bias));
        g = ok, g.weight.layout = (nb_layout)9;
        EXPECT(ctx, NB_ERR_INVALID_ARGUMENT, GH(ctx, &g, x, codes, scales, bias));
        g = ok, g.weight.format = (nb_format)0;
        EXPECT(ctx, NB_ERR_UNSUPPORTED, GH(ctx, &g, x, codes, scales, bias));
        g = ok, g.weight.k = 40;
        EXPECT(ctx, NB_ERR_BAD_SHAPE, GH(ctx, &g, x, codes, scales, bias));
        g = ok, g.weight.n = 0;
        EXPECT(ctx, NB_ERR_BAD_SHAPE, GH(ctx, &g, x, codes, scales, bias));
        g = ok, g.weight.k = big + 16;
        EXPECT(ctx, NB_ERR_OVERFLOW, GH(ctx, &g, x, codes, scales, bias));
        g = ok, g.m = (int64_t)1 << 30, g.lda = (int64_t)1 << 21; /* m * lda = 2^51 elements */
        EXPECT(ctx, NB_ERR_OVERFLOW, GH(ctx, &g, x, codes, scales, bias));
        g = ok, g.m = (int64_t)1 << 30, g.ldc = (int64_t)1 << 21;
        EXPECT(ctx, NB_ERR_OVERFLOW, GH(ctx, &g, x, codes, scales, bias));
#undef GH
    }

    /* device entry points on a host-only context */
    nb_gemm_desc gd;
    nb_gemm_desc_init(&gd, &w, M, NB_DTYPE_BF16, NB_DTYPE_BF16);
    gd.weight.layout = NB_LAYOUT_PACKED;
    size_t bytes = 12345;
    float yf[M * N];
    EXPECT(NULL, NB_ERR_NULL_POINTER, nb_gemm_can_implement(NULL, &gd));
    EXPECT(ctx, NB_ERR_NO_DEVICE, nb_gemm_can_implement(ctx, &gd));
    EXPECT(NULL, NB_ERR_NULL_POINTER, nb_gemm_workspace_size(NULL, &gd, &bytes));
    EXPECT(ctx, NB_ERR_NULL_POINTER, nb_gemm_workspace_size(ctx, &gd, NULL));
    EXPECT(ctx, NB_ERR_NO_DEVICE, nb_gemm_workspace_size(ctx, &gd, &bytes));
    EXPECT(NULL, NB_ERR_NULL_POINTER, nb_gemm(NULL, &gd, x, codes, NULL, y, NULL, 0, NULL));
    EXPECT(ctx, NB_ERR_NO_DEVICE, nb_gemm(ctx, &gd, x, codes, NULL, y, NULL, 0, NULL));
    nb_gemm_config cfg;
    memset(&cfg, 0, sizeof cfg);
    cfg.path = NB_GEMM_PATH_DECODE;
    EXPECT(ctx, NB_ERR_NO_DEVICE, nb_gemm_ex(ctx, &gd, &cfg, x, codes, NULL, y, NULL, 0, NULL));
    EXPECT(NULL, NB_ERR_NULL_POINTER, nb_gemm_ex(NULL, &gd, &cfg, x, codes, NULL, y, NULL, 0, NULL));
    EXPECT(ctx, NB_ERR_NULL_POINTER, nb_gemm_workspace_size_ex(ctx, &gd, &cfg, NULL));
    EXPECT(ctx, NB_ERR_NO_DEVICE, nb_gemm_workspace_size_ex(ctx, &gd, &cfg, &bytes));
    EXPECT(NULL, NB_ERR_NULL_POINTER, nb_gemm_reference_device(NULL, &ok, x, codes, scales, NULL, yf, NULL));
    EXPECT(ctx, NB_ERR_NO_DEVICE, nb_gemm_reference_device(ctx, &ok, x, codes, scales, NULL, yf, NULL));

    /* last config (const context: only the thread-local message) */
    char buf[256];
    EXPECT(NULL, NB_ERR_NULL_POINTER, nb_gemm_last_config(NULL, buf, sizeof buf));
    EXPECT(NULL, NB_ERR_NULL_POINTER, nb_gemm_last_config(ctx, NULL, sizeof buf));
    EXPECT(NULL, NB_ERR_BUFFER_TOO_SMALL, nb_gemm_last_config(ctx, buf, 0));
    EXPECT(NULL, NB_OK, nb_gemm_last_config(ctx, buf, sizeof buf));
    CHECK(!strcmp(buf, "none"), "last config before any nb_gemm = \"%s\", want \"none\"", buf);
    /* a buffer too small for the text must say so, like it does for a real
     * configuration string; "none" needs 5 bytes */
    memset(buf, 'Z', sizeof buf);
    nb_status st = nb_gemm_last_config(ctx, buf, 3);
    CHECK(st == NB_ERR_BUFFER_TOO_SMALL && buf[2] == '\0',
          "nb_gemm_last_config(fresh ctx, buf, 3) = %s with \"%s\": the text \"none\" was truncated, want "
          "NB_ERR_BUFFER_TOO_SMALL", nb_status_name(st), buf);
}

/* The MoE descriptor, the reference MLP and the routing layout: every rule
 * of nibble.h's "mixture of experts" section. */
static void test_moe(nb_context *ctx) {
    enum { M = 3, E = 4, TK = 2, H = 32, I = 16 };
    const int64_t big = (int64_t)1 << 31;
    nb_moe_desc ok, d;
#define INIT(...) nb_moe_desc_init(&d, __VA_ARGS__)
    EXPECT(NULL, NB_ERR_NULL_POINTER,
           nb_moe_desc_init(NULL, NB_FORMAT_NVFP4, M, E, TK, H, I, NB_MOE_ACT_SWIGLU, NB_DTYPE_F32));
    EXPECT(NULL, NB_ERR_UNSUPPORTED, INIT((nb_format)0, M, E, TK, H, I, NB_MOE_ACT_SWIGLU, NB_DTYPE_F32));
    EXPECT(NULL, NB_ERR_BAD_SHAPE, INIT(NB_FORMAT_NVFP4, 0, E, TK, H, I, NB_MOE_ACT_SWIGLU, NB_DTYPE_F32));
    EXPECT(NULL, NB_ERR_BAD_SHAPE, INIT(NB_FORMAT_NVFP4, big + 1, E, TK, H, I, NB_MOE_ACT_SWIGLU, NB_DTYPE_F32));
    EXPECT(NULL, NB_ERR_BAD_SHAPE, INIT(NB_FORMAT_NVFP4, M, 0, TK, H, I, NB_MOE_ACT_SWIGLU, NB_DTYPE_F32));
    EXPECT(NULL, NB_ERR_BAD_SHAPE, INIT(NB_FORMAT_NVFP4, M, E, 0, H, I, NB_MOE_ACT_SWIGLU, NB_DTYPE_F32));
    EXPECT(NULL, NB_ERR_INVALID_ARGUMENT, INIT(NB_FORMAT_NVFP4, M, E, E + 1, H, I, NB_MOE_ACT_SWIGLU, NB_DTYPE_F32));
    EXPECT(NULL, NB_ERR_BAD_SHAPE, INIT(NB_FORMAT_NVFP4, M, E, TK, 0, I, NB_MOE_ACT_SWIGLU, NB_DTYPE_F32));
    EXPECT(NULL, NB_ERR_BAD_SHAPE, INIT(NB_FORMAT_NVFP4, M, E, TK, H, -4, NB_MOE_ACT_SWIGLU, NB_DTYPE_F32));
    EXPECT(NULL, NB_ERR_BAD_SHAPE, INIT(NB_FORMAT_NVFP4, M, E, TK, 40, I, NB_MOE_ACT_SWIGLU, NB_DTYPE_F32));
    CHECK(strstr(nb_last_error(), "gate_up") != NULL, "H not a multiple of the group names gate_up: \"%s\"",
          nb_last_error());
    EXPECT(NULL, NB_ERR_BAD_SHAPE, INIT(NB_FORMAT_MXFP4, M, E, TK, 64, I, NB_MOE_ACT_SWIGLU, NB_DTYPE_F32));
    CHECK(strstr(nb_last_error(), "down") != NULL, "I not a multiple of the group names down: \"%s\"", nb_last_error());
    EXPECT(NULL, NB_ERR_INVALID_ARGUMENT, INIT(NB_FORMAT_NVFP4, M, E, TK, H, I, (nb_moe_activation)0, NB_DTYPE_F32));
    EXPECT(NULL, NB_ERR_UNSUPPORTED, INIT(NB_FORMAT_NVFP4, M, E, TK, H, I, NB_MOE_ACT_SWIGLU, (nb_dtype)9));
    EXPECT(NULL, NB_OK, INIT(NB_FORMAT_MXFP4, M, E, TK, 64, 32, NB_MOE_ACT_SWIGLU_OAI, NB_DTYPE_BF16));
    CHECK(d.gate_up_layout == NB_MOE_GATE_UP_INTERLEAVED && d.limit == 7.0f && d.alpha == 1.702f &&
              d.gate_up.n == 64 && d.gate_up.k == 64 && d.down.n == 64 && d.down.k == 32 && d.reserved[8] == 0,
          "nb_moe_desc_init (gpt-oss) fields");
    EXPECT(NULL, NB_OK, nb_moe_desc_init(&ok, NB_FORMAT_NVFP4, M, E, TK, H, I, NB_MOE_ACT_SWIGLU, NB_DTYPE_F32));
    CHECK(ok.gate_up_layout == NB_MOE_GATE_UP_CONCAT && ok.limit == 0.0f && ok.alpha == 0.0f && ok.gate_up.n == 2 * I &&
              ok.gate_up.k == H && ok.down.n == H && ok.down.k == I && ok.m == M && ok.experts == E && ok.top_k == TK,
          "nb_moe_desc_init (swiglu) fields");

#undef INIT
    /* validate: one broken field at a time */
    EXPECT(NULL, NB_ERR_NULL_POINTER, nb_moe_desc_validate(NULL));
    d = ok, d.reserved[3] = 1;
    EXPECT(NULL, NB_ERR_INVALID_ARGUMENT, nb_moe_desc_validate(&d));
    d = ok, d.gate_up.n = I;
    EXPECT(NULL, NB_ERR_BAD_SHAPE, nb_moe_desc_validate(&d));
    d = ok, d.down.k = 2 * I;
    EXPECT(NULL, NB_ERR_BAD_SHAPE, nb_moe_desc_validate(&d));
    d = ok, d.hidden = 2 * H;
    EXPECT(NULL, NB_ERR_BAD_SHAPE, nb_moe_desc_validate(&d));
    d = ok, d.down.format = (nb_format)77;
    EXPECT(NULL, NB_ERR_UNSUPPORTED, nb_moe_desc_validate(&d));
    d = ok, d.gate_up.group_size = 32;
    EXPECT(NULL, NB_ERR_UNSUPPORTED, nb_moe_desc_validate(&d));
    d = ok, d.gate_up_layout = 3;
    EXPECT(NULL, NB_ERR_INVALID_ARGUMENT, nb_moe_desc_validate(&d));
    d = ok, d.activation = 3;
    EXPECT(NULL, NB_ERR_INVALID_ARGUMENT, nb_moe_desc_validate(&d));
    d = ok, d.limit = 7.0f;
    EXPECT(NULL, NB_ERR_INVALID_ARGUMENT, nb_moe_desc_validate(&d));
    d = ok, d.activation = NB_MOE_ACT_SWIGLU_OAI, d.alpha = 1.702f;
    EXPECT(NULL, NB_ERR_INVALID_ARGUMENT, nb_moe_desc_validate(&d)); /* limit 0 */
    d.limit = INFINITY;
    EXPECT(NULL, NB_ERR_INVALID_ARGUMENT, nb_moe_desc_validate(&d));
    d.limit = 7.0f, d.alpha = NAN;
    EXPECT(NULL, NB_ERR_INVALID_ARGUMENT, nb_moe_desc_validate(&d));
    d.alpha = 1.702f;
    EXPECT(NULL, NB_OK, nb_moe_desc_validate(&d)); /* swiglu_oai with concatenated rows is allowed */
    d = ok, d.act_dtype = (nb_dtype)0;
    EXPECT(NULL, NB_ERR_UNSUPPORTED, nb_moe_desc_validate(&d));
    d = ok, d.m = (int64_t)1 << 30, d.top_k = 2; /* 2^31 slots */
    EXPECT(NULL, NB_ERR_OVERFLOW, nb_moe_desc_validate(&d));
    d = ok, d.m = (int64_t)1 << 29, d.hidden = d.gate_up.k = d.down.n = (int64_t)1 << 22; /* 2^52 slot outputs */
    EXPECT(NULL, NB_ERR_OVERFLOW, nb_moe_desc_validate(&d));
    d = ok, d.experts = 1 << 20, d.hidden = d.gate_up.k = d.down.n = (int64_t)1 << 26; /* 2^20 x 2^5 x 2^26 */
    EXPECT(NULL, NB_ERR_OVERFLOW, nb_moe_desc_validate(&d));

    /* sizes */
    nb_moe_sizes sz;
    EXPECT(NULL, NB_ERR_NULL_POINTER, nb_moe_get_sizes(NULL, &sz));
    EXPECT(NULL, NB_ERR_NULL_POINTER, nb_moe_get_sizes(&ok, NULL));
    d = ok, d.top_k = 0;
    EXPECT(NULL, NB_ERR_BAD_SHAPE, nb_moe_get_sizes(&d, &sz));
    EXPECT(NULL, NB_OK, nb_moe_get_sizes(&ok, &sz));
    CHECK(sz.gate_up.codes_bytes == 2 * I * H / 2 && sz.gate_up.scales_bytes == 2 * I * H / 16 &&
              sz.down.codes_bytes == H * I / 2 && sz.down.scales_bytes == H * I / 16 && sz.gate_up.zeros_bytes == 0 &&
              sz.x_bytes == M * H * 4 && sz.gate_up_bias_bytes == E * 2 * I * 4 && sz.down_bias_bytes == E * H * 4 &&
              sz.reserved[0] == 0 && sz.reserved[7] == 0,
          "nb_moe_get_sizes fields");

    /* the MLP, float and f64: the same validation */
    static uint8_t guc[E * 2 * I * H / 2], gus[E * 2 * I * H / 16], dc[E * H * I / 2], ds[E * H * I / 16];
    for (size_t i = 0; i < sizeof guc; i++) guc[i] = (uint8_t)(i * 13), dc[i / 2] = (uint8_t)(i * 7);
    memset(gus, 0x30, sizeof gus);
    memset(ds, 0x30, sizeof ds);
    const float ts[E] = {1, 0.5f, 2, 1};
    float x[M * H], y[M * H], bias[E * 2 * I];
    double yd[M * H];
    for (int i = 0; i < M * H; i++) x[i] = (float)(i % 7) / 7.0f;
    for (int i = 0; i < E * 2 * I; i++) bias[i] = 0.5f;
    int32_t ids[M * TK] = {0, 1, 3, 2, 1, 0};
    float tw[M * TK] = {0.5f, 0.5f, 0.25f, 0.75f, 1, 0};
    nb_moe_weights w, bw;
    memset(&w, 0, sizeof w);
    w.gate_up.codes = guc, w.gate_up.scales = gus, w.down.codes = dc, w.down.scales = ds;
    w.gate_up_scales = ts, w.down_scales = ts;
    static uint8_t z[64];
    for (int f64 = 0; f64 < 2; f64++) {
#define MH(ctx_, d_, x_, w_, i_, t_)                                              \
    (f64 ? nb_moe_mlp_host_f64((ctx_), (d_), (x_), (w_), (i_), (t_), yd) \
         : nb_moe_mlp_host((ctx_), (d_), (x_), (w_), (i_), (t_), y))
        EXPECT(NULL, NB_ERR_NULL_POINTER, MH(NULL, &ok, x, &w, ids, tw));
        EXPECT(ctx, NB_ERR_NULL_POINTER, MH(ctx, NULL, x, &w, ids, tw));
        EXPECT(ctx, NB_ERR_NULL_POINTER, MH(ctx, &ok, NULL, &w, ids, tw));
        EXPECT(ctx, NB_ERR_NULL_POINTER, MH(ctx, &ok, x, NULL, ids, tw));
        EXPECT(ctx, NB_ERR_NULL_POINTER, MH(ctx, &ok, x, &w, NULL, tw));
        EXPECT(ctx, NB_ERR_NULL_POINTER, MH(ctx, &ok, x, &w, ids, NULL));
        EXPECT(ctx, NB_ERR_NULL_POINTER,
               f64 ? nb_moe_mlp_host_f64(ctx, &ok, x, &w, ids, tw, NULL)
                   : nb_moe_mlp_host(ctx, &ok, x, &w, ids, tw, NULL));
        EXPECT(ctx, NB_OK, MH(ctx, &ok, x, &w, ids, tw));
        bw = w, bw.gate_up_bias = bias;
        EXPECT(ctx, NB_OK, MH(ctx, &ok, x, &bw, ids, tw));
        bw = w, bw.gate_up.codes = NULL;
        EXPECT(ctx, NB_ERR_NULL_POINTER, MH(ctx, &ok, x, &bw, ids, tw));
        bw = w, bw.down.scales = NULL;
        EXPECT(ctx, NB_ERR_NULL_POINTER, MH(ctx, &ok, x, &bw, ids, tw));
        bw = w, bw.down.zeros = z;
        EXPECT(ctx, NB_ERR_INVALID_ARGUMENT, MH(ctx, &ok, x, &bw, ids, tw));
        bw = w, bw.gate_up_scales = NULL;
        EXPECT(ctx, NB_ERR_NULL_POINTER, MH(ctx, &ok, x, &bw, ids, tw));
        CHECK(strstr(nb_last_error(), "tensor scales") != NULL, "missing NVFP4 tensor scales: \"%s\"", nb_last_error());
        bw = w, bw.down_scales = NULL;
        EXPECT(ctx, NB_ERR_NULL_POINTER, MH(ctx, &ok, x, &bw, ids, tw));
        bw = w, bw.reserved[1] = bias;
        EXPECT(ctx, NB_ERR_INVALID_ARGUMENT, MH(ctx, &ok, x, &bw, ids, tw));
        bw = w, bw.gate_up.reserved[0] = bias;
        EXPECT(ctx, NB_ERR_INVALID_ARGUMENT, MH(ctx, &ok, x, &bw, ids, tw));
        d = ok, d.down.layout = NB_LAYOUT_PACKED;
        EXPECT(ctx, NB_ERR_INVALID_ARGUMENT, MH(ctx, &d, x, &w, ids, tw));
        d = ok, d.top_k = E + 1;
        EXPECT(ctx, NB_ERR_INVALID_ARGUMENT, MH(ctx, &d, x, &w, ids, tw));
        d = ok, d.gate_up.k = 64;
        EXPECT(ctx, NB_ERR_BAD_SHAPE, MH(ctx, &d, x, &w, ids, tw));
        {   /* MXFP4 experts take no tensor scales */
            nb_moe_desc mx;
            nb_moe_desc_init(&mx, NB_FORMAT_MXFP4, 1, E, TK, H, 32, NB_MOE_ACT_SWIGLU_OAI, NB_DTYPE_F32);
            EXPECT(ctx, NB_ERR_INVALID_ARGUMENT, MH(ctx, &mx, x, &w, ids, tw));
            bw = w, bw.gate_up_scales = bw.down_scales = NULL;
            EXPECT(ctx, NB_OK, MH(ctx, &mx, x, &bw, ids, tw));
            /* int4 carries zero points: zeros must be given */
            nb_moe_desc q;
            nb_moe_desc_init(&q, NB_FORMAT_INT4, 1, E, TK, 128, 128, NB_MOE_ACT_SWIGLU, NB_DTYPE_F32);
            EXPECT(ctx, NB_ERR_NULL_POINTER, MH(ctx, &q, x, &bw, ids, tw));
        }
        /* routing data */
        int32_t bid[M * TK];
        float btw[M * TK];
        memcpy(bid, ids, sizeof ids);
        bid[3] = E;
        EXPECT(ctx, NB_ERR_INVALID_ARGUMENT, MH(ctx, &ok, x, &w, bid, tw));
        CHECK(strstr(nb_last_error(), "topk_ids[1, 1] = 4") != NULL, "id out of range: \"%s\"", nb_last_error());
        bid[3] = -1;
        EXPECT(ctx, NB_ERR_INVALID_ARGUMENT, MH(ctx, &ok, x, &w, bid, tw));
        bid[3] = 3; /* token 1 names expert 3 twice */
        EXPECT(ctx, NB_ERR_INVALID_ARGUMENT, MH(ctx, &ok, x, &w, bid, tw));
        CHECK(strstr(nb_last_error(), "twice") != NULL, "duplicate id: \"%s\"", nb_last_error());
        memcpy(btw, tw, sizeof tw);
        btw[5] = NAN;
        EXPECT(ctx, NB_ERR_INVALID_ARGUMENT, MH(ctx, &ok, x, &w, ids, btw));
        btw[5] = -INFINITY;
        EXPECT(ctx, NB_ERR_INVALID_ARGUMENT, MH(ctx, &ok, x, &w, ids, btw));
        btw[5] = -3.0f; /* any finite weight is used as given */
        EXPECT(ctx, NB_OK, MH(ctx, &ok, x, &w, ids, btw));
#undef MH
    }
    {   /* nothing is written on a failure */
        float yp[M * H];
        for (int i = 0; i < M * H; i++) yp[i] = 42.0f;
        int32_t bid[M * TK] = {0, 1, 3, 3, 1, 0};
        CHECK(nb_moe_mlp_host(ctx, &ok, x, &w, bid, tw, yp) == NB_ERR_INVALID_ARGUMENT && yp[0] == 42.0f &&
                  yp[M * H - 1] == 42.0f,
              "a refused call wrote y");
    }

    /* the routing layout */
    nb_moe_align_sizes as, cap;
    EXPECT(NULL, NB_ERR_NULL_POINTER, nb_moe_align_get_sizes(NULL, 16, &as));
    EXPECT(NULL, NB_ERR_NULL_POINTER, nb_moe_align_get_sizes(&ok, 16, NULL));
    EXPECT(NULL, NB_ERR_INVALID_ARGUMENT, nb_moe_align_get_sizes(&ok, 0, &as));
    EXPECT(NULL, NB_ERR_INVALID_ARGUMENT, nb_moe_align_get_sizes(&ok, 4097, &as));
    d = ok, d.experts = 0;
    EXPECT(NULL, NB_ERR_BAD_SHAPE, nb_moe_align_get_sizes(&d, 16, &as));
    d = ok, d.m = INT32_MAX - 100, d.top_k = 1; /* the slots fit int32, the padding does not */
    EXPECT(NULL, NB_ERR_OVERFLOW, nb_moe_align_get_sizes(&d, 64, &as));
    EXPECT(NULL, NB_OK, nb_moe_align_get_sizes(&ok, 4, &as));
    CHECK(as.slots == M * TK && as.sorted_len == M * TK + E * 3 && as.blocks == (M * TK + E * 3 + 3) / 4 &&
              as.offsets_len == E + 1,
          "nb_moe_align_get_sizes fields");
    int32_t sorted[64], blocks[64], offs[16], counts[16];
    EXPECT(NULL, NB_ERR_NULL_POINTER, nb_moe_align_host(NULL, &ok, 4, ids, sorted, blocks, offs, counts, &as));
    EXPECT(ctx, NB_ERR_NULL_POINTER, nb_moe_align_host(ctx, NULL, 4, ids, sorted, blocks, offs, counts, &as));
    EXPECT(ctx, NB_ERR_NULL_POINTER, nb_moe_align_host(ctx, &ok, 4, NULL, sorted, blocks, offs, counts, &as));
    EXPECT(ctx, NB_ERR_NULL_POINTER, nb_moe_align_host(ctx, &ok, 4, ids, NULL, blocks, offs, counts, &as));
    EXPECT(ctx, NB_ERR_NULL_POINTER, nb_moe_align_host(ctx, &ok, 4, ids, sorted, NULL, offs, counts, &as));
    EXPECT(ctx, NB_ERR_NULL_POINTER, nb_moe_align_host(ctx, &ok, 4, ids, sorted, blocks, NULL, counts, &as));
    EXPECT(ctx, NB_ERR_NULL_POINTER, nb_moe_align_host(ctx, &ok, 4, ids, sorted, blocks, offs, counts, NULL));
    EXPECT(ctx, NB_ERR_INVALID_ARGUMENT, nb_moe_align_host(ctx, &ok, 0, ids, sorted, blocks, offs, counts, &as));
    EXPECT(ctx, NB_OK, nb_moe_align_host(ctx, &ok, 4, ids, sorted, blocks, offs, NULL, &as));
    EXPECT(ctx, NB_OK, nb_moe_align_host(ctx, &ok, 4, ids, sorted, blocks, offs, counts, &as));
    CHECK(offs[0] == 0 && offs[E] == 16 && counts[0] == 2 && counts[1] == 2 && counts[2] == 1 && counts[3] == 1 &&
              sorted[0] == 0 && sorted[1] == 5 && sorted[2] == 6 && sorted[4] == 1 && sorted[5] == 4 &&
              sorted[8] == 3 && sorted[12] == 2 && blocks[0] == 0 && blocks[3] == 3 && blocks[4] == -1,
          "nb_moe_align_host on a small routing");
    cap = as, cap.sorted_len--;
    EXPECT(ctx, NB_ERR_BUFFER_TOO_SMALL, nb_moe_align_host(ctx, &ok, 4, ids, sorted, blocks, offs, counts, &cap));
    CHECK(strstr(nb_last_error(), "sorted_slots") != NULL, "short sorted_slots: \"%s\"", nb_last_error());
    cap = as, cap.blocks--;
    EXPECT(ctx, NB_ERR_BUFFER_TOO_SMALL, nb_moe_align_host(ctx, &ok, 4, ids, sorted, blocks, offs, counts, &cap));
    cap = as, cap.offsets_len--;
    EXPECT(ctx, NB_ERR_BUFFER_TOO_SMALL, nb_moe_align_host(ctx, &ok, 4, ids, sorted, blocks, offs, counts, &cap));
    cap = as, cap.reserved[2] = 1;
    EXPECT(ctx, NB_ERR_INVALID_ARGUMENT, nb_moe_align_host(ctx, &ok, 4, ids, sorted, blocks, offs, counts, &cap));
    {
        int32_t bid[M * TK] = {0, 1, 3, 2, 1, 1};
        EXPECT(ctx, NB_ERR_INVALID_ARGUMENT, nb_moe_align_host(ctx, &ok, 4, bid, sorted, blocks, offs, counts, &as));
        bid[5] = 9;
        EXPECT(ctx, NB_ERR_INVALID_ARGUMENT, nb_moe_align_host(ctx, &ok, 4, bid, sorted, blocks, offs, counts, &as));
    }
}

/* The groups and scale types a row accepts; the messages of NVFP4 and MXFP4
 * as they were (one group, one scale type). */
static void test_row_sets(void) {
    nb_weight_desc d;
    EXPECT(NULL, NB_OK, nb_weight_desc_init(&d, NB_FORMAT_INT4, 8, 256));
    CHECK(d.group_size == 128 && d.scale_type == NB_SCALE_F16 && d.tensor_scale == 1.0f, "int4 defaults");
    const int32_t good[4] = {32, 64, 128, 256 /* = k: per channel */};
    for (int i = 0; i < 4; i++) {
        d.group_size = good[i];
        EXPECT(NULL, NB_OK, nb_weight_desc_validate(&d));
    }
    d.group_size = 384, d.k = 384; /* per channel with k not a power of two */
    EXPECT(NULL, NB_OK, nb_weight_desc_validate(&d));
    d.k = 256;
    const int32_t bad[6] = {16, 8, 0, -32, 512, 48};
    for (int i = 0; i < 6; i++) {
        d.group_size = bad[i];
        EXPECT(NULL, NB_ERR_UNSUPPORTED, nb_weight_desc_validate(&d));
    }
    CHECK(strstr(nb_last_error(), "32, 64, 128 or k (one group per row)") != NULL, "int4 group message: \"%s\"",
          nb_last_error());
    d.group_size = 64, d.k = 96; /* accepted group, k not a multiple */
    EXPECT(NULL, NB_ERR_BAD_SHAPE, nb_weight_desc_validate(&d));
    d.k = 256;
    d.scale_type = NB_SCALE_BF16;
    EXPECT(NULL, NB_OK, nb_weight_desc_validate(&d));
    const int bad_st[5] = {NB_SCALE_E4M3, NB_SCALE_E8M0, NB_SCALE_F32, 0, 77};
    for (int i = 0; i < 5; i++) {
        d.scale_type = (nb_scale_type)bad_st[i];
        EXPECT(NULL, NB_ERR_UNSUPPORTED, nb_weight_desc_validate(&d));
    }
    CHECK(strstr(nb_last_error(), "f16 (3) or bf16 (4)") != NULL, "int4 scale message: \"%s\"", nb_last_error());
    d.scale_type = (nb_scale_type)-5;
    EXPECT(NULL, NB_ERR_UNSUPPORTED, nb_weight_desc_validate(&d));
    /* nf4: blocks 32 .. 4096, F32 only, never per channel */
    EXPECT(NULL, NB_OK, nb_weight_desc_init(&d, NB_FORMAT_NF4, 2, 8192));
    for (int g = 32; g <= 4096; g *= 2) {
        d.group_size = g;
        EXPECT(NULL, NB_OK, nb_weight_desc_validate(&d));
    }
    d.group_size = 8192; /* = k, but nf4 has no per-channel groups */
    EXPECT(NULL, NB_ERR_UNSUPPORTED, nb_weight_desc_validate(&d));
    d.group_size = 64, d.scale_type = NB_SCALE_F16;
    EXPECT(NULL, NB_ERR_UNSUPPORTED, nb_weight_desc_validate(&d));
    CHECK(strstr(nb_last_error(), "nf4 needs scale type 5, got 3") != NULL, "nf4 scale message: \"%s\"",
          nb_last_error());
    /* NVFP4 and MXFP4: the messages of one group and one scale type */
    nb_weight_desc_init(&d, NB_FORMAT_NVFP4, 16, 64);
    d.group_size = 32;
    EXPECT(NULL, NB_ERR_UNSUPPORTED, nb_weight_desc_validate(&d));
    CHECK(!strcmp(nb_last_error(), "nvfp4 needs group_size 16, got 32"), "nvfp4 message: \"%s\"", nb_last_error());
    nb_weight_desc_init(&d, NB_FORMAT_MXFP4, 16, 64);
    d.scale_type = NB_SCALE_F16;
    EXPECT(NULL, NB_ERR_UNSUPPORTED, nb_weight_desc_validate(&d));
    CHECK(!strcmp(nb_last_error(), "mxfp4 needs scale type 2, got 3"), "mxfp4 message: \"%s\"", nb_last_error());

    /* sizes: v1 refuses zero points and names the _v2 function */
    nb_weight_sizes sz;
    nb_weight_sizes_v2 s2;
    nb_weight_desc_init(&d, NB_FORMAT_INT4, 10, 256);
    d.group_size = 64;
    EXPECT(NULL, NB_ERR_UNSUPPORTED, nb_weight_get_sizes(&d, &sz));
    CHECK(strstr(nb_last_error(), "nb_weight_get_sizes_v2") != NULL, "v1 sizes message: \"%s\"", nb_last_error());
    memset(&s2, 0xA5, sizeof s2);
    EXPECT(NULL, NB_OK, nb_weight_get_sizes_v2(&d, &s2));
    /* packed: 1 x 2 chunks of 1024 code bytes + 16 rows x 2 kernel groups x 3 (docs/formats.md 8.7) */
    CHECK(s2.codes_bytes == 1280 && s2.scales_bytes == 80 && s2.zeros_bytes == 40 && s2.packed_bytes == 2240 &&
              s2.dense_elements == 2560 && s2.reserved[0] == 0 && s2.reserved[7] == 0,
          "int4 10x256 g64 sizes: %zu %zu %zu %zu", s2.codes_bytes, s2.scales_bytes, s2.zeros_bytes, s2.packed_bytes);
    EXPECT(NULL, NB_ERR_NULL_POINTER, nb_weight_get_sizes_v2(&d, NULL));
    EXPECT(NULL, NB_ERR_NULL_POINTER, nb_weight_get_sizes_v2(NULL, &s2));
    d.group_size = 16;
    EXPECT(NULL, NB_ERR_UNSUPPORTED, nb_weight_get_sizes_v2(&d, &s2));
    d.group_size = 64, d.k = ((int64_t)1 << 31) + 64;
    EXPECT(NULL, NB_ERR_OVERFLOW, nb_weight_get_sizes_v2(&d, &s2));
    nb_weight_desc_init(&d, NB_FORMAT_INT8, 3, 128);
    EXPECT(NULL, NB_OK, nb_weight_get_sizes(&d, &sz));
    CHECK(sz.codes_bytes == 384 && sz.scales_bytes == 6 && sz.packed_bytes == 2048 + 32,
          "int8 3x128 sizes: %zu %zu %zu (one chunk: 2048 code bytes, 16 x 2 scale bytes)", sz.codes_bytes,
          sz.scales_bytes, sz.packed_bytes);
    nb_weight_desc_init(&d, NB_FORMAT_NF4, 3, 128);
    EXPECT(NULL, NB_OK, nb_weight_get_sizes(&d, &sz));
    CHECK(sz.codes_bytes == 192 && sz.scales_bytes == 24, "nf4 3x128 sizes: %zu %zu", sz.codes_bytes, sz.scales_bytes);
}

/* The _v2 functions' own errors, the first versions refusing zero points
 * with the _v2 name, and the device entry points refusing rows without
 * kernels by name. */
static void test_v2_functions(nb_context *ctx) {
    enum { N = 4, K = 64, M = 2 };
    float w[N * K], out[N * K], x[M * K];
    double yd[M * N];
    for (int i = 0; i < N * K; i++) w[i] = (float)((i * 37) % 101 - 50) / 25.0f;
    for (int i = 0; i < M * K; i++) x[i] = 0.5f;
    uint8_t codes[N * K], scales[N * K / 32 * 4], zeros[N * K / 32];
    nb_weight_desc ok, d, before;
    nb_weight_desc_init(&ok, NB_FORMAT_INT4, N, K);
    ok.group_size = 32;
    nb_weight_buffers b = {.codes = codes, .scales = scales, .zeros = zeros}, bb;
    nb_weight_data wd = {.codes = codes, .scales = scales, .zeros = zeros}, bd;
    static int sentinel;
#define Q2(want, desc_, dt_, src_, out_)                                                                \
    do {                                                                                                \
        d = (desc_), before = d;                                                                        \
        EXPECT(ctx, want, nb_quantize_host_v2(ctx, &d, dt_, src_, out_));                               \
        CHECK(!memcmp(&d, &before, sizeof d), "a failed nb_quantize_host_v2 modified the descriptor");  \
    } while (0)
    EXPECT(NULL, NB_ERR_NULL_POINTER, nb_quantize_host_v2(NULL, &d, NB_DTYPE_F32, w, &b));
    EXPECT(ctx, NB_ERR_NULL_POINTER, nb_quantize_host_v2(ctx, NULL, NB_DTYPE_F32, w, &b));
    Q2(NB_ERR_NULL_POINTER, ok, NB_DTYPE_F32, w, NULL);
    Q2(NB_ERR_NULL_POINTER, ok, NB_DTYPE_F32, NULL, &b);
    bb = b, bb.codes = NULL;
    Q2(NB_ERR_NULL_POINTER, ok, NB_DTYPE_F32, w, &bb);
    bb = b, bb.scales = NULL;
    Q2(NB_ERR_NULL_POINTER, ok, NB_DTYPE_F32, w, &bb);
    bb = b, bb.zeros = NULL; /* int4 has zero points */
    Q2(NB_ERR_NULL_POINTER, ok, NB_DTYPE_F32, w, &bb);
    bb = b, bb.reserved[3] = &sentinel;
    Q2(NB_ERR_INVALID_ARGUMENT, ok, NB_DTYPE_F32, w, &bb);
    Q2(NB_ERR_UNSUPPORTED, ok, (nb_dtype)0, w, &b);
    {
        nb_weight_desc bad = ok;
        bad.group_size = 16;
        Q2(NB_ERR_UNSUPPORTED, bad, NB_DTYPE_F32, w, &b);
        bad = ok, bad.scale_type = NB_SCALE_E4M3;
        Q2(NB_ERR_UNSUPPORTED, bad, NB_DTYPE_F32, w, &b);
        bad = ok, bad.tensor_scale = 2.0f; /* no tensor scale */
        Q2(NB_ERR_INVALID_ARGUMENT, bad, NB_DTYPE_F32, w, &b);
        bad = ok, bad.layout = NB_LAYOUT_PACKED;
        Q2(NB_ERR_INVALID_ARGUMENT, bad, NB_DTYPE_F32, w, &b);
        float keep = w[5];
        w[5] = (float)INFINITY;
        Q2(NB_ERR_INVALID_ARGUMENT, ok, NB_DTYPE_F32, w, &b);
        w[5] = 1e30f; /* a group scale beyond F16 */
        Q2(NB_ERR_INVALID_ARGUMENT, ok, NB_DTYPE_F32, w, &b);
        w[5] = keep;
        nb_weight_desc_init(&bad, NB_FORMAT_INT4_SYM, N, K);
        bad.group_size = 32;
        Q2(NB_ERR_INVALID_ARGUMENT, bad, NB_DTYPE_F32, w, &b); /* zeros given to a format without them */
    }
#undef Q2
    d = ok;
    EXPECT(ctx, NB_OK, nb_quantize_host_v2(ctx, &d, NB_DTYPE_F32, w, &b));
    const nb_weight_desc q = d;

    /* dequantize */
    EXPECT(NULL, NB_ERR_NULL_POINTER, nb_dequantize_host_v2(NULL, &q, &wd, NB_DTYPE_F32, out));
    EXPECT(ctx, NB_ERR_NULL_POINTER, nb_dequantize_host_v2(ctx, NULL, &wd, NB_DTYPE_F32, out));
    EXPECT(ctx, NB_ERR_NULL_POINTER, nb_dequantize_host_v2(ctx, &q, NULL, NB_DTYPE_F32, out));
    EXPECT(ctx, NB_ERR_NULL_POINTER, nb_dequantize_host_v2(ctx, &q, &wd, NB_DTYPE_F32, NULL));
    bd = wd, bd.zeros = NULL;
    EXPECT(ctx, NB_ERR_NULL_POINTER, nb_dequantize_host_v2(ctx, &q, &bd, NB_DTYPE_F32, out));
    bd = wd, bd.codes = NULL;
    EXPECT(ctx, NB_ERR_NULL_POINTER, nb_dequantize_host_v2(ctx, &q, &bd, NB_DTYPE_F32, out));
    bd = wd, bd.reserved[0] = &sentinel;
    EXPECT(ctx, NB_ERR_INVALID_ARGUMENT, nb_dequantize_host_v2(ctx, &q, &bd, NB_DTYPE_F32, out));
    EXPECT(ctx, NB_ERR_UNSUPPORTED, nb_dequantize_host_v2(ctx, &q, &wd, (nb_dtype)5, out));
    d = q, d.k = 48;
    EXPECT(ctx, NB_ERR_BAD_SHAPE, nb_dequantize_host_v2(ctx, &d, &wd, NB_DTYPE_F32, out));
    EXPECT(ctx, NB_OK, nb_dequantize_host_v2(ctx, &q, &wd, NB_DTYPE_F16, out));

    /* the first versions refuse zero points, naming the _v2 function */
    d = q, before = d;
    EXPECT(ctx, NB_ERR_UNSUPPORTED, nb_quantize_host(ctx, &d, NB_DTYPE_F32, w, codes, scales));
    CHECK(strstr(nb_last_error(), "nb_quantize_host_v2") && !memcmp(&d, &before, sizeof d), "v1 quantize: \"%s\"",
          nb_last_error());
    EXPECT(ctx, NB_ERR_UNSUPPORTED, nb_dequantize_host(ctx, &q, codes, scales, NB_DTYPE_F32, out));
    CHECK(strstr(nb_last_error(), "nb_dequantize_host_v2") != NULL, "v1 dequantize: \"%s\"", nb_last_error());
    nb_gemm_desc g, gb;
    EXPECT(NULL, NB_OK, nb_gemm_desc_init(&g, &q, M, NB_DTYPE_F32, NB_DTYPE_F32));
    EXPECT(ctx, NB_ERR_UNSUPPORTED, nb_gemm_host(ctx, &g, x, codes, scales, NULL, out));
    CHECK(strstr(nb_last_error(), "nb_gemm_host_v2") != NULL, "v1 gemm: \"%s\"", nb_last_error());
    EXPECT(ctx, NB_ERR_UNSUPPORTED, nb_gemm_host_f64(ctx, &g, x, codes, scales, NULL, yd));
    CHECK(strstr(nb_last_error(), "nb_gemm_host_f64_v2") != NULL, "v1 gemm f64: \"%s\"", nb_last_error());

    /* the GEMMs */
    for (int f64 = 0; f64 < 2; f64++) {
#define G2(ctx_, g_, x_, w_, y_) \
    (f64 ? nb_gemm_host_f64_v2((ctx_), (g_), (x_), (w_), NULL, (double *)(y_)) : nb_gemm_host_v2((ctx_), (g_), (x_), (w_), NULL, (y_)))
        EXPECT(NULL, NB_ERR_NULL_POINTER, G2(NULL, &g, x, &wd, yd));
        EXPECT(ctx, NB_ERR_NULL_POINTER, G2(ctx, NULL, x, &wd, yd));
        EXPECT(ctx, NB_ERR_NULL_POINTER, G2(ctx, &g, NULL, &wd, yd));
        EXPECT(ctx, NB_ERR_NULL_POINTER, G2(ctx, &g, x, NULL, yd));
        EXPECT(ctx, NB_ERR_NULL_POINTER, G2(ctx, &g, x, &wd, NULL));
        bd = wd, bd.scales = NULL;
        EXPECT(ctx, NB_ERR_NULL_POINTER, G2(ctx, &g, x, &bd, yd));
        bd = wd, bd.zeros = NULL;
        EXPECT(ctx, NB_ERR_NULL_POINTER, G2(ctx, &g, x, &bd, yd));
        bd = wd, bd.reserved[1] = &sentinel;
        EXPECT(ctx, NB_ERR_INVALID_ARGUMENT, G2(ctx, &g, x, &bd, yd));
        gb = g, gb.weight.group_size = 16;
        EXPECT(ctx, NB_ERR_UNSUPPORTED, G2(ctx, &gb, x, &wd, yd));
        gb = g, gb.lda = 3;
        EXPECT(ctx, NB_ERR_BAD_SHAPE, G2(ctx, &gb, x, &wd, yd));
        gb = g;
        nb_weight_desc_init(&gb.weight, NB_FORMAT_INT8, N, K);
        gb.weight.group_size = 32;
        EXPECT(ctx, NB_ERR_INVALID_ARGUMENT, G2(ctx, &gb, x, &wd, yd)); /* zeros for a format without */
        EXPECT(ctx, NB_OK, G2(ctx, &g, x, &wd, yd));
#undef G2
    }

    /* device entry points: a host context says NO_DEVICE first; what no
     * kernel serves is refused by name where the device is not needed */
    d = q;
    EXPECT(ctx, NB_ERR_NO_DEVICE, nb_quantize(ctx, &d, NB_DTYPE_F32, w, codes, scales, NULL));
    EXPECT(ctx, NB_ERR_NO_DEVICE, nb_dequantize(ctx, &q, codes, scales, NB_DTYPE_F32, out, NULL));
    EXPECT(ctx, NB_ERR_NO_DEVICE, nb_pack(ctx, &d, codes, scales, out, sizeof out, NULL));
    EXPECT(ctx, NB_ERR_UNSUPPORTED, nb_pack_host(ctx, &d, codes, scales, out, sizeof out));
    CHECK(strstr(nb_last_error(), "use nb_pack_host_v2") != NULL, "pack int4: \"%s\"", nb_last_error());
    gb = g, gb.act_dtype = gb.out_dtype = NB_DTYPE_BF16;
    nb_weight_desc_init(&gb.weight, NB_FORMAT_INT8, N, K);
    gb.weight.group_size = 32; /* (int8's default group, 128, does not divide K) */
    EXPECT(ctx, NB_OK, nb_context_set_tuning(ctx, &gb, NULL, 0)); /* (int8 has kernels: its entry may be cleared) */
}

static void test_scalar_nan(void) {
    CHECK(nb_float_to_e4m3((float)NAN) == 0x7F, "nb_float_to_e4m3(NaN) = 0x%02X, want 0x7F",
          nb_float_to_e4m3((float)NAN));
    CHECK(nb_e4m3_to_float(0x7F) != nb_e4m3_to_float(0x7F), "nb_e4m3_to_float(0x7F) is not NaN");
    CHECK(nb_e8m0_to_float(0xFF) != nb_e8m0_to_float(0xFF), "nb_e8m0_to_float(0xFF) is not NaN");
}

int main(void) {
    setvbuf(stdout, NULL, _IONBF, 0); /* FAIL lines survive a crash */
    /* before anything failed on this thread */
    CHECK(nb_last_error() != NULL && nb_last_error()[0] == '\0', "nb_last_error() before any failure = \"%s\"",
          nb_last_error());
    test_status_and_version();
    test_thread_local();
    test_context();
    test_format_table();
    test_weight_desc();

    nb_context *ctx = NULL;
    if (nb_context_create(NB_DEVICE_NONE, &ctx) != NB_OK) {
        printf("cannot create a host context: %s\n", nb_last_error());
        return 1;
    }
    test_quantize_dequantize(ctx);
    test_pack(ctx);
    test_gemm(ctx);
    test_row_sets();
    test_v2_functions(ctx);
    test_moe(ctx);
    test_scalar_nan();
    nb_context_destroy(ctx);
    printf("%d passed, %d failed\n", g_pass, g_fail);
    return g_fail ? 1 : 0;
}
