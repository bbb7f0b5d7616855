#!/usr/bin/env python3
"""Cross-check of the integer and bitsandbytes formats against their
producers' own code, when it is installed (exit 77, skipped, otherwise):

  * bitsandbytes (its CPU functions): quantize_4bit's codes and absmax equal
    nibble.quantize's (nf4 and fp4, blocks of 64 and 128, F32/F16/BF16
    input); dequantize_4bit equals nibble.dequantize bit for bit (F32, F16,
    BF16); a layer saved as bitsandbytes serializes it (QuantState.as_dict,
    double quantization included) and read back through nibble's checkpoint
    reader dequantizes to dequantize_4bit's values bit for bit;
  * PyTorch: AWQ (GEMM) and GPTQ (v1 zero points, act-order) layers packed
    here with torch bit operations, dequantized with the producers' formulas
    in PyTorch half arithmetic (AutoAWQ: (iweight - izeros) * scales; GPTQ:
    scales[g_idx] * (weight - zeros)), equal nibble's reading of the same
    file bit for bit; likewise a symmetric 8-bit GPTQ layer (v1, act-order,
    every zero point 128) read as int8.

usage: int_crosscheck.py LIBNIBBLE PYTHON_PACKAGE_DIR WORK_DIR
Prints the versions used and "N passed, M failed"."""

import json
import os
import sys


def main():
    lib, pydir, work = sys.argv[1:4]
    os.environ["NIBBLE_LIBRARY"] = lib
    sys.path.insert(0, pydir)
    try:
        import numpy as np
        import torch
        import bitsandbytes
        import bitsandbytes.functional as F
        from safetensors.torch import save_file
    except ImportError as e:
        print(f"skipped: {e.name} is not installed (pip install torch bitsandbytes safetensors)")
        return 77
    import nibble
    try:
        nibble._lib.io_lib()
    except ImportError as e:
        print(f"skipped: {e}")
        return 77
    print(f"torch {torch.__version__}, bitsandbytes {bitsandbytes.__version__}, numpy {np.__version__}")
    os.makedirs(work, exist_ok=True)
    passed = failed = 0

    def check(cond, what):
        nonlocal passed, failed
        if cond:
            passed += 1
        else:
            failed += 1
            print(f"FAIL {what}")

    def bits(t):
        """A torch tensor as raw integers (bit-exact comparisons, NaN included)."""
        return t.contiguous().view({torch.float32: torch.int32, torch.float16: torch.int16,
                                    torch.bfloat16: torch.int16}[t.dtype]).numpy()

    def np_of(t):
        return t.view(torch.int16).numpy().view(np.uint16) if t.dtype == torch.bfloat16 else t.numpy()

    def same_as_bnb(packed, st, qw, what):
        """dequantize_4bit and nibble.dequantize agree bit for bit in every output dtype."""
        for out, npdt in ((torch.float32, np.float32), (torch.float16, np.float16), (torch.bfloat16, "bfloat16")):
            st.dtype = out
            ref = bits(F.dequantize_4bit(packed, st))
            check(np.array_equal(ref, nibble.dequantize(qw, npdt).view(ref.dtype)), f"{what} (-> {out})")

    gen = torch.Generator().manual_seed(11)
    n, k = 24, 512
    for qt in ("nf4", "fp4"):
        fmt = "nf4" if qt == "nf4" else "bnb_fp4"
        for block in (64, 128):
            for dt in (torch.float32, torch.float16, torch.bfloat16):
                w = (torch.randn(n, k, generator=gen) * torch.logspace(-3, 1, n)[:, None]).to(dt)
                w[3, :block] = 0          # an all-zero block
                w[5, 7] = 0.0             # exact zeros and tiny values (FP4's two zero codes)
                w[5, 8] = 1e-6
                packed, st = F.quantize_4bit(w, blocksize=block, quant_type=qt, compress_statistics=False)
                qw = nibble.quantize(np_of(w), fmt, group_size=block)
                p = packed.numpy().reshape(-1)
                swapped = ((p >> 4) | (p << 4)).astype(np.uint8).reshape(n, k // 2)
                what = f"{qt} block {block} {dt}"
                check(np.array_equal(swapped, qw.codes), f"{what}: codes differ from quantize_4bit's "
                      f"({int((swapped != qw.codes).sum())} bytes)")
                check(np.array_equal(st.absmax.numpy().reshape(n, -1), qw.scales), f"{what}: absmax differs")
                same_as_bnb(packed, st, qw, f"{what}: dequantize_4bit differs")

    # a checkpoint as bitsandbytes serializes it, double quantization included
    tensors, layers = {}, []
    for i, (qt, block, nested) in enumerate([("nf4", 64, True), ("fp4", 64, True), ("nf4", 128, False)]):
        w = torch.randn(32, 256, generator=gen, dtype=torch.float32).to(torch.bfloat16)
        packed, st = F.quantize_4bit(w, blocksize=block, quant_type=qt, compress_statistics=nested)
        prefix = f"model.layers.{i}.mlp.down_proj"
        tensors[prefix + ".weight"] = packed
        for key, v in st.as_dict(packed=True).items():
            tensors[f"{prefix}.weight.{key}"] = v
        layers.append((prefix, qt, packed, st))
    path = os.path.join(work, "bnb")
    os.makedirs(path, exist_ok=True)
    save_file(tensors, os.path.join(path, "model.safetensors"), metadata={"format": "pt"})
    with open(os.path.join(path, "config.json"), "w") as f:
        json.dump({"quantization_config": {"quant_method": "bitsandbytes", "load_in_4bit": True,
                                           "bnb_4bit_quant_type": "nf4", "bnb_4bit_use_double_quant": True}}, f)
    with nibble.open_checkpoint(path) as ck:
        for prefix, qt, packed, st in layers:
            L = ck.layer(prefix)
            check(L.format == f"bnb-{qt}", f"{prefix}: detected as {L.format} ({L.problem})")
            if L.format != f"bnb-{qt}":
                continue
            qw = ck.quantized_weight(prefix)
            same_as_bnb(packed, st, qw, f"{prefix} ({qt}, nested {st.nested}): the checkpoint reads back differently")

    # AWQ and GPTQ: packed with torch, dequantized with the producers' formulas in half arithmetic
    N, K, G = 64, 256, 64
    q = torch.randint(0, 16, (N, K), generator=gen, dtype=torch.int32)
    z = torch.randint(0, 16, (N, K // G), generator=gen, dtype=torch.int32)
    s = (torch.rand(K // G, N, generator=gen) * 0.02 + 1e-4).to(torch.float16)  # [K/G, N]
    awq_order = [0, 2, 4, 6, 1, 3, 5, 7]
    qweight = torch.zeros(K, N // 8, dtype=torch.int64)
    qzeros = torch.zeros(K // G, N // 8, dtype=torch.int64)
    for i, col in enumerate(awq_order):
        qweight |= q.T[:, col::8].to(torch.int64) << (4 * i)
        qzeros |= z.T[:, col::8].to(torch.int64) << (4 * i)
    # AutoAWQ's dequantization: unpack (shifts 0..28 then AWQ_REVERSE_ORDER), (iweight - izeros) * scales
    shifts = torch.arange(0, 32, 4)
    rev = [0, 4, 1, 5, 2, 6, 3, 7]
    iw = ((qweight[:, :, None] >> shifts) & 15)[:, :, rev].reshape(K, N)
    iz = ((qzeros[:, :, None] >> shifts) & 15)[:, :, rev].reshape(K // G, N)
    awq_ref = ((iw - iz.repeat_interleave(G, 0)).to(torch.float16) * s.repeat_interleave(G, 0)).T.contiguous()
    # GPTQ v1 with act-order: zero points stored minus one, g_idx scattering the groups
    perm = torch.randperm(K, generator=gen)
    g_idx = torch.empty(K, dtype=torch.int32)
    g_idx[perm] = torch.arange(K, dtype=torch.int32) // G
    gq = torch.zeros(K // 8, N, dtype=torch.int64)
    for i in range(8):
        gq |= q.T[i::8, :].to(torch.int64) << (4 * i)
    gz = torch.zeros(K // G, N // 8, dtype=torch.int64)
    for i in range(8):
        gz |= ((z.T[:, i::8] - 1) & 15).to(torch.int64) << (4 * i)
    # qlinear_cuda_old's dequantization: zeros + 1 (masked), then scales[g_idx] * (weight - zeros)
    wq = (gq[:, None, :] >> shifts[None, :, None]) & 15
    wq = wq.reshape(K, N)
    zz = ((((gz[:, :, None] >> shifts) & 15) + 1) & 15).reshape(K // G, N)
    gptq_ref = (s[g_idx.long()] * (wq - zz[g_idx.long()]).to(torch.float16)).T.contiguous()  # [N, K]
    path = os.path.join(work, "int4")
    os.makedirs(path, exist_ok=True)
    save_file({"awq.qweight": qweight.to(torch.int32), "awq.qzeros": qzeros.to(torch.int32), "awq.scales": s,
               "gptq.qweight": gq.to(torch.int32), "gptq.qzeros": gz.to(torch.int32), "gptq.scales": s.clone(),
               "gptq.g_idx": g_idx}, os.path.join(path, "model.safetensors"))
    with nibble.open_checkpoint(path) as ck:
        a, g = ck.quantized_weight("awq"), ck.quantized_weight("gptq")
        check(ck.layer("awq").format == "awq-int4" and ck.layer("gptq").format == "gptq-int4", "int4 layouts")
        got = nibble.dequantize(a, np.float16)
        check(np.array_equal(got.view(np.int16), bits(awq_ref)), "AWQ: differs from (iweight - izeros) * scales")
        p = ck.perm("gptq")
        got = nibble.dequantize(g, np.float16)
        check(ck.layer("gptq").k_permuted and np.array_equal(got.view(np.int16), bits(gptq_ref[:, p])),
              "GPTQ act-order: differs from scales[g_idx] * (weight - zeros) in the permuted order")
        x = torch.randn(3, K, generator=gen, dtype=torch.float32)
        y = nibble.gemm_reference(x.numpy()[:, p], g, out_dtype=np.float64)
        # (the reference GEMM multiplies the exact float32 weights, not their half rounding)
        exact = (s.float()[g_idx.long()] * (wq - zz[g_idx.long()]).float()).T
        y_ref = x.double() @ exact.double().T
        check(np.allclose(y, y_ref.numpy(), rtol=1e-12, atol=1e-12), "GPTQ act-order GEMM with x[:, perm]")

    # GPTQ 8-bit, sym=True (v1: every zero point stored as 127), act-order: read as int8 codes q - 128
    q8 = torch.randint(0, 256, (N, K), generator=gen, dtype=torch.int32)
    g8 = torch.zeros(K // 4, N, dtype=torch.int64)
    for i in range(4):
        g8 |= q8.T[i::4, :].to(torch.int64) << (8 * i)
    z8 = torch.full((K // G, N // 4), 0x7F7F7F7F, dtype=torch.int64)
    # GPTQ's dequantization at 8 bits: shifts 0..24, masks 255, zeros + 1, then scales[g_idx] * (weight - zeros)
    shifts8 = torch.arange(0, 32, 8)
    wq8 = ((g8[:, None, :] >> shifts8[None, :, None]) & 255).reshape(K, N)
    zz8 = ((((z8[:, :, None] >> shifts8) & 255) + 1) & 255).reshape(K // G, N)
    gptq8_ref = (s[g_idx.long()] * (wq8 - zz8[g_idx.long()]).to(torch.float16)).T.contiguous()  # [N, K]
    path = os.path.join(work, "int8")
    os.makedirs(path, exist_ok=True)
    save_file({"gptq.qweight": g8.to(torch.int32), "gptq.qzeros": z8.to(torch.int32), "gptq.scales": s.clone(),
               "gptq.g_idx": g_idx}, os.path.join(path, "model.safetensors"))
    with open(os.path.join(path, "config.json"), "w") as f:
        json.dump({"quantization_config": {"quant_method": "gptq", "bits": 8, "group_size": G, "desc_act": True,
                                           "sym": True}}, f)
    with nibble.open_checkpoint(path) as ck:
        L = ck.layer("gptq")
        check(L.format == "gptq-int8" and L.quant_format == "int8" and L.k_permuted, f"int8 layout ({L.problem})")
        if L.format == "gptq-int8":
            g, p = ck.quantized_weight("gptq"), ck.perm("gptq")
            check(np.array_equal(g.codes.view(np.int8), (q8[:, p] - 128).to(torch.int8).numpy()),
                  "GPTQ 8-bit: codes differ from weight - 128")
            got = nibble.dequantize(g, np.float16)
            check(np.array_equal(got.view(np.int16), bits(gptq8_ref[:, p])),
                  "GPTQ 8-bit act-order: differs from scales[g_idx] * (weight - zeros) in the permuted order")
    print(f"{passed} passed, {failed} failed")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
