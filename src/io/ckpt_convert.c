/* ckpt_convert.c - 4-bit checkpoint layout conversion (rules in
 * nibble_io.h, "convert").
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
    nb_format fmt;  /* the weight format of the 4-bit layers (one per output) */
    int input_acts; /* a layer has an input scale (or is MXFP4, whose presets quantize activations) */
    cplan *plans;
    size_t nplans;
    size_t ei, en;
    uint64_t bdone, btotal;
} cstate;

static const char *const k_suffix[4][4] = {
    /* codes, block scales, tensor scale, input scale; [0] unused */
    {NULL, NULL, NULL, NULL},
    {".weight", ".weight_scale", ".weight_scale_2", ".input_scale"},                   /* modelopt */
    {".weight_packed", ".weight_scale", ".weight_global_scale", ".input_global_scale"}, /* ct */
    {".weight", ".weight_scale", NULL, NULL},                                          /* quark */
};

/* What each target layout holds: the layout a layer of weight format f
 * takes there (layout knowledge; a format no row names is refused). */
static const struct {
    nb_ckpt_target target;
    const char *name;
    nb_format format;
    nb_ckpt_format layout;
} k_targets[] = {
    {NB_CKPT_TARGET_MODELOPT, "modelopt", NB_FORMAT_NVFP4, NB_CKPT_MODELOPT_NVFP4},
    {NB_CKPT_TARGET_CT, "compressed-tensors", NB_FORMAT_NVFP4, NB_CKPT_CT_NVFP4},
    {NB_CKPT_TARGET_CT, "compressed-tensors", NB_FORMAT_MXFP4, NB_CKPT_CT_MXFP4},
    {NB_CKPT_TARGET_QUARK, "quark", NB_FORMAT_MXFP4, NB_CKPT_QUARK_MXFP4},
};
#define N_TARGETS (sizeof k_targets / sizeof k_targets[0])

static const char *target_name(nb_ckpt_target t) {
    for (size_t i = 0; i < N_TARGETS; i++)
        if (k_targets[i].target == t) return k_targets[i].name;
    return NULL;
}

nb_ckpt_format nbio_target_layout(nb_ckpt_target t, nb_format f) {
    for (size_t i = 0; i < N_TARGETS; i++)
        if (k_targets[i].target == t && k_targets[i].format == f) return k_targets[i].layout;
    return NB_CKPT_NONE;
}

void nbio_format_upper(nb_format f, char *buf, size_t n) {
    nb_format_info fi;
    snprintf(buf, n, "%s", nb_format_get_info(f, &fi) == NB_OK ? fi.name : "?");
    for (char *c = buf; *c; c++)
        if (*c >= 'a' && *c <= 'z') *c = (char)(*c - 'a' + 'A');
}

nb_status nbio_target_refuses(nb_ckpt_target t, const char *what) {
    char held[64] = "";
    size_t n = 0;
    for (size_t i = 0; i < N_TARGETS && n < sizeof held; i++) {
        if (k_targets[i].target != t) continue;
        char up[16];
        nbio_format_upper(k_targets[i].format, up, sizeof up);
        n += (size_t)snprintf(held + n, sizeof held - n, "%s%s", n ? " and " : "", up);
    }
    return nbi_fail(NULL, NB_ERR_UNSUPPORTED, "%s; the %s layout holds %s only", what, target_name(t), held);
}

nb_status nb_ckpt_target_name(nb_ckpt_target t, const char **name) {
    if (!name) return nbi_fail(NULL, NB_ERR_NULL_POINTER, "nb_ckpt_target_name: name is NULL");
    if (!target_name(t))
        return nbi_fail(NULL, NB_ERR_INVALID_ARGUMENT, "nb_ckpt_target_name: %d is not an nb_ckpt_target", (int)t);
    *name = target_name(t);
    return NB_OK;
}

nb_status nb_ckpt_target_parse(const char *s, nb_ckpt_target *out) {
    if (!s || !out) return nbi_fail(NULL, NB_ERR_NULL_POINTER, "nb_ckpt_target_parse: s and out must not be NULL");
    for (size_t i = 0; i < N_TARGETS; i++)
        if (!strcmp(s, k_targets[i].name)) {
            *out = k_targets[i].target;
            return NB_OK;
        }
    if (!strcmp(s, "ct")) {
        *out = NB_CKPT_TARGET_CT;
        return NB_OK;
    }
    return nbi_fail(NULL, NB_ERR_NOT_FOUND, "nb_ckpt_target_parse: \"%.64s\" is not modelopt, compressed-tensors "
                    "(ct) or quark", s);
}

nb_status nb_ckpt_convert_opts_init(nb_ckpt_convert_opts *o) {
    if (!o) return nbi_fail(NULL, NB_ERR_NULL_POINTER, "nb_ckpt_convert_opts_init: o is NULL");
    memset(o, 0, sizeof *o);
    o->target = NB_CKPT_TARGET_CT;
    return NB_OK;
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

/* The weight format of a 4-bit layout (0 for none and inconsistent). */
static nb_format weight_of(nb_ckpt_format f) {
    nb_format w = (nb_format)0;
    return nb_ckpt_format_weight(f, &w) == NB_OK ? w : (nb_format)0;
}

/* 1 when layers of layout f carry a tensor scale (their format's row says). */
static int has_tscale(nb_ckpt_format f) {
    nb_format_info fi;
    return weight_of(f) && nb_format_get_info(weight_of(f), &fi) == NB_OK && fi.tensor_scale;
}

/* The layout a layer of format f takes in the target; NONE when it cannot. */
static nb_ckpt_format target_format(nb_ckpt_target t, nb_ckpt_format f) {
    return weight_of(f) ? nbio_target_layout(t, weight_of(f)) : NB_CKPT_NONE;
}

/* The suffix table row of a layout (target_of: its nb_ckpt_target; gpt-oss 0). */
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
                             int to_ct, float *r) {
    int k = to_ct ? recip_to_ct(v, r) : recip_to_mo(v, r);
    if (k == SC_INVALID)
        return nbi_fail(NULL, NB_ERR_UNSUPPORTED, "%s = %g has no finite non-zero reciprocal (the %s layout "
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
            return nbi_fail(NULL, NB_ERR_UNSUPPORTED, "%s = %.9g: no float g has 1/g == %.9g, so "
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
    if (!name) return nbi_fail(NULL, NB_ERR_OUT_OF_MEMORY, "out of memory");
    nb_status st = NB_OK;
    const int64_t ti = nbio_ckpt_lookup(s->c, name, NULL);
    if (ti >= 0) {
        nb_st_tensor t;
        if ((st = nb_ckpt_tensor_at(s->c, (size_t)ti, &t, NULL)) == NB_OK) {
            float r = 0.0f;
            st = nbio_convert_recip(s->o, &s->sum, name, f32_at(t.data), to_ct, &r);
        }
    }
    free(name);
    return st;
}

/* ------------------------------------------------------------ pass 1: layers */

/* One 4-bit layer of pass 1: the target must hold it, one weight format per
 * output, and every reciprocal scale it needs is classified. */
static nb_status check_layer(cstate *s, const nb_ckpt_layer *L) {
    const char *lname = "";
    nb_status st = nb_ckpt_format_name(L->format, &lname);
    if (st != NB_OK) return st;
    const nb_ckpt_format tf = target_format(s->o->target, L->format);
    if (tf == NB_CKPT_NONE) {
        char what[320];
        snprintf(what, sizeof what, "layer %.200s is %s", L->prefix, lname);
        return nbio_target_refuses(s->o->target, what);
    }
    const nb_format w = weight_of(L->format);
    if (s->fmt && s->fmt != w) {
        char a[16], b[16];
        nbio_format_upper(s->fmt, a, sizeof a);
        nbio_format_upper(w, b, sizeof b);
        const char *tn = target_name(s->o->target);
        return nbi_fail(NULL, NB_ERR_UNSUPPORTED, "the checkpoint has both %s and %s layers; one %s format cannot "
                        "declare both", a, b, tn);
    }
    s->fmt = w;
    if (L->format == tf) {
        s->sum.layers_unchanged++;
    } else {
        s->sum.layers_converted++;
        if (L->format == NB_CKPT_GPTOSS_MXFP4) s->sum.experts_split += (size_t)L->experts;
    }
    if (!has_tscale(L->format)) {
        s->input_acts = 1; /* the MXFP4 presets quantize activations dynamically */
        return NB_OK;
    }
    const char *const *sx = k_suffix[target_of(L->format)];
    char *iname = nbio_concat(L->prefix, sx[K_ISCALE]);
    if (!iname) return nbi_fail(NULL, NB_ERR_OUT_OF_MEMORY, "out of memory");
    if (nbio_ckpt_lookup(s->c, iname, NULL) >= 0) s->input_acts = 1;
    free(iname);
    if (L->format == tf) return NB_OK;
    const int to_ct = L->format == NB_CKPT_MODELOPT_NVFP4;
    st = classify_recip(s, L->prefix, sx[K_TSCALE], to_ct);
    if (st == NB_OK) st = classify_recip(s, L->prefix, sx[K_ISCALE], to_ct);
    return st;
}

static nb_status check_layers(cstate *s) {
    size_t nl = 0, nquant = 0;
    nb_status st = nb_ckpt_layer_count(s->c, &nl);
    for (size_t i = 0; i < nl && st == NB_OK; i++) {
        const nb_ckpt_layer *L = nbio_ckpt_layer_ref(s->c, i);
        if (L->format == NB_CKPT_NONE) {
            if (!nbio_push_str(&s->unq, &s->nunq, nbio_strdup(L->prefix)))
                return nbi_fail(NULL, NB_ERR_OUT_OF_MEMORY, "out of memory");
            s->sum.layers_unquantized++;
            continue;
        }
        if (L->format == NB_CKPT_INCONSISTENT)
            return nbi_fail(NULL, NB_ERR_UNSUPPORTED, "layer %s is inconsistent (%s); nothing to convert it from",
                            L->prefix, L->problem);
        nquant++;
        st = check_layer(s, L);
    }
    if (st == NB_OK && !nquant)
        return nbi_fail(NULL, NB_ERR_UNSUPPORTED, "no 4-bit layer found: nothing to convert (a BF16 checkpoint is "
                        "quantized with nibble quantize)");
    return st;
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
    nbio_oent_like(e, name, t, src, role);
    e->expert = expert;
    return e;
}

/* The gpt-oss layer that a P_bias / P.bias tensor of shape [E, R] belongs to
 * (1 and *L, 0, or -1 when out of memory). */
static int gptoss_bias(const nb_ckpt *c, const nb_st_tensor *t, const nb_ckpt_layer **L) {
    const char *sufs[2] = {"_bias", ".bias"};
    for (int i = 0; i < 2; i++) {
        if (!nbio_ends_with(t->name, sufs[i])) continue;
        size_t n = strlen(t->name) - 5;
        char *p = (char *)malloc(n + 1);
        if (!p) return -1;
        memcpy(p, t->name, n);
        p[n] = 0;
        const int64_t li = nbio_ckpt_layer_lookup(c, p);
        free(p);
        if (li < 0) continue;
        *L = nbio_ckpt_layer_ref(c, (size_t)li);
        if ((*L)->format == NB_CKPT_GPTOSS_MXFP4 && t->rank == 2 && t->shape[0] == (*L)->experts && (*L)->experts > 0)
            return 1;
    }
    return 0;
}

/* Output entries for a tensor outside any 4-bit layer that changes: a
 * gpt-oss expert bias split per expert, or a copy under its own name. */
static nb_status plan_unchanged(cstate *s, const nb_st_tensor *t, size_t i, int64_t li, nbio_oent *ents, size_t *ne) {
    const nb_ckpt_layer *L = NULL;
    int oom = 0;
    int b = li < 0 ? gptoss_bias(s->c, t, &L) : 0;
    if (b < 0) oom = 1;
    else if (b == 1) { /* [E, R] -> Q(e).bias [R] */
        for (int64_t e = 0; e < L->experts && !oom; e++) {
            char *q = expert_prefix(L->prefix, e);
            nbio_oent *o = add_ent(ents, ne, q ? nbio_concat(q, ".bias") : NULL, t, i, R_SLICE, e);
            free(q);
            if (!o) oom = 1;
            else {
                o->rank = 1;
                o->shape[0] = t->shape[1];
                o->shape[1] = 0;
                o->bytes = t->bytes / (uint64_t)L->experts;
            }
        }
    } else {
        if (!add_ent(ents, ne, nbio_strdup(t->name), t, i, R_COPY, 0)) oom = 1;
        else s->sum.tensors_copied++;
    }
    return oom ? nbi_fail(NULL, NB_ERR_OUT_OF_MEMORY, "out of memory") : NB_OK;
}

/* Output entries for input tensor i of file f. */
static nb_status plan_tensor(cstate *s, const nb_st_tensor *t, size_t i, nbio_oent *ents, size_t *ne) {
    const nb_ckpt_target tg = s->o->target;
    int64_t li = -1;
    nbio_ckpt_lookup(s->c, t->name, &li);
    const nb_ckpt_layer *Lp = li >= 0 ? nbio_ckpt_layer_ref(s->c, (size_t)li) : NULL;
    if (!Lp || Lp->format == NB_CKPT_NONE || Lp->format == target_format(tg, Lp->format))
        return plan_unchanged(s, t, i, li, ents, ne);
    const nb_ckpt_layer L = *Lp;
    int kind = member_kind(L.format, L.prefix, t->name);
    const char *const *tx = k_suffix[tg];
    if (kind == K_OTHER || !tx[kind]) { /* a member the target has no name for: keep it as it is */
        if (!add_ent(ents, ne, nbio_strdup(t->name), t, i, R_COPY, 0))
            return nbi_fail(NULL, NB_ERR_OUT_OF_MEMORY, "out of memory");
        s->sum.tensors_copied++;
        return NB_OK;
    }
    if (L.format == NB_CKPT_GPTOSS_MXFP4) {
        for (int64_t e = 0; e < L.experts; e++) {
            char *q = expert_prefix(L.prefix, e);
            nbio_oent *o = add_ent(ents, ne, q ? nbio_concat(q, tx[kind]) : NULL, t, i, R_SLICE, e);
            free(q);
            if (!o) return nbi_fail(NULL, NB_ERR_OUT_OF_MEMORY, "out of memory");
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
    if (!o) return nbi_fail(NULL, NB_ERR_OUT_OF_MEMORY, "out of memory");
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
    int64_t li = -1;
    const nb_ckpt_layer *L = NULL;
    nbio_ckpt_lookup(c, t->name, &li);
    if (li >= 0) {
        L = nbio_ckpt_layer_ref(c, (size_t)li);
        return L->format == NB_CKPT_GPTOSS_MXFP4 ? (size_t)L->experts : 1;
    }
    return gptoss_bias(c, t, &L) == 1 ? (size_t)L->experts : 1;
}

static int cmp_cstr(const void *a, const void *b) { return strcmp(*(char *const *)a, *(char *const *)b); }

/* The output entries of one input shard. */
static nb_status plan_shard(cstate *s, cplan *p) {
    size_t count = 0, cap = 1;
    nb_status st = nb_st_count(p->f, &count);
    for (size_t i = 0; i < count && st == NB_OK; i++) { /* gpt-oss tensors become one per expert */
        nb_st_tensor t;
        if ((st = nb_st_tensor_at(p->f, i, &t)) != NB_OK) break;
        cap += expansion(s->c, &t);
        s->btotal += t.bytes;
    }
    if (st != NB_OK) return st;
    s->sum.tensors_in += count;
    p->ents = (nbio_oent *)calloc(cap, sizeof *p->ents);
    if (!p->ents) return nbi_fail(NULL, NB_ERR_OUT_OF_MEMORY, "out of memory");
    for (size_t i = 0; i < count && st == NB_OK; i++) {
        nb_st_tensor t;
        st = nb_st_tensor_at(p->f, i, &t);
        if (st == NB_OK) st = plan_tensor(s, &t, i, p->ents, &p->ne);
    }
    s->en += p->ne;
    return st;
}

static nb_status plan_all(cstate *s) {
    size_t ns = 0;
    nb_status st = nb_ckpt_shard_count(s->c, &ns, NULL);
    if (st != NB_OK) return st;
    s->plans = (cplan *)calloc(ns ? ns : 1, sizeof *s->plans);
    if (!s->plans) return nbi_fail(NULL, NB_ERR_OUT_OF_MEMORY, "out of memory");
    s->nplans = ns;
    for (size_t k = 0; k < ns; k++) {
        cplan *p = &s->plans[k];
        if ((st = nb_ckpt_shard_at(s->c, k, &p->name, &p->f)) != NB_OK) return st;
        if ((st = plan_shard(s, p)) != NB_OK) return st;
    }
    /* one name, one tensor, over the whole output */
    char **names = (char **)malloc((s->en ? s->en : 1) * sizeof *names);
    if (!names) return nbi_fail(NULL, NB_ERR_OUT_OF_MEMORY, "out of memory");
    size_t n = 0;
    for (size_t k = 0; k < s->nplans; k++)
        for (size_t j = 0; j < s->plans[k].ne; j++) names[n++] = s->plans[k].ents[j].name;
    qsort(names, n, sizeof *names, cmp_cstr);
    for (size_t i = 1; i < n && st == NB_OK; i++)
        if (!strcmp(names[i - 1], names[i]))
            st = nbi_fail(NULL, NB_ERR_INVALID_ARGUMENT, "two output tensors would be called \"%.200s\" "
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
        if ((st = nb_st_tensor_at(p->f, e->src, &t)) != NB_OK) break;
        if (s->o->progress) s->o->progress(s->o->progress_user, s->ei, s->en, s->bdone, s->btotal, e->name);
        if (e->role == R_COPY) {
            st = nbio_shard_copy(&sh, e, t.data);
        } else if (e->role == R_SLICE) {
            st = nbio_shard_copy(&sh, e, (const uint8_t *)t.data + (size_t)e->expert * e->bytes);
        } else {
            float v = f32_at(t.data), r = 0.0f;
            if ((e->role == R_TO_CT ? recip_to_ct(v, &r) : recip_to_mo(v, &r)) == SC_INVALID)
                st = nbi_fail(NULL, NB_ERR_INTERNAL, "%s: scale changed during the conversion", t.name);
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
    nb_status st = nb_ckpt_get_config(s->c, &cfg);
    if (st != NB_OK) return st;
    *regenerated = cfg.declared != nbio_target_layout(s->o->target, s->fmt);
    if (!*regenerated) return NB_OK; /* the source already declares the target: copied as they are */
    cJSON *config = NULL, *hf = NULL;
    st = nbio_read_config(dir, "config.json", NB_CKPT_MAX_CONFIG, &config);
    if (st == NB_OK) st = nbio_read_json(dir, "hf_quant_config.json", NB_CKPT_MAX_CONFIG, &hf);
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
                                                            : nbio_qc_ct(s->fmt, s->input_acts, ex, s->nunq);
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

/* The options nb_ckpt_convert takes (nibble_io.h). */
static nb_status check_opts(const nb_ckpt_convert_opts *opts) {
    if (!target_name(opts->target))
        return nbi_fail(NULL, NB_ERR_INVALID_ARGUMENT, "nb_ckpt_convert: unknown target %d", (int)opts->target);
    if (!nbio_reserved_zero(opts->reserved, sizeof opts->reserved / sizeof opts->reserved[0]))
        return nbi_fail(NULL, NB_ERR_INVALID_ARGUMENT, "nb_ckpt_convert: opts.reserved is not zero (use "
                        "nb_ckpt_convert_opts_init)");
    return NB_OK;
}

/* Pass 3 and the rest: the shards, the index, the configs, the other files. */
static nb_status write_all(cstate *s) {
    nb_status st = NB_OK;
    int regenerated = 0, sharded = 0;
    size_t nshards = 0;
    const char *dir = NULL;
    for (size_t k = 0; k < s->nplans && st == NB_OK; k++) st = write_shard(s, &s->plans[k]);
    if (st == NB_OK && s->o->progress) s->o->progress(s->o->progress_user, s->en, s->en, s->bdone, s->btotal, NULL);
    if (st == NB_OK) st = nb_ckpt_get_dir(s->c, &dir);
    if (st == NB_OK) st = nb_ckpt_shard_count(s->c, &nshards, &sharded);
    if (st == NB_OK && sharded) {
        const char *idx = NULL;
        if ((st = nb_ckpt_file_at(s->c, 0, &idx, NULL)) != NB_OK) return st;
        const char *slash = strrchr(idx, '/');
        st = nbio_out_write_index(&s->out, slash ? slash + 1 : idx);
    }
    if (st == NB_OK) st = write_configs(s, dir, &regenerated);
    static const char *const skip[] = {"config.json", "hf_quant_config.json"};
    if (st == NB_OK) st = nbio_out_copy_others(&s->out, dir, skip, regenerated ? 2 : 0);
    return st;
}

nb_status nb_ckpt_convert(const char *in, const char *out, const nb_ckpt_convert_opts *opts,
                          nb_ckpt_convert_summary *summary) {
    if (!in || !out || !opts)
        return nbi_fail(NULL, NB_ERR_NULL_POINTER, "nb_ckpt_convert: in, out and opts must not be NULL");
    nb_status st = check_opts(opts);
    if (st != NB_OK) return st;
    if (summary) memset(summary, 0, sizeof *summary);
    if (nbio_is_gguf(in)) return nbio_convert_gguf(in, out, opts, summary);
    cstate s;
    memset(&s, 0, sizeof s);
    s.o = opts;
    int out_open = 0;
    st = nb_ckpt_open(in, &s.c);
    if (st == NB_OK) st = check_layers(&s);
    if (st == NB_OK) st = plan_all(&s);
    if (st == NB_OK && (st = nbio_out_open(&s.out, out)) == NB_OK) out_open = 1;
    if (st == NB_OK) st = write_all(&s);
    s.sum.shards = s.out.shards;
    s.sum.files_copied = s.out.files_copied;
    s.sum.bytes_out = s.out.file_bytes;
    s.sum.bytes_in = s.btotal;
    if (out_open) st = nbio_out_finish(&s.out, st);
    if (st == NB_OK && summary) *summary = s.sum;
    if (s.plans)
        for (size_t k = 0; k < s.nplans; k++) nbio_oents_free(s.plans[k].ents, s.plans[k].ne);
    free(s.plans);
    nbio_free_strs(s.unq, s.nunq);
    nb_ckpt_close(s.c);
    return st;
}
