/* ckpt_out.c - writing a checkpoint directory (declarations and rules in
 * io_internal.h), shared by the quantizer and the converter.
 *
 * MEMORY: nb_st_write needs every tensor of a file in memory at once.  A
 * shard written here needs none: its header is derived from shapes alone, so
 * every offset is known before the first byte of data, and the caller
 * streams tensors into place with pwrite while the source mapping's pages
 * are dropped after use.  The result is byte-identical to nb_st_write's for
 * the same tensors and metadata.
 */
#define _DEFAULT_SOURCE /* madvise(MADV_DONTNEED), mkstemp, fsync */
#include "io_internal.h"

#include <cjson/cJSON.h>

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#define COPY_CHUNK (16u << 20) /* bytes per pwrite of a copied tensor (pages dropped after each) */

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

void nbio_drop_pages(const void *p, size_t n) {
    if (!n) return;
    uintptr_t ps = (uintptr_t)sysconf(_SC_PAGESIZE), a = (uintptr_t)p;
    uintptr_t lo = a & ~(ps - 1), hi = (a + n + ps - 1) & ~(ps - 1);
    (void)madvise((void *)lo, hi - lo, MADV_DONTNEED);
}

/* ------------------------------------------------------------ JSON files */

nb_status nbio_read_json(const char *dir, const char *name, size_t max, cJSON **out) {
    *out = NULL;
    char *path = nbio_join(dir, name);
    if (!path) return nbi_fail(NULL, NB_ERR_OUT_OF_MEMORY, "out of memory");
    nb_status st = NB_OK;
    FILE *f = fopen(path, "rb");
    char *buf = NULL;
    if (!f) {
        if (errno != ENOENT) st = nbi_fail(NULL, NB_ERR_IO, "%s: cannot open: %s", path, strerror(errno));
        goto done;
    }
    struct stat sb;
    if (fstat(fileno(f), &sb) || !S_ISREG(sb.st_mode)) {
        st = nbi_fail(NULL, NB_ERR_IO, "%s: not a regular file", path);
        goto done;
    }
    if ((uint64_t)sb.st_size > max) {
        st = nbi_fail(NULL, NB_ERR_CORRUPT, "%s: %lld bytes, over the %zu-byte limit for a config file", path,
                      (long long)sb.st_size, max);
        goto done;
    }
    size_t n = (size_t)sb.st_size;
    buf = (char *)malloc(n + 1);
    if (!buf) {
        st = nbi_fail(NULL, NB_ERR_OUT_OF_MEMORY, "%s: out of memory", path);
        goto done;
    }
    if (fread(buf, 1, n, f) != n) {
        st = nbi_fail(NULL, NB_ERR_IO, "%s: short read", path);
        goto done;
    }
    buf[n] = 0;
    st = nbio_parse_json(path, buf, n, out);
done:
    if (f) fclose(f);
    free(buf);
    free(path);
    return st;
}

nb_status nbio_parse_json(const char *label, const char *text, size_t n, cJSON **out) {
    *out = NULL;
    const char *end = NULL;
    cJSON *j = cJSON_ParseWithLengthOpts(text, n, &end, 0);
    if (!j || !cJSON_IsObject(j)) {
        cJSON_Delete(j);
        return nbi_fail(NULL, NB_ERR_CORRUPT, "%s: not a JSON object (parse error near byte %lld)", label,
                        end && j == NULL ? (long long)(end - text) : 0LL);
    }
    *out = j;
    return NB_OK;
}

/* ------------------------------------------------------------ directory */

nb_status nbio_out_open(nbio_out *o, const char *dir) {
    memset(o, 0, sizeof *o);
    o->dir = dir;
    struct stat sb;
    if (stat(dir, &sb) != 0) {
        if (errno != ENOENT) return nbi_fail(NULL, NB_ERR_IO, "%s: %s", dir, strerror(errno));
        if (mkdir(dir, 0755)) return nbi_fail(NULL, NB_ERR_IO, "cannot create %s: %s", dir, strerror(errno));
        o->created_dir = 1;
        return NB_OK;
    }
    if (!S_ISDIR(sb.st_mode))
        return nbi_fail(NULL, NB_ERR_INVALID_ARGUMENT, "%s exists and is not a directory", dir);
    DIR *d = opendir(dir);
    if (!d) return nbi_fail(NULL, NB_ERR_IO, "%s: %s", dir, strerror(errno));
    struct dirent *e;
    int empty = 1;
    while (empty && (e = readdir(d)))
        if (strcmp(e->d_name, ".") && strcmp(e->d_name, "..")) empty = 0;
    closedir(d);
    if (!empty)
        return nbi_fail(NULL, NB_ERR_INVALID_ARGUMENT,
                        "%s is not empty (the output must be a new or empty directory)", dir);
    return NB_OK;
}

void nbio_out_close(nbio_out *o, int ok) {
    if (!ok) {
        for (size_t i = 0; i < o->ncreated; i++) unlink(o->created[i]);
        if (o->created_dir && o->dir) rmdir(o->dir);
    }
    nbio_free_strs(o->created, o->ncreated);
    nbio_free_strs(o->wm_name, o->nwm);
    nbio_free_strs(o->wm_shard, o->nwm);
    o->created = o->wm_name = o->wm_shard = NULL;
    o->ncreated = o->nwm = 0;
}

/* Create OUT/name exclusively and register it; *fd_out open for writing. */
static nb_status create_file(nbio_out *o, const char *name, int *fd_out, char **path_out) {
    char *path = nbio_join(o->dir, name);
    if (!path) return nbi_fail(NULL, NB_ERR_OUT_OF_MEMORY, "out of memory");
    int fd = open(path, O_WRONLY | O_CREAT | O_EXCL, 0644);
    if (fd < 0) {
        nb_status st = nbi_fail(NULL, NB_ERR_IO, "%s: %s", path, strerror(errno));
        free(path);
        return st;
    }
    if (!nbio_push_str(&o->created, &o->ncreated, nbio_strdup(path))) {
        close(fd);
        unlink(path);
        free(path);
        return nbi_fail(NULL, NB_ERR_OUT_OF_MEMORY, "out of memory");
    }
    *fd_out = fd;
    *path_out = path;
    return NB_OK;
}

static nb_status write_file(nbio_out *o, const char *name, const char *data, size_t n) {
    int fd;
    char *path;
    nb_status st = create_file(o, name, &fd, &path);
    if (st != NB_OK) return st;
    st = pwrite_all(fd, data, n, 0);
    if (st == NB_OK && fsync(fd)) st = NB_ERR_IO;
    if (close(fd) && st == NB_OK) st = NB_ERR_IO;
    if (st != NB_OK) nbi_fail(NULL, st, "%s: write: %s", path, strerror(errno));
    free(path);
    return st;
}

nb_status nbio_out_write_json(nbio_out *o, const char *name, const cJSON *j) {
    char *s = j ? cJSON_Print(j) : NULL;
    if (!s) return nbi_fail(NULL, NB_ERR_OUT_OF_MEMORY, "out of memory");
    size_t n = strlen(s);
    char *t = (char *)realloc(s, n + 2);
    if (!t) {
        free(s);
        return nbi_fail(NULL, NB_ERR_OUT_OF_MEMORY, "out of memory");
    }
    t[n] = '\n';
    t[n + 1] = 0;
    nb_status st = write_file(o, name, t, n + 1);
    free(t);
    return st;
}

/* Byte-for-byte copy of src into OUT/name. */
static nb_status copy_file(nbio_out *o, const char *src, const char *name) {
    int in = open(src, O_RDONLY);
    if (in < 0) return nbi_fail(NULL, NB_ERR_IO, "%s: %s", src, strerror(errno));
    char *buf = (char *)malloc(1u << 20), *path = NULL;
    int fd = -1;
    nb_status st = buf ? create_file(o, name, &fd, &path)
                       : nbi_fail(NULL, NB_ERR_OUT_OF_MEMORY, "out of memory");
    uint64_t off = 0;
    while (st == NB_OK) {
        ssize_t r = read(in, buf, 1u << 20);
        if (r < 0 && errno == EINTR) continue;
        if (r < 0) st = nbi_fail(NULL, NB_ERR_IO, "%s: read: %s", src, strerror(errno));
        if (r <= 0) break;
        if (pwrite_all(fd, buf, (size_t)r, off) != NB_OK)
            st = nbi_fail(NULL, NB_ERR_IO, "%s: write: %s", path, strerror(errno));
        off += (uint64_t)r;
    }
    if (fd >= 0 && close(fd) && st == NB_OK) st = nbi_fail(NULL, NB_ERR_IO, "%s: close", path);
    close(in);
    free(buf);
    free(path);
    return st;
}

nb_status nbio_out_copy_others(nbio_out *o, const char *src_dir, const char *const *skip, size_t nskip) {
    DIR *d = opendir(src_dir);
    if (!d) return nbi_fail(NULL, NB_ERR_IO, "%s: %s", src_dir, strerror(errno));
    nb_status st = NB_OK;
    struct dirent *e;
    while (st == NB_OK && (e = readdir(d))) {
        const char *n = e->d_name;
        int skipped = !strcmp(n, ".") || !strcmp(n, "..") || nbio_ends_with(n, ".safetensors") ||
                      nbio_ends_with(n, ".safetensors.index.json");
        for (size_t i = 0; i < nskip && !skipped; i++) skipped = !strcmp(n, skip[i]);
        if (skipped) continue;
        char *src = nbio_join(src_dir, n);
        struct stat sb;
        if (!src) st = nbi_fail(NULL, NB_ERR_OUT_OF_MEMORY, "out of memory");
        else if (stat(src, &sb) == 0 && S_ISREG(sb.st_mode)) {
            st = copy_file(o, src, n);
            if (st == NB_OK) o->files_copied++;
        }
        free(src);
    }
    closedir(d);
    return st;
}

typedef struct wpair {
    const char *name, *shard;
} wpair;
static int cmp_pair(const void *a, const void *b) {
    return strcmp(((const wpair *)a)->name, ((const wpair *)b)->name);
}

nb_status nbio_out_write_index(nbio_out *o, const char *name) {
    size_t n = o->nwm;
    wpair *p = (wpair *)malloc((n ? n : 1) * sizeof *p);
    if (!p) return nbi_fail(NULL, NB_ERR_OUT_OF_MEMORY, "out of memory");
    for (size_t i = 0; i < n; i++) {
        p[i].name = o->wm_name[i];
        p[i].shard = o->wm_shard[i];
    }
    qsort(p, n, sizeof *p, cmp_pair);
    cJSON *j = cJSON_CreateObject();
    cJSON *md = cJSON_AddObjectToObject(j, "metadata");
    cJSON_AddNumberToObject(md, "total_size", (double)o->data_bytes);
    cJSON *wm = cJSON_AddObjectToObject(j, "weight_map");
    for (size_t i = 0; i < n; i++) cJSON_AddStringToObject(wm, p[i].name, p[i].shard);
    free(p);
    nb_status st = nbio_out_write_json(o, name, j);
    cJSON_Delete(j);
    return st;
}

/* ------------------------------------------------------------ shards */

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

/* A JSON string: names and metadata come from a validated reader or from
 * the caller's ASCII, so only quotes, backslashes and control characters
 * need escaping. */
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

static int cmp_oent(const void *a, const void *b) {
    const nbio_oent *x = (const nbio_oent *)a, *y = (const nbio_oent *)b;
    if (x->bits != y->bits) return x->bits > y->bits ? -1 : 1;
    return strcmp(x->name, y->name);
}

static int cmp_name(const void *a, const void *b) { return strcmp(*(char *const *)a, *(char *const *)b); }

void nbio_oent_like(nbio_oent *e, char *name, const nb_st_tensor *t, size_t src, int role) {
    e->name = name;
    e->dtype = t->dtype;
    e->rank = t->rank;
    memcpy(e->shape, t->shape, sizeof e->shape);
    e->bytes = t->bytes;
    e->src = src;
    e->role = role;
}

void nbio_oents_free(nbio_oent *ents, size_t ne) {
    if (!ents) return;
    for (size_t i = 0; i < ne; i++) free(ents[i].name);
    free(ents);
}

/* Stage 1 of nbio_shard_begin: bits per element, no name twice, file order
 * and offsets; the data size. */
static nb_status shard_layout(const char *name, nbio_oent *ents, size_t ne, uint64_t *data_bytes) {
    for (size_t i = 0; i < ne; i++)
        if (nb_st_dtype_info(ents[i].dtype, NULL, &ents[i].bits) != NB_OK)
            return nbi_fail(NULL, NB_ERR_INTERNAL, "%s: tensor \"%.200s\": %s", name, ents[i].name, nb_last_error());
    const char **names = (const char **)malloc((ne ? ne : 1) * sizeof *names);
    if (!names) return nbi_fail(NULL, NB_ERR_OUT_OF_MEMORY, "out of memory");
    for (size_t i = 0; i < ne; i++) names[i] = ents[i].name;
    qsort(names, ne, sizeof *names, cmp_name);
    for (size_t i = 1; i < ne; i++)
        if (!strcmp(names[i - 1], names[i])) {
            nb_status st = nbi_fail(NULL, NB_ERR_INVALID_ARGUMENT, "%s: tensor \"%.200s\" would be written twice",
                                    name, names[i]);
            free(names);
            return st;
        }
    free(names);
    qsort(ents, ne, sizeof *ents, cmp_oent);
    uint64_t off = 0;
    for (size_t i = 0; i < ne; i++) {
        ents[i].off = off;
        off += ents[i].bytes;
    }
    *data_bytes = off;
    return NB_OK;
}

/* Stage 2: the header text - the source's metadata ("format" added when
 * absent), then the tensors in data order, space-padded to 8 bytes. */
static nb_status shard_header(const char *name, const nb_st_file *meta_src, const nbio_oent *ents, size_t ne,
                              sbuf *h) {
    size_t nm = 0;
    int has_format = 0;
    nb_status st = meta_src ? nb_st_metadata_count(meta_src, &nm) : NB_OK;
    for (size_t i = 0; i < nm && !has_format && st == NB_OK; i++) {
        const char *key = "";
        st = nb_st_metadata_at(meta_src, i, &key, NULL);
        has_format = !strcmp(key, "format");
    }
    if (st != NB_OK) return st;
    sb_put(h, "{\"__metadata__\":{", 17);
    if (!has_format) sb_put(h, "\"format\":\"pt\"", 13);
    for (size_t i = 0; i < nm; i++) {
        const char *key, *val;
        if ((st = nb_st_metadata_at(meta_src, i, &key, &val)) != NB_OK) return st;
        if (i || !has_format) sb_put(h, ",", 1);
        sb_json_str(h, key);
        sb_put(h, ":", 1);
        sb_json_str(h, val);
    }
    sb_put(h, "}", 1);
    for (size_t i = 0; i < ne; i++) {
        const char *dn = "U8";
        nb_st_dtype_info(ents[i].dtype, &dn, NULL); /* checked by shard_layout */
        sb_put(h, ",", 1);
        sb_json_str(h, ents[i].name);
        sb_printf(h, ":{\"dtype\":\"%s\",\"shape\":[", dn);
        for (int d = 0; d < ents[i].rank; d++) sb_printf(h, d ? ",%lld" : "%lld", (long long)ents[i].shape[d]);
        sb_printf(h, "],\"data_offsets\":[%llu,", (unsigned long long)ents[i].off);
        sb_printf(h, "%llu]}", (unsigned long long)(ents[i].off + ents[i].bytes));
    }
    sb_put(h, "}", 1);
    while (!h->oom && h->n % 8) sb_put(h, " ", 1);
    if (h->oom) return nbi_fail(NULL, NB_ERR_OUT_OF_MEMORY, "out of memory");
    if (h->n > NB_ST_MAX_HEADER)
        return nbi_fail(NULL, NB_ERR_OVERFLOW, "%s: header of %zu bytes is over the limit", name, h->n);
    return NB_OK;
}

/* Stage 3: the registered temporary file, holding the header and sized for
 * the data. */
static nb_status shard_create(nbio_out *o, nbio_shard *s, const sbuf *h) {
    s->final = nbio_join(o->dir, s->name);
    size_t tl = strlen(o->dir) + strlen(s->name) + 32;
    s->tmp = (char *)malloc(tl);
    if (!s->final || !s->tmp) return nbi_fail(NULL, NB_ERR_OUT_OF_MEMORY, "out of memory");
    snprintf(s->tmp, tl, "%s/.%s.tmp.XXXXXX", o->dir, s->name);
    s->fd = mkstemp(s->tmp);
    if (s->fd < 0) return nbi_fail(NULL, NB_ERR_IO, "%s: %s", s->tmp, strerror(errno));
    if (!nbio_push_str(&o->created, &o->ncreated, nbio_strdup(s->tmp))) {
        close(s->fd);
        s->fd = -1;
        unlink(s->tmp);
        return nbi_fail(NULL, NB_ERR_OUT_OF_MEMORY, "out of memory");
    }
    (void)fchmod(s->fd, 0644); /* as nb_st_write; mkstemp creates 0600 */
    uint8_t len8[8];
    for (int i = 0; i < 8; i++) len8[i] = (uint8_t)((uint64_t)h->n >> (8 * i));
    s->base = 8 + (uint64_t)h->n;
    if (pwrite_all(s->fd, len8, 8, 0) != NB_OK || pwrite_all(s->fd, h->p, h->n, 8) != NB_OK ||
        ftruncate(s->fd, (off_t)(s->base + s->data_bytes)))
        return nbi_fail(NULL, NB_ERR_IO, "%s: write: %s", s->tmp, strerror(errno));
    return NB_OK;
}

nb_status nbio_shard_begin(nbio_out *o, nbio_shard *s, const char *name, const nb_st_file *meta_src, nbio_oent *ents,
                           size_t ne) {
    memset(s, 0, sizeof *s);
    s->o = o;
    s->name = name;
    s->fd = -1;
    sbuf h = {0};
    nb_status st = shard_layout(name, ents, ne, &s->data_bytes);
    if (st == NB_OK) st = shard_header(name, meta_src, ents, ne, &h);
    if (st == NB_OK) st = shard_create(o, s, &h);
    free(h.p);
    if (st != NB_OK) nbio_shard_end(s);
    return st;
}

nb_status nbio_shard_write(nbio_shard *s, const nbio_oent *e, const void *p, size_t n, uint64_t at) {
    if (at > e->bytes || n > e->bytes - at)
        return nbi_fail(NULL, NB_ERR_INTERNAL, "%s: %zu bytes at %llu overflow tensor %s", s->name,
                        n, (unsigned long long)at, e->name);
    if (pwrite_all(s->fd, p, n, s->base + e->off + at) != NB_OK)
        return nbi_fail(NULL, NB_ERR_IO, "%s: writing %s: %s", s->tmp, e->name, strerror(errno));
    return NB_OK;
}

nb_status nbio_shard_copy(nbio_shard *s, const nbio_oent *e, const void *src) {
    const char *p = (const char *)src;
    for (uint64_t done = 0; done < e->bytes;) {
        size_t n = e->bytes - done > COPY_CHUNK ? COPY_CHUNK : (size_t)(e->bytes - done);
        nb_status st = nbio_shard_write(s, e, p + done, n, done);
        if (st != NB_OK) return st;
        nbio_drop_pages(p + done, n);
        done += n;
    }
    return NB_OK;
}

nb_status nbio_shard_commit(nbio_shard *s, const nbio_oent *ents, size_t ne) {
    nbio_out *o = s->o;
    if (fsync(s->fd)) return nbi_fail(NULL, NB_ERR_IO, "%s: fsync: %s", s->tmp, strerror(errno));
    int rc = close(s->fd);
    s->fd = -1;
    if (rc || rename(s->tmp, s->final))
        return nbi_fail(NULL, NB_ERR_IO, "%s: %s", s->final, strerror(errno));
    for (size_t i = o->ncreated; i-- > 0;) /* the temporary name becomes the final one */
        if (!strcmp(o->created[i], s->tmp)) {
            free(o->created[i]);
            o->created[i] = s->final;
            s->final = NULL;
            break;
        }
    o->shards++;
    o->file_bytes += s->base + s->data_bytes;
    o->data_bytes += s->data_bytes;
    for (size_t i = 0; i < ne; i++) {
        char *a = nbio_strdup(ents[i].name), *b = nbio_strdup(s->name);
        if (!nbio_push_str(&o->wm_name, &o->nwm, a) || !b) {
            free(b);
            return nbi_fail(NULL, NB_ERR_OUT_OF_MEMORY, "out of memory");
        }
        char **sh = (char **)realloc(o->wm_shard, o->nwm * sizeof *sh);
        if (!sh) {
            free(b);
            o->nwm--;
            free(o->wm_name[o->nwm]);
            return nbi_fail(NULL, NB_ERR_OUT_OF_MEMORY, "out of memory");
        }
        o->wm_shard = sh;
        sh[o->nwm - 1] = b;
    }
    return NB_OK;
}

void nbio_shard_end(nbio_shard *s) {
    if (s->fd >= 0) close(s->fd);
    s->fd = -1;
    free(s->tmp);
    free(s->final);
    s->tmp = s->final = NULL;
}

/* ------------------------------------------------------------ configs */

static cJSON *str_array(const char *const *a, size_t n) {
    cJSON *arr = cJSON_CreateArray();
    for (size_t i = 0; arr && i < n; i++) cJSON_AddItemToArray(arr, cJSON_CreateString(a[i]));
    return arr;
}

static void add_producer(cJSON *o) {
    cJSON *prod = cJSON_AddObjectToObject(o, "producer");
    cJSON_AddStringToObject(prod, "name", "nibble");
    cJSON_AddStringToObject(prod, "version", nb_version_string());
}

cJSON *nbio_hf_quant_config(const char *const *excl, size_t n, const char *kv_cache_algo) {
    cJSON *h = cJSON_CreateObject();
    add_producer(h);
    cJSON *qz = cJSON_AddObjectToObject(h, "quantization");
    cJSON_AddStringToObject(qz, "quant_algo", "NVFP4");
    if (kv_cache_algo) cJSON_AddStringToObject(qz, "kv_cache_quant_algo", kv_cache_algo);
    else cJSON_AddNullToObject(qz, "kv_cache_quant_algo");
    cJSON_AddNumberToObject(qz, "group_size", 16);
    cJSON_AddItemToObject(qz, "exclude_modules", str_array(excl, n));
    return h;
}

static cJSON *weights_nvfp4(void) {
    cJSON *w = cJSON_CreateObject();
    cJSON_AddNumberToObject(w, "num_bits", 4);
    cJSON_AddStringToObject(w, "type", "float");
    cJSON_AddNumberToObject(w, "group_size", 16);
    cJSON_AddBoolToObject(w, "dynamic", 0);
    return w;
}

cJSON *nbio_qc_modelopt(const char *const *excl, size_t n) {
    cJSON *qc = cJSON_CreateObject();
    cJSON_AddStringToObject(qc, "quant_method", "modelopt");
    cJSON_AddStringToObject(qc, "quant_algo", "NVFP4");
    add_producer(qc);
    cJSON_AddItemToObject(qc, "ignore", str_array(excl, n));
    cJSON_AddNullToObject(qc, "kv_cache_scheme");
    cJSON *g0 = cJSON_AddObjectToObject(cJSON_AddObjectToObject(qc, "config_groups"), "group_0");
    cJSON_AddItemToObject(g0, "weights", weights_nvfp4());
    cJSON_AddItemToObject(g0, "input_activations", weights_nvfp4());
    cJSON *targets = cJSON_AddArrayToObject(g0, "targets");
    cJSON_AddItemToArray(targets, cJSON_CreateString("Linear"));
    return qc;
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

cJSON *nbio_qc_quark(const char *mode, const char *const *excl, size_t n) {
    cJSON *qc = cJSON_CreateObject();
    cJSON_AddStringToObject(qc, "quant_method", "quark");
    cJSON *g = cJSON_AddObjectToObject(qc, "global_quant_config");
    cJSON_AddItemToObject(g, "weight", quark_tensor(mode, 0));
    cJSON_AddItemToObject(g, "input_tensors", quark_tensor(mode, 1));
    cJSON_AddNullToObject(g, "output_tensors");
    cJSON_AddNullToObject(g, "bias");
    cJSON_AddItemToObject(qc, "exclude", str_array(excl, n));
    cJSON *ex = cJSON_AddObjectToObject(qc, "export");
    cJSON_AddStringToObject(ex, "weight_format", "real_quantized");
    cJSON_AddStringToObject(ex, "pack_method", "reorder");
    cJSON_AddArrayToObject(ex, "kv_cache_group");
    cJSON_AddObjectToObject(qc, "layer_quant_config");
    add_producer(qc);
    return qc;
}

/* compressed-tensors QuantizationArgs (quant_scheme.py presets NVFP4,
 * NVFP4A16, MXFP4) of weight format fi: a format with a tensor scale is the
 * "tensor_group" strategy (NVFP4's global scale), dynamic activations
 * "local"; the scale dtype follows the scale type. */
static cJSON *ct_args(const nb_format_info *fi, int dynamic) {
    cJSON *w = cJSON_CreateObject();
    cJSON_AddNumberToObject(w, "num_bits", fi->element_bits);
    cJSON_AddStringToObject(w, "type", "float");
    cJSON_AddStringToObject(w, "strategy", fi->tensor_scale ? "tensor_group" : "group");
    cJSON_AddNumberToObject(w, "group_size", fi->group_size);
    cJSON_AddBoolToObject(w, "symmetric", 1);
    if (dynamic && fi->tensor_scale) cJSON_AddStringToObject(w, "dynamic", "local");
    else cJSON_AddBoolToObject(w, "dynamic", dynamic);
    cJSON_AddStringToObject(w, "scale_dtype", fi->scale_type == NB_SCALE_E4M3 ? "float8_e4m3fn" : "uint8");
    return w;
}

cJSON *nbio_qc_ct(nb_format f, int input_acts, const char *const *ignore, size_t n) {
    nb_format_info fi;
    if (nb_format_get_info(f, &fi) != NB_OK) return NULL; /* the caller names only formats of the table */
    char format[48];
    snprintf(format, sizeof format, "%s-pack-quantized", fi.name);
    cJSON *qc = cJSON_CreateObject();
    cJSON_AddStringToObject(qc, "quant_method", "compressed-tensors");
    cJSON_AddStringToObject(qc, "format", format);
    cJSON_AddStringToObject(qc, "quantization_status", "compressed");
    cJSON *g0 = cJSON_AddObjectToObject(cJSON_AddObjectToObject(qc, "config_groups"), "group_0");
    cJSON *targets = cJSON_AddArrayToObject(g0, "targets");
    cJSON_AddItemToArray(targets, cJSON_CreateString("Linear"));
    cJSON_AddItemToObject(g0, "weights", ct_args(&fi, 0));
    if (input_acts) cJSON_AddItemToObject(g0, "input_activations", ct_args(&fi, 1));
    else cJSON_AddNullToObject(g0, "input_activations");
    cJSON_AddItemToObject(qc, "ignore", str_array(ignore, n));
    cJSON_AddNullToObject(qc, "kv_cache_scheme");
    add_producer(qc);
    return qc;
}
