"""Tests of nibble.torch (the PyTorch custom op, Linear, quantize_model).

Skipped as a whole without torch; the GPU tests are skipped when
torch.cuda.is_available() is false or libnibble was built without CUDA.
Without a GPU the fake (meta) implementation, the argument checks and the
CPU-side error paths still run.

Accuracy rules (y from the op, x and W exactly as the kernel sees them):
  * against float64 (nibble.gemm_reference(..., out_dtype=np.float64) on the
    same QuantizedWeight):  |y - y64| <= eps * |y64| + 2^-20 * k * sum_j |x_j w_j|
    per element, eps = 2^-8 (BF16) or 2^-11 (FP16): one rounding of the output
    plus float32 accumulation error;
  * against the host reference in the output dtype (float32 accumulation, one
    rounding): the same rule with 4 * eps (two roundings, each at most eps);
  * against torch.matmul of the dequantized weight (float32): relative
    Frobenius error <= 2^-7 (BF16) or 2^-10 (FP16).

Run:  pip install ./python && python3 -m pytest python/tests
"""

import numpy as np
import pytest

torch = pytest.importorskip("torch")

import nibble  # noqa: E402
import nibble.torch as nt  # noqa: E402

HAS_GPU = torch.cuda.is_available() and nibble.build_info()["cuda"] and nibble.device_count() > 0
gpu = pytest.mark.skipif(not HAS_GPU, reason="needs a CUDA device and libnibble built with CUDA")

FORMATS = ["nvfp4", "mxfp4"]
DTYPES = [torch.bfloat16, torch.float16]
EPS = {torch.bfloat16: 2.0 ** -8, torch.float16: 2.0 ** -11}
FROB = {torch.bfloat16: 2.0 ** -7, torch.float16: 2.0 ** -10}
N, K = 136, 512   # n not a multiple of the 64-row tile; k 16 NVFP4 groups of 32


def _weight(n=N, k=K, seed=0):
    rng = np.random.default_rng(seed)
    return (rng.standard_normal((n, k)) * 0.05).astype(np.float32)


def _x(shape, dtype, seed=1):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(*shape, generator=g).to(dtype)


def _np_act(x):
    """x (bf16/fp16 CPU tensor) as the exact float32 values the kernel reads."""
    return x.float().numpy()


def _packed(fmt, w=None):
    w = _weight() if w is None else w
    qw = nibble.quantize(w, format=fmt)
    return qw, nt.pack(qw)


def _check_close(y, y64, xs, wh, eps, what, operand=0.0):
    """Elementwise bound of the module docstring; prints the worst element.
    operand: a relative error of the kernel's weight operands, added as
    operand * sum |x| |w| (the table formats, DESIGN.md 4.2.2)."""
    y = np.asarray(y, dtype=np.float64)
    acc = np.abs(xs).astype(np.float64) @ np.abs(wh).astype(np.float64).T
    k = xs.shape[-1]
    tol = eps * np.abs(y64) + (2.0 ** -20 * k + operand) * acc + 1e-30
    err = np.abs(y - y64)
    ratio = err / tol
    i = np.unravel_index(np.argmax(ratio), ratio.shape)
    assert ratio[i] <= 1.0, f"{what}: worst at {i}: got {y[i]!r}, want {y64[i]!r} (|err| {err[i]:.3g} > tol {tol[i]:.3g})"


def check_gemm_against_float64(qw, dtype, m, what, operand=0.0):
    """nibble::gemm of nibble.QuantizedWeight qw on the GPU (m tokens of
    dtype, a bias) against the float64 host reference by _check_close; the
    call is repeated on the workspace it left (test_int4.py and test_bnb.py
    use it).  Where the
    integer and table formats ran on the tensor-core kernel (Hopper, larger
    m), its weights are rounded to dtype (DESIGN.md 4.2.3): (q - z) s and
    q s once, twice with the scale rounded first; r(v) r(absmax) three
    times."""
    n, k = qw.n, qw.k
    pw = nt.pack(qw)
    x = _x((m, k), dtype, seed=m)
    bias = _x((n,), dtype, seed=2)
    y = nt.gemm(x.cuda(), pw, bias.cuda())
    torch.cuda.synchronize()
    if "gemm_sm90<" in nt.last_config() and qw.format in ("int4", "int4_sym", "int8", "nf4", "bnb_fp4"):
        u = EPS[dtype]
        operand = (1 + u) ** 3 - 1 + 2.0 ** -24 if qw.format in ("nf4", "bnb_fp4") else (1 + u) ** 2 - 1
    assert y.shape == (m, n) and y.dtype == dtype
    xs = x.float().numpy()
    y64 = nibble.gemm_reference(xs, qw, bias=bias.float().numpy(), out_dtype=np.float64)
    wh = nibble.dequantize(qw)
    if qw.format == "int4_hqq":
        # the operand r(q - z) in dtype (a zero point of the other 16-bit type rounded to dtype first), then
        # times the scale in FP32 (decode) or rounded again (tensor core), against r(r(q - z) s): up to three
        # roundings of |q - z| |s| <= |w| + |z s| (DESIGN.md 4.2.6)
        u = EPS[dtype]
        g = qw.group_size
        zs = np.abs(_f16_values(qw.zeros, qw.scale_type) * _f16_values(qw.scales, qw.scale_type))
        wh = np.abs(wh) + np.repeat(zs, g, axis=1)
        operand = (1 + u) ** 3 - 1
    _check_close(y.float().cpu().numpy(), y64, xs, wh, EPS[dtype], what, operand)
    # the workspace as the call left it serves the next call (nb_gemm zeroes the split counters it relies on;
    # split partial sums may stay): the same bits again
    y2 = nt.gemm(x.cuda(), pw, bias.cuda())
    assert torch.equal(y2, y), f"{what}: a second call on the same workspace gave other bits"


def _f16_values(a, scale_type):
    """A float16 array, or uint16 BF16 bits (scale_type "bf16"), as float64."""
    if scale_type == "bf16":
        return (a.astype(np.uint32) << 16).view(np.float32).astype(np.float64)
    return a.astype(np.float64)


# ------------------------------------------------------- no GPU needed

def test_import_without_touching_torch_in_nibble():
    import subprocess
    import sys
    code = "import sys, nibble; assert 'torch' not in sys.modules, 'nibble imported torch'"
    subprocess.run([sys.executable, "-c", code], check=True)


def test_op_registered():
    assert hasattr(torch.ops.nibble, "gemm")


@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize("dtype", DTYPES)
def test_fake_shapes(fmt, dtype):
    code = int(nibble.Format.NVFP4 if fmt == "nvfp4" else nibble.Format.MXFP4)
    u8 = dict(dtype=torch.uint8, device="meta")
    for shape in [(1, K), (33, K), (2, 3, K), (0, K), (K,)]:
        x = torch.empty(shape, dtype=dtype, device="meta")
        b = torch.empty(N, dtype=dtype, device="meta")
        y = torch.ops.nibble.gemm(x, torch.empty(100, **u8), torch.empty(16, **u8), b, N, K, code, 1.0, 0, 0)
        assert y.shape == (*shape[:-1], N) and y.dtype == dtype and y.device.type == "meta"


def test_fake_tensor_mode():
    from torch._subclasses.fake_tensor import FakeTensorMode
    with FakeTensorMode():
        x = torch.empty(4, 5, K, dtype=torch.bfloat16)
        y = torch.ops.nibble.gemm(x, torch.empty(8, dtype=torch.uint8), torch.empty(8, dtype=torch.uint8), None,
                                  N, K, 1, 0.5, 0, 0)
        assert y.shape == (4, 5, N) and y.dtype == torch.bfloat16


def _op(x, n=N, k=K, fmt=1, bias=None, packed=None, ws=None, device=None):
    dev = device or x.device
    packed = torch.empty(16, dtype=torch.uint8, device=dev) if packed is None else packed
    ws = torch.empty(16, dtype=torch.uint8, device=dev) if ws is None else ws
    return torch.ops.nibble.gemm(x, packed, ws, bias, n, k, fmt, 1.0, 0, 0)


def test_errors_before_c():
    x = torch.zeros(2, K, dtype=torch.bfloat16)
    with pytest.raises(nibble.Error, match="packed"):
        _op(x)                                                    # CPU: the host reference checks the packed size
    with pytest.raises(TypeError, match="bfloat16 or torch.float16"):
        _op(x.double())
    with pytest.raises(ValueError, match="expected \\[..., k"):
        _op(torch.zeros(2, K + 16, dtype=torch.bfloat16))
    with pytest.raises(ValueError, match="multiple of 32"):
        _op(x, k=K + 16, fmt=2)                                   # MXFP4 group is 32
    with pytest.raises(ValueError, match="unknown format"):
        _op(x, fmt=42)
    with pytest.raises(TypeError, match="must match x"):
        _op(x, bias=torch.zeros(N, dtype=torch.float16))
    with pytest.raises(ValueError, match="bias has shape"):
        _op(x, bias=torch.zeros(N + 1, dtype=torch.bfloat16))
    with pytest.raises(TypeError, match="uint8"):
        _op(x, packed=torch.zeros(4, dtype=torch.int32))
    # the same checks run in the fake implementation
    with pytest.raises(ValueError, match="expected \\[..., k"):
        _op(torch.zeros(2, K + 16, dtype=torch.bfloat16, device="meta"))
    with pytest.raises(TypeError):
        nt.gemm(x, object())
    with pytest.raises(TypeError):
        nt.pack(np.zeros((2, 2)))
    with pytest.raises(TypeError, match="dtype"):
        nt.quantize(torch.zeros(4, K, dtype=torch.int32))
    with pytest.raises(ValueError, match="2-D"):
        nt.quantize(torch.zeros(K))
    with pytest.raises(ValueError, match="unknown format"):
        nt.quantize(torch.zeros(4, K), format="int3")
    with pytest.raises(ValueError, match="not a CUDA device"):
        nt.quantize(torch.zeros(4, K), device="cpu")
    with pytest.raises(TypeError):
        nt.Linear.from_linear(torch.nn.Conv1d(2, 2, 1))
    with pytest.raises(ValueError, match="scale_rule"):
        nt.quantize_model(torch.nn.Sequential(torch.nn.Linear(K, N)), format="nvfp4", scale_rule="even")


def test_exclude_patterns():
    assert nt._excluded("lm_head", ["lm_head"])
    assert nt._excluded("model.lm_head", ["lm_head"])
    assert not nt._excluded("model.lm_head_x", ["lm_head"])
    assert nt._excluded("model.layers.0.mlp.down_proj", ["*.mlp.*"])
    assert not nt._excluded("model.layers.0.self_attn.q_proj", ["*.mlp.*", "lm_head"])


# ----------------------------------------------------------- GPU tests

@gpu
@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("m", [1, 3, 8, 17, 32, 33])
@pytest.mark.parametrize("with_bias", [False, True])
def test_gemm_against_references(fmt, dtype, m, with_bias):
    qw, pw = _packed(fmt)
    x = _x((m, K), dtype)
    bias = _x((N,), dtype, seed=2) if with_bias else None
    y = nt.gemm(x.cuda(), pw, None if bias is None else bias.cuda())
    torch.cuda.synchronize()
    assert y.shape == (m, N) and y.dtype == dtype and y.is_contiguous()
    y = y.float().cpu().numpy()
    xs = _np_act(x)
    wh = nibble.dequantize(qw)
    b32 = None if bias is None else bias.float().numpy()
    # float64 yardstick
    y64 = nibble.gemm_reference(xs, qw, bias=b32, out_dtype=np.float64)
    _check_close(y, y64, xs, wh, EPS[dtype], f"{fmt} {dtype} m={m} vs float64")
    # host reference in the same dtype (float32 accumulation, one rounding)
    npdt = np.uint16 if dtype == torch.bfloat16 else np.float16
    xin = x.view(torch.int16).numpy().view(np.uint16) if dtype == torch.bfloat16 else x.numpy()
    bin_ = None if bias is None else (bias.view(torch.int16).numpy().view(np.uint16) if dtype == torch.bfloat16
                                      else bias.numpy())
    yh = nibble.gemm_reference(xin, qw, bias=bin_, out_dtype=npdt)
    yh = nibble.from_bf16(yh) if dtype == torch.bfloat16 else yh.astype(np.float32)
    _check_close(y, yh.astype(np.float64), xs, wh, 4 * EPS[dtype], f"{fmt} {dtype} m={m} vs host reference")
    # torch matmul of the dequantized weight
    yt = xs @ wh.T + (0 if b32 is None else b32)
    rel = np.linalg.norm(y - yt) / np.linalg.norm(yt)
    assert rel <= FROB[dtype], f"relative Frobenius error {rel:.3g} > {FROB[dtype]:.3g}"


@gpu
@pytest.mark.parametrize("fmt", FORMATS)
def test_quantize_tensor_matches_numpy_path(fmt):
    w = _weight()
    for dt in (torch.float32, torch.bfloat16, torch.float16):
        wt = torch.from_numpy(w).to(dt)
        pw = nt.quantize(wt.cuda(), format=fmt)
        ref = nibble.pack(nibble.quantize(wt.float().numpy(), format=fmt))
        assert torch.equal(pw.packed.cpu(), torch.from_numpy(ref.data)), f"{fmt} {dt}: packed bytes differ"
        assert (pw.tensor_scale, pw.scale_exp_min, pw.scale_exp_max) == \
            (ref.tensor_scale, ref.scale_exp_min, ref.scale_exp_max)
        assert pw.workspace.dtype == torch.uint8 and int(pw.workspace.count_nonzero()) == 0
        assert pw.packed.device.type == "cuda"


@gpu
@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize("dtype", DTYPES)
def test_batch_dims_layouts_and_workspace(fmt, dtype):
    _, pw = _packed(fmt)
    x = _x((2, 3, K), dtype).cuda()
    y = nt.gemm(x, pw)
    assert y.shape == (2, 3, N)
    y_flat = nt.gemm(x.reshape(6, K), pw)
    assert torch.equal(y.reshape(6, N), y_flat)
    # non-contiguous: a transposed view, a row-strided view, a misaligned view
    xt = x.reshape(6, K).t().contiguous().t()
    assert not xt.is_contiguous()
    assert torch.equal(nt.gemm(xt, pw), y_flat)
    big = torch.zeros(6, K + 64, dtype=dtype, device="cuda")
    big[:, :K] = x.reshape(6, K)
    assert torch.equal(nt.gemm(big[:, :K], pw), y_flat)                # lda = K + 64, no copy
    buf = torch.zeros(6 * K + 1, dtype=dtype, device="cuda")
    buf[1:] = x.reshape(-1)
    assert torch.equal(nt.gemm(buf[1:].view(6, K), pw), y_flat)         # 2-byte offset: copied
    # m = 0
    assert nt.gemm(x[:0], pw).shape == (0, 3, N)
    torch.cuda.synchronize()
    assert int(pw.workspace.count_nonzero()) == 0, "nb_gemm left the workspace dirty"
    assert nt.last_config(x.device)  # e.g. "gemv_fp4<nvfp4,bf16,mt=1> ..."


@gpu
def test_gpu_error_paths():
    _, pw = _packed("nvfp4")
    x = _x((2, K), torch.bfloat16)
    with pytest.raises(ValueError, match="one device"):
        nt.gemm(x, pw)                                            # CPU x, CUDA weight
    with pytest.raises(TypeError, match="float32 runs on the CPU only"):
        nt.gemm(x.float().cuda(), pw)
    with pytest.raises(ValueError, match="one device"):
        nt.gemm(x.cuda(), pw, torch.zeros(N, dtype=torch.bfloat16))
    # a workspace that is too small is the library's to reject (the need
    # depends on m: the workspace size is the largest over m)
    if pw.workspace.numel() > 0:
        raised = []
        for m in (1, 9, 17, 25):
            try:
                torch.ops.nibble.gemm(_x((m, K), torch.bfloat16).cuda(), pw.packed, pw.workspace[:0], None,
                                      *pw.op_args())
            except nibble.Error as e:
                assert e.status == nibble.Status.ERR_WORKSPACE, str(e)
                assert "workspace" in e.message
                raised.append(m)
        assert raised, "no m needed the workspace although nb_gemm_workspace_size is non-zero"


@gpu
@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize("dtype", DTYPES)
def test_cuda_graph_replay_bitwise(fmt, dtype):
    _, pw = _packed(fmt)
    bias = _x((N,), dtype, seed=3).cuda()
    static_x = _x((5, K), dtype).cuda()
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):                 # warm-up outside capture
        nt.gemm(static_x, pw, bias)
    torch.cuda.current_stream().wait_stream(s)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        static_y = nt.gemm(static_x, pw, bias)
    for seed in (10, 11, 12):
        new_x = _x((5, K), dtype, seed=seed).cuda()
        static_x.copy_(new_x)
        g.replay()
        eager = nt.gemm(new_x, pw, bias)
        torch.cuda.synchronize()
        assert torch.equal(static_y, eager), f"graph replay differs from eager (seed {seed})"


class _Mlp(torch.nn.Module):
    def __init__(self, k=K, h=256, n=N):
        super().__init__()
        self.up = torch.nn.Linear(k, h)
        self.down = torch.nn.Linear(h, n, bias=False)
        self.lm_head = torch.nn.Linear(n, 64)

    def forward(self, x):
        return self.lm_head(self.down(torch.nn.functional.gelu(self.up(x))))


@gpu
@pytest.mark.parametrize("fmt", FORMATS)
def test_linear_and_quantize_model(fmt):
    torch.manual_seed(0)
    model = _Mlp().to(torch.bfloat16).cuda()
    x = _x((3, K), torch.bfloat16).cuda()
    ref = model(x).float()
    lin = nt.Linear.from_linear(model.up, format=fmt)
    assert lin.in_features == K and lin.bias is not None and "format=" + fmt in repr(lin)
    assert torch.equal(lin(x), nt.gemm(x, lin.weight, model.up.bias))
    report = nt.quantize_model(model, format=fmt, exclude=["lm_head"])
    assert report["quantized"] == ["up", "down"] and report["skipped"] == {"lm_head": "excluded"}
    assert isinstance(model.up, nt.Linear) and isinstance(model.lm_head, torch.nn.Linear)
    out = model(x).float()
    rel = (out - ref).norm() / ref.norm()
    assert rel < 0.3, f"quantized model output too far from the BF16 model ({rel:.3f})"  # 4-bit weights
    # an fp16 input with a bf16 bias: bias converted on the fly
    y16 = model.up(x.half())
    assert y16.dtype == torch.float16


@gpu
@pytest.mark.parametrize("fmt", FORMATS)
def test_torch_compile_fullgraph(fmt):
    torch.manual_seed(0)
    model = _Mlp().to(torch.bfloat16).cuda()
    nt.quantize_model(model, format=fmt, exclude=[])
    x = _x((4, K), torch.bfloat16).cuda()
    eager = model(x)
    compiled = torch.compile(model, fullgraph=True)
    out = compiled(x)
    torch.cuda.synchronize()
    # the GEMMs are the same calls; only the fused GELU may round differently
    assert out.shape == eager.shape and out.dtype == eager.dtype
    rel = ((out.float() - eager.float()).norm() / eager.float().norm()).item()
    assert rel <= 2.0 ** -7, f"compiled vs eager relative error {rel:.3g}"


@gpu
@pytest.mark.parametrize("fmt", FORMATS)
def test_opcheck(fmt):
    """torch.library.opcheck: schema (no input mutated: the workspace is left
    zeroed), fake implementation against the real one, dynamic shapes."""
    _, pw = _packed(fmt)
    x = _x((2, 3, K), torch.bfloat16).cuda()
    bias = _x((N,), torch.bfloat16, seed=4).cuda()
    torch.library.opcheck(torch.ops.nibble.gemm.default, (x, pw.packed, pw.workspace, bias, *pw.op_args()),
                          test_utils=("test_schema", "test_faketensor", "test_aot_dispatch_dynamic"))


# ---------------------------------------------- the op on the CPU (host reference)

@pytest.mark.parametrize("fmt,group", [("nvfp4", None), ("mxfp4", None), ("int4", 32), ("int4_sym", 64), ("nf4", None),
                                       ("bnb_fp4", 128)])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32])
def test_op_on_the_cpu_is_the_host_reference(fmt, group, dtype):
    """nibble::gemm on CPU tensors is nibble.gemm_reference (nb_gemm_host_v2)
    on the unpacked bytes, bit for bit: leading dimensions, bias, m = 0, a
    Linear held on the CPU (with an activation permutation), and a result
    within the float64 rule of the module docstring (eps of the dtype)."""
    kw = {"group_size": group} if group else {}
    qw = nibble.quantize(_weight(), format=fmt, **kw)
    pw = nt.pack(qw, "cpu")
    x = _x((2, 3, K), dtype)
    bias = _x((N,), dtype, seed=4)
    y = nt.gemm(x, pw, bias)
    assert y.dtype == dtype and y.shape == (2, 3, N)
    xs = x.reshape(-1, K)
    xa = xs.view(torch.int16).numpy().view(np.uint16) if dtype == torch.bfloat16 else xs.numpy()
    ba = bias.view(torch.int16).numpy().view(np.uint16) if dtype == torch.bfloat16 else bias.numpy()
    out = {torch.bfloat16: "bfloat16", torch.float16: np.float16, torch.float32: np.float32}[dtype]
    want = nibble.gemm_reference(xa, qw, ba, out_dtype=out)
    got = y.reshape(-1, N)
    got = got.view(torch.int16).numpy().view(np.uint16) if dtype == torch.bfloat16 else got.numpy()
    assert np.array_equal(got, want), f"{fmt} {dtype}: the CPU op differs from nibble.gemm_reference"
    y64 = nibble.gemm_reference(xs.float().numpy(), qw, out_dtype=np.float64) + bias.double().numpy()
    eps = EPS.get(dtype, 2.0 ** -24)
    _check_close(y.reshape(-1, N).float().numpy(), y64, xs.float().numpy(), nibble.dequantize(qw), eps,
                 f"{fmt} {dtype} CPU")
    assert nt.gemm(x[:0], pw).shape == (0, 3, N)
    perm = torch.randperm(K, generator=torch.Generator().manual_seed(7))
    lin = nt.Linear(pw, bias, perm=perm)
    assert torch.equal(lin(x), nt.gemm(x.index_select(-1, perm), pw, bias))


# --------------------------------------------------- a plain state_dict

_STATE_CASES = [("nvfp4", {}), ("mxfp4", {}), ("int4", {"group_size": 32}), ("int4", {"group_size": 128,
                "scale_type": "bf16"}), ("int4_sym", {"group_size": 64}), ("int8", {"group_size": 128}),
                ("nf4", {}), ("bnb_fp4", {"group_size": 128}), ("int4_hqq", {"group_size": 64})]


def assert_each_refused(module, good, bad, match, packed):
    """load_state_dict of `good` with each (key, tensor) of `bad` put in
    raises a RuntimeError matching `match` and leaves the module's packed
    weight (its attribute `packed`) as it was."""
    before = getattr(module, packed).clone()
    for key, t in bad:
        state = dict(good)
        state[key] = t
        with pytest.raises(RuntimeError, match=match):
            module.load_state_dict(state)
        assert torch.equal(getattr(module, packed), before), key


def _linear_case(fmt, kw, seed=0, bias=True, perm=False):
    qw = nibble.quantize(_weight(seed=seed), format=fmt, **kw)
    b = _x((N,), torch.bfloat16, seed=seed + 5) if bias else None
    p = torch.randperm(K, generator=torch.Generator().manual_seed(seed)) if perm else None
    return qw, nt.Linear.from_quantized(qw, bias=b, device="cpu", perm=p)


@pytest.mark.parametrize("fmt,kw", _STATE_CASES)
def test_state_dict_round_trip(fmt, kw, tmp_path):
    """Linear.state_dict() holds the weight in its checkpoint layout, exactly
    the bytes it was quantized to; torch.save / torch.load and
    load_state_dict() into Linear.empty (meta, assign=True) or into a
    Linear of the same kind holding another weight give the same packed
    bytes, descriptor, perm, bias and outputs."""
    qw, lin = _linear_case(fmt, kw, perm=fmt in ("int4", "nvfp4"))
    sd = lin.state_dict()
    want = {"bias", "weight_codes", "weight_scales", "weight_tensor_scale", "weight_desc"}
    want |= {"weight_zeros"} if qw.zeros is not None else set()
    want |= {"perm"} if lin.perm is not None else set()
    assert set(sd) == want
    codes, scales, zeros = qw._arrays()
    assert np.array_equal(sd["weight_codes"].numpy(), codes)
    got_scales = sd["weight_scales"]
    if scales.dtype == np.uint16:
        assert got_scales.dtype == torch.bfloat16
        got_scales = got_scales.view(torch.int16).numpy().view(np.uint16)
    else:
        got_scales = got_scales.numpy()
    assert got_scales.dtype == scales.dtype and np.array_equal(got_scales.view(np.uint8), scales.view(np.uint8))
    assert float(sd["weight_tensor_scale"]) == np.float32(qw.tensor_scale)
    f = tmp_path / "lin.pt"
    torch.save(sd, f)
    loaded = torch.load(f, weights_only=True)
    group = kw.get("group_size")
    x = _x((3, K), torch.bfloat16)
    empty = nt.Linear.empty(K, N, fmt, bias=True, group_size=group, scale_type=kw.get("scale_type"))
    if lin.perm is not None:
        empty.perm = torch.empty(K, dtype=torch.int64, device="meta")
    assert empty.packed.is_meta and set(empty.state_dict()) == {"bias"}
    result = empty.load_state_dict(loaded, assign=True)
    assert not result.missing_keys and not result.unexpected_keys
    other = _linear_case(fmt, kw, seed=3, perm=lin.perm is not None)[1]
    other.load_state_dict(loaded)
    for b in (empty, other):
        assert b.packed.device.type == "cpu" and torch.equal(b.packed, lin.packed)
        assert (b.tensor_scale, b.scale_exp_min, b.scale_exp_max) == (lin.tensor_scale, lin.scale_exp_min,
                                                                        lin.scale_exp_max)
        assert (b.perm is None) == (lin.perm is None) and (b.perm is None or torch.equal(b.perm, lin.perm))
        assert torch.equal(b.bias, lin.bias) and torch.equal(b(x), lin(x))
        again = b.state_dict()
        assert again.keys() == sd.keys() and all(torch.equal(again[k], sd[k]) for k in sd)


def test_state_dict_of_a_model_and_its_errors():
    """A model's state_dict carries every nibble Linear (and the float
    layers as torch keeps them); loading checks the format, shape, group
    and scale type against the module and names both, reports missing
    weight tensors, and rejects tensors of the wrong dtype or shape without
    changing the module."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(K, 128), torch.nn.ReLU(), torch.nn.Linear(128, 64))
    nt.quantize_model(model, format="nf4", exclude=[], device="cpu")
    assert isinstance(model[0], nt.Linear) and isinstance(model[2], nt.Linear)
    sd = model.state_dict()
    assert {"0.weight_codes", "2.weight_codes", "0.bias", "2.weight_desc"} <= set(sd)
    with nt._no_weight_state():
        assert set(model.state_dict()) == {"0.bias", "2.bias"}
    twin = torch.nn.Sequential(nt.Linear.empty(K, 128, "nf4", bias=True), torch.nn.ReLU(),
                               nt.Linear.empty(128, 64, "nf4", bias=True))
    twin.load_state_dict(sd, assign=True)
    x = _x((2, K), torch.bfloat16)
    assert torch.equal(twin(x), model(x))
    # another format of the same shapes and dtypes (bnb_fp4's codes and absmax look like nf4's)
    wrong = torch.nn.Sequential(nt.Linear.empty(K, 128, "bnb_fp4", bias=True), torch.nn.ReLU(),
                                nt.Linear.empty(128, 64, "nf4", bias=True))
    with pytest.raises(RuntimeError, match="the state holds nf4.*the module bnb_fp4"):
        wrong.load_state_dict(sd, assign=True)
    with pytest.raises(RuntimeError, match="out_features 128.*out_features 120"):
        nt.Linear.empty(K, 120, "nf4", bias=True).load_state_dict(
            {k[2:]: v for k, v in sd.items() if k.startswith("0.")}, assign=True)
    # missing weight tensors
    qw, lin = _linear_case("nvfp4", {})
    before = lin.packed.clone()
    with pytest.raises(RuntimeError, match="Missing key.*weight_codes"):
        lin.load_state_dict({"bias": lin.bias.detach().clone()})
    r = lin.load_state_dict({"bias": lin.bias.detach().clone()}, strict=False)
    assert "weight_codes" in r.missing_keys and torch.equal(lin.packed, before)
    # corrupt tensors: nothing changes
    good = lin.state_dict()
    bad = [("weight_codes", good["weight_codes"][:, :-1]), ("weight_scales", good["weight_scales"].float()),
           ("weight_codes", good["weight_codes"].to(torch.int32)), ("weight_desc", good["weight_desc"][:5]),
           ("weight_desc", torch.tensor([2, *good["weight_desc"][1:].tolist()])),
           ("weight_tensor_scale", torch.ones(2))]
    assert_each_refused(lin, good, bad, "nibble.torch.Linear", "packed")
    assert torch.equal(lin.packed, before)
    # a perm that is not a permutation
    _, plin = _linear_case("int4", {"group_size": 32}, perm=True)
    state = plin.state_dict()
    state["perm"] = torch.zeros(K, dtype=torch.int64)
    with pytest.raises(RuntimeError, match="permutation"):
        plin.load_state_dict(state)


def test_empty_refuses_bad_arguments():
    """Linear.empty and MoeExperts.empty reject what cannot be a weight
    before allocating anything: an unknown format, a k that is no multiple
    of the group, a group the format does not take, a spec that is no
    MoeSpec."""
    with pytest.raises(ValueError, match="unknown format"):
        nt.Linear.empty(K, N, "fp3")
    with pytest.raises(nibble.Error):
        nt.Linear.empty(K + 8, N, "nvfp4")
    with pytest.raises(nibble.Error):
        nt.Linear.empty(K, N, "int4", group_size=48)
    with pytest.raises(TypeError, match="MoeSpec"):
        nt.MoeExperts.empty({"format": "nvfp4", "experts": 4})


@gpu
def test_state_dict_onto_the_gpu():
    """A state saved from a Linear on the GPU loads into Linear.empty on the
    GPU (packed there, with its workspace) and into one on the meta device
    (packed on the CPU, then moved): the same bytes and outputs."""
    qw, cpu_lin = _linear_case("mxfp4", {})
    lin = cpu_lin.cuda()
    sd = lin.state_dict()
    a = nt.Linear.empty(K, N, "mxfp4", bias=True, device="cuda")
    assert a.workspace.numel() > 0
    a.load_state_dict(sd)
    b = nt.Linear.empty(K, N, "mxfp4", bias=True)
    b.load_state_dict(sd, assign=True)
    b = b.cuda()
    x = _x((5, K), torch.bfloat16).cuda()
    for m in (a, b):
        assert m.packed.is_cuda and torch.equal(m.packed, lin.packed) and torch.equal(m(x), lin(x))


# ------------------------------------------- quantization on the device

def test_unpack_round_trip_on_the_host():
    """nibble.unpack / nibble.torch.unpack (nb_unpack_host) give back
    exactly the bytes nibble.pack packed; a Linear held on the CPU moves
    with .to() and unpacks to the same weight."""
    for fmt in FORMATS:
        qw = nibble.quantize(_weight(40, 96 if fmt == "nvfp4" else 160), format=fmt)
        back = nibble.unpack(nibble.pack(qw))
        assert np.array_equal(back.codes, qw.codes) and np.array_equal(back.scales, qw.scales)
        assert back.tensor_scale == qw.tensor_scale and back.format == fmt
        lin = nt.Linear.from_quantized(qw, device="cpu")
        assert lin.packed.device.type == "cpu" and lin.workspace.numel() == 0
        assert np.array_equal(lin.packed.numpy(), nibble.pack(qw).data)
        again = lin.to(torch.bfloat16).quantized_weight()
        assert np.array_equal(again.codes, qw.codes) and np.array_equal(again.scales, qw.scales)
    with pytest.raises(TypeError):
        nibble.unpack(qw)
    with pytest.raises(TypeError):
        nt.unpack(qw)


@gpu
@pytest.mark.parametrize("fmt,rule", [("nvfp4", None), ("mxfp4", "even"), ("mxfp4", "ocp"), ("mxfp4", "round_up")])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32])
def test_device_quantizer_bytes_equal_host(fmt, rule, dtype):
    """nibble.torch.quantize of a CUDA tensor runs nb_quantize there (no
    host copy) and packs the same bytes as nibble.quantize on the host."""
    w = torch.from_numpy(_weight(136, 512, seed=7)).to(dtype)
    pw = nt.quantize(w.cuda(), format=fmt, scale_rule=rule)
    qw = nibble.quantize(nt._host_array(w), format=fmt, scale_rule=rule)
    host = nibble.pack(qw)
    assert pw.packed.is_cuda and np.array_equal(pw.packed.cpu().numpy(), host.data)
    assert (pw.tensor_scale, pw.scale_exp_min, pw.scale_exp_max) == \
        (host.tensor_scale, host.scale_exp_min, host.scale_exp_max)
    back = nt.unpack(pw)
    assert np.array_equal(back.codes, qw.codes) and np.array_equal(back.scales, qw.scales)
    if fmt == "nvfp4":   # a given tensor scale is used as is on the device too
        pw2 = nt.quantize(w.cuda(), format=fmt, tensor_scale=0.001)
        assert pw2.tensor_scale == np.float32(0.001)
        assert np.array_equal(pw2.packed.cpu().numpy(),
                              nibble.pack(nibble.quantize(nt._host_array(w), format=fmt, tensor_scale=0.001)).data)


@gpu
def test_device_quantizer_errors_and_mse():
    """Non-finite weights fail on the device with nibble.Error as on the
    host; method="mse" runs on the host (no device MSE quantizer) and gives
    nibble.quantize(method="mse")'s bytes."""
    w = torch.from_numpy(_weight(64, 256, seed=8))
    bad = w.clone()
    bad[3, 5] = float("nan")
    with pytest.raises(nibble.Error, match="non-finite|NaN|finite"):
        nt.quantize(bad.cuda(), format="nvfp4")
    with pytest.raises(ValueError, match="multiple of 32"):
        nt.quantize(torch.zeros(4, 48, device="cuda"), format="mxfp4")
    with pytest.raises(ValueError, match="no tensor scale"):
        nt.quantize(w.cuda(), format="mxfp4", tensor_scale=0.5)
    for fmt in FORMATS:
        pw = nt.quantize(w.cuda(), format=fmt, method="mse")
        want = nibble.pack(nibble.quantize(w.numpy(), format=fmt, method="mse"))
        assert np.array_equal(pw.packed.cpu().numpy(), want.data)
        rtn = nibble.pack(nibble.quantize(w.numpy(), format=fmt))
        assert not np.array_equal(want.data, rtn.data)       # the test tells the two methods apart


@gpu
@pytest.mark.parametrize("method", ["rtn", "mse"])
def test_quantize_model_device_path_equals_host_path(method):
    """quantize_model of a model on the GPU (device quantizer, or the host
    for mse) and of the same model on the CPU (host threads) pack the same
    bytes; return_weights holds the same checkpoint-layout weights."""
    torch.manual_seed(0)
    cpu_model = _Mlp().to(torch.bfloat16)
    gpu_model = _Mlp().to(torch.bfloat16)
    gpu_model.load_state_dict(cpu_model.state_dict())
    gpu_model = gpu_model.cuda()
    r_gpu = nt.quantize_model(gpu_model, format="nvfp4", exclude=[], method=method, return_weights=True)
    r_cpu = nt.quantize_model(cpu_model, format="nvfp4", exclude=[], method=method, return_weights=True, device="cuda")
    assert r_gpu["quantized"] == r_cpu["quantized"] == ["up", "down"]   # (lm_head: in_features 136)
    for name in r_gpu["quantized"]:
        a, b = gpu_model.get_submodule(name), cpu_model.get_submodule(name)
        assert torch.equal(a.packed, b.packed) and a.tensor_scale == b.tensor_scale
        qa, qb = r_gpu["weights"][name], r_cpu["weights"][name]
        assert np.array_equal(qa.codes, qb.codes) and np.array_equal(qa.scales, qb.scales)


@gpu
def test_linear_moves_between_devices():
    """A Linear packed on the host and moved to the GPU equals one packed
    there (same bytes, a zeroed workspace of nb_gemm_workspace_size)."""
    qw = nibble.quantize(_weight(), format="mxfp4")
    a = nt.Linear.from_quantized(qw)
    b = nt.Linear.from_quantized(qw, device="cpu").cuda()
    assert torch.equal(a.packed, b.packed) and a.workspace.shape == b.workspace.shape
    assert not b.workspace.any()
    x = _x((3, K), torch.bfloat16).cuda()
    assert torch.equal(a(x), b(x))
    c = b.cpu()
    assert c.packed.device.type == "cpu" and c.workspace.numel() == 0


# ---------------------------------------------- gated activations (nibble::glu)

def _glu_ref(gu, activation, layout, limit=7.0, alpha=1.702):
    """The header's formula in float32 (torch), rounded once to gu's dtype."""
    n = gu.shape[-1] // 2
    f = gu.float()
    g, u = (f[..., 0::2], f[..., 1::2]) if layout == "interleaved" else (f[..., :n], f[..., n:])
    if activation == "swiglu":
        h = g / (1.0 + torch.exp(-g)) * u
    else:
        g = torch.where(g > limit, torch.full_like(g, limit), g)
        u = torch.where(u > limit, torch.full_like(u, limit), torch.where(u < -limit, torch.full_like(u, -limit), u))
        h = (u + 1.0) * (g / (1.0 + torch.exp(-(alpha * g))))
    return h.to(gu.dtype)


def _glu_input(shape, dtype, seed=0):
    gen = torch.Generator().manual_seed(seed)
    x = (torch.rand(shape, generator=gen) * 16 - 8).to(dtype)
    x.view(-1)[::97] = float("nan")
    return x


def _ulps_apart(a, b):
    """Largest distance in units of the last place of a and b (16-bit dtypes;
    NaN positions must agree)."""
    assert torch.equal(torch.isnan(a), torch.isnan(b))
    ia, ib = (t.view(torch.int16).to(torch.int32) for t in (a, b))
    ia = torch.where(ia < 0, -(ia & 0x7FFF), ia)
    ib = torch.where(ib < 0, -(ib & 0x7FFF), ib)
    d = (ia - ib).abs()
    return int(d[~torch.isnan(a)].max()) if d.numel() else 0


@pytest.mark.parametrize("activation,layout", [("swiglu", "concat"), ("swiglu", "interleaved"),
                                               ("swiglu_oai", "interleaved"), ("swiglu_oai", "concat")])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32])
def test_glu_on_the_cpu(activation, layout, dtype):
    """nibble.torch.glu on CPU tensors (nb_glu_host): the float32 formula,
    rounded once, within one ulp (torch's exp against the C library's expf;
    float32: a few float ulps), NaN where an input is NaN; leading dims kept."""
    gu = _glu_input((2, 3, 2 * 40), dtype)
    h = nt.glu(gu, activation, layout)
    ref = _glu_ref(gu, activation, layout)
    assert h.shape == (2, 3, 40) and h.dtype == dtype
    assert torch.equal(torch.isnan(h), torch.isnan(ref)) and torch.isnan(h).any()
    ok = ~torch.isnan(ref)
    if dtype == torch.float32:
        assert torch.allclose(h[ok], ref[ok], rtol=2.0 ** -20, atol=1e-30)
    else:
        assert _ulps_apart(h, ref) <= 1


def test_glu_arguments():
    gu = torch.zeros(2, 8, dtype=torch.bfloat16)
    with pytest.raises(ValueError):
        nt.glu(torch.zeros(2, 7, dtype=torch.bfloat16))           # odd last dimension
    with pytest.raises(ValueError):
        nt.glu(gu, "gelu")
    with pytest.raises(ValueError):
        nt.glu(gu, "swiglu", limit=7.0)                           # swiglu has no limit
    with pytest.raises(ValueError):
        nt.glu(gu, "swiglu_oai", limit=-1.0)
    with pytest.raises(ValueError):
        nt.glu(gu, "swiglu", layout="zigzag")
    with pytest.raises(TypeError):
        nt.glu(gu.to(torch.int32))
    assert nt.glu(torch.zeros(0, 8, dtype=torch.bfloat16)).shape == (0, 4)
    # the fake implementation: shapes only
    m = torch.empty(5, 3, 64, dtype=torch.float16, device="meta")
    assert torch.ops.nibble.glu(m, 1, 1, 0.0, 0.0).shape == (5, 3, 32)


@gpu
@pytest.mark.parametrize("activation,layout", [("swiglu", "concat"), ("swiglu_oai", "interleaved")])
@pytest.mark.parametrize("dtype", DTYPES)
def test_glu_on_the_gpu(activation, layout, dtype):
    """nb_glu on the GPU against nb_glu_host on the same values: equal or one
    ulp apart, NaN in the same places; a row of 14336 (Llama-3 8B's MLP) and
    a ragged one."""
    for shape in [(1, 2 * 14336), (5, 2 * 1001)]:
        gu = _glu_input(shape, dtype, seed=shape[1])
        h = nt.glu(gu.cuda(), activation, layout).cpu()
        assert _ulps_apart(h, nt.glu(gu, activation, layout)) <= 1


@gpu
def test_glu_opcheck_and_compile():
    gu = _glu_input((3, 2 * 64), torch.bfloat16).cuda()
    # (opcheck compares outputs with assert_close, which a NaN never passes)
    torch.library.opcheck(torch.ops.nibble.glu.default, (torch.nan_to_num(gu), 1, 1, 0.0, 0.0),
                          test_utils=("test_schema", "test_faketensor", "test_aot_dispatch_dynamic"))
    f = torch.compile(lambda t: nt.glu(t) * 2, fullgraph=True)
    assert torch.equal(torch.isnan(f(gu)), torch.isnan(nt.glu(gu))) and torch.equal(
        torch.nan_to_num(f(gu)), torch.nan_to_num(nt.glu(gu) * 2))
