"""Tests of bitsandbytes' 4-bit formats (nf4, bnb_fp4) in nibble.torch and
nibble.transformers: loading bitsandbytes-serialized checkpoints
(load_quantized, from_pretrained with NibbleConfig()), quantizing at load
(NibbleConfig(format="nf4")) and quantize_model(format="nf4").

The checkpoints are written here in numpy as transformers saves a model
whose linear layers are bitsandbytes Linear4bit (Params4bit.
_save_to_state_dict, QuantState.as_dict(packed=True)): P.weight U8
[n*k/2, 1] (the tensor flattened row-major, the first element of a pair in
the high nibble), P.weight.absmax F32 [n*k/B] or, with double quantization,
U8 codes with P.weight.nested_absmax F32 [ceil(blocks/256)] and
P.weight.nested_quant_map F32 [256], P.weight.quant_map F32 [16] (the
format's table), and P.weight.quant_state.bitsandbytes__nf4 (or __fp4), the
JSON of the quant state as U8 bytes; config.json carries BitsAndBytesConfig's
quantization_config.  The codes are the nearest table values of random
weights; the nested map is stored in the file and read as stored, so a
linear map of 256 values serves (bitsandbytes writes its dynamic map).

Without a GPU: load_quantized(dequantize=True) bit for bit equal to the
format's dequantization written out here (table[code] * absmax in float32,
a nested absmax fl(fl(map[a] * nested_absmax) + offset) as bitsandbytes
computes it), the packed bytes of from_pretrained(NibbleConfig()) equal to
nibble.pack of the reader's weight, the op's CPU path equal to the host
reference bit for bit and the CPU model to its dequantized twin in float32
(summation order only), quantization at load and quantize_model equal to
nibble.quantize, refusals.  On a GPU (skipped without one): the op against
float64 within the bound of DESIGN.md 4.2.2, loaded checkpoints and a model
quantized at load generating as their dequantized twins.

Against bitsandbytes itself (skipped when it does not import; its CPU
backend needs no GPU): checkpoints bitsandbytes quantized and serialized
(quantize_4bit, QuantState.as_dict(packed=True)) load bit for bit as its
own dequantize_4bit, and nibble.quantize gives bitsandbytes' absmax and
codes (0 of 2,097,152 codes differed in a 512 x 4096 trial, nf4 and fp4).
"""

import json
import os

import numpy as np
import pytest

torch = pytest.importorskip("torch")

import nibble  # noqa: E402
import nibble.torch as nt  # noqa: E402
from test_basic import BNB_FP4, NF4  # noqa: E402
from test_load import gpu, hf, io  # noqa: E402  (the same skip rules)
from test_torch import EPS, _x, check_gemm_against_float64  # noqa: E402

TABLE = {"nf4": NF4, "fp4": BNB_FP4}
FORMAT = {"nf4": "nf4", "fp4": "bnb_fp4"}
NESTED_BLOCK = 256   # bitsandbytes' blocksize of the absmax's own quantization
# (quant_type, blocksize, double quantization): blocks dividing the tiny model's k = 64 and 128
CASES = [("nf4", 64, False), ("nf4", 64, True), ("fp4", 32, True), ("fp4", 64, False)]


def _rel(a, b):
    return float(np.linalg.norm(np.asarray(a, np.float64) - b) / np.linalg.norm(np.asarray(b, np.float64)))


# ---------------------------------------------- the checkpoint writer

def bnb_layer(w, quant_type, B, nested):
    """One linear layer's weight W[n, k] (float32) in bitsandbytes'
    serialization: ({suffix: (dtype, array)} under the layer's prefix, the
    dense float32 weight the format's dequantization gives)."""
    n, k = w.shape
    table = TABLE[quant_type]
    flat = w.reshape(-1, B)
    absmax = np.abs(flat).max(axis=1).astype(np.float32)
    state = {"quant_type": quant_type, "blocksize": B, "dtype": "bfloat16", "shape": [n, k]}
    t = {"weight.quant_map": ("F32", table.copy())}
    if nested:   # double quantization: absmax - mean in 8-bit codes per block of 256, plus the offset
        offset = np.float32(absmax.mean())
        nblocks = -(-absmax.size // NESTED_BLOCK)
        centred = absmax - offset
        pad = np.zeros(nblocks * NESTED_BLOCK, np.float32)
        pad[:absmax.size] = np.abs(centred)
        nabs = pad.reshape(nblocks, NESTED_BLOCK).max(axis=1).astype(np.float32)
        nmap = np.linspace(-1, 1, 256, dtype=np.float32)
        idx = np.arange(absmax.size) // NESTED_BLOCK
        a8 = np.abs(centred[:, None] / nabs[idx, None] - nmap[None, :]).argmin(axis=1).astype(np.uint8)
        absmax = (nmap[a8] * nabs[idx]).astype(np.float32) + offset   # bitsandbytes' float32 arithmetic
        t.update({"weight.absmax": ("U8", a8), "weight.nested_absmax": ("F32", nabs),
                  "weight.nested_quant_map": ("F32", nmap)})
        state.update(nested_blocksize=NESTED_BLOCK, nested_dtype="float32", nested_offset=float(offset))
    else:
        t["weight.absmax"] = ("F32", absmax)
    scaled = flat / np.where(absmax == 0, 1, absmax)[:, None]
    codes = np.abs(scaled.reshape(-1)[:, None] - table[None, :]).argmin(axis=1).astype(np.uint8)
    t["weight"] = ("U8", ((codes[0::2] << 4) | codes[1::2]).astype(np.uint8).reshape(-1, 1))
    t[f"weight.quant_state.bitsandbytes__{quant_type}"] = ("U8", np.frombuffer(json.dumps(state).encode(), np.uint8))
    dense = (table[codes].reshape(-1, B) * absmax[:, None]).astype(np.float32).reshape(n, k)
    return t, dense


def bnb_config(quant_type, nested):
    """config.json's quantization_config as transformers' BitsAndBytesConfig
    writes it for a 4-bit model."""
    return {"quant_method": "bitsandbytes", "_load_in_4bit": True, "_load_in_8bit": False, "load_in_4bit": True,
            "load_in_8bit": False, "bnb_4bit_quant_type": quant_type, "bnb_4bit_use_double_quant": nested,
            "bnb_4bit_compute_dtype": "bfloat16", "bnb_4bit_quant_storage": "uint8", "llm_int8_threshold": 6.0,
            "llm_int8_skip_modules": None, "llm_int8_enable_fp32_cpu_offload": False,
            "llm_int8_has_fp16_weight": False}


def write_bnb_checkpoint(ref, d, quant_type, B, nested, seed=0, config=None, edit=None):
    """ref's state_dict with every linear layer of its decoder serialized by
    bitsandbytes (embeddings, norms and the tied head in BF16, as
    transformers leaves them); returns {prefix: dense float32 weight}.
    config: another quantization_config; edit: called with the tensors
    before they are written (to damage one)."""
    from test_load import write_quantized_checkpoint
    return write_quantized_checkpoint(ref, d, lambda w, rng: bnb_layer(w, quant_type, B, nested),
                                      config or bnb_config(quant_type, nested), seed, edit)


def _case_id(case):
    return f"{case[0]}-b{case[1]}" + ("-nested" if case[2] else "")


@pytest.fixture(scope="module")
def bnb_ckpts(tmp_path_factory):
    from test_load import checkpoint_set
    return checkpoint_set(tmp_path_factory, "bnb", lambda ref, d, case: write_bnb_checkpoint(ref, d, *case), CASES)


# ------------------------------------------------- no GPU needed

@io
@hf
@pytest.mark.parametrize("case", CASES, ids=_case_id)
def test_load_dequantized_bnb_is_exact(bnb_ckpts, case):
    """load_quantized(dequantize=True) gives every layer exactly
    table[code] * absmax (float32; with BF16 the same rounded once), plain
    and nested absmax alike; the reader's weight keeps bitsandbytes' block
    as its group, packs and unpacks unchanged."""
    from test_load import bf16_bits, meta_model
    path, dense = bnb_ckpts[case]
    quant_type, B, _ = case
    model = meta_model()
    rep = nt.load_quantized(model, path, dequantize=True, dtype=torch.float32)
    assert set(rep["quantized"]) == set(dense) and not rep["missing"] and not rep["unexpected"]
    assert set(rep["quantized"].values()) == {f"bnb-{quant_type}"}
    for prefix, want in dense.items():
        np.testing.assert_array_equal(model.get_submodule(prefix).weight.numpy(), want, err_msg=prefix)
    model16 = meta_model()
    nt.load_quantized(model16, path, dequantize=True, dtype=torch.bfloat16)
    for prefix, want in dense.items():
        np.testing.assert_array_equal(bf16_bits(model16.get_submodule(prefix).weight), nibble.to_bf16(want),
                                      err_msg=prefix)
    with nibble.open_checkpoint(path) as ck:
        L = ck.layer("model.layers.0.mlp.down_proj")
        assert ck.weight_layout(L) == {"format": FORMAT[quant_type], "n": L.n, "k": L.k,
                                       "group": None if B == 64 else B, "scale_type": None}   # None: the default
        qw = ck.quantized_weight(L)
        back = nibble.unpack(nibble.pack(qw))
        np.testing.assert_array_equal(back.codes, qw.codes)
        np.testing.assert_array_equal(back.scales, qw.scales)


@io
@hf
@pytest.mark.parametrize("case", CASES, ids=_case_id)
def test_transformers_bnb_on_the_cpu(bnb_ckpts, case):
    """from_pretrained(quantization_config=NibbleConfig()) of a
    bitsandbytes checkpoint: every decoder linear layer a nibble.torch.Linear
    of the checkpoint's format and block holding nibble.pack of the reader's
    weight, nothing missing or unexpected (absmax, quant_map, nested_* and
    quant_state are nibble's), the checkpoint's config kept as the source;
    a layer's CPU forward is the host reference bit for bit, and the model's
    logits the dequantized twin's in float32 up to the summation order."""
    from transformers import AutoModelForCausalLM
    from nibble.transformers import NibbleConfig
    path, dense = bnb_ckpts[case]
    quant_type, B, nested = case
    m, info = AutoModelForCausalLM.from_pretrained(path, quantization_config=NibbleConfig(), dtype=torch.float32,
                                                   output_loading_info=True)
    assert not info["missing_keys"] and not info["unexpected_keys"], info
    assert m.config.quantization_config.source["quant_method"] == "bitsandbytes"
    assert m.config.quantization_config.format == FORMAT[quant_type]
    layers = {name: mod for name, mod in m.named_modules() if isinstance(mod, nt.Linear)}
    assert set(layers) == set(dense)
    x = _x((3, 64), torch.float32, seed=3)
    with nibble.open_checkpoint(path) as ck:
        for prefix, mod in layers.items():
            assert mod.format == FORMAT[quant_type] and (mod.group or 64) == B and mod.packed.device.type == "cpu"
            qw = ck.quantized_weight(prefix)
            np.testing.assert_array_equal(mod.packed.numpy(), nibble.pack(qw).data, err_msg=prefix)
        q = layers["model.layers.1.self_attn.q_proj"]
        np.testing.assert_array_equal(q(x).numpy(), nibble.gemm_reference(
            x.numpy(), ck.quantized_weight("model.layers.1.self_attn.q_proj")))
    ref = AutoModelForCausalLM.from_pretrained(path, quantization_config=NibbleConfig(dequantize=True),
                                               dtype=torch.float32)
    for prefix, want in dense.items():
        np.testing.assert_array_equal(ref.get_submodule(prefix).weight.detach().numpy(), want, err_msg=prefix)
    ids = torch.tensor([[1, 17, 33, 99, 5]])
    with torch.no_grad():
        out, base = m(ids).logits, ref(ids).logits
    assert _rel(out.numpy(), base.numpy()) < 2.0 ** -16


# ------------------------------- against bitsandbytes itself (no GPU needed)

def _bitsandbytes():
    """bitsandbytes.functional when the package imports (its CPU backend
    quantizes and dequantizes 4-bit without a GPU); else the test skips."""
    pytest.importorskip("bitsandbytes", reason="bitsandbytes is not installed")
    import bitsandbytes.functional as F
    return F


def bnb_layer_by_bitsandbytes(w, quant_type, B, nested):
    """One linear layer quantized and serialized by bitsandbytes itself:
    quantize_4bit of W (float32) and QuantState.as_dict(packed=True), the
    tensors transformers saves for a Linear4bit, with bitsandbytes'
    dequantize_4bit as the dense weight (its dynamic 8-bit map and offset for
    the nested absmax included)."""
    F = _bitsandbytes()
    W = torch.from_numpy(np.ascontiguousarray(w, np.float32))
    q, st = F.quantize_4bit(W, blocksize=B, quant_type=quant_type, compress_statistics=nested,
                            quant_storage=torch.uint8)
    dt = {torch.float32: "F32", torch.uint8: "U8"}
    t = {"weight": ("U8", q.numpy())}
    t.update({f"weight.{k}": (dt[v.dtype], v.numpy()) for k, v in st.as_dict(packed=True).items()})
    return t, F.dequantize_4bit(q, st).float().numpy()


@io
@hf
@pytest.mark.parametrize("case", CASES, ids=_case_id)
def test_load_bitsandbytes_own_checkpoint_is_exact(tmp_path, case):
    """A checkpoint bitsandbytes quantized and serialized itself (not the
    writer above): load_quantized(dequantize=True) gives every layer bit for
    bit what bitsandbytes' own dequantize_4bit gives, plain and nested
    absmax, nf4 and fp4, and the reader names the layers bitsandbytes'."""
    _bitsandbytes()
    from test_load import meta_model, reference_model, write_quantized_checkpoint
    quant_type, B, nested = case
    ref = reference_model()
    dense = write_quantized_checkpoint(ref, str(tmp_path), lambda w, rng: bnb_layer_by_bitsandbytes(w, *case),
                                       bnb_config(quant_type, nested))
    model = meta_model()
    rep = nt.load_quantized(model, str(tmp_path), dequantize=True, dtype=torch.float32)
    assert set(rep["quantized"]) == set(dense) and not rep["missing"] and not rep["unexpected"]
    assert set(rep["quantized"].values()) == {f"bnb-{quant_type}"}
    for prefix, want in dense.items():
        np.testing.assert_array_equal(model.get_submodule(prefix).weight.numpy(), want, err_msg=prefix)


@pytest.mark.parametrize("quant_type,B", [("nf4", 64), ("fp4", 64), ("nf4", 128), ("fp4", 256)])
def test_quantizer_against_bitsandbytes(quant_type, B):
    """nibble.quantize (nf4 / bnb_fp4, F32 absmax, no nesting) against
    bitsandbytes' quantize_4bit of the same weights: absmax bit for bit, and
    the codes equal but where the weight lies at a midpoint between two
    table values to within float32 rounding of the two divisions (both
    round to the nearest table value; bitsandbytes compares w * (1/absmax)
    with precomputed midpoints); those few give the same dequantized
    weight to within one table step there."""
    F = _bitsandbytes()
    rng = np.random.default_rng(7)
    w = (rng.standard_normal((96, 512)) * 0.02).astype(np.float32)
    w[3, :B] = 0.0                                      # an all-zero block
    w[5, 7] = 0.5                                       # a block whose absmax is one element
    q, st = F.quantize_4bit(torch.from_numpy(w), blocksize=B, quant_type=quant_type, compress_statistics=False,
                            quant_storage=torch.uint8)
    qb = q.numpy().reshape(-1)
    theirs = np.empty(qb.size * 2, np.uint8)
    theirs[0::2], theirs[1::2] = qb >> 4, qb & 15     # first element of a pair in the high nibble
    qw = nibble.quantize(w, FORMAT[quant_type], group_size=B)
    packed = np.asarray(qw.codes, np.uint8).reshape(-1)
    ours = np.empty(packed.size * 2, np.uint8)
    ours[0::2], ours[1::2] = packed & 15, packed >> 4   # nibble's codes: low nibble = even element
    absmax = st.absmax.numpy()
    np.testing.assert_array_equal(np.asarray(qw.scales, np.float32).reshape(-1), absmax)
    table = TABLE[quant_type]
    differ = np.flatnonzero(ours != theirs)
    assert differ.size <= ours.size // 1000, f"{differ.size} of {ours.size} codes differ"
    scaled = w.reshape(-1) / np.repeat(np.where(absmax == 0, 1, absmax), B)
    for i in differ:
        a, b = table[ours[i]], table[theirs[i]]
        mid = (np.float64(a) + np.float64(b)) / 2
        assert abs(scaled[i] - mid) <= 4e-7 * max(1.0, abs(mid)), (i, scaled[i], a, b)


@pytest.mark.parametrize("quant_type,B", [("nf4", 64), ("fp4", 64), ("nf4", 128), ("fp4", 32)])
def test_quantize_checkpoint_is_bitsandbytes_serialization(tmp_path, quant_type, B):
    """nibble.quantize_checkpoint (`nibble quantize`) to nf4 / bnb_fp4
    against bitsandbytes quantizing and serializing the same BF16 weights
    itself (quantize_4bit of the float32 values, QuantState.as_dict(packed=
    True)): the same tensor names, dtypes and shapes, absmax, quant_map and
    the quant_state JSON byte for byte, the codes equal but at midpoints (as
    nibble.quantize above), and config.json's quantization_config
    transformers' BitsAndBytesConfig for them."""
    F = _bitsandbytes()
    st_torch = pytest.importorskip("safetensors.torch")
    from test_checkpoint import bf16_checkpoint
    shapes = {"model.layers.0.mlp.down_proj": (48, 256), "model.layers.0.self_attn.q_proj": (64, 128),
              "lm_head": (32, 128)}
    ws = bf16_checkpoint(str(tmp_path / "bf16"), shapes)
    out = str(tmp_path / "q")
    fmt = "nf4" if quant_type == "nf4" else "bnb_fp4"
    summary = nibble.quantize_checkpoint(str(tmp_path / "bf16"), out, format=fmt, group_size=B)
    assert summary["layers_quantized"] == 2 and summary["device"] == "cpu"
    got = st_torch.load_file(os.path.join(out, "model.safetensors"))
    assert got["lm_head.weight"].dtype == torch.bfloat16 and np.array_equal(
        got["lm_head.weight"].float().numpy(), ws["lm_head"])        # excluded by default: copied as it was
    got = {k: v.numpy() for k, v in got.items() if v.dtype != torch.bfloat16}
    table = TABLE[quant_type]
    for prefix in ("model.layers.0.mlp.down_proj", "model.layers.0.self_attn.q_proj"):
        w = ws[prefix]
        q, st = F.quantize_4bit(torch.from_numpy(w), blocksize=B, quant_type=quant_type, compress_statistics=False,
                                quant_storage=torch.uint8)
        want = {"weight": q.numpy()}
        want.update({f"weight.{k}": v.numpy() for k, v in st.as_dict(packed=True).items()})
        mine = {k[len(prefix) + 1:]: v for k, v in got.items() if k.startswith(prefix + ".")}
        assert set(mine) == set(want), prefix
        for k, v in want.items():
            if "quant_state" in k:   # bitsandbytes' dtype is the float32 it quantized; the file says the source's
                js, theirs = json.loads(bytes(mine[k])), json.loads(bytes(v))
                assert mine[k].dtype == v.dtype and js == dict(theirs, dtype="bfloat16"), (js, theirs)
                assert bytes(mine[k]) == json.dumps(js).encode()     # as Python's json.dumps writes it
                continue
            assert mine[k].dtype == v.dtype and mine[k].shape == v.shape, (prefix, k, mine[k].shape, v.shape)
            if k != "weight":
                np.testing.assert_array_equal(mine[k], v, err_msg=f"{prefix}.{k}")
        a, b = mine["weight"].reshape(-1), want["weight"].reshape(-1)
        ours, theirs = np.empty(a.size * 2, np.uint8), np.empty(b.size * 2, np.uint8)
        ours[0::2], ours[1::2], theirs[0::2], theirs[1::2] = a >> 4, a & 15, b >> 4, b & 15
        differ = np.flatnonzero(ours != theirs)
        assert differ.size <= max(2, ours.size // 1000), f"{prefix}: {differ.size} of {ours.size} codes differ"
        absmax = mine["weight.absmax"]
        scaled = w.reshape(-1) / np.repeat(np.where(absmax == 0, 1, absmax), B)
        for i in differ:
            mid = (np.float64(table[ours[i]]) + np.float64(table[theirs[i]])) / 2
            assert abs(scaled[i] - mid) <= 4e-7 * max(1.0, abs(mid)), (prefix, i)
    with open(os.path.join(out, "config.json")) as f:
        qc = json.load(f)["quantization_config"]
    assert qc["quant_method"] == "bitsandbytes" and qc["load_in_4bit"] and not qc["bnb_4bit_use_double_quant"]
    assert qc["bnb_4bit_quant_type"] == quant_type and qc["bnb_4bit_compute_dtype"] == "bfloat16"
    assert qc["llm_int8_skip_modules"] == ["lm_head"]
    from nibble.transformers import _layout_config
    assert qc == _layout_config(fmt, None, ["lm_head"])     # the C writer and save_pretrained agree
    with pytest.raises(ValueError, match="group_size 96"):
        nibble.quantize_checkpoint(str(tmp_path / "bf16"), str(tmp_path / "x"), format=fmt, group_size=96)
    with pytest.raises(nibble.Error, match="nearest"):
        nibble.quantize_checkpoint(str(tmp_path / "bf16"), str(tmp_path / "x"), format=fmt, method="mse")


@io
@hf
def test_bnb_refusals(bnb_ckpts, tmp_path):
    """A config that says fp4 over nf4 tensors, NibbleConfig(format=) unlike
    the checkpoint, a quant_map that is not the table (the reader's reason)
    and load_quantized packing on the CPU: each refused by name, before
    anything runs."""
    from transformers import AutoModelForCausalLM
    from nibble.transformers import NibbleConfig
    from test_load import meta_model
    ref = bnb_ckpts["ref"]
    lie = str(tmp_path / "lie")
    write_bnb_checkpoint(ref, lie, "nf4", 64, False, config=bnb_config("fp4", False))
    with pytest.raises(ValueError, match="disagrees with the checkpoint's config"):
        AutoModelForCausalLM.from_pretrained(lie, quantization_config=NibbleConfig())
    path, _ = bnb_ckpts[("nf4", 64, False)]
    with pytest.raises(ValueError, match=r"NibbleConfig\(format='bnb_fp4'\) but .* holds nf4 layers"):
        AutoModelForCausalLM.from_pretrained(path, quantization_config=NibbleConfig(format="bnb_fp4"))
    with pytest.raises(ValueError, match="packs for CUDA devices only"):
        nt.load_quantized(meta_model(), path, device="cpu")

    bad = str(tmp_path / "bad")

    def damage(t):
        t["model.layers.0.mlp.up_proj.weight.quant_map"][1][3] += np.float32(1e-6)
    write_bnb_checkpoint(ref, bad, "nf4", 64, False, edit=damage)
    with pytest.raises(nibble.Error) as e:
        nt.load_quantized(meta_model(), bad, dequantize=True)
    assert e.value.name == "NB_ERR_CORRUPT" and "model.layers.0.mlp.up_proj" in e.value.message
    assert "quant_map[3]" in e.value.message


@io
@hf
@pytest.mark.parametrize("case", CASES, ids=_case_id)
def test_save_pretrained_table_formats(bnb_ckpts, tmp_path, case):
    """save_pretrained of a model of nf4 / bnb_fp4 layers writes
    bitsandbytes' 4-bit serialization: config.json's quantization_config is
    bitsandbytes' (the format's quant_type, no double quantization, the
    tied head listed as skipped); loaded back through NibbleConfig() every
    layer packs to the same bytes; dequantized it is the source checkpoint's
    dense weight bit for bit (a nested absmax is written as the float32
    values it stands for); bitsandbytes, when installed, reads the saved
    tensors (QuantState.from_dict) and its dequantize_4bit gives the same
    weights."""
    from safetensors.torch import load_file
    from transformers import AutoModelForCausalLM
    from nibble.transformers import NibbleConfig
    path, dense = bnb_ckpts[case]
    quant_type, B, nested = case
    m = AutoModelForCausalLM.from_pretrained(path, quantization_config=NibbleConfig(), dtype=torch.bfloat16)
    out = str(tmp_path / "out")
    m.save_pretrained(out)
    with open(os.path.join(out, "config.json")) as f:
        qc = json.load(f)["quantization_config"]
    assert qc["quant_method"] == "bitsandbytes" and qc["load_in_4bit"] and qc["bnb_4bit_quant_type"] == quant_type
    assert qc["bnb_4bit_use_double_quant"] is False and qc["bnb_4bit_compute_dtype"] == "bfloat16"
    assert qc["llm_int8_skip_modules"] == ["lm_head"]
    again = AutoModelForCausalLM.from_pretrained(out, quantization_config=NibbleConfig(), dtype=torch.bfloat16)
    layers = {name: mod for name, mod in m.named_modules() if isinstance(mod, nt.Linear)}
    assert set(layers) == set(dense)
    for name, mod in layers.items():
        back = again.get_submodule(name)
        assert isinstance(back, nt.Linear) and back.format == FORMAT[quant_type] and (back.group or 64) == B
        np.testing.assert_array_equal(back.packed.numpy(), mod.packed.numpy(), err_msg=name)
    ref = AutoModelForCausalLM.from_pretrained(out, quantization_config=NibbleConfig(dequantize=True),
                                               dtype=torch.float32)
    for prefix, want in dense.items():
        np.testing.assert_array_equal(ref.get_submodule(prefix).weight.detach().numpy(), want, err_msg=prefix)
    t = {}
    for fn in sorted(os.listdir(out)):
        if fn.endswith(".safetensors"):
            t.update(load_file(os.path.join(out, fn)))
    prefix = "model.layers.0.mlp.up_proj"
    assert t[prefix + ".weight"].dtype == torch.uint8 and t[prefix + ".weight"].shape[1] == 1
    assert t[prefix + ".weight.absmax"].dtype == torch.float32 and prefix + ".weight.nested_absmax" not in t
    np.testing.assert_array_equal(t[prefix + ".weight.quant_map"].numpy(), TABLE[quant_type])
    state = json.loads(bytes(t[f"{prefix}.weight.quant_state.bitsandbytes__{quant_type}"].numpy()))
    assert state == {"quant_type": quant_type, "blocksize": B, "dtype": "bfloat16", "shape": list(dense[prefix].shape)}
    try:
        import bitsandbytes.functional as F
    except ImportError:
        return
    for prefix, want in dense.items():
        qs = {k[len(prefix) + len(".weight."):]: v for k, v in t.items() if k.startswith(prefix + ".weight.")}
        st = F.QuantState.from_dict(qs, device=torch.device("cpu"))
        st.dtype = torch.float32
        got = F.dequantize_4bit(t[prefix + ".weight"], st).float().numpy()
        np.testing.assert_array_equal(got, want, err_msg=prefix)


@hf
def test_nibble_config_table_formats():
    """NibbleConfig takes nf4 / bnb_fp4 with bitsandbytes' block sizes and
    refuses what does not apply to them."""
    from nibble.transformers import NibbleConfig
    assert NibbleConfig(format="nf4").format == "nf4"
    assert NibbleConfig(format="bnb_fp4", group_size=256).group_size == 256
    with pytest.raises(ValueError, match="group_size 48; nf4 takes 32, 64, 128, 256"):
        NibbleConfig(format="nf4", group_size=48)
    with pytest.raises(ValueError, match="scale_type applies to format 'int4', 'int4_sym', 'int8' or 'int4_hqq'"):
        NibbleConfig(format="nf4", scale_type="f16")
    with pytest.raises(ValueError, match="method 'mse' serves nvfp4 and mxfp4 only"):
        NibbleConfig(format="bnb_fp4", method="mse")
    with pytest.raises(ValueError, match="group_size applies to format"):
        NibbleConfig(format="mxfp4", group_size=32)


@io
@hf
@pytest.mark.parametrize("fmt,group", [("nf4", None), ("bnb_fp4", 32)])
def test_quantize_at_load_and_quantize_model_table_formats(tmp_path, fmt, group):
    """NibbleConfig(format="nf4" | "bnb_fp4") on a BF16 checkpoint and
    quantize_model on the same model give every decoder linear layer the
    bytes of nibble.pack(nibble.quantize(weight)) (the host reference, the
    block as asked); the tied head stays BF16; the CPU model runs (the host
    reference) within the format's error of the BF16 model; saved and
    loaded again it holds the same bytes."""
    from transformers import AutoModelForCausalLM
    from nibble.transformers import NibbleConfig
    from test_load import reference_model, write_model
    ref = reference_model()
    d = str(tmp_path / "bf16")
    write_model(ref, d)
    kw = {"group_size": group} if group else {}
    m = AutoModelForCausalLM.from_pretrained(d, quantization_config=NibbleConfig(format=fmt, **kw),
                                             dtype=torch.bfloat16)
    layers = {name: mod for name, mod in m.named_modules() if isinstance(mod, nt.Linear)}
    want = {name for name, mod in ref.named_modules() if isinstance(mod, torch.nn.Linear) and ".layers." in name}
    assert set(layers) == want
    assert isinstance(m.lm_head, torch.nn.Linear) and not isinstance(m.lm_head, nt.Linear)
    twin = reference_model()
    report = nt.quantize_model(twin, format=fmt, device="cpu", return_weights=True, **kw)
    assert set(report["quantized"]) == want and report["skipped"] == {"lm_head": "excluded"}
    for name, mod in layers.items():
        w = ref.get_submodule(name).weight
        host = nibble.pack(nibble.quantize(nt._host_array(w), fmt, **kw))
        assert mod.format == fmt and (mod.group or 64) == (group or 64)
        np.testing.assert_array_equal(mod.packed.numpy(), host.data, err_msg=name)
        np.testing.assert_array_equal(twin.get_submodule(name).packed.numpy(), host.data, err_msg=name)
    ids = torch.tensor([[1, 17, 33, 99, 5]])
    with torch.no_grad():
        out, base = m(ids).logits.float(), ref(ids).logits.float()
    assert _rel(out.numpy(), base.numpy()) < 0.25   # 4-bit weights of a random model: a loose sanity bound
    # saved in bitsandbytes' serialization and read back: the same packed bytes
    m.save_pretrained(str(tmp_path / "saved"))
    again = AutoModelForCausalLM.from_pretrained(str(tmp_path / "saved"), quantization_config=NibbleConfig(),
                                                 dtype=torch.bfloat16)
    for name, mod in layers.items():
        np.testing.assert_array_equal(again.get_submodule(name).packed.numpy(), mod.packed.numpy(), err_msg=name)


# ----------------------------------------------------------- GPU tests

@gpu
@pytest.mark.parametrize("fmt,group", [("nf4", 64), ("nf4", 32), ("bnb_fp4", 128), ("nf4", 256)])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("m", [1, 7, 8, 9, 33])
def test_gemm_table_against_float64(fmt, group, dtype, m):
    """nibble::gemm of nf4 / bnb_fp4 on the GPU against the float64 host
    reference, within DESIGN.md 4.2.2's bound (test_torch.py's rule plus
    the operand term); the workspace stays zeroed."""
    rng = np.random.default_rng(m)
    w = (rng.standard_normal((136, 512)) * 0.05).astype(np.float32)   # n past a 16-row block
    qw = nibble.quantize(w, fmt, group_size=group)
    # the operands are the table values rounded to the activation dtype (u = EPS[dtype]), and the
    # reference's weight is bitsandbytes' float32 product (2^-24)
    check_gemm_against_float64(qw, dtype, m, f"{fmt} g={group} {dtype} m={m}", operand=EPS[dtype] + 2.0 ** -24)


@io
@hf
@gpu
@pytest.mark.parametrize("case", [CASES[1], CASES[2]], ids=_case_id)
def test_load_bnb_gpu_generation_equals_dequantized(bnb_ckpts, case):
    from test_load import assert_load_agrees_with_dequantized
    path, dense = bnb_ckpts[case]
    assert_load_agrees_with_dequantized(path, len(dense), FORMAT[case[0]])


@io
@hf
@gpu
def test_transformers_bnb_from_pretrained_gpu(bnb_ckpts, tmp_path):
    """from_pretrained(device_map="cuda") of a bitsandbytes checkpoint
    through NibbleConfig() against its dequantized twin, and a BF16
    checkpoint quantized to nf4 at load on the GPU: the bytes of the host
    quantizer, generation as the dequantized model's."""
    pytest.importorskip("accelerate", reason="device_map needs accelerate")
    from transformers import AutoModelForCausalLM
    from nibble.transformers import NibbleConfig
    from test_load import assert_generation_agrees, write_model
    path, _ = bnb_ckpts[("nf4", 64, True)]
    m = AutoModelForCausalLM.from_pretrained(path, device_map="cuda", quantization_config=NibbleConfig())
    ref = AutoModelForCausalLM.from_pretrained(path, device_map="cuda",
                                               quantization_config=NibbleConfig(dequantize=True))
    assert_generation_agrees(m, ref)
    d = str(tmp_path / "bf16")
    write_model(bnb_ckpts["ref"], d)
    q = AutoModelForCausalLM.from_pretrained(d, device_map="cuda", quantization_config=NibbleConfig(format="nf4"),
                                             dtype=torch.bfloat16)
    twin = AutoModelForCausalLM.from_pretrained(d, device_map="cuda", dtype=torch.bfloat16)
    for name, mod in q.named_modules():
        if isinstance(mod, nt.Linear):
            qw = nt.unpack(mod.weight)
            host = nibble.quantize(nt._host_array(twin.get_submodule(name).weight), "nf4")
            np.testing.assert_array_equal(qw.codes, host.codes, err_msg=name)
            np.testing.assert_array_equal(qw.scales, host.scales, err_msg=name)
            with torch.no_grad():
                twin.get_submodule(name).weight.copy_(nt.dequantize_weight(qw, torch.bfloat16, "cuda"))
    assert_generation_agrees(q, twin)


@hf
def test_bnb_layer_tensors_refusals():
    """layer_tensors of an nf4 weight whose absmax does not match its blocks,
    or with an act-order permutation (bitsandbytes has no such layout), is
    refused by name."""
    from nibble.transformers import layer_tensors
    qw = nibble.quantize(np.linspace(-1, 1, 16 * 128, dtype=np.float32).reshape(16, 128), "nf4")
    t = layer_tensors(qw, None, "float16")
    assert json.loads(bytes(t["weight.quant_state.bitsandbytes__nf4"].numpy()))["dtype"] == "float16"
    bad = nibble.QuantizedWeight(codes=qw.codes, scales=qw.scales[:, :1].copy(), tensor_scale=1.0, n=16, k=128,
                                 format="nf4", group=64)
    with pytest.raises(ValueError, match="has no bitsandbytes layout"):
        layer_tensors(bad)
    with pytest.raises(ValueError, match="nf4 layers have no act-order layout"):
        layer_tensors(qw, np.arange(128))
