/* fuzz_safetensors.c - libFuzzer target for the safetensors reader.
 *
 * Each input is a whole file image, validated in memory (nb_st_open_memory,
 * no copy), so AddressSanitizer flags any read past the input exactly.  When
 * the reader accepts an input, every tensor is looked up by index and by
 * name, its first and last data bytes are read, and its range is checked to
 * lie inside the image; metadata is walked the same way.  A broken invariant
 * traps, which libFuzzer reports as a crash.
 *
 * Build and run: make fuzz (FUZZ_SECONDS=120 by default), or
 *   CC=clang cmake -S . -B build-fuzz -DNB_FUZZ=ON -DNB_CUDA=OFF
 *   cmake --build build-fuzz --target fuzz_safetensors
 *   build-fuzz/fuzz_safetensors -dict=tests/corpus/safetensors.dict CORPUS_DIR */
#include "internal.h" /* nbi_fail: libnibble's C sources are compiled into this target */
#include "nibble_io.h"

#include <stdint.h>
#include <string.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    nb_st_file *f = NULL;
    nbi_fail(NULL, NB_OK, "%s", ""); /* clear the thread's message: a failure must write its own */
    if (nb_st_open_memory(data, size, "fuzz", &f) != NB_OK) {
        if (f != NULL || nb_last_error()[0] == 0) __builtin_trap(); /* a failure must explain itself */
        return 0;
    }
    size_t n = 0, nm = 0;
    nb_st_count(f, &n);
    volatile unsigned sink = 0;
    for (size_t i = 0; i < n; i++) {
        nb_st_tensor t, u;
        if (nb_st_tensor_at(f, i, &t) != NB_OK) __builtin_trap();
        if (nb_st_tensor_find(f, t.name, &u) != NB_OK || u.data != t.data) __builtin_trap();
        const uint8_t *p = (const uint8_t *)t.data;
        if (p < data || p > data + size || t.bytes > (size_t)(data + size - p)) __builtin_trap();
        if (t.rank < 0 || t.rank > NB_ST_MAX_RANK) __builtin_trap();
        if (t.bytes) sink += p[0] + p[t.bytes - 1];
        sink += (unsigned)strlen(t.name);
    }
    nb_st_metadata_count(f, &nm);
    for (size_t i = 0; i < nm; i++) {
        const char *k, *v, *w;
        if (nb_st_metadata_at(f, i, &k, &v) != NB_OK) __builtin_trap();
        if (nb_st_metadata_get(f, k, &w) != NB_OK || w != v) __builtin_trap();
        sink += (unsigned)strlen(v);
    }
    (void)sink;
    nb_st_close(f);
    return 0;
}
