/* fuzz_config.c - libFuzzer target for the JSON readers next to the
 * tensors: the sharded index (model.safetensors.index.json rules that need
 * no shard) and the quantization configs (hf_quant_config.json, config.json:
 * declared format and exclude lists, with "re:" regexes compiled and matched).
 *
 * The first byte picks the reader (0: config.json, 1: hf_quant_config.json,
 * 2: the index, 3: both configs split at the first NUL byte, 4: a tuning
 * cache of `nibble tune`, src/tune.c; other values as their low two bits);
 * the rest is the text.  A failure must come with a message; an accepted
 * config is matched against a few layer prefixes.
 *
 * Build and run: make fuzz (all targets), or
 *   CC=clang cmake -S . -B build-fuzz -DNB_FUZZ=ON -DNB_CUDA=OFF
 *   cmake --build build-fuzz --target fuzz_config
 *   build-fuzz/fuzz_config CORPUS_DIR   (seeds: tests/corpus/config/) */
#include "internal.h"    /* nbi_tune_parse: src/tune.c is compiled into this target */
#include "io_internal.h" /* the in-memory readers: src/io is compiled in too */

#include <stdint.h>
#include <string.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (size < 1) return 0;
    const char *text = (const char *)data + 1;
    size_t n = size - 1;
    nb_status st;
    static const char *const prefixes[4] = {"lm_head", "model.layers.0.mlp.gate", "model.layers.12.self_attn.q_proj",
                                            "model.embed_tokens"};
    int ex[4];
    if ((data[0] & 7) == 4) {
        nbi_tune_table *t = NULL;
        char terr[NB_ERRBUF] = "";
        st = nbi_tune_parse(text, n, "fuzz.json", &t, terr);
        if ((st == NB_OK) != (t != NULL) || (st != NB_OK && terr[0] == 0)) __builtin_trap();
        nbi_tune_table_free(t);
        return 0;
    }
    nbi_fail(NULL, NB_OK, "%s", ""); /* clear the thread's message: a failure must write its own */
    switch (data[0] & 3) {
    case 2: {
        size_t nt = 0, ns = 0;
        st = nbio_st_index_check_memory(text, n, "fuzz.index.json", &nt, &ns);
        if (st == NB_OK && ns > nt) __builtin_trap(); /* every shard holds a listed tensor */
        break;
    }
    case 3: {
        const char *z = (const char *)memchr(text, 0, n);
        size_t a = z ? (size_t)(z - text) : n;
        st = nbio_ckpt_config_check_memory(text, a, z ? z + 1 : NULL, z ? n - a - 1 : 0, prefixes, 4, ex);
        break;
    }
    default:
        st = (data[0] & 3) == 1 ? nbio_ckpt_config_check_memory(text, n, NULL, 0, prefixes, 4, ex)
                                : nbio_ckpt_config_check_memory(NULL, 0, text, n, prefixes, 4, ex);
    }
    if (st != NB_OK && nb_last_error()[0] == 0) __builtin_trap(); /* a failure must explain itself */
    return 0;
}
