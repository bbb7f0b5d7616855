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
    tokens, first = e2e.greedy(model, prompt, 10)
    with torch.no_grad():
        ref = model.generate(prompt, max_new_tokens=11, do_sample=False, eos_token_id=None, pad_token_id=0)
        ref_first = model(prompt).logits[:, -1]
    assert torch.equal(tokens, ref[:, 7:])
    torch.testing.assert_close(first, ref_first, rtol=1e-4, atol=1e-4)


def test_tiny_run_writes_results(tmp_path):
    rows, checks = e2e.main(["--tiny", "--device", "cpu", "--layers", "2", "--batches", "1,2", "--steps", "2",
                             "--warmup", "1", "--prompt", "4", "--check-steps", "3", "--out", str(tmp_path)])
    assert [(r["format"], r["batch"]) for r in rows] == [(f, b) for f in e2e.FORMATS for b in (1, 2)]
    assert all(r["tokens_per_s"] > 0 and 0 < r["gemm_share"] for r in rows)
    assert [c["format"] for c in checks] == ["nvfp4", "mxfp4"] and all(c["agree"] == c["steps"] == 4 for c in checks)
    data = json.loads((tmp_path / "e2e_decode.json").read_text())
    assert data["meta"]["layers"] == 2 and len(data["rows"]) == 6
    assert (tmp_path / "e2e_decode.csv").read_text().count("\n") == 7
    with pytest.raises(SystemExit):
        e2e.main(["--formats", "int8", "--device", "cpu"])
