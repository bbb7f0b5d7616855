#!/usr/bin/env python3
"""Write a synthetic Llama-shaped BF16 safetensors checkpoint (random
non-zero weights), sharded with an index and a config.json, for measuring
`nibble quantize` on multi-GB inputs without downloading a model.

    synth_checkpoint.py OUT [--layers 20] [--hidden 2048] [--intermediate 8192]
                            [--heads 32] [--kv-heads 8] [--vocab 128256]
                            [--shard-gb 2.0] [--seed 0]

The defaults give 1.74 G parameters, 3.48 GB (Llama-3.2-1B's widths with 20
layers and an untied lm_head).  Weights are BF16 bit patterns with a random
sign, exponent 2^-9..2^-3 and mantissa (never zero); norms are near 1.
Tensors are generated and written in chunks, so memory stays small.  Needs
numpy.
"""

import argparse
import json
import os
import struct

import numpy as np

CHUNK = 1 << 24  # elements generated at a time


def tensors(a):
    h, i, v, hd = a.hidden, a.intermediate, a.vocab, a.hidden // a.heads
    out = [("model.embed_tokens.weight", (v, h))]
    for layer in range(a.layers):
        p = f"model.layers.{layer}."
        out += [(p + "input_layernorm.weight", (h,)),
                (p + "self_attn.q_proj.weight", (a.heads * hd, h)),
                (p + "self_attn.k_proj.weight", (a.kv_heads * hd, h)),
                (p + "self_attn.v_proj.weight", (a.kv_heads * hd, h)),
                (p + "self_attn.o_proj.weight", (h, a.heads * hd)),
                (p + "post_attention_layernorm.weight", (h,)),
                (p + "mlp.gate_proj.weight", (i, h)),
                (p + "mlp.up_proj.weight", (i, h)),
                (p + "mlp.down_proj.weight", (h, i))]
    out += [("model.norm.weight", (h,)), ("lm_head.weight", (v, h))]
    return out


def numel(shape):
    n = 1
    for d in shape:
        n *= d
    return n


def bf16_chunk(rng, n, norm):
    if norm:  # 1 + small noise: exponent 127, random low mantissa bits
        return (0x3F80 | (rng.integers(0, 8, n, dtype=np.uint16))).astype("<u2")
    sign = rng.integers(0, 2, n, dtype=np.uint16) << 15
    exp = rng.integers(118, 125, n, dtype=np.uint16) << 7  # 2^-9 .. 2^-3
    mant = rng.integers(0, 128, n, dtype=np.uint16)
    return (sign | exp | mant).astype("<u2")


def write_shard(path, items, rng):
    header, off = {"__metadata__": {"format": "pt"}}, 0
    for name, shape in items:
        nbytes = 2 * numel(shape)
        header[name] = {"dtype": "BF16", "shape": list(shape), "data_offsets": [off, off + nbytes]}
        off += nbytes
    h = json.dumps(header, separators=(",", ":")).encode()
    h += b" " * (-len(h) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(h)) + h)
        for name, shape in items:
            left = numel(shape)
            while left:
                n = min(left, CHUNK)
                f.write(bf16_chunk(rng, n, name.endswith("norm.weight")).tobytes())
                left -= n
    return off


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("out")
    ap.add_argument("--layers", type=int, default=20)
    ap.add_argument("--hidden", type=int, default=2048)
    ap.add_argument("--intermediate", type=int, default=8192)
    ap.add_argument("--heads", type=int, default=32)
    ap.add_argument("--kv-heads", type=int, default=8)
    ap.add_argument("--vocab", type=int, default=128256)
    ap.add_argument("--shard-gb", type=float, default=2.0)
    ap.add_argument("--seed", type=int, default=0)
    a = ap.parse_args()
    os.makedirs(a.out, exist_ok=True)
    ts = tensors(a)
    shards, cur, size = [], [], 0
    for name, shape in ts:  # fill a shard up to --shard-gb, in model order (as transformers does)
        b = 2 * numel(shape)
        if cur and size + b > a.shard_gb * 1e9:
            shards.append(cur)
            cur, size = [], 0
        cur.append((name, shape))
        size += b
    shards.append(cur)
    rng = np.random.default_rng(a.seed)
    weight_map, total = {}, 0
    for k, items in enumerate(shards):
        fname = f"model-{k + 1:05d}-of-{len(shards):05d}.safetensors"
        total += write_shard(os.path.join(a.out, fname), sorted(items), rng)
        weight_map.update({name: fname for name, _ in items})
        print(f"{fname}: {len(items)} tensors", flush=True)
    with open(os.path.join(a.out, "model.safetensors.index.json"), "w") as f:
        json.dump({"metadata": {"total_size": total}, "weight_map": dict(sorted(weight_map.items()))}, f, indent=2)
    config = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": a.hidden,
              "intermediate_size": a.intermediate, "num_hidden_layers": a.layers, "num_attention_heads": a.heads,
              "num_key_value_heads": a.kv_heads, "vocab_size": a.vocab, "rms_norm_eps": 1e-5,
              "tie_word_embeddings": False, "torch_dtype": "bfloat16"}
    with open(os.path.join(a.out, "config.json"), "w") as f:
        json.dump(config, f, indent=2)
    params = sum(numel(s) for _, s in ts)
    print(f"{a.out}: {params / 1e9:.3f} G parameters, {total / 1e9:.3f} GB in {len(shards)} shards")


if __name__ == "__main__":
    main()
