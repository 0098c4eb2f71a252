"""The lab's one contender registry: every contender of the bench's tables, by table and
name, built where it is timed (:func:`build_contender`): ``product`` (``bench``'s table),
``ffn`` (``bench --ffn``), ``torch layer`` (``bench --torch-layer``) and ``torch model``
(``bench --torch``'s model-level table).  Each table's names come from its own function."""
import math

import numpy as np

from .. import _cpu
from ..matmul import matmul, matmul_pair
from ..packing import pack_weight
from . import peers

TORCHAO = "torchao inductor"
ROTATED = " rotated"  # the suffix of the rotated pyw8a8 contender (block 128)
XNNPACK = "xnnpack int8"
# bench --torch-layer's contenders; the layer in a compiled graph of GRAPH_CALLS calls
MATMUL = "pyw8a8.matmul"
EAGER = "pyw8a8.torch"
COMPILED = "pyw8a8.torch compiled"
GRAPH_CALLS = 9
COMPILED_GRAPH = f"{COMPILED} x{GRAPH_CALLS}"
TORCHAO_GRAPH = f"{TORCHAO} x{GRAPH_CALLS}"
# bench --torch's model-level contenders: a quantizer in a mode ("pyw8a8-max")
QUANTIZERS = ("float", "torchao", "pyw8a8")
MODES = {"": "eager", "-compiled": "compiled", "-max": "compiled (freezing + max-autotune)"}
MODEL_CONTENDERS = [q + m for q in QUANTIZERS for m in MODES]
_SQRT_2_OVER_PI = math.sqrt(2 / math.pi)


def shape_data(m, k, n):
    """Float32 activations (M, K) and weight (N, K) of a shape, the same in every process."""
    rng = np.random.default_rng((m, k, n))
    x = rng.standard_normal((m, k), dtype=np.float32)
    w = rng.standard_normal((n, k), dtype=np.float32)
    w *= np.float32(1 / np.sqrt(k))
    return x, w


def ffn_data(m, k, n):
    """Float32 activations (M, K) and gate and up weights (N, K) of one shape."""
    rng = np.random.default_rng((m, k, n, 1))
    x = rng.standard_normal((m, k), dtype=np.float32)
    scale = np.float32(1 / np.sqrt(k))
    wg = rng.standard_normal((n, k), dtype=np.float32) * scale
    wu = rng.standard_normal((n, k), dtype=np.float32) * scale
    return x, wg, wu


def gelu_tanh_times(g, u):
    """``gelu_tanh(g) * u`` in float32 numpy as a user writes it, in place into `g` (returned)."""
    t = g * g
    t *= 0.044715
    t += 1
    t *= g
    t *= _SQRT_2_OVER_PI
    np.tanh(t, out=t)
    t += 1
    t *= 0.5
    g *= t
    g *= u
    return g


def contender_names(isas, with_peers=True, rotated=True):
    """The ``product`` table's contenders: numpy, each ISA of `isas`, (`rotated`) the first
    rotated, then (`with_peers`) each int8 peer installed."""
    names = ["numpy f32"] + [f"pyw8a8 {isa}" for isa in isas]
    names += [f"pyw8a8 {isas[0]}{ROTATED}"] if rotated else []
    if with_peers:
        names += ["onnxruntime int8"] if peers.onnxruntime_available() else []
        names += [XNNPACK] if peers.xnnpack_available() else []
        names += [TORCHAO] if peers.torchao_available() else []
        names += [f"torch {e}" for e in peers.torch_engines() or ()]
    return names


def ffn_names(with_peers=True):
    """The ``ffn`` table's contenders: numpy, pyw8a8 unfused and fused, (`with_peers`) XNNPACK
    and torch's engines where installed."""
    names = ["numpy f32", "pyw8a8 unfused", "pyw8a8 fused"]
    if not with_peers:
        return names
    names += [XNNPACK] if peers.xnnpack_available() else []
    return names + [f"torch {e}" for e in (peers.torch_engines() or ())]


def torch_layer_names():
    """The ``torch layer`` table's contenders, torchao's where it is installed."""
    names = [MATMUL, EAGER, COMPILED, COMPILED_GRAPH]
    return names + [TORCHAO, TORCHAO_GRAPH] * peers.torchao_available()


def fastest_torch(values, best=max):
    """(engine, value) of the best "torch <engine>" entry of `values` by `best` (max of
    GOPS, min of seconds); (None, None) where there is none."""
    engines = {h[len("torch "):]: v for h, v in values.items() if h.startswith("torch ")}
    if not engines:
        return None, None
    name = best(engines, key=engines.get)
    return name, engines[name]


def pyw8a8_product(x, w, isa, rotate=False):
    """matmul of x by w packed on ISA `isa` (another than the process's: in a use_ops body
    built once, as use_isa would rebuild its IsaOps on every call)."""
    packed = pack_weight(w, rotate=rotate)
    if isa == _cpu.isa():
        return lambda: matmul(x, packed)
    ops = _cpu.checked_ops(isa, "isa")

    def run():
        with _cpu.use_ops(ops, exactly=False):
            return matmul(x, packed)
    return run


def _product(name, m, k, n):
    x, w = shape_data(m, k, n)
    kind, _, detail = name.partition(" ")
    if kind == "pyw8a8":
        isa, _, variant = detail.partition(" ")
        return pyw8a8_product(x, w, isa, rotate=variant == ROTATED.strip())
    if kind == "torch":
        return peers.torch_matmul(x, w, detail)
    if name == "numpy f32":
        wt = np.ascontiguousarray(w.T)
        return lambda: x @ wt
    return {"onnxruntime int8": peers.onnxruntime_matmul, XNNPACK: peers.xnnpack_matmul,
            TORCHAO: peers.torchao_matmul}[name](x, w)


def _ffn_block(name, m, k, n):
    x, wg, wu = ffn_data(m, k, n)
    kind, _, detail = name.partition(" ")
    if kind == "torch":
        import torch
        gate, up = peers.torch_linears(detail, wg, wu)
        tx = torch.from_numpy(x)

        def run():
            with torch.no_grad():
                return torch.nn.functional.gelu(gate(tx), approximate="tanh") * up(tx)
        return run
    if name == XNNPACK:
        return peers.xnnpack_ffn(x, wg, wu, gelu_tanh_times(x @ wg.T, x @ wu.T))
    if kind == "pyw8a8":
        pg, pu = pack_weight(wg, rotate=False), pack_weight(wu, rotate=False)
        if detail == "fused":
            return lambda: matmul_pair(x, pg, pu, glu="gelu_tanh")
        return lambda: gelu_tanh_times(*matmul_pair(x, pg, pu))
    wgt, wut = np.ascontiguousarray(wg.T), np.ascontiguousarray(wu.T)
    return lambda: gelu_tanh_times(x @ wgt, x @ wut)


def _torch_linear(w):
    import torch

    import pyw8a8.torch as pt
    torch.set_grad_enabled(False)  # a user's inference
    return pt.Linear.from_packed(pack_weight(w, rotate=False))


def _torch_layer(name, m, k, n):
    x, w = shape_data(m, k, n)
    calls = GRAPH_CALLS if name in (COMPILED_GRAPH, TORCHAO_GRAPH) else 1
    if name in (TORCHAO, TORCHAO_GRAPH):
        return peers.torchao_matmul(x, w, calls)
    if name == MATMUL:
        packed = pack_weight(w, rotate=False)
        run = lambda: matmul(x, packed)  # noqa: E731
    else:
        import torch
        layer = _torch_linear(w)
        if name in (COMPILED, COMPILED_GRAPH):
            peers.forget_compiled_code()
            layer = torch.compile(layer if calls == 1 else peers.repeated_calls(layer, calls),
                                  dynamic=False)
        tx = peers.repeated_inputs(x, calls)
        run = lambda: layer(tx)  # noqa: E731
    run.kernel = _cpu.isa()
    return run


def _torch_model(key, model):
    """`model` quantized in place by `key`'s quantizer and compiled for its mode."""
    quantizer, _, mode = key.partition("-")
    if quantizer == "torchao":
        from torchao.quantization import Int8DynamicActivationInt8WeightConfig, quantize_
        quantize_(model, Int8DynamicActivationInt8WeightConfig())
    elif quantizer == "pyw8a8":
        import pyw8a8.torch as pt
        model = pt.quantize(model, inplace=True)
    if mode == "max":
        peers.use_max_autotune()
    if mode:
        model.compile(dynamic=False)
    return model


BUILD = f"{__name__}:build_contender"
_TABLES = {"product": _product, "ffn": _ffn_block, "torch layer": _torch_layer,
           "torch model": _torch_model}


def build_contender(table, name, *args):
    """Contender `name` of `table`: for a shape ``M, K, N``, the function of no arguments that
    runs it (its ``kernel`` attribute, where set, names what runs); for "torch model", the
    model `args` holds, quantized and compiled."""
    return _TABLES[table](name, *args)
