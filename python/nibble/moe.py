"""Mixture-of-experts MLPs at the numpy level (nibble.h "mixture of
experts"): E experts' gate_up [2I, H] and down [H, I] weights in the
checkpoint layout, expert-major, their packing for the GPU kernels
(nb_moe_pack_host) and the host reference MLP (nb_moe_mlp_host, and
nb_moe_mlp_host_f64 as the yardstick).

    gu = nibble.QuantizedExperts.stack([nibble.quantize(w, "mxfp4") for w in gate_up_weights])
    dn = nibble.QuantizedExperts.stack([nibble.quantize(w, "mxfp4") for w in down_weights])
    moe = nibble.QuantizedMoe(gu, dn, activation="swiglu_oai")          # gpt-oss: rows interleaved
    y = nibble.moe_reference(x, topk_ids, topk_weights, moe)            # x [m, H] float32 / float16 / BF16 bits
    pm = nibble.moe_pack(moe)                                           # the bytes nb_moe_mlp reads
    assert nibble.moe_unpack(pm).gate_up.codes.tobytes() == gu.codes.tobytes()

The router is the caller's: topk_ids [m, top_k] (distinct experts per token)
and topk_weights [m, top_k] are used as given.  The host functions validate
the routing (ids in [0, E), no expert twice in a token, finite weights) and
raise nibble.Error naming the token and slot.
"""

import ctypes
from dataclasses import dataclass
from typing import Optional, Tuple

import numpy as np

from . import _lib
from . import PackedWeight, QuantizedWeight, _FORMAT_NAMES, _GROUP, _as_array, _format, _nb_dtype, unpack
from ._lib import DType, Layout, MoeActivation, MoeGateUpLayout

__all__ = ["MoeSpec", "QuantizedExperts", "QuantizedMoe", "PackedMoe", "moe_pack", "moe_unpack", "moe_reference",
           "ACTIVATIONS", "GATE_UP_LAYOUTS"]

ACTIVATIONS = {"swiglu": MoeActivation.SWIGLU, "swiglu_oai": MoeActivation.SWIGLU_OAI}
GATE_UP_LAYOUTS = {"concat": MoeGateUpLayout.CONCAT, "interleaved": MoeGateUpLayout.INTERLEAVED}


@dataclass(frozen=True)
class MoeSpec:
    """What an MoE MLP is, apart from its weights and the batch: the format
    ("nvfp4", "mxfp4", ...), E experts, hidden H, intermediate I, the
    activation ("swiglu": silu(gate) * up, Qwen3-MoE, Mixtral, DeepSeek;
    "swiglu_oai": gpt-oss's clamped variant), the gate_up row order
    ("concat": gate rows then up rows; "interleaved": gate, up, gate, ...;
    default: interleaved for swiglu_oai, concat for swiglu) and swiglu_oai's
    limit and alpha (default gpt-oss's 7.0 and 1.702; 0 for swiglu; kept as
    the float32 values nb_moe_desc holds)."""
    format: str
    experts: int
    hidden: int
    intermediate: int
    activation: str = "swiglu"
    gate_up_layout: Optional[str] = None
    limit: Optional[float] = None
    alpha: Optional[float] = None

    def __post_init__(self):
        if self.activation not in ACTIVATIONS:
            raise ValueError(f"nibble: unknown MoE activation {self.activation!r}; expected one of "
                             f"{', '.join(map(repr, ACTIVATIONS))}")
        oai = self.activation == "swiglu_oai"
        if self.gate_up_layout is None:
            object.__setattr__(self, "gate_up_layout", "interleaved" if oai else "concat")
        if self.gate_up_layout not in GATE_UP_LAYOUTS:
            raise ValueError(f"nibble: unknown gate_up_layout {self.gate_up_layout!r}; expected one of "
                             f"{', '.join(map(repr, GATE_UP_LAYOUTS))}")
        for name, default in (("limit", 7.0), ("alpha", 1.702)):
            if getattr(self, name) is None:
                object.__setattr__(self, name, default if oai else 0.0)
        for name in ("experts", "hidden", "intermediate"):
            v = getattr(self, name)
            if not isinstance(v, (int, np.integer)) or isinstance(v, bool):
                raise TypeError(f"nibble: MoeSpec.{name} must be an integer, got {v!r}")
            object.__setattr__(self, name, int(v))
        object.__setattr__(self, "format", _FORMAT_NAMES[_format(self.format)])
        # (nb_moe_desc holds them as float32: the values it computes with)
        object.__setattr__(self, "limit", float(np.float32(self.limit)))
        object.__setattr__(self, "alpha", float(np.float32(self.alpha)))
        self.desc(1, 1, DType.F32)  # validates every field (nb_moe_desc_validate), top_k 1 for any E >= 1

    def desc(self, m, top_k, act_dtype, packed=None):
        """A validated nb_moe_desc for m tokens with top_k experts each and
        activations of act_dtype; checkpoint layout, or with `packed` (a
        PackedMoe or nibble.torch.PackedMoeWeights) the packed layout and its
        MXFP4 scale exponent ranges."""
        d = _lib.MoeDesc()
        fmt = _format(self.format)
        _lib.lib.nb_moe_desc_init(ctypes.byref(d), fmt, int(m), self.experts, int(top_k), self.hidden,
                                  self.intermediate, ACTIVATIONS[self.activation], int(act_dtype))
        d.gate_up_layout = GATE_UP_LAYOUTS[self.gate_up_layout]
        d.limit, d.alpha = self.limit, self.alpha
        if packed is not None:
            d.gate_up.layout = d.down.layout = Layout.PACKED
            d.gate_up.scale_exp_min, d.gate_up.scale_exp_max = packed.gate_up_exp
            d.down.scale_exp_min, d.down.scale_exp_max = packed.down_exp
        _lib.check(_lib.lib.nb_moe_desc_validate(ctypes.byref(d)))
        return d

    @property
    def has_tensor_scale(self):
        return bool(_lib.FORMAT_INFO[_format(self.format)]["tensor_scale"])


@dataclass
class QuantizedExperts:
    """E experts' weights of one projection in the checkpoint layout,
    expert-major (gpt-oss's own layout): codes uint8 [E, n, k/2], scales
    uint8 [E, n, k/group] (E4M3 for NVFP4, E8M0 for MXFP4) and, for a format
    with a tensor scale, tensor_scales float32 [E] (each NVFP4 expert has its
    own weight_scale_2; None for MXFP4)."""
    codes: np.ndarray
    scales: np.ndarray
    tensor_scales: Optional[np.ndarray]
    n: int
    k: int
    format: str = "nvfp4"

    @property
    def experts(self):
        return int(self.codes.shape[0]) if isinstance(self.codes, np.ndarray) and self.codes.ndim == 3 else 0

    def check(self, what="experts"):
        """Types and shapes against n, k and the format; returns E."""
        fmt = _format(self.format)
        info = _lib.FORMAT_INFO[fmt]
        if info["zero_point"] or info["element_bits"] != 4 or not info["kernels"]:
            raise ValueError(f"nibble: {what}: MoE experts of {_FORMAT_NAMES[fmt]} are not supported (the MoE "
                             "kernels serve 4-bit formats without zero points: nvfp4, mxfp4)")
        n, k, g = int(self.n), int(self.k), _GROUP[fmt]
        for name, arr, cols in (("codes", self.codes, k // 2), ("scales", self.scales, k // g)):
            if not isinstance(arr, np.ndarray) or arr.dtype != np.uint8:
                raise TypeError(f"nibble: {what}.{name} must be a numpy uint8 array")
            if arr.ndim != 3 or arr.shape[1:] != (n, cols) or arr.shape[0] < 1:
                raise ValueError(f"nibble: {what}.{name} has shape {arr.shape}; expected [E >= 1, {n}, {cols}] for "
                                 f"{_FORMAT_NAMES[fmt]} n={n} k={k}")
        E = self.codes.shape[0]
        if self.scales.shape[0] != E:
            raise ValueError(f"nibble: {what}: {E} experts of codes but {self.scales.shape[0]} of scales")
        ts = self.tensor_scales
        if info["tensor_scale"]:
            if not isinstance(ts, np.ndarray) or ts.dtype != np.float32 or ts.shape != (E,):
                raise TypeError(f"nibble: {what}.tensor_scales must be a float32 array of {E} values (one per expert: "
                                f"{_FORMAT_NAMES[fmt]} has a tensor scale)")
        elif ts is not None:
            raise ValueError(f"nibble: {what}: {_FORMAT_NAMES[fmt]} has no tensor scale; tensor_scales must be None")
        return E

    def expert(self, e):
        """Expert e as a nibble.QuantizedWeight (views of the arrays)."""
        E = self.check()
        if not 0 <= int(e) < E:
            raise IndexError(f"nibble: expert {e} out of range [0, {E})")
        ts = float(self.tensor_scales[e]) if self.tensor_scales is not None else 1.0
        return QuantizedWeight(codes=self.codes[e], scales=self.scales[e], tensor_scale=ts, n=int(self.n),
                                  k=int(self.k), format=self.format)

    @classmethod
    def stack(cls, weights):
        """The experts of a list of nibble.QuantizedWeight (one per expert, all
        of one format and shape, default group and scale type)."""
        weights = list(weights)
        if not weights or not all(isinstance(w, QuantizedWeight) for w in weights):
            raise TypeError("nibble: QuantizedExperts.stack needs a non-empty list of nibble.QuantizedWeight")
        w0 = weights[0]
        for e, w in enumerate(weights):
            w.desc()
            if (w.n, w.k, w.format) != (w0.n, w0.k, w0.format) or w.group is not None or w.scale_type is not None:
                raise ValueError(f"nibble: expert {e} is {w.format} {w.n} x {w.k}, expert 0 {w0.format} {w0.n} x "
                                 f"{w0.k}; experts must share format and shape (default group and scale type)")
        ts = None
        if _lib.FORMAT_INFO[_format(w0.format)]["tensor_scale"]:
            ts = np.array([w.tensor_scale for w in weights], dtype=np.float32)
        out = cls(codes=np.stack([w.codes for w in weights]), scales=np.stack([w.scales for w in weights]),
                  tensor_scales=ts, n=w0.n, k=w0.k, format=w0.format)
        out.check()
        return out


@dataclass
class QuantizedMoe:
    """An MoE MLP in the checkpoint layout: gate_up (n = 2I, k = H) and down
    (n = H, k = I) QuantizedExperts of one format, the activation, row
    order, limit and alpha (as MoeSpec), and optional biases gate_up_bias
    [E, 2I] and down_bias [E, H] (float32, float16 or uint16 BF16 bits;
    moe_reference takes them in x's dtype)."""
    gate_up: QuantizedExperts
    down: QuantizedExperts
    activation: str = "swiglu"
    gate_up_layout: Optional[str] = None
    limit: Optional[float] = None
    alpha: Optional[float] = None
    gate_up_bias: Optional[np.ndarray] = None
    down_bias: Optional[np.ndarray] = None

    @property
    def spec(self):
        """The MoeSpec, after checking that the two projections fit together."""
        if not isinstance(self.gate_up, QuantizedExperts) or not isinstance(self.down, QuantizedExperts):
            raise TypeError("nibble: QuantizedMoe.gate_up and .down must be nibble.QuantizedExperts")
        E = self.gate_up.check("gate_up")
        if self.down.check("down") != E or self.down.format != self.gate_up.format:
            raise ValueError(f"nibble: gate_up holds {E} {self.gate_up.format} experts, down {self.down.experts} "
                             f"{self.down.format} ones")
        H, I2 = int(self.gate_up.k), int(self.gate_up.n)
        if I2 % 2 or (int(self.down.n), int(self.down.k)) != (H, I2 // 2):
            raise ValueError(f"nibble: gate_up is {I2} x {H} and down {self.down.n} x {self.down.k} (out x in); an "
                             f"MoE MLP needs gate_up [2I, H] and down [H, I]")
        return MoeSpec(self.gate_up.format, E, H, I2 // 2, self.activation, self.gate_up_layout, self.limit,
                       self.alpha)


@dataclass
class PackedMoe:
    """nb_moe_pack_host output (host memory): E experts' packed gate_up and
    down bytes (gate_up_expert_bytes / down_expert_bytes apart), the
    per-expert tensor scales (NVFP4) and the MXFP4 scale exponent ranges
    (min, max) nb_moe_pack_host found; the bytes nb_moe_mlp reads once
    copied to the device."""
    spec: MoeSpec
    gate_up: np.ndarray
    down: np.ndarray
    gate_up_scales: Optional[np.ndarray]
    down_scales: Optional[np.ndarray]
    gate_up_exp: Tuple[int, int]
    down_exp: Tuple[int, int]


def packed_sizes(spec):
    """nb_moe_packed_get_sizes of a MoeSpec as a dict (per expert and in all)."""
    s = _lib.MoePackedSizes()
    _lib.check(_lib.lib.nb_moe_packed_get_sizes(ctypes.byref(spec.desc(1, 1, DType.BF16)), ctypes.byref(s)))
    return {name: int(getattr(s, name)) for name, _ in s._fields_ if name != "reserved"}


def _moe_weights(qm):
    """An nb_moe_weights over a QuantizedMoe's arrays (contiguous copies where
    needed, kept alive by the returned tuple's second item)."""
    keep = []

    def c(a, dt=None):
        if a is None:
            return None
        a = np.ascontiguousarray(a if dt is None else a.astype(dt, copy=False))
        keep.append(a)
        return a.ctypes.data
    w = _lib.MoeWeights()
    w.gate_up.codes, w.gate_up.scales = c(qm.gate_up.codes), c(qm.gate_up.scales)
    w.down.codes, w.down.scales = c(qm.down.codes), c(qm.down.scales)
    fp = ctypes.POINTER(ctypes.c_float)
    if qm.gate_up.tensor_scales is not None:
        w.gate_up_scales = ctypes.cast(c(qm.gate_up.tensor_scales, np.float32), fp)
        w.down_scales = ctypes.cast(c(qm.down.tensor_scales, np.float32), fp)
    return w, keep


def moe_pack(qm, ctx=None):
    """The GPU kernels' layout of a QuantizedMoe (nb_moe_pack_host): a
    PackedMoe.  Biases are not packed (they stay [E, 2I] / [E, H] in the
    checkpoint's row order)."""
    if not isinstance(qm, QuantizedMoe):
        raise TypeError(f"nibble: expected a nibble.QuantizedMoe, got {type(qm).__name__}")
    spec = qm.spec
    sizes = packed_sizes(spec)
    d = spec.desc(1, 1, DType.BF16)
    w, keep = _moe_weights(qm)
    gu = np.empty(sizes["gate_up_bytes"], np.uint8)
    dn = np.empty(sizes["down_bytes"], np.uint8)
    ctx = ctx or _lib.default_context()
    ctx.check(_lib.lib.nb_moe_pack_host(ctx.ptr, ctypes.byref(d), ctypes.byref(w), gu.ctypes.data, gu.nbytes,
                                        dn.ctypes.data, dn.nbytes))
    del keep
    ts = [None if t is None else np.array(t, dtype=np.float32) for t in (qm.gate_up.tensor_scales,
                                                                          qm.down.tensor_scales)]
    return PackedMoe(spec=spec, gate_up=gu, down=dn, gate_up_scales=ts[0], down_scales=ts[1],
                     gate_up_exp=(int(d.gate_up.scale_exp_min), int(d.gate_up.scale_exp_max)),
                     down_exp=(int(d.down.scale_exp_min), int(d.down.scale_exp_max)))


def _gate_up_row_map(spec):
    """For each row r of one expert's packed gate_up (16 * ceil(I / 8) rows:
    row block b holds gate rows 8b .. 8b+7, then up rows 8b .. 8b+7; nibble.h,
    nb_moe_pack_host) the checkpoint row it holds, or -1 for padding."""
    I = spec.intermediate
    r = np.arange(16 * ((I + 7) // 8))
    i = 8 * (r // 16) + (r % 16) % 8
    up = (r % 16) >= 8
    if spec.gate_up_layout == "interleaved":
        src = 2 * i + up
    else:
        src = i + up * I
    return np.where(i < I, src, -1)


def moe_unpack(pm, ctx=None):
    """The checkpoint layout of a PackedMoe (nb_unpack_host per expert, the
    gate_up rows put back in the checkpoint's order): a QuantizedMoe without
    biases whose codes and scales are exactly the bytes that were packed."""
    if not isinstance(pm, PackedMoe):
        raise TypeError(f"nibble: expected a nibble.PackedMoe, got {type(pm).__name__}")
    spec = pm.spec
    sizes = packed_sizes(spec)
    E, H, I = spec.experts, spec.hidden, spec.intermediate
    for name, a, want in (("gate_up", pm.gate_up, sizes["gate_up_bytes"]), ("down", pm.down, sizes["down_bytes"])):
        if not isinstance(a, np.ndarray) or a.dtype != np.uint8 or a.ndim != 1 or a.size != want:
            raise ValueError(f"nibble: PackedMoe.{name} must be a 1-D uint8 array of {want} bytes")
    rows = _gate_up_row_map(spec)
    proj = {}
    for name, n, k, data, stride, exp in (
            ("gate_up", len(rows), H, pm.gate_up, sizes["gate_up_expert_bytes"], pm.gate_up_exp),
            ("down", H, I, pm.down, sizes["down_expert_bytes"], pm.down_exp)):
        g = _GROUP[_format(spec.format)]
        codes = np.empty((E, n, k // 2), np.uint8)
        scales = np.empty((E, n, k // g), np.uint8)
        for e in range(E):
            pw = PackedWeight(data=data[e * stride:(e + 1) * stride], n=n, k=k, format=spec.format,
                                 tensor_scale=1.0, scale_exp_min=exp[0], scale_exp_max=exp[1])
            qw = unpack(pw, ctx)
            codes[e], scales[e] = qw.codes, qw.scales
        proj[name] = (codes, scales)
    keep = rows >= 0
    src = rows[keep]
    gu_codes = np.empty((E, 2 * I, H // 2), np.uint8)
    gu_scales = np.empty((E, 2 * I, proj["gate_up"][1].shape[2]), np.uint8)
    gu_codes[:, src] = proj["gate_up"][0][:, keep]
    gu_scales[:, src] = proj["gate_up"][1][:, keep]
    return QuantizedMoe(
        gate_up=QuantizedExperts(gu_codes, gu_scales, pm.gate_up_scales, 2 * I, H, spec.format),
        down=QuantizedExperts(proj["down"][0], proj["down"][1], pm.down_scales, H, I, spec.format),
        activation=spec.activation, gate_up_layout=spec.gate_up_layout, limit=spec.limit, alpha=spec.alpha)


def _routing(topk_ids, topk_weights, m):
    ids = np.asarray(topk_ids)
    wts = np.asarray(topk_weights)
    if ids.ndim != 2 or ids.shape[0] != m or ids.shape[1] < 1 or not np.issubdtype(ids.dtype, np.integer):
        raise ValueError(f"nibble: topk_ids must be an integer array [m = {m}, top_k], got {ids.dtype} {ids.shape}")
    if wts.shape != ids.shape or not np.issubdtype(wts.dtype, np.floating):
        raise ValueError(f"nibble: topk_weights must be a float array of topk_ids' shape {ids.shape}, got "
                         f"{wts.dtype} {wts.shape}")
    if ids.size and (ids.min() < np.iinfo(np.int32).min or ids.max() > np.iinfo(np.int32).max):
        raise ValueError("nibble: topk_ids outside the int32 range")
    return np.ascontiguousarray(ids, np.int32), np.ascontiguousarray(wts, np.float32)


def moe_reference(x, topk_ids, topk_weights, moe, out_dtype=None, ctx=None):
    """y [m, H] = the MoE MLP of x [m, H] with the host reference.

    x: float32, float16 or uint16 (BF16 bits); topk_ids [m, top_k] integers
    and topk_weights [m, top_k] floats (converted to int32 and float32, as
    the C API takes them); moe: a QuantizedMoe (its biases, when set, must
    have x's dtype) or a PackedMoe (unpacked first; no biases).
    out_dtype None: nb_moe_mlp_host, y of x's dtype rounded where nibble.h
    specifies (h, each slot's output, the combine); np.float64:
    nb_moe_mlp_host_f64, nothing rounded (the yardstick)."""
    if isinstance(moe, PackedMoe):
        moe = moe_unpack(moe, ctx)
    if not isinstance(moe, QuantizedMoe):
        raise TypeError(f"nibble: moe must be a nibble.QuantizedMoe or PackedMoe, got {type(moe).__name__}")
    spec = moe.spec
    x = _as_array(x, "x")
    act = _nb_dtype(x.dtype, "x")
    if x.ndim != 2 or x.shape[0] < 1 or x.shape[1] != spec.hidden:
        raise ValueError(f"nibble: x has shape {x.shape}; expected [m >= 1, hidden = {spec.hidden}]")
    m = x.shape[0]
    ids, wts = _routing(topk_ids, topk_weights, m)
    f64 = out_dtype is not None and np.dtype(out_dtype) == np.float64
    if out_dtype is not None and not f64:
        raise ValueError(f"nibble: out_dtype must be None (x's dtype) or np.float64, got {out_dtype!r}")
    d = spec.desc(m, ids.shape[1], act)
    w, keep = _moe_weights(moe)
    for name, b, shape in (("gate_up_bias", moe.gate_up_bias, (spec.experts, 2 * spec.intermediate)),
                           ("down_bias", moe.down_bias, (spec.experts, spec.hidden))):
        if b is None:
            continue
        b = _as_array(b, name)
        if b.dtype != x.dtype or b.shape != shape:
            raise ValueError(f"nibble: {name} is {b.dtype} {b.shape}; expected {x.dtype} {shape} (x's dtype)")
        b = np.ascontiguousarray(b)
        keep.append(b)
        setattr(w, name, b.ctypes.data)
    x = np.ascontiguousarray(x)
    y = np.empty((m, spec.hidden), np.float64 if f64 else x.dtype)
    ctx = ctx or _lib.default_context()
    i32, f32 = ctypes.POINTER(ctypes.c_int32), ctypes.POINTER(ctypes.c_float)
    args = (ctx.ptr, ctypes.byref(d), x.ctypes.data, ctypes.byref(w), ids.ctypes.data_as(i32),
            wts.ctypes.data_as(f32))
    if f64:
        ctx.check(_lib.lib.nb_moe_mlp_host_f64(*args, y.ctypes.data_as(ctypes.POINTER(ctypes.c_double))))
    else:
        ctx.check(_lib.lib.nb_moe_mlp_host(*args, y.ctypes.data))
    return y
