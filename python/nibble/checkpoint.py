"""Checkpoint reading through libnibble's checkpoint API (nibble_io.h): open
a Hugging Face style checkpoint (a .safetensors file, a directory with
model.safetensors or a sharded index, or the index itself), list its files,
tensors and linear layers with the format nibble's C reader detected for
each (ModelOpt NVFP4, compressed-tensors NVFP4/MXFP4, Quark MXFP4, gpt-oss
MXFP4, AWQ and GPTQ int4, symmetric GPTQ int8, compressed-tensors
pack-quantized int4/int8, bitsandbytes NF4/FP4, unquantized, or
inconsistent with the reason), and
read tensors and quantized weights as numpy arrays.

    ck = nibble.open_checkpoint("Llama-3.1-8B-NVFP4/")
    for layer in ck.layers:                       # CheckpointLayer records
        print(layer.prefix, layer.format, layer.n, layer.k)
    qw = ck.quantized_weight("model.layers.0.mlp.down_proj")   # nibble.QuantizedWeight
    norm = ck.tensor("model.norm.weight")         # numpy; BF16 as uint16 bits
    ck.close()                                    # or `with nibble.open_checkpoint(...) as ck:`

Arrays are copies: they stay valid after close().  Reading needs the
checkpoint API in libnibble (built with the package when cJSON is found);
without it open_checkpoint raises ImportError.  Corrupt or unreadable files raise
nibble.Error with the reader's message (status NB_ERR_CORRUPT, NB_ERR_IO,
...); unknown names raise KeyError.
"""

import ctypes
import dataclasses
from dataclasses import dataclass
from typing import Optional, Tuple

import numpy as np

from . import _lib
from . import DEFAULT_SCALE_RULE, QuantizedExperts, QuantizedMoe, QuantizedWeight, _FORMAT_NAMES, _RULE_NAMES, _RULES, _SCALE_NP, _buffers, _zeros_np, _format, _rule_name, _scale_type
from ._lib import CkptMoeProj, Error, Format, ScaleType, Status
from .moe import ACTIVATIONS, GATE_UP_LAYOUTS

_MOE_ACT = {int(v): k for k, v in ACTIVATIONS.items()}
_MOE_LAYOUT = {int(v): k for k, v in GATE_UP_LAYOUTS.items()}

__all__ = ["Checkpoint", "CheckpointLayer", "CheckpointMoe", "TensorInfo", "open_checkpoint", "quantize_checkpoint"]

# safetensors dtype -> numpy dtype of the copy tensor() returns.  BF16 comes
# back as uint16 bits (the package's BF16 convention), the FP8 types as their
# raw bytes (uint8).
_NP_DTYPES = {"BOOL": np.bool_, "U8": np.uint8, "I8": np.int8, "F8_E5M2": np.uint8, "F8_E4M3": np.uint8,
              "F8_E8M0": np.uint8, "F8_E4M3FNUZ": np.uint8, "F8_E5M2FNUZ": np.uint8, "I16": np.int16,
              "U16": np.uint16, "F16": np.float16, "BF16": np.uint16, "I32": np.int32, "U32": np.uint32,
              "F32": np.float32, "C64": np.complex64, "F64": np.float64, "I64": np.int64, "U64": np.uint64}


@dataclass(frozen=True)
class TensorInfo:
    """One tensor: name, safetensors dtype string ("BF16"), shape, byte size,
    and the prefix of the linear layer it belongs to (None if none)."""
    name: str
    dtype: str
    shape: Tuple[int, ...]
    bytes: int
    layer: Optional[str]


@dataclass(frozen=True)
class CheckpointLayer:
    """A linear layer as the C reader classified it (nb_ckpt_layer).

    format: "modelopt-nvfp4", "ct-nvfp4", "ct-mxfp4", "quark-mxfp4",
    "gptoss-mxfp4", "awq-int4", "gptq-int4", "ct-int4", "ct-int4-sym",
    "ct-int8", "bnb-nf4", "bnb-fp4", "gptq-int8", "none" (unquantized) or
    "inconsistent" (see `problem`).
    quant_format: the library's format name ("nvfp4", "int4", "nf4", ...) for
    the quantized layers, else None.  k_permuted: the layer's k is reordered
    (act-order); Checkpoint.perm gives the activation permutation.
    n, k: out and in features (per expert); experts: gpt-oss expert count
    (0 for a dense layer); tensor_scale: NVFP4 weight_scale_2 (or the
    reciprocal of compressed-tensors' global scale), 1 for MXFP4."""
    index: int
    prefix: str
    format: str
    n: int
    k: int
    experts: int
    tensor_scale: float
    bytes: int
    weight_dtype: str
    decided_by: str
    config_mismatch: bool
    problem: str
    excluded: bool = False          # a config's exclude / ignore list names the layer
    excluded_by: str = ""           # the entry that does
    quant_format: Optional[str] = None  # the weight format the layout holds (nb_ckpt_format_weight)
    k_permuted: bool = False
    moe_group: Optional[str] = None     # prefix of the expert group the layer belongs to (nb_ckpt_layer_moe)


@dataclass(frozen=True)
class CheckpointMoe:
    """An expert group as the C reader found it (nb_ckpt_moe): E experts'
    gate_up [2I, H] and down [H, I] weights of one MoE MLP, stored as gpt-oss
    does (two tensors holding every expert; per_expert False) or as one
    layer per expert and projection (ModelOpt, compressed-tensors, Quark
    exports of Qwen3-MoE, Mixtral ...).  format is the members' layout
    ("gptoss-mxfp4", "modelopt-nvfp4", ...) or "inconsistent" (see problem);
    quant_format the weight format; activation "swiglu" or "swiglu_oai",
    gate_up_layout "concat" or "interleaved" (the rows as read); top_k from
    config.json (0 when absent); gate_up_bias / down_bias the names of the
    [E, 2I] / [E, H] bias tensors, or None."""
    index: int
    prefix: str
    format: str
    quant_format: Optional[str]
    experts: int
    hidden: int
    intermediate: int
    activation: str
    gate_up_layout: str
    per_expert: bool
    fused: bool
    top_k: int
    limit: float
    alpha: float
    gate_up_bias: Optional[str]
    down_bias: Optional[str]
    gate_up_scales_differ: bool
    layers: int
    bytes: int
    problem: str


class Checkpoint(_lib.Handle):
    """An open checkpoint (nb_ckpt).  See the module docstring; close() (or
    the end of a `with` block) releases the file mappings."""

    def __init__(self, path):
        io = _lib.io_lib()
        self._io = io
        self.path = str(path)
        ptr = _lib.CkptP()
        _lib.check(io.nb_ckpt_open(self.path.encode(), ctypes.byref(ptr)))
        self._ptr = ptr
        try:
            self._read_tables()
        except BaseException:
            self.close()
            raise

    # ------------------------------------------------------------ tables

    def _call(self, fn, *args):
        _lib.check(fn(self.ptr, *args))

    def _read_tables(self):
        io = self._io
        count = ctypes.c_size_t(0)
        self._call(io.nb_ckpt_layer_count, ctypes.byref(count))
        layers = []
        for i in range(count.value):
            L = _lib.CkptLayer()
            self._call(io.nb_ckpt_layer_at, i, ctypes.byref(L))
            layers.append(CheckpointLayer(
                index=i, prefix=L.prefix.decode(), format=_lib.CKPT_FORMATS.get(L.format, "unknown"), n=L.n, k=L.k,
                experts=L.experts, tensor_scale=float(L.tensor_scale), bytes=L.bytes,
                weight_dtype=_lib.ST_DTYPES.get(L.weight_dtype, "?"),
                decided_by=_lib.CKPT_SOURCES.get(L.decided_by, "unknown"), config_mismatch=bool(L.config_mismatch),
                problem=L.problem.decode("utf-8", "replace"), excluded=bool(L.excluded),
                excluded_by=L.excluded_by.decode("utf-8", "replace") if L.excluded_by else "",
                quant_format=_quant_format(L.format), k_permuted=bool(L.k_permuted)))

        self._call(io.nb_ckpt_tensor_count, ctypes.byref(count))
        tensors, self._tensor_index = [], {}
        for i in range(count.value):
            t, li = _lib.StTensor(), ctypes.c_int64(-1)
            self._call(io.nb_ckpt_tensor_at, i, ctypes.byref(t), ctypes.byref(li))
            info = TensorInfo(name=t.name.decode(), dtype=_lib.ST_DTYPES.get(t.dtype, "?"),
                              shape=tuple(int(t.shape[d]) for d in range(t.rank)), bytes=int(t.bytes),
                              layer=layers[li.value].prefix if li.value >= 0 else None)
            tensors.append(info)
            self._tensor_index[info.name] = i
        self.tensors = tensors

        self._call(io.nb_ckpt_moe_count, ctypes.byref(count))
        groups = []
        for i in range(count.value):
            g = _lib.CkptMoe()
            self._call(io.nb_ckpt_moe_at, i, ctypes.byref(g))
            groups.append(CheckpointMoe(
                index=i, prefix=g.prefix.decode(), format=_lib.CKPT_FORMATS.get(g.format, "unknown"),
                quant_format=_quant_format(g.format), experts=int(g.experts), hidden=int(g.hidden),
                intermediate=int(g.intermediate), activation=_MOE_ACT.get(g.activation, "unknown"),
                gate_up_layout=_MOE_LAYOUT.get(g.gate_up_layout, "unknown"), per_expert=bool(g.per_expert),
                fused=bool(g.fused), top_k=int(g.top_k), limit=float(g.limit), alpha=float(g.alpha),
                gate_up_bias=tensors[g.gate_up_bias].name if g.gate_up_bias >= 0 else None,
                down_bias=tensors[g.down_bias].name if g.down_bias >= 0 else None,
                gate_up_scales_differ=bool(g.gate_up_scales_differ), layers=int(g.layers), bytes=int(g.bytes),
                problem=g.problem.decode("utf-8", "replace")))
        self.moe_groups = groups
        self._moe_by_prefix = {g.prefix: g for g in groups}
        for i, L in enumerate(layers):
            gi = ctypes.c_int64(-1)
            self._call(io.nb_ckpt_layer_moe, i, ctypes.byref(gi), None, None)
            if gi.value >= 0:
                layers[i] = dataclasses.replace(L, moe_group=groups[gi.value].prefix)
        self.layers = layers
        self._layer_by_prefix = {L.prefix: L for L in layers}

        self._call(io.nb_ckpt_file_count, ctypes.byref(count))
        files = []
        for i in range(count.value):
            p, b = ctypes.c_char_p(), ctypes.c_uint64(0)
            self._call(io.nb_ckpt_file_at, i, ctypes.byref(p), ctypes.byref(b))
            files.append((p.value.decode(), int(b.value)))
        self.files = files

        c = _lib.CkptConfig()
        self._call(io.nb_ckpt_get_config, ctypes.byref(c))

        def s(v):
            return v.decode() if v else None
        self.config = {"declared": _lib.CKPT_FORMATS.get(c.declared, "unknown"),
                       "declared_by": _lib.CKPT_SOURCES.get(c.source, "unknown"), "quant_method": s(c.quant_method),
                       "quant_algo": s(c.quant_algo), "ct_format": s(c.ct_format),
                       "has_config_json": bool(c.has_config_json), "has_hf_quant_config": bool(c.has_hf_quant_config)}

    # ----------------------------------------------------------- queries

    @property
    def ptr(self):
        if not self._ptr:
            raise ValueError(f"nibble: checkpoint {self.path} is closed")
        return self._ptr

    def layer(self, prefix):
        """The CheckpointLayer of `prefix` (KeyError if there is none)."""
        try:
            return self._layer_by_prefix[prefix]
        except KeyError:
            raise KeyError(f"nibble: {self.path} has no linear layer {prefix!r}") from None

    def tensor_info(self, name):
        try:
            return self.tensors[self._tensor_index[name]]
        except KeyError:
            raise KeyError(f"nibble: {self.path} has no tensor {name!r}") from None

    def __contains__(self, name):
        return name in self._tensor_index

    def tensor(self, name):
        """A copy of tensor `name` as a numpy array of its shape: BF16 as
        uint16 bits, FP8 types as uint8 bytes, the others as their numpy
        type.  F4/F6 tensors (sub-byte elements) raise nibble.Error
        (NB_ERR_UNSUPPORTED)."""
        info = self.tensor_info(name)
        dt = _NP_DTYPES.get(info.dtype)
        if dt is None:
            raise Error(Status.ERR_UNSUPPORTED, "NB_ERR_UNSUPPORTED",
                        f"{name}: dtype {info.dtype} has no numpy equivalent (sub-byte elements)")
        t, li = _lib.StTensor(), ctypes.c_int64(-1)
        self._call(self._io.nb_ckpt_tensor_at, self._tensor_index[name], ctypes.byref(t), ctypes.byref(li))
        return _copy(t.data, t.bytes, dt, info.shape)

    def _index(self, layer):
        if isinstance(layer, CheckpointLayer):
            return layer.index
        if isinstance(layer, str):
            return self.layer(layer).index
        if isinstance(layer, int) and not isinstance(layer, bool):
            return layer
        raise TypeError(f"nibble: layer must be a prefix, an index or a CheckpointLayer, got {type(layer).__name__}")

    def quantized_weight(self, layer, expert=0):
        """The quantized weight of a layer (prefix, index or CheckpointLayer)
        as a nibble.QuantizedWeight in nibble's checkpoint layout (codes,
        scales, zeros for int4 and int4_hqq, tensor scale), read through
        nb_ckpt_layer_weight_v2: AWQ, GPTQ, compressed-tensors integers and
        bitsandbytes layers come back converted, bit for bit as their
        producers dequantize them; ModelOpt and compressed-tensors NVFP4 both
        with the ModelOpt tensor scale; `expert` selects a gpt-oss expert.
        Unquantized or inconsistent layers raise nibble.Error
        (NB_ERR_UNSUPPORTED)."""
        index = self._index(layer)
        d = _lib.WeightDesc()
        _lib.check(self._io.nb_ckpt_layer_weight_v2(self.ptr, index, int(expert), ctypes.byref(d), None, None))
        n, k, g = int(d.n), int(d.k), int(d.group_size)
        fmt = _lib.Format(d.format)
        info = _lib.FORMAT_INFO[fmt]
        st = _lib.ScaleType(d.scale_type)
        codes = np.empty((n, k * info["element_bits"] // 8), np.uint8)
        scales = np.empty((n, k // g), _SCALE_NP[st])
        zeros = np.empty((n, k // g), _zeros_np(info, st)) if info["zero_point"] else None
        sz = _lib.WeightSizesV2(codes_bytes=codes.nbytes, scales_bytes=scales.nbytes,
                                zeros_bytes=zeros.nbytes if zeros is not None else 0)
        b = _buffers(codes, scales, zeros)
        _lib.check(self._io.nb_ckpt_layer_weight_v2(self.ptr, index, int(expert), ctypes.byref(d), ctypes.byref(b),
                                                    ctypes.byref(sz)))
        default = g == info["group_size"] and st == info["scale_type"]
        return QuantizedWeight(codes=codes, scales=scales, tensor_scale=float(d.tensor_scale), n=n, k=k,
                               format=_FORMAT_NAMES[fmt],
                               scale_rule=_RULE_NAMES.get(_lib.MxScaleRule(d.scale_rule), DEFAULT_SCALE_RULE),
                               group=None if default else g, scale_type=None if default else st.name.lower(),
                               zeros=zeros)

    def weight_layout(self, layer, expert=0):
        """How quantized_weight would return a layer's weight, without
        reading it (nb_ckpt_layer_weight_v2 with no buffers): {"format",
        "n", "k", "group" (None: the format's default), "scale_type" (None:
        the default; "f16", "bf16", ...)}.  Unquantized or inconsistent
        layers raise nibble.Error (NB_ERR_UNSUPPORTED)."""
        index = self._index(layer)
        d = _lib.WeightDesc()
        _lib.check(self._io.nb_ckpt_layer_weight_v2(self.ptr, index, int(expert), ctypes.byref(d), None, None))
        fmt = _lib.Format(d.format)
        info = _lib.FORMAT_INFO[fmt]
        g, st = int(d.group_size), _lib.ScaleType(d.scale_type)
        return {"format": _FORMAT_NAMES[fmt], "n": int(d.n), "k": int(d.k),
                "group": None if g == info["group_size"] else g,
                "scale_type": None if st == info["scale_type"] else st.name.lower()}

    def perm(self, layer):
        """The activation permutation of a layer (nb_ckpt_layer_perm): an int32
        array p of length k with Y = X[:, p] . W^T for the weight
        quantized_weight returns (the identity unless layer.k_permuted)."""
        index = self._index(layer)
        L = self.layers[index] if 0 <= index < len(self.layers) else None
        count = L.k if L is not None and L.k > 0 else 0
        out = np.empty(max(count, 1), np.int32)
        _lib.check(self._io.nb_ckpt_layer_perm(self.ptr, index, out.ctypes.data_as(ctypes.POINTER(ctypes.c_int32)),
                                               count))
        return out[:count]

    def moe_group(self, prefix):
        """The CheckpointMoe of expert group `prefix` (KeyError if none)."""
        try:
            return self._moe_by_prefix[prefix]
        except KeyError:
            raise KeyError(f"nibble: {self.path} has no expert group {prefix!r}") from None

    def _moe_index(self, group):
        if isinstance(group, CheckpointMoe):
            return group.index
        if isinstance(group, str):
            return self.moe_group(group).index
        raise TypeError(f"nibble: group must be a prefix or a CheckpointMoe, got {type(group).__name__}")

    def moe_experts(self, group, proj):
        """Every expert's weight of projection `proj` ("gate_up", "down", and
        for groups of separate gate and up layers "gate", "up") of an expert
        group, copied expert-major (nb_ckpt_moe_read): a
        nibble.QuantizedExperts with each expert's tensor scale (NVFP4).  An
        inconsistent group, or gate_up of an expert whose gate and up tensor
        scales differ, raises nibble.Error (NB_ERR_UNSUPPORTED, naming it)."""
        index = self._moe_index(group)
        try:
            p = CkptMoeProj[str(proj).upper()]
        except KeyError:
            raise ValueError(f"nibble: unknown projection {proj!r}; expected gate_up, down, gate or up") from None
        d = _lib.WeightDesc()
        g = self.moe_groups[index]
        E = max(g.experts, 1)
        ts = np.empty(E, np.float32)
        fp = ctypes.POINTER(ctypes.c_float)
        self._call(self._io.nb_ckpt_moe_read, index, int(p), ctypes.byref(d), None, None, ts.ctypes.data_as(fp), E)
        n, k = int(d.n), int(d.k)
        fmt = _lib.Format(d.format)
        sz = _lib.WeightSizesV2()
        _lib.check(_lib.lib.nb_weight_get_sizes_v2(ctypes.byref(d), ctypes.byref(sz)))
        codes = np.empty((E, n, sz.codes_bytes // n), np.uint8)
        scales = np.empty((E, n, sz.scales_bytes // n), np.uint8)
        cap = _lib.WeightSizesV2(codes_bytes=codes.nbytes, scales_bytes=scales.nbytes)
        b = _buffers(codes, scales, None)
        self._call(self._io.nb_ckpt_moe_read, index, int(p), ctypes.byref(d), ctypes.byref(b), ctypes.byref(cap),
                   ts.ctypes.data_as(fp), E)
        tensor_scales = ts if _lib.FORMAT_INFO[fmt]["tensor_scale"] else None
        return QuantizedExperts(codes=codes, scales=scales, tensor_scales=tensor_scales, n=n, k=k,
                                format=_FORMAT_NAMES[fmt])

    def moe_bias_names(self, group):
        """The bias tensors of an expert group: (gate_up names, down names),
        or None when it has none.  A gpt-oss group's are its [E, 2I] and
        [E, H] tensors (one name each, CheckpointMoe.gate_up_bias /
        down_bias); a per-expert fused group's (gpt-oss experts written one
        layer per expert, as `nibble convert` and save_pretrained write them)
        are G.<e>.gate_up_proj.bias [2I] and G.<e>.down_proj.bias [H], one
        name per expert.  Some of those present but not all, or one of
        another shape or dtype, raises nibble.Error (NB_ERR_CORRUPT, naming
        it): half a set of biases is never dropped silently."""
        g = self.moe_groups[self._moe_index(group)]
        if g.gate_up_bias or g.down_bias:
            return [n for n in (g.gate_up_bias,) if n], [n for n in (g.down_bias,) if n]
        if not (g.per_expert and g.fused) or g.format == "inconsistent":
            return None
        E, H, I = g.experts, g.hidden, g.intermediate
        want = {f"{g.prefix}.{e}.{proj}.bias": n for e in range(E)
                for proj, n in (("gate_up_proj", 2 * I), ("down_proj", H))}
        present = [name for name in want if name in self]
        if not present:
            return None
        for name, n in want.items():
            if name not in self:
                raise Error(Status.ERR_CORRUPT, "NB_ERR_CORRUPT",
                            f"{self.path}: expert group {g.prefix} has {present[0]} but not {name} (the biases of "
                            "per-expert layers come for every expert and projection, or for none)")
            info = self.tensor_info(name)
            if info.shape != (n,) or info.dtype not in ("BF16", "F16", "F32"):
                raise Error(Status.ERR_CORRUPT, "NB_ERR_CORRUPT",
                            f"{self.path}: {name} is {info.dtype} {list(info.shape)}; expected BF16, F16 or F32 "
                            f"[{n}]")
        names = list(want)
        return names[0::2], names[1::2]

    def moe(self, group):
        """An expert group as a nibble.QuantizedMoe: gate_up and down
        (moe_experts), the activation, row order, limit and alpha the reader
        decided, and the biases (moe_bias_names: gpt-oss's [E, 2I] / [E, H]
        tensors, or per-expert ones stacked) as numpy arrays of their own
        dtype (BF16 as uint16 bits)."""
        g = self.moe_groups[self._moe_index(group)]
        if g.format == "inconsistent":
            raise Error(Status.ERR_UNSUPPORTED, "NB_ERR_UNSUPPORTED",
                        f"{self.path}: expert group {g.prefix} is inconsistent: {g.problem}")
        biases = self.moe_bias_names(g) or ([], [])
        gu_bias, dn_bias = (None if not names else self.tensor(names[0]) if len(names) == 1 and not g.per_expert
                            else np.stack([self.tensor(n) for n in names]) for names in biases)
        return QuantizedMoe(gate_up=self.moe_experts(g, "gate_up"), down=self.moe_experts(g, "down"),
                            activation=g.activation, gate_up_layout=g.gate_up_layout,
                            limit=g.limit if g.activation == "swiglu_oai" else None,
                            alpha=g.alpha if g.activation == "swiglu_oai" else None,
                            gate_up_bias=gu_bias, down_bias=dn_bias)

    def summary(self):
        """{format name: number of layers}."""
        out = {}
        for L in self.layers:
            out[L.format] = out.get(L.format, 0) + 1
        return out

    # ----------------------------------------------------------- lifetime

    def _release(self, ptr):
        self._io.nb_ckpt_close(ptr)

    def __repr__(self):
        state = "closed" if not getattr(self, "_ptr", None) else f"{len(self.tensors)} tensors"
        return f"<nibble.Checkpoint {self.path!r}: {state}, layers {self.summary()}>"


def _quant_format(ckpt_format):
    """The format's name in the library's table ("nvfp4", "int4", "nf4", ...)
    for a quantized layout, None otherwise."""
    f = _lib.ckpt_weight_format(ckpt_format)
    return _lib.FORMAT_INFO[f]["name"] if f is not None else None


def _copy(ptr, nbytes, dtype, shape):
    """A numpy copy of nbytes at a C pointer (into the file mapping)."""
    addr = ctypes.cast(ptr, ctypes.c_void_p).value if not isinstance(ptr, int) else ptr
    out = np.empty(shape, dtype=dtype)
    if nbytes != out.nbytes:
        raise Error(Status.ERR_INTERNAL, "NB_ERR_INTERNAL", f"tensor of {nbytes} bytes does not fill shape {shape}")
    if nbytes:
        ctypes.memmove(out.ctypes.data, addr, nbytes)
    return out


def open_checkpoint(path):
    """Open a checkpoint with nibble's C reader; returns a Checkpoint."""
    return Checkpoint(path)


def quantize_checkpoint(src, dst, format="nvfp4", scale_rule=DEFAULT_SCALE_RULE, exclude=(), default_excludes=True,
                        progress=None, device="auto", allow_empty=False, method="rtn", group_size=None,
                        scale_type=None, fused_scales=True):
    """`nibble quantize` (nb_ckpt_quantize): write a ModelOpt NVFP4, Quark
    MXFP4, compressed-tensors pack-quantized int4 / int4_sym / int8,
    bitsandbytes nf4 / bnb_fp4 or HQQ int4_hqq checkpoint of the
    BF16/F16/F32 checkpoint `src` into directory `dst` (new or empty).
    group_size and scale_type apply to int4 / int4_sym / int8: None (the
    format's default: 128, "f16"), 32, 64, 128 or "channel" (one group per
    row); "f16" or "bf16"; and to int4_hqq (hqq's HQQLinear state_dicts, as
    save_pretrained writes them): None (64), 32, 64 or 128, and method
    "hqq" for hqq's optimizer.
    group_size also gives nf4's and bnb_fp4's blocks: None (64), 32, 64,
    ..., 4096 (bitsandbytes' serialization without double quantization,
    every tensor as bitsandbytes' own quantize_4bit and QuantState.as_dict
    write it, but codes at midpoints between two table values).  The integer
    and table formats are quantized on the CPU (device "gpu" and method
    "mse" raise nibble.Error).
    scale_rule: the MXFP4 block exponent rule, "even" by default as
    everywhere in nibble.  exclude: fnmatch patterns on layer
    prefixes; default_excludes adds "*lm_head" and "*embed*".  progress, if
    given, is called as progress(i, n, bytes_done, bytes_total, name).
    device: "gpu" (CUDA device 0, nb_quantize), "cpu" (the C reference) or
    "auto" (the GPU when there is one); the bytes are the same.  A checkpoint
    with nothing to quantize raises nibble.Error (NB_ERR_UNSUPPORTED, with
    the reason) unless allow_empty.  fused_scales (NVFP4): the projections
    engines run as one layer (q_proj / k_proj / v_proj and gate_proj /
    up_proj of one module) share one tensor scale, the one their rows
    quantized together would get, as ModelOpt exports them, so that
    nibble.torch.fuse_projections can fuse them after loading; False gives
    each layer its own.  dst is written into a staging directory
    next to it and published with one rename (never left partial).  Returns
    the summary as a dict ("device" says "cpu" or "gpu", "device_name" which;
    "weights_unsupported" counts weights copied for their dtype).  method:
    "rtn" (default) or "mse" (nibble.quantize's; CPU only: device "auto"
    then quantizes on the CPU, "gpu" raises).

    A gpt-oss checkpoint (config.json model_type "gpt_oss") with format
    "mxfp4" is written in gpt-oss's own MXFP4 layout: every experts module's
    gate_up_proj [E, H, 2I] and down_proj [E, I, H] become *_blocks /
    *_scales (each expert transposed to [N, K], rows in the input's order),
    the linear weights stay as they are and config.json gets gpt-oss's
    quantization_config ("experts_quantized" counts the experts tensors)."""
    io = _lib.io_lib()
    fmt = _format(format)
    scale_rule = _rule_name(scale_rule, scale_rule)
    if device not in _lib.CKPT_DEVICES:
        raise ValueError(f"nibble: unknown device {device!r}; expected one of {sorted(_lib.CKPT_DEVICES)}")
    if isinstance(exclude, str):
        exclude = [exclude]
    opts = _lib.CkptQuantizeOpts()
    _lib.check(io.nb_ckpt_quantize_opts_init(ctypes.byref(opts)))
    opts.format = fmt
    opts.mx_rule = _RULES[scale_rule]
    pats = (ctypes.c_char_p * max(1, len(exclude)))(*[str(p).encode() for p in exclude])
    opts.exclude = ctypes.cast(pats, ctypes.POINTER(ctypes.c_char_p))
    opts.nexclude = len(exclude)
    opts.no_default_excludes = 0 if default_excludes else 1
    opts.device = _lib.CKPT_DEVICES[device]
    opts.allow_empty = 1 if allow_empty else 0
    opts.fused_scales = 1 if fused_scales else 0
    if method not in ("rtn", "mse", "hqq"):
        raise ValueError(f"nibble: unknown method {method!r}; expected 'rtn', 'mse' or 'hqq'")
    opts.method = {"rtn": 0, "mse": 1, "hqq": 2}[method]
    integer = fmt in (Format.INT4, Format.INT4_SYM, Format.INT8, Format.INT4_HQQ)
    table = fmt in (Format.NF4, Format.BNB_FP4)
    if (group_size is not None and not (integer or table)) or (scale_type is not None and not integer):
        raise ValueError(f"nibble: group_size applies to int4, int4_sym, int8, int4_hqq, nf4 and bnb_fp4, "
                         f"scale_type to the first four, not to {format!r}")
    if group_size is not None:
        blocks = (32, 64, 128) if integer else tuple(32 << i for i in range(8))
        if group_size == "channel" and integer and fmt != Format.INT4_HQQ:
            opts.group_size = -1     # NB_CKPT_GROUP_PER_CHANNEL
        elif isinstance(group_size, int) and not isinstance(group_size, bool) and group_size in blocks:
            opts.group_size = group_size
        else:
            raise ValueError(f"nibble: group_size {group_size!r}; expected "
                             f"{'32, 64, 128' if fmt == Format.INT4_HQQ else '32, 64, 128 or channel' if integer else '32, 64, ..., 4096'}")
    if scale_type is not None:
        st = _scale_type(scale_type, fmt)
        if st not in (ScaleType.F16, ScaleType.BF16):
            raise ValueError(f"nibble: scale_type {scale_type!r}; integer checkpoints hold 'f16' or 'bf16' scales")
        opts.scale_type = int(st)
    if progress is not None:
        def cb(_user, i, n, done, total, name):
            progress(int(i), int(n), int(done), int(total), name.decode() if name else "")
        opts.progress = _lib.CkptProgress(cb)
    summary = _lib.CkptQuantizeSummary()
    _lib.check(io.nb_ckpt_quantize(str(src).encode(), str(dst).encode(), ctypes.byref(opts), ctypes.byref(summary)))
    out = {name: int(getattr(summary, name)) for name, _ in summary._fields_
           if name not in ("device", "device_name", "reserved")}
    out["device"] = {v: k for k, v in _lib.CKPT_DEVICES.items()}[summary.device]
    out["device_name"] = summary.device_name.decode("utf-8", "replace")
    return out
