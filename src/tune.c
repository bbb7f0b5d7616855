/* tune.c - the tuning table: kernel configurations measured ahead of time
 * (`nibble tune`) that override the planner's heuristic per problem.
 *
 * An entry is keyed by (GPU name, format, activation dtype, n, k, m bucket)
 * and holds one nb_gemm_config plus the microseconds it was measured at.
 * nb_gemm (device.c) looks the problem up and hands the entry to the planner
 * (plan.c) as its request; whether a configuration is valid is the
 * planner's to say (nbi_config_check).  This file keeps the table and its
 * file, nothing else.
 *
 * The cache file is JSON (cJSON, optional: without it load and save return
 * NB_ERR_UNSUPPORTED and everything else works):
 *
 *   {"version": 1, "library": "0.1.0", "m_buckets": ["1", "2", "3-4", ...],
 *    "entries": [
 *     {"gpu": "NVIDIA H100 80GB HBM3", "format": "nvfp4", "act": "bf16",
 *      "k": 8192, "n": 57344, "m": "1", "m_tuned": 1, "path": "decode",
 *      "kw": 4, "splits": 1, "variant": "plain", "us": 101.3},
 *     {..., "m": "513-1024", "path": "tc", "bn": 256, "raster": 16, "splits": 1, ...},
 *     {..., "m": "513-1024", "path": "mma", "bn": 128, "raster": 16, "stages": 3, ...}]}
 *
 * It is untrusted input: every field is type- and range-checked, the fields
 * of the other path must be absent, duplicate keys are refused, and one bad
 * entry rejects the file (the table is left as it was).  Unknown keys are
 * ignored (room for later versions); a later entry with the same key as an
 * earlier one replaces it.  Test: tests/test_tune.c; fuzz: tests/fuzz_config.c. */
#define _POSIX_C_SOURCE 200809L
#include "internal.h"

#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#ifdef NB_HAVE_CJSON
#include <cjson/cJSON.h>
#endif

/* ------------------------------------------------------------- m buckets */

/* Powers of two: tile widths and the decode kernel's 8-token tiles fall on
 * these boundaries, and the cost of a configuration changes slowly within
 * one. */
#define NBUCKETS 14
static const int64_t k_bucket_lo[NBUCKETS] = {1, 2, 3, 5, 9, 17, 33, 65, 129, 257, 513, 1025, 2049, 4097};
static int bucket_of(int64_t m) {
    int b = 0;
    while (b + 1 < NBUCKETS && m >= k_bucket_lo[b + 1]) b++;
    return b;
}

static int64_t bucket_hi(int b) { return b + 1 < NBUCKETS ? k_bucket_lo[b + 1] - 1 : INT64_MAX; }

nb_status nb_tuning_m_bucket(int64_t m, int64_t *lo, int64_t *hi) {
    if (!lo || !hi) return nbi_fail(NULL, NB_ERR_NULL_POINTER, "nb_tuning_m_bucket: lo and hi must not be NULL");
    if (m < 1) return nbi_fail(NULL, NB_ERR_INVALID_ARGUMENT, "nb_tuning_m_bucket: m = %lld must be >= 1", (long long)m);
    const int b = bucket_of(m);
    *lo = k_bucket_lo[b];
    *hi = bucket_hi(b);
    return NB_OK;
}

int64_t nbi_tune_bucket_lo(int64_t m) { return k_bucket_lo[bucket_of(m)]; }

int nbi_tune_workspace_ms(int64_t *ms, int max) {
    int n = 0;
    for (int64_t m = 1; m <= 32 && n < max; m++) ms[n++] = m; /* the decode kernels' choice depends on m itself */
    for (int b = bucket_of(33); b < NBUCKETS && n < max; b++) ms[n++] = k_bucket_lo[b];
    return n;
}

/* ----------------------------------------------------------------- table */

typedef struct entry {
    int gpu;         /* index into names */
    int fmt, act;    /* nb_format, nb_dtype */
    int64_t n, k;
    int bucket;
    int64_t m_tuned; /* the m it was measured at, 0 = not said */
    nb_gemm_config cfg;
    double us;
} entry;

struct nbi_tune_table {
    char **names;
    size_t nnames;
    entry *e;
    size_t count, cap;
};

#define MAX_ENTRIES 100000           /* far more than a model's layers x formats x buckets */
#define MAX_FILE_BYTES (32u << 20)   /* about 200 bytes per entry */

void nbi_tune_table_free(nbi_tune_table *t) {
    if (!t) return;
    for (size_t i = 0; i < t->nnames; i++) free(t->names[i]);
    free(t->names);
    free(t->e);
    free(t);
}

void nbi_tune_free(nb_context *ctx) {
    nbi_tune_table_free(ctx->tune);
    ctx->tune = NULL;
}

static int find_name(const nbi_tune_table *t, const char *name) {
    for (size_t i = 0; t && i < t->nnames; i++)
        if (!strcmp(t->names[i], name)) return (int)i;
    return -1;
}

/* Index of `name`, added when new; -1 when out of memory. */
static int add_name(nbi_tune_table *t, const char *name) {
    int i = find_name(t, name);
    if (i >= 0) return i;
    char *copy = malloc(strlen(name) + 1);
    char **grown = realloc(t->names, (t->nnames + 1) * sizeof *grown);
    if (!copy || !grown) {
        free(copy);
        if (grown) t->names = grown;
        return -1;
    }
    strcpy(copy, name);
    t->names = grown;
    t->names[t->nnames] = copy;
    return (int)t->nnames++;
}

static int same_key(const entry *a, const entry *b) {
    return a->gpu == b->gpu && a->fmt == b->fmt && a->act == b->act && a->n == b->n && a->k == b->k &&
           a->bucket == b->bucket;
}

/* Insert or replace; 0 when out of memory. */
static int put(nbi_tune_table *t, const entry *e) {
    for (size_t i = 0; i < t->count; i++)
        if (same_key(&t->e[i], e)) {
            t->e[i] = *e;
            return 1;
        }
    if (t->count == t->cap) {
        size_t cap = t->cap ? 2 * t->cap : 64;
        entry *grown = realloc(t->e, cap * sizeof *grown);
        if (!grown) return 0;
        t->e = grown;
        t->cap = cap;
    }
    t->e[t->count++] = *e;
    return 1;
}

static const entry *find(const nbi_tune_table *t, const entry *key) {
    for (size_t i = 0; t && i < t->count; i++)
        if (same_key(&t->e[i], key)) return &t->e[i];
    return NULL;
}

int nbi_tune_lookup(const nb_context *ctx, int fmt, int act, int64_t n, int64_t k, int64_t m, nb_gemm_config *out) {
    if (!ctx->tune || m < 1) return 0;
    const entry key = {.gpu = find_name(ctx->tune, ctx->info.name), .fmt = fmt, .act = act, .n = n, .k = k,
                       .bucket = bucket_of(m)};
    const entry *e = key.gpu >= 0 ? find(ctx->tune, &key) : NULL;
    if (e) *out = e->cfg;
    return e != NULL;
}

/* ----------------------------------------------------- table operations */

static nb_status check_us(nb_context *ctx, double us, const char *fn) {
    if (!(us >= 0.0 && us <= 1e12))
        return nbi_fail(ctx, NB_ERR_INVALID_ARGUMENT, "%s: us = %g must be in [0, 1e12] microseconds", fn, us);
    return NB_OK;
}

nb_status nb_context_set_tuning(nb_context *ctx, const nb_gemm_desc *g, const nb_gemm_config *cfg, double us) {
    if (!ctx) return nbi_fail(NULL, NB_ERR_NULL_POINTER, "nb_context_set_tuning: ctx is NULL");
    nb_status st = nbi_check_gemm(ctx, g, 0, false);
    if (st) return st;
    if (!nbi_traits(g->weight.format)->kernels)
        return nbi_fail(ctx, NB_ERR_UNSUPPORTED, "nb_context_set_tuning: no GPU kernel serves %s weights",
                        nbi_traits(g->weight.format)->name);
    entry e;
    memset(&e, 0, sizeof e);
    e.fmt = g->weight.format;
    e.act = g->act_dtype;
    e.n = g->weight.n;
    e.k = g->weight.k;
    e.bucket = bucket_of(g->m);
    e.m_tuned = g->m;
    if (!cfg) {
        e.gpu = find_name(ctx->tune, ctx->info.name);
        nbi_tune_table *t = ctx->tune;
        for (size_t i = 0; t && e.gpu >= 0 && i < t->count; i++)
            if (same_key(&t->e[i], &e)) {
                t->e[i] = t->e[--t->count];
                break;
            }
        return NB_OK;
    }
    char why[200];
    if (!nbi_config_check(cfg, k_bucket_lo[e.bucket], 1, why, sizeof why))
        return nbi_fail(ctx, NB_ERR_INVALID_ARGUMENT, "nb_context_set_tuning: %s", why);
    if ((st = check_us(ctx, us, "nb_context_set_tuning"))) return st;
    if (!ctx->tune && !(ctx->tune = calloc(1, sizeof *ctx->tune)))
        return nbi_fail(ctx, NB_ERR_OUT_OF_MEMORY, "nb_context_set_tuning: out of host memory");
    e.cfg = *cfg;
    if (e.cfg.path != NB_GEMM_PATH_DECODE && !e.cfg.splits) e.cfg.splits = 1;
    e.us = us;
    if ((e.gpu = add_name(ctx->tune, ctx->info.name)) < 0 || !put(ctx->tune, &e))
        return nbi_fail(ctx, NB_ERR_OUT_OF_MEMORY, "nb_context_set_tuning: out of host memory");
    return NB_OK;
}

nb_status nb_context_tuning_count(const nb_context *ctx, size_t *entries, size_t *for_device) {
    if (!ctx || !entries || !for_device)
        return nbi_fail(NULL, NB_ERR_NULL_POINTER, "nb_context_tuning_count: NULL argument");
    *entries = *for_device = 0;
    if (!ctx->tune) return NB_OK;
    const int me = find_name(ctx->tune, ctx->info.name);
    *entries = ctx->tune->count;
    for (size_t i = 0; i < ctx->tune->count; i++) *for_device += ctx->tune->e[i].gpu == me;
    return NB_OK;
}

/* -------------------------------------------------------------- the file */

#ifdef NB_HAVE_CJSON

static const char *const k_path_name[4] = {"", "decode", "tc", "mma"};
static const char *const k_variant_name[2] = {"plain", "staged"};
static const char *const k_bucket_name[NBUCKETS] = {"1",       "2",        "3-4",       "5-8",       "9-16",
                                                    "17-32",   "33-64",    "65-128",    "129-256",   "257-512",
                                                    "513-1024", "1025-2048", "2049-4096", "4097+"};

enum { F_GPU, F_FORMAT, F_ACT, F_N, F_K, F_M, F_M_TUNED, F_PATH, F_KW, F_SPLITS, F_VARIANT, F_RPW, F_BN, F_RASTER,
       F_STAGES, F_WARPS, F_STREAM_K, F_US, NFIELDS };
static const char *const k_field[NFIELDS] = {"gpu",    "format", "act",     "n",   "k",  "m",      "m_tuned",
                                             "path",   "kw",     "splits",  "variant", "rpw", "bn", "raster",
                                             "stages", "warps",  "stream_k", "us"};

/* A string field that must be one of names[0..count) (NULL = any name of
 * 1..255 bytes); its index, or -1 with the reason in `why`. */
static int str_field(const cJSON *v, int f, const char *const *names, int count, char *why, size_t wn) {
    if (!cJSON_IsString(v) || !v->valuestring)
        return snprintf(why, wn, "\"%s\" must be a string", k_field[f]), -1;
    const char *s = v->valuestring;
    if (!names) {
        const size_t len = strlen(s);
        if (len == 0 || len > 255) return snprintf(why, wn, "\"%s\" must have 1 to 255 bytes (has %zu)", k_field[f], len), -1;
        return 0;
    }
    for (int i = 0; i < count; i++)
        if (names[i][0] && !strcmp(s, names[i])) return i;
    char list[256] = "";
    for (int i = 0; i < count; i++)
        if (names[i][0])
            snprintf(list + strlen(list), sizeof list - strlen(list), "%s\"%s\"", list[0] ? ", " : "", names[i]);
    return snprintf(why, wn, "\"%s\" is \"%.60s\", not one of %s", k_field[f], s, list), -1;
}

/* An integer field in [lo, hi] (checked as a double first: JSON numbers may
 * be anything, 1e300 included). */
static int int_field(const cJSON *v, int f, int64_t lo, int64_t hi, int64_t *out, char *why, size_t wn) {
    if (!cJSON_IsNumber(v)) return snprintf(why, wn, "\"%s\" must be a number", k_field[f]), 0;
    const double d = v->valuedouble;
    if (!(d >= (double)lo && d <= (double)hi) || d != floor(d))
        return snprintf(why, wn, "\"%s\" = %.17g is not an integer in [%lld, %lld]", k_field[f], d, (long long)lo,
                        (long long)hi), 0;
    *out = (int64_t)d;
    return 1;
}

/* One entry of the file into *e (its gpu still to be added); 0 with the
 * reason in `why`. */
static int parse_entry(const cJSON *o, entry *e, const char **gpu, char *why, size_t wn) {
    if (!cJSON_IsObject(o)) return snprintf(why, wn, "is not an object"), 0;
    const cJSON *f[NFIELDS] = {0};
    for (const cJSON *c = o->child; c; c = c->next)
        for (int i = 0; i < NFIELDS; i++)
            if (c->string && !strcmp(c->string, k_field[i])) {
                if (f[i]) return snprintf(why, wn, "\"%s\" appears twice", k_field[i]), 0;
                f[i] = c;
            }
    static const int required[] = {F_GPU, F_FORMAT, F_ACT, F_N, F_K, F_M, F_PATH, F_US};
    for (size_t i = 0; i < sizeof required / sizeof required[0]; i++)
        if (!f[required[i]]) return snprintf(why, wn, "\"%s\" is missing", k_field[required[i]]), 0;
    memset(e, 0, sizeof *e);
    /* the formats the kernels serve: an entry for another can never be used */
    const char *formats[NBI_FORMAT_COUNT];
    int fidx[NBI_FORMAT_COUNT], nf = 0;
    for (int i = 0; i < NBI_FORMAT_COUNT; i++)
        if (nbi_traits_at(i)->kernels) fidx[nf] = i, formats[nf++] = nbi_traits_at(i)->name;
    static const char *const acts[4] = {"", "", "f16", "bf16"};
    int64_t v;
    if (str_field(f[F_GPU], F_GPU, NULL, 0, why, wn) < 0) return 0;
    *gpu = f[F_GPU]->valuestring;
    const int fi = str_field(f[F_FORMAT], F_FORMAT, formats, nf, why, wn);
    if (fi < 0) return 0;
    e->fmt = nbi_traits_at(fidx[fi])->format;
    if ((e->act = str_field(f[F_ACT], F_ACT, acts, 4, why, wn)) < 0) return 0;
    if ((e->bucket = str_field(f[F_M], F_M, k_bucket_name, NBUCKETS, why, wn)) < 0) return 0;
    if (!int_field(f[F_N], F_N, 1, (int64_t)1 << 31, &e->n, why, wn)) return 0;
    if (!int_field(f[F_K], F_K, 1, (int64_t)1 << 31, &e->k, why, wn)) return 0;
    const int group = nbi_traits((nb_format)e->fmt)->group;
    if (e->k % group) return snprintf(why, wn, "k = %lld is not a multiple of %d", (long long)e->k, group), 0;
    if (f[F_M_TUNED] &&
        !int_field(f[F_M_TUNED], F_M_TUNED, k_bucket_lo[e->bucket], bucket_hi(e->bucket), &e->m_tuned, why, wn))
        return 0;
    const int path = str_field(f[F_PATH], F_PATH, k_path_name, 4, why, wn);
    if (path < 0) return 0;
    e->cfg.path = path;
    /* the path's own fields are required, the other path's absent */
    /* ("splits" is optional for tc and mma: caches from before the tc k split omit it) */
    static const int decode_f[] = {F_KW, F_SPLITS, F_VARIANT}, tc_f[] = {F_BN, F_RASTER}, decode_only[] = {F_KW, F_VARIANT};
    const int *mine = path == NB_GEMM_PATH_DECODE ? decode_f : tc_f, *other = path == NB_GEMM_PATH_DECODE ? tc_f : decode_only;
    const int nmine = path == NB_GEMM_PATH_DECODE ? 3 : 2, nother = 2;
    for (int i = 0; i < nmine; i++)
        if (!f[mine[i]]) return snprintf(why, wn, "\"%s\" is missing (path %s)", k_field[mine[i]], k_path_name[path]), 0;
    for (int i = 0; i < nother; i++)
        if (f[other[i]]) return snprintf(why, wn, "\"%s\" is not a field of path %s", k_field[other[i]], k_path_name[path]), 0;
    if (path != NB_GEMM_PATH_DECODE && f[F_RPW])
        return snprintf(why, wn, "\"rpw\" is not a field of path %s", k_path_name[path]), 0;
    if (path != NB_GEMM_PATH_MMA && f[F_STAGES])
        return snprintf(why, wn, "\"stages\" is not a field of path %s", k_path_name[path]), 0;
    if (path != NB_GEMM_PATH_DECODE && f[F_WARPS])
        return snprintf(why, wn, "\"warps\" is not a field of path %s", k_path_name[path]), 0;
    if (path != NB_GEMM_PATH_TENSOR_CORE && f[F_STREAM_K])
        return snprintf(why, wn, "\"stream_k\" is not a field of path %s", k_path_name[path]), 0;
    if (path == NB_GEMM_PATH_DECODE) {
        if (!int_field(f[F_KW], F_KW, 0, INT32_MAX, &v, why, wn)) return 0;
        e->cfg.kw = (int32_t)v;
        if (!int_field(f[F_SPLITS], F_SPLITS, 0, INT32_MAX, &v, why, wn)) return 0;
        e->cfg.splits = (int32_t)v;
        if ((e->cfg.variant = str_field(f[F_VARIANT], F_VARIANT, k_variant_name, 2, why, wn)) < 0) return 0;
        if (e->cfg.variant == 1 && !f[F_RPW]) return snprintf(why, wn, "\"rpw\" is missing (variant staged)"), 0;
        if (f[F_RPW]) {
            if (!int_field(f[F_RPW], F_RPW, 0, INT32_MAX, &v, why, wn)) return 0;
            e->cfg.rpw = (int32_t)v;
        }
        if (f[F_WARPS]) { /* optional: absent (caches from before the field) is the planner's choice */
            if (!int_field(f[F_WARPS], F_WARPS, 0, INT32_MAX, &v, why, wn)) return 0;
            e->cfg.warps = (int32_t)v;
        }
    } else {
        if (!int_field(f[F_BN], F_BN, 0, INT32_MAX, &v, why, wn)) return 0;
        e->cfg.bn = (int32_t)v;
        if (!int_field(f[F_RASTER], F_RASTER, 0, INT32_MAX, &v, why, wn)) return 0;
        e->cfg.raster = (int32_t)v;
        if (f[F_SPLITS]) {
            if (!int_field(f[F_SPLITS], F_SPLITS, 0, INT32_MAX, &v, why, wn)) return 0;
            e->cfg.splits = (int32_t)v;
        }
        if (f[F_STAGES]) { /* optional: 0 or absent is the deepest that fits */
            if (!int_field(f[F_STAGES], F_STAGES, 0, INT32_MAX, &v, why, wn)) return 0;
            e->cfg.stages = (int32_t)v;
        }
        if (f[F_STREAM_K]) { /* optional: absent (caches from before the field) is the planner's choice */
            if (!int_field(f[F_STREAM_K], F_STREAM_K, -1, 1, &v, why, wn)) return 0;
            e->cfg.stream_k = (int32_t)v;
        }
    }
    if (!nbi_config_check(&e->cfg, k_bucket_lo[e->bucket], 1, why, wn)) return 0;
    if (e->cfg.path != NB_GEMM_PATH_DECODE && !e->cfg.splits) e->cfg.splits = 1;
    if (!cJSON_IsNumber(f[F_US]) || !(f[F_US]->valuedouble >= 0.0 && f[F_US]->valuedouble <= 1e12))
        return snprintf(why, wn, "\"us\" must be a number in [0, 1e12]"), 0;
    e->us = f[F_US]->valuedouble;
    return 1;
}

/* Line and column (1-based) of byte `off` of text. */
static void line_col(const char *text, size_t off, size_t *line, size_t *col) {
    *line = 1, *col = 1;
    for (size_t i = 0; i < off; i++) {
        if (text[i] == '\n') ++*line, *col = 1;
        else ++*col;
    }
}

nb_status nbi_tune_parse(const char *text, size_t len, const char *name, nbi_tune_table **out, char *err) {
    *out = NULL;
    const char *end = NULL;
    cJSON *root = cJSON_ParseWithLengthOpts(text, len, &end, 0);
    if (!root) {
        size_t off = end && end >= text && end <= text + len ? (size_t)(end - text) : len, line, col;
        line_col(text, off, &line, &col);
        snprintf(err, NB_ERRBUF, "%s: not valid JSON (line %zu, column %zu%s)", name, line, col,
                 off + 1 >= len ? ": the text ends early" : "");
        return NB_ERR_CORRUPT;
    }
    nb_status st = NB_ERR_CORRUPT;
    nbi_tune_table *t = NULL;
    while (end && end < text + len && (*end == ' ' || *end == '\t' || *end == '\n' || *end == '\r')) end++;
    const cJSON *ver = cJSON_GetObjectItemCaseSensitive(root, "version");
    const cJSON *ents = cJSON_GetObjectItemCaseSensitive(root, "entries");
    int twice = 0;
    for (const cJSON *c = cJSON_IsObject(root) ? root->child : NULL; c; c = c->next)
        twice += c->string && ((c != ver && !strcmp(c->string, "version")) || (c != ents && !strcmp(c->string, "entries")));
    if (end && end < text + len) {
        snprintf(err, NB_ERRBUF, "%s: text after the JSON value (byte %zu)", name, (size_t)(end - text));
    } else if (!cJSON_IsObject(root)) {
        snprintf(err, NB_ERRBUF, "%s: the top level must be an object with \"version\" and \"entries\"", name);
    } else if (twice) {
        snprintf(err, NB_ERRBUF, "%s: \"version\" or \"entries\" appears twice", name);
    } else if (!ver || !cJSON_IsNumber(ver)) {
        snprintf(err, NB_ERRBUF, "%s: \"version\" is missing or not a number", name);
    } else if (ver->valuedouble != 1.0) {
        snprintf(err, NB_ERRBUF, "%s: version %.17g; this library reads tuning caches of version 1 (re-run nibble tune)",
                 name, ver->valuedouble);
        st = NB_ERR_UNSUPPORTED;
    } else if (!cJSON_IsArray(ents)) {
        snprintf(err, NB_ERRBUF, "%s: \"entries\" is missing or not an array", name);
    } else if (cJSON_GetArraySize(ents) > MAX_ENTRIES) {
        snprintf(err, NB_ERRBUF, "%s: %d entries, more than the %d a tuning cache may have", name,
                 cJSON_GetArraySize(ents), MAX_ENTRIES);
    } else if (!(t = calloc(1, sizeof *t))) {
        snprintf(err, NB_ERRBUF, "%s: out of host memory", name);
        st = NB_ERR_OUT_OF_MEMORY;
    } else {
        st = NB_OK;
        size_t i = 0;
        for (const cJSON *o = ents->child; o && st == NB_OK; o = o->next, i++) {
            entry e;
            const char *gpu = NULL;
            char why[300];
            if (!parse_entry(o, &e, &gpu, why, sizeof why)) {
                const cJSON *fm = cJSON_IsObject(o) ? cJSON_GetObjectItemCaseSensitive(o, "format") : NULL;
                const cJSON *k = cJSON_IsObject(o) ? cJSON_GetObjectItemCaseSensitive(o, "k") : NULL;
                const cJSON *n = cJSON_IsObject(o) ? cJSON_GetObjectItemCaseSensitive(o, "n") : NULL;
                const cJSON *m = cJSON_IsObject(o) ? cJSON_GetObjectItemCaseSensitive(o, "m") : NULL;
                char what[160] = "";
                if (cJSON_IsString(fm) && cJSON_IsNumber(k) && cJSON_IsNumber(n) && cJSON_IsString(m))
                    snprintf(what, sizeof what, " (%.16s %.0fx%.0f m %.16s)", fm->valuestring, k->valuedouble,
                             n->valuedouble, m->valuestring);
                snprintf(err, NB_ERRBUF, "%s: entry %zu%s: %s", name, i, what, why);
                st = NB_ERR_CORRUPT;
            } else if ((e.gpu = add_name(t, gpu)) < 0 || !put(t, &e)) {
                snprintf(err, NB_ERRBUF, "%s: out of host memory", name);
                st = NB_ERR_OUT_OF_MEMORY;
            }
        }
    }
    cJSON_Delete(root);
    if (st) nbi_tune_table_free(t);
    else *out = t;
    return st;
}

/* Read the file and replace the table; `missing_ok`: a file that does not
 * exist leaves the table as it is and is not an error. */
static nb_status load(nb_context *ctx, const char *path, const char *fn, int missing_ok) {
    /* a FIFO or device is refused before it is opened, and the open does not
     * wait for a writer (O_NONBLOCK) should the path change in between */
    struct stat sb;
    if (stat(path, &sb) == 0 && !S_ISREG(sb.st_mode))
        return nbi_fail(ctx, NB_ERR_IO, "%s: %s is not a regular file", fn, path);
    const int fd = open(path, O_RDONLY | O_CLOEXEC | O_NONBLOCK);
    FILE *f = fd >= 0 ? fdopen(fd, "rb") : NULL;
    if (!f) {
        const int e = errno;
        if (fd >= 0) close(fd);
        if (missing_ok && e == ENOENT) return NB_OK;
        return nbi_fail(ctx, NB_ERR_IO, "%s: cannot open %s: %s", fn, path, strerror(e));
    }
    char *text = NULL;
    nb_status st = NB_OK;
    if (fstat(fileno(f), &sb) || !S_ISREG(sb.st_mode)) {
        st = nbi_fail(ctx, NB_ERR_IO, "%s: %s is not a regular file", fn, path);
    } else if ((uint64_t)sb.st_size > MAX_FILE_BYTES) {
        st = nbi_fail(ctx, NB_ERR_CORRUPT, "%s: %s has %lld bytes, more than the %u a tuning cache may have", fn, path,
                      (long long)sb.st_size, MAX_FILE_BYTES);
    } else if (!(text = malloc((size_t)sb.st_size + 1))) {
        st = nbi_fail(ctx, NB_ERR_OUT_OF_MEMORY, "%s: out of host memory reading %s", fn, path);
    } else if (fread(text, 1, (size_t)sb.st_size, f) != (size_t)sb.st_size) {
        st = nbi_fail(ctx, NB_ERR_IO, "%s: cannot read %s", fn, path);
    }
    fclose(f);
    if (st == NB_OK) {
        nbi_tune_table *t;
        char err[NB_ERRBUF];
        text[sb.st_size] = 0;
        char label[160]; /* the reason must fit err after the file's name */
        if ((st = nbi_tune_parse(text, (size_t)sb.st_size, nbi_elide(path, label, sizeof label), &t, err))) {
            nbi_fail(ctx, st, "%s: %s", fn, err);
        } else {
            nbi_tune_table_free(ctx->tune);
            ctx->tune = t;
        }
    }
    free(text);
    return st;
}

/* Entries in file order: by GPU, format, dtype, k, n, m bucket. */
typedef struct sorted {
    const char *gpu;
    entry e;
} sorted;
static int cmp_entry(const void *pa, const void *pb) {
    const entry *a = &((const sorted *)pa)->e, *b = &((const sorted *)pb)->e;
    int c = strcmp(((const sorted *)pa)->gpu, ((const sorted *)pb)->gpu);
    if (c) return c;
    if (a->fmt != b->fmt) return a->fmt - b->fmt;
    if (a->act != b->act) return b->act - a->act; /* bf16 first */
    if (a->k != b->k) return a->k < b->k ? -1 : 1;
    if (a->n != b->n) return a->n < b->n ? -1 : 1;
    return a->bucket - b->bucket;
}

static cJSON *entry_json(const nbi_tune_table *t, const entry *e) {
    static const char *const acts[4] = {"", "", "f16", "bf16"};
    cJSON *o = cJSON_CreateObject();
    if (!o) return NULL;
    const nb_gemm_config *c = &e->cfg;
    int ok = cJSON_AddStringToObject(o, "gpu", t->names[e->gpu]) && cJSON_AddStringToObject(o, "format", nbi_traits(e->fmt)->name) &&
             cJSON_AddStringToObject(o, "act", acts[e->act]) && cJSON_AddNumberToObject(o, "k", (double)e->k) &&
             cJSON_AddNumberToObject(o, "n", (double)e->n) && cJSON_AddStringToObject(o, "m", k_bucket_name[e->bucket]) &&
             (!e->m_tuned || cJSON_AddNumberToObject(o, "m_tuned", (double)e->m_tuned)) &&
             cJSON_AddStringToObject(o, "path", k_path_name[c->path]);
    if (ok && c->path == NB_GEMM_PATH_DECODE)
        ok = cJSON_AddNumberToObject(o, "kw", c->kw) && cJSON_AddNumberToObject(o, "splits", c->splits) &&
             cJSON_AddStringToObject(o, "variant", k_variant_name[c->variant]) &&
             (!c->variant || cJSON_AddNumberToObject(o, "rpw", c->rpw)) &&
             (!c->warps || cJSON_AddNumberToObject(o, "warps", c->warps));
    else if (ok)
        ok = cJSON_AddNumberToObject(o, "bn", c->bn) && cJSON_AddNumberToObject(o, "raster", c->raster) &&
             cJSON_AddNumberToObject(o, "splits", c->splits) &&
             (!c->stages || cJSON_AddNumberToObject(o, "stages", c->stages)) &&
             (!c->stream_k || cJSON_AddNumberToObject(o, "stream_k", c->stream_k));
    ok = ok && cJSON_AddNumberToObject(o, "us", round(e->us * 1000.0) / 1000.0);
    if (!ok) {
        cJSON_Delete(o);
        return NULL;
    }
    return o;
}

static nb_status save(nb_context *ctx, const char *path) {
    static const char fn[] = "nb_context_save_tuning";
    const nbi_tune_table empty = {0}, *t = ctx->tune ? ctx->tune : &empty;
    sorted *order = t->count ? malloc(t->count * sizeof *order) : NULL;
    if (t->count && !order) return nbi_fail(ctx, NB_ERR_OUT_OF_MEMORY, "%s: out of host memory", fn);
    for (size_t i = 0; i < t->count; i++) order[i] = (sorted){t->names[t->e[i].gpu], t->e[i]};
    if (t->count) qsort(order, t->count, sizeof *order, cmp_entry);
    /* a temporary file in the same directory, renamed over the target once
     * complete and on disk: readers see the old file or the new one */
    const size_t plen = strlen(path);
    char *tmp = malloc(plen + 16);
    if (!tmp) {
        free(order);
        return nbi_fail(ctx, NB_ERR_OUT_OF_MEMORY, "%s: out of host memory", fn);
    }
    snprintf(tmp, plen + 16, "%s.tmp.XXXXXX", path);
    const int fd = mkstemp(tmp);
    FILE *f = fd >= 0 ? fdopen(fd, "w") : NULL;
    if (!f) {
        const int e = errno;
        if (fd >= 0) close(fd), unlink(tmp);
        free(tmp);
        free(order);
        return nbi_fail(ctx, NB_ERR_IO, "%s: cannot create a temporary file next to %s: %s", fn, path, strerror(e));
    }
    nb_status st = NB_OK;
    fchmod(fd, 0644);
    fprintf(f, "{\"version\": 1, \"library\": \"%s\",\n \"m_buckets\": [", nb_version_string());
    for (int b = 0; b < NBUCKETS; b++) fprintf(f, "%s\"%s\"", b ? ", " : "", k_bucket_name[b]);
    fprintf(f, "],\n \"entries\": [");
    for (size_t i = 0; i < t->count && st == NB_OK; i++) {
        cJSON *o = entry_json(t, &order[i].e);
        char *s = o ? cJSON_PrintUnformatted(o) : NULL;
        if (!s) st = nbi_fail(ctx, NB_ERR_OUT_OF_MEMORY, "%s: out of host memory", fn);
        else fprintf(f, "%s\n  %s", i ? "," : "", s);
        free(s);
        cJSON_Delete(o);
    }
    fprintf(f, "\n ]}\n");
    if (st == NB_OK && (fflush(f) || ferror(f) || fsync(fd)))
        st = nbi_fail(ctx, NB_ERR_IO, "%s: cannot write %s: %s", fn, tmp, strerror(errno));
    if (fclose(f) && st == NB_OK) st = nbi_fail(ctx, NB_ERR_IO, "%s: cannot write %s: %s", fn, tmp, strerror(errno));
    if (st == NB_OK && rename(tmp, path))
        st = nbi_fail(ctx, NB_ERR_IO, "%s: cannot rename %s to %s: %s", fn, tmp, path, strerror(errno));
    if (st) unlink(tmp);
    free(tmp);
    free(order);
    return st;
}

#else /* no cJSON: the table works, the file does not */

nb_status nbi_tune_parse(const char *text, size_t len, const char *name, nbi_tune_table **out, char *err) {
    (void)text, (void)len;
    *out = NULL;
    snprintf(err, NB_ERRBUF, "%s: libnibble was built without cJSON (libcjson-dev): tuning caches cannot be read", name);
    return NB_ERR_UNSUPPORTED;
}

static nb_status load(nb_context *ctx, const char *path, const char *fn, int missing_ok) {
    if (missing_ok && access(path, F_OK) && errno == ENOENT) return NB_OK;
    return nbi_fail(ctx, NB_ERR_UNSUPPORTED, "%s: %s: libnibble was built without cJSON (libcjson-dev): tuning caches "
                    "cannot be read", fn, path);
}

static nb_status save(nb_context *ctx, const char *path) {
    return nbi_fail(ctx, NB_ERR_UNSUPPORTED, "nb_context_save_tuning: %s: libnibble was built without cJSON "
                    "(libcjson-dev): tuning caches cannot be written", path);
}

#endif

nb_status nb_context_load_tuning(nb_context *ctx, const char *path) {
    if (!ctx || !path) return nbi_fail(ctx, NB_ERR_NULL_POINTER, "nb_context_load_tuning: ctx and path must not be NULL");
    return load(ctx, path, "nb_context_load_tuning", 0);
}

nb_status nb_context_save_tuning(nb_context *ctx, const char *path) {
    if (!ctx || !path) return nbi_fail(ctx, NB_ERR_NULL_POINTER, "nb_context_save_tuning: ctx and path must not be NULL");
    return save(ctx, path);
}

nb_status nbi_tune_load_env(nb_context *ctx) {
    const char *path = getenv("NIBBLE_TUNE_CACHE");
    if (!path || !path[0]) return NB_OK;
    return load(ctx, path, "nb_context_create: NIBBLE_TUNE_CACHE", 1);
}
