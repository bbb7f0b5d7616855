#!/usr/bin/env python3
"""End-to-end greedy decode: a Llama-3.1-8B-shaped model with random
weights, BF16 against nibble NVFP4 and MXFP4 (nibble.torch.quantize_model),
tokens per second at several batch sizes, and the share of the step spent in
the linear layers.

    python python/bench/e2e_decode.py --out bench/e2e            # H100: all 32 layers
    python python/bench/e2e_decode.py --layers 8 --batches 1,8    # shorter
    python python/bench/e2e_decode.py --tiny --device cpu         # plumbing check, no GPU

The model is transformers' LlamaForCausalLM built from the Llama-3.1-8B
configuration (32 layers, hidden 4096, MLP 14336, 32 query / 8 KV heads,
vocabulary 128256, llama3 RoPE), random weights in BF16 on the GPU.  The
decode loop is this file's (class Decoder): it calls the model's own modules
(embeddings, norms, q/k/v/o and MLP projections, lm_head) but keeps the KV
cache itself, in static tensors of max_len = prompt + warm-up + steps
positions, and attends over all of them with a position mask, so one decode
step has fixed shapes and no host synchronization: it is captured once per
batch size in a torch.cuda.CUDAGraph (input token, position counter, greedy
argmax and token history all live in the graph) and replayed.

Measured per format and batch: the step time (CUDA events over --steps
replays after --warmup), tokens/s = batch / step time, and the linear-layer
time: a second graph holding only the step's linear layers (every layer's
q, k, v, o, gate, up, down on static inputs, plus lm_head) replayed the same
way; its share of the step time is the GEMM share (lm_head stays BF16 in
every format, as in quantized checkpoints).

Correctness: for NVFP4 and MXFP4 the nibble model is compared (batch 1,
--check-steps steps, eager) with the same model whose linear layers hold the
dequantized weights in BF16 (nb_dequantize: exactly the values the kernels
use): free-running greedy tokens, and the nibble model's argmax when fed the
reference's tokens (teacher forcing), where a difference only counts when
the reference's top-2 logits are further apart than twice the logit
difference (random weights give flat logits and near ties).  The exit code
is 2 when a check fails.

Output: a table on stdout, e2e_decode.json and e2e_decode.csv in --out (with
the GPU, commit, torch and transformers versions).
"""

import argparse
import csv
import functools
import json
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

FORMATS = ("bf16", "nvfp4", "mxfp4")
MAX_LOGITS_REL_ERROR = 0.05   # the correctness check's bound (see check())


# ------------------------------------------------------------------ model

def llama_config(layers, tiny=False):
    from transformers import LlamaConfig
    if tiny:
        shape = dict(vocab_size=512, hidden_size=256, intermediate_size=512, num_attention_heads=8,
                     num_key_value_heads=2)
    else:  # meta-llama/Llama-3.1-8B config.json
        shape = dict(vocab_size=128256, hidden_size=4096, intermediate_size=14336, num_attention_heads=32,
                     num_key_value_heads=8)
    return LlamaConfig(num_hidden_layers=layers, max_position_embeddings=131072, rms_norm_eps=1e-5,
                       rope_theta=500000.0, rope_scaling={"rope_type": "llama3", "factor": 8.0,
                                                          "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                                                          "original_max_position_embeddings": 8192},
                       tie_word_embeddings=False, bos_token_id=128000 if not tiny else 1,
                       eos_token_id=128001 if not tiny else 2, **shape)


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


class Decoder:
    """Greedy decoding of a Hugging Face Llama with a static KV cache kept
    here.  forward() takes T tokens at positions pos0 .. pos0+T-1 (prefill or
    one decode step); step() is one greedy decode step on the static state
    (ids, pos, history), safe to capture in a CUDA graph."""

    def __init__(self, model, batch, max_len):
        from transformers.models.llama.modeling_llama import apply_rotary_pos_emb
        self.rope = apply_rotary_pos_emb
        self.model = model
        cfg = model.config
        p = model.model.embed_tokens.weight
        dev, dt = p.device, p.dtype
        self.B, self.L = batch, max_len
        self.H, self.KVH = cfg.num_attention_heads, cfg.num_key_value_heads
        self.hd = getattr(cfg, "head_dim", None) or cfg.hidden_size // self.H
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
            q = a.q_proj(h).view(B, T, self.H, self.hd).transpose(1, 2)
            k = a.k_proj(h).view(B, T, self.KVH, self.hd).transpose(1, 2)
            v = a.v_proj(h).view(B, T, self.KVH, self.hd).transpose(1, 2)
            q, k = self.rope(q, k, cos, sin)
            self.k[i].index_copy_(2, positions, k)
            self.v[i].index_copy_(2, positions, v)
            # Query head j*G+g uses KV head j (transformers' repeat_kv): group
            # the G query heads of each KV head as G*T query rows instead of
            # copying the cache G times.
            qg = q.reshape(B, self.KVH, self.G * T, self.hd)
            o = F.scaled_dot_product_attention(qg, self.k[i], self.v[i], attn_mask=mask, scale=a.scaling)
            o = o.view(B, self.H, T, self.hd).transpose(1, 2).reshape(B, T, self.H * self.hd)
            x = x + a.o_proj(o)
            x = x + layer.mlp(layer.post_attention_layernorm(x))
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
        calls += [(a.q_proj, xh), (a.k_proj, xh), (a.v_proj, xh), (a.o_proj, xo), (mlp.gate_proj, xh),
                  (mlp.up_proj, xh), (mlp.down_proj, xi)]
    head = [(model.lm_head, xh)]
    return calls, head


# ----------------------------------------------------------------- timing

class Timer:
    """Replays a captured graph (CUDA) or calls the function (CPU / no
    graph) and returns milliseconds per call."""

    def __init__(self, fn, device, graph):
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


def run_batch(model, batch, args, device, gen):
    max_len = cache_len(args.prompt + args.warmup + args.steps)
    prompt = torch.randint(0, model.config.vocab_size, (batch, args.prompt), generator=gen).to(device)
    with torch.no_grad():
        dec = Decoder(model, batch, max_len)
        dec.prefill(prompt)
        step = Timer(dec.step, device, not args.no_graph)
        step_ms = step.time(args.warmup, args.steps, before=functools.partial(dec.prefill, prompt))
        calls, head = linear_calls(model, batch)

        def linears():
            for mod, x in calls:
                mod(x)

        def lm_head():
            for mod, x in head:
                mod(x)
        lin_ms = Timer(linears, device, not args.no_graph).time(args.warmup, args.steps)
        head_ms = Timer(lm_head, device, not args.no_graph).time(args.warmup, args.steps)
    note = step.note
    del dec, step
    if device.type == "cuda":
        torch.cuda.empty_cache()
    return {"batch": batch, "step_ms": step_ms, "tokens_per_s": batch * 1e3 / step_ms, "linear_ms": lin_ms,
            "lm_head_ms": head_ms, "gemm_share": (lin_ms + head_ms) / step_ms, "graph": note}


def greedy(model, prompt, steps, forced=None):
    """Eager decode of `steps` steps after the prompt.  Returns (tokens
    [B, steps+1], logits [steps+1, B, vocab] on the CPU): greedy, or, with
    `forced` [B, steps+1], fed the forced tokens (teacher forcing) while the
    returned tokens are still each step's argmax."""
    with torch.no_grad():
        dec = Decoder(model, prompt.shape[0], cache_len(prompt.shape[1] + steps))
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

def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__)
    ap.add_argument("--layers", type=int, default=32, help="decoder layers (default 32, the 8B model)")
    ap.add_argument("--batches", default="1,8,32", help="comma list of batch sizes (default 1,8,32)")
    ap.add_argument("--steps", type=int, default=64, help="timed decode steps per batch (default 64)")
    ap.add_argument("--warmup", type=int, default=8, help="untimed steps before timing (default 8)")
    ap.add_argument("--prompt", type=int, default=32, help="prompt tokens (random ids; default 32)")
    ap.add_argument("--formats", default=",".join(FORMATS), help="comma list of bf16, nvfp4, mxfp4")
    ap.add_argument("--check-steps", type=int, default=16,
                    help="greedy steps compared with the dequantized-weight model (0: no check; default 16)")
    ap.add_argument("--threads", type=int, default=None, help="host quantization threads (default: CPU count)")
    ap.add_argument("--device", default="cuda", help="cuda (default), cuda:N, or cpu for a plumbing check")
    ap.add_argument("--tiny", action="store_true", help="a tiny model of the same structure (for --device cpu)")
    ap.add_argument("--no-graph", action="store_true", help="time eager steps instead of CUDA graph replays")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", default=None, help="directory for e2e_decode.json and e2e_decode.csv")
    args = ap.parse_args(argv)

    batches = [int(b) for b in args.batches.split(",") if b.strip()]
    formats = [f.strip().lower() for f in args.formats.split(",") if f.strip()]
    for f in formats:
        if f not in FORMATS:
            ap.error(f"unknown format {f!r}; choose from {', '.join(FORMATS)}")
    if args.layers < 1 or not batches or min(batches) < 1 or args.steps < 1:
        ap.error("--layers, --batches and --steps must be positive")
    device = torch.device(args.device)
    if device.type == "cuda" and not torch.cuda.is_available():
        ap.error("no CUDA device; use --device cpu --tiny for a plumbing check")
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

    cfg = llama_config(args.layers, tiny=args.tiny)
    t0 = time.time()
    model = build_model(cfg, device, dtype, args.seed)
    nparams = sum(p.numel() for p in model.parameters())
    gpu = torch.cuda.get_device_name(device) if device.type == "cuda" else platform.processor() or "cpu"
    print(f"model: Llama-3.1-8B shape, {args.layers} layers, {nparams / 1e9:.2f}B parameters, {dtype}, random "
          f"weights, built in {time.time() - t0:.1f} s on {gpu}")
    print(f"decode: prompt {args.prompt}, {args.warmup} warm-up + {args.steps} timed steps per batch; "
          f"batches {batches}; graphs {'off' if args.no_graph else 'on'}")

    gen = torch.Generator().manual_seed(args.seed + 1)
    rows, checks = [], []
    check_prompt = torch.randint(0, cfg.vocab_size, (1, args.prompt), generator=gen).to(device)
    # The BF16 linear modules: quantize_model replaces modules (it does not
    # change them), so each format starts from these and they are put back.
    bf16_linears = {n: m for n, m in model.named_modules()
                    if isinstance(m, torch.nn.Linear) and not n.endswith("lm_head")}
    for fmt in formats:
        info = {"format": fmt}
        weights = None
        if fmt != "bf16":
            t0 = time.time()
            if device.type == "cuda":
                weights = nt.quantize_model(model, format=fmt, exclude=["lm_head"], threads=args.threads,
                                            return_weights=True)["weights"]
                torch.cuda.synchronize()
                how = "host C reference + nb_pack"
            else:
                weights = quantize_cpu(model, fmt, bf16_linears)
                how = "CPU stand-in: dequantized weights"
            info["quantize_s"] = time.time() - t0
            print(f"{fmt}: quantized {len(weights)} linear layers in {info['quantize_s']:.1f} s ({how})")
        for b in batches:
            r = run_batch(model, b, args, device, gen)
            r.update(info)
            r["weights_gb"] = weight_bytes(model) / 1e9
            rows.append(r)
            print(f"  {fmt:<6} batch {b:>3}: {r['step_ms']:8.3f} ms/step  {r['tokens_per_s']:9.1f} tok/s  "
                  f"linears {r['linear_ms']:7.3f} ms + lm_head {r['lm_head_ms']:6.3f} ms "
                  f"({100 * r['gemm_share']:.0f}% of the step)  [{r['graph']}]")
        if weights is not None:
            if args.check_steps > 0:
                checks.append(check(model, weights, bf16_linears, check_prompt, args.check_steps, device, dtype,
                                    fmt))
                c = checks[-1]
                print(f"  check: free-running greedy tokens equal to the dequantized-weight model's on "
                      f"{c['agree']}/{c['steps']} steps" + (f" (first difference at step {c['first_diff']})"
                                                           if c["first_diff"] is not None else "") +
                      f"; teacher-forced top-1 {c['forced_agree']}/{c['steps']} ({c['forced_near_ties']} near ties); "
                      f"logits max |diff| {c['logits_max_diff']:.4g}, relative {c['logits_rel_error']:.2e} "
                      f"(logits span {c['logits_range']:.3g}, smallest top-2 margin {c['min_top2_margin']:.3g}) -> "
                      f"{'OK' if c['ok'] else 'MISMATCH'}")
            swap_linears(model, bf16_linears)
            del weights
            if device.type == "cuda":
                torch.cuda.empty_cache()

    print_table(rows)
    for c in checks:
        print(f"check {c['format']}: {'OK' if c['ok'] else 'MISMATCH'}: greedy {c['agree']}/{c['steps']} tokens "
              f"equal, teacher-forced top-1 {c['forced_agree']}/{c['steps']} ({c['forced_near_ties']} near ties), "
              f"logits relative error {c['logits_rel_error']:.2e}")
    total = time.time() - t_start
    print(f"total {total:.0f} s")
    if args.out:
        write_out(args, rows, checks, cfg, gpu, total, transformers.__version__)
    return rows, checks


def weight_bytes(model):
    """Bytes of the model's weights as stored: parameters plus the packed
    4-bit buffers (not the GEMM workspaces)."""
    n = sum(p.numel() * p.element_size() for p in model.parameters())
    return n + sum(b.numel() for name, b in model.named_buffers() if name.endswith(".packed"))


def check(model, weights, bf16_linears, prompt, steps, device, dtype, fmt):
    """The model as it is (nibble linears) against the same model with the
    dequantized weights in nn.Linear modules (batch 1, eager):

      * free-running greedy tokens, compared step by step;
      * teacher-forced: the nibble model fed the reference's tokens, its
        argmax compared with the reference's at every step.  Both models
        round every linear output to BF16 in a different order, so a step
        whose reference top-2 logits are closer than twice the largest logit
        difference seen at that step is a near tie that may go either way;
        `ok` is true when every teacher-forced difference is such a near tie
        and the logits' relative error (Frobenius, over all steps) is at most
        MAX_LOGITS_REL_ERROR: BF16 rounding differences stay near 1e-2, a
        wrong weight or kernel gives 1e-1 or more.
    Random weights give flat logits (top-2 margins of a few hundredths), so
    free-running sequences may part at a near tie and then differ entirely:
    the teacher-forced comparison is the one that tells."""
    deq = dequantized_linears(weights, bf16_linears, device, dtype)
    nib = swap_linears(model, deq)
    tok_r, log_r = greedy(model, prompt, steps)
    swap_linears(model, nib)
    del deq
    tok_q, _ = greedy(model, prompt, steps)
    tok_f, log_f = greedy(model, prompt, steps, forced=tok_r)
    same = (tok_q == tok_r)[0].tolist()
    first_diff = next((i for i, s in enumerate(same) if not s), None)
    top2 = log_r.topk(2, dim=-1).values
    margin = (top2[..., 0] - top2[..., 1])[:, 0]                  # [steps+1], batch 0
    diff = (log_f - log_r).abs().amax(-1)[:, 0]
    forced_same = (tok_f == tok_r)[0]
    near_tie = margin <= 2 * diff
    rel = float((log_f - log_r).norm() / log_r.norm())
    ok = bool((forced_same | near_tie).all()) and rel <= MAX_LOGITS_REL_ERROR
    return {"format": fmt, "steps": len(same), "agree": int(sum(same)), "first_diff": first_diff,
            "forced_agree": int(forced_same.sum()), "forced_near_ties": int((~forced_same & near_tie).sum()),
            "ok": ok, "tokens": tok_q[0].tolist(), "reference_tokens": tok_r[0].tolist(),
            "logits_max_diff": float(diff.max()), "logits_rel_error": rel,
            "logits_range": float(log_r.max() - log_r.min()), "min_top2_margin": float(margin.min())}


def print_table(rows):
    base = {r["batch"]: r for r in rows if r["format"] == "bf16"}
    print()
    print("| format | batch | ms/step | tokens/s | vs BF16 | linears ms | lm_head ms | GEMM share | timing |")
    print("|---|---|---|---|---|---|---|---|---|")
    for r in rows:
        b = base.get(r["batch"])
        sp = f"{b['step_ms'] / r['step_ms']:.2f}x" if b else "-"
        print(f"| {r['format']} | {r['batch']} | {r['step_ms']:.3f} | {r['tokens_per_s']:.1f} | {sp} | "
              f"{r['linear_ms']:.3f} | {r['lm_head_ms']:.3f} | {100 * r['gemm_share']:.0f}% | {r['graph']} |")
    print()


def write_out(args, rows, checks, cfg, gpu, total, tf_version):
    import nibble
    os.makedirs(args.out, exist_ok=True)
    try:
        commit = subprocess.run(["git", "-C", REPO, "rev-parse", "--short=12", "HEAD"], capture_output=True,
                                text=True).stdout.strip()
    except OSError:
        commit = ""
    meta = {"gpu": gpu, "commit": commit or os.environ.get("NB_GIT_COMMIT", "unknown"),
            "date": time.strftime("%Y-%m-%d %H:%M:%S"), "torch": torch.__version__, "transformers": tf_version,
            "nibble": nibble.version_string(), "layers": args.layers, "tiny": args.tiny, "prompt": args.prompt,
            "steps": args.steps, "warmup": args.warmup, "device": args.device, "seconds": total,
            "config": {k: getattr(cfg, k) for k in ("hidden_size", "intermediate_size", "num_attention_heads",
                                                    "num_key_value_heads", "vocab_size", "num_hidden_layers")}}
    with open(os.path.join(args.out, "e2e_decode.json"), "w") as fh:
        json.dump({"meta": meta, "rows": rows, "checks": checks}, fh, indent=1)
    keys = ["format", "batch", "step_ms", "tokens_per_s", "linear_ms", "lm_head_ms", "gemm_share", "graph",
            "quantize_s", "weights_gb"]
    with open(os.path.join(args.out, "e2e_decode.csv"), "w", newline="") as fh:
        w = csv.writer(fh)
        w.writerow(keys + ["gpu", "commit"])
        for r in rows:
            w.writerow([r.get(k, "") for k in keys] + [gpu, meta["commit"]])
    print(f"wrote {args.out}/e2e_decode.json and e2e_decode.csv")


if __name__ == "__main__":
    _, _checks = main()
    sys.exit(2 if any(not c["ok"] for c in _checks) else 0)
