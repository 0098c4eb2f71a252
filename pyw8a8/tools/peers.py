"""The int8 libraries the bench times pyw8a8 against, where they are installed: ONNX
Runtime (``pip install pyw8a8[bench]``) and PyTorch's dynamic int8 Linear (never a
dependency: its CPU build is a large download, and the bench says how to get it).
"""
import warnings

import numpy as np

from .. import _threads

#: PyTorch's quantized engines that run a dynamic int8 Linear on x86 and Arm CPUs.
TORCH_ENGINES = ("fbgemm", "onednn", "x86")
TORCH_INSTALL = "pip install torch --index-url https://download.pytorch.org/whl/cpu"
ORT_INSTALL = "pip install onnxruntime onnx"


def onnxruntime_available():
    """Whether ONNX Runtime and onnx (to build its graph) are installed."""
    try:
        import onnx  # noqa: F401  (only whether it is installed)
        import onnxruntime  # noqa: F401
    except ImportError:
        return False
    return True


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
    return lines


def onnxruntime_matmul(x, w):
    """ONNX Runtime's ``x @ w.T``: DynamicQuantizeLinear + MatMulInteger with int8 weights
    quantized beforehand (per tensor), on pyw8a8's thread count; returns the function of no
    arguments that runs it."""
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
    """PyTorch dynamic int8 Linears without bias (``quantize_dynamic``: qint8 weights,
    activations quantized per tensor on each call), one per float32 weight (N, K),
    prepacked by quantized `engine`, on pyw8a8's thread count."""
    import torch
    torch.set_num_threads(_threads.get_num_threads())
    # The engine prepacks the weights; later calls run the prepacked kernel whatever the
    # engine setting is then.
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
    """torch's dynamic int8 ``x @ w.T`` (:func:`torch_linears`); returns the function of
    no arguments that runs it."""
    import torch
    (qlin,) = torch_linears(engine, w)
    tx = torch.from_numpy(x)

    def run():
        with torch.no_grad():
            return qlin(tx)
    return run
