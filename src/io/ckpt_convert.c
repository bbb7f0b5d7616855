/* ckpt_convert.c - 4-bit checkpoint layout conversion (rules in
 * ckpt_convert.h).
 *
 * Three passes, so that every refusal happens before OUT is touched:
 *   1. layers: every layer nb_ckpt_open detected is checked against the
 *      target, and every reciprocal scale is classified (exact, adjusted,
 *      inexact) - a strict conversion stops here;
 *   2. plan: per input shard, the list of output tensors (name, dtype, shape,
 *      where its bytes come from); names must be unique over the checkpoint;
 *   3. write: per shard through ckpt_out.c, tensors streamed from the input
 *      mapping (a copy, an expert's slice of a copy, or a reciprocal).
 */
#define _DEFAULT_SOURCE
#include "ckpt_convert.h"
#include "checkpoint.h"
#include "io_internal.h"

#include <cjson/cJSON.h>

#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* where an output tensor's bytes come from */
enum { R_COPY = 0, R_SLICE = 1, R_TO_CT = 2, R_TO_MO = 3 };
/* what an input tensor is in its layer */
enum { K_CODES = 0, K_SCALES = 1, K_TSCALE = 2, K_ISCALE = 3, K_OTHER = 4 };
/* how a reciprocal scale converts */
enum { SC_EXACT = 0, SC_ADJUSTED = 1, SC_INEXACT = 2, SC_INVALID = 3 };

typedef struct cplan {
    const char *name; /* shard base name (owned by the checkpoint) */
    const nb_st_file *f;
    nbio_oent *ents;
    size_t ne;
} cplan;

typedef struct cstate {
    const nb_ckpt_convert_opts *o;
    nb_ckpt *c;
    nbio_out out;
    nb_ckpt_convert_summary sum;
    char **unq; /* prefixes of unquantized linear layers */
    size_t nunq;
    int nv, mx, input_acts;
    cplan *plans;
    size_t nplans;
    size_t ei, en;
    uint64_t bdone, btotal;
    char *err;
    size_t errlen;
} cstate;

static const char *const k_suffix[4][4] = {
    /* codes, block scales, tensor scale, input scale; [0] unused */
    {NULL, NULL, NULL, NULL},
    {".weight", ".weight_scale", ".weight_scale_2", ".input_scale"},                   /* modelopt */
    {".weight_packed", ".weight_scale", ".weight_global_scale", ".input_global_scale"}, /* ct */
    {".weight", ".weight_scale", NULL, NULL},                                          /* quark */
};

const char *nb_ckpt_target_name(nb_ckpt_target t) {
    switch (t) {
    case NB_CKPT_TARGET_MODELOPT: return "modelopt";
    case NB_CKPT_TARGET_CT: return "compressed-tensors";
    case NB_CKPT_TARGET_QUARK: return "quark";
    }
    return NULL;
}

nb_status nb_ckpt_target_parse(const char *s, nb_ckpt_target *out) {
    if (!s || !out) return NB_ERR_NULL_POINTER;
    if (!strcmp(s, "modelopt")) *out = NB_CKPT_TARGET_MODELOPT;
    else if (!strcmp(s, "compressed-tensors") || !strcmp(s, "ct")) *out = NB_CKPT_TARGET_CT;
    else if (!strcmp(s, "quark")) *out = NB_CKPT_TARGET_QUARK;
    else return NB_ERR_NOT_FOUND;
    return NB_OK;
}

void nb_ckpt_convert_opts_init(nb_ckpt_convert_opts *o) {
    if (!o) return;
    memset(o, 0, sizeof *o);
    o->target = NB_CKPT_TARGET_CT;
}

void nbio_convert_warn(const nb_ckpt_convert_opts *o, nb_ckpt_convert_summary *sum, const char *fmt, ...) {
    char msg[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    sum->warnings++;
    if (o->warn) o->warn(o->warn_user, msg);
}

static int is_nvfp4(nb_ckpt_format f) { return f == NB_CKPT_MODELOPT_NVFP4 || f == NB_CKPT_CT_NVFP4; }

/* The layout a layer of format f takes in the target; NONE when it cannot. */
static nb_ckpt_format target_format(nb_ckpt_target t, nb_ckpt_format f) {
    int nv = is_nvfp4(f);
    if (t == NB_CKPT_TARGET_MODELOPT) return nv ? NB_CKPT_MODELOPT_NVFP4 : NB_CKPT_NONE;
    if (t == NB_CKPT_TARGET_QUARK) return nv ? NB_CKPT_NONE : NB_CKPT_QUARK_MXFP4;
    return nv ? NB_CKPT_CT_NVFP4 : NB_CKPT_CT_MXFP4;
}

static int target_of(nb_ckpt_format f) {
    return f == NB_CKPT_MODELOPT_NVFP4 ? NB_CKPT_TARGET_MODELOPT
           : f == NB_CKPT_QUARK_MXFP4  ? NB_CKPT_TARGET_QUARK
           : f == NB_CKPT_GPTOSS_MXFP4 ? 0
                                       : NB_CKPT_TARGET_CT;
}

/* ------------------------------------------------------------ reciprocals */

static float f32_at(const void *p) {
    float v;
    memcpy(&v, p, 4); /* safetensors is little-endian, as every host we build for */
    return v;
}

/* g for a ct checkpoint from a ModelOpt scale s (see the header). */
static int recip_to_ct(float s, float *g) {
    if (!isfinite(s) || s == 0.0f) return SC_INVALID;
    float g0 = 1.0f / s;
    if (!isfinite(g0) || g0 == 0.0f) return SC_INVALID;
    *g = g0;
    if (1.0f / g0 == s) return SC_EXACT;
    double want = 1.0 / (double)s, best = INFINITY;
    float up = g0, dn = g0;
    for (int i = 0; i < 8; i++) {
        up = nextafterf(up, INFINITY);
        dn = nextafterf(dn, 0.0f);
        if (1.0f / up == s && fabs((double)up - want) < best) best = fabs((double)up - want), *g = up;
        if (1.0f / dn == s && fabs((double)dn - want) < best) best = fabs((double)dn - want), *g = dn;
    }
    if (best < INFINITY) return SC_ADJUSTED;
    *g = g0;
    return SC_INEXACT;
}

/* s for a ModelOpt checkpoint from a ct global scale g: always 1.0f / g,
 * exactly the tensor scale nibble reads from the ct layer. */
static int recip_to_mo(float g, float *s) {
    if (!isfinite(g) || g == 0.0f) return SC_INVALID;
    *s = 1.0f / g;
    if (*s == 0.0f || !isfinite(*s)) return SC_INVALID;
    float back;
    return recip_to_ct(*s, &back) != SC_INVALID && !memcmp(&back, &g, 4) ? SC_EXACT : SC_ADJUSTED;
}

nb_status nbio_convert_recip(const nb_ckpt_convert_opts *o, nb_ckpt_convert_summary *sum, const char *name, float v,
                             int to_ct, float *r, char *err, size_t errlen) {
    int k = to_ct ? recip_to_ct(v, r) : recip_to_mo(v, r);
    if (k == SC_INVALID)
        return nbio_fail(err, errlen, NB_ERR_UNSUPPORTED, "%s = %g has no finite non-zero reciprocal (the %s layout "
                         "stores 1/x)", name, (double)v, to_ct ? "compressed-tensors" : "ModelOpt");
    if (k == SC_EXACT) {
        sum->scales_exact++;
    } else if (k == SC_ADJUSTED) {
        sum->scales_adjusted++;
        nbio_convert_warn(o, sum, "note: %s = %.9g -> %.9g: dequantization identical; %s", name, (double)v, (double)*r,
                          to_ct ? "not the plain float reciprocal (that one would change the scale)"
                                : "converting back would store a different, equivalent value");
    } else {
        sum->scales_inexact++;
        if (o->strict)
            return nbio_fail(err, errlen, NB_ERR_UNSUPPORTED, "%s = %.9g: no float g has 1/g == %.9g, so "
                             "compressed-tensors cannot hold it exactly (strict)", name, (double)v, (double)v);
        nbio_convert_warn(o, sum, "warning: %s = %.9g: no float g has 1/g equal to it; writing %.9g, whose reciprocal "
                          "%.9g differs in the last place (dequantized values may differ by that rounding)",
                          name, (double)v, (double)*r, (double)(1.0f / *r));
    }
    return NB_OK;
}

/* Classify the reciprocal of tensor `name` (if present); counts and warns. */
static nb_status classify_recip(cstate *s, const char *prefix, const char *suffix, int to_ct) {
    char *name = nbio_concat(prefix, suffix);
    if (!name) return nbio_fail(s->err, s->errlen, NB_ERR_OUT_OF_MEMORY, "out of memory");
    size_t ti;
    nb_status st = NB_OK;
    if (nb_ckpt_tensor_find(s->c, name, &ti) == NB_OK) {
        nb_st_tensor t;
        nb_ckpt_tensor_at(s->c, ti, &t, NULL);
        float r = 0.0f;
        st = nbio_convert_recip(s->o, &s->sum, name, f32_at(t.data), to_ct, &r, s->err, s->errlen);
    }
    free(name);
    return st;
}

/* ------------------------------------------------------------ pass 1: layers */

static nb_status check_layers(cstate *s) {
    size_t nl = 0;
    nb_ckpt_layer_count(s->c, &nl);
    size_t nquant = 0;
    for (size_t i = 0; i < nl; i++) {
        nb_ckpt_layer L;
        nb_ckpt_layer_at(s->c, i, &L);
        if (L.format == NB_CKPT_NONE) {
            if (!nbio_push_str(&s->unq, &s->nunq, nbio_strdup(L.prefix)))
                return nbio_fail(s->err, s->errlen, NB_ERR_OUT_OF_MEMORY, "out of memory");
            s->sum.layers_unquantized++;
            continue;
        }
        if (L.format == NB_CKPT_INCONSISTENT)
            return nbio_fail(s->err, s->errlen, NB_ERR_UNSUPPORTED, "layer %s is inconsistent (%s); nothing to convert "
                             "it from", L.prefix, L.problem);
        nb_ckpt_format tf = target_format(s->o->target, L.format);
        if (tf == NB_CKPT_NONE)
            return nbio_fail(s->err, s->errlen, NB_ERR_UNSUPPORTED, "layer %s is %s; the %s layout holds %s only",
                             L.prefix, nb_ckpt_format_name(L.format), nb_ckpt_target_name(s->o->target),
                             s->o->target == NB_CKPT_TARGET_MODELOPT ? "NVFP4" : "MXFP4");
        nquant++;
        if (is_nvfp4(L.format)) s->nv = 1;
        else s->mx = 1;
        if (L.format == NB_CKPT_QUARK_MXFP4 || L.format == NB_CKPT_CT_MXFP4) s->input_acts = 1;
        if (L.format == tf) {
            s->sum.layers_unchanged++;
        } else {
            s->sum.layers_converted++;
            if (L.format == NB_CKPT_GPTOSS_MXFP4) s->sum.experts_split += (size_t)L.experts;
        }
        if (is_nvfp4(L.format)) {
            const char *const *sx = k_suffix[target_of(L.format)];
            size_t ti;
            char *iname = nbio_concat(L.prefix, sx[K_ISCALE]);
            if (!iname) return nbio_fail(s->err, s->errlen, NB_ERR_OUT_OF_MEMORY, "out of memory");
            if (nb_ckpt_tensor_find(s->c, iname, &ti) == NB_OK) s->input_acts = 1;
            free(iname);
        }
        if (L.format != tf && is_nvfp4(L.format)) {
            int to_ct = L.format == NB_CKPT_MODELOPT_NVFP4;
            const char *const *sx = k_suffix[target_of(L.format)];
            nb_status st = classify_recip(s, L.prefix, sx[K_TSCALE], to_ct);
            if (st == NB_OK) st = classify_recip(s, L.prefix, sx[K_ISCALE], to_ct);
            if (st != NB_OK) return st;
        }
    }
    if (!nquant)
        return nbio_fail(s->err, s->errlen, NB_ERR_UNSUPPORTED, "no 4-bit layer found: nothing to convert (a BF16 "
                         "checkpoint is quantized with nibble quantize)");
    if (s->nv && s->mx)
        return nbio_fail(s->err, s->errlen, NB_ERR_UNSUPPORTED, "the checkpoint has both NVFP4 and MXFP4 layers; one "
                         "%s format cannot declare both", nb_ckpt_target_name(s->o->target));
    return NB_OK;
}

/* ------------------------------------------------------------ pass 2: plan */

/* What tensor `name` is in a layer of format f with this prefix. */
static int member_kind(nb_ckpt_format f, const char *prefix, const char *name) {
    const char *suf = name + strlen(prefix);
    if (f == NB_CKPT_GPTOSS_MXFP4)
        return !strcmp(suf, "_blocks") || !strcmp(suf, ".blocks")   ? K_CODES
               : !strcmp(suf, "_scales") || !strcmp(suf, ".scales") ? K_SCALES
                                                                     : K_OTHER;
    const char *const *sx = k_suffix[target_of(f)];
    for (int k = K_CODES; k <= K_ISCALE; k++)
        if (sx[k] && !strcmp(suf, sx[k])) return k;
    return K_OTHER;
}

/* prefix P with "e." inserted before its last component. */
static char *expert_prefix(const char *p, int64_t e) {
    const char *dot = strrchr(p, '.');
    size_t head = dot ? (size_t)(dot - p) + 1 : 0, n = strlen(p) + 24;
    char *q = (char *)malloc(n);
    if (q) snprintf(q, n, "%.*s%lld.%s", (int)head, p, (long long)e, p + head);
    return q;
}

static nbio_oent *add_ent(nbio_oent *ents, size_t *ne, char *name, const nb_st_tensor *t, size_t src, int role,
                          int64_t expert) {
    if (!name) return NULL;
    nbio_oent *e = &ents[(*ne)++];
    e->name = name;
    e->dtype = t->dtype;
    e->rank = t->rank;
    memcpy(e->shape, t->shape, sizeof e->shape);
    e->bytes = t->bytes;
    e->src = src;
    e->role = role;
    e->expert = expert;
    return e;
}

/* The gpt-oss layer that a P_bias / P.bias tensor of shape [E, R] belongs to. */
static int gptoss_bias(const nb_ckpt *c, const nb_st_tensor *t, nb_ckpt_layer *L) {
    const char *sufs[2] = {"_bias", ".bias"};
    for (int i = 0; i < 2; i++) {
        if (!nbio_ends_with(t->name, sufs[i])) continue;
        size_t n = strlen(t->name) - 5;
        char *p = (char *)malloc(n + 1);
        if (!p) return -1;
        memcpy(p, t->name, n);
        p[n] = 0;
        size_t li;
        int found = nb_ckpt_layer_find(c, p, &li) == NB_OK;
        free(p);
        if (!found) continue;
        nb_ckpt_layer_at(c, li, L);
        if (L->format == NB_CKPT_GPTOSS_MXFP4 && t->rank == 2 && t->shape[0] == L->experts && L->experts > 0)
            return 1;
    }
    return 0;
}

/* Output entries for input tensor i of file f. */
static nb_status plan_tensor(cstate *s, const nb_st_tensor *t, size_t i, nbio_oent *ents, size_t *ne) {
    const nb_ckpt_target tg = s->o->target;
    size_t ci;
    int64_t li = -1;
    if (nb_ckpt_tensor_find(s->c, t->name, &ci) == NB_OK) {
        nb_st_tensor dummy;
        nb_ckpt_tensor_at(s->c, ci, &dummy, &li);
    }
    nb_ckpt_layer L;
    memset(&L, 0, sizeof L);
    if (li >= 0) nb_ckpt_layer_at(s->c, (size_t)li, &L);
    int oom = 0;
    if (li < 0 || L.format == NB_CKPT_NONE || L.format == target_format(tg, L.format)) {
        int b = li < 0 ? gptoss_bias(s->c, t, &L) : 0;
        if (b < 0) oom = 1;
        else if (b == 1) { /* [E, R] -> Q(e).bias [R] */
            for (int64_t e = 0; e < L.experts && !oom; e++) {
                char *q = expert_prefix(L.prefix, e);
                nbio_oent *o = add_ent(ents, ne, q ? nbio_concat(q, ".bias") : NULL, t, i, R_SLICE, e);
                free(q);
                if (!o) oom = 1;
                else {
                    o->rank = 1;
                    o->shape[0] = t->shape[1];
                    o->shape[1] = 0;
                    o->bytes = t->bytes / (uint64_t)L.experts;
                }
            }
        } else {
            if (!add_ent(ents, ne, nbio_strdup(t->name), t, i, R_COPY, 0)) oom = 1;
            else s->sum.tensors_copied++;
        }
        return oom ? nbio_fail(s->err, s->errlen, NB_ERR_OUT_OF_MEMORY, "out of memory") : NB_OK;
    }
    int kind = member_kind(L.format, L.prefix, t->name);
    const char *const *tx = k_suffix[tg];
    if (kind == K_OTHER || !tx[kind]) { /* a member the target has no name for: keep it as it is */
        if (!add_ent(ents, ne, nbio_strdup(t->name), t, i, R_COPY, 0))
            return nbio_fail(s->err, s->errlen, NB_ERR_OUT_OF_MEMORY, "out of memory");
        s->sum.tensors_copied++;
        return NB_OK;
    }
    if (L.format == NB_CKPT_GPTOSS_MXFP4) {
        for (int64_t e = 0; e < L.experts; e++) {
            char *q = expert_prefix(L.prefix, e);
            nbio_oent *o = add_ent(ents, ne, q ? nbio_concat(q, tx[kind]) : NULL, t, i, R_SLICE, e);
            free(q);
            if (!o) return nbio_fail(s->err, s->errlen, NB_ERR_OUT_OF_MEMORY, "out of memory");
            /* blocks [E, R, K/32, 16] -> [R, K/2]; scales [E, R, K/32] -> [R, K/32] */
            o->rank = 2;
            o->shape[0] = t->shape[1];
            o->shape[1] = kind == K_CODES ? t->shape[2] * 16 : t->shape[2];
            o->shape[2] = o->shape[3] = 0;
            o->bytes = t->bytes / (uint64_t)L.experts;
        }
        return NB_OK;
    }
    nbio_oent *o = add_ent(ents, ne, nbio_concat(L.prefix, tx[kind]), t, i, R_COPY, 0);
    if (!o) return nbio_fail(s->err, s->errlen, NB_ERR_OUT_OF_MEMORY, "out of memory");
    if (kind == K_TSCALE || kind == K_ISCALE) {
        /* ModelOpt exports a 0-d scalar, compressed-tensors a [1] tensor */
        o->role = tg == NB_CKPT_TARGET_CT ? R_TO_CT : R_TO_MO;
        o->rank = tg == NB_CKPT_TARGET_CT ? 1 : 0;
        o->shape[0] = tg == NB_CKPT_TARGET_CT ? 1 : 0;
    }
    return NB_OK;
}

/* How many output tensors input tensor t can become (an upper bound). */
static size_t expansion(const nb_ckpt *c, const nb_st_tensor *t) {
    size_t ci;
    int64_t li = -1;
    nb_ckpt_layer L;
    if (nb_ckpt_tensor_find(c, t->name, &ci) == NB_OK) {
        nb_st_tensor dummy;
        nb_ckpt_tensor_at(c, ci, &dummy, &li);
    }
    if (li >= 0) {
        nb_ckpt_layer_at(c, (size_t)li, &L);
        return L.format == NB_CKPT_GPTOSS_MXFP4 ? (size_t)L.experts : 1;
    }
    return gptoss_bias(c, t, &L) == 1 ? (size_t)L.experts : 1;
}

static int cmp_cstr(const void *a, const void *b) { return strcmp(*(char *const *)a, *(char *const *)b); }

static nb_status plan_all(cstate *s) {
    size_t ns = 0;
    nb_ckpt_shard_count(s->c, &ns, NULL);
    s->plans = (cplan *)calloc(ns ? ns : 1, sizeof *s->plans);
    if (!s->plans) return nbio_fail(s->err, s->errlen, NB_ERR_OUT_OF_MEMORY, "out of memory");
    s->nplans = ns;
    for (size_t k = 0; k < ns; k++) {
        cplan *p = &s->plans[k];
        nb_ckpt_shard_at(s->c, k, &p->name, &p->f);
        size_t count = 0, cap = 1;
        nb_st_count(p->f, &count);
        for (size_t i = 0; i < count; i++) { /* gpt-oss tensors become one per expert */
            nb_st_tensor t;
            nb_st_tensor_at(p->f, i, &t, NULL, 0);
            cap += expansion(s->c, &t);
            s->btotal += t.bytes;
        }
        s->sum.tensors_in += count;
        p->ents = (nbio_oent *)calloc(cap, sizeof *p->ents);
        if (!p->ents) return nbio_fail(s->err, s->errlen, NB_ERR_OUT_OF_MEMORY, "out of memory");
        for (size_t i = 0; i < count; i++) {
            nb_st_tensor t;
            nb_status st = nb_st_tensor_at(p->f, i, &t, s->err, s->errlen);
            if (st == NB_OK) st = plan_tensor(s, &t, i, p->ents, &p->ne);
            if (st != NB_OK) return st;
        }
        s->en += p->ne;
    }
    /* one name, one tensor, over the whole output */
    char **names = (char **)malloc((s->en ? s->en : 1) * sizeof *names);
    if (!names) return nbio_fail(s->err, s->errlen, NB_ERR_OUT_OF_MEMORY, "out of memory");
    size_t n = 0;
    for (size_t k = 0; k < s->nplans; k++)
        for (size_t j = 0; j < s->plans[k].ne; j++) names[n++] = s->plans[k].ents[j].name;
    qsort(names, n, sizeof *names, cmp_cstr);
    nb_status st = NB_OK;
    for (size_t i = 1; i < n && st == NB_OK; i++)
        if (!strcmp(names[i - 1], names[i]))
            st = nbio_fail(s->err, s->errlen, NB_ERR_INVALID_ARGUMENT, "two output tensors would be called \"%.200s\" "
                           "(a converted name collides with an existing tensor)", names[i]);
    free(names);
    s->sum.tensors_out = n;
    return st;
}

/* ------------------------------------------------------------ pass 3: write */

static nb_status write_shard(cstate *s, cplan *p) {
    nbio_shard sh;
    nb_status st = nbio_shard_begin(&s->out, &sh, p->name, p->f, p->ents, p->ne);
    for (size_t j = 0; j < p->ne && st == NB_OK; j++) {
        const nbio_oent *e = &p->ents[j];
        nb_st_tensor t;
        if ((st = nb_st_tensor_at(p->f, e->src, &t, s->err, s->errlen)) != NB_OK) break;
        if (s->o->progress) s->o->progress(s->o->progress_user, s->ei, s->en, s->bdone, s->btotal, e->name);
        if (e->role == R_COPY) {
            st = nbio_shard_copy(&sh, e, t.data);
        } else if (e->role == R_SLICE) {
            st = nbio_shard_copy(&sh, e, (const uint8_t *)t.data + (size_t)e->expert * e->bytes);
        } else {
            float v = f32_at(t.data), r = 0.0f;
            if ((e->role == R_TO_CT ? recip_to_ct(v, &r) : recip_to_mo(v, &r)) == SC_INVALID)
                st = nbio_fail(s->err, s->errlen, NB_ERR_INTERNAL, "%s: scale changed during the conversion", t.name);
            else st = nbio_shard_write(&sh, e, &r, 4, 0);
        }
        s->ei++;
        s->bdone += e->bytes;
    }
    if (st == NB_OK) st = nbio_shard_commit(&sh, p->ents, p->ne);
    nbio_shard_end(&sh);
    return st;
}

/* ------------------------------------------------------------ configs */

static nb_status write_configs(cstate *s, const char *dir, int *regenerated) {
    nb_ckpt_config cfg;
    nb_ckpt_get_config(s->c, &cfg);
    nb_ckpt_format tf = target_format(s->o->target, s->nv ? NB_CKPT_MODELOPT_NVFP4 : NB_CKPT_CT_MXFP4);
    *regenerated = cfg.declared != tf;
    if (!*regenerated) return NB_OK; /* the source already declares the target: copied as they are */
    cJSON *config = NULL, *hf = NULL;
    nb_status st = nbio_read_json(dir, "config.json", NB_CKPT_MAX_CONFIG, &config, s->err, s->errlen);
    if (st == NB_OK) st = nbio_read_json(dir, "hf_quant_config.json", NB_CKPT_MAX_CONFIG, &hf, s->err, s->errlen);
    if (st != NB_OK) goto done;
    const cJSON *kv = cJSON_GetObjectItemCaseSensitive(cJSON_GetObjectItemCaseSensitive(hf, "quantization"),
                                                       "kv_cache_quant_algo");
    const cJSON *qc0 = cJSON_GetObjectItemCaseSensitive(config, "quantization_config");
    const cJSON *kvs = cJSON_GetObjectItemCaseSensitive(qc0, "kv_cache_scheme");
    if ((kv && !cJSON_IsNull(kv)) || (kvs && !cJSON_IsNull(kvs)))
        nbio_convert_warn(s->o, &s->sum, "warning: the source declares a quantized KV cache; the setting is not "
                          "translated (k_scale / v_scale tensors are copied unchanged)");
    if (s->nunq) qsort(s->unq, s->nunq, sizeof *s->unq, cmp_cstr);
    const char *const *ex = (const char *const *)s->unq;
    if (s->o->target == NB_CKPT_TARGET_MODELOPT) {
        cJSON *h = nbio_hf_quant_config(ex, s->nunq, NULL);
        st = nbio_out_write_json(&s->out, "hf_quant_config.json", h);
        cJSON_Delete(h);
        if (st != NB_OK) goto done;
    }
    if (config) {
        cJSON *qc = s->o->target == NB_CKPT_TARGET_MODELOPT ? nbio_qc_modelopt(ex, s->nunq)
                    : s->o->target == NB_CKPT_TARGET_QUARK  ? nbio_qc_quark("even", ex, s->nunq)
                                                            : nbio_qc_ct(s->nv, s->input_acts, ex, s->nunq);
        cJSON_DeleteItemFromObjectCaseSensitive(config, "quantization_config");
        cJSON_AddItemToObject(config, "quantization_config", qc);
        st = nbio_out_write_json(&s->out, "config.json", config);
    }
done:
    cJSON_Delete(config);
    cJSON_Delete(hf);
    return st;
}

/* ------------------------------------------------------------ entry point */

nb_status nb_ckpt_convert(const char *in, const char *out, const nb_ckpt_convert_opts *opts,
                          nb_ckpt_convert_summary *summary, char *err, size_t errlen) {
    if (!in || !out || !opts) return nbio_fail(err, errlen, NB_ERR_NULL_POINTER, "nb_ckpt_convert: NULL argument");
    if (!nb_ckpt_target_name(opts->target))
        return nbio_fail(err, errlen, NB_ERR_INVALID_ARGUMENT, "nb_ckpt_convert: unknown target %d", (int)opts->target);
    if (summary) memset(summary, 0, sizeof *summary);
    if (nbio_is_gguf(in)) return nbio_convert_gguf(in, out, opts, summary, err, errlen);
    cstate s;
    memset(&s, 0, sizeof s);
    s.o = opts;
    s.err = err;
    s.errlen = errlen;
    int out_open = 0, regenerated = 0, sharded = 0;
    size_t nshards = 0;
    nb_status st = nb_ckpt_open(in, &s.c, err, errlen);
    if (st == NB_OK) st = check_layers(&s);
    if (st == NB_OK) st = plan_all(&s);
    if (st == NB_OK && (st = nbio_out_open(&s.out, out, err, errlen)) == NB_OK) out_open = 1;
    for (size_t k = 0; k < s.nplans && st == NB_OK; k++) st = write_shard(&s, &s.plans[k]);
    if (st == NB_OK && s.o->progress) s.o->progress(s.o->progress_user, s.en, s.en, s.bdone, s.btotal, NULL);
    const char *dir = s.c ? nb_ckpt_dir(s.c) : NULL;
    if (st == NB_OK) nb_ckpt_shard_count(s.c, &nshards, &sharded);
    if (st == NB_OK && sharded) {
        const char *idx = NULL;
        nb_ckpt_file_at(s.c, 0, &idx, NULL);
        const char *slash = strrchr(idx, '/');
        st = nbio_out_write_index(&s.out, slash ? slash + 1 : idx);
    }
    if (st == NB_OK) st = write_configs(&s, dir, &regenerated);
    static const char *const skip[] = {"config.json", "hf_quant_config.json"};
    if (st == NB_OK) st = nbio_out_copy_others(&s.out, dir, skip, regenerated ? 2 : 0);
    s.sum.shards = s.out.shards;
    s.sum.files_copied = s.out.files_copied;
    s.sum.bytes_out = s.out.file_bytes;
    s.sum.bytes_in = s.btotal;
    if (out_open) nbio_out_close(&s.out, st == NB_OK);
    if (st == NB_OK && summary) *summary = s.sum;
    if (s.plans)
        for (size_t k = 0; k < s.nplans; k++) nbio_oents_free(s.plans[k].ents, s.plans[k].ne);
    free(s.plans);
    nbio_free_strs(s.unq, s.nunq);
    nb_ckpt_close(s.c);
    return st;
}
