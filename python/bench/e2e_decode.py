#!/usr/bin/env python3
"""End-to-end greedy decode: a Llama-3.1-8B-shaped (or 70B-shaped) model with
random weights, BF16 against nibble NVFP4 and MXFP4 (and, with --formats,
int4 / int4_sym / int8 with groups of 128 and nf4 with blocks of 64)
(nibble.torch.quantize_model), tokens per second at several batch sizes, in
eager and compiled mode, and the share of the step spent in the linear
layers.

    python python/bench/e2e_decode.py --out bench/e2e            # H100: all 32 layers, eager + compiled
    python python/bench/e2e_decode.py --layers 8 --batches 1,8    # shorter
    python python/bench/e2e_decode.py --shape 70b                 # 70B layer shapes, 10 layers
    python python/bench/e2e_decode.py --modes compiled --formats bf16,nvfp4
    python python/bench/e2e_decode.py --tiny --device cpu         # plumbing check, no GPU (eager only)

The model is transformers' LlamaForCausalLM built from the Llama-3.1-8B
configuration (32 layers, hidden 4096, MLP 14336, 32 query / 8 KV heads,
vocabulary 128256, llama3 RoPE), or with --shape 70b from Llama-3.1-70B's
(hidden 8192, MLP 28672, 64 query / 8 KV heads, same vocabulary) with 10 of
its 80 layers by default (about 21B parameters: 42 GB in BF16, which leaves
room for the quantized copy and the float32 check on an 80 GB GPU); random
weights in BF16 on the GPU.  The decode loop is this file's (class Decoder):
it calls the model's own modules (embeddings, norms, q/k/v/o and MLP
projections, lm_head) but keeps the KV cache itself, in static tensors of
max_len = prompt + warm-up + steps positions, and attends over all of them
with a position mask, so one decode step has fixed shapes and no host
synchronization.

Fused projections (the default; --no-fuse keeps them separate): before
anything else the BF16 model's q/k/v and gate/up projections are fused
(nibble.torch.fuse_projections: one [6144, 4096] and one [28672, 4096]
layer per decoder layer on the 8B shape), so every format, BF16 included,
runs four GEMMs per layer as serving engines do, and the quantized formats
quantize the fused layers (one NVFP4 tensor scale per fused layer, as
ModelOpt and llm-compressor export them).  The decode loop calls the fused
layer and splits its output.

The MLP's activation (--glu): in the quantized formats the fused gate/up
output goes through nibble.torch.glu (nb_glu: silu(gate) * up in one
kernel, an engine's silu_and_mul) into the down projection, so the three
are nibble launches in a row and the chain of programmatic dependent
launches between them holds; --glu torch runs the model's act_fn(gate) * up
(one Inductor kernel when compiled).  BF16 always runs the latter.

Modes (--modes, both by default on CUDA):
  eager     the step as PyTorch runs it (every norm, rotary and attention
            operation its own kernel), captured once per batch size in a
            torch.cuda.CUDAGraph (input token, position counter, greedy
            argmax and token history all live in the graph) and replayed.
  compiled  the same step through torch.compile(fullgraph=True,
            dynamic=False, mode=--compile-mode), gpt-fast style: the nibble
            op (torch.library.custom_op with a fake implementation) and the
            BF16 matmuls stay calls inside the one graph, the code between
            them (RMSNorm, rotary, KV-cache writes, residual adds, SiLU*up,
            argmax) is fused by Inductor; the compiled step is then captured
            in a CUDA graph like the eager one (the equivalent of mode
            "reduce-overhead", done by hand so that both modes replay the
            same way).  One compilation per format and batch size (Dynamo
            is reset in between), timed and excluded from the step time.
            Before timing, one compiled step is compared with one eager step
            from the same state.  A failure anywhere (tracing, Inductor,
            a graph break, a recompilation during capture, the capture
            itself, a compiled step that disagrees with the eager one) is
            reported as FAILED for that row, never replaced by eager
            timings, and the exit code is 3.  Needs a CUDA device.
            --inductor-pdl compiles every format (BF16 too) with
            Inductor's programmatic dependent launch (off in torch by
            default): its Triton kernels let the next kernel launch early,
            and nibble's calls after them take it too.

Measured per format, mode and batch: the step time (CUDA events over
--steps replays after --warmup), tokens/s = batch / step time, and the
linear-layer time: a graph holding only the step's linear layers (every
layer's qkv, o, gate_up, down, or q, k, v, o, gate, up, down unfused, on
static inputs, plus lm_head), eager,
replayed the same way; its share of the step time is the GEMM share (lm_head
stays BF16 in every format, as in quantized checkpoints).

Correctness (NVFP4 and MXFP4, batch 1, --check-steps steps, eager): three
models run on the same tokens, those of a float32 twin (teacher forcing):

  twin      the dequantized weights (nb_dequantize: exactly the values the
            kernels multiply by) in float32 nn.Linear modules, and every
            other weight, activation and operation in float32;
  bf16-deq  the same dequantized weights rounded to BF16 in BF16 nn.Linear
            modules, BF16 activations (what the check compared with before);
  nibble    the model as benchmarked (nibble linears, BF16 activations).

Both BF16 models differ from the twin by BF16 rounding of the activations
(and bf16-deq also by rounding the NVFP4 weight x tensor scale products to
BF16); a wrong weight or kernel adds an error of the size of the weights'
own.  The check passes when nibble's logits are no further from the twin's
than CHECK_FACTOR (--check-factor, 2) times bf16-deq's (relative Frobenius
distance over all steps; the accuracy rule of FlashAttention 3: at most 2x
the error of a plain implementation in the same precision), and nibble's
top-1 tokens agree with the twin's on at least as many steps as bf16-deq's
do, less CHECK_SLACK of the steps (random weights give flat logits whose
near ties either BF16 model may resolve differently).  nibble against
bf16-deq directly (the old check) is reported alongside.  The exit code is
2 when a check fails.

Output: a table on stdout, e2e_decode.json and e2e_decode.csv in --out (with
the GPU, commit, torch and transformers versions).
"""

import argparse
import csv
import functools
import json
import math
import os
import platform
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(os.path.dirname(HERE))
if os.path.isdir(os.path.join(REPO, "python", "nibble")) and "nibble" not in sys.modules:
    sys.path.insert(0, os.path.join(REPO, "python"))

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402

FORMATS = ("bf16", "nvfp4", "mxfp4")        # the default --formats
INT_FORMATS = ("int4", "int4_sym", "int8", "nf4")  # also accepted (quantize_model's default groups)
MODES = ("eager", "compiled")
COMPILE_MODES = ("default", "max-autotune-no-cudagraphs")
SHAPES = {  # meta-llama/Llama-3.1-{8B,70B} config.json; default layer count
    "8b": (dict(vocab_size=128256, hidden_size=4096, intermediate_size=14336, num_attention_heads=32,
                num_key_value_heads=8), 32),
    "70b": (dict(vocab_size=128256, hidden_size=8192, intermediate_size=28672, num_attention_heads=64,
                 num_key_value_heads=8), 10),
    "tiny": (dict(vocab_size=512, hidden_size=256, intermediate_size=512, num_attention_heads=8,
                  num_key_value_heads=2), 2),
}
CHECK_FACTOR = 2.0    # nibble's distance to the float32 twin <= this x bf16-deq's (see check())
CHECK_SLACK = 0.1     # top-1 agreement with the twin: nibble's >= bf16-deq's - this share of the steps
MAX_COMPILED_DIFF = 0.1   # one compiled step against one eager step, relative logits difference


# ------------------------------------------------------------------ model

def llama_config(layers, tiny=False, shape="8b"):
    """LlamaConfig of `shape` ("8b", "70b"; "tiny" or tiny=True: a small
    model of the same structure) with `layers` decoder layers."""
    from transformers import LlamaConfig
    shape = "tiny" if tiny else shape
    small = shape == "tiny"
    return LlamaConfig(num_hidden_layers=layers, max_position_embeddings=131072, rms_norm_eps=1e-5,
                       rope_theta=500000.0, rope_scaling={"rope_type": "llama3", "factor": 8.0,
                                                          "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                                                          "original_max_position_embeddings": 8192},
                       tie_word_embeddings=False, bos_token_id=1 if small else 128000,
                       eos_token_id=2 if small else 128001, **SHAPES[shape][0])


def build_model(config, device, dtype, seed):
    """Random-weight LlamaForCausalLM on `device` (transformers' own init:
    normal(0, 0.02) linear and embedding weights, unit norms)."""
    from transformers import LlamaForCausalLM
    torch.manual_seed(seed)
    prev = torch.get_default_dtype()
    torch.set_default_dtype(dtype)
    try:
        with torch.device(device):
            model = LlamaForCausalLM(config)
    finally:
        torch.set_default_dtype(prev)
    # parameters in `dtype`; the rotary frequencies stay float32 as built
    for p in model.parameters():
        if p.dtype != dtype:
            p.data = p.data.to(dtype)
    return model.eval().requires_grad_(False)


def _nibble_layer(mod):
    """Whether mod is a nibble.torch.Linear (nibble.torch imported only if it
    already is)."""
    nt = sys.modules.get("nibble.torch")
    return nt is not None and isinstance(mod, nt.Linear)


class Decoder:
    """Greedy decoding of a Hugging Face Llama with a static KV cache kept
    here.  forward() takes T tokens at positions pos0 .. pos0+T-1 (prefill or
    one decode step); step() is one greedy decode step on the static state
    (ids, pos, history), safe to capture in a CUDA graph.  heads: (query
    heads, key/value heads) of this process when the model's attention is
    sharded (nibble.tp.shard_llama); None: the config's."""

    def __init__(self, model, batch, max_len, heads=None, glu=None):
        from transformers.models.llama.modeling_llama import apply_rotary_pos_emb
        self.rope = apply_rotary_pos_emb
        # glu: None (the model's act_fn(gate) * up, which Inductor fuses into
        # one kernel) or a function of the fused gate/up output (nibble.torch.glu,
        # nb_glu) used where gate_up_proj is a nibble layer
        self.glu = glu
        self.model = model
        cfg = model.config
        p = model.model.embed_tokens.weight
        dev, dt = p.device, p.dtype
        self.B, self.L = batch, max_len
        self.H, self.KVH = heads or (cfg.num_attention_heads, cfg.num_key_value_heads)
        self.hd = getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads
        self.G = self.H // self.KVH
        n = len(model.model.layers)
        self.k = [torch.zeros(batch, self.KVH, max_len, self.hd, dtype=dt, device=dev) for _ in range(n)]
        self.v = [torch.zeros_like(t) for t in self.k]
        pos = torch.arange(max_len, device=dev)[None]
        cos, sin = model.model.rotary_emb(torch.zeros(1, dtype=dt, device=dev), pos)
        self.cos, self.sin = cos[0].contiguous(), sin[0].contiguous()   # [L, hd]
        self.key_idx = torch.arange(max_len, device=dev)
        self.ids = torch.zeros(batch, 1, dtype=torch.long, device=dev)
        self.pos = torch.zeros((), dtype=torch.long, device=dev)
        self.hist = torch.zeros(batch, max_len, dtype=torch.long, device=dev)

    def forward(self, ids, pos0):
        m = self.model.model
        B, T = ids.shape
        positions = pos0 + torch.arange(T, device=ids.device)
        cos, sin = self.cos.index_select(0, positions)[None], self.sin.index_select(0, positions)[None]
        mask = (self.key_idx[None, :] <= positions[:, None]).repeat(self.G, 1)     # [G*T, L]: True = attend
        x = m.embed_tokens(ids)
        for i, layer in enumerate(m.layers):
            a = layer.self_attn
            h = layer.input_layernorm(x)
            if hasattr(a, "qkv_proj"):     # fused (nibble.torch.fuse_projections): one GEMM, split as engines do
                q, k, v = a.qkv_proj(h).split([a.q_proj.out_features, a.k_proj.out_features,
                                               a.v_proj.out_features], dim=-1)
            else:
                q, k, v = a.q_proj(h), a.k_proj(h), a.v_proj(h)
            q = q.view(B, T, self.H, self.hd).transpose(1, 2)
            k = k.view(B, T, self.KVH, self.hd).transpose(1, 2)
            v = v.view(B, T, self.KVH, self.hd).transpose(1, 2)
            q, k = self.rope(q, k, cos, sin)
            # (an index_put_, as in gpt-fast: Inductor writes it in place)
            self.k[i][:, :, positions] = k
            self.v[i][:, :, positions] = v
            # Query head j*G+g uses KV head j (transformers' repeat_kv): group
            # the G query heads of each KV head as G*T query rows instead of
            # copying the cache G times.
            qg = q.reshape(B, self.KVH, self.G * T, self.hd)
            o = F.scaled_dot_product_attention(qg, self.k[i], self.v[i], attn_mask=mask, scale=a.scaling)
            o = o.reshape(B, self.H, T, self.hd).transpose(1, 2).reshape(B, T, self.H * self.hd)
            x = x + a.o_proj(o)
            mlp = layer.mlp
            if hasattr(mlp, "gate_up_proj") and self.glu is not None and _nibble_layer(mlp.gate_up_proj):
                x = x + mlp.down_proj(self.glu(mlp.gate_up_proj(layer.post_attention_layernorm(x))))
            elif hasattr(mlp, "gate_up_proj"):
                g, u = mlp.gate_up_proj(layer.post_attention_layernorm(x)).split(
                    [mlp.gate_proj.out_features, mlp.up_proj.out_features], dim=-1)
                x = x + mlp.down_proj(mlp.act_fn(g) * u)
            else:
                x = x + mlp(layer.post_attention_layernorm(x))
        x = m.norm(x[:, -1:])
        return self.model.lm_head(x)[:, -1].float()                             # [B, vocab]

    def prefill(self, prompt):
        """Run the prompt [B, P]; the next input token and the history are
        set, pos = P."""
        P = prompt.shape[1]
        logits = self.forward(prompt, torch.zeros((), dtype=torch.long, device=prompt.device))
        nxt = logits.argmax(-1)
        self.hist.zero_()
        self.hist[:, :P] = prompt
        self.hist[:, P] = nxt
        self.ids.copy_(nxt[:, None])
        self.pos.fill_(P)
        return logits

    def step(self):
        logits = self.forward(self.ids, self.pos)
        nxt = logits.argmax(-1)
        self.ids.copy_(nxt[:, None])
        self.hist.index_copy_(1, (self.pos + 1).view(1), nxt[:, None])
        self.pos.add_(1)
        return logits


def linear_calls(model, batch):
    """The linear layers of one decode step on static inputs, in step order
    (for the GEMM-only graph)."""
    cfg = model.config
    p = model.model.embed_tokens.weight
    xh = torch.randn(batch, 1, cfg.hidden_size, dtype=p.dtype, device=p.device)
    xi = torch.randn(batch, 1, cfg.intermediate_size, dtype=p.dtype, device=p.device)
    hd = getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads
    xo = torch.randn(batch, 1, cfg.num_attention_heads * hd, dtype=p.dtype, device=p.device)
    calls = []
    for layer in model.model.layers:
        a, mlp = layer.self_attn, layer.mlp
        qkv = [(a.qkv_proj, xh)] if hasattr(a, "qkv_proj") else [(a.q_proj, xh), (a.k_proj, xh), (a.v_proj, xh)]
        gate_up = ([(mlp.gate_up_proj, xh)] if hasattr(mlp, "gate_up_proj")
                   else [(mlp.gate_proj, xh), (mlp.up_proj, xh)])
        calls += qkv + [(a.o_proj, xo)] + gate_up + [(mlp.down_proj, xi)]
    head = [(model.lm_head, xh)]
    return calls, head


# ----------------------------------------------------------------- timing

class Timer:
    """Replays a captured graph (CUDA) or calls the function (CPU / no
    graph) and returns milliseconds per call.  With strict=True a failed
    capture raises instead of falling back to eager calls."""

    def __init__(self, fn, device, graph, strict=False):
        self.fn, self.device, self.graph = fn, device, None
        self.note = "eager"
        if device.type == "cuda" and graph:
            s = torch.cuda.Stream()
            s.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(s):
                for _ in range(2):
                    fn()
            torch.cuda.current_stream().wait_stream(s)
            try:
                g = torch.cuda.CUDAGraph()
                with torch.cuda.graph(g):
                    fn()
                self.graph, self.note = g, "cuda graph"
            except Exception as e:  # noqa: BLE001 - reported, timing falls back to eager
                if strict:
                    raise
                self.note = f"eager (capture failed: {type(e).__name__}: {str(e).splitlines()[0][:120]})"
                torch.cuda.synchronize()

    def run(self):
        if self.graph is not None:
            self.graph.replay()
        else:
            self.fn()

    def time(self, warmup, iters, before=None):
        if before is not None:
            before()
        for _ in range(warmup):
            self.run()
        if self.device.type == "cuda":
            torch.cuda.synchronize()
            t0, t1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            t0.record()
            for _ in range(iters):
                self.run()
            t1.record()
            torch.cuda.synchronize()
            return t0.elapsed_time(t1) / iters
        t = time.perf_counter()
        for _ in range(iters):
            self.run()
        return (time.perf_counter() - t) * 1e3 / iters


def cache_len(tokens):
    """KV cache positions for `tokens` tokens, rounded up to a multiple of 16
    (aligned rows for the attention mask)."""
    return (tokens + 8 + 15) // 16 * 16


class CompileError(RuntimeError):
    """The compiled step could not be built, captured or trusted."""


def _dynamo():
    import importlib
    return importlib.import_module("torch._dynamo")


def _graphs_compiled():
    """Graphs Dynamo has compiled since compile_step cleared the counters."""
    return int(_dynamo().utils.counters["stats"]["unique_graphs"])


def inductor_pdl_default():
    """Whether Inductor generates programmatic dependent launch by default here
    (TORCHINDUCTOR_ENABLE_PDL=1; None where this torch has no such switch)."""
    import torch._inductor.config as ic
    return getattr(ic.triton, "enable_pdl", None)


def compile_step(dec, prompt, mode="default", backend="inductor", pdl=False):
    """torch.compile of dec.step (fullgraph, static shapes), compiled now on
    the state after prefill(prompt) and checked against one eager step from
    that state; pdl: with Inductor's programmatic dependent launch
    (torch._inductor.config.triton.enable_pdl, for this compilation).
    Returns (compiled function, compile seconds, relative logits
    difference).  Raises CompileError on any failure: a graph break
    (fullgraph), a recompilation past Dynamo's limit (which would otherwise
    run the step eagerly without a word), an Inductor error, or a compiled
    step that disagrees with the eager one."""
    if pdl:
        if inductor_pdl_default() is None:
            raise CompileError(f"--inductor-pdl: torch {torch.__version__}'s Inductor has no "
                               "triton.enable_pdl switch")
        import torch._inductor.config as ic
        with ic.patch({"triton.enable_pdl": True}):
            return compile_step(dec, prompt, mode, backend)
    dynamo = _dynamo()
    dynamo.reset()
    dynamo.utils.counters.clear()   # (reset() keeps them): _graphs_compiled() counts this step's graphs
    if hasattr(dynamo.config, "fail_on_recompile_limit_hit"):   # (older torch: fullgraph raises there anyway)
        dynamo.config.fail_on_recompile_limit_hit = True
    kwargs = {} if mode == "default" else {"mode": mode}
    fn = torch.compile(dec.step, fullgraph=True, dynamic=False, backend=backend, **kwargs)
    sync = torch.cuda.synchronize if dec.ids.is_cuda else (lambda: None)
    try:
        dec.prefill(prompt)
        ref = dec.step().clone()
        dec.prefill(prompt)
        sync()
        t = time.time()
        got = fn()
        sync()
        seconds = time.time() - t
    except Exception as e:  # noqa: BLE001 - re-raised with what failed
        raise CompileError(f"torch.compile of the decode step failed: {type(e).__name__}: "
                           f"{str(e).strip().splitlines()[0][:300] if str(e).strip() else ''}") from e
    if _graphs_compiled() < 1:
        raise CompileError("torch.compile produced no graph (the step ran eagerly)")
    diff = float((got - ref).norm() / ref.norm())
    if not math.isfinite(diff) or diff > MAX_COMPILED_DIFF:
        raise CompileError(f"the compiled step's logits differ from the eager step's by {diff:.3g} (relative; "
                           f"bound {MAX_COMPILED_DIFF})")
    return fn, seconds, diff


def run_batch(model, batch, args, device, gen, modes, fmt):
    """One row per mode: step time, tokens/s, the linear layers' time."""
    max_len = cache_len(args.prompt + args.warmup + args.steps)
    prompt = torch.randint(0, model.config.vocab_size, (batch, args.prompt), generator=gen).to(device)
    rows = []
    with torch.no_grad():
        calls, head = linear_calls(model, batch)

        def linears():
            for mod, x in calls:
                mod(x)

        def lm_head():
            for mod, x in head:
                mod(x)
        lin_ms = Timer(linears, device, not args.no_graph).time(args.warmup, args.steps)
        head_ms = Timer(lm_head, device, not args.no_graph).time(args.warmup, args.steps)
        glu = None
        if args.glu == "nibble" and fmt != "bf16":
            import nibble.torch as nt
            glu = nt.glu
        dec = Decoder(model, batch, max_len, glu=glu)
        for mode in modes:
            r = {"format": fmt, "mode": mode, "batch": batch, "linear_ms": lin_ms, "lm_head_ms": head_ms,
                 "glu": "nibble" if glu is not None else "torch"}
            try:
                if mode == "eager":
                    dec.prefill(prompt)
                    step = Timer(dec.step, device, not args.no_graph)
                else:
                    fn, r["compile_s"], r["compiled_vs_eager"] = compile_step(dec, prompt, args.compile_mode,
                                                                               pdl=args.inductor_pdl)
                    n_graphs = _graphs_compiled()
                    dec.prefill(prompt)
                    try:
                        step = Timer(fn, device, True, strict=True)
                    except Exception as e:  # noqa: BLE001
                        raise CompileError(f"CUDA graph capture of the compiled step failed: {type(e).__name__}: "
                                           f"{str(e).strip().splitlines()[0][:300] if str(e).strip() else ''}") from e
                    if _graphs_compiled() != n_graphs:
                        raise CompileError("the compiled step recompiled during capture (guards failed)")
                    step.note = f"torch.compile ({compile_settings(args)}) + cuda graph"
                r["step_ms"] = step.time(args.warmup, args.steps, before=functools.partial(dec.prefill, prompt))
                r["tokens_per_s"] = batch * 1e3 / r["step_ms"]
                r["gemm_share"] = (lin_ms + head_ms) / r["step_ms"]
                r["graph"] = step.note
                if args.profile and device.type == "cuda":
                    dec.prefill(prompt)
                    r["profile"] = profile_step(step, args.profile_steps, args.profile, f"{fmt}-b{batch}-{mode}")
                del step
            except CompileError as e:
                r.update(step_ms=None, tokens_per_s=None, gemm_share=None, graph="FAILED", error=str(e))
            rows.append(r)
            if mode == "compiled":
                _dynamo().reset()
    del dec
    if device.type == "cuda":
        torch.cuda.empty_cache()
    return rows


KERNEL_KINDS = (  # (kind, substrings of a kernel's name), first match wins
    ("inductor (triton)", ("triton",)),   # (before the others: Inductor names kernels after the ops they fuse)
    ("nibble", ("gemv_fp4", "gemv_int", "gemv_table", "gemm_sm90", "gemm_sm80", "gemm_naive", "moe_align",
                "moe_gather", "moe_gemv", "moe_combine", "moe_sm90", "dequant_kernel", "pack_kernel",
                "pack_int_kernel", "quantize_block", "quantize_scan", "exp_range", "glu_kernel")),
    ("attention", ("sdpa", "flash", "fmha", "attention")),
    ("gemm (cuBLAS)", ("nvjet", "cublas", "gemm", "cutlass", "xmma")),
    ("copy / set", ("memcpy", "memset")),
)


def kernel_kind(name):
    """The kind of a GPU activity by its name (KERNEL_KINDS), else "other"."""
    low = name.lower()
    for kind, keys in KERNEL_KINDS:
        if any(k in low for k in keys):
            return kind
    return "other"


def summarize_kernels(kern, reps, tag):
    """(summary, text) of `reps` steps' GPU activities kern = [(start_us,
    end_us, name), ...]: per kind and per name the launches and microseconds
    per step, the busy time (the union of the intervals) and the span (first
    start to last end) per step; text is the table profile_step writes."""
    kern = sorted(kern)
    if not kern:
        return {"error": "the profiler recorded no kernels"}, f"# {tag}: the profiler recorded no kernels\n"
    by_name, by_kind = {}, {}
    for t0, t1, name in kern:
        kind = kernel_kind(name)
        n = by_name.setdefault(name, [0, 0.0, kind])
        n[0] += 1
        n[1] += t1 - t0
        k = by_kind.setdefault(kind, [0, 0.0])
        k[0] += 1
        k[1] += t1 - t0
    busy, end = 0.0, kern[0][0]
    for t0, t1, _ in kern:
        if t1 > end:
            busy += t1 - max(t0, end)
            end = t1
    span = end - kern[0][0]   # (end: the last end, after the loop)
    summary = {"reps": reps, "kernels_per_step": len(kern) / reps, "span_us": span / reps, "busy_us": busy / reps,
               "kinds": {k: {"launches": v[0] / reps, "us": v[1] / reps} for k, v in by_kind.items()}}
    lines = [f"# {tag}: {reps} replays; per step: {len(kern) / reps:.1f} kernels, span {span / reps:.1f} us, "
             f"busy {busy / reps:.1f} us (idle {(span - busy) / reps:.1f})",
             "# kind | launches/step | us/step"]
    lines += [f"{k} | {v[0] / reps:.1f} | {v[1] / reps:.1f}" for k, v in sorted(by_kind.items(), key=lambda kv: -kv[1][1])]
    lines.append("# kernel | kind | launches/step | us/step | us/launch")
    lines += [f"{name[:160]} | {v[2]} | {v[0] / reps:.2f} | {v[1] / reps:.1f} | {v[1] / v[0]:.2f}"
              for name, v in sorted(by_name.items(), key=lambda kv: -kv[1][1])]
    return summary, "\n".join(lines) + "\n"


def profile_step(step, reps, out_dir, tag):
    """The GPU activities of `reps` replays of a timed step under
    torch.profiler (CUPTI records the kernels inside a CUDA graph one by
    one), summarized by summarize_kernels into out_dir/profile-<tag>.txt;
    returns the summary.  The profiler's own cost lengthens the span a
    little against the step's timed length."""
    from torch.profiler import profile, ProfilerActivity
    for _ in range(2):
        step.run()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(reps):
            step.run()
        torch.cuda.synchronize()
    kern = [(e.time_range.start, e.time_range.end, e.name) for e in prof.events()
            if "CUDA" in str(getattr(e, "device_type", "")) and e.time_range.end > e.time_range.start]
    summary, text = summarize_kernels(kern, reps, tag)
    os.makedirs(out_dir, exist_ok=True)
    with open(os.path.join(out_dir, f"profile-{tag}.txt"), "w") as fh:
        fh.write(text)
    return summary


def greedy(model, prompt, steps, forced=None, heads=None):
    """Eager decode of `steps` steps after the prompt.  Returns (tokens
    [B, steps+1], logits [steps+1, B, vocab] on the CPU): greedy, or, with
    `forced` [B, steps+1], fed the forced tokens (teacher forcing) while the
    returned tokens are still each step's argmax.  heads: as Decoder."""
    with torch.no_grad():
        dec = Decoder(model, prompt.shape[0], cache_len(prompt.shape[1] + steps), heads)
        P = prompt.shape[1]
        logits = [dec.prefill(prompt).cpu()]
        tokens = [logits[0].argmax(-1)]
        for i in range(steps):
            if forced is not None:
                dec.ids.copy_(forced[:, i:i + 1].to(dec.ids.device))
            logits.append(dec.forward(dec.ids, dec.pos).cpu())
            tokens.append(logits[-1].argmax(-1))
            dec.ids.copy_(tokens[-1][:, None].to(dec.ids.device))
            dec.pos.add_(1)
        assert dec.pos.item() == P + steps
        return torch.stack(tokens, 1), torch.stack(logits)


def swap_linears(model, modules):
    """Set each named submodule; returns the ones it replaced."""
    old = {}
    for name, mod in modules.items():
        parent_name, _, child = name.rpartition(".")
        parent = model.get_submodule(parent_name) if parent_name else model
        old[name] = getattr(parent, child)
        setattr(parent, child, mod)
    return old


def dequantized_linears(weights, originals, device, dtype):
    import nibble.torch as nt
    out = {}
    for name, qw in weights.items():
        lin = torch.nn.Linear(qw.k, qw.n, bias=originals[name].bias is not None, device="meta")
        lin.weight = torch.nn.Parameter(nt.dequantize_weight(qw, dtype, device), requires_grad=False)
        if lin.bias is not None:
            lin.bias = torch.nn.Parameter(originals[name].bias.detach().clone(), requires_grad=False)
        out[name] = lin
    return out


def quantize_cpu(model, fmt, bf16_linears):
    """CPU stand-in for quantize_model (nibble's GEMM needs CUDA): the linear
    layers get their dequantized weights.  Returns {name: QuantizedWeight}."""
    import nibble
    weights = {n: nibble.quantize(m.weight.detach().float().numpy(), format=fmt) for n, m in bf16_linears.items()}
    swap_linears(model, dequantized_linears(weights, bf16_linears, torch.device("cpu"), model.lm_head.weight.dtype))
    return weights


# ------------------------------------------------------------------- main

def parse_lists(ap, args, formats):
    """args.batches and args.formats from their comma lists (ap.error on a
    bad one; formats must be among `formats`)."""
    try:
        args.batches = [int(b) for b in args.batches.split(",") if b.strip()]
    except ValueError:
        ap.error(f"--batches: a comma list of integers, got {args.batches!r}")
    args.formats = [f.strip().lower() for f in args.formats.split(",") if f.strip()]
    for f in args.formats:
        if f not in formats:
            ap.error(f"unknown format {f!r}; choose from {', '.join(formats)}")


def parse_args(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__)
    ap.add_argument("--shape", default="8b", choices=("8b", "70b"),
                    help="layer shapes of Llama-3.1-8B (default) or Llama-3.1-70B")
    ap.add_argument("--layers", type=int, default=None,
                    help="decoder layers (default 32 for 8b, the whole model; 10 of 80 for 70b)")
    ap.add_argument("--batches", default="1,8,32", help="comma list of batch sizes (default 1,8,32)")
    ap.add_argument("--steps", type=int, default=64, help="timed decode steps per batch (default 64)")
    ap.add_argument("--warmup", type=int, default=8, help="untimed steps before timing (default 8)")
    ap.add_argument("--prompt", type=int, default=32, help="prompt tokens (random ids; default 32)")
    ap.add_argument("--formats", default=",".join(FORMATS),
                    help="comma list of bf16, nvfp4, mxfp4 (default), int4, int4_sym, int8, nf4")
    ap.add_argument("--modes", default=None,
                    help="comma list of eager, compiled (default: both on CUDA, eager on the CPU)")
    ap.add_argument("--compile-mode", default="default", choices=COMPILE_MODES,
                    help="torch.compile mode of the compiled step (default: Inductor's default); the CUDA graph "
                         "is captured by this script in both cases")
    ap.add_argument("--check-steps", type=int, default=16,
                    help="greedy steps of the correctness check (0: no check; default 16)")
    ap.add_argument("--check-factor", type=float, default=CHECK_FACTOR,
                    help=f"nibble's logits distance to the float32 twin may be this many times the BF16 "
                         f"dequantized model's (default {CHECK_FACTOR})")
    ap.add_argument("--threads", type=int, default=None, help="host quantization threads (default: CPU count)")
    ap.add_argument("--device", default="cuda", help="cuda (default), cuda:N, or cpu for a plumbing check")
    ap.add_argument("--tiny", action="store_true", help="a tiny model of the same structure (for --device cpu)")
    ap.add_argument("--no-graph", action="store_true",
                    help="time eager steps instead of CUDA graph replays (eager mode only)")
    ap.add_argument("--no-fuse", action="store_true",
                    help="keep q/k/v and gate/up as separate layers (default: fused in every format, "
                         "nibble.torch.fuse_projections before quantizing, as serving engines run them)")
    ap.add_argument("--glu", default="nibble", choices=("torch", "nibble"),
                    help="the MLP's silu(gate) * up in the quantized formats: nibble (nibble.torch.glu, nb_glu, "
                         "between the two nibble GEMMs, as an engine's silu_and_mul; default) or torch (the "
                         "model's own, which Inductor fuses into one kernel); BF16 always runs torch's")
    ap.add_argument("--inductor-pdl", action="store_true",
                    help="compile with Inductor's programmatic dependent launch (torch._inductor.config.triton."
                         "enable_pdl, as TORCHINDUCTOR_ENABLE_PDL=1) in every format, BF16 included: its Triton "
                         "kernels let the next kernel launch early, and nibble's calls after them take it")
    ap.add_argument("--profile", default=None, metavar="DIR",
                    help="also record each timed step's kernels with torch.profiler and write "
                         "DIR/profile-<format>-b<batch>-<mode>.txt (kernels, kinds, busy and idle time per step)")
    ap.add_argument("--profile-steps", type=int, default=8, help="replays recorded by --profile (default 8)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", default=None, help="directory for e2e_decode.json and e2e_decode.csv")
    args = ap.parse_args(argv)

    parse_lists(ap, args, FORMATS + INT_FORMATS)
    if not args.inductor_pdl and inductor_pdl_default():
        args.inductor_pdl = True   # TORCHINDUCTOR_ENABLE_PDL=1 in the environment: the results say so
    if args.layers is None:
        args.layers = SHAPES["tiny" if args.tiny else args.shape][1]
    if args.layers < 1 or not args.batches or min(args.batches) < 1 or args.steps < 1:
        ap.error("--layers, --batches and --steps must be positive")
    if args.check_factor <= 0:
        ap.error("--check-factor must be positive")
    args.device = torch.device(args.device)
    cuda = args.device.type == "cuda"
    if args.modes is None:
        args.modes = list(MODES) if cuda else ["eager"]
    else:
        args.modes = [m.strip().lower() for m in args.modes.split(",") if m.strip()]
    for m in args.modes:
        if m not in MODES:
            ap.error(f"unknown mode {m!r}; choose from {', '.join(MODES)}")
    if not args.modes:
        ap.error("--modes: name at least one of eager, compiled")
    if "compiled" in args.modes and not cuda:
        ap.error(f"--modes compiled needs a CUDA device (it captures the compiled step in a CUDA graph and "
                 f"nibble's GEMM runs only on CUDA); {args.device} can run --modes eager only")
    if "compiled" in args.modes and args.no_graph:
        ap.error("--no-graph applies to eager mode only: the compiled mode is always timed as CUDA graph replays")
    if cuda and not torch.cuda.is_available():
        ap.error("no CUDA device; use --device cpu --tiny for a plumbing check")
    return ap, args


def compile_settings(args):
    """The compiled step's settings as the header and each row's note print them."""
    return args.compile_mode + (", Inductor PDL" if args.inductor_pdl else "")


def main(argv=None):
    ap, args = parse_args(argv)
    device = args.device
    import transformers
    import nibble
    if device.type == "cuda":
        import nibble.torch as nt
        if not nibble.build_info()["cuda"]:
            ap.error("libnibble was built without CUDA (rebuild with nvcc on the PATH)")
        if device.index is not None:
            torch.cuda.set_device(device)
    dtype = torch.bfloat16
    t_start = time.time()

    shape = "tiny" if args.tiny else args.shape
    cfg = llama_config(args.layers, shape=shape)
    t0 = time.time()
    model = build_model(cfg, device, dtype, args.seed)
    nparams = sum(p.numel() for p in model.parameters())
    if not args.no_fuse:
        from nibble.fuse import fuse_projections
        fuse_projections(model)   # BF16 layers: every format (BF16 too) runs q/k/v and gate/up fused
    gpu = torch.cuda.get_device_name(device) if device.type == "cuda" else platform.processor() or "cpu"
    name = {"8b": "Llama-3.1-8B", "70b": "Llama-3.1-70B", "tiny": "tiny Llama"}[shape]
    print(f"model: {name} shape, {args.layers} layers, {nparams / 1e9:.2f}B parameters, {dtype}, random "
          f"weights, built in {time.time() - t0:.1f} s on {gpu}")
    print(f"decode: prompt {args.prompt}, {args.warmup} warm-up + {args.steps} timed steps per batch; "
          f"batches {args.batches}; modes {', '.join(args.modes)}"
          + (f" (torch.compile mode {compile_settings(args)})" if "compiled" in args.modes else "")
          + f"; graphs {'off (eager mode)' if args.no_graph else 'on'}"
          + f"; q/k/v and gate/up {'separate' if args.no_fuse else 'fused (one GEMM each, every format)'}"
          + f"; silu(gate) * up: {'nibble.torch.glu in the quantized formats' if args.glu == 'nibble' else 'torch'}"
          + "".join(f"; {k}={v}" for k, v in nibble_env().items()),
          flush=True)

    gen = torch.Generator().manual_seed(args.seed + 1)
    rows, checks = [], []
    check_prompt = torch.randint(0, cfg.vocab_size, (1, args.prompt), generator=gen).to(device)
    # The BF16 linear modules: quantize_model replaces modules (it does not
    # change them), so each format starts from these and they are put back.
    bf16_linears = {n: m for n, m in model.named_modules()
                    if isinstance(m, torch.nn.Linear) and not n.endswith("lm_head")}
    for fmt in args.formats:
        info = {"format": fmt}
        weights = None
        if fmt != "bf16":
            t0 = time.time()
            if device.type == "cuda":
                weights = nt.quantize_model(model, format=fmt, exclude=["lm_head"], threads=args.threads,
                                            return_weights=True)["weights"]
                torch.cuda.synchronize()
                how = "on the GPU: nb_quantize + nb_pack"
            else:
                weights = quantize_cpu(model, fmt, bf16_linears)
                how = "CPU stand-in: dequantized weights"
            info["quantize_s"] = time.time() - t0
            print(f"{fmt}: quantized {len(weights)} linear layers in {info['quantize_s']:.1f} s ({how})", flush=True)
        for b in args.batches:
            for r in run_batch(model, b, args, device, gen, args.modes, fmt):
                r.update(info)
                r["weights_gb"] = weight_bytes(model) / 1e9
                rows.append(r)
                if r["step_ms"] is None:
                    print(f"  {fmt:<6} {r['mode']:<8} batch {b:>3}: FAILED: {r['error']}", flush=True)
                    continue
                extra = (f", compiled in {r['compile_s']:.1f} s, logits {r['compiled_vs_eager']:.1e} from eager"
                         if r["mode"] == "compiled" else "")
                print(f"  {fmt:<6} {r['mode']:<8} batch {b:>3}: {r['step_ms']:8.3f} ms/step  "
                      f"{r['tokens_per_s']:9.1f} tok/s  linears {r['linear_ms']:7.3f} ms + lm_head "
                      f"{r['lm_head_ms']:6.3f} ms ({100 * r['gemm_share']:.0f}% of the step)  [{r['graph']}{extra}]",
                      flush=True)
        if weights is not None:
            if args.check_steps > 0:
                c = check(model, weights, bf16_linears, check_prompt, args.check_steps, device, dtype, fmt,
                          args.check_factor)
                checks.append(c)
                print("  check: " + check_line(c), flush=True)
            swap_linears(model, bf16_linears)
            del weights
            if device.type == "cuda":
                torch.cuda.empty_cache()

    total = time.time() - t_start
    if args.out:
        write_out(args, rows, checks, cfg, gpu, total, transformers.__version__)
    print(f"total {total:.0f} s")
    print_table(rows)
    for c in checks:
        print(f"check {c['format']}: " + check_line(c))
    for r in rows:
        if r["step_ms"] is None:
            print(f"FAILED {r['format']} {r['mode']} batch {r['batch']}: {r['error']}")
    return rows, checks


def exit_code(rows, checks):
    """2: a correctness check failed; 3: a compiled step failed; 0: all well."""
    if any(not c["ok"] for c in checks):
        return 2
    return 3 if any(r["step_ms"] is None for r in rows) else 0


def weight_bytes(model):
    """Bytes of the model's weights as stored: parameters plus the packed
    4-bit buffers (not the GEMM workspaces)."""
    n = sum(p.numel() * p.element_size() for p in model.parameters())
    return n + sum(b.numel() for name, b in model.named_buffers() if name.endswith(".packed"))


class float32_rest:
    """Within: every parameter of `model` that is not float32 held as a
    float32 copy (upcasts are exact), TF32 matmuls off; restored to the very
    tensors it had on exit."""

    def __init__(self, model):
        self.model = model

    def __enter__(self):
        self.saved = []
        for p in self.model.parameters():
            if p.dtype != torch.float32:
                self.saved.append((p, p.data))
                p.data = p.data.float()
        self.tf32 = torch.backends.cuda.matmul.allow_tf32
        torch.backends.cuda.matmul.allow_tf32 = False
        return self.model

    def __exit__(self, *exc):
        for p, data in self.saved:
            p.data = data
        self.saved = []
        torch.backends.cuda.matmul.allow_tf32 = self.tf32
        return False


def _rel(a, b):
    """||a - b|| / ||b|| over every element (Frobenius)."""
    return float((a - b).norm() / b.norm())


def check(model, weights, bf16_linears, prompt, steps, device, dtype, fmt, factor=CHECK_FACTOR):
    """The model as it is (nibble linears), the same model with the
    dequantized weights in BF16 nn.Linear modules (bf16-deq) and its float32
    twin (the dequantized weights in float32, everything else in float32;
    see the module's docstring), batch 1, eager.

    The twin decodes greedily; nibble and bf16-deq are fed its tokens
    (teacher forcing).  d_nibble and d_bf16 are their logits' relative
    distances to the twin's over all steps, top1_* the steps on which their
    argmax equals the twin's.  ok: d_nibble <= factor * d_bf16 and
    top1_nibble >= top1_bf16 - ceil(CHECK_SLACK * steps).

    Reported too, as the check was before the twin: free-running greedy
    tokens of nibble against bf16-deq, and nibble fed bf16-deq's tokens
    (forced_agree; a difference counts as a near tie when bf16-deq's top-2
    logits are closer than twice the largest logit difference of that step;
    logits_rel_error is that run's relative logits difference)."""
    # the float32 twin first (the largest; freed before the BF16 copy is made)
    deq32 = dequantized_linears(weights, bf16_linears, device, torch.float32)
    nib = swap_linears(model, deq32)
    with float32_rest(model):
        tok_t, log_t = greedy(model, prompt, steps)
    swap_linears(model, nib)
    del deq32
    if device.type == "cuda":
        torch.cuda.empty_cache()
    deq = dequantized_linears(weights, bf16_linears, device, dtype)
    swap_linears(model, deq)
    tok_r, log_r = greedy(model, prompt, steps)
    tok_rt, log_rt = greedy(model, prompt, steps, forced=tok_t)
    swap_linears(model, nib)
    del deq
    tok_q, _ = greedy(model, prompt, steps)
    tok_f, log_f = greedy(model, prompt, steps, forced=tok_r)
    tok_qt, log_qt = greedy(model, prompt, steps, forced=tok_t)

    n = tok_t.shape[1]
    d_nib, d_bf16 = _rel(log_qt, log_t), _rel(log_rt, log_t)
    top1_nib, top1_bf16 = int((tok_qt == tok_t)[0].sum()), int((tok_rt == tok_t)[0].sum())
    slack = math.ceil(CHECK_SLACK * n)
    ok = d_nib <= factor * d_bf16 and top1_nib >= top1_bf16 - slack

    same = (tok_q == tok_r)[0].tolist()
    first_diff = next((i for i, s in enumerate(same) if not s), None)
    top2 = log_r.topk(2, dim=-1).values
    margin = (top2[..., 0] - top2[..., 1])[:, 0]                  # [steps+1], batch 0
    diff = (log_f - log_r).abs().amax(-1)[:, 0]
    forced_same = (tok_f == tok_r)[0]
    near_tie = margin <= 2 * diff
    return {"format": fmt, "steps": n, "ok": bool(ok), "factor": factor, "slack": slack,
            "d_nibble": d_nib, "d_bf16": d_bf16, "ratio": d_nib / d_bf16 if d_bf16 > 0 else math.inf,
            "top1_nibble": top1_nib, "top1_bf16": top1_bf16,
            "agree": int(sum(same)), "first_diff": first_diff,
            "forced_agree": int(forced_same.sum()), "forced_near_ties": int((~forced_same & near_tie).sum()),
            "tokens": tok_q[0].tolist(), "reference_tokens": tok_r[0].tolist(), "twin_tokens": tok_t[0].tolist(),
            "logits_max_diff": float(diff.max()), "logits_rel_error": _rel(log_f, log_r),
            "logits_range": float(log_r.max() - log_r.min()), "min_top2_margin": float(margin.min())}


def check_line(c):
    return (f"{'OK' if c['ok'] else 'MISMATCH'}: logits distance to the float32 twin {c['d_nibble']:.2e} (nibble) "
            f"vs {c['d_bf16']:.2e} (BF16 dequantized), ratio {c['ratio']:.2f} (bound {c['factor']:g}); top-1 "
            f"equal to the twin's on {c['top1_nibble']}/{c['steps']} steps (nibble) vs {c['top1_bf16']}/"
            f"{c['steps']} (BF16 dequantized; slack {c['slack']}); nibble vs BF16 dequantized: greedy "
            f"{c['agree']}/{c['steps']} tokens equal, teacher-forced top-1 {c['forced_agree']}/{c['steps']} "
            f"({c['forced_near_ties']} near ties), logits {c['logits_rel_error']:.2e} apart")


def _f(v, fmt):
    return "-" if v is None else format(v, fmt)


def print_table(rows):
    base = {(r["mode"], r["batch"]): r for r in rows if r["format"] == "bf16" and r["step_ms"] is not None}
    eager = {(r["format"], r["batch"]): r for r in rows if r["mode"] == "eager" and r["step_ms"] is not None}
    print()
    print("| format | mode | batch | ms/step | tokens/s | vs BF16 | vs eager | linears ms | lm_head ms | GEMM share "
          "| timing |")
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    for r in rows:
        if r["step_ms"] is None:
            print(f"| {r['format']} | {r['mode']} | {r['batch']} | FAILED | - | - | - | {r['linear_ms']:.3f} | "
                  f"{r['lm_head_ms']:.3f} | - | see above |")
            continue
        b = base.get((r["mode"], r["batch"]))
        e = eager.get((r["format"], r["batch"]))
        sp = f"{b['step_ms'] / r['step_ms']:.2f}x" if b else "-"
        se = f"{e['step_ms'] / r['step_ms']:.2f}x" if e else "-"
        print(f"| {r['format']} | {r['mode']} | {r['batch']} | {r['step_ms']:.3f} | {r['tokens_per_s']:.1f} | {sp} | "
              f"{se} | {r['linear_ms']:.3f} | {r['lm_head_ms']:.3f} | {100 * r['gemm_share']:.0f}% | {r['graph']} |")
    print()


def commit():
    """$NB_GIT_COMMIT when set (a copy of the tree on another machine may
    carry a stale .git), else the checkout's commit (git; "-dirty" after it
    when tracked files differ from it, as the C binaries record it), else
    "unknown"."""
    if os.environ.get("NB_GIT_COMMIT"):
        return os.environ["NB_GIT_COMMIT"]
    try:
        c = subprocess.run(["git", "-C", REPO, "rev-parse", "--short=12", "HEAD"], capture_output=True,
                           text=True).stdout.strip()
        if c and subprocess.run(["git", "-C", REPO, "diff", "--quiet", "HEAD", "--"],
                                capture_output=True).returncode == 1:
            c += "-dirty"
    except OSError:
        c = ""
    return c or "unknown"


def nibble_env():
    """The library's planner and launch switches set for this run (NIBBLE_PDL,
    NIBBLE_PATH, NIBBLE_TUNE_CACHE, ...; not where the library was found),
    so a result says how it was obtained."""
    return {k: v for k, v in sorted(os.environ.items())
            if k.startswith("NIBBLE_") and k not in ("NIBBLE_LIBRARY", "NIBBLE_REQUIRE_IO")}


def write_out(args, rows, checks, cfg, gpu, total, tf_version):
    import nibble
    os.makedirs(args.out, exist_ok=True)
    meta = {"gpu": gpu, "commit": commit(),
            "date": time.strftime("%Y-%m-%d %H:%M:%S"), "torch": torch.__version__, "transformers": tf_version,
            "nibble": nibble.version_string(), "shape": "tiny" if args.tiny else args.shape, "layers": args.layers,
            "tiny": args.tiny, "prompt": args.prompt, "steps": args.steps, "warmup": args.warmup,
            "modes": args.modes, "compile_mode": args.compile_mode, "fused": not args.no_fuse, "glu": args.glu,
            "inductor_pdl": bool(args.inductor_pdl),
            "device": str(args.device), "seconds": total, "nibble_env": nibble_env(),
            "config": {k: getattr(cfg, k) for k in ("hidden_size", "intermediate_size", "num_attention_heads",
                                                    "num_key_value_heads", "vocab_size", "num_hidden_layers")}}
    with open(os.path.join(args.out, "e2e_decode.json"), "w") as fh:
        json.dump({"meta": meta, "rows": rows, "checks": checks}, fh, indent=1)
    keys = ["format", "mode", "batch", "step_ms", "tokens_per_s", "linear_ms", "lm_head_ms", "gemm_share", "graph", "glu",
            "compile_s", "compiled_vs_eager", "quantize_s", "weights_gb", "error"]
    with open(os.path.join(args.out, "e2e_decode.csv"), "w", newline="") as fh:
        w = csv.writer(fh)
        w.writerow(keys + ["fused", "gpu", "commit"])
        for r in rows:
            w.writerow([r.get(k, "") if r.get(k) is not None else "" for k in keys]
                       + [int(meta["fused"]), gpu, meta["commit"]])
    print(f"wrote {args.out}/e2e_decode.json and e2e_decode.csv")


if __name__ == "__main__":
    sys.exit(exit_code(*main()))
