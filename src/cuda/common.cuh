/* common.cuh - what the kernel files share, one copy each: failures, the
 * format traits and the dispatch ladder, the scalar codecs (identical
 * arithmetic to src/formats.c), the scale table, the GEMM epilogue, the
 * raster order of tiles, split-K arrival, cache-hinted loads, cp.async
 * copies, mbarriers, programmatic dependent launch, mma.sync. */
#ifndef NB_COMMON_CUH
#define NB_COMMON_CUH

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include "../internal.h"

/* ------------------------------------------------------------ failures */

/* A failed CUDA call: the status from the one map (nbi_cuda_status) and a
 * message naming the call, recorded in ctx (and the thread's buffer).  An
 * allocation failure does not stick to the context: clear it, or the next
 * launch check would report it again. */
static inline nb_status nbc_fail(nb_context *ctx, cudaError_t e, const char *what) {
    if (e == cudaErrorMemoryAllocation) cudaGetLastError();
    return nbi_fail(ctx, nbi_cuda_status((int)e), "%s: %s (%s)", what, cudaGetErrorString(e), cudaGetErrorName(e));
}
/* Return the failure of `call` (in a function with a `ctx` in scope). */
#define NBC_TRY(call, what)                                   \
    do {                                                      \
        cudaError_t e_ = (call);                              \
        if (e_ != cudaSuccess) return nbc_fail(ctx, e_, what); \
    } while (0)
/* After a launch: configuration errors surface here. */
#define NBC_LAUNCHED(what) NBC_TRY(cudaGetLastError(), what)

/* Opt kernel `fn` into `bytes` of dynamic shared memory on the context's
 * device, once per (kernel, device) (runtime.cu keeps the record). */
extern "C" nb_status nbc_smem_opt_in(nb_context *ctx, const void *fn, size_t bytes);
/* CTAs of kernel `fn` one SM holds at once (occupancy calculator, once per
 * kernel, device, threads and bytes; 0 where the runtime cannot tell). */
extern "C" int nbc_ctas_per_sm(nb_context *ctx, const void *fn, int threads, size_t bytes);

/* ------------------------------------------------------- format traits */

/* nbc_fmt<FMT>: the row of NB_FORMAT_LIST (nibble.h) as compile-time
 * constants, and the sizes of its packed chunk (16 rows x 128 k: 1024 code
 * bytes, then the scales).  Declared only for the formats of the list, so an
 * unknown format does not compile. */
template <int FMT>
struct nbc_fmt;
#define NBC_X_FMT(NAME, value, str, elem, bits, grp, grps, st, sts, sbytes, ts, zp)              \
    template <>                                                                                   \
    struct nbc_fmt<value> {                                                                       \
        static constexpr int element = elem, element_bits = bits, group = grp, scale_type = st;   \
        static constexpr int groups = grps, scale_types = sts;                                    \
        static constexpr int scale_bytes = sbytes, tensor_scale = ts, zero_point = zp;           \
        static constexpr int chunk_scale_bytes = NBI_CHUNK_ROWS * NBI_CHUNK_K / grp * sbytes;     \
        static constexpr int lane_scale_bytes = chunk_scale_bytes / 32; /* per lane of a warp */ \
        static constexpr int chunk_bytes = NBI_CHUNK_CODE_BYTES + chunk_scale_bytes;              \
    };
NB_FORMAT_LIST(NBC_X_FMT)
#undef NBC_X_FMT

/* What the packed chunk and the GEMM kernels' dequantization handle: E2M1
 * codes and one-byte block scales in groups of 16 (a lane's 32 k hold two
 * groups) or 32 (one).  A format outside this fails to compile where a
 * kernel is instantiated for it. */
#define NBC_CHECK_KERNEL_FORMAT(FMT)                                                                   \
    static_assert(nbc_fmt<FMT>::element == NB_ELEMENT_E2M1 && nbc_fmt<FMT>::scale_bytes == 1 &&        \
                      (nbc_fmt<FMT>::group == 16 || nbc_fmt<FMT>::group == 32),                         \
                  "the GEMM kernels decode E2M1 codes with one-byte scales in groups of 16 or 32")

/* --------------------------------------------------- the dispatch ladder */

/* The one ladder from run-time (format, activation dtype) to compile-time
 * template arguments: `switch` cases over every pair of NBI_KERNEL_FORMATS x
 * NBI_KERNEL_DTYPES (internal.h), case (F, A) running RUNG(F, A) with both
 * constants.  RUNG is a macro the caller defines (it returns); a pair
 * outside the lists falls through, after the switch, to the caller's
 * failure.  Every kernel family dispatches through it, so adding a format
 * to the list instantiates every family for it. */
#define NBC_LADDER(fmt, act, RUNG)                                      \
    switch ((int)(fmt) * 16 + (int)(act)) {                             \
        NBI_KERNEL_FORMATS(NBC_LADDER_FMT_, RUNG)                       \
    default:                                                            \
        break;                                                          \
    }
#define NBC_UNPAREN_(...) __VA_ARGS__
#define NBC_LADDER_FMT_(F, RUNG) NBI_KERNEL_DTYPES(NBC_LADDER_ACT_, (F, RUNG))
#define NBC_LADDER_ACT_(A, FR) NBC_LADDER_CASE_(A, NBC_UNPAREN_ FR)
#define NBC_LADDER_CASE_(...) NBC_LADDER_CASE2_(__VA_ARGS__)
#define NBC_LADDER_CASE2_(A, F, RUNG)                                   \
    case NB_FORMAT_##F * 16 + NB_DTYPE_##A: {                           \
        RUNG(NB_FORMAT_##F, NB_DTYPE_##A)                               \
    }
/* An integer or table format's instance for its kernel group kg (32, 64
 * or 128): PICK(KG) names it for one group, NULL for another kg. */
#define NBC_KG_PICK(kg, PICK) ((kg) == 32 ? PICK(32) : (kg) == 64 ? PICK(64) : (kg) == 128 ? PICK(128) : NULL)
/* The same over the formats only decode kernel 1 serves (NBI_DECODE_FORMATS). */
#define NBC_DECODE_LADDER(fmt, act, RUNG)                               \
    switch ((int)(fmt) * 16 + (int)(act)) {                             \
        NBI_DECODE_FORMATS(NBC_LADDER_FMT_, RUNG)                       \
    default:                                                            \
        break;                                                          \
    }
/* The same over formats alone (kernels without an activation dtype). */
#define NBC_FORMAT_LADDER(fmt, RUNG)                                    \
    switch ((int)(fmt)) {                                               \
        NBI_KERNEL_FORMATS(NBC_FLADDER_CASE_, RUNG)                     \
    default:                                                            \
        break;                                                          \
    }
#define NBC_FLADDER_CASE_(F, RUNG)                                      \
    case NB_FORMAT_##F: {                                               \
        RUNG(NB_FORMAT_##F)                                             \
    }

/* Launch settings shared by the kernels; `pdl` adds programmatic dependent
 * launch (sm_90+: the kernel's prologue may overlap the previous kernel,
 * whose results it waits for with griddepcontrol.wait). */
static inline cudaLaunchConfig_t nbc_launch_config(dim3 grid, dim3 block, size_t smem, void *stream, int pdl,
                                                   cudaLaunchAttribute *attr) {
    cudaLaunchConfig_t cfg;
    memset(&cfg, 0, sizeof cfg);
    cfg.gridDim = grid;
    cfg.blockDim = block;
    cfg.dynamicSmemBytes = smem;
    cfg.stream = (cudaStream_t)stream;
    attr[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
    attr[0].val.programmaticStreamSerializationAllowed = 1;
    cfg.attrs = attr;
    cfg.numAttrs = pdl ? 1 : 0;
    return cfg;
}

/* The fields every GEMM kernel's parameter block shares (the decode kernels,
 * gemm_sm90, gemm_sm80), filled from the plan on the host. */
#define NBC_SET_GEMM_PARAMS(p, pl, packed, y_, bias_)          \
    do {                                                       \
        (p).w = (const uint8_t *)(packed);                     \
        (p).y = (y_);                                          \
        (p).bias = (bias_);                                    \
        (p).m = (int)(pl)->m;                                  \
        (p).n = (int)(pl)->n;                                  \
        (p).k = (int)(pl)->k;                                  \
        (p).ldc = (pl)->ldc;                                   \
        (p).row_blocks = (int)(pl)->row_blocks;                \
        (p).kchunks = (int)(pl)->kchunks;                      \
        (p).exp_shift = (pl)->exp_shift;                       \
        (p).ts = (pl)->tensor_scale;                           \
        memcpy((p).stab, (pl)->scale_table, sizeof (p).stab);  \
    } while (0)

#define NBC_NAN_BITS 0x7FC00000u

__device__ __forceinline__ float nbc_e2m1(uint32_t c) {
    /* 0 .5 1 1.5 2 3 4 6: e = bits 2..1, m = bit 0; subnormal (e = 0) is m/2 */
    int e = (c >> 1) & 3, m = c & 1;
    float v = e == 0 ? 0.5f * (float)m : ldexpf(1.0f + 0.5f * (float)m, e - 1);
    return (c & 8) ? -v : v;
}

__device__ __forceinline__ float nbc_e4m3(uint32_t b) {
    int e = (b >> 3) & 15, m = b & 7;
    if (e == 15 && m == 7) return __int_as_float(NBC_NAN_BITS);
    float v = e == 0 ? ldexpf((float)m, -9) : ldexpf(1.0f + (float)m / 8.0f, e - 7);
    return (b & 0x80) ? -v : v;
}

__device__ __forceinline__ float nbc_e8m0(uint32_t b) {
    return b == 0xFF ? __int_as_float(NBC_NAN_BITS) : ldexpf(1.0f, (int)b - 127);
}

/* A block scale byte of scale type st (nb_scale_type). */
__device__ __forceinline__ float nbc_scale(int st, uint32_t b) {
    return st == NB_SCALE_E4M3 ? nbc_e4m3(b) : nbc_e8m0(b);
}

/* Store a float as dtype with the same rounding as the C reference (RNE) and
 * a canonical NaN. */
__device__ __forceinline__ void nbc_store(int dtype, void *p, size_t i, float v) {
    if (dtype == NB_DTYPE_F32) {
        ((float *)p)[i] = isnan(v) ? __int_as_float(NBC_NAN_BITS) : v;
    } else if (dtype == NB_DTYPE_BF16) {
        ((__nv_bfloat16 *)p)[i] = isnan(v) ? __ushort_as_bfloat16(0x7FC0) : __float2bfloat16_rn(v);
    } else {
        ((__half *)p)[i] = isnan(v) ? __ushort_as_half(0x7E00) : __float2half_rn(v);
    }
}

__device__ __forceinline__ float nbc_load(int dtype, const void *p, size_t i) {
    if (dtype == NB_DTYPE_F32) return ((const float *)p)[i];
    if (dtype == NB_DTYPE_BF16) return __bfloat162float(((const __nv_bfloat16 *)p)[i]);
    return __half2float(((const __half *)p)[i]);
}

/* ------------------------------------------------- pieces of every GEMM */

/* Each CTA copies the host-built scale table (plan.c: 256 adjusted 16-bit
 * scales, two per word) to shared memory, every entry broadcast to both
 * halves of a word (the HMUL2 operand).  NTHREADS threads take part. */
template <int NTHREADS>
__device__ __forceinline__ void nbc_load_scale_table(uint32_t *stab, const uint32_t *src) {
    for (int i = threadIdx.x; i < 128; i += NTHREADS) {
        const uint32_t v = src[i];
        stab[2 * i] = (v & 0xFFFFu) * 0x10001u;
        stab[2 * i + 1] = (v >> 16) * 0x10001u;
    }
}

/* The epilogue's value of one accumulator: acc * 2^exp_shift * tensor_scale
 * (+ the row's bias), as FP32.  p2 = ldexpf(1, exp_shift) is exact for every
 * shift the planner makes (-128..127), so acc * p2 is ldexpf(acc, exp_shift)
 * bit for bit (one rounding, subnormals kept: no flush to zero here). */
__device__ __forceinline__ float nbc_epi(float acc, float p2, float ts, bool has_bias, float b) {
    float v = acc * p2 * ts;
    if (has_bias) v += b; /* (not v + 0: that would turn -0 into +0) */
    return v;
}

/* Two epilogue values rounded (RNE) to a 16-bit ACT and packed, lo in the
 * low half; a NaN becomes the canonical NaN of nbc_store (cvt's own NaN is
 * another pattern). */
template <int ACT>
__device__ __forceinline__ uint32_t nbc_pack2(float lo, float hi) {
    uint32_t r;
    if (ACT == NB_DTYPE_BF16) asm("cvt.rn.bf16x2.f32 %0, %1, %2;" : "=r"(r) : "f"(hi), "f"(lo));
    else asm("cvt.rn.f16x2.f32 %0, %1, %2;" : "=r"(r) : "f"(hi), "f"(lo));
    const uint32_t qnan = ACT == NB_DTYPE_BF16 ? 0x7FC0u : 0x7E00u;
    if (isnan(lo)) r = (r & 0xFFFF0000u) | qnan;
    if (isnan(hi)) r = (r & 0x0000FFFFu) | (qnan << 16);
    return r;
}

/* The epilogue of a warp's 16-row block over NT tiles of 8 tokens whose
 * FP32 accumulators are in the mma m16n8 C layout (PTX ISA "Matrix
 * Fragments for mma.m16n8k16"; the wgmma m64nN D fragment repeats it per
 * warp): element 4i + 2h + j is row row0 + g + 8h, token tok0 + 8i + 2t + j.
 * Y[token, row] = acc * 2^exp_shift * tensor_scale (+ bias[row]), rounded
 * once to ACT; rows >= n and tokens >= m are not stored.  The scale, the
 * thread's two bias values, its row tests and its first address are set
 * once (a 2-byte store and two multiplies per element). */
template <int ACT, int NT>
__device__ __forceinline__ void nbc_store_block(const float *acc, int row0, int tok0, int g, int t, int m, int n,
                                                int64_t ldc, void *y, const void *bias, int exp_shift, float ts) {
    const float p2 = ldexpf(1.0f, exp_shift);
    const int r0 = row0 + g;
    const bool ok0 = r0 < n, ok1 = r0 + 8 < n;
    const float b0 = bias && ok0 ? nbc_load(ACT, bias, (size_t)r0) : 0.0f;
    const float b1 = bias && ok1 ? nbc_load(ACT, bias, (size_t)r0 + 8) : 0.0f;
    const int size = ACT == NB_DTYPE_F32 ? 4 : 2;
    char *p = (char *)y + ((int64_t)(tok0 + 2 * t) * ldc + r0) * size;
    const int64_t step = ldc * size;
#pragma unroll
    for (int i = 0; i < NT; i++)
#pragma unroll
        for (int j = 0; j < 2; j++) {
            if (tok0 + 8 * i + 2 * t + j < m) {
                char *q = p + (8 * i + j) * step;
                if (ok0) nbc_store(ACT, q, 0, nbc_epi(acc[4 * i + j], p2, ts, bias != NULL, b0));
                if (ok1) nbc_store(ACT, q + 8 * size, 0, nbc_epi(acc[4 * i + 2 + j], p2, ts, bias != NULL, b1));
            }
        }
}

/* A compile-time flag as a value, for generic bodies instantiated twice
 * (the decode loops' chunks checked or not, the MoE epilogue's activation). */
template <bool B>
struct nbc_flag {
    static constexpr bool value = B;
};

/* The MoE activation of gate and up (nibble.h nb_moe_activation), AV
 * one of its values: SwiGLU, or gpt-oss's clamped variant; the comparisons
 * keep a NaN, as the host reference's do (src/moe.c).  The sigmoid by the
 * hardware's approximations: 2^(c g) with c = -alpha log2(e) (ex2.approx,
 * flushing results under 2^-126, which 1 + e^x rounds away anyway) and an
 * approximate reciprocal of 1 + e^x (__fdividef): a few ulps from the
 * host's expf and division, inside the bound tests/test_moe.c states for
 * the activation's float evaluation; gpt-oss's variant about 13
 * instructions instead of about 30 with expf and an IEEE division (SwiGLU
 * 6 instead of about 20), which the tensor-core tiles run for every output
 * while their tensor cores idle.  Where 1 + e^x passes 2^126, g / it
 * is 0 here (the exact value's magnitude is below 2^-119).  nc: -log2(e)
 * (SwiGLU) or -alpha log2(e), from nbc_moe_act_c. */
__device__ __forceinline__ float nbc_moe_act_c(int activation, float alpha) {
    return activation == NB_MOE_ACT_SWIGLU ? -1.44269504f : -(alpha * 1.44269504f);
}
__device__ __forceinline__ float nbc_ex2_ftz(float x) {
    float y;
    asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
    return y;
}
template <int AV>
__device__ __forceinline__ float nbc_moe_act_k(float limit, float nc, float g, float u) {
    if (AV == NB_MOE_ACT_SWIGLU) return __fdividef(g, 1.0f + nbc_ex2_ftz(g * nc)) * u;
    g = g > limit ? limit : g;
    u = u > limit ? limit : u < -limit ? -limit : u;
    return (u + 1.0f) * __fdividef(g, 1.0f + nbc_ex2_ftz(g * nc));
}
__device__ __forceinline__ float nbc_moe_act(int activation, float limit, float alpha, float g, float u) {
    const float nc = nbc_moe_act_c(activation, alpha);
    return activation == NB_MOE_ACT_SWIGLU ? nbc_moe_act_k<NB_MOE_ACT_SWIGLU>(limit, nc, g, u)
                                           : nbc_moe_act_k<NB_MOE_ACT_SWIGLU_OAI>(limit, nc, g, u);
}

/* The epilogue of the MoE projections (moe.cu's decode kernels and
 * gemm_sm90.cu's tiles): where the results go and what is applied. */
struct nbc_moe_epi {
    void *out;        /* h [slots, I] or o [slots, H] */
    int64_t ldo;
    const void *bias; /* [E, 2I] (checkpoint row order) or [E, H], or NULL */
    int n_out;        /* I (gate_up) or H (down) */
    int interleaved, activation;
    float limit, alpha;
};

static inline nbc_moe_epi nbc_moe_epilogue(const nbi_moe_plan *p, bool gate_up, void *out,
                                           const nb_moe_packed_weights *w) {
    nbc_moe_epi q;
    q.out = out;
    q.ldo = gate_up ? p->inter : p->hidden;
    q.bias = gate_up ? w->gate_up_bias : w->down_bias;
    q.n_out = (int)(gate_up ? p->inter : p->hidden);
    q.interleaved = p->interleaved;
    q.activation = p->activation;
    q.limit = p->limit;
    q.alpha = p->alpha;
    return q;
}

/* One token's two results of expert e's 16-row block rb, lo (row g) and hi
 * (row g + 8), scaled, stored in output row `row`: gate_up (the rows are
 * gate i and up i, i = 8 rb + g) stores act(gate + bias, up + bias) at
 * column i; down stores rows 16 rb + g and + 8, plus the bias. */
template <int ACT, bool GATE_UP>
__device__ __forceinline__ void nbc_moe_store(const nbc_moe_epi &q, int e, int rb, int g, int64_t row, float lo,
                                              float hi) {
    if (GATE_UP) {
        const int i = 8 * rb + g;
        if (i >= q.n_out) return;
        float gate = lo, up = hi;
        if (q.bias) {
            const int64_t I = q.n_out, rg = q.interleaved ? 2 * i : i, ru = q.interleaved ? 2 * i + 1 : I + i;
            gate += nbc_load(ACT, q.bias, (size_t)(e * 2 * I + rg));
            up += nbc_load(ACT, q.bias, (size_t)(e * 2 * I + ru));
        }
        nbc_store(ACT, q.out, (size_t)row * q.ldo + i, nbc_moe_act(q.activation, q.limit, q.alpha, gate, up));
    } else {
#pragma unroll
        for (int h = 0; h < 2; h++) {
            const int c = 16 * rb + g + 8 * h;
            if (c >= q.n_out) continue;
            float v = h ? hi : lo;
            if (q.bias) v += nbc_load(ACT, q.bias, (size_t)e * q.n_out + c);
            nbc_store(ACT, q.out, (size_t)row * q.ldo + c, v);
        }
    }
}

/* Raster order of the tensor-core kernels' tiles: groups of `group` n tiles
 * walk every m tile, so the weights of a group and the activations of an m
 * tile stay in L2 together.  Tile index -> (n tile, m tile); the index
 * divides unsigned, which is cheaper. */
__device__ __forceinline__ void nbc_raster(unsigned tile, int group, int tiles_n, int tiles_m, int &tn, int &tm) {
    const int per_group = group * tiles_m;
    const int first_n = tile / per_group * group, in_group = tile % per_group;
    const int width = min(group, tiles_n - first_n);
    tn = first_n + in_group % width;
    tm = in_group / width;
}

/* A barrier of the NTHREADS threads that share the split-K work: the whole
 * CTA (0), or named barrier 1 of NTHREADS threads (warp-aligned). */
template <int NTHREADS>
__device__ __forceinline__ void nbc_split_barrier() {
    if (NTHREADS == 0) __syncthreads();
    else asm volatile("bar.sync 1, %0;" ::"n"(NTHREADS) : "memory");
}

/* Release / acquire at GPU scope for a group of threads, by one of them
 * right after a barrier of the group (the pattern of CUTLASS's
 * semaphores): the barrier orders every thread's earlier stores before the
 * one thread's fence, and that fence before its update of a counter
 * (release); its read of the counter, a fence and the next barrier order
 * other CTAs' stores before every thread's later loads (acquire).  One
 * fence.acq_rel by one thread, not a sequentially consistent fence
 * (__threadfence, MEMBAR.SC.GPU) in every thread. */
__device__ __forceinline__ void nbc_fence_acq_rel_gpu() { asm volatile("fence.acq_rel.gpu;" ::: "memory"); }

/* Deterministic split-K, the arrival: after a CTA's `splits`-way partial
 * sums are stored (with __stcg), every one of its NTHREADS threads calls
 * this; `leader` is one of them.  Returns true in the last CTA to arrive at
 * *counter, which then sums every split's partials in split order (so the
 * result does not depend on timing) and resets *counter (nbc_split_done):
 * one zeroed workspace serves every call. */
template <int NTHREADS>
__device__ __forceinline__ bool nbc_split_last(int *counter, int splits, int *flag, bool leader) {
    nbc_split_barrier<NTHREADS>(); /* every thread's partial stores, before the leader's release */
    if (leader) {
        nbc_fence_acq_rel_gpu();
        const int last = atomicAdd(counter, 1) == splits - 1;
        if (last) nbc_fence_acq_rel_gpu(); /* acquire: the other CTAs' partials */
        *flag = last;
    }
    nbc_split_barrier<NTHREADS>();
    return *flag;
}

/* ------------------------------------------------------------- mbarriers */
/* PTX ISA "Parallel Synchronization and Communication Instructions:
 * mbarrier", on 32-bit shared-memory addresses.  A phase completes when its
 * expected number of arrivals (and, with expect_tx, bytes) has happened;
 * waiters test the phase parity. */

__device__ __forceinline__ void nbc_mbar_init(uint32_t bar, uint32_t count) {
    asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;" ::"r"(bar), "r"(count) : "memory");
}
__device__ __forceinline__ void nbc_mbar_arrive(uint32_t bar) {
    asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];" ::"r"(bar) : "memory");
}
/* Arrive once this thread's earlier cp.async copies have landed (counted
 * in the barrier's expected arrivals: .noinc). */
__device__ __forceinline__ void nbc_mbar_arrive_cp_async(uint32_t bar) {
    asm volatile("cp.async.mbarrier.arrive.noinc.shared::cta.b64 [%0];" ::"r"(bar) : "memory");
}
/* Wait until the phase of parity `parity` has completed: try_wait (which
 * may suspend the thread a while) on sm_90, test_wait before it. */
__device__ __forceinline__ void nbc_mbar_wait(uint32_t bar, uint32_t parity) {
    uint32_t done;
    do {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
        asm volatile("{\n.reg .pred p;\nmbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2;\nselp.u32 %0, 1, 0, p;\n}"
                     : "=r"(done)
                     : "r"(bar), "r"(parity)
                     : "memory");
#else
        asm volatile("{\n.reg .pred p;\nmbarrier.test_wait.parity.shared::cta.b64 p, [%1], %2;\nselp.u32 %0, 1, 0, p;\n}"
                     : "=r"(done)
                     : "r"(bar), "r"(parity)
                     : "memory");
#endif
    } while (!done);
}

/* Whether this device pass has sm_90's bulk copies (cp.async.bulk). */
__host__ __device__ constexpr bool nbc_bulk_copies() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    return true;
#else
    return false;
#endif
}
/* sm_90's copy engine: arrive on barrier bar and announce the bytes a bulk
 * copy will deliver for this phase; then one cp.async.bulk of `bytes`
 * contiguous bytes (both addresses 16-byte aligned, bytes a multiple of
 * 16) from global to shared memory, completing them on bar, with L2 policy
 * pol. */
__device__ __forceinline__ void nbc_mbar_expect_tx(uint32_t bar, uint32_t bytes) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" ::"r"(bar), "r"(bytes) : "memory");
#endif
}
__device__ __forceinline__ void nbc_bulk_load(uint32_t dst, const void *src, uint32_t bytes, uint32_t bar, uint64_t pol) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes.L2::cache_hint [%0], [%1], %2, [%3], %4;"
                 ::"r"(dst), "l"(src), "r"(bytes), "r"(bar), "l"(pol)
                 : "memory");
#endif
}
/* Make this thread's mbarrier initializations visible to the copy engine. */
__device__ __forceinline__ void nbc_mbar_init_fence() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
#endif
}

/* An L2 policy that evicts streamed weights first: they are read once, while
 * activations and partial sums should stay in L2. */
__device__ __forceinline__ uint64_t nbc_policy_evict_first() {
    uint64_t p;
    asm("createpolicy.fractional.L2::evict_first.b64 %0, 1.0;" : "=l"(p));
    return p;
}

/* Two 16-bit products in one instruction (HMUL2): a dequantized weight pair
 * times its adjusted block scale, BF16 or FP16 (ACT is the nb_dtype). */
template <int ACT>
__device__ __forceinline__ uint32_t nbc_hmul2(uint32_t a, uint32_t b) {
    uint32_t r;
    if (ACT == NB_DTYPE_BF16) {
        __nv_bfloat162 x = *reinterpret_cast<__nv_bfloat162 *>(&a), y = *reinterpret_cast<__nv_bfloat162 *>(&b);
        __nv_bfloat162 z = __hmul2(x, y);
        r = *reinterpret_cast<uint32_t *>(&z);
    } else {
        __half2 x = *reinterpret_cast<__half2 *>(&a), y = *reinterpret_cast<__half2 *>(&b);
        __half2 z = __hmul2(x, y);
        r = *reinterpret_cast<uint32_t *>(&z);
    }
    return r;
}

/* a * b + c on two FP16 lanes (HFMA2), rounded once. */
__device__ __forceinline__ uint32_t nbc_hfma2_f16(uint32_t a, uint32_t b, uint32_t c) {
    __half2 x = *reinterpret_cast<__half2 *>(&a), y = *reinterpret_cast<__half2 *>(&b),
            z = *reinterpret_cast<__half2 *>(&c);
    __half2 r = __hfma2(x, y, z);
    return *reinterpret_cast<uint32_t *>(&r);
}

/* a - b on two 16-bit lanes (HSUB2), BF16 or FP16. */
template <int ACT>
__device__ __forceinline__ uint32_t nbc_hsub2(uint32_t a, uint32_t b) {
    uint32_t r;
    if (ACT == NB_DTYPE_BF16) {
        __nv_bfloat162 x = *reinterpret_cast<__nv_bfloat162 *>(&a), y = *reinterpret_cast<__nv_bfloat162 *>(&b);
        __nv_bfloat162 z = __hsub2(x, y);
        r = *reinterpret_cast<uint32_t *>(&z);
    } else {
        __half2 x = *reinterpret_cast<__half2 *>(&a), y = *reinterpret_cast<__half2 *>(&b);
        __half2 z = __hsub2(x, y);
        r = *reinterpret_cast<uint32_t *>(&z);
    }
    return r;
}

/* ------------------------------------------------ PTX shared by the kernels */

__device__ __forceinline__ uint32_t nbc_smem_u32(const void *p) { return (uint32_t)__cvta_generic_to_shared(p); }

/* Programmatic dependent launch (sm_90): wait until the previous grid in
 * the stream has finished and its writes are visible; let the next grid
 * start its prologue early.  No-ops before sm_90 (the host launches without
 * the attribute there).
 *
 * Every kernel requests its first weight chunks (they do not depend on the
 * previous kernel) before griddepcontrol.wait, and reads activations and
 * writes anything only after it.  It triggers griddepcontrol.launch_dependents
 * after its main loop, so the next grid's CTAs take the SM room of CTAs that
 * have finished and request their weights while the last ones drain.
 * Decode kernel 1 on short streams (at most GEMV_EARLY_CHUNKS chunks per
 * warp) triggers earlier, once a warp has issued the loads of its last
 * chunk: the next call's pipeline fill then overlaps this one's, which is
 * most of the time of a small layer.  Measured on an H100 (NOTES.md):
 * triggering early gained 8-12% on the 4096-wide layers at m = 1 but lost
 * 10-26% on longer streams (8192 -> 8192, 14336 -> 4096) and up to 24% in
 * the other kernels, so they keep the late trigger.  A dependent CTA loads
 * only weights before its own wait, so it never reads this grid's output or
 * workspace early.  (Not for kernels that write packed weights:
 * quantize.cu and repack.cu never trigger, and the next kernel's weight
 * prefetch must not see half-written weights.) */
__device__ __forceinline__ void nbc_grid_dependency_wait() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    asm volatile("griddepcontrol.wait;" ::: "memory");
#endif
}
__device__ __forceinline__ void nbc_grid_dependents_launch() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
#endif
}

/* 16-byte global -> shared copy (sa: shared address); src_size 0 writes
 * zeros and reads nothing (k past the end). */
__device__ __forceinline__ void nbc_cp_async16_zfill(uint32_t sa, const void *gmem, bool in) {
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;" ::"r"(sa), "l"(gmem), "r"(in ? 16 : 0));
}

/* 16-byte global -> shared copy that bypasses registers, with an L2 policy;
 * a 32-bit shared-memory address (callers keep one base register and add
 * constant offsets). */
__device__ __forceinline__ void nbc_cp_async16_s(uint32_t sa, const void *gmem, uint64_t pol) {
    asm volatile("cp.async.cg.shared.global.L2::cache_hint [%0], [%1], 16, %2;" ::"r"(sa), "l"(gmem), "l"(pol));
}
__device__ __forceinline__ void nbc_cp_async_commit() { asm volatile("cp.async.commit_group;" ::: "memory"); }
template <int N>
__device__ __forceinline__ void nbc_cp_async_wait() { asm volatile("cp.async.wait_group %0;" ::"n"(N) : "memory"); }

/* D += A . B, m16n8k16, FP32 accumulate, A row-major (16 x 16), B
 * column-major (16 x 8) (PTX ISA "Matrix Fragments for mma.m16n8k16":
 * a0..a3 rows g/g+8, k-slots 2t..2t+1 and 2t+8..2t+9; b0, b1 column g,
 * k-slots 2t..2t+1 and 2t+8..2t+9; d0, d1 row g, columns 2t, 2t+1; d2, d3
 * row g+8). */
template <int ACT>
__device__ __forceinline__ void nbc_mma16816(float (&d)[4], uint32_t a0, uint32_t a1, uint32_t a2, uint32_t a3,
                                             uint32_t b0, uint32_t b1) {
    if (ACT == NB_DTYPE_BF16) {
        asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
                     "{%0,%1,%2,%3};"
                     : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
                     : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
    } else {
        asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
                     "{%0,%1,%2,%3};"
                     : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
                     : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
    }
}

#endif
