/* fuzz_quantize.c - libFuzzer target for `nibble quantize` (nb_ckpt_quantize,
 * src/io/ckpt_quantize.c) on the CPU: a fuzzed single-file checkpoint and
 * config.json written to a private directory in /dev/shm (else /tmp),
 * quantized into another, and the output read back.
 *
 * Input: one byte of options (bits 0-2: the format, NVFP4 MXFP4 INT4
 * INT4_SYM INT8 NF4 BNB_FP4 INT4_HQQ; bit 3: MXFP4's ROUND_UP rule; bit 4:
 * the MSE method for the FP4 formats, hqq's optimizer for INT4_HQQ; bit 5:
 * per-layer NVFP4 tensor scales; bit 6: copy a checkpoint with nothing to
 * quantize; bit 7: group (block) 32 for the integer and table formats), a little-endian 16-bit length of config.json (0: absent), its
 * text, then the safetensors image.  Invariants, each a trap that libFuzzer
 * reports as a crash (with the line): a failure writes a message; an
 * output opens again (nb_ckpt_open); when the input held no layer of the
 * output's layout and no inconsistent one, the output holds no
 * inconsistent layer and its layers of that layout read
 * (nb_ckpt_layer_weight_v2): the quantizer wrote them all.
 *
 * Build and run: make fuzz (all targets), or
 *   CC=clang cmake -S . -B build-fuzz -DNB_FUZZ=ON -DNB_CUDA=OFF
 *   cmake --build build-fuzz --target fuzz_quantize
 *   build-fuzz/fuzz_quantize -dict=tests/corpus/safetensors.dict CORPUS_DIR
 * (seeds: tests/corpus/quantize/, BF16 checkpoints of the unit tests). */
#define _GNU_SOURCE /* mkdtemp, nftw */
#include "internal.h"    /* nbi_fail: libnibble's C sources are compiled into this target */
#include "io_internal.h" /* nbio_ckpt_open_memory */
#include "nibble_io.h"

#include <fcntl.h>
#include <ftw.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

#define TRAP() (fprintf(stderr, "fuzz_quantize: invariant at line %d broken (last error: %s)\n", __LINE__, \
                        nb_last_error()), __builtin_trap())

static char g_root[64]; /* /dev/shm/nbfq.XXXXXX, made once */

static int rm_entry(const char *path, const struct stat *sb, int flag, struct FTW *ftw) {
    (void)sb, (void)flag, (void)ftw;
    return remove(path);
}

static void remove_root(void) { nftw(g_root, rm_entry, 8, FTW_DEPTH | FTW_PHYS); }

/* dir/name := bytes; 0 on success */
static int put(const char *dir, const char *name, const void *p, size_t n) {
    char path[256];
    snprintf(path, sizeof path, "%s/%s", dir, name);
    const int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC, 0644);
    if (fd < 0) return -1;
    const ssize_t w = n ? write(fd, p, n) : 0;
    close(fd);
    return w == (ssize_t)n ? 0 : -1;
}

/* The checkpoint layout each format is written in. */
static nb_ckpt_format layout_of(nb_format f) {
    switch (f) {
    case NB_FORMAT_NVFP4: return NB_CKPT_MODELOPT_NVFP4;
    case NB_FORMAT_MXFP4: return NB_CKPT_QUARK_MXFP4;
    case NB_FORMAT_INT4: return NB_CKPT_CT_INT4;
    case NB_FORMAT_INT4_SYM: return NB_CKPT_CT_INT4_SYM;
    case NB_FORMAT_NF4: return NB_CKPT_BNB_NF4;
    case NB_FORMAT_BNB_FP4: return NB_CKPT_BNB_FP4;
    case NB_FORMAT_INT4_HQQ: return NB_CKPT_HQQ_INT4;
    default: return NB_CKPT_CT_INT8;
    }
}

static size_t count_layout(const nb_ckpt *c, nb_ckpt_format f) {
    size_t nl = 0, n = 0;
    nb_ckpt_layer_count(c, &nl);
    for (size_t i = 0; i < nl; i++) {
        nb_ckpt_layer L;
        if (nb_ckpt_layer_at(c, i, &L) == NB_OK && L.format == f) n++;
    }
    return n;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (size < 3) return 0;
    static const nb_format fmts[8] = {NB_FORMAT_NVFP4, NB_FORMAT_MXFP4, NB_FORMAT_INT4,    NB_FORMAT_INT4_SYM,
                                      NB_FORMAT_INT8,  NB_FORMAT_NF4,   NB_FORMAT_BNB_FP4, NB_FORMAT_INT4_HQQ};
    const uint8_t o = data[0];
    const size_t cl = (size_t)data[1] | (size_t)data[2] << 8;
    if (cl > size - 3) return 0;
    const uint8_t *cfg = data + 3, *img = data + 3 + cl;
    const size_t ni = size - 3 - cl;
    if (!g_root[0]) {
        snprintf(g_root, sizeof g_root, "/dev/shm/nbfq.XXXXXX"); /* memory-backed; else /tmp */
        if (!mkdtemp(g_root)) {
            snprintf(g_root, sizeof g_root, "/tmp/nbfq.XXXXXX");
            if (!mkdtemp(g_root)) abort();
        }
        atexit(remove_root);
    }
    char in[128], out[128];
    snprintf(in, sizeof in, "%s/in", g_root);
    snprintf(out, sizeof out, "%s/out", g_root);
    nftw(in, rm_entry, 8, FTW_DEPTH | FTW_PHYS);
    nftw(out, rm_entry, 8, FTW_DEPTH | FTW_PHYS);
    if (mkdir(in, 0755) || put(in, "model.safetensors", img, ni) || (cl && put(in, "config.json", cfg, cl))) abort();

    const nb_format f = fmts[o & 7];
    const nb_ckpt_format lay = layout_of(f);
    /* layers of the output's layout and inconsistent ones in the input
     * (SIZE_MAX: it does not open as a checkpoint) */
    size_t had = SIZE_MAX, had_bad = SIZE_MAX;
    nb_ckpt *ci = NULL;
    if (nbio_ckpt_open_memory(img, ni, cl ? (const char *)cfg : NULL, cl, NULL, 0, &ci) == NB_OK) {
        had = count_layout(ci, lay);
        had_bad = count_layout(ci, NB_CKPT_INCONSISTENT);
        nb_ckpt_close(ci);
    }
    nb_ckpt_quantize_opts opts;
    nb_ckpt_quantize_opts_init(&opts);
    opts.format = f;
    opts.device = NB_CKPT_DEVICE_CPU;
    opts.mx_rule = (o & 8) ? NB_MX_SCALE_ROUND_UP : NB_MX_SCALE_EVEN;
    const int fp4 = f == NB_FORMAT_NVFP4 || f == NB_FORMAT_MXFP4;
    opts.method = !(o & 16) ? NB_QUANT_RTN : fp4 ? NB_QUANT_MSE : f == NB_FORMAT_INT4_HQQ ? NB_QUANT_HQQ : NB_QUANT_RTN;
    opts.fused_scales = (o & 32) ? 0 : 1;
    opts.allow_empty = (o & 64) ? 1 : 0;
    opts.group_size = !fp4 && (o & 128) ? 32 : 0;
    nb_ckpt_quantize_summary sum;
    nbi_fail(NULL, NB_OK, "%s", "");
    const nb_status st = nb_ckpt_quantize(in, out, &opts, &sum);
    if (st != NB_OK) {
        if (nb_last_error()[0] == 0) TRAP();
        return 0;
    }
    nb_ckpt *c = NULL;
    if (nb_ckpt_open(out, &c) != NB_OK) TRAP(); /* the quantizer's own output reads back */
    if (had == 0 && had_bad == 0) { /* every layer of the layout is the quantizer's */
        size_t nl = 0;
        nb_ckpt_layer_count(c, &nl);
        for (size_t i = 0; i < nl; i++) {
            nb_ckpt_layer L;
            if (nb_ckpt_layer_at(c, i, &L) != NB_OK || L.format == NB_CKPT_INCONSISTENT) TRAP();
            nb_weight_desc d;
            if (L.format == lay && nb_ckpt_layer_weight_v2(c, i, 0, &d, NULL, NULL) != NB_OK) TRAP();
        }
    }
    nb_ckpt_close(c);
    return 0;
}
