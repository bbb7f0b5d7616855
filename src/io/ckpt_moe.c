/* ckpt_moe.c - expert groups (nibble_io.h, "expert groups"): which layers of
 * a classified checkpoint make one mixture-of-experts MLP, checked by the
 * header's rules, and their weights in the layout nibble.h's MoE reference
 * reads (one nb_weight_desc per expert, expert-major buffers, a tensor scale
 * per expert).
 *
 * Groups are built once, at nb_ckpt_open, from the layers alone: per-expert
 * names are parsed from each layer's prefix, sorted by (group, expert,
 * projection), and each run of one group prefix is checked; gpt-oss groups
 * pair the two expert-major layers of one prefix.  Every later call reads
 * the member layers through nb_ckpt_layer_weight, so a group's bytes are
 * always the bytes its layers hand out. */
#define _POSIX_C_SOURCE 200809L
#include "io_internal.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* Projections by index (nb_ckpt_moe_proj - 1). */
enum { P_GATE_UP = 0, P_DOWN = 1, P_GATE = 2, P_UP = 3, NPROJ = 4 };

/* A layer of a group: its projection and expert (-1: every expert, gpt-oss). */
typedef struct moe_member {
    int64_t layer, expert;
    int proj;
} moe_member;

typedef struct moe_rec {
    nb_ckpt_moe pub;
    char *prefix;
    int family;   /* per expert: the names the layers use (k_names) */
    int64_t *li;  /* member layers by place: per expert [E][NPROJ]; gpt-oss [NPROJ]; -1 where none; NULL
                   * when the group was found wanting before they were placed */
    moe_member *mem;  /* every layer that names the group, placed or not */
    size_t nmem;
} moe_rec;

struct nbio_moe_set {
    size_t n;
    moe_rec *g;
    size_t nlayers;
    int64_t *lgroup;  /* per layer: its group, -1 */
    int8_t *lproj;    /* its projection index */
    int64_t *lexpert; /* its expert; -1 for a gpt-oss layer (every expert) */
};

/* Names of per-expert layers: Hugging Face's and Mixtral's. */
static const struct {
    const char *name;
    int proj, family;
} k_names[] = {
    {"gate_proj", P_GATE, 0}, {"up_proj", P_UP, 0}, {"down_proj", P_DOWN, 0}, {"gate_up_proj", P_GATE_UP, 0},
    {"w1", P_GATE, 1},        {"w3", P_UP, 1},      {"w2", P_DOWN, 1},
};
#define N_NAMES (sizeof k_names / sizeof k_names[0])

static const char *proj_name(int family, int p) {
    for (size_t i = 0; i < N_NAMES; i++)
        if (k_names[i].family == family && k_names[i].proj == p) return k_names[i].name;
    return "?";
}

/* prefix = G "." e "." name with G's last component "experts" and e in
 * decimal without leading zeros (at most 9 digits): 1, and G's length, e and
 * the k_names row; 0 for any other prefix. */
static int parse_expert(const char *p, size_t *glen, int64_t *e, int *row) {
    const char *last = strrchr(p, '.');
    if (!last) return 0;
    int r = -1;
    for (size_t i = 0; i < N_NAMES; i++)
        if (!strcmp(last + 1, k_names[i].name)) r = (int)i;
    if (r < 0) return 0;
    const char *q = last;
    while (q > p && q[-1] >= '0' && q[-1] <= '9') q--;
    const size_t nd = (size_t)(last - q);
    if (nd == 0 || nd > 9 || (nd > 1 && q[0] == '0') || q == p || q[-1] != '.') return 0;
    const size_t g = (size_t)(q - 1 - p);
    if (g < 7 || memcmp(p + g - 7, "experts", 7) || (g > 7 && p[g - 8] != '.')) return 0;
    int64_t v = 0;
    for (const char *d = q; d < last; d++) v = v * 10 + (*d - '0');
    *glen = g;
    *e = v;
    *row = r;
    return 1;
}

typedef struct cand {
    const char *prefix;
    size_t glen;
    int64_t e;
    int row;
    size_t layer;
} cand;

static int cmp_group(const cand *a, const cand *b) {
    const size_t n = a->glen < b->glen ? a->glen : b->glen;
    int r = memcmp(a->prefix, b->prefix, n);
    return r ? r : a->glen < b->glen ? -1 : a->glen > b->glen;
}

static int cmp_cand(const void *pa, const void *pb) {
    const cand *a = (const cand *)pa, *b = (const cand *)pb;
    int r = cmp_group(a, b);
    if (r) return r;
    if (a->e != b->e) return a->e < b->e ? -1 : 1;
    return k_names[a->row].proj - k_names[b->row].proj;
}

static void problem(moe_rec *g, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void problem(moe_rec *g, const char *fmt, ...) {
    if (g->pub.problem[0]) return; /* the first rule broken is the one named */
    g->pub.format = NB_CKPT_INCONSISTENT;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(g->pub.problem, sizeof g->pub.problem, fmt, ap);
    va_end(ap);
}

static const char *fmt_str(nb_ckpt_format f) {
    const char *s = "unknown";
    nb_ckpt_format_name(f, &s);
    return s;
}

/* The layouts whose experts are grouped: the FP4 ones, read zero copy. */
static int groupable(const nb_ckpt *c, size_t li, nb_ckpt_format f) {
    return !nbio_ck_conv(c, li) && (f == NB_CKPT_MODELOPT_NVFP4 || f == NB_CKPT_CT_NVFP4 || f == NB_CKPT_CT_MXFP4 ||
                                    f == NB_CKPT_QUARK_MXFP4);
}

static nb_status add_group(nbio_moe_set *s, size_t *cap, const char *prefix, size_t plen, moe_rec **out) {
    if (s->n == *cap) {
        size_t nc = *cap ? *cap * 2 : 8;
        moe_rec *p = (moe_rec *)realloc(s->g, nc * sizeof *p);
        if (!p) return NB_ERR_OUT_OF_MEMORY;
        s->g = p;
        *cap = nc;
    }
    moe_rec *g = &s->g[s->n];
    memset(g, 0, sizeof *g);
    g->prefix = (char *)malloc(plen + 1);
    if (!g->prefix) return NB_ERR_OUT_OF_MEMORY;
    memcpy(g->prefix, prefix, plen);
    g->prefix[plen] = 0;
    g->pub.gate_up_bias = g->pub.down_bias = -1;
    s->n++;
    *out = g;
    return NB_OK;
}

/* ------------------------------------------------------------ per-expert groups */

/* The checks of one per-expert group whose members are in g->li. */
static void check_per_expert(const nb_ckpt *c, const nbio_moe_cfg *cfg, moe_rec *g) {
    const int64_t E = g->pub.experts;
    const int fused = g->pub.fused;
    const int need[3] = {fused ? P_GATE_UP : P_GATE, P_DOWN, fused ? -1 : P_UP};
    const nb_ckpt_layer *first = nbio_ckpt_layer_ref(c, (size_t)g->li[need[0]]);
    const nb_ckpt_format f = first ? first->format : NB_CKPT_INCONSISTENT;
    int64_t H = 0, I = 0;
    if (first) {
        H = first->k;
        I = fused ? first->n / 2 : first->n;
    }
    for (int64_t e = 0; e < E && !g->pub.problem[0]; e++)
        for (int k = 0; k < 3 && !g->pub.problem[0]; k++) {
            const int p = need[k];
            if (p < 0) continue;
            const int64_t li = g->li[e * NPROJ + p];
            if (li < 0) {
                problem(g, "expert %lld has no %s", (long long)e, proj_name(g->family, p));
                break;
            }
            const nb_ckpt_layer *L = nbio_ckpt_layer_ref(c, (size_t)li);
            if (L->format == NB_CKPT_INCONSISTENT)
                problem(g, "%s is inconsistent: %s", L->prefix, L->problem);
            else if (L->format != f)
                problem(g, "%s is %s, %s is %s", L->prefix, fmt_str(L->format), first->prefix, fmt_str(f));
            else if (!groupable(c, (size_t)li, f))
                problem(g, "experts stored as %s are not grouped (only modelopt-nvfp4, ct-nvfp4, ct-mxfp4 and "
                        "quark-mxfp4 are)", fmt_str(f));
            const int64_t wn = p == P_DOWN ? H : p == P_GATE_UP ? 2 * I : I, wk = p == P_DOWN ? I : H;
            if (!g->pub.problem[0] && (L->n != wn || L->k != wk))
                problem(g, "%s is [%lld, %lld], not [%lld, %lld] (%s is [%lld, %lld])", L->prefix, (long long)L->n,
                        (long long)L->k, (long long)wn, (long long)wk, first->prefix, (long long)first->n,
                        (long long)first->k);
        }
    if (!g->pub.problem[0] && fused && (first->n % 2 || !cfg->gpt_oss))
        problem(g, "per-expert gate_up_proj layers: the order of their gate and up rows is known only for gpt-oss "
                "(config.json model_type \"gpt_oss\")%s", first->n % 2 ? ", and they have an odd row count" : "");
    if (g->pub.problem[0]) return;
    g->pub.format = f;
    g->pub.hidden = H;
    g->pub.intermediate = I;
    g->pub.activation = fused ? NB_MOE_ACT_SWIGLU_OAI : NB_MOE_ACT_SWIGLU;
    g->pub.gate_up_layout = fused ? NB_MOE_GATE_UP_INTERLEAVED : NB_MOE_GATE_UP_CONCAT;
    if (fused) {
        g->pub.limit = cfg->limit;
        g->pub.alpha = cfg->alpha;
    }
    for (int64_t e = 0; e < E && !fused; e++) {
        const nb_ckpt_layer *Lg = nbio_ckpt_layer_ref(c, (size_t)g->li[e * NPROJ + P_GATE]);
        const nb_ckpt_layer *Lu = nbio_ckpt_layer_ref(c, (size_t)g->li[e * NPROJ + P_UP]);
        if (memcmp(&Lg->tensor_scale, &Lu->tensor_scale, sizeof(float))) g->pub.gate_up_scales_differ = 1;
    }
}

/* One run of candidates [a, b) sharing a group prefix. */
static nb_status group_run(const nb_ckpt *c, const nbio_moe_cfg *cfg, nbio_moe_set *s, size_t *cap, const cand *a,
                           const cand *b) {
    int quantized = 0;
    for (const cand *p = a; p < b; p++) quantized |= nbio_ckpt_layer_ref(c, p->layer)->format != NB_CKPT_NONE;
    if (!quantized) return NB_OK; /* unquantized experts (a BF16 checkpoint): no group */
    moe_rec *g;
    nb_status st = add_group(s, cap, a->prefix, a->glen, &g);
    if (st) return st;
    g->pub.per_expert = 1;
    g->pub.top_k = cfg->top_k;
    g->family = k_names[a->row].family;
    g->mem = (moe_member *)malloc(sizeof(moe_member) * (size_t)(b - a));
    if (!g->mem) return NB_ERR_OUT_OF_MEMORY;
    for (const cand *p = a; p < b; p++)
        g->mem[g->nmem++] = (moe_member){(int64_t)p->layer, p->e, k_names[p->row].proj};
    const int64_t E = b[-1].e + 1;
    for (const cand *p = a; p < b; p++) g->pub.fused |= k_names[p->row].proj == P_GATE_UP;
    int64_t expect = 0; /* the experts present are 0, 1, ... (sorted) */
    for (const cand *p = a; p < b && p->e <= expect; p++)
        if (p->e == expect) expect++;
    if (expect < E) { /* (also what keeps li small: E <= the number of members) */
        problem(g, "expert %lld is missing (experts up to %lld are named)", (long long)expect, (long long)(E - 1));
        g->pub.experts = E;
        return NB_OK;
    }
    g->pub.experts = E;
    g->li = (int64_t *)malloc(sizeof(int64_t) * (size_t)(E * NPROJ));
    if (!g->li) return NB_ERR_OUT_OF_MEMORY;
    for (int64_t i = 0; i < E * NPROJ; i++) g->li[i] = -1;
    for (const cand *p = a; p < b; p++) {
        const int pj = k_names[p->row].proj;
        int64_t *slot = &g->li[p->e * NPROJ + pj];
        if (*slot >= 0)
            problem(g, "expert %lld has both %s and %s", (long long)p->e,
                    nbio_ckpt_layer_ref(c, (size_t)*slot)->prefix, p->prefix);
        else if (k_names[p->row].family != g->family)
            problem(g, "expert %lld mixes gate_proj / up_proj / down_proj names with w1 / w3 / w2", (long long)p->e);
        else if (g->pub.fused && (pj == P_GATE || pj == P_UP))
            problem(g, "expert %lld has %s next to gate_up_proj layers", (long long)p->e, k_names[p->row].name);
        *slot = (int64_t)p->layer;
        g->pub.layers++;
        g->pub.bytes += nbio_ckpt_layer_ref(c, p->layer)->bytes;
    }
    if (!g->pub.problem[0]) check_per_expert(c, cfg, g);
    return NB_OK;
}

/* ------------------------------------------------------------ gpt-oss groups */

/* The bias tensor G.<proj>_bias or G.<proj>.bias, [E, n] of a float dtype:
 * its index, -1 when absent, -2 (and the problem) when it breaks a rule. */
static int64_t gptoss_bias(const nb_ckpt *c, moe_rec *g, const char *proj, int64_t E, int64_t n, int *oom) {
    const char *seps[2] = {"_bias", ".bias"};
    for (int i = 0; i < 2; i++) {
        char name[64];
        snprintf(name, sizeof name, ".%s%s", proj, seps[i]);
        char *full = nbio_concat(g->prefix, name);
        if (!full) {
            *oom = 1;
            return -1;
        }
        const int64_t j = nbio_ckpt_lookup(c, full, NULL);
        free(full);
        if (j < 0) continue;
        const nb_st_tensor *t = nbio_ck_tensor(c, j);
        if (!(t->dtype == NB_ST_BF16 || t->dtype == NB_ST_F16 || t->dtype == NB_ST_F32) || t->rank != 2 ||
            t->shape[0] != E || t->shape[1] != n) {
            const char *dt = "?";
            nb_st_dtype_info(t->dtype, &dt, NULL);
            problem(g, "%s is %s rank %d [%lld, %lld], not BF16/F16/F32 [%lld, %lld]", t->name, dt, t->rank,
                    (long long)t->shape[0], (long long)(t->rank > 1 ? t->shape[1] : 0), (long long)E, (long long)n);
            return -2;
        }
        g->pub.bytes += t->bytes;
        return j;
    }
    return -1;
}

/* A gpt-oss group from its gate_up layer (or, when that is missing, its
 * down layer): prefix G = the layer's prefix without the projection. */
static nb_status group_gptoss(const nb_ckpt *c, const nbio_moe_cfg *cfg, nbio_moe_set *s, size_t *cap, size_t li,
                              int is_down) {
    const nb_ckpt_layer *L = nbio_ckpt_layer_ref(c, li);
    const char *proj = is_down ? "down_proj" : "gate_up_proj", *other = is_down ? "gate_up_proj" : "down_proj";
    const size_t plen = strlen(L->prefix) - strlen(proj) - (strlen(L->prefix) > strlen(proj));
    char *op = (char *)malloc(plen + strlen(other) + 2);
    if (!op) return NB_ERR_OUT_OF_MEMORY;
    snprintf(op, plen + strlen(other) + 2, "%.*s%s%s", (int)plen, L->prefix, plen ? "." : "", other);
    const int64_t lo = nbio_ckpt_layer_lookup(c, op);
    const nb_ckpt_layer *O = lo >= 0 ? nbio_ckpt_layer_ref(c, (size_t)lo) : NULL;
    if (is_down && O && O->format == NB_CKPT_GPTOSS_MXFP4) { /* grouped from its gate_up */
        free(op);
        return NB_OK;
    }
    moe_rec *g;
    nb_status st = add_group(s, cap, L->prefix, plen, &g);
    if (st) {
        free(op);
        return st;
    }
    g->li = (int64_t *)malloc(sizeof(int64_t) * NPROJ);
    g->mem = (moe_member *)malloc(sizeof(moe_member) * 2);
    if (!g->li || !g->mem) {
        free(op);
        return NB_ERR_OUT_OF_MEMORY;
    }
    for (int p = 0; p < NPROJ; p++) g->li[p] = -1;
    g->li[is_down ? P_DOWN : P_GATE_UP] = (int64_t)li;
    g->mem[g->nmem++] = (moe_member){(int64_t)li, -1, is_down ? P_DOWN : P_GATE_UP};
    g->pub.fused = 1;
    g->pub.top_k = cfg->top_k;
    g->pub.experts = L->experts;
    g->pub.layers = 1;
    g->pub.bytes = L->bytes;
    if (!O) problem(g, "%s is missing", op);
    else if (O->format != NB_CKPT_GPTOSS_MXFP4)
        problem(g, "%s is %s%s%s", op, fmt_str(O->format), O->problem[0] ? ": " : "", O->problem);
    free(op);
    if (g->pub.problem[0]) return NB_OK;
    const nb_ckpt_layer *G = L, *D = O; /* (is_down is only ever here without a partner) */
    g->li[P_DOWN] = lo;
    g->mem[g->nmem++] = (moe_member){lo, -1, P_DOWN};
    g->pub.layers = 2;
    g->pub.bytes += D->bytes;
    const int64_t E = G->experts, H = G->k, I = G->n / 2;
    if (D->experts != E)
        problem(g, "%s has %lld experts, %s %lld", G->prefix, (long long)E, D->prefix, (long long)D->experts);
    else if (G->n % 2 || D->n != H || D->k != I)
        problem(g, "%s is [%lld, %lld] per expert and %s [%lld, %lld]: gate_up must be [2I, H] and down [H, I]",
                G->prefix, (long long)G->n, (long long)G->k, D->prefix, (long long)D->n, (long long)D->k);
    if (g->pub.problem[0]) return NB_OK;
    int oom = 0;
    g->pub.gate_up_bias = gptoss_bias(c, g, "gate_up_proj", E, 2 * I, &oom);
    if (!g->pub.problem[0]) g->pub.down_bias = gptoss_bias(c, g, "down_proj", E, H, &oom);
    if (oom) return NB_ERR_OUT_OF_MEMORY;
    if (g->pub.problem[0]) {
        g->pub.gate_up_bias = g->pub.down_bias = -1;
        return NB_OK;
    }
    g->pub.format = NB_CKPT_GPTOSS_MXFP4;
    g->pub.hidden = H;
    g->pub.intermediate = I;
    g->pub.activation = NB_MOE_ACT_SWIGLU_OAI;
    g->pub.gate_up_layout = NB_MOE_GATE_UP_INTERLEAVED;
    g->pub.limit = cfg->limit;
    g->pub.alpha = cfg->alpha;
    return NB_OK;
}

/* ------------------------------------------------------------ building */

static int cmp_rec(const void *a, const void *b) {
    return strcmp(((const moe_rec *)a)->prefix, ((const moe_rec *)b)->prefix);
}

void nbio_moe_free(nbio_moe_set *s) {
    if (!s) return;
    for (size_t i = 0; i < s->n; i++) {
        free(s->g[i].prefix);
        free(s->g[i].li);
        free(s->g[i].mem);
    }
    free(s->g);
    free(s->lgroup);
    free(s->lproj);
    free(s->lexpert);
    free(s);
}

static nb_status build(const nb_ckpt *c, const nbio_moe_cfg *cfg, nbio_moe_set *s, cand *cs) {
    size_t nc = 0, cap = 0;
    nb_status st = NB_OK;
    for (size_t i = 0; i < s->nlayers; i++) {
        cand *p = &cs[nc];
        p->prefix = nbio_ckpt_layer_ref(c, i)->prefix;
        p->layer = i;
        nc += (size_t)parse_expert(p->prefix, &p->glen, &p->e, &p->row);
    }
    qsort(cs, nc, sizeof *cs, cmp_cand);
    for (size_t a = 0, b; a < nc && st == NB_OK; a = b) {
        for (b = a + 1; b < nc && !cmp_group(&cs[a], &cs[b]);) b++;
        st = group_run(c, cfg, s, &cap, cs + a, cs + b);
    }
    /* gpt-oss: layers of that layout named ...gate_up_proj / ...down_proj and
     * not per-expert names */
    for (size_t i = 0; i < s->nlayers && st == NB_OK; i++) {
        const nb_ckpt_layer *L = nbio_ckpt_layer_ref(c, i);
        size_t gl;
        int64_t e;
        int row;
        if (L->format != NB_CKPT_GPTOSS_MXFP4 || parse_expert(L->prefix, &gl, &e, &row)) continue;
        const char *last = strrchr(L->prefix, '.');
        last = last ? last + 1 : L->prefix;
        if (!strcmp(last, "gate_up_proj")) st = group_gptoss(c, cfg, s, &cap, i, 0);
        else if (!strcmp(last, "down_proj")) st = group_gptoss(c, cfg, s, &cap, i, 1);
    }
    if (st) return st;
    if (s->n) qsort(s->g, s->n, sizeof *s->g, cmp_rec); /* (g is NULL without groups) */
    for (size_t gi = 0; gi < s->n; gi++) {
        moe_rec *g = &s->g[gi];
        g->pub.prefix = g->prefix;
        for (size_t k = 0; k < g->nmem; k++) {
            const moe_member *mb = &g->mem[k];
            s->lgroup[mb->layer] = (int64_t)gi;
            s->lproj[mb->layer] = (int8_t)mb->proj;
            s->lexpert[mb->layer] = mb->expert;
        }
    }
    return NB_OK;
}

nb_status nbio_moe_build(const nb_ckpt *c, const nbio_moe_cfg *cfg, nbio_moe_set **out) {
    *out = NULL;
    nbio_moe_set *s = (nbio_moe_set *)calloc(1, sizeof *s);
    if (!s) return NB_ERR_OUT_OF_MEMORY;
    nb_ckpt_layer_count(c, &s->nlayers);
    const size_t n = s->nlayers ? s->nlayers : 1;
    s->lgroup = (int64_t *)malloc(n * sizeof *s->lgroup);
    s->lproj = (int8_t *)malloc(n);
    s->lexpert = (int64_t *)malloc(n * sizeof *s->lexpert);
    cand *cs = (cand *)malloc(n * sizeof *cs);
    nb_status st = s->lgroup && s->lproj && s->lexpert && cs ? NB_OK : NB_ERR_OUT_OF_MEMORY;
    for (size_t i = 0; i < s->nlayers && st == NB_OK; i++) s->lgroup[i] = -1, s->lproj[i] = 0, s->lexpert[i] = -1;
    if (st == NB_OK) st = build(c, cfg, s, cs);
    free(cs);
    if (st) {
        nbio_moe_free(s);
        return st;
    }
    *out = s;
    return NB_OK;
}

/* ------------------------------------------------------------ queries */

#define NEED(cond, fn) \
    if (!(cond)) return nbi_fail(NULL, NB_ERR_NULL_POINTER, "%s: a required pointer is NULL", fn)

static size_t count_of(const nb_ckpt *c) {
    const nbio_moe_set *s = nbio_ck_moe(c);
    return s ? s->n : 0;
}

/* Group i, or NULL with NB_ERR_NOT_FOUND recorded. */
static const moe_rec *group_at(const nb_ckpt *c, size_t i, const char *fn) {
    if (i >= count_of(c)) {
        nbi_fail(NULL, NB_ERR_NOT_FOUND, "%s: expert group %zu out of range (%zu)", fn, i, count_of(c));
        return NULL;
    }
    return &nbio_ck_moe(c)->g[i];
}

nb_status nb_ckpt_moe_count(const nb_ckpt *c, size_t *count) {
    NEED(c && count, "nb_ckpt_moe_count");
    *count = count_of(c);
    return NB_OK;
}

nb_status nb_ckpt_moe_at(const nb_ckpt *c, size_t i, nb_ckpt_moe *out) {
    NEED(c && out, "nb_ckpt_moe_at");
    const moe_rec *g = group_at(c, i, "nb_ckpt_moe_at");
    if (!g) return NB_ERR_NOT_FOUND;
    *out = g->pub;
    return NB_OK;
}

nb_status nb_ckpt_moe_find(const nb_ckpt *c, const char *prefix, size_t *index) {
    NEED(c && prefix && index, "nb_ckpt_moe_find");
    for (size_t i = 0; i < count_of(c); i++)
        if (!strcmp(nbio_ck_moe(c)->g[i].prefix, prefix)) {
            *index = i;
            return NB_OK;
        }
    return nbi_fail(NULL, NB_ERR_NOT_FOUND, "nb_ckpt_moe_find: no expert group \"%.200s\"", prefix);
}

nb_status nb_ckpt_layer_moe(const nb_ckpt *c, size_t layer, int64_t *group, nb_ckpt_moe_proj *proj, int64_t *expert) {
    NEED(c && group, "nb_ckpt_layer_moe");
    size_t nl = 0;
    nb_ckpt_layer_count(c, &nl);
    if (layer >= nl)
        return nbi_fail(NULL, NB_ERR_NOT_FOUND, "nb_ckpt_layer_moe: layer %zu out of range (%zu)", layer, nl);
    const nbio_moe_set *s = nbio_ck_moe(c);
    *group = s ? s->lgroup[layer] : -1;
    if (proj) *proj = *group >= 0 ? (nb_ckpt_moe_proj)(s->lproj[layer] + 1) : (nb_ckpt_moe_proj)0;
    if (expert) *expert = *group >= 0 ? s->lexpert[layer] : -1;
    return NB_OK;
}

/* The group, consistent (NB_ERR_UNSUPPORTED naming the problem otherwise),
 * and proj a projection (NB_ERR_INVALID_ARGUMENT). */
static nb_status usable(const nb_ckpt *c, size_t i, int proj, const moe_rec **out, const char *fn) {
    const moe_rec *g = group_at(c, i, fn);
    if (!g) return NB_ERR_NOT_FOUND;
    if (proj < NB_CKPT_MOE_GATE_UP || proj > NB_CKPT_MOE_UP)
        return nbi_fail(NULL, NB_ERR_INVALID_ARGUMENT, "%s: %d is not an nb_ckpt_moe_proj", fn, proj);
    if (g->pub.format == NB_CKPT_INCONSISTENT)
        return nbi_fail(NULL, NB_ERR_UNSUPPORTED, "%s: expert group %s is inconsistent: %s", fn, g->prefix,
                        g->pub.problem);
    *out = g;
    return NB_OK;
}

/* Whether the group stores projection p (index) as layers of its own. */
static int stored(const moe_rec *g, int p) { return g->pub.fused ? p == P_GATE_UP || p == P_DOWN : p != P_GATE_UP; }

static nb_status not_stored(const moe_rec *g, const char *fn) {
    return nbi_fail(NULL, NB_ERR_UNSUPPORTED, "%s: %s: %s", fn, g->prefix,
                    g->pub.fused ? "gate and up rows are interleaved in one gate_up weight per expert (read GATE_UP)"
                                 : "gate and up are separate layers (read GATE and UP, or GATE_UP through "
                                   "nb_ckpt_moe_read)");
}

/* Expert e's weight of stored projection p, zero copy. */
static nb_status member(const nb_ckpt *c, const moe_rec *g, int p, int64_t e, nb_weight_desc *d, const uint8_t **codes,
                        const uint8_t **scales, const char *fn) {
    const int64_t li = g->pub.per_expert ? g->li[e * NPROJ + p] : g->li[p];
    nb_status st = nb_ckpt_layer_weight(c, (size_t)li, g->pub.per_expert ? 0 : e, d, codes, scales);
    return st ? nbi_fail(NULL, st, "%s: %s", fn, nb_last_error()) : NB_OK;
}

nb_status nb_ckpt_moe_desc(const nb_ckpt *c, size_t i, int64_t m, int32_t top_k, nb_dtype act_dtype,
                           nb_moe_desc *out) {
    static const char fn[] = "nb_ckpt_moe_desc";
    NEED(c && out, fn);
    const moe_rec *g = NULL;
    nb_status st = usable(c, i, NB_CKPT_MOE_DOWN, &g, fn);
    if (st) return st;
    if (top_k < 0) return nbi_fail(NULL, NB_ERR_INVALID_ARGUMENT, "%s: top_k = %d is negative", fn, (int)top_k);
    const int32_t k = top_k ? top_k : g->pub.top_k;
    if (!k)
        return nbi_fail(NULL, NB_ERR_INVALID_ARGUMENT, "%s: %s: top_k is 0 and config.json gives no "
                        "num_experts_per_tok", fn, g->prefix);
    if (g->pub.experts > INT32_MAX)
        return nbi_fail(NULL, NB_ERR_UNSUPPORTED, "%s: %s has %lld experts", fn, g->prefix, (long long)g->pub.experts);
    nb_weight_desc wgu, wd;
    const uint8_t *pc, *ps;
    if ((st = member(c, g, g->pub.fused ? P_GATE_UP : P_GATE, 0, &wgu, &pc, &ps, fn)) ||
        (st = member(c, g, P_DOWN, 0, &wd, &pc, &ps, fn)))
        return st;
    st = nb_moe_desc_init(out, wgu.format, m, (int32_t)g->pub.experts, k, g->pub.hidden, g->pub.intermediate,
                          (nb_moe_activation)g->pub.activation, act_dtype);
    if (st) return nbi_fail(NULL, st, "%s: %s", fn, nb_last_error());
    out->gate_up.group_size = wgu.group_size;
    out->gate_up.scale_type = wgu.scale_type;
    out->gate_up.scale_rule = wgu.scale_rule;
    out->down.group_size = wd.group_size;
    out->down.scale_type = wd.scale_type;
    out->down.scale_rule = wd.scale_rule;
    out->down.format = wd.format;
    out->gate_up_layout = g->pub.gate_up_layout;
    out->limit = g->pub.limit;
    out->alpha = g->pub.alpha;
    if ((st = nb_moe_desc_validate(out))) return nbi_fail(NULL, st, "%s: %s", fn, nb_last_error());
    return NB_OK;
}

nb_status nb_ckpt_moe_expert(const nb_ckpt *c, size_t i, nb_ckpt_moe_proj proj, int64_t expert, nb_weight_desc *desc,
                             const uint8_t **codes, const uint8_t **scales) {
    static const char fn[] = "nb_ckpt_moe_expert";
    NEED(c && desc && codes && scales, fn);
    const moe_rec *g = NULL;
    nb_status st = usable(c, i, (int)proj, &g, fn);
    if (st) return st;
    const int p = (int)proj - 1;
    if (!stored(g, p)) return not_stored(g, fn);
    if (expert < 0 || expert >= g->pub.experts)
        return nbi_fail(NULL, NB_ERR_INVALID_ARGUMENT, "%s: %s: expert %lld out of range [0, %lld)", fn, g->prefix,
                        (long long)expert, (long long)g->pub.experts);
    return member(c, g, p, expert, desc, codes, scales, fn);
}

nb_status nb_ckpt_moe_weights(const nb_ckpt *c, size_t i, nb_ckpt_moe_proj proj, nb_weight_desc *desc,
                              const uint8_t **codes, const uint8_t **scales) {
    static const char fn[] = "nb_ckpt_moe_weights";
    NEED(c && desc && codes && scales, fn);
    const moe_rec *g = NULL;
    nb_status st = usable(c, i, (int)proj, &g, fn);
    if (st) return st;
    const int p = (int)proj - 1;
    if (g->pub.per_expert)
        return nbi_fail(NULL, NB_ERR_UNSUPPORTED, "%s: %s: every expert is a tensor of its own (copy them into one "
                        "buffer with nb_ckpt_moe_read)", fn, g->prefix);
    if (!stored(g, p)) return not_stored(g, fn);
    return member(c, g, p, 0, desc, codes, scales, fn); /* expert 0 starts the expert-major tensor */
}

nb_status nb_ckpt_moe_read(const nb_ckpt *c, size_t i, nb_ckpt_moe_proj proj, nb_weight_desc *desc,
                           const nb_weight_buffers *out, const nb_weight_sizes_v2 *capacity, float *tensor_scales,
                           size_t count) {
    static const char fn[] = "nb_ckpt_moe_read";
    NEED(c && desc && (!out || capacity), fn);
    const moe_rec *g = NULL;
    nb_status st = usable(c, i, (int)proj, &g, fn);
    if (st) return st;
    const int p = (int)proj - 1;
    const int concat = p == P_GATE_UP && !g->pub.fused; /* gate's layer, then up's */
    if (!concat && !stored(g, p)) return not_stored(g, fn);
    const int first = concat ? P_GATE : p;
    const int64_t E = g->pub.experts;
    if (tensor_scales && count < (size_t)E)
        return nbi_fail(NULL, NB_ERR_BUFFER_TOO_SMALL, "%s: %s: tensor_scales holds %zu floats, %lld experts", fn,
                        g->prefix, count, (long long)E);
    nb_weight_desc d, du;
    const uint8_t *pc, *ps, *uc, *us;
    for (int64_t e = 0; e < E; e++) { /* every expert's tensor scale, checked before anything is written */
        if ((st = member(c, g, first, e, &d, &pc, &ps, fn))) return st;
        if (concat) {
            if ((st = member(c, g, P_UP, e, &du, &uc, &us, fn))) return st;
            if (memcmp(&d.tensor_scale, &du.tensor_scale, sizeof(float)))
                return nbi_fail(NULL, NB_ERR_UNSUPPORTED, "%s: %s: expert %lld's gate and up tensor scales differ "
                                "(%.9g and %.9g): one gate_up weight takes one (read GATE and UP)", fn, g->prefix,
                                (long long)e, (double)d.tensor_scale, (double)du.tensor_scale);
        }
        if (tensor_scales) tensor_scales[e] = d.tensor_scale;
    }
    nb_weight_desc one, part;
    if ((st = member(c, g, first, 0, &part, &pc, &ps, fn))) return st;
    one = part;
    if (concat) one.n *= 2;
    nb_weight_sizes_v2 sz, psz;
    if ((st = nb_weight_get_sizes_v2(&one, &sz)) || (st = nb_weight_get_sizes_v2(&part, &psz)))
        return nbi_fail(NULL, st, "%s: %s", fn, nb_last_error());
    *desc = one;
    if (!out) return NB_OK;
    if (!out->codes || !out->scales)
        return nbi_fail(NULL, NB_ERR_NULL_POINTER, "%s: codes and scales must not be NULL", fn);
    if (out->zeros || out->reserved[0] || out->reserved[1] || out->reserved[2] || out->reserved[3])
        return nbi_fail(NULL, NB_ERR_INVALID_ARGUMENT, "%s: %s experts have no zero points (zeros and the reserved "
                        "pointers must be NULL)", fn, fmt_str(g->pub.format));
    if (capacity->codes_bytes / sz.codes_bytes < (size_t)E || capacity->scales_bytes / sz.scales_bytes < (size_t)E)
        return nbi_fail(NULL, NB_ERR_BUFFER_TOO_SMALL, "%s: %s: %lld experts need %zu code and %zu scale bytes each, "
                        "the buffers hold %zu and %zu", fn, g->prefix, (long long)E, sz.codes_bytes, sz.scales_bytes,
                        capacity->codes_bytes, capacity->scales_bytes);
    uint8_t *oc = (uint8_t *)out->codes, *os = (uint8_t *)out->scales;
    for (int64_t e = 0; e < E; e++) {
        for (int part_i = 0; part_i <= concat; part_i++) {
            if ((st = member(c, g, part_i ? P_UP : first, e, &d, &pc, &ps, fn))) return st;
            memcpy(oc + (size_t)e * sz.codes_bytes + (size_t)part_i * psz.codes_bytes, pc, psz.codes_bytes);
            memcpy(os + (size_t)e * sz.scales_bytes + (size_t)part_i * psz.scales_bytes, ps, psz.scales_bytes);
        }
    }
    return NB_OK;
}
