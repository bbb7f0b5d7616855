"""Tensor parallelism (nibble/tp.py) on the CPU: shards against slices of
the whole weight, refusals, and two processes over torch.distributed's gloo
backend, where nibble::gemm runs the host reference (nb_gemm_host_v2 on the
unpacked bytes).

What is compared, and the bounds:
  * shards (split_weight, the parallel layers, shard_llama): codes, block
    scales and zero points byte for byte slices of the one-GPU quantized
    weight, with its tensor scale; packed bytes whole 16-row blocks (n) or
    128-wide k chunks (k) of the one-GPU packed bytes.
  * column-parallel outputs: bit for bit the columns of the one-GPU output
    (the host reference computes each element alike whatever n is).
  * row-parallel outputs (BF16): y2 = rnd(rnd(p0 + b) + rnd(p1)) against
    y1 = rnd(p0 + p1 + b), p_r the ranks' exact partial sums, rnd one BF16
    rounding (relative error at most u = 2^-8): per element
    |y2 - y1| <= u (|p0 + b| + |p1| + |y1| + |y2|) + 2^-20 k sum_j |x_j w_j|
    (the last term the float32 accumulation of the reference, as in
    test_torch.py).  reduce_dtype=float32 gives the same bits with two ranks.
  * a tiny Llama (transformers' own forward, and the benchmark's Decoder):
    with float32 activations the sharded and the one-process nibble models
    differ only by float32 summation order: logits within 2^-16 relative
    (Frobenius; measured about 1e-7).  In BF16 the difference is one more
    rounding of each row-parallel output: the sharded model's logits must be
    no further from the one-process model's, nor from the float32 run of the
    same packed weights, than 2x the one-process model's own distance to that
    float32 run (FlashAttention 3's rule; measured: TP=2 0.83% from TP=1, TP=1
    0.75% from float32), greedy
    tokens equal on this model (chosen decisive: weights scaled up).

The two processes are started once per test session (torch.multiprocessing,
a free port); each writes its results to a file, and the assertions run
here.  Skipped without torch or transformers, or where torch.distributed
has no gloo backend."""

import dataclasses
import os
import socket
import sys
import traceback

import numpy as np
import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")
import torch.distributed as dist  # noqa: E402

import nibble  # noqa: E402
import nibble.torch as nt  # noqa: E402
import nibble.tp as tp  # noqa: E402

BENCH = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "bench")
sys.path.insert(0, BENCH)   # e2e_decode (its Decoder) and tp_decode, in this process and the ranks
WORLD = 2
U_BF16 = 2.0 ** -8
N, K = 96, 512          # n: 48 rows per rank (three row blocks); k: 256 per rank (two 128-wide chunks)
CASES = [(None, None), ("nvfp4", None), ("mxfp4", None), ("int4", 32), ("int4_sym", 64), ("int8", 32), ("nf4", None),
         ("bnb_fp4", 128)]   # (format, group)

gloo = pytest.mark.skipif(not dist.is_available() or not dist.is_gloo_available(),
                          reason="torch.distributed without gloo")


def _linear(n=N, k=K, seed=0, bias=True, dtype=torch.bfloat16):
    torch.manual_seed(seed)
    lin = torch.nn.Linear(k, n, bias=bias)
    with torch.no_grad():
        lin.weight.normal_(0, 0.05)
        if bias:
            lin.bias.normal_(0, 0.5)
    return lin.to(dtype).requires_grad_(False)


def _x(m=3, k=K, seed=1, dtype=torch.bfloat16):
    return torch.randn(m, k, generator=torch.Generator().manual_seed(seed)).to(dtype)


def _quant_kw(fmt, group):
    return {"format": fmt, **({"group_size": group} if group else {})}


def _whole(fmt, group):
    """The one-process quantized layer (bytes as nibble.torch.quantize gives them)."""
    lin = _linear()
    return lin, nt.Linear.from_quantized(tp._whole_weight(lin, fmt, group_size=group), lin.bias, device="cpu")


def _tiny_llama(dtype):
    """A 2-layer Llama small enough for the host reference: hidden 128 (4
    query heads of 32, 2 key/value heads), MLP 256, vocabulary 256; weights
    scaled up so that greedy choices are decisive."""
    from transformers import LlamaConfig, LlamaForCausalLM
    cfg = LlamaConfig(vocab_size=256, hidden_size=128, intermediate_size=256, num_attention_heads=4,
                      num_key_value_heads=2, num_hidden_layers=2, max_position_embeddings=256,
                      tie_word_embeddings=False)
    torch.manual_seed(5)
    model = LlamaForCausalLM(cfg).eval().requires_grad_(False)
    with torch.no_grad():
        for p in model.parameters():
            if p.dim() == 2:
                p.mul_(4)
    return model.to(dtype)


# ---------------------------------------------------------------- split_weight (no processes)

@pytest.mark.parametrize("fmt,group", CASES[1:])
def test_split_weight_is_a_slice(fmt, group):
    """Every shard is the whole weight's bytes: checkpoint-layout slices with
    the one tensor scale, and packed bytes that are whole row blocks (n) or
    k chunks (k) of the whole packed weight."""
    lin, _ = _whole(fmt, group)
    qw = tp._whole_weight(lin, fmt, group_size=group)
    whole = nibble.pack(qw).data
    rb, kc = N // 16, K // 128
    chunks = whole.reshape(rb, kc, -1)
    bits = nibble.format_info(fmt)["element_bits"]   # int8: a byte per element
    for r in range(WORLD):
        s = tp.split_weight(qw, "n", r, WORLD)
        rows = slice(r * N // WORLD, (r + 1) * N // WORLD)
        assert s.n == N // WORLD and s.k == K and s.tensor_scale == qw.tensor_scale
        assert np.array_equal(s.codes, qw.codes[rows]) and np.array_equal(s.scales, qw.scales[rows])
        assert (s.zeros is None) == (qw.zeros is None) and (s.zeros is None or np.array_equal(s.zeros, qw.zeros[rows]))
        assert np.array_equal(nibble.pack(s).data, chunks[r * rb // WORLD:(r + 1) * rb // WORLD].reshape(-1))
        s = tp.split_weight(qw, "k", r, WORLD)
        g = qw.group_size
        lo, hi = r * K // WORLD, (r + 1) * K // WORLD
        assert s.k == K // WORLD and s.tensor_scale == qw.tensor_scale and s.group == qw.group
        assert np.array_equal(s.codes, qw.codes[:, lo * bits // 8:hi * bits // 8])
        assert np.array_equal(s.scales, qw.scales[:, lo // g:hi // g])
        assert s.zeros is None or np.array_equal(s.zeros, qw.zeros[:, lo // g:hi // g])
        assert np.array_equal(nibble.pack(s).data, chunks[:, r * kc // WORLD:(r + 1) * kc // WORLD].reshape(-1))
    one = tp.split_weight(qw, "k", 0, 1)     # one rank: the weight itself
    assert np.array_equal(one.codes, qw.codes) and one.n == qw.n and one.k == qw.k


def test_split_weight_refusals():
    qw = nibble.quantize(np.random.default_rng(0).standard_normal((40, 96)).astype(np.float32), "nvfp4")
    with pytest.raises(ValueError, match="16-row blocks"):
        tp.split_weight(qw, "n", 0, 2)                     # 20 rows per rank
    with pytest.raises(ValueError, match="does not split evenly over 3"):
        tp.split_weight(qw, "n", 0, 3)
    with pytest.raises(ValueError, match="groups of 16"):
        tp.split_weight(qw, "k", 1, 4)                     # 24 columns per rank
    tp.split_weight(qw, "k", 1, 2)                         # 48 = 3 groups: fine
    tp.split_weight(qw, "n", 0, 1)                         # one rank: no block rule
    mx = nibble.quantize(np.ones((32, 96), np.float32), "mxfp4")
    with pytest.raises(ValueError, match="groups of 32"):
        tp.split_weight(mx, "k", 0, 2)
    ch = nibble.quantize(np.ones((32, 64), np.float32), "int4", group_size=64)   # one group per row
    with pytest.raises(ValueError, match="one group per row"):
        tp.split_weight(ch, "k", 0, 2)
    with pytest.raises(ValueError, match="dim must be"):
        tp.split_weight(qw, "m", 0, 2)
    with pytest.raises(ValueError, match="rank 2 of world size 2"):
        tp.split_weight(qw, "k", 2, 2)
    with pytest.raises(TypeError):
        tp.split_weight(np.zeros((2, 2)), "k", 0, 2)


def test_layers_need_a_process_group():
    if dist.is_initialized():
        pytest.skip("a process group is initialized in this process")
    with pytest.raises(RuntimeError, match="init_process_group"):
        tp.ColumnParallelLinear.from_linear(_linear())


# ---------------------------------------------------------------- two processes over gloo

def _free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _error(fn):
    try:
        fn()
    except Exception as e:  # noqa: BLE001 - the message is what the test checks
        return f"{type(e).__name__}: {e}"
    return None


def _worker(rank, port, out):
    """One rank: every sharded computation the tests check, saved to
    out/rank<r>.pt (or the traceback, to out/rank<r>.err)."""
    try:
        torch.set_num_threads(1)
        dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=WORLD)
        res = {}
        x = _x()
        for fmt, group in CASES:
            lin = _linear()
            kw = _quant_kw(fmt, group) if fmt else {}
            col = tp.ColumnParallelLinear.from_linear(lin, **kw)
            colg = tp.ColumnParallelLinear.from_linear(lin, gather_output=True, **kw)
            row = tp.RowParallelLinear.from_linear(lin, **kw)
            row32 = tp.RowParallelLinear.from_linear(lin, reduce_dtype=torch.float32, **kw)
            xs = x[:, rank * K // WORLD:(rank + 1) * K // WORLD]
            r = {"col": col(x), "colg": colg(x), "row": row(xs), "row32": row32(xs), "repr": repr(row)}
            if fmt:
                r["col_w"] = col.local.quantized_weight()
                r["row_w"] = row.local.quantized_weight()
                r["row_bias"] = row.local.bias
                _, one = _whole(fmt, group)          # from a nibble.torch.Linear: its own bytes split
                r["col_from_linear"] = tp.ColumnParallelLinear.from_linear(one).local.quantized_weight()
                r["row_from_linear"] = tp.RowParallelLinear.from_linear(one).local.quantized_weight()
            res[(fmt, group)] = r
        res["errors"] = {
            "requantize": _error(lambda: tp.ColumnParallelLinear.from_linear(_whole("nvfp4", None)[1], format="mxfp4")),
            "row_block": _error(lambda: tp.ColumnParallelLinear.from_linear(_linear(n=40), format="nvfp4")),
            "uneven": _error(lambda: tp.RowParallelLinear.from_linear(_linear(k=145))),
            "reduce_dtype": _error(lambda: tp.RowParallelLinear.from_linear(_linear(), reduce_dtype=torch.float16)),
            "bias_rank1": _error(lambda: tp.RowParallelLinear(torch.nn.Linear(K // 2, N), K, N)) if rank else None,
            "act_order": _error(lambda: tp.RowParallelLinear.from_linear(nt.Linear(
                nt.pack(nibble.quantize(np.ones((N, K), np.float32), "nvfp4"), "cpu"), perm=torch.arange(K)))),
        }
        heads = _tiny_llama(torch.float32)
        heads.config.num_key_value_heads = 1   # (a config the world size does not divide)
        res["errors"]["heads"] = _error(lambda: tp.shard_llama(heads, format="nvfp4"))
        res["errors"]["untouched"] = type(heads.model.layers[0].self_attn.q_proj).__name__

        # The tiny Llama: TP = 1 is computed by the parent; here the shards.
        import e2e_decode as e2e
        ids = LLAMA_IDS
        for dtype in (torch.float32, torch.bfloat16):
            model = _tiny_llama(dtype)
            nt.quantize_model(model, format="nvfp4", exclude=["lm_head"], device="cpu")
            info = tp.shard_llama(model)        # the nibble layers' own bytes, split
            with torch.no_grad():
                logits = model(ids).logits
            tokens, steps = e2e.greedy(model, ids, 4, heads=(info["num_attention_heads"],
                                                              info["num_key_value_heads"]))
            res[("llama", dtype)] = {"logits": logits, "tokens": tokens, "steps": steps,
                                     "heads": (info["num_attention_heads"], info["num_key_value_heads"]),
                                     "sharded": info["sharded"], "replaced": sorted(info["replaced"]),
                                     "q_w": model.model.layers[0].self_attn.q_proj.local.quantized_weight(),
                                     "types": sorted({type(m).__name__ for m in model.modules()})}
        model = _tiny_llama(torch.bfloat16)            # from BF16 nn.Linear layers, quantized whole, then split
        tp.shard_llama(model, format="nvfp4")
        res["llama_from_bf16_q_w"] = model.model.layers[0].self_attn.q_proj.local.quantized_weight()
        # The benchmark's own per-rank code (python/bench/tp_decode.py) on the tiny shape, over gloo.
        import tp_decode
        _, args = tp_decode.parse_args(TP_BENCH_ARGS)
        import contextlib
        import io
        log = io.StringIO()
        with contextlib.redirect_stdout(log):
            res["bench"] = tp_decode.run(args, rank, torch.device("cpu"))[:2]
        res["bench_log"] = log.getvalue()
        torch.save(res, os.path.join(out, f"rank{rank}.pt"))
        dist.destroy_process_group()
    except BaseException:
        with open(os.path.join(out, f"rank{rank}.err"), "w") as fh:
            fh.write(traceback.format_exc())
        raise


TP_BENCH_ARGS = ["--device", "cpu", "--tiny", "--layers", "1", "--batches", "1,2", "--steps", "2", "--warmup", "1",
                 "--prompt", "4", "--check-steps", "3", "--formats", "bf16,nvfp4,mxfp4"]
LLAMA_IDS = torch.randint(0, 256, (2, 6), generator=torch.Generator().manual_seed(9))


def _one_process_llama(dtype):
    """The unsharded NVFP4 tiny Llama: logits of transformers' forward,
    greedy tokens and step logits of the benchmark's Decoder, and for BF16
    the same packed weights run with float32 activations (the yardstick)."""
    import e2e_decode as e2e
    model = _tiny_llama(dtype)
    nt.quantize_model(model, format="nvfp4", exclude=["lm_head"], device="cpu")
    with torch.no_grad():
        r = {"logits": model(LLAMA_IDS).logits}
        r["tokens"], r["steps"] = e2e.greedy(model, LLAMA_IDS, 4)
        r["q_w"] = model.model.layers[0].self_attn.q_proj.quantized_weight()
        if dtype != torch.float32:
            r["logits_f32"] = model.float()(LLAMA_IDS).logits
    return r


@pytest.fixture(scope="module")
def ranks(tmp_path_factory):
    """The two ranks' results and, computed while they run, the one-process
    Llama's ({dtype: ...} under "one")."""
    import torch.multiprocessing as mp
    out = str(tmp_path_factory.mktemp("tp"))
    ctx = mp.start_processes(_worker, args=(_free_port(), out), nprocs=WORLD, start_method="spawn", join=False)
    one = {dt: _one_process_llama(dt) for dt in (torch.float32, torch.bfloat16)}
    try:
        while not ctx.join():
            pass
    except Exception as e:  # noqa: BLE001 - reported with the ranks' tracebacks
        errs = [open(os.path.join(out, f)).read() for f in sorted(os.listdir(out)) if f.endswith(".err")]
        pytest.fail(f"the gloo ranks failed: {e}\n" + "\n".join(errs))
    res = [torch.load(os.path.join(out, f"rank{r}.pt"), weights_only=False) for r in range(WORLD)]
    for r in res:
        r["one"] = one
    return res


def _bf16_bound(y1, y2, p0, p1, x, wh):
    """The per-element rule of the module docstring; the worst element in the message."""
    y1, y2 = y1.double().numpy(), y2.double().numpy()
    acc = np.abs(x.double().numpy()) @ np.abs(wh.astype(np.float64)).T
    tol = U_BF16 * (np.abs(p0) + np.abs(p1) + np.abs(y1) + np.abs(y2)) + 2.0 ** -20 * x.shape[-1] * acc + 1e-30
    ratio = np.abs(y2 - y1) / tol
    i = np.unravel_index(np.argmax(ratio), ratio.shape)
    assert ratio[i] <= 1, f"worst at {i}: TP=2 {y2[i]!r}, TP=1 {y1[i]!r}, tolerance {tol[i]:.3g}"
    return float(ratio.max())


@gloo
@pytest.mark.parametrize("fmt,group", CASES)
def test_parallel_layers(ranks, fmt, group):
    """Column- and row-parallel layers over two gloo ranks against the
    one-process layer: shards byte for byte slices, column outputs bit for
    bit, row outputs within the BF16 rule, float32 reduction the same bits."""
    lin = _linear()
    x = _x()
    if fmt:
        _, one = _whole(fmt, group)
        qw = one.quantized_weight()
        y1 = one(x)
    else:
        y1 = lin(x)
    for r, res in enumerate(ranks):
        got = res[(fmt, group)]
        cols = slice(r * N // WORLD, (r + 1) * N // WORLD)
        if fmt:   # the host reference: each output element is computed alike whatever n is
            assert torch.equal(got["col"], y1[:, cols]), f"rank {r}: column shard output differs"
        else:     # torch's BF16 matmul may block a narrower n differently
            torch.testing.assert_close(got["col"], y1[:, cols], rtol=U_BF16, atol=0)
        assert torch.equal(got["colg"], torch.cat([ranks[q][(fmt, group)]["col"] for q in range(WORLD)], -1))
        assert torch.equal(got["row"], ranks[0][(fmt, group)]["row"]), "ranks disagree after the all-reduce"
        assert torch.equal(got["row32"], got["row"]), "a float32 reduction of two BF16 partials differs"
        assert f"rank={r}, world_size=2" in got["repr"]
        if not fmt:
            continue
        for key in ("col_w", "col_from_linear"):
            s = got[key]
            assert s.tensor_scale == qw.tensor_scale
            assert np.array_equal(s.codes, qw.codes[cols]) and np.array_equal(s.scales, qw.scales[cols])
            assert s.zeros is None or np.array_equal(s.zeros, qw.zeros[cols])
        lo, hi = r * K // WORLD, (r + 1) * K // WORLD
        g, per = qw.group_size, 8 // nibble.format_info(fmt)["element_bits"]   # elements per code byte
        for key in ("row_w", "row_from_linear"):
            s = got[key]
            assert s.tensor_scale == qw.tensor_scale and np.array_equal(s.codes, qw.codes[:, lo // per:hi // per])
            assert np.array_equal(s.scales, qw.scales[:, lo // g:hi // g])
            assert s.zeros is None or np.array_equal(s.zeros, qw.zeros[:, lo // g:hi // g])
        assert (got["row_bias"] is not None) == (r == 0), "the bias belongs to rank 0's shard only"
    # exact partials p_r (float64, on the shards; rank 0's with the bias)
    wh = nibble.dequantize(qw) if fmt else lin.weight.float().numpy()
    xa = x.float().numpy()
    p = [xa[:, r * K // WORLD:(r + 1) * K // WORLD].astype(np.float64)
         @ wh[:, r * K // WORLD:(r + 1) * K // WORLD].T.astype(np.float64) for r in range(WORLD)]
    p[0] = p[0] + lin.bias.double().numpy()
    _bf16_bound(y1, ranks[0][(fmt, group)]["row"], p[0], p[1], x.float(), wh)


@gloo
def test_refusals_under_a_group(ranks):
    for r, res in enumerate(ranks):
        e = res["errors"]
        assert "nvfp4 already" in e["requantize"]
        assert "16-row blocks" in e["row_block"]
        assert "does not split evenly over 2 ranks" in e["uneven"]
        assert "reduce_dtype must be None" in e["reduce_dtype"]
        assert (e["bias_rank1"] is None) == (r == 0) and (r == 0 or "only rank 0's carries it" in e["bias_rank1"])
        assert "activation permutation" in e["act_order"]
        assert "4 query heads and 1 key/value heads do not split over 2 ranks" in e["heads"]
        assert e["untouched"] == "Linear"      # refused before anything was replaced


def _rel(a, b):
    return float((a.double() - b.double()).norm() / b.double().norm())


@gloo
def test_sharded_llama(ranks):
    """shard_llama of a tiny NVFP4 Llama over two ranks against the
    one-process model: transformers' forward and the benchmark's Decoder
    (module docstring for the bounds)."""
    one32, onebf = ranks[0]["one"][torch.float32], ranks[0]["one"][torch.bfloat16]
    l32, t32, s32 = one32["logits"], one32["tokens"], one32["steps"]
    lbf, tbf, sbf = onebf["logits"], onebf["tokens"], onebf["steps"]
    own = _rel(lbf, onebf["logits_f32"])    # BF16 activations' own distance (the same packed weights in float32)
    for r, res in enumerate(ranks):
        a, b = res[("llama", torch.float32)], res[("llama", torch.bfloat16)]
        assert a["heads"] == (2, 1) and len(a["sharded"]) == 2 * 7 + 1 and a["replaced"] == sorted(a["sharded"])
        assert {"ColumnParallelLinear", "RowParallelLinear", "Linear"} <= set(a["types"])
        assert _rel(a["logits"], l32) <= 2.0 ** -16, f"rank {r}: float32 TP=2 differs beyond summation order"
        assert _rel(a["steps"], s32) <= 2.0 ** -16 and torch.equal(a["tokens"], t32)
        d = _rel(b["logits"], lbf)
        assert 0 < d <= 2 * own, f"rank {r}: BF16 TP=2 is {d:.3g} from TP=1; BF16 itself is {own:.3g} from float32"
        d32 = _rel(b["logits"], onebf["logits_f32"])
        assert d32 <= 2 * own, f"rank {r}: BF16 TP=2 is {d32:.3g} from float32, TP=1 {own:.3g}"
        assert torch.equal(b["tokens"], tbf) and _rel(b["steps"], sbf) <= 2 * own
        assert torch.equal(a["logits"], ranks[0][("llama", torch.float32)]["logits"])   # every rank: whole logits
        # q_proj rank r: rows of the one-process weight; from BF16 layers too (quantized whole, then split)
        whole = onebf["q_w"]
        rows = slice(r * 64, (r + 1) * 64)
        for s in (b["q_w"], res["llama_from_bf16_q_w"]):
            assert s.tensor_scale == whole.tensor_scale and np.array_equal(s.codes, whole.codes[rows])
            assert np.array_equal(s.scales, whole.scales[rows])


def test_dataclass_shards_copy():
    """A shard owns its arrays (split_weight copies): changing it leaves the whole weight alone."""
    qw = nibble.quantize(np.ones((32, 64), np.float32), "nvfp4")
    s = tp.split_weight(qw, "n", 0, 2)
    s.codes[:] = 0
    assert qw.codes.any() and dataclasses.is_dataclass(s)


@gloo
def test_bench_plumbing_over_gloo(ranks):
    """tp_decode.run on the tiny shape over the two gloo ranks: every format
    and batch timed, both ranks decoding the same tokens, the TP=2 against
    TP=1 check computed on rank 0 (nibble's layers from the one-process
    bytes: within 2x BF16's own TP=2-to-TP=1 distance)."""
    import tp_decode
    for r, (rows, checks) in enumerate(res["bench"] for res in ranks):
        assert [(x["format"], x["batch"]) for x in rows] == [(f, b) for f in ("bf16", "nvfp4", "mxfp4") for b in (1, 2)]
        assert all(x["ranks_agree"] and x["step_ms"] > 0 and x["graph"] == "eager" for x in rows)
        if r:
            assert checks == []
            continue
        assert [c["format"] for c in checks] == ["bf16", "nvfp4", "mxfp4"]
        assert all(c["steps"] == 4 and c["top1_agree"] == 4 for c in checks)
        assert checks[0]["ok"] is None and all(c["ok"] for c in checks[1:]), checks
        assert tp_decode.exit_code(rows, checks) == 0
        assert "check: TP=2 logits" in ranks[0]["bench_log"] and ranks[1]["bench_log"] == ""


def test_bench_refusals(capsys, monkeypatch):
    import tp_decode
    _, args = tp_decode.parse_args([])
    assert args.layers == 10 and args.batches == [1, 8] and args.formats == ["bf16", "nvfp4"]
    env = {"RANK": "0", "WORLD_SIZE": "2", "LOCAL_RANK": "0", "MASTER_ADDR": "x", "MASTER_PORT": "1"}
    assert tp_decode.launch_error(args, env, 2) is None
    assert "needs 2 visible CUDA devices; 1 visible" in tp_decode.launch_error(args, env, 1)
    assert "not launched by torchrun (RANK, WORLD_SIZE" in tp_decode.launch_error(args, {}, 2)
    assert "world size 4" in tp_decode.launch_error(args, {**env, "WORLD_SIZE": "4"}, 8)
    _, cpu = tp_decode.parse_args(["--device", "cpu", "--tiny"])
    assert cpu.layers == 2 and tp_decode.launch_error(cpu, env, 0) is None
    e = {"NCCL_NVLS_ENABLE": "1"}
    assert tp_decode.nccl_env(e) == "1" and e["NCCL_NVLS_ENABLE"] == "0" and tp_decode.nccl_env({}) is None
    for bad in (["--formats", "int8"], ["--batches", "1,x"], ["--steps", "0"], ["--check-factor", "0"],
                ["--formats", ","]):
        with pytest.raises(SystemExit):
            tp_decode.parse_args(bad)
    monkeypatch.delenv("WORLD_SIZE", raising=False)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    with pytest.raises(SystemExit):
        tp_decode.main([])                      # one GPU (as seen here): refused before anything is built
    assert "needs 2 visible CUDA devices; 1 visible" in capsys.readouterr().err
