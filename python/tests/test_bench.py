"""The end-to-end decode benchmark's own code (python/bench/e2e_decode.py) on
the CPU: its static-cache decoder against transformers' generate(), one
tiny run of the whole program (the quantized formats run as dequantized
weights there), its argument checks, the float32-twin correctness check, and
the compiled step traced by Dynamo (fullgraph; the eager backend on the CPU).
On a GPU with a CUDA build of libnibble, one tiny run of both modes with
Inductor and nibble's op.  Skipped without torch and transformers."""

import json
import os
import sys

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

BENCH = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "bench")
sys.path.insert(0, BENCH)
import e2e_decode as e2e  # noqa: E402


def test_decoder_matches_transformers_generate():
    cfg = e2e.llama_config(3, tiny=True)
    model = e2e.build_model(cfg, torch.device("cpu"), torch.float32, seed=0)
    with torch.no_grad():   # larger weights than the init: decisive greedy choices
        for p in model.parameters():
            if p.dim() == 2:
                p.mul_(5)
    prompt = torch.randint(0, cfg.vocab_size, (2, 7), generator=torch.Generator().manual_seed(3))
    tokens, logits = e2e.greedy(model, prompt, 10)
    with torch.no_grad():
        ref = model.generate(prompt, max_new_tokens=11, do_sample=False, eos_token_id=None, pad_token_id=0)
        ref_first = model(prompt).logits[:, -1]
    assert torch.equal(tokens, ref[:, 7:])
    torch.testing.assert_close(logits[0], ref_first, rtol=1e-4, atol=1e-4)
    # teacher forcing with the greedy tokens themselves changes nothing
    forced, _ = e2e.greedy(model, prompt, 10, forced=tokens)
    assert torch.equal(forced, tokens)


def test_profile_summary():
    # two steps of four activities, one overlapping its predecessor, a 2 us gap in each step
    kern = []
    for base in (0.0, 100.0):
        kern += [(base + 0, base + 10, "void gemv_fp4_kernel<1, 3, 1, 8, 4, true>(GemvParams)"),
                 (base + 8, base + 12, "triton_red_fused__to_copy_add_gemm_mean_mul_pow_rsqrt_11"),
                 (base + 14, base + 20, "cudnn_generated_fort_native_sdpa_sm90_flash_fprop_wgmma_f16"),
                 (base + 20, base + 30, "nvjet_sm90_tst_256x8_64x6_2x1_v_bz_TNT")]
    summary, text = e2e.summarize_kernels(kern, 2, "t")
    assert summary["kernels_per_step"] == 4 and summary["span_us"] == 65.0   # (0 .. 130) / 2
    assert summary["busy_us"] == 28.0   # per step 0..12, 14..30 (the 8..10 overlap once, the 12..14 gap out)
    kinds = summary["kinds"]
    assert kinds["nibble"] == {"launches": 1, "us": 10} and kinds["inductor (triton)"]["us"] == 4
    assert kinds["attention"]["us"] == 6 and kinds["gemm (cuBLAS)"]["us"] == 10
    assert "busy 28.0 us (idle 37.0)" in text.splitlines()[0]
    assert e2e.kernel_kind("Memset (Unknown)") == "copy / set" and e2e.kernel_kind("foo") == "other"
    assert e2e.kernel_kind("void glu_kernel<3, 1, true>(void const*, void*, long, long, int, float, float)") == "nibble"
    assert e2e.summarize_kernels([], 1, "t")[0] == {"error": "the profiler recorded no kernels"}


def test_tiny_run_writes_results(tmp_path, monkeypatch):
    monkeypatch.setenv("NIBBLE_PDL", "0")   # recorded with the results (meta.nibble_env), the library path not
    rows, checks = e2e.main(["--tiny", "--device", "cpu", "--layers", "2", "--batches", "1,2", "--steps", "2",
                             "--warmup", "1", "--prompt", "4", "--check-steps", "3", "--out", str(tmp_path)])
    assert [(r["format"], r["mode"], r["batch"]) for r in rows] == [(f, "eager", b) for f in e2e.FORMATS
                                                                    for b in (1, 2)]
    assert all(r["tokens_per_s"] > 0 and 0 < r["gemm_share"] for r in rows)
    assert [c["format"] for c in checks] == ["nvfp4", "mxfp4"]
    # the CPU stand-in is the BF16 dequantized model itself: same distance to the twin
    assert all(c["ok"] and c["agree"] == c["forced_agree"] == c["steps"] == 4 for c in checks)
    assert all(c["d_nibble"] == c["d_bf16"] > 0 and c["ratio"] == 1 for c in checks)
    assert e2e.exit_code(rows, checks) == 0
    data = json.loads((tmp_path / "e2e_decode.json").read_text())
    assert data["meta"]["layers"] == 2 and len(data["rows"]) == 6 and data["meta"]["modes"] == ["eager"]
    assert data["meta"]["nibble_env"]["NIBBLE_PDL"] == "0" and "NIBBLE_LIBRARY" not in data["meta"]["nibble_env"]
    assert data["meta"]["inductor_pdl"] is (e2e.inductor_pdl_default() is True)
    assert (tmp_path / "e2e_decode.csv").read_text().count("\n") == 7
    with pytest.raises(SystemExit):
        e2e.main(["--formats", "fp8", "--device", "cpu"])


def test_tiny_run_integer_formats(tmp_path):
    """--formats takes the integer and table formats quantize_model serves;
    on the CPU stand-in the model is their dequantized model, so the check
    against the float32 twin holds exactly as for the FP4 formats."""
    rows, checks = e2e.main(["--tiny", "--device", "cpu", "--layers", "2", "--batches", "1", "--steps", "2",
                             "--warmup", "1", "--prompt", "4", "--check-steps", "3", "--formats",
                             "bf16,int4,int4_sym,int8,nf4", "--out", str(tmp_path)])
    assert [r["format"] for r in rows] == ["bf16", "int4", "int4_sym", "int8", "nf4"]
    assert all(r["tokens_per_s"] > 0 for r in rows)
    assert [c["format"] for c in checks] == ["int4", "int4_sym", "int8", "nf4"]
    assert all(c["ok"] and c["d_nibble"] == c["d_bf16"] > 0 for c in checks)
    assert e2e.exit_code(rows, checks) == 0


def test_arguments(capsys):
    _, a = e2e.parse_args(["--device", "cpu"])
    assert a.layers == 32 and a.modes == ["eager"] and a.batches == [1, 8, 32] and a.formats == list(e2e.FORMATS)
    _, a = e2e.parse_args(["--device", "cpu", "--shape", "70b", "--formats", "BF16,nvfp4", "--batches", "1, 8"])
    assert a.layers == 10 and a.formats == ["bf16", "nvfp4"] and a.batches == [1, 8]
    assert e2e.llama_config(a.layers, shape="70b").hidden_size == 8192
    _, a = e2e.parse_args(["--device", "cpu", "--tiny", "--modes", "eager"])
    assert a.layers == 2
    for bad, why in ((["--modes", "compiled"], "needs a CUDA device"), (["--modes", "eager,jit"], "unknown mode"),
                     (["--batches", "1,x"], "comma list of integers"), (["--batches", "0"], "must be positive"),
                     (["--shape", "13b"], "invalid choice"), (["--compile-mode", "fast"], "invalid choice"),
                     (["--check-factor", "0"], "must be positive")):
        with pytest.raises(SystemExit):
            e2e.parse_args(["--device", "cpu"] + bad)
        assert why in capsys.readouterr().err, bad


def decisive_tiny(layers, dtype, batch_seed=0):
    cfg = e2e.llama_config(layers, tiny=True)
    model = e2e.build_model(cfg, torch.device("cpu"), dtype, seed=batch_seed)
    with torch.no_grad():   # larger weights than the init: decisive greedy choices
        for p in model.parameters():
            if p.dim() == 2:
                p.mul_(5)
    return cfg, model


def test_compiled_step_traces_whole():
    """The decode step compiles as one graph (fullgraph: no break) and the
    compiled step decodes the eager step's tokens; a step with a graph break
    is refused with CompileError, not run eagerly."""
    cfg, model = decisive_tiny(2, torch.float32)
    prompt = torch.randint(0, cfg.vocab_size, (2, 5), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        dec = e2e.Decoder(model, 2, 32)
        fn, seconds, diff = e2e.compile_step(dec, prompt, backend="eager")
        assert seconds >= 0 and diff == 0 and e2e._graphs_compiled() == 1
        dec.prefill(prompt)
        for _ in range(6):
            fn()
        compiled = dec.hist.clone()
        dec.prefill(prompt)
        for _ in range(6):
            dec.step()
        assert torch.equal(compiled, dec.hist) and e2e._graphs_compiled() == 1

        class Broken(e2e.Decoder):
            def step(self):
                torch._dynamo.graph_break()
                return super().step()
        with pytest.raises(e2e.CompileError, match="failed"):
            e2e.compile_step(Broken(model, 2, 32), prompt, backend="eager")
    e2e._dynamo().reset()


def test_float32_rest_restores():
    _, model = decisive_tiny(1, torch.bfloat16)
    before = {n: (p.data_ptr(), p.dtype) for n, p in model.named_parameters()}
    with e2e.float32_rest(model):
        assert all(p.dtype == torch.float32 for p in model.parameters())
        assert not torch.backends.cuda.matmul.allow_tf32
    assert all(p.data_ptr() == before[n][0] and p.dtype == before[n][1] for n, p in model.named_parameters())


gpu = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")


@gpu
def test_tiny_run_both_modes_cuda(tmp_path):
    """Both modes on the GPU with Inductor and nibble's op in the graph: no
    row fails, the compiled step agrees with the eager one, the checks pass."""
    import nibble
    if not nibble.build_info()["cuda"]:
        pytest.skip("libnibble built without CUDA")
    rows, checks = e2e.main(["--tiny", "--layers", "2", "--batches", "1,4", "--steps", "4", "--warmup", "2",
                             "--prompt", "4", "--formats", "bf16,nvfp4", "--check-steps", "4",
                             "--out", str(tmp_path)])
    assert [(r["format"], r["mode"], r["batch"]) for r in rows] == [
        (f, m, b) for f in ("bf16", "nvfp4") for b in (1, 4) for m in ("eager", "compiled")]
    assert all(r["step_ms"] and r["step_ms"] > 0 for r in rows), [r.get("error") for r in rows]
    assert all(r["graph"].startswith("torch.compile") and r["compiled_vs_eager"] <= e2e.MAX_COMPILED_DIFF
               for r in rows if r["mode"] == "compiled")
    assert [c["format"] for c in checks] == ["nvfp4"] and checks[0]["ok"], checks
    assert e2e.exit_code(rows, checks) == 0


def test_check_flags_wrong_weights():
    """check() against weights that are not the ones the model runs (MXFP4
    reference and twin, NVFP4 model) reports a mismatch: the model is much
    further from the float32 twin than the BF16 dequantized model is.
    Against the right ones, OK."""
    cfg, model = decisive_tiny(2, torch.bfloat16)
    linears = {n: m for n, m in model.named_modules() if isinstance(m, torch.nn.Linear) and "lm_head" not in n}
    nv = e2e.quantize_cpu(model, "nvfp4", linears)
    import nibble
    mx = {n: nibble.quantize(m.weight.detach().float().numpy(), format="mxfp4") for n, m in linears.items()}
    prompt = torch.randint(0, cfg.vocab_size, (1, 6), generator=torch.Generator().manual_seed(5))
    good = e2e.check(model, nv, linears, prompt, 6, torch.device("cpu"), torch.bfloat16, "nvfp4")
    bad = e2e.check(model, mx, linears, prompt, 6, torch.device("cpu"), torch.bfloat16, "nvfp4")
    assert good["ok"] and good["logits_rel_error"] == 0 and good["d_nibble"] == good["d_bf16"] > 0
    assert not bad["ok"] and bad["d_nibble"] > e2e.CHECK_FACTOR * bad["d_bf16"], bad
    assert "MISMATCH" in e2e.check_line(bad) and e2e.exit_code([], [good, bad]) == 2
    # the model's parameters are BF16 again after the float32 twin
    assert all(p.dtype == torch.bfloat16 for p in model.parameters())


def test_compile_step_inductor_pdl(monkeypatch):
    """--inductor-pdl compiles with torch._inductor.config.triton.enable_pdl set
    (and only for that compilation), and says so where this torch lacks it."""
    import torch._inductor.config as ic
    if e2e.inductor_pdl_default() is None:
        with pytest.raises(e2e.CompileError, match="enable_pdl"):
            e2e.compile_step(None, None, pdl=True)
        return
    seen = []
    orig = e2e.compile_step
    monkeypatch.setattr(e2e, "compile_step", lambda *a, **k: seen.append(ic.triton.enable_pdl) or "compiled")
    before = ic.triton.enable_pdl
    assert orig(None, None, pdl=True) == "compiled" and seen == [True]
    assert ic.triton.enable_pdl == before
    monkeypatch.setattr(e2e, "inductor_pdl_default", lambda: None)
    with pytest.raises(e2e.CompileError, match="enable_pdl"):
        orig(None, None, pdl=True)
