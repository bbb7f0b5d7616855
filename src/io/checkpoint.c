/* checkpoint.c - checkpoint opening, config reading and per-layer format
 * detection (see checkpoint.h for the rules).
 *
 * Every tensor of the checkpoint is copied once into a name-sorted array (the
 * reader's order is bytewise, which is strcmp's), so member lookups are a
 * bsearch whether the checkpoint is one file or sharded.  A layer is created
 * only from its anchor tensor, so each prefix yields one layer; the other
 * members are looked up by name and marked as belonging to it.
 */
#define _POSIX_C_SOURCE 200809L
#include "io_internal.h"

#include <cjson/cJSON.h>

#include <errno.h>
#include <fnmatch.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <regex.h>
#include <string.h>
#include <sys/stat.h>

typedef struct layer_rec {
    nb_ckpt_layer pub;
    char *prefix;
    int64_t codes_t, scales_t; /* tensor indices of the codes and block scales; -1 if none */
    nbio_conv *cv;             /* a layout converted when read (ckpt_int.c); NULL for the others */
} layer_rec;

/* One exclude-list entry: a shell wildcard or, after "re:", a regex. */
typedef struct excl_rec {
    char *pattern; /* as written in the config */
    char *key;     /* where: "hf_quant_config.json quantization.exclude_modules" */
    nb_ckpt_source source;
    int is_re, usable;
    regex_t re;
} excl_rec;

struct nb_ckpt {
    nb_st_file *file;
    nb_st_index *index;
    size_t nfiles;
    char **files;
    uint64_t *file_bytes;
    size_t ntensors;
    nb_st_tensor *t;
    int64_t *t_layer;
    size_t nlayers, cap;
    layer_rec *layers;
    char *dir;                 /* directory of the checkpoint */
    char *quant_method, *quant_algo, *ct_format;
    int has_config_json, has_hf_quant_config;
    nb_ckpt_format declared;
    nb_ckpt_source declared_src;
    excl_rec *ex;             /* exclude / ignore entries of the configs */
    size_t nex;
    char config_note[1024];   /* entries that could not be used; "" when none */
    nbio_qcfg qcfg;           /* what the config says of integer and bitsandbytes layers */
    nbio_moe_cfg moe_cfg;     /* ... and of mixtures of experts */
    nbio_moe_set *moe;        /* expert groups (ckpt_moe.c); NULL when none */
};

/* The directory part of a file path ("." when there is none). */
static char *ck_dirname(const char *path) {
    const char *slash = strrchr(path, '/');
    if (!slash) return nbio_strdup(".");
    if (slash == path) return nbio_strdup("/");
    size_t n = (size_t)(slash - path);
    char *p = (char *)malloc(n + 1);
    if (!p) return NULL;
    memcpy(p, path, n);
    p[n] = 0;
    return p;
}

/* The layouts nb_ckpt_open recognises, one row each: what a layout stores
 * is one nb_format's codes and block scales (its group, scale type and
 * tensor scale come from that format's row in nibble.h), under the names and
 * dtypes classify_* check, and the MXFP4 exponent rule its producer uses
 * (informative: nb_ckpt_layer_weight passes it on for E8M0 scales). */
static const struct ckpt_layout {
    nb_ckpt_format f;
    const char *name;
    nb_format weight; /* 0: no 4-bit weight */
    nb_mx_scale_rule rule;
} k_layouts[] = {
    {NB_CKPT_NONE, "none", (nb_format)0, NB_MX_SCALE_OCP},
    {NB_CKPT_MODELOPT_NVFP4, "modelopt-nvfp4", NB_FORMAT_NVFP4, NB_MX_SCALE_OCP},
    {NB_CKPT_CT_NVFP4, "ct-nvfp4", NB_FORMAT_NVFP4, NB_MX_SCALE_OCP},
    {NB_CKPT_CT_MXFP4, "ct-mxfp4", NB_FORMAT_MXFP4, NB_MX_SCALE_EVEN},
    {NB_CKPT_QUARK_MXFP4, "quark-mxfp4", NB_FORMAT_MXFP4, NB_MX_SCALE_EVEN},
    {NB_CKPT_GPTOSS_MXFP4, "gptoss-mxfp4", NB_FORMAT_MXFP4, NB_MX_SCALE_ROUND_UP},
    {NB_CKPT_INCONSISTENT, "inconsistent", (nb_format)0, NB_MX_SCALE_OCP},
    /* converted when read (ckpt_int.c): */
    {NB_CKPT_AWQ_INT4, "awq-int4", NB_FORMAT_INT4, NB_MX_SCALE_OCP},
    {NB_CKPT_GPTQ_INT4, "gptq-int4", NB_FORMAT_INT4, NB_MX_SCALE_OCP},
    {NB_CKPT_CT_INT4, "ct-int4", NB_FORMAT_INT4, NB_MX_SCALE_OCP},
    {NB_CKPT_CT_INT4_SYM, "ct-int4-sym", NB_FORMAT_INT4_SYM, NB_MX_SCALE_OCP},
    {NB_CKPT_CT_INT8, "ct-int8", NB_FORMAT_INT8, NB_MX_SCALE_OCP},
    {NB_CKPT_BNB_NF4, "bnb-nf4", NB_FORMAT_NF4, NB_MX_SCALE_OCP},
    {NB_CKPT_BNB_FP4, "bnb-fp4", NB_FORMAT_BNB_FP4, NB_MX_SCALE_OCP},
    {NB_CKPT_GPTQ_INT8, "gptq-int8", NB_FORMAT_INT8, NB_MX_SCALE_OCP},
    {NB_CKPT_HQQ_INT4, "hqq-int4", NB_FORMAT_INT4_HQQ, NB_MX_SCALE_OCP},
};
#define N_LAYOUTS (sizeof k_layouts / sizeof k_layouts[0])

static const struct ckpt_layout *layout_of(nb_ckpt_format f) {
    for (size_t i = 0; i < N_LAYOUTS; i++)
        if (k_layouts[i].f == f) return &k_layouts[i];
    return NULL;
}

/* For messages built inside this module, where f is always valid. */
static const char *fmt_name(nb_ckpt_format f) {
    const struct ckpt_layout *l = layout_of(f);
    return l ? l->name : "unknown";
}

nb_status nb_ckpt_format_name(nb_ckpt_format f, const char **name) {
    const struct ckpt_layout *l = layout_of(f);
    if (!name) return nbi_fail(NULL, NB_ERR_NULL_POINTER, "nb_ckpt_format_name: name is NULL");
    if (!l) return nbi_fail(NULL, NB_ERR_INVALID_ARGUMENT, "nb_ckpt_format_name: %d is not an nb_ckpt_format", (int)f);
    *name = l->name;
    return NB_OK;
}

nb_status nb_ckpt_format_weight(nb_ckpt_format f, nb_format *out) {
    const struct ckpt_layout *l = layout_of(f);
    if (!out) return nbi_fail(NULL, NB_ERR_NULL_POINTER, "nb_ckpt_format_weight: out is NULL");
    if (!l) return nbi_fail(NULL, NB_ERR_INVALID_ARGUMENT, "nb_ckpt_format_weight: %d is not an nb_ckpt_format", (int)f);
    if (!l->weight) return nbi_fail(NULL, NB_ERR_UNSUPPORTED, "nb_ckpt_format_weight: a %s layer has no 4-bit weight",
                                    l->name);
    *out = l->weight;
    return NB_OK;
}

static const char *src_name(nb_ckpt_source s) {
    switch (s) {
    case NB_CKPT_SRC_TENSORS: return "tensors";
    case NB_CKPT_SRC_HF_QUANT_CONFIG: return "hf_quant_config.json";
    case NB_CKPT_SRC_CONFIG_JSON: return "config.json";
    }
    return NULL;
}

nb_status nb_ckpt_source_name(nb_ckpt_source s, const char **name) {
    if (!name) return nbi_fail(NULL, NB_ERR_NULL_POINTER, "nb_ckpt_source_name: name is NULL");
    if (!src_name(s)) return nbi_fail(NULL, NB_ERR_INVALID_ARGUMENT, "nb_ckpt_source_name: %d is not an nb_ckpt_source",
                                      (int)s);
    *name = src_name(s);
    return NB_OK;
}

/* The group of the nb_format a layout stores (0 when the format table has
 * no row for it: the layer is then reported, never read with another group). */
static int layout_group(nb_ckpt_format f) {
    const struct ckpt_layout *l = layout_of(f);
    nb_format_info fi;
    if (!l || !l->weight || nb_format_get_info(l->weight, &fi) != NB_OK) return 0;
    return fi.group_size;
}

/* ------------------------------------------------------------ config */

static const char *json_str(const cJSON *o, const char *key) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, key);
    return cJSON_IsString(v) ? v->valuestring : NULL;
}

#define ieq nbio_ieq

/* A ModelOpt quant_algo as a layout: only the NVFP4 weight variants map. */
static nb_ckpt_format algo_format(const char *algo) {
    if (ieq(algo, "NVFP4") || ieq(algo, "W4A16_NVFP4") || ieq(algo, "NVFP4_AWQ") || ieq(algo, "W4A8_NVFP4_FP8"))
        return NB_CKPT_MODELOPT_NVFP4;
    return NB_CKPT_NONE;
}

/* ------------------------------------------------------------ exclude lists */

static void config_note(nb_ckpt *c, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void config_note(nb_ckpt *c, const char *fmt, ...) {
    size_t n = strlen(c->config_note);
    if (n + 8 >= sizeof c->config_note) return; /* the first problems are the ones named */
    if (n) n += (size_t)snprintf(c->config_note + n, sizeof c->config_note - n, "; ");
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(c->config_note + n, sizeof c->config_note - n, fmt, ap);
    va_end(ap);
}

/* A Python `re` pattern as POSIX ERE: the escapes \d \w \s (and their
 * negations) become bracket expressions, "(?:" a plain group, and a lazy
 * "?" after a quantifier is dropped (it cannot change whether a match at
 * the start exists); anything else is handed to regcomp, which rejects what
 * ERE cannot say.  A config is untrusted input and glibc's regcomp copies
 * the subtree of every "+" and "{m,n}" (nested ones multiply), so patterns
 * are refused (*why set, NULL returned) when longer than 256 bytes, with
 * stacked quantifiers ("a++"), backreferences, or when the product of their
 * repetition factors exceeds 256.  NULL with *why NULL: out of memory. */
static char *py_regex_to_ere(const char *p, const char **why) {
    *why = NULL;
    size_t n = strlen(p);
    if (n > 256) return *why = "longer than 256 bytes", NULL;
    char *o = (char *)malloc(n * 14 + 4), *q = o;
    if (!o) return NULL;
    *q++ = '^'; /* re.match: anchored at the start, not at the end */
    *q++ = '(';
    double factor = 1;
    int prev_quant = 0, in_bracket = 0;
    for (size_t i = 0; i < n; i++) {
        static const char *const cls[6][2] = {{"d", "[0-9]"}, {"D", "[^0-9]"}, {"w", "[[:alnum:]_]"},
                                              {"W", "[^[:alnum:]_]"}, {"s", "[[:space:]]"}, {"S", "[^[:space:]]"}};
        char c = p[i];
        if (in_bracket) { /* quantifier characters are literal in a bracket expression */
            *q++ = c;
            if (c == ']') in_bracket = 0;
            continue;
        }
        const char *rep = NULL;
        if (c == '\\' && i + 1 < n)
            for (int k = 0; k < 6; k++)
                if (p[i + 1] == cls[k][0][0]) rep = cls[k][1];
        if (c == '\\' && p[i + 1] >= '0' && p[i + 1] <= '9') { /* exponential to match */
            free(o);
            return *why = "uses a backreference", NULL;
        }
        int quant = c == '*' || c == '+' || c == '?' || c == '{';
        if (quant && prev_quant) {
            if (c == '?') continue; /* lazy */
            free(o);
            return *why = "stacked quantifiers", NULL;
        }
        if (c == '+') factor *= 2;
        if (c == '{') {
            unsigned long lo = strtoul(p + i + 1, NULL, 10), hi = lo;
            const char *comma = strchr(p + i, ','), *close = strchr(p + i, '}');
            if (comma && close && comma < close) hi = comma + 1 == close ? lo + 1 : strtoul(comma + 1, NULL, 10);
            factor *= (double)(hi > lo ? hi : lo) + 1;
        }
        if (factor > 256) {
            free(o);
            return *why = "repetitions would expand it more than 256 times", NULL;
        }
        prev_quant = quant;
        if (rep) {
            q += sprintf(q, "%s", rep);
            i++;
        } else if (c == '\\' && i + 1 < n) {
            *q++ = c;
            *q++ = p[++i];
        } else if (c == '(' && p[i + 1] == '?' && p[i + 2] == ':') {
            *q++ = '(';
            i += 2;
        } else {
            if (c == '[') {
                in_bracket = 1;
                *q++ = c;
                if (p[i + 1] == '^') *q++ = p[++i];
                if (p[i + 1] == ']') *q++ = p[++i]; /* a leading ']' is literal */
                continue;
            }
            *q++ = c;
        }
    }
    *q++ = ')';
    *q = 0;
    return o;
}

/* Add the string entries of array `list` (may be NULL) found at `key`. */
static nb_status add_excludes(nb_ckpt *c, const cJSON *list, const char *key, nb_ckpt_source src) {
    if (!list) return NB_OK;
    if (!cJSON_IsArray(list)) {
        config_note(c, "%s is not a list (ignored)", key);
        return NB_OK;
    }
    int i = 0;
    for (const cJSON *e = list->child; e; e = e->next, i++) {
        if (!cJSON_IsString(e)) {
            config_note(c, "%s[%d] is not a string (ignored)", key, i);
            continue;
        }
        excl_rec *r = (excl_rec *)realloc(c->ex, (c->nex + 1) * sizeof *r);
        if (!r) return NB_ERR_OUT_OF_MEMORY;
        c->ex = r;
        r = &c->ex[c->nex];
        memset(r, 0, sizeof *r);
        r->pattern = nbio_strdup(e->valuestring);
        r->key = nbio_strdup(key);
        if (!r->pattern || !r->key) {
            free(r->pattern);
            free(r->key);
            return NB_ERR_OUT_OF_MEMORY;
        }
        r->source = src;
        r->is_re = !strncmp(r->pattern, "re:", 3);
        r->usable = 1;
        c->nex++;
        if (r->is_re) {
            const char *why = NULL;
            char *ere = py_regex_to_ere(r->pattern + 3, &why);
            if (!ere && !why) return NB_ERR_OUT_OF_MEMORY;
            if (!ere) {
                r->usable = 0;
                config_note(c, "%s[%d] \"%.64s\": regex %s; ignored", key, i, r->pattern, why);
                continue;
            }
            int rc = regcomp(&r->re, ere, REG_EXTENDED);
            free(ere);
            if (rc) {
                char why[96];
                regerror(rc, &r->re, why, sizeof why);
                r->usable = 0;
                config_note(c, "%s[%d] \"%.64s\": not a regex nibble can use (%s); ignored", key, i, r->pattern, why);
            }
        }
    }
    return NB_OK;
}

/* The first entry that excludes layer `prefix`: a regex that matches at
 * its start (Python's re.match, as compressed-tensors and Quark use it), or
 * a wildcard (fnmatch, ModelOpt and gpt-oss) that matches the prefix or one
 * of its parent modules ("model.layers.*.self_attn" excludes
 * "model.layers.0.self_attn.q_proj"). */
static const excl_rec *excluded_by(const nb_ckpt *c, const char *prefix) {
    for (size_t i = 0; i < c->nex; i++) {
        const excl_rec *r = &c->ex[i];
        if (!r->usable) continue;
        if (r->is_re) {
            regmatch_t m;
            if (regexec(&r->re, prefix, 1, &m, 0) == 0 && m.rm_so == 0) return r;
            continue;
        }
        if (fnmatch(r->pattern, prefix, 0) == 0) return r;
        size_t n = strlen(prefix);
        char *p = (char *)malloc(n + 1);
        if (!p) continue; /* out of memory: only the full-name match is tried */
        memcpy(p, prefix, n + 1);
        int hit = 0;
        for (char *dot = strrchr(p, '.'); dot && !hit; dot = strrchr(p, '.')) {
            *dot = 0;
            hit = fnmatch(r->pattern, p, 0) == 0;
        }
        free(p);
        if (hit) return r;
    }
    return NULL;
}

/* A positive finite number at key of o or of o.text_config (multimodal
 * configs keep the language model's there); NAN when absent, and a note
 * when present but not such a number. */
static double config_number(nb_ckpt *c, const cJSON *o, const char *key, double max) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, key);
    if (!v) v = cJSON_GetObjectItemCaseSensitive(cJSON_GetObjectItemCaseSensitive(o, "text_config"), key);
    if (!v) return NAN;
    if (cJSON_IsNumber(v) && v->valuedouble > 0 && v->valuedouble <= max) return v->valuedouble;
    config_note(c, "config.json %s is not a number in (0, %g] (ignored)", key, max);
    return NAN;
}

/* What config.json says of a mixture of experts (nbio_moe_cfg). */
static void moe_config(nb_ckpt *c, const cJSON *cfg) {
    nbio_moe_cfg *m = &c->moe_cfg;
    m->top_k = 0;
    m->limit = 7.0f;
    m->alpha = 1.702f;
    if (!cfg) return;
    const double k = config_number(c, cfg, "num_experts_per_tok", 65536);
    if (!isnan(k)) {
        if (k == floor(k)) m->top_k = (int32_t)k;
        else config_note(c, "config.json num_experts_per_tok = %g is not an integer (ignored)", k);
    }
    const double l = config_number(c, cfg, "swiglu_limit", 1e30), a = config_number(c, cfg, "swiglu_alpha", 1e30);
    if (!isnan(l)) m->limit = (float)l;
    if (!isnan(a)) m->alpha = (float)a;
    const char *mt = json_str(cfg, "model_type");
    m->gpt_oss = mt && !strcmp(mt, "gpt_oss");
}

/* Declared format and exclude lists from the parsed configs (either NULL). */
static nb_status configs_from_json(nb_ckpt *c, const cJSON *hf, const cJSON *cfg) {
    nb_status st = NB_OK;
    c->has_hf_quant_config = hf != NULL;
    c->has_config_json = cfg != NULL;
    const char *hf_algo = NULL;
    if (hf) hf_algo = json_str(cJSON_GetObjectItemCaseSensitive(hf, "quantization"), "quant_algo");
    const cJSON *qc = cfg ? cJSON_GetObjectItemCaseSensitive(cfg, "quantization_config") : NULL;
    const char *method = json_str(qc, "quant_method");
    const char *algo = json_str(qc, "quant_algo");
    const char *fmt = json_str(qc, "format");
    if ((method && !(c->quant_method = nbio_strdup(method))) ||
        ((hf_algo || algo) && !(c->quant_algo = nbio_strdup(hf_algo ? hf_algo : algo))) ||
        (fmt && !(c->ct_format = nbio_strdup(fmt)))) {
        st = nbi_fail(NULL, NB_ERR_OUT_OF_MEMORY, "out of memory");
        goto done;
    }
    const nb_ckpt_format qd = nbio_qcfg_read(qc, &c->qcfg); /* awq, gptq, ct pack-quantized, bitsandbytes */
    moe_config(c, cfg);
    if (hf_algo && algo_format(hf_algo) != NB_CKPT_NONE) {
        c->declared = algo_format(hf_algo);
        c->declared_src = NB_CKPT_SRC_HF_QUANT_CONFIG;
    } else if (qd != NB_CKPT_NONE) {
        c->declared = qd;
        c->declared_src = NB_CKPT_SRC_CONFIG_JSON;
    } else if (method) {
        nb_ckpt_format d = NB_CKPT_NONE;
        if (ieq(method, "modelopt")) d = algo_format(algo);
        else if (ieq(method, "compressed-tensors"))
            d = ieq(fmt, "nvfp4-pack-quantized") ? NB_CKPT_CT_NVFP4
                : ieq(fmt, "mxfp4-pack-quantized") ? NB_CKPT_CT_MXFP4 : NB_CKPT_NONE;
        else if (ieq(method, "quark")) {
            /* only an fp4 global weight scheme is a Quark MXFP4 checkpoint */
            const cJSON *g = cJSON_GetObjectItemCaseSensitive(qc, "global_quant_config");
            const char *wd = json_str(cJSON_GetObjectItemCaseSensitive(g, "weight"), "dtype");
            if (!wd || ieq(wd, "fp4")) d = NB_CKPT_QUARK_MXFP4;
        } else if (ieq(method, "mxfp4")) d = NB_CKPT_GPTOSS_MXFP4;
        if (d != NB_CKPT_NONE) {
            c->declared = d;
            c->declared_src = NB_CKPT_SRC_CONFIG_JSON;
        }
    }
    /* every list a producer writes: ModelOpt exclude_modules (both files) and
     * ignore, compressed-tensors ignore, Quark exclude, gpt-oss
     * modules_to_not_convert */
    static const char *const keys[] = {"exclude_modules", "ignore", "exclude", "modules_to_not_convert"};
    const cJSON *hq = hf ? cJSON_GetObjectItemCaseSensitive(hf, "quantization") : NULL;
    if (add_excludes(c, cJSON_GetObjectItemCaseSensitive(hq, "exclude_modules"),
                     "hf_quant_config.json quantization.exclude_modules", NB_CKPT_SRC_HF_QUANT_CONFIG) != NB_OK)
        return nbi_fail(NULL, NB_ERR_OUT_OF_MEMORY, "out of memory");
    for (int k = 0; k < 4; k++) {
        char key[96];
        snprintf(key, sizeof key, "config.json quantization_config.%s", keys[k]);
        if (add_excludes(c, cJSON_GetObjectItemCaseSensitive(qc, keys[k]), key, NB_CKPT_SRC_CONFIG_JSON) != NB_OK)
            return nbi_fail(NULL, NB_ERR_OUT_OF_MEMORY, "out of memory");
    }
done:
    return st;
}

static nb_status read_configs(nb_ckpt *c, const char *dir) {
    cJSON *hf = NULL, *cfg = NULL;
    nb_status st = nbio_read_json(dir, "hf_quant_config.json", NB_CKPT_MAX_CONFIG, &hf);
    if (st == NB_OK) st = nbio_read_json(dir, "config.json", NB_CKPT_MAX_CONFIG, &cfg);
    if (st == NB_OK) st = configs_from_json(c, hf, cfg);
    cJSON_Delete(hf);
    cJSON_Delete(cfg);
    return st;
}

/* ------------------------------------------------------------ tensors */

static int64_t find_t(const nb_ckpt *c, const char *name) {
    size_t lo = 0, hi = c->ntensors;
    while (lo < hi) {
        size_t mid = lo + (hi - lo) / 2;
        int r = strcmp(c->t[mid].name, name);
        if (!r) return (int64_t)mid;
        if (r < 0) lo = mid + 1;
        else hi = mid;
    }
    return -1;
}

/* prefix + suffix looked up; -1 when absent (or on allocation failure,
 * reported through *oom). */
static int64_t find_member(const nb_ckpt *c, const char *prefix, const char *suffix, int *oom) {
    size_t np = strlen(prefix), ns = strlen(suffix);
    char *name = (char *)malloc(np + ns + 1);
    if (!name) {
        *oom = 1;
        return -1;
    }
    memcpy(name, prefix, np);
    memcpy(name + np, suffix, ns + 1);
    int64_t r = find_t(c, name);
    free(name);
    return r;
}

static int64_t numel(const nb_st_tensor *t) {
    int64_t n = 1;
    for (int i = 0; i < t->rank; i++) n *= t->shape[i];
    return n;
}

static int is_scalar_f32(const nb_st_tensor *t) { return t->dtype == NB_ST_F32 && numel(t) == 1 && t->rank <= 1; }
static float read_f32(const nb_st_tensor *t) {
    float v;
    memcpy(&v, t->data, 4); /* safetensors is little-endian, as every host we build for */
    return v;
}
static int is_float(nb_st_dtype d) { return d == NB_ST_BF16 || d == NB_ST_F16 || d == NB_ST_F32; }
static int is_e8m0(nb_st_dtype d) { return d == NB_ST_U8 || d == NB_ST_F8_E8M0; }
static const char *dt_name(nb_st_dtype d) {
    const char *s = "?";
    nb_st_dtype_info(d, &s, NULL);
    return s;
}

/* ------------------------------------------------------------ classification */

static nb_status add_layer(nb_ckpt *c, const char *prefix, size_t plen, layer_rec **out) {
    if (c->nlayers == c->cap) {
        size_t cap = c->cap ? c->cap * 2 : 64;
        layer_rec *p = (layer_rec *)realloc(c->layers, cap * sizeof *p);
        if (!p) return NB_ERR_OUT_OF_MEMORY;
        c->layers = p;
        c->cap = cap;
    }
    layer_rec *L = &c->layers[c->nlayers];
    memset(L, 0, sizeof *L);
    L->prefix = (char *)malloc(plen + 1);
    if (!L->prefix) return NB_ERR_OUT_OF_MEMORY;
    memcpy(L->prefix, prefix, plen);
    L->prefix[plen] = 0;
    L->codes_t = L->scales_t = -1;
    c->nlayers++;
    *out = L;
    return NB_OK;
}

static void bad(layer_rec *L, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void bad(layer_rec *L, const char *fmt, ...) {
    L->pub.format = NB_CKPT_INCONSISTENT;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(L->pub.problem, sizeof L->pub.problem, fmt, ap);
    va_end(ap);
}

/* Mark tensor j as a member of layer li and count its bytes. */
static void own(nb_ckpt *c, int64_t j, size_t li) {
    if (j < 0 || c->t_layer[j] >= 0) return;
    c->t_layer[j] = (int64_t)li;
    c->layers[li].pub.bytes += c->t[j].bytes;
}

/* codes [N, K/2] U8 + scales [N, K/group]: sets n, k or reports why not. */
static int check_2d(layer_rec *L, const nb_st_tensor *w, const nb_st_tensor *s, int group, const char *wn,
                    const char *sn) {
    if (w->dtype != NB_ST_U8 || w->rank != 2)
        return bad(L, "%s must be U8 [N, K/2], is %s rank %d", wn, dt_name(w->dtype), w->rank), 0;
    if (s->rank != 2) return bad(L, "%s must be rank 2, is rank %d", sn, s->rank), 0;
    if (group <= 0) return bad(L, "this library has no weight format for the layout"), 0;
    int64_t n = w->shape[0], k = w->shape[1] * 2;
    L->pub.n = n;
    L->pub.k = k;
    if (n <= 0 || k <= 0) return bad(L, "%s has an empty shape", wn), 0;
    if (s->shape[0] != n)
        return bad(L, "%s has %lld rows, %s has %lld", wn, (long long)n, sn, (long long)s->shape[0]), 0;
    if (k % group)
        return bad(L, "K = %lld (from %s) is not a multiple of the group %d", (long long)k, wn, group), 0;
    if (s->shape[1] != k / group)
        return bad(L, "%s has %lld columns, K/%d = %lld (K = 2 x %lld from %s)", sn, (long long)s->shape[1], group,
                   (long long)(k / group), (long long)w->shape[1], wn),
               0;
    return 1;
}

static nb_status classify_packed(nb_ckpt *c, size_t ti) { /* P.weight_packed: compressed-tensors */
    const nb_st_tensor *w = &c->t[ti];
    if (w->dtype == NB_ST_I32) return nbio_classify_ct_int(c, ti); /* pack-quantized integers */
    size_t plen = strlen(w->name) - strlen(".weight_packed");
    layer_rec *L;
    nb_status st = add_layer(c, w->name, plen, &L);
    if (st != NB_OK) return st;
    size_t li = c->nlayers - 1;
    int oom = 0;
    int64_t js = find_member(c, L->prefix, ".weight_scale", &oom);
    int64_t jg = find_member(c, L->prefix, ".weight_global_scale", &oom);
    int64_t ji = find_member(c, L->prefix, ".input_global_scale", &oom);
    if (oom) return NB_ERR_OUT_OF_MEMORY;
    L->pub.weight_dtype = w->dtype;
    own(c, (int64_t)ti, li);
    own(c, js, li);
    own(c, jg, li);
    own(c, ji, li);
    if (js < 0) return bad(L, "%s.weight_scale is missing", L->prefix), NB_OK;
    const nb_st_tensor *s = &c->t[js];
    if (s->dtype == NB_ST_F8_E4M3) {
        if (!check_2d(L, w, s, layout_group(NB_CKPT_CT_NVFP4), "weight_packed", "weight_scale (F8_E4M3)")) return NB_OK;
        if (jg < 0) return bad(L, "%s.weight_global_scale is missing (NVFP4)", L->prefix), NB_OK;
        if (!is_scalar_f32(&c->t[jg])) return bad(L, "weight_global_scale must be F32 [1]"), NB_OK;
        float g = read_f32(&c->t[jg]);
        if (!(g != 0.0f && isfinite(g))) return bad(L, "weight_global_scale is %g (not finite and non-zero)", g), NB_OK;
        L->pub.format = NB_CKPT_CT_NVFP4;
        L->pub.tensor_scale = 1.0f / g;
    } else if (is_e8m0(s->dtype)) {
        if (!check_2d(L, w, s, layout_group(NB_CKPT_CT_MXFP4), "weight_packed", "weight_scale (U8 E8M0)")) return NB_OK;
        if (jg >= 0) return bad(L, "weight_global_scale with U8 (MXFP4) block scales"), NB_OK;
        L->pub.format = NB_CKPT_CT_MXFP4;
        L->pub.tensor_scale = 1.0f;
    } else {
        return bad(L, "weight_scale dtype %s is neither F8_E4M3 (NVFP4) nor U8 (MXFP4)", dt_name(s->dtype)), NB_OK;
    }
    L->codes_t = (int64_t)ti;
    L->scales_t = js;
    return NB_OK;
}

/* P.weight (any dtype) or an orphan P.weight_scale: ModelOpt, Quark or unquantized. */
static nb_status classify_weight(nb_ckpt *c, size_t ti, const char *suffix) {
    const nb_st_tensor *a = &c->t[ti];
    size_t plen = strlen(a->name) - strlen(suffix);
    int oom = 0;
    /* decide whether this prefix is a layer at all before adding it */
    char *prefix = (char *)malloc(plen + 1);
    if (!prefix) return NB_ERR_OUT_OF_MEMORY;
    memcpy(prefix, a->name, plen);
    prefix[plen] = 0;
    int64_t jw = find_member(c, prefix, ".weight", &oom);
    int64_t js = find_member(c, prefix, ".weight_scale", &oom);
    int64_t jp = find_member(c, prefix, ".weight_packed", &oom);
    int64_t j2 = find_member(c, prefix, ".weight_scale_2", &oom);
    int64_t ji = find_member(c, prefix, ".input_scale", &oom);
    int64_t jq = find_member(c, prefix, ".weight.quant_state.bitsandbytes__nf4", &oom);
    if (jq < 0) jq = find_member(c, prefix, ".weight.quant_state.bitsandbytes__fp4", &oom);
    free(prefix);
    if (oom) return NB_ERR_OUT_OF_MEMORY;
    if (jp >= 0) return NB_OK; /* a compressed-tensors layer; classify_packed owns it */
    if (jq >= 0) return !strcmp(suffix, ".weight") ? nbio_classify_bnb(c, ti, jq) : NB_OK; /* bitsandbytes */
    if (!strcmp(suffix, ".weight_scale") && jw >= 0) return NB_OK; /* anchored at P.weight */
    int quant = js >= 0 || (jw >= 0 && c->t[jw].dtype == NB_ST_U8);
    if (!quant && !(jw >= 0 && is_float(c->t[jw].dtype) && c->t[jw].rank == 2)) return NB_OK; /* not a linear */

    layer_rec *L;
    nb_status st = add_layer(c, a->name, plen, &L);
    if (st != NB_OK) return st;
    size_t li = c->nlayers - 1;
    L->pub.weight_dtype = a->dtype;
    own(c, jw, li);
    own(c, js, li);
    if (!quant) {
        L->pub.format = NB_CKPT_NONE;
        L->pub.n = c->t[jw].shape[0];
        L->pub.k = c->t[jw].shape[1];
        return NB_OK;
    }
    if (js >= 0 && c->t[js].dtype == NB_ST_F8_E4M3) { /* NVFP4 */
        own(c, j2, li);
        own(c, ji, li);
    }
    if (jw < 0) return bad(L, "%s.weight is missing (its weight_scale is there)", L->prefix), NB_OK;
    if (js < 0) return bad(L, "%s.weight_scale is missing (U8 packed weight without block scales)", L->prefix), NB_OK;
    const nb_st_tensor *w = &c->t[jw], *s = &c->t[js];
    if (s->dtype == NB_ST_F8_E4M3) {
        if (!check_2d(L, w, s, layout_group(NB_CKPT_MODELOPT_NVFP4), "weight", "weight_scale (F8_E4M3)")) return NB_OK;
        if (j2 < 0) return bad(L, "%s.weight_scale_2 is missing (NVFP4)", L->prefix), NB_OK;
        if (!is_scalar_f32(&c->t[j2])) return bad(L, "weight_scale_2 must be an F32 scalar"), NB_OK;
        if (ji >= 0 && !is_scalar_f32(&c->t[ji])) return bad(L, "input_scale must be an F32 scalar"), NB_OK;
        L->pub.format = NB_CKPT_MODELOPT_NVFP4;
        L->pub.tensor_scale = read_f32(&c->t[j2]);
    } else if (is_e8m0(s->dtype)) {
        if (!check_2d(L, w, s, layout_group(NB_CKPT_QUARK_MXFP4), "weight", "weight_scale (U8 E8M0)")) return NB_OK;
        L->pub.format = NB_CKPT_QUARK_MXFP4;
        L->pub.tensor_scale = 1.0f;
    } else {
        return bad(L, "weight %s with weight_scale %s is not a 4-bit layout", dt_name(w->dtype), dt_name(s->dtype)),
               NB_OK;
    }
    L->codes_t = jw;
    L->scales_t = js;
    return NB_OK;
}

/* gpt-oss: P_blocks / P.blocks anchor; P_scales / P.scales alone is an orphan. */
static nb_status classify_blocks(nb_ckpt *c, size_t ti, const char *suffix, int is_blocks) {
    const nb_st_tensor *a = &c->t[ti];
    if (a->dtype != NB_ST_U8 && !(is_e8m0(a->dtype) && !is_blocks)) return NB_OK;
    size_t plen = strlen(a->name) - strlen(suffix);
    char sep = suffix[0]; /* '_' or '.' */
    const char *other = sep == '_' ? (is_blocks ? "_scales" : "_blocks") : (is_blocks ? ".scales" : ".blocks");
    char *prefix = (char *)malloc(plen + 1);
    if (!prefix) return NB_ERR_OUT_OF_MEMORY;
    memcpy(prefix, a->name, plen);
    prefix[plen] = 0;
    int oom = 0;
    int64_t jo = find_member(c, prefix, other, &oom);
    free(prefix);
    if (oom) return NB_ERR_OUT_OF_MEMORY;
    if (!is_blocks && jo >= 0) return NB_OK; /* anchored at the blocks */
    layer_rec *L;
    nb_status st = add_layer(c, a->name, plen, &L);
    if (st != NB_OK) return st;
    size_t li = c->nlayers - 1;
    L->pub.weight_dtype = a->dtype;
    own(c, (int64_t)ti, li);
    own(c, jo, li);
    if (jo < 0) return bad(L, "%s%s is missing", L->prefix, other), NB_OK;
    const nb_st_tensor *b = &c->t[ti], *s = &c->t[jo];
    if (b->rank != 4 || b->shape[3] != 16)
        return bad(L, "blocks must be U8 [E, R, K/32, 16], is rank %d", b->rank), NB_OK;
    L->pub.experts = b->shape[0];
    L->pub.n = b->shape[1];
    L->pub.k = b->shape[2] * 32;
    if (!is_e8m0(s->dtype) || s->rank != 3)
        return bad(L, "scales must be U8 [E, R, K/32], is %s rank %d", dt_name(s->dtype), s->rank), NB_OK;
    if (s->shape[0] != b->shape[0] || s->shape[1] != b->shape[1] || s->shape[2] != b->shape[2])
        return bad(L, "scales shape [%lld, %lld, %lld] is not the blocks shape [%lld, %lld, %lld, 16] without the 16",
                   (long long)s->shape[0], (long long)s->shape[1], (long long)s->shape[2], (long long)b->shape[0],
                   (long long)b->shape[1], (long long)b->shape[2]),
               NB_OK;
    if (L->pub.experts <= 0 || L->pub.n <= 0 || L->pub.k <= 0) return bad(L, "blocks have an empty shape"), NB_OK;
    L->pub.format = NB_CKPT_GPTOSS_MXFP4;
    L->pub.tensor_scale = 1.0f;
    L->codes_t = (int64_t)ti;
    L->scales_t = jo;
    return NB_OK;
}

typedef struct {
    const char *prefix;
    size_t i;
} prefix_ix;
static int cmp_prefix_ix(const void *a, const void *b) {
    const prefix_ix *x = (const prefix_ix *)a, *y = (const prefix_ix *)b;
    const int r = strcmp(x->prefix, y->prefix);
    return r ? r : (x->i < y->i ? -1 : x->i > y->i);
}

/* Two tensor layouts naming the same module (P.weight and P_blocks, P_blocks
 * and P.blocks, P.qweight and P.weight_packed, ...) make two layers with one
 * prefix: which one the module is cannot be told, so every such layer is
 * inconsistent, with the reason, instead of one shadowing the other. */
static nb_status flag_shared_prefixes(nb_ckpt *c) {
    if (c->nlayers < 2) return NB_OK;
    prefix_ix *ix = (prefix_ix *)malloc(c->nlayers * sizeof *ix);
    if (!ix) return NB_ERR_OUT_OF_MEMORY;
    for (size_t i = 0; i < c->nlayers; i++) ix[i] = (prefix_ix){c->layers[i].prefix, i};
    qsort(ix, c->nlayers, sizeof *ix, cmp_prefix_ix);
    for (size_t a = 0; a < c->nlayers;) {
        size_t b = a + 1;
        while (b < c->nlayers && !strcmp(ix[a].prefix, ix[b].prefix)) b++;
        if (b - a > 1)
            for (size_t k = a; k < b; k++)
                bad(&c->layers[ix[k].i], "%zu tensor layouts (e.g. P.weight and gpt-oss's P_blocks) name the module "
                    "%.160s: which one it is cannot be told", b - a, ix[k].prefix);
        a = b;
    }
    free(ix);
    return NB_OK;
}

static nb_status classify(nb_ckpt *c) {
    nb_status st = NB_OK;
    for (size_t i = 0; i < c->ntensors && st == NB_OK; i++) {
        const char *nm = c->t[i].name;
        if (nbio_ends_with(nm, ".weight_packed")) st = classify_packed(c, i);
        else if (nbio_ends_with(nm, ".qweight")) st = nbio_classify_qweight(c, i); /* AWQ, GPTQ */
        else if (nbio_ends_with(nm, ".W_q")) st = nbio_classify_hqq(c, i);          /* HQQ */
        else if (nbio_ends_with(nm, ".weight")) st = classify_weight(c, i, ".weight");
        else if (nbio_ends_with(nm, ".weight_scale")) st = classify_weight(c, i, ".weight_scale");
        else if (nbio_ends_with(nm, "_blocks")) st = classify_blocks(c, i, "_blocks", 1);
        else if (nbio_ends_with(nm, ".blocks")) st = classify_blocks(c, i, ".blocks", 1);
        else if (nbio_ends_with(nm, "_scales")) st = classify_blocks(c, i, "_scales", 0);
        else if (nbio_ends_with(nm, ".scales")) st = classify_blocks(c, i, ".scales", 0);
    }
    if (st != NB_OK) return st;
    if ((st = flag_shared_prefixes(c)) != NB_OK) return st;
    for (size_t i = 0; i < c->nlayers; i++) {
        layer_rec *L = &c->layers[i];
        L->pub.prefix = L->prefix;
        nb_ckpt_format f = L->pub.format;
        const excl_rec *x = excluded_by(c, L->prefix);
        if (x) {
            L->pub.excluded = 1;
            L->pub.excluded_by = x->pattern;
            L->pub.excluded_src = x->source;
            if (f == NB_CKPT_NONE) {
                L->pub.decided_by = x->source;
            } else if (f != NB_CKPT_INCONSISTENT) {
                L->pub.config_mismatch = 1;
                snprintf(L->pub.problem, sizeof L->pub.problem, "%s excludes it (\"%.64s\"), but the tensors are %s",
                         x->key, x->pattern, fmt_name(f));
                continue; /* the more specific note; a declared-format mismatch says less */
            }
        }
        if (c->declared == NB_CKPT_NONE || f == NB_CKPT_NONE) continue;
        if (f == c->declared) {
            L->pub.decided_by = c->declared_src;
        } else if (f != NB_CKPT_INCONSISTENT) {
            L->pub.config_mismatch = 1;
            snprintf(L->pub.problem, sizeof L->pub.problem, "%s declares %s; the tensors are %s",
                     src_name(c->declared_src), fmt_name(c->declared),
                     fmt_name(f));
        }
    }
    return NB_OK;
}

/* ------------------------------------------------------------ open / close */

static nb_status add_file(nb_ckpt *c, const char *path) {
    char **f = (char **)realloc(c->files, (c->nfiles + 1) * sizeof *f);
    if (f) c->files = f;
    uint64_t *b = (uint64_t *)realloc(c->file_bytes, (c->nfiles + 1) * sizeof *b);
    if (b) c->file_bytes = b;
    char *p = nbio_strdup(path);
    if (!f || !b || !p) {
        free(p);
        return nbi_fail(NULL, NB_ERR_OUT_OF_MEMORY, "out of memory");
    }
    struct stat sb;
    c->files[c->nfiles] = p;
    c->file_bytes[c->nfiles] = stat(path, &sb) == 0 ? (uint64_t)sb.st_size : 0;
    c->nfiles++;
    return NB_OK;
}

nb_status nbio_resolve_checkpoint(const char *path, char **dir_out, char **file_out, int *sharded) {
    *dir_out = *file_out = NULL;
    *sharded = 0;
    struct stat sb;
    if (stat(path, &sb)) return nbi_fail(NULL, NB_ERR_IO, "%s: %s", path, strerror(errno));
    char *dir = NULL, *file = NULL;
    if (S_ISDIR(sb.st_mode)) {
        dir = nbio_strdup(path);
        char *idx = dir ? nbio_join(dir, "model.safetensors.index.json") : NULL;
        char *one = dir ? nbio_join(dir, "model.safetensors") : NULL;
        struct stat s2;
        if (idx && one && stat(idx, &s2) == 0) {
            *sharded = 1;
            file = idx;
            idx = NULL;
        } else if (idx && one && stat(one, &s2) == 0) {
            file = one;
            one = NULL;
        }
        const int have = idx || one; /* both allocated: the lookup itself ran */
        free(idx);
        free(one);
        if (!file) {
            free(dir);
            if (!dir || !have) return nbi_fail(NULL, NB_ERR_OUT_OF_MEMORY, "out of memory");
            return nbi_fail(NULL, NB_ERR_NOT_FOUND,
                            "%s: neither model.safetensors.index.json nor model.safetensors is there", path);
        }
    } else {
        dir = ck_dirname(path);
        file = nbio_strdup(path);
        *sharded = nbio_ends_with(path, ".json");
        if (!dir || !file) {
            free(dir);
            free(file);
            return nbi_fail(NULL, NB_ERR_OUT_OF_MEMORY, "out of memory");
        }
    }
    *dir_out = dir;
    *file_out = file;
    return NB_OK;
}

/* The tensors of a sharded checkpoint: the index and its shards as files,
 * every tensor in c->t. */
static nb_status open_sharded(nb_ckpt *c, const char *dir, const char *file) {
    nb_status st = nb_st_index_open(file, &c->index);
    if (st == NB_OK) st = add_file(c, file);
    size_t ns = 0;
    if (st == NB_OK) st = nb_st_index_shard_count(c->index, &ns);
    for (size_t i = 0; i < ns && st == NB_OK; i++) {
        const char *name;
        if ((st = nb_st_index_shard_at(c->index, i, &name, NULL)) != NB_OK) break;
        char *p = nbio_join(dir, name);
        st = p ? add_file(c, p) : nbi_fail(NULL, NB_ERR_OUT_OF_MEMORY, "out of memory");
        free(p);
    }
    if (st == NB_OK) st = nb_st_index_count(c->index, &c->ntensors);
    return st;
}

/* Copy every tensor record into c->t (name order) and mark none as a layer's. */
static nb_status load_tensors(nb_ckpt *c) {
    c->t = (nb_st_tensor *)calloc(c->ntensors ? c->ntensors : 1, sizeof *c->t);
    c->t_layer = (int64_t *)malloc((c->ntensors ? c->ntensors : 1) * sizeof *c->t_layer);
    if (!c->t || !c->t_layer) return nbi_fail(NULL, NB_ERR_OUT_OF_MEMORY, "out of memory");
    for (size_t i = 0; i < c->ntensors; i++) {
        nb_status st = c->index ? nb_st_index_tensor_at(c->index, i, &c->t[i]) : nb_st_tensor_at(c->file, i, &c->t[i]);
        if (st != NB_OK) return st;
        c->t_layer[i] = -1;
    }
    return NB_OK;
}

/* The last step of opening: layers classified, experts grouped (label
 * names the checkpoint in the messages). */
static nb_status classify_and_group(nb_ckpt *c, const char *label) {
    nb_status st = classify(c);
    if (st != NB_OK) return nbi_fail(NULL, st, "%s: out of memory while classifying layers", label);
    if ((st = nbio_moe_build(c, &c->moe_cfg, &c->moe)) != NB_OK)
        return nbi_fail(NULL, st, "%s: out of memory while grouping experts", label);
    return NB_OK;
}

nb_status nb_ckpt_open(const char *path, nb_ckpt **out) {
    if (!path || !out) return nbi_fail(NULL, NB_ERR_NULL_POINTER, "nb_ckpt_open: path and out must not be NULL");
    *out = NULL;
    nb_ckpt *c = (nb_ckpt *)calloc(1, sizeof *c);
    if (!c) return nbi_fail(NULL, NB_ERR_OUT_OF_MEMORY, "out of memory");
    char *dir = NULL, *file = NULL;
    int sharded = 0;
    nb_status st = nbio_resolve_checkpoint(path, &dir, &file, &sharded);
    if (st == NB_OK && sharded) {
        st = open_sharded(c, dir, file);
    } else if (st == NB_OK) {
        st = nb_st_open(file, &c->file);
        if (st == NB_OK) st = add_file(c, file);
        if (st == NB_OK) st = nb_st_count(c->file, &c->ntensors);
    }
    if (st == NB_OK) st = load_tensors(c);
    if (st == NB_OK) st = read_configs(c, dir);
    if (st == NB_OK) {
        c->dir = dir;
        dir = NULL;
        st = classify_and_group(c, path);
    }
    free(dir);
    free(file);
    if (st != NB_OK) {
        nb_ckpt_close(c);
        return st;
    }
    *out = c;
    return NB_OK;
}

nb_status nb_ckpt_close(nb_ckpt *c) {
    if (!c) return NB_OK;
    nb_st_close(c->file);
    nb_st_index_close(c->index);
    for (size_t i = 0; i < c->nfiles; i++) free(c->files[i]);
    free(c->files);
    free(c->file_bytes);
    free(c->t);
    free(c->t_layer);
    for (size_t i = 0; i < c->nlayers; i++) {
        free(c->layers[i].prefix);
        free(c->layers[i].cv);
    }
    free(c->layers);
    for (size_t i = 0; i < c->nex; i++) {
        if (c->ex[i].is_re && c->ex[i].usable) regfree(&c->ex[i].re);
        free(c->ex[i].pattern);
        free(c->ex[i].key);
    }
    free(c->ex);
    free(c->dir);
    free(c->quant_method);
    free(c->quant_algo);
    free(c->ct_format);
    nbio_moe_free(c->moe);
    free(c);
    return NB_OK;
}

/* ------------------------------------------------------------ queries */

/* Every query's NULL check, with the function's name in the message. */
#define NEED(cond, fn) \
    if (!(cond)) return nbi_fail(NULL, NB_ERR_NULL_POINTER, "%s: a required pointer is NULL", fn)
#define IN_RANGE(i, n, what, fn)                                                                          \
    if ((i) >= (n))                                                                                       \
    return nbi_fail(NULL, NB_ERR_NOT_FOUND, "%s: %s %zu out of range (%zu)", fn, what, (size_t)(i), (size_t)(n))

nb_status nb_ckpt_file_count(const nb_ckpt *c, size_t *count) {
    NEED(c && count, "nb_ckpt_file_count");
    *count = c->nfiles;
    return NB_OK;
}

nb_status nb_ckpt_file_at(const nb_ckpt *c, size_t i, const char **path, uint64_t *bytes) {
    NEED(c, "nb_ckpt_file_at");
    IN_RANGE(i, c->nfiles, "file", "nb_ckpt_file_at");
    if (path) *path = c->files[i];
    if (bytes) *bytes = c->file_bytes[i];
    return NB_OK;
}

nb_status nb_ckpt_tensor_count(const nb_ckpt *c, size_t *count) {
    NEED(c && count, "nb_ckpt_tensor_count");
    *count = c->ntensors;
    return NB_OK;
}

nb_status nb_ckpt_tensor_at(const nb_ckpt *c, size_t i, nb_st_tensor *out, int64_t *layer) {
    NEED(c && out, "nb_ckpt_tensor_at");
    IN_RANGE(i, c->ntensors, "tensor", "nb_ckpt_tensor_at");
    *out = c->t[i];
    if (layer) *layer = c->t_layer[i];
    return NB_OK;
}

int64_t nbio_ckpt_lookup(const nb_ckpt *c, const char *name, int64_t *layer) {
    int64_t j = find_t(c, name);
    if (layer) *layer = j >= 0 ? c->t_layer[j] : -1;
    return j;
}

nb_status nb_ckpt_tensor_find(const nb_ckpt *c, const char *name, size_t *index) {
    NEED(c && name && index, "nb_ckpt_tensor_find");
    int64_t j = find_t(c, name);
    if (j < 0) return nbi_fail(NULL, NB_ERR_NOT_FOUND, "%s: no tensor \"%.200s\"", c->files[0], name);
    *index = (size_t)j;
    return NB_OK;
}

nb_status nb_ckpt_shard_count(const nb_ckpt *c, size_t *count, int *sharded) {
    NEED(c && count, "nb_ckpt_shard_count");
    if (sharded) *sharded = c->index != NULL;
    if (c->index) return nb_st_index_shard_count(c->index, count);
    *count = 1;
    return NB_OK;
}

nb_status nb_ckpt_shard_at(const nb_ckpt *c, size_t i, const char **name, const nb_st_file **file) {
    NEED(c && name && file, "nb_ckpt_shard_at");
    if (c->index) return nb_st_index_shard_at(c->index, i, name, file);
    IN_RANGE(i, 1, "shard", "nb_ckpt_shard_at");
    const char *slash = strrchr(c->files[0], '/');
    *name = slash ? slash + 1 : c->files[0];
    *file = c->file;
    return NB_OK;
}

nb_status nb_ckpt_get_dir(const nb_ckpt *c, const char **dir) {
    NEED(c && dir, "nb_ckpt_get_dir");
    *dir = c->dir;
    return NB_OK;
}

nb_status nb_ckpt_layer_count(const nb_ckpt *c, size_t *count) {
    NEED(c && count, "nb_ckpt_layer_count");
    *count = c->nlayers;
    return NB_OK;
}

const nb_ckpt_layer *nbio_ckpt_layer_ref(const nb_ckpt *c, size_t i) {
    return i < c->nlayers ? &c->layers[i].pub : NULL;
}

nb_status nb_ckpt_layer_at(const nb_ckpt *c, size_t i, nb_ckpt_layer *out) {
    NEED(c && out, "nb_ckpt_layer_at");
    IN_RANGE(i, c->nlayers, "layer", "nb_ckpt_layer_at");
    *out = c->layers[i].pub;
    return NB_OK;
}

int64_t nbio_ckpt_layer_lookup(const nb_ckpt *c, const char *prefix) {
    for (size_t i = 0; i < c->nlayers; i++)
        if (!strcmp(c->layers[i].prefix, prefix)) return (int64_t)i;
    return -1;
}

nb_status nb_ckpt_layer_find(const nb_ckpt *c, const char *prefix, size_t *index) {
    NEED(c && prefix && index, "nb_ckpt_layer_find");
    int64_t i = nbio_ckpt_layer_lookup(c, prefix);
    if (i < 0) return nbi_fail(NULL, NB_ERR_NOT_FOUND, "%s: no layer \"%.200s\"", c->files[0], prefix);
    *index = (size_t)i;
    return NB_OK;
}

nb_status nb_ckpt_get_config(const nb_ckpt *c, nb_ckpt_config *out) {
    NEED(c && out, "nb_ckpt_get_config");
    memset(out, 0, sizeof *out);
    out->declared = c->declared;
    out->source = c->declared_src;
    out->quant_method = c->quant_method;
    out->quant_algo = c->quant_algo;
    out->ct_format = c->ct_format;
    out->has_config_json = c->has_config_json;
    out->has_hf_quant_config = c->has_hf_quant_config;
    out->nexclude = c->nex;
    out->note = c->config_note[0] ? c->config_note : NULL;
    return NB_OK;
}

nb_status nb_ckpt_exclude_at(const nb_ckpt *c, size_t i, const char **pattern, const char **where, int *usable) {
    NEED(c && pattern, "nb_ckpt_exclude_at");
    IN_RANGE(i, c->nex, "exclude entry", "nb_ckpt_exclude_at");
    *pattern = c->ex[i].pattern;
    if (where) *where = c->ex[i].key;
    if (usable) *usable = c->ex[i].usable;
    return NB_OK;
}

/* read_configs on texts in memory (either NULL when absent). */
static nb_status configs_from_texts(nb_ckpt *c, const char *hf_json, size_t hf_len, const char *cfg_json,
                                    size_t cfg_len) {
    cJSON *hf = NULL, *cfg = NULL;
    nb_status st = hf_json ? nbio_parse_json("hf_quant_config.json", hf_json, hf_len, &hf) : NB_OK;
    if (st == NB_OK && cfg_json) st = nbio_parse_json("config.json", cfg_json, cfg_len, &cfg);
    if (st == NB_OK) st = configs_from_json(c, hf, cfg);
    cJSON_Delete(hf);
    cJSON_Delete(cfg);
    return st;
}

nb_status nbio_ckpt_config_check_memory(const char *hf_json, size_t hf_len, const char *cfg_json, size_t cfg_len,
                                        const char *const *prefixes, size_t n, int *excluded) {
    if ((!hf_json && hf_len) || (!cfg_json && cfg_len) || (n && (!prefixes || !excluded)))
        return nbi_fail(NULL, NB_ERR_NULL_POINTER, "nbio_ckpt_config_check_memory: NULL argument");
    nb_ckpt *c = (nb_ckpt *)calloc(1, sizeof *c);
    if (!c) return nbi_fail(NULL, NB_ERR_OUT_OF_MEMORY, "out of memory");
    nb_status st = configs_from_texts(c, hf_json, hf_len, cfg_json, cfg_len);
    for (size_t i = 0; st == NB_OK && i < n; i++) {
        if (!prefixes[i]) st = nbi_fail(NULL, NB_ERR_NULL_POINTER, "prefix %zu is NULL", i);
        else excluded[i] = excluded_by(c, prefixes[i]) != NULL;
    }
    nb_ckpt_close(c);
    return st;
}

nb_status nbio_ckpt_open_memory(const void *image, size_t size, const char *cfg_json, size_t cfg_len,
                                const char *hf_json, size_t hf_len, nb_ckpt **out) {
    if (!out || !image || (!hf_json && hf_len) || (!cfg_json && cfg_len))
        return nbi_fail(NULL, NB_ERR_NULL_POINTER, "nbio_ckpt_open_memory: NULL argument");
    *out = NULL;
    nb_ckpt *c = (nb_ckpt *)calloc(1, sizeof *c);
    if (!c) return nbi_fail(NULL, NB_ERR_OUT_OF_MEMORY, "out of memory");
    nb_status st = nb_st_open_memory(image, size, "(memory)", &c->file);
    if (st == NB_OK) st = add_file(c, "(memory)");
    if (st == NB_OK) st = nb_st_count(c->file, &c->ntensors);
    if (st == NB_OK) st = load_tensors(c);
    if (st == NB_OK) st = configs_from_texts(c, hf_json, hf_len, cfg_json, cfg_len);
    if (st == NB_OK && !(c->dir = nbio_strdup("(memory)"))) st = nbi_fail(NULL, NB_ERR_OUT_OF_MEMORY, "out of memory");
    if (st == NB_OK) st = classify_and_group(c, "(memory)");
    if (st != NB_OK) {
        nb_ckpt_close(c);
        return st;
    }
    *out = c;
    return NB_OK;
}

nb_status nb_ckpt_layer_weight(const nb_ckpt *c, size_t i, int64_t expert, nb_weight_desc *desc,
                               const uint8_t **codes, const uint8_t **scales) {
    NEED(c && desc && codes && scales, "nb_ckpt_layer_weight");
    IN_RANGE(i, c->nlayers, "layer", "nb_ckpt_layer_weight");
    const layer_rec *L = &c->layers[i];
    nb_ckpt_format f = L->pub.format;
    if (f == NB_CKPT_NONE || f == NB_CKPT_INCONSISTENT)
        return nbi_fail(NULL, NB_ERR_UNSUPPORTED, "%s: %s layer has no 4-bit weight%s%s", L->prefix,
                        fmt_name(f), L->pub.problem[0] ? ": " : "", L->pub.problem);
    if (L->cv)
        return nbi_fail(NULL, NB_ERR_UNSUPPORTED, "%s: a %s layer is converted when read, into buffers of the "
                        "caller's: use nb_ckpt_layer_weight_v2", L->prefix, fmt_name(f));
    int64_t ne = f == NB_CKPT_GPTOSS_MXFP4 ? L->pub.experts : 1;
    if (expert < 0 || expert >= ne)
        return nbi_fail(NULL, NB_ERR_INVALID_ARGUMENT, "%s: expert %lld out of range [0, %lld)", L->prefix,
                        (long long)expert, (long long)ne);
    const struct ckpt_layout *lay = layout_of(f);
    nb_status st = nb_weight_desc_init(desc, lay->weight, L->pub.n, L->pub.k);
    if (st != NB_OK) return nbi_fail(NULL, st, "%s: nb_weight_desc_init failed: %s", L->prefix, nb_last_error());
    desc->tensor_scale = L->pub.tensor_scale;
    if (desc->scale_type == NB_SCALE_E8M0) desc->scale_rule = lay->rule;
    nb_weight_sizes sz;
    if ((st = nb_weight_get_sizes(desc, &sz)) != NB_OK)
        return nbi_fail(NULL, st, "%s: %s", L->prefix, nb_last_error());
    const nb_st_tensor *tc = &c->t[L->codes_t], *ts = &c->t[L->scales_t];
    /* classification guarantees these; checked again because the pointers
     * leave this module */
    if (tc->bytes != sz.codes_bytes * (size_t)ne || ts->bytes != sz.scales_bytes * (size_t)ne)
        return nbi_fail(NULL, NB_ERR_INTERNAL, "%s: tensor sizes disagree with the descriptor", L->prefix);
    *codes = (const uint8_t *)tc->data + (size_t)expert * sz.codes_bytes;
    *scales = (const uint8_t *)ts->data + (size_t)expert * sz.scales_bytes;
    return NB_OK;
}

nb_status nb_ckpt_layer_weight_v2(const nb_ckpt *c, size_t i, int64_t expert, nb_weight_desc *desc,
                                  const nb_weight_buffers *out, const nb_weight_sizes_v2 *capacity) {
    static const char fn[] = "nb_ckpt_layer_weight_v2";
    NEED(c && desc && (!out || capacity), fn);
    IN_RANGE(i, c->nlayers, "layer", fn);
    const layer_rec *L = &c->layers[i];
    if (L->cv) {
        if (expert != 0)
            return nbi_fail(NULL, NB_ERR_INVALID_ARGUMENT, "%s: expert %lld out of range [0, 1)", L->prefix,
                            (long long)expert);
        return nbio_conv_read(c, L->prefix, L->cv, L->pub.n, L->pub.k, desc, out, capacity);
    }
    const uint8_t *codes = NULL, *scales = NULL; /* the zero-copy layouts: copied */
    nb_status st = nb_ckpt_layer_weight(c, i, expert, desc, &codes, &scales);
    if (st != NB_OK || !out) return st;
    nb_weight_sizes sz;
    if ((st = nb_weight_get_sizes(desc, &sz)) != NB_OK) return nbi_fail(NULL, st, "%s: %s", L->prefix, nb_last_error());
    if (!out->codes || !out->scales) return nbi_fail(NULL, NB_ERR_NULL_POINTER, "%s: codes and scales must not be NULL", fn);
    if (out->zeros || out->reserved[0] || out->reserved[1] || out->reserved[2] || out->reserved[3])
        return nbi_fail(NULL, NB_ERR_INVALID_ARGUMENT, "%s: a %s layer has no zero points (zeros and the reserved "
                        "pointers must be NULL)", fn, fmt_name(L->pub.format));
    if (capacity->codes_bytes < sz.codes_bytes || capacity->scales_bytes < sz.scales_bytes)
        return nbi_fail(NULL, NB_ERR_BUFFER_TOO_SMALL, "%s: %s needs %zu code and %zu scale bytes, the buffers hold "
                        "%zu and %zu", fn, L->prefix, sz.codes_bytes, sz.scales_bytes, capacity->codes_bytes,
                        capacity->scales_bytes);
    memcpy(out->codes, codes, sz.codes_bytes);
    memcpy(out->scales, scales, sz.scales_bytes);
    return NB_OK;
}

/* ------------------------------------------------------------ services to ckpt_int.c */

const nb_st_tensor *nbio_ck_tensor(const nb_ckpt *c, int64_t j) { return j >= 0 ? &c->t[j] : NULL; }

int64_t nbio_ck_member(const nb_ckpt *c, const char *prefix, const char *suffix, int *oom) {
    return find_member(c, prefix, suffix, oom);
}

nb_status nbio_ck_add_layer(nb_ckpt *c, const char *name, size_t plen, size_t *li) {
    layer_rec *L;
    nb_status st = add_layer(c, name, plen, &L);
    if (st == NB_OK) *li = c->nlayers - 1;
    return st;
}

void nbio_ck_own(nb_ckpt *c, int64_t j, size_t li) { own(c, j, li); }
nb_ckpt_layer *nbio_ck_pub(nb_ckpt *c, size_t li) { return &c->layers[li].pub; }
const char *nbio_ck_prefix(const nb_ckpt *c, size_t li) { return c->layers[li].prefix; }

void nbio_ck_bad(nb_ckpt *c, size_t li, const char *fmt, ...) {
    nb_ckpt_layer *p = &c->layers[li].pub;
    p->format = NB_CKPT_INCONSISTENT;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(p->problem, sizeof p->problem, fmt, ap);
    va_end(ap);
}

void nbio_ck_set_conv(nb_ckpt *c, size_t li, nbio_conv *cv) {
    free(c->layers[li].cv);
    c->layers[li].cv = cv;
}

const nbio_conv *nbio_ck_conv(const nb_ckpt *c, size_t li) { return li < c->nlayers ? c->layers[li].cv : NULL; }
const nbio_qcfg *nbio_ck_qcfg(const nb_ckpt *c) { return &c->qcfg; }
const nbio_moe_set *nbio_ck_moe(const nb_ckpt *c) { return c->moe; }
