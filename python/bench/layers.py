#!/usr/bin/env python3
"""Linear layers, one process, one harness: nibble (through its PyTorch op)
against cuBLAS BF16 and the peers of its formats - vLLM's Marlin FP4 kernel
when a peer directory is given, torch's tinygemm INT4 and bitsandbytes NF4 /
FP4 with --int-peers - so every speedup is over the cuBLAS of the same run.

    python python/bench/layers.py                                # the bench set
    python python/bench/layers.py --peers .peers/marlin_fp4      # + Marlin FP4
    python python/bench/layers.py --shapes 4096x4096 --m 1,16 --formats nvfp4
    python python/bench/layers.py --formats int4,nf4 --int-peers # + tinygemm INT4, bitsandbytes NF4

--formats takes nibble's nvfp4 and mxfp4 (the default), int4 (unsigned codes
with zero points, groups of 128 along k, F16 scales), int4_sym and int8
(signed codes, groups of 128) and bitsandbytes' nf4 / bnb_fp4 (table codes,
F32 absmax per block of 64), quantized by nibble.torch.quantize from the
same BF16 weights.

--peers DIR names a directory holding marlin_peer.py (a torch-free build of
vLLM's Marlin FP4 GEMM with a Python driver: make(K, N, fmt, device) returns a
graph-safe fn(x) on random weights); it runs beside nvfp4 and mxfp4.  Without
it, or when it cannot be loaded, the Marlin columns are left out and the
reason printed.

--int-peers adds, beside the formats given:
  - tinygemm_int4 (with int4 or int4_sym): torch's INT4 kernel
    (aten._convert_weight_to_int4pack with 8 inner k tiles, then
    aten._weight_int4pack_mm), groups of 128 along k with a BF16 scale and a
    BF16 float zero point each, w = (q - 8) * s + z, quantized here from the
    same weights (min-max, round to nearest).  Timed for m <= 256 only: it
    is a small-batch kernel (one CTA per 16 x 8 tile of the output, the
    weights read again for every 16 rows of x);
  - torch_int8 (with int8): torch's W8A16 kernel aten._weight_int8pack_mm,
    one BF16 scale per output row (s = amax / 127, codes round(w / s)),
    quantized here from the same weights (nibble's int8 is timed with groups
    of 128: 1.6% more bytes than one scale per row);
  - bnb_nf4 (with nf4) and bnb_fp4 (with bnb_fp4): bitsandbytes'
    quantize_4bit (blocks of 64, nested absmax: compress_statistics=True)
    and matmul_4bit (its gemv kernel at m = 1, dequantize_4bit and a BF16
    matmul above), when `import bitsandbytes` works.
A peer that cannot be imported, fails to build for a shape or computes a
wrong product has its columns left out and the reason printed (and kept in
the JSON's meta.left_out).

Method (the same for every implementation):
  - each call sequence is captured in one CUDA graph and replayed; the time
    per call is the median of --reps replays measured with CUDA events, each
    replay at least one round over the copies below and about 12 ms of
    calls (a replay's own start shared by many calls, the clocks where
    sustained work holds them: graph_calls);
  - each implementation gets R copies of its weights, R chosen so that the
    copies together hold at least --rotate-mb MB (well past the 50 MB L2),
    and one replay calls them in turn: every call reads its weights from HBM;
  - activations are Gaussian, weights Gaussian * 0.02 (never zeros);
  - each result is checked at m = 1 and 8 against the BF16 product with the
    implementation's own dequantized weights (nibble: its packed bytes
    unpacked and dequantized; tinygemm: (q - 8) * s + z of the values built
    here; bitsandbytes: dequantize_4bit): above 2% relative error nibble
    fails the run, a peer's columns are left out (Marlin's random weights
    are its own, unchecked here);
  - copy bandwidth: a device-to-device copy of 1 GiB, bytes read + written
    per second; nibble's "of copy" column is (packed weights, scales and
    zero points included, + x + y) bytes per call over that.

Output: a table on stdout; layers.csv, layers.json and layers.md in --out
(columns <impl>_us and <impl>_x, the speedup over cuBLAS, per implementation:
nibble_<format>, marlin_<format>, tinygemm_int4, torch_int8, bnb_nf4, bnb_fp4; nibble's
also <impl>_copy and <impl>_config, the configuration nb_gemm_last_config names after one
call at that m, e.g. "gemv_fp4_xs<mxfp4,bf16,mt=1,rows/warp=32> grid=40x3 ...").
"""

import argparse
import csv
import dataclasses
import functools
import importlib
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

# k x n of Llama-3.1-8B/70B/405B, Qwen2.5-32B and Mistral-style layers
DEFAULT_SHAPES = ("4096x4096,4096x6144,4096x28672,14336x4096,8192x8192,8192x10240,8192x57344,28672x8192,"
                  "5120x27648,27648x5120")
DEFAULT_MS = "1,2,4,8,16,32,64,128,256,512,1024"
FP4_FORMATS = ("nvfp4", "mxfp4")
INT4_FORMATS = ("int4", "int4_sym")   # the formats vLLM's Marlin INT4 serves
# nibble's integer and table formats and the group each is timed with
INT_FORMATS = {"int4": 128, "int4_sym": 128, "int8": 128, "nf4": 64, "bnb_fp4": 64}
CHECK_MS = (1, 8)         # rows of x in the correctness check
MAX_REL = 0.02            # relative error allowed there
MAX_M = {"tinygemm_int4": 256}   # implementations timed only up to an m
GRAPH_MIN_US = 12000.0    # work per graph replay, about (graph_calls)
GRAPH_MAX_CALLS = 512     # calls per graph replay, at most
INT_PEER_NOTES = ("tinygemm", "torch_int8", "bitsandbytes", "marlin_int4")   # meta keys of the integer peers


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


def parse_formats(text):
    names = FP4_FORMATS + tuple(INT_FORMATS)
    out = []
    for item in text.split(","):
        f = item.strip().lower()
        if f and f not in names:
            raise SystemExit(f"layers.py: --formats: '{f}' is not one of {', '.join(names)}")
        if f and f not in out:
            out.append(f)
    if not out:
        raise SystemExit("layers.py: --formats names no format")
    return out


def graph_calls(copies, per_call_us, min_us=GRAPH_MIN_US, max_calls=GRAPH_MAX_CALLS):
    """Calls per graph replay: at least one round over the copies and about
    min_us of work at per_call_us a call (at most max_calls).  Why that
    long (H200, 2026-12-01, NOTES.md "Calls per replay, and the power limit"):
    with one round of two copies of 8192 -> 57344 a replay's own start
    added 4-9 us a call at m = 1..32; and within milliseconds of sustained
    work on a large layer the GPU reaches its power limit and lowers the SM
    clock from 1980 to 1300-1600 MHz: at m = 256 per-call times rose 16-18%
    from replays of 2 calls to replays of 32 (12 ms) and no further at 128,
    for cuBLAS and nibble alike, but unevenly in between."""
    want = math.ceil(min_us / max(per_call_us, 1.0))
    return max(copies, min(max_calls, want))


def smi_clock_power(gpu="0"):
    """(SM clock MHz, board power W) of the GPU nvidia-smi knows as `gpu`
    (an index, or "GPU-" and its UUID), or None."""
    try:
        out = subprocess.run(["nvidia-smi", "-i", gpu, "--query-gpu=clocks.sm,power.draw",
                              "--format=csv,noheader,nounits"], capture_output=True, text=True, timeout=10).stdout
        mhz, w = (float(v) for v in out.strip().splitlines()[0].split(","))
        return mhz, w
    except Exception:  # no nvidia-smi, or an answer it could not give ("[N/A]")
        return None


def graph_us(torch, fns, x, reps, sustain=0.0, gpu="0"):
    """(microseconds per call, reading) of fns (called in turn on x, round
    after round), from CUDA graph replays of graph_calls calls: the median
    of reps.  With sustain > 0 the graph first replays for that many
    seconds without a pause, so the timed replays run at the clocks the GPU
    holds under sustained work (at its power limit, where it reaches it),
    and the reading is the SM clock and board power nvidia-smi gives for
    `gpu` while they run ((MHz, W), or None; None without sustain)."""
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):          # warm up outside the graph (plans, workspaces)
        for f in fns:
            f(x)
    torch.cuda.current_stream().wait_stream(s)
    torch.cuda.synchronize()
    a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    a.record()
    for f in fns:                       # one eager round sizes the graph (launch gaps make it long, never short)
        f(x)
    b.record()
    b.synchronize()
    calls = graph_calls(len(fns), a.elapsed_time(b) * 1e3 / len(fns))
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        for i in range(calls):
            fns[i % len(fns)](x)
    for _ in range(3):
        g.replay()
    torch.cuda.synchronize()
    if sustain > 0:
        t0, n = time.monotonic(), 0
        while time.monotonic() - t0 < sustain:
            g.replay()
            n += 1
            if n % 4 == 0:
                torch.cuda.synchronize()   # (the host stays at most four replays ahead)
    ev = [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)) for _ in range(reps)]
    for a, b in ev:                     # queued back to back: no pause between replays
        a.record()
        g.replay()
        b.record()
    reading = smi_clock_power(gpu) if sustain > 0 else None   # while the timed replays run
    torch.cuda.synchronize()
    ts = sorted(a.elapsed_time(b) * 1e3 / calls for a, b in ev)
    return ts[len(ts) // 2], reading


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


def rel_error(torch, fn, w_ref, k, device):
    """The largest relative error of fn(x) against the BF16 product x . w_ref^T
    (accumulated in float32) over Gaussian BF16 x of CHECK_MS rows; NaN when
    any is."""
    rels = []
    for m in CHECK_MS:
        x = torch.randn(m, k, dtype=torch.bfloat16, device=device)
        ref = torch.nn.functional.linear(x.float(), w_ref.float())
        rels.append(((fn(x).float() - ref).norm() / ref.norm()).item())
    return float("nan") if any(r != r for r in rels) else max(rels)


def _load_driver(path, module, option):
    """A peer's Python driver `module`.py in directory `path`: (module or
    None, note); one that is missing or does not import leaves its columns
    out with the reason."""
    if path is None:
        return None, f"no {option} directory"
    if not os.path.isfile(os.path.join(path, module + ".py")):
        return None, f"{path}/{module}.py not found"
    sys.path.insert(0, os.path.abspath(path))
    try:
        mod = importlib.import_module(module)
    except Exception as e:
        return None, f"{module} did not load: {e!r}"[:300]
    return mod, "loaded from " + path


def load_marlin(path):
    """vLLM's Marlin FP4 driver, marlin_peer.py in `path`."""
    return _load_driver(path, "marlin_peer", "--peers")


def load_marlin_int4(path):
    """vLLM's Marlin INT4 (gptq_marlin) driver, marlin_int4_peer.py in `path`."""
    return _load_driver(path, "marlin_int4_peer", "--marlin-int4")


def tinygemm_int4(torch, w, want_ref=False, group=128, inner_k_tiles=8):
    """torch's tinygemm INT4 on W[n, k] (BF16): per group of k, a BF16 scale
    s = (max - min) / 15 and zero z = min + 8 s, codes q = round((w - z) / s
    + 8) in 0..15, w = (q - 8) * s + z as the kernel computes it (one fused
    multiply-add, rounded to BF16 once).  Returns fn(x) and, with want_ref,
    those dequantized weights [n, k] in BF16.  On a CUDA device the codes
    are packed two to a byte, even k in the high nibble, for
    _convert_weight_to_int4pack; on the CPU (the tests) torch's CPU variants
    of both ops take the same scales and zeros."""
    n, k = w.shape
    g = w.float().reshape(n, k // group, group)
    lo, hi = g.amin(-1, keepdim=True), g.amax(-1, keepdim=True)
    s = ((hi - lo).clamp(min=1e-6) / 15).to(torch.bfloat16)
    z = (lo + 8 * s.float()).to(torch.bfloat16)
    q = torch.round((g - z.float()) / s.float() + 8).clamp(0, 15).to(torch.int32)
    ref = ((q.float() - 8) * s.float() + z.float()).reshape(n, k).to(torch.bfloat16) if want_ref else None
    del g
    sz = torch.cat([s, z], -1).transpose(0, 1).contiguous()   # [k / group, n, 2]
    q = q.reshape(n, k)
    if w.device.type == "cuda":
        wp = torch.ops.aten._convert_weight_to_int4pack((q[:, ::2] << 4 | q[:, 1::2]).to(torch.uint8), inner_k_tiles)
        mm = torch.ops.aten._weight_int4pack_mm
    else:
        wp = torch.ops.aten._convert_weight_to_int4pack_for_cpu(q, inner_k_tiles)
        mm = torch.ops.aten._weight_int4pack_mm_for_cpu
    del q

    def fn(x):
        return mm(x, wp, group, sz)
    return fn, ref


def torch_int8(torch, w, want_ref=False):
    """torch's W8A16 kernel (aten._weight_int8pack_mm) on W[n, k] (BF16):
    one BF16 scale per row, s = amax / 127, codes round(w / s) in -127..127,
    w = q * s.  Returns fn(x) and, with want_ref, those weights in BF16."""
    s = (w.float().abs().amax(1) / 127).clamp(min=1e-8).to(torch.bfloat16)
    q = torch.round(w.float() / s.float()[:, None]).clamp(-127, 127).to(torch.int8).contiguous()
    ref = (q.float() * s.float()[:, None]).to(torch.bfloat16) if want_ref else None

    def fn(x):
        return torch.ops.aten._weight_int8pack_mm(x, q, s)
    return fn, ref


def bnb_4bit(bnb, quant_type, w, want_ref=False, blocksize=64):
    """bitsandbytes' NF4 or FP4 (quant_type "nf4" / "fp4") of W[n, k]: blocks
    of `blocksize`, nested absmax.  Returns fn(x) = matmul_4bit and, with
    want_ref, dequantize_4bit's weights [n, k]."""
    qw, st = bnb.functional.quantize_4bit(w, quant_type=quant_type, blocksize=blocksize, compress_statistics=True)

    def fn(x):
        return bnb.matmul_4bit(x, qw.t(), quant_state=st)
    return fn, (bnb.functional.dequantize_4bit(qw, st) if want_ref else None)


def load_int_peers(torch, formats):
    """The --int-peers beside `formats`: ({column: build(w, want_ref)},
    {"tinygemm": note, "torch_int8": note, "bitsandbytes": note})."""
    builds, notes = {}, {}
    # torch's own kernels: (note key, column, the formats they go with, the aten op, builder, note suffix)
    for key, col, fmts, op, build, suffix in (
            ("tinygemm", "tinygemm_int4", INT4_FORMATS, "_weight_int4pack_mm", tinygemm_int4,
             f" (m <= {MAX_M['tinygemm_int4']})"),
            ("torch_int8", "torch_int8", ("int8",), "_weight_int8pack_mm", torch_int8, "")):
        if not set(fmts) & set(formats):
            notes[key] = f"no {' or '.join(fmts)} in --formats"
        elif not hasattr(torch.ops.aten, op):
            notes[key] = f"torch {torch.__version__} has no aten.{op}"
        else:
            builds[col] = functools.partial(build, torch)
            notes[key] = f"torch {torch.__version__} aten.{op}{suffix}"
    wanted = [f for f in ("nf4", "bnb_fp4") if f in formats]
    if not wanted:
        notes["bitsandbytes"] = "no nf4 or bnb_fp4 in --formats"
        return builds, notes
    try:
        import bitsandbytes as bnb
        import bitsandbytes.functional  # noqa: F401  (quantize_4bit, dequantize_4bit)
    except Exception as e:  # a peer that does not import leaves its columns out
        notes["bitsandbytes"] = f"bitsandbytes did not import: {e!r}"[:300]
        return builds, notes
    notes["bitsandbytes"] = f"bitsandbytes {getattr(bnb, '__version__', '?')}"
    for f in wanted:
        qt = "nf4" if f == "nf4" else "fp4"
        builds["bnb_" + qt] = functools.partial(bnb_4bit, bnb, qt)
    return builds, notes


def build_peer(torch, build, w, nrep, device):
    """nrep copies of a peer's fn on w, the first checked against its own
    dequantized weights (ValueError when off)."""
    fn, ref = build(w, want_ref=True)
    rel = rel_error(torch, fn, ref, w.shape[1], device)
    del ref
    if not rel <= MAX_REL:
        raise ValueError(f"relative error {rel:.4f} against its dequantized weights")
    return [fn] + [build(w)[0] for _ in range(nrep - 1)]


def table_lines(rows, meta):
    """The markdown table (a heading line, then the table; the peers left
    out, if any, last).  A run with --sustain adds the SM clocks read while
    each implementation's timed replays ran (cuBLAS first, then the columns
    in order)."""
    cols = list(dict.fromkeys(c for r in rows for c in r if c.endswith("_x")))
    mhz = any(c.endswith("_mhz") for r in rows for c in r)
    lines = [f"{meta['gpu']}, {meta['date']}, commit {meta['commit']}, torch {meta['torch']}, copy bandwidth "
             f"{meta['copy_gbps']:.0f} GB/s; Marlin: {meta['marlin']}" +
             "".join(f"; {p}: {meta[p]}" for p in INT_PEER_NOTES if p in meta) +
             (f"; each implementation replayed {meta['sustain_s']:g} s without a pause before its timed replays"
              if meta.get("sustain_s") else ""), "",
             "| layer k->n | m | cuBLAS us | " + " | ".join(c[:-2].replace("_", " ") for c in cols) +
             (" | SM MHz |" if mhz else " |"),
             "|---|---|---|" + "---|" * (len(cols) + mhz)]
    for r in rows:
        clk = " / ".join("%.0f" % r[c + "_mhz"] if c + "_mhz" in r else "-" for c in ["cublas"] + [c[:-2] for c in cols])
        lines.append(f"| {r['k']}->{r['n']} | {r['m']} | {r['cublas_us']:.1f} | " +
                     " | ".join(f"{r[c]:.2f}x" if c in r and r[c] == r[c] else "-" for c in cols) +
                     (f" | {clk} |" if mhz else " |"))
    if meta.get("left_out"):
        lines += ["", "Left out: " + "; ".join(meta["left_out"])]
    return lines


def record_configs(nt, impls, x, dev, row):
    """row[<column>_config] for each nibble column of impls ({column: its
    calls}): the configuration nb_gemm_last_config names after its first
    call on x (nt: nibble.torch).  A call that fails leaves its key out and
    says why."""
    for iname, fl in impls.items():
        if not iname.startswith("nibble_"):
            continue
        try:
            fl[0](x)
            row[iname + "_config"] = nt.last_config(dev)
        except Exception as e:
            print(f"  {iname} {row['shape']} m={row['m']} config: {e!r}"[:300], flush=True)


def write_outputs(out, rows, meta, lines):
    """layers.csv (a row per layer and m, empty where an implementation did
    not run), layers.json ({"meta", "rows"}) and layers.md in out."""
    os.makedirs(out, exist_ok=True)
    with open(os.path.join(out, "layers.csv"), "w", newline="") as f:
        keys = sorted({k for r in rows for k in r}, key=lambda c: (c not in ("shape", "k", "n", "m"), c))
        wr = csv.DictWriter(f, fieldnames=keys)
        wr.writeheader()
        wr.writerows(rows)
    with open(os.path.join(out, "layers.json"), "w") as f:
        json.dump({"meta": meta, "rows": rows}, f, indent=1)
    with open(os.path.join(out, "layers.md"), "w") as f:
        f.write("\n".join(lines) + "\n")


def parse_args(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--shapes", default=DEFAULT_SHAPES, help="KxN,... (default: the bench set)")
    ap.add_argument("--m", default=DEFAULT_MS, help="tokens per call, comma-separated")
    ap.add_argument("--formats", default="nvfp4,mxfp4",
                    help="nibble formats: nvfp4, mxfp4, int4, int4_sym, int8, nf4, bnb_fp4")
    ap.add_argument("--peers", default=None, help="directory of marlin_peer.py (vLLM's Marlin FP4)")
    ap.add_argument("--marlin-int4", default=None,
                    help="directory of marlin_int4_peer.py (vLLM's Marlin INT4, gptq_marlin), timed beside int4 / "
                         "int4_sym on random weights of the same shape after its own check against float64")
    ap.add_argument("--int-peers", action="store_true",
                    help="also time torch's tinygemm INT4 (beside int4 / int4_sym) and bitsandbytes NF4 / FP4 "
                         "(beside nf4 / bnb_fp4)")
    ap.add_argument("--rotate-mb", type=float, default=240.0, help="weight bytes per replay, per implementation")
    ap.add_argument("--reps", type=int, default=15, help="timed replays per cell (median)")
    ap.add_argument("--sustain", type=float, default=0.0,
                    help="seconds each implementation replays its graph without a pause before it is timed (the "
                         "clocks of sustained work; the SM clock and power read from nvidia-smi go into the CSV / "
                         "JSON as <column>_mhz, <column>_w); default 0")
    ap.add_argument("--out", default=None, help="directory for layers.csv/json/md")
    args = ap.parse_args(argv)
    args.shapes, args.m, args.formats = parse_shapes(args.shapes), parse_ms(args.m), parse_formats(args.formats)
    if args.reps < 3 or args.rotate_mb <= 0 or not 0 <= args.sustain <= 60:
        raise SystemExit("layers.py: --reps must be >= 3, --rotate-mb > 0 and --sustain 0..60 seconds")
    return args


def main(argv=None):
    args = parse_args(argv)
    shapes, ms, formats = args.shapes, args.m, args.formats

    import torch
    from e2e_decode import commit  # the checkout's commit, as the end-to-end benchmark records it
    if not torch.cuda.is_available():
        raise SystemExit("layers.py: needs a CUDA GPU (torch.cuda.is_available() is False)")
    import nibble.torch as nt
    marlin, marlin_note = load_marlin(args.peers)
    int_peers, int_notes = load_int_peers(torch, formats) if args.int_peers else ({}, {})
    marlin4, marlin4_note = load_marlin_int4(args.marlin_int4) if args.marlin_int4 else (None, None)
    if marlin4_note:
        int_notes["marlin_int4"] = marlin4_note
    dev = torch.device("cuda")
    props = torch.cuda.get_device_properties(0)
    # nvidia-smi's name for the GPU in use: the first of CUDA_VISIBLE_DEVICES (an index or a UUID), else 0
    gpu = (os.environ.get("CUDA_VISIBLE_DEVICES") or "0").split(",")[0].strip() or "0"
    bw = copy_gbps(torch)
    meta = {"gpu": props.name, "sms": props.multi_processor_count, "commit": commit(),
            "date": time.strftime("%Y-%m-%d"), "torch": torch.__version__, "copy_gbps": bw,
            "marlin": marlin_note, "host": platform.node(), "sustain_s": args.sustain, **int_notes}
    print(f"{props.name} ({props.multi_processor_count} SMs), torch {torch.__version__}, commit {meta['commit']}, "
          f"copy {bw:.0f} GB/s; marlin: {marlin_note}" + "".join(f"; {p}: {v}" for p, v in int_notes.items()),
          flush=True)
    torch.manual_seed(0)

    def copies(nbytes):
        return max(2, min(64, math.ceil(args.rotate_mb * 1e6 / nbytes)))

    def leave_out(what, e):
        print(f"  {what}: {e!r}"[:300], flush=True)
        meta.setdefault("left_out", []).append(f"{what}: {e!r}"[:300])

    rows, bad = [], []
    for (k, n) in shapes:
        name = f"{k}x{n}"
        w = torch.randn(n, k, dtype=torch.bfloat16, device=dev) * 0.02
        impls = {"cublas": [lambda xx, w=w: torch.nn.functional.linear(xx, w)] +
                 [lambda xx, w=w.clone(): torch.nn.functional.linear(xx, w) for _ in range(copies(2 * n * k) - 1)]}
        nbytes = {}
        for fmt in formats:
            pw = nt.quantize(w, format=fmt, device=dev, group_size=INT_FORMATS.get(fmt))
            ref_w = nt.dequantize_weight(nt.unpack(pw), dtype=torch.bfloat16, device=dev)
            rel = rel_error(torch, lambda xx, pw=pw: nt.gemm(xx, pw), ref_w, k, dev)
            if not rel <= MAX_REL:
                bad.append(f"nibble {fmt} {name}: relative error {rel:.4f} against its dequantized weights")
            del ref_w
            reps = [pw] + [dataclasses.replace(pw, packed=pw.packed.clone(), workspace=pw.workspace.clone())
                           for _ in range(copies(pw.packed.numel()) - 1)]
            impls["nibble_" + fmt] = [lambda xx, p=p: nt.gemm(xx, p) for p in reps]
            nbytes["nibble_" + fmt] = pw.packed.numel()
        if marlin is not None:
            for fmt in formats:
                if fmt not in FP4_FORMATS:
                    continue
                try:
                    impls["marlin_" + fmt] = [marlin.make(k, n, fmt, dev) for _ in range(copies(n * k // 2))]
                except Exception as e:
                    print(f"  marlin {fmt} {name}: {e!r}"[:300], flush=True)
        if marlin4 is not None:
            for fmt in formats:
                if fmt not in INT4_FORMATS:
                    continue
                try:  # its own check first: random weights against their float64 product
                    err = marlin4.check(k, n, fmt, 8, device=dev, verbose=False)   # (an int m: one float)
                    if not err <= MAX_REL:
                        raise ValueError(f"relative error {err:.4f} against float64")
                    impls["marlin_" + fmt] = [marlin4.make(k, n, fmt, dev) for _ in range(copies(n * k // 2))]
                except Exception as e:  # a peer that fails leaves its columns out
                    leave_out(f"marlin_{fmt} {name}", e)
        for col, build in int_peers.items():
            try:
                impls[col] = build_peer(torch, build, w, copies(n * k // 2), dev)
            except Exception as e:  # a peer that fails leaves its columns out
                leave_out(f"{col} {name}", e)
        for m in ms:
            x = torch.randn(m, k, dtype=torch.bfloat16, device=dev)
            res, clocks = {}, {}
            for iname, fl in impls.items():
                if m > MAX_M.get(iname, m):
                    continue
                try:
                    res[iname], reading = graph_us(torch, fl, x, args.reps, args.sustain, gpu)
                    if reading:
                        clocks[iname] = reading
                except Exception as e:
                    print(f"  {iname} {name} m={m}: {e!r}"[:300], flush=True)
                    res[iname] = float("nan")
            base = res["cublas"]
            row = {"shape": name, "k": k, "n": n, "m": m, "cublas_us": base}
            record_configs(nt, impls, x, dev, row)
            for iname, us in res.items():
                if iname == "cublas":
                    continue
                row[iname + "_us"] = us
                row[iname + "_x"] = base / us
                if iname in nbytes:
                    gbps = (nbytes[iname] + 2 * m * (k + n)) / (us * 1e-6) / 1e9
                    row[iname + "_copy"] = gbps / bw
            for iname, (mhz, watts) in clocks.items():
                row[iname + "_mhz"], row[iname + "_w"] = mhz, watts
            rows.append(row)
            print(f"{name:12s} m={m:5d} cublas {base:8.1f} us  " +
                  "  ".join(f"{i[:-2]} {row[i]:.2f}x" for i in row if i.endswith("_x")) +
                  "".join(f"  {i[:-5]} {100 * row[i]:.0f}% of copy" for i in row if i.endswith("_copy")) +
                  "".join(f"  {i[:-4]} {row[i]:.0f} MHz {row[i[:-4] + '_w']:.0f} W" for i in row if i.endswith("_mhz")),
                  flush=True)
        del impls, w
        torch.cuda.empty_cache()

    lines = table_lines(rows, meta)
    print("\n".join(lines))
    if args.out:
        write_outputs(args.out, rows, meta, lines)
    for b in bad:
        print("FAIL", b)
    return 2 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
