"""nibble.torch: a thin PyTorch layer over libnibble's C ABI (ctypes).

Nothing here links against PyTorch's C++ ABI (STYLE.md 14): tensors are handed
to the C library as raw device pointers (Tensor.data_ptr()) and the stream as
torch.cuda.current_stream().cuda_stream, so this module works with any PyTorch
that has torch.library.custom_op (2.4 or newer).  `import nibble` never imports
torch; `import nibble.torch` needs it.

    import torch, nibble.torch as nt
    pw = nt.quantize(linear.weight, format="nvfp4")     # PackedLinearWeight on the GPU
    y = nt.gemm(x, pw, bias)                           # x [..., k] bf16/fp16 CUDA -> y [..., n]
    lin = nt.Linear.from_linear(linear, format="mxfp4")
    nt.quantize_model(model, format="nvfp4", exclude=["lm_head"])
    nt.load_quantized(model, "Llama-3.1-8B-NVFP4/")    # ModelOpt / Quark / compressed-tensors

The op
  torch.ops.nibble.gemm(x, packed, workspace, bias, n, k, format, tensor_scale,
                        scale_exp_min, scale_exp_max, group_size=0,
                        scale_type=0) -> y
  (group_size and scale_type: the integer formats' group and nb_scale_type,
  0 for the format's default; PackedLinearWeight.op_args() gives them all)
  is registered with torch.library.custom_op (no mutated arguments: nb_gemm
  leaves the workspace zero-filled as it found it) and has a fake (meta)
  implementation, so torch.compile(fullgraph=True) traces through it and CUDA
  graphs capture it (nb_gemm allocates nothing and never synchronizes; y comes
  from torch's caching allocator).  x's leading dimensions are flattened
  (m = their product, m = 0 returns an empty y without a C call); a last
  dimension that is not contiguous, or rows that are not 16-byte aligned, are
  copied first.  y is a new contiguous tensor of x's dtype.

Mixture of experts
  torch.ops.nibble.moe_mlp(x, topk_ids, topk_weights, gate_up, down,
                           gate_up_scales, down_scales, gate_up_bias,
                           down_bias, format, experts, hidden, intermediate,
                           activation, gate_up_layout, limit, alpha,
                           exponent ranges) -> y
  runs a whole MoE MLP (nb_moe_mlp; moe() and MoeExperts wrap it).  Like
  gemm it also runs on CPU tensors, as the host reference (nb_moe_mlp_host
  on the unpacked bytes): for checking, not for speed.

Gated activations
  torch.ops.nibble.glu(gu, activation, layout, limit, alpha) -> h
  (glu() wraps it): h [..., I] = act(gate, up) of a fused gate/up output
  gu [..., 2I] (nb_glu; nb_glu_host on CPU tensors), an engine's
  silu_and_mul, which between two nibble GEMMs keeps their launches
  chained (nibble.h, "gated activations").

Devices
  Both ops run on CUDA devices (nb_gemm, nb_moe_mlp) and on CPU tensors.  On
  the CPU, gemm unpacks the packed bytes (nb_unpack_host_v2: exactly the
  checkpoint-layout codes, scales and zero points they hold) and runs the
  host reference on them (nb_gemm_host_v2: the arithmetic the kernels are
  held to, float32 accumulation and one rounding to x's dtype, in its own
  summation order): a checking path, for tests without a GPU (tensor
  parallelism over gloo, nibble/tp.py), slow and never chosen in place of a
  GPU.  It takes bfloat16, float16 and float32 x (float32: CPU only).  Other
  devices raise ValueError.

Errors
  Wrong Python types or dtypes raise TypeError, wrong shapes, devices or
  formats ValueError, all before any C call; failures inside libnibble (e.g.
  NB_ERR_UNSUPPORTED for an MXFP4 weight whose exponents span too many binades
  for FP16) raise nibble.Error with the context's detailed message.

Inference only: the op has no autograd formula.
"""

import ctypes
import fnmatch
import os
import threading
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Optional

import numpy as np
import torch

from . import _lib
from . import PackedWeight, QuantizedWeight, quantize as _np_quantize, dequantize as _np_dequantize
from . import pack as _np_pack, unpack as _np_unpack, gemm_reference as _np_gemm_reference
from . import _FORMATS, _FORMAT_NAMES, _GROUP, _RULES, _quant_args, _rule_name, _scale_type
from . import _format as _np_format
from .moe import ACTIVATIONS, GATE_UP_LAYOUTS, MoeSpec, QuantizedExperts, QuantizedMoe
from ._lib import DType, ElementType, Error, Format, Layout, ScaleType  # noqa: F401  (Error: this module's contract)

if not hasattr(torch, "library") or not hasattr(torch.library, "custom_op"):
    raise ImportError(f"nibble.torch needs torch.library.custom_op (PyTorch 2.4 or newer); found torch "
                      f"{torch.__version__}")

__all__ = ["PackedLinearWeight", "quantize", "pack", "dequantize_weight", "hqq_weight", "gemm", "glu", "Linear",
           "quantize_model",
           "load_quantized", "last_config", "context", "Error", "PackedMoeWeights", "pack_moe", "unpack_moe", "moe",
           "MoeExperts", "fuse_linears", "fuse_projections", "fuse_glu", "unfuse_projections", "ProjectionSlice"]

_DTYPES = {torch.bfloat16: DType.BF16, torch.float16: DType.F16}
_GEMM_DTYPES = (torch.bfloat16, torch.float16, torch.float32)   # float32: the host reference only (CPU tensors)


# ---------------------------------------------------------------- contexts
# nb_context keeps per-call state (last error, last configuration), so the C
# contract is one context per host thread: one per (thread, CUDA device).
# libnibble launches on the calling thread's current CUDA device, so every
# call below runs with the tensor's device made current.

_tls = threading.local()


def context(device=None):
    """This thread's nibble.Context for a CUDA device (a torch.device, an
    index, or None for the current device), created on first use."""
    idx = _device_index(device)
    ctxs = getattr(_tls, "ctxs", None)
    if ctxs is None:
        ctxs = _tls.ctxs = {}
    ctx = ctxs.get(idx)
    if ctx is None:
        ctx = ctxs[idx] = _lib.Context(idx)
    return ctx


def _device_index(device):
    if device is None:
        return torch.cuda.current_device()
    if isinstance(device, int):
        return device
    device = torch.device(device)
    if device.type != "cuda":
        raise ValueError(f"nibble.torch: device {device} is not a CUDA device")
    return device.index if device.index is not None else torch.cuda.current_device()


class _on_device:
    """Make CUDA device idx current for the duration of a C call (cheap when
    it already is)."""

    def __init__(self, idx):
        self.idx = idx
        self.prev = None

    def __enter__(self):
        cur = torch.cuda.current_device()
        if cur != self.idx:
            self.prev = cur
            torch.cuda.set_device(self.idx)

    def __exit__(self, *exc):
        if self.prev is not None:
            torch.cuda.set_device(self.prev)


def last_config(device=None):
    """nb_gemm_last_config of this thread's context on `device`: which kernel
    configuration the last nibble.torch GEMM there ran."""
    ctx = context(device)
    buf = ctypes.create_string_buffer(256)
    ctx.check(_lib.lib.nb_gemm_last_config(ctx.ptr, buf, len(buf)))
    return buf.value.decode()


# ------------------------------------------------------------- descriptors

_desc_cache = {}


def _weight_desc(n, k, fmt, tensor_scale, scale_exp_min, scale_exp_max, group_size=0, scale_type=0):
    """A packed-layout nb_weight_desc (cached: the op builds one per call);
    group_size / scale_type 0 are the format's defaults."""
    key = (n, k, fmt, tensor_scale, scale_exp_min, scale_exp_max, group_size, scale_type)
    d = _desc_cache.get(key)
    if d is None:
        d = _lib.WeightDesc()
        # (init validates against the default group, which may not divide k: validated below with the chosen one)
        _lib.lib.nb_weight_desc_init(ctypes.byref(d), fmt, n, k)
        if group_size:
            d.group_size = group_size
        if scale_type:
            d.scale_type = scale_type
        _lib.check(_lib.lib.nb_weight_desc_validate(ctypes.byref(d)))
        d.layout = Layout.PACKED
        d.tensor_scale = tensor_scale
        d.scale_exp_min = scale_exp_min
        d.scale_exp_max = scale_exp_max
        if len(_desc_cache) > 4096:
            _desc_cache.clear()
        _desc_cache[key] = d
    return d


def _format_code(fmt):
    """The Format of a name, Format or value that the GPU kernels serve
    (this module is the GPU path: a format without kernels is refused by
    name, never run another way)."""
    if isinstance(fmt, Format):
        code = fmt
    elif isinstance(fmt, str) and fmt.lower() in _FORMATS:
        code = _FORMATS[fmt.lower()]
    elif isinstance(fmt, int) and not isinstance(fmt, bool) and fmt in _lib.FORMAT_INFO:
        code = Format(fmt)
    else:
        raise ValueError(f"nibble.torch: unknown format {fmt!r}; expected one of {', '.join(map(repr, _FORMATS))}")
    if not _lib.FORMAT_INFO[code]["kernels"]:
        raise ValueError(f"nibble.torch: no GPU kernel serves {_FORMAT_NAMES[code]} yet (the host reference is "
                         "nibble.quantize / nibble.dequantize on numpy arrays)")
    return code


def _fp4(fmt):
    """The FP4 formats (E2M1 codes: nvfp4, mxfp4) are the ones the device
    quantizer and dequantizer (nb_quantize, nb_dequantize) and the MoE
    kernels serve (nibble.h); the integer formats go through the host
    reference there."""
    return _lib.FORMAT_INFO[fmt]["element"] == ElementType.E2M1


def _group_code(group):
    """A QuantizedWeight / PackedWeight group (None: the format's default) as
    the op's group_size argument (0: the default)."""
    return int(group) if group else 0


def _scale_code(scale_type, fmt):
    """A scale type (None, a name or a ScaleType) as the op's scale_type
    argument (0: the format's default)."""
    return 0 if scale_type is None else int(_scale_type(scale_type, fmt))


def _scale_name(code):
    """The op's scale_type argument as a QuantizedWeight's scale_type."""
    return ScaleType(code).name.lower() if code else None


@dataclass
class PackedLinearWeight:
    """A weight W[n, k] in the GPU kernels' layout, ready for nb_gemm.

    packed     uint8 CUDA tensor, nb_pack output (packed_bytes long)
    workspace  uint8 CUDA tensor of nb_gemm_workspace_size bytes, zero-filled
               once here; nb_gemm leaves it zeroed.  It serves any m but must
               not be used by two GEMMs running concurrently (two streams).
    n, k, format ("nvfp4", "mxfp4", "int4", "int4_sym", "int8", "nf4",
    "bnb_fp4"), tensor_scale (NVFP4 weight_scale_2, 1.0 for the others),
    scale_exp_min/max (found by nb_pack:
    the MXFP4 scale exponent range, the int4 zero-point range), group (None:
    the format's default; k: one group per row) and scale_type (None: the
    default; "f16" or "bf16" for the integer formats): the nb_weight_desc
    fields nb_gemm needs."""
    packed: torch.Tensor
    workspace: torch.Tensor
    n: int
    k: int
    format: str
    tensor_scale: float
    scale_exp_min: int
    scale_exp_max: int
    group: Optional[int] = None
    scale_type: Optional[str] = None

    @property
    def device(self):
        return self.packed.device

    def op_args(self):
        """The descriptor as the op's trailing arguments."""
        fmt = _format_code(self.format)
        return (self.n, self.k, int(fmt), self.tensor_scale, self.scale_exp_min, self.scale_exp_max,
                _group_code(self.group), _scale_code(self.scale_type, fmt))


def _workspace_bytes(ctx, d):
    """nb_gemm_workspace_size, the larger of the BF16 and FP16 answers (one
    workspace serves both).  A dtype the weight cannot run with (MXFP4 whose
    exponents span too many binades for FP16) is left out; nb_gemm reports it
    when it is used."""
    best, first_error = None, None
    for dt in (DType.BF16, DType.F16):
        g = _lib.GemmDesc()
        _lib.check(_lib.lib.nb_gemm_desc_init(ctypes.byref(g), ctypes.byref(d), 1, dt, dt))
        size = ctypes.c_size_t(0)
        try:
            ctx.check(_lib.lib.nb_gemm_workspace_size(ctx.ptr, ctypes.byref(g), ctypes.byref(size)))
        except Error as e:
            first_error = first_error or e
            continue
        best = max(best or 0, size.value)
    if best is None:
        raise first_error
    return best


def _is_cpu(device):
    return device is not None and not isinstance(device, int) and torch.device(device).type == "cpu"


def pack(qw, device=None):
    """Upload a nibble.QuantizedWeight (checkpoint layout: codes, scales,
    int4 zero points, tensor scale) to a CUDA device and convert it with
    nb_pack_v2 (on the current stream, which it synchronizes: a load-time
    call).  Returns a PackedLinearWeight with its zero-filled workspace.

    device="cpu" packs on the host instead (nb_pack_host_v2, the same bytes):
    the weight then waits in host memory, with an empty workspace, for a
    Linear holding it to be moved to a GPU (module.to("cuda")); on the CPU
    the op runs the host reference on it (for checking, not for speed)."""
    if not isinstance(qw, QuantizedWeight):
        raise TypeError(f"nibble.torch: expected a nibble.QuantizedWeight, got {type(qw).__name__}")
    if _is_cpu(device):
        _format_code(qw.format)
        pw = _np_pack(qw)
        return PackedLinearWeight(packed=torch.from_numpy(pw.data), workspace=torch.empty(0, dtype=torch.uint8),
                                  n=qw.n, k=qw.k, format=qw.format, tensor_scale=pw.tensor_scale,
                                  scale_exp_min=pw.scale_exp_min, scale_exp_max=pw.scale_exp_max,
                                  group=pw.group, scale_type=pw.scale_type)
    dev = torch.device("cuda", _device_index(device))
    _format_code(qw.format)
    d = qw.desc()  # checks the arrays' dtypes and shapes
    codes, scales, zeros = qw._arrays()
    with _on_device(dev.index):
        up = [None if a is None else torch.from_numpy(a.view(np.uint8)).to(dev) for a in (codes, scales, zeros)]
        return _pack_device(*up, d, qw.format, qw.group, qw.scale_type)


def _pack_device(codes, scales, zeros, d, format, group=None, scale_type=None):
    """nb_pack_v2 of device codes, scales and (int4) zero points (byte
    tensors; checkpoint-layout descriptor d) on their device's current
    stream, plus the zero-filled workspace."""
    dev = codes.device
    sizes = _lib.WeightSizesV2()
    _lib.check(_lib.lib.nb_weight_get_sizes_v2(ctypes.byref(d), ctypes.byref(sizes)))
    ctx = context(dev)
    w = _lib.WeightBuffers()
    w.codes, w.scales = codes.data_ptr(), scales.data_ptr()
    w.zeros = zeros.data_ptr() if zeros is not None else None
    with _on_device(dev.index):
        packed = torch.empty(sizes.packed_bytes, dtype=torch.uint8, device=dev)
        stream = torch.cuda.current_stream(dev).cuda_stream
        ctx.check(_lib.lib.nb_pack_v2(ctx.ptr, ctypes.byref(d), ctypes.byref(w), ctypes.c_void_p(packed.data_ptr()),
                                      sizes.packed_bytes, ctypes.c_void_p(stream)))
        workspace = torch.zeros(_workspace_bytes(ctx, d), dtype=torch.uint8, device=dev)
    return PackedLinearWeight(packed=packed, workspace=workspace, n=int(d.n), k=int(d.k), format=format,
                              tensor_scale=float(d.tensor_scale), scale_exp_min=int(d.scale_exp_min),
                              scale_exp_max=int(d.scale_exp_max), group=group, scale_type=scale_type)


def unpack(weight):
    """The checkpoint layout (a nibble.QuantizedWeight in host memory) of a
    PackedLinearWeight on any device: its packed bytes are copied to the host
    and nb_unpack_host_v2 returns exactly the codes, scales and (int4) zero
    points that were packed."""
    if not isinstance(weight, PackedLinearWeight):
        raise TypeError(f"nibble.torch: expected a PackedLinearWeight, got {type(weight).__name__}")
    if weight.packed.is_meta:
        raise ValueError("nibble.torch: the weight is on the meta device (no bytes to unpack)")
    data = weight.packed.detach().to("cpu").contiguous().numpy()
    return _np_unpack(PackedWeight(data=data, n=weight.n, k=weight.k, format=weight.format,
                                   tensor_scale=weight.tensor_scale, scale_exp_min=weight.scale_exp_min,
                                   scale_exp_max=weight.scale_exp_max, group=weight.group,
                                   scale_type=weight.scale_type))


def _host_array(w):
    """w as a host numpy array nibble.quantize accepts, without widening:
    bfloat16 as uint16 bits, float16 and float32 as themselves (the C
    quantizer reads each exactly, so the codes equal those of a float32
    copy, at half the transfer)."""
    w = w.detach()
    if w.dtype == torch.bfloat16:
        return w.view(torch.int16).to("cpu").contiguous().numpy().view(np.uint16)
    return w.to("cpu").contiguous().numpy()


def _check_weight(w):
    if not isinstance(w, torch.Tensor):
        raise TypeError(f"nibble.torch: w must be a torch.Tensor, got {type(w).__name__}")
    if w.dtype not in (torch.float32, torch.bfloat16, torch.float16):
        raise TypeError(f"nibble.torch: w has dtype {w.dtype}; expected float32, bfloat16 or float16")
    if w.dim() != 2:
        raise ValueError(f"nibble.torch: w must be 2-D [n, k], got shape {tuple(w.shape)}")
    if w.device.type == "meta":
        raise ValueError("nibble.torch: w is on the meta device (no values to quantize)")


def quantize(w, format="nvfp4", scale_rule=None, tensor_scale=None, device=None, method="rtn", group_size=None,
             scale_type=None):
    """Quantize W[n, k] (a float32, bfloat16 or float16 tensor on any device)
    and pack it on a CUDA device (`device`, default: w's device if it is a
    CUDA one, else the current CUDA device).  Returns a PackedLinearWeight.

    format: "nvfp4", "mxfp4", "int4" (unsigned codes with zero points, (q -
    z) * s, AWQ / GPTQ style), "int4_sym" (q * s), "int8" (signed 8-bit
    codes, q * s), or bitsandbytes' "nf4" / "bnb_fp4" (table codes, F32
    absmax per block); group_size (None: the format's default, 128 for the
    integer formats, 64 for nf4 / bnb_fp4; int4, int4_sym, int8: 32, 64,
    128 or k, one group per row; nf4 / bnb_fp4: 32 .. 4096) and scale_type
    (integer formats: None: "f16"; "bf16") as nibble.quantize takes them -
    the FP4 formats have one group and scale type each.

    Where it runs follows w:
      * w on a GPU: the device quantizer, nb_quantize, on w's device and
        current stream (it synchronizes that stream once: it reads back the
        tensor's absolute maximum), then nb_pack there; w is never copied to
        the host.  A w on another GPU than `device` is quantized on `device`
        after a copy.
      * w on the CPU: nibble.quantize (the C reference), then the upload and
        nb_pack.
    Both give the same bytes (nb_quantize is bit-exact with the reference).
    method="mse" (NB_QUANT_MSE) has no device quantizer yet: it runs on the
    host for every w, a GPU tensor being copied there first - explicitly, by
    that argument, never in place of "rtn"; so does method="hqq" (int4_hqq:
    HQQ's optimizer of the zero points, as nibble.quantize).  The integer formats have no
    device quantizer either (nb_quantize serves NVFP4 and MXFP4): their
    weights are quantized on the host (nibble.quantize, round to nearest as
    docs/formats.md section 4.2 says; a GPU tensor is copied there) and
    packed on the device by nb_pack_v2."""
    _check_weight(w)
    fmt = _format_code(format)
    if device is None:
        device = w.device if w.device.type == "cuda" else None
    dev = _device_index(device)
    if w.device.type == "cuda" and method == "rtn" and _fp4(fmt):
        codes, scales, d = _quantize_device(w.detach().to(torch.device("cuda", dev)), fmt, scale_rule, tensor_scale,
                                            group_size, scale_type)
        return _pack_device(codes, scales, None, d, _FORMAT_NAMES[fmt])
    qw = _np_quantize(_host_array(w), format=_FORMAT_NAMES[fmt], scale_rule=scale_rule, tensor_scale=tensor_scale,
                      method=method, group_size=group_size, scale_type=scale_type)
    return pack(qw, dev)


def _quantize_device(w, fmt, scale_rule, tensor_scale, group_size=None, scale_type=None):
    """nb_quantize of a CUDA tensor W[n, k] on its device's current stream
    (an FP4 format): returns (codes, scales) as uint8 tensors on that device
    and the checkpoint-layout descriptor, tensor scale filled in.  Arguments
    are checked as nibble.quantize checks them, before any C call."""
    rule = _quant_args(fmt, scale_rule, tensor_scale, "rtn")
    n, k = w.shape
    g = int(group_size) if group_size else _GROUP[fmt]
    if n < 1 or k < 1 or k % g:
        raise ValueError(f"nibble: w has shape {tuple(w.shape)}; {_FORMAT_NAMES[fmt]} needs n >= 1 and k a positive "
                         f"multiple of {g}")
    w = w.contiguous()
    d = _lib.WeightDesc()
    _lib.lib.nb_weight_desc_init(ctypes.byref(d), fmt, n, k)   # (validated below, with the group chosen)
    d.group_size, d.scale_type = g, _scale_type(scale_type, fmt)
    _lib.check(_lib.lib.nb_weight_desc_validate(ctypes.byref(d)))   # a group or scale type the format refuses
    d.scale_rule = _RULES[rule]
    if tensor_scale is not None:
        d.tensor_scale = float(tensor_scale)
    dev = w.device
    ctx = context(dev)
    with _on_device(dev.index):
        codes = torch.empty((n, k // 2), dtype=torch.uint8, device=dev)
        scales = torch.empty((n, k // g), dtype=torch.uint8, device=dev)
        stream = torch.cuda.current_stream(dev).cuda_stream
        ctx.check(_lib.lib.nb_quantize(ctx.ptr, ctypes.byref(d), _NB_OF[w.dtype], ctypes.c_void_p(w.data_ptr()),
                                       ctypes.c_void_p(codes.data_ptr()), ctypes.c_void_p(scales.data_ptr()),
                                       ctypes.c_void_p(stream)))
    return codes, scales, d


_TORCH_OF = {DType.F32: torch.float32, DType.F16: torch.float16, DType.BF16: torch.bfloat16}
_NB_OF = {v: k for k, v in _TORCH_OF.items()}


def _hqq_meta(layer):
    """(W_q, meta) of an HQQLinear or of its state_dict (hqq's
    encode_safetensor_type: ints as 0-d tensors, strings as uint8 tensors
    of their characters, dtypes as their names)."""
    if isinstance(layer, dict):
        sd = dict(layer)
        if "W_q" not in sd:
            raise ValueError("nibble.torch: an HQQ state_dict holds W_q; this one has " + ", ".join(sorted(sd)))
        w_q = sd.pop("W_q")
        meta = {k: v for k, v in sd.items() if k != "bias"}
    else:
        if not hasattr(layer, "W_q") or not hasattr(layer, "meta"):
            raise TypeError(f"nibble.torch: expected an HQQLinear or its state_dict, got {type(layer).__name__}")
        w_q, meta = layer.W_q, dict(layer.meta)

    def value(key, default=None):
        v = meta.get(key, default)
        if torch.is_tensor(v) and key not in ("scale", "zero"):
            if v.dtype == torch.uint8 and v.dim() == 1:   # an encoded string
                return "".join(chr(int(c)) for c in v.tolist())
            return v.tolist() if v.dim() else v.item()
        if isinstance(v, torch.dtype) or isinstance(v, torch.Size):
            return str(v) if isinstance(v, torch.dtype) else list(v)
        return v
    return w_q, value


def hqq_weight(layer):
    """The int4_hqq nibble.QuantizedWeight of an HQQ-quantized layer (hqq's
    HQQLinear, or its state_dict), bit for bit: HQQ's 4-bit packing
    ("4bit_u8": W_q [n k / (2 g), g] bytes, the high nibbles the first half
    of the [n k / g, g] rows, the low nibbles the second half) into nibble's
    codes, its scale and zero [n k / g, 1] (float16 or bfloat16) into scales
    and zero points [n, k / g] (docs/formats.md 5.5).  HQQ's dequantization
    (W_q - zero) * scale in the compute dtype is then what
    nibble.dequantize gives.  Refused with the reason: other bit widths or
    packings, groups along the other axis (axis=0), quantized scales or zero
    points (quant_scale / quant_zero), W_q viewed as floats, groups other
    than 32, 64, 128 or one per row, and shapes that do not fit."""
    w_q, value = _hqq_meta(layer)
    nbits, packing, axis = value("nbits"), value("packing"), value("axis")
    if nbits != 4 or packing != "4bit_u8":
        raise ValueError(f"nibble.torch: HQQ weights of {nbits} bits packed as {packing!r}: int4_hqq reads 4-bit "
                         "weights packed as '4bit_u8'")
    if axis != 1:
        raise ValueError(f"nibble.torch: HQQ groups along axis {axis}: int4_hqq takes groups along k (axis=1)")
    if value("quant_scale", False) or value("quant_zero", False):
        raise ValueError("nibble.torch: HQQ weights with quantized scales or zero points (quant_scale / quant_zero) "
                         "are not read")
    if value("view_as_float", False):
        raise ValueError("nibble.torch: HQQ W_q viewed as floats (view_as_float) is not read")
    shape = value("shape")
    if not isinstance(shape, (list, tuple)) or len(shape) != 2:
        raise ValueError(f"nibble.torch: HQQ shape {shape!r} is not [n, k]")
    n, k = int(shape[0]), int(shape[1])
    g = value("group_size")
    g = k if g is None else int(g)
    if g not in (32, 64, 128) and g != k:
        raise ValueError(f"nibble.torch: HQQ group_size {g}: int4_hqq takes 32, 64, 128 or one group per row ({k})")
    scale, zero = _hqq_tensor(value, "scale"), _hqq_tensor(value, "zero")
    if scale.dtype not in (torch.float16, torch.bfloat16) or zero.dtype != scale.dtype:
        raise ValueError(f"nibble.torch: HQQ scale {scale.dtype} and zero {zero.dtype}: int4_hqq takes float16 or "
                         "bfloat16, both the same")
    if k % g or (n * k // g) % 2 or scale.numel() != n * k // g or zero.numel() != n * k // g:
        raise ValueError(f"nibble.torch: HQQ scale / zero of {scale.numel()} / {zero.numel()} values for [{n}, {k}] "
                         f"in groups of {g}")
    w = torch.as_tensor(w_q).detach().cpu()
    if w.dtype != torch.uint8 or tuple(w.shape) != (n * k // g // 2, g):
        raise ValueError(f"nibble.torch: HQQ W_q {w.dtype} {tuple(w.shape)}, want uint8 {(n * k // g // 2, g)}")
    u = torch.cat([w >> 4, w & 15], 0).reshape(n, k).numpy()          # element k of row n
    codes = (u[:, 0::2] | (u[:, 1::2] << 4)).astype(np.uint8)
    st = "f16" if scale.dtype == torch.float16 else "bf16"

    def arr(t):
        t = t.detach().cpu().reshape(n, k // g).contiguous()
        return t.numpy() if st == "f16" else t.view(torch.int16).numpy().view(np.uint16)
    return QuantizedWeight(codes=codes, scales=arr(scale), tensor_scale=1.0, n=n, k=k, format="int4_hqq",
                                  group=g, scale_type=st, zeros=arr(zero))


def _hqq_tensor(value, key):
    t = value(key)
    if not torch.is_tensor(t):
        raise ValueError(f"nibble.torch: HQQ {key} is {type(t).__name__}, not a tensor")
    return t


def dequantize_weight(qw, dtype=torch.bfloat16, device="cpu"):
    """W[n, k] of a nibble.QuantizedWeight as a torch tensor of `dtype`
    (bfloat16, float16 or float32) on `device`: nb_dequantize on a CUDA
    device, nb_dequantize_host_v2 on the CPU; both compute e2m1 * scale *
    tensor_scale in float32 and round once, bit for bit alike (the GEMM
    kernels multiply by exactly these values).  The integer formats ((q - z)
    * s, q * s; exact in float32, rounded once) have no device dequantizer:
    they are dequantized on the host and copied to `device`."""
    if not isinstance(qw, QuantizedWeight):
        raise TypeError(f"nibble.torch: expected a nibble.QuantizedWeight, got {type(qw).__name__}")
    if dtype not in _NB_OF:
        raise TypeError(f"nibble.torch: dtype {dtype}; expected torch.bfloat16, torch.float16 or torch.float32")
    dev = torch.device(device)
    if dev.type == "cuda" and not _fp4(_np_format(qw.format)):
        return dequantize_weight(qw, dtype, "cpu").to(torch.device("cuda", _device_index(dev)))
    if dev.type == "cpu":
        out = _np_dequantize(qw, dtype="bfloat16" if dtype == torch.bfloat16 else np.dtype(
            np.float16 if dtype == torch.float16 else np.float32))
        t = torch.from_numpy(out.view(np.int16) if dtype == torch.bfloat16 else out)
        return t.view(torch.bfloat16) if dtype == torch.bfloat16 else t
    if dev.type != "cuda":
        raise ValueError(f"nibble.torch: device {dev} is neither the CPU nor a CUDA device")
    d = qw.desc()
    idx = _device_index(dev)
    ctx = context(idx)
    with _on_device(idx):
        dev = torch.device("cuda", idx)
        codes = torch.from_numpy(np.ascontiguousarray(qw.codes)).to(dev)
        scales = torch.from_numpy(np.ascontiguousarray(qw.scales)).to(dev)
        out = torch.empty((qw.n, qw.k), dtype=dtype, device=dev)
        stream = torch.cuda.current_stream(dev).cuda_stream
        ctx.check(_lib.lib.nb_dequantize(ctx.ptr, ctypes.byref(d), ctypes.c_void_p(codes.data_ptr()),
                                         ctypes.c_void_p(scales.data_ptr()), _NB_OF[dtype],
                                         ctypes.c_void_p(out.data_ptr()), ctypes.c_void_p(stream)))
    return out


# ----------------------------------------------------------------- the op

def _check_args(x, packed, workspace, bias, n, k, fmt, group_size, scale_type, fake):
    """Type, dtype and shape checks shared by the real and the fake
    implementation (device checks only in the real one: fake tensors may be
    meta)."""
    if not isinstance(x, torch.Tensor):
        raise TypeError(f"nibble.torch: x must be a torch.Tensor, got {type(x).__name__}")
    if x.dtype not in _GEMM_DTYPES:
        raise TypeError(f"nibble.torch: x has dtype {x.dtype}; expected torch.bfloat16 or torch.float16 (and "
                        "torch.float32 on the CPU)")
    if packed.dtype != torch.uint8 or workspace.dtype != torch.uint8:
        raise TypeError(f"nibble.torch: packed and workspace must be uint8 tensors (got {packed.dtype}, "
                        f"{workspace.dtype})")
    if fmt not in _lib.FORMAT_INFO:
        raise ValueError(f"nibble.torch: unknown format code {fmt}")
    info = _lib.FORMAT_INFO[Format(fmt)]
    name = info["name"]
    group = group_size or info["group_size"]
    if group_size and group_size not in info["group_sizes"] and not (info["per_channel"] and group_size == k):
        per_row = " or k (one group per row)" if info["per_channel"] else ""
        raise ValueError(f"nibble.torch: {name} takes groups of {', '.join(map(str, info['group_sizes']))}{per_row}, "
                         f"not group_size = {group_size} (k = {k})")
    if scale_type and (scale_type not in ScaleType.__members__.values() or
                       not info["scale_types"] & (1 << scale_type)):
        raise ValueError(f"nibble.torch: {name} takes scale types {', '.join(info['scale_type_names'])}, not scale "
                         f"type code {scale_type}")
    if n < 1 or k < 1 or k % group:
        raise ValueError(f"nibble.torch: n = {n}, k = {k}: need n >= 1 and k a positive multiple of {group}")
    if not _fp4(Format(fmt)) and k % 8:
        raise ValueError(f"nibble.torch: {name} with k = {k}: the decode kernel reads activations in pieces of 8 "
                         "and needs k a multiple of 8")
    if x.dim() < 1 or x.shape[-1] != k:
        raise ValueError(f"nibble.torch: x has shape {tuple(x.shape)}; expected [..., k = {k}]")
    if bias is not None:
        if bias.dtype != x.dtype:
            raise TypeError(f"nibble.torch: bias has dtype {bias.dtype}; it must match x ({x.dtype})")
        if bias.dim() != 1 or bias.shape[0] != n:
            raise ValueError(f"nibble.torch: bias has shape {tuple(bias.shape)}; expected [{n}]")
    if not fake:
        devs = {t.device for t in (x, packed, workspace) + ((bias,) if bias is not None else ())}
        if x.device.type not in ("cuda", "cpu"):
            raise ValueError(f"nibble.torch: x is on {x.device}; nibble's GEMM runs on CUDA devices (nb_gemm) and "
                             "on the CPU (the host reference, for checking)")
        if len(devs) != 1:
            raise ValueError(f"nibble.torch: x, packed, workspace and bias must be on one device, got "
                             f"{sorted(str(t) for t in devs)}")
        if x.device.type == "cuda" and x.dtype == torch.float32:
            raise TypeError("nibble.torch: x is float32; the GEMM kernels take bfloat16 or float16 (float32 runs on "
                            "the CPU only)")


@torch.library.custom_op("nibble::gemm", mutates_args=())
def _gemm_op(x: torch.Tensor, packed: torch.Tensor, workspace: torch.Tensor, bias: Optional[torch.Tensor],
             n: int, k: int, format: int, tensor_scale: float, scale_exp_min: int,
             scale_exp_max: int, group_size: int = 0, scale_type: int = 0) -> torch.Tensor:
    _check_args(x, packed, workspace, bias, n, k, format, group_size, scale_type, fake=False)
    lead = x.shape[:-1]
    x2 = x.reshape(-1, k)
    m = x2.shape[0]
    y = torch.empty((m, n), dtype=x.dtype, device=x.device)
    if m == 0:
        return y.reshape(*lead, n)
    if x.device.type == "cpu":
        return _gemm_host(x2, packed, bias, n, k, format, tensor_scale, scale_exp_min, scale_exp_max, group_size,
                          scale_type).reshape(*lead, n)
    # nb_gemm reads rows lda elements apart and needs 16-byte aligned rows.
    if x2.stride(1) != 1 or (m > 1 and (x2.stride(0) < k or x2.stride(0) * 2 % 16)) or x2.data_ptr() % 16:
        x2 = x2.clone(memory_format=torch.contiguous_format)
    lda = x2.stride(0) if m > 1 else k
    if bias is not None and (bias.stride(0) != 1 or bias.data_ptr() % 2):
        bias = bias.clone(memory_format=torch.contiguous_format)
    dt = _DTYPES[x.dtype]
    d = _weight_desc(n, k, format, tensor_scale, scale_exp_min, scale_exp_max, group_size, scale_type)
    g = _lib.GemmDesc()
    _lib.check(_lib.lib.nb_gemm_desc_init(ctypes.byref(g), ctypes.byref(d), m, dt, dt))
    g.lda = lda
    idx = x.device.index
    ctx = context(idx)
    with _on_device(idx):
        stream = torch.cuda.current_stream(x.device).cuda_stream
        ctx.check(_lib.lib.nb_gemm(ctx.ptr, ctypes.byref(g), ctypes.c_void_p(x2.data_ptr()),
                                   ctypes.c_void_p(packed.data_ptr()),
                                   ctypes.c_void_p(bias.data_ptr() if bias is not None else None),
                                   ctypes.c_void_p(y.data_ptr()), ctypes.c_void_p(workspace.data_ptr()),
                                   workspace.numel(), ctypes.c_void_p(stream)))
    return y.reshape(*lead, n)


def _host_np(t):
    """A CPU tensor as the numpy array the host reference takes (bfloat16 as
    uint16 bits)."""
    t = t.detach().contiguous()
    return t.view(torch.int16).numpy().view(np.uint16) if t.dtype == torch.bfloat16 else t.numpy()


def _gemm_host(x, packed, bias, n, k, fmt, tensor_scale, scale_exp_min, scale_exp_max, group_size, scale_type):
    """nibble::gemm on the CPU: the packed bytes unpacked (nb_unpack_host_v2)
    and the host reference nb_gemm_host_v2 run on them (float32
    accumulation, one rounding to x's dtype) - the arithmetic the kernels are
    held to, for checking, not for speed."""
    pw = PackedWeight(data=_host_np(packed), n=n, k=k, format=_FORMAT_NAMES[Format(fmt)], tensor_scale=tensor_scale,
                      scale_exp_min=scale_exp_min, scale_exp_max=scale_exp_max, group=group_size or None,
                      scale_type=_scale_name(scale_type))
    out = {torch.bfloat16: "bfloat16", torch.float16: np.float16, torch.float32: np.float32}[x.dtype]
    y = _np_gemm_reference(_host_np(x), _np_unpack(pw), None if bias is None else _host_np(bias), out_dtype=out)
    return _torch_of_np(y, x.dtype)


def _torch_of_np(y, dtype):
    """The host reference's numpy output as a tensor of `dtype` (bfloat16
    arrives as uint16 bits)."""
    t = torch.from_numpy(y.view(np.int16) if dtype == torch.bfloat16 else y)
    return t.view(torch.bfloat16) if dtype == torch.bfloat16 else t


@_gemm_op.register_fake
def _gemm_fake(x, packed, workspace, bias, n, k, format, tensor_scale, scale_exp_min, scale_exp_max, group_size=0,
               scale_type=0):
    _check_args(x, packed, workspace, bias, n, k, format, group_size, scale_type, fake=True)
    return x.new_empty((*x.shape[:-1], n))


def gemm(x, weight, bias=None):
    """y[..., n] = x[..., k] . W^T (+ bias[n]) with nb_gemm on x's CUDA stream.

    x: bfloat16 or float16 CUDA tensor; weight: a PackedLinearWeight on the
    same device; bias: None or an [n] tensor of x's dtype.  Returns a new
    tensor of x's dtype.  CPU tensors (bfloat16, float16 or float32) run the
    host reference instead: a checking path (see the module docstring)."""
    if not isinstance(weight, PackedLinearWeight):
        raise TypeError(f"nibble.torch: weight must be a PackedLinearWeight, got {type(weight).__name__}")
    return torch.ops.nibble.gemm(x, weight.packed, weight.workspace, bias, *weight.op_args())


# ------------------------------------------------------- gated activations
# nb_glu: h [..., I] = act(gate, up) of a fused gate/up projection's output
# gu [..., 2I] (an engine's silu_and_mul).  Between two nibble GEMMs on a
# CUDA device, inside a CUDA graph, it keeps the chain of programmatic
# dependent launches (nibble.h, "gated activations") that a framework kernel
# between them would break.

def _glu_args(gu, activation, layout, limit, alpha):
    if not isinstance(gu, torch.Tensor):
        raise TypeError(f"nibble.torch: gu must be a torch.Tensor, got {type(gu).__name__}")
    if gu.dtype not in _GEMM_DTYPES:
        raise TypeError(f"nibble.torch: gu has dtype {gu.dtype}; expected torch.bfloat16 or torch.float16 (and "
                        "torch.float32 on the CPU)")
    if gu.dim() < 1 or gu.shape[-1] % 2 or gu.shape[-1] == 0:
        raise ValueError(f"nibble.torch: gu has shape {tuple(gu.shape)}; expected [..., 2I] with I >= 1")
    if activation not in ACTIVATIONS.values() or layout not in GATE_UP_LAYOUTS.values():
        raise ValueError(f"nibble.torch: activation code {activation} / layout code {layout} unknown")
    oai = activation == ACTIVATIONS["swiglu_oai"]
    if oai and not (limit > 0 and alpha > 0 and np.isfinite(limit) and np.isfinite(alpha)):
        raise ValueError(f"nibble.torch: swiglu_oai needs a positive finite limit and alpha, got {limit}, {alpha}")
    if not oai and (limit != 0 or alpha != 0):
        raise ValueError(f"nibble.torch: swiglu has no limit or alpha (got {limit}, {alpha})")


@torch.library.custom_op("nibble::glu", mutates_args=())
def _glu_op(gu: torch.Tensor, activation: int, layout: int, limit: float, alpha: float) -> torch.Tensor:
    _glu_args(gu, activation, layout, limit, alpha)
    lead, n = gu.shape[:-1], gu.shape[-1] // 2
    g2 = gu.reshape(-1, 2 * n)
    m = g2.shape[0]
    h = torch.empty((m, n), dtype=gu.dtype, device=gu.device)
    if m == 0:
        return h.reshape(*lead, n)
    d = _lib.GluDesc()
    _lib.check(_lib.lib.nb_glu_desc_init(ctypes.byref(d), activation, m, n, int(_NB_OF[gu.dtype])))
    d.layout, d.limit, d.alpha = layout, limit, alpha
    if gu.device.type == "cpu":
        g2 = g2.contiguous()
        _lib.check(_lib.lib.nb_glu_host(None, ctypes.byref(d), ctypes.c_void_p(g2.data_ptr()),
                                        ctypes.c_void_p(h.data_ptr())))
        return h.reshape(*lead, n)
    if gu.device.type != "cuda":
        raise ValueError(f"nibble.torch: gu is on {gu.device}; nb_glu runs on CUDA devices and on the CPU")
    if gu.dtype == torch.float32:
        raise TypeError("nibble.torch: gu is float32; nb_glu on the GPU takes bfloat16 or float16")
    g2 = _contiguous16(g2)
    idx = gu.device.index
    ctx = context(idx)
    with _on_device(idx):
        stream = torch.cuda.current_stream(gu.device).cuda_stream
        ctx.check(_lib.lib.nb_glu(ctx.ptr, ctypes.byref(d), ctypes.c_void_p(g2.data_ptr()),
                                  ctypes.c_void_p(h.data_ptr()), ctypes.c_void_p(stream)))
    return h.reshape(*lead, n)


@_glu_op.register_fake
def _glu_fake(gu, activation, layout, limit, alpha):
    _glu_args(gu, activation, layout, limit, alpha)
    return gu.new_empty((*gu.shape[:-1], gu.shape[-1] // 2))


def glu(gu, activation="swiglu", layout=None, limit=None, alpha=None):
    """h [..., I] = act(gate, up) of gu [..., 2I] with nb_glu (nibble.h,
    "gated activations"): activation "swiglu" (silu(gate) * up; layout
    "concat" by default: gate columns, then up) or "swiglu_oai" (gpt-oss:
    layout "interleaved", limit 7.0 and alpha 1.702 by default).  Evaluated
    in float32 and rounded once to gu's dtype.  CUDA tensors (bfloat16,
    float16) run nb_glu on the current stream; CPU tensors (also float32)
    the host reference nb_glu_host."""
    if activation not in ACTIVATIONS:
        raise ValueError(f"nibble.torch: activation {activation!r}; expected one of {sorted(ACTIVATIONS)}")
    oai = activation == "swiglu_oai"
    layout = layout or ("interleaved" if oai else "concat")
    if layout not in GATE_UP_LAYOUTS:
        raise ValueError(f"nibble.torch: layout {layout!r}; expected one of {sorted(GATE_UP_LAYOUTS)}")
    if oai:
        limit = 7.0 if limit is None else float(limit)
        alpha = 1.702 if alpha is None else float(alpha)
    elif limit is not None or alpha is not None:
        raise ValueError("nibble.torch: swiglu takes no limit or alpha")
    return torch.ops.nibble.glu(gu, int(ACTIVATIONS[activation]), int(GATE_UP_LAYOUTS[layout]),
                                float(limit or 0.0), float(alpha or 0.0))


# ------------------------------------------------------------------ modules

_LINEAR_STATE = ("weight_codes", "weight_scales", "weight_zeros", "weight_tensor_scale", "weight_desc", "perm")
_STATE_VERSION = 1   # (of the state_dict forms below: weight_desc's and moe_desc's first value)
_MOE_STATE = ("gate_up_codes", "gate_up_scales", "gate_up_tensor_scales", "down_codes", "down_scales",
              "down_tensor_scales", "moe_desc", "moe_limits")
_state_off = threading.local()


class _no_weight_state:
    """Within it, Linear.state_dict() leaves the weight out (bias only), as
    before the weight had a state_dict form: for callers that write the
    weight themselves (save_pretrained) or only want the names of a model
    still on the meta device."""

    def __enter__(self):
        self._was = getattr(_state_off, "on", False)
        _state_off.on = True
        return self

    def __exit__(self, *exc):
        _state_off.on = self._was
        return False


def _state_tensor(a):
    """A checkpoint-layout array as a state_dict tensor (BF16 bits as
    bfloat16, the rest as their own dtype), on the CPU."""
    a = np.ascontiguousarray(a)
    if a.dtype == np.uint16:
        return torch.from_numpy(a.view(np.int16).copy()).view(torch.bfloat16)
    return torch.from_numpy(a.copy())


def _state_array(t, name):
    """A state_dict tensor as the checkpoint-layout array it holds (the
    inverse of _state_tensor); TypeError for anything else."""
    if not isinstance(t, torch.Tensor) or t.is_meta:
        raise TypeError(f"{name} is {'a meta tensor' if isinstance(t, torch.Tensor) else type(t).__name__}, "
                        "not a tensor with data")
    t = t.detach().to("cpu").contiguous()
    if t.dtype == torch.bfloat16:
        return t.view(torch.int16).numpy().view(np.uint16)
    if t.dtype not in (torch.uint8, torch.float16, torch.float32):
        raise TypeError(f"{name} has dtype {t.dtype}; a weight's codes, scales and zero points are uint8, "
                        "float16, bfloat16 or float32")
    return t.numpy()


def _load_state_begin(module, state_dict, prefix, names, args):
    """The start of a nibble module's _load_from_state_dict: its own keys
    (`names`) taken out of state_dict, the rest (bias) loaded as torch
    loads it (args: local_metadata, strict, missing_keys, unexpected_keys,
    error_msgs); returns {key: tensor} of its own keys present."""
    mine = {prefix + n: state_dict[prefix + n] for n in names if prefix + n in state_dict}
    rest = {k: v for k, v in state_dict.items() if k not in mine} if mine else state_dict
    torch.nn.Module._load_from_state_dict(module, rest, prefix, *args)
    return mine


def _state_desc_of(t, name, length):
    """A description tensor's values (int64 [length], version first);
    ValueError for anything else or another version."""
    if not isinstance(t, torch.Tensor) or t.dtype != torch.int64 or tuple(t.shape) != (length,):
        raise ValueError(f"{name} is not an int64 tensor of {length}")
    got = [int(v) for v in t.tolist()]
    if got[0] != _STATE_VERSION:
        raise ValueError(f"{name} version {got[0]}; this nibble reads version {_STATE_VERSION}")
    return got


def _load_state_gate(where, check, mine, need, missing_keys, error_msgs):
    """What a state is before what it lacks (a state of another format or
    spec lacks or adds tensors): check() raises ValueError for a state of
    something else, then the keys of `need` absent from `mine` are missing.
    True where loading may go on."""
    try:
        check()
    except ValueError as e:
        error_msgs.append(f"{where}: {e}")
        return False
    gone = [k for k in need if k not in mine]
    missing_keys.extend(gone)
    return not gone


class Linear(torch.nn.Module):
    """nn.Linear with a quantized weight (4-bit, or int8): forward(x) =
    nibble::gemm(x, W, bias).

    Buffers: `packed` and `workspace` (uint8, the kernels' layout, not in
    the state_dict as such), and `perm` (int64 [k] or None) for a weight
    whose k was reordered (act-order GPTQ / compressed-tensors
    checkpoints): forward then multiplies x[..., perm].  `bias`, if any, is
    a frozen Parameter so that module.to(dtype) converts it; a bias whose
    dtype differs from x's is converted on the fly.  Inference only.

    state_dict(): the weight in its checkpoint layout (exactly the bytes it
    was packed from, nb_unpack_host), so that torch.save(model.state_dict())
    and load_state_dict() carry it across devices and nibble versions:
    weight_codes (uint8), weight_scales (uint8, float16, bfloat16 or
    float32 as the format keeps them), weight_zeros (formats with zero
    points), weight_tensor_scale (float32), weight_desc (int64: version,
    format, out_features, in_features, group, scale type) and perm (when the
    weight has one), beside bias.  load_state_dict() packs them again on the
    module's device (the CPU for a module on the meta device, e.g. from
    Linear.empty; pass assign=True there for the bias); the module must have
    the same format, shape, group and scale type (an error names both
    otherwise)."""

    def __init__(self, weight: PackedLinearWeight, bias: Optional[torch.Tensor] = None,
                 perm: Optional[torch.Tensor] = None):
        super().__init__()
        if not isinstance(weight, PackedLinearWeight):
            raise TypeError(f"nibble.torch: weight must be a PackedLinearWeight, got {type(weight).__name__}")
        self.in_features, self.out_features = weight.k, weight.n
        self.format = weight.format
        self.tensor_scale = weight.tensor_scale
        self.scale_exp_min, self.scale_exp_max = weight.scale_exp_min, weight.scale_exp_max
        self._format_code = int(_format_code(weight.format))
        self.group, self.scale_type = weight.group, weight.scale_type
        self._group_code = _group_code(weight.group)
        self._scale_code = _scale_code(weight.scale_type, Format(self._format_code))
        self.register_buffer("packed", weight.packed, persistent=False)
        self.register_buffer("workspace", weight.workspace, persistent=False)
        self.register_buffer("perm", _check_perm(perm, weight.k, weight.packed.device), persistent=False)
        if bias is not None:
            if bias.shape != (weight.n,):
                raise ValueError(f"nibble.torch: bias has shape {tuple(bias.shape)}; expected [{weight.n}]")
            # (a bias still on the meta device, as in a model being loaded, stays there until it is set)
            bias = torch.nn.Parameter(bias.detach() if bias.is_meta else bias.detach().to(weight.packed.device),
                                      requires_grad=False)
        self.bias = bias

    @classmethod
    def empty(cls, in_features, out_features, format="nvfp4", bias=False, group_size=None, scale_type=None,
              device="meta", dtype=torch.bfloat16):
        """A Linear with room for an out_features x in_features weight of
        `format` and no weight yet (zero bytes; on the meta device by
        default): the module load_state_dict() fills from a state_dict
        that Linear.state_dict() wrote.  bias: whether it has one (of
        dtype)."""
        fmt = _format_code(format)
        name = _FORMAT_NAMES[fmt]
        from . import weight_sizes
        sizes = weight_sizes(out_features, in_features, name, group_size, scale_type)
        dev = torch.device(device)
        packed = torch.zeros(sizes["packed_bytes"], dtype=torch.uint8, device=dev)
        ws = torch.empty(0, dtype=torch.uint8, device=dev)
        pw = PackedLinearWeight(packed=packed, workspace=ws, n=int(out_features), k=int(in_features), format=name,
                                tensor_scale=1.0, scale_exp_min=0, scale_exp_max=0,
                                group=int(group_size) if group_size else None,
                                scale_type=_scale_name(_scale_code(scale_type, fmt)))
        b = torch.zeros(int(out_features), dtype=dtype, device=dev) if bias else None
        lin = cls(pw, b)
        return lin._apply(lambda t: t) if dev.type == "cuda" else lin   # (a workspace sized for the GPU)

    def _state_desc(self):
        """weight_desc: version, format, out_features, in_features, group and
        scale type (the format's defaults written out, so that a default
        and its explicit value compare equal)."""
        info = _lib.FORMAT_INFO[Format(self._format_code)]
        return [_STATE_VERSION, self._format_code, self.out_features, self.in_features,
                self._group_code or info["group_size"], self._scale_code or info["scale_type"]]

    def _save_to_state_dict(self, destination, prefix, keep_vars):
        super()._save_to_state_dict(destination, prefix, keep_vars)
        if self.packed.is_meta or getattr(_state_off, "on", False):
            return  # (a module on the meta device has no weight to save)
        codes, scales, zeros = self.quantized_weight()._arrays()
        destination[prefix + "weight_codes"] = _state_tensor(codes)
        destination[prefix + "weight_scales"] = _state_tensor(scales)
        if zeros is not None:
            destination[prefix + "weight_zeros"] = _state_tensor(zeros)
        destination[prefix + "weight_tensor_scale"] = torch.tensor(float(self.tensor_scale), dtype=torch.float32)
        destination[prefix + "weight_desc"] = torch.tensor(self._state_desc(), dtype=torch.int64)
        if self.perm is not None:
            destination[prefix + "perm"] = self.perm.detach().to("cpu")

    def _load_from_state_dict(self, state_dict, prefix, local_metadata, strict, missing_keys, unexpected_keys,
                              error_msgs):
        mine = _load_state_begin(self, state_dict, prefix, _LINEAR_STATE,
                                 (local_metadata, strict, missing_keys, unexpected_keys, error_msgs))
        need = [prefix + n for n in ("weight_codes", "weight_scales", "weight_tensor_scale", "weight_desc")]
        if _lib.FORMAT_INFO[Format(self._format_code)]["zero_point"]:
            need.append(prefix + "weight_zeros")
        if self.perm is not None:
            need.append(prefix + "perm")
        if not mine:
            if strict and not self.packed.is_meta:
                missing_keys.extend(need)
            return
        where = f"nibble.torch.Linear {prefix[:-1] or '(root)'}"

        def say(d):
            try:
                fmt = _FORMAT_NAMES[Format(d[1])]
            except (ValueError, KeyError):
                fmt = f"format code {d[1]}"
            try:
                st = ScaleType(d[5]).name.lower()
            except ValueError:
                st = f"code {d[5]}"
            return f"{fmt}, out_features {d[2]}, in_features {d[3]}, group {d[4]}, scale type {st}"

        def check():
            if prefix + "weight_desc" in mine:
                got = _state_desc_of(mine[prefix + "weight_desc"], "weight_desc", 6)
                if got != self._state_desc():
                    raise ValueError(f"the state holds {say(got)}, the module {say(self._state_desc())}")

        if not _load_state_gate(where, check, mine, need, missing_keys, error_msgs):
            return
        try:
            ts = mine[prefix + "weight_tensor_scale"]
            if not isinstance(ts, torch.Tensor) or ts.numel() != 1:
                raise ValueError("weight_tensor_scale is not a one-element tensor")
            zeros = mine.get(prefix + "weight_zeros")
            qw = QuantizedWeight(codes=_state_array(mine[prefix + "weight_codes"], "weight_codes"),
                                 scales=_state_array(mine[prefix + "weight_scales"], "weight_scales"),
                                 tensor_scale=float(ts.reshape(()).item()), n=self.out_features, k=self.in_features,
                                 format=self.format, group=self.group, scale_type=self.scale_type,
                                 zeros=None if zeros is None else _state_array(zeros, "weight_zeros"))
            qw.desc()  # (the arrays' dtypes and shapes, before anything changes)
            perm = mine.get(prefix + "perm")
            perm = None if perm is None else _check_perm(perm, self.in_features, torch.device("cpu"))
            pw = pack(qw, self.packed.device if self.packed.is_cuda else "cpu")   # (meta: the CPU)
        except (TypeError, ValueError, Error) as e:
            error_msgs.append(f"{where}: {e}")
            return
        self.packed, self.workspace = pw.packed, pw.workspace
        self.tensor_scale, self.scale_exp_min, self.scale_exp_max = pw.tensor_scale, pw.scale_exp_min, pw.scale_exp_max
        self.perm = None if perm is None else perm.to(pw.packed.device)

    def _apply(self, fn, recurse=True):
        """module.to(), .cuda(), .cpu(): the packed bytes move as they are
        (nb_pack and nb_pack_host write the same bytes); the workspace is
        sized again for the new device (nb_gemm_workspace_size) and
        zero-filled, or emptied on the CPU."""
        super()._apply(fn, recurse)
        packed, ws = self.packed, self.workspace
        if packed.is_meta:
            return self
        if packed.device.type != "cuda":
            if ws.numel():
                self.workspace = torch.empty(0, dtype=torch.uint8, device=packed.device)
            return self
        d = _weight_desc(self.out_features, self.in_features, self._format_code, self.tensor_scale,
                         self.scale_exp_min, self.scale_exp_max, self._group_code, self._scale_code)
        idx = _device_index(packed.device)
        with _on_device(idx):
            need = _workspace_bytes(context(idx), d)
            if ws.device != packed.device or ws.numel() != need:
                self.workspace = torch.zeros(need, dtype=torch.uint8, device=packed.device)
        return self

    @classmethod
    def from_linear(cls, linear, format="nvfp4", scale_rule=None, device=None, method="rtn", group_size=None,
                    scale_type=None):
        """Quantize an nn.Linear (any float dtype and device) to a Linear on
        a CUDA device (default: linear's if CUDA, else the current one), as
        quantize() does (the device quantizer for an FP4 weight on a GPU,
        the host one for the integer formats)."""
        if not isinstance(linear, torch.nn.Linear):
            raise TypeError(f"nibble.torch: expected a torch.nn.Linear, got {type(linear).__name__}")
        w = quantize(linear.weight, format=format, scale_rule=scale_rule, device=device, method=method,
                     group_size=group_size, scale_type=scale_type)
        return cls(w, linear.bias)

    @classmethod
    def from_quantized(cls, qw, bias=None, device=None, perm=None):
        """A Linear from a nibble.QuantizedWeight (checkpoint layout; int4
        with its zero points), packed on a CUDA device (default: the current
        one), or on the host with device="cpu" (see pack()).  perm: the
        activation permutation of an act-order weight (Checkpoint.perm), or
        None."""
        return cls(pack(qw, device), bias, None if perm is None else torch.as_tensor(perm))

    @classmethod
    def from_hqq(cls, layer, device=None):
        """A Linear from an HQQ-quantized layer (hqq's HQQLinear, or its
        state_dict, encoded or not): its 4-bit codes, scales and zero points
        as an int4_hqq weight (hqq_weight), bit for bit, and its bias."""
        bias = layer.get("bias") if isinstance(layer, dict) else getattr(layer, "bias", None)
        return cls(pack(hqq_weight(layer), device), bias)

    @classmethod
    def from_checkpoint_tensors(cls, weight, weight_scale, weight_scale_2=None, bias=None, format=None,
                                device=None):
        """A Linear from a checkpoint's tensors for one layer, as ModelOpt
        (NVFP4) or Quark / compressed-tensors (MXFP4) store them:

          weight          uint8 [n, k/2] E2M1 codes, low nibble = even element
                          (compressed-tensors calls it weight_packed)
          weight_scale    [n, k/16] FP8 E4M3 (NVFP4) or [n, k/32] E8M0 (MXFP4)
                          block scales: uint8 bytes or a torch float8 tensor
          weight_scale_2  NVFP4 tensor scale (a float or a 1-element tensor);
                          compressed-tensors stores its reciprocal,
                          weight_global_scale: pass 1 / weight_global_scale.
                          None or 1 for MXFP4.
          bias            None or an [n] tensor

        numpy arrays or torch tensors on any device.  format ("nvfp4" or
        "mxfp4") is inferred from the number of scale columns when None.
        Shapes that do not fit together raise ValueError."""
        codes, scales = _byte_array(weight, "weight"), _byte_array(weight_scale, "weight_scale")
        if codes.ndim != 2 or scales.ndim != 2 or codes.shape[0] != scales.shape[0]:
            raise ValueError(f"nibble.torch: weight {codes.shape} and weight_scale {scales.shape} must be 2-D with "
                             "the same number of rows")
        n, k = codes.shape[0], codes.shape[1] * 2
        if format is None:
            by_group = {g: _FORMAT_NAMES[f] for f, g in _GROUP.items() if _fp4(f)}  # the FP4 rows' groups
            group = k // scales.shape[1] if scales.shape[1] and k % scales.shape[1] == 0 else 0
            if group not in by_group:
                kinds = " nor ".join(f"{name.upper()} (k/{g} scale columns)" for g, name in by_group.items())
                raise ValueError(f"nibble.torch: weight {codes.shape} (k = {k}) and weight_scale {scales.shape} "
                                 f"fit neither {kinds}")
            format = by_group[group]
        fmt = _format_code(format)
        if scales.shape[1] * _GROUP[fmt] != k:
            raise ValueError(f"nibble.torch: {_FORMAT_NAMES[fmt]} with weight {codes.shape} (k = {k}) needs "
                             f"weight_scale [{n}, {k // _GROUP[fmt]}], got {scales.shape}")
        ts = 1.0 if weight_scale_2 is None else _scalar(weight_scale_2, "weight_scale_2")
        name = _FORMAT_NAMES[fmt].upper()
        if not _lib.FORMAT_INFO[fmt]["tensor_scale"] and ts != 1.0:
            raise ValueError(f"nibble.torch: {name} has no tensor scale (weight_scale_2 = {ts})")
        if _lib.FORMAT_INFO[fmt]["tensor_scale"] and weight_scale_2 is None:
            raise ValueError(f"nibble.torch: {name} needs weight_scale_2 (the tensor scale)")
        qw = QuantizedWeight(codes=codes, scales=scales, tensor_scale=ts, n=n, k=k, format=_FORMAT_NAMES[fmt])
        return cls.from_quantized(qw, bias=bias, device=device)

    def quantized_weight(self):
        """The weight in the checkpoint layout (a nibble.QuantizedWeight in
        host memory: codes, block scales, tensor scale) that this module's
        packed bytes hold, by nb_unpack_host: exactly the bytes it was built
        from."""
        return unpack(self.weight)

    @property
    def weight(self):
        """The PackedLinearWeight this module runs."""
        return PackedLinearWeight(self.packed, self.workspace, self.out_features, self.in_features, self.format,
                                  self.tensor_scale, self.scale_exp_min, self.scale_exp_max, self.group,
                                  self.scale_type)

    def forward(self, x):
        bias = self.bias
        if bias is not None and bias.dtype != x.dtype:
            bias = bias.to(x.dtype)
        if self.perm is not None:
            x = x.index_select(-1, self.perm)
        return torch.ops.nibble.gemm(x, self.packed, self.workspace, bias, self.out_features, self.in_features,
                                     self._format_code, self.tensor_scale, self.scale_exp_min, self.scale_exp_max,
                                     self._group_code, self._scale_code)

    def extra_repr(self):
        extra = ""
        if self.group:
            extra += f", group={self.group}"
        if self.scale_type:
            extra += f", scale_type={self.scale_type}"
        if self.perm is not None:
            extra += ", act_order=True"
        return (f"in_features={self.in_features}, out_features={self.out_features}, bias={self.bias is not None}, "
                f"format={self.format}" + extra)


def _check_perm(perm, k, device):
    """An activation permutation as an int64 tensor on `device` (None stays
    None): ValueError unless it is a permutation of range(k)."""
    if perm is None:
        return None
    if not isinstance(perm, torch.Tensor) or perm.dim() != 1 or perm.shape[0] != k or perm.is_floating_point():
        raise ValueError(f"nibble.torch: perm must be a 1-D integer tensor of length k = {k}, got "
                         f"{tuple(perm.shape) if isinstance(perm, torch.Tensor) else type(perm).__name__}")
    if perm.is_meta:
        return torch.empty(k, dtype=torch.int64, device="meta")
    perm = perm.detach().to(torch.int64)
    if not torch.equal(torch.sort(perm.cpu()).values, torch.arange(k)):
        raise ValueError(f"nibble.torch: perm is not a permutation of 0 .. {k - 1}")
    return perm.to(device)


def _byte_array(a, what):
    """A checkpoint byte tensor (numpy or torch, uint8 or a float8 type) as a
    C-contiguous numpy uint8 array."""
    if isinstance(a, torch.Tensor):
        a = a.detach()
        if a.element_size() != 1 or a.dtype == torch.bool:
            raise TypeError(f"nibble.torch: {what} has dtype {a.dtype}; expected uint8 or a float8 type")
        if a.dtype != torch.uint8:
            a = a.view(torch.uint8)
        a = a.to("cpu").contiguous().numpy()
    elif isinstance(a, np.ndarray):
        if a.dtype.itemsize != 1 or a.dtype == np.bool_:
            raise TypeError(f"nibble.torch: {what} has dtype {a.dtype}; expected uint8 bytes")
        a = a.view(np.uint8)
    else:
        raise TypeError(f"nibble.torch: {what} must be a torch.Tensor or numpy array, got {type(a).__name__}")
    return np.ascontiguousarray(a)


def _scalar(v, what):
    if isinstance(v, (torch.Tensor, np.ndarray)):
        if (v.size if isinstance(v, np.ndarray) else v.numel()) == 1:
            return float(v.reshape(-1)[0])
        raise ValueError(f"nibble.torch: {what} must hold one value, got shape {tuple(v.shape)}")
    return float(v)


def _excluded(name, patterns):
    """fnmatch (case-sensitive) on the qualified name; a pattern also matches
    any dotted suffix, so "lm_head" excludes "lm_head" and "model.lm_head"."""
    return any(fnmatch.fnmatchcase(name, p) or fnmatch.fnmatchcase(name, "*." + p) for p in patterns)


def quantize_model(model, format="nvfp4", exclude=("lm_head",), scale_rule=None, device=None, threads=None,
                   return_weights=False, method="rtn", group_size=None, scale_type=None, fused_scales=True):
    """Replace, in place, every torch.nn.Linear of `model` whose qualified
    name matches no `exclude` pattern by a nibble.torch.Linear (quantized to
    `format` and packed on `device`, default: each layer's own CUDA device,
    else the current one), and every experts module of an MoE layer
    (transformers' GptOssExperts, Qwen3MoeExperts: E experts' weights in
    3-D tensors) by one MoeExperts (every expert quantized, then packed
    together for nibble::moe_mlp; the router stays).  Layers whose
    in_features (experts: hidden or intermediate size) is not a multiple of
    the format's group are left alone.

    format "int4" / "int4_sym" / "int8" take group_size (32, 64, 128; None:
    128) and scale_type ("f16", the default, or "bf16"), "nf4" / "bnb_fp4"
    group_size (32 .. 4096; None: 64); experts modules are left alone with them (no
    MoE kernel serves the integer or table formats) and listed under
    "skipped".

    FP4 weights on a GPU are quantized there by the device quantizer
    (nb_quantize, then nb_pack, on the current stream; nothing is copied to
    the host), layer by layer; the integer and table formats, which have
    no device quantizer, go through the host reference like CPU weights.
    Weights on the CPU go through the host reference, different layers on
    `threads` threads (default: the CPU
    count, at most 32; ctypes releases the GIL), bfloat16 ones as their
    16-bit patterns, and are packed on the GPU in layer order.  The bytes are
    the same either way.  method="mse" runs on the host for every layer
    (there is no device MSE quantizer yet), GPU weights being copied there.
    fused_scales (NVFP4): the layers engines run as one (a module's q_proj,
    k_proj, v_proj, and its gate_proj, up_proj) share one tensor scale, the
    one their rows quantized together get (amax / (6 x 448) over the group),
    as ModelOpt and `nibble quantize` write them, so fuse_projections can
    fuse them afterwards with nothing changed; False gives each layer its
    own.
    Returns {"quantized": [names], "skipped": {name: reason}}, plus
    "weights": {name: nibble.QuantizedWeight, or nibble.QuantizedMoe for
    experts} (checkpoint layout, host memory) when return_weights is true."""
    if not isinstance(model, torch.nn.Module):
        raise TypeError(f"nibble.torch: model must be a torch.nn.Module, got {type(model).__name__}")
    if isinstance(exclude, str):
        exclude = [exclude]
    fmt = _format_code(format)
    if _lib.FORMAT_INFO[fmt]["scale_type"] != ScaleType.E8M0 and scale_rule is not None:
        raise ValueError("nibble.torch: scale_rule applies to MXFP4 only")
    if scale_rule is not None:
        scale_rule = _rule_name(scale_rule, scale_rule)
    _quant_args(fmt, scale_rule, None, method)
    if not _fp4(fmt) and method != "rtn":
        raise ValueError(f"nibble.torch: method {method!r} serves nvfp4 and mxfp4 only")
    if group_size is not None and (isinstance(group_size, bool) or not isinstance(group_size, int)
                                   or group_size not in _lib.FORMAT_INFO[fmt]["group_sizes"]):
        raise ValueError(f"nibble.torch: {_FORMAT_NAMES[fmt]} takes group_size "
                         f"{' or '.join(map(str, _lib.FORMAT_INFO[fmt]['group_sizes']))} here, not {group_size!r}")
    if scale_type is not None:
        st = _scale_type(scale_type, fmt)
        if not _lib.FORMAT_INFO[fmt]["scale_types"] & (1 << int(st)):
            raise ValueError(f"nibble.torch: {_FORMAT_NAMES[fmt]} takes scale types "
                             f"{', '.join(_lib.FORMAT_INFO[fmt]['scale_type_names'])}, not {scale_type!r}")
    if threads is None:
        threads = min(32, os.cpu_count() or 1)
    if not isinstance(threads, int) or threads < 1:
        raise ValueError(f"nibble.torch: threads must be a positive integer, got {threads!r}")
    group = group_size or _GROUP[fmt]
    targets, skipped, moe_done = [], {}, []
    weights = {}
    # Experts modules first (GptOssExperts, Qwen3MoeExperts: 3-D weights, no
    # nn.Linear inside), each into one MoeExperts.
    expert_mods = [(name, mod) for name, mod in model.named_modules() if _expert_kind(mod) is not None]
    for name, mod in expert_mods:
        _, H, I = _expert_dims(mod)
        if not name:
            skipped[name] = "the model itself is an experts module (use MoeExperts.from_module)"
        elif _excluded(name, exclude):
            skipped[name] = "excluded"
        elif not _fp4(fmt):
            skipped[name] = f"no MoE kernel serves {_FORMAT_NAMES[fmt]} (nb_moe_mlp: nvfp4, mxfp4)"
        elif H % group or I % group:
            skipped[name] = f"hidden {H} or intermediate {I} is not a multiple of {group}"
        else:
            parent_name, _, child = name.rpartition(".")
            new = MoeExperts.from_module(mod, format=format, scale_rule=scale_rule, device=device, method=method)
            setattr(model.get_submodule(parent_name) if parent_name else model, child, new)
            moe_done.append(name)
            if return_weights:
                weights[name] = new.quantized_moe()
    for name, mod in model.named_modules():
        if not isinstance(mod, torch.nn.Linear):
            continue
        if not name:
            skipped[name] = "the model itself is an nn.Linear (use Linear.from_linear)"
        elif _excluded(name, exclude):
            skipped[name] = "excluded"
        elif mod.in_features % group:
            skipped[name] = f"in_features {mod.in_features} is not a multiple of {group}"
        else:
            _check_weight(mod.weight)
            targets.append(name)
    fname = _FORMAT_NAMES[fmt]
    shared = _group_tensor_scales(model, targets) if fused_scales and _lib.FORMAT_INFO[fmt]["tensor_scale"] else {}

    def on_gpu(w):
        return w.device.type == "cuda" and method == "rtn" and _fp4(fmt)

    def host_quantize(w, ts):
        return _np_quantize(_host_array(w), format=fname, scale_rule=scale_rule, method=method, group_size=group_size,
                            scale_type=scale_type, tensor_scale=ts)

    with ThreadPoolExecutor(max_workers=threads) as pool:
        futures = [(name, None if on_gpu(w) else pool.submit(host_quantize, w, shared.get(name)))
                   for name, w in ((name, model.get_submodule(name).weight) for name in targets)]
        for name, fut in futures:
            parent_name, _, child = name.rpartition(".")
            parent = model.get_submodule(parent_name) if parent_name else model
            old = getattr(parent, child)
            dev = device if device is not None else (old.weight.device if old.weight.device.type == "cuda" else None)
            if fut is None:   # the device quantizer
                w = old.weight.detach().to(torch.device("cuda", _device_index(dev)))
                codes, scales, d = _quantize_device(w, fmt, scale_rule, shared.get(name))
                del w
                new = Linear(_pack_device(codes, scales, None, d, fname), old.bias)
                if return_weights:
                    weights[name] = QuantizedWeight(codes=codes.cpu().numpy(), scales=scales.cpu().numpy(),
                                                    tensor_scale=float(d.tensor_scale), n=int(d.n), k=int(d.k),
                                                    format=fname, scale_rule=_rule_name(
                                                        _lib.MxScaleRule(d.scale_rule), None))
                del codes, scales
            else:
                qw = fut.result()
                new = Linear.from_quantized(qw, old.bias, device=dev)
                if return_weights:
                    weights[name] = qw
            setattr(parent, child, new)
            del old
    out = {"quantized": moe_done + targets, "skipped": skipped}
    if return_weights:
        out["weights"] = weights
    return out


def _fused_group_key(name):
    """(module, group index) of a layer the engines fuse with its siblings
    (a member of nibble.fuse.DEFAULT_GROUPS, qualified by its module), or
    None."""
    from .fuse import DEFAULT_GROUPS
    parent, _, member = name.rpartition(".")
    for g, (_, members) in enumerate(DEFAULT_GROUPS):
        if member in members:
            return parent, g
    return None


def _shared_tensor_scale(weights):
    """The NVFP4 tensor scale of the rows of `weights` quantized as one: the
    largest finite magnitude over them divided by E2M1's largest value times
    E4M3's (6 x 448) in float32, the expression the quantizer applies to one
    weight's amax (formats.c; a non-finite element fails the quantization
    itself)."""
    amax = np.float32(0.0)
    for w in weights:
        a = w.detach().float().abs()
        a = a[torch.isfinite(a)]
        if a.numel():
            amax = max(amax, np.float32(a.max().item()))
    return float(np.float32(amax) / np.float32(6.0 * 448.0))


def _group_tensor_scales(model, targets):
    """{layer name: NVFP4 tensor scale} for the quantized members of every
    group of projections engines fuse (within one module): the group's
    _shared_tensor_scale; members of no group are not listed (the quantizer
    computes their own)."""
    groups = {}
    for name in targets:
        key = _fused_group_key(name)
        if key is not None:
            groups.setdefault(key, []).append(name)
    out = {}
    for names in groups.values():
        ts = _shared_tensor_scale([model.get_submodule(n).weight for n in names])
        out.update({n: ts for n in names})
    return out


# ------------------------------------------------------ mixture of experts
# nb_moe_mlp runs a whole MoE MLP (E experts' gate_up, activation, down and
# the weighted combine over each token's top-k experts) in four or five launches on
# the current stream, none per expert and nothing read back to the host.
# The router stays the model's: only the experts' computation is replaced.

_MOE_DTYPES = {torch.bfloat16: DType.BF16, torch.float16: DType.F16, torch.float32: DType.F32}


@dataclass
class PackedMoeWeights:
    """E experts' weights in the MoE kernels' layout (nb_moe_pack_host), on
    a CUDA device or waiting in host memory.

    spec            nibble.MoeSpec: format, experts, hidden, intermediate,
                    activation, gate_up_layout, limit, alpha
    gate_up, down   uint8 tensors, every expert's packed bytes
    gate_up_scales, down_scales  float32 [E] per-expert tensor scales (NVFP4),
                    None for MXFP4
    gate_up_exp, down_exp  the MXFP4 scale exponent ranges nb_moe_pack_host
                    found ((-1, -1) for NVFP4)"""
    spec: MoeSpec
    gate_up: torch.Tensor
    down: torch.Tensor
    gate_up_scales: Optional[torch.Tensor]
    down_scales: Optional[torch.Tensor]
    gate_up_exp: tuple
    down_exp: tuple

    @property
    def device(self):
        return self.gate_up.device

    def op_args(self):
        """The descriptor as nibble::moe_mlp's trailing arguments."""
        s = self.spec
        return (int(_format_code(s.format)), s.experts, s.hidden, s.intermediate, int(ACTIVATIONS[s.activation]),
                int(GATE_UP_LAYOUTS[s.gate_up_layout]), s.limit, s.alpha, *self.gate_up_exp, *self.down_exp)


def pack_moe(qm, device=None):
    """Pack a nibble.QuantizedMoe (checkpoint layout, host memory) for
    nb_moe_mlp: nb_moe_pack_host on the host (there is no device packer
    for MoE weights yet), then the bytes and tensor scales are copied to
    `device` (default: the current CUDA device; "cpu" keeps them in host
    memory, where nibble::moe_mlp runs the host reference).  Biases are not
    part of it (MoeExperts holds them)."""
    from .moe import moe_pack
    pm = moe_pack(qm)
    dev = torch.device("cpu") if _is_cpu(device) else torch.device("cuda", _device_index(device))

    def put(a):
        return None if a is None else torch.from_numpy(a).to(dev)
    return PackedMoeWeights(spec=pm.spec, gate_up=put(pm.gate_up), down=put(pm.down),
                            gate_up_scales=put(pm.gate_up_scales), down_scales=put(pm.down_scales),
                            gate_up_exp=pm.gate_up_exp, down_exp=pm.down_exp)


def _packed_moe_host(spec, gate_up, down, gate_up_scales, down_scales, gate_up_exp, down_exp):
    """A nibble.PackedMoe (numpy, host) over tensors on any device."""
    from .moe import PackedMoe

    def host(t):
        return None if t is None else t.detach().to("cpu").contiguous().numpy()
    return PackedMoe(spec=spec, gate_up=host(gate_up), down=host(down), gate_up_scales=host(gate_up_scales),
                     down_scales=host(down_scales), gate_up_exp=tuple(gate_up_exp), down_exp=tuple(down_exp))


def unpack_moe(weights):
    """The checkpoint layout (a nibble.QuantizedMoe in host memory, no
    biases) of a PackedMoeWeights on any device: exactly the bytes that were
    packed (nb_unpack_host per expert)."""
    from .moe import moe_unpack
    if not isinstance(weights, PackedMoeWeights):
        raise TypeError(f"nibble.torch: expected a PackedMoeWeights, got {type(weights).__name__}")
    if weights.gate_up.is_meta:
        raise ValueError("nibble.torch: the MoE weights are on the meta device (no bytes to unpack)")
    return moe_unpack(_packed_moe_host(weights.spec, weights.gate_up, weights.down, weights.gate_up_scales,
                                       weights.down_scales, weights.gate_up_exp, weights.down_exp))


_moe_desc_cache = {}


def _moe_desc(fmt, experts, hidden, inter, activation, layout, limit, alpha, gu_exp, dn_exp, m, top_k, dt, packed):
    """An nb_moe_desc for the op (the m-independent part cached; each call
    gets its own copy with m and top_k set).  Validated by the C call."""
    key = (fmt, experts, hidden, inter, activation, layout, limit, alpha, gu_exp, dn_exp, dt, packed)
    base = _moe_desc_cache.get(key)
    if base is None:
        base = _lib.MoeDesc()
        _lib.check(_lib.lib.nb_moe_desc_init(ctypes.byref(base), fmt, 1, experts, 1, hidden, inter, activation, dt))
        base.gate_up_layout, base.limit, base.alpha = layout, limit, alpha
        if packed:
            base.gate_up.layout = base.down.layout = Layout.PACKED
            base.gate_up.scale_exp_min, base.gate_up.scale_exp_max = gu_exp
            base.down.scale_exp_min, base.down.scale_exp_max = dn_exp
        if len(_moe_desc_cache) > 1024:
            _moe_desc_cache.clear()
        _moe_desc_cache[key] = base
    d = _lib.MoeDesc.from_buffer_copy(base)
    d.m, d.top_k = m, top_k
    return d


def _moe_packed_bytes(fmt, experts, hidden, inter, activation, layout, limit, alpha):
    d = _moe_desc(fmt, experts, hidden, inter, activation, layout, limit, alpha, (-1, -1), (-1, -1), 1, 1,
                  DType.BF16, False)
    s = _lib.MoePackedSizes()
    _lib.check(_lib.lib.nb_moe_packed_get_sizes(ctypes.byref(d), ctypes.byref(s)))
    return s.gate_up_bytes, s.down_bytes


def _check_moe_args(x, ids, wts, gate_up, down, gu_scales, dn_scales, gu_bias, dn_bias, fmt, experts, hidden,
                    inter, activation, layout, limit, alpha, fake):
    """Type, dtype and shape checks of nibble::moe_mlp (device checks only
    in the real implementation: fake tensors may be meta)."""
    if not isinstance(x, torch.Tensor):
        raise TypeError(f"nibble.torch: x must be a torch.Tensor, got {type(x).__name__}")
    if x.dtype not in _MOE_DTYPES:
        raise TypeError(f"nibble.torch: x has dtype {x.dtype}; expected torch.bfloat16 or torch.float16 (and "
                        "torch.float32 on the CPU)")
    if fmt not in _lib.FORMAT_INFO:
        raise ValueError(f"nibble.torch: unknown format code {fmt}")
    if activation not in ACTIVATIONS.values() or layout not in GATE_UP_LAYOUTS.values():
        raise ValueError(f"nibble.torch: activation {activation} / gate_up_layout {layout} unknown")
    if x.dim() != 2 or x.shape[1] != hidden:
        raise ValueError(f"nibble.torch: x has shape {tuple(x.shape)}; expected [tokens, hidden = {hidden}]")
    m = x.shape[0]
    if ids.dtype != torch.int32 or ids.dim() != 2 or ids.shape[0] != m or ids.shape[1] < 1:
        raise ValueError(f"nibble.torch: topk_ids must be int32 [tokens = {m}, top_k], got {ids.dtype} "
                         f"{tuple(ids.shape)}")
    if wts.dtype != torch.float32 or tuple(wts.shape) != tuple(ids.shape):
        raise ValueError(f"nibble.torch: topk_weights must be float32 of topk_ids' shape {tuple(ids.shape)}, got "
                         f"{wts.dtype} {tuple(wts.shape)}")
    if ids.shape[1] > experts:
        raise ValueError(f"nibble.torch: top_k = {ids.shape[1]} is larger than experts = {experts}")
    gu_bytes, dn_bytes = _moe_packed_bytes(fmt, experts, hidden, inter, activation, layout, limit, alpha)
    for name, t, want in (("gate_up", gate_up, gu_bytes), ("down", down, dn_bytes)):
        if t.dtype != torch.uint8 or t.dim() != 1 or t.shape[0] != want:
            raise ValueError(f"nibble.torch: {name} must be the packed uint8 bytes ({want}, from pack_moe), got "
                             f"{t.dtype} {tuple(t.shape)}")
    has_ts = _lib.FORMAT_INFO[fmt]["tensor_scale"]
    for name, t in (("gate_up_scales", gu_scales), ("down_scales", dn_scales)):
        if has_ts and (t is None or t.dtype != torch.float32 or tuple(t.shape) != (experts,)):
            raise ValueError(f"nibble.torch: {name} must be float32 [{experts}] ({_FORMAT_NAMES[Format(fmt)]} has "
                             "a tensor scale per expert)")
        if not has_ts and t is not None:
            raise ValueError(f"nibble.torch: {_FORMAT_NAMES[Format(fmt)]} has no tensor scale; {name} must be None")
    for name, t, shape in (("gate_up_bias", gu_bias, (experts, 2 * inter)), ("down_bias", dn_bias, (experts, hidden))):
        if t is not None and (t.dtype != x.dtype or tuple(t.shape) != shape):
            raise ValueError(f"nibble.torch: {name} must be {x.dtype} {list(shape)} (x's dtype), got {t.dtype} "
                             f"{tuple(t.shape)}")
    if not fake:
        tensors = [t for t in (x, ids, wts, gate_up, down, gu_scales, dn_scales, gu_bias, dn_bias) if t is not None]
        devs = {t.device for t in tensors}
        if len(devs) != 1:
            raise ValueError(f"nibble.torch: the MoE op's tensors must be on one device, got "
                             f"{sorted(str(d) for d in devs)}")
        if x.device.type not in ("cuda", "cpu"):
            raise ValueError(f"nibble.torch: x is on {x.device}; the MoE op runs on CUDA devices (nb_moe_mlp) and "
                             "on the CPU (the host reference)")
        if x.device.type == "cuda" and x.dtype == torch.float32:
            raise TypeError("nibble.torch: x is float32; the MoE kernels take bfloat16 or float16 (float32 runs on "
                            "the CPU only)")


def _contiguous16(t):
    """t itself when it is contiguous and 16-byte aligned, else a copy."""
    if t is None:
        return None
    return t if t.is_contiguous() and t.data_ptr() % 16 == 0 else t.clone(memory_format=torch.contiguous_format)


@torch.library.custom_op("nibble::moe_mlp", mutates_args=())
def _moe_op(x: torch.Tensor, topk_ids: torch.Tensor, topk_weights: torch.Tensor, gate_up: torch.Tensor,
            down: torch.Tensor, gate_up_scales: Optional[torch.Tensor], down_scales: Optional[torch.Tensor],
            gate_up_bias: Optional[torch.Tensor], down_bias: Optional[torch.Tensor], format: int, experts: int,
            hidden: int, intermediate: int, activation: int, gate_up_layout: int, limit: float, alpha: float,
            gate_up_exp_min: int, gate_up_exp_max: int, down_exp_min: int, down_exp_max: int) -> torch.Tensor:
    _check_moe_args(x, topk_ids, topk_weights, gate_up, down, gate_up_scales, down_scales, gate_up_bias, down_bias,
                    format, experts, hidden, intermediate, activation, gate_up_layout, limit, alpha, fake=False)
    m, top_k = topk_ids.shape
    if m == 0:
        return x.new_empty((0, hidden))
    gu_exp, dn_exp = (gate_up_exp_min, gate_up_exp_max), (down_exp_min, down_exp_max)
    if x.device.type == "cpu":
        return _moe_host(x, topk_ids, topk_weights, gate_up, down, gate_up_scales, down_scales, gate_up_bias,
                         down_bias, format, experts, hidden, intermediate, activation, gate_up_layout, limit, alpha,
                         gu_exp, dn_exp)
    x, topk_ids, topk_weights, gate_up_bias, down_bias = (_contiguous16(t) for t in (x, topk_ids, topk_weights,
                                                                                     gate_up_bias, down_bias))
    d = _moe_desc(format, experts, hidden, intermediate, activation, gate_up_layout, limit, alpha, gu_exp, dn_exp, m,
                  top_k, _DTYPES[x.dtype], True)
    idx = x.device.index
    ctx = context(idx)
    y = torch.empty((m, hidden), dtype=x.dtype, device=x.device)
    with _on_device(idx):
        ws_bytes = ctypes.c_size_t(0)
        ctx.check(_lib.lib.nb_moe_workspace_size(ctx.ptr, ctypes.byref(d), ctypes.byref(ws_bytes)))
        # The workspace (routing layout, per-slot h and o) grows with m, so it
        # comes from torch's caching allocator per call (graph-safe), not
        # from the module; nb_moe_mlp writes all of it before reading.
        ws = torch.empty(max(ws_bytes.value, 1), dtype=torch.uint8, device=x.device)

        def p(t):
            return t.data_ptr() if t is not None else None
        w = _lib.MoePackedWeights(gate_up=p(gate_up), down=p(down), gate_up_scales=p(gate_up_scales),
                                  down_scales=p(down_scales), gate_up_bias=p(gate_up_bias), down_bias=p(down_bias))
        stream = torch.cuda.current_stream(x.device).cuda_stream
        ctx.check(_lib.lib.nb_moe_mlp(ctx.ptr, ctypes.byref(d), ctypes.c_void_p(x.data_ptr()), ctypes.byref(w),
                                      ctypes.c_void_p(topk_ids.data_ptr()), ctypes.c_void_p(topk_weights.data_ptr()),
                                      ctypes.c_void_p(y.data_ptr()), ctypes.c_void_p(ws.data_ptr()), ws.numel(),
                                      ctypes.c_void_p(stream)))
    return y


def _moe_host(x, ids, wts, gate_up, down, gu_scales, dn_scales, gu_bias, dn_bias, fmt, experts, hidden, inter,
              activation, layout, limit, alpha, gu_exp, dn_exp):
    """nibble::moe_mlp on the CPU: the packed bytes unpacked (nb_unpack_host)
    and the host reference nb_moe_mlp_host run on them - the arithmetic the
    kernels are held to, for checking, not for speed."""
    from .moe import moe_reference, moe_unpack
    names = {v: k for k, v in ACTIVATIONS.items()}, {v: k for k, v in GATE_UP_LAYOUTS.items()}
    oai = activation == ACTIVATIONS["swiglu_oai"]
    spec = MoeSpec(_FORMAT_NAMES[Format(fmt)], experts, hidden, inter, names[0][activation], names[1][layout],
                   limit if oai else None, alpha if oai else None)
    qm = moe_unpack(_packed_moe_host(spec, gate_up, down, gu_scales, dn_scales, gu_exp, dn_exp))
    qm.gate_up_bias, qm.down_bias = (None if t is None else _host_np(t) for t in (gu_bias, dn_bias))
    return _torch_of_np(moe_reference(_host_np(x), ids.numpy(), wts.numpy(), qm), x.dtype)


@_moe_op.register_fake
def _moe_fake(x, topk_ids, topk_weights, gate_up, down, gate_up_scales, down_scales, gate_up_bias, down_bias, format,
              experts, hidden, intermediate, activation, gate_up_layout, limit, alpha, gate_up_exp_min,
              gate_up_exp_max, down_exp_min, down_exp_max):
    _check_moe_args(x, topk_ids, topk_weights, gate_up, down, gate_up_scales, down_scales, gate_up_bias, down_bias,
                    format, experts, hidden, intermediate, activation, gate_up_layout, limit, alpha, fake=True)
    return x.new_empty((x.shape[0], hidden))


def moe(x, topk_ids, topk_weights, weights, gate_up_bias=None, down_bias=None):
    """y [..., H] = the MoE MLP of x [..., H] (nibble::moe_mlp).

    topk_ids [..., top_k] (any integer dtype: converted to int32) and
    topk_weights [..., top_k] (any float dtype: converted to float32) are the
    router's choice, used as given; weights a PackedMoeWeights on x's device;
    gate_up_bias [E, 2I] and down_bias [E, H] optional (converted to x's
    dtype).  On a CUDA device: nb_moe_mlp on the current stream (bfloat16 or
    float16; no host synchronization, capturable in CUDA graphs; routing
    data is not checked there: an id outside [0, E) contributes 0).  On the
    CPU: the host reference (bfloat16, float16 or float32; routing checked,
    nibble.Error naming the token and slot)."""
    if not isinstance(weights, PackedMoeWeights):
        raise TypeError(f"nibble.torch: weights must be a PackedMoeWeights, got {type(weights).__name__}")
    if not isinstance(x, torch.Tensor) or not isinstance(topk_ids, torch.Tensor) \
            or not isinstance(topk_weights, torch.Tensor):
        raise TypeError("nibble.torch: x, topk_ids and topk_weights must be torch.Tensors")
    H = weights.spec.hidden
    if x.dim() < 1 or x.shape[-1] != H:
        raise ValueError(f"nibble.torch: x has shape {tuple(x.shape)}; expected [..., hidden = {H}]")
    if topk_ids.is_floating_point() or topk_ids.is_complex() or not topk_weights.is_floating_point():
        raise TypeError(f"nibble.torch: topk_ids must be integers and topk_weights floats, got {topk_ids.dtype} and "
                        f"{topk_weights.dtype}")
    lead = x.shape[:-1]
    x2 = x.reshape(-1, H)
    ids = topk_ids.reshape(x2.shape[0], -1).to(torch.int32)
    wts = topk_weights.reshape(x2.shape[0], -1).to(torch.float32)
    gub = gate_up_bias.to(x.dtype) if gate_up_bias is not None else None
    dnb = down_bias.to(x.dtype) if down_bias is not None else None
    y = torch.ops.nibble.moe_mlp(x2, ids, wts, weights.gate_up, weights.down, weights.gate_up_scales,
                                 weights.down_scales, gub, dnb, *weights.op_args())
    return y.reshape(*lead, H)


def _expert_kind(mod):
    """How a transformers experts module stores its weights, or None for a
    module that is not one nibble replaces:
      gpt-oss (GptOssExperts): gate_up_proj [E, H, 2I] (in x out, rows of
        the transpose interleaved), down_proj [E, I, H], gate_up_proj_bias
        [E, 2I], down_proj_bias [E, H], alpha and limit: swiglu_oai;
      fused SwiGLU experts (Qwen3MoeExperts and the other transformers 5
        experts with gate_up_proj [E, 2I, H] concatenated, down_proj [E, H,
        I], a SiLU act_fn, no bias).
    Returns (activation, transposed, has_bias, limit, alpha)."""
    gu, dn = getattr(mod, "gate_up_proj", None), getattr(mod, "down_proj", None)
    if not isinstance(gu, torch.Tensor) or not isinstance(dn, torch.Tensor) or gu.dim() != 3 or dn.dim() != 3:
        return None
    if all(hasattr(mod, a) for a in ("gate_up_proj_bias", "down_proj_bias", "alpha", "limit")) \
            and not getattr(mod, "is_concatenated", False):
        return ("swiglu_oai", True, True, float(mod.limit), float(mod.alpha))
    if _is_silu(getattr(mod, "act_fn", None)) and not getattr(mod, "is_transposed", False) \
            and getattr(mod, "is_concatenated", True) and not getattr(mod, "has_bias", False) \
            and getattr(mod, "has_gate", True):
        return ("swiglu", False, False, None, None)
    return None


def _expert_dims(mod):
    """(E, H, I) of an experts module (a transformers one or a MoeExperts)."""
    if isinstance(mod, MoeExperts):
        return mod.num_experts, mod.hidden_dim, mod.intermediate_dim
    gu = mod.gate_up_proj
    if _expert_kind(mod)[1]:   # gpt-oss: [E, H, 2I]
        return gu.shape[0], gu.shape[1], gu.shape[2] // 2
    return gu.shape[0], gu.shape[2], gu.shape[1] // 2


def _is_silu(act):
    """act computes silu (torch's SiLU, transformers' SiLUActivation, ...):
    asked of the function itself on a few values, not of its class name."""
    if not callable(act):
        return False
    t = torch.linspace(-8, 8, 33)
    try:
        return torch.equal(act(t), torch.nn.functional.silu(t))
    except Exception:  # noqa: BLE001 - any failure means it is not a plain silu
        return False


class MoeExperts(torch.nn.Module):
    """The experts of an MoE layer with 4-bit weights: forward(hidden_states
    [T, H], top_k_index [T, top_k], top_k_weights [T, top_k]) = nibble::moe_mlp
    (the signature of transformers' experts modules, whose router stays in
    place).  Replaces gpt-oss's GptOssExperts (swiglu_oai, interleaved
    gate_up, biases) and Qwen3-MoE's Qwen3MoeExperts (SwiGLU, concatenated).

    Buffers (not in the state_dict as such): gate_up_packed, down_packed
    (uint8) and, for NVFP4, gate_up_scales_bits, down_scales_bits (the
    float32 [E] tensor scales as int32 bits, so that module.to(dtype) leaves
    them exact).  Parameters (frozen; module.to(dtype) converts them):
    gate_up_proj_bias [E, 2I] and down_proj_bias [E, H] when the experts
    have biases (gpt-oss's names, so a loader fills them by name).
    Inference only.

    state_dict(): the experts in the checkpoint layout (exactly the packed
    bytes), as Linear's: gate_up_codes / down_codes (uint8 [E, n, k/2]),
    gate_up_scales / down_scales (uint8 [E, n, k/group]),
    gate_up_tensor_scales / down_tensor_scales (float32 [E], NVFP4),
    moe_desc (int64: version, format, experts, hidden, intermediate,
    activation, gate_up layout) and moe_limits (float32: limit, alpha),
    beside the biases; load_state_dict() packs them again (nb_moe_pack_host)
    for the module's device (the CPU for one on the meta device, e.g. from
    MoeExperts.empty), into a module of the same spec only."""

    def __init__(self, weights, gate_up_bias=None, down_bias=None):
        super().__init__()
        if not isinstance(weights, PackedMoeWeights):
            raise TypeError(f"nibble.torch: weights must be a PackedMoeWeights, got {type(weights).__name__}")
        s = self.spec = weights.spec
        self.num_experts, self.hidden_dim, self.intermediate_dim = s.experts, s.hidden, s.intermediate
        self.format = s.format
        self.gate_up_exp, self.down_exp = tuple(weights.gate_up_exp), tuple(weights.down_exp)
        self.register_buffer("gate_up_packed", weights.gate_up, persistent=False)
        self.register_buffer("down_packed", weights.down, persistent=False)
        # the tensor scales as their int32 bit patterns: module.to(dtype)
        # converts floating-point buffers, and a rounded scale would change
        # every weight of the expert
        for name in ("gate_up_scales", "down_scales"):
            t = getattr(weights, name)
            self.register_buffer(name + "_bits", None if t is None else t.view(torch.int32), persistent=False)
        dev = weights.gate_up.device
        for name, b, shape in (("gate_up_proj_bias", gate_up_bias, (s.experts, 2 * s.intermediate)),
                               ("down_proj_bias", down_bias, (s.experts, s.hidden))):
            if b is not None:
                if not isinstance(b, torch.Tensor) or tuple(b.shape) != shape:
                    raise ValueError(f"nibble.torch: {name} must be a tensor of shape {list(shape)}, got "
                                     f"{tuple(b.shape) if isinstance(b, torch.Tensor) else type(b).__name__}")
                b = torch.nn.Parameter(b.detach() if b.is_meta else b.detach().to(dev), requires_grad=False)
            setattr(self, name, b)

    @classmethod
    def empty(cls, spec, bias=False, device="meta", dtype=torch.bfloat16):
        """A MoeExperts with room for the experts of `spec` (a nibble.MoeSpec)
        and no weights yet (zero bytes; on the meta device by default), for
        load_state_dict() to fill.  bias: whether it has gate_up and down
        biases (of dtype)."""
        from .moe import MoeSpec, packed_sizes
        if not isinstance(spec, MoeSpec):
            raise TypeError(f"nibble.torch: spec must be a nibble.MoeSpec, got {type(spec).__name__}")
        sizes = packed_sizes(spec)
        dev = torch.device(device)
        ts = torch.zeros(spec.experts, dtype=torch.float32, device=dev) if spec.has_tensor_scale else None
        pw = PackedMoeWeights(spec=spec, gate_up=torch.zeros(sizes["gate_up_bytes"], dtype=torch.uint8, device=dev),
                              down=torch.zeros(sizes["down_bytes"], dtype=torch.uint8, device=dev),
                              gate_up_scales=ts, down_scales=None if ts is None else ts.clone(),
                              gate_up_exp=(-1, -1), down_exp=(-1, -1))
        b = [None, None]
        if bias:
            b = [torch.zeros(shape, dtype=dtype, device=dev)
                 for shape in ((spec.experts, 2 * spec.intermediate), (spec.experts, spec.hidden))]
        return cls(pw, *b)

    def _state_desc(self):
        s = self.spec
        return [_STATE_VERSION, int(_format_code(s.format)), s.experts, s.hidden, s.intermediate,
                int(ACTIVATIONS[s.activation]), int(GATE_UP_LAYOUTS[s.gate_up_layout])]

    def _save_to_state_dict(self, destination, prefix, keep_vars):
        super()._save_to_state_dict(destination, prefix, keep_vars)
        if self.gate_up_packed.is_meta or getattr(_state_off, "on", False):
            return
        qm = unpack_moe(self.weights)
        for name, qe in (("gate_up", qm.gate_up), ("down", qm.down)):
            destination[prefix + name + "_codes"] = _state_tensor(qe.codes)
            destination[prefix + name + "_scales"] = _state_tensor(qe.scales)
            if qe.tensor_scales is not None:
                destination[prefix + name + "_tensor_scales"] = _state_tensor(
                    np.asarray(qe.tensor_scales, dtype=np.float32))
        destination[prefix + "moe_desc"] = torch.tensor(self._state_desc(), dtype=torch.int64)
        destination[prefix + "moe_limits"] = torch.tensor([self.spec.limit, self.spec.alpha], dtype=torch.float32)

    def _load_from_state_dict(self, state_dict, prefix, local_metadata, strict, missing_keys, unexpected_keys,
                              error_msgs):
        mine = _load_state_begin(self, state_dict, prefix, _MOE_STATE,
                                 (local_metadata, strict, missing_keys, unexpected_keys, error_msgs))
        s, tsc = self.spec, self.spec.has_tensor_scale
        need = [prefix + n for n in _MOE_STATE if tsc or not n.endswith("_tensor_scales")]
        if not mine:
            if strict and not self.gate_up_packed.is_meta:
                missing_keys.extend(need)
            return
        where = f"nibble.torch.MoeExperts {prefix[:-1] or '(root)'}"

        def check():
            if prefix + "moe_desc" in mine:
                got = _state_desc_of(mine[prefix + "moe_desc"], "moe_desc", 7)
                if got != self._state_desc():
                    raise ValueError(f"the state holds (format, experts, hidden, intermediate, activation, layout) "
                                     f"{got[1:]}, the module {self._state_desc()[1:]} ({s.format}, {s.activation}, "
                                     f"{s.gate_up_layout})")
            lim = mine.get(prefix + "moe_limits")
            if lim is not None:
                if not isinstance(lim, torch.Tensor) or lim.dtype != torch.float32 or tuple(lim.shape) != (2,):
                    raise ValueError("moe_limits is not a float32 tensor of 2")
                if lim.tolist() != torch.tensor([s.limit, s.alpha]).tolist():
                    raise ValueError(f"the state holds limit / alpha {lim.tolist()}, the module "
                                     f"{[s.limit, s.alpha]}")

        if not _load_state_gate(where, check, mine, need, missing_keys, error_msgs):
            return
        try:
            from .moe import QuantizedMoe, QuantizedExperts
            proj = {}
            for name, n, k in (("gate_up", 2 * s.intermediate, s.hidden), ("down", s.hidden, s.intermediate)):
                ts = None
                if tsc:
                    ts = _state_array(mine[prefix + name + "_tensor_scales"], name + "_tensor_scales")
                    if ts.dtype != np.float32:
                        raise TypeError(f"{name}_tensor_scales has dtype {ts.dtype}; expected float32")
                proj[name] = QuantizedExperts(codes=_state_array(mine[prefix + name + "_codes"], name + "_codes"),
                                              scales=_state_array(mine[prefix + name + "_scales"], name + "_scales"),
                                              tensor_scales=ts, n=n, k=k, format=s.format)
            qm = QuantizedMoe(proj["gate_up"], proj["down"], activation=s.activation, gate_up_layout=s.gate_up_layout,
                              limit=s.limit if s.activation == "swiglu_oai" else None,
                              alpha=s.alpha if s.activation == "swiglu_oai" else None)
            if qm.spec != s:
                raise ValueError(f"the tensors make {qm.spec}, the module is {s}")
            w = pack_moe(qm, self.gate_up_packed.device if self.gate_up_packed.is_cuda else "cpu")   # (meta: the CPU)
        except (TypeError, ValueError, Error) as e:
            error_msgs.append(f"{where}: {e}")
            return
        self.gate_up_packed, self.down_packed = w.gate_up, w.down
        self.gate_up_scales_bits = None if w.gate_up_scales is None else w.gate_up_scales.view(torch.int32)
        self.down_scales_bits = None if w.down_scales is None else w.down_scales.view(torch.int32)
        self.gate_up_exp, self.down_exp = tuple(w.gate_up_exp), tuple(w.down_exp)

    @property
    def weights(self):
        """The PackedMoeWeights this module runs."""
        scales = [None if t is None else t.view(torch.float32) for t in (self.gate_up_scales_bits,
                                                                          self.down_scales_bits)]
        return PackedMoeWeights(self.spec, self.gate_up_packed, self.down_packed, *scales, self.gate_up_exp,
                                self.down_exp)

    def forward(self, hidden_states, top_k_index, top_k_weights):
        return moe(hidden_states, top_k_index, top_k_weights, self.weights, self.gate_up_proj_bias,
                   self.down_proj_bias)

    def quantized_moe(self):
        """The weights in the checkpoint layout (a nibble.QuantizedMoe in host
        memory, biases included as float32): exactly the packed bytes."""
        qm = unpack_moe(self.weights)
        for name in ("gate_up_proj_bias", "down_proj_bias"):
            b = getattr(self, name)
            setattr(qm, name.replace("_proj", ""), None if b is None else b.detach().float().cpu().numpy())
        return qm

    @classmethod
    def from_quantized(cls, qm, device=None, dtype=torch.bfloat16):
        """A MoeExperts from a nibble.QuantizedMoe (its biases, numpy of any
        float dtype or BF16 bits as uint16, become `dtype` parameters),
        packed for `device` (default: the current CUDA device; "cpu": host
        memory, the host reference)."""
        w = pack_moe(qm, device)
        return cls(w, *(_np_float_tensor(b, dtype) for b in (qm.gate_up_bias, qm.down_bias)))

    @classmethod
    def from_module(cls, mod, format="nvfp4", scale_rule=None, device=None, method="rtn"):
        """Quantize a transformers experts module (GptOssExperts,
        Qwen3MoeExperts; see _expert_kind) expert by expert - on its GPU by
        the device quantizer when its weights are there, else by the C
        reference - and pack it for `device` (default: the weights' CUDA
        device, else the current one)."""
        kind = _expert_kind(mod)
        if kind is None:
            raise ValueError(f"nibble.torch: {type(mod).__name__} is not an experts module nibble replaces "
                             "(GptOssExperts, or fused SwiGLU experts such as Qwen3MoeExperts)")
        activation, transposed, has_bias, limit, alpha = kind
        fmt = _format_code(format)
        if not _fp4(fmt):
            raise ValueError(f"nibble.torch: no MoE kernel serves {_FORMAT_NAMES[fmt]} (nb_moe_mlp: nvfp4, mxfp4)")
        if device is None:
            device = mod.gate_up_proj.device if mod.gate_up_proj.device.type == "cuda" else None
        proj = {name: _quantize_experts(getattr(mod, name), transposed, fmt, scale_rule, method, name)
                for name in ("gate_up_proj", "down_proj")}
        bias = [getattr(mod, b, None) if has_bias else None for b in ("gate_up_proj_bias", "down_proj_bias")]
        qm = QuantizedMoe(proj["gate_up_proj"], proj["down_proj"], activation=activation, limit=limit, alpha=alpha)
        w = pack_moe(qm, device)
        return cls(w, *(None if b is None else b.detach() for b in bias))

    def extra_repr(self):
        s = self.spec
        return (f"experts={s.experts}, hidden={s.hidden}, intermediate={s.intermediate}, format={s.format}, "
                f"activation={s.activation}, gate_up_layout={s.gate_up_layout}, "
                f"bias={self.gate_up_proj_bias is not None}")


def _quantize_experts(w, transposed, fmt, scale_rule, method, what="experts"):
    """A 3-D experts weight ([E, n, k], or [E, k, n] when transposed, as
    gpt-oss stores it) quantized expert by expert (_quantize_host_weight:
    on its GPU by the device quantizer, else the C reference): a
    nibble.QuantizedExperts in host memory."""
    if not isinstance(w, torch.Tensor) or w.dim() != 3:
        raise ValueError(f"nibble.torch: {what} must be a 3-D tensor [experts, out, in], got "
                         f"{tuple(w.shape) if isinstance(w, torch.Tensor) else type(w).__name__}")
    w = w.detach()
    if w.is_meta:
        raise ValueError(f"nibble.torch: {what} is on the meta device (no values to quantize)")
    return QuantizedExperts.stack([_quantize_host_weight(w[e].t() if transposed else w[e], fmt, scale_rule, method)
                                   for e in range(w.shape[0])])


def _quantize_host_weight(w, fmt, scale_rule, method):
    """One 2-D weight as a nibble.QuantizedWeight in host memory: the device
    quantizer for a CUDA tensor (method "rtn"), else the C reference."""
    _check_weight(w)
    if w.device.type == "cuda" and method == "rtn":
        codes, scales, d = _quantize_device(w.contiguous(), fmt, scale_rule, None)
        return QuantizedWeight(codes=codes.cpu().numpy(), scales=scales.cpu().numpy(),
                               tensor_scale=float(d.tensor_scale), n=int(d.n), k=int(d.k), format=_FORMAT_NAMES[fmt])
    return _np_quantize(_host_array(w), format=_FORMAT_NAMES[fmt], scale_rule=scale_rule, method=method)


def _np_float_tensor(a, dtype):
    """A numpy bias (float, or uint16 BF16 bits) as a CPU tensor of dtype."""
    if a is None:
        return None
    a = np.ascontiguousarray(a)
    t = torch.from_numpy(a.view(np.int16)).view(torch.bfloat16) if a.dtype == np.uint16 else torch.from_numpy(a)
    return t.to(dtype)


def _dense_experts(qe, dtype, device, transposed):
    """[E, n, k] (or [E, k, n] when transposed) dequantized expert weights of
    a nibble.QuantizedExperts, bit-exact with what the kernels multiply by."""
    ws = [dequantize_weight(qe.expert(e), dtype, device) for e in range(qe.experts)]
    return torch.stack([w.t() for w in ws] if transposed else ws).contiguous()


# ------------------------------------------------------ checkpoint loading

# Tensors a weight-only model has no place for: activation and KV-cache
# scales (nibble's GEMM quantizes no activations).  Skipped, and listed.
_IGNORED_SUFFIXES = (".input_scale", ".input_global_scale", ".k_scale", ".v_scale")

_F8 = {"F8_E4M3": "float8_e4m3fn", "F8_E5M2": "float8_e5m2", "F8_E8M0": "float8_e8m0fnu",
       "F8_E4M3FNUZ": "float8_e4m3fnuz", "F8_E5M2FNUZ": "float8_e5m2fnuz"}


def _torch_tensor(ck, name):
    """Checkpoint tensor `name` as a CPU torch tensor of its own dtype."""
    info = ck.tensor_info(name)
    a = ck.tensor(name)
    if info.dtype == "BF16":
        return torch.from_numpy(a.view(np.int16)).view(torch.bfloat16)
    if info.dtype in _F8:
        dt = getattr(torch, _F8[info.dtype], None)
        if dt is None:
            raise TypeError(f"nibble.torch: {name} is {info.dtype}, which this PyTorch has no dtype for")
        return torch.from_numpy(a).view(dt)
    if info.dtype == "U16":
        return torch.from_numpy(a.view(np.int16))  # torch has no uint16 arithmetic; bits kept
    return torch.from_numpy(a)


def _model_slots(model):
    """{state_dict name: [(module, attribute, is_parameter)]} for every
    parameter and persistent buffer.  Tied names (one tensor under several
    names, e.g. lm_head.weight and model.embed_tokens.weight) share one list
    holding every place of that tensor, so loading any of the names sets all
    of them."""
    places, names = {}, {}
    for mname, mod in model.named_modules(remove_duplicate=False):
        pre = mname + "." if mname else ""
        for coll, is_param in ((mod._parameters, True), (mod._buffers, False)):
            for attr, t in coll.items():
                if t is None or (not is_param and attr in mod._non_persistent_buffers_set):
                    continue
                places.setdefault(id(t), []).append((mod, attr, is_param))
                names[pre + attr] = id(t)
    return {name: places[key] for name, key in names.items()}


def _slot_tensor(slot):
    mod, attr, _ = slot[0]
    return getattr(mod, attr)


def _place(slot, value, is_param):
    """Set every (module, attribute) of a slot to `value` (a new frozen
    Parameter for parameters), keeping tied names tied."""
    if is_param:
        value = torch.nn.Parameter(value, requires_grad=False)
    for mod, attr, _ in slot:
        if is_param:
            mod._parameters[attr] = value
        else:
            mod._buffers[attr] = value


def _rebuild_meta_buffers(model, device):
    """Non-persistent buffers (rotary inv_freq, ...) are in no checkpoint: a
    model built on the meta device gets them by building the module that owns
    them again from its `config` on the CPU.  Returns the names of buffers
    still on the meta device."""
    left = []
    for mname, mod in model.named_modules():
        meta = [b for b, t in mod._buffers.items() if t is not None and t.is_meta]
        if not meta:
            continue
        fresh = None
        if hasattr(mod, "config"):
            try:
                with torch.device("cpu"):
                    fresh = type(mod)(mod.config)
            except Exception:  # noqa: BLE001 - any failure leaves the buffer listed as meta
                fresh = None
        for b in meta:
            t = getattr(fresh, b, None) if fresh is not None else None
            if isinstance(t, torch.Tensor) and not t.is_meta and t.shape == mod._buffers[b].shape:
                mod._buffers[b] = t.to(device)
            else:
                left.append((mname + "." if mname else "") + b)
        if fresh is not None:
            for attr in ("attention_scaling",):
                if hasattr(fresh, attr):
                    setattr(mod, attr, getattr(fresh, attr))
    return left


def load_quantized(model, path, device=None, dtype=None, dequantize=False, strict=True):
    """Load a quantized checkpoint into `model` through nibble's C checkpoint
    reader (nibble_io.h in libnibble): ModelOpt NVFP4, Quark MXFP4,
    compressed-tensors nvfp4/mxfp4-pack-quantized, the integer layouts the
    reader converts into nibble's (AWQ GEMM, GPTQ v1/v2 including act-order,
    4-bit and symmetric 8-bit, compressed-tensors pack-quantized int4
    asymmetric and symmetric, and int8 symmetric), bitsandbytes' serialized 4-bit weights (nf4 and
    fp4 -> nf4 / bnb_fp4, F32 absmax per block; a nested absmax resolved by
    the reader as bitsandbytes does) and HQQ's 4-bit layers (hqq's
    state_dicts, as its save_to_safetensors writes them -> int4_hqq),
    detected per layer.  An act-order
    layer (CheckpointLayer.k_permuted) becomes a Linear with its activation
    permutation (Checkpoint.perm; dequantize=True puts the columns back in
    the model's order instead).  Layers the reader found inconsistent
    (among them 8-bit layouts no nibble format holds: GPTQ and
    compressed-tensors asymmetric 8-bit) raise nibble.Error
    (NB_ERR_CORRUPT) with its reason; layers in a format no GPU kernel
    serves nibble.Error (NB_ERR_UNSUPPORTED) naming them.

    model: a torch.nn.Module whose state_dict names match the checkpoint's
      tensor names, e.g. a Hugging Face LlamaForCausalLM(config) built on the
      meta device (`with torch.device("meta"):`) or on the CPU.  For a
      transformers model, names as transformers' renamings for that model
      make them (e.g. Mixtral's block_sparse_moe -> mlp; see _renamer).
    path: a .safetensors file, a checkpoint directory (model.safetensors or a
      sharded index) or an index file; or an open nibble.Checkpoint.
    device: where the model ends up; default the current CUDA device (the CPU
      when dequantize is true).
    dtype: the dtype of every floating-point tensor (default: each model
      tensor's own dtype).
    dequantize: False replaces every quantized layer by a nibble.torch.Linear
      (quantized in GPU memory, nibble's GEMM); True keeps the model's nn.Linear
      and loads the weights dequantized exactly as nibble's kernels see them
      (a reference model; also runs on the CPU).
    strict: raise ValueError when the model has tensors the checkpoint lacks
      (missing) or the checkpoint has tensors the model has no place for
      (unexpected), before anything is loaded; False loads what matches.

    Expert groups (gpt-oss MXFP4 experts, per-expert ModelOpt /
    compressed-tensors / Quark layers, Mixtral's w1 / w3 / w2 included;
    Checkpoint.moe_groups) go into the model's experts module of the
    group's prefix, renamed as above (GptOssExperts, Qwen3MoeExperts,
    MixtralExperts, DeepseekV3Experts), which becomes a MoeExperts
    (dequantize: its own 3-D weights get the dequantized values).
    Quantized layers must be nn.Linear modules of the checkpoint's shape;
    any other shape difference raises ValueError, a layer the C reader found
    inconsistent raises nibble.Error.  Activation and KV-cache scales
    (input_scale, k_scale, v_scale) are skipped.  Non-persistent buffers left
    on the meta device (rotary frequencies) are rebuilt from the owning
    module's config.  Tied weights (lm_head / embed_tokens) stay tied.

    Returns a report: {"quantized": {the model's module name: checkpoint
    format}, "loaded": [checkpoint names], "missing": [model names],
    "unexpected": [checkpoint names], "ignored": [checkpoint names], "meta":
    [buffers still on the meta device]}."""
    from .checkpoint import Checkpoint, open_checkpoint
    if not isinstance(model, torch.nn.Module):
        raise TypeError(f"nibble.torch: model must be a torch.nn.Module, got {type(model).__name__}")
    if dtype is not None and not (isinstance(dtype, torch.dtype) and dtype.is_floating_point):
        raise TypeError(f"nibble.torch: dtype must be a floating-point torch.dtype, got {dtype!r}")
    if device is None:
        device = torch.device("cpu") if dequantize else torch.device("cuda", torch.cuda.current_device())
    device = torch.device(device)
    if device.type == "cuda" and device.index is None:
        device = torch.device("cuda", torch.cuda.current_device())
    if not dequantize and device.type != "cuda":
        raise ValueError(f"nibble.torch: load_quantized packs for CUDA devices only, not {device} (on the CPU a "
                         "nibble.torch.Linear runs only the host reference, for checking); pass dequantize=True "
                         "for a dequantized model on the CPU")
    own = not isinstance(path, Checkpoint)
    ck = open_checkpoint(path) if own else path
    try:
        return _load(model, ck, device, dtype, dequantize, strict)
    finally:
        if own:
            ck.close()


def _renamer(model):
    """The name `model` gives a checkpoint name, as transformers names what it
    loads: the WeightRenaming entries of transformers' weight conversions for
    the model (transformers.conversion_mapping.get_model_conversion_mapping,
    applied by core_model_loading.rename_source_key; e.g. Mixtral's
    ".block_sparse_moe." -> ".mlp."); the identity for a model transformers
    did not build.  The conversions that merge tensors (per-expert weights
    fused into experts.gate_up_proj) are not applied: nibble reads those
    tensors itself, as expert groups."""
    import sys
    tf = sys.modules.get("transformers")   # a model transformers built means transformers is imported
    if tf is None or not isinstance(model, tf.PreTrainedModel):
        return lambda name: name
    from transformers.conversion_mapping import get_model_conversion_mapping
    from transformers.core_model_loading import WeightRenaming, rename_source_key
    renamings = [c for c in get_model_conversion_mapping(model) if isinstance(c, WeightRenaming)]
    cache = {}

    def rename(name):
        if name not in cache:
            cache[name] = rename_source_key(name, renamings, [])[0] if renamings else name
        return cache[name]
    return rename


def _module_name(rename, modules, prefix, member):
    """The model's name for checkpoint module `prefix` (a layer or an expert
    group): the weight name of `member` (prefix, or a layer of the group)
    renamed as transformers renames it, less what follows prefix; prefix
    when that names no module of the model (or the renaming changed the
    tail)."""
    tail = member[len(prefix):] + ".weight"
    renamed = rename(member + ".weight")
    name = renamed[:-len(tail)] if renamed.endswith(tail) else prefix
    return name if name in modules else prefix


def _group_module_names(model, ck, rename=None, modules=None):
    """{expert group prefix: the model's name for it} (_module_name)."""
    rename = rename or _renamer(model)
    modules = modules if modules is not None else dict(model.named_modules())
    member = {}
    for L in ck.layers:
        if L.moe_group:
            member.setdefault(L.moe_group, L.prefix)
    return {g.prefix: _module_name(rename, modules, g.prefix, member.get(g.prefix, g.prefix)) for g in ck.moe_groups}


def _plan_layers(model, ck):
    """The quantized layers and expert groups of checkpoint `ck` and where
    they go in `model`, settled from names and shapes before any data is
    read (load_quantized and the transformers integration share it).
    A checkpoint name becomes the model's as transformers renames it when
    the model is a transformers one (_renamer: Mixtral's
    block_sparse_moe.experts is the model's mlp.experts).
    Returns (layers, consumed, groups, problems): layers [(CheckpointLayer,
    module, bias name or None, module name)] whose module is an nn.Linear
    (or a nibble.torch.Linear) of the layer's shape; consumed, the
    checkpoint tensor names they account for (and the model's names of what
    they replace); groups [(CheckpointMoe, module, module name)] for the
    expert groups whose name is an experts module of the model (see
    _plan_group); problems, expert layers with nowhere to go.  A layer the C
    reader found inconsistent raises nibble.Error (NB_ERR_CORRUPT), one in a
    format no GPU kernel serves nibble.Error (NB_ERR_UNSUPPORTED, naming
    it), a module of another kind or shape ValueError.  A layer whose module
    the model lacks is left out (its tensors stay unconsumed)."""
    modules = dict(model.named_modules())
    rename = _renamer(model)
    plan_layers, consumed, problems = [], set(), []
    groups = {}
    names = _group_module_names(model, ck, rename, modules)
    for g in ck.moe_groups:
        name = names[g.prefix]
        mod = modules.get(name)
        if mod is None or isinstance(mod, torch.nn.ModuleList):
            continue  # no module of that name, or one module per expert: the layers load one by one
        _plan_group(ck, g, mod, name)
        groups[g.prefix] = (g, mod, name)
        for bias_names in ck.moe_bias_names(g) or ():
            consumed.update(bias_names)
        consumed.update(f"{name}.{t}" for t in mod.state_dict())
    for L in ck.layers:
        if L.format == "inconsistent":
            raise Error(_lib.Status.ERR_CORRUPT, "NB_ERR_CORRUPT", f"{ck.path}: layer {L.prefix}: {L.problem}")
        if L.quant_format is None:
            continue
        if not _lib.FORMAT_INFO[_lib.format_from_name(L.quant_format)]["kernels"]:
            raise Error(_lib.Status.ERR_UNSUPPORTED, "NB_ERR_UNSUPPORTED",
                        f"{ck.path}: layer {L.prefix} is {L.format}: no GPU kernel serves {L.quant_format} yet")
        members = [t.name for t in ck.tensors if t.layer == L.prefix]
        if L.moe_group in groups:
            consumed.update(members)
            continue
        if L.experts:
            problems.append(f"{L.prefix}: {L.format} expert weights ({L.experts} experts) have no experts module "
                            "(GptOssExperts) to go into")
            continue
        name = _module_name(rename, modules, L.prefix, L.prefix)
        mod = modules.get(name)
        if mod is None:
            continue  # its tensors stay unconsumed: reported as unexpected
        if not isinstance(mod, (torch.nn.Linear, Linear)):
            raise ValueError(f"nibble.torch: checkpoint layer {L.prefix} ({L.format}, {L.n} x {L.k}) but the model's "
                             f"{name} is a {type(mod).__name__}, not an nn.Linear")
        if (mod.out_features, mod.in_features) != (L.n, L.k):
            raise ValueError(f"nibble.torch: {L.prefix}: the checkpoint's weight is {L.n} x {L.k} (out x in) but the "
                             f"model's layer {name} is {mod.out_features} x {mod.in_features}")
        bias_name = L.prefix + ".bias"
        has_bias = getattr(mod, "bias", None) is not None
        if bias_name in ck:
            if not has_bias:
                raise ValueError(f"nibble.torch: the checkpoint has {bias_name} but the model's layer has no bias")
            members.append(bias_name)
        plan_layers.append((L, mod, bias_name if bias_name in ck else None, name))
        consumed.update(members)
        consumed.add(name + ".weight")  # the model's name for it, whatever the checkpoint calls it
    return plan_layers, consumed, list(groups.values()), problems


def _module_moe_kind(mod):
    """(activation, transposed, has_bias) of an experts module: a transformers
    one (_expert_kind) or a MoeExperts (placeholder); None otherwise."""
    if isinstance(mod, MoeExperts):
        return (mod.spec.activation, mod.spec.activation == "swiglu_oai", mod.gate_up_proj_bias is not None)
    kind = _expert_kind(mod)
    return kind[:3] if kind else None


def _plan_group(ck, g, mod, name=None):
    """Check that expert group g of checkpoint ck fits the model's module
    `mod` (named `name`; default the group's prefix): an experts module of
    the group's activation, E, H and I, with biases exactly when the group
    has them.  nibble.Error for an inconsistent group (NB_ERR_CORRUPT) or
    one of a format without MoE kernels (NB_ERR_UNSUPPORTED); ValueError
    otherwise."""
    name = name or g.prefix
    where = g.prefix if name == g.prefix else f"{g.prefix} (the model's {name})"
    if g.format == "inconsistent":
        raise Error(_lib.Status.ERR_CORRUPT, "NB_ERR_CORRUPT", f"{ck.path}: expert group {g.prefix}: {g.problem}")
    if not g.quant_format or not _fp4(_lib.format_from_name(g.quant_format)):
        raise Error(_lib.Status.ERR_UNSUPPORTED, "NB_ERR_UNSUPPORTED",
                    f"{ck.path}: expert group {g.prefix} is {g.format}: no MoE kernel serves it")
    kind = _module_moe_kind(mod)
    if kind is None:
        raise ValueError(f"nibble.torch: checkpoint expert group {g.prefix} ({g.format}, {g.experts} experts) but the "
                         f"model's {name} is a {type(mod).__name__}, not an experts module nibble replaces "
                         "(GptOssExperts, Qwen3MoeExperts, MixtralExperts, ...)")
    shape = _expert_dims(mod)
    if (kind[0], *shape) != (g.activation, g.experts, g.hidden, g.intermediate):
        raise ValueError(f"nibble.torch: {where}: the checkpoint's experts are {g.activation} with E = "
                         f"{g.experts}, H = {g.hidden}, I = {g.intermediate} but the model's {type(mod).__name__} is "
                         f"{kind[0]} with E = {shape[0]}, H = {shape[1]}, I = {shape[2]}")
    biases = ck.moe_bias_names(g)
    if kind[2] != (biases is not None and all(biases)):
        raise ValueError(f"nibble.torch: {where}: the model's experts {'have' if kind[2] else 'have no'} biases, "
                         f"the checkpoint's {'have none' if kind[2] else 'have'}")


def _load(model, ck, device, dtype, dequantize, strict):
    slots = _model_slots(model)
    plan_layers, consumed, groups, problems = _plan_layers(model, ck)
    rename = _renamer(model)

    loaded, unexpected, ignored = [], [], []
    model_name = {}   # checkpoint name -> the model's (transformers' renamings)
    for t in ck.tensors:
        if t.name in consumed:
            continue
        name = rename(t.name)
        if name in slots:
            model_t = _slot_tensor(slots[name])
            if tuple(model_t.shape) != t.shape:
                raise ValueError(f"nibble.torch: {t.name}: the checkpoint's tensor has shape {list(t.shape)} "
                                 f"({t.dtype}) but the model's {name} has {list(model_t.shape)}")
            loaded.append(t.name)
            model_name[t.name] = name
        elif t.name.endswith(_IGNORED_SUFFIXES):
            ignored.append(t.name)
        else:
            unexpected.append(t.name)
    covered = {id(_slot_tensor(slots[model_name[n]])) for n in loaded}
    covered |= {id(_slot_tensor(slots[n])) for n in consumed if n in slots}
    missing = [n for n, sl in slots.items() if id(_slot_tensor(sl)) not in covered and n not in consumed]
    if problems:
        raise ValueError("nibble.torch: " + "; ".join(problems))
    if strict and (missing or unexpected):
        parts = []
        if missing:
            parts.append(f"{len(missing)} model tensors are not in the checkpoint: {_some(missing)}")
        if unexpected:
            parts.append(f"{len(unexpected)} checkpoint tensors have no place in the model: {_some(unexpected)}")
        raise ValueError(f"nibble.torch: {ck.path}: " + "; ".join(parts) + " (strict=False loads what matches)")

    # Quantized layers.
    report_q = {}
    for L, mod, bias_name, name in plan_layers:
        qw = ck.quantized_weight(L)
        perm = torch.from_numpy(ck.perm(L).astype(np.int64)) if L.k_permuted else None
        wdtype = dtype or (mod.weight.dtype if isinstance(mod, torch.nn.Linear) else torch.bfloat16)
        bias = None
        if bias_name is not None:
            bdtype = dtype or mod.bias.dtype
            bias = _torch_tensor(ck, bias_name).to(device=device, dtype=bdtype)
        if dequantize:
            if isinstance(mod, Linear):
                raise ValueError(f"nibble.torch: {name} is already a nibble.torch.Linear; dequantize=True needs "
                                 "an nn.Linear")
            w = _unpermuted(dequantize_weight(qw, wdtype, device), perm)
            _place([(mod, "weight", True)], w, True)
            if bias is not None:
                _place([(mod, "bias", True)], bias, True)
        else:
            parent_name, _, child = name.rpartition(".")
            parent = model.get_submodule(parent_name) if parent_name else model
            setattr(parent, child, Linear.from_quantized(qw, bias, device=device, perm=perm))
        report_q[name] = L.format

    # Expert groups.
    for g, mod, mname in groups:
        qm = ck.moe(g)
        _, transposed, has_bias = _module_moe_kind(mod)
        bdtype = dtype or (mod.gate_up_proj_bias.dtype if has_bias else torch.bfloat16)
        if dequantize:
            if isinstance(mod, MoeExperts):
                raise ValueError(f"nibble.torch: {mname} is already a nibble.torch.MoeExperts; dequantize=True "
                                 "needs the model's own experts module")
            wdtype = dtype or mod.gate_up_proj.dtype
            for name, qe in (("gate_up_proj", qm.gate_up), ("down_proj", qm.down)):
                _place([(mod, name, True)], _dense_experts(qe, wdtype, device, transposed), True)
            if has_bias:
                for name, b in (("gate_up_proj_bias", qm.gate_up_bias), ("down_proj_bias", qm.down_bias)):
                    _place([(mod, name, True)], _np_float_tensor(b, bdtype).to(device), True)
        else:
            parent_name, _, child = mname.rpartition(".")
            parent = model.get_submodule(parent_name) if parent_name else model
            setattr(parent, child, MoeExperts.from_quantized(qm, device=device, dtype=bdtype))
        report_q[mname] = g.format

    # Everything else, converted on the host, then moved.
    for name in loaded:
        slot = slots[model_name[name]]
        model_t = _slot_tensor(slot)
        t = _torch_tensor(ck, name)
        if t.is_floating_point():
            t = t.to(dtype or (model_t.dtype if model_t.is_floating_point() else t.dtype))
        _place(slot, t.to(device), slot[0][2])

    # The rest of the model (tensors not in the checkpoint, non-strict) to the device.
    meta_left = _rebuild_meta_buffers(model, device)
    moved = {}  # id -> moved tensor, so tied tensors stay one tensor
    for mod in model.modules():
        for coll in (mod._parameters, mod._buffers):
            for key, t in coll.items():
                if t is None or t.is_meta or t.device == device:
                    continue
                if id(t) not in moved:
                    m = t.detach().to(device)
                    moved[id(t)] = torch.nn.Parameter(m, requires_grad=False) if coll is mod._parameters else m
                coll[key] = moved[id(t)]
    return {"quantized": report_q, "loaded": loaded, "missing": missing, "unexpected": unexpected,
            "ignored": ignored, "meta": meta_left}


def _unpermuted(w, perm):
    """The dense weight of an act-order layer in the model's column order:
    the checkpoint weight's column j multiplies input feature perm[j]."""
    if perm is None:
        return w
    out = torch.empty_like(w)
    out[:, perm.to(w.device)] = w
    return out


def _some(names, k=6):
    return ", ".join(names[:k]) + (f", ... ({len(names) - k} more)" if len(names) > k else "")


from .fuse import ProjectionSlice, fuse_glu, fuse_linears, fuse_projections, unfuse_projections  # noqa: E402,F401
