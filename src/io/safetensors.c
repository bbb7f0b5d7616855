/* safetensors.c - hardened safetensors reader/writer (see safetensors.h).
 *
 * Reading a file, in order (status in brackets; every message names the
 * file, the tensor when there is one, and the rule):
 *   1. size >= 8                                   [CORRUPT "HeaderTooSmall"]
 *   2. N <= 100,000,000                            [CORRUPT "HeaderTooLarge"]
 *   3. 8 + N <= size, without overflow             [CORRUPT "InvalidHeaderLength"]
 *   4. the header is strict UTF-8                  [CORRUPT]
 *   5. a lexical pass (scan_json) that cJSON does not do: nesting depth, no
 *      raw control characters or \u0000 in strings, nothing but JSON
 *      whitespace and ASCII outside strings, and (header only) every number
 *      written as plain digits of at most 15 (2^48-1 has 15) [CORRUPT]
 *   6. cJSON parses it as one object followed only by whitespace [CORRUPT]
 *   7. each entry: "__metadata__" an object of strings (once); otherwise an
 *      object with exactly dtype (a known string), shape (array of at most
 *      NB_ST_MAX_RANK integers in [0, 2^48-1]) and data_offsets (two such
 *      integers, begin <= end); names at most NB_ST_MAX_NAME bytes [CORRUPT];
 *      product(shape) * bits without overflow [OVERFLOW]; bits % 8 == 0
 *      ("MisalignedSlice") and end - begin == bits / 8 ("TensorInvalidInfo")
 *      [CORRUPT]
 *   8. no duplicate tensor or metadata names (cJSON keeps duplicates, so
 *      names are sorted and compared) [CORRUPT]
 *   9. sorted by offsets: first begin 0, each begin == previous end (gaps and
 *      overlaps named as such) [CORRUPT "InvalidOffset"]
 *  10. last end + 8 + N == size: no trailing bytes, nothing missing [CORRUPT
 *      "MetadataIncompleteBuffer"]
 * Numbers reach cJSON as digit strings of at most 15 digits, so its doubles
 * hold them exactly.
 */
#define _POSIX_C_SOURCE 200809L
#include "io_internal.h"

#include <cjson/cJSON.h>

#include <errno.h>
#include <fcntl.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

/* ------------------------------------------------------------ helpers */

static const struct {
    const char *name;
    nb_st_dtype t;
    int bits;
} k_dtypes[] = {
    {"BOOL", NB_ST_BOOL, 8},         {"U8", NB_ST_U8, 8},
    {"I8", NB_ST_I8, 8},             {"F8_E5M2", NB_ST_F8_E5M2, 8},
    {"F8_E4M3", NB_ST_F8_E4M3, 8},   {"F8_E8M0", NB_ST_F8_E8M0, 8},
    {"F8_E4M3FNUZ", NB_ST_F8_E4M3FNUZ, 8}, {"F8_E5M2FNUZ", NB_ST_F8_E5M2FNUZ, 8},
    {"I16", NB_ST_I16, 16},          {"U16", NB_ST_U16, 16},
    {"F16", NB_ST_F16, 16},          {"BF16", NB_ST_BF16, 16},
    {"I32", NB_ST_I32, 32},          {"U32", NB_ST_U32, 32},
    {"F32", NB_ST_F32, 32},          {"C64", NB_ST_C64, 64},
    {"F64", NB_ST_F64, 64},          {"I64", NB_ST_I64, 64},
    {"U64", NB_ST_U64, 64},          {"F4", NB_ST_F4, 4},
    {"F6_E2M3", NB_ST_F6_E2M3, 6},   {"F6_E3M2", NB_ST_F6_E3M2, 6},
};
#define N_DTYPES (sizeof k_dtypes / sizeof k_dtypes[0])

/* The row of dtype t, or NULL. */
static int dtype_row(nb_st_dtype t) {
    for (size_t i = 0; i < N_DTYPES; i++)
        if (k_dtypes[i].t == t) return (int)i;
    return -1;
}

nb_status nb_st_dtype_parse(const char *s, nb_st_dtype *out) {
    if (!s || !out) return nbi_fail(NULL, NB_ERR_NULL_POINTER, "nb_st_dtype_parse: s and out must not be NULL");
    for (size_t i = 0; i < N_DTYPES; i++)
        if (!strcmp(s, k_dtypes[i].name)) {
            *out = k_dtypes[i].t;
            return NB_OK;
        }
    return nbi_fail(NULL, NB_ERR_NOT_FOUND, "nb_st_dtype_parse: \"%.32s\" is not a safetensors dtype", s);
}

nb_status nb_st_dtype_info(nb_st_dtype t, const char **name, int *bits) {
    const int r = dtype_row(t);
    if (r < 0) return nbi_fail(NULL, NB_ERR_INVALID_ARGUMENT, "nb_st_dtype_info: %d is not an nb_st_dtype", (int)t);
    if (name) *name = k_dtypes[r].name;
    if (bits) *bits = k_dtypes[r].bits;
    return NB_OK;
}

/* Offset of the first byte that breaks strict UTF-8 (no overlong forms, no
 * surrogates, nothing above U+10FFFF), or n when all is valid. */
size_t nbio_utf8_bad(const unsigned char *s, size_t n) {
    size_t i = 0;
    while (i < n) {
        unsigned c = s[i];
        if (c < 0x80) { i++; continue; }
        size_t len;
        unsigned lo = 0x80, hi = 0xBF;
        if (c >= 0xC2 && c <= 0xDF) len = 2;
        else if (c >= 0xE0 && c <= 0xEF) {
            len = 3;
            if (c == 0xE0) lo = 0xA0;      /* overlong */
            if (c == 0xED) hi = 0x9F;      /* surrogates */
        } else if (c >= 0xF0 && c <= 0xF4) {
            len = 4;
            if (c == 0xF0) lo = 0x90;      /* overlong */
            if (c == 0xF4) hi = 0x8F;      /* > U+10FFFF */
        } else return i;
        if (n - i < len) return i;
        if (s[i + 1] < lo || s[i + 1] > hi) return i;
        for (size_t k = 2; k < len; k++)
            if ((s[i + k] & 0xC0) != 0x80) return i;
        i += len;
    }
    return n;
}

/* "tensor \"a\" field \"shape\"" style context from the key stack of
 * scan_json (raw header bytes, cut to 64 each). */
static void key_context(char *buf, size_t len, const unsigned char *s, const size_t (*keys)[2], int depth) {
    buf[0] = 0;
    if (depth >= 1 && keys[0][1] > keys[0][0]) {
        int l1 = (int)(keys[0][1] - keys[0][0]);
        int l2 = depth >= 2 ? (int)(keys[1][1] - keys[1][0]) : 0;
        snprintf(buf, len, "entry \"%.*s\"%s%.*s%s: ", l1 > 64 ? 64 : l1, (const char *)s + keys[0][0],
                 l2 > 0 ? " field \"" : "", l2 > 64 ? 64 : l2, l2 > 0 ? (const char *)s + keys[1][0] : "",
                 l2 > 0 ? "\"" : "");
    }
}

#define SCAN_MAX_DEPTH 32

/* The lexical checks cJSON does not make (item 5 of the list at the top).
 * It tracks only enough structure to name the entry in a message; cJSON
 * checks the grammar afterwards. */
static nb_status scan_json(const char *label, const unsigned char *s, size_t n, int max_depth, int strict_numbers) {
    char stack[SCAN_MAX_DEPTH];
    int expect_key[SCAN_MAX_DEPTH];
    size_t keys[SCAN_MAX_DEPTH][2];
    int depth = 0;
    char ctx[200];
    if (max_depth > SCAN_MAX_DEPTH) max_depth = SCAN_MAX_DEPTH;
    size_t i = 0;
    while (i < n) {
        unsigned char c = s[i];
        if (c == '"') {
            size_t j = i + 1;
            for (;;) {
                if (j >= n) return nbi_fail(NULL, NB_ERR_CORRUPT, "%s: header: unterminated string at byte %zu "
                                            "(rule: header is valid JSON)", label, i);
                unsigned char b = s[j];
                if (b == '"') break;
                if (b < 0x20) {
                    key_context(ctx, sizeof ctx, s, (const size_t(*)[2])keys, depth);
                    return nbi_fail(NULL, NB_ERR_CORRUPT, "%s: header: %sraw control character 0x%02x in a "
                                    "string at byte %zu (rule: strings are valid JSON)", label, ctx, b, j);
                }
                if (b == '\\') {
                    if (j + 1 >= n) { j = n; continue; } /* reported as unterminated next turn */
                    if (s[j + 1] == 'u') {
                        if (n - j < 6) { j = n; continue; }
                        unsigned v = 0;
                        for (size_t h = 2; h < 6; h++) {
                            unsigned char x = s[j + h];
                            v <<= 4;
                            if (x >= '0' && x <= '9') v |= (unsigned)(x - '0');
                            else if ((x | 0x20) >= 'a' && (x | 0x20) <= 'f') v |= (unsigned)((x | 0x20) - 'a' + 10);
                            else return nbi_fail(NULL, NB_ERR_CORRUPT, "%s: header: bad \\u escape at byte "
                                                 "%zu (rule: header is valid JSON)", label, j);
                        }
                        if (v == 0) {
                            key_context(ctx, sizeof ctx, s, (const size_t(*)[2])keys, depth);
                            return nbi_fail(NULL, NB_ERR_CORRUPT, "%s: header: %s\\u0000 in a string at byte "
                                            "%zu (rule: names contain no NUL)", label, ctx, j);
                        }
                        j += 6;
                    } else {
                        j += 2;
                    }
                    continue;
                }
                j++;
            }
            if (depth >= 1 && stack[depth - 1] == '{' && expect_key[depth - 1]) {
                keys[depth - 1][0] = i + 1;
                keys[depth - 1][1] = j;
                expect_key[depth - 1] = 0;
            }
            i = j + 1;
            continue;
        }
        if (c == '{' || c == '[') {
            if (depth >= max_depth)
                return nbi_fail(NULL, NB_ERR_CORRUPT, "%s: header: JSON nested deeper than %d at byte %zu "
                                "(rule: nesting limit)", label, max_depth, i);
            stack[depth] = (char)c;
            expect_key[depth] = c == '{';
            keys[depth][0] = keys[depth][1] = 0;
            depth++;
            i++;
            continue;
        }
        if (c == '}' || c == ']') {
            if (depth == 0 || stack[depth - 1] != (c == '}' ? '{' : '['))
                return nbi_fail(NULL, NB_ERR_CORRUPT, "%s: header: unbalanced '%c' at byte %zu (rule: header "
                                "is valid JSON)", label, c, i);
            depth--;
            i++;
            continue;
        }
        if (c == ',') {
            if (depth >= 1 && stack[depth - 1] == '{') expect_key[depth - 1] = 1;
            i++;
            continue;
        }
        if (c == '-' || (c >= '0' && c <= '9')) {
            size_t j = i;
            while (j < n && (s[j] == '-' || s[j] == '+' || s[j] == '.' || s[j] == 'e' || s[j] == 'E' ||
                             (s[j] >= '0' && s[j] <= '9')))
                j++;
            if (strict_numbers) {
                const char *why = NULL;
                int all_digits = 1;
                for (size_t k = i; k < j; k++)
                    if (s[k] < '0' || s[k] > '9') all_digits = 0;
                if (c == '-') why = "is negative (rule: integers have no sign)";
                else if (!all_digits) why = "is not a plain integer (rule: no fraction, exponent or sign)";
                else if (c == '0' && j - i > 1) why = "has a leading zero (rule: JSON integers)";
                else if (j - i > 15) why = "exceeds 2^48-1 (rule: schema maximum)";
                if (why) {
                    key_context(ctx, sizeof ctx, s, (const size_t(*)[2])keys, depth);
                    int l = (int)(j - i);
                    return nbi_fail(NULL, NB_ERR_CORRUPT, "%s: header: %snumber '%.*s' at byte %zu %s", label,
                                    ctx, l > 40 ? 40 : l, (const char *)s + i, i, why);
                }
            }
            i = j;
            continue;
        }
        if (c >= 0x80 || (c < 0x20 && c != ' ' && c != '\t' && c != '\n' && c != '\r'))
            return nbi_fail(NULL, NB_ERR_CORRUPT, "%s: header: byte 0x%02x outside a string at byte %zu "
                            "(rule: header is valid JSON)", label, c, i);
        i++;
    }
    return NB_OK;
}

/* Parse `len` bytes (with a NUL at text[len]) as one JSON value followed only
 * by whitespace. */
static nb_status parse_json(const char *label, const char *text, size_t len, cJSON **out) {
    const char *end = NULL;
    cJSON *root = cJSON_ParseWithLengthOpts(text, len, &end, 0);
    if (!root) {
        size_t at = (end && end >= text && end <= text + len) ? (size_t)(end - text) : 0;
        return nbi_fail(NULL, NB_ERR_CORRUPT, "%s: header: invalid JSON near byte %zu (rule: header is valid "
                        "JSON)", label, at);
    }
    size_t at = (size_t)(end - text);
    for (; at < len; at++) {
        char c = text[at];
        if (c != ' ' && c != '\t' && c != '\n' && c != '\r') {
            cJSON_Delete(root);
            return nbi_fail(NULL, NB_ERR_CORRUPT, "%s: header: data after the JSON value at byte %zu (rule: "
                            "header is one JSON object, padded with whitespace)", label, at);
        }
    }
    if (!cJSON_IsObject(root)) {
        cJSON_Delete(root);
        return nbi_fail(NULL, NB_ERR_CORRUPT, "%s: header: not a JSON object (rule: header is an object)",
                        label);
    }
    *out = root;
    return NB_OK;
}

/* An integer that scan_json let through: a number in [0, 2^48-1]. */
static int json_uint(const cJSON *v, uint64_t *out) {
    if (!cJSON_IsNumber(v)) return 0;
    double d = v->valuedouble;
    if (!(d >= 0.0) || d > (double)NB_ST_MAX_DIM) return 0;
    uint64_t u = (uint64_t)d;
    if ((double)u != d) return 0;
    *out = u;
    return 1;
}

/* -------------------------------------------------------------- reader */

typedef struct st_meta {
    const char *key, *value;
} st_meta;

struct nb_st_file {
    char *label;
    const unsigned char *base; /* file image */
    size_t size;
    void *map;                 /* mmap'ed region, or NULL for nb_st_open_memory */
    size_t hlen;               /* N */
    char *header;              /* NUL-terminated copy of the header */
    cJSON *root;
    nb_st_tensor *t;           /* sorted by name */
    size_t nt;
    st_meta *m;                /* sorted by key */
    size_t nm;
};

static int cmp_name(const void *a, const void *b) {
    return strcmp(((const nb_st_tensor *)a)->name, ((const nb_st_tensor *)b)->name);
}
static int cmp_meta(const void *a, const void *b) {
    return strcmp(((const st_meta *)a)->key, ((const st_meta *)b)->key);
}
static int cmp_offset(const void *a, const void *b) {
    const nb_st_tensor *x = *(const nb_st_tensor *const *)a, *y = *(const nb_st_tensor *const *)b;
    uint64_t xe = x->offset + x->bytes, ye = y->offset + y->bytes;
    if (x->offset != y->offset) return x->offset < y->offset ? -1 : 1;
    if (xe != ye) return xe < ye ? -1 : 1;
    return strcmp(x->name, y->name);
}

static nb_status parse_metadata(nb_st_file *f, const cJSON *md) {
    if (!cJSON_IsObject(md))
        return nbi_fail(NULL, NB_ERR_CORRUPT, "%s: __metadata__ is not an object (rule: __metadata__ maps "
                        "strings to strings)", f->label);
    size_t n = 0;
    for (const cJSON *c = md->child; c; c = c->next) n++;
    f->m = (st_meta *)calloc(n ? n : 1, sizeof *f->m);
    if (!f->m) return nbi_fail(NULL, NB_ERR_OUT_OF_MEMORY, "%s: out of memory", f->label);
    for (const cJSON *c = md->child; c; c = c->next) {
        if (strlen(c->string) > NB_ST_MAX_NAME)
            return nbi_fail(NULL, NB_ERR_CORRUPT, "%s: __metadata__ key \"%.64s...\" longer than %d bytes "
                            "(rule: name length limit)", f->label, c->string, NB_ST_MAX_NAME);
        if (!cJSON_IsString(c))
            return nbi_fail(NULL, NB_ERR_CORRUPT, "%s: __metadata__ value of \"%.64s\" is not a string (rule: "
                            "__metadata__ maps strings to strings)", f->label, c->string);
        f->m[f->nm].key = c->string;
        f->m[f->nm].value = c->valuestring;
        f->nm++;
    }
    qsort(f->m, f->nm, sizeof *f->m, cmp_meta);
    for (size_t i = 1; i < f->nm; i++)
        if (!strcmp(f->m[i - 1].key, f->m[i].key))
            return nbi_fail(NULL, NB_ERR_CORRUPT, "%s: __metadata__ key \"%.64s\" appears twice (rule: no "
                            "duplicate keys)", f->label, f->m[i].key);
    return NB_OK;
}

static nb_status parse_tensor(nb_st_file *f, const cJSON *e, nb_st_tensor *t) {
    const char *L = f->label, *name = e->string;
    t->name = name;
    if (!cJSON_IsObject(e))
        return nbi_fail(NULL, NB_ERR_CORRUPT, "%s: tensor \"%.64s\": entry is not an object (rule: tensor "
                        "info is {dtype, shape, data_offsets})", L, name);
    const cJSON *dt = NULL, *sh = NULL, *off = NULL;
    for (const cJSON *c = e->child; c; c = c->next) {
        const cJSON **slot = !strcmp(c->string, "dtype") ? &dt
                             : !strcmp(c->string, "shape") ? &sh
                             : !strcmp(c->string, "data_offsets") ? &off : NULL;
        if (!slot)
            return nbi_fail(NULL, NB_ERR_CORRUPT, "%s: tensor \"%.64s\": unknown field \"%.64s\" (rule: "
                            "tensor info is {dtype, shape, data_offsets})", L, name, c->string);
        if (*slot)
            return nbi_fail(NULL, NB_ERR_CORRUPT, "%s: tensor \"%.64s\": field \"%s\" appears twice (rule: no "
                            "duplicate keys)", L, name, c->string);
        *slot = c;
    }
    if (!dt || !sh || !off)
        return nbi_fail(NULL, NB_ERR_CORRUPT, "%s: tensor \"%.64s\": missing field \"%s\" (rule: tensor info "
                        "is {dtype, shape, data_offsets})", L, name, !dt ? "dtype" : !sh ? "shape" : "data_offsets");
    int row = -1;
    for (size_t i = 0; cJSON_IsString(dt) && i < N_DTYPES && row < 0; i++)
        if (!strcmp(dt->valuestring, k_dtypes[i].name)) row = (int)i;
    if (row < 0)
        return nbi_fail(NULL, NB_ERR_CORRUPT, "%s: tensor \"%.64s\": unknown dtype \"%.32s\" (rule: known "
                        "dtype strings only)", L, name, cJSON_IsString(dt) ? dt->valuestring : "(not a string)");
    t->dtype = k_dtypes[row].t;
    const int bits = k_dtypes[row].bits;
    if (!cJSON_IsArray(sh))
        return nbi_fail(NULL, NB_ERR_CORRUPT, "%s: tensor \"%.64s\": shape is not an array (rule: shape is "
                        "an array of non-negative integers)", L, name);
    uint64_t count = 1;
    int overflow = 0;
    for (const cJSON *c = sh->child; c; c = c->next) {
        uint64_t d;
        if (t->rank >= NB_ST_MAX_RANK)
            return nbi_fail(NULL, NB_ERR_CORRUPT, "%s: tensor \"%.64s\": rank above %d (rule: rank limit)", L,
                            name, NB_ST_MAX_RANK);
        if (!json_uint(c, &d))
            return nbi_fail(NULL, NB_ERR_CORRUPT, "%s: tensor \"%.64s\": shape[%d] is not an integer in "
                            "[0, 2^48-1] (rule: shape is an array of non-negative integers)", L, name, t->rank);
        t->shape[t->rank++] = (int64_t)d;
        if (__builtin_mul_overflow(count, d, &count)) overflow = 1;
    }
    if (!cJSON_IsArray(off) || cJSON_GetArraySize(off) != 2)
        return nbi_fail(NULL, NB_ERR_CORRUPT, "%s: tensor \"%.64s\": data_offsets is not an array of two "
                        "integers (rule: data_offsets = [begin, end])", L, name);
    uint64_t begin, end;
    if (!json_uint(off->child, &begin) || !json_uint(off->child->next, &end))
        return nbi_fail(NULL, NB_ERR_CORRUPT, "%s: tensor \"%.64s\": data_offsets entries are not integers in "
                        "[0, 2^48-1] (rule: data_offsets = [begin, end])", L, name);
    if (end < begin)
        return nbi_fail(NULL, NB_ERR_CORRUPT, "%s: tensor \"%.64s\": data_offsets end %llu < begin %llu "
                        "(rule: end >= begin, InvalidOffset)", L, name, (unsigned long long)end,
                        (unsigned long long)begin);
    uint64_t nbits;
    if (overflow || __builtin_mul_overflow(count, (uint64_t)bits, &nbits))
        return nbi_fail(NULL, NB_ERR_OVERFLOW, "%s: tensor \"%.64s\": product of shape x %d bits overflows "
                        "64 bits (rule: ValidationOverflow)", L, name, bits);
    if (nbits % 8)
        return nbi_fail(NULL, NB_ERR_CORRUPT, "%s: tensor \"%.64s\": %llu elements x %d bits is not a whole "
                        "number of bytes (rule: MisalignedSlice)", L, name, (unsigned long long)count, bits);
    if (end - begin != nbits / 8)
        return nbi_fail(NULL, NB_ERR_CORRUPT, "%s: tensor \"%.64s\": data_offsets span %llu bytes, shape and "
                        "dtype need %llu (rule: end - begin == bytes, TensorInvalidInfo)", L, name,
                        (unsigned long long)(end - begin), (unsigned long long)(nbits / 8));
    t->offset = begin;
    t->bytes = (size_t)(nbits / 8);
    return NB_OK;
}

static nb_status validate(nb_st_file *f) {
    const char *L = f->label;
    if (f->size < 8)
        return nbi_fail(NULL, NB_ERR_CORRUPT, "%s: file is %zu bytes (rule: at least 8, HeaderTooSmall)", L,
                        f->size);
    uint64_t n = 0;
    for (int i = 7; i >= 0; i--) n = (n << 8) | f->base[i];
    if (n > NB_ST_MAX_HEADER)
        return nbi_fail(NULL, NB_ERR_CORRUPT, "%s: header length %llu exceeds %llu (rule: HeaderTooLarge)", L,
                        (unsigned long long)n, NB_ST_MAX_HEADER);
    /* n <= 1e8, so 8 + n cannot overflow; compare without subtracting. */
    if (8 + n > (uint64_t)f->size)
        return nbi_fail(NULL, NB_ERR_CORRUPT, "%s: header length %llu + 8 exceeds the file size %zu (rule: "
                        "InvalidHeaderLength)", L, (unsigned long long)n, f->size);
    f->hlen = (size_t)n;
    const unsigned char *h = f->base + 8;
    size_t bad = nbio_utf8_bad(h, f->hlen);
    if (bad != f->hlen)
        return nbi_fail(NULL, NB_ERR_CORRUPT, "%s: header: invalid UTF-8 at byte %zu (rule: header is UTF-8)",
                        L, bad);
    nb_status st = scan_json(L, h, f->hlen, NB_ST_MAX_DEPTH, 1);
    if (st) return st;
    f->header = (char *)malloc(f->hlen + 1);
    if (!f->header) return nbi_fail(NULL, NB_ERR_OUT_OF_MEMORY, "%s: out of memory for the header", L);
    memcpy(f->header, h, f->hlen);
    f->header[f->hlen] = 0;
    st = parse_json(L, f->header, f->hlen, &f->root);
    if (st) return st;

    size_t entries = 0;
    for (const cJSON *c = f->root->child; c; c = c->next) entries++;
    f->t = (nb_st_tensor *)calloc(entries ? entries : 1, sizeof *f->t);
    if (!f->t) return nbi_fail(NULL, NB_ERR_OUT_OF_MEMORY, "%s: out of memory", L);
    const cJSON *md = NULL;
    for (const cJSON *c = f->root->child; c; c = c->next) {
        if (strlen(c->string) > NB_ST_MAX_NAME)
            return nbi_fail(NULL, NB_ERR_CORRUPT, "%s: tensor \"%.64s...\": name longer than %d bytes (rule: "
                            "name length limit)", L, c->string, NB_ST_MAX_NAME);
        if (!strcmp(c->string, "__metadata__")) {
            if (md)
                return nbi_fail(NULL, NB_ERR_CORRUPT, "%s: __metadata__ appears twice (rule: no duplicate "
                                "keys)", L);
            md = c;
            if ((st = parse_metadata(f, c))) return st;
            continue;
        }
        if ((st = parse_tensor(f, c, &f->t[f->nt]))) return st;
        f->nt++;
    }
    if (!f->m && !(f->m = (st_meta *)calloc(1, sizeof *f->m)))
        return nbi_fail(NULL, NB_ERR_OUT_OF_MEMORY, "%s: out of memory", L);

    qsort(f->t, f->nt, sizeof *f->t, cmp_name);
    for (size_t i = 1; i < f->nt; i++)
        if (!strcmp(f->t[i - 1].name, f->t[i].name))
            return nbi_fail(NULL, NB_ERR_CORRUPT, "%s: tensor \"%.64s\": name appears twice (rule: no duplicate "
                            "tensor names)", L, f->t[i].name);

    nb_st_tensor **by = (nb_st_tensor **)malloc((f->nt ? f->nt : 1) * sizeof *by);
    if (!by) return nbi_fail(NULL, NB_ERR_OUT_OF_MEMORY, "%s: out of memory", L);
    for (size_t i = 0; i < f->nt; i++) by[i] = &f->t[i];
    qsort(by, f->nt, sizeof *by, cmp_offset);
    uint64_t pos = 0; /* end of the previous tensor; every offset <= 2^48-1, so no sum overflows */
    for (size_t i = 0; i < f->nt; i++) {
        const nb_st_tensor *t = by[i];
        if (t->offset != pos) {
            if (i == 0)
                st = nbi_fail(NULL, NB_ERR_CORRUPT, "%s: tensor \"%.64s\": first data offset is %llu, not 0 "
                              "(rule: InvalidOffset)", L, t->name, (unsigned long long)t->offset);
            else
                st = nbi_fail(NULL, NB_ERR_CORRUPT, "%s: tensor \"%.64s\": begins at %llu but \"%.64s\" ends at "
                              "%llu: %s (rule: tensors are contiguous, InvalidOffset)", L, t->name,
                              (unsigned long long)t->offset, by[i - 1]->name, (unsigned long long)pos,
                              t->offset > pos ? "gap" : "overlap");
            free(by);
            return st;
        }
        pos = t->offset + t->bytes;
    }
    free(by);
    uint64_t buffer = (uint64_t)f->size - 8 - n;
    if (pos != buffer)
        return nbi_fail(NULL, NB_ERR_CORRUPT, "%s: tensors cover %llu bytes of a %llu-byte data buffer: %s "
                        "(rule: last end + 8 + N == file size, MetadataIncompleteBuffer)", L, (unsigned long long)pos,
                        (unsigned long long)buffer, pos < buffer ? "trailing bytes" : "data missing");
    const unsigned char *data = f->base + 8 + f->hlen;
    for (size_t i = 0; i < f->nt; i++) f->t[i].data = data + f->t[i].offset;
    return NB_OK;
}

nb_status nb_st_close(nb_st_file *f) {
    if (!f) return NB_OK;
    if (f->map) munmap(f->map, f->size);
    cJSON_Delete(f->root);
    free(f->header);
    free(f->t);
    free(f->m);
    free(f->label);
    free(f);
    return NB_OK;
}

static nb_status open_common(nb_st_file *f, nb_st_file **out) {
    nb_status st = validate(f);
    if (st) {
        nb_st_close(f);
        return st;
    }
    *out = f;
    return NB_OK;
}

nb_status nb_st_open_memory(const void *data, size_t size, const char *label, nb_st_file **out) {
    if (!out) return nbi_fail(NULL, NB_ERR_NULL_POINTER, "nb_st_open_memory: out is NULL");
    *out = NULL;
    if (!data && size) return nbi_fail(NULL, NB_ERR_NULL_POINTER, "nb_st_open_memory: data is NULL");
    nb_st_file *f = (nb_st_file *)calloc(1, sizeof *f);
    if (!f || !(f->label = nbio_strdup(label ? label : "<memory>"))) {
        free(f);
        return nbi_fail(NULL, NB_ERR_OUT_OF_MEMORY, "nb_st_open_memory: out of memory");
    }
    f->base = (const unsigned char *)data;
    f->size = size;
    return open_common(f, out);
}

nb_status nb_st_open(const char *path, nb_st_file **out) {
    if (!out) return nbi_fail(NULL, NB_ERR_NULL_POINTER, "nb_st_open: out is NULL");
    *out = NULL;
    if (!path) return nbi_fail(NULL, NB_ERR_NULL_POINTER, "nb_st_open: path is NULL");
    void *map = NULL;
    size_t size = 0;
    nb_status st = nbio_map_file(path, 8, &map, &size);
    if (st != NB_OK) return st;
    nb_st_file *f = (nb_st_file *)calloc(1, sizeof *f);
    if (!f || !(f->label = nbio_strdup(path))) {
        free(f);
        if (map) munmap(map, size);
        return nbi_fail(NULL, NB_ERR_OUT_OF_MEMORY, "%s: out of memory", path);
    }
    static const unsigned char empty[1] = {0};
    f->size = size;
    f->map = map;
    f->base = map ? (const unsigned char *)map : empty; /* files under 8 bytes are not mapped: validate rejects them */
    return open_common(f, out);
}

nb_status nbio_map_file(const char *path, size_t min_size, void **map, size_t *size) {
    *map = NULL;
    *size = 0;
    int fd;
    uint64_t bytes = 0;
    nb_status st = nbio_open_regular(path, &fd, &bytes);
    if (st != NB_OK) return st;
    if (bytes > (uint64_t)SIZE_MAX) {
        close(fd);
        return nbi_fail(NULL, NB_ERR_OVERFLOW, "%s: file size does not fit in size_t", path);
    }
    *size = (size_t)bytes;
    if (*size >= min_size && *size > 0) {
        void *m = mmap(NULL, *size, PROT_READ, MAP_PRIVATE, fd, 0);
        if (m == MAP_FAILED) {
            int e = errno;
            close(fd);
            return nbi_fail(NULL, NB_ERR_IO, "%s: mmap of %zu bytes: %s", path, *size, strerror(e));
        }
        *map = m;
    }
    close(fd); /* the mapping keeps the file */
    return NB_OK;
}

nb_status nb_st_count(const nb_st_file *f, size_t *count) {
    if (!f || !count) return nbi_fail(NULL, NB_ERR_NULL_POINTER, "nb_st_count: f and count must not be NULL");
    *count = f->nt;
    return NB_OK;
}

nb_status nb_st_tensor_at(const nb_st_file *f, size_t i, nb_st_tensor *out) {
    if (!f || !out) return nbi_fail(NULL, NB_ERR_NULL_POINTER, "nb_st_tensor_at: NULL argument");
    if (i >= f->nt)
        return nbi_fail(NULL, NB_ERR_NOT_FOUND, "%s: tensor index %zu out of range (%zu tensors)", f->label, i,
                        f->nt);
    *out = f->t[i];
    return NB_OK;
}

const nb_st_tensor *nbio_st_lookup(const nb_st_file *f, const char *name) {
    nb_st_tensor key;
    memset(&key, 0, sizeof key);
    key.name = name;
    return (const nb_st_tensor *)bsearch(&key, f->t, f->nt, sizeof *f->t, cmp_name);
}

nb_status nb_st_tensor_find(const nb_st_file *f, const char *name, nb_st_tensor *out) {
    if (!f || !name || !out) return nbi_fail(NULL, NB_ERR_NULL_POINTER, "nb_st_tensor_find: NULL argument");
    const nb_st_tensor *t = nbio_st_lookup(f, name);
    if (!t) return nbi_fail(NULL, NB_ERR_NOT_FOUND, "%s: no tensor \"%.200s\"", f->label, name);
    *out = *t;
    return NB_OK;
}

nb_status nb_st_metadata_count(const nb_st_file *f, size_t *count) {
    if (!f || !count) return nbi_fail(NULL, NB_ERR_NULL_POINTER, "nb_st_metadata_count: f and count must not be NULL");
    *count = f->nm;
    return NB_OK;
}

nb_status nb_st_metadata_at(const nb_st_file *f, size_t i, const char **key, const char **value) {
    if (!f) return nbi_fail(NULL, NB_ERR_NULL_POINTER, "nb_st_metadata_at: file is NULL");
    if (i >= f->nm)
        return nbi_fail(NULL, NB_ERR_NOT_FOUND, "%s: metadata index %zu out of range (%zu entries)", f->label,
                        i, f->nm);
    if (key) *key = f->m[i].key;
    if (value) *value = f->m[i].value;
    return NB_OK;
}

nb_status nb_st_metadata_get(const nb_st_file *f, const char *key, const char **value) {
    if (!f || !key || !value) return nbi_fail(NULL, NB_ERR_NULL_POINTER, "nb_st_metadata_get: NULL argument");
    st_meta k = {key, NULL};
    const st_meta *m = (const st_meta *)bsearch(&k, f->m, f->nm, sizeof *f->m, cmp_meta);
    if (!m) return nbi_fail(NULL, NB_ERR_NOT_FOUND, "%s: no __metadata__ key \"%.200s\"", f->label, key);
    *value = m->value;
    return NB_OK;
}

/* -------------------------------------------------------------- writer */

typedef struct sbuf {
    char *p;
    size_t len, cap;
    int oom;
} sbuf;

static void sb_put(sbuf *b, const char *s, size_t n) {
    if (b->oom) return;
    if (b->len + n + 1 > b->cap) {
        size_t cap = b->cap ? b->cap : 256;
        while (cap < b->len + n + 1) cap *= 2;
        char *p = (char *)realloc(b->p, cap);
        if (!p) { b->oom = 1; return; }
        b->p = p;
        b->cap = cap;
    }
    memcpy(b->p + b->len, s, n);
    b->len += n;
    b->p[b->len] = 0;
}
static void sb_str(sbuf *b, const char *s) { sb_put(b, s, strlen(s)); }
static void sb_json(sbuf *b, const char *s) { /* a JSON string literal; s is valid UTF-8 */
    sb_put(b, "\"", 1);
    for (; *s; s++) {
        unsigned char c = (unsigned char)*s;
        char esc[8];
        if (c == '"' || c == '\\') { esc[0] = '\\'; esc[1] = (char)c; sb_put(b, esc, 2); }
        else if (c < 0x20) { snprintf(esc, sizeof esc, "\\u%04x", c); sb_put(b, esc, 6); }
        else sb_put(b, (const char *)&c, 1);
    }
    sb_put(b, "\"", 1);
}
static void sb_u64(sbuf *b, uint64_t v) {
    char t[24];
    snprintf(t, sizeof t, "%llu", (unsigned long long)v);
    sb_str(b, t);
}

typedef struct wt {
    const nb_st_tensor *t;
    int bits;
    uint64_t begin;
} wt;

static int cmp_wt_name(const void *a, const void *b) {
    return strcmp(((const wt *)a)->t->name, ((const wt *)b)->t->name);
}
/* The reference writer's order: descending dtype (by size), then name. */
static int cmp_wt_layout(const void *a, const void *b) {
    const wt *x = (const wt *)a, *y = (const wt *)b;
    if (x->bits != y->bits) return x->bits > y->bits ? -1 : 1;
    return strcmp(x->t->name, y->t->name);
}

static int write_all(int fd, const void *p, size_t n) {
    const char *c = (const char *)p;
    while (n) {
        ssize_t w = write(fd, c, n > (1u << 30) ? (1u << 30) : n);
        if (w < 0) {
            if (errno == EINTR) continue;
            return -1;
        }
        c += w;
        n -= (size_t)w;
    }
    return 0;
}

static int utf8_ok(const char *s) {
    size_t n = strlen(s);
    return nbio_utf8_bad((const unsigned char *)s, n) == n;
}

/* Stage 1 of nb_st_write: the metadata pairs - strings, UTF-8, key length,
 * no key twice. */
static nb_status check_meta(const char *path, const char *const *meta, size_t npairs) {
    for (size_t i = 0; i < 2 * npairs; i++) {
        if (!meta[i]) return nbi_fail(NULL, NB_ERR_NULL_POINTER, "%s: metadata string %zu is NULL", path, i);
        if (!utf8_ok(meta[i]))
            return nbi_fail(NULL, NB_ERR_INVALID_ARGUMENT, "%s: metadata string %zu is not UTF-8", path, i);
        if (i % 2 == 0 && strlen(meta[i]) > NB_ST_MAX_NAME)
            return nbi_fail(NULL, NB_ERR_INVALID_ARGUMENT, "%s: metadata key %zu longer than %d bytes", path, i / 2,
                            NB_ST_MAX_NAME);
        if (i % 2 == 0)
            for (size_t j = 0; j < i; j += 2)
                if (!strcmp(meta[j], meta[i]))
                    return nbi_fail(NULL, NB_ERR_INVALID_ARGUMENT, "%s: metadata key \"%.64s\" given twice", path,
                                    meta[i]);
    }
    return NB_OK;
}

/* Stage 2: tensor i - its name, dtype (bits into w), rank, shape, byte
 * count, data, reserved fields. */
static nb_status check_tensor(const char *path, const nb_st_tensor *t, size_t i, wt *w) {
    const char *nm = t->name ? t->name : "(null)";
    w->t = t;
    if (!t->name || !t->name[0] || strlen(t->name) > NB_ST_MAX_NAME || !strcmp(t->name, "__metadata__") ||
        !utf8_ok(t->name))
        return nbi_fail(NULL, NB_ERR_INVALID_ARGUMENT, "%s: tensor %zu \"%.64s\": name is NULL, empty, longer than %d "
                        "bytes, \"__metadata__\" or not UTF-8", path, i, nm, NB_ST_MAX_NAME);
    const int row = dtype_row(t->dtype);
    if (row < 0)
        return nbi_fail(NULL, NB_ERR_INVALID_ARGUMENT, "%s: tensor \"%.64s\": unknown dtype %d", path, nm,
                        (int)t->dtype);
    w->bits = k_dtypes[row].bits;
    if (t->rank < 0 || t->rank > NB_ST_MAX_RANK)
        return nbi_fail(NULL, NB_ERR_INVALID_ARGUMENT, "%s: tensor \"%.64s\": rank %d outside 0..%d", path, nm, t->rank,
                        NB_ST_MAX_RANK);
    uint64_t elems = 1, nbits;
    for (int d = 0; d < t->rank; d++) {
        if (t->shape[d] < 0 || (uint64_t)t->shape[d] > NB_ST_MAX_DIM)
            return nbi_fail(NULL, NB_ERR_INVALID_ARGUMENT, "%s: tensor \"%.64s\": shape[%d] = %lld outside "
                            "[0, 2^48-1]", path, nm, d, (long long)t->shape[d]);
        if (__builtin_mul_overflow(elems, (uint64_t)t->shape[d], &elems))
            return nbi_fail(NULL, NB_ERR_OVERFLOW, "%s: tensor \"%.64s\": element count overflows", path, nm);
    }
    if (__builtin_mul_overflow(elems, (uint64_t)w->bits, &nbits))
        return nbi_fail(NULL, NB_ERR_OVERFLOW, "%s: tensor \"%.64s\": size in bits overflows", path, nm);
    if (nbits % 8)
        return nbi_fail(NULL, NB_ERR_INVALID_ARGUMENT, "%s: tensor \"%.64s\": %llu elements x %d bits is not whole "
                        "bytes", path, nm, (unsigned long long)elems, w->bits);
    if (nbits / 8 != (uint64_t)t->bytes)
        return nbi_fail(NULL, NB_ERR_INVALID_ARGUMENT, "%s: tensor \"%.64s\": bytes %zu, shape and dtype need %llu",
                        path, nm, t->bytes, (unsigned long long)(nbits / 8));
    if (t->bytes && !t->data)
        return nbi_fail(NULL, NB_ERR_NULL_POINTER, "%s: tensor \"%.64s\": data is NULL", path, nm);
    if (!nbio_reserved_zero(t->reserved, sizeof t->reserved / sizeof t->reserved[0]))
        return nbi_fail(NULL, NB_ERR_INVALID_ARGUMENT, "%s: tensor \"%.64s\": reserved fields are not zero", path, nm);
    return NB_OK;
}

/* Stage 3: no name twice, then the reference writer's order and the
 * offsets (the data buffer within 2^48-1 bytes). */
static nb_status layout_tensors(const char *path, wt *w, size_t count) {
    qsort(w, count, sizeof *w, cmp_wt_name);
    for (size_t i = 1; i < count; i++)
        if (!strcmp(w[i - 1].t->name, w[i].t->name))
            return nbi_fail(NULL, NB_ERR_INVALID_ARGUMENT, "%s: tensor name \"%.64s\" given twice", path,
                            w[i].t->name);
    qsort(w, count, sizeof *w, cmp_wt_layout);
    uint64_t pos = 0;
    for (size_t i = 0; i < count; i++) {
        w[i].begin = pos;
        if (__builtin_add_overflow(pos, (uint64_t)w[i].t->bytes, &pos) || pos > NB_ST_MAX_DIM)
            return nbi_fail(NULL, NB_ERR_OVERFLOW, "%s: data buffer exceeds 2^48-1 bytes", path);
    }
    return NB_OK;
}

/* Stage 4: the header - __metadata__ with "format" first, then the tensors
 * in data order, space-padded to a multiple of 8. */
static nb_status build_header(const char *path, const wt *w, size_t count, const char *const *meta, size_t npairs,
                              sbuf *h) {
    sb_str(h, "{\"__metadata__\":{\"format\":");
    const char *fmt = "pt";
    for (size_t i = 0; i < npairs; i++)
        if (!strcmp(meta[2 * i], "format")) fmt = meta[2 * i + 1];
    sb_json(h, fmt);
    for (size_t i = 0; i < npairs; i++) {
        if (!strcmp(meta[2 * i], "format")) continue;
        sb_str(h, ",");
        sb_json(h, meta[2 * i]);
        sb_str(h, ":");
        sb_json(h, meta[2 * i + 1]);
    }
    sb_str(h, "}");
    for (size_t i = 0; i < count; i++) {
        sb_str(h, ",");
        sb_json(h, w[i].t->name);
        sb_str(h, ":{\"dtype\":\"");
        sb_str(h, k_dtypes[dtype_row(w[i].t->dtype)].name); /* checked by check_tensor */
        sb_str(h, "\",\"shape\":[");
        for (int d = 0; d < w[i].t->rank; d++) {
            if (d) sb_str(h, ",");
            sb_u64(h, (uint64_t)w[i].t->shape[d]);
        }
        sb_str(h, "],\"data_offsets\":[");
        sb_u64(h, w[i].begin);
        sb_str(h, ",");
        sb_u64(h, w[i].begin + w[i].t->bytes);
        sb_str(h, "]}");
    }
    sb_str(h, "}");
    while (!h->oom && h->len % 8) sb_str(h, " ");
    if (h->oom) return nbi_fail(NULL, NB_ERR_OUT_OF_MEMORY, "%s: out of memory for the header", path);
    if (h->len > NB_ST_MAX_HEADER)
        return nbi_fail(NULL, NB_ERR_INVALID_ARGUMENT, "%s: header of %zu bytes exceeds %llu", path, h->len,
                        NB_ST_MAX_HEADER);
    return NB_OK;
}

/* Stage 5: "<path>.tmp.XXXXXX" with the length, header and data, fsync'ed
 * (mode 0644) and renamed over path; removed on any failure. */
static nb_status write_file_atomic(const char *path, const sbuf *h, const wt *w, size_t count) {
    size_t plen = strlen(path);
    char *tmp = (char *)malloc(plen + 16);
    if (!tmp) return nbi_fail(NULL, NB_ERR_OUT_OF_MEMORY, "%s: out of memory", path);
    memcpy(tmp, path, plen);
    memcpy(tmp + plen, ".tmp.XXXXXX", 12);
    nb_status st = NB_OK;
    int fd = mkstemp(tmp);
    if (fd < 0) {
        st = nbi_fail(NULL, NB_ERR_IO, "%s: cannot create a temporary file: %s", path, strerror(errno));
    } else {
        unsigned char len8[8];
        for (int i = 0; i < 8; i++) len8[i] = (unsigned char)((uint64_t)h->len >> (8 * i));
        int bad = write_all(fd, len8, 8) || write_all(fd, h->p, h->len);
        for (size_t i = 0; i < count && !bad; i++) bad = write_all(fd, w[i].t->data, w[i].t->bytes);
        if (!bad) bad = fchmod(fd, 0644) || fsync(fd);
        int e = errno;
        if (close(fd) && !bad) { bad = 1; e = errno; }
        if (!bad && rename(tmp, path)) { bad = 1; e = errno; }
        if (bad) {
            unlink(tmp);
            st = nbi_fail(NULL, NB_ERR_IO, "%s: write failed: %s", path, strerror(e));
        }
    }
    free(tmp);
    return st;
}

nb_status nb_st_write(const char *path, const nb_st_tensor *tensors, size_t count, const char *const *meta,
                      size_t npairs) {
    if (!path) return nbi_fail(NULL, NB_ERR_NULL_POINTER, "nb_st_write: path is NULL");
    if (count && !tensors) return nbi_fail(NULL, NB_ERR_NULL_POINTER, "%s: tensors is NULL", path);
    if (npairs && !meta) return nbi_fail(NULL, NB_ERR_NULL_POINTER, "%s: metadata is NULL", path);
    nb_status st = check_meta(path, meta, npairs);
    if (st != NB_OK) return st;
    wt *w = (wt *)calloc(count ? count : 1, sizeof *w);
    if (!w) return nbi_fail(NULL, NB_ERR_OUT_OF_MEMORY, "%s: out of memory", path);
    for (size_t i = 0; i < count && st == NB_OK; i++) st = check_tensor(path, &tensors[i], i, &w[i]);
    if (st == NB_OK) st = layout_tensors(path, w, count);
    sbuf h = {0};
    if (st == NB_OK) st = build_header(path, w, count, meta, npairs, &h);
    if (st == NB_OK) st = write_file_atomic(path, &h, w, count);
    free(h.p);
    free(w);
    return st;
}

/* --------------------------------------------------------------- index */

typedef struct st_entry {
    const char *name, *shard;
    size_t shard_idx;
} st_entry;

typedef struct st_shard {
    const char *name;
    nb_st_file *f;
} st_shard;

struct nb_st_index {
    char *label;
    char *text;
    cJSON *root;
    st_entry *e; /* sorted by name */
    size_t ne;
    st_shard *s; /* sorted by name */
    size_t ns;
};

static int cmp_entry(const void *a, const void *b) {
    return strcmp(((const st_entry *)a)->name, ((const st_entry *)b)->name);
}
static int cmp_entry_shard(const void *a, const void *b) {
    return strcmp(*(const char *const *)a, *(const char *const *)b);
}
static int cmp_shard(const void *a, const void *b) {
    return strcmp(((const st_shard *)a)->name, ((const st_shard *)b)->name);
}

nb_status nb_st_index_close(nb_st_index *x) {
    if (!x) return NB_OK;
    for (size_t i = 0; i < x->ns; i++) nb_st_close(x->s[i].f);
    free(x->s);
    free(x->e);
    cJSON_Delete(x->root);
    free(x->text);
    free(x->label);
    free(x);
    return NB_OK;
}

/* A shard name that cannot leave the index's directory. */
static const char *shard_name_problem(const char *s) {
    if (!s[0]) return "is empty";
    if (strchr(s, '/')) return "contains '/' (absolute or not a plain basename)";
    if (strchr(s, '\\')) return "contains '\\'";
    if (strstr(s, "..")) return "contains \"..\"";
    if (!strcmp(s, ".")) return "is \".\"";
    if (strlen(s) > 255) return "is longer than 255 bytes";
    return NULL;
}

static nb_status read_small_file(const char *path, char **text, size_t *len) {
    int fd;
    uint64_t bytes = 0;
    nb_status st = nbio_open_regular(path, &fd, &bytes);
    if (st != NB_OK) return st;
    if (bytes > NB_ST_MAX_HEADER) {
        close(fd);
        return nbi_fail(NULL, NB_ERR_CORRUPT, "%s: index file of %llu bytes exceeds %llu (rule: size limit)",
                        path, (unsigned long long)bytes, NB_ST_MAX_HEADER);
    }
    size_t n = (size_t)bytes, got = 0;
    char *p = (char *)malloc(n + 1);
    if (!p) {
        close(fd);
        return nbi_fail(NULL, NB_ERR_OUT_OF_MEMORY, "%s: out of memory", path);
    }
    while (got < n) {
        ssize_t r = read(fd, p + got, n - got);
        if (r < 0 && errno == EINTR) continue;
        if (r <= 0) {
            free(p);
            close(fd);
            return nbi_fail(NULL, NB_ERR_IO, "%s: read failed or file shrank", path);
        }
        got += (size_t)r;
    }
    close(fd);
    p[n] = 0;
    *text = p;
    *len = n;
    return NB_OK;
}

/* Validate x->text (len bytes) and build the entry and shard lists. */
static nb_status index_parse(nb_st_index *x, size_t len) {
    const char *L = x->label;
    nb_status st;
    size_t bad = nbio_utf8_bad((const unsigned char *)x->text, len);
    if (bad != len)
        return nbi_fail(NULL, NB_ERR_CORRUPT, "%s: invalid UTF-8 at byte %zu (rule: index is UTF-8 JSON)", L,
                        bad);
    if ((st = scan_json(L, (const unsigned char *)x->text, len, 16, 0))) return st;
    if ((st = parse_json(L, x->text, len, &x->root))) return st;
    const cJSON *wm = NULL, *md = NULL;
    for (const cJSON *c = x->root->child; c; c = c->next) {
        const cJSON **slot = !strcmp(c->string, "weight_map") ? &wm : !strcmp(c->string, "metadata") ? &md : NULL;
        if (!slot) continue; /* other top-level keys are ignored, as transformers does */
        if (*slot)
            return nbi_fail(NULL, NB_ERR_CORRUPT, "%s: \"%s\" appears twice (rule: no duplicate keys)", L,
                            c->string);
        *slot = c;
    }
    if (md && !cJSON_IsObject(md))
        return nbi_fail(NULL, NB_ERR_CORRUPT, "%s: \"metadata\" is not an object (rule: index format)", L);
    if (!wm || !cJSON_IsObject(wm))
        return nbi_fail(NULL, NB_ERR_CORRUPT, "%s: \"weight_map\" missing or not an object (rule: index "
                        "format)", L);
    size_t n = 0;
    for (const cJSON *c = wm->child; c; c = c->next) n++;
    x->e = (st_entry *)calloc(n ? n : 1, sizeof *x->e);
    const char **names = (const char **)calloc(n ? n : 1, sizeof *names);
    if (!x->e || !names) {
        free(names);
        return nbi_fail(NULL, NB_ERR_OUT_OF_MEMORY, "%s: out of memory", L);
    }
    for (const cJSON *c = wm->child; c; c = c->next) {
        const char *why = cJSON_IsString(c) ? shard_name_problem(c->valuestring) : "is not a string";
        if (why) {
            free(names);
            return nbi_fail(NULL, NB_ERR_CORRUPT, "%s: tensor \"%.64s\": shard name \"%.64s\" %s (rule: shard "
                            "names are plain basenames)", L, c->string, cJSON_IsString(c) ? c->valuestring : "",
                            why);
        }
        x->e[x->ne].name = c->string;
        x->e[x->ne].shard = c->valuestring;
        names[x->ne] = c->valuestring;
        x->ne++;
    }
    qsort(x->e, x->ne, sizeof *x->e, cmp_entry);
    for (size_t i = 1; i < x->ne; i++)
        if (!strcmp(x->e[i - 1].name, x->e[i].name)) {
            free(names);
            return nbi_fail(NULL, NB_ERR_CORRUPT, "%s: tensor \"%.64s\" listed twice in weight_map (rule: no "
                            "name twice)", L, x->e[i].name);
        }
    qsort(names, x->ne, sizeof *names, cmp_entry_shard);
    x->s = (st_shard *)calloc(x->ne ? x->ne : 1, sizeof *x->s);
    if (!x->s) {
        free(names);
        return nbi_fail(NULL, NB_ERR_OUT_OF_MEMORY, "%s: out of memory", L);
    }
    for (size_t i = 0; i < x->ne; i++)
        if (!x->ns || strcmp(x->s[x->ns - 1].name, names[i])) x->s[x->ns++].name = names[i];
    free(names);
    for (size_t i = 0; i < x->ne; i++) {
        st_shard key = {x->e[i].shard, NULL};
        x->e[i].shard_idx = (size_t)((const st_shard *)bsearch(&key, x->s, x->ns, sizeof *x->s, cmp_shard) - x->s);
    }
    return NB_OK;
}

static nb_status index_load(nb_st_index *x, const char *dir) {
    const char *L = x->label;
    size_t len = 0;
    nb_status st = read_small_file(L, &x->text, &len);
    if (st) return st;
    if ((st = index_parse(x, len))) return st;
    size_t dlen = strlen(dir);
    for (size_t k = 0; k < x->ns; k++) {
        size_t sl = strlen(x->s[k].name);
        char *p = (char *)malloc(dlen + sl + 2);
        if (!p) return nbi_fail(NULL, NB_ERR_OUT_OF_MEMORY, "%s: out of memory", L);
        memcpy(p, dir, dlen);
        p[dlen] = '/';
        memcpy(p + dlen + 1, x->s[k].name, sl + 1);
        st = nb_st_open(p, &x->s[k].f);
        free(p);
        if (st) return st; /* nb_st_open's message names the shard */
        /* every tensor of the shard must be assigned to this shard */
        const nb_st_file *sf = x->s[k].f;
        for (size_t j = 0; j < sf->nt; j++) {
            const nb_st_tensor t = sf->t[j];
            st_entry ek = {t.name, NULL, 0};
            const st_entry *e = (const st_entry *)bsearch(&ek, x->e, x->ne, sizeof *x->e, cmp_entry);
            if (!e)
                return nbi_fail(NULL, NB_ERR_CORRUPT, "%s: tensor \"%.64s\" is in shard \"%.64s\" but not in "
                                "weight_map (rule: the index lists every tensor)", L, t.name, x->s[k].name);
            if (e->shard_idx != k)
                return nbi_fail(NULL, NB_ERR_CORRUPT, "%s: tensor \"%.64s\" is in shard \"%.64s\" but weight_map "
                                "names shard \"%.64s\" (rule: each tensor in exactly its named shard, none in two)",
                                L, t.name, x->s[k].name, e->shard);
        }
    }
    for (size_t i = 0; i < x->ne; i++) {
        if (!nbio_st_lookup(x->s[x->e[i].shard_idx].f, x->e[i].name))
            return nbi_fail(NULL, NB_ERR_NOT_FOUND, "%s: tensor \"%.64s\" is not in its shard \"%.64s\" (rule: "
                            "each tensor in exactly its named shard)", L, x->e[i].name, x->e[i].shard);
    }
    return NB_OK;
}

nb_status nb_st_index_open(const char *path, nb_st_index **out) {
    if (!out) return nbi_fail(NULL, NB_ERR_NULL_POINTER, "nb_st_index_open: out is NULL");
    *out = NULL;
    if (!path) return nbi_fail(NULL, NB_ERR_NULL_POINTER, "nb_st_index_open: path is NULL");
    struct stat sb;
    if (stat(path, &sb) != 0) return nbi_fail(NULL, NB_ERR_IO, "%s: %s", path, strerror(errno));
    static const char kIndex[] = "model.safetensors.index.json";
    size_t pl = strlen(path);
    char *dir = (char *)malloc(pl + sizeof kIndex + 2), *file = (char *)malloc(pl + sizeof kIndex + 2);
    nb_st_index *x = (nb_st_index *)calloc(1, sizeof *x);
    if (!dir || !file || !x) {
        free(dir);
        free(file);
        free(x);
        return nbi_fail(NULL, NB_ERR_OUT_OF_MEMORY, "%s: out of memory", path);
    }
    if (S_ISDIR(sb.st_mode)) {
        memcpy(dir, path, pl + 1);
        snprintf(file, pl + sizeof kIndex + 2, "%s/%s", path, kIndex);
    } else {
        memcpy(file, path, pl + 1);
        const char *slash = strrchr(path, '/');
        if (!slash) snprintf(dir, pl + 2, ".");
        else if (slash == path) snprintf(dir, pl + 2, "/");
        else {
            memcpy(dir, path, (size_t)(slash - path));
            dir[slash - path] = 0;
        }
    }
    x->label = file;
    nb_status st = index_load(x, dir);
    free(dir);
    if (st) {
        nb_st_index_close(x);
        return st;
    }
    *out = x;
    return NB_OK;
}

nb_status nbio_st_index_check_memory(const char *text, size_t len, const char *label, size_t *ntensors,
                                     size_t *nshards) {
    if (!text && len) return nbi_fail(NULL, NB_ERR_NULL_POINTER, "nbio_st_index_check_memory: text is NULL");
    if (len > NB_ST_MAX_HEADER)
        return nbi_fail(NULL, NB_ERR_CORRUPT, "%s: index of %zu bytes exceeds %llu (rule: size limit)",
                        label ? label : "<memory>", len, NB_ST_MAX_HEADER);
    nb_st_index *x = (nb_st_index *)calloc(1, sizeof *x);
    char *t = (char *)malloc(len + 1);
    if (x) x->label = nbio_strdup(label ? label : "<memory>");
    if (!x || !t || !x->label) {
        free(t);
        nb_st_index_close(x);
        return nbi_fail(NULL, NB_ERR_OUT_OF_MEMORY, "out of memory");
    }
    if (len) memcpy(t, text, len);
    t[len] = 0;
    x->text = t;
    nb_status st = index_parse(x, len);
    if (st == NB_OK) {
        if (ntensors) *ntensors = x->ne;
        if (nshards) *nshards = x->ns;
    }
    nb_st_index_close(x);
    return st;
}

nb_status nb_st_index_count(const nb_st_index *x, size_t *count) {
    if (!x || !count) return nbi_fail(NULL, NB_ERR_NULL_POINTER, "nb_st_index_count: x and count must not be NULL");
    *count = x->ne;
    return NB_OK;
}

nb_status nb_st_index_tensor_at(const nb_st_index *x, size_t i, nb_st_tensor *out) {
    if (!x || !out) return nbi_fail(NULL, NB_ERR_NULL_POINTER, "nb_st_index_tensor_at: NULL argument");
    if (i >= x->ne)
        return nbi_fail(NULL, NB_ERR_NOT_FOUND, "%s: tensor index %zu out of range (%zu tensors)", x->label, i,
                        x->ne);
    return nb_st_tensor_find(x->s[x->e[i].shard_idx].f, x->e[i].name, out);
}

nb_status nb_st_index_tensor_find(const nb_st_index *x, const char *name, nb_st_tensor *out) {
    if (!x || !name || !out)
        return nbi_fail(NULL, NB_ERR_NULL_POINTER, "nb_st_index_tensor_find: NULL argument");
    st_entry k = {name, NULL, 0};
    const st_entry *e = (const st_entry *)bsearch(&k, x->e, x->ne, sizeof *x->e, cmp_entry);
    if (!e) return nbi_fail(NULL, NB_ERR_NOT_FOUND, "%s: no tensor \"%.200s\"", x->label, name);
    return nb_st_tensor_find(x->s[e->shard_idx].f, name, out);
}

const nb_st_tensor *nbio_st_index_lookup(const nb_st_index *x, const char *name) {
    st_entry k = {name, NULL, 0};
    const st_entry *e = (const st_entry *)bsearch(&k, x->e, x->ne, sizeof *x->e, cmp_entry);
    return e ? nbio_st_lookup(x->s[e->shard_idx].f, name) : NULL;
}

nb_status nb_st_index_shard_count(const nb_st_index *x, size_t *count) {
    if (!x || !count)
        return nbi_fail(NULL, NB_ERR_NULL_POINTER, "nb_st_index_shard_count: x and count must not be NULL");
    *count = x->ns;
    return NB_OK;
}

nb_status nb_st_index_shard_at(const nb_st_index *x, size_t i, const char **name, const nb_st_file **file) {
    if (!x) return nbi_fail(NULL, NB_ERR_NULL_POINTER, "nb_st_index_shard_at: index is NULL");
    if (i >= x->ns)
        return nbi_fail(NULL, NB_ERR_NOT_FOUND, "%s: shard index %zu out of range (%zu shards)", x->label, i,
                        x->ns);
    if (name) *name = x->s[i].name;
    if (file) *file = x->s[i].f;
    return NB_OK;
}
