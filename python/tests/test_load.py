"""Tests of checkpoint loading into PyTorch models (nibble.torch.load_quantized,
Linear.from_checkpoint_tensors, dequantize_weight) and of quantize_model's
threaded host path.

Skipped without torch; the Hugging Face tests without transformers; the GPU
tests without CUDA.  Checkpoints come from a tiny LlamaForCausalLM written as
BF16 safetensors and quantized by nibble.quantize_checkpoint (ModelOpt NVFP4,
Quark MXFP4), or rewritten into the compressed-tensors layout.

On the CPU, load_quantized(dequantize=True) must give every quantized layer
exactly nibble.dequantize of the checkpoint's codes and scales and every
other tensor its checkpoint value; on a GPU, load_quantized() must give
nibble.torch.Linear layers whose greedy generation equals that of the
dequantized model.
"""

import json
import os

import numpy as np
import pytest

torch = pytest.importorskip("torch")

import nibble  # noqa: E402
import nibble.torch as nt  # noqa: E402
from nibble import _lib  # noqa: E402

from test_checkpoint import write_safetensors  # noqa: E402

try:
    _lib.io_lib()
    HAS_IO = True
except ImportError:
    HAS_IO = False
io = pytest.mark.skipif(not HAS_IO, reason="no checkpoint API (package built without cJSON)")
HAS_GPU = torch.cuda.is_available() and nibble.build_info()["cuda"] and nibble.device_count() > 0
gpu = pytest.mark.skipif(not HAS_GPU, reason="needs a CUDA device and libnibble built with CUDA")

try:
    import transformers  # noqa: F401
    HAS_TF = True
except ImportError:
    HAS_TF = False
hf = pytest.mark.skipif(not HAS_TF, reason="needs transformers")


def tiny_config(tie=True, **change):
    from transformers import LlamaConfig
    shape = dict(vocab_size=256, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                 num_key_value_heads=2)
    shape.update(change)
    return LlamaConfig(max_position_embeddings=128, tie_word_embeddings=tie, bos_token_id=1, eos_token_id=2, **shape)


def bf16_bits(t):
    return t.detach().contiguous().view(torch.int16).numpy().view(np.uint16)


def write_model(model, d, drop=(), extra=None):
    """The model's state_dict as a BF16 checkpoint in directory d (tied
    lm_head.weight left out, as transformers saves it)."""
    os.makedirs(d, exist_ok=True)
    sd = model.state_dict()
    tensors = {}
    for k, v in sd.items():
        if k in drop or (k == "lm_head.weight" and model.config.tie_word_embeddings):
            continue
        tensors[k] = ("BF16", bf16_bits(v.to(torch.bfloat16)))
    tensors.update(extra or {})
    write_safetensors(os.path.join(d, "model.safetensors"), tensors)
    model.config.save_pretrained(d)


def write_quantized_checkpoint(ref, d, layer, quantization_config, seed=0, edit=None):
    """ref's state_dict with every linear layer of its decoder written by
    `layer(w float32 [n, k], rng)` -> ({suffix: (dtype, array)} under the
    layer's prefix, dense float32 weight), everything else in BF16 (the tied
    lm_head left out), and config.json with `quantization_config`; edit, if
    given, is called with the tensors before they are written.  Returns
    {prefix: dense float32 weight} (test_int4.py and test_bnb.py write
    their checkpoints with it)."""
    os.makedirs(d, exist_ok=True)
    rng = np.random.default_rng(seed)
    tensors, dense = {}, {}
    for name, t in ref.state_dict().items():
        prefix = name[:-len(".weight")]
        if name.endswith(".weight") and t.dim() == 2 and ".layers." in name:
            parts, dense[prefix] = layer(t.float().numpy(), rng)
            tensors.update({f"{prefix}.{k}": v for k, v in parts.items()})
        elif not (name == "lm_head.weight" and ref.config.tie_word_embeddings):
            tensors[name] = ("BF16", bf16_bits(t.to(torch.bfloat16)))
    if edit is not None:
        edit(tensors)
    write_safetensors(os.path.join(d, "model.safetensors"), tensors)
    ref.config.save_pretrained(d)
    with open(os.path.join(d, "config.json")) as f:
        cfg = json.load(f)
    cfg["quantization_config"] = quantization_config
    with open(os.path.join(d, "config.json"), "w") as f:
        json.dump(cfg, f)
    return dense


def checkpoint_set(tmp_path_factory, name, write, keys):
    """A module's checkpoints of reference_model(): {"ref": the model, key:
    (directory, write(ref, directory, key))} for each key, under a fresh
    directory `name`; skipped without the checkpoint API or transformers."""
    if not (HAS_IO and HAS_TF):
        pytest.skip("needs the checkpoint API and transformers")
    ref = reference_model()
    base = tmp_path_factory.mktemp(name)
    out = {"ref": ref}
    for key in keys:
        d = str(base / (key if isinstance(key, str) else "-".join(map(str, key))))
        out[key] = (d, write(ref, d, key))
    return out


def reference_model(tie=True, seed=0):
    from transformers import LlamaForCausalLM
    torch.manual_seed(seed)
    m = LlamaForCausalLM(tiny_config(tie))
    with torch.no_grad():   # larger weights than the default init: decisive greedy choices
        for p in m.parameters():
            if p.dim() == 2:
                p.mul_(4)
    return m.to(torch.bfloat16).eval()


def meta_model(tie=True, **change):
    from transformers import LlamaForCausalLM
    with torch.device("meta"):
        return LlamaForCausalLM(tiny_config(tie, **change))


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory):
    base = tmp_path_factory.mktemp("ckpt")
    ref = reference_model()
    write_model(ref, str(base / "bf16"))
    out = {"bf16": str(base / "bf16"), "ref": ref}
    for fmt in ("nvfp4", "mxfp4"):
        out[fmt] = str(base / fmt)
        nibble.quantize_checkpoint(out["bf16"], out[fmt], format=fmt)
    return out


# -------------------------------------------------------- no GPU needed

def test_host_array_keeps_bf16_bits_and_codes():
    """quantize_model sends bfloat16 weights to the host as their 16-bit
    patterns; the codes equal those of a float32 copy."""
    w = (torch.randn(32, 64) * 0.1).to(torch.bfloat16)
    a = nt._host_array(w)
    assert a.dtype == np.uint16 and a.shape == (32, 64)
    for fmt in ("nvfp4", "mxfp4"):
        q1, q2 = nibble.quantize(a, format=fmt), nibble.quantize(w.float().numpy(), format=fmt)
        np.testing.assert_array_equal(q1.codes, q2.codes)
        np.testing.assert_array_equal(q1.scales, q2.scales)
        assert q1.tensor_scale == q2.tensor_scale


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32])
def test_dequantize_weight_cpu_matches_numpy(dtype):
    qw = nibble.quantize(np.random.default_rng(0).standard_normal((16, 64)).astype(np.float32), format="nvfp4")
    t = nt.dequantize_weight(qw, dtype)
    assert t.dtype == dtype and t.shape == (16, 64) and t.device.type == "cpu"
    np.testing.assert_array_equal(t.float().numpy(), nibble.dequantize(qw).astype(np.float32).astype(
        np.float16 if dtype == torch.float16 else np.float32) if dtype != torch.bfloat16 else
        nibble.from_bf16(nibble.dequantize(qw, "bfloat16")))
    with pytest.raises(TypeError):
        nt.dequantize_weight(qw, torch.int8)
    with pytest.raises(TypeError):
        nt.dequantize_weight(qw.codes)


def test_from_checkpoint_tensors_argument_errors():
    codes = np.zeros((8, 32), np.uint8)                              # k = 64
    with pytest.raises(ValueError, match="fit neither"):
        nt.Linear.from_checkpoint_tensors(codes, np.zeros((8, 3), np.uint8), 1.0)
    with pytest.raises(ValueError, match="needs weight_scale"):
        nt.Linear.from_checkpoint_tensors(codes, np.zeros((8, 2), np.uint8), 1.0, format="nvfp4")
    with pytest.raises(ValueError, match="same number of rows"):
        nt.Linear.from_checkpoint_tensors(codes, np.zeros((9, 4), np.uint8), 1.0)
    with pytest.raises(ValueError, match="needs weight_scale_2"):
        nt.Linear.from_checkpoint_tensors(codes, np.zeros((8, 4), np.uint8))
    with pytest.raises(ValueError, match="no tensor scale"):
        nt.Linear.from_checkpoint_tensors(codes, np.zeros((8, 2), np.uint8), 0.5)
    with pytest.raises(TypeError, match="uint8"):
        nt.Linear.from_checkpoint_tensors(codes.astype(np.int32), np.zeros((8, 4), np.uint8), 1.0)
    with pytest.raises(TypeError):
        nt.Linear.from_checkpoint_tensors(torch.zeros(8, 32), np.zeros((8, 4), np.uint8), 1.0)
    with pytest.raises(ValueError, match="one value"):
        nt.Linear.from_checkpoint_tensors(codes, np.zeros((8, 4), np.uint8), torch.ones(2))


def test_quantize_model_threads_argument():
    m = torch.nn.Sequential(torch.nn.Linear(32, 8))
    with pytest.raises(ValueError, match="threads"):
        nt.quantize_model(m, threads=0)
    with torch.device("meta"):
        mm = torch.nn.Sequential(torch.nn.Linear(32, 8), torch.nn.Linear(8, 8))
    with pytest.raises(ValueError, match="meta"):
        nt.quantize_model(mm, exclude=())


@io
@hf
@pytest.mark.parametrize("fmt", ["nvfp4", "mxfp4"])
def test_load_dequantized_on_cpu_is_exact(checkpoints, fmt):
    model = meta_model()
    rep = nt.load_quantized(model, checkpoints[fmt], dequantize=True, dtype=torch.bfloat16)
    assert len(rep["quantized"]) == 14 and not rep["missing"] and not rep["unexpected"] and not rep["meta"]
    assert set(rep["quantized"].values()) == {"modelopt-nvfp4" if fmt == "nvfp4" else "quark-mxfp4"}
    assert model.lm_head.weight is model.model.embed_tokens.weight                     # still tied
    assert not any(t.is_meta for t in list(model.parameters()) + list(model.buffers()))
    with nibble.open_checkpoint(checkpoints[fmt]) as ck:
        for prefix in rep["quantized"]:
            want = nibble.dequantize(ck.quantized_weight(prefix), "bfloat16")
            np.testing.assert_array_equal(bf16_bits(model.get_submodule(prefix).weight), want)
    ref = checkpoints["ref"]
    for name in ("model.embed_tokens.weight", "model.norm.weight", "model.layers.1.input_layernorm.weight"):
        assert torch.equal(model.get_parameter(name), ref.get_parameter(name))
    torch.testing.assert_close(model.model.rotary_emb.inv_freq, ref.model.rotary_emb.inv_freq.float(),
                               rtol=1e-2, atol=0)
    # the dequantized model is close to the BF16 one: same first greedy token on most prompts
    ids = torch.tensor([[1, 17, 33, 99, 5]])
    with torch.no_grad():
        out = model(ids).logits.float()
        base = ref(ids).logits.float()
    rel = ((out - base).norm() / base.norm()).item()
    assert rel < 0.5, rel


@io
@hf
def test_load_into_cpu_model_and_untied(tmp_path):
    ref = reference_model(tie=False, seed=1)
    write_model(ref, str(tmp_path / "bf16"))
    nibble.quantize_checkpoint(str(tmp_path / "bf16"), str(tmp_path / "q"), format="nvfp4")
    from transformers import LlamaForCausalLM
    model = LlamaForCausalLM(tiny_config(tie=False)).to(torch.bfloat16)         # real (random) CPU tensors
    rep = nt.load_quantized(model, str(tmp_path / "q"), dequantize=True)
    assert not rep["missing"] and "lm_head.weight" in rep["loaded"]
    assert torch.equal(model.lm_head.weight, ref.lm_head.weight)
    assert model.lm_head.weight is not model.model.embed_tokens.weight


@io
@hf
def test_load_reports_missing_unexpected_ignored_and_shapes(tmp_path, checkpoints):
    ref = checkpoints["ref"]
    extra = {"model.layers.0.self_attn.k_proj.k_scale": ("F32", np.array(1.0, np.float32)),
             "model.extra.weight": ("BF16", np.zeros((4,), np.uint16))}
    write_model(ref, str(tmp_path / "bf16"), drop=("model.layers.1.post_attention_layernorm.weight",), extra=extra)
    nibble.quantize_checkpoint(str(tmp_path / "bf16"), str(tmp_path / "q"), format="mxfp4")
    with pytest.raises(ValueError) as e:
        nt.load_quantized(meta_model(), str(tmp_path / "q"), dequantize=True)
    msg = str(e.value)
    assert "model.layers.1.post_attention_layernorm.weight" in msg and "model.extra.weight" in msg
    assert "k_scale" not in msg and "strict=False" in msg
    model = meta_model()
    rep = nt.load_quantized(model, str(tmp_path / "q"), dequantize=True, strict=False)
    assert rep["missing"] == ["model.layers.1.post_attention_layernorm.weight"]
    assert rep["unexpected"] == ["model.extra.weight"]
    assert rep["ignored"] == ["model.layers.0.self_attn.k_proj.k_scale"]
    assert model.model.layers[1].post_attention_layernorm.weight.is_meta           # left alone

    # a model of another shape: the quantized layer's shape is checked first;
    # then an unquantized tensor of the wrong shape
    for change, match in ((dict(intermediate_size=96), "mlp.*96"), (dict(vocab_size=300), "embed_tokens.*shape")):
        with pytest.raises(ValueError, match=match):
            nt.load_quantized(meta_model(**change), checkpoints["nvfp4"], dequantize=True)


@io
@hf
def test_load_argument_errors(checkpoints):
    with pytest.raises(TypeError):
        nt.load_quantized(object(), checkpoints["nvfp4"], dequantize=True)
    with pytest.raises(TypeError, match="floating-point"):
        nt.load_quantized(meta_model(), checkpoints["nvfp4"], dequantize=True, dtype=torch.int8)
    with pytest.raises(ValueError, match="CUDA devices only"):
        nt.load_quantized(meta_model(), checkpoints["nvfp4"], device="cpu")
    with pytest.raises(nibble.Error):
        nt.load_quantized(meta_model(), checkpoints["nvfp4"] + "-absent", dequantize=True)
    # a module that is not a Linear where the checkpoint has a quantized layer
    model = meta_model()
    model.model.layers[0].mlp.down_proj = torch.nn.Identity()
    with pytest.raises(ValueError, match="not an nn.Linear"):
        nt.load_quantized(model, checkpoints["nvfp4"], dequantize=True)


def write_8bit_without_format(d, layout):
    """A one-layer checkpoint (model.layers.0.mlp.down_proj, 64 x 128) in an
    8-bit layout no nibble format holds, which the reader marks
    inconsistent: "ct-asym" compressed-tensors pack-quantized 8-bit with
    zero points, "gptq" asymmetric GPTQ 8-bit (zero points other than 128;
    symmetric GPTQ 8-bit loads onto int8: test_int4.py).
    Returns the reason the reader gives."""
    n, k = 64, 128
    P = "model.layers.0.mlp.down_proj"
    os.makedirs(d, exist_ok=True)
    if layout == "ct-asym":
        write_safetensors(os.path.join(d, "model.safetensors"), {
            f"{P}.weight_packed": ("I32", np.zeros((n, k // 4), np.int32)),
            f"{P}.weight_scale": ("BF16", np.full((n, 1), 0x3F80, np.uint16)),
            f"{P}.weight_zero_point": ("I32", np.zeros((n // 8, 1), np.int32)),
            f"{P}.weight_shape": ("I64", np.array([n, k], np.int64))})
        return "asymmetric 8-bit weights: no format holds them"
    write_safetensors(os.path.join(d, "model.safetensors"), {
        f"{P}.qweight": ("I32", np.zeros((k // 4, n), np.int32)),
        f"{P}.qzeros": ("I32", np.zeros((1, n // 4), np.int32)),
        f"{P}.scales": ("F16", np.ones((1, n), np.float16))})
    with open(os.path.join(d, "config.json"), "w") as f:
        json.dump({"quantization_config": {"quant_method": "gptq", "bits": 8, "group_size": -1, "sym": False}}, f)
    return "asymmetric 8-bit GPTQ (zero point 1 at group 0, column 0)"


@io
@hf
@pytest.mark.parametrize("layout", ["ct-asym", "gptq"])
def test_load_refuses_8bit_layouts_without_a_format(tmp_path, layout):
    """8-bit layers no nibble format holds (compressed-tensors asymmetric,
    asymmetric GPTQ 8-bit) are refused by name with the reader's reason;
    nothing slower runs in their place.  (Symmetric compressed-tensors and
    GPTQ int8 load onto the int8 kernels: test_int4.py.)"""
    why = write_8bit_without_format(str(tmp_path), layout)
    for dq in (True, False):
        with pytest.raises(nibble.Error) as e:  # (an explicit device: no CUDA call before the refusal)
            nt.load_quantized(meta_model(), str(tmp_path), dequantize=dq, device="cpu" if dq else "cuda:0",
                              strict=False)
        assert e.value.status == nibble.Status.ERR_CORRUPT
        assert "model.layers.0.mlp.down_proj" in e.value.message and why in e.value.message, e.value.message


@io
@hf
def test_load_compressed_tensors_layout(tmp_path, checkpoints):
    """The ModelOpt checkpoint rewritten as compressed-tensors nvfp4
    (weight_packed, weight_global_scale = 1 / weight_scale_2) loads to the
    same weights."""
    with nibble.open_checkpoint(checkpoints["nvfp4"]) as ck:
        tensors = {}
        for t in ck.tensors:
            a = ck.tensor(t.name)
            name = t.name
            if t.layer and ck.layer(t.layer).quant_format:
                if name.endswith(".weight"):
                    name = name[:-len(".weight")] + ".weight_packed"
                elif name.endswith(".weight_scale_2"):
                    name = name[:-len(".weight_scale_2")] + ".weight_global_scale"
                    a = (np.float32(1) / a.reshape(1)).astype(np.float32)
            tensors[name] = (t.dtype, a)
    os.makedirs(tmp_path / "ct")
    write_safetensors(str(tmp_path / "ct" / "model.safetensors"), tensors)
    a, b = meta_model(), meta_model()
    rep = nt.load_quantized(a, str(tmp_path / "ct"), dequantize=True)
    assert set(rep["quantized"].values()) == {"ct-nvfp4"}
    nt.load_quantized(b, checkpoints["nvfp4"], dequantize=True)
    for prefix in rep["quantized"]:
        wa, wb = a.get_submodule(prefix).weight, b.get_submodule(prefix).weight
        # 1 / (1 / s) may differ from s in the last bit: compare to within that
        torch.testing.assert_close(wa.float(), wb.float(), rtol=2 ** -7, atol=0)


# ---------------------------------------------------------------- GPU

@gpu
@pytest.mark.parametrize("fmt", ["nvfp4", "mxfp4"])
def test_dequantize_weight_gpu_bit_exact(fmt):
    qw = nibble.quantize(np.random.default_rng(3).standard_normal((72, 256)).astype(np.float32), format=fmt)
    for dtype in (torch.bfloat16, torch.float16, torch.float32):
        g = nt.dequantize_weight(qw, dtype, "cuda")
        c = nt.dequantize_weight(qw, dtype, "cpu")
        assert g.device.type == "cuda" and torch.equal(g.cpu(), c)


@gpu
def test_from_checkpoint_tensors_equals_from_quantized():
    w = np.random.default_rng(4).standard_normal((80, 128)).astype(np.float32)
    for fmt in ("nvfp4", "mxfp4"):
        qw = nibble.quantize(w, format=fmt)
        a = nt.Linear.from_quantized(qw)
        scales = torch.from_numpy(qw.scales)
        if fmt == "nvfp4" and hasattr(torch, "float8_e4m3fn"):
            scales = scales.view(torch.float8_e4m3fn)                  # as safetensors loads F8_E4M3
        b = nt.Linear.from_checkpoint_tensors(torch.from_numpy(qw.codes).cuda(), scales,
                                              torch.tensor(qw.tensor_scale) if fmt == "nvfp4" else None)
        assert b.format == fmt and torch.equal(a.packed, b.packed)
        x = torch.randn(3, 128, dtype=torch.bfloat16, device="cuda")
        assert torch.equal(a(x), b(x))


@gpu
def test_quantize_model_threads_give_the_same_packed_weights():
    torch.manual_seed(0)
    m = torch.nn.Sequential(*[torch.nn.Linear(128, 96) for _ in range(5)]).to(torch.bfloat16).cuda()
    m2 = torch.nn.Sequential(*[torch.nn.Linear(128, 96) for _ in range(5)]).to(torch.bfloat16).cuda()
    m2.load_state_dict(m.state_dict())
    r1 = nt.quantize_model(m, format="nvfp4", exclude=(), threads=1, return_weights=True)
    nt.quantize_model(m2, format="nvfp4", exclude=(), threads=4)
    assert len(r1["weights"]) == 5
    for a, b in zip(m, m2):
        assert isinstance(a, nt.Linear) and torch.equal(a.packed, b.packed)


@io
@hf
@gpu
@pytest.mark.parametrize("fmt", ["nvfp4", "mxfp4"])
def test_load_quantized_gpu_generation_equals_dequantized(checkpoints, fmt):
    model = assert_load_agrees_with_dequantized(checkpoints[fmt], 14, fmt)
    assert all(t.device.type == "cuda" for t in list(model.parameters()) + list(model.buffers()))


def assert_load_agrees_with_dequantized(path, n_layers, fmt=None):
    """load_quantized of checkpoint `path` into the tiny Llama on the GPU
    (n_layers nibble layers, of `fmt` if given, nothing missing or
    unexpected) generating as load_quantized(dequantize=True) of the same
    checkpoint; returns the nibble model (test_int4.py and test_bnb.py use
    it too)."""
    model = meta_model()
    rep = nt.load_quantized(model, path, dtype=torch.bfloat16)
    assert not rep["missing"] and not rep["unexpected"]
    layers = [m for m in model.modules() if isinstance(m, nt.Linear)]
    assert len(layers) == n_layers and all(m.packed.is_cuda for m in layers)
    assert fmt is None or all(m.format == fmt for m in layers)
    ref = meta_model()
    nt.load_quantized(ref, path, dequantize=True, device="cuda", dtype=torch.bfloat16)
    assert_generation_agrees(model, ref)
    return model


def assert_generation_agrees(model, ref):
    """Greedy generation of a nibble model (CUDA) against its dequantized
    twin `ref`, and their logits (test_transformers.py uses it too)."""
    ids = torch.tensor([[1, 17, 33, 99, 5], [1, 4, 8, 15, 16]], device="cuda")
    kw = dict(max_new_tokens=12, do_sample=False, eos_token_id=None, pad_token_id=0)
    with torch.no_grad():
        a = model.generate(ids, **kw)
        b = ref.generate(ids, output_logits=True, return_dict_in_generate=True, **kw)
        la, lb = model(ids).logits.float(), ref(ids).logits.float()
    # Both models round every linear output to BF16, in a different order of
    # summation, so a greedy choice whose top-2 logits lie closer than that
    # noise (0.02 here, logits spanning about 5) may go either way: tokens must
    # agree up to the first such step. A random model may meet one early, so
    # the whole of the reference's sequence is also fed to both models
    # (teacher forcing): their choices must agree at every position the
    # reference decides by more than the noise, and their logits must be close.
    margins = [(t.float().topk(2).values[:, 0] - t.float().topk(2).values[:, 1]).min().item() for t in b.logits]
    sure = next((i for i, mg in enumerate(margins) if mg < 0.02), len(margins))
    P = ids.shape[1]
    assert torch.equal(a[:, :P + sure], b.sequences[:, :P + sure]), (a, b.sequences, margins)
    with torch.no_grad():
        fa, fb = model(b.sequences).logits.float(), ref(b.sequences).logits.float()
    top2 = fb.topk(2, dim=-1).values
    clear = (top2[..., 0] - top2[..., 1]) >= 0.02
    assert clear.sum().item() >= clear.numel() // 2, "the reference decides too few positions clearly"
    assert torch.equal(fa.argmax(-1)[clear], fb.argmax(-1)[clear])
    assert ((fa - fb).norm() / fb.norm()).item() < 2 ** -6
    assert ((la - lb).norm() / lb.norm()).item() < 2 ** -6


@io
@hf
@gpu
def test_load_quantized_gpu_then_decode_benchmark_plumbing(checkpoints):
    """load_quantized output runs under a CUDA graph (the e2e benchmark's
    capture path) and replays to the same tokens as eager steps."""
    import sys
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "bench"))
    import e2e_decode as e2e
    model = meta_model()
    nt.load_quantized(model, checkpoints["nvfp4"], dtype=torch.bfloat16)
    prompt = torch.tensor([[1, 17, 33, 99, 5]], device="cuda")
    tokens, _ = e2e.greedy(model, prompt, 8)
    with torch.no_grad():
        dec = e2e.Decoder(model, 1, 32)
        dec.prefill(prompt)
        t = e2e.Timer(dec.step, torch.device("cuda"), graph=True)
        assert t.graph is not None, t.note
        dec.prefill(prompt)
        for _ in range(8):
            t.run()
        torch.cuda.synchronize()
    assert torch.equal(dec.hist[:, 5:14].cpu(), tokens)
