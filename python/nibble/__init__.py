"""nibble: quantized weights - NVFP4, MXFP4, int4 with zero points,
int4_sym, int8 and bitsandbytes' nf4 and bnb_fp4 on the GPU kernels -
Python bindings to libnibble's C API.

This module is the numpy-level API over the host reference functions (no GPU
needed); nibble._lib is the ctypes image of include/nibble.h and
include/nibble_io.h.  nibble.torch (imported explicitly: `import
nibble.torch`; needs PyTorch) is the GPU path: the nibble::gemm custom op,
Linear, quantize_model and load_quantized; nibble.transformers (needs
transformers) registers nibble as a transformers quantizer for
from_pretrained / save_pretrained.  nibble.checkpoint
(open_checkpoint, quantize_checkpoint) reads and writes checkpoints through
libnibble's checkpoint API (nibble_io.h).

Formats: Format and the names and groups below come from the library's
format table (nb_format_list / nb_format_get_info), not from this package.

Arrays
  * Weights and activations are 2-D, row-major: W[n, k] (n = out_features),
    X[m, k], Y[m, n].  k must be a multiple of the group (format_info(f):
    "group_size" is the default, 16 for NVFP4 and 32 for MXFP4;
    "group_sizes" / "per_channel" the others a format accepts).
  * Accepted element types: float32, float16, and BF16 given as np.uint16
    arrays holding the raw bfloat16 bits (numpy has no bfloat16; a
    `ml_dtypes.bfloat16` array is accepted too and viewed as uint16).
    to_bf16() / from_bf16() convert.  Every uint16 array is read as BF16.
  * Non-contiguous inputs are copied to C order (np.ascontiguousarray) before
    the call; outputs are always new C-contiguous arrays.
  * Wrong types, dimensions or shapes raise TypeError / ValueError before any
    C call; failures inside the library raise nibble.Error(status, name,
    message) with the library's detailed message.
"""

from dataclasses import dataclass, field
from typing import Optional
import ctypes

import numpy as np

from . import _lib
from ._lib import (NB_VERSION, Context, DType, ElementType, Error, Format, Layout, MxScaleRule, Status,  # noqa: F401
                   ScaleType, default_context, last_error, status_name, status_string)

__all__ = [
    "Error", "Context", "QuantizedWeight", "PackedWeight", "quantize", "dequantize", "pack", "unpack",
    "gemm_reference", "weight_sizes", "version", "version_string", "build_info", "device_count", "to_bf16", "from_bf16",
    "e2m1_to_float", "e4m3_to_float", "e8m0_to_float", "float_to_e2m1", "float_to_e4m3",
    "Status", "DType", "Format", "MxScaleRule", "Layout", "ScaleType", "ElementType", "status_name", "status_string",
    "last_error", "element_to_float",
    "Checkpoint", "CheckpointLayer", "TensorInfo", "open_checkpoint", "quantize_checkpoint", "formats",
    "format_info", "DEFAULT_SCALE_RULE",
    "MoeSpec", "QuantizedExperts", "QuantizedMoe", "PackedMoe", "moe_pack", "moe_unpack", "moe_reference",
    "CheckpointMoe",
]

__version__ = _lib.lib.nb_version_string().decode()

# From the library's format table: name -> Format, Format -> name, Format -> group.
_FORMATS = {info["name"]: f for f, info in _lib.FORMAT_INFO.items()}
_FORMAT_NAMES = {f: info["name"] for f, info in _lib.FORMAT_INFO.items()}
_GROUP = {f: info["group_size"] for f, info in _lib.FORMAT_INFO.items()}
_RULES = {"ocp": MxScaleRule.OCP, "round_up": MxScaleRule.ROUND_UP, "even": MxScaleRule.EVEN}
_RULE_NAMES = {v: k for k, v in _RULES.items()}
# The MXFP4 scale rule every entry point uses when none is given - nibble.quantize,
# nibble.torch, quantize_checkpoint, `nibble quantize`: "even", what Quark and
# compressed-tensors write (docs/formats.md 3.2), and the lower perplexity of the
# two (DESIGN.md section 7).
DEFAULT_SCALE_RULE = "even"


def _rule_name(rule, given):
    """A scale rule's name ("round-up", the command line's spelling, is
    "round_up"), or ValueError naming the `given` value."""
    if isinstance(rule, MxScaleRule):
        return _RULE_NAMES[rule]
    name = rule.replace("-", "_") if isinstance(rule, str) else rule
    if name not in _RULES:
        raise ValueError(f"nibble: unknown MXFP4 scale_rule {given!r}; expected one of {sorted(_RULES)}")
    return name


# ------------------------------------------------------------ library facts

def formats():
    """The names of the library's formats, in the order of its table."""
    return list(_FORMATS)


def format_info(format):
    """The row of the library's format table for `format` (a name or a Format)
    as a dict: format, name, element, element_bits, group_size (the default),
    scale_type (the default), scale_bytes, tensor_scale, zero_point, kernels,
    groups and scale_types (the C bit sets), zero_type, and the sets as
    lists: group_sizes, per_channel, scale_type_names."""
    return dict(_lib.FORMAT_INFO[_format(format)])


def version():
    """The library's NB_VERSION (major*10000 + minor*100 + patch)."""
    return _lib.lib.nb_version()


def version_string():
    return _lib.lib.nb_version_string().decode()


def build_info():
    """nb_get_build_info as a dict: cuda (bool), cuda_archs, formats, version."""
    info = _lib.BuildInfo()
    _lib.check(_lib.lib.nb_get_build_info(ctypes.byref(info)))
    return info.to_dict()


def device_count():
    count = ctypes.c_int(0)
    _lib.check(_lib.lib.nb_device_count(ctypes.byref(count)))
    return count.value


# ------------------------------------------------------------ scalar codecs

def e2m1_to_float(code):
    """Value of an E2M1 code (low 4 bits used)."""
    return _lib.lib.nb_e2m1_to_float(int(code) & 0xFF)


def e4m3_to_float(byte):
    """Value of an FP8 E4M3FN byte (0x7F, 0xFF are NaN)."""
    return _lib.lib.nb_e4m3_to_float(int(byte) & 0xFF)


def e8m0_to_float(byte):
    """Value of an E8M0 byte: 2^(byte-127); 0xFF is NaN."""
    return _lib.lib.nb_e8m0_to_float(int(byte) & 0xFF)


def element_to_float(element, code):
    """Value of `code` of an element type (ElementType or its name: "nf4",
    "int4", ...): the integer of the integer types, the float32 table value of
    NF4 and bitsandbytes FP4."""
    if isinstance(element, str):
        element = ElementType[element.upper()]
    return _lib.lib.nb_element_to_float(int(element), int(code) & 0xFF)


def float_to_e2m1(x):
    """E2M1 code of x: round to nearest even, saturating at +-6 (NaN gives 0x7)."""
    return _lib.lib.nb_float_to_e2m1(float(x))


def float_to_e4m3(x):
    """E4M3FN byte of x: round to nearest even, saturating at +-448 (NaN gives 0x7F)."""
    return _lib.lib.nb_float_to_e4m3(float(x))


# ------------------------------------------------------------------- dtypes

def to_bf16(a):
    """float array -> np.uint16 array of bfloat16 bits (round to nearest even;
    NaN stays NaN)."""
    f = np.ascontiguousarray(a, dtype=np.float32)
    bits = f.view(np.uint32).astype(np.uint64)
    rounded = ((bits + 0x7FFF + ((bits >> 16) & 1)) >> 16).astype(np.uint16)
    nan = np.isnan(f)
    if nan.any():
        rounded[nan] = ((bits[nan] >> 16) | 0x40).astype(np.uint16)
    return rounded


def from_bf16(a):
    """np.uint16 array of bfloat16 bits -> float32 array (exact)."""
    u = np.ascontiguousarray(a, dtype=np.uint16)
    return (u.astype(np.uint32) << 16).view(np.float32)


def _as_array(a, what):
    if not isinstance(a, np.ndarray):
        raise TypeError(f"nibble: {what} must be a numpy.ndarray, got {type(a).__name__}")
    if a.dtype.name == "bfloat16" and a.dtype.itemsize == 2:  # ml_dtypes / jax
        a = a.view(np.uint16)
    return a


def _nb_dtype(dt, what, allowed=(DType.F32, DType.F16, DType.BF16)):
    """numpy dtype (or "bfloat16") -> nb_dtype, or TypeError."""
    if isinstance(dt, str) and dt.lower() in ("bfloat16", "bf16"):
        code = DType.BF16
    else:
        try:
            dt = np.dtype(dt)
        except TypeError:
            raise TypeError(f"nibble: {what}: {dt!r} is not a dtype") from None
        code = {np.dtype(np.float32): DType.F32, np.dtype(np.float16): DType.F16,
                np.dtype(np.uint16): DType.BF16}.get(dt)
        if dt.name == "bfloat16" and dt.itemsize == 2:
            code = DType.BF16
    if code is None or code not in allowed:
        names = ", ".join({DType.F32: "float32", DType.F16: "float16", DType.BF16: "uint16 (bfloat16 bits)"}[c]
                          for c in allowed)
        raise TypeError(f"nibble: {what} has dtype {dt}; expected one of {names}")
    return code


_NP_OF = {DType.F32: np.float32, DType.F16: np.float16, DType.BF16: np.uint16}


def _ptr(a, ctype=ctypes.c_void_p):
    return a.ctypes.data_as(ctype) if ctype is not ctypes.c_void_p else ctypes.c_void_p(a.ctypes.data)


def _u8(a):
    return a.ctypes.data_as(ctypes.POINTER(ctypes.c_uint8))


def _format(fmt):
    if isinstance(fmt, Format):
        return fmt
    if isinstance(fmt, str) and fmt.lower() in _FORMATS:
        return _FORMATS[fmt.lower()]
    raise ValueError(f"nibble: unknown format {fmt!r}; expected one of {', '.join(map(repr, _FORMATS))}")


def _has_e8m0_scales(fmt):
    """Formats whose block scales are E8M0 powers of two: the MX scale rule
    picks their exponents."""
    return _lib.FORMAT_INFO[fmt]["scale_type"] == ScaleType.E8M0


# ------------------------------------------------------- quantized weights

# scale type -> the numpy dtype of a scales array (BF16 as uint16 bits)
_SCALE_NP = {ScaleType.E4M3: np.uint8, ScaleType.E8M0: np.uint8, ScaleType.F16: np.float16,
             ScaleType.BF16: np.uint16, ScaleType.F32: np.float32}


def _scale_type(st, fmt):
    """A scale type given as None (the format's default), a ScaleType or a
    name ("f16", "bf16", "f32", "e4m3", "e8m0")."""
    if st is None:
        return ScaleType(_lib.FORMAT_INFO[fmt]["scale_type"])
    if isinstance(st, str):
        try:
            return ScaleType[st.upper()]
        except KeyError:
            raise ValueError(f"nibble: unknown scale type {st!r}; expected one of "
                             f"{[t.name.lower() for t in ScaleType]}") from None
    return ScaleType(st)


def _zeros_np(info, st):
    """The numpy dtype of a format's zero points: uint8 (NB_ZERO_U8), or the
    scales' (NB_ZERO_FLOAT: float16, or uint16 holding BF16 bits)."""
    return _SCALE_NP[st] if info["zero_type"] == 2 else np.uint8


@dataclass
class QuantizedWeight:
    """A weight in the checkpoint layout (what ModelOpt / compressed-tensors /
    gpt-oss store, and nibble's form of the AWQ / GPTQ / bitsandbytes ones):
    codes uint8 [n, k*bits/8] (4 bits: [n, k/2], low nibble = even element;
    int8: [n, k], the two's-complement bytes),
    scales [n, k/group] (uint8 E4M3 for NVFP4, E8M0 for MXFP4; float16,
    uint16 = BF16 bits or float32 for the formats with such scales), zeros
    [n, k/group] for a format with zero points (int4: uint8; int4_hqq: the
    scales' dtype, float16 or uint16 = BF16 bits; None otherwise),
    and the FP32 tensor scale (NVFP4 weight_scale_2; 1.0 for the others).
    group (None: the format's default; k: one group per row) and scale_type
    (None: the default; "f16", "bf16", ...) describe the choice."""
    codes: np.ndarray
    scales: np.ndarray
    tensor_scale: float
    n: int
    k: int
    format: str = "nvfp4"
    scale_rule: str = field(default=DEFAULT_SCALE_RULE)  # the MXFP4 rule used by quantize (informational)
    group: Optional[int] = None
    scale_type: Optional[str] = None
    zeros: Optional[np.ndarray] = None

    @property
    def group_size(self):
        return int(self.group) if self.group else _GROUP[_format(self.format)]

    def desc(self):
        """A validated nb_weight_desc (checkpoint layout) for this weight; also
        checks the arrays' types and shapes."""
        fmt = _format(self.format)
        n, k = int(self.n), int(self.k)
        d = _lib.WeightDesc()
        _lib.lib.nb_weight_desc_init(ctypes.byref(d), fmt, n, k)  # (validated below, with the group chosen)
        d.group_size = self.group_size
        st = _scale_type(self.scale_type, fmt)
        d.scale_type = st
        _lib.check(_lib.lib.nb_weight_desc_validate(ctypes.byref(d)))
        d.tensor_scale = float(self.tensor_scale)
        d.scale_rule = _RULES.get(self.scale_rule, _RULES[DEFAULT_SCALE_RULE])
        info = _lib.FORMAT_INFO[fmt]
        g = d.group_size
        arrays = [("codes", self.codes, (n, k * info["element_bits"] // 8), np.uint8),
                  ("scales", self.scales, (n, k // g), _SCALE_NP[st])]
        if info["zero_point"]:
            arrays.append(("zeros", self.zeros, (n, k // g), _zeros_np(info, st)))
        elif self.zeros is not None:
            raise ValueError(f"nibble: {_FORMAT_NAMES[fmt]} has no zero points; QuantizedWeight.zeros must be None")
        for name, arr, shape, dt in arrays:
            if not isinstance(arr, np.ndarray) or arr.dtype != dt:
                raise TypeError(f"nibble: QuantizedWeight.{name} must be a numpy {np.dtype(dt).name} array for "
                                f"{_FORMAT_NAMES[fmt]} with {st.name.lower()} scales")
            if arr.shape != shape:
                raise ValueError(f"nibble: QuantizedWeight.{name} has shape {arr.shape}, expected {shape} "
                                 f"for {_FORMAT_NAMES[fmt]} n={n} k={k}")
        return d

    def _arrays(self):
        zeros = np.ascontiguousarray(self.zeros) if self.zeros is not None else None
        return np.ascontiguousarray(self.codes), np.ascontiguousarray(self.scales), zeros


def _buffers(codes, scales, zeros):
    """An nb_weight_buffers / nb_weight_data over the arrays (kept alive by the caller)."""
    b = _lib.WeightBuffers()
    b.codes, b.scales = codes.ctypes.data, scales.ctypes.data
    b.zeros = zeros.ctypes.data if zeros is not None else None
    return b


@dataclass
class PackedWeight:
    """nb_pack output: the kernel layout (one byte buffer) plus the descriptor
    fields nb_gemm needs: for MXFP4 the scale exponent range nb_pack found,
    for int4 the zero-point range (smallest and largest zero-point byte, in
    scale_exp_min / scale_exp_max as nb_pack_host_v2 records it: BF16
    activations take zero points up to 127), and for the integer formats the
    group (None: the format's default; k: one group per row) and scale type
    (None: the default; "f16", "bf16"), which the packed layout depends on."""
    data: np.ndarray
    n: int
    k: int
    format: str
    tensor_scale: float
    scale_exp_min: int
    scale_exp_max: int
    group: Optional[int] = None
    scale_type: Optional[str] = None

    @property
    def group_size(self):
        return int(self.group) if self.group else _GROUP[_format(self.format)]

    def desc(self):
        """A validated packed-layout nb_weight_desc for this weight."""
        return _packed_desc(_format(self.format), int(self.n), int(self.k), self.group, self.scale_type,
                            self.tensor_scale, self.scale_exp_min, self.scale_exp_max)


def _packed_desc(fmt, n, k, group, scale_type, tensor_scale, scale_exp_min, scale_exp_max):
    """A packed-layout nb_weight_desc (validated: a group or scale type the
    format does not accept raises nibble.Error naming the ones it does)."""
    d = _lib.WeightDesc()
    _lib.lib.nb_weight_desc_init(ctypes.byref(d), fmt, n, k)  # (validated below, with the group chosen)
    d.group_size = int(group) if group else _GROUP[fmt]
    d.scale_type = _scale_type(scale_type, fmt)
    _lib.check(_lib.lib.nb_weight_desc_validate(ctypes.byref(d)))
    d.layout = Layout.PACKED
    d.tensor_scale = float(tensor_scale)
    d.scale_exp_min, d.scale_exp_max = int(scale_exp_min), int(scale_exp_max)
    return d


def weight_sizes(n, k, format="nvfp4", group_size=None, scale_type=None):
    """nb_weight_get_sizes_v2 as a dict: codes_bytes, scales_bytes,
    zeros_bytes, packed_bytes, dense_elements (group_size and scale_type as
    quantize takes them)."""
    fmt = _format(format)
    d = _lib.WeightDesc()
    _lib.lib.nb_weight_desc_init(ctypes.byref(d), fmt, int(n), int(k))
    d.group_size = int(group_size) if group_size else _GROUP[fmt]
    d.scale_type = _scale_type(scale_type, fmt)
    s = _lib.WeightSizesV2()
    _lib.check(_lib.lib.nb_weight_get_sizes_v2(ctypes.byref(d), ctypes.byref(s)))
    return {name: getattr(s, name) for name, _ in s._fields_ if name != "reserved"}


_METHODS = {"rtn": 0, "mse": 1, "hqq": 2}  # nb_quant_method


def _quant_args(fmt, scale_rule, tensor_scale, method):
    """The checks quantize's arguments get wherever it runs (here, and the
    device quantizer of nibble.torch); returns the scale rule's name."""
    if not _has_e8m0_scales(fmt):
        if scale_rule is not None:
            raise ValueError(f"nibble: scale_rule applies to formats with E8M0 scales (MXFP4), not "
                             f"{_FORMAT_NAMES[fmt]}")
        rule = DEFAULT_SCALE_RULE  # (unused: no E8M0 scales)
    else:
        rule = _rule_name(DEFAULT_SCALE_RULE if scale_rule is None else scale_rule, scale_rule)
    if not _lib.FORMAT_INFO[fmt]["tensor_scale"] and tensor_scale not in (None, 0, 1):
        raise ValueError(f"nibble: {_FORMAT_NAMES[fmt]} has no tensor scale (tensor_scale must be None or 1)")
    if method not in _METHODS:
        raise ValueError(f"nibble: unknown method {method!r}; expected one of {sorted(_METHODS)}")
    return rule


def quantize(w, format="nvfp4", scale_rule=None, tensor_scale=None, ctx=None, group_size=None, scale_type=None,
             method="rtn"):
    """Quantize a 2-D array W[n, k] (float32, float16 or uint16 = BF16 bits)
    with the host reference (nb_quantize_host).

    method "rtn" (default) uses the format's scale rule; "mse" picks, per
    block, among the rule's scale and its neighbours the one with the least
    squared error (NB_QUANT_MSE: never a larger block error than "rtn",
    deterministic; the tensor scale is the rule's).

    NVFP4 follows NVIDIA ModelOpt: tensor_scale None computes amax/(6*448);
    a given tensor_scale (weight_scale_2) is used as is.  MXFP4 uses
    scale_rule "even" (default: Quark, compressed-tensors, and `nibble
    quantize`), "ocp" (the OCP specification's floor rule, llama.cpp) or
    "round_up" (triton_kernels; "round-up" too); MXFP4 has no tensor scale.
    The integer and bitsandbytes formats (int4 with zero points, int4_sym,
    int8, nf4, bnb_fp4) round to nearest as docs/formats.md sections 4 and 5
    say, with group_size (None: the format's default; k: one group per row)
    and scale_type ("f16", "bf16"; nf4 / bnb_fp4 "f32") among those the
    format accepts; method "mse" serves nvfp4 and mxfp4 only.  int4_hqq
    follows HQQ's own quantizer (hqq 0.2.8, axis 1, round_zero off): "rtn"
    is it with optimize=False, bit for bit; "hqq" (NB_QUANT_HQQ) is hqq's
    configuration for 4 bits (round_zero and optimize on, as
    transformers' HqqConfig): integer zero points moved by the
    half-quadratic optimizer (HQQ's iteration in float32, the sums in
    double: a zero point can differ from hqq's in its last bit).  Non-finite elements raise
    nibble.Error (NB_ERR_INVALID_ARGUMENT)."""
    fmt = _format(format)
    w = _as_array(w, "w")
    dt = _nb_dtype(w.dtype, "w")
    if w.ndim != 2:
        raise ValueError(f"nibble: w must be 2-D [n, k], got shape {w.shape}")
    n, k = w.shape
    g = int(group_size) if group_size else _GROUP[fmt]
    if n < 1 or k < 1 or k % g:
        raise ValueError(f"nibble: w has shape {w.shape}; {_FORMAT_NAMES[fmt]} needs n >= 1 and k a positive "
                         f"multiple of {g}")
    rule = _quant_args(fmt, scale_rule, tensor_scale, method)
    w = np.ascontiguousarray(w)
    ctx = ctx or default_context()
    d = _lib.WeightDesc()
    _lib.lib.nb_weight_desc_init(ctypes.byref(d), fmt, n, k)
    st = _scale_type(scale_type, fmt)
    d.group_size, d.scale_type = g, st
    _lib.check(_lib.lib.nb_weight_desc_validate(ctypes.byref(d)))
    d.scale_rule = _RULES[rule]
    d.method = _METHODS[method]
    if tensor_scale is not None:
        d.tensor_scale = float(tensor_scale)
    info = _lib.FORMAT_INFO[fmt]
    codes = np.empty((n, k * info["element_bits"] // 8), dtype=np.uint8)
    scales = np.empty((n, k // g), dtype=_SCALE_NP[st])
    zeros = np.empty((n, k // g), dtype=_zeros_np(info, st)) if info["zero_point"] else None
    b = _buffers(codes, scales, zeros)
    ctx.check(_lib.lib.nb_quantize_host_v2(ctx.ptr, ctypes.byref(d), dt, _ptr(w), ctypes.byref(b)))
    return QuantizedWeight(codes=codes, scales=scales, tensor_scale=float(d.tensor_scale), n=n, k=k,
                           format=_FORMAT_NAMES[fmt], scale_rule=rule,
                           group=g if group_size else None, scale_type=st.name.lower() if scale_type else None,
                           zeros=zeros)


def dequantize(qw, dtype=np.float32, ctx=None):
    """W[n, k] from a QuantizedWeight (nb_dequantize_host_v2): value =
    (element(code) - zero) * scale * tensor_scale computed in float32 (exact
    for NVFP4, MXFP4 and the integer formats; one float32 rounding for the
    bitsandbytes tables) and rounded to dtype (float32, float16, or np.uint16 /
    "bfloat16" for BF16 bits)."""
    if not isinstance(qw, QuantizedWeight):
        raise TypeError(f"nibble: expected a QuantizedWeight, got {type(qw).__name__}")
    dt = _nb_dtype(dtype, "dequantize dtype")
    d = qw.desc()
    codes, scales, zeros = qw._arrays()
    out = np.empty((qw.n, qw.k), dtype=_NP_OF[dt])
    ctx = ctx or default_context()
    b = _buffers(codes, scales, zeros)
    ctx.check(_lib.lib.nb_dequantize_host_v2(ctx.ptr, ctypes.byref(d), ctypes.byref(b), dt, _ptr(out)))
    return out


def pack(qw, ctx=None):
    """The kernel layout of a QuantizedWeight (nb_pack_host_v2: codes,
    scales and, for int4, zero points): a PackedWeight whose .data is a 1-D
    uint8 array, bit-identical to what nb_pack_v2 produces on the GPU.  Only
    the formats the GPU kernels serve (format_info(f)["kernels"]: all of
    nvfp4, mxfp4, int4, int4_sym, int8, nf4, bnb_fp4) have a packed layout;
    another raises nibble.Error (NB_ERR_UNSUPPORTED) naming it."""
    if not isinstance(qw, QuantizedWeight):
        raise TypeError(f"nibble: expected a QuantizedWeight, got {type(qw).__name__}")
    d = qw.desc()
    s = _lib.WeightSizesV2()
    _lib.check(_lib.lib.nb_weight_get_sizes_v2(ctypes.byref(d), ctypes.byref(s)))
    codes, scales, zeros = qw._arrays()
    out = np.empty(s.packed_bytes, dtype=np.uint8)
    ctx = ctx or default_context()
    b = _buffers(codes, scales, zeros)
    ctx.check(_lib.lib.nb_pack_host_v2(ctx.ptr, ctypes.byref(d), ctypes.byref(b), _ptr(out), out.nbytes))
    return PackedWeight(data=out, n=qw.n, k=qw.k, format=qw.format, tensor_scale=float(d.tensor_scale),
                        scale_exp_min=int(d.scale_exp_min), scale_exp_max=int(d.scale_exp_max),
                        group=qw.group, scale_type=qw.scale_type)


def unpack(pw, ctx=None):
    """The checkpoint layout of a PackedWeight (nb_unpack_host_v2, the
    inverse of pack): a QuantizedWeight whose codes, scales and (int4) zero
    points are exactly the bytes that were packed (pack(unpack(pw)).data ==
    pw.data), with pw's group and scale type."""
    if not isinstance(pw, PackedWeight):
        raise TypeError(f"nibble: expected a PackedWeight, got {type(pw).__name__}")
    data = pw.data
    if not isinstance(data, np.ndarray) or data.dtype != np.uint8 or data.ndim != 1:
        raise TypeError("nibble: PackedWeight.data must be a 1-D numpy uint8 array")
    fmt = _format(pw.format)
    n, k = int(pw.n), int(pw.k)
    d = pw.desc()
    info = _lib.FORMAT_INFO[fmt]
    g = int(d.group_size)
    codes = np.empty((n, k * info["element_bits"] // 8), np.uint8)
    scales = np.empty((n, k // g), _SCALE_NP[ScaleType(d.scale_type)])
    zeros = np.empty((n, k // g), _zeros_np(info, ScaleType(d.scale_type))) if info["zero_point"] else None
    data = np.ascontiguousarray(data)
    ctx = ctx or default_context()
    b = _buffers(codes, scales, zeros)
    ctx.check(_lib.lib.nb_unpack_host_v2(ctx.ptr, ctypes.byref(d), _ptr(data), data.nbytes, ctypes.byref(b)))
    return QuantizedWeight(codes=codes, scales=scales, tensor_scale=float(pw.tensor_scale), n=n, k=k,
                           format=_FORMAT_NAMES[fmt], group=pw.group, scale_type=pw.scale_type, zeros=zeros)


def gemm_reference(x, qw, bias=None, out_dtype=np.float32, ctx=None):
    """Y[m, n] = X[m, k] . dequant(W)^T (+ bias[n]) with the host reference.

    x: float32, float16 or uint16 (BF16 bits).  out_dtype float32, float16 or
    uint16 / "bfloat16": nb_gemm_host (float32 accumulation, one rounding to
    out_dtype); bias, if given, must have out_dtype.  out_dtype float64:
    nb_gemm_host_f64 (float64 accumulation, the yardstick the C tests use);
    bias must then be float32."""
    if not isinstance(qw, QuantizedWeight):
        raise TypeError(f"nibble: expected a QuantizedWeight, got {type(qw).__name__}")
    x = _as_array(x, "x")
    act = _nb_dtype(x.dtype, "x")
    if x.ndim != 2:
        raise ValueError(f"nibble: x must be 2-D [m, k], got shape {x.shape}")
    m, k = x.shape
    if m < 1 or k != qw.k:
        raise ValueError(f"nibble: x has shape {x.shape}; expected [m >= 1, k = {qw.k}]")
    f64 = np.dtype(out_dtype) == np.float64 if not isinstance(out_dtype, str) else False
    out = DType.F32 if f64 else _nb_dtype(out_dtype, "out_dtype")
    if bias is not None:
        bias = _as_array(bias, "bias")
        if _nb_dtype(bias.dtype, "bias") != out:
            raise TypeError(f"nibble: bias has dtype {bias.dtype}; it must be {np.dtype(_NP_OF[out])} "
                            f"for out_dtype {np.dtype(out_dtype) if not isinstance(out_dtype, str) else out_dtype}")
        if bias.shape != (qw.n,):
            raise ValueError(f"nibble: bias has shape {bias.shape}, expected ({qw.n},)")
        bias = np.ascontiguousarray(bias)
    d = qw.desc()
    codes, scales, zeros = qw._arrays()
    wb = _buffers(codes, scales, zeros)
    x = np.ascontiguousarray(x)
    g = _lib.GemmDesc()
    _lib.check(_lib.lib.nb_gemm_desc_init(ctypes.byref(g), ctypes.byref(d), m, act, out))
    y = np.empty((m, qw.n), dtype=np.float64 if f64 else _NP_OF[out])
    bptr = _ptr(bias) if bias is not None else None
    ctx = ctx or default_context()
    if f64:
        st = _lib.lib.nb_gemm_host_f64_v2(ctx.ptr, ctypes.byref(g), _ptr(x), ctypes.byref(wb), bptr,
                                          y.ctypes.data_as(ctypes.POINTER(ctypes.c_double)))
    else:
        st = _lib.lib.nb_gemm_host_v2(ctx.ptr, ctypes.byref(g), _ptr(x), ctypes.byref(wb), bptr, _ptr(y))
    ctx.check(st)
    return y


# Mixture-of-experts MLPs (nibble/moe.py) and the checkpoint reader (the
# checkpoint API of libnibble, nibble_io.h).
from .moe import MoeSpec, QuantizedExperts, QuantizedMoe, PackedMoe, moe_pack, moe_unpack, moe_reference  # noqa: E402
from .checkpoint import (Checkpoint, CheckpointLayer, CheckpointMoe, TensorInfo, open_checkpoint,  # noqa: E402
                         quantize_checkpoint)
