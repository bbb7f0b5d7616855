"""Tests of the integer formats (int4 with zero points, int4_sym, int8) in
Python: the packed layout, nibble.torch (quantize, pack, unpack, the
nibble::gemm op, Linear, quantize_model) and loading AWQ, GPTQ and
compressed-tensors int4 / int8 checkpoints (load_quantized,
nibble.transformers).

Without a GPU: pack / unpack round trips, the packed bytes against the
layout of docs/formats.md sections 8.7 (int4, int4_sym) and 8.9 (int8)
written out here in numpy, argument refusals, the op's fake
implementation, and load_quantized(dequantize=True) of small checkpoints
written by the test (every layer exactly the values AWQ's / GPTQ's /
compressed-tensors' own dequantization gives, in the model's column
order).  On a GPU (skipped without one): the op against float64 with the
bound of test_torch.py, Linear, quantize_model, a loaded checkpoint
against its dequantized twin, and the BF16 zero-point limit.
"""

import numpy as np
import pytest

torch = pytest.importorskip("torch")

import nibble  # noqa: E402
import nibble.torch as nt  # noqa: E402
from test_load import HAS_IO, HAS_TF, gpu, hf, io  # noqa: E402,F401  (the same skip rules)
from test_torch import EPS, _check_close, _x, check_gemm_against_float64  # noqa: E402

# (format, group or "k" for one group per row, scale type)
CASES = [("int4", 32, "f16"), ("int4", 64, "bf16"), ("int4", 128, "f16"), ("int4", "k", "bf16"),
         ("int4_sym", 32, "bf16"), ("int4_sym", 128, "f16"), ("int4_sym", "k", "f16"),
         ("int8", 32, "f16"), ("int8", 64, "bf16"), ("int8", 128, "bf16"), ("int8", "k", "f16"),
         ("int4_hqq", 32, "bf16"), ("int4_hqq", 64, "f16"), ("int4_hqq", 128, "bf16"), ("int4_hqq", "k", "f16")]
DTYPES = [torch.bfloat16, torch.float16]


def _w(n, k, seed=0):
    return (np.random.default_rng(seed).standard_normal((n, k)) * 0.05).astype(np.float32)


def _quant(fmt, group, st, n=48, k=384, seed=0):
    return nibble.quantize(_w(n, k, seed), fmt, group_size=k if group == "k" else group, scale_type=st)


# ------------------------------------------- the packed layout, in numpy

P = [0, 4, 1, 5, 2, 6, 3, 7]   # nibble position of element e in a word (formats.md 8.2)
B8 = [0, 2, 1, 3]              # int8: byte of element e % 4 in a word (formats.md 8.9)


def np_pack_int(qw):
    """docs/formats.md sections 8.7 and 8.9 written out: 16 x 128 chunks,
    row-block major.  4 bits: lane L = 4g + t holds rows g and g + 8, word G
    the k = 32G + 8t + e.  int8 (2048 code bytes a chunk): row half h and
    piece P of lane L own the 16 bytes at 1024h + 512P + 16L, whose word w
    holds the k = 32G + 8t + e of sub-range G = 2P + w % 2, e = 4 (w // 2)
    .. + 3.  Then the scales, then the zero points (int4: a byte each;
    int4_hqq: two, the scales' type).  n a multiple of 16 and k of 128 here
    (no padding)."""
    n, k = qw.n, qw.k
    g = qw.group_size
    kg = g if g in (32, 64, 128) else 128
    gpc = 128 // kg
    zb = 0 if qw.zeros is None else qw.zeros.dtype.itemsize             # bytes per zero point: 0, 1 or 2
    zbytes = None if qw.zeros is None else qw.zeros.view(np.uint8).reshape(n, -1, zb)
    i8 = qw.format == "int8"
    cbytes = 2048 if i8 else 1024                                        # code bytes of a chunk
    cb = cbytes + 16 * gpc * (2 + zb)
    KC = k // 128
    out = np.zeros((n // 16) * KC * cb, np.uint8)
    q = qw.codes if i8 else np.stack([qw.codes & 15, qw.codes >> 4], -1).reshape(n, k)   # element k of row r
    sbytes = qw.scales.view(np.uint8).reshape(n, -1, 2)
    for rb in range(n // 16):
        for kc in range(KC):
            base = (rb * KC + kc) * cb
            for r in range(16):
                row = rb * 16 + r
                gl, h = r % 8, r // 8
                for t in range(4):
                    for G in range(4):
                        if i8:
                            for e in range(8):
                                at = base + 1024 * h + 512 * (G // 2) + 16 * (4 * gl + t) + 4 * (2 * (e // 4) + G % 2)
                                out[at + B8[e % 4]] = q[row, 128 * kc + 32 * G + 8 * t + e]
                            continue
                        word = 0
                        for e in range(8):
                            word |= int(q[row, 128 * kc + 32 * G + 8 * t + e]) << (4 * P[e])
                        at = base + 512 * h + 16 * (4 * gl + t) + 4 * G
                        out[at:at + 4] = np.frombuffer(word.to_bytes(4, "little"), np.uint8)
                for j in range(gpc):
                    grp = (128 * kc + kg * j) // g                   # the checkpoint group holding that k
                    idx = h * gpc + j
                    at = base + cbytes + 4 * gpc * gl + 2 * idx
                    out[at:at + 2] = sbytes[row, grp]
                    if zb:
                        at = base + cbytes + 32 * gpc + 2 * zb * gpc * gl + zb * idx
                        out[at:at + zb] = zbytes[row, grp]
    return out


@pytest.mark.parametrize("fmt,group,st", CASES)
def test_pack_matches_the_documented_layout_and_round_trips(fmt, group, st):
    qw = _quant(fmt, group, st)
    pw = nibble.pack(qw)
    assert pw.data.size == nibble.weight_sizes(qw.n, qw.k, fmt, qw.group_size, st)["packed_bytes"]
    np.testing.assert_array_equal(pw.data, np_pack_int(qw))
    if fmt == "int4":   # the zero-point range, as nb_pack_host_v2 records it
        assert (pw.scale_exp_min, pw.scale_exp_max) == (int(qw.zeros.min()), int(qw.zeros.max()))
    back = nibble.unpack(pw)
    assert (back.format, back.group_size, back.scale_type) == (fmt, qw.group_size, st)
    np.testing.assert_array_equal(back.codes, qw.codes)
    np.testing.assert_array_equal(back.scales, qw.scales)
    assert back.scales.dtype == qw.scales.dtype
    if fmt in ("int4", "int4_hqq"):
        assert back.zeros.dtype == qw.zeros.dtype == (np.uint8 if fmt == "int4" else qw.scales.dtype)
        np.testing.assert_array_equal(back.zeros.view(np.uint8), qw.zeros.view(np.uint8))
    else:
        assert back.zeros is None
    # nibble.torch on the host: the same bytes, and back
    lin = nt.Linear.from_quantized(qw, device="cpu")
    np.testing.assert_array_equal(lin.packed.numpy(), pw.data)
    again = lin.to(torch.bfloat16).quantized_weight()
    np.testing.assert_array_equal(again.codes, qw.codes)
    np.testing.assert_array_equal(again.scales, qw.scales)
    if fmt in ("int4", "int4_hqq"):
        np.testing.assert_array_equal(again.zeros.view(np.uint8), qw.zeros.view(np.uint8))
    # the host dequantization nibble.torch uses for these formats
    want = nibble.from_bf16(nibble.dequantize(qw, "bfloat16"))
    np.testing.assert_array_equal(nt.dequantize_weight(qw, torch.bfloat16).float().numpy(), want)


def test_packed_weight_keeps_group_and_scale_type():
    qw = _quant("int4", 64, "bf16")
    pw = nibble.pack(qw)
    assert (pw.group, pw.scale_type, pw.group_size) == (64, "bf16", 64)
    with pytest.raises(nibble.Error, match="group"):
        nibble.unpack(nibble.PackedWeight(pw.data, pw.n, pw.k, "int4", 1.0, 0, 15, group=48))


# ------------------------------------------------- refusals, fake shapes

def test_argument_refusals():
    w = torch.from_numpy(_w(16, 256))
    with pytest.raises(nibble.Error, match="32, 64, 128"):
        nt.quantize(w, format="int4", group_size=16, device=0)         # (the host quantizer refuses it first)
    with pytest.raises(nibble.Error, match="scale type"):
        nt.quantize(w, format="int4_sym", scale_type="f32", device=0)
    with pytest.raises(nibble.Error, match="32, 64, 128"):
        nt.quantize(w, format="int8", group_size=16, device=0)
    with pytest.raises(nibble.Error, match="scale type"):
        nt.quantize(w, format="int8", scale_type="e8m0", device=0)
    pw8 = nt.pack(nibble.quantize(w.numpy(), "int8"), "cpu")           # int8 has GPU kernels: packed, not refused
    assert pw8.format == "int8" and pw8.packed.numel() == nibble.weight_sizes(16, 256, "int8")["packed_bytes"]
    model = torch.nn.Sequential(torch.nn.Linear(256, 16))
    with pytest.raises(ValueError, match="group_size"):
        nt.quantize_model(model, format="int4", group_size=48)
    with pytest.raises(ValueError, match="scale types"):
        nt.quantize_model(model, format="int4", scale_type="e4m3")
    with pytest.raises(ValueError, match="nvfp4 and mxfp4 only"):
        nt.quantize_model(model, format="int4", method="mse")
    assert isinstance(model[0], torch.nn.Linear)                       # nothing was replaced
    qw = _quant("int4", 128, "f16", n=16, k=256)
    pw = nt.pack(qw, "cpu")
    with pytest.raises(ValueError, match="permutation"):
        nt.Linear(pw, perm=torch.zeros(256, dtype=torch.int64))
    with pytest.raises(ValueError, match="length k"):
        nt.Linear(pw, perm=torch.arange(255))
    if HAS_TF:
        experts = _qwen3_experts()
        for fmt in ("int4", "int8"):   # the MoE kernels serve nvfp4 and mxfp4 only
            with pytest.raises(ValueError, match=f"no MoE kernel serves {fmt}"):
                nt.MoeExperts.from_module(experts, format=fmt)
            moe_model = torch.nn.ModuleDict({"experts": experts})
            rep = nt.quantize_model(moe_model, format=fmt, exclude=[])
            assert f"no MoE kernel serves {fmt}" in rep["skipped"]["experts"] and moe_model["experts"] is experts


def _qwen3_experts():
    from transformers import Qwen3MoeConfig
    from transformers.models.qwen3_moe.modeling_qwen3_moe import Qwen3MoeExperts
    return Qwen3MoeExperts(Qwen3MoeConfig(hidden_size=64, moe_intermediate_size=32, num_experts=2))


@pytest.mark.parametrize("fmt,group,st", CASES)
def test_fake_shapes_and_op_args(fmt, group, st):
    qw = _quant(fmt, group, st, n=16, k=256)
    pw = nt.pack(qw, "cpu")
    args = pw.op_args()
    assert args[6:] == (qw.group_size, int(nibble.ScaleType[st.upper()]))
    meta = dict(dtype=torch.uint8, device="meta")
    for shape in [(1, 256), (7, 256), (2, 3, 256), (0, 256)]:
        x = torch.empty(shape, dtype=torch.bfloat16, device="meta")
        y = torch.ops.nibble.gemm(x, torch.empty(pw.packed.numel(), **meta), torch.empty(0, **meta), None, *args)
        assert y.shape == (*shape[:-1], 16) and y.dtype == torch.bfloat16


def test_op_argument_checks():
    x = torch.empty(2, 256, dtype=torch.float16, device="meta")
    u8 = torch.empty(8, dtype=torch.uint8, device="meta")
    I4 = int(nibble.Format.INT4)

    def op(x, k=256, group=0, st=0, fmt=I4):
        return torch.ops.nibble.gemm(x, u8, u8, None, 16, k, fmt, 1.0, 0, 15, group, st)
    assert op(x, group=256).shape == (2, 16)                          # one group per row
    with pytest.raises(ValueError, match="groups of 32, 64, 128 or k"):
        op(x, group=16)
    with pytest.raises(ValueError, match="not group_size = 512"):
        op(x, group=512)
    with pytest.raises(ValueError, match="multiple of 64"):
        op(torch.empty(2, 96, dtype=torch.float16, device="meta"), k=96, group=64)
    with pytest.raises(ValueError, match="multiple of 8"):             # per channel, k not a multiple of 8
        op(torch.empty(2, 100, dtype=torch.float16, device="meta"), k=100, group=100)
    with pytest.raises(ValueError, match="scale types f16, bf16"):
        op(x, st=int(nibble.ScaleType.E4M3))
    with pytest.raises(ValueError, match="takes groups of 16"):
        op(x, group=32, fmt=int(nibble.Format.NVFP4))
    I8 = int(nibble.Format.INT8)
    assert op(x, group=64, st=int(nibble.ScaleType.BF16), fmt=I8).shape == (2, 16)
    with pytest.raises(ValueError, match="int8 takes groups of 32, 64, 128 or k"):
        op(x, group=16, fmt=I8)
    with pytest.raises(ValueError, match="int8 takes scale types f16, bf16"):
        op(x, st=int(nibble.ScaleType.F32), fmt=I8)
    with pytest.raises(ValueError, match="int8 with k = 100"):           # per channel, k not a multiple of 8
        op(torch.empty(2, 100, dtype=torch.float16, device="meta"), k=100, group=100, fmt=I8)
    with pytest.raises(nibble.Error, match="packed"):                  # the real implementation on the CPU
        torch.ops.nibble.gemm(torch.zeros(2, 256, dtype=torch.float16), torch.zeros(8, dtype=torch.uint8),
                              torch.zeros(8, dtype=torch.uint8), None, 16, 256, I4, 1.0, 0, 15, 0, 0)


# ------------------------------------------------ int4 checkpoints (CPU)

AWQ_ORDER = [0, 2, 4, 6, 1, 3, 5, 7]   # AutoAWQ: physical nibble i holds logical column AWQ_ORDER[i]


def _words(values, axis, bits=4):
    """32 / bits values of `bits` bits along `axis` (its length a multiple of
    that) into one int32 word, value i at bits `bits` * i."""
    per = 32 // bits
    v = np.moveaxis(values.astype(np.uint32), axis, -1)
    v = v.reshape(*v.shape[:-1], -1, per)
    w = np.zeros(v.shape[:-1], np.uint32)
    for i in range(per):
        w |= v[..., i] << (bits * i)
    return np.moveaxis(w, -1, axis).view(np.int32)


# layout -> the nibble format its layers are read as
FORMAT_OF = {"awq": "int4", "gptq": "int4", "gptq-act": "int4", "ct": "int4", "ct-sym": "int4_sym", "ct-int8": "int8",
             "gptq-int8": "int8", "gptq-int8-act": "int8"}


def int4_layer(w, layout, g, rng):
    """One n x k float weight written as `layout` ("awq", "gptq" v1,
    "gptq-act" v1 with act-order, "ct" asymmetric, "ct-sym", "ct-int8"
    symmetric 8-bit, "gptq-int8" and "gptq-int8-act" symmetric 8-bit GPTQ
    v1): (tensors {suffix: (dtype, array)}, the dequantized
    weight in the model's column order as that layout's own reader computes
    it, float32)."""
    n, k = w.shape
    perm = np.arange(k)
    if layout.endswith("-act"):
        perm = rng.permutation(k)                # column perm[j] is quantized in group j / g
    fmt = FORMAT_OF[layout]
    sym, bits = fmt != "int4", 8 if fmt == "int8" else 4
    st = "bf16" if layout.startswith("ct") else "f16"
    qw = nibble.quantize(w[:, perm], fmt, group_size=g, scale_type=st)
    codes = qw.codes if bits == 8 else np.stack([qw.codes & 15, qw.codes >> 4], -1).reshape(n, k)
    q = np.empty_like(codes)
    q[:, perm] = codes                           # the codes in the model's column order
    gidx = np.empty(k, np.int32)
    gidx[perm] = np.arange(k) // g
    s = nibble.from_bf16(qw.scales) if st == "bf16" else qw.scales.astype(np.float32)
    if bits == 8:
        qv = q.view(np.int8).astype(np.int64)   # two's complement bytes
    else:
        qv = np.where(q >= 8, q.astype(np.int64) - 16, q) if sym else q.astype(np.int64)
    z = 0 if sym else qw.zeros[:, gidx].astype(np.int64)
    dense = ((qv - z) * s[:, gidx].astype(np.float64)).astype(np.float32)
    sdt, sarr = ("BF16", qw.scales) if st == "bf16" else ("F16", qw.scales)
    if layout == "awq":
        phys = np.argsort(AWQ_ORDER)             # physical nibble of logical column j
        qt = q.T.reshape(k, n // 8, 8)[:, :, np.argsort(phys)]
        zt = qw.zeros.T.reshape(-1, n // 8, 8)[:, :, np.argsort(phys)]
        return {"qweight": ("I32", _words(qt.reshape(k, n), 1)), "qzeros": ("I32", _words(zt.reshape(-1, n), 1)),
                "scales": (sdt, np.ascontiguousarray(sarr.T))}, dense
    if layout.startswith("gptq") and bits == 8:   # unsigned codes q + 128, every zero point 128 (v1 stores 127)
        zeros = np.full((k // g, n), 127, np.uint32)
        return {"qweight": ("I32", _words((qv + 128).T, 0, 8)), "qzeros": ("I32", _words(zeros, 1, 8)),
                "scales": (sdt, np.ascontiguousarray(sarr.T)), "g_idx": ("I32", gidx)}, dense
    if layout.startswith("gptq"):
        stored = (qw.zeros.astype(np.int64) - 1) & 15            # GPTQ v1 stores z - 1
        return {"qweight": ("I32", _words(q.T, 0)), "qzeros": ("I32", _words(stored.T, 1)),
                "scales": (sdt, np.ascontiguousarray(sarr.T)), "g_idx": ("I32", gidx)}, dense
    stored_q = (qv + 2 ** (bits - 1)) if sym else q   # compressed-tensors: offset by 8 or 128 (asymmetric: as is)
    t = {"weight_packed": ("I32", _words(stored_q, 1, bits)), "weight_scale": (sdt, sarr),
         "weight_shape": ("I64", np.array([n, k], np.int64))}
    if not sym:
        t["weight_zero_point"] = ("I32", _words(qw.zeros.T, 1).T.copy())     # packed along n
    return t, dense


def _qconfig(layout, g):
    if layout == "awq":
        return {"quant_method": "awq", "bits": 4, "group_size": g, "zero_point": True, "version": "gemm"}
    if layout.startswith("gptq"):
        int8 = layout.startswith("gptq-int8")
        return {"quant_method": "gptq", "bits": 8 if int8 else 4, "group_size": g, "desc_act": layout.endswith("-act"),
                "sym": int8}
    w = {"num_bits": 8 if layout == "ct-int8" else 4, "type": "int", "symmetric": layout != "ct", "strategy": "group",
         "group_size": g}
    return {"quant_method": "compressed-tensors", "format": "pack-quantized",
            "config_groups": {"group_0": {"targets": ["Linear"], "weights": w}}, "ignore": ["lm_head"]}


def write_int4_checkpoint(ref, d, layout, g=32, seed=0):
    """ref's state_dict with every linear layer of its decoder in `layout`
    (config.json with that layout's quantization_config); returns {prefix:
    dense float32 weight}."""
    from test_load import write_quantized_checkpoint
    return write_quantized_checkpoint(ref, d, lambda w, rng: int4_layer(w, layout, g, rng), _qconfig(layout, g),
                                      seed)


LAYOUTS = {"awq": "awq-int4", "gptq": "gptq-int4", "gptq-act": "gptq-int4", "ct": "ct-int4", "ct-sym": "ct-int4-sym",
           "ct-int8": "ct-int8", "gptq-int8": "gptq-int8", "gptq-int8-act": "gptq-int8"}


@pytest.fixture(scope="module")
def int4_ckpts(tmp_path_factory):
    from test_load import checkpoint_set
    return checkpoint_set(tmp_path_factory, "int4", write_int4_checkpoint, LAYOUTS)


@io
@hf
@pytest.mark.parametrize("layout", list(LAYOUTS))
def test_load_dequantized_int4_is_exact(int4_ckpts, layout):
    """load_quantized(dequantize=True) gives every layer exactly the
    producer's dequantization, rounded once to BF16, in the model's column
    order (act-order included); the checkpoint's bytes pack and unpack
    unchanged."""
    from test_load import bf16_bits, meta_model
    path, dense = int4_ckpts[layout]
    model = meta_model()
    rep = nt.load_quantized(model, path, dequantize=True, dtype=torch.bfloat16)
    assert set(rep["quantized"]) == set(dense) and not rep["missing"] and not rep["unexpected"]
    assert set(rep["quantized"].values()) == {LAYOUTS[layout]}
    for prefix, want in dense.items():
        np.testing.assert_array_equal(bf16_bits(model.get_submodule(prefix).weight), nibble.to_bf16(want),
                                      err_msg=prefix)
    with nibble.open_checkpoint(path) as ck:
        L = ck.layer("model.layers.0.mlp.down_proj")
        assert L.k_permuted == layout.endswith("-act")
        qw = ck.quantized_weight(L)
        assert ck.weight_layout(L) == {"format": FORMAT_OF[layout], "n": L.n, "k": L.k,
                                       "group": 32, "scale_type": "bf16" if layout.startswith("ct") else None}
        back = nibble.unpack(nibble.pack(qw))
        np.testing.assert_array_equal(back.codes, qw.codes)
        np.testing.assert_array_equal(back.scales, qw.scales)


@io
@hf
@pytest.mark.parametrize("layout", ["gptq-act", "ct-int8", "gptq-int8-act"])
def test_transformers_int4_on_the_cpu(int4_ckpts, tmp_path, layout):
    """from_pretrained(quantization_config=NibbleConfig()) of a GPTQ
    act-order (4- and 8-bit) and a compressed-tensors int8 checkpoint:
    nibble.torch.Linear layers packed on the host (with the activation
    permutation where the layer has one), the dequantized twin exact, and
    save_pretrained writing compressed-tensors int4 / int8
    (test_int4_save.py checks what it writes)."""
    from transformers import AutoModelForCausalLM
    from nibble.transformers import NibbleConfig
    from test_load import bf16_bits
    path, dense = int4_ckpts[layout]
    fmt = FORMAT_OF[layout]
    m = AutoModelForCausalLM.from_pretrained(path, quantization_config=NibbleConfig(), dtype=torch.bfloat16)
    layers = {name: mod for name, mod in m.named_modules() if isinstance(mod, nt.Linear)}
    assert set(layers) == set(dense) and all(mod.format == fmt and mod.group == 32 for mod in layers.values())
    with nibble.open_checkpoint(path) as ck:
        for prefix, mod in layers.items():
            assert mod.packed.device.type == "cpu" and (mod.perm is not None) == layout.endswith("-act")
            if mod.perm is not None:
                assert torch.equal(mod.perm, torch.from_numpy(ck.perm(prefix).astype(np.int64)))
            np.testing.assert_array_equal(mod.packed.numpy(), nibble.pack(ck.quantized_weight(prefix)).data)
    m.save_pretrained(str(tmp_path / "out"))
    with nibble.open_checkpoint(str(tmp_path / "out")) as ck:
        assert {L.format for L in ck.layers if L.quant_format} == {"ct-int8" if fmt == "int8" else "ct-int4"}
    ref = AutoModelForCausalLM.from_pretrained(path, quantization_config=NibbleConfig(dequantize=True),
                                               dtype=torch.bfloat16)
    for prefix, want in dense.items():
        np.testing.assert_array_equal(bf16_bits(ref.get_submodule(prefix).weight), nibble.to_bf16(want))


# ----------------------------------------------------------- GPU tests

@gpu
@pytest.mark.parametrize("fmt,group,st", CASES)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("m", [1, 7, 32, 33])
def test_gemm_int4_against_float64(fmt, group, st, dtype, m):
    qw = _quant(fmt, group, st, n=136, k=384, seed=m)   # n past a 16-row block; per channel: k not a multiple of 128
    check_gemm_against_float64(qw, dtype, m, f"{fmt} g={group} {st} {dtype} m={m} vs float64")


@gpu
@pytest.mark.parametrize("fmt", ["int4", "int4_sym", "int8", "int4_hqq"])
def test_device_pack_and_quantize_equal_host(fmt):
    w = torch.from_numpy(_w(136, 384, seed=5)).to(torch.bfloat16)
    pw = nt.quantize(w.cuda(), format=fmt, group_size=64, scale_type="bf16")   # host quantizer, nb_pack_v2
    host = nibble.pack(nibble.quantize(nt._host_array(w), fmt, group_size=64, scale_type="bf16"))
    assert pw.packed.is_cuda and np.array_equal(pw.packed.cpu().numpy(), host.data)
    assert (pw.scale_exp_min, pw.scale_exp_max, pw.group, pw.scale_type) == \
        (host.scale_exp_min, host.scale_exp_max, 64, "bf16")
    qw = nt.unpack(pw)
    assert torch.equal(nt.dequantize_weight(qw, torch.bfloat16, "cuda").cpu(), nt.dequantize_weight(qw))


@gpu
@pytest.mark.parametrize("fmt", ["int4", "int8"])
def test_opcheck_int4(fmt):
    """torch.library.opcheck with the integer formats' trailing arguments
    (group_size, scale_type): schema, fake against real, dynamic shapes."""
    pw = nt.pack(_quant(fmt, 64, "bf16", n=32, k=256))
    x = _x((2, 3, 256), torch.bfloat16).cuda()
    torch.library.opcheck(torch.ops.nibble.gemm.default, (x, pw.packed, pw.workspace, None, *pw.op_args()),
                          test_utils=("test_schema", "test_faketensor", "test_aot_dispatch_dynamic"))


@gpu
def test_zero_points_above_127_need_fp16():
    """BF16 activations take zero points up to 127 (docs/formats.md 8.7):
    a weight with larger ones is refused with the reason; FP16 runs it."""
    qw = _quant("int4", 128, "f16", n=32, k=256)
    qw.zeros[3, 1] = 200
    pw = nt.pack(qw)
    assert pw.scale_exp_max == 200
    x = _x((2, 256), torch.bfloat16).cuda()
    with pytest.raises(nibble.Error) as e:
        nt.gemm(x, pw)
    assert e.value.status == nibble.Status.ERR_UNSUPPORTED and "zero points up to 200" in e.value.message
    xh = x.half()
    y = nt.gemm(xh, pw).float().cpu().numpy()
    xs = xh.float().cpu().numpy()
    _check_close(y, nibble.gemm_reference(xs, qw, out_dtype=np.float64), xs, nibble.dequantize(qw),
                 EPS[torch.float16], "zero point 200, fp16")


class _Mlp(torch.nn.Module):
    def __init__(self, k=256, h=384, n=136):
        super().__init__()
        self.up = torch.nn.Linear(k, h)
        self.down = torch.nn.Linear(h, n, bias=False)

    def forward(self, x):
        return self.down(torch.nn.functional.gelu(self.up(x)))


@gpu
@pytest.mark.parametrize("fmt", ["int4", "int4_sym", "int8", "int4_hqq"])
def test_linear_and_quantize_model_int4(fmt):
    torch.manual_seed(0)
    model = _Mlp().to(torch.bfloat16).cuda()
    x = _x((3, 256), torch.bfloat16).cuda()
    ref = model(x).float()
    lin = nt.Linear.from_linear(model.up, format=fmt, group_size=64)
    assert lin.group == 64 and torch.equal(lin(x), nt.gemm(x, lin.weight, model.up.bias))
    report = nt.quantize_model(model, format=fmt, group_size=32, exclude=[], return_weights=True)
    assert report["quantized"] == ["up", "down"] and isinstance(model.down, nt.Linear)
    for name in ("up", "down"):
        mod, qw = model.get_submodule(name), report["weights"][name]
        assert mod.format == fmt and mod.group == 32
        assert np.array_equal(mod.packed.cpu().numpy(), nibble.pack(qw).data)
    rel = ((model(x).float() - ref).norm() / ref.norm()).item()
    assert rel < (0.02 if fmt == "int8" else 0.2), f"{fmt} model output too far from the BF16 model ({rel:.3f})"


@io
@hf
@gpu
@pytest.mark.parametrize("layout", ["awq", "gptq-act", "ct-sym", "ct-int8", "gptq-int8-act"])
def test_load_int4_gpu_generation_equals_dequantized(int4_ckpts, layout):
    from test_load import assert_load_agrees_with_dequantized
    path, dense = int4_ckpts[layout]
    assert_load_agrees_with_dequantized(path, len(dense))


@hf
@gpu
@pytest.mark.parametrize("layout", ["awq", "ct-int8"])
def test_transformers_awq_from_pretrained_gpu(int4_ckpts, layout):
    pytest.importorskip("accelerate", reason="device_map needs accelerate")
    from transformers import AutoModelForCausalLM
    from nibble.transformers import NibbleConfig
    from test_load import assert_generation_agrees
    path, dense = int4_ckpts[layout]
    m = AutoModelForCausalLM.from_pretrained(path, device_map="cuda", quantization_config=NibbleConfig())
    layers = [mod for mod in m.modules() if isinstance(mod, nt.Linear)]
    assert len(layers) == len(dense) and all(mod.format == FORMAT_OF[layout] and mod.packed.is_cuda for mod in layers)
    ref = AutoModelForCausalLM.from_pretrained(path, device_map="cuda",
                                               quantization_config=NibbleConfig(dequantize=True))
    assert_generation_agrees(m, ref)
