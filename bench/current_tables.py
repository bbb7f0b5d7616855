#!/usr/bin/env python3
"""The per-path tables of bench/RESULTS.md from one run's files.

    python3 bench/current_tables.py DIR [--section NAME ...]

DIR holds what scripts/current-run writes (any file may be missing; its
tables are then skipped):

  cur-e2m1.csv     nibble bench, default layers, NVFP4 / MXFP4, m = 1..1024
  cur-int.csv      nibble bench, the integer and table formats
  cur-mma.csv      nibble bench with NIBBLE_PATH=mma
  cur-seq.txt      nibble bench --sequence (its "sequence ..." lines)
  cur-moe.txt      bench_moe's table
  layers-fp4/layers.csv   python/bench/layers.py --peers (Marlin FP4)
  layers-int4/layers.csv  python/bench/layers.py --formats int4,int4_sym --int-peers --marlin-int4
  sustained-fp4/layers.csv, sustained-int4/layers.csv   layers.py --sustain (NVFP4 with Marlin FP4, int4
                   with Marlin INT4)
  e2e/*.csv        python/bench/e2e_decode.py --out (every CSV found, in name order)

Prints Markdown tables, one section per path (decode, tc, int, mma,
marlin, int4peers, sustained_fp4, sustained_int4, sequence, moe, e2e), each headed by a comment line that
names it; --section limits the output.  Numbers are printed as the files
hold them, rounded; nothing is computed but ratios the files imply.
"""
import argparse
import csv
import glob
import os
import re
import sys

BENCH_LAYERS = [(8192, 8192), (8192, 57344), (28672, 8192), (4096, 6144), (4096, 4096)]
DECODE_MS = (1, 2, 4, 8, 12, 16, 20, 24, 28, 32)
TC_MS = (64, 128, 256, 512, 1024)
INT_FORMATS = ("int4", "int4_sym", "int4_hqq", "int8", "nf4", "bnb_fp4")


def kernel_name(cfg):
    """The kernel a `nibble bench` config string names, in the tables' words."""
    if cfg.startswith("gemv_fp4_xs"):
        return "2, stream-K wave" if "stream-k" in cfg else "2"
    if cfg.startswith("gemv_fp4<"):
        return "1"
    m = re.match(r"gemm_sm90<[^>]*?(\d+x\d+)>", cfg)
    if m:
        return "tensor core %s%s" % (m.group(1), ", stream-K" if "stream-k" in cfg else "")
    m = re.match(r"gemm_sm80<[^>]*?(\d+x\d+),stages=\d>", cfg)
    if m:
        return "mma.sync %s" % m.group(1)
    return cfg.split(" ")[0]


def read_csv(path):
    if not os.path.exists(path):
        return None
    with open(path, newline="") as f:
        return list(csv.DictReader(f))


def bench_index(rows):
    return {(int(r["k"]), int(r["n"]), int(r["m"]), r["format"]): r for r in rows}


def layers_present(t, fmt):
    return [l for l in BENCH_LAYERS if any((l[0], l[1], m, fmt) in t for m in DECODE_MS + TC_MS)]


def e2m1_table(t, ms, decode, marlin=None):
    """Rows of NVFP4 / MXFP4 pairs: decode tables give % copy, tensor-core ones TFLOP/s; with `marlin`
    ({(k, n, m): layers.py row}), Marlin FP4's speedups of the same session where layers.py timed that m."""
    head = ("| layer k -> n | m | NVFP4 us | MXFP4 us | cuBLAS BF16 us | speedup | %s | kernel (NVFP4) |"
            % ("% of copy bandwidth" if decode else "TFLOP/s nibble / cuBLAS (NVFP4)"))
    out = [head, "|---|---|---|---|---|---|---|---|"]
    if marlin:
        out = [head + " Marlin FP4 (layers.py) |", out[1] + "---|"]
    for l in layers_present(t, "nvfp4"):
        for m in ms:
            a, b = t.get(l + (m, "nvfp4")), t.get(l + (m, "mxfp4"))
            if not a or not b:
                continue
            extra = ("%d%% / %d%%" % (round(100 * float(a["copy_fraction"])), round(100 * float(b["copy_fraction"])))
                     if decode else "%.0f / %.0f" % (float(a["tflops"]), float(a["cublas_tflops"])))
            row = "| %d -> %d | %d | %.1f | %.1f | %.1f / %.1f | %.2f / %.2fx | %s | %s |" % (
                l[0], l[1], m, float(a["nibble_us"]), float(b["nibble_us"]), float(a["cublas_us"]),
                float(b["cublas_us"]), float(a["speedup"]), float(b["speedup"]), extra, kernel_name(a["config"]))
            if marlin:
                r = marlin.get(l + (m,))
                row += (" %.2f / %.2fx |" % (float(r["marlin_nvfp4_x"]), float(r["marlin_mxfp4_x"])) if r and
                        r.get("marlin_nvfp4_x") and r.get("marlin_mxfp4_x") else " - |")
            out.append(row)
    return out


def int_table(rows):
    t = bench_index(rows)
    ms = sorted({int(r["m"]) for r in rows})
    fmts = [f for f in INT_FORMATS if any(r["format"] == f for r in rows)]
    out = ["| layer k -> n | format | " + " | ".join("m = %d" % m for m in ms) + " | m = 1 us (cuBLAS) | m = 1 % copy |",
           "|---|---|" + "---|" * len(ms) + "---|---|"]
    for l in BENCH_LAYERS:
        for f in fmts:
            cells = [t.get(l + (m, f)) for m in ms]
            if not all(cells):
                continue
            first = cells[0]
            out.append("| %d -> %d | %s | %s | %.1f (%.1f) | %d%% |" % (
                l[0], l[1], f, " | ".join("%.2fx" % float(c["speedup"]) for c in cells), float(first["nibble_us"]),
                float(first["cublas_us"]), round(100 * float(first["copy_fraction"]))))
    return out


def mma_table(rows):
    out = ["| layer k -> n | format | m | nibble us | cuBLAS BF16 us | speedup | TFLOP/s nibble / cuBLAS | tile |",
           "|---|---|---|---|---|---|---|---|"]
    for r in rows:
        out.append("| %s -> %s | %s | %s | %.1f | %.1f | %.2fx | %.0f / %.0f | %s |" % (
            r["k"], r["n"], r["format"], r["m"], float(r["nibble_us"]), float(r["cublas_us"]), float(r["speedup"]),
            float(r["tflops"]), float(r["cublas_tflops"]), kernel_name(r["config"])))
    return out


def layers_rows(rows):
    """layers.py's rows: its batch sizes, its layers in file order, and the rows by (layer, m)."""
    shapes = []
    for r in rows:
        if r["shape"] not in shapes:
            shapes.append(r["shape"])
    return sorted({int(r["m"]) for r in rows}), shapes, {(r["shape"], int(r["m"])): r for r in rows}


def bold(x, y):
    return "**%.2f**" % x if x >= y else "%.2f" % x


def marlin_table(rows):
    ms, shapes, t = layers_rows(rows)
    out = ["| layer k->n | " + " | ".join("m = %d" % m for m in ms) + " | m = 1 % copy |", "|---|" + "---|" * len(ms) + "---|"]
    for s in shapes:
        cells = []
        for m in ms:
            r = t.get((s, m))
            if not r:
                cells.append("")
                continue
            nv, mx = float(r["nibble_nvfp4_x"]), float(r["nibble_mxfp4_x"])
            mnv, mmx = float(r["marlin_nvfp4_x"]), float(r["marlin_mxfp4_x"])
            cells.append("%s / %s (%s / %s)" % (bold(nv, mnv), bold(mx, mmx), bold(mnv, nv), bold(mmx, mx)))
        r = t.get((s, 1))
        copy = ("%d%% / %d%%" % (round(100 * float(r["nibble_nvfp4_copy"])), round(100 * float(r["nibble_mxfp4_copy"])))
                if r else "")
        out.append("| %s | %s | %s |" % (s.replace("x", "->"), " | ".join(cells), copy))
    return out


def int4_peer_table(rows):
    """int4 against Marlin INT4 (u4, zero points) and tinygemm; where the run has them, a second table of
    int4_sym against Marlin's u4b8 (the GPTQ symmetric codes)."""
    ms, shapes, t = layers_rows(rows)
    out = []
    for fmt, peer in (("int4", "marlin_int4"), ("int4_sym", "marlin_int4_sym")):
        if not any(r.get(peer + "_x") and r.get("nibble_%s_x" % fmt) for r in rows):
            continue
        if out:
            out += ["", "%s against Marlin INT4's u4b8 (same run):" % fmt, ""]
        out += ["| layer k->n | " + " | ".join("m = %d" % m for m in ms) + " |", "|---|" + "---|" * len(ms)]
        for s in shapes:
            cells = []
            for m in ms:
                r = t.get((s, m))
                if not r or not r.get(peer + "_x") or not r.get("nibble_%s_x" % fmt):
                    cells.append("")
                    continue
                n, mi = float(r["nibble_%s_x" % fmt]), float(r[peer + "_x"])
                tg = r.get("tinygemm_int4_x")
                cells.append("%s (%s / %s)" % (bold(n, mi), bold(mi, n), "%.2f" % float(tg) if tg else "-"))
            out.append("| %s | %s |" % (s.replace("x", "->"), " | ".join(cells)))
    return out


def sustained_table(rows):
    """layers.py --sustain rows: speedups over cuBLAS BF16 per implementation (nibble's first), and the SM
    clocks read while each one's timed replays ran (cuBLAS first, then the columns in order)."""
    cols = sorted(dict.fromkeys(c for r in rows for c in r if c.endswith("_x") and r[c]),
                  key=lambda c: not c.startswith("nibble_"))   # nibble's columns first, then its peers'
    out = ["| layer k->n | m | cuBLAS us | " + " | ".join(c[:-2].replace("_", " ") for c in cols) + " | SM MHz |",
           "|---|---|---|" + "---|" * (len(cols) + 1)]
    for r in rows:
        clk = " / ".join("%.0f" % float(r[c + "_mhz"]) if r.get(c + "_mhz") else "-"
                         for c in ["cublas"] + [c[:-2] for c in cols])
        out.append("| %s | %s | %.1f | %s | %s |" % (r["shape"].replace("x", "->"), r["m"], float(r["cublas_us"]),
                                                     " | ".join("%.2fx" % float(r[c]) if r.get(c) else "-" for c in cols),
                                                     clk))
    return out


def sequence_table(path):
    out = ["| format | m | nibble us per pass (alone) | cuBLAS BF16 (alone) | speedup (alone) |", "|---|---|---|---|---|"]
    pat = re.compile(r"sequence (\w+) m=(\d+), \d+ layers: nibble ([\d.]+) us per pass \(layers alone ([\d.]+)\), "
                     r"cuBLAS ([\d.]+) \(([\d.]+)\), speedup ([\d.]+)x \(alone ([\d.]+)x\)")
    for line in open(path):
        m = pat.search(line)
        if m:
            f, mm, a, b, c, d, e, g = m.groups()
            out.append("| %s | %s | %s (%s) | %s (%s) | %sx (%sx) |" % (f.upper(), mm, a, b, c, d, e, g))
    return out


def moe_table(path):
    out = ["| model (experts' layers) | format | batch | nibble us | BF16 us | speedup | GB/s | path |", "|---|---|---|---|---|---|---|---|"]
    for line in open(path):
        f = line.split()
        if len(f) > 8 and f[1] in ("nvfp4", "mxfp4") and f[2].isdigit():
            p = re.search(r"(decode|tc) block=(\d+)", line)
            path_s = "%s, block %s" % (p.group(1).replace("tc", "tensor core"), p.group(2)) if p else ""
            out.append("| %s | %s | %s | %s | %s | %s | %s | %s |" % (f[0], f[1], f[2], f[3], f[4], f[5], f[6], path_s))
    return out


def e2e_table(paths):
    out = ["| format | batch | ms/step | tokens/s | vs BF16 | linears ms | lm_head ms | run |", "|---|---|---|---|---|---|---|---|"]
    for i, p in enumerate(paths):
        rows = read_csv(p) or []
        base = {r["batch"]: float(r["step_ms"]) for r in rows if r["format"] == "bf16"}
        for r in rows:
            b = base.get(r["batch"])
            vs = "%.2fx" % (b / float(r["step_ms"])) if b else "-"
            out.append("| %s | %s | %.3f | %.1f | %s | %.3f | %.3f | %s |" % (
                r["format"], r["batch"], float(r["step_ms"]), float(r["tokens_per_s"]), vs, float(r["linear_ms"]),
                float(r["lm_head_ms"]), os.path.basename(p)))
    return out


def main(argv):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("dir")
    ap.add_argument("--section", action="append", default=None,
                    help="decode, tc, int, mma, marlin, int4peers, sustained_fp4, sustained_int4, sequence, moe, "
                         "e2e (default: all)")
    a = ap.parse_args(argv)
    d = a.dir
    if not os.path.isdir(d):
        print("current_tables: %s is not a directory" % d, file=sys.stderr)
        return 1
    want = set(a.section or ["decode", "tc", "int", "mma", "marlin", "int4peers", "sustained_fp4", "sustained_int4",
                             "sequence", "moe", "e2e"])
    sections = []
    e2m1 = read_csv(os.path.join(d, "cur-e2m1.csv"))
    if e2m1:
        t = bench_index(e2m1)
        fp4 = read_csv(os.path.join(d, "layers-fp4/layers.csv")) or []
        marlin = {(int(r["k"]), int(r["n"]), int(r["m"])): r for r in fp4 if r.get("marlin_nvfp4_x")}
        sections.append(("decode", e2m1_table(t, DECODE_MS, True, marlin)))
        sections.append(("tc", e2m1_table(t, TC_MS, False, marlin)))
    for name, path, fn in (("int", "cur-int.csv", int_table), ("mma", "cur-mma.csv", mma_table),
                           ("marlin", "layers-fp4/layers.csv", marlin_table),
                           ("int4peers", "layers-int4/layers.csv", int4_peer_table),
                           ("sustained_fp4", "sustained-fp4/layers.csv", sustained_table),
                           ("sustained_int4", "sustained-int4/layers.csv", sustained_table)):
        rows = read_csv(os.path.join(d, path))
        if rows:
            sections.append((name, fn(rows)))
    for name, path, fn in (("sequence", "cur-seq.txt", sequence_table), ("moe", "cur-moe.txt", moe_table)):
        if os.path.exists(os.path.join(d, path)):
            sections.append((name, fn(os.path.join(d, path))))
    e2e = sorted(glob.glob(os.path.join(d, "e2e", "*.csv")))
    if e2e:
        sections.append(("e2e", e2e_table(e2e)))
    for name, lines in sections:
        if name in want:
            print("<!-- %s -->" % name)
            print("\n".join(lines))
            print()
    missing = want - {n for n, _ in sections}
    if missing:
        print("current_tables: no files for %s" % ", ".join(sorted(missing)), file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
