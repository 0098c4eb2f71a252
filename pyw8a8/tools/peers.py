"""The int8 libraries the bench times pyw8a8 against, where installed (none a dependency):
ONNX Runtime, PyTorch's dynamic int8 Linear, torchao's int8 Linear compiled by Inductor,
and XNNPACK's dynamically quantized fully connected layer through LiteRT."""
import functools
import importlib
import warnings

import numpy as np

from .. import _threads

#: PyTorch's quantized engines that run a dynamic int8 Linear on x86 and Arm CPUs.
TORCH_ENGINES = ("fbgemm", "onednn", "x86")
TORCH_INSTALL = "pip install torch --index-url https://download.pytorch.org/whl/cpu"
ORT_INSTALL = "pip install onnxruntime onnx"
XNNPACK_INSTALL = "pip install ai-edge-litert"
TORCHAO_INSTALL = 'pip install ".[torchao]"'


def _importable(*modules):
    try:
        for module in modules:
            importlib.import_module(module)
    except ImportError:
        return False
    return True


def onnxruntime_available():
    """Whether ONNX Runtime and onnx (to build its graph) are installed."""
    return _importable("onnx", "onnxruntime")


def xnnpack_available():
    """Whether LiteRT (``ai-edge-litert``, which runs XNNPACK) is installed."""
    return _importable("ai_edge_litert.interpreter")


def torchao_available():
    """Whether torchao and torch are installed."""
    return torch_engines() is not None and _importable("torchao.quantization")


def torch_engines():
    """The engines of TORCH_ENGINES this torch supports; None without torch."""
    try:
        import torch
    except ImportError:
        return None
    return [e for e in TORCH_ENGINES if e in torch.backends.quantized.supported_engines]


def missing():
    """A line for each int8 peer the bench cannot time here, with how to install it."""
    lines = []
    if not onnxruntime_available():
        lines.append(f"ONNX Runtime is not installed: no onnxruntime column ({ORT_INSTALL})")
    if torch_engines() is None:
        lines.append(f"torch is not installed: no torch column (its CPU build: "
                     f"{TORCH_INSTALL})")
    if not xnnpack_available():
        lines.append(f"LiteRT is not installed: no xnnpack column ({XNNPACK_INSTALL})")
    if not torchao_available():
        lines.append(f"torchao is not installed: no torchao column ({TORCHAO_INSTALL})")
    return lines


def onnxruntime_matmul(x, w):
    """ONNX Runtime's ``x @ w.T`` (DynamicQuantizeLinear + MatMulInteger, weights int8 per
    tensor) on pyw8a8's thread count, as a function of no arguments."""
    import onnxruntime as ort
    from onnx import TensorProto, helper, numpy_helper
    scale = np.abs(w).max() / 127
    qw = np.clip(np.rint(w.T / scale), -127, 127).astype(np.int8)
    k, n = qw.shape
    nodes = [
        helper.make_node("DynamicQuantizeLinear", ["x"], ["xq", "xs", "xz"]),
        helper.make_node("MatMulInteger", ["xq", "wq", "xz", "wz"], ["acc"]),
        helper.make_node("Cast", ["acc"], ["accf"], to=TensorProto.FLOAT),
        helper.make_node("Mul", ["xs", "ws"], ["s"]),
        helper.make_node("Mul", ["accf", "s"], ["y"]),
    ]
    graph = helper.make_graph(
        nodes, "w8a8",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [None, k])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [None, n])],
        initializer=[numpy_helper.from_array(qw, "wq"),
                     numpy_helper.from_array(np.array(0, np.int8), "wz"),
                     numpy_helper.from_array(np.array(scale, np.float32), "ws")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    opts = ort.SessionOptions()
    opts.intra_op_num_threads = _threads.get_num_threads()
    opts.inter_op_num_threads = 1
    sess = ort.InferenceSession(model.SerializeToString(), opts,
                                providers=["CPUExecutionProvider"])
    feed = {"x": x}
    return lambda: sess.run(None, feed)


def torch_linears(engine, *weights):
    """PyTorch dynamic int8 Linears without bias, one per float32 weight (N, K), prepacked by
    quantized `engine` (later calls run that kernel whatever the engine setting), on
    pyw8a8's thread count."""
    import torch
    torch.set_num_threads(_threads.get_num_threads())
    torch.backends.quantized.engine = engine
    model = torch.nn.Sequential(*(torch.nn.Linear(w.shape[1], w.shape[0], bias=False)
                                  for w in weights))
    for lin, w in zip(model, weights):
        lin.weight.data = torch.from_numpy(w.copy())
    with warnings.catch_warnings():  # torch 2.13 flags torch.ao.quantization deprecated
        warnings.simplefilter("ignore", UserWarning)
        warnings.simplefilter("ignore", DeprecationWarning)
        return list(torch.ao.quantization.quantize_dynamic(
            model, {torch.nn.Linear}, dtype=torch.qint8))


def torch_matmul(x, w, engine):
    """torch's dynamic int8 ``x @ w.T`` on `engine`, as a function of no arguments."""
    import torch
    (qlin,) = torch_linears(engine, w)
    tx = torch.from_numpy(x)

    def run():
        with torch.no_grad():
            return qlin(tx)
    return run


def use_max_autotune():
    """Inductor's global settings as a torchao user sets them for speed."""
    import torch._inductor.config as inductor
    inductor.freezing = True
    inductor.max_autotune = True
    inductor.max_autotune_gemm_backends = "CPP,ATEN"


def forget_compiled_code():
    """Drop what Dynamo compiled in this process: its cache is per code object, so earlier
    shapes would count against its recompile limit (8), past which it runs eagerly."""
    import torch
    torch._dynamo.reset()


def inductor_int8_kernel(code):
    """Which int8 GEMM Inductor's generated `code` runs: its AMX or AVX-512 VNNI micro-kernel,
    oneDNN's ``qlinear_pointwise`` (which max-autotune may pick), or ATen's ``_int_mm``."""
    if "_tile_loadd" in code or "_tile_dp" in code:
        return "amx"
    if "_mm512_dpbusd" in code or "avx512vnni" in code.lower():
        return "vnni"
    if "qlinear_pointwise" in code:
        return "oneDNN qlinear"
    if "_int_mm" in code:
        return "_int_mm"
    return "?"


def torchao_matmul(x, w, calls=1):
    """torchao's int8 Linear (Int8DynamicActivationInt8WeightConfig: pyw8a8's scheme without
    the rotation) compiled with :func:`use_max_autotune` and static shapes, on pyw8a8's
    thread count, as a function of no arguments whose ``kernel`` names the GEMM Inductor
    chose; with `calls` > 1, one graph of that many calls (:func:`repeated_calls`)."""
    import torch
    from torch._inductor.utils import run_and_get_code
    from torchao.quantization import Int8DynamicActivationInt8WeightConfig, quantize_
    torch.set_num_threads(_threads.get_num_threads())
    model = torch.nn.Sequential(torch.nn.Linear(w.shape[1], w.shape[0], bias=False)).eval()
    model[0].weight.data = torch.from_numpy(w.copy())
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        quantize_(model, Int8DynamicActivationInt8WeightConfig())
    if calls > 1:
        model = repeated_calls(model, calls)
    forget_compiled_code()
    use_max_autotune()
    compiled = torch.compile(model, dynamic=False)
    tx = repeated_inputs(x, calls)
    with torch.no_grad():
        _, code = run_and_get_code(compiled, tx)  # compiles, as the first call of a user's

    def run():
        with torch.no_grad():
            return compiled(tx)
    run.kernel = inductor_int8_kernel("\n".join(code))
    return run


@functools.cache
def _repeated_calls_class():
    import torch  # here: importing this module never imports torch

    class RepeatedCalls(torch.nn.Module):
        def __init__(self, layer, calls):
            super().__init__()
            self.layer = layer
            self.calls = calls

        def forward(self, x):
            return tuple(self.layer(x[i]) for i in range(self.calls))

    return RepeatedCalls


def repeated_calls(layer, calls):
    """A module calling `layer` `calls` times, call i on ``x[i]``, its outputs a tuple: one
    compiled graph, whose time less a one-call graph's is the layer's inside a model."""
    return _repeated_calls_class()(layer, calls)


def repeated_inputs(x, calls):
    """The input of :func:`repeated_calls`'s module: `calls` stacked copies of `x` (no call's
    input another's), or `x` as a tensor where `calls` is 1."""
    import torch
    tx = torch.from_numpy(x)
    return tx if calls == 1 else tx.expand(calls, *tx.shape).contiguous()


class _LiteRTGraph:
    """A LiteRT graph of one float32 (m, ...) input, every operator's output float32 (m, n)."""

    def __init__(self, m):
        from ai_edge_litert import schema_py_generated as schema
        self.schema, self.m = schema, m
        self.tensors, self.operators, self.codes = [], [], []
        self.buffers = [schema.BufferT()]  # buffer 0: empty

    def tensor(self, shape, kind, name, data=None, quantization=None):
        t = self.schema.TensorT()
        t.shape, t.type, t.name, t.quantization = list(shape), kind, name, quantization
        self.buffers.append(self.schema.BufferT())
        if data is not None:
            self.buffers[-1].data = data
        t.buffer = len(self.buffers) - 1
        self.tensors.append(t)
        return len(self.tensors) - 1

    def operator(self, code, inputs, n, options_type=None, options=None):
        if code not in self.codes:
            self.codes.append(code)
        op = self.schema.OperatorT()
        op.opcodeIndex, op.inputs = self.codes.index(code), inputs
        op.outputs = [self.tensor((self.m, n), self.schema.TensorType.FLOAT32,
                                  f"t{len(self.tensors)}")]
        op.builtinOptionsType, op.builtinOptions = options_type or 0, options
        self.operators.append(op)
        return op.outputs[0]

    def fully_connected(self, x, qw, scales):
        """x (m, K) by int8 weights qw (N, K) of per-row `scales`, x quantized on every call."""
        schema, n = self.schema, qw.shape[0]
        per_channel = schema.QuantizationParametersT()
        per_channel.scale = scales.astype(np.float32).tolist()
        per_channel.zeroPoint, per_channel.quantizedDimension = [0] * n, 0
        w = self.tensor(qw.shape, schema.TensorType.INT8, f"w{len(self.tensors)}",
                        qw.view(np.uint8).reshape(-1), per_channel)
        options = schema.FullyConnectedOptionsT()
        options.asymmetricQuantizeInputs = True
        return self.operator(schema.BuiltinOperator.FULLY_CONNECTED, [x, w, -1], n,
                             schema.BuiltinOptions.FullyConnectedOptions, options)

    def flatbuffer(self, inputs, outputs, size):
        import flatbuffers
        schema = self.schema
        graph = schema.SubGraphT()
        graph.tensors, graph.operators = self.tensors, self.operators
        graph.inputs, graph.outputs = inputs, outputs
        opcodes = []
        for code in self.codes:
            c = schema.OperatorCodeT()
            c.builtinCode = code
            c.deprecatedBuiltinCode = min(code, 127)  # the int8 field's "use builtinCode"
            c.version = 12 if code == schema.BuiltinOperator.FULLY_CONNECTED else 1
            opcodes.append(c)
        model = schema.ModelT()
        model.version, model.operatorCodes, model.subgraphs = 3, opcodes, [graph]
        model.buffers = self.buffers
        builder = flatbuffers.Builder(size + 8192)
        builder.Finish(model.Pack(builder), file_identifier=b"TFL3")
        return bytes(builder.Output())


def _litert_model(m, k, weights, gelu_tanh_times=False):
    """The flatbuffer of a LiteRT model of FULLY_CONNECTED layers of one float32 (m, K) input
    by `weights` [(qw, scales)]; with `gelu_tanh_times`, gelu_tanh(gate) * up of two."""
    graph = _LiteRTGraph(m)
    schema = graph.schema
    x = graph.tensor((m, k), schema.TensorType.FLOAT32, "x")
    outputs = [graph.fully_connected(x, qw, scales) for qw, scales in weights]
    if gelu_tanh_times:
        gelu = schema.GeluOptionsT()
        gelu.approximate = True
        n = weights[0][0].shape[0]
        act = graph.operator(schema.BuiltinOperator.GELU, [outputs[0]], n,
                             schema.BuiltinOptions.GeluOptions, gelu)
        outputs = [graph.operator(schema.BuiltinOperator.MUL, [act, outputs[1]], n,
                                  schema.BuiltinOptions.MulOptions, schema.MulOptionsT())]
    return graph.flatbuffer([x], outputs, sum(qw.size for qw, _ in weights))


def _int8_per_channel(w):
    """w (N, K) float32 as symmetric int8 with one scale per row: (qw, scales)."""
    scales = np.maximum(np.abs(w).max(axis=1), np.finfo(np.float32).tiny) / 127
    return np.clip(np.rint(w / scales[:, None]), -127, 127).astype(np.int8), scales


def _xnnpack(x, weights, expected, tolerance, gelu_tanh_times=False):
    """_litert_model on x through XNNPACK as a function of no arguments, its max-abs error
    checked within `tolerance` of `expected`'s RMS."""
    from ai_edge_litert.interpreter import Interpreter
    model = _litert_model(x.shape[0], x.shape[1], [_int8_per_channel(w) for w in weights],
                          gelu_tanh_times)
    interpreter = Interpreter(model_content=model, num_threads=_threads.get_num_threads())
    interpreter.allocate_tensors()
    # without a DELEGATE node, LiteRT's own kernels would be timed
    if "DELEGATE" not in [op["op_name"] for op in interpreter._get_ops_details()]:
        raise RuntimeError("XNNPACK did not take the fully connected layers")
    x_index = interpreter.get_input_details()[0]["index"]
    y_index = interpreter.get_output_details()[0]["index"]

    def run():
        interpreter.set_tensor(x_index, x)
        interpreter.invoke()
        return interpreter.get_tensor(y_index)
    y = run()
    error = np.abs(y - expected).max() / max(np.sqrt(np.mean(expected ** 2)), 1e-30)
    if not error < tolerance:
        raise RuntimeError(f"XNNPACK's result is {error:.3f} of the float result's RMS "
                           f"away from it")
    return run


def xnnpack_matmul(x, w):
    """XNNPACK's dynamically quantized ``x @ w.T`` (qd8-f32-qc8w: int8 weights per output
    channel, activations per row, asymmetric) through LiteRT on pyw8a8's thread count, as a
    function of no arguments; RuntimeError where XNNPACK did not take the layer or its
    result is not close to the float product."""
    return _xnnpack(x, [w], x @ w.T, tolerance=0.1)


def xnnpack_ffn(x, wg, wu, expected):
    """The gated FFN block as one LiteRT graph through XNNPACK, checked against the float block
    `expected` (within 0.3 of its RMS; pyw8a8's fused block is 0.19 off at 64 x 640 -> 2048)."""
    return _xnnpack(x, [wg, wu], expected, tolerance=0.3, gelu_tanh_times=True)
