"""Tests of saving and re-loading mixture-of-experts models (nibble.torch.MoeExperts)
through nibble.transformers, and of quantizing experts as from_pretrained reads
a BF16 checkpoint.  CPU only (the experts run the host reference there); skipped
without torch, transformers or the checkpoint API.

What is compared with what:
  * save_pretrained -> from_pretrained / load_quantized: every experts
    module's packed bytes, tensor scales and biases equal the saved model's
    exactly, and so do the logits (same bytes, same host reference);
  * the layout written, as nibble's reader classifies it: gpt-oss's own
    MXFP4 (*_blocks, *_scales, biases; config.json quant_method "mxfp4")
    when gpt-oss experts are the only 4-bit modules - then the tensors are
    the original checkpoint's bytes - otherwise ModelOpt NVFP4 / Quark MXFP4
    with one layer per expert, and no layer that disagrees with config.json;
  * NibbleConfig(format=...) on BF16 gpt-oss, Qwen3-MoE and Mixtral
    checkpoints: each experts module becomes a MoeExperts holding exactly
    the bytes MoeExperts.from_module (quantize_model) gives the same weights;
  * refusals: a model with both formats, layouts that cannot hold the
    experts, half a set of per-expert biases.

Run:  python3 -m pytest python/tests/test_moe_save.py
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
from test_load import HAS_IO  # noqa: E402
from test_moe import _random_model  # noqa: E402

pytestmark = pytest.mark.skipif(not HAS_IO, reason="no checkpoint API (package built without cJSON)")

import nibble.transformers as ntf  # noqa: E402
from nibble.transformers import NibbleConfig  # noqa: E402
from transformers import AutoModelForCausalLM  # noqa: E402

KINDS = ["gpt_oss", "qwen3_moe", "mixtral"]
IDS = torch.tensor([[1, 17, 33, 99, 5, 200, 7]])


def tiny_model(kind, seed=0):
    """A tiny random BF16 model of `kind` (2 layers, 4 experts, top 2;
    H = 64, expert I = 32), weights N(0, 0.1)."""
    import transformers as tf
    common = dict(vocab_size=256, hidden_size=64, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                  head_dim=16, num_experts_per_tok=2, max_position_embeddings=128, bos_token_id=1, eos_token_id=2,
                  pad_token_id=0, tie_word_embeddings=False)
    if kind == "gpt_oss":
        cfg = tf.GptOssConfig(num_local_experts=4, intermediate_size=32, sliding_window=32, **common)
        cls = tf.GptOssForCausalLM
    elif kind == "qwen3_moe":
        cfg = tf.Qwen3MoeConfig(num_experts=4, moe_intermediate_size=32, intermediate_size=128, **common)
        cls = tf.Qwen3MoeForCausalLM
    else:
        cfg = tf.MixtralConfig(num_local_experts=4, intermediate_size=32, **common)
        cls = tf.MixtralForCausalLM
    return _random_model(cls, cfg, seed).to(torch.bfloat16).eval()


@pytest.fixture(scope="module")
def bf16(tmp_path_factory):
    """Each kind's tiny model saved by transformers as a BF16 checkpoint
    (Qwen3-MoE and Mixtral experts per expert, as transformers writes them)."""
    out = {}
    for kind in KINDS:
        d = str(tmp_path_factory.mktemp(kind))
        m = tiny_model(kind)
        m.save_pretrained(d)
        out[kind] = {"path": d, "model": m}
    return out


def experts_modules(model):
    return {n: m for n, m in model.named_modules() if isinstance(m, nt.MoeExperts)}


def assert_same_experts(a, b, n=2):
    ea, eb = experts_modules(a), experts_modules(b)
    assert sorted(ea) == sorted(eb) and len(ea) == n
    for name in ea:
        x, y = ea[name], eb[name]
        assert x.spec == y.spec, name
        wx, wy = x.weights, y.weights
        assert torch.equal(wx.gate_up, wy.gate_up) and torch.equal(wx.down, wy.down), name
        assert (wx.gate_up_exp, wx.down_exp) == (wy.gate_up_exp, wy.down_exp)
        for s, t in ((wx.gate_up_scales, wy.gate_up_scales), (wx.down_scales, wy.down_scales),
                     (x.gate_up_proj_bias, y.gate_up_proj_bias), (x.down_proj_bias, y.down_proj_bias)):
            assert (s is None and t is None) or torch.equal(s, t), name


def logits(model):
    with torch.no_grad():
        return model(IDS).logits.float()


def meta_twin(model):
    with torch.device("meta"):
        return type(model)(model.config)


def layout_of(path):
    """(quant_method of config.json, {expert group formats}, per-expert?, any layer disagreeing with the config)"""
    with open(os.path.join(path, "config.json")) as f:
        qc = json.load(f)["quantization_config"]
    with nibble.open_checkpoint(path) as ck:
        return (qc["quant_method"], {g.format for g in ck.moe_groups}, {g.per_expert for g in ck.moe_groups},
                any(L.config_mismatch for L in ck.layers))


# ------------------------------------------------------ quantizing at load

@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("fmt", ["nvfp4", "mxfp4"])
def test_quantize_at_load_packs_experts(bf16, kind, fmt):
    """NibbleConfig(format=) on a BF16 MoE checkpoint: each experts module
    (gpt-oss's 3-D tensors as stored; Qwen3-MoE's and Mixtral's per-expert
    tensors as transformers fuses them) becomes one MoeExperts with the
    bytes MoeExperts.from_module gives the same weights; the linear layers
    are nibble.torch.Linear; the model runs on the CPU."""
    model = AutoModelForCausalLM.from_pretrained(bf16[kind]["path"], quantization_config=NibbleConfig(format=fmt))
    ref = bf16[kind]["model"]
    ex = experts_modules(model)
    assert sorted(ex) == [f"model.layers.{i}.mlp.experts" for i in range(2)]
    assert any(isinstance(m, nt.Linear) for m in model.modules())
    for name, mod in ex.items():
        want = nt.MoeExperts.from_module(ref.get_submodule(name), format=fmt, device="cpu")
        assert mod.spec == want.spec and mod.gate_up_packed.device.type == "cpu"
        assert torch.equal(mod.gate_up_packed, want.gate_up_packed) and torch.equal(mod.down_packed, want.down_packed)
        assert (mod.gate_up_proj_bias is not None) == (kind == "gpt_oss")
        if kind == "gpt_oss":
            assert torch.equal(mod.gate_up_proj_bias, ref.get_submodule(name).gate_up_proj_bias)
            assert torch.equal(mod.down_proj_bias, ref.get_submodule(name).down_proj_bias)
    assert model.config.quantization_config.to_dict()["quant_method"] == {"nvfp4": "modelopt", "mxfp4": "quark"}[fmt]


# ------------------------------------------------------------ round trips

def assert_same_linears(a, b):
    la = {n: m for n, m in a.named_modules() if isinstance(m, nt.Linear)}
    lb = {n: m for n, m in b.named_modules() if isinstance(m, nt.Linear)}
    assert sorted(la) == sorted(lb)
    for name in la:
        assert torch.equal(la[name].packed, lb[name].packed) and la[name].tensor_scale == lb[name].tensor_scale


# every nn.Linear of the three models (the routers are not nn.Linear): left
# in BF16, the model runs on the CPU (nibble.torch.Linear needs CUDA)
FLOAT_LINEARS = ["*self_attn*", "lm_head"]


# (Mixtral's experts are saved under Mixtral's checkpoint names,
# block_sparse_moe.experts.<e>, which transformers and nibble's loader both
# map back onto the model's mlp.experts)
@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("fmt", ["nvfp4", "mxfp4"])
@pytest.mark.parametrize("scope", ["experts", "all"])
def test_save_pretrained_round_trip(bf16, tmp_path, kind, fmt, scope):
    """A model quantized at load saves as one checkpoint that from_pretrained
    and load_quantized read back to the same bytes: ModelOpt NVFP4 / Quark
    MXFP4 with one layer per expert, or, for gpt-oss with only its experts
    in MXFP4, gpt-oss's own layout.  With the linear layers in BF16 the
    model runs on the CPU and the reloaded model's logits are the saved
    one's exactly."""
    cfg = NibbleConfig(format=fmt, modules_to_not_convert=FLOAT_LINEARS if scope == "experts" else None)
    model = AutoModelForCausalLM.from_pretrained(bf16[kind]["path"], quantization_config=cfg)
    out = str(tmp_path / "saved")
    model.save_pretrained(out)
    layout = {"nvfp4": "modelopt-nvfp4", "mxfp4": "quark-mxfp4"}[fmt]
    if kind == "gpt_oss" and fmt == "mxfp4" and scope == "experts":
        layout = "gptoss-mxfp4"
        assert layout_of(out) == ("mxfp4", {layout}, {False}, False)
    else:
        assert layout_of(out) == (layout.split("-")[0], {layout}, {True}, False)
    with ntf.override("quark", "mxfp4"):
        again = AutoModelForCausalLM.from_pretrained(out)
    assert_same_experts(model, again)
    assert_same_linears(model, again)
    if scope == "experts":
        assert torch.equal(logits(again), logits(model))
    # load_quantized (dequantize: the CPU path) puts the same weights into the model's own experts modules
    twin = meta_twin(model)
    rep = nt.load_quantized(twin, out, dequantize=True, dtype=torch.bfloat16)
    assert not rep["missing"] and not rep["unexpected"]
    for name, ex in experts_modules(model).items():
        qm, mod = ex.quantized_moe(), twin.get_submodule(name)
        transposed = kind == "gpt_oss"
        assert rep["quantized"][name] == layout
        assert torch.equal(mod.gate_up_proj, nt._dense_experts(qm.gate_up, torch.bfloat16, "cpu", transposed))
        assert torch.equal(mod.down_proj, nt._dense_experts(qm.down, torch.bfloat16, "cpu", transposed))
        if kind == "gpt_oss":
            assert torch.equal(mod.gate_up_proj_bias, ex.gate_up_proj_bias)
            assert torch.equal(mod.down_proj_bias, ex.down_proj_bias)


def test_mixtral_save_names(bf16, tmp_path):
    """Mixtral's experts are written per expert (ModelOpt NVFP4) under the
    names transformers gives Mixtral checkpoints (its save reverts .mlp. to
    .block_sparse_moe.), which nibble's reader groups, and read back into
    the model's mlp.experts (transformers' renaming for Mixtral) by
    from_pretrained and load_quantized: the same packed bytes and logits,
    and in float32 the logits of the model whose MixtralExperts hold the
    dequantized weights (load_quantized(dequantize=True)) up to the
    summation order (relative 2^-16)."""
    model = AutoModelForCausalLM.from_pretrained(bf16["mixtral"]["path"],
                                                 quantization_config=NibbleConfig(format="nvfp4",
                                                                                  modules_to_not_convert=FLOAT_LINEARS))
    out = str(tmp_path / "saved")
    model.save_pretrained(out)
    with nibble.open_checkpoint(out) as ck:
        assert [g.prefix for g in ck.moe_groups] == [f"model.layers.{i}.block_sparse_moe.experts" for i in range(2)]
        assert {g.format for g in ck.moe_groups} == {"modelopt-nvfp4"}
        g = ck.moe_groups[0]
        np.testing.assert_array_equal(ck.moe(g).down.codes,
                                      model.model.layers[0].mlp.experts.quantized_moe().down.codes)
        assert "model.layers.0.block_sparse_moe.gate.weight" in ck
    again = AutoModelForCausalLM.from_pretrained(out)
    assert_same_experts(model, again)
    assert torch.equal(logits(again), logits(model))
    twin = meta_twin(model)
    rep = nt.load_quantized(twin, out, dequantize=True, dtype=torch.float32)
    assert not rep["missing"] and not rep["unexpected"]
    assert sorted(rep["quantized"]) == [f"model.layers.{i}.mlp.experts" for i in range(2)]
    assert "model.layers.1.block_sparse_moe.gate.weight" in rep["loaded"]
    assert torch.equal(twin.model.layers[1].mlp.gate.weight, model.model.layers[1].mlp.gate.weight.float())
    assert type(twin.model.layers[0].mlp.experts).__name__ == "MixtralExperts"
    for name, ex in experts_modules(model).items():
        qm, mod = ex.quantized_moe(), twin.get_submodule(name)
        assert torch.equal(mod.gate_up_proj, nt._dense_experts(qm.gate_up, torch.float32, "cpu", False))
        assert torch.equal(mod.down_proj, nt._dense_experts(qm.down, torch.float32, "cpu", False))
    # the host op on the packed bytes against transformers' own experts on the dequantized weights
    again32 = AutoModelForCausalLM.from_pretrained(out, dtype=torch.float32)
    twin.config._experts_implementation = "eager"
    a, b = logits(again32), logits(twin)
    assert float((a - b).norm() / b.norm()) < 2.0 ** -16


from test_transformers import gptoss  # noqa: E402,F401  (the gpt-oss MXFP4 checkpoint fixture)


def test_gptoss_saves_in_its_own_layout(gptoss, tmp_path):
    """gpt-oss loaded from its MXFP4 checkpoint (experts 4-bit, everything
    else BF16) saves in gpt-oss's own layout: *_blocks / *_scales holding
    exactly the original checkpoint's bytes, the biases, and gpt-oss's
    quantization_config; from_pretrained reads it back to the same model."""
    model = AutoModelForCausalLM.from_pretrained(gptoss["path"], quantization_config=NibbleConfig())
    out = str(tmp_path / "saved")
    model.save_pretrained(out)
    with open(os.path.join(out, "config.json")) as f:
        qc = json.load(f)["quantization_config"]
    assert qc["quant_method"] == "mxfp4" and "lm_head" in qc["modules_to_not_convert"]
    assert "model.layers.0.self_attn.q_proj" in qc["modules_to_not_convert"]
    assert layout_of(out) == ("mxfp4", {"gptoss-mxfp4"}, {False}, False)
    with nibble.open_checkpoint(gptoss["path"]) as src, nibble.open_checkpoint(out) as dst:
        names = [t.name for t in src.tensors if t.name.endswith(("_blocks", "_scales", "_bias"))]
        assert len(names) == 12
        for name in names:
            np.testing.assert_array_equal(dst.tensor(name), src.tensor(name))
    again = AutoModelForCausalLM.from_pretrained(out, quantization_config=NibbleConfig())
    assert_same_experts(model, again)
    assert torch.equal(logits(again), logits(model))


def test_gptoss_with_4bit_linears_saves_per_expert(gptoss, tmp_path):
    """Once gpt-oss's linear layers are 4-bit too, one layout (Quark MXFP4)
    holds everything: the experts one fused gate_up_proj layer per expert
    (rows interleaved; grouped because config.json says gpt_oss) with
    per-expert biases, as `nibble convert` writes gpt-oss experts."""
    model = AutoModelForCausalLM.from_pretrained(gptoss["path"], quantization_config=NibbleConfig())
    nt.quantize_model(model, format="mxfp4", exclude=["lm_head"], device="cpu")
    out = str(tmp_path / "saved")
    model.save_pretrained(out)
    assert layout_of(out) == ("quark", {"quark-mxfp4"}, {True}, False)
    with nibble.open_checkpoint(out) as ck:
        g = ck.moe_group("model.layers.1.mlp.experts")
        assert g.fused and g.activation == "swiglu_oai" and g.gate_up_layout == "interleaved"
        assert ck.moe_bias_names(g)[1][3] == "model.layers.1.mlp.experts.3.down_proj.bias"
    with ntf.override("quark"):
        again = AutoModelForCausalLM.from_pretrained(out)
    assert_same_experts(model, again)
    assert_same_linears(model, again)


def test_gptoss_bf16_checkpoint_quantized_by_the_c_writer(bf16, tmp_path):
    """`nibble quantize --format mxfp4` (quantize_checkpoint) of a BF16
    gpt-oss checkpoint writes gpt-oss's own layout: the experts as *_blocks /
    *_scales, the linear layers still BF16; loaded back, each experts module
    holds exactly the bytes MoeExperts.from_module gives the BF16 weights
    (quantization at load), and the biases are the checkpoint's."""
    out = str(tmp_path / "gptoss-mxfp4")
    summary = nibble.quantize_checkpoint(bf16["gpt_oss"]["path"], out, format="mxfp4", device="cpu")
    assert summary["experts_quantized"] == 4 and summary["layers_quantized"] == 4
    assert layout_of(out) == ("mxfp4", {"gptoss-mxfp4"}, {False}, False)
    with open(os.path.join(out, "config.json")) as f:
        qc = json.load(f)["quantization_config"]
    assert "model.layers.0.self_attn.q_proj" in qc["modules_to_not_convert"]
    assert not any("experts" in m for m in qc["modules_to_not_convert"])
    model = AutoModelForCausalLM.from_pretrained(out, quantization_config=NibbleConfig())
    assert isinstance(model.model.layers[0].self_attn.q_proj, torch.nn.Linear)
    ref = AutoModelForCausalLM.from_pretrained(bf16["gpt_oss"]["path"], quantization_config=NibbleConfig(
        format="mxfp4", modules_to_not_convert=["*self_attn*", "*router*", "lm_head"]))
    assert_same_experts(model, ref)


# ----------------------------------------------------------------- refusals

def test_save_refuses_two_formats(bf16, tmp_path):
    model = AutoModelForCausalLM.from_pretrained(bf16["qwen3_moe"]["path"], quantization_config=NibbleConfig(format="nvfp4"))
    ref = bf16["qwen3_moe"]["model"]
    model.model.layers[1].mlp.experts = nt.MoeExperts.from_module(ref.model.layers[1].mlp.experts, format="mxfp4",
                                                                  device="cpu")
    with pytest.raises(ValueError, match="one layout.*mxfp4, nvfp4"):
        model.save_pretrained(str(tmp_path / "x"))
    assert not os.path.exists(tmp_path / "x" / "model.safetensors")


def test_experts_tensors_refusals(bf16):
    ref = bf16["gpt_oss"]["model"].model.layers[0].mlp.experts
    ex = nt.MoeExperts.from_module(ref, format="nvfp4", device="cpu")
    qm = ex.quantized_moe()
    with pytest.raises(ValueError, match="gpt-oss layout holds MXFP4"):
        ntf.experts_tensors("e", qm, "gptoss", "gpt_oss", ex.gate_up_proj_bias, ex.down_proj_bias)
    with pytest.raises(ValueError, match="model_type 'gpt_oss'; this model's is 'llama'"):
        ntf.experts_tensors("e", qm, "per-expert", "llama", ex.gate_up_proj_bias, ex.down_proj_bias)
    with pytest.raises(ValueError, match="unknown experts layout"):
        ntf.experts_tensors("e", qm, "dense", "gpt_oss")
    with pytest.raises(ValueError, match="one bias of two"):
        ntf.experts_tensors("e", qm, "per-expert", "gpt_oss", ex.gate_up_proj_bias, None)
    t = ntf.experts_tensors("e", qm, "per-expert", "gpt_oss", ex.gate_up_proj_bias, ex.down_proj_bias)
    assert len(t) == 4 * (2 * 3 + 2)    # 4 experts x (2 layers x weight, weight_scale, weight_scale_2 + 2 biases)
    np.testing.assert_array_equal(t["e.2.gate_up_proj.weight"].numpy(), qm.gate_up.codes[2])
    assert t["e.2.down_proj.weight_scale_2"].item() == qm.down.tensor_scales[2]


def test_half_a_set_of_per_expert_biases_is_refused(gptoss, tmp_path):
    from safetensors.torch import load_file, save_file
    model = AutoModelForCausalLM.from_pretrained(gptoss["path"], quantization_config=NibbleConfig())
    nt.quantize_model(model, format="mxfp4", exclude=["lm_head"], device="cpu")
    out = str(tmp_path / "saved")
    model.save_pretrained(out)
    f = os.path.join(out, "model.safetensors")
    tensors = load_file(f)
    del tensors["model.layers.0.mlp.experts.2.down_proj.bias"]
    save_file(tensors, f, metadata={"format": "pt"})
    with nibble.open_checkpoint(out) as ck:
        with pytest.raises(nibble.Error, match="experts.2.down_proj.bias"):
            ck.moe("model.layers.0.mlp.experts")
    with ntf.override("quark"), pytest.raises(nibble.Error, match="experts.2.down_proj.bias"):
        AutoModelForCausalLM.from_pretrained(out)
