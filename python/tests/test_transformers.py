"""Tests of nibble.transformers: nibble as a transformers quantizer
(from_pretrained of ModelOpt NVFP4, Quark MXFP4, compressed-tensors
nvfp4/mxfp4 and gpt-oss MXFP4 checkpoints, quantization at load,
save_pretrained and reload).

Skipped without torch or transformers (or without the checkpoint API); the
GPU tests without CUDA.  Checkpoints are written here from a tiny random
LlamaForCausalLM (test_load.py's) as BF16 safetensors, quantized by
nibble.quantize_checkpoint (ModelOpt NVFP4, Quark MXFP4) or rewritten into
the compressed-tensors layout.

On the CPU the model from_pretrained builds is checked for structure (which
layers became nibble.torch.Linear, which stayed float), bytes (each layer's
packed bytes equal nibble.pack of what nibble's reader returns for that
layer, i.e. nb_pack_host of the checkpoint's codes and scales; quantized at
load: of nibble.quantize of the BF16 weight), the config round trip,
save/reload equality and the refusals.  The forward of nibble.torch.Linear
needs CUDA: the GPU tests compare the nibble model with the
dequantized-weight model (NibbleConfig(dequantize=True)) within test_load's
tolerance and run generate.

Run on a GPU machine:  python3 -m pytest python/tests/test_transformers.py
"""

import json
import os

import numpy as np
import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

import nibble  # noqa: E402
import nibble.torch as nt  # noqa: E402

from test_checkpoint import write_safetensors  # noqa: E402
from test_load import (HAS_IO, assert_generation_agrees, bf16_bits, gpu, reference_model, tiny_config,  # noqa: E402
                       write_model)

pytestmark = pytest.mark.skipif(not HAS_IO, reason="no checkpoint API (package built without cJSON)")

import nibble.transformers as ntf  # noqa: E402
from nibble.transformers import NibbleConfig  # noqa: E402
from transformers import AutoModelForCausalLM  # noqa: E402
from transformers.quantizers import auto as hf_auto  # noqa: E402

try:
    import accelerate  # noqa: F401  (transformers needs it for any device_map)
    HAS_ACCEL = True
except ImportError:
    HAS_ACCEL = False
accel = pytest.mark.skipif(not HAS_ACCEL, reason="device_map needs accelerate")

LINEARS = 14   # 2 layers x (q, k, v, o, gate, up, down); lm_head is tied to the embeddings


@pytest.fixture(scope="module")
def ckpts(tmp_path_factory):
    base = tmp_path_factory.mktemp("hf")
    ref = reference_model()
    out = {"ref": ref, "bf16": str(base / "bf16")}
    write_model(ref, out["bf16"])
    for fmt in ("nvfp4", "mxfp4"):
        out[fmt] = str(base / fmt)
        nibble.quantize_checkpoint(out["bf16"], out[fmt], format=fmt)
    out["ct-nvfp4"] = _compressed_tensors(out["nvfp4"], str(base / "ct-nvfp4"), "nvfp4")
    out["ct-mxfp4"] = _compressed_tensors(out["mxfp4"], str(base / "ct-mxfp4"), "mxfp4")
    return out


def _compressed_tensors(src, dst, fmt):
    """src (ModelOpt / Quark, as nibble quantize writes it) rewritten in the
    compressed-tensors layout: weight_packed, and for NVFP4
    weight_global_scale = 1 / weight_scale_2; config.json declaring it."""
    os.makedirs(dst)
    tensors = {}
    with nibble.open_checkpoint(src) as ck:
        for t in ck.tensors:
            a, name = ck.tensor(t.name), t.name
            if t.layer and ck.layer(t.layer).quant_format:
                if name.endswith(".weight"):
                    name = name[:-len(".weight")] + ".weight_packed"
                elif name.endswith(".weight_scale_2"):
                    name = name[:-len(".weight_scale_2")] + ".weight_global_scale"
                    a = (np.float32(1) / a.reshape(1)).astype(np.float32)
            tensors[name] = (t.dtype, a)
    write_safetensors(os.path.join(dst, "model.safetensors"), tensors)
    with open(os.path.join(src, "config.json")) as f:
        config = json.load(f)
    config["quantization_config"] = {"quant_method": "compressed-tensors", "format": f"{fmt}-pack-quantized",
                                     "ignore": ["lm_head"]}
    with open(os.path.join(dst, "config.json"), "w") as f:
        json.dump(config, f)
    return dst


def _nibble_layers(model):
    return {name: m for name, m in model.named_modules() if isinstance(m, nt.Linear)}


def _assert_checkpoint_bytes(model, path, fmt):
    """Every quantized layer of `path` is a nibble.torch.Linear of `model`
    holding nb_pack_host of exactly the reader's codes and scales."""
    layers = _nibble_layers(model)
    with nibble.open_checkpoint(path) as ck:
        quantized = [L for L in ck.layers if L.quant_format]
        assert sorted(layers) == sorted(L.prefix for L in quantized) and len(layers) == LINEARS
        for L in quantized:
            mod = layers[L.prefix]
            assert mod.format == fmt and mod.packed.device.type == "cpu"
            want = nibble.pack(ck.quantized_weight(L))
            np.testing.assert_array_equal(mod.packed.numpy(), want.data)
            assert (mod.tensor_scale, mod.scale_exp_min, mod.scale_exp_max) == \
                (want.tensor_scale, want.scale_exp_min, want.scale_exp_max)


def _assert_float_tensors(model, ref):
    for name in ("model.embed_tokens.weight", "model.norm.weight", "model.layers.1.input_layernorm.weight"):
        assert torch.equal(model.get_parameter(name), ref.get_parameter(name)), name
    assert isinstance(model.lm_head, torch.nn.Linear) and model.lm_head.weight is model.model.embed_tokens.weight


# ------------------------------------------------------------ registration

def test_registration_leaves_other_owners_alone():
    configs, quantizers = hf_auto.AUTO_QUANTIZATION_CONFIG_MAPPING, hf_auto.AUTO_QUANTIZER_MAPPING
    assert configs["nibble"] is NibbleConfig and quantizers["nibble"] is ntf.NibbleHfQuantizer
    assert configs["modelopt"] is NibbleConfig          # transformers has no ModelOpt loader
    for method in ("quark", "compressed-tensors", "mxfp4"):
        assert configs[method] is not NibbleConfig and quantizers[method] is not ntf.NibbleHfQuantizer
    before = {m: (configs[m], quantizers[m]) for m in ("quark", "mxfp4")}
    with ntf.override("quark", "mxfp4"):
        assert configs["quark"] is NibbleConfig and quantizers["mxfp4"] is ntf.NibbleHfQuantizer
        assert configs["compressed-tensors"] is not NibbleConfig
    assert {m: (configs[m], quantizers[m]) for m in ("quark", "mxfp4")} == before
    ntf.override()
    assert all(configs[m] is NibbleConfig for m in ntf.OVERRIDABLE)
    ntf.restore()
    assert {m: (configs[m], quantizers[m]) for m in ("quark", "mxfp4")} == before
    assert configs["modelopt"] is NibbleConfig          # not taken by override, so not given back
    with pytest.raises(ValueError, match="gptq"):
        ntf.override("gptq")


def test_config_arguments():
    c = NibbleConfig(format="MXFP4", scale_rule="round-up", modules_to_not_convert="lm_head")
    assert (c.format, c.scale_rule, c.modules_to_not_convert) == ("mxfp4", "round_up", ["lm_head"])
    assert c.to_dict()["quant_method"] == "nibble" and NibbleConfig.from_dict(c.to_dict()).format == "mxfp4"
    assert "mxfp4" in repr(c)
    assert NibbleConfig(format="int4").format == "int4"     # (int4, int4_sym, int8, nf4, bnb_fp4 have kernels)
    c = NibbleConfig(format="INT8", group_size=64, scale_type="bf16")
    assert (c.format, c.group_size, c.scale_type) == ("int8", 64, "bf16")
    assert NibbleConfig.from_dict(c.to_dict()).group_size == 64
    with pytest.raises(ValueError, match="group_size 16; int8 takes 32, 64, 128"):
        NibbleConfig(format="int8", group_size=16)
    assert NibbleConfig(format="NF4").format == "nf4"
    with pytest.raises(ValueError, match="not a nibble format"):
        NibbleConfig(format="fp8")
    with pytest.raises(ValueError, match="MXFP4 only"):
        NibbleConfig(format="nvfp4", scale_rule="ocp")
    with pytest.raises(ValueError, match="method"):
        NibbleConfig(method="gptq")
    with pytest.raises(TypeError, match="unknown arguments"):
        NibbleConfig(bits=4)
    foreign = NibbleConfig.from_dict({"quant_method": "quark", "exclude": ["lm_head"]})
    assert foreign.format is None and foreign.source["quant_method"] == "quark"


def test_layout_config_is_what_nibble_quantize_writes(ckpts):
    """NibbleConfig's save form is the C writer's config (ckpt_out.c) but for
    the exclude list, which names the model's float layers."""
    for fmt, key in (("nvfp4", "ignore"), ("mxfp4", "exclude")):
        with open(os.path.join(ckpts[fmt], "config.json")) as f:
            written = json.load(f)["quantization_config"]
        mine = ntf._layout_config(fmt, None, written[key])
        assert mine == written, (fmt, mine, written)


# ------------------------------------------------------- 4-bit checkpoints

def test_modelopt_loads_with_no_argument(ckpts):
    model = AutoModelForCausalLM.from_pretrained(ckpts["nvfp4"])
    _assert_checkpoint_bytes(model, ckpts["nvfp4"], "nvfp4")
    _assert_float_tensors(model, ckpts["ref"])
    qc = model.config.quantization_config
    assert isinstance(qc, NibbleConfig) and qc.format == "nvfp4" and qc.source["quant_method"] == "modelopt"
    assert model.is_quantized and model.hf_quantizer.pre_quantized


@pytest.mark.parametrize("how", ["config", "override"])
def test_quark_loads_when_taken_over(ckpts, how):
    if how == "config":
        model = AutoModelForCausalLM.from_pretrained(ckpts["mxfp4"], quantization_config=NibbleConfig())
    else:
        with ntf.override("quark"):
            model = AutoModelForCausalLM.from_pretrained(ckpts["mxfp4"])
    _assert_checkpoint_bytes(model, ckpts["mxfp4"], "mxfp4")
    _assert_float_tensors(model, ckpts["ref"])
    assert model.config.quantization_config.source["quant_method"] == "quark"


def test_quark_without_takeover_stays_transformers(ckpts):
    """Without NibbleConfig() or override("quark"), transformers' own Quark
    quantizer gets the checkpoint (it needs AMD's quark package)."""
    try:
        import quark  # noqa: F401
        pytest.skip("quark is installed: transformers' loader would run")
    except ImportError:
        pass
    with pytest.raises(ImportError, match="Quark"):
        AutoModelForCausalLM.from_pretrained(ckpts["mxfp4"])


@pytest.mark.parametrize("fmt", ["nvfp4", "mxfp4"])
def test_compressed_tensors(ckpts, fmt):
    path = ckpts["ct-" + fmt]
    model = AutoModelForCausalLM.from_pretrained(path, quantization_config=NibbleConfig())
    _assert_checkpoint_bytes(model, path, fmt)
    _assert_float_tensors(model, ckpts["ref"])
    with nibble.open_checkpoint(path) as ck:
        assert {L.format for L in ck.layers if L.quant_format} == {"ct-" + fmt}


def test_dequantize_loads_the_reference_model(ckpts):
    model = AutoModelForCausalLM.from_pretrained(ckpts["nvfp4"], quantization_config=NibbleConfig(dequantize=True))
    assert not _nibble_layers(model) and getattr(model.config, "quantization_config", None) is None
    with nibble.open_checkpoint(ckpts["nvfp4"]) as ck:
        for L in (L for L in ck.layers if L.quant_format):
            w = model.get_submodule(L.prefix).weight
            assert w.dtype == torch.bfloat16 and not w.is_meta
            np.testing.assert_array_equal(bf16_bits(w), nibble.dequantize(ck.quantized_weight(L), "bfloat16"))
    ids = torch.tensor([[1, 17, 33, 99, 5]])
    with torch.no_grad():
        out, base = model(ids).logits.float(), ckpts["ref"](ids).logits.float()
    assert ((out - base).norm() / base.norm()).item() < 0.5


def test_forward_on_the_cpu_is_the_host_reference(ckpts):
    """A model loaded on the CPU holds the packed bytes until
    model.to("cuda"); its forward there runs nibble::gemm's host reference
    (a checking path), close to the dequantized model's in float32."""
    ids = torch.tensor([[1, 2, 3]])
    model = AutoModelForCausalLM.from_pretrained(ckpts["nvfp4"], dtype=torch.float32)
    ref = AutoModelForCausalLM.from_pretrained(ckpts["nvfp4"], dtype=torch.float32,
                                               quantization_config=NibbleConfig(dequantize=True))
    assert _nibble_layers(model) and not _nibble_layers(ref)
    with torch.no_grad():
        got, want = model(ids).logits, ref(ids).logits
    assert float((got - want).norm() / want.norm()) < 1e-5   # float32 summation order only


# --------------------------------------------------------- quantize at load

def _expected_at_load(ck, name, fmt, rule=None, method="rtn"):
    """nibble.quantize of layer `name`'s BF16 weight as quantization at load
    must give it.  NVFP4: q/k/v and gate/up of a module share one tensor
    scale, the largest of the members' own (amax / (6 x 448) is monotonic in
    amax), which is the scale of their rows quantized together."""
    ts = None
    parent, _, member = name.rpartition(".")
    group = next((g for g in (("q_proj", "k_proj", "v_proj"), ("gate_proj", "up_proj")) if member in g), ())
    if fmt == "nvfp4" and group:
        ts = max(nibble.quantize(ck.tensor(f"{parent}.{p}.weight"), format=fmt).tensor_scale for p in group)
    return nibble.quantize(ck.tensor(name + ".weight"), format=fmt, scale_rule=rule, method=method, tensor_scale=ts)


@pytest.mark.parametrize("fmt,rule,method", [("nvfp4", None, "rtn"), ("mxfp4", None, "rtn"),
                                             ("mxfp4", "ocp", "rtn"), ("nvfp4", None, "mse")])
def test_quantize_at_load_bytes(ckpts, fmt, rule, method):
    cfg = NibbleConfig(format=fmt, scale_rule=rule, method=method)
    model = AutoModelForCausalLM.from_pretrained(ckpts["bf16"], quantization_config=cfg)
    layers = _nibble_layers(model)
    assert len(layers) == LINEARS and not model.hf_quantizer.pre_quantized
    with nibble.open_checkpoint(ckpts["bf16"]) as ck:
        for name, mod in layers.items():
            qw = _expected_at_load(ck, name, fmt, rule, method)
            np.testing.assert_array_equal(mod.packed.numpy(), nibble.pack(qw).data)
            assert mod.tensor_scale == qw.tensor_scale
    if fmt == "nvfp4" and method == "rtn":   # the bytes `nibble quantize` writes, shared scales included
        with nibble.open_checkpoint(ckpts["nvfp4"]) as ck:
            for L in ck.layers:
                if L.quant_format:
                    qw = ck.quantized_weight(L)
                    np.testing.assert_array_equal(layers[L.prefix].packed.numpy(), nibble.pack(qw).data)
    _assert_float_tensors(model, ckpts["ref"])


def test_quantize_at_load_exclusions(ckpts):
    cfg = NibbleConfig(format="nvfp4", modules_to_not_convert=["*.mlp.*", "lm_head"])
    model = AutoModelForCausalLM.from_pretrained(ckpts["bf16"], quantization_config=cfg)
    layers = _nibble_layers(model)
    assert len(layers) == 8 and not any(".mlp." in name for name in layers)
    down = model.model.layers[0].mlp.down_proj
    assert isinstance(down, torch.nn.Linear)
    assert torch.equal(down.weight, ckpts["ref"].model.layers[0].mlp.down_proj.weight)
    assert model.config.quantization_config.to_dict()["ignore"] == sorted(
        n for n, m in model.named_modules() if isinstance(m, torch.nn.Linear))


# ------------------------------------------------------------- save / reload

@pytest.mark.parametrize("src,cfg,layout", [("nvfp4", None, "modelopt-nvfp4"), ("ct-mxfp4", "take", "quark-mxfp4"),
                                            ("bf16", "nvfp4", "modelopt-nvfp4"), ("bf16", "mxfp4", "quark-mxfp4")])
def test_save_pretrained_round_trip(ckpts, tmp_path, src, cfg, layout):
    kw = {} if cfg is None else {"quantization_config": NibbleConfig() if cfg == "take" else NibbleConfig(format=cfg)}
    model = AutoModelForCausalLM.from_pretrained(ckpts[src], **kw)
    out = str(tmp_path / "saved")
    model.save_pretrained(out)
    with open(os.path.join(out, "config.json")) as f:
        qc = json.load(f)["quantization_config"]
    assert qc["quant_method"] == layout.split("-")[0] and qc["producer"]["name"] == "nibble"
    with nibble.open_checkpoint(out) as ck:            # other tools' layout, as nibble's reader classifies it
        assert {L.format for L in ck.layers if L.quant_format} == {layout}
        assert not any(L.config_mismatch for L in ck.layers)
    with ntf.override("quark"):
        again = AutoModelForCausalLM.from_pretrained(out)
    a, b = _nibble_layers(model), _nibble_layers(again)
    assert sorted(a) == sorted(b) and len(a) == LINEARS
    for name in a:
        assert torch.equal(a[name].packed, b[name].packed) and a[name].tensor_scale == b[name].tensor_scale
    sa, sb = model.state_dict(), again.state_dict()
    assert sa.keys() == sb.keys() and all(torch.equal(sa[k], sb[k]) for k in sa)


# ------------------------------------------------------------------- gpt-oss

@pytest.fixture(scope="module")
def gptoss(tmp_path_factory):
    """A tiny random gpt-oss model and its checkpoint in the gpt-oss MXFP4
    layout (docs/formats.md 3.4): each expert's weight, out x in, quantized
    by nibble.quantize and stored as *_blocks [E, N, K/32, 16] and *_scales
    [E, N, K/32]; everything else BF16; config.json as gpt-oss ships it."""
    from transformers import GptOssConfig, GptOssForCausalLM
    cfg = GptOssConfig(num_hidden_layers=2, num_local_experts=4, vocab_size=256, hidden_size=64,
                       intermediate_size=64, head_dim=16, num_attention_heads=4, num_key_value_heads=2,
                       num_experts_per_tok=2, max_position_embeddings=128, sliding_window=32, bos_token_id=1,
                       eos_token_id=2, pad_token_id=0)
    torch.manual_seed(0)
    ref = GptOssForCausalLM(cfg).to(torch.bfloat16).eval()
    with torch.no_grad():
        for p in ref.parameters():
            if p.dim() >= 2:
                p.normal_(0, 0.1)
    d = str(tmp_path_factory.mktemp("gptoss"))
    tensors, experts = {}, {}
    for name, v in ref.state_dict().items():
        if name.endswith(("experts.gate_up_proj", "experts.down_proj")):
            qws = [nibble.quantize(v[e].t().float().numpy(), format="mxfp4") for e in range(v.shape[0])]
            experts[name] = qws
            tensors[name + "_blocks"] = ("U8", np.stack([q.codes.reshape(q.n, q.k // 32, 16) for q in qws]))
            tensors[name + "_scales"] = ("U8", np.stack([q.scales for q in qws]))
        else:
            tensors[name] = ("BF16", bf16_bits(v))
    write_safetensors(os.path.join(d, "model.safetensors"), tensors)
    cfg.save_pretrained(d)
    with open(os.path.join(d, "config.json")) as f:
        config = json.load(f)
    config["quantization_config"] = {"quant_method": "mxfp4", "modules_to_not_convert": [
        "model.layers.*.self_attn", "model.layers.*.mlp.router", "model.embed_tokens", "lm_head"]}
    with open(os.path.join(d, "config.json"), "w") as f:
        json.dump(config, f)
    return {"path": d, "ref": ref, "experts": experts}


def test_gptoss_experts_hold_the_checkpoint_bytes(gptoss):
    """Each GptOssExperts becomes one nibble.torch.MoeExperts holding
    nb_moe_pack_host of exactly the checkpoint's expert bytes (gpt-oss's
    interleaved gate_up, swiglu_oai with config.json's limit and alpha) and
    the BF16 biases transformers loaded."""
    model = AutoModelForCausalLM.from_pretrained(gptoss["path"], quantization_config=NibbleConfig())
    assert not _nibble_layers(model.model.layers[0].self_attn)           # attention stays BF16
    owners = sorted({name.rpartition(".")[0] for name in gptoss["experts"]})
    for owner in owners:
        mod = model.get_submodule(owner)
        assert isinstance(mod, nt.MoeExperts) and mod.gate_up_packed.device.type == "cpu"
        qws = {proj: gptoss["experts"][f"{owner}.{proj}"] for proj in ("gate_up_proj", "down_proj")}
        want = nibble.moe_pack(nibble.QuantizedMoe(nibble.QuantizedExperts.stack(qws["gate_up_proj"]),
                                                   nibble.QuantizedExperts.stack(qws["down_proj"]),
                                                   activation="swiglu_oai"))
        assert mod.spec == want.spec and mod.spec.gate_up_layout == "interleaved" and mod.num_experts == 4
        np.testing.assert_array_equal(mod.gate_up_packed.numpy(), want.gate_up)
        np.testing.assert_array_equal(mod.down_packed.numpy(), want.down)
        for proj in ("gate_up_proj", "down_proj"):
            ref_bias = gptoss["ref"].get_parameter(f"{owner}.{proj}_bias")
            assert torch.equal(model.get_parameter(f"{owner}.{proj}_bias"), ref_bias)
    assert torch.equal(model.model.embed_tokens.weight, gptoss["ref"].model.embed_tokens.weight)


def test_gptoss_runs_on_the_cpu_as_the_dequantized_model(gptoss):
    """Loaded without a device map, the experts run the host reference
    (nb_moe_mlp_host) on the CPU: the logits follow the dequantized model's
    (same weights, BF16 rounding at other points)."""
    model = AutoModelForCausalLM.from_pretrained(gptoss["path"], quantization_config=NibbleConfig())
    ref = AutoModelForCausalLM.from_pretrained(gptoss["path"], quantization_config=NibbleConfig(dequantize=True))
    ids = torch.tensor([[1, 17, 33, 99, 5]])
    with torch.no_grad():
        out, want = model(ids).logits.float(), ref(ids).logits.float()
    assert ((out - want).norm() / want.norm()).item() < 2 ** -5


def test_gptoss_dequantized_reference(gptoss):
    """NibbleConfig(dequantize=True) gives transformers' GptOssExperts with
    the dequantized weights; it runs on the CPU, near the BF16 model."""
    model = AutoModelForCausalLM.from_pretrained(gptoss["path"], quantization_config=NibbleConfig(dequantize=True))
    for name, qws in gptoss["experts"].items():
        w = model.get_parameter(name)
        want = np.stack([nibble.dequantize(q, "bfloat16").T for q in qws])
        np.testing.assert_array_equal(bf16_bits(w), want)
    ids = torch.tensor([[1, 17, 33, 99, 5]])
    with torch.no_grad():
        out, base = model(ids).logits.float(), gptoss["ref"](ids).logits.float()
    assert ((out - base).norm() / base.norm()).item() < 0.5


@gpu
@accel
def test_gpu_gptoss_generates_as_the_dequantized_model(gptoss):
    model = AutoModelForCausalLM.from_pretrained(gptoss["path"], device_map="cuda", quantization_config=NibbleConfig())
    ref = AutoModelForCausalLM.from_pretrained(gptoss["path"], device_map="cuda",
                                               quantization_config=NibbleConfig(dequantize=True))
    assert_generation_agrees(model, ref)


# ------------------------------------------------------------------ refusals

@pytest.mark.parametrize("layout", ["ct-asym", "gptq"])
def test_refuses_8bit_layouts_without_a_format(tmp_path, layout):
    """An 8-bit checkpoint no nibble format holds (compressed-tensors
    asymmetric, GPTQ 8-bit) taken over by NibbleConfig() is refused by name
    with the reader's reason, as load_quantized refuses it; nothing slower
    runs instead.  (Symmetric compressed-tensors int8 loads onto the int8
    kernels: test_int4.py.)"""
    from test_load import write_8bit_without_format
    why = write_8bit_without_format(str(tmp_path), layout)
    qc = None
    if os.path.exists(tmp_path / "config.json"):
        with open(tmp_path / "config.json") as f:
            qc = json.load(f)["quantization_config"]
    tiny_config().save_pretrained(str(tmp_path))
    if qc is not None:   # the GPTQ config (bits 8) in the model's config.json
        with open(tmp_path / "config.json") as f:
            config = json.load(f)
        config["quantization_config"] = qc
        with open(tmp_path / "config.json", "w") as f:
            json.dump(config, f)
    with pytest.raises(nibble.Error) as e:
        AutoModelForCausalLM.from_pretrained(str(tmp_path), quantization_config=NibbleConfig())
    assert e.value.status == nibble.Status.ERR_CORRUPT
    assert "model.layers.0.mlp.down_proj" in e.value.message and why in e.value.message, e.value.message


def test_refuses_mismatched_configs(ckpts, tmp_path):
    with pytest.raises(ValueError, match="format='mxfp4'.*holds nvfp4"):
        AutoModelForCausalLM.from_pretrained(ckpts["nvfp4"], quantization_config=NibbleConfig(format="mxfp4"))
    # a config.json that declares Quark MXFP4 over ModelOpt NVFP4 tensors
    bad = tmp_path / "bad"
    os.makedirs(bad)
    os.link(os.path.join(ckpts["nvfp4"], "model.safetensors"), bad / "model.safetensors")
    with open(os.path.join(ckpts["mxfp4"], "config.json")) as f:
        config = json.load(f)
    with open(bad / "config.json", "w") as f:
        json.dump(config, f)
    with pytest.raises(ValueError, match="disagrees with the checkpoint's config"):
        AutoModelForCausalLM.from_pretrained(str(bad), quantization_config=NibbleConfig())


def test_refuses_what_it_cannot_do(ckpts):
    with pytest.raises(ValueError, match="no quantized layer.*quantizes at load"):
        AutoModelForCausalLM.from_pretrained(ckpts["bf16"], quantization_config=NibbleConfig())


@accel
def test_refuses_offload(ckpts):
    with pytest.raises(ValueError, match="disk"):
        AutoModelForCausalLM.from_pretrained(ckpts["nvfp4"], device_map={"": "disk"})
    with pytest.raises(ValueError, match="CPU offloading"):
        AutoModelForCausalLM.from_pretrained(ckpts["nvfp4"], device_map={"model": 0, "lm_head": "cpu"})


# ----------------------------------------------------------------------- GPU

@gpu
@accel
@pytest.mark.parametrize("src", ["nvfp4", "mxfp4", "ct-nvfp4", "ct-mxfp4"])
def test_gpu_from_pretrained_generates_as_the_dequantized_model(ckpts, src):
    model = AutoModelForCausalLM.from_pretrained(ckpts[src], device_map="cuda", quantization_config=NibbleConfig())
    layers = _nibble_layers(model)
    assert len(layers) == LINEARS and all(m.packed.is_cuda and m.workspace.numel() for m in layers.values())
    ref = AutoModelForCausalLM.from_pretrained(ckpts[src], device_map="cuda",
                                               quantization_config=NibbleConfig(dequantize=True))
    assert_generation_agrees(model, ref)


@gpu
@accel
def test_gpu_cpu_load_then_to_cuda_is_the_same_model(ckpts):
    ids = torch.tensor([[1, 17, 33, 99, 5]], device="cuda")
    direct = AutoModelForCausalLM.from_pretrained(ckpts["nvfp4"], device_map="cuda")
    moved = AutoModelForCausalLM.from_pretrained(ckpts["nvfp4"]).to("cuda")
    with torch.no_grad():
        assert torch.equal(direct(ids).logits, moved(ids).logits)
    for a, b in zip(_nibble_layers(direct).values(), _nibble_layers(moved).values()):
        assert torch.equal(a.packed, b.packed) and a.workspace.numel() == b.workspace.numel()


@gpu
@accel
@pytest.mark.parametrize("fmt", ["nvfp4", "mxfp4"])
def test_gpu_quantize_at_load(ckpts, fmt, tmp_path):
    """On a GPU the weights are quantized by the device quantizer as they
    load: the same bytes as the host reference; the model generates as its
    dequantized twin and saves a checkpoint that loads to the same model."""
    model = AutoModelForCausalLM.from_pretrained(ckpts["bf16"], device_map="cuda",
                                                 quantization_config=NibbleConfig(format=fmt))
    with nibble.open_checkpoint(ckpts["bf16"]) as ck:
        for name, mod in _nibble_layers(model).items():
            want = nibble.pack(_expected_at_load(ck, name, fmt))
            np.testing.assert_array_equal(mod.packed.cpu().numpy(), want.data)
    out = str(tmp_path / "q")
    model.save_pretrained(out)
    with ntf.override("quark"):
        again = AutoModelForCausalLM.from_pretrained(out, device_map="cuda")
        ref = AutoModelForCausalLM.from_pretrained(out, device_map="cuda",
                                                   quantization_config=NibbleConfig(dequantize=True))
    for a, b in zip(_nibble_layers(model).values(), _nibble_layers(again).values()):
        assert torch.equal(a.packed, b.packed)
    assert_generation_agrees(again, ref)
