/* ckpt_testlib.h - fixture helpers shared by the checkpoint tests: a set of
 * tensors written with nb_st_write into g_dir/<sub>/<file>, text files next
 * to them, and the fixture directory itself (a temporary one removed on
 * success, or one kept with --keep DIR for the CLI tests ctest runs after).
 * Includes testlib.h. */
#ifndef NB_CKPT_TESTLIB_H
#define NB_CKPT_TESTLIB_H

#include "nibble_io.h"
#include "testlib.h"

#include <errno.h>
#include <math.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <unistd.h>

static char g_dir[512];

/* Names of library enum values for messages ("?" for one without a name). */
static inline const char *fmt_name(nb_ckpt_format f) { const char *s; return nb_ckpt_format_name(f, &s) ? "?" : s; }
static inline const char *dev_name(nb_ckpt_device d) { const char *s; return nb_ckpt_device_name(d, &s) ? "?" : s; }
static inline const char *src_name(nb_ckpt_source x) { const char *s; return nb_ckpt_source_name(x, &s) ? "?" : s; }

#define TSET_MAX 256
typedef struct tset {
    nb_st_tensor t[TSET_MAX];
    void *own[TSET_MAX];
    size_t n;
} tset;

static inline uint8_t *rnd_bytes(size_t n, int lo, int hi) {
    uint8_t *p = (uint8_t *)malloc(n ? n : 1);
    for (size_t i = 0; i < n; i++) p[i] = (uint8_t)(lo + (int)(rnd_u64() % (uint64_t)(hi - lo + 1)));
    return p;
}

/* Add a tensor; data is copied (random bytes in [lo, hi] when src is NULL).
 * Returns the tensor's data. */
static inline const uint8_t *add(tset *s, const char *name, nb_st_dtype dt, int rank, const int64_t *shape,
                          const void *src, int lo, int hi) {
    if (s->n == TSET_MAX) { /* a fixture larger than the set: the test itself is wrong */
        printf("FAIL: more than %d tensors in one fixture set\n", TSET_MAX);
        exit(1);
    }
    nb_st_tensor *t = &s->t[s->n];
    memset(t, 0, sizeof *t);
    t->name = name;
    t->dtype = dt;
    t->rank = rank;
    int bits = 8;
    nb_st_dtype_info(dt, NULL, &bits);
    size_t e = 1;
    for (int i = 0; i < rank; i++) {
        t->shape[i] = shape[i];
        e *= (size_t)shape[i];
    }
    t->bytes = e * (size_t)bits / 8;
    uint8_t *p = rnd_bytes(t->bytes, lo, hi);
    if (src) memcpy(p, src, t->bytes);
    t->data = p;
    s->own[s->n++] = p;
    return p;
}

static inline void add_f32(tset *s, const char *name, int rank, float v) {
    int64_t one[1] = {1};
    add(s, name, NB_ST_F32, rank, one, &v, 0, 0);
}

static inline void write_set(tset *s, const char *sub, const char *file) {
    char path[1024];
    snprintf(path, sizeof path, "%s/%s", g_dir, sub);
    mkdir(path, 0755);
    snprintf(path, sizeof path, "%s/%s/%s", g_dir, sub, file);
    nb_status st = nb_st_write(path, s->t, s->n, NULL, 0);
    CHECK(st == NB_OK, "write %s: %s", path, nb_last_error());
}

static inline void free_set(tset *s) {
    for (size_t i = 0; i < s->n; i++) free(s->own[i]);
    s->n = 0;
}

static inline void write_text(const char *sub, const char *file, const char *text) {
    char path[1024];
    snprintf(path, sizeof path, "%s/%s", g_dir, sub);
    mkdir(path, 0755);
    snprintf(path, sizeof path, "%s/%s/%s", g_dir, sub, file);
    FILE *f = fopen(path, "wb");
    if (!f) {
        CHECK(0, "cannot write %s", path);
        return;
    }
    fputs(text, f);
    fclose(f);
}

/* malloc'ed contents of a file (NULL when unreadable); *n its size. */
static inline char *read_file_all(const char *path, size_t *n) {
    FILE *f = fopen(path, "rb");
    if (!f) return NULL;
    fseek(f, 0, SEEK_END);
    long sz = ftell(f);
    fseek(f, 0, SEEK_SET);
    char *p = (char *)malloc(sz > 0 ? (size_t)sz + 1 : 1);
    *n = p ? fread(p, 1, sz > 0 ? (size_t)sz : 0, f) : 0;
    if (p) p[*n] = 0;
    fclose(f);
    return p;
}

/* nb_ckpt_quantize of fixture g_dir/<in> into g_dir/<out> with the format,
 * MXFP4 rule, method, device, fused_scales and at most one exclude pattern
 * (NULL: none) given; the other options at their defaults. */
static inline nb_status quantize_fixture(const char *in, const char *out, nb_format fmt, nb_mx_scale_rule rule,
                                         int method, nb_ckpt_device dev, int fused_scales, const char *exclude,
                                         nb_ckpt_quantize_summary *sum) {
    char pin[1024], pout[1024];
    snprintf(pin, sizeof pin, "%s/%s", g_dir, in);
    snprintf(pout, sizeof pout, "%s/%s", g_dir, out);
    nb_ckpt_quantize_opts o;
    nb_ckpt_quantize_opts_init(&o);
    o.format = fmt;
    o.mx_rule = rule;
    o.method = method;
    o.device = dev;
    o.fused_scales = fused_scales;
    const char *ex[1] = {exclude};
    if (exclude) {
        o.exclude = ex;
        o.nexclude = 1;
    }
    return nb_ckpt_quantize(pin, pout, &o, sum);
}

/* Open the fixture checkpoint g_dir/<sub> (NULL, and a failed check, when it
 * does not open). */
static inline nb_ckpt *open_fixture(const char *sub) {
    char path[1024];
    snprintf(path, sizeof path, "%s/%s", g_dir, sub);
    nb_ckpt *c = NULL;
    nb_status st = nb_ckpt_open(path, &c);
    CHECK(st == NB_OK, "open %s: %s", sub, nb_last_error());
    return c;
}

/* argv: [--keep DIR] (DIR is emptied first).  Sets g_dir; returns 1 (keep),
 * 0 (temporary) or -1. */
static inline int fixture_dir_open(int argc, char **argv, const char *name) {
    if (argc == 3 && !strcmp(argv[1], "--keep")) {
        snprintf(g_dir, sizeof g_dir, "%s", argv[2]);
        char cmd[700];
        snprintf(cmd, sizeof cmd, "rm -rf '%s'", g_dir); /* outputs of a previous run */
        if (system(cmd) != 0) printf("note: could not clear %s\n", g_dir);
        if (mkdir(g_dir, 0755) && errno != EEXIST) {
            printf("cannot create %s\n", g_dir);
            return -1;
        }
        return 1;
    }
    const char *tmp = getenv("TMPDIR");
    snprintf(g_dir, sizeof g_dir, "%s/%s.XXXXXX", tmp && tmp[0] ? tmp : "/tmp", name);
    if (!mkdtemp(g_dir)) {
        printf("cannot create a temporary directory\n");
        return -1;
    }
    return 0;
}

/* ------------------------------------------- float checkpoints to quantize */

/* One tensor of a float fixture (nb_ckpt_quantize's input). */
typedef struct ispec {
    const char *name;
    nb_st_dtype dt;
    int rank;
    int64_t shape[2];
} ispec;

/* Write the n tensors of t into g_dir/in/model.safetensors with config.json
 * `cfg` and a tokenizer.json: BF16 / F16 / F32 values of a bell-shaped
 * spread with blocks of one sign, of mixed magnitude and all zero (every
 * 32 elements a block); an I64 tensor holds {8, 64} (a weight_shape).  The
 * bytes of tensor i in src[i] (the caller frees them), their size in
 * nbytes[i]. */
static inline void ckpt_float_fixture(const ispec *t, size_t n, void **src, size_t *nbytes, const char *cfg) {
    tset s = {0};
    for (size_t i = 0; i < n; i++) {
        const ispec *p = &t[i];
        const size_t e = (size_t)p->shape[0] * (p->rank == 2 ? (size_t)p->shape[1] : 1);
        int bits = 8;
        nb_st_dtype_info(p->dt, NULL, &bits);
        uint8_t *b = (uint8_t *)calloc(e, (size_t)bits / 8);
        for (size_t j = 0; j < e; j++) {
            float v = (float)((rnd_unit() + rnd_unit() + rnd_unit() - 1.5) * 3.0);
            if (j % 41 == 7) v = fabsf(v) * 5.0f; /* blocks of one sign and of mixed magnitude */
            if ((j / 32) % 7 == 2) v = fabsf(v);
            if ((j / 32) % 11 == 4) v = 0.0f;     /* an all-zero block */
            if (p->dt == NB_ST_BF16) {
                const uint16_t h = ref_bf16(v);
                memcpy(b + 2 * j, &h, 2);
            } else if (p->dt == NB_ST_F16) {
                const uint16_t h = ref_f16(v);
                memcpy(b + 2 * j, &h, 2);
            } else if (p->dt == NB_ST_F32) {
                memcpy(b + 4 * j, &v, 4);
            } else { /* an I64 weight_shape */
                const int64_t sh[2] = {8, 64};
                memcpy(b, sh, e * 8 < 16 ? e * 8 : 16);
                break;
            }
        }
        nbytes[i] = e * (size_t)bits / 8;
        src[i] = b;
        add(&s, p->name, p->dt, p->rank, p->shape, b, 0, 0);
    }
    write_set(&s, "in", "model.safetensors");
    free_set(&s);
    write_text("in", "config.json", cfg);
    write_text("in", "tokenizer.json", "{}\n");
}

static inline int ends_with(const char *s, const char *suf) {
    const size_t n = strlen(s), m = strlen(suf);
    return n >= m && !strcmp(s + n - m, suf);
}

static inline nb_dtype src_dtype(nb_st_dtype d) {
    return d == NB_ST_F32 ? NB_DTYPE_F32 : d == NB_ST_F16 ? NB_DTYPE_F16 : NB_DTYPE_BF16;
}

/* The prefix's tensor `suf` in an output file (a failed check when missing). */
static inline int find(const nb_st_file *f, const char *prefix, const char *suf, nb_st_tensor *t) {
    char name[320];
    snprintf(name, sizeof name, "%.255s%s", prefix, suf);
    const nb_status st = nb_st_tensor_find(f, name, t);
    CHECK(st == NB_OK, "%s missing", name);
    return st == NB_OK;
}

/* nb_ckpt_quantize of the fixture g_dir/in into g_dir/<out> with o (and
 * the summary into s); 1 when it succeeded (a failed check otherwise). */
static inline int quantize_in(const char *out, const nb_ckpt_quantize_opts *o, nb_ckpt_quantize_summary *s) {
    char in[1024], op[1024];
    snprintf(in, sizeof in, "%s/in", g_dir);
    snprintf(op, sizeof op, "%s/%s", g_dir, out);
    const nb_status st = nb_ckpt_quantize(in, op, o, s);
    CHECK(st == NB_OK, "quantize %s: %s %s", out, nb_status_name(st), nb_last_error());
    return st == NB_OK;
}

/* The summary of quantizing the n-tensor fixture t on the host with nq of
 * its layers expected quantized: those layers, every other tensor copied,
 * every other 2-D .weight counted as excluded, the host device, one
 * non-tensor file copied (the tokenizer). */
static inline void check_summary(const char *out, const nb_ckpt_quantize_summary *s, const ispec *t, size_t n,
                                 size_t nq) {
    size_t nw = 0;
    for (size_t i = 0; i < n; i++) nw += t[i].rank == 2 && ends_with(t[i].name, ".weight");
    CHECK(nq > 0 && s->layers_quantized == nq && s->tensors_copied == n - nq && s->weights_excluded == nw - nq &&
              s->device == NB_CKPT_DEVICE_CPU && !strcmp(s->device_name, "host") && s->files_copied == 1,
          "%s: summary %zu quantized, %zu copied, %zu excluded, device %s, %zu files (want %zu quantized)", out,
          s->layers_quantized, s->tensors_copied, s->weights_excluded, s->device_name, s->files_copied, nq);
}

/* The checkpoint written into g_dir/<out>: its model.safetensors, the
 * reader's view of it and a host context; 1 when all three opened (a failed
 * check otherwise).  ckpt_output_close closes what opened. */
static inline int ckpt_output_open(const char *out, nb_st_file **f, nb_ckpt **c, nb_context **ctx) {
    char dir[1024], file[1100];
    snprintf(dir, sizeof dir, "%s/%s", g_dir, out);
    snprintf(file, sizeof file, "%s/model.safetensors", dir);
    *f = NULL, *c = NULL, *ctx = NULL;
    CHECK(nb_st_open(file, f) == NB_OK && nb_ckpt_open(dir, c) == NB_OK &&
              nb_context_create(NB_DEVICE_NONE, ctx) == NB_OK,
          "%s: open: %s", out, nb_last_error());
    return *f && *c && *ctx;
}
static inline void ckpt_output_close(nb_st_file *f, nb_ckpt *c, nb_context *ctx) {
    nb_context_destroy(ctx);
    nb_ckpt_close(c);
    nb_st_close(f);
}

/* Layer `prefix` of the written checkpoint c as the reader sees it: the
 * layout `lay` of want's n x k, declared by config.json (not excluded, not
 * mismatched, K in order), and nb_ckpt_layer_weight_v2 giving want's
 * format, group and scale type with exactly the reference quantizer's codes,
 * scales and zero points (rc, rs, rz; sizes sz). */
static inline void check_read_back(nb_ckpt *c, const char *out, const char *prefix, nb_ckpt_format lay,
                                   const nb_weight_desc *want, const nb_weight_sizes_v2 *sz, const uint8_t *rc,
                                   const uint8_t *rs, const uint8_t *rz) {
    size_t li = 0;
    nb_status st = nb_ckpt_layer_find(c, prefix, &li);
    CHECK(st == NB_OK, "%s: layer %s not found", out, prefix);
    if (st != NB_OK) return;
    nb_ckpt_layer L;
    nb_ckpt_layer_at(c, li, &L);
    CHECK(L.format == lay && L.n == want->n && L.k == want->k && !L.config_mismatch && !L.excluded && !L.k_permuted &&
              L.decided_by == NB_CKPT_SRC_CONFIG_JSON,
          "%s: %s is %s %lldx%lld by %s (%s)", out, prefix, fmt_name(L.format), (long long)L.n, (long long)L.k,
          src_name(L.decided_by), L.problem);
    nb_weight_desc got;
    uint8_t *gc = (uint8_t *)calloc(1, sz->codes_bytes), *gs = (uint8_t *)calloc(1, sz->scales_bytes);
    uint8_t *gz = sz->zeros_bytes ? (uint8_t *)calloc(1, sz->zeros_bytes) : NULL;
    const nb_weight_buffers gb = {.codes = gc, .scales = gs, .zeros = gz};
    nb_weight_sizes_v2 cap = *sz;
    st = nb_ckpt_layer_weight_v2(c, li, 0, &got, &gb, &cap);
    CHECK(st == NB_OK, "%s: %s weight_v2: %s", out, prefix, nb_last_error());
    if (st == NB_OK) {
        CHECK(got.format == want->format && got.group_size == want->group_size && got.scale_type == want->scale_type &&
                  got.n == want->n && got.k == want->k,
              "%s: %s read back as format %d group %d scales %d", out, prefix, (int)got.format, (int)got.group_size,
              (int)got.scale_type);
        CHECK(!memcmp(gc, rc, sz->codes_bytes), "%s: %s codes differ from nb_quantize_host_v2", out, prefix);
        CHECK(!memcmp(gs, rs, sz->scales_bytes), "%s: %s scales differ from nb_quantize_host_v2", out, prefix);
        CHECK(!rz || !memcmp(gz, rz, sz->zeros_bytes), "%s: %s zero points differ from nb_quantize_host_v2", out,
              prefix);
    }
    free(gc);
    free(gs);
    free(gz);
}

/* Tensor t of the fixture (its bytes src) copied into f byte for byte. */
static inline void check_copy(const nb_st_file *f, const ispec *t, const void *src, size_t bytes, const char *out) {
    nb_st_tensor x;
    CHECK(nb_st_tensor_find(f, t->name, &x) == NB_OK && x.dtype == t->dt && x.bytes == bytes &&
              !memcmp(x.data, src, bytes),
          "%s: %s is not a byte-identical copy", out, t->name);
}

/* The other files of the input directory copied into g_dir/<out>. */
static inline void check_tokenizer_copied(const char *out) {
    char file[1100];
    snprintf(file, sizeof file, "%s/%s/tokenizer.json", g_dir, out);
    CHECK(access(file, F_OK) == 0, "%s: tokenizer.json not copied", out);
}

/* Print the counts, remove a temporary directory when every check passed;
 * the exit code. */
static inline int fixture_dir_close(int keep) {
    if (keep) {
        printf("fixtures kept in %s\n", g_dir);
    } else if (g_fail == 0) {
        char cmd[600];
        snprintf(cmd, sizeof cmd, "rm -rf '%s'", g_dir);
        if (system(cmd) != 0) printf("note: could not remove %s\n", g_dir);
    } else {
        printf("files kept in %s\n", g_dir);
    }
    printf("%d passed, %d failed\n", g_pass, g_fail);
    return g_fail ? 1 : 0;
}

#endif
