"""Tests of nibble.fuse (fuse_linears, fuse_projections, unfuse_projections).

On the CPU: a tiny random LlamaForCausalLM, its q/k/v and gate/up
projections fused as float layers and as nibble layers (the op's host
reference on CPU tensors); the fused model's logits against the unfused
model's, one GEMM call per group (counted in eager mode and in the graph
torch.compile traces), exact weights after fuse and unfuse, the refusals.
The GPU test runs the same comparison with the CUDA kernels.

Run on a GPU machine:  python3 -m pytest python/tests/test_fuse.py
"""

import numpy as np
import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

import nibble.torch as nt  # noqa: E402
from nibble import fuse as nf  # noqa: E402

gpu = pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device")


def tiny_llama(layers=2, seed=0, dtype=torch.float32):
    from transformers import LlamaConfig, LlamaForCausalLM
    torch.manual_seed(seed)
    cfg = LlamaConfig(vocab_size=256, hidden_size=128, intermediate_size=256, num_attention_heads=4,
                      num_key_value_heads=2, num_hidden_layers=layers)
    return LlamaForCausalLM(cfg).to(dtype).eval()


def count_calls(model, name):
    """Wrap the forward of every module called `name` to count its calls."""
    counts = []
    for mod_name, mod in model.named_modules():
        if mod_name.endswith("." + name):
            orig = mod.forward
            counts.append(0)
            i = len(counts) - 1

            def fwd(x, orig=orig, i=i):
                counts[i] += 1
                return orig(x)
            mod.forward = fwd
    return counts


def packed_bytes(model):
    return {n: m.packed.clone() for n, m in model.named_modules() if isinstance(m, nt.Linear)}


def test_dense_fuse_same_logits_one_call_per_group():
    m = tiny_llama()
    ids = torch.randint(0, 256, (2, 7), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        ref = m(ids).logits
        r = nt.fuse_projections(m)
        assert sorted(r["fused"]) == sorted(f"model.layers.{i}.{g}" for i in range(2)
                                            for g in ("self_attn.qkv_proj", "mlp.gate_up_proj"))
        assert r["skipped"] == {}
        a = m.model.layers[0].self_attn
        assert isinstance(a.q_proj, nt.ProjectionSlice) and a.qkv_proj.out_features == 128 + 64 + 64
        assert (a.q_proj.start, a.q_proj.stop, a.k_proj.stop, a.v_proj.stop) == (0, 128, 192, 256)
        assert a.k_proj.in_features == 128 and a.k_proj.out_features == 64
        qkv, gu = count_calls(m, "qkv_proj"), count_calls(m, "gate_up_proj")
        out = m(ids).logits
        assert qkv == [1, 1] and gu == [1, 1]
        torch.testing.assert_close(out, ref, rtol=1e-5, atol=1e-5)
        # the kept output is released once every member took its columns
        assert a.q_proj._stash.y is None and a.q_proj._stash.x is None


def test_member_called_alone_or_with_other_input():
    m = tiny_llama(layers=1)
    a = m.model.layers[0].self_attn
    q, k, v = a.q_proj, a.k_proj, a.v_proj
    nt.fuse_projections(m)
    x, x2 = torch.randn(3, 128), torch.randn(3, 128)
    with torch.no_grad():
        torch.testing.assert_close(a.k_proj(x), k(x), rtol=1e-5, atol=1e-5)      # alone, first member skipped
        torch.testing.assert_close(a.q_proj(x), q(x), rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(a.k_proj(x2), k(x2), rtol=1e-5, atol=1e-5)    # another input: computed again
        torch.testing.assert_close(a.v_proj(x2), v(x2), rtol=1e-5, atol=1e-5)
        y = a.q_proj(x)
        x.add_(1.0)                                                              # changed in place: not reused
        torch.testing.assert_close(a.k_proj(x), k(x), rtol=1e-5, atol=1e-5)
        assert y.shape == (3, 128)


def test_nibble_fuse_exact_and_unfuse_restores_bytes():
    m = tiny_llama()
    nt.quantize_model(m, format="mxfp4", device="cpu")
    before = packed_bytes(m)
    before_q = {n: mod.quantized_weight() for n, mod in m.named_modules() if isinstance(mod, nt.Linear)}
    ids = torch.randint(0, 256, (1, 5), generator=torch.Generator().manual_seed(2))
    with torch.no_grad():
        ref = m(ids).logits
        r = nt.fuse_projections(m)
        assert len(r["fused"]) == 4 and r["skipped"] == {}
        for layer in range(2):
            for fused_name, members in (("self_attn.qkv_proj", ("q", "k", "v")), ("mlp.gate_up_proj", ("gate", "up"))):
                fused = m.get_submodule(f"model.layers.{layer}.{fused_name}")
                parts = [before_q[f"model.layers.{layer}.{fused_name.split('.')[0]}.{p}_proj"] for p in members]
                assert isinstance(fused, nt.Linear) and fused.format == "mxfp4"
                assert fused.out_features == sum(p.n for p in parts)
                qf = fused.quantized_weight()
                assert np.array_equal(qf.codes, np.concatenate([p.codes for p in parts]))
                assert np.array_equal(qf.scales, np.concatenate([p.scales for p in parts]))
        out = m(ids).logits
        assert torch.equal(out, ref)   # the host reference computes every output element as before
        removed = nt.unfuse_projections(m)
        assert len(removed) == 4 and not hasattr(m.model.layers[0].self_attn, "qkv_proj")
        after = packed_bytes(m)
        assert set(after) == set(before)
        for n in before:
            assert torch.equal(after[n], before[n]), n
        assert torch.equal(m(ids).logits, ref)


def test_nvfp4_tensor_scales():
    # quantize_model gives each group one tensor scale (the default): fused exactly
    m = tiny_llama(layers=1)
    ids = torch.randint(0, 256, (1, 4), generator=torch.Generator().manual_seed(6))
    nt.quantize_model(m, format="nvfp4", device="cpu")
    a, mlp = m.model.layers[0].self_attn, m.model.layers[0].mlp
    assert a.q_proj.tensor_scale == a.k_proj.tensor_scale == a.v_proj.tensor_scale != a.o_proj.tensor_scale
    assert mlp.gate_proj.tensor_scale == mlp.up_proj.tensor_scale
    w = torch.cat([tiny_llama(layers=1).model.layers[0].self_attn.get_submodule(p).weight.detach()
                   for p in ("q_proj", "k_proj", "v_proj")])
    import nibble
    assert nibble.quantize(w.numpy(), format="nvfp4").tensor_scale == a.q_proj.tensor_scale   # as the rows together
    with torch.no_grad():
        ref = m(ids).logits
        assert len(nt.fuse_projections(m)["fused"]) == 2
        assert torch.equal(m(ids).logits, ref)
    # quantized separately (fused_scales=False): three tensor scales, not fused (nothing changes)
    m = tiny_llama(layers=1)
    nt.quantize_model(m, format="nvfp4", device="cpu", fused_scales=False)
    r = nt.fuse_projections(m)
    assert r["fused"] == [] and set(r["skipped"]) == {"model.layers.0.self_attn.qkv_proj",
                                                      "model.layers.0.mlp.gate_up_proj"}
    assert all("tensor scales differ" in why for why in r["skipped"].values())
    assert isinstance(m.model.layers[0].self_attn.q_proj, nt.Linear)
    # fused first, then quantized: one layer, one tensor scale
    m = tiny_llama(layers=1)
    ids = torch.randint(0, 256, (1, 4), generator=torch.Generator().manual_seed(3))
    nt.fuse_projections(m)
    rq = nt.quantize_model(m, format="nvfp4", device="cpu")
    assert "model.layers.0.self_attn.qkv_proj" in rq["quantized"]
    assert not any(n.endswith(("q_proj", "k_proj", "gate_proj")) for n in rq["quantized"])
    a = m.model.layers[0].self_attn
    assert isinstance(a.qkv_proj, nt.Linear) and a.q_proj.fused is a.qkv_proj   # the slices read the new layer
    with torch.no_grad():
        out = m(ids).logits
        nt.unfuse_projections(m)
        assert isinstance(a.k_proj, nt.Linear) and a.k_proj.tensor_scale == a.q_proj.tensor_scale
        assert torch.equal(m(ids).logits, out)
        # same tensor scales: quantized layers fuse again, exactly
        assert len(nt.fuse_projections(m)["fused"]) == 2
        assert torch.equal(m(ids).logits, out)


def test_fuse_linears_refusals():
    a, b = torch.nn.Linear(64, 32), torch.nn.Linear(64, 16, bias=False)
    f = nt.fuse_linears([a, b])
    assert f.weight.shape == (48, 64) and torch.equal(f.bias[32:], torch.zeros(16))
    x = torch.randn(2, 64)
    with torch.no_grad():
        torch.testing.assert_close(f(x), torch.cat([a(x), b(x)], -1))
    with pytest.raises(TypeError):
        nt.fuse_linears([a])
    with pytest.raises(ValueError, match="in_features"):
        nt.fuse_linears([a, torch.nn.Linear(32, 16)])
    with pytest.raises(ValueError, match="dtypes"):
        nt.fuse_linears([a, torch.nn.Linear(64, 16).to(torch.bfloat16)])
    import nibble
    qa = nt.Linear.from_quantized(nibble.quantize(a.weight.detach().numpy(), format="mxfp4"), device="cpu")
    qn = nt.Linear.from_quantized(nibble.quantize(b.weight.detach().numpy(), format="nvfp4"), device="cpu")
    with pytest.raises(TypeError, match="all nibble.torch.Linear"):
        nt.fuse_linears([qa, b])
    with pytest.raises(ValueError, match="formats"):
        nt.fuse_linears([qa, qn])
    q1 = nt.Linear.from_quantized(nibble.quantize(a.weight.detach().numpy(), format="nvfp4", tensor_scale=0.5),
                                  device="cpu")
    q2 = nt.Linear.from_quantized(nibble.quantize(b.weight.detach().numpy(), format="nvfp4", tensor_scale=0.25),
                                  device="cpu")
    with pytest.raises(ValueError, match="tensor scales differ"):
        nt.fuse_linears([q1, q2])
    q2s = nt.Linear.from_quantized(nibble.quantize(b.weight.detach().numpy(), format="nvfp4", tensor_scale=0.5),
                                   device="cpu", perm=torch.arange(64).flip(0))
    with pytest.raises(ValueError, match="activation orders"):
        nt.fuse_linears([q1, q2s])
    with pytest.raises(ValueError, match="groups must be"):
        nt.fuse_projections(tiny_llama(layers=1), groups=[("qkv", ("q_proj",))])
    with pytest.raises(TypeError, match="torch.nn.Module"):
        nt.fuse_projections("model")
    with pytest.raises(TypeError, match="torch.nn.Module"):
        nt.unfuse_projections(None)
    ntf = pytest.importorskip("nibble.transformers")
    with pytest.raises(ValueError, match="fuse must be True or False"):
        ntf.NibbleConfig(fuse="yes")


def test_save_layout_of_a_fused_model():
    ntf = pytest.importorskip("nibble.transformers")
    m = tiny_llama(layers=1)
    nt.quantize_model(m, format="mxfp4", device="cpu", exclude=["lm_head", "*.mlp.*"])
    before = ntf.save_layout(m)
    nt.fuse_projections(m)
    after = ntf.save_layout(m)   # the members, as the unfused model lists them
    assert after == before and "model.layers.0.mlp.gate_proj" in after["unquantized"]
    assert not any("qkv_proj" in n or "gate_up_proj" in n for n in after["unquantized"])


def test_transformers_fuse_at_load_and_save(tmp_path):
    """NibbleConfig(fuse=True): the loaded model's groups are fused (an
    MXFP4 checkpoint: no tensor scales to differ), it computes what the
    unfused model computes, and save_pretrained writes the same tensors the
    unfused model writes; NVFP4, quantized at load or by `nibble quantize`,
    gives each group one tensor scale, so it fuses too (and with
    fused_scales=False it does not, and says why)."""
    import nibble
    from test_load import HAS_IO, reference_model, write_model
    if not HAS_IO:
        pytest.skip("no checkpoint API (package built without cJSON)")
    from nibble.transformers import NibbleConfig
    from transformers import AutoModelForCausalLM
    bf16, mx = str(tmp_path / "bf16"), str(tmp_path / "mx")
    write_model(reference_model(), bf16)
    nibble.quantize_checkpoint(bf16, mx, format="mxfp4", device="cpu")
    plain = AutoModelForCausalLM.from_pretrained(mx, quantization_config=NibbleConfig())
    cfg = NibbleConfig(fuse=True)
    fused = AutoModelForCausalLM.from_pretrained(mx, quantization_config=cfg)
    rep = fused.hf_quantizer.quantization_config.fuse_report
    assert len(rep["fused"]) == 4 and rep["skipped"] == {}, rep
    assert isinstance(fused.model.layers[1].mlp.up_proj, nt.ProjectionSlice)
    ids = torch.tensor([[1, 17, 33, 99, 5]])
    with torch.no_grad():
        assert torch.equal(fused(ids).logits, plain(ids).logits)
    a, b = str(tmp_path / "saved-fused"), str(tmp_path / "saved-plain")
    fused.save_pretrained(a)
    plain.save_pretrained(b)
    with nibble.open_checkpoint(a) as ca, nibble.open_checkpoint(b) as cb:
        names = sorted(t.name for t in cb.tensors)
        assert sorted(t.name for t in ca.tensors) == names and any(n.endswith("q_proj.weight_scale") for n in names)
        for n in names:
            np.testing.assert_array_equal(ca.tensor(n), cb.tensor(n))
    # NVFP4 quantized at load: a group's members are quantized together once all are read (one tensor scale)
    nv = AutoModelForCausalLM.from_pretrained(bf16, quantization_config=NibbleConfig(format="nvfp4", fuse=True))
    rep = nv.hf_quantizer.quantization_config.fuse_report
    assert len(rep["fused"]) == 4 and rep["skipped"] == {}, rep
    nv_plain = AutoModelForCausalLM.from_pretrained(bf16, quantization_config=NibbleConfig(format="nvfp4"))
    with torch.no_grad():
        assert torch.equal(nv(ids).logits, nv_plain(ids).logits)
    # `nibble quantize` NVFP4: q/k/v and gate/up share their tensor scales (ModelOpt's convention), so they fuse
    for shared in (True, False):
        nvd = str(tmp_path / f"nv-{shared}")
        nibble.quantize_checkpoint(bf16, nvd, format="nvfp4", device="cpu", fused_scales=shared)
        with nibble.open_checkpoint(nvd) as ck:
            ts = {L.prefix.rpartition(".")[2]: L.tensor_scale for L in ck.layers if ".layers.0." in L.prefix}
        assert (ts["q_proj"] == ts["k_proj"] == ts["v_proj"] and ts["gate_proj"] == ts["up_proj"]) == shared, ts
        plain = AutoModelForCausalLM.from_pretrained(nvd, quantization_config=NibbleConfig())
        fused = AutoModelForCausalLM.from_pretrained(nvd, quantization_config=NibbleConfig(fuse=True))
        rep = fused.hf_quantizer.quantization_config.fuse_report
        assert len(rep["fused"]) == (4 if shared else 0), rep
        with torch.no_grad():
            assert torch.equal(fused(ids).logits, plain(ids).logits)


def _compiled_ops(m, ids):
    """torch.compile(fullgraph=True) of m on ids with a backend that keeps
    the graph: the graph's call_function targets (as strings), and the
    compiled and eager logits."""
    graphs = []

    def backend(gm, example_inputs):
        graphs.append(gm)
        return gm.forward

    torch._dynamo.reset()
    with torch.no_grad():
        eager = m(ids).logits
        out = torch.compile(m, backend=backend, fullgraph=True)(ids).logits
    torch._dynamo.reset()
    assert len(graphs) == 1
    return [str(n.target) for n in graphs[0].graph.nodes if n.op == "call_function"], out, eager


def test_compiled_graph_holds_one_gemm_per_group():
    m = tiny_llama()
    nt.quantize_model(m, format="mxfp4", device="cpu")
    nt.fuse_projections(m)
    ids = torch.randint(0, 256, (1, 6), generator=torch.Generator().manual_seed(4))
    ops, out, eager = _compiled_ops(m, ids)
    assert sum("nibble.gemm" in o for o in ops) == 2 * 4    # per layer: qkv, o, gate_up, down
    torch.testing.assert_close(out, eager, rtol=0, atol=0)


@gpu
def test_gpu_fused_model():
    m = tiny_llama(dtype=torch.bfloat16).cuda()
    ids = torch.randint(0, 256, (2, 9), generator=torch.Generator().manual_seed(5)).cuda()
    for fmt in ("nvfp4", "mxfp4"):
        mm = tiny_llama(dtype=torch.bfloat16).cuda()
        nt.quantize_model(mm, format=fmt)
        with torch.no_grad():
            ref = mm(ids).logits.float()
            if fmt == "mxfp4":
                assert len(nt.fuse_projections(mm)["fused"]) == 4
            else:   # NVFP4: fuse the float layers, then quantize the fused ones
                mm = tiny_llama(dtype=torch.bfloat16).cuda()
                nt.fuse_projections(mm)
                nt.quantize_model(mm, format=fmt)
                nt.unfuse_projections(mm)
                ref = mm(ids).logits.float()
                assert len(nt.fuse_projections(mm)["fused"]) == 4
            out = mm(ids).logits.float()
        # the fused GEMM may pick another kernel configuration: BF16 rounding apart
        assert (out - ref).norm() / ref.norm() < 2e-2, fmt
    del m


def test_fuse_glu_routes_mlps_and_unfuse_restores():
    m = tiny_llama()
    nt.quantize_model(m, format="mxfp4", device="cpu")
    ids = torch.randint(0, 256, (1, 5), generator=torch.Generator().manual_seed(7))
    with torch.no_grad():
        ref = m(ids).logits
        nt.fuse_projections(m)
        r = nt.fuse_glu(m)
        assert sorted(r["glu"]) == [f"model.layers.{i}.mlp" for i in range(2)] and r["skipped"] == {}
        assert "forward" in vars(m.model.layers[0].mlp)
        assert nt.fuse_glu(m)["glu"] == []                      # already routed: left as it is
        out = m(ids).logits
        # float32 on the CPU: nb_glu_host's expf against torch's silu, a few float ulps apart
        torch.testing.assert_close(out, ref, rtol=1e-4, atol=1e-5)
        nt.unfuse_projections(m)
        assert "forward" not in vars(m.model.layers[0].mlp)
        assert torch.equal(m(ids).logits, ref)


def test_fuse_glu_compiled_graph_holds_the_glu_op():
    m = tiny_llama()
    nt.quantize_model(m, format="mxfp4", device="cpu")
    nt.fuse_projections(m)
    nt.fuse_glu(m)
    ids = torch.randint(0, 256, (1, 6), generator=torch.Generator().manual_seed(8))
    ops, out, eager = _compiled_ops(m, ids)
    assert sum("nibble.glu" in o for o in ops) == 2 and sum("nibble.gemm" in o for o in ops) == 2 * 4
    torch.testing.assert_close(out, eager, rtol=0, atol=0)


def test_fuse_glu_skips_what_it_cannot_route():
    class AddMlp(torch.nn.Module):     # down(act(gate) + up): not a gated product
        def __init__(self):
            super().__init__()
            self.gate_proj, self.up_proj = torch.nn.Linear(128, 64, bias=False), torch.nn.Linear(128, 64, bias=False)
            self.down_proj, self.act_fn = torch.nn.Linear(64, 128, bias=False), torch.nn.SiLU()

        def forward(self, x):
            return self.down_proj(self.act_fn(self.gate_proj(x)) + self.up_proj(x))

    m = tiny_llama(layers=2)
    m.model.layers[1].mlp.act_fn = torch.nn.GELU()
    m.model.layers[0].mlp = AddMlp()
    nt.quantize_model(m, format="mxfp4", device="cpu")
    nt.fuse_projections(m)
    r = nt.fuse_glu(m)
    assert r["glu"] == []
    assert "differs" in r["skipped"]["model.layers.0.mlp"], r
    assert "not SiLU" in r["skipped"]["model.layers.1.mlp"], r
    assert "forward" not in vars(m.model.layers[0].mlp)
    with pytest.raises(TypeError):
        nt.fuse_glu("model")
