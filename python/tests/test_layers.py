"""The layer benchmark's own code (python/bench/layers.py) on the CPU: its
arguments (formats, --int-peers), the peers' builders (torch's tinygemm INT4
through torch's CPU variants of its two ops, bitsandbytes NF4 / FP4 when it
imports) checked against their own dequantized weights, the check catching
a wrong product, and the table, CSV, JSON and markdown written from rows
made up here.  The timing itself needs a GPU (scripts/device-check layers,
layers-int).  Skipped without torch."""

import csv
import json
import math
import os
import sys

import pytest

torch = pytest.importorskip("torch")

BENCH = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "bench")
sys.path.insert(0, BENCH)
import layers  # noqa: E402


def test_arguments(capsys):
    a = layers.parse_args([])
    assert a.formats == ["nvfp4", "mxfp4"] and not a.int_peers and a.peers is None
    assert a.m == [1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024] and len(a.shapes) == 10
    a = layers.parse_args(["--formats", "INT4, nf4,int4,int4_sym,bnb_fp4,int8", "--int-peers", "--shapes",
                           "4096x4096", "--m", "1,8"])
    assert a.formats == ["int4", "nf4", "int4_sym", "bnb_fp4", "int8"] and a.int_peers
    assert a.shapes == [(4096, 4096)] and a.m == [1, 8]
    for bad, why in ((["--formats", "fp8"], "'fp8' is not one of nvfp4, mxfp4, int4, int4_sym, int8, nf4, bnb_fp4"),
                     (["--formats", ","], "names no format"), (["--shapes", "4000x4096"], "multiple of 128"),
                     (["--m", "0"], "1..65536"), (["--reps", "2"], "--reps must be >= 3")):
        with pytest.raises(SystemExit) as e:
            layers.main(bad)   # refused before torch or a GPU is asked for
        assert why in str(e.value), bad
    with pytest.raises(SystemExit):
        layers.parse_args(["--int-peers=yes"])   # a flag, no value
    assert "ignored explicit argument" in capsys.readouterr().err


def _w(n, k, seed=0):
    g = torch.Generator().manual_seed(seed)
    return (torch.randn(n, k, generator=g) * 0.02).to(torch.bfloat16)


def test_peer_notes(monkeypatch):
    builds, notes = layers.load_int_peers(torch, ["nvfp4", "mxfp4"])
    assert builds == {} and notes == {"tinygemm": "no int4 or int4_sym in --formats",
                                      "torch_int8": "no int8 in --formats",
                                      "bitsandbytes": "no nf4 or bnb_fp4 in --formats"}
    if hasattr(torch.ops.aten, "_weight_int8pack_mm"):
        builds, notes = layers.load_int_peers(torch, ["int8"])
        assert list(builds) == ["torch_int8"] and "_weight_int8pack_mm" in notes["torch_int8"]
    monkeypatch.setitem(sys.modules, "bitsandbytes", None)   # as if it were not installed
    builds, notes = layers.load_int_peers(torch, ["int4_sym", "bnb_fp4"])
    assert list(builds) == ["tinygemm_int4"] and notes["tinygemm"].endswith("(m <= 256)")
    assert notes["bitsandbytes"].startswith("bitsandbytes did not import: ")


@pytest.mark.skipif(not hasattr(torch.ops.aten, "_weight_int4pack_mm_for_cpu"), reason="torch without int4pack on CPU")
def test_tinygemm_against_its_dequantized_weights():
    n, k = 64, 512
    w = _w(n, k)
    fn, ref = layers.tinygemm_int4(torch, w, want_ref=True)
    assert ref.shape == (n, k) and ref.dtype == torch.bfloat16
    # min-max over groups of 128, 16 levels: within half a step of w, and the op multiplies by exactly ref
    step = (w.float().reshape(n, 4, 128).amax(-1) - w.float().reshape(n, 4, 128).amin(-1)) / 15
    err = (ref.float() - w.float()).abs().reshape(n, 4, 128).amax(-1)
    assert (err <= 0.5 * step + 4e-4).all()   # (+ the BF16 roundings of s, z and ref)
    assert layers.rel_error(torch, fn, ref, k, "cpu") < 0.005
    assert layers.rel_error(torch, fn, _w(n, k, seed=1), k, "cpu") > layers.MAX_REL   # other weights: caught
    assert layers.tinygemm_int4(torch, w)[1] is None
    fns = layers.build_peer(torch, layers.load_int_peers(torch, ["int4"])[0]["tinygemm_int4"], w, 3, "cpu")
    x = _w(5, k, seed=2)
    assert len(fns) == 3 and all(torch.equal(f(x), fn(x)) for f in fns)


@pytest.mark.skipif(not hasattr(torch.ops.aten, "_weight_int8pack_mm"), reason="torch without _weight_int8pack_mm")
def test_torch_int8_against_its_dequantized_weights():
    n, k = 64, 512
    w = _w(n, k)
    fn, ref = layers.torch_int8(torch, w, want_ref=True)
    assert ref.shape == (n, k) and ref.dtype == torch.bfloat16
    # one scale per row, 127 levels each side: within half a step of w, plus the BF16 roundings of s
    # (relative 2^-9, times up to 127 steps: 2^-8 of the row's amax with the clamp) and of ref
    amax = w.float().abs().amax(1, keepdim=True)
    tol = 0.5 * amax / 127 * (1 + 2 ** -8) + 2 ** -8 * amax + 2 ** -9 * w.float().abs()
    assert ((ref.float() - w.float()).abs() <= tol).all()
    # the op multiplies by exactly ref; another layer's weights are caught; the build without ref
    assert layers.rel_error(torch, fn, ref, k, "cpu") < 0.005
    assert layers.rel_error(torch, fn, _w(n, k, seed=1), k, "cpu") > layers.MAX_REL
    assert layers.torch_int8(torch, w)[1] is None


def test_peer_with_a_wrong_product_is_refused():
    w = _w(16, 256)

    def build(w, want_ref=False):   # a peer whose kernel drops half of k
        return (lambda x: torch.nn.functional.linear(x[:, :128], w[:, :128])), (w if want_ref else None)
    # the check's activations come from torch's global generator: fixed here, as
    # a 16-output product at m = 1 may lose more than its own norm (error > 1)
    torch.manual_seed(0)
    with pytest.raises(ValueError, match="relative error 0.[0-9]+ against its dequantized weights"):
        layers.build_peer(torch, build, w, 2, "cpu")

    def nan_build(w, want_ref=False):
        return (lambda x: torch.full((x.shape[0], w.shape[0]), math.nan)), (w if want_ref else None)
    with pytest.raises(ValueError, match="relative error nan"):
        layers.build_peer(torch, nan_build, w, 2, "cpu")


def test_bitsandbytes_against_its_dequantized_weights():
    bnb = pytest.importorskip("bitsandbytes")
    pytest.importorskip("bitsandbytes.functional")
    builds, notes = layers.load_int_peers(torch, ["nf4", "bnb_fp4"])
    assert list(builds) == ["bnb_nf4", "bnb_fp4"] and notes["bitsandbytes"] == f"bitsandbytes {bnb.__version__}"
    w = _w(64, 256)
    for col, qt in (("bnb_nf4", "nf4"), ("bnb_fp4", "fp4")):
        fn, ref = layers.bnb_4bit(bnb, qt, w, want_ref=True)
        assert ref.shape == w.shape and layers.rel_error(torch, fn, ref, 256, "cpu") < 0.01, qt
        assert len(layers.build_peer(torch, builds[col], w, 2, "cpu")) == 2


def _meta(**kw):
    return {"gpu": "NVIDIA H100 80GB HBM3", "sms": 132, "commit": "abc", "date": "2026-11-23", "torch": "2.11.0",
            "copy_gbps": 2900.4, "marlin": "no --peers directory", "host": "h", **kw}


def _row(k, n, m, base, **us):
    row = {"shape": f"{k}x{n}", "k": k, "n": n, "m": m, "cublas_us": base}
    for name, t in us.items():
        row[name + "_us"], row[name + "_x"] = t, base / t
        if name.startswith("nibble_"):
            row[name + "_copy"] = 0.5
    return row


def test_table_without_int_peers_is_as_before():
    rows = [_row(4096, 4096, 1, 20.0, nibble_nvfp4=8.0), _row(4096, 4096, 16, 22.0, nibble_nvfp4=10.0)]
    assert layers.table_lines(rows, _meta()) == [
        "NVIDIA H100 80GB HBM3, 2026-11-23, commit abc, torch 2.11.0, copy bandwidth 2900 GB/s; Marlin: no --peers "
        "directory", "",
        "| layer k->n | m | cuBLAS us | nibble nvfp4 |", "|---|---|---|---|",
        "| 4096->4096 | 1 | 20.0 | 2.50x |", "| 4096->4096 | 16 | 22.0 | 2.20x |"]


def test_table_and_files_with_int_peers(tmp_path):
    meta = _meta(tinygemm="torch 2.11.0 aten._weight_int4pack_mm (m <= 256)", bitsandbytes="bitsandbytes 0.50.2",
                 left_out=["bnb_nf4 8192x8192: ValueError('relative error 0.5000 against its dequantized weights')"])
    rows = [_row(4096, 4096, 1, 20.0, nibble_int4=10.0, nibble_nf4=8.0, tinygemm_int4=16.0, bnb_nf4=40.0),
            _row(4096, 4096, 512, 50.0, nibble_int4=25.0, nibble_nf4=20.0, bnb_nf4=100.0),   # tinygemm: m > 256
            _row(8192, 8192, 1, 60.0, nibble_int4=30.0, nibble_nf4=20.0, tinygemm_int4=math.nan)]
    lines = layers.table_lines(rows, meta)
    assert lines[0].endswith("Marlin: no --peers directory; tinygemm: torch 2.11.0 aten._weight_int4pack_mm "
                             "(m <= 256); bitsandbytes: bitsandbytes 0.50.2")
    assert lines[2:] == [
        "| layer k->n | m | cuBLAS us | nibble int4 | nibble nf4 | tinygemm int4 | bnb nf4 |",
        "|---|---|---|---|---|---|---|",
        "| 4096->4096 | 1 | 20.0 | 2.00x | 2.50x | 1.25x | 0.50x |",
        "| 4096->4096 | 512 | 50.0 | 2.00x | 2.50x | - | 0.50x |",
        "| 8192->8192 | 1 | 60.0 | 2.00x | 3.00x | - | - |", "",
        "Left out: " + meta["left_out"][0]]
    layers.write_outputs(str(tmp_path / "out"), rows, meta, lines)
    with open(tmp_path / "out" / "layers.csv", newline="") as f:
        got = list(csv.DictReader(f))
    assert list(got[0])[:5] == ["k", "m", "n", "shape", "bnb_nf4_us"] and len(got) == 3
    assert got[0]["tinygemm_int4_x"] == "1.25" and got[1]["tinygemm_int4_us"] == "" and got[2]["bnb_nf4_x"] == ""
    assert got[0]["nibble_int4_copy"] == "0.5" and "tinygemm_int4_copy" not in got[0]
    data = json.loads((tmp_path / "out" / "layers.json").read_text())
    assert data["meta"]["bitsandbytes"] == "bitsandbytes 0.50.2" and data["meta"]["left_out"] == meta["left_out"]
    assert data["rows"][1] == rows[1]
    assert (tmp_path / "out" / "layers.md").read_text() == "\n".join(lines) + "\n"


def test_marlin_int4_peer_loading(tmp_path):
    """--marlin-int4 names the directory of vLLM's Marlin INT4 driver; a
    directory without it, or a driver that does not import, leaves the
    columns out with the reason (the run goes on)."""
    assert layers.parse_args(["--marlin-int4", str(tmp_path)]).marlin_int4 == str(tmp_path)
    assert layers.parse_args([]).marlin_int4 is None
    mod, note = layers.load_marlin_int4(str(tmp_path))
    assert mod is None and "marlin_int4_peer.py not found" in note
    (tmp_path / "marlin_int4_peer.py").write_text("raise ImportError('no library here')\n")
    mod, note = layers.load_marlin_int4(str(tmp_path))
    assert mod is None and "did not load" in note and "no library here" in note
    sys.modules.pop("marlin_int4_peer", None)


def test_graph_calls():
    # a round over the copies at least, about GRAPH_MIN_US of work, at most GRAPH_MAX_CALLS
    assert layers.graph_calls(2, 320.0, min_us=12000.0, max_calls=512) == 38
    assert layers.graph_calls(2, 1400.0, min_us=12000.0, max_calls=512) == 9
    assert layers.graph_calls(64, 1400.0, min_us=12000.0, max_calls=512) == 64   # one round of the copies
    assert layers.graph_calls(27, 5.0, min_us=12000.0, max_calls=512) == 512     # the cap
    assert layers.graph_calls(3, 0.0, min_us=12000.0, max_calls=512) == 512      # no estimate: read as 1 us
    assert layers.graph_calls(2, 320.0) == max(2, min(layers.GRAPH_MAX_CALLS, math.ceil(layers.GRAPH_MIN_US / 320.0)))


def test_sustained_table():
    # --sustain: the heading says so and a last column gives the SM clocks read during each timed replay
    meta = _meta(sustain_s=1.5)
    rows = [_row(8192, 57344, 32, 225.5, nibble_nvfp4=146.0, marlin_nvfp4=139.1),
            _row(8192, 57344, 16, 222.8, nibble_nvfp4=107.9, marlin_nvfp4=119.0)]
    rows[0].update(cublas_mhz=1757.0, cublas_w=698.0, nibble_nvfp4_mhz=1722.0, nibble_nvfp4_w=693.0,
                   marlin_nvfp4_mhz=1852.0, marlin_nvfp4_w=693.0)
    rows[1].update(cublas_mhz=1935.0, cublas_w=697.0, nibble_nvfp4_mhz=1644.0, nibble_nvfp4_w=696.0)
    lines = layers.table_lines(rows, meta)
    assert lines[0].endswith("; each implementation replayed 1.5 s without a pause before its timed replays")
    assert lines[2:] == [
        "| layer k->n | m | cuBLAS us | nibble nvfp4 | marlin nvfp4 | SM MHz |",
        "|---|---|---|---|---|---|",
        "| 8192->57344 | 32 | 225.5 | 1.54x | 1.62x | 1757 / 1722 / 1852 |",
        "| 8192->57344 | 16 | 222.8 | 2.06x | 1.87x | 1935 / 1644 / - |"]
    assert "SM MHz" not in "\n".join(layers.table_lines([_row(4096, 4096, 1, 20.0, nibble_nvfp4=10.0)], _meta()))
    for bad in (["--sustain", "-1"], ["--sustain", "61"]):
        with pytest.raises(SystemExit) as e:
            layers.main(bad)
        assert "--sustain 0..60 seconds" in str(e.value)
    assert layers.parse_args(["--sustain", "2"]).sustain == 2.0


def test_record_configs(tmp_path, capsys):
    class FakeTorchOps:  # nibble.torch's gemm / last_config: the last weight called names the configuration
        last = None

        def gemm(self, x, pw):
            if pw == "bad":
                raise RuntimeError("no kernel")
            self.last = f"gemv_fp4_xs<{pw},bf16,mt=1,rows/warp=32> grid=40x3 warps=8 m={x.shape[0]}"
            return x

        def last_config(self, dev):
            return self.last

    def cuda_only(xx):   # a peer's call: never made here
        raise AssertionError("record_configs called a column that is not nibble's")

    nt = FakeTorchOps()
    impls = {c: [lambda xx, p=p: nt.gemm(xx, p), lambda xx: nt.gemm(xx, "second copy")]
             for c, p in (("nibble_nvfp4", "nvfp4"), ("nibble_mxfp4", "mxfp4"), ("nibble_int4", "bad"))}
    impls.update(cublas=[cuda_only], marlin_nvfp4=[cuda_only])
    row = _row(8192, 10240, 8, 47.0, nibble_nvfp4=18.6, nibble_mxfp4=23.5)
    layers.record_configs(nt, impls, torch.zeros(8, 4), "cuda", row)
    assert row["nibble_nvfp4_config"] == "gemv_fp4_xs<nvfp4,bf16,mt=1,rows/warp=32> grid=40x3 warps=8 m=8"
    assert row["nibble_mxfp4_config"].startswith("gemv_fp4_xs<mxfp4,") and "nibble_int4_config" not in row
    assert "nibble_int4 8192x10240 m=8 config: RuntimeError('no kernel')" in capsys.readouterr().out
    lines = layers.table_lines([row], _meta())   # the table takes the speedups only
    assert lines[2] == "| layer k->n | m | cuBLAS us | nibble nvfp4 | nibble mxfp4 |"
    layers.write_outputs(str(tmp_path), [row], _meta(), lines)
    with open(tmp_path / "layers.csv", newline="") as f:
        got = list(csv.DictReader(f))
    assert got[0]["nibble_nvfp4_config"] == row["nibble_nvfp4_config"]   # (commas in it: quoted)
