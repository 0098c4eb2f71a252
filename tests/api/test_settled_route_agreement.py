"""matmul and matmul_pair run a settled call from C (``_kernels.settled_product``) and
every other call through the checked route in Python; both read one rule per argument
(``_kernels.activation_code``, ``pair_fault``, ``bias_fault``, ``out_fault``). For edge
inputs of each argument: the compiled call declines every input the checked route
rejects, gives the checked route's bits for every input in the form it reads as it is,
and declines an acceptable input it would first have to convert (the checked route
converts it)."""
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
    """(the compiled call, a function running a call through the checked route only)."""
    compiled = _kernels.settled_product
    route = sys.modules["pyw8a8.matmul"]

    def checked(call):
        monkeypatch.setattr(route._kernels, "settled_product", lambda *args: None)
        try:
            return call()
        finally:
            monkeypatch.setattr(route._kernels, "settled_product", compiled)
    return compiled, checked


def _settle(call, compiled_call, calls=400):
    for _ in range(calls):
        call()
        if compiled_call() is not None:
            return
    pytest.fail(f"no blocking settled in {calls} calls")


def _agree(compiled_call, checked_call, form):
    """The compiled call against the checked route for an input of `form`: 'error' (the
    checked route raises, the compiled call declines), 'ready' (both answer, the same
    bits) or 'converted' (the compiled call declines, the checked route answers)."""
    try:
        want = checked_call()
    except (TypeError, ValueError):
        want = None
        assert form == "error", "the checked route rejects it"
    else:
        assert form != "error", "the checked route accepts it"
    got = compiled_call()
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
    scratch = _kernels.Scratch()

    def fast(b=None, act=None):
        return lambda: compiled(x, packed._plan, None, b, None, act, False, False, scratch)

    def slow(b=None, act=None):
        return lambda: checked(lambda: pyw8a8.matmul(x, packed, bias=b, activation=act))

    _settle(lambda: pyw8a8.matmul(x, packed), fast())
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
    scratch = _kernels.Scratch()

    def fast(w1, w2, glu):
        return lambda: compiled(x, w1.plan(), w2.plan(), None, None, glu, True,
                                glu is not None, scratch)

    def slow(w1, w2, glu):
        return lambda: checked(lambda: pyw8a8.matmul_pair(x, w1, w2, glu=glu))

    narrow = _weights(rng, n=N // 2)
    plain, plain_other = _weights(rng, rotate=False), _weights(rng, rotate=False, seed=9)
    for w1, w2, glu in [(gate, up, None), (gate, up, "silu"), (gate, narrow, None),
                        (plain, plain_other, "relu")]:
        _settle(lambda: pyw8a8.matmul_pair(x, w1, w2, glu=glu), fast(w1, w2, glu))
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
    scratch = _kernels.Scratch()

    def fast(make):
        return lambda: compiled(x, packed._plan, None, None, None, None, False, False,
                                scratch, make())

    def slow(make):
        return lambda: checked(lambda: pyw8a8.matmul(x, packed, out=make()))

    def fresh(dtype=np.float32, shape=(M, N)):
        return lambda: np.full(shape, 7, dtype)

    _settle(lambda: pyw8a8.matmul(x, packed), fast(fresh()))
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
