"""The end-to-end decode benchmark's own code (python/bench/e2e_decode.py) on
the CPU: its static-cache decoder against transformers' generate(), and one
tiny run of the whole program (the quantized formats run as dequantized
weights there).  Skipped without torch and transformers."""

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


def test_tiny_run_writes_results(tmp_path):
    rows, checks = e2e.main(["--tiny", "--device", "cpu", "--layers", "2", "--batches", "1,2", "--steps", "2",
                             "--warmup", "1", "--prompt", "4", "--check-steps", "3", "--out", str(tmp_path)])
    assert [(r["format"], r["batch"]) for r in rows] == [(f, b) for f in e2e.FORMATS for b in (1, 2)]
    assert all(r["tokens_per_s"] > 0 and 0 < r["gemm_share"] for r in rows)
    assert [c["format"] for c in checks] == ["nvfp4", "mxfp4"]
    assert all(c["ok"] and c["agree"] == c["forced_agree"] == c["steps"] == 4 for c in checks)
    data = json.loads((tmp_path / "e2e_decode.json").read_text())
    assert data["meta"]["layers"] == 2 and len(data["rows"]) == 6
    assert (tmp_path / "e2e_decode.csv").read_text().count("\n") == 7
    with pytest.raises(SystemExit):
        e2e.main(["--formats", "int8", "--device", "cpu"])


def test_check_flags_wrong_weights():
    """check() against weights that are not the ones the model runs (MXFP4
    reference, NVFP4 model) reports a mismatch; against the right ones, OK."""
    cfg = e2e.llama_config(2, tiny=True)
    model = e2e.build_model(cfg, torch.device("cpu"), torch.bfloat16, seed=0)
    with torch.no_grad():
        for p in model.parameters():
            if p.dim() == 2:
                p.mul_(5)
    linears = {n: m for n, m in model.named_modules() if isinstance(m, torch.nn.Linear) and "lm_head" not in n}
    nv = e2e.quantize_cpu(model, "nvfp4", linears)
    import nibble
    mx = {n: nibble.quantize(m.weight.detach().float().numpy(), format="mxfp4") for n, m in linears.items()}
    prompt = torch.randint(0, cfg.vocab_size, (1, 6), generator=torch.Generator().manual_seed(5))
    good = e2e.check(model, nv, linears, prompt, 6, torch.device("cpu"), torch.bfloat16, "nvfp4")
    bad = e2e.check(model, mx, linears, prompt, 6, torch.device("cpu"), torch.bfloat16, "nvfp4")
    assert good["ok"] and good["logits_rel_error"] == 0
    assert not bad["ok"] and bad["logits_rel_error"] > e2e.MAX_LOGITS_REL_ERROR, bad
