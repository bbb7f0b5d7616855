/* gguf.c - GGUF reader and FP4 import (rules and layouts in nibble_io.h,
 * "GGUF").
 *
 * The parser walks the file with a cursor that never moves past the end:
 * every read first checks the bytes left (rd_need), every count is bounded
 * by the bytes its smallest element needs before anything is allocated, and
 * every product or sum of sizes goes through __builtin_*_overflow.  Tensor
 * ranges are then checked in offset order against the data section.
 */
#define _DEFAULT_SOURCE
#include "io_internal.h"

#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

typedef struct kv_rec {
    nb_gguf_kv pub;
    char *key, *str;
} kv_rec;

typedef struct t_rec {
    nb_gguf_tensor pub;
    char *name;
} t_rec;

struct nb_gguf_file {
    char *label;
    void *map;
    const uint8_t *base;
    size_t size;
    uint32_t version, alignment;
    uint64_t data_offset;
    kv_rec *kv;
    size_t nkv;
    t_rec *t;
    size_t nt;
    struct by_name { const char *name; size_t i; } *by_name; /* tensors sorted by name */
};

/* -------------------------------------------------------------- types */

static const struct {
    const char *name;
    int64_t block, bytes;
} k_types[] = {
    {"F32", 1, 4},        {"F16", 1, 2},       {"Q4_0", 32, 18},     {"Q4_1", 32, 20},    {NULL, 0, 0},
    {NULL, 0, 0},         {"Q5_0", 32, 22},    {"Q5_1", 32, 24},     {"Q8_0", 32, 34},    {"Q8_1", 32, 36},
    {"Q2_K", 256, 84},    {"Q3_K", 256, 110},  {"Q4_K", 256, 144},   {"Q5_K", 256, 176},  {"Q6_K", 256, 210},
    {"Q8_K", 256, 292},   {"IQ2_XXS", 256, 66}, {"IQ2_XS", 256, 74}, {"IQ3_XXS", 256, 98}, {"IQ1_S", 256, 50},
    {"IQ4_NL", 32, 18},   {"IQ3_S", 256, 110}, {"IQ2_S", 256, 82},   {"IQ4_XS", 256, 136}, {"I8", 1, 1},
    {"I16", 1, 2},        {"I32", 1, 4},       {"I64", 1, 8},        {"F64", 1, 8},       {"IQ1_M", 256, 56},
    {"BF16", 1, 2},       {NULL, 0, 0},        {NULL, 0, 0},         {NULL, 0, 0},        {"TQ1_0", 256, 54},
    {"TQ2_0", 256, 66},   {NULL, 0, 0},        {NULL, 0, 0},         {NULL, 0, 0},        {"MXFP4", 32, 17},
    {"NVFP4", 64, 36},    {"Q1_0", 128, 18},
};
#define N_TYPES (sizeof k_types / sizeof k_types[0])

static const char *type_name(uint32_t type) { return type < N_TYPES ? k_types[type].name : NULL; }

nb_status nb_ggml_type_name(uint32_t type, const char **name) {
    if (!name) return nbi_fail(NULL, NB_ERR_NULL_POINTER, "nb_ggml_type_name: name is NULL");
    if (!type_name(type)) return nbi_fail(NULL, NB_ERR_NOT_FOUND, "nb_ggml_type_name: %u is not a ggml type", type);
    *name = type_name(type);
    return NB_OK;
}

nb_status nb_ggml_type_size(uint32_t type, int64_t *block, int64_t *bytes) {
    if (!type_name(type)) return nbi_fail(NULL, NB_ERR_NOT_FOUND, "nb_ggml_type_size: %u is not a ggml type", type);
    if (block) *block = k_types[type].block;
    if (bytes) *bytes = k_types[type].bytes;
    return NB_OK;
}

/* The ggml types imported into nibble's checkpoint layout and the format
 * each holds (knowledge of ggml's blocks: import_row decodes them). */
static const struct {
    uint32_t type;
    nb_format format;
} k_fp4_types[] = {{NB_GGML_TYPE_MXFP4, NB_FORMAT_MXFP4}, {NB_GGML_TYPE_NVFP4, NB_FORMAT_NVFP4}};

nb_format nbio_ggml_format(uint32_t type) {
    for (size_t i = 0; i < sizeof k_fp4_types / sizeof k_fp4_types[0]; i++)
        if (k_fp4_types[i].type == type) return k_fp4_types[i].format;
    return (nb_format)0;
}

nb_status nb_ggml_type_format(uint32_t type, nb_format *out) {
    if (!out) return nbi_fail(NULL, NB_ERR_NULL_POINTER, "nb_ggml_type_format: out is NULL");
    if (!nbio_ggml_format(type))
        return nbi_fail(NULL, NB_ERR_UNSUPPORTED, "nb_ggml_type_format: ggml type %u (%s) is not imported (MXFP4 "
                        "and NVFP4 are)", type, type_name(type) ? type_name(type) : "unknown");
    *out = nbio_ggml_format(type);
    return NB_OK;
}

static const int k_vsize[13] = {1, 1, 2, 2, 4, 4, 4, 1, 0, 0, 8, 8, 8}; /* 0: string / array */
static const char *const k_vnames[13] = {"UINT8", "INT8",   "UINT16", "INT16", "UINT32", "INT32", "FLOAT32",
                                         "BOOL",  "STRING", "ARRAY",  "UINT64", "INT64", "FLOAT64"};

nb_status nb_gguf_vtype_name(nb_gguf_vtype t, const char **name) {
    if (!name) return nbi_fail(NULL, NB_ERR_NULL_POINTER, "nb_gguf_vtype_name: name is NULL");
    if ((unsigned)t >= 13)
        return nbi_fail(NULL, NB_ERR_INVALID_ARGUMENT, "nb_gguf_vtype_name: %d is not a GGUF value type", (int)t);
    *name = k_vnames[t];
    return NB_OK;
}

/* -------------------------------------------------------------- cursor */

typedef struct rd {
    const uint8_t *p;
    size_t pos, size;
    const char *label;
} rd;

static int rd_need(const rd *r, uint64_t n) { return n <= (uint64_t)(r->size - r->pos); }
static uint32_t le32(const uint8_t *p) { return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24; }
static uint64_t le64(const uint8_t *p) { return (uint64_t)le32(p) | (uint64_t)le32(p + 4) << 32; }

static nb_status rd_u32(rd *r, uint32_t *v, const char *what) {
    *v = 0;
    if (!rd_need(r, 4))
        return nbi_fail(NULL, NB_ERR_CORRUPT, "%s: %s runs past the end of the file at byte %zu (rule: "
                        "inside the file)", r->label, what, r->pos);
    *v = le32(r->p + r->pos);
    r->pos += 4;
    return NB_OK;
}

static nb_status rd_u64(rd *r, uint64_t *v, const char *what) {
    *v = 0;
    if (!rd_need(r, 8))
        return nbi_fail(NULL, NB_ERR_CORRUPT, "%s: %s runs past the end of the file at byte %zu (rule: "
                        "inside the file)", r->label, what, r->pos);
    *v = le64(r->p + r->pos);
    r->pos += 8;
    return NB_OK;
}

/* A GGUF string: u64 length + bytes; *s points into the file. */
static nb_status rd_str(rd *r, const uint8_t **s, uint64_t *len, uint64_t max, const char *what) {
    *s = r->p;
    nb_status st = rd_u64(r, len, what);
    if (st != NB_OK) return st;
    if (*len > max)
        return nbi_fail(NULL, NB_ERR_CORRUPT, "%s: %s of %llu bytes at byte %zu is longer than %llu "
                        "(rule: string length)", r->label, what, (unsigned long long)*len, r->pos - 8,
                        (unsigned long long)max);
    if (!rd_need(r, *len))
        return nbi_fail(NULL, NB_ERR_CORRUPT, "%s: %s of %llu bytes at byte %zu runs past the end of "
                        "the file (rule: string length)", r->label, what, (unsigned long long)*len, r->pos - 8);
    *s = r->p + r->pos;
    r->pos += (size_t)*len;
    return NB_OK;
}

static char *dup_n(const uint8_t *s, uint64_t n) {
    char *p = (char *)malloc((size_t)n + 1);
    if (!p) return NULL;
    memcpy(p, s, (size_t)n);
    p[n] = 0;
    return p;
}

static int text_ok(const uint8_t *s, uint64_t n) {
    return memchr(s, 0, (size_t)n) == NULL && nbio_utf8_bad(s, (size_t)n) == (size_t)n;
}

/* -------------------------------------------------------------- parser */

static nb_status parse_kv(nb_gguf_file *g, rd *r, size_t i) {
    kv_rec *k = &g->kv[i];
    const uint8_t *s = NULL;
    uint64_t n = 0;
    nb_status st = rd_str(r, &s, &n, NB_GGUF_MAX_KEY, "key");
    if (st != NB_OK) return st;
    if (n == 0 || !text_ok(s, n))
        return nbi_fail(NULL, NB_ERR_CORRUPT, "%s: key %zu is empty, holds a NUL byte or is not UTF-8 "
                        "(rule: keys are UTF-8 text)", r->label, i);
    if (!(k->key = dup_n(s, n))) return nbi_fail(NULL, NB_ERR_OUT_OF_MEMORY, "out of memory");
    k->pub.key = k->key;
    uint32_t t = 0;
    if ((st = rd_u32(r, &t, "value type")) != NB_OK) return st;
    if (t > NB_GGUF_FLOAT64)
        return nbi_fail(NULL, NB_ERR_CORRUPT, "%s: key \"%.64s\": value type %u outside 0..12 (rule: "
                        "value types)", r->label, k->key, t);
    k->pub.type = k->pub.elem_type = (nb_gguf_vtype)t;
    k->pub.count = 1;
    if (t == NB_GGUF_ARRAY) {
        uint32_t et = 0;
        uint64_t cnt = 0;
        if ((st = rd_u32(r, &et, "array element type")) != NB_OK || (st = rd_u64(r, &cnt, "array count")) != NB_OK)
            return st;
        if (et > NB_GGUF_FLOAT64 || et == NB_GGUF_ARRAY)
            return nbi_fail(NULL, NB_ERR_CORRUPT, "%s: key \"%.64s\": array element type %u (rule: "
                            "arrays hold scalars or strings, not arrays)", r->label, k->key, et);
        k->pub.elem_type = (nb_gguf_vtype)et;
        k->pub.count = cnt;
        k->pub.data = r->p + r->pos;
        size_t start = r->pos;
        if (et == NB_GGUF_STRING) {
            if (cnt > (r->size - r->pos) / 8)
                return nbi_fail(NULL, NB_ERR_CORRUPT, "%s: key \"%.64s\": %llu strings cannot fit in the "
                                "%zu bytes left (rule: inside the file)", r->label, k->key, (unsigned long long)cnt,
                                r->size - r->pos);
            for (uint64_t j = 0; j < cnt; j++) {
                if ((st = rd_str(r, &s, &n, UINT64_MAX, "array string")) != NB_OK) return st;
                if (!text_ok(s, n))
                    return nbi_fail(NULL, NB_ERR_CORRUPT, "%s: key \"%.64s\": string %llu is not UTF-8 "
                                    "text (rule: strings are UTF-8)", r->label, k->key, (unsigned long long)j);
            }
        } else {
            uint64_t bytes;
            if (__builtin_mul_overflow(cnt, (uint64_t)k_vsize[et], &bytes))
                return nbi_fail(NULL, NB_ERR_OVERFLOW, "%s: key \"%.64s\": array of %llu elements "
                                "overflows (rule: sizes)", r->label, k->key, (unsigned long long)cnt);
            if (!rd_need(r, bytes))
                return nbi_fail(NULL, NB_ERR_CORRUPT, "%s: key \"%.64s\": array of %llu x %d bytes runs "
                                "past the end of the file (rule: inside the file)", r->label, k->key,
                                (unsigned long long)cnt, k_vsize[et]);
            r->pos += (size_t)bytes;
        }
        k->pub.bytes = r->pos - start;
        return NB_OK;
    }
    if (t == NB_GGUF_STRING) {
        if ((st = rd_str(r, &s, &n, UINT64_MAX, "string value")) != NB_OK) return st;
        if (!text_ok(s, n))
            return nbi_fail(NULL, NB_ERR_CORRUPT, "%s: key \"%.64s\": value is not UTF-8 text (rule: "
                            "strings are UTF-8)", r->label, k->key);
        if (!(k->str = dup_n(s, n))) return nbi_fail(NULL, NB_ERR_OUT_OF_MEMORY, "out of memory");
        k->pub.str = k->str;
        k->pub.data = s;
        k->pub.bytes = n;
        return NB_OK;
    }
    if (!rd_need(r, (uint64_t)k_vsize[t]))
        return nbi_fail(NULL, NB_ERR_CORRUPT, "%s: key \"%.64s\": value runs past the end of the file "
                        "(rule: inside the file)", r->label, k->key);
    k->pub.data = r->p + r->pos;
    k->pub.bytes = (uint64_t)k_vsize[t];
    r->pos += (size_t)k_vsize[t];
    return NB_OK;
}

static nb_status parse_tensor(nb_gguf_file *g, rd *r, size_t i) {
    t_rec *t = &g->t[i];
    const uint8_t *s = NULL;
    uint64_t n = 0;
    nb_status st = rd_str(r, &s, &n, NB_GGUF_MAX_NAME, "tensor name");
    if (st != NB_OK) return st;
    if (n == 0 || !text_ok(s, n))
        return nbi_fail(NULL, NB_ERR_CORRUPT, "%s: tensor %zu: name empty, with a NUL byte or not "
                        "UTF-8 (rule: names are UTF-8 text)", r->label, i);
    if (!(t->name = dup_n(s, n))) return nbi_fail(NULL, NB_ERR_OUT_OF_MEMORY, "out of memory");
    nb_gguf_tensor *p = &t->pub;
    p->name = t->name;
    uint32_t nd = 0;
    if ((st = rd_u32(r, &nd, "n_dims")) != NB_OK) return st;
    if (nd < 1 || nd > NB_GGUF_MAX_DIMS)
        return nbi_fail(NULL, NB_ERR_CORRUPT, "%s: tensor \"%s\": n_dims %u outside 1..%d (rule: "
                        "dimensions)", r->label, t->name, nd, NB_GGUF_MAX_DIMS);
    p->n_dims = (int)nd;
    for (int d = 0; d < NB_GGUF_MAX_DIMS; d++) p->ne[d] = 1;
    for (int d = 0; d < p->n_dims; d++) {
        uint64_t v;
        if ((st = rd_u64(r, &v, "dimension")) != NB_OK) return st;
        if (v > (uint64_t)INT64_MAX)
            return nbi_fail(NULL, NB_ERR_CORRUPT, "%s: tensor \"%s\": ne[%d] = %llu is negative as "
                            "int64 (rule: dimensions)", r->label, t->name, d, (unsigned long long)v);
        p->ne[d] = (int64_t)v;
        p->shape[p->n_dims - 1 - d] = (int64_t)v;
    }
    if ((st = rd_u32(r, &p->type, "ggml type")) != NB_OK) return st;
    int64_t blk, tb;
    if (nb_ggml_type_size(p->type, &blk, &tb) != NB_OK)
        return nbi_fail(NULL, NB_ERR_CORRUPT, "%s: tensor \"%s\": unknown or retired ggml type %u "
                        "(rule: ggml types)", r->label, t->name, p->type);
    if (p->ne[0] % blk)
        return nbi_fail(NULL, NB_ERR_CORRUPT, "%s: tensor \"%s\": ne[0] = %lld is not a multiple of "
                        "%s's block of %lld (rule: whole blocks)", r->label, t->name, (long long)p->ne[0],
                        type_name(p->type), (long long)blk);
    uint64_t bytes = (uint64_t)(p->ne[0] / blk), el = 1;
    for (int d = 0; d < NB_GGUF_MAX_DIMS; d++)
        if (__builtin_mul_overflow(el, (uint64_t)p->ne[d], &el))
            return nbi_fail(NULL, NB_ERR_OVERFLOW, "%s: tensor \"%s\": element count overflows (rule: "
                            "sizes)", r->label, t->name);
    if (__builtin_mul_overflow(bytes, (uint64_t)tb, &bytes))
        return nbi_fail(NULL, NB_ERR_OVERFLOW, "%s: tensor \"%s\": byte count overflows", r->label,
                        t->name);
    for (int d = 1; d < NB_GGUF_MAX_DIMS; d++)
        if (__builtin_mul_overflow(bytes, (uint64_t)p->ne[d], &bytes))
            return nbi_fail(NULL, NB_ERR_OVERFLOW, "%s: tensor \"%s\": byte count overflows (rule: "
                            "sizes)", r->label, t->name);
    p->bytes = bytes;
    return rd_u64(r, &p->offset, "tensor offset");
}

/* The pair with this key, or NULL (records nothing). */
static const nb_gguf_kv *kv_lookup(const nb_gguf_file *g, const char *key) {
    for (size_t i = 0; i < g->nkv; i++)
        if (g->kv[i].key && !strcmp(g->kv[i].key, key)) return &g->kv[i].pub;
    return NULL;
}

static int cmp_kv(const void *a, const void *b) {
    return strcmp(((const kv_rec *)a)->key, ((const kv_rec *)b)->key);
}
static int cmp_tname(const void *a, const void *b) {
    return strcmp(((const struct by_name *)a)->name, ((const struct by_name *)b)->name);
}

static nb_status validate(nb_gguf_file *g) {
    rd r = {g->base, 0, g->size, g->label};
    const char *L = g->label;
    if (g->size < 24)
        return nbi_fail(NULL, NB_ERR_CORRUPT, "%s: %zu bytes, shorter than the 24-byte header (rule: header)",
                        L, g->size);
    if (memcmp(g->base, "GGUF", 4))
        return nbi_fail(NULL, NB_ERR_CORRUPT, "%s: magic is not \"GGUF\" (rule: magic)", L);
    r.pos = 4;
    uint32_t ver;
    rd_u32(&r, &ver, "version");
    if (ver != 2 && ver != 3) {
        if (ver && !(ver & 0xFFFF) && (ver >> 16 || ver >> 24))
            return nbi_fail(NULL, NB_ERR_UNSUPPORTED, "%s: version bytes %08x read as big-endian %u: big-endian "
                            "GGUF is not supported (rule: little-endian)", L, ver, __builtin_bswap32(ver));
        return nbi_fail(NULL, NB_ERR_UNSUPPORTED, "%s: GGUF version %u; versions 2 and 3 are read (rule: "
                        "version)", L, ver);
    }
    g->version = ver;
    uint64_t nt, nkv;
    rd_u64(&r, &nt, "n_tensors");
    rd_u64(&r, &nkv, "n_kv");
    /* a key/value pair takes at least 13 bytes, a tensor info 32 */
    if (nkv > (r.size - r.pos) / 13)
        return nbi_fail(NULL, NB_ERR_CORRUPT, "%s: n_kv = %llu cannot fit in the file (rule: counts)", L,
                        (unsigned long long)nkv);
    if (nt > (r.size - r.pos) / 32)
        return nbi_fail(NULL, NB_ERR_CORRUPT, "%s: n_tensors = %llu cannot fit in the file (rule: counts)", L,
                        (unsigned long long)nt);
    g->kv = (kv_rec *)calloc(nkv ? (size_t)nkv : 1, sizeof *g->kv);
    g->t = (t_rec *)calloc(nt ? (size_t)nt : 1, sizeof *g->t);
    g->by_name = (struct by_name *)calloc(nt ? (size_t)nt : 1, sizeof *g->by_name);
    if (!g->kv || !g->t || !g->by_name) return nbi_fail(NULL, NB_ERR_OUT_OF_MEMORY, "%s: out of memory", L);
    nb_status st = NB_OK;
    for (size_t i = 0; i < nkv; i++, g->nkv++)
        if ((st = parse_kv(g, &r, i)) != NB_OK) {
            g->nkv++; /* free what parse_kv allocated */
            return st;
        }
    /* duplicate keys, on a sorted copy */
    kv_rec *sorted = (kv_rec *)malloc((g->nkv ? g->nkv : 1) * sizeof *sorted);
    if (!sorted) return nbi_fail(NULL, NB_ERR_OUT_OF_MEMORY, "%s: out of memory", L);
    memcpy(sorted, g->kv, g->nkv * sizeof *sorted);
    qsort(sorted, g->nkv, sizeof *sorted, cmp_kv);
    for (size_t i = 1; i < g->nkv; i++)
        if (!strcmp(sorted[i - 1].key, sorted[i].key)) {
            st = nbi_fail(NULL, NB_ERR_CORRUPT, "%s: key \"%.64s\" appears twice (rule: unique keys)", L,
                          sorted[i].key);
            break;
        }
    free(sorted);
    if (st != NB_OK) return st;
    g->alignment = NB_GGUF_DEFAULT_ALIGNMENT;
    const nb_gguf_kv *a = kv_lookup(g, "general.alignment");
    if (a) {
        uint32_t v = a->type == NB_GGUF_UINT32 ? le32(a->data) : 0;
        if (a->type != NB_GGUF_UINT32 || v == 0 || (v & (v - 1)))
            return nbi_fail(NULL, NB_ERR_CORRUPT, "%s: general.alignment is %s %u, not a UINT32 power of two "
                            "(rule: alignment)", L, k_vnames[a->type], v);
        g->alignment = v;
    }
    for (size_t i = 0; i < nt; i++, g->nt++)
        if ((st = parse_tensor(g, &r, i)) != NB_OK) {
            g->nt++;
            return st;
        }
    for (size_t i = 0; i < g->nt; i++) {
        g->by_name[i].name = g->t[i].name;
        g->by_name[i].i = i;
    }
    qsort(g->by_name, g->nt, sizeof *g->by_name, cmp_tname);
    for (size_t i = 1; i < g->nt; i++)
        if (!strcmp(g->by_name[i - 1].name, g->by_name[i].name))
            return nbi_fail(NULL, NB_ERR_CORRUPT, "%s: tensor \"%s\" appears twice (rule: unique names)", L,
                            g->by_name[i].name);
    /* the data section: after the infos, at the next multiple of the alignment */
    uint64_t al = g->alignment, pad = (al - r.pos % al) % al;
    g->data_offset = (uint64_t)r.pos + pad;
    if (g->nt == 0) {
        if (g->size > g->data_offset)
            return nbi_fail(NULL, NB_ERR_CORRUPT, "%s: %llu bytes after the header of a file without tensors "
                            "(rule: no trailing bytes)", L, (unsigned long long)(g->size - g->data_offset));
        return NB_OK;
    }
    if (g->data_offset > g->size)
        return nbi_fail(NULL, NB_ERR_CORRUPT, "%s: the data section at byte %llu starts past the end of the "
                        "file (rule: inside the file)", L, (unsigned long long)g->data_offset);
    uint64_t avail = g->size - g->data_offset;
    size_t *order = (size_t *)malloc(g->nt * sizeof *order);
    if (!order) return nbi_fail(NULL, NB_ERR_OUT_OF_MEMORY, "%s: out of memory", L);
    for (size_t i = 0; i < g->nt; i++) order[i] = i;
    /* insertion into offset order (counts are small: one info per tensor) */
    for (size_t i = 1; i < g->nt; i++)
        for (size_t j = i; j > 0 && g->t[order[j - 1]].pub.offset > g->t[order[j]].pub.offset; j--) {
            size_t x = order[j];
            order[j] = order[j - 1];
            order[j - 1] = x;
        }
    uint64_t expect = 0;
    for (size_t i = 0; i < g->nt && st == NB_OK; i++) {
        nb_gguf_tensor *p = &g->t[order[i]].pub;
        if (p->offset % al)
            st = nbi_fail(NULL, NB_ERR_CORRUPT, "%s: tensor \"%s\": offset %llu is not a multiple of the "
                          "alignment %llu (rule: alignment)", L, p->name, (unsigned long long)p->offset,
                          (unsigned long long)al);
        else if (p->offset > avail || p->bytes > avail - p->offset)
            st = nbi_fail(NULL, NB_ERR_CORRUPT, "%s: tensor \"%s\": %llu bytes at offset %llu run past the end "
                          "of the file (%llu data bytes; rule: inside the file)", L, p->name,
                          (unsigned long long)p->bytes, (unsigned long long)p->offset, (unsigned long long)avail);
        else if (p->offset < expect)
            st = nbi_fail(NULL, NB_ERR_CORRUPT, "%s: tensor \"%s\" at offset %llu overlaps the tensor before "
                          "it, which ends at %llu (rule: no overlaps)", L, p->name, (unsigned long long)p->offset,
                          (unsigned long long)expect);
        else if (p->offset > expect)
            st = nbi_fail(NULL, NB_ERR_CORRUPT, "%s: tensor \"%s\" at offset %llu leaves a gap after %llu "
                          "(rule: tensors are contiguous, each padded to the alignment)", L, p->name,
                          (unsigned long long)p->offset, (unsigned long long)expect);
        if (st != NB_OK) break;
        p->data = g->base + g->data_offset + p->offset; /* offset + bytes <= avail: inside the image */
        uint64_t end = p->offset + p->bytes;
        expect = end + (al - end % al) % al;
        if (i + 1 == g->nt && avail > expect)
            st = nbi_fail(NULL, NB_ERR_CORRUPT, "%s: %llu bytes after the last tensor's padding (rule: no "
                          "trailing bytes)", L, (unsigned long long)(avail - expect));
    }
    free(order);
    return st;
}

/* -------------------------------------------------------------- open / close */

static nb_status open_common(nb_gguf_file *g, nb_gguf_file **out) {
    nb_status st = validate(g);
    if (st != NB_OK) {
        nb_gguf_close(g);
        return st;
    }
    *out = g;
    return NB_OK;
}

nb_status nb_gguf_open(const char *path, nb_gguf_file **out) {
    if (!path || !out) return nbi_fail(NULL, NB_ERR_NULL_POINTER, "nb_gguf_open: NULL argument");
    *out = NULL;
    void *map = NULL;
    size_t size = 0;
    nb_status st = nbio_map_file(path, 1, &map, &size);
    if (st != NB_OK) return st;
    nb_gguf_file *g = (nb_gguf_file *)calloc(1, sizeof *g);
    if (!g || !(g->label = nbio_strdup(path))) {
        free(g);
        if (map) munmap(map, size);
        return nbi_fail(NULL, NB_ERR_OUT_OF_MEMORY, "%s: out of memory", path);
    }
    static const uint8_t empty[1] = {0};
    g->map = map;
    g->size = size;
    g->base = map ? (const uint8_t *)map : empty;
    return open_common(g, out);
}

nb_status nb_gguf_open_memory(const void *data, size_t size, const char *label, nb_gguf_file **out) {
    if (!out || (!data && size)) return nbi_fail(NULL, NB_ERR_NULL_POINTER, "nb_gguf_open_memory: NULL argument");
    *out = NULL;
    nb_gguf_file *g = (nb_gguf_file *)calloc(1, sizeof *g);
    if (!g || !(g->label = nbio_strdup(label ? label : "<memory>"))) {
        free(g);
        return nbi_fail(NULL, NB_ERR_OUT_OF_MEMORY, "out of memory");
    }
    static const uint8_t empty[1] = {0};
    g->base = data ? (const uint8_t *)data : empty;
    g->size = size;
    return open_common(g, out);
}

nb_status nb_gguf_close(nb_gguf_file *g) {
    if (!g) return NB_OK;
    if (g->map) munmap(g->map, g->size);
    for (size_t i = 0; i < g->nkv; i++) {
        free(g->kv[i].key);
        free(g->kv[i].str);
    }
    for (size_t i = 0; i < g->nt; i++) free(g->t[i].name);
    free(g->kv);
    free(g->t);
    free(g->by_name);
    free(g->label);
    free(g);
    return NB_OK;
}

/* -------------------------------------------------------------- queries */

#define NEED(cond, fn) \
    if (!(cond)) return nbi_fail(NULL, NB_ERR_NULL_POINTER, "%s: a required pointer is NULL", fn)

nb_status nb_gguf_get_header(const nb_gguf_file *g, nb_gguf_header *out) {
    NEED(g && out, "nb_gguf_get_header");
    memset(out, 0, sizeof *out);
    out->version = g->version;
    out->alignment = g->alignment;
    out->data_offset = g->data_offset;
    out->n_kv = g->nkv;
    out->n_tensors = g->nt;
    return NB_OK;
}

nb_status nb_gguf_kv_at(const nb_gguf_file *g, size_t i, nb_gguf_kv *out) {
    NEED(g && out, "nb_gguf_kv_at");
    if (i >= g->nkv) return nbi_fail(NULL, NB_ERR_NOT_FOUND, "%s: key %zu of %zu", g->label, i, g->nkv);
    *out = g->kv[i].pub;
    return NB_OK;
}

nb_status nb_gguf_kv_find(const nb_gguf_file *g, const char *key, nb_gguf_kv *out) {
    NEED(g && key && out, "nb_gguf_kv_find");
    const nb_gguf_kv *kv = kv_lookup(g, key);
    if (!kv) return nbi_fail(NULL, NB_ERR_NOT_FOUND, "%s: no key \"%.200s\"", g->label, key);
    *out = *kv;
    return NB_OK;
}

nb_status nb_gguf_tensor_at(const nb_gguf_file *g, size_t i, nb_gguf_tensor *out) {
    NEED(g && out, "nb_gguf_tensor_at");
    if (i >= g->nt) return nbi_fail(NULL, NB_ERR_NOT_FOUND, "%s: tensor %zu of %zu", g->label, i, g->nt);
    *out = g->t[i].pub;
    return NB_OK;
}

int64_t nbio_gguf_lookup(const nb_gguf_file *g, const char *name) {
    size_t lo = 0, hi = g->nt;
    while (lo < hi) {
        size_t mid = lo + (hi - lo) / 2;
        int c = strcmp(g->by_name[mid].name, name);
        if (!c) return (int64_t)g->by_name[mid].i;
        if (c < 0) lo = mid + 1;
        else hi = mid;
    }
    return -1;
}

nb_status nb_gguf_tensor_find(const nb_gguf_file *g, const char *name, size_t *index) {
    NEED(g && name && index, "nb_gguf_tensor_find");
    const int64_t i = nbio_gguf_lookup(g, name);
    if (i < 0) return nbi_fail(NULL, NB_ERR_NOT_FOUND, "%s: no tensor \"%.200s\"", g->label, name);
    *index = (size_t)i;
    return NB_OK;
}

/* -------------------------------------------------------------- FP4 import */

nb_status nb_gguf_fp4_info(const nb_gguf_file *g, size_t i, nb_gguf_fp4 *out) {
    NEED(g && out, "nb_gguf_fp4_info");
    if (i >= g->nt) return nbi_fail(NULL, NB_ERR_NOT_FOUND, "%s: tensor %zu of %zu", g->label, i, g->nt);
    const nb_gguf_tensor *t = &g->t[i].pub;
    memset(out, 0, sizeof *out);
    nb_format_info fi;
    if (!nbio_ggml_format(t->type))
        return nbi_fail(NULL, NB_ERR_UNSUPPORTED, "%s: tensor \"%s\" is %s, not MXFP4 or NVFP4", g->label, t->name,
                        type_name(t->type));
    if (nb_format_get_info(nbio_ggml_format(t->type), &fi) != NB_OK) return NB_ERR_UNSUPPORTED; /* (recorded) */
    if (t->n_dims < 2 || t->n_dims > 3)
        return nbi_fail(NULL, NB_ERR_UNSUPPORTED, "%s: tensor \"%s\": %d dimensions; a weight has 2 (or 3 with "
                        "experts)", g->label, t->name, t->n_dims);
    out->format = fi.format;
    out->k = t->ne[0];
    out->n = t->ne[1];
    out->experts = t->n_dims == 3 ? t->ne[2] : 0;
    out->scale_tensor = -1;
    if (out->n <= 0 || out->k <= 0 || (t->n_dims == 3 && out->experts <= 0))
        return nbi_fail(NULL, NB_ERR_UNSUPPORTED, "%s: tensor \"%s\" is empty", g->label, t->name);
    /* whole ggml blocks (the reader checked) are whole groups of the format */
    out->codes_bytes = (size_t)(out->n * (out->k * fi.element_bits / 8));
    out->scales_bytes = (size_t)(out->n * (out->k / fi.group_size));
    if (fi.tensor_scale && nbio_ends_with(t->name, ".weight")) {
        /* llama.cpp's converter writes the tensor scale as P.scale */
        size_t n = strlen(t->name) - 7;
        char name[NB_GGUF_MAX_NAME + 8];
        memcpy(name, t->name, n);
        memcpy(name + n, ".scale", 7);
        const int64_t si = nbio_gguf_lookup(g, name);
        if (si >= 0) {
            const nb_gguf_tensor *s = &g->t[si].pub;
            int64_t want = out->experts ? out->experts : 1;
            uint64_t el = (uint64_t)s->ne[0] * (uint64_t)s->ne[1] * (uint64_t)s->ne[2] * (uint64_t)s->ne[3];
            if (s->type != NB_GGML_TYPE_F32 || (el != 1 && el != (uint64_t)want))
                return nbi_fail(NULL, NB_ERR_UNSUPPORTED, "%s: tensor scale \"%s\" must be F32 with 1 or %lld values",
                                g->label, name, (long long)want);
            out->scale_tensor = si;
        }
    }
    return NB_OK;
}

/* One MXFP4 block {u8 e; u8 qs[16]}: qs[j] holds element j (low nibble) and
 * j+16 (high); checkpoint byte m holds elements 2m, 2m+1.  The E8M0 byte is
 * copied. */
static void import_mxfp4(const uint8_t *blk, uint8_t *oc, uint8_t *os) {
    const uint8_t *qs = blk + 1;
    for (int m = 0; m < 16; m++) {
        int e0 = 2 * m, e1 = 2 * m + 1;
        int c0 = e0 < 16 ? qs[e0] & 15 : qs[e0 - 16] >> 4;
        int c1 = e1 < 16 ? qs[e1] & 15 : qs[e1 - 16] >> 4;
        oc[m] = (uint8_t)(c0 | c1 << 4);
    }
    os[0] = blk[0];
}

/* One NVFP4 block {u8 d[4]; u8 qs[32]}: sub-block s has scale d[s] (ggml's
 * unsigned E4M3, mapped to nibble's E4M3 byte of the same value; -1 for
 * 0xFF, which is 480 to ggml and no E4M3 value) and qs[8s+j] holding element
 * j (low) and j+8 (high).  The bytes remapped are added to *rem. */
static int import_nvfp4(const uint8_t *blk, uint8_t *oc, uint8_t *os, size_t *rem) {
    for (int s = 0; s < 4; s++) {
        uint8_t d = blk[s];
        if (d == 0xFF) return s;
        uint8_t e = (d & 0x7F) == 0x7F ? 0 : d & 0x7F;
        *rem += e != d;
        os[s] = e;
        const uint8_t *qs = blk + 4 + 8 * s;
        for (int m = 0; m < 8; m++) {
            int e0 = 2 * m, e1 = 2 * m + 1;
            int c0 = e0 < 8 ? qs[e0] & 15 : qs[e0 - 8] >> 4;
            int c1 = e1 < 8 ? qs[e1] & 15 : qs[e1 - 8] >> 4;
            oc[8 * s + m] = (uint8_t)(c0 | c1 << 4);
        }
    }
    return -1;
}

nb_status nb_gguf_fp4_to_checkpoint(const nb_gguf_file *g, size_t i, int64_t expert, nb_weight_desc *desc,
                                    uint8_t *codes, size_t codes_cap, uint8_t *scales, size_t scales_cap,
                                    size_t *remapped) {
    nb_gguf_fp4 f;
    NEED(desc && codes && scales, "nb_gguf_fp4_to_checkpoint");
    nb_status st = nb_gguf_fp4_info(g, i, &f);
    if (st != NB_OK) return st;
    const nb_gguf_tensor *t = &g->t[i].pub;
    if (expert < 0 || expert >= (f.experts ? f.experts : 1))
        return nbi_fail(NULL, NB_ERR_INVALID_ARGUMENT, "%s: tensor \"%s\": expert %lld out of range", g->label, t->name,
                        (long long)expert);
    if (codes_cap < f.codes_bytes || scales_cap < f.scales_bytes)
        return nbi_fail(NULL, NB_ERR_BUFFER_TOO_SMALL, "%s: tensor \"%s\" needs %zu code and %zu scale bytes",
                        g->label, t->name, f.codes_bytes, f.scales_bytes);
    if ((st = nb_weight_desc_init(desc, f.format, f.n, f.k)) != NB_OK)
        return nbi_fail(NULL, st, "%s: tensor \"%s\": %s", g->label, t->name, nb_last_error());
    size_t rem = 0;
    /* one ggml block: `elems` elements in `per_block` bytes, elems / group scales */
    const size_t elems = (size_t)k_types[t->type].block, per_block = (size_t)k_types[t->type].bytes;
    const size_t blocks_per_row = (size_t)f.k / elems, spb = elems / (size_t)desc->group_size;
    const uint8_t *src = (const uint8_t *)t->data + (size_t)expert * (size_t)f.n * blocks_per_row * per_block;
    for (size_t r = 0; r < (size_t)f.n; r++)
        for (size_t b = 0; b < blocks_per_row; b++) {
            const uint8_t *blk = src + (r * blocks_per_row + b) * per_block;
            uint8_t *oc = codes + r * (f.codes_bytes / (size_t)f.n) + b * elems / 2;
            uint8_t *os = scales + (r * blocks_per_row + b) * spb;
            if (t->type == NB_GGML_TYPE_MXFP4) {
                import_mxfp4(blk, oc, os);
                continue;
            }
            const int bad = import_nvfp4(blk, oc, os, &rem);
            if (bad >= 0)
                return nbi_fail(NULL, NB_ERR_UNSUPPORTED, "%s: tensor \"%s\": row %zu block %zu: scale byte 0xFF is "
                                "480 to ggml, not an E4M3 value", g->label, t->name, r, b * 4 + (size_t)bad);
        }
    desc->tensor_scale = 1.0f;
    if (f.scale_tensor >= 0) {
        const nb_gguf_tensor *s = &g->t[f.scale_tensor].pub;
        uint64_t el = (uint64_t)s->ne[0] * (uint64_t)s->ne[1] * (uint64_t)s->ne[2] * (uint64_t)s->ne[3];
        uint32_t u = le32((const uint8_t *)s->data + (el == 1 ? 0 : 4 * (size_t)expert));
        memcpy(&desc->tensor_scale, &u, 4);
    }
    /* llama.cpp's quantize_row_mxfp4_ref picks OCP exponents; informative only */
    if (desc->scale_type == NB_SCALE_E8M0) desc->scale_rule = NB_MX_SCALE_OCP;
    if (remapped) *remapped = rem;
    return NB_OK;
}
