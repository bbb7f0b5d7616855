"""Tests of the checkpoint binding (nibble.open_checkpoint,
nibble.quantize_checkpoint over libnibble's checkpoint API, nibble_io.h)
with numpy only.

Checkpoints are written here: BF16 ones by a small safetensors writer in
this file (independent of the C writer), quantized ones either by
nibble.quantize_checkpoint (nb_ckpt_quantize, the `nibble quantize` CLI's
function) or tensor by tensor from the numpy reference codecs of
test_basic.py (formats.md 2.1, 3.1): ModelOpt NVFP4, Quark MXFP4 and the
compressed-tensors nvfp4/mxfp4 layouts.  What the reader returns must equal
those references bit for bit.

Skipped when the checkpoint API is missing (a package built without cJSON), unless
NIBBLE_REQUIRE_IO=1 (make test-python sets it), which turns that into a
failure.
"""

import ctypes
import json
import os
import shutil
import struct
import subprocess

import numpy as np
import pytest

import nibble
from nibble import _lib

from test_basic import (HEADER, np_dequantize, np_e4m3_decode, np_e8m0_decode, np_mxfp4_ocp_quantize,
                        np_nvfp4_quantize, weights)

try:
    _lib.io_lib()
    _IO_ERROR = None
except ImportError as e:  # pragma: no cover - depends on the build
    _IO_ERROR = str(e)
if _IO_ERROR and os.environ.get("NIBBLE_REQUIRE_IO") == "1":
    raise ImportError(f"NIBBLE_REQUIRE_IO=1 but {_IO_ERROR}")
pytestmark = pytest.mark.skipif(_IO_ERROR is not None, reason=f"no checkpoint API: {_IO_ERROR}")


# ------------------------------------------------------------------ writers

def write_safetensors(path, tensors, metadata=None):
    """tensors: {name: (dtype string, numpy array)}; the reference layout
    (header padded with spaces to 8 bytes, data in the given order)."""
    header, blobs, off = {"__metadata__": dict(metadata or {"format": "pt"})}, [], 0
    for name, (dt, a) in tensors.items():
        raw = np.ascontiguousarray(a).tobytes()
        header[name] = {"dtype": dt, "shape": list(a.shape), "data_offsets": [off, off + len(raw)]}
        blobs.append(raw)
        off += len(raw)
    h = json.dumps(header).encode()
    h += b" " * (-len(h) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(h)))
        f.write(h)
        for raw in blobs:
            f.write(raw)


def bf16_checkpoint(d, shapes, seed=0, extra=None):
    """A BF16 checkpoint of linear layers {prefix: (n, k)} plus a norm;
    returns {prefix: float32 weights (exactly the BF16 values)}."""
    os.makedirs(d, exist_ok=True)
    tensors, ws = {}, {}
    for i, (prefix, (n, k)) in enumerate(shapes.items()):
        w = nibble.from_bf16(nibble.to_bf16(weights(n, k, seed + i, scale=0.05)))
        ws[prefix] = w
        tensors[prefix + ".weight"] = ("BF16", nibble.to_bf16(w))
    tensors["model.norm.weight"] = ("BF16", nibble.to_bf16(np.linspace(0.5, 1.5, 64, dtype=np.float32)))
    tensors.update(extra or {})
    write_safetensors(os.path.join(d, "model.safetensors"), tensors)
    with open(os.path.join(d, "config.json"), "w") as f:
        json.dump({"model_type": "llama", "hidden_size": 64}, f)
    return ws


SHAPES = {"model.layers.0.mlp.down_proj": (48, 128), "model.layers.0.self_attn.q_proj": (64, 64),
          "lm_head": (32, 64)}


# ------------------------------------------------------- quantize + open

@pytest.mark.parametrize("fmt,rule", [("nvfp4", "even"), ("mxfp4", "even"), ("mxfp4", "ocp")])
def test_quantize_checkpoint_then_open_matches_nibble_quantize(tmp_path, fmt, rule):
    ws = bf16_checkpoint(str(tmp_path / "bf16"), SHAPES)
    out = str(tmp_path / "q")
    seen = []
    summary = nibble.quantize_checkpoint(str(tmp_path / "bf16"), out, format=fmt, scale_rule=rule,
                                         progress=lambda *a: seen.append(a))
    assert summary["layers_quantized"] == 2 and summary["weights_excluded"] == 1   # lm_head excluded by default
    assert summary["device"] == ("gpu" if nibble.device_count() > 0 else "cpu") and summary["device_name"]
    assert seen and seen[-1][0] == seen[-1][1]                                      # the final call: i == n
    with nibble.open_checkpoint(out) as ck:
        expect = "modelopt-nvfp4" if fmt == "nvfp4" else "quark-mxfp4"
        assert ck.summary() == {expect: 2, "none": 1}
        assert ck.config["declared"] == expect
        assert [p for p, _ in ck.files] == [os.path.join(out, "model.safetensors")]
        for prefix, w in ws.items():
            L = ck.layer(prefix)
            assert (L.n, L.k) == w.shape
            if prefix == "lm_head":
                assert L.format == "none" and L.quant_format is None
                with pytest.raises(nibble.Error) as e:
                    ck.quantized_weight(prefix)
                assert e.value.status == nibble.Status.ERR_UNSUPPORTED and "lm_head" in e.value.message
                np.testing.assert_array_equal(ck.tensor("lm_head.weight"), nibble.to_bf16(w))
                continue
            assert L.format == expect and L.quant_format == fmt and not L.config_mismatch
            qw = ck.quantized_weight(prefix)
            ref = nibble.quantize(w, format=fmt, scale_rule=rule if fmt == "mxfp4" else None)
            np.testing.assert_array_equal(qw.codes, ref.codes)
            np.testing.assert_array_equal(qw.scales, ref.scales)
            assert np.float32(qw.tensor_scale) == np.float32(ref.tensor_scale)
            assert qw.format == fmt and ck.quantized_weight(L.index).codes.tobytes() == qw.codes.tobytes()
            assert {t.name for t in ck.tensors if t.layer == prefix} >= {prefix + ".weight", prefix + ".weight_scale"}
        norm = ck.tensor("model.norm.weight")
        assert norm.dtype == np.uint16 and norm.shape == (64,)
        assert ck.tensor_info("model.norm.weight").layer is None


def test_modelopt_nvfp4_written_from_numpy(tmp_path):
    """A ModelOpt NVFP4 layer (U8 codes, F8_E4M3 scales, F32 [] weight_scale_2,
    input_scale) built with the numpy reference quantizer: the reader hands
    back those bytes and they dequantize to the numpy reference values."""
    w = weights(40, 96, 5, scale=0.1, decades=3)
    codes, scales, ts = np_nvfp4_quantize(w)
    P = "model.layers.3.mlp.up_proj"
    write_safetensors(str(tmp_path / "model.safetensors"), {
        P + ".weight": ("U8", codes), P + ".weight_scale": ("F8_E4M3", scales),
        P + ".weight_scale_2": ("F32", np.array(ts, np.float32)),
        P + ".input_scale": ("F32", np.array(0.5, np.float32)),
        "model.layers.3.self_attn.k_proj.k_scale": ("F32", np.array(1.0, np.float32))})
    with open(tmp_path / "hf_quant_config.json", "w") as f:
        json.dump({"producer": {"name": "modelopt"}, "quantization": {"quant_algo": "NVFP4", "group_size": 16}}, f)
    ck = nibble.open_checkpoint(str(tmp_path))
    L = ck.layer(P)
    assert L.format == "modelopt-nvfp4" and L.decided_by == "hf_quant_config.json"
    assert (L.n, L.k) == (40, 96) and np.float32(L.tensor_scale) == ts
    qw = ck.quantized_weight(P)
    np.testing.assert_array_equal(qw.codes, codes)
    np.testing.assert_array_equal(qw.scales, scales)
    ref = np_dequantize(codes, scales, ts, 16, np_e4m3_decode)
    np.testing.assert_array_equal(nibble.dequantize(qw).view(np.uint32), ref.view(np.uint32))
    assert ck.tensor_info(P + ".input_scale").layer == P
    assert ck.tensor_info("model.layers.3.self_attn.k_proj.k_scale").layer is None
    ck.close()
    ck.close()                                    # closing twice is harmless
    with pytest.raises(ValueError, match="closed"):
        ck.quantized_weight(P)


def test_quark_and_compressed_tensors_layouts(tmp_path):
    """Quark MXFP4 (P.weight U8, P.weight_scale U8 E8M0), compressed-tensors
    mxfp4 (P.weight_packed, U8 scales) and nvfp4 (P.weight_packed, F8 scales,
    P.weight_global_scale = 1 / ModelOpt's tensor scale) in one file."""
    wq, wm, wn = weights(16, 64, 1), weights(24, 128, 2), weights(8, 32, 3)
    cq, sq = np_mxfp4_ocp_quantize(wq)
    cm, sm = np_mxfp4_ocp_quantize(wm)
    cn, sn, tsn = np_nvfp4_quantize(wn)
    gs = np.float32(1) / tsn
    write_safetensors(str(tmp_path / "model.safetensors"), {
        "a.weight": ("U8", cq), "a.weight_scale": ("U8", sq),
        "b.weight_packed": ("U8", cm), "b.weight_scale": ("U8", sm),
        "c.weight_packed": ("U8", cn), "c.weight_scale": ("F8_E4M3", sn),
        "c.weight_global_scale": ("F32", np.array([gs], np.float32))})
    with nibble.open_checkpoint(str(tmp_path / "model.safetensors")) as ck:
        assert {L.prefix: L.format for L in ck.layers} == {"a": "quark-mxfp4", "b": "ct-mxfp4", "c": "ct-nvfp4"}
        assert ck.config["declared"] == "none" and not ck.config["has_config_json"]
        for prefix, codes, scales in (("a", cq, sq), ("b", cm, sm)):
            qw = ck.quantized_weight(prefix)
            assert qw.format == "mxfp4" and qw.tensor_scale == 1.0 and qw.scale_rule == "even"
            np.testing.assert_array_equal(qw.codes, codes)
            ref = np_dequantize(codes, scales, 1.0, 32, np_e8m0_decode)
            np.testing.assert_array_equal(nibble.dequantize(qw), ref)
        qw = ck.quantized_weight("c")
        assert qw.format == "nvfp4" and np.float32(qw.tensor_scale) == np.float32(1) / gs
        np.testing.assert_array_equal(nibble.dequantize(qw),
                                      np_dequantize(cn, sn, np.float32(1) / gs, 16, np_e4m3_decode))


# ------------------------------------------------------------------ errors

def test_errors(tmp_path):
    with pytest.raises(nibble.Error) as e:
        nibble.open_checkpoint(str(tmp_path / "absent"))
    assert e.value.status in (nibble.Status.ERR_IO, nibble.Status.ERR_NOT_FOUND) and "absent" in e.value.message

    bad = tmp_path / "corrupt.safetensors"
    bad.write_bytes(struct.pack("<Q", 1000) + b"{}")                  # header longer than the file
    with pytest.raises(nibble.Error) as e:
        nibble.open_checkpoint(str(bad))
    assert e.value.status == nibble.Status.ERR_CORRUPT and "corrupt.safetensors" in e.value.message

    # weight_scale columns that fit neither k/16 nor k/32: reported, not guessed
    d = tmp_path / "incons"
    d.mkdir()
    write_safetensors(str(d / "model.safetensors"), {"x.weight": ("U8", np.zeros((4, 32), np.uint8)),
                                                     "x.weight_scale": ("U8", np.zeros((4, 3), np.uint8))})
    with nibble.open_checkpoint(str(d)) as ck:
        L = ck.layer("x")
        assert L.format == "inconsistent" and L.problem and L.quant_format is None
        with pytest.raises(nibble.Error) as e:
            ck.quantized_weight("x")
        assert e.value.status == nibble.Status.ERR_UNSUPPORTED
        with pytest.raises(KeyError, match="no linear layer"):
            ck.layer("y")
        with pytest.raises(KeyError, match="no tensor"):
            ck.tensor("y.weight")
        with pytest.raises(nibble.Error):
            ck.quantized_weight(99)                                    # index out of range: NB_ERR_NOT_FOUND
        with pytest.raises(TypeError):
            ck.quantized_weight(1.5)
        assert "x.weight" in ck and "y" not in ck

    bf16_checkpoint(str(tmp_path / "bf16"), {"m.a": (8, 32)})
    (tmp_path / "full").mkdir()
    (tmp_path / "full" / "f").write_text("x")
    with pytest.raises(nibble.Error) as e:
        nibble.quantize_checkpoint(str(tmp_path / "bf16"), str(tmp_path / "full"))
    assert e.value.status == nibble.Status.ERR_INVALID_ARGUMENT
    with pytest.raises(ValueError, match="scale_rule"):
        nibble.quantize_checkpoint(str(tmp_path / "bf16"), str(tmp_path / "o"), format="mxfp4", scale_rule="up")
    with pytest.raises(ValueError, match="format"):
        nibble.quantize_checkpoint(str(tmp_path / "bf16"), str(tmp_path / "o"), format="int3")
    with pytest.raises(nibble.Error) as e:  # a format without a checkpoint layout nibble writes
        nibble.quantize_checkpoint(str(tmp_path / "bf16"), str(tmp_path / "o"), format="int4")
    assert e.value.status == nibble.Status.ERR_UNSUPPORTED and "int4" in e.value.message
    with pytest.raises(ValueError, match="device"):
        nibble.quantize_checkpoint(str(tmp_path / "bf16"), str(tmp_path / "o"), device="tpu")
    if nibble.device_count() == 0:
        with pytest.raises(nibble.Error) as e:
            nibble.quantize_checkpoint(str(tmp_path / "bf16"), str(tmp_path / "o"), device="gpu")
        assert e.value.status == nibble.Status.ERR_NO_DEVICE and "device gpu" in e.value.message
        assert not (tmp_path / "o").exists()
    cpu = nibble.quantize_checkpoint(str(tmp_path / "bf16"), str(tmp_path / "c"), device="cpu")
    assert cpu["device"] == "cpu" and cpu["device_name"] == "host"


def test_mxfp4_default_scale_rule_is_even_everywhere(tmp_path):
    """nibble.quantize, quantize_checkpoint (and `nibble quantize`, through
    the same nb_ckpt_quantize_opts_init default) pick the same MXFP4 rule
    when none is given: "even"; "round-up" is the command line's spelling."""
    w = np.full((2, 64), 1.8, np.float32)                 # mantissa 1.8 >= 1.75: "even" differs from "ocp"
    w[1] = np.linspace(-3, 3, 64, dtype=np.float32)
    default = nibble.quantize(w, "mxfp4")
    assert nibble.DEFAULT_SCALE_RULE == "even" and default.scale_rule == "even"
    np.testing.assert_array_equal(default.scales, nibble.quantize(w, "mxfp4", scale_rule="even").scales)
    assert (default.scales != nibble.quantize(w, "mxfp4", scale_rule="ocp").scales).any()
    up = nibble.quantize(w, "mxfp4", scale_rule="round-up")
    np.testing.assert_array_equal(up.scales, nibble.quantize(w, "mxfp4", scale_rule="round_up").scales)
    assert nibble.QuantizedWeight(codes=default.codes, scales=default.scales, tensor_scale=1.0, n=2, k=64,
                                  format="mxfp4").scale_rule == "even"
    ws = bf16_checkpoint(str(tmp_path / "bf16"), SHAPES)
    nibble.quantize_checkpoint(str(tmp_path / "bf16"), str(tmp_path / "q"), format="mxfp4", device="cpu")
    opts = _lib.CkptQuantizeOpts()
    assert _lib.io_lib().nb_ckpt_quantize_opts_init(ctypes.byref(opts)) == 0
    assert opts.mx_rule == nibble.MxScaleRule.EVEN and opts.allow_empty == 0    # the C (and CLI) default
    with nibble.open_checkpoint(str(tmp_path / "q")) as ck:
        prefix = "model.layers.0.mlp.down_proj"
        qw = ck.quantized_weight(prefix)
        ref = nibble.quantize(ws[prefix], "mxfp4")
        np.testing.assert_array_equal(qw.scales, ref.scales)
        np.testing.assert_array_equal(qw.codes, ref.codes)


def test_quantize_checkpoint_with_nothing_to_quantize(tmp_path):
    """F64 and I32 weights are not quantized: refused with the reason (and
    nothing next to dst), or copied with allow_empty and counted."""
    d = tmp_path / "f64"
    d.mkdir()
    write_safetensors(str(d / "model.safetensors"), {
        "model.layers.0.mlp.down_proj.weight": ("F64", np.ones((16, 64), np.float64)),
        "model.layers.0.mlp.up_proj.weight": ("I32", np.ones((16, 64), np.int32))})
    out = tmp_path / "out"
    with pytest.raises(nibble.Error) as e:
        nibble.quantize_checkpoint(str(d), str(out))
    assert e.value.status == nibble.Status.ERR_UNSUPPORTED and "nothing to quantize" in e.value.message
    assert "down_proj.weight F64" in e.value.message and "up_proj.weight I32" in e.value.message
    assert sorted(os.listdir(tmp_path)) == ["f64"]
    summary = nibble.quantize_checkpoint(str(d), str(out), allow_empty=True, device="cpu")
    assert summary["layers_quantized"] == 0 and summary["weights_unsupported"] == 2 and summary["tensors_copied"] == 2
    assert sorted(os.listdir(tmp_path)) == ["f64", "out"]             # the staging directory is gone


def test_sub_byte_tensors_are_refused(tmp_path):
    write_safetensors(str(tmp_path / "m.safetensors"), {"f4": ("F4", np.zeros(4, np.uint8))})
    # an F4 shape counts elements: 8 elements in 4 bytes
    raw = (tmp_path / "m.safetensors").read_bytes()
    n = struct.unpack("<Q", raw[:8])[0]
    hdr = json.loads(raw[8:8 + n])
    hdr["f4"]["shape"] = [8]
    h = json.dumps(hdr).encode()
    h += b" " * (-len(h) % 8)
    (tmp_path / "m.safetensors").write_bytes(struct.pack("<Q", len(h)) + h + raw[8 + n:])
    with nibble.open_checkpoint(str(tmp_path / "m.safetensors")) as ck:
        assert ck.tensor_info("f4").shape == (8,)
        with pytest.raises(nibble.Error) as e:
            ck.tensor("f4")
        assert e.value.status == nibble.Status.ERR_UNSUPPORTED


# --------------------------------------------------------------- bindings

@pytest.mark.skipif(not shutil.which("cc"), reason="needs a C compiler")
def test_io_struct_layout_matches_c(tmp_path):
    """The ctypes mirrors of the nibble_io.h structs have the C compiler's
    sizes and field offsets (the loader checks the sizes at run time too)."""
    structs = {"nb_st_tensor": _lib.StTensor, "nb_ckpt_layer": _lib.CkptLayer, "nb_ckpt_config": _lib.CkptConfig,
               "nb_ckpt_quantize_opts": _lib.CkptQuantizeOpts,
               "nb_ckpt_quantize_summary": _lib.CkptQuantizeSummary, "nb_ckpt_moe": _lib.CkptMoe}
    lines = ["#include <stdio.h>", "#include <stddef.h>", '#include "nibble_io.h"', "int main(void) {"]
    expect = []
    for cname, py in structs.items():
        lines.append(f'printf("%zu\\n", sizeof({cname}));')
        expect.append(ctypes.sizeof(py))
        for fname, _ in py._fields_:
            lines.append(f'printf("%zu\\n", offsetof({cname}, {fname}));')
            expect.append(getattr(py, fname).offset)
    lines += ['printf("%d\\n", NB_ST_MAX_RANK);', "return 0; }"]
    expect.append(8)
    src, exe = tmp_path / "layout.c", tmp_path / "layout"
    src.write_text("\n".join(lines))
    subprocess.run(["cc", "-std=c11", "-I", os.path.dirname(HEADER), str(src), "-o", str(exe)], check=True)
    got = [int(v) for v in subprocess.run([str(exe)], check=True, capture_output=True, text=True).stdout.split()]
    assert got == expect


def test_enum_names_match_the_c_library():
    """The enum names the binding read from the library: every value of
    nibble_io.h's enums, with the names the C API documents, and the
    library refuses the first value past each (append-only enums)."""
    io = _lib.io_lib()
    assert _lib.CKPT_FORMATS == {0: "none", 1: "modelopt-nvfp4", 2: "ct-nvfp4", 3: "ct-mxfp4", 4: "quark-mxfp4",
                                 5: "gptoss-mxfp4", 6: "inconsistent", 7: "awq-int4", 8: "gptq-int4", 9: "ct-int4",
                                 10: "ct-int4-sym", 11: "ct-int8", 12: "bnb-nf4", 13: "bnb-fp4",
                                 14: "gptq-int8", 15: "hqq-int4"}
    assert _lib.CKPT_SOURCES == {0: "tensors", 1: "hf_quant_config.json", 2: "config.json"}
    assert _lib.CKPT_DEVICES == {"auto": 0, "cpu": 1, "gpu": 2}
    assert len(_lib.ST_DTYPES) == 22 and _lib.ST_DTYPES[2] == "U8" and _lib.ST_DTYPES[12] == "BF16"
    name = ctypes.c_char_p()
    for value, s in _lib.ST_DTYPES.items():
        assert io.nb_st_dtype_info(value, ctypes.byref(name), None) == 0 and name.value.decode() == s
    assert io.nb_ckpt_format_name(len(_lib.CKPT_FORMATS), ctypes.byref(name)) == nibble.Status.ERR_INVALID_ARGUMENT
    assert str(len(_lib.CKPT_FORMATS)) in nibble.last_error()
    # the weight format of each layout, from the library
    assert {v: _lib.ckpt_weight_format(v) for v in _lib.CKPT_FORMATS} == {
        0: None, 1: nibble.Format.NVFP4, 2: nibble.Format.NVFP4, 3: nibble.Format.MXFP4, 4: nibble.Format.MXFP4,
        5: nibble.Format.MXFP4, 6: None, 7: nibble.Format.INT4, 8: nibble.Format.INT4, 9: nibble.Format.INT4,
        10: nibble.Format.INT4_SYM, 11: nibble.Format.INT8, 12: nibble.Format.NF4, 13: nibble.Format.BNB_FP4,
            14: nibble.Format.INT8, 15: nibble.Format.INT4_HQQ}
    assert nibble.version() == _lib.NB_VERSION


def test_io_bad_input_sets_the_thread_message(tmp_path):
    """The checkpoint API reports through nb_last_error(), the buffer the
    core functions use: a failure of each names its cause there."""
    io = _lib.io_lib()
    ptr = _lib.CkptP()
    assert io.nb_ckpt_open(None, ctypes.byref(ptr)) == nibble.Status.ERR_NULL_POINTER
    assert "nb_ckpt_open" in nibble.last_error()
    assert io.nb_ckpt_open(str(tmp_path / "absent").encode(), ctypes.byref(ptr)) == nibble.Status.ERR_IO
    assert "absent" in nibble.last_error()
    size = ctypes.c_size_t(0)
    assert io.nb_io_struct_size(b"nb_nothing", ctypes.byref(size)) == nibble.Status.ERR_NOT_FOUND
    assert "nb_nothing" in nibble.last_error()
    opts = _lib.CkptQuantizeOpts()
    assert io.nb_ckpt_quantize_opts_init(None) == nibble.Status.ERR_NULL_POINTER
    assert io.nb_ckpt_quantize_opts_init(ctypes.byref(opts)) == 0
    opts.reserved[2] = 1
    summary = _lib.CkptQuantizeSummary()
    st = io.nb_ckpt_quantize(b"in", str(tmp_path / "o").encode(), ctypes.byref(opts), ctypes.byref(summary))
    assert st == nibble.Status.ERR_INVALID_ARGUMENT and "reserved" in nibble.last_error()


# ------------------------------------------ AWQ, GPTQ, compressed-tensors, bitsandbytes
# written here with the packing formulas of docs/formats.md sections 4.3 and 5

def test_awq_and_bnb_checkpoints(tmp_path):
    rng = np.random.default_rng(7)
    n, k, g = 16, 128, 64
    q = rng.integers(0, 16, (n, k))
    z = rng.integers(0, 16, (n, k // g))
    s = (rng.random((k // g, n)) + 0.5).astype(np.float16)          # AWQ scales [K/G, N]
    order = [0, 2, 4, 6, 1, 3, 5, 7]                                   # physical nibble i holds column order[i]
    qweight = np.zeros((k, n // 8), np.uint32)
    qzeros = np.zeros((k // g, n // 8), np.uint32)
    for i, col in enumerate(order):
        qweight |= (q.T[:, col::8].astype(np.uint32) << (4 * i))
        qzeros |= (z.T[:, col::8].astype(np.uint32) << (4 * i))
    ne = n * k
    c = rng.integers(0, 16, ne)
    absmax = (rng.random(ne // 64) * 2).astype(np.float32)
    packed = ((c[0::2] << 4) | c[1::2]).astype(np.uint8).reshape(-1, 1)
    NF4 = np.array([-1.0, -0.6961928009986877, -0.5250730514526367, -0.39491748809814453, -0.28444138169288635,
                    -0.18477343022823334, -0.09105003625154495, 0.0, 0.07958029955625534, 0.16093020141124725,
                    0.24611230194568634, 0.33791524171829224, 0.44070982933044434, 0.5626170039176941,
                    0.7229568362236023, 1.0], np.float32)
    state = json.dumps({"quant_type": "nf4", "blocksize": 64, "dtype": "bfloat16", "shape": [n, k]}).encode()
    write_safetensors(tmp_path / "model.safetensors", {
        "a.qweight": ("I32", qweight.view(np.int32)), "a.qzeros": ("I32", qzeros.view(np.int32)),
        "a.scales": ("F16", s),
        "b.weight": ("U8", packed), "b.weight.absmax": ("F32", absmax), "b.weight.quant_map": ("F32", NF4),
        "b.weight.quant_state.bitsandbytes__nf4": ("U8", np.frombuffer(state, np.uint8))})
    with nibble.open_checkpoint(tmp_path / "model.safetensors") as ck:
        assert {L.prefix: (L.format, L.quant_format) for L in ck.layers} == {
            "a": ("awq-int4", "int4"), "b": ("bnb-nf4", "nf4")}
        qa, qb = ck.quantized_weight("a"), ck.quantized_weight("b")
        assert qa.zeros.shape == (n, k // g) and qb.scales.dtype == np.float32 and not ck.layer("a").k_permuted
        np.testing.assert_array_equal(ck.perm("a"), np.arange(k))
    want_a = ((q - np.repeat(z, g, 1)) * np.repeat(s.T.astype(np.float64), g, 1)).astype(np.float32)
    np.testing.assert_array_equal(nibble.dequantize(qa), want_a)
    want_b = (NF4[c] * np.repeat(absmax, 64)).astype(np.float32).reshape(n, k)
    np.testing.assert_array_equal(nibble.dequantize(qb), want_b)
