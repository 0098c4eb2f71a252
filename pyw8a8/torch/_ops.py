"""The pyw8a8 products as torch custom operators, and the crossing between tensors and arrays.

``torch.ops.pyw8a8.linear`` and ``torch.ops.pyw8a8.gated_linear`` take the packed weight as
tensors (its panels, sums, scales and a small int64 header of its settings), so
``torch.compile`` keeps them in one graph and ``torch.export`` captures the weights with
the program.  Their fake (meta) implementations give the output's shape and dtype.  The
real ones run :func:`pyw8a8.matmul` / :func:`pyw8a8.matmul_pair` on a
:class:`~pyw8a8.PackedWeight` whose arrays are the tensors' memory: the weight is found on
the panels tensor (built and checked once, the first time a tensor is seen), so a compiled
or exported call reuses the blocking the weight settled, and returns the same bits as the
eager layer.

CPU tensors cross to numpy without a copy (``Tensor.numpy()`` shares the memory), any
strides included; the result comes back with ``torch.from_numpy``.
"""
from __future__ import annotations

from typing import Any, Optional

import numpy as np
import torch

from .._layout import HUGE_PAGE_FROM_BYTES, empty_aligned
from ..matmul import matmul, matmul_pair, settled_call
from ..packing import PackedWeight
from . import _runtime

#: The header of a packed weight in a state_dict: one int64 each.
HEADER_FIELDS = ("format_version", "out_features", "in_features", "encoding", "rotate",
                 "block", "seed")

# The dtypes a layer computes from: float32 as it is, bfloat16 widened to float32 (exact).
# float16 is refused: its range (65504) would be a silent trap for an int8 scale.
INPUT_DTYPES = (torch.float32, torch.bfloat16)

INFERENCE_ONLY = ("requires grad, and pyw8a8 layers are inference only: run the model under "
                  "torch.inference_mode() or torch.no_grad()")


def check_input(x: Any, in_features: int, name: str = "x") -> None:
    """What a pyw8a8 layer computes from: a CPU float32 or bfloat16 tensor of `in_features`
    features, and no gradient to record.

    Raises
    ------
    TypeError
        `x` is not a tensor, is sparse or nested, or is not float32 / bfloat16.
    ValueError
        `x` is not on the CPU, or its last dimension is not `in_features`.
    RuntimeError
        A gradient would be recorded (autograd is on and `x` requires one).
    """
    if not isinstance(x, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {type(x).__name__}")
    if x.device.type != "cpu":
        raise ValueError(f"{name} is on {x.device}; pyw8a8 layers run on the CPU "
                         f"(move the input with .cpu())")
    if x.is_nested or x.layout != torch.strided:
        kind = "a nested tensor" if x.is_nested else f"layout {x.layout}"
        raise TypeError(f"{name} must be a dense (strided) tensor, got {kind} (convert it with "
                        f".to_dense(), a nested one with .to_padded_tensor(0.0))")
    if x.dtype not in INPUT_DTYPES:
        raise TypeError(f"{name} must be float32 or bfloat16, got {x.dtype} (convert it "
                        f"with .float())")
    if x.dim() == 0 or x.shape[-1] != in_features:
        raise ValueError(f"{name} must have {in_features} features in its last dimension, "
                         f"got shape {tuple(x.shape)}")
    if x.requires_grad and torch.is_grad_enabled():
        raise RuntimeError(f"{name} {INFERENCE_ONLY}")


def header(packed: PackedWeight) -> torch.Tensor:
    """The int64 header tensor of `packed` (HEADER_FIELDS)."""
    d = packed.to_dict()
    rotate, block, seed = (int(v) for v in d["rotation"])
    return torch.tensor([int(d["format_version"]), *packed.shape, int(d["encoding"]), rotate,
                         block, seed], dtype=torch.int64)


def _identity(panels, psum, scales, head):
    """What a weight kept on `panels` was built from: the sums' and scales' ids, their and
    the panels' version counters and memory addresses, and the header's values (not the
    header tensor: Inductor's freezing materializes it anew on every call).  The
    addresses: `share_memory_()` (``model.share_memory()``, for torch.multiprocessing)
    moves a tensor's memory and keeps its version; the weight's arrays would view the
    freed memory.  An inference tensor (made under torch.inference_mode) has no version
    counter: the header's values stand in (the kernels read the other tensors' memory
    itself).  Written out, not looped: it runs on every call (0.7 us)."""
    addresses = (panels.data_ptr(), psum.data_ptr(), scales.data_ptr())
    try:
        versions = (panels._version, psum._version, scales._version)
    except RuntimeError:  # "Inference tensors do not track version counter"
        versions = ()
    return (id(psum), id(scales), *versions, *head.tolist()) + addresses


def packed_from(panels: torch.Tensor, psum: torch.Tensor, scales: torch.Tensor,
                head: torch.Tensor) -> PackedWeight:
    """The PackedWeight whose arrays are these tensors' memory.

    Built and checked in full (:meth:`PackedWeight.from_dict`: sizes, dtypes, format
    version, contents) the first time, then kept on `panels` (``_pyw8a8_packed``) with each
    tensor's identity, version counter and address (`_identity`): another tensor in its
    place, one written in place or one whose memory moved builds it again.  The weight's
    arrays are views of the tensors (``Tensor.numpy()``), so the four tensors live while it
    does and the ids cannot be reused; the cycle through `panels` is left to the garbage
    collector with the tensor.

    Raises
    ------
    ValueError
        If the tensors are not a packed weight this pyw8a8 reads (the format version, the
        layout or the contents), or are not CPU tensors.
    """
    key = _identity(panels, psum, scales, head)
    cached = panels.__dict__.get("_pyw8a8_packed")
    if cached is not None and cached[1] == key:
        return cached[0]
    for name, t in (("panels", panels), ("psum", psum), ("scales", scales), ("header", head)):
        if t.device.type != "cpu":
            raise ValueError(f"packed weight {name} is on {t.device}; pyw8a8 runs on the CPU")
    values = head.tolist()
    if head.dim() != 1 or len(values) != len(HEADER_FIELDS):
        raise ValueError(f"packed weight header: expected {len(HEADER_FIELDS)} int64 values "
                         f"({', '.join(HEADER_FIELDS)}), got shape {tuple(head.shape)}")
    version, n, k, encoding, rotate, block, seed = values
    packed = PackedWeight.from_dict({
        "format_version": np.int64(version), "shape": np.array([n, k]),
        "encoding": np.int64(encoding), "rotation": np.array([rotate, block, seed]),
        "panels": panels.detach().numpy(), "psum": psum.detach().numpy(),
        "scales": scales.detach().numpy()})
    panels.__dict__["_pyw8a8_packed"] = (packed, key)
    return packed


def owned_copy(t: torch.Tensor) -> torch.Tensor:
    """A contiguous copy of CPU tensor `t` in memory of its own: a weight's array
    (``_layout.empty_aligned``: huge pages for a large one, which torch's allocator does
    not ask for) from ``HUGE_PAGE_FROM_BYTES`` on, torch's below.  Never numpy's memory
    for a small or empty one: torch.export.save reads a buffer's storage, which for an
    empty array from numpy (the sums of an ISA that needs none) has no address."""
    t = t.detach()
    if t.numel() * t.element_size() < HUGE_PAGE_FROM_BYTES:
        return t.contiguous().clone()
    dtype = torch.empty(0, dtype=t.dtype).numpy().dtype
    return torch.from_numpy(empty_aligned(tuple(t.shape), dtype)).copy_(t)


def tensors_of(packed: PackedWeight) -> tuple[torch.Tensor, ...]:
    """(panels, psum, scales, header): torch's own copies of `packed`'s arrays
    (:func:`owned_copy`), with the weight they hold (its arrays viewing them) kept on the
    panels, so nothing is checked again."""
    panels, psum, scales = (owned_copy(torch.from_numpy(a)) for a in (packed.panels,
                                                                      packed.psum,
                                                                      packed.scales))
    head = header(packed)
    keep_weight(panels, psum, scales, head, packed)
    return panels, psum, scales, head


def keep_weight(panels: torch.Tensor, psum: torch.Tensor, scales: torch.Tensor,
                head: torch.Tensor, packed: PackedWeight) -> None:
    """Keep on `panels` the weight these tensors hold, a copy of `packed`'s (its arrays
    viewing them), as :func:`packed_from` would after checking it."""
    view = PackedWeight(packed.shape, packed.encoding, panels.numpy(), psum.numpy(),
                        scales.numpy(), packed.rotate, packed.block, packed.seed)
    panels.__dict__["_pyw8a8_packed"] = (view, _identity(panels, psum, scales, head))


def as_array(x: torch.Tensor) -> np.ndarray:
    """`x` (float32, or bfloat16 widened) as a numpy array; the same memory for float32."""
    if x.dtype != torch.float32:
        x = x.float()
    if x.is_neg():  # a negative view (torch._neg_view) has no memory numpy can read as is
        x = x.resolve_neg()
    return (x.detach() if x.requires_grad else x).numpy()


def _float32_view(x: torch.Tensor) -> Optional[np.ndarray]:
    """A float32 tensor's memory as numpy sees it, where numpy can see it as it is (on the
    CPU, dense, no gradient, no negative bit); else None."""
    if x.dtype is not torch.float32:
        return None
    try:
        return x.numpy()
    except (RuntimeError, TypeError):
        return None


def as_tensor(y: np.ndarray, dtype: torch.dtype) -> torch.Tensor:
    """The product `y` as a tensor of the input's dtype (bfloat16 rounded to nearest even)."""
    out = torch.from_numpy(y)
    return out if dtype == torch.float32 else out.to(dtype)


def bias_array(bias: Optional[torch.Tensor]) -> Optional[np.ndarray]:
    return None if bias is None else as_array(bias)


# The eager products below try the compiled common call first, on the input's memory, with
# no check in Python: a float32 tensor that numpy can view and that the call takes (its
# features, its rows finite, a settled blocking) is a valid input.  Between a model's
# layers, whose weights and activations stream through the caches, each Python step misses
# them: after a cache flush the input check, the crossing to numpy and the kept weight's
# lookup took 50-60 us each, where they take 1 us hot.  In the sentence encoder of
# `bench --torch` (first sentences, Zen 4) the layers' time outside compiled code went from
# 14-19 ms to 6-7 ms an encode with this route (and the weights' several settled row
# counts, _kernels.WeightPlan).  Any other input takes the checked route.

def product(x: torch.Tensor, packed: PackedWeight, bias: Optional[torch.Tensor],
            activation: Optional[str]) -> torch.Tensor:
    """:func:`pyw8a8.matmul` on a tensor, on torch's thread count (_runtime); `x` checked
    (check_input) unless the compiled call takes it."""
    _runtime.follow_torch_threads()
    b = bias_array(bias)
    arr = _float32_view(x)
    if arr is not None:
        y = settled_call(arr, packed._plan, None, b, None, activation, False, False)
        if y is not None:
            return torch.from_numpy(y)
    check_input(x, packed.shape[1])
    y = matmul(as_array(x), packed, bias=b, activation=activation)
    return as_tensor(y, x.dtype)


def gated_product(x: torch.Tensor, gate: PackedWeight, up: PackedWeight,
                  bias1: Optional[torch.Tensor], bias2: Optional[torch.Tensor],
                  glu: str) -> torch.Tensor:
    """:func:`pyw8a8.matmul_pair` with `glu` on a tensor, on torch's thread count; `x`
    checked unless the compiled call takes it."""
    _runtime.follow_torch_threads()
    b1, b2 = bias_array(bias1), bias_array(bias2)
    arr = _float32_view(x)
    if arr is not None:
        y = settled_call(arr, gate._plan, up._plan, b1, b2, glu, True, True)
        if y is not None:
            return torch.from_numpy(y)
    check_input(x, gate.shape[1])
    y = matmul_pair(as_array(x), gate, up, glu=glu, bias1=b1, bias2=b2)
    return as_tensor(y, x.dtype)


# The operators' schemas, defined once.  Their CPU kernels are the native operator's
# (_native: C++, no Python per call) where it loads, else the Python functions below
# (_native registers one or the other).
_LIBRARY = torch.library.Library("pyw8a8", "DEF")
_LIBRARY.define("linear(Tensor x, Tensor panels, Tensor psum, Tensor scales, Tensor header, "
                "Tensor? bias, str activation) -> Tensor")
_LIBRARY.define("gated_linear(Tensor x, Tensor panels1, Tensor psum1, Tensor scales1, "
                "Tensor header1, Tensor panels2, Tensor psum2, Tensor scales2, "
                "Tensor header2, Tensor? bias1, Tensor? bias2, str glu) -> Tensor")


def python_linear(x: torch.Tensor, panels: torch.Tensor, psum: torch.Tensor,
                  scales: torch.Tensor, head: torch.Tensor, bias: Optional[torch.Tensor],
                  activation: str) -> torch.Tensor:
    """``activation(x @ w.T + bias)`` in W8A8 (`activation` '' for none), in Python."""
    # A graph (compiled, exported, scripted) checks x here, in product, as the eager layer.
    return product(x, packed_from(panels, psum, scales, head), bias, activation or None)


def python_gated_linear(x: torch.Tensor, panels1: torch.Tensor, psum1: torch.Tensor,
                        scales1: torch.Tensor, head1: torch.Tensor, panels2: torch.Tensor,
                        psum2: torch.Tensor, scales2: torch.Tensor, head2: torch.Tensor,
                        bias1: Optional[torch.Tensor], bias2: Optional[torch.Tensor],
                        glu: str) -> torch.Tensor:
    """``glu(x @ w1.T + bias1) * (x @ w2.T + bias2)`` in W8A8, quantizing x once, in
    Python."""
    return gated_product(x, packed_from(panels1, psum1, scales1, head1),
                         packed_from(panels2, psum2, scales2, head2), bias1, bias2, glu)


@torch.library.register_fake("pyw8a8::linear")
def _linear_fake(x, panels, psum, scales, head, bias, activation):
    return x.new_empty((*x.shape[:-1], scales.shape[0]))


@torch.library.register_fake("pyw8a8::gated_linear")
def _gated_linear_fake(x, panels1, psum1, scales1, head1, panels2, psum2, scales2, head2,
                       bias1, bias2, glu):
    return x.new_empty((*x.shape[:-1], scales1.shape[0]))


def under_functorch(x: torch.Tensor) -> bool:
    """Whether `x` is wrapped by a torch.func transform (vmap's batched tensors): the
    product must then go through the operator, whose vmap rule (below) unwraps it."""
    return torch._C._functorch.is_functorch_wrapped_tensor(x)


def _vmapped_input(in_dims, x):
    """x with vmap's batch dimension first: a product maps each row alone, so a batch of
    inputs is more leading dimensions.  A batch of weights or biases has no such meaning."""
    if in_dims[0] is None or any(d is not None for d in in_dims[1:]):
        raise ValueError("torch.func.vmap over a pyw8a8 layer maps over its input only, "
                         "not over its packed weights or biases")
    return x.movedim(in_dims[0], 0)


def _linear_vmap(info, in_dims, x, panels, psum, scales, head, bias, activation):
    return torch.ops.pyw8a8.linear(_vmapped_input(in_dims, x), panels, psum, scales, head,
                                   bias, activation), 0


def _gated_linear_vmap(info, in_dims, x, panels1, psum1, scales1, head1, panels2, psum2,
                       scales2, head2, bias1, bias2, glu):
    return torch.ops.pyw8a8.gated_linear(_vmapped_input(in_dims, x), panels1, psum1,
                                         scales1, head1, panels2, psum2, scales2, head2,
                                         bias1, bias2, glu), 0


# torch.library.register_vmap came with torch 2.5; under 2.4, which the [torch] extra
# allows, vmap over a layer fails at the operator, which has no batching rule there.
if hasattr(torch.library, "register_vmap"):
    torch.library.register_vmap("pyw8a8::linear", _linear_vmap)
    torch.library.register_vmap("pyw8a8::gated_linear", _gated_linear_vmap)
