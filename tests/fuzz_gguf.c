/* fuzz_gguf.c - libFuzzer target for the GGUF reader and FP4 import.
 *
 * Each input is a whole file image validated in memory (nb_gguf_open_memory,
 * no copy), so AddressSanitizer flags any read past it exactly.  When the
 * reader accepts an input, every key and tensor is walked, every tensor's
 * range is checked to lie inside the image and its first and last bytes are
 * read, and every MXFP4 / NVFP4 tensor (up to 1 MiB of codes) is imported
 * into the checkpoint layout for each expert.  A broken invariant traps.
 *
 * Build and run: make fuzz (all targets), or
 *   CC=clang cmake -S . -B build-fuzz -DNB_FUZZ=ON -DNB_CUDA=OFF
 *   cmake --build build-fuzz --target fuzz_gguf
 *   build-fuzz/fuzz_gguf CORPUS_DIR   (seeds: tests/corpus/gguf/) */
#include "internal.h" /* nbi_fail: libnibble's C sources are compiled into this target */
#include "nibble_io.h"

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    nb_gguf_file *g = NULL;
    nbi_fail(NULL, NB_OK, "%s", ""); /* clear the thread's message: a failure must write its own */
    if (nb_gguf_open_memory(data, size, "fuzz", &g) != NB_OK) {
        if (g != NULL || nb_last_error()[0] == 0) __builtin_trap(); /* a failure must explain itself */
        return 0;
    }
    nb_gguf_header h;
    if (nb_gguf_get_header(g, &h) != NB_OK || (h.n_tensors && h.data_offset > size)) __builtin_trap();
    volatile unsigned sink = 0;
    for (size_t i = 0; i < h.n_kv; i++) {
        nb_gguf_kv kv;
        if (nb_gguf_kv_at(g, i, &kv) != NB_OK) __builtin_trap();
        if (kv.data < data || kv.data > data + size || kv.bytes > (uint64_t)(data + size - kv.data)) __builtin_trap();
        if (kv.bytes) sink += kv.data[0] + kv.data[kv.bytes - 1];
        if (kv.str) sink += (unsigned)strlen(kv.str);
    }
    for (size_t i = 0; i < h.n_tensors; i++) {
        nb_gguf_tensor t;
        size_t j;
        if (nb_gguf_tensor_at(g, i, &t) != NB_OK || nb_gguf_tensor_find(g, t.name, &j) != NB_OK || j != i)
            __builtin_trap();
        const uint8_t *p = (const uint8_t *)t.data;
        if (p < data || p > data + size || t.bytes > (uint64_t)(data + size - p)) __builtin_trap();
        if (t.bytes) sink += p[0] + p[t.bytes - 1];
        nb_gguf_fp4 f;
        if (nb_gguf_fp4_info(g, i, &f) != NB_OK) continue;
        if (f.codes_bytes > (1u << 20)) continue;
        uint8_t *c = (uint8_t *)malloc(f.codes_bytes + 1), *s = (uint8_t *)malloc(f.scales_bytes + 1);
        for (int64_t e = 0; e < (f.experts ? f.experts : 1) && e < 4; e++) {
            nb_weight_desc d;
            nb_status st = nb_gguf_fp4_to_checkpoint(g, i, e, &d, c, f.codes_bytes, s, f.scales_bytes, NULL);
            if (st != NB_OK && st != NB_ERR_UNSUPPORTED) __builtin_trap();
            if (st == NB_OK && f.codes_bytes) sink += c[0] + c[f.codes_bytes - 1] + s[0];
        }
        free(c);
        free(s);
    }
    (void)sink;
    nb_gguf_close(g);
    return 0;
}
