"""Tests of the nibble Python package against independent numpy
implementations of the formats in docs/formats.md:
section 1 (E2M1), 2.1 (NVFP4, ModelOpt) and 3.1/3.2 (MXFP4, OCP rule).

Run:  pip install ./python && python3 -m pytest python/tests
"""

import ctypes
import math
import os
import re
import shutil
import subprocess
import sys

import numpy as np
import pytest

import nibble
from nibble import _lib

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(os.path.dirname(HERE))
HEADER = os.path.join(REPO, "include", "nibble.h")


# ----------------------------------------------------- numpy reference codecs
# Written from formats.md, not from the C sources.

E2M1_MAG = np.array([0, 0.5, 1, 1.5, 2, 3, 4, 6], dtype=np.float32)  # codes 0..7; 8..15 negate


def np_e2m1_encode(q):
    """Round to nearest, ties to the even code (even mantissa bit), saturate at
    6; sign bit from q < 0 (ModelOpt), so small negatives give 0x8."""
    a = np.abs(q.astype(np.float32))
    d = np.abs(a[..., None] - E2M1_MAG)                  # distance to each magnitude
    best = d.min(axis=-1, keepdims=True)
    cand = d == best                                     # one or two (tie) candidates
    codes = np.arange(8)
    even_first = np.where(cand & (codes % 2 == 0), codes, 99).min(axis=-1)
    any_code = np.where(cand, codes, 99).min(axis=-1)
    c = np.where(cand.sum(axis=-1) > 1, even_first, any_code)
    c = np.where(a > 6, 7, c)
    return (c | np.where(q < 0, 8, 0)).astype(np.uint8)


def np_e2m1_decode(c):
    c = c.astype(np.int64)
    v = E2M1_MAG[c & 7]
    return np.where(c & 8, -v, v).astype(np.float32)


def np_e4m3_decode(b):
    """E4M3FN: E == 0 -> M * 2^-9, else (1 + M/8) * 2^(E-7); 0x7F/0xFF NaN."""
    b = np.asarray(b).astype(np.int64)
    e, m = (b >> 3) & 15, b & 7
    v = np.where(e == 0, m * 2.0 ** -9, (1 + m / 8) * 2.0 ** (e - 7))
    v = np.where(b & 0x80, -v, v)
    return np.where((b & 0x7F) == 0x7F, np.nan, v).astype(np.float32)


E4M3_POS = np_e4m3_decode(np.arange(0x7F))  # bytes 0x00..0x7E, ascending, all finite


def np_e4m3_encode_pos(s):
    """Positive finite s in [2^-9, 448] -> nearest E4M3 byte, ties to even byte."""
    s = s.astype(np.float64)
    d = np.abs(s[..., None] - E4M3_POS.astype(np.float64))
    best = d.min(axis=-1, keepdims=True)
    cand = d == best
    idx = np.arange(0x7F)
    even = np.where(cand & (idx % 2 == 0), idx, 999).min(axis=-1)
    anyi = np.where(cand, idx, 999).min(axis=-1)
    return np.where(cand.sum(axis=-1) > 1, even, anyi).astype(np.uint8)


def np_nvfp4_quantize(w, tensor_scale=None):
    """formats.md 2.1, in float32 like ModelOpt: returns codes [n,k/2], scales
    [n,k/16], tensor scale."""
    w = w.astype(np.float32)
    n, k = w.shape
    f32 = np.float32
    ts = f32(np.abs(w).max()) / f32(6 * 448) if tensor_scale is None else f32(tensor_scale)
    blocks = w.reshape(n, k // 16, 16)
    bmax = np.abs(blocks).max(axis=-1)
    with np.errstate(divide="ignore", invalid="ignore"):
        s = (bmax / (f32(6) * ts)).astype(np.float32) if ts > 0 else np.ones_like(bmax)
    s = np.where(s == 0, f32(1), s)
    s = np.clip(s, f32(2.0 ** -9), f32(448)).astype(np.float32)
    sb = np_e4m3_encode_pos(s)
    denom = (np_e4m3_decode(sb) * ts).astype(np.float32)
    q = (blocks / denom[..., None]).astype(np.float32)
    c = np_e2m1_encode(q).reshape(n, k)
    codes = (c[:, 0::2] | (c[:, 1::2] << 4)).astype(np.uint8)   # low nibble = even element
    return codes, sb, ts


def np_dequantize(codes, scales, ts, group, scale_decode):
    n = codes.shape[0]
    c = np.empty((n, codes.shape[1] * 2), dtype=np.uint8)
    c[:, 0::2], c[:, 1::2] = codes & 15, codes >> 4
    s = np.repeat(scale_decode(scales), group, axis=1)
    return ((np_e2m1_decode(c) * s).astype(np.float32) * np.float32(ts)).astype(np.float32)


def np_e8m0_decode(b):
    b = np.asarray(b).astype(np.int64)
    return np.where(b == 0xFF, np.nan, 2.0 ** (b - 127)).astype(np.float32)


def np_mxfp4_ocp_quantize(w):
    """formats.md 3.1/3.2 OCP rule: exponent floor(log2 amax) - 2, byte
    e + 127 (amax 0 -> byte 0), codes E2M1(x / 2^e)."""
    w = w.astype(np.float32)
    n, k = w.shape
    blocks = w.reshape(n, k // 32, 32)
    amax = np.abs(blocks).max(axis=-1)
    _, ex = np.frexp(amax)                          # amax = m * 2^ex, m in [0.5, 1)
    e = np.clip(ex - 1 - 2, -127, 127)
    sb = np.where(amax == 0, 0, e + 127).astype(np.uint8)
    q = (blocks / np_e8m0_decode(sb)[..., None]).astype(np.float32)
    c = np_e2m1_encode(q).reshape(n, k)
    return (c[:, 0::2] | (c[:, 1::2] << 4)).astype(np.uint8), sb


def weights(n, k, seed, scale=1.0, decades=0):
    """Normal weights; `decades` spreads the rows' magnitudes over that many
    powers of ten, so NVFP4 block scales reach E4M3 subnormals and the 2^-9
    clamp."""
    rng = np.random.default_rng(seed)
    w = rng.standard_normal((n, k)).astype(np.float32) * np.float32(scale)
    w *= (10.0 ** np.linspace(-decades, 0, n)).astype(np.float32)[:, None]
    w[0, :16] = 0.0                                 # an all-zero block
    w[1, 3] *= 40                                   # an outlier: small block scales elsewhere
    return w


# --------------------------------------------------------------- version

def test_version_matches_header_library_and_pyproject():
    assert nibble.version() == _lib.NB_VERSION
    major, minor, patch = (int(p) for p in nibble.version_string().split("."))
    assert (major, minor, patch) == (_lib.NB_VERSION_MAJOR, _lib.NB_VERSION_MINOR, _lib.NB_VERSION_PATCH)
    assert nibble.__version__ == nibble.version_string() == nibble.build_info()["version"]
    pyproject = os.path.join(REPO, "python", "pyproject.toml")
    if os.path.exists(pyproject):
        m = re.search(r'^version\s*=\s*"([^"]+)"', open(pyproject).read(), re.M)
        assert m and m.group(1) == nibble.__version__
    if os.path.exists(HEADER):
        text = open(HEADER).read()
        hdr = tuple(int(re.search(rf"#define NB_VERSION_{p} (\d+)", text).group(1))
                    for p in ("MAJOR", "MINOR", "PATCH"))
        assert hdr == (major, minor, patch)


def test_status_names_and_build_info():
    for s in nibble.Status:
        assert nibble.status_name(s) == "NB_" + s.name
        assert nibble.status_string(s)
    info = nibble.build_info()
    assert "nvfp4" in info["formats"] and "mxfp4" in info["formats"]
    assert nibble.device_count() >= 0
    with nibble.Context() as ctx:
        assert ctx.device_info()["device"] == _lib.NB_DEVICE_NONE


def test_formats_follow_the_library_table():
    """Format, the names and groups come from nb_format_list /
    nb_format_get_info, in the table's order; names resolve through
    nb_format_from_name; the binding is for exactly this library version."""
    count = ctypes.c_size_t(0)
    assert _lib.lib.nb_format_list(None, 0, ctypes.byref(count)) == 0
    values = (ctypes.c_int * count.value)()
    assert _lib.lib.nb_format_list(values, count.value, ctypes.byref(count)) == 0
    assert [int(f) for f in nibble.Format] == list(values)
    for f in nibble.Format:
        info = _lib.FormatInfo()
        assert _lib.lib.nb_format_get_info(int(f), ctypes.byref(info)) == 0
        assert f.name == info.name.decode().upper() and nibble.format_info(f)["group_size"] == info.group_size
        assert _lib.format_from_name(info.name.decode()) is f
        assert nibble.format_info(info.name.decode())["name"] == info.name.decode()
    assert nibble.formats() == [f.name.lower() for f in nibble.Format]
    assert nibble.formats()[:2] == ["nvfp4", "mxfp4"] and nibble.Format.NVFP4 == 1 and nibble.Format.MXFP4 == 2
    assert nibble.format_info("nvfp4")["tensor_scale"] and not nibble.format_info("mxfp4")["tensor_scale"]
    with pytest.raises(ValueError, match="int3"):
        _lib.format_from_name("int3")
    with pytest.raises(ValueError, match="unknown format"):
        nibble.format_info("int3")
    assert _lib.library_version == _lib.NB_VERSION == nibble.version()


@pytest.mark.skipif(not (os.path.exists(HEADER) and shutil.which("cc")), reason="needs the C header and a C compiler")
def test_struct_layout_matches_c(tmp_path):
    """Every ctypes Structure has the C compiler's size and field offsets."""
    structs = {"nb_device_info": _lib.DeviceInfo, "nb_build_info": _lib.BuildInfo,
               "nb_weight_desc": _lib.WeightDesc, "nb_weight_sizes": _lib.WeightSizes,
               "nb_gemm_desc": _lib.GemmDesc, "nb_gemm_config": _lib.GemmConfig,
               "nb_format_info": _lib.FormatInfo, "nb_weight_sizes_v2": _lib.WeightSizesV2,
               "nb_weight_buffers": _lib.WeightBuffers, "nb_weight_data": _lib.WeightBuffers,
               "nb_moe_desc": _lib.MoeDesc, "nb_moe_sizes": _lib.MoeSizes, "nb_moe_weights": _lib.MoeWeights,
               "nb_moe_align_sizes": _lib.MoeAlignSizes, "nb_moe_packed_sizes": _lib.MoePackedSizes,
               "nb_moe_packed_weights": _lib.MoePackedWeights, "nb_glu_desc": _lib.GluDesc}
    lines = ["#include <stdio.h>", "#include <stddef.h>", '#include "nibble.h"', "int main(void) {"]
    expect = []
    for cname, py in structs.items():
        lines.append(f'printf("%zu\\n", sizeof({cname}));')
        expect.append(ctypes_sizeof(py))
        for fname, _ in py._fields_:
            lines.append(f'printf("%zu\\n", offsetof({cname}, {fname}));')
            expect.append(getattr(py, fname).offset)
    lines.append(f'printf("%zu\\n", sizeof(nb_status));')
    expect.append(4)
    lines += ["return 0; }"]
    src, exe = tmp_path / "layout.c", tmp_path / "layout"
    src.write_text("\n".join(lines))
    subprocess.run(["cc", "-std=c11", "-I", os.path.dirname(HEADER), str(src), "-o", str(exe)], check=True)
    got = [int(v) for v in subprocess.run([str(exe)], check=True, capture_output=True, text=True).stdout.split()]
    assert got == expect


def test_tuning_cache(tmp_path):
    """Context.load_tuning: a cache for this GPU name ("host" for a host-only
    context) is loaded; a malformed one raises with the file and the field."""
    entry = ('{"gpu": "host", "format": "nvfp4", "act": "bf16", "k": 4096, "n": 4096, "m": "1", '
             '"path": "decode", "kw": %s, "splits": 1, "variant": "plain", "us": 3.5}')
    good, bad = tmp_path / "good.json", tmp_path / "bad.json"
    good.write_text('{"version": 1, "entries": [%s]}' % (entry % 4))
    bad.write_text('{"version": 1, "entries": [%s]}' % (entry % 3))
    with nibble.Context() as ctx:
        try:
            ctx.load_tuning(good)
        except nibble.Error as e:
            if e.status == nibble.Status.ERR_UNSUPPORTED:
                pytest.skip("libnibble built without cJSON")
            raise
        assert ctx.tuning_count() == (1, 1)
        with pytest.raises(nibble.Error) as err:
            ctx.load_tuning(bad)
        assert err.value.status == nibble.Status.ERR_CORRUPT
        assert str(bad) in err.value.message and "kw = 3" in err.value.message
        assert ctx.tuning_count() == (1, 1)          # a failed load leaves the table
        with pytest.raises(nibble.Error) as err:
            ctx.load_tuning(tmp_path / "missing.json")
        assert err.value.status == nibble.Status.ERR_IO


def ctypes_sizeof(t):
    import ctypes
    return ctypes.sizeof(t)


# ------------------------------------------------------------ scalar codecs

def test_scalar_codecs_match_formats_md():
    table = [0, .5, 1, 1.5, 2, 3, 4, 6, -0.0, -.5, -1, -1.5, -2, -3, -4, -6]
    assert [nibble.e2m1_to_float(c) for c in range(16)] == table
    ties = {0.25: 0, 0.75: 2, 1.25: 2, 1.75: 4, 2.5: 4, 3.5: 6, 5.0: 6, 5.01: 7, 100.0: 7, -0.1: 8, -0.75: 10}
    assert {x: nibble.float_to_e2m1(x) for x in ties} == ties
    assert nibble.float_to_e4m3(448) == 0x7E and nibble.float_to_e4m3(1e9) == 0x7E
    assert nibble.float_to_e4m3(2.0 ** -9) == 0x01 and nibble.float_to_e4m3(1.0) == 0x38
    assert math.isnan(nibble.e4m3_to_float(0x7F)) and math.isnan(nibble.e4m3_to_float(0xFF))
    for b in range(0x7F):
        assert nibble.e4m3_to_float(b) == E4M3_POS[b]
    assert nibble.e8m0_to_float(127) == 1.0 and nibble.e8m0_to_float(0) == 2.0 ** -127
    assert math.isnan(nibble.e8m0_to_float(0xFF))


# ------------------------------------------------------------------- NVFP4

@pytest.mark.parametrize("n,k,seed,scale,decades",
                         [(4, 16, 0, 1.0, 0), (8, 64, 1, 0.02, 0), (5, 48, 2, 300.0, 0), (16, 128, 3, 1e-3, 0),
                          (24, 64, 4, 1.0, 7)])
def test_nvfp4_quantize_bit_exact_vs_numpy(n, k, seed, scale, decades):
    w = weights(n, k, seed, scale, decades)
    qw = nibble.quantize(w, "nvfp4")
    if decades:   # the case exists to reach these scale bytes
        assert (qw.scales == 0x01).any() and ((qw.scales > 1) & (qw.scales < 8)).any()
    codes, scales, ts = np_nvfp4_quantize(w)
    assert np.float32(qw.tensor_scale) == ts
    assert qw.codes.shape == (n, k // 2) and qw.scales.shape == (n, k // 16)
    np.testing.assert_array_equal(qw.scales, scales)
    np.testing.assert_array_equal(qw.codes, codes)
    ref = np_dequantize(codes, scales, ts, 16, np_e4m3_decode)
    got = nibble.dequantize(qw)
    assert got.dtype == np.float32 and got.shape == (n, k)
    np.testing.assert_array_equal(got.view(np.uint32), ref.view(np.uint32))    # bit for bit (incl. -0)
    np.testing.assert_array_equal(nibble.dequantize(qw, np.float16), ref.astype(np.float16))
    np.testing.assert_array_equal(nibble.dequantize(qw, "bfloat16"), nibble.to_bf16(ref))


def test_nvfp4_rounding_ties_with_given_tensor_scale():
    """tensor_scale 1 and block amax 6 give block scale 1.0 (0x38), so the
    values are E2M1 inputs as is: every tie point and small negatives."""
    row = np.array([6, 0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5, -0.1, -0.25, -0.75, -5, 0.3, 5.5, 0, -6], np.float32)
    w = np.stack([row, -row[::-1]])
    qw = nibble.quantize(w, tensor_scale=1.0)
    assert qw.tensor_scale == 1.0
    np.testing.assert_array_equal(qw.scales, [[0x38], [0x38]])
    codes, scales, _ = np_nvfp4_quantize(w, tensor_scale=1.0)
    np.testing.assert_array_equal(qw.codes, codes)
    assert (qw.codes[0] & 15).tolist()[:1] == [7] and (qw.codes[0, 0] >> 4) == 0   # 6 -> 7, 0.25 -> 0
    assert qw.codes[0, 4] & 15 == 8                                              # -0.1 -> 0x8 (negative zero)


@pytest.mark.parametrize("dtype", [np.float16, "bf16"])
def test_nvfp4_half_inputs(dtype):
    w32 = weights(6, 32, 7)
    if dtype == "bf16":
        w, exact = nibble.to_bf16(w32), nibble.from_bf16(nibble.to_bf16(w32))
    else:
        w, exact = w32.astype(np.float16), w32.astype(np.float16).astype(np.float32)
    qw = nibble.quantize(w)
    codes, scales, ts = np_nvfp4_quantize(exact)
    np.testing.assert_array_equal(qw.codes, codes)
    np.testing.assert_array_equal(qw.scales, scales)
    assert np.float32(qw.tensor_scale) == ts


def test_non_contiguous_input_is_copied():
    w = weights(8, 64, 4)
    wt = np.asfortranarray(w)
    a, b = nibble.quantize(w), nibble.quantize(wt)
    np.testing.assert_array_equal(a.codes, b.codes)
    x = np.random.default_rng(0).standard_normal((64, 3)).astype(np.float32).T      # [3, 64], not C-contiguous
    np.testing.assert_array_equal(nibble.gemm_reference(x, a), nibble.gemm_reference(np.ascontiguousarray(x), a))


# ------------------------------------------------------------------- MXFP4

def test_mxfp4_ocp_bit_exact_vs_numpy():
    w = weights(6, 96, 5, 3.0)
    qw = nibble.quantize(w, "mxfp4", scale_rule="ocp")
    codes, scales = np_mxfp4_ocp_quantize(w)
    assert qw.format == "mxfp4" and qw.tensor_scale == 1.0 and qw.scales.shape == (6, 3)
    np.testing.assert_array_equal(qw.scales, scales)
    np.testing.assert_array_equal(qw.codes, codes)
    np.testing.assert_array_equal(nibble.dequantize(qw), np_dequantize(codes, scales, 1.0, 32, np_e8m0_decode))


def test_mxfp4_scale_rules_differ_only_in_scales():
    w = np.full((1, 32), 1.8, np.float32)            # mantissa 1.8 >= 1.75: "even" rounds the exponent up
    ocp, even, up = (nibble.quantize(w, "mxfp4", scale_rule=r) for r in ("ocp", "even", "round_up"))
    assert ocp.scales[0, 0] == 127 - 2 and even.scales[0, 0] == 127 - 1
    assert up.scales[0, 0] == 127 - 1                 # 2^ceil(log2(1.8/6)) = 2^-1


# -------------------------------------------------------------------- gemm

@pytest.mark.parametrize("fmt", ["nvfp4", "mxfp4"])
@pytest.mark.parametrize("act", [np.float32, np.float16, "bf16"])
def test_gemm_reference_vs_float64(fmt, act):
    """Bound: float32 accumulation of k products of float32 values, one final
    rounding:  |y - y64| <= (k + 2) * 2^-24 * (|x| @ |w|^T + |bias|)."""
    m, n, k = 5, 24, 256
    rng = np.random.default_rng(11)
    qw = nibble.quantize(weights(n, k, 9), fmt)
    x32 = rng.standard_normal((m, k)).astype(np.float32)
    if act == "bf16":
        x, xf = nibble.to_bf16(x32), nibble.from_bf16(nibble.to_bf16(x32))
    else:
        x, xf = x32.astype(act), x32.astype(act).astype(np.float32)
    bias = rng.standard_normal(n).astype(np.float32)
    w = nibble.dequantize(qw).astype(np.float64)
    ref = xf.astype(np.float64) @ w.T + bias
    y = nibble.gemm_reference(x, qw, bias=bias)
    assert y.dtype == np.float32 and y.shape == (m, n)
    bound = (k + 2) * 2.0 ** -24 * (np.abs(xf).astype(np.float64) @ np.abs(w).T + np.abs(bias))
    err = np.abs(y - ref)
    worst = np.unravel_index(np.argmax(err / bound), err.shape)
    assert (err <= bound).all(), f"worst {worst}: got {y[worst]} want {ref[worst]} bound {bound[worst]}"
    # float64 accumulation: only summation-order differences remain
    y64 = nibble.gemm_reference(x, qw, bias=bias, out_dtype=np.float64)
    assert y64.dtype == np.float64
    np.testing.assert_allclose(y64, ref, rtol=0, atol=1e-12 * np.abs(ref).max())
    # float16 / BF16 outputs: the float32 result rounded once (<= 1/2 ulp more)
    y16 = nibble.gemm_reference(x, qw, bias=bias.astype(np.float16), out_dtype=np.float16).astype(np.float64)
    assert (np.abs(y16 - ref) <= bound + 2.0 ** -11 * np.abs(ref) + 2.0 ** -25).all()
    ybf = nibble.from_bf16(nibble.gemm_reference(x, qw, bias=nibble.to_bf16(bias), out_dtype="bfloat16"))
    biasbf = nibble.from_bf16(nibble.to_bf16(bias)).astype(np.float64)
    refbf = xf.astype(np.float64) @ w.T + biasbf
    assert (np.abs(ybf - refbf) <= bound + 2.0 ** -8 * np.abs(refbf)).all()


def test_pack_sizes_and_exponent_range():
    qw = nibble.quantize(weights(16, 128, 2), "mxfp4")
    p = nibble.pack(qw)
    assert p.data.dtype == np.uint8 and p.data.size == nibble.weight_sizes(16, 128, "mxfp4")["packed_bytes"]
    assert (p.scale_exp_min, p.scale_exp_max) == (qw.scales.min(), qw.scales.max())
    np.testing.assert_array_equal(nibble.pack(qw).data, p.data)
    pn = nibble.pack(nibble.quantize(weights(16, 128, 2)))
    assert pn.data.size == nibble.weight_sizes(16, 128)["packed_bytes"]


# ------------------------------------------------------------------ errors

def test_library_errors_raise_nibble_error():
    w = weights(2, 16, 0)
    w[1, 5] = np.nan
    with pytest.raises(nibble.Error) as e:
        nibble.quantize(w)
    assert e.value.status == nibble.Status.ERR_INVALID_ARGUMENT
    assert e.value.name == "NB_ERR_INVALID_ARGUMENT"
    assert "[1, 5] is not finite" in e.value.message and e.value.message in str(e.value)
    assert nibble.last_error() == e.value.message
    with pytest.raises(nibble.Error, match="tensor_scale .* not a finite non-negative"):
        nibble.quantize(weights(2, 16, 0), tensor_scale=-1.0)
    with pytest.raises(nibble.Error) as e:             # raw binding, descriptor rejected by the C library
        _lib.check(_lib.lib.nb_weight_desc_init(_lib.WeightDesc(), 42, 4, 16))
    assert e.value.status in (nibble.Status.ERR_UNSUPPORTED, nibble.Status.ERR_INVALID_ARGUMENT)


def test_argument_errors_raise_before_c():
    w = weights(4, 32, 0)
    with pytest.raises(ValueError, match="multiple of 16"):
        nibble.quantize(np.zeros((4, 24), np.float32))
    with pytest.raises(ValueError, match="multiple of 32"):
        nibble.quantize(np.zeros((4, 48), np.float32), "mxfp4")
    with pytest.raises(ValueError, match="2-D"):
        nibble.quantize(np.zeros(32, np.float32))
    with pytest.raises(TypeError, match="float64"):
        nibble.quantize(w.astype(np.float64))
    with pytest.raises(TypeError, match="numpy.ndarray"):
        nibble.quantize(w.tolist())
    with pytest.raises(ValueError, match="unknown format"):
        nibble.quantize(w, "int3")
    with pytest.raises(ValueError, match="scale_rule"):
        nibble.quantize(w, "mxfp4", scale_rule="nearest")
    with pytest.raises(ValueError, match="no tensor scale"):
        nibble.quantize(w, "mxfp4", tensor_scale=2.0)
    qw = nibble.quantize(w)
    with pytest.raises(ValueError, match=r"k = 32"):
        nibble.gemm_reference(np.zeros((2, 16), np.float32), qw)
    with pytest.raises(TypeError, match="int32"):
        nibble.gemm_reference(np.zeros((2, 32), np.int32), qw)
    with pytest.raises(ValueError, match="bias has shape"):
        nibble.gemm_reference(np.zeros((2, 32), np.float32), qw, bias=np.zeros(3, np.float32))
    with pytest.raises(TypeError, match="bias has dtype"):
        nibble.gemm_reference(np.zeros((2, 32), np.float32), qw, bias=np.zeros(4, np.float16))
    with pytest.raises(TypeError, match="expected one of"):
        nibble.dequantize(qw, np.int8)
    bad = nibble.QuantizedWeight(qw.codes, qw.scales[:, :1].copy(), qw.tensor_scale, qw.n, qw.k, "nvfp4")
    with pytest.raises(ValueError, match="scales has shape"):
        nibble.dequantize(bad)


@pytest.mark.skipif(nibble.device_count() == 0, reason="no CUDA device (or a CPU-only libnibble)")
def test_device_context():
    with nibble.Context(0) as ctx:
        info = ctx.device_info()
    assert info["device"] == 0 and info["name"] and info["cc_major"] >= 7 and info["sm_count"] > 0
    assert info["global_mem_bytes"] > 0 and info["l2_bytes"] > 0


def test_device_context_without_device_raises():
    if nibble.device_count() > 0:
        pytest.skip("a CUDA device is present")
    with pytest.raises(nibble.Error) as e:
        nibble.Context(0)
    assert e.value.status in (nibble.Status.ERR_NO_DEVICE, nibble.Status.ERR_INVALID_ARGUMENT, nibble.Status.ERR_CUDA)
    assert e.value.message


def test_device_quantize_on_host_context_is_no_device():
    """nb_quantize is bound; on a host-only context it reports NB_ERR_NO_DEVICE."""
    desc = _lib.WeightDesc()
    assert _lib.lib.nb_weight_desc_init(ctypes.byref(desc), int(nibble.Format.NVFP4), 4, 32) == 0
    buf = ctypes.create_string_buffer(4 * 32 * 4)
    with nibble.Context() as ctx:
        st = _lib.lib.nb_quantize(ctx.ptr, ctypes.byref(desc), int(nibble.DType.F32), buf, buf, buf, None)
        assert st == nibble.Status.ERR_NO_DEVICE
        assert "host-only" in ctx.last_error or "without CUDA" in ctx.last_error


@pytest.mark.parametrize("fmt,rule", [("nvfp4", None), ("mxfp4", "ocp"), ("mxfp4", "even")])
def test_mse_method_never_worse_than_rtn(fmt, rule):
    """method="mse" (NB_QUANT_MSE): the same tensor scale as "rtn", no block
    with more squared error, less error overall on Gaussian weights, and the
    same bytes twice."""
    rng = np.random.default_rng(5)
    w = rng.standard_normal((32, 256)).astype(np.float32)
    r = nibble.quantize(w, format=fmt, scale_rule=rule)
    m = nibble.quantize(w, format=fmt, scale_rule=rule, method="mse")
    m2 = nibble.quantize(w, format=fmt, scale_rule=rule, method="mse")
    assert m.tensor_scale == r.tensor_scale
    assert np.array_equal(m.codes, m2.codes) and np.array_equal(m.scales, m2.scales)
    g = 256 // r.scales.shape[1]
    er = ((nibble.dequantize(r).astype(np.float64) - w) ** 2).reshape(32, -1, g).sum(-1)
    em = ((nibble.dequantize(m).astype(np.float64) - w) ** 2).reshape(32, -1, g).sum(-1)
    assert (em <= er).all()
    assert em.sum() < er.sum()
    with pytest.raises(ValueError, match="method"):
        nibble.quantize(w, format=fmt, scale_rule=rule, method="gptq")
    with pytest.raises(nibble.Error, match="MSE scale search serves the E2M1"):
        nibble.quantize(w, format="int4", method="mse")


# ------------------------------------------------ integer and bitsandbytes rows
# numpy references from docs/formats.md sections 4.2 and 5.1 (float32
# arithmetic as written there), never from the library.

NF4 = np.array([-1.0, -0.6961928009986877, -0.5250730514526367, -0.39491748809814453, -0.28444138169288635,
                -0.18477343022823334, -0.09105003625154495, 0.0, 0.07958029955625534, 0.16093020141124725,
                0.24611230194568634, 0.33791524171829224, 0.44070982933044434, 0.5626170039176941,
                0.7229568362236023, 1.0], np.float32)
BNB_FP4 = (np.array([0, 0.0625, 8, 12, 4, 6, 2, 3, 0, -0.0625, -8, -12, -4, -6, -2, -3], np.float32)
           / np.float32(12))


def np_int_quantize(w, g, zero_points, bits=4):
    """AWQ / GPTQ (zero points) or GPTQ / compressed-tensors symmetric round to
    nearest with F16 scales: codes (signed or unsigned ints), scales (float16),
    zeros."""
    n, k = w.shape
    b = w.astype(np.float32).reshape(n, k // g, g)
    levels = np.float32(2 ** bits - 1)
    if zero_points:
        lo = np.minimum(b.min(-1), 0).astype(np.float32)
        hi = np.maximum(b.max(-1), 0).astype(np.float32)
        s = ((hi - lo) / levels).astype(np.float16)
    else:
        s = (np.abs(b).max(-1) / (levels / np.float32(2))).astype(np.float16)
    s[s == 0] = 1
    sf = s.astype(np.float32)[..., None]
    if zero_points:
        z = np.minimum(np.rint(-lo[..., None] / sf), levels)
        q = np.clip(np.rint(b / sf) + z, 0, levels)
        return q.reshape(n, k).astype(np.int64), s, z[..., 0].astype(np.uint8)
    half = 2 ** (bits - 1)
    q = np.clip(np.rint(b / sf), -half, half - 1)
    return q.reshape(n, k).astype(np.int64), s, None


def unpack4(codes, signed=False):
    lo, hi = codes & 15, codes >> 4
    q = np.stack([lo, hi], -1).reshape(codes.shape[0], -1).astype(np.int64)
    return np.where(q >= 8, q - 16, q) if signed else q


def test_format_rows_and_sets():
    rows = {f: nibble.format_info(f) for f in nibble.formats()}
    assert nibble.formats() == ["nvfp4", "mxfp4", "int4", "int4_sym", "int8", "nf4", "bnb_fp4", "int4_hqq"]
    assert nibble.Format.INT4 == 3 and nibble.Format.BNB_FP4 == 7 and nibble.Format.INT4_HQQ == 8
    assert rows["int4"]["zero_point"] and rows["int4"]["zero_type"] == 1
    assert rows["int4_hqq"]["zero_point"] and rows["int4_hqq"]["zero_type"] == 2 and rows["int4_hqq"]["group_size"] == 64
    assert [f for f, r in rows.items() if r["kernels"]] == ["nvfp4", "mxfp4", "int4", "int4_sym", "int8", "nf4",
                                                            "bnb_fp4", "int4_hqq"]
    assert rows["int8"]["element_bits"] == 8 and not rows["int8"]["zero_point"]
    assert rows["int8"]["group_sizes"] == [32, 64, 128] and rows["int8"]["per_channel"]
    assert rows["int8"]["scale_type_names"] == ["f16", "bf16"]
    assert rows["int4"]["group_sizes"] == [32, 64, 128] and rows["int4"]["per_channel"]
    assert rows["int4_sym"]["scale_type_names"] == ["f16", "bf16"] and rows["nf4"]["scale_type_names"] == ["f32"]
    assert rows["nf4"]["group_size"] == 64 and rows["nf4"]["group_sizes"][-1] == 4096 and not rows["nf4"]["per_channel"]
    assert rows["nvfp4"]["group_sizes"] == [16] and rows["mxfp4"]["scale_type_names"] == ["e8m0"]
    assert [nibble.element_to_float("nf4", c) for c in range(16)] == NF4.tolist()
    assert [nibble.element_to_float("fp4_bnb", c) for c in range(16)] == BNB_FP4.tolist()
    assert nibble.element_to_float("int4", 9) == -7 and nibble.element_to_float("int8", 200) == -56


@pytest.mark.parametrize("fmt,g", [("int4", 32), ("int4", 128), ("int4_sym", 64), ("int8", 128), ("int4", 256)])
def test_int_quantize_matches_numpy(fmt, g):
    w = weights(12, 256, seed=3)
    qw = nibble.quantize(w, fmt, group_size=g)
    q, s, z = np_int_quantize(w, g, fmt == "int4", 8 if fmt == "int8" else 4)
    np.testing.assert_array_equal(qw.scales, s)
    if fmt == "int8":
        np.testing.assert_array_equal(qw.codes.view(np.int8), q)
    else:
        np.testing.assert_array_equal(unpack4(qw.codes, signed=fmt == "int4_sym"), q)
    if z is not None:
        np.testing.assert_array_equal(qw.zeros, z)
    # dequantize: (q - z) * s exactly, then float16 rounds it once (PyTorch's half arithmetic)
    zz = np.repeat(z.astype(np.int64), g, 1) if z is not None else 0
    want = ((q - zz) * np.repeat(s.astype(np.float64), g, 1)).astype(np.float32)
    np.testing.assert_array_equal(nibble.dequantize(qw), want)
    np.testing.assert_array_equal(nibble.dequantize(qw, np.float16), want.astype(np.float16))
    x = weights(3, 256, seed=4)
    np.testing.assert_allclose(nibble.gemm_reference(x, qw, out_dtype=np.float64),
                               x.astype(np.float64) @ want.T.astype(np.float64), rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("fmt", ["nf4", "bnb_fp4"])
def test_bnb_quantize_matches_numpy(fmt):
    table = NF4 if fmt == "nf4" else BNB_FP4
    order = np.argsort(table, kind="stable")
    bounds = ((table[order[:-1]] + table[order[1:]]) / np.float32(2)).astype(np.float32)
    w = weights(6, 256, seed=5)
    qw = nibble.quantize(w, fmt)
    b = w.reshape(-1, 64)
    absmax = np.abs(b).max(-1)
    x = np.clip(b * (np.float32(1) / np.maximum(absmax, np.float32(1e-38)))[:, None], -1, 1)
    codes = order[np.searchsorted(bounds, x, side="left")].reshape(6, 256)
    np.testing.assert_array_equal(qw.scales.reshape(-1), absmax)
    np.testing.assert_array_equal(unpack4(qw.codes), codes)
    want = (table[codes] * np.repeat(absmax.reshape(6, 4), 64, 1)).astype(np.float32)
    np.testing.assert_array_equal(nibble.dequantize(qw), want)


@pytest.mark.parametrize("fmt,group", [("nf4", 64), ("bnb_fp4", 32), ("nf4", 256)])
def test_bnb_pack_layout(fmt, group):
    # docs/formats.md 8.8 written out in numpy: chunks of 16 rows x 128 k,
    # lane 4g + t's word G holds k = 32G + 8t + e in nibble e; per lane group
    # g the F32 absmax of rows g, g + 8 and each kernel group (k / kg per chunk)
    n, k = 37, 512
    qw = nibble.quantize(weights(n, k, seed=5), fmt, group_size=group)
    pw = nibble.pack(qw)
    kg = min(group, 128)
    gpc, kchunks, rbs = 128 // kg, k // 128, (n + 15) // 16
    cb = 1024 + 16 * gpc * 4
    assert pw.data.nbytes == rbs * kchunks * cb
    want = np.zeros(rbs * kchunks * cb, np.uint8)
    codes = np.stack([qw.codes & 15, qw.codes >> 4], -1).reshape(n, k)   # element j: low nibble first
    absmax = np.asarray(qw.scales, np.float32).reshape(n, k // group)
    for r in range(n):
        rb, h, g = r // 16, (r % 16) // 8, r % 8
        for c in range(k):
            kc, kk = c // 128, c % 128
            G, t, e = kk // 32, (kk % 32) // 8, kk % 8
            at = (rb * kchunks + kc) * cb + 512 * h + 16 * (4 * g + t) + 4 * G + e // 2
            want[at] |= codes[r, c] << (4 * (e % 2))
        for kc in range(kchunks):
            for j in range(gpc):
                at = (rb * kchunks + kc) * cb + 1024 + 8 * gpc * g + 4 * (h * gpc + j)
                want[at:at + 4] = np.frombuffer(absmax[r, (kc * 128 + kg * j) // group].tobytes(), np.uint8)
    np.testing.assert_array_equal(pw.data, want)
    back = nibble.unpack(pw)
    np.testing.assert_array_equal(back.codes, qw.codes)
    np.testing.assert_array_equal(back.scales, qw.scales)


@pytest.mark.parametrize("group,st,n,k", [(32, "f16", 37, 512), (64, "bf16", 37, 512), (128, "f16", 16, 384),
                                          ("k", "bf16", 21, 200), ("k", "f16", 9, 512)])
def test_int8_pack_layout(group, st, n, k):
    # docs/formats.md 8.9 written out in numpy: chunks of 16 rows x 128 k;
    # lane L = 4g + t, row half h (rows g, g + 8) and piece P own the 16
    # bytes at 1024h + 512P + 16L; their word w holds elements e = 4(w // 2)
    # .. + 3 of sub-range G = 2P + w % 2 (chunk k = 32G + 8t + e), element e
    # in byte [0, 2, 1, 3][e % 4]; after the 2048 code bytes, per lane group
    # g the 2 gpc scales of rows g, g + 8 at 2048 + 4 gpc g, index h gpc + j
    # (kernel group j, from k = kg j); rows past n and kernel groups starting
    # past k are zero (8.7's padding)
    g = k if group == "k" else group
    qw = nibble.quantize(weights(n, k, seed=7), "int8", group_size=g, scale_type=st)
    pw = nibble.pack(qw)
    kg = g if g in (32, 64, 128) else 128
    gpc, kchunks, rbs = 128 // kg, (k + 127) // 128, (n + 15) // 16
    cb = 2048 + 16 * gpc * 2
    assert pw.data.nbytes == rbs * kchunks * cb == nibble.weight_sizes(n, k, "int8", g, st)["packed_bytes"]
    want = np.zeros(rbs * kchunks * cb, np.uint8)
    sbytes = qw.scales.view(np.uint8).reshape(n, k // g, 2)
    for r in range(n):
        rb, h, gl = r // 16, (r % 16) // 8, r % 8
        for c in range(k):
            kc, kk = c // 128, c % 128
            G, t, e = kk // 32, (kk % 32) // 8, kk % 8
            P, w = G // 2, 2 * (e // 4) + G % 2
            at = (rb * kchunks + kc) * cb + 1024 * h + 512 * P + 16 * (4 * gl + t) + 4 * w + [0, 2, 1, 3][e % 4]
            want[at] = qw.codes[r, c]
        for kc in range(kchunks):
            for j in range(gpc):
                if 128 * kc + kg * j >= k:
                    continue
                at = (rb * kchunks + kc) * cb + 2048 + 4 * gpc * gl + 2 * (h * gpc + j)
                want[at:at + 2] = sbytes[r, (128 * kc + kg * j) // g]
    np.testing.assert_array_equal(pw.data, want)
    back = nibble.unpack(pw)
    np.testing.assert_array_equal(back.codes, qw.codes)
    np.testing.assert_array_equal(back.scales, qw.scales)
    assert back.scales.dtype == qw.scales.dtype and back.zeros is None


def test_int_formats_errors():
    w = weights(4, 128, seed=1)
    with pytest.raises(nibble.Error) as e:
        nibble.quantize(w, "int4", group_size=16)
    assert e.value.status == nibble.Status.ERR_UNSUPPORTED and "32, 64, 128" in e.value.message
    with pytest.raises(nibble.Error, match="takes scale type"):
        nibble.quantize(w, "int4", scale_type="f32")
    with pytest.raises(ValueError, match="unknown scale type"):
        nibble.quantize(w, "int4", scale_type="fp16")
    with pytest.raises(nibble.Error, match="32, 64, 128"):
        nibble.quantize(w, "int8", group_size=16)
    with pytest.raises(nibble.Error, match="takes scale type"):
        nibble.quantize(w, "int8", scale_type="f32")
    qw = nibble.quantize(w, "int4")
    bad = nibble.QuantizedWeight(qw.codes, qw.scales, 1.0, 4, 128, "int4")  # zeros missing
    with pytest.raises(TypeError, match="zeros"):
        nibble.dequantize(bad)
    with pytest.raises(nibble.Error, match="overflows|beyond f16"):
        nibble.quantize(w * np.float32(1e6), "int4")
