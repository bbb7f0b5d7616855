"""ctypes mirror of include/nibble.h (version 0.1.0) and the loader for libnibble.

Everything here is a one-to-one image of the C header: the enums with their
explicit values, the structs field by field (tests/test_basic.py compares
sizes and offsets with the C compiler's when one is available), and the
function prototypes.  The numpy-level API lives in nibble/__init__.py.

The library is looked up in this order:
  1. next to this file (where `pip install ./python` puts it);
  2. the path in the environment variable NIBBLE_LIBRARY (e.g. a development
     build: NIBBLE_LIBRARY=build/libnibble.so).
Import fails with ImportError when neither exists or when the library's
version does not match the header this file mirrors (same major and minor).
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


class Format(enum.IntEnum):
    NVFP4 = 1
    MXFP4 = 2


class ScaleType(enum.IntEnum):
    E4M3 = 1
    E8M0 = 2


class MxScaleRule(enum.IntEnum):
    OCP = 0
    ROUND_UP = 1
    EVEN = 2


class Layout(enum.IntEnum):
    CHECKPOINT = 1
    PACKED = 2


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
        ("reserved", c_int32 * 6),
    ]


class WeightSizes(Structure):
    """nb_weight_sizes"""
    _fields_ = [
        ("codes_bytes", c_size_t),
        ("scales_bytes", c_size_t),
        ("packed_bytes", c_size_t),
        ("dense_elements", c_size_t),
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
    ("nb_weight_desc_init", c_int, [POINTER(WeightDesc), c_int, c_int64, c_int64]),
    ("nb_weight_desc_validate", c_int, [POINTER(WeightDesc)]),
    ("nb_weight_get_sizes", c_int, [POINTER(WeightDesc), POINTER(WeightSizes)]),
    ("nb_quantize_host", c_int, [ContextP, POINTER(WeightDesc), c_int, c_void_p, _u8p, _u8p]),
    ("nb_dequantize_host", c_int, [ContextP, POINTER(WeightDesc), _u8p, _u8p, c_int, c_void_p]),
    ("nb_dequantize", c_int, [ContextP, POINTER(WeightDesc), c_void_p, c_void_p, c_int, c_void_p, c_void_p]),
    ("nb_pack_host", c_int, [ContextP, POINTER(WeightDesc), _u8p, _u8p, c_void_p, c_size_t]),
    ("nb_pack", c_int, [ContextP, POINTER(WeightDesc), c_void_p, c_void_p, c_void_p, c_size_t, c_void_p]),
    ("nb_gemm_desc_init", c_int, [POINTER(GemmDesc), POINTER(WeightDesc), c_int64, c_int, c_int]),
    ("nb_gemm_host", c_int, [ContextP, POINTER(GemmDesc), c_void_p, _u8p, _u8p, c_void_p, c_void_p]),
    ("nb_gemm_host_f64", c_int, [ContextP, POINTER(GemmDesc), c_void_p, _u8p, _u8p, c_void_p, POINTER(c_double)]),
    ("nb_gemm_can_implement", c_int, [ContextP, POINTER(GemmDesc)]),
    ("nb_gemm_workspace_size", c_int, [ContextP, POINTER(GemmDesc), POINTER(c_size_t)]),
    ("nb_gemm", c_int, [ContextP, POINTER(GemmDesc), c_void_p, c_void_p, c_void_p, c_void_p, c_void_p, c_size_t,
                        c_void_p]),
    ("nb_gemm_last_config", c_int, [ContextP, POINTER(c_char), c_size_t]),
    ("nb_gemm_reference_device", c_int, [ContextP, POINTER(GemmDesc), c_void_p, c_void_p, c_void_p, c_void_p,
                                         c_void_p, c_void_p]),
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
if library_version // 100 != NB_VERSION // 100:
    raise ImportError(f"nibble: {library_path} is libnibble {lib.nb_version_string().decode()} (NB_VERSION "
                      f"{library_version}) but these bindings mirror nibble.h {NB_VERSION_MAJOR}.{NB_VERSION_MINOR}."
                      f"{NB_VERSION_PATCH}; the struct layouts may differ. Rebuild or reinstall the package.")


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


# ----------------------------------------------------------------- context

class Context:
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

    def close(self):
        if getattr(self, "_ptr", None):
            lib.nb_context_destroy(self._ptr)
            self._ptr = None

    def __del__(self):
        self.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

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


_tls = threading.local()


def default_context():
    """A host-only context per thread, created on first use."""
    ctx = getattr(_tls, "ctx", None)
    if ctx is None:
        ctx = _tls.ctx = Context(NB_DEVICE_NONE)
    return ctx
