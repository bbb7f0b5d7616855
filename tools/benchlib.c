/* benchlib.c - see benchlib.h. */
#define _POSIX_C_SOURCE 200809L /* clock_gettime */
#include "benchlib.h"

#include <cublas_v2.h>

#include <math.h>
#include <string.h>
#include <time.h>

const char *nbt_tool = "nibble";

void *nbt_calloc(size_t count, size_t size) {
    void *p = calloc(count ? count : 1, size ? size : 1);
    if (!p) {
        fprintf(stderr, "%s: out of host memory\n", nbt_tool);
        exit(3);
    }
    return p;
}

static uint64_t rng = 0x243F6A8885A308D3ull;
uint32_t nbt_rand(void) {
    rng ^= rng << 13;
    rng ^= rng >> 7;
    rng ^= rng << 17;
    return (uint32_t)(rng >> 32);
}

uint16_t nbt_bf16(float v) {
    uint32_t u;
    memcpy(&u, &v, 4);
    return (uint16_t)((u + 0x7FFFu + ((u >> 16) & 1u)) >> 16);
}

float nbt_float_of(nb_dtype t, uint16_t h) {
    if (t == NB_DTYPE_BF16) {
        uint32_t u = (uint32_t)h << 16;
        float f;
        memcpy(&f, &u, 4);
        return f;
    }
    const int e = (h >> 10) & 31;
    const uint32_t mt = h & 0x3FF;
    float v = e == 0 ? ldexpf((float)mt, -24) : e == 31 ? (mt ? NAN : INFINITY) : ldexpf((float)(mt | 0x400), e - 25);
    return h & 0x8000 ? -v : v;
}

uint16_t *nbt_random_activations(nb_dtype t, size_t count) {
    uint16_t *x = nbt_calloc(count, 2);
    for (size_t i = 0; i < count; i++) {
        const float v = ((float)nbt_rand() / 4294967296.0f) * 2.0f - 1.0f;
        if (t == NB_DTYPE_BF16) {
            x[i] = nbt_bf16(v);
            continue;
        }
        /* FP16 on a 1/1024 grid: |v| < 1, so every value is exact */
        const int q = (int)lrintf(v * 1024.0f);
        const float fv = (float)q / 1024.0f;
        uint16_t h = 0;
        if (q != 0) {
            int e;
            const float f = frexpf(fabsf(fv), &e); /* fv = f * 2^e */
            const int mant = (int)lrintf((f * 2.0f - 1.0f) * 1024.0f);
            h = (uint16_t)(((e - 1 + 15) << 10) | mant);
            if (fv < 0) h |= 0x8000;
        }
        x[i] = h;
    }
    return x;
}

void *nbt_device_activations(nb_dtype t, size_t count) {
    uint16_t *hx = nbt_random_activations(t, count);
    void *dx;
    CK(cudaMalloc(&dx, 2 * count));
    CK(cudaMemcpy(dx, hx, 2 * count, cudaMemcpyHostToDevice));
    free(hx);
    return dx;
}

void nbt_layer_make(nb_context *ctx, nb_format fmt, int64_t n, int64_t k, double min_mb, cudaStream_t s,
                    nbt_layer *l) {
    memset(l, 0, sizeof *l);
    nb_format_info fi;
    NB(nb_format_get_info(fmt, &fi));
    NB(nb_weight_desc_init(&l->desc, fmt, n, k));
    l->desc.tensor_scale = fi.tensor_scale ? 0.0087f : 1.0f;
    NB(nb_weight_get_sizes_v2(&l->desc, &l->sz));
    uint8_t *hc = nbt_calloc(l->sz.codes_bytes, 1), *hs = nbt_calloc(l->sz.scales_bytes, 1);
    uint8_t *hz = l->sz.zeros_bytes ? nbt_calloc(l->sz.zeros_bytes, 1) : NULL;
    for (size_t i = 0; i < l->sz.codes_bytes; i++) hc[i] = (uint8_t)nbt_rand();
    /* scales spanning a few binades, as in real checkpoints: E4M3 bytes
     * 0x28..0x4F (2^-3 .. 2^1.9), E8M0 bytes 118..127 (2^-9 .. 2^0), F16
     * 2^-8 .. 2^-5 (bytes of 0x1C00..0x29FF, little-end first), F32 absmax
     * 2^-7 .. 2^-3 */
    if (fi.scale_bytes == 4)
        for (size_t i = 0; i < l->sz.scales_bytes; i += 4) {
            const uint32_t bits = (uint32_t)(120 + nbt_rand() % 4) << 23 | (uint32_t)(nbt_rand() & 0x7FFFFF);
            memcpy(hs + i, &bits, 4);
        }
    else if (fi.scale_bytes == 2)
        for (size_t i = 0; i < l->sz.scales_bytes; i += 2) {
            const uint16_t h = (uint16_t)(0x1C00 + nbt_rand() % 0x0E00);
            hs[i] = (uint8_t)h, hs[i + 1] = (uint8_t)(h >> 8);
        }
    else
        for (size_t i = 0; i < l->sz.scales_bytes; i++)
            hs[i] = fi.scale_type == NB_SCALE_E4M3 ? (uint8_t)(0x28 + nbt_rand() % 0x28) : (uint8_t)(118 + nbt_rand() % 10);
    if (fi.zero_type == NB_ZERO_FLOAT) /* F16 zero points 0 .. 15.9 (bit patterns 0x0000, 0x3C00..0x4BFF) */
        for (size_t i = 0; i < l->sz.zeros_bytes; i += 2) {
            const uint16_t h = nbt_rand() % 16 ? (uint16_t)(0x3C00 + nbt_rand() % 0x1000) : 0;
            hz[i] = (uint8_t)h, hz[i + 1] = (uint8_t)(h >> 8);
        }
    else
        for (size_t i = 0; i < l->sz.zeros_bytes; i++) hz[i] = (uint8_t)(nbt_rand() % 16);
    CK(cudaMalloc((void **)&l->dc, l->sz.codes_bytes));
    CK(cudaMalloc((void **)&l->ds, l->sz.scales_bytes));
    CK(cudaMemcpy(l->dc, hc, l->sz.codes_bytes, cudaMemcpyHostToDevice));
    CK(cudaMemcpy(l->ds, hs, l->sz.scales_bytes, cudaMemcpyHostToDevice));
    if (hz) {
        CK(cudaMalloc((void **)&l->dz, l->sz.zeros_bytes));
        CK(cudaMemcpy(l->dz, hz, l->sz.zeros_bytes, cudaMemcpyHostToDevice));
    }
    l->hc = hc, l->hs = hs, l->hz = hz;
    l->rot = (int)ceil(min_mb * 1e6 / (double)l->sz.packed_bytes);
    if (l->rot < 2) l->rot = 2;
    l->pk = nbt_calloc((size_t)l->rot, sizeof *l->pk);
    const nb_weight_data w = {.codes = l->dc, .scales = l->ds, .zeros = l->dz};
    for (int r = 0; r < l->rot; r++) {
        CK(cudaMalloc(&l->pk[r], l->sz.packed_bytes));
        l->packed = l->desc;
        NB(nb_pack_v2(ctx, &l->packed, &w, l->pk[r], l->sz.packed_bytes, s));
    }
}

void nbt_layer_free(nbt_layer *l) {
    for (int r = 0; r < l->rot; r++) CK(cudaFree(l->pk[r]));
    free(l->pk);
    CK(cudaFree(l->dc));
    CK(cudaFree(l->ds));
    if (l->dz) CK(cudaFree(l->dz));
    free(l->hc), free(l->hs), free(l->hz);
    memset(l, 0, sizeof *l);
}

int nbt_graph_calls(int64_t m, int64_t n, int64_t k, size_t weight_bytes, int rot, double target_us, int lo, int hi) {
    const double est_us = fmax(2.0 * m * n * k / 600e12, (double)weight_bytes / 3e12) * 1e6;
    int want = (int)(target_us / est_us);
    want = want < lo ? lo : want > hi ? hi : want;
    return rot * ((want + rot - 1) / rot);
}

static int cmp_float(const void *a, const void *b) {
    const float x = *(const float *)a, y = *(const float *)b;
    return (x > y) - (x < y);
}

double nbt_sustain_s = 0.0;

/* Seconds on a monotonic clock. */
static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

double nbt_time_graph(cudaGraphExec_t exec, cudaStream_t s, int calls, int reps) {
    cudaEvent_t e0, e1;
    CK(cudaEventCreate(&e0));
    CK(cudaEventCreate(&e1));
    CK(cudaGraphLaunch(exec, s)); /* warm-up */
    CK(cudaStreamSynchronize(s));
    if (nbt_sustain_s > 0) { /* replays without a pause, the host at most four ahead */
        const double t0 = now_s();
        for (int i = 1; now_s() - t0 < nbt_sustain_s; i++) {
            CK(cudaGraphLaunch(exec, s));
            if (i % 4 == 0) CK(cudaStreamSynchronize(s));
        }
        CK(cudaStreamSynchronize(s));
    }
    float t[32];
    if (reps > 32) reps = 32;
    for (int r = 0; r < reps; r++) {
        CK(cudaEventRecord(e0, s));
        CK(cudaGraphLaunch(exec, s));
        CK(cudaEventRecord(e1, s));
        CK(cudaEventSynchronize(e1));
        CK(cudaEventElapsedTime(&t[r], e0, e1));
    }
    qsort(t, (size_t)reps, sizeof t[0], cmp_float);
    CK(cudaEventDestroy(e0));
    CK(cudaEventDestroy(e1));
    return (double)t[reps / 2] * 1000.0 / calls;
}

double nbt_time_capture(cudaStream_t s, int calls, int reps) {
    cudaGraph_t gr;
    cudaGraphExec_t ex;
    CK(cudaStreamEndCapture(s, &gr));
    CK(cudaGraphInstantiate(&ex, gr, 0));
    const double us = nbt_time_graph(ex, s, calls, reps);
    CK(cudaGraphExecDestroy(ex));
    CK(cudaGraphDestroy(gr));
    return us;
}

double nbt_time_gemm(nb_context *ctx, const nb_gemm_desc *g, const nb_gemm_config *cfg, const void *x,
                     const nbt_layer *l, void *y, void *ws, size_t ws_bytes, cudaStream_t s, int calls, int reps) {
    return nbt_time_gemm_after(ctx, g, cfg, x, l, y, ws, ws_bytes, s, calls, reps, NULL);
}

void nbt_between_kernel(const nbt_between *b) {
    const float one = 1.0f;
    const cublasStatus_t st = cublasSscal((cublasHandle_t)b->blas, 4096, &one, b->scratch, 1);
    if (st != CUBLAS_STATUS_SUCCESS) {
        fprintf(stderr, "%s: cublasSscal failed (status %d)\n", nbt_tool, (int)st);
        exit(3);
    }
}

void nbt_between_init(nbt_between *b, cudaStream_t s) {
    cublasHandle_t h = NULL;
    if (cublasCreate(&h) != CUBLAS_STATUS_SUCCESS || cublasSetStream(h, s) != CUBLAS_STATUS_SUCCESS) {
        fprintf(stderr, "%s: cuBLAS could not be set up\n", nbt_tool);
        exit(3);
    }
    b->blas = h;
    CK(cudaMalloc((void **)&b->scratch, 4096 * sizeof(float)));
    CK(cudaMemset(b->scratch, 0, 4096 * sizeof(float)));
    const int calls = 200;
    CK(cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal));
    for (int c = 0; c < calls; c++) nbt_between_kernel(b);
    b->alone_us = nbt_time_capture(s, calls, 9);
}

void nbt_between_free(nbt_between *b) {
    if (b->blas) cublasDestroy((cublasHandle_t)b->blas);
    if (b->scratch) CK(cudaFree(b->scratch));
    b->blas = NULL;
    b->scratch = NULL;
}

double nbt_time_gemm_after(nb_context *ctx, const nb_gemm_desc *g, const nb_gemm_config *cfg, const void *x,
                           const nbt_layer *l, void *y, void *ws, size_t ws_bytes, cudaStream_t s, int calls,
                           int reps, const nbt_between *b) {
    CK(cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal));
    for (int c = 0; c < calls; c++) {
        NB(nb_gemm_ex(ctx, g, cfg, x, l->pk[c % l->rot], NULL, y, ws, ws_bytes, s));
        if (b) nbt_between_kernel(b);
    }
    return nbt_time_capture(s, calls, reps) - (b ? b->alone_us : 0.0);
}

void nbt_sweep_opts(nbt_sweep *sw, const char *act_flag, nba_opt *out) {
    const nba_opt o[NBT_SWEEP_OPTS] = {
        {.name = "--shapes", .kind = NBA_STRING, .dst = &sw->shapes},
        {.name = "--m", .kind = NBA_STRING, .dst = &sw->m},
        {.name = "--formats", .kind = NBA_STRING, .dst = &sw->formats},
        {.name = act_flag, .kind = NBA_CHOICE, .dst = &sw->act_name, .choices = "bf16|f16"},
        {.name = "--min-bytes", .kind = NBA_REAL, .dst = &sw->min_mb, .rlo = 0, .rhi = 1e6},
        {.name = "--sustain", .kind = NBA_REAL, .dst = &nbt_sustain_s, .rlo = 0, .rhi = 60},
    };
    memcpy(out, o, sizeof o);
}

/* --formats: a comma list of format names (nb_format_from_name), each with
 * GPU kernels in this build; 1, or 0 after a usage message. */
static int parse_formats(nbt_sweep *sw, const char *cmd) {
    sw->nf = 0;
    for (const char *p = sw->formats;;) {
        const char *comma = strchr(p, ',');
        const size_t len = comma ? (size_t)(comma - p) : strlen(p);
        char name[32];
        nb_format f;
        nb_format_info fi;
        snprintf(name, sizeof name, "%.*s", (int)(len < sizeof name ? len : sizeof name - 1), p);
        if (len >= sizeof name || nb_format_from_name(name, &f) != NB_OK || nb_format_get_info(f, &fi) != NB_OK)
            return !nba_usage(cmd, "--formats: '%.*s': %s", (int)len, p,
                              len >= sizeof name ? "not a format" : nb_last_error());
        if (!fi.kernels) return !nba_usage(cmd, "--formats: %s has no GPU kernels in this build", fi.name);
        if (sw->nf == NBT_MAX_FORMATS) return !nba_usage(cmd, "--formats: more than %d formats", NBT_MAX_FORMATS);
        sw->fmts[sw->nf++] = f;
        if (!comma) return 1;
        p = comma + 1;
    }
}

int nbt_sweep_parse(nbt_sweep *sw, const char *cmd) {
    sw->act = !strcmp(sw->act_name, "f16") ? NB_DTYPE_F16 : NB_DTYPE_BF16; /* (a choice of the two) */
    sw->nm = nba_int_list(cmd, "--m", sw->m, 1, 16384, 0, sw->ms, 64);
    if (sw->nm < 0) return 0;
    sw->nkn = nba_int_list(cmd, "--shapes", sw->shapes, 1, (int64_t)1 << 24, 1, sw->kn, 64);
    if (sw->nkn < 0) return 0;
    sw->mmax = 1;
    for (int i = 0; i < sw->nm; i++) sw->mmax = sw->ms[i] > sw->mmax ? sw->ms[i] : sw->mmax;
    if (!parse_formats(sw, cmd)) return 0;
    /* every layer in every format, before any GPU work: a layer a format
     * cannot hold (k off its group size) is a usage error now, not an exit
     * halfway through a sweep */
    for (int f = 0; f < sw->nf; f++)
        for (int i = 0; i + 1 < sw->nkn; i += 2) {
            nb_weight_desc d;
            nb_weight_sizes_v2 sz;
            if (nb_weight_desc_init(&d, sw->fmts[f], sw->kn[i + 1], sw->kn[i]) != NB_OK ||
                nb_weight_get_sizes_v2(&d, &sz) != NB_OK) {
                nb_format_info fi;
                const char *name = nb_format_get_info(sw->fmts[f], &fi) == NB_OK ? fi.name : "?";
                return !nba_usage(cmd, "--shapes %lldx%lld with --formats %s: %s", (long long)sw->kn[i],
                                  (long long)sw->kn[i + 1], name, nb_last_error());
            }
        }
    return 1;
}

int nbt_have_device(void) {
    int count = 0;
    NB(nb_device_count(&count));
    if (!count) fprintf(stderr, "%s: no CUDA device\n", nbt_tool);
    return count > 0;
}

/* Candidate output a against the heuristic's b (largest |b|: big): each
 * element within two units in the last place of the output type (at most
 * 2^(2 - significand bits) of its magnitude) plus 2^-12 big: different k
 * splits sum in a different order before the rounding.  rounded: the
 * integer and table formats, whose tensor-core kernels round each weight
 * to 16 bits while their decode kernels use it exactly; a candidate of one
 * kernel family against the heuristic of the other then differs by the sum
 * of those roundings, which on random layers of 4096..8192 k reaches about
 * 0.3% of big (2^-9 relative per weight, partly correlated through the
 * group scale), so the floor is 2^-7 big. */
int nbt_same_output(nb_dtype t, const uint16_t *a, const uint16_t *b, size_t count, float big, int rounded,
                       char *why, size_t wn) {
    const float rel = t == NB_DTYPE_BF16 ? 0x1p-6f : 0x1p-9f, floor_ = big * (rounded ? 0x1p-7f : 0x1p-12f);
    for (size_t i = 0; i < count; i++) {
        const float x = nbt_float_of(t, a[i]), y = nbt_float_of(t, b[i]);
        if (!(fabsf(x - y) <= rel * fmaxf(fabsf(x), fabsf(y)) + floor_)) {
            snprintf(why, wn, "element %zu is %g, the heuristic's %g", i, x, y);
            return 0;
        }
    }
    return 1;
}

void nbt_config_text(const nb_gemm_config *c, char *buf, size_t n) {
    if (c->path == NB_GEMM_PATH_TENSOR_CORE || c->path == NB_GEMM_PATH_MMA)
        snprintf(buf, n, "%s bn=%d splits=%d raster=%d%s", c->path == NB_GEMM_PATH_MMA ? "mma" : "tc", c->bn,
                 c->splits ? c->splits : 1, c->raster, c->stream_k == 1 ? " stream-k" : "");
    else if (c->variant && c->warps) snprintf(buf, n, "decode staged rpw=%d splits=%d warps=%d", c->rpw, c->splits, c->warps);
    else if (c->variant) snprintf(buf, n, "decode staged rpw=%d splits=%d", c->rpw, c->splits);
    else snprintf(buf, n, "decode kw=%d splits=%d", c->kw, c->splits);
}
