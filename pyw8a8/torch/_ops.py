"""The pyw8a8 products as torch custom operators, and the crossing between tensors and a
packed weight.

``torch.ops.pyw8a8.linear`` and ``torch.ops.pyw8a8.gated_linear`` take the packed weight as
tensors (its panels, sums, scales and a small int64 header of its settings), so
``torch.compile`` keeps them in one graph and ``torch.export`` captures the weights with
the program.  Their fake (meta) implementations give the output's shape and dtype; their
CPU kernels are C++ (``_native``), the core's call object on the tensors' memory, so an
eager, compiled or exported call runs no Python and returns the bits of
:func:`pyw8a8.matmul` / :func:`pyw8a8.matmul_pair`.
"""
from __future__ import annotations

import numpy as np
import torch

from .._layout import HUGE_PAGE_FROM_BYTES, empty_aligned, is_aligned
from .._packed.panels import array_layout
from ..packing import PackedWeight

#: The header of a packed weight in a state_dict: one int64 each.
HEADER_FIELDS = ("format_version", "out_features", "in_features", "encoding", "rotate",
                 "block", "seed")

INFERENCE_ONLY = ("requires grad, and pyw8a8 layers are inference only: run the model under "
                  "torch.inference_mode() or torch.no_grad()")


def header(packed: PackedWeight) -> torch.Tensor:
    """The int64 header tensor of `packed` (HEADER_FIELDS)."""
    d = packed.to_dict()
    rotate, block, seed = (int(v) for v in d["rotation"])
    return torch.tensor([int(d["format_version"]), *packed.shape, int(d["encoding"]), rotate,
                         block, seed], dtype=torch.int64, device="cpu")


def settings(head: torch.Tensor) -> dict[str, int]:
    """The header's values by name (HEADER_FIELDS): what a packed weight's tensors hold,
    read without its arrays (which a skeleton model being loaded keeps on 'meta')."""
    return dict(zip(HEADER_FIELDS, head.tolist()))


def empty_tensors(layout: PackedWeight, n: int,
                  device: torch.device) -> tuple[torch.Tensor, ...]:
    """(panels, psum, scales, header) of an (n, K) weight packed as `layout` (an empty
    weight of the same K, encoding and rotation): the arrays uninitialized on `device`
    (a skeleton's 'meta', for the weights a checkpoint loads), the header filled."""
    arrays = array_layout(n, layout.kp, layout.encoding)
    tensors = tuple(torch.empty(shape, dtype=torch.from_numpy(np.empty(0, dtype)).dtype,
                                device=device) for dtype, shape in arrays)
    head = header(layout)
    head[1] = n
    return (*tensors, head)


def _identity(panels, psum, scales, head):
    """What a weight kept on `panels` was built from: the sums' and scales' ids, the
    tensors' version counters (an inference tensor has none) and addresses
    (``share_memory_()`` moves a tensor's memory and keeps its version), and the header's
    values (Inductor's freezing makes the header tensor anew on every call)."""
    addresses = (panels.data_ptr(), psum.data_ptr(), scales.data_ptr())
    try:
        versions = (panels._version, psum._version, scales._version)
    except RuntimeError:  # "Inference tensors do not track version counter"
        versions = ()
    return (id(psum), id(scales), *versions, *head.tolist()) + addresses


def packed_from(panels: torch.Tensor, psum: torch.Tensor, scales: torch.Tensor,
                head: torch.Tensor) -> PackedWeight:
    """The PackedWeight whose arrays are these tensors' memory.

    Built and checked in full (:meth:`PackedWeight.from_dict`) the first time, then kept on
    `panels` (``_pyw8a8_packed``) under `_identity`, so another tensor in its place, one
    written in place or one whose memory moved builds it again.  Its arrays view the
    tensors, which live while it does (the ids cannot be reused).

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


def tensors_of(packed: PackedWeight, adopt: bool = False) -> tuple[torch.Tensor, ...]:
    """(panels, psum, scales, header): torch's own copies of `packed`'s arrays
    (:func:`owned_copy`), with the weight they hold (its arrays viewing them) kept on the
    panels, so nothing is checked again.  `adopt`: `packed` was just made for the caller
    alone, so its large arrays, already in a weight's memory, become the tensors
    themselves (no second copy of a 168 MB LM head while a model is quantized)."""
    panels, psum, scales = (_adopted(a) if adopt else owned_copy(torch.from_numpy(a))
                            for a in (packed.panels, packed.psum, packed.scales))
    head = header(packed)
    keep_weight(panels, psum, scales, head, packed)
    return panels, psum, scales, head


def _adopted(a: np.ndarray) -> torch.Tensor:
    if a.nbytes >= HUGE_PAGE_FROM_BYTES and a.flags.c_contiguous and is_aligned(a):
        return torch.from_numpy(a)
    return owned_copy(torch.from_numpy(a))


def keep_weight(panels: torch.Tensor, psum: torch.Tensor, scales: torch.Tensor,
                head: torch.Tensor, packed: PackedWeight) -> None:
    """Keep on `panels` the weight these tensors hold, a copy of `packed`'s (its arrays
    viewing them), as :func:`packed_from` would after checking it."""
    view = PackedWeight(packed.shape, packed.encoding, panels.numpy(), psum.numpy(),
                        scales.numpy(), packed.rotate, packed.block, packed.seed)
    panels.__dict__["_pyw8a8_packed"] = (view, _identity(panels, psum, scales, head))


# The operators' schemas, defined once; their CPU kernels are the native operator's
# (_native: C++, no Python per call).
_LIBRARY = torch.library.Library("pyw8a8", "DEF")
_LIBRARY.define("linear(Tensor x, Tensor panels, Tensor psum, Tensor scales, Tensor header, "
                "Tensor? bias, str activation) -> Tensor")
_LIBRARY.define("gated_linear(Tensor x, Tensor panels1, Tensor psum1, Tensor scales1, "
                "Tensor header1, Tensor panels2, Tensor psum2, Tensor scales2, "
                "Tensor header2, Tensor? bias1, Tensor? bias2, str glu) -> Tensor")


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
