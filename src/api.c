/* api.c - public entry points: status, errors, context, descriptors,
 * validation, the reference GEMM and the device dispatch. */
#include "internal.h"

#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ------------------------------------------------------ version, status */

int nb_version(void) { return NB_VERSION; }

const char *nb_version_string(void) {
#define NB_STR2(x) #x
#define NB_STR(x) NB_STR2(x)
    return NB_STR(NB_VERSION_MAJOR) "." NB_STR(NB_VERSION_MINOR) "." NB_STR(NB_VERSION_PATCH);
}

const char *nb_status_string(nb_status s) {
    switch (s) {
#define NB_X_CASE(name, value, msg) case name: return msg;
        NB_STATUS_LIST(NB_X_CASE)
#undef NB_X_CASE
    }
    return "unknown status";
}

const char *nb_status_name(nb_status s) {
    switch (s) {
#define NB_X_NAME(name, value, msg) case name: return #name;
        NB_STATUS_LIST(NB_X_NAME)
#undef NB_X_NAME
    }
    return "NB_UNKNOWN";
}

static _Thread_local char tls_error[NB_ERRBUF];

const char *nb_last_error(void) { return tls_error; }

/* A message of n bytes (s) that does not fit the buffers, as its head and
 * its tail around "...": the reason a message ends with ("...: Permission
 * denied") and the call it starts with both survive a long path in between.
 * Cuts fall on UTF-8 character boundaries. */
static void elide_middle(const char *s, size_t n, char *out, size_t cap) {
    const char mark[] = "...";
    size_t head = (cap - sizeof mark) * 3 / 8, tail_len = cap - sizeof mark - head;
    size_t tail = n - tail_len;
    while (head > 0 && ((unsigned char)s[head] & 0xC0) == 0x80) head--;
    while (tail < n && ((unsigned char)s[tail] & 0xC0) == 0x80) tail++;
    memcpy(out, s, head);
    memcpy(out + head, mark, sizeof mark - 1);
    memcpy(out + head + sizeof mark - 1, s + tail, n - tail + 1);
}

const char *nbi_elide(const char *s, char *buf, size_t cap) {
    const size_t n = strlen(s);
    if (n < cap) return s;
    elide_middle(s, n, buf, cap);
    return buf;
}

nb_status nbi_fail(nb_context *ctx, nb_status st, const char *fmt, ...) {
    char buf[NB_ERRBUF];
    va_list ap, again;
    va_start(ap, fmt);
    va_copy(again, ap);
    const int n = vsnprintf(buf, sizeof buf, fmt, ap);
    va_end(ap);
    if (n >= (int)sizeof buf) { /* too long: elide the middle (cut at the end if out of memory) */
        char *full = (char *)malloc((size_t)n + 1);
        if (full && vsnprintf(full, (size_t)n + 1, fmt, again) == n) elide_middle(full, (size_t)n, buf, sizeof buf);
        free(full);
    }
    va_end(again);
    /* buf may be tls_error itself (re-raising a message): copy via buf. */
    snprintf(tls_error, sizeof tls_error, "%s", buf);
    if (ctx) snprintf(ctx->last_error, sizeof ctx->last_error, "%s", buf);
    return st;
}

/* ------------------------------------------------- CUDA failures, devices */

nb_status nbi_cuda_status(int cuda_error) {
    switch (cuda_error) {
    case 2:   /* cudaErrorMemoryAllocation */
        return NB_ERR_OUT_OF_MEMORY;
    case 35:  /* cudaErrorInsufficientDriver */
    case 100: /* cudaErrorNoDevice */
        return NB_ERR_NO_DEVICE;
    }
    return NB_ERR_CUDA;
}

nb_status nbi_reraise(nb_context *ctx, nb_status st, const char *fn) {
    return nbi_fail(ctx, st, "%s: %s", fn, nb_last_error());
}

nb_status nbi_need_device(nb_context *ctx, const char *fn) {
    if (!ctx) return nbi_fail(NULL, NB_ERR_NULL_POINTER, "%s: ctx is NULL", fn);
    if (!nbi_cuda_available()) return nbi_fail(ctx, NB_ERR_NO_DEVICE, "%s: libnibble was built without CUDA", fn);
    if (!ctx->has_device)
        return nbi_fail(ctx, NB_ERR_NO_DEVICE, "%s: the context is host-only (created with NB_DEVICE_NONE)", fn);
    return NB_OK;
}

/* ----------------------------------------------------------- context */

nb_status nb_device_count(int *count) {
    if (!count) return nbi_fail(NULL, NB_ERR_NULL_POINTER, "nb_device_count: count is NULL");
    *count = 0;
    if (!nbi_cuda_available()) return NB_OK;
    if (nbi_cuda_device_count(count)) *count = 0; /* no driver: zero devices, not an error */
    return NB_OK;
}

/* An environment switch of the planner, read once at context creation:
 * *out = i + 1 when the variable is values[i], 0 when it is unset or empty;
 * any other value is refused, not ignored, with the value named. */
static nb_status read_env_choice(const char *name, const char *const *values, int n, int *out) {
    const char *v = getenv(name);
    *out = 0;
    if (!v || !v[0]) return NB_OK;
    char list[96] = "";
    for (int i = 0; i < n; i++) {
        if (!strcmp(v, values[i])) {
            *out = i + 1;
            return NB_OK;
        }
        const size_t len = strlen(list);
        snprintf(list + len, sizeof list - len, "%s%s", i == 0 ? "" : i == n - 1 ? " or " : ", ", values[i]);
    }
    return nbi_fail(NULL, NB_ERR_INVALID_ARGUMENT, "nb_context_create: %s=\"%.64s\" is not %s (unset it for the "
                    "automatic choice)", name, v, list);
}

/* The planner's environment switches (nibble.h, "tuning"): NIBBLE_PATH, the
 * one planner choice for nb_gemm, and the MoE planner's NIBBLE_MOE_PATH,
 * NIBBLE_MOE_KW, NIBBLE_MOE_TC_BN and NIBBLE_MOE_ROUTE (measurement and
 * tests), NIBBLE_PDL (nb_gemm's launches with or without programmatic
 * dependent launch, or, unset or "auto", with it only where the launch can
 * follow one of the context's own: device.c pdl_head) and NIBBLE_K2_RPW
 * (decode kernel 2's row blocks per warp on its 17..32-token wave: 2 or 4
 * wherever it can run, unset the planner's rule; plan.c k2_rpw4). */
static nb_status read_env(int *path, int *moe_path, int *moe_kw, int *moe_bn, int *moe_route, int *pdl, int *k2_rpw) {
    static const char *const paths[3] = {"decode", "tc", "mma"}; /* NB_GEMM_PATH_DECODE, _TENSOR_CORE, _MMA */
    static const char *const moe_paths[2] = {"decode", "tc"};
    static const char *const kws[4] = {"1", "2", "4", "8"};
    static const char *const bns[3] = {"64", "128", "192"};
    static const char *const routes[2] = {"kernel", "inline"};
    static const char *const pdls[3] = {"0", "1", "auto"};
    static const char *const rpws[2] = {"2", "4"};
    int kw = 0, bn = 0, rpw = 0;
    nb_status st;
    if ((st = read_env_choice("NIBBLE_PATH", paths, 3, path)) ||
        (st = read_env_choice("NIBBLE_MOE_PATH", moe_paths, 2, moe_path)) ||
        (st = read_env_choice("NIBBLE_MOE_KW", kws, 4, &kw)) || (st = read_env_choice("NIBBLE_MOE_TC_BN", bns, 3, &bn)) ||
        (st = read_env_choice("NIBBLE_MOE_ROUTE", routes, 2, moe_route)) ||
        (st = read_env_choice("NIBBLE_PDL", pdls, 3, pdl)) || (st = read_env_choice("NIBBLE_K2_RPW", rpws, 2, &rpw)))
        return st;
    *k2_rpw = 2 * rpw; /* 2, 4 */
    *moe_kw = kw ? 1 << (kw - 1) : 0;
    *moe_bn = 64 * bn; /* 64, 128, 192 */
    return NB_OK;
}

nb_status nb_context_create(int device, nb_context **out) {
    if (!out) return nbi_fail(NULL, NB_ERR_NULL_POINTER, "nb_context_create: out is NULL");
    *out = NULL;
    if (device < NB_DEVICE_NONE)
        return nbi_fail(NULL, NB_ERR_INVALID_ARGUMENT, "nb_context_create: device %d is not an ordinal or "
                        "NB_DEVICE_NONE", device);
    int env_path = 0, env_moe_path = 0, env_moe_kw = 0, env_moe_bn = 0, env_moe_route = 0, env_pdl = 0, env_k2_rpw = 0;
    nb_status st = device == NB_DEVICE_NONE ? NB_OK
                                            : read_env(&env_path, &env_moe_path, &env_moe_kw, &env_moe_bn, &env_moe_route,
                                                       &env_pdl, &env_k2_rpw);
    if (st) return st;
    nb_context *c = (nb_context *)calloc(1, sizeof *c);
    if (!c) return nbi_fail(NULL, NB_ERR_OUT_OF_MEMORY, "nb_context_create: out of host memory");
    c->info.device = NB_DEVICE_NONE;
    c->env_sk = -1;
    snprintf(c->info.name, sizeof c->info.name, "host");
    if (device != NB_DEVICE_NONE) {
        if (!nbi_cuda_available()) {
            free(c);
            return nbi_fail(NULL, NB_ERR_NO_DEVICE, "nb_context_create: device %d requested but libnibble was "
                            "built without CUDA", device);
        }
        int count = 0;
        if ((st = nbi_cuda_device_count(&count)) || device >= count) {
            free(c);
            return nbi_fail(NULL, NB_ERR_NO_DEVICE, "nb_context_create: device %d not available (%d found)%s%s",
                            device, count, st ? ": " : "", st ? nb_last_error() : "");
        }
        if ((st = nbi_cuda_device_info(device, &c->info))) {
            free(c);
            return nbi_reraise(NULL, st, "nb_context_create");
        }
        c->has_device = 1;
        c->env_path = env_path;
        c->env_moe_path = env_moe_path;
        c->env_moe_kw = env_moe_kw;
        c->env_moe_bn = env_moe_bn;
        c->env_moe_route = env_moe_route;
        c->env_pdl = env_pdl;
        c->env_k2_rpw = env_k2_rpw;
        /* NIBBLE_SM90_CLUSTER=0: the tensor-core path's k splits sum through
         * the workspace, as on GPUs without clusters (to test that path) */
        const char *cl = getenv("NIBBLE_SM90_CLUSTER");
        c->env_no_cluster = cl && !strcmp(cl, "0");
        /* NIBBLE_SM90_TAIL=0: the tensor-core path's last partial wave runs
         * unsplit, in the same launch (to measure the split against it) */
        const char *tl = getenv("NIBBLE_SM90_TAIL");
        c->env_no_tail = tl && !strcmp(tl, "0");
        /* NIBBLE_SM90_SK=0 / 1: the tensor-core path's stream-K grid never /
         * wherever it can run (to measure and test it against the others) */
        const char *sk = getenv("NIBBLE_SM90_SK");
        c->env_sk = sk && !strcmp(sk, "0") ? 0 : sk && !strcmp(sk, "1") ? 1 : -1;
        for (int f = 0; f < NBI_FORMAT_COUNT; f++)
            for (int t = 0; t < 4; t++) c->table_shift[f][t] = INT32_MIN;
    }
    st = nbi_tune_load_env(c); /* NIBBLE_TUNE_CACHE, when set and the file exists */
    if (st) { /* (the message is in the thread's buffer) */
        nbi_tune_free(c);
        free(c);
        return st;
    }
    *out = c;
    return NB_OK;
}

nb_status nb_context_destroy(nb_context *ctx) {
    if (ctx) nbi_tune_free(ctx);
    free(ctx);
    return NB_OK;
}

const char *nb_context_last_error(const nb_context *ctx) { return ctx ? ctx->last_error : tls_error; }

nb_status nb_context_device_info(const nb_context *ctx, nb_device_info *out) {
    if (!ctx || !out) return nbi_fail(NULL, NB_ERR_NULL_POINTER, "nb_context_device_info: NULL argument");
    *out = ctx->info;
    return NB_OK;
}

nb_status nb_get_build_info(nb_build_info *out) {
    if (!out) return nbi_fail(NULL, NB_ERR_NULL_POINTER, "nb_get_build_info: out is NULL");
    memset(out, 0, sizeof *out);
    out->cuda = nbi_cuda_available();
    snprintf(out->cuda_archs, sizeof out->cuda_archs, "%s", nbi_cuda_archs());
    nb_format all[NBI_FORMAT_COUNT];
    size_t count = 0, used = 0;
    nb_format_list(all, NBI_FORMAT_COUNT, &count);
    for (size_t i = 0; i < count && used < sizeof out->formats; i++)
        used += (size_t)snprintf(out->formats + used, sizeof out->formats - used, "%s%s", i ? "," : "",
                                 nbi_traits(all[i])->name);
    snprintf(out->version, sizeof out->version, "%s", nb_version_string());
    return NB_OK;
}

/* ------------------------------------------------------- descriptors */

/* Largest n or k accepted: keeps every derived byte count far from overflow. */
#define NB_MAX_DIM ((int64_t)1 << 31)

nb_status nb_weight_desc_init(nb_weight_desc *d, nb_format format, int64_t n, int64_t k) {
    if (!d) return nbi_fail(NULL, NB_ERR_NULL_POINTER, "nb_weight_desc_init: desc is NULL");
    const nbi_format_traits *t = nbi_traits(format);
    if (!t) return nbi_fail(NULL, NB_ERR_UNSUPPORTED, "nb_weight_desc_init: unknown format %d", (int)format);
    memset(d, 0, sizeof *d);
    d->format = format;
    d->layout = NB_LAYOUT_CHECKPOINT;
    d->n = n;
    d->k = k;
    d->group_size = t->group;
    d->scale_type = t->scale_type;
    d->scale_rule = NB_MX_SCALE_OCP;
    d->tensor_scale = t->tensor_scale ? 0.0f : 1.0f;
    d->scale_exp_min = d->scale_exp_max = -1;
    return nb_weight_desc_validate(d);
}

nb_status nbi_check_desc(nb_context *ctx, const nb_weight_desc *d, nb_layout want) {
    if (!d) return nbi_fail(ctx, NB_ERR_NULL_POINTER, "weight descriptor is NULL");
    const nbi_format_traits *t = nbi_traits(d->format);
    if (!t) return nbi_fail(ctx, NB_ERR_UNSUPPORTED, "unknown weight format %d", (int)d->format);
    if (d->layout != NB_LAYOUT_CHECKPOINT && d->layout != NB_LAYOUT_PACKED)
        return nbi_fail(ctx, NB_ERR_INVALID_ARGUMENT, "unknown weight layout %d", (int)d->layout);
    if (want && d->layout != want)
        return nbi_fail(ctx, NB_ERR_INVALID_ARGUMENT, "weight layout is %s, this call needs %s",
                        d->layout == NB_LAYOUT_PACKED ? "packed" : "checkpoint",
                        want == NB_LAYOUT_PACKED ? "packed (use nb_pack)" : "checkpoint");
    if (d->n <= 0 || d->k <= 0)
        return nbi_fail(ctx, NB_ERR_BAD_SHAPE, "weight shape [%lld, %lld]: n and k must be positive",
                        (long long)d->n, (long long)d->k);
    if (d->n > NB_MAX_DIM || d->k > NB_MAX_DIM)
        return nbi_fail(ctx, NB_ERR_OVERFLOW, "weight shape [%lld, %lld]: dimensions above 2^31 are not supported",
                        (long long)d->n, (long long)d->k);
    if ((double)d->n * (double)d->k > (double)((int64_t)1 << 50))
        return nbi_fail(ctx, NB_ERR_OVERFLOW, "weight shape [%lld, %lld]: more than 2^50 elements",
                        (long long)d->n, (long long)d->k);
    if (t->groups == t->group) { /* one group, no other choice */
        if (d->group_size != t->group)
            return nbi_fail(ctx, NB_ERR_UNSUPPORTED, "%s needs group_size %d, got %d", t->name, t->group,
                            (int)d->group_size);
    } else if (!nbi_group_ok(t, d->group_size, d->k)) {
        char groups[160];
        nbi_groups_text(t, groups, sizeof groups);
        return nbi_fail(ctx, NB_ERR_UNSUPPORTED, "%s takes group_size %s; got %d (k = %lld)", t->name, groups,
                        (int)d->group_size, (long long)d->k);
    }
    if (t->scale_types == NB_SCALE_BIT(t->scale_type)) { /* one scale type */
        if (d->scale_type != t->scale_type)
            return nbi_fail(ctx, NB_ERR_UNSUPPORTED, "%s needs scale type %d, got %d", t->name, (int)t->scale_type,
                            (int)d->scale_type);
    } else if (d->scale_type < 0 || d->scale_type > 30 || !nbi_scale_bytes(d->scale_type) ||
               !(t->scale_types & NB_SCALE_BIT(d->scale_type))) {
        char types[96];
        size_t used = 0;
        types[0] = 0;
        for (int st = 1; st < 31 && used < sizeof types; st++)
            if (t->scale_types & NB_SCALE_BIT(st))
                used += (size_t)snprintf(types + used, sizeof types - used, "%s%s (%d)", used ? " or " : "",
                                         nbi_scale_name((nb_scale_type)st), st);
        return nbi_fail(ctx, NB_ERR_UNSUPPORTED, "%s takes scale type %s; got %d", t->name, types,
                        (int)d->scale_type);
    }
    if (d->method != NB_QUANT_RTN && d->method != NB_QUANT_MSE && d->method != NB_QUANT_HQQ)
        return nbi_fail(ctx, NB_ERR_INVALID_ARGUMENT, "quantization method %d is not %d (rtn), %d (mse) or %d (hqq)",
                        (int)d->method, NB_QUANT_RTN, NB_QUANT_MSE, NB_QUANT_HQQ);
    if (d->k % d->group_size)
        return nbi_fail(ctx, NB_ERR_BAD_SHAPE, "k = %lld is not a multiple of the %s group size %d",
                        (long long)d->k, t->name, (int)d->group_size);
    return NB_OK;
}

nb_status nb_weight_desc_validate(const nb_weight_desc *d) { return nbi_check_desc(NULL, d, 0); }

int nbi_group_ok(const nbi_format_traits *t, int64_t group, int64_t k) {
    if (group <= 0) return 0;
    if (group == k && (t->groups & NB_GROUPS_PER_CHANNEL)) return 1;
    /* a power of two of the set: the bit for group g is g itself (NB_GROUPS_16 == 16) */
    return group <= 4096 && (group & (group - 1)) == 0 && (t->groups & group);
}

void nbi_groups_text(const nbi_format_traits *t, char *buf, size_t len) {
    size_t used = 0;
    buf[0] = 0;
    for (int g = 16; g <= 4096 && used < len; g *= 2)
        if (t->groups & g) used += (size_t)snprintf(buf + used, len - used, "%s%d", used ? ", " : "", g);
    if ((t->groups & NB_GROUPS_PER_CHANNEL) && used < len)
        snprintf(buf + used, len - used, "%sk (one group per row)", used ? " or " : "");
}

/* The sizes of a checked descriptor (both versions). */
static nb_status weight_sizes(const nb_weight_desc *d, nb_weight_sizes_v2 *out, const char *fn) {
    const nbi_format_traits *t = nbi_traits(d->format);
    /* n, k <= 2^31 and n*k <= 2^50 (checked), so none of these overflow 64 bits. */
    uint64_t nk = (uint64_t)d->n * (uint64_t)d->k;
    uint64_t chunks = (uint64_t)((d->n + 15) / 16) * (uint64_t)((d->k + NBI_CHUNK_K - 1) / NBI_CHUNK_K);
    uint64_t packed = t->kernels ? chunks * nbi_packed_chunk_bytes(d) : 0; /* (no packed layout without kernels) */
    if (packed > (uint64_t)SIZE_MAX || nk > (uint64_t)SIZE_MAX)
        return nbi_fail(NULL, NB_ERR_OVERFLOW, "%sweight [%lld, %lld] does not fit this address space", fn,
                        (long long)d->n, (long long)d->k);
    const uint64_t groups = nk / (uint64_t)d->group_size;
    memset(out, 0, sizeof *out);
    out->codes_bytes = (size_t)((nk * (uint64_t)t->element_bits + 7) / 8);
    out->scales_bytes = (size_t)(groups * (uint64_t)nbi_scale_bytes(d->scale_type));
    out->zeros_bytes = (size_t)(groups * (uint64_t)nbi_zero_bytes(t, d->scale_type));
    out->packed_bytes = (size_t)packed;
    out->dense_elements = (size_t)nk;
    return NB_OK;
}

nb_status nb_weight_get_sizes(const nb_weight_desc *d, nb_weight_sizes *out) {
    nb_status st = nbi_check_desc(NULL, d, 0);
    if (st) return st;
    if (!out) return nbi_fail(NULL, NB_ERR_NULL_POINTER, "nb_weight_get_sizes: out is NULL");
    const nbi_format_traits *t = nbi_traits(d->format);
    if (t->zero_point != NB_ZERO_NONE)
        return nbi_fail(NULL, NB_ERR_UNSUPPORTED, "nb_weight_get_sizes: %s weights carry zero points; use "
                        "nb_weight_get_sizes_v2", t->name);
    nb_weight_sizes_v2 v2;
    if ((st = weight_sizes(d, &v2, ""))) return st;
    out->codes_bytes = v2.codes_bytes;
    out->scales_bytes = v2.scales_bytes;
    out->packed_bytes = v2.packed_bytes;
    out->dense_elements = v2.dense_elements;
    return NB_OK;
}

nb_status nb_weight_get_sizes_v2(const nb_weight_desc *d, nb_weight_sizes_v2 *out) {
    nb_status st = nbi_check_desc(NULL, d, 0);
    if (st) return st;
    if (!out) return nbi_fail(NULL, NB_ERR_NULL_POINTER, "nb_weight_get_sizes_v2: out is NULL");
    return weight_sizes(d, out, "nb_weight_get_sizes_v2: ");
}

nb_status nbi_packed_size(nb_context *ctx, const nb_weight_desc *d, size_t packed_bytes, nb_weight_sizes_v2 *sz,
                          const char *fn) {
    const nbi_format_traits *t = nbi_traits(d->format);
    if (!t->kernels)
        return nbi_fail(ctx, NB_ERR_UNSUPPORTED, "%s: %s has no packed layout (no GPU kernels serve it)", fn, t->name);
    nb_status st = nb_weight_get_sizes_v2(d, sz);
    if (st) return nbi_fail(ctx, st, "%s: %s", fn, nb_last_error());
    if (packed_bytes < sz->packed_bytes)
        return nbi_fail(ctx, NB_ERR_BUFFER_TOO_SMALL, "%s: packed buffer has %zu bytes, needs %zu", fn, packed_bytes,
                        sz->packed_bytes);
    return NB_OK;
}

nb_status nb_gemm_desc_init(nb_gemm_desc *g, const nb_weight_desc *w, int64_t m, nb_dtype act, nb_dtype out) {
    if (!g || !w) return nbi_fail(NULL, NB_ERR_NULL_POINTER, "nb_gemm_desc_init: NULL argument");
    memset(g, 0, sizeof *g);
    g->m = m;
    g->weight = *w;
    g->act_dtype = act;
    g->out_dtype = out;
    return nbi_check_gemm(NULL, g, 0, true);
}

nb_status nbi_check_gemm(nb_context *ctx, const nb_gemm_desc *g, nb_layout want, bool host) {
    if (!g) return nbi_fail(ctx, NB_ERR_NULL_POINTER, "gemm descriptor is NULL");
    nb_status st = nbi_check_desc(ctx, &g->weight, want);
    if (st) return st;
    if (g->m <= 0 || g->m > NB_MAX_DIM)
        return nbi_fail(ctx, NB_ERR_BAD_SHAPE, "gemm: m = %lld must be in [1, 2^31]", (long long)g->m);
    if (!nbi_dtype_size(g->act_dtype) || !nbi_dtype_size(g->out_dtype))
        return nbi_fail(ctx, NB_ERR_UNSUPPORTED, "gemm: unknown dtype (act %d, out %d)", (int)g->act_dtype,
                        (int)g->out_dtype);
    if (!host && (g->act_dtype == NB_DTYPE_F32 || g->out_dtype != g->act_dtype))
        return nbi_fail(ctx, NB_ERR_UNSUPPORTED, "gemm on the device: act_dtype must be BF16 or F16 and out_dtype "
                        "the same (got %s, %s)", nbi_dtype_name(g->act_dtype), nbi_dtype_name(g->out_dtype));
    if (g->lda < 0 || (g->lda && g->lda < g->weight.k))
        return nbi_fail(ctx, NB_ERR_BAD_SHAPE, "gemm: lda = %lld is smaller than k = %lld", (long long)g->lda,
                        (long long)g->weight.k);
    if (g->ldc < 0 || (g->ldc && g->ldc < g->weight.n))
        return nbi_fail(ctx, NB_ERR_BAD_SHAPE, "gemm: ldc = %lld is smaller than n = %lld", (long long)g->ldc,
                        (long long)g->weight.n);
    int64_t lda = g->lda ? g->lda : g->weight.k, ldc = g->ldc ? g->ldc : g->weight.n;
    if ((double)g->m * (double)lda > (double)((int64_t)1 << 50) ||
        (double)g->m * (double)ldc > (double)((int64_t)1 << 50))
        return nbi_fail(ctx, NB_ERR_OVERFLOW, "gemm: m * lda or m * ldc exceeds 2^50 elements");
    return NB_OK;
}

/* ---------------------------------------------------- reference GEMM */

static nb_status gemm_host_common(nb_context *ctx, const nb_gemm_desc *g, const void *x, const nb_weight_data *wd,
                                  const void *bias, void *y, int f64, const char *fn) {
    const nb_weight_desc *d = &g->weight;
    const int64_t m = g->m, n = d->n, k = d->k;
    const int64_t lda = g->lda ? g->lda : k, ldc = g->ldc ? g->ldc : n;
    float *w = (float *)malloc(sizeof(float) * (size_t)k);
    float *xf = (float *)malloc(sizeof(float) * (size_t)(m * k));
    if (!w || !xf) {
        free(w);
        free(xf);
        return nbi_fail(ctx, NB_ERR_OUT_OF_MEMORY, "%s: out of host memory", fn);
    }
    for (int64_t i = 0; i < m; i++)
        for (int64_t j = 0; j < k; j++) xf[i * k + j] = nbi_load(g->act_dtype, x, (size_t)(i * lda + j));
    for (int64_t r = 0; r < n; r++) {
        nbi_dequant_row(d, wd, r, w); /* one row of W, dequantized with the reference */
        float b = bias ? nbi_load(g->out_dtype, bias, (size_t)r) : 0.0f;
        for (int64_t i = 0; i < m; i++) {
            const float *xi = xf + i * k;
            if (f64) {
                double acc = 0.0;
                for (int64_t j = 0; j < k; j++) acc += (double)xi[j] * (double)w[j];
                ((double *)y)[i * ldc + r] = acc + (double)b;
            } else {
                float acc = 0.0f;
                for (int64_t j = 0; j < k; j++) acc += xi[j] * w[j];
                nbi_store(g->out_dtype, y, (size_t)(i * ldc + r), acc + b);
            }
        }
    }
    free(w);
    free(xf);
    return NB_OK;
}

/* The first version: (codes, scales), formats without zero points. */
static nb_status gemm_host_v1(nb_context *ctx, const nb_gemm_desc *g, const void *x, const uint8_t *codes,
                              const uint8_t *scales, const void *bias, void *y, int f64, const char *fn) {
    if (!ctx) return nbi_fail(NULL, NB_ERR_NULL_POINTER, "%s: ctx is NULL", fn);
    nb_status st = nbi_check_gemm(ctx, g, NB_LAYOUT_CHECKPOINT, true);
    if (st) return st;
    if (!x || !codes || !scales || !y)
        return nbi_fail(ctx, NB_ERR_NULL_POINTER, "%s: x, codes, scales and y must not be NULL", fn);
    const nbi_format_traits *t = nbi_traits(g->weight.format);
    if (t->zero_point != NB_ZERO_NONE)
        return nbi_fail(ctx, NB_ERR_UNSUPPORTED, "%s: %s weights carry zero points; use %s_v2", fn, t->name, fn);
    const nb_weight_data wd = {.codes = codes, .scales = scales};
    return gemm_host_common(ctx, g, x, &wd, bias, y, f64, fn);
}

static nb_status gemm_host_v2(nb_context *ctx, const nb_gemm_desc *g, const void *x, const nb_weight_data *w,
                              const void *bias, void *y, int f64, const char *fn) {
    if (!ctx) return nbi_fail(NULL, NB_ERR_NULL_POINTER, "%s: ctx is NULL", fn);
    nb_status st = nbi_check_gemm(ctx, g, NB_LAYOUT_CHECKPOINT, true);
    if (st) return st;
    if (!x || !w || !y) return nbi_fail(ctx, NB_ERR_NULL_POINTER, "%s: x, w and y must not be NULL", fn);
    for (int i = 0; i < 4; i++)
        if (w->reserved[i])
            return nbi_fail(ctx, NB_ERR_INVALID_ARGUMENT, "%s: the buffers' reserved pointers must be NULL", fn);
    const nbi_format_traits *t = nbi_traits(g->weight.format);
    if (!w->codes || !w->scales)
        return nbi_fail(ctx, NB_ERR_NULL_POINTER, "%s: codes and scales must not be NULL", fn);
    if ((t->zero_point != NB_ZERO_NONE) != (w->zeros != NULL))
        return nbi_fail(ctx, w->zeros ? NB_ERR_INVALID_ARGUMENT : NB_ERR_NULL_POINTER,
                        "%s: %s weights %s: zeros must %sbe NULL", fn, t->name,
                        w->zeros ? "have no zero points" : "carry zero points", w->zeros ? "" : "not ");
    return gemm_host_common(ctx, g, x, w, bias, y, f64, fn);
}

nb_status nb_gemm_host(nb_context *ctx, const nb_gemm_desc *g, const void *x, const uint8_t *codes,
                       const uint8_t *scales, const void *bias, void *y) {
    return gemm_host_v1(ctx, g, x, codes, scales, bias, y, 0, "nb_gemm_host");
}

nb_status nb_gemm_host_f64(nb_context *ctx, const nb_gemm_desc *g, const void *x, const uint8_t *codes,
                           const uint8_t *scales, const void *bias, double *y) {
    return gemm_host_v1(ctx, g, x, codes, scales, bias, y, 1, "nb_gemm_host_f64");
}

nb_status nb_gemm_host_v2(nb_context *ctx, const nb_gemm_desc *g, const void *x, const nb_weight_data *w,
                          const void *bias, void *y) {
    return gemm_host_v2(ctx, g, x, w, bias, y, 0, "nb_gemm_host_v2");
}

nb_status nb_gemm_host_f64_v2(nb_context *ctx, const nb_gemm_desc *g, const void *x, const nb_weight_data *w,
                              const void *bias, double *y) {
    return gemm_host_v2(ctx, g, x, w, bias, y, 1, "nb_gemm_host_f64_v2");
}

/* ------------------------------------------------ scalar conversions */

float nb_e2m1_to_float(uint8_t code) { return nbi_e2m1(code); }
float nb_element_to_float(nb_element_type type, uint8_t code) { return nbi_element(type, code); }
float nb_e4m3_to_float(uint8_t byte) { return nbi_e4m3(byte); }
float nb_e8m0_to_float(uint8_t byte) { return nbi_e8m0(byte); }
uint8_t nb_float_to_e2m1(float x) { return nbi_to_e2m1(x); }
uint8_t nb_float_to_e4m3(float x) { return nbi_to_e4m3(x); }
