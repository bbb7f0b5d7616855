/* ckpt_gguf.c - a GGUF file's tensors as a safetensors checkpoint in the
 * ModelOpt, compressed-tensors or Quark layout: nb_ckpt_convert with a GGUF
 * input (the rules are in nibble_io.h, "GGUF INPUT").
 *
 * As in ckpt_convert.c, everything the tensor list decides (types, target,
 * reciprocal scales, name collisions) is refused before OUT is touched.
 * Then the one output file is laid out from shapes alone (ckpt_out.c) and
 * written tensor by tensor: a 4-bit unit (a 2-D tensor, or one expert of a
 * 3-D one) goes through nb_gguf_fp4_to_checkpoint into one codes and one
 * scales buffer, written at their offsets and freed; a copied tensor is
 * written from the file mapping; the source pages are dropped after use.
 */
#define _DEFAULT_SOURCE
#include "io_internal.h"

#include <cjson/cJSON.h>

#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

/* what an output tensor holds */
enum { G_COPY = 0, G_CODES = 1, G_SCALES = 2, G_TSCALE = 3, G_ISCALE = 4 };

/* One 4-bit layer of the output: tensor ti, expert e (0 for a 2-D tensor). */
typedef struct gunit {
    size_t ti;
    int64_t expert;
    nb_gguf_fp4 f;
    float tscale, iscale; /* the values written (reciprocals for compressed-tensors) */
    nbio_oent *codes, *scales;
} gunit;

typedef struct gstate {
    const nb_ckpt_convert_opts *o;
    nb_gguf_file *g;
    size_t nt;
    nbio_out out;
    nb_ckpt_convert_summary sum;
    nbio_oent *ents;
    size_t ne;
    gunit *units;
    size_t nu;
    unsigned char *folded; /* per GGUF tensor: a P.scale / P.input_scale folded into its layer */
    char **unq;            /* unquantized linear layers (hf_quant_config.json's exclude list) */
    size_t nunq;
    nb_format fmt;         /* the weight format of the 4-bit tensors (one per output) */
} gstate;

int nbio_is_gguf(const char *path) {
    struct stat sb;
    int fd = -1;
    char magic[4] = {0};
    /* probing records no failure: the caller's open reports one */
    if (!path || stat(path, &sb) != 0 || !S_ISREG(sb.st_mode) ||
        (fd = open(path, O_RDONLY | O_CLOEXEC | O_NONBLOCK | O_NOCTTY)) < 0)
        return 0;
    const int yes = read(fd, magic, 4) == 4 && !memcmp(magic, "GGUF", 4);
    close(fd);
    return yes;
}

/* The safetensors dtype holding ggml type t byte for byte; 0 when none. */
static nb_st_dtype st_dtype(uint32_t t) {
    switch (t) {
    case NB_GGML_TYPE_F32: return NB_ST_F32;
    case NB_GGML_TYPE_F16: return NB_ST_F16;
    case NB_GGML_TYPE_BF16: return NB_ST_BF16;
    case 24: return NB_ST_I8;
    case 25: return NB_ST_I16;
    case 26: return NB_ST_I32;
    case 27: return NB_ST_I64;
    case 28: return NB_ST_F64;
    }
    return (nb_st_dtype)0;
}

static nb_status oom(void) { return nbi_fail(NULL, NB_ERR_OUT_OF_MEMORY, "out of memory"); }

/* The layer prefix of a 4-bit tensor name: without ".weight" when it has it. */
static char *layer_prefix(const char *name) {
    size_t n = strlen(name);
    if (n > 7 && nbio_ends_with(name, ".weight")) n -= 7;
    char *p = (char *)malloc(n + 1);
    if (p) {
        memcpy(p, name, n);
        p[n] = 0;
    }
    return p;
}

static float f32_le(const void *p, size_t i) {
    const uint8_t *b = (const uint8_t *)p + 4 * i;
    uint32_t u = (uint32_t)b[0] | (uint32_t)b[1] << 8 | (uint32_t)b[2] << 16 | (uint32_t)b[3] << 24;
    float v;
    memcpy(&v, &u, 4);
    return v;
}

static nbio_oent *add(gstate *s, char *name, nb_st_dtype dt, int rank, int64_t d0, int64_t d1, uint64_t bytes,
                      size_t src, int role) {
    if (!name) return NULL;
    nbio_oent *e = &s->ents[s->ne++];
    memset(e, 0, sizeof *e);
    e->name = name;
    e->dtype = dt;
    e->rank = rank;
    e->shape[0] = d0;
    e->shape[1] = d1;
    e->bytes = bytes;
    e->src = src;
    e->role = role;
    return e;
}

/* The scale of a 4-bit unit from F32 tensor `si` (1 or one per expert), for
 * the target: as is (modelopt) or its reciprocal (compressed-tensors). */
static nb_status unit_scale(gstate *s, size_t si, int64_t expert, float *out) {
    nb_gguf_tensor t;
    nb_status st = nb_gguf_tensor_at(s->g, si, &t);
    if (st != NB_OK) return st;
    const uint64_t el = t.bytes / 4;
    float v = f32_le(t.data, el == 1 ? 0 : (size_t)expert);
    *out = v;
    if (s->o->target != NB_CKPT_TARGET_CT) return NB_OK;
    char name[NB_GGUF_MAX_NAME + 32];
    if (el == 1) snprintf(name, sizeof name, "%s", t.name);
    else snprintf(name, sizeof name, "%s[%lld]", t.name, (long long)expert);
    return nbio_convert_recip(s->o, &s->sum, name, v, 1, out);
}

/* The input scale tensor P.input_scale of a 4-bit tensor, if any (F32, 1 or
 * `want` values); -1 when there is none. */
static nb_status input_scale_of(gstate *s, const char *prefix, int64_t want, int64_t *index) {
    *index = -1;
    char *name = nbio_concat(prefix, ".input_scale");
    if (!name) return oom();
    const int64_t i = nbio_gguf_lookup(s->g, name);
    nb_status st = NB_OK;
    nb_gguf_tensor t;
    if (i >= 0 && (st = nb_gguf_tensor_at(s->g, (size_t)i, &t)) == NB_OK) {
        uint64_t el = t.bytes / 4;
        if (t.type != NB_GGML_TYPE_F32 || (el != 1 && el != (uint64_t)want))
            st = nbi_fail(NULL, NB_ERR_UNSUPPORTED, "GGUF tensor \"%s\" must be F32 with 1 or %lld "
                          "values", name, (long long)want);
        else *index = i;
    }
    free(name);
    return st;
}

/* ------------------------------------------------------------ plan */

/* The tensor names of a 4-bit layer in each target (layout knowledge). */
typedef struct gnames {
    const char *codes, *tscale, *iscale;
} gnames;

static gnames target_names(nb_ckpt_target tg) {
    const int ct = tg == NB_CKPT_TARGET_CT;
    gnames n = {ct ? ".weight_packed" : ".weight", ct ? ".weight_global_scale" : ".weight_scale_2",
                ct ? ".input_global_scale" : ".input_scale"};
    return n;
}

/* The output entries of unit u (layer prefix lp): codes, block scales in the
 * dtype of the format's scale type, and for a format with a tensor scale the
 * tensor scale and (when the GGUF file has one) the input scale - ModelOpt
 * scalars [], compressed-tensors [1]. */
static nb_status plan_unit(gstate *s, const char *lp, const nb_gguf_fp4 *f, const nb_format_info *fi, size_t ui,
                           int has_iscale) {
    const int ct = s->o->target == NB_CKPT_TARGET_CT;
    const gnames nm = target_names(s->o->target);
    if (!add(s, nbio_concat(lp, nm.codes), NB_ST_U8, 2, f->n, f->k * fi->element_bits / 8, f->codes_bytes, ui,
             G_CODES) ||
        !add(s, nbio_concat(lp, ".weight_scale"), nbio_scale_dtype(fi->scale_type), 2, f->n, f->k / fi->group_size,
             f->scales_bytes, ui, G_SCALES) ||
        (fi->tensor_scale && !add(s, nbio_concat(lp, nm.tscale), NB_ST_F32, ct, ct, 0, 4, ui, G_TSCALE)) ||
        (fi->tensor_scale && has_iscale && !add(s, nbio_concat(lp, nm.iscale), NB_ST_F32, ct, ct, 0, 4, ui, G_ISCALE)))
        return oom();
    return NB_OK;
}

/* Output entries for 4-bit tensor i (one layer, or one per expert). */
static nb_status plan_fp4(gstate *s, size_t i, const nb_gguf_tensor *t) {
    nb_gguf_fp4 f;
    nb_format_info fi;
    nb_status st = nb_gguf_fp4_info(s->g, i, &f);
    if (st == NB_OK) st = nb_format_get_info(f.format, &fi);
    if (st != NB_OK) return st;
    const nb_ckpt_target tg = s->o->target;
    char up[16], what[160];
    nbio_format_upper(f.format, up, sizeof up);
    snprintf(what, sizeof what, "GGUF tensor \"%s\" is %s", t->name, up);
    if (nbio_target_layout(tg, f.format) == NB_CKPT_NONE) return nbio_target_refuses(tg, what);
    if (s->fmt && s->fmt != f.format) {
        char a[16];
        nbio_format_upper(s->fmt, a, sizeof a);
        return nbi_fail(NULL, NB_ERR_UNSUPPORTED, "the GGUF file has both %s and %s tensors; one %s format cannot "
                        "declare both", a, up, tg == NB_CKPT_TARGET_CT ? "compressed-tensors" : "target");
    }
    s->fmt = f.format;
    char *prefix = layer_prefix(t->name);
    if (!prefix) return oom();
    int64_t iscale = -1;
    const int64_t experts = f.experts ? f.experts : 1;
    if (fi.tensor_scale) st = input_scale_of(s, prefix, experts, &iscale);
    if (st == NB_OK && f.scale_tensor >= 0) s->folded[f.scale_tensor] = 1;
    if (st == NB_OK && iscale >= 0) s->folded[iscale] = 1;
    for (int64_t e = 0; e < experts && st == NB_OK; e++) {
        gunit *u = &s->units[s->nu];
        memset(u, 0, sizeof *u);
        u->ti = i;
        u->expert = e;
        u->f = f;
        u->tscale = 1.0f;
        if (fi.tensor_scale && f.scale_tensor >= 0) st = unit_scale(s, (size_t)f.scale_tensor, e, &u->tscale);
        else if (fi.tensor_scale && tg == NB_CKPT_TARGET_CT)
            st = nbio_convert_recip(s->o, &s->sum, t->name, 1.0f, 1, &u->tscale);
        if (st == NB_OK && iscale >= 0) st = unit_scale(s, (size_t)iscale, e, &u->iscale);
        if (st != NB_OK) break;
        char lp[NB_GGUF_MAX_NAME + 32];
        if (f.experts) snprintf(lp, sizeof lp, "%s.%lld", prefix, (long long)e);
        else snprintf(lp, sizeof lp, "%s", prefix);
        st = plan_unit(s, lp, &f, &fi, s->nu++, iscale >= 0);
    }
    s->sum.layers_converted++;
    if (f.experts) s->sum.experts_split += (size_t)f.experts;
    free(prefix);
    return st;
}

static int cmp_str(const void *a, const void *b) { return strcmp(*(char *const *)a, *(char *const *)b); }

/* The copy of a tensor that is not 4-bit (nor a scale folded into one), or
 * its refusal or skip when it has no lossless safetensors form. */
static nb_status plan_copy(gstate *s, size_t i, const nb_gguf_tensor *t) {
    const nb_st_dtype dt = st_dtype(t->type);
    const char *tn = "?";
    nb_ggml_type_name(t->type, &tn); /* every type the reader accepted has one */
    if (!dt) {
        if (!s->o->skip_unsupported)
            return nbi_fail(NULL, NB_ERR_UNSUPPORTED, "GGUF tensor \"%s\" is %s, which has no lossless safetensors "
                            "form (only MXFP4, NVFP4, F32, F16, BF16, F64 and integers convert); --skip-unsupported "
                            "leaves such tensors out", t->name, tn);
        s->sum.tensors_skipped++;
        if (s->o->skipped) s->o->skipped(s->o->skipped_user, t->name, tn);
        return NB_OK;
    }
    nbio_oent *e = add(s, nbio_strdup(t->name), dt, t->n_dims, 0, 0, t->bytes, i, G_COPY);
    if (!e) return oom();
    memcpy(e->shape, t->shape, sizeof t->shape); /* row-major: ne reversed */
    s->sum.tensors_copied++;
    if (t->n_dims == 2 && (dt == NB_ST_F32 || dt == NB_ST_F16 || dt == NB_ST_BF16) &&
        nbio_ends_with(t->name, ".weight")) {
        if (!nbio_push_str(&s->unq, &s->nunq, layer_prefix(t->name))) return oom();
        s->sum.layers_unquantized++;
    }
    return NB_OK;
}

static nb_status plan(gstate *s) {
    size_t cap = 1, nunits = 0;
    nb_status st = NB_OK;
    for (size_t i = 0; i < s->nt && st == NB_OK; i++) {
        nb_gguf_tensor t;
        if ((st = nb_gguf_tensor_at(s->g, i, &t)) != NB_OK) break;
        s->sum.bytes_in += t.bytes;
        if (nbio_ggml_format(t.type)) {
            const int64_t e = t.n_dims == 3 && t.ne[2] > 0 ? t.ne[2] : 1;
            nunits += (size_t)e;
            cap += 4 * (size_t)e;
        } else {
            cap++;
        }
    }
    if (st != NB_OK) return st;
    s->ents = (nbio_oent *)calloc(cap, sizeof *s->ents);
    s->units = (gunit *)calloc(nunits ? nunits : 1, sizeof *s->units);
    s->folded = (unsigned char *)calloc(s->nt ? s->nt : 1, 1);
    if (!s->ents || !s->units || !s->folded) return oom();
    /* 4-bit tensors first: they decide which F32 scale tensors are folded in */
    for (int pass = 0; pass < 2; pass++)
        for (size_t i = 0; i < s->nt && st == NB_OK; i++) {
            nb_gguf_tensor t;
            if ((st = nb_gguf_tensor_at(s->g, i, &t)) != NB_OK) break;
            const int fp4 = nbio_ggml_format(t.type) != 0;
            if (pass == 0 && fp4) st = plan_fp4(s, i, &t);
            else if (pass == 1 && !fp4 && !s->folded[i]) st = plan_copy(s, i, &t);
        }
    if (st != NB_OK) return st;
    if (!s->fmt)
        return nbi_fail(NULL, NB_ERR_UNSUPPORTED, "no MXFP4 or NVFP4 tensor in the GGUF file: nothing to convert");
    /* one name, one tensor */
    char **names = (char **)malloc((s->ne ? s->ne : 1) * sizeof *names);
    if (!names) return oom();
    for (size_t i = 0; i < s->ne; i++) names[i] = s->ents[i].name;
    qsort(names, s->ne, sizeof *names, cmp_str);
    for (size_t i = 1; i < s->ne && st == NB_OK; i++)
        if (!strcmp(names[i - 1], names[i]))
            st = nbi_fail(NULL, NB_ERR_INVALID_ARGUMENT, "two output tensors would be called \"%.200s\" (a "
                          "converted name collides with a GGUF tensor)", names[i]);
    free(names);
    s->sum.tensors_out = s->ne;
    return st;
}

/* ------------------------------------------------------------ write */

/* Codes and scales of unit u, both written at their offsets. */
static nb_status write_unit(gstate *s, nbio_shard *sh, gunit *u) {
    uint8_t *codes = (uint8_t *)malloc(u->f.codes_bytes ? u->f.codes_bytes : 1);
    uint8_t *scales = (uint8_t *)malloc(u->f.scales_bytes ? u->f.scales_bytes : 1);
    nb_weight_desc d;
    size_t rem = 0;
    nb_status st = codes && scales ? NB_OK : oom();
    if (st == NB_OK)
        st = nb_gguf_fp4_to_checkpoint(s->g, u->ti, u->expert, &d, codes, u->f.codes_bytes, scales,
                                       u->f.scales_bytes, &rem);
    if (st == NB_OK) st = nbio_shard_write(sh, u->codes, codes, u->f.codes_bytes, 0);
    if (st == NB_OK) st = nbio_shard_write(sh, u->scales, scales, u->f.scales_bytes, 0);
    s->sum.scale_bytes_remapped += rem;
    free(codes);
    free(scales);
    nb_gguf_tensor t;
    if (nb_gguf_tensor_at(s->g, u->ti, &t) == NB_OK) { /* (u->ti is an index plan() read) */
        const uint64_t per = t.bytes / (uint64_t)(u->f.experts ? u->f.experts : 1);
        nbio_drop_pages((const uint8_t *)t.data + (size_t)(per * (uint64_t)u->expert), (size_t)per);
    }
    return st;
}

static nb_status write_all(gstate *s) {
    nbio_shard sh = {.fd = -1};
    uint64_t done = 0;
    nb_status st = nbio_shard_begin(&s->out, &sh, "model.safetensors", NULL, s->ents, s->ne);
    /* the entries are in file order now: point each unit at its codes and scales */
    for (size_t j = 0; j < s->ne; j++) {
        nbio_oent *e = &s->ents[j];
        if (e->role == G_CODES) s->units[e->src].codes = e;
        if (e->role == G_SCALES) s->units[e->src].scales = e;
    }
    for (size_t j = 0; j < s->ne && st == NB_OK; j++) {
        const nbio_oent *e = &s->ents[j];
        if (s->o->progress) s->o->progress(s->o->progress_user, j, s->ne, done, s->sum.bytes_in, e->name);
        done += e->role == G_COPY ? e->bytes : e->role == G_CODES ? e->bytes + s->units[e->src].f.scales_bytes : 0;
        if (e->role == G_COPY) {
            nb_gguf_tensor t;
            if ((st = nb_gguf_tensor_at(s->g, e->src, &t)) == NB_OK) st = nbio_shard_copy(&sh, e, t.data);
        } else if (e->role == G_CODES) { /* writes the unit's scales too */
            st = write_unit(s, &sh, &s->units[e->src]);
        } else if (e->role != G_SCALES) {
            const gunit *u = &s->units[e->src];
            const float v = e->role == G_TSCALE ? u->tscale : u->iscale;
            st = nbio_shard_write(&sh, e, &v, 4, 0);
        }
    }
    if (st == NB_OK) st = nbio_shard_commit(&sh, s->ents, s->ne);
    nbio_shard_end(&sh);
    if (st == NB_OK && s->o->progress)
        s->o->progress(s->o->progress_user, s->ne, s->ne, s->sum.bytes_in, s->sum.bytes_in, NULL);
    return st;
}

/* ------------------------------------------------------------ entry point */

nb_status nbio_convert_gguf(const char *in, const char *out, const nb_ckpt_convert_opts *opts,
                            nb_ckpt_convert_summary *summary) {
    gstate s;
    memset(&s, 0, sizeof s);
    s.o = opts;
    s.sum.gguf = 1;
    int out_open = 0;
    nb_gguf_header h;
    memset(&h, 0, sizeof h);
    nb_status st = nb_gguf_open(in, &s.g);
    if (st == NB_OK) st = nb_gguf_get_header(s.g, &h);
    if (st == NB_OK) {
        s.nt = h.n_tensors;
        s.sum.tensors_in = h.n_tensors;
        st = plan(&s);
    }
    if (st == NB_OK && (st = nbio_out_open(&s.out, out)) == NB_OK) out_open = 1;
    if (st == NB_OK) st = write_all(&s);
    if (st == NB_OK && opts->target == NB_CKPT_TARGET_MODELOPT) {
        if (s.nunq) qsort(s.unq, s.nunq, sizeof *s.unq, cmp_str);
        cJSON *hq = nbio_hf_quant_config((const char *const *)s.unq, s.nunq, NULL);
        st = nbio_out_write_json(&s.out, "hf_quant_config.json", hq);
        cJSON_Delete(hq);
    }
    if (st == NB_OK && s.sum.scale_bytes_remapped)
        nbio_convert_warn(opts, &s.sum, "note: %zu NVFP4 scale bytes were rewritten from ggml's unsigned E4M3 to the "
                          "E4M3 byte of the same value (bit 7 cleared, 0x7F -> 0x00)", s.sum.scale_bytes_remapped);
    if (st == NB_OK)
        nbio_convert_warn(opts, &s.sum, "note: the GGUF metadata (%zu keys) is not converted: no config.json is "
                          "written and tensor names stay GGUF's", h.n_kv);
    s.sum.shards = s.out.shards;
    s.sum.bytes_out = s.out.file_bytes;
    if (out_open) st = nbio_out_finish(&s.out, st);
    if (st == NB_OK && summary) *summary = s.sum;
    nbio_oents_free(s.ents, s.ne);
    free(s.units);
    free(s.folded);
    nbio_free_strs(s.unq, s.nunq);
    nb_gguf_close(s.g);
    return st;
}
