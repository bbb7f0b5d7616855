"""ctypes mirror of include/nibble.h and include/nibble_io.h (version 0.1.0)
and the loader for libnibble.

Everything here is a one-to-one image of the public C headers: the enums with
their explicit values, the public structs field by field (the tests compare
sizes and offsets with the C compiler's when one is available, and the
checkpoint structs are checked against nb_io_struct_size at load time), and
the function prototypes.  The formats are not mirrored: Format and
FORMAT_INFO are built from the library's format table (nb_format_list,
nb_format_get_info) when the library is loaded.  The numpy-level API lives in
nibble/__init__.py.

The library is looked up in this order:
  1. next to this file (where `pip install ./python` puts it);
  2. the path in the environment variable NIBBLE_LIBRARY (e.g. a development
     build: NIBBLE_LIBRARY=build/libnibble.so).
Import fails with ImportError when neither exists or when the library's
version (nb_version()) is not the NB_VERSION these bindings were written for.
The checkpoint API (nibble_io.h) is part of libnibble when it was built with
cJSON; io_lib() says whether it is there.
"""

import ctypes
import enum
import glob
import os
import sys
import threading
from ctypes import (POINTER, Structure, c_char, c_char_p, c_double, c_float, c_int, c_int32, c_int64, c_size_t,
                    c_uint8, c_void_p)

# ------------------------------------------------------------------ version

NB_VERSION_MAJOR = 0
NB_VERSION_MINOR = 1
NB_VERSION_PATCH = 0
NB_VERSION = NB_VERSION_MAJOR * 10000 + NB_VERSION_MINOR * 100 + NB_VERSION_PATCH
NB_DEVICE_NONE = -1


# ------------------------------------------------------------------- enums
# C enums are `int` on every ABI we target, so they travel as c_int.

class Status(enum.IntEnum):
    OK = 0
    ERR_INVALID_ARGUMENT = 1
    ERR_NULL_POINTER = 2
    ERR_BAD_SHAPE = 3
    ERR_MISALIGNED = 4
    ERR_UNSUPPORTED = 5
    ERR_NO_DEVICE = 6
    ERR_CUDA = 7
    ERR_OUT_OF_MEMORY = 8
    ERR_OVERFLOW = 9
    ERR_WORKSPACE = 10
    ERR_IO = 11
    ERR_CORRUPT = 12
    ERR_NOT_FOUND = 13
    ERR_BUFFER_TOO_SMALL = 14
    ERR_INTERNAL = 15


class DType(enum.IntEnum):
    F32 = 1   # host reference only
    F16 = 2
    BF16 = 3


class ScaleType(enum.IntEnum):
    E4M3 = 1
    E8M0 = 2
    F16 = 3
    BF16 = 4
    F32 = 5


class ElementType(enum.IntEnum):
    E2M1 = 1
    UINT4 = 2
    INT4 = 3
    INT8 = 4
    NF4 = 5
    FP4_BNB = 6


class ZeroType(enum.IntEnum):
    NONE = 0
    U8 = 1


GROUPS_PER_CHANNEL = 1 << 30  # NB_GROUPS_PER_CHANNEL; the bit of group g (a power of two) is g itself


class MxScaleRule(enum.IntEnum):
    OCP = 0
    ROUND_UP = 1
    EVEN = 2


class Layout(enum.IntEnum):
    CHECKPOINT = 1
    PACKED = 2


class MoeActivation(enum.IntEnum):
    SWIGLU = 1        # silu(gate) * up
    SWIGLU_OAI = 2    # gpt-oss: clamped, (up + 1) * gate * sigmoid(alpha * gate)


class MoeGateUpLayout(enum.IntEnum):
    CONCAT = 1        # gate rows, then up rows
    INTERLEAVED = 2   # gate, up, gate, up, ... (gpt-oss)


# ----------------------------------------------------------------- structs

class DeviceInfo(Structure):
    """nb_device_info"""
    _fields_ = [
        ("device", c_int),
        ("name", c_char * 256),
        ("cc_major", c_int),
        ("cc_minor", c_int),
        ("sm_count", c_int),
        ("max_threads_per_sm", c_int),
        ("regs_per_sm", c_int),
        ("l2_bytes", c_size_t),
        ("smem_per_block_optin", c_size_t),
        ("smem_per_sm", c_size_t),
        ("global_mem_bytes", c_size_t),
        ("mem_clock_khz", c_int),
        ("mem_bus_width_bits", c_int),
    ]

    def to_dict(self):
        d = {name: getattr(self, name) for name, _ in self._fields_}
        d["name"] = self.name.decode("utf-8", "replace")
        return d


class BuildInfo(Structure):
    """nb_build_info"""
    _fields_ = [
        ("cuda", c_int),
        ("cuda_archs", c_char * 128),
        ("formats", c_char * 128),
        ("version", c_char * 32),
    ]

    def to_dict(self):
        return {"cuda": bool(self.cuda), "cuda_archs": self.cuda_archs.decode(), "formats": self.formats.decode(),
                "version": self.version.decode()}


class FormatInfo(Structure):
    """nb_format_info: one row of the library's format table"""
    _fields_ = [
        ("format", c_int),          # nb_format
        ("name", c_char * 16),
        ("element", c_int32),       # nb_element_type
        ("element_bits", c_int32),
        ("group_size", c_int32),
        ("scale_type", c_int32),    # nb_scale_type
        ("scale_bytes", c_int32),
        ("tensor_scale", c_int32),
        ("zero_point", c_int32),
        ("kernels", c_int32),
        ("groups", c_int32),        # NB_GROUPS_* bits
        ("scale_types", c_int32),   # NB_SCALE_BIT(t) bits
        ("zero_type", c_int32),     # nb_zero_type
        ("reserved", c_int32 * 3),
    ]

    def to_dict(self):
        d = {name: int(getattr(self, name)) for name, _ in self._fields_ if name not in ("name", "reserved")}
        d["name"] = self.name.decode()
        d["tensor_scale"] = bool(self.tensor_scale)
        d["zero_point"] = bool(self.zero_point)
        d["kernels"] = bool(self.kernels)
        # the sets as lists: group sizes (and "k" for one group per row), scale type names
        d["group_sizes"] = [g for g in (16, 32, 64, 128, 256, 512, 1024, 2048, 4096) if self.groups & g]
        d["per_channel"] = bool(self.groups & GROUPS_PER_CHANNEL)
        d["scale_type_names"] = [ScaleType(t).name.lower() for t in ScaleType if self.scale_types & (1 << t)]
        return d


class WeightDesc(Structure):
    """nb_weight_desc"""
    _fields_ = [
        ("format", c_int),          # nb_format
        ("layout", c_int),          # nb_layout
        ("n", c_int64),
        ("k", c_int64),
        ("group_size", c_int32),
        ("scale_type", c_int),      # nb_scale_type
        ("scale_rule", c_int),      # nb_mx_scale_rule
        ("tensor_scale", c_float),
        ("scale_exp_min", c_int32),
        ("scale_exp_max", c_int32),
        ("method", c_int32),        # nb_quant_method: 0 rtn, 1 mse, 2 hqq
        ("reserved", c_int32 * 5),
    ]


class WeightSizes(Structure):
    """nb_weight_sizes"""
    _fields_ = [
        ("codes_bytes", c_size_t),
        ("scales_bytes", c_size_t),
        ("packed_bytes", c_size_t),
        ("dense_elements", c_size_t),
    ]


class WeightSizesV2(Structure):
    """nb_weight_sizes_v2"""
    _fields_ = [
        ("codes_bytes", c_size_t),
        ("scales_bytes", c_size_t),
        ("zeros_bytes", c_size_t),
        ("packed_bytes", c_size_t),
        ("dense_elements", c_size_t),
        ("reserved", c_int32 * 8),
    ]


class WeightBuffers(Structure):
    """nb_weight_buffers (written) and nb_weight_data (read): the same layout"""
    _fields_ = [
        ("codes", c_void_p),
        ("scales", c_void_p),
        ("zeros", c_void_p),
        ("reserved", c_void_p * 4),
    ]


class GemmDesc(Structure):
    """nb_gemm_desc"""
    _fields_ = [
        ("m", c_int64),
        ("weight", WeightDesc),
        ("act_dtype", c_int),       # nb_dtype
        ("out_dtype", c_int),       # nb_dtype
        ("lda", c_int64),
        ("ldc", c_int64),
        ("reserved", c_int32 * 8),
    ]


class GemmConfig(Structure):
    """nb_gemm_config: one kernel configuration (tuning)"""
    _fields_ = [
        ("path", c_int32),          # nb_gemm_path: 1 decode, 2 tensor core (Hopper), 3 mma (sm_80+)
        ("kw", c_int32),
        ("splits", c_int32),        # CTAs along k: decode 1..64, tensor core 1..8, mma 1
        ("variant", c_int32),       # decode: 0 plain, 1 staged
        ("rpw", c_int32),
        ("bn", c_int32),
        ("raster", c_int32),
        ("stages", c_int32),        # mma: pipeline depth 2 or 3, 0 = the deepest that fits
        ("warps", c_int32),         # decode, staged: consumer warps per CTA, 8 or 12; 0 = the planner's choice
        ("stream_k", c_int32),      # tensor core: 1 the stream-K grid, -1 whole tiles, 0 = the planner's choice
        ("reserved", c_int32 * 2),
    ]


class MoeDesc(Structure):
    """nb_moe_desc"""
    _fields_ = [
        ("m", c_int64),
        ("experts", c_int32),
        ("top_k", c_int32),
        ("hidden", c_int64),
        ("intermediate", c_int64),
        ("gate_up", WeightDesc),
        ("down", WeightDesc),
        ("activation", c_int32),       # nb_moe_activation
        ("gate_up_layout", c_int32),   # nb_moe_gate_up_layout
        ("limit", c_float),
        ("alpha", c_float),
        ("act_dtype", c_int),          # nb_dtype
        ("reserved", c_int32 * 9),
    ]


class GluDesc(Structure):
    """nb_glu_desc"""
    _fields_ = [
        ("m", c_int64),
        ("n", c_int64),
        ("activation", c_int32),       # nb_moe_activation
        ("layout", c_int32),           # nb_moe_gate_up_layout
        ("limit", c_float),
        ("alpha", c_float),
        ("dtype", c_int),              # nb_dtype
        ("reserved", c_int32 * 7),
    ]


class MoeSizes(Structure):
    """nb_moe_sizes"""
    _fields_ = [
        ("gate_up", WeightSizesV2),
        ("down", WeightSizesV2),
        ("x_bytes", c_size_t),
        ("gate_up_bias_bytes", c_size_t),
        ("down_bias_bytes", c_size_t),
        ("reserved", c_int32 * 8),
    ]


class MoeWeights(Structure):
    """nb_moe_weights (host, checkpoint layout, expert-major)"""
    _fields_ = [
        ("gate_up", WeightBuffers),
        ("down", WeightBuffers),
        ("gate_up_scales", POINTER(c_float)),
        ("down_scales", POINTER(c_float)),
        ("gate_up_bias", c_void_p),
        ("down_bias", c_void_p),
        ("reserved", c_void_p * 4),
    ]


class MoeAlignSizes(Structure):
    """nb_moe_align_sizes"""
    _fields_ = [
        ("slots", c_int64),
        ("sorted_len", c_int64),
        ("blocks", c_int64),
        ("offsets_len", c_int64),
        ("reserved", c_int32 * 8),
    ]


class MoePackedSizes(Structure):
    """nb_moe_packed_sizes"""
    _fields_ = [
        ("gate_up_expert_bytes", c_size_t),
        ("down_expert_bytes", c_size_t),
        ("gate_up_bytes", c_size_t),
        ("down_bytes", c_size_t),
        ("reserved", c_int32 * 8),
    ]


class MoePackedWeights(Structure):
    """nb_moe_packed_weights (device pointers)"""
    _fields_ = [
        ("gate_up", c_void_p),
        ("down", c_void_p),
        ("gate_up_scales", c_void_p),
        ("down_scales", c_void_p),
        ("gate_up_bias", c_void_p),
        ("down_bias", c_void_p),
        ("reserved", c_void_p * 4),
    ]


class _Context(Structure):
    """opaque nb_context"""


ContextP = POINTER(_Context)
_u8p = POINTER(c_uint8)

# (name, restype, argtypes): every function of nibble.h.
_PROTOTYPES = [
    ("nb_version", c_int, []),
    ("nb_version_string", c_char_p, []),
    ("nb_status_string", c_char_p, [c_int]),
    ("nb_status_name", c_char_p, [c_int]),
    ("nb_last_error", c_char_p, []),
    ("nb_context_create", c_int, [c_int, POINTER(ContextP)]),
    ("nb_context_destroy", c_int, [ContextP]),
    ("nb_context_last_error", c_char_p, [ContextP]),
    ("nb_context_device_info", c_int, [ContextP, POINTER(DeviceInfo)]),
    ("nb_device_count", c_int, [POINTER(c_int)]),
    ("nb_get_build_info", c_int, [POINTER(BuildInfo)]),
    ("nb_format_get_info", c_int, [c_int, POINTER(FormatInfo)]),
    ("nb_format_list", c_int, [POINTER(c_int), c_size_t, POINTER(c_size_t)]),
    ("nb_format_from_name", c_int, [c_char_p, POINTER(c_int)]),
    ("nb_weight_desc_init", c_int, [POINTER(WeightDesc), c_int, c_int64, c_int64]),
    ("nb_weight_desc_validate", c_int, [POINTER(WeightDesc)]),
    ("nb_weight_get_sizes", c_int, [POINTER(WeightDesc), POINTER(WeightSizes)]),
    ("nb_weight_get_sizes_v2", c_int, [POINTER(WeightDesc), POINTER(WeightSizesV2)]),
    ("nb_quantize_host_v2", c_int, [ContextP, POINTER(WeightDesc), c_int, c_void_p, POINTER(WeightBuffers)]),
    ("nb_dequantize_host_v2", c_int, [ContextP, POINTER(WeightDesc), POINTER(WeightBuffers), c_int, c_void_p]),
    ("nb_gemm_host_v2", c_int, [ContextP, POINTER(GemmDesc), c_void_p, POINTER(WeightBuffers), c_void_p, c_void_p]),
    ("nb_gemm_host_f64_v2", c_int, [ContextP, POINTER(GemmDesc), c_void_p, POINTER(WeightBuffers), c_void_p,
                                    POINTER(c_double)]),
    ("nb_element_to_float", c_float, [c_int, c_uint8]),
    ("nb_quantize_host", c_int, [ContextP, POINTER(WeightDesc), c_int, c_void_p, _u8p, _u8p]),
    ("nb_quantize", c_int, [ContextP, POINTER(WeightDesc), c_int, c_void_p, c_void_p, c_void_p, c_void_p]),
    ("nb_quantize_staged", c_int, [ContextP, POINTER(WeightDesc), c_int, c_void_p, _u8p, _u8p, c_void_p]),
    ("nb_dequantize_host", c_int, [ContextP, POINTER(WeightDesc), _u8p, _u8p, c_int, c_void_p]),
    ("nb_dequantize", c_int, [ContextP, POINTER(WeightDesc), c_void_p, c_void_p, c_int, c_void_p, c_void_p]),
    ("nb_pack_host", c_int, [ContextP, POINTER(WeightDesc), _u8p, _u8p, c_void_p, c_size_t]),
    ("nb_pack", c_int, [ContextP, POINTER(WeightDesc), c_void_p, c_void_p, c_void_p, c_size_t, c_void_p]),
    ("nb_unpack_host", c_int, [ContextP, POINTER(WeightDesc), c_void_p, c_size_t, _u8p, _u8p]),
    # (nb_weight_data, read, has nb_weight_buffers' layout: one mirror serves both)
    ("nb_pack_host_v2", c_int, [ContextP, POINTER(WeightDesc), POINTER(WeightBuffers), c_void_p, c_size_t]),
    ("nb_pack_v2", c_int, [ContextP, POINTER(WeightDesc), POINTER(WeightBuffers), c_void_p, c_size_t, c_void_p]),
    ("nb_unpack_host_v2", c_int, [ContextP, POINTER(WeightDesc), c_void_p, c_size_t, POINTER(WeightBuffers)]),
    ("nb_gemm_desc_init", c_int, [POINTER(GemmDesc), POINTER(WeightDesc), c_int64, c_int, c_int]),
    ("nb_gemm_host", c_int, [ContextP, POINTER(GemmDesc), c_void_p, _u8p, _u8p, c_void_p, c_void_p]),
    ("nb_gemm_host_f64", c_int, [ContextP, POINTER(GemmDesc), c_void_p, _u8p, _u8p, c_void_p, POINTER(c_double)]),
    ("nb_gemm_can_implement", c_int, [ContextP, POINTER(GemmDesc)]),
    ("nb_gemm_workspace_size", c_int, [ContextP, POINTER(GemmDesc), POINTER(c_size_t)]),
    ("nb_gemm", c_int, [ContextP, POINTER(GemmDesc), c_void_p, c_void_p, c_void_p, c_void_p, c_void_p, c_size_t,
                        c_void_p]),
    ("nb_gemm_ex", c_int, [ContextP, POINTER(GemmDesc), POINTER(GemmConfig), c_void_p, c_void_p, c_void_p, c_void_p,
                           c_void_p, c_size_t, c_void_p]),
    ("nb_gemm_workspace_size_ex", c_int, [ContextP, POINTER(GemmDesc), POINTER(GemmConfig), POINTER(c_size_t)]),
    ("nb_gemm_last_config", c_int, [ContextP, POINTER(c_char), c_size_t]),
    ("nb_gemm_reference_device", c_int, [ContextP, POINTER(GemmDesc), c_void_p, c_void_p, c_void_p, c_void_p,
                                         c_void_p, c_void_p]),
    ("nb_tuning_m_bucket", c_int, [c_int64, POINTER(c_int64), POINTER(c_int64)]),
    ("nb_context_load_tuning", c_int, [ContextP, c_char_p]),
    ("nb_context_save_tuning", c_int, [ContextP, c_char_p]),
    ("nb_context_set_tuning", c_int, [ContextP, POINTER(GemmDesc), POINTER(GemmConfig), c_double]),
    ("nb_context_tuning_count", c_int, [ContextP, POINTER(c_size_t), POINTER(c_size_t)]),
    ("nb_gemm_list_configs", c_int, [ContextP, POINTER(GemmDesc), POINTER(GemmConfig), c_size_t, POINTER(c_size_t)]),
    ("nb_moe_desc_init", c_int, [POINTER(MoeDesc), c_int, c_int64, c_int32, c_int32, c_int64, c_int64, c_int, c_int]),
    ("nb_moe_desc_validate", c_int, [POINTER(MoeDesc)]),
    ("nb_moe_get_sizes", c_int, [POINTER(MoeDesc), POINTER(MoeSizes)]),
    ("nb_moe_mlp_host", c_int, [ContextP, POINTER(MoeDesc), c_void_p, POINTER(MoeWeights), POINTER(c_int32),
                                POINTER(c_float), c_void_p]),
    ("nb_moe_mlp_host_f64", c_int, [ContextP, POINTER(MoeDesc), c_void_p, POINTER(MoeWeights), POINTER(c_int32),
                                    POINTER(c_float), POINTER(c_double)]),
    ("nb_moe_align_get_sizes", c_int, [POINTER(MoeDesc), c_int32, POINTER(MoeAlignSizes)]),
    ("nb_moe_align_host", c_int, [ContextP, POINTER(MoeDesc), c_int32, POINTER(c_int32), POINTER(c_int32),
                                  POINTER(c_int32), POINTER(c_int32), POINTER(c_int32), POINTER(MoeAlignSizes)]),
    ("nb_moe_packed_get_sizes", c_int, [POINTER(MoeDesc), POINTER(MoePackedSizes)]),
    ("nb_moe_pack_host", c_int, [ContextP, POINTER(MoeDesc), POINTER(MoeWeights), c_void_p, c_size_t, c_void_p,
                                 c_size_t]),
    ("nb_moe_workspace_size", c_int, [ContextP, POINTER(MoeDesc), POINTER(c_size_t)]),
    ("nb_moe_mlp", c_int, [ContextP, POINTER(MoeDesc), c_void_p, POINTER(MoePackedWeights), c_void_p, c_void_p,
                           c_void_p, c_void_p, c_size_t, c_void_p]),
    ("nb_moe_align", c_int, [ContextP, POINTER(MoeDesc), c_int32, c_void_p, c_void_p, c_void_p, c_void_p, c_void_p,
                             POINTER(MoeAlignSizes), c_void_p]),
    ("nb_glu_desc_init", c_int, [POINTER(GluDesc), c_int, c_int64, c_int64, c_int]),
    ("nb_glu_desc_validate", c_int, [POINTER(GluDesc)]),
    ("nb_glu_host", c_int, [ContextP, POINTER(GluDesc), c_void_p, c_void_p]),
    ("nb_glu", c_int, [ContextP, POINTER(GluDesc), c_void_p, c_void_p, c_void_p]),
    ("nb_e2m1_to_float", c_float, [c_uint8]),
    ("nb_e4m3_to_float", c_float, [c_uint8]),
    ("nb_e8m0_to_float", c_float, [c_uint8]),
    ("nb_float_to_e2m1", c_uint8, [c_float]),
    ("nb_float_to_e4m3", c_uint8, [c_float]),
]


# ------------------------------------------------------------------ loader

def _candidates():
    here = os.path.dirname(os.path.abspath(__file__))
    if sys.platform == "darwin":
        names = ["libnibble.dylib", "libnibble.*.dylib"]
    elif sys.platform == "win32":
        names = ["nibble.dll"]
    else:
        # install(TARGETS) also ships the versioned names; any of them is the same file.
        names = ["libnibble.so", "libnibble.so.*"]
    for pattern in names:
        for path in sorted(glob.glob(os.path.join(here, pattern))):
            yield path, "the package directory"
    env = os.environ.get("NIBBLE_LIBRARY")
    if env:
        yield env, "NIBBLE_LIBRARY"


def _load():
    tried = []
    for path, origin in _candidates():
        try:
            lib = ctypes.CDLL(path)
        except OSError as e:
            tried.append(f"{path} ({origin}): {e}")
            continue
        return lib, path
    hint = "; ".join(tried) if tried else "no libnibble in the package directory and NIBBLE_LIBRARY is not set"
    raise ImportError(f"nibble: cannot load libnibble ({hint}). Install with `pip install ./python`, or set "
                      "NIBBLE_LIBRARY to a built libnibble.so (e.g. build/libnibble.so after `make`).")


lib, library_path = _load()
for _name, _res, _args in _PROTOTYPES:
    _fn = getattr(lib, _name)
    _fn.restype = _res
    _fn.argtypes = _args

library_version = lib.nb_version()
if library_version != NB_VERSION:
    raise ImportError(f"nibble: {library_path} is libnibble {lib.nb_version_string().decode()} (NB_VERSION "
                      f"{library_version}) but these bindings were written for {NB_VERSION_MAJOR}.{NB_VERSION_MINOR}."
                      f"{NB_VERSION_PATCH} (NB_VERSION {NB_VERSION}); the struct layouts may differ. Rebuild or "
                      "reinstall the package.")


# ------------------------------------------------------------------ errors

class Error(RuntimeError):
    """A libnibble call failed.  `status` is the nb_status value (a Status),
    `name` its symbolic name ("NB_ERR_BAD_SHAPE"), `message` the library's
    detailed message (nb_context_last_error / nb_last_error)."""

    def __init__(self, status, name, message):
        try:
            status = Status(status)
        except ValueError:
            pass
        super().__init__(status, name, message)
        self.status = status
        self.name = name
        self.message = message

    def __str__(self):
        return f"{self.name}: {self.message}"


def status_name(status):
    return lib.nb_status_name(int(status)).decode()


def status_string(status):
    return lib.nb_status_string(int(status)).decode()


def last_error():
    """nb_last_error(): the last failure's message on this thread ("" if none)."""
    return (lib.nb_last_error() or b"").decode("utf-8", "replace")


def check(status, ctx=None):
    """Raise Error unless status is NB_OK; the message comes from ctx when
    given (the per-context message), else from the thread-local buffer."""
    if status == 0:
        return
    msg = lib.nb_context_last_error(ctx) if ctx else lib.nb_last_error()
    msg = (msg or b"").decode("utf-8", "replace") or status_string(status)
    raise Error(status, status_name(status), msg)


# ----------------------------------------------------------------- formats

def _format_table():
    """Every row of the library's format table, in its order."""
    count = c_size_t(0)
    check(lib.nb_format_list(None, 0, ctypes.byref(count)))
    values = (c_int * max(1, count.value))()
    check(lib.nb_format_list(values, count.value, ctypes.byref(count)))
    rows = []
    for v in values[:count.value]:
        info = FormatInfo()
        check(lib.nb_format_get_info(v, ctypes.byref(info)))
        rows.append(info.to_dict())
    return rows


# Format: the library's formats as an IntEnum (members named like the
# formats, upper case: Format.NVFP4); FORMAT_INFO: the row of each (name,
# group_size, scale_type, tensor_scale, kernels, ...).  Nothing here names a
# format: a format added to the C table appears here by itself.
_FORMAT_ROWS = _format_table()
Format = enum.IntEnum("Format", [(r["name"].upper(), r["format"]) for r in _FORMAT_ROWS], module=__name__)
FORMAT_INFO = {Format(r["format"]): r for r in _FORMAT_ROWS}


def format_from_name(name):
    """The Format named `name` (nb_format_from_name, case-insensitive here);
    ValueError with the library's list of names otherwise."""
    value = c_int(0)
    if not isinstance(name, str) or lib.nb_format_from_name(name.lower().encode(), ctypes.byref(value)) != 0:
        raise ValueError(f"nibble: unknown format {name!r} ({last_error()})")
    return Format(value.value)


# ----------------------------------------------------------------- context

class Handle:
    """A C object owned by a Python one: close() releases it once (through
    _release), and so do a `with` block's end and garbage collection."""
    _ptr = None

    def _release(self, ptr):
        raise NotImplementedError

    def close(self):
        ptr = getattr(self, "_ptr", None)
        if ptr:
            self._ptr = None
            self._release(ptr)

    def __del__(self):
        self.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


class Context(Handle):
    """An nb_context.  Context() is host-only (NB_DEVICE_NONE); Context(0)
    opens CUDA device 0.  Use one per thread (the C context keeps per-call
    state); close() or a `with` block releases it."""

    def __init__(self, device=NB_DEVICE_NONE):
        ptr = ContextP()
        check(lib.nb_context_create(int(device), ctypes.byref(ptr)))
        self._ptr = ptr
        self.device = int(device)

    @property
    def ptr(self):
        if not self._ptr:
            raise ValueError("nibble: the context is closed")
        return self._ptr

    def _release(self, ptr):
        lib.nb_context_destroy(ptr)

    def check(self, status):
        check(status, self.ptr)

    @property
    def last_error(self):
        return (lib.nb_context_last_error(self.ptr) or b"").decode("utf-8", "replace")

    def device_info(self):
        """nb_context_device_info as a dict."""
        info = DeviceInfo()
        self.check(lib.nb_context_device_info(self.ptr, ctypes.byref(info)))
        return info.to_dict()

    def load_tuning(self, path):
        """nb_context_load_tuning: follow the tuning cache `nibble tune` wrote
        (replaces the context's table; NIBBLE_TUNE_CACHE does this at creation)."""
        self.check(lib.nb_context_load_tuning(self.ptr, os.fsencode(path)))

    def tuning_count(self):
        """(entries, entries for this context's GPU) of the tuning table."""
        total, mine = c_size_t(), c_size_t()
        self.check(lib.nb_context_tuning_count(self.ptr, ctypes.byref(total), ctypes.byref(mine)))
        return total.value, mine.value


_tls = threading.local()


def default_context():
    """A host-only context per thread, created on first use."""
    ctx = getattr(_tls, "ctx", None)
    if ctx is None:
        ctx = _tls.ctx = Context(NB_DEVICE_NONE)
    return ctx


# ------------------------------------------------------------- nibble_io.h
# The checkpoint API (include/nibble_io.h), part of libnibble when it was
# built with cJSON.  Only its public structs are mirrored; their sizes are
# checked against nb_io_struct_size when the API is bound.

class StTensor(Structure):
    """nb_st_tensor"""
    _fields_ = [
        ("name", c_char_p),
        ("dtype", c_int),           # nb_st_dtype
        ("rank", c_int),
        ("shape", c_int64 * 8),     # NB_ST_MAX_RANK
        ("data", c_void_p),
        ("bytes", c_size_t),
        ("offset", ctypes.c_uint64),
        ("reserved", c_int32 * 4),
    ]


class CkptLayer(Structure):
    """nb_ckpt_layer"""
    _fields_ = [
        ("prefix", c_char_p),
        ("format", c_int),          # nb_ckpt_format
        ("n", c_int64),
        ("k", c_int64),
        ("experts", c_int64),
        ("tensor_scale", c_float),
        ("bytes", ctypes.c_uint64),
        ("weight_dtype", c_int),    # nb_st_dtype
        ("decided_by", c_int),      # nb_ckpt_source
        ("config_mismatch", c_int),
        ("problem", c_char * 256),
        ("excluded", c_int),            # a config's exclude / ignore list names it
        ("excluded_by", c_char_p),      # the entry that does, or None
        ("excluded_src", c_int),        # nb_ckpt_source
        ("k_permuted", c_int32),        # k reordered (act-order): activations need nb_ckpt_layer_perm
        ("reserved", c_int32 * 7),
    ]


class CkptConfig(Structure):
    """nb_ckpt_config"""
    _fields_ = [
        ("declared", c_int),
        ("source", c_int),
        ("quant_method", c_char_p),
        ("quant_algo", c_char_p),
        ("ct_format", c_char_p),
        ("has_config_json", c_int),
        ("has_hf_quant_config", c_int),
        ("nexclude", c_size_t),         # exclude-list entries read
        ("note", c_char_p),             # entries that could not be used, or None
        ("reserved", c_int32 * 8),
    ]


CkptProgress = ctypes.CFUNCTYPE(None, c_void_p, c_size_t, c_size_t, ctypes.c_uint64, ctypes.c_uint64, c_char_p)


class CkptQuantizeOpts(Structure):
    """nb_ckpt_quantize_opts"""
    _fields_ = [
        ("format", c_int),
        ("mx_rule", c_int),
        ("exclude", POINTER(c_char_p)),
        ("nexclude", c_size_t),
        ("no_default_excludes", c_int),
        ("progress", CkptProgress),
        ("progress_user", c_void_p),
        ("device", c_int),          # nb_ckpt_device
        ("allow_empty", c_int32),
        ("method", c_int32),        # nb_quant_method: 0 rtn, 1 mse
        ("group_size", c_int32),    # integer formats: 0 default, 32/64/128, -1 one group per row
        ("scale_type", c_int32),    # integer formats: 0 default (F16), nb_scale_type F16 or BF16
        ("fused_scales", c_int32),  # NVFP4: q/k/v and gate/up of a module share a tensor scale (1, the default)
        ("reserved", c_int32 * 3),
    ]


class CkptQuantizeSummary(Structure):
    """nb_ckpt_quantize_summary"""
    _fields_ = [
        ("tensors_in", c_size_t),
        ("layers_quantized", c_size_t),
        ("tensors_copied", c_size_t),
        ("weights_excluded", c_size_t),
        ("shards", c_size_t),
        ("files_copied", c_size_t),
        ("bytes_in", ctypes.c_uint64),
        ("bytes_out", ctypes.c_uint64),
        ("device", c_int),          # nb_ckpt_device: where the weights were quantized
        ("device_name", c_char * 256),
        ("weights_unsupported", c_int32),  # rank-2 weights copied for their dtype
        ("experts_quantized", c_int32),    # gpt-oss experts tensors quantized (in layers_quantized too)
        ("reserved", c_int32 * 6),
    ]


class CkptMoeProj(enum.IntEnum):
    GATE_UP = 1       # [2I, H]: gate and up rows in the group's gate_up_layout
    DOWN = 2          # [H, I]
    GATE = 3          # [I, H]: groups of separate gate and up layers only
    UP = 4


class CkptMoe(Structure):
    """nb_ckpt_moe: one expert group"""
    _fields_ = [
        ("prefix", c_char_p),
        ("format", c_int),          # nb_ckpt_format
        ("experts", c_int64),
        ("hidden", c_int64),
        ("intermediate", c_int64),
        ("activation", c_int32),    # nb_moe_activation
        ("gate_up_layout", c_int32),
        ("per_expert", c_int32),
        ("fused", c_int32),
        ("top_k", c_int32),
        ("limit", c_float),
        ("alpha", c_float),
        ("gate_up_bias", c_int64),  # tensor index, -1 when none
        ("down_bias", c_int64),
        ("gate_up_scales_differ", c_int32),
        ("layers", c_int32),
        ("bytes", ctypes.c_uint64),
        ("problem", c_char * 256),
        ("reserved", c_int32 * 8),
    ]


class _Ckpt(Structure):
    """opaque nb_ckpt"""


CkptP = POINTER(_Ckpt)

_IO_PROTOTYPES = [
    ("nb_io_struct_size", c_int, [c_char_p, POINTER(c_size_t)]),
    ("nb_st_dtype_info", c_int, [c_int, POINTER(c_char_p), POINTER(c_int)]),
    ("nb_ckpt_format_name", c_int, [c_int, POINTER(c_char_p)]),
    ("nb_ckpt_source_name", c_int, [c_int, POINTER(c_char_p)]),
    ("nb_ckpt_format_weight", c_int, [c_int, POINTER(c_int)]),
    ("nb_ckpt_device_name", c_int, [c_int, POINTER(c_char_p)]),
    ("nb_ckpt_open", c_int, [c_char_p, POINTER(CkptP)]),
    ("nb_ckpt_close", c_int, [CkptP]),
    ("nb_ckpt_file_count", c_int, [CkptP, POINTER(c_size_t)]),
    ("nb_ckpt_file_at", c_int, [CkptP, c_size_t, POINTER(c_char_p), POINTER(ctypes.c_uint64)]),
    ("nb_ckpt_tensor_count", c_int, [CkptP, POINTER(c_size_t)]),
    ("nb_ckpt_tensor_at", c_int, [CkptP, c_size_t, POINTER(StTensor), POINTER(c_int64)]),
    ("nb_ckpt_layer_count", c_int, [CkptP, POINTER(c_size_t)]),
    ("nb_ckpt_layer_at", c_int, [CkptP, c_size_t, POINTER(CkptLayer)]),
    ("nb_ckpt_get_config", c_int, [CkptP, POINTER(CkptConfig)]),
    ("nb_ckpt_layer_weight", c_int, [CkptP, c_size_t, c_int64, POINTER(WeightDesc), POINTER(_u8p), POINTER(_u8p)]),
    ("nb_ckpt_layer_weight_v2", c_int, [CkptP, c_size_t, c_int64, POINTER(WeightDesc), POINTER(WeightBuffers),
                                        POINTER(WeightSizesV2)]),
    ("nb_ckpt_layer_perm", c_int, [CkptP, c_size_t, POINTER(c_int32), c_size_t]),
    ("nb_ckpt_moe_count", c_int, [CkptP, POINTER(c_size_t)]),
    ("nb_ckpt_moe_at", c_int, [CkptP, c_size_t, POINTER(CkptMoe)]),
    ("nb_ckpt_moe_find", c_int, [CkptP, c_char_p, POINTER(c_size_t)]),
    ("nb_ckpt_layer_moe", c_int, [CkptP, c_size_t, POINTER(c_int64), POINTER(c_int), POINTER(c_int64)]),
    ("nb_ckpt_moe_desc", c_int, [CkptP, c_size_t, c_int64, c_int32, c_int, POINTER(MoeDesc)]),
    ("nb_ckpt_moe_expert", c_int, [CkptP, c_size_t, c_int, c_int64, POINTER(WeightDesc), POINTER(_u8p),
                                   POINTER(_u8p)]),
    ("nb_ckpt_moe_weights", c_int, [CkptP, c_size_t, c_int, POINTER(WeightDesc), POINTER(_u8p), POINTER(_u8p)]),
    ("nb_ckpt_moe_read", c_int, [CkptP, c_size_t, c_int, POINTER(WeightDesc), POINTER(WeightBuffers),
                                 POINTER(WeightSizesV2), POINTER(c_float), c_size_t]),
    ("nb_ckpt_quantize_opts_init", c_int, [POINTER(CkptQuantizeOpts)]),
    ("nb_ckpt_quantize_formats", c_int, [POINTER(c_int), c_size_t, POINTER(c_size_t)]),
    ("nb_ckpt_quantize", c_int, [c_char_p, c_char_p, POINTER(CkptQuantizeOpts), POINTER(CkptQuantizeSummary)]),
]
_IO_STRUCTS = {"nb_st_tensor": StTensor, "nb_ckpt_layer": CkptLayer, "nb_ckpt_config": CkptConfig,
               "nb_ckpt_quantize_opts": CkptQuantizeOpts, "nb_ckpt_quantize_summary": CkptQuantizeSummary,
               "nb_ckpt_moe": CkptMoe}

# The names of nibble_io.h's enum values, read from the library when the API
# is bound (the enums are append-only and contiguous, so each is read up to
# the first value the library refuses): {value: name}.
ST_DTYPES, CKPT_FORMATS, CKPT_SOURCES, CKPT_DEVICES = {}, {}, {}, {}


def _enum_names(fn, first):
    """{value: name} for fn(value, char **name) from `first` up to the first
    value fn refuses."""
    names, v = {}, first
    while True:
        s = c_char_p()
        if fn(v, ctypes.byref(s)) != 0:
            return names
        names[v] = s.value.decode()
        v += 1


def _bind_io():
    """Prototypes, struct-size checks and enum names of the checkpoint API;
    the reason it is unusable, or None."""
    missing = [name for name, _, _ in _IO_PROTOTYPES if not hasattr(lib, name)]
    if missing:
        return (f"{library_path} has no checkpoint API ({missing[0]} is missing): it was built without cJSON; "
                "install libcjson-dev and rebuild or reinstall the package")
    for name, res, args in _IO_PROTOTYPES:
        fn = getattr(lib, name)
        fn.restype = res
        fn.argtypes = args
    for name, struct in _IO_STRUCTS.items():
        size = c_size_t(0)
        if lib.nb_io_struct_size(name.encode(), ctypes.byref(size)) != 0:
            return f"{library_path}: {last_error()}"
        if size.value != ctypes.sizeof(struct):
            return (f"{library_path}: struct {name} is {size.value} bytes there but its mirror in nibble/_lib.py is "
                    f"{ctypes.sizeof(struct)}; the bindings are out of date")
    ST_DTYPES.update(_enum_names(lambda v, out: lib.nb_st_dtype_info(v, out, None), 1))
    CKPT_FORMATS.update(_enum_names(lib.nb_ckpt_format_name, 0))
    CKPT_SOURCES.update(_enum_names(lib.nb_ckpt_source_name, 0))
    CKPT_DEVICES.update({name: v for v, name in _enum_names(lib.nb_ckpt_device_name, 0).items()})
    return None


_io_error = _bind_io()


def io_lib():
    """libnibble with the checkpoint API bound.  Raises ImportError when the
    library was built without it (no cJSON) or its structs do not match these
    bindings."""
    if _io_error:
        raise ImportError(f"nibble: the checkpoint reader is not available: {_io_error}.")
    return lib


def ckpt_weight_format(ckpt_format):
    """The Format a quantized checkpoint layout holds (nb_ckpt_format_weight), or
    None for unquantized and inconsistent layers."""
    value = c_int(0)
    if io_lib().nb_ckpt_format_weight(int(ckpt_format), ctypes.byref(value)) != 0:
        return None
    return Format(value.value)
