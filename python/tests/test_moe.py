"""Tests of the mixture-of-experts layer of the Python package: nibble.moe
(QuantizedExperts, moe_pack / moe_unpack, moe_reference), the expert groups
of nibble.Checkpoint, and nibble.torch's nibble::moe_mlp op, MoeExperts,
quantize_model and load_quantized of MoE models (gpt-oss, Qwen3-MoE,
Mixtral, DeepSeek-V3).

What is compared with what:
  * moe_reference(out_dtype=float64) (nb_moe_mlp_host_f64) against the
    routed MLP written here in torch float64 from the dequantized weights:
    the same function up to float64 rounding (relative 1e-12);
  * the float32 / bfloat16 reference (nb_moe_mlp_host) against that
    yardstick, held to FlashAttention's rule: normwise error at most twice
    that of the same computation written naively in torch in the same
    precision (float32 dot products, h, o and y rounded at the points
    nibble.h names), plus 2^-20 of the norm for the float32 case where both
    errors are at rounding level;
  * moe_pack / moe_unpack: the bytes back exactly; the CPU op on packed
    weights bit for bit equal to the host reference on the checkpoint layout;
  * MoeExperts of transformers' GptOssExperts / Qwen3MoeExperts /
    MixtralExperts / DeepseekV3Experts against the transformers module
    holding the dequantized weights (float32: relative 2^-16 normwise; only
    the summation order differs); likewise whole tiny Mixtral and
    DeepSeek-V3 models loaded from hand-written ModelOpt NVFP4 checkpoints
    (Mixtral's block_sparse_moe.experts.<e>.w1 / w3 / w2 names mapped onto
    the model's mlp.experts) against their dequantized twins;
  * on a GPU (skipped without one): nibble::moe_mlp against nb_moe_mlp_host_f64
    by the same 2x rule (the host float reference's error as yardstick), CUDA
    graph capture and replay with new routing, torch.compile(fullgraph=True)
    of a tiny MoE block, and whole models (quantize_model, load_quantized)
    generating as their dequantized twins.

Run on a GPU machine:  python3 -m pytest python/tests/test_moe.py
"""

import json
import os

import numpy as np
import pytest

import nibble
from nibble import _lib

torch = pytest.importorskip("torch")
import nibble.torch as nt  # noqa: E402

from test_checkpoint import write_safetensors  # noqa: E402
from test_load import HAS_GPU, HAS_IO, HAS_TF, bf16_bits, gpu, hf, io  # noqa: E402
from test_torch import assert_each_refused  # noqa: E402

FORMATS = ["nvfp4", "mxfp4"]
ACTS = ["swiglu", "swiglu_oai"]


# ------------------------------------------------------------- helpers

def random_moe(fmt, act, E=4, H=64, I=32, bias=False, seed=0, scale=0.1):
    """A QuantizedMoe of random weights (each expert quantized by
    nibble.quantize), biases float32 when asked."""
    rng = np.random.default_rng(seed)
    gu = nibble.QuantizedExperts.stack([nibble.quantize((rng.standard_normal((2 * I, H)) * scale).astype(np.float32),
                                                        fmt) for _ in range(E)])
    dn = nibble.QuantizedExperts.stack([nibble.quantize((rng.standard_normal((H, I)) * scale).astype(np.float32), fmt)
                                        for _ in range(E)])
    qm = nibble.QuantizedMoe(gu, dn, activation=act)
    if bias:
        qm.gate_up_bias = (rng.standard_normal((E, 2 * I)) * 0.1).astype(np.float32)
        qm.down_bias = (rng.standard_normal((E, H)) * 0.1).astype(np.float32)
    return qm


def random_routing(m, E, top_k, seed=1):
    """Distinct experts per token (as top-k routers pick them) and softmax
    weights."""
    rng = np.random.default_rng(seed)
    ids = np.stack([rng.permutation(E)[:top_k] for _ in range(m)]).astype(np.int32)
    w = rng.random((m, top_k)).astype(np.float32)
    return ids, w / w.sum(1, keepdims=True)


def dense(qe):
    """[E, n, k] float64 of dequantized experts (nibble.dequantize: the
    values the kernels multiply by)."""
    return np.stack([nibble.dequantize(qe.expert(e)).astype(np.float64) for e in range(qe.experts)])


def torch_moe(x, ids, w, qm, rnd=None):
    """The routed MLP of nibble.h in torch, token by token and slot by slot.
    rnd None: float64 throughout; rnd a torch dtype: float32 arithmetic with
    h, each slot's output and y rounded to rnd (the naive same-precision
    computation)."""
    spec = qm.spec
    f = torch.float64 if rnd is None else torch.float32
    gu, dn = torch.from_numpy(dense(qm.gate_up)).to(f), torch.from_numpy(dense(qm.down)).to(f)
    gub = torch.from_numpy(np.asarray(qm.gate_up_bias, np.float64)).to(f) if qm.gate_up_bias is not None else None
    dnb = torch.from_numpy(np.asarray(qm.down_bias, np.float64)).to(f) if qm.down_bias is not None else None
    x = torch.as_tensor(x).to(f)
    I = spec.intermediate
    r = (lambda t: t.to(rnd).to(f)) if rnd is not None else (lambda t: t)
    y = torch.zeros(x.shape, dtype=f)
    for t in range(x.shape[0]):
        for s in range(ids.shape[1]):
            e = int(ids[t, s])
            g = gu[e] @ x[t] + (gub[e] if gub is not None else 0)
            if spec.gate_up_layout == "interleaved":
                gate, up = g[0::2], g[1::2]
            else:
                gate, up = g[:I], g[I:]
            if spec.activation == "swiglu":
                h = torch.nn.functional.silu(gate) * up
            else:
                # limit and alpha are float32 fields of nb_moe_desc (1.702 is not a float32)
                limit, alpha = float(np.float32(spec.limit)), float(np.float32(spec.alpha))
                gate = gate.clamp(max=limit)
                up = up.clamp(min=-limit, max=limit)
                h = (up + 1) * (gate * torch.sigmoid(gate * alpha))
            o = r(dn[e] @ r(h) + (dnb[e] if dnb is not None else 0))
            y[t] += float(w[t, s]) * o
    return r(y)


def rel(a, b):
    a, b = torch.as_tensor(np.asarray(a, np.float64)), torch.as_tensor(np.asarray(b, np.float64))
    return ((a - b).norm() / b.norm()).item()


# ------------------------------------------------------- numpy level

@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize("act", ACTS)
def test_pack_unpack_round_trip(fmt, act):
    qm = random_moe(fmt, act, E=3, H=96, I=64)
    pm = nibble.moe_pack(qm)
    sizes = nibble.moe.packed_sizes(qm.spec)
    assert pm.gate_up.nbytes == sizes["gate_up_bytes"] == 3 * sizes["gate_up_expert_bytes"]
    back = nibble.moe_unpack(pm)
    for a, b in ((back.gate_up, qm.gate_up), (back.down, qm.down)):
        np.testing.assert_array_equal(a.codes, b.codes)
        np.testing.assert_array_equal(a.scales, b.scales)
        if b.tensor_scales is None:
            assert a.tensor_scales is None
        else:
            np.testing.assert_array_equal(a.tensor_scales, b.tensor_scales)
    assert back.spec == qm.spec
    np.testing.assert_array_equal(nibble.moe_pack(back).gate_up, pm.gate_up)


@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize("act", ACTS)
@pytest.mark.parametrize("bias", [False, True])
def test_reference_f64_is_the_routed_mlp(fmt, act, bias):
    """nb_moe_mlp_host_f64 computes exactly the MLP of nibble.h on the
    dequantized weights (written here in torch float64)."""
    qm = random_moe(fmt, act, bias=bias)
    x = np.random.default_rng(2).standard_normal((7, 64)).astype(np.float32)
    ids, w = random_routing(7, 4, 2)
    y64 = nibble.moe_reference(x, ids, w, qm, out_dtype=np.float64)
    want = torch_moe(x, ids, w, qm).numpy()
    assert rel(y64, want) < 1e-12


@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize("act", ACTS)
@pytest.mark.parametrize("dtype", ["float32", "bfloat16", "float16"])
def test_reference_rounding_within_twice_the_naive_error(fmt, act, dtype):
    """nb_moe_mlp_host (rounded where nibble.h says) against the f64
    yardstick: normwise error at most twice the naive torch computation's
    in the same precision (+ 2^-20 relative for float32, both at rounding
    level)."""
    qm = random_moe(fmt, act, bias=True, scale=0.3)
    tdt = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}[dtype]
    xt = torch.randn(9, 64, generator=torch.Generator().manual_seed(3)).to(tdt)
    ids, w = random_routing(9, 4, 3, seed=4)
    if dtype == "bfloat16":
        x, cast = bf16_bits(xt), (lambda b: nibble.to_bf16(b))
        back = nibble.from_bf16
    else:
        x, cast, back = xt.numpy(), (lambda b: b.astype(xt.numpy().dtype)), (lambda a: a.astype(np.float64))
    qm_act = nibble.QuantizedMoe(qm.gate_up, qm.down, act, gate_up_bias=cast(qm.gate_up_bias),
                                 down_bias=cast(qm.down_bias))
    y = back(nibble.moe_reference(x, ids, w, qm_act)).astype(np.float64)
    y64 = nibble.moe_reference(x, ids, w, qm_act, out_dtype=np.float64)
    qm_exact = nibble.QuantizedMoe(qm.gate_up, qm.down, act, gate_up_bias=back(qm_act.gate_up_bias),
                                   down_bias=back(qm_act.down_bias))
    assert rel(y64, torch_moe(xt.double().numpy(), ids, w, qm_exact).numpy()) < 1e-12
    naive = torch_moe(xt.double().numpy(), ids, w, qm_exact, rnd=tdt).double().numpy()
    slack = 2.0 ** -20 if dtype == "float32" else 0.0
    assert rel(y, y64) <= 2 * rel(naive, y64) + slack, (rel(y, y64), rel(naive, y64))
    assert rel(y, y64) > 0 or dtype == "float32"


def test_reference_refuses_bad_routing_and_arguments():
    qm = random_moe("mxfp4", "swiglu")
    x = np.zeros((2, 64), np.float32)
    ok_w = np.full((2, 2), 0.5, np.float32)
    for ids, w, what in ((np.array([[0, 4], [1, 2]]), ok_w, "4"),           # expert out of range
                         (np.array([[1, 1], [1, 2]]), ok_w, "twice"),       # an expert twice in a token
                         (np.array([[0, 1], [1, 2]]), np.array([[0.5, np.nan], [1, 0]], np.float32), "finite")):
        with pytest.raises(nibble.Error) as e:
            nibble.moe_reference(x, ids, w, qm)
        assert e.value.status == nibble.Status.ERR_INVALID_ARGUMENT and what in e.value.message
    with pytest.raises(ValueError, match="hidden = 64"):
        nibble.moe_reference(np.zeros((2, 32), np.float32), np.zeros((2, 2), np.int32), ok_w, qm)
    with pytest.raises(ValueError, match="topk_ids"):
        nibble.moe_reference(x, np.zeros((3, 2), np.int32), ok_w, qm)
    with pytest.raises(ValueError, match="topk_weights"):
        nibble.moe_reference(x, np.array([[0, 1], [1, 2]]), ok_w[:, :1], qm)
    with pytest.raises(nibble.Error) as e:    # top_k > E
        nibble.moe_reference(x, np.zeros((2, 5), np.int32), np.zeros((2, 5), np.float32), qm)
    assert e.value.status == nibble.Status.ERR_INVALID_ARGUMENT
    with pytest.raises(ValueError, match="down_bias"):
        bad = nibble.QuantizedMoe(qm.gate_up, qm.down, down_bias=np.zeros((4, 64), np.float16))
        nibble.moe_reference(x, np.array([[0, 1], [1, 2]]), ok_w, bad)
    with pytest.raises(ValueError, match="activation"):
        nibble.MoeSpec("nvfp4", 4, 64, 32, activation="gelu")
    with pytest.raises(nibble.Error):           # swiglu takes no limit (nb_moe_desc_validate)
        nibble.MoeSpec("nvfp4", 4, 64, 32, activation="swiglu", limit=7.0)
    with pytest.raises(ValueError, match="gate_up is"):
        nibble.QuantizedMoe(qm.gate_up, qm.gate_up).spec
    with pytest.raises(TypeError, match="tensor_scales"):
        nv = random_moe("nvfp4", "swiglu")
        nibble.QuantizedExperts(nv.down.codes, nv.down.scales, None, 64, 32, "nvfp4").check()
    with pytest.raises(ValueError, match="shape"):
        nibble.QuantizedExperts(qm.down.codes[:, :3], qm.down.scales, None, 64, 32, "mxfp4").check()
    with pytest.raises(ValueError, match="share format and shape"):
        nibble.QuantizedExperts.stack([qm.down.expert(0), qm.gate_up.expert(0)])


# ------------------------------------------------------ torch on the CPU

def _tensor_bias(b, dtype):
    return None if b is None else torch.from_numpy(b).to(dtype)


@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize("act", ACTS)
def test_cpu_op_is_the_host_reference_bit_for_bit(fmt, act):
    """nibble::moe_mlp on CPU tensors (packed bytes unpacked, then
    nb_moe_mlp_host) equals the host reference on the original checkpoint
    layout, bit for bit: packing and unpacking lose nothing."""
    qm = random_moe(fmt, act, bias=True)
    pw = nt.pack_moe(qm, "cpu")
    x = torch.randn(6, 64, generator=torch.Generator().manual_seed(5)).to(torch.bfloat16)
    ids, w = random_routing(6, 4, 2, seed=6)
    gub, dnb = _tensor_bias(qm.gate_up_bias, torch.bfloat16), _tensor_bias(qm.down_bias, torch.bfloat16)
    y = nt.moe(x, torch.from_numpy(ids).long(), torch.from_numpy(w).to(torch.bfloat16), pw, gub, dnb)
    assert y.dtype == torch.bfloat16 and y.shape == (6, 64)
    w_rounded = torch.from_numpy(w).to(torch.bfloat16).float().numpy()   # the op converts the weights to float32
    ref_qm = nibble.QuantizedMoe(qm.gate_up, qm.down, act, gate_up_bias=bf16_bits(gub), down_bias=bf16_bits(dnb))
    want = nibble.moe_reference(bf16_bits(x), ids, w_rounded, ref_qm)
    np.testing.assert_array_equal(bf16_bits(y), want)
    # leading dimensions are flattened, as transformers' [batch, seq, H] would be
    y3 = nt.moe(x.reshape(2, 3, 64), torch.from_numpy(ids).reshape(2, 3, 2), torch.from_numpy(w_rounded).reshape(
        2, 3, 2), pw, gub, dnb)
    assert torch.equal(y3.reshape(6, 64), y)


@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize("act", ACTS)
def test_moe_experts_state_dict_round_trip(fmt, act, tmp_path):
    """MoeExperts.state_dict() holds every expert in the checkpoint layout
    (exactly the bytes it was quantized to); torch.save / torch.load into
    MoeExperts.empty (meta, assign=True) packs the same bytes and gives the
    same outputs; another spec, missing and corrupt tensors are refused
    without changing the module."""
    qm = random_moe(fmt, act, bias=True)
    ex = nt.MoeExperts.from_quantized(qm, device="cpu")
    sd = ex.state_dict()
    tsc = fmt == "nvfp4"
    want = {"gate_up_proj_bias", "down_proj_bias", "gate_up_codes", "gate_up_scales", "down_codes", "down_scales",
            "moe_desc", "moe_limits"} | ({"gate_up_tensor_scales", "down_tensor_scales"} if tsc else set())
    assert set(sd) == want
    assert np.array_equal(sd["gate_up_codes"].numpy(), qm.gate_up.codes)
    assert np.array_equal(sd["down_scales"].numpy(), qm.down.scales)
    if tsc:
        assert np.array_equal(sd["down_tensor_scales"].numpy(), qm.down.tensor_scales)
    f = tmp_path / "ex.pt"
    torch.save(sd, f)
    loaded = torch.load(f, weights_only=True)
    twin = nt.MoeExperts.empty(ex.spec, bias=True)
    assert twin.gate_up_packed.is_meta and set(twin.state_dict()) == {"gate_up_proj_bias", "down_proj_bias"}
    r = twin.load_state_dict(loaded, assign=True)
    assert not r.missing_keys and not r.unexpected_keys
    assert torch.equal(twin.gate_up_packed, ex.gate_up_packed) and torch.equal(twin.down_packed, ex.down_packed)
    assert (twin.gate_up_exp, twin.down_exp) == (ex.gate_up_exp, ex.down_exp)
    x = torch.randn(6, 64, generator=torch.Generator().manual_seed(5)).to(torch.bfloat16)
    ids, w = random_routing(6, 4, 2, seed=6)
    ids, w = torch.from_numpy(ids).long(), torch.from_numpy(w).to(torch.bfloat16)
    assert torch.equal(twin(x, ids, w), ex(x, ids, w))
    other = nt.MoeExperts.from_quantized(random_moe(fmt, act, bias=True, seed=9), device="cpu")
    other.load_state_dict(loaded)
    assert torch.equal(other.gate_up_packed, ex.gate_up_packed) and torch.equal(other(x, ids, w), ex(x, ids, w))
    # another spec: the other activation, or the other format
    oact = "swiglu" if act == "swiglu_oai" else "swiglu_oai"
    with pytest.raises(RuntimeError, match="the state holds"):
        nt.MoeExperts.empty(nibble.MoeSpec(fmt, 4, 64, 32, oact), bias=True).load_state_dict(loaded, assign=True)
    ofmt = "mxfp4" if tsc else "nvfp4"
    with pytest.raises(RuntimeError, match="the state holds"):
        nt.MoeExperts.empty(nibble.MoeSpec(ofmt, 4, 64, 32, act), bias=True).load_state_dict(loaded, assign=True)
    before = other.gate_up_packed.clone()
    with pytest.raises(RuntimeError, match="Missing key.*down_codes"):
        other.load_state_dict({k: v for k, v in loaded.items() if k != "down_codes"})
    assert torch.equal(other.gate_up_packed, before)
    bad = [("gate_up_codes", loaded["gate_up_codes"][:, :, :-1]), ("down_scales", loaded["down_scales"].float()),
           ("moe_desc", loaded["moe_desc"][:6]), ("moe_limits", torch.tensor([1.0, 2.0]))]
    assert_each_refused(other, loaded, bad, "nibble.torch.MoeExperts", "gate_up_packed")


@gpu
def test_moe_experts_state_dict_onto_the_gpu():
    """A MoeExperts saved on the GPU loads into MoeExperts.empty on the GPU
    (packed for it) with the same bytes and outputs."""
    qm = random_moe("nvfp4", "swiglu_oai", bias=True)
    ex = nt.MoeExperts.from_quantized(qm)
    twin = nt.MoeExperts.empty(ex.spec, bias=True, device="cuda")
    twin.load_state_dict(ex.state_dict())
    x = torch.randn(6, 64, generator=torch.Generator().manual_seed(5)).to(torch.bfloat16).cuda()
    ids, w = random_routing(6, 4, 2, seed=6)
    ids, w = torch.from_numpy(ids).long().cuda(), torch.from_numpy(w).to(torch.bfloat16).cuda()
    assert twin.gate_up_packed.is_cuda and torch.equal(twin.gate_up_packed, ex.gate_up_packed)
    assert torch.equal(twin(x, ids, w), ex(x, ids, w))


def test_cpu_op_refusals():
    qm = random_moe("nvfp4", "swiglu")
    pw = nt.pack_moe(qm, "cpu")
    x = torch.zeros(2, 64, dtype=torch.bfloat16)
    ids, w = torch.tensor([[0, 1], [2, 3]]), torch.full((2, 2), 0.5)
    with pytest.raises(nibble.Error) as e:                       # routing checked on the host
        nt.moe(x, torch.tensor([[0, 0], [2, 3]]), w, pw)
    assert "twice" in e.value.message
    with pytest.raises(TypeError, match="integers"):
        nt.moe(x, ids.float(), w, pw)
    with pytest.raises(TypeError, match="PackedMoeWeights"):
        nt.moe(x, ids, w, qm)
    with pytest.raises(ValueError, match="hidden = 64"):
        nt.moe(torch.zeros(2, 32, dtype=torch.bfloat16), ids, w, pw)
    with pytest.raises(TypeError, match="dtype"):
        nt.moe(x.to(torch.int32), ids, w, pw)
    args = list(pw.op_args())
    with pytest.raises(ValueError, match="gate_up must be the packed"):
        torch.ops.nibble.moe_mlp(x, ids.int(), w, pw.gate_up[:-1], pw.down, pw.gate_up_scales, pw.down_scales,
                                 None, None, *args)
    with pytest.raises(ValueError, match="tensor scale"):
        torch.ops.nibble.moe_mlp(x, ids.int(), w, pw.gate_up, pw.down, None, pw.down_scales, None, None, *args)
    with pytest.raises(ValueError, match="int32"):
        torch.ops.nibble.moe_mlp(x, ids, w, pw.gate_up, pw.down, pw.gate_up_scales, pw.down_scales, None, None,
                                 *args)
    with pytest.raises(ValueError, match="down_proj_bias"):
        nt.MoeExperts(pw, None, torch.zeros(4, 32))
    with pytest.raises(ValueError, match="not an experts module"):
        nt.MoeExperts.from_module(torch.nn.Linear(4, 4))
    with pytest.raises(TypeError, match="PackedMoeWeights"):
        nt.unpack_moe(qm)


def _gptoss_experts(E=4, H=64, I=32, dtype=torch.float32):
    from transformers import GptOssConfig
    from transformers.models.gpt_oss.modeling_gpt_oss import GptOssExperts
    torch.manual_seed(0)
    mod = GptOssExperts(GptOssConfig(num_local_experts=E, hidden_size=H, intermediate_size=I))
    with torch.no_grad():
        for p in mod.parameters():
            p.normal_(0, 0.1)
    return mod.to(dtype)


def _fused_experts(cfg, cls, dtype):
    """transformers 5's fused SwiGLU experts module `cls` of config `cfg`
    (eager forward), weights N(0, 0.1)."""
    cfg._experts_implementation = "eager"
    torch.manual_seed(0)
    mod = cls(cfg)
    with torch.no_grad():
        for p in mod.parameters():
            p.normal_(0, 0.1)
    return mod.to(dtype)


def _qwen3_experts(E=4, H=64, I=32, dtype=torch.float32):
    from transformers import Qwen3MoeConfig
    from transformers.models.qwen3_moe.modeling_qwen3_moe import Qwen3MoeExperts
    return _fused_experts(Qwen3MoeConfig(num_experts=E, hidden_size=H, moe_intermediate_size=I), Qwen3MoeExperts,
                          dtype)


def _mixtral_experts(E=4, H=64, I=32, dtype=torch.float32):
    from transformers import MixtralConfig
    from transformers.models.mixtral.modeling_mixtral import MixtralExperts
    return _fused_experts(MixtralConfig(num_local_experts=E, hidden_size=H, intermediate_size=I), MixtralExperts,
                          dtype)


def _deepseek_v3_experts(E=4, H=64, I=32, dtype=torch.float32):
    from transformers import DeepseekV3Config
    from transformers.models.deepseek_v3.modeling_deepseek_v3 import DeepseekV3Experts
    return _fused_experts(DeepseekV3Config(n_routed_experts=E, hidden_size=H, moe_intermediate_size=I),
                          DeepseekV3Experts, dtype)


EXPERTS = {"gpt_oss": _gptoss_experts, "qwen3_moe": _qwen3_experts, "mixtral": _mixtral_experts,
           "deepseek_v3": _deepseek_v3_experts}


def _dequantized_twin(mod, experts):
    """A copy of transformers' experts module `mod` holding the weights
    `experts` (a MoeExperts) dequantized, in float32."""
    import copy
    twin = copy.deepcopy(mod).float()
    qm = experts.quantized_moe()
    transposed = nt._expert_kind(mod)[1]
    with torch.no_grad():
        twin.gate_up_proj.copy_(nt._dense_experts(qm.gate_up, torch.float32, "cpu", transposed))
        twin.down_proj.copy_(nt._dense_experts(qm.down, torch.float32, "cpu", transposed))
    return twin


@hf
@pytest.mark.parametrize("kind", sorted(EXPERTS))
@pytest.mark.parametrize("fmt", FORMATS)
def test_moe_experts_match_transformers(kind, fmt):
    """MoeExperts.from_module of transformers' experts module runs (host
    reference, float32) what that module computes with the dequantized
    weights: the interleaved / concatenated rows, the transposes, the clamps
    and the biases all agree.  Mixtral's MixtralExperts (w1 / w3 / w2 fused
    into gate_up_proj by transformers 5) and DeepSeek-V3's DeepseekV3Experts
    are the SwiGLU form of Qwen3-MoE's."""
    mod = EXPERTS[kind]()
    assert type(mod).__name__ == {"gpt_oss": "GptOssExperts", "qwen3_moe": "Qwen3MoeExperts",
                                  "mixtral": "MixtralExperts", "deepseek_v3": "DeepseekV3Experts"}[kind]
    ex = nt.MoeExperts.from_module(mod, format=fmt, device="cpu")
    assert ex.spec.activation == ("swiglu_oai" if kind == "gpt_oss" else "swiglu")
    assert (ex.gate_up_proj_bias is not None) == (kind == "gpt_oss")
    # every expert's bytes are nibble.quantize of its (out x in) weight
    w0 = mod.gate_up_proj[1].t() if kind == "gpt_oss" else mod.gate_up_proj[1]
    qw = nibble.quantize(w0.detach().contiguous().numpy(), format=fmt)
    np.testing.assert_array_equal(ex.quantized_moe().gate_up.codes[1], qw.codes)
    x = torch.randn(10, 64, generator=torch.Generator().manual_seed(7)) * 2
    ids = torch.from_numpy(random_routing(10, 4, 2, seed=8)[0]).long()
    w = torch.rand(10, 2, generator=torch.Generator().manual_seed(9))
    y = ex(x, ids, w)
    with torch.no_grad():
        want = _dequantized_twin(mod, ex)(x, ids, w)
    assert rel(y.numpy(), want.numpy()) < 2.0 ** -16
    # module.to(dtype) converts the biases, never the packed bytes or the tensor scales
    before = ex.weights
    ex.to(torch.bfloat16)
    after = ex.weights
    assert ex.gate_up_proj_bias is None or ex.gate_up_proj_bias.dtype == torch.bfloat16
    assert torch.equal(after.gate_up, before.gate_up)
    if fmt == "nvfp4":
        assert after.gate_up_scales.dtype == torch.float32 and torch.equal(after.down_scales, before.down_scales)
    assert ex(x.bfloat16(), ids, w).dtype == torch.bfloat16


def _random_model(cls, cfg, seed):
    """A tiny transformers model of class `cls`, weights N(0, 0.1) (every tensor of rank 2 and more)."""
    torch.manual_seed(seed)
    m = cls(cfg)
    with torch.no_grad():
        for p in m.parameters():
            if p.dim() >= 2:
                p.normal_(0, 0.1)
    return m.eval()


def _tiny_qwen3(seed=0):
    from transformers import Qwen3MoeConfig, Qwen3MoeForCausalLM
    cfg = Qwen3MoeConfig(vocab_size=256, hidden_size=64, intermediate_size=128, moe_intermediate_size=32,
                         num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2, head_dim=16,
                         num_experts=4, num_experts_per_tok=2, max_position_embeddings=128, bos_token_id=1,
                         eos_token_id=2, pad_token_id=0, tie_word_embeddings=False)
    return _random_model(Qwen3MoeForCausalLM, cfg, seed)


@hf
def test_quantize_model_packs_experts_on_the_cpu():
    """quantize_model turns each Qwen3MoeExperts into one MoeExperts (not
    per-expert Linear layers), leaves the router, and the CPU forward of the
    model (experts on the host reference) follows the dequantized model."""
    model = _tiny_qwen3()
    ref = _tiny_qwen3()
    rep = nt.quantize_model(model, format="nvfp4", exclude=["*self_attn*", "lm_head"], device="cpu",
                            return_weights=True)
    experts = [f"model.layers.{i}.mlp.experts" for i in range(2)]
    assert rep["quantized"] == experts and set(rep["skipped"]) >= {"lm_head"}
    for name in experts:
        ex = model.get_submodule(name)
        assert isinstance(ex, nt.MoeExperts) and ex.gate_up_packed.device.type == "cpu"
        assert type(model.get_submodule(name.replace("experts", "gate"))).__name__ == "Qwen3MoeTopKRouter"
        qm = rep["weights"][name]
        np.testing.assert_array_equal(qm.down.codes[2], nibble.quantize(
            ref.get_submodule(name).down_proj[2].detach().numpy(), "nvfp4").codes)
        with torch.no_grad():
            twin = ref.get_submodule(name)
            twin.gate_up_proj.copy_(nt._dense_experts(qm.gate_up, torch.float32, "cpu", False))
            twin.down_proj.copy_(nt._dense_experts(qm.down, torch.float32, "cpu", False))
    ids = torch.tensor([[1, 17, 33, 99, 5]])
    with torch.no_grad():
        out, want = model(ids).logits, ref(ids).logits
    assert rel(out.numpy(), want.numpy()) < 2.0 ** -14


# -------------------------------------------------------- checkpoints

HF_NAMES = ("gate_proj", "up_proj", "down_proj")
MIXTRAL_NAMES = ("w1", "w3", "w2")   # gate, up, down


def write_moe_nvfp4(model, d, names=HF_NAMES, rename=lambda name: name, ignore=("*mlp.gate",)):
    """`model` (a tiny transformers MoE model with fused experts modules) as
    a ModelOpt NVFP4 export of it looks: one linear layer per expert and
    projection (<experts>.<e>.<gate> / <up> / <down>, `names`: weight U8,
    weight_scale F8_E4M3, weight_scale_2 F32, input_scale F32), gate and up
    of an expert sharing one weight_scale_2 as ModelOpt writes them, every
    other tensor BF16; `rename` gives each tensor its checkpoint name
    (Mixtral's: .mlp. -> .block_sparse_moe.)."""
    os.makedirs(d)
    tensors = {}

    def put(prefix, w, ts):
        qw = nibble.quantize(w.detach().float().contiguous().numpy(), "nvfp4", tensor_scale=ts)
        tensors[prefix + ".weight"] = ("U8", qw.codes)
        tensors[prefix + ".weight_scale"] = ("F8_E4M3", qw.scales)
        tensors[prefix + ".weight_scale_2"] = ("F32", np.array(qw.tensor_scale, np.float32))
        tensors[prefix + ".input_scale"] = ("F32", np.array(1.0, np.float32))
    gate, up, down = names
    for name, v in model.state_dict().items():
        pre = rename(name).rsplit(".", 1)[0]
        if name.endswith("experts.gate_up_proj"):
            I = v.shape[1] // 2
            for e in range(v.shape[0]):
                ts = float(v[e].abs().max()) / (6 * 448)      # one tensor scale for gate and up
                put(f"{pre}.{e}.{gate}", v[e, :I], ts)
                put(f"{pre}.{e}.{up}", v[e, I:], ts)
        elif name.endswith("experts.down_proj"):
            for e in range(v.shape[0]):
                put(f"{pre}.{e}.{down}", v[e], float(v[e].abs().max()) / (6 * 448))
        else:
            tensors[rename(name)] = ("BF16", bf16_bits(v.bfloat16()))
    write_safetensors(os.path.join(d, "model.safetensors"), tensors)
    model.config.save_pretrained(d)
    with open(os.path.join(d, "config.json")) as f:
        config = json.load(f)
    config["quantization_config"] = {"quant_method": "modelopt", "quant_algo": "NVFP4",
                                     "ignore": ["lm_head", "*self_attn*", *ignore]}
    with open(os.path.join(d, "config.json"), "w") as f:
        json.dump(config, f)
    return d


def write_qwen3_nvfp4(model, d):
    """A ModelOpt NVFP4 export of a tiny Qwen3MoeForCausalLM (write_moe_nvfp4)."""
    return write_moe_nvfp4(model, d)


@pytest.fixture(scope="module")
def qwen3_ckpt(tmp_path_factory):
    if not (HAS_TF and HAS_IO):
        pytest.skip("needs transformers and the checkpoint API")
    model = _tiny_qwen3()
    return {"path": write_qwen3_nvfp4(model, str(tmp_path_factory.mktemp("q3") / "nvfp4")), "model": model}


def _meta_qwen3():
    from transformers import Qwen3MoeForCausalLM
    with torch.device("meta"):
        return Qwen3MoeForCausalLM(_tiny_qwen3().config)


@io
@hf
def test_checkpoint_expert_groups(qwen3_ckpt):
    """The reader groups the per-expert ModelOpt layers; moe() reads gate
    then up (concat) exactly as the per-layer weights."""
    with nibble.open_checkpoint(qwen3_ckpt["path"]) as ck:
        assert [g.prefix for g in ck.moe_groups] == [f"model.layers.{i}.mlp.experts" for i in range(2)]
        g = ck.moe_group("model.layers.1.mlp.experts")
        assert (g.format, g.quant_format, g.experts, g.hidden, g.intermediate, g.activation, g.gate_up_layout,
                g.top_k, g.per_expert, g.layers) == ("modelopt-nvfp4", "nvfp4", 4, 64, 32, "swiglu", "concat", 2,
                                                     True, 12)
        assert ck.layer("model.layers.1.mlp.experts.3.up_proj").moe_group == g.prefix
        assert ck.layer("model.layers.1.self_attn.q_proj").moe_group is None
        qm = ck.moe(g)
        gate, up = ck.quantized_weight("model.layers.1.mlp.experts.3.gate_proj"), \
            ck.quantized_weight("model.layers.1.mlp.experts.3.up_proj")
        np.testing.assert_array_equal(qm.gate_up.codes[3], np.concatenate([gate.codes, up.codes]))
        np.testing.assert_array_equal(qm.gate_up.scales[3], np.concatenate([gate.scales, up.scales]))
        assert qm.gate_up.tensor_scales[3] == gate.tensor_scale
        assert qm.down.tensor_scales[0] == ck.quantized_weight("model.layers.1.mlp.experts.0.down_proj").tensor_scale
        with pytest.raises(KeyError):
            ck.moe_group("model.layers.9.mlp.experts")
        with pytest.raises(ValueError, match="projection"):
            ck.moe_experts(g, "w13")


@io
@hf
def test_load_quantized_dequantized_qwen3(qwen3_ckpt):
    """load_quantized(dequantize=True) fills Qwen3MoeExperts' fused tensors
    with the dequantized per-expert weights (gate rows, then up rows); no
    tensor missing or unexpected."""
    model = _meta_qwen3()
    rep = nt.load_quantized(model, qwen3_ckpt["path"], dequantize=True, dtype=torch.float32)
    assert not rep["missing"] and not rep["unexpected"]
    assert rep["quantized"]["model.layers.0.mlp.experts"] == "modelopt-nvfp4"
    with nibble.open_checkpoint(qwen3_ckpt["path"]) as ck:
        gate = ck.quantized_weight("model.layers.0.mlp.experts.2.gate_proj")
        up = ck.quantized_weight("model.layers.0.mlp.experts.2.up_proj")
    gu = model.model.layers[0].mlp.experts.gate_up_proj
    np.testing.assert_array_equal(gu[2, :32].numpy(), nibble.dequantize(gate))
    np.testing.assert_array_equal(gu[2, 32:].numpy(), nibble.dequantize(up))


@io
@hf
def test_load_quantized_refuses_mismatched_experts(qwen3_ckpt):
    from transformers import Qwen3MoeForCausalLM
    cfg = _tiny_qwen3().config
    cfg.moe_intermediate_size = 64
    with torch.device("meta"):
        model = Qwen3MoeForCausalLM(cfg)
    with pytest.raises(ValueError, match="I = 32"):
        nt.load_quantized(model, qwen3_ckpt["path"], dequantize=True)


# ------------------------------------ Mixtral and DeepSeek-V3 checkpoints

def _tiny_mixtral(seed=0):
    from transformers import MixtralConfig, MixtralForCausalLM
    cfg = MixtralConfig(vocab_size=256, hidden_size=64, intermediate_size=32, num_hidden_layers=2,
                        num_attention_heads=4, num_key_value_heads=2, head_dim=16, num_local_experts=4,
                        num_experts_per_tok=2, max_position_embeddings=128, bos_token_id=1, eos_token_id=2,
                        pad_token_id=0, tie_word_embeddings=False)
    return _random_model(MixtralForCausalLM, cfg, seed)


@pytest.fixture(scope="module")
def mixtral_ckpt(tmp_path_factory):
    """A tiny Mixtral as ModelOpt exports Mixtral: block_sparse_moe.experts.<e>.w1
    / w3 / w2 (gate, up, down) NVFP4 layers and the router
    block_sparse_moe.gate in BF16, the names of Mixtral checkpoints (which
    transformers 5 renames to the model's mlp.experts / mlp.gate)."""
    if not (HAS_TF and HAS_IO):
        pytest.skip("needs transformers and the checkpoint API")
    model = _tiny_mixtral()
    d = str(tmp_path_factory.mktemp("mixtral") / "nvfp4")
    write_moe_nvfp4(model, d, MIXTRAL_NAMES, lambda name: name.replace(".mlp.", ".block_sparse_moe."),
                    ("*block_sparse_moe.gate",))
    return {"path": d, "model": model}


@io
@hf
def test_mixtral_checkpoint_groups(mixtral_ckpt):
    """The reader groups Mixtral's w1 / w3 / w2 layers with w1 as gate and w3
    as up (gate_up = w1's rows then w3's) and w2 as down."""
    with nibble.open_checkpoint(mixtral_ckpt["path"]) as ck:
        assert [g.prefix for g in ck.moe_groups] == [f"model.layers.{i}.block_sparse_moe.experts" for i in range(2)]
        g = ck.moe_groups[1]
        assert (g.format, g.experts, g.hidden, g.intermediate, g.activation, g.gate_up_layout, g.top_k) == \
            ("modelopt-nvfp4", 4, 64, 32, "swiglu", "concat", 2)
        qm = ck.moe(g)
        w1, w3, w2 = (ck.quantized_weight(f"{g.prefix}.2.{n}") for n in MIXTRAL_NAMES)
        np.testing.assert_array_equal(qm.gate_up.codes[2], np.concatenate([w1.codes, w3.codes]))
        np.testing.assert_array_equal(qm.down.codes[2], w2.codes)
        assert qm.down.tensor_scales[2] == w2.tensor_scale


@io
@hf
def test_load_quantized_mixtral_names(mixtral_ckpt):
    """load_quantized maps Mixtral's checkpoint names onto transformers 5's
    model as transformers does (block_sparse_moe -> mlp): the experts module
    gets w1's and w3's dequantized rows as gate_up, w2's as down, the router
    its BF16 weight; nothing missing or unexpected, the report in the
    model's names.  The MixtralForCausalLM then computes what the original
    BF16 model does within the NVFP4 quantization error."""
    from transformers import MixtralForCausalLM
    src = mixtral_ckpt["model"]
    with torch.device("meta"):
        model = MixtralForCausalLM(src.config)
    rep = nt.load_quantized(model, mixtral_ckpt["path"], dequantize=True, dtype=torch.float32)
    assert not rep["missing"] and not rep["unexpected"], rep
    assert sorted(rep["quantized"]) == [f"model.layers.{i}.mlp.experts" for i in range(2)]
    assert "model.layers.0.block_sparse_moe.gate.weight" in rep["loaded"]
    with nibble.open_checkpoint(mixtral_ckpt["path"]) as ck:
        P = "model.layers.1.block_sparse_moe.experts.3"
        w1, w3, w2 = (ck.quantized_weight(f"{P}.{n}") for n in MIXTRAL_NAMES)
    ex = model.model.layers[1].mlp.experts
    assert type(ex).__name__ == "MixtralExperts"
    np.testing.assert_array_equal(ex.gate_up_proj[3, :32].numpy(), nibble.dequantize(w1))
    np.testing.assert_array_equal(ex.gate_up_proj[3, 32:].numpy(), nibble.dequantize(w3))
    np.testing.assert_array_equal(ex.down_proj[3].numpy(), nibble.dequantize(w2))
    assert torch.equal(model.model.layers[1].mlp.gate.weight, src.model.layers[1].mlp.gate.weight.bfloat16().float())
    ids = torch.tensor([[1, 17, 33, 99, 5]])
    model.config._experts_implementation = "eager"
    with torch.no_grad():
        out, want = model(ids).logits, src(ids).logits
    assert rel(out.numpy(), want.numpy()) < 0.25   # NVFP4 of N(0, 0.1) weights: about 0.1 here


@io
@hf
def test_transformers_loads_mixtral_names(mixtral_ckpt):
    """from_pretrained of the ModelOpt Mixtral checkpoint (quant_method
    "modelopt"): each of the model's mlp.experts becomes a MoeExperts
    holding nb_moe_pack_host of the reader's block_sparse_moe.experts
    group, nothing is reported missing or unexpected, and the CPU forward
    (host reference) is the dequantized model's in float32 up to the
    summation order (relative 2^-16; in BF16 the tiny model's routing flips
    on rounding differences, so BF16 logits say nothing about the mapping)."""
    import nibble.transformers  # noqa: F401  (registers the quantizer)
    from nibble.transformers import NibbleConfig
    from transformers import AutoModelForCausalLM
    model, info = AutoModelForCausalLM.from_pretrained(mixtral_ckpt["path"], output_loading_info=True,
                                                       dtype=torch.float32)
    assert not info["unexpected_keys"] and not info["missing_keys"], info
    with nibble.open_checkpoint(mixtral_ckpt["path"]) as ck:
        for i, g in enumerate(ck.moe_groups):
            ex = model.get_submodule(f"model.layers.{i}.mlp.experts")
            assert isinstance(ex, nt.MoeExperts)
            want = nibble.moe_pack(ck.moe(g))
            np.testing.assert_array_equal(ex.gate_up_packed.numpy(), want.gate_up)
            np.testing.assert_array_equal(ex.down_packed.numpy(), want.down)
            np.testing.assert_array_equal(ex.weights.gate_up_scales.numpy(), want.gate_up_scales)
    src = mixtral_ckpt["model"]
    gate = model.model.layers[0].mlp.gate.weight   # float32 as asked (transformers 5.17 left renamed tensors BF16)
    assert gate.dtype == torch.float32 and torch.equal(gate, src.model.layers[0].mlp.gate.weight.bfloat16().float())
    ref = AutoModelForCausalLM.from_pretrained(mixtral_ckpt["path"], quantization_config=NibbleConfig(dequantize=True),
                                               dtype=torch.float32)
    assert type(ref.model.layers[0].mlp.experts).__name__ == "MixtralExperts"
    ref.config._experts_implementation = "eager"
    ids = torch.tensor([[1, 17, 33, 99, 5]])
    with torch.no_grad():
        out, base = model(ids).logits, ref(ids).logits
    assert rel(out.numpy(), base.numpy()) < 2.0 ** -16


def _tiny_deepseek_v3(seed=0):
    """A tiny DeepSeek-V3: layer 0 dense, layer 1 MoE (4 routed experts, a
    shared expert, the top-k router with its correction bias), MLA attention."""
    from transformers import DeepseekV3Config, DeepseekV3ForCausalLM
    cfg = DeepseekV3Config(vocab_size=256, hidden_size=64, intermediate_size=128, moe_intermediate_size=32,
                           num_hidden_layers=2, first_k_dense_replace=1, num_attention_heads=4,
                           num_key_value_heads=4, n_routed_experts=4, n_shared_experts=1, num_experts_per_tok=2,
                           n_group=1, topk_group=1, q_lora_rank=None, kv_lora_rank=32, qk_rope_head_dim=16,
                           qk_nope_head_dim=16, v_head_dim=16, max_position_embeddings=128, bos_token_id=1,
                           eos_token_id=2, pad_token_id=0, tie_word_embeddings=False)
    return _random_model(DeepseekV3ForCausalLM, cfg, seed)


@io
@hf
def test_deepseek_v3_experts_checkpoint(tmp_path):
    """DeepSeek-V3's routed experts (mlp.experts.<e>.gate_proj / up_proj /
    down_proj, ModelOpt NVFP4) load into transformers 5's DeepseekV3Experts
    (fused like Qwen3-MoE's) as a MoeExperts; the shared expert
    (mlp.shared_experts, no index) and the router (mlp.gate, with
    e_score_correction_bias) are not experts and load as they are.  Both
    from_pretrained and load_quantized; the CPU forward (float32) is the
    dequantized model's up to the summation order (relative 2^-16)."""
    import nibble.transformers  # noqa: F401
    from nibble.transformers import NibbleConfig
    from transformers import AutoModelForCausalLM, DeepseekV3ForCausalLM
    src = _tiny_deepseek_v3()
    d = write_moe_nvfp4(src, str(tmp_path / "nvfp4"), ignore=("*mlp.gate", "*shared_experts*", "*mlp.gate_proj",
                                                              "*mlp.up_proj", "*mlp.down_proj"))
    with nibble.open_checkpoint(d) as ck:
        assert [g.prefix for g in ck.moe_groups] == ["model.layers.1.mlp.experts"]
        assert ck.layer("model.layers.1.mlp.shared_experts.gate_proj").moe_group is None
        want = nibble.moe_pack(ck.moe(ck.moe_groups[0]))
    model, info = AutoModelForCausalLM.from_pretrained(d, output_loading_info=True, dtype=torch.float32)
    assert not info["unexpected_keys"] and not info["missing_keys"], info
    ex = model.model.layers[1].mlp.experts
    assert isinstance(ex, nt.MoeExperts)
    np.testing.assert_array_equal(ex.gate_up_packed.numpy(), want.gate_up)
    np.testing.assert_array_equal(ex.down_packed.numpy(), want.down)
    assert type(model.model.layers[1].mlp.shared_experts.gate_proj) is torch.nn.Linear
    with torch.device("meta"):
        twin = DeepseekV3ForCausalLM(src.config)
    rep = nt.load_quantized(twin, d, dequantize=True, dtype=torch.float32)
    assert not rep["missing"] and not rep["unexpected"], rep
    assert rep["quantized"] == {"model.layers.1.mlp.experts": "modelopt-nvfp4"}
    ref = AutoModelForCausalLM.from_pretrained(d, quantization_config=NibbleConfig(dequantize=True),
                                               dtype=torch.float32)
    assert torch.equal(ref.model.layers[1].mlp.experts.gate_up_proj, twin.model.layers[1].mlp.experts.gate_up_proj)
    ref.config._experts_implementation = "eager"
    ids = torch.tensor([[1, 17, 33, 99, 5]])
    with torch.no_grad():
        out, base = model(ids).logits, ref(ids).logits
    assert rel(out.numpy(), base.numpy()) < 2.0 ** -16


# ----------------------------------------------------------------- GPU

def _gpu_case(fmt, act, dtype, m, top_k=2, E=8, H=128, I=64, bias=True, seed=0):
    qm = random_moe(fmt, act, E=E, H=H, I=I, bias=bias, seed=seed, scale=0.2)
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(m, H, generator=gen).to(dtype)
    ids, w = random_routing(m, E, top_k, seed=seed + 1)
    return qm, x, torch.from_numpy(ids), torch.from_numpy(w)


@gpu
@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize("act", ACTS)
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("m", [1, 3, 17, 64])
def test_gpu_op_within_twice_the_host_error(fmt, act, dtype, m):
    """nibble::moe_mlp on the GPU against nb_moe_mlp_host_f64: normwise error
    at most twice the host float reference's (which rounds at the same
    points, only summing in another order)."""
    qm, x, ids, w = _gpu_case(fmt, act, dtype, m, seed=m)
    gub, dnb = _tensor_bias(qm.gate_up_bias, dtype), _tensor_bias(qm.down_bias, dtype)
    host = nt.moe(x, ids, w, nt.pack_moe(qm, "cpu"), gub, dnb)
    pw = nt.pack_moe(qm, "cuda")
    y = nt.moe(x.cuda(), ids.cuda(), w.cuda(), pw, gub.cuda(), dnb.cuda())
    torch.cuda.synchronize()
    assert y.device.type == "cuda" and y.dtype == dtype
    bits = (lambda t: bf16_bits(t)) if dtype == torch.bfloat16 else (lambda t: t.numpy())
    exact = nibble.QuantizedMoe(qm.gate_up, qm.down, act, gate_up_bias=bits(gub), down_bias=bits(dnb))
    y64 = nibble.moe_reference(bits(x), ids.numpy(), w.numpy(), exact, out_dtype=np.float64)
    e_gpu, e_host = rel(y.float().cpu().numpy(), y64), rel(host.float().numpy(), y64)
    assert np.isfinite(y.float().cpu().numpy()).all()
    assert e_gpu <= 2 * e_host + 1e-6, (e_gpu, e_host)
    assert "moe<" in nt.last_config()


@gpu
def test_gpu_op_refusals():
    qm, x, ids, w = _gpu_case("mxfp4", "swiglu", torch.bfloat16, 4, bias=False)
    pw = nt.pack_moe(qm, "cuda")
    with pytest.raises(TypeError, match="float32"):
        nt.moe(x.float().cuda(), ids.cuda(), w.cuda(), pw)
    with pytest.raises(ValueError, match="one device"):
        nt.moe(x.cuda(), ids, w.cuda(), pw)
    with pytest.raises(ValueError, match="one device"):
        nt.moe(x, ids, w, pw)                          # CPU activations, weights on the GPU


@gpu
def test_gpu_graph_capture_replays_new_routing():
    """The op allocates only from torch's caching allocator and never
    synchronizes: captured once, a replay with other routing data gives what
    an eager call gives."""
    qm, x, ids, w = _gpu_case("nvfp4", "swiglu_oai", torch.bfloat16, 8, top_k=4, bias=True)
    pw = nt.pack_moe(qm, "cuda")
    gub, dnb = _tensor_bias(qm.gate_up_bias, torch.bfloat16).cuda(), _tensor_bias(qm.down_bias,
                                                                                   torch.bfloat16).cuda()
    sx, sids, sw = x.cuda(), ids.cuda().int(), w.cuda()
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        nt.moe(sx, sids, sw, pw, gub, dnb)           # warm-up outside the capture
    torch.cuda.current_stream().wait_stream(s)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        out = nt.moe(sx, sids, sw, pw, gub, dnb)
    ids2, w2 = random_routing(8, 8, 4, seed=42)
    sids.copy_(torch.from_numpy(ids2))
    sw.copy_(torch.from_numpy(w2))
    sx.mul_(-1)
    g.replay()
    want = nt.moe(sx, sids, sw, pw, gub, dnb)
    torch.cuda.synchronize()
    assert torch.equal(out, want)


@gpu
@hf
def test_gpu_torch_compile_of_an_moe_block():
    """torch.compile(fullgraph=True) of a Qwen3-MoE sparse block with
    MoeExperts (router in transformers, experts through the custom op)."""
    from transformers.models.qwen3_moe.modeling_qwen3_moe import Qwen3MoeSparseMoeBlock
    cfg = _tiny_qwen3().config
    cfg._experts_implementation = "eager"
    torch.manual_seed(0)
    block = Qwen3MoeSparseMoeBlock(cfg).to(torch.bfloat16).cuda().eval()
    with torch.no_grad():
        for p in block.parameters():
            p.normal_(0, 0.1)
    block.experts = nt.MoeExperts.from_module(block.experts, format="mxfp4")
    x = torch.randn(2, 5, 64, dtype=torch.bfloat16, device="cuda")
    with torch.no_grad():
        eager = block(x)
        compiled = torch.compile(block, fullgraph=True)(x)
    torch.cuda.synchronize()
    # (inductor may compute the router's softmax in another order, so the
    # routing weights, and hence y, may differ in the last bits)
    assert compiled.shape == x.shape and rel(compiled.float().cpu().numpy(), eager.float().cpu().numpy()) < 2 ** -7


@gpu
@hf
def test_gpu_quantize_model_device_quantizer_same_bytes():
    """Experts on the GPU are quantized there (nb_quantize): the packed bytes
    equal those of the host path."""
    cpu = _gptoss_experts(dtype=torch.bfloat16)
    a = nt.MoeExperts.from_module(cpu, format="nvfp4", device="cpu")
    b = nt.MoeExperts.from_module(_gptoss_experts(dtype=torch.bfloat16).cuda(), format="nvfp4")
    assert b.gate_up_packed.device.type == "cuda"
    assert torch.equal(a.gate_up_packed, b.gate_up_packed.cpu()) and torch.equal(a.down_packed, b.down_packed.cpu())
    assert torch.equal(a.weights.gate_up_scales, b.weights.gate_up_scales.cpu())


@gpu
@io
@hf
def test_gpu_load_quantized_qwen3_generates_as_dequantized(qwen3_ckpt):
    from test_load import assert_generation_agrees
    model = _meta_qwen3()
    rep = nt.load_quantized(model, qwen3_ckpt["path"], dtype=torch.bfloat16)
    assert not rep["missing"] and not rep["unexpected"]
    assert all(isinstance(model.model.layers[i].mlp.experts, nt.MoeExperts) for i in range(2))
    ref = _meta_qwen3()
    nt.load_quantized(ref, qwen3_ckpt["path"], dequantize=True, device="cuda", dtype=torch.bfloat16)
    ref.config._experts_implementation = "eager"
    assert_generation_agrees(model, ref)


@io
@hf
def test_transformers_loads_qwen3_experts(qwen3_ckpt):
    """from_pretrained of the per-expert ModelOpt checkpoint (quant_method
    "modelopt", nibble's by registration): each Qwen3MoeExperts becomes a
    MoeExperts holding nb_moe_pack_host of the reader's group, nothing is
    reported unexpected, and the CPU forward (host reference) follows the
    dequantized model."""
    import nibble.transformers  # noqa: F401  (registers the quantizer)
    from nibble.transformers import NibbleConfig
    from transformers import AutoModelForCausalLM
    model, info = AutoModelForCausalLM.from_pretrained(qwen3_ckpt["path"], output_loading_info=True)
    assert not info["unexpected_keys"] and not info["missing_keys"]
    with nibble.open_checkpoint(qwen3_ckpt["path"]) as ck:
        for g in ck.moe_groups:
            ex = model.get_submodule(g.prefix)
            assert isinstance(ex, nt.MoeExperts)
            want = nibble.moe_pack(ck.moe(g))
            np.testing.assert_array_equal(ex.gate_up_packed.numpy(), want.gate_up)
            np.testing.assert_array_equal(ex.weights.down_scales.numpy(), want.down_scales)
    ref = AutoModelForCausalLM.from_pretrained(qwen3_ckpt["path"], quantization_config=NibbleConfig(dequantize=True))
    ids = torch.tensor([[1, 17, 33, 99, 5]])
    with torch.no_grad():
        out, base = model(ids).logits.float(), ref(ids).logits.float()
    assert rel(out.numpy(), base.numpy()) < 2 ** -5


@gpu
@io
@hf
def test_gpu_transformers_qwen3_generates_as_dequantized(qwen3_ckpt):
    pytest.importorskip("accelerate")
    from test_load import assert_generation_agrees
    from nibble.transformers import NibbleConfig
    from transformers import AutoModelForCausalLM
    model = AutoModelForCausalLM.from_pretrained(qwen3_ckpt["path"], device_map="cuda")
    assert model.model.layers[0].mlp.experts.gate_up_packed.device.type == "cuda"
    ref = AutoModelForCausalLM.from_pretrained(qwen3_ckpt["path"], device_map="cuda",
                                               quantization_config=NibbleConfig(dequantize=True))
    assert_generation_agrees(model, ref)
