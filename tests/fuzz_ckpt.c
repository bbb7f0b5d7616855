/* fuzz_ckpt.c - libFuzzer target for checkpoint classification and reading
 * (src/io/checkpoint.c, ckpt_int.c, ckpt_moe.c): what nb_ckpt_open does
 * after the safetensors reader, on a single-file checkpoint held in memory
 * (nbio_ckpt_open_memory), with its config.json and hf_quant_config.json.
 *
 * Input: two little-endian 16-bit lengths (config.json, hf_quant_config.json;
 * 0: the file is absent), those texts, then the safetensors image.  When the
 * checkpoint opens, every query runs: the config and its exclude entries,
 * every tensor by index and by name, every layer (its zero-copy weight for
 * the first and last expert, its converted weight read into buffers of the
 * sizes the function asks for, its k permutation), every expert group (its
 * nb_moe_desc, an expert's weight, the zero-copy and copied weights of each
 * projection).  Invariants, each a trap that libFuzzer reports as a crash (with the line):
 * a failure writes a message; a zero-copy pointer and the bytes its
 * descriptor implies lie inside the image; a copy never writes past the
 * buffers (ASan), which are sized exactly as asked.
 *
 * Build and run: make fuzz (all targets), or
 *   CC=clang cmake -S . -B build-fuzz -DNB_FUZZ=ON -DNB_CUDA=OFF
 *   cmake --build build-fuzz --target fuzz_ckpt
 *   build-fuzz/fuzz_ckpt -dict=tests/corpus/safetensors.dict CORPUS_DIR
 * (seeds: tests/corpus/ckpt/, the test fixtures' small checkpoints). */
#include "internal.h"    /* nbi_fail: libnibble's C sources are compiled into this target */
#include "io_internal.h" /* nbio_ckpt_open_memory */
#include "nibble_io.h"

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

/* A broken invariant: the line and the library's last message, then a trap. */
#define TRAP() (fprintf(stderr, "fuzz_ckpt: invariant at line %d broken (last error: %s)\n", __LINE__, \
                        nb_last_error()), __builtin_trap())

static const uint8_t *g_lo, *g_hi; /* the safetensors image */

/* A failure must explain itself. */
static void failed_ok(nb_status st) {
    if (st != NB_OK && nb_last_error()[0] == 0) TRAP();
}

static void clear_error(void) { nbi_fail(NULL, NB_OK, "%s", ""); }

/* bytes at p lie inside the image (p NULL only with 0 bytes) */
static void inside(const uint8_t *p, size_t bytes) {
    if (!bytes) return;
    if (!p || p < g_lo || p > g_hi || bytes > (size_t)(g_hi - p)) TRAP();
}

/* A zero-copy weight: its codes and scales within the image. */
static void check_zero_copy(nb_status st, const nb_weight_desc *d, const uint8_t *codes, const uint8_t *scales,
                            int64_t experts) {
    failed_ok(st);
    if (st != NB_OK) return;
    nb_weight_sizes_v2 sz;
    if (nb_weight_get_sizes_v2(d, &sz) != NB_OK) TRAP(); /* a descriptor it hands out is valid */
    const size_t e = experts > 0 ? (size_t)experts : 1;
    if (sz.codes_bytes && e > SIZE_MAX / sz.codes_bytes) TRAP();
    if (sz.scales_bytes && e > SIZE_MAX / sz.scales_bytes) TRAP();
    inside(codes, sz.codes_bytes * e);
    inside(scales, sz.scales_bytes * e);
}

/* Buffers of the sizes a descriptor asks for (times `copies`), or 0 when
 * they would be too large for a fuzz run (1 << 26 bytes in all). */
static int alloc_buffers(const nb_weight_desc *d, size_t copies, nb_weight_buffers *b, nb_weight_sizes_v2 *cap) {
    nb_weight_sizes_v2 sz;
    memset(b, 0, sizeof *b);
    memset(cap, 0, sizeof *cap);
    if (nb_weight_get_sizes_v2(d, &sz) != NB_OK) return 0;
    const size_t lim = (size_t)1 << 26;
    if (copies == 0 || sz.codes_bytes > lim / copies || sz.scales_bytes > lim / copies || sz.zeros_bytes > lim / copies)
        return 0;
    cap->codes_bytes = sz.codes_bytes * copies;
    cap->scales_bytes = sz.scales_bytes * copies;
    cap->zeros_bytes = sz.zeros_bytes * copies;
    if (cap->codes_bytes + cap->scales_bytes + cap->zeros_bytes > lim) return 0;
    b->codes = malloc(cap->codes_bytes ? cap->codes_bytes : 1);
    b->scales = malloc(cap->scales_bytes ? cap->scales_bytes : 1);
    b->zeros = sz.zeros_bytes ? malloc(cap->zeros_bytes) : NULL;
    if (!b->codes || !b->scales || (sz.zeros_bytes && !b->zeros)) {
        free(b->codes), free(b->scales), free(b->zeros);
        return 0;
    }
    return 1;
}

static void free_buffers(nb_weight_buffers *b) { free(b->codes), free(b->scales), free(b->zeros); }

static void walk_layer(const nb_ckpt *c, size_t i) {
    nb_ckpt_layer L;
    if (nb_ckpt_layer_at(c, i, &L) != NB_OK || !L.prefix) TRAP();
    size_t j = SIZE_MAX;
    if (nb_ckpt_layer_find(c, L.prefix, &j) != NB_OK || j > i) TRAP();
    if (j != i) { /* a prefix two layers share: both inconsistent */
        nb_ckpt_layer M;
        if (nb_ckpt_layer_at(c, j, &M) != NB_OK || strcmp(M.prefix, L.prefix) || L.format != NB_CKPT_INCONSISTENT ||
            M.format != NB_CKPT_INCONSISTENT)
            TRAP();
    }
    const int64_t ne = L.experts > 0 ? L.experts : 1;
    const int64_t tries[2] = {0, ne - 1};
    for (int t = 0; t < (ne > 1 ? 2 : 1); t++) {
        nb_weight_desc d;
        const uint8_t *codes = NULL, *scales = NULL;
        clear_error();
        check_zero_copy(nb_ckpt_layer_weight(c, i, tries[t], &d, &codes, &scales), &d, codes, scales, 1);
    }
    clear_error();
    nb_status st = nb_ckpt_layer_weight(c, i, ne, &(nb_weight_desc){0}, &(const uint8_t *){0}, &(const uint8_t *){0});
    if (st == NB_OK) TRAP(); /* an expert out of range */
    failed_ok(st);
    /* the converted weight: sizes first, then the copy */
    nb_weight_desc d;
    clear_error();
    st = nb_ckpt_layer_weight_v2(c, i, 0, &d, NULL, NULL);
    failed_ok(st);
    if (st == NB_OK) {
        nb_weight_buffers b;
        nb_weight_sizes_v2 cap;
        if (alloc_buffers(&d, 1, &b, &cap)) {
            clear_error();
            failed_ok(nb_ckpt_layer_weight_v2(c, i, 0, &d, &b, &cap));
            free_buffers(&b);
        }
        if (L.k > 0 && L.k <= (1 << 20)) {
            int32_t *perm = (int32_t *)malloc((size_t)L.k * sizeof *perm);
            if (perm) {
                clear_error();
                st = nb_ckpt_layer_perm(c, i, perm, (size_t)L.k);
                failed_ok(st);
                if (st == NB_OK) /* a permutation of 0..k-1 */
                    for (int64_t a = 0; a < L.k; a++)
                        if (perm[a] < 0 || perm[a] >= L.k) TRAP();
                free(perm);
            }
        }
    }
    int64_t group = -2, expert = -2;
    nb_ckpt_moe_proj proj;
    clear_error();
    st = nb_ckpt_layer_moe(c, i, &group, &proj, &expert);
    failed_ok(st);
}

static void walk_group(const nb_ckpt *c, size_t i) {
    nb_ckpt_moe g;
    if (nb_ckpt_moe_at(c, i, &g) != NB_OK || !g.prefix) TRAP();
    size_t j = SIZE_MAX;
    if (nb_ckpt_moe_find(c, g.prefix, &j) != NB_OK || j != i) TRAP();
    nb_moe_desc md;
    clear_error();
    failed_ok(nb_ckpt_moe_desc(c, i, 1, 0, NB_DTYPE_BF16, &md));
    clear_error();
    failed_ok(nb_ckpt_moe_desc(c, i, 4, 1, NB_DTYPE_F16, &md));
    static const nb_ckpt_moe_proj projs[4] = {NB_CKPT_MOE_GATE_UP, NB_CKPT_MOE_DOWN, NB_CKPT_MOE_GATE,
                                              NB_CKPT_MOE_UP};
    const int64_t ne = g.experts > 0 ? g.experts : 1;
    for (int p = 0; p < 4; p++) {
        nb_weight_desc d;
        const uint8_t *codes = NULL, *scales = NULL;
        clear_error();
        check_zero_copy(nb_ckpt_moe_expert(c, i, projs[p], ne - 1, &d, &codes, &scales), &d, codes, scales, 1);
        clear_error();
        check_zero_copy(nb_ckpt_moe_weights(c, i, projs[p], &d, &codes, &scales), &d, codes, scales, ne);
        clear_error();
        nb_status st = nb_ckpt_moe_read(c, i, projs[p], &d, NULL, NULL, NULL, 0);
        failed_ok(st);
        if (st != NB_OK || ne > 4096) continue;
        float *ts = (float *)malloc((size_t)ne * sizeof *ts);
        nb_weight_buffers b;
        nb_weight_sizes_v2 cap;
        if (ts && alloc_buffers(&d, (size_t)ne, &b, &cap)) {
            clear_error();
            failed_ok(nb_ckpt_moe_read(c, i, projs[p], &d, &b, &cap, ts, (size_t)ne));
            free_buffers(&b);
        }
        free(ts);
    }
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (size < 4) return 0;
    const size_t cl = (size_t)data[0] | (size_t)data[1] << 8, hl = (size_t)data[2] | (size_t)data[3] << 8;
    if (cl + hl > size - 4) return 0;
    const char *cfg = cl ? (const char *)data + 4 : NULL, *hf = hl ? (const char *)data + 4 + cl : NULL;
    g_lo = data + 4 + cl + hl;
    g_hi = data + size;
    nb_ckpt *c = NULL;
    clear_error();
    nb_status st = nbio_ckpt_open_memory(g_lo, (size_t)(g_hi - g_lo), cfg, cl, hf, hl, &c);
    if (st != NB_OK) {
        if (c != NULL) TRAP();
        failed_ok(st);
        return 0;
    }
    nb_ckpt_config conf;
    if (nb_ckpt_get_config(c, &conf) != NB_OK) TRAP();
    for (size_t i = 0; i < conf.nexclude; i++) {
        const char *pat = NULL, *where = NULL;
        int usable = -1;
        if (nb_ckpt_exclude_at(c, i, &pat, &where, &usable) != NB_OK || !pat) TRAP();
    }
    size_t nt = 0, nl = 0, ng = 0;
    if (nb_ckpt_tensor_count(c, &nt) != NB_OK || nb_ckpt_layer_count(c, &nl) != NB_OK ||
        nb_ckpt_moe_count(c, &ng) != NB_OK)
        TRAP();
    for (size_t i = 0; i < nt; i++) {
        nb_st_tensor t;
        int64_t layer = -2;
        size_t j = SIZE_MAX;
        if (nb_ckpt_tensor_at(c, i, &t, &layer) != NB_OK || layer < -1 || layer >= (int64_t)nl) TRAP();
        if (nb_ckpt_tensor_find(c, t.name, &j) != NB_OK || j != i) TRAP();
        inside((const uint8_t *)t.data, t.bytes);
    }
    for (size_t i = 0; i < nl; i++) walk_layer(c, i);
    for (size_t i = 0; i < ng; i++) walk_group(c, i);
    nb_ckpt_close(c);
    return 0;
}
