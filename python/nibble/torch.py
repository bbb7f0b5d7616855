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

The op
  torch.ops.nibble.gemm(x, packed, workspace, bias, n, k, format, tensor_scale,
                        scale_exp_min, scale_exp_max) -> y
  is registered with torch.library.custom_op (no mutated arguments: nb_gemm
  leaves the workspace zero-filled as it found it) and has a fake (meta)
  implementation, so torch.compile(fullgraph=True) traces through it and CUDA
  graphs capture it (nb_gemm allocates nothing and never synchronizes; y comes
  from torch's caching allocator).  x's leading dimensions are flattened
  (m = their product, m = 0 returns an empty y without a C call); a last
  dimension that is not contiguous, or rows that are not 16-byte aligned, are
  copied first.  y is a new contiguous tensor of x's dtype.

Devices
  GPU only.  CPU (or other non-CUDA) tensors raise ValueError: the packed
  layout is the GPU kernels' and there is no host fallback here; the host
  reference is nibble.gemm_reference on the checkpoint layout (numpy).

Errors
  Wrong Python types or dtypes raise TypeError, wrong shapes, devices or
  formats ValueError, all before any C call; failures inside libnibble (e.g.
  NB_ERR_UNSUPPORTED for an MXFP4 weight whose exponents span too many binades
  for FP16) raise nibble.Error with the context's detailed message.

Inference only: the op has no autograd formula.
"""

import ctypes
import fnmatch
import threading
from dataclasses import dataclass
from typing import Optional

import numpy as np
import torch

from . import _lib
from . import QuantizedWeight, quantize as _np_quantize, _FORMATS, _FORMAT_NAMES, _GROUP, _RULES
from ._lib import DType, Error, Format, Layout  # noqa: F401  (Error is part of this module's contract)

if not hasattr(torch, "library") or not hasattr(torch.library, "custom_op"):
    raise ImportError(f"nibble.torch needs torch.library.custom_op (PyTorch 2.4 or newer); found torch "
                      f"{torch.__version__}")

__all__ = ["PackedLinearWeight", "quantize", "pack", "gemm", "Linear", "quantize_model", "last_config",
           "context", "Error"]

_DTYPES = {torch.bfloat16: DType.BF16, torch.float16: DType.F16}


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


def _weight_desc(n, k, fmt, tensor_scale, scale_exp_min, scale_exp_max):
    """A packed-layout nb_weight_desc (cached: the op builds one per call)."""
    key = (n, k, fmt, tensor_scale, scale_exp_min, scale_exp_max)
    d = _desc_cache.get(key)
    if d is None:
        d = _lib.WeightDesc()
        _lib.check(_lib.lib.nb_weight_desc_init(ctypes.byref(d), fmt, n, k))
        d.layout = Layout.PACKED
        d.tensor_scale = tensor_scale
        d.scale_exp_min = scale_exp_min
        d.scale_exp_max = scale_exp_max
        if len(_desc_cache) > 4096:
            _desc_cache.clear()
        _desc_cache[key] = d
    return d


def _format_code(fmt):
    if isinstance(fmt, Format):
        return fmt
    if isinstance(fmt, str) and fmt.lower() in _FORMATS:
        return _FORMATS[fmt.lower()]
    if isinstance(fmt, int) and not isinstance(fmt, bool) and fmt in (Format.NVFP4, Format.MXFP4):
        return Format(fmt)
    raise ValueError(f"nibble.torch: unknown format {fmt!r}; expected 'nvfp4' or 'mxfp4'")


@dataclass
class PackedLinearWeight:
    """A weight W[n, k] in the GPU kernels' layout, ready for nb_gemm.

    packed     uint8 CUDA tensor, nb_pack output (packed_bytes long)
    workspace  uint8 CUDA tensor of nb_gemm_workspace_size bytes, zero-filled
               once here; nb_gemm leaves it zeroed.  It serves any m but must
               not be used by two GEMMs running concurrently (two streams).
    n, k, format ("nvfp4" | "mxfp4"), tensor_scale (NVFP4 weight_scale_2, 1.0
    for MXFP4), scale_exp_min/max (found by nb_pack for MXFP4): the
    nb_weight_desc fields nb_gemm needs."""
    packed: torch.Tensor
    workspace: torch.Tensor
    n: int
    k: int
    format: str
    tensor_scale: float
    scale_exp_min: int
    scale_exp_max: int

    @property
    def device(self):
        return self.packed.device

    def op_args(self):
        """The descriptor as the op's trailing arguments."""
        return (self.n, self.k, int(_format_code(self.format)), self.tensor_scale, self.scale_exp_min,
                self.scale_exp_max)


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


def pack(qw, device=None):
    """Upload a nibble.QuantizedWeight (checkpoint layout: codes, scales,
    tensor scale) to a CUDA device and convert it with nb_pack (on the current
    stream, which nb_pack synchronizes: a load-time call).  Returns a
    PackedLinearWeight with its zero-filled workspace."""
    if not isinstance(qw, QuantizedWeight):
        raise TypeError(f"nibble.torch: expected a nibble.QuantizedWeight, got {type(qw).__name__}")
    dev = torch.device("cuda", _device_index(device))
    d = qw.desc()  # checks the arrays' dtypes and shapes
    sizes = _lib.WeightSizes()
    _lib.check(_lib.lib.nb_weight_get_sizes(ctypes.byref(d), ctypes.byref(sizes)))
    ctx = context(dev)
    with _on_device(dev.index):
        codes = torch.from_numpy(np.ascontiguousarray(qw.codes)).to(dev)
        scales = torch.from_numpy(np.ascontiguousarray(qw.scales)).to(dev)
        packed = torch.empty(sizes.packed_bytes, dtype=torch.uint8, device=dev)
        stream = torch.cuda.current_stream(dev).cuda_stream
        ctx.check(_lib.lib.nb_pack(ctx.ptr, ctypes.byref(d), ctypes.c_void_p(codes.data_ptr()),
                                   ctypes.c_void_p(scales.data_ptr()), ctypes.c_void_p(packed.data_ptr()),
                                   sizes.packed_bytes, ctypes.c_void_p(stream)))
        workspace = torch.zeros(_workspace_bytes(ctx, d), dtype=torch.uint8, device=dev)
    return PackedLinearWeight(packed=packed, workspace=workspace, n=qw.n, k=qw.k, format=qw.format,
                              tensor_scale=float(d.tensor_scale), scale_exp_min=int(d.scale_exp_min),
                              scale_exp_max=int(d.scale_exp_max))


def quantize(w, format="nvfp4", scale_rule=None, tensor_scale=None, device=None):
    """Quantize W[n, k] (a float32, bfloat16 or float16 tensor on any device)
    and pack it on a CUDA device (`device`, default: w's device if it is a
    CUDA one, else the current CUDA device).

    The codes and scales are computed on the host by nibble.quantize (the C
    reference, ModelOpt NVFP4 / MXFP4 with `scale_rule`), which is bit-exact
    with the GPU quantizer it stands in for; the upload and nb_pack run on the
    GPU.  Returns a PackedLinearWeight."""
    if not isinstance(w, torch.Tensor):
        raise TypeError(f"nibble.torch: w must be a torch.Tensor, got {type(w).__name__}")
    if w.dtype not in (torch.float32, torch.bfloat16, torch.float16):
        raise TypeError(f"nibble.torch: w has dtype {w.dtype}; expected float32, bfloat16 or float16")
    if w.dim() != 2:
        raise ValueError(f"nibble.torch: w must be 2-D [n, k], got shape {tuple(w.shape)}")
    fmt = _format_code(format)
    if device is None:
        device = w.device if w.device.type == "cuda" else None
    dev = _device_index(device)
    # float32 holds every bf16/fp16 value exactly, so quantizing the float32
    # copy gives the same codes as quantizing w itself.
    host = w.detach().to("cpu", torch.float32).contiguous().numpy()
    qw = _np_quantize(host, format=_FORMAT_NAMES[fmt], scale_rule=scale_rule, tensor_scale=tensor_scale)
    return pack(qw, dev)


# ----------------------------------------------------------------- the op

def _check_args(x, packed, workspace, bias, n, k, fmt, fake):
    """Type, dtype and shape checks shared by the real and the fake
    implementation (device checks only in the real one: fake tensors may be
    meta)."""
    if not isinstance(x, torch.Tensor):
        raise TypeError(f"nibble.torch: x must be a torch.Tensor, got {type(x).__name__}")
    if x.dtype not in _DTYPES:
        raise TypeError(f"nibble.torch: x has dtype {x.dtype}; expected torch.bfloat16 or torch.float16")
    if packed.dtype != torch.uint8 or workspace.dtype != torch.uint8:
        raise TypeError(f"nibble.torch: packed and workspace must be uint8 tensors (got {packed.dtype}, "
                        f"{workspace.dtype})")
    if fmt not in (int(Format.NVFP4), int(Format.MXFP4)):
        raise ValueError(f"nibble.torch: unknown format code {fmt}")
    group = _GROUP[Format(fmt)]
    if n < 1 or k < 1 or k % group:
        raise ValueError(f"nibble.torch: n = {n}, k = {k}: need n >= 1 and k a positive multiple of {group}")
    if x.dim() < 1 or x.shape[-1] != k:
        raise ValueError(f"nibble.torch: x has shape {tuple(x.shape)}; expected [..., k = {k}]")
    if bias is not None:
        if bias.dtype != x.dtype:
            raise TypeError(f"nibble.torch: bias has dtype {bias.dtype}; it must match x ({x.dtype})")
        if bias.dim() != 1 or bias.shape[0] != n:
            raise ValueError(f"nibble.torch: bias has shape {tuple(bias.shape)}; expected [{n}]")
    if not fake:
        devs = {t.device for t in (x, packed, workspace) + ((bias,) if bias is not None else ())}
        if x.device.type != "cuda":
            raise ValueError(f"nibble.torch: x is on {x.device}; nibble's GEMM runs on CUDA devices only (the host "
                             "reference is nibble.gemm_reference on numpy arrays)")
        if len(devs) != 1:
            raise ValueError(f"nibble.torch: x, packed, workspace and bias must be on one device, got "
                             f"{sorted(str(t) for t in devs)}")


@torch.library.custom_op("nibble::gemm", mutates_args=())
def _gemm_op(x: torch.Tensor, packed: torch.Tensor, workspace: torch.Tensor, bias: Optional[torch.Tensor],
             n: int, k: int, format: int, tensor_scale: float, scale_exp_min: int,
             scale_exp_max: int) -> torch.Tensor:
    _check_args(x, packed, workspace, bias, n, k, format, fake=False)
    lead = x.shape[:-1]
    x2 = x.reshape(-1, k)
    m = x2.shape[0]
    y = torch.empty((m, n), dtype=x.dtype, device=x.device)
    if m == 0:
        return y.reshape(*lead, n)
    # nb_gemm reads rows lda elements apart and needs 16-byte aligned rows.
    if x2.stride(1) != 1 or (m > 1 and (x2.stride(0) < k or x2.stride(0) * 2 % 16)) or x2.data_ptr() % 16:
        x2 = x2.clone(memory_format=torch.contiguous_format)
    lda = x2.stride(0) if m > 1 else k
    if bias is not None and (bias.stride(0) != 1 or bias.data_ptr() % 2):
        bias = bias.clone(memory_format=torch.contiguous_format)
    dt = _DTYPES[x.dtype]
    d = _weight_desc(n, k, format, tensor_scale, scale_exp_min, scale_exp_max)
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


@_gemm_op.register_fake
def _gemm_fake(x, packed, workspace, bias, n, k, format, tensor_scale, scale_exp_min, scale_exp_max):
    _check_args(x, packed, workspace, bias, n, k, format, fake=True)
    return x.new_empty((*x.shape[:-1], n))


def gemm(x, weight, bias=None):
    """y[..., n] = x[..., k] . W^T (+ bias[n]) with nb_gemm on x's CUDA stream.

    x: bfloat16 or float16 CUDA tensor; weight: a PackedLinearWeight on the
    same device; bias: None or an [n] tensor of x's dtype.  Returns a new
    tensor of x's dtype."""
    if not isinstance(weight, PackedLinearWeight):
        raise TypeError(f"nibble.torch: weight must be a PackedLinearWeight, got {type(weight).__name__}")
    return torch.ops.nibble.gemm(x, weight.packed, weight.workspace, bias, *weight.op_args())


# ------------------------------------------------------------------ modules

class Linear(torch.nn.Module):
    """nn.Linear with a 4-bit weight: forward(x) = nibble::gemm(x, W, bias).

    Buffers: `packed` and `workspace` (uint8, not in the state_dict: a
    checkpoint format for them is not defined yet).  `bias`, if any, is a
    frozen Parameter so that module.to(dtype) converts it; a bias whose dtype
    differs from x's is converted on the fly.  Inference only."""

    def __init__(self, weight: PackedLinearWeight, bias: Optional[torch.Tensor] = None):
        super().__init__()
        if not isinstance(weight, PackedLinearWeight):
            raise TypeError(f"nibble.torch: weight must be a PackedLinearWeight, got {type(weight).__name__}")
        self.in_features, self.out_features = weight.k, weight.n
        self.format = weight.format
        self.tensor_scale = weight.tensor_scale
        self.scale_exp_min, self.scale_exp_max = weight.scale_exp_min, weight.scale_exp_max
        self._format_code = int(_format_code(weight.format))
        self.register_buffer("packed", weight.packed, persistent=False)
        self.register_buffer("workspace", weight.workspace, persistent=False)
        if bias is not None:
            if bias.shape != (weight.n,):
                raise ValueError(f"nibble.torch: bias has shape {tuple(bias.shape)}; expected [{weight.n}]")
            bias = torch.nn.Parameter(bias.detach().to(weight.packed.device), requires_grad=False)
        self.bias = bias

    @classmethod
    def from_linear(cls, linear, format="nvfp4", scale_rule=None, device=None):
        """Quantize an nn.Linear (any float dtype and device) to a Linear on
        a CUDA device (default: linear's if CUDA, else the current one)."""
        if not isinstance(linear, torch.nn.Linear):
            raise TypeError(f"nibble.torch: expected a torch.nn.Linear, got {type(linear).__name__}")
        w = quantize(linear.weight, format=format, scale_rule=scale_rule, device=device)
        return cls(w, linear.bias)

    @property
    def weight(self):
        """The PackedLinearWeight this module runs."""
        return PackedLinearWeight(self.packed, self.workspace, self.out_features, self.in_features, self.format,
                                  self.tensor_scale, self.scale_exp_min, self.scale_exp_max)

    def forward(self, x):
        bias = self.bias
        if bias is not None and bias.dtype != x.dtype:
            bias = bias.to(x.dtype)
        return torch.ops.nibble.gemm(x, self.packed, self.workspace, bias, self.out_features, self.in_features,
                                     self._format_code, self.tensor_scale, self.scale_exp_min, self.scale_exp_max)

    def extra_repr(self):
        return (f"in_features={self.in_features}, out_features={self.out_features}, bias={self.bias is not None}, "
                f"format={self.format}")


def _excluded(name, patterns):
    """fnmatch (case-sensitive) on the qualified name; a pattern also matches
    any dotted suffix, so "lm_head" excludes "lm_head" and "model.lm_head"."""
    return any(fnmatch.fnmatchcase(name, p) or fnmatch.fnmatchcase(name, "*." + p) for p in patterns)


def quantize_model(model, format="nvfp4", exclude=("lm_head",), scale_rule=None, device=None):
    """Replace, in place, every torch.nn.Linear of `model` whose qualified
    name matches no `exclude` pattern by a nibble.torch.Linear (quantized to
    `format` and packed on `device`, default: each layer's own CUDA device,
    else the current one).  Layers whose in_features is not a multiple of the
    format's group are left alone.  Returns {"quantized": [names],
    "skipped": {name: reason}}."""
    if not isinstance(model, torch.nn.Module):
        raise TypeError(f"nibble.torch: model must be a torch.nn.Module, got {type(model).__name__}")
    if isinstance(exclude, str):
        exclude = [exclude]
    fmt = _format_code(format)
    if fmt == Format.NVFP4 and scale_rule is not None:
        raise ValueError("nibble.torch: scale_rule applies to MXFP4 only")
    if scale_rule is not None and scale_rule not in _RULES:
        raise ValueError(f"nibble.torch: unknown MXFP4 scale_rule {scale_rule!r}; expected one of {sorted(_RULES)}")
    group = _GROUP[fmt]
    targets, skipped = [], {}
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
            targets.append(name)
    for name in targets:
        parent_name, _, child = name.rpartition(".")
        parent = model.get_submodule(parent_name) if parent_name else model
        old = getattr(parent, child)
        setattr(parent, child, Linear.from_linear(old, format=_FORMAT_NAMES[fmt], scale_rule=scale_rule,
                                                  device=device))
        del old
    return {"quantized": targets, "skipped": skipped}
