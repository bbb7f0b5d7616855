/* ckpt_quantize.c - BF16/F16/F32 checkpoint -> ModelOpt NVFP4, Quark MXFP4,
 * compressed-tensors pack-quantized int4 / int4_sym / int8, bitsandbytes
 * nf4 / bnb_fp4 or HQQ int4_hqq checkpoint (rules and output in
 * nibble_io.h, "quantize").
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

/* What an output tensor is.  Each quantized input tensor has at most
 * NSLOT output tensors; slot() says where each is kept in write_shard's
 * by_src table (the tensor scale of the FP4 layouts and compressed-tensors'
 * weight_shape share a slot: no layout has both). */
enum {
    ROLE_COPY = 0,
    ROLE_CODES = 1,
    ROLE_SCALES = 2,
    ROLE_TSCALE = 3,
    ROLE_SHAPE = 4,
    ROLE_ZEROS = 5,
    ROLE_XBLOCKS = 6, /* gpt-oss experts: G.<proj>_blocks */
    ROLE_XSCALES = 7, /* G.<proj>_scales */
    ROLE_QMAP = 8,    /* bitsandbytes: P.weight.quant_map */
    ROLE_QSTATE = 9,  /* P.weight.quant_state.bitsandbytes__<type> */
    ROLE_HQQ = 10     /* HQQ: ROLE_HQQ + i for member i >= 1 of k_hqq_members (member 0, W_q, is ROLE_CODES) */
};
#define N_HQQ 19 /* the members of an HQQLinear state_dict (k_hqq_members) */
enum { NSLOT = N_HQQ };
static size_t slot(int role) {
    return role >= ROLE_HQQ                                             ? (size_t)(role - ROLE_HQQ)
           : role == ROLE_ZEROS || role == ROLE_QSTATE                    ? 3
           : role == ROLE_SHAPE || role == ROLE_TSCALE || role == ROLE_QMAP ? 2
           : role == ROLE_SCALES || role == ROLE_XSCALES                  ? 1
                                                                          : 0;
}

/* The checkpoint layout each format is written in.  This is knowledge of the
 * layouts (ModelOpt stores NVFP4, Quark MXFP4, compressed-tensors the
 * integer formats); what a layout holds - group, scale dtype, whether there
 * is a weight_scale_2 or a zero point - follows from the format's row in
 * nibble.h.  A format without a row here is NB_ERR_UNSUPPORTED. */
typedef enum { OUT_MODELOPT = 1, OUT_QUARK = 2, OUT_CT_INT = 3, OUT_BNB = 4, OUT_HQQ = 5 } out_layout;
static const struct {
    nb_format format;
    out_layout layout;
} k_out_layouts[] = {{NB_FORMAT_NVFP4, OUT_MODELOPT},   {NB_FORMAT_MXFP4, OUT_QUARK}, {NB_FORMAT_INT4, OUT_CT_INT},
                     {NB_FORMAT_INT4_SYM, OUT_CT_INT}, {NB_FORMAT_INT8, OUT_CT_INT}, {NB_FORMAT_NF4, OUT_BNB},
                     {NB_FORMAT_BNB_FP4, OUT_BNB},     {NB_FORMAT_INT4_HQQ, OUT_HQQ}};

/* The tensors a layout writes for prefix P besides what replaces P.weight:
 * an input that already has one of them keeps P.weight unquantized. */
static const char *const k_modelopt_names[] = {".weight_scale", ".weight_scale_2", NULL};
static const char *const k_quark_names[] = {".weight_scale", NULL};
static const char *const k_ct_int_names[] = {".weight_packed", ".weight_scale", ".weight_shape", ".weight_zero_point",
                                             ".weight_g_idx", NULL};
static const char *const k_bnb_names[] = {".weight.absmax", ".weight.quant_map", ".weight.nested_absmax",
                                          ".weight.nested_quant_map", ".weight.quant_state.bitsandbytes__nf4",
                                          ".weight.quant_state.bitsandbytes__fp4", NULL};

/* HQQ: the members of hqq 0.2.8's HQQLinear.state_dict() for 4 bits along
 * axis 1, as its encode_safetensor_type writes them for safetensors (what
 * transformers saves for an HQQ model and nibble's reader takes): W_q U8
 * [R/2, G] for R = N K / G groups, the meta values as 0-d tensors or UTF-8
 * bytes.  dt 0: the scales' dtype; rank 0: a 0-d tensor of value v;
 * text: U8 bytes of it (compute_dtype's text follows the scales' dtype). */
static const struct {
    const char *suffix;
    nb_st_dtype dt;
    int rank;
    int64_t v;
    const char *text;
} k_hqq_members[N_HQQ] = {
    {".W_q", NB_ST_U8, 2, 0, NULL},        {".nbits", NB_ST_I32, 0, 4, NULL},
    {".group_size", NB_ST_I32, 0, 0, NULL}, {".shape", NB_ST_I64, 1, 0, NULL},
    {".scale", 0, 2, 0, NULL},             {".zero", 0, 2, 0, NULL},
    {".axis", NB_ST_I32, 0, 1, NULL},      {".packing", NB_ST_U8, 1, 0, "4bit_u8"},
    {".unpack_view_dtype", NB_ST_U8, 1, 0, "torch.uint8"},
    {".view_as_float", NB_ST_U8, 0, 0, NULL}, {".quant_scale", NB_ST_U8, 0, 0, NULL},
    {".quant_zero", NB_ST_U8, 0, 0, NULL}, {".compute_dtype", NB_ST_U8, 1, 0, "torch.float16"},
    {".offload_meta", NB_ST_U8, 0, 0, NULL}, {".encoded_state_dict", NB_ST_U8, 0, 1, NULL},
    {".stores_quant_config", NB_ST_U8, 0, 1, NULL}, {".channel_wise", NB_ST_U8, 0, 1, NULL},
    {".optimize", NB_ST_U8, 0, 0, NULL},   {".round_zero", NB_ST_U8, 0, 0, NULL}};


/* A group of projections that read the same input and that engines run as
 * one layer (nibble_io.h, "quantize", shared tensor scales): the module
 * holding them (the members' prefix without its last component), which
 * group, and the largest magnitude over its quantized members. */
typedef struct fused_amax {
    char *parent;
    int group;
    float amax;
} fused_amax;

static const char *const k_fused_groups[][4] = {{"q_proj", "k_proj", "v_proj", NULL}, {"gate_proj", "up_proj", NULL}};

typedef struct qstate {
    const nb_ckpt_quantize_opts *o;
    nb_format_info fi; /* the row of o->format */
    out_layout layout;
    int32_t group;     /* the group: fi.group_size, opts.group_size, or NB_CKPT_GROUP_PER_CHANNEL */
    nb_scale_type scale_type; /* the scales' type: the row's default or opts.scale_type */
    nb_context *ctx;   /* host-only, or CUDA device 0 when gpu */
    int gpu;
    int gptoss;        /* MXFP4 of a gpt-oss checkpoint: its own layout (experts quantized, linears kept) */
    struct fused_amax *fused; /* NVFP4: the fused groups' largest magnitudes (shared tensor scales) */
    size_t nfused;
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
    o->fused_scales = 1;
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

/* What becomes of a tensor: quantized (a weight, or gpt-oss experts), or
 * copied because it is no weight, a weight of another dtype, or a float
 * weight left unquantized (its K, an exclude pattern, scales already there,
 * or a linear weight of gpt-oss's layout: listed in the config's excluded
 * modules). */
typedef enum { T_QUANTIZE, T_OTHER, T_DTYPE, T_SHAPE, T_PATTERN, T_SCALES, T_EXPERTS, T_KEEP, T_OOM } fate;

/* gpt-oss experts (nibble_io.h, "quantize", gpt-oss): "G.gate_up_proj" or
 * "G.down_proj" of rank 3 and a float dtype, G's last component "experts".
 * Returns the length of G, 0 for any other tensor. */
static size_t gptoss_experts(const nb_st_tensor *t) {
    static const char *const sfx[] = {".gate_up_proj", ".down_proj"};
    if (t->rank != 3 || !is_float(t->dtype)) return 0;
    for (int i = 0; i < 2; i++)
        if (nbio_ends_with(t->name, sfx[i])) {
            const size_t g = strlen(t->name) - strlen(sfx[i]);
            if (g >= 7 && !strncmp(t->name + g - 7, "experts", 7) && (g == 7 || t->name[g - 8] == '.')) return g;
        }
    return 0;
}

/* The part of a weight's name that names its module (what exclude patterns
 * match and the configs list): G for gpt-oss experts, P for "P.weight". */
static size_t module_len(const qstate *q, const nb_st_tensor *t) {
    const size_t g = q->gptoss ? gptoss_experts(t) : 0;
    return g ? g : strlen(t->name) - 7;
}

/* The descriptor of an n x k weight as it is quantized (format, group,
 * scale type, rule, method); NB_OK or why the format does not take it. */
static nb_status weight_desc(const qstate *q, int64_t n, int64_t k, nb_weight_desc *d) {
    /* (init fills every field, then validates against the row's default group,
     * which may not divide k: the chosen group is validated below) */
    (void)nb_weight_desc_init(d, q->o->format, n, k);
    if (d->format != q->o->format) /* (check_opts found the format in the table) */
        return nbi_fail(NULL, NB_ERR_INTERNAL, "nb_ckpt_quantize: format %d has no row", (int)q->o->format);
    d->group_size = q->group == NB_CKPT_GROUP_PER_CHANNEL ? (k <= INT32_MAX ? (int32_t)k : 0) : q->group;
    d->scale_type = q->scale_type;
    if (d->scale_type == NB_SCALE_E8M0) d->scale_rule = q->o->mx_rule;
    d->method = q->o->method;
    return nb_weight_desc_validate(d);
}

/* A gpt-oss experts tensor [E, K, N] (K = H for gate_up, I for down; N its
 * output rows): quantized along K per expert unless a dimension is empty, K
 * is no multiple of the group, gate_up's N is odd (gate and up rows come in
 * pairs), an exclude pattern matches G or the blocks or scales exist. */
static fate decide_experts(const qstate *q, const nb_st_tensor *t, size_t glen) {
    const int64_t E = t->shape[0], K = t->shape[1], N = t->shape[2];
    if (E <= 0 || K <= 0 || N <= 0 || K % q->group || (nbio_ends_with(t->name, ".gate_up_proj") && N % 2))
        return T_SHAPE;
    const size_t len = strlen(t->name);
    char *name = (char *)malloc(len + 16);
    if (!name) return T_OOM;
    memcpy(name, t->name, glen);
    name[glen] = 0;
    fate f = T_EXPERTS;
    for (size_t i = 0; i < q->npat && f == T_EXPERTS; i++)
        if (fnmatch(q->pat[i], name, 0) == 0) f = T_PATTERN;
    memcpy(name, t->name, len);
    strcpy(name + len, "_blocks");
    if (f == T_EXPERTS && tensor_exists(q, name)) f = T_SCALES;
    strcpy(name + len, "_scales");
    if (f == T_EXPERTS && tensor_exists(q, name)) f = T_SCALES;
    free(name);
    return f;
}

static fate decide(const qstate *q, const nb_st_tensor *t) {
    size_t len = strlen(t->name);
    if (q->gptoss) {
        const size_t g = gptoss_experts(t);
        if (g) return decide_experts(q, t, g);
    }
    if (len <= 7 || !nbio_ends_with(t->name, ".weight") || t->rank != 2) return T_OTHER;
    if (!is_float(t->dtype)) return T_DTYPE;
    if (t->shape[0] <= 0 || t->shape[1] <= 0) return T_SHAPE;
    if (q->group == NB_CKPT_GROUP_PER_CHANNEL) {
        /* (a probe: K too large; and a 4-bit row of odd K is no whole bytes
         * of codes, which ct_pack_codes copies row by row) */
        nb_weight_desc d;
        if (weight_desc(q, t->shape[0], t->shape[1], &d) != NB_OK || t->shape[1] * q->fi.element_bits % 8)
            return T_SHAPE;
    } else if (t->shape[1] % q->group) {
        return T_SHAPE;
    } else if (q->layout == OUT_HQQ && t->shape[0] * (t->shape[1] / q->group) % 2) {
        return T_SHAPE; /* (hqq packs the second half of the groups into the first's low nibbles) */
    }
    char *prefix = (char *)malloc(len + 32);
    if (!prefix) return T_OOM;
    memcpy(prefix, t->name, len - 7);
    prefix[len - 7] = 0;
    fate f = T_QUANTIZE;
    for (size_t i = 0; i < q->npat && f == T_QUANTIZE; i++)
        if (fnmatch(q->pat[i], prefix, 0) == 0) f = T_PATTERN;
    /* a tensor of the layout already there would collide with what we write */
    const char *const *names = q->layout == OUT_MODELOPT ? k_modelopt_names
                               : q->layout == OUT_QUARK  ? k_quark_names
                               : q->layout == OUT_BNB    ? k_bnb_names
                                                         : k_ct_int_names;
    for (size_t i = 0; q->layout != OUT_HQQ && names[i] && f == T_QUANTIZE; i++) {
        strcpy(prefix + len - 7, names[i]);
        if (tensor_exists(q, prefix)) f = T_SCALES;
    }
    for (size_t m = 0; q->layout == OUT_HQQ && m < N_HQQ && f == T_QUANTIZE; m++) { /* every member hqq writes */
        strcpy(prefix + len - 7, k_hqq_members[m].suffix);
        if (tensor_exists(q, prefix)) f = T_SCALES;
    }
    free(prefix);
    /* gpt-oss's layout quantizes the experts only: its linears stay as they are */
    return f == T_QUANTIZE && q->gptoss ? T_KEEP : f;
}

static nb_dtype nb_dt(nb_st_dtype d) {
    return d == NB_ST_F32 ? NB_DTYPE_F32 : d == NB_ST_F16 ? NB_DTYPE_F16 : NB_DTYPE_BF16;
}

static void report(qstate *q, const char *name) {
    if (q->o->progress) q->o->progress(q->o->progress_user, q->ti, q->tn, q->bdone, q->btotal, name);
}

/* compressed-tensors pack-quantized tensors from nibble's checkpoint layout
 * (nibble_io.h, "quantize", INT4 / INT4_SYM / INT8): the codes as I32 words
 * along K, the zero points as I32 words along N.  A code word is 32/b
 * little-endian b-bit fields, element i at bits b*i, which is the byte order
 * of nibble's codes (4 bits: even element in the low nibble; 8 bits: one
 * byte each): a row of codes (K*b/8 bytes: decide() keeps 4-bit rows even)
 * is copied with the top bit of every field flipped when the format is
 * signed (two's complement -> offset 2^(b-1): 0x88 per byte for int4_sym,
 * 0x80 for int8) and padded with zero bytes to whole words.  Zero points
 * are eight nibbles per word. */
static void ct_pack_codes(const uint8_t *codes, int64_t n, int64_t k, int bits, int sym, uint8_t *packed) {
    const size_t row = (size_t)k * (size_t)bits / 8, words = ((size_t)k * (size_t)bits + 31) / 32;
    const uint8_t flip = !sym ? 0 : bits == 8 ? 0x80 : 0x88;
    for (int64_t r = 0; r < n; r++) {
        uint8_t *dst = packed + (size_t)r * words * 4;
        const uint8_t *src = codes + (size_t)r * row;
        for (size_t j = 0; j < row; j++) dst[j] = (uint8_t)(src[j] ^ flip);
        memset(dst + row, 0, words * 4 - row);
    }
}

static void ct_pack_zeros(const uint8_t *zeros, int64_t n, int64_t ng, uint8_t *packed) {
    memset(packed, 0, (size_t)((n + 7) / 8) * (size_t)ng * 4);
    for (int64_t r = 0; r < n; r++)
        for (int64_t b = 0; b < ng; b++) {
            const size_t word = (size_t)(r / 8) * (size_t)ng + (size_t)b, nib = (size_t)(r % 8);
            packed[word * 4 + nib / 2] |= (uint8_t)((zeros[r * ng + b] & 15) << (4 * (nib % 2)));
        }
}

/* The fused group of weight "P.weight" (P = parent.member): its index in
 * k_fused_groups, and in *plen the length of parent; -1 for a weight that
 * belongs to none. */
static int fused_group_of(const char *name, size_t *plen) {
    const size_t len = strlen(name);
    if (len <= 7) return -1;
    const char *dot = NULL;
    for (const char *c = name; c < name + len - 7; c++)
        if (*c == '.') dot = c;
    if (!dot) return -1;
    const size_t mlen = (size_t)(name + len - 7 - (dot + 1));
    for (int g = 0; g < (int)(sizeof k_fused_groups / sizeof k_fused_groups[0]); g++)
        for (int i = 0; k_fused_groups[g][i]; i++)
            if (strlen(k_fused_groups[g][i]) == mlen && !strncmp(dot + 1, k_fused_groups[g][i], mlen)) {
                *plen = (size_t)(dot - name);
                return g;
            }
    return -1;
}

static fused_amax *fused_find(const qstate *q, const char *name) {
    size_t plen = 0;
    const int g = fused_group_of(name, &plen);
    for (size_t i = 0; g >= 0 && i < q->nfused; i++)
        if (q->fused[i].group == g && strlen(q->fused[i].parent) == plen && !strncmp(q->fused[i].parent, name, plen))
            return &q->fused[i];
    return NULL;
}

/* The largest finite magnitude of a float tensor (the quantizer's amax; a
 * non-finite element fails the quantization itself).  The bit patterns of
 * non-negative BF16, F16 and F32 values order as unsigned integers, and
 * those of the non-finite ones are the largest, so the scan is an integer
 * maximum over the patterns with the sign cleared (one the compiler
 * vectorizes), converted once at the end. */
static float tensor_amax(const nb_st_tensor *t) {
    const size_t esz = t->dtype == NB_ST_F32 ? 4 : 2, n = (size_t)(t->bytes / esz);
    if (esz == 4) {
        uint32_t m = 0;
        if ((uintptr_t)t->data % 4 == 0) {
            const uint32_t *p = (const uint32_t *)t->data;
            for (size_t i = 0; i < n; i++) {
                const uint32_t a = p[i] & 0x7FFFFFFFu;
                m = a < 0x7F800000u && a > m ? a : m;
            }
        } else {
            for (size_t i = 0; i < n; i++) {
                uint32_t a;
                memcpy(&a, (const uint8_t *)t->data + 4 * i, 4);
                a &= 0x7FFFFFFFu;
                m = a < 0x7F800000u && a > m ? a : m;
            }
        }
        float v;
        memcpy(&v, &m, 4);
        return v;
    }
    const uint16_t inf = t->dtype == NB_ST_BF16 ? 0x7F80u : 0x7C00u;
    uint16_t m = 0;
    if ((uintptr_t)t->data % 2 == 0) {
        const uint16_t *p = (const uint16_t *)t->data;
        for (size_t i = 0; i < n; i++) {
            const uint16_t a = (uint16_t)(p[i] & 0x7FFFu);
            m = a < inf && a > m ? a : m;
        }
    } else {
        for (size_t i = 0; i < n; i++) {
            uint16_t a;
            memcpy(&a, (const uint8_t *)t->data + 2 * i, 2);
            a &= 0x7FFFu;
            m = a < inf && a > m ? a : m;
        }
    }
    return t->dtype == NB_ST_BF16 ? nbi_bf16_to_f32(m) : nbi_f16_to_f32(m);
}

/* NVFP4 (a format with a tensor scale): weight t, which is quantized, adds
 * its largest magnitude to its fused group's (survey() calls it for every
 * such weight before anything is written), so that every member gets the
 * tensor scale the group's rows quantized as one weight would get. */
static nb_status note_fused(qstate *q, const nb_st_tensor *t) {
    if (!q->fi.tensor_scale || !q->o->fused_scales) return NB_OK;
    size_t plen = 0;
    const int g = fused_group_of(t->name, &plen);
    if (g < 0) return NB_OK;
    fused_amax *a = fused_find(q, t->name);
    if (!a) {
        fused_amax *grown = (fused_amax *)realloc(q->fused, (q->nfused + 1) * sizeof *q->fused);
        char *parent = (char *)malloc(plen + 1);
        if (grown) q->fused = grown;
        if (!grown || !parent) {
            free(parent);
            return nbi_fail(NULL, NB_ERR_OUT_OF_MEMORY, "out of memory");
        }
        memcpy(parent, t->name, plen);
        parent[plen] = 0;
        a = &q->fused[q->nfused++];
        a->parent = parent;
        a->group = g;
        a->amax = 0.0f;
    }
    const float m = tensor_amax(t);
    if (m > a->amax) a->amax = m;
    nbio_drop_pages(t->data, t->bytes);
    return NB_OK;
}

/* bitsandbytes' quant_state of an n x k weight in blocks of B, as its
 * QuantState.as_dict() serializes it for a 4-bit weight without double
 * quantization and Python's json.dumps writes it: quant_type ("nf4" or
 * "fp4"), blocksize, dtype (the weight's: the dtype dequantization
 * returns), shape.  Into buf; the length, or -1 when it does not fit. */
static int bnb_state(const qstate *q, nb_st_dtype dt, int64_t n, int64_t k, char *buf, size_t len) {
    const char *dtype = dt == NB_ST_F32 ? "float32" : dt == NB_ST_F16 ? "float16" : "bfloat16";
    const int r = snprintf(buf, len,
                           "{\"quant_type\": \"%s\", \"blocksize\": %d, \"dtype\": \"%s\", \"shape\": [%lld, %lld]}",
                           q->o->format == NB_FORMAT_NF4 ? "nf4" : "fp4", (int)q->group, dtype, (long long)n,
                           (long long)k);
    return r < 0 || (size_t)r >= len ? -1 : r;
}

/* The text of HQQ member m: compute_dtype names the scales' dtype. */
static const char *hqq_text(const qstate *q, int m) {
    if (!strcmp(k_hqq_members[m].suffix, ".compute_dtype"))
        return q->scale_type == NB_SCALE_BF16 ? "torch.bfloat16" : "torch.float16";
    return k_hqq_members[m].text;
}

/* HQQ's members of an n x k weight in groups of g from nibble's codes,
 * scales and zero points, written into e[0 .. N_HQQ-1]: W_q [R/2, g] holds
 * group r's codes (element r g + c of the row-major weight) in the high
 * nibbles of its row r and those of group R/2 + r in the low ones (hqq's
 * 4bit_u8 packing); scale and zero [R, 1] are nibble's as they are. */
static nb_status write_hqq(const qstate *q, nbio_shard *sh, nbio_oent *const *e, const nb_weight_desc *d,
                           const uint8_t *codes, const uint8_t *scales, const uint8_t *zeros, size_t sbytes) {
    const int64_t g = d->group_size, rows = d->n * (d->k / g), half = rows / 2;
    uint8_t *wq = (uint8_t *)malloc((size_t)(half * g));
    if (!wq) return nbi_fail(NULL, NB_ERR_OUT_OF_MEMORY, "out of memory (%lld bytes of W_q)", (long long)(half * g));
    for (int64_t r = 0; r < half; r++)
        for (int64_t c = 0; c < g; c++) {
            const size_t hi = (size_t)(r * g + c), lo = (size_t)((half + r) * g + c);
            wq[r * g + c] = (uint8_t)(((codes[hi / 2] >> (4 * (hi % 2))) & 15) << 4 | ((codes[lo / 2] >> (4 * (lo % 2))) & 15));
        }
    nb_status st = nbio_shard_write(sh, e[0], wq, (size_t)(half * g), 0);
    free(wq);
    for (int m = 1; m < N_HQQ && st == NB_OK; m++) {
        const char *text = hqq_text(q, m);
        int64_t v = k_hqq_members[m].v;
        if (!strcmp(k_hqq_members[m].suffix, ".group_size")) v = g;
        uint8_t b[16];
        const void *src = b;
        size_t len = (size_t)e[m]->bytes;
        if (k_hqq_members[m].dt == 0) { /* scale, zero */
            src = strcmp(k_hqq_members[m].suffix, ".scale") ? zeros : scales;
            len = sbytes;
        } else if (text) {
            src = text;
        } else if (k_hqq_members[m].dt == NB_ST_I64) { /* shape {N, K}, little-endian as every writer here */
            const int64_t shape[2] = {d->n, d->k};
            memcpy(b, shape, sizeof shape);
        } else {
            const int32_t w = (int32_t)v; /* I32 or U8 0-d: the low bytes */
            memcpy(b, &w, 4);
        }
        if (len != (size_t)e[m]->bytes)
            return nbi_fail(NULL, NB_ERR_INTERNAL, "%s: %zu bytes, planned %llu", e[m]->name, len,
                            (unsigned long long)e[m]->bytes);
        st = nbio_shard_write(sh, e[m], src, len, 0);
    }
    return st;
}

/* Quantize input tensor t into its entries e[slot(role)]: codes, scales and
 * the tensor scale (FP4 layouts), or weight_packed, weight_scale,
 * weight_shape and weight_zero_point (compressed-tensors int4, int4_sym,
 * int8; zero point for int4 only), bitsandbytes' weight, absmax,
 * quant_map and quant_state (nf4, bnb_fp4), or HQQ's members (int4_hqq). */
static nb_status quantize_one(qstate *q, nbio_shard *sh, const nb_st_tensor *t, nbio_oent *const *e) {
    nb_weight_desc d;
    nb_status st = weight_desc(q, t->shape[0], t->shape[1], &d);
    const fused_amax *fa = q->nfused ? fused_find(q, t->name) : NULL;
    if (fa) /* the group's tensor scale, by the quantizer's own expression (formats.c, quantize_finish_scan) */
        d.tensor_scale = fa->amax / (nbi_element_max(q->fi.element) * nbi_scale_max(q->fi.scale_type));
    nb_weight_sizes_v2 sz;
    if (st == NB_OK) st = nb_weight_get_sizes_v2(&d, &sz);
    if (st != NB_OK) return nbi_fail(NULL, st, "%s: %s", t->name, nb_last_error());
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
    const int ct = q->layout == OUT_CT_INT, bnb = q->layout == OUT_BNB, hqq = q->layout == OUT_HQQ;
    uint8_t *codes = (uint8_t *)malloc(sz.codes_bytes), *scales = (uint8_t *)malloc(sz.scales_bytes);
    uint8_t *zeros = sz.zeros_bytes ? (uint8_t *)malloc(sz.zeros_bytes) : NULL;
    uint8_t *packed = ct ? (uint8_t *)malloc((size_t)e[0]->bytes) : NULL;
    uint8_t *zpacked = ct && e[3] ? (uint8_t *)malloc((size_t)e[3]->bytes) : NULL;
    const nb_weight_buffers out = {.codes = codes, .scales = scales, .zeros = zeros};
    if (!codes || !scales || (sz.zeros_bytes && !zeros) || (ct && !packed) || (ct && e[3] && !zpacked)) {
        st = nbi_fail(NULL, NB_ERR_OUT_OF_MEMORY, "%s: out of memory (%zu bytes of codes)", t->name, sz.codes_bytes);
    } else if ((st = q->gpu ? nb_quantize_staged(q->ctx, &d, nb_dt(t->dtype), src, codes, scales, NULL)
                     : ct || bnb || hqq ? nb_quantize_host_v2(q->ctx, &d, nb_dt(t->dtype), src, &out)
                            : nb_quantize_host(q->ctx, &d, nb_dt(t->dtype), src, codes, scales)) != NB_OK) {
        st = nbi_fail(NULL, st, "%s: %s", t->name, nb_context_last_error(q->ctx));
    } else if (ct) {
        const int64_t n = d.n, k = d.k, ng = d.k / d.group_size;
        const int64_t shape[2] = {n, k}; /* I64 little-endian, as every writer here assumes of the host */
        ct_pack_codes(codes, n, k, q->fi.element_bits, !q->fi.zero_point, packed);
        if (zpacked) ct_pack_zeros(zeros, n, ng, zpacked);
        if ((st = nbio_shard_write(sh, e[0], packed, (size_t)e[0]->bytes, 0)) == NB_OK &&
            (st = nbio_shard_write(sh, e[1], scales, sz.scales_bytes, 0)) == NB_OK &&
            (st = nbio_shard_write(sh, e[2], shape, sizeof shape, 0)) == NB_OK && zpacked)
            st = nbio_shard_write(sh, e[3], zpacked, (size_t)e[3]->bytes, 0);
    } else if (hqq) {
        st = write_hqq(q, sh, e, &d, codes, scales, zeros, sz.scales_bytes);
    } else if (bnb) {
        /* the codes in row-major order, the first of each pair in the high
         * nibble (nibble's checkpoint layout has it in the low one); the
         * absmax as it is (B divides K: bitsandbytes' blocks of the
         * flattened weight are nibble's groups); the format's 16 values */
        for (size_t j = 0; j < sz.codes_bytes; j++) codes[j] = (uint8_t)(codes[j] >> 4 | codes[j] << 4);
        float table[16];
        for (int c = 0; c < 16; c++) table[c] = nb_element_to_float(q->fi.element, (uint8_t)c);
        char js[192];
        const int len = bnb_state(q, t->dtype, d.n, d.k, js, sizeof js);
        if (len < 0 || (uint64_t)len != e[3]->bytes)
            st = nbi_fail(NULL, NB_ERR_INTERNAL, "%s: quant_state of %d bytes, planned %llu", t->name, len,
                          (unsigned long long)e[3]->bytes);
        else if ((st = nbio_shard_write(sh, e[0], codes, sz.codes_bytes, 0)) == NB_OK &&
                 (st = nbio_shard_write(sh, e[1], scales, sz.scales_bytes, 0)) == NB_OK &&
                 (st = nbio_shard_write(sh, e[2], table, sizeof table, 0)) == NB_OK)
            st = nbio_shard_write(sh, e[3], js, (size_t)len, 0);
    } else if ((st = nbio_shard_write(sh, e[0], codes, sz.codes_bytes, 0)) == NB_OK &&
               (st = nbio_shard_write(sh, e[1], scales, sz.scales_bytes, 0)) == NB_OK && e[2]) {
        st = nbio_shard_write(sh, e[2], &d.tensor_scale, 4, 0);
    }
    free(codes);
    free(scales);
    free(zeros);
    free(packed);
    free(zpacked);
    free(copy);
    nbio_drop_pages(t->data, t->bytes);
    return st;
}

/* Transpose a [K, N] matrix of 2- or 4-byte elements into [N, K], in tiles
 * of 32 x 32 so that both sides stay in cache. */
#define NBIO_TRANSPOSE(T)                                                                                         \
    do {                                                                                                          \
        const T *s_ = (const T *)src;                                                                             \
        T *d_ = (T *)dst;                                                                                         \
        for (size_t k0 = 0; k0 < K; k0 += 32)                                                                     \
            for (size_t n0 = 0; n0 < N; n0 += 32) {                                                               \
                const size_t k1 = k0 + 32 < K ? k0 + 32 : K, n1 = n0 + 32 < N ? n0 + 32 : N;                      \
                for (size_t k = k0; k < k1; k++)                                                                  \
                    for (size_t n = n0; n < n1; n++) d_[n * K + k] = s_[k * N + n];                               \
            }                                                                                                     \
    } while (0)
static void transpose(const void *src, size_t K, size_t N, size_t esz, void *dst) {
    if ((uintptr_t)src % esz) { /* (a tensor the file does not align to its element: bytes, element by element) */
        for (size_t k = 0; k < K; k++)
            for (size_t n = 0; n < N; n++)
                memcpy((uint8_t *)dst + (n * K + k) * esz, (const uint8_t *)src + (k * N + n) * esz, esz);
    } else if (esz == 4) {
        NBIO_TRANSPOSE(uint32_t);
    } else {
        NBIO_TRANSPOSE(uint16_t);
    }
}
#undef NBIO_TRANSPOSE

/* Quantize gpt-oss experts tensor t [E, K, N] into e[0] (G.<proj>_blocks U8
 * [E, N, K/32, 16]) and e[1] (G.<proj>_scales U8 [E, N, K/32]): expert by
 * expert, its [K, N] slice transposed to the [N, K] weight that multiplies
 * x (transformers' GptOssExperts computes x @ W[e]) and quantized like any
 * weight, so its rows keep the input's order (gate_up's interleaved gate
 * and up rows included). */
static nb_status quantize_experts(qstate *q, nbio_shard *sh, const nb_st_tensor *t, nbio_oent *const *e) {
    const int64_t E = t->shape[0], K = t->shape[1], N = t->shape[2];
    nb_weight_desc d;
    nb_status st = weight_desc(q, N, K, &d);
    nb_weight_sizes_v2 sz;
    if (st == NB_OK) st = nb_weight_get_sizes_v2(&d, &sz);
    if (st != NB_OK) return nbi_fail(NULL, st, "%s: %s", t->name, nb_last_error());
    const size_t esz = t->dtype == NB_ST_F32 ? 4 : 2, one = (size_t)K * (size_t)N * esz;
    uint8_t *w = (uint8_t *)malloc(one), *codes = (uint8_t *)malloc(sz.codes_bytes);
    uint8_t *scales = (uint8_t *)malloc(sz.scales_bytes);
    if (!w || !codes || !scales)
        st = nbi_fail(NULL, NB_ERR_OUT_OF_MEMORY, "%s: out of memory (%zu bytes per expert)", t->name, one);
    for (int64_t x = 0; x < E && st == NB_OK; x++) {
        const uint8_t *src = (const uint8_t *)t->data + (size_t)x * one;
        transpose(src, (size_t)K, (size_t)N, esz, w);
        nbio_drop_pages(src, one);
        st = q->gpu ? nb_quantize_staged(q->ctx, &d, nb_dt(t->dtype), w, codes, scales, NULL)
                    : nb_quantize_host(q->ctx, &d, nb_dt(t->dtype), w, codes, scales);
        if (st != NB_OK) {
            st = nbi_fail(NULL, st, "%s, expert %lld: %s", t->name, (long long)x, nb_context_last_error(q->ctx));
        } else if ((st = nbio_shard_write(sh, e[0], codes, sz.codes_bytes, (uint64_t)x * sz.codes_bytes)) ==
                   NB_OK) {
            st = nbio_shard_write(sh, e[1], scales, sz.scales_bytes, (uint64_t)x * sz.scales_bytes);
        }
    }
    free(w);
    free(codes);
    free(scales);
    return st;
}

/* ------------------------------------------------------------ one output file */

/* The entry of input tensor t (index i) copied unchanged. */
static nb_status plan_copy(nbio_oent *e, const nb_st_tensor *t, size_t i) {
    nbio_oent_like(e, nbio_strdup(t->name), t, i, ROLE_COPY);
    return e->name ? NB_OK : nbi_fail(NULL, NB_ERR_OUT_OF_MEMORY, "out of memory");
}

/* One output entry of quantized tensor t (index i): prefix + suffix, dtype,
 * shape (rank 0 when d1 < 0, rank 1 when d0 < 0), bytes from the dtype. */
static nb_status plan_entry(nbio_oent *e, const nb_st_tensor *t, size_t i, int role, const char *suf, nb_st_dtype dt,
                            int64_t d0, int64_t d1) {
    const size_t plen = strlen(t->name) - 7;
    e->name = (char *)malloc(plen + strlen(suf) + 1);
    if (!e->name) return nbi_fail(NULL, NB_ERR_OUT_OF_MEMORY, "out of memory");
    memcpy(e->name, t->name, plen);
    strcpy(e->name + plen, suf);
    e->src = i;
    e->role = role;
    e->dtype = dt;
    int bits = 8;
    nb_st_dtype_info(dt, NULL, &bits);
    e->rank = d1 < 0 ? 0 : d0 < 0 ? 1 : 2;
    if (e->rank == 1) e->shape[0] = d1;
    if (e->rank == 2) e->shape[0] = d0, e->shape[1] = d1;
    e->bytes = (uint64_t)(e->rank == 2 ? d0 * d1 : e->rank == 1 ? d1 : 1) * (uint64_t)(bits / 8);
    return NB_OK;
}

/* The entries of quantized tensor t (index i).  ModelOpt / Quark: P.weight
 * (codes), P.weight_scale (block scales in the dtype of the format's scale
 * type) and, for a format with a tensor scale, P.weight_scale_2 F32 [].
 * compressed-tensors: P.weight_packed I32 [N, ceil(K*b/32)] (K/8 words
 * of 4-bit codes, K/4 of 8-bit ones, rounded up), P.weight_scale [N, K/G],
 * P.weight_shape I64 [2], and for int4 P.weight_zero_point I32
 * [ceil(N/8), K/G].  bitsandbytes: P.weight U8 [N*K/2, 1],
 * P.weight.absmax F32 [N*K/B], P.weight.quant_map F32 [16] and
 * P.weight.quant_state.bitsandbytes__nf4 (__fp4) U8, its JSON.  HQQ: the
 * members of k_hqq_members under prefix P (P.W_q, P.scale, P.zero, ...). */
static nb_status plan_quantized(const qstate *q, nbio_oent *ents, size_t *ne, const nb_st_tensor *t, size_t i) {
    const int64_t n = t->shape[0], k = t->shape[1];
    const int64_t g = q->group == NB_CKPT_GROUP_PER_CHANNEL ? k : q->group;
    nb_status st;
    if (q->layout == OUT_HQQ) {
        const int64_t rows = n * (k / g);
        const nb_st_dtype sdt = q->scale_type == NB_SCALE_BF16 ? NB_ST_BF16 : NB_ST_F16;
        for (int m = 0; m < N_HQQ; m++) {
            const char *text = hqq_text(q, m);
            int64_t d0 = -1, d1 = -1;
            if (m == 0) d0 = rows / 2, d1 = g;
            else if (!k_hqq_members[m].dt) d0 = rows, d1 = 1;
            else if (k_hqq_members[m].rank == 1) d1 = text ? (int64_t)strlen(text) : 2;
            if ((st = plan_entry(&ents[(*ne)++], t, i, m ? ROLE_HQQ + m : ROLE_CODES, k_hqq_members[m].suffix,
                                 k_hqq_members[m].dt ? k_hqq_members[m].dt : sdt, d0, d1)))
                return st;
        }
        return NB_OK;
    }
    if (q->layout == OUT_BNB) {
        char js[192];
        const int len = bnb_state(q, t->dtype, n, k, js, sizeof js);
        if (len < 0) return nbi_fail(NULL, NB_ERR_INTERNAL, "%s: quant_state does not fit", t->name);
        if ((st = plan_entry(&ents[(*ne)++], t, i, ROLE_CODES, ".weight", NB_ST_U8, n * k / 2, 1)) ||
            (st = plan_entry(&ents[(*ne)++], t, i, ROLE_SCALES, ".weight.absmax", NB_ST_F32, -1, n * k / g)) ||
            (st = plan_entry(&ents[(*ne)++], t, i, ROLE_QMAP, ".weight.quant_map", NB_ST_F32, -1, 16)))
            return st;
        return plan_entry(&ents[(*ne)++], t, i, ROLE_QSTATE,
                          q->o->format == NB_FORMAT_NF4 ? ".weight.quant_state.bitsandbytes__nf4"
                                                        : ".weight.quant_state.bitsandbytes__fp4",
                          NB_ST_U8, -1, len);
    }
    if (q->layout == OUT_CT_INT) {
        const nb_st_dtype sdt = q->scale_type == NB_SCALE_BF16 ? NB_ST_BF16 : NB_ST_F16;
        const int64_t words = (k * q->fi.element_bits + 31) / 32;
        if ((st = plan_entry(&ents[(*ne)++], t, i, ROLE_CODES, ".weight_packed", NB_ST_I32, n, words)) ||
            (st = plan_entry(&ents[(*ne)++], t, i, ROLE_SCALES, ".weight_scale", sdt, n, k / g)) ||
            (st = plan_entry(&ents[(*ne)++], t, i, ROLE_SHAPE, ".weight_shape", NB_ST_I64, -1, 2)))
            return st;
        if (q->fi.zero_point)
            return plan_entry(&ents[(*ne)++], t, i, ROLE_ZEROS, ".weight_zero_point", NB_ST_I32, (n + 7) / 8, k / g);
        return NB_OK;
    }
    if ((st = plan_entry(&ents[(*ne)++], t, i, ROLE_CODES, ".weight", NB_ST_U8, n, k * q->fi.element_bits / 8)) ||
        (st = plan_entry(&ents[(*ne)++], t, i, ROLE_SCALES, ".weight_scale", nbio_scale_dtype(q->fi.scale_type), n,
                         k / g)))
        return st;
    if (q->fi.tensor_scale) return plan_entry(&ents[(*ne)++], t, i, ROLE_TSCALE, ".weight_scale_2", NB_ST_F32, -1, -1);
    return NB_OK;
}

/* The entries of gpt-oss experts tensor t [E, K, N] (index i):
 * t.name + "_blocks" U8 [E, N, K/32, 16] and + "_scales" U8 [E, N, K/32]. */
static nb_status plan_experts(const qstate *q, nbio_oent *ents, size_t *ne, const nb_st_tensor *t, size_t i) {
    const int64_t E = t->shape[0], K = t->shape[1], N = t->shape[2], g = q->group;
    for (int r = 0; r < 2; r++) {
        nbio_oent *e = &ents[(*ne)++];
        const size_t len = strlen(t->name);
        e->name = (char *)malloc(len + 8);
        if (!e->name) return nbi_fail(NULL, NB_ERR_OUT_OF_MEMORY, "out of memory");
        memcpy(e->name, t->name, len);
        strcpy(e->name + len, r ? "_scales" : "_blocks");
        e->src = i;
        e->role = r ? ROLE_XSCALES : ROLE_XBLOCKS;
        e->dtype = NB_ST_U8;
        e->rank = r ? 3 : 4;
        e->shape[0] = E, e->shape[1] = N, e->shape[2] = K / g;
        if (!r) e->shape[3] = g * q->fi.element_bits / 8;
        e->bytes = (uint64_t)E * (uint64_t)N * (uint64_t)(K / g) * (uint64_t)(r ? 1 : g * q->fi.element_bits / 8);
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
        if (fa == T_SHAPE || fa == T_PATTERN || fa == T_SCALES || fa == T_KEEP) {
            size_t n = module_len(q, &t);
            char *p = (char *)malloc(n + 1);
            if (p) {
                memcpy(p, t.name, n);
                p[n] = 0;
            }
            if (!nbio_push_str(&q->excluded, &q->nexcl, p)) return nbi_fail(NULL, NB_ERR_OUT_OF_MEMORY, "out of memory");
            q->sum.weights_excluded++;
        }
        st = quant                ? plan_quantized(q, ents, ne, &t, i)
             : fa == T_EXPERTS ? plan_experts(q, ents, ne, &t, i)
                               : plan_copy(&ents[(*ne)++], &t, i);
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
        nbio_oent *const *e = &by_src[i * NSLOT];
        if (e[0]->role == ROLE_CODES) {
            if ((st = quantize_one(q, sh, &t, e)) != NB_OK) return st;
            q->sum.layers_quantized++;
        } else if (e[0]->role == ROLE_XBLOCKS) {
            if ((st = quantize_experts(q, sh, &t, e)) != NB_OK) return st;
            q->sum.layers_quantized++;
            q->sum.experts_quantized++;
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
    nbio_oent *ents = (nbio_oent *)calloc(count * NSLOT + 1, sizeof *ents);
    nbio_oent **by_src = (nbio_oent **)calloc(count * NSLOT + 1, sizeof *by_src);
    nbio_shard sh = {.fd = -1};
    if (!ents || !by_src) st = nbi_fail(NULL, NB_ERR_OUT_OF_MEMORY, "out of memory");
    if (st == NB_OK) st = plan_shard(q, f, count, ents, &ne);
    if (st == NB_OK) st = nbio_shard_begin(&q->out, &sh, shard, f, ents, ne);
    if (st == NB_OK) {
        for (size_t i = 0; i < ne; i++)
            by_src[ents[i].src * NSLOT + slot(ents[i].role)] = &ents[i];
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

/* bitsandbytes' compute dtype: the model's torch_dtype (config.json) where it
 * names one of the three, else bfloat16 (transformers' default for 4-bit
 * loading). */
static const char *bnb_compute_dtype(const cJSON *config) {
    const cJSON *d = cJSON_GetObjectItemCaseSensitive(config, "torch_dtype");
    if (!cJSON_IsString(d)) d = cJSON_GetObjectItemCaseSensitive(config, "dtype");
    if (cJSON_IsString(d) && (!strcmp(d->valuestring, "float16") || !strcmp(d->valuestring, "float32")))
        return !strcmp(d->valuestring, "float16") ? "float16" : "float32";
    return "bfloat16";
}

static nb_status write_configs(qstate *q, cJSON *config) {
    if (q->nexcl) qsort(q->excluded, q->nexcl, sizeof *q->excluded, cmp_str);
    size_t u = 0; /* (a gpt-oss experts module left as it is has two tensors: named once) */
    for (size_t i = 0; i < q->nexcl; i++) {
        if (u && !strcmp(q->excluded[u - 1], q->excluded[i])) free(q->excluded[i]);
        else q->excluded[u++] = q->excluded[i];
    }
    q->nexcl = u;
    const char *const *ex = (const char *const *)q->excluded;
    nb_status st = NB_OK;
    if (q->layout == OUT_MODELOPT) {
        cJSON *h = nbio_hf_quant_config(ex, q->nexcl, NULL);
        st = nbio_out_write_json(&q->out, "hf_quant_config.json", h);
        cJSON_Delete(h);
        if (st != NB_OK) return st;
    }
    if (!config) return NB_OK;
    if (q->gptoss) { /* gpt-oss's own: quant_method mxfp4, the modules kept unquantized */
        cJSON *qc = cJSON_CreateObject(), *keep = cJSON_CreateArray();
        if (!qc || !keep || !cJSON_AddStringToObject(qc, "quant_method", "mxfp4")) {
            cJSON_Delete(qc);
            cJSON_Delete(keep);
            return nbi_fail(NULL, NB_ERR_OUT_OF_MEMORY, "out of memory");
        }
        cJSON_AddItemToObject(qc, "modules_to_not_convert", keep);
        for (size_t i = 0; i < q->nexcl; i++) {
            cJSON *s = cJSON_CreateString(ex[i]);
            if (!s) {
                cJSON_Delete(qc);
                return nbi_fail(NULL, NB_ERR_OUT_OF_MEMORY, "out of memory");
            }
            cJSON_AddItemToArray(keep, s);
        }
        cJSON_DeleteItemFromObjectCaseSensitive(config, "quantization_config");
        cJSON_AddItemToObject(config, "quantization_config", qc);
        return nbio_out_write_json(&q->out, "config.json", config);
    }
    cJSON *qc = q->layout == OUT_MODELOPT ? nbio_qc_modelopt(ex, q->nexcl)
                : q->layout == OUT_QUARK  ? nbio_qc_quark(mx_mode(q->o->mx_rule), ex, q->nexcl)
                : q->layout == OUT_BNB    ? nbio_qc_bnb(q->o->format, bnb_compute_dtype(config), ex, q->nexcl)
                : q->layout == OUT_HQQ    ? nbio_qc_hqq(q->group, ex, q->nexcl)
                                          : nbio_qc_ct_int(q->o->format, q->group, ex, q->nexcl);
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
    if (!q->layout || (q->layout < OUT_CT_INT && !nbio_scale_dtype(q->fi.scale_type)))
        return nbi_fail(NULL, NB_ERR_UNSUPPORTED, "nb_ckpt_quantize: no checkpoint layout is written for format %s "
                        "(ModelOpt holds nvfp4, Quark mxfp4, compressed-tensors int4, int4_sym and int8, "
                        "bitsandbytes nf4 and bnb_fp4, HQQ int4_hqq)", q->fi.name);
    q->group = q->fi.group_size;
    q->scale_type = q->fi.scale_type;
    if (q->layout == OUT_CT_INT || q->layout == OUT_HQQ || q->layout == OUT_BNB) {
        /* the group (the row's set; per channel for compressed-tensors only) and, but for the table
         * formats' F32 absmax, F16 or BF16 scales */
        const int32_t g = opts->group_size, channel = q->layout == OUT_CT_INT;
        if (g && !(channel && g == NB_CKPT_GROUP_PER_CHANNEL) &&
            (g <= 0 || g > 4096 || (g & (g - 1)) || !(q->fi.groups & g)))
            return nbi_fail(NULL, NB_ERR_INVALID_ARGUMENT, "nb_ckpt_quantize: group_size %d: %s takes %s (0: %d)",
                            (int)g, q->fi.name,
                            q->layout == OUT_BNB ? "blocks of 32, 64, ..., 4096"
                            : channel            ? "32, 64, 128 or NB_CKPT_GROUP_PER_CHANNEL"
                                                 : "32, 64 or 128 (HQQ checkpoints)",
                            (int)q->fi.group_size);
        if (opts->scale_type && q->layout == OUT_BNB)
            return nbi_fail(NULL, NB_ERR_INVALID_ARGUMENT, "nb_ckpt_quantize: scale_type %d: %s's absmax is F32 "
                            "(leave it 0)", (int)opts->scale_type, q->fi.name);
        if (opts->scale_type && opts->scale_type != NB_SCALE_F16 && opts->scale_type != NB_SCALE_BF16)
            return nbi_fail(NULL, NB_ERR_INVALID_ARGUMENT, "nb_ckpt_quantize: scale_type %d: %s checkpoints hold F16 "
                            "(%d) or BF16 (%d) scales (0: F16)", (int)opts->scale_type, q->fi.name, NB_SCALE_F16,
                            NB_SCALE_BF16);
        if (g) q->group = g;
        if (opts->scale_type) q->scale_type = (nb_scale_type)opts->scale_type;
    } else if (opts->group_size || opts->scale_type) {
        return nbi_fail(NULL, NB_ERR_INVALID_ARGUMENT, "nb_ckpt_quantize: group_size and scale_type choose the group "
                        "and scales of the integer formats (group_size also nf4's and bnb_fp4's blocks); %s's are "
                        "fixed (leave them 0)", q->fi.name);
    }
    if (opts->method == NB_QUANT_HQQ && q->layout != OUT_HQQ)
        return nbi_fail(NULL, NB_ERR_UNSUPPORTED, "nb_ckpt_quantize: method hqq (%d) serves int4_hqq only, not %s",
                        (int)opts->method, q->fi.name);
    /* the integer and table formats: the C reference (rounding to nearest;
     * int4_hqq also hqq's optimizer), on the CPU */
    if (q->layout == OUT_CT_INT || q->layout == OUT_BNB || q->layout == OUT_HQQ) {
        if (opts->method != NB_QUANT_RTN && !(q->layout == OUT_HQQ && opts->method == NB_QUANT_HQQ))
            return nbi_fail(NULL, NB_ERR_UNSUPPORTED, "nb_ckpt_quantize: method %d: %s is quantized by rounding to "
                            "nearest only (the MSE scale search serves nvfp4 and mxfp4, hqq's optimizer int4_hqq)",
                            (int)opts->method, q->fi.name);
        if (opts->device == NB_CKPT_DEVICE_GPU)
            return nbi_fail(NULL, NB_ERR_UNSUPPORTED, "nb_ckpt_quantize: %s has no device quantizer; use device cpu "
                            "or auto (both run nb_quantize_host_v2)", q->fi.name);
    }
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
    if (opts->method != NB_QUANT_RTN && opts->method != NB_QUANT_MSE && opts->method != NB_QUANT_HQQ)
        return nbi_fail(NULL, NB_ERR_INVALID_ARGUMENT, "nb_ckpt_quantize: unknown method %d (rtn %d, mse %d, hqq %d)",
                        (int)opts->method, NB_QUANT_RTN, NB_QUANT_MSE, NB_QUANT_HQQ);
    if (opts->fused_scales != 0 && opts->fused_scales != 1)
        return nbi_fail(NULL, NB_ERR_INVALID_ARGUMENT, "nb_ckpt_quantize: fused_scales is %d (0 or 1)",
                        (int)opts->fused_scales);
    if (opts->method == NB_QUANT_MSE && opts->device == NB_CKPT_DEVICE_GPU)
        return nbi_fail(NULL, NB_ERR_UNSUPPORTED, "nb_ckpt_quantize: method mse runs on the CPU only; use device cpu "
                        "or auto");
    if (!nbio_reserved_zero(opts->reserved, sizeof opts->reserved / sizeof opts->reserved[0]))
        return nbi_fail(NULL, NB_ERR_INVALID_ARGUMENT, "nb_ckpt_quantize: opts.reserved is not zero (use "
                        "nb_ckpt_quantize_opts_init)");
    return NB_OK;
}

/* Every input tensor's fate before OUT is touched: weights of a dtype that
 * is not quantized are counted (and named when nothing qualifies), the
 * fused groups' largest magnitudes are taken (note_fused), and a
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
        if (f == T_QUANTIZE && (st = note_fused(q, &t)) != NB_OK) return st;
        n[f]++;
        const char *dn = "?";
        char name[96];
        if (f == T_DTYPE && n[f] <= 3 && at < sizeof dtypes && nb_st_dtype_info(t.dtype, &dn, NULL) == NB_OK)
            at += (size_t)snprintf(dtypes + at, sizeof dtypes - at, "%s%s %s", at ? ", " : "",
                                   nbi_elide(t.name, name, sizeof name), dn);
    }
    q->sum.weights_unsupported = (int32_t)(n[T_DTYPE] < INT32_MAX ? n[T_DTYPE] : INT32_MAX);
    if (n[T_QUANTIZE] || n[T_EXPERTS] || q->o->allow_empty) return NB_OK;
    char fname0[160];
    if (q->gptoss)
        return nbi_fail(NULL, NB_ERR_UNSUPPORTED, "%s: nothing to quantize to gpt-oss's MXFP4 layout: no experts "
                        "tensor G.gate_up_proj [E, H, 2I] or G.down_proj [E, I, H] (BF16, F16 or F32, H and I "
                        "multiples of 32) outside the exclude patterns and without _blocks / _scales already "
                        "(%zu excluded by a pattern, %zu by shape, %zu with blocks already); its linear layers stay "
                        "unquantized in that layout; allow_empty copies it anyway",
                        nbi_elide(file, fname0, sizeof fname0), n[T_PATTERN], n[T_SHAPE], n[T_SCALES]);
    if (n[T_DTYPE] > 3 && at < sizeof dtypes)
        snprintf(dtypes + at, sizeof dtypes - at, " and %zu more", n[T_DTYPE] - 3);
    char fname[160], kok[48], kbad[48];
    if (q->group == NB_CKPT_GROUP_PER_CHANNEL && q->fi.element_bits == 4) {
        snprintf(kok, sizeof kok, "an even K");
        snprintf(kbad, sizeof kbad, "K odd");
    } else if (q->group == NB_CKPT_GROUP_PER_CHANNEL) { /* (8 bits: any K the descriptor takes) */
        snprintf(kok, sizeof kok, "K at most 2^31");
        snprintf(kbad, sizeof kbad, "too large a shape");
    } else {
        snprintf(kok, sizeof kok, "K a multiple of %d", (int)q->group);
        snprintf(kbad, sizeof kbad, "K not a multiple of %d", (int)q->group);
    }
    return nbi_fail(NULL, NB_ERR_UNSUPPORTED, "%s: nothing to quantize to %s: no tensor is a rank-2 BF16, F16 or F32 "
                    "P.weight with %s outside the exclude patterns (%zu weights of another dtype%s%s; "
                    "%zu excluded by a pattern, %zu with %s, %zu with scales already); "
                    "allow_empty copies it anyway", nbi_elide(file, fname, sizeof fname), q->fi.name, kok,
                    n[T_DTYPE], n[T_DTYPE] ? ": " : "", dtypes, n[T_PATTERN], n[T_SHAPE], kbad, n[T_SCALES]);
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
    if (st == NB_OK) st = nbio_read_config(q->dir, "config.json", NB_CKPT_MAX_CONFIG, config);
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
    /* gpt-oss (config.json model_type "gpt_oss") in MXFP4: gpt-oss's own layout */
    const cJSON *mt = *config ? cJSON_GetObjectItemCaseSensitive(*config, "model_type") : NULL;
    q->gptoss = o->format == NB_FORMAT_MXFP4 && cJSON_IsString(mt) && !strcmp(mt->valuestring, "gpt_oss");
    /* MSE, the integer and the table formats have no device version: auto means the CPU then */
    const nb_ckpt_device where =
        o->method == NB_QUANT_MSE || q->layout >= OUT_CT_INT ? NB_CKPT_DEVICE_CPU : o->device;
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
    for (size_t i = 0; i < q.nfused; i++) free(q.fused[i].parent);
    free(q.fused);
    free(q.pat);
    cJSON_Delete(config);
    nb_context_destroy(q.ctx);
    nb_st_close(q.single);
    nb_st_index_close(q.index);
    free(dir);
    free(file);
    return st;
}
