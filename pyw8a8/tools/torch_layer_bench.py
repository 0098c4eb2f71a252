"""``bench --torch-layer``: one ``nn.Linear`` as a PyTorch user runs it, at the bench's
shapes.  pyw8a8's layer eagerly and under ``torch.compile``, against ``pyw8a8.matmul``
itself and torchao's int8 Linear compiled by Inductor
(:func:`~pyw8a8.tools.peers.torchao_matmul`).  The layers are unrotated, as the table's
pyw8a8 columns; each contender runs in a process of its own:
:mod:`~pyw8a8.tools.contenders`' ``torch layer`` table.

The layer's cost per call is its time beyond ``pyw8a8.matmul``'s at the same shape.  A
compiled layer called alone also pays Dynamo's entry into the compiled code (its guards,
tens of microseconds), which a model pays once a forward, not once a layer: so each
compiled contender is also timed as one graph of :data:`GRAPH_CALLS` calls of the layer
(:func:`~pyw8a8.tools.peers.repeated_calls`), and the difference, over the calls it adds,
is the layer's time inside a compiled model.
"""
from ..lab.turns import isolated, measure
from .contenders import (
    BUILD,
    COMPILED,
    COMPILED_GRAPH,
    EAGER,
    GRAPH_CALLS,
    MATMUL,
    TORCHAO,
    TORCHAO_GRAPH,
    torch_layer_names,
)

#: The per-call target of a layer at one row: this many times pyw8a8.matmul's time, plus
#: PER_CALL_US microseconds.
PER_CALL_FACTOR = 1.25
PER_CALL_US = 3.0


def in_graph(us, alone, graph):
    """Microseconds a layer call costs inside a compiled graph: the graph of GRAPH_CALLS
    calls (`us[graph]`) less the graph of one (`us[alone]`), over the calls it adds."""
    return (us[graph] - us[alone]) / (GRAPH_CALLS - 1)


def format_table(rows, names, kernels) -> list[str]:
    """Markdown: microseconds per call of each contender, the layers' cost beyond
    ``pyw8a8.matmul``, a call inside a compiled graph, the per-call target, and pyw8a8's
    layer against torchao's inside a compiled graph."""
    torchao = TORCHAO in names
    cols = ["M", "K", "N"] + [f"{name} (us)" for name in names]
    cols += [f"{EAGER} - matmul (us)", f"{COMPILED}, in a graph (us)"]
    cols += [f"{TORCHAO}, in a graph (us)"] if torchao else []
    cols += [f"target: {PER_CALL_FACTOR:g} x matmul + {PER_CALL_US:g} us"]
    cols += ["in a graph, pyw8a8.torch vs torchao"] if torchao else []
    out = ["| " + " | ".join(cols) + " |", "|" + "---|" * len(cols)]
    for (m, k, n), seconds in rows:
        us = {name: seconds[name] * 1e6 for name in names}
        ours = in_graph(us, COMPILED, COMPILED_GRAPH)
        cells = [str(m), str(k), str(n)] + [f"{us[name]:.1f}" for name in names]
        cells += [f"{us[EAGER] - us[MATMUL]:+.1f}", f"{ours:.1f}"]
        if torchao:
            theirs = in_graph(us, TORCHAO, TORCHAO_GRAPH)
            cells.append(f"{theirs:.1f}")
        cells.append(f"{PER_CALL_FACTOR * us[MATMUL] + PER_CALL_US:.1f}")
        if torchao:
            cells.append(f"{theirs / ours:.2f}x")
        out.append("| " + " | ".join(cells) + " |")
    out.append("")
    out.append("Kernels: " + "; ".join(f"{name}: {kernels[name]}" for name in names
                                       if kernels.get(name)))
    out.append(f"A call in a graph: (the graph of {GRAPH_CALLS} calls - the graph of one) / "
               f"{GRAPH_CALLS - 1}, Dynamo's entry into the graph left out, as a model pays "
               f"it once a forward")
    return out


def run(shapes, rounds, min_time, nthreads) -> list[str]:
    """The table's lines: each contender built and timed in its own process, at each
    shape, in interleaved rounds."""
    names = torch_layer_names()
    rows, kernels = [], {}
    with isolated(BUILD, names, nthreads) as workers:
        for m, k, n in shapes:
            built = {name: worker.build("torch layer", name, m, k, n)
                     for name, worker in workers.items()}
            kernels.update({name: worker.kernel for name, worker in built.items()})
            rows.append(((m, k, n), measure(built, rounds, min_time)))
    return format_table(rows, names, kernels)
