"""int4_hqq against HQQ itself (the hqq package; skipped without it): layers
quantized by hqq's own HQQLinear on the CPU (both compute dtypes, groups of
32, 64, 128 and one per row, with and without its optimizer) convert with
nibble.torch.hqq_weight - from the module and from its encoded state_dict -
into int4_hqq weights whose nibble.dequantize is bit for bit hqq's own
dequantize; the refusals name the reason.  A safetensors checkpoint of
hqq's state_dicts (as transformers saves HQQ models) reads through
nibble.open_checkpoint as "hqq-int4" layers with the same bytes, and
load_quantized(dequantize=True) gives hqq's weights.  On a GPU (skipped without one):
Linear.from_hqq against HQQ's dequantized weights in float64, with the bound
of test_torch.py."""

import numpy as np
import pytest

torch = pytest.importorskip("torch")
hqq_quantize = pytest.importorskip("hqq.core.quantize")

import nibble  # noqa: E402
import nibble.torch as nt  # noqa: E402
from test_load import HAS_TF, gpu, io  # noqa: E402,F401  (the same skip rules)
from test_torch import EPS, _check_close, _f16_values, _x  # noqa: E402
from test_int4_save import _nibbles  # noqa: E402  (codes in k order)


def _hqq_layer(n, k, group, dtype, optimize, seed=0):
    torch.manual_seed(seed)
    lin = torch.nn.Linear(k, n, bias=True)
    cfg = hqq_quantize.BaseQuantizeConfig(nbits=4, group_size=group, axis=1)
    cfg["weight_quant_params"]["optimize"] = optimize
    return hqq_quantize.HQQLinear(lin, cfg, compute_dtype=dtype, device="cpu", initialize=True)


def _bits(t):
    return t.detach().cpu().contiguous().view(torch.int16).numpy()


@pytest.mark.parametrize("group", [32, 64, 128, "k"])
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("optimize", [False, True])
def test_hqq_dequantize_bit_for_bit(group, dtype, optimize):
    n, k = 48, 256
    h = _hqq_layer(n, k, k if group == "k" else group, dtype, optimize)
    want = h.dequantize()
    assert want.dtype == dtype and tuple(want.shape) == (n, k)
    for src in (h, h.state_dict()):
        qw = nt.hqq_weight(src)
        assert (qw.format, qw.group_size, qw.scale_type) == ("int4_hqq", k if group == "k" else group,
                                                             "f16" if dtype == torch.float16 else "bf16")
        got = torch.from_numpy(np.ascontiguousarray(nibble.dequantize(qw, "float32"))).to(dtype)
        np.testing.assert_array_equal(_bits(got), _bits(want))
        # and in nibble's own dtype of that name, directly
        d16 = nibble.dequantize(qw, "float16" if dtype == torch.float16 else "bfloat16")
        np.testing.assert_array_equal(np.asarray(d16).view(np.int16), _bits(want))
    lin = nt.Linear.from_hqq(h, device="cpu")
    assert lin.format == "int4_hqq" and torch.equal(lin.bias.cpu().to(h.bias.dtype), h.bias.cpu())


def test_hqq_refusals():
    h = _hqq_layer(16, 128, 64, torch.float16, False)
    sd = h.state_dict()
    bad = dict(sd, axis=torch.tensor(0, dtype=torch.int32))
    with pytest.raises(ValueError, match="axis 0"):
        nt.hqq_weight(bad)
    bad = dict(sd, nbits=torch.tensor(2, dtype=torch.int32))
    with pytest.raises(ValueError, match="2 bits"):
        nt.hqq_weight(bad)
    bad = dict(sd, quant_zero=torch.tensor(1, dtype=torch.uint8))
    with pytest.raises(ValueError, match="quant_zero"):
        nt.hqq_weight(bad)
    bad = dict(sd, zero=sd["zero"].float())
    with pytest.raises(ValueError, match="float16 or bfloat16"):
        nt.hqq_weight(bad)
    bad = dict(sd, W_q=sd["W_q"][1:])
    with pytest.raises(ValueError, match="W_q"):
        nt.hqq_weight(bad)
    with pytest.raises(ValueError, match="holds W_q"):
        nt.hqq_weight({"scale": sd["scale"]})
    with pytest.raises(TypeError, match="HQQLinear"):
        nt.hqq_weight(torch.nn.Linear(4, 4))


@gpu
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("m", [1, 8, 33])
def test_hqq_linear_on_the_gpu(dtype, m):
    n, k = 136, 384
    h = _hqq_layer(n, k, 64, dtype, True, seed=m)
    lin = nt.Linear.from_hqq(h)
    x = _x((m, k), dtype, seed=m).cuda()
    y = lin(x).float().cpu().numpy()
    qw = nt.hqq_weight(h)
    xs = x.float().cpu().numpy()
    w = h.dequantize().double().numpy()
    y64 = xs.astype(np.float64) @ w.T + h.bias.double().numpy()
    u = EPS[dtype]
    zs = np.abs(_f16_values(qw.zeros, qw.scale_type) * _f16_values(qw.scales, qw.scale_type))
    wh = np.abs(w) + np.repeat(zs, 64, axis=1)
    _check_close(y, y64, xs, wh, u, f"HQQ layer {dtype} m={m}", (1 + u) ** 3 - 1)


def _save_hqq(path, layers, extra=None):
    from safetensors.torch import save_file
    tensors = {}
    for p, h in layers.items():
        for key, v in h.state_dict().items():
            if torch.is_tensor(v):
                tensors[f"{p}.{key}"] = v.detach().contiguous()
        tensors.update({f"{p}.{k}": v for k, v in (extra or {}).get(p, {}).items()})
    save_file(tensors, str(path / "model.safetensors"), metadata={"format": "pt"})


@io
def test_hqq_checkpoint_bit_for_bit(tmp_path):
    layers = {"model.layers.0.mlp.down_proj": _hqq_layer(48, 256, 64, torch.float16, True),
              "model.layers.0.mlp.up_proj": _hqq_layer(64, 128, 32, torch.bfloat16, False, seed=1),
              "model.layers.0.self_attn.o_proj": _hqq_layer(32, 128, 128, torch.float16, False, seed=2)}
    _save_hqq(tmp_path, layers)
    with nibble.open_checkpoint(str(tmp_path)) as ck:
        for p, h in layers.items():
            L = ck.layer(p)
            assert L.format == "hqq-int4" and L.quant_format == "int4_hqq", (p, L.format, L.problem)
            assert (L.n, L.k) == tuple(h.meta["shape"])
            qw, ref = ck.quantized_weight(L), nt.hqq_weight(h)
            assert (qw.format, qw.group_size, qw.scale_type or "f16") == ("int4_hqq", ref.group_size, ref.scale_type)
            np.testing.assert_array_equal(qw.codes, ref.codes)
            np.testing.assert_array_equal(qw.scales.view(np.uint16), ref.scales.view(np.uint16))
            np.testing.assert_array_equal(qw.zeros.view(np.uint16), ref.zeros.view(np.uint16))
            want = h.dequantize()
            got = torch.from_numpy(np.ascontiguousarray(nibble.dequantize(qw, "float32"))).to(want.dtype)
            np.testing.assert_array_equal(_bits(got), _bits(want))


@io
def test_hqq_checkpoint_refusals(tmp_path):
    layers = {"a.proj": _hqq_layer(16, 128, 64, torch.float16, False),
              "b.proj": _hqq_layer(16, 128, 64, torch.float16, False, seed=1),
              "c.proj": _hqq_layer(16, 128, 64, torch.float16, False, seed=2)}
    extra = {"a.proj": {"axis": torch.tensor(0, dtype=torch.int32)},
             "b.proj": {"nbits": torch.tensor(2, dtype=torch.int32)},
             "c.proj": {"quant_zero": torch.tensor(1, dtype=torch.uint8)}}
    _save_hqq(tmp_path, layers, extra)
    with nibble.open_checkpoint(str(tmp_path)) as ck:
        reasons = {p: ck.layer(p).problem for p in layers}
        assert all(ck.layer(p).format == "inconsistent" for p in layers), reasons
    assert "axis 0" in reasons["a.proj"] and "nbits 2" in reasons["b.proj"] and "quant_zero" in reasons["c.proj"]


@io
@pytest.mark.skipif(not HAS_TF, reason="transformers is not installed")
def test_hqq_model_saved_by_hqq_loads(tmp_path):
    """A small Llama quantized and saved by hqq itself (AutoHQQHFModel,
    save_to_safetensors, on the CPU): every HQQ layer reads as hqq-int4 with
    hqq's dequantized weights, and load_quantized(dequantize=True) and
    from_pretrained(quantization_config=NibbleConfig(dequantize=True)) put
    exactly those into the model."""
    from hqq.models.hf.base import AutoHQQHFModel
    from transformers import AutoConfig, AutoModelForCausalLM, LlamaConfig, LlamaForCausalLM
    torch.manual_seed(0)
    cfg = LlamaConfig(hidden_size=128, intermediate_size=256, num_hidden_layers=1, num_attention_heads=4,
                      num_key_value_heads=2, vocab_size=64)
    model = LlamaForCausalLM(cfg).to(torch.float16)
    AutoHQQHFModel.quantize_model(model, quant_config=hqq_quantize.BaseQuantizeConfig(nbits=4, group_size=64, axis=1),
                                  compute_dtype=torch.float16, device="cpu")
    AutoHQQHFModel.save_to_safetensors(model, str(tmp_path), verbose=False)
    layers = {n: m for n, m in model.named_modules() if isinstance(m, hqq_quantize.HQQLinear)}
    assert len(layers) == 7
    with nibble.open_checkpoint(str(tmp_path)) as ck:
        for name, h in layers.items():
            L = ck.layer(name)
            assert L.format == "hqq-int4", (name, L.format, L.problem)
            got = np.asarray(nibble.dequantize(ck.quantized_weight(L), "float16")).view(np.int16)
            np.testing.assert_array_equal(got, _bits(h.dequantize()))
    with torch.device("meta"):
        twin = AutoModelForCausalLM.from_config(AutoConfig.from_pretrained(str(tmp_path)))
    nt.load_quantized(twin, str(tmp_path), dequantize=True, dtype=torch.float16)
    for name, h in layers.items():
        np.testing.assert_array_equal(_bits(twin.get_submodule(name).weight), _bits(h.dequantize()))
    # transformers' from_pretrained with a NibbleConfig takes the HQQ layers as they are
    from nibble.transformers import NibbleConfig
    hf_model = AutoModelForCausalLM.from_pretrained(str(tmp_path), quantization_config=NibbleConfig(dequantize=True),
                                                    dtype=torch.float16, device_map="cpu")
    for name, h in layers.items():
        np.testing.assert_array_equal(_bits(hf_model.get_submodule(name).weight), _bits(h.dequantize()))


def _hqq_quantized(W, group, optimize):
    """hqq's own Quantizer.quantize on the CPU (axis 1, 4 bits, unpacked),
    without the optimizer as the function's defaults have it (round_zero
    off), with it as hqq's configuration for 4 bits has it (round_zero on:
    hqq_base_quant_config, transformers' HqqConfig): codes [n, k] uint8 and
    float32 scale (the dequantization's, 1 / t) and zero [n, k / group]."""
    n, k = W.shape
    wq, meta = hqq_quantize.Quantizer.quantize(W, nbits=4, channel_wise=True, group_size=group, optimize=optimize,
                                               round_zero=optimize, axis=1, bitpack=False, device="cpu")
    return (wq.reshape(n, k).to(torch.uint8).numpy(), meta["scale"].reshape(n, k // group),
            meta["zero"].reshape(n, k // group))


def _weights(seed, n, k):
    torch.manual_seed(seed)
    W = torch.randn(n, k) * 0.02
    if seed == 1:   # tiny ranges (HQQ's t = 1 below 1e-4), constant rows, an outlier
        W[:8] *= 1e-3
        W[8:10] = 0.5
        W[10, 3] = 1.0
    if seed == 2:   # heavy tails
        W = torch.distributions.StudentT(3.0).sample((n, k)) * 0.01
    if seed == 3:   # unit scale: errors past the shrink operator's threshold (|x| = 0.17 at beta 10)
        W = torch.randn(n, k) * 2.0
    return W


@pytest.mark.parametrize("group", [32, 64, 128])
@pytest.mark.parametrize("st", ["f16", "bf16"])
@pytest.mark.parametrize("seed", [0, 1, 2, 3])
def test_hqq_quantizer_against_hqq(group, st, seed):
    """nibble.quantize for int4_hqq against hqq's Quantizer.quantize itself:
    method "rtn" is optimize=False bit for bit (codes, scales, zero points);
    method "hqq" is optimize=True and round_zero=True (hqq's configuration for
    4 bits) with the same codes and scales and the zero
    points equal but for a last bit in at most 1% of the groups (PyTorch
    sums in another order), and the same reconstruction error."""
    n, k = 96, 512
    td = torch.float16 if st == "f16" else torch.bfloat16
    W = _weights(seed, n, k)
    for method, optimize in (("rtn", False), ("hqq", True)):
        hq, hs, hz = _hqq_quantized(W, group, optimize)
        qw = nibble.quantize(W.numpy(), format="int4_hqq", group_size=group, scale_type=st, method=method)
        ns = torch.from_numpy(qw.scales.view(np.int16)).view(td)
        nz = torch.from_numpy(qw.zeros.view(np.int16)).view(td)
        np.testing.assert_array_equal(_nibbles(qw.codes, qw.k), hq)
        np.testing.assert_array_equal(_bits(ns), _bits(hs.to(td)))
        zdiff = (nz != hz.to(td))
        if method == "rtn":
            assert not zdiff.any()
        else:
            assert zdiff.float().mean().item() <= 0.01, f"{int(zdiff.sum())} of {zdiff.numel()} zero points differ"
            # where they differ, by one step of the scale type at most
            d = (nz.float() - hz.to(td).float()).abs()[zdiff]
            ulp = torch.finfo(td).eps * hz.to(td).float().abs()[zdiff]
            assert (d <= ulp + 1e-30).all()
        back = torch.from_numpy(np.ascontiguousarray(nibble.dequantize(qw, "float32")))
        want = ((torch.from_numpy(hq).to(td).reshape(-1, group) - hz.to(td).reshape(-1, 1))
                * hs.to(td).reshape(-1, 1)).reshape(n, k).float()
        e_n, e_h = (back - W).abs().mean().item(), (want - W).abs().mean().item()
        assert abs(e_n - e_h) <= 1e-3 * e_h, (method, e_n, e_h)
    # the optimizer lowers the mean error (what it is for)
    rtn = nibble.quantize(W.numpy(), format="int4_hqq", group_size=group, scale_type=st, method="rtn")
    opt = nibble.quantize(W.numpy(), format="int4_hqq", group_size=group, scale_type=st, method="hqq")
    e = [(torch.from_numpy(np.ascontiguousarray(nibble.dequantize(q, "float32"))) - W).abs().mean().item()
         for q in (rtn, opt)]
    assert e[1] < e[0]


def test_hqq_method_refusals():
    W = np.random.default_rng(0).standard_normal((16, 128)).astype(np.float32)
    with pytest.raises(nibble.Error, match="int4_hqq"):
        nibble.quantize(W, format="int4", method="hqq")
    with pytest.raises(nibble.Error, match="int4_hqq"):
        nibble.quantize(W, format="nvfp4", method="hqq")
    if HAS_TF:
        import nibble.transformers as ntf
        with pytest.raises(ValueError, match="int4_hqq"):
            ntf.NibbleConfig(format="nvfp4", method="hqq")
        assert ntf.NibbleConfig(format="int4_hqq", method="hqq").method == "hqq"


def test_hqq_optimizer_in_from_pretrained(tmp_path):
    """from_pretrained(quantization_config=NibbleConfig(format="int4_hqq",
    method=...)) on a float16 checkpoint quantizes every layer with that
    method: the packed bytes of nibble.quantize(method=...) of the same
    weights (method "hqq" differing from "rtn"), whose agreement with hqq
    itself test_hqq_quantizer_against_hqq shows."""
    if not HAS_TF:
        pytest.skip("transformers is not installed")
    from transformers import AutoModelForCausalLM, LlamaConfig, LlamaForCausalLM
    from nibble.transformers import NibbleConfig
    torch.manual_seed(0)
    cfg = LlamaConfig(hidden_size=128, intermediate_size=256, num_hidden_layers=1, num_attention_heads=4,
                      num_key_value_heads=2, vocab_size=64)
    model = LlamaForCausalLM(cfg).to(torch.float16)
    model.save_pretrained(str(tmp_path))
    names = [n for n, m in model.named_modules() if isinstance(m, torch.nn.Linear) and n != "lm_head"]
    assert len(names) == 7
    packed = {}
    for method in ("rtn", "hqq"):
        got = AutoModelForCausalLM.from_pretrained(
            str(tmp_path), quantization_config=NibbleConfig(format="int4_hqq", method=method, group_size=64,
                                                            scale_type="f16"),
            dtype=torch.float16, device_map="cpu")
        for name in names:
            w = model.get_submodule(name).weight.detach().numpy()
            want = nt.pack(nibble.quantize(w, format="int4_hqq", method=method, group_size=64, scale_type="f16"), "cpu")
            have = got.get_submodule(name).weight
            assert torch.equal(have.packed.cpu(), want.packed.cpu()), (method, name)
            packed[method, name] = want.packed.cpu()
    assert any(not torch.equal(packed["rtn", n], packed["hqq", n]) for n in names)


@pytest.mark.parametrize("group,st", [(64, "f16"), (32, "bf16")])
def test_hqq_save_pretrained_round_trip(tmp_path, group, st):
    """save_pretrained of int4_hqq layers (quantized at load with
    NibbleConfig(format="int4_hqq")) writes hqq's own layout: config.json's
    quantization_config is transformers' HqqConfig dict (quant_method
    "hqq"), every layer hqq's encoded HQQLinear state_dict.  nibble's reader
    returns the model's bytes (hqq-int4), from_pretrained(NibbleConfig())
    packs them again, and hqq itself loads each layer's tensors into an
    HQQLinear (load_state_dict, as its from_quantized does) whose
    dequantize() is nibble's dequantization bit for bit."""
    if not HAS_TF:
        pytest.skip("transformers is not installed")
    import json
    import os
    from safetensors.torch import load_file
    from transformers import AutoModelForCausalLM, LlamaConfig, LlamaForCausalLM
    from nibble.transformers import NibbleConfig
    torch.manual_seed(0)
    cfg = LlamaConfig(hidden_size=128, intermediate_size=256, num_hidden_layers=1, num_attention_heads=4,
                      num_key_value_heads=2, vocab_size=64)
    src, out = str(tmp_path / "src"), str(tmp_path / "out")
    LlamaForCausalLM(cfg).to(torch.float16).save_pretrained(src)
    model = AutoModelForCausalLM.from_pretrained(
        src, quantization_config=NibbleConfig(format="int4_hqq", method="hqq", group_size=group, scale_type=st),
        dtype=torch.float16, device_map="cpu")
    layers = {n: m for n, m in model.named_modules() if isinstance(m, nt.Linear)}
    assert len(layers) == 7
    model.save_pretrained(out)
    with open(os.path.join(out, "config.json")) as f:
        qc = json.load(f)["quantization_config"]
    assert qc["quant_method"] == "hqq" and qc["skip_modules"] == ["lm_head"]
    assert qc["quant_config"]["weight_quant_params"]["group_size"] == group
    sd = {}
    for fn in os.listdir(out):
        if fn.endswith(".safetensors"):
            sd.update(load_file(os.path.join(out, fn)))
    td = torch.float16 if st == "f16" else torch.bfloat16
    with nibble.open_checkpoint(out) as ck:
        for prefix, mod in layers.items():
            L = ck.layer(prefix)
            assert L.format == "hqq-int4", (prefix, L.format, L.problem)
            got, want = ck.quantized_weight(L), mod.quantized_weight()
            for field in ("codes", "scales", "zeros"):
                np.testing.assert_array_equal(getattr(got, field), getattr(want, field), err_msg=f"{prefix} {field}")
            h = hqq_quantize.HQQLinear(None, quant_config=None, compute_dtype=td, device="cpu")
            h.load_state_dict({k[len(prefix) + 1:]: v for k, v in sd.items() if k.startswith(prefix + ".")})
            mine = nibble.dequantize(want, "float16" if st == "f16" else "bfloat16")
            np.testing.assert_array_equal(_bits(h.dequantize()), np.asarray(mine).view(np.int16), err_msg=prefix)
    again = AutoModelForCausalLM.from_pretrained(out, quantization_config=NibbleConfig(), dtype=torch.float16,
                                                 device_map="cpu")
    for prefix, mod in layers.items():
        b = again.get_submodule(prefix)
        assert isinstance(b, nt.Linear) and b.format == "int4_hqq" and torch.equal(b.packed, mod.packed), prefix


@pytest.mark.parametrize("group,st,method", [(64, "f16", "rtn"), (32, "bf16", "hqq"), (128, "f16", "hqq")])
def test_quantize_checkpoint_hqq_layout(tmp_path, group, st, method):
    """nibble.quantize_checkpoint (`nibble quantize --format int4_hqq`, the
    C writer) writes each layer exactly as save_pretrained does (the tensors
    of nibble.transformers._hqq_tensors for nibble.quantize of the same
    weights, rounding to nearest or hqq's optimizer), the same HqqConfig,
    and hqq itself loads every layer (HQQLinear.load_state_dict) into
    nibble's dequantization bit for bit."""
    import json
    import os
    st_torch = pytest.importorskip("safetensors.torch")
    from test_checkpoint import bf16_checkpoint
    from nibble.transformers import _hqq_tensors, _layout_config
    shapes = {"model.layers.0.mlp.down_proj": (48, 256), "model.layers.0.self_attn.q_proj": (64, 128),
              "lm_head": (32, 128)}
    ws = bf16_checkpoint(str(tmp_path / "bf16"), shapes)
    out = str(tmp_path / "q")
    summary = nibble.quantize_checkpoint(str(tmp_path / "bf16"), out, format="int4_hqq", group_size=group,
                                         scale_type=st, method=method)
    assert summary["layers_quantized"] == 2 and summary["device"] == "cpu"
    got = st_torch.load_file(os.path.join(out, "model.safetensors"))
    td = torch.float16 if st == "f16" else torch.bfloat16
    for prefix in ("model.layers.0.mlp.down_proj", "model.layers.0.self_attn.q_proj"):
        qw = nibble.quantize(ws[prefix], "int4_hqq", group_size=group, scale_type=st, method=method)
        want = _hqq_tensors(qw)
        mine = {k[len(prefix) + 1:]: v for k, v in got.items() if k.startswith(prefix + ".")}
        assert set(mine) == set(want), prefix
        for k, v in want.items():
            assert mine[k].dtype == v.dtype and mine[k].shape == v.shape and torch.equal(mine[k], v), (prefix, k)
        h = hqq_quantize.HQQLinear(None, quant_config=None, compute_dtype=td, device="cpu")
        h.load_state_dict(mine)
        ref = nibble.dequantize(qw, "float16" if st == "f16" else "bfloat16")
        np.testing.assert_array_equal(_bits(h.dequantize()), np.asarray(ref).view(np.int16), err_msg=prefix)
    with open(os.path.join(out, "config.json")) as f:
        qc = json.load(f)["quantization_config"]
    assert qc == _layout_config("int4_hqq", None, ["lm_head"], group)
    with pytest.raises(ValueError, match="group_size 256"):
        nibble.quantize_checkpoint(str(tmp_path / "bf16"), str(tmp_path / "x"), format="int4_hqq", group_size=256)
    with pytest.raises(nibble.Error, match="serves int4_hqq only"):
        nibble.quantize_checkpoint(str(tmp_path / "bf16"), str(tmp_path / "x"), format="int4", method="hqq")
    with pytest.raises(nibble.Error, match="no device quantizer"):
        nibble.quantize_checkpoint(str(tmp_path / "bf16"), str(tmp_path / "x"), format="int4_hqq", device="gpu")

