"""W8A8 products: validation, activation quantization, blocking choice, output handling.

The arithmetic: ``C[m, n] = s_a[m] * s_w[n] * sum_k qa[m, k] * qw[n, k]``, with the integer
sum exact and converted to float once: in int32 for K <= 131072 (``_kernels.W8_EXACT_K``,
where no sum of products of [-127, 127] values can overflow), beyond that in int64 over
exact int32 sums of 131072-wide K-ranges.  The result is the same on every path, thread
count and blocking, bit for bit.
"""
import math
import threading
import time

import numpy as np

from . import _cpu, _kernels, _threads
from .tuning import TUNER
from .packing import PackedWeight, pack_int8, padded, prefix_sums
from .quantize import Workspace, quantize_rows
from ._validation import float_array, int8_matrix

_WORKSPACE = Workspace()


def _check_packed(packed, name):
    if not isinstance(packed, PackedWeight):
        raise TypeError(f"{name} must be a PackedWeight from pyw8a8.pack_weight, got "
                        f"{type(packed).__name__}")
    try:
        packed.check_layout()  # O(1); the kernels read the arrays unchecked
    except ValueError as exc:
        raise ValueError(f"{name} is not a consistent PackedWeight: {exc}") from None


def _activations(x, k, name="x"):
    arr = float_array(x, name)
    if arr.shape[-1] != k:
        raise ValueError(f"{name} has {arr.shape[-1]} features in its last dimension "
                         f"(shape {arr.shape}) but the weight expects K={k}")
    return arr


def _quantized_activations(x2d, packed, ops, enc, shape):
    """(q (Mp, Kp) bytes for the kernel of `enc`, scale (M,), prefix sums or empty), in
    this thread's workspace."""
    return quantize_rows(np.ascontiguousarray(x2d), packed.kp, ops, enc, name="x",
                         shape=tuple(shape) + x2d.shape[1:],
                         block=packed.block if packed.rotate else 0, seed=packed.seed,
                         workspace=_WORKSPACE)


def _output(out, out_dtype, shape, x):
    """The float32 array to compute into, and what to convert or copy it to afterwards."""
    if out is not None and not isinstance(out, np.ndarray):
        raise TypeError(f"out must be a numpy array, got {type(out).__name__}")
    if out_dtype is not None:
        out_dtype = np.dtype(out_dtype)
        if out_dtype != np.float32 and out_dtype.name != "bfloat16":
            raise TypeError(f"out_dtype must be float32 or ml_dtypes.bfloat16, got "
                            f"{out_dtype}")
    if out is None:
        result = np.empty(shape, dtype=np.float32)
        return result, (None if out_dtype in (None, np.float32) else out_dtype)
    if out.shape != tuple(shape):
        raise ValueError(f"out has shape {out.shape}, expected {tuple(shape)}")
    expected = out_dtype if out_dtype is not None else out.dtype
    if out.dtype != expected or (expected != np.float32 and expected.name != "bfloat16"):
        raise TypeError(f"out has dtype {out.dtype}, expected "
                        f"{expected if out_dtype is not None else 'float32 or bfloat16'}")
    if not out.flags.writeable:
        raise ValueError("out is read-only")
    if np.shares_memory(out, x):
        raise ValueError("out overlaps the input x; pass a separate array")
    if out.dtype == np.float32 and out.flags.c_contiguous and out.flags.aligned:
        return out, None
    return np.empty(shape, dtype=np.float32), out


def _finish(result, target):
    if target is None:
        return result
    if isinstance(target, np.dtype):
        return result.astype(target)
    target[...] = result
    return target


def _job(ops, enc, qa, m, a_psum, packed, a_scale, out2d, out_kind, group, nthreads):
    """One GEMM job for _kernels.gemm, with tuned blocking; also returns the tuner slot."""
    kp = qa.shape[1]
    n = packed.shape[0]
    key, index, (kc, mc, nc, m_step, n_step) = TUNER.choose(ops, (enc, group), m, n, kp,
                                                            nthreads)
    job = (enc, qa, m, a_psum, packed.panels.reshape(-1), packed.psum, a_scale,
           packed.scales, n, out2d, out_kind, kc, mc, nc, m_step, n_step)
    return job, (key, index)


def _gemm(ops, jobs_and_slots, nthreads):
    """Run jobs in one parallel region and report its time to the tuner."""
    jobs = [job for job, _ in jobs_and_slots]
    t0 = time.perf_counter()
    _kernels.gemm(ops, jobs, nthreads)
    elapsed = time.perf_counter() - t0
    for _, (key, index) in jobs_and_slots:
        TUNER.record(key, index, elapsed)


def _encoding_index(packed):
    return 0 if packed.encoding == "biased" else 1


def matmul(x, packed, *, out=None, out_dtype=None):
    """W8A8 product ``x @ w.T`` against a packed weight.

    Activations are quantized per row (token) on every call, optionally rotated first with
    the weight's transform; the int8 dot products accumulate exactly in int32.

    Parameters
    ----------
    x : array_like of float32 or float64, shape (..., K)
        Activations; any leading dimensions, any memory order.
    packed : PackedWeight
        From :func:`pack_weight`, shape (N, K).
    out : ndarray, shape (..., N), optional
        Where to write the result (dtype float32, or `out_dtype`); must not overlap x.
    out_dtype : {numpy.float32, ml_dtypes.bfloat16}, optional
        Output dtype (default float32, or out's dtype).

    Returns
    -------
    ndarray, shape (..., N)
        ``s_a[m] * s_w[n] * sum_k qa[m, k] * qw[n, k]``, approximately ``x @ w.T``.

    Raises
    ------
    TypeError
        Wrong dtype of x or out, or `packed` not a PackedWeight.
    ValueError
        x's last dimension differs from K, a row of x holds NaN/Inf (named in the
        message), or `out` has the wrong shape, is read-only or overlaps x. Nothing is
        written to `out` when an error is raised.
    """
    if (out is None and out_dtype is None and type(x) is np.ndarray and
            x.dtype == _F32 and x.flags.c_contiguous and type(packed) is PackedWeight):
        y = _compiled_product(x, packed)
        if y is not None:
            return y
    _check_packed(packed, "packed")
    n, k = packed.shape
    arr = _activations(x, k)
    lead = arr.shape[:-1]
    result, target = _output(out, out_dtype, lead + (n,), x)
    m = math.prod(lead)
    _run(arr.reshape(m, k), [(packed, result.reshape(m, n))], lead)
    return _finish(result, target)


_F32 = np.dtype(np.float32)
_SCRATCH = threading.local()
# Settled blockings a weight remembers (one per path, M and thread count it met): spares
# a call the tuner's lock and lookups.
_SETTLED_PER_WEIGHT = 256


def _compiled_product(x, packed):
    """matmul of a C-contiguous float32 x (K,) or (M, K) through the one compiled entry
    point (``_kernels.matmul_rows``), or None for every other case, which the general path
    handles, errors included (a row holding NaN/Inf comes back here as None too)."""
    try:
        plan = packed.plan()
    except ValueError:
        return None
    if x.ndim not in (1, 2) or x.shape[-1] != plan.K or plan.K == 0 or plan.N == 0 or \
            plan.Kp > _kernels.W8_EXACT_K:
        return None
    m = x.shape[0] if x.ndim == 2 else 1
    if m == 0:
        return None
    ops = _cpu.active_ops(m)
    nthreads = _threads.threads_for(m * plan.K * plan.N)
    settled = (ops.name, m, nthreads)
    blocking = plan.blocking.get(settled)
    index = None
    if blocking is None:
        key, index, blocking = TUNER.choose(ops, (plan.enc, 1), m, plan.N, plan.Kp, nthreads)
        if index is None and len(plan.blocking) < _SETTLED_PER_WEIGHT:
            plan.blocking[settled] = blocking
    kc, mc, nc, m_step, n_step = blocking
    scratch = getattr(_SCRATCH, "buffer", None)
    if scratch is None:
        scratch = _SCRATCH.buffer = _kernels.Scratch()
    out = np.empty((m, plan.N), dtype=np.float32)
    t0 = time.perf_counter()
    if _kernels.matmul_rows(ops, plan, x if x.ndim == 2 else x.reshape(1, -1), out,
                            scratch, nthreads, kc, mc, nc, m_step, n_step) >= 0:
        return None
    if index is not None:
        TUNER.record(key, index, time.perf_counter() - t0)
    return out if x.ndim == 2 else out.reshape(plan.N)


def _run(x2d, pairs, lead):
    """Quantize x2d once per distinct activation encoding and run every product."""
    m, k = x2d.shape
    ops = _cpu.active_ops(m)
    if any(o.size == 0 for _, o in pairs) or m == 0:
        return
    if k == 0:
        for _, o in pairs:
            o.fill(0)
        return
    _WORKSPACE.reset()
    cache = {}
    jobs = []
    wide = []  # (int64 sums, float32 output, activation scales, weight) when K is huge
    nthreads = _threads.threads_for(m * k * sum(p.shape[0] for p, _ in pairs))
    for packed, out2d in pairs:
        enc = _encoding_index(packed)
        key = ops.activation_key(enc)
        if key not in cache:
            cache[key] = _quantized_activations(x2d, packed, ops, enc, lead)
        qa, a_scale, a_psum = cache[key]
        target, kind = out2d, _kernels.W8_OUT_F32
        if packed.kp > _kernels.W8_EXACT_K:
            target, kind = np.empty(out2d.shape, np.int64), _kernels.W8_OUT_I64
            wide.append((target, out2d, a_scale, packed))
        jobs.append(_job(ops, enc, qa, m, a_psum, packed, a_scale, target, kind, len(pairs),
                         nthreads))
    _gemm(ops, jobs, nthreads)
    for sums, out2d, a_scale, packed in wide:
        # The one conversion and the two float32 products of the C epilogue
        # (w8_apply_scales: the smaller scale first), in numpy.
        sa, sw = a_scale[:, None], packed.scales[None, :]
        np.multiply(sums.astype(np.float32) * np.minimum(sa, sw), np.maximum(sa, sw),
                    out=out2d)


def matmul_pair(x, packed1, packed2):
    """Two W8A8 products of one activation, quantized once (e.g. gate and up projections).

    Parameters
    ----------
    x : array_like of float32 or float64, shape (..., K)
    packed1, packed2 : PackedWeight
        Shapes (N1, K) and (N2, K), with the same rotation settings.

    Returns
    -------
    y1 : ndarray of float32, shape (..., N1)
    y2 : ndarray of float32, shape (..., N2)

    Raises
    ------
    TypeError, ValueError
        As :func:`matmul`; also ValueError if the two weights differ in K or rotation.
    """
    _check_packed(packed1, "packed1")
    _check_packed(packed2, "packed2")
    if packed1.shape[1] != packed2.shape[1]:
        raise ValueError(f"packed1 and packed2 differ in K: {packed1.shape[1]} vs "
                         f"{packed2.shape[1]}")
    rot1 = (packed1.rotate, packed1.block, packed1.seed)
    rot2 = (packed2.rotate, packed2.block, packed2.seed)
    if rot1 != rot2:
        raise ValueError(f"packed1 and packed2 use different rotations (rotate, block, "
                         f"seed): {rot1} vs {rot2}")
    k = packed1.shape[1]
    arr = _activations(x, k)
    lead = arr.shape[:-1]
    y1 = np.empty(lead + (packed1.shape[0],), dtype=np.float32)
    y2 = np.empty(lead + (packed2.shape[0],), dtype=np.float32)
    m = math.prod(lead)
    _run(arr.reshape(m, k), [(packed1, y1.reshape(m, packed1.shape[0])),
                             (packed2, y2.reshape(m, packed2.shape[0]))], lead)
    return y1, y2


def int8_matmul(qa, qw, *, encoding="auto", out_dtype=np.int32, _kc=None):
    """Exact integer product ``qa @ qw.T`` of int8 matrices.

    Parameters
    ----------
    qa : array_like of int8, shape (M, K)
        Values in [-127, 127] (the symmetric range; -128 is rejected).
    qw : array_like of int8, shape (N, K)
        Values in [-127, 127], ``torch.nn.Linear.weight`` layout.
    encoding : {'auto', 'biased', 'signed'}
        Weight encoding the kernel runs with (see :func:`pack_weight`).
    out_dtype : {numpy.int32, numpy.int64}
        int32 (default) or int64.

    Returns
    -------
    ndarray of out_dtype, shape (M, N)
        Exactly ``qa.astype(int64) @ qw.T.astype(int64)``: exact int32 sums up to
        K = 131072, exact int32 sums of 131072-wide ranges added in int64 beyond, so any K
        is exact.

    Raises
    ------
    TypeError
        Non-int8 operands or an unsupported out_dtype.
    ValueError
        Operands not 2-D, differing in K, or holding -128.
    OverflowError
        out_dtype is int32 and a result does not fit in int32 (possible only when
        K > 133,143); ask for ``out_dtype=numpy.int64``.
    """
    a = int8_matrix(qa, "qa")
    w = int8_matrix(qw, "qw")
    if a.shape[1] != w.shape[1]:
        raise ValueError(f"qa and qw differ in K: qa is {a.shape}, qw is {w.shape}")
    out_dtype = np.dtype(out_dtype)
    if out_dtype not in (np.int32, np.int64):
        raise TypeError(f"out_dtype must be int32 or int64, got {out_dtype}")
    m, k = a.shape
    n = w.shape[0]
    packed = pack_int8(w, np.ones(n, dtype=np.float32), encoding)
    ops = _cpu.active_ops(m)
    enc = _encoding_index(packed)
    kp = packed.kp
    flip, row_sums = ops.activation_key(enc)
    abytes = np.full((padded(m, _kernels.W8_A_ROW_PAD), kp), flip, dtype=np.uint8)
    abytes[:m, :k] = a.view(np.uint8) ^ np.uint8(flip)
    psum = np.zeros((m if row_sums else 0, kp // _kernels.W8_KPAD + 1), dtype=np.int32)
    if psum.shape[0]:
        prefix_sums(a, kp, psum)
    # int32 sums are exact up to W8_EXACT_K; beyond, the kernels add exact int32 sums of
    # W8_EXACT_K-wide ranges in int64.
    wide = kp > _kernels.W8_EXACT_K
    acc = np.zeros((m, n), dtype=np.int64 if wide else np.int32)
    if m and n and k:
        nthreads = _threads.threads_for(m * n * k)
        job, slot = _job(ops, enc, abytes, m, psum, packed, np.empty(0, np.float32), acc,
                         _kernels.W8_OUT_I64 if wide else _kernels.W8_OUT_I32, 1, nthreads)
        if _kc is not None:
            job = job[:11] + (_kc,) + job[12:]
        _gemm(ops, [(job, slot)], nthreads)
    if out_dtype == np.int64 or not wide:
        return acc.astype(out_dtype, copy=False)
    if acc.size and (acc.max() > 2**31 - 1 or acc.min() < -2**31):
        raise OverflowError(f"qa @ qw.T exceeds int32 (K={k}); use out_dtype=numpy.int64")
    return acc.astype(np.int32)
