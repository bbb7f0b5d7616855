"""Writing int4 / int4_sym / int8 checkpoints (compressed-tensors
pack-quantized, docs/formats.md 5.4), on the CPU:

  * nibble.quantize_checkpoint(format="int4" | "int4_sym" | "int8",
    group_size, scale_type) (nb_ckpt_quantize): every layer read back by
    nibble's reader as ct-int4 / ct-int4-sym / ct-int8 with exactly
    nibble.quantize's codes, scales and zero points, its tensors packed as
    formats.md 5.4 says (checked here in numpy); its config.json
    quantization_config is the one nibble.transformers writes; refusals;
  * save_pretrained of a model quantized at load with NibbleConfig(format=
    "int4" | "int4_sym" | "int8") (the same host quantizer as
    quantize_model; int8 with num_bits 8): the
    tensors are packed as formats.md 5.4 says (checked here in numpy), the
    reader returns quantize_model's bytes, from_pretrained(NibbleConfig())
    packs the same bytes again, load_quantized(dequantize=True) gives the
    dequantized weights bit for bit;
  * an act-order GPTQ checkpoint loaded and saved again keeps its
    permutation (weight_g_idx) and its bytes.
"""
import json
import os

import numpy as np
import pytest
import torch

import nibble
import nibble.torch as nt
from test_load import HAS_IO, HAS_TF, bf16_bits, io, hf, meta_model, reference_model, write_model

pytestmark = [io, hf]

INT_LAYOUT = {"int4": "ct-int4", "int4_sym": "ct-int4-sym", "int8": "ct-int8"}


def _bf16_to_f32(t):
    return t.detach().float().numpy()


def _words_along(values, axis, bits=4):
    """32 / bits values of `bits` bits along `axis` (padded with zeros to a
    multiple of that) into one little-endian int32 word, value i at bits
    `bits` * i."""
    per = 32 // bits
    v = np.moveaxis(np.asarray(values, np.uint32), axis, -1)
    pad = (-v.shape[-1]) % per
    v = np.concatenate([v, np.zeros(v.shape[:-1] + (pad,), np.uint32)], -1).reshape(*v.shape[:-1], -1, per)
    w = np.zeros(v.shape[:-1], np.uint32)
    for i in range(per):
        w |= v[..., i] << np.uint32(bits * i)
    return np.moveaxis(w, -1, axis).view(np.int32)


def _nibbles(codes, k):
    return np.stack([codes & 15, codes >> 4], -1).reshape(codes.shape[0], k)


def expected_tensors(qw):
    """formats.md 5.4 written out in numpy from a QuantizedWeight."""
    bits = 8 if qw.format == "int8" else 4
    if bits == 8:
        q = qw.codes.view(np.int8).astype(np.int64) + 128   # the signed code plus 128
    else:
        q = _nibbles(qw.codes, qw.k).astype(np.int64)
    if qw.format == "int4_sym":
        q = np.where(q >= 8, q - 16, q) + 8                 # the signed code plus 8
    out = {"weight_packed": _words_along(q, 1, bits), "weight_shape": np.array([qw.n, qw.k], np.int64)}
    if qw.format == "int4":
        out["weight_zero_point"] = _words_along(qw.zeros, 0)   # packed along n
    return out


def assert_written(qw, ref, raw, prefix):
    """Layer `prefix` as the reader returns it (qw) holds the quantizer's
    bytes (ref), and its stored tensors (raw) are formats.md 5.4's."""
    np.testing.assert_array_equal(qw.codes, ref.codes, err_msg=prefix)
    np.testing.assert_array_equal(qw.scales, ref.scales, err_msg=prefix)
    if ref.format == "int4":
        np.testing.assert_array_equal(qw.zeros, ref.zeros, err_msg=prefix)
    for suffix, arr in expected_tensors(ref).items():
        np.testing.assert_array_equal(raw[f"{prefix}.{suffix}"], arr, err_msg=f"{prefix}.{suffix}")
    assert f"{prefix}.weight" not in raw


def raw_tensors(path):
    """Every tensor of a checkpoint as stored (BF16 as uint16 bits), read
    with nibble's reader."""
    with nibble.open_checkpoint(path) as ck:
        return {t.name: ck.tensor(t.name) for t in ck.tensors}


@pytest.fixture(scope="module")
def bf16(tmp_path_factory):
    ref = reference_model()
    d = str(tmp_path_factory.mktemp("bf16"))
    write_model(ref, d)
    return {"path": d, "ref": ref}


# --------------------------------------------------- quantize_checkpoint

@pytest.mark.parametrize("fmt,group,st", [("int4", 32, "bf16"), ("int4", None, None), ("int4_sym", 64, "f16"),
                                          ("int4_sym", "channel", "bf16"), ("int8", None, None), ("int8", 32, "bf16"),
                                          ("int8", 64, "f16"), ("int8", 128, "bf16"), ("int8", "channel", "f16")])
def test_quantize_checkpoint_int(bf16, tmp_path, fmt, group, st):
    out = str(tmp_path / "q")
    s = nibble.quantize_checkpoint(bf16["path"], out, format=fmt, group_size=group, scale_type=st, device="auto")
    assert s["device"] == "cpu"
    g = 128 if group is None else group
    want = {}
    for name, t in bf16["ref"].state_dict().items():
        if name.endswith(".weight") and t.dim() == 2 and "embed" not in name and "lm_head" not in name:
            k = t.shape[1]
            if g == "channel" or k % g == 0:
                want[name[:-len(".weight")]] = (t, k if g == "channel" else g)
    assert s["layers_quantized"] == len(want) > 0
    raw = raw_tensors(out)
    with nibble.open_checkpoint(out) as ck:
        assert ck.config["declared"] == INT_LAYOUT[fmt]
        assert {L.prefix for L in ck.layers if L.quant_format} == set(want)
        for prefix, (t, gg) in want.items():
            L = ck.layer(prefix)
            assert L.format == INT_LAYOUT[fmt] and not L.config_mismatch and not L.k_permuted
            ref = nibble.quantize(_bf16_to_f32(t), fmt, group_size=gg, scale_type=st)
            assert_written(ck.quantized_weight(L), ref, raw, prefix)
    with open(os.path.join(out, "config.json")) as f:
        qc = json.load(f)["quantization_config"]
    from nibble.transformers import _layout_config
    assert qc == _layout_config(fmt, None, qc["ignore"], g)     # the C writer and the Python one agree
    assert all(p not in qc["ignore"] for p in want)


def test_quantize_checkpoint_int_refusals(bf16, tmp_path):
    out = str(tmp_path / "r")
    with pytest.raises(ValueError, match="group_size applies to int4"):
        nibble.quantize_checkpoint(bf16["path"], out, format="nvfp4", group_size=32)
    with pytest.raises(ValueError, match="group_size 48"):
        nibble.quantize_checkpoint(bf16["path"], out, format="int4", group_size=48)
    with pytest.raises(ValueError, match="group_size True"):
        nibble.quantize_checkpoint(bf16["path"], out, format="int4", group_size=True)
    with pytest.raises(ValueError, match="'f16' or 'bf16'"):
        nibble.quantize_checkpoint(bf16["path"], out, format="int4", scale_type="e4m3")
    with pytest.raises(nibble.Error, match="no device quantizer"):
        nibble.quantize_checkpoint(bf16["path"], out, format="int4", device="gpu")
    with pytest.raises(nibble.Error, match="nearest"):
        nibble.quantize_checkpoint(bf16["path"], out, format="int4_sym", method="mse")
    with pytest.raises(ValueError, match="group_size 16"):
        nibble.quantize_checkpoint(bf16["path"], out, format="int8", group_size=16)
    with pytest.raises(nibble.Error, match="no device quantizer"):
        nibble.quantize_checkpoint(bf16["path"], out, format="int8", device="gpu")
    assert not os.path.exists(out)


# ------------------------------------------------------- save_pretrained

@pytest.mark.parametrize("fmt,st", [("int4", "bf16"), ("int4_sym", None), ("int8", "bf16"), ("int8", None)])
def test_save_pretrained_int_round_trip(bf16, tmp_path, fmt, st):
    from transformers import AutoModelForCausalLM
    from nibble.transformers import NibbleConfig
    cfg = NibbleConfig(format=fmt, group_size=32, scale_type=st)
    model = AutoModelForCausalLM.from_pretrained(bf16["path"], quantization_config=cfg, dtype=torch.bfloat16)
    layers = {n: m for n, m in model.named_modules() if isinstance(m, nt.Linear)}
    assert layers and all(m.format == fmt and m.group == 32 for m in layers.values())
    # the same weights quantize_model gives (the host quantizer)
    twin = reference_model()
    rep = nt.quantize_model(twin, format=fmt, group_size=32, scale_type=st, exclude=["lm_head"], device="cpu",
                            return_weights=True)
    assert set(rep["quantized"]) == set(layers)
    out = str(tmp_path / "saved")
    model.save_pretrained(out)
    with open(os.path.join(out, "config.json")) as f:
        qc = json.load(f)["quantization_config"]
    w = qc["config_groups"]["group_0"]["weights"]
    assert qc["quant_method"] == "compressed-tensors" and qc["format"] == "pack-quantized"
    assert (w["num_bits"], w["type"], w["symmetric"], w["strategy"], w["group_size"]) == \
        (8 if fmt == "int8" else 4, "int", fmt != "int4", "group", 32)
    assert qc["producer"]["name"] == "nibble"
    raw = raw_tensors(out)
    with nibble.open_checkpoint(out) as ck:
        assert {L.prefix for L in ck.layers if L.quant_format} == set(layers)
        assert not any(L.config_mismatch for L in ck.layers)
        for prefix, mod in layers.items():
            ref = rep["weights"][prefix]
            assert ck.layer(prefix).format == INT_LAYOUT[fmt]
            assert_written(ck.quantized_weight(prefix), ref, raw, prefix)
            sdt = np.uint16 if st == "bf16" else np.float16
            assert raw[f"{prefix}.weight_scale"].tobytes() == np.ascontiguousarray(ref.scales, sdt).tobytes()
    # from_pretrained packs the same bytes; the float tensors come back unchanged
    again = AutoModelForCausalLM.from_pretrained(out, quantization_config=NibbleConfig(), dtype=torch.bfloat16)
    for prefix, mod in layers.items():
        b = again.get_submodule(prefix)
        assert isinstance(b, nt.Linear) and b.format == fmt and b.group == 32 and b.perm is None
        assert torch.equal(mod.packed, b.packed), prefix
    sa, sb = model.state_dict(), again.state_dict()
    assert sa.keys() == sb.keys() and all(torch.equal(sa[k], sb[k]) for k in sa)
    # saving the reloaded model gives the same tensors
    out2 = str(tmp_path / "again")
    again.save_pretrained(out2)
    raw2 = raw_tensors(out2)
    assert raw.keys() == raw2.keys() and all(np.array_equal(raw[k], raw2[k]) for k in raw)
    # load_quantized(dequantize=True): the dequantized weights bit for bit
    m = meta_model()
    rep2 = nt.load_quantized(m, out, dequantize=True, dtype=torch.bfloat16)
    assert set(rep2["quantized"]) == set(layers) and not rep2["missing"] and not rep2["unexpected"]
    for prefix in layers:
        want = nibble.to_bf16(nibble.dequantize(rep["weights"][prefix]))
        np.testing.assert_array_equal(bf16_bits(m.get_submodule(prefix).weight), want, err_msg=prefix)


def test_save_pretrained_act_order_keeps_permutation(tmp_path_factory, tmp_path):
    """A GPTQ act-order checkpoint loaded into nibble and saved again: the
    compressed-tensors layers carry weight_g_idx, and the reader gives back
    the same permutation and bytes."""
    from transformers import AutoModelForCausalLM
    from nibble.transformers import NibbleConfig
    from test_int4 import write_int4_checkpoint
    src = str(tmp_path_factory.mktemp("gptq_act"))
    write_int4_checkpoint(reference_model(), src, "gptq-act")
    m = AutoModelForCausalLM.from_pretrained(src, quantization_config=NibbleConfig(), dtype=torch.bfloat16)
    out = str(tmp_path / "saved")
    m.save_pretrained(out)
    layers = {n: mod for n, mod in m.named_modules() if isinstance(mod, nt.Linear)}
    with nibble.open_checkpoint(src) as a, nibble.open_checkpoint(out) as b:
        for prefix, mod in layers.items():
            La, Lb = a.layer(prefix), b.layer(prefix)
            assert La.k_permuted and Lb.k_permuted and Lb.format == "ct-int4"
            np.testing.assert_array_equal(a.perm(La), b.perm(Lb))
            qa, qb = a.quantized_weight(La), b.quantized_weight(Lb)
            for field in ("codes", "scales", "zeros"):
                np.testing.assert_array_equal(getattr(qa, field), getattr(qb, field), err_msg=f"{prefix} {field}")
    again = AutoModelForCausalLM.from_pretrained(out, quantization_config=NibbleConfig(), dtype=torch.bfloat16)
    for prefix, mod in layers.items():
        b = again.get_submodule(prefix)
        assert torch.equal(mod.packed, b.packed) and torch.equal(mod.perm, b.perm), prefix


def test_int8_act_order_layer_tensors_read_back(tmp_path):
    """layer_tensors of an int8 layer with an activation permutation: the
    codes go back to input-feature order with weight_g_idx, and nibble's
    reader returns the same permutation (the stable order of the features
    by group), codes and scales."""
    from nibble.transformers import layer_tensors
    from test_checkpoint import write_safetensors
    n, k, g = 24, 256, 32
    rng = np.random.default_rng(11)
    qw = nibble.quantize(rng.standard_normal((n, k)).astype(np.float32), "int8", group_size=g, scale_type="bf16")
    gidx = rng.permutation(np.repeat(np.arange(k // g), g))
    perm = np.argsort(gidx, kind="stable")      # column j of qw multiplies input feature perm[j]
    t = layer_tensors(qw, perm)
    assert set(t) == {"weight_packed", "weight_scale", "weight_shape", "weight_g_idx"}
    np.testing.assert_array_equal(t["weight_g_idx"].numpy(), gidx)
    orig = np.empty_like(qw.codes)
    orig[:, perm] = qw.codes                    # the codes in input-feature order, plus 128, four to a word
    np.testing.assert_array_equal(t["weight_packed"].numpy(),
                                  _words_along(orig.view(np.int8).astype(np.int64) + 128, 1, 8))
    P = "model.layers.0.mlp.down_proj"
    write_safetensors(str(tmp_path / "model.safetensors"), {
        f"{P}.weight_packed": ("I32", t["weight_packed"].numpy()),
        f"{P}.weight_scale": ("BF16", t["weight_scale"].view(torch.int16).numpy().view(np.uint16)),
        f"{P}.weight_shape": ("I64", t["weight_shape"].numpy()),
        f"{P}.weight_g_idx": ("I32", t["weight_g_idx"].numpy())})
    with nibble.open_checkpoint(str(tmp_path)) as ck:
        L = ck.layer(P)
        assert L.format == "ct-int8" and L.k_permuted and (L.n, L.k) == (n, k)
        np.testing.assert_array_equal(ck.perm(L), perm)
        back = ck.quantized_weight(L)
        np.testing.assert_array_equal(back.codes, qw.codes)
        np.testing.assert_array_equal(back.scales, qw.scales)


def test_save_layout_refusals():
    """One group per model (compressed-tensors' config names one); nothing
    else is guessed."""
    import nibble.transformers as ntf
    from nibble.transformers import NibbleConfig
    model = reference_model()
    nt.quantize_model(model, format="int4", group_size=32, exclude=["lm_head", "*down_proj"], device="cpu")
    nt.quantize_model(model, format="int4", group_size=64, exclude=["lm_head"], device="cpu")
    with pytest.raises(ValueError, match=r"one group; this model's int4 layers have groups \[32, 64\]"):
        ntf.save_layout(model)
    with pytest.raises(ValueError, match="group_size applies to format 'int4'"):
        NibbleConfig(format="nvfp4", group_size=32)
    with pytest.raises(ValueError, match="group_size 16"):
        NibbleConfig(format="int4", group_size=16)
    # int4_hqq (float zero points) takes the integer formats' groups and scale types; saved in hqq's layout
    # (test_hqq.py), with groups per layer, whose hqq 4-bit packing needs an even number of groups
    cfg = NibbleConfig(format="int4_hqq", group_size=128, scale_type="bf16")
    assert (cfg.format, cfg.group_size, cfg.scale_type) == ("int4_hqq", 128, "bf16")
    with pytest.raises(ValueError, match="group_size 256; int4_hqq takes 32, 64, 128"):
        NibbleConfig(format="int4_hqq", group_size=256)
    hqq = reference_model()
    nt.quantize_model(hqq, format="int4_hqq", exclude=["lm_head"], device="cpu")
    assert ntf.save_layout(hqq)["format"] == "int4_hqq"
    odd = nibble.quantize(np.ones((3, 64), np.float32), format="int4_hqq", group_size=64)
    with pytest.raises(ValueError, match="3 groups; hqq's 4-bit packing needs an even number"):
        ntf.layer_tensors(odd)
    with pytest.raises(ValueError, match="scale_type"):
        NibbleConfig(format="int4_sym", scale_type="f32")
    with pytest.raises(ValueError, match="no nibble layers"):
        ntf.save_layout(reference_model())


def test_descriptors_take_a_group_below_the_default():
    """k = 64 with groups of 32: the op's descriptor and a packed weight's
    are valid although the default group (128) does not divide k."""
    d = nt._weight_desc(16, 64, nibble.Format.INT4, 1.0, 0, 15, 32, 0)
    assert (d.group_size, d.k) == (32, 64)
    qw = nibble.quantize(np.linspace(-1, 1, 16 * 64, dtype=np.float32).reshape(16, 64), "int4_sym", group_size=32)
    back = nibble.unpack(nibble.pack(qw))
    np.testing.assert_array_equal(back.codes, qw.codes)
    with pytest.raises(nibble.Error, match="group"):
        nt._weight_desc(16, 64, nibble.Format.INT4, 1.0, 0, 15, 48, 0)
