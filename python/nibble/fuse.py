"""nibble.fuse: sibling projections that read the same input, as one layer.

A decoder layer's q, k and v projections read the same normalized hidden
state, as do its MLP's gate and up projections.  Run as one layer (one
weight of n_q + n_k + n_v rows), each decode step makes one GEMM call
instead of three (or two), on a wider layer that streams its weight at a
larger fraction of the memory bandwidth; serving engines do the same
(vLLM's QKVParallelLinear and MergedColumnParallelLinear).

    import nibble.torch as nt
    nt.quantize_model(model, format="nvfp4")
    nt.fuse_projections(model)          # q/k/v -> qkv_proj, gate/up -> gate_up_proj
    model.generate(...)                 # the model's own forward, one GEMM per group

fuse_linears(layers) builds the fused layer from nibble.torch.Linear layers
(the rows of their checkpoint-layout codes, scales and zero points
concatenated, then packed: exactly the weights they held) or from
torch.nn.Linear layers (their weights concatenated).  Quantized layers fuse
only when nothing would change: the same format, group, scale type and
activation order, and the same tensor scale (NVFP4's weight_scale_2;
ModelOpt and llm-compressor export q/k/v and gate/up with one tensor scale
for this reason).  Fusing layers of different tensor scales would requantize
their FP8 block scales, so it is refused; quantizing the fused BF16 layer
instead (fuse_projections before quantize_model) gives the group one tensor
scale.

fuse_projections(model) does this for every module of the model that holds
a whole group (default: q_proj/k_proj/v_proj -> qkv_proj and
gate_proj/up_proj -> gate_up_proj, the names of Llama, Mistral, Qwen2/3,
Gemma and most transformers decoders).  The fused layer becomes the module's
attribute `qkv_proj` (`gate_up_proj`), and each member is replaced by a
ProjectionSlice: a module of no weights of its own whose forward returns its
columns of the fused layer's output.  The first member called with an input
runs the fused layer and keeps the output for the other members called with
that same tensor (identity and version checked; the output is released when
the last member has taken its columns), so the model's own forward, which
calls q_proj, k_proj and v_proj one after another, makes one GEMM call; a
member called with any other input runs the fused layer itself (correct,
three times the work).  Under torch.compile the same code is traced, and the
one GEMM call is what the graph holds.  An engine-style loop calls the fused
layer directly and splits its output (python/bench/e2e_decode.py).

fuse_glu(model) then routes each fused SiLU MLP through nibble.torch.glu
(nb_glu: down(glu(gate_up(x))), one launch between the two GEMMs, chained
to both in a captured step).

unfuse_projections(model) restores separate layers (rows of the fused weight:
exactly what they held) and the MLPs' own forward.  nibble.transformers' save_pretrained writes a fused
model as the separate layers its checkpoint layouts name (each member's rows
of the fused weight), so the checkpoint is the one the unfused model writes.
"""

import numpy as np
import torch

from . import QuantizedWeight

__all__ = ["fuse_linears", "fuse_projections", "fuse_glu", "unfuse_projections", "ProjectionSlice", "DEFAULT_GROUPS"]

# (fused attribute name, member attribute names in output order)
DEFAULT_GROUPS = (("qkv_proj", ("q_proj", "k_proj", "v_proj")),
                  ("gate_up_proj", ("gate_proj", "up_proj")))


def _nt():
    from . import torch as nt
    return nt


def _kind(layers):
    """"nibble" when every layer is a nibble.torch.Linear, "dense" when every
    layer is a torch.nn.Linear; TypeError otherwise."""
    nt = _nt()
    if not isinstance(layers, (list, tuple)) or len(layers) < 2:
        raise TypeError("nibble.fuse: expected a list of at least two layers")
    if all(isinstance(m, nt.Linear) for m in layers):
        return "nibble"
    if all(isinstance(m, torch.nn.Linear) for m in layers):
        return "dense"
    kinds = ", ".join(type(m).__name__ for m in layers)
    raise TypeError(f"nibble.fuse: layers must be all nibble.torch.Linear or all torch.nn.Linear, got {kinds}")


def _fused_bias(layers, device):
    """The members' biases concatenated (zeros for a member without one), or
    None when no member has a bias."""
    biases = [m.bias for m in layers]
    present = [b for b in biases if b is not None]
    if not present:
        return None
    dtypes = {b.dtype for b in present}
    if len(dtypes) != 1:
        raise ValueError(f"nibble.fuse: the layers' biases have different dtypes {sorted(map(str, dtypes))}")
    if any(b.is_meta for b in present):
        raise ValueError("nibble.fuse: a bias is on the meta device (no values to fuse)")
    dt = present[0].dtype
    parts = [b.detach().to(device) if b is not None else torch.zeros(m.out_features, dtype=dt, device=device)
             for m, b in zip(layers, biases)]
    return torch.cat(parts)


def _check_same(what, values):
    if len(set(values)) != 1:
        raise ValueError(f"nibble.fuse: the layers have different {what} ({', '.join(map(str, values))})")


def fuse_linears(layers):
    """One layer whose output is the outputs of `layers` (each reading the
    same input) concatenated along the last dimension, in order.

    nibble.torch.Linear layers give a nibble.torch.Linear holding exactly
    their weights (checkpoint-layout rows concatenated, packed on their
    device); they must agree in in_features, format, group, scale type,
    tensor scale, activation order (perm) and device, else ValueError says
    which differs.  torch.nn.Linear layers give a torch.nn.Linear (weights
    concatenated) and must agree in in_features, dtype and device.  A bias
    of the fused layer holds each member's bias, zeros for a member without
    one.  The layers themselves are not changed."""
    kind = _kind(layers)
    _check_same("in_features", [m.in_features for m in layers])
    if kind == "dense":
        ws = [m.weight for m in layers]
        _check_same("dtypes", [str(w.dtype) for w in ws])
        _check_same("devices", [str(w.device) for w in ws])
        if any(w.is_meta for w in ws):
            raise ValueError("nibble.fuse: a weight is on the meta device (no values to fuse)")
        dev, dt = ws[0].device, ws[0].dtype
        bias = _fused_bias(layers, dev)
        out = torch.nn.Linear(layers[0].in_features, sum(m.out_features for m in layers), bias=bias is not None,
                              device="meta", dtype=dt)
        out.weight = torch.nn.Parameter(torch.cat([w.detach() for w in ws]), requires_grad=False)
        if bias is not None:
            out.bias = torch.nn.Parameter(bias, requires_grad=False)
        return out
    nt = _nt()
    _check_same("formats", [m.format for m in layers])
    _check_same("groups", [m.group for m in layers])
    _check_same("scale types", [m.scale_type for m in layers])
    _check_same("devices", [str(m.packed.device) for m in layers])
    if any(m.packed.is_meta for m in layers):
        raise ValueError("nibble.fuse: a layer is on the meta device (no bytes to fuse)")
    scales = [float(m.tensor_scale) for m in layers]
    if len(set(scales)) != 1:
        raise ValueError(f"nibble.fuse: the layers' tensor scales differ ({', '.join(repr(s) for s in scales)}); "
                         "one fused weight has one tensor scale, and folding the ratios into the block scales would "
                         "change the weights. Fuse the unquantized layers and quantize the fused one instead")
    perms = [m.perm for m in layers]
    if any(p is not None for p in perms):
        if any(p is None for p in perms) or not all(torch.equal(p.cpu(), perms[0].cpu()) for p in perms):
            raise ValueError("nibble.fuse: the layers have different activation orders (perm); each would need "
                             "its own permuted input")
    dev = layers[0].packed.device
    qws = [m.quantized_weight() for m in layers]
    first = qws[0]
    zeros = None if first.zeros is None else _np_cat([q.zeros for q in qws])
    qw = QuantizedWeight(codes=_np_cat([q.codes for q in qws]), scales=_np_cat([q.scales for q in qws]),
                         tensor_scale=first.tensor_scale, n=sum(q.n for q in qws), k=first.k, format=first.format,
                         group=first.group, scale_type=first.scale_type, zeros=zeros)
    bias = _fused_bias(layers, dev)
    return nt.Linear.from_quantized(qw, bias=bias, device="cpu" if dev.type == "cpu" else dev, perm=perms[0])


def _np_cat(arrays):
    return np.ascontiguousarray(np.concatenate(arrays, axis=0))


def rows(q, start, stop):
    """Rows [start, stop) of a nibble.QuantizedWeight (the codes, scales and
    zero points of those output rows; the same tensor scale): exactly the
    weight of that part of a fused layer."""
    return QuantizedWeight(codes=q.codes[start:stop].copy(), scales=q.scales[start:stop].copy(),
                           tensor_scale=q.tensor_scale, n=stop - start, k=q.k, format=q.format, group=q.group,
                           scale_type=q.scale_type, zeros=None if q.zeros is None else q.zeros[start:stop].copy())


def members(model):
    """{qualified fused layer name: [(qualified member name, ProjectionSlice)]}
    of every fused group of `model`, members in output order."""
    out = {}
    for name, mod in model.named_modules():
        if isinstance(mod, ProjectionSlice):
            owner = name.rpartition(".")[0]
            out.setdefault(f"{owner}.{mod.fused_name}" if owner else mod.fused_name, []).append((name, mod))
    for v in out.values():
        v.sort(key=lambda nm: nm[1].start)
    return out


def _row_slice(layer, start, stop):
    """Rows [start, stop) of a fused layer as a layer of its own kind."""
    nt = _nt()
    bias = None if layer.bias is None else layer.bias.detach()[start:stop].clone()
    if isinstance(layer, nt.Linear):
        part = rows(layer.quantized_weight(), start, stop)
        dev = layer.packed.device
        return nt.Linear.from_quantized(part, bias=bias, device="cpu" if dev.type == "cpu" else dev, perm=layer.perm)
    w = layer.weight
    out = torch.nn.Linear(w.shape[1], stop - start, bias=bias is not None, device="meta", dtype=w.dtype)
    out.weight = torch.nn.Parameter(w.detach()[start:stop].clone(), requires_grad=False)
    if bias is not None:
        out.bias = torch.nn.Parameter(bias, requires_grad=False)
    return out


class _Stash:
    """The fused output of one group, kept from its first member's call for
    the others (the input it was computed from, that input's version, the
    output, and how many members have yet to take their columns)."""

    def __init__(self):
        self.x = None
        self.y = None
        self.version = -1
        self.left = 0


class ProjectionSlice(torch.nn.Module):
    """Columns [start, stop) of the output of `owner.<fused_name>` (see the
    module's docstring): a member of a fused group in the place of the layer
    it was.  No parameters or buffers of its own; in_features and
    out_features as the layer it replaces."""

    def __init__(self, owner, fused_name, name, start, stop, members, stash):
        super().__init__()
        # owner and stash are plain attributes, not submodules: the fused
        # layer is registered once, as owner's own attribute.
        object.__setattr__(self, "_owner", owner)
        object.__setattr__(self, "_stash", stash)
        self.fused_name, self.member_name = fused_name, name
        self.start, self.stop, self.members = int(start), int(stop), int(members)
        fused = getattr(owner, fused_name)
        self.in_features, self.out_features = fused.in_features, self.stop - self.start

    @property
    def fused(self):
        """The fused layer this slice reads (looked up on the owner at each
        call, so a fused layer replaced by quantize_model is the one used)."""
        return getattr(self._owner, self.fused_name)

    def forward(self, x):
        st = self._stash
        compiling = torch.compiler.is_compiling()
        if st.x is x and st.left > 0 and (compiling or st.version == x._version):
            y = st.y
        else:
            y = self.fused(x)
            st.x, st.y, st.left = x, y, self.members
            if not compiling:
                st.version = x._version
        st.left -= 1
        if st.left <= 0:
            st.x = st.y = None
        return y[..., self.start:self.stop]

    def extra_repr(self):
        return (f"{self.fused_name}[..., {self.start}:{self.stop}], in_features={self.in_features}, "
                f"out_features={self.out_features}")


def fuse_projections(model, groups=DEFAULT_GROUPS):
    """Fuse every group of sibling projections of `model` (in place; see the
    module's docstring).  groups: (fused name, (member names...)) pairs; a
    module is fused when it holds every member of a group, all
    nibble.torch.Linear or all torch.nn.Linear, and no attribute of the
    fused name yet.  Returns {"fused": [qualified fused names],
    "skipped": {qualified module name: reason}}; a group whose layers cannot
    be fused exactly (fuse_linears' ValueError: different tensor scales,
    formats, ...) is left as it was and listed with the reason."""
    if not isinstance(model, torch.nn.Module):
        raise TypeError(f"nibble.fuse: model must be a torch.nn.Module, got {type(model).__name__}")
    groups = _check_groups(groups)
    nt = _nt()
    fused, skipped = [], {}
    for name, mod in list(model.named_modules()):
        for fused_name, members in groups:
            layers = [getattr(mod, m, None) for m in members]
            if not all(isinstance(m, torch.nn.Module) for m in layers):
                continue
            where = f"{name}.{fused_name}" if name else fused_name
            if not (all(isinstance(m, nt.Linear) for m in layers)
                    or all(isinstance(m, torch.nn.Linear) for m in layers)):
                if not any(isinstance(m, ProjectionSlice) for m in layers):
                    skipped[where] = "members are not all nibble.torch.Linear or all torch.nn.Linear (" + \
                        ", ".join(type(m).__name__ for m in layers) + ")"
                continue
            if hasattr(mod, fused_name):
                skipped[where] = f"the module already has an attribute {fused_name!r}"
                continue
            try:
                f = fuse_linears(layers)
            except ValueError as e:
                skipped[where] = str(e)
                continue
            setattr(mod, fused_name, f)
            stash, start = _Stash(), 0
            for member, layer in zip(members, layers):
                stop = start + layer.out_features
                setattr(mod, member, ProjectionSlice(mod, fused_name, member, start, stop, len(members), stash))
                start = stop
            fused.append(where)
    return {"fused": fused, "skipped": skipped}


def _silu(act):
    """Whether act is SiLU (torch.nn.SiLU, transformers' SiLUActivation, or
    torch.nn.functional.silu itself)."""
    if act is torch.nn.functional.silu or isinstance(act, torch.nn.SiLU):
        return True
    return type(act).__name__ in ("SiLUActivation", "SiLU")


def _glu_forward(self, x):
    """A fused gated MLP's forward through nb_glu: down(glu(gate_up(x)))."""
    return self.down_proj(_nt().glu(self.gate_up_proj(x)))


def fuse_glu(model, check=True):
    """Route every fused gated MLP of `model` through nibble.torch.glu (in
    place): a module holding a nibble.torch.Linear `gate_up_proj` (from
    fuse_projections: gate rows, then up rows), ProjectionSlice members
    `gate_proj` / `up_proj`, a nibble.torch.Linear `down_proj` and a SiLU
    `act_fn` gets the forward down_proj(glu(gate_up_proj(x))), one nb_glu
    launch between the two nibble GEMMs instead of act_fn(gate) * up (two
    framework kernels eager, one compiled): in a captured step the three
    launches chain by programmatic dependent launch.  Evaluated in float32
    and rounded once, where act_fn(gate) * up rounds silu(gate) first.

    check: before patching a module, run both forwards on two random rows
    and leave the module as it was (listed in "skipped" with the reason)
    when they differ by more than the roundings between them (relative
    Frobenius error 2^-6): a forward that is not down(act_fn(gate) * up).
    Returns {"glu": [qualified module names], "skipped": {name: reason}}.
    unfuse_projections undoes it."""
    if not isinstance(model, torch.nn.Module):
        raise TypeError(f"nibble.fuse: model must be a torch.nn.Module, got {type(model).__name__}")
    nt = _nt()
    done, skipped = [], {}
    for name, mod in list(model.named_modules()):
        gu = getattr(mod, "gate_up_proj", None)
        if not isinstance(gu, nt.Linear) or "forward" in vars(mod):
            continue
        where = name or type(mod).__name__
        g, u, d = (getattr(mod, a, None) for a in ("gate_proj", "up_proj", "down_proj"))
        if not (isinstance(g, ProjectionSlice) and isinstance(u, ProjectionSlice) and g.fused is gu
                and u.fused is gu and g.start == 0 and u.start == g.stop == gu.out_features // 2
                and u.stop == gu.out_features):
            skipped[where] = "gate_proj / up_proj are not the two halves of gate_up_proj (fuse_projections)"
            continue
        if not isinstance(d, nt.Linear) or d.in_features != g.out_features:
            skipped[where] = "down_proj is not a nibble.torch.Linear of gate_proj's width"
            continue
        if not _silu(getattr(mod, "act_fn", None)):
            skipped[where] = f"act_fn is {type(getattr(mod, 'act_fn', None)).__name__}, not SiLU"
            continue
        if gu.packed.is_meta or d.packed.is_meta:
            skipped[where] = "its weights are not loaded (meta tensors)"
            continue
        if check:
            dev = gu.packed.device
            dt = torch.float32 if dev.type == "cpu" else torch.bfloat16
            x = torch.randn(2, gu.in_features, generator=torch.Generator().manual_seed(0)).to(dev, dt)
            with torch.no_grad():
                ref, out = mod(x).float(), _glu_forward(mod, x).float()
            err = float((out - ref).norm() / ref.norm().clamp_min(1e-30))
            if not err <= 2.0 ** -6:
                skipped[where] = f"its forward differs from down_proj(glu(gate_up_proj(x))) (relative {err:.3g})"
                continue
        mod.forward = _glu_forward.__get__(mod, type(mod))
        done.append(where)
    return {"glu": done, "skipped": skipped}


def unfuse_projections(model):
    """Undo fuse_projections: every ProjectionSlice of `model` becomes a
    layer of its own again (the rows of the fused layer it reads: exactly
    the weights it had), and the fused attribute is removed.  Returns the
    qualified names of the fused layers removed."""
    if not isinstance(model, torch.nn.Module):
        raise TypeError(f"nibble.fuse: model must be a torch.nn.Module, got {type(model).__name__}")
    removed = []
    for name, mod in list(model.named_modules()):
        fwd = vars(mod).get("forward")
        if getattr(fwd, "__func__", None) is _glu_forward:   # fuse_glu's forward goes with the fused layer
            del mod.forward
        slices = [(n, c) for n, c in mod.named_children() if isinstance(c, ProjectionSlice) and c._owner is mod]
        if not slices:
            continue
        by_fused = {}
        for n, c in slices:
            by_fused.setdefault(c.fused_name, []).append((n, c))
        for fused_name, members in by_fused.items():
            fused = getattr(mod, fused_name)
            for n, c in members:
                setattr(mod, n, _row_slice(fused, c.start, c.stop))
            delattr(mod, fused_name)
            removed.append(f"{name}.{fused_name}" if name else fused_name)
    return removed


def _check_groups(groups):
    ok = isinstance(groups, (list, tuple)) and all(
        isinstance(g, (list, tuple)) and len(g) == 2 and isinstance(g[0], str) and isinstance(g[1], (list, tuple))
        and len(g[1]) >= 2 and all(isinstance(m, str) for m in g[1]) and g[0] not in g[1] for g in groups)
    if not ok:
        raise ValueError("nibble.fuse: groups must be (fused name, (member names, at least two)) pairs, "
                         f"got {groups!r}")
    return [(g[0], tuple(g[1])) for g in groups]
