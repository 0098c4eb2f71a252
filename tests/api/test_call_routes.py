"""matmul and matmul_pair hand their arguments to the compiled call (``_kernels.call``)
as they are, and only where it declines them (an argument it would first have to
convert) normalize them in Python and call it again.  For edge inputs of each argument:
what the normalizing route rejects, the compiled call declines or rejects with the same
error; an input in the form it reads as it is gives the normalizing route's bits; an
acceptable input it would have to convert, it declines."""
import sys

import numpy as np
import pytest

import pyw8a8
from pyw8a8 import _kernels

M, K, N = 4, 64, 32


class Sub(np.ndarray):
    pass


class Name(str):
    pass


def _unaligned(a):
    buf = np.zeros(a.nbytes + 4, np.uint8)[1:1 + a.nbytes]
    out = buf.view(a.dtype).reshape(a.shape)
    out[...] = a
    return out


def _readonly(a):
    a = a.copy()
    a.flags.writeable = False
    return a


@pytest.fixture
def routes(monkeypatch):
    """(the compiled call, a function running a call through the normalizing route)."""
    compiled = _kernels.call
    route = sys.modules["pyw8a8.matmul"]

    def checked(call):
        declined = []

        def decline_first(*args, **kwargs):  # the first call gets the raw arguments
            if not declined:
                declined.append(True)
                return None
            return compiled(*args, **kwargs)
        monkeypatch.setattr(route._kernels, "call", decline_first)
        try:
            return call()
        finally:
            monkeypatch.setattr(route._kernels, "call", compiled)
    return compiled, checked


def _agree(compiled_call, checked_call, form):
    """The compiled call against the normalizing route for an input of `form`: 'error'
    (the normalizing route raises; the compiled call declines, or raises the same error),
    'ready' (both answer, the same bits) or 'converted' (the compiled call declines, the
    normalizing route answers)."""
    try:
        want = checked_call()
    except (TypeError, ValueError) as exc:
        want = exc
        assert form == "error", f"the normalizing route rejects it: {exc}"
    else:
        assert form != "error", "the normalizing route accepts it"
    try:
        got = compiled_call()
    except (TypeError, ValueError) as exc:
        assert form == "error" and type(exc) is type(want) and str(exc) == str(want)
        return
    if form != "ready":
        assert got is None, "the compiled call accepts it"
        return
    assert got is not None, "the compiled call declines it"
    for a, b in zip(got if isinstance(got, tuple) else (got,),
                    want if isinstance(want, tuple) else (want,)):
        np.testing.assert_array_equal(a, b)


def _weights(rng, n=N, k=K, **kw):
    w = (rng.standard_normal((n, k)) / np.sqrt(k)).astype(np.float32)
    return pyw8a8.pack_weight(w, **kw)


def test_bias_and_activation(routes):
    compiled, checked = routes
    rng = np.random.default_rng(0)
    x = rng.standard_normal((M, K)).astype(np.float32)
    packed = _weights(rng)
    bias = rng.standard_normal(N).astype(np.float32)
    packed.plan()

    def fast(b=None, act=None):
        return lambda: compiled(x, packed._plan, None, b, None, act, _kernels.CALL_ONE)

    def slow(b=None, act=None):
        return lambda: checked(lambda: pyw8a8.matmul(x, packed, bias=b, activation=act))

    nan, inf = bias.copy(), bias.copy()
    nan[3], inf[5] = np.nan, -np.inf
    huge = bias.astype(np.float64)
    huge[7] = 1e39  # finite, beyond float32's range
    biases = {
        "error": [bias.astype(np.int32), bias.astype(np.float16), bias[:31],
                  np.ones(33, np.float32), bias[None], np.float32(1), nan, inf,
                  nan.astype(np.float64), huge, ["a"] * N, nan.tolist(),
                  bias.astype(np.complex64)],
        "ready": [None, bias, np.zeros(N, np.float32), _readonly(bias)],
        "converted": [bias.astype(np.float64), bias.astype(bias.dtype.newbyteorder()),
                      np.repeat(bias, 2)[::2], _unaligned(bias), bias.tolist(),
                      bias.view(Sub), _readonly(bias)[::-1]],
    }
    for form, cases in biases.items():
        for b in cases:
            _agree(fast(b), slow(b), form)
    activations = {"error": ["tanh", "RELU", "", 3, ["relu"], b"relu"],
                   "ready": [None, Name("silu"), *_kernels.ACTIVATIONS]}
    for form, cases in activations.items():
        for act in cases:
            _agree(fast(bias, act), slow(bias, act), form)


def test_pair_weights(routes):
    compiled, checked = routes
    rng = np.random.default_rng(1)
    x = rng.standard_normal((M, K)).astype(np.float32)
    gate, up = _weights(rng), _weights(rng)

    def fast(w1, w2, glu):
        kind = _kernels.CALL_PAIR if glu is None else _kernels.CALL_GLU
        return lambda: compiled(x, w1.plan(), w2.plan(), None, None, glu, kind)

    def slow(w1, w2, glu):
        return lambda: checked(lambda: pyw8a8.matmul_pair(x, w1, w2, glu=glu))

    narrow = _weights(rng, n=N // 2)
    plain, plain_other = _weights(rng, rotate=False), _weights(rng, rotate=False, seed=9)
    for w1, w2, glu in [(gate, up, None), (gate, up, "silu"), (gate, narrow, None),
                        (plain, plain_other, "relu")]:
        _agree(fast(w1, w2, glu), slow(w1, w2, glu), "ready")
    for w2, glu in [(_weights(rng, k=K // 2), None),             # another K
                    (_weights(rng, k=K // 2), "silu"),
                    (narrow, "silu"),                              # a gated pair of two N
                    (plain, None),                                 # one rotated, one not
                    (_weights(rng, seed=5), None),                 # another seed
                    (_weights(rng, block=16), "gelu")]:            # another block
        assert gate.block != 16
        _agree(fast(gate, w2, glu), slow(gate, w2, glu), "error")
    for glu in ("tanh", 1):
        _agree(fast(gate, up, glu), slow(gate, up, glu), "error")


def test_out(routes):
    compiled, checked = routes
    rng = np.random.default_rng(2)
    buf = rng.standard_normal(M * K + M * N).astype(np.float32)
    x = buf[:M * K].reshape(M, K)
    packed = _weights(rng)
    packed.plan()

    def fast(make):
        return lambda: compiled(x, packed._plan, None, None, None, None, _kernels.CALL_ONE,
                                make())

    def slow(make):
        return lambda: checked(lambda: pyw8a8.matmul(x, packed, out=make()))

    def fresh(dtype=np.float32, shape=(M, N)):
        return lambda: np.full(shape, 7, dtype)

    outs = {
        "error": [lambda: [[0.0] * N] * M, fresh(shape=(M, N + 1)), fresh(shape=(N, M)),
                  fresh(shape=(1, M, N)), fresh(shape=(M * N,)), fresh(np.float64),
                  fresh(np.int32), fresh(np.float16),
                  lambda: np.zeros((M, N), np.dtype(np.float32).newbyteorder()),
                  lambda: _readonly(np.zeros((M, N), np.float32)),
                  lambda: buf[M * K - 8:M * K - 8 + M * N].reshape(M, N),  # overlaps x
                  lambda: x[:, ::2], lambda: x[:, :N]],
        "ready": [fresh(), lambda: np.zeros((M, N), np.float32).view(Sub),
                  lambda: buf[M * K:].reshape(M, N)],  # right after x: no overlap
        "converted": [lambda: np.zeros((M, 2 * N), np.float32)[:, ::2],
                      lambda: np.asfortranarray(np.zeros((M, N), np.float32)),
                      lambda: _unaligned(np.zeros((M, N), np.float32))]
    }
    try:
        import ml_dtypes
    except ImportError:
        pass
    else:
        outs["converted"].append(fresh(ml_dtypes.bfloat16))
    for form, cases in outs.items():
        for make in cases:
            _agree(fast(make), slow(make), form)
