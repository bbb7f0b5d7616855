/* io_internal.h - helpers shared by the files of src/io (not installed, not
 * exported: every declaration here is NB_INTERNAL).  The public checkpoint
 * API is include/nibble_io.h.
 *
 * Errors: every function that can fail returns nb_status and records its
 * message with nbi_fail (../internal.h), the thread-local buffer that
 * nb_last_error() reads, like the core library.  Lookups that only probe
 * (does this tensor exist?) use the nbio_*_lookup helpers, which record
 * nothing, so a successful call does not leave a stale failure message. */
#ifndef NB_IO_INTERNAL_H
#define NB_IO_INTERNAL_H

#include "../internal.h"
#include "nibble_io.h"

#include <stddef.h>
#include <stdint.h>

/* ------------------------------------------------------------ strings, files */

/* malloc'ed copy of s, NULL when out of memory. */
NB_INTERNAL char *nbio_strdup(const char *s);
/* a + "/" + b and a + b, malloc'ed (NULL when out of memory). */
NB_INTERNAL char *nbio_join(const char *a, const char *b);
NB_INTERNAL char *nbio_concat(const char *a, const char *b);
NB_INTERNAL int nbio_ends_with(const char *s, const char *suffix);
/* ASCII case-insensitive equality; a NULL a is equal to nothing. */
NB_INTERNAL int nbio_ieq(const char *a, const char *b);
/* Offset of the first byte that breaks strict UTF-8, or n when all is valid. */
NB_INTERNAL size_t nbio_utf8_bad(const unsigned char *s, size_t n);
/* Append s (malloc'ed; freed on failure) to a growable array: 1 on success. */
NB_INTERNAL int nbio_push_str(char ***arr, size_t *n, char *s);
NB_INTERNAL void nbio_free_strs(char **a, size_t n);

/* Open a regular file for reading (*fd; size may be NULL).  Anything else
 * - a FIFO, socket, device or directory - is NB_ERR_IO naming what it is,
 * refused without blocking. */
NB_INTERNAL nb_status nbio_open_regular(const char *path, int *fd, uint64_t *size);
/* Map a regular file read-only (MAP_PRIVATE); files shorter than min_size
 * (or empty) are not mapped (*map NULL, *size set).  munmap(*map, *size). */
NB_INTERNAL nb_status nbio_map_file(const char *path, size_t min_size, void **map, size_t *size);
/* Resolve a checkpoint path (a .safetensors file, a directory holding
 * model.safetensors.index.json or model.safetensors, or an index file) to its
 * directory and the file to open; both malloc'ed.  Sets *sharded for an
 * index. */
NB_INTERNAL nb_status nbio_resolve_checkpoint(const char *path, char **dir, char **file, int *sharded);
/* Drop the pages of [p, p+n) of a read-only MAP_PRIVATE file mapping (they
 * are read from the file again if touched). */
NB_INTERNAL void nbio_drop_pages(const void *p, size_t n);

/* ------------------------------------------------------------ formats */

/* The row of nibble.h's format table for `f`, recorded as a failure naming
 * `what` when f is not a format of this library (NB_ERR_INVALID_ARGUMENT:
 * the caller passed a value that is no format at all). */
NB_INTERNAL nb_status nbio_format_info(nb_format f, const char *what, nb_format_info *out);
/* The safetensors dtype a checkpoint stores block scales of this type in
 * (E4M3: F8_E4M3, E8M0: U8); 0 for a scale type without one. */
NB_INTERNAL nb_st_dtype nbio_scale_dtype(int32_t scale_type);

/* ------------------------------------------------------------ lookups that record nothing */

NB_INTERNAL const nb_st_tensor *nbio_st_lookup(const nb_st_file *f, const char *name);
NB_INTERNAL const nb_st_tensor *nbio_st_index_lookup(const nb_st_index *x, const char *name);
/* The tensor's index in the checkpoint, -1 when absent; its layer (-1: none). */
NB_INTERNAL int64_t nbio_ckpt_lookup(const nb_ckpt *c, const char *name, int64_t *layer);
NB_INTERNAL const nb_ckpt_layer *nbio_ckpt_layer_ref(const nb_ckpt *c, size_t i);
NB_INTERNAL int64_t nbio_ckpt_layer_lookup(const nb_ckpt *c, const char *prefix);
NB_INTERNAL int64_t nbio_gguf_lookup(const nb_gguf_file *g, const char *name);
/* The nibble format a ggml type imports as, 0 for a type that is not imported. */
NB_INTERNAL nb_format nbio_ggml_format(uint32_t type);

/* ------------------------------------------------------------ readers for the fuzzers and tests */

/* The index rules that need no shard (text, JSON, weight_map, shard names,
 * no name twice) on `len` bytes in memory; the counts of tensors and
 * distinct shards (either may be NULL). */
NB_INTERNAL nb_status nbio_st_index_check_memory(const char *text, size_t len, const char *label, size_t *ntensors,
                                                 size_t *nshards);
/* The config reading of nb_ckpt_open on texts in memory (either may be NULL
 * with length 0), then whether each of prefixes[0..n) is excluded.  Same
 * statuses as nb_ckpt_open's config part. */
NB_INTERNAL nb_status nbio_ckpt_config_check_memory(const char *hf_json, size_t hf_len, const char *cfg_json,
                                                    size_t cfg_len, const char *const *prefixes, size_t n,
                                                    int *excluded);
/* nb_ckpt_open of a single-file checkpoint held in memory: the safetensors
 * image (size bytes, not copied: it must outlive the checkpoint) and the
 * texts of config.json and hf_quant_config.json next to it (either NULL
 * with length 0 when absent).  The checkpoint's one file is named
 * "(memory)", with 0 bytes on disk, and its directory "(memory)". */
NB_INTERNAL nb_status nbio_ckpt_open_memory(const void *image, size_t size, const char *cfg_json, size_t cfg_len,
                                            const char *hf_json, size_t hf_len, nb_ckpt **out);

typedef struct cJSON cJSON;

/* ------------------------------------------------------------ ckpt_int.c
 * Layouts whose weight is converted into nibble's checkpoint layout when it
 * is read (AWQ, GPTQ, compressed-tensors pack-quantized integers,
 * bitsandbytes 4-bit): checkpoint.c classifies through these hooks and keeps
 * one nbio_conv per such layer. */

/* What a quantization_config declares about integer and bitsandbytes
 * checkpoints (-1 / 0 where it says nothing). */
typedef struct nbio_qcfg {
    int bits;           /* bits, or the weights' num_bits (compressed-tensors) */
    int group_size;     /* > 0, -1 per channel, 0 unknown */
    int sym;            /* 1 symmetric, 0 asymmetric, -1 unknown */
    int gptq_v2;        /* checkpoint_format "gptq_v2": zero points stored as they are */
    int awq_not_gemm;   /* an AWQ version other than "gemm" (GEMV, exllama, ...) */
    char awq_version[24];
} nbio_qcfg;

/* How one converted layer is read: its layout, the nb_format it becomes and
 * the tensors (indices into the checkpoint; -1 when absent). */
typedef struct nbio_conv {
    nb_ckpt_format layout;
    nb_format format;
    int32_t group;
    nb_scale_type scale_type;
    int bits;
    int zero_plus_one;  /* GPTQ v1: a stored zero point is z - 1 */
    int k_permuted;     /* g_idx groups are not contiguous: k is reordered */
    int64_t codes, scales, zeros, gidx, absmax, nested_absmax, nested_map;
    int nested_block;   /* bitsandbytes double quantization */
    float nested_offset;
} nbio_conv;

/* The format a quantization_config (may be NULL) declares for these
 * layouts (NB_CKPT_NONE when none), and what else it says. */
NB_INTERNAL nb_ckpt_format nbio_qcfg_read(const cJSON *qc, nbio_qcfg *out);
/* Classification, from the anchor tensor ti: P.qweight (AWQ / GPTQ),
 * P.weight_packed of dtype I32 (compressed-tensors), P.weight with a
 * P.weight.quant_state.bitsandbytes__* (bitsandbytes).  Each adds one layer
 * (or an inconsistent one, with the reason); NB_OK unless out of memory. */
NB_INTERNAL nb_status nbio_classify_qweight(nb_ckpt *c, size_t ti);
NB_INTERNAL nb_status nbio_classify_ct_int(nb_ckpt *c, size_t ti);
NB_INTERNAL nb_status nbio_classify_bnb(nb_ckpt *c, size_t ti, int64_t jstate);
/* P.W_q with P.scale, P.zero and hqq's meta tensors (HQQ, docs/formats.md 5.5). */
NB_INTERNAL nb_status nbio_classify_hqq(nb_ckpt *c, size_t ti);
/* nb_ckpt_layer_weight_v2 for a converted layer (desc filled; out NULL
 * writes nothing). */
NB_INTERNAL nb_status nbio_conv_read(const nb_ckpt *c, const char *prefix, const nbio_conv *cv, int64_t n,
                                     int64_t k, nb_weight_desc *desc, const nb_weight_buffers *out,
                                     const nb_weight_sizes_v2 *cap);

/* checkpoint.c's services to the classifiers. */
NB_INTERNAL const nb_st_tensor *nbio_ck_tensor(const nb_ckpt *c, int64_t j);
NB_INTERNAL int64_t nbio_ck_member(const nb_ckpt *c, const char *prefix, const char *suffix, int *oom);
/* A new layer named by the first plen bytes of `name`; its index in *li. */
NB_INTERNAL nb_status nbio_ck_add_layer(nb_ckpt *c, const char *name, size_t plen, size_t *li);
NB_INTERNAL void nbio_ck_own(nb_ckpt *c, int64_t j, size_t li);
NB_INTERNAL nb_ckpt_layer *nbio_ck_pub(nb_ckpt *c, size_t li);
NB_INTERNAL const char *nbio_ck_prefix(const nb_ckpt *c, size_t li);
NB_INTERNAL void nbio_ck_bad(nb_ckpt *c, size_t li, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
/* Hand cv (malloc'ed) to layer li, which frees it at close. */
NB_INTERNAL void nbio_ck_set_conv(nb_ckpt *c, size_t li, nbio_conv *cv);
NB_INTERNAL const nbio_conv *nbio_ck_conv(const nb_ckpt *c, size_t li);
NB_INTERNAL const nbio_qcfg *nbio_ck_qcfg(const nb_ckpt *c);

/* ------------------------------------------------------------ ckpt_moe.c
 * Expert groups (nibble_io.h, "expert groups"): nb_ckpt_open builds them
 * from the classified layers and the config, and keeps them. */

/* What config.json says of a mixture of experts (top level or text_config). */
typedef struct nbio_moe_cfg {
    int32_t top_k;  /* num_experts_per_tok; 0 when absent */
    float limit;    /* swiglu_limit; 7 when absent */
    float alpha;    /* swiglu_alpha; 1.702 when absent */
    int gpt_oss;    /* model_type "gpt_oss" */
} nbio_moe_cfg;

typedef struct nbio_moe_set nbio_moe_set;
/* The groups of a classified checkpoint (NB_OK unless out of memory). */
NB_INTERNAL nb_status nbio_moe_build(const nb_ckpt *c, const nbio_moe_cfg *cfg, nbio_moe_set **out);
NB_INTERNAL void nbio_moe_free(nbio_moe_set *s);
/* The checkpoint's groups (NULL when it has none). */
NB_INTERNAL const nbio_moe_set *nbio_ck_moe(const nb_ckpt *c);

/* ------------------------------------------------------------ JSON files */

/* dir/name as a JSON object (NULL with NB_OK when the file does not exist);
 * at most max bytes, else NB_ERR_CORRUPT; malformed JSON: NB_ERR_CORRUPT
 * naming the file and the byte. */
NB_INTERNAL nb_status nbio_read_json(const char *dir, const char *name, size_t max, cJSON **out);
/* nbio_read_json of a file that is written out again (config.json): every
 * number is a cJSON raw node holding its text as the file had it (7.0 stays
 * 7.0, not 7), so read numbers from it with nbio_read_json instead. */
NB_INTERNAL nb_status nbio_read_config(const char *dir, const char *name, size_t max, cJSON **out);
/* n bytes of text (not NUL-terminated) as a JSON object; label names it. */
NB_INTERNAL nb_status nbio_parse_json(const char *label, const char *text, size_t n, cJSON **out);
/* Quantization configs (docs/formats.md 2.3, 2.4, 3.3, 3.5) naming nibble as
 * the producer; excl[0..n) is the list of unquantized modules.  NULL only
 * when out of memory (cJSON_Add* then ignore it, and the writer reports it). */
NB_INTERNAL cJSON *nbio_hf_quant_config(const char *const *excl, size_t n, const char *kv_cache_algo);
NB_INTERNAL cJSON *nbio_qc_modelopt(const char *const *excl, size_t n);
NB_INTERNAL cJSON *nbio_qc_quark(const char *mode, const char *const *excl, size_t n);
/* compressed-tensors for weight format f ("<name>-pack-quantized", the
 * preset's arguments from f's row); input_acts 0: weight-only
 * (input_activations null), else the preset's dynamic activation scheme. */
NB_INTERNAL cJSON *nbio_qc_ct(nb_format f, int input_acts, const char *const *ignore, size_t n);
/* compressed-tensors "pack-quantized" for integer format f (int4: asymmetric,
 * int4_sym: symmetric), weight-only; group > 0 is the "group" strategy,
 * NB_CKPT_GROUP_PER_CHANNEL the "channel" one (group_size null). */
NB_INTERNAL cJSON *nbio_qc_ct_int(nb_format f, int32_t group, const char *const *ignore, size_t n);
/* transformers' BitsAndBytesConfig for nf4 / bnb_fp4 weights (4-bit, no
 * double quantization), compute dtype "bfloat16", "float16" or "float32",
 * skip the modules left unquantized. */
NB_INTERNAL cJSON *nbio_qc_bnb(nb_format f, const char *compute_dtype, const char *const *skip, size_t n);
/* transformers' HqqConfig for int4_hqq weights in groups of `group` (4 bits,
 * axis 1), skip_modules from the unquantized modules' names. */
NB_INTERNAL cJSON *nbio_qc_hqq(int32_t group, const char *const *skip, size_t n);

/* ------------------------------------------------------------ ckpt_out.c
 * Writing a checkpoint directory, shared by nb_ckpt_quantize and
 * nb_ckpt_convert.  Crash consistency: every file is written into a staging
 * directory next to OUT ("<parent>/.<OUT>.nibble-staging-XXXXXX", created
 * with its marker "<that>.lock", which the writer holds locked with flock
 * while it runs) and the finished directory is published with one rename
 * over OUT (absent, or an empty directory); so a failure, a signal or
 * SIGKILL at any point leaves OUT as it was or complete, never partial.  A
 * staging directory whose marker is not locked is a killed run's: the next
 * run into the same OUT removes it (only then, and only when it holds
 * nothing but regular files).  Shards are streamed: their header is computed
 * from the tensor list alone (layout of nb_st_write: descending bits per
 * element, then name; header space-padded to a multiple of 8), written
 * first, then the caller pwrites each tensor at its offset and commits
 * (fsync). */

typedef struct nbio_out {
    const char *dir;            /* where files are written: the staging directory */
    char *final;                /* OUT (a symbolic link resolved) */
    char *parent, *base;        /* OUT's directory and name */
    char *stage, *lock;         /* the staging directory and its marker */
    int lock_fd;                /* the marker, locked while this run writes */
    int replace;                /* OUT exists (empty): the rename replaces it */
    unsigned out_mode;          /* its permission bits, given to the published directory */
    char **wm_name, **wm_shard; /* weight map of every committed shard */
    size_t nwm;
    uint64_t data_bytes;        /* tensor bytes written (the index's total_size) */
    uint64_t file_bytes;        /* bytes of the safetensors files written */
    size_t shards, files_copied;
} nbio_out;

/* One output tensor.  The caller fills name (malloc'ed; freed by
 * nbio_oents_free), dtype, rank, shape, bytes and its own src/role/expert;
 * nbio_shard_begin sorts the array into file order and sets bits and off. */
typedef struct nbio_oent {
    char *name;
    nb_st_dtype dtype;
    int rank;
    int64_t shape[NB_ST_MAX_RANK];
    uint64_t bytes, off;
    int bits;
    size_t src;     /* caller's: input tensor index */
    int role;       /* caller's */
    int64_t expert; /* caller's */
} nbio_oent;

typedef struct nbio_shard {
    nbio_out *o;
    const char *name;
    char *path;
    int fd;
    uint64_t base, data_bytes;
} nbio_shard;

/* OUT must not exist or be an empty directory (NB_ERR_INVALID_ARGUMENT
 * otherwise); stale staging directories of OUT are removed, then the
 * staging directory and its marker are created. */
NB_INTERNAL nb_status nbio_out_open(nbio_out *o, const char *out);
/* The end of a run whose status so far is st: when NB_OK, publish the
 * staging directory as OUT (fsync, one rename, fsync of the parent);
 * otherwise, or when publishing fails, remove it.  Frees all; returns the
 * final status. */
NB_INTERNAL nb_status nbio_out_finish(nbio_out *o, nb_status st);

/* Test hook (tests/test_ckpt_crash.c; not reachable through the public
 * API): every step that creates, writes, syncs, renames or removes a file of
 * an output directory runs nbio_fault_step first.  nbio_fault_arm(n, mode)
 * makes the n-th step from then on (n >= 1) fail with NB_ERR_IO
 * (NBIO_FAULT_FAIL) or raise SIGKILL (NBIO_FAULT_KILL); n == 0 only counts.
 * nbio_fault_steps() is the number of steps since arming.  Per thread. */
enum { NBIO_FAULT_FAIL = 1, NBIO_FAULT_KILL = 2 };
NB_INTERNAL void nbio_fault_arm(long n, int mode);
NB_INTERNAL long nbio_fault_steps(void);
NB_INTERNAL nb_status nbio_fault_step(const char *what, const char *path);
/* OUT/name from a cJSON tree (printed, newline-terminated). */
NB_INTERNAL nb_status nbio_out_write_json(nbio_out *o, const char *name, const cJSON *j);
/* Copy every regular file of src_dir except *.safetensors,
 * *.safetensors.index.json, staging markers and the names in
 * skip[0..nskip). */
NB_INTERNAL nb_status nbio_out_copy_others(nbio_out *o, const char *src_dir, const char *const *skip, size_t nskip);
/* OUT/name: {"metadata": {"total_size": ...}, "weight_map": {...}} sorted by name. */
NB_INTERNAL nb_status nbio_out_write_index(nbio_out *o, const char *name);

/* Lay out ents (sorted in place), write the header with meta_src's
 * __metadata__ (plus "format": "pt" when absent; meta_src may be NULL) to
 * the staging directory's <name>, sized for the data. */
NB_INTERNAL nb_status nbio_shard_begin(nbio_out *o, nbio_shard *s, const char *name, const nb_st_file *meta_src,
                                       nbio_oent *ents, size_t ne);
/* n bytes of p at byte `at` of tensor e. */
NB_INTERNAL nb_status nbio_shard_write(nbio_shard *s, const nbio_oent *e, const void *p, size_t n, uint64_t at);
/* All of e's bytes from a read-only file mapping, in chunks, dropping the
 * source pages after each. */
NB_INTERNAL nb_status nbio_shard_copy(nbio_shard *s, const nbio_oent *e, const void *src);
/* fsync and close, add ents to the weight map. */
NB_INTERNAL nb_status nbio_shard_commit(nbio_shard *s, const nbio_oent *ents, size_t ne);
/* Close a shard that was not committed (safe after commit or on a zeroed one). */
NB_INTERNAL void nbio_shard_end(nbio_shard *s);
NB_INTERNAL void nbio_oents_free(nbio_oent *ents, size_t ne);
/* Fill e as a tensor like t (dtype, rank, shape, bytes) named `name` (taken
 * over), made from input tensor src in the caller's role. */
NB_INTERNAL void nbio_oent_like(nbio_oent *e, char *name, const nb_st_tensor *t, size_t src, int role);

/* ------------------------------------------------------------ ckpt_convert.c, ckpt_gguf.c */

/* A "note: " / "warning: " line through o->warn, counted in sum->warnings. */
NB_INTERNAL void nbio_convert_warn(const nb_ckpt_convert_opts *o, nb_ckpt_convert_summary *sum, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
/* The value to store for scale v (named `name`) in a compressed-tensors
 * layer (to_ct) or a ModelOpt one, classified and counted (nibble_io.h, "THE
 * RECIPROCAL TENSOR SCALE"); with o->strict an inexact one is
 * NB_ERR_UNSUPPORTED. */
NB_INTERNAL nb_status nbio_convert_recip(const nb_ckpt_convert_opts *o, nb_ckpt_convert_summary *sum,
                                         const char *name, float v, int to_ct, float *r);
/* The layout a layer of weight format f takes in target t (NB_CKPT_NONE when
 * the target holds no such layer), and the NB_ERR_UNSUPPORTED failure that
 * says so ("<what>; the quark layout holds MXFP4 only"). */
NB_INTERNAL nb_ckpt_format nbio_target_layout(nb_ckpt_target t, nb_format f);
NB_INTERNAL nb_status nbio_target_refuses(nb_ckpt_target t, const char *what);
/* A format's name in capitals ("NVFP4"), as messages about layouts say it. */
NB_INTERNAL void nbio_format_upper(nb_format f, char *buf, size_t n);
/* 1 when `path` is a readable file starting with "GGUF". */
NB_INTERNAL int nbio_is_gguf(const char *path);
/* nb_ckpt_convert for a GGUF file (summary already zeroed or NULL). */
NB_INTERNAL nb_status nbio_convert_gguf(const char *in, const char *out, const nb_ckpt_convert_opts *opts,
                                        nb_ckpt_convert_summary *summary);
/* Reserved fields of an input struct must be zero (nibble_io.h). */
NB_INTERNAL int nbio_reserved_zero(const int32_t *r, size_t n);

#endif
