"""nibble.tp: tensor parallelism over torch.distributed (Megatron's split of
a transformer's linear layers), with nibble's quantized weights or plain ones.

    import torch.distributed as dist, nibble.tp as tp
    dist.init_process_group("nccl")                       # one process per GPU (torchrun)
    col = tp.ColumnParallelLinear.from_linear(up_proj, format="nvfp4")     # n split: y holds this rank's columns
    row = tp.RowParallelLinear.from_linear(down_proj, format="nvfp4")      # k split: partial y, then all_reduce
    info = tp.shard_llama(model, format="nvfp4")          # a transformers Llama, in place

Column-parallel (ColumnParallelLinear): W[n, k] is split along n, its output
features.  Rank r holds rows [r n/W, (r+1) n/W) and their bias and computes
its slice of y with no communication (gather_output=True all-gathers the
slices into the whole y, for an output head).  Row-parallel
(RowParallelLinear): W is split along k, its input features; rank r takes
x[..., r k/W : (r+1) k/W] (the output of a column-parallel layer, as it
stands) and computes a partial y, which torch.distributed.all_reduce sums
over the group.  The bias is added once: rank 0's shard carries it, inside
its GEMM, so it costs no launch of its own.  Megatron's MLP is gate/up
column-parallel, down row-parallel; attention q/k/v column-parallel (whole
heads per rank), o row-parallel: one all-reduce per block, two per decoder
layer.  All communication is torch.distributed's (NCCL on GPUs, gloo on the
CPU); this module has none of its own.

Shards are slices of the one-GPU weight.  A nibble layer is quantized once,
whole (nibble.torch's quantizers; an NVFP4 weight keeps its one tensor
scale), and split in the checkpoint layout (split_weight): every shard's
codes, block scales and int4 zero points are byte for byte a slice of the
whole weight's, and packed, whole 16-row blocks (n split) or whole 128-wide
k chunks (k split, when k/W is a multiple of 128) of its packed bytes.  So
TP = W computes what TP = 1 computes, but for the order of summation: a
row-parallel y is the rounded sum of W rounded partial sums (each partial
GEMM rounds its float32 accumulator to the activation dtype, the
all-reduce adds and rounds), where one GPU rounds one float32 sum once.
Splits that do not fall on the format's group (k) or on 16-row blocks (n)
are refused with ValueError, as are uneven splits, k splits of a weight with
one group per row or with an activation permutation (act-order GPTQ), and
attention head counts the world size does not divide.

reduce_dtype (RowParallelLinear, shard_llama): the dtype of the all-reduce.
None (default) reduces in the activation dtype.  torch.float32 converts the
partials first and rounds the sum once: with two ranks that is bit for bit
the same result (NCCL's and gloo's BF16 / FP16 sum converts both operands to
float32, adds and rounds once: one addition for two operands; tested on
gloo), so it only costs bandwidth and two conversions; with more ranks it
saves W - 2 roundings of the running sum.

On the CPU, nibble::gemm runs its host reference (nibble.torch), so all of
this runs over gloo without a GPU, for tests; on GPUs it is meant for NCCL.
Keep NVLink SHARP off on machines where multicast objects must not be
created: NCCL_NVLS_ENABLE=0 in the environment before init_process_group
(python/bench/tp_decode.py sets it).
"""

import dataclasses

import numpy as np
import torch

from . import QuantizedWeight, _FORMAT_NAMES, _lib, quantize as _np_quantize
from . import torch as nt

__all__ = ["split_weight", "ColumnParallelLinear", "RowParallelLinear", "shard_llama", "ROW_BLOCK"]

ROW_BLOCK = 16   # rows per packed row block (docs/formats.md 8.1): n splits fall on these


def _dist():
    import torch.distributed as dist
    if not dist.is_available() or not dist.is_initialized():
        raise RuntimeError("nibble.tp: torch.distributed is not initialized; call "
                           "torch.distributed.init_process_group first (torchrun sets up its environment)")
    return dist


def _group_rank(group):
    """(rank, world size) of this process in `group` (None: the default group)."""
    dist = _dist()
    return dist.get_rank(group), dist.get_world_size(group)


def _check_rank(rank, world_size):
    for name, v in (("rank", rank), ("world_size", world_size)):
        if isinstance(v, bool) or not isinstance(v, int):
            raise TypeError(f"nibble.tp: {name} must be an int, got {type(v).__name__}")
    if world_size < 1 or not 0 <= rank < world_size:
        raise ValueError(f"nibble.tp: rank {rank} of world size {world_size}")


def _span(size, rank, world_size, what, unit, why):
    """[lo, hi) of rank's equal share of `size`; ValueError unless every
    share is a multiple of `unit`."""
    if size % world_size:
        raise ValueError(f"nibble.tp: {what} = {size} does not split evenly over {world_size} ranks")
    share = size // world_size
    if world_size > 1 and share % unit:
        raise ValueError(f"nibble.tp: {what} = {size} over {world_size} ranks gives {share} per rank, not a multiple "
                         f"of {unit} ({why})")
    return rank * share, (rank + 1) * share


def split_weight(qw, dim, rank, world_size):
    """Rank `rank`'s shard of a nibble.QuantizedWeight (checkpoint layout)
    split over `world_size` ranks: dim "n" (output features: rows of codes,
    scales and zero points) or "k" (input features: their columns).  The
    shard's arrays are copies of slices of qw's, with qw's tensor scale,
    group and scale type: byte for byte the whole weight's quantization.

    ValueError when the split does not divide evenly, when an n share is not
    a multiple of ROW_BLOCK (16 rows: the packed layout's row blocks), or a
    k share not a multiple of the group (a group per row cannot be split
    along k; the integer formats also need multiples of 8)."""
    if not isinstance(qw, QuantizedWeight):
        raise TypeError(f"nibble.tp: expected a nibble.QuantizedWeight, got {type(qw).__name__}")
    _check_rank(rank, world_size)
    if dim not in ("n", "k"):
        raise ValueError(f"nibble.tp: dim must be 'n' (column-parallel) or 'k' (row-parallel), got {dim!r}")
    qw.desc()   # checks the arrays against n, k, format, group
    n, k, g = int(qw.n), int(qw.k), qw.group_size
    if dim == "n":
        lo, hi = _span(n, rank, world_size, "n (output features)", ROW_BLOCK, "the packed layout's 16-row blocks")
        cut = (lambda a: None if a is None else np.ascontiguousarray(a[lo:hi]))
        return dataclasses.replace(qw, codes=cut(qw.codes), scales=cut(qw.scales), zeros=cut(qw.zeros), n=hi - lo)
    if world_size > 1 and g == k:
        raise ValueError(f"nibble.tp: this {qw.format} weight has one group per row (group = k = {k}); it cannot be "
                         "split along k")
    info = _lib.FORMAT_INFO[nt._format_code(qw.format)]
    unit = g if info["element"] == _lib.ElementType.E2M1 else int(np.lcm(g, 8))
    lo, hi = _span(k, rank, world_size, "k (input features)", unit,
                   f"{qw.format} groups of {g}" + ("" if unit == g else "; the integer kernels read k in pieces of 8"))
    bits = info["element_bits"]

    def cols(a, per):
        return None if a is None else np.ascontiguousarray(a[:, lo // per:hi // per])
    codes = np.ascontiguousarray(qw.codes[:, lo * bits // 8:hi * bits // 8])
    return dataclasses.replace(qw, codes=codes, scales=cols(qw.scales, g), zeros=cols(qw.zeros, g), k=hi - lo)


def _whole_weight(linear, format, scale_rule=None, method="rtn", group_size=None, scale_type=None):
    """The one-GPU quantization of an nn.Linear's weight as a
    nibble.QuantizedWeight in host memory: nb_quantize on its GPU for the
    FP4 formats (round to nearest), else the host reference - the bytes
    nibble.torch.quantize packs for one GPU."""
    w = linear.weight.detach()
    nt._check_weight(w)
    fmt = nt._format_code(format)
    if w.device.type == "cuda" and method == "rtn" and nt._fp4(fmt):
        codes, scales, d = nt._quantize_device(w, fmt, scale_rule, None, group_size, scale_type)
        rule = nt._rule_name(_lib.MxScaleRule(d.scale_rule), None)
        return QuantizedWeight(codes=codes.cpu().numpy(), scales=scales.cpu().numpy(),
                               tensor_scale=float(d.tensor_scale), n=int(d.n), k=int(d.k), format=_FORMAT_NAMES[fmt],
                               scale_rule=rule)
    return _np_quantize(nt._host_array(w), format=_FORMAT_NAMES[fmt], scale_rule=scale_rule, method=method,
                        group_size=group_size, scale_type=scale_type)


def _source(linear, format, kwargs):
    """What a parallel layer is built from: ("dense", weight, bias) for an
    nn.Linear kept in its dtype (format None), else ("quantized", whole
    QuantizedWeight, bias, perm)."""
    if isinstance(linear, nt.Linear):
        if format is not None and nt._format_code(format) != nt._format_code(linear.format):
            raise ValueError(f"nibble.tp: the layer is {linear.format} already; format={format!r} would requantize "
                             "it (pass format=None)")
        if kwargs:
            raise ValueError(f"nibble.tp: {', '.join(sorted(kwargs))} apply when quantizing an nn.Linear, not to a "
                             "nibble.torch.Linear")
        return "quantized", linear.quantized_weight(), linear.bias, linear.perm
    if not isinstance(linear, torch.nn.Linear):
        raise TypeError(f"nibble.tp: expected a torch.nn.Linear or a nibble.torch.Linear, got {type(linear).__name__}")
    if format is None:
        if kwargs:
            raise ValueError(f"nibble.tp: {', '.join(sorted(kwargs))} need a format")
        return "dense", linear.weight.detach(), linear.bias, None
    return "quantized", _whole_weight(linear, format, **kwargs), linear.bias, None


_QUANT_KW = ("scale_rule", "method", "group_size", "scale_type")


def _quant_kwargs(kw):
    bad = set(kw) - set(_QUANT_KW)
    if bad:
        raise TypeError(f"nibble.tp: unexpected arguments {', '.join(sorted(bad))}")
    return {k: v for k, v in kw.items() if v is not None}


def _device_of(linear, device):
    if device is not None:
        return torch.device(device)
    t = linear.packed if isinstance(linear, nt.Linear) else linear.weight
    return t.device


def _local_module(kind, weight, bias, perm, dim, rank, world_size, device):
    """The shard as a module of its own: nn.Linear (dense) or nibble.torch.Linear."""
    if kind == "dense":
        n, k = weight.shape
        if dim == "n":
            lo, hi = _span(n, rank, world_size, "n (output features)", 1, "")
            w, b = weight[lo:hi], None if bias is None else bias.detach()[lo:hi]
        else:
            lo, hi = _span(k, rank, world_size, "k (input features)", 1, "")
            w, b = weight[:, lo:hi], None if bias is None or rank else bias.detach()
        lin = torch.nn.Linear(w.shape[1], w.shape[0], bias=b is not None, device="meta")
        lin.weight = torch.nn.Parameter(w.to(device).contiguous().clone(), requires_grad=False)
        if b is not None:
            lin.bias = torch.nn.Parameter(b.to(device).clone(), requires_grad=False)
        return lin
    if dim == "k" and perm is not None:
        raise ValueError("nibble.tp: this weight has an activation permutation (act-order); its input features are "
                         "not in the activations' order, so it cannot be split along k")
    shard = split_weight(weight, dim, rank, world_size)
    if dim == "n":
        b = None if bias is None else bias.detach()[shard.n * rank:shard.n * (rank + 1)]
    else:
        b = None if bias is None or rank else bias.detach()
    if b is not None:
        if b.is_meta:
            raise ValueError("nibble.tp: the layer's bias is on the meta device (not loaded yet)")
        b = b.clone()   # (not a view that would keep the whole bias alive)
    return nt.Linear.from_quantized(shard, bias=b, device=device, perm=perm if dim == "n" else None)


class _Parallel(torch.nn.Module):
    """What both parallel layers share: the local shard module, the group,
    this rank and the world size, the whole layer's features."""

    _dim = None

    def __init__(self, local, in_features, out_features, group=None):
        super().__init__()
        if not isinstance(local, (torch.nn.Linear, nt.Linear)):
            raise TypeError(f"nibble.tp: local must be a torch.nn.Linear or a nibble.torch.Linear, got "
                            f"{type(local).__name__}")
        self.rank, self.world_size = _group_rank(group)
        self.group = group
        self.local = local
        self.in_features, self.out_features = int(in_features), int(out_features)
        want = (in_features, out_features // self.world_size) if self._dim == "n" else \
            (in_features // self.world_size, out_features)
        if (local.in_features, local.out_features) != want:
            raise ValueError(f"nibble.tp: the local shard is {local.in_features} -> {local.out_features}; rank "
                             f"{self.rank} of {self.world_size} of a {in_features} -> {out_features} "
                             f"{type(self).__name__} holds {want[0]} -> {want[1]}")

    @classmethod
    def from_linear(cls, linear, group=None, format=None, device=None, **kw):
        """This rank's shard of `linear`: an nn.Linear kept in its dtype
        (format None: a plain slice of its weight), an nn.Linear quantized
        once, whole, to `format` (scale_rule, method, group_size, scale_type
        as nibble.torch.quantize takes them) and then split, or a
        nibble.torch.Linear split as it is.  On `device` (default: the
        layer's own)."""
        opts = cls._options(kw)
        kind, weight, bias, perm = _source(linear, format, _quant_kwargs(kw))
        rank, world_size = _group_rank(group)
        n, k = (weight.n, weight.k) if kind == "quantized" else tuple(weight.shape)
        local = _local_module(kind, weight, bias, perm, cls._dim, rank, world_size, _device_of(linear, device))
        return cls(local, k, n, group, **opts)

    @classmethod
    def from_quantized(cls, qw, bias=None, group=None, device=None, perm=None, **kw):
        """This rank's shard of a whole nibble.QuantizedWeight (checkpoint
        layout) and its bias, packed on `device` (default: the current CUDA
        device; "cpu": host memory, the host reference)."""
        opts = cls._options(kw)
        rank, world_size = _group_rank(group)
        dev = torch.device(device) if device is not None else torch.device("cuda", torch.cuda.current_device())
        local = _local_module("quantized", qw, bias, None if perm is None else torch.as_tensor(perm), cls._dim, rank,
                              world_size, dev)
        return cls(local, qw.k, qw.n, group, **opts)

    @classmethod
    def _options(cls, kw):
        return {}

    def extra_repr(self):
        return (f"in_features={self.in_features}, out_features={self.out_features}, rank={self.rank}, "
                f"world_size={self.world_size}")


class ColumnParallelLinear(_Parallel):
    """y[..., n/W] = this rank's output features of x[..., k] . W^T + bias
    (the whole x; no communication), or with gather_output=True the whole
    y[..., n], the ranks' slices all-gathered in rank order.  `local` is
    the shard module (nibble.torch.Linear or nn.Linear, rows [r n/W,
    (r+1) n/W) of the weight and bias); build one with from_linear or
    from_quantized."""

    _dim = "n"

    def __init__(self, local, in_features, out_features, group=None, gather_output=False):
        super().__init__(local, in_features, out_features, group)
        self.gather_output = bool(gather_output)

    @classmethod
    def _options(cls, kw):
        return {"gather_output": kw.pop("gather_output", False)}

    def forward(self, x):
        y = self.local(x)
        if not self.gather_output or self.world_size == 1:
            return y
        lead, n = y.shape[:-1], y.shape[-1]
        y2 = y.reshape(-1, n).contiguous()
        out = y2.new_empty((self.world_size * y2.shape[0], n))
        _dist().all_gather_into_tensor(out, y2, group=self.group)
        return out.view(self.world_size, -1, n).transpose(0, 1).reshape(*lead, self.world_size * n)

    def extra_repr(self):
        return super().extra_repr() + f", gather_output={self.gather_output}"


class RowParallelLinear(_Parallel):
    """y[..., n] = all_reduce over the group of x_r[..., k/W] . W_r^T, plus
    the bias once (in rank 0's GEMM).  x_r is this rank's slice of the input
    features (what a ColumnParallelLinear gives); `local` is the shard module
    (columns [r k/W, (r+1) k/W) of the weight; rank 0's also holds the
    bias).  reduce_dtype: None (the activation dtype) or torch.float32 (see
    the module docstring)."""

    _dim = "k"

    def __init__(self, local, in_features, out_features, group=None, reduce_dtype=None):
        super().__init__(local, in_features, out_features, group)
        if reduce_dtype not in (None, torch.float32):
            raise ValueError(f"nibble.tp: reduce_dtype must be None (the activation dtype) or torch.float32, got "
                             f"{reduce_dtype!r}")
        if self.rank and local.bias is not None:
            raise ValueError(f"nibble.tp: rank {self.rank}'s row-parallel shard has a bias; only rank 0's carries it "
                             "(it is added once)")
        self.reduce_dtype = reduce_dtype

    @classmethod
    def _options(cls, kw):
        return {"reduce_dtype": kw.pop("reduce_dtype", None)}

    def forward(self, x):
        y = self.local(x)
        if self.world_size == 1:
            return y
        dist = _dist()
        if self.reduce_dtype is not None and y.dtype != self.reduce_dtype:
            t = y.to(self.reduce_dtype)
            dist.all_reduce(t, group=self.group)
            return t.to(y.dtype)
        dist.all_reduce(y, group=self.group)
        return y

    def extra_repr(self):
        return super().extra_repr() + (f", reduce_dtype={self.reduce_dtype}" if self.reduce_dtype else "")


def shard_llama(model, group=None, format=None, lm_head=True, reduce_dtype=None, device=None, **kw):
    """Shard a transformers Llama (LlamaForCausalLM or LlamaModel, or any
    model whose decoder layers have self_attn.{q,k,v,o}_proj and
    mlp.{gate,up,down}_proj) in place, Megatron's way: q, k, v, gate and up
    column-parallel, o and down row-parallel (reduce_dtype as
    RowParallelLinear takes it), whole attention heads per rank (query heads
    [r H/W, (r+1) H/W) with their key/value heads [r KV/W, (r+1) KV/W): the
    grouping of query heads onto KV heads is kept).  With lm_head=True the
    output head becomes column-parallel over the vocabulary with
    gather_output (every rank gets the whole logits); it stays in its dtype
    in every case (format applies to the decoder layers, as quantized
    checkpoints leave the head in BF16).  Embeddings and norms are
    replicated.

    format None keeps each layer as it is (nn.Linear: a slice of its
    weight; nibble.torch.Linear: a split of its bytes); "nvfp4" etc.
    quantizes each nn.Linear once, whole, then splits it (kw: scale_rule,
    method, group_size, scale_type).

    transformers' own attention reshapes with head_dim and -1 heads, so the
    sharded model runs through model(...) / generate() unchanged; code that
    reads the head counts from the config must use the per-rank ones
    returned here.  Returns {"rank", "world_size", "num_attention_heads",
    "num_key_value_heads" (per rank), "sharded": [names],
    "replaced": {name: the module it replaced}}.  Checks every layer before
    changing any: ValueError when the world size does not divide the head
    counts or a split is refused (split_weight)."""
    rank, world_size = _group_rank(group)
    kw = _quant_kwargs(kw)
    cfg = model.config
    base = getattr(model, "model", model)
    layers = getattr(base, "layers", None)
    if layers is None or not len(layers):
        raise ValueError(f"nibble.tp: {type(model).__name__} has no decoder layers (model.model.layers)")
    H, KV = cfg.num_attention_heads, cfg.num_key_value_heads
    if H % world_size or KV % world_size:
        raise ValueError(f"nibble.tp: {H} query heads and {KV} key/value heads do not split over {world_size} ranks "
                         "(whole heads per rank)")
    plan = []
    prefix = "model." if base is not model else ""
    for i, layer in enumerate(layers):
        for mod, names in ((layer.self_attn, (("q_proj", "n"), ("k_proj", "n"), ("v_proj", "n"), ("o_proj", "k"))),
                           (layer.mlp, (("gate_proj", "n"), ("up_proj", "n"), ("down_proj", "k")))):
            part = "self_attn" if mod is layer.self_attn else "mlp"
            for name, dim in names:
                plan.append((f"{prefix}layers.{i}.{part}.{name}", mod, name, dim))
    head = getattr(model, "lm_head", None) if lm_head else None
    if lm_head and head is None:
        raise ValueError(f"nibble.tp: {type(model).__name__} has no lm_head (pass lm_head=False)")
    # Every split checked before any module is replaced.
    for qname, mod, name, dim in plan:
        lin = getattr(mod, name)
        n, k = lin.out_features, lin.in_features
        size, what = (n, "n (output features)") if dim == "n" else (k, "k (input features)")
        if size % world_size:
            raise ValueError(f"nibble.tp: {qname}: {what} = {size} does not split evenly over {world_size} ranks")
        if (format is not None or isinstance(lin, nt.Linear)) and dim == "n":
            _span(n, rank, world_size, f"{qname}: n (output features)", ROW_BLOCK, "the packed layout's 16-row blocks")
    if head is not None and head.out_features % world_size:
        raise ValueError(f"nibble.tp: lm_head: {head.out_features} vocabulary rows do not split evenly over "
                         f"{world_size} ranks (pass lm_head=False to keep it whole)")
    sharded, replaced = [], {}
    for qname, mod, name, dim in plan:
        old = getattr(mod, name)
        if dim == "n":
            new = ColumnParallelLinear.from_linear(old, group, format=format, device=device, **kw)
        else:
            new = RowParallelLinear.from_linear(old, group, format=format, device=device, reduce_dtype=reduce_dtype,
                                                **kw)
        setattr(mod, name, new)
        sharded.append(qname)
        replaced[qname] = old
    if head is not None:
        model.lm_head = ColumnParallelLinear.from_linear(head, group, device=device, gather_output=True)
        sharded.append("lm_head")
        replaced["lm_head"] = head
    return {"rank": rank, "world_size": world_size, "num_attention_heads": H // world_size,
            "num_key_value_heads": KV // world_size, "sharded": sharded, "replaced": replaced}
