/* ckpt_quantize.c - BF16/F16/F32 checkpoint -> ModelOpt NVFP4 or Quark MXFP4
 * checkpoint (rules and output in nibble_io.h, "quantize").
 *
 * Each output file is streamed through ckpt_out.c: its tensor list (names,
 * dtypes, shapes) is derived from the input shard's header alone - quantized
 * sizes depend only on N and K - so the header and every offset are known
 * before the first tensor is quantized; then input tensors are visited one by
 * one: a quantized one is read straight from the input mapping by
 * nb_quantize_host into one malloc'ed codes and one scales buffer, written at
 * their offsets and freed; a copied one is written from the mapping.  The
 * source pages are dropped after use, so the resident set stays near one
 * source tensor plus its outputs instead of growing with the checkpoint.
 * On the GPU path nb_quantize_staged reads the tensor from the mapping
 * instead (through device memory); everything else is the same.
 */
#define _DEFAULT_SOURCE
#include "io_internal.h"

#include <cjson/cJSON.h>

#include <fnmatch.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

enum { ROLE_COPY = 0, ROLE_CODES = 1, ROLE_SCALES = 2, ROLE_TSCALE = 3 };

/* The checkpoint layout each format is written in.  This is knowledge of the
 * layouts (ModelOpt stores NVFP4, Quark MXFP4); what a layout holds - group,
 * scale dtype, whether there is a weight_scale_2 - follows from the format's
 * row in nibble.h.  A format without a row here is NB_ERR_UNSUPPORTED. */
typedef enum { OUT_MODELOPT = 1, OUT_QUARK = 2 } out_layout;
static const struct {
    nb_format format;
    out_layout layout;
} k_out_layouts[] = {{NB_FORMAT_NVFP4, OUT_MODELOPT}, {NB_FORMAT_MXFP4, OUT_QUARK}};

typedef struct qstate {
    const nb_ckpt_quantize_opts *o;
    nb_format_info fi; /* the row of o->format */
    out_layout layout;
    nb_context *ctx;   /* host-only, or CUDA device 0 when gpu */
    int gpu;
    nbio_out out;
    const char *dir;   /* input directory */
    nb_st_file *single;
    nb_st_index *index;
    const char **pat;
    size_t npat;
    char **excluded;   /* prefixes of float rank-2 weights left unquantized */
    size_t nexcl;
    size_t ti, tn;
    uint64_t bdone, btotal;
    nb_ckpt_quantize_summary sum;
} qstate;

nb_status nb_ckpt_quantize_opts_init(nb_ckpt_quantize_opts *o) {
    if (!o) return nbi_fail(NULL, NB_ERR_NULL_POINTER, "nb_ckpt_quantize_opts_init: o is NULL");
    memset(o, 0, sizeof *o);
    o->format = NB_FORMAT_NVFP4;
    o->mx_rule = NB_MX_SCALE_EVEN;
    o->device = NB_CKPT_DEVICE_AUTO;
    return NB_OK;
}

nb_status nb_ckpt_quantize_formats(nb_format *formats, size_t max, size_t *count) {
    if (!count || (!formats && max))
        return nbi_fail(NULL, NB_ERR_NULL_POINTER,
                        "nb_ckpt_quantize_formats: count (and formats when max > 0) must not be NULL");
    const size_t n = sizeof k_out_layouts / sizeof k_out_layouts[0];
    for (size_t i = 0; i < n && i < max; i++) formats[i] = k_out_layouts[i].format;
    *count = n;
    return NB_OK;
}

static const char *const k_device_names[] = {"auto", "cpu", "gpu"}; /* by nb_ckpt_device value */

nb_status nb_ckpt_device_name(nb_ckpt_device d, const char **name) {
    if (!name) return nbi_fail(NULL, NB_ERR_NULL_POINTER, "nb_ckpt_device_name: name is NULL");
    if ((unsigned)d > NB_CKPT_DEVICE_GPU)
        return nbi_fail(NULL, NB_ERR_INVALID_ARGUMENT, "nb_ckpt_device_name: %d is not an nb_ckpt_device", (int)d);
    *name = k_device_names[d];
    return NB_OK;
}

nb_status nb_ckpt_device_parse(const char *s, nb_ckpt_device *out) {
    if (!s || !out) return nbi_fail(NULL, NB_ERR_NULL_POINTER, "nb_ckpt_device_parse: s and out must not be NULL");
    for (int d = NB_CKPT_DEVICE_AUTO; d <= NB_CKPT_DEVICE_GPU; d++)
        if (!strcmp(s, k_device_names[d])) {
            *out = (nb_ckpt_device)d;
            return NB_OK;
        }
    return nbi_fail(NULL, NB_ERR_NOT_FOUND, "nb_ckpt_device_parse: \"%.64s\" is not auto, cpu or gpu", s);
}

/* ------------------------------------------------------------ small helpers */

static int cmp_str(const void *a, const void *b) { return strcmp(*(char *const *)a, *(char *const *)b); }

/* ------------------------------------------------------------ decisions */

static int tensor_exists(const qstate *q, const char *name) {
    return (q->index ? nbio_st_index_lookup(q->index, name) : nbio_st_lookup(q->single, name)) != NULL;
}

static int is_float(nb_st_dtype d) { return d == NB_ST_BF16 || d == NB_ST_F16 || d == NB_ST_F32; }

/* What becomes of a tensor: quantized, or copied because it is no weight,
 * a weight of another dtype, or a float weight left unquantized (its K, an
 * exclude pattern, or scales already there: listed in exclude_modules). */
typedef enum { T_QUANTIZE, T_OTHER, T_DTYPE, T_SHAPE, T_PATTERN, T_SCALES, T_OOM } fate;

static fate decide(const qstate *q, const nb_st_tensor *t) {
    size_t len = strlen(t->name);
    if (len <= 7 || !nbio_ends_with(t->name, ".weight") || t->rank != 2) return T_OTHER;
    if (!is_float(t->dtype)) return T_DTYPE;
    const int64_t group = q->fi.group_size;
    if (t->shape[0] <= 0 || t->shape[1] <= 0 || t->shape[1] % group) return T_SHAPE;
    char *prefix = (char *)malloc(len + 16);
    if (!prefix) return T_OOM;
    memcpy(prefix, t->name, len - 7);
    prefix[len - 7] = 0;
    fate f = T_QUANTIZE;
    for (size_t i = 0; i < q->npat && f == T_QUANTIZE; i++)
        if (fnmatch(q->pat[i], prefix, 0) == 0) f = T_PATTERN;
    if (f == T_QUANTIZE) {
        /* an existing P.weight_scale(_2) would collide with what we write */
        strcpy(prefix + len - 7, ".weight_scale");
        if (tensor_exists(q, prefix)) f = T_SCALES;
        strcpy(prefix + len - 7, ".weight_scale_2");
        if (f == T_QUANTIZE && q->fi.tensor_scale && tensor_exists(q, prefix)) f = T_SCALES;
    }
    free(prefix);
    return f;
}

static nb_dtype nb_dt(nb_st_dtype d) {
    return d == NB_ST_F32 ? NB_DTYPE_F32 : d == NB_ST_F16 ? NB_DTYPE_F16 : NB_DTYPE_BF16;
}

static void report(qstate *q, const char *name) {
    if (q->o->progress) q->o->progress(q->o->progress_user, q->ti, q->tn, q->bdone, q->btotal, name);
}

/* Quantize input tensor t into the entries e[0..2] (codes, scales, tensor scale). */
static nb_status quantize_one(qstate *q, nbio_shard *sh, const nb_st_tensor *t, nbio_oent *const *e) {
    nb_weight_desc d;
    nb_status st = nb_weight_desc_init(&d, q->o->format, t->shape[0], t->shape[1]);
    nb_weight_sizes sz;
    if (st == NB_OK) st = nb_weight_get_sizes(&d, &sz);
    if (st != NB_OK) return nbi_fail(NULL, st, "%s: %s", t->name, nb_last_error());
    if (d.scale_type == NB_SCALE_E8M0) d.scale_rule = q->o->mx_rule;
    d.method = q->o->method;
    /* nb_quantize_host loads elements with aligned accesses; the writer of
     * any sane file aligns tensors naturally, otherwise take an aligned copy
     * (nb_quantize_staged copies bytes: any alignment). */
    const void *src = t->data;
    void *copy = NULL;
    size_t esz = t->dtype == NB_ST_F32 ? 4 : 2;
    if (!q->gpu && (uintptr_t)src % esz) {
        copy = malloc(t->bytes);
        if (!copy) return nbi_fail(NULL, NB_ERR_OUT_OF_MEMORY, "%s: out of memory", t->name);
        memcpy(copy, src, t->bytes);
        src = copy;
    }
    uint8_t *codes = (uint8_t *)malloc(sz.codes_bytes), *scales = (uint8_t *)malloc(sz.scales_bytes);
    if (!codes || !scales) {
        st = nbi_fail(NULL, NB_ERR_OUT_OF_MEMORY, "%s: out of memory (%zu bytes of codes)", t->name, sz.codes_bytes);
    } else if ((st = q->gpu ? nb_quantize_staged(q->ctx, &d, nb_dt(t->dtype), src, codes, scales, NULL)
                            : nb_quantize_host(q->ctx, &d, nb_dt(t->dtype), src, codes, scales)) != NB_OK) {
        st = nbi_fail(NULL, st, "%s: %s", t->name, nb_context_last_error(q->ctx));
    } else if ((st = nbio_shard_write(sh, e[0], codes, sz.codes_bytes, 0)) == NB_OK &&
               (st = nbio_shard_write(sh, e[1], scales, sz.scales_bytes, 0)) == NB_OK && e[2]) {
        st = nbio_shard_write(sh, e[2], &d.tensor_scale, 4, 0);
    }
    free(codes);
    free(scales);
    free(copy);
    nbio_drop_pages(t->data, t->bytes);
    return st;
}

/* ------------------------------------------------------------ one output file */

/* The entry of input tensor t (index i) copied unchanged. */
static nb_status plan_copy(nbio_oent *e, const nb_st_tensor *t, size_t i) {
    nbio_oent_like(e, nbio_strdup(t->name), t, i, ROLE_COPY);
    return e->name ? NB_OK : nbi_fail(NULL, NB_ERR_OUT_OF_MEMORY, "out of memory");
}

/* The entries of quantized tensor t (index i): P.weight (codes),
 * P.weight_scale (block scales in the dtype of the format's scale type) and,
 * for a format with a tensor scale, P.weight_scale_2 F32 []. */
static nb_status plan_quantized(const qstate *q, nbio_oent *ents, size_t *ne, const nb_st_tensor *t, size_t i) {
    const int64_t n = t->shape[0], k = t->shape[1], g = q->fi.group_size;
    const size_t plen = strlen(t->name) - 7;
    for (int r = ROLE_CODES; r <= ROLE_TSCALE; r++) {
        if (r == ROLE_TSCALE && !q->fi.tensor_scale) break;
        nbio_oent *e = &ents[(*ne)++];
        const char *suf = r == ROLE_CODES ? ".weight" : r == ROLE_SCALES ? ".weight_scale" : ".weight_scale_2";
        e->name = (char *)malloc(plen + strlen(suf) + 1);
        if (!e->name) return nbi_fail(NULL, NB_ERR_OUT_OF_MEMORY, "out of memory");
        memcpy(e->name, t->name, plen);
        strcpy(e->name + plen, suf);
        e->src = i;
        e->role = r;
        if (r == ROLE_TSCALE) {
            e->dtype = NB_ST_F32;
            e->rank = 0;
            e->bytes = 4;
            continue;
        }
        e->dtype = r == ROLE_CODES ? NB_ST_U8 : nbio_scale_dtype(q->fi.scale_type);
        e->rank = 2;
        e->shape[0] = n;
        e->shape[1] = r == ROLE_CODES ? k * q->fi.element_bits / 8 : k / g;
        e->bytes = (uint64_t)e->shape[0] * (uint64_t)e->shape[1];
    }
    return NB_OK;
}

/* Stage 1 of write_shard: the output tensor list of input file f, and the
 * prefixes of float weights left unquantized. */
static nb_status plan_shard(qstate *q, const nb_st_file *f, size_t count, nbio_oent *ents, size_t *ne) {
    for (size_t i = 0; i < count; i++) {
        nb_st_tensor t;
        nb_status st = nb_st_tensor_at(f, i, &t);
        if (st != NB_OK) return st;
        const fate fa = decide(q, &t);
        if (fa == T_OOM) return nbi_fail(NULL, NB_ERR_OUT_OF_MEMORY, "out of memory");
        const int quant = fa == T_QUANTIZE;
        if (fa == T_SHAPE || fa == T_PATTERN || fa == T_SCALES) {
            size_t n = strlen(t.name) - 7;
            char *p = (char *)malloc(n + 1);
            if (p) {
                memcpy(p, t.name, n);
                p[n] = 0;
            }
            if (!nbio_push_str(&q->excluded, &q->nexcl, p)) return nbi_fail(NULL, NB_ERR_OUT_OF_MEMORY, "out of memory");
            q->sum.weights_excluded++;
        }
        st = quant ? plan_quantized(q, ents, ne, &t, i) : plan_copy(&ents[(*ne)++], &t, i);
        if (st != NB_OK) return st;
    }
    return NB_OK;
}

/* Stage 3: every input tensor, quantized or copied into place. */
static nb_status fill_shard(qstate *q, const nb_st_file *f, size_t count, nbio_shard *sh, nbio_oent *const *by_src) {
    for (size_t i = 0; i < count; i++) {
        nb_st_tensor t;
        nb_status st = nb_st_tensor_at(f, i, &t);
        if (st != NB_OK) return st;
        report(q, t.name);
        nbio_oent *const *e = &by_src[i * 3];
        if (e[0]->role == ROLE_CODES) {
            if ((st = quantize_one(q, sh, &t, e)) != NB_OK) return st;
            q->sum.layers_quantized++;
        } else {
            if ((st = nbio_shard_copy(sh, e[0], t.data)) != NB_OK) return st;
            q->sum.tensors_copied++;
        }
        q->ti++;
        q->bdone += t.bytes;
    }
    return NB_OK;
}

/* Write OUT/<shard> from input file f (see the note at the top): the tensor
 * list, then the header and layout, then the tensors one by one. */
static nb_status write_shard(qstate *q, const nb_st_file *f, const char *shard) {
    size_t count = 0, ne = 0;
    nb_status st = nb_st_count(f, &count);
    if (st != NB_OK) return st;
    nbio_oent *ents = (nbio_oent *)calloc(count * 3 + 1, sizeof *ents);
    nbio_oent **by_src = (nbio_oent **)calloc(count * 3 + 1, sizeof *by_src);
    nbio_shard sh = {.fd = -1};
    if (!ents || !by_src) st = nbi_fail(NULL, NB_ERR_OUT_OF_MEMORY, "out of memory");
    if (st == NB_OK) st = plan_shard(q, f, count, ents, &ne);
    if (st == NB_OK) st = nbio_shard_begin(&q->out, &sh, shard, f, ents, ne);
    if (st == NB_OK) {
        for (size_t i = 0; i < ne; i++)
            by_src[ents[i].src * 3 + (size_t)(ents[i].role ? ents[i].role - 1 : 0)] = &ents[i];
        st = fill_shard(q, f, count, &sh, by_src);
    }
    if (st == NB_OK) st = nbio_shard_commit(&sh, ents, ne);
    nbio_shard_end(&sh);
    nbio_oents_free(ents, ne);
    free(by_src);
    return st;
}

/* ------------------------------------------------------------ configs */

/* Quark's scale_calculation_mode for each rule ("round_up", triton's
 * 2^ceil(log2(amax/6)), is not a Quark mode: the name is nibble's). */
static const char *mx_mode(nb_mx_scale_rule r) {
    return r == NB_MX_SCALE_EVEN ? "even" : r == NB_MX_SCALE_OCP ? "floor" : "round_up";
}

static nb_status write_configs(qstate *q, cJSON *config) {
    if (q->nexcl) qsort(q->excluded, q->nexcl, sizeof *q->excluded, cmp_str);
    const char *const *ex = (const char *const *)q->excluded;
    nb_status st = NB_OK;
    if (q->layout == OUT_MODELOPT) {
        cJSON *h = nbio_hf_quant_config(ex, q->nexcl, NULL);
        st = nbio_out_write_json(&q->out, "hf_quant_config.json", h);
        cJSON_Delete(h);
        if (st != NB_OK) return st;
    }
    if (!config) return NB_OK;
    cJSON *qc = q->layout == OUT_MODELOPT ? nbio_qc_modelopt(ex, q->nexcl)
                                          : nbio_qc_quark(mx_mode(q->o->mx_rule), ex, q->nexcl);
    cJSON_DeleteItemFromObjectCaseSensitive(config, "quantization_config");
    cJSON_AddItemToObject(config, "quantization_config", qc);
    return nbio_out_write_json(&q->out, "config.json", config);
}

/* ------------------------------------------------------------ device */

/* q->ctx and q->gpu for opts->device (see nibble_io.h). */
static nb_status open_device(qstate *q, nb_ckpt_device want) {
    int count = 0;
    nb_build_info b;
    nb_status st = nb_get_build_info(&b);
    if (st != NB_OK) return st;
    if (want != NB_CKPT_DEVICE_CPU && b.cuda && (st = nb_device_count(&count)) != NB_OK) return st;
    if (want == NB_CKPT_DEVICE_GPU && !count)
        return nbi_fail(NULL, NB_ERR_NO_DEVICE, "device gpu: %s; use device cpu (or auto) for the C reference",
                        b.cuda ? "no CUDA device found" : "libnibble was built without CUDA");
    if (count) {
        st = nb_context_create(0, &q->ctx);
        if (st == NB_OK) {
            q->gpu = 1;
            nb_device_info info;
            if ((st = nb_context_device_info(q->ctx, &info)) != NB_OK) return st;
            snprintf(q->sum.device_name, sizeof q->sum.device_name, "%s", info.name);
            return NB_OK;
        }
        if (want == NB_CKPT_DEVICE_GPU) return nbi_fail(NULL, st, "device gpu: %s", nb_last_error());
    }
    st = nb_context_create(NB_DEVICE_NONE, &q->ctx);
    if (st != NB_OK) return nbi_fail(NULL, st, "nb_context_create: %s", nb_last_error());
    snprintf(q->sum.device_name, sizeof q->sum.device_name, "host");
    return NB_OK;
}

/* ------------------------------------------------------------ entry point */

/* The options, and the format's row and output layout into q. */
static nb_status check_opts(qstate *q, const nb_ckpt_quantize_opts *opts) {
    nb_status st = nbio_format_info(opts->format, "nb_ckpt_quantize: opts.format", &q->fi);
    if (st != NB_OK) return st;
    for (size_t i = 0; i < sizeof k_out_layouts / sizeof k_out_layouts[0]; i++)
        if (k_out_layouts[i].format == opts->format) q->layout = k_out_layouts[i].layout;
    if (!q->layout || !nbio_scale_dtype(q->fi.scale_type))
        return nbi_fail(NULL, NB_ERR_UNSUPPORTED, "nb_ckpt_quantize: no checkpoint layout is written for format %s "
                        "(ModelOpt holds nvfp4, Quark mxfp4)", q->fi.name);
    if (q->fi.scale_type == NB_SCALE_E8M0 && (opts->mx_rule < NB_MX_SCALE_OCP || opts->mx_rule > NB_MX_SCALE_EVEN))
        return nbi_fail(NULL, NB_ERR_INVALID_ARGUMENT, "nb_ckpt_quantize: unknown MXFP4 scale rule %d",
                        (int)opts->mx_rule);
    if (opts->nexclude && !opts->exclude)
        return nbi_fail(NULL, NB_ERR_NULL_POINTER, "nb_ckpt_quantize: exclude is NULL");
    for (size_t i = 0; i < opts->nexclude; i++)
        if (!opts->exclude[i])
            return nbi_fail(NULL, NB_ERR_NULL_POINTER, "nb_ckpt_quantize: exclude[%zu] is NULL", i);
    if ((unsigned)opts->device > NB_CKPT_DEVICE_GPU)
        return nbi_fail(NULL, NB_ERR_INVALID_ARGUMENT, "nb_ckpt_quantize: unknown device %d", (int)opts->device);
    if (opts->allow_empty != 0 && opts->allow_empty != 1)
        return nbi_fail(NULL, NB_ERR_INVALID_ARGUMENT, "nb_ckpt_quantize: allow_empty is %d (0 or 1)",
                        (int)opts->allow_empty);
    if (opts->method != NB_QUANT_RTN && opts->method != NB_QUANT_MSE)
        return nbi_fail(NULL, NB_ERR_INVALID_ARGUMENT, "nb_ckpt_quantize: unknown method %d (rtn %d, mse %d)",
                        (int)opts->method, NB_QUANT_RTN, NB_QUANT_MSE);
    if (opts->method == NB_QUANT_MSE && opts->device == NB_CKPT_DEVICE_GPU)
        return nbi_fail(NULL, NB_ERR_UNSUPPORTED, "nb_ckpt_quantize: method mse runs on the CPU only; use device cpu "
                        "or auto");
    if (!nbio_reserved_zero(opts->reserved, sizeof opts->reserved / sizeof opts->reserved[0]))
        return nbi_fail(NULL, NB_ERR_INVALID_ARGUMENT, "nb_ckpt_quantize: opts.reserved is not zero (use "
                        "nb_ckpt_quantize_opts_init)");
    return NB_OK;
}

/* Every input tensor's fate before OUT is touched: weights of a dtype that
 * is not quantized are counted (and named when nothing qualifies), and a
 * checkpoint with nothing to quantize is refused unless allow_empty. */
static nb_status survey(qstate *q, const char *file) {
    size_t n[T_OOM + 1] = {0};
    char dtypes[320] = "";
    size_t at = 0;
    for (size_t i = 0; i < q->tn; i++) {
        nb_st_tensor t;
        nb_status st = q->index ? nb_st_index_tensor_at(q->index, i, &t) : nb_st_tensor_at(q->single, i, &t);
        if (st != NB_OK) return st;
        const fate f = decide(q, &t);
        if (f == T_OOM) return nbi_fail(NULL, NB_ERR_OUT_OF_MEMORY, "out of memory");
        n[f]++;
        const char *dn = "?";
        char name[96];
        if (f == T_DTYPE && n[f] <= 3 && at < sizeof dtypes && nb_st_dtype_info(t.dtype, &dn, NULL) == NB_OK)
            at += (size_t)snprintf(dtypes + at, sizeof dtypes - at, "%s%s %s", at ? ", " : "",
                                   nbi_elide(t.name, name, sizeof name), dn);
    }
    q->sum.weights_unsupported = (int32_t)(n[T_DTYPE] < INT32_MAX ? n[T_DTYPE] : INT32_MAX);
    if (n[T_QUANTIZE] || q->o->allow_empty) return NB_OK;
    if (n[T_DTYPE] > 3 && at < sizeof dtypes)
        snprintf(dtypes + at, sizeof dtypes - at, " and %zu more", n[T_DTYPE] - 3);
    char fname[160];
    return nbi_fail(NULL, NB_ERR_UNSUPPORTED, "%s: nothing to quantize to %s: no tensor is a rank-2 BF16, F16 or F32 "
                    "P.weight with K a multiple of %d outside the exclude patterns (%zu weights of another dtype%s%s; "
                    "%zu excluded by a pattern, %zu with K not a multiple of %d, %zu with scales already); "
                    "allow_empty copies it anyway", nbi_elide(file, fname, sizeof fname), q->fi.name,
                    q->fi.group_size, n[T_DTYPE], n[T_DTYPE] ? ": " : "", dtypes, n[T_PATTERN], n[T_SHAPE],
                    q->fi.group_size, n[T_SCALES]);
}

/* Stage 1: open and measure the input, read its config.json, build the
 * exclude patterns, survey the tensors and open the device - all before OUT
 * is touched. */
static nb_status open_input(qstate *q, const char *file, int sharded, cJSON **config) {
    static const char *const defaults[] = {"*lm_head", "*embed*"};
    nb_status st = sharded ? nb_st_index_open(file, &q->index) : nb_st_open(file, &q->single);
    if (st == NB_OK) st = sharded ? nb_st_index_count(q->index, &q->tn) : nb_st_count(q->single, &q->tn);
    for (size_t i = 0; i < q->tn && st == NB_OK; i++) {
        nb_st_tensor t;
        st = sharded ? nb_st_index_tensor_at(q->index, i, &t) : nb_st_tensor_at(q->single, i, &t);
        q->btotal += t.bytes;
    }
    if (st == NB_OK) st = nbio_read_json(q->dir, "config.json", NB_CKPT_MAX_CONFIG, config);
    if (st != NB_OK) return st;
    const nb_ckpt_quantize_opts *o = q->o;
    q->npat = o->nexclude + (o->no_default_excludes ? 0 : 2);
    q->pat = (const char **)malloc((q->npat ? q->npat : 1) * sizeof *q->pat);
    if (!q->pat) return nbi_fail(NULL, NB_ERR_OUT_OF_MEMORY, "out of memory");
    for (size_t i = 0; i < o->nexclude; i++) q->pat[i] = o->exclude[i];
    if (!o->no_default_excludes) {
        q->pat[o->nexclude] = defaults[0];
        q->pat[o->nexclude + 1] = defaults[1];
    }
    /* MSE has no device version: auto means the CPU then */
    const nb_ckpt_device where = o->method == NB_QUANT_MSE ? NB_CKPT_DEVICE_CPU : o->device;
    if ((st = survey(q, file)) != NB_OK || (st = open_device(q, where)) != NB_OK) return st;
    q->sum.device = q->gpu ? NB_CKPT_DEVICE_GPU : NB_CKPT_DEVICE_CPU;
    return NB_OK;
}

/* Stage 2: the tensors file by file, the index, the configs, the other files. */
static nb_status write_output(qstate *q, const char *base, int sharded, cJSON *config) {
    nb_status st = NB_OK;
    if (sharded) {
        size_t ns = 0;
        st = nb_st_index_shard_count(q->index, &ns);
        for (size_t i = 0; i < ns && st == NB_OK; i++) {
            const char *name;
            const nb_st_file *sf;
            if ((st = nb_st_index_shard_at(q->index, i, &name, &sf)) == NB_OK) st = write_shard(q, sf, name);
        }
    } else {
        st = write_shard(q, q->single, base);
    }
    q->ti = q->tn;
    if (st == NB_OK) report(q, NULL);
    if (st == NB_OK && sharded) st = nbio_out_write_index(&q->out, base);
    if (st == NB_OK) st = write_configs(q, config);
    static const char *const skip[] = {"hf_quant_config.json", "config.json"};
    if (st == NB_OK) st = nbio_out_copy_others(&q->out, q->dir, skip, 2);
    q->sum.shards = q->out.shards;
    q->sum.files_copied = q->out.files_copied;
    q->sum.bytes_out = q->out.file_bytes;
    q->sum.tensors_in = q->tn;
    q->sum.bytes_in = q->btotal;
    return st;
}

nb_status nb_ckpt_quantize(const char *in, const char *out, const nb_ckpt_quantize_opts *opts,
                           nb_ckpt_quantize_summary *summary) {
    if (!in || !out || !opts)
        return nbi_fail(NULL, NB_ERR_NULL_POINTER, "nb_ckpt_quantize: in, out and opts must not be NULL");
    qstate q;
    memset(&q, 0, sizeof q);
    q.o = opts;
    nb_status st = check_opts(&q, opts);
    if (st != NB_OK) return st;
    if (summary) memset(summary, 0, sizeof *summary);
    char *dir = NULL, *file = NULL;
    cJSON *config = NULL;
    int sharded = 0, out_open = 0;
    st = nbio_resolve_checkpoint(in, &dir, &file, &sharded);
    q.dir = dir;
    if (st == NB_OK) st = open_input(&q, file, sharded, &config);
    if (st == NB_OK && (st = nbio_out_open(&q.out, out)) == NB_OK) out_open = 1;
    if (st == NB_OK) st = write_output(&q, strrchr(file, '/') ? strrchr(file, '/') + 1 : file, sharded, config);
    if (out_open) st = nbio_out_finish(&q.out, st);
    if (st == NB_OK && summary) *summary = q.sum;
    nbio_free_strs(q.excluded, q.nexcl);
    free(q.pat);
    cJSON_Delete(config);
    nb_context_destroy(q.ctx);
    nb_st_close(q.single);
    nb_st_index_close(q.index);
    free(dir);
    free(file);
    return st;
}
