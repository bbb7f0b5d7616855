#!/usr/bin/env python3
"""Linear layers, one process, one harness: nibble (through its PyTorch op)
against cuBLAS BF16 and, when a peer directory is given, vLLM's Marlin FP4
kernel, so every speedup is over the cuBLAS of the same run.

    python python/bench/layers.py                                # the bench set
    python python/bench/layers.py --peers .peers/marlin_fp4      # + Marlin FP4
    python python/bench/layers.py --shapes 4096x4096 --m 1,16 --formats nvfp4

--peers DIR names a directory holding marlin_peer.py (a torch-free build of
vLLM's Marlin FP4 GEMM with a Python driver: make(K, N, fmt, device) returns a
graph-safe fn(x) on random weights).  Without it, or when it cannot be
loaded, the Marlin columns are left out and the reason printed.

Method (the same for every implementation):
  - each call sequence is captured in one CUDA graph and replayed; the time
    per call is the median of --reps replays measured with CUDA events;
  - each implementation gets R copies of its weights, R chosen so that the
    copies together hold at least --rotate-mb MB (well past the 50 MB L2),
    and one replay calls them in turn: every call reads its weights from HBM;
  - activations are Gaussian, weights Gaussian * 0.02 (never zeros);
  - nibble's result is checked against the BF16 product with its own
    dequantized weights (relative error printed, the run fails above 2%);
  - copy bandwidth: a device-to-device copy of 1 GiB, bytes read + written
    per second; nibble's "of copy" column is (packed weights + x + y) bytes
    per call over that.

Output: a table on stdout; layers.csv, layers.json and layers.md in --out.
"""

import argparse
import csv
import json
import math
import os
import platform
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(os.path.dirname(HERE))
if os.path.isdir(os.path.join(REPO, "python", "nibble")) and "nibble" not in sys.modules:
    sys.path.insert(0, os.path.join(REPO, "python"))

# k x n of Llama-3.1-8B/70B/405B, Qwen2.5-32B and Mistral-style layers
DEFAULT_SHAPES = ("4096x4096,4096x6144,4096x28672,14336x4096,8192x8192,8192x10240,8192x57344,28672x8192,"
                  "5120x27648,27648x5120")
DEFAULT_MS = "1,2,4,8,16,32,64,128,256,512,1024"


def parse_shapes(text):
    shapes = []
    for item in text.split(","):
        parts = item.strip().lower().split("x")
        if len(parts) != 2 or not all(p.isdigit() for p in parts):
            raise SystemExit(f"layers.py: --shapes: '{item}' is not KxN (e.g. 4096x4096)")
        k, n = int(parts[0]), int(parts[1])
        if k <= 0 or n <= 0 or k % 128:
            raise SystemExit(f"layers.py: --shapes: '{item}': k must be a positive multiple of 128, n positive")
        shapes.append((k, n))
    return shapes


def parse_ms(text):
    out = []
    for item in text.split(","):
        if not item.strip().isdigit() or not 1 <= int(item) <= 65536:
            raise SystemExit(f"layers.py: --m: '{item}' is not an integer in 1..65536")
        out.append(int(item))
    return out


def graph_us(torch, fns, x, reps):
    """Microseconds per call of fns (called in turn on x), from CUDA graph
    replays: the median of reps."""
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):          # warm up outside the graph (plans, workspaces)
        for f in fns:
            f(x)
    torch.cuda.current_stream().wait_stream(s)
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        for f in fns:
            f(x)
    for _ in range(3):
        g.replay()
    torch.cuda.synchronize()
    ts = []
    for _ in range(reps):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        g.replay()
        b.record()
        b.synchronize()
        ts.append(a.elapsed_time(b) * 1e3 / len(fns))
    ts.sort()
    return ts[len(ts) // 2]


def copy_gbps(torch):
    """Device-to-device copy bandwidth (read + write) in GB/s."""
    n = 1 << 30
    a = torch.empty(n, dtype=torch.uint8, device="cuda").random_(0, 255)
    b = torch.empty_like(a)
    for _ in range(3):
        b.copy_(a)
    torch.cuda.synchronize()
    ts = []
    for _ in range(10):
        e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        e0.record()
        b.copy_(a)
        e1.record()
        e1.synchronize()
        ts.append(e0.elapsed_time(e1) * 1e-3)
    ts.sort()
    return 2 * n / ts[len(ts) // 2] / 1e9


def load_marlin(path):
    if path is None:
        return None, "no --peers directory"
    if not os.path.isfile(os.path.join(path, "marlin_peer.py")):
        return None, f"{path}/marlin_peer.py not found"
    sys.path.insert(0, os.path.abspath(path))
    try:
        import marlin_peer
    except Exception as e:  # a peer that does not load leaves its columns out
        return None, f"marlin_peer did not load: {e!r}"[:300]
    return marlin_peer, "loaded from " + path


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--shapes", default=DEFAULT_SHAPES, help="KxN,... (default: the bench set)")
    ap.add_argument("--m", default=DEFAULT_MS, help="tokens per call, comma-separated")
    ap.add_argument("--formats", default="nvfp4,mxfp4", help="nibble formats (nvfp4, mxfp4)")
    ap.add_argument("--peers", default=None, help="directory of marlin_peer.py (vLLM's Marlin FP4)")
    ap.add_argument("--rotate-mb", type=float, default=240.0, help="weight bytes per replay, per implementation")
    ap.add_argument("--reps", type=int, default=15, help="timed replays per cell (median)")
    ap.add_argument("--out", default=None, help="directory for layers.csv/json/md")
    args = ap.parse_args(argv)
    shapes, ms = parse_shapes(args.shapes), parse_ms(args.m)
    formats = [f.strip().lower() for f in args.formats.split(",") if f.strip()]
    for f in formats:
        if f not in ("nvfp4", "mxfp4"):
            raise SystemExit(f"layers.py: --formats: '{f}' is not nvfp4 or mxfp4")
    if args.reps < 3 or args.rotate_mb <= 0:
        raise SystemExit("layers.py: --reps must be >= 3 and --rotate-mb > 0")

    import torch
    from e2e_decode import commit  # the checkout's commit, as the end-to-end benchmark records it
    if not torch.cuda.is_available():
        raise SystemExit("layers.py: needs a CUDA GPU (torch.cuda.is_available() is False)")
    import nibble.torch as nt
    marlin, marlin_note = load_marlin(args.peers)
    dev = torch.device("cuda")
    props = torch.cuda.get_device_properties(0)
    bw = copy_gbps(torch)
    meta = {"gpu": props.name, "sms": props.multi_processor_count, "commit": commit(),
            "date": time.strftime("%Y-%m-%d"), "torch": torch.__version__, "copy_gbps": bw,
            "marlin": marlin_note, "host": platform.node()}
    print(f"{props.name} ({props.multi_processor_count} SMs), torch {torch.__version__}, commit {meta['commit']}, "
          f"copy {bw:.0f} GB/s; marlin: {marlin_note}", flush=True)
    torch.manual_seed(0)

    def copies(nbytes):
        return max(2, min(64, math.ceil(args.rotate_mb * 1e6 / nbytes)))

    rows, bad = [], []
    for (k, n) in shapes:
        name = f"{k}x{n}"
        w = torch.randn(n, k, dtype=torch.bfloat16, device=dev) * 0.02
        impls = {"cublas": [lambda xx, w=w: torch.nn.functional.linear(xx, w)] +
                 [lambda xx, w=w.clone(): torch.nn.functional.linear(xx, w) for _ in range(copies(2 * n * k) - 1)]}
        nbytes = {}
        for fmt in formats:
            pw = nt.quantize(w, format=fmt, device=dev)
            ref_w = nt.dequantize_weight(nt.unpack(pw), dtype=torch.bfloat16, device=dev)
            xs = torch.randn(8, k, dtype=torch.bfloat16, device=dev)
            ref = torch.nn.functional.linear(xs.float(), ref_w.float())
            rel = ((nt.gemm(xs, pw).float() - ref).norm() / ref.norm()).item()
            if not rel <= 0.02:
                bad.append(f"nibble {fmt} {name}: relative error {rel:.4f} against its dequantized weights")
            reps = [pw] + [nt.PackedLinearWeight(packed=pw.packed.clone(), workspace=pw.workspace.clone(), n=pw.n,
                                                 k=pw.k, format=pw.format, tensor_scale=pw.tensor_scale,
                                                 scale_exp_min=pw.scale_exp_min, scale_exp_max=pw.scale_exp_max)
                           for _ in range(copies(pw.packed.numel()) - 1)]
            impls["nibble_" + fmt] = [lambda xx, p=p: nt.gemm(xx, p) for p in reps]
            nbytes["nibble_" + fmt] = pw.packed.numel()
            del ref_w
        if marlin is not None:
            for fmt in formats:
                try:
                    impls["marlin_" + fmt] = [marlin.make(k, n, fmt, dev) for _ in range(copies(n * k // 2))]
                except Exception as e:
                    print(f"  marlin {fmt} {name}: {e!r}"[:300], flush=True)
        for m in ms:
            x = torch.randn(m, k, dtype=torch.bfloat16, device=dev)
            res = {}
            for iname, fl in impls.items():
                try:
                    res[iname] = graph_us(torch, fl, x, args.reps)
                except Exception as e:
                    print(f"  {iname} {name} m={m}: {e!r}"[:300], flush=True)
                    res[iname] = float("nan")
            base = res["cublas"]
            row = {"shape": name, "k": k, "n": n, "m": m, "cublas_us": base}
            for iname, us in res.items():
                if iname == "cublas":
                    continue
                row[iname + "_us"] = us
                row[iname + "_x"] = base / us
                if iname in nbytes:
                    gbps = (nbytes[iname] + 2 * m * (k + n)) / (us * 1e-6) / 1e9
                    row[iname + "_copy"] = gbps / bw
            rows.append(row)
            print(f"{name:12s} m={m:5d} cublas {base:8.1f} us  " +
                  "  ".join(f"{i[:-2]} {row[i]:.2f}x" for i in row if i.endswith("_x")) +
                  "".join(f"  {i[:-5]} {100 * row[i]:.0f}% of copy" for i in row if i.endswith("_copy")), flush=True)
        del impls, w
        torch.cuda.empty_cache()

    cols = [c for c in rows[0] if c.endswith("_x")] if rows else []
    lines = [f"{meta['gpu']}, {meta['date']}, commit {meta['commit']}, torch {meta['torch']}, copy bandwidth "
             f"{bw:.0f} GB/s; Marlin: {marlin_note}", "",
             "| layer k->n | m | cuBLAS us | " + " | ".join(c[:-2].replace("_", " ") for c in cols) + " |",
             "|---|---|---|" + "---|" * len(cols)]
    for r in rows:
        lines.append(f"| {r['k']}->{r['n']} | {r['m']} | {r['cublas_us']:.1f} | " +
                     " | ".join(f"{r[c]:.2f}x" if c in r and r[c] == r[c] else "-" for c in cols) + " |")
    print("\n".join(lines))
    if args.out:
        os.makedirs(args.out, exist_ok=True)
        with open(os.path.join(args.out, "layers.csv"), "w", newline="") as f:
            keys = sorted({k for r in rows for k in r}, key=lambda c: (c not in ("shape", "k", "n", "m"), c))
            wr = csv.DictWriter(f, fieldnames=keys)
            wr.writeheader()
            wr.writerows(rows)
        with open(os.path.join(args.out, "layers.json"), "w") as f:
            json.dump({"meta": meta, "rows": rows}, f, indent=1)
        with open(os.path.join(args.out, "layers.md"), "w") as f:
            f.write("\n".join(lines) + "\n")
    for b in bad:
        print("FAIL", b)
    return 2 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
