#!/usr/bin/env python3
"""Tensor-parallel greedy decode over 2 GPUs: a Llama-3.1-70B-shaped stack
with random weights, BF16 TP=2 against nibble NVFP4 TP=2 (nibble.tp), tokens
per second at batch 1 and 8, and the TP=2 logits against TP=1.

    # from the repository root, on a machine with 2 GPUs (one process per GPU):
    NIBBLE_LIBRARY=build-dev/libnibble.so PYTHONPATH=python \\
        python3 -m torch.distributed.run --nproc-per-node 2 python/bench/tp_decode.py --out bench/tp
    ... tp_decode.py --layers 4 --batches 1 --steps 16       # shorter
    ... --nproc-per-node 2 python/bench/tp_decode.py --device cpu --tiny    # plumbing check, gloo, no GPU

The model is e2e_decode.py's (transformers' LlamaForCausalLM, Llama-3.1-70B
shapes: hidden 8192, MLP 28672, 64 query / 8 KV heads, vocabulary 128256;
--layers of its 80 decoder layers, 10 by default), built on every rank with
the same seed and then broadcast from rank 0 so that every rank holds the
same weights.  nibble.tp.shard_llama splits it Megatron's way: q, k, v, gate,
up column-parallel, o and down row-parallel (one all-reduce after attention
and one after the MLP per layer: torch.distributed.all_reduce, NCCL), the
output head column-parallel over the vocabulary with an all-gather of the
logits, embeddings and norms replicated; each rank holds 32 query and 4 KV
heads.  NVFP4 layers are quantized whole on each rank (nibble.torch's device
quantizer, one tensor scale per layer as on one GPU) and split, so every
shard is a byte-for-byte slice of the one-GPU weight; the head stays BF16 in
both formats.  The decode loop is e2e_decode.py's Decoder (static KV cache,
per-rank head counts), each step captured in a CUDA graph per rank with the
NCCL collectives inside it (ProcessGroupNCCL supports capture: it keeps
work captured in a graph away from its watchdog) and replayed, timed with
CUDA events over --steps replays after --warmup, as e2e_decode.py's Timer
does; the step time reported is the larger of the two ranks'.  --no-graph
times eager steps instead.  No torch.compile here.

NCCL_NVLS_ENABLE=0 is set before the process group is created (NVLink SHARP
would create multicast objects, which these machines must not have); a
different value in the environment is overridden, and said so.  No
symmetric memory or other multicast object is created.

Check (--check-steps, batch 1, eager): TP=1 on rank 0 (the unsharded model:
BF16, or the nibble layers with the very bytes the shards are cut from)
decodes greedily; TP=2 is fed the same tokens (teacher forcing).  Reported
per format: the relative distance of TP=2's logits to TP=1's and their top-1
agreement.  They differ only by the order of summation (each row-parallel
output is the rounded sum of two rounded partial sums), so nibble's distance
must be no larger than CHECK_FACTOR (--check-factor, 2) times BF16's own
TP=2-to-TP=1 distance when BF16 runs too; the exit code is 2 otherwise.

Refused before anything is built: fewer than 2 CUDA devices visible with
--device cuda, a launch without torchrun's environment or with a world size
other than 2.  Output: a table on stdout (rank 0), tp_decode.json and
tp_decode.csv in --out.
"""

import argparse
import csv
import functools
import json
import math
import os
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(os.path.dirname(HERE))
if os.path.isdir(os.path.join(REPO, "python", "nibble")) and "nibble" not in sys.modules:
    sys.path.insert(0, os.path.join(REPO, "python"))
sys.path.insert(0, HERE)

import torch  # noqa: E402

import e2e_decode as e2e  # noqa: E402

WORLD = 2
FORMATS = ("bf16", "nvfp4", "mxfp4")
CHECK_FACTOR = 2.0
LAUNCH = "python3 -m torch.distributed.run --nproc-per-node 2 python/bench/tp_decode.py"


def parse_args(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__)
    ap.add_argument("--layers", type=int, default=None, help="decoder layers (default 10 of the 70B's 80; tiny: 2)")
    ap.add_argument("--batches", default="1,8", help="comma list of batch sizes (default 1,8)")
    ap.add_argument("--steps", type=int, default=64, help="timed decode steps per batch (default 64)")
    ap.add_argument("--warmup", type=int, default=8, help="untimed steps before timing (default 8)")
    ap.add_argument("--prompt", type=int, default=32, help="prompt tokens (random ids; default 32)")
    ap.add_argument("--formats", default="bf16,nvfp4", help="comma list of bf16, nvfp4, mxfp4 (default bf16,nvfp4)")
    ap.add_argument("--check-steps", type=int, default=16, help="steps of the TP=2 against TP=1 check (0: none)")
    ap.add_argument("--check-factor", type=float, default=CHECK_FACTOR,
                    help=f"nibble's TP=2-to-TP=1 logits distance may be this many times BF16's (default "
                         f"{CHECK_FACTOR})")
    ap.add_argument("--device", default="cuda", choices=("cuda", "cpu"),
                    help="cuda (default; NCCL, one GPU per rank) or cpu (gloo; a plumbing check with --tiny)")
    ap.add_argument("--tiny", action="store_true", help="a tiny model of the same structure (for --device cpu)")
    ap.add_argument("--no-graph", action="store_true", help="time eager steps instead of CUDA graph replays")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", default=None, help="directory for tp_decode.json and tp_decode.csv")
    args = ap.parse_args(argv)
    e2e.parse_lists(ap, args, FORMATS)
    if not args.formats:
        ap.error("--formats: name at least one of " + ", ".join(FORMATS))
    if args.layers is None:
        args.layers = e2e.SHAPES["tiny" if args.tiny else "70b"][1]
    if args.layers < 1 or not args.batches or min(args.batches) < 1 or args.steps < 1 or args.warmup < 0 \
            or args.prompt < 1 or args.check_steps < 0:
        ap.error("--layers, --batches, --steps and --prompt must be positive, --warmup and --check-steps not "
                 "negative")
    if args.check_factor <= 0:
        ap.error("--check-factor must be positive")
    return ap, args


def launch_error(args, env, gpus):
    """Why this process cannot run as one rank of the benchmark (None: it
    can): torchrun's environment with a world size of 2, and with
    --device cuda 2 visible CUDA devices."""
    if args.device == "cuda" and gpus < WORLD:
        return (f"tensor parallelism over {WORLD} GPUs needs {WORLD} visible CUDA devices; {gpus} visible "
                f"(CUDA_VISIBLE_DEVICES={env.get('CUDA_VISIBLE_DEVICES', 'unset')}); --device cpu --tiny runs the "
                "plumbing over gloo")
    missing = [k for k in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT") if k not in env]
    if missing:
        return f"not launched by torchrun ({', '.join(missing)} unset); run: {LAUNCH}"
    if env["WORLD_SIZE"] != str(WORLD):
        return f"world size {env['WORLD_SIZE']}; this benchmark runs {WORLD} ranks: {LAUNCH}"
    return None


def nccl_env(env):
    """Set NCCL_NVLS_ENABLE=0 in `env` (before the process group exists);
    returns the value it replaced when that was another one."""
    old = env.get("NCCL_NVLS_ENABLE")
    env["NCCL_NVLS_ENABLE"] = "0"
    return old if old not in (None, "0") else None


def _rel(a, b):
    return float((a.double() - b.double()).norm() / b.double().norm())


def broadcast_model(model):
    """Every parameter and buffer of rank 0's model on every rank."""
    import torch.distributed as dist
    with torch.no_grad():
        for t in list(model.parameters()) + list(model.buffers()):
            dist.broadcast(t.data, 0)


def restore(model, modules):
    """Put the named modules back (shard_llama replaced them)."""
    e2e.swap_linears(model, modules)


def check(model, prompt, steps, rank, fmt):
    """The TP=2 against TP=1 check in two halves: TP=1 now (rank 0, the
    model as it is; its tokens broadcast), and the returned function, to be
    called on every rank once the model is sharded, runs TP=2 on those
    tokens and returns the comparison (rank 0; None elsewhere)."""
    import torch.distributed as dist
    tok1 = torch.zeros(prompt.shape[0], steps + 1, dtype=torch.long, device=prompt.device)
    log1 = None
    if rank == 0:
        tok1, log1 = e2e.greedy(model, prompt, steps)
        tok1 = tok1.to(prompt.device)
    dist.barrier()
    dist.broadcast(tok1, 0)

    def after_sharding(heads):
        tok2, log2 = e2e.greedy(model, prompt, steps, forced=tok1, heads=heads)
        if rank != 0:
            return None
        return {"format": fmt, "steps": steps + 1, "d_tp": _rel(log2, log1),
                "top1_agree": int((tok2.to(tok1.device) == tok1)[0].sum())}
    return after_sharding


def run(args, rank, device):
    """One rank's whole benchmark, in an initialized process group of 2."""
    import torch.distributed as dist
    import nibble.torch as nt
    import nibble.tp as tp
    dtype = torch.bfloat16
    shape = "tiny" if args.tiny else "70b"
    cfg = e2e.llama_config(args.layers, shape=shape)
    t0 = time.time()
    model = e2e.build_model(cfg, device, dtype, args.seed)
    broadcast_model(model)
    nparams = sum(p.numel() for p in model.parameters())
    say = print if rank == 0 else (lambda *a, **k: None)
    gpu = torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu"
    say(f"model: {'tiny Llama' if args.tiny else 'Llama-3.1-70B'} shape, {args.layers} layers, {nparams / 1e9:.2f}B "
        f"parameters, BF16, random weights (rank 0's, broadcast), built in {time.time() - t0:.1f} s; {WORLD} ranks "
        f"on {gpu} ({dist.get_backend()}); graphs {'off' if args.no_graph else 'on'}", flush=True)
    gen = torch.Generator().manual_seed(args.seed + 1)
    check_prompt = torch.randint(0, cfg.vocab_size, (1, args.prompt), generator=gen).to(device)
    prompts = {b: torch.randint(0, cfg.vocab_size, (b, args.prompt), generator=gen).to(device) for b in args.batches}
    originals = {n: m for n, m in model.named_modules() if isinstance(m, torch.nn.Linear)}
    rows, checks = [], []
    for fmt in args.formats:
        if fmt != "bf16":
            t0 = time.time()
            nt.quantize_model(model, format=fmt, exclude=["lm_head"], device="cpu" if device.type == "cpu" else None)
            say(f"{fmt}: quantized in {time.time() - t0:.1f} s (TP=1 layers; the shards are cut from their bytes)",
                flush=True)
        after = None
        if args.check_steps:
            after = check(model, check_prompt, args.check_steps, rank, fmt)
        info = tp.shard_llama(model)
        heads = (info["num_attention_heads"], info["num_key_value_heads"])
        del info["replaced"]
        if device.type == "cuda":
            torch.cuda.empty_cache()
        c = after(heads) if after is not None else None
        if c is not None:
            checks.append(c)
            say(f"  check: TP=2 logits {c['d_tp']:.2e} from TP=1, top-1 equal on {c['top1_agree']}/{c['steps']} "
                "steps", flush=True)
        for b in args.batches:
            r = time_batch(model, heads, b, prompts[b], args, device)
            r.update(format=fmt, weights_gb_per_rank=e2e.weight_bytes(model) / 1e9)
            rows.append(r)
            say(f"  {fmt:<6} batch {b:>3}: {r['step_ms']:8.3f} ms/step (ranks {r['rank_ms'][0]:.3f} / "
                f"{r['rank_ms'][1]:.3f})  {r['tokens_per_s']:9.1f} tok/s  ranks agree: {r['ranks_agree']}  "
                f"[{r['graph']}]", flush=True)
        restore(model, originals)
        if device.type == "cuda":
            torch.cuda.empty_cache()
    return rows, finish_checks(checks, args.check_factor), gpu, cfg


def time_batch(model, heads, batch, prompt, args, device):
    """Step time of the sharded model at one batch size on this rank; the
    larger of the ranks' is reported, and whether both decoded the same
    tokens."""
    import torch.distributed as dist
    max_len = e2e.cache_len(args.prompt + args.warmup + args.steps)
    with torch.no_grad():
        dec = e2e.Decoder(model, batch, max_len, heads)
        dec.prefill(prompt)
        step = e2e.Timer(dec.step, device, not args.no_graph, strict=True)
        ms = step.time(args.warmup, args.steps, before=functools.partial(dec.prefill, prompt))
        both = torch.tensor([ms, float(dec.hist.sum())], dtype=torch.float64, device=device)
        hi, lo = both.clone(), both.clone()
        dist.all_reduce(hi, op=dist.ReduceOp.MAX)
        dist.all_reduce(lo, op=dist.ReduceOp.MIN)
        per_rank = torch.zeros(WORLD, dtype=torch.float64, device=device)
        per_rank[dist.get_rank()] = ms
        dist.all_reduce(per_rank)
        note = step.note
        del step, dec
    return {"batch": batch, "step_ms": float(hi[0]), "tokens_per_s": batch * 1e3 / float(hi[0]),
            "rank_ms": per_rank.tolist(), "ranks_agree": bool(hi[1] == lo[1]), "graph": note}


def finish_checks(checks, factor):
    """ok for each quantized format: its TP=2-to-TP=1 distance within
    factor x BF16's (when BF16 was checked)."""
    base = next((c for c in checks if c["format"] == "bf16"), None)
    for c in checks:
        c["factor"] = factor
        if c["format"] == "bf16" or base is None:
            c["ok"] = None
            continue
        c["ratio"] = c["d_tp"] / base["d_tp"] if base["d_tp"] > 0 else (0.0 if c["d_tp"] == 0 else math.inf)
        c["ok"] = c["d_tp"] <= factor * base["d_tp"] or c["d_tp"] == 0
    return checks


def print_table(rows):
    base = {r["batch"]: r for r in rows if r["format"] == "bf16"}
    print()
    print("| format | batch | ms/step (max of ranks) | tokens/s | vs BF16 TP=2 | ranks agree | timing |")
    print("|---|---|---|---|---|---|---|")
    for r in rows:
        b = base.get(r["batch"])
        sp = f"{b['step_ms'] / r['step_ms']:.2f}x" if b else "-"
        print(f"| {r['format']} | {r['batch']} | {r['step_ms']:.3f} | {r['tokens_per_s']:.1f} | {sp} | "
              f"{r['ranks_agree']} | {r['graph']} |")
    print()


def write_out(args, rows, checks, cfg, gpu, total):
    import nibble
    import transformers
    os.makedirs(args.out, exist_ok=True)
    meta = {"gpu": gpu, "ranks": WORLD, "commit": e2e.commit(),
            "date": time.strftime("%Y-%m-%d %H:%M:%S"), "torch": torch.__version__,
            "transformers": transformers.__version__, "nibble": nibble.version_string(),
            "nccl": ".".join(map(str, torch.cuda.nccl.version())) if args.device == "cuda" else None,
            "NCCL_NVLS_ENABLE": os.environ.get("NCCL_NVLS_ENABLE"), "layers": args.layers, "tiny": args.tiny,
            "prompt": args.prompt, "steps": args.steps, "warmup": args.warmup, "graphs": not args.no_graph,
            "seconds": total, "config": {k: getattr(cfg, k) for k in ("hidden_size", "intermediate_size",
                                                                     "num_attention_heads", "num_key_value_heads",
                                                                     "vocab_size", "num_hidden_layers")}}
    with open(os.path.join(args.out, "tp_decode.json"), "w") as fh:
        json.dump({"meta": meta, "rows": rows, "checks": checks}, fh, indent=1)
    keys = ["format", "batch", "step_ms", "tokens_per_s", "ranks_agree", "graph", "weights_gb_per_rank"]
    with open(os.path.join(args.out, "tp_decode.csv"), "w", newline="") as fh:
        w = csv.writer(fh)
        w.writerow(keys + ["rank0_ms", "rank1_ms", "gpu", "commit"])
        for r in rows:
            w.writerow([r[k] for k in keys] + r["rank_ms"] + [gpu, meta["commit"]])
    print(f"wrote {args.out}/tp_decode.json and tp_decode.csv")


def exit_code(rows, checks):
    """2: a check failed or the ranks decoded different tokens; 0: all well."""
    return 2 if any(c.get("ok") is False for c in checks) or not all(r["ranks_agree"] for r in rows) else 0


def main(argv=None):
    ap, args = parse_args(argv)
    gpus = torch.cuda.device_count() if args.device == "cuda" else 0
    err = launch_error(args, os.environ, gpus)
    if err:
        ap.error(err)
    replaced = nccl_env(os.environ)
    import torch.distributed as dist
    local = int(os.environ["LOCAL_RANK"])
    if args.device == "cuda":
        import nibble
        if not nibble.build_info()["cuda"]:
            ap.error("libnibble was built without CUDA (rebuild with nvcc on the PATH)")
        device = torch.device("cuda", local)
        torch.cuda.set_device(device)
        dist.init_process_group("nccl", device_id=device)
    else:
        device = torch.device("cpu")
        dist.init_process_group("gloo")
    rank = dist.get_rank()
    if rank == 0 and replaced is not None:
        print(f"NCCL_NVLS_ENABLE was {replaced!r}; set to '0' (no multicast objects)")
    t0 = time.time()
    rows, checks, gpu, cfg = run(args, rank, device)
    code = exit_code(rows, checks)
    if rank == 0:
        total = time.time() - t0
        if args.out:
            write_out(args, rows, checks, cfg, gpu, total)
        print(f"total {total:.0f} s")
        print_table(rows)
        for c in checks:
            verdict = "" if c["ok"] is None else ("OK: " if c["ok"] else "MISMATCH: ")
            extra = f" ({c['ratio']:.2f}x BF16's, bound {c['factor']:g}x)" if "ratio" in c else ""
            print(f"check {c['format']}: {verdict}TP=2 logits {c['d_tp']:.2e} from TP=1{extra}, top-1 equal on "
                  f"{c['top1_agree']}/{c['steps']} steps")
    dist.barrier()
    dist.destroy_process_group()
    return code


if __name__ == "__main__":
    sys.exit(main())
