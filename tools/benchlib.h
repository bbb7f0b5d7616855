/* benchlib.h - what `nibble bench` and `nibble tune` share: random layers
 * and activations, rotated weight copies past L2, CUDA-graph timing with
 * events.  Built with CUDA only (both commands need a GPU).
 *
 * Timing method (bench.c's, used by both): every timed region is a CUDA
 * graph of back-to-back calls, each call on the next of `rot` packed copies
 * of the weights (together more than min-bytes, several times L2, so each
 * call reads cold weights as a model's layers do); one warm-up replay, then
 * the median of `reps` replays measured with CUDA events. */
#ifndef NB_TOOLS_BENCHLIB_H
#define NB_TOOLS_BENCHLIB_H

#include "args.h"
#include "nibble.h"

#include <cuda_runtime.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

/* The command name in failure messages ("nibble bench"). */
extern const char *nbt_tool;

#define CK(call)                                                                                   \
    do {                                                                                           \
        cudaError_t e_ = (call);                                                                   \
        if (e_ != cudaSuccess) {                                                                   \
            fprintf(stderr, "%s: %s failed: %s\n", nbt_tool, #call, cudaGetErrorString(e_));      \
            exit(3);                                                                               \
        }                                                                                          \
    } while (0)
#define NB(call)                                                                                   \
    do {                                                                                           \
        nb_status s_ = (call);                                                                     \
        if (s_ != NB_OK) {                                                                         \
            fprintf(stderr, "%s: %s: %s\n", nbt_tool, nb_status_name(s_), nb_last_error());       \
            exit(3);                                                                               \
        }                                                                                          \
    } while (0)

/* calloc that exits 3 with a message when host memory runs out. */
void *nbt_calloc(size_t count, size_t size);

/* Deterministic data (xorshift; the same sequence on every machine). */
uint32_t nbt_rand(void);
/* 16-bit storage of float v (round to nearest even) and back. */
uint16_t nbt_bf16(float v);
float nbt_float_of(nb_dtype t, uint16_t h);
/* count random activations in (-1, 1), BF16 or FP16 (FP16 on a 1/1024 grid). */
uint16_t *nbt_random_activations(nb_dtype t, size_t count);
/* The same in device memory (cudaFree it). */
void *nbt_device_activations(nb_dtype t, size_t count);

/* A random layer k -> n in `fmt` on the device: checkpoint codes and scales
 * (dc, ds; desc) and `rot` packed copies (pk; packed is the descriptor
 * nb_pack left), at least two and together at least min_mb megabytes.  The
 * scales span a few binades of the format's scale type; a format with a
 * tensor scale gets 0.0087 (a typical NVFP4 weight_scale_2); 16-bit scales
 * 2^-8 .. 2^-5 and zero points 0..15 (int4); F32 absmax 2^-7 .. 2^-3 (nf4,
 * bnb_fp4). */
typedef struct nbt_layer {
    nb_weight_desc desc, packed;
    nb_weight_sizes_v2 sz;
    uint8_t *dc, *ds, *dz; /* dz: zero points (int4), else NULL */
    uint8_t *hc, *hs, *hz; /* the same on the host */
    void **pk;
    int rot;
} nbt_layer;
void nbt_layer_make(nb_context *ctx, nb_format fmt, int64_t n, int64_t k, double min_mb, cudaStream_t s,
                    nbt_layer *out);
void nbt_layer_free(nbt_layer *l);

/* Calls per graph: about target_us of work (an estimate at 600 TFLOP/s or
 * 3 TB/s, whichever is slower), clamped to [lo, hi], rounded up to whole
 * passes over the rot copies. */
int nbt_graph_calls(int64_t m, int64_t n, int64_t k, size_t weight_bytes, int rot, double target_us, int lo, int hi);
/* Median microseconds per call of a captured graph of `calls` calls.
 * With nbt_sustain_s > 0 the graph first replays that many seconds
 * without a pause (the clocks of sustained work: NOTES.md, "Calls per
 * replay, and the power limit"). */
double nbt_time_graph(cudaGraphExec_t exec, cudaStream_t s, int calls, int reps);
extern double nbt_sustain_s; /* --sustain; 0: none */
/* Ends the capture begun on s (cudaStreamBeginCapture), instantiates the
 * graph, times it as nbt_time_graph does and frees it: median us per call. */
double nbt_time_capture(cudaStream_t s, int calls, int reps);
/* nb_gemm on the layer's rotated copies, `calls` per graph: median us per call. */
double nbt_time_gemm(nb_context *ctx, const nb_gemm_desc *g, const nb_gemm_config *cfg, const void *x,
                     const nbt_layer *l, void *y, void *ws, size_t ws_bytes, cudaStream_t s, int calls, int reps);

/* A small kernel after every timed call (cuBLAS: 4096 floats scaled by
 * one, launched without programmatic dependent launch), as a model step's
 * norms and activations sit between its linears.  Back to back, a call of
 * the same plan can start while the one before ends (programmatic
 * dependent launch), which a model step does not give: a plan that leaves
 * SM slots free for it is credited with the overlap (NOTES.md, "Kernel 2's
 * split at 5..8 tokens, and kernel 1 at 2..8 tokens").  nbt_between_init
 * sets it up on stream s and times it alone (alone_us); the programs that
 * use it link cuBLAS. */
typedef struct nbt_between {
    void *blas;      /* cublasHandle_t */
    float *scratch;  /* the 4096 floats, on the device */
    double alone_us; /* one such kernel in a graph of them */
} nbt_between;
void nbt_between_init(nbt_between *b, cudaStream_t s);
void nbt_between_free(nbt_between *b);
/* One such kernel on b's stream (captured into the graph being built). */
void nbt_between_kernel(const nbt_between *b);
/* Us per call as nbt_time_gemm times it, or with b (not NULL) each call
 * followed by b's kernel, whose time alone is taken off. */
double nbt_time_gemm_after(nb_context *ctx, const nb_gemm_desc *g, const nb_gemm_config *cfg, const void *x,
                           const nbt_layer *l, void *y, void *ws, size_t ws_bytes, cudaStream_t s, int calls,
                           int reps, const nbt_between *b);

/* Candidate output a against a reference b of the same problem (the
 * heuristic's; largest |b|: big), element by element within two units in
 * the last place of the output type plus 2^-12 big (2^-7 big with rounded:
 * an integer or table format, whose tensor-core and decode kernels round
 * the weights differently): 1, or 0 with the first element apart in why. */
int nbt_same_output(nb_dtype t, const uint16_t *a, const uint16_t *b, size_t count, float big, int rounded,
                    char *why, size_t wn);
/* A configuration as text ("decode staged rpw=2 splits=4", "tc bn=32 splits=3 raster=16"). */
void nbt_config_text(const nb_gemm_config *c, char *buf, size_t n);

/* The options both commands take: --shapes KxN,... --m LIST --formats
 * nvfp4,mxfp4 (names of formats with GPU kernels, nb_format_from_name)
 * --min-bytes MB, --sustain SECONDS (nbt_sustain_s, 0..60) and a dtype
 * option (bench --dtype, tune --act). */
#define NBT_MAX_FORMATS 16 /* formats in one --formats list */
#define NBT_SWEEP_OPTS 6   /* entries nbt_sweep_opts fills */
typedef struct nbt_sweep {
    const char *shapes, *m, *formats, *act_name; /* as given (the caller sets defaults) */
    double min_mb;
    /* filled by nbt_sweep_parse */
    nb_dtype act;
    int64_t ms[64], kn[64], mmax; /* kn: K, N pairs */
    int nm, nkn, nf;
    nb_format fmts[NBT_MAX_FORMATS];
} nbt_sweep;
/* Those options as entries of the command's table (args.h; act_flag names
 * the dtype one). */
void nbt_sweep_opts(nbt_sweep *sw, const char *act_flag, struct nba_opt *out);
/* Read the lists (m in 1..16384) and the dtype: 1, or 0 after a usage
 * message naming the option of command `cmd` ("bench"). */
int nbt_sweep_parse(nbt_sweep *sw, const char *cmd);
/* 1 when a CUDA device is present, else 0 after a message. */
int nbt_have_device(void);

#endif
