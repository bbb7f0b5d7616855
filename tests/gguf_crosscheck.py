#!/usr/bin/env python3
"""Cross-check nibble's GGUF reader against the gguf Python package.

Writes a GGUF file with gguf.GGUFWriter holding MXFP4 (2-D and 3-D experts)
and NVFP4 tensors plus an F32 one, dequantizes every FP4 tensor with
gguf.quants.dequantize into EXPECTED.f32 (float32, file order, experts in
order), then runs `test_gguf --crosscheck FILE EXPECTED.f32` (bit for bit,
zeros of either sign equal: the package's integer codebook has no -0) and
`nibble inspect FILE`, which must name both formats.

usage: gguf_crosscheck.py TEST_GGUF NIBBLE OUTDIR    (exit 77: gguf not installed)
"""
import os
import subprocess
import sys

try:
    import numpy as np
    import gguf
    from gguf.quants import dequantize, quantize
except ImportError:
    print("gguf_crosscheck: the gguf Python package (and numpy) are not installed; skipped")
    sys.exit(77)


def main():
    test_gguf, nibble, outdir = sys.argv[1:4]
    os.makedirs(outdir, exist_ok=True)
    path = os.path.join(outdir, "crosscheck.gguf")
    want = os.path.join(outdir, "expected.f32")
    rng = np.random.default_rng(7)
    Q = gguf.GGMLQuantizationType

    w = gguf.GGUFWriter(path, arch="llama")
    w.add_name("nibble cross-check")
    expected = []
    # MXFP4 through the package's own quantizer
    x = (rng.standard_normal((6, 128)) * 0.05).astype(np.float32)
    q = quantize(x, Q.MXFP4)
    w.add_tensor("blk.0.ffn_down.weight", q, raw_dtype=Q.MXFP4)
    expected.append(dequantize(q, Q.MXFP4).astype(np.float32))
    # MXFP4 experts [E, N, K]
    xe = (rng.standard_normal((3, 4, 64)) * 0.1).astype(np.float32)
    qe = quantize(xe, Q.MXFP4)
    w.add_tensor("blk.0.ffn_down_exps.weight", qe, raw_dtype=Q.MXFP4)
    expected.append(dequantize(qe, Q.MXFP4).astype(np.float32))
    # NVFP4 raw blocks: UE4M3 scales in 0x08..0x70 (never 0x7F/0xFF), random codes
    n, k = 5, 128
    blocks = rng.integers(0, 256, size=(n, k // 64, 36), dtype=np.uint8)
    blocks[:, :, :4] = rng.integers(0x08, 0x70, size=(n, k // 64, 4), dtype=np.uint8)
    raw = blocks.reshape(n, k // 64 * 36)
    w.add_tensor("blk.0.attn_q.weight", raw, raw_dtype=Q.NVFP4)
    expected.append(dequantize(raw, Q.NVFP4).astype(np.float32))
    w.add_tensor("output_norm.weight", np.ones(128, dtype=np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    with open(want, "wb") as f:
        for e in expected:
            f.write(np.ascontiguousarray(e).tobytes())

    rc = subprocess.call([test_gguf, "--crosscheck", path, want])
    out = subprocess.run([nibble, "inspect", path], capture_output=True, text=True)
    print(out.stdout, out.stderr)
    ok = out.returncode == 0 and "gguf-mxfp4" in out.stdout and "gguf-nvfp4" in out.stdout
    if not ok:
        print("gguf_crosscheck: nibble inspect did not list both formats (exit %d)" % out.returncode)
    return 0 if rc == 0 and ok else 1


if __name__ == "__main__":
    sys.exit(main())
