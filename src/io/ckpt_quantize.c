/* ckpt_quantize.c - BF16/F16/F32 checkpoint -> ModelOpt NVFP4 or Quark MXFP4
 * checkpoint (rules and output in ckpt_quantize.h).
 *
 * MEMORY (why nb_st_write is not used): nb_st_write needs every tensor of a
 * file in memory at once, which for a quantized shard means all of its codes
 * and scales.  Instead each output file is written in three steps:
 *   1. its tensor list (names, dtypes, shapes) is derived from the input
 *      shard's header alone - quantized sizes depend only on N and K - and
 *      laid out like nb_st_write (descending bits per element, then name;
 *      header space-padded to a multiple of 8), so offsets are known upfront;
 *   2. the header is written to a temporary file in OUT;
 *   3. input tensors are visited one by one: a quantized one is read straight
 *      from the input mapping by nb_quantize_host into one malloc'ed codes and
 *      one scales buffer, which are pwrite'n at their offsets and freed; a
 *      copied one is pwrite'n from the mapping.  The source pages are then
 *      dropped with madvise(MADV_DONTNEED) (the mapping is read-only
 *      MAP_PRIVATE, so they are simply re-read from the file if touched
 *      again), so the resident set stays near one source tensor plus its
 *      outputs instead of growing with the checkpoint.
 * The file is then fsync'ed and renamed to its final name.
 */
#define _DEFAULT_SOURCE /* madvise(MADV_DONTNEED), mkstemp, fsync, DT_* */
#include "ckpt_quantize.h"
#include "io_internal.h"
#include "safetensors.h"

#include <cjson/cJSON.h>

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <fnmatch.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#define MAX_CONFIG (16u << 20) /* bytes of config.json, as checkpoint.h */
#define COPY_CHUNK (16u << 20) /* bytes per pwrite of a copied tensor (pages dropped after each) */

enum { ROLE_COPY = 0, ROLE_CODES = 1, ROLE_SCALES = 2, ROLE_TSCALE = 3 };

typedef struct oent {
    char *name;
    nb_st_dtype dtype;
    int rank;
    int64_t shape[NB_ST_MAX_RANK];
    uint64_t bytes, off;
    size_t src; /* input tensor index within the shard */
    int role;
    int bits;
} oent;

typedef struct qstate {
    const nb_ckpt_quantize_opts *o;
    nb_context *ctx;
    const char *out;
    const char *dir; /* input directory */
    nb_st_file *single;
    nb_st_index *index;
    const char **pat;
    size_t npat;
    char **created; /* files written so far (removed on failure) */
    size_t ncreated;
    char **excluded; /* prefixes of float rank-2 weights left unquantized */
    size_t nexcl;
    char **wm_name, **wm_shard; /* weight map (sharded output) */
    size_t nwm;
    size_t ti, tn;
    uint64_t bdone, btotal;
    uint64_t data_out; /* tensor bytes written (the index's total_size) */
    nb_ckpt_quantize_summary sum;
    char *err;
    size_t errlen;
} qstate;

void nb_ckpt_quantize_opts_init(nb_ckpt_quantize_opts *o) {
    if (!o) return;
    memset(o, 0, sizeof *o);
    o->format = NB_FORMAT_NVFP4;
    o->mx_rule = NB_MX_SCALE_EVEN;
}

/* ------------------------------------------------------------ small helpers */

static int push_str(char ***arr, size_t *n, char *s) {
    if (!s) return 0;
    char **a = (char **)realloc(*arr, (*n + 1) * sizeof *a);
    if (!a) {
        free(s);
        return 0;
    }
    a[(*n)++] = s;
    *arr = a;
    return 1;
}

static void free_strs(char **a, size_t n) {
    for (size_t i = 0; i < n; i++) free(a[i]);
    free(a);
}

static int cmp_str(const void *a, const void *b) { return strcmp(*(char *const *)a, *(char *const *)b); }

static nb_status pwrite_all(int fd, const void *p, size_t n, uint64_t off) {
    const char *c = (const char *)p;
    while (n) {
        ssize_t w = pwrite(fd, c, n, (off_t)off);
        if (w < 0) {
            if (errno == EINTR) continue;
            return NB_ERR_IO;
        }
        c += w;
        n -= (size_t)w;
        off += (uint64_t)w;
    }
    return NB_OK;
}

/* Drop the pages of [p, p+n) of a read-only MAP_PRIVATE file mapping. */
static void drop_pages(const void *p, size_t n) {
    if (!n) return;
    uintptr_t ps = (uintptr_t)sysconf(_SC_PAGESIZE), a = (uintptr_t)p;
    uintptr_t lo = a & ~(ps - 1), hi = (a + n + ps - 1) & ~(ps - 1);
    (void)madvise((void *)lo, hi - lo, MADV_DONTNEED);
}

/* growable string */
typedef struct sbuf {
    char *p;
    size_t n, cap;
    int oom;
} sbuf;

static void sb_put(sbuf *b, const char *s, size_t n) {
    if (b->oom) return;
    if (b->n + n + 1 > b->cap) {
        size_t cap = b->cap ? b->cap : 4096;
        while (b->n + n + 1 > cap) cap *= 2;
        char *p = (char *)realloc(b->p, cap);
        if (!p) {
            b->oom = 1;
            return;
        }
        b->p = p;
        b->cap = cap;
    }
    memcpy(b->p + b->n, s, n);
    b->n += n;
    b->p[b->n] = 0;
}

static void sb_printf(sbuf *b, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void sb_printf(sbuf *b, const char *fmt, ...) {
    char tmp[128];
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(tmp, sizeof tmp, fmt, ap);
    va_end(ap);
    if (n > 0 && (size_t)n < sizeof tmp) sb_put(b, tmp, (size_t)n);
    else b->oom = 1; /* only used for short numeric pieces */
}

/* A JSON string: the reader accepted the names, so they are valid UTF-8 and
 * only quotes, backslashes and control characters need escaping. */
static void sb_json_str(sbuf *b, const char *s) {
    sb_put(b, "\"", 1);
    for (const unsigned char *c = (const unsigned char *)s; *c; c++) {
        if (*c == '"' || *c == '\\') {
            char e[2] = {'\\', (char)*c};
            sb_put(b, e, 2);
        } else if (*c < 0x20) {
            sb_printf(b, "\\u%04x", *c);
        } else {
            sb_put(b, (const char *)c, 1);
        }
    }
    sb_put(b, "\"", 1);
}

/* Write a whole file (for the JSON configs); registered for cleanup. */
static nb_status write_file(qstate *q, const char *name, const char *data, size_t n) {
    char *path = nbio_join(q->out, name);
    if (!path) return nbio_fail(q->err, q->errlen, NB_ERR_OUT_OF_MEMORY, "out of memory");
    int fd = open(path, O_WRONLY | O_CREAT | O_EXCL, 0644);
    if (fd < 0) {
        nb_status st = nbio_fail(q->err, q->errlen, NB_ERR_IO, "%s: %s", path, strerror(errno));
        free(path);
        return st;
    }
    char *reg = nbio_strdup(path);
    if (!push_str(&q->created, &q->ncreated, reg)) {
        close(fd);
        unlink(path);
        free(path);
        return nbio_fail(q->err, q->errlen, NB_ERR_OUT_OF_MEMORY, "out of memory");
    }
    nb_status st = pwrite_all(fd, data, n, 0);
    if (st == NB_OK && fsync(fd)) st = NB_ERR_IO;
    if (close(fd) && st == NB_OK) st = NB_ERR_IO;
    if (st != NB_OK) nbio_fail(q->err, q->errlen, st, "%s: write: %s", path, strerror(errno));
    free(path);
    return st;
}

/* Byte-for-byte copy of src into OUT/name. */
static nb_status copy_file(qstate *q, const char *src, const char *name) {
    int in = open(src, O_RDONLY);
    if (in < 0) return nbio_fail(q->err, q->errlen, NB_ERR_IO, "%s: %s", src, strerror(errno));
    char *path = nbio_join(q->out, name);
    char *buf = (char *)malloc(1u << 20);
    int fd = path ? open(path, O_WRONLY | O_CREAT | O_EXCL, 0644) : -1;
    nb_status st = NB_OK;
    if (!path || !buf) st = nbio_fail(q->err, q->errlen, NB_ERR_OUT_OF_MEMORY, "out of memory");
    else if (fd < 0) st = nbio_fail(q->err, q->errlen, NB_ERR_IO, "%s: %s", path, strerror(errno));
    else if (!push_str(&q->created, &q->ncreated, nbio_strdup(path))) {
        close(fd);
        unlink(path);
        fd = -1;
        st = nbio_fail(q->err, q->errlen, NB_ERR_OUT_OF_MEMORY, "out of memory");
    }
    uint64_t off = 0;
    while (st == NB_OK) {
        ssize_t r = read(in, buf, 1u << 20);
        if (r < 0 && errno == EINTR) continue;
        if (r < 0) st = nbio_fail(q->err, q->errlen, NB_ERR_IO, "%s: read: %s", src, strerror(errno));
        if (r <= 0) break;
        if (pwrite_all(fd, buf, (size_t)r, off) != NB_OK)
            st = nbio_fail(q->err, q->errlen, NB_ERR_IO, "%s: write: %s", path, strerror(errno));
        off += (uint64_t)r;
    }
    if (fd >= 0 && close(fd) && st == NB_OK) st = nbio_fail(q->err, q->errlen, NB_ERR_IO, "%s: close", path);
    close(in);
    free(buf);
    free(path);
    return st;
}

/* ------------------------------------------------------------ decisions */

static int tensor_exists(const qstate *q, const char *name) {
    nb_st_tensor t;
    return (q->index ? nb_st_index_tensor_find(q->index, name, &t, NULL, 0)
                     : nb_st_tensor_find(q->single, name, &t, NULL, 0)) == NB_OK;
}

static int is_float(nb_st_dtype d) { return d == NB_ST_BF16 || d == NB_ST_F16 || d == NB_ST_F32; }

/* 1 to quantize t; 0 to copy it.  *excluded is set for a float rank-2
 * "*.weight" that is left unquantized (it goes to exclude_modules). */
static int decide(const qstate *q, const nb_st_tensor *t, int *excluded, int *oom) {
    *excluded = 0;
    size_t len = strlen(t->name);
    if (len <= 7 || !nbio_ends_with(t->name, ".weight") || t->rank != 2 || !is_float(t->dtype)) return 0;
    *excluded = 1;
    int64_t group = q->o->format == NB_FORMAT_NVFP4 ? 16 : 32;
    if (t->shape[0] <= 0 || t->shape[1] <= 0 || t->shape[1] % group) return 0;
    char *prefix = (char *)malloc(len + 16);
    if (!prefix) {
        *oom = 1;
        return 0;
    }
    memcpy(prefix, t->name, len - 7);
    prefix[len - 7] = 0;
    int skip = 0;
    for (size_t i = 0; i < q->npat && !skip; i++) skip = fnmatch(q->pat[i], prefix, 0) == 0;
    if (!skip) {
        /* an existing P.weight_scale(_2) would collide with what we write */
        strcpy(prefix + len - 7, ".weight_scale");
        skip = tensor_exists(q, prefix);
        strcpy(prefix + len - 7, ".weight_scale_2");
        if (!skip && q->o->format == NB_FORMAT_NVFP4) skip = tensor_exists(q, prefix);
    }
    free(prefix);
    if (skip) return 0;
    *excluded = 0;
    return 1;
}

static int cmp_ent(const void *a, const void *b) {
    const oent *x = (const oent *)a, *y = (const oent *)b;
    if (x->bits != y->bits) return x->bits > y->bits ? -1 : 1;
    return strcmp(x->name, y->name);
}

static nb_dtype nb_dt(nb_st_dtype d) {
    return d == NB_ST_F32 ? NB_DTYPE_F32 : d == NB_ST_F16 ? NB_DTYPE_F16 : NB_DTYPE_BF16;
}

static void report(qstate *q, const char *name) {
    if (q->o->progress) q->o->progress(q->o->progress_user, q->ti, q->tn, q->bdone, q->btotal, name);
}

/* Quantize input tensor t into the entries e[0..2] (codes, scales, tensor scale). */
static nb_status quantize_one(qstate *q, int fd, uint64_t base, const nb_st_tensor *t, oent *const *e) {
    nb_weight_desc d;
    nb_weight_desc_init(&d, q->o->format, t->shape[0], t->shape[1]);
    if (q->o->format == NB_FORMAT_MXFP4) d.scale_rule = q->o->mx_rule;
    nb_weight_sizes sz;
    nb_status st = nb_weight_get_sizes(&d, &sz);
    if (st != NB_OK) return nbio_fail(q->err, q->errlen, st, "%s: %s", t->name, nb_last_error());
    /* nb_quantize_host loads elements with aligned accesses; the writer of
     * any sane file aligns tensors naturally, otherwise take an aligned copy. */
    const void *src = t->data;
    void *copy = NULL;
    size_t esz = t->dtype == NB_ST_F32 ? 4 : 2;
    if ((uintptr_t)src % esz) {
        copy = malloc(t->bytes);
        if (!copy) return nbio_fail(q->err, q->errlen, NB_ERR_OUT_OF_MEMORY, "%s: out of memory", t->name);
        memcpy(copy, src, t->bytes);
        src = copy;
    }
    uint8_t *codes = (uint8_t *)malloc(sz.codes_bytes), *scales = (uint8_t *)malloc(sz.scales_bytes);
    if (!codes || !scales) {
        st = nbio_fail(q->err, q->errlen, NB_ERR_OUT_OF_MEMORY, "%s: out of memory (%zu bytes of codes)", t->name,
                       sz.codes_bytes);
    } else if ((st = nb_quantize_host(q->ctx, &d, nb_dt(t->dtype), src, codes, scales)) != NB_OK) {
        st = nbio_fail(q->err, q->errlen, st, "%s: %s", t->name, nb_context_last_error(q->ctx));
    } else if (pwrite_all(fd, codes, sz.codes_bytes, base + e[0]->off) != NB_OK ||
               pwrite_all(fd, scales, sz.scales_bytes, base + e[1]->off) != NB_OK ||
               (e[2] && pwrite_all(fd, &d.tensor_scale, 4, base + e[2]->off) != NB_OK)) {
        st = nbio_fail(q->err, q->errlen, NB_ERR_IO, "writing %s: %s", t->name, strerror(errno));
    }
    free(codes);
    free(scales);
    free(copy);
    drop_pages(t->data, t->bytes);
    return st;
}

/* Write OUT/<shard> from input file f (see the MEMORY note at the top). */
static nb_status write_shard(qstate *q, const nb_st_file *f, const char *shard) {
    size_t count = 0;
    nb_st_count(f, &count);
    nb_status st = NB_OK;
    oent *ents = (oent *)calloc(count * 3 + 1, sizeof *ents);
    oent **by_src = (oent **)calloc(count * 3 + 1, sizeof *by_src);
    char *tmp = NULL, *final = NULL;
    sbuf h = {0};
    int fd = -1;
    size_t ne = 0;
    if (!ents || !by_src) {
        st = nbio_fail(q->err, q->errlen, NB_ERR_OUT_OF_MEMORY, "out of memory");
        goto done;
    }
    /* 1. the output tensor list */
    for (size_t i = 0; i < count; i++) {
        nb_st_tensor t;
        if ((st = nb_st_tensor_at(f, i, &t, q->err, q->errlen)) != NB_OK) goto done;
        int excl = 0, oom = 0;
        int quant = decide(q, &t, &excl, &oom);
        if (oom) {
            st = nbio_fail(q->err, q->errlen, NB_ERR_OUT_OF_MEMORY, "out of memory");
            goto done;
        }
        if (excl) {
            size_t n = strlen(t.name) - 7;
            char *p = (char *)malloc(n + 1);
            if (p) {
                memcpy(p, t.name, n);
                p[n] = 0;
            }
            if (!push_str(&q->excluded, &q->nexcl, p)) {
                st = nbio_fail(q->err, q->errlen, NB_ERR_OUT_OF_MEMORY, "out of memory");
                goto done;
            }
            q->sum.weights_excluded++;
        }
        if (!quant) {
            oent *e = &ents[ne++];
            e->name = nbio_strdup(t.name);
            e->dtype = t.dtype;
            e->rank = t.rank;
            memcpy(e->shape, t.shape, sizeof e->shape);
            e->bytes = t.bytes;
            e->src = i;
            e->role = ROLE_COPY;
            if (!e->name) {
                st = nbio_fail(q->err, q->errlen, NB_ERR_OUT_OF_MEMORY, "out of memory");
                goto done;
            }
            continue;
        }
        int64_t n = t.shape[0], k = t.shape[1], g = q->o->format == NB_FORMAT_NVFP4 ? 16 : 32;
        size_t plen = strlen(t.name) - 7;
        for (int r = ROLE_CODES; r <= ROLE_TSCALE; r++) {
            if (r == ROLE_TSCALE && q->o->format != NB_FORMAT_NVFP4) break;
            oent *e = &ents[ne++];
            const char *suf = r == ROLE_CODES ? ".weight" : r == ROLE_SCALES ? ".weight_scale" : ".weight_scale_2";
            e->name = (char *)malloc(plen + strlen(suf) + 1);
            if (!e->name) {
                st = nbio_fail(q->err, q->errlen, NB_ERR_OUT_OF_MEMORY, "out of memory");
                goto done;
            }
            memcpy(e->name, t.name, plen);
            strcpy(e->name + plen, suf);
            e->src = i;
            e->role = r;
            if (r == ROLE_TSCALE) {
                e->dtype = NB_ST_F32;
                e->rank = 0;
                e->bytes = 4;
            } else {
                e->dtype = r == ROLE_CODES ? NB_ST_U8 : q->o->format == NB_FORMAT_NVFP4 ? NB_ST_F8_E4M3 : NB_ST_U8;
                e->rank = 2;
                e->shape[0] = n;
                e->shape[1] = r == ROLE_CODES ? k / 2 : k / g;
                e->bytes = (uint64_t)e->shape[0] * (uint64_t)e->shape[1];
            }
        }
    }
    for (size_t i = 0; i < ne; i++) nb_st_dtype_info(ents[i].dtype, NULL, &ents[i].bits);
    qsort(ents, ne, sizeof *ents, cmp_ent);
    uint64_t off = 0;
    for (size_t i = 0; i < ne; i++) {
        ents[i].off = off;
        off += ents[i].bytes;
        by_src[ents[i].src * 3 + (size_t)(ents[i].role ? ents[i].role - 1 : 0)] = &ents[i];
    }
    const uint64_t data_bytes = off;

    /* 2. the header: input metadata (with "format" added when absent), then
     * the tensors in data order */
    size_t nm = 0;
    nb_st_metadata_count(f, &nm);
    const char *fmtv = NULL;
    sb_put(&h, "{\"__metadata__\":{", 17);
    int first = 1;
    if (nb_st_metadata_get(f, "format", &fmtv, NULL, 0) != NB_OK) {
        sb_put(&h, "\"format\":\"pt\"", 13);
        first = 0;
    }
    for (size_t i = 0; i < nm; i++) {
        const char *key, *val;
        if ((st = nb_st_metadata_at(f, i, &key, &val, q->err, q->errlen)) != NB_OK) goto done;
        if (!first) sb_put(&h, ",", 1);
        first = 0;
        sb_json_str(&h, key);
        sb_put(&h, ":", 1);
        sb_json_str(&h, val);
    }
    sb_put(&h, "}", 1);
    for (size_t i = 0; i < ne; i++) {
        const char *dn = "U8";
        nb_st_dtype_info(ents[i].dtype, &dn, NULL);
        sb_put(&h, ",", 1);
        sb_json_str(&h, ents[i].name);
        sb_printf(&h, ":{\"dtype\":\"%s\",\"shape\":[", dn);
        for (int d = 0; d < ents[i].rank; d++) sb_printf(&h, d ? ",%lld" : "%lld", (long long)ents[i].shape[d]);
        sb_printf(&h, "],\"data_offsets\":[%llu,", (unsigned long long)ents[i].off);
        sb_printf(&h, "%llu]}", (unsigned long long)(ents[i].off + ents[i].bytes));
    }
    sb_put(&h, "}", 1);
    while (!h.oom && h.n % 8) sb_put(&h, " ", 1);
    if (h.oom) {
        st = nbio_fail(q->err, q->errlen, NB_ERR_OUT_OF_MEMORY, "out of memory");
        goto done;
    }
    if (h.n > NB_ST_MAX_HEADER) {
        st = nbio_fail(q->err, q->errlen, NB_ERR_OVERFLOW, "%s: header of %zu bytes is over the limit", shard, h.n);
        goto done;
    }

    /* 3. temporary file, header, tensors one by one */
    final = nbio_join(q->out, shard);
    size_t tl = strlen(q->out) + strlen(shard) + 32;
    tmp = (char *)malloc(tl);
    if (!final || !tmp) {
        st = nbio_fail(q->err, q->errlen, NB_ERR_OUT_OF_MEMORY, "out of memory");
        goto done;
    }
    snprintf(tmp, tl, "%s/.%s.tmp.XXXXXX", q->out, shard);
    fd = mkstemp(tmp);
    if (fd < 0) {
        st = nbio_fail(q->err, q->errlen, NB_ERR_IO, "%s: %s", tmp, strerror(errno));
        goto done;
    }
    if (!push_str(&q->created, &q->ncreated, nbio_strdup(tmp))) {
        close(fd);
        fd = -1;
        unlink(tmp);
        st = nbio_fail(q->err, q->errlen, NB_ERR_OUT_OF_MEMORY, "out of memory");
        goto done;
    }
    (void)fchmod(fd, 0644); /* as nb_st_write; mkstemp creates 0600 */
    uint8_t len8[8];
    for (int i = 0; i < 8; i++) len8[i] = (uint8_t)((uint64_t)h.n >> (8 * i));
    const uint64_t base = 8 + (uint64_t)h.n;
    if (pwrite_all(fd, len8, 8, 0) != NB_OK || pwrite_all(fd, h.p, h.n, 8) != NB_OK ||
        ftruncate(fd, (off_t)(base + data_bytes))) {
        st = nbio_fail(q->err, q->errlen, NB_ERR_IO, "%s: write: %s", tmp, strerror(errno));
        goto done;
    }
    for (size_t i = 0; i < count; i++) {
        nb_st_tensor t;
        if ((st = nb_st_tensor_at(f, i, &t, q->err, q->errlen)) != NB_OK) goto done;
        report(q, t.name);
        oent *const *e = &by_src[i * 3];
        if (e[0]->role == ROLE_CODES) {
            if ((st = quantize_one(q, fd, base, &t, e)) != NB_OK) goto done;
            q->sum.layers_quantized++;
        } else {
            const char *p = (const char *)t.data;
            for (uint64_t done = 0; done < t.bytes;) {
                size_t n = t.bytes - done > COPY_CHUNK ? COPY_CHUNK : (size_t)(t.bytes - done);
                if (pwrite_all(fd, p + done, n, base + e[0]->off + done) != NB_OK) {
                    st = nbio_fail(q->err, q->errlen, NB_ERR_IO, "%s: write: %s", tmp, strerror(errno));
                    goto done;
                }
                drop_pages(p + done, n);
                done += n;
            }
            q->sum.tensors_copied++;
        }
        q->ti++;
        q->bdone += t.bytes;
    }
    if (fsync(fd)) {
        st = nbio_fail(q->err, q->errlen, NB_ERR_IO, "%s: fsync: %s", tmp, strerror(errno));
        goto done;
    }
    int rc = close(fd);
    fd = -1;
    if (rc || rename(tmp, final)) {
        st = nbio_fail(q->err, q->errlen, NB_ERR_IO, "%s: %s", final, strerror(errno));
        goto done;
    }
    free(q->created[q->ncreated - 1]);
    q->created[q->ncreated - 1] = final;
    final = NULL;
    q->sum.shards++;
    q->sum.bytes_out += base + data_bytes;
    q->data_out += data_bytes;
    for (size_t i = 0; i < ne; i++) {
        char *a = nbio_strdup(ents[i].name), *b = nbio_strdup(shard);
        if (!push_str(&q->wm_name, &q->nwm, a) || !b) {
            free(b);
            st = nbio_fail(q->err, q->errlen, NB_ERR_OUT_OF_MEMORY, "out of memory");
            goto done;
        }
        char **s = (char **)realloc(q->wm_shard, q->nwm * sizeof *s);
        if (!s) {
            free(b);
            q->nwm--;
            free(q->wm_name[q->nwm]);
            st = nbio_fail(q->err, q->errlen, NB_ERR_OUT_OF_MEMORY, "out of memory");
            goto done;
        }
        q->wm_shard = s;
        s[q->nwm - 1] = b;
    }
done:
    if (fd >= 0) close(fd);
    for (size_t i = 0; i < ne; i++) free(ents[i].name);
    free(ents);
    free(by_src);
    free(tmp);
    free(final);
    free(h.p);
    return st;
}

/* ------------------------------------------------------------ configs */

static cJSON *weights_nvfp4(void) {
    cJSON *w = cJSON_CreateObject();
    cJSON_AddNumberToObject(w, "num_bits", 4);
    cJSON_AddStringToObject(w, "type", "float");
    cJSON_AddNumberToObject(w, "group_size", 16);
    cJSON_AddBoolToObject(w, "dynamic", 0);
    return w;
}

static cJSON *quark_tensor(const char *mode, int dynamic) {
    cJSON *w = cJSON_CreateObject();
    cJSON_AddStringToObject(w, "dtype", "fp4");
    cJSON_AddStringToObject(w, "qscheme", "per_group");
    cJSON_AddNumberToObject(w, "group_size", 32);
    cJSON_AddNumberToObject(w, "ch_axis", -1);
    cJSON_AddStringToObject(w, "scale_format", "e8m0");
    cJSON_AddStringToObject(w, "scale_calculation_mode", mode);
    cJSON_AddStringToObject(w, "round_method", "half_even");
    cJSON_AddBoolToObject(w, "is_dynamic", dynamic);
    cJSON_AddStringToObject(w, "observer_cls", "PerBlockMXObserver");
    cJSON_AddStringToObject(w, "scale_type", "float");
    return w;
}

static cJSON *str_array(char **a, size_t n) {
    cJSON *arr = cJSON_CreateArray();
    for (size_t i = 0; arr && i < n; i++) cJSON_AddItemToArray(arr, cJSON_CreateString(a[i]));
    return arr;
}

/* Quark's scale_calculation_mode for each rule ("round_up", triton's
 * 2^ceil(log2(amax/6)), is not a Quark mode: the name is nibble's). */
static const char *mx_mode(nb_mx_scale_rule r) {
    return r == NB_MX_SCALE_EVEN ? "even" : r == NB_MX_SCALE_OCP ? "floor" : "round_up";
}

static nb_status write_json(qstate *q, const char *name, cJSON *j) {
    char *s = j ? cJSON_Print(j) : NULL;
    if (!s) return nbio_fail(q->err, q->errlen, NB_ERR_OUT_OF_MEMORY, "out of memory");
    size_t n = strlen(s);
    char *t = (char *)realloc(s, n + 2);
    if (!t) {
        free(s);
        return nbio_fail(q->err, q->errlen, NB_ERR_OUT_OF_MEMORY, "out of memory");
    }
    t[n] = '\n';
    t[n + 1] = 0;
    nb_status st = write_file(q, name, t, n + 1);
    free(t);
    return st;
}

static nb_status write_configs(qstate *q, cJSON *config) {
    qsort(q->excluded, q->nexcl, sizeof *q->excluded, cmp_str);
    nb_status st = NB_OK;
    if (q->o->format == NB_FORMAT_NVFP4) {
        cJSON *h = cJSON_CreateObject();
        cJSON *prod = cJSON_AddObjectToObject(h, "producer");
        cJSON_AddStringToObject(prod, "name", "nibble");
        cJSON_AddStringToObject(prod, "version", nb_version_string());
        cJSON *qz = cJSON_AddObjectToObject(h, "quantization");
        cJSON_AddStringToObject(qz, "quant_algo", "NVFP4");
        cJSON_AddNullToObject(qz, "kv_cache_quant_algo");
        cJSON_AddNumberToObject(qz, "group_size", 16);
        cJSON_AddItemToObject(qz, "exclude_modules", str_array(q->excluded, q->nexcl));
        st = write_json(q, "hf_quant_config.json", h);
        cJSON_Delete(h);
        if (st != NB_OK) return st;
    }
    if (!config) return NB_OK;
    cJSON *qc = cJSON_CreateObject();
    if (q->o->format == NB_FORMAT_NVFP4) {
        cJSON_AddStringToObject(qc, "quant_method", "modelopt");
        cJSON_AddStringToObject(qc, "quant_algo", "NVFP4");
        cJSON *prod = cJSON_AddObjectToObject(qc, "producer");
        cJSON_AddStringToObject(prod, "name", "nibble");
        cJSON_AddStringToObject(prod, "version", nb_version_string());
        cJSON_AddItemToObject(qc, "ignore", str_array(q->excluded, q->nexcl));
        cJSON_AddNullToObject(qc, "kv_cache_scheme");
        cJSON *g0 = cJSON_AddObjectToObject(cJSON_AddObjectToObject(qc, "config_groups"), "group_0");
        cJSON_AddItemToObject(g0, "weights", weights_nvfp4());
        cJSON_AddItemToObject(g0, "input_activations", weights_nvfp4());
        cJSON *targets = cJSON_AddArrayToObject(g0, "targets");
        cJSON_AddItemToArray(targets, cJSON_CreateString("Linear"));
    } else {
        const char *mode = mx_mode(q->o->mx_rule);
        cJSON_AddStringToObject(qc, "quant_method", "quark");
        cJSON *g = cJSON_AddObjectToObject(qc, "global_quant_config");
        cJSON_AddItemToObject(g, "weight", quark_tensor(mode, 0));
        cJSON_AddItemToObject(g, "input_tensors", quark_tensor(mode, 1));
        cJSON_AddNullToObject(g, "output_tensors");
        cJSON_AddNullToObject(g, "bias");
        cJSON_AddItemToObject(qc, "exclude", str_array(q->excluded, q->nexcl));
        cJSON *ex = cJSON_AddObjectToObject(qc, "export");
        cJSON_AddStringToObject(ex, "weight_format", "real_quantized");
        cJSON_AddStringToObject(ex, "pack_method", "reorder");
        cJSON_AddArrayToObject(ex, "kv_cache_group");
        cJSON_AddObjectToObject(qc, "layer_quant_config");
        cJSON *prod = cJSON_AddObjectToObject(qc, "producer");
        cJSON_AddStringToObject(prod, "name", "nibble");
        cJSON_AddStringToObject(prod, "version", nb_version_string());
    }
    cJSON_DeleteItemFromObjectCaseSensitive(config, "quantization_config");
    cJSON_AddItemToObject(config, "quantization_config", qc);
    return write_json(q, "config.json", config);
}

typedef struct wpair {
    const char *name, *shard;
} wpair;
static int cmp_pair(const void *a, const void *b) {
    return strcmp(((const wpair *)a)->name, ((const wpair *)b)->name);
}

/* The output index: {"metadata": {"total_size": tensor bytes}, "weight_map": {...}} sorted by name. */
static nb_status write_index(qstate *q, const char *name, uint64_t total) {
    size_t n = q->nwm;
    wpair *p = (wpair *)malloc((n ? n : 1) * sizeof *p);
    if (!p) return nbio_fail(q->err, q->errlen, NB_ERR_OUT_OF_MEMORY, "out of memory");
    for (size_t i = 0; i < n; i++) {
        p[i].name = q->wm_name[i];
        p[i].shard = q->wm_shard[i];
    }
    qsort(p, n, sizeof *p, cmp_pair);
    cJSON *j = cJSON_CreateObject();
    cJSON *md = cJSON_AddObjectToObject(j, "metadata");
    cJSON_AddNumberToObject(md, "total_size", (double)total);
    cJSON *wm = cJSON_AddObjectToObject(j, "weight_map");
    for (size_t i = 0; i < n; i++) cJSON_AddStringToObject(wm, p[i].name, p[i].shard);
    free(p);
    nb_status st = write_json(q, name, j);
    cJSON_Delete(j);
    return st;
}

/* ------------------------------------------------------------ entry point */

/* config.json of the input directory: NULL with NB_OK when absent. */
static nb_status read_config(qstate *q, cJSON **out) {
    *out = NULL;
    char *path = nbio_join(q->dir, "config.json");
    if (!path) return nbio_fail(q->err, q->errlen, NB_ERR_OUT_OF_MEMORY, "out of memory");
    FILE *f = fopen(path, "rb");
    if (!f) {
        nb_status st = errno == ENOENT ? NB_OK : nbio_fail(q->err, q->errlen, NB_ERR_IO, "%s: %s", path, strerror(errno));
        free(path);
        return st;
    }
    char *buf = (char *)malloc(MAX_CONFIG + 1);
    size_t n = buf ? fread(buf, 1, MAX_CONFIG + 1, f) : 0;
    int rerr = ferror(f);
    fclose(f);
    nb_status st = NB_OK;
    if (!buf) st = nbio_fail(q->err, q->errlen, NB_ERR_OUT_OF_MEMORY, "out of memory");
    else if (rerr) st = nbio_fail(q->err, q->errlen, NB_ERR_IO, "%s: read error", path);
    else if (n > MAX_CONFIG) st = nbio_fail(q->err, q->errlen, NB_ERR_CORRUPT, "%s: larger than %u bytes", path, MAX_CONFIG);
    else {
        *out = cJSON_ParseWithLength(buf, n);
        if (!*out || !cJSON_IsObject(*out)) {
            cJSON_Delete(*out);
            *out = NULL;
            st = nbio_fail(q->err, q->errlen, NB_ERR_CORRUPT, "%s: not a JSON object", path);
        }
    }
    free(buf);
    free(path);
    return st;
}

/* OUT must not exist (it is created) or be an empty directory. */
static nb_status prepare_out(const char *out, int *created, char *err, size_t errlen) {
    *created = 0;
    struct stat sb;
    if (stat(out, &sb) != 0) {
        if (errno != ENOENT) return nbio_fail(err, errlen, NB_ERR_IO, "%s: %s", out, strerror(errno));
        if (mkdir(out, 0755)) return nbio_fail(err, errlen, NB_ERR_IO, "cannot create %s: %s", out, strerror(errno));
        *created = 1;
        return NB_OK;
    }
    if (!S_ISDIR(sb.st_mode))
        return nbio_fail(err, errlen, NB_ERR_INVALID_ARGUMENT, "%s exists and is not a directory", out);
    DIR *d = opendir(out);
    if (!d) return nbio_fail(err, errlen, NB_ERR_IO, "%s: %s", out, strerror(errno));
    struct dirent *e;
    int empty = 1;
    while (empty && (e = readdir(d)))
        if (strcmp(e->d_name, ".") && strcmp(e->d_name, "..")) empty = 0;
    closedir(d);
    if (!empty)
        return nbio_fail(err, errlen, NB_ERR_INVALID_ARGUMENT,
                         "%s is not empty (the output must be a new or empty directory)", out);
    return NB_OK;
}

/* Copy every other regular file of the input directory (see the header). */
static nb_status copy_others(qstate *q, int has_config) {
    DIR *d = opendir(q->dir);
    if (!d) return nbio_fail(q->err, q->errlen, NB_ERR_IO, "%s: %s", q->dir, strerror(errno));
    nb_status st = NB_OK;
    struct dirent *e;
    while (st == NB_OK && (e = readdir(d))) {
        const char *n = e->d_name;
        if (!strcmp(n, ".") || !strcmp(n, "..") || nbio_ends_with(n, ".safetensors") ||
            nbio_ends_with(n, ".safetensors.index.json") || !strcmp(n, "hf_quant_config.json") ||
            (has_config && !strcmp(n, "config.json")))
            continue;
        char *src = nbio_join(q->dir, n);
        struct stat sb;
        if (!src) st = nbio_fail(q->err, q->errlen, NB_ERR_OUT_OF_MEMORY, "out of memory");
        else if (stat(src, &sb) == 0 && S_ISREG(sb.st_mode)) {
            st = copy_file(q, src, n);
            if (st == NB_OK) q->sum.files_copied++;
        }
        free(src);
    }
    closedir(d);
    return st;
}

nb_status nb_ckpt_quantize(const char *in, const char *out, const nb_ckpt_quantize_opts *opts,
                           nb_ckpt_quantize_summary *summary, char *err, size_t errlen) {
    if (!in || !out || !opts) return nbio_fail(err, errlen, NB_ERR_NULL_POINTER, "nb_ckpt_quantize: NULL argument");
    if (opts->format != NB_FORMAT_NVFP4 && opts->format != NB_FORMAT_MXFP4)
        return nbio_fail(err, errlen, NB_ERR_INVALID_ARGUMENT, "nb_ckpt_quantize: format must be NVFP4 or MXFP4");
    if (opts->format == NB_FORMAT_MXFP4 && (opts->mx_rule < NB_MX_SCALE_OCP || opts->mx_rule > NB_MX_SCALE_EVEN))
        return nbio_fail(err, errlen, NB_ERR_INVALID_ARGUMENT, "nb_ckpt_quantize: unknown MXFP4 scale rule %d",
                         (int)opts->mx_rule);
    if (opts->nexclude && !opts->exclude)
        return nbio_fail(err, errlen, NB_ERR_NULL_POINTER, "nb_ckpt_quantize: exclude is NULL");
    if (summary) memset(summary, 0, sizeof *summary);
    qstate q;
    memset(&q, 0, sizeof q);
    q.o = opts;
    q.out = out;
    q.err = err;
    q.errlen = errlen;
    nb_status st = NB_OK;
    char *dir = NULL, *file = NULL;
    const char *base = NULL; /* output name of the single file or the index */
    cJSON *config = NULL;
    int sharded = 0, created_out = 0;
    static const char *const defaults[] = {"*lm_head", "*embed*"};

    /* 1. open and check the input before touching OUT */
    if ((st = nbio_resolve_checkpoint(in, &dir, &file, &sharded, err, errlen)) != NB_OK) return st;
    q.dir = dir;
    base = strrchr(file, '/') ? strrchr(file, '/') + 1 : file;
    if (sharded) {
        if ((st = nb_st_open_index(file, &q.index, err, errlen)) != NB_OK) goto done;
        nb_st_index_count(q.index, &q.tn);
        for (size_t i = 0; i < q.tn; i++) {
            nb_st_tensor t;
            if ((st = nb_st_index_tensor_at(q.index, i, &t, err, errlen)) != NB_OK) goto done;
            q.btotal += t.bytes;
        }
    } else {
        if ((st = nb_st_open(file, &q.single, err, errlen)) != NB_OK) goto done;
        nb_st_count(q.single, &q.tn);
        for (size_t i = 0; i < q.tn; i++) {
            nb_st_tensor t;
            if ((st = nb_st_tensor_at(q.single, i, &t, err, errlen)) != NB_OK) goto done;
            q.btotal += t.bytes;
        }
    }
    if ((st = read_config(&q, &config)) != NB_OK) goto done;
    q.npat = opts->nexclude + (opts->no_default_excludes ? 0 : 2);
    q.pat = (const char **)malloc((q.npat ? q.npat : 1) * sizeof *q.pat);
    if (!q.pat) {
        st = nbio_fail(err, errlen, NB_ERR_OUT_OF_MEMORY, "out of memory");
        goto done;
    }
    for (size_t i = 0; i < opts->nexclude; i++) {
        if (!opts->exclude[i]) {
            st = nbio_fail(err, errlen, NB_ERR_NULL_POINTER, "nb_ckpt_quantize: exclude[%zu] is NULL", i);
            goto done;
        }
        q.pat[i] = opts->exclude[i];
    }
    if (!opts->no_default_excludes) {
        q.pat[opts->nexclude] = defaults[0];
        q.pat[opts->nexclude + 1] = defaults[1];
    }
    if ((st = nb_context_create(NB_DEVICE_NONE, &q.ctx)) != NB_OK) {
        st = nbio_fail(err, errlen, st, "nb_context_create: %s", nb_last_error());
        goto done;
    }

    /* 2. OUT, then the tensors file by file, then the other files */
    if ((st = prepare_out(out, &created_out, err, errlen)) != NB_OK) goto done;
    if (sharded) {
        size_t ns = 0;
        nb_st_index_shard_count(q.index, &ns);
        for (size_t i = 0; i < ns && st == NB_OK; i++) {
            const char *name;
            const nb_st_file *sf;
            if ((st = nb_st_index_shard_at(q.index, i, &name, &sf, err, errlen)) == NB_OK)
                st = write_shard(&q, sf, name);
        }
    } else {
        st = write_shard(&q, q.single, base);
    }
    q.ti = q.tn;
    if (st == NB_OK) report(&q, NULL);
    if (st == NB_OK && sharded) {
        st = write_index(&q, base, q.data_out);
    }
    if (st == NB_OK) st = write_configs(&q, config);
    if (st == NB_OK) st = copy_others(&q, config != NULL);
    q.sum.tensors_in = q.tn;
    q.sum.bytes_in = q.btotal;

done:
    if (st != NB_OK) {
        for (size_t i = 0; i < q.ncreated; i++) unlink(q.created[i]);
        if (created_out) rmdir(out);
    } else if (summary) {
        *summary = q.sum;
    }
    free_strs(q.created, q.ncreated);
    free_strs(q.excluded, q.nexcl);
    free_strs(q.wm_name, q.nwm);
    free_strs(q.wm_shard, q.nwm);
    free(q.pat);
    cJSON_Delete(config);
    nb_context_destroy(q.ctx);
    nb_st_close(q.single);
    nb_st_index_close(q.index);
    free(dir);
    free(file);
    return st;
}
