#!/usr/bin/env python3
"""Cross-check nibble's MoE host reference against transformers' expert blocks.

Runs `test_moe --dump OUTDIR`, which writes MoE problems (the experts'
checkpoint bytes, x, the routing) with nibble's outputs: nb_moe_mlp_host_f64
(y64), nb_moe_mlp_host with F32 activations (y32) and with BF16 ones (ybf16).
Here the bytes are dequantized with numpy from docs/formats.md (E2M1 times
E4M3 or E8M0, NVFP4's per-expert tensor scale; float32 arithmetic), loaded
into transformers' own modules, and run:

  gpt-oss (MXFP4, interleaved gate/up, biases)  GptOssExperts: clamp at
      swiglu_limit, (up + 1) * gate * sigmoid(alpha * gate);
  Qwen3-MoE (NVFP4, concatenated gate/up)       Qwen3MoeExperts: silu(gate) * up.

Checks, per problem (max over the outputs, relative to max |y64|):
  float64 modules against y64          <= 1e-12  (the same formula, summed in
                                                   another order);
  float32 modules and y32 against y64  <= 1e-4;
  bfloat16 modules and ybf16 against y64 <= 0.05  (transformers rounds the
      weights and every intermediate to bfloat16; nibble's error is printed
      next to it).

usage: moe_crosscheck.py TEST_MOE OUTDIR    (exit 77: torch or transformers missing)
"""
import os
import subprocess
import sys

try:
    import numpy as np
    import torch
    from transformers.models.gpt_oss.configuration_gpt_oss import GptOssConfig
    from transformers.models.gpt_oss.modeling_gpt_oss import GptOssExperts
    from transformers.models.qwen3_moe.configuration_qwen3_moe import Qwen3MoeConfig
    from transformers.models.qwen3_moe.modeling_qwen3_moe import Qwen3MoeExperts
except ImportError as e:
    print(f"moe_crosscheck: {e}; skipped (needs numpy, torch and transformers with gpt_oss and qwen3_moe)")
    sys.exit(77)

E2M1 = np.array([0, .5, 1, 1.5, 2, 3, 4, 6, -0.0, -.5, -1, -1.5, -2, -3, -4, -6], dtype=np.float64)


def e4m3(b):
    """formats.md 2.1: E == 0 -> M * 2^-9, else (1 + M/8) * 2^(E-7); S.1111.111 NaN."""
    b = b.astype(np.int64)
    e, m = (b >> 3) & 15, b & 7
    v = np.where(e == 0, m * 2.0 ** -9, (1 + m / 8) * 2.0 ** (e - 7))
    v = np.where(b & 0x80, -v, v)
    return np.where((b & 0x7F) == 0x7F, np.nan, v)


def e8m0(b):
    """formats.md 3.1: 2^(b - 127), 0xFF NaN."""
    b = b.astype(np.int64)
    return np.where(b == 0xFF, np.nan, 2.0 ** (b - 127))


def dequant(codes, scales, fmt, experts, n, k, ts):
    """Expert-major checkpoint bytes -> float32 [E, n, k]: low nibble = even element."""
    c = codes.reshape(experts, n, k // 2)
    q = np.stack([c & 15, c >> 4], axis=-1).reshape(experts, n, k)
    g = 16 if fmt == "nvfp4" else 32
    s = (e4m3 if fmt == "nvfp4" else e8m0)(scales.reshape(experts, n, k // g))
    prod = (E2M1[q] * np.repeat(s, g, axis=-1)).astype(np.float32)     # exact in float32
    return prod * ts.astype(np.float32)[:, None, None]                    # one float32 rounding


def load(d, name, dtype):
    return np.fromfile(os.path.join(d, name), dtype=dtype)


def module(meta, wgu, wd, bgu, bd):
    E, H, I = meta["experts"], meta["hidden"], meta["intermediate"]
    if meta["activation"] == "swiglu_oai":
        cfg = GptOssConfig(hidden_size=H, intermediate_size=I, num_local_experts=E,
                           num_experts_per_tok=meta["top_k"], swiglu_limit=meta["limit"])
        cfg._experts_implementation = "eager"
        mod = GptOssExperts(cfg)
        mod.alpha, mod.limit = meta["alpha"], meta["limit"]               # nibble's float32 values
        with torch.no_grad():
            mod.gate_up_proj.copy_(torch.from_numpy(wgu.transpose(0, 2, 1).copy()))   # [E, H, 2I]
            mod.down_proj.copy_(torch.from_numpy(wd.transpose(0, 2, 1).copy()))       # [E, I, H]
            mod.gate_up_proj_bias.copy_(torch.from_numpy(bgu))
            mod.down_proj_bias.copy_(torch.from_numpy(bd))
    else:
        cfg = Qwen3MoeConfig(hidden_size=H, moe_intermediate_size=I, num_experts=E,
                             num_experts_per_tok=meta["top_k"], hidden_act="silu")
        cfg._experts_implementation = "eager"
        mod = Qwen3MoeExperts(cfg)
        with torch.no_grad():
            mod.gate_up_proj.copy_(torch.from_numpy(wgu))                 # [E, 2I, H], gate rows first
            mod.down_proj.copy_(torch.from_numpy(wd))                     # [E, H, I]
    return mod


def run_case(test_dir):
    meta = {}
    for line in open(os.path.join(test_dir, "meta.txt")):
        k, v = line.split()
        meta[k] = v if k in ("format", "activation", "layout") else (float(v) if "." in v or "e" in v else int(v))
    meta["limit"], meta["alpha"] = float(meta["limit"]), float(meta["alpha"])
    E, K, m, H, I, fmt = (meta[k] for k in ("experts", "top_k", "m", "hidden", "intermediate", "format"))
    want_layout = "interleaved" if meta["activation"] == "swiglu_oai" else "concat"
    assert meta["layout"] == want_layout, f"{test_dir}: layout {meta['layout']} for {meta['activation']}"
    one = np.ones(E, dtype=np.float32)
    ts_gu = load(test_dir, "gate_up_ts.f32", np.float32) if fmt == "nvfp4" else one
    ts_d = load(test_dir, "down_ts.f32", np.float32) if fmt == "nvfp4" else one
    wgu = dequant(load(test_dir, "gate_up_codes.u8", np.uint8), load(test_dir, "gate_up_scales.u8", np.uint8),
                  fmt, E, 2 * I, H, ts_gu)
    wd = dequant(load(test_dir, "down_codes.u8", np.uint8), load(test_dir, "down_scales.u8", np.uint8),
                 fmt, E, H, I, ts_d)
    if meta["bias"]:
        bgu = load(test_dir, "gate_up_bias.f32", np.float32).reshape(E, 2 * I)
        bd = load(test_dir, "down_bias.f32", np.float32).reshape(E, H)
    else:
        assert meta["activation"] == "swiglu", "gpt-oss cases have biases"
        bgu = bd = None
    x = load(test_dir, "x.f32", np.float32).reshape(m, H)
    ids = torch.from_numpy(load(test_dir, "topk_ids.i32", np.int32).reshape(m, K).astype(np.int64))
    tw = load(test_dir, "topk_weights.f32", np.float32).reshape(m, K)
    y64 = load(test_dir, "y64.f64", np.float64).reshape(m, H)
    y32 = load(test_dir, "y32.f32", np.float32).reshape(m, H)
    ybf = (load(test_dir, "ybf16.u16", np.uint16).astype(np.uint32) << 16).view(np.float32).reshape(m, H)

    mod = module(meta, wgu, wd, bgu, bd)
    scale = max(float(np.abs(y64).max()), 1e-30)
    out = {}
    with torch.no_grad():
        for name, dt in (("f64", torch.float64), ("f32", torch.float32), ("bf16", torch.bfloat16)):
            mod.to(dt)
            y = mod(torch.from_numpy(x).to(dt), ids, torch.from_numpy(tw).to(dt))
            out[name] = y.to(torch.float64).numpy()
    err = {k: float(np.abs(v - y64).max()) / scale for k, v in out.items()}
    err["nibble f32"] = float(np.abs(y32 - y64).max()) / scale
    err["nibble bf16"] = float(np.abs(ybf - y64).max()) / scale
    limits = {"f64": 1e-12, "f32": 1e-4, "nibble f32": 1e-4, "bf16": 0.05, "nibble bf16": 0.05}
    bad = [k for k in limits if not err[k] <= limits[k]]
    kind = "gpt-oss" if meta["activation"] == "swiglu_oai" else "qwen3-moe"
    print(f"{os.path.basename(test_dir)}: {kind} {fmt} E {E} top_k {K} m {m} H {H} I {I}: max |error| / max |y64|: "
          + ", ".join(f"{k} {v:.3g}" for k, v in err.items()) + ("  FAIL: " + ", ".join(bad) if bad else ""))
    return not bad


def main():
    test_moe, outdir = sys.argv[1:3]
    os.makedirs(outdir, exist_ok=True)
    r = subprocess.run([test_moe, "--dump", outdir], capture_output=True, text=True)
    if r.returncode:
        print(r.stdout[-4000:], r.stderr[-4000:])
        print("moe_crosscheck: test_moe --dump failed")
        return 1
    cases = sorted(d for d in os.listdir(outdir) if d.startswith("case"))
    ok = sum(run_case(os.path.join(outdir, d)) for d in cases)
    print(f"moe_crosscheck: {ok} of {len(cases)} problems agree with transformers' expert blocks")
    return 0 if cases and ok == len(cases) else 1


if __name__ == "__main__":
    sys.exit(main())
