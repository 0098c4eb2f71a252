"""``bench --torch-layer``: one ``nn.Linear`` as a PyTorch user runs it, at the bench's
shapes.  pyw8a8's layer eagerly (its native operator), under ``torch.compile`` and on the
Python operator (``PYW8A8_TORCH_NATIVE=0``, the operator before the native one), against
``pyw8a8.matmul`` itself and torchao's int8 Linear compiled by Inductor
(:func:`~pyw8a8.tools.peers.torchao_matmul`).  The layers are unrotated, as the table's
pyw8a8 columns; each contender runs in a process of its own, which the Python operator
needs (the operator's kernel is chosen once per process).

The layer's cost per call is its time beyond ``pyw8a8.matmul``'s at the same shape.
"""
from __future__ import annotations

import os

from .. import _cpu
from ..matmul import matmul
from ..packing import pack_weight
from . import peers
from .contenders import TORCHAO, shape_data

MATMUL = "pyw8a8.matmul"
EAGER = "pyw8a8.torch"
COMPILED = "pyw8a8.torch compiled"
PYTHON_OPERATOR = "pyw8a8.torch python op"


def contender_names() -> list[str]:
    names = [MATMUL, EAGER, COMPILED, PYTHON_OPERATOR]
    return names + [TORCHAO] * peers.torchao_available()


def _layer(w, python_operator):
    if python_operator:
        # Read when pyw8a8.torch is first imported: this process is the contender's own.
        os.environ["PYW8A8_TORCH_NATIVE"] = "0"
    import torch

    import pyw8a8.torch as pt
    if python_operator and pt._native.NATIVE is not None:
        raise RuntimeError("the Python operator needs a process that imported pyw8a8.torch "
                           "after PYW8A8_TORCH_NATIVE=0 was set")
    # A user's inference: no gradient recorded, set once.
    torch.set_grad_enabled(False)
    return pt.Linear.from_packed(pack_weight(w, rotate=False))


def build_contender(name, m, k, n):
    """The function of no arguments that times contender `name` (one of
    :func:`contender_names`) at shape (M, K, N); its ``kernel`` names what runs."""
    x, w = shape_data(m, k, n)
    if name == MATMUL:
        packed = pack_weight(w, rotate=False)
        run = lambda: matmul(x, packed)  # noqa: E731
    elif name == TORCHAO:
        return peers.torchao_matmul(x, w)
    else:
        import torch
        layer = _layer(w, python_operator=name == PYTHON_OPERATOR)
        if name == COMPILED:
            # Each shape compiles anew: Dynamo's cache is per code object, so the shapes
            # before would count against its recompile limit (8), past which it runs
            # the layer eagerly behind a failing guard.
            torch._dynamo.reset()
            layer = torch.compile(layer, dynamic=False)
        tx = torch.from_numpy(x)
        run = lambda: layer(tx)  # noqa: E731
    run.kernel = _cpu.isa() if name != PYTHON_OPERATOR else f"{_cpu.isa()}, via Python"
    return run


def format_table(rows, names, kernels) -> list[str]:
    """Markdown: microseconds per call of each contender, the layers' cost beyond
    ``pyw8a8.matmul``, and the eager layer against torchao."""
    cols = ["M", "K", "N"] + [f"{name} (us)" for name in names]
    cols += [f"{EAGER} - matmul (us)", f"{PYTHON_OPERATOR} - matmul (us)"]
    cols += [f"{EAGER} vs torchao"] if TORCHAO in names else []
    out = ["| " + " | ".join(cols) + " |", "|" + "---|" * len(cols)]
    for (m, k, n), seconds in rows:
        us = {name: seconds[name] * 1e6 for name in names}
        cells = [str(m), str(k), str(n)] + [f"{us[name]:.1f}" for name in names]
        cells += [f"{us[EAGER] - us[MATMUL]:+.1f}", f"{us[PYTHON_OPERATOR] - us[MATMUL]:+.1f}"]
        if TORCHAO in names:
            cells.append(f"{us[TORCHAO] / us[EAGER]:.2f}x")
        out.append("| " + " | ".join(cells) + " |")
    out.append("")
    out.append("Kernels: " + "; ".join(f"{name}: {kernels[name]}" for name in names
                                       if kernels.get(name)))
    return out


def run(shapes, rounds, min_time, nthreads) -> list[str]:
    """The table's lines: each contender built and timed in its own process, at each
    shape, in interleaved rounds."""
    from .measure import isolated, measure
    names = contender_names()
    rows, kernels = [], {}
    with isolated(build_contender, names, nthreads) as workers:
        for m, k, n in shapes:
            built = {name: worker.build(name, m, k, n) for name, worker in workers.items()}
            kernels.update({name: worker.kernel for name, worker in built.items()})
            rows.append(((m, k, n), measure(built, rounds, min_time)))
    return format_table(rows, names, kernels)
