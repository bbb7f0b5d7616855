/* ckpt.c - `nibble inspect`, `nibble quantize`, `nibble convert`: thin
 * commands over the checkpoint API (nibble_io.h).  Every library call is
 * checked: a failure prints "nibble <command>: NB_ERR_...: <the library's
 * message>" and exits 3 (2 for a conversion --strict refuses). */
#define _POSIX_C_SOURCE 200809L
#include "args.h"
#include "cli.h"
#include "nibble.h"
#include "nibble_io.h"

#include <cjson/cJSON.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h> /* isatty */

/* Report a failed library call of command `cmd`: exit code 3. */
static int fail(const char *cmd, nb_status st) {
    fprintf(stderr, "nibble %s: %s: %s\n", cmd, nb_status_name(st), nb_last_error());
    return 3;
}

static void json_add_i64(cJSON *o, const char *key, int64_t v) { cJSON_AddNumberToObject(o, key, (double)v); }

/* Print a JSON object on stdout and free it: 0, or 3 when it cannot be printed. */
static int print_json(cJSON *j) {
    char *txt = j ? cJSON_Print(j) : NULL;
    if (txt) printf("%s\n", txt);
    else fprintf(stderr, "nibble: out of memory for the JSON output\n");
    cJSON_free(txt);
    cJSON_Delete(j);
    return txt ? 0 : 3;
}

/* Names of values the library itself returned (a lookup cannot fail on
 * them; "unknown" or "?" otherwise). */
static const char *ckpt_format_str(nb_ckpt_format f) { const char *s; return nb_ckpt_format_name(f, &s) ? "unknown" : s; }
static const char *source_str(nb_ckpt_source x) { const char *s; return nb_ckpt_source_name(x, &s) ? "unknown" : s; }
static const char *dtype_str(nb_st_dtype d) { const char *s; return nb_st_dtype_info(d, &s, NULL) ? "?" : s; }
static const char *ggml_str(uint32_t t) { const char *s; return nb_ggml_type_name(t, &s) ? "?" : s; }
static const char *vtype_str(nb_gguf_vtype t) { const char *s; return nb_gguf_vtype_name(t, &s) ? "?" : s; }

/* ================================================================ inspect */

static void inspect_help(void) {
    printf("usage: nibble inspect PATH [--summary] [--json]\n"
           "  PATH is a .safetensors file, a directory (model.safetensors.index.json or\n"
           "  model.safetensors inside) or an index file; config.json and\n"
           "  hf_quant_config.json next to it are read when present.\n"
           "  A GGUF file (*.gguf, or starting with \"GGUF\") lists its header, metadata,\n"
           "  tensors with their ggml type and shape, and the MXFP4 / NVFP4 weights\n"
           "  nibble imports (gguf-mxfp4, gguf-nvfp4).\n"
           "  Prints the files, every tensor (name, dtype, shape, bytes; not with\n"
           "  --summary), every linear layer with its detected format (modelopt-nvfp4,\n"
           "  ct-nvfp4, ct-mxfp4, quark-mxfp4, gptoss-mxfp4, none = unquantized,\n"
           "  inconsistent = breaks its layout's rules, with the reason), n x k,\n"
           "  experts, tensor scale and what decided it (a layer named by the config's\n"
           "  exclude / ignore list says so; a 4-bit layer it names is a WARNING), the\n"
           "  expert groups (the experts of a mixture-of-experts layer: gpt-oss's\n"
           "  expert-major tensors, or one layer per expert and projection, shown as one\n"
           "  group instead of their layers; an inconsistent group with the reason), then\n"
           "  totals.\n"
           "  --json  the same as one JSON object on stdout.\n"
           "  Exit: 0 read (even with inconsistent layers), 1 usage, 3 unreadable or corrupt.\n");
}

/* ---------------------------------------------------------------- GGUF */

/* A GGUF value as text. */
static void gguf_value(const nb_gguf_kv *kv, char *buf, size_t n) {
    const uint8_t *d = kv->data;
    uint64_t u = 0;
    int64_t i = 0;
    double f = 0;
    switch (kv->type) {
    case NB_GGUF_STRING: snprintf(buf, n, "\"%.60s%s\"", kv->str, strlen(kv->str) > 60 ? "..." : ""); return;
    case NB_GGUF_ARRAY: snprintf(buf, n, "[%s x %llu]", vtype_str(kv->elem_type), (unsigned long long)kv->count); return;
    case NB_GGUF_FLOAT32: { float x; memcpy(&x, d, 4); f = x; snprintf(buf, n, "%.9g", f); return; }
    case NB_GGUF_FLOAT64: memcpy(&f, d, 8); snprintf(buf, n, "%.17g", f); return;
    case NB_GGUF_BOOL: snprintf(buf, n, "%s", d[0] ? "true" : "false"); return;
    case NB_GGUF_INT8: i = (int8_t)d[0]; break;
    case NB_GGUF_INT16: { int16_t x; memcpy(&x, d, 2); i = x; break; }
    case NB_GGUF_INT32: { int32_t x; memcpy(&x, d, 4); i = x; break; }
    case NB_GGUF_INT64: memcpy(&i, d, 8); break;
    default:
        memcpy(&u, d, (size_t)kv->bytes < 8 ? (size_t)kv->bytes : 8);
        snprintf(buf, n, "%llu", (unsigned long long)u);
        return;
    }
    snprintf(buf, n, "%lld", (long long)i);
}

/* The ggml types a GGUF file's 4-bit weights are imported from, in type
 * order, with how many tensors of each the file holds. */
typedef struct gguf_fp4_count {
    uint32_t type;
    char name[16]; /* the nibble format's name: "mxfp4" */
    size_t count;
} gguf_fp4_count;

static size_t gguf_fp4_types(gguf_fp4_count *out, size_t max) {
    size_t n = 0;
    for (uint32_t t = 0; t < 256 && n < max; t++) { /* ggml numbers its types below 256 */
        nb_format f;
        nb_format_info fi;
        if (nb_ggml_type_format(t, &f) != NB_OK || nb_format_get_info(f, &fi) != NB_OK) continue;
        out[n].type = t;
        snprintf(out[n].name, sizeof out[n].name, "%s", fi.name);
        out[n].count = 0;
        n++;
    }
    return n;
}

/* One tensor of the GGUF listing: its line (or JSON object) and, for an
 * importable 4-bit weight, its count in fp4[]. */
static nb_status gguf_tensor(const nb_gguf_file *g, size_t i, int summary, cJSON *jt, gguf_fp4_count *counts,
                             size_t ncounts, uint64_t *total) {
    nb_gguf_tensor t;
    nb_status st = nb_gguf_tensor_at(g, i, &t);
    if (st != NB_OK) return st;
    *total += t.bytes;
    nb_gguf_fp4 f;
    nb_format_info fi;
    const int fp4 = nb_gguf_fp4_info(g, i, &f) == NB_OK && nb_format_get_info(f.format, &fi) == NB_OK;
    char fmt[32] = "none";
    float ts = 1.0f;
    if (fp4) {
        snprintf(fmt, sizeof fmt, "gguf-%s", fi.name);
        for (size_t k = 0; k < ncounts; k++) counts[k].count += counts[k].type == t.type;
        nb_gguf_tensor s;
        if (f.scale_tensor >= 0) {
            if ((st = nb_gguf_tensor_at(g, (size_t)f.scale_tensor, &s)) != NB_OK) return st;
            memcpy(&ts, s.data, 4);
        }
    }
    if (jt) {
        cJSON *o = cJSON_CreateObject(), *sh = cJSON_CreateArray();
        cJSON_AddStringToObject(o, "name", t.name);
        cJSON_AddStringToObject(o, "ggml_type", ggml_str(t.type));
        for (int d = 0; d < t.n_dims; d++) cJSON_AddItemToArray(sh, cJSON_CreateNumber((double)t.shape[d]));
        cJSON_AddItemToObject(o, "shape", sh);
        json_add_i64(o, "bytes", (int64_t)t.bytes);
        cJSON_AddStringToObject(o, "format", fmt);
        if (fp4) {
            json_add_i64(o, "n", f.n);
            json_add_i64(o, "k", f.k);
            json_add_i64(o, "experts", f.experts);
            cJSON_AddNumberToObject(o, "tensor_scale", ts);
        }
        cJSON_AddItemToArray(jt, o);
        return NB_OK;
    }
    if (summary && !fp4) return NB_OK;
    char shape[96] = "[";
    size_t at = 1;
    for (int d = 0; d < t.n_dims; d++)
        at += (size_t)snprintf(shape + at, sizeof shape - at, "%s%lld", d ? ", " : "", (long long)t.shape[d]);
    snprintf(shape + at, sizeof shape - at, "]");
    char extra[96] = "";
    if (fp4)
        snprintf(extra, sizeof extra, "  %lld x %lld%s%.0lld%s, tensor scale %.6g", (long long)f.n, (long long)f.k,
                 f.experts ? " x " : "", (long long)f.experts, f.experts ? " exp" : "", (double)ts);
    printf("  %-40s %-8s %-22s %12llu  %s%s\n", t.name, ggml_str(t.type), shape, (unsigned long long)t.bytes, fmt,
           extra);
    return NB_OK;
}

/* A GGUF file: header, key/values, tensors with their ggml type and, for
 * MXFP4 / NVFP4, the weight nibble imports (n x k, experts, tensor scale). */
static nb_status gguf_listing(const nb_gguf_file *g, const char *path, int json, int summary) {
    nb_gguf_header h;
    nb_status st = nb_gguf_get_header(g, &h);
    if (st != NB_OK) return st;
    cJSON *root = json ? cJSON_CreateObject() : NULL, *jk = NULL, *jt = NULL;
    if (json) {
        cJSON_AddStringToObject(root, "path", path);
        cJSON_AddStringToObject(root, "container", "gguf");
        json_add_i64(root, "version", h.version);
        json_add_i64(root, "alignment", h.alignment);
        jk = cJSON_AddObjectToObject(root, "metadata");
        jt = cJSON_AddArrayToObject(root, "tensors");
    } else {
        printf("gguf %s\nversion %u, alignment %u, %zu keys, %zu tensors, data at byte %llu\n", path, h.version,
               h.alignment, h.n_kv, h.n_tensors, (unsigned long long)h.data_offset);
        if (!summary) printf("\nmetadata (%zu):\n", h.n_kv);
    }
    for (size_t i = 0; i < h.n_kv && st == NB_OK; i++) {
        nb_gguf_kv kv;
        if ((st = nb_gguf_kv_at(g, i, &kv)) != NB_OK) break;
        char v[128];
        gguf_value(&kv, v, sizeof v);
        if (json) cJSON_AddStringToObject(jk, kv.key, v);
        else if (!summary) printf("  %-48s %-8s %s\n", kv.key, vtype_str(kv.type), v);
    }
    if (!json && st == NB_OK)
        printf("\ntensors (%zu):\n  %-40s %-8s %-22s %12s  %s\n", h.n_tensors, "name", "type", "shape", "bytes",
               "format");
    gguf_fp4_count fp4[8];
    const size_t nfp4 = gguf_fp4_types(fp4, 8);
    uint64_t total = 0;
    for (size_t i = 0; i < h.n_tensors && st == NB_OK; i++) st = gguf_tensor(g, i, summary, jt, fp4, nfp4, &total);
    if (st != NB_OK) {
        cJSON_Delete(root);
        return st;
    }
    if (json) {
        cJSON *tot = cJSON_AddObjectToObject(root, "totals");
        json_add_i64(tot, "tensors", (int64_t)h.n_tensors);
        json_add_i64(tot, "bytes", (int64_t)total);
        for (size_t k = 0; k < nfp4; k++) {
            char key[32];
            snprintf(key, sizeof key, "gguf_%s", fp4[k].name);
            json_add_i64(tot, key, (int64_t)fp4[k].count);
        }
        return print_json(root) ? NB_ERR_OUT_OF_MEMORY : NB_OK;
    }
    printf("\ntotals: %zu tensors, %llu bytes;", h.n_tensors, (unsigned long long)total);
    for (size_t k = 0; k < nfp4; k++) printf("%s %zu gguf-%s", k ? "," : "", fp4[k].count, fp4[k].name);
    printf(" (importable into nibble's checkpoint layout)\n");
    return NB_OK;
}

static int inspect_gguf(const char *path, int json, int summary) {
    nb_gguf_file *g = NULL;
    nb_status st = nb_gguf_open(path, &g);
    if (st == NB_OK) st = gguf_listing(g, path, json, summary);
    const nb_status cst = nb_gguf_close(g);
    if (st == NB_OK) st = cst;
    return st == NB_OK ? 0 : fail("inspect", st);
}

/* By name, or by its first bytes when it is a regular file (a FIFO or
 * device is not opened here: the library refuses it by name). */
static int is_gguf(const char *path) {
    size_t n = strlen(path);
    if (n > 5 && !strcmp(path + n - 5, ".gguf")) return 1;
    struct stat sb;
    int fd = -1;
    if (stat(path, &sb) != 0 || !S_ISREG(sb.st_mode) || (fd = open(path, O_RDONLY | O_NONBLOCK)) < 0) return 0;
    char m[4] = {0};
    const int r = read(fd, m, 4) == 4 && !memcmp(m, "GGUF", 4);
    close(fd);
    return r;
}

/* ---------------------------------------------------------------- checkpoints */

enum { NDT = 32, NCF = 16 }; /* bounds of the dtype and layout values counted */

/* What `nibble inspect` totals: bytes and tensors by dtype; layers by
 * layout; parameters of quantized layers (n*k per expert) vs elements of
 * every float tensor outside them (inconsistent layers are not quantized). */
typedef struct ckpt_view {
    const nb_ckpt *c;
    const char *path;
    size_t nf, nt, nl;
    nb_ckpt_config cfg;
    uint64_t dt_bytes[NDT], dt_count[NDT], total_bytes;
    int64_t q_params, u_params;
    size_t nfmt[NCF];
    size_t ngroups;  /* expert groups */
} ckpt_view;

static const char *act_str(int32_t a) { return a == NB_MOE_ACT_SWIGLU_OAI ? "swiglu_oai" : "swiglu"; }
static const char *gate_up_str(int32_t l) { return l == NB_MOE_GATE_UP_INTERLEAVED ? "interleaved" : "concat"; }

/* The expert group layer i belongs to when that group is consistent (its
 * layers are shown as the group), else -1. */
static int64_t folded_group(const nb_ckpt *c, size_t i) {
    int64_t g = -1;
    nb_ckpt_moe m;
    if (nb_ckpt_layer_moe(c, i, &g, NULL, NULL) != NB_OK || g < 0) return -1;
    return nb_ckpt_moe_at(c, (size_t)g, &m) == NB_OK && m.format != NB_CKPT_INCONSISTENT ? g : -1;
}

static int is_quantized(nb_ckpt_format f) { return f != NB_CKPT_NONE && f != NB_CKPT_INCONSISTENT; }

/* Stage 1: the counts, the config and the totals. */
static nb_status ckpt_totals(ckpt_view *v) {
    nb_status st;
    if ((st = nb_ckpt_file_count(v->c, &v->nf)) != NB_OK || (st = nb_ckpt_tensor_count(v->c, &v->nt)) != NB_OK ||
        (st = nb_ckpt_layer_count(v->c, &v->nl)) != NB_OK || (st = nb_ckpt_get_config(v->c, &v->cfg)) != NB_OK ||
        (st = nb_ckpt_moe_count(v->c, &v->ngroups)) != NB_OK)
        return st;
    for (size_t i = 0; i < v->nt; i++) {
        nb_st_tensor t;
        nb_ckpt_layer L;
        int64_t layer;
        if ((st = nb_ckpt_tensor_at(v->c, i, &t, &layer)) != NB_OK) return st;
        if ((unsigned)t.dtype < NDT) {
            v->dt_bytes[t.dtype] += t.bytes;
            v->dt_count[t.dtype]++;
        }
        v->total_bytes += t.bytes;
        int in_quant = 0;
        if (layer >= 0) {
            if ((st = nb_ckpt_layer_at(v->c, (size_t)layer, &L)) != NB_OK) return st;
            in_quant = is_quantized(L.format);
        }
        if (!in_quant && (t.dtype == NB_ST_BF16 || t.dtype == NB_ST_F16 || t.dtype == NB_ST_F32 ||
                          t.dtype == NB_ST_F64)) {
            int64_t e = 1;
            for (int d = 0; d < t.rank; d++) e *= t.shape[d];
            v->u_params += e;
        }
    }
    for (size_t i = 0; i < v->nl; i++) {
        nb_ckpt_layer L;
        if ((st = nb_ckpt_layer_at(v->c, i, &L)) != NB_OK) return st;
        if ((unsigned)L.format < NCF) v->nfmt[L.format]++;
        if (is_quantized(L.format)) v->q_params += L.n * L.k * (L.experts ? L.experts : 1);
    }
    return NB_OK;
}

/* The "config" object of --json. */
static nb_status ckpt_json_config(const ckpt_view *v, cJSON *root) {
    const nb_ckpt_config *cfg = &v->cfg;
    cJSON *jc = cJSON_AddObjectToObject(root, "config");
    cJSON_AddBoolToObject(jc, "config_json", cfg->has_config_json);
    cJSON_AddBoolToObject(jc, "hf_quant_config_json", cfg->has_hf_quant_config);
    if (cfg->quant_method) cJSON_AddStringToObject(jc, "quant_method", cfg->quant_method);
    if (cfg->quant_algo) cJSON_AddStringToObject(jc, "quant_algo", cfg->quant_algo);
    if (cfg->ct_format) cJSON_AddStringToObject(jc, "format", cfg->ct_format);
    cJSON_AddStringToObject(jc, "declared", ckpt_format_str(cfg->declared));
    cJSON_AddStringToObject(jc, "declared_by", source_str(cfg->source));
    cJSON *jx = cJSON_AddArrayToObject(jc, "exclude");
    for (size_t i = 0; i < cfg->nexclude; i++) {
        const char *pat, *where;
        int usable;
        nb_status st = nb_ckpt_exclude_at(v->c, i, &pat, &where, &usable);
        if (st != NB_OK) return st;
        cJSON *o = cJSON_CreateObject();
        cJSON_AddStringToObject(o, "pattern", pat);
        cJSON_AddStringToObject(o, "from", where);
        if (!usable) cJSON_AddBoolToObject(o, "unusable", 1);
        cJSON_AddItemToArray(jx, o);
    }
    if (cfg->note) cJSON_AddStringToObject(jc, "note", cfg->note);
    return NB_OK;
}

/* The "files" and (without --summary) "tensors" arrays of --json. */
static nb_status ckpt_json_files(const ckpt_view *v, cJSON *root, int summary) {
    nb_status st = NB_OK;
    cJSON *a = cJSON_AddArrayToObject(root, "files");
    for (size_t i = 0; i < v->nf && st == NB_OK; i++) {
        const char *p;
        uint64_t b;
        if ((st = nb_ckpt_file_at(v->c, i, &p, &b)) != NB_OK) break;
        cJSON *o = cJSON_CreateObject();
        cJSON_AddStringToObject(o, "path", p);
        json_add_i64(o, "bytes", (int64_t)b);
        cJSON_AddItemToArray(a, o);
    }
    if (summary) return st;
    a = cJSON_AddArrayToObject(root, "tensors");
    for (size_t i = 0; i < v->nt && st == NB_OK; i++) {
        nb_st_tensor t;
        if ((st = nb_ckpt_tensor_at(v->c, i, &t, NULL)) != NB_OK) break;
        cJSON *o = cJSON_CreateObject(), *sh = cJSON_CreateArray();
        cJSON_AddStringToObject(o, "name", t.name);
        cJSON_AddStringToObject(o, "dtype", dtype_str(t.dtype));
        for (int d = 0; d < t.rank; d++) cJSON_AddItemToArray(sh, cJSON_CreateNumber((double)t.shape[d]));
        cJSON_AddItemToObject(o, "shape", sh);
        json_add_i64(o, "bytes", (int64_t)t.bytes);
        cJSON_AddItemToArray(a, o);
    }
    return st;
}

/* The "expert_groups" array of --json. */
static nb_status ckpt_json_groups(const ckpt_view *v, cJSON *root) {
    cJSON *a = cJSON_AddArrayToObject(root, "expert_groups");
    for (size_t i = 0; i < v->ngroups; i++) {
        nb_ckpt_moe m;
        nb_status st = nb_ckpt_moe_at(v->c, i, &m);
        if (st != NB_OK) return st;
        cJSON *o = cJSON_CreateObject();
        cJSON_AddStringToObject(o, "prefix", m.prefix);
        cJSON_AddStringToObject(o, "format", ckpt_format_str(m.format));
        json_add_i64(o, "experts", m.experts);
        json_add_i64(o, "hidden", m.hidden);
        json_add_i64(o, "intermediate", m.intermediate);
        if (m.format != NB_CKPT_INCONSISTENT) {
            cJSON_AddStringToObject(o, "activation", act_str(m.activation));
            cJSON_AddStringToObject(o, "gate_up_layout", gate_up_str(m.gate_up_layout));
            if (m.activation == NB_MOE_ACT_SWIGLU_OAI) {
                cJSON_AddNumberToObject(o, "limit", m.limit);
                cJSON_AddNumberToObject(o, "alpha", m.alpha);
            }
        }
        cJSON_AddBoolToObject(o, "per_expert", m.per_expert);
        json_add_i64(o, "top_k", m.top_k);
        cJSON_AddBoolToObject(o, "biases", m.gate_up_bias >= 0 || m.down_bias >= 0);
        if (m.gate_up_scales_differ) cJSON_AddBoolToObject(o, "gate_up_scales_differ", 1);
        json_add_i64(o, "layers", m.layers);
        json_add_i64(o, "bytes", (int64_t)m.bytes);
        if (m.problem[0]) cJSON_AddStringToObject(o, "problem", m.problem);
        cJSON_AddItemToArray(a, o);
    }
    return NB_OK;
}

/* The "layers" array and the "totals" object of --json. */
static nb_status ckpt_json_layers(const ckpt_view *v, cJSON *root) {
    cJSON *a = cJSON_AddArrayToObject(root, "layers");
    for (size_t i = 0; i < v->nl; i++) {
        nb_ckpt_layer L;
        nb_status st = nb_ckpt_layer_at(v->c, i, &L);
        if (st != NB_OK) return st;
        cJSON *o = cJSON_CreateObject();
        cJSON_AddStringToObject(o, "prefix", L.prefix);
        cJSON_AddStringToObject(o, "format", ckpt_format_str(L.format));
        json_add_i64(o, "n", L.n);
        json_add_i64(o, "k", L.k);
        json_add_i64(o, "experts", L.experts);
        cJSON_AddNumberToObject(o, "tensor_scale", L.tensor_scale);
        json_add_i64(o, "bytes", (int64_t)L.bytes);
        cJSON_AddStringToObject(o, "decided_by", source_str(L.decided_by));
        if (L.excluded) {
            cJSON_AddBoolToObject(o, "excluded", 1);
            cJSON_AddStringToObject(o, "excluded_by", L.excluded_by);
        }
        if (L.config_mismatch) cJSON_AddBoolToObject(o, "config_mismatch", 1);
        if (L.problem[0]) cJSON_AddStringToObject(o, "problem", L.problem);
        int64_t g = -1;
        if ((st = nb_ckpt_layer_moe(v->c, i, &g, NULL, NULL)) != NB_OK) return st;
        if (g >= 0) json_add_i64(o, "expert_group", g);
        cJSON_AddItemToArray(a, o);
    }
    nb_status st = ckpt_json_groups(v, root);
    if (st != NB_OK) return st;
    cJSON *tot = cJSON_AddObjectToObject(root, "totals");
    json_add_i64(tot, "tensors", (int64_t)v->nt);
    json_add_i64(tot, "bytes", (int64_t)v->total_bytes);
    cJSON *bd = cJSON_AddObjectToObject(tot, "bytes_by_dtype");
    for (int d = 0; d < NDT; d++)
        if (v->dt_count[d]) json_add_i64(bd, dtype_str((nb_st_dtype)d), (int64_t)v->dt_bytes[d]);
    json_add_i64(tot, "layers", (int64_t)v->nl);
    json_add_i64(tot, "expert_groups", (int64_t)v->ngroups);
    cJSON *lf = cJSON_AddObjectToObject(tot, "layers_by_format");
    for (int f = 0; f < NCF; f++)
        if (v->nfmt[f]) json_add_i64(lf, ckpt_format_str((nb_ckpt_format)f), (int64_t)v->nfmt[f]);
    json_add_i64(tot, "quantized_params", v->q_params);
    json_add_i64(tot, "unquantized_params", v->u_params);
    return NB_OK;
}

/* Stage 2 (--json): everything as one JSON object on stdout. */
static nb_status ckpt_print_json(const ckpt_view *v, int summary) {
    cJSON *root = cJSON_CreateObject();
    cJSON_AddStringToObject(root, "path", v->path);
    nb_status st = ckpt_json_config(v, root);
    if (st == NB_OK) st = ckpt_json_files(v, root, summary);
    if (st == NB_OK) st = ckpt_json_layers(v, root);
    if (st != NB_OK) {
        cJSON_Delete(root);
        return st;
    }
    return print_json(root) ? NB_ERR_OUT_OF_MEMORY : NB_OK;
}

/* Stage 2 (text): the config, the files and (without --summary) every tensor. */
static nb_status ckpt_print_files(const ckpt_view *v, int summary) {
    const nb_ckpt_config *cfg = &v->cfg;
    printf("checkpoint %s\n", v->path);
    printf("config: config.json %s, hf_quant_config.json %s", cfg->has_config_json ? "yes" : "no",
           cfg->has_hf_quant_config ? "yes" : "no");
    if (cfg->quant_method) printf(", quant_method %s", cfg->quant_method);
    if (cfg->quant_algo) printf(", quant_algo %s", cfg->quant_algo);
    if (cfg->ct_format) printf(", format %s", cfg->ct_format);
    printf("; declares %s (%s); %zu exclude entries\n",
           cfg->declared == NB_CKPT_NONE ? "nothing" : ckpt_format_str(cfg->declared), source_str(cfg->source),
           cfg->nexclude);
    if (cfg->note) printf("config WARNING: %s\n", cfg->note);
    printf("\nfiles (%zu):\n", v->nf);
    nb_status st = NB_OK;
    for (size_t i = 0; i < v->nf && st == NB_OK; i++) {
        const char *p;
        uint64_t b;
        if ((st = nb_ckpt_file_at(v->c, i, &p, &b)) == NB_OK) printf("  %12llu  %s\n", (unsigned long long)b, p);
    }
    if (summary || st != NB_OK) return st;
    printf("\ntensors (%zu):\n", v->nt);
    for (size_t i = 0; i < v->nt; i++) {
        nb_st_tensor t;
        if ((st = nb_ckpt_tensor_at(v->c, i, &t, NULL)) != NB_OK) return st;
        char shape[160] = "[";
        size_t at = 1;
        for (int d = 0; d < t.rank && at < sizeof shape; d++)
            at += (size_t)snprintf(shape + at, sizeof shape - at, "%s%lld", d ? ", " : "", (long long)t.shape[d]);
        if (at < sizeof shape - 1) strcat(shape, "]");
        printf("  %-60s %-8s %-24s %12zu\n", t.name, dtype_str(t.dtype), shape, t.bytes);
    }
    return NB_OK;
}

/* Stage 3 (text): every layer, then the totals. */
static nb_status ckpt_print_layers(const ckpt_view *v) {
    size_t w = 6;
    nb_ckpt_layer L;
    nb_status st;
    for (size_t i = 0; i < v->nl; i++) {
        if ((st = nb_ckpt_layer_at(v->c, i, &L)) != NB_OK) return st;
        if (strlen(L.prefix) > w) w = strlen(L.prefix);
    }
    printf("\nlayers (%zu):\n  %-*s  %-14s  %-22s  %-12s  %12s  %s\n", v->nl, (int)w, "prefix", "format", "n x k",
           "tensor_scale", "bytes", "decided by");
    size_t folded = 0;
    for (size_t i = 0; i < v->nl; i++) {
        if ((st = nb_ckpt_layer_at(v->c, i, &L)) != NB_OK) return st;
        if (folded_group(v->c, i) >= 0) { /* shown as its expert group */
            folded++;
            continue;
        }
        char nk[64];
        if (L.experts)
            snprintf(nk, sizeof nk, "%lld x %lld x %lld exp", (long long)L.n, (long long)L.k, (long long)L.experts);
        else
            snprintf(nk, sizeof nk, "%lld x %lld", (long long)L.n, (long long)L.k);
        char ex[160] = "";
        if (L.excluded && !L.config_mismatch) snprintf(ex, sizeof ex, " (excluded: \"%.120s\")", L.excluded_by);
        printf("  %-*s  %-14s  %-22s  %-12.6g  %12llu  %s%s%s%s\n", (int)w, L.prefix, ckpt_format_str(L.format), nk,
               (double)L.tensor_scale, (unsigned long long)L.bytes, source_str(L.decided_by), ex,
               L.problem[0] ? (L.config_mismatch ? "  WARNING: " : "  PROBLEM: ") : "", L.problem);
    }
    if (folded) printf("  (%zu expert layers, shown as their expert groups below)\n", folded);
    if (v->ngroups) printf("\nexpert groups (%zu):\n", v->ngroups);
    for (size_t i = 0; i < v->ngroups; i++) {
        nb_ckpt_moe m;
        if ((st = nb_ckpt_moe_at(v->c, i, &m)) != NB_OK) return st;
        if (m.format == NB_CKPT_INCONSISTENT) {
            printf("  %s  inconsistent  PROBLEM: %s\n", m.prefix, m.problem);
            continue;
        }
        char act[96];
        snprintf(act, sizeof act, "%s", act_str(m.activation));
        if (m.activation == NB_MOE_ACT_SWIGLU_OAI)
            snprintf(act, sizeof act, "swiglu_oai (limit %g, alpha %g)", (double)m.limit, (double)m.alpha);
        printf("  %s  %s  %lld experts, gate_up %lld x %lld, down %lld x %lld, %s, gate/up %s, top_k %d%s%s, %d "
               "layers, %llu bytes\n", m.prefix, ckpt_format_str(m.format), (long long)m.experts,
               (long long)(2 * m.intermediate), (long long)m.hidden, (long long)m.hidden, (long long)m.intermediate,
               act, gate_up_str(m.gate_up_layout), (int)m.top_k,
               m.gate_up_bias >= 0 || m.down_bias >= 0 ? ", biases" : "",
               m.gate_up_scales_differ ? ", gate and up tensor scales differ" : "", (int)m.layers,
               (unsigned long long)m.bytes);
    }
    printf("\ntotals: %zu tensors, %llu bytes (", v->nt, (unsigned long long)v->total_bytes);
    int first = 1;
    for (int d = 0; d < NDT; d++)
        if (v->dt_count[d]) {
            printf("%s%s %llu", first ? "" : ", ", dtype_str((nb_st_dtype)d), (unsigned long long)v->dt_bytes[d]);
            first = 0;
        }
    printf(")\nlayers: %zu (", v->nl);
    first = 1;
    for (int f = 0; f < NCF; f++)
        if (v->nfmt[f]) {
            printf("%s%zu %s", first ? "" : ", ", v->nfmt[f], ckpt_format_str((nb_ckpt_format)f));
            first = 0;
        }
    printf(")\n");
    if (v->ngroups) printf("expert groups: %zu\n", v->ngroups);
    printf("parameters: %lld quantized, %lld unquantized (float tensors outside quantized layers)\n",
           (long long)v->q_params, (long long)v->u_params);
    return NB_OK;
}

static int inspect_ckpt(const char *path, int json, int summary) {
    ckpt_view v;
    memset(&v, 0, sizeof v);
    v.path = path;
    nb_ckpt *c = NULL;
    nb_status st = nb_ckpt_open(path, &c);
    v.c = c;
    if (st == NB_OK) st = ckpt_totals(&v);
    if (st == NB_OK && json) st = ckpt_print_json(&v, summary);
    else if (st == NB_OK) st = ckpt_print_files(&v, summary);
    if (st == NB_OK && !json) st = ckpt_print_layers(&v);
    const nb_status cst = nb_ckpt_close(c);
    if (st == NB_OK) st = cst;
    return st == NB_OK ? 0 : fail("inspect", st);
}

int nb_cli_inspect(int argc, char **argv) {
    const char *path = NULL;
    int json = 0, summary = 0;
    nba_opt o[] = {
        {.name = "--json", .kind = NBA_FLAG, .dst = &json},
        {.name = "--summary", .kind = NBA_FLAG, .dst = &summary},
    };
    nba_pos pos = {.pos = &path, .min = 1, .max = 1, .names = "PATH"};
    const int rc = nba_parse("inspect", argc, argv, o, sizeof o / sizeof o[0], &pos, inspect_help);
    if (rc) return rc < 0 ? 0 : rc;
    return is_gguf(path) ? inspect_gguf(path, json, summary) : inspect_ckpt(path, json, summary);
}

/* =============================================================== quantize */

static void quantize_progress(void *user, size_t i, size_t n, uint64_t done, uint64_t total, const char *name) {
    (void)user;
    if (name)
        fprintf(stderr, "\r\033[K[%zu/%zu] %.1f / %.1f MB  %.60s", i + 1, n, done / 1e6, total / 1e6, name);
    else
        fprintf(stderr, "\r\033[K[%zu/%zu] %.1f / %.1f MB  done\n", i, n, done / 1e6, total / 1e6);
    fflush(stderr);
}

static void quantize_help(void) {
    printf("usage: nibble quantize IN OUT --format nvfp4|mxfp4|int4|int4_sym|int8|nf4|bnb_fp4|int4_hqq\n"
           "                       [--exclude PATTERN]... [--mx-rule ocp|even|round-up]\n"
           "                       [--group-size 32|64|128|256|512|1024|2048|4096|channel]\n"
           "                       [--scale-type f16|bf16] [--no-default-excludes]\n"
           "                       [--method rtn|mse|hqq] [--device auto|cpu|gpu] [--allow-empty]\n"
           "                       [--separate-tensor-scales] [--json]\n"
           "  IN   a BF16/F16/F32 checkpoint: .safetensors file, directory (index or\n"
           "       model.safetensors) or index file.  It is only read.\n"
           "  OUT  a directory that must not exist or be empty.  It receives, per input\n"
           "       file, a file of the same name; the index when IN is sharded;\n"
           "       config.json with a quantization_config (ModelOpt for nvfp4, Quark for\n"
           "       mxfp4, compressed-tensors pack-quantized for int4, int4_sym, int8,\n"
           "       transformers' bitsandbytes config for nf4, bnb_fp4, its HQQ config\n"
           "       for int4_hqq);\n"
           "       hf_quant_config.json (nvfp4); every other file of IN's directory\n"
           "       byte for byte (not other *.safetensors, not subdirectories).\n"
           "  Quantized: every 2-D BF16/F16/F32 tensor P.weight whose K is a multiple of the\n"
           "  group (16 nvfp4, 32 mxfp4, --group-size for int4 / int4_sym / int8: 32, 64\n"
           "  or 128, default 128, channel = one group per row: any even K, any K for\n"
           "  int8; int4_hqq: 32, 64 or 128, default 64; nf4 / bnb_fp4: 32 .. 4096,\n"
           "  default 64) and whose\n"
           "  prefix P matches no exclude pattern (shell wildcards, fnmatch on P, '*'\n"
           "  crosses dots: --exclude '*.mlp.gate').\n"
           "  Excluded by default: '*lm_head' and '*embed*' (--no-default-excludes drops\n"
           "  them).  Every other tensor is copied unchanged with its dtype.\n"
           "  nvfp4: P.weight U8 [N,K/2], P.weight_scale F8_E4M3 [N,K/16], P.weight_scale_2\n"
           "  F32 [] (ModelOpt numerics; no input_scale).  The layers engines fuse\n"
           "  (M.q_proj/k_proj/v_proj, M.gate_proj/up_proj) share one tensor scale, that\n"
           "  of their rows together, as ModelOpt exports them, so they can run as one\n"
           "  layer (--separate-tensor-scales: each its own).  mxfp4: P.weight U8 [N,K/2],\n"
           "  P.weight_scale U8 [N,K/32] (E8M0); --mx-rule picks the block exponent\n"
           "  (default even, as Quark; ocp = floor(log2 amax)-2; round-up = triton).\n"
           "  gpt-oss (config.json model_type gpt_oss) with --format mxfp4: gpt-oss's own\n"
           "  layout, as its published checkpoints hold it: the experts G.gate_up_proj\n"
           "  [E,H,2I] and G.down_proj [E,I,H] become G.<proj>_blocks U8 [E,N,K/32,16]\n"
           "  and G.<proj>_scales U8 [E,N,K/32] (each expert transposed to [N,K], rows\n"
           "  in the input's order), the linear weights stay as they are, and\n"
           "  quantization_config is {quant_method mxfp4, modules_to_not_convert}.\n"
           "  int4 (zero points) / int4_sym / int8: compressed-tensors pack-quantized,\n"
           "  P.weight_packed I32 [N,K/8] (int8: [N,K/4], num_bits 8), P.weight_scale\n"
           "  [N,K/G] (--scale-type: f16, the default, or bf16), P.weight_shape I64 [2],\n"
           "  and for int4 P.weight_zero_point I32 [N/8,K/G]; quantized on the CPU\n"
           "  (C reference).\n"
           "  nf4 / bnb_fp4: bitsandbytes' 4-bit serialization without double\n"
           "  quantization, as transformers saves a Linear4bit: P.weight U8 [N*K/2,1]\n"
           "  (the first code of each byte in the high nibble), P.weight.absmax F32\n"
           "  [N*K/B], P.weight.quant_map F32 [16], P.weight.quant_state.\n"
           "  bitsandbytes__nf4 (__fp4) U8 (its JSON: quant_type, blocksize, dtype,\n"
           "  shape); compute dtype in config.json from its torch_dtype (default\n"
           "  bfloat16); quantized on the CPU (C reference).\n"
           "  int4_hqq: hqq's HQQLinear state_dict as transformers saves an HQQ model\n"
           "  (4 bits, axis 1): P.W_q U8 [R/2,G] for R = N*K/G groups (group r's codes\n"
           "  in the high nibbles of row r, group R/2+r's in the low ones; R even),\n"
           "  P.scale and P.zero [R,1] (--scale-type f16, the default, or bf16), and\n"
           "  hqq's meta values (P.nbits, P.group_size, P.shape, P.axis, P.packing,\n"
           "  ...); --method hqq: hqq's optimizer for 4 bits (integer zero points\n"
           "  moved by its half-quadratic solver) instead of rounding to nearest; on\n"
           "  the CPU (C reference).\n"
           "  --method: rtn (default: the format's rule) or mse (per block, the scale among\n"
           "  the rule's and its neighbours with the least squared error; never worse\n"
           "  than rtn per block; slower, CPU only: --device auto then uses the CPU;\n"
           "  nvfp4 and mxfp4 only).\n"
           "  --device: where the weights are quantized: gpu (CUDA device 0: each tensor\n"
           "  is copied to the GPU, quantized by nb_quantize and copied back), cpu (the C\n"
           "  reference), or auto (default: the GPU when there is one).  The bytes are\n"
           "  the same either way; the summary says which ran.\n"
           "  Tensors are streamed one at a time.  Progress on stderr when it is a\n"
           "  terminal; --json prints a summary on stdout.\n"
           "  Nothing to quantize (no weight qualifies: e.g. F64 or I32 weights, or all\n"
           "  excluded) is refused with the reason, unless --allow-empty (then a copy is\n"
           "  written, with a warning).  Weights of other dtypes are named in a warning.\n"
           "  OUT is written into a staging directory next to it (.OUT.nibble-staging-*)\n"
           "  and published with one rename: stopped at any point (Ctrl-C, kill -9), OUT\n"
           "  is as it was or complete, and a rerun into OUT removes what was left.\n"
           "  Exit: 0 written, 1 usage, 3 I/O error, corrupt input, OUT not empty, nothing\n"
           "  to quantize or --device gpu without a GPU.\n");
}

/* "nvfp4|mxfp4": the names of the formats nb_ckpt_quantize writes, for --format. */
static void format_choices(char *buf, size_t n) {
    nb_format all[16];
    size_t count = 0, at = 0;
    buf[0] = 0;
    if (nb_ckpt_quantize_formats(all, 16, &count) != NB_OK) return;
    for (size_t i = 0; i < count && i < 16 && at < n; i++) {
        nb_format_info fi;
        if (nb_format_get_info(all[i], &fi) == NB_OK)
            at += (size_t)snprintf(buf + at, n - at, "%s%s", at ? "|" : "", fi.name);
    }
}

/* The integer formats: the ones --group-size and --scale-type apply to;
 * the table formats (nf4, bnb_fp4) take --group-size (their blocks). */
static int is_integer(nb_format f) {
    return f == NB_FORMAT_INT4 || f == NB_FORMAT_INT4_SYM || f == NB_FORMAT_INT8 || f == NB_FORMAT_INT4_HQQ;
}
static int is_table(nb_format f) { return f == NB_FORMAT_NF4 || f == NB_FORMAT_BNB_FP4; }

typedef struct quantize_args {
    const char *in, *out, *fmt, *rule, *device, *method, *group, *scale;
    int json, allow_empty, separate_scales;
} quantize_args;

/* Stage 1: the options into a and o (exclude patterns point into argv):
 * 0 to go on, -1 after --help, 1 on a usage error. */
static int quantize_parse(int argc, char **argv, quantize_args *a, nb_ckpt_quantize_opts *o, const char **excl) {
    char formats[160];
    format_choices(formats, sizeof formats);
    const char *io[2] = {NULL, NULL};
    size_t nexcl = 0;
    nba_opt opt[] = {
        {.name = "--format", .kind = NBA_CHOICE, .dst = &a->fmt, .choices = formats},
        {.name = "--exclude", .kind = NBA_LIST, .dst = excl, .count = &nexcl},
        {.name = "--mx-rule", .kind = NBA_CHOICE, .dst = &a->rule, .choices = "ocp|even|round-up"},
        {.name = "--group-size", .kind = NBA_CHOICE, .dst = &a->group,
         .choices = "32|64|128|256|512|1024|2048|4096|channel"},
        {.name = "--scale-type", .kind = NBA_CHOICE, .dst = &a->scale, .choices = "f16|bf16"},
        {.name = "--no-default-excludes", .kind = NBA_FLAG, .dst = &o->no_default_excludes},
        {.name = "--device", .kind = NBA_CHOICE, .dst = &a->device, .choices = "auto|cpu|gpu"},
        {.name = "--method", .kind = NBA_CHOICE, .dst = &a->method, .choices = "rtn|mse|hqq"},
        {.name = "--allow-empty", .kind = NBA_FLAG, .dst = &a->allow_empty},
        {.name = "--separate-tensor-scales", .kind = NBA_FLAG, .dst = &a->separate_scales},
        {.name = "--json", .kind = NBA_FLAG, .dst = &a->json},
    };
    nba_pos pos = {.pos = io, .min = 2, .max = 2, .names = "IN and OUT"};
    const int rc = nba_parse("quantize", argc, argv, opt, sizeof opt / sizeof opt[0], &pos, quantize_help);
    if (rc) return rc;
    a->in = io[0];
    a->out = io[1];
    o->exclude = excl;
    o->nexclude = nexcl;
    o->allow_empty = a->allow_empty;
    o->fused_scales = !a->separate_scales;
    nb_format_info fi;
    char list[160];
    if (!a->fmt) return nba_usage("quantize", "--format is required (%s)", nba_choices(formats, list, sizeof list));
    if (nb_format_from_name(a->fmt, &o->format) != NB_OK || nb_format_get_info(o->format, &fi) != NB_OK)
        return nba_usage("quantize", "--format: '%s': %s", a->fmt, nb_last_error());
    if (a->rule && fi.scale_type != NB_SCALE_E8M0)
        return nba_usage("quantize", "--mx-rule applies to formats with E8M0 scales (mxfp4), not to --format %s",
                         a->fmt);
    if (a->separate_scales && !fi.tensor_scale)
        return nba_usage("quantize", "--separate-tensor-scales applies to formats with a tensor scale (nvfp4), not "
                         "to --format %s", a->fmt);
    const int integer = is_integer(o->format), table = is_table(o->format);
    if (a->group && !integer && !table)
        return nba_usage("quantize", "--group-size applies to the integer formats (int4, int4_sym, int8, int4_hqq) "
                         "and nf4 / bnb_fp4, not to --format %s", a->fmt);
    if (a->scale && !integer)
        return nba_usage("quantize", "--scale-type applies to the integer formats (int4, int4_sym, int8, int4_hqq), "
                         "not to --format %s", a->fmt);
    if (a->group && o->format == NB_FORMAT_INT4_HQQ && !strcmp(a->group, "channel"))
        return nba_usage("quantize", "--group-size channel: --format int4_hqq takes 32, 64 or 128");
    if (a->group && integer && atoi(a->group) > 128)
        return nba_usage("quantize", "--group-size %s: --format %s takes 32, 64, 128 or channel", a->group, a->fmt);
    if (a->group && table && !strcmp(a->group, "channel"))
        return nba_usage("quantize", "--group-size channel: --format %s takes blocks of 32 .. 4096", a->fmt);
    if (a->group) o->group_size = !strcmp(a->group, "channel") ? NB_CKPT_GROUP_PER_CHANNEL : atoi(a->group);
    if (a->scale) o->scale_type = !strcmp(a->scale, "bf16") ? NB_SCALE_BF16 : NB_SCALE_F16;
    if (a->rule)
        o->mx_rule = !strcmp(a->rule, "ocp") ? NB_MX_SCALE_OCP : !strcmp(a->rule, "even") ? NB_MX_SCALE_EVEN
                                                                                           : NB_MX_SCALE_ROUND_UP;
    if (a->device && nb_ckpt_device_parse(a->device, &o->device) != NB_OK)
        return nba_usage("quantize", "--device: %s", nb_last_error());
    o->method = !a->method || !strcmp(a->method, "rtn") ? NB_QUANT_RTN
                : !strcmp(a->method, "mse")             ? NB_QUANT_MSE
                                                        : NB_QUANT_HQQ;
    if (o->method == NB_QUANT_HQQ && o->format != NB_FORMAT_INT4_HQQ)
        return nba_usage("quantize", "--method hqq (hqq's optimizer) serves --format int4_hqq, not %s", a->fmt);
    if (o->method == NB_QUANT_MSE && o->device == NB_CKPT_DEVICE_GPU)
        return nba_usage("quantize", "--method mse runs on the CPU only (--device cpu or auto)");
    if ((integer || table) && o->method == NB_QUANT_MSE)
        return nba_usage("quantize", "--method mse serves nvfp4 and mxfp4; --format %s rounds to nearest", a->fmt);
    if ((integer || table) && o->device == NB_CKPT_DEVICE_GPU)
        return nba_usage("quantize", "--format %s is quantized on the CPU (--device cpu or auto)", a->fmt);
    return 0;
}

/* Rank-2 *.weight tensors of IN that were copied because of their dtype
 * (summary.weights_unsupported): named on stderr, at most five. */
static void warn_unsupported(const char *in, int count) {
    nb_ckpt *c = NULL;
    size_t nt = 0, named = 0;
    char list[512] = "";
    if (nb_ckpt_open(in, &c) == NB_OK && nb_ckpt_tensor_count(c, &nt) == NB_OK)
        for (size_t i = 0; i < nt && named < 5; i++) {
            nb_st_tensor t;
            const size_t len = nb_ckpt_tensor_at(c, i, &t, NULL) == NB_OK ? strlen(t.name) : 0;
            if (t.rank != 2 || len <= 7 || strcmp(t.name + len - 7, ".weight") || t.dtype == NB_ST_BF16 ||
                t.dtype == NB_ST_F16 || t.dtype == NB_ST_F32)
                continue;
            const size_t at = strlen(list);
            snprintf(list + at, sizeof list - at, "%s%.100s %s", named++ ? ", " : "", t.name, dtype_str(t.dtype));
        }
    nb_ckpt_close(c);
    fprintf(stderr, "warning: %d weight%s copied unquantized: only BF16, F16 and F32 weights are quantized (%s%s)\n",
            count, count == 1 ? " was" : "s were", list, count > 5 ? ", ..." : "");
}

/* Stage 3: the summary, as JSON or one line. */
static int quantize_report(const quantize_args *a, const nb_ckpt_quantize_opts *o, const nb_ckpt_quantize_summary *s,
                           double secs) {
    if (!a->json) {
        char experts[96] = "";
        if (s->experts_quantized)
            snprintf(experts, sizeof experts, ", %d of them gpt-oss experts tensors (gpt-oss's MXFP4 layout)",
                     (int)s->experts_quantized);
        printf("%s -> %s: %zu layers quantized (%s%s), %zu tensors copied, %zu float weights left unquantized, "
               "%zu files copied; %.1f MB -> %.1f MB in %.1f s on %s%s%s\n",
               a->in, a->out, s->layers_quantized, a->fmt, experts, s->tensors_copied, s->weights_excluded,
               s->files_copied,
               s->bytes_in / 1e6, s->bytes_out / 1e6, secs,
               s->device == NB_CKPT_DEVICE_GPU ? "the GPU (" : "the CPU (C reference)",
               s->device == NB_CKPT_DEVICE_GPU ? s->device_name : "", s->device == NB_CKPT_DEVICE_GPU ? ")" : "");
        return 0;
    }
    nb_format_info fi;
    const char *device = "?";
    nb_status st = nb_format_get_info(o->format, &fi);
    if (st == NB_OK) st = nb_ckpt_device_name(s->device, &device);
    if (st != NB_OK) return fail("quantize", st);
    cJSON *j = cJSON_CreateObject();
    cJSON_AddStringToObject(j, "input", a->in);
    cJSON_AddStringToObject(j, "output", a->out);
    cJSON_AddStringToObject(j, "format", a->fmt);
    if (fi.scale_type == NB_SCALE_E8M0)
        cJSON_AddStringToObject(j, "mx_rule", o->mx_rule == NB_MX_SCALE_OCP ? "ocp"
                                              : o->mx_rule == NB_MX_SCALE_EVEN ? "even" : "round-up");
    if (is_integer(o->format)) {
        if (o->group_size == NB_CKPT_GROUP_PER_CHANNEL) cJSON_AddStringToObject(j, "group_size", "channel");
        else json_add_i64(j, "group_size", o->group_size ? o->group_size : fi.group_size);
        cJSON_AddStringToObject(j, "scale_type", o->scale_type == NB_SCALE_BF16 ? "bf16" : "f16");
    }
    cJSON_AddStringToObject(j, "method", o->method == NB_QUANT_MSE ? "mse" : "rtn");
    json_add_i64(j, "tensors_in", (int64_t)s->tensors_in);
    json_add_i64(j, "layers_quantized", (int64_t)s->layers_quantized);
    json_add_i64(j, "tensors_copied", (int64_t)s->tensors_copied);
    json_add_i64(j, "weights_excluded", (int64_t)s->weights_excluded);
    json_add_i64(j, "weights_unsupported", (int64_t)s->weights_unsupported);
    json_add_i64(j, "experts_quantized", (int64_t)s->experts_quantized);
    json_add_i64(j, "shards", (int64_t)s->shards);
    json_add_i64(j, "files_copied", (int64_t)s->files_copied);
    json_add_i64(j, "bytes_in", (int64_t)s->bytes_in);
    json_add_i64(j, "bytes_out", (int64_t)s->bytes_out);
    cJSON_AddStringToObject(j, "device", device);
    cJSON_AddStringToObject(j, "device_name", s->device_name);
    cJSON_AddNumberToObject(j, "seconds", secs);
    return print_json(j);
}

int nb_cli_quantize(int argc, char **argv) {
    quantize_args a = {0};
    nb_ckpt_quantize_opts o;
    nb_status st = nb_ckpt_quantize_opts_init(&o);
    if (st != NB_OK) return fail("quantize", st);
    const char **excl = (const char **)calloc((size_t)argc + 1, sizeof *excl);
    if (!excl) {
        fprintf(stderr, "nibble quantize: out of host memory\n");
        return 3;
    }
    int rc = quantize_parse(argc, argv, &a, &o, excl);
    if (rc) {
        free(excl);
        return rc < 0 ? 0 : rc;
    }
    if (isatty(2)) o.progress = quantize_progress;
    nb_ckpt_quantize_summary s;
    const double t0 = nb_cli_now();
    st = nb_ckpt_quantize(a.in, a.out, &o, &s);
    free(excl);
    if (st != NB_OK) {
        if (o.progress) fprintf(stderr, "\n");
        return fail("quantize", st);
    }
    const double secs = nb_cli_now() - t0;
    if (s.weights_unsupported) warn_unsupported(a.in, s.weights_unsupported);
    if (!s.layers_quantized) fprintf(stderr, "warning: nothing was quantized (--allow-empty): OUT is a copy\n");
    return quantize_report(&a, &o, &s, secs);
}

/* ================================================================ convert */

static void convert_warn(void *user, const char *msg) {
    cJSON *arr = (cJSON *)user;
    if (arr) cJSON_AddItemToArray(arr, cJSON_CreateString(msg));
    fprintf(stderr, "%s%s\n", isatty(2) ? "\r\033[K" : "", msg);
}

/* A GGUF tensor left out by --skip-unsupported: listed on stderr and in --json. */
static void convert_skipped(void *user, const char *name, const char *type) {
    cJSON *arr = (cJSON *)user;
    if (arr) {
        cJSON *o = cJSON_CreateObject();
        cJSON_AddStringToObject(o, "name", name);
        cJSON_AddStringToObject(o, "type", type);
        cJSON_AddItemToArray(arr, o);
    }
    fprintf(stderr, "%sskipped: %s (%s)\n", isatty(2) ? "\r\033[K" : "", name, type);
}

static void convert_help(void) {
    printf("usage: nibble convert IN OUT --to modelopt|compressed-tensors|quark [--strict]\n"
           "                      [--skip-unsupported] [--json]\n"
           "  IN   a 4-bit checkpoint (.safetensors file, directory or index file) in\n"
           "       ModelOpt NVFP4, compressed-tensors nvfp4/mxfp4, Quark MXFP4 or gpt-oss\n"
           "       MXFP4 layout, or a GGUF file with MXFP4 / NVFP4 tensors.  It is only read.\n"
           "  OUT  a directory that must not exist or be empty: one file per input file,\n"
           "       the index when IN is sharded, config.json / hf_quant_config.json with the\n"
           "       target's quantization config, every other file of IN's directory.\n"
           "  Codes and block scales are copied byte for byte; tensors are renamed:\n"
           "    modelopt            P.weight, P.weight_scale, P.weight_scale_2 [], P.input_scale []\n"
           "    compressed-tensors  P.weight_packed, P.weight_scale, P.weight_global_scale [1]\n"
           "                        (= 1/weight_scale_2), P.input_global_scale [1]\n"
           "    quark               P.weight, P.weight_scale (MXFP4)\n"
           "  NVFP4 converts between modelopt and compressed-tensors, MXFP4 between quark\n"
           "  and compressed-tensors; gpt-oss MXFP4 experts become one layer per expert\n"
           "  (P = ...experts.gate_up_proj -> ...experts.E.gate_up_proj.weight).  Anything\n"
           "  else is refused with the reason.\n"
           "  GGUF: OUT/model.safetensors with GGUF's tensor names (shapes row-major); a\n"
           "  4-bit tensor T becomes layer P = T without \".weight\" (P.E per expert of a\n"
           "  3-D tensor), NVFP4's P.scale / P.input_scale become its tensor / input\n"
           "  scale; F32/F16/BF16/F64/integer tensors are copied; any other GGUF type\n"
           "  (Q4_0, Q8_0, K-quants...) is refused with its name, or left out and listed\n"
           "  with --skip-unsupported.  The GGUF metadata is not converted.\n"
           "  A weight_scale_2 whose float reciprocal does not round-trip cannot be held\n"
           "  exactly by compressed-tensors: a warning names it (--strict: exit 2).\n"
           "  Progress on stderr when it is a terminal; warnings always on stderr;\n"
           "  --json prints a summary (with the warnings) on stdout.\n"
           "  OUT is written into a staging directory next to it (.OUT.nibble-staging-*)\n"
           "  and published with one rename: stopped at any point (Ctrl-C, kill -9), OUT\n"
           "  is as it was or complete, and a rerun into OUT removes what was left.\n"
           "  Exit: 0 written, 1 usage, 2 refused by --strict, 3 unsupported, I/O error,\n"
           "  corrupt input or OUT not empty.\n");
}

/* Stage 1: the options: 0 to go on, -1 after --help, 1 on a usage error. */
static int convert_parse(int argc, char **argv, const char **in, const char **out, int *json, nb_ckpt_convert_opts *o) {
    const char *to = NULL, *io[2] = {NULL, NULL};
    nba_opt opt[] = {
        {.name = "--to", .kind = NBA_CHOICE, .dst = &to, .choices = "modelopt|compressed-tensors|ct|quark"},
        {.name = "--strict", .kind = NBA_FLAG, .dst = &o->strict},
        {.name = "--skip-unsupported", .kind = NBA_FLAG, .dst = &o->skip_unsupported},
        {.name = "--json", .kind = NBA_FLAG, .dst = json},
    };
    nba_pos pos = {.pos = io, .min = 2, .max = 2, .names = "IN and OUT"};
    const int rc = nba_parse("convert", argc, argv, opt, sizeof opt / sizeof opt[0], &pos, convert_help);
    if (rc) return rc;
    *in = io[0];
    *out = io[1];
    if (!to) return nba_usage("convert", "--to is required (modelopt, compressed-tensors or quark)");
    if (nb_ckpt_target_parse(to, &o->target) != NB_OK) return nba_usage("convert", "--to: %s", nb_last_error());
    return 0;
}

/* Stage 3 (--json): the summary with the warnings and skipped tensors
 * (both arrays are taken over). */
static int convert_json(const char *in, const char *out, const char *to, const nb_ckpt_convert_summary *s,
                        cJSON *warnings, cJSON *skipped, double secs) {
    cJSON *j = cJSON_CreateObject();
    cJSON_AddStringToObject(j, "input", in);
    cJSON_AddStringToObject(j, "output", out);
    cJSON_AddStringToObject(j, "to", to);
    cJSON_AddStringToObject(j, "source", s->gguf ? "gguf" : "safetensors");
    json_add_i64(j, "tensors_in", (int64_t)s->tensors_in);
    json_add_i64(j, "tensors_out", (int64_t)s->tensors_out);
    json_add_i64(j, "layers_converted", (int64_t)s->layers_converted);
    json_add_i64(j, "layers_unchanged", (int64_t)s->layers_unchanged);
    json_add_i64(j, "experts_split", (int64_t)s->experts_split);
    json_add_i64(j, "layers_unquantized", (int64_t)s->layers_unquantized);
    json_add_i64(j, "tensors_copied", (int64_t)s->tensors_copied);
    cJSON *sc = cJSON_AddObjectToObject(j, "reciprocal_scales");
    json_add_i64(sc, "exact", (int64_t)s->scales_exact);
    json_add_i64(sc, "adjusted", (int64_t)s->scales_adjusted);
    json_add_i64(sc, "inexact", (int64_t)s->scales_inexact);
    json_add_i64(j, "shards", (int64_t)s->shards);
    json_add_i64(j, "files_copied", (int64_t)s->files_copied);
    json_add_i64(j, "bytes_in", (int64_t)s->bytes_in);
    json_add_i64(j, "bytes_out", (int64_t)s->bytes_out);
    if (s->gguf) {
        json_add_i64(j, "scale_bytes_remapped", (int64_t)s->scale_bytes_remapped);
        json_add_i64(j, "tensors_skipped", (int64_t)s->tensors_skipped);
        cJSON_AddItemToObject(j, "skipped", skipped);
    } else {
        cJSON_Delete(skipped);
    }
    cJSON_AddItemToObject(j, "warnings", warnings);
    cJSON_AddNumberToObject(j, "seconds", secs);
    return print_json(j);
}

int nb_cli_convert(int argc, char **argv) {
    const char *in = NULL, *out = NULL, *to = "?";
    int json = 0;
    nb_ckpt_convert_opts o;
    nb_status st = nb_ckpt_convert_opts_init(&o);
    if (st != NB_OK) return fail("convert", st);
    int rc = convert_parse(argc, argv, &in, &out, &json, &o);
    if (rc) return rc < 0 ? 0 : rc;
    if ((st = nb_ckpt_target_name(o.target, &to)) != NB_OK) return fail("convert", st);
    cJSON *warnings = json ? cJSON_CreateArray() : NULL, *skipped = json ? cJSON_CreateArray() : NULL;
    o.warn = convert_warn;
    o.warn_user = warnings;
    o.skipped = convert_skipped;
    o.skipped_user = skipped;
    if (isatty(2)) o.progress = quantize_progress;
    nb_ckpt_convert_summary s;
    const double t0 = nb_cli_now();
    st = nb_ckpt_convert(in, out, &o, &s);
    if (st != NB_OK) {
        if (o.progress) fprintf(stderr, "\n");
        const int strict = o.strict && st == NB_ERR_UNSUPPORTED && strstr(nb_last_error(), "(strict)");
        fail("convert", st);
        cJSON_Delete(warnings);
        cJSON_Delete(skipped);
        return strict ? 2 : 3;
    }
    const double secs = nb_cli_now() - t0;
    if (json) return convert_json(in, out, to, &s, warnings, skipped, secs);
    printf("%s -> %s (%s): %zu layers converted, %zu already in the layout, %zu experts split, %zu unquantized "
           "layers; reciprocal scales %zu exact, %zu adjusted, %zu inexact; %zu tensors -> %zu, %zu files copied; "
           "%.1f MB -> %.1f MB in %.1f s\n",
           in, out, to, s.layers_converted, s.layers_unchanged, s.experts_split, s.layers_unquantized, s.scales_exact,
           s.scales_adjusted, s.scales_inexact, s.tensors_in, s.tensors_out, s.files_copied, s.bytes_in / 1e6,
           s.bytes_out / 1e6, secs);
    if (s.gguf)
        printf("  from GGUF: %zu tensors left out (--skip-unsupported), %zu NVFP4 scale bytes remapped\n",
               s.tensors_skipped, s.scale_bytes_remapped);
    return 0;
}
