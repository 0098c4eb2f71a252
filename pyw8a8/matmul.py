"""W8A8 products: validation and output handling around the one compiled call,
``_kernels.call`` (C's call object, ``_simd/call_path.h``), which every product enters once
(matmul, matmul_pair, int8_matmul; any leading dimensions, float32 or float64): it checks,
picks the tuned blocking, prepares the activation rows once and runs every block of the
product(s) in one parallel region.

The arithmetic: ``C[m, n] = s_a[m] * s_w[n] * sum_k qa[m, k] * qw[n, k]``, with the integer
sum exact and converted to float once: in int32 for K <= 131072 (``_kernels.W8_EXACT_K``,
where no sum of products of [-127, 127] values can overflow), beyond that in int64 over
exact int32 sums of 131072-wide K-ranges.  The result is the same on every ISA, thread
count and blocking, bit for bit.
"""
from __future__ import annotations

from typing import Any, Literal, overload

import numpy as np
import numpy.typing as npt

from . import _cpu, _kernels, _outputs, _threads
from ._layout import empty_output
from ._validation import bias_vector, float_array, int8_matrix
from .packing import PackedWeight, pack_int8

ACTIVATIONS = _kernels.ACTIVATIONS


def _plan(packed, name):
    """The WeightPlan of `packed`, checked (O(1): the kernels read its arrays unchecked)."""
    if not isinstance(packed, PackedWeight):
        raise TypeError(f"{name} must be a PackedWeight from pyw8a8.pack_weight or "
                        f"pack_quantized, got {type(packed).__name__}")
    try:
        return packed.plan()
    except ValueError as exc:
        raise ValueError(f"{name} is not a consistent PackedWeight: {exc}") from None


def _rows(x):
    """`x` as the C-contiguous native float32 array the compiled call reads."""
    return np.ascontiguousarray(float_array(x, "x"))


def _out_dtype(out_dtype):
    """matmul's `out_dtype` as a numpy dtype: float32 or bfloat16, given as a dtype, a type
    or a name (numpy knows the name 'bfloat16' only once ml_dtypes is imported)."""
    if isinstance(out_dtype, str) and out_dtype == "bfloat16":
        try:
            import ml_dtypes
        except ImportError:
            raise ImportError('out_dtype="bfloat16" needs ml_dtypes: pip install '
                              '"pyw8a8[bf16]"') from None
        return np.dtype(ml_dtypes.bfloat16)
    try:
        dtype = np.dtype(out_dtype)
    except TypeError:
        dtype = None
    if dtype is None or (dtype != np.float32 and dtype.name != "bfloat16"):
        raise TypeError(f"out_dtype must be float32 or bfloat16 (ml_dtypes.bfloat16 or "
                        f"'bfloat16'), got {out_dtype!r}")
    return dtype


_OUT_ERRORS = {
    _outputs.ARG_BAD_TYPE: (TypeError, "out must be a numpy array, got {type}"),
    _outputs.ARG_BAD_SHAPE: (ValueError, "out has shape {shape}, expected {expected}"),
    _outputs.ARG_BAD_DTYPE: (TypeError, "out has dtype {dtype}, expected {want}"),
    _outputs.ARG_READ_ONLY: (ValueError, "out is read-only"),
    _outputs.ARG_OVERLAPS: (ValueError, "out overlaps the input x; pass a separate array"),
}


def _output(out, out_dtype, x, rows, n):
    """The float32 array to compute the product of `rows` (x as the float32 array the
    product reads) with a weight of n outputs into, and what to convert or copy it to
    afterwards: out= as _outputs.out_fault, the rule the compiled call reads, accepts it."""
    if out_dtype is not None:
        out_dtype = _out_dtype(out_dtype)
    shape = rows.shape[:-1] + (n,)
    if out is None:
        return empty_output(shape), (None if out_dtype in (None, np.float32) else out_dtype)
    fault = _outputs.out_fault(out, x, rows, n, out_dtype)
    if fault in _OUT_ERRORS:
        error, text = _OUT_ERRORS[fault]
        raise error(text.format(
            type=type(out).__name__, shape=getattr(out, "shape", None), expected=shape,
            dtype=getattr(out, "dtype", None),
            want=out_dtype if out_dtype is not None else "float32 or bfloat16"))
    if fault == _outputs.ARG_READY:
        return out, None
    return empty_output(shape), out


def _finish(result, target):
    if target is None:
        return result
    if isinstance(target, np.dtype):
        return result.astype(target)
    target[...] = result
    return target


Activation = Literal["relu", "gelu", "gelu_tanh", "silu"]


def matmul(x: npt.ArrayLike, packed: PackedWeight, *, bias: npt.ArrayLike | None = None,
           activation: Activation | None = None, out: npt.NDArray[Any] | None = None,
           out_dtype: npt.DTypeLike | None = None) -> npt.NDArray[Any]:
    """W8A8 layer ``activation(x @ w.T + bias)`` against a packed weight.

    Activations are quantized per row (token) on every call, optionally rotated first with
    the weight's transform; the int8 dot products accumulate exactly in int32.  The bias
    and the activation are fused into the kernels' float epilogue: the bias is added in
    registers, the activation runs over each tile while it is in L1, so neither costs a
    pass over the output.

    Parameters
    ----------
    x : array_like of float32 or float64, shape (..., K)
        Activations; any leading dimensions, any memory order.
    packed : PackedWeight
        From :func:`pack_weight` or :func:`pack_quantized`, shape (N, K).
    bias : array_like of float32 or float64, shape (N,), optional
        Added to the product (in float32) before the activation.
    activation : {None, 'relu', 'gelu', 'gelu_tanh', 'silu'}, optional
        ``'gelu'`` is the erf form, ``'gelu_tanh'`` the tanh approximation
        (``0.5 x (1 + tanh(sqrt(2 / pi) (x + 0.044715 x^3)))``), ``'silu'`` is
        ``x * sigmoid(x)``.  Every ISA computes the same bits; against a float64
        evaluation of the same function on the same float32 input the result is within a
        few float32 units in the last place (the bound measured per activation is in the
        user guide's page "The layer").  A product that overflows to +-Inf gives the
        activation's limits (+Inf, and -0 or 0); no NaN reaches it, since a row of x
        holding NaN or Inf raises ValueError.
    out : ndarray, shape (..., N), optional
        Where to write the result (dtype float32, or `out_dtype`); must not overlap x.
    out_dtype : {numpy.float32, ml_dtypes.bfloat16, 'float32', 'bfloat16'}, optional
        Output dtype (default float32, or out's dtype). bfloat16 needs ml_dtypes
        (``pip install ".[bf16]"`` in the pyw8a8 checkout).

    Returns
    -------
    ndarray, shape (..., N)
        ``activation(s_a[m] * s_w[n] * sum_k qa[m, k] * qw[n, k] + bias[n])``,
        approximately ``activation(x @ w.T + bias)``.

    Raises
    ------
    TypeError
        Wrong dtype of x or out, an out_dtype other than float32 or bfloat16, or `packed`
        not a PackedWeight.
    ImportError
        out_dtype is 'bfloat16' and ml_dtypes is not installed.
    ValueError
        x's last dimension differs from K, a row of x holds NaN/Inf (named in the
        message), `bias` has the wrong shape or dtype or holds NaN/Inf, `activation` is
        not one of the names, or `out` has the wrong shape, is read-only or overlaps x.
        Nothing is written to `out` when an error is raised.

    Examples
    --------
    >>> import numpy as np, pyw8a8
    >>> rng = np.random.default_rng(0)
    >>> w = rng.standard_normal((32, 256)).astype(np.float32)
    >>> x = rng.standard_normal((4, 256)).astype(np.float32)
    >>> packed = pyw8a8.pack_weight(w)
    >>> y = pyw8a8.matmul(x, packed)
    >>> y.shape, y.dtype
    ((4, 32), dtype('float32'))
    >>> ref = x @ w.T
    >>> bool(np.abs(y - ref).max() < 0.05 * np.sqrt(np.mean(ref ** 2)))
    True
    >>> b = np.ones(32, np.float32)
    >>> z = pyw8a8.matmul(x, packed, bias=b, activation="relu")
    >>> bool(np.array_equal(z, np.maximum(y + b, 0)))
    True
    """
    if out_dtype is None and type(packed) is PackedWeight:
        # The common call (float32 rows, float32 biases, no out= or a float32 C-contiguous
        # one) runs from C: its setup in Python code would miss the caches the previous
        # product flushed.
        y = _kernels.call(x, packed._plan, None, bias, None, activation, _kernels.CALL_ONE,
                          out)
        if y is not None:
            return y
    plan = _plan(packed, "packed")
    bias = bias_vector(bias, plan.N, "bias")
    rows = _rows(x)
    result, target = _output(out, out_dtype, x, rows, plan.N)
    _kernels.call(rows, plan, None, bias, None, activation, _kernels.CALL_ONE, result)
    return _finish(result, target)


@overload
def matmul_pair(x: npt.ArrayLike, packed1: PackedWeight, packed2: PackedWeight, *,
                glu: None = None, bias1: npt.ArrayLike | None = None,
                bias2: npt.ArrayLike | None = None,
                ) -> tuple[npt.NDArray[np.float32], npt.NDArray[np.float32]]: ...
@overload
def matmul_pair(x: npt.ArrayLike, packed1: PackedWeight, packed2: PackedWeight, *,
                glu: Activation, bias1: npt.ArrayLike | None = None,
                bias2: npt.ArrayLike | None = None) -> npt.NDArray[np.float32]: ...


def matmul_pair(x: npt.ArrayLike, packed1: PackedWeight, packed2: PackedWeight, *,
                glu: Activation | None = None, bias1: npt.ArrayLike | None = None,
                bias2: npt.ArrayLike | None = None,
                ) -> (tuple[npt.NDArray[np.float32], npt.NDArray[np.float32]]
                      | npt.NDArray[np.float32]):
    """Two W8A8 products of one activation, quantized once (e.g. gate and up projections),
    or with `glu` the gated unit of a transformer's feed-forward block.

    Parameters
    ----------
    x : array_like of float32 or float64, shape (..., K)
    packed1, packed2 : PackedWeight
        Shapes (N1, K) and (N2, K), with the same rotation settings; with `glu`, the gate
        and the up projection, of one shape (N, K).
    glu : {None, 'relu', 'gelu', 'gelu_tanh', 'silu'}, optional
        Return ``glu(x @ w1.T + bias1) * (x @ w2.T + bias2)`` as one array (Gemma:
        ``'gelu_tanh'``; Llama, Mistral: ``'silu'``; the activations of :func:`matmul`).
        Both products are computed tile by tile and finished together, so neither float
        product is ever stored.
    bias1, bias2 : array_like of float32 or float64, shapes (N1,) and (N2,), optional
        Added to each product (before the activation, with `glu`).

    Returns
    -------
    y1 : ndarray of float32, shape (..., N1)
    y2 : ndarray of float32, shape (..., N2)
        Without `glu`.
    y : ndarray of float32, shape (..., N)
        With `glu`.

    Raises
    ------
    TypeError, ValueError
        As :func:`matmul`; also ValueError if the two weights differ in K or rotation, or,
        with `glu`, in N, or if `glu` is not one of the names.

    Examples
    --------
    >>> import numpy as np, pyw8a8
    >>> rng = np.random.default_rng(0)
    >>> gate, up = (pyw8a8.pack_weight(rng.standard_normal((64, 128)).astype(np.float32))
    ...             for _ in range(2))
    >>> x = rng.standard_normal((3, 128)).astype(np.float32)
    >>> g, u = pyw8a8.matmul_pair(x, gate, up)
    >>> g.shape, u.shape
    ((3, 64), (3, 64))
    >>> h = pyw8a8.matmul_pair(x, gate, up, glu="relu")
    >>> bool(np.array_equal(h, np.maximum(g, 0) * u))
    True
    """
    kind = _kernels.CALL_PAIR if glu is None else _kernels.CALL_GLU
    if type(packed1) is PackedWeight and type(packed2) is PackedWeight:
        # As matmul's common call: from C.
        y = _kernels.call(x, packed1._plan, packed2._plan, bias1, bias2, glu, kind)
        if y is not None:
            return y
    plan1, plan2 = _plan(packed1, "packed1"), _plan(packed2, "packed2")
    biases = bias_vector(bias1, plan1.N, "bias1"), bias_vector(bias2, plan2.N, "bias2")
    return _kernels.call(_rows(x), plan1, plan2, *biases, glu, kind)


def int8_matmul(qa: npt.ArrayLike, qw: npt.ArrayLike, *,
                encoding: Literal["auto", "biased", "signed"] = "auto",
                out_dtype: npt.DTypeLike = np.int32,
                _kc: int | None = None) -> npt.NDArray[np.signedinteger[Any]]:
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

    Examples
    --------
    >>> import numpy as np
    >>> import pyw8a8
    >>> rng = np.random.default_rng(0)
    >>> qa = rng.integers(-127, 128, (4, 1000), dtype=np.int8)
    >>> qw = rng.integers(-127, 128, (24, 1000), dtype=np.int8)
    >>> c = pyw8a8.int8_matmul(qa, qw)
    >>> c.dtype, c.shape
    (dtype('int32'), (4, 24))
    >>> bool(np.array_equal(c, qa.astype(np.int64) @ qw.T.astype(np.int64)))  # exact
    True
    """
    a = int8_matrix(qa, "qa")
    w = int8_matrix(qw, "qw")
    if a.shape[1] != w.shape[1]:
        raise ValueError(f"qa and qw differ in K: qa is {a.shape}, qw is {w.shape}")
    out_dtype = np.dtype(out_dtype)
    if out_dtype not in (np.int32, np.int64):
        raise TypeError(f"out_dtype must be int32 or int64, got {out_dtype}")
    m, k = a.shape
    plan = pack_int8(w, np.ones(w.shape[0], dtype=np.float32), encoding).plan()
    # int32 sums are exact up to W8_EXACT_K; beyond, the kernels add exact int32 sums of
    # W8_EXACT_K-wide ranges in int64.
    wide = plan.Kp > _kernels.W8_EXACT_K
    acc = np.zeros((m, plan.N), dtype=np.int64 if wide else np.int32)
    if m and plan.N and k:
        _kernels.int8_call(a, plan, acc, None if _kc is None else _forced_kc(m, plan, _kc))
    if out_dtype == np.int64 or not wide:
        return acc.astype(out_dtype, copy=False)
    if acc.size and (acc.max() > 2**31 - 1 or acc.min() < -2**31):
        raise OverflowError(f"qa @ qw.T exceeds int32 (K={k}); use out_dtype=numpy.int64")
    return acc.astype(np.int32)


def _forced_kc(m, plan, kc):
    """The default blocking of an int8 product of m rows with K-ranges `kc` wide (tests)."""
    ops = _cpu.active_ops(m)
    nthreads = _threads.threads_for(m * plan.K * plan.N)
    default = _kernels.candidates(ops, m, plan.N, plan.Kp, nthreads)[0]
    return (kc,) + _kernels.fit(default, m)[1:]
