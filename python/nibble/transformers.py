"""nibble.transformers: nibble as a Hugging Face transformers quantizer.

    import nibble.transformers                       # registers the quantizer (see "Dispatch")
    from nibble.transformers import NibbleConfig
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained("Llama-NVFP4/", device_map="cuda")       # ModelOpt NVFP4
    model = AutoModelForCausalLM.from_pretrained("Llama-MXFP4-Quark/", device_map="cuda",
                                                 quantization_config=NibbleConfig())        # Quark, CT, gpt-oss
    model = AutoModelForCausalLM.from_pretrained("Llama-BF16/", device_map="cuda",
                                                 quantization_config=NibbleConfig(format="nvfp4"))
    model.save_pretrained("Llama-NVFP4-nibble/")     # ModelOpt NVFP4 (MXFP4: Quark; int4, int8: compressed-tensors)

Dispatch
  transformers picks a quantizer by the checkpoint's
  config.json quantization_config.quant_method, in a table that only code
  running in this process can add to: nothing is registered until this
  module is imported (transformers has no plugin discovery).  Importing it
  registers
    * "nibble": NibbleConfig / NibbleHfQuantizer, for quantization_config=
      NibbleConfig(...) passed to from_pretrained;
    * "modelopt" (ModelOpt NVFP4 checkpoints), only when no other quantizer
      holds that name: transformers has no loader for it, so such a
      checkpoint loads through nibble with no argument.
  The other layouts nibble reads have owners in transformers (quant_method
  "compressed-tensors", "quark", "mxfp4" for gpt-oss), whose users keep them:
  nibble takes such a checkpoint over only when asked,
    * per call: from_pretrained(path, quantization_config=NibbleConfig()) -
      a NibbleConfig passed in takes precedence over the checkpoint's own
      config (this module wraps transformers' merge step for that one case;
      any other argument goes through unchanged), or
    * process-wide: nibble.transformers.override("quark", ...) (all four
      with no argument; restore() or the `with` form undoes it).

Loading a quantized checkpoint
  nibble's C reader (nibble.open_checkpoint) decides every layer from the
  tensors, as load_quantized does: ModelOpt NVFP4, compressed-tensors
  nvfp4/mxfp4, Quark MXFP4, gpt-oss MXFP4 experts, the integer layouts it
  converts (AWQ GEMM, GPTQ 4-bit and symmetric 8-bit with act-order,
  compressed-tensors pack-quantized int4 and int8), and bitsandbytes'
  serialized 4-bit weights (nf4, fp4;
  plain or nested absmax); quant_method "awq", "gptq" and "bitsandbytes"
  belong to other quantizers in transformers, so these load with
  quantization_config=NibbleConfig().  Before transformers
  loads anything, each quantized nn.Linear becomes a nibble.torch.Linear
  placeholder (experts modules: nibble.torch.MoeExperts; checkpoint names
  renamed as transformers renames them, e.g. Mixtral's block_sparse_moe ->
  mlp) and the checkpoint's
  quantized tensors are left to nibble; transformers loads every other tensor
  (embeddings, norms, biases, layers left in BF16) with its own device map
  and dtype.  After that the quantized weights are read through the reader
  (the checkpoint's exact bytes) and packed where the placeholder was placed:
  nb_pack on a GPU, nb_pack_host on the CPU (same bytes; a model loaded on
  the CPU runs after model.to("cuda")).  Refused by name, before any data
  is read: a layer the reader found inconsistent (with its reason, e.g.
  8-bit layouts no nibble format holds: GPTQ and compressed-tensors
  asymmetric 8-bit), a layer in a format no GPU kernel serves, a checkpoint
  whose config declares another format than its tensors (or excludes a
  quantized layer), a NibbleConfig(format=)
  that differs from the checkpoint's, a module that is not an nn.Linear of
  the layer's shape, disk offload.  NibbleConfig(dequantize=True) loads
  nn.Linear layers with the dequantized weights instead (the reference; runs
  on the CPU).

Quantizing at load
  NibbleConfig(format="nvfp4" | "mxfp4" | "int4" | "int4_sym" | "int8" |
  "nf4" | "bnb_fp4") (the integer formats with group_size 32/64/128,
  default 128, and scale_type "f16" or "bf16", default "f16"; nf4 / bnb_fp4
  with group_size 32 .. 4096, default 64; both quantized on the host;
  experts modules are refused with them) on a checkpoint without quantized
  layers quantizes every nn.Linear (but modules_to_not_convert, by default
  transformers' choice: the output head and tied embeddings, and layers whose
  in_features is not a multiple of the group) as its weight is read:
  nibble.torch.quantize on the weight's device (the device quantizer on a
  GPU, the C reference on the CPU), so the BF16 model never exists whole.
  NVFP4: the members of a module's q/k/v (gate/up) group are held until the
  group's last is read and then quantized with one tensor scale, the
  group's, as quantize_model and `nibble quantize` give it.
  Experts modules (GptOssExperts, Qwen3MoeExperts, MixtralExperts) are
  quantized as transformers reads (or fuses) their 3-D weights and become
  MoeExperts, as quantize_model makes them.

Saving
  save_pretrained writes ModelOpt NVFP4 (weight, weight_scale F8_E4M3,
  weight_scale_2) or Quark MXFP4 (weight, weight_scale U8) tensors, unpacked
  from the GPU layout by nb_unpack_host, and in config.json the
  quantization_config `nibble quantize` writes (quant_method "modelopt" or
  "quark", producer nibble, the layers left in BF16 as the exclude list).
  Other tools read it; nibble reads it back (a Quark one through
  NibbleConfig() or override("quark")).  MoE experts (MoeExperts) are
  written one layer per expert in that layout (gate_proj / up_proj /
  down_proj; gpt-oss experts as a fused gate_up_proj per expert with
  per-expert biases); a gpt-oss model whose only 4-bit modules are its
  MXFP4 experts is written in gpt-oss's own layout (*_blocks, *_scales,
  biases, quant_method "mxfp4"), read back through NibbleConfig() or
  override("mxfp4").  See save_layout.  Models with int4 / int4_sym / int8
  layers are written in compressed-tensors' pack-quantized layout
  (weight_packed, weight_scale, weight_shape, weight_zero_point for int4,
  weight_g_idx for an act-order layer; docs/formats.md 5.4), as `nibble
  quantize --format int4 | int4_sym | int8` writes it (int8: num_bits 8,
  four codes plus 128 per word), with one
  group for the model (layers of different groups are refused); they load
  back through NibbleConfig() or override("compressed-tensors").  nf4 /
  bnb_fp4 layers are written in bitsandbytes' 4-bit serialization (weight,
  weight.absmax F32, weight.quant_map, weight.quant_state.bitsandbytes__nf4
  / __fp4) under quant_method "bitsandbytes" without double quantization,
  the absmax as nibble holds it; they load back through NibbleConfig() and
  through bitsandbytes itself.
"""

import copy
import os
import re

import numpy as np
import torch
from transformers.core_model_loading import ConversionOps
from transformers.quantizers import HfQuantizer
from transformers.quantizers import auto as _auto
from transformers.utils.quantization_config import QuantizationConfigMixin

from . import __version__ as _nibble_version
from . import _FORMATS, QuantizedExperts, QuantizedMoe, _lib, _rule_name, weight_sizes
from . import element_to_float as nibble_element_to_float
from . import quantize as _np_quantize
from . import fuse as _fuse
from . import torch as nt

__all__ = ["NibbleConfig", "NibbleHfQuantizer", "override", "restore", "OVERRIDABLE"]

# The quant_method values of the checkpoint layouts nibble reads.
OVERRIDABLE = ("modelopt", "compressed-tensors", "quark", "mxfp4")

# Where save_pretrained's layout comes from: one per format with GPU kernels.
_SAVE_LAYOUT = {"nvfp4": "modelopt", "mxfp4": "quark", "int4": "compressed-tensors",
                "int4_sym": "compressed-tensors", "int8": "compressed-tensors", "nf4": "bitsandbytes",
                "bnb_fp4": "bitsandbytes", "int4_hqq": "hqq"}
_INT_FORMATS = ("int4", "int4_sym", "int8")   # group_size 32/64/128, F16/BF16 scales, compressed-tensors when saved
_GROUP_SCALED = _INT_FORMATS + ("int4_hqq",)   # the formats that take group_size 32/64/128 and scale_type
_EXPERT_WEIGHTS = ("gate_up_proj", "down_proj")   # the 3-D weights of an experts module quantized at load
_QUARK_MODE = {"even": "even", "ocp": "floor", "round_up": "round_up"}   # Quark's scale_calculation_mode
_TABLE_FORMATS = ("nf4", "bnb_fp4")   # bitsandbytes' formats: saved in bitsandbytes' 4-bit serialization
_BNB_TYPE = {"nf4": "nf4", "bnb_fp4": "fp4"}   # bitsandbytes' quant_type of each


def _kernel_format(fmt, what):
    """A format name nibble's GPU kernels serve, or ValueError naming it."""
    if fmt is None:
        return None
    name = str(fmt).lower()
    if name not in _FORMATS:
        raise ValueError(f"nibble.transformers: {what} {fmt!r} is not a nibble format; expected one of "
                         f"{', '.join(f for f, c in _FORMATS.items() if _lib.FORMAT_INFO[c]['kernels'])}")
    if not _lib.FORMAT_INFO[_FORMATS[name]]["kernels"]:
        raise ValueError(f"nibble.transformers: {what} {name}: no GPU kernel serves {name} yet")
    return name


class NibbleConfig(QuantizationConfigMixin):
    """The quantization_config that selects nibble in from_pretrained.

    format: None (take the checkpoint's quantized layers as they are) or
      "nvfp4" / "mxfp4" / "int4" / "int4_sym" / "int8" / "int4_hqq" / "nf4" / "bnb_fp4":
      quantize a checkpoint without quantized layers at load; for a
      quantized checkpoint it must name the checkpoint's format (else
      ValueError).  A format without GPU kernels is refused by name.
      Models of nf4 / bnb_fp4 layers save in bitsandbytes' serialization.
    scale_rule, method: as nibble.torch.quantize ("mse" runs on the host,
      for the FP4 formats; "hqq", HQQ's optimizer of the zero points, on the
      host for int4_hqq).
    group_size: int4 / int4_sym / int8 (32, 64 or 128, None: 128), int4_hqq
      (32, 64 or 128, None: 64; saved as hqq's HQQLinear state_dicts) and nf4
      / bnb_fp4 (bitsandbytes' blocksize: 32, 64, ..., 4096, None: 64), as
      nibble.torch.quantize.
    scale_type: int4 / int4_sym / int8 / int4_hqq only ("f16", the default, or
      "bf16").
    modules_to_not_convert: fnmatch patterns (as quantize_model's exclude) of
      layers left in BF16 when quantizing at load; None: transformers' default
      (output head, tied embeddings).
    dequantize: load nn.Linear layers with the dequantized weights (the
      reference model; transformers then drops the quantization config).
    fuse: after loading, nibble.torch.fuse_projections(model): q/k/v and
      gate/up run as one layer each where that changes no weight (a
      pre-quantized checkpoint whose groups share their tensor scales, as
      ModelOpt, llm-compressor and `nibble quantize` write them; MXFP4 and
      the integer formats always; NVFP4 quantized at load, whose groups get
      one tensor scale each); the groups left separate are in
      `fuse_report["skipped"]`.  save_pretrained writes the layers
      separately, as the checkpoint had them.

    After a model is loaded, `format` is its layers' format and
    to_dict() (what save_pretrained writes into config.json) is the
    quantization_config of the layout save_pretrained writes: ModelOpt NVFP4,
    Quark MXFP4 or compressed-tensors pack-quantized int4 / int8.  `source`
    keeps the checkpoint's own quantization_config when nibble took it
    over."""

    def __init__(self, format=None, scale_rule=None, method="rtn", modules_to_not_convert=None, dequantize=False,
                 source=None, group_size=None, scale_type=None, fuse=False, **kwargs):
        self.quant_method = "nibble"
        self.format = _kernel_format(format, "format")
        if scale_rule is not None:
            scale_rule = _rule_name(scale_rule, scale_rule)
            if self.format is not None and self.format != "mxfp4":
                raise ValueError("nibble.transformers: scale_rule applies to MXFP4 only")
        self.scale_rule = scale_rule
        if method not in ("rtn", "mse", "hqq"):
            raise ValueError(f"nibble.transformers: unknown method {method!r}; expected 'rtn', 'mse' or 'hqq'")
        if method == "hqq" and self.format not in (None, "int4_hqq"):
            raise ValueError("nibble.transformers: method 'hqq' (HQQ's optimizer) applies to format 'int4_hqq'")
        self.method = method
        if scale_type is not None and self.format not in _GROUP_SCALED:
            raise ValueError("nibble.transformers: scale_type applies to format 'int4', 'int4_sym', 'int8' or "
                             "'int4_hqq'")
        if group_size is not None and self.format not in _GROUP_SCALED + _TABLE_FORMATS:
            raise ValueError("nibble.transformers: group_size applies to format 'int4', 'int4_sym', 'int8', "
                             "'int4_hqq', 'nf4' or 'bnb_fp4'")
        groups = (32, 64, 128) if self.format in _GROUP_SCALED else (
            tuple(_lib.FORMAT_INFO[_FORMATS[self.format]]["group_sizes"]) if self.format else ())
        if group_size is not None and (isinstance(group_size, bool) or group_size not in groups):
            raise ValueError(f"nibble.transformers: group_size {group_size!r}; {self.format} takes "
                             f"{', '.join(map(str, groups))}")
        if self.format in _TABLE_FORMATS and method != "rtn":
            raise ValueError(f"nibble.transformers: method {method!r} serves nvfp4 and mxfp4 only")
        if scale_type is not None and scale_type not in ("f16", "bf16"):
            raise ValueError(f"nibble.transformers: scale_type {scale_type!r}; expected 'f16' or 'bf16'")
        self.group_size, self.scale_type = group_size, scale_type
        if isinstance(modules_to_not_convert, str):
            modules_to_not_convert = [modules_to_not_convert]
        self.modules_to_not_convert = list(modules_to_not_convert) if modules_to_not_convert is not None else None
        self.dequantize = bool(dequantize)
        if not isinstance(fuse, bool):
            raise ValueError(f"nibble.transformers: fuse must be True or False, got {fuse!r}")
        self.fuse = fuse
        self.fuse_report = None
        self.source = dict(source) if source else None
        if kwargs:
            raise TypeError(f"nibble.transformers: NibbleConfig got unknown arguments {sorted(kwargs)}")
        self._saved_as = None     # set once a model holds nibble layers: save_layout's dict

    @classmethod
    def from_dict(cls, config_dict, return_unused_kwargs=False, **kwargs):
        """A NibbleConfig from a config.json quantization_config: nibble's own
        (quant_method "nibble"), or another one that was routed to nibble
        (the "modelopt" registration, override()): then the tensors decide
        and the dict is kept as `source`."""
        d = dict(config_dict)
        if d.get("quant_method") == "nibble":
            d.pop("quant_method")
            config = cls(**{key: d[key] for key in ("format", "scale_rule", "method", "modules_to_not_convert",
                                                    "dequantize", "source", "group_size", "scale_type", "fuse")
                            if key in d})
        else:
            config = cls(source=d)
        unused = {}
        for key, value in kwargs.items():
            if key in ("dequantize", "modules_to_not_convert", "fuse"):
                setattr(config, key, value)
            else:
                unused[key] = value
        return (config, unused) if return_unused_kwargs else config

    def _nibble_dict(self):
        return {"quant_method": "nibble", "format": self.format, "scale_rule": self.scale_rule,
                "method": self.method, "modules_to_not_convert": self.modules_to_not_convert,
                "dequantize": self.dequantize, "source": self.source, "group_size": self.group_size,
                "scale_type": self.scale_type, "fuse": self.fuse}

    def to_dict(self):
        if self._saved_as is None:
            return self._nibble_dict()
        layout = self._saved_as
        if layout["experts"] == "gptoss":   # gpt-oss's own quantization_config, as its checkpoints carry it
            return {"quant_method": "mxfp4", "modules_to_not_convert": list(layout["unquantized"])}
        return _layout_config(layout["format"], self.scale_rule, layout["unquantized"], layout.get("group"),
                              layout.get("dtype"))

    def to_diff_dict(self):
        return self.to_dict()

    def __iter__(self):
        yield from self.to_dict().items()

    def __repr__(self):
        import json
        return f"NibbleConfig {json.dumps(self._nibble_dict(), sort_keys=True)}"


def _producer():
    return {"name": "nibble", "version": _nibble_version}


def _layout_config(fmt, scale_rule, exclude, group=None, dtype=None):
    """config.json's quantization_config of the layout save_pretrained writes,
    as nibble's C writer (src/io/ckpt_out.c, `nibble quantize`) writes it.
    group: int4 / int4_sym / int8 only, the group size or "channel" (int8:
    the same config with num_bits 8, which the C writer does not write).
    nf4 / bnb_fp4: transformers' BitsAndBytesConfig for 4-bit weights
    without double quantization (the absmax stays the F32 nibble holds),
    dtype the compute dtype (default "bfloat16")."""
    exclude = list(exclude)
    if fmt == "int4_hqq":   # transformers' HqqConfig.to_dict(): hqq's quantize config for 4 bits, axis 1
        w = {"nbits": 4, "channel_wise": True, "group_size": int(group or 64), "optimize": False,
             "round_zero": False, "axis": 1, "view_as_float": False}
        return {"quant_method": "hqq", "quant_config": {"weight_quant_params": w, "scale_quant_params": None,
                                                        "zero_quant_params": None, "offload_meta": False},
                "skip_modules": sorted({name.rpartition(".")[2] for name in exclude}) or ["lm_head"]}
    if fmt in _TABLE_FORMATS:
        return {"quant_method": "bitsandbytes", "_load_in_4bit": True, "_load_in_8bit": False, "load_in_4bit": True,
                "load_in_8bit": False, "bnb_4bit_quant_type": _BNB_TYPE[fmt], "bnb_4bit_use_double_quant": False,
                "bnb_4bit_compute_dtype": dtype or "bfloat16", "bnb_4bit_quant_storage": "uint8",
                "llm_int8_threshold": 6.0, "llm_int8_skip_modules": exclude or None,
                "llm_int8_enable_fp32_cpu_offload": False, "llm_int8_has_fp16_weight": False}
    if fmt in _INT_FORMATS:
        w = {"num_bits": 8 if fmt == "int8" else 4, "type": "int", "symmetric": fmt != "int4"}
        if group == "channel":
            w.update(strategy="channel", group_size=None)
        else:
            w.update(strategy="group", group_size=int(group or 128))
        w.update(dynamic=False, observer="minmax", actorder=None)
        return {"quant_method": "compressed-tensors", "format": "pack-quantized", "quantization_status": "compressed",
                "config_groups": {"group_0": {"targets": ["Linear"], "weights": w, "input_activations": None,
                                              "output_activations": None}},
                "ignore": exclude, "kv_cache_scheme": None, "producer": _producer()}
    if fmt == "nvfp4":
        w = {"num_bits": 4, "type": "float", "group_size": 16, "dynamic": False}
        return {"quant_method": "modelopt", "quant_algo": "NVFP4", "producer": _producer(), "ignore": exclude,
                "kv_cache_scheme": None,
                "config_groups": {"group_0": {"weights": dict(w), "input_activations": dict(w),
                                              "targets": ["Linear"]}}}
    mode = _QUARK_MODE[scale_rule or "even"]

    def tensor(dynamic):
        return {"dtype": "fp4", "qscheme": "per_group", "group_size": 32, "ch_axis": -1, "scale_format": "e8m0",
                "scale_calculation_mode": mode, "round_method": "half_even", "is_dynamic": dynamic,
                "observer_cls": "PerBlockMXObserver", "scale_type": "float"}
    return {"quant_method": "quark",
            "global_quant_config": {"weight": tensor(False), "input_tensors": tensor(True), "output_tensors": None,
                                    "bias": None},
            "exclude": exclude,
            "export": {"weight_format": "real_quantized", "pack_method": "reorder", "kv_cache_group": []},
            "layer_quant_config": {}, "producer": _producer()}


# ---------------------------------------------------------------- quantizer

def _checkpoint_path(files):
    """What nibble's reader opens for transformers' resolved checkpoint
    files: the file itself, or the directory of a sharded checkpoint (its
    index)."""
    if not files:
        return None
    bad = [f for f in files if not str(f).endswith(".safetensors")]
    if bad:
        raise ValueError(f"nibble.transformers: nibble reads safetensors checkpoints; got {os.path.basename(bad[0])}")
    return str(files[0]) if len(files) == 1 else os.path.dirname(str(files[0]))


def _swap(model, prefix, new):
    parent_name, _, child = prefix.rpartition(".")
    parent = model.get_submodule(parent_name) if parent_name else model
    setattr(parent, child, new)


def _placeholder(n, k, fmt, tensor_scale, bias, group=None, scale_type=None):
    """A nibble.torch.Linear on the meta device with the packed size of an
    n x k weight of `fmt` (group and scale type as the checkpoint's layer
    has them): transformers places its (non-persistent) buffers and loads
    its bias; the bytes come after loading."""
    sizes = weight_sizes(n, k, fmt, group, scale_type)
    pw = nt.PackedLinearWeight(packed=torch.empty(sizes["packed_bytes"], dtype=torch.uint8, device="meta"),
                               workspace=torch.empty(0, dtype=torch.uint8, device="meta"), n=n, k=k, format=fmt,
                               tensor_scale=float(tensor_scale), scale_exp_min=-1, scale_exp_max=-1, group=group,
                               scale_type=scale_type)
    b = None
    if bias is not None:
        b = torch.empty(n, dtype=bias.dtype, device="meta")
    return nt.Linear(pw, b)


def _moe_placeholder(g, mod):
    """A nibble.torch.MoeExperts on the meta device with the packed sizes of
    expert group g (a CheckpointMoe), standing in for the model's experts
    module `mod`: transformers places it and loads its biases (gpt-oss's
    gate_up_proj_bias / down_proj_bias, by name); the bytes come after
    loading (_moe_fill)."""
    from .moe import MoeSpec, packed_sizes
    oai = g.activation == "swiglu_oai"
    spec = MoeSpec(g.quant_format, g.experts, g.hidden, g.intermediate, g.activation, g.gate_up_layout,
                   g.limit if oai else None, g.alpha if oai else None)
    sizes = packed_sizes(spec)
    ts = torch.empty(g.experts, dtype=torch.float32, device="meta") if spec.has_tensor_scale else None
    pw = nt.PackedMoeWeights(spec=spec, gate_up=torch.empty(sizes["gate_up_bytes"], dtype=torch.uint8, device="meta"),
                             down=torch.empty(sizes["down_bytes"], dtype=torch.uint8, device="meta"),
                             gate_up_scales=ts, down_scales=None if ts is None else ts.clone(),
                             gate_up_exp=(-1, -1), down_exp=(-1, -1))
    biases = [None, None]
    if nt._module_moe_kind(mod)[2]:
        biases = [torch.empty(getattr(mod, b).shape, dtype=getattr(mod, b).dtype, device="meta")
                  for b in ("gate_up_proj_bias", "down_proj_bias")]
    ph = nt.MoeExperts(pw, *biases)
    ph._orig_cls, ph._transposed = type(mod), nt._module_moe_kind(mod)[1]
    return ph


def _moe_fill(ph, ck, g, config, dequantize, dtype):
    """The experts module for placeholder `ph` with the checkpoint's bytes,
    on the device transformers put the placeholder on: a MoeExperts (nb_moe_pack_host,
    then the copy there), or with dequantize the model's own experts module
    holding the dequantized weights (the reference)."""
    placed = [t for t in (ph.gate_up_proj_bias, ph.down_proj_bias, ph.gate_up_packed) if t is not None and not t.is_meta]
    dev = placed[0].device if placed else torch.device("cpu")
    loaded = [b if b is not None and not b.is_meta else None for b in (ph.gate_up_proj_bias, ph.down_proj_bias)]
    qm = ck.moe(g)
    bdtype = ph.gate_up_proj_bias.dtype if ph.gate_up_proj_bias is not None else (
        dtype if isinstance(dtype, torch.dtype) else torch.bfloat16)
    # per-expert biases (G.<e>.gate_up_proj.bias) have no name transformers
    # loads: whatever it put in the placeholder's biases is not theirs
    if (loaded[0] is None or g.per_expert) and qm.gate_up_bias is not None:
        loaded = [nt._np_float_tensor(b, bdtype).to(dev) for b in (qm.gate_up_bias, qm.down_bias)]
    if not dequantize:
        return nt.MoeExperts(nt.pack_moe(qm, dev), *loaded)
    with torch.device("meta"):
        dense = ph._orig_cls(config.get_text_config())
    for name, qe in (("gate_up_proj", qm.gate_up), ("down_proj", qm.down)):
        setattr(dense, name, torch.nn.Parameter(nt._dense_experts(qe, bdtype, dev, ph._transposed), requires_grad=False))
    for name, b in zip(("gate_up_proj_bias", "down_proj_bias"), loaded):
        if b is not None:
            setattr(dense, name, torch.nn.Parameter(b, requires_grad=False))
    return dense


def _ignore_unexpected(model, names):
    """Checkpoint tensor names transformers is not to report as unexpected
    (nibble reads them)."""
    if names:
        model._keys_to_ignore_on_load_unexpected = set(model._keys_to_ignore_on_load_unexpected or ())
        model._keys_to_ignore_on_load_unexpected.add("^(?:" + "|".join(re.escape(n) for n in sorted(names)) + ")$")


def _converted_names(model, conversions, names):
    """The names transformers' weight conversions give the checkpoint tensors
    `names` when it loads them into `model` (its own rename_source_key, on
    copies: renaming marks a conversion used), those that differ from the
    checkpoint's and from the model's.  Without that function (a transformers
    that moved it) none: the load report then lists them."""
    try:
        from transformers.core_model_loading import WeightConverter, WeightRenaming, rename_source_key
    except ImportError:
        return []
    conversions = copy.deepcopy(list(conversions))
    renamings = [c for c in conversions if isinstance(c, WeightRenaming)]
    converters = [c for c in conversions if isinstance(c, WeightConverter)]
    with nt._no_weight_state():
        state = model.state_dict()
    renamed = {rename_source_key(n, renamings, converters, model.base_model_prefix, state)[0] for n in names}
    return sorted(renamed - set(names) - set(state))


def _device_map_devices(device_map):
    if device_map is None:
        return set()
    if isinstance(device_map, dict):
        return {str(v) for v in device_map.values()}
    return {str(device_map)}


class NibbleHfQuantizer(HfQuantizer):
    """transformers' HfQuantizer for nibble (see the module docstring)."""

    requires_calibration = False

    def __init__(self, quantization_config, **kwargs):
        super().__init__(quantization_config, **kwargs)
        self._ck = None
        self._layers = []          # [(CheckpointLayer, the model's module name)] of a quantized checkpoint
        self._experts = []         # [(CheckpointMoe, the model's module name)]: groups in MoeExperts placeholders
        self._targets = set()      # prefixes quantized at load
        self._pending = {}         # prefix -> PackedLinearWeight quantized at load, swapped in after it
        self._groups = {}          # (module, group) -> the targets of a fused group (NVFP4: one tensor scale)
        self._waiting = {}         # (module, group) -> {prefix: weight} read, waiting for the group's others
        self._expert_targets = {}  # prefix -> nibble.torch._expert_kind of experts modules quantized at load
        self._pending_experts = {}  # prefix -> {"gate_up_proj" / "down_proj": (QuantizedExperts, device)}
        self._done_experts = set()
        self._errors = {}
        self._dtype = None
        self._unread = None        # (model, checkpoint tensor names nibble reads) until the conversions are known
        self._built_dtypes = {}    # parameter name -> dtype the model was built with (pre-quantized loads)

    # -------------------------------------------------------- environment

    def validate_environment(self, device_map=None, **kwargs):
        devices = _device_map_devices(device_map)
        if "disk" in devices:
            raise ValueError("nibble.transformers: device_map puts layers on disk; nibble layers hold their packed "
                             "weights in memory (offloading is not supported)")
        gpus = {d for d in devices if d not in ("cpu", "meta")}
        if "cpu" in devices and gpus:
            raise ValueError("nibble.transformers: device_map mixes the CPU with GPUs; nibble layers run on a GPU and "
                             "CPU offloading is not supported (load on the CPU alone, or on GPUs alone)")

    def update_dtype(self, dtype):
        return dtype

    @property
    def quantized_element_size(self):
        fmt = self.quantization_config.format or "nvfp4"
        return weight_sizes(16, 128, fmt)["packed_bytes"] / (16 * 128)

    def preprocess_model(self, model, dtype=None, **kwargs):
        self._dtype = dtype
        return super().preprocess_model(model, dtype=dtype, **kwargs)

    # ------------------------------------------------------- before load

    def _process_model_before_weight_loading(self, model, checkpoint_files=None, **kwargs):
        from .checkpoint import open_checkpoint
        path = _checkpoint_path(checkpoint_files)
        ck = open_checkpoint(path) if path is not None else None
        try:
            # (an inconsistent layer is refused with the reader's reason, as
            # load_quantized refuses it, whatever else the checkpoint holds)
            if ck is not None and any(L.quant_format or L.format == "inconsistent" for L in ck.layers):
                self._plan_prequantized(model, ck)
                self._ck, ck = ck, None
                rename = nt._renamer(model)
                renamed = {rename(t.name) for t in self._ck.tensors if rename(t.name) != t.name}
                self._built_dtypes = {n: p.dtype for n, p in model.named_parameters()
                                      if n in renamed and p.is_floating_point()}
            else:
                self._plan_quantize(model, ck)
        finally:
            if ck is not None:
                ck.close()
        return model

    def _plan_prequantized(self, model, ck):
        cfg = self.quantization_config
        self.pre_quantized = True
        formats = sorted({L.quant_format for L in ck.layers if L.quant_format})
        for L in ck.layers:
            if L.format == "inconsistent":   # (as nibble.torch._plan_layers refuses it, before the format checks)
                raise nt.Error(_lib.Status.ERR_CORRUPT, "NB_ERR_CORRUPT", f"{ck.path}: layer {L.prefix}: {L.problem}")
            if L.quant_format and L.config_mismatch:
                raise ValueError(f"nibble.transformers: {ck.path}: layer {L.prefix} ({L.format}) disagrees with the "
                                 f"checkpoint's config: {L.problem}")
        if cfg.format is not None and formats != [cfg.format]:
            raise ValueError(f"nibble.transformers: NibbleConfig(format={cfg.format!r}) but {ck.path} holds "
                             f"{', '.join(formats)} layers (format=None takes the checkpoint as it is)")
        layers, consumed, groups, problems = nt._plan_layers(model, ck)
        planned = {g.prefix for g, _, _ in groups}
        modules = dict(model.named_modules())
        names = nt._group_module_names(model, ck, modules=modules)
        for g in ck.moe_groups:   # quantized experts that would be left to transformers (which cannot read them)
            if g.quant_format and g.prefix not in planned and not isinstance(modules.get(names[g.prefix]),
                                                                                torch.nn.ModuleList):
                problems.append(f"{ck.path}: expert group {g.prefix} ({g.format}) has no experts module of that "
                                "name in the model (nor of the name transformers' renamings give it)")
        if problems:
            raise ValueError("nibble.transformers: " + "; ".join(problems))
        missing = []
        for g, mod, name in groups:
            _swap(model, name, _moe_placeholder(g, mod))
            self._experts.append((g, name))
            if g.per_expert and nt._module_moe_kind(mod)[2]:   # biases nibble reads per expert
                missing += [f"{name}.gate_up_proj_bias", f"{name}.down_proj_bias"]
        if missing:
            model._keys_to_ignore_on_load_missing = set(model._keys_to_ignore_on_load_missing or ())
            model._keys_to_ignore_on_load_missing.add("^(?:" + "|".join(re.escape(n) for n in missing) + ")$")
        for L, mod, _bias, name in layers:
            lay = ck.weight_layout(L)
            _swap(model, name, _placeholder(L.n, L.k, L.quant_format, L.tensor_scale, mod.bias, lay["group"],
                                            lay["scale_type"]))
            self._layers.append((L, name))
        # The quantized tensors are nibble's: transformers leaves them unread and unreported.
        with nt._no_weight_state():
            keys = set(model.state_dict().keys())
        # (consumed also names what the replaced experts modules held, e.g.
        # experts.gate_up_proj: the name transformers' weight conversion
        # gives per-expert checkpoint tensors once it has fused them)
        mine = sorted({t.name for t in ck.tensors if t.name.endswith(nt._IGNORED_SUFFIXES)} | set(consumed))
        mine = [n for n in mine if n not in keys]
        _ignore_unexpected(model, mine)
        self._unread = (model, mine)   # and the names transformers' conversions give them: update_weight_conversions

    def update_weight_conversions(self, weight_conversions, *args, **kwargs):
        """transformers' weight conversions for this load (renamings, the
        fusion of per-expert layers into experts.gate_up_proj ...), left as
        they are: the checkpoint tensors nibble reads are also left
        unreported under the names these conversions give them.  Those names
        differ between versions: transformers 5.17's patterns stop at no
        name boundary, so experts.<e>.gate_proj.weight_scale becomes
        experts.gate_up_proj_scale there, while 5.23 keeps the name."""
        conversions = super().update_weight_conversions(weight_conversions, *args, **kwargs)
        if self._unread is not None:
            model, names = self._unread
            self._unread = None
            _ignore_unexpected(model, _converted_names(model, conversions, names))
        return conversions

    def _plan_quantize(self, model, ck):
        cfg = self.quantization_config
        if cfg.format is None:
            where = f"{ck.path} has" if ck is not None else "the weights have"
            raise ValueError(f"nibble.transformers: {where} no quantized layer nibble reads; "
                             "NibbleConfig(format='nvfp4' or 'mxfp4') quantizes at load")
        if self.pre_quantized and cfg.source:
            raise ValueError(f"nibble.transformers: the checkpoint's quantization_config declares quant_method "
                             f"{cfg.source.get('quant_method')!r} but nibble's reader found no quantized layer "
                             "in it")
        self.pre_quantized = False
        fmt = _FORMATS[cfg.format]
        group = cfg.group_size or _lib.FORMAT_INFO[fmt]["group_size"]
        skip = self.get_modules_to_not_convert(model, cfg.modules_to_not_convert, model._keep_in_fp32_modules)
        for name, mod in model.named_modules():
            if isinstance(mod, torch.nn.Linear) and name and not nt._excluded(name, skip) \
                    and mod.in_features % group == 0:
                self._targets.add(name)
            elif name and nt._expert_kind(mod) is not None and not nt._excluded(name, skip) and not nt._fp4(fmt):
                raise ValueError(f"nibble.transformers: {name} is an experts module and no MoE kernel serves "
                                 f"{cfg.format} (nb_moe_mlp: nvfp4, mxfp4); exclude it with modules_to_not_convert "
                                 "or choose an FP4 format")
            elif name and nt._expert_kind(mod) is not None and not nt._excluded(name, skip):
                _, H, I = nt._expert_dims(mod)
                if H % group == 0 and I % group == 0:
                    self._expert_targets[name] = nt._expert_kind(mod)
        if _lib.FORMAT_INFO[fmt]["tensor_scale"]:   # NVFP4: a fused group's members share one tensor scale
            for name in self._targets:
                key = nt._fused_group_key(name)
                if key is not None:
                    self._groups.setdefault(key, set()).add(name)

    # -------------------------------------------------- quantize at load

    def param_needs_quantization(self, model, param_name, **kwargs):
        prefix, _, leaf = param_name.rpartition(".")
        return not self.pre_quantized and ((leaf == "weight" and prefix in self._targets) or
                                           (leaf in _EXPERT_WEIGHTS and prefix in self._expert_targets))

    def get_quantize_ops(self):
        return _NibbleQuantize(self)

    def _quantize_layer(self, model, prefix, weight, missing_keys):
        mod = model.get_submodule(prefix)
        if not isinstance(mod, torch.nn.Linear):
            raise ValueError(f"nibble.transformers: {prefix} is a {type(mod).__name__}, not an nn.Linear")
        if missing_keys is not None:
            missing_keys.discard(prefix + ".weight")
        key = nt._fused_group_key(prefix)
        if key not in self._groups:
            self._quantize_now(prefix, weight, None)
            return
        # NVFP4, a member of a fused group (q/k/v, gate/up): held until the
        # group's other members are read, then all quantized with the
        # group's one tensor scale, as quantize_model and `nibble quantize`
        # give it (so fuse_projections can fuse them exactly)
        waiting = self._waiting.setdefault(key, {})
        waiting[prefix] = weight
        if set(waiting) == self._groups[key]:
            self._quantize_group(key)

    def _quantize_group(self, key):
        waiting = self._waiting.pop(key)
        ts = nt._shared_tensor_scale(list(waiting.values()))
        for prefix, weight in waiting.items():
            self._quantize_now(prefix, weight, ts)

    def _quantize_now(self, prefix, weight, tensor_scale):
        cfg = self.quantization_config
        try:
            if weight.device.type == "cuda":
                pw = nt.quantize(weight, format=cfg.format, scale_rule=cfg.scale_rule, method=cfg.method,
                                 group_size=cfg.group_size, scale_type=cfg.scale_type, tensor_scale=tensor_scale)
            else:
                qw = _np_quantize(nt._host_array(weight), format=cfg.format, scale_rule=cfg.scale_rule,
                                  method=cfg.method, group_size=cfg.group_size, scale_type=cfg.scale_type,
                                  tensor_scale=tensor_scale)
                pw = nt.pack(qw, "cpu")
        except Exception as e:
            self._errors[prefix] = f"{type(e).__name__}: {e}"
            raise
        # The module is swapped after loading: transformers renews every
        # non-persistent buffer (which packed is) at the end of its load.
        self._pending[prefix] = pw

    def _quantize_experts(self, prefix, leaf, weight, missing_keys):
        """One 3-D weight of an experts module (gate_up_proj or down_proj, as
        transformers read or fused it) quantized expert by expert where it
        was read; the MoeExperts is built once both are there, after
        loading."""
        cfg = self.quantization_config
        transposed = self._expert_targets[prefix][1]
        try:
            qe = nt._quantize_experts(weight, transposed, nt._format_code(cfg.format), cfg.scale_rule, cfg.method,
                                      f"{prefix}.{leaf}")
        except Exception as e:
            self._errors[prefix] = f"{type(e).__name__}: {e}"
            raise
        dev = weight.device if weight.device.type == "cuda" else torch.device("cpu")
        self._pending_experts.setdefault(prefix, {})[leaf] = (qe, dev)
        if missing_keys is not None:
            missing_keys.discard(f"{prefix}.{leaf}")

    def _swap_quantized_experts(self, model):
        """Each experts module whose two weights were quantized at load
        becomes a MoeExperts (its biases, loaded by transformers, kept)."""
        for prefix, kind in self._expert_targets.items():
            got = self._pending_experts.get(prefix, {})
            if set(got) != set(_EXPERT_WEIGHTS):
                continue
            activation, _, has_bias, limit, alpha = kind
            qm = QuantizedMoe(got["gate_up_proj"][0], got["down_proj"][0], activation=activation, limit=limit,
                              alpha=alpha)
            dev = got["gate_up_proj"][1]
            mod = model.get_submodule(prefix)
            biases = [getattr(mod, b, None) if has_bias else None for b in ("gate_up_proj_bias", "down_proj_bias")]
            biases = [None if b is None or b.is_meta else b.detach() for b in biases]
            _swap(model, prefix, nt.MoeExperts(nt.pack_moe(qm, "cpu" if dev.type == "cpu" else dev), *biases))
            self._done_experts.add(prefix)
        self._pending_experts = {}

    # -------------------------------------------------------- after load

    def _built_dtype(self, model):
        """Float parameters loaded under a name transformers' renamings gave
        them, in another dtype than the model built them in, given the
        model's: transformers 5.17 keeps the checkpoint's dtype for every
        tensor it renames while loading a pre-quantized checkpoint (Mixtral's
        router, block_sparse_moe.gate -> mlp.gate, stays BF16 in a float32
        model); 5.23 gives them the model's dtype, as it does for every
        other float tensor."""
        for name, p in model.named_parameters():
            want = self._built_dtypes.get(name)
            if want is not None and p.is_floating_point() and p.dtype != want:
                mod, _, attr = name.rpartition(".")
                owner = model.get_submodule(mod) if mod else model
                owner._parameters[attr] = torch.nn.Parameter(p.detach().to(want), requires_grad=p.requires_grad)

    def _process_model_after_weight_loading(self, model, **kwargs):
        cfg = self.quantization_config
        try:
            if self.pre_quantized:
                self._built_dtype(model)
                self._fill(model)
            else:
                for key in list(self._waiting):   # a group some of whose members were never read
                    self._quantize_group(key)
                for prefix, pw in self._pending.items():
                    bias = model.get_submodule(prefix).bias
                    _swap(model, prefix, nt.Linear(pw, None if bias is None or bias.is_meta else bias))
                left = sorted(self._targets - set(self._pending))
                self._pending = {}
                self._swap_quantized_experts(model)
                left += sorted(set(self._expert_targets) - self._done_experts)
                if left:
                    why = "; ".join(f"{p}: {self._errors[p]}" for p in left if p in self._errors)
                    raise RuntimeError(f"nibble.transformers: {len(left)} layers were not quantized: "
                                       f"{nt._some(left)}" + (f" ({why})" if why else ""))
        finally:
            if self._ck is not None:
                self._ck.close()
                self._ck = None
        if not cfg.dequantize:
            layers = [m for m in model.modules() if isinstance(m, (nt.Linear,))]
            fmts = sorted({m.format for m in layers})
            devs = sorted({str(m.packed.device) for m in layers})
            if "cpu" in devs and len(devs) > 1:
                raise ValueError(f"nibble.transformers: nibble layers ended up on {', '.join(devs)}; they run on a "
                                 "GPU and CPU offloading is not supported")
            fmts = sorted(set(fmts) | {m.format for m in model.modules() if isinstance(m, nt.MoeExperts)})
            if len(fmts) == 1:
                cfg.format = fmts[0]
            cfg._saved_as = None
            if len(fmts) == 1 and fmts[0] in _SAVE_LAYOUT:
                try:
                    cfg._saved_as = save_layout(model)
                except ValueError:   # (no layout holds it, e.g. int4 layers of several groups:
                    pass             #  save_pretrained says why)
        if cfg.fuse:
            cfg.fuse_report = nt.fuse_projections(model)
        return model

    def _fill(self, model):
        cfg = self.quantization_config
        ck = self._ck
        for L, name in self._layers:
            mod = model.get_submodule(name)
            dev = mod.packed.device if not mod.packed.is_meta else torch.device("cpu")
            bias = mod.bias
            if bias is not None and bias.is_meta:
                bias = None
            qw = ck.quantized_weight(L)
            perm = torch.from_numpy(ck.perm(L).astype(np.int64)) if L.k_permuted else None
            if cfg.dequantize:
                dtype = bias.dtype if bias is not None else (self._dtype if isinstance(self._dtype, torch.dtype)
                                                            else torch.bfloat16)
                lin = torch.nn.Linear(L.k, L.n, bias=bias is not None, device="meta", dtype=dtype)
                lin.weight = torch.nn.Parameter(nt._unpermuted(nt.dequantize_weight(qw, dtype, dev), perm),
                                                requires_grad=False)
                if bias is not None:
                    lin.bias = bias
                _swap(model, name, lin)
            else:
                _swap(model, name, nt.Linear.from_quantized(qw, bias, device=dev, perm=perm))
        for g, name in self._experts:
            mod = model.get_submodule(name)
            _swap(model, name, _moe_fill(mod, ck, g, model.config, cfg.dequantize, self._dtype))

    # ---------------------------------------------------------- saving

    def is_serializable(self, safe_serialization=None):
        return True

    @property
    def is_trainable(self):
        return False

    @property
    def is_compileable(self):
        return True

    def get_state_dict_and_metadata(self, model):
        """The model's state_dict with every nibble layer in the checkpoint
        layout of its format (ModelOpt NVFP4, Quark MXFP4, compressed-tensors
        pack-quantized int4 / int4_sym / int8) and every
        MoeExperts as layers_of_experts writes it; sets what to_dict() then
        writes into config.json (save_pretrained saves the config after the
        tensors)."""
        layout = save_layout(model)
        with nt._no_weight_state():   # (each nibble layer's tensors are written below, in the checkpoint's format)
            state = model.state_dict()
        fused = _fuse.members(model)
        for fname, ms in fused.items():   # each member as the layer it was: its rows of the fused layer
            f = model.get_submodule(fname)
            for k in [k for k in state if k.startswith(fname + ".")]:
                state.pop(k)
            q = f.quantized_weight() if isinstance(f, nt.Linear) else None
            perm = None if q is None or f.perm is None else f.perm.cpu().numpy()
            for mname, sl in ms:
                if q is not None:
                    state.update({f"{mname}.{k}": v for k, v in
                                  layer_tensors(_fuse.rows(q, sl.start, sl.stop), perm, layout["dtype"]).items()})
                else:
                    state[f"{mname}.weight"] = f.weight.detach()[sl.start:sl.stop].clone()
                if f.bias is not None:
                    state[f"{mname}.bias"] = f.bias.detach()[sl.start:sl.stop].clone()
        for name, mod in model.named_modules():
            pre = name + "." if name else ""
            if name in fused:
                continue
            if isinstance(mod, nt.Linear):
                perm = None if mod.perm is None else mod.perm.cpu().numpy()
                state.update({pre + k: v for k, v in
                              layer_tensors(mod.quantized_weight(), perm, layout["dtype"]).items()})
            elif isinstance(mod, nt.MoeExperts):
                for k in ("gate_up_proj_bias", "down_proj_bias"):
                    state.pop(pre + k, None)
                state.update(experts_tensors(name, mod.quantized_moe(), layout["experts"], _model_type(model),
                                             mod.gate_up_proj_bias, mod.down_proj_bias))
        self.quantization_config._saved_as = layout
        return state, {}


def _model_type(model):
    cfg = getattr(model, "config", None)
    text = cfg.get_text_config() if cfg is not None and hasattr(cfg, "get_text_config") else cfg
    return getattr(text, "model_type", None) or getattr(cfg, "model_type", None)


def save_layout(model):
    """What save_pretrained writes for `model`: {"format": "nvfp4" | "mxfp4" |
    "int4" | "int4_sym" | "int8", "experts": "gptoss" (gpt-oss's *_blocks /
    *_scales tensors) or "per-expert" (a layer per expert and projection, in
    the format's layout), "unquantized": the names of the float nn.Linear
    layers, "group": for int4 / int4_sym / int8 the group every layer has,
    or "channel" when every layer has one group per row (None for the FP4
    formats)}.

    int4, int4_sym and int8 are written in compressed-tensors'
    pack-quantized layout (layer_tensors), whose config names one group for
    the whole model: layers of different groups are refused (ValueError),
    as are integer experts modules (no expert layout is written for them).

    One checkpoint holds one layout, so that nibble's reader, which
    cross-checks every layer against config.json's quantization_config,
    and other tools read it: gpt-oss's own MXFP4 layout when the only
    quantized modules are gpt-oss experts in MXFP4 (a gpt-oss checkpoint as
    gpt-oss ships it); otherwise ModelOpt NVFP4 or Quark MXFP4 for the
    linear layers and the experts alike (experts one layer per expert, as
    `nibble convert` writes gpt-oss experts and as ModelOpt exports
    Qwen3-MoE).  ValueError for a model with both formats or without
    quantized layers."""
    linears = [m for m in model.modules() if isinstance(m, nt.Linear)]
    experts = [m for m in model.modules() if isinstance(m, nt.MoeExperts)]
    fmts = sorted({m.format for m in linears} | {m.format for m in experts})
    if len(fmts) != 1:
        raise ValueError("nibble.transformers: save_pretrained writes one layout, and this model holds "
                         + (f"{', '.join(fmts)} layers" if fmts else "no nibble layers"))
    if fmts[0] not in _SAVE_LAYOUT:
        raise ValueError(f"nibble.transformers: save_pretrained writes ModelOpt NVFP4, Quark MXFP4, "
                         f"compressed-tensors int4 / int8, bitsandbytes nf4 / fp4 and hqq int4_hqq layouts; no "
                         f"checkpoint layout is written for {fmts[0]} layers")
    group = None
    if experts and fmts[0] in _GROUP_SCALED + _TABLE_FORMATS:
        raise ValueError(f"nibble.transformers: save_pretrained writes no layout for {fmts[0]} experts modules")
    if fmts[0] == "int4_hqq":   # (per layer in its meta; config.json names the first's, as one HqqConfig does)
        group = linears[0].group if linears[0].group else 64
    if fmts[0] in _INT_FORMATS:
        groups = {m.group if m.group else 128 for m in linears}
        if len(groups) == 1:
            group = groups.pop()
        elif all(m.group == m.in_features for m in linears):
            group = "channel"
        else:
            raise ValueError(f"nibble.transformers: save_pretrained writes compressed-tensors pack-quantized, whose "
                             f"config names one group; this model's {fmts[0]} layers have groups "
                             f"{sorted(groups)}")
    gptoss = bool(experts) and not linears and fmts == ["mxfp4"] and all(
        m.spec.activation == "swiglu_oai" and m.spec.gate_up_layout == "interleaved" for m in experts)
    fused = _fuse.members(model)   # a fused group is written as its members
    unquantized = sorted([name for name, m in model.named_modules()
                          if isinstance(m, torch.nn.Linear) and name not in fused] +
                         [n for f, ms in fused.items() if isinstance(model.get_submodule(f), torch.nn.Linear)
                          for n, _ in ms])
    dtype = getattr(model, "dtype", None)
    dtype = str(dtype).replace("torch.", "") if isinstance(dtype, torch.dtype) and dtype.is_floating_point else None
    return {"format": fmts[0], "experts": "gptoss" if gptoss else "per-expert", "unquantized": unquantized,
            "group": group, "dtype": dtype}


def _expert_slices(qe, rows):
    """Rows `rows` (a slice) of every expert of a nibble.QuantizedExperts."""
    ts = qe.tensor_scales
    return QuantizedExperts(qe.codes[:, rows].copy(), qe.scales[:, rows].copy(), None if ts is None else ts.copy(),
                            len(range(*rows.indices(qe.n))), qe.k, qe.format)


def experts_tensors(prefix, qm, layout, model_type=None, gate_up_bias=None, down_bias=None):
    """The checkpoint tensors of one experts module (a nibble.QuantizedMoe,
    MoeExperts.quantized_moe(); biases as the module holds them, written in
    their own dtype) under `prefix` (e.g. "model.layers.0.mlp.experts"):

    layout "gptoss" (MXFP4, gpt-oss experts): prefix.gate_up_proj_blocks U8
      [E, 2I, H/32, 16] and _scales U8 [E, 2I, H/32] with gate_up's rows
      interleaved as gpt-oss stores them, down_proj_blocks / _scales, and the
      biases prefix.gate_up_proj_bias [E, 2I], down_proj_bias [E, H];
    layout "per-expert": for each expert e, SwiGLU experts (gate_up
      concatenated) as prefix.e.gate_proj, .up_proj (gate_up's first and
      last I rows) and .down_proj; gpt-oss experts as prefix.e.gate_up_proj
      (rows interleaved: nibble's reader groups such layers only when
      config.json's model_type is "gpt_oss", so model_type must say so) and
      .down_proj, with biases prefix.e.gate_up_proj.bias [2I] and
      prefix.e.down_proj.bias [H]; each layer in layer_tensors' layout (NVFP4:
      gate and up both carry the expert's gate_up tensor scale).

    Every byte is the packed weights' own (codes and scales of
    nb_unpack_host); nothing is quantized again."""
    if layout not in ("gptoss", "per-expert"):
        raise ValueError(f"nibble.transformers: unknown experts layout {layout!r}; expected 'gptoss' or 'per-expert'")
    spec = qm.spec
    E, H, I = spec.experts, spec.hidden, spec.intermediate
    oai = spec.activation == "swiglu_oai"
    if oai != (spec.gate_up_layout == "interleaved"):
        raise ValueError(f"nibble.transformers: {prefix}: {spec.activation} experts with {spec.gate_up_layout} "
                         "gate_up rows have no checkpoint layout (gpt-oss's are swiglu_oai and interleaved, "
                         "SwiGLU experts' concatenated)")
    biases = [b for b in (gate_up_bias, down_bias)]
    if (biases[0] is None) != (biases[1] is None):
        raise ValueError(f"nibble.transformers: {prefix}: experts with one bias of two have no checkpoint layout")
    out = {}
    if layout == "gptoss":
        if spec.format != "mxfp4" or not oai:
            raise ValueError(f"nibble.transformers: {prefix}: the gpt-oss layout holds MXFP4 gpt-oss experts "
                             f"(swiglu_oai), not {spec.format} {spec.activation} ones")
        for name, qe in (("gate_up_proj", qm.gate_up), ("down_proj", qm.down)):
            out[f"{prefix}.{name}_blocks"] = torch.from_numpy(qe.codes.reshape(E, qe.n, qe.k // 32, 16).copy())
            out[f"{prefix}.{name}_scales"] = torch.from_numpy(qe.scales.copy())
        for name, b in zip(("gate_up_proj_bias", "down_proj_bias"), biases):
            if b is not None:
                out[f"{prefix}.{name}"] = b.detach().cpu().contiguous()
        return out
    if oai:
        if model_type != "gpt_oss":
            raise ValueError(f"nibble.transformers: {prefix}: gpt-oss experts are written one layer per expert "
                             "with interleaved gate_up rows, which nibble's reader groups only for config.json "
                             f"model_type 'gpt_oss'; this model's is {model_type!r}")
        layers = {"gate_up_proj": qm.gate_up, "down_proj": qm.down}
    else:
        if biases[0] is not None:
            raise ValueError(f"nibble.transformers: {prefix}: SwiGLU experts with biases have no checkpoint layout "
                             "(nibble's reader groups biases of gpt-oss experts only)")
        layers = {"gate_proj": _expert_slices(qm.gate_up, slice(0, I)),
                  "up_proj": _expert_slices(qm.gate_up, slice(I, 2 * I)), "down_proj": qm.down}
    for e in range(E):
        for name, qe in layers.items():
            out.update({f"{prefix}.{e}.{name}.{k}": v for k, v in layer_tensors(qe.expert(e)).items()})
        if oai and biases[0] is not None:
            for name, b in zip(("gate_up_proj", "down_proj"), biases):
                out[f"{prefix}.{e}.{name}.bias"] = b[e].detach().cpu().clone()
    return out


def _bnb_tensors(qw, dtype=None):
    """bitsandbytes' 4-bit serialization of an nf4 / bnb_fp4
    nibble.QuantizedWeight (what transformers saves for a Linear4bit without
    double quantization, and what nibble's reader takes): weight U8
    [n k / 2, 1], the codes in row-major order two per byte with the first
    in the high nibble (nibble's low nibble first: the nibbles swapped);
    weight.absmax F32 [n k / B], nibble's absmax as it is (B divides k, so
    bitsandbytes' blocks of the flattened tensor are nibble's groups);
    weight.quant_map F32 [16], the format's table; and
    weight.quant_state.bitsandbytes__nf4 (or __fp4) U8, the JSON of
    quant_type, blocksize, dtype (default "bfloat16") and shape [n, k]."""
    import json
    n, k, B = int(qw.n), int(qw.k), int(qw.group_size)
    codes = np.ascontiguousarray(qw.codes, dtype=np.uint8)
    absmax = np.ascontiguousarray(qw.scales).view(np.float32).reshape(-1)
    if codes.shape != (n, k // 2) or k % 2 or absmax.size != n * k // B:
        raise ValueError(f"nibble.transformers: a {qw.format} weight of [{n}, {k}] with codes {codes.shape} and "
                         f"{absmax.size} absmax values has no bitsandbytes layout")
    qt = _BNB_TYPE[qw.format]
    element = "NF4" if qt == "nf4" else "FP4_BNB"
    table = np.array([nibble_element_to_float(element, c) for c in range(16)], np.float32)
    state = {"quant_type": qt, "blocksize": B, "dtype": dtype or "bfloat16", "shape": [n, k]}
    swapped = ((codes >> 4) | (codes << 4)).astype(np.uint8).reshape(-1, 1)
    return {"weight": torch.from_numpy(swapped.copy()), "weight.absmax": torch.from_numpy(absmax.copy()),
            "weight.quant_map": torch.from_numpy(table),
            f"weight.quant_state.bitsandbytes__{qt}": torch.from_numpy(
                np.frombuffer(json.dumps(state).encode(), np.uint8).copy())}


def _ct_int_tensors(qw, perm):
    """compressed-tensors pack-quantized tensors of an int4 / int4_sym /
    int8 nibble.QuantizedWeight (docs/formats.md 5.4), as nb_ckpt_quantize
    writes the 4-bit ones: weight_packed I32 [n, ceil(k b / 32)] for b-bit
    codes (element j at bits b (j % (32 / b)) of word j / (32 / b),
    int4_sym's and int8's two's-complement codes offset by 8 or 128),
    weight_scale F16/BF16 [n, k/g] as they are, weight_shape I64 [2], and
    for int4
    weight_zero_point I32 [ceil(n/8), k/g] (the zero points, packed along
    n).  Both store their codes little-endian from element 0 (nibble's low
    nibble first, or its bytes), so weight_packed is nibble's code bytes
    with the offset's bit flipped.  With perm (the columns' input features,
    act-order) the codes are put back in input-feature order and
    weight_g_idx I32 [k] says each feature's group, which the reader turns
    back into the same weight."""
    n, k, g = int(qw.n), int(qw.k), int(qw.group_size)
    codes = np.ascontiguousarray(qw.codes, dtype=np.uint8)
    i8 = qw.format == "int8"
    out = {}
    if perm is not None:
        perm = np.asarray(perm, dtype=np.int64)
        if perm.shape != (k,) or not np.array_equal(np.sort(perm), np.arange(k)):
            raise ValueError(f"nibble.transformers: perm is not a permutation of {k} input features")
        elems = codes if i8 else np.stack([codes & 15, codes >> 4], -1).reshape(n, k)
        orig = np.empty_like(elems)
        orig[:, perm] = elems
        codes = orig if i8 else (orig[:, 0::2] | (orig[:, 1::2] << 4)).astype(np.uint8)
        gidx = np.empty(k, np.int32)
        gidx[perm] = np.arange(k) // g
        out["weight_g_idx"] = torch.from_numpy(gidx)
    if qw.format == "int4_sym":
        codes = codes ^ np.uint8(0x88)   # each nibble's bit 3: two's complement -> offset 8
    elif i8:
        codes = codes ^ np.uint8(0x80)   # each byte's bit 7: two's complement -> offset 128
    per = 4 if i8 else 8                 # codes per 32-bit word
    words = (k + per - 1) // per
    packed = np.zeros((n, words * 4), np.uint8)
    packed[:, :codes.shape[1]] = codes
    out["weight_packed"] = torch.from_numpy(packed.view("<i4").astype(np.int32))
    scales = np.ascontiguousarray(qw.scales)
    if scales.dtype == np.uint16:   # BF16 bits
        out["weight_scale"] = torch.from_numpy(scales.view(np.int16).copy()).view(torch.bfloat16)
    elif scales.dtype == np.float16:
        out["weight_scale"] = torch.from_numpy(scales.copy())
    else:
        raise ValueError(f"nibble.transformers: {qw.format} scales of dtype {scales.dtype} have no compressed-tensors "
                         "layout (float16 or bfloat16)")
    out["weight_shape"] = torch.tensor([n, k], dtype=torch.int64)
    if qw.format == "int4":
        z = np.zeros(((n + 7) // 8 * 8, k // g), np.uint32)
        z[:n] = np.asarray(qw.zeros, dtype=np.uint8) & 15
        z = z.reshape(-1, 8, k // g)
        word = np.zeros((z.shape[0], k // g), np.uint32)
        for e in range(8):
            word |= z[:, e] << np.uint32(4 * e)
        out["weight_zero_point"] = torch.from_numpy(word.view(np.int32).copy())
    return out


def _hqq_string(text):
    return torch.tensor([ord(c) for c in text], dtype=torch.uint8)


def _hqq_tensors(qw):
    """An int4_hqq layer as hqq 0.2.8's HQQLinear.state_dict() encodes it for
    safetensors (4 bits, axis 1; docs/formats.md 5.5): W_q U8 [R / 2, G]
    with R = N K / G groups of G codes, row r of the first half in the high
    nibbles and row R / 2 + r in the low ones (hqq's 4bit_u8 packing);
    scale and zero [R, 1] in the scale type (hqq's compute dtype); the meta
    values as hqq's encode_safetensor_type writes them.  hqq's quantize
    flags (optimize, round_zero) are written as 0: they are its bookkeeping,
    read by nobody; nibble does not record them.  R must be even (hqq packs
    half the rows over the other half)."""
    n, k = qw.n, qw.k
    g = qw.group or 64
    rows = n * k // g
    if rows % 2:
        raise ValueError(f"nibble.transformers: an int4_hqq layer of {n} x {k} in groups of {g} has {rows} groups; "
                         "hqq's 4-bit packing needs an even number")
    c = np.ascontiguousarray(qw.codes).reshape(n, k // 2)
    q = np.stack([c & 15, c >> 4], -1).reshape(rows, g).astype(np.uint8)   # codes in k order, rows of one group
    wq = (q[: rows // 2] << 4) | q[rows // 2:]
    tdt = torch.float16 if qw.scale_type in (None, "f16") else torch.bfloat16
    as16 = lambda a: torch.from_numpy(np.ascontiguousarray(a).view(np.int16).reshape(rows, 1).copy()).view(tdt)
    u8 = lambda v: torch.tensor(int(v), dtype=torch.uint8)
    i32 = lambda v: torch.tensor(int(v), dtype=torch.int32)
    return {"W_q": torch.from_numpy(wq), "nbits": i32(4), "group_size": i32(g),
            "shape": torch.tensor([n, k], dtype=torch.int64), "scale": as16(qw.scales), "zero": as16(qw.zeros),
            "axis": i32(1), "packing": _hqq_string("4bit_u8"), "unpack_view_dtype": _hqq_string("torch.uint8"),
            "view_as_float": u8(0), "quant_scale": u8(0), "quant_zero": u8(0),
            "compute_dtype": _hqq_string(str(tdt)), "offload_meta": u8(0), "encoded_state_dict": u8(1),
            "stores_quant_config": u8(1), "channel_wise": u8(1), "optimize": u8(0), "round_zero": u8(0)}


def layer_tensors(qw, perm=None, dtype=None):
    """The tensors of one layer in the layout save_pretrained writes:
    ModelOpt NVFP4 (weight U8, weight_scale F8_E4M3, weight_scale_2 F32 0-d),
    Quark MXFP4 (weight U8, weight_scale U8), for int4 / int4_sym / int8
    compressed-tensors pack-quantized (weight_packed, weight_scale,
    weight_shape, weight_zero_point for int4; weight_g_idx when perm, the
    act-order permutation of nibble.torch.Linear, is given), for nf4 /
    bnb_fp4 bitsandbytes' serialization (_bnb_tensors; dtype its
    quant_state's dtype), or for int4_hqq hqq's encoded HQQLinear state_dict
    (_hqq_tensors)."""
    if qw.format in _INT_FORMATS:
        return _ct_int_tensors(qw, perm)
    if qw.format == "int4_hqq" and perm is None:
        return _hqq_tensors(qw)
    if qw.format in _TABLE_FORMATS and perm is None:
        return _bnb_tensors(qw, dtype)
    if perm is not None:
        raise ValueError(f"nibble.transformers: {qw.format} layers have no act-order layout")
    codes = torch.from_numpy(np.ascontiguousarray(qw.codes).copy())
    scales = torch.from_numpy(np.ascontiguousarray(qw.scales).copy())
    if qw.format == "nvfp4":
        return {"weight": codes, "weight_scale": scales.view(torch.float8_e4m3fn),
                "weight_scale_2": torch.tensor(qw.tensor_scale, dtype=torch.float32)}
    if qw.format == "mxfp4":
        return {"weight": codes, "weight_scale": scales}
    raise ValueError(f"nibble.transformers: no checkpoint layout is written for {qw.format}")


class _NibbleQuantize(ConversionOps):
    """The conversion transformers runs on each weight it reads when
    quantizing at load (HfQuantizer.get_quantize_ops): the layer becomes a
    nibble.torch.Linear at once, so the whole BF16 model never exists."""

    def __init__(self, quantizer):
        self.quantizer = quantizer

    def convert(self, input_dict, model=None, missing_keys=None, **kwargs):
        out = {}
        for key, value in input_dict.items():
            tensor = value[0] if isinstance(value, list) else value
            prefix, _, leaf = key.rpartition(".")
            if leaf == "weight" and prefix in self.quantizer._targets:
                self.quantizer._quantize_layer(model, prefix, tensor, missing_keys)
            elif leaf in _EXPERT_WEIGHTS and prefix in self.quantizer._expert_targets:
                self.quantizer._quantize_experts(prefix, leaf, tensor, missing_keys)
            else:
                out[key] = value
        return out


# ----------------------------------------------------------- registration

_taken = {}   # quant_method -> the (config class, quantizer class) nibble replaced, for restore()


def _register():
    configs, quantizers = _auto.AUTO_QUANTIZATION_CONFIG_MAPPING, _auto.AUTO_QUANTIZER_MAPPING
    for method in ("nibble", "modelopt"):
        if method not in configs and method not in quantizers:
            configs[method] = NibbleConfig
            quantizers[method] = NibbleHfQuantizer
    global _merge_original
    if _merge_original is not None:
        return
    _merge_original = _auto.AutoHfQuantizer.merge_quantization_configs.__func__

    def merge_quantization_configs(cls, quantization_config, quantization_config_from_args):
        # A NibbleConfig passed to from_pretrained takes the checkpoint over,
        # whoever owns its quant_method; every other case is transformers'.
        if isinstance(quantization_config_from_args, NibbleConfig):
            src = quantization_config if isinstance(quantization_config, dict) else None
            if src and src.get("quant_method") != "nibble" and quantization_config_from_args.source is None:
                quantization_config_from_args.source = dict(src)
            return quantization_config_from_args
        return _merge_original(cls, quantization_config, quantization_config_from_args)

    _auto.AutoHfQuantizer.merge_quantization_configs = classmethod(merge_quantization_configs)


_merge_original = None


class _Override:
    def __init__(self, methods):
        self.methods = methods

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        restore(*self.methods)

    def __repr__(self):
        return f"<nibble.transformers override of {', '.join(self.methods)}>"


def override(*methods):
    """Route checkpoints whose quantization_config.quant_method is one of
    `methods` (default: all of OVERRIDABLE) to nibble for the rest of the
    process, in place of transformers' own quantizer for them; restore()
    puts those back.  Also a context manager: `with override("quark"): ...`
    restores on exit."""
    methods = tuple(methods) or OVERRIDABLE
    for m in methods:
        if m not in OVERRIDABLE:
            raise ValueError(f"nibble.transformers: nibble reads no layout of quant_method {m!r}; it can take over "
                             f"{', '.join(OVERRIDABLE)}")
    configs, quantizers = _auto.AUTO_QUANTIZATION_CONFIG_MAPPING, _auto.AUTO_QUANTIZER_MAPPING
    for m in methods:
        if m not in _taken and configs.get(m) is not NibbleConfig:
            _taken[m] = (configs.get(m), quantizers.get(m))
        configs[m], quantizers[m] = NibbleConfig, NibbleHfQuantizer
    return _Override(methods)


def restore(*methods):
    """Give the quant_methods override() took (default: all of them) back to
    the quantizers that held them before (none for one that had none)."""
    configs, quantizers = _auto.AUTO_QUANTIZATION_CONFIG_MAPPING, _auto.AUTO_QUANTIZER_MAPPING
    for m in (tuple(methods) or tuple(_taken)):
        if m not in _taken:
            continue
        cfg, q = _taken.pop(m)
        for table, value in ((configs, cfg), (quantizers, q)):
            if value is None:
                table.pop(m, None)
            else:
                table[m] = value


_register()
